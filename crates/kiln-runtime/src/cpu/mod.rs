//! The CPU device: placing generated code in executable memory, the helper table
//! kernels call, and the host's CPU features.

pub mod helpers;
#[cfg(feature = "std")]
pub mod loader;

#[cfg(feature = "std")]
mod native {
    use super::{helpers, loader};
    use crate::error::RuntimeError;
    use crate::hal::{CodeLoader, KernelFn, LoadError, LoadedImage};
    use crate::module::{LoadedModule, Module};
    use kiln_module::abi::{HelperFn, HELPER_COUNT};
    use kiln_module::program::Reloc;

    /// The runtime's own loader: anonymous mappings made read-execute after
    /// relocation ([`loader::LoadedCode`]), and the helper table [`helpers::HELPERS`].
    #[derive(Debug, Clone, Copy, Default)]
    pub struct CpuLoader;

    impl LoadedImage for loader::LoadedCode {
        fn entry(&self, offset: u64) -> Result<KernelFn, LoadError> {
            loader::LoadedCode::entry(self, offset).map_err(LoadError::Cpu)
        }
    }

    impl CodeLoader for CpuLoader {
        fn helpers(&self) -> &'static [HelperFn; HELPER_COUNT] {
            &helpers::HELPERS
        }

        fn load(&self, code: &[u8], relocs: &[Reloc]) -> Result<Box<dyn LoadedImage>, LoadError> {
            Ok(Box::new(loader::LoadedCode::load(code, relocs).map_err(LoadError::Cpu)?))
        }
    }

    impl Module {
        /// Loads an artifact on this machine: every check of [`Module::verify`] with the
        /// host's CPU features, then its code through [`CpuLoader`]. `weights` is the
        /// external weights file for modules compiled with weights kept outside.
        pub fn load<'a>(artifact: &'a [u8], weights: Option<&'a [u8]>) -> Result<LoadedModule<'a>, RuntimeError> {
            Module::verify(artifact, weights, super::host_features())?.load(&CpuLoader)
        }
    }
}

#[cfg(feature = "std")]
pub use native::CpuLoader;

/// The CPU features of the machine this runs on, as bits of
/// [`kiln_module::program::CpuFeature`] (none off x86-64).
#[cfg(feature = "std")]
pub fn host_features() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use kiln_module::program::CpuFeature as F;
        let mut bits = 0u64;
        macro_rules! detect {
            ($($f:ident $name:tt),*) => {
                $(if std::is_x86_feature_detected!($name) { bits |= F::$f.bit(); })*
            };
        }
        detect!(
            Sse2 "sse2", Sse3 "sse3", Ssse3 "ssse3", Sse41 "sse4.1", Sse42 "sse4.2", Popcnt "popcnt",
            Avx "avx", Avx2 "avx2", Fma "fma", Bmi1 "bmi1", Bmi2 "bmi2", Lzcnt "lzcnt", F16c "f16c",
            Avx512f "avx512f", Avx512bw "avx512bw", Avx512dq "avx512dq", Avx512vl "avx512vl"
        );
        bits
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        0
    }
}
