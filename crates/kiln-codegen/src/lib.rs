//! Code generation: flow-level kernels to native executables.
//!
//! [`cpu`] compiles [`kiln_flow::Kernel`]s to x86-64 through Cranelift; [`cuda`]
//! writes them as PTX for NVIDIA Hopper GPUs.
#![deny(missing_docs)]

pub mod cpu;
pub mod cuda;

pub use cpu::{classify, compile, compile_with, CpuModule, CpuTarget, Options, Packing};

/// Why kernels could not be compiled.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CodegenError {
    /// The kernel uses something this code generator does not handle (yet). (The
    /// CUDA target's `what` ends in "(CUDA target)"; the CPU's is the default target.)
    #[error("kernel {kernel}: {what} is not supported by the code generator")]
    Unsupported {
        /// Kernel name.
        kernel: String,
        /// What is missing.
        what: String,
    },
    /// The kernel is malformed (a bug in whatever built it).
    #[error("kernel {kernel} is malformed: {error}")]
    Invalid {
        /// Kernel name.
        kernel: String,
        /// What the verifier found.
        error: kiln_flow::KernelError,
    },
    /// A compile-time setting is malformed (the measurement knob `KILN_CUDA_TUNE`).
    #[error("{0}")]
    Setting(String),
    /// A bug in the code generator.
    #[error("internal error in the code generator (kernel {kernel:?}): {what}")]
    Internal {
        /// Kernel name (empty when not about one kernel).
        kernel: String,
        /// What went wrong.
        what: String,
    },
}

impl CodegenError {
    /// Whether this is a bug (in the code generator or in whatever built the kernel)
    /// rather than a kernel this code generator does not handle.
    pub fn is_internal(&self) -> bool {
        !matches!(self, CodegenError::Unsupported { .. } | CodegenError::Setting(_))
    }

    /// The kernel the error is about (empty when it is not about one).
    pub fn kernel(&self) -> &str {
        match self {
            CodegenError::Unsupported { kernel, .. }
            | CodegenError::Invalid { kernel, .. }
            | CodegenError::Internal { kernel, .. } => kernel,
            CodegenError::Setting(_) => "",
        }
    }
}
