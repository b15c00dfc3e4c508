//! The pipeline API: stages in order, stopping after each one, the hook, and what kind
//! each error is.
//!
//! Expected values come from running the stage's own crate directly (kiln-ir's parser
//! and printer, kiln-opt's pipeline, kiln-lower's dispatch formation), not from the
//! pipeline under test.

use std::path::PathBuf;

use kiln_compiler::hal::{self, HalError};
use kiln_compiler::{
    stream, CodegenError, Compilation, CompileError, CpuTarget, ErrorKind, ImportOptions, Input, Level, Options, Stage,
    TextError,
};

fn filetest(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/filetests").join(name)
}

/// Two matrix products with constant weights: weight packing changes the program.
fn packed() -> PathBuf {
    filetest("packed-weights.kir")
}

/// A pinned target: packing must not depend on the machine.
fn options() -> Options {
    Options { target: CpuTarget::X86_64V3, ..Options::default() }
}

#[test]
fn stages_are_listed_in_pipeline_order_with_unique_names() {
    let names: Vec<&str> = Stage::ALL.iter().map(|s| s.name()).collect();
    assert_eq!(
        names,
        [
            "import",
            "tensor-passes",
            "flow-form-dispatches",
            "flow-narrow-storage",
            "flow-pack-weights",
            "stream-schedule",
            "cpu-codegen",
            "hal-build-program",
            "artifact-write"
        ]
    );
    for w in Stage::ALL.windows(2) {
        assert!(w[0] < w[1], "{} before {}", w[0], w[1]);
        assert_eq!(w[0].next(), Some(w[1]));
    }
    assert_eq!(Stage::Artifact.next(), None);
    for s in Stage::ALL {
        assert_eq!(Stage::from_name(s.name()), Some(s));
        assert!(!s.summary().is_empty());
        // A stage name never shadows a tensor pass (`--dump-after` takes both).
        assert!(kiln_opt::find(s.name()).is_err(), "{s} is also a tensor pass");
    }
    assert_eq!(Stage::from_name("form-dispatches"), None);
    assert_eq!(format!("[{:<8}]", Stage::Import), "[import  ]");
}

#[test]
fn levels_map_to_the_stage_that_completes_them() {
    let got: Vec<(&str, Stage)> = Level::ALL.iter().map(|l| (l.name(), l.stage())).collect();
    assert_eq!(
        got,
        [
            ("tensor", Stage::TensorPasses),
            ("flow", Stage::NarrowStorage),
            ("stream", Stage::Schedule),
            ("hal", Stage::Hal)
        ]
    );
    for l in Level::ALL {
        assert_eq!(Level::from_name(l.name()), Some(l));
    }
    assert_eq!(Level::from_name("artifact"), None);
}

#[test]
fn stopping_after_each_stage_gives_that_levels_text() {
    let src = std::fs::read_to_string(packed()).expect("filetest");
    let parsed = kiln_ir::text::parse(&src).expect("parse");
    let mut optimised = parsed.clone();
    kiln_opt::run_tensor_pipeline(&mut optimised).expect("tensor passes");
    let formed = kiln_lower::form(&optimised).expect("dispatch formation");
    let full = kiln_compiler::compile(&parsed, &options()).expect("compile");

    let mut previous_flow = None;
    for (i, &stage) in Stage::ALL.iter().enumerate() {
        let mut c = Compilation::new(Input::File(packed()), options());
        assert_eq!(c.done(), None);
        assert_eq!(c.text(), None);
        c.run_to(stage).unwrap_or_else(|e| panic!("{stage}: {e}"));
        assert_eq!(c.done(), Some(stage));
        let ran: Vec<Stage> = c.phases().iter().map(|&(s, _)| s).collect();
        assert_eq!(ran, Stage::ALL[..=i], "stages run up to {stage}");
        let text = c.text();
        match stage {
            Stage::Import => assert_eq!(text, Some(kiln_ir::text::print(&parsed))),
            Stage::TensorPasses => assert_eq!(text, Some(kiln_ir::text::print(&optimised))),
            Stage::FormDispatches => {
                assert_eq!(text, Some(format!("{formed}")));
                previous_flow = text;
            }
            // At the default f32 the stage changes nothing.
            Stage::NarrowStorage => assert_eq!(text, previous_flow),
            Stage::PackWeights => {
                let text = text.expect("flow text");
                assert_ne!(Some(&text), previous_flow.as_ref(), "packing changed nothing");
                assert!(text.contains("\"w1.panels24\""), "{text}");
            }
            Stage::Schedule => {
                assert_eq!(text, Some(stream::print(&full.flow, &full.plan)));
                assert!(c.cpu().is_none(), "codegen ran before it was asked for");
            }
            Stage::Codegen => {
                let text = text.expect("codegen notes");
                assert_eq!(text.lines().count(), full.flow.dispatches.len());
                assert!(text.lines().all(|l| l.starts_with('k') && l.contains(": ")), "{text}");
            }
            Stage::Hal => {
                assert_eq!(text, None);
                assert_eq!(c.program(), Some(&full.program));
                assert!(c.artifact().is_none());
            }
            Stage::Artifact => assert_eq!(c.artifact(), Some(&full.artifact[..])),
        }
        // Running on from here gives what one call gives.
        let rest = c.finish().unwrap_or_else(|e| panic!("finish after {stage}: {e}"));
        assert_eq!(rest.artifact, full.artifact, "finishing after {stage}");
        let ran: Vec<Stage> = rest.phases.iter().map(|&(s, _)| s).collect();
        assert_eq!(ran, Stage::ALL, "each stage once");
    }
}

#[test]
fn the_hook_sees_every_tensor_pass_and_stage_in_order() {
    let mut seen = Vec::new();
    let mut c = Compilation::new(Input::File(packed()), options());
    c.run_to_with(Stage::Artifact, &mut |name, c| seen.push((name.to_string(), c.done()))).expect("compile");
    let mut want: Vec<(String, Option<Stage>)> = vec![("import".into(), Some(Stage::Import))];
    // The passes run inside the tensor-passes stage: the last stage done is import.
    want.extend(kiln_opt::registry().iter().map(|p| (p.name().to_string(), Some(Stage::Import))));
    want.extend(Stage::ALL[1..].iter().map(|s| (s.name().to_string(), Some(*s))));
    assert_eq!(seen, want);
}

#[test]
fn a_chosen_pass_list_runs_only_those_passes() {
    let mut seen = Vec::new();
    let opts = Options { passes: Some(vec!["tensor-eliminate-dead-code".into()]), ..options() };
    let mut c = Compilation::new(Input::File(packed()), opts);
    c.run_to_with(Stage::TensorPasses, &mut |name, _| seen.push(name.to_string())).expect("passes");
    assert_eq!(seen, ["import", "tensor-eliminate-dead-code", "tensor-passes"]);

    let opts = Options { passes: Some(vec!["tensor-no-such-pass".into()]), ..options() };
    let e = Compilation::new(Input::File(packed()), opts).finish().expect_err("unknown pass");
    assert!(matches!(e, CompileError::Passes(kiln_opt::PassError::UnknownPass(ref p)) if p == "tensor-no-such-pass"));
    assert_eq!((e.stage(), e.kind()), (Stage::TensorPasses, ErrorKind::InvalidInput));
}

#[test]
fn every_input_form_imports_the_same_graph() {
    let src = std::fs::read_to_string(packed()).expect("filetest");
    let want = kiln_ir::text::print(&kiln_ir::text::parse(&src).expect("parse"));
    let inputs =
        [Input::File(packed()), Input::Text(src.clone()), Input::Graph(kiln_ir::text::parse(&src).expect("parse"))];
    for input in inputs {
        let g = kiln_compiler::import(input, &ImportOptions::default()).expect("import");
        assert_eq!(kiln_ir::text::print(&g), want);
    }
}

#[test]
fn an_op_without_a_lowering_is_unsupported_and_names_op_and_node() {
    // Dropout in training mode with a non-zero ratio is random: no lowering.
    let src = r#"graph @g(%0: f32[4] "x") -> (%3) {
  %1 = const f32[] [0.5] "ratio"
  %2 = const bool[] [true] "training"
  %3 = Dropout(%0, %1, %2) : f32[4] "y" node "drop"
}
"#;
    let e = Compilation::new(Input::Text(src.into()), options()).finish().expect_err("no lowering");
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert!(!e.is_internal());
    assert_eq!(e.stage(), Stage::FormDispatches);
    assert_eq!((e.op(), e.node()), (Some("Dropout"), Some("drop")));
    assert!(!e.needs_constant_operand());
    let msg = e.to_string();
    assert!(msg.contains("drop") && msg.contains("Dropout") && msg.contains("random"), "{msg}");
}

#[test]
fn malformed_input_is_invalid_input() {
    let e = kiln_compiler::import(Input::Text("graph @g(".into()), &ImportOptions::default()).expect_err("parse");
    assert!(matches!(e, CompileError::Text { path: None, source: TextError::Parse(_) }), "{e:?}");
    assert_eq!((e.stage(), e.kind()), (Stage::Import, ErrorKind::InvalidInput));

    let binds = ImportOptions { input_shapes: vec![("x".into(), vec![8, 32])], ..ImportOptions::default() };
    let e = kiln_compiler::import(Input::File(packed()), &binds).expect_err("options for IR text");
    assert!(matches!(e, CompileError::Text { source: TextError::ImportOptions, .. }), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{}: ", packed().display())), "{e}");

    let e = kiln_compiler::import(
        Input::OnnxBytes { bytes: bytes::Bytes::new(), base_dir: None },
        &ImportOptions::default(),
    )
    .expect_err("empty model");
    assert!(matches!(e, CompileError::Import { path: None, source: kiln_import::ImportError::Decode(_) }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);

    let missing = filetest("no-such-file.onnx");
    let e = kiln_compiler::import(Input::File(missing.clone()), &ImportOptions::default()).expect_err("no file");
    assert!(matches!(e, CompileError::Import { source: kiln_import::ImportError::Io { .. }, .. }), "{e:?}");
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("no-such-file.onnx"), "{e}");
}

#[test]
fn a_stage_fed_what_it_cannot_use_is_an_internal_error() {
    // A real HAL failure: the command list asked for with no workgroup counts.
    let mut c = Compilation::new(Input::File(packed()), options());
    c.run_to(Stage::Schedule).expect("schedule");
    let (flow, plan) = (c.flow().expect("flow"), c.plan().expect("plan"));
    let hal_error = hal::entry_point(flow, plan, &[], &[]).expect_err("no workgroup counts");
    assert!(matches!(hal_error, HalError::MissingWorkgroups { dispatch: 0, count: 0, .. }), "{hal_error:?}");
    let e = CompileError::from(hal_error);
    assert_eq!((e.stage(), e.kind()), (Stage::Hal, ErrorKind::Internal));
    assert!(e.is_internal());
    assert!(e.to_string().contains("k1_0"), "the message names the kernel: {e}");

    // The code generator's own split between unsupported and internal survives.
    let internal = CompileError::from(CodegenError::Internal { kernel: "k3".into(), what: "bad label".into() });
    assert_eq!((internal.stage(), internal.kind()), (Stage::Codegen, ErrorKind::Internal));
    let unsupported = CompileError::from(CodegenError::Unsupported { kernel: "k3".into(), what: "f8 loads".into() });
    assert_eq!(unsupported.kind(), ErrorKind::Unsupported);
    assert_eq!(unsupported.to_string(), "code generation: kernel k3: f8 loads is not supported by the code generator");

    // A graph that breaks an invariant after a pass is that pass's bug.
    let verify = CompileError::from(kiln_opt::PassError::Verify { pass: "tensor-fold-constants", message: "x".into() });
    assert_eq!(verify.kind(), ErrorKind::Internal);
}

#[test]
fn error_kinds_have_stable_names() {
    let names: Vec<&str> =
        [ErrorKind::InvalidInput, ErrorKind::Unsupported, ErrorKind::Internal].iter().map(|k| k.name()).collect();
    assert_eq!(names, ["invalid-input", "unsupported", "internal"]);
}

/// Dispatch formation follows the target's kernel forms ([`kiln_lower::Formation`]):
/// the CPU's microkernels read a narrow convolution's image gathered into columns (a
/// dispatch of its own in front of the product); the CUDA target's implicit GEMM reads
/// the window as it is, so its program has no such dispatch and one fewer per narrow
/// convolution. The model is the repository's LeNet (5×5 convolutions, 24 and 8
/// output columns).
#[test]
fn the_cuda_target_reads_convolution_windows_in_place() {
    let lenet = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet.onnx");
    let formed = |device| {
        let mut c = Compilation::new(Input::File(lenet.clone()), Options { device, ..options() });
        c.run_to(Stage::FormDispatches).unwrap_or_else(|e| panic!("{e}"));
        c.text().expect("flow text")
    };
    let (cpu, cuda) = (formed(kiln_compiler::TargetDevice::Cpu), formed(kiln_compiler::TargetDevice::Cuda));
    let gathers = |t: &str| t.matches("columns for Conv").count();
    assert_eq!(gathers(&cpu), 2, "{cpu}");
    assert_eq!(gathers(&cuda), 0, "{cuda}");
    let dispatches = |t: &str| t.matches(" = dispatch(").count();
    assert_eq!(dispatches(&cpu), dispatches(&cuda) + 2, "CPU:\n{cpu}\nCUDA:\n{cuda}");
}
