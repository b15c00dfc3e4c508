//! `kiln compile` driving the compiler's pipeline: `--list-passes` names every stage
//! and tensor pass, `--to LEVEL` stops after the level's stage, `--dump-after NAME`
//! prints the IR after a stage or pass, and a compile error is one line naming the op
//! and node.
//!
//! Expected texts come from the crates of each level run directly (kiln-ir, kiln-opt,
//! kiln-lower) or from the pipeline's own listing of names, not from the CLI under test.

mod common;

use common::{fails_with, kiln, ok};

const LENET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/lenet.onnx");
const PACKED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../kiln-compiler/tests/filetests/packed-weights.kir");

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-cli-pipeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

#[test]
fn list_passes_names_every_stage_and_tensor_pass_in_order() {
    let out = ok(&["compile", "--list-passes"]);
    let names: Vec<&str> = out.lines().filter_map(|l| l.split_whitespace().next()).collect();
    let mut want = Vec::new();
    for stage in kiln_compiler::Stage::ALL {
        want.push(stage.name());
        if stage == kiln_compiler::Stage::TensorPasses {
            want.extend(kiln_opt::registry().iter().map(|p| p.name()));
        }
    }
    assert_eq!(names, want);
    // Every name listed is one --dump-after takes.
    let out_file = scratch("list.kiln");
    for name in names {
        let (ok, _, err) = kiln(&["compile", PACKED, "-o", out_file.to_str().expect("path"), "--dump-after", name]);
        assert!(ok, "--dump-after {name}: {err}");
        assert!(err.starts_with(&format!("// after {name}\n")), "--dump-after {name}: {err}");
    }
}

#[test]
fn to_each_level_prints_that_levels_text() {
    let src = std::fs::read_to_string(PACKED).expect("filetest");
    let mut g = kiln_ir::text::parse(&src).expect("parse");
    kiln_opt::run_tensor_pipeline(&mut g).expect("tensor passes");
    assert_eq!(ok(&["compile", PACKED, "--to", "tensor"]), kiln_ir::text::print(&g));
    let flow = kiln_lower::form(&g).expect("dispatch formation");
    assert_eq!(ok(&["compile", PACKED, "--to", "flow"]), format!("{flow}\n"));
    // The stream level shows the plan that ships: the packed weights of x86-64-v3.
    let stream = ok(&["compile", PACKED, "--to", "stream", "--target-cpu", "x86-64-v3"]);
    let blessed = PACKED.replace(".kir", ".stream");
    assert_eq!(stream, std::fs::read_to_string(blessed).expect("blessed plan"));
    let hal = ok(&["compile", PACKED, "--to", "hal"]);
    assert!(hal.contains("entry main:"), "{hal}");
    fails_with(
        &["compile", PACKED, "--to", "bytes"],
        &["--to `bytes`", "tensor, flow, stream, hal, ptx, cubin or artifact"],
    );
}

#[test]
fn dump_after_a_stage_shows_the_level_after_it() {
    let out_file = scratch("dump.kiln");
    let (ok, _, err) = kiln(&[
        "compile",
        PACKED,
        "-o",
        out_file.to_str().expect("path"),
        "--target-cpu",
        "x86-64-v3",
        "--dump-after",
        "flow-form-dispatches",
        "--dump-after",
        "flow-pack-weights",
    ]);
    assert!(ok, "{err}");
    let (formed, packed) = err.split_once("// after flow-pack-weights\n").expect("both dumps");
    assert!(formed.starts_with("// after flow-form-dispatches\n"), "{err}");
    assert!(!formed.contains("panels") && packed.contains("\"w1.panels24\""), "{err}");
    fails_with(&["compile", PACKED, "--dump-after", "form-everything"], &["`form-everything`", "--list-passes"]);
}

#[test]
fn an_unsupported_op_is_one_line_naming_op_and_node() {
    let model = scratch("dropout.kir");
    std::fs::write(
        &model,
        r#"graph @g(%0: f32[4] "x") -> (%3) {
  %1 = const f32[] [0.5] "ratio"
  %2 = const bool[] [true] "training"
  %3 = Dropout(%0, %1, %2) : f32[4] "y" node "drop"
}
"#,
    )
    .expect("write");
    let m = model.to_str().expect("path");
    let out_file = scratch("dropout.kiln");
    fails_with(&["compile", m, "-o", out_file.to_str().expect("path")], &[m, "node `drop`", "Dropout", "random"]);
    // The import stage names the file once.
    fails_with(&["compile", m, "--input-shape", "x=4", "--to", "tensor"], &[m, "apply to ONNX models only"]);
}

#[test]
fn compile_reports_import_and_compile_time() {
    let out_file = scratch("lenet.kiln");
    let (ok, _, err) = kiln(&["compile", LENET, "-o", out_file.to_str().expect("path"), "--timings"]);
    assert!(ok, "{err}");
    assert!(err.lines().next().is_some_and(|l| l.contains("import ") && l.contains("compile ")), "{err}");
    for stage in kiln_compiler::Stage::ALL {
        assert!(err.lines().any(|l| l.trim_start().starts_with(stage.name())), "--timings lacks {stage}: {err}");
    }
}
