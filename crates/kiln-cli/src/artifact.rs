//! `kiln compile`, `kiln run` and `kiln inspect`: the compile pipeline and the
//! runtime behind the command line.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_compiler::ptxas::{self, CubinMode};
use kiln_compiler::{Compilation, CpuTarget, Input, Level, Options, Stage, TargetDevice};
use kiln_import::ImportOptions;
use kiln_ir::{npy, DType, Shape, Tensor, TensorType};
use kiln_module::program::{
    Binding, Command, Condition, CpuFeature, DeviceKind, Executable, KernelClass, Program, Slot, Variant,
    CUDA_CUBIN_SM90A,
};
use kiln_module::sections::ConstantsView;
use kiln_runtime::fs::AlignedBytes;
use kiln_runtime::Instance;

use crate::args::Emit;
use crate::{file_stem, random_tensor, summary, write_stdout, SplitMix};

/// Options shared by compile, run, inspect and bench (built from the command line's
/// per-command arguments, [`crate::args`]).
#[derive(Default)]
pub(crate) struct Args {
    pub model: Option<PathBuf>,
    pub output: Option<PathBuf>,
    pub import: ImportOptions,
    pub external_weights: Option<PathBuf>,
    pub weights: Option<PathBuf>,
    pub strip: bool,
    pub to: Option<String>,
    pub dump_after: Vec<String>,
    pub target: Option<String>,
    /// `--target-triple`: the CPU architecture.
    pub triple: Option<String>,
    pub device: Option<String>,
    pub inputs: Vec<(String, PathBuf)>,
    /// `--extent NAME=N`: a random input's extent along its bounded dimension.
    pub extents: Vec<(String, usize)>,
    pub output_dir: Option<PathBuf>,
    pub seed: u64,
    pub json: bool,
    pub dispatch_graph: bool,
    pub list_passes: bool,
    pub timings: bool,
    pub threads: Option<usize>,
    pub warmup: Option<usize>,
    pub iterations: Option<usize>,
    pub size: bool,
    pub precision: kiln_compiler::Precision,
    pub fused_attention: bool,
    pub profile: bool,
    pub samples: Option<PathBuf>,
    pub floor: bool,
    pub floor_passes: Option<usize>,
    pub emit: Emit,
    pub symbol: Option<String>,
    /// `--cubin`: whether a CUDA compilation ships a cubin.
    pub cubin: CubinMode,
    /// `--cuda-arch`: the GPU architectures of a CUDA compilation (empty: sm_90a).
    pub cuda_archs: Vec<kiln_compiler::CudaTargetArch>,
    /// `run`/`bench --device`: where the artifact runs.
    pub run_on: RunDevice,
    /// `bench --resident`: time the graph alone, on data kept on the device.
    pub resident: bool,
    /// `compile --devices N`: shard the plan over N devices.
    pub devices: Option<u32>,
    /// `compile --devices KINDS` (`cpu,cuda`): a heterogeneous plan.
    pub hetero: Option<String>,
    /// `compile --place OP=DEVICE`: placement rules of a heterogeneous plan.
    pub place: Vec<String>,
}

/// Where `run` and `bench` run an artifact (`--device`).
#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum RunDevice {
    /// The host CPU (the default).
    #[default]
    Cpu,
    /// An NVIDIA GPU through the CUDA driver (`kiln_runtime::cuda`).
    Cuda,
}

/// Threads `run` and `bench` use: `--threads`, else one per core the system offers.
/// More threads than cores only contend for them: that is worth a warning on stderr.
fn threads(a: &Args) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match a.threads {
        Some(n) if n > cores => {
            eprintln!(
                "warning: --threads {n} is more than the {cores} core{} this machine offers; the threads will contend for them",
                if cores == 1 { "" } else { "s" }
            );
            n
        }
        Some(n) => n,
        None => cores,
    }
}

/// `--target-cpu`: one CPU, or a comma-separated list of x86-64 levels whose code the
/// artifact carries as variants (the lowest is the baseline every kernel has; the
/// runtime takes the best the host has). Returns the lowest level and the higher ones,
/// ascending.
fn target(a: &Args) -> Result<(CpuTarget, Vec<CpuTarget>), String> {
    if let Some(triple) = a.triple.as_deref() {
        let t = CpuTarget::from_triple(triple, CpuTarget::Host).ok_or_else(|| {
            format!("--target-triple `{triple}`: expected x86_64-…, aarch64-… or riscv64gc-… (e.g. aarch64-unknown-linux-gnu)")
        })?;
        if t != CpuTarget::Host {
            if let Some(cpu) = a.target.as_deref() {
                return Err(format!("--target-cpu `{cpu}` names x86-64 levels; `{triple}` is not x86-64"));
            }
            if a.device.as_deref().is_some_and(|d| d != "cpu") {
                return Err(format!(
                    "--target-triple `{triple}` is a CPU's; it does not combine with --target {}",
                    a.device.as_deref().unwrap_or_default()
                ));
            }
            return Ok((t, Vec::new()));
        }
        if !cfg!(target_arch = "x86_64") && a.target.is_none() {
            return Err(format!(
                "--target-triple `{triple}` on a host that is not x86-64: name the level with --target-cpu"
            ));
        }
    }
    let one = |t: &str| {
        match t {
        "host" => Ok(CpuTarget::Host),
        "x86-64" => Ok(CpuTarget::X86_64),
        "x86-64-v2" => Ok(CpuTarget::X86_64V2),
        "x86-64-v3" => Ok(CpuTarget::X86_64V3),
        "x86-64-v4" => Ok(CpuTarget::X86_64V4),
        t => Err(format!("--target-cpu `{t}`: expected host, x86-64, x86-64-v2, x86-64-v3 or x86-64-v4, or a comma-separated list of levels")),
    }
    };
    let Some(list) = a.target.as_deref() else { return Ok((CpuTarget::Host, Vec::new())) };
    let mut levels = list.split(',').map(|t| one(t.trim())).collect::<Result<Vec<_>, _>>()?;
    if levels.len() > 1 && levels.contains(&CpuTarget::Host) {
        return Err(format!(
            "--target-cpu `{list}`: `host` cannot be one of several variants (name the levels, e.g. x86-64-v3,x86-64-v4)"
        ));
    }
    levels.sort_by_key(|&t| kiln_compiler::variants::level(t));
    levels.dedup();
    let base = levels.remove(0);
    Ok((base, levels))
}

/// `--target`: the device the kernels run on.
fn device(a: &Args) -> Result<TargetDevice, String> {
    match a.device.as_deref() {
        None | Some("cpu") => Ok(TargetDevice::Cpu),
        Some("cuda") => Ok(TargetDevice::Cuda),
        Some(t) => Err(format!("--target `{t}`: expected cpu or cuda")),
    }
}

fn is_artifact(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "kiln")
}

/// The compile options in `a` for `model` (ONNX or .kir).
pub(crate) fn options(a: &Args, model: &Path) -> Result<Options, String> {
    if a.cubin != CubinMode::Auto && device(a)? != TargetDevice::Cuda {
        return Err("--cubin applies to the CUDA target: give --target cuda".into());
    }
    if !a.cuda_archs.is_empty() && device(a)? != TargetDevice::Cuda {
        return Err("--cuda-arch applies to the CUDA target: give --target cuda".into());
    }
    options_with(a, model, a.cubin)
}

/// [`options`] with `cubin` for `--cubin`: a CUDA compilation gets the `ptxas` it
/// finds ([`ptxas::find`]).
fn options_with(a: &Args, model: &Path, cubin: CubinMode) -> Result<Options, String> {
    let device = device(a)?;
    let ptxas = match device {
        TargetDevice::Cuda => ptxas::find(cubin).map_err(|e| format!("--cubin: {e}"))?,
        TargetDevice::Cpu => None,
    };
    let (target, cpu_variants) = target(a)?;
    Ok(Options {
        target,
        cpu_variants,
        device,
        ptxas,
        external_weights: a
            .external_weights
            .as_ref()
            .map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        strip: a.strip,
        size: a.size,
        passes: None,
        source: model.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        import: a.import.clone(),
        precision: a.precision,
        fused_attention: a.fused_attention,
        cuda_archs: a.cuda_archs.clone(),
    })
}

/// A compile error as one line: import errors name the file themselves, later ones
/// get the model's path in front.
fn compile_error(model: &Path, e: &kiln_compiler::CompileError) -> String {
    match e.stage() {
        Stage::Import => e.to_string(),
        _ => format!("{}: {e}", model.display()),
    }
}

/// Compiles the model named in `a` (ONNX or .kir) with the options in `a`.
fn compile_model(a: &Args, model: &Path) -> Result<kiln_compiler::Compiled, String> {
    Compilation::new(Input::File(model.to_path_buf()), options(a, model)?)
        .finish()
        .map_err(|e| compile_error(model, &e))
}

/// `kiln compile MODEL -o OUT.kiln [...]`.
pub(crate) fn compile_cmd(a: Args) -> Result<(), String> {
    if a.list_passes {
        // Every stage in order, the tensor passes under theirs: the names
        // `--dump-after` takes.
        for stage in Stage::ALL {
            write_stdout(&format!("{:<40} {}\n", stage.name(), stage.summary()))?;
            if stage == Stage::TensorPasses {
                for p in kiln_opt::registry() {
                    write_stdout(&format!("  {:<38} {}\n", p.name(), p.summary()))?;
                }
            }
        }
        return Ok(());
    }
    let model = a.model.clone().ok_or("no model given (kiln --help shows the usage)")?;
    if a.to.as_deref() == Some("ptx") {
        // The PTX module of the CUDA target: every kernel, as ptxas and the driver take it.
        if a.device.as_deref().is_some_and(|d| d != "cuda") {
            return Err("--to ptx is the CUDA target's code: leave out --target or give --target cuda".into());
        }
        let mut opts = options_with(&a, &model, CubinMode::Off)?;
        opts.device = TargetDevice::Cuda;
        let mut c = Compilation::new(Input::File(model.clone()), opts);
        c.run_to(Stage::Codegen).map_err(|e| compile_error(&model, &e))?;
        return write_stdout(c.cuda().map(|m| m.ptx()).unwrap_or_default());
    }
    if a.to.as_deref() == Some("cubin") {
        // The same module assembled by ptxas for sm_90a: binary, so to a file.
        if a.device.as_deref().is_some_and(|d| d != "cuda") {
            return Err("--to cubin is the CUDA target's code: leave out --target or give --target cuda".into());
        }
        if a.cubin == CubinMode::Off {
            return Err("--to cubin makes a cubin: leave out --cubin off".into());
        }
        let out = a.output.clone().ok_or("--to cubin writes binary: give -o OUT.cubin")?;
        let mut opts = options_with(&a, &model, CubinMode::Off)?;
        opts.device = TargetDevice::Cuda;
        opts.ptxas = ptxas::find(CubinMode::Require).map_err(|e| format!("--to cubin: {e}"))?;
        let mut c = Compilation::new(Input::File(model.clone()), opts);
        c.run_to(Stage::Codegen).map_err(|e| compile_error(&model, &e))?;
        let code = &c.cubin().ok_or("no cubin was made")?.executable.code;
        return std::fs::write(&out, code).map_err(|e| format!("cannot write `{}`: {e}", out.display()));
    }
    if let Some(kinds) = &a.hetero {
        return compile_hetero(&a, &model, kinds);
    }
    if !a.place.is_empty() {
        return Err("--place needs --devices with a list of device kinds (cpu,cuda)".into());
    }
    if let Some(n) = a.devices.filter(|&n| n != 1) {
        return compile_sharded(&a, &model, n);
    }
    let level = match a.to.as_deref() {
        None | Some("artifact") => None,
        Some(l) => Some(
            Level::from_name(l)
                .ok_or_else(|| format!("--to `{l}`: expected tensor, flow, stream, hal, ptx, cubin or artifact"))?,
        ),
    };
    for pass in &a.dump_after {
        if Stage::from_name(pass).is_none() && kiln_opt::find(pass).is_err() {
            return Err(format!("--dump-after `{pass}`: no such stage or pass (kiln compile --list-passes)"));
        }
    }
    let mut c = Compilation::new(Input::File(model.clone()), options(&a, &model)?);
    let mut dump = |name: &str, c: &Compilation| {
        if a.dump_after.iter().any(|p| p == name) {
            let text = match c.text() {
                Some(t) => t,
                None => c.program().map(|p| listing(p, &LayoutInfo::default(), false)).unwrap_or_default(),
            };
            eprintln!("// after {name}\n{text}");
        }
    };
    let last = level.map_or(Stage::Artifact, Level::stage);
    c.run_to_with(last, &mut dump).map_err(|e| compile_error(&model, &e))?;
    match level {
        None => {}
        Some(Level::Flow) => return write_stdout(&format!("{}\n", c.text().unwrap_or_default())),
        Some(Level::Hal) => {
            let program = c.program().ok_or("no program after the HAL stage")?;
            return write_stdout(&listing(program, &LayoutInfo::default(), false));
        }
        Some(_) => return write_stdout(&c.text().unwrap_or_default()),
    }
    let out = a.output.clone().ok_or("no output given (-o OUT.kiln)")?;
    if a.symbol.is_some() && a.emit == Emit::Kiln {
        return Err("--symbol names the symbol of --emit c-array or --emit object".into());
    }
    let c = c.finish().map_err(|e| compile_error(&model, &e))?;
    let t_import: std::time::Duration = c.phases.iter().filter(|(s, _)| *s == Stage::Import).map(|(_, d)| *d).sum();
    let t_compile: std::time::Duration = c.phases.iter().filter(|(s, _)| *s != Stage::Import).map(|(_, d)| *d).sum();
    let written: std::borrow::Cow<'_, [u8]> = match a.emit {
        Emit::Kiln => c.artifact[..].into(),
        Emit::CArray => {
            crate::embed::c_array(&c.artifact, &crate::embed::symbol(a.symbol.as_deref(), &out)?).into_bytes().into()
        }
        Emit::Object => crate::embed::object(&c.artifact, &crate::embed::symbol(a.symbol.as_deref(), &out)?)?.into(),
    };
    std::fs::write(&out, &written).map_err(|e| format!("cannot write `{}`: {e}", out.display()))?;
    if let (Some(w), Some(bytes)) = (&a.external_weights, &c.weights) {
        std::fs::write(w, bytes).map_err(|e| format!("cannot write `{}`: {e}", w.display()))?;
    }
    let e = &c.program.entries[0];
    let dispatches = e.commands.iter().filter(|c| matches!(c, Command::Dispatch { .. })).count();
    // Dispatches and fills of the instantiation prologue, run once per instance.
    let once = e.commands[..(e.prologue as usize).min(e.commands.len())]
        .iter()
        .filter(|c| matches!(c, Command::Dispatch { .. } | Command::Fill { .. }))
        .count();
    eprintln!(
        "{}: {} bytes ({} dispatches in {} waves{}; arena {} bytes, lower bound {}; constants {} bytes{}); import {:.1} ms, compile {:.1} ms",
        out.display(),
        c.artifact.len(),
        dispatches,
        c.plan.waves.len(),
        if once > 0 { format!(", {once} once per instance") } else { String::new() },
        c.plan.arena_size,
        c.plan.arena_lower_bound,
        c.plan.constants.len(),
        if c.weights.is_some() { " outside" } else { "" },
        t_import.as_secs_f64() * 1e3,
        t_compile.as_secs_f64() * 1e3,
    );
    if a.timings {
        for (phase, d) in &c.phases {
            eprintln!("  {phase:<20} {:8.2} ms", d.as_secs_f64() * 1e3);
        }
        let micro = c.codegen_notes.iter().filter(|n| n.starts_with("contraction")).count();
        eprintln!("  {micro} of {} dispatches are contraction microkernels", c.codegen_notes.len());
        eprintln!("  {}", class_summary(&c.flow, &c.codegen_notes));
        for line in path_summary(&c.flow, &c.codegen_paths) {
            eprintln!("  {line}");
        }
        // CUDA kernels have no CPU code path ("-").
        for (i, (d, note)) in c.flow.dispatches.iter().zip(&c.codegen_notes).enumerate() {
            let work = kiln_flow::fuse::work(&d.kernel);
            eprintln!(
                "  {:<10} {work:>12.0} {:<11} {:<7} {note}  [{}]",
                d.kernel.name,
                d.class.name(),
                c.codegen_paths.get(i).map_or("-", |p| p.name()),
                d.sources.join(" + ")
            );
        }
        for line in cuda_timings(&c) {
            eprintln!("  {line}");
        }
    }
    Ok(())
}

/// `--timings` of a CUDA compilation: how long ptxas took and, per kernel, its emitter
/// and what `ptxas -v` reported for it (registers, static shared memory, stack frame,
/// spill stores/loads); nothing for a CPU compilation.
fn cuda_timings(c: &kiln_compiler::Compiled) -> Vec<String> {
    if !c.program.devices.iter().any(|d| d.kind == DeviceKind::Cuda) {
        return Vec::new();
    }
    let ptx = c.program.executables.first().map_or(0, |x| x.code.len());
    let mut lines = vec![match &c.cubin {
        Some(cb) => format!(
            "ptxas -arch={} -v: {:.1} ms (part of the codegen stage); PTX {ptx} bytes, cubin {} bytes",
            ptxas::ARCH,
            cb.ptxas_time.as_secs_f64() * 1e3,
            cb.executable.code.len()
        ),
        None => format!("no cubin (--cubin off, or no ptxas found): PTX only, {ptx} bytes"),
    }];
    for (i, (d, note)) in c.flow.dispatches.iter().zip(&c.codegen_notes).enumerate() {
        let used = match c.cubin.as_ref().and_then(|cb| cb.resources.get(i).copied().flatten()) {
            Some(r) => format!(
                "{:>3} regs {:>6} B smem {:>5} B stack {}/{} B spilled",
                r.registers, r.shared, r.stack, r.spill_stores, r.spill_loads
            ),
            None => "(no ptxas report)".into(),
        };
        lines.push(format!("{:<10} {:<11} {used}  {note}  [{}]", d.kernel.name, d.class.name(), d.sources.join(" + ")));
    }
    lines
}

/// `classes: N contraction (M microkernel), …`: dispatches per kernel class, and how many
/// of each took their class's microkernel; the rest took the general path (a note that
/// starts with `general`), and those of a class other than general are fallbacks.
fn class_summary(flow: &kiln_flow::program::FlowProgram, notes: &[String]) -> String {
    let general = |i: usize| notes.get(i).is_none_or(|n| n.starts_with("general"));
    let mut parts = Vec::new();
    let mut fallbacks = 0;
    // General last: the class without a microkernel of its own.
    let order = KernelClass::ALL.into_iter().filter(|&c| c != KernelClass::General).chain([KernelClass::General]);
    for class in order {
        let of: Vec<usize> = (0..flow.dispatches.len()).filter(|&i| flow.dispatches[i].class == class).collect();
        let micro = of.iter().filter(|&&i| !general(i)).count();
        if class == KernelClass::General {
            parts.push(format!("{} general", of.len()));
        } else {
            fallbacks += of.len() - micro;
            parts.push(format!("{} {} ({micro} microkernel)", of.len(), class.name()));
        }
    }
    format!("classes: {}; {fallbacks} fell back to the general path", parts.join(", "))
}

/// Dispatches per class and code path (`contraction: 44 512-bit, 12 256-bit`), one line
/// per class that has any, then how many run scalar, said even when none do.
fn path_summary(flow: &kiln_flow::program::FlowProgram, paths: &[kiln_compiler::CodePath]) -> Vec<String> {
    use kiln_flow::class::KernelClass;
    let mut lines = Vec::new();
    for class in KernelClass::ALL {
        let mut counts: std::collections::BTreeMap<kiln_compiler::CodePath, usize> = Default::default();
        for (d, p) in flow.dispatches.iter().zip(paths) {
            if d.class == class {
                *counts.entry(*p).or_default() += 1;
            }
        }
        if !counts.is_empty() {
            let parts: Vec<String> = counts.iter().map(|(p, n)| format!("{n} {}", p.name())).collect();
            lines.push(format!("paths of {}: {}", class.name(), parts.join(", ")));
        }
    }
    let scalar = paths.iter().filter(|p| **p == kiln_compiler::CodePath::Scalar).count();
    lines.push(format!("{scalar} of {} dispatches run scalar", paths.len()));
    lines
}

/// An artifact's bytes (read, or compiled from a model), its weights when the compile
/// kept them outside, and a label for messages.
pub(crate) struct Loaded {
    pub bytes: AlignedBytes,
    pub compiled_weights: Option<AlignedBytes>,
    pub label: String,
    /// The artifact's file (`None` for a model compiled here).
    pub path: Option<PathBuf>,
}

/// Reads an artifact, or compiles a model; the bytes are 64-byte aligned so that the
/// runtime uses the constants in place.
pub(crate) fn read_artifact(a: &Args) -> Result<Loaded, String> {
    let model = a.model.clone().ok_or("no artifact or model given (kiln --help shows the usage)")?;
    let label = model.display().to_string();
    if is_artifact(&model) {
        let given = [
            (!a.import.input_shapes.is_empty(), "--input-shape"),
            (!a.import.input_values.is_empty(), "--input-value"),
            (!a.import.input_sequences.is_empty(), "--input-sequence"),
            (!a.import.absent_inputs.is_empty(), "--input-absent"),
            (a.target.is_some(), "--target-cpu"),
            (a.triple.is_some(), "--target-triple"),
            (a.size, "--opt size"),
            (a.cubin != CubinMode::Auto, "--cubin"),
            (!a.cuda_archs.is_empty(), "--cuda-arch"),
        ];
        if let Some((_, flag)) = given.iter().find(|(set, _)| *set) {
            return Err(format!("{flag} applies when compiling a model; `{label}` is an artifact, compiled already"));
        }
        let bytes = AlignedBytes::read(&model).map_err(|e| format!("cannot read `{label}`: {e}"))?;
        return Ok(Loaded { bytes, compiled_weights: None, label, path: Some(model) });
    }
    let c = compile_model(a, &model)?;
    let bytes = AlignedBytes::copy_from(&c.artifact);
    Ok(Loaded { bytes, compiled_weights: c.weights.as_deref().map(AlignedBytes::copy_from), label, path: None })
}

/// Verifies an artifact's container, sections and plan
/// ([`kiln_runtime::Module::verify_plan`]): every command that reads an artifact does
/// this before it walks the plan or opens a file the artifact names.
pub(crate) fn verify_plan(l: &Loaded) -> Result<kiln_runtime::VerifiedPlan<'_>, String> {
    kiln_runtime::Module::verify_plan(l.bytes.bytes()).map_err(|e| format!("{}: {e}", l.label))
}

/// The weights of an artifact verified by [`verify_plan`] that are in a file:
/// `--weights`, else, for an artifact that keeps them outside, the file it names beside
/// the artifact. `None` for an artifact that embeds them and for a model compiled here
/// (whose weights, when the compile kept them outside, are `compiled_weights`).
pub(crate) fn weights_file(
    a: &Args,
    loaded: &Loaded,
    plan: &kiln_runtime::VerifiedPlan<'_>,
) -> Result<Option<AlignedBytes>, String> {
    Ok(match (&loaded.path, &a.weights) {
        (None, _) => None,
        (Some(_), Some(w)) => Some(AlignedBytes::read(w).map_err(|e| format!("cannot read `{}`: {e}", w.display()))?),
        (Some(model), None) => {
            let label = &loaded.label;
            match plan.program.constants {
                ConstantsView::External { file, .. } => {
                    // The compiler records a bare file name; anything else (a path, `..`)
                    // would make the artifact choose which file kiln opens.
                    let plain = Path::new(file).file_name().is_some_and(|n| n == std::ffi::OsStr::new(file));
                    if !plain {
                        return Err(format!(
                            "{label}: the artifact names its weights file {}, which is not a plain file name; pass the weights with --weights",
                            json_str(file)
                        ));
                    }
                    let p = model.parent().unwrap_or(Path::new(".")).join(file);
                    let w = AlignedBytes::read(&p).map_err(|e| {
                        format!(
                            "{label}: the artifact keeps its weights in a separate file, `{}`, which cannot be read ({e}); name it with --weights FILE",
                            p.display()
                        )
                    })?;
                    Some(w)
                }
                ConstantsView::Embedded(_) => None,
            }
        }
    })
}

/// Reads the artifact of `a` (or compiles its model), loads it verifying it once (the
/// plan with [`verify_plan`], then, with its weights from [`weights_file`], the rest of
/// the runtime's checks) and calls `then` with the module, the artifact's label and how
/// long verifying and loading took (reading the weights file is not counted).
fn with_module<T>(
    a: &Args,
    then: impl FnOnce(&kiln_runtime::LoadedModule<'_>, &str, Duration) -> Result<T, String>,
) -> Result<T, String> {
    let loaded = read_artifact(a)?;
    let t0 = Instant::now();
    let plan = verify_plan(&loaded)?;
    let t_verify = t0.elapsed();
    let weights = weights_file(a, &loaded, &plan)?;
    let t1 = Instant::now();
    let module = plan
        .load(weights.as_ref().or(loaded.compiled_weights.as_ref()).map(AlignedBytes::bytes))
        .map_err(|e| format!("{}: {e}", loaded.label))?;
    then(&module, &loaded.label, t_verify + t1.elapsed())
}

/// `len` zero bytes for a buffer whose size an artifact gave, or an error naming it.
fn zeroed(len: u64, what: &str) -> Result<AlignedBytes, String> {
    usize::try_from(len)
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::OutOfMemory))
        .and_then(AlignedBytes::try_zeroed)
        .map_err(|_| format!("cannot allocate the {len} bytes of {what}"))
}

/// One zeroed buffer per output of an entry point, or an error naming the artifact
/// (`label`) and the output.
pub(crate) fn output_buffers(
    outputs: &[kiln_module::sections::TensorView<'_>],
    label: &str,
) -> Result<Vec<AlignedBytes>, String> {
    outputs
        .iter()
        .map(|t| zeroed(t.bytes, &format!("output {}", json_str(t.name))))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{label}: {e}"))
}

/// `kiln run OUT.kiln [--input NAME=FILE.npy]... [--output-dir DIR] [--seed N] [--threads N]`.
pub(crate) fn run_cmd(a: Args) -> Result<(), String> {
    if a.run_on == RunDevice::Cuda {
        return crate::gpu::run_cmd(&a);
    }
    with_module(&a, |module, label, t_load| run_module(&a, module, label, t_load))
}

/// `kiln run` once the module is loaded (in `t_load`).
fn run_module(a: &Args, module: &kiln_runtime::LoadedModule<'_>, label: &str, t_load: Duration) -> Result<(), String> {
    let sig = module.entry_signature(0).map_err(|e| format!("{label}: {e}"))?;
    let feeds = feeds_bounded(a, sig.inputs, bounded_of(module))?;
    let threads = threads(a);
    let mut instance = Instance::with_threads(module, threads).map_err(|e| format!("{label}: {e}"))?;
    let t_run =
        invoke_and_write(a, &feeds, sig.outputs, label, &mut instance, Instance::invoke, Instance::output_dims)?;
    eprintln!(
        "{label}: loaded in {:.2} ms, ran in {:.3} ms on {threads} thread{}",
        t_load.as_secs_f64() * 1e3,
        t_run.as_secs_f64() * 1e3,
        if threads == 1 { "" } else { "s" }
    );
    Ok(())
}

/// The invoke of `kiln run`, on the CPU or the GPU (`invoke` and `output_dims`, the
/// instance's methods of those names): runs it once on `feeds` into zeroed buffers for
/// `outputs`, then prints and writes the outputs ([`write_outputs`]) at their actual
/// dims. Returns how long the invoke alone took.
pub(crate) fn invoke_and_write<I, E: std::fmt::Display>(
    a: &Args,
    feeds: &[Tensor],
    outputs: &[kiln_module::sections::TensorView<'_>],
    label: &str,
    instance: &mut I,
    invoke: fn(&mut I, &[&[u8]], &mut [&mut [u8]]) -> Result<(), E>,
    output_dims: fn(&I, usize) -> Option<&[u64]>,
) -> Result<Duration, String> {
    let mut outs = output_buffers(outputs, label)?;
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let t0 = Instant::now();
    {
        let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(AlignedBytes::bytes_mut).collect();
        invoke(instance, &ins, &mut out_refs).map_err(|e| format!("{label}: {e}"))?;
    }
    let t_run = t0.elapsed();
    // The actual dims (a data-dependent extent, format 1.5, sizes some outputs).
    let dims: Vec<Vec<u64>> = (0..outs.len()).map(|k| output_dims(instance, k).unwrap_or(&[]).to_vec()).collect();
    write_outputs(a, outputs, &dims, outs.iter().map(AlignedBytes::bytes))?;
    Ok(t_run)
}

/// Prints each output's summary, and with `--output-dir` writes it as `.npy`.
fn write_outputs<'b>(
    a: &Args,
    outputs: &[kiln_module::sections::TensorView<'_>],
    dims: &[Vec<u64>],
    data: impl Iterator<Item = &'b [u8]>,
) -> Result<(), String> {
    if let Some(dir) = &a.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    }
    for (k, (t, data)) in outputs.iter().zip(data).enumerate() {
        // The actual dims where the runtime reports them (a data-dependent extent: the
        // elements are compacted at the front of the bound-sized buffer).
        let d = dims.get(k).filter(|d| d.len() == t.dims.len()).unwrap_or(&t.dims);
        let ty = tensor_type(t.dtype, d).map_err(|e| format!("output `{}`: {e}", t.name))?;
        let data = &data[..ty.storage_bytes().min(data.len())];
        let tensor = Tensor::new(ty, data.to_vec().into()).map_err(|e| format!("output `{}`: {e}", t.name))?;
        write_stdout(&format!("{}: {} {}\n", t.name, tensor.ty(), summary(&tensor)))?;
        if let Some(dir) = &a.output_dir {
            let file = dir.join(format!("{}.npy", file_stem(t.name)));
            let b = npy::write(&tensor).map_err(|e| format!("{}: {e}", t.name))?;
            std::fs::write(&file, b).map_err(|e| format!("cannot write `{}`: {e}", file.display()))?;
        }
    }
    Ok(())
}

/// `kiln bench ARTIFACT|MODEL [--threads N] [--warmup W] [--iterations I] [--json]
/// [--samples FILE] [--floor] [--floor-passes N] [--profile]`: times `invoke` alone
/// (inputs prepared, outputs allocated once, the instance's worker threads started
/// before the first call) and prints the median, p99, standard deviation and
/// p99/median of the per-call wall times, and the thread count used (default: one per
/// core), and the time of the plan's instantiation prologue, run on its own before the
/// warm-up where the plan has one. `--samples` also writes every call's time, in milliseconds, one line a call in
/// call order (for pooling rounds, or reading a tail against time). `--floor` also
/// times, after every call, fixed work of the call's length and footprint on the same
/// thread (one; see [`crate::floor`]) and prints its median and p99 beside; with
/// `--samples`, each line then holds both times. `--floor-passes N` gives its
/// arithmetic instead of tuning it. `--profile` times each command of the plan instead
/// (one thread, or each wave with `--threads N`; see [`profile`]).
pub(crate) fn bench_cmd(a: Args) -> Result<(), String> {
    if a.run_on == RunDevice::Cuda {
        return crate::gpu::bench_cmd(&a);
    }
    if a.resident {
        return Err("--resident times the CUDA graph alone: it needs --device cuda".into());
    }
    if a.profile && (a.samples.is_some() || a.floor) {
        let flag = if a.floor { "--floor" } else { "--samples" };
        return Err(format!("{flag} times whole calls, --profile each command: give one of them"));
    }
    if a.floor && a.threads.is_some_and(|t| t > 1) {
        return Err("--floor's fixed work is one thread's: leave out --threads (or give 1)".into());
    }
    // --profile on one thread unless --threads asks for more (then per wave).
    let threads = if a.floor || (a.profile && a.threads.is_none()) { 1 } else { threads(&a) };
    with_module(&a, |module, label, _| bench_module(&a, module, label, threads))
}

/// `kiln bench` once the module is loaded.
fn bench_module(a: &Args, module: &kiln_runtime::LoadedModule<'_>, label: &str, threads: usize) -> Result<(), String> {
    let sig = module.entry_signature(0).map_err(|e| format!("{label}: {e}"))?;
    let feeds = feeds_bounded(a, sig.inputs, bounded_of(module))?;
    let mut instance = Instance::with_threads(module, threads).map_err(|e| format!("{label}: {e}"))?;
    if std::env::var_os("KILN_PERF_MAP").is_some() {
        write_perf_map(module)?;
    }
    // The inputs and outputs as a program embedding kiln would keep them: aligned, and
    // on huge pages where the system has them (as numpy's large arrays are).
    let mut outs = output_buffers(sig.outputs, label)?;
    let in_bufs: Vec<AlignedBytes> = feeds.iter().map(|t| AlignedBytes::copy_from(t.bytes())).collect();
    let ins: Vec<&[u8]> = in_bufs.iter().map(AlignedBytes::bytes).collect();
    let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(AlignedBytes::bytes_mut).collect();
    let (warmup, iterations) = (a.warmup.unwrap_or(10), a.iterations.unwrap_or(100));
    // The plan's instantiation prologue (what depends on no input, once per instance),
    // timed on its own where the plan has one.
    let t = Instant::now();
    instance.prepare(0).map_err(|e| format!("{label}: {e}"))?;
    let prologue = module.verified().program().entries.first().is_some_and(|e| e.prologue > 0);
    let prologue_ms = prologue.then(|| t.elapsed().as_secs_f64() * 1e3);
    for _ in 0..warmup {
        instance.invoke(&ins, &mut out_refs).map_err(|e| format!("{label}: {e}"))?;
    }
    if a.profile {
        return profile(a, label, module, &mut instance, &ins, &mut out_refs, iterations, threads);
    }
    // With --floor: fixed work reading as many bytes as a call walks, as long as a call
    // (tuned against interleaved calls, as many as the warm-up's, 5 to 200) or with the
    // passes given, timed after every call (see `floor`).
    let footprint = sig
        .inputs
        .iter()
        .chain(sig.outputs.iter())
        .map(|t| t.bytes as usize)
        .chain([
            module.constants().len(),
            module.verified().program().entries.first().map_or(0, |e| e.arena_size as usize),
        ])
        .fold(0usize, usize::saturating_add);
    // One timed call, in milliseconds.
    let mut call = || -> Result<f64, String> {
        let t = Instant::now();
        instance.invoke(&ins, &mut out_refs).map_err(|e| format!("{label}: {e}"))?;
        Ok(t.elapsed().as_secs_f64() * 1e3)
    };
    let mut fixed = None;
    if a.floor {
        let mut f = crate::floor::FixedWork::new(footprint, a.floor_passes.unwrap_or(0));
        if a.floor_passes.is_none() {
            f.tune(warmup.clamp(5, 200), &mut call)?;
        }
        fixed = Some(f);
    }
    let mut ms: Vec<f64> = timings(iterations)?;
    let mut floor_ms: Vec<f64> = timings(if a.floor { iterations } else { 0 })?;
    for _ in 0..iterations {
        ms.push(call()?);
        if let Some(f) = fixed.as_mut() {
            floor_ms.push(f.time());
        }
    }
    if let Some(path) = &a.samples {
        let text: String = match fixed {
            Some(_) => ms.iter().zip(&floor_ms).map(|(t, f)| format!("{} {}\n", json_ms(*t), json_ms(*f))).collect(),
            None => ms.iter().map(|t| format!("{}\n", json_ms(*t))).collect(),
        };
        std::fs::write(path, text).map_err(|e| format!("--samples {}: {e}", path.display()))?;
    }
    let st = Stats::of(&mut ms);
    let fl = fixed.as_ref().map(|f| (Stats::of(&mut floor_ms), f.passes()));
    if a.json {
        let floor = match &fl {
            Some((f, passes)) => format!(
                ",\"floor_median_ms\":{},\"floor_p99_ms\":{},\"footprint_bytes\":{footprint},\"floor_passes\":{passes}",
                json_ms(f.median),
                json_ms(f.p99)
            ),
            None => String::new(),
        };
        let first = prologue_ms.map_or(String::new(), |f| format!(",\"prologue_ms\":{}", json_ms(f)));
        write_stdout(&format!(
            "{{\"model\":{},\"median_ms\":{},\"p99_ms\":{},\"stddev_ms\":{},\"min_ms\":{},\"iterations\":{iterations},\"warmup\":{warmup},\"threads\":{threads}{first}{floor}}}\n",
            json_str(label),
            json_ms(st.median),
            json_ms(st.p99),
            json_ms(st.stddev),
            json_ms(st.min)
        ))
    } else {
        let floor = match &fl {
            Some((f, passes)) => format!(
                "; fixed work of its footprint ({footprint} bytes read, {passes} passes of arithmetic) after each call: median {:.4} ms, p99 {:.4} ms, p99/median {:.2}",
                f.median,
                f.p99,
                f.p99 / f.median
            ),
            None => String::new(),
        };
        let first = prologue_ms.map_or(String::new(), |f| format!("; prologue (once per instance) {f:.4} ms"));
        write_stdout(&format!(
            "{label}: {iterations} iterations after {warmup} warm-up, {threads} thread{}: median {:.4} ms, p99 {:.4} ms, stddev {:.4} ms, min {:.4} ms, p99/median {:.2}{first}{floor}\n",
            if threads == 1 { "" } else { "s" },
            st.median,
            st.p99,
            st.stddev,
            st.min,
            st.p99 / st.median
        ))
    }
}

/// `kiln bench --profile`: `iterations` calls through `Instance::invoke_observed`, the
/// clock read after every command; per dispatch, copy and fill the median time, its
/// share of the sum of medians and the compiler's estimate (`work_ns`), slowest first.
/// The clock costs some 20–40 ns a command, so a model of many tiny commands reads a
/// little slower here than in a plain `kiln bench`. With `--threads N` (N > 1) the calls
/// run on the instance's threads through `Instance::invoke_observed` by waves: the clock
/// is read after every wave of the local-task driver, and a wave's time (its slowest
/// thread's, the hand-off included) is its last dispatch's row; the other dispatches
/// of a wave of several read 0.
#[allow(clippy::too_many_arguments)]
fn profile(
    a: &Args,
    label: &str,
    module: &kiln_runtime::LoadedModule<'_>,
    instance: &mut Instance<'_>,
    ins: &[&[u8]],
    outs: &mut [&mut [u8]],
    iterations: usize,
    threads: usize,
) -> Result<(), String> {
    let p = module.verified().program();
    let main = p.entries.first().ok_or_else(|| format!("{label}: no entry point"))?;
    let n = main.commands.len();
    // times[c * iterations + k]: command c in call k.
    let mut times = timings(n.checked_mul(iterations).ok_or("--iterations: too many to time")?)?;
    times.resize(n * iterations, 0.0);
    let mut calls = timings(iterations)?;
    for k in 0..iterations {
        let start = Instant::now();
        let mut last = start;
        let mut after = |c: usize| {
            let now = Instant::now();
            times[c * iterations + k] = (now - last).as_secs_f64() * 1e6;
            last = now;
        };
        let steps = if threads > 1 { kiln_runtime::Observe::Waves } else { kiln_runtime::Observe::Commands };
        instance.invoke_observed(ins, outs, steps, &mut after).map_err(|e| format!("{label}: {e}"))?;
        calls.push(start.elapsed().as_secs_f64() * 1e3);
    }
    let call = Stats::of(&mut calls);
    let (rows, total) =
        profile_rows(p, &main.commands, &mut times, iterations, |name, _, workgroups| format!("{name} x{workgroups}"));
    if a.json {
        let items: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"command\":{},\"what\":{},\"median_us\":{},\"estimate_us\":{},\"source\":{}}}",
                    r.command,
                    json_str(&r.what),
                    json_ms(r.median_us),
                    r.est_us.map_or("null".to_string(), json_ms),
                    json_str(&r.source)
                )
            })
            .collect();
        return write_stdout(&format!(
            "{{\"model\":{},\"median_ms\":{},\"iterations\":{iterations},\"threads\":{threads},\"profile\":[{}]}}\n",
            json_str(label),
            call.median,
            items.join(",")
        ));
    }
    let mut s = format!(
        "{label}: profile of {iterations} calls on {}: median call {:.4} ms, sum of command medians {:.4} ms\n",
        if threads > 1 { format!("{threads} threads, per wave") } else { "one thread".to_string() },
        call.median,
        total / 1e3
    );
    s.push_str("  command  median us   share  estimate us  what  // source\n");
    for r in &rows {
        let est = r.est_us.map_or("—".to_string(), |e| format!("{e:.1}"));
        let src = if r.source.is_empty() { String::new() } else { format!("  // {}", r.source) };
        let _ = writeln!(
            s,
            "  {:>7}  {:>9.2}  {:>5.1}%  {:>11}  {}{src}",
            r.command,
            r.median_us,
            r.median_us / total.max(f64::MIN_POSITIVE) * 100.0,
            est,
            r.what
        );
    }
    write_stdout(&s)
}

/// `kiln compile --devices cpu,cuda [--place OP=DEVICE]…`: a heterogeneous plan
/// ([`kiln_compiler::hetero`]); `--to hal` prints the linked program's listing.
fn compile_hetero(a: &Args, model: &Path, list: &str) -> Result<(), String> {
    if a.emit != Emit::Kiln || !a.dump_after.is_empty() {
        return Err("--devices writes a .kiln artifact: leave out --emit and --dump-after".into());
    }
    let kinds = kiln_compiler::placement::parse_devices(list).map_err(|e| compile_error(model, &e))?;
    let rules = a
        .place
        .iter()
        .map(|r| kiln_compiler::placement::parse_rule(r, &kinds))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| compile_error(model, &e))?;
    let mut opts = options(a, model)?;
    if kinds.contains(&DeviceKind::Cuda) && opts.ptxas.is_none() {
        // Every PTX kernel is checked by ptxas where one is installed, as `--target cuda` does.
        opts.ptxas = ptxas::find(CubinMode::Auto).ok().flatten();
    }
    let t = std::time::Instant::now();
    let c = kiln_compiler::hetero::compile(Input::File(model.to_path_buf()), &opts, &kinds, &rules)
        .map_err(|e| compile_error(model, &e))?;
    match a.to.as_deref() {
        None | Some("artifact") => {}
        Some("hal") => return write_stdout(&listing(&c.program, &LayoutInfo::default(), false)),
        Some(l) => return Err(format!("--to `{l}` with --devices KINDS: expected hal or artifact")),
    }
    let out = write_linked(a, &c.artifact, c.weights.as_deref())?;
    let e = &c.program.entries[0];
    let per: Vec<String> = c
        .program
        .devices
        .iter()
        .enumerate()
        .map(|(d, dev)| {
            let n = e
                .commands
                .iter()
                .filter(|x| matches!(x, Command::Dispatch { device, .. } if *device as usize == d))
                .count();
            let arena = if d == 0 { e.arena_size } else { e.device_arenas.get(d - 1).copied().unwrap_or(0) };
            format!("{}: {n} dispatches, arena {arena} bytes", dev.name)
        })
        .collect();
    eprintln!(
        "{}: {} bytes ({} segments, {} transfers; {}); {:.1} ms",
        out.display(),
        c.artifact.len(),
        e.commands.iter().filter(|x| matches!(x, Command::Segment { .. })).count(),
        e.commands.iter().filter(|x| matches!(x, Command::Transfer { .. })).count(),
        per.join("; "),
        t.elapsed().as_secs_f64() * 1e3,
    );
    Ok(())
}

/// Writes a linked artifact (`--devices`, a number or kinds) to `-o OUT.kiln` and its
/// constant pool to `--external-weights` when kept outside; the artifact's path.
fn write_linked(a: &Args, artifact: &[u8], weights: Option<&[u8]>) -> Result<PathBuf, String> {
    let out = a.output.clone().ok_or("no output given (-o OUT.kiln)")?;
    std::fs::write(&out, artifact).map_err(|e| format!("cannot write `{}`: {e}", out.display()))?;
    if let (Some(w), Some(bytes)) = (&a.external_weights, weights) {
        std::fs::write(w, bytes).map_err(|e| format!("cannot write `{}`: {e}", w.display()))?;
    }
    Ok(out)
}

/// `kiln compile --devices N` (N ≠ 1): the plan sharded over N devices
/// ([`kiln_compiler::shard`]); `--to tensor` prints the per-device graphs, `--to hal`
/// the linked program's listing.
fn compile_sharded(a: &Args, model: &Path, n: u32) -> Result<(), String> {
    if a.emit != Emit::Kiln || !a.dump_after.is_empty() {
        return Err("--devices writes a .kiln artifact: leave out --emit and --dump-after".into());
    }
    let opts = options(a, model)?;
    let t = std::time::Instant::now();
    let c = kiln_compiler::shard::compile(Input::File(model.to_path_buf()), &opts, n)
        .map_err(|e| compile_error(model, &e))?;
    match a.to.as_deref() {
        None | Some("artifact") => {}
        Some("tensor") => return write_stdout(&kiln_compiler::shard::print_sharded(&c.cut)),
        Some("hal") => return write_stdout(&listing(&c.program, &LayoutInfo::default(), false)),
        Some(l) => return Err(format!("--to `{l}` with --devices: expected tensor, hal or artifact")),
    }
    let out = write_linked(a, &c.artifact, c.weights.as_deref())?;
    let e = &c.program.entries[0];
    let count = |f: fn(&Command) -> bool| e.commands.iter().filter(|c| f(c)).count();
    eprintln!(
        "{}: {} bytes ({} devices, {} stages; {} dispatches, {} all-reduces, {} all-gathers; \
         {} products split by columns, {} by rows; arena {} bytes); {:.1} ms",
        out.display(),
        c.artifact.len(),
        n,
        c.cut.stages(),
        count(|c| matches!(c, Command::Dispatch { .. })),
        count(|c| matches!(c, Command::AllReduce { .. })),
        count(|c| matches!(c, Command::AllGather { .. })),
        c.cut.column_split.len(),
        c.cut.row_split.len(),
        e.arena_size,
        t.elapsed().as_secs_f64() * 1e3,
    );
    Ok(())
}

/// A row of `kiln bench --profile` (CPU or CUDA): command `command` of the entry point,
/// what it does, its median time, the compiler's estimate (`work_ns`; `None` when not
/// made) and the source its kernel was lowered from (empty without a debug section).
pub(crate) struct ProfileRow {
    pub(crate) command: usize,
    pub(crate) what: String,
    pub(crate) median_us: f64,
    pub(crate) est_us: Option<f64>,
    pub(crate) source: String,
}

/// The profile rows of an entry point's `commands` in `p` (barriers left out), slowest
/// first, and the sum of their medians. `times[c * iterations + k]` is command c's time
/// in µs in round k; `dispatch(kernel name, kernel, workgroups)` says what a dispatch is.
pub(crate) fn profile_rows(
    p: &kiln_module::sections::ProgramView<'_>,
    commands: &[Command],
    times: &mut [f64],
    iterations: usize,
    dispatch: impl Fn(&str, u32, u64) -> String,
) -> (Vec<ProfileRow>, f64) {
    let mut rows = Vec::new();
    for (c, cmd) in commands.iter().enumerate() {
        let (what, est_us, kernel) = match cmd {
            Command::Dispatch { kernel, workgroups, work_ns, .. } => {
                let name = p.kernels.get(*kernel as usize).map_or("?", |k| k.name);
                let est = (*work_ns > 0).then(|| *work_ns as f64 / 1e3);
                (dispatch(name, *kernel, *workgroups), est, Some(*kernel))
            }
            Command::Copy { src, .. } => (format!("copy {} bytes", src.length), None, None),
            Command::Fill { dst, .. } => (format!("fill {} bytes", dst.length), None, None),
            Command::AllReduce { parts, .. } => (
                format!("all-reduce {} bytes over {} devices", parts.first().map_or(0, |x| x.src.length), parts.len()),
                None,
                None,
            ),
            Command::AllGather { parts, .. } => (
                format!("all-gather {} bytes over {} devices", parts.first().map_or(0, |x| x.dst.length), parts.len()),
                None,
                None,
            ),
            Command::SkipIf { count, .. } => (format!("skip {count} if"), None, None),
            Command::Transfer { src, src_device, dst_device, .. } => {
                (format!("transfer {} bytes d{src_device}->d{dst_device}", src.length), None, None)
            }
            Command::Barrier | Command::Segment { .. } => continue,
        };
        let source = kernel
            .and_then(|k| p.debug.as_ref().and_then(|d| d.kernel_sources.get(k as usize)))
            .map(|s| s.to_string())
            .unwrap_or_default();
        let median_us = Stats::of(&mut times[c * iterations..(c + 1) * iterations]).median;
        rows.push(ProfileRow { command: c, what, median_us, est_us, source });
    }
    rows.sort_by(|x, y| y.median_us.total_cmp(&x.median_us));
    let total = rows.iter().map(|r| r.median_us).sum();
    (rows, total)
}

/// With `KILN_PERF_MAP` set, `kiln bench` writes `/tmp/perf-PID.map` (the format
/// `perf report` reads for generated code): each kernel's address, size (up to the
/// next kernel) and name, so a profile names the dispatches.
fn write_perf_map(module: &kiln_runtime::LoadedModule<'_>) -> Result<(), String> {
    let names: Vec<&str> = module.verified().program().kernels.iter().map(|k| k.name).collect();
    let mut at: Vec<(usize, &str)> = module.kernel_addresses().zip(names).collect();
    at.sort();
    let mut text = String::new();
    for (i, &(addr, name)) in at.iter().enumerate() {
        let size = at.get(i + 1).map_or(4096, |n| n.0 - addr);
        text.push_str(&format!("{addr:x} {size:x} kiln:{name}\n"));
    }
    let path = format!("/tmp/perf-{}.map", std::process::id());
    std::fs::write(&path, text).map_err(|e| format!("{path}: {e}"))
}

/// Room for `n` timings, or an error when `--iterations` asks for more than memory holds.
pub(crate) fn timings(n: usize) -> Result<Vec<f64>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| format!("--iterations {n}: cannot hold that many timings"))?;
    Ok(v)
}

/// Summary statistics of timings.
pub(crate) struct Stats {
    pub median: f64,
    pub p99: f64,
    pub stddev: f64,
    pub min: f64,
}

impl Stats {
    /// Sorts `v` (non-empty) and summarises it; p99 is the nearest-rank percentile.
    pub(crate) fn of(v: &mut [f64]) -> Stats {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        let rank = ((0.99 * n as f64).ceil() as usize).clamp(1, n);
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        Stats { median, p99: v[rank - 1], stddev: var.sqrt(), min: v[0] }
    }
}

/// The inputs of a run: `--input NAME=FILE.npy` where given (checked against the
/// signature), seeded random data (`--seed`) elsewhere.
pub(crate) fn feeds(a: &Args, inputs: &[kiln_module::sections::TensorView<'_>]) -> Result<Vec<Tensor>, String> {
    feeds_bounded(a, inputs, &[])
}

/// [`feeds`] for an entry with bounded input dimensions (format 1.6): a file may have
/// any extent along one (the runtime checks its range), a random input has the bound or
/// the `--extent` given.
pub(crate) fn feeds_bounded(
    a: &Args,
    inputs: &[kiln_module::sections::TensorView<'_>],
    bounded: &[kiln_module::program::BoundedDesc],
) -> Result<Vec<Tensor>, String> {
    for (n, x) in &a.extents {
        let b = inputs.iter().position(|t| t.name == *n).and_then(|i| bounded.iter().find(|b| b.input as usize == i));
        if b.is_none() {
            return Err(format!("--extent {n}={x}: the module has no input `{n}` with a bounded dimension"));
        }
    }
    for (n, _) in &a.inputs {
        if !inputs.iter().any(|t| t.name == *n) {
            let names: Vec<String> = inputs.iter().map(|t| format!("`{}`", t.name)).collect();
            return Err(format!("--input `{n}`: the model has no such input; its inputs are: {}", names.join(", ")));
        }
    }
    let mut rng = SplitMix(a.seed);
    let mut feeds: Vec<Tensor> = Vec::new();
    for (i, t) in inputs.iter().enumerate() {
        let b = bounded.iter().find(|b| b.input as usize == i);
        let mut dims = t.dims.clone();
        if let (Some(b), Some((_, x))) = (b, a.extents.iter().find(|(n, _)| *n == t.name)) {
            dims[b.axis as usize] = *x as u64;
        }
        let ty = tensor_type(t.dtype, &dims).map_err(|e| format!("input `{}`: {e}", t.name))?;
        let tensor = match a.inputs.iter().find(|(n, _)| *n == t.name) {
            Some((_, file)) => {
                let b = std::fs::read(file).map_err(|e| format!("cannot read `{}`: {e}", file.display()))?;
                let x = npy::read_typed(&b, Some(ty.dtype)).map_err(|e| format!("{}: {e}", file.display()))?;
                // Along a bounded dimension any extent (the runtime checks its range).
                let along = |x: &Tensor| {
                    bounded.iter().find(|b| b.input as usize == i).is_some_and(|b| {
                        let (xd, td) = (x.ty().shape.dims(), ty.shape.dims());
                        x.ty().dtype == ty.dtype
                            && xd.len() == td.len()
                            && xd.iter().zip(td).enumerate().all(|(k, (p, q))| k == b.axis as usize || p == q)
                    })
                };
                if x.ty() != &ty && !along(&x) {
                    return Err(format!(
                        "input `{}`: {} holds {}, the model expects {}",
                        t.name,
                        file.display(),
                        x.ty(),
                        ty
                    ));
                }
                x
            }
            None => random_tensor(ty.dtype, ty.shape.clone(), &mut rng)?,
        };
        feeds.push(tensor);
    }
    Ok(feeds)
}

/// The bounded input dimensions of `module`'s first entry (format 1.6).
fn bounded_of<'m>(module: &'m kiln_runtime::LoadedModule<'_>) -> &'m [kiln_module::program::BoundedDesc] {
    match module.verified().program().entries.first() {
        Some(e) => &e.bounded,
        None => &[],
    }
}

pub(crate) fn tensor_type(code: u32, dims: &[u64]) -> Result<TensorType, String> {
    let dtype = DType::from_onnx_code(code as i64).ok_or_else(|| format!("unknown dtype code {code}"))?;
    let shape = Shape::new(dims.iter().map(|&d| d as usize).collect::<Vec<_>>()).map_err(|e| e.to_string())?;
    Ok(TensorType::new(dtype, shape))
}

/// Section sizes of the file, for listings.
#[derive(Default)]
struct LayoutInfo {
    file_bytes: usize,
    sections: Vec<(String, u64)>,
    format: String,
    abi: String,
    /// For an artifact with CPU code: what this host would run.
    host: Option<HostChoice>,
}

/// Which variant of each kernel this machine would run, and why: the runtime's own
/// choice ([`kiln_runtime::verify::select_variants`] on the host's features, the
/// features `cpuid` reports), with what each variant needs.
struct HostChoice {
    /// The host's CPU features.
    features: u64,
    /// Per kernel, per variant: the CPU features it needs (`None`: not CPU code).
    needs: Vec<Vec<Option<u64>>>,
    /// The variant each kernel takes, or why the artifact does not load here.
    taken: Result<Vec<usize>, String>,
}

impl HostChoice {
    fn of(p: &kiln_module::sections::ProgramView<'_>) -> Option<HostChoice> {
        if !p.executables.iter().any(|x| x.device == DeviceKind::Cpu) {
            return None;
        }
        let features = kiln_runtime::cpu::host_features();
        let needs = p
            .kernels
            .iter()
            .map(|k| k.variants.iter().map(|v| kiln_runtime::verify::cpu_needs(p, v)).collect())
            .collect();
        let taken = kiln_runtime::verify::select_variants(p, features).map_err(|e| e.to_string());
        Some(HostChoice { features, needs, taken })
    }

    fn taken(&self, kernel: usize) -> Option<usize> {
        self.taken.as_ref().ok()?.get(kernel).copied()
    }
}

/// A CPU feature set named by its x86-64 level and what it has beyond it
/// (`x86-64-v4 +avx512bw`).
fn level_name(bits: u64) -> String {
    let (level, extra) = CpuFeature::level_of(bits);
    let mut s = level.unwrap_or("x86-64 without sse2").to_string();
    for f in features(extra) {
        s.push_str(" +");
        s.push_str(f);
    }
    s
}

/// A variant's condition as listings name it.
fn condition_name(c: &Condition) -> String {
    match c {
        Condition::Always => "always".into(),
        Condition::CpuFeatures(bits) => level_name(*bits),
        Condition::Cuda(arch) => arch.to_string(),
    }
}

/// `kiln inspect OUT.kiln [--json] [--dispatch-graph]`.
pub(crate) fn inspect_cmd(a: Args) -> Result<(), String> {
    // Verified before it is walked: the listing and the dispatch graph do arithmetic on
    // its offsets and lengths. Weights are not needed to list it.
    let loaded = read_artifact(&a)?;
    let bytes = &loaded.bytes;
    let plan = verify_plan(&loaded)?;
    let m = plan.container;
    let program = plan.program.to_program();
    let info = LayoutInfo {
        file_bytes: bytes.bytes().len(),
        sections: m.sections().map(|s| (s.kind.to_string(), s.bytes.len() as u64)).collect(),
        format: m.format().to_string(),
        abi: m.abi().to_string(),
        host: HostChoice::of(&plan.program),
    };
    if a.dispatch_graph {
        return write_stdout(&dispatch_dot(&program));
    }
    write_stdout(&listing(&program, &info, a.json))
}

fn dtype_name(code: u32) -> String {
    DType::from_onnx_code(code as i64).map(|d| d.name().to_string()).unwrap_or_else(|| format!("dtype#{code}"))
}

fn slot_name(b: &Binding) -> String {
    match b.slot {
        Slot::Arena => format!("arena+{}", b.offset),
        Slot::Constants => format!("const+{}", b.offset),
        Slot::Input(i) => format!("in{i}+{}", b.offset),
        Slot::Output(i) => format!("out{i}+{}", b.offset),
    }
}

/// A binding as JSON: `{"slot":"arena"|"constants"|"input"|"output","index":I,"offset":O,"bytes":L}`
/// (`index` for inputs and outputs only).
fn json_binding(b: &Binding) -> String {
    let (slot, index) = match b.slot {
        Slot::Arena => ("arena", None),
        Slot::Constants => ("constants", None),
        Slot::Input(i) => ("input", Some(i)),
        Slot::Output(i) => ("output", Some(i)),
    };
    let index = index.map(|i| format!(",\"index\":{i}")).unwrap_or_default();
    format!("{{\"slot\":\"{slot}\"{index},\"offset\":{},\"bytes\":{}}}", b.offset, b.length)
}

/// A time in JSON (and `--samples`): rounded to the nanosecond, given milliseconds (or to
/// the picosecond, given microseconds: finer than any clock here), `null` when not finite.
pub(crate) fn json_ms(x: f64) -> String {
    if x.is_finite() {
        format!("{}", (x * 1e6).round() / 1e6)
    } else {
        "null".into()
    }
}

fn features(bits: u64) -> Vec<&'static str> {
    CpuFeature::ALL.iter().filter(|f| bits & f.bit() != 0).map(|f| f.name()).collect()
}

pub(crate) fn json_str(s: &str) -> String {
    let mut o = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// The CUDA launch of kernel `kernel`'s preferred variant (its first), if it has one.
fn launch_of(p: &Program, kernel: u32) -> Option<kiln_module::program::Launch> {
    let v = p.kernels.get(kernel as usize)?.variants.first()?;
    p.executables.get(v.executable as usize)?.launches.get(v.entry as usize).copied()
}

/// A kernel's variants for a dispatch line, where it has several: each condition, its
/// own workgroup count where it has one, `*` on the one this host takes
/// (` variants: x86-64-v4*(x25) | x86-64-v3`).
fn variants_text(p: &Program, info: &LayoutInfo, kernel: u32) -> String {
    let Some(k) = p.kernels.get(kernel as usize) else { return String::new() };
    if k.variants.len() < 2 {
        return String::new();
    }
    let taken = info.host.as_ref().and_then(|h| h.taken(kernel as usize));
    let each: Vec<String> = k
        .variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let star = if taken == Some(i) { "*" } else { "" };
            let wg = if v.workgroups != 0 { format!("(x{})", v.workgroups) } else { String::new() };
            format!("{}{star}{wg}", condition_name(&v.condition))
        })
        .collect();
    format!(" variants: {}", each.join(" | "))
}

/// The summary of a CPU artifact's variants: per executable, its level and how many
/// kernels this host runs from it, and for those it passes over, what the host lacks.
fn variants_summary(p: &Program, info: &LayoutInfo) -> String {
    let mut s = String::new();
    if !p.kernels.iter().any(|k| k.variants.len() > 1) {
        return s;
    }
    let Some(h) = &info.host else { return s };
    let _ = writeln!(s, "variants: this host has {}", level_name(h.features));
    for (xi, x) in p.executables.iter().enumerate() {
        if x.device != DeviceKind::Cpu {
            continue;
        }
        let has = p.kernels.iter().filter(|k| k.variants.iter().any(|v| v.executable as usize == xi)).count();
        let runs = p
            .kernels
            .iter()
            .enumerate()
            .filter(|(ki, k)| h.taken(*ki).and_then(|v| k.variants.get(v)).is_some_and(|v| v.executable as usize == xi))
            .count();
        let missing = x.features & !h.features;
        let why = if missing == 0 {
            format!("this host runs {runs} of them")
        } else {
            format!("passed over: this host lacks {}", features(missing).join(" "))
        };
        let _ =
            writeln!(s, "  executable {xi}: {}, {} bytes, {has} kernels; {why}", level_name(x.features), x.code.len());
    }
    if let Err(e) = &h.taken {
        let _ = writeln!(s, "  this host cannot load it: {e}");
    }
    s
}

/// A kernel's variants as JSON: condition, what it needs and this host lacks, its own
/// workgroups, and whether this host takes it.
fn variants_json(p: &Program, info: &LayoutInfo, kernel: u32) -> String {
    let Some(k) = p.kernels.get(kernel as usize) else { return String::new() };
    let h = info.host.as_ref();
    let taken = h.and_then(|h| h.taken(kernel as usize));
    let each: Vec<String> = k
        .variants
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let needs = h.and_then(|h| h.needs.get(kernel as usize)?.get(i).copied().flatten());
            let list = |bits: u64| features(bits).iter().map(|f| json_str(f)).collect::<Vec<_>>().join(",");
            let cpu = match (needs, h) {
                (Some(n), Some(h)) => format!(",\"needs\":[{}],\"missing\":[{}]", list(n), list(n & !h.features)),
                _ => String::new(),
            };
            format!(
                "{{\"executable\":{},\"entry\":{},\"condition\":{},\"workgroups\":{}{cpu},\"taken\":{}}}",
                v.executable,
                v.entry,
                json_str(&condition_name(&v.condition)),
                v.workgroups,
                taken == Some(i)
            )
        })
        .collect();
    format!("\"variants\":[{}],", each.join(","))
}

/// The human (or JSON) listing of an artifact.
fn listing(p: &Program, info: &LayoutInfo, json: bool) -> String {
    let mut s = String::new();
    let code: usize = p.executables.iter().map(|e| e.code.len()).sum();
    // A CUDA executable's features say what form its code is, not CPU features.
    let feats: u64 = p.executables.iter().filter(|e| e.device == DeviceKind::Cpu).fold(0, |f, e| f | e.features);
    let cuda = CudaListing::of(p);
    let constants = match &p.constants {
        kiln_module::program::Constants::Embedded(b) => format!("embedded, {} bytes", b.len()),
        kiln_module::program::Constants::External { file, size, hash } => {
            format!("external `{file}`, {size} bytes, hash {hash:016x}")
        }
    };
    if json {
        let _ = write!(
            s,
            "{{\"bytes\":{},\"format\":{},\"abi\":{},",
            info.file_bytes,
            json_str(&info.format),
            json_str(&info.abi)
        );
        let secs: Vec<String> =
            info.sections.iter().map(|(k, n)| format!("{{\"kind\":{},\"bytes\":{n}}}", json_str(k))).collect();
        let _ = write!(s, "\"sections\":[{}],", secs.join(","));
        let f: Vec<String> = features(feats).iter().map(|f| json_str(f)).collect();
        let constants = match &p.constants {
            kiln_module::program::Constants::Embedded(b) => format!("{{\"embedded\":true,\"bytes\":{}}}", b.len()),
            kiln_module::program::Constants::External { file, size, hash } => {
                format!("{{\"embedded\":false,\"bytes\":{size},\"file\":{},\"hash\":\"{hash:016x}\"}}", json_str(file))
            }
        };
        let _ = write!(s, "\"cpu_features\":[{}],\"code_bytes\":{code},\"constants\":{constants},", f.join(","));
        if let Some(h) = &info.host {
            let hf: Vec<String> = features(h.features).iter().map(|f| json_str(f)).collect();
            let error = match &h.taken {
                Ok(_) => "null".to_string(),
                Err(e) => json_str(e),
            };
            let _ = write!(
                s,
                "\"host\":{{\"cpu_features\":[{}],\"loads\":{},\"error\":{error}}},",
                hf.join(","),
                h.taken.is_ok()
            );
        }
        let _ = write!(s, "{}", cuda.json(p));
        let mut entries = Vec::new();
        for e in &p.entries {
            let tensors = |ts: &[kiln_module::program::TensorDesc]| -> String {
                ts.iter()
                    .map(|t| {
                        format!(
                            "{{\"name\":{},\"dtype\":{},\"dims\":{:?},\"bytes\":{}}}",
                            json_str(&t.name),
                            json_str(&dtype_name(t.dtype)),
                            t.dims,
                            t.bytes
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let cmds: Vec<String> = e
                .commands
                .iter()
                .map(|c| match c {
                    Command::Dispatch { kernel, device, workgroups, bindings, work_ns, .. } => format!(
                        "{{\"op\":\"dispatch\",\"kernel\":{},{}\"class\":{},\"workgroups\":{workgroups},\"work_ns\":{work_ns},{}{}\"bindings\":[{}]}}",
                        json_str(&p.kernels.get(*kernel as usize).map(|k| k.name.clone()).unwrap_or_default()),
                        // On a plan over several devices, where the dispatch runs.
                        match p.devices.get(*device as usize) {
                            Some(d) if p.devices.len() > 1 => format!("\"device\":{device},\"affinity\":{},", json_str(&d.name)),
                            _ => String::new(),
                        },
                        json_str(p.kernels.get(*kernel as usize).and_then(|k| k.class).map_or("unknown", KernelClass::name)),
                        launch_of(p, *kernel)
                            .map(|l| format!("\"block\":{},\"shared\":{},", l.block, l.shared))
                            .unwrap_or_default(),
                        variants_json(p, info, *kernel),
                        bindings.iter().map(json_binding).collect::<Vec<_>>().join(",")
                    ),
                    Command::Barrier => "{\"op\":\"barrier\"}".into(),
                    Command::Copy { src, dst } => format!(
                        "{{\"op\":\"copy\",\"src\":{},\"dst\":{},\"bytes\":{}}}",
                        json_binding(src),
                        json_binding(dst),
                        src.length
                    ),
                    Command::Fill { dst, pattern, pattern_len } => format!(
                        "{{\"op\":\"fill\",\"dst\":{},\"bytes\":{},\"pattern\":{pattern},\"pattern_len\":{pattern_len}}}",
                        json_binding(dst),
                        dst.length
                    ),
                    Command::AllReduce { parts, .. } | Command::AllGather { parts, .. } => format!(
                        "{{\"op\":\"{}\",{}\"parts\":[{}]}}",
                        if matches!(c, Command::AllReduce { .. }) { "all-reduce" } else { "all-gather" },
                        match c {
                            Command::AllReduce { dtype, .. } => format!("\"dtype\":{},", json_str(&dtype_name(*dtype))),
                            Command::AllGather { outer, .. } => format!("\"outer\":{outer},"),
                            _ => String::new(),
                        },
                        parts
                            .iter()
                            .map(|x| format!(
                                "{{\"device\":{},\"src\":{},\"dst\":{}}}",
                                x.device,
                                json_binding(&x.src),
                                json_binding(&x.dst)
                            ))
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                    Command::SkipIf { cond, value, count } => format!(
                        "{{\"op\":\"skip_if\",\"cond\":{},\"value\":{value},\"count\":{count}}}",
                        json_binding(cond)
                    ),
                    Command::Segment { device, count, waits } => format!(
                        "{{\"op\":\"segment\",\"device\":{device},\"count\":{count},\"waits\":{waits:?}}}"
                    ),
                    Command::Transfer { src_device, src, dst_device, dst } => format!(
                        "{{\"op\":\"transfer\",\"src_device\":{src_device},\"src\":{},\"dst_device\":{dst_device},\"dst\":{}}}",
                        json_binding(src),
                        json_binding(dst)
                    ),
                })
                .collect();
            let bufs: Vec<String> = e
                .buffers
                .iter()
                .map(|b| {
                    format!(
                        "{{\"name\":{},\"at\":{},\"bytes\":{},\"first\":{},\"last\":{}}}",
                        json_str(&b.name),
                        json_binding(&b.binding),
                        b.binding.length,
                        b.first,
                        b.last
                    )
                })
                .collect();
            entries.push(format!(
                "{{\"name\":{},\"inputs\":[{}],\"outputs\":[{}],\"arena_bytes\":{},\"prologue\":{},\"commands\":[{}],\"buffers\":[{}]}}",
                json_str(&e.name),
                tensors(&e.inputs),
                tensors(&e.outputs),
                e.arena_size,
                e.prologue,
                cmds.join(","),
                bufs.join(",")
            ));
        }
        let _ = writeln!(s, "\"entries\":[{}]}}", entries.join(","));
        return s;
    }
    if info.file_bytes > 0 {
        let _ =
            writeln!(s, "artifact: {} bytes, format {}, needs runtime ABI {}", info.file_bytes, info.format, info.abi);
        let _ = writeln!(s, "sections:");
        for (k, n) in &info.sections {
            let _ = writeln!(s, "  {k:<18} {n:>10} bytes");
        }
    }
    if cuda.executables.is_empty() {
        let _ = writeln!(s, "code: {code} bytes; cpu features: {}", features(feats).join(" "));
        s.push_str(&variants_summary(p, info));
    } else {
        s.push_str(&cuda.text(p));
    }
    let _ = writeln!(s, "constants: {constants}");
    if p.devices.len() > 1 {
        let names: Vec<&str> = p.devices.iter().map(|d| d.name.as_str()).collect();
        let _ = writeln!(s, "devices: {} ({})", p.devices.len(), names.join(", "));
    }
    for e in &p.entries {
        let _ = writeln!(s, "entry {}:", e.name);
        for (what, ts) in [("input", &e.inputs), ("output", &e.outputs)] {
            for t in ts {
                let _ = writeln!(s, "  {what} {} {}{:?} ({} bytes)", t.name, dtype_name(t.dtype), t.dims, t.bytes);
            }
        }
        let dispatches = e.commands.iter().filter(|c| matches!(c, Command::Dispatch { .. })).count();
        let barriers = e.commands.iter().filter(|c| matches!(c, Command::Barrier)).count();
        let _ = writeln!(
            s,
            "  plan: {} commands, {dispatches} dispatches in {} waves, {barriers} barriers; arena {} bytes",
            e.commands.len(),
            barriers + 1,
            e.arena_size
        );
        if e.prologue > 0 {
            let n = e.commands[..(e.prologue as usize).min(e.commands.len())]
                .iter()
                .filter(|c| matches!(c, Command::Dispatch { .. } | Command::Fill { .. } | Command::Copy { .. }))
                .count();
            let _ = writeln!(
                s,
                "  prologue: commands 0..{} ({n} dispatches, fills and copies) depend on no input and run once per instance",
                e.prologue - 1
            );
        }
        let mut wave = 0;
        for (i, c) in e.commands.iter().enumerate() {
            if i == e.prologue as usize && i > 0 {
                let _ = writeln!(s, "       -- end of the prologue: each call starts here --");
            }
            match c {
                Command::Dispatch { kernel, device, workgroups, bindings, work_ns, .. } => {
                    let name = p.kernels.get(*kernel as usize).map(|k| k.name.as_str()).unwrap_or("?");
                    let class =
                        p.kernels.get(*kernel as usize).and_then(|k| k.class).map_or("unknown", KernelClass::name);
                    let b: Vec<String> = bindings.iter().map(|b| format!("{}:{}", slot_name(b), b.length)).collect();
                    let src = p
                        .debug
                        .as_ref()
                        .and_then(|d| d.kernel_sources.get(*kernel as usize))
                        .map(|s| format!("  // {s}"))
                        .unwrap_or_default();
                    let est = if *work_ns == 0 { String::new() } else { format!(" ~{:.1}us", *work_ns as f64 / 1e3) };
                    // A CUDA launch: blocks of `block` threads (and dynamic shared memory).
                    let launch = launch_of(p, *kernel)
                        .map(|l| match l.shared {
                            0 => format!(" block {}", l.block),
                            sh => format!(" block {} shared {sh} B", l.block),
                        })
                        .unwrap_or_default();
                    // On a plan over several devices, the device each dispatch runs on.
                    let on = match p.devices.get(*device as usize) {
                        Some(d) if p.devices.len() > 1 => format!(" on {}", d.name),
                        _ => String::new(),
                    };
                    let _ = writeln!(
                        s,
                        "  {i:>4} w{wave:<3} dispatch {name} ({class}){on} x{workgroups}{launch}{est}{} [{}]{src}",
                        variants_text(p, info, *kernel),
                        b.join(", ")
                    );
                }
                Command::Barrier => {
                    wave += 1;
                    let _ = writeln!(s, "  {i:>4}      barrier");
                }
                Command::Copy { src, dst } => {
                    let _ = writeln!(
                        s,
                        "  {i:>4}      copy {} -> {} ({} bytes)",
                        slot_name(src),
                        slot_name(dst),
                        src.length
                    );
                }
                Command::Fill { dst, pattern, pattern_len } => {
                    let _ = writeln!(
                        s,
                        "  {i:>4}      fill {} ({} bytes) with {pattern:#x}/{pattern_len}",
                        slot_name(dst),
                        dst.length
                    );
                }
                Command::AllReduce { parts, .. } | Command::AllGather { parts, .. } => {
                    let what = match c {
                        Command::AllReduce { dtype, .. } => format!("all-reduce sum {}", dtype_name(*dtype)),
                        Command::AllGather { outer, .. } => format!("all-gather in {outer} blocks"),
                        _ => String::new(),
                    };
                    let bytes = parts.first().map_or(0, |x| x.src.length);
                    let _ = writeln!(s, "  {i:>4}      {what} over {} devices ({bytes} bytes each)", parts.len());
                    for x in parts {
                        let dev = p.devices.get(x.device as usize).map_or("?", |d| d.name.as_str());
                        let _ = writeln!(s, "              {dev}: {} -> {}", slot_name(&x.src), slot_name(&x.dst));
                    }
                }
                Command::SkipIf { cond, value, count } => {
                    let _ = writeln!(
                        s,
                        "  {i:>4}      skip {count} (to {}) if {} is {value}",
                        i + 1 + *count as usize,
                        slot_name(cond)
                    );
                }
                Command::Segment { device, count, waits } => {
                    let dev = p.devices.get(*device as usize).map_or("?", |d| d.name.as_str());
                    let _ = writeln!(s, "  {i:>4}  segment on {dev}: {count} commands, waits for segments {waits:?}");
                }
                Command::Transfer { src_device, src, dst_device, dst } => {
                    let name = |d: &u32| p.devices.get(*d as usize).map_or("?", |d| d.name.as_str());
                    let _ = writeln!(
                        s,
                        "  {i:>4}      transfer {}:{} -> {}:{} ({} bytes)",
                        name(src_device),
                        slot_name(src),
                        name(dst_device),
                        slot_name(dst),
                        src.length
                    );
                }
            }
        }
        let _ = writeln!(s, "  memory map (offset, bytes, live commands, name):");
        for b in &e.buffers {
            let _ = writeln!(
                s,
                "    {:<16} {:>10}  {:>4}..{:<4} {}",
                slot_name(&b.binding),
                b.binding.length,
                b.first,
                b.last,
                b.name
            );
        }
        if !e.extents.is_empty() {
            let _ = writeln!(s, "  data-dependent extents (i64, bound, outputs sized along an axis):");
            for x in &e.extents {
                let sized: Vec<String> = x
                    .outputs
                    .iter()
                    .map(|&(o, a)| {
                        let name = e.outputs.get(o as usize).map_or("?", |t| t.name.as_str());
                        format!("{name} axis {a}")
                    })
                    .collect();
                let _ =
                    writeln!(s, "    {:<16} ≤ {:<8} {} [{}]", slot_name(&x.binding), x.bound, x.name, sized.join(", "));
            }
        }
        if !e.bounded.is_empty() {
            let _ = writeln!(s, "  bounded input dimensions (extent chosen per call; staged at the bound):");
            for b in &e.bounded {
                let name = e.inputs.get(b.input as usize).map_or("?", |t| t.name.as_str());
                let _ = writeln!(
                    s,
                    "    {name} axis {}: {}..={} (input at {}, extent at {})",
                    b.axis,
                    b.min,
                    b.bound,
                    slot_name(&b.staging),
                    slot_name(&b.extent)
                );
            }
        }
    }
    s
}

/// Fill colours of the dispatch graph's nodes by device (a plan over several devices).
const DEVICE_COLOURS: [&str; 4] = ["lightblue", "palegreen", "khaki", "lightpink"];

/// The dispatch DAG as DOT: an edge wherever a dispatch reads bytes an earlier one wrote
/// (through transfers between devices too, drawn dashed). On a plan over several devices
/// each node is filled with its device's colour and labelled with its affinity.
fn dispatch_dot(p: &Program) -> String {
    let mut s = String::from("digraph dispatches {\n  node [shape=box];\n");
    let several = p.devices.len() > 1;
    for e in &p.entries {
        // (writer command, device whose memory, range, whether reached by a transfer)
        let mut writers: Vec<(usize, u32, Binding, bool)> = Vec::new();
        let on = |d: u32, b: &Binding| if matches!(b.slot, Slot::Arena) { d } else { 0 };
        for (i, c) in e.commands.iter().enumerate() {
            match c {
                Command::Segment { .. } => continue,
                Command::Transfer { src_device, src, dst_device, dst } => {
                    let from = on(*src_device, src);
                    if let Some(&(w, _, _, _)) =
                        writers.iter().rev().find(|(_, d, o, _)| *d == from && overlaps(o, src))
                    {
                        writers.push((w, on(*dst_device, dst), *dst, true));
                    }
                    continue;
                }
                _ => {}
            }
            let Command::Dispatch { kernel, device, bindings, .. } = c else { continue };
            let name = p.kernels.get(*kernel as usize).map(|k| k.name.as_str()).unwrap_or("?");
            let src =
                p.debug.as_ref().and_then(|d| d.kernel_sources.get(*kernel as usize)).cloned().unwrap_or_default();
            let style = match p.devices.get(*device as usize) {
                Some(d) if several => format!(
                    ", style=filled, fillcolor={}, affinity={}",
                    DEVICE_COLOURS[*device as usize % DEVICE_COLOURS.len()],
                    json_str(&d.name)
                ),
                _ => String::new(),
            };
            let label = if several {
                let dev = p.devices.get(*device as usize).map_or("?", |d| d.name.as_str());
                format!("{name}\\n{src}\\n[{dev}]")
            } else {
                format!("{name}\\n{src}")
            };
            let _ = writeln!(s, "  c{i} [label={}{style}];", json_str(&label).replace("\\\\n", "\\n"));
            let Some((out, ins)) = bindings.split_last() else { continue };
            for b in ins {
                // The latest earlier writer of an overlapping range of the same memory.
                let here = on(*device, b);
                if let Some((w, _, _, moved)) = writers.iter().rev().find(|(_, d, o, _)| *d == here && overlaps(o, b)) {
                    let dash = if *moved { " [style=dashed]" } else { "" };
                    let _ = writeln!(s, "  c{w} -> c{i}{dash};");
                }
            }
            writers.push((i, on(*device, out), *out, false));
        }
    }
    s.push_str("}\n");
    s
}

/// Whether two ranges share a byte. Ends saturate: a verified plan's never overflow,
/// and a range that did would still compare as reaching the end.
fn overlaps(a: &Binding, b: &Binding) -> bool {
    let end = |x: &Binding| x.offset.saturating_add(x.length);
    a.slot == b.slot && a.offset < end(b) && b.offset < end(a)
}

/// The code form of a CUDA executable: `cubin sm_90a`, or `ptx` with the `.target`
/// its header declares (`ptx sm_80`; plain `ptx` where none is found).
fn cuda_form(x: &Executable) -> &'static str {
    if x.features & CUDA_CUBIN_SM90A != 0 {
        return "cubin sm_90a";
    }
    let head = &x.code[..x.code.len().min(64)];
    let target = |t: &str| head.windows(t.len()).any(|w| w == t.as_bytes());
    if target(".target sm_90a\n") {
        "ptx sm_90a"
    } else if target(".target sm_80\n") {
        "ptx sm_80"
    } else {
        "ptx"
    }
}

/// A kernel variant's launch record: threads per block and bytes of dynamic shared
/// memory. The one place `kiln inspect` reads launch records; artifacts of format 1.2
/// record none (their grid is the dispatch's workgroups, listed from the plan), so
/// this gives `None` and the listing says `-`.
fn launch_record(p: &Program, v: &Variant) -> Option<(u32, u32)> {
    p.executables.get(v.executable as usize)?.launches.get(v.entry as usize).map(|l| (l.block, l.shared))
}

/// What `kiln inspect` lists of a CUDA artifact beyond the plan: its executables
/// (PTX, cubin) and, per kernel, its launch and what its cubin says it uses.
struct CudaListing {
    /// The CUDA executables.
    executables: Vec<CudaExecutable>,
}

/// One CUDA executable of an artifact, for listings.
struct CudaExecutable {
    /// Its index in the program.
    index: usize,
    /// Its code form ([`cuda_form`]).
    form: &'static str,
    /// Bytes of code.
    bytes: usize,
    /// Number of entries.
    entries: usize,
    /// Its cubin read back (`None` for PTX; `Some(Err)` for a cubin that cannot be read).
    cubin: Option<Result<ptxas::CubinInfo, ptxas::CubinError>>,
}

impl CudaListing {
    fn of(p: &Program) -> CudaListing {
        let executables = p
            .executables
            .iter()
            .enumerate()
            .filter(|(_, x)| x.device == DeviceKind::Cuda)
            .map(|(i, x)| {
                let cubin = (x.features & CUDA_CUBIN_SM90A != 0).then(|| ptxas::read_cubin(&x.code));
                CudaExecutable { index: i, form: cuda_form(x), bytes: x.code.len(), entries: x.entries.len(), cubin }
            })
            .collect();
        CudaListing { executables }
    }

    /// What the cubin says of kernel `k` (through its first variant whose executable
    /// is a readable cubin).
    fn resources(&self, p: &Program, k: &kiln_module::program::Kernel) -> Option<ptxas::CubinKernel> {
        k.variants.iter().find_map(|v| {
            let Some(Ok(info)) = &self.executables.iter().find(|e| e.index == v.executable as usize)?.cubin else {
                return None;
            };
            let (name, _) = p.executables.get(v.executable as usize)?.entries.get(v.entry as usize)?;
            info.kernel(name).cloned()
        })
    }

    /// The forms of `k`'s variants in order of preference (`cubin sm_90a, ptx`).
    fn variants(p: &Program, k: &kiln_module::program::Kernel) -> Vec<&'static str> {
        // (A heterogeneous plan's host kernels are CPU code.)
        k.variants
            .iter()
            .map(|v| match p.executables.get(v.executable as usize) {
                Some(x) if x.device == DeviceKind::Cpu => "cpu",
                Some(x) => cuda_form(x),
                None => "?",
            })
            .collect()
    }

    /// The distinct workgroup counts (grids) of `kernel`'s dispatches, in plan order.
    fn grids(p: &Program, kernel: usize) -> Vec<u64> {
        let mut grids = Vec::new();
        for e in &p.entries {
            for c in &e.commands {
                if let Command::Dispatch { kernel: k, workgroups, .. } = c {
                    if *k as usize == kernel && !grids.contains(workgroups) {
                        grids.push(*workgroups);
                    }
                }
            }
        }
        grids
    }

    fn text(&self, p: &Program) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "code (cuda):");
        for CudaExecutable { index: i, form, bytes, entries, cubin } in &self.executables {
            let read = match cubin {
                None => String::new(),
                Some(Ok(c)) => format!(", sm_{} ELF with {} kernels", c.sm, c.kernels.len()),
                Some(Err(e)) => format!(", unreadable: {e}"),
            };
            let _ = writeln!(s, "  executable {i}: {form:<12} {bytes:>10} bytes, {entries} entries{read}");
        }
        let _ = writeln!(
            s,
            "kernels (grid = the dispatch's blocks; block, dynamic shared from the launch record; regs, smem, stack from the cubin):"
        );
        let _ = writeln!(
            s,
            "  {:<14} {:<11} {:>8} {:>6} {:>8} {:>5} {:>7} {:>6}  variants",
            "kernel", "class", "grid", "block", "dynsmem", "regs", "smem", "stack"
        );
        let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        for (ki, k) in p.kernels.iter().enumerate() {
            let grids: Vec<String> = Self::grids(p, ki).iter().map(u64::to_string).collect();
            let launch = k.variants.first().and_then(|v| launch_record(p, v));
            let r = self.resources(p, k);
            let _ = writeln!(
                s,
                "  {:<14} {:<11} {:>8} {:>6} {:>8} {:>5} {:>7} {:>6}  {}",
                k.name,
                k.class.map_or("unknown", KernelClass::name),
                if grids.is_empty() { "-".into() } else { grids.join(",") },
                dash(launch.map(|l| l.0.to_string())),
                dash(launch.map(|l| l.1.to_string())),
                dash(r.as_ref().and_then(|r| r.registers).map(|n| n.to_string())),
                dash(r.as_ref().map(|r| r.shared.to_string())),
                dash(r.as_ref().and_then(|r| r.frame).map(|n| n.to_string())),
                Self::variants(p, k).join(", ")
            );
        }
        s
    }

    /// `"cuda":{"executables":[…],"kernels":[…]},` (nothing for a CPU artifact).
    fn json(&self, p: &Program) -> String {
        if self.executables.is_empty() {
            return String::new();
        }
        let num = |v: Option<u64>| v.map_or("null".into(), |n| n.to_string());
        let xs: Vec<String> = self
            .executables
            .iter()
            .map(|CudaExecutable { index: i, form, bytes, entries, cubin }| {
                let error = match cubin {
                    Some(Err(e)) => format!(",\"error\":{}", json_str(&e.to_string())),
                    _ => String::new(),
                };
                format!("{{\"index\":{i},\"form\":{},\"bytes\":{bytes},\"entries\":{entries}{error}}}", json_str(form))
            })
            .collect();
        let ks: Vec<String> = p
            .kernels
            .iter()
            .enumerate()
            .map(|(ki, k)| {
                let launch = k.variants.first().and_then(|v| launch_record(p, v));
                let r = self.resources(p, k);
                let variants: Vec<String> = Self::variants(p, k).iter().map(|f| json_str(f)).collect();
                format!(
                    "{{\"name\":{},\"grid\":{:?},\"block\":{},\"dynamic_shared\":{},\"registers\":{},\"shared\":{},\"stack\":{},\"variants\":[{}]}}",
                    json_str(&k.name),
                    Self::grids(p, ki),
                    num(launch.map(|l| u64::from(l.0))),
                    num(launch.map(|l| u64::from(l.1))),
                    num(r.as_ref().and_then(|r| r.registers).map(u64::from)),
                    num(r.as_ref().map(|r| r.shared)),
                    num(r.as_ref().and_then(|r| r.frame).map(u64::from)),
                    variants.join(",")
                )
            })
            .collect();
        format!("\"cuda\":{{\"executables\":[{}],\"kernels\":[{}]}},", xs.join(","), ks.join(","))
    }
}
