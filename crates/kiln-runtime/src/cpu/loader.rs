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
            let width = match r.kind {
                RelocKind::Pc32 => 4u64,
                RelocKind::Abs64 => 8,
            };
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
            // Offsets were checked above: `offset + width <= len`.
            let at = r.offset as usize;
            let s = base.wrapping_add(r.target) as i128;
            match r.kind {
                RelocKind::Pc32 => {
                    let value = s + r.addend as i128 - (base as i128 + r.offset as i128);
                    let v = i32::try_from(value).map_err(|_| LoadError::Pc32Overflow { index, value })?;
                    mem[at..at + 4].copy_from_slice(&v.to_le_bytes());
                }
                RelocKind::Abs64 => {
                    let v = (s as u64).wrapping_add(r.addend as u64);
                    mem[at..at + 8].copy_from_slice(&v.to_le_bytes());
                }
            }
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

impl Drop for LoadedCode {
    fn drop(&mut self) {
        // SAFETY: `base..base + mapped` is the mapping `load` created and nothing else
        // refers to it once its owner is dropped.
        unsafe {
            libc::munmap(self.base.cast(), self.mapped);
        }
    }
}
