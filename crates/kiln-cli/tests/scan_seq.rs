//! `Scan` and sequences of compile-time length through the whole pipeline, compared
//! with ONNX Runtime.
//!
//! The models and ONNX Runtime's outputs come from `scripts/ref_scan_seq.py`
//! (`$KILN_TEST_DATA/scan-seq/manifest.json`; a missing manifest is a failure):
//! `scan_rnn`, an opset-16 `Scan` with two states, scan inputs and outputs on other
//! axes and backwards, a run-time `If` and a nested `Scan` in its body; `seq_ops`,
//! every sequence op at constant positions, a sequence input and a sequence output,
//! and an `Optional` whose presence folds an `If`; `loop_seq`, a `Loop` of run-time
//! trips (`--max-trips 4`) carrying a sequence, each trip a run-time `If` over the
//! sequence's elements (0, 1, 3 and 4 trips). Each case runs through the
//! reference evaluator and the compiled artifact (1 and 3 threads); a sequence is fed
//! and read as its elements (`name[i]`).
//!
//! `SequenceAt` at a run-time position selects among the elements (checked against
//! the fed element it names). Refusals are typed errors naming the node or the
//! input: an insertion at a run-time position, a run-time `SequenceAt` over elements
//! of different types, a sequence input without its shapes, run-time `If` branches
//! giving sequences of different lengths, an empty optional's element.

mod common;

use common::{compare, data_dir, graph_attr, int_attr, onnx_model, read_npy};
use kiln_import::onnx::proto::{
    attribute_proto::AttributeType, type_proto, AttributeProto, GraphProto, NodeProto, TypeProto, ValueInfoProto,
};
use kiln_import::{ImportError, ImportOptions};
use kiln_ir::Tensor;
use serde_json::Value;

fn manifest() -> Value {
    common::test_manifest("scan-seq", "ref_scan_seq.py")
}

fn files(v: &Value) -> Vec<Tensor> {
    v["files"].as_array().expect("files").iter().map(|f| read_npy(f.as_str().expect("file"))).collect()
}

fn check(name: &str) {
    let m = manifest()["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("model `{name}` is not in scan-seq/manifest.json"))
        .clone();
    let path = data_dir().join(m["file"].as_str().expect("file"));
    let bytes = std::fs::read(&path).expect("model file");
    let (ins, outs) = kiln_import::onnx::signature(bytes.into()).expect("signature");
    for case in m["cases"].as_array().expect("cases") {
        let label = format!("{name}/{}", case["label"].as_str().expect("label"));
        // The sequence inputs' shapes bind the compile, like `--input-sequence`.
        let mut opts =
            ImportOptions { max_trips: m["max_trips"].as_u64().map(|t| t as usize), ..ImportOptions::default() };
        let mut feeds_by_name: Vec<(String, Tensor)> = Vec::new();
        for ((n, _), v) in ins.iter().zip(case["inputs"].as_array().expect("inputs")) {
            let ts = files(v);
            if v["sequence"].as_bool().expect("sequence flag") {
                opts.input_sequences.push((n.clone(), ts.iter().map(|t| t.shape().dims().to_vec()).collect()));
                for (i, t) in ts.into_iter().enumerate() {
                    feeds_by_name.push((kiln_import::onnx::element_name(n, i), t));
                }
            } else {
                feeds_by_name.push((n.clone(), ts.into_iter().next().expect("one file")));
            }
        }
        let mut want: Vec<(String, Tensor)> = Vec::new();
        for ((n, _), v) in outs.iter().zip(case["outputs"].as_array().expect("outputs")) {
            let ts = files(v);
            if v["sequence"].as_bool().expect("sequence flag") {
                want.extend(ts.into_iter().enumerate().map(|(i, t)| (kiln_import::onnx::element_name(n, i), t)));
            } else {
                want.push((n.clone(), ts.into_iter().next().expect("one file")));
            }
        }
        let g = kiln_import::onnx::import_file(&path, &opts).unwrap_or_else(|e| panic!("{label}: import: {e}"));
        assert!(
            !g.nodes.iter().any(|(_, n)| matches!(n.op.kind.to_string().as_str(), "Scan" | "Loop")),
            "{label}: Scan and Loop are unrolled at import"
        );
        if opts.max_trips.is_some() {
            assert!(
                g.nodes.iter().any(|(_, n)| n.op.kind == kiln_ir::OpKind::If),
                "{label}: trips of a run-time count stay run-time Ifs"
            );
        }
        let feeds: Vec<Tensor> = g
            .inputs
            .iter()
            .map(|&v| {
                let n = &g.values[v].name;
                feeds_by_name
                    .iter()
                    .find(|(k, _)| k == n)
                    .unwrap_or_else(|| panic!("{label}: no feed for `{n}`"))
                    .1
                    .clone()
            })
            .collect();
        let out_names: Vec<&str> = g.outputs.iter().map(|&v| g.values[v].name.as_str()).collect();
        let want_names: Vec<&str> = want.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(out_names, want_names, "{label}: outputs (a sequence is its elements)");
        let refs = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{label}: reference: {e}"));
        for ((r, (n, w)), k) in refs.iter().zip(&want).zip(0..) {
            compare(&format!("{label} output {k} `{n}` (reference)"), r, w);
        }
        let c = kiln_compiler::compile(&g, &Default::default()).unwrap_or_else(|e| panic!("{label}: compile: {e}"));
        let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
        for threads in [1, 3] {
            let got = common::run_module(&module, Some(threads), &g, &feeds);
            for (k, (got, (n, w))) in got.iter().zip(&want).enumerate() {
                compare(&format!("{label} output {k} `{n}` (compiled, {threads} threads)"), got, w);
            }
        }
    }
}

#[test]
fn scan_with_axes_directions_a_run_time_if_and_a_nested_scan_matches_onnx_runtime() {
    check("scan_rnn");
}

#[test]
fn sequence_ops_of_compile_time_length_match_onnx_runtime() {
    check("seq_ops");
}

#[test]
fn a_loop_of_run_time_trips_carrying_a_sequence_matches_onnx_runtime() {
    check("loop_seq");
}

// ---- Refusals: typed errors naming the node or the input. ----

fn tensor_vi(name: &str, dims: &[i64]) -> ValueInfoProto {
    use kiln_import::onnx::proto::{
        tensor_shape_proto::dimension::Value as D, tensor_shape_proto::Dimension, TensorShapeProto,
    };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension { value: Some(D::DimValue(d)), ..Default::default() })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn i64_vi(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(7),
                shape: Some(Default::default()),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn seq_vi(name: &str) -> ValueInfoProto {
    let elem = TypeProto {
        value: Some(type_proto::Value::TensorType(type_proto::Tensor { elem_type: Some(1), shape: None })),
        ..Default::default()
    };
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::SequenceType(Box::new(type_proto::Sequence {
                elem_type: Some(Box::new(elem)),
            }))),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], outputs: &[&str], name: &str) -> NodeProto {
    NodeProto { name: Some(name.into()), ..common::node(op, inputs, outputs) }
}

fn node_error(r: Result<kiln_ir::Graph, ImportError>, want_node: &str, want_op: &str, needle: &str) {
    match r {
        Err(ImportError::Node { node, op_type, message, .. }) => {
            assert_eq!((node.as_str(), op_type.as_str()), (want_node, want_op), "{message}");
            assert!(message.contains(needle), "`{message}` should say `{needle}`");
        }
        Err(e) => panic!("expected a node error, got {e:?}"),
        Ok(_) => panic!("expected a node error, the import succeeded"),
    }
}

fn import(bytes: Vec<u8>, opts: &ImportOptions) -> Result<kiln_ir::Graph, ImportError> {
    kiln_import::onnx::import_bytes(bytes.into(), None, opts)
}

#[test]
fn a_sequence_insert_at_a_position_computed_at_run_time_is_refused_naming_the_node() {
    let mut cat = node("ConcatFromSequence", &["s2"], &["y"], "cat");
    cat.attribute = vec![int_attr("axis", 0)];
    let m = onnx_model(
        vec![
            node("SequenceConstruct", &["a", "b"], &["s"], "make"),
            node("SequenceInsert", &["s", "a", "p"], &["s2"], "put"),
            cat,
        ],
        vec![tensor_vi("a", &[2]), tensor_vi("b", &[2]), i64_vi("p")],
        vec![tensor_vi("y", &[6])],
        vec![],
    );
    node_error(import(m.clone(), &ImportOptions::default()), "put", "SequenceInsert", "depends on run-time data");
    // Bound to a value, the position is known and the list is edited at import.
    let opts = ImportOptions { input_values: vec![("p".into(), vec![1.0])], ..Default::default() };
    let g = import(m, &opts).expect("a constant position imports");
    assert_eq!(g.inputs.len(), 2);
}

/// `SequenceAt` at a run-time position selects among the (same-typed) elements: the
/// result is the fed element the position names, negative positions from the end.
#[test]
fn sequence_at_a_run_time_position_selects_the_element() {
    let m = onnx_model(
        vec![
            node("SequenceConstruct", &["a", "b", "c"], &["s"], "make"),
            node("SequenceAt", &["s", "p"], &["y"], "pick"),
        ],
        vec![tensor_vi("a", &[2, 3]), tensor_vi("b", &[2, 3]), tensor_vi("c", &[2, 3]), i64_vi("p")],
        vec![tensor_vi("y", &[2, 3])],
        vec![],
    );
    let g = import(m, &ImportOptions::default()).expect("a run-time position over same-typed elements imports");
    let c = kiln_compiler::compile(&g, &Default::default()).expect("compile");
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let shape = kiln_ir::Shape::new([2, 3]).expect("shape");
    let elems: Vec<Tensor> = (0..3)
        .map(|k| Tensor::from_vec(shape.clone(), (0..6).map(|i| (10 * k + i) as f32).collect::<Vec<f32>>()).expect("t"))
        .collect();
    for (p, want) in [(0i64, 0usize), (1, 1), (2, 2), (-1, 2), (-3, 0)] {
        let pt = Tensor::scalar(p);
        let feeds = [elems[0].clone(), elems[1].clone(), elems[2].clone(), pt];
        let refs = kiln_ref::eval_graph(&g, &feeds).expect("reference");
        compare(&format!("position {p} (reference)"), &refs[0], &elems[want]);
        let mut inst = kiln_runtime::Instance::new(&module).expect("instance");
        let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
        let mut out = vec![0u8; 24];
        inst.invoke(&ins, &mut [&mut out[..]]).expect("invoke");
        let got = Tensor::new(g.values[g.outputs[0]].ty.clone(), out.into()).expect("tensor");
        compare(&format!("position {p} (compiled)"), &got, &elems[want]);
    }
}

#[test]
fn sequence_at_a_run_time_position_over_elements_of_different_types_is_refused_naming_the_node() {
    let m = onnx_model(
        vec![node("SequenceConstruct", &["a", "b"], &["s"], "make"), node("SequenceAt", &["s", "p"], &["y"], "pick")],
        vec![tensor_vi("a", &[2]), tensor_vi("b", &[3]), i64_vi("p")],
        vec![tensor_vi("y", &[2])],
        vec![],
    );
    node_error(import(m, &ImportOptions::default()), "pick", "SequenceAt", "elements differ in type");
}

#[test]
fn a_sequence_input_needs_its_shapes() {
    let m =
        onnx_model(vec![node("SequenceLength", &["s"], &["n"], "len")], vec![seq_vi("s")], vec![i64_vi("n")], vec![]);
    match import(m.clone(), &ImportOptions::default()) {
        Err(ImportError::Input { name, message }) => {
            assert_eq!(name, "s");
            assert!(message.contains("--input-sequence"), "{message}");
        }
        other => panic!("expected an input error, got {other:?}"),
    }
    let opts =
        ImportOptions { input_sequences: vec![("s".into(), vec![vec![2], vec![3], vec![1]])], ..Default::default() };
    let g = import(m, &opts).expect("with shapes");
    let n = g.constant(g.outputs[0]).expect("SequenceLength folds to a constant");
    assert_eq!(n.to_f64_vec(), vec![3.0]);
}

#[test]
fn run_time_branches_giving_sequences_of_different_lengths_are_refused_naming_the_node() {
    let branch = |n: usize, out: &str| GraphProto {
        name: Some(out.into()),
        node: vec![node("SequenceConstruct", &vec!["x"; n], &[out], "mk")],
        output: vec![seq_vi(out)],
        ..Default::default()
    };
    let mut iff = node("If", &["c"], &["s"], "choose");
    iff.attribute = vec![graph_attr("then_branch", branch(1, "t")), graph_attr("else_branch", branch(2, "e"))];
    let mut rs = node("ReduceSum", &["x"], &["sum"], "sum");
    rs.attribute = vec![int_attr("keepdims", 0)];
    let zero = kiln_import::onnx::proto::TensorProto {
        name: Some("zero".into()),
        data_type: Some(1),
        float_data: vec![0.0],
        ..Default::default()
    };
    let m = onnx_model(
        vec![rs, node("Greater", &["sum", "zero"], &["c"], "gt"), iff, node("SequenceLength", &["s"], &["n"], "len")],
        vec![tensor_vi("x", &[2])],
        vec![i64_vi("n")],
        vec![zero],
    );
    node_error(
        import(m, &ImportOptions::default()),
        "choose",
        "If",
        "a sequence of 1 tensors in then_branch and a sequence of 2 tensors",
    );
}

#[test]
fn the_element_of_an_empty_optional_is_refused_naming_the_node() {
    let mut opt = node("Optional", &[], &["o"], "none");
    opt.attribute = vec![AttributeProto {
        name: Some("type".into()),
        r#type: Some(AttributeType::TypeProto as i32),
        ..Default::default()
    }];
    let m = onnx_model(
        vec![opt, node("OptionalGetElement", &["o"], &["y"], "get")],
        vec![],
        vec![tensor_vi("y", &[2])],
        vec![],
    );
    node_error(import(m, &ImportOptions::default()), "get", "OptionalGetElement", "the optional is empty");
}

#[test]
fn a_loop_growing_a_sequence_on_run_time_trips_is_refused_naming_the_node() {
    // Trip count 3, initial condition from data: each trip is a run-time If, and the
    // body appends to the carried sequence, so its length would depend on the data.
    let body = GraphProto {
        name: Some("body".into()),
        node: vec![
            node("Identity", &["c_in"], &["c_out"], "keep"),
            node("SequenceInsert", &["s_in", "x"], &["s_out"], "append"),
        ],
        input: vec![i64_vi("i"), i64_vi("c_in"), seq_vi("s_in")],
        output: vec![i64_vi("c_out"), seq_vi("s_out")],
        ..Default::default()
    };
    let mut lp = node("Loop", &["m", "c", "s0"], &["s"], "grow");
    lp.attribute = vec![graph_attr("body", body)];
    let mut rs = node("ReduceSum", &["x"], &["sum"], "sum");
    rs.attribute = vec![int_attr("keepdims", 0)];
    let init = |name: &str, t: i32, f: Vec<f32>, i: Vec<i64>| kiln_import::onnx::proto::TensorProto {
        name: Some(name.into()),
        data_type: Some(t),
        float_data: f,
        int64_data: i,
        ..Default::default()
    };
    let m = onnx_model(
        vec![
            rs,
            node("Greater", &["sum", "zero"], &["c"], "gt"),
            node("SequenceEmpty", &[], &["s0"], "empty"),
            lp,
            node("SequenceLength", &["s"], &["n"], "len"),
        ],
        vec![tensor_vi("x", &[2])],
        vec![i64_vi("n")],
        vec![init("zero", 1, vec![0.0], vec![]), init("m", 7, vec![], vec![3])],
    );
    node_error(
        import(m, &ImportOptions::default()),
        "grow",
        "Loop",
        "loop-carried value 0 is a sequence of 1 tensors after trip 0 and a sequence of 0 tensors before it",
    );
}

/// `kiln compile` with `--input-sequence`: the sequence input becomes one input per
/// element (`s[i]`), a sequence output one output per element; without it, the one-line
/// error names the input and the flag.
#[test]
fn the_cli_compiles_a_sequence_input_given_its_shapes() {
    let model = data_dir().join("scan-seq/seq_ops.onnx");
    let dir = common::scratch("scan_seq", "cli");
    let art = dir.join("seq_ops.kiln");
    let (model, art) = (common::s(&model), common::s(&art));
    common::fails_with(&["compile", model, "-o", art], &["input `s`", "--input-sequence"]);
    common::ok(&["compile", model, "--input-sequence", "s=2x3;1x3;3x3", "-o", art]);
    let text = common::ok(&["inspect", art]);
    for want in [
        "input s[0] f32[2, 3]",
        "input s[1] f32[1, 3]",
        "input s[2] f32[3, 3]",
        "output s_cat f32[6, 3]",
        "output parts[2] f32[3, 3]",
    ] {
        assert!(text.contains(want), "`{want}` not in:\n{text}");
    }
    // An element shape the model's declaration rules out.
    common::fails_with(&["compile", model, "--input-sequence", "s=2x4", "-o", art], &["input `s`", "element 0"]);
}
