//! Generators: Range, ConstantOfShape, EyeLike.
//!
//! Range computes `start + i * delta` (floats in `f64`, rounded once to the
//! dtype; integers wrapping), as the ONNX definition states, rather than
//! accumulating `delta`. EyeLike writes the dtype's 1 on the diagonal and zero
//! bits elsewhere.

use super::{build, elems, out_checked, to_usize, width};
use crate::elementwise::{read_f64, write_f64};
use crate::util::Cx;
use crate::EvalError;
use kiln_ir::attrs::{ConstantOfShapeAttrs, EyeLikeAttrs};
use kiln_ir::{DType, Shape, Tensor};

pub(super) fn range(cx: &Cx) -> Result<Tensor, EvalError> {
    let (s, l, d) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    let dt = s.dtype();
    if l.dtype() != dt || d.dtype() != dt || s.numel() != 1 || l.numel() != 1 || d.numel() != 1 {
        return Err(cx.invalid(format!(
            "start {}, limit {}, delta {} must be scalars of one dtype",
            s.ty(),
            l.ty(),
            d.ty()
        )));
    }
    let ty = cx.out_type(0)?;
    if ty.dtype != dt || ty.shape.rank() != 1 {
        return Err(cx.invalid(format!("result type {ty}, expected {dt}[n]")));
    }
    let n = ty.shape.numel();
    if dt.is_int() {
        let (s, l, d) = (cx.ints(0)?[0], cx.ints(1)?[0], cx.ints(2)?[0]);
        if d == 0 {
            return Err(cx.invalid("delta 0"));
        }
        // ceil((l - s) / d), clamped at 0, in exact arithmetic.
        let (mut num, mut den) = (l as i128 - s as i128, d as i128);
        if den < 0 {
            (num, den) = (-num, -den);
        }
        let count = (-(-num).div_euclid(den)).max(0);
        if count != n as i128 {
            return Err(cx.invalid(format!("range has {count} elements, result type {ty}")));
        }
        let v: Vec<i64> = (0..n as i64).map(|i| s.wrapping_add(i.wrapping_mul(d))).collect();
        cx.from_i64(ty, &v)
    } else {
        let (s, l, d) = (read_f64(cx, s)?[0], read_f64(cx, l)?[0], read_f64(cx, d)?[0]);
        if d == 0.0 || !d.is_finite() || !s.is_finite() || !l.is_finite() {
            return Err(cx.invalid(format!("range({s}, {l}, {d}) is not finite")));
        }
        let count = ((l - s) / d).ceil().max(0.0);
        // The count is a rounding-sensitive float expression: accept the result length
        // when it is within one of ours (shape inference may compute it in the dtype).
        if (count - n as f64).abs() > 1.0 {
            return Err(cx.invalid(format!("range has {count} elements, result type {ty}")));
        }
        let v: Vec<f64> = (0..n).map(|i| s + i as f64 * d).collect();
        write_f64(cx, ty, &v)
    }
}

pub(super) fn constant_of_shape(cx: &Cx) -> Result<Tensor, EvalError> {
    let dims: Vec<usize> = cx.ints(0)?.into_iter().map(|d| to_usize(cx, d, "dimension")).collect::<Result<_, _>>()?;
    let value = &cx.attrs::<ConstantOfShapeAttrs>()?.value;
    let dt = value.as_ref().map_or(DType::F32, Tensor::dtype);
    let ty = out_checked(cx, 0, dt, &dims)?;
    let fill = match value {
        Some(v) if v.numel() == 1 => elems(v).data.into_owned(),
        Some(v) => return Err(cx.invalid(format!("value has {} elements, expected 1", v.numel()))),
        None => vec![0; 4],
    };
    let n = ty.shape.numel();
    build(cx, ty, fill.repeat(n))
}

pub(super) fn eye_like(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let ty = cx.out_type(0)?;
    let [rows, cols] = xd else {
        return Err(cx.invalid(format!("input rank {} is not 2", xd.len())));
    };
    let ty = out_checked(cx, 0, ty.dtype, &[*rows, *cols])?;
    let k = cx.attrs::<EyeLikeAttrs>()?.k;
    let one = Tensor::from_f64(ty.dtype, Shape::scalar(), &[1.0]).map_err(|e| cx.invalid(e.to_string()))?;
    let one = elems(&one).data.into_owned();
    let w = width(ty.dtype);
    let mut data = vec![0u8; rows * cols * w];
    for i in 0..*rows {
        let j = i as i128 + k as i128;
        if (0..*cols as i128).contains(&j) {
            let o = (i * cols + j as usize) * w;
            data[o..o + w].copy_from_slice(&one);
        }
    }
    build(cx, ty, data)
}
