//! `kiln conformance DIR`: runs ONNX node test cases (`model.onnx` +
//! `test_data_set_*/{input,output}_*.pb`) and puts each in exactly one category.
//!
//! Engines: `compiled` (the default) runs import → compile → artifact bytes → load →
//! run; `reference` runs import → the reference evaluator; `cuda` (`--device cuda`) is
//! `compiled` for the CUDA target, run on GPU 0, compared the same way. Each case runs in a child
//! process (`kiln conformance-case`), so a crash or a hang in generated code is a
//! category of its own and never takes the harness down.
//! Comparison follows the ONNX backend test defaults: |got − want| ≤ atol + rtol·|want|
//! with rtol 1e-3, atol 1e-7; NaN equals NaN; integer and bool outputs exact.

use bytes::Bytes;
use kiln_import::onnx::{Value, ValueKind};
use kiln_import::ImportOptions;
use kiln_ir::{DType, Graph, Tensor};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How one case ended.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Every output matched.
    Pass,
    /// Every output matched, with small inputs bound to their test values.
    PassSpecialised,
    /// The importer does not support the model (an op, a dtype, a form).
    ImportUnsupported(String),
    /// The importer rejected the model otherwise.
    ImportError(String),
    /// The compiler could not compile the imported model.
    CompileError(String),
    /// Evaluation failed.
    RuntimeError(String),
    /// An output differs.
    Mismatch(String),
    /// No result within the time limit.
    Timeout,
    /// A panic: always a defect.
    Panic(String),
    /// The case's process died (a signal): always a defect.
    Crash(String),
}

/// What runs a case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// Compile, write the artifact's bytes, load them with the runtime, run.
    Compiled,
    /// The reference evaluator.
    Reference,
    /// Compile for CUDA, write the artifact's bytes, load them on GPU 0, run
    /// (`kiln conformance --device cuda`).
    Cuda,
}

impl Engine {
    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Compiled => "compiled",
            Engine::Reference => "reference",
            Engine::Cuda => "cuda",
        }
    }

    /// The compile options of a compiled engine.
    fn options(self) -> kiln_compiler::Options {
        let device = match self {
            Engine::Cuda => kiln_compiler::TargetDevice::Cuda,
            Engine::Compiled | Engine::Reference => kiln_compiler::TargetDevice::Cpu,
        };
        kiln_compiler::Options { device, ..kiln_compiler::Options::default() }
    }
}

impl Outcome {
    /// The category name.
    pub fn category(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::PassSpecialised => "pass-specialised",
            Outcome::ImportUnsupported(_) => "import-unsupported",
            Outcome::ImportError(_) => "import-error",
            Outcome::CompileError(_) => "compile-error",
            Outcome::RuntimeError(_) => "runtime-error",
            Outcome::Mismatch(_) => "mismatch",
            Outcome::Timeout => "timeout",
            Outcome::Panic(_) => "panic",
            Outcome::Crash(_) => "crash",
        }
    }

    fn reason(&self) -> &str {
        match self {
            Outcome::Pass | Outcome::PassSpecialised | Outcome::Timeout => "",
            Outcome::ImportUnsupported(r)
            | Outcome::ImportError(r)
            | Outcome::CompileError(r)
            | Outcome::RuntimeError(r)
            | Outcome::Mismatch(r)
            | Outcome::Panic(r)
            | Outcome::Crash(r) => r,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.reason();
        if r.is_empty() {
            f.write_str(self.category())
        } else {
            write!(f, "{}: {}", self.category(), r.replace('\n', " "))
        }
    }
}

/// ONNX's older test data stores bfloat16 tensors with data type UINT16: read them
/// back as bf16 where the model expects bf16 (same bits).
fn as_expected(t: Tensor, want: &kiln_ir::TensorType) -> Tensor {
    if t.dtype() == DType::U16 && want.dtype == DType::BF16 && t.shape() == &want.shape {
        if let Ok(r) = Tensor::new(want.clone(), t.bytes().clone()) {
            return r;
        }
    }
    t
}

/// Whether an import failed only because an operand it needs constant is a graph
/// input, which binding inputs to values (`--input-value`) resolves.
fn wants_values(e: &kiln_import::ImportError) -> bool {
    let m = e.to_string();
    m.contains("must be a constant") || m.contains("depends on run-time data")
}

/// The category of a failed import.
fn import_failure(e: &kiln_import::ImportError) -> Outcome {
    let msg = e.to_string();
    let unsupported = matches!(e, kiln_import::ImportError::Unsupported(_))
        || msg.contains("unsupported")
        || msg.contains("not supported");
    if unsupported {
        Outcome::ImportUnsupported(msg)
    } else {
        Outcome::ImportError(msg)
    }
}

/// Node tests often feed shape operands (axes, pads, sizes, …) as graph inputs;
/// kiln compiles for static shapes, so where plain import asks for constants the
/// harness binds every small input (≤ 64 elements) to its value in the test data
/// set — the `--input-value` a user would give — and reports the case as specialised.
/// With `KILN_CONFORMANCE_BINDING=strict` in the environment (which the case processes
/// inherit) it binds only integer inputs of at most 16 elements (shapes, axes, sizes,
/// `k`): every other input stays run-time data, the count the conformance target of
/// `docs/onnx-coverage.md` is stated in.
fn import_specialised(
    model: &Path,
    inputs: &[(String, Value)],
    base: &ImportOptions,
) -> Option<Result<Graph, kiln_import::ImportError>> {
    let strict = std::env::var_os("KILN_CONFORMANCE_BINDING").is_some_and(|v| v == "strict");
    let mut opts = base.clone();
    for (name, v) in inputs {
        let Value::Tensor(t) = v else { continue };
        let bind = if strict {
            t.numel() <= 16 && t.dtype().is_int()
        } else {
            t.numel() <= 64 && t.dtype() != DType::Bool || t.numel() == 1
        };
        if bind {
            opts.input_values.push((name.clone(), t.to_f64_vec()));
        }
    }
    (!opts.input_values.is_empty()).then(|| kiln_import::onnx::import_file(model, &opts))
}

/// Graph inputs and outputs of an ONNX model with their kinds, in order (for
/// binding test data by position).
#[allow(clippy::type_complexity)]
fn signature(model: &Path) -> Result<(Vec<(String, ValueKind)>, Vec<(String, ValueKind)>), String> {
    let b = std::fs::read(model).map_err(|e| e.to_string())?;
    kiln_import::onnx::signature(Bytes::from(b)).map_err(|e| e.to_string())
}

/// Reads the numbered `prefix_*.pb` files of a data set as values of `kinds`.
fn read_values(set: &Path, prefix: &str, kinds: &[(String, ValueKind)]) -> Result<Vec<(String, Value)>, String> {
    let files = numbered(set, prefix);
    if files.len() != kinds.len() {
        return Err(format!(
            "{}: {} {prefix} files for {} {prefix}s of the model",
            set.display(),
            files.len(),
            kinds.len()
        ));
    }
    files
        .iter()
        .zip(kinds)
        .map(|(p, (name, kind))| {
            let b = std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?;
            let v =
                kiln_import::onnx::decode_value(Bytes::from(b), kind).map_err(|e| format!("{}: {e}", p.display()))?;
            Ok((name.clone(), v))
        })
        .collect()
}

/// A case's model imported (and for compiled engines compiled once) for the input
/// forms of one data set.
struct Prepared {
    plain: Result<Graph, kiln_import::ImportError>,
    specialise: bool,
    compile_error: Option<Outcome>,
}

fn prepare(model: &Path, base: &ImportOptions, engine: Engine) -> Result<Prepared, Outcome> {
    let plain = kiln_import::onnx::import_file(model, base);
    let mut specialise = match &plain {
        Ok(_) => false,
        Err(e) if wants_values(e) => true,
        Err(e) => return Err(import_failure(e)),
    };
    // The compiler needs some operands constant that the evaluator takes at run time
    // (axes, k, …): those cases are specialised the same way.
    let mut compile_error = None;
    if let (Engine::Compiled | Engine::Cuda, Ok(g)) = (engine, &plain) {
        if let Err(e) = kiln_compiler::compile(g, &engine.options()) {
            if e.needs_constant_operand() {
                specialise = true;
                compile_error = Some(Outcome::CompileError(e.to_string()));
            }
        }
    }
    Ok(Prepared { plain, specialise, compile_error })
}

fn numbered(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for i in 0.. {
        let p = dir.join(format!("{prefix}_{i}.pb"));
        if !p.exists() {
            break;
        }
        v.push(p);
    }
    v
}

/// Runs a graph on the feeds with `engine`.
fn execute(engine: Engine, g: &Graph, feeds: &[Tensor]) -> Result<Vec<Tensor>, Outcome> {
    match engine {
        Engine::Reference => kiln_ref::eval_graph(g, feeds).map_err(|e| Outcome::RuntimeError(e.to_string())),
        Engine::Cuda => crate::gpu::execute_graph(g, feeds),
        Engine::Compiled => compile_and_run(
            g,
            feeds,
            &kiln_compiler::Options::default(),
            "conformance",
            |artifact, weights, ins, outs| {
                let module = kiln_runtime::Module::load(artifact, weights).map_err(|e| format!("load: {e}"))?;
                let mut inst = kiln_runtime::Instance::new(&module).map_err(|e| format!("instantiate: {e}"))?;
                inst.invoke(ins, outs).map_err(|e| e.to_string())?;
                Ok(Some((0..outs.len()).map(|k| inst.output_dims(k).unwrap_or(&[]).to_vec()).collect()))
            },
        ),
    }
}

/// Compiles `g` with `opts`, writes the artifact to a file and reads it back (as a
/// user's artifact travels), then `run(artifact, weights, inputs, outputs)` loads and
/// runs it on some device; the graph's outputs as tensors. `tag` names the scratch file.
pub(crate) fn compile_and_run(
    g: &Graph,
    feeds: &[Tensor],
    opts: &kiln_compiler::Options,
    tag: &str,
    run: impl FnOnce(&[u8], Option<&[u8]>, &[&[u8]], &mut [&mut [u8]]) -> Result<Option<Vec<Vec<u64>>>, String>,
) -> Result<Vec<Tensor>, Outcome> {
    let c = kiln_compiler::compile(g, opts).map_err(|e| Outcome::CompileError(e.to_string()))?;
    let path = std::env::temp_dir().join(format!("kiln-{tag}-{}.kiln", std::process::id()));
    let written = std::fs::write(&path, &c.artifact).and_then(|_| kiln_runtime::fs::AlignedBytes::read(&path));
    let _ = std::fs::remove_file(&path);
    let bytes = written.map_err(|e| Outcome::RuntimeError(format!("artifact file: {e}")))?;
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    let dims = {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        run(bytes.bytes(), c.weights.as_deref(), &ins, &mut refs).map_err(Outcome::RuntimeError)?
    };
    g.outputs
        .iter()
        .zip(outs)
        .enumerate()
        .map(|(k, (&v, mut b))| {
            // The actual shape the runtime reports (a data-dependent extent), its
            // elements compacted at the front of the bound-sized buffer.
            let mut ty = g.values[v].ty.clone();
            if let Some(d) = dims.as_ref().and_then(|d| d.get(k)).filter(|d| d.len() == ty.shape.rank()) {
                let shape = kiln_ir::Shape::new(d.iter().map(|&x| x as usize).collect::<Vec<_>>())
                    .map_err(|e| Outcome::RuntimeError(e.to_string()))?;
                ty = kiln_ir::TensorType::new(ty.dtype, shape);
                b.truncate(ty.storage_bytes());
            }
            Tensor::new(ty, Bytes::from(b)).map_err(|e| Outcome::RuntimeError(e.to_string()))
        })
        .collect()
}

/// Runs one case directory. Every data set's inputs fix the shapes the model is
/// compiled for (`--input-shape`, and `--input-sequence` / `--input-absent` for
/// sequence and optional inputs); sequences and optionals are fed and compared as
/// the tensors they hold (`name[i]` per element, see kiln-import's `seq`).
pub fn run_case(case: &Path, engine: Engine) -> Outcome {
    let model = case.join("model.onnx");
    let (in_kinds, out_kinds) = match signature(&model) {
        Ok(s) => s,
        Err(e) => return Outcome::ImportError(e),
    };
    let mut sets: Vec<PathBuf> = match std::fs::read_dir(case) {
        Ok(rd) => rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("test_data_set_")))
            .collect(),
        Err(e) => return Outcome::ImportError(e.to_string()),
    };
    sets.sort();
    if sets.is_empty() {
        return Outcome::ImportError("no test_data_set_* directory".into());
    }
    // Imported once per distinct set of input shapes; per data set only where
    // inputs must be bound to values.
    let mut prepared: Option<(String, Prepared)> = None;
    let mut specialised = false;
    for set in sets {
        let named = match read_values(&set, "input", &in_kinds) {
            Ok(i) => i,
            // Data kiln cannot read (strings, …): the model's own failure first.
            Err(e) => {
                return match kiln_import::onnx::import_file(&model, &ImportOptions::default()) {
                    Err(ie) if !wants_values(&ie) => import_failure(&ie),
                    _ => Outcome::ImportUnsupported(format!("test data: {e}")),
                }
            }
        };
        let mut base = ImportOptions::default();
        for (name, v) in &named {
            match v {
                Value::Tensor(t) => base.input_shapes.push((name.clone(), t.shape().dims().to_vec())),
                v => v.describe_input(name, &mut base),
            }
        }
        let key = format!("{:?} {:?} {:?}", base.input_shapes, base.input_sequences, base.absent_inputs);
        if prepared.as_ref().is_none_or(|(k, _)| *k != key) {
            match prepare(&model, &base, engine) {
                Ok(p) => prepared = Some((key, p)),
                Err(o) => return o,
            }
        }
        let Some((_, p)) = &prepared else { return Outcome::ImportError("internal: nothing imported".into()) };
        specialised |= p.specialise;
        let bound;
        let g = match (&p.plain, p.specialise) {
            (Ok(g), false) => g,
            _ => match import_specialised(&model, &named, &base) {
                Some(Ok(g)) => {
                    bound = g;
                    &bound
                }
                Some(Err(e)) => return import_failure(&e),
                None => match (&p.plain, &p.compile_error) {
                    (Err(e), _) => return import_failure(e),
                    (Ok(_), Some(o)) => return o.clone(),
                    (Ok(_), None) => return Outcome::CompileError("no input to bind".into()),
                },
            },
        };
        let expected = match read_values(&set, "output", &out_kinds) {
            Ok(i) => i,
            Err(e) => return Outcome::ImportUnsupported(format!("test data: {e}")),
        };
        let expected: Vec<(String, Tensor)> = expected.iter().flat_map(|(n, v)| v.flatten(n)).collect();
        let flat: Vec<(String, Tensor)> = named.iter().flat_map(|(n, v)| v.flatten(n)).collect();
        // Feed the inputs that are still graph inputs, by name.
        let mut feeds = Vec::with_capacity(g.inputs.len());
        for &v in &g.inputs {
            let val = &g.values[v];
            match flat.iter().find(|(n, _)| *n == val.name) {
                Some((_, t)) => feeds.push(as_expected(t.clone(), &val.ty)),
                None => return Outcome::RuntimeError(format!("no test data for input `{}`", val.name)),
            }
        }
        let got = match execute(engine, g, &feeds) {
            Ok(o) => o,
            Err(o) => return o,
        };
        if got.len() != expected.len() {
            return Outcome::Mismatch(format!("{} outputs, {} expected", got.len(), expected.len()));
        }
        for (k, (a, (name, b))) in got.iter().zip(expected).enumerate() {
            let have = &g.values[g.outputs[k]].name;
            if *have != name {
                return Outcome::Mismatch(format!("output {k} is `{have}`, expected `{name}`"));
            }
            let b = as_expected(b, a.ty());
            if let Err(m) = compare(a, &b) {
                return Outcome::Mismatch(format!("output {k}: {m}"));
            }
        }
    }
    if specialised {
        Outcome::PassSpecialised
    } else {
        Outcome::Pass
    }
}

/// ONNX backend comparison.
pub fn compare(got: &Tensor, want: &Tensor) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!("type {} , expected {}", got.ty(), want.ty()));
    }
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = !want.dtype().is_float();
    let (rtol, atol) = (1e-3, 1e-7);
    let mut worst: Option<(usize, f64)> = None;
    for i in 0..a.len() {
        let (x, y) = (a[i], b[i]);
        if x == y || (x.is_nan() && y.is_nan()) {
            continue;
        }
        let excess = if exact || x.is_nan() || y.is_nan() || x.is_infinite() || y.is_infinite() {
            f64::INFINITY
        } else {
            (x - y).abs() / (atol + rtol * y.abs())
        };
        if excess > 1.0 && worst.is_none_or(|(_, w)| excess > w) {
            worst = Some((i, excess));
        }
    }
    match worst {
        None => Ok(()),
        Some((i, _)) => {
            let idx = unravel(i, want.shape().dims());
            Err(format!("element {idx:?} is {}, expected {}", a[i], b[i]))
        }
    }
}

fn unravel(mut i: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; dims.len()];
    for d in (0..dims.len()).rev() {
        if dims[d] > 0 {
            idx[d] = i % dims[d];
            i /= dims[d];
        }
    }
    idx
}

/// Runs a case in this process, catching panics (the body of `kiln conformance-case`).
pub fn run_case_caught(case: &Path, engine: Engine) -> Outcome {
    std::panic::catch_unwind(|| run_case(case, engine)).unwrap_or_else(|p| {
        Outcome::Panic(
            p.downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default(),
        )
    })
}

/// One line a child prints: `category<TAB>reason`.
pub fn encode(o: &Outcome) -> String {
    format!("{}\t{}", o.category(), o.reason().replace(['\n', '\t'], " "))
}

fn decode(line: &str) -> Outcome {
    let (cat, reason) = line.split_once('\t').unwrap_or((line, ""));
    let r = reason.to_string();
    match cat {
        "pass" => Outcome::Pass,
        "pass-specialised" => Outcome::PassSpecialised,
        "import-unsupported" => Outcome::ImportUnsupported(r),
        "import-error" => Outcome::ImportError(r),
        "compile-error" => Outcome::CompileError(r),
        "runtime-error" => Outcome::RuntimeError(r),
        "mismatch" => Outcome::Mismatch(r),
        "timeout" => Outcome::Timeout,
        "panic" => Outcome::Panic(r),
        other => Outcome::Crash(format!("unexpected report `{other}`")),
    }
}

/// Runs a case in a child process (`exe conformance-case CASE --engine E`) with a
/// time limit; a child killed by a signal is a crash, one past the limit a timeout.
pub fn run_case_isolated(exe: &Path, case: &Path, engine: Engine, limit: Duration) -> Outcome {
    use std::process::{Command, Stdio};
    let child = Command::new(exe)
        .arg("conformance-case")
        .arg(case)
        .arg("--engine")
        .arg(engine.name())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return Outcome::RuntimeError(format!("cannot start `{}`: {e}", exe.display())),
    };
    let start = std::time::Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                let mut out = String::new();
                if let Some(mut so) = child.stdout.take() {
                    use std::io::Read;
                    let _ = so.read_to_string(&mut out);
                }
                return match out.lines().last() {
                    Some(line) if status.success() => decode(line),
                    _ => Outcome::Crash(format!("the case process ended with {status}")),
                };
            }
            Ok(None) if start.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Outcome::Timeout;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Outcome::RuntimeError(format!("waiting for the case process: {e}")),
        }
    }
}

/// All case directories under `dir` (those holding a `model.onnx`), sorted.
pub fn cases(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read `{}`: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("model.onnx").exists())
        .collect();
    v.sort();
    Ok(v)
}
