//! Helpers shared by the reference evaluator's op tests.
#![allow(dead_code)]

use kiln_ir::tensor::Element;
use kiln_ir::{Attr, Attrs, DType, Op, OpKind, Shape, Tensor, TensorType};
use kiln_ref::{eval_op, EvalError};

/// A shape.
pub fn sh(d: &[usize]) -> Shape {
    Shape::new(d.to_vec()).unwrap()
}

/// A tensor from typed values.
pub fn t<T: Element>(d: &[usize], v: &[T]) -> Tensor {
    Tensor::from_vec(sh(d), v.to_vec()).unwrap()
}

/// An integer tensor of dtype `dt`.
pub fn ti(dt: DType, d: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_i64(dt, sh(d), v).unwrap()
}

/// A tensor type.
pub fn ty(dt: DType, d: &[usize]) -> TensorType {
    TensorType::new(dt, sh(d))
}

/// An op with attributes.
pub fn op(kind: OpKind, attrs: &[(&str, Attr)]) -> Op {
    let mut a = Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    Op::parse(kind, &a).unwrap()
}

/// Evaluates one op.
pub fn run(
    kind: OpKind,
    attrs: &[(&str, Attr)],
    ins: &[Option<&Tensor>],
    outs: &[TensorType],
) -> Result<Vec<Tensor>, EvalError> {
    let mut a = Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    // Cast's `to` is required; these tests leave it out when it is the result dtype.
    if kind == OpKind::Cast && a.get("to").is_none() {
        if let Some(code) = outs.first().and_then(|t| t.dtype.onnx_code()) {
            a.set("to", Attr::Int(i64::from(code)));
        }
    }
    // Attributes are checked when the op is built (as an importer would).
    let op = Op::parse(kind, &a).map_err(|e| EvalError::Invalid { op: kind, reason: e.to_string() })?;
    eval_op(&op, ins, outs)
}
