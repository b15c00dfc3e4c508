//! The CPU device: placing generated code in executable memory, the helper table
//! kernels call, and the host's CPU features.

pub mod helpers;
#[cfg(feature = "loader-libc")]
pub mod loader;

#[cfg(feature = "loader-libc")]
mod native {
    use super::{helpers, loader};
    use crate::error::RuntimeError;
    use crate::hal::{CodeLoader, KernelFn, LoadError, LoadedImage};
    use crate::module::{LoadedModule, Module, VerifiedPlan};
    use alloc::boxed::Box;
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
            Module::verify_plan(artifact)?.load(weights)
        }
    }

    #[cfg(feature = "std")]
    impl Module {
        /// [`Module::load`] with every allocation it makes (the decoded plan, the
        /// kernel table, the code's bookkeeping, an aligned copy of the constants) from
        /// `allocator`, which the module's memory also returns to when it is dropped
        /// ([`crate::memory`]: needs [`crate::memory::Routed`] as the global allocator).
        pub fn load_in<'a>(
            artifact: &'a [u8],
            weights: Option<&'a [u8]>,
            allocator: &'static dyn crate::memory::Allocator,
        ) -> Result<LoadedModule<'a>, RuntimeError> {
            crate::memory::within(allocator, || Module::load(artifact, weights))
        }
    }

    impl<'a> VerifiedPlan<'a> {
        /// [`Module::load`] after [`Module::verify_plan`], for a caller that verified the
        /// plan already (to read it: the weights file it names) and should not pay for
        /// those checks twice: [`VerifiedPlan::bind`] with the host's CPU features, then
        /// the code through [`CpuLoader`].
        pub fn load(self, weights: Option<&'a [u8]>) -> Result<LoadedModule<'a>, RuntimeError> {
            self.bind(weights, super::host_features())?.load(&CpuLoader)
        }
    }
}

#[cfg(feature = "loader-libc")]
pub use native::CpuLoader;

/// The CPU features of the machine this runs on, as bits of
/// [`kiln_module::program::CpuFeature`] (off x86-64: the architecture's marker
/// alone). With `std`, from the
/// standard library's detection; without it (`loader-libc`), from `cpuid` and `xgetbv`
/// ([`cpuid_features`]), which reads the same bits.
#[cfg(feature = "loader-libc")]
pub fn host_features() -> u64 {
    #[cfg(feature = "std")]
    {
        std_features()
    }
    #[cfg(all(not(feature = "std"), target_arch = "x86_64"))]
    {
        cpuid_features()
    }
    #[cfg(all(not(feature = "std"), not(target_arch = "x86_64")))]
    {
        other_arch_features()
    }
}

/// Off x86-64: the architecture's marker bit (see `kiln_module::program::CpuArch`),
/// which every CPU of it has (NEON is part of every AArch64 core the runtime builds
/// for); none for an architecture without a code generator.
#[cfg(all(feature = "loader-libc", not(target_arch = "x86_64")))]
fn other_arch_features() -> u64 {
    use kiln_module::program::CpuFeature as F;
    if cfg!(target_arch = "aarch64") {
        F::Aarch64.bit()
    } else if cfg!(all(target_arch = "riscv64", target_feature = "d", target_feature = "m")) {
        F::Riscv64.bit()
    } else {
        0
    }
}

/// The host's CPU features as `cpuid` and `xgetbv` report them, without std: a feature
/// whose registers the operating system does not save (AVX without XMM and YMM state in
/// XCR0, AVX-512 without the opmask and ZMM state) counts as absent, as in std's
/// `is_x86_feature_detected!`.
#[cfg(target_arch = "x86_64")]
pub fn cpuid_features() -> u64 {
    use core::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv, CpuidResult};
    use kiln_module::program::CpuFeature as F;
    let bit = |reg: u32, n: u32| reg >> n & 1 == 1;
    // `cpuid` exists on every x86-64 processor; leaves above the maximum the processor
    // reports are not read.
    let (max, max_ext) = (__cpuid(0).eax, __cpuid(0x8000_0000).eax);
    let l1 = __cpuid(1);
    let l7 = if max >= 7 { __cpuid_count(7, 0) } else { CpuidResult { eax: 0, ebx: 0, ecx: 0, edx: 0 } };
    let ext_ecx = if max_ext >= 0x8000_0001 { __cpuid(0x8000_0001).ecx } else { 0 };
    let mut bits = 0u64;
    let mut set = |on: bool, f: F| {
        if on {
            bits |= f.bit();
        }
    };
    set(bit(l1.edx, 26), F::Sse2);
    set(bit(l1.ecx, 0), F::Sse3);
    set(bit(l1.ecx, 9), F::Ssse3);
    set(bit(l1.ecx, 19), F::Sse41);
    set(bit(l1.ecx, 20), F::Sse42);
    set(bit(l1.ecx, 23), F::Popcnt);
    set(bit(l7.ebx, 3), F::Bmi1);
    set(bit(l7.ebx, 8), F::Bmi2);
    set(bit(ext_ecx, 5), F::Lzcnt);
    // OSXSAVE: the operating system enabled `xgetbv` and says which state it saves.
    if bit(l1.ecx, 27) {
        // SAFETY: OSXSAVE is set, so `xgetbv` is enabled; XCR0 is register 0.
        let xcr0 = unsafe { _xgetbv(0) };
        if xcr0 & 0x6 == 0x6 {
            set(bit(l1.ecx, 28), F::Avx);
            set(bit(l7.ebx, 5), F::Avx2);
            set(bit(l1.ecx, 12), F::Fma);
            set(bit(l1.ecx, 29), F::F16c);
            if xcr0 & 0xe0 == 0xe0 {
                set(bit(l7.ebx, 16), F::Avx512f);
                set(bit(l7.ebx, 30), F::Avx512bw);
                set(bit(l7.ebx, 17), F::Avx512dq);
                set(bit(l7.ebx, 31), F::Avx512vl);
                set(bit(l7.ecx, 11), F::Avx512vnni);
            }
        }
    }
    bits
}

#[cfg(feature = "std")]
fn std_features() -> u64 {
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
            Avx512f "avx512f", Avx512bw "avx512bw", Avx512dq "avx512dq", Avx512vl "avx512vl",
            Avx512vnni "avx512vnni"
        );
        bits
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        other_arch_features()
    }
}

#[cfg(all(test, feature = "std", target_arch = "x86_64"))]
mod tests {
    #[test]
    fn cpuid_reads_what_std_detects() {
        assert_eq!(super::cpuid_features(), super::std_features());
    }
}
