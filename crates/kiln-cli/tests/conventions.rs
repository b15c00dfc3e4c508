//! The command line's conventions (issue 22): per-command `--help` with examples,
//! `--version`, completions, every free input dimension in one error, a broadcast
//! `--input-value`, integers and booleans printed as such, JSON numbers as numbers, the
//! `--threads` warning and `compile --emit c-array|object`.

mod common;

use common::{bench_json, fails_with, int_attr, kiln, lenet_artifact, ok, onnx_model, s, scratch, LENET};

use kiln_import::onnx::proto::{
    tensor_shape_proto::dimension, tensor_shape_proto::Dimension, type_proto, AttributeProto, NodeProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use std::path::{Path, PathBuf};

/// A dimension: fixed, or free under a name.
enum D {
    Fixed(i64),
    Free(&'static str),
}

fn value_info(name: &str, elem_type: i32, dims: Option<&[D]>) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(elem_type),
                shape: dims.map(|dims| TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d {
                                D::Fixed(v) => dimension::Value::DimValue(*v),
                                D::Free(n) => dimension::Value::DimParam((*n).into()),
                            }),
                            denotation: None,
                        })
                        .collect(),
                }),
            })),
            denotation: None,
        }),
        doc_string: None,
    }
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto { name: Some(format!("{op}_{}", outputs[0])), attribute, ..common::node(op, inputs, outputs) }
}

/// Writes a model of `nodes` with these inputs and (untyped) outputs.
fn write_model(path: &Path, nodes: Vec<NodeProto>, inputs: Vec<ValueInfoProto>, outputs: &[&str]) {
    let outputs = outputs.iter().map(|o| value_info(o, 0, None)).collect();
    std::fs::write(path, onnx_model(nodes, inputs, outputs, Vec::new())).expect("write model");
}

/// `y = a + b` of f32 inputs with these names and dimensions, written in a scratch
/// folder of its own (`tag`): the folder, and the model's path in it.
fn add_model(tag: &str, (a, a_dims): (&str, &[D]), (b, b_dims): (&str, &[D])) -> (PathBuf, PathBuf) {
    let dir = scratch("conventions", tag);
    let m = dir.join(format!("{tag}.onnx"));
    let inputs = vec![value_info(a, 1, Some(a_dims)), value_info(b, 1, Some(b_dims))];
    write_model(&m, vec![node("Add", &[a, b], &["y"], vec![])], inputs, &["y"]);
    (dir, m)
}

/// Every command of the CLI.
const COMMANDS: [&str; 9] =
    ["compile", "run", "inspect", "bench", "import", "eval", "conformance", "list-passes", "completions"];

/// Asserts that `kiln cmd --help` names every one of `opts`.
fn help_lists(cmd: &str, opts: &[&str]) {
    let help = ok(&[cmd, "--help"]);
    for opt in opts {
        assert!(help.contains(opt), "{opt} not in {cmd} --help");
    }
}

#[test]
fn every_command_has_help_with_examples() {
    for cmd in COMMANDS {
        let (good, out, err) = kiln(&[cmd, "--help"]);
        assert!(good, "kiln {cmd} --help failed: {err}");
        assert!(out.contains("Usage: kiln "), "kiln {cmd} --help: {out}");
        assert!(out.contains(&format!("  kiln {cmd}")), "kiln {cmd} --help has no example: {out}");
    }
    // -h too, and the top level lists every command.
    let top = ok(&["-h"]);
    for cmd in COMMANDS {
        assert!(top.contains(cmd), "{cmd} not in: {top}");
    }
    // The options the old hand-written parser took are all still there.
    help_lists(
        "compile",
        &[
            "--output",
            "--input-shape",
            "--input-value",
            "--external-weights",
            "--strip",
            "--opt",
            "--target-cpu",
            "--to",
            "--dump-after",
            "--list-passes",
            "--timings",
            "--emit",
            "--symbol",
        ],
    );
    help_lists(
        "bench",
        &[
            "--threads",
            "--warmup",
            "--iterations",
            "--json",
            "--samples",
            "--floor",
            "--floor-passes",
            "--profile",
            "--input",
            "--input-shape",
            "--weights",
            "KILN_PERF_MAP",
        ],
    );
    for cmd in ["run", "inspect"] {
        help_lists(cmd, &["--input-shape"]);
    }
}

#[test]
fn version_names_the_formats() {
    let out = ok(&["--version"]);
    assert_eq!(
        out.trim(),
        format!(
            "kiln {} (artifact format {}, kernel ABI {})",
            env!("CARGO_PKG_VERSION"),
            kiln_module::format::FORMAT_VERSION,
            kiln_module::abi::ABI_VERSION
        )
    );
    assert!(out.contains("artifact format 1."), "{out}");
}

#[test]
fn usage_errors_are_one_line() {
    fails_with(&["compile", "--no-such-option"], &["--no-such-option", "kiln compile --help"]);
    fails_with(&["bench"], &["required", "kiln bench --help"]);
    fails_with(&["frobnicate"], &["frobnicate", "(kiln --help"]);
    fails_with(&[], &["no command given"]);
    fails_with(&["compile", LENET, "-o", "x.kiln", "--emit", "elf"], &["--emit", "elf"]);
}

#[test]
fn completions() {
    let bash = ok(&["completions", "bash"]);
    assert!(bash.contains("complete") && bash.contains("--input-shape"), "{bash}");
    assert!(ok(&["completions", "zsh"]).contains("#compdef kiln"));
    fails_with(&["completions", "tcsh"], &["tcsh"]);
}

#[test]
fn all_free_dimensions_in_one_error() {
    let (dir, m) = add_model("free", ("a", &[D::Free("N"), D::Fixed(4)]), ("b", &[D::Free("N"), D::Free("width")]));
    fails_with(
        &["compile", s(&m), "-o", s(&dir.join("x.kiln"))],
        &["input `a` (Nx4)", "input `b` (Nxwidth)", "--input-shape a=1x4 --input-shape b=1x1"],
    );
    // One bound, the other still reported (alone).
    let (_, _, err) = kiln(&["import", s(&m), "--input-shape", "a=2x4"]);
    assert!(err.contains("input `b`") && !err.contains("input `a`"), "{err}");
    // The suggestion pastes: both bound, it imports.
    let out = ok(&["import", s(&m), "--input-shape", "a=1x4", "--input-shape", "b=1x1"]);
    assert!(out.contains("f32[1,4]"), "{out}");
}

#[test]
fn input_value_broadcasts_a_scalar() {
    let (_, m) = add_model("broadcast", ("x", &[D::Fixed(2), D::Fixed(3)]), ("s", &[D::Fixed(2), D::Fixed(3)]));
    let out = ok(&["eval", s(&m), "--input-value", "x=0.5,1,1.5,2,2.5,3", "--input-value", "s=10"]);
    assert_eq!(
        out,
        "y: f32[2,3] min 10.500000 max 13.000000 mean 11.750000 [10.500000, 11.000000, 11.500000, 12.000000, ...]\n"
    );
    // A list of the wrong length is still an error.
    fails_with(&["eval", s(&m), "--input-value", "s=1,2"], &["input `s`", "2 values", "holds 6"]);
}

#[test]
fn integers_and_booleans_print_as_such() {
    let dir = scratch("conventions", "ints");
    let m = dir.join("argmax.onnx");
    write_model(
        &m,
        vec![
            node("ArgMax", &["x"], &["idx"], vec![int_attr("axis", 1), int_attr("keepdims", 0)]),
            node("Greater", &["x", "z"], &["pos"], vec![]),
        ],
        vec![value_info("x", 1, Some(&[D::Fixed(2), D::Fixed(3)])), value_info("z", 1, Some(&[D::Fixed(1)]))],
        &["idx", "pos"],
    );
    let x =
        kiln_ir::Tensor::from_vec(kiln_ir::Shape::new([2, 3]).expect("shape"), vec![0.5f32, -1.0, 2.0, 3.0, 1.0, -2.0])
            .expect("tensor");
    let xf = dir.join("x.npy");
    std::fs::write(&xf, kiln_ir::npy::write(&x).expect("npy")).expect("write");
    let expected = "idx: i64[2] min 0 max 2 mean 1.000000 [2, 0]\n\
                    pos: bool[2,3] min false max true mean 0.666667 [true, false, true, true, ...]\n";
    let feed = format!("x={}", s(&xf));
    assert_eq!(ok(&["run", s(&m), "--input", &feed, "--input-value", "z=0", "--threads", "1"]), expected);
    assert_eq!(ok(&["eval", s(&m), "--input", &feed, "--input-value", "z=0"]), expected);
    // The same from an artifact (kiln-runner's tests pin kiln-run's line to this format).
    let art = dir.join("argmax.kiln");
    ok(&["compile", s(&m), "-o", s(&art), "--input-value", "z=0"]);
    assert_eq!(ok(&["run", s(&art), "--input", &feed, "--threads", "1"]), expected);
}

#[test]
fn json_numbers_are_numbers() {
    let (_, art) = lenet_artifact("conventions", "json");
    let bench = bench_json(&art, 1, 5, &["--threads", "1"]);
    for key in ["median_ms", "p99_ms", "stddev_ms", "min_ms"] {
        let v = &bench[key];
        assert!(v.is_number(), "{key}: {bench}");
        // Rounded to the nanosecond: at most six decimals.
        let text = v.to_string();
        let decimals = text.split_once('.').map_or(0, |(_, d)| d.trim_start_matches(|c| c != 'e').len());
        assert!(decimals <= 6, "{key} = {text}: not rounded");
    }
    for key in ["iterations", "warmup", "threads"] {
        assert!(bench[key].is_u64(), "{key}: {bench}");
    }
    let inspect: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("inspect --json");
    assert_eq!(inspect["constants"]["embedded"], serde_json::json!(true));
    assert!(inspect["constants"]["bytes"].as_u64().is_some_and(|b| b > 0), "{inspect}");
    // No number hides in a string anywhere: bindings are objects of numbers.
    let cmds = inspect["entries"][0]["commands"].as_array().expect("commands");
    let d = cmds.iter().find(|c| c["op"] == "dispatch").expect("a dispatch");
    for b in d["bindings"].as_array().expect("bindings") {
        assert!(b["slot"].is_string() && b["offset"].is_u64() && b["bytes"].is_u64(), "{b}");
    }
    let buf = &inspect["entries"][0]["buffers"][0];
    assert!(buf["at"]["offset"].is_u64() && buf["bytes"].is_u64(), "{buf}");
    fn no_digits_in_strings(v: &serde_json::Value, key: &str) {
        match v {
            serde_json::Value::String(s) if ["slot", "at", "src", "dst", "constants"].contains(&key) => {
                assert!(!s.chars().any(|c| c.is_ascii_digit()), "{key}: {s}")
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| no_digits_in_strings(x, key)),
            serde_json::Value::Object(o) => o.iter().for_each(|(k, x)| no_digits_in_strings(x, k)),
            _ => {}
        }
    }
    no_digits_in_strings(&inspect, "");
}

#[test]
fn threads_over_the_cores_warn() {
    let (_, art) = lenet_artifact("conventions", "threads");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let many = (cores + 1).to_string();
    let (good, _, err) = kiln(&["run", s(&art), "--threads", &many]);
    assert!(good, "{err}");
    assert!(err.starts_with(&format!("warning: --threads {many} is more than the {cores} core")), "{err}");
    let (good, _, err) =
        kiln(&["bench", s(&art), "--threads", &cores.to_string(), "--iterations", "1", "--warmup", "0"]);
    assert!(good, "{err}");
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn missing_weights_name_the_option() {
    let dir = scratch("conventions", "weights");
    let art = dir.join("lenet.kiln");
    let w = dir.join("lenet.weights");
    ok(&["compile", LENET, "-o", s(&art), "--external-weights", s(&w)]);
    std::fs::remove_file(&w).expect("remove weights");
    fails_with(&["run", s(&art)], &["--weights"]);
}

#[test]
fn model_options_given_an_artifact_are_refused() {
    let (_, art) = lenet_artifact("conventions", "artifact-options");
    fails_with(&["run", s(&art), "--input-shape", "input=1x1x28x28"], &["--input-shape", "artifact"]);
    fails_with(&["inspect", s(&art), "--target-cpu", "x86-64-v3"], &["--target-cpu", "artifact"]);
    // Given the model, they apply.
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["inspect", LENET, "--input-shape", "input=1x1x28x28", "--json"])).expect("json");
    assert_eq!(json["entries"][0]["inputs"][0]["dims"], serde_json::json!([1, 1, 28, 28]));
}

#[test]
fn emit_c_array_and_object() {
    let (dir, art) = lenet_artifact("conventions", "emit");
    let bytes = std::fs::read(&art).expect("artifact");
    // C source: the same bytes, aligned, under the symbol; it compiles.
    let c = dir.join("model.c");
    ok(&["compile", LENET, "-o", s(&c), "--emit", "c-array", "--symbol", "lenet_model"]);
    let text = std::fs::read_to_string(&c).expect("c source");
    assert!(text.contains("const unsigned char lenet_model[] __attribute__((aligned(64))) = {"), "{}", &text[..300]);
    assert!(text.contains(&format!("const unsigned long lenet_model_len = {};", bytes.len())));
    let parsed: Vec<u8> = text
        .split_once("= {")
        .and_then(|(_, rest)| rest.split_once("};"))
        .expect("array body")
        .0
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| u8::from_str_radix(x.trim_start_matches("0x"), 16).expect("byte"))
        .collect();
    assert_eq!(parsed, bytes, "the array holds the artifact");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = std::process::Command::new(&cc)
        .args(["-c", "-Wall", "-Werror", s(&c), "-o", s(&dir.join("model_c.o"))])
        .status()
        .expect("run cc");
    assert!(st.success(), "cc -c model.c failed");
    // The object: an x86-64 ELF relocatable whose .rodata holds the bytes at the symbol.
    let o = dir.join("model.o");
    ok(&["compile", LENET, "-o", s(&o), "--emit", "object"]);
    let obj = std::fs::read(&o).expect("object");
    assert_eq!(&obj[..4], b"\x7fELF");
    assert_eq!(obj[4], 2, "64-bit");
    assert_eq!(u16::from_le_bytes([obj[16], obj[17]]), 1, "ET_REL");
    assert_eq!(u16::from_le_bytes([obj[18], obj[19]]), 62, "EM_X86_64");
    let at = obj.windows(bytes.len()).position(|w| w == bytes).expect("the artifact's bytes in the object");
    assert!(at > 0);
    // --symbol must be a C identifier, and means nothing for --emit kiln.
    fails_with(
        &["compile", LENET, "-o", s(&o), "--emit", "object", "--symbol", "9lives"],
        &["--symbol", "C identifier"],
    );
    fails_with(&["compile", LENET, "-o", s(&art), "--symbol", "m"], &["--symbol", "--emit"]);
}
