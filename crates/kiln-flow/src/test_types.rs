//! Tensor types, buffers, programs and a matrix product kernel for the unit tests.

use kiln_ir::{DType, Shape, Tensor, TensorType};

use crate::kernel::{Kernel, KernelBuilder};
use crate::program::{Buffer, BufferId, BufferKind, Dispatch, FlowProgram};

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

/// A buffer of type `ty` and kind `kind` (every test buffer is named `b`).
pub(crate) fn buf(ty: TensorType, kind: BufferKind) -> Buffer {
    Buffer { ty, name: "b".into(), kind }
}

/// A program `g` of these buffers and dispatches, its inputs and outputs.
pub(crate) fn program(
    buffers: Vec<Buffer>,
    dispatches: Vec<Dispatch>,
    inputs: Vec<BufferId>,
    outputs: Vec<BufferId>,
) -> FlowProgram {
    FlowProgram { extents: Vec::new(), name: "g".into(), buffers, dispatches, inputs, outputs }
}

/// An f32 tensor of shape `dims` whose element `i` is `sin((i + seed) · 0.37)`.
pub(crate) fn seeded(dims: &[usize], seed: f32) -> Tensor {
    let n: usize = dims.iter().product();
    let v: Vec<f32> = (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect();
    Tensor::from_vec(Shape::new(dims.to_vec()).unwrap(), v).unwrap()
}
