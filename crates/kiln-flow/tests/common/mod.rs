//! Helpers the kernel-IR tests share: tensor types and f32 tensors from dims and values.

#![allow(dead_code)]

use kiln_ir::{DType, Shape, Tensor, TensorType};

/// The tensor type of dtype `d` and dims `dims`.
pub fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
}

/// An f32 tensor of dims `dims` holding `v` (rounded to f32).
pub fn f32s(dims: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F32, Shape::new(dims.to_vec()).unwrap(), v).unwrap()
}
