//! Lowering of the elementwise ops: unary math and activations, broadcasting binary
//! arithmetic, comparisons, logical and bitwise ops, variadic Max/Min/Sum/Mean, Cast,
//! CastLike, Clip, Where, PRelu, Shrink, QuantizeLinear and DequantizeLinear.
//!
//! Every op is one kernel. [`map`] builds it for the broadcasting ops: it loads each
//! operand at the output index under numpy broadcasting and hands the values to a
//! closure that returns the result's value, so most ops are a line. Clip bounds, a
//! scalar Pow exponent and per-tensor quantisation parameters that are compile-time
//! constants become literals (Pow with exponent 0, ±1, 2, ¼, ½, ¾ or 1½ becomes the matching
//! multiply, divide or square root).
//!
//! Numerics follow the reference evaluator (`kiln-ref`), which computes in `f64` and
//! rounds once; kernels compute f16/bf16/8-bit floats in f32, f32 in f32 and f64 in f64:
//! - the activations use forms that stay accurate where the naive formula cancels or
//!   overflows: `log1p` and `expm1` by the classic correction (`log(u)·t/(u−1)` with
//!   `u = 1 + t`, `(u−1)·x/log(u)` with `u = eˣ`), Sigmoid as `select(x ≥ 0, 1, e)/(1 + e)`
//!   with `e = e^{−|x|}`, Softplus as `max(x, 0) + log1p(e^{−|x|})`, Mish as
//!   `x·n/(n + 2)` with `n = eˣ(eˣ + 2)` (= `x·tanh(softplus x)`, 1 above x = 20), tanh-Gelu
//!   as `x/(1 + e^{−2u})` (= `½x(1 + tanh u)`), erf-Gelu as `½x(1 + erf(x/√2))` (as
//!   common runtimes do: below x ≈ −4, where the result is under 1e-4 in magnitude, its
//!   relative error grows, its absolute error stays near 1e-7 in f32);
//! - where f32 arithmetic would not give the reference's result, the kernel computes in
//!   f64: Pow of a float base by an exponent that f32 cannot hold exactly (f64, 32- and
//!   64-bit integers), integer bases with float exponents, the quotient of
//!   QuantizeLinear unless x and the scale are f32-exact and the precision is f32, and
//!   DequantizeLinear where `(x − zero point)·scale` is not exact in f32;
//! - conversions to integers truncate and **saturate** (NaN gives 0) as the reference
//!   does, through an i64 conversion and a clamp; 4-bit integer results wrap;
//! - integer Pow is square-and-multiply over the exponent's bits in the base's width
//!   (`b^e mod 2^w` only depends on `e mod 2^(w−2)` for odd `b` and is 0 for even `b`
//!   once `e ≥ w`, so `w − 2` bits suffice); a negative exponent gives the truncated real
//!   power (1 for base 1, ±1 for base −1, else 0);
//! - integer Div and Mod by zero give 0 (the reference reports an error).

use kiln_ir::attrs as ka;
use kiln_ir::{DType, OpKind, Tensor, TensorType};

use super::{broadcast_index, mean_from_parts, norm_axis, store, LowerError, Lowered, OpCx, Output};
use kiln_flow::kernel::{BinaryOp as B, Expr, ExprId, KernelBuilder, ScalarType as S, UnaryOp as U};

type R<T> = Result<T, LowerError>;

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    use OpKind::*;
    let r = match cx.op.kind {
        Acos => float_unary(cx, U::Acos),
        Acosh => float_unary(cx, U::Acosh),
        Asin => float_unary(cx, U::Asin),
        Asinh => float_unary(cx, U::Asinh),
        Atan => float_unary(cx, U::Atan),
        Atanh => float_unary(cx, U::Atanh),
        Ceil => float_unary(cx, U::Ceil),
        Cos => float_unary(cx, U::Cos),
        Cosh => float_unary(cx, U::Cosh),
        Erf => float_unary(cx, U::Erf),
        Exp => float_unary(cx, U::Exp),
        Floor => float_unary(cx, U::Floor),
        Log => float_unary(cx, U::Log),
        Round => float_unary(cx, U::Round),
        Sin => float_unary(cx, U::Sin),
        Sinh => float_unary(cx, U::Sinh),
        Sqrt => float_unary(cx, U::Sqrt),
        Tan => float_unary(cx, U::Tan),
        Tanh => float_unary(cx, U::Tanh),
        Abs | Neg | Sign | Relu => signed_unary(cx),
        Reciprocal | Sigmoid | Softplus | Softsign | Mish | HardSwish | HardSigmoid | Celu | Elu | Selu | LeakyRelu
        | ThresholdedRelu | Gelu => activation(cx),
        Shrink => shrink(cx),
        IsNaN | IsInf => is_class(cx),
        Add | Sub | Mul | Div => arith(cx),
        Mod => modulo(cx),
        Pow => pow(cx),
        Equal | Greater | GreaterOrEqual | Less | LessOrEqual => compare(cx),
        And | Or | Xor | Not => logical(cx),
        BitwiseAnd | BitwiseOr | BitwiseXor | BitwiseNot => bitwise(cx),
        BitShift => bit_shift(cx),
        Max | Min | Sum | Mean => variadic(cx),
        Where => where_(cx),
        Clip => clip(cx),
        PRelu => prelu(cx),
        Cast | CastLike => cast(cx),
        QuantizeLinear => quantize(cx),
        DequantizeLinear => dequantize(cx),
        _ => return None,
    };
    Some(r)
}

// ---------------------------------------------------------------------------
// Kernel construction shared by every op.
// ---------------------------------------------------------------------------

/// The op's only result type.
fn out_ty<'a>(cx: &OpCx<'a>) -> R<&'a TensorType> {
    match cx.outputs {
        [t] => Ok(t),
        _ => Err(cx.unsupported(format!("{} results, 1 expected", cx.outputs.len()))),
    }
}

/// The kernel of the op's result; kernel input `j` is op operand `operands[j]`. `body`
/// gets the builder and the output index and returns the result's value (stored by
/// [`finish`]). An empty result reads nothing (its loads could not be proved in bounds).
fn kernel<F>(cx: &OpCx<'_>, operands: &[usize], body: F) -> R<Lowered>
where
    F: FnOnce(&mut KernelBuilder, &[ExprId]) -> R<ExprId>,
{
    out_ty(cx)?;
    let step = super::movement::step_with(cx, 0, operands, body, finish)?;
    Ok(Lowered::single(step.kernel, step.operands))
}

/// The N-ary broadcasting map: `f` gets the value of every operand in `operands` at the
/// output index (numpy broadcasting, in each operand's compute type) and returns the
/// result's value.
fn map<F>(cx: &OpCx<'_>, operands: &[usize], f: F) -> R<Lowered>
where
    F: FnOnce(&mut KernelBuilder, &[ExprId]) -> R<ExprId>,
{
    let out = out_ty(cx)?.shape.dims().to_vec();
    let mut dims = Vec::with_capacity(operands.len());
    for &i in operands {
        let d = cx.input_ty(i)?.shape.dims().to_vec();
        let fits = d.len() <= out.len() && d.iter().rev().zip(out.iter().rev()).all(|(&a, &o)| a == 1 || a == o);
        if !fits {
            return Err(cx.unsupported(format!("operand {i} of shape {d:?} does not broadcast to {out:?}")));
        }
        dims.push(d);
    }
    kernel(cx, operands, |b, index| {
        let vals: Vec<ExprId> = dims
            .iter()
            .enumerate()
            .map(|(j, d)| {
                let ix = broadcast_index(b, d, index);
                b.load(j, ix)
            })
            .collect();
        f(b, &vals)
    })
}

/// The stored value of `v`: a conversion to the output dtype is stored as it is,
/// integer results for i4/u4 wrap to 4 bits (as the reference's integer arithmetic
/// does; the conversion itself would saturate), anything else rounds through [`store`].
fn finish(b: &mut KernelBuilder, v: ExprId) -> ExprId {
    let d = b.output().dtype;
    if matches!(b.node(v).map(|n| &n.expr), Some(Expr::Cast { to, .. }) if *to == d) {
        return v;
    }
    if matches!(d, DType::I4 | DType::U4) && b.ty(v).is_int() {
        let w = wrap4(b, v, d);
        return b.cast(w, d, true);
    }
    store(b, v)
}

/// Integer `v` wrapped to the values of `d` (i4 or u4), as an i64.
fn wrap4(b: &mut KernelBuilder, v: ExprId, d: DType) -> ExprId {
    let t = b.convert(v, S::I64);
    let m = b.int(S::I64, 15);
    let low = b.binary(B::And, t, m);
    if d == DType::I4 {
        let h = b.int(S::I64, 8);
        let x = b.binary(B::Xor, low, h);
        b.sub(x, h)
    } else {
        low
    }
}

/// The value of a one-element tensor as bits of its compute type.
fn scalar_bits(t: &Tensor) -> Option<(S, u64)> {
    if t.numel() != 1 {
        return None;
    }
    let ct = S::of_storage(t.dtype());
    let bits = if ct.is_float() {
        ct.bits_of_f64(*t.to_f64_vec().first()?)
    } else {
        ct.bits_of_i64(*t.to_i64_vec().ok()?.first()?)
    };
    Some((ct, bits))
}

/// A one-element operand: a literal when constant, else a load of input `j`.
#[derive(Clone, Copy)]
enum Scalar {
    Lit(S, u64),
    Input(usize, usize),
}

impl Scalar {
    fn value(self, b: &mut KernelBuilder) -> ExprId {
        match self {
            Scalar::Lit(t, bits) => b.constant(t, bits),
            Scalar::Input(j, rank) => {
                let ix = vec![b.index(0); rank];
                b.load(j, ix)
            }
        }
    }
}

fn dtype(cx: &OpCx<'_>, i: usize) -> R<DType> {
    Ok(cx.input_ty(i)?.dtype)
}

/// The dtype shared by operands `ops`.
fn same_dtype(cx: &OpCx<'_>, ops: impl IntoIterator<Item = usize>) -> R<DType> {
    let mut d = None;
    for i in ops {
        let t = dtype(cx, i)?;
        match d {
            None => d = Some(t),
            Some(u) if u != t => return Err(cx.unsupported(format!("operand dtypes differ: {u} and {t}"))),
            Some(_) => {}
        }
    }
    d.ok_or_else(|| cx.unsupported("no operands"))
}

fn need(cx: &OpCx<'_>, d: DType, ok: bool, what: &str) -> R<()> {
    if ok {
        Ok(())
    } else {
        Err(cx.unsupported(format!("{d} operands ({what} required)")))
    }
}

/// The four 8-bit float types ONNX's `saturate` applies to (the others always saturate).
fn is_f8(d: DType) -> bool {
    matches!(d, DType::F8E4M3FN | DType::F8E4M3FNUZ | DType::F8E5M2 | DType::F8E5M2FNUZ)
}

/// Smallest and largest value of integer dtype `d`.
fn int_range(d: DType) -> (i64, i64) {
    match d {
        DType::I4 => (-8, 7),
        DType::U4 => (0, 15),
        DType::Bool => (0, 1),
        _ => {
            let (lo, hi) = S::of_storage(d).int_range();
            (lo as i64, hi.min(i64::MAX as i128) as i64)
        }
    }
}

// ---------------------------------------------------------------------------
// Scalar building blocks.
// ---------------------------------------------------------------------------

fn lit(b: &mut KernelBuilder, like: ExprId, x: f64) -> ExprId {
    let t = b.ty(like);
    b.float(t, x)
}

fn sel(b: &mut KernelBuilder, cond: ExprId, then: ExprId, otherwise: ExprId) -> ExprId {
    b.select(cond, then, otherwise)
}

/// `min(max(t, 0), 1)` (NaN stays NaN).
fn clamp01(b: &mut KernelBuilder, t: ExprId) -> ExprId {
    let (z, one) = (lit(b, t, 0.0), lit(b, t, 1.0));
    let m = b.binary(B::Max, t, z);
    b.binary(B::Min, m, one)
}

/// `ln(1 + t)` for `t ≥ 0`, accurate for small `t`: `log(u)·t/(u − 1)` with `u = 1 + t`
/// (the rounding error of `u` cancels), `t` itself where `u` rounds to 1.
fn log1p(b: &mut KernelBuilder, t: ExprId) -> ExprId {
    let one = lit(b, t, 1.0);
    let zero = lit(b, t, 0.0);
    let u = b.add(one, t);
    let d = b.sub(u, one);
    let l = b.unary(U::Log, u);
    let lt = b.mul(l, t);
    let r = b.div(lt, d);
    let tiny = b.binary(B::Eq, d, zero);
    sel(b, tiny, t, r)
}

/// `eˣ − 1`, accurate for small `x`: `(u − 1)·(x/log u)` with `u = eˣ`; `x` where `u`
/// rounds to 1, −1 where it rounds to 0, `u` where it overflows.
fn expm1(b: &mut KernelBuilder, x: ExprId) -> ExprId {
    let one = lit(b, x, 1.0);
    let m1 = lit(b, x, -1.0);
    let inf = lit(b, x, f64::INFINITY);
    let u = b.unary(U::Exp, x);
    let d = b.sub(u, one);
    let l = b.unary(U::Log, u);
    let q = b.div(x, l);
    let r = b.mul(d, q);
    let big = b.binary(B::Eq, u, inf);
    let r = sel(b, big, u, r);
    let low = b.binary(B::Eq, d, m1);
    let r = sel(b, low, m1, r);
    let tiny = b.binary(B::Eq, u, one);
    sel(b, tiny, x, r)
}

/// The logistic function.
fn sigmoid(b: &mut KernelBuilder, x: ExprId) -> ExprId {
    let one = lit(b, x, 1.0);
    let zero = lit(b, x, 0.0);
    logistic(b, x, zero, one)
}

/// The logistic function of `x`, given `x`'s type's 0 and 1:
/// `select(x ≥ 0, 1, e)/(1 + e)` with `e = e^{−|x|}`, which overflows for no `x`.
pub(super) fn logistic(b: &mut KernelBuilder, x: ExprId, zero: ExprId, one: ExprId) -> ExprId {
    let a = b.unary(U::Abs, x);
    let na = b.unary(U::Neg, a);
    let e = b.unary(U::Exp, na);
    let pos = b.binary(B::Ge, x, zero);
    let num = sel(b, pos, one, e);
    let den = b.add(one, e);
    b.div(num, den)
}

/// `ln(1 + eˣ)` as `max(x, 0) + log1p(e^{−|x|})`.
fn softplus(b: &mut KernelBuilder, x: ExprId) -> ExprId {
    let zero = lit(b, x, 0.0);
    let a = b.unary(U::Abs, x);
    let na = b.unary(U::Neg, a);
    let e = b.unary(U::Exp, na);
    let l = log1p(b, e);
    let m = b.binary(B::Max, x, zero);
    b.add(m, l)
}

/// Float `v` converted to integer dtype `d` as the reference does: truncated toward
/// zero and saturated to `d`'s range, NaN giving 0.
fn float_to_int(b: &mut KernelBuilder, v: ExprId, d: DType) -> ExprId {
    match d {
        DType::Bool => b.cast(v, d, true),
        DType::I64 => b.cast(v, d, true),
        DType::U64 => {
            // The conversion saturates non-negative values; negative ones clamp to 0.
            let zero = lit(b, v, 0.0);
            let neg = b.binary(B::Lt, v, zero);
            let c = b.cast(v, d, true);
            let z = b.int(S::U64, 0);
            sel(b, neg, z, c)
        }
        // f32 to i32: the same values without i64 lanes (a vector form on eight lanes,
        // `cpu::vops`' `f32_to_i32`): from 2^31 on (+inf too) the largest i32; below,
        // the value raised to −2^31 (NaN stays NaN) and converted, which truncates and
        // gives NaN 0.
        DType::I32 if b.ty(v) == S::F32 => {
            let top = lit(b, v, 2147483648.0);
            let over = b.binary(B::Ge, v, top);
            let bottom = lit(b, v, -2147483648.0);
            let m = b.binary(B::Max, v, bottom);
            let c = b.cast(m, d, true);
            let h = b.int(S::I32, i32::MAX as i64);
            sel(b, over, h, c)
        }
        _ => {
            let (lo, hi) = int_range(d);
            let t = b.cast(v, DType::I64, true);
            let l = b.int(S::I64, lo);
            let h = b.int(S::I64, hi);
            let t = b.binary(B::Max, t, l);
            let t = b.binary(B::Min, t, h);
            b.cast(t, d, true)
        }
    }
}

/// `v` (of dtype `from`, in its compute type) converted to dtype `to` with the
/// reference's Cast rules.
fn convert_dtype(b: &mut KernelBuilder, v: ExprId, from: DType, to: DType, saturate: bool) -> ExprId {
    let sat = saturate || !is_f8(to);
    if from.is_float() {
        return if to.is_float() || to == DType::Bool { b.cast(v, to, sat) } else { float_to_int(b, v, to) };
    }
    // Integer or bool source.
    match to {
        DType::I4 | DType::U4 => {
            let w = wrap4(b, v, to);
            b.cast(w, to, true)
        }
        // i32/u32/i64/u64 are not exact in f32: one rounding from f64 (exact up to 2^53).
        DType::F16 | DType::BF16 if from.bits() > 16 => {
            let w = b.convert(v, S::F64);
            b.cast(w, to, sat)
        }
        _ => b.cast(v, to, sat),
    }
}

// ---------------------------------------------------------------------------
// Unary ops and activations.
// ---------------------------------------------------------------------------

fn float_unary(cx: &OpCx<'_>, op: U) -> R<Lowered> {
    let d = dtype(cx, 0)?;
    need(cx, d, d.is_float(), "a float dtype")?;
    map(cx, &[0], |b, v| Ok(b.unary(op, v[0])))
}

/// Abs, Neg, Sign, Relu: floats and integers.
fn signed_unary(cx: &OpCx<'_>) -> R<Lowered> {
    let d = dtype(cx, 0)?;
    need(cx, d, d.is_float() || d.is_int(), "a numeric dtype")?;
    let kind = cx.op.kind;
    let unsigned = d.is_unsigned_int();
    map(cx, &[0], |b, v| {
        let x = v[0];
        let t = b.ty(x);
        let zero = b.int(t, 0);
        Ok(match kind {
            OpKind::Abs if unsigned => x,
            OpKind::Abs => b.unary(U::Abs, x),
            OpKind::Neg => b.unary(U::Neg, x),
            OpKind::Sign => {
                let one = b.int(t, 1);
                if unsigned {
                    let nz = b.binary(B::Ne, x, zero);
                    sel(b, nz, one, zero)
                } else {
                    let m1 = b.int(t, -1);
                    // ±0 and NaN: x·0 keeps the zero's sign and the NaN.
                    let rest = if t.is_float() { b.mul(x, zero) } else { zero };
                    let neg = b.binary(B::Lt, x, zero);
                    let r = sel(b, neg, m1, rest);
                    let pos = b.binary(B::Gt, x, zero);
                    sel(b, pos, one, r)
                }
            }
            _ if unsigned => x,
            _ => {
                let neg = b.binary(B::Lt, x, zero);
                sel(b, neg, zero, x)
            }
        })
    })
}

/// Float activations (and Reciprocal).
fn activation(cx: &OpCx<'_>) -> R<Lowered> {
    use OpKind::*;
    let d = dtype(cx, 0)?;
    need(cx, d, d.is_float(), "a float dtype")?;
    let kind = cx.op.kind;
    // Attributes (f32 values, as the reference reads them).
    let (a, g) = match kind {
        Celu | Elu | ThresholdedRelu => (cx.attrs::<ka::AlphaOneAttrs>()?.alpha as f64, 0.0),
        Selu => {
            let sa = cx.attrs::<ka::SeluAttrs>()?;
            (sa.alpha as f64, sa.gamma as f64)
        }
        HardSigmoid => {
            let ha = cx.attrs::<ka::HardSigmoidAttrs>()?;
            (ha.alpha as f64, ha.beta as f64)
        }
        LeakyRelu => (cx.attrs::<ka::LeakyReluAttrs>()?.alpha as f64, 0.0),
        _ => (0.0, 0.0),
    };
    let tanh_gelu = match kind {
        Gelu => cx.attrs::<ka::GeluAttrs>()?.approximate == ka::GeluApproximate::Tanh,
        _ => false,
    };
    map(cx, &[0], |b, v| {
        let x = v[0];
        let one = lit(b, x, 1.0);
        let zero = lit(b, x, 0.0);
        Ok(match kind {
            Reciprocal => b.div(one, x),
            Sigmoid => sigmoid(b, x),
            Softplus => softplus(b, x),
            Softsign => {
                let ax = b.unary(U::Abs, x);
                let den = b.add(one, ax);
                b.div(x, den)
            }
            Mish => {
                // tanh(ln(1 + e)) = n/(n + 2) with n = e(e + 2); exactly 1 in f32 and f64 above 20.
                let e = b.unary(U::Exp, x);
                let two = lit(b, x, 2.0);
                let e2 = b.add(e, two);
                let n = b.mul(e, e2);
                let n2 = b.add(n, two);
                let t = b.div(n, n2);
                let twenty = lit(b, x, 20.0);
                let big = b.binary(B::Gt, x, twenty);
                let t = sel(b, big, one, t);
                b.mul(x, t)
            }
            HardSwish => {
                let six = lit(b, x, 6.0);
                let half = lit(b, x, 0.5);
                let q = b.div(x, six);
                let t = b.add(q, half);
                let t = clamp01(b, t);
                b.mul(x, t)
            }
            HardSigmoid => {
                let (ca, cb) = (lit(b, x, a), lit(b, x, g));
                let t = b.mul(ca, x);
                let t = b.add(t, cb);
                clamp01(b, t)
            }
            Celu => {
                let ca = lit(b, x, a);
                let q = b.div(x, ca);
                let e = expm1(b, q);
                let y = b.mul(ca, e);
                let neg = b.binary(B::Lt, y, zero);
                let lo = sel(b, neg, y, zero);
                let hi = b.binary(B::Max, x, zero);
                b.add(hi, lo)
            }
            Elu => {
                let ca = lit(b, x, a);
                let e = expm1(b, x);
                let y = b.mul(ca, e);
                let neg = b.binary(B::Lt, x, zero);
                sel(b, neg, y, x)
            }
            Selu => {
                let cg = lit(b, x, g);
                let cga = lit(b, x, g * a);
                let e = expm1(b, x);
                let y = b.mul(cga, e);
                let p = b.mul(cg, x);
                let pos = b.binary(B::Gt, x, zero);
                sel(b, pos, p, y)
            }
            LeakyRelu => {
                let ca = lit(b, x, a);
                let y = b.mul(ca, x);
                let neg = b.binary(B::Lt, x, zero);
                sel(b, neg, y, x)
            }
            ThresholdedRelu => {
                let ca = lit(b, x, a);
                let above = b.binary(B::Gt, x, ca);
                sel(b, above, x, zero)
            }
            Gelu if tanh_gelu => {
                // ½x(1 + tanh u) = x/(1 + e^{−2u}), u = √(2/π)(x + 0.044715x³).
                let c = lit(b, x, (2.0 / std::f64::consts::PI).sqrt());
                let k = lit(b, x, 0.044715);
                let kx = b.mul(k, x);
                let kx2 = b.mul(kx, x);
                let kx3 = b.mul(kx2, x);
                let inner = b.add(x, kx3);
                let u = b.mul(c, inner);
                let m2 = lit(b, x, -2.0);
                let t = b.mul(m2, u);
                let e = b.unary(U::Exp, t);
                let den = b.add(one, e);
                b.div(x, den)
            }
            _ => {
                // Gelu, approximate = none: ½x(1 + erf(x/√2)).
                let r = lit(b, x, std::f64::consts::FRAC_1_SQRT_2);
                let half = lit(b, x, 0.5);
                let s = b.mul(x, r);
                let e = b.unary(U::Erf, s);
                let t = b.add(one, e);
                let h = b.mul(half, x);
                b.mul(h, t)
            }
        })
    })
}

/// Shrink: floats in their compute type, integers through f64 with a saturating
/// conversion back (as the reference).
fn shrink(cx: &OpCx<'_>) -> R<Lowered> {
    let d = dtype(cx, 0)?;
    need(cx, d, d.is_float() || d.is_int(), "a numeric dtype")?;
    let sa = cx.attrs::<ka::ShrinkAttrs>()?;
    let (bias, lambd) = (sa.bias as f64, sa.lambd as f64);
    map(cx, &[0], |b, v| {
        let x = if d.is_float() { v[0] } else { b.convert(v[0], S::F64) };
        let (l, nl, bi, zero) = (lit(b, x, lambd), lit(b, x, -lambd), lit(b, x, bias), lit(b, x, 0.0));
        let below = b.binary(B::Lt, x, nl);
        let above = b.binary(B::Gt, x, l);
        let plus = b.add(x, bi);
        let minus = b.sub(x, bi);
        let r = sel(b, above, minus, zero);
        let r = sel(b, below, plus, r);
        Ok(if d.is_float() { r } else { float_to_int(b, r, d) })
    })
}

/// IsNaN, IsInf (integer operands are never NaN or infinite).
fn is_class(cx: &OpCx<'_>) -> R<Lowered> {
    let d = dtype(cx, 0)?;
    let nan = cx.op.kind == OpKind::IsNaN;
    let (neg, pos) = if nan {
        (true, true)
    } else {
        let ia = cx.attrs::<ka::IsInfAttrs>()?;
        (ia.detect_negative, ia.detect_positive)
    };
    if !d.is_float() || (!nan && !neg && !pos) {
        return kernel(cx, &[], |b, _| Ok(b.int(S::Bool, 0)));
    }
    map(cx, &[0], |b, v| {
        let x = v[0];
        if nan {
            return Ok(b.unary(U::IsNan, x));
        }
        let (pi, ni) = (lit(b, x, f64::INFINITY), lit(b, x, f64::NEG_INFINITY));
        let p = b.binary(B::Eq, x, pi);
        let n = b.binary(B::Eq, x, ni);
        Ok(match (pos, neg) {
            (true, true) => b.binary(B::Or, p, n),
            (true, false) => p,
            _ => n,
        })
    })
}

// ---------------------------------------------------------------------------
// Binary ops.
// ---------------------------------------------------------------------------

/// A binary op that is one kernel operation on its two (broadcast) operands: arithmetic,
/// comparisons, logical and bitwise ops (the dtypes checked by the caller).
fn pointwise(cx: &OpCx<'_>) -> R<Lowered> {
    use OpKind::*;
    let op = match cx.op.kind {
        Add => B::Add,
        Sub => B::Sub,
        Mul => B::Mul,
        Div => B::Div,
        Equal => B::Eq,
        Greater => B::Gt,
        GreaterOrEqual => B::Ge,
        Less => B::Lt,
        LessOrEqual => B::Le,
        And | BitwiseAnd => B::And,
        Or | BitwiseOr => B::Or,
        Xor | BitwiseXor => B::Xor,
        _ => return Err(cx.unsupported("not a pointwise binary op")),
    };
    map(cx, &[0, 1], |b, v| Ok(b.binary(op, v[0], v[1])))
}

fn arith(cx: &OpCx<'_>) -> R<Lowered> {
    let d = same_dtype(cx, [0, 1])?;
    need(cx, d, d.is_float() || d.is_int(), "a numeric dtype")?;
    pointwise(cx)
}

/// Mod: `fmod=1` is the truncated remainder (C's `fmod`); `fmod=0` takes the divisor's
/// sign (numpy's `mod`, for floats too, as the reference).
fn modulo(cx: &OpCx<'_>) -> R<Lowered> {
    let d = same_dtype(cx, [0, 1])?;
    need(cx, d, d.is_float() || d.is_int(), "a numeric dtype")?;
    let fmod = cx.attrs::<ka::ModAttrs>()?.fmod;
    map(cx, &[0, 1], |b, v| {
        let (x, y) = (v[0], v[1]);
        let r = b.binary(B::Rem, x, y);
        if fmod || d.is_unsigned_int() {
            return Ok(r);
        }
        let t = b.ty(r);
        let zero = b.int(t, 0);
        let nz = b.binary(B::Ne, r, zero);
        let rn = b.binary(B::Lt, r, zero);
        let yn = b.binary(B::Lt, y, zero);
        let differ = b.binary(B::Xor, rn, yn);
        let fix = b.binary(B::And, nz, differ);
        let s = b.add(r, y);
        Ok(sel(b, fix, s, r))
    })
}

/// Pow(X, Y): the result has X's dtype; Y may be any numeric dtype.
fn pow(cx: &OpCx<'_>) -> R<Lowered> {
    let (bd, ed) = (dtype(cx, 0)?, dtype(cx, 1)?);
    need(cx, bd, bd.is_float() || bd.is_int(), "a numeric base")?;
    need(cx, ed, ed.is_float() || ed.is_int(), "a numeric exponent")?;
    let c = cx.input(1).and_then(|o| o.value).filter(|t| t.numel() == 1);
    if bd.is_int() && ed.is_int() {
        let signed = bd.is_signed_int();
        if let Some(e) = c.and_then(|t| t.to_i64_vec().ok()).and_then(|v| v.first().copied()) {
            let neg = ed.is_signed_int() && e < 0;
            return map(cx, &[0], |b, v| Ok(ipow_const(b, v[0], e as u64, neg, signed)));
        }
        return map(cx, &[0, 1], |b, v| Ok(ipow(b, v[0], v[1], signed, ed)));
    }
    if bd.is_int() {
        // f64 as the reference, then a saturating conversion.
        return map(cx, &[0, 1], |b, v| {
            let x = b.convert(v[0], S::F64);
            let e = b.convert(v[1], S::F64);
            let p = b.binary(B::Pow, x, e);
            Ok(float_to_int(b, p, bd))
        });
    }
    let ct = S::of_storage(bd);
    if let Some(e) = c.and_then(|t| t.to_f64_vec().first().copied()) {
        return map(cx, &[0], |b, v| {
            let x = v[0];
            Ok(match super::pow_by_constant(b, x, e) {
                Some(r) => r,
                None => {
                    let exact = ct == S::F64 || (e as f32) as f64 == e;
                    let x = if exact { x } else { b.convert(x, S::F64) };
                    let ce = lit(b, x, e);
                    b.binary(B::Pow, x, ce)
                }
            })
        });
    }
    // Exponents f32 cannot hold exactly (whose parity and size matter) compute in f64.
    let wide = ct == S::F64 || ed == DType::F64 || (ed.is_int() && ed.bits() > 16);
    let t = if wide { S::F64 } else { S::F32 };
    map(cx, &[0, 1], |b, v| {
        let x = b.convert(v[0], t);
        let e = b.convert(v[1], t);
        Ok(b.binary(B::Pow, x, e))
    })
}

/// `base^exp` with wrapping arithmetic in the base's type; `exp` has dtype `ed`.
fn ipow(b: &mut KernelBuilder, base: ExprId, exp: ExprId, base_signed: bool, ed: DType) -> ExprId {
    let t = b.ty(base);
    let l = t.bits() - 2;
    let exp_signed = ed.is_signed_int();
    let mag = ed.bits() as u32 - exp_signed as u32;
    let e = b.convert(exp, S::I64);
    let zero64 = b.int(S::I64, 0);
    let mut r = b.int(t, 1);
    let mut p = base;
    let n = l.min(mag);
    for k in 0..n {
        let mask = b.int(S::I64, 1i64 << k);
        let bit = b.binary(B::And, e, mask);
        let set = b.binary(B::Ne, bit, zero64);
        let rp = b.mul(r, p);
        r = sel(b, set, rp, r);
        if k + 1 < n {
            p = b.mul(p, p);
        }
    }
    if mag > l {
        // e ≥ 2^l: even bases give 0, odd ones base^(e mod 2^l).
        let eu = b.convert(exp, S::U64);
        let sh = b.int(S::U64, l as i64);
        let hi = b.binary(B::Shr, eu, sh);
        let z = b.int(S::U64, 0);
        let high = b.binary(B::Ne, hi, z);
        r = zero_if_even(b, base, high, r);
    }
    if exp_signed {
        let neg = b.binary(B::Lt, e, zero64);
        let odd_e = {
            let one = b.int(S::I64, 1);
            let lsb = b.binary(B::And, e, one);
            b.binary(B::Ne, lsb, zero64)
        };
        let special = negative_power(b, base, base_signed, odd_e);
        r = sel(b, neg, special, r);
    }
    r
}

/// `r`, or 0 where `cond` holds and `base` is even.
fn zero_if_even(b: &mut KernelBuilder, base: ExprId, cond: ExprId, r: ExprId) -> ExprId {
    let t = b.ty(base);
    let (one, zero) = (b.int(t, 1), b.int(t, 0));
    let lsb = b.binary(B::And, base, one);
    let even = b.binary(B::Eq, lsb, zero);
    let kill = b.binary(B::And, cond, even);
    sel(b, kill, zero, r)
}

/// `base^e` for a negative `e` (truncated): 1 for base 1, ±1 for base −1, else 0.
fn negative_power(b: &mut KernelBuilder, base: ExprId, base_signed: bool, odd_e: ExprId) -> ExprId {
    let t = b.ty(base);
    let (one, zero) = (b.int(t, 1), b.int(t, 0));
    let mut r = zero;
    if base_signed {
        let m1 = b.int(t, -1);
        let is_m1 = b.binary(B::Eq, base, m1);
        let pm = sel(b, odd_e, m1, one);
        r = sel(b, is_m1, pm, r);
    }
    let is1 = b.binary(B::Eq, base, one);
    sel(b, is1, one, r)
}

/// `base^e` for a constant exponent (`e` as u64 bits; `neg`: a negative signed one).
fn ipow_const(b: &mut KernelBuilder, base: ExprId, e: u64, neg: bool, base_signed: bool) -> ExprId {
    let t = b.ty(base);
    if neg {
        let odd = b.int(S::Bool, (e & 1) as i64);
        return negative_power(b, base, base_signed, odd);
    }
    let l = t.bits() - 2;
    let low = e & ((1u64 << l) - 1);
    let mut r: Option<ExprId> = None;
    let mut p = base;
    let mut rest = low;
    while rest != 0 {
        if rest & 1 == 1 {
            r = Some(match r {
                Some(r) => b.mul(r, p),
                None => p,
            });
        }
        rest >>= 1;
        if rest != 0 {
            p = b.mul(p, p);
        }
    }
    let r = match r {
        Some(r) => r,
        None => b.int(t, 1),
    };
    if e >> l != 0 {
        let yes = b.int(S::Bool, 1);
        return zero_if_even(b, base, yes, r);
    }
    r
}

fn compare(cx: &OpCx<'_>) -> R<Lowered> {
    same_dtype(cx, [0, 1])?;
    pointwise(cx)
}

/// And, Or, Xor, Not on bool.
fn logical(cx: &OpCx<'_>) -> R<Lowered> {
    if cx.op.kind == OpKind::Not {
        let d = dtype(cx, 0)?;
        need(cx, d, d == DType::Bool, "bool")?;
        return map(cx, &[0], |b, v| Ok(b.unary(U::Not, v[0])));
    }
    let d = same_dtype(cx, [0, 1])?;
    need(cx, d, d == DType::Bool, "bool")?;
    pointwise(cx)
}

/// BitwiseAnd, BitwiseOr, BitwiseXor, BitwiseNot on integers.
fn bitwise(cx: &OpCx<'_>) -> R<Lowered> {
    if cx.op.kind == OpKind::BitwiseNot {
        let d = dtype(cx, 0)?;
        need(cx, d, d.is_int(), "an integer dtype")?;
        return map(cx, &[0], |b, v| Ok(b.unary(U::Not, v[0])));
    }
    let d = same_dtype(cx, [0, 1])?;
    need(cx, d, d.is_int(), "an integer dtype")?;
    pointwise(cx)
}

/// BitShift on unsigned integers; amounts of the width or more give 0.
fn bit_shift(cx: &OpCx<'_>) -> R<Lowered> {
    let d = same_dtype(cx, [0, 1])?;
    need(cx, d, d.is_unsigned_int(), "an unsigned dtype")?;
    let op = match cx.attrs::<ka::BitShiftAttrs>()?.direction {
        ka::ShiftDirection::Left => B::Shl,
        ka::ShiftDirection::Right => B::Shr,
    };
    map(cx, &[0, 1], |b, v| Ok(b.binary(op, v[0], v[1])))
}

/// PRelu: `x < 0 ? slope·x : x`, the slope broadcast to x.
fn prelu(cx: &OpCx<'_>) -> R<Lowered> {
    let d = same_dtype(cx, [0, 1])?;
    need(cx, d, d.is_float() || d.is_int(), "a numeric dtype")?;
    if cx.input_ty(0)?.shape != out_ty(cx)?.shape {
        return Err(cx.unsupported("the result must have X's shape"));
    }
    if d.is_unsigned_int() {
        return map(cx, &[0], |_, v| Ok(v[0]));
    }
    map(cx, &[0, 1], |b, v| {
        let (x, s) = (v[0], v[1]);
        let t = b.ty(x);
        let zero = b.int(t, 0);
        let neg = b.binary(B::Lt, x, zero);
        let y = b.mul(s, x);
        Ok(sel(b, neg, y, x))
    })
}

// ---------------------------------------------------------------------------
// Variadic ops, Where, Clip.
// ---------------------------------------------------------------------------

/// Max, Min, Sum, Mean over any number of broadcast operands, folded left to right.
fn variadic(cx: &OpCx<'_>) -> R<Lowered> {
    use OpKind::*;
    let n = cx.inputs.len();
    if n == 0 {
        return Err(cx.unsupported("needs at least one operand"));
    }
    let d = same_dtype(cx, 0..n)?;
    let kind = cx.op.kind;
    let minmax = matches!(kind, Max | Min);
    need(cx, d, d.is_float() || d.is_int() || (minmax && d == DType::Bool), "a numeric dtype")?;
    let operands: Vec<usize> = (0..n).collect();
    map(cx, &operands, |b, v| {
        if kind == Mean && !d.is_float() {
            return Ok(int_mean(b, v, d));
        }
        let op = match kind {
            Max => B::Max,
            Min => B::Min,
            _ => B::Add,
        };
        let mut acc = v[0];
        for &x in &v[1..] {
            acc = b.binary(op, acc, x);
        }
        if kind == Mean {
            let k = lit(b, acc, n as f64);
            acc = b.div(acc, k);
        }
        Ok(acc)
    })
}

/// The truncated quotient of the exact sum of `v` by its length (integer Mean).
fn int_mean(b: &mut KernelBuilder, v: &[ExprId], d: DType) -> ExprId {
    let t = b.ty(v[0]);
    let n = v.len() as i64;
    if t.bits() < 64 {
        // Exact in i64 (the sum of fewer than 2^31 values of at most 32 bits).
        let mut acc = b.convert(v[0], S::I64);
        for &x in &v[1..] {
            let w = b.convert(x, S::I64);
            acc = b.add(acc, w);
        }
        let k = b.int(S::I64, n);
        return b.div(acc, k);
    }
    // 64-bit: sum = n·Q + R with Q = Σ xᵢ/n and R = Σ xᵢ%n (no overflow).
    let k = b.int(t, n);
    let (mut q, mut r) = (b.div(v[0], k), b.binary(B::Rem, v[0], k));
    for &x in &v[1..] {
        let (qx, rx) = (b.div(x, k), b.binary(B::Rem, x, k));
        q = b.add(q, qx);
        r = b.add(r, rx);
    }
    mean_from_parts(b, q, r, k, d.is_signed_int())
}

fn where_(cx: &OpCx<'_>) -> R<Lowered> {
    let c = dtype(cx, 0)?;
    need(cx, c, c == DType::Bool, "a bool condition")?;
    same_dtype(cx, [1, 2])?;
    map(cx, &[0, 1, 2], |b, v| Ok(sel(b, v[0], v[1], v[2])))
}

/// Clip(input, min?, max?): `max` applied after `min`, NaN kept; an absent or empty bound
/// is no bound; constant bounds are literals.
fn clip(cx: &OpCx<'_>) -> R<Lowered> {
    let d = dtype(cx, 0)?;
    need(cx, d, d.is_float() || d.is_int(), "a numeric dtype")?;
    if cx.input_ty(0)?.shape != out_ty(cx)?.shape {
        return Err(cx.unsupported("the result must have the input's shape"));
    }
    let mut operands = vec![0];
    let mut bounds = [None, None];
    for (k, i) in [1usize, 2].into_iter().enumerate() {
        let Some(o) = cx.input(i) else { continue };
        let n = o.ty.shape.numel();
        if n == 0 {
            continue;
        }
        if n != 1 || o.ty.dtype != d {
            return Err(cx.unsupported(format!("bound {i} must be a {d} scalar, got {}", o.ty)));
        }
        bounds[k] = Some(match o.value.and_then(scalar_bits) {
            Some((t, bits)) => Scalar::Lit(t, bits),
            None => {
                operands.push(i);
                Scalar::Input(operands.len() - 1, o.ty.shape.rank())
            }
        });
    }
    let xdims = cx.input_ty(0)?.shape.dims().to_vec();
    kernel(cx, &operands, |b, index| {
        let ix = broadcast_index(b, &xdims, index);
        let mut x = b.load(0, ix);
        if let Some(lo) = bounds[0] {
            let lo = lo.value(b);
            let below = b.binary(B::Lt, x, lo);
            x = sel(b, below, lo, x);
        }
        if let Some(hi) = bounds[1] {
            let hi = hi.value(b);
            let above = b.binary(B::Gt, x, hi);
            x = sel(b, above, hi, x);
        }
        Ok(x)
    })
}

// ---------------------------------------------------------------------------
// Cast, CastLike.
// ---------------------------------------------------------------------------

fn cast(cx: &OpCx<'_>) -> R<Lowered> {
    let s = dtype(cx, 0)?;
    let out = out_ty(cx)?;
    let d = out.dtype;
    let (saturate, mode) = if cx.op.kind == OpKind::Cast {
        let ca = cx.attrs::<ka::CastAttrs>()?;
        if ca.to != d {
            return Err(cx.unsupported(format!("`to` = {} does not name the result dtype {d}", ca.to)));
        }
        (ca.saturate, ca.round_mode)
    } else {
        let ca = cx.attrs::<ka::CastLikeAttrs>()?;
        (ca.saturate, ca.round_mode)
    };
    if cx.input_ty(0)?.shape != out.shape {
        return Err(cx.unsupported("the result must have the input's shape"));
    }
    if s == d {
        return Ok(Lowered { steps: Vec::new(), outputs: vec![Output::Alias(0)] });
    }
    if d == DType::F8E8M0FNU && mode != ka::E8M0RoundMode::Nearest {
        return map(cx, &[0], |b, v| Ok(e8m0_directed(b, v[0], s, mode == ka::E8M0RoundMode::Up)));
    }
    map(cx, &[0], |b, v| Ok(convert_dtype(b, v[0], s, d, saturate)))
}

/// `v` (of dtype `from`) cast to `f8E8M0FNU` rounding up (`up`) or down to a power of two.
/// The kernel cast rounds to the nearer power of two `p`, one of the two around the value
/// `x`; for `up`, `p < x` means the other one, `2p`, and for `down`, `p > x` means `p/2`.
/// The comparison is exact: in the float source's compute type (`p` is exact in f32 and
/// f64), and for an integer source in 64-bit integers, `p` truncated with saturation (a
/// `p` at or past 2^63 or 2^64 saturates above every `x`, which is right for `up`; `down`
/// also requires `p` below that bound; a fraction truncates to 0, which only a zero or
/// negative `x` meets, whose code is 0 either way). Past the ends the second cast does the
/// clamping: `2p` overflows to +∞ (→ the largest code) and `p/2` below the smallest value
/// gives the smallest code, as `kiln_ir::lowp::encode_e8m0` does; NaN stays NaN.
fn e8m0_directed(b: &mut KernelBuilder, v: ExprId, from: DType, up: bool) -> ExprId {
    let p = b.cast(v, DType::F8E8M0FNU, true);
    let keep = if from.is_float() {
        let pt = b.convert(p, b.ty(v));
        b.binary(if up { B::Ge } else { B::Le }, pt, v)
    } else {
        let wide = if from.is_unsigned_int() { S::U64 } else { S::I64 };
        let x = b.convert(v, wide);
        let pw = b.convert(p, wide);
        if up {
            b.binary(B::Ge, pw, x)
        } else {
            let le = b.binary(B::Le, pw, x);
            let bound = b
                .float(S::F32, if wide == S::U64 { 18_446_744_073_709_551_616.0 } else { 9_223_372_036_854_775_808.0 });
            let below = b.binary(B::Lt, p, bound);
            b.binary(B::And, le, below)
        }
    };
    let f = b.float(S::F32, if up { 2.0 } else { 0.5 });
    let q = b.mul(p, f);
    let r = b.select(keep, p, q);
    b.cast(r, DType::F8E8M0FNU, true)
}

// ---------------------------------------------------------------------------
// QuantizeLinear, DequantizeLinear.
// ---------------------------------------------------------------------------

/// How scales and zero points map onto x.
#[derive(Clone, Copy)]
enum Layout {
    /// One pair for the whole tensor.
    Tensor,
    /// One pair per index of this axis.
    Axis(usize),
    /// One pair per block of this many indices along this axis.
    Block(usize, usize),
}

/// A scale or zero point: a literal, or kernel input `j` of dims `dims`.
#[derive(Clone)]
enum Param {
    Lit(S, u64),
    Input(usize, Vec<usize>),
}

impl Param {
    fn value(&self, b: &mut KernelBuilder, layout: Layout, index: &[ExprId]) -> ExprId {
        match self {
            Param::Lit(t, bits) => b.constant(*t, *bits),
            Param::Input(j, dims) => {
                let ix: Vec<ExprId> = if dims.iter().product::<usize>() == 1 {
                    vec![b.index(0); dims.len()]
                } else {
                    match layout {
                        Layout::Tensor => vec![b.index(0); dims.len()],
                        Layout::Axis(a) => vec![index[a]],
                        Layout::Block(a, size) => {
                            let mut ix = index.to_vec();
                            let s = b.index(size as i64);
                            ix[a] = b.div(index[a], s);
                            ix
                        }
                    }
                };
                b.load(*j, ix)
            }
        }
    }
}

/// The layout, the scale and the optional zero point (of dtype `zd`) of a quantisation
/// op; kernel inputs are appended to `operands` (x is input 0).
fn quant_params(cx: &OpCx<'_>, zd: DType, operands: &mut Vec<usize>) -> R<(Layout, Param, Option<Param>)> {
    let xd = cx.input_ty(0)?.shape.dims().to_vec();
    let st = cx.input_ty(1)?;
    let sd = st.shape.dims().to_vec();
    let sn: usize = sd.iter().product();
    let (axis, block) = match cx.op.kind {
        OpKind::QuantizeLinear => {
            let a = cx.attrs::<ka::QuantizeAttrs>()?;
            (a.axis, a.block_size)
        }
        _ => {
            let a = cx.attrs::<ka::DequantizeAttrs>()?;
            (a.axis, a.block_size)
        }
    };
    let layout = if block < 0 {
        return Err(cx.unsupported(format!("block_size = {block}")));
    } else if block == 0 {
        if sd.len() <= 1 && sn == 1 {
            Layout::Tensor
        } else {
            let a = norm_axis(cx, axis, xd.len())?;
            if sd.len() != 1 || sd[0] != xd[a] {
                return Err(cx.unsupported(format!("scale shape {sd:?} is not per-axis along axis {a} of {xd:?}")));
            }
            Layout::Axis(a)
        }
    } else {
        let size = block as usize;
        let a = norm_axis(cx, axis, xd.len())?;
        let ok = sd.len() == xd.len()
            && sd.iter().zip(&xd).enumerate().all(|(i, (&s, &x))| if i == a { s == x.div_ceil(size) } else { s == x });
        if !ok {
            return Err(cx.unsupported(format!("scale shape {sd:?} does not block {xd:?} by {size} along axis {a}")));
        }
        Layout::Block(a, size)
    };
    let mut param = |i: usize| -> Param {
        let o = cx.input(i);
        let single = o.is_some_and(|o| o.ty.shape.numel() == 1);
        match o.and_then(|o| o.value).filter(|_| single).and_then(scalar_bits) {
            Some((t, bits)) => Param::Lit(t, bits),
            None => {
                operands.push(i);
                let dims = o.map(|o| o.ty.shape.dims().to_vec()).unwrap_or_default();
                Param::Input(operands.len() - 1, dims)
            }
        }
    };
    if !(st.dtype.is_float() || st.dtype.is_int()) {
        return Err(cx.unsupported(format!("{} scale", st.dtype)));
    }
    let scale = param(1);
    let zero = match cx.input(2) {
        None => None,
        Some(z) => {
            let one = |d: &[usize]| d.iter().product::<usize>() == 1 && d.len() <= 1;
            if z.ty.dtype != zd {
                return Err(cx.unsupported(format!("zero point dtype {} should be {zd}", z.ty.dtype)));
            }
            if z.ty.shape.dims() != sd.as_slice() && !(one(z.ty.shape.dims()) && one(&sd)) {
                return Err(cx.unsupported(format!("zero point {} differs from the scale's shape {sd:?}", z.ty)));
            }
            Some(param(2))
        }
    };
    Ok((layout, scale, zero))
}

fn is_f32_exact(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// QuantizeLinear: `x / scale` rounded to the division precision (the `precision`
/// attribute, else the scale's dtype, f64 for integer scales); integer results round half
/// to even, add the zero point and saturate; float results add the zero point and convert.
fn quantize(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dtype(cx, 0)?;
    let sdt = dtype(cx, 1)?;
    let out = out_ty(cx)?;
    let d = out.dtype;
    if cx.input_ty(0)?.shape != out.shape {
        return Err(cx.unsupported("the result must have x's shape"));
    }
    need(cx, xd, xd.is_float() || xd.is_int(), "a numeric x")?;
    if !(d.is_int() || d.is_low_precision_float()) {
        return Err(cx.unsupported(format!("{d} is not a quantised dtype")));
    }
    let qa = cx.attrs::<ka::QuantizeAttrs>()?;
    let prec = match qa.precision {
        0 if sdt.is_float() => sdt,
        0 => DType::F64,
        c => DType::from_onnx_code(c).ok_or_else(|| cx.unsupported(format!("precision = {c}")))?,
    };
    let saturate = qa.saturate;
    let mut operands = vec![0];
    let (layout, scale, zero) = quant_params(cx, d, &mut operands)?;
    // f32 division is the reference's (f64 division rounded to f32) for f32-exact operands.
    let fast = prec == DType::F32 && is_f32_exact(xd) && is_f32_exact(sdt);
    kernel(cx, &operands, |b, index| {
        let x = b.load(0, index.to_vec());
        let s = scale.value(b, layout, index);
        let ct = if fast { S::F32 } else { S::F64 };
        let (xc, sc) = (b.convert(x, ct), b.convert(s, ct));
        // A constant scale of exactly one divides nothing (x / 1 is x, NaN and
        // infinities too): integers saturated to a narrower type (tflite/int8.rs).
        let one = matches!(b.node(sc), Some(n) if matches!(n.expr, Expr::Const(bits) if bits == ct.bits_of_f64(1.0)));
        let q = if one { xc } else { b.div(xc, sc) };
        let q = match prec {
            DType::F32 | DType::F16 | DType::BF16 if !fast => b.cast(q, prec, true),
            _ => q,
        };
        let t = b.ty(q);
        let mut z_zero = true;
        let z = zero.as_ref().map(|z| {
            let z = z.value(b, layout, index);
            z_zero = matches!(b.node(z), Some(n) if matches!(n.expr, Expr::Const(0)));
            b.convert(z, t)
        });
        if d.is_int() {
            let (lo, hi) = int_range(d);
            // NaN quantises to the zero point. Where that is 0 (or absent), the NaN
            // passes the clamp and converts to 0 (`Expr::Cast`) without a select, and
            // adding the zero point changes nothing (a −0 converts to 0 as well): two
            // operations fewer a value (a requantised integer's saturation, tflite/int8.rs).
            let r = match z {
                Some(z) if !z_zero => {
                    let nan = b.unary(U::IsNan, q);
                    let r = b.unary(U::Round, q);
                    let zr = b.float(t, 0.0);
                    let r = sel(b, nan, zr, r);
                    b.add(r, z)
                }
                _ => b.unary(U::Round, q),
            };
            let (l, h) = (b.float(t, lo as f64), b.float(t, hi as f64));
            let r = b.binary(B::Max, r, l);
            let r = b.binary(B::Min, r, h);
            return Ok(b.cast(r, d, true));
        }
        let r = match z {
            Some(z) => b.add(q, z),
            None => q,
        };
        Ok(b.cast(r, d, saturate || !is_f8(d)))
    })
}

/// Significand bits of float dtype `d` (f32-exact ones).
fn significand(d: DType) -> u32 {
    match d {
        DType::F16 => 11,
        DType::BF16 => 8,
        _ => 24,
    }
}

/// DequantizeLinear: `(x − zero point)·scale`, rounded once to the scale's dtype.
fn dequantize(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dtype(cx, 0)?;
    let sdt = dtype(cx, 1)?;
    let out = out_ty(cx)?;
    if cx.input_ty(0)?.shape != out.shape || !out.dtype.is_float() || !sdt.is_float() {
        return Err(cx.unsupported(format!("result {out} does not fit x {}", cx.input_ty(0)?)));
    }
    need(cx, xd, xd.is_int() || xd.is_float(), "a quantised x")?;
    let mut operands = vec![0];
    let (layout, scale, zero) = quant_params(cx, xd, &mut operands)?;
    // Where (x − zero point)·scale is exact in f32 (or f32 is the result), f32; else f64.
    let wide = if xd.is_int() {
        let diff_bits = xd.bits() as u32 + 1;
        xd == DType::I32 || sdt == DType::F64 || (sdt != DType::F32 && diff_bits + significand(sdt) > 24)
    } else {
        sdt == DType::F64 || zero.is_some()
    };
    kernel(cx, &operands, |b, index| {
        let x = b.load(0, index.to_vec());
        let s = scale.value(b, layout, index);
        let z = zero.as_ref().map(|z| z.value(b, layout, index));
        let (diff_t, ct) = match (xd.is_int(), wide) {
            (true, true) => (S::I64, S::F64),
            (true, false) => (S::F32, S::F32),
            (false, true) => (S::F64, S::F64),
            (false, false) => (S::F32, S::F32),
        };
        let mut v = b.convert(x, diff_t);
        if let Some(z) = z {
            let z = b.convert(z, diff_t);
            v = b.sub(v, z);
        }
        let v = b.convert(v, ct);
        let s = b.convert(s, ct);
        Ok(b.mul(v, s))
    })
}
