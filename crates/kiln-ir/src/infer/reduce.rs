//! Reductions (Reduce*(data, axes?)), ArgMax/ArgMin, CumSum and TopK.

use super::ctx::{Class, Ctx, R};
use crate::attrs::{ArgReduceAttrs, ReduceAttrs, TopKAttrs};
use crate::dtype::DType;
use crate::shape::TensorType;

/// Dimensions after reducing `axes` (kept as 1 when `keepdims`).
fn reduced(dims: &[usize], axes: &[usize], keepdims: bool) -> Vec<usize> {
    let red: Vec<bool> = (0..dims.len()).map(|i| axes.contains(&i)).collect();
    crate::shape::reduced_dims(dims, &red, keepdims)
}

/// Reduce*(data, axes?) with `keepdims` (default 1) and `noop_with_empty_axes` (default 0).
pub(super) fn reduce(cx: &Ctx, class: Class) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "data", class)?;
    let a = cx.attrs::<ReduceAttrs>()?;
    let (keepdims, noop) = (a.keepdims, a.noop_with_empty_axes);
    let rank = x.shape.rank();
    let axes = cx.axes_list(1, "axes")?.unwrap_or_default();
    let axes = if axes.is_empty() {
        if noop {
            return Ok(vec![x.clone()]);
        }
        (0..rank).collect()
    } else {
        cx.axes(&axes, rank, "axis")?
    };
    Ok(vec![cx.tt(x.dtype, reduced(x.shape.dims(), &axes, keepdims))?])
}

/// ArgMax, ArgMin(data) along `axis` (default 0) → i64.
pub(super) fn arg_reduce(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "data", Class::Numeric)?;
    cx.min_rank(x, 0, "data", 1)?;
    let a = cx.attrs::<ArgReduceAttrs>()?;
    let axis = cx.axis(a.axis, x.shape.rank(), "axis")?;
    let keepdims = a.keepdims;
    Ok(vec![cx.tt(DType::I64, reduced(x.shape.dims(), &[axis], keepdims))?])
}

/// CumSum(x, axis): same type; `axis` is a scalar (checked when constant).
pub(super) fn cum_sum(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "x", Class::Numeric)?;
    let a = cx.req_class(1, "axis", Class::Index)?;
    cx.expect_scalar(a, 1, "axis")?;
    cx.min_rank(x, 0, "x", 1)?;
    // The axis does not change the result type: it need not be a constant.
    if cx.opt(1).is_some_and(|i| i.value.is_some()) {
        if let Some(axis) = cx.int_scalar(1, "axis")? {
            cx.axis(axis, x.shape.rank(), "axis")?;
        }
    }
    Ok(vec![x.clone()])
}

/// TopK(X, K) → (values, indices: i64), K (constant) replacing the extent of `axis`.
pub(super) fn top_k(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "X", Class::Numeric)?;
    let kt = cx.req(1, "K")?;
    if kt.dtype != DType::I64 {
        return Err(cx.invalid(format_args!("`K` (input 1) must be an int64 tensor, got {kt}")));
    }
    cx.min_rank(x, 0, "X", 1)?;
    let axis = cx.axis(cx.attrs::<TopKAttrs>()?.axis, x.shape.rank(), "axis")?;
    let k = cx.int_scalar(1, "K")?.ok_or_else(|| cx.invalid("operand `K` (input 1) is required"))?;
    let dim = x.shape.dims()[axis];
    let k = usize::try_from(k).ok().filter(|&k| k <= dim).ok_or_else(|| {
        cx.invalid(format_args!("K = {k} must be between 0 and {dim}, the extent of axis {axis} of {x}"))
    })?;
    let mut d = x.shape.dims().to_vec();
    d[axis] = k;
    Ok(vec![cx.tt(x.dtype, d.clone())?, cx.tt(DType::I64, d)?])
}
