//! Reading a container: every offset, length, alignment and checksum is checked
//! before a section's bytes are handed out. No allocation, no copies, no panics.

use crate::format::{
    crc32, SectionKind, Version, ENTRY_LEN, FORMAT_VERSION, HEADER_LEN, MAGIC, MAX_ALIGN, MAX_SECTIONS,
};
use core::fmt;

/// Why a file is not a readable `.kiln` module. Offsets are byte offsets in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// Shorter than the header (or than the section table it announces).
    Truncated {
        /// Bytes needed.
        needed: u64,
        /// Bytes present.
        len: u64,
    },
    /// The magic bytes are wrong: not a `.kiln` file.
    BadMagic,
    /// The container version is not readable by this reader.
    UnsupportedVersion {
        /// The file's version.
        file: Version,
        /// This reader's version.
        reader: Version,
    },
    /// The header's CRC does not match.
    HeaderChecksum,
    /// The length recorded in the header differs from the file's.
    LengthMismatch {
        /// Recorded length.
        recorded: u64,
        /// Actual length.
        actual: u64,
    },
    /// More sections than allowed.
    TooManySections(u32),
    /// The section table's CRC does not match.
    TableChecksum,
    /// Section `index` lies (partly) outside the file or over the header/table.
    SectionOutOfBounds {
        /// Table index.
        index: usize,
        /// Its offset.
        offset: u64,
        /// Its length.
        length: u64,
    },
    /// Section `index` has an invalid alignment or is not aligned.
    Misaligned {
        /// Table index.
        index: usize,
        /// Its offset.
        offset: u64,
        /// Its alignment.
        align: u32,
    },
    /// Two sections overlap.
    Overlap {
        /// One table index.
        a: usize,
        /// The other.
        b: usize,
    },
    /// A kind appears twice.
    DuplicateSection(SectionKind),
    /// A section's bytes do not match their CRC.
    SectionChecksum {
        /// The section's kind.
        kind: SectionKind,
        /// CRC recorded in the table.
        recorded: u32,
        /// CRC of the bytes.
        actual: u32,
    },
    /// A non-zero reserved field or flag.
    Reserved {
        /// Offset of the field.
        offset: u64,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Truncated { needed, len } => {
                write!(f, "file is truncated: {len} bytes, at least {needed} needed")
            }
            ReadError::BadMagic => f.write_str("not a .kiln module (bad magic bytes at offset 0)"),
            ReadError::UnsupportedVersion { file, reader } => {
                write!(f, "module has container format {file}, this reader supports {reader}")
            }
            ReadError::HeaderChecksum => f.write_str("header checksum mismatch (bytes 0..36 are corrupt)"),
            ReadError::LengthMismatch { recorded, actual } => {
                write!(f, "header records {recorded} bytes, the file has {actual}")
            }
            ReadError::TooManySections(n) => write!(f, "{n} sections (at most {MAX_SECTIONS})"),
            ReadError::TableChecksum => write!(f, "section table checksum mismatch (offset {HEADER_LEN})"),
            ReadError::SectionOutOfBounds { index, offset, length } => {
                write!(f, "section {index} ({offset}+{length}) lies outside the data area")
            }
            ReadError::Misaligned { index, offset, align } => {
                write!(f, "section {index} at offset {offset} violates alignment {align}")
            }
            ReadError::Overlap { a, b } => write!(f, "sections {a} and {b} overlap"),
            ReadError::DuplicateSection(k) => write!(f, "section {k} appears twice"),
            ReadError::SectionChecksum { kind, recorded, actual } => {
                write!(f, "{kind} section checksum mismatch (recorded {recorded:08x}, computed {actual:08x})")
            }
            ReadError::Reserved { offset } => write!(f, "reserved field at offset {offset} is not zero"),
        }
    }
}

/// One section of a parsed module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section<'a> {
    /// What it holds.
    pub kind: SectionKind,
    /// Its offset in the file.
    pub offset: u64,
    /// Its alignment.
    pub align: u32,
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// A verified module, borrowing the file's bytes.
#[derive(Clone, Copy, Debug)]
pub struct Module<'a> {
    data: &'a [u8],
    abi: Version,
    format: Version,
    count: usize,
}

fn u16_at(d: &[u8], o: usize) -> u16 {
    let mut b = [0u8; 2];
    b.copy_from_slice(&d[o..o + 2]);
    u16::from_le_bytes(b)
}
fn u32_at(d: &[u8], o: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&d[o..o + 4]);
    u32::from_le_bytes(b)
}
fn u64_at(d: &[u8], o: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&d[o..o + 8]);
    u64::from_le_bytes(b)
}

/// Raw fields of table entry `i` (the table is known to be in bounds).
fn entry(d: &[u8], i: usize) -> (u32, u32, u64, u64, u32, u32) {
    let o = HEADER_LEN + i * ENTRY_LEN;
    (u32_at(d, o), u32_at(d, o + 4), u64_at(d, o + 8), u64_at(d, o + 16), u32_at(d, o + 24), u32_at(d, o + 28))
}

impl<'a> Module<'a> {
    /// Checks `data` and returns the module. Cost: one pass over the bytes (CRCs).
    pub fn parse(data: &'a [u8]) -> Result<Module<'a>, ReadError> {
        let len = data.len() as u64;
        if data.len() < HEADER_LEN {
            if data.len() >= 8 && data[..8] != MAGIC {
                return Err(ReadError::BadMagic);
            }
            return Err(ReadError::Truncated { needed: HEADER_LEN as u64, len });
        }
        if data[..8] != MAGIC {
            return Err(ReadError::BadMagic);
        }
        let format = Version { major: u16_at(data, 8), minor: u16_at(data, 10) };
        if !FORMAT_VERSION.can_read(format) {
            return Err(ReadError::UnsupportedVersion { file: format, reader: FORMAT_VERSION });
        }
        if crc32(&data[..36]) != u32_at(data, 36) {
            return Err(ReadError::HeaderChecksum);
        }
        let abi = Version { major: u16_at(data, 12), minor: u16_at(data, 14) };
        if u32_at(data, 16) != 0 {
            return Err(ReadError::Reserved { offset: 16 });
        }
        if let Some(i) = (40..HEADER_LEN).find(|&i| data[i] != 0) {
            return Err(ReadError::Reserved { offset: i as u64 });
        }
        let recorded = u64_at(data, 24);
        if recorded != len {
            return Err(ReadError::LengthMismatch { recorded, actual: len });
        }
        let n = u32_at(data, 20);
        if n as usize > MAX_SECTIONS {
            return Err(ReadError::TooManySections(n));
        }
        let count = n as usize;
        let table_end = HEADER_LEN + count * ENTRY_LEN;
        if data.len() < table_end {
            return Err(ReadError::Truncated { needed: table_end as u64, len });
        }
        if crc32(&data[HEADER_LEN..table_end]) != u32_at(data, 32) {
            return Err(ReadError::TableChecksum);
        }
        for i in 0..count {
            let (code, flags, offset, length, align, crc) = entry(data, i);
            if flags != 0 {
                return Err(ReadError::Reserved { offset: (HEADER_LEN + i * ENTRY_LEN + 4) as u64 });
            }
            let end = offset.checked_add(length);
            if offset < table_end as u64 || end.is_none_or(|e| e > len) {
                return Err(ReadError::SectionOutOfBounds { index: i, offset, length });
            }
            if !align.is_power_of_two() || align > MAX_ALIGN || offset % align as u64 != 0 {
                return Err(ReadError::Misaligned { index: i, offset, align });
            }
            let kind = SectionKind::from_code(code);
            for j in 0..i {
                let (c2, _, o2, l2, _, _) = entry(data, j);
                if c2 == code {
                    return Err(ReadError::DuplicateSection(kind));
                }
                // Both ranges are in bounds, so these sums do not overflow.
                if offset < o2 + l2 && o2 < offset + length && length > 0 && l2 > 0 {
                    return Err(ReadError::Overlap { a: j, b: i });
                }
            }
            let bytes = &data[offset as usize..(offset + length) as usize];
            let actual = crc32(bytes);
            if actual != crc {
                return Err(ReadError::SectionChecksum { kind, recorded: crc, actual });
            }
        }
        Ok(Module { data, abi, format, count })
    }

    /// The runtime ABI version the module needs.
    pub fn abi(&self) -> Version {
        self.abi
    }

    /// The container format version of the file.
    pub fn format(&self) -> Version {
        self.format
    }

    /// The whole file.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    /// The sections in table order.
    pub fn sections(&self) -> impl Iterator<Item = Section<'a>> + '_ {
        let data = self.data;
        (0..self.count).map(move |i| {
            let (code, _, offset, length, align, _) = entry(data, i);
            // Checked in `parse`.
            Section {
                kind: SectionKind::from_code(code),
                offset,
                align,
                bytes: &data[offset as usize..(offset + length) as usize],
            }
        })
    }

    /// The bytes of the section of `kind`, if present.
    pub fn section(&self, kind: SectionKind) -> Option<&'a [u8]> {
        self.sections().find(|s| s.kind == kind).map(|s| s.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::writer::ModuleWriter;
    use alloc::vec;
    use alloc::vec::Vec;

    const ABI: Version = Version { major: 1, minor: 2 };

    fn sample() -> Vec<u8> {
        let mut w = ModuleWriter::new(ABI);
        w.add(SectionKind::Signature, 8, vec![1, 2, 3]).unwrap();
        w.add(SectionKind::Constants, 64, (0..200u8).collect()).unwrap();
        w.add(SectionKind::Debug, 1, vec![]).unwrap();
        w.finish()
    }

    /// Rewrites the header CRCs after a deliberate edit of the table or header.
    fn reseal(d: &mut [u8]) {
        let n = u32_at(d, 20) as usize;
        let end = (HEADER_LEN + n * ENTRY_LEN).min(d.len());
        let t = crc32(&d[HEADER_LEN..end]);
        d[32..36].copy_from_slice(&t.to_le_bytes());
        let h = crc32(&d[..36]);
        d[36..40].copy_from_slice(&h.to_le_bytes());
    }

    #[test]
    fn round_trip() {
        let d = sample();
        let m = Module::parse(&d).unwrap();
        assert_eq!(m.abi(), ABI);
        // (A writer writes the newest format a file without bounded dims needs.)
        assert_eq!(m.format(), crate::format::STATIC_FORMAT_VERSION);
        assert_eq!(m.section(SectionKind::Signature), Some(&[1u8, 2, 3][..]));
        let c = m.sections().find(|s| s.kind == SectionKind::Constants).unwrap();
        assert_eq!(c.offset % 64, 0);
        assert_eq!(c.bytes.len(), 200);
        assert_eq!(m.section(SectionKind::Debug), Some(&[][..]));
        assert_eq!(m.section(SectionKind::Plan), None);
    }

    #[test]
    fn writer_refuses_bad_sections() {
        let mut w = ModuleWriter::new(ABI);
        assert_eq!(w.add(SectionKind::Plan, 3, vec![]), Err(crate::writer::WriteError::BadAlignment(3)));
        w.add(SectionKind::Plan, 4, vec![]).unwrap();
        assert_eq!(w.add(SectionKind::Plan, 4, vec![]), Err(crate::writer::WriteError::Duplicate(SectionKind::Plan)));
    }

    #[test]
    fn corruptions_are_named() {
        let good = sample();
        assert_eq!(Module::parse(&good[..10]).unwrap_err(), ReadError::Truncated { needed: 64, len: 10 });
        let mut d = good.clone();
        d[0] = b'X';
        assert_eq!(Module::parse(&d).unwrap_err(), ReadError::BadMagic);
        let mut d = good.clone();
        d[8] = 2;
        assert_eq!(
            Module::parse(&d).unwrap_err(),
            ReadError::UnsupportedVersion {
                file: Version { major: 2, minor: crate::format::STATIC_FORMAT_VERSION.minor },
                reader: FORMAT_VERSION
            }
        );
        // A newer minor of the same major is refused too (its additions are not known here).
        let mut d = good.clone();
        d[10] = FORMAT_VERSION.minor as u8 + 1;
        assert_eq!(
            Module::parse(&d).unwrap_err(),
            ReadError::UnsupportedVersion {
                file: Version { major: 1, minor: FORMAT_VERSION.minor + 1 },
                reader: FORMAT_VERSION
            }
        );
        let mut d = good.clone();
        d[12] ^= 1;
        assert_eq!(Module::parse(&d).unwrap_err(), ReadError::HeaderChecksum);
        let mut d = good.clone();
        d.push(0);
        assert!(matches!(Module::parse(&d).unwrap_err(), ReadError::LengthMismatch { .. }));
        let mut d = good.clone();
        *d.last_mut().unwrap() ^= 0xff;
        assert!(matches!(
            Module::parse(&d).unwrap_err(),
            ReadError::SectionChecksum { kind: SectionKind::Constants, .. }
        ));
        // Offset past the end, resealed so only the bounds check can catch it.
        let mut d = good.clone();
        let o = HEADER_LEN + ENTRY_LEN + 8;
        d[o..o + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        reseal(&mut d);
        assert!(matches!(Module::parse(&d).unwrap_err(), ReadError::SectionOutOfBounds { index: 1, .. }));
        // Huge length.
        let mut d = good.clone();
        let o = HEADER_LEN + ENTRY_LEN + 16;
        d[o..o + 8].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        reseal(&mut d);
        assert!(matches!(Module::parse(&d).unwrap_err(), ReadError::SectionOutOfBounds { index: 1, .. }));
        // Overlap: point section 1 at section 0's offset (alignment 8 divides it? use 64-aligned copy).
        let mut d = good.clone();
        let off0 = u64_at(&d, HEADER_LEN + 8);
        let o = HEADER_LEN + ENTRY_LEN + 8;
        d[o..o + 8].copy_from_slice(&off0.to_le_bytes());
        let a = HEADER_LEN + ENTRY_LEN + 24;
        d[a..a + 4].copy_from_slice(&8u32.to_le_bytes());
        reseal(&mut d);
        assert_eq!(Module::parse(&d).unwrap_err(), ReadError::Overlap { a: 0, b: 1 });
        // Huge section count.
        let mut d = good.clone();
        d[20..24].copy_from_slice(&u32::MAX.to_le_bytes());
        reseal(&mut d);
        assert_eq!(Module::parse(&d).unwrap_err(), ReadError::TooManySections(u32::MAX));
        // Duplicate kind.
        let mut d = good.clone();
        let o = HEADER_LEN + ENTRY_LEN;
        d[o..o + 4].copy_from_slice(&1u32.to_le_bytes());
        reseal(&mut d);
        assert_eq!(Module::parse(&d).unwrap_err(), ReadError::DuplicateSection(SectionKind::Signature));
    }
}
