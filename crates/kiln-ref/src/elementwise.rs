//! Elementwise operators: unary math and activations, broadcasting binary
//! arithmetic, comparisons, logical and bitwise ops, variadic Max/Min/Sum/Mean,
//! Cast/CastLike, Clip, Where, Identity and Dropout (inference form).
//!
//! Numerics. Float dtypes are read as `f64`, computed in `f64` and rounded once to
//! the result dtype by [`write_f64`] (correctly rounded for f32, f16 and bf16; for
//! the 8-bit-and-smaller float types through a round-to-odd `f32` so that
//! `lowp::encode` rounds once). For `+ - * /` and `sqrt` of f32/f16/bf16 operands
//! this gives exactly the IEEE result of the dtype. Integer dtypes compute in `i64`
//! and wrap to the result dtype; unsigned dtypes are compared, divided and shifted
//! as `u64`; bool is 0/1.
//!
//! Choices where ONNX leaves the behaviour undefined:
//! - float → integer conversions (Cast, integer results of float math such as
//!   Shrink or Pow with a float exponent) truncate toward zero and **saturate** to
//!   the dtype's range; NaN becomes 0;
//! - integer Div and Mod by zero are an error (`Invalid`), not a value;
//! - integer Pow with a negative integer exponent truncates the real result
//!   (1 for base 1, ±1 for base −1, otherwise 0, including base 0);
//! - Mod with `fmod=0` on floats follows numpy (`np.mod`: the result takes the
//!   divisor's sign) although ONNX asks for `fmod=1` there;
//! - Max/Min on floats propagate NaN (as numpy's `maximum`/`minimum`);
//! - BitShift by at least the bit width gives 0.

use crate::util::{broadcast_dims, broadcast_map, Cx};
use crate::EvalError;
use half::{bf16, f16};
use kiln_ir::attrs::{
    AlphaOneAttrs, BitShiftAttrs, CastAttrs, CastLikeAttrs, GeluApproximate, GeluAttrs, HardSigmoidAttrs, IsInfAttrs,
    LeakyReluAttrs, ModAttrs, SeluAttrs, ShiftDirection, ShrinkAttrs,
};
use kiln_ir::lowp::{f64_to_f32_odd, int_to_f64_odd, round_binary, E8M0Rounding, BF16_MAX};
use kiln_ir::{lowp, DType, OpKind, Tensor, TensorType};
use std::cmp::Ordering;

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    use OpKind::*;
    let k = cx.kind();
    let t = match k {
        Identity => identity(cx)?,
        Dropout => return dropout(cx),
        Cast | CastLike => cast(cx)?,
        Abs | Neg | Sign | Relu => unary_signed(cx)?,
        Acos | Acosh | Asin | Asinh | Atan | Atanh | Ceil | Celu | Cos | Cosh | Elu | Erf | Exp | Floor | Gelu
        | HardSigmoid | HardSwish | LeakyRelu | Log | Mish | Reciprocal | Round | Selu | Sigmoid | Sin | Sinh
        | Softplus | Softsign | Sqrt | Tan | Tanh | ThresholdedRelu => unary_float(cx)?,
        Shrink => shrink(cx)?,
        IsInf | IsNaN => is_inf_nan(cx)?,
        Add | Sub | Mul | Div | Mod => arith(cx)?,
        Pow => pow(cx)?,
        Equal | Greater | GreaterOrEqual | Less | LessOrEqual => compare(cx)?,
        And | Or | Xor => logical(cx)?,
        Not => not(cx)?,
        BitwiseAnd | BitwiseOr | BitwiseXor => bitwise(cx)?,
        BitwiseNot => bitwise_not(cx)?,
        BitShift => bit_shift(cx)?,
        Max | Min | Sum | Mean => variadic(cx)?,
        Where => where_(cx)?,
        Clip => clip(cx)?,
        PRelu => prelu(cx)?,
        _ => return Err(cx.unsupported("not an elementwise operator")),
    };
    Ok(vec![t])
}

// ---------------------------------------------------------------------------
// Reading and writing elements (shared with the other op families).
// ---------------------------------------------------------------------------

/// Every element as `i64` (integer and bool dtypes; `u64` keeps its bits).
pub(crate) fn read_i64(cx: &Cx, t: &Tensor) -> Result<Vec<i64>, EvalError> {
    t.to_i64_vec().map_err(|e| cx.invalid(e.to_string()))
}

/// Every element as `f64`. Integer dtypes (4-bit ones included) are read exactly up
/// to 2^53 and rounded to nearest beyond; `u64` is read as unsigned.
pub(crate) fn read_f64(cx: &Cx, t: &Tensor) -> Result<Vec<f64>, EvalError> {
    let d = t.dtype();
    if d.is_int() || d == DType::Bool {
        let v = read_i64(cx, t)?;
        Ok(if d.is_unsigned_int() {
            v.iter().map(|&x| x as u64 as f64).collect()
        } else {
            v.iter().map(|&x| x as f64).collect()
        })
    } else {
        Ok(t.to_f64_vec())
    }
}

/// A tensor of type `ty` from `f64` values, rounded once (saturating for the
/// low-precision float types; see [`write_f64_sat`]).
pub(crate) fn write_f64(cx: &Cx, ty: &TensorType, v: &[f64]) -> Result<Tensor, EvalError> {
    write_f64_sat(cx, ty, v, true)
}

/// A tensor of type `ty` from `f64` values, converted as a Cast would:
/// - f32/f64/f16/bf16: round to nearest even, overflow to ±inf;
/// - 8-bit floats: round to nearest even with the dtype's saturation rule when
///   `saturate`, else out-of-range values become NaN/inf as the dtype has them;
///   f6/f4/e8m0 always saturate;
/// - integers: truncate toward zero and saturate to the dtype's range, NaN → 0;
/// - bool: `x != 0` (NaN is true).
pub(crate) fn write_f64_sat(cx: &Cx, ty: &TensorType, v: &[f64], saturate: bool) -> Result<Tensor, EvalError> {
    write_f64_cast(cx, ty, v, saturate, E8M0Rounding::Nearest)
}

/// [`write_f64_sat`] with `e8m0` choosing the power of two of an `f8E8M0FNU` result
/// (Cast's `round_mode`; f64 values round to f32 *to odd* first, which keeps "exactly a
/// power of two" and "above it" apart).
pub(crate) fn write_f64_cast(
    cx: &Cx,
    ty: &TensorType,
    v: &[f64],
    saturate: bool,
    e8m0: E8M0Rounding,
) -> Result<Tensor, EvalError> {
    match ty.dtype {
        DType::F32 | DType::F64 | DType::Bool => cx.from_f64(ty, v),
        // The half crate may round through f32 or drop low bits; rounding here to a
        // representable value first makes its conversion exact.
        DType::F16 => {
            let r: Vec<f64> = v.iter().map(|&x| round_binary(x, 11, -14, 65504.0)).collect();
            cx.from_f64(ty, &r)
        }
        DType::BF16 => {
            let r: Vec<f64> = v.iter().map(|&x| round_binary(x, 8, -126, BF16_MAX)).collect();
            cx.from_f64(ty, &r)
        }
        d if d.is_int() => {
            let iv: Vec<i64> = v.iter().map(|&x| f64_to_int(d, x)).collect();
            cx.from_i64(ty, &iv)
        }
        DType::F8E8M0FNU => {
            let codes: Vec<u8> = v.iter().map(|&x| lowp::encode_e8m0(f64_to_f32_odd(x), true, e8m0)).collect();
            Tensor::from_codes(DType::F8E8M0FNU, ty.shape.clone(), &codes).map_err(|e| cx.invalid(e.to_string()))
        }
        d => {
            let sat = saturate || !is_f8(d);
            let codes: Vec<u8> = v.iter().map(|&x| lowp::encode(d, f64_to_f32_odd(x), sat)).collect();
            Tensor::from_codes(d, ty.shape.clone(), &codes).map_err(|e| cx.invalid(e.to_string()))
        }
    }
}

/// True for the four 8-bit float types the ONNX `saturate` attribute applies to.
fn is_f8(d: DType) -> bool {
    matches!(d, DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ)
}

/// The value range of an integer (or bool) dtype; i64's for any other.
pub(crate) fn int_range(d: DType) -> (i128, i128) {
    d.int_range().unwrap_or((i64::MIN as i128, i64::MAX as i128))
}

/// `x` truncated toward zero and saturated to the range of integer dtype `d`
/// (NaN → 0), as the `i64` whose bits `Tensor::from_i64` stores (`u64` values
/// above `i64::MAX` come back negative).
pub(crate) fn f64_to_int(d: DType, x: f64) -> i64 {
    if x.is_nan() {
        return 0;
    }
    let (lo, hi) = int_range(d);
    let t = x.trunc();
    let v = if t <= lo as f64 {
        lo
    } else if t >= hi as f64 {
        hi
    } else {
        t as i128
    };
    v as i64
}

/// An integer element as `i128`, reading `u64` bits as unsigned when `uns`.
pub(crate) fn widen(v: i64, uns: bool) -> i128 {
    if uns {
        v as u64 as i128
    } else {
        v as i128
    }
}

/// Compares two integer elements of a dtype that is unsigned when `uns`.
pub(crate) fn icmp(a: i64, b: i64, uns: bool) -> Ordering {
    if uns {
        (a as u64).cmp(&(b as u64))
    } else {
        a.cmp(&b)
    }
}

/// One raw storage word per element (codes for types of 8 bits or fewer).
pub(crate) fn raw_elems(t: &Tensor) -> Vec<u64> {
    let b = t.bytes();
    match t.dtype().bits() {
        16 => b.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]) as u64).collect(),
        32 => b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u64).collect(),
        64 => b.chunks_exact(8).map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])).collect(),
        _ => t.codes().into_iter().map(u64::from).collect(),
    }
}

/// A tensor of type `ty` from raw storage words (the inverse of [`raw_elems`]).
pub(crate) fn from_raw(cx: &Cx, ty: &TensorType, v: &[u64]) -> Result<Tensor, EvalError> {
    let s = ty.shape.clone();
    let r = match ty.dtype {
        DType::F32 => Tensor::from_vec(s, v.iter().map(|&x| f32::from_bits(x as u32)).collect()),
        DType::F64 => Tensor::from_vec(s, v.iter().map(|&x| f64::from_bits(x)).collect()),
        DType::F16 => Tensor::from_vec(s, v.iter().map(|&x| f16::from_bits(x as u16)).collect()),
        DType::BF16 => Tensor::from_vec(s, v.iter().map(|&x| bf16::from_bits(x as u16)).collect()),
        DType::I16 => Tensor::from_vec(s, v.iter().map(|&x| x as u16 as i16).collect()),
        DType::U16 => Tensor::from_vec(s, v.iter().map(|&x| x as u16).collect()),
        DType::I32 => Tensor::from_vec(s, v.iter().map(|&x| x as u32 as i32).collect()),
        DType::U32 => Tensor::from_vec(s, v.iter().map(|&x| x as u32).collect()),
        DType::I64 => Tensor::from_vec(s, v.iter().map(|&x| x as i64).collect()),
        DType::U64 => Tensor::from_vec(s, v.to_vec()),
        d => Tensor::from_codes(d, s, &v.iter().map(|&x| x as u8).collect::<Vec<u8>>()),
    };
    r.map_err(|e| cx.invalid(e.to_string()))
}

// ---------------------------------------------------------------------------
// Broadcasting.
// ---------------------------------------------------------------------------

/// Checks that every operand broadcasts (numpy rules) to exactly `out`.
pub(crate) fn check_broadcast(cx: &Cx, ins: &[&[usize]], out: &[usize]) -> Result<(), EvalError> {
    match broadcast_dims(ins) {
        Some(b) if b == out => Ok(()),
        Some(b) => Err(cx.invalid(format!("operands broadcast to {b:?}, result type says {out:?}"))),
        None => Err(cx.invalid(format!("operand shapes {ins:?} do not broadcast"))),
    }
}

/// Checks that `dims` broadcasts to `out` without changing `out` (unidirectional).
pub(crate) fn check_unidirectional(cx: &Cx, dims: &[usize], out: &[usize]) -> Result<(), EvalError> {
    check_broadcast(cx, &[dims, out], out)
}

/// `v` (of shape `dims`, already checked to broadcast to `out`) expanded to `out`.
pub(crate) fn expand<T: Copy>(v: Vec<T>, dims: &[usize], out: &[usize]) -> Vec<T> {
    let n: usize = out.iter().product();
    if v.len() == n {
        // Broadcast-compatible with equal counts: only leading 1s differ.
        return v;
    }
    if v.len() == 1 {
        return vec![v[0]; n];
    }
    broadcast_map(dims, out).into_iter().map(|i| v[i]).collect()
}

fn dims(t: &Tensor) -> &[usize] {
    t.shape().dims()
}

/// All operands share one dtype.
fn same_dtype(cx: &Cx, ts: &[&Tensor]) -> Result<DType, EvalError> {
    let d = ts.first().map(|t| t.dtype()).ok_or_else(|| cx.invalid("no operands"))?;
    for t in ts {
        if t.dtype() != d {
            return Err(cx.invalid(format!("operand dtypes differ: {d} and {}", t.dtype())));
        }
    }
    Ok(d)
}

/// The result type, whose dtype must be `d`.
fn out_of_dtype<'a>(cx: &Cx<'a>, d: DType) -> Result<&'a TensorType, EvalError> {
    let ty = cx.out_type(0)?;
    if ty.dtype != d {
        return Err(cx.invalid(format!("result dtype {} should be {d}", ty.dtype)));
    }
    Ok(ty)
}

fn is_intlike(d: DType) -> bool {
    d.is_int() || d == DType::Bool
}

/// The two operands of a broadcasting binary op, checked against result type `ty`.
fn two<'a>(cx: &Cx<'a>, ty: &TensorType) -> Result<(&'a Tensor, &'a Tensor), EvalError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    check_broadcast(cx, &[dims(a), dims(b)], ty.shape.dims())?;
    Ok((a, b))
}

/// Both operands read as `T` by `read` and broadcast to `out`.
fn zip<T: Copy>(
    cx: &Cx,
    a: &Tensor,
    b: &Tensor,
    out: &[usize],
    read: fn(&Cx, &Tensor) -> Result<Vec<T>, EvalError>,
) -> Result<(Vec<T>, Vec<T>), EvalError> {
    Ok((expand(read(cx, a)?, dims(a), out), expand(read(cx, b)?, dims(b), out)))
}

// ---------------------------------------------------------------------------
// Identity, Dropout, Cast.
// ---------------------------------------------------------------------------

fn identity(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = out_of_dtype(cx, x.dtype())?;
    x.reshaped(ty.shape.clone()).map_err(|e| cx.invalid(e.to_string()))
}

fn dropout(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let training = match cx.opt_input(2) {
        Some(t) => read_f64(cx, t)?.first().is_some_and(|&v| v != 0.0),
        None => false,
    };
    let ratio = match cx.opt_input(1) {
        Some(t) => read_f64(cx, t)?.first().copied().unwrap_or(0.5),
        None => 0.5,
    };
    if training && ratio != 0.0 {
        return Err(cx.unsupported("training mode with a non-zero ratio is random"));
    }
    let mut out = vec![identity(cx)?];
    if cx.out_types.len() > 1 {
        let mty = cx.out_type(1)?;
        if mty.dtype != DType::Bool {
            return Err(cx.invalid(format!("mask dtype {} should be bool", mty.dtype)));
        }
        out.push(cx.from_i64(mty, &vec![1; mty.shape.numel()])?);
    }
    Ok(out)
}

fn cast(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = cx.out_type(0)?;
    let d = ty.dtype;
    let (saturate, mode) = if cx.kind() == OpKind::Cast {
        let a = cx.attrs::<CastAttrs>()?;
        if a.to != d {
            return Err(cx.invalid(format!("`to` is {}, result dtype is {d}", a.to)));
        }
        (a.saturate, a.round_mode)
    } else {
        let a = cx.attrs::<CastLikeAttrs>()?;
        (a.saturate, a.round_mode)
    };
    let mode = E8M0Rounding::from(mode);
    if let (OpKind::CastLike, Some(t)) = (cx.kind(), cx.opt_input(1)) {
        if t.dtype() != d {
            return Err(cx.invalid(format!("target_type is {}, result dtype is {d}", t.dtype())));
        }
    }
    if x.shape() != &ty.shape {
        return Err(cx.invalid(format!("result shape {} differs from input {}", ty.shape, x.shape())));
    }
    let s = x.dtype();
    if s == d {
        return Ok(x.clone());
    }
    if s.is_float() {
        return write_f64_cast(cx, ty, &x.to_f64_vec(), saturate, mode);
    }
    let v = read_i64(cx, x)?;
    if is_intlike(d) {
        return cx.from_i64(ty, &v);
    }
    let uns = s.is_unsigned_int();
    let f: Vec<f64> = if d == DType::F64 {
        v.iter().map(|&i| widen(i, uns) as f64).collect()
    } else {
        v.iter().map(|&i| int_to_f64_odd(widen(i, uns))).collect()
    };
    write_f64_cast(cx, ty, &f, saturate, mode)
}

// ---------------------------------------------------------------------------
// Unary.
// ---------------------------------------------------------------------------

/// Abs, Neg, Sign, Relu: floats and integers.
fn unary_signed(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let d = x.dtype();
    let ty = out_of_dtype(cx, d)?;
    let k = cx.kind();
    if d.is_float() {
        let f: fn(f64) -> f64 = match k {
            OpKind::Abs => f64::abs,
            OpKind::Neg => |v| -v,
            OpKind::Sign => |v| {
                if v > 0.0 {
                    1.0
                } else if v < 0.0 {
                    -1.0
                } else {
                    v * 0.0
                }
            },
            _ => |v| if v < 0.0 { 0.0 } else { v },
        };
        let v: Vec<f64> = x.to_f64_vec().into_iter().map(f).collect();
        return write_f64(cx, ty, &v);
    }
    if !d.is_int() {
        return Err(cx.invalid(format!("{d} operand")));
    }
    let uns = d.is_unsigned_int();
    let f: fn(i64) -> i64 = match (k, uns) {
        (OpKind::Abs, false) => i64::wrapping_abs,
        (OpKind::Neg, _) => i64::wrapping_neg,
        (OpKind::Sign, false) => i64::signum,
        (OpKind::Sign, true) => |v| (v != 0) as i64,
        (OpKind::Relu, false) => |v| v.max(0),
        _ => |v| v, // Abs and Relu of unsigned values
    };
    let v: Vec<i64> = read_i64(cx, x)?.into_iter().map(f).collect();
    cx.from_i64(ty, &v)
}

/// Float-only unary ops and activations.
fn unary_float(cx: &Cx) -> Result<Tensor, EvalError> {
    use OpKind::*;
    let x = cx.float_input(0)?;
    let d = x.dtype();
    let ty = out_of_dtype(cx, d)?;
    let f: Box<dyn Fn(f64) -> f64> = match cx.kind() {
        Acos => Box::new(f64::acos),
        Acosh => Box::new(f64::acosh),
        Asin => Box::new(f64::asin),
        Asinh => Box::new(f64::asinh),
        Atan => Box::new(f64::atan),
        Atanh => Box::new(f64::atanh),
        Ceil => Box::new(f64::ceil),
        Cos => Box::new(f64::cos),
        Cosh => Box::new(f64::cosh),
        Erf => Box::new(erf),
        Exp => Box::new(f64::exp),
        Floor => Box::new(f64::floor),
        Log => Box::new(f64::ln),
        Reciprocal => Box::new(|v| 1.0 / v),
        Round => Box::new(f64::round_ties_even),
        Sigmoid => Box::new(sigmoid),
        Sin => Box::new(f64::sin),
        Sinh => Box::new(f64::sinh),
        Softplus => Box::new(softplus),
        Softsign => Box::new(|v| v / (1.0 + v.abs())),
        Sqrt => Box::new(f64::sqrt),
        Tan => Box::new(f64::tan),
        Tanh => Box::new(f64::tanh),
        Mish => Box::new(|v| v * softplus(v).tanh()),
        HardSwish => Box::new(|v| v * (v / 6.0 + 0.5).clamp(0.0, 1.0)),
        Celu => {
            let a = cx.attrs::<AlphaOneAttrs>()?.alpha as f64;
            // max(0, x) + min(0, α(e^{x/α} − 1)); f64::max/min would turn NaN into 0.
            Box::new(move |v| if v.is_nan() { v } else { v.max(0.0) + (a * (v / a).exp_m1()).min(0.0) })
        }
        Elu => {
            let a = cx.attrs::<AlphaOneAttrs>()?.alpha as f64;
            Box::new(move |v| if v < 0.0 { a * v.exp_m1() } else { v })
        }
        Selu => {
            // The f32 defaults 1.67326319217681884765625 and 1.05070102214813232421875.
            let sa = cx.attrs::<SeluAttrs>()?;
            let (a, g) = (sa.alpha as f64, sa.gamma as f64);
            Box::new(move |v| if v > 0.0 { g * v } else { g * a * v.exp_m1() })
        }
        HardSigmoid => {
            let ha = cx.attrs::<HardSigmoidAttrs>()?;
            let (a, b) = (ha.alpha as f64, ha.beta as f64);
            Box::new(move |v| (a * v + b).clamp(0.0, 1.0))
        }
        LeakyRelu => {
            let a = cx.attrs::<LeakyReluAttrs>()?.alpha as f64;
            Box::new(move |v| if v < 0.0 { a * v } else { v })
        }
        ThresholdedRelu => {
            let a = cx.attrs::<AlphaOneAttrs>()?.alpha as f64;
            Box::new(move |v| if v > a { v } else { 0.0 })
        }
        Gelu => match cx.attrs::<GeluAttrs>()?.approximate {
            GeluApproximate::None => Box::new(|v| 0.5 * v * erfc(-v * std::f64::consts::FRAC_1_SQRT_2)),
            GeluApproximate::Tanh => Box::new(|v| {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
            }),
        },
        _ => return Err(cx.unsupported("not a unary float operator")),
    };
    let v: Vec<f64> = x.to_f64_vec().into_iter().map(f).collect();
    write_f64(cx, ty, &v)
}

/// The logistic function, without overflow for large |x|.
pub(crate) fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// ln(1 + e^x), without overflow for large x.
pub(crate) fn softplus(x: f64) -> f64 {
    if x > 0.0 {
        x + (-x).exp().ln_1p()
    } else {
        x.exp().ln_1p()
    }
}

/// The error function (relative error near 1e-15).
pub(crate) fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    let r = if a < 2.0 { erf_series(a) } else { 1.0 - erfc_cf(a) };
    r.copysign(x)
}

/// The complementary error function 1 − erf(x), accurate also where it is tiny.
pub(crate) fn erfc(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x < 2.0 {
        if x < 0.0 {
            1.0 + erf(-x)
        } else {
            1.0 - erf_series(x)
        }
    } else {
        erfc_cf(x)
    }
}

/// erf(x) for 0 <= x < 2 by the series 2/√π · e^{−x²} · Σ 2ⁿ x^{2n+1} / (1·3·…·(2n+1)),
/// whose terms are all positive (no cancellation).
fn erf_series(x: f64) -> f64 {
    let x2 = x * x;
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while term > sum * 1e-17 {
        n += 1.0;
        term *= 2.0 * x2 / (2.0 * n + 1.0);
        sum += term;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt() * (-x2).exp()
}

/// erfc(x) for x >= 2 by the continued fraction
/// e^{−x²}/√π · 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + …)))), evaluated with Lentz's method.
fn erfc_cf(x: f64) -> f64 {
    if x > 27.0 {
        return 0.0;
    }
    let tiny = 1e-300;
    let mut f = x;
    let mut c = x;
    let mut d = 0.0;
    for n in 1..500 {
        let a = n as f64 * 0.5;
        d = x + a * d;
        if d == 0.0 {
            d = tiny;
        }
        d = 1.0 / d;
        c = x + a / c;
        if c == 0.0 {
            c = tiny;
        }
        let delta = c * d;
        f *= delta;
        if (delta - 1.0).abs() < 1e-16 {
            break;
        }
    }
    (-x * x).exp() / std::f64::consts::PI.sqrt() / f
}

fn shrink(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = out_of_dtype(cx, x.dtype())?;
    let sa = cx.attrs::<ShrinkAttrs>()?;
    let (bias, lambd) = (sa.bias as f64, sa.lambd as f64);
    let v: Vec<f64> = read_f64(cx, x)?
        .into_iter()
        .map(|v| {
            if v < -lambd {
                v + bias
            } else if v > lambd {
                v - bias
            } else {
                0.0
            }
        })
        .collect();
    write_f64(cx, ty, &v)
}

fn is_inf_nan(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = out_of_dtype(cx, DType::Bool)?;
    let v = read_f64(cx, x)?;
    let r: Vec<i64> = if cx.kind() == OpKind::IsNaN {
        v.iter().map(|x| x.is_nan() as i64).collect()
    } else {
        let ia = cx.attrs::<IsInfAttrs>()?;
        let (neg, pos) = (ia.detect_negative, ia.detect_positive);
        v.iter().map(|&x| ((x == f64::INFINITY && pos) || (x == f64::NEG_INFINITY && neg)) as i64).collect()
    };
    cx.from_i64(ty, &r)
}

// ---------------------------------------------------------------------------
// Binary.
// ---------------------------------------------------------------------------

fn arith(cx: &Cx) -> Result<Tensor, EvalError> {
    use OpKind::*;
    let k = cx.kind();
    let ty = cx.out_type(0)?;
    let (a, b) = two(cx, ty)?;
    let d = same_dtype(cx, &[a, b])?;
    out_of_dtype(cx, d)?;
    let out = ty.shape.dims();
    let fmod = k == Mod && cx.attrs::<ModAttrs>()?.fmod;
    if d.is_float() {
        let (x, y) = zip(cx, a, b, out, read_f64)?;
        let f: fn(f64, f64) -> f64 = match k {
            Add => |p, q| p + q,
            Sub => |p, q| p - q,
            Mul => |p, q| p * q,
            Div => |p, q| p / q,
            _ if fmod => |p, q| p % q,
            _ => |p, q| {
                let r = p % q;
                if r != 0.0 && (r < 0.0) != (q < 0.0) {
                    r + q
                } else {
                    r
                }
            },
        };
        let v: Vec<f64> = x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect();
        return write_f64(cx, ty, &v);
    }
    if !d.is_int() {
        return Err(cx.invalid(format!("{d} operands")));
    }
    let (x, y) = zip(cx, a, b, out, read_i64)?;
    if matches!(k, Div | Mod) && y.contains(&0) {
        return Err(cx.invalid("integer division by zero"));
    }
    let uns = d.is_unsigned_int();
    let f: fn(i64, i64) -> i64 = match (k, uns) {
        (Add, _) => i64::wrapping_add,
        (Sub, _) => i64::wrapping_sub,
        (Mul, _) => i64::wrapping_mul,
        (Div, false) => i64::wrapping_div,
        (Div, true) => |p, q| ((p as u64) / (q as u64)) as i64,
        (_, true) => |p, q| ((p as u64) % (q as u64)) as i64,
        _ if fmod => i64::wrapping_rem,
        _ => |p, q| {
            let r = p.wrapping_rem(q);
            if r != 0 && (r < 0) != (q < 0) {
                r.wrapping_add(q)
            } else {
                r
            }
        },
    };
    let v: Vec<i64> = x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect();
    cx.from_i64(ty, &v)
}

/// base^exp with wrapping integer arithmetic; see the module docs for negative exponents.
fn ipow(base: i64, exp: i64, base_uns: bool, exp_uns: bool) -> i64 {
    if !exp_uns && exp < 0 {
        return match (base, base_uns) {
            (1, _) => 1,
            (-1, false) => {
                if exp % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut e, mut b, mut r) = (exp as u64, base, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            r = r.wrapping_mul(b);
        }
        b = b.wrapping_mul(b);
        e >>= 1;
    }
    r
}

fn pow(cx: &Cx) -> Result<Tensor, EvalError> {
    let ty = cx.out_type(0)?;
    let (a, b) = two(cx, ty)?;
    let d = a.dtype();
    out_of_dtype(cx, d)?;
    let out = ty.shape.dims();
    if d.is_int() && b.dtype().is_int() {
        let (x, y) = zip(cx, a, b, out, read_i64)?;
        let (bu, eu) = (d.is_unsigned_int(), b.dtype().is_unsigned_int());
        let v: Vec<i64> = x.iter().zip(&y).map(|(&p, &q)| ipow(p, q, bu, eu)).collect();
        return cx.from_i64(ty, &v);
    }
    if !(d.is_float() || d.is_int()) || !(b.dtype().is_float() || b.dtype().is_int()) {
        return Err(cx.invalid(format!("{d} ^ {} is not numeric", b.dtype())));
    }
    let (x, y) = zip(cx, a, b, out, read_f64)?;
    let v: Vec<f64> = x.iter().zip(&y).map(|(&p, &q)| p.powf(q)).collect();
    write_f64(cx, ty, &v)
}

fn compare(cx: &Cx) -> Result<Tensor, EvalError> {
    use OpKind::*;
    let ty = out_of_dtype(cx, DType::Bool)?;
    let (a, b) = two(cx, ty)?;
    let d = same_dtype(cx, &[a, b])?;
    let out = ty.shape.dims();
    let k = cx.kind();
    let accept = |o: Option<Ordering>| -> bool {
        match k {
            Equal => o == Some(Ordering::Equal),
            Greater => o == Some(Ordering::Greater),
            GreaterOrEqual => matches!(o, Some(Ordering::Greater | Ordering::Equal)),
            Less => o == Some(Ordering::Less),
            _ => matches!(o, Some(Ordering::Less | Ordering::Equal)),
        }
    };
    let v: Vec<i64> = if d.is_float() {
        let (x, y) = zip(cx, a, b, out, read_f64)?;
        x.iter().zip(&y).map(|(p, q)| accept(p.partial_cmp(q)) as i64).collect()
    } else {
        let uns = d.is_unsigned_int();
        let (x, y) = zip(cx, a, b, out, read_i64)?;
        x.iter().zip(&y).map(|(&p, &q)| accept(Some(icmp(p, q, uns))) as i64).collect()
    };
    cx.from_i64(ty, &v)
}

fn logical(cx: &Cx) -> Result<Tensor, EvalError> {
    let ty = out_of_dtype(cx, DType::Bool)?;
    let (a, b) = two(cx, ty)?;
    if same_dtype(cx, &[a, b])? != DType::Bool {
        return Err(cx.invalid("operands must be bool"));
    }
    let (x, y) = zip(cx, a, b, ty.shape.dims(), read_i64)?;
    let f: fn(bool, bool) -> bool = match cx.kind() {
        OpKind::And => |p, q| p && q,
        OpKind::Or => |p, q| p || q,
        _ => |p, q| p != q,
    };
    let v: Vec<i64> = x.iter().zip(&y).map(|(&p, &q)| f(p != 0, q != 0) as i64).collect();
    cx.from_i64(ty, &v)
}

fn not(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    if x.dtype() != DType::Bool {
        return Err(cx.invalid("operand must be bool"));
    }
    let ty = out_of_dtype(cx, DType::Bool)?;
    let v: Vec<i64> = read_i64(cx, x)?.iter().map(|&p| (p == 0) as i64).collect();
    cx.from_i64(ty, &v)
}

/// The result type and the broadcast operands (as i64) of a binary op on integers: both
/// operands and the result of one dtype, which `takes` accepts (`what` names them).
fn int_operands<'a>(
    cx: &Cx<'a>,
    takes: fn(DType) -> bool,
    what: &str,
) -> Result<(&'a TensorType, Vec<i64>, Vec<i64>), EvalError> {
    let ty = cx.out_type(0)?;
    let (a, b) = two(cx, ty)?;
    let d = same_dtype(cx, &[a, b])?;
    out_of_dtype(cx, d)?;
    if !takes(d) {
        return Err(cx.invalid(format!("{d} operands, {what} required")));
    }
    let (x, y) = zip(cx, a, b, ty.shape.dims(), read_i64)?;
    Ok((ty, x, y))
}

fn bitwise(cx: &Cx) -> Result<Tensor, EvalError> {
    let (ty, x, y) = int_operands(cx, DType::is_int, "integers")?;
    let f: fn(i64, i64) -> i64 = match cx.kind() {
        OpKind::BitwiseAnd => |p, q| p & q,
        OpKind::BitwiseOr => |p, q| p | q,
        _ => |p, q| p ^ q,
    };
    let v: Vec<i64> = x.iter().zip(&y).map(|(&p, &q)| f(p, q)).collect();
    cx.from_i64(ty, &v)
}

fn bitwise_not(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let d = x.dtype();
    let ty = out_of_dtype(cx, d)?;
    if !d.is_int() {
        return Err(cx.invalid(format!("{d} operand, an integer is required")));
    }
    let v: Vec<i64> = read_i64(cx, x)?.iter().map(|&p| !p).collect();
    cx.from_i64(ty, &v)
}

fn bit_shift(cx: &Cx) -> Result<Tensor, EvalError> {
    let (ty, x, y) = int_operands(cx, DType::is_unsigned_int, "unsigned integers")?;
    let left = cx.attrs::<BitShiftAttrs>()?.direction == ShiftDirection::Left;
    let v: Vec<i64> = x
        .iter()
        .zip(&y)
        .map(|(&p, &q)| {
            let (p, q) = (p as u64, q as u64);
            let r = if q >= 64 {
                0
            } else if left {
                p << q
            } else {
                p >> q
            };
            r as i64
        })
        .collect();
    cx.from_i64(ty, &v)
}

fn prelu(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, s) = (cx.input(0)?, cx.input(1)?);
    let d = same_dtype(cx, &[x, s])?;
    let ty = out_of_dtype(cx, d)?;
    let out = ty.shape.dims();
    if dims(x) != out {
        return Err(cx.invalid(format!("result shape {out:?} differs from X {:?}", dims(x))));
    }
    check_unidirectional(cx, dims(s), out)?;
    if d.is_float() {
        let (x, s) = zip(cx, x, s, out, read_f64)?;
        let v: Vec<f64> = x.iter().zip(&s).map(|(&p, &q)| if p < 0.0 { q * p } else { p }).collect();
        return write_f64(cx, ty, &v);
    }
    if !d.is_int() {
        return Err(cx.invalid(format!("{d} operands")));
    }
    let uns = d.is_unsigned_int();
    let (x, s) = zip(cx, x, s, out, read_i64)?;
    let v: Vec<i64> = x.iter().zip(&s).map(|(&p, &q)| if !uns && p < 0 { q.wrapping_mul(p) } else { p }).collect();
    cx.from_i64(ty, &v)
}

// ---------------------------------------------------------------------------
// Variadic, Where, Clip.
// ---------------------------------------------------------------------------

fn variadic(cx: &Cx) -> Result<Tensor, EvalError> {
    use OpKind::*;
    let k = cx.kind();
    let ins: Vec<&Tensor> = (0..cx.inputs.len()).map(|i| cx.input(i)).collect::<Result<_, _>>()?;
    if ins.is_empty() {
        return Err(cx.invalid("needs at least one operand"));
    }
    let d = same_dtype(cx, &ins)?;
    let ty = out_of_dtype(cx, d)?;
    let out = ty.shape.dims();
    let shapes: Vec<&[usize]> = ins.iter().map(|t| dims(t)).collect();
    check_broadcast(cx, &shapes, out)?;
    if d.is_float() {
        let mut acc = expand(ins[0].to_f64_vec(), shapes[0], out);
        for t in &ins[1..] {
            let v = expand(t.to_f64_vec(), dims(t), out);
            let f: fn(f64, f64) -> f64 = match k {
                Max => |p, q| if p.is_nan() || q.is_nan() { f64::NAN } else { p.max(q) },
                Min => |p, q| if p.is_nan() || q.is_nan() { f64::NAN } else { p.min(q) },
                _ => |p, q| p + q,
            };
            acc.iter_mut().zip(&v).for_each(|(p, &q)| *p = f(*p, q));
        }
        if k == Mean {
            let n = ins.len() as f64;
            acc.iter_mut().for_each(|p| *p /= n);
        }
        return write_f64(cx, ty, &acc);
    }
    if !is_intlike(d) {
        return Err(cx.invalid(format!("{d} operands")));
    }
    let uns = d.is_unsigned_int();
    let first = expand(read_i64(cx, ins[0])?, shapes[0], out);
    if k == Mean {
        // Exact sum, then the truncated quotient (always in range).
        let mut acc: Vec<i128> = first.iter().map(|&p| widen(p, uns)).collect();
        for t in &ins[1..] {
            let v = expand(read_i64(cx, t)?, dims(t), out);
            acc.iter_mut().zip(&v).for_each(|(p, &q)| *p += widen(q, uns));
        }
        let n = ins.len() as i128;
        let v: Vec<i64> = acc.iter().map(|&p| (p / n) as i64).collect();
        return cx.from_i64(ty, &v);
    }
    let mut acc = first;
    for t in &ins[1..] {
        let v = expand(read_i64(cx, t)?, dims(t), out);
        acc.iter_mut().zip(&v).for_each(|(p, &q)| {
            *p = match k {
                Max => {
                    if icmp(q, *p, uns) == Ordering::Greater {
                        q
                    } else {
                        *p
                    }
                }
                Min => {
                    if icmp(q, *p, uns) == Ordering::Less {
                        q
                    } else {
                        *p
                    }
                }
                _ => p.wrapping_add(q),
            }
        });
    }
    cx.from_i64(ty, &acc)
}

fn where_(cx: &Cx) -> Result<Tensor, EvalError> {
    let (c, x, y) = (cx.input(0)?, cx.input(1)?, cx.input(2)?);
    if c.dtype() != DType::Bool {
        return Err(cx.invalid("condition must be bool"));
    }
    let d = same_dtype(cx, &[x, y])?;
    let ty = out_of_dtype(cx, d)?;
    let out = ty.shape.dims();
    check_broadcast(cx, &[dims(c), dims(x), dims(y)], out)?;
    let cv = expand(read_i64(cx, c)?, dims(c), out);
    let xv = expand(raw_elems(x), dims(x), out);
    let yv = expand(raw_elems(y), dims(y), out);
    let v: Vec<u64> = cv.iter().zip(xv.iter().zip(&yv)).map(|(&c, (&p, &q))| if c != 0 { p } else { q }).collect();
    from_raw(cx, ty, &v)
}

fn clip(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let d = x.dtype();
    let ty = out_of_dtype(cx, d)?;
    if x.shape() != &ty.shape {
        return Err(cx.invalid(format!("result shape {} differs from input {}", ty.shape, x.shape())));
    }
    // An absent bound, or an empty tensor given for one, means no bound.
    let bound = |i: usize| -> Result<Option<&Tensor>, EvalError> {
        match cx.opt_input(i) {
            Some(t) if t.numel() == 0 => Ok(None),
            Some(t) if t.numel() == 1 && t.dtype() == d => Ok(Some(t)),
            Some(t) => Err(cx.invalid(format!("bound {i} must be a {d} scalar, got {}", t.ty()))),
            None => Ok(None),
        }
    };
    let (lo, hi) = (bound(1)?, bound(2)?);
    if d.is_float() {
        let lo = lo.map_or(f64::NEG_INFINITY, |t| t.to_f64_vec()[0]);
        let hi = hi.map_or(f64::INFINITY, |t| t.to_f64_vec()[0]);
        // min(max(x, lo), hi) as numpy's clip; NaN stays NaN.
        let v: Vec<f64> = x
            .to_f64_vec()
            .into_iter()
            .map(|p| {
                let p = if p < lo { lo } else { p };
                if p > hi {
                    hi
                } else {
                    p
                }
            })
            .collect();
        return write_f64(cx, ty, &v);
    }
    if !d.is_int() {
        return Err(cx.invalid(format!("{d} operand")));
    }
    let uns = d.is_unsigned_int();
    let lo = lo.map(|t| read_i64(cx, t)).transpose()?.map(|v| v[0]);
    let hi = hi.map(|t| read_i64(cx, t)).transpose()?.map(|v| v[0]);
    let v: Vec<i64> = read_i64(cx, x)?
        .into_iter()
        .map(|p| {
            let p = match lo {
                Some(l) if icmp(p, l, uns) == Ordering::Less => l,
                _ => p,
            };
            match hi {
                Some(h) if icmp(p, h, uns) == Ordering::Greater => h,
                _ => p,
            }
        })
        .collect();
    cx.from_i64(ty, &v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rel(a: f64, b: f64) -> f64 {
        ((a - b) / b).abs()
    }

    #[test]
    fn erf_and_erfc_match_known_values() {
        // Reference values from an independent libm (Python's math.erf/erfc).
        let erfs = [
            (0.5, 0.5204998778130465),
            (1.0, 0.8427007929497149),
            (2.0, 0.9953222650189527),
            (3.0, 0.9999779095030014),
            (1.9999, 0.9953201979070294),
        ];
        for (x, want) in erfs {
            assert!(rel(erf(x), want) < 1e-14, "erf({x}) = {}", erf(x));
            assert!(rel(erf(-x), -want) < 1e-14);
        }
        let erfcs = [
            (3.0, 2.2090496998585438e-05),
            (5.0, 1.5374597944280351e-12),
            (10.0, 2.088487583762545e-45),
            (2.0001, 0.0046756686958033394),
        ];
        for (x, want) in erfcs {
            assert!(rel(erfc(x), want) < 1e-13, "erfc({x}) = {}", erfc(x));
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(40.0), 1.0);
        assert_eq!(erfc(-40.0), 2.0);
        assert!(erf(f64::NAN).is_nan());
    }

    #[test]
    fn round_binary_is_nearest_even() {
        // f16: 1 + 2^-11 is a tie between 1 and 1 + 2^-10 → even (1).
        assert_eq!(round_binary(1.0 + 2f64.powi(-11), 11, -14, 65504.0), 1.0);
        // A sticky bit far below breaks the tie upward.
        let x = 1.0 + 2f64.powi(-11) + 2f64.powi(-40);
        assert_eq!(round_binary(x, 11, -14, 65504.0), 1.0 + 2f64.powi(-10));
        // Overflow: 65520 is the tie between 65504 and 65536 → inf; below stays.
        assert_eq!(round_binary(65519.0, 11, -14, 65504.0), 65504.0);
        assert_eq!(round_binary(-65520.0, 11, -14, 65504.0), f64::NEG_INFINITY);
        // Subnormals: the f16 grid below 2^-14 has spacing 2^-24.
        assert_eq!(round_binary(3.0 * 2f64.powi(-25), 11, -14, 65504.0), 2f64.powi(-23));
        assert_eq!(round_binary(2f64.powi(-26), 11, -14, 65504.0), 0.0);
        assert!(round_binary(f64::NAN, 11, -14, 65504.0).is_nan());
    }

    #[test]
    fn round_to_odd_helpers() {
        assert_eq!(f64_to_f32_odd(1.5), 1.5);
        // Inexact: the neighbour with an odd last bit.
        let x = 1.0 + 2f64.powi(-30);
        assert_eq!(f64_to_f32_odd(x).to_bits(), 1f32.to_bits() + 1);
        assert_eq!(f64_to_f32_odd(-x).to_bits(), (-1f32).to_bits() + 1);
        let y = 1.0 + 2f64.powi(-23) + 2f64.powi(-40); // already odd when rounded down
        assert_eq!(f64_to_f32_odd(y).to_bits(), 1f32.to_bits() + 1);
        assert_eq!(int_to_f64_odd(3), 3.0);
        let big = (1i128 << 60) + 1;
        let r = int_to_f64_odd(big);
        assert!(r > (1u64 << 60) as f64 && r.to_bits() & 1 == 1);
        assert_eq!(f64_to_int(DType::U64, 1e30), u64::MAX as i64);
        assert_eq!(f64_to_int(DType::I8, -1e30), -128);
        assert_eq!(f64_to_int(DType::I32, f64::NAN), 0);
    }

    #[test]
    #[allow(clippy::excessive_precision)] // the exact decimal expansions are the point
    fn selu_defaults_are_the_exact_f32_constants() {
        assert_eq!(1.673_263_2f32 as f64, 1.67326319217681884765625);
        assert_eq!(1.050_701f32 as f64, 1.05070102214813232421875);
    }
}
