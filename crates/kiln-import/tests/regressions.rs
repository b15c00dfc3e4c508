//! Models that once imported wrongly or failed badly (found in review), with what
//! must happen now. The files are in `tests/data/` (also in the fuzz corpus).

use kiln_import::{onnx::import_file, ImportOptions};
use kiln_ir::Graph;
use std::path::PathBuf;

fn import(name: &str) -> Result<Graph, String> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name);
    import_file(&p, &ImportOptions::default()).map_err(|e| e.to_string())
}

fn error(name: &str) -> String {
    let e = import(name).err().unwrap_or_else(|| panic!("{name} should not import"));
    assert!(!e.contains('\n'), "{name}: error is not one line: {e}");
    e
}

fn output_names(g: &Graph) -> Vec<String> {
    g.outputs.iter().map(|&v| g.values[v].name.clone()).collect()
}

#[test]
fn unused_split_outputs_still_count_as_parts() {
    // Split(x: f32[6]) -> a, b, c with only `a` used: `a` is f32[2].
    let g = import("split_trim.onnx").unwrap();
    assert_eq!(g.ty(g.outputs[0]).to_string(), "f32[2]");
}

#[test]
fn names_defined_inside_a_branch_are_not_outer_dependencies() {
    // A branch defines `y` internally; the outer graph defines its own `y` later.
    // That is not a cycle, and the graph output keeps the name `y`.
    let g = import("outname.onnx").unwrap();
    assert_eq!(output_names(&g), vec!["y"]);
    let g = import("outname2.onnx").unwrap();
    assert_eq!(output_names(&g), vec!["y"]);
}

#[test]
fn one_value_produced_twice_is_an_error() {
    let e = error("dup_prod.onnx");
    assert!(e.contains("\"t\" is produced by two nodes"), "{e}");
}

#[test]
fn legacy_broadcast_axis_out_of_range() {
    for f in ["legacy_bcast.onnx", "legacy_bcast_neg.onnx"] {
        let e = error(f);
        assert!(e.contains("legacy broadcast axis") && e.contains("does not fit"), "{e}");
    }
}

#[test]
fn softmax_before_13_rejects_axis_equal_to_rank() {
    assert!(error("softmax_axis.onnx").contains("axis 2 out of range for rank 2"));
}

#[test]
fn unsupported_legacy_forms_are_named() {
    assert!(error("bn_spatial.onnx").contains("spatial=0"));
    assert!(error("dropout_mask.onnx").contains("mask output of Dropout before opset 10"));
}

#[test]
fn control_characters_in_names_are_escaped() {
    assert!(error("nl_name.onnx").contains("node `a\\nb`"));
}

#[test]
fn deep_nesting_is_a_decode_error() {
    assert!(error("deep32.onnx").contains("not a valid ONNX model"));
}

#[test]
fn branches_returning_outer_values() {
    // Outputs that are graph inputs or outer values, and the same value twice.
    assert!(import("if_in.onnx").is_ok());
    assert!(import("if_outer.onnx").is_ok());
    assert!(import("outname3.onnx").is_ok());
}

#[test]
fn unsupported_ops_matter_only_in_the_branch_taken() {
    // then: Neg; else: an unknown op. A true condition imports; a false one names the op.
    let g = import("dead_branch_unsupported.onnx").unwrap();
    assert_eq!(g.nodes.values().map(|n| n.op.kind.name()).collect::<Vec<_>>(), vec!["Neg"]);
    let e = error("live_branch_unsupported.onnx");
    assert!(e.contains("unsupported operators: Frobnicate (ai.onnx opset 17"), "{e}");
}
