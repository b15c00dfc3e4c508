//! The kiln runtime: maps a `.kiln` artifact, verifies it, loads its code, and replays
//! its plan. It carries no operator implementations: every kernel comes from the
//! artifact.
//!
//! ```text
//! Module::verify_plan(artifact)        container → ABI → sections → plan verification
//!                                      (no weights, no host: for tools that list an artifact)
//! Module::load(artifact, weights)      container → ABI → sections → plan verification
//!                                      → weights binding → variant choice → code loading
//!   or plan.load(weights)              the same after Module::verify_plan, checking nothing twice
//! Instance::new(&module)               the arena and the driver's tables, allocated once
//!   or ::with_threads(&module, n)      … and n−1 worker threads (the local-task driver)
//! instance.invoke(&inputs, &mut outs)  checks the arguments, then walks the commands:
//!                                      no checks, no allocation, no lookups
//! ```
//!
//! The core is `no_std` + `alloc`. The `std` feature (default) adds the CPU code loader,
//! host CPU feature detection, [`Module::load`] and [`OwnedModule`]; without it an
//! embedder passes its own [`hal::CodeLoader`] to [`Verified::load`] and the host's
//! features to [`Module::verify`]. The `loader-libc` feature brings the CPU loader and
//! [`Module::load`] without std, on the C library alone (`mmap`, `mprotect`, `munmap`,
//! `sysconf`; CPU features read with `cpuid`/`xgetbv`). The `local-task` feature (default; needs `std`) adds the
//! multithreaded driver, `Instance::with_threads`. The `cuda` feature (needs `std`) adds
//! the `cuda` module: the plan of a CUDA artifact replayed on an NVIDIA GPU as one CUDA graph.
//! With `std`, [`memory`] routes every allocation of a load or an instance to an allocator
//! the embedder supplies (`Module::load_in`, `Instance::new_in`, `Instance::with_threads_in`).
#![cfg_attr(not(feature = "std"), no_std)]
#![deny(missing_docs)]

extern crate alloc;

mod collective;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod dtype;
pub mod error;
#[cfg(feature = "std")]
pub mod fs;
pub mod hal;
mod hetero;
mod instance;
#[cfg(feature = "std")]
pub mod memory;
mod module;
#[cfg(feature = "std")]
mod owned;
#[cfg(feature = "std")]
mod pages;
#[cfg(feature = "local-task")]
mod task;
pub mod verify;

pub use error::{ConditionProblem, RuntimeError, VerifyError};
pub use hal::{CodeLoader, KernelFn, LoadError, LoadedImage};
pub use instance::{Instance, Observe, TensorMut, TensorRef};
pub use module::{EntrySignature, LoadedModule, Module, Signature, Verified, VerifiedPlan, RUNTIME_ABI};
#[cfg(feature = "std")]
pub use owned::OwnedModule;

/// Most threads an instance may run on ([`Instance::with_threads`]).
#[cfg(feature = "local-task")]
pub const MAX_THREADS: usize = 4096;

/// Largest arena alignment a module may ask for.
pub const MAX_ARENA_ALIGN: u64 = 4096;
