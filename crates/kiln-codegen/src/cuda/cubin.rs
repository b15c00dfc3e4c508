//! Reading a cubin back: the kernels `ptxas` assembled and what each uses.
//!
//! A cubin is a 64-bit little-endian ELF file of machine `EM_CUDA` (190). What kiln
//! reads from it, found by dumping the cubins `ptxas` 13.0 writes for sm_90a:
//! - **Kernels** are the `FUNC` symbols of `GLOBAL` binding with the `STO_CUDA_ENTRY`
//!   bit (0x10) in `st_other`; the `WEAK` functions beside them are ptxas's own helpers
//!   (`$__internal_…_div_u64`), not entries. A kernel's code is its `.text.<name>`
//!   section (the symbol's size).
//! - **Registers and stack** are attributes of the module-wide `.nv.info` section:
//!   records of `(format u8, attribute u8, …)`, 4-byte aligned; format 4 (`EIFMT_SVAL`)
//!   carries a `u16` size and that many bytes. `EIATTR_REGCOUNT` (0x2f),
//!   `EIATTR_FRAME_SIZE` (0x11) and `EIATTR_MAX_STACK_SIZE` (0x23) hold
//!   `(symbol index u32, value u32)`. (The per-kernel `.nv.info.<name>` sections hold
//!   the parameter layout and exit offsets, not these.)
//! - **Static shared memory** is the size of the kernel's `.nv.shared.<name>` section
//!   (`NOBITS`; absent when it uses none). On sm_90 that size includes the 1 KiB the
//!   toolchain reserves per block whenever a kernel uses shared memory: a kernel
//!   declaring 100 bytes has a 1 124-byte section, while `ptxas -v` says `100 bytes
//!   smem`.
//! - **Spill stores and loads** are not recorded in the cubin: only `ptxas -v` reports
//!   them (kiln keeps that report at compile time). A spill lives in the stack frame, so
//!   a frame of 0 bytes means no spills.
//!
//! Every read is bounds-checked: a truncated or foreign file is a [`CubinError`], never
//! a panic (`kiln inspect` reads cubins out of artifacts it did not write).

use object::elf::{FileHeader64, SectionHeader64, EM_CUDA, SHT_NOBITS, SHT_SYMTAB, STB_GLOBAL, STT_FUNC};
use object::read::elf::{FileHeader, SectionHeader, Sym};
use object::LittleEndian as LE;

/// `st_other` bit of a kernel entry's symbol.
const STO_CUDA_ENTRY: u8 = 0x10;
/// `EIATTR_FRAME_SIZE`: bytes of the function's stack frame (local memory per thread).
const EIATTR_FRAME_SIZE: u8 = 0x11;
/// `EIATTR_MAX_STACK_SIZE`: the deepest stack the function and its callees reach.
const EIATTR_MAX_STACK_SIZE: u8 = 0x23;
/// `EIATTR_REGCOUNT`: registers per thread.
const EIATTR_REGCOUNT: u8 = 0x2f;
/// `EIFMT_SVAL`: a record with a size and a value of that many bytes.
const EIFMT_SVAL: u8 = 4;

/// What a cubin says about its kernels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinInfo {
    /// The SM version it was assembled for (`90` for sm_90 and sm_90a), from the ELF
    /// header's flags (bits 8..16).
    pub sm: u32,
    /// Its kernels, in symbol-table order (ptxas writes them in reverse PTX order).
    pub kernels: Vec<CubinKernel>,
}

impl CubinInfo {
    /// The kernel named `name`.
    pub fn kernel(&self, name: &str) -> Option<&CubinKernel> {
        self.kernels.iter().find(|k| k.name == name)
    }
}

/// One kernel of a cubin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CubinKernel {
    /// Its entry name.
    pub name: String,
    /// Bytes of machine code.
    pub code_bytes: u64,
    /// Registers per thread (`None`: no `EIATTR_REGCOUNT` for it).
    pub registers: Option<u32>,
    /// Bytes of stack frame per thread (`None`: not recorded).
    pub frame: Option<u32>,
    /// Deepest stack with callees, per thread (`None`: not recorded).
    pub max_stack: Option<u32>,
    /// Bytes of the `.nv.shared.<name>` section (static shared memory, with the 1 KiB
    /// sm_90 reserve when any is used; 0 when none).
    pub shared: u64,
}

/// Why a cubin could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CubinError {
    /// Not a readable 64-bit little-endian ELF file.
    #[error("not a cubin: {0}")]
    Elf(String),
    /// An ELF file for another machine.
    #[error("not a cubin: ELF machine {0}, expected {EM_CUDA} (CUDA)")]
    Machine(u16),
    /// A `.nv.info` record runs past its section or has an unknown format.
    #[error("cubin section {section}: bad attribute record at byte {at}")]
    Info {
        /// The section's name.
        section: String,
        /// Offset of the record in the section.
        at: usize,
    },
}

fn elf(e: object::read::Error) -> CubinError {
    CubinError::Elf(e.to_string())
}

/// Reads the kernels of `bytes`, a cubin.
pub fn read(bytes: &[u8]) -> Result<CubinInfo, CubinError> {
    let header = FileHeader64::<LE>::parse(bytes).map_err(elf)?;
    let endian = header.endian().map_err(elf)?;
    if header.e_ident().data != object::elf::ELFDATA2LSB {
        return Err(CubinError::Elf("big-endian".into()));
    }
    let machine = header.e_machine(endian);
    if machine != EM_CUDA {
        return Err(CubinError::Machine(machine));
    }
    let sections = header.sections(endian, bytes).map_err(elf)?;
    let symbols = sections.symbols(endian, bytes, SHT_SYMTAB).map_err(elf)?;
    let name_of = |s: &SectionHeader64<LE>| -> Result<String, CubinError> {
        Ok(String::from_utf8_lossy(sections.section_name(endian, s).map_err(elf)?).into_owned())
    };

    // Attributes keyed by symbol index, from the module-wide `.nv.info`.
    let mut attrs: Vec<(u8, u32, u32)> = Vec::new();
    for s in sections.iter() {
        if name_of(s)? != ".nv.info" {
            continue;
        }
        let data = s.data(endian, bytes).map_err(elf)?;
        for (attr, value) in records(data).map_err(|at| CubinError::Info { section: ".nv.info".into(), at })? {
            if let [a, b, c, d, e, f, g, h] = *value {
                attrs.push((attr, u32::from_le_bytes([a, b, c, d]), u32::from_le_bytes([e, f, g, h])));
            }
        }
    }
    let attr = |sym: usize, which: u8| attrs.iter().find(|&&(a, s, _)| a == which && s as usize == sym).map(|a| a.2);

    let mut kernels = Vec::new();
    for (index, sym) in symbols.enumerate() {
        if sym.st_type() != STT_FUNC || sym.st_bind() != STB_GLOBAL || sym.st_other() & STO_CUDA_ENTRY == 0 {
            continue;
        }
        let name = String::from_utf8_lossy(symbols.symbol_name(endian, sym).map_err(elf)?).into_owned();
        let shared_name = format!(".nv.shared.{name}");
        let mut shared = 0;
        for s in sections.iter() {
            if s.sh_type(endian) == SHT_NOBITS && name_of(s)? == shared_name {
                shared = s.sh_size(endian);
            }
        }
        kernels.push(CubinKernel {
            code_bytes: sym.st_size(endian),
            registers: attr(index.0, EIATTR_REGCOUNT),
            frame: attr(index.0, EIATTR_FRAME_SIZE),
            max_stack: attr(index.0, EIATTR_MAX_STACK_SIZE),
            shared,
            name,
        });
    }
    Ok(CubinInfo { sm: (header.e_flags(endian) >> 8) & 0xff, kernels })
}

/// The `(attribute, value bytes)` records of an `.nv.info` section, or the offset of
/// the first bad one. Formats 1–3 (no value, a byte, a half-word) take 4 bytes;
/// format 4 takes 4 plus its size.
fn records(data: &[u8]) -> Result<Vec<(u8, &[u8])>, usize> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let head = data.get(at..at + 4).ok_or(at)?;
        let (format, attr) = (head[0], head[1]);
        let len = match format {
            1..=3 => 0,
            EIFMT_SVAL => usize::from(u16::from_le_bytes([head[2], head[3]])),
            _ => return Err(at),
        };
        if format == EIFMT_SVAL {
            out.push((attr, data.get(at + 4..at + 4 + len).ok_or(at)?));
        }
        at += 4 + len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_bounds_checked() {
        // A register count of 24 for symbol 37, then a half-word record.
        let mut d = vec![4, 0x2f, 8, 0, 37, 0, 0, 0, 24, 0, 0, 0, 3, 0x1b, 255, 0];
        assert_eq!(records(&d), Ok(vec![(0x2f, &[37, 0, 0, 0, 24, 0, 0, 0][..])]));
        for cut in 1..d.len() {
            if cut != 12 {
                assert!(records(&d[..cut]).is_err(), "cut at {cut}");
            }
        }
        d[12] = 9;
        assert_eq!(records(&d), Err(12));
    }

    #[test]
    fn what_is_not_a_cubin_is_an_error() {
        assert!(matches!(read(b""), Err(CubinError::Elf(_))));
        assert!(matches!(read(b"\x7fELF\x02\x01\x01"), Err(CubinError::Elf(_))));
        assert!(matches!(read(&[0u8; 64]), Err(CubinError::Elf(_))));
    }
}
