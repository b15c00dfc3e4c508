//! The stream level's algorithms, independent of any IR: they work on plain
//! dependency lists and buffer lifetimes, so every later level (and every device)
//! shares them.
//!
//! - [`waves`]: a dependency DAG → a topological order partitioned into waves of
//!   mutually independent tasks, and the barriers between waves (optionally with
//!   keyed tasks run one key at a time, to keep what each key reads in cache);
//! - [`arena`]: buffers with sizes and lifetimes → offsets in one arena, reusing
//!   memory between buffers whose lifetimes do not overlap, with the lower bound
//!   (the largest total size of buffers alive at one time) to judge the plan by.
#![deny(missing_docs)]

pub mod arena;
pub mod waves;
