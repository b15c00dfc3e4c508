//! Inline f32 transcendentals: `exp`, `erf`, `tanh` and `log` as straight-line Cranelift IR that is
//! the same for one lane (`f32`) and four (`f32x4`), so scalar and vectorised loops
//! give bit-identical results. Other transcendentals, and every f64 one, call the
//! runtime's helper table (libm).
//!
//! ## exp
//! Cody–Waite reduction `x = n·ln2 + r` with `n = round(x·log2 e)` (the 1.5·2²³ trick,
//! which also yields `n`'s integer bits), `ln2` split in two so `n·C1` is exact, a
//! degree-6 polynomial for `eʳ` on `|r| ≤ ln2/2`, and the scale `2ⁿ` applied as
//! `2^⌊n/2⌋ · 2^(n−⌊n/2⌋)` so results that overflow give +inf and results in the
//! subnormal range round once more. `x` is clamped to [−104, 89] first (beyond both
//! ends the result is already 0 or +inf), NaN passes through. Where the target has FMA,
//! `x·log2 e + 1.5·2²³`, both reduction steps and `r + r²·P(r)` are single FMAs (four
//! operations fewer, which the 16-lane row kernels need most). `P` is evaluated in three
//! pairs joined by `r²` (three dependent steps after the pairs where Horner takes five:
//! an epilogue evaluates one vector at a time, so its latency is what a SiLU costs).
//! Measured maximum error against f64 `exp` over every 1021st f32 in [−103, 88.72]
//! (`tests/math.rs`): 0.95 ulp without FMA, 0.99 with.
//!
//! ## erf
//! `|x| < 0.5`: the odd Taylor series `2/√π·Σₙ (−1)ⁿ x²ⁿ⁺¹ / (n!(2n+1))` to `n = 7`
//! (truncation below 10⁻¹¹). Elsewhere `1 − erfc(|x|)` with the sign of `x`,
//! `erfc(z) = exp(P(z − ½) − x²)`, `P` of degree 6 fitted to `ln erfc(z) + z²` on [½, 4]
//! (a least-squares fit weighted by what an error in `P` costs erf in ulps, iterated
//! towards the smallest largest error), evaluated by Estrin's scheme, `z` clamped to 4
//! (from 3.92 on erf rounds to ±1, and `x²` alone then keeps erfc below what `1 − erfc`
//! can show). Both are computed and one selected per lane. No division and no second
//! polynomial in a reciprocal (the form before this one, `t·exp(−z² + P(t))` with
//! `t = 1/(1 + z/2)`, had both on its chain): an f32 GELU after a 400 × 384 × 1536
//! product went from 3.4 to 2.6 ms above the product's 13.1 (AVX2 host, one thread).
//! Measured maximum error against f64 `erf` over every 1021st f32 in [−6, 6]
//! (`tests/math.rs`): 2.34 ulp with and without FMA, in the series at x = 0.0137; the
//! second form's own worst, in an f32 emulation over 300 000 random points in
//! [0.5, 4.1], 1.52 ulp (at 0.538).
//!
//! ## tanh
//! `|x| < 0.625`: `x + x³·P(x²)`, `P` of degree 5 fitted to the relative error on
//! [0, 0.625] (0.77 ulp in f32 arithmetic). Elsewhere `1 − 2/(e^{2|x|} + 1)` with the
//! sign of `x` (no cancellation above 0.625: `2/(e + 1) < 0.6`; `e` overflows to +inf
//! beyond |x| = 44.5, which gives exactly ±1). Both are computed and one selected per
//! lane; NaN passes through the second. Measured maximum error against f64 `tanh` over
//! every 1021st f32 in [−10, 10] (`tests/math.rs`).
//!
//! ## log
//! Subnormal `x` scaled by 2²³ first (23 taken off the exponent after). Then `x = 2ᵉ·m`
//! with `m` in [√½, √2) taken from the bits (`x`'s bits less those of √½, shifted for
//! `e`, masked and added back for `m`; `e` converted exactly through the 1.5·2²³ trick),
//! and `log x = f − f²/2 + f³·P(f) + e·ln2` with `f = m − 1`, `P` Cephes' `logf`
//! polynomial of degree 8 and `ln2 = C1 + C2` as in exp. `x = +inf` and NaN give `x`;
//! `x ≤ 0` gives `√x − ∞`: −inf for ±0, NaN below. Measured maximum error against f64
//! `ln` over every 1021st positive f32 (`tests/math.rs`).
//!
//! ## pow (machine code only)
//! `x^y` for a run-time `y` (a learned exponent: BirdNET's mel front end raises its
//! products to one) is `exp(y·ln|x|)` from the two functions above, with the cases of
//! C's `pow` fixed up lane by lane: the sign of a negative `x` (−0 and −∞ included) to
//! an odd integer power (`y`'s truncation's last bit, where `y` equals its
//! truncation), NaN for a finite negative `x` and a non-integer `y`, and 1 for `y = ±0`,
//! for `x = 1` and for `|x| = 1` with `|y| = inf`, whatever the other operand (the
//! cases where `y·ln|x|` is `0·inf` or NaN); zeros and infinities of `x` need nothing
//! more (`ln 0 = −inf`, `ln inf = inf`). The error of `ln` is carried through the
//! exponent: within `(2 + |y·ln|x||)·2⁻²³` relative of libm's `powf` (so a result
//! that close to the largest float may round to inf: `f32::MAX¹`), and exact on
//! results that are 0, ±1, ±inf or NaN (`tests/vector.rs`). The general path, where a
//! kernel has another operation without a vector form, calls libm's `powf` (the two can
//! differ in the last bits).
//!
//! ## The same functions as machine code
//! `impl Vx` writes both functions as vector machine code (`iced-x86`) of either width
//! ([`super::vector`]): eight lanes for the contraction microkernels' epilogues (GELU,
//! SiLU, Mish, Softplus after a matrix product or a convolution) and row kernels on AVX2, sixteen for row kernels and
//! 512-bit tiles' epilogues on AVX-512. It issues the same operations on the same constants in
//! the same order as the general path on a target with FMA, so every path gives the same
//! bits. The one difference: sixteen lanes scale by `2ⁿ` with one `vscalefps`, which
//! rounds `p·2ⁿ` once, exactly as the two exact-then-rounding halves do.
//!
//! ## logistic (machine code only, in contraction epilogues)
//! `σ(x) = select(x ≥ 0, 1, e)/(1 + e)`, `e = e^{−|x|}`, is what `kiln-lower` writes
//! Sigmoid (and SiLU's σ) as; [`logistic_of`] recognises those nodes and [`Vx::logistic`]
//! evaluates them in one piece: `−|x|` by one `or`, exp without its upper clamp (its
//! argument is never positive) and with `2ⁿ` in one step, 0 where it would be subnormal
//! (`n < −126`). The results are the nodes' bits except below x ≈ −87.7, where σ is a
//! subnormal number and 0 is returned for it (`tests/contraction.rs` compares every
//! 8191st f32 in [−120, 120] with the nodes' vector code).

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, ConstantData, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use iced_x86::code_asm::dword_ptr;
use kiln_flow::kernel::Node;
use kiln_flow::{BinaryOp, Expr, ExprId, Kernel, ScalarType, UnaryOp};

use super::gemm::R;
use super::vector::{Mask, Op, Src, Vx, V};
use super::vops::float_pred;

/// Lane order for vector bitcasts.
fn lanes(ty: Type) -> MemFlagsData {
    if ty.is_vector() {
        MemFlagsData::new().with_endianness(cranelift_codegen::ir::Endianness::Little)
    } else {
        MemFlagsData::new()
    }
}

/// Four copies of `bits` as a vector constant of type `ty` (one load from the
/// function's constant pool, not a materialise-and-splat per loop iteration).
fn vconst(b: &mut FunctionBuilder<'_>, ty: Type, bits: u32) -> Value {
    let bytes: Vec<u8> = (0..4).flat_map(|_| bits.to_le_bytes()).collect();
    let handle = b.func.dfg.constants.insert(ConstantData::from(bytes));
    b.ins().vconst(ty, handle)
}

/// A constant of `ty` (f32 or f32x4).
fn c(b: &mut FunctionBuilder<'_>, ty: Type, x: f32) -> Value {
    if ty.is_vector() {
        vconst(b, ty, x.to_bits())
    } else {
        b.ins().f32const(x)
    }
}

/// An i32 constant of the integer type matching `ty`.
fn ci(b: &mut FunctionBuilder<'_>, ty: Type, x: i32) -> Value {
    if ty.is_vector() {
        vconst(b, types::I32X4, x as u32)
    } else {
        b.ins().iconst(types::I32, x as i64)
    }
}

fn int_ty(ty: Type) -> Type {
    if ty.is_vector() {
        types::I32X4
    } else {
        types::I32
    }
}

/// `x·y + z`: one fused multiply-add where the target has FMA (`fma`), else a multiply
/// and an add (rounded twice).
fn mul_add(b: &mut FunctionBuilder<'_>, fma: bool, x: Value, y: Value, z: Value) -> Value {
    if fma {
        b.ins().fma(x, y, z)
    } else {
        let m = b.ins().fmul(x, y);
        b.ins().fadd(m, z)
    }
}

/// Horner: `((c0·x + c1)·x + …) + cn`, each step a [`mul_add`].
fn horner(b: &mut FunctionBuilder<'_>, ty: Type, x: Value, coefs: &[f32], fma: bool) -> Value {
    let mut p = c(b, ty, coefs[0]);
    for &k in &coefs[1..] {
        let kk = c(b, ty, k);
        p = mul_add(b, fma, p, x, kk);
    }
    p
}

/// erf's `P(s)` ([`ERF_BIG`], degree 6) by Estrin's scheme: pairs `a₂ᵢ₊₁·s + a₂ᵢ`, then
/// `r₀ = q₁·s² + q₀`, `r₁ = a₆·s² + q₂` and `r₁·s⁴ + r₀`, three steps after the pairs
/// where Horner takes six; each step a [`mul_add`], in the order [`Vx::erf_poly`] takes
/// them (the machine-code form gives the same bits).
fn erf_poly(b: &mut FunctionBuilder<'_>, ty: Type, s: Value, fma: bool) -> Value {
    let a = |i: usize| ERF_BIG[6 - i];
    let pair = |b: &mut FunctionBuilder<'_>, i: usize| {
        let (hi, lo) = (c(b, ty, a(2 * i + 1)), c(b, ty, a(2 * i)));
        mul_add(b, fma, hi, s, lo)
    };
    let q: Vec<Value> = (0..3).map(|i| pair(b, i)).collect();
    let s2 = b.ins().fmul(s, s);
    let r0 = mul_add(b, fma, q[1], s2, q[0]);
    let a6 = c(b, ty, a(6));
    let r1 = mul_add(b, fma, a6, s2, q[2]);
    let s4 = b.ins().fmul(s2, s2);
    mul_add(b, fma, r1, s4, r0)
}

/// `2^n` for integer lanes `n` in [−126, 127].
fn pow2(b: &mut FunctionBuilder<'_>, ty: Type, n: Value) -> Value {
    let bias = ci(b, ty, 127);
    let e = b.ins().iadd(n, bias);
    let bits = b.ins().ishl_imm_u(e, 23);
    b.ins().bitcast(ty, lanes(ty), bits)
}

/// `x < k ? k : x` (`cc` LessThan) or `x > k ? k : x` (GreaterThan): a clamp against a
/// constant that keeps a NaN `x`. As a vector it is the compare-and-bitselect that
/// Cranelift lowers to one `maxps`/`minps` (constant first, so NaN gives `x`), not
/// `fmax`/`fmin`'s eight-instruction NaN-and-signed-zero sequence.
fn clamp_const(b: &mut FunctionBuilder<'_>, ty: Type, x: Value, k: Value, cc: FloatCC) -> Value {
    if ty.is_vector() {
        // maxps(k, x) is bitselect(x < k, k, x); minps(k, x) is bitselect(k < x, k, x).
        let m = if cc == FloatCC::LessThan {
            b.ins().fcmp(FloatCC::LessThan, x, k)
        } else {
            b.ins().fcmp(FloatCC::LessThan, k, x)
        };
        let m = b.ins().bitcast(ty, lanes(ty), m);
        b.ins().bitselect(m, k, x)
    } else {
        let past = b.ins().fcmp(cc, x, k);
        b.ins().select(past, k, x)
    }
}

/// e^x for f32 or f32x4 `x` (see the module docs).
pub(crate) fn exp(b: &mut FunctionBuilder<'_>, x: Value, fma: bool) -> Value {
    let ty = b.func.dfg.value_type(x);
    let lo = c(b, ty, EXP_LO);
    let hi = c(b, ty, EXP_HI);
    let x = clamp_const(b, ty, x, lo, FloatCC::LessThan);
    let x = clamp_const(b, ty, x, hi, FloatCC::GreaterThan);
    // n = round(x·log2 e): adding 1.5·2²³ leaves n in the low mantissa bits.
    let log2e = c(b, ty, std::f32::consts::LOG2_E);
    let magic = c(b, ty, MAGIC);
    let tm = mul_add(b, fma, x, log2e, magic);
    let nf = b.ins().fsub(tm, magic);
    let it = int_ty(ty);
    let tbits = b.ins().bitcast(it, lanes(ty), tm);
    let mbits = ci(b, ty, 0x4B40_0000);
    let n = b.ins().isub(tbits, mbits);
    // r = x − n·ln2, ln2 = C1 + C2 with C1 = 0.693359375 (n·C1 exact).
    let r = if fma {
        let c1 = c(b, ty, -LN2_C1);
        let c2 = c(b, ty, -LN2_C2);
        let r = b.ins().fma(nf, c1, x);
        b.ins().fma(nf, c2, r)
    } else {
        let c1 = c(b, ty, LN2_C1);
        let c2 = c(b, ty, LN2_C2);
        let a = b.ins().fmul(nf, c1);
        let r = b.ins().fsub(x, a);
        let a = b.ins().fmul(nf, c2);
        b.ins().fsub(r, a)
    };
    // e^r ≈ 1 + r + r²·P(r).
    let r2 = b.ins().fmul(r, r);
    let p = exp_poly(b, ty, r, r2, fma);
    let p = mul_add(b, fma, p, r2, r);
    let one = c(b, ty, 1.0);
    let p = b.ins().fadd(p, one);
    // Scale by 2^n in two halves (n in [−150, 129]).
    let n1 = b.ins().sshr_imm_u(n, 1);
    let n2 = b.ins().isub(n, n1);
    let s1 = pow2(b, ty, n1);
    let s2 = pow2(b, ty, n2);
    let p = b.ins().fmul(p, s1);
    b.ins().fmul(p, s2)
}

/// exp's `P(r)` ([`EXP_P`], degree 5) in three pairs `a₂ᵢ₊₁·r + a₂ᵢ` joined by `r²`
/// (`(q₀ + q₁·r²) + (q₂·r²)·r²`): three dependent steps after the pairs, where Horner
/// takes five; each step a [`mul_add`], in the order [`Vx::exp`] takes them.
fn exp_poly(b: &mut FunctionBuilder<'_>, ty: Type, r: Value, r2: Value, fma: bool) -> Value {
    let a = |i: usize| EXP_P[5 - i];
    let pair = |b: &mut FunctionBuilder<'_>, i: usize| {
        let (hi, lo) = (c(b, ty, a(2 * i + 1)), c(b, ty, a(2 * i)));
        mul_add(b, fma, hi, r, lo)
    };
    let q0 = pair(b, 0);
    let q1 = pair(b, 1);
    let s = mul_add(b, fma, q1, r2, q0);
    let q2 = pair(b, 2);
    let t = b.ins().fmul(q2, r2);
    mul_add(b, fma, t, r2, s)
}

/// exp's polynomial for `(eʳ − 1 − r) / r²`, highest degree first.
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];
/// erf's odd series in `x²` for `|x| < 0.5`, highest degree first.
const ERF_SMALL: [f32; 8] =
    [-1.0 / 75600.0, 1.0 / 9360.0, -1.0 / 1320.0, 1.0 / 216.0, -1.0 / 42.0, 1.0 / 10.0, -1.0 / 3.0, 1.0];
/// `ln erfc(z) + z²` for `z` in [½, 4] as a polynomial in `s = z − ½`, highest degree
/// first: a least-squares fit weighted by what an error in it costs erf in ulps
/// (`erfc(z)` over the ulp of `erf(z)`), iterated towards the smallest largest error.
const ERF_BIG: [f32; 7] =
    [2.246_957_4e-4, -2.630_338_8e-3, 1.576_999_8e-2, -6.709_165e-2, 0.236_951_9, -0.832_705_6, -0.485_011_13];
/// erf's upper clamp: `erf(z)` rounds to 1 from z = 3.92 on.
const ERF_HI: f32 = 4.0;
/// exp's clamp, magic rounding constant (1.5·2²³) and `ln2 = C1 + C2`.
const EXP_LO: f32 = -104.0;
const EXP_HI: f32 = 89.0;
const MAGIC: f32 = 12_582_912.0;
const LN2_C1: f32 = 0.693_359_4;
const LN2_C2: f32 = -2.121_944_4e-4;

/// erf(x) for f32 or f32x4 `x` (see the module docs).
pub(crate) fn erf(b: &mut FunctionBuilder<'_>, x: Value, fma: bool) -> Value {
    let ty = b.func.dfg.value_type(x);
    // Small |x|: odd series.
    let x2 = b.ins().fmul(x, x);
    let s = horner(b, ty, x2, &ERF_SMALL, fma);
    let k = c(b, ty, std::f32::consts::FRAC_2_SQRT_PI);
    let sx = b.ins().fmul(s, x);
    let small = b.ins().fmul(sx, k);
    // Elsewhere: 1 − erfc(|x|) with erfc(z) = exp(P(z − ½) − x²), P fitted to
    // ln erfc(z) + z² on [½, 4]; z clamped to 4 (past it x² alone takes erfc below
    // what 1 − erfc can show).
    let z = b.ins().fabs(x);
    let half = c(b, ty, 0.5);
    let one = c(b, ty, 1.0);
    let hi = c(b, ty, ERF_HI);
    let zc = clamp_const(b, ty, z, hi, FloatCC::GreaterThan);
    let s = b.ins().fsub(zc, half);
    let p = erf_poly(b, ty, s, fma);
    let e = b.ins().fsub(p, x2);
    let erfc = exp(b, e, fma);
    let big = b.ins().fsub(one, erfc);
    // With the sign of x (big ≥ 0: or-ing in x's sign bit is copysign).
    let it = int_ty(ty);
    let xi = b.ins().bitcast(it, lanes(ty), x);
    let signbit = ci(b, ty, i32::MIN);
    let sign = b.ins().band(xi, signbit);
    let bi = b.ins().bitcast(it, lanes(ty), big);
    let bi = b.ins().bor(bi, sign);
    let big = b.ins().bitcast(ty, lanes(ty), bi);
    let is_small = b.ins().fcmp(FloatCC::LessThan, z, half);
    if ty.is_vector() {
        let m = b.ins().bitcast(ty, lanes(ty), is_small);
        b.ins().bitselect(m, small, big)
    } else {
        b.ins().select(is_small, small, big)
    }
}

/// `cond ? t : f` for f32 or f32x4 values (`cond` a comparison of the same width).
fn pick(b: &mut FunctionBuilder<'_>, ty: Type, cond: Value, t: Value, f: Value) -> Value {
    if ty.is_vector() {
        let m = b.ins().bitcast(ty, lanes(ty), cond);
        b.ins().bitselect(m, t, f)
    } else {
        b.ins().select(cond, t, f)
    }
}

/// tanh(x) for f32 or f32x4 `x` (see the module docs).
pub(crate) fn tanh(b: &mut FunctionBuilder<'_>, x: Value, fma: bool) -> Value {
    let ty = b.func.dfg.value_type(x);
    let z = b.ins().fabs(x);
    let it = int_ty(ty);
    let xi = b.ins().bitcast(it, lanes(ty), x);
    let signbit = ci(b, ty, i32::MIN);
    let sign = b.ins().band(xi, signbit);
    // Small |x|: |x| + |x|³·P(x²).
    let z2 = b.ins().fmul(z, z);
    let p = horner(b, ty, z2, &TANH_P, fma);
    let z3 = b.ins().fmul(z2, z);
    let small = mul_add(b, fma, p, z3, z);
    let limit = c(b, ty, TANH_SMALL);
    let is_small = b.ins().fcmp(FloatCC::LessThan, z, limit);
    // Elsewhere: 1 − 2/(e^{2|x|} + 1).
    let twice = b.ins().fadd(z, z);
    let e = exp(b, twice, fma);
    let one = c(b, ty, 1.0);
    let d = b.ins().fadd(e, one);
    let two = c(b, ty, 2.0);
    let q = b.ins().fdiv(two, d);
    let big = b.ins().fsub(one, q);
    // With the sign of x (both forms are ≥ 0, so or-ing in x's sign bit is copysign;
    // −0 stays −0).
    let r = pick(b, ty, is_small, small, big);
    let ri = b.ins().bitcast(it, lanes(ty), r);
    let ri = b.ins().bor(ri, sign);
    b.ins().bitcast(ty, lanes(ty), ri)
}

/// ln(x) for f32 or f32x4 `x` (see the module docs).
pub(crate) fn log(b: &mut FunctionBuilder<'_>, x: Value, fma: bool) -> Value {
    let ty = b.func.dfg.value_type(x);
    let it = int_ty(ty);
    let fc = |b: &mut FunctionBuilder<'_>, v: f32| c(b, ty, v);
    // Subnormals (and what the specials below replace) scaled into the normal range.
    let min_normal = fc(b, f32::MIN_POSITIVE);
    let tiny = b.ins().fcmp(FloatCC::LessThan, x, min_normal);
    let scale = fc(b, ty_scale());
    let xs = b.ins().fmul(x, scale);
    let xs = pick(b, ty, tiny, xs, x);
    // x = 2^e · m, m in [√½, √2).
    let bits = b.ins().bitcast(it, lanes(ty), xs);
    let half_root = ci(b, ty, SQRT_HALF_BITS);
    let i = b.ins().isub(bits, half_root);
    let e = b.ins().sshr_imm_u(i, 23);
    let mant = ci(b, ty, 0x007f_ffff);
    let mi = b.ins().band(i, mant);
    let mi = b.ins().iadd(mi, half_root);
    let m = b.ins().bitcast(ty, lanes(ty), mi);
    let magic_bits = ci(b, ty, 0x4B40_0000);
    let eb = b.ins().iadd(e, magic_bits);
    let ef = b.ins().bitcast(ty, lanes(ty), eb);
    let magic = fc(b, MAGIC);
    let ef = b.ins().fsub(ef, magic);
    let k23 = fc(b, 23.0);
    let e23 = b.ins().fsub(ef, k23);
    let ef = pick(b, ty, tiny, e23, ef);
    // log m = f − f²/2 + f³·P(f), f = m − 1; plus e·ln2.
    let one = fc(b, 1.0);
    let f = b.ins().fsub(m, one);
    let z = b.ins().fmul(f, f);
    let p = horner(b, ty, f, &LOG_P, fma);
    let p = b.ins().fmul(p, f);
    let p = b.ins().fmul(p, z);
    let mul_add_c = |b: &mut FunctionBuilder<'_>, x: Value, k: f32, acc: Value| -> Value {
        let kk = c(b, ty, k);
        mul_add(b, fma, x, kk, acc)
    };
    let p = mul_add_c(b, ef, LN2_C2, p);
    let p = mul_add_c(b, z, -0.5, p);
    let p = b.ins().fadd(p, f);
    let r = mul_add_c(b, ef, LN2_C1, p);
    // +inf and NaN: x; x ≤ 0: √x − ∞ (−inf for ±0, NaN below).
    let inf = fc(b, f32::INFINITY);
    let finite = b.ins().fcmp(FloatCC::LessThan, x, inf);
    let r = pick(b, ty, finite, r, x);
    let zero = fc(b, 0.0);
    let nonpos = b.ins().fcmp(FloatCC::LessThanOrEqual, x, zero);
    let root = b.ins().sqrt(x);
    let ninf = fc(b, f32::NEG_INFINITY);
    let special = b.ins().fadd(root, ninf);
    pick(b, ty, nonpos, special, r)
}

/// 2²³, the factor that makes a subnormal normal.
const fn ty_scale() -> f32 {
    8_388_608.0
}

/// tanh's series part for `|x| < TANH_SMALL`: `(tanh x − x)/x³ ≈ P(x²)`, highest degree
/// first (a least-squares fit to the relative error on [0, 0.625]).
const TANH_P: [f32; 6] = [
    f32::from_bits(0x3b0c_d5bf),
    f32::from_bits(0xbc06_18e6),
    f32::from_bits(0x3cb1_cc94),
    f32::from_bits(0xbd5c_f801),
    f32::from_bits(0x3e08_8837),
    f32::from_bits(0xbeaa_aaaa),
];
/// Where tanh switches from the series to the exponential form.
const TANH_SMALL: f32 = 0.625;
/// Cephes `logf`'s polynomial: `(log(1 + f) − f + f²/2)/f³ ≈ P(f)` on [√½ − 1, √2 − 1],
/// highest degree first.
const LOG_P: [f32; 9] = [
    7.037_683_6e-2,
    -1.151_461e-1,
    1.167_699_9e-1,
    -1.242_014_1e-1,
    1.424_932_3e-1,
    -1.666_805_8e-1,
    2.000_071_5e-1,
    -2.499_999_4e-1,
    3.333_333e-1,
];
/// The bits of √½ rounded down to an f32 (0.70710677).
const SQRT_HALF_BITS: i32 = 0x3f35_04f3;

/// Scratch registers [`Vx::unary`] needs for `op`.
pub(crate) fn vector_scratch(op: UnaryOp) -> usize {
    match op {
        UnaryOp::Exp => 4,
        UnaryOp::Erf | UnaryOp::Tanh => 8,
        UnaryOp::Log => 6,
        _ => 0,
    }
}

/// Scratch registers [`Vx::logistic`] needs.
pub(crate) const LOGISTIC_SCRATCH: usize = 5;

/// The logistic function as `kiln-lower` writes it, found at a node by [`logistic_of`].
pub(crate) struct Logistic {
    /// The argument.
    pub x: ExprId,
    /// The form's inner nodes, each with how many of the form's edges read it (one of
    /// each but `e` and the constant 1, which two read).
    pub inner: [(ExprId, u32); 8],
}

/// The logistic function at node `e`, written as `kiln-lower` writes it (Sigmoid,
/// SiLU's and the recurrent gates' σ): `select(x ≥ 0, 1, e)/(1 + e)` with
/// `e = e^{−|x|}`, in f32, the one node `e` under both and `1` the same constant.
pub(crate) fn logistic_of(k: &Kernel, e: ExprId) -> Option<Logistic> {
    let f32_node = |e: ExprId| (k.node(e).ty == ScalarType::F32).then(|| &k.node(e).expr);
    let Some(&Expr::Binary(BinaryOp::Div, num, den)) = f32_node(e) else { return None };
    let Some(&Expr::Select(c, one, ex)) = f32_node(num) else { return None };
    let Some(&Expr::Binary(BinaryOp::Add, one2, ex2)) = f32_node(den) else { return None };
    let Expr::Binary(BinaryOp::Ge, x, zero) = k.node(c).expr else { return None };
    let Some(&Expr::Unary(UnaryOp::Exp, na)) = f32_node(ex) else { return None };
    let Some(&Expr::Unary(UnaryOp::Neg, a)) = f32_node(na) else { return None };
    let Some(&Expr::Unary(UnaryOp::Abs, x2)) = f32_node(a) else { return None };
    let bits = |e: ExprId| match k.node(e).expr {
        Expr::Const(b) => Some(b as u32),
        _ => None,
    };
    let ok = one == one2
        && ex == ex2
        && x == x2
        && k.node(x).ty == ScalarType::F32
        && bits(one) == Some(1f32.to_bits())
        && bits(zero) == Some(0);
    let inner = [(num, 1), (den, 1), (c, 1), (ex, 2), (na, 1), (a, 1), (one, 2), (zero, 1)];
    ok.then_some(Logistic { x, inner })
}

/// Scratch registers [`Vx::pow`] needs.
pub(crate) const POW_SCRATCH: usize = 7;

/// Whether [`Vx::unary`] has a form for `op`.
pub(crate) fn has_vector_form(op: UnaryOp) -> bool {
    matches!(
        op,
        UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Exp | UnaryOp::Erf | UnaryOp::Tanh | UnaryOp::Log
    )
}

/// The constants a 16-lane kernel (a row kernel, a 512-bit tile's epilogue) holds in
/// `zmm16`–`zmm31` for its whole run, given the nodes it evaluates: exp's where it
/// computes exp, erf or tanh, then its own f32 constants, then erf's, tanh's and log's,
/// the first 16. Read as
/// memory operands, a polynomial's coefficients cost a load each, and those loads bound
/// exp on this machine (see `super::rows`).
pub(crate) fn held_constants<'a>(nodes: impl Iterator<Item = &'a Node> + Clone) -> Vec<(u32, V)> {
    // A pow computes exp and log.
    let pow = nodes.clone().any(|n| matches!(n.expr, Expr::Binary(kiln_flow::BinaryOp::Pow, ..)));
    let has = |op: UnaryOp| {
        (pow && matches!(op, UnaryOp::Exp | UnaryOp::Log))
            || nodes.clone().any(|n| matches!(n.expr, Expr::Unary(o, _) if o == op))
    };
    let mut bits: Vec<u32> = Vec::new();
    if has(UnaryOp::Exp) || has(UnaryOp::Erf) || has(UnaryOp::Tanh) {
        bits.extend(exp_constants(true));
    }
    let mut own: Vec<u32> = nodes
        .clone()
        .filter_map(|n| match (&n.expr, n.ty) {
            (&Expr::Const(c), ScalarType::F32) => Some(c as u32),
            _ => None,
        })
        .collect();
    // (A hash map's order in the epilogue's case: sorted, so the code is reproducible.)
    own.sort_unstable();
    bits.extend(own);
    if has(UnaryOp::Erf) {
        bits.extend(erf_constants());
    }
    if has(UnaryOp::Tanh) {
        bits.extend(TANH_P.iter().chain(&[TANH_SMALL, 2.0]).map(|x| x.to_bits()));
        bits.extend([0x7fff_ffff, 0x8000_0000]);
    }
    if has(UnaryOp::Log) {
        bits.extend(LOG_P.iter().chain(&[1.0, -0.5, LN2_C1, LN2_C2]).map(|x| x.to_bits()));
        bits.extend([SQRT_HALF_BITS as u32, 0x007f_ffff, 0x4B40_0000]);
    }
    let mut held: Vec<(u32, V)> = Vec::new();
    for b in bits {
        if held.len() < HELD && !held.iter().any(|h| h.0 == b) {
            held.push((b, V(16 + held.len() as u8)));
        }
    }
    held
}

/// Constant registers of a 16-lane kernel (`zmm16`–`zmm31`).
const HELD: usize = 16;

/// The constants exp reads, most used first.
fn exp_constants(wide: bool) -> Vec<u32> {
    let mut c: Vec<u32> = [EXP_LO, EXP_HI, MAGIC, std::f32::consts::LOG2_E, -LN2_C1, -LN2_C2]
        .iter()
        .chain(&EXP_P)
        .chain(&[1.0])
        .map(|x| x.to_bits())
        .collect();
    if !wide {
        c.push(127);
    }
    c
}

/// The constants erf reads besides exp's.
fn erf_constants() -> Vec<u32> {
    let mut c: Vec<u32> = ERF_SMALL
        .iter()
        .chain(&ERF_BIG)
        .chain(&[std::f32::consts::FRAC_2_SQRT_PI, 0.5, ERF_HI])
        .map(|x| x.to_bits())
        .collect();
    c.extend([0x7fff_ffff, 0x8000_0000]);
    c
}

impl Vx<'_> {
    /// `dst = op(x)` for an operation [`has_vector_form`]; `dst` may be `x`; `t` holds at
    /// least [`vector_scratch`] registers distinct from both.
    pub fn unary(&mut self, op: UnaryOp, dst: V, x: V, t: &[V]) -> R<()> {
        match op {
            UnaryOp::Sqrt => self.sqrt(dst, x),
            UnaryOp::Neg => self.op(Op::Xor, dst, x, Src::C(0x8000_0000)),
            UnaryOp::Abs => self.op(Op::And, dst, x, Src::C(0x7fff_ffff)),
            UnaryOp::Exp => self.exp(dst, x, [t[0], t[1], t[2], t[3]]),
            UnaryOp::Tanh => self.tanh(dst, x, [t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]),
            UnaryOp::Log => self.log(dst, x, [t[0], t[1], t[2], t[3], t[4], t[5]]),
            _ => self.erf(dst, x, [t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]),
        }
    }

    /// A register holding constant `x`: the kernel's, or `scratch` filled with it.
    fn const_reg(&mut self, x: f32, scratch: V) -> R<V> {
        match self.held(x.to_bits()) {
            Some(v) => Ok(v),
            None => {
                let l = self.t.scalar(self.a, x.to_bits());
                self.broadcast(scratch, dword_ptr(l))?;
                Ok(scratch)
            }
        }
    }

    /// `p = horner(x, coefs)` (FMA steps, as the general path's on a target with FMA).
    fn horner(&mut self, p: V, x: V, coefs: &[f32]) -> R<()> {
        self.mov(p, Src::C(coefs[0].to_bits()))?;
        for &c in &coefs[1..] {
            self.op(Op::Fma213, p, x, Src::C(c.to_bits()))?;
        }
        Ok(())
    }

    /// `dst = exp(x)`; `dst` may be `x`; `t` are scratch, distinct from both.
    pub fn exp(&mut self, dst: V, x: V, t: [V; 4]) -> R<()> {
        let k = t[0];
        // Clamp, constant first so a NaN x is what comes out.
        let lo = self.const_reg(EXP_LO, k)?;
        self.op(Op::Max, dst, lo, Src::R(x))?;
        let hi = self.const_reg(EXP_HI, k)?;
        self.op(Op::Min, dst, hi, Src::R(dst))?;
        self.exp_clamped(dst, t, false)
    }

    /// `dst = e^dst` for `dst` at most about 0 (never near exp's overflow): only exp's
    /// lower clamp, and 2ⁿ in one step, 0 where the result would be subnormal; else
    /// exp's bits. Scratch `t` as [`Self::exp`]'s.
    fn exp_flushed(&mut self, dst: V, t: [V; 4]) -> R<()> {
        let lo = self.const_reg(EXP_LO, t[0])?;
        self.op(Op::Max, dst, lo, Src::R(dst))?;
        self.exp_clamped(dst, t, true)
    }

    /// `dst = e^dst` for `dst` already clamped to exp's range; `flush`: 2ⁿ in one step,
    /// not in two halves, 0 where it is not a normal number (n < −126: the result is 0
    /// where it would be subnormal, else the same).
    fn exp_clamped(&mut self, dst: V, t: [V; 4], flush: bool) -> R<()> {
        let [k, n, nf, p] = t;
        let c = |x: f32| Src::C(x.to_bits());
        self.mov(n, c(MAGIC))?;
        self.op(Op::Fma231, n, dst, c(std::f32::consts::LOG2_E))?; // x·log2 e + magic
        self.op(Op::Sub, nf, n, c(MAGIC))?;
        self.op(Op::Fma231, dst, nf, c(-LN2_C1))?;
        self.op(Op::Fma231, dst, nf, c(-LN2_C2))?; // r

        // P(r) as `exp_poly` (the general path's form) takes it, in pairs joined by r²
        // (k); `q` is free from here: nf on 8 lanes (the scaling below recomputes it
        // from n), n on 16 (its scaling reads nf).
        let q = if self.wide { n } else { nf };
        let a = |i: usize| c(EXP_P[5 - i]);
        self.op(Op::Mul, k, dst, Src::R(dst))?; // r²
        self.mov(p, a(1))?;
        self.op(Op::Fma213, p, dst, a(0))?; // q0
        self.mov(q, a(3))?;
        self.op(Op::Fma213, q, dst, a(2))?; // q1
        self.op(Op::Fma231, p, q, Src::R(k))?; // q1·r² + q0
        self.mov(q, a(5))?;
        self.op(Op::Fma213, q, dst, a(4))?; // q2
        self.op(Op::Mul, q, q, Src::R(k))?;
        self.op(Op::Fma231, p, q, Src::R(k))?; // (q2·r²)·r² + …
        self.op(Op::Fma213, p, k, Src::R(dst))?; // p·r² + r
        self.op(Op::Add, p, p, c(1.0))?;
        if self.wide {
            // p·2ⁿ rounded once, as the two halves below round it.
            return self.op(Op::Scalef, dst, p, Src::R(nf));
        }
        if flush {
            // MAGIC's bits are 0x4B40_0000 + n: 2ⁿ's bits are (n + 127) << 23, and 0
            // for n + 127 ≤ 0.
            self.op(Op::SubI, n, n, Src::C(MAGIC.to_bits() - 127))?;
            self.op(Op::MaxI, n, n, Src::C(0))?;
            self.sll(n, n, 23)?;
            return self.op(Op::Mul, dst, p, Src::R(n));
        }
        // MAGIC's bits are 0x4B40_0000: n's integer value; 2^n in two halves.
        self.op(Op::SubI, n, n, c(MAGIC))?;
        self.sra(nf, n, 1)?;
        self.op(Op::SubI, n, n, Src::R(nf))?;
        self.op(Op::AddI, nf, nf, Src::C(127))?;
        self.sll(nf, nf, 23)?;
        self.op(Op::Mul, p, p, Src::R(nf))?;
        self.op(Op::AddI, n, n, Src::C(127))?;
        self.sll(n, n, 23)?;
        self.op(Op::Mul, dst, p, Src::R(n))
    }

    /// `dst = σ(x) = select(x ≥ 0, 1, e)/(1 + e)` with `e = e^{−|x|}`, the form
    /// Sigmoid is lowered to ([`logistic_of`] recognises it): the same bits as that
    /// form's nodes one by one, except below x ≈ −87.7 (`n < −126`), where `e` would be
    /// subnormal and is 0 instead (an absolute error under 1.2·10⁻³⁸). That spares exp its upper
    /// clamp (the argument is never positive) and its scaling in two halves, and `−|x|`
    /// is one `or`: 26 instructions where the nodes take 32, on the chain a SiLU's
    /// epilogue waits on. `dst` may be `x`; `t` are scratch, distinct from both.
    pub fn logistic(&mut self, dst: V, x: V, t: [V; LOGISTIC_SCRATCH]) -> R<()> {
        let [k, n, nf, p, mask] = t;
        let m = if self.wide { Mask(2) } else { Mask(mask.0) };
        self.cmp(m, x, Src::C(0), float_pred(BinaryOp::Ge))?;
        // x is not read again: dst is free from here on.
        self.op(Op::Or, dst, x, Src::C(0x8000_0000))?; // −|x|
        self.exp_flushed(dst, [k, n, nf, p])?;
        self.op(Op::Add, k, dst, Src::C(1f32.to_bits()))?;
        let one = self.const_reg(1.0, n)?;
        self.blend(dst, m, dst, one)?;
        self.op(Op::Div, dst, dst, Src::R(k))
    }

    /// `p` = erf's `P(s)` by Estrin's scheme, step for step as [`erf_poly`] (the general
    /// path's form); `t` are scratch, distinct from `p` and `s`.
    fn erf_poly(&mut self, p: V, s: V, t: [V; 3]) -> R<()> {
        let [u, s2, k] = t;
        let a = |i: usize| Src::C(ERF_BIG[6 - i].to_bits());
        let pair = |e: &mut Self, r: V, i: usize| -> R<()> {
            e.mov(r, a(2 * i + 1))?;
            e.op(Op::Fma213, r, s, a(2 * i)) // a₂ᵢ₊₁·s + a₂ᵢ
        };
        pair(self, p, 0)?; // q0
        pair(self, u, 1)?; // q1
        self.op(Op::Mul, s2, s, Src::R(s))?;
        self.op(Op::Fma231, p, u, Src::R(s2))?; // r0 = q1·s² + q0
        pair(self, u, 2)?; // q2
        self.mov(k, a(6))?;
        self.op(Op::Fma213, k, s2, Src::R(u))?; // r1 = a6·s² + q2
        self.op(Op::Mul, s2, s2, Src::R(s2))?; // s⁴
        self.op(Op::Fma231, p, k, Src::R(s2)) // r1·s⁴ + r0
    }

    /// `dst = erf(x)`; `dst` may be `x`; `t` are scratch, distinct from both.
    pub fn erf(&mut self, dst: V, x: V, t: [V; 8]) -> R<()> {
        let [x2, small, k, z, sign, mask, e, u] = t;
        let c = |x: f32| Src::C(x.to_bits());
        // The lane choice: the scratch register, or an opmask register (k1 is a row
        // kernel's tail mask).
        let m = if self.wide { Mask(2) } else { Mask(mask.0) };
        self.op(Op::Mul, x2, x, Src::R(x))?;
        self.horner(small, x2, &ERF_SMALL)?;
        self.op(Op::Mul, small, small, Src::R(x))?;
        self.op(Op::Mul, small, small, c(std::f32::consts::FRAC_2_SQRT_PI))?;
        self.op(Op::And, z, x, Src::C(0x7fff_ffff))?;
        self.op(Op::And, sign, x, Src::C(0x8000_0000))?;
        // x is not read again: dst is free from here on.
        self.cmp(m, z, c(0.5), 0x11)?; // z < 0.5 (LT_OQ)
        let hi = self.const_reg(ERF_HI, k)?;
        self.op(Op::Min, z, hi, Src::R(z))?; // constant first: NaN stays
        self.op(Op::Sub, z, z, c(0.5))?; // s
        self.erf_poly(e, z, [u, dst, k])?;
        self.op(Op::Sub, e, e, Src::R(x2))?; // P(s) − x²
                                             // erfc: where it would be subnormal 1 − erfc is 1 either way, so the general
                                             // path's bits.
        self.exp_flushed(e, [x2, k, u, dst])?;
        let one = self.const_reg(1.0, k)?;
        self.op(Op::Sub, e, one, Src::R(e))?;
        self.op(Op::Or, e, e, Src::R(sign))?;
        self.blend(dst, m, e, small)
    }

    /// `dst = tanh(x)`; `dst` may be `x`; `t` are scratch, distinct from both.
    pub fn tanh(&mut self, dst: V, x: V, t: [V; 8]) -> R<()> {
        let [z2, small, z, sign, mask, k, n, nf] = t;
        let c = |x: f32| Src::C(x.to_bits());
        let m = if self.wide { Mask(2) } else { Mask(mask.0) };
        self.op(Op::And, z, x, Src::C(0x7fff_ffff))?;
        self.op(Op::And, sign, x, Src::C(0x8000_0000))?;
        // x is not read again: dst is free from here on.
        self.op(Op::Mul, z2, z, Src::R(z))?;
        self.horner(small, z2, &TANH_P)?;
        self.op(Op::Mul, z2, z2, Src::R(z))?; // |x|³
        self.op(Op::Fma213, small, z2, Src::R(z))?; // |x| + |x|³·P(x²)
        self.cmp(m, z, c(TANH_SMALL), 0x11)?; // |x| < 0.625 (LT_OQ)
        self.op(Op::Add, z, z, Src::R(z))?;
        self.exp(z, z, [k, n, nf, z2])?;
        self.op(Op::Add, z, z, c(1.0))?;
        let two = self.const_reg(2.0, k)?;
        self.op(Op::Div, z, two, Src::R(z))?;
        let one = self.const_reg(1.0, k)?;
        self.op(Op::Sub, z, one, Src::R(z))?;
        self.blend(dst, m, z, small)?;
        self.op(Op::Or, dst, dst, Src::R(sign))
    }

    /// `dst = ln(x)`; `dst` may be `x`; `t` are scratch, distinct from both.
    pub fn log(&mut self, dst: V, x: V, t: [V; 6]) -> R<()> {
        let [xs, e, f, p, k, mask] = t;
        let c = |x: f32| Src::C(x.to_bits());
        let m = if self.wide { Mask(2) } else { Mask(mask.0) };
        self.cmp(m, x, c(f32::MIN_POSITIVE), 0x11)?; // subnormal (LT_OQ)
        self.op(Op::Mul, xs, x, c(ty_scale()))?;
        self.blend(xs, m, x, xs)?;
        self.op(Op::SubI, xs, xs, Src::C(SQRT_HALF_BITS as u32))?;
        self.sra(e, xs, 23)?;
        self.op(Op::And, xs, xs, Src::C(0x007f_ffff))?;
        self.op(Op::AddI, xs, xs, Src::C(SQRT_HALF_BITS as u32))?; // m
        self.op(Op::AddI, e, e, Src::C(0x4B40_0000))?;
        self.op(Op::Sub, e, e, c(MAGIC))?;
        self.op(Op::Sub, k, e, c(23.0))?;
        self.blend(e, m, e, k)?;
        self.op(Op::Sub, f, xs, c(1.0))?;
        self.op(Op::Mul, k, f, Src::R(f))?; // f²
        self.horner(p, f, &LOG_P)?;
        self.op(Op::Mul, p, p, Src::R(f))?;
        self.op(Op::Mul, p, p, Src::R(k))?;
        self.op(Op::Fma231, p, e, c(LN2_C2))?;
        self.op(Op::Fma231, p, k, c(-0.5))?;
        self.op(Op::Add, p, p, Src::R(f))?;
        self.op(Op::Fma231, p, e, c(LN2_C1))?;
        // +inf and NaN: x (not x < inf: NLT_UQ); x ≤ 0: √x − ∞.
        self.cmp(m, x, c(f32::INFINITY), 0x15)?;
        self.blend(p, m, p, x)?;
        self.cmp(m, x, c(0.0), 0x12)?; // x ≤ 0 (LE_OQ)
        self.sqrt(k, x)?;
        self.op(Op::Add, k, k, c(f32::NEG_INFINITY))?;
        self.blend(dst, m, p, k)
    }

    /// `dst = x^y` (see the module docs); `dst` may be `x` or `y`; `t` are scratch,
    /// distinct from all three.
    pub fn pow(&mut self, dst: V, x: V, yv: V, t: [V; POW_SCRATCH]) -> R<()> {
        let [r, a, b, c, e, f, g] = t;
        let k = |x: f32| Src::C(x.to_bits());
        let m = if self.wide { Mask(2) } else { Mask(g.0) };
        // exp(y·ln|x|).
        self.op(Op::And, r, x, Src::C(0x7fff_ffff))?;
        self.log(r, r, [a, b, c, e, f, g])?;
        self.op(Op::Mul, r, r, Src::R(yv))?;
        self.exp(r, r, [a, b, c, e])?;
        // The sign of a negative x (−0 and −∞ included) to an odd integer power: y's
        // truncation's last bit moved to the sign, kept where y is an integer (a y of
        // 2³¹ or more converts to 0x8000_0000, even, as every such float is).
        self.round(a, yv, 11)?;
        if self.wide {
            self.a.vcvttps2dq(super::vector::z(b), super::vector::z(yv))?;
        } else {
            self.a.vcvttps2dq(super::vector::y(b), super::vector::y(yv))?;
        }
        self.sll(b, b, 31)?;
        self.cmp(m, a, Src::R(yv), 0x00)?; // EQ_OQ: y is an integer (±inf included)
        self.zero_unmasked(b, m)?;
        self.op(Op::And, b, b, Src::R(x))?;
        self.op(Op::Xor, r, r, Src::R(b))?;
        // NaN for a finite negative x and a non-integer y (x < x − x: x finite, negative).
        self.cmp(m, a, Src::R(yv), 0x04)?; // NEQ_UQ
        self.mov(b, Src::C(0x7fc0_0000))?;
        self.blend(b, m, r, b)?;
        self.op(Op::Sub, c, x, Src::R(x))?;
        self.cmp(m, x, Src::R(c), 0x11)?; // LT_OQ
        self.blend(r, m, r, b)?;
        // 1 for |x| = 1 and |y| = inf, for y = ±0 and for x = 1 (NaN in the other
        // operand included), where y·ln|x| is 0·inf or NaN.
        let one = self.const_reg(1.0, b)?;
        self.op(Op::And, a, yv, Src::C(0x7fff_ffff))?;
        self.cmp(m, a, k(f32::INFINITY), 0x00)?;
        self.blend(c, m, r, one)?;
        self.op(Op::And, e, x, Src::C(0x7fff_ffff))?;
        self.cmp(m, e, k(1.0), 0x00)?;
        self.blend(r, m, r, c)?;
        self.cmp(m, yv, k(0.0), 0x00)?;
        self.blend(r, m, r, one)?;
        self.cmp(m, x, k(1.0), 0x00)?;
        self.blend(dst, m, r, one)
    }
}
