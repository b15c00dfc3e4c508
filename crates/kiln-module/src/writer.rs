//! Writing a container.

use crate::format::{
    crc32, SectionKind, Version, ENTRY_LEN, FORMAT_VERSION, HEADER_LEN, MAGIC, MAX_ALIGN, MAX_SECTIONS,
    STATIC_FORMAT_VERSION,
};
use alloc::vec::Vec;

/// Collects sections and lays them out.
#[derive(Debug, Default)]
pub struct ModuleWriter {
    abi: Option<Version>,
    /// The format version written (default [`STATIC_FORMAT_VERSION`]: the newest that
    /// a file without bounded input dimensions needs, so that such files stay as they were).
    format: Option<Version>,
    sections: Vec<(SectionKind, u32, Vec<u8>)>,
}

/// A section the writer refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteError {
    /// The kind was added before.
    Duplicate(SectionKind),
    /// Alignment is not a power of two up to [`MAX_ALIGN`].
    BadAlignment(u32),
    /// More than [`MAX_SECTIONS`] sections.
    TooManySections,
}

impl core::fmt::Display for WriteError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            WriteError::Duplicate(k) => write!(f, "section {k} added twice"),
            WriteError::BadAlignment(a) => write!(f, "alignment {a} is not a power of two up to {MAX_ALIGN}"),
            WriteError::TooManySections => write!(f, "more than {MAX_SECTIONS} sections"),
        }
    }
}

impl ModuleWriter {
    /// An empty container needing runtime ABI `abi`.
    pub fn new(abi: Version) -> ModuleWriter {
        ModuleWriter { abi: Some(abi), format: None, sections: Vec::new() }
    }

    /// Writes the header's format version as `format` (an older minor of the same
    /// major, for a file that uses none of the newer additions).
    pub fn with_format(mut self, format: Version) -> ModuleWriter {
        self.format = Some(format);
        self
    }

    /// Adds a section whose bytes start at a multiple of `align`.
    pub fn add(&mut self, kind: SectionKind, align: u32, bytes: Vec<u8>) -> Result<(), WriteError> {
        if !align.is_power_of_two() || align > MAX_ALIGN {
            return Err(WriteError::BadAlignment(align));
        }
        if self.sections.iter().any(|(k, _, _)| *k == kind) {
            return Err(WriteError::Duplicate(kind));
        }
        if self.sections.len() == MAX_SECTIONS {
            return Err(WriteError::TooManySections);
        }
        self.sections.push((kind, align, bytes));
        Ok(())
    }

    /// The file's bytes.
    pub fn finish(&self) -> Vec<u8> {
        let abi = self.abi.unwrap_or(FORMAT_VERSION);
        let format = self.format.unwrap_or(STATIC_FORMAT_VERSION);
        let table_end = HEADER_LEN + ENTRY_LEN * self.sections.len();
        let mut offsets = Vec::with_capacity(self.sections.len());
        let mut pos = table_end;
        for (_, align, bytes) in &self.sections {
            let a = *align as usize;
            pos = pos.div_ceil(a) * a;
            offsets.push(pos);
            pos += bytes.len();
        }
        let file_len = pos;
        let mut out = Vec::with_capacity(file_len);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&format.major.to_le_bytes());
        out.extend_from_slice(&format.minor.to_le_bytes());
        out.extend_from_slice(&abi.major.to_le_bytes());
        out.extend_from_slice(&abi.minor.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&(self.sections.len() as u32).to_le_bytes());
        out.extend_from_slice(&(file_len as u64).to_le_bytes());
        let mut table = Vec::with_capacity(ENTRY_LEN * self.sections.len());
        for ((kind, align, bytes), &off) in self.sections.iter().zip(&offsets) {
            table.extend_from_slice(&kind.code().to_le_bytes());
            table.extend_from_slice(&0u32.to_le_bytes());
            table.extend_from_slice(&(off as u64).to_le_bytes());
            table.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            table.extend_from_slice(&align.to_le_bytes());
            table.extend_from_slice(&crc32(bytes).to_le_bytes());
        }
        out.extend_from_slice(&crc32(&table).to_le_bytes());
        let header_crc = crc32(&out[..36]);
        out.extend_from_slice(&header_crc.to_le_bytes());
        out.resize(HEADER_LEN, 0);
        out.extend_from_slice(&table);
        for ((_, _, bytes), &off) in self.sections.iter().zip(&offsets) {
            out.resize(off, 0);
            out.extend_from_slice(bytes);
        }
        out
    }
}
