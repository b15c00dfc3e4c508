//! Elementwise ops: unary and broadcasting maps, comparisons, Where, Clip, Cast,
//! and the shape-preserving ops with an axis (Softmax family, LRN, Lp/MVN
//! normalizations, Dropout).

use super::ctx::{Class, Ctx, R};
use crate::attrs::{BitShiftAttrs, CastAttrs, LpNormAttrs, LrnAttrs, ModAttrs, MvnAttrs, SoftmaxAttrs};
use crate::dtype::DType;
use crate::shape::TensorType;

/// One operand of `class`, result of the same type.
pub(super) fn unary(cx: &Ctx, class: Class) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", class)?;
    Ok(vec![x.clone()])
}

/// Gelu: a float map with `approximate` = none | tanh.
pub(super) fn gelu(cx: &Ctx) -> R<Vec<TensorType>> {
    unary(cx, Class::Float)
}

/// IsNaN, IsInf: float operand, bool result.
pub(super) fn is_class(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    Ok(vec![TensorType::new(DType::Bool, x.shape.clone())])
}

/// Softmax, LogSoftmax, Hardmax: `axis` (default -1) must be in range.
pub(super) fn softmax(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "input", Class::Float)?;
    cx.axis(cx.attrs::<SoftmaxAttrs>()?.axis, x.shape.rank(), "axis")?;
    Ok(vec![x.clone()])
}

/// LRN: `size` is required; X is [N, C, D1, …].
pub(super) fn lrn(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    cx.min_rank(x, 0, "X", 3)?;
    cx.attrs::<LrnAttrs>()?;
    Ok(vec![x.clone()])
}

/// LpNormalization: `axis` (default -1) in range, `p` 1 or 2.
pub(super) fn lp_normalization(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "input", Class::Float)?;
    let a = cx.attrs::<LpNormAttrs>()?;
    cx.axis(a.axis, x.shape.rank(), "axis")?;
    let p = a.p;
    if p != 1 && p != 2 {
        return Err(cx.invalid(format_args!("attribute `p` must be 1 or 2, got {p}")));
    }
    Ok(vec![x.clone()])
}

/// MeanVarianceNormalization: `axes` (default [0, 2, 3]) distinct and in range.
pub(super) fn mean_variance_normalization(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let axes = &cx.attrs::<MvnAttrs>()?.axes;
    cx.axes(axes, x.shape.rank(), "axis")?;
    Ok(vec![x.clone()])
}

/// Dropout(data, ratio?, training_mode?) → (output, mask: bool).
pub(super) fn dropout(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req_class(0, "data", Class::Float)?;
    if let Some(r) = cx.opt_class(1, "ratio", Class::Float)? {
        cx.expect_scalar(r, 1, "ratio")?;
    }
    if let Some(t) = cx.opt_class(2, "training_mode", Class::Bool)? {
        cx.expect_scalar(t, 2, "training_mode")?;
    }
    Ok(vec![x.clone(), TensorType::new(DType::Bool, x.shape.clone())])
}

/// Clip(input, min?, max?): min and max are scalars of the input's dtype.
pub(super) fn clip(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req_class(0, "input", Class::Numeric)?;
    for (i, what) in [(1, "min"), (2, "max")] {
        if let Some(t) = cx.opt_ty(i) {
            cx.same_dtype(t, i, what, x)?;
            cx.expect_scalar(t, i, what)?;
        }
    }
    Ok(vec![x.clone()])
}

/// Cast(input) to the dtype code in `to`.
pub(super) fn cast(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req(0, "input")?;
    let to = cx.attrs::<CastAttrs>()?.to;
    Ok(vec![TensorType::new(to, x.shape.clone())])
}

/// CastLike(input, target_type): the input's shape, the target's dtype.
pub(super) fn cast_like(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req(0, "input")?;
    let t = cx.req(1, "target_type")?;
    Ok(vec![TensorType::new(t.dtype, x.shape.clone())])
}

/// Two operands of one dtype in `class`, broadcast; the result has dtype `out`
/// (default: the operands').
pub(super) fn binary(cx: &Ctx, class: Class, out: Option<DType>) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let a = cx.req_class(0, "A", class)?;
    let b = cx.req_class(1, "B", class)?;
    cx.same_dtype(b, 1, "B", a)?;
    let dims = cx.broadcast(&[a, b])?;
    Ok(vec![cx.tt(out.unwrap_or(a.dtype), dims)?])
}

/// Mod: `fmod` 0 (integer modulo, sign of the divisor) is defined for integers only.
pub(super) fn modulo(cx: &Ctx) -> R<Vec<TensorType>> {
    let fmod = cx.attrs::<ModAttrs>()?.fmod;
    let out = binary(cx, Class::Numeric, None)?;
    if !fmod && out.first().is_some_and(|t| t.dtype.is_float()) {
        return Err(cx.invalid("fmod=0 is defined for integer operands only; float operands need fmod=1"));
    }
    Ok(out)
}

/// BitShift: unsigned operands, `direction` LEFT or RIGHT (required).
pub(super) fn bit_shift(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.attrs::<BitShiftAttrs>()?;
    binary(cx, Class::Unsigned, None)
}

/// Pow(X, Y): broadcast; the result has X's dtype (Y may have another numeric dtype).
pub(super) fn pow(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "X", Class::Numeric)?;
    let y = cx.req_class(1, "Y", Class::Numeric)?;
    let dims = cx.broadcast(&[x, y])?;
    Ok(vec![cx.tt(x.dtype, dims)?])
}

/// PRelu(X, slope): slope broadcasts to X's shape (one direction only).
pub(super) fn prelu(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "X", Class::Numeric)?;
    let s = cx.req_same(1, "slope", x)?;
    let dims = cx.broadcast(&[x, s])?;
    if dims != x.shape.dims() {
        return Err(cx.invalid(format_args!("`slope` {s} does not broadcast to the shape of X {x}")));
    }
    Ok(vec![x.clone()])
}

/// Max, Min, Mean, Sum: one or more operands of one dtype, broadcast.
pub(super) fn variadic(cx: &Ctx, class: Class) -> R<Vec<TensorType>> {
    if cx.num_inputs() == 0 {
        return Err(cx.invalid("needs at least one operand"));
    }
    let first = cx.req_class(0, "data_0", class)?;
    let mut tys = Vec::with_capacity(cx.num_inputs());
    for i in 0..cx.num_inputs() {
        let what = format!("data_{i}");
        let t = cx.req_class(i, &what, class)?;
        cx.same_dtype(t, i, &what, first)?;
        tys.push(t);
    }
    let dims = cx.broadcast(&tys)?;
    Ok(vec![cx.tt(first.dtype, dims)?])
}

/// Where(condition: bool, X, Y): the broadcast of all three, X's dtype.
pub(super) fn where_(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let c = cx.req_class(0, "condition", Class::Bool)?;
    let x = cx.req(1, "X")?;
    let y = cx.req_same(2, "Y", x)?;
    let dims = cx.broadcast(&[c, x, y])?;
    Ok(vec![cx.tt(x.dtype, dims)?])
}
