//! Inline f32 transcendentals: `exp` and `erf` as straight-line Cranelift IR that is
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
//! operations fewer, which the 16-lane row kernels need most). Measured maximum error
//! against f64 `exp` over every 1021st f32 in [−103, 88.72] (`tests/math.rs`): 0.94 ulp
//! without FMA, 0.99 with.
//!
//! ## erf
//! `|x| < 0.5`: the odd Taylor series `2/√π·Σₙ (−1)ⁿ x²ⁿ⁺¹ / (n!(2n+1))` to `n = 7`
//! (truncation below 10⁻¹¹). Elsewhere `1 − erfc(|x|)` with the sign of `x`,
//! `erfc(z) = t·exp(−z² + P(t))`, `t = 1/(1 + z/2)` (a Chebyshev fit with fractional
//! error below 1.2·10⁻⁷, Numerical Recipes §6.2). Both are computed and one selected
//! per lane. Measured maximum error against f64 `erf` over every 1021st f32 in [−6, 6]
//! (`tests/math.rs`): 2.83 ulp without FMA, 2.49 with, just above the switch at 0.5.
//!
//! ## The same functions as machine code
//! `impl Vx` writes both functions as vector machine code (`iced-x86`) of either width
//! ([`super::vector`]): eight lanes for the contraction microkernels' epilogues (GELU and
//! sigmoid after a matrix product) and row kernels on AVX2, sixteen for row kernels and
//! 512-bit tiles' epilogues on AVX-512. It issues the same operations on the same constants in
//! the same order as the general path on a target with FMA, so every path gives the same
//! bits. The one difference: sixteen lanes scale by `2ⁿ` with one `vscalefps`, which
//! rounds `p·2ⁿ` once, exactly as the two exact-then-rounding halves do.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, ConstantData, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use iced_x86::code_asm::dword_ptr;
use kiln_flow::kernel::Node;
use kiln_flow::{Expr, ScalarType, UnaryOp};

use super::gemm::R;
use super::vector::{Mask, Op, Src, Vx, V};

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

/// Horner: `((c0·x + c1)·x + …) + cn`, each step one fused multiply-add where the
/// target has FMA (`fma`), else a multiply and an add.
fn horner(b: &mut FunctionBuilder<'_>, ty: Type, x: Value, coefs: &[f32], fma: bool) -> Value {
    let mut p = c(b, ty, coefs[0]);
    for &k in &coefs[1..] {
        let kk = c(b, ty, k);
        p = if fma {
            b.ins().fma(p, x, kk)
        } else {
            let m = b.ins().fmul(p, x);
            b.ins().fadd(m, kk)
        };
    }
    p
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
    let tm = if fma {
        b.ins().fma(x, log2e, magic)
    } else {
        let t = b.ins().fmul(x, log2e);
        b.ins().fadd(t, magic)
    };
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
    let p = horner(b, ty, r, &EXP_P, fma);
    let r2 = b.ins().fmul(r, r);
    let p = if fma {
        b.ins().fma(p, r2, r)
    } else {
        let p = b.ins().fmul(p, r2);
        b.ins().fadd(p, r)
    };
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

/// exp's polynomial for `(eʳ − 1 − r) / r²`, highest degree first.
const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];
/// erf's odd series in `x²` for `|x| < 0.5`, highest degree first.
const ERF_SMALL: [f32; 8] =
    [-1.0 / 75600.0, 1.0 / 9360.0, -1.0 / 1320.0, 1.0 / 216.0, -1.0 / 42.0, 1.0 / 10.0, -1.0 / 3.0, 1.0];
/// erfc's Chebyshev fit in `t`, highest degree first.
const ERFC_P: [f32; 10] = [
    0.170_872_77,
    -0.822_152_23,
    1.488_515_9,
    -1.135_203_98,
    0.278_868_07,
    -0.186_288_06,
    0.096_784_18,
    0.374_091_96,
    1.000_023_7,
    -1.265_512_2,
];
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
    // Elsewhere: 1 − erfc(|x|) with erfc(z) = t·exp(−z² + P(t)), t = 1/(1 + z/2).
    let z = b.ins().fabs(x);
    let half = c(b, ty, 0.5);
    let one = c(b, ty, 1.0);
    let hz = b.ins().fmul(z, half);
    let d = b.ins().fadd(hz, one);
    let t = b.ins().fdiv(one, d);
    let p = horner(b, ty, t, &ERFC_P, fma);
    let nz2 = b.ins().fneg(x2);
    let e = b.ins().fadd(nz2, p);
    let ex = exp(b, e, fma);
    let erfc = b.ins().fmul(t, ex);
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

/// Scratch registers [`Vx::unary`] needs for `op`.
pub(crate) fn vector_scratch(op: UnaryOp) -> usize {
    match op {
        UnaryOp::Exp => 4,
        UnaryOp::Erf => 8,
        _ => 0,
    }
}

/// Whether [`Vx::unary`] has a form for `op`.
pub(crate) fn has_vector_form(op: UnaryOp) -> bool {
    matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Exp | UnaryOp::Erf)
}

/// The constants a 16-lane kernel (a row kernel, a 512-bit tile's epilogue) holds in
/// `zmm16`–`zmm31` for its whole run, given the nodes it evaluates: exp's where it
/// computes exp or erf, then its own f32 constants, then erf's, the first 16. Read as
/// memory operands, a polynomial's coefficients cost a load each, and those loads bound
/// exp on this machine (see `super::rows`).
pub(crate) fn held_constants<'a>(nodes: impl Iterator<Item = &'a Node> + Clone) -> Vec<(u32, V)> {
    let has = |op: UnaryOp| nodes.clone().any(|n| matches!(n.expr, Expr::Unary(o, _) if o == op));
    let mut bits: Vec<u32> = Vec::new();
    if has(UnaryOp::Exp) || has(UnaryOp::Erf) {
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
    let mut c: Vec<u32> =
        ERF_SMALL.iter().chain(&ERFC_P).chain(&[std::f32::consts::FRAC_2_SQRT_PI, 0.5]).map(|x| x.to_bits()).collect();
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
        let [k, n, nf, p] = t;
        let c = |x: f32| Src::C(x.to_bits());
        // Clamp, constant first so a NaN x is what comes out.
        let lo = self.const_reg(EXP_LO, k)?;
        self.op(Op::Max, dst, lo, Src::R(x))?;
        let hi = self.const_reg(EXP_HI, k)?;
        self.op(Op::Min, dst, hi, Src::R(dst))?;
        self.mov(n, c(MAGIC))?;
        self.op(Op::Fma231, n, dst, c(std::f32::consts::LOG2_E))?; // x·log2 e + magic
        self.op(Op::Sub, nf, n, c(MAGIC))?;
        self.op(Op::Fma231, dst, nf, c(-LN2_C1))?;
        self.op(Op::Fma231, dst, nf, c(-LN2_C2))?; // r
        self.horner(p, dst, &EXP_P)?;
        self.op(Op::Mul, k, dst, Src::R(dst))?;
        self.op(Op::Fma213, p, k, Src::R(dst))?; // p·r² + r
        self.op(Op::Add, p, p, c(1.0))?;
        if self.wide {
            // p·2ⁿ rounded once, as the two halves below round it.
            return self.op(Op::Scalef, dst, p, Src::R(nf));
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
        self.op(Op::Mul, z, z, c(0.5))?;
        self.op(Op::Add, z, z, c(1.0))?;
        let one = self.const_reg(1.0, k)?;
        self.op(Op::Div, z, one, Src::R(z))?; // t = 1 / (1 + z/2)
        self.horner(e, z, &ERFC_P)?;
        self.op(Op::Sub, e, e, Src::R(x2))?; // −z² + P(t)
        self.exp(e, e, [x2, k, u, dst])?;
        self.op(Op::Mul, e, z, Src::R(e))?; // erfc
        let one = self.const_reg(1.0, k)?;
        self.op(Op::Sub, e, one, Src::R(e))?;
        self.op(Op::Or, e, e, Src::R(sign))?;
        self.blend(dst, m, e, small)
    }
}
