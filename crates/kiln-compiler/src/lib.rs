//! The compile pipeline of kiln: one list of named stages ([`Stage::ALL`]) that the
//! command line, the filetests, the tests and the benches all run through
//! [`Compilation`]:
//!
//! ```text
//! model (ONNX file or bytes, IR text, or a graph)
//!   ──import (kiln-import)──► tensor graph
//!   ──tensor-passes (kiln-opt)──► tensor graph
//!   ──flow-form-dispatches (kiln-flow)──► flow program: dispatches on buffers
//!   ──flow-narrow-storage (kiln-flow::precision)──► flow program (f16/bf16 storage)
//!   ──flow-pack-weights (kiln-flow::layout, widths from kiln-codegen)──► flow program
//!   ──stream-schedule──► waves, lifetimes, arena plan, constant pool
//!   ──cpu-codegen (kiln-codegen)──► one executable per target (CUDA: PTX, and a
//!                                    cubin from ptxas when one is given, [`ptxas`])
//!   ──hal-build-program──► static command list, kernel table, constants
//!   ──artifact-write (kiln_module::sections)──► .kiln bytes (+ external weights)
//! ```
//!
//! A [`Compilation`] holds each level's result; [`Compilation::run_to`] stops after
//! any stage (`kiln compile --to tensor|flow|stream|hal`), a hook sees the state after
//! every tensor pass and every stage (`--dump-after`), and [`Compilation::text`] gives
//! the text form of the level reached: kiln-ir's text, the flow program's `Display`,
//! [`stream::print`]. [`compile`] runs a graph through every stage.
//!
//! Errors ([`CompileError`]) stay typed until the caller prints them and say whose
//! problem they are ([`CompileError::kind`]).
#![deny(missing_docs)]

mod error;
pub mod hal;
pub mod hetero;
mod link;
pub mod placement;
pub mod ptxas;
pub mod shard;
pub mod stream;
pub mod variants;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_flow::class::KernelClass;
use kiln_flow::program::FlowProgram;
use kiln_ir::Graph;
use kiln_module::program::{Condition, Constants, CudaArch, DebugInfo, Device, DeviceKind, Kernel, Program, Variant};

pub use error::{CompileError, ErrorKind, TextError};
pub use kiln_codegen::cpu::{CodePath, CpuTarget};
pub use kiln_codegen::cuda::tune::Arch as CudaTargetArch;
pub use kiln_codegen::cuda::CudaModule;
pub use kiln_codegen::{CodegenError, CpuModule};
pub use link::Linked;

/// The device a compilation generates code for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetDevice {
    /// The host CPU ([`Options::target`] says which x86-64 features).
    #[default]
    Cpu,
    /// An NVIDIA Hopper GPU (`sm_90a`), PTX per kernel ([`kiln_codegen::cuda`]).
    Cuda,
}
pub use kiln_flow::precision::Precision;
pub use kiln_import::ImportOptions;

/// Options of a [`Compilation`] (and of [`compile`]).
#[derive(Debug, Clone)]
pub struct Options {
    /// CPU the code is generated for (with [`TargetDevice::Cpu`]); with
    /// [`Options::cpu_variants`], the lowest level, whose code every kernel has.
    pub target: CpuTarget,
    /// Higher x86-64 levels than [`Options::target`], in ascending order, whose code the
    /// artifact carries too as preferred variants of the kernels it differs for; the
    /// runtime takes the best the host has, once at load ([`variants`]). Empty: one
    /// level.
    pub cpu_variants: Vec<CpuTarget>,
    /// The device the kernels run on.
    pub device: TargetDevice,
    /// Keep the constants in a separate file with this name (the caller writes
    /// [`Compiled::weights`] there).
    pub external_weights: Option<String>,
    /// Leave out the debug section and the memory map's buffer names.
    pub strip: bool,
    /// Tensor passes to run (`None`: the default pipeline).
    pub passes: Option<Vec<String>>,
    /// The source file's name, for the debug section.
    pub source: String,
    /// Optimise for code size rather than speed: no microkernels, no inline
    /// transcendentals (`kiln compile --opt size`).
    pub size: bool,
    /// How the [`Stage::Import`] stage binds an ONNX model's inputs.
    pub import: ImportOptions,
    /// The storage type of f32 tensors (`kiln compile --precision`): f32, or f16/bf16
    /// storage with f32 arithmetic ([`Stage::NarrowStorage`]).
    pub precision: Precision,
    /// With [`TargetDevice::Cuda`]: assemble the PTX into a cubin for `sm_90a` with this
    /// `ptxas` and ship it beside the PTX, preferred by every kernel ([`ptxas`];
    /// [`ptxas::find`] looks one up). `None`: PTX only.
    pub ptxas: Option<PathBuf>,
    /// With [`TargetDevice::Cuda`]: the GPU architectures to write code for, each a
    /// variant of every kernel chosen at load by the device's compute capability
    /// (`kiln compile --cuda-arch sm_90a,sm_80`). Empty: `sm_90a` only. The variants
    /// are ordered best first whatever the order here (`sm_90a`, its cubin first, then
    /// `sm_80`); only `sm_90a` gets a cubin.
    pub cuda_archs: Vec<CudaTargetArch>,
    /// Fuse each attention chain (product, softmax, product) into one kernel with an
    /// online softmax, the score matrix never stored (CPU microkernel targets). On by
    /// default; `kiln compile --no-fuse-attention` turns it off (docs/benchmarks.md
    /// compares the two).
    pub fused_attention: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            target: CpuTarget::Host,
            cpu_variants: Vec::new(),
            device: TargetDevice::Cpu,
            external_weights: None,
            strip: false,
            passes: None,
            source: String::new(),
            size: false,
            import: ImportOptions::default(),
            precision: Precision::F32,
            ptxas: None,
            cuda_archs: Vec::new(),
            fused_attention: true,
        }
    }
}

/// The result of a compile.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The `.kiln` bytes.
    pub artifact: Vec<u8>,
    /// The constant pool, when kept outside the artifact.
    pub weights: Option<Vec<u8>>,
    /// The flow-level program.
    pub flow: FlowProgram,
    /// The stream-level plan.
    pub plan: stream::StreamPlan,
    /// The program written.
    pub program: Program,
    /// Wall time of each stage run, in order.
    pub phases: Vec<(Stage, Duration)>,
    /// Per dispatch, how its code was generated (microkernel or general, and why).
    pub codegen_notes: Vec<String>,
    /// Per dispatch, how its code runs along its contiguous axis (vector width, or
    /// scalar).
    pub codegen_paths: Vec<CodePath>,
    /// The cubin of a CUDA compilation given a `ptxas` ([`Options::ptxas`]), with what
    /// each kernel uses.
    pub cubin: Option<ptxas::Cubin>,
}

/// One stage of the pipeline, in the order [`Stage::ALL`] runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// The model to a tensor graph ([`import`]).
    Import,
    /// The tensor passes of kiln-opt ([`Options::passes`]; by default all of
    /// [`kiln_opt::registry`], in its order).
    TensorPasses,
    /// Lowering every op to kernels and fusing them: the flow level.
    FormDispatches,
    /// f32 constants and intermediates stored as f16 or bf16 ([`Options::precision`];
    /// nothing at f32), kernels computing in f32 ([`kiln_flow::precision`]). It sits
    /// after dispatch formation so that only what fusion leaves stored is rounded
    /// (a kernel's fused intermediates stay f32 in registers), and before weight
    /// packing so that the constant pool holds what kernels read.
    NarrowStorage,
    /// Constant operands of contractions into the panel layout of the target's
    /// microkernels. It sits after dispatch formation because the panels follow the
    /// fused kernels, and before scheduling because the packed constants are what the
    /// constant pool holds.
    PackWeights,
    /// Waves, lifetimes, the arena plan and the constant pool: the stream level.
    Schedule,
    /// Every kernel to machine code for the CPU target.
    Codegen,
    /// The static command list, kernel table and constants: the HAL level.
    Hal,
    /// The `.kiln` bytes.
    Artifact,
}

impl Stage {
    /// Every stage, in pipeline order.
    pub const ALL: [Stage; 9] = [
        Stage::Import,
        Stage::TensorPasses,
        Stage::FormDispatches,
        Stage::NarrowStorage,
        Stage::PackWeights,
        Stage::Schedule,
        Stage::Codegen,
        Stage::Hal,
        Stage::Artifact,
    ];

    /// The stage's name (`<level>-<verb>-<noun>` where it transforms a level).
    pub fn name(self) -> &'static str {
        match self {
            Stage::Import => "import",
            Stage::TensorPasses => "tensor-passes",
            Stage::FormDispatches => "flow-form-dispatches",
            Stage::NarrowStorage => "flow-narrow-storage",
            Stage::PackWeights => "flow-pack-weights",
            Stage::Schedule => "stream-schedule",
            Stage::Codegen => "cpu-codegen",
            Stage::Hal => "hal-build-program",
            Stage::Artifact => "artifact-write",
        }
    }

    /// One line saying what it does.
    pub fn summary(self) -> &'static str {
        match self {
            Stage::Import => "read the model (ONNX, or kiln IR text) into a tensor graph with static shapes",
            Stage::TensorPasses => "run the tensor passes (kiln list-passes) in pipeline order",
            Stage::FormDispatches => "lower ops to kernels and fuse them (flow level)",
            Stage::NarrowStorage => "store f32 constants and intermediates as f16/bf16 (--precision), computing in f32",
            Stage::PackWeights => "lay contraction constants out in the target microkernels' panels",
            Stage::Schedule => "order dispatches in waves, plan the arena and the constant pool (stream level)",
            Stage::Codegen => "compile every kernel to machine code for the CPU target",
            Stage::Hal => "build the static command list, kernel table and constants (HAL level)",
            Stage::Artifact => "write the .kiln bytes (and the external weights)",
        }
    }

    /// The stage called `name`.
    pub fn from_name(name: &str) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| s.name() == name)
    }

    /// The stage after this one.
    pub fn next(self) -> Option<Stage> {
        Stage::ALL.into_iter().find(|&s| s > self)
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// A level of the pipeline that has a text form (`kiln compile --to LEVEL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// The tensor graph after the tensor passes.
    Tensor,
    /// The flow program as dispatch formation leaves it, storage narrowed to
    /// [`Options::precision`].
    Flow,
    /// The stream plan of the program that ships (weights packed).
    Stream,
    /// The program's command list.
    Hal,
}

impl Level {
    /// Every level, in pipeline order.
    pub const ALL: [Level; 4] = [Level::Tensor, Level::Flow, Level::Stream, Level::Hal];

    /// The level's name (`tensor`, `flow`, `stream`, `hal`).
    pub fn name(self) -> &'static str {
        match self {
            Level::Tensor => "tensor",
            Level::Flow => "flow",
            Level::Stream => "stream",
            Level::Hal => "hal",
        }
    }

    /// The level called `name`.
    pub fn from_name(name: &str) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.name() == name)
    }

    /// The stage that completes the level.
    pub fn stage(self) -> Stage {
        match self {
            Level::Tensor => Stage::TensorPasses,
            Level::Flow => Stage::NarrowStorage,
            Level::Stream => Stage::Schedule,
            Level::Hal => Stage::Hal,
        }
    }
}

/// A model to compile.
#[derive(Debug, Clone)]
pub enum Input {
    /// A tensor graph already built.
    Graph(Graph),
    /// A file: kiln IR text when its extension is `.kir`, a TFLite model when it
    /// carries TFLite's file identifier (or the `.tflite` extension), else an ONNX model
    /// (external data read beside it).
    File(PathBuf),
    /// An ONNX model in memory; external data is looked up in `base_dir`.
    OnnxBytes {
        /// The serialized `ModelProto`.
        bytes: bytes::Bytes,
        /// Where external data files are (none: the model must not have any).
        base_dir: Option<PathBuf>,
    },
    /// A model in kiln's IR text form.
    Text(String),
}

/// The [`Stage::Import`] stage on its own: `input` as a tensor graph, verified.
/// `opts` bind ONNX inputs; they are an error for IR text.
pub fn import(input: Input, opts: &ImportOptions) -> Result<Graph, CompileError> {
    let binds = !opts.input_shapes.is_empty() || !opts.input_values.is_empty();
    let text = |path: Option<&Path>, src: &str| -> Result<Graph, CompileError> {
        let at = |source: TextError| CompileError::Text { path: path.map(Path::to_path_buf), source };
        if binds {
            return Err(at(TextError::ImportOptions));
        }
        let g = kiln_ir::text::parse(src).map_err(|e| at(e.into()))?;
        kiln_ir::verify::verify(&g).map_err(|e| at(e.into()))?;
        Ok(g)
    };
    match input {
        Input::Graph(g) => Ok(g),
        Input::Text(src) => text(None, &src),
        Input::File(path) if path.extension().is_some_and(|e| e == "kir") => {
            let src = std::fs::read_to_string(&path)
                .map_err(|e| CompileError::Text { path: Some(path.clone()), source: TextError::Read(e.to_string()) })?;
            text(Some(&path), &src)
        }
        Input::File(path) => {
            kiln_import::import_file(&path, opts).map_err(|source| CompileError::Import { path: Some(path), source })
        }
        Input::OnnxBytes { bytes, base_dir } => kiln_import::onnx::import_bytes(bytes, base_dir.as_deref(), opts)
            .map_err(|source| CompileError::Import { path: None, source }),
    }
}

/// One model on its way through the pipeline: each stage's result, kept until a later
/// stage consumes or changes it.
///
/// Stages run in [`Stage::ALL`] order, each at most once. After an error the
/// compilation stays at the last stage that succeeded (the failed stage's level may
/// be partly changed); drop it.
#[derive(Debug)]
pub struct Compilation {
    options: Options,
    input: Option<Input>,
    done: Option<Stage>,
    graph: Option<Graph>,
    flow: Option<FlowProgram>,
    plan: Option<stream::StreamPlan>,
    cpu: Option<CpuModule>,
    /// The higher levels' code ([`Options::cpu_variants`]), after [`Stage::Codegen`].
    tiers: Vec<variants::Tier>,
    cuda: Option<CudaModule>,
    /// The architecture `cuda` was written for: the first (best) of
    /// [`Options::cuda_archs`].
    cuda_arch: CudaTargetArch,
    /// The modules of the further architectures of [`Options::cuda_archs`], after the
    /// first (best) one, which is `cuda`.
    cuda_more: Vec<(CudaTargetArch, CudaModule)>,
    cubin: Option<ptxas::Cubin>,
    program: Option<Program>,
    weights: Option<Vec<u8>>,
    artifact: Option<Vec<u8>>,
    phases: Vec<(Stage, Duration)>,
}

/// What a [`Compilation`] hook is shown: the name of the tensor pass or [`Stage`] just
/// run (`--dump-after NAME`), and the compilation after it.
pub type Hook<'h> = dyn FnMut(&str, &Compilation) + 'h;

impl Compilation {
    /// A compilation of `input` with `options`; nothing has run yet.
    pub fn new(input: Input, options: Options) -> Compilation {
        Compilation {
            options,
            input: Some(input),
            done: None,
            graph: None,
            flow: None,
            plan: None,
            cpu: None,
            tiers: Vec::new(),
            cuda: None,
            cuda_arch: CudaTargetArch::Sm90a,
            cuda_more: Vec::new(),
            cubin: None,
            program: None,
            weights: None,
            artifact: None,
            phases: Vec::new(),
        }
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The last stage that has run.
    pub fn done(&self) -> Option<Stage> {
        self.done
    }

    /// The tensor graph (after [`Stage::Import`], transformed by [`Stage::TensorPasses`]).
    pub fn graph(&self) -> Option<&Graph> {
        self.graph.as_ref()
    }

    /// The flow program (after [`Stage::FormDispatches`], packed by [`Stage::PackWeights`]).
    pub fn flow(&self) -> Option<&FlowProgram> {
        self.flow.as_ref()
    }

    /// The stream plan (after [`Stage::Schedule`]).
    pub fn plan(&self) -> Option<&stream::StreamPlan> {
        self.plan.as_ref()
    }

    /// The compiled kernels (after [`Stage::Codegen`]).
    pub fn cpu(&self) -> Option<&CpuModule> {
        self.cpu.as_ref()
    }

    /// The higher CPU levels' kernels ([`Options::cpu_variants`], after [`Stage::Codegen`]):
    /// per level, the kernels whose code differs from the level below's.
    pub fn cpu_tiers(&self) -> &[variants::Tier] {
        &self.tiers
    }

    /// The compiled kernels of a CUDA compilation (after [`Stage::Codegen`]).
    pub fn cuda(&self) -> Option<&CudaModule> {
        self.cuda.as_ref()
    }

    /// The cubin of a CUDA compilation given a `ptxas` (after [`Stage::Codegen`]).
    pub fn cubin(&self) -> Option<&ptxas::Cubin> {
        self.cubin.as_ref()
    }

    /// The program (after [`Stage::Hal`]).
    pub fn program(&self) -> Option<&Program> {
        self.program.as_ref()
    }

    /// The `.kiln` bytes (after [`Stage::Artifact`]).
    pub fn artifact(&self) -> Option<&[u8]> {
        self.artifact.as_deref()
    }

    /// Wall time of each stage run so far.
    pub fn phases(&self) -> &[(Stage, Duration)] {
        &self.phases
    }

    /// The text form of the level the last stage left: kiln-ir's text after
    /// [`Stage::Import`] and [`Stage::TensorPasses`], the flow program after the flow
    /// stages, [`stream::print`] after [`Stage::Schedule`], one line per kernel saying
    /// how its code was generated after [`Stage::Codegen`]. `None` before any stage
    /// and after [`Stage::Hal`] (the program's listing is `kiln inspect`'s).
    pub fn text(&self) -> Option<String> {
        match self.done? {
            Stage::Import | Stage::TensorPasses => self.graph.as_ref().map(kiln_ir::text::print),
            Stage::FormDispatches | Stage::NarrowStorage | Stage::PackWeights => {
                self.flow.as_ref().map(|f| format!("{f}"))
            }
            Stage::Schedule => Some(stream::print(self.flow.as_ref()?, self.plan.as_ref()?)),
            Stage::Codegen => {
                let flow = self.flow.as_ref()?;
                let notes = match (&self.cpu, &self.cuda) {
                    (Some(cpu), _) => &cpu.notes,
                    (None, Some(cuda)) => &cuda.notes,
                    _ => return None,
                };
                Some(flow.dispatches.iter().zip(notes).map(|(d, n)| format!("{}: {n}\n", d.kernel.name)).collect())
            }
            Stage::Hal | Stage::Artifact => None,
        }
    }

    /// Runs every stage not yet run up to and including `last`.
    pub fn run_to(&mut self, last: Stage) -> Result<(), CompileError> {
        self.run_to_with(last, &mut |_, _| {})
    }

    /// [`Compilation::run_to`], calling `hook` after every tensor pass and every stage
    /// (a tensor pass's hook runs inside, and is timed with, [`Stage::TensorPasses`]).
    pub fn run_to_with(&mut self, last: Stage, hook: &mut Hook<'_>) -> Result<(), CompileError> {
        while self.done.is_none_or(|d| d < last) {
            let stage = self.done.map_or(Some(Stage::Import), Stage::next);
            let Some(stage) = stage else { break };
            let t = Instant::now();
            self.run_stage(stage, hook)?;
            self.phases.push((stage, t.elapsed()));
            self.done = Some(stage);
            hook(stage.name(), self);
        }
        Ok(())
    }

    /// Runs every remaining stage and returns the result.
    pub fn finish(mut self) -> Result<Compiled, CompileError> {
        self.run_to(Stage::Artifact)?;
        self.into_compiled()
    }

    /// The result of a compilation that ran every stage.
    fn into_compiled(self) -> Result<Compiled, CompileError> {
        let missing = |what: &'static str| CompileError::Pipeline { stage: Stage::Artifact, missing: what };
        Ok(Compiled {
            artifact: self.artifact.ok_or_else(|| missing("artifact"))?,
            weights: self.weights,
            // A CUDA compilation has no CPU code paths to report.
            codegen_paths: self.cpu.as_ref().map(|c| c.paths.clone()).unwrap_or_default(),
            codegen_notes: self
                .cpu
                .map(|c| c.notes)
                .or(self.cuda.map(|c| c.notes))
                .ok_or_else(|| missing("kernels"))?,
            flow: self.flow.ok_or_else(|| missing("flow program"))?,
            plan: self.plan.ok_or_else(|| missing("stream plan"))?,
            program: self.program.ok_or_else(|| missing("program"))?,
            cubin: self.cubin,
            phases: self.phases,
        })
    }

    /// Every CPU level the code is generated for: [`Options::target`], then
    /// [`Options::cpu_variants`].
    fn cpu_targets(&self) -> impl Iterator<Item = CpuTarget> + '_ {
        std::iter::once(self.options.target).chain(self.options.cpu_variants.iter().copied())
    }

    /// The code generator's options for [`Options::size`].
    fn codegen_options(&self) -> kiln_codegen::cpu::Options {
        if self.options.size {
            kiln_codegen::cpu::Options::size()
        } else {
            kiln_codegen::cpu::Options::default()
        }
    }

    fn run_stage(&mut self, stage: Stage, hook: &mut Hook<'_>) -> Result<(), CompileError> {
        let missing = |what: &'static str| CompileError::Pipeline { stage, missing: what };
        match stage {
            Stage::Import => {
                let input = self.input.take().ok_or_else(|| missing("input"))?;
                self.graph = Some(import(input, &self.options.import)?);
            }
            Stage::TensorPasses => {
                let names: Vec<&'static str> = match &self.options.passes {
                    None => kiln_opt::registry().iter().map(|p| p.name()).collect(),
                    Some(names) => {
                        names.iter().map(|n| kiln_opt::find(n).map(|p| p.name())).collect::<Result<_, _>>()?
                    }
                };
                // A QDQ graph's contractions become integer ops only where integer
                // microkernels run them (the CPU at the speed level, with AVX-512 BW/VL
                // or AVX2 + FMA: `cpu::int8_kernels`); elsewhere (the CUDA target,
                // `--opt size`, a CPU level below x86-64-v3) they stay float products
                // with their fast paths, and the pass is passed over.
                // (With several CPU levels: only where every level has them.)
                let mut int8 = self.options.device == TargetDevice::Cpu && !self.options.size;
                for t in self.cpu_targets() {
                    int8 = int8 && kiln_codegen::cpu::int8_kernels(&t, &self.codegen_options())?;
                }
                let quant = kiln_opt::Pass::name(&kiln_opt::quant::FoldQuantizedContractions);
                // The other way round: integer contractions in exact float where the CPU
                // has no integer microkernel (they would run on the general path).
                let float_int = kiln_opt::Pass::name(&kiln_opt::quant::FloatIntegerContractions);
                let float_int_here = self.options.device == TargetDevice::Cpu && !int8;
                for name in names {
                    let g = self.graph.as_mut().ok_or_else(|| missing("tensor graph"))?;
                    if (name != quant || int8) && (name != float_int || float_int_here) {
                        kiln_opt::run_passes(g, &[name])?;
                    }
                    hook(name, self);
                }
            }
            Stage::FormDispatches => {
                let g = self.graph.take().ok_or_else(|| missing("tensor graph"))?;
                let formation = match self.options.device {
                    _ if self.options.size => kiln_lower::Formation::General,
                    TargetDevice::Cpu => kiln_lower::Formation::Microkernels,
                    TargetDevice::Cuda => kiln_lower::Formation::ImplicitGemm,
                };
                // The attention kernel forms on the CPU; on CUDA at half precision where
                // its tensor-core kernel takes the head (it reads the half operands; at
                // f32, or for a head it declines, three kernels are faster), or as
                // `KILN_CUDA_TUNE=attn=` says (docs/cuda.md).
                let half = self.options.precision.storage().is_some();
                let tensor_cores = |k: &kiln_flow::Kernel, a: &kiln_flow::attention::Attention| {
                    kiln_codegen::cuda::flash::declines(k, a).is_none()
                };
                let accept: Option<kiln_flow::attention::Accept<'_>> = match self.options.device {
                    _ if !self.options.fused_attention => None,
                    TargetDevice::Cpu => Some(&kiln_flow::attention::accept_all),
                    TargetDevice::Cuda => {
                        let tune = kiln_codegen::cuda::tune::Tune::from_env().map_err(CodegenError::Setting)?;
                        match (tune.forms_attention(half), tune.attention) {
                            (false, _) => None,
                            // Forced (`attn=on|flash`): every chain, declined heads on the
                            // warp-per-row kernel.
                            (true, Some(_)) => Some(&kiln_flow::attention::accept_all),
                            (true, None) => Some(&tensor_cores),
                        }
                    }
                };
                let flow = kiln_lower::form_with(&g, formation, accept);
                self.graph = Some(g);
                let flow = flow?;
                // Data-dependent extents run on CUDA; bounded input dimensions not yet.
                if let (TargetDevice::Cuda, Some(x)) =
                    (self.options.device, flow.extents.iter().find(|x| x.input.is_some()))
                {
                    return Err(CompileError::BoundedOnCuda { name: x.name.clone() });
                }
                self.flow = Some(flow);
            }
            Stage::NarrowStorage => {
                let flow = self.flow.as_mut().ok_or_else(|| missing("flow program"))?;
                // CUDA's attention kernels read and write half; the CPU's f32.
                let half_attention = self.options.device == TargetDevice::Cuda;
                kiln_flow::precision::narrow_storage_for(flow, self.options.precision, half_attention);
            }
            // A GPU's kernels read constants as they are (no CPU panels).
            Stage::PackWeights if self.options.device == TargetDevice::Cuda => {}
            Stage::PackWeights => {
                // One constant pool for every CPU level: a panel width they all read.
                let packings = self
                    .cpu_targets()
                    .map(|t| kiln_codegen::Packing::new(&t, &self.codegen_options()))
                    .collect::<Result<Vec<_>, _>>()?;
                let flow = self.flow.as_mut().ok_or_else(|| missing("flow program"))?;
                let widths = |k: &kiln_flow::Kernel, class| variants::agreed_widths(&packings, k, class);
                if kiln_flow::layout::pack_constants(flow, &widths) > 0 {
                    flow.remove_dead();
                }
            }
            Stage::Schedule => {
                let flow = self.flow.as_ref().ok_or_else(|| missing("flow program"))?;
                // The instantiation prologue where the runtime runs it once (the CPU
                // runtime; the CUDA graph replays every command).
                let prologue = match self.options.device {
                    TargetDevice::Cpu => stream::Prologue::Hoist,
                    TargetDevice::Cuda => stream::Prologue::Inline,
                };
                self.plan = Some(stream::schedule(flow, prologue)?);
            }
            Stage::Codegen if self.options.device == TargetDevice::Cuda => {
                let flow = self.flow.as_ref().ok_or_else(|| missing("flow program"))?;
                let kernels: Vec<(&kiln_flow::Kernel, KernelClass)> =
                    flow.dispatches.iter().map(|d| (&d.kernel, d.class)).collect();
                let archs = cuda_archs(&self.options.cuda_archs);
                let mut modules = Vec::with_capacity(archs.len());
                for &arch in &archs {
                    let m = kiln_codegen::cuda::compile_for(&kernels, arch).map_err(|e| codegen_error(flow, e))?;
                    modules.push((arch, m));
                }
                let (arch, cuda) = modules.remove(0);
                // The cubin is Hopper's: only the sm_90a module gets one.
                if let (Some(path), CudaTargetArch::Sm90a) = (&self.options.ptxas, arch) {
                    self.cubin = Some(ptxas::assemble(path, &cuda)?);
                }
                self.cuda = Some(cuda);
                self.cuda_arch = arch;
                self.cuda_more = modules;
            }
            Stage::Codegen => {
                let flow = self.flow.as_ref().ok_or_else(|| missing("flow program"))?;
                let cpu = generate_code(flow, &self.options.target, &self.codegen_options());
                let cpu = cpu.map_err(|e| codegen_error(flow, e))?;
                if !self.options.cpu_variants.is_empty() {
                    let kernels: Vec<(&kiln_flow::Kernel, KernelClass)> =
                        flow.dispatches.iter().map(|d| (&d.kernel, d.class)).collect();
                    let tiers =
                        variants::compile_tiers(&kernels, &cpu, &self.options.cpu_variants, &self.codegen_options());
                    self.tiers = tiers.map_err(|e| codegen_error(flow, e))?;
                }
                self.cpu = Some(cpu);
            }
            Stage::Hal => {
                let (Some(flow), Some(plan)) = (&self.flow, &self.plan) else {
                    return Err(missing("flow program or stream plan"));
                };
                let code = match (&self.cpu, &self.cuda) {
                    (Some(cpu), _) => Code {
                        device: DeviceKind::Cpu,
                        executable: &cpu.executable,
                        cpu: Some((cpu, &self.tiers)),
                        cubin: None,
                        cuda_arch: CudaTargetArch::Sm90a,
                        cuda_more: &[],
                        workgroups: cpu.workgroups.clone(),
                        work_ns: cpu.work_ns.clone(),
                        launches: Vec::new(),
                    },
                    (None, Some(cuda)) => Code {
                        device: DeviceKind::Cuda,
                        executable: &cuda.executable,
                        cpu: None,
                        cubin: self.cubin.as_ref().map(|c| &c.executable),
                        cuda_arch: self.cuda_arch,
                        cuda_more: &self.cuda_more,
                        workgroups: cuda.launches.iter().map(|l| l.grid).collect(),
                        work_ns: Vec::new(),
                        launches: launch_records(cuda),
                    },
                    _ => return Err(missing("kernels")),
                };
                let (program, weights) = build_program(flow, plan, &code, &self.options)?;
                self.program = Some(program);
                self.weights = weights;
            }
            Stage::Artifact => {
                let program = self.program.as_ref().ok_or_else(|| missing("program"))?;
                self.artifact = Some(kiln_module::sections::write_program(program));
            }
        }
        Ok(())
    }
}

/// The [`Stage::Codegen`] stage: every dispatch's kernel, compiled for `target`.
fn generate_code(
    flow: &FlowProgram,
    target: &CpuTarget,
    codegen: &kiln_codegen::cpu::Options,
) -> Result<CpuModule, CodegenError> {
    let kernels: Vec<(&kiln_flow::Kernel, KernelClass)> =
        flow.dispatches.iter().map(|d| (&d.kernel, d.class)).collect();
    kiln_codegen::cpu::compile_with(&kernels, target, codegen)
}

/// A code generator's error with the ops of the kernel it names.
fn codegen_error(flow: &FlowProgram, source: CodegenError) -> CompileError {
    let sources = match source.kernel() {
        "" => Vec::new(),
        name => flow.dispatches.iter().find(|d| d.kernel.name == name).map(|d| d.sources.clone()).unwrap_or_default(),
    };
    CompileError::Codegen { source, sources }
}

/// What the code generator of one device made: the executable and, per dispatch, its
/// workgroup count (CPU workgroups, or a CUDA launch's blocks) and estimated time, and
/// for CUDA each entry's launch record (block, dynamic shared memory, parameters).
struct Code<'a> {
    device: DeviceKind,
    executable: &'a kiln_module::program::Executable,
    /// For a CPU: the baseline's module and the higher levels' code.
    cpu: Option<(&'a CpuModule, &'a [variants::Tier])>,
    /// The same kernels as a cubin, preferred over `executable` (CUDA only).
    cubin: Option<&'a kiln_module::program::Executable>,
    /// The architecture `executable` is for (CUDA only).
    cuda_arch: CudaTargetArch,
    /// The same kernels for further architectures, after `executable` and `cubin`
    /// (CUDA only, [`Options::cuda_archs`]).
    cuda_more: &'a [(CudaTargetArch, CudaModule)],
    workgroups: Vec<u64>,
    work_ns: Vec<u64>,
    launches: Vec<kiln_module::program::Launch>,
}

/// The architectures of a CUDA compilation, best first, each once: `asked`
/// ([`Options::cuda_archs`]), or `sm_90a` alone when it names none.
fn cuda_archs(asked: &[CudaTargetArch]) -> Vec<CudaTargetArch> {
    let order = [CudaTargetArch::Sm90a, CudaTargetArch::Sm80];
    let archs: Vec<_> = order.into_iter().filter(|a| asked.contains(a)).collect();
    if archs.is_empty() {
        vec![CudaTargetArch::Sm90a]
    } else {
        archs
    }
}

/// The load-time condition of a variant for `arch`: exactly 9.0 for `sm_90a`'s
/// architecture-specific code, 8.0 or later for `sm_80`'s.
fn cuda_condition(arch: CudaTargetArch) -> Condition {
    Condition::Cuda(match arch {
        CudaTargetArch::Sm90a => CudaArch::SM90A,
        CudaTargetArch::Sm80 => CudaArch::SM80,
    })
}

/// A CUDA module's launch records, one per entry.
fn launch_records(m: &CudaModule) -> Vec<kiln_module::program::Launch> {
    m.launches
        .iter()
        .map(|l| kiln_module::program::Launch { block: l.block, shared: l.shared, params: l.params })
        .collect()
}

/// The [`Stage::Hal`] stage: the program of `flow` under `plan` with `code`, and the constant pool when it is kept outside the artifact.
fn build_program(
    flow: &FlowProgram,
    plan: &stream::StreamPlan,
    code: &Code<'_>,
    opts: &Options,
) -> Result<(Program, Option<Vec<u8>>), CompileError> {
    let mut entry = hal::entry_point(flow, plan, &code.workgroups, &code.work_ns)?;
    if let Some((cpu, [])) = code.cpu {
        // One level of code (variants of several would each need their own split).
        entry.bounded_rows = hal::bounded_rows(flow, &entry, &cpu.digits);
    }
    if opts.strip {
        // The memory map's buffer names are for listings only, like the debug section.
        entry.buffers.iter_mut().for_each(|b| b.name.clear());
    }
    let kernels: Vec<Kernel> = flow
        .dispatches
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let entry = i as u32;
            let variants = match code.cpu {
                // The best CPU level's code first, the baseline's last.
                Some((base, tiers)) => variants::variants_of(i, base, tiers),
                // The cubin (executable 1) first where there is one, then the PTX, both
                // for the first architecture (sm_90a: only a 9.0 device runs them); then
                // each further architecture's PTX, with its own grid where it differs
                // (sm_80 splits no contraction over a cluster's blocks).
                None => {
                    let first =
                        Variant { executable: 0, entry, condition: cuda_condition(code.cuda_arch), workgroups: 0 };
                    let more = code.cuda_more.iter().enumerate().map(|(j, (arch, m))| {
                        let grid = m.launches[i].grid;
                        Variant {
                            executable: (1 + usize::from(code.cubin.is_some()) + j) as u32,
                            entry,
                            condition: cuda_condition(*arch),
                            workgroups: if grid == code.workgroups[i] { 0 } else { grid },
                        }
                    });
                    code.cubin
                        .iter()
                        .map(|_| Variant { executable: 1, ..first.clone() })
                        .chain([first.clone()])
                        .chain(more)
                        .collect()
                }
            };
            Kernel { name: d.kernel.name.clone(), variants, class: Some(d.class) }
        })
        .collect();
    let (constants, weights) = match &opts.external_weights {
        None => (Constants::Embedded(plan.constants.clone()), None),
        Some(file) => (
            Constants::External {
                file: file.clone(),
                size: plan.constants.len() as u64,
                hash: kiln_module::sections::weights_hash(&plan.constants),
            },
            Some(plan.constants.clone()),
        ),
    };
    let debug = (!opts.strip).then(|| DebugInfo {
        kernel_sources: flow.dispatches.iter().map(|d| d.sources.join(" + ")).collect(),
        source: opts.source.clone(),
    });
    let program =
        Program {
            devices: vec![Device {
                kind: code.device,
                name: if code.device == DeviceKind::Cuda { "cuda".into() } else { "cpu".into() },
            }],
            entries: vec![entry],
            kernels,
            executables: std::iter::once(code.executable)
                .chain(code.cubin)
                .map(|x| kiln_module::program::Executable { launches: code.launches.clone(), ..x.clone() })
                .chain(code.cuda_more.iter().map(|(_, m)| kiln_module::program::Executable {
                    launches: launch_records(m),
                    ..m.executable.clone()
                }))
                .chain(code.cpu.into_iter().flat_map(|(_, tiers)| tiers.iter().map(|t| t.module.executable.clone())))
                .collect(),
            constants,
            debug,
        };
    Ok((program, weights))
}

/// Compiles `graph` into a `.kiln` artifact: every stage after [`Stage::Import`].
pub fn compile(graph: &Graph, opts: &Options) -> Result<Compiled, CompileError> {
    Compilation::new(Input::Graph(graph.clone()), opts.clone()).finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_codegen_error_names_the_ops_of_its_kernel() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/filetests/packed-weights.kir");
        let mut c = Compilation::new(Input::File(path), Options::default());
        c.run_to(Stage::Schedule).expect("schedule");
        let flow = c.flow().expect("flow");
        let unsupported = CodegenError::Unsupported { kernel: "k1_0".into(), what: "f8 loads".into() };
        let e = codegen_error(flow, unsupported.clone());
        assert!(
            matches!(&e, CompileError::Codegen { source, sources } if *source == unsupported && sources == &["MatMul fc1", "Relu relu"]),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "code generation: kernel k1_0: f8 loads is not supported by the code generator \
             (the kernel of MatMul fc1 + Relu relu)"
        );
        assert_eq!((e.stage(), e.kind()), (Stage::Codegen, ErrorKind::Unsupported));
        // Not about a kernel of the program: no ops to name.
        let internal = CodegenError::Internal { kernel: String::new(), what: "no ISA".into() };
        let e = codegen_error(flow, internal);
        assert!(matches!(&e, CompileError::Codegen { sources, .. } if sources.is_empty()), "{e:?}");
        assert!(e.is_internal());
    }
}
