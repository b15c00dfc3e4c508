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
    Op::with_attrs(kind, a)
}

/// Evaluates one op.
pub fn run(
    kind: OpKind,
    attrs: &[(&str, Attr)],
    ins: &[Option<&Tensor>],
    outs: &[TensorType],
) -> Result<Vec<Tensor>, EvalError> {
    eval_op(&op(kind, attrs), ins, outs)
}
