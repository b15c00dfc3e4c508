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

/// One test per model that must not import: its one-line error contains each text.
macro_rules! refused {
    ($($test:ident: $file:literal => [$($want:literal),+],)*) => {
        $(
            #[test]
            fn $test() {
                let e = error($file);
                for want in [$($want),+] {
                    assert!(e.contains(want), "`{want}` not in: {e}");
                }
            }
        )*
    };
}

refused! {
    one_value_produced_twice_is_an_error: "dup_prod.onnx" => ["\"t\" is produced by two nodes"],
    legacy_broadcast_axis_out_of_range: "legacy_bcast.onnx" => ["legacy broadcast axis", "does not fit"],
    negative_legacy_broadcast_axis_out_of_range: "legacy_bcast_neg.onnx" => ["legacy broadcast axis", "does not fit"],
    softmax_before_13_rejects_axis_equal_to_rank: "softmax_axis.onnx" => ["axis 2 out of range for rank 2"],
    batch_norm_spatial_0_is_named: "bn_spatial.onnx" => ["spatial=0"],
    dropout_mask_before_opset_10_is_named: "dropout_mask.onnx" => ["mask output of Dropout before opset 10"],
    control_characters_in_names_are_escaped: "nl_name.onnx" => ["node `a\\nb`"],
    deep_nesting_is_a_decode_error: "deep32.onnx" => ["not a valid ONNX model"],
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
