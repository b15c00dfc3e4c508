//! Result shapes that run-time data decides, compiled for declared dims and checked at
//! run time (`kiln_ir::dynamic`, shape checks): a Resize with run-time `scales` and a
//! OneHot with a run-time `depth`, from the ONNX node suite's models
//! (`$KILN_TEST_DATA/onnx-node`), fed values of our own.
//!
//! Data that gives the compiled dims runs and agrees with the reference evaluator (an
//! independent implementation of the ONNX semantics); data that gives other dims fails
//! the call with `RuntimeError::ShapeCheck` (never a result of the wrong shape), and
//! the reference evaluator refuses it too. `--output-shape` (`ImportOptions::output_shapes`)
//! replaces the shape the model declares.

use kiln_ir::{Shape, Tensor};
use std::path::PathBuf;

fn case(name: &str) -> PathBuf {
    let d = match std::env::var_os("KILN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    };
    let p = d.join("onnx-node").join(name).join("model.onnx");
    assert!(p.exists(), "{} is missing; run scripts/test", p.display());
    p
}

fn f32s(dims: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(Shape::new(dims.to_vec()).expect("shape"), v.to_vec()).expect("tensor")
}

/// Compiles `g`, runs it on `feeds`; the outputs (at their static types).
fn run(g: &kiln_ir::Graph, feeds: &[Tensor]) -> Result<Vec<Tensor>, kiln_runtime::RuntimeError> {
    let c = kiln_compiler::compile(g, &kiln_compiler::Options::default()).expect("compile");
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let mut inst = kiln_runtime::Instance::new(&module).expect("instance");
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs)?;
    }
    Ok(g.outputs
        .iter()
        .zip(outs)
        .map(|(&v, b)| Tensor::new(g.values[v].ty.clone(), b.into()).expect("tensor"))
        .collect())
}

fn assert_close(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.ty(), want.ty(), "{what}: type");
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
        assert!((a - b).abs() <= 1e-5 + 1e-4 * b.abs(), "{what}: element {i} is {a}, expected {b}");
    }
}

#[test]
fn resize_with_run_time_scales_runs_at_the_declared_dims_and_refuses_others() {
    // Y is declared [1, 1, 4, 6]; X is [1, 1, 2, 2].
    let g = kiln_import::onnx::import_file(&case("test_resize_upsample_scales_nearest"), &Default::default())
        .expect("import with run-time scales");
    assert_eq!(g.inputs.len(), 2, "X and scales stay graph inputs");
    let x = f32s(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    // Scales other than the model's test data that give the same dims: 2.2 · 2 and 3.4 · 2
    // floor to 4 and 6.
    for scales in [[1.0, 1.0, 2.0, 3.0], [1.0, 1.0, 2.2, 3.4]] {
        let feeds = [x.clone(), f32s(&[4], &scales)];
        let got = run(&g, &feeds).unwrap_or_else(|e| panic!("scales {scales:?}: {e}"));
        let want = kiln_ref::eval_graph(&g, &feeds).expect("reference");
        assert_close(&format!("scales {scales:?}"), &got[0], &want[0]);
    }
    // Scales that give [1, 1, 4, 4]: a typed error, in the runtime and in the reference.
    let feeds = [x.clone(), f32s(&[4], &[1.0, 1.0, 2.0, 2.0])];
    match run(&g, &feeds) {
        Err(kiln_runtime::RuntimeError::ShapeCheck { name, axes }) => {
            assert_eq!((name.as_str(), axes), ("Y", 1), "the error names the result and counts one axis")
        }
        other => panic!("scales giving other dims: expected ShapeCheck, got {other:?}"),
    }
    assert!(kiln_ref::eval_graph(&g, &feeds).is_err(), "the reference accepts scales giving other dims");

    // `--output-shape Y=1x1x4x4` replaces the model's declaration.
    let opts = kiln_import::ImportOptions { output_shapes: vec![("Y".into(), vec![1, 1, 4, 4])], ..Default::default() };
    let g = kiln_import::onnx::import_file(&case("test_resize_upsample_scales_nearest"), &opts).expect("import");
    assert_eq!(g.values[g.outputs[0]].ty.shape.dims(), &[1, 1, 4, 4]);
    let got = run(&g, &feeds).expect("scales giving the declared dims");
    let want = kiln_ref::eval_graph(&g, &feeds).expect("reference");
    assert_close("--output-shape", &got[0], &want[0]);
    // A name no such result has is an import error.
    let opts = kiln_import::ImportOptions { output_shapes: vec![("X".into(), vec![1])], ..Default::default() };
    assert!(kiln_import::onnx::import_file(&case("test_resize_upsample_scales_nearest"), &opts).is_err());
}

#[test]
fn resize_with_a_run_time_roi_needs_no_check() {
    // tf_crop_and_resize with sizes (bound at compile time) and roi fed at run time.
    let path = case("test_resize_tf_crop_and_resize");
    let sizes = kiln_ir::Tensor::from_vec(Shape::new(vec![4]).expect("shape"), vec![1i64, 1, 3, 3]).expect("sizes");
    let opts =
        kiln_import::ImportOptions { input_values: vec![("sizes".into(), sizes.to_f64_vec())], ..Default::default() };
    let g = kiln_import::onnx::import_file(&path, &opts).expect("import");
    let x = f32s(&[1, 1, 4, 4], &(0..16).map(|i| i as f32).collect::<Vec<_>>());
    for roi in [[0.0, 0.0, 0.4, 0.6, 1.0, 1.0, 0.6, 0.8], [0.0, 0.0, -0.5, 0.25, 1.0, 1.0, 1.5, 0.75]] {
        let feeds = [x.clone(), f32s(&[8], &roi)];
        let got = run(&g, &feeds).unwrap_or_else(|e| panic!("roi {roi:?}: {e}"));
        let want = kiln_ref::eval_graph(&g, &feeds).expect("reference");
        assert_close(&format!("roi {roi:?}"), &got[0], &want[0]);
    }
}

#[test]
fn one_hot_with_a_run_time_depth_is_checked() {
    // y is declared [3, 10]; depth is a float input.
    let g = kiln_import::onnx::import_file(&case("test_onehot_negative_indices"), &Default::default())
        .expect("import with a run-time depth");
    let indices = Tensor::from_vec(Shape::new(vec![3]).expect("shape"), vec![0i64, -7, -10]).expect("indices");
    let values = f32s(&[2], &[1.0, 3.0]);
    let feeds = [indices.clone(), f32s(&[], &[10.7]), values.clone()];
    let got = run(&g, &feeds).expect("depth 10.7 truncates to the declared 10");
    let want = kiln_ref::eval_graph(&g, &feeds).expect("reference");
    assert_close("depth 10.7", &got[0], &want[0]);
    let feeds = [indices, f32s(&[], &[9.0]), values];
    assert!(
        matches!(run(&g, &feeds), Err(kiln_runtime::RuntimeError::ShapeCheck { .. })),
        "depth 9 for a result compiled with 10: expected ShapeCheck"
    );
    assert!(kiln_ref::eval_graph(&g, &feeds).is_err(), "the reference accepts depth 9");
}
