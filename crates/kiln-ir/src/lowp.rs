//! Exact conversions between the low-precision storage types and `f32`.
//!
//! Every element of a type of 8 bits or fewer is handled as a *code*: the raw bits of one
//! element, right-aligned in a `u8` (4-bit codes in the low nibble, 6-bit codes in the low six
//! bits; higher bits are ignored on decode and zero on encode). [`decode`] gives the exact
//! `f32` value of a code (every value of these types is an `f32`); [`encode`] rounds an `f32`
//! to a code.
//!
//! Rounding is round-to-nearest, ties-to-even, done once, on the integer bits of the `f32`
//! (no intermediate `f64`, no double rounding), including results in the subnormal range.
//! Overflow is decided IEEE-style: a value overflows when its rounded magnitude, computed with
//! an unbounded exponent range, is above the largest finite value (so for `f8E4M3FN`, 464 —
//! the midpoint between 448 and the missing 480 — rounds to even, 448, and only values above
//! it overflow).
//!
//! Special values, per type (`saturate` is the attribute of ONNX `Cast` / `QuantizeLinear`):
//!
//! | input                 | E4M3FN    | E4M3FNUZ  | E5M2      | E5M2FNUZ  |
//! |-----------------------|-----------|-----------|-----------|-----------|
//! | -0                    | -0 (0x80) | +0 (0x00) | -0 (0x80) | +0 (0x00) |
//! | tiny < 0, rounds to 0 | -0        | +0        | -0        | +0        |
//! | NaN                   | ±0x7F     | 0x80      | ±0x7F     | 0x80      |
//! | ±Inf, saturate        | ±max      | ±max      | ±max      | ±max      |
//! | ±Inf, no saturate     | ±NaN      | NaN       | ±Inf      | NaN       |
//! | overflow, saturate    | ±max      | ±max      | ±max      | ±max      |
//! | overflow, no saturate | ±NaN      | NaN       | ±Inf      | NaN       |
//!
//! (±NaN: the NaN code with the input's sign bit. ±Inf with `saturate` clamps to ±max for the
//! FNUZ types too, as ONNX's reference conversion does; the table in the ONNX `Cast` text lists
//! NaN there.)
//!
//! The OCP MX types and the 4-bit integers have no infinities, so `saturate` does not apply to
//! them: they always clamp.
//! - `f6E3M2FN` (bias 3, max 28) and `f4E2M1FN` (bias 1, max 6): ±Inf and overflow give ±max;
//!   NaN (which the OCP spec leaves implementation-defined) gives the zero of the *other*
//!   sign — a NaN with its sign bit clear gives -0, one with it set +0 — as `ml_dtypes`
//!   converts (and so ONNX's reference implementation and its test data); -0 and negative
//!   values that round to zero keep their sign (-0).
//! - `i4` / `u4`: round-to-nearest-even to an integer, clamped to `[-8, 7]` / `[0, 15]`;
//!   ±Inf clamp; NaN gives 0.
//! - `f8E8M0FNU` (value `2^(code-127)`, code 0xFF = NaN, no zero, no sign): see
//!   [`encode_e8m0`]; [`encode`] uses [`E8M0Rounding::Nearest`].

use crate::dtype::DType;

/// Parameters of a sign–exponent–mantissa minifloat.
struct MiniFloat {
    /// Mantissa (fraction) bits.
    man_bits: u32,
    /// Exponent bias.
    bias: i32,
    /// The sign bit (0x80, 0x20 or 0x08).
    sign: u8,
    /// The magnitude bits of the largest finite value (the codes of a sign are monotonic in
    /// their magnitude bits).
    max_mag: u8,
    /// IEEE-like: biased exponent all-ones is Inf (mantissa 0) or NaN.
    ieee: bool,
    /// Finite-only with all-ones exponent and mantissa as NaN (E4M3FN).
    nan_all_ones: bool,
    /// Unsigned zero: the negative-zero code is the only NaN.
    uz: bool,
}

const E4M3FN: MiniFloat =
    MiniFloat { man_bits: 3, bias: 7, sign: 0x80, max_mag: 0x7E, ieee: false, nan_all_ones: true, uz: false };
const E4M3FNUZ: MiniFloat =
    MiniFloat { man_bits: 3, bias: 8, sign: 0x80, max_mag: 0x7F, ieee: false, nan_all_ones: false, uz: true };
const E5M2: MiniFloat =
    MiniFloat { man_bits: 2, bias: 15, sign: 0x80, max_mag: 0x7B, ieee: true, nan_all_ones: false, uz: false };
const E5M2FNUZ: MiniFloat =
    MiniFloat { man_bits: 2, bias: 16, sign: 0x80, max_mag: 0x7F, ieee: false, nan_all_ones: false, uz: true };
const E3M2: MiniFloat =
    MiniFloat { man_bits: 2, bias: 3, sign: 0x20, max_mag: 0x1F, ieee: false, nan_all_ones: false, uz: false };
const E2M1: MiniFloat =
    MiniFloat { man_bits: 1, bias: 1, sign: 0x08, max_mag: 0x07, ieee: false, nan_all_ones: false, uz: false };

fn minifloat(dtype: DType) -> Option<&'static MiniFloat> {
    match dtype {
        DType::F8E4M3FN => Some(&E4M3FN),
        DType::F8E4M3FNUZ => Some(&E4M3FNUZ),
        DType::F8E5M2 => Some(&E5M2),
        DType::F8E5M2FNUZ => Some(&E5M2FNUZ),
        DType::F6E3M2FN => Some(&E3M2),
        DType::F4E2M1FN => Some(&E2M1),
        _ => None,
    }
}

/// `2^k` as an `f32`, exact for `-149 <= k <= 127`.
fn pow2(k: i32) -> f32 {
    if k >= -126 {
        f32::from_bits(((k + 127) as u32) << 23)
    } else {
        f32::from_bits(1u32 << (k + 149))
    }
}

/// An `f32` NaN carrying the given sign.
fn nan(negative: bool) -> f32 {
    if negative {
        -f32::NAN
    } else {
        f32::NAN
    }
}

/// The exact `f32` value of one element code of a low-precision float or 4-bit integer dtype.
///
/// Only the code's own bits are read (the low 4 bits of `f4E2M1FN`, `i4`, `u4`; the low 6 bits
/// of `f6E3M2FN`). NaN codes decode to a NaN with the code's sign bit (FNUZ: positive).
/// Dtypes that are not stored as codes of at most 8 bits (`f32`, `i8`, `bool`, …) are not
/// handled here and decode to NaN.
pub fn decode(dtype: DType, code: u8) -> f32 {
    match dtype {
        DType::I4 => (((code << 4) as i8) >> 4) as f32,
        DType::U4 => (code & 0xF) as f32,
        DType::F8E8M0FNU => {
            if code == 0xFF {
                f32::NAN
            } else {
                pow2(code as i32 - 127)
            }
        }
        _ => match minifloat(dtype) {
            Some(f) => decode_minifloat(f, code),
            None => f32::NAN,
        },
    }
}

fn decode_minifloat(f: &MiniFloat, code: u8) -> f32 {
    let code = code & (f.sign | (f.sign - 1));
    let negative = code & f.sign != 0;
    let mag = code & !f.sign;
    if f.uz && code == f.sign {
        return f32::NAN;
    }
    if f.nan_all_ones && mag == f.sign - 1 {
        return nan(negative);
    }
    let exp = (mag >> f.man_bits) as i32;
    let man = (mag & ((1u8 << f.man_bits) - 1)) as u32;
    if f.ieee && mag > f.max_mag {
        // Biased exponent all ones.
        return if man == 0 {
            if negative {
                f32::NEG_INFINITY
            } else {
                f32::INFINITY
            }
        } else {
            nan(negative)
        };
    }
    // value = significand * 2^(exponent of its last bit); both factors exact in f32.
    let (significand, lsb_exp) = if exp == 0 {
        (man, 1 - f.bias - f.man_bits as i32)
    } else {
        ((1u32 << f.man_bits) | man, exp - f.bias - f.man_bits as i32)
    };
    let v = significand as f32 * pow2(lsb_exp);
    if negative {
        -v
    } else {
        v
    }
}

/// The code nearest to `x` (round-to-nearest-even), following the dtype's saturation/NaN
/// rules (see the module docs for the full table).
///
/// `saturate` only matters for the f8 types (finite overflow and ±Inf) and `f8E8M0FNU`; the
/// OCP MX types and 4-bit integers always clamp. Dtypes that are not stored as codes of at
/// most 8 bits are not handled here and encode to 0.
pub fn encode(dtype: DType, x: f32, saturate: bool) -> u8 {
    match dtype {
        DType::I4 => (encode_int(x, -8.0, 7.0) as u8) & 0xF,
        DType::U4 => encode_int(x, 0.0, 15.0) as u8,
        DType::F8E8M0FNU => encode_e8m0(x, saturate, E8M0Rounding::Nearest),
        _ => match minifloat(dtype) {
            Some(f) => encode_minifloat(f, x, saturate),
            None => 0,
        },
    }
}

/// Round-to-nearest-even of `x` to an integer, clamped to `[lo, hi]` (NaN → 0).
fn encode_int(x: f32, lo: f32, hi: f32) -> i32 {
    if x.is_nan() {
        return 0;
    }
    // Clamping first is exact (lo and hi are integers), then rounding stays in range.
    x.clamp(lo, hi).round_ties_even() as i32
}

fn encode_minifloat(f: &MiniFloat, x: f32, saturate: bool) -> u8 {
    let bits = x.to_bits();
    let negative = bits >> 31 != 0;
    let sign = if negative { f.sign } else { 0 };
    let biased = ((bits >> 23) & 0xFF) as i32;
    let frac = bits & 0x7F_FFFF;
    let has_special = f.ieee || f.nan_all_ones || f.uz;
    // NaN code: sign-carrying all-ones for E4M3FN and E5M2, the lone 0x80 for FNUZ, and for the
    // OCP types (no NaN) the zero of the other sign (ml_dtypes' conversion).
    let nan_code = if f.uz {
        f.sign
    } else if has_special {
        sign | (f.sign - 1)
    } else {
        sign ^ f.sign
    };
    let overflow_code = if saturate || !has_special {
        sign | f.max_mag
    } else if f.ieee {
        sign | (f.max_mag + 1) // Inf: all-ones exponent, zero mantissa
    } else {
        nan_code
    };
    if biased == 0xFF {
        return if frac != 0 { nan_code } else { overflow_code };
    }
    // |x| = sig * 2^lsb_exp exactly.
    let (sig, lsb_exp) = if biased == 0 { (frac, -149) } else { (frac | 0x80_0000, biased - 150) };
    if sig == 0 {
        return if f.uz { 0 } else { sign };
    }
    let man_bits = f.man_bits as i32;
    let emin = 1 - f.bias;
    // floor(log2 |x|), then the exponent of the target's last mantissa bit at that binade
    // (subnormal targets share emin's spacing).
    let e = lsb_exp + (31 - sig.leading_zeros() as i32);
    let binade = e.max(emin);
    let shift = binade - man_bits - lsb_exp; // >= 1 for every type here (f32 is wider)
    let q = round_shift_rne(sig, shift);
    // Codes are monotonic: the code magnitude is (binade - emin) << man_bits plus the rounded
    // significand, which carries into the exponent field naturally.
    let mag = (((binade - emin) as i64) << man_bits) + q as i64;
    if mag > f.max_mag as i64 {
        return overflow_code;
    }
    if mag == 0 && f.uz {
        return 0;
    }
    sign | mag as u8
}

/// `sig / 2^shift` rounded to nearest, ties to even (`shift >= 1`).
fn round_shift_rne(sig: u32, shift: i32) -> u32 {
    if shift >= 26 {
        // sig < 2^24 < half of 2^shift: rounds to zero.
        return 0;
    }
    if shift <= 0 {
        return sig << (-shift).min(31);
    }
    let s = shift as u32;
    let q = sig >> s;
    let rem = sig & ((1u32 << s) - 1);
    let half = 1u32 << (s - 1);
    if rem > half || (rem == half && q & 1 == 1) {
        q + 1
    } else {
        q
    }
}

/// How [`encode_e8m0`] picks a power of two for a value between two of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum E8M0Rounding {
    /// The nearer power of two in linear value; the midpoint `1.5 * 2^k` goes up to `2^(k+1)`.
    /// This is ONNX `Cast`'s `round_mode = "nearest"` ("ties round up") and what [`encode`] uses.
    Nearest,
    /// The next power of two at or above the value (ONNX `round_mode = "up"`, its default).
    Up,
    /// The power of two at or below the value (ONNX `round_mode = "down"`).
    Down,
}

impl From<crate::attrs::E8M0RoundMode> for E8M0Rounding {
    fn from(m: crate::attrs::E8M0RoundMode) -> Self {
        use crate::attrs::E8M0RoundMode as M;
        match m {
            M::Up => E8M0Rounding::Up,
            M::Down => E8M0Rounding::Down,
            M::Nearest => E8M0Rounding::Nearest,
        }
    }
}

/// Encodes `x` as `f8E8M0FNU` (value `2^(code-127)`, codes 0..=0xFE; 0xFF is NaN).
///
/// - NaN → 0xFF.
/// - Positive finite values round to a power of two by `mode`. Results below the smallest
///   value `2^-127` give code 0 (there is no zero to underflow to); results above `2^127`
///   overflow: code 0xFE with `saturate`, else 0xFF.
/// - +Inf → 0xFE with `saturate`, else 0xFF.
/// - ±0 → code 0 (nearest value, as an underflow).
/// - Negative values and -Inf (the type has no sign) → code 0 with `saturate`, else 0xFF.
pub fn encode_e8m0(x: f32, saturate: bool, mode: E8M0Rounding) -> u8 {
    let bits = x.to_bits();
    let biased = ((bits >> 23) & 0xFF) as i32;
    let frac = bits & 0x7F_FFFF;
    if biased == 0xFF && frac != 0 {
        return 0xFF;
    }
    if bits & 0x7FFF_FFFF == 0 {
        return 0;
    }
    if bits >> 31 != 0 {
        return if saturate { 0 } else { 0xFF };
    }
    if biased == 0xFF {
        return if saturate { 0xFE } else { 0xFF };
    }
    // x = 2^e * (1 + r), 0 <= r < 1; `above` = r != 0, `upper_half` = r >= 1/2.
    let (e, above, upper_half) = if biased == 0 {
        let top = 31 - frac.leading_zeros() as i32; // position of the leading bit
        let rest = frac & !(1u32 << top);
        let upper = top >= 1 && (frac >> (top - 1)) & 1 == 1;
        (top - 149, rest != 0, upper)
    } else {
        (biased - 127, frac != 0, frac & 0x40_0000 != 0)
    };
    let e = match mode {
        E8M0Rounding::Nearest => e + upper_half as i32,
        E8M0Rounding::Up => e + above as i32,
        E8M0Rounding::Down => e,
    };
    let code = e + 127;
    if code < 0 {
        0
    } else if code > 0xFE {
        if saturate {
            0xFE
        } else {
            0xFF
        }
    } else {
        code as u8
    }
}

// ---- Rounding once from f64 -------------------------------------------------

/// Largest finite bfloat16.
pub const BF16_MAX: f64 = 3.389_531_389_251_535_5e38;

/// `x` rounded to nearest even in a binary format with `p` significand bits
/// (implicit bit included), minimum normal exponent `emin` (gradual underflow) and
/// largest finite value `max`; overflow gives ±inf. NaN and ±inf pass through.
pub fn round_binary(x: f64, p: i32, emin: i32, max: f64) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    let biased = ((x.to_bits() >> 52) & 0x7ff) as i32;
    let e = (biased - 1023).max(emin);
    let ulp = pow2_f64(e - (p - 1));
    let r = (x / ulp).round_ties_even() * ulp;
    if r.abs() > max {
        f64::INFINITY.copysign(x)
    } else {
        r
    }
}

/// 2^e as an exact `f64` for `e` in the normal range.
fn pow2_f64(e: i32) -> f64 {
    f64::from_bits(((e + 1023) as u64) << 52)
}

/// `x` rounded to `f32` with round-to-odd: exact values stay, inexact ones take the
/// neighbour whose last significand bit is 1. A later round-to-nearest to a format
/// of at most 22 significand bits then rounds as if directly from `x`.
pub fn f64_to_f32_odd(x: f64) -> f32 {
    let f = x as f32;
    if !f.is_finite() || f as f64 == x || f.to_bits() & 1 == 1 {
        return f;
    }
    if (f as f64) > x {
        f.next_down()
    } else {
        f.next_up()
    }
}

/// An integer as `f64` with round-to-odd (exact up to 2^53); see [`f64_to_f32_odd`].
pub fn int_to_f64_odd(v: i128) -> f64 {
    let f = v as f64;
    let back = f as i128;
    if back == v || f.to_bits() & 1 == 1 {
        f
    } else if back > v {
        f.next_down()
    } else {
        f.next_up()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_known_values() {
        // Hand-computed from the formats' definitions.
        assert_eq!(decode(DType::F8E4M3FN, 0x7E), 448.0);
        assert_eq!(decode(DType::F8E4M3FN, 0x01), 1.0 / 512.0);
        assert_eq!(decode(DType::F8E4M3FN, 0x38), 1.0);
        assert_eq!(decode(DType::F8E4M3FN, 0xC0), -2.0);
        assert!(decode(DType::F8E4M3FN, 0x7F).is_nan());
        assert!(decode(DType::F8E4M3FN, 0xFF).is_nan());
        assert_eq!(decode(DType::F8E4M3FNUZ, 0x7F), 240.0);
        assert_eq!(decode(DType::F8E4M3FNUZ, 0x01), 1.0 / 1024.0);
        assert_eq!(decode(DType::F8E4M3FNUZ, 0x40), 1.0);
        assert!(decode(DType::F8E4M3FNUZ, 0x80).is_nan());
        assert_eq!(decode(DType::F8E5M2, 0x7B), 57344.0);
        assert_eq!(decode(DType::F8E5M2, 0x7C), f32::INFINITY);
        assert_eq!(decode(DType::F8E5M2, 0xFC), f32::NEG_INFINITY);
        assert_eq!(decode(DType::F8E5M2, 0x01), 1.0 / 65536.0);
        assert!(decode(DType::F8E5M2, 0x7D).is_nan());
        assert_eq!(decode(DType::F8E5M2FNUZ, 0x7F), 57344.0);
        assert_eq!(decode(DType::F8E5M2FNUZ, 0x01), 1.0 / 131072.0);
        assert_eq!(decode(DType::F8E8M0FNU, 127), 1.0);
        assert_eq!(decode(DType::F8E8M0FNU, 0), f32::from_bits(0x0040_0000));
        assert_eq!(decode(DType::F8E8M0FNU, 0xFE), 2f32.powi(127));
        assert_eq!(decode(DType::F6E3M2FN, 0x1F), 28.0);
        assert_eq!(decode(DType::F6E3M2FN, 0x01), 0.0625);
        assert_eq!(decode(DType::F6E3M2FN, 0x3F), -28.0);
        let f4: Vec<f32> = (0..16).map(|c| decode(DType::F4E2M1FN, c)).collect();
        assert_eq!(f4, [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]);
        assert_eq!(decode(DType::I4, 0x8), -8.0);
        assert_eq!(decode(DType::I4, 0xF), -1.0);
        assert_eq!(decode(DType::I4, 0x7), 7.0);
        assert_eq!(decode(DType::U4, 0xF), 15.0);
    }

    #[test]
    fn encode_known_values() {
        assert_eq!(encode(DType::F8E4M3FN, 448.0, false), 0x7E);
        assert_eq!(encode(DType::F8E4M3FN, 464.0, false), 0x7E); // tie to even
        assert_eq!(encode(DType::F8E4M3FN, 465.0, false), 0x7F);
        assert_eq!(encode(DType::F8E4M3FN, 1e6, true), 0x7E);
        assert_eq!(encode(DType::F8E4M3FN, -1e6, true), 0xFE);
        assert_eq!(encode(DType::F8E4M3FN, -0.0, true), 0x80);
        assert_eq!(encode(DType::F8E4M3FN, 1.0 / 1024.0, true), 0x00); // tie 0 vs 2^-9
        assert_eq!(encode(DType::F8E4M3FN, 3.0 / 1024.0, true), 0x02); // tie 1 vs 2 sub
        assert_eq!(encode(DType::F8E4M3FNUZ, -1e-30, true), 0x00);
        assert_eq!(encode(DType::F8E4M3FNUZ, f32::NAN, true), 0x80);
        assert_eq!(encode(DType::F8E4M3FNUZ, f32::NEG_INFINITY, true), 0xFF);
        assert_eq!(encode(DType::F8E4M3FNUZ, f32::INFINITY, false), 0x80);
        assert_eq!(encode(DType::F8E5M2, f32::INFINITY, false), 0x7C);
        assert_eq!(encode(DType::F8E5M2, f32::INFINITY, true), 0x7B);
        assert_eq!(encode(DType::F8E5M2, 61440.0, false), 0x7C); // tie 57344/61440, max is odd
        assert_eq!(encode(DType::F8E5M2, 61439.0, false), 0x7B);
        assert_eq!(encode(DType::F8E5M2FNUZ, 1e9, false), 0x80);
        assert_eq!(encode(DType::F6E3M2FN, 30.0, false), 0x1F);
        // No NaN: the zero of the other sign (ml_dtypes).
        assert_eq!(encode(DType::F6E3M2FN, f32::NAN, false), 0x20);
        assert_eq!(encode(DType::F4E2M1FN, -f32::NAN, true), 0x0);
        assert_eq!(encode(DType::F6E3M2FN, -0.0, false), 0x20);
        assert_eq!(encode(DType::F4E2M1FN, 5.0, true), 0x6); // tie 4 vs 6 -> 4 (even)
        assert_eq!(encode(DType::F4E2M1FN, 2.5, true), 0x4); // tie 2 vs 3 -> 2
        assert_eq!(encode(DType::F4E2M1FN, 0.25, true), 0x0); // tie 0 vs 0.5 -> 0
        assert_eq!(encode(DType::F4E2M1FN, -7.0, true), 0xF);
        assert_eq!(encode(DType::I4, 2.5, true), 2);
        assert_eq!(encode(DType::I4, -2.5, true), 0xE);
        assert_eq!(encode(DType::I4, -100.0, true), 0x8);
        assert_eq!(encode(DType::I4, f32::NAN, true), 0);
        assert_eq!(encode(DType::U4, 15.5, true), 15);
        assert_eq!(encode(DType::U4, -3.0, true), 0);
    }

    #[test]
    fn e8m0_rounding_modes() {
        use E8M0Rounding::*;
        assert_eq!(encode_e8m0(1.0, true, Nearest), 127);
        assert_eq!(encode_e8m0(1.5, true, Nearest), 128);
        assert_eq!(encode_e8m0(1.4999999, true, Nearest), 127);
        assert_eq!(encode_e8m0(1.0000001, true, Up), 128);
        assert_eq!(encode_e8m0(1.9999999, true, Down), 127);
        assert_eq!(encode_e8m0(f32::MAX, true, Nearest), 0xFE);
        assert_eq!(encode_e8m0(f32::MAX, false, Nearest), 0xFF);
        assert_eq!(encode_e8m0(f32::INFINITY, true, Nearest), 0xFE);
        assert_eq!(encode_e8m0(f32::INFINITY, false, Nearest), 0xFF);
        assert_eq!(encode_e8m0(-1.0, true, Nearest), 0);
        assert_eq!(encode_e8m0(-1.0, false, Nearest), 0xFF);
        assert_eq!(encode_e8m0(0.0, false, Nearest), 0);
        assert_eq!(encode_e8m0(f32::NAN, true, Nearest), 0xFF);
        assert_eq!(encode_e8m0(f32::from_bits(1), true, Nearest), 0);
        // 1.5 * 2^-127 (an f32 subnormal) is the midpoint between codes 0 and 1.
        assert_eq!(encode_e8m0(f32::from_bits(0x0060_0000), true, Nearest), 1);
        assert_eq!(encode_e8m0(f32::from_bits(0x005F_FFFF), true, Nearest), 0);
        assert_eq!(encode_e8m0(f32::from_bits(0x0040_0001), true, Up), 1);
    }
}
