//! Tensor types and a matrix product kernel for the unit tests.

use kiln_ir::{DType, Shape, TensorType};

use crate::kernel::{Kernel, KernelBuilder};

/// An f32 tensor type of shape `dims`.
pub(crate) fn t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims).unwrap())
}

/// An i64 tensor type of shape `dims`.
pub(crate) fn ti(dims: &[usize]) -> TensorType {
    TensorType::new(DType::I64, Shape::new(dims).unwrap())
}

/// `mm`: `out[m, n] = Σ_k x[m, k] · w[k, n] + b[n]` in f32, with `k` terms.
pub(crate) fn matmul_bias(m: usize, k: usize, n: usize) -> Kernel {
    let mut kb = KernelBuilder::new("mm", vec![t(&[m, k]), t(&[k, n]), t(&[n])], t(&[m, n]));
    let (o, s) = kb.matmul_sum(k);
    let b = kb.load(2, vec![o[1]]);
    let y = kb.add(s, b);
    kb.finish(y).unwrap()
}
