//! Why a compile failed: one typed error per stage, kept typed until the caller
//! prints it, and an [`ErrorKind`] that says whose problem it is.
//!
//! A command line prints the error as one line; a C API or a Python package maps
//! [`CompileError::kind`] to a code: the input is invalid, the input uses something
//! kiln does not support (yet), or kiln itself has a bug.

use std::path::PathBuf;

use kiln_codegen::CodegenError;
use kiln_flow::lower::LowerError;
use kiln_flow::program::FlowError;
use kiln_import::ImportError;
use kiln_opt::PassError;

use crate::hal::HalError;
use crate::stream::StreamError;
use crate::Stage;

/// Whose problem an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The input (a model, IR text, an option) is malformed or cannot be read: the
    /// caller fixes the input.
    InvalidInput,
    /// The input is valid but uses an op, a form of an op or a feature that kiln does
    /// not support (yet).
    Unsupported,
    /// A bug in kiln: a stage produced something the next one rejects.
    Internal,
}

impl ErrorKind {
    /// A stable lower-case name (`invalid-input`, `unsupported`, `internal`).
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::InvalidInput => "invalid-input",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Internal => "internal",
        }
    }
}

/// Why a compile failed.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The ONNX importer rejected the model.
    #[error("{}{source}", prefix(path))]
    Import {
        /// The model file, when the model came from one.
        path: Option<PathBuf>,
        /// What the importer found.
        source: ImportError,
    },
    /// A model in kiln's IR text form could not be read, parsed or verified.
    #[error("{}{source}", prefix(path))]
    Text {
        /// The `.kir` file, when the text came from one.
        path: Option<PathBuf>,
        /// What is wrong.
        source: TextError,
    },
    /// A tensor pass failed.
    #[error("tensor passes: {0}")]
    Passes(#[from] PassError),
    /// An op could not be lowered to kernels.
    #[error(transparent)]
    Flow(#[from] FlowError),
    /// Scheduling failed (a compiler bug).
    #[error(transparent)]
    Stream(#[from] StreamError),
    /// Code generation failed.
    #[error("code generation: {source}{}", from_ops(sources))]
    Codegen {
        /// What the code generator found (it names the kernel).
        source: CodegenError,
        /// The ops the kernel was formed from (`"MatMul fc1"`, as the dispatch lists
        /// them), when the kernel is one of the program's.
        sources: Vec<String>,
    },
    /// The CUDA target's cubin could not be made ([`crate::ptxas`]).
    #[error("code generation: {0}")]
    Ptxas(#[from] crate::ptxas::PtxasError),
    /// Building the command list failed (a compiler bug).
    #[error("command list: {0}")]
    Hal(#[from] HalError),
    /// The graph cannot be sharded as asked (`--devices N`, [`crate::shard`]).
    #[error("sharding: {0}")]
    Shard(#[from] kiln_shard::ShardError),
    /// A heterogeneous device list or placement rule that cannot be met
    /// (`--devices cpu,cuda`, `--place OP=DEVICE`, [`crate::placement`]).
    #[error("placement: {0}")]
    Placement(String),
    /// Sharding over several devices of a target that cannot run collectives yet.
    #[error(
        "--devices {devices} with --target cuda: a plan over several GPUs needs NCCL collectives, \
         which are not built yet (docs/scale-out.md); use --devices 1, or --target cpu to simulate the devices"
    )]
    MultiGpu {
        /// Devices asked for.
        devices: u32,
    },
    /// A plan sharded over several devices (`--devices N`) does not carry
    /// data-dependent extents yet.
    #[error("the model has data-dependent output sizes (NonZero, Compress, Unique, NonMaxSuppression, TopK with a run-time K) or bounded input dimensions, which a plan sharded over {devices} devices does not carry yet; compile for one device")]
    DynamicSharded {
        /// Devices asked for.
        devices: u32,
    },
    /// The CUDA target does not run bounded input dimensions (`--input-shape` with a
    /// range) yet.
    #[error("input `{name}` has a bounded dimension (--input-shape with a range), which the CUDA target does not support yet; compile for the CPU or give a fixed shape")]
    BoundedOnCuda {
        /// The input.
        name: String,
    },
    /// Linking the per-device programs failed (a compiler bug).
    #[error("internal error: linking the per-device programs: {0}")]
    Link(String),
    /// A stage found nothing to work on: the stage before it did not leave its result
    /// (a compiler bug).
    #[error("internal error: stage {stage} has no {missing} to work on")]
    Pipeline {
        /// The stage.
        stage: Stage,
        /// What it needed.
        missing: &'static str,
    },
}

/// Why a model in kiln's IR text form was rejected.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TextError {
    /// The file could not be read.
    #[error("cannot read the file: {0}")]
    Read(String),
    /// The text does not parse (`LINE:COL: message`).
    #[error("{0}")]
    Parse(#[from] kiln_ir::text::ParseError),
    /// The graph parses but breaks an invariant.
    #[error("{0}")]
    Verify(#[from] kiln_ir::verify::VerifyError),
    /// Input shapes or values were given: they bind ONNX inputs only.
    #[error("input shapes and values (--input-shape, --input-value) apply to ONNX models only")]
    ImportOptions,
}

impl From<CodegenError> for CompileError {
    fn from(source: CodegenError) -> CompileError {
        CompileError::Codegen { source, sources: Vec::new() }
    }
}

fn from_ops(sources: &[String]) -> String {
    if sources.is_empty() {
        String::new()
    } else {
        format!(" (the kernel of {})", sources.join(" + "))
    }
}

fn prefix(path: &Option<PathBuf>) -> String {
    path.as_ref().map(|p| format!("{}: ", p.display())).unwrap_or_default()
}

impl CompileError {
    /// Whether the compile failed only because an operand needed at compile time (axes,
    /// a shape; for the CUDA target, anything that makes an extent data-dependent) is a
    /// run-time value: binding graph inputs to values may resolve it.
    pub fn needs_constant_operand(&self) -> bool {
        matches!(self, CompileError::Flow(f) if f.needs_constant_operand())
    }

    /// The stage that failed.
    pub fn stage(&self) -> Stage {
        match self {
            CompileError::Import { .. } | CompileError::Text { .. } => Stage::Import,
            CompileError::Passes(_) => Stage::TensorPasses,
            CompileError::Flow(_) => Stage::FormDispatches,
            CompileError::Stream(_) => Stage::Schedule,
            CompileError::Codegen { .. } | CompileError::Ptxas(_) => Stage::Codegen,
            CompileError::Hal(_) => Stage::Hal,
            CompileError::Pipeline { stage, .. } => *stage,
            CompileError::Shard(_) | CompileError::MultiGpu { .. } | CompileError::Placement(_) => Stage::TensorPasses,
            CompileError::BoundedOnCuda { .. } => Stage::FormDispatches,
            CompileError::DynamicSharded { .. } => Stage::TensorPasses,
            CompileError::Link(_) => Stage::Hal,
        }
    }

    /// Whose problem it is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            CompileError::Import { source, .. } => match source {
                ImportError::Unsupported(_) | ImportError::TfliteUnsupported(_) => ErrorKind::Unsupported,
                // The importer verifies what it built: a failure is its own bug.
                ImportError::Verify(_) => ErrorKind::Internal,
                _ => ErrorKind::InvalidInput,
            },
            CompileError::Text { .. } => ErrorKind::InvalidInput,
            CompileError::Passes(e) => match e {
                PassError::UnknownPass(_) | PassError::Failed { .. } => ErrorKind::InvalidInput,
                PassError::Verify { .. } => ErrorKind::Internal,
            },
            CompileError::Flow(e) => match e {
                FlowError::Lower {
                    source: LowerError::Unsupported { .. } | LowerError::NotConstant { .. }, ..
                } => ErrorKind::Unsupported,
                FlowError::Lower { source: LowerError::Kernel(_), .. } | FlowError::Graph(_) => ErrorKind::Internal,
                FlowError::Dynamic(_) => ErrorKind::Unsupported,
            },
            CompileError::Stream(_) | CompileError::Hal(_) | CompileError::Pipeline { .. } => ErrorKind::Internal,
            CompileError::Codegen { source, .. } if source.is_internal() => ErrorKind::Internal,
            CompileError::Codegen { .. } => ErrorKind::Unsupported,
            CompileError::Ptxas(e) if e.is_internal() => ErrorKind::Internal,
            // No ptxas, or one that does not run: the caller's tool or option.
            CompileError::Ptxas(_) => ErrorKind::InvalidInput,
            CompileError::Shard(e) => match e {
                kiln_shard::ShardError::OutputNotComputed { .. } => ErrorKind::Unsupported,
                kiln_shard::ShardError::Internal { .. } => ErrorKind::Internal,
                _ => ErrorKind::InvalidInput,
            },
            CompileError::MultiGpu { .. }
            | CompileError::BoundedOnCuda { .. }
            | CompileError::DynamicSharded { .. } => ErrorKind::Unsupported,
            CompileError::Link(_) => ErrorKind::Internal,
            CompileError::Placement(_) => ErrorKind::InvalidInput,
        }
    }

    /// Whether this is a bug in kiln rather than a problem of the input.
    pub fn is_internal(&self) -> bool {
        self.kind() == ErrorKind::Internal
    }

    /// The node the error is about, when it is about one (of several unsupported ops,
    /// the first's first node).
    pub fn node(&self) -> Option<&str> {
        match self {
            CompileError::Import { source: ImportError::Node { node, .. }, .. } => Some(node),
            CompileError::Import { source: ImportError::Unsupported(ops), .. } => ops.first().map(|o| &o.node[..]),
            // A TFLite operator is named by its first output.
            CompileError::Import { source: ImportError::TfliteOp { output, .. }, .. } => Some(output),
            CompileError::Flow(FlowError::Lower { node, .. }) => Some(node),
            _ => None,
        }
    }

    /// The op the error is about, when it is about one (of several unsupported ops, the
    /// first).
    pub fn op(&self) -> Option<&str> {
        match self {
            CompileError::Import { source: ImportError::Node { op_type, .. }, .. } => Some(op_type),
            CompileError::Import { source: ImportError::Unsupported(ops), .. } => ops.first().map(|o| &o.op_type[..]),
            CompileError::Import { source: ImportError::TfliteOp { op, .. }, .. } => Some(op),
            CompileError::Import { source: ImportError::TfliteUnsupported(ops), .. } => ops.first().map(|o| &o.op[..]),
            CompileError::Flow(FlowError::Lower { source, .. }) => match source {
                LowerError::Unsupported { op, .. } | LowerError::NotConstant { op, .. } => Some(op),
                LowerError::Kernel(_) => None,
            },
            _ => None,
        }
    }
}
