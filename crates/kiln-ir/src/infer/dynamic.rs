//! The ops whose result extent depends on the data (NonZero, Compress, Unique,
//! NonMaxSuppression, TopK with a run-time K): every such result is typed with its
//! *bound* along the data-dependent axis, and the node has one more result, the
//! actual extent, an `i64` scalar (see [`crate::dynamic`]).

use super::ctx::{Class, Ctx, R};
use crate::attrs::{CompressAttrs, NmsAttrs, NonZeroAttrs, TopKAttrs, UniqueAttrs};
use crate::dtype::DType;
use crate::shape::TensorType;

/// The bound: the declared one (`kiln_bound`, ≥ 0) capped by the natural one, or the
/// natural one (-1).
fn bound(cx: &Ctx, declared: i64, natural: usize) -> R<usize> {
    match declared {
        -1 => Ok(natural),
        b if b >= 0 => Ok((b as usize).min(natural)),
        b => Err(cx.invalid(format_args!("kiln_bound = {b} must be ≥ 0 (or -1: derived)"))),
    }
}

fn extent(cx: &Ctx) -> R<TensorType> {
    cx.tt(DType::I64, Vec::new())
}

/// NonZero(X) → (indices: i64[rank, bound], extent).
pub(super) fn non_zero(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", Class::NumericOrBool)?;
    let b = bound(cx, cx.attrs::<NonZeroAttrs>()?.bound, x.shape.numel())?;
    Ok(vec![cx.tt(DType::I64, vec![x.shape.rank(), b])?, extent(cx)?])
}

/// Compress(input, condition) → (output, extent): the slices of `axis` (the flattened
/// input without one) whose condition is true.
pub(super) fn compress(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req(0, "input")?;
    let c = cx.req(1, "condition")?;
    if c.dtype != DType::Bool || c.shape.rank() != 1 {
        return Err(cx.invalid(format_args!("`condition` (input 1) must be a 1-D bool tensor, got {c}")));
    }
    let a = cx.attrs::<CompressAttrs>()?;
    let len = c.shape.dims()[0];
    let (mut dims, axis) = match a.axis {
        Some(ax) => {
            cx.min_rank(x, 0, "input", 1)?;
            let ax = cx.axis(ax, x.shape.rank(), "axis")?;
            (x.shape.dims().to_vec(), ax)
        }
        None => (vec![x.shape.numel()], 0),
    };
    if len > dims[axis] {
        return Err(
            cx.invalid(format_args!("`condition` has {len} elements, more than the {} it selects from", dims[axis]))
        );
    }
    dims[axis] = bound(cx, a.bound, len)?;
    Ok(vec![cx.tt(x.dtype, dims)?, extent(cx)?])
}

/// Unique(X) → (Y, indices, inverse_indices, counts, extent).
pub(super) fn unique(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", Class::NumericOrBool)?;
    let a = cx.attrs::<UniqueAttrs>()?;
    let (mut dims, axis) = match a.axis {
        Some(ax) => {
            cx.min_rank(x, 0, "X", 1)?;
            (x.shape.dims().to_vec(), cx.axis(ax, x.shape.rank(), "axis")?)
        }
        None => (vec![x.shape.numel()], 0),
    };
    let n = dims[axis];
    let b = bound(cx, a.bound, n)?;
    dims[axis] = b;
    Ok(vec![
        cx.tt(x.dtype, dims)?,
        cx.tt(DType::I64, vec![b])?,
        cx.tt(DType::I64, vec![n])?,
        cx.tt(DType::I64, vec![b])?,
        extent(cx)?,
    ])
}

/// NonMaxSuppression(boxes, scores, max_output_boxes_per_class?, iou_threshold?,
/// score_threshold?) → (selected_indices: i64[bound, 3], extent).
pub(super) fn non_max_suppression(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(5)?;
    let boxes = cx.req_class(0, "boxes", Class::Float)?;
    let scores = cx.req(1, "scores")?;
    cx.same_dtype(scores, 1, "scores", boxes)?;
    cx.rank(boxes, 0, "boxes", 3)?;
    cx.rank(scores, 1, "scores", 3)?;
    let (bd, sd) = (boxes.shape.dims(), scores.shape.dims());
    if bd[2] != 4 || sd[0] != bd[0] || sd[2] != bd[1] {
        return Err(cx.invalid(format_args!(
            "boxes {boxes} must be [batches, boxes, 4] and scores {scores} [batches, classes, boxes]"
        )));
    }
    let max_out = cx.int_if_constant(2, "max_output_boxes_per_class")?;
    for (i, what) in [(3, "iou_threshold"), (4, "score_threshold")] {
        if let Some(t) = cx.opt_ty(i) {
            if !t.dtype.is_float() || t.shape.numel() != 1 {
                return Err(cx.invalid(format_args!("`{what}` (input {i}) must be one float, got {t}")));
            }
        }
    }
    let per_class = match max_out {
        // Absent: ONNX's default 0 selects nothing.
        None if cx.opt_ty(2).is_none() => 0,
        Some(m) => usize::try_from(m.max(0)).unwrap_or(0).min(bd[1]),
        None => bd[1],
    };
    let natural = bd[0] * sd[1] * per_class;
    let b = bound(cx, cx.attrs::<NmsAttrs>()?.bound, natural)?;
    Ok(vec![cx.tt(DType::I64, vec![b, 3])?, extent(cx)?])
}

/// TopK(X, K) with a run-time K (the node's three-result form) → (values, indices,
/// extent), both bound by the axis's extent.
pub(super) fn top_k_dynamic(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "X", Class::Numeric)?;
    let kt = cx.req(1, "K")?;
    if kt.dtype != DType::I64 || kt.shape.numel() != 1 {
        return Err(cx.invalid(format_args!("`K` (input 1) must be one int64, got {kt}")));
    }
    cx.min_rank(x, 0, "X", 1)?;
    let a = cx.attrs::<TopKAttrs>()?;
    let axis = cx.axis(a.axis, x.shape.rank(), "axis")?;
    let mut d = x.shape.dims().to_vec();
    d[axis] = bound(cx, a.bound, d[axis])?;
    Ok(vec![cx.tt(x.dtype, d.clone())?, cx.tt(DType::I64, d)?, extent(cx)?])
}
