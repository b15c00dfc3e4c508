//! `kiln`: the command-line front door.
//!
//! - `kiln import MODEL [--input-shape N=DIMS]... [--input-value N=V]...` prints the
//!   tensor-level IR of a model;
//! - `kiln eval MODEL [--input N=FILE.npy]... [--output-dir DIR] [--seed S]` runs the
//!   reference evaluator and writes one `.npy` per output.
//!
//! MODEL is an ONNX file, or a file in kiln's IR text form (`.kir`).
//! Errors are one line on stderr and exit status 1.

mod artifact;
mod conformance;
mod floor;

use kiln_import::{parse_input_shape, parse_input_value, ImportOptions};
use kiln_ir::{npy, DType, Graph, Shape, Tensor};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "\
usage:
  kiln import MODEL [--input-shape NAME=DIMS]... [--input-value NAME=V[,V...]]... [--passes P,P|default]
  kiln eval MODEL [--input NAME=FILE.npy]... [--input-shape NAME=DIMS]... [--input-value NAME=V]...
                  [--output-dir DIR] [--seed N] [--passes P,P|default]
  kiln compile MODEL -o OUT.kiln [--input-shape NAME=DIMS]... [--input-value NAME=V]...
                  [--external-weights FILE] [--strip] [--opt speed|size] [--target-cpu host|x86-64-v2|x86-64-v3|x86-64-v4]
                  [--to tensor|flow|stream|hal] [--dump-after STAGE|PASS]... [--list-passes] [--timings]
  kiln run ARTIFACT|MODEL [--weights FILE] [--input NAME=FILE.npy]... [--output-dir DIR] [--seed N]
                  [--threads N]
  kiln inspect ARTIFACT|MODEL [--json] [--dispatch-graph]
  kiln bench ARTIFACT|MODEL [--threads N] [--warmup W] [--iterations I] [--json] [--samples FILE] [--floor] [--floor-passes N] [--profile] [--input NAME=FILE.npy]...
  kiln list-passes
  kiln conformance DIR [--engine compiled|reference] [--jobs N] [--filter TEXT] [--verbose]

MODEL is an .onnx file or a .kir file (kiln IR text form).
--opt size trades speed for code size (no machine-code kernels, transcendentals through helpers).
--target-cpu (default host) sets the CPU features the code may use; x86-64-v4 adds AVX-512 tiles.
--threads N runs on the local-task driver with N threads (default: one per core).
bench --profile times each command of the plan on one thread (median, share, the compiler's estimate).
bench --samples FILE writes every timed call's milliseconds, one line a call, in call order.
bench --floor times, after every call, fixed work of the call's length and footprint (the machine's own
  spread) on one thread; with --samples each line holds both times. --floor-passes N fixes its arithmetic.
KILN_PERF_MAP=1 kiln bench ... writes /tmp/perf-PID.map so `perf report` names each kernel.
--input-shape binds free input dimensions (e.g. input=1x3x224x224).
--input-value turns an input into a constant (e.g. sr=16000), so what it feeds can fold.
--passes runs tensor-level passes after import (`default`: all, in pipeline order).
compile --list-passes lists the pipeline's stages and tensor passes; --dump-after NAME prints the IR after one.
eval without --input for an input feeds seeded random data (--seed, default 0).";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[derive(Default)]
struct Cli {
    model: Option<PathBuf>,
    opts: ImportOptions,
    inputs: Vec<(String, PathBuf)>,
    output_dir: Option<PathBuf>,
    seed: u64,
    passes: Vec<String>,
}

fn parse_args(args: &[String], allow_eval: bool) -> Result<Cli, String> {
    let mut cli = Cli::default();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v.to_string())),
            _ => (a.as_str(), None),
        };
        let mut value = |name: &str| -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().cloned().ok_or_else(|| format!("{name} needs a value")),
            }
        };
        match flag {
            "--input-shape" => cli.opts.input_shapes.push(parse_input_shape(&value(flag)?)?),
            "--input-value" => cli.opts.input_values.push(parse_input_value(&value(flag)?)?),
            "--input" if allow_eval => {
                let v = value(flag)?;
                let (n, f) = v.rsplit_once('=').ok_or_else(|| format!("--input `{v}`: expected NAME=FILE.npy"))?;
                cli.inputs.push((n.to_string(), PathBuf::from(f)));
            }
            "--output-dir" if allow_eval => cli.output_dir = Some(PathBuf::from(value(flag)?)),
            "--seed" if allow_eval => {
                let v = value(flag)?;
                cli.seed = v.parse().map_err(|_| format!("--seed `{v}` is not a number"))?;
            }
            "--passes" => {
                let v = value(flag)?;
                cli.passes = if v == "default" {
                    kiln_opt::registry().iter().map(|p| p.name().to_string()).collect()
                } else {
                    v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
                };
            }
            "-h" | "--help" => {
                let _ = write_stdout(&format!("{USAGE}\n"));
                std::process::exit(0);
            }
            f if f.starts_with('-') => return Err(format!("unknown option `{f}` (kiln --help lists them)")),
            _ if cli.model.is_none() => cli.model = Some(PathBuf::from(a)),
            _ => return Err(format!("unexpected argument `{a}`")),
        }
    }
    if cli.model.is_none() {
        return Err("no model given (kiln --help shows the usage)".to_string());
    }
    Ok(cli)
}

fn run(args: &[String]) -> Result<(), String> {
    let Some(cmd) = args.first() else {
        return Err("no command given (kiln --help shows the usage)".to_string());
    };
    match cmd.as_str() {
        "list-passes" => {
            for p in kiln_opt::registry() {
                write_stdout(&format!("{:<40} {}\n", p.name(), p.summary()))?;
            }
            Ok(())
        }
        "import" => {
            let cli = parse_args(&args[1..], false)?;
            let mut g = load(cli.model.as_deref().unwrap_or(Path::new("")), &cli.opts)?;
            optimise(&mut g, &cli.passes)?;
            write_stdout(&kiln_ir::text::print(&g))
        }
        "eval" => eval(parse_args(&args[1..], true)?),
        "compile" => artifact::compile_cmd(&args[1..]),
        "run" => artifact::run_cmd(&args[1..]),
        "inspect" => artifact::inspect_cmd(&args[1..]),
        "bench" => artifact::bench_cmd(&args[1..]),
        "conformance" => conformance_cmd(&args[1..]),
        "conformance-case" => conformance_case_cmd(&args[1..]),
        "-h" | "--help" | "help" => {
            write_stdout(&format!("{USAGE}\n"))?;
            Ok(())
        }
        other => Err(format!("unknown command `{other}` (kiln --help lists the commands)")),
    }
}

/// `kiln conformance DIR`: runs every ONNX node test case under DIR, each in a child
/// process, `--jobs` at a time (default: the number of CPUs), printing results in order.
fn conformance_cmd(args: &[String]) -> Result<(), String> {
    let mut dir = None;
    let mut filter = String::new();
    let mut verbose = false;
    let mut engine = conformance::Engine::Compiled;
    let mut jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--filter" => filter = it.next().cloned().ok_or("--filter needs a value")?,
            "--verbose" | "-v" => verbose = true,
            "--engine" => {
                engine = match it.next().map(String::as_str) {
                    Some("compiled") => conformance::Engine::Compiled,
                    Some("reference") => conformance::Engine::Reference,
                    other => return Err(format!("--engine {other:?}: expected compiled or reference")),
                }
            }
            "--jobs" | "-j" => {
                let v = it.next().ok_or("--jobs needs a value")?;
                jobs = v.parse::<usize>().map_err(|_| format!("--jobs `{v}` is not a number"))?.max(1);
            }
            f if f.starts_with('-') => return Err(format!("unknown option `{f}`")),
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let dir = dir.ok_or("no directory given (e.g. .cache/onnx-node)")?;
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the kiln binary: {e}"))?;
    let cases: Vec<PathBuf> = conformance::cases(&dir)?
        .into_iter()
        .filter(|c| c.file_name().is_some_and(|n| n.to_string_lossy().contains(&filter)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<conformance::Outcome>>> =
        cases.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(case) = cases.get(i) else { break };
                let o = conformance::run_case_isolated(&exe, case, engine, std::time::Duration::from_secs(60));
                if let Ok(mut slot) = results[i].lock() {
                    *slot = Some(o);
                }
            });
        }
    });
    let mut counts: std::collections::BTreeMap<&'static str, usize> = Default::default();
    for (case, r) in cases.iter().zip(results) {
        let name = case.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let outcome = r.into_inner().ok().flatten().unwrap_or(conformance::Outcome::Crash("no result".into()));
        *counts.entry(outcome.category()).or_default() += 1;
        if verbose || !matches!(outcome, conformance::Outcome::Pass | conformance::Outcome::PassSpecialised) {
            write_stdout(&format!("{name}: {outcome}\n"))?;
        }
    }
    let summary: Vec<String> = counts.iter().map(|(k, v)| format!("{k} {v}")).collect();
    write_stdout(&format!("{} cases (engine: {}): {}\n", cases.len(), engine.name(), summary.join(", ")))?;
    Ok(())
}

/// `kiln conformance-case CASE [--engine E]`: one case, reported as one line (used by
/// `kiln conformance`, which runs every case in a process of its own).
fn conformance_case_cmd(args: &[String]) -> Result<(), String> {
    let case = args.first().ok_or("no case directory given")?;
    let engine = match args.get(2).map(String::as_str) {
        Some("reference") => conformance::Engine::Reference,
        _ => conformance::Engine::Compiled,
    };
    let o = conformance::run_case_caught(Path::new(case), engine);
    write_stdout(&format!("{}\n", conformance::encode(&o)))
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

fn eval(cli: Cli) -> Result<(), String> {
    let path = cli.model.clone().unwrap_or_default();
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
    let mut rng = SplitMix(cli.seed);
    let mut feeds = Vec::new();
    for &v in &g.inputs {
        let val = &g.values[v];
        let t = match cli.inputs.iter().find(|(n, _)| *n == val.name) {
            Some((_, file)) => {
                let bytes = std::fs::read(file).map_err(|e| format!("cannot read `{}`: {e}", file.display()))?;
                let t = npy::read(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
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
    let t1 = Instant::now();
    let outs = kiln_ref::eval_graph(&g, &feeds).map_err(|e| e.to_string())?;
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

pub(crate) fn summary(t: &Tensor) -> String {
    let v = t.to_f64_vec();
    if v.is_empty() {
        return "(empty)".into();
    }
    let (mut lo, mut hi, mut sum) = (f64::INFINITY, f64::NEG_INFINITY, 0.0);
    for &x in &v {
        lo = lo.min(x);
        hi = hi.max(x);
        sum += x;
    }
    let head: Vec<String> = v.iter().take(4).map(|x| format!("{x:.6}")).collect();
    format!(
        "min {lo:.6} max {hi:.6} mean {:.6} [{}{}]",
        sum / v.len() as f64,
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
