//! The compile pipeline of kiln, level by level:
//!
//! ```text
//! tensor graph ──tensor passes (kiln-opt)──► tensor graph
//!   ──lowering + fusion (kiln-flow)──► flow program: dispatches on buffers
//!   ──stream::schedule──► waves, lifetimes, arena plan, constant pool
//!   ──codegen (kiln-codegen)──► one executable per target
//!   ──hal::entry_point──► static command list
//!   ──kiln_module::sections──► .kiln bytes (+ external weights)
//! ```
//!
//! [`compile`] runs it all and keeps every level's result in [`Compiled`]; each has a
//! text form (`kiln compile --to tensor|flow|stream|hal`): kiln-ir's text, the flow
//! program's `Display`, [`stream::print`], and the artifact listing.
#![deny(missing_docs)]

pub mod hal;
pub mod stream;

use std::time::{Duration, Instant};

use kiln_flow::program::FlowProgram;
use kiln_ir::Graph;
use kiln_module::program::{Constants, DebugInfo, Device, DeviceKind, Kernel, Program, Variant};

pub use kiln_codegen::cpu::CpuTarget;

/// Options of [`compile`].
#[derive(Debug, Clone)]
pub struct Options {
    /// CPU the code is generated for.
    pub target: CpuTarget,
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
}

impl Default for Options {
    fn default() -> Options {
        Options {
            target: CpuTarget::Host,
            external_weights: None,
            strip: false,
            passes: None,
            source: String::new(),
            size: false,
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
    /// Wall time of each phase.
    pub phases: Vec<(&'static str, Duration)>,
    /// Per dispatch, how its code was generated (microkernel or general, and why).
    pub codegen_notes: Vec<String>,
}

/// Why a compile failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CompileError {
    /// A tensor pass failed.
    #[error("tensor passes: {0}")]
    Passes(String),
    /// An op could not be lowered to kernels.
    #[error(transparent)]
    Flow(#[from] kiln_flow::program::FlowError),
    /// Scheduling failed.
    #[error(transparent)]
    Stream(#[from] stream::StreamError),
    /// Code generation failed.
    #[error("code generation: {0}")]
    Codegen(String),
    /// Building the command list failed (a compiler bug).
    #[error("command list: {0}")]
    Hal(String),
}

impl CompileError {
    /// Whether the compile failed only because an operand needed at compile time (axes,
    /// a shape) is a run-time value: binding graph inputs to values resolves it.
    pub fn needs_constant_operand(&self) -> bool {
        matches!(self, CompileError::Flow(f) if f.needs_constant_operand())
    }
}

/// Runs the tensor passes on a copy of `graph`.
pub fn tensor_passes(graph: &Graph, opts: &Options) -> Result<Graph, CompileError> {
    let mut g = graph.clone();
    match &opts.passes {
        None => kiln_opt::run_tensor_pipeline(&mut g),
        Some(names) => {
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            kiln_opt::run_passes(&mut g, &names)
        }
    }
    .map_err(|e| CompileError::Passes(e.to_string()))?;
    Ok(g)
}

/// The artifact's record of a flow kernel class.
fn artifact_class(c: kiln_flow::class::KernelClass) -> kiln_module::program::KernelClass {
    use kiln_flow::class::KernelClass as F;
    use kiln_module::program::KernelClass as M;
    match c {
        F::Contraction => M::Contraction,
        F::Window => M::Window,
        F::Rows => M::Rows,
        F::Movement => M::Movement,
        F::Elementwise => M::Elementwise,
        F::General => M::General,
    }
}

/// Compiles `graph` into a `.kiln` artifact.
pub fn compile(graph: &Graph, opts: &Options) -> Result<Compiled, CompileError> {
    let mut phases = Vec::new();
    let t = Instant::now();
    let g = tensor_passes(graph, opts)?;
    phases.push(("tensor passes", t.elapsed()));
    let t = Instant::now();
    let mut flow = kiln_flow::program::form_with(&g, !opts.size)?;
    phases.push(("dispatch formation", t.elapsed()));
    let codegen = if opts.size { kiln_codegen::cpu::Options::size() } else { kiln_codegen::cpu::Options::default() };
    let t = Instant::now();
    let packing = kiln_codegen::Packing::new(&opts.target, &codegen).map_err(|e| CompileError::Codegen(e.to_string()))?;
    if kiln_flow::layout::pack_constants(&mut flow, &|k, class| packing.widths(k, class)) > 0 {
        flow.remove_dead();
    }
    phases.push(("weight packing", t.elapsed()));
    let t = Instant::now();
    let plan = stream::schedule(&flow)?;
    phases.push(("schedule", t.elapsed()));
    let t = Instant::now();
    let kernels: Vec<(&kiln_flow::Kernel, kiln_flow::class::KernelClass)> =
        flow.dispatches.iter().map(|d| (&d.kernel, d.class)).collect();
    let cpu = kiln_codegen::cpu::compile_with(&kernels, &opts.target, &codegen)
        .map_err(|e| CompileError::Codegen(e.to_string()))?;
    phases.push(("codegen", t.elapsed()));
    let t = Instant::now();
    let codegen_notes = cpu.notes.clone();
    let mut entry = hal::entry_point(&flow, &plan, &cpu.workgroups, &cpu.work_ns).map_err(CompileError::Hal)?;
    if opts.strip {
        // The memory map's buffer names are for listings only, like the debug section.
        entry.buffers.iter_mut().for_each(|b| b.name.clear());
    }
    let kernels_table: Vec<Kernel> = flow
        .dispatches
        .iter()
        .enumerate()
        .map(|(i, d)| Kernel {
            name: d.kernel.name.clone(),
            variants: vec![Variant { executable: 0, entry: i as u32, features: 0 }],
            class: artifact_class(d.class),
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
    let program = Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![entry],
        kernels: kernels_table,
        executables: vec![cpu.executable],
        constants,
        debug,
    };
    let artifact = kiln_module::sections::write_program(&program);
    phases.push(("artifact", t.elapsed()));
    Ok(Compiled { artifact, weights, flow, plan, program, phases, codegen_notes })
}
