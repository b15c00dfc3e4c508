//! Accurate transcendental sequences of the expression evaluator: f32 and f64 `log`,
//! f64 `exp`, f32 and f64 `pow`, f32 `asin`, `acos`, `atan`, and exact f32 and f64
//! `fmod`.
//!
//! Every sequence here is built from IEEE operations that round once (`add/sub/mul/
//! div/sqrt.rn`, `fma.rn`, exact conversions and bit manipulation), never from the
//! `.approx` instructions: what the host PTX simulator computes for them is what the
//! GPU computes, bit for bit, so the error bounds below are measured by
//! `tests/cuda_math.rs` on the simulator, not assumed. Polynomials are truncated
//! Taylor series of arguments reduced far enough that the first dropped term is
//! below the format's rounding (each states where); no fitted coefficients.
//!
//! - `log` (f32 and f64): `x = 2^e · m` with `m ∈ [√½, √2)` (subnormals scaled by
//!   `2^23`/`2^54` first), `f = m − 1` exact, and, as in fdlibm/musl,
//!   `log x = e·ln2_hi + (f − f²/2 + s·(f²/2 + R(s²)) + e·ln2_lo)` with
//!   `s = f/(2 + f)` and `R(z) = 2z/3 + 2z²/5 + …`, the series of `2·atanh(s) − 2s`
//!   divided by `s` (`z ≤ 0.0295`: 5 terms for f32, 10 for f64). `ln2_hi` has
//!   trailing zeros so `e·ln2_hi` is exact. Relative error about 1 ulp over the
//!   whole range (`log(1 + tiny)` included, which `lg2.approx`'s absolute error of
//!   2⁻²² loses); 0 → −∞, negative and NaN → NaN, +∞ → +∞.
//! - `exp` (f64): `n = round(x·log2 e)`, `r = x − n·ln2` in two parts by FMA
//!   (Cody–Waite), `e^r` by its Taylor series to `r¹³/13!` (`|r| ≤ 0.35`: the next
//!   term is below 2⁻⁵⁸), times `2^⌊n/2⌋·2^⌈n/2⌉` (two normal factors; underflow
//!   rounds once, in the second product); a few ulp.
//! - `pow`, in f64 (an f32 pow converts its operands exactly and rounds once at the
//!   end): an integer `|y| ≤ 64` by binary powering of `x` (exact wherever the
//!   powers are, so integer results such as `3⁶` are exact; relative error at most
//!   `(|y| − 1)·2⁻⁵³`), `1/x^|y|` for a negative `y`; otherwise, and where `x^|y|` is
//!   not a normal f64, `e^(y·ln|x|)` with the two sequences above, the sign of an odd
//!   integer power of a negative `x`; NaN for a negative finite `x` and non-integer
//!   `y`, and the special cases of C's `pow` (`x^0 = 1` and `1^y = 1` even for NaN,
//!   `(−1)^±∞ = 1`, `x^1 = x`, `x^2 = x·x`, `x^½ = √(x + 0)` but for −∞). f32: the
//!   f64 value's error is below 2⁻⁴³ relative where the result is a finite f32, so
//!   the one rounding to f32 is correct but within 2⁻¹⁹ ulp of a tie (an exact result of 25 significant bits, such as
//!   `7.5625^3.5`, may round to the wrong neighbour). f64: within `|y| + 1` ulp by
//!   powering, else within `2·|y·ln x| + 4` ulp (the product `y·ln x` and `ln x` each
//!   carry a relative error of about 2⁻⁵³, which the exponential turns into that many
//!   ulp of the result).
//!   A constant exponent is decided at compile time (`pow_const`): 0, 1, 2 and ½ in
//!   the type itself, other integers up to 64 by unrolled powering with the general
//!   sequence behind a branch taken only where the power is not a normal f64: the
//!   same values, without the f64 logarithm and exponential on every element.
//! - `atan` (f32), fdlibm's reduction: `|x|` below 7/16 as it is, below 11/16
//!   `atan ½ + atan((2|x| − 1)/(2 + |x|))`, below 19/16 `π/4 + atan((|x| − 1)/(|x| +
//!   1))`, below 39/16 `atan 1.5 + atan((|x| − 1.5)/(1 + 1.5|x|))`, past it
//!   `π/2 + atan(−1/|x|)` (numerators exact, the bases in two parts); the reduced `u`
//!   has `|u| ≤ 7/16`, where the odd Taylor series to `u²¹/21` is complete to 2⁻²⁸; the
//!   sign of `x`.
//! - `asin`/`acos` (f32): `|x| ≤ ½`: the series of `asin` (`x²` ≤ ¼, to `x²⁵`, complete
//!   to 2⁻³³); past ½ through `asin |x| = π/2 − 2·asin(√((1 − |x|)/2))` (the square
//!   root's argument is exact, and its
//!   rounding is put back: `√w = s + (w − s²)/2s` with the residual from an FMA), `acos x = π/2 − asin x` near 0, `2·asin(√((1−x)/2))`
//!   for `x > ½` and `π − 2·asin(√((1+x)/2))` for `x < −½`, each difference ordered so
//!   that only its last operation rounds at the result's scale. |x| > 1 → NaN.
//! - `asinh`, `acosh`, `atanh` (f32), fdlibm's forms through `log1p u = log w +
//!   (u − (w − 1))/w` (`w = 1 + u` rounded): `asinh` below 2 as
//!   `log1p(|x| + x²/(1 + √(1 + x²)))`, `acosh` below 2 as `log1p(t + √(2t + t²))`
//!   with `t = x − 1` exact, `atanh` as `½·log1p(2|x|/(1 − |x|))`, and
//!   `log(x + √(x² ± 1))` up to 2²⁸, `log x + ln 2` past it: relative precision near
//!   0 (and near 1 for `acosh`), where `log(x + √(x² ± 1))` loses it.
//! - `fmod` (f64; f32 through it, exactly): `r = |x|` reduced modulo `|y|·2^k` while
//!   `r ≥ |y|·2⁵²` (`k` the exponent gap less 51: a multiple of `|y|`, so the
//!   remainder is unchanged), then modulo `|y|`; each step with the quotient below 2⁵²
//!   is exact (`fma` forms the remainder, representable; a quotient rounded up past
//!   an integer is fixed by adding the divisor back). Exact at every quotient; C's
//!   special cases (NaN for `y = 0` and infinite or NaN `x`, `x` for infinite `y`,
//!   the sign of `x`).
//!
//! Measured (`tests/cuda_math.rs`, against the correctly rounded value): f32 `log`,
//! `asin`, `acos`, `atan` within 1 ulp; f32 `pow` within 1 ulp (0.5 but near ties);
//! f64 `log` and `exp` within 1 ulp; `fmod` exact; f32 `asinh`, `acosh`, `atanh`
//! within 2 ulp.

use kiln_flow::ScalarType;

use super::super::ptx::{Imm, Reg, RegClass};
use super::Eval;

const F: RegClass = RegClass::F32;
const D: RegClass = RegClass::F64;

/// The terms `2/3, 2/5, …` of `R(z)` in `log`, `n` of them.
fn log_series(n: usize) -> Vec<f64> {
    (0..n).map(|k| 2.0 / (2 * k + 3) as f64).collect()
}

impl Eval<'_, '_> {
    pub(super) fn f64c(&mut self, x: f64) -> Reg {
        self.p.mov(D, "f64", Imm::F64(x.to_bits()).into())
    }

    /// A float constant of class `c` (f32 or f64).
    fn fc(&mut self, c: RegClass, x: f64) -> Reg {
        if c == F {
            self.f32c(x as f32)
        } else {
            self.f64c(x)
        }
    }

    /// `x · 2^n` (f64 `x`, s32 `n`) as two exact multiplications by `2^⌊n/2⌋` and
    /// `2^(n − ⌊n/2⌋)`, each a power of two built in the exponent field, so an `n` past
    /// the exponent range of one factor still gives the right (over- or underflowed)
    /// result.
    fn ldexp_f64(&mut self, x: Reg, n: Reg) -> Reg {
        let n1 = self.op2(RegClass::B32, "shr.s32", n, Imm::I(1).into());
        let n2 = self.op2(RegClass::B32, "sub.s32", n, n1.into());
        let mut acc = x;
        for h in [n1, n2] {
            let b = self.op1(RegClass::B64, "cvt.s64.s32", h);
            let b = self.op2(RegClass::B64, "add.s64", b, Imm::I(1023).into());
            let b = self.op2(RegClass::B64, "shl.b64", b, Imm::I(52).into());
            let sc = self.op1(D, "mov.b64", b);
            acc = self.op2(D, "mul.rn.f64", acc, sc.into());
        }
        acc
    }

    /// `c0 + z·(c1 + z·(c2 + …))` by FMA in class `c`.
    fn horner(&mut self, c: RegClass, z: Reg, coef: &[f64]) -> Reg {
        let t = if c == F { "f32" } else { "f64" };
        let mut acc = self.fc(c, coef[coef.len() - 1]);
        for &k in coef[..coef.len() - 1].iter().rev() {
            let kc = self.fc(c, k);
            acc = self.op3(c, &format!("fma.rn.{t}"), acc, z, kc);
        }
        acc
    }

    /// Natural log of `x` (class `c`: f32 or f64), module docs.
    pub(super) fn log_of(&mut self, c: RegClass, x: Reg) -> Reg {
        let wide = c == D;
        let (t, b, bc, s, u) = if wide {
            ("f64", "b64", RegClass::B64, "s64", "u64")
        } else {
            ("f32", "b32", RegClass::B32, "s32", "u32")
        };
        let (min_normal, scale, scale_bits, sqrt_half, man): (u64, f64, i64, u64, u64) = if wide {
            (1 << 52, 2f64.powi(54), 54, 0x3FE6_A09E_667F_3BCD, 52)
        } else {
            (1 << 23, 2f64.powi(23), 23, 0x3F35_04F3, 23)
        };
        // Subnormals (and +0, replaced below) scaled into the normal range.
        let bits = self.op1(bc, &format!("mov.{b}"), x);
        let sub = self.setp("lt", u, bits, Imm::U(min_normal).into());
        let k = self.fc(c, scale);
        let xs = self.op2(c, &format!("mul.rn.{t}"), x, k.into());
        let sbits = self.op1(bc, &format!("mov.{b}"), xs);
        let bits = self.select_bits(bc, sub, sbits, bits);
        let adj = self.p.reg(bc);
        self.p.op(&format!("selp.{b}"), &[adj.into(), Imm::I(-scale_bits).into(), Imm::I(0).into(), sub.into()]);
        // x = 2^e · m, m ∈ [√½, √2).
        let ix = self.op2(bc, &format!("sub.{s}"), bits, Imm::U(sqrt_half).into());
        let e = self.op2(bc, &format!("shr.{s}"), ix, Imm::I(man as i64).into());
        let eb = self.op2(bc, &format!("shl.{b}"), e, Imm::I(man as i64).into());
        let mb = self.op2(bc, &format!("sub.{s}"), bits, eb.into());
        let m = self.op1(c, &format!("mov.{b}"), mb);
        let e = self.op2(bc, &format!("add.{s}"), e, adj.into());
        let ef = self.op1(c, &format!("cvt.rn.{t}.{s}"), e);
        let one = self.fc(c, 1.0);
        let two = self.fc(c, 2.0);
        let half = self.fc(c, 0.5);
        let f = self.op2(c, &format!("sub.rn.{t}"), m, one.into());
        let d = self.op2(c, &format!("add.rn.{t}"), f, two.into());
        let sq = self.op2(c, &format!("div.rn.{t}"), f, d.into());
        let z = self.op2(c, &format!("mul.rn.{t}"), sq, sq.into());
        let r = self.horner(c, z, &log_series(if wide { 10 } else { 5 }));
        let r = self.op2(c, &format!("mul.rn.{t}"), r, z.into());
        let ff = self.op2(c, &format!("mul.rn.{t}"), f, f.into());
        let hfsq = self.op2(c, &format!("mul.rn.{t}"), ff, half.into());
        let (ln2_hi, ln2_lo) = if wide {
            (f64::from_bits(0x3FE6_2E42_FEE0_0000), f64::from_bits(0x3DEA_39EF_3579_3C76))
        } else {
            (f64::from(f32::from_bits(0x3F31_7180)), f64::from(f32::from_bits(0x3717_F7D1)))
        };
        let hi = self.fc(c, ln2_hi);
        let lo = self.fc(c, ln2_lo);
        let elo = self.op2(c, &format!("mul.rn.{t}"), ef, lo.into());
        let w = self.op2(c, &format!("add.rn.{t}"), hfsq, r.into());
        let w = self.op3(c, &format!("fma.rn.{t}"), sq, w, elo);
        let w = self.op2(c, &format!("sub.rn.{t}"), w, hfsq.into());
        let w = self.op2(c, &format!("add.rn.{t}"), w, f.into());
        let res = self.op3(c, &format!("fma.rn.{t}"), ef, hi, w);
        // Positive finite x takes the sequence; +∞ → +∞, ±0 → −∞, the rest NaN.
        let inf = self.fc(c, f64::INFINITY);
        let pos = self.setp("gt", t, x, Imm::zero(c).into());
        let fin = self.setp("lt", t, x, inf.into());
        let ok = self.op2(RegClass::Pred, "and.pred", pos, fin.into());
        let nan = self.fc(c, f64::NAN);
        let ninf = self.fc(c, f64::NEG_INFINITY);
        let zero = self.setp("eq", t, x, Imm::zero(c).into());
        let special = self.select_bits(c, zero, ninf, nan);
        let is_inf = self.setp("eq", t, x, inf.into());
        let special = self.select_bits(c, is_inf, inf, special);
        self.select_bits(c, ok, res, special)
    }

    /// `c ? a : b` on registers of class `c` (not predicates).
    fn select_bits(&mut self, class: RegClass, c: Reg, a: Reg, b: Reg) -> Reg {
        let ty = match class {
            RegClass::F32 => "f32",
            RegClass::F64 => "f64",
            RegClass::B64 => "b64",
            _ => "b32",
        };
        let d = self.p.reg(class);
        self.p.op(&format!("selp.{ty}"), &[d.into(), a.into(), b.into(), c.into()]);
        d
    }

    /// f64 `e^x` (module docs).
    pub(super) fn exp64(&mut self, x: Reg) -> Reg {
        let log2e = self.f64c(std::f64::consts::LOG2_E);
        let t = self.op2(D, "mul.rn.f64", x, log2e.into());
        let n = self.op1(RegClass::B32, "cvt.rni.s32.f64", t);
        let n = self.op2(RegClass::B32, "max.s32", n, Imm::I(-1080).into());
        let n = self.op2(RegClass::B32, "min.s32", n, Imm::I(1080).into());
        let nf = self.op1(D, "cvt.rn.f64.s32", n);
        let nneg = self.op1(D, "neg.f64", nf);
        let hi = self.f64c(f64::from_bits(0x3FE6_2E42_FEE0_0000));
        let lo = self.f64c(f64::from_bits(0x3DEA_39EF_3579_3C76));
        let r = self.op3(D, "fma.rn.f64", nneg, hi, x);
        let r = self.op3(D, "fma.rn.f64", nneg, lo, r);
        let mut coef = vec![1.0f64];
        for k in 1..=13 {
            let prev = coef[k - 1];
            coef.push(prev / k as f64);
        }
        let acc = self.horner(D, r, &coef);
        let acc = self.ldexp_f64(acc, n);
        // Far below the range (−∞ included), where the series of a huge negative r
        // would not give 0: 0.
        let tiny = self.setp("lt", "f64", x, Imm::F64((-746.0f64).to_bits()).into());
        let zero = self.f64c(0.0);
        self.select_bits(D, tiny, zero, acc)
    }

    /// `x^y` on f32 (computed in f64) or f64 (module docs).
    pub(super) fn pow_of(&mut self, c: RegClass, x: Reg, y: Reg) -> Reg {
        if c == D {
            return self.pow64(x, y);
        }
        let xd = self.op1(D, "cvt.f64.f32", x);
        let yd = self.op1(D, "cvt.f64.f32", y);
        let r = self.pow64(xd, yd);
        // One rounding to f32 (x² and x are exact in f64).
        self.op1(F, "cvt.rn.f32.f64", r)
    }

    /// `x^y` for a constant `y` (of class `c`'s type): `x^0 = 1`, `x^1 = x`,
    /// `x^2 = x·x`, `x^½ = √(x + 0)` (but `(−∞)^½ = +∞`) in the type itself; other
    /// integers `|y| ≤ 64` by the binary powering of [`Eval::pow_of`] in f64, unrolled
    /// over `y`'s bits, with that general sequence only where the power is not a normal
    /// f64 (a branch the other threads skip); any other `y` by the general sequence.
    /// The values are [`Eval::pow_of`]'s: the same sequences, decided at compile time.
    pub(super) fn pow_const(&mut self, c: RegClass, x: Reg, y: f64) -> Reg {
        let wide = c == D;
        let t = if wide { "f64" } else { "f32" };
        match y {
            0.0 => return self.fc(c, 1.0),
            1.0 => return x,
            2.0 => return self.op2(c, &format!("mul.rn.{t}"), x, x.into()),
            0.5 => {
                let z = self.fc(c, 0.0);
                let xp = self.op2(c, &format!("add.rn.{t}"), x, z.into());
                let rt = self.op1(c, &format!("sqrt.rn.{t}"), xp);
                let ninf = self.fc(c, f64::NEG_INFINITY);
                let is = self.setp("eq", t, x, ninf.into());
                let inf = self.fc(c, f64::INFINITY);
                return self.select_bits(c, is, inf, rt);
            }
            _ => {}
        }
        let yc = self.fc(c, y);
        if y.fract() != 0.0 || y.abs() > 64.0 {
            return self.pow_of(c, x, yc);
        }
        let xd = if wide { x } else { self.op1(D, "cvt.f64.f32", x) };
        let n = y.abs() as u32;
        let mut acc: Option<Reg> = None;
        let mut base = xd;
        for bit in 0..(32 - n.leading_zeros()) {
            if n >> bit & 1 == 1 {
                acc = Some(match acc {
                    None => base,
                    Some(a) => self.op2(D, "mul.rn.f64", a, base.into()),
                });
            }
            if n >> (bit + 1) != 0 {
                base = self.op2(D, "mul.rn.f64", base, base.into());
            }
        }
        let acc = acc.unwrap_or(xd);
        let aacc = self.op1(D, "abs.f64", acc);
        let normal = self.setp("ge", "f64", aacc, Imm::F64(f64::MIN_POSITIVE.to_bits()).into());
        let finite = self.setp("lt", "f64", aacc, Imm::F64(f64::INFINITY.to_bits()).into());
        let usable = self.op2(RegClass::Pred, "and.pred", normal, finite.into());
        let powered = if y < 0.0 {
            let one = self.f64c(1.0);
            self.op2(D, "div.rn.f64", one, acc.into())
        } else {
            acc
        };
        let r = self.p.reg(D);
        self.p.copy(r, powered);
        let done = self.p.label();
        self.p.branch(Some((usable, false)), done);
        let yd = self.f64c(y);
        let g = self.pow64(xd, yd);
        self.p.copy(r, g);
        self.p.place(done);
        if wide {
            r
        } else {
            self.op1(F, "cvt.rn.f32.f64", r)
        }
    }

    /// `x^y` in f64 ([`Eval::pow_of`]).
    fn pow64(&mut self, xd: Reg, yd: Reg) -> Reg {
        let pred = RegClass::Pred;
        // e^(y·ln|x|).
        let ax = self.op1(D, "abs.f64", xd);
        let l = self.log_of(D, ax);
        let m = self.op2(D, "mul.rn.f64", yd, l.into());
        let g = self.exp64(m);
        // Whether y is an integer, an odd one.
        let yi = self.op1(D, "cvt.rzi.f64.f64", yd);
        let int = self.setp("eq", "f64", yi, yd.into());
        let half = self.f64c(0.5);
        let yh = self.op2(D, "mul.rn.f64", yd, half.into());
        let yhi = self.op1(D, "cvt.rzi.f64.f64", yh);
        let even = self.setp("eq", "f64", yhi, yh.into());
        let odd_half = self.op1(pred, "not.pred", even);
        let odd = self.op2(pred, "and.pred", int, odd_half.into());
        // The sign of a negative x (−0 and −∞ included) to an odd integer power.
        let xb = self.op1(RegClass::B64, "mov.b64", xd);
        let neg = self.setp("lt", "s64", xb, Imm::I(0).into());
        let flip = self.op2(pred, "and.pred", neg, odd.into());
        let ng = self.op1(D, "neg.f64", g);
        let g = self.select_bits(D, flip, ng, g);
        // An integer |y| ≤ 64 by binary powering of x itself (sign included): exact
        // where every power is, else a relative error of at most (|y| − 1)·2⁻⁵³ (each
        // rounding raised to the number of times its product is used), and 1/x^|y|
        // for a negative y. Taken where x^|y| is a normal f64 (else, as for 0, ±∞,
        // NaN and overflowing powers, e^(y·ln|x|) above).
        let ay = self.op1(D, "abs.f64", yd);
        let n = self.op1(RegClass::B32, "cvt.rzi.u32.f64", ay);
        let mut acc = self.f64c(1.0);
        let mut base = xd;
        for bit in 0..7 {
            let b = self.op2(RegClass::B32, "shr.u32", n, Imm::I(bit).into());
            let b = self.op2(RegClass::B32, "and.b32", b, Imm::I(1).into());
            let on = self.setp("ne", "u32", b, Imm::I(0).into());
            let mm = self.op2(D, "mul.rn.f64", acc, base.into());
            acc = self.select_bits(D, on, mm, acc);
            if bit < 6 {
                base = self.op2(D, "mul.rn.f64", base, base.into());
            }
        }
        let aacc = self.op1(D, "abs.f64", acc);
        let normal = self.setp("ge", "f64", aacc, Imm::F64(f64::MIN_POSITIVE.to_bits()).into());
        let finite = self.setp("lt", "f64", aacc, Imm::F64(f64::INFINITY.to_bits()).into());
        let small = self.setp("le", "f64", ay, Imm::F64(64f64.to_bits()).into());
        let usable = self.op2(pred, "and.pred", normal, finite.into());
        let usable = self.op2(pred, "and.pred", usable, small.into());
        let usable = self.op2(pred, "and.pred", usable, int.into());
        let one = self.f64c(1.0);
        let inv = self.op2(D, "div.rn.f64", one, acc.into());
        let yneg = self.setp("lt", "f64", yd, Imm::F64(0).into());
        let powered = self.select_bits(D, yneg, inv, acc);
        let r = self.select_bits(D, usable, powered, g);
        // A negative finite x to a non-integer power: NaN.
        let below = self.setp("lt", "f64", xd, Imm::F64(0).into());
        let finite_x = self.setp("ne", "f64", xd, Imm::F64(f64::NEG_INFINITY.to_bits()).into());
        let nint = self.op1(pred, "not.pred", int);
        let bad = self.op2(pred, "and.pred", below, finite_x.into());
        let bad = self.op2(pred, "and.pred", bad, nint.into());
        let nan = self.f64c(f64::NAN);
        let mut r = self.select_bits(D, bad, nan, r);
        // 1^y = 1 (NaN y too) and (−1)^±∞ = 1.
        let is_one = self.setp("eq", "f64", xd, one.into());
        let unit = self.setp("eq", "f64", ax, one.into());
        let yinf = self.setp("eq", "f64", ay, Imm::F64(f64::INFINITY.to_bits()).into());
        let unit_inf = self.op2(pred, "and.pred", unit, yinf.into());
        let ones = self.op2(pred, "or.pred", is_one, unit_inf.into());
        r = self.select_bits(D, ones, one, r);
        let sq = self.op2(D, "mul.rn.f64", xd, xd.into());
        // x^½ = √(x + 0) (+0 for −0), but (−∞)^½ = +∞ from above.
        let z = self.f64c(0.0);
        let xp = self.op2(D, "add.rn.f64", xd, z.into());
        let rt = self.op1(D, "sqrt.rn.f64", xp);
        let is_half = self.setp("eq", "f64", yd, half.into());
        let take = self.op2(pred, "and.pred", is_half, finite_x.into());
        let rt = self.select_bits(D, take, rt, r);
        r = rt;
        for (k, v) in [(1.0f64, xd), (2.0, sq), (0.0, one)] {
            let is = self.setp("eq", "f64", yd, Imm::F64(k.to_bits()).into());
            r = self.select_bits(D, is, v, r);
        }
        r
    }

    /// f32 `atan x` (module docs).
    pub(super) fn atan(&mut self, x: Reg) -> Reg {
        let ax = self.op1(F, "abs.f32", x);
        let one = self.f32c(1.0);
        // Intervals of |x| (fdlibm's): below 7/16, 11/16, 19/16, 39/16, and past.
        let bounds = [7.0f32 / 16.0, 11.0 / 16.0, 19.0 / 16.0, 39.0 / 16.0];
        let past: Vec<Reg> = bounds.iter().map(|b| self.setp("ge", "f32", ax, Imm::F32(b.to_bits()).into())).collect();
        // u = num / den exactly as the interval says; each numerator is exact
        // (Sterbenz), each denominator rounds once.
        let two = self.f32c(2.0);
        let ax2 = self.op2(F, "mul.rn.f32", ax, two.into());
        let n1 = self.op2(F, "sub.rn.f32", ax2, one.into());
        let d1 = self.op2(F, "add.rn.f32", ax, two.into());
        let n2 = self.op2(F, "sub.rn.f32", ax, one.into());
        let d2 = self.op2(F, "add.rn.f32", ax, one.into());
        let c15 = self.f32c(1.5);
        let n3 = self.op2(F, "sub.rn.f32", ax, c15.into());
        let d3 = self.op3(F, "fma.rn.f32", c15, ax, one);
        let n4 = self.f32c(-1.0);
        let (mut num, mut den) = (ax, one);
        for (p, (n, d)) in past.iter().zip([(n1, d1), (n2, d2), (n3, d3), (n4, ax)]) {
            num = self.select(ScalarType::F32, *p, n, num);
            den = self.select(ScalarType::F32, *p, d, den);
        }
        let u = self.op2(F, "div.rn.f32", num, den.into());
        let z = self.op2(F, "mul.rn.f32", u, u.into());
        // atan u = u + u·z·P(z), P = −1/3 + z/5 − …: |u| ≤ 7/16.
        let coef: Vec<f64> = (1..11).map(|k| if k % 2 == 0 { 1.0 } else { -1.0 } / (2 * k + 1) as f64).collect();
        let p = self.horner(F, z, &coef);
        let uz = self.op2(F, "mul.rn.f32", u, z.into());
        // The interval's base atan(0), atan(½), π/4, atan(1.5), π/2 in two parts.
        let (mut hi, mut lo) = (self.f32c(0.0), self.f32c(0.0));
        for (p, b) in past.iter().zip([0.5f64.atan(), 1f64.atan(), 1.5f64.atan(), std::f64::consts::FRAC_PI_2]) {
            let bh = b as f32;
            let bhr = self.f32c(bh);
            let blr = self.f32c((b - f64::from(bh)) as f32);
            hi = self.select(ScalarType::F32, *p, bhr, hi);
            lo = self.select(ScalarType::F32, *p, blr, lo);
        }
        let tail = self.op3(F, "fma.rn.f32", uz, p, lo);
        let a = self.op2(F, "add.rn.f32", u, tail.into());
        let r = self.op2(F, "add.rn.f32", hi, a.into());
        self.op2(F, "copysign.f32", x, r.into())
    }

    /// The tail `v·z·P(z) + c` of `asin v = v + v·z·P(z)` (plus a small `c`), where
    /// `z` is `v²` (for `v = √w`, `z = w` exactly).
    fn asin_tail(&mut self, v: Reg, z: Reg, c: Reg) -> Reg {
        // (2k)! / (4^k (k!)^2 (2k+1)) for k ≥ 1.
        let mut coef = Vec::new();
        let mut ratio = 1.0f64;
        for k in 1..=12 {
            ratio *= (2 * k - 1) as f64 / (2 * k) as f64;
            coef.push(ratio / (2 * k + 1) as f64);
        }
        let p = self.horner(F, z, &coef);
        let vz = self.op2(F, "mul.rn.f32", v, z.into());
        self.op3(F, "fma.rn.f32", vz, p, c)
    }

    /// f32 `asin x` or `acos x` (module docs).
    pub(super) fn asin_acos(&mut self, x: Reg, acos: bool) -> Reg {
        let ax = self.op1(F, "abs.f32", x);
        let one = self.f32c(1.0);
        let half = self.f32c(0.5);
        let two = self.f32c(2.0);
        let zero = self.f32c(0.0);
        let small = self.op2(F, "mul.rn.f32", x, x.into());
        let tail = self.asin_tail(x, small, zero);
        let near = self.op2(F, "add.rn.f32", x, tail.into());
        // Past ½: w = (1 − |x|)/2 exactly, s = √w.
        let big = self.setp("gt", "f32", ax, half.into());
        let om = self.op2(F, "sub.rn.f32", one, ax.into());
        let w = self.op2(F, "mul.rn.f32", om, half.into());
        let s = self.op1(F, "sqrt.rn.f32", w);
        // √w = s + c to about 2⁻⁴⁸ (c = (w − s²)/2s, the FMA's exact residual), and
        // asin(s + c) = asin s + c to 0.16·|c|.
        let res = self.op1(F, "neg.f32", s);
        let res = self.op3(F, "fma.rn.f32", res, s, w);
        let s2 = self.op2(F, "add.rn.f32", s, s.into());
        let c = self.op2(F, "div.rn.f32", res, s2.into());
        let pos = self.setp("gt", "f32", s, Imm::F32(0).into());
        let c = self.select(ScalarType::F32, pos, c, zero);
        // 2·asin(√w) = 2s + 2t, both doublings exact.
        let t2 = self.asin_tail(s, w, c);
        let t2 = self.op2(F, "mul.rn.f32", t2, two.into());
        // base − 2·asin(√w) = (base_hi − 2s) − (2t − base_lo) where the first difference
        // is exact (Sterbenz: 2s ≥ base_hi/2), else base_hi − (2s + (2t − base_lo)):
        // either way only the last operation rounds at the result's scale.
        let from = |ev: &mut Self, base: f64| {
            let hi = base as f32;
            let hr = ev.f32c(hi);
            let lr = ev.f32c((base - f64::from(hi)) as f32);
            let l = ev.op2(F, "sub.rn.f32", t2, lr.into());
            let h = ev.op2(F, "sub.rn.f32", hr, s2.into());
            let a = ev.op2(F, "sub.rn.f32", h, l.into());
            let sum = ev.op2(F, "add.rn.f32", s2, l.into());
            let b = ev.op2(F, "sub.rn.f32", hr, sum.into());
            let exact = ev.setp("ge", "f32", s2, Imm::F32((hi / 2.0).to_bits()).into());
            ev.select(ScalarType::F32, exact, a, b)
        };
        let halfpi = std::f64::consts::FRAC_PI_2;
        if !acos {
            let far = from(self, halfpi);
            let r = self.select(ScalarType::F32, big, far, near);
            return self.op2(F, "copysign.f32", x, r.into());
        }
        // Near 0: π/2 − asin x, as (π/2_hi − x) − (tail − π/2_lo).
        let hr = self.f32c(halfpi as f32);
        let lr = self.f32c((halfpi - f64::from(halfpi as f32)) as f32);
        let h = self.op2(F, "sub.rn.f32", hr, x.into());
        let l = self.op2(F, "sub.rn.f32", tail, lr.into());
        let mid = self.op2(F, "sub.rn.f32", h, l.into());
        // x > ½: 2·asin(√w); x < −½: π − 2·asin(√w).
        let pos_far = self.op2(F, "add.rn.f32", s2, t2.into());
        let neg_far = from(self, std::f64::consts::PI);
        let neg = self.setp("lt", "f32", x, Imm::F32(0).into());
        let far = self.select(ScalarType::F32, neg, neg_far, pos_far);
        self.select(ScalarType::F32, big, far, mid)
    }

    /// `r − trunc(r/d)·d` for `0 ≤ r/d < 2⁵²` (or NaN), exactly: the rounded
    /// quotient's integer part is the true one or one more, `fma` forms the remainder
    /// exactly (it is representable either way), and one `d` added back fixes the
    /// second case.
    fn fmod_step(&mut self, r: Reg, d: Reg) -> Reg {
        let q = self.op2(D, "div.rn.f64", r, d.into());
        let q = self.op1(D, "cvt.rzi.f64.f64", q);
        let nq = self.op1(D, "neg.f64", q);
        let m = self.op3(D, "fma.rn.f64", nq, d, r);
        let fixed = self.op2(D, "add.rn.f64", m, d.into());
        let under = self.setp("lt", "f64", m, Imm::F64(0).into());
        self.select_bits(D, under, fixed, m)
    }

    /// f64 `fmod(x, y)`, exact (C's `fmod`: the sign of x; NaN for y = 0, x infinite
    /// or NaN; x for infinite y). While `|r| ≥ |y|·2⁵²` a loop takes `r` modulo
    /// `|y|·2^k` with `k` the exponent gap less 51 (a multiple of `|y|`, so the
    /// remainder modulo `|y|` is unchanged; at most 41 turns, each exact by
    /// [`Eval::fmod_step`]); a last step modulo `|y|` finishes. Threads leave the loop
    /// after different numbers of turns (a divergent branch).
    pub(super) fn fmod64(&mut self, x: Reg, y: Reg) -> Reg {
        let pred = RegClass::Pred;
        let ay = self.op1(D, "abs.f64", y);
        let ax = self.op1(D, "abs.f64", x);
        let zero = self.setp("eq", "f64", y, Imm::F64(0).into());
        let inf = self.setp("eq", "f64", ax, Imm::F64(f64::INFINITY.to_bits()).into());
        let nan = self.setp("nan", "f64", x, y.into());
        let bad = self.op2(pred, "or.pred", zero, inf.into());
        let bad = self.op2(pred, "or.pred", bad, nan.into());
        let qnan = self.f64c(f64::NAN);
        let r0 = self.select_bits(D, bad, qnan, ax);
        let r = self.p.reg(D);
        self.p.copy(r, r0);
        // |y|·2⁵² (∞ past the range: the loop is then not entered).
        let k52 = self.f64c(2f64.powi(52));
        let big = self.op2(D, "mul.rn.f64", ay, k52.into());
        // The exponent of |y|, subnormals included (through |y|·2⁵⁴).
        let k54 = self.f64c(2f64.powi(54));
        let ays = self.op2(D, "mul.rn.f64", ay, k54.into());
        let sub = self.setp("lt", "f64", ay, Imm::F64(f64::MIN_POSITIVE.to_bits()).into());
        let eb = self.select_bits(D, sub, ays, ay);
        let eb = self.op1(RegClass::B64, "mov.b64", eb);
        let eb = self.op2(RegClass::B64, "shr.u64", eb, Imm::I(52).into());
        let eb = self.op1(RegClass::B32, "cvt.u32.u64", eb);
        let adj = self.p.reg(RegClass::B32);
        self.p.op("selp.b32", &[adj.into(), Imm::I(54).into(), Imm::I(0).into(), sub.into()]);
        let ey = self.op2(RegClass::B32, "sub.s32", eb, adj.into());
        let (head, done) = (self.p.label(), self.p.label());
        self.p.place(head);
        let more = self.setp("ge", "f64", r, big.into());
        self.p.branch(Some((more, true)), done);
        // k = exponent gap − 51 ≥ 1 (both biased exponents; r is normal here).
        let rb = self.op1(RegClass::B64, "mov.b64", r);
        let rb = self.op2(RegClass::B64, "shr.u64", rb, Imm::I(52).into());
        let er = self.op1(RegClass::B32, "cvt.u32.u64", rb);
        let k = self.op2(RegClass::B32, "sub.s32", er, ey.into());
        let k = self.op2(RegClass::B32, "sub.s32", k, Imm::I(51).into());
        let d = self.ldexp_f64(ay, k);
        let next = self.fmod_step(r, d);
        self.p.copy(r, next);
        self.p.branch(None, head);
        self.p.place(done);
        let last = self.fmod_step(r, ay);
        // |x| < |y| leaves r = |x|: the step's quotient is 0 there; y = ±∞ gives x.
        let res = self.op2(D, "copysign.f64", x, last.into());
        let yinf = self.setp("eq", "f64", ay, Imm::F64(f64::INFINITY.to_bits()).into());
        let res = self.select_bits(D, yinf, x, res);
        self.select_bits(D, bad, qnan, res)
    }

    /// `log(w) + c` with `w = 1 + u` rounded and `c = (u − (w − 1))/w` its rounding
    /// error carried to first order: `log1p u` to about an ulp (`w − 1` is exact for
    /// `w ∈ [½, 2]`, beyond it `c` is negligible); `c = 0` where `w` is 0 or not finite.
    fn log1p_parts(&mut self, u: Reg) -> (Reg, Reg) {
        let one = self.f32c(1.0);
        let w = self.op2(F, "add.rn.f32", u, one.into());
        let wm = self.op2(F, "sub.rn.f32", w, one.into());
        let e = self.op2(F, "sub.rn.f32", u, wm.into());
        let c = self.op2(F, "div.rn.f32", e, w.into());
        let aw = self.op1(F, "abs.f32", w);
        let fin = self.setp("lt", "f32", aw, Imm::F32(f32::INFINITY.to_bits()).into());
        let nz = self.setp("ne", "f32", w, Imm::F32(0).into());
        let ok = self.op2(RegClass::Pred, "and.pred", fin, nz.into());
        let zero = self.f32c(0.0);
        let c = self.select_bits(F, ok, c, zero);
        (w, c)
    }

    /// f32 `asinh x` (fdlibm's forms): `|x| < 2`: `log1p(|x| + x²/(1 + √(1 + x²)))`;
    /// up to 2²⁸: `log(|x| + √(x² + 1))`; past it `log|x| + ln 2`; the sign of `x`.
    pub(super) fn asinh(&mut self, x: Reg) -> Reg {
        let a = self.op1(F, "abs.f32", x);
        let one = self.f32c(1.0);
        let sq = self.op2(F, "mul.rn.f32", a, a.into());
        let s1 = self.op2(F, "add.rn.f32", sq, one.into());
        let r = self.op1(F, "sqrt.rn.f32", s1);
        let d = self.op2(F, "add.rn.f32", r, one.into());
        let q = self.op2(F, "div.rn.f32", sq, d.into());
        let t = self.op2(F, "add.rn.f32", a, q.into());
        let (w, c) = self.log1p_parts(t);
        let mid = self.op2(F, "add.rn.f32", a, r.into());
        self.log_by_range(a, (w, c), mid, x)
    }

    /// The log of `small.0` plus `small.1` where `a < 2`, of `mid` up to 2²⁸, `log a +
    /// ln 2` past it; with the sign of `sign`.
    fn log_by_range(&mut self, a: Reg, small: (Reg, Reg), mid: Reg, sign: Reg) -> Reg {
        let is_small = self.setp("lt", "f32", a, Imm::F32(2f32.to_bits()).into());
        let huge = self.setp("gt", "f32", a, Imm::F32(2f32.powi(28).to_bits()).into());
        let arg = self.select_bits(F, huge, a, mid);
        let arg = self.select_bits(F, is_small, small.0, arg);
        let l = self.log(arg);
        let zero = self.f32c(0.0);
        let ln2 = self.f32c(std::f32::consts::LN_2);
        let add = self.select_bits(F, huge, ln2, zero);
        let add = self.select_bits(F, is_small, small.1, add);
        let r = self.op2(F, "add.rn.f32", l, add.into());
        self.op2(F, "copysign.f32", sign, r.into())
    }

    /// f32 `acosh x` (fdlibm's forms): `x < 2`: `log1p(t + √(2t + t²))` with `t = x − 1`
    /// exact; up to 2²⁸: `log(x + √(x² − 1))`; past it `log x + ln 2`; NaN below 1.
    pub(super) fn acosh(&mut self, x: Reg) -> Reg {
        let one = self.f32c(1.0);
        let t = self.op2(F, "sub.rn.f32", x, one.into());
        let two = self.f32c(2.0);
        let tt = self.op2(F, "mul.rn.f32", t, t.into());
        let u = self.op3(F, "fma.rn.f32", two, t, tt);
        let r = self.op1(F, "sqrt.rn.f32", u);
        let v = self.op2(F, "add.rn.f32", t, r.into());
        let (w, c) = self.log1p_parts(v);
        let sq = self.op2(F, "mul.rn.f32", x, x.into());
        let s1 = self.op2(F, "sub.rn.f32", sq, one.into());
        let rr = self.op1(F, "sqrt.rn.f32", s1);
        let mid = self.op2(F, "add.rn.f32", x, rr.into());
        let pos = self.f32c(1.0);
        let r = self.log_by_range(x, (w, c), mid, pos);
        let below = self.setp("lt", "f32", x, one.into());
        let nan = self.f32c(f32::NAN);
        let nan_in = self.setp("nan", "f32", x, x.into());
        let bad = self.op2(RegClass::Pred, "or.pred", below, nan_in.into());
        self.select_bits(F, bad, nan, r)
    }

    /// f32 `atanh x`: `½·log1p(2|x|/(1 − |x|))` with the sign of `x` (±∞ at ±1, NaN
    /// past).
    pub(super) fn atanh(&mut self, x: Reg) -> Reg {
        let a = self.op1(F, "abs.f32", x);
        let one = self.f32c(1.0);
        let a2 = self.op2(F, "add.rn.f32", a, a.into());
        let d = self.op2(F, "sub.rn.f32", one, a.into());
        let u = self.op2(F, "div.rn.f32", a2, d.into());
        let (w, c) = self.log1p_parts(u);
        let l = self.log(w);
        let l = self.op2(F, "add.rn.f32", l, c.into());
        let half = self.f32c(0.5);
        let r = self.op2(F, "mul.rn.f32", l, half.into());
        self.op2(F, "copysign.f32", x, r.into())
    }
}
