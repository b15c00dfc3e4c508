//! LiteRT's integer forms of int8 `MEAN`, `RESIZE_BILINEAR` and `BATCH_MATMUL`.
//!
//! Most int8 ops are imported in their QDQ form (dequantise, float op, quantise), which
//! lands within one quantisation step of LiteRT's builtin kernels; these three compute
//! otherwise in LiteRT, and their one-step differences compound through a network
//! (docs/tflite-testing.md, "Where the int8 steps come from"). Here they are built in
//! LiteRT's arithmetic instead, from operations whose results are exact, so that the
//! graph means the same thing to the compiled path and to the reference evaluator, with
//! no rounding left to either. Where the bounds below allow, every value is an i32 or an
//! f32 (32-bit lanes, which the CPU code generator's vector kernels and the integer
//! contraction's epilogue evaluate); otherwise integers held in f64 (every product and
//! sum below 2⁵³), which run on the scalar general path.
//!
//! - **Fixed-point multiplication**: a real multiplier `M = q·2^(e−31)`,
//!   `q ∈ [2³⁰, 2³¹)` (TFLite's `QuantizeMultiplier`), applied to an integer `a` by
//!   double rounding (`SaturatingRoundingDoublingHighMul` rounding half up, then
//!   `RoundingDivideByPOT` rounding half away from zero) or by single rounding
//!   (`⌊(a·q + 2^(k−1)) / 2^k⌋`, `k = 31 − e`). Both start from
//!   `z = ⌊(a·q + c) / 2³¹⌋` (`c = 2³⁰`, or `2^(k−1)` for single rounding), then
//!   `⌊z / 2^(k−31)⌋` (single) or `z / 2^(−e)` rounded half away from zero (double).
//! - **In 32-bit lanes** ([`Importer::fixed_point_lanes`]): `a` an i32 with `|a·q| / 2³¹
//!   + c / 2³¹ < 2²⁰`. The low 31 bits of `a·q + c` are exact in the wrapping 32-bit
//!   product (`c` mod 2³¹ is `2³⁰` or 0); with `ρ` those bits over 2³¹ (`∈ [0, 1)`, f32),
//!   `z = round(f32(a)·f32(q/2³¹) + c/2³¹ − ρ)` exactly: the f32 estimate of the integer
//!   `z` is off by at most 5/16 (three roundings of a value below 2²⁰, each below
//!   `2⁻²⁴` relative, and two of 2⁻⁴), with or without a fused multiply-add. `z` and
//!   what follows are integers below 2²⁴, exact in f32. The second rounding (`r = −e`
//!   up to 20) is TFLite's `⌊(z + 2^(r−1) − [z < 0]) / 2^r⌋` with the integer
//!   `2^(r−1) − [a < 0]` (`z`'s sign is `a`'s) added to the estimate before it is
//!   rounded (below 2²¹, the error stays below 7/16); for a larger `r`,
//!   `⌊(|z| + 2^(r−1)) / 2^r⌋` with `a`'s sign.
//! - **In f64** ([`Importer::fixed_point`]), where those bounds fail: with
//!   `q = q_h·2¹⁶ + q_l`, `a·q_h = u·2^(k−16) + v` (`u` by `Floor`, `0 ≤ v < 2^(k−16)`),
//!   `⌊(a·q + c) / 2^k⌋ = u + ⌊(v·2¹⁶ + a·q_l + c) / 2^k⌋`, every term below 2⁵³
//!   (where the accumulator's bound keeps `a·q` below 2⁵³, one product instead).
//! - **MEAN** of int8 over the spatial axes of a rank-4 tensor with `keep_dims` (LiteRT's
//!   optimised mean): `Σx` (i32) times `s_x / (N·s_y)` (f32) by single rounding, plus
//!   `z_y − round(z_x·s_x/s_y)` (f32, rounded half away from zero); any other int8
//!   MEAN: `Σ(x − z_x)` times `s_x / (s_y·N)` (f64) by double rounding, plus `z_y`.
//! - **RESIZE_BILINEAR** of int8 (input and output share their quantisation): 10-bit
//!   fixed-point source positions and weights on the raw integers,
//!   `Σ x·w_y·w_x` (weights summing to 2²⁰) divided by 2²⁰ rounding half away from zero.
//!   The weights are separable, so the sum is two passes of two gathered source
//!   positions each, in i32 (below 2²⁷); the division is `(|Σ| + 2¹⁹)` with its low 20
//!   bits cleared, in f32 times 2⁻²⁰ (exact), with `Σ`'s sign.
//! - **BATCH_MATMUL** of int8: `Σ(a − z_a)(b − z_b)` as `MatMulInteger` (i32), times
//!   `s_a·s_b / s_y` (f64) by double rounding, plus `z_y`.
//!
//! Each result is saturated to the int8 range. TFLite's own 32-bit saturation inside the
//! fixed-point product (an accumulator times 2^e for a multiplier above one overflowing)
//! is not modelled; it does not occur for a multiplier below one.

use super::reader::Quant;
use super::{identity, Importer, NCHW};
use crate::ImportError;
use kiln_ir::{Attr, Attrs, DType, OpKind, Shape, Tensor, ValueId};

/// TFLite's `QuantizeMultiplier`: `(q, e)` with `real = q·2^(e−31)`, `q ∈ [2³⁰, 2³¹)`
/// rounded half away from zero; `(0, 0)` for zero (or a multiplier below 2⁻³¹, as TFLite).
pub(crate) fn quantize_multiplier(real: f64) -> (i64, i32) {
    if real <= 0.0 || !real.is_finite() {
        return (0, 0);
    }
    // real = m·2^e with m ∈ [0.5, 1).
    let mut e = real.log2().floor() as i32 + 1;
    let mut m = real / 2f64.powi(e);
    if m >= 1.0 {
        m /= 2.0;
        e += 1;
    } else if m < 0.5 {
        m *= 2.0;
        e -= 1;
    }
    let mut q = (m * 2f64.powi(31)).round() as i64;
    if q == 1 << 31 {
        q /= 2;
        e += 1;
    }
    if e < -31 {
        return (0, 0);
    }
    (q, e)
}

/// How a fixed-point product rounds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Rounding {
    /// TFLite's default `MultiplyByQuantizedMultiplier`: a rounding doubling high
    /// product, then a rounding right shift.
    Double,
    /// `TFLITE_SINGLE_ROUNDING`'s form: one 64-bit product, one rounding shift.
    Single,
}

/// The integer `MultiplyByQuantizedMultiplier(a, real)` on exact integers (i64
/// arithmetic with exact rounding), the model [`Importer::fixed_point`]'s graph computes.
#[cfg(test)]
pub(crate) fn multiply_by_quantized(a: i64, real: f64, rounding: Rounding) -> i64 {
    let (q, e) = quantize_multiplier(real);
    if q == 0 {
        return 0;
    }
    let a = a as i128 * (1i128 << e.max(0));
    match rounding {
        Rounding::Double => {
            let z = (a * q as i128 + (1 << 30)).div_euclid(1 << 31);
            let r = (-e).max(0);
            if r == 0 {
                return z as i64;
            }
            let half = 1i128 << (r - 1);
            let m = z.abs();
            let mag = (m + half) >> r;
            (if z < 0 { -mag } else { mag }) as i64
        }
        Rounding::Single => {
            let k = 31 - e.min(0);
            ((a * q as i128 + (1i128 << (k - 1))).div_euclid(1i128 << k)) as i64
        }
    }
}

impl Importer<'_> {
    fn f64_scalar(&mut self, x: f64) -> Result<ValueId, ImportError> {
        self.scalar(DType::F64, x)
    }

    /// `op(v, x)` for an f64 scalar `x`.
    fn with_scalar(&mut self, op: OpKind, v: ValueId, x: f64) -> Result<ValueId, ImportError> {
        let c = self.f64_scalar(x)?;
        self.emit1(op, Attrs::new(), vec![Some(v), Some(c)])
    }

    fn binary(&mut self, op: OpKind, a: ValueId, b: ValueId) -> Result<ValueId, ImportError> {
        let r = self.emit1(op, Attrs::new(), vec![Some(a), Some(b)])?;
        Ok(self.named(r))
    }

    fn floor(&mut self, v: ValueId) -> Result<ValueId, ImportError> {
        self.emit1(OpKind::Floor, Attrs::new(), vec![Some(v)])
    }

    /// `⌊(a·q + c) / 2^k⌋` of f64 integers `a` (|a| ≤ `bound`, below 2³¹·2^e) for
    /// `q < 2³¹`, exactly: one product where `bound·q + c` stays below 2⁵³, else the
    /// split in the module docs; `None` when `k` is outside 16..=52.
    fn floor_product(
        &mut self,
        a: ValueId,
        bound: f64,
        q: i64,
        c: f64,
        k: i32,
    ) -> Result<Option<ValueId>, ImportError> {
        if !(16..=52).contains(&k) {
            return Ok(None);
        }
        if bound * q as f64 + c < 2f64.powi(53) {
            // `a·q + c` is exact in f64 as it is.
            let p = self.with_scalar(OpKind::Mul, a, q as f64)?;
            let p = self.with_scalar(OpKind::Add, p, c)?;
            let p = self.with_scalar(OpKind::Mul, p, 2f64.powi(-k))?;
            return Ok(Some(self.floor(p)?));
        }
        let (qh, ql) = ((q >> 16) as f64, (q & 0xffff) as f64);
        let p1 = self.with_scalar(OpKind::Mul, a, qh)?;
        let scaled = self.with_scalar(OpKind::Mul, p1, 2f64.powi(16 - k))?;
        let u = self.floor(scaled)?;
        let us = self.with_scalar(OpKind::Mul, u, 2f64.powi(k - 16))?;
        let v = self.binary(OpKind::Sub, p1, us)?;
        let v16 = self.with_scalar(OpKind::Mul, v, 65536.0)?;
        let p2 = self.with_scalar(OpKind::Mul, a, ql)?;
        let s = self.binary(OpKind::Add, v16, p2)?;
        let s = self.with_scalar(OpKind::Add, s, c)?;
        let s = self.with_scalar(OpKind::Mul, s, 2f64.powi(-k))?;
        let f = self.floor(s)?;
        Ok(Some(self.binary(OpKind::Add, u, f)?))
    }

    /// TFLite's `MultiplyByQuantizedMultiplier(acc, real)` of f64 integers `acc` (see the
    /// module docs); `None` when the multiplier's exponent is out of the exact range.
    pub(crate) fn fixed_point(
        &mut self,
        acc: ValueId,
        bound: f64,
        real: f64,
        rounding: Rounding,
    ) -> Result<Option<ValueId>, ImportError> {
        let (q, e) = quantize_multiplier(real);
        if q == 0 {
            return Ok(Some(self.with_scalar(OpKind::Mul, acc, 0.0)?));
        }
        let a = if e > 0 { self.with_scalar(OpKind::Mul, acc, 2f64.powi(e))? } else { acc };
        let bound = bound * 2f64.powi(e.max(0));
        match rounding {
            Rounding::Single => self.floor_product(a, bound, q, 2f64.powi(30 - e.min(0)), 31 - e.min(0)),
            Rounding::Double => {
                let Some(z) = self.floor_product(a, bound, q, 2f64.powi(30), 31)? else { return Ok(None) };
                let r = (-e).max(0);
                if r == 0 {
                    return Ok(Some(z));
                }
                // Round half away from zero: sign(w)·⌊|w| + ½⌋, w = z / 2^r (exact).
                let w = self.with_scalar(OpKind::Mul, z, 2f64.powi(-r))?;
                let m = self.emit1(OpKind::Abs, Attrs::new(), vec![Some(w)])?;
                let m = self.with_scalar(OpKind::Add, m, 0.5)?;
                let m = self.floor(m)?;
                let s = self.emit1(OpKind::Sign, Attrs::new(), vec![Some(w)])?;
                Ok(Some(self.binary(OpKind::Mul, s, m)?))
            }
        }
    }

    /// Integers `v` (f64 or f32) plus `offset`, saturated to int8 and stored as tensor `out`
    /// (layout `lay`).
    fn store_int8(&mut self, out: usize, lay: &[usize], v: ValueId, offset: f64) -> Result<(), ImportError> {
        let v = if offset != 0.0 { self.with_typed(OpKind::Add, v, offset)? } else { v };
        let v = self.saturate_int8(v)?;
        self.set_raw(out, lay, v);
        Ok(())
    }

    /// `op(v, x)` for a scalar `x` of `v`'s dtype.
    fn with_typed(&mut self, op: OpKind, v: ValueId, x: f64) -> Result<ValueId, ImportError> {
        let c = self.scalar(self.g.ty(v).dtype, x)?;
        let r = self.emit1(op, Attrs::new(), vec![Some(v), Some(c)])?;
        Ok(self.named(r))
    }

    /// `v` under a fresh name where it has none: the tensor passes name the values
    /// they make after the one they replace (`tensor-fold-channel-affine` merges an f32
    /// chain of constant products and sums, exactly here: every value is an integer or
    /// a power-of-two fraction that the merged form rounds the same way), and two
    /// unnamed values would give two of one name.
    fn named(&mut self, v: ValueId) -> ValueId {
        if self.g.values[v].name.is_empty() && self.g.constant(v).is_none() {
            self.g.values[v].name = self.fresh("int8");
        }
        v
    }

    fn unary(&mut self, op: OpKind, v: ValueId) -> Result<ValueId, ImportError> {
        let r = self.emit1(op, Attrs::new(), vec![Some(v)])?;
        Ok(self.named(r))
    }

    /// `i < 0 ? −m : m` for i32 `i` and f32 `m`: `m` given the sign of `i`.
    fn signed_by(&mut self, i: ValueId, m: ValueId) -> Result<ValueId, ImportError> {
        let zero = self.scalar(DType::I32, 0.0)?;
        let neg = self.binary(OpKind::Less, i, zero)?;
        let minus = self.unary(OpKind::Neg, m)?;
        self.emit1(OpKind::Where, Attrs::new(), vec![Some(neg), Some(minus), Some(m)])
    }

    /// A constant of `dtype`: a scalar for one value, else `vals` shaped `shape`.
    fn lane_const(&mut self, dtype: DType, vals: &[f64], shape: &[usize]) -> Result<ValueId, ImportError> {
        if vals.len() == 1 {
            return self.scalar(dtype, vals[0]);
        }
        let sh = Shape::new(shape.to_vec()).map_err(|e| self.err(e.to_string()))?;
        let t = Tensor::from_f64(dtype, sh, vals).map_err(|e| self.err(e.to_string()))?;
        Ok(self.konst(t))
    }

    /// `op(v, c)` for the constant `c` of `v`'s dtype from [`Self::lane_const`].
    fn with_lanes(&mut self, op: OpKind, v: ValueId, vals: &[f64], shape: &[usize]) -> Result<ValueId, ImportError> {
        let c = self.lane_const(self.g.ty(v).dtype, vals, shape)?;
        let r = self.emit1(op, Attrs::new(), vec![Some(v), Some(c)])?;
        Ok(self.named(r))
    }

    /// TFLite's `MultiplyByQuantizedMultiplier(acc, real)` of i32 integers `acc` in
    /// 32-bit lanes (the module docs, "In 32-bit lanes"): an f32 exact integer; `None`
    /// (nothing emitted) where the bounds of that form do not hold. One multiplier
    /// (`reals` and `bounds`, the bound on |acc|, of length 1), or one per channel, the
    /// constants shaped `shape` (double rounding only).
    fn fixed_point_lanes(
        &mut self,
        acc: ValueId,
        bounds: &[f64],
        reals: &[f64],
        shape: &[usize],
        rounding: Rounding,
    ) -> Result<Option<ValueId>, ImportError> {
        let qe: Vec<(i64, i32)> = reals.iter().map(|&r| quantize_multiplier(r)).collect();
        let k = match rounding {
            Rounding::Single if qe.len() == 1 => 31 - qe[0].1.min(0),
            Rounding::Single => return Ok(None),
            Rounding::Double => 31,
        };
        // The f32 estimate's error stays below ½ while |a·q / 2³¹| + c / 2³¹ < 2²⁰.
        let fits = qe.iter().zip(bounds).all(|(&(q, e), &b)| {
            let b = b * 2f64.powi(e.max(0));
            b < 2f64.powi(31) && k <= 52 && b * q as f64 * 2f64.powi(-31) + 2f64.powi(k - 32) < 2f64.powi(20)
        });
        if !fits || qe.len() != bounds.len() {
            return Ok(None);
        }
        let each = |f: &dyn Fn(i64, i32) -> f64| qe.iter().map(|&(q, e)| f(q, e)).collect::<Vec<f64>>();
        let a = if qe.iter().any(|&(_, e)| e > 0) {
            self.with_lanes(OpKind::Mul, acc, &each(&|_, e| 2f64.powi(e.max(0))), shape)?
        } else {
            acc
        };
        // (a·q + c) mod 2³¹ from the wrapping 32-bit product; c = 2^(k−1) is a multiple
        // of 2³¹ unless k = 31.
        let mut low = self.with_lanes(OpKind::Mul, a, &each(&|q, _| q as f64), shape)?;
        if k == 31 {
            low = self.with_typed(OpKind::Add, low, 2f64.powi(30))?;
        }
        let low = self.with_typed(OpKind::BitwiseAnd, low, (i32::MAX) as f64)?;
        let low = self.cast(low, DType::F32)?;
        let frac = self.with_typed(OpKind::Mul, low, 2f64.powi(-31))?;
        let af = self.cast(a, DType::F32)?;
        let est = self.with_lanes(OpKind::Mul, af, &each(&|q, _| (q as f64 * 2f64.powi(-31)) as f32 as f64), shape)?;
        let shifts = rounding == Rounding::Double && qe.iter().any(|&(_, e)| e < 0);
        if shifts && qe.iter().all(|&(_, e)| e >= -20) {
            // Double rounding in one: RoundingDivideByPOT(z, r) = ⌊(z + 2^(r−1) − [z < 0])
            // / 2^r⌋ (r = −e > 0; z < 0 exactly where a < 0), and z + 2^(r−1) − [a < 0] is
            // the rounded estimate with that integer added (below 2²¹: the error stays
            // below 7/16).
            let plus = |neg: bool| each(&|_, e| if e < 0 { 0.5 + 2f64.powi(-e - 1) - neg as i32 as f64 } else { 0.5 });
            let zero = self.scalar(DType::I32, 0.0)?;
            let neg = self.binary(OpKind::Less, a, zero)?;
            let (cn, cp) =
                (self.lane_const(DType::F32, &plus(true), shape)?, self.lane_const(DType::F32, &plus(false), shape)?);
            let c = self.emit1(OpKind::Where, Attrs::new(), vec![Some(neg), Some(cn), Some(cp)])?;
            let est = self.binary(OpKind::Add, est, c)?;
            let est = self.binary(OpKind::Sub, est, frac)?;
            let z = self.unary(OpKind::Round, est)?;
            let w = self.with_lanes(OpKind::Mul, z, &each(&|_, e| 2f64.powi(e.min(0))), shape)?;
            return Ok(Some(self.unary(OpKind::Floor, w)?));
        }
        let est = self.with_typed(OpKind::Add, est, 2f64.powi(k - 32))?;
        let est = self.binary(OpKind::Sub, est, frac)?;
        // ⌊(a·q + c) / 2³¹⌋, an integer below 2²⁰ in magnitude.
        let z = self.unary(OpKind::Round, est)?;
        match rounding {
            Rounding::Single if k > 31 => {
                let w = self.with_typed(OpKind::Mul, z, 2f64.powi(31 - k))?;
                Ok(Some(self.unary(OpKind::Floor, w)?))
            }
            Rounding::Double if qe.iter().any(|&(_, e)| e < 0) => {
                // Half away from zero: ⌊(|z| + 2^(r−1)) / 2^r⌋ (r = −e; nothing where r
                // is 0) with z's sign, which is a's.
                let m = self.unary(OpKind::Abs, z)?;
                let m =
                    self.with_lanes(OpKind::Add, m, &each(&|_, e| if e < 0 { 2f64.powi(-e - 1) } else { 0.0 }), shape)?;
                let m = self.with_lanes(OpKind::Mul, m, &each(&|_, e| 2f64.powi(e.min(0))), shape)?;
                let m = self.unary(OpKind::Floor, m)?;
                Ok(Some(self.signed_by(a, m)?))
            }
            _ => Ok(Some(z)),
        }
    }

    /// LiteRT's fixed-point product of i32 integers `acc` (|acc| ≤ `bound`), saturated to
    /// int8 after `offset` is added and stored as tensor `out` (layout `lay`): in 32-bit
    /// lanes where their bounds hold, else in f64; `false` when neither applies.
    fn requantize_int8(
        &mut self,
        (out, lay): (usize, &[usize]),
        acc: ValueId,
        bound: f64,
        real: f64,
        rounding: Rounding,
        offset: f64,
    ) -> Result<bool, ImportError> {
        if let Some(v) = self.fixed_point_lanes(acc, &[bound], &[real], &[], rounding)? {
            self.store_int8(out, lay, v, offset)?;
            return Ok(true);
        }
        let accf = self.cast(acc, DType::F64)?;
        let Some(v) = self.fixed_point(accf, bound, real, rounding)? else { return Ok(false) };
        self.store_int8(out, lay, v, offset)?;
        Ok(true)
    }

    /// Integers `v` (f64 or f32) saturated to int8: an f32 through `QuantizeLinear` with
    /// scale 1 (its rounding leaves an integer as it is; its vector form stores bytes),
    /// an f64 clamped and cast.
    fn saturate_int8(&mut self, v: ValueId) -> Result<ValueId, ImportError> {
        if self.g.ty(v).dtype == DType::F32 {
            let (one, zero) = (self.scalar(DType::F32, 1.0)?, self.scalar(DType::I8, 0.0)?);
            return self.emit1(OpKind::QuantizeLinear, Attrs::new(), vec![Some(v), Some(one), Some(zero)]);
        }
        let d = self.g.ty(v).dtype;
        let (lo, hi) = (self.scalar(d, -128.0)?, self.scalar(d, 127.0)?);
        let v = self.emit1(OpKind::Clip, Attrs::new(), vec![Some(v), Some(lo), Some(hi)])?;
        self.cast(v, DType::I8)
    }

    /// Per-tensor int8 quantisation of tensor `t`: `(scale, zero point)`.
    fn int8_params(&self, t: usize) -> Option<(f32, i64)> {
        let q: &Quant = self.quant(t)?;
        let int8 = self.desc(t).dtype == super::fb::TensorType::Int8;
        (int8 && q.scale.len() == 1 && q.zero_point.len() == 1 && q.scale[0] > 0.0)
            .then(|| (q.scale[0], q.zero_point[0]))
    }

    /// LiteRT's int8 MEAN of tensor `x` held in layout `lay` over held axes `held_axes`
    /// (`axes` in TFLite order) into `out`; `false` (nothing emitted) when `x` or `out`
    /// is not per-tensor int8 or the multiplier is out of range.
    pub(crate) fn int8_mean(
        &mut self,
        x: usize,
        out: usize,
        lay: &[usize],
        held_axes: &[i64],
        axes: &[usize],
        keep: bool,
    ) -> Result<bool, ImportError> {
        let (Some((sx, zx)), Some((sy, zy))) = (self.int8_params(x), self.int8_params(out)) else { return Ok(false) };
        let raw = self.raw(x, lay)?;
        let d = self.dims(raw);
        let n: usize = held_axes.iter().map(|&a| d[a as usize]).product();
        if n == 0 || n as f64 * 256.0 >= 2f64.powi(31) {
            return Ok(false);
        }
        let mut sorted = axes.to_vec();
        sorted.sort_unstable();
        let spatial = keep && d.len() == 4 && sorted == [1, 2];
        // Σx in i32 (exact: |Σx| ≤ 128·N < 2³¹).
        let xi = self.cast(raw, DType::I32)?;
        let axes_v = self.i64s(held_axes);
        let attrs = Attrs::new().with("keepdims", Attr::Int(keep as i64));
        let sum = self.emit1(OpKind::ReduceSum, attrs, vec![Some(xi), Some(axes_v)])?;
        let out_lay = if keep { lay.to_vec() } else { identity(self.g.ty(sum).shape.rank()) };
        if spatial {
            // LiteRT's optimised mean: raw sum, single rounding, one bias (f32 arithmetic).
            let real = sx / (n as f32 * sy);
            let t = zx as f32 * sx / sy;
            let t = if t > 0.0 { t + 0.5 } else { t - 0.5 };
            let bias = zy - t.trunc() as i64;
            self.requantize_int8((out, &out_lay), sum, 128.0 * n as f64, real as f64, Rounding::Single, bias as f64)
        } else {
            let acc = self.with_typed(OpKind::Sub, sum, (n as i64 * zx) as f64)?;
            let real = sx as f64 / (sy as f64 * n as f64);
            self.requantize_int8((out, &out_lay), acc, 255.0 * n as f64, real, Rounding::Double, zy as f64)
        }
    }

    /// LiteRT's int8 RESIZE_BILINEAR of tensor `x` to `size` (`[height, width]`) into
    /// `out`; `false` when they are not int8 with one shared quantisation.
    pub(crate) fn int8_resize_bilinear(
        &mut self,
        x: usize,
        out: usize,
        size: &[i64],
        align: bool,
        half: bool,
    ) -> Result<bool, ImportError> {
        if self.int8_params(x).is_none() || !self.same_quant(x, out) {
            return Ok(false);
        }
        let raw = self.raw(x, &NCHW)?;
        let d = self.dims(raw);
        let (&[oh, ow], [_, _, ih, iw]) = (size, d.as_slice()) else { return Ok(false) };
        if oh <= 0 || ow <= 0 || *ih == 0 || *iw == 0 {
            return Ok(false);
        }
        let (oh, ow) = (oh as usize, ow as usize);
        // Both passes in i32 (|Σ x·w_y·w_x| ≤ 2²⁷), each output position from its two
        // source positions.
        let wt = taps(*iw, ow, align, half);
        let t = if *iw * ow <= DENSE_WIDTH_PASS {
            self.width_pass_products(raw, *iw, &wt)?
        } else {
            let xi = self.cast(raw, DType::I32)?;
            self.interpolate(xi, 3, &wt, DType::I32)?
        };
        let sum = self.interpolate(t, 2, &taps(*ih, oh, align, half), DType::I32)?;
        // Σ / 2²⁰ rounded half away from zero: ⌊(|Σ| + 2¹⁹) / 2²⁰⌋ with Σ's sign, the
        // division exact in f32 once the low 20 bits are cleared.
        let m = self.unary(OpKind::Abs, sum)?;
        let m = self.with_typed(OpKind::Add, m, 2f64.powi(19))?;
        let m = self.with_typed(OpKind::BitwiseAnd, m, -(2f64.powi(20)))?;
        let m = self.cast(m, DType::F32)?;
        let m = self.with_typed(OpKind::Mul, m, 2f64.powi(-20))?;
        let v = self.signed_by(sum, m)?;
        self.store_int8(out, &NCHW, v, 0.0)?;
        Ok(true)
    }

    /// LiteRT's int8 CONV_2D of `x` with constant int8 filter `w` (OHWI, per-tensor or
    /// per-channel scales, zero points 0) and constant i32 `bias` into `out`, fused
    /// activation range `act` (real bounds): `ConvInteger` (`attrs`, NCHW), the bias,
    /// the per-channel fixed-point multiplier `s_x·s_w[c] / s_y` by double rounding in
    /// 32-bit lanes, `z_y`, clamped to the activation's integers. `false` (nothing
    /// emitted) where any of that does not hold.
    pub(crate) fn int8_conv(
        &mut self,
        (x, w, bias): (usize, usize, Option<usize>),
        out: usize,
        attrs: &Attrs,
        act: (f64, f64),
    ) -> Result<bool, ImportError> {
        let (Some((sx, zx)), Some((sy, zy))) = (self.int8_params(x), self.int8_params(out)) else { return Ok(false) };
        let Some(qw) = self.quant(w) else { return Ok(false) };
        if self.desc(w).dtype != super::fb::TensorType::Int8 || qw.zero_point.iter().any(|&z| z != 0) {
            return Ok(false);
        }
        let sw = qw.scale.clone();
        let Some(wt) = self.const_of(w)? else { return Ok(false) };
        let (Ok(wv), &[m, ..]) = (wt.to_i64_vec(), wt.ty().shape.dims()) else { return Ok(false) };
        if m == 0 || !(sw.len() == 1 || sw.len() == m) || qw.axis != 0 && sw.len() > 1 {
            return Ok(false);
        }
        let b: Vec<i64> = match bias {
            None => vec![0; m],
            Some(t) => {
                let c = self.const_of(t)?;
                match c.filter(|c| c.dtype() == DType::I32).map(|c| c.to_i64_vec()) {
                    Some(Ok(v)) if v.len() == m => v,
                    _ => return Ok(false),
                }
            }
        };
        // |Σ (x − z_x)·w + b| per channel.
        let xmax = (128 + zx).max(127 - zx) as f64;
        let per = wv.len() / m;
        let bounds: Vec<f64> = (0..m)
            .map(|c| wv[c * per..(c + 1) * per].iter().map(|v| v.abs() as f64).sum::<f64>() * xmax + b[c].abs() as f64)
            .collect();
        let reals: Vec<f64> =
            (0..m).map(|c| sx as f64 * sw[if sw.len() == 1 { 0 } else { c }] as f64 / sy as f64).collect();
        let chan = [m, 1, 1];
        let qe_fits = {
            // (Checked again by `fixed_point_lanes`; here before anything is emitted.)
            reals.iter().zip(&bounds).all(|(&r, &bd)| {
                let (q, e) = quantize_multiplier(r);
                let bd = bd * 2f64.powi(e.max(0));
                bd < 2f64.powi(31) && bd * q as f64 * 2f64.powi(-31) + 0.5 < 2f64.powi(20)
            })
        };
        if !qe_fits {
            return Ok(false);
        }
        let a = self.raw(x, &NCHW)?;
        let f = self.raw(w, &NCHW)?;
        let (zxv, zwv) = (self.scalar(DType::I8, zx as f64)?, self.scalar(DType::I8, 0.0)?);
        let acc = self.emit1(OpKind::ConvInteger, attrs.clone(), vec![Some(a), Some(f), Some(zxv), Some(zwv)])?;
        let acc = if b.iter().any(|&v| v != 0) {
            let bf: Vec<f64> = b.iter().map(|&v| v as f64).collect();
            self.with_lanes(OpKind::Add, acc, &bf, &chan)?
        } else {
            acc
        };
        let Some(v) = self.fixed_point_lanes(acc, &bounds, &reals, &chan, Rounding::Double)? else { return Ok(false) };
        let v = self.with_typed(OpKind::Add, v, zy as f64)?;
        let v = self.saturate_int8(v)?;
        // The activation's integers, where narrower than int8's (a saturating clamp of
        // the integers, as a fused activation on a quantised result elsewhere).
        let (s, z) = (sy as f64, zy as f64);
        let lo = (z + (act.0 / s).round()).max(-128.0);
        let hi = if act.1.is_finite() { (z + (act.1 / s).round()).min(127.0) } else { 127.0 };
        let v = if lo > -128.0 || hi < 127.0 {
            let (lo, hi) = (self.scalar(DType::I8, lo)?, self.scalar(DType::I8, hi)?);
            self.emit1(OpKind::Clip, Attrs::new(), vec![Some(v), Some(lo), Some(hi)])?
        } else {
            v
        };
        self.set_raw(out, &NCHW, v);
        Ok(true)
    }

    /// The width pass of an int8 bilinear resize as integer products: `x[.., W]` (int8)
    /// times the dense `[W, OW]` weight matrix of `taps` (two weights per column, each at
    /// most 2¹⁰), split as `32·a + b` (`a ≤ 32`, `b < 32`: int8 matrices) into two
    /// `MatMulInteger`s, `32·(x·a) + x·b` (i32, exact). The integer contraction
    /// microkernel runs them; a gather along the innermost axis has no vector form.
    fn width_pass_products(&mut self, x: ValueId, iw: usize, taps: &[Tap]) -> Result<ValueId, ImportError> {
        let ow = taps.len();
        let mut w = vec![0i64; iw * ow];
        for (o, &(lo, hi, w0, w1)) in taps.iter().enumerate() {
            w[lo as usize * ow + o] += w0 as i64;
            w[hi as usize * ow + o] += w1 as i64;
        }
        let shape = Shape::new(vec![iw, ow]).map_err(|e| self.err(e.to_string()))?;
        let mut half = |f: &dyn Fn(i64) -> i64| -> Result<ValueId, ImportError> {
            let v: Vec<i64> = w.iter().map(|&x| f(x)).collect();
            let t = Tensor::from_i64(DType::I8, shape.clone(), &v).map_err(|e| self.err(e.to_string()))?;
            let m = self.konst(t);
            let z = self.scalar(DType::I8, 0.0)?;
            self.emit1(OpKind::MatMulInteger, Attrs::new(), vec![Some(x), Some(m), Some(z), Some(z)])
        };
        let (hi, lo) = (half(&|x| x >> 5)?, half(&|x| x & 31)?);
        let hi = self.with_typed(OpKind::Mul, hi, 32.0)?;
        let t = self.binary(OpKind::Add, hi, lo)?;
        Ok(self.named(t))
    }

    /// LiteRT's int8 BATCH_MATMUL of `a` (held as `pa`) and `b` (held as `pb`, the
    /// adjoint swaps applied) into `out`; `false` when any is not per-tensor int8.
    pub(crate) fn int8_batch_matmul(
        &mut self,
        (a, pa): (usize, &[usize]),
        (b, pb): (usize, &[usize]),
        out: usize,
    ) -> Result<bool, ImportError> {
        let (Some((sa, za)), Some((sb, zb)), Some((sy, zy))) =
            (self.int8_params(a), self.int8_params(b), self.int8_params(out))
        else {
            return Ok(false);
        };
        let (ra, rb) = (self.raw(a, pa)?, self.raw(b, pb)?);
        let k = *self.dims(ra).last().unwrap_or(&0);
        // |Σ(a − z_a)(b − z_b)| ≤ K·255² must stay within i32.
        if k as f64 * 65025.0 >= 2f64.powi(31) {
            return Ok(false);
        }
        let (zav, zbv) = (self.scalar(DType::I8, za as f64)?, self.scalar(DType::I8, zb as f64)?);
        let acc = self.emit1(OpKind::MatMulInteger, Attrs::new(), vec![Some(ra), Some(rb), Some(zav), Some(zbv)])?;
        let real = sa as f64 * sb as f64 / sy as f64;
        let r = self.g.ty(acc).shape.rank();
        self.requantize_int8((out, &identity(r)), acc, k as f64 * 65025.0, real, Rounding::Double, zy as f64)
    }
}

/// The largest `W·OW` for which a bilinear resize's width pass is a dense product
/// ([`Importer::width_pass_products`]; its work grows as `W·OW` a row, the gathers' as
/// `OW`).
const DENSE_WIDTH_PASS: usize = 1 << 14;

/// One output position's source positions and weights: `(lo, hi, w_lo, w_hi)`.
type Tap = (i64, i64, f64, f64);

/// TFLite's integer bilinear taps from `input` to `output` positions along one axis:
/// per output position its two source positions (clamped) and their weights
/// `2¹⁰ − d` and `d`, `d` the 10-bit fraction.
fn taps(input: usize, output: usize, align: bool, half: bool) -> Vec<Tap> {
    let (i, o) = (input as i64, output as i64);
    let scale =
        if align && o > 1 { ((1 << 10) * (i - 1) + (o - 1) / 2) / (o - 1) } else { ((1 << 10) * i + o / 2) / o };
    (0..o)
        .map(|v| {
            let pos = if half { v * scale + scale / 2 - (1 << 9) } else { v * scale };
            // C's truncating division, as TFLite computes the bounds.
            let lo = (pos / (1 << 10)).max(0);
            let hi = ((pos + (1 << 10) - 1) / (1 << 10)).min(i - 1);
            let frac = pos - (1 << 10) * lo;
            (lo, hi, ((1 << 10) - frac) as f64, frac as f64)
        })
        .collect()
}

/// The `[output, input]` weight matrix of `taps` (row-major), for tests.
#[cfg(test)]
fn weights(input: usize, output: usize, align: bool, half: bool) -> Vec<f64> {
    let mut w = vec![0.0; output * input];
    for (v, (lo, hi, w0, w1)) in taps(input, output, align, half).into_iter().enumerate() {
        w[v * input + lo as usize] += w0;
        w[v * input + hi as usize] += w1;
    }
    w
}

impl Importer<'_> {
    /// `x[.., lo, ..]·w0 + x[.., hi, ..]·w1` along axis `axis` of rank-4 `x` (`dtype`),
    /// per output position of `taps`.
    fn interpolate(&mut self, x: ValueId, axis: usize, taps: &[Tap], dtype: DType) -> Result<ValueId, ImportError> {
        let n = taps.len();
        let idx = |imp: &mut Self, f: &dyn Fn(&Tap) -> i64| imp.i64s(&taps.iter().map(f).collect::<Vec<_>>());
        let (lo, hi) = (idx(self, &|t| t.0), idx(self, &|t| t.1));
        let mut dims = vec![1usize; 4 - axis];
        dims[0] = n;
        let wconst = |imp: &mut Self, f: &dyn Fn(&Tap) -> f64| -> Result<ValueId, ImportError> {
            let shape = Shape::new(dims.clone()).map_err(|e| imp.err(e.to_string()))?;
            let v: Vec<f64> = taps.iter().map(f).collect();
            let t = Tensor::from_f64(dtype, shape, &v).map_err(|e| imp.err(e.to_string()))?;
            Ok(imp.konst(t))
        };
        let (w0, w1) = (wconst(self, &|t| t.2)?, wconst(self, &|t| t.3)?);
        let gather = |imp: &mut Self, i: ValueId| {
            imp.emit1(OpKind::Gather, Attrs::new().with("axis", Attr::Int(axis as i64)), vec![Some(x), Some(i)])
        };
        let (a, b) = (gather(self, lo)?, gather(self, hi)?);
        let a = self.binary(OpKind::Mul, a, w0)?;
        let b = self.binary(OpKind::Mul, b, w1)?;
        self.binary(OpKind::Add, a, b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The multiplier decomposition against its definition, and both roundings against
    /// exact rational arithmetic on ties and near-ties.
    #[test]
    fn fixed_point_arithmetic() {
        for real in [0.5, 0.75, 1.0 / 3.0, 0.0123, 1.5, 2.0f64.powi(-20), 0.999_999_999_9] {
            let (q, e) = quantize_multiplier(real);
            assert!((1 << 30..1 << 31).contains(&q), "{real}: {q}");
            let back = q as f64 * 2f64.powi(e - 31);
            assert!((back - real).abs() <= real * 2f64.powi(-30), "{real}: {back}");
        }
        assert_eq!(quantize_multiplier(0.0), (0, 0));
        // 0.5 exactly: q = 2³⁰, e = 0; a·0.5 rounds half up, then no shift.
        assert_eq!(multiply_by_quantized(3, 0.5, Rounding::Double), 2);
        assert_eq!(multiply_by_quantized(-3, 0.5, Rounding::Double), -1);
        // 0.25: q = 2³⁰, e = −1: the high product is exact (a/2), the shift rounds half
        // away from zero.
        assert_eq!(multiply_by_quantized(6, 0.25, Rounding::Double), 2);
        assert_eq!(multiply_by_quantized(-6, 0.25, Rounding::Double), -2);
        assert_eq!(multiply_by_quantized(-5, 0.25, Rounding::Double), -1);
        // Single rounding: half up.
        assert_eq!(multiply_by_quantized(6, 0.25, Rounding::Single), 2);
        assert_eq!(multiply_by_quantized(-6, 0.25, Rounding::Single), -1);
        // Far from ties both equal the rounded real product.
        for a in [-2_000_000_001i64, -77_777, -5, 0, 9, 123_456, 2_000_000_001] {
            for real in [0.0123, 0.3, 0.000_071] {
                let want = (a as f64 * real).round() as i64;
                for r in [Rounding::Double, Rounding::Single] {
                    let got = multiply_by_quantized(a, real, r);
                    assert!((got - want).abs() <= 1, "{a}·{real} {r:?}: {got}, {want}");
                }
            }
        }
    }

    /// [`Importer::fixed_point_lanes`]'s arithmetic step by step (wrapping i32, f32
    /// rounded after every operation, or the estimate's product and sum fused), for
    /// `a` within `bound`; `None` where that form declines.
    fn lanes(a: i64, bound: f64, real: f64, rounding: Rounding, fused: bool) -> Option<i64> {
        let (q, e) = quantize_multiplier(real);
        let bound = bound * 2f64.powi(e.max(0));
        let k = if rounding == Rounding::Single { 31 - e.min(0) } else { 31 };
        if bound >= 2f64.powi(31) || bound * q as f64 * 2f64.powi(-31) + 2f64.powi(k - 32) >= 2f64.powi(20) {
            return None;
        }
        let a = (a as i32).wrapping_mul(1 << e.max(0));
        let mut low = a.wrapping_mul(q as i32);
        if k == 31 {
            low = low.wrapping_add(1 << 30);
        }
        let frac = (low & i32::MAX) as f32 * 2f32.powi(-31);
        let qf = (q as f64 * 2f64.powi(-31)) as f32;
        let c = 2f32.powi(k - 32);
        if rounding == Rounding::Double && (-20..0).contains(&e) {
            let c = 0.5 + 2f32.powi(-e - 1) - (a < 0) as i32 as f32;
            let est = if fused { (a as f32).mul_add(qf, c) } else { a as f32 * qf + c };
            let z = (est - frac).round_ties_even();
            return Some((z * 2f32.powi(e)).floor() as i64);
        }
        let est = if fused { (a as f32).mul_add(qf, c) } else { a as f32 * qf + c };
        let z = (est - frac).round_ties_even();
        let v = match rounding {
            Rounding::Single if k > 31 => (z * 2f32.powi(31 - k)).floor(),
            Rounding::Double if e < 0 => {
                let m = ((z.abs() + 2f32.powi(-e - 1)) * 2f32.powi(e)).floor();
                if a < 0 {
                    -m
                } else {
                    m
                }
            }
            _ => z,
        };
        Some(v as i64)
    }

    /// The 32-bit lane form equals the exact fixed-point product over whole ranges of
    /// accumulators, at ties and near-ties, for multipliers below and above one.
    #[test]
    fn fixed_point_in_lanes() {
        let mut checked = 0;
        for (bound, real) in [
            (8192.0, 0.015_625_3),
            (8192.0, 1.0 / 48.0),
            (32_640.0, 0.003_1),
            (1_040_400.0, 0.000_123_4),
            (1_040_400.0, 0.25),
            (65025.0, 0.5),
            (65025.0, 3.7),
            (2_000.0, 0.999_999_9),
            (3_000_000.0, 1.0 / 3.0),
            (1_000_000.0, 3.1e-7),
        ] {
            for r in [Rounding::Double, Rounding::Single] {
                let (q, e) = quantize_multiplier(real);
                let step = (bound as i64 / 20_000).max(1);
                // Every accumulator on a grid, and those around each tie of the result.
                let mut accs: Vec<i64> = (-(bound as i64)..=bound as i64).step_by(step as usize).collect();
                let shift = 31 - e.min(0);
                for t in -200i64..200 {
                    // a ≈ (t + ½)·2^shift / q: the last rounding's ties.
                    let a0 = ((t as f64 + 0.5) * 2f64.powi(shift) / q as f64) as i64;
                    accs.extend((a0 - 3..=a0 + 3).filter(|a| a.abs() as f64 <= bound));
                }
                for a in accs {
                    for fused in [false, true] {
                        let Some(got) = lanes(a, bound, real, r, fused) else { continue };
                        assert_eq!(got, multiply_by_quantized(a, real, r), "{a}·{real} {r:?} fused {fused}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 300_000, "{checked}");
    }

    /// The bilinear weights sum to 2²⁰ over both axes (each row to 2¹⁰) and reproduce
    /// a linear ramp at positions that are exact in 10 bits.
    #[test]
    fn bilinear_weights() {
        for (i, o, align, half) in [
            (8, 16, false, true),
            (8, 16, false, false),
            (5, 9, true, false),
            (16, 7, false, true),
            (1, 4, false, true),
        ] {
            let w = weights(i, o, align, half);
            for r in 0..o {
                assert_eq!(w[r * i..(r + 1) * i].iter().sum::<f64>(), 1024.0, "{i}→{o} row {r}");
            }
        }
        // 8 → 16 without half-pixel centres: output v samples input v/2.
        let w = weights(8, 16, false, false);
        let ramp: Vec<f64> = (0..8).map(|x| 2.0 * x as f64).collect();
        for v in 0..15 {
            let s: f64 = (0..8).map(|x| w[v * 8 + x] * ramp[x]).sum();
            assert_eq!(s, 1024.0 * v as f64, "position {v}");
        }
    }
}
