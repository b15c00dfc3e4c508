//! Running the `kiln` binary from tests: its exit status and output, the shape of a
//! clean failure (one `error:` line, no panic), scratch folders, LeNet compiled, ONNX
//! models built in the test, and the test data `scripts/test` fetches (the model
//! listings and the import options an entry asks for).
#![allow(dead_code)]

use kiln_compiler::{Compilation, CompileError, Input, Options, Precision, Stage, TargetDevice};
use kiln_import::onnx::proto::{
    attribute_proto::AttributeType, AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    ValueInfoProto,
};
use kiln_import::ImportOptions;
use kiln_ir::{npy, Tensor};
use prost::Message;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// LeNet, the committed model (`scripts/test` checks that it is what
/// `scripts/gen_models.py` makes).
pub const LENET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/lenet.onnx");

/// Runs kiln; returns (success, stdout, stderr).
pub fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs kiln, asserts success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let (ok, out, err) = kiln(args);
    assert!(ok, "kiln {args:?} failed: {err}");
    out
}

/// Runs `kiln bench ART --warmup W --iterations N --json`, then `extra`; returns the
/// report, parsed.
pub fn bench_json(art: &Path, warmup: u32, iterations: u32, extra: &[&str]) -> Value {
    let (w, n) = (warmup.to_string(), iterations.to_string());
    let mut args = vec!["bench", s(art), "--warmup", &w, "--iterations", &n, "--json"];
    args.extend_from_slice(extra);
    let out = ok(&args);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("kiln {args:?}: {e}\n{out}"))
}

/// Asserts a clean failure: non-zero exit, one line starting `error:`, containing `needles`.
pub fn fails_with(args: &[&str], needles: &[&str]) {
    let (ok, _, err) = kiln(args);
    assert!(!ok, "kiln {args:?} should fail");
    assert!(!err.contains("panicked"), "kiln {args:?} panicked: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "kiln {args:?}: expected one line on stderr, got: {err}");
    assert!(lines[0].starts_with("error: "), "kiln {args:?}: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "kiln {args:?}: `{n}` not in: {}", lines[0]);
    }
}

/// An empty scratch folder for test `name` of a suite: `kiln-<suite>-<pid>-<name>` in the
/// temp folder.
pub fn scratch(suite: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-{suite}-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A path as a command-line argument.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A scratch folder (see [`scratch`]) and `lenet.kiln` in it, compiled from [`LENET`].
pub fn lenet_artifact(suite: &str, name: &str) -> (PathBuf, PathBuf) {
    let dir = scratch(suite, name);
    let art = dir.join("lenet.kiln");
    ok(&["compile", LENET, "-o", s(&art)]);
    (dir, art)
}

/// An f32 graph input or output named `name` of these dimensions, `None` a free one
/// (named `batch`).
pub fn value_info(name: &str, dims: &[Option<i64>]) -> ValueInfoProto {
    use kiln_import::onnx::proto::tensor_shape_proto::{dimension::Value, Dimension};
    use kiln_import::onnx::proto::{type_proto, TensorShapeProto, TypeProto};
    let dim = dims
        .iter()
        .map(|d| Dimension {
            value: Some(match d {
                Some(v) => Value::DimValue(*v),
                None => Value::DimParam("batch".into()),
            }),
            denotation: None,
        })
        .collect();
    let tensor = type_proto::Tensor { elem_type: Some(1), shape: Some(TensorShapeProto { dim }) };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto { value: Some(type_proto::Value::TensorType(tensor)), denotation: None }),
        doc_string: None,
    }
}

/// An ONNX node: `op` from `inputs` to `outputs`, unnamed and without attributes (set
/// them with `NodeProto { name, attribute, ..node(…) }`).
pub fn node(op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// An integer attribute.
pub fn int_attr(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Int as i32),
        i: Some(i),
        ..Default::default()
    }
}

/// A graph attribute (a branch, a loop body).
pub fn graph_attr(name: &str, g: GraphProto) -> AttributeProto {
    AttributeProto {
        name: Some(name.into()),
        r#type: Some(AttributeType::Graph as i32),
        g: Some(g),
        ..Default::default()
    }
}

/// An ONNX model (IR version 8, opset 17) of the graph `g` with these nodes, inputs,
/// outputs and initializers, encoded.
pub fn onnx_model(
    node: Vec<NodeProto>,
    input: Vec<ValueInfoProto>,
    output: Vec<ValueInfoProto>,
    initializer: Vec<TensorProto>,
) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto { node, name: Some("g".into()), initializer, input, output, ..Default::default() }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// The test data: `$KILN_TEST_DATA`, default `<repo>/.cache` (filled by `scripts/test`).
pub fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

/// The entries of `ref/manifest.json` (the repo's test models) or `ref/corpus.json`
/// (the real-model corpus of `corpus/models.json`). A missing listing is a failure.
pub fn listed_models(file: &str) -> Vec<Value> {
    let path = data_dir().join("ref").join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("cannot read {}: {e}; run scripts/test (it fetches models and reference outputs)", path.display())
    });
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    v["models"].as_array().expect("a listing has a models list").clone()
}

/// The `name` of each entry of a listing.
pub fn entry_names(entries: &[Value]) -> Vec<String> {
    entries.iter().map(|e| e["name"].as_str().expect("name").to_string()).collect()
}

/// The path of a listing entry's model.
pub fn model_path(e: &Value) -> PathBuf {
    data_dir().join(e["model"].as_str().expect("model path"))
}

/// The tensor of a `.npy` file of the test data (`rel` to [`data_dir`], as the listings
/// name them). A missing or malformed file fails the test.
pub fn read_npy(rel: &str) -> Tensor {
    let p = data_dir().join(rel);
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    npy::read(&b).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Listing entry `e`'s model compiled for the CUDA target at `precision`, through to the
/// artifact (the compilation keeps its flow program and CUDA module to inspect); the
/// compiler's error where it fails.
pub fn compile_for_cuda(e: &Value, precision: Precision) -> Result<Compilation, Box<CompileError>> {
    let opts = Options { device: TargetDevice::Cuda, import: import_options(e), precision, ..Options::default() };
    let mut c = Compilation::new(Input::File(model_path(e)), opts);
    c.run_to(Stage::Artifact).map_err(Box::new)?;
    Ok(c)
}

/// [`compile_for_cuda`] for a test that goes through every model and reports all
/// failures at the end: a failure is recorded in `failures` as `LABEL: compile for cuda:
/// ERROR`, and there is no compilation (the caller goes on to the next model).
pub fn compile_for_cuda_or_record(
    e: &Value,
    precision: Precision,
    label: &str,
    failures: &mut Vec<String>,
) -> Option<Compilation> {
    match compile_for_cuda(e, precision) {
        Ok(c) => Some(c),
        Err(err) => {
            failures.push(format!("{label}: compile for cuda: {err}"));
            None
        }
    }
}

/// The import options a listing entry asks for: its input shapes and its input values.
pub fn import_options(e: &Value) -> ImportOptions {
    let mut opts = ImportOptions::default();
    if let Some(shapes) = e["input_shapes"].as_object() {
        for (k, v) in shapes {
            let dims = v.as_array().expect("dims").iter().map(|d| d.as_u64().expect("dim") as usize).collect();
            opts.input_shapes.push((k.clone(), dims));
        }
    }
    if let Some(vals) = e["input_values"].as_object() {
        for (k, v) in vals {
            let vals = v.as_array().expect("values").iter().map(|d| d.as_f64().expect("number")).collect();
            opts.input_values.push((k.clone(), vals));
        }
        // Inputs bound to values are no longer graph inputs.
        opts.input_shapes.retain(|(n, _)| !vals.contains_key(n));
    }
    opts
}

/// `$KILN_TEST_DATA/DIR/manifest.json`, which `scripts/SCRIPT` writes (a missing one is
/// a failure that names the script, not a skip).
pub fn test_manifest(dir: &str, script: &str) -> Value {
    let p = data_dir().join(dir).join("manifest.json");
    let text = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/{script} --cache $KILN_TEST_DATA)", p.display()));
    serde_json::from_str(&text).expect("manifest json")
}

/// `got` against an expected output (ONNX Runtime's, or ONNX's own test data): the same
/// type, and |got − want| ≤ 1e-5·max|want| + 1e-4·|want| per element for floats (the
/// bound `models.rs` uses), exact for integers and bools.
pub fn compare(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.ty(), want.ty(), "{what}: type");
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let scale = b.iter().fold(0.0f64, |m, x| m.max(x.abs()));
    for i in 0..a.len() {
        let tol = if want.dtype().is_float() { 1e-5 * scale + 1e-4 * b[i].abs() } else { 0.0 };
        assert!((a[i] - b[i]).abs() <= tol, "{what}: element {i} is {}, expected {}", a[i], b[i]);
    }
}

/// How far an output is from its reference under the per-element bound
/// |got − want| ≤ atol·max|want| + rtol·|want| (the maximum over the reference's finite
/// values; equal values and matching NaNs are no difference).
#[derive(Clone, Copy, Debug)]
pub struct Gap {
    /// The largest difference over the bound (≤ 1 holds; infinite for a NaN difference,
    /// or any difference where `exact`).
    pub excess: f64,
    /// The element of `excess` (0 when none differs).
    pub at: usize,
    /// The largest absolute difference (infinite for a NaN difference).
    pub max_abs: f64,
    /// max|want| over its finite values.
    pub scale: f64,
}

/// The [`Gap`] of `a` (kiln's values) from `b` (the reference's); `exact`: any
/// difference is out of bounds (integer and bool outputs).
pub fn gap(a: &[f64], b: &[f64], rtol: f64, atol: f64, exact: bool) -> Gap {
    assert_eq!(a.len(), b.len(), "element count");
    let scale = b.iter().fold(0.0f64, |m, x| if x.is_finite() { m.max(x.abs()) } else { m });
    let abs_tol = atol * scale.max(f64::MIN_POSITIVE);
    let mut g = Gap { excess: 0.0, at: 0, max_abs: 0.0, scale };
    for i in 0..a.len() {
        let (x, y) = (a[i], b[i]);
        if x == y || x.is_nan() && y.is_nan() {
            continue;
        }
        let err = (x - y).abs();
        g.max_abs = g.max_abs.max(if err.is_nan() { f64::INFINITY } else { err });
        let excess = if err.is_nan() || exact { f64::INFINITY } else { err / (abs_tol + rtol * y.abs()) };
        if excess > g.excess {
            g.excess = excess;
            g.at = i;
        }
    }
    g
}

/// `got` against `oracle`'s output `want` (ONNX Runtime's, LiteRT's): floats within
/// [`gap`]'s bound, integers and bools exact. Returns the worst element's share of the
/// bound; panics past it, naming the element.
pub fn assert_close(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64, oracle: &str) -> f64 {
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = !want.dtype().is_float();
    let Gap { excess, at: i, scale, .. } = gap(&a, &b, rtol, atol, exact);
    if exact {
        assert!(excess == 0.0, "{what}: element {i} is {}, {oracle} gives {} (exact)", a[i], b[i]);
    }
    assert!(
        excess <= 1.0,
        "{what}: element {i} is {}, {oracle} gives {} (|diff| {:.3e} is {excess:.2}x the tolerance atol {atol}·{scale:.3e} + rtol {rtol}·|ref|)",
        a[i],
        b[i],
        (a[i] - b[i]).abs()
    );
    excess
}

/// One `#[test]` per model, `$t` calling `$check($name)`, and the test `$all` that the
/// listing's names (`$listed`, a `Vec<String>`) are exactly the models tested here.
#[allow(unused_macros)]
macro_rules! model_tests {
    ($check:ident, $all:ident, $listed:expr; $($t:ident => $name:literal),* $(,)?) => {
        $(#[test] fn $t() { $check($name); })*

        /// The listing holds exactly the models tested here.
        #[test]
        fn $all() {
            let mut expected = vec![$($name.to_string()),*];
            expected.sort();
            let mut listed: Vec<String> = $listed;
            listed.sort();
            assert_eq!(listed, expected);
        }
    };
}
#[allow(unused_imports)]
pub(crate) use model_tests;

/// `artifact` written to `<temp>/DIR-<pid>/NAME.kiln` and read back (a module is loaded
/// from what a file holds, not from the compiler's buffer); the file is removed.
pub fn through_file(dir: &str, name: &str, artifact: &[u8]) -> Vec<u8> {
    let dir = std::env::temp_dir().join(format!("{dir}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{name}.kiln"));
    std::fs::write(&path, artifact).expect("write artifact");
    let bytes = std::fs::read(&path).expect("read artifact back");
    let _ = std::fs::remove_file(&path);
    bytes
}

/// An instance of `module`: on the runtime's default threads, or on `threads`.
pub fn instance<'m>(module: &'m kiln_runtime::LoadedModule<'m>, threads: Option<usize>) -> kiln_runtime::Instance<'m> {
    match threads {
        None => kiln_runtime::Instance::new(module).expect("instance"),
        Some(t) => kiln_runtime::Instance::with_threads(module, t).expect("threaded instance"),
    }
}

/// `inst` invoked on `feeds`; the output buffers, each the size of `g`'s output (an
/// output of a run-time extent at its bound).
pub fn invoke(
    inst: &mut kiln_runtime::Instance<'_>,
    g: &kiln_ir::Graph,
    feeds: &[Tensor],
) -> Result<Vec<Vec<u8>>, kiln_runtime::RuntimeError> {
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs)?;
    }
    Ok(outs)
}

/// Output buffers as tensors of `g`'s output types.
pub fn graph_outputs(g: &kiln_ir::Graph, outs: Vec<Vec<u8>>) -> Vec<Tensor> {
    outs.into_iter()
        .zip(&g.outputs)
        .map(|(b, &v)| Tensor::new(g.values[v].ty.clone(), b.into()).expect("tensor"))
        .collect()
}

/// `module` (compiled from `g`) run on `feeds` by an [`instance`] on `threads`.
pub fn run_module(
    module: &kiln_runtime::LoadedModule<'_>,
    threads: Option<usize>,
    g: &kiln_ir::Graph,
    feeds: &[Tensor],
) -> Vec<Tensor> {
    graph_outputs(g, invoke(&mut instance(module, threads), g, feeds).expect("invoke"))
}

/// The tensors a manifest case lists under `key` ("inputs", "outputs"), as files under
/// the test data folder.
pub fn case_tensors(case: &Value, key: &str) -> Vec<Tensor> {
    case[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key}"))
        .iter()
        .map(|f| read_npy(f.as_str().expect("file")))
        .collect()
}

/// [`compare`] of every output against its expected value, as "`label` output K (`how`)".
pub fn compare_outputs(label: &str, how: &str, got: &[Tensor], want: &[Tensor]) {
    for (k, (r, w)) in got.iter().zip(want).enumerate() {
        compare(&format!("{label} output {k} ({how})"), r, w);
    }
}
