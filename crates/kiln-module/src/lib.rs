//! The `.kiln` artifact container.
//!
//! A `.kiln` file is a header, a table of sections and the sections' bytes. This
//! crate knows the container only — the layout, versions, alignment and checksums —
//! not what the sections mean (the signature, plan, executables, constants and debug
//! sections are defined by the compiler stages that write them and the runtime that
//! reads them).
//!
//! Layout (all integers little-endian):
//!
//! ```text
//! offset  size  field
//!      0     8  magic "KILNMOD\0"
//!      8     2  format version, major       a reader accepts its own major and any
//!     10     2  format version, minor       minor up to its own
//!     12     2  runtime ABI needed, major   the runtime checks these against its own
//!     14     2  runtime ABI needed, minor
//!     16     4  flags (0)
//!     20     4  section count (≤ MAX_SECTIONS)
//!     24     8  file length in bytes
//!     32     4  CRC-32 of the section table
//!     36     4  CRC-32 of the header bytes 0..36
//!     40    24  reserved (zero)
//!     64  32·n  section table: kind u32, flags u32, offset u64, length u64,
//!               alignment u32 (power of two ≤ 4096), CRC-32 of the bytes u32
//! ```
//!
//! Sections lie inside the file, at offsets that are multiples of their alignment,
//! after the table, without overlapping; each kind appears at most once.
//! [`reader::Module::parse`] checks all of this before handing out a byte, and is
//! fuzzed (`fuzz/fuzz_targets/read_module.rs`).
#![no_std]
#![deny(missing_docs)]

extern crate alloc;

pub mod abi;
pub mod dtype;
pub mod format;
pub mod program;
pub mod reader;
pub mod reseal;
pub mod sections;
pub mod show;
pub mod writer;

pub use dtype::DType;
pub use format::{SectionKind, Version, FORMAT_VERSION};
pub use reader::{Module, ReadError};
pub use writer::ModuleWriter;
