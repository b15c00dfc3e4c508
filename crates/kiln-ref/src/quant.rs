//! Linear quantisation: QuantizeLinear, DequantizeLinear (per tensor, per axis,
//! blocked) and DynamicQuantizeLinear.
//!
//! QuantizeLinear follows the ONNX formula step by step: the quotient `x / scale`
//! is rounded to the division precision (the `precision` attribute when given,
//! else the scale's dtype, as in opset 23; `f64` for integer scales), then
//! - integer results: rounded half to even, plus the zero point, saturated to the
//!   dtype's range (a NaN quotient gives the zero point);
//! - float results: plus the zero point, converted with the `saturate` rule
//!   (which only matters for the 8-bit float types).
//!
//! DequantizeLinear computes `(x − zero_point) · scale` exactly in `f64` where the
//! product fits (inputs up to 16 bits) and rounds once to the result dtype.
//!
//! DynamicQuantizeLinear computes in `f32` as ONNX defines it: range
//! `[min(0, min x), max(0, max x)]` (NaNs ignored), scale = range / 255 (1 when the
//! range is empty, i.e. x is all zeros), zero point = round(clamp(−min / scale)).

use crate::elementwise::{int_range, read_f64, read_i64, widen, write_f64, write_f64_sat};
use crate::reduce::split_at_axis;
use crate::util::Cx;
use crate::EvalError;
use kiln_ir::attrs::{DequantizeAttrs, QuantizeAttrs};
use kiln_ir::lowp::round_binary;
use kiln_ir::{DType, OpKind, Tensor};

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    match cx.kind() {
        OpKind::QuantizeLinear => Ok(vec![quantize(cx)?]),
        OpKind::DequantizeLinear => Ok(vec![dequantize(cx)?]),
        OpKind::DynamicQuantizeLinear => dynamic_quantize(cx),
        _ => Err(cx.unsupported("not a quantisation operator")),
    }
}

/// For each element of `x`, the index of its scale and zero point: per tensor (a
/// scalar or one-element scale), per axis (a 1-D scale along `axis`), or blocked
/// (`block_size > 0`: the scale has x's rank, `ceil(d / block_size)` along `axis`).
fn param_index(cx: &Cx, xd: &[usize], sd: &[usize]) -> Result<Vec<usize>, EvalError> {
    let n: usize = xd.iter().product();
    let sn: usize = sd.iter().product();
    let (axis, block) = match cx.kind() {
        OpKind::QuantizeLinear => {
            let a = cx.attrs::<QuantizeAttrs>()?;
            (a.axis, a.block_size)
        }
        _ => {
            let a = cx.attrs::<DequantizeAttrs>()?;
            (a.axis, a.block_size)
        }
    };
    if block < 0 {
        return Err(cx.invalid(format!("block_size = {block}")));
    }
    if block == 0 {
        if sd.len() <= 1 && sn == 1 {
            return Ok(vec![0; n]);
        }
        if sd.len() != 1 {
            return Err(cx.invalid(format!("scale shape {sd:?}: a scalar or 1-D scale is required")));
        }
        let axis = cx.axis(axis, xd.len())?;
        if sd[0] != xd[axis] {
            return Err(cx.invalid(format!("{} scales for axis {axis} of size {}", sd[0], xd[axis])));
        }
        let (_, c, inner) = split_at_axis(xd, axis);
        return Ok((0..n).map(|j| (j / inner.max(1)) % c.max(1)).collect());
    }
    let block = block as usize;
    let axis = cx.axis(axis, xd.len())?;
    let ok = sd.len() == xd.len()
        && sd.iter().zip(xd).enumerate().all(|(i, (&s, &x))| if i == axis { s == x.div_ceil(block) } else { s == x });
    if !ok {
        return Err(cx.invalid(format!("scale shape {sd:?} does not block input {xd:?} by {block} along axis {axis}")));
    }
    let (outer, xa, inner) = split_at_axis(xd, axis);
    let sa = sd[axis];
    let mut idx = Vec::with_capacity(n);
    for o in 0..outer {
        for k in 0..xa {
            for i in 0..inner {
                idx.push((o * sa + k / block) * inner + i);
            }
        }
    }
    Ok(idx)
}

/// Scales, optional zero points, and for each element of x the index of its pair.
type Params = (Vec<f64>, Option<Vec<f64>>, Vec<usize>);

/// The scale, the optional zero point (dtype `zd`, same shape as the scale) and
/// the index map for operand `x`.
fn params(cx: &Cx, x: &Tensor, zd: DType) -> Result<Params, EvalError> {
    let s = cx.input(1)?;
    if !s.dtype().is_float() && !s.dtype().is_int() {
        return Err(cx.invalid(format!("{} scale", s.dtype())));
    }
    let z = match cx.opt_input(2) {
        Some(z) => {
            if z.dtype() != zd {
                return Err(cx.invalid(format!("zero point dtype {} should be {zd}", z.dtype())));
            }
            // A one-element zero point beside a scalar scale, or a scalar zero point
            // beside a one-element scale, is per-tensor too (ONNX's own test data uses
            // the first form, exporters write the second).
            let one_scalar = s.shape().rank() == 0 || z.shape().rank() == 0;
            let both_single = z.numel() == 1 && s.numel() == 1 && one_scalar;
            if z.shape() != s.shape() && !both_single {
                return Err(cx.invalid(format!("zero point shape {} differs from scale {}", z.shape(), s.shape())));
            }
            Some(read_f64(cx, z)?)
        }
        None => None,
    };
    let idx = param_index(cx, x.shape().dims(), s.shape().dims())?;
    Ok((read_f64(cx, s)?, z, idx))
}

/// `v` rounded to float dtype `d` (the precision of a division done in `d`).
fn round_to(d: DType, v: f64) -> f64 {
    match d {
        DType::F32 => v as f32 as f64,
        DType::F16 => round_binary(v, 11, -14, 65504.0),
        DType::BF16 => round_binary(v, 8, -126, 3.389_531_389_251_535_5e38),
        _ => v,
    }
}

fn quantize(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = cx.out_type(0)?;
    let d = ty.dtype;
    if x.shape() != &ty.shape {
        return Err(cx.invalid(format!("result shape {} differs from x {}", ty.shape, x.shape())));
    }
    if !(d.is_int() || d.is_low_precision_float()) {
        return Err(cx.invalid(format!("{d} is not a quantised dtype")));
    }
    let (s, z, idx) = params(cx, x, d)?;
    let sdt = cx.input(1)?.dtype();
    let qa = cx.attrs::<QuantizeAttrs>()?;
    let prec = match qa.precision {
        0 if sdt.is_float() => sdt,
        0 => DType::F64,
        c => DType::from_onnx_code(c).ok_or_else(|| cx.invalid(format!("precision = {c}")))?,
    };
    let saturate = qa.saturate;
    let xv = read_f64(cx, x)?;
    let zp = |j: usize| z.as_ref().map_or(0.0, |z| z[idx[j]]);
    if d.is_int() {
        let (lo, hi) = int_range(d);
        let v: Vec<i64> = xv
            .iter()
            .enumerate()
            .map(|(j, &p)| {
                let q = round_to(prec, p / s[idx[j]]);
                let q = if q.is_nan() { 0.0 } else { q.round_ties_even() };
                (q + zp(j)).clamp(lo as f64, hi as f64) as i64
            })
            .collect();
        return cx.from_i64(ty, &v);
    }
    let v: Vec<f64> = xv.iter().enumerate().map(|(j, &p)| round_to(prec, p / s[idx[j]]) + zp(j)).collect();
    write_f64_sat(cx, ty, &v, saturate)
}

fn dequantize(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = cx.out_type(0)?;
    if x.shape() != &ty.shape || !ty.dtype.is_float() {
        return Err(cx.invalid(format!("result type {ty} does not fit x {}", x.ty())));
    }
    let (s, z, idx) = params(cx, x, x.dtype())?;
    let v: Vec<f64> = if x.dtype().is_int() {
        let uns = x.dtype().is_unsigned_int();
        let xi = read_i64(cx, x)?;
        let zi = match cx.opt_input(2) {
            Some(t) => Some(read_i64(cx, t)?),
            None => None,
        };
        xi.iter()
            .enumerate()
            .map(|(j, &p)| {
                let zp = zi.as_ref().map_or(0, |z| widen(z[idx[j]], uns));
                (widen(p, uns) - zp) as f64 * s[idx[j]]
            })
            .collect()
    } else {
        let xv = read_f64(cx, x)?;
        xv.iter().enumerate().map(|(j, &p)| (p - z.as_ref().map_or(0.0, |z| z[idx[j]])) * s[idx[j]]).collect()
    };
    write_f64(cx, ty, &v)
}

fn dynamic_quantize(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = cx.float_input(0)?;
    let yty = cx.out_type(0)?;
    if yty.dtype != DType::U8 || yty.shape != *x.shape() {
        return Err(cx.invalid(format!("result 0 has type {yty}, expected u8 of x's shape")));
    }
    let xv: Vec<f32> = x.to_f64_vec().into_iter().map(|v| v as f32).collect();
    let (mut mx, mut mn) = (0.0f32, 0.0f32);
    for &v in &xv {
        if v > mx {
            mx = v;
        }
        if v < mn {
            mn = v;
        }
    }
    let scale = if mx == mn { 1.0f32 } else { (mx - mn) / 255.0 };
    let zp = (0.0f32 - mn / scale).clamp(0.0, 255.0).round_ties_even();
    let y: Vec<i64> = xv
        .iter()
        .map(|&v| {
            let q = (v / scale).round_ties_even();
            let q = if q.is_nan() { 0.0 } else { q };
            (q + zp).clamp(0.0, 255.0) as i64
        })
        .collect();
    let mut out = vec![cx.from_i64(yty, &y)?];
    if cx.out_types.len() > 1 {
        let sty = cx.out_type(1)?;
        if !sty.dtype.is_float() || sty.shape.numel() != 1 {
            return Err(cx.invalid(format!("result 1 has type {sty}, expected a float scalar")));
        }
        out.push(write_f64(cx, sty, &[scale as f64])?);
    }
    if cx.out_types.len() > 2 {
        let zty = cx.out_type(2)?;
        if zty.dtype != DType::U8 || zty.shape.numel() != 1 {
            return Err(cx.invalid(format!("result 2 has type {zty}, expected a u8 scalar")));
        }
        out.push(cx.from_i64(zty, &[zp as i64])?);
    }
    Ok(out)
}
