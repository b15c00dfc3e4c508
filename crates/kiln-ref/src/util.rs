//! Helpers shared by the op families: operand access, attribute access with
//! op-named errors, broadcasting, index arithmetic.

use crate::EvalError;
use kiln_ir::attrs::{OpAttrsOf, WindowAttrs};
use kiln_ir::op::AttrError;
use kiln_ir::{DType, Op, OpKind, Tensor, TensorType};

/// One evaluation: the op, its operands and the expected result types.
pub(crate) struct Cx<'a> {
    pub op: &'a Op,
    pub inputs: &'a [Option<&'a Tensor>],
    pub out_types: &'a [TensorType],
}

impl<'a> Cx<'a> {
    pub fn kind(&self) -> OpKind {
        self.op.kind
    }

    pub fn invalid(&self, reason: impl Into<String>) -> EvalError {
        EvalError::Invalid { op: self.op.kind, reason: reason.into() }
    }

    pub fn unsupported(&self, reason: impl Into<String>) -> EvalError {
        EvalError::Unsupported { op: self.op.kind, reason: reason.into() }
    }

    /// Operand `i`, which must be present.
    pub fn input(&self, i: usize) -> Result<&'a Tensor, EvalError> {
        self.inputs.get(i).copied().flatten().ok_or_else(|| self.invalid(format!("input {i} is missing")))
    }

    /// Operand `i`, which must be of a float dtype.
    pub fn float_input(&self, i: usize) -> Result<&'a Tensor, EvalError> {
        let x = self.input(i)?;
        if !x.dtype().is_float() {
            return Err(self.invalid(format!("{} operand, a float dtype is required", x.dtype())));
        }
        Ok(x)
    }

    /// Operand `i` if present.
    pub fn opt_input(&self, i: usize) -> Option<&'a Tensor> {
        self.inputs.get(i).copied().flatten()
    }

    /// Expected type of result `i`.
    pub fn out_type(&self, i: usize) -> Result<&'a TensorType, EvalError> {
        self.out_types.get(i).ok_or_else(|| self.invalid(format!("result {i} has no type")))
    }

    /// The op's attributes as struct `T` (parsed and checked when the op was built).
    pub fn attrs<T: OpAttrsOf>(&self) -> Result<&'a T, EvalError> {
        self.attr(self.op.attrs_of::<T>())
    }

    /// The sliding-window attributes of a convolution or pool.
    pub fn window(&self) -> Result<WindowAttrs<'a>, EvalError> {
        self.attr(self.op.window_attrs())
    }

    /// Converts an attribute error into an op-named error.
    pub fn attr<T>(&self, r: Result<T, AttrError>) -> Result<T, EvalError> {
        r.map_err(|e| self.invalid(e.to_string()))
    }

    /// Integer contents of operand `i` (for axes, shapes, indices).
    pub fn ints(&self, i: usize) -> Result<Vec<i64>, EvalError> {
        self.input(i)?.to_i64_vec().map_err(|e| self.invalid(format!("input {i}: {e}")))
    }

    /// Integer contents of optional operand `i`; `None` where it is absent.
    pub fn opt_ints(&self, i: usize) -> Result<Option<Vec<i64>>, EvalError> {
        self.opt_input(i).map(|_| self.ints(i)).transpose()
    }

    /// Normalises a possibly negative axis against `rank`.
    pub fn axis(&self, axis: i64, rank: usize) -> Result<usize, EvalError> {
        norm_axis(axis, rank).ok_or_else(|| self.invalid(format!("axis {axis} out of range for rank {rank}")))
    }

    // `from_*` here builds a result for this op (errors name it), hence `&self`.
    #[allow(clippy::wrong_self_convention)]
    /// A tensor of type `ty` from f64 values (rounded once to the dtype).
    pub fn from_f64(&self, ty: &TensorType, v: &[f64]) -> Result<Tensor, EvalError> {
        Tensor::from_f64(ty.dtype, ty.shape.clone(), v).map_err(|e| self.invalid(e.to_string()))
    }

    #[allow(clippy::wrong_self_convention)]
    /// A tensor of integer type `ty` from i64 values (wrapping to the dtype).
    pub fn from_i64(&self, ty: &TensorType, v: &[i64]) -> Result<Tensor, EvalError> {
        Tensor::from_i64(ty.dtype, ty.shape.clone(), v).map_err(|e| self.invalid(e.to_string()))
    }
}

/// Result type `i`, checked to be `d` with dims `dims`.
pub(crate) fn out_checked<'a>(cx: &Cx<'a>, i: usize, d: DType, dims: &[usize]) -> Result<&'a TensorType, EvalError> {
    let ty = cx.out_type(i)?;
    if ty.dtype != d || ty.shape.dims() != dims {
        return Err(cx.invalid(format!("result {i} has type {ty}, expected {d}{dims:?}")));
    }
    Ok(ty)
}

/// `axis` normalised into `0..rank`, if in `-rank..rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// The multidirectional (numpy) broadcast of several shapes.
pub(crate) fn broadcast_dims(shapes: &[&[usize]]) -> Option<Vec<usize>> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1usize; rank];
    for s in shapes {
        let off = rank - s.len();
        for (i, &d) in s.iter().enumerate() {
            let o = &mut out[off + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return None;
            }
        }
    }
    // A zero-sized dimension wins over 1.
    Some(out)
}

/// Strides to read a tensor of shape `dims` broadcast to `out` (0 on broadcast dims).
pub(crate) fn broadcast_strides(dims: &[usize], out: &[usize]) -> Vec<usize> {
    let off = out.len() - dims.len();
    let strides = row_major_strides(dims);
    (0..out.len()).map(|i| if i < off || dims[i - off] == 1 { 0 } else { strides[i - off] }).collect()
}

/// Row-major strides in elements.
pub(crate) fn row_major_strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// For each flat index of `out`, the flat index into a tensor broadcast to it.
pub(crate) fn broadcast_map(dims: &[usize], out: &[usize]) -> Vec<usize> {
    let n: usize = out.iter().product();
    let strides = broadcast_strides(dims, out);
    let mut idx = vec![0usize; out.len()];
    let mut res = Vec::with_capacity(n);
    let mut off = 0usize;
    for _ in 0..n {
        res.push(off);
        // Increment the multi-index (last dim fastest), keeping `off` in step.
        for d in (0..out.len()).rev() {
            idx[d] += 1;
            off += strides[d];
            if idx[d] < out[d] {
                break;
            }
            off -= strides[d] * idx[d];
            idx[d] = 0;
        }
    }
    res
}

/// The multi-index of flat index `flat` in `dims`.
pub(crate) fn unravel(mut flat: usize, dims: &[usize]) -> Vec<usize> {
    let mut idx = vec![0usize; dims.len()];
    for d in (0..dims.len()).rev() {
        if dims[d] > 0 {
            idx[d] = flat % dims[d];
            flat /= dims[d];
        }
    }
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast_dims(&[&[2, 1, 3], &[4, 1]]), Some(vec![2, 4, 3]));
        assert_eq!(broadcast_dims(&[&[2], &[3]]), None);
        assert_eq!(broadcast_map(&[1, 3], &[2, 3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_map(&[2, 1], &[2, 3]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(broadcast_map(&[], &[2]), vec![0, 0]);
        assert_eq!(unravel(5, &[2, 3]), vec![1, 2]);
    }
}
