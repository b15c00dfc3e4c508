//! LiteRT's integer forms of int8 `MEAN`, `RESIZE_BILINEAR` and `BATCH_MATMUL`.
//!
//! Most int8 ops are imported in their QDQ form (dequantise, float op, quantise), which
//! lands within one quantisation step of LiteRT's builtin kernels; these three compute
//! otherwise in LiteRT, and their one-step differences compound through a network
//! (docs/tflite-testing.md, "Where the int8 steps come from"). Here they are built in
//! LiteRT's arithmetic instead, from operations whose results are exact: integers held in
//! f64 (every product and sum below 2⁵³), `Floor`, and a 32-bit integer product for
//! `BATCH_MATMUL`'s accumulator. The graph then means the same thing to the compiled path
//! and to the reference evaluator, with no rounding left to either.
//!
//! - **Fixed-point multiplication** ([`Importer::fixed_point`]): a real multiplier
//!   `M = q·2^(e−31)`, `q ∈ [2³⁰, 2³¹)` (TFLite's `QuantizeMultiplier`), applied to an
//!   integer `a` by double rounding (`SaturatingRoundingDoublingHighMul` rounding half up,
//!   then `RoundingDivideByPOT` rounding half away from zero) or by single rounding
//!   (`⌊(a·q + 2^(k−1)) / 2^k⌋`, `k = 31 − e`). `a·q` needs 62 bits, so it is split:
//!   with `q = q_h·2¹⁶ + q_l`, `a·q_h = u·2^(k−16) + v` (`u` by `Floor`, `0 ≤ v < 2^(k−16)`),
//!   `⌊(a·q + c) / 2^k⌋ = u + ⌊(v·2¹⁶ + a·q_l + c) / 2^k⌋`, every term below 2⁵³
//!   (where the accumulator's bound keeps `a·q` below 2⁵³, one product instead).
//! - **MEAN** of int8 over the spatial axes of a rank-4 tensor with `keep_dims` (LiteRT's
//!   optimised mean): `Σx` times `s_x / (N·s_y)` (f32) by single rounding, plus
//!   `z_y − round(z_x·s_x/s_y)` (f32, rounded half away from zero); any other int8
//!   MEAN: `Σ(x − z_x)` times `s_x / (s_y·N)` (f64) by double rounding, plus `z_y`.
//! - **RESIZE_BILINEAR** of int8 (input and output share their quantisation): 10-bit
//!   fixed-point source positions and weights on the raw integers,
//!   `Σ x·w_y·w_x` (weights summing to 2²⁰) divided by 2²⁰ rounding half away from zero.
//!   The weights are separable, so the sum is two passes of two gathered source
//!   positions each: along the width in f32 (every sum below 2¹⁹, exact), then along the
//!   height in f64 (below 2³⁰).
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
        self.emit1(op, Attrs::new(), vec![Some(a), Some(b)])
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

    /// f64 integers `v` plus `offset`, saturated to int8 and stored as tensor `out`
    /// (layout `lay`).
    fn store_int8(&mut self, out: usize, lay: &[usize], v: ValueId, offset: f64) -> Result<(), ImportError> {
        let v = if offset != 0.0 { self.with_scalar(OpKind::Add, v, offset)? } else { v };
        let (lo, hi) = (self.f64_scalar(-128.0)?, self.f64_scalar(127.0)?);
        let v = self.emit1(OpKind::Clip, Attrs::new(), vec![Some(v), Some(lo), Some(hi)])?;
        let v = self.cast(v, DType::I8)?;
        self.set_raw(out, lay, v);
        Ok(())
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
        let xf = self.cast(raw, DType::F64)?;
        let axes_v = self.i64s(held_axes);
        let attrs = Attrs::new().with("keepdims", Attr::Int(keep as i64));
        let sum = self.emit1(OpKind::ReduceSum, attrs, vec![Some(xf), Some(axes_v)])?;
        let out_lay = if keep { lay.to_vec() } else { identity(self.g.ty(sum).shape.rank()) };
        if spatial {
            // LiteRT's optimised mean: raw sum, single rounding, one bias (f32 arithmetic).
            let real = sx / (n as f32 * sy);
            let t = zx as f32 * sx / sy;
            let t = if t > 0.0 { t + 0.5 } else { t - 0.5 };
            let bias = zy - t.trunc() as i64;
            let Some(v) = self.fixed_point(sum, 128.0 * n as f64, real as f64, Rounding::Single)? else {
                return Ok(false);
            };
            self.store_int8(out, &out_lay, v, bias as f64)?;
        } else {
            let acc = self.with_scalar(OpKind::Sub, sum, (n as i64 * zx) as f64)?;
            let real = sx as f64 / (sy as f64 * n as f64);
            let Some(v) = self.fixed_point(acc, 255.0 * n as f64, real, Rounding::Double)? else { return Ok(false) };
            self.store_int8(out, &out_lay, v, zy as f64)?;
        }
        Ok(true)
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
        // Along the width in f32 (|x·w| sums below 2¹⁹: exact), then along the height
        // in f64 (below 2³⁰), each output position from its two source positions.
        let xf = self.cast(raw, DType::F32)?;
        let t = self.interpolate(xf, 3, &taps(*iw, ow, align, half), DType::F32)?;
        let tf = self.cast(t, DType::F64)?;
        let sum = self.interpolate(tf, 2, &taps(*ih, oh, align, half), DType::F64)?;
        // Σ / 2²⁰ rounded half away from zero.
        let w = self.with_scalar(OpKind::Mul, sum, 2f64.powi(-20))?;
        let m = self.emit1(OpKind::Abs, Attrs::new(), vec![Some(w)])?;
        let m = self.with_scalar(OpKind::Add, m, 0.5)?;
        let m = self.floor(m)?;
        let s = self.emit1(OpKind::Sign, Attrs::new(), vec![Some(w)])?;
        let v = self.binary(OpKind::Mul, s, m)?;
        self.store_int8(out, &NCHW, v, 0.0)?;
        Ok(true)
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
        let accf = self.cast(acc, DType::F64)?;
        let real = sa as f64 * sb as f64 / sy as f64;
        let Some(v) = self.fixed_point(accf, k as f64 * 65025.0, real, Rounding::Double)? else { return Ok(false) };
        let r = self.g.ty(v).shape.rank();
        self.store_int8(out, &identity(r), v, zy as f64)?;
        Ok(true)
    }
}

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
