//! The CUDA driver (feature `cuda`): a CUDA artifact's plan replayed on an NVIDIA GPU
//! as one CUDA graph per entry point.
//!
//! ```text
//! CudaModule::load(artifact, weights)   the CPU path's verification (container, ABI,
//!                                       sections, plan, weights), every dispatch on a
//!                                       CUDA device; the device's primary context; per
//!                                       kernel the variant that runs — the cubin
//!                                       (features bit CUDA_CUBIN_SM90A) on a compute
//!                                       capability 9.0 device, else, or when the cubin
//!                                       does not load, the PTX — each executable loaded
//!                                       once (cuModuleLoadData); every entry's function;
//!                                       shared memory limits raised above 48 KiB
//! CudaInstance::new(&module)            ONE device allocation (arena, constants, every
//!                                       input and output: `graph::Layout`), zeroed, the
//!                                       constants uploaded once; per entry point the
//!                                       plan as one graph (`graph::nodes`), instantiated
//!                                       and uploaded
//! instance.invoke(&inputs, &mut outs)   checks the arguments as the CPU instance does,
//!                                       then: async copies in, one cuGraphLaunch, async
//!                                       copies out, one stream synchronisation; no
//!                                       allocation, no graph rebuilt
//! instance.invoke_resident(entry)       the graph alone, on data the caller keeps on the
//!                                       device (input_ptr / output_ptr)
//! instance.run_command(entry, c)        one command on the stream (not the graph), for
//!                                       checking kernels one by one (`kiln gpu-check`)
//! ```
//!
//! What is checked where: everything about the artifact at load, as on the CPU (the same
//! verifier: every binding inside its slot, launch records within the device's limits
//! and one parameter per binding); arguments at every call; every driver call's result,
//! as a typed [`RuntimeError`] with the driver's error name. What is not checked: that a
//! kernel touches only its bindings (the code generator's contract, as on the CPU).
//!
//! Without a CUDA driver every entry point returns [`RuntimeError::NoCudaDriver`]
//! (`no CUDA driver: libcuda.so.1 not found`), never a panic: the library and every
//! function kiln calls are looked up before the first call ([`driver::init`]).

pub mod driver;
pub mod graph;
pub(crate) mod hetero;

use crate::error::RuntimeError;
use crate::instance::{InputArg, OutputArg, TensorMut, TensorRef};
use crate::module::{bind_weights, Signature};
use crate::verify::{require_device_kind, Limits};
use crate::Module;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use cudarc::driver::sys::CUfunction;
use driver::{CUdeviceptr, CodeForm};
use graph::{Layout, Node, NodeKind, Step};
use kiln_module::program::{Command, Condition, DeviceKind, Launch, CUDA_CUBIN_SM90A};
use kiln_module::sections::ProgramView;
use std::time::{Duration, Instant};

/// Dynamic shared memory a kernel may use without raising its limit.
const DEFAULT_SHARED: u32 = 48 << 10;

/// The code a module loaded, over all its kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadedForm {
    /// Every kernel from a cubin.
    Cubin,
    /// Every kernel from PTX (compiled by the driver at load).
    Ptx,
    /// Some from each.
    Mixed,
    /// No kernels.
    None,
}

impl LoadedForm {
    /// `cubin`, `ptx`, `mixed` or `none`.
    pub fn name(self) -> &'static str {
        match self {
            LoadedForm::Cubin => "cubin",
            LoadedForm::Ptx => "ptx",
            LoadedForm::Mixed => "mixed",
            LoadedForm::None => "none",
        }
    }
}

/// Whether CUDA can be used here: `Ok` when libcuda is present with every function kiln
/// calls and initialises; otherwise the typed error ([`RuntimeError::NoCudaDriver`]).
pub fn driver_present() -> Result<(), RuntimeError> {
    driver::init()
}

/// One kernel as loaded: its function, launch and the form of its code.
#[derive(Debug, Clone, Copy)]
struct LoadedKernel {
    function: CUfunction,
    launch: Launch,
    /// The variant's own grid (0: the dispatch's workgroups).
    grid: u64,
    form: CodeForm,
    variant: usize,
}

/// A verified CUDA artifact loaded on one device: its code placed, every function
/// resolved. Create [`CudaInstance`]s from it to run it.
pub struct CudaModule<'a> {
    program: ProgramView<'a>,
    pool: &'a [u8],
    limits: Limits,
    main: Option<usize>,
    /// Per kernel of the kernel table (`None`: never dispatched and no CUDA variant).
    kernels: Vec<Option<LoadedKernel>>,
    launches: Vec<Option<Launch>>,
    /// Per kernel, the grid of the variant that runs where it has its own (else 0).
    grids: Vec<u64>,
    load_time: Duration,
    cubin_fallback: Option<String>,
    // Dropped before the context: functions live in these modules.
    _codes: Vec<driver::LoadedCode>,
    ctx: driver::Context,
}

impl core::fmt::Debug for CudaModule<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaModule")
            .field("device", &self.ctx.name)
            .field("kernels", &self.kernels.len())
            .field("form", &self.form())
            .field("load_time", &self.load_time)
            .finish_non_exhaustive()
    }
}

impl Drop for CudaModule<'_> {
    fn drop(&mut self) {
        // Modules unload from the current context: make it ours before the fields go
        // (the code first, then the context). Nothing to do about a failure here.
        let _ = self.ctx.bind();
    }
}

/// How a kernel's variants split on a device of compute capability `cc`: the first
/// cubin one and the first PTX one whose condition the device meets (variants whose
/// executable is for CUDA and asks for no other feature bit), and the conditions of
/// those it does not meet (for the error when nothing is left).
fn cuda_variants(p: &ProgramView<'_>, kernel: usize, cc: (u32, u32)) -> (Option<usize>, Option<usize>, Vec<String>) {
    let (mut cubin, mut ptx, mut unmet) = (None, None, Vec::new());
    for (i, v) in p.kernels[kernel].variants.iter().enumerate() {
        // Verified: the executable exists.
        let Some(x) = p.executables.get(v.executable as usize) else { continue };
        if x.device != DeviceKind::Cuda || x.features & !CUDA_CUBIN_SM90A != 0 {
            continue;
        }
        match v.condition {
            Condition::Always => {}
            Condition::Cuda(arch) if arch.admits(cc.0, cc.1) => {}
            Condition::Cuda(arch) => {
                unmet.push(format!("variant {i} needs {arch}"));
                continue;
            }
            // Refused by the verifier on a CUDA executable.
            Condition::CpuFeatures(_) => continue,
        }
        let slot = if x.features & CUDA_CUBIN_SM90A != 0 { &mut cubin } else { &mut ptx };
        slot.get_or_insert(i);
    }
    (cubin, ptx, unmet)
}

impl<'a> CudaModule<'a> {
    /// Loads `artifact` on device 0 (see [`CudaModule::load_on`]).
    pub fn load(artifact: &'a [u8], weights: Option<&'a [u8]>) -> Result<CudaModule<'a>, RuntimeError> {
        CudaModule::load_on(artifact, weights, 0)
    }

    /// Verifies `artifact` (and `weights`, the external weights file of a module
    /// compiled with weights kept outside) and loads its code on device `ordinal`.
    pub fn load_on(
        artifact: &'a [u8],
        weights: Option<&'a [u8]>,
        ordinal: usize,
    ) -> Result<CudaModule<'a>, RuntimeError> {
        CudaModule::load_as(artifact, weights, ordinal, None)
    }

    /// [`CudaModule::load_on`], choosing each kernel's variant as if the device had
    /// compute capability `capability` where that is below its own (the device's own
    /// where it is not, or with `None`): an artifact with an `sm_80` variant
    /// (`kiln compile --cuda-arch sm_90a,sm_80`) runs its `sm_80` code on a Hopper GPU
    /// with `Some((8, 0))`, which is how that code is tested there.
    pub fn load_as(
        artifact: &'a [u8],
        weights: Option<&'a [u8]>,
        ordinal: usize,
        capability: Option<(u32, u32)>,
    ) -> Result<CudaModule<'a>, RuntimeError> {
        // The driver first: without one nothing else matters, and the answer is the
        // same whatever the artifact.
        driver::init()?;
        let plan = Module::verify_plan(artifact)?;
        let program = plan.program;
        let limits = plan.limits;
        require_device_kind(&program, DeviceKind::Cuda)?;
        if let Some(e) = program.entries.iter().find(|e| !e.bounded.is_empty()) {
            return Err(RuntimeError::CudaPlan {
                entry: e.name.to_string(),
                command: 0,
                problem: crate::error::CudaPlanProblem::Bounded,
            });
        }
        let pool = bind_weights(&program, weights)?;
        CudaModule::load_program(program, pool, limits, ordinal, capability)
    }

    /// Loads the CUDA code of a verified `program` (its kernels dispatched on CUDA
    /// devices need a variant; others load one where they have it) on device `ordinal`:
    /// [`CudaModule::load_as`] after its checks, and a heterogeneous plan's CUDA queue
    /// (`hetero.rs`), whose program the CPU runtime verified.
    pub(crate) fn load_program(
        program: ProgramView<'a>,
        pool: &'a [u8],
        limits: Limits,
        ordinal: usize,
        capability: Option<(u32, u32)>,
    ) -> Result<CudaModule<'a>, RuntimeError> {
        let ctx = driver::Context::new(ordinal)?;
        let mut dispatched = alloc::vec![false; program.kernels.len()];
        for e in &program.entries {
            for c in &e.commands {
                if let Command::Dispatch { kernel, device, .. } = c {
                    // Verified: in range.
                    if program.devices.get(*device as usize).is_some_and(|d| d.kind == DeviceKind::Cuda) {
                        dispatched[*kernel as usize] = true;
                    }
                }
            }
        }
        let start = Instant::now();
        let own = (ctx.capability.0.max(0) as u32, ctx.capability.1.max(0) as u32);
        let cc = capability.map_or(own, |c| c.min(own));
        let want_cubin = cc == (9, 0);
        let mut codes: Vec<driver::LoadedCode> = Vec::new();
        // Per executable: the index of its loaded code, or why it did not load.
        let mut loaded: Vec<Option<Result<usize, RuntimeError>>> = Vec::new();
        loaded.resize_with(program.executables.len(), || None);
        let mut cubin_fallback = None;
        let mut kernels = Vec::with_capacity(program.kernels.len());
        for (ki, &is_dispatched) in dispatched.iter().enumerate() {
            let (cubin, ptx, unmet) = cuda_variants(&program, ki, cc);
            let mut try_variant = |vi: usize, form: CodeForm| -> Result<LoadedKernel, RuntimeError> {
                let v = &program.kernels[ki].variants[vi];
                let xi = v.executable as usize;
                let x = &program.executables[xi];
                let code = match &loaded[xi] {
                    Some(Ok(c)) => *c,
                    Some(Err(e)) => return Err(clone_error(e)),
                    None => {
                        let r = driver::LoadedCode::load(x.code, form, xi).map(|c| {
                            codes.push(c);
                            codes.len() - 1
                        });
                        let again = r.as_ref().map(|c| *c).map_err(clone_error);
                        loaded[xi] = Some(r);
                        again?
                    }
                };
                // Verified: the entry and its launch exist (one launch per entry).
                let (name, _) = x.entries[v.entry as usize];
                let launch = x.launches[v.entry as usize];
                let function = codes[code].function(name, xi)?;
                if launch.shared > DEFAULT_SHARED {
                    // SAFETY: `function` was just resolved in a module loaded in the
                    // current context (bound by `Context::new`).
                    unsafe { driver::set_max_dynamic_shared(function, launch.shared)? };
                }
                Ok(LoadedKernel { function, launch, grid: v.workgroups, form, variant: vi })
            };
            let mut why = Vec::new();
            let mut pick = None;
            if let Some(vi) = cubin {
                if want_cubin {
                    match try_variant(vi, CodeForm::Cubin) {
                        Ok(k) => pick = Some(k),
                        Err(e) => {
                            why.push(format!("cubin: {e}"));
                            cubin_fallback.get_or_insert_with(|| e.to_string());
                        }
                    }
                } else {
                    let (major, minor) = cc;
                    why.push(format!("the cubin is for compute capability 9.0, the device has {major}.{minor}"));
                    cubin_fallback.get_or_insert_with(|| why[0].clone());
                }
            }
            if pick.is_none() {
                if let Some(vi) = ptx {
                    // A PTX load error is the answer: there is nothing left to fall back to.
                    pick = Some(try_variant(vi, CodeForm::Ptx)?);
                } else if is_dispatched {
                    why.push("no PTX variant".to_string());
                    why.extend(unmet);
                    return Err(RuntimeError::NoCudaVariant {
                        kernel: program.kernels[ki].name.to_string(),
                        why: why.join("; "),
                    });
                }
            }
            kernels.push(pick);
        }
        let load_time = start.elapsed();
        let launches = kernels.iter().map(|k| k.map(|k| k.launch)).collect();
        let grids = kernels.iter().map(|k| k.map_or(0, |k| k.grid)).collect();
        let main = program.entries.iter().position(|e| e.name == "main");
        Ok(CudaModule {
            program,
            pool,
            limits,
            main,
            kernels,
            launches,
            grids,
            load_time,
            cubin_fallback,
            _codes: codes,
            ctx,
        })
    }

    /// The decoded, verified artifact.
    pub fn program(&self) -> &ProgramView<'a> {
        &self.program
    }

    /// The entry points' names, inputs and outputs.
    pub fn signature(&self) -> Signature<'_, 'a> {
        Signature::of(&self.program.entries)
    }

    /// The constant pool.
    pub fn constants(&self) -> &[u8] {
        self.pool
    }

    /// The device's name (`NVIDIA H200`).
    pub fn device_name(&self) -> &str {
        &self.ctx.name
    }

    /// The device's compute capability (major, minor).
    pub fn capability(&self) -> (i32, i32) {
        self.ctx.capability
    }

    /// Time spent loading code (module loads, PTX compilation, function lookups).
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// Which form of code runs.
    pub fn form(&self) -> LoadedForm {
        let cubin = self.kernels.iter().flatten().filter(|k| k.form == CodeForm::Cubin).count();
        let ptx = self.kernels.iter().flatten().filter(|k| k.form == CodeForm::Ptx).count();
        match (cubin, ptx) {
            (0, 0) => LoadedForm::None,
            (_, 0) => LoadedForm::Cubin,
            (0, _) => LoadedForm::Ptx,
            _ => LoadedForm::Mixed,
        }
    }

    /// Why a cubin variant was not used, when the artifact has one and PTX runs instead.
    pub fn cubin_fallback(&self) -> Option<&str> {
        self.cubin_fallback.as_deref()
    }

    /// Per kernel, the index of the variant that runs (`None`: not dispatched and no
    /// CUDA variant).
    pub fn variants(&self) -> Vec<Option<usize>> {
        self.kernels.iter().map(|k| k.map(|k| k.variant)).collect()
    }

    /// Per kernel, the launch of the variant that runs.
    pub fn launches(&self) -> &[Option<Launch>] {
        &self.launches
    }
}

/// A copy of an error kept for several kernels of one executable (the driver's errors
/// are plain data).
fn clone_error(e: &RuntimeError) -> RuntimeError {
    match e {
        RuntimeError::CudaModuleLoad { executable, error, log } => {
            RuntimeError::CudaModuleLoad { executable: *executable, error: error.clone(), log: log.clone() }
        }
        RuntimeError::Cuda { call, error } => RuntimeError::Cuda { call, error: error.clone() },
        other => RuntimeError::Cuda { call: "cuModuleLoadData", error: other.to_string() },
    }
}

/// One execution context of a [`CudaModule`]: its device memory, stream and graphs,
/// made once. Invocations on one instance run one at a time.
pub struct CudaInstance<'m> {
    // Dropped first (after `Drop::drop` synchronised the stream): the graphs, then the
    // stream, then the memory they use.
    /// Per entry point its graph (`None`: the plan has no node, e.g. outputs copied
    /// from inputs only; a graph of no nodes is not instantiated).
    /// Per entry point its replay: the steps (`graph::steps`), each graph step with its
    /// instantiated graph (`None`: no node, e.g. outputs copied from inputs only; a graph
    /// of no nodes is not instantiated).
    plans: Vec<Vec<(Step, Option<driver::GraphExec>)>>,
    nodes: Vec<Vec<Node>>,
    /// The dims of each output of the last `invoke` (see [`CudaInstance::output_dims`]).
    output_dims: Vec<Vec<u64>>,
    /// Scratch for the caller's output addresses while an `invoke` compacts them.
    output_addrs: Vec<usize>,
    stream: driver::Stream,
    memory: driver::DeviceMemory,
    base: CUdeviceptr,
    layout: Layout,
    module: &'m CudaModule<'m>,
    graph_time: Duration,
}

impl core::fmt::Debug for CudaInstance<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("CudaInstance")
            .field("module", self.module)
            .field("bytes", &self.memory.bytes)
            .field("nodes", &self.nodes.iter().map(Vec::len).collect::<Vec<_>>())
            .field("graph_time", &self.graph_time)
            .finish_non_exhaustive()
    }
}

impl Drop for CudaInstance<'_> {
    fn drop(&mut self) {
        // Work queued by `launch_resident` may still run: wait for it before the graphs
        // and the memory go. Nothing to do about a failure while dropping.
        if self.module.ctx.bind().is_ok() {
            let _ = self.stream.synchronize();
        }
    }
}

impl<'m> CudaInstance<'m> {
    /// Allocates the device memory, uploads the constants and builds, instantiates and
    /// uploads one graph per entry point.
    pub fn new(module: &'m CudaModule<'m>) -> Result<CudaInstance<'m>, RuntimeError> {
        module.ctx.bind()?;
        let p = &module.program;
        let sizes: Vec<(Vec<u64>, Vec<u64>)> = p
            .entries
            .iter()
            .map(|e| (e.inputs.iter().map(|t| t.bytes).collect(), e.outputs.iter().map(|t| t.bytes).collect()))
            .collect();
        let l = module.limits;
        let layout = Layout::new(l.arena_size, l.arena_align, module.pool.len() as u64, &sizes)
            .ok_or(RuntimeError::ArenaAlloc { bytes: u64::MAX })?;
        // cuMemAlloc aligns to 256 bytes; a larger arena alignment takes the slack.
        let slack = layout.align - graph::REGION_ALIGN;
        let total = layout.size.checked_add(slack).ok_or(RuntimeError::ArenaAlloc { bytes: u64::MAX })?;
        let memory = driver::DeviceMemory::zeroed(total)?;
        let base = memory.ptr().div_ceil(layout.align) * layout.align;
        // SAFETY: the constants region lies inside the allocation (the layout's size
        // counts it, and the base is at most `slack` bytes into the allocation).
        unsafe { driver::copy_to_device(base + layout.constants, module.pool)? };
        let stream = driver::Stream::new()?;
        let start = Instant::now();
        let mut nodes = Vec::with_capacity(p.entries.len());
        let mut plans = Vec::with_capacity(p.entries.len());
        for (i, e) in p.entries.iter().enumerate() {
            let n = graph::nodes(e, i, &layout, &module.launches, &module.grids)?;
            let mut plan = Vec::new();
            for step in graph::steps(&e.commands) {
                let exec = match &step {
                    Step::Graph(range) => {
                        let sub = graph::step_nodes(&n, range);
                        if sub.is_empty() {
                            None
                        } else {
                            Some(build_graph(module, &sub, base)?.instantiate(&stream)?)
                        }
                    }
                    Step::Skip(_) => None,
                };
                plan.push((step, exec));
            }
            plans.push(plan);
            nodes.push(n);
        }
        let graph_time = start.elapsed();
        let outputs = p.entries.iter().map(|e| e.outputs.len()).max().unwrap_or(0);
        let rank = p.entries.iter().flat_map(|e| e.outputs.iter().map(|t| t.dims.len())).max().unwrap_or(0);
        let output_dims = (0..outputs).map(|_| Vec::with_capacity(rank)).collect();
        let output_addrs = Vec::with_capacity(outputs);
        Ok(CudaInstance { plans, nodes, output_dims, output_addrs, stream, memory, base, layout, module, graph_time })
    }

    /// The module this instance runs.
    pub fn module(&self) -> &'m CudaModule<'m> {
        self.module
    }

    /// Time spent building, instantiating and uploading the graphs.
    pub fn graph_time(&self) -> Duration {
        self.graph_time
    }

    /// The nodes of entry point `entry`'s graph.
    pub fn nodes(&self, entry: usize) -> Option<&[Node]> {
        self.nodes.get(entry).map(Vec::as_slice)
    }

    /// Runs entry point `main`: `inputs` and `outputs` in signature order, each exactly
    /// its tensor's byte size.
    pub fn invoke(&mut self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), RuntimeError> {
        let main = self.module.main.ok_or_else(|| RuntimeError::NoSuchEntry { entry: "main".to_string() })?;
        self.run(main, inputs, outputs)
    }

    /// Runs entry point `entry` (an index into [`CudaModule::signature`]).
    pub fn invoke_entry(
        &mut self,
        entry: usize,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), RuntimeError> {
        self.run(entry, inputs, outputs)
    }

    /// Runs entry point `entry` with typed tensors: dtypes and shapes are checked too.
    pub fn invoke_tensors(
        &mut self,
        entry: usize,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), RuntimeError> {
        self.run(entry, inputs, outputs)
    }

    /// Checks the argument counts of entry `index` and returns its plan.
    fn entry_checked(
        &self,
        index: usize,
        inputs: usize,
        outputs: Option<usize>,
    ) -> Result<&'m kiln_module::sections::EntryView<'m>, RuntimeError> {
        let entries = &self.module.program.entries;
        let entry = entries.get(index).ok_or_else(|| RuntimeError::NoSuchEntry { entry: format!("#{index}") })?;
        if inputs != entry.inputs.len() {
            return Err(RuntimeError::InputCount {
                entry: entry.name.to_string(),
                expected: entry.inputs.len(),
                got: inputs,
            });
        }
        if let Some(outputs) = outputs {
            if outputs != entry.outputs.len() {
                return Err(RuntimeError::OutputCount {
                    entry: entry.name.to_string(),
                    expected: entry.outputs.len(),
                    got: outputs,
                });
            }
        }
        Ok(entry)
    }

    fn run<I: InputArg, O: OutputArg>(
        &mut self,
        index: usize,
        inputs: &[I],
        outputs: &mut [O],
    ) -> Result<(), RuntimeError> {
        let entry = self.entry_checked(index, inputs.len(), Some(outputs.len()))?;
        // Every argument is checked before anything is queued.
        for (arg, t) in inputs.iter().zip(&entry.inputs) {
            arg.checked_ptr(t)?;
        }
        for (arg, t) in outputs.iter_mut().zip(&entry.outputs) {
            arg.checked_ptr(t)?;
        }
        self.module.ctx.bind()?;
        let queued = self.queue(index, inputs, outputs);
        // Whatever was queued reads or writes the caller's buffers: wait for it before
        // they are handed back, also when queuing failed half-way.
        let synced = self.stream.synchronize();
        queued.and(synced)?;
        let entry = &self.module.program.entries[index];
        if entry.extents.is_empty() {
            // The dims are the signature's.
            return self.finish_extents(index, None);
        }
        // The caller's output addresses (capacity reserved at instantiation).
        let mut at = core::mem::take(&mut self.output_addrs);
        at.clear();
        for (arg, t) in outputs.iter_mut().zip(&entry.outputs) {
            at.push(arg.checked_ptr(t)? as usize);
        }
        let done = self.finish_extents(index, Some(&at));
        self.output_addrs = at;
        done
    }

    /// The data-dependent extents of entry `index` (format 1.5), after a completed
    /// replay: each read from the device and checked against its bound, the actual dims
    /// into `output_dims`, and the host `outputs` (where given) compacted as on the CPU.
    fn finish_extents(&mut self, index: usize, outputs: Option<&[usize]>) -> Result<(), RuntimeError> {
        let entry = &self.module.program.entries[index];
        let (stream, base, layout) = (&self.stream, self.base, &self.layout);
        let mut failed = Ok(());
        let read = |x: &kiln_module::sections::ExtentView<'_>| {
            let mut b = [0u8; 8];
            // SAFETY: the extent's 8 bytes lie inside the arena (verified); `b` lives
            // until the synchronisation below.
            let r = unsafe { stream.download(b.as_mut_ptr(), base + layout.offset(index, &x.binding), 8) }
                .and_then(|()| stream.synchronize());
            if let Err(e) = r {
                failed = Err(e);
            }
            i64::from_le_bytes(b)
        };
        let at = |o: usize| outputs.map(|a| a[o] as *mut u8);
        // SAFETY: `outputs` (when given) are the addresses of the caller's checked output
        // buffers, whose copies from the device have completed.
        let applied = unsafe { crate::instance::apply_extents(entry, read, at, &mut self.output_dims) };
        failed.and(applied)
    }

    /// The dims of output `k` of the last `invoke` or `invoke_resident`: its signature's,
    /// except along an axis a data-dependent extent sizes (format 1.5), where the extent
    /// the data needed. `invoke` compacts such an output to these dims at the front of
    /// the caller's buffer, as the CPU runtime does; `invoke_resident` leaves the device
    /// buffer at the bound's layout (rows `bound` apart along the axis). Empty before the
    /// first invocation; `None` past the outputs.
    pub fn output_dims(&self, k: usize) -> Option<&[u64]> {
        self.output_dims.get(k).map(|d| d.as_slice())
    }

    /// Replays entry `index`'s plan on the stream: each graph step launched, each
    /// `SkipIf` decided on the host from its condition's bytes, copied once everything
    /// queued before it has completed (the one synchronisation per conditional command).
    fn replay(&self, index: usize) -> Result<(), RuntimeError> {
        let entry = &self.module.program.entries[index];
        let plan = &self.plans[index];
        let mut k = 0;
        while let Some((step, exec)) = plan.get(k) {
            match step {
                Step::Graph(_) => {
                    if let Some(g) = exec {
                        g.launch(&self.stream)?;
                    }
                    k += 1;
                }
                Step::Skip(at) => {
                    let Some(Command::SkipIf { cond, value, count }) = entry.commands.get(*at) else {
                        // `steps` makes a skip step of `SkipIf` commands only.
                        return Err(RuntimeError::NoSuchEntry { entry: entry.name.to_string() });
                    };
                    let mut b = [0u8; 8];
                    // (Verified: 1 to 8 bytes.)
                    let len = (cond.length as usize).min(b.len());
                    // SAFETY: the condition lies inside the instance's allocation
                    // (verified); `b` lives until the synchronisation below.
                    unsafe { self.stream.download(b.as_mut_ptr(), self.base + self.layout.offset(index, cond), len)? };
                    self.stream.synchronize()?;
                    let holds = b[..len].iter().any(|&x| x != 0);
                    let next = at + 1 + if holds == *value { *count as usize } else { 0 };
                    // Every place a skip lands starts a step (`graph::steps`).
                    k = plan.partition_point(|(s, _)| s.start() < next);
                }
            }
        }
        Ok(())
    }

    /// Queues the copies in, the graph, and the copies out.
    fn queue<I: InputArg, O: OutputArg>(
        &self,
        index: usize,
        inputs: &[I],
        outputs: &mut [O],
    ) -> Result<(), RuntimeError> {
        let entry = &self.module.program.entries[index];
        for (i, (arg, t)) in inputs.iter().zip(&entry.inputs).enumerate() {
            let src = arg.checked_ptr(t)?;
            // SAFETY: `src` is readable for the tensor's bytes (checked), and stays
            // borrowed until `run` synchronises; the input region holds exactly them.
            unsafe { self.stream.upload(self.base + self.layout.inputs[index][i], src, t.bytes as usize)? };
        }
        self.replay(index)?;
        for (i, (arg, t)) in outputs.iter_mut().zip(&entry.outputs).enumerate() {
            let dst = arg.checked_ptr(t)?;
            // SAFETY: `dst` is writable for the tensor's bytes (checked) and stays
            // mutably borrowed until `run` synchronises; the output region holds them.
            unsafe { self.stream.download(dst, self.base + self.layout.outputs[index][i], t.bytes as usize)? };
        }
        Ok(())
    }

    /// The device address of input `i` of entry point `entry` (its tensor's bytes), for
    /// callers that keep data on the device.
    pub fn input_ptr(&self, entry: usize, i: usize) -> Option<CUdeviceptr> {
        Some(self.base + *self.layout.inputs.get(entry)?.get(i)?)
    }

    /// The device address of output `i` of entry point `entry`.
    pub fn output_ptr(&self, entry: usize, i: usize) -> Option<CUdeviceptr> {
        Some(self.base + *self.layout.outputs.get(entry)?.get(i)?)
    }

    /// Runs entry point `entry`'s graph on what its input buffers hold and waits for it:
    /// one launch and one synchronisation, no copies.
    pub fn invoke_resident(&mut self, entry: usize) -> Result<(), RuntimeError> {
        self.launch_resident(entry)?;
        self.synchronize()?;
        // The extents checked and the dims reported; the device outputs stay at the
        // bound's layout (see `output_dims`).
        self.finish_extents(entry, None)
    }

    /// Queues entry point `entry`'s graphs without waiting ([`CudaInstance::synchronize`]
    /// waits). The next call that copies or launches on this instance queues behind it.
    /// A plan with a conditional command (a run-time `If`) waits at each one for what
    /// was queued before it (its condition is read on the host). Data-dependent extents
    /// are checked by `invoke_resident`, not here.
    pub fn launch_resident(&mut self, entry: usize) -> Result<(), RuntimeError> {
        if entry >= self.plans.len() {
            return Err(RuntimeError::NoSuchEntry { entry: format!("#{entry}") });
        }
        self.module.ctx.bind()?;
        self.replay(entry)
    }

    /// Waits for everything queued on this instance.
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        self.module.ctx.bind()?;
        self.stream.synchronize()
    }

    /// Copies `inputs` into entry point `entry`'s input buffers and waits (for
    /// [`CudaInstance::run_command`]).
    pub fn write_inputs(&mut self, entry: usize, inputs: &[&[u8]]) -> Result<(), RuntimeError> {
        let e = self.entry_checked(entry, inputs.len(), None)?;
        for (arg, t) in inputs.iter().zip(&e.inputs) {
            arg.checked_ptr(t)?;
        }
        self.module.ctx.bind()?;
        let mut queued = Ok(());
        for (i, (arg, t)) in inputs.iter().zip(&e.inputs).enumerate() {
            // SAFETY: checked above: the argument holds the tensor's bytes, borrowed
            // until the synchronisation below.
            queued =
                unsafe { self.stream.upload(self.base + self.layout.inputs[entry][i], arg.as_ptr(), t.bytes as usize) };
            if queued.is_err() {
                break;
            }
        }
        let synced = self.stream.synchronize();
        queued.and(synced)
    }

    /// Runs command `command` of entry point `entry` on its own, on the stream (not the
    /// graph), and waits: every node the graph has for it, in order. Commands run this
    /// way in plan order compute what the graph computes.
    pub fn run_command(&mut self, entry: usize, command: usize) -> Result<(), RuntimeError> {
        let nodes = self.nodes.get(entry).ok_or_else(|| RuntimeError::NoSuchEntry { entry: format!("#{entry}") })?;
        self.module.ctx.bind()?;
        let mut queued = Ok(());
        for n in nodes.iter().filter(|n| n.command == command) {
            // SAFETY: the node comes from the verified plan under this instance's
            // layout: every address lies inside the instance's allocation.
            queued = unsafe { run_node(self.module, &self.stream, n, self.base) };
            if queued.is_err() {
                break;
            }
        }
        let synced = self.stream.synchronize();
        queued.and(synced)
    }

    /// The bytes binding `binding` of command `command` of entry point `entry` holds now
    /// (a dispatch's bindings in order; a copy's source then destination; a fill's
    /// destination).
    pub fn read_binding(&self, entry: usize, command: usize, binding: usize) -> Result<Vec<u8>, RuntimeError> {
        let e = self
            .module
            .program
            .entries
            .get(entry)
            .ok_or_else(|| RuntimeError::NoSuchEntry { entry: format!("#{entry}") })?;
        let none = || RuntimeError::NoSuchBinding { entry: e.name.to_string(), command, binding };
        let b = match e.commands.get(command).ok_or_else(none)? {
            Command::Dispatch { bindings, .. } => bindings.get(binding),
            Command::Copy { src, dst } => [src, dst].get(binding).copied(),
            Command::Fill { dst, .. } => (binding == 0).then_some(dst),
            Command::AllReduce { parts, .. } | Command::AllGather { parts, .. } => {
                parts.get(binding / 2).map(|p| if binding.is_multiple_of(2) { &p.src } else { &p.dst })
            }
            Command::SkipIf { cond, .. } => (binding == 0).then_some(cond),
            Command::Transfer { src, dst, .. } => [src, dst].get(binding).copied(),
            Command::Barrier | Command::Segment { .. } => None,
        }
        .ok_or_else(none)?;
        let mut out = alloc::vec![0u8; b.length as usize];
        self.module.ctx.bind()?;
        // SAFETY: the binding is the verified plan's: inside its slot's region of the
        // allocation; `out` is ours, written only by this copy until the sync below.
        let queued =
            unsafe { self.stream.download(out.as_mut_ptr(), self.base + self.layout.offset(entry, b), out.len()) };
        let synced = self.stream.synchronize();
        queued.and(synced)?;
        Ok(out)
    }
}

/// Adds `nodes` to a new graph, their addresses relative to `base`.
pub(crate) fn build_graph(
    module: &CudaModule<'_>,
    nodes: &[Node],
    base: CUdeviceptr,
) -> Result<driver::Graph, RuntimeError> {
    let g = driver::Graph::new()?;
    let mut handles = Vec::with_capacity(nodes.len());
    let mut deps = Vec::new();
    let mut params = Vec::new();
    for n in nodes {
        deps.clear();
        // Dependencies are always earlier nodes (`graph::nodes`).
        deps.extend(n.deps.iter().map(|&d| handles[d]));
        let h = match &n.kind {
            NodeKind::Kernel { kernel, grid, block, shared, params: offsets } => {
                let k = kernel_of(module, *kernel)?;
                params.clear();
                params.extend(offsets.iter().map(|o| base + o));
                // SAFETY: the function takes one `.u64` per binding (verified: the launch
                // record's parameter count is the dispatch's binding count) and every
                // address lies inside the instance's allocation (the verified plan
                // under its layout).
                unsafe { g.kernel(&deps, k, *grid, *block, *shared, &params)? }
            }
            // SAFETY: both ranges lie inside the instance's allocation (verified plan).
            NodeKind::Copy { src, dst, bytes } => unsafe {
                g.copy(&deps, &module.ctx, base + dst, base + src, *bytes as usize)?
            },
            // SAFETY: the rows lie inside the destination range of a verified fill,
            // aligned to their element width (`graph::fill_memsets`).
            NodeKind::Memset(m) => unsafe {
                g.memset(
                    &deps,
                    &module.ctx,
                    base + m.dst,
                    m.element,
                    m.value,
                    m.width as usize,
                    m.height as usize,
                    m.pitch as usize,
                )?
            },
        };
        handles.push(h);
    }
    Ok(g)
}

/// The function that runs kernel `kernel`.
fn kernel_of(module: &CudaModule<'_>, kernel: u32) -> Result<CUfunction, RuntimeError> {
    match module.kernels.get(kernel as usize).copied().flatten() {
        Some(k) => Ok(k.function),
        // `load` refuses a dispatched kernel without a variant; kept as an error anyway.
        None => Err(RuntimeError::NoCudaVariant {
            kernel: module.program.kernels.get(kernel as usize).map_or("?", |k| k.name).to_string(),
            why: "not loaded".to_string(),
        }),
    }
}

/// Queues one node on `stream`.
///
/// # Safety
/// The node's addresses, relative to `base`, lie inside a live allocation.
unsafe fn run_node(
    module: &CudaModule<'_>,
    stream: &driver::Stream,
    n: &Node,
    base: CUdeviceptr,
) -> Result<(), RuntimeError> {
    match &n.kind {
        NodeKind::Kernel { kernel, grid, block, shared, params } => {
            let f = kernel_of(module, *kernel)?;
            let addresses: Vec<CUdeviceptr> = params.iter().map(|o| base + o).collect();
            // SAFETY: as for the graph's kernel node (see `build_graph`).
            unsafe { stream.launch(f, *grid, *block, *shared, &addresses) }
        }
        // SAFETY: the caller vouches for the ranges.
        NodeKind::Copy { src, dst, bytes } => unsafe { stream.copy(base + dst, base + src, *bytes as usize) },
        // SAFETY: the caller vouches for the rows, aligned to their width.
        NodeKind::Memset(m) => unsafe {
            stream.memset(base + m.dst, m.element, m.value, m.width as usize, m.height as usize, m.pitch as usize)
        },
    }
}
