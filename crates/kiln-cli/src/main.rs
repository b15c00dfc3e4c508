//! `kiln`: the command-line front door.
//!
//! The grammar is in [`args`] (clap, derive): `compile`, `run`, `inspect`, `bench`
//! ([`artifact`]), `import` (the tensor-level IR of a model), `eval` (the reference
//! evaluator), `conformance`, `list-passes` and `completions`; `kiln CMD --help` describes
//! each with examples, `kiln --version` prints the compiler, artifact format and kernel ABI
//! versions.
//!
//! MODEL is an ONNX file, or a file in kiln's IR text form (`.kir`).
//! Errors (kiln's own and usage errors alike) are one line on stderr and exit status 1;
//! `--help` and `--version` exit 0.

mod args;
mod artifact;
mod conformance;
mod embed;
mod floor;
mod gpu;

/// With the `mimalloc` feature, every allocation of the process (import, compile, the
/// runtime's load) goes to mimalloc instead of the C library's allocator.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use args::Cmd;
use clap::{CommandFactory, Parser};
use kiln_import::ImportOptions;
use kiln_ir::{npy, DType, Graph, Shape, Tensor};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

fn main() -> ExitCode {
    let cli = match args::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                // Help and version go to stdout; a closed pipe is not an error.
                let _ = write_stdout(&e.render().to_string());
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                eprintln!("error: no command given (kiln --help lists the commands)");
                return ExitCode::FAILURE;
            }
            // A usage error: one line, like kiln's own errors, and where to look: the
            // first paragraph of clap's message (it puts missing arguments on lines of
            // their own), and the command's --help when the command is known.
            let text = e.render().to_string();
            let first: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            let first = first.join(" ");
            let first = first.trim_start_matches("error: ");
            let cmd = std::env::args()
                .nth(1)
                .filter(|c| args::Cli::command().find_subcommand(c).is_some())
                .map(|c| format!("{c} "))
                .unwrap_or_default();
            eprintln!("error: {first} (kiln {cmd}--help shows the usage)");
            return ExitCode::FAILURE;
        }
    };
    match run(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--passes`: `default` for every pass in pipeline order, else a comma-separated list.
fn passes(p: Option<String>) -> Vec<String> {
    match p.as_deref() {
        None => Vec::new(),
        Some("default") => kiln_opt::registry().iter().map(|p| p.name().to_string()).collect(),
        Some(v) => v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
    }
}

fn import_options(b: args::BindArgs) -> ImportOptions {
    ImportOptions {
        bounded_dims: b
            .input_shape
            .iter()
            .flat_map(|(n, _, r)| r.iter().map(move |&(axis, min)| (n.clone(), axis, min)))
            .collect(),
        input_shapes: b.input_shape.into_iter().map(|(n, d, _)| (n, d)).collect(),
        input_values: b.input_value,
        max_trips: b.max_trips,
        input_sequences: b.input_sequence,
        absent_inputs: b.input_absent,
        max_dims: b.max_dim,
        output_shapes: b.output_shape,
    }
}

/// The shared options of compile, run, inspect and bench, from one command's arguments:
/// the base of that command's `artifact::Args` (`..model_options(m)?`).
fn model_options(m: args::ModelArgs) -> Result<artifact::Args, String> {
    let size = match m.opt.as_deref() {
        None | Some("speed") => false,
        Some("size") => true,
        Some(other) => return Err(format!("--opt `{other}`: expected speed or size")),
    };
    let precision = precision_of(m.precision.as_deref())?;
    Ok(artifact::Args {
        import: import_options(m.bind),
        target: m.target_cpu,
        triple: m.target_triple,
        device: m.target,
        cubin: match m.cubin {
            args::Cubin::Auto => kiln_compiler::ptxas::CubinMode::Auto,
            args::Cubin::Off => kiln_compiler::ptxas::CubinMode::Off,
            args::Cubin::Require => kiln_compiler::ptxas::CubinMode::Require,
        },
        cuda_archs: match m.cuda_arch.as_deref() {
            None => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|a| kiln_compiler::CudaTargetArch::parse(a).map_err(|e| format!("--cuda-arch: {e}")))
                .collect::<Result<_, _>>()?,
        },
        size,
        precision,
        fused_attention: !m.no_fuse_attention,
        ..Default::default()
    })
}

/// `--precision` (f32 when absent).
fn precision_of(p: Option<&str>) -> Result<kiln_compiler::Precision, String> {
    match p {
        None => Ok(kiln_compiler::Precision::F32),
        Some(p) => kiln_compiler::Precision::from_name(p)
            .ok_or_else(|| format!("--precision `{p}`: expected f32, f16 or bf16")),
    }
}

/// `--device` of `run` and `bench`, and what it means for a model compiled in memory:
/// `cuda` compiles for CUDA unless `--target` says otherwise (which is an error).
fn run_device(device: Option<String>, base: &mut artifact::Args) -> Result<(), String> {
    match device.as_deref() {
        None | Some("cpu") => Ok(()),
        Some("cuda") => {
            match base.device.as_deref() {
                None | Some("cuda") => base.device = Some("cuda".into()),
                Some(t) => return Err(format!("--target {t} compiles for another device than --device cuda runs on")),
            }
            base.run_on = artifact::RunDevice::Cuda;
            Ok(())
        }
        Some(d) => Err(format!("--device `{d}`: expected cpu or cuda")),
    }
}

/// A count as a `usize` (saturating: no machine holds more of anything).
fn count(n: Option<u64>) -> Option<usize> {
    n.map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// `--threads`: at least one.
fn thread_count(n: Option<u64>) -> Result<Option<usize>, String> {
    match n {
        Some(0) => Err("--threads 0: at least one thread is needed".into()),
        n => Ok(count(n)),
    }
}

fn run(cmd: Cmd) -> Result<(), String> {
    match cmd {
        Cmd::ListPasses => {
            for p in kiln_opt::registry() {
                write_stdout(&format!("{:<40} {}\n", p.name(), p.summary()))?;
            }
            Ok(())
        }
        Cmd::Import(i) => {
            let mut g = load(&i.model, &import_options(i.bind))?;
            optimise(&mut g, &passes(i.passes))?;
            write_stdout(&kiln_ir::text::print(&g))
        }
        Cmd::Eval(e) => eval(Eval {
            model: e.model,
            opts: import_options(e.bind),
            inputs: e.feed.input,
            output_dir: e.output_dir,
            seed: e.feed.seed,
            passes: passes(e.passes),
        }),
        Cmd::Compile(c) => artifact::compile_cmd(artifact::Args {
            model: c.model,
            output: c.output,
            external_weights: c.external_weights,
            strip: c.strip,
            to: c.to,
            dump_after: c.dump_after,
            list_passes: c.list_passes,
            timings: c.timings,
            emit: c.emit,
            symbol: c.symbol,
            devices: match c.devices.as_deref().map(str::parse::<u32>) {
                Some(Ok(n)) => Some(n),
                _ => None,
            },
            hetero: c.devices.filter(|d| d.parse::<u32>().is_err()),
            place: c.place,
            ..model_options(c.model_args)?
        }),
        Cmd::Run(r) => {
            let mut a = artifact::Args {
                model: Some(r.model),
                weights: r.weights,
                inputs: r.feed.input,
                extents: r.feed.extent,
                seed: r.feed.seed,
                output_dir: r.output_dir,
                threads: thread_count(r.threads)?,
                ..model_options(r.model_args)?
            };
            run_device(r.device, &mut a)?;
            artifact::run_cmd(a)
        }
        Cmd::Inspect(i) => artifact::inspect_cmd(artifact::Args {
            model: Some(i.model),
            json: i.json,
            dispatch_graph: i.dispatch_graph,
            ..model_options(i.model_args)?
        }),
        Cmd::Bench(b) => {
            if b.iterations == 0 {
                return Err("--iterations 0: at least one timed iteration is needed".into());
            }
            let mut a = artifact::Args {
                model: Some(b.model),
                weights: b.weights,
                inputs: b.feed.input,
                extents: b.feed.extent,
                seed: b.feed.seed,
                threads: thread_count(b.threads)?,
                warmup: Some(b.warmup),
                iterations: count(Some(b.iterations)),
                json: b.json,
                samples: b.samples,
                floor: b.floor || b.floor_passes.is_some(),
                floor_passes: b.floor_passes,
                profile: b.profile,
                resident: b.resident,
                ..model_options(b.model_args)?
            };
            run_device(b.device, &mut a)?;
            artifact::bench_cmd(a)
        }
        Cmd::GpuCheck(g) => gpu::check_cmd(
            &artifact::Args {
                model: Some(g.model),
                import: import_options(g.bind),
                inputs: g.feed.input,
                seed: g.feed.seed,
                precision: precision_of(g.precision.as_deref())?,
                ..Default::default()
            },
            g.dispatch,
            g.ulps,
        ),
        Cmd::Conformance(c) => conformance_cmd(c),
        Cmd::ConformanceCase { case, engine } => {
            let o = conformance::run_case_caught(&case, engine_of(engine));
            write_stdout(&format!("{}\n", conformance::encode(&o)))
        }
        Cmd::Completions { shell } => {
            let mut text = Vec::new();
            clap_complete::generate(shell, &mut args::Cli::command(), "kiln", &mut text);
            write_stdout(&String::from_utf8_lossy(&text))
        }
    }
}

fn engine_of(e: args::Engine) -> conformance::Engine {
    match e {
        args::Engine::Compiled => conformance::Engine::Compiled,
        args::Engine::Reference => conformance::Engine::Reference,
        args::Engine::Cuda => conformance::Engine::Cuda,
    }
}

/// `kiln conformance DIR`: runs every ONNX node test case under DIR, each in a child
/// process, `--jobs` at a time (default: the number of CPUs), printing results in order.
fn conformance_cmd(c: args::ConformanceArgs) -> Result<(), String> {
    let engine = match (c.device.as_deref(), c.engine) {
        (None | Some("cpu"), e) => engine_of(e),
        (Some("cuda"), args::Engine::Compiled | args::Engine::Cuda) => {
            // Every case would fail the same way: say it once.
            gpu::require_driver()?;
            conformance::Engine::Cuda
        }
        (Some("cuda"), args::Engine::Reference) => {
            return Err("--device cuda runs the compiled engine; the reference evaluator runs on the CPU".into())
        }
        (Some(d), _) => return Err(format!("--device `{d}`: expected cpu or cuda")),
    };
    let (dir, filter, verbose) = (c.dir, c.filter, c.verbose);
    let jobs = c.jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1);
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the kiln binary: {e}"))?;
    let cases: Vec<PathBuf> = conformance::cases(&dir)?
        .into_iter()
        .filter(|c| c.file_name().is_some_and(|n| n.to_string_lossy().contains(&filter)))
        .collect();
    // Each case's line goes to stdout as soon as it finishes (in the order they finish),
    // so a run cut short still says what it found; the summary comes last. Progress on
    // stderr every 100 cases.
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = std::time::Instant::now();
    let tally: std::sync::Mutex<(usize, std::collections::BTreeMap<&'static str, usize>, Option<String>)> =
        std::sync::Mutex::new((0, Default::default(), None));
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let outcome = conformance::run_case_isolated(&exe, case, engine, std::time::Duration::from_secs(60));
                let name = case.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                let Ok(mut t) = tally.lock() else { break };
                let (done, counts, failed) = &mut *t;
                *done += 1;
                *counts.entry(outcome.category()).or_default() += 1;
                if verbose || !matches!(outcome, conformance::Outcome::Pass | conformance::Outcome::PassSpecialised) {
                    if let Err(e) = write_stdout(&format!("{name}: {outcome}\n")) {
                        failed.get_or_insert(e);
                    }
                }
                if *done % 100 == 0 {
                    eprintln!("{done} of {} cases done after {:.0} s", cases.len(), start.elapsed().as_secs_f64());
                }
            });
        }
    });
    let (done, counts, failed) = tally.into_inner().map_err(|_| "a conformance worker panicked".to_string())?;
    if let Some(e) = failed {
        return Err(e);
    }
    if done != cases.len() {
        return Err(format!("{done} of {} cases reported a result", cases.len()));
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    write_stdout(&format!("{} cases (engine: {}): {}\n", cases.len(), engine.name(), summary.join(", ")))?;
    Ok(())
}

/// Writes to stdout; a closed pipe (`kiln import m.onnx | head`) is not an error.
pub(crate) fn write_stdout(text: &str) -> Result<(), String> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("cannot write to stdout: {e}")),
        _ => Ok(()),
    }
}

/// Runs the `--passes` (none by default).
fn optimise(g: &mut Graph, passes: &[String]) -> Result<(), String> {
    let names: Vec<&str> = passes.iter().map(String::as_str).collect();
    kiln_opt::run_passes(g, &names).map_err(|e| e.to_string())
}

/// Loads an ONNX model or an IR text file: the compiler's import stage on its own.
fn load(path: &Path, opts: &ImportOptions) -> Result<Graph, String> {
    kiln_compiler::import(kiln_compiler::Input::File(path.to_path_buf()), opts).map_err(|e| e.to_string())
}

/// What `kiln eval` runs.
struct Eval {
    model: PathBuf,
    opts: ImportOptions,
    inputs: Vec<(String, PathBuf)>,
    output_dir: Option<PathBuf>,
    seed: u64,
    passes: Vec<String>,
}

/// `t` with its extent along `axis` made `n`: cut to its first `n` positions, or
/// zero-padded to `n` (row-major; whole bytes per element).
fn resize_along(t: &Tensor, axis: usize, n: usize) -> Result<Tensor, String> {
    let dims = t.ty().shape.dims().to_vec();
    let numel: usize = dims.iter().product();
    let bytes = t.bytes();
    let elem = if numel == 0 { 0 } else { bytes.len() / numel };
    let outer: usize = dims[..axis].iter().product();
    let row = dims[axis + 1..].iter().product::<usize>() * elem;
    let (m, keep) = (dims[axis], dims[axis].min(n));
    let mut out = vec![0u8; outer * n * row];
    for r in 0..outer {
        out[r * n * row..(r * n + keep) * row].copy_from_slice(&bytes[r * m * row..(r * m + keep) * row]);
    }
    let mut d = dims;
    d[axis] = n;
    let shape = kiln_ir::Shape::new(d).map_err(|e| e.to_string())?;
    Tensor::new(kiln_ir::TensorType::new(t.ty().dtype, shape), out.into()).map_err(|e| e.to_string())
}

fn eval(cli: Eval) -> Result<(), String> {
    let path = cli.model.clone();
    let t0 = Instant::now();
    let mut g = load(&path, &cli.opts)?;
    optimise(&mut g, &cli.passes)?;
    let t_import = t0.elapsed();
    for (n, _) in &cli.inputs {
        if !g.inputs.iter().any(|&v| g.values[v].name == *n) {
            let names: Vec<String> = g.inputs.iter().map(|&v| format!("`{}`", g.values[v].name)).collect();
            return Err(format!("--input `{n}`: the model has no such input; its inputs are: {}", names.join(", ")));
        }
    }
    // Bounded input dimensions (kiln_ir::bounded, docs/bounded-shapes.md): the reference
    // runs what the plan runs, the masked graph at the bound with each bounded input
    // zero-padded and its extent fed, and cuts the outputs carrying the dimension.
    let mut out_axes: Vec<Option<(usize, usize)>> = Vec::new();
    if !g.bounded.is_empty() {
        use kiln_ir::entity::EntityId;
        kiln_ir::bounded::analyse(&g).map_err(|e| format!("{}: {e}", path.display()))?;
        g = kiln_ir::bounded::mask(&g);
        let axes = kiln_ir::bounded::analyse_with(&g, false).map_err(|e| e.to_string())?;
        out_axes = g.outputs.iter().map(|o| axes[o.index()].first().copied()).collect();
    }
    let mut extents: Vec<usize> = g.bounded.iter().map(|b| b.bound).collect();
    let mut rng = SplitMix(cli.seed);
    let mut feeds = Vec::new();
    for (i, &v) in g.inputs.iter().enumerate() {
        let val = &g.values[v];
        if g.bounded.iter().any(|b| b.extent == i) {
            // Filled below, once every bounded input is read.
            feeds.push(Tensor::scalar(0i64));
            continue;
        }
        let t = match cli.inputs.iter().find(|(n, _)| *n == val.name) {
            Some((_, file)) if g.bounded.iter().any(|b| b.input == i) => {
                let (k, b) = g.bounded.iter().enumerate().find(|(_, b)| b.input == i).ok_or("bounded input")?;
                let bytes = std::fs::read(file).map_err(|e| format!("cannot read `{}`: {e}", file.display()))?;
                let t = npy::read_typed(&bytes, Some(val.ty.dtype)).map_err(|e| format!("{}: {e}", file.display()))?;
                let (td, vd) = (t.ty().shape.dims(), val.ty.shape.dims());
                let n = td.get(b.axis).copied().unwrap_or(0);
                let fits = t.ty().dtype == val.ty.dtype
                    && td.len() == vd.len()
                    && td.iter().zip(vd).enumerate().all(|(a, (x, y))| a == b.axis || x == y);
                if !fits || n < b.min || n > b.bound {
                    return Err(format!(
                        "input `{}`: {} holds {}, the model takes {} with axis {} in {}..={}",
                        val.name,
                        file.display(),
                        t.ty(),
                        val.ty,
                        b.axis,
                        b.min,
                        b.bound
                    ));
                }
                extents[k] = n;
                resize_along(&t, b.axis, b.bound)?
            }
            Some((_, file)) => {
                let bytes = std::fs::read(file).map_err(|e| format!("cannot read `{}`: {e}", file.display()))?;
                let t = npy::read_typed(&bytes, Some(val.ty.dtype)).map_err(|e| format!("{}: {e}", file.display()))?;
                if t.ty() != &val.ty {
                    return Err(format!(
                        "input `{}`: {} holds {}, the model expects {}",
                        val.name,
                        file.display(),
                        t.ty(),
                        val.ty
                    ));
                }
                t
            }
            None => random_tensor(val.ty.dtype, val.ty.shape.clone(), &mut rng)?,
        };
        feeds.push(t);
    }
    for (b, &n) in g.bounded.iter().zip(&extents) {
        if let Some(f) = feeds.get_mut(b.extent) {
            *f = Tensor::scalar(n as i64);
        }
    }
    let t1 = Instant::now();
    let mut outs = kiln_ref::eval_graph(&g, &feeds).map_err(|e| e.to_string())?;
    for (t, a) in outs.iter_mut().zip(&out_axes) {
        if let Some((axis, d)) = *a {
            *t = resize_along(t, axis, extents[d])?;
        }
    }
    let t_eval = t1.elapsed();
    if let Some(dir) = &cli.output_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create `{}`: {e}", dir.display()))?;
    }
    for (&v, t) in g.outputs.iter().zip(&outs) {
        let name = &g.values[v].name;
        write_stdout(&format!("{name}: {} {}\n", t.ty(), summary(t)))?;
        if let Some(dir) = &cli.output_dir {
            let file = dir.join(format!("{}.npy", file_stem(name)));
            let bytes = npy::write(t).map_err(|e| format!("{name}: {e}"))?;
            std::fs::write(&file, bytes).map_err(|e| format!("cannot write `{}`: {e}", file.display()))?;
        }
    }
    eprintln!(
        "{}: imported in {:.1} ms, evaluated in {:.1} ms",
        path.display(),
        t_import.as_secs_f64() * 1e3,
        t_eval.as_secs_f64() * 1e3
    );
    Ok(())
}

/// An output name as a file name: every character outside `[A-Za-z0-9._-]` becomes `_`.
pub(crate) fn file_stem(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        format!("output_{s}")
    } else {
        s
    }
}

/// `min … max … mean … [first four, ...]` of a tensor: integers print as integers and
/// booleans as `true`/`false` (the mean stays a fraction); NaNs are counted. `kiln-run`
/// prints the same.
pub(crate) fn summary(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    if v.is_empty() {
        return "(empty)".into();
    }
    let dtype = t.ty().dtype;
    let show = |x: f64| {
        if dtype == DType::Bool {
            (x != 0.0).to_string()
        } else if dtype.is_float() {
            format!("{x:.6}")
        } else {
            format!("{x:.0}")
        }
    };
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &x in &v {
        lo = lo.min(x);
        hi = hi.max(x);
        sum += x;
    }
    let nans = v.iter().filter(|x| x.is_nan()).count();
    let head: Vec<String> = v.iter().take(4).map(|&x| show(x)).collect();
    format!(
        "min {} max {} mean {:.6}{} [{}{}]",
        show(lo),
        show(hi),
        sum / v.len() as f64,
        if nans > 0 { format!(" nan {nans}") } else { String::new() },
        head.join(", "),
        if v.len() > 4 { ", ..." } else { "" }
    )
}

/// SplitMix64: a small, seedable generator for random inputs.
pub(crate) struct SplitMix(pub(crate) u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Random data: floats uniform in [-1, 1), integers in [0, 8), bools fair.
pub(crate) fn random_tensor(dtype: DType, shape: Shape, rng: &mut SplitMix) -> Result<Tensor, String> {
    let n = shape.numel();
    if dtype.storage_bytes(n) > kiln_ref::MAX_RESULT_BYTES {
        return Err(format!(
            "a random input of {n} elements is over the reference evaluator's limit of {} bytes",
            kiln_ref::MAX_RESULT_BYTES
        ));
    }
    let v: Vec<f64> = if dtype.is_float() {
        (0..n).map(|_| rng.unit() * 2.0 - 1.0).collect()
    } else if dtype == DType::Bool {
        (0..n).map(|_| (rng.next() & 1) as f64).collect()
    } else {
        (0..n).map(|_| (rng.next() % 8) as f64).collect()
    };
    Tensor::from_f64(dtype, shape, &v).map_err(|e| e.to_string())
}
