//! Constants and field layout of the container.

use core::fmt;

/// The first eight bytes of every `.kiln` file.
pub const MAGIC: [u8; 8] = *b"KILNMOD\0";
/// Size of the fixed header.
pub const HEADER_LEN: usize = 64;
/// Size of one section table entry.
pub const ENTRY_LEN: usize = 32;
/// Most sections a file may have.
pub const MAX_SECTIONS: usize = 64;
/// Largest section alignment.
pub const MAX_ALIGN: u32 = 4096;

/// A `major.minor` version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Incompatible changes.
    pub major: u16,
    /// Compatible additions.
    pub minor: u16,
}

impl Version {
    /// Whether a reader of version `self` can read a file of version `file`:
    /// same major, and a minor no newer than the reader's.
    pub fn can_read(self, file: Version) -> bool {
        self.major == file.major && file.minor <= self.minor
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// The container format version this crate writes and reads.
///
/// 1.1 added each dispatch's `work_ns` to the plan (a 1.0 plan reads as 0: no estimate).
/// 1.2 added each kernel's class to the kernel table (a 1.0 or 1.1 kernel's class reads
/// as `None`).
/// 1.3 added each executable's launch records (a CUDA entry's block, dynamic shared
/// memory and parameter count; an older executable reads with none).
/// 1.4 added two kinds of plan command: the collective commands (all-reduce, all-gather
/// over the devices of the device table; command tags 4 and 5) of a plan sharded across
/// devices (`kiln compile --devices N`), and the conditional command `SkipIf` (command
/// tag 6; run-time `If`). A 1.3 reader refuses a 1.4 file with
/// [`crate::ReadError::UnsupportedVersion`]; a 1.4 reader reads every older file as
/// before (an older plan has neither kind).
/// 1.5 gave each kernel variant a condition and a workgroup count in place of its
/// feature bits (`condition, uv workgroups`; [`crate::program::Condition`]: always, a
/// CPU feature set, a CUDA compute capability), so that one artifact carries code for
/// several CPU levels or GPU generations and the runtime picks per kernel at load; and
/// it added each entry's data-dependent extents (`ExtentDesc`: binding, bound, the
/// outputs they size) at the end of its plan entry. A 1.4 reader refuses a 1.5 file by
/// its version (it would otherwise run with bound-sized outputs); a 1.5 reader reads an
/// older variant's feature bits as a CPU-features condition (none: always) with the
/// dispatch's workgroups, and an older entry as one without extents.
///
/// 1.6 added each entry's bounded input dimensions (`BoundedDesc`: input, axis, the
/// smallest extent, the bound, where the runtime places the input and its extent), at
/// the end of its plan entry after the extents. Only a program with bounded dimensions
/// is written as 1.6 (every other is written as 1.5, byte for byte as before), so a 1.5
/// reader refuses exactly the files it could not run.
///
/// 1.7 added, after the bounded dimensions, each entry's dispatches whose workgroups
/// shrink with a bounded dimension's extent (`BoundedRows`). A program with bounded
/// dimensions is written as 1.7; a 1.7 reader reads a 1.6 entry as one with none (every
/// dispatch runs at the bound, as a 1.6 runtime ran it).
///
/// 1.8 added heterogeneous plans: the `segment` and `transfer` plan commands (tags 7
/// and 8: a segment's device, length and cross-device waits; a copy between two
/// devices' memories) and, at the end of each plan entry, the arena sizes of the
/// devices after the first. Only a program with segments is written as 1.8 (bounded
/// programs stay 1.7, every other 1.5), so a 1.7 reader refuses exactly the files it
/// could not run.
///
/// 1.9 added each entry's instantiation prologue (`EntryPoint::prologue`: a count of
/// leading commands that depend on no input), a `uv` at the end of its plan entry after
/// the device arenas. Only a program with a prologue is written as 1.9 (the others as
/// before), so a 1.8 reader refuses exactly the files it was not made for.
pub const FORMAT_VERSION: Version = Version { major: 1, minor: 9 };

/// The version written for a program with segments (and no prologue).
pub const HETERO_FORMAT_VERSION: Version = Version { major: 1, minor: 8 };

/// The first minor version of major 1 whose plan entries carry an instantiation
/// prologue.
pub const PROLOGUE_MINOR: u16 = 9;

/// The version written for a program with bounded input dimensions and no segments.
pub const BOUNDED_FORMAT_VERSION: Version = Version { major: 1, minor: 7 };

/// The first minor version of major 1 whose plans may hold segments and transfers and
/// whose entries list per-device arena sizes.
pub const HETERO_MINOR: u16 = 8;

/// The version written for a program without bounded input dimensions.
pub const STATIC_FORMAT_VERSION: Version = Version { major: 1, minor: 5 };

/// The first minor version of major 1 whose plan entries list bounded input dimensions.
pub const BOUNDED_MINOR: u16 = 6;

/// The first minor version of major 1 whose plan entries list the dispatches whose
/// workgroups shrink with a bounded dimension's extent.
pub const BOUNDED_ROWS_MINOR: u16 = 7;

/// The first minor version of major 1 whose variants carry a condition and a workgroup
/// count ([`crate::program::Condition`]).
pub const VARIANT_CONDITION_MINOR: u16 = 5;

/// The first minor version of major 1 whose plan entries list data-dependent extents.
pub const EXTENTS_MINOR: u16 = 5;

/// The first minor version of major 1 whose plans may hold `SkipIf` commands (and
/// collective commands: both came with 1.4).
pub const SKIP_IF_MINOR: u16 = 4;

/// What a section holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SectionKind {
    /// Entry points with input/output names, dtypes, shapes.
    Signature,
    /// Command lists, buffer slots, arena size.
    Plan,
    /// Per-target code, entry symbols, relocations, required features.
    Executables,
    /// Aligned weights.
    Constants,
    /// A reference to an external weights file (size and hash).
    ExternalWeights,
    /// Op names, source locations (strippable).
    Debug,
    /// A kind this reader does not know (kept, so newer minor versions can add kinds).
    Other(u32),
}

impl SectionKind {
    /// The on-disk code.
    pub fn code(self) -> u32 {
        match self {
            SectionKind::Signature => 1,
            SectionKind::Plan => 2,
            SectionKind::Executables => 3,
            SectionKind::Constants => 4,
            SectionKind::ExternalWeights => 5,
            SectionKind::Debug => 6,
            SectionKind::Other(c) => c,
        }
    }

    /// The kind of an on-disk code.
    pub fn from_code(c: u32) -> SectionKind {
        match c {
            1 => SectionKind::Signature,
            2 => SectionKind::Plan,
            3 => SectionKind::Executables,
            4 => SectionKind::Constants,
            5 => SectionKind::ExternalWeights,
            6 => SectionKind::Debug,
            c => SectionKind::Other(c),
        }
    }
}

impl fmt::Display for SectionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SectionKind::Signature => f.write_str("signature"),
            SectionKind::Plan => f.write_str("plan"),
            SectionKind::Executables => f.write_str("executables"),
            SectionKind::Constants => f.write_str("constants"),
            SectionKind::ExternalWeights => f.write_str("external-weights"),
            SectionKind::Debug => f.write_str("debug"),
            SectionKind::Other(c) => write!(f, "section kind {c}"),
        }
    }
}

/// The little-endian `u32` at byte `o` of `d`; the caller has checked `o + 4 <= d.len()`
/// (the header and table offsets are fixed, the table's extent is checked first).
pub(crate) fn le_u32(d: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([d[o], d[o + 1], d[o + 2], d[o + 3]])
}

/// The little-endian `u64` at byte `o` of `d`, under the same precondition as [`le_u32`]
/// (`o + 8 <= d.len()`).
pub(crate) fn le_u64(d: &[u8], o: usize) -> u64 {
    u64::from(le_u32(d, o)) | (u64::from(le_u32(d, o + 4)) << 32)
}

/// CRC-32 (IEEE) of `bytes`: crc32fast's, or with the `compact-crc` feature
/// [`crc32_compact`] (the same value from a smaller table).
pub fn crc32(bytes: &[u8]) -> u32 {
    #[cfg(feature = "compact-crc")]
    {
        crc32_compact(bytes)
    }
    #[cfg(not(feature = "compact-crc"))]
    {
        let mut h = crc32fast::Hasher::new();
        h.update(bytes);
        h.finalize()
    }
}

/// The byte-at-a-time table of the reflected IEEE polynomial 0xEDB88320.
const CRC_TABLE: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
};

/// CRC-32 (IEEE) of `bytes`, one byte at a time from a 1 KB table.
pub fn crc32_compact(bytes: &[u8]) -> u32 {
    !bytes.iter().fold(!0u32, |c, &b| CRC_TABLE[usize::from((c as u8) ^ b)] ^ (c >> 8))
}

#[cfg(test)]
mod tests {
    use super::crc32_compact;

    #[test]
    fn compact_crc_is_crc32() {
        // The standard check value of CRC-32 (IEEE).
        assert_eq!(crc32_compact(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32_compact(b""), 0);
        // And crc32fast's value on every length up to 300 of a fixed byte pattern.
        let data: alloc::vec::Vec<u8> = (0..300u32).map(|i| (i.wrapping_mul(167) >> 3) as u8).collect();
        for n in 0..data.len() {
            assert_eq!(crc32_compact(&data[..n]), crc32fast::hash(&data[..n]), "length {n}");
        }
    }
}
