//! The boundary between the runtime and the machine it runs on: placing an executable's
//! code in executable memory and the helper table its kernels call. With the `std`
//! (or `loader-libc`) feature the runtime brings its own ([`crate::cpu::CpuLoader`]);
//! without it the embedder implements [`CodeLoader`].

use alloc::boxed::Box;
use alloc::string::String;
use core::fmt;
use kiln_module::abi::{HelperFn, HELPER_COUNT};
use kiln_module::program::Reloc;

/// A loaded kernel entry point (the calling convention of [`kiln_module::abi`]):
/// `kernel(bindings, helpers, begin, end)` runs workgroups `begin..end`.
pub type KernelFn = unsafe extern "C" fn(*const *mut u8, *const HelperFn, u64, u64);

/// Places code in executable memory.
pub trait CodeLoader {
    /// The helper table passed to every kernel ([`kiln_module::abi::Helper`] order).
    fn helpers(&self) -> &'static [HelperFn; HELPER_COUNT];

    /// Copies `code` into executable memory, applies `relocs` (offsets and targets
    /// are already checked to lie inside `code`) and returns the image.
    fn load(&self, code: &[u8], relocs: &[Reloc]) -> Result<Box<dyn LoadedImage>, LoadError>;
}

/// Code placed by a [`CodeLoader`]; it stays mapped until dropped. Shared between
/// threads with the module that owns it, so it must be `Send + Sync` (placed code is
/// never written after loading).
pub trait LoadedImage: Send + Sync {
    /// The function at code offset `offset` (checked to lie inside the code). The
    /// pointer is valid while the image lives.
    fn entry(&self, offset: u64) -> Result<KernelFn, LoadError>;
}

/// Why code could not be placed.
#[derive(Debug)]
pub enum LoadError {
    /// The runtime's own CPU loader failed.
    #[cfg(feature = "loader-libc")]
    Cpu(crate::cpu::loader::LoadError),
    /// An embedder's loader failed, with its message.
    Embedder(String),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "loader-libc")]
            LoadError::Cpu(e) => write!(f, "{e}"),
            LoadError::Embedder(m) => f.write_str(m),
        }
    }
}
