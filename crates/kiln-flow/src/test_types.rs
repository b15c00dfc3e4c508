//! Tensor types for the unit tests.

use kiln_ir::{DType, Shape, TensorType};

/// An f32 tensor type of shape `dims`.
pub(crate) fn t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims).unwrap())
}

/// An i64 tensor type of shape `dims`.
pub(crate) fn ti(dims: &[usize]) -> TensorType {
    TensorType::new(DType::I64, Shape::new(dims).unwrap())
}
