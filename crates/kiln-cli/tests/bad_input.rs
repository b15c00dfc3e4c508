//! Bad input to `kiln`: each case ends with one line on stderr that names what and
//! where, and a non-zero exit status — never a panic.

mod common;

use common::{fails_with, kiln};

use kiln_import::onnx::proto::{
    attribute_proto::AttributeType, tensor_shape_proto::dimension, tensor_shape_proto::Dimension, type_proto,
    AttributeProto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto, TensorShapeProto, TypeProto,
    ValueInfoProto,
};
use prost::Message;
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn value_info(name: &str, dims: &[Option<i64>]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|d| Dimension {
                            value: Some(match d {
                                Some(v) => dimension::Value::DimValue(*v),
                                None => dimension::Value::DimParam("batch".into()),
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

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        name: Some(name.into()),
        op_type: Some(op.into()),
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, input: ValueInfoProto, output: &str, init: Vec<TensorProto>) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto { domain: Some(String::new()), version: Some(17) }],
        graph: Some(GraphProto {
            node: nodes,
            name: Some("g".into()),
            initializer: init,
            input: vec![input],
            output: vec![value_info(output, &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// A valid model: y = Relu(x · w) with x [1,4] (both dims free when `free`).
fn good_model(free: bool) -> Vec<u8> {
    let w = TensorProto {
        dims: vec![4, 3],
        data_type: Some(1),
        name: Some("w".into()),
        float_data: (0..12).map(|i| i as f32 * 0.1).collect(),
        ..Default::default()
    };
    let mut gemm = node("mm", "Gemm", &["x", "w"], &["h"]);
    gemm.attribute.push(AttributeProto {
        name: Some("alpha".into()),
        f: Some(1.0),
        r#type: Some(AttributeType::Float as i32),
        ..Default::default()
    });
    model(
        vec![gemm, node("act", "Relu", &["h"], &["y"])],
        value_info("x", &[if free { None } else { Some(1) }, if free { None } else { Some(4) }]),
        "y",
        vec![w],
    )
}

#[test]
fn good_model_imports() {
    let p = scratch("good.onnx");
    std::fs::write(&p, good_model(false)).expect("write");
    let (ok, out, err) = kiln(&["import", p.to_str().expect("utf-8 path")]);
    assert!(ok, "{err}");
    assert!(out.contains("Gemm") && out.contains("Relu"), "{out}");
}

#[test]
fn truncated_file() {
    let p = scratch("truncated.onnx");
    let m = good_model(false);
    std::fs::write(&p, &m[..m.len() / 2]).expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["truncated.onnx", "not a valid ONNX model"]);
}

#[test]
fn random_bytes() {
    let p = scratch("random.onnx");
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&p, bytes).expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["random.onnx", "not a valid ONNX model"]);
}

#[test]
fn empty_and_missing_files() {
    let p = scratch("empty.onnx");
    std::fs::write(&p, b"").expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["empty"]);
    fails_with(&["import", "/nonexistent/model.onnx"], &["cannot read", "/nonexistent/model.onnx"]);
}

#[test]
fn unknown_ops_are_all_listed() {
    let p = scratch("unknown.onnx");
    let m = model(
        vec![
            node("first", "FrobnicateA", &["x"], &["a"]),
            node("second", "Relu", &["a"], &["b"]),
            node("third", "FrobnicateB", &["b"], &["c"]),
            node("fourth", "FrobnicateA", &["c"], &["y"]),
        ],
        value_info("x", &[Some(1), Some(4)]),
        "y",
        vec![],
    );
    std::fs::write(&p, m).expect("write");
    fails_with(
        &["import", p.to_str().expect("path")],
        &["unsupported operators", "FrobnicateA (ai.onnx opset 17, node `first` and 1 more)", "FrobnicateB (ai.onnx opset 17, node `third`)"],
    );
}

#[test]
fn cycle() {
    let p = scratch("cycle.onnx");
    let m = model(
        vec![
            node("a", "Add", &["x", "y"], &["s"]),
            node("b", "Relu", &["s"], &["y"]),
        ],
        value_info("x", &[Some(1), Some(4)]),
        "y",
        vec![],
    );
    std::fs::write(&p, m).expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["cycle", "`a`", "`b`"]);
}

#[test]
fn wrong_input_shapes() {
    let p = scratch("shapes.onnx");
    std::fs::write(&p, good_model(false)).expect("write");
    let path = p.to_str().expect("path");
    fails_with(&["import", path, "--input-shape", "x=1x5"], &["input `x`", "dimension 1 is fixed at 4", "gives 5"]);
    fails_with(&["import", path, "--input-shape", "x=1x4x1"], &["input `x`", "rank 3", "rank 2"]);
    fails_with(&["import", path, "--input-shape", "nope=1x4"], &["input `nope`", "no such input", "`x`"]);
    fails_with(&["import", path, "--input-shape", "x=1xfour"], &["`four` is not a dimension"]);
    let q = scratch("free.onnx");
    std::fs::write(&q, good_model(true)).expect("write");
    let free = q.to_str().expect("path");
    fails_with(&["import", free], &["input `x`", "free dimensions", "--input-shape"]);
    // Binding the free dimension makes it import; binding it wrongly fails in Gemm.
    let (ok, _, err) = kiln(&["import", free, "--input-shape", "x=3x4"]);
    assert!(ok, "{err}");
    fails_with(&["import", free, "--input-shape", "x=3x5"], &["node `mm`", "Gemm"]);
}

#[test]
fn eval_with_wrong_input_file() {
    let p = scratch("evalbad.onnx");
    std::fs::write(&p, good_model(false)).expect("write");
    let npy = scratch("wrong.npy");
    let t = kiln_ir::Tensor::from_vec(kiln_ir::Shape::new([2, 4]).expect("shape"), vec![0f32; 8]).expect("tensor");
    std::fs::write(&npy, kiln_ir::npy::write(&t).expect("npy")).expect("write");
    let arg = format!("x={}", npy.display());
    fails_with(&["eval", p.to_str().expect("path"), "--input", &arg], &["input `x`", "f32[2,4]", "f32[1,4]"]);
    let (ok, out, err) = kiln(&["eval", p.to_str().expect("path")]);
    assert!(ok, "{err}");
    assert!(out.starts_with("y: f32[1,3]"), "{out}");
}
