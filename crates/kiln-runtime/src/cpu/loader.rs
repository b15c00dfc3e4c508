//! Loading an executable image into W^X memory and applying its relocations.
//!
//! [`LoadedCode::load`] maps fresh anonymous memory read-write, copies the image,
//! applies every relocation (each one checked to lie inside the image, with a typed
//! error for a 32-bit PC-relative value that does not fit), then turns the mapping
//! read-execute. The memory is never writable and executable at once; it is unmapped
//! when the [`LoadedCode`] is dropped.

use core::fmt;

use kiln_module::abi::HelperFn;
use kiln_module::program::{Reloc, RelocKind};

/// A kernel entry point (see `kiln_module::abi`): `bindings`, the helper table, and the
/// range of workgroups `begin..end` to run.
pub type KernelFn = unsafe extern "C" fn(*const *mut u8, *const HelperFn, u64, u64);

/// Why an image could not be loaded, or an entry point not handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `mmap` failed.
    Map {
        /// Bytes requested.
        bytes: usize,
        /// `errno`.
        errno: i32,
    },
    /// `mprotect` to read-execute failed.
    Protect {
        /// `errno`.
        errno: i32,
    },
    /// A relocation patches bytes outside the image.
    RelocOutside {
        /// Position of the relocation in the list.
        index: usize,
        /// Its offset.
        offset: u64,
        /// The image length.
        len: usize,
    },
    /// A relocation refers to a target outside the image.
    TargetOutside {
        /// Position of the relocation in the list.
        index: usize,
        /// Its target offset.
        target: u64,
        /// The image length.
        len: usize,
    },
    /// A 32-bit PC-relative relocation whose value does not fit in 32 bits.
    Pc32Overflow {
        /// Position of the relocation in the list.
        index: usize,
        /// The value it would write.
        value: i128,
    },
    /// A PC-relative relocation of an instruction field (AArch64 `b`/`bl`/`adrp`,
    /// RISC-V `auipc`) whose value does not fit the field, or a branch to an address
    /// that is not a multiple of 4.
    FieldOverflow {
        /// Position of the relocation in the list.
        index: usize,
        /// The value it would encode.
        value: i128,
    },
    /// A RISC-V low-12-bit relocation whose target is not the offset of a
    /// `pcrel_hi20` relocation (the `auipc` it completes).
    UnpairedLo12 {
        /// Position of the relocation in the list.
        index: usize,
    },
    /// An entry offset outside the image.
    EntryOutside {
        /// The offset asked for.
        offset: u64,
        /// The image length.
        len: usize,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Map { bytes, errno } => write!(f, "cannot map {bytes} bytes for code (errno {errno})"),
            LoadError::Protect { errno } => write!(f, "cannot make the code executable (errno {errno})"),
            LoadError::RelocOutside { index, offset, len } => {
                write!(f, "relocation {index} patches offset {offset}, outside the {len}-byte code")
            }
            LoadError::TargetOutside { index, target, len } => {
                write!(f, "relocation {index} refers to offset {target}, outside the {len}-byte code")
            }
            LoadError::Pc32Overflow { index, value } => {
                write!(f, "relocation {index}: PC-relative value {value} does not fit in 32 bits")
            }
            LoadError::FieldOverflow { index, value } => {
                write!(f, "relocation {index}: PC-relative value {value} does not fit its instruction")
            }
            LoadError::UnpairedLo12 { index } => {
                write!(f, "relocation {index}: a pcrel_lo12_i relocation without the pcrel_hi20 it pairs with")
            }
            LoadError::EntryOutside { offset, len } => {
                write!(f, "entry point at offset {offset} is outside the {len}-byte code")
            }
        }
    }
}

impl core::error::Error for LoadError {}

/// Code placed in executable memory.
#[derive(Debug)]
pub struct LoadedCode {
    base: *mut u8,
    /// Bytes mapped (a whole number of pages, at least one).
    mapped: usize,
    /// Bytes of the image.
    len: usize,
}

// SAFETY: after `load` returns, the mapping is read-execute and never written again;
// sharing or sending the owner between threads only shares immutable memory, and the
// unmapping in `drop` needs exclusive ownership.
unsafe impl Send for LoadedCode {}
// SAFETY: as above; `&LoadedCode` gives no way to write the memory.
unsafe impl Sync for LoadedCode {}

#[cfg(feature = "std")]
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The calling thread's `errno`, read from the C library (Linux; 0 elsewhere).
#[cfg(not(feature = "std"))]
fn errno() -> i32 {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `__errno_location` returns a valid pointer to this thread's errno.
        unsafe { *libc::__errno_location() }
    }
    #[cfg(not(target_os = "linux"))]
    {
        0
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

impl LoadedCode {
    /// Maps `code`, applies `relocs` and makes it executable.
    pub fn load(code: &[u8], relocs: &[Reloc]) -> Result<LoadedCode, LoadError> {
        let len = code.len();
        // Check every relocation before touching memory.
        for (index, r) in relocs.iter().enumerate() {
            let width = r.kind.width();
            if r.offset.checked_add(width).is_none_or(|end| end > len as u64) {
                return Err(LoadError::RelocOutside { index, offset: r.offset, len });
            }
            if r.target > len as u64 {
                return Err(LoadError::TargetOutside { index, target: r.target, len });
            }
        }
        let page = page_size();
        let mapped = len.max(1).div_ceil(page) * page;
        // SAFETY: an anonymous private mapping at an address the kernel picks; it
        // aliases nothing.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(LoadError::Map { bytes: mapped, errno: errno() });
        }
        // From here on `loaded` owns the mapping and unmaps it on every error path.
        let loaded = LoadedCode { base: p.cast::<u8>(), mapped, len };
        // SAFETY: the mapping is `mapped >= len` bytes, writable, and exclusively ours.
        let mem = unsafe { core::slice::from_raw_parts_mut(loaded.base, len) };
        mem.copy_from_slice(code);
        let base = loaded.base as u64;
        for (index, r) in relocs.iter().enumerate() {
            apply(mem, base, relocs, index, r)?;
        }
        // SAFETY: the range is exactly our mapping; after this call nothing writes it.
        let rc = unsafe { libc::mprotect(loaded.base.cast(), mapped, libc::PROT_READ | libc::PROT_EXEC) };
        if rc != 0 {
            return Err(LoadError::Protect { errno: errno() });
        }
        Ok(loaded)
    }

    /// Length of the image in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the image is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entry point at `offset` (an offset from the executable's `entries`).
    ///
    /// Calling it is sound only with the bindings its kernel expects; the loader cannot
    /// check that, which is why the returned function is `unsafe`.
    pub fn entry(&self, offset: u64) -> Result<KernelFn, LoadError> {
        if offset >= self.len as u64 {
            return Err(LoadError::EntryOutside { offset, len: self.len });
        }
        // SAFETY: `offset < len`, so the address lies in our executable mapping, which
        // lives as long as `self`; the image places a function of the kernel ABI there
        // (the caller picked the offset from the executable's entry table).
        Ok(unsafe { core::mem::transmute::<*mut u8, KernelFn>(self.base.add(offset as usize)) })
    }
}

/// The 32-bit instruction word at `at`.
fn word(mem: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([mem[at], mem[at + 1], mem[at + 2], mem[at + 3]])
}

fn set_word(mem: &mut [u8], at: usize, w: u32) {
    mem[at..at + 4].copy_from_slice(&w.to_le_bytes());
}

/// `S + A - P` of relocation `r` in an image mapped at `base`.
fn pc_relative(base: u64, r: &Reloc) -> i128 {
    base as i128 + r.target as i128 + r.addend as i128 - (base as i128 + r.offset as i128)
}

/// Splits a RISC-V PC-relative value into the `auipc` immediate (high 20 bits, rounded
/// so that the sign-extended low 12 bits add back to `value`) and the low 12 bits.
fn riscv_split(value: i128) -> Option<(u32, u32)> {
    let v = i32::try_from(value).ok()?;
    let hi = (v as i64 + 0x800) >> 12;
    if !(-(1 << 19)..(1 << 19)).contains(&hi) {
        return None;
    }
    Some(((hi as u32) & 0xfffff, (v as u32) & 0xfff))
}

/// Applies relocation `index` (`r`, of `relocs`: a RISC-V low part looks up its high
/// part) to `mem`, mapped at `base`; offsets were checked (`offset + width <= len`).
fn apply(mem: &mut [u8], base: u64, relocs: &[Reloc], index: usize, r: &Reloc) -> Result<(), LoadError> {
    let at = r.offset as usize;
    let overflow = |value| LoadError::FieldOverflow { index, value };
    match r.kind {
        RelocKind::Pc32 => {
            let value = pc_relative(base, r);
            let v = i32::try_from(value).map_err(|_| LoadError::Pc32Overflow { index, value })?;
            mem[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        RelocKind::Abs64 => {
            let v = base.wrapping_add(r.target).wrapping_add(r.addend as u64);
            mem[at..at + 8].copy_from_slice(&v.to_le_bytes());
        }
        RelocKind::Aarch64Call26 => {
            // `b`/`bl imm26`: a word offset within ±128 MiB.
            let value = pc_relative(base, r);
            if value % 4 != 0 || !(-(1 << 27)..(1 << 27)).contains(&value) {
                return Err(overflow(value));
            }
            let imm = ((value >> 2) as u32) & 0x03ff_ffff;
            set_word(mem, at, word(mem, at) & !0x03ff_ffff | imm);
        }
        RelocKind::Aarch64AdrPrelPgHi21 => {
            // `adrp`: the 4 KiB page difference, immlo in bits 29-30, immhi in 5-23.
            let s = base as i128 + r.target as i128 + r.addend as i128;
            let p = base as i128 + r.offset as i128;
            let value = (s & !0xfff) - (p & !0xfff);
            let pages = value >> 12;
            if !(-(1 << 20)..(1 << 20)).contains(&pages) {
                return Err(overflow(value));
            }
            let imm = (pages as u32) & 0x1f_ffff;
            let w = word(mem, at) & !(0x3 << 29 | 0x7_ffff << 5) | (imm & 0x3) << 29 | (imm >> 2) << 5;
            set_word(mem, at, w);
        }
        RelocKind::Aarch64AddAbsLo12Nc => {
            // `add xd, xn, #imm12`: the low 12 bits of the address, no overflow check.
            let s = base.wrapping_add(r.target).wrapping_add(r.addend as u64);
            let w = word(mem, at) & !(0xfff << 10) | ((s as u32) & 0xfff) << 10;
            set_word(mem, at, w);
        }
        RelocKind::RiscvCallPlt => {
            // `auipc ra, hi20` then `jalr ra, lo12(ra)`.
            let value = pc_relative(base, r);
            let (hi, lo) = riscv_split(value).ok_or(overflow(value))?;
            set_word(mem, at, word(mem, at) & 0xfff | hi << 12);
            set_word(mem, at + 4, word(mem, at + 4) & 0x000f_ffff | lo << 20);
        }
        RelocKind::RiscvPcrelHi20 => {
            let value = pc_relative(base, r);
            let (hi, _) = riscv_split(value).ok_or(overflow(value))?;
            set_word(mem, at, word(mem, at) & 0xfff | hi << 12);
        }
        RelocKind::RiscvPcrelLo12I => {
            // The low part of the `auipc` at `target`'s value (I-type immediate).
            let hi = relocs
                .iter()
                .find(|h| h.kind == RelocKind::RiscvPcrelHi20 && h.offset == r.target)
                .ok_or(LoadError::UnpairedLo12 { index })?;
            let value = pc_relative(base, hi);
            let (_, lo) = riscv_split(value).ok_or(overflow(value))?;
            set_word(mem, at, word(mem, at) & 0x000f_ffff | lo << 20);
        }
    }
    Ok(())
}

impl Drop for LoadedCode {
    fn drop(&mut self) {
        // SAFETY: `base..base + mapped` is the mapping `load` created and nothing else
        // refers to it once its owner is dropped.
        unsafe {
            libc::munmap(self.base.cast(), self.mapped);
        }
    }
}

#[cfg(test)]
mod tests {
    //! The relocation arithmetic against the instruction encodings of the Arm and RISC-V
    //! manuals (checked encodings: `bl .-16` is 0x97fffffc, `adrp x0, #0x4000` is
    //! 0x90000020, …), on an image placed at a chosen address.
    use super::*;
    use alloc::vec::Vec;

    const BASE: u64 = 0x10_0000;

    fn patched(words: &[u32], relocs: &[Reloc]) -> Result<Vec<u32>, LoadError> {
        let mut mem: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        for (i, r) in relocs.iter().enumerate() {
            apply(&mut mem, BASE, relocs, i, r)?;
        }
        Ok(mem.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    fn reloc(offset: u64, kind: RelocKind, target: u64) -> Reloc {
        Reloc { offset, kind, target, addend: 0 }
    }

    #[test]
    fn aarch64_branch() {
        // bl forward 0x100 bytes and back 16 bytes.
        let w = patched(
            &[0x9400_0000; 8],
            &[reloc(0, RelocKind::Aarch64Call26, 0x100), reloc(16, RelocKind::Aarch64Call26, 0)],
        );
        assert_eq!(w.unwrap()[..5], [0x9400_0040, 0x9400_0000, 0x9400_0000, 0x9400_0000, 0x97ff_fffc]);
        // Out of range (±128 MiB) and misaligned targets.
        let far = Reloc { offset: 0, kind: RelocKind::Aarch64Call26, target: 0, addend: 1 << 27 };
        assert!(matches!(patched(&[0x9400_0000], &[far]), Err(LoadError::FieldOverflow { .. })));
        let odd = Reloc { offset: 0, kind: RelocKind::Aarch64Call26, target: 0, addend: 2 };
        assert!(matches!(patched(&[0x9400_0000], &[odd]), Err(LoadError::FieldOverflow { .. })));
    }

    #[test]
    fn aarch64_page_and_low_bits() {
        // adrp x0, page of BASE+0x3456 (3 pages on: immlo 3); add x0, x0, #0x456.
        let relocs =
            [reloc(0, RelocKind::Aarch64AdrPrelPgHi21, 0x3456), reloc(4, RelocKind::Aarch64AddAbsLo12Nc, 0x3456)];
        assert_eq!(patched(&[0x9000_0000, 0x9100_0000], &relocs).unwrap(), [0xf000_0000, 0x9111_5800]);
        // Four pages on: immlo 0, immhi 1.
        assert_eq!(
            patched(&[0x9000_0000], &[reloc(0, RelocKind::Aarch64AdrPrelPgHi21, 0x4000)]).unwrap(),
            [0x9000_0020]
        );
    }

    #[test]
    fn riscv_call_and_pcrel_pair() {
        // auipc ra, 0; jalr ra, 0(ra) calling 0x1800 on: hi 2, lo -2048 (0x800).
        let w = patched(
            &[0x0000_0097, 0x0000_80e7],
            &[Reloc { offset: 0, kind: RelocKind::RiscvCallPlt, target: 0, addend: 0x1800 }],
        );
        assert_eq!(w.unwrap(), [0x0000_2097, 0x8000_80e7]);
        // auipc a0, hi; ld a0, lo(a0) for a target 0x10 back from the auipc: hi 0, lo -16.
        let relocs = [
            Reloc { offset: 0x20, kind: RelocKind::RiscvPcrelHi20, target: 0x10, addend: 0 },
            Reloc { offset: 0x24, kind: RelocKind::RiscvPcrelLo12I, target: 0x20, addend: 0 },
        ];
        let mut words = [0u32; 10];
        words[8] = 0x0000_0517; // auipc a0, 0
        words[9] = 0x0005_3503; // ld a0, 0(a0)
        let w = patched(&words, &relocs).unwrap();
        assert_eq!((w[8], w[9]), (0x0000_0517, 0xff05_3503));
        // A low part whose auipc has no high-part relocation.
        let lone = [Reloc { offset: 0, kind: RelocKind::RiscvPcrelLo12I, target: 8, addend: 0 }];
        assert!(matches!(patched(&[0x0005_3503], &lone), Err(LoadError::UnpairedLo12 { index: 0 })));
    }
}
