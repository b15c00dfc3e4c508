//! TFLite's integer requantisation, as a reference: what LiteRT's int8 kernels do to turn
//! an int32 accumulator into an int8 output, and int8 FULLY_CONNECTED and CONV_2D built on
//! it (per-channel int8 weights with zero point 0, int32 bias, NHWC / OHWI layouts).
//!
//! TFLite never multiplies by the real scale `input scale × weight scale / output scale`
//! in float: it turns that scale into an int32 multiplier with the binary point at bit 31
//! and a power-of-two shift ([`quantize_multiplier`]), and applies them in integers:
//!
//! - [`Rounding::Double`]: `SaturatingRoundingDoublingHighMul` then `RoundingDivideByPOT`
//!   (gemmlowp's; TFLite's `MultiplyByQuantizedMultiplier` by default). It rounds twice:
//!   the high half of the doubled product (ties toward +∞), then the shift (ties away
//!   from zero).
//!   LiteRT's reference CONV_2D kernel gives exactly this.
//! - [`Rounding::Single`]: one 64-bit product and one rounding shift, half up (TFLite built
//!   with `TFLITE_SINGLE_ROUNDING`). LiteRT 2.3's reference FULLY_CONNECTED kernel agrees
//!   with it on the test data (crates/kiln-ref/tests/tflite_requant.rs).
//! - [`Rounding::Float`]: the product in f32, rounded half to even (ONNX Runtime's MLAS
//!   requantisation): the ONNX-style form, kept to count how often it lands a step away.
//!
//! Then the output zero point is added and the result clamped to the activation range.
//! This module is an oracle: it shares nothing with the compiler.

/// How an int32 accumulator is scaled to the output's grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// TFLite's default: two roundings (ties toward +∞, then away from zero).
    Double,
    /// TFLite with `TFLITE_SINGLE_ROUNDING`: one rounding, half up.
    Single,
    /// f32 product, half to even (ONNX Runtime's form).
    Float,
}

/// `frexp`: `x = m · 2^e` with `0.5 ≤ |m| < 1` (x finite and non-zero).
fn frexp(x: f64) -> (f64, i32) {
    let bits = x.to_bits();
    let exp = ((bits >> 52) & 0x7ff) as i32;
    if exp == 0 {
        // Subnormal: scale into the normal range first.
        let (m, e) = frexp(x * 2f64.powi(64));
        return (m, e - 64);
    }
    let m = f64::from_bits((bits & !(0x7ffu64 << 52)) | (1022u64 << 52));
    (m, exp - 1022)
}

/// TFLite's `QuantizeMultiplier`: the int32 multiplier (binary point at bit 31) and the
/// shift (positive: left) with `real ≈ multiplier · 2^(shift − 31)`. Zero for a real
/// multiplier of zero or below 2⁻³¹ (as TFLite).
pub fn quantize_multiplier(real: f64) -> (i32, i32) {
    if real == 0.0 || !real.is_finite() {
        return (0, 0);
    }
    let (q, mut shift) = frexp(real);
    // TfLiteRound: half away from zero, as f64::round.
    let mut fixed = (q * (1u64 << 31) as f64).round() as i64;
    if fixed == 1i64 << 31 {
        fixed /= 2;
        shift += 1;
    }
    if shift < -31 {
        return (0, 0);
    }
    (fixed as i32, shift)
}

/// gemmlowp's `SaturatingRoundingDoublingHighMul`: the high 32 bits of `2·a·b`, rounded to
/// nearest with ties toward +∞ (its nudge, then a division that truncates toward zero);
/// `i32::MIN · i32::MIN` saturates to `i32::MAX`.
pub fn saturating_rounding_doubling_high_mul(a: i32, b: i32) -> i32 {
    if a == i32::MIN && b == i32::MIN {
        return i32::MAX;
    }
    let ab = a as i64 * b as i64;
    let nudge: i64 = if ab >= 0 { 1 << 30 } else { 1 - (1 << 30) };
    // Integer division truncates toward zero, as C++'s.
    ((ab + nudge) / (1i64 << 31)) as i32
}

/// gemmlowp's `RoundingDivideByPOT`: `x / 2^exponent` rounded half away from zero
/// (`exponent` in 0..=31).
pub fn rounding_divide_by_pot(x: i32, exponent: u32) -> i32 {
    let mask = ((1i64 << exponent) - 1) as i32 as i64;
    let remainder = x as i64 & mask;
    let threshold = (mask >> 1) + i64::from(x < 0);
    ((x as i64 >> exponent) + i64::from(remainder > threshold)) as i32
}

/// TFLite's `MultiplyByQuantizedMultiplier` (double rounding): `x · m · 2^(shift − 31)`.
pub fn multiply_by_quantized_multiplier(x: i32, multiplier: i32, shift: i32) -> i32 {
    let left = shift.max(0) as u32;
    let right = (-shift).max(0) as u32;
    rounding_divide_by_pot(saturating_rounding_doubling_high_mul(x.wrapping_shl(left), multiplier), right)
}

/// The same with `TFLITE_SINGLE_ROUNDING`: `(x · m + 2^(30 − shift)) >> (31 − shift)`.
pub fn multiply_by_quantized_multiplier_single(x: i32, multiplier: i32, shift: i32) -> i32 {
    let total = (31 - shift).clamp(1, 62) as u32;
    let round = 1i64 << (total - 1);
    ((x as i64 * multiplier as i64 + round) >> total) as i32
}

/// One accumulator scaled by `scale` (input scale × weight scale / output scale, as TFLite
/// computes it in f64 from the f32 scales), with `rounding`, the zero point added and the
/// result clamped to `[lo, hi]`.
pub fn requantize(acc: i32, scale: f64, rounding: Rounding, zero_point: i32, lo: i32, hi: i32) -> i32 {
    let v = match rounding {
        Rounding::Double => {
            let (m, s) = quantize_multiplier(scale);
            multiply_by_quantized_multiplier(acc, m, s)
        }
        Rounding::Single => {
            let (m, s) = quantize_multiplier(scale);
            multiply_by_quantized_multiplier_single(acc, m, s)
        }
        Rounding::Float => (acc as f32 * scale as f32).round_ties_even() as i32,
    };
    v.saturating_add(zero_point).clamp(lo, hi)
}

/// The per-channel scales TFLite requantises with: `input_scale · weight_scale[c] /
/// output_scale`, in f64 from the model's f32 scales.
pub fn channel_scales(input_scale: f32, weight_scales: &[f32], output_scale: f32) -> Vec<f64> {
    weight_scales.iter().map(|&w| input_scale as f64 * w as f64 / output_scale as f64).collect()
}

/// The quantisation of an int8 contraction: zero points, per-output-channel scales (see
/// [`channel_scales`]), the activation range and the rounding.
#[derive(Clone, Debug)]
pub struct Requant {
    /// The input's zero point.
    pub input_zero_point: i32,
    /// The output's zero point.
    pub output_zero_point: i32,
    /// One scale per output channel.
    pub scales: Vec<f64>,
    /// The clamp (int8's range, or narrower for a fused activation).
    pub range: (i32, i32),
    /// How accumulators are scaled.
    pub rounding: Rounding,
}

impl Requant {
    fn out(&self, acc: i32, channel: usize) -> i8 {
        requantize(acc, self.scales[channel], self.rounding, self.output_zero_point, self.range.0, self.range.1) as i8
    }
}

/// int8 FULLY_CONNECTED: `input` [rows, depth], `weights` [outputs, depth] (zero point 0),
/// `bias` [outputs]; returns [rows, outputs]. The accumulator is int32, as TFLite's.
pub fn fully_connected(input: &[i8], depth: usize, weights: &[i8], bias: &[i32], q: &Requant) -> Vec<i8> {
    let outputs = bias.len();
    let mut out = Vec::with_capacity(input.len() / depth * outputs);
    for row in input.chunks_exact(depth) {
        for (o, w) in weights.chunks_exact(depth).enumerate() {
            let acc = row
                .iter()
                .zip(w)
                .fold(bias[o], |a, (&x, &w)| a.wrapping_add((x as i32 - q.input_zero_point) * w as i32));
            out.push(q.out(acc, o));
        }
    }
    out
}

/// The geometry of an int8 CONV_2D: input [n, h, w, c] (NHWC), weights [o, kh, kw, c] (OHWI).
#[derive(Clone, Copy, Debug)]
pub struct ConvShape {
    /// Input dims, NHWC.
    pub input: [usize; 4],
    /// Weight dims, OHWI.
    pub weights: [usize; 4],
    /// Stride, both directions.
    pub stride: usize,
    /// TFLite's SAME padding (else VALID).
    pub same: bool,
}

impl ConvShape {
    /// Output height and width, and the padding before each (top, left).
    pub fn output(&self) -> (usize, usize, usize, usize) {
        let [_, h, w, _] = self.input;
        let [_, kh, kw, _] = self.weights;
        let s = self.stride;
        if self.same {
            let (oh, ow) = (h.div_ceil(s), w.div_ceil(s));
            let ph = ((oh - 1) * s + kh).saturating_sub(h) / 2;
            let pw = ((ow - 1) * s + kw).saturating_sub(w) / 2;
            (oh, ow, ph, pw)
        } else {
            ((h - kh) / s + 1, (w - kw) / s + 1, 0, 0)
        }
    }
}

/// int8 CONV_2D (dilation 1): returns [n, oh, ow, o]. Padding contributes nothing (TFLite
/// pads with the input's zero point, i.e. zero after the offset).
pub fn conv2d(input: &[i8], weights: &[i8], bias: &[i32], shape: &ConvShape, q: &Requant) -> Vec<i8> {
    let [n, h, w, c] = shape.input;
    let [o, kh, kw, _] = shape.weights;
    let (oh, ow, ph, pw) = shape.output();
    let mut out = Vec::with_capacity(n * oh * ow * o);
    for b in 0..n {
        for y in 0..oh {
            for x in 0..ow {
                for oc in 0..o {
                    let mut acc = bias[oc];
                    for i in 0..kh {
                        let iy = (y * shape.stride + i).wrapping_sub(ph);
                        if iy >= h {
                            continue;
                        }
                        for j in 0..kw {
                            let ix = (x * shape.stride + j).wrapping_sub(pw);
                            if ix >= w {
                                continue;
                            }
                            let xin = &input[((b * h + iy) * w + ix) * c..][..c];
                            let wk = &weights[((oc * kh + i) * kw + j) * c..][..c];
                            for (&a, &k) in xin.iter().zip(wk) {
                                acc = acc.wrapping_add((a as i32 - q.input_zero_point) * k as i32);
                            }
                        }
                    }
                    out.push(q.out(acc, oc));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multiplier_of_powers_of_two_and_rounding_up_to_one() {
        assert_eq!(quantize_multiplier(0.5), (1 << 30, 0));
        assert_eq!(quantize_multiplier(1.0), (1 << 30, 1));
        assert_eq!(quantize_multiplier(0.75), (3 << 29, 0));
        assert_eq!(quantize_multiplier(0.25), (1 << 30, -1));
        // A mantissa that rounds to 2^31 becomes 2^30 with the shift one up.
        assert_eq!(quantize_multiplier(1.0 - 1e-12), (1 << 30, 1));
        assert_eq!(quantize_multiplier(0.0), (0, 0));
        assert_eq!(quantize_multiplier(1e-12), (0, 0)); // below 2^-31 (shift < -31)
    }

    #[test]
    fn gemmlowp_primitives() {
        assert_eq!(saturating_rounding_doubling_high_mul(i32::MIN, i32::MIN), i32::MAX);
        assert_eq!(saturating_rounding_doubling_high_mul(1 << 30, 1 << 30), 1 << 29);
        // 3 · 2^30 · 2 / 2^32 = 1.5 → 2; −1.5 → −1 (ties toward +∞); −1.625 → −2.
        assert_eq!(saturating_rounding_doubling_high_mul(3, 1 << 30), 2);
        assert_eq!(saturating_rounding_doubling_high_mul(-3, 1 << 30), -1);
        assert_eq!(saturating_rounding_doubling_high_mul(-13, 1 << 28), -2);
        assert_eq!(rounding_divide_by_pot(5, 1), 3);
        assert_eq!(rounding_divide_by_pot(-5, 1), -3);
        assert_eq!(rounding_divide_by_pot(4, 1), 2);
        assert_eq!(rounding_divide_by_pot(-7, 2), -2);
        assert_eq!(rounding_divide_by_pot(i32::MIN, 31), -1);
        assert_eq!(rounding_divide_by_pot(17, 0), 17);
    }

    /// Against exact arithmetic on the multiplier, on a seeded sweep: single rounding is
    /// within half a step of x·m·2^(shift−31); double rounding within half a step plus
    /// the first rounding's half unit, 2^(shift−1) steps (its known bias).
    #[test]
    fn both_roundings_are_within_half_a_step() {
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..20_000 {
            let x = (next() % (1 << 24)) as i32 - (1 << 23);
            let real = (next() % 1_000_000 + 1) as f64 * 1e-7; // (0, 0.1]
            let (m, sh) = quantize_multiplier(real);
            let exact = x as f64 * m as f64 * 2f64.powi(sh - 31);
            let single = multiply_by_quantized_multiplier_single(x, m, sh);
            assert!((single as f64 - exact).abs() <= 0.5 + 1e-9, "x {x} real {real}: {single} vs {exact}");
            let double = multiply_by_quantized_multiplier(x, m, sh);
            let bound = 0.5 + 2f64.powi(sh.min(0) - 1) + 1e-9;
            assert!((double as f64 - exact).abs() <= bound, "x {x} real {real}: {double} vs {exact}");
        }
    }

    #[test]
    fn ties_round_differently() {
        // 3 · 0.5 = 1.5: double rounding 2, single 2 (half up), float 2 (even).
        // −3 · 0.5 = −1.5: double −1 (its first rounding is the only one here: ties up),
        // single −1, float −2. 5 · 0.5 = 2.5: double 3, single 3, float 2.
        let r = |x, k| requantize(x, 0.5, k, 0, -128, 127);
        assert_eq!([r(3, Rounding::Double), r(3, Rounding::Single), r(3, Rounding::Float)], [2, 2, 2]);
        assert_eq!([r(-3, Rounding::Double), r(-3, Rounding::Single), r(-3, Rounding::Float)], [-1, -1, -2]);
        // With a right shift the second rounding decides: −3 · 0.25 = −0.75 → −1 both ways,
        // −6 · 0.25 = −1.5 → −2 (double: away from zero) against −1 (single: half up).
        let r4 = |x, k| requantize(x, 0.25, k, 0, -128, 127);
        assert_eq!([r4(-6, Rounding::Double), r4(-6, Rounding::Single), r4(-6, Rounding::Float)], [-2, -1, -2]);
        assert_eq!([r(5, Rounding::Double), r(5, Rounding::Single), r(5, Rounding::Float)], [3, 3, 2]);
        assert_eq!(requantize(1000, 0.5, Rounding::Double, 10, -128, 127), 127);
    }

    #[test]
    fn conv_of_ones_counts_the_taps_in_the_window() {
        // 3x3 SAME on 4x4 of ones (zero point 0), weights ones, scale 1: each output is the
        // number of taps inside the image: 4 in a corner, 6 on an edge, 9 inside.
        let shape = ConvShape { input: [1, 4, 4, 1], weights: [1, 3, 3, 1], stride: 1, same: true };
        let q = Requant {
            input_zero_point: 0,
            output_zero_point: 0,
            scales: vec![1.0],
            range: (-128, 127),
            rounding: Rounding::Double,
        };
        let out = conv2d(&[1; 16], &[1; 9], &[0], &shape, &q);
        assert_eq!(out, vec![4, 6, 6, 4, 6, 9, 9, 6, 6, 9, 9, 6, 4, 6, 6, 4]);
        let q = Requant { scales: vec![1.0; 2], ..q };
        let fc = fully_connected(&[1, 2, 3, 4], 2, &[1, 1, 2, -1], &[0, 1], &q);
        assert_eq!(fc, vec![3, 1, 7, 3]);
    }
}
