//! Run-time control flow (`If` whose condition is computed at run time, and `Loop`
//! unrolled into such `If`s) through the whole pipeline, compared with ONNX Runtime on
//! inputs that take every path and trip count.
//!
//! The models and ONNX Runtime's outputs come from `scripts/ref_control_flow.py`
//! (`$KILN_TEST_DATA/control-flow/manifest.json`; a missing manifest is a failure): a
//! two-stage classifier whose second stage runs only when the first fires, a nested
//! `If` with three paths, an `If` whose branches have different op mixes and return
//! a captured value and a constant, a `Loop` with a constant bound and a data-dependent
//! early exit (0, 1, 4 and 6 trips), and a `Loop` whose trip count is an input
//! (`--max-trips 5`; 0, 2 and 5 trips). Every case runs through the reference evaluator,
//! the flow interpreter, and the compiled artifact on the local-sync driver and on
//! the local-task driver with 1 and 3 threads; the compiled plan must hold `SkipIf`
//! commands (the branches really are conditional) and must run only one branch's
//! dispatches per call.
//!
//! Malformed inputs (a branch with the wrong output count, branches of different
//! result types) fail with typed errors naming the node. (The CUDA runtime's refusal
//! of a conditional plan is tested in `kiln-runtime`'s `cuda::graph`.)

mod common;

use common::{case_tensors, compare_outputs, data_dir, graph_attr, int_attr, node, onnx_model, run_module};
use kiln_import::onnx::proto::{GraphProto, NodeProto, TensorProto, ValueInfoProto};
use kiln_module::program::Command;
use serde_json::Value;

fn manifest() -> Value {
    common::test_manifest("control-flow", "ref_control_flow.py")
}

fn model(name: &str) -> Value {
    manifest()["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("model `{name}` is not in control-flow/manifest.json"))
        .clone()
}

/// Every case of `name` through every path of evaluation; returns the number of
/// dispatches each case ran (counted by the local-sync driver's observer).
fn check(name: &str) -> Vec<usize> {
    let m = model(name);
    let path = data_dir().join(m["file"].as_str().expect("file"));
    let opts =
        kiln_import::ImportOptions { max_trips: m["max_trips"].as_u64().map(|t| t as usize), ..Default::default() };
    let g = kiln_import::onnx::import_file(&path, &opts).unwrap_or_else(|e| panic!("{name}: import: {e}"));
    assert!(g.nodes.iter().any(|(_, n)| n.op.kind == kiln_ir::OpKind::If), "{name}: the If should stay a run-time If");
    // The text form round trips, branches included.
    let text = kiln_ir::text::print(&g);
    let g2 = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{name}: parse of printed IR: {e}"));
    assert!(g == g2, "{name}: print → parse changed the graph");
    let c = kiln_compiler::compile(&g, &Default::default()).unwrap_or_else(|e| panic!("{name}: compile: {e}"));
    // The flow text form keeps the guards (`when %c` / `unless %c`).
    let flow_text = format!("{}", c.flow);
    assert!(flow_text.contains(" when %") && flow_text.contains(" unless %"), "{name}: guards in the flow text");
    let reparsed = kiln_flow::text::parse_program(&flow_text).unwrap_or_else(|e| panic!("{name}: flow text: {e}"));
    assert!(reparsed == c.flow, "{name}: flow print → parse changed the program");
    let skips = c.program.entries[0].commands.iter().filter(|c| matches!(c, Command::SkipIf { .. })).count();
    assert!(skips >= 2, "{name}: {skips} conditional commands in the plan");
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let mut ran = Vec::new();
    let mut paths = Vec::new();
    for case in m["cases"].as_array().expect("cases") {
        let label = format!("{name}/{}", case["label"].as_str().expect("label"));
        paths.push(case["path"].as_str().expect("path").to_string());
        let (feeds, want) = (case_tensors(case, "inputs"), case_tensors(case, "outputs"));
        assert_eq!(want.len(), g.outputs.len(), "{label}: output count");
        let refs = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{label}: reference: {e}"));
        compare_outputs(&label, "reference", &refs, &want);
        let flow = kiln_flow::program::interpret(&c.flow, &feeds).unwrap_or_else(|e| panic!("{label}: flow: {e}"));
        compare_outputs(&label, "flow interpreter", &flow, &want);
        for threads in [None, Some(1), Some(3)] {
            let got = run_module(&module, threads, &g, &feeds);
            compare_outputs(&label, &format!("compiled, threads {threads:?}"), &got, &want);
        }
        // How many dispatches the plan ran: only the branch taken.
        let mut inst = kiln_runtime::Instance::new(&module).expect("instance");
        let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
        let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        let commands = &c.program.entries[0].commands;
        let mut n = 0;
        inst.invoke_observed(&ins, &mut refs, kiln_runtime::Observe::Commands, &mut |i| {
            if matches!(commands[i], Command::Dispatch { .. }) {
                n += 1;
            }
        })
        .expect("observed invoke");
        ran.push(n);
    }
    // Distinct paths run different dispatches, and none runs them all.
    let all = c.program.entries[0].commands.iter().filter(|c| matches!(c, Command::Dispatch { .. })).count();
    assert!(ran.iter().all(|&n| n < all), "{name}: dispatches run per case {ran:?} of {all}: a branch was not skipped");
    eprintln!("CONTROL FLOW {name}: paths {paths:?} ran {ran:?} of {all} dispatches, {skips} skips");
    ran
}

/// One test a model: [`check`] it, and the number of paths its cases take.
macro_rules! path_tests {
    ($($(#[$doc:meta])* $test:ident: $model:literal takes $paths:literal;)*) => {$(
        $(#[$doc])*
        #[test]
        fn $test() {
            assert_eq!(check($model).len(), $paths);
        }
    )*};
}

path_tests! {
    if_score_runs_the_second_stage_only_when_it_fires: "if_score" takes 2;
    if_nested_takes_each_of_three_paths: "if_nested" takes 3;
    if_mixed_branches_of_different_op_mixes: "if_mixed" takes 2;
    /// 0, 1, 4 trips and the bound (6): each trip is a run-time If (the initial
    /// condition is data), whose else-branch passes the loop-carried values through, so
    /// every call runs one branch per trip (the same number of dispatches) and a trip
    /// not taken costs its copies.
    loop_with_a_bound_exits_early_on_data: "loop_early_exit" takes 4;
    loop_with_a_run_time_trip_count_under_max_trips: "loop_count" takes 3;
}

/// `err` is an error of node `name` (an `op_type`) whose message holds `needle`.
fn node_error(err: &kiln_import::ImportError, name: &str, op_type: &str, needle: &str) {
    match err {
        kiln_import::ImportError::Node { node, op_type: op, message, .. } => {
            assert_eq!((node.as_str(), op.as_str()), (name, op_type), "{err}");
            assert!(message.contains(needle), "{err}");
        }
        e => panic!("expected a node error, got {e:?}"),
    }
}

#[test]
fn an_unbounded_loop_without_max_trips_is_a_typed_error_naming_the_node() {
    let path = data_dir().join(model("loop_count")["file"].as_str().expect("file"));
    let err = kiln_import::onnx::import_file(&path, &Default::default()).expect_err("no bound");
    node_error(&err, "count", "Loop", "--max-trips");
}

// ---- Malformed models: typed errors naming the node. ----

fn vi(name: &str, dims: &[i64]) -> ValueInfoProto {
    common::value_info(name, &dims.iter().map(|&d| Some(d)).collect::<Vec<_>>())
}

/// `y = If(ReduceSum(x) > 0)` with the given branches.
fn if_model(then: GraphProto, els: GraphProto, outputs: &[&str]) -> Vec<u8> {
    let zero =
        TensorProto { name: Some("zero".into()), data_type: Some(1), float_data: vec![0.0], ..Default::default() };
    let mut iff = node("If", &["c"], outputs);
    iff.name = Some("the_if".into());
    iff.attribute = vec![graph_attr("then_branch", then), graph_attr("else_branch", els)];
    let mut rs = node("ReduceSum", &["x"], &["s"]);
    rs.attribute = vec![int_attr("keepdims", 0)];
    onnx_model(
        vec![rs, node("Greater", &["s", "zero"], &["c"]), iff],
        vec![vi("x", &[2, 3])],
        outputs.iter().map(|o| vi(o, &[2, 3])).collect(),
        vec![zero],
    )
}

fn branch(nodes: Vec<NodeProto>, outputs: &[(&str, &[i64])]) -> GraphProto {
    GraphProto {
        node: nodes,
        name: Some("b".into()),
        output: outputs.iter().map(|(n, d)| vi(n, d)).collect(),
        ..Default::default()
    }
}

fn import(bytes: Vec<u8>) -> Result<kiln_ir::Graph, kiln_import::ImportError> {
    kiln_import::onnx::import_bytes(bytes.into(), None, &Default::default())
}

#[test]
fn a_branch_with_the_wrong_output_count_is_a_typed_error_naming_the_node() {
    let then =
        branch(vec![node("Relu", &["x"], &["a"]), node("Neg", &["x"], &["b"])], &[("a", &[2, 3]), ("b", &[2, 3])]);
    let els = branch(vec![node("Neg", &["x"], &["e"])], &[("e", &[2, 3])]);
    let err = import(if_model(then, els, &["y"])).expect_err("two outputs for one");
    node_error(&err, "the_if", "If", "then_branch has 2 outputs");
}

#[test]
fn branches_of_different_result_types_are_a_typed_error_naming_the_node() {
    let then = branch(vec![node("Relu", &["x"], &["a"])], &[("a", &[2, 3])]);
    let mut flat = node("Flatten", &["x"], &["f"]);
    flat.attribute = vec![int_attr("axis", 0)];
    let els = branch(vec![flat], &[("f", &[1, 6])]);
    let err = import(if_model(then, els, &["y"])).expect_err("different shapes");
    node_error(&err, "the_if", "If", "same type");
}
