//! What the importer makes of small models that exercise one mechanism each
//! (the fuzz seeds in `fuzz/corpus/import_onnx`, written by `fuzz/make_seeds.py`).
//! Expected values are worked out by hand from the ONNX definitions.

use bytes::Bytes;
use kiln_import::{onnx::import_bytes, ImportOptions};
use kiln_ir::{Graph, OpKind, Shape, Tensor};
use std::path::PathBuf;

fn seed(name: &str) -> Graph {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/import_onnx").join(name);
    let data = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    import_bytes(Bytes::from(data), None, &ImportOptions::default()).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn kinds(g: &Graph) -> Vec<OpKind> {
    g.nodes.values().map(|n| n.op.kind).collect()
}

fn run(g: &Graph, x: Tensor) -> Vec<f64> {
    let out = kiln_ref::eval_graph(g, &[x]).expect("eval");
    out[0].to_f64_vec()
}

#[test]
fn shape_subgraph_folds_into_a_constant_reshape() {
    let g = seed("shape_fold.onnx");
    assert_eq!(kinds(&g), vec![OpKind::Reshape]);
    let n = g.nodes.values().next().expect("one node");
    let shape = n.inputs[1].and_then(|v| g.constant(v)).expect("constant shape operand");
    assert_eq!(shape.to_i64_vec().expect("ints"), vec![2, -1]);
    assert_eq!(g.ty(g.outputs[0]).shape.dims(), &[2, 12]);
}

#[test]
fn if_with_constant_condition_is_inlined() {
    let g = seed("if_const.onnx");
    assert_eq!(kinds(&g), vec![OpKind::Mul]);
    let x = Tensor::from_vec(Shape::new([2]).expect("shape"), vec![10f32, 20.0]).expect("x");
    // The condition is true: x * [1, 2].
    assert_eq!(run(&g, x), vec![10.0, 40.0]);
}

#[test]
fn generators_fold() {
    let g = seed("generators.onnx");
    assert_eq!(kinds(&g), vec![OpKind::Add]);
    let x = Tensor::from_vec(Shape::new([2, 3]).expect("shape"), vec![0f32; 6]).expect("x");
    // ConstantOfShape([2,3], f16 1.5) cast to f32 plus Range(0,3,1) broadcast over rows.
    assert_eq!(run(&g, x), vec![1.5, 2.5, 3.5, 1.5, 2.5, 3.5]);
}

#[test]
fn old_opset_forms_are_canonicalised() {
    let g = seed("opset9.onnx");
    // ReduceMean's axes became an input; Softmax-9 at axis 1 of a [2,3,1] tensor
    // normalises over the flattened trailing [3,1], i.e. over the 3 values.
    let reduce = g.nodes.values().find(|n| n.op.kind == OpKind::ReduceMean).expect("ReduceMean");
    let axes = reduce.inputs[1].and_then(|v| g.constant(v)).expect("axes operand");
    assert_eq!(axes.to_i64_vec().expect("ints"), vec![2]);
    assert!(reduce.op.to_attrs().get("axes").is_none());
    let xs: Vec<f32> = (0..24).map(|i| (i as f32) * 0.25 - 3.0).collect();
    let x = Tensor::from_vec(Shape::new([2, 3, 4]).expect("shape"), xs.clone()).expect("x");
    let y = run(&g, x);
    // By hand: mean over the last axis, softmax over the 3 means, take the first.
    let mut want = Vec::new();
    for b in 0..2 {
        let means: Vec<f64> =
            (0..3).map(|c| (0..4).map(|k| xs[b * 12 + c * 4 + k] as f64).sum::<f64>() / 4.0).collect();
        let z: f64 = means.iter().map(|m| m.exp()).sum();
        want.push(means[0].exp() / z);
    }
    assert_eq!(y.len(), 2);
    for (a, b) in y.iter().zip(&want) {
        assert!((a - b).abs() < 1e-6, "{y:?} vs {want:?}");
    }
}

#[test]
fn batchnorm_and_conv_import() {
    let g = seed("conv_pool.onnx");
    assert_eq!(
        kinds(&g),
        vec![OpKind::Conv, OpKind::BatchNormalization, OpKind::Clip, OpKind::MaxPool, OpKind::GlobalAveragePool]
    );
    assert_eq!(g.ty(g.outputs[0]).to_string(), "f32[1,4,1,1]");
}
