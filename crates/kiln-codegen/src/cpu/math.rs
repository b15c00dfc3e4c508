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
//! ends the result is already 0 or +inf), NaN passes through. Measured maximum error
//! against f64 `exp` over every 1021st f32 in [−103, 88.72] (`tests/math.rs`): 0.94 ulp.
//!
//! ## erf
//! `|x| < 0.5`: the odd Taylor series `2/√π·Σₙ (−1)ⁿ x²ⁿ⁺¹ / (n!(2n+1))` to `n = 7`
//! (truncation below 10⁻¹¹). Elsewhere `1 − erfc(|x|)` with the sign of `x`,
//! `erfc(z) = t·exp(−z² + P(t))`, `t = 1/(1 + z/2)` (a Chebyshev fit with fractional
//! error below 1.2·10⁻⁷, Numerical Recipes §6.2). Both are computed and one selected
//! per lane. Measured maximum error against f64 `erf` over every 1021st f32 in [−6, 6]
//! (`tests/math.rs`): 2.83 ulp, just above the switch at 0.5.
//!
//! ## The same functions as AVX2 code
//! [`Ymm`] writes both functions as AVX2 machine code (eight lanes, `iced-x86`) for the
//! contraction microkernels' epilogues (GELU and sigmoid after a matrix product). It
//! issues the same operations on the same constants in the same order (the polynomial
//! steps as FMAs, as the general path does on a target with FMA), so an epilogue gives
//! the same bits as the general code generator's loops.

use cranelift_codegen::ir::condcodes::FloatCC;
use cranelift_codegen::ir::{types, ConstantData, InstBuilder, MemFlagsData, Type, Value};
use cranelift_frontend::FunctionBuilder;
use iced_x86::code_asm::{dword_ptr, ymmword_ptr, AsmMemoryOperand, AsmRegisterYmm, CodeAssembler};
use iced_x86::IcedError;
use kiln_flow::UnaryOp;

use super::asm::Tables;

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
    let t = b.ins().fmul(x, log2e);
    let magic = c(b, ty, MAGIC);
    let tm = b.ins().fadd(t, magic);
    let nf = b.ins().fsub(tm, magic);
    let it = int_ty(ty);
    let tbits = b.ins().bitcast(it, lanes(ty), tm);
    let mbits = ci(b, ty, 0x4B40_0000);
    let n = b.ins().isub(tbits, mbits);
    // r = x − n·ln2, ln2 = C1 + C2 with C1 = 0.693359375 (n·C1 exact).
    let c1 = c(b, ty, LN2_C1);
    let c2 = c(b, ty, LN2_C2);
    let a = b.ins().fmul(nf, c1);
    let r = b.ins().fsub(x, a);
    let a = b.ins().fmul(nf, c2);
    let r = b.ins().fsub(r, a);
    // e^r ≈ 1 + r + r²·P(r).
    let p = horner(b, ty, r, &EXP_P, fma);
    let r2 = b.ins().fmul(r, r);
    let p = b.ins().fmul(p, r2);
    let p = b.ins().fadd(p, r);
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

/// The AVX2 forms (see the module docs), and the other unary operations the
/// machine-code kernels evaluate: an assembler and the kernel's constant tables
/// (scalars broadcast from 4 bytes, vectors read whole as memory operands), which the
/// kernel emits after its code.
pub(crate) struct Ymm<'a> {
    pub a: &'a mut CodeAssembler,
    pub t: &'a mut Tables,
}

type Asm = Result<(), IcedError>;

impl Ymm<'_> {
    /// Scratch registers [`Ymm::unary`] needs for `op`.
    pub fn scratch(op: UnaryOp) -> usize {
        match op {
            UnaryOp::Exp => 4,
            UnaryOp::Erf => 8,
            _ => 0,
        }
    }

    /// Whether [`Ymm::unary`] has a form for `op`.
    pub fn has(op: UnaryOp) -> bool {
        matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Exp | UnaryOp::Erf)
    }

    /// `dst = op(x)` for an operation [`Ymm::has`]; `dst` may be `x`; `t` holds at least
    /// [`Ymm::scratch`] registers distinct from both.
    pub fn unary(&mut self, op: UnaryOp, dst: AsmRegisterYmm, x: AsmRegisterYmm, t: &[AsmRegisterYmm]) -> Asm {
        match op {
            UnaryOp::Sqrt => self.a.vsqrtps(dst, x),
            UnaryOp::Neg => {
                let m = self.v(0x8000_0000);
                self.a.vxorps(dst, x, m)
            }
            UnaryOp::Abs => {
                let m = self.v(0x7fff_ffff);
                self.a.vandps(dst, x, m)
            }
            UnaryOp::Exp => self.exp(dst, x, [t[0], t[1], t[2], t[3]]),
            _ => self.erf(dst, x, [t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]]),
        }
    }

    /// `r` = eight copies of `bits`.
    fn splat(&mut self, r: AsmRegisterYmm, bits: u32) -> Asm {
        let l = self.t.scalar(self.a, bits);
        self.a.vbroadcastss(r, dword_ptr(l))
    }

    fn splat_f(&mut self, r: AsmRegisterYmm, x: f32) -> Asm {
        self.splat(r, x.to_bits())
    }

    /// Eight copies of `bits` as a memory operand.
    fn v(&mut self, bits: u32) -> AsmMemoryOperand {
        ymmword_ptr(self.t.vector(self.a, bits))
    }

    fn vf(&mut self, x: f32) -> AsmMemoryOperand {
        self.v(x.to_bits())
    }

    /// `p = horner(x, coefs)` (FMA steps, as the general path's on a target with FMA).
    fn horner(&mut self, p: AsmRegisterYmm, x: AsmRegisterYmm, coefs: &[f32]) -> Asm {
        let c0 = self.vf(coefs[0]);
        self.a.vmovups(p, c0)?;
        for &c in &coefs[1..] {
            let m = self.vf(c);
            self.a.vfmadd213ps(p, x, m)?;
        }
        Ok(())
    }

    /// `dst = exp(x)`; `dst` may be `x`; `t` are scratch, distinct from both.
    pub fn exp(&mut self, dst: AsmRegisterYmm, x: AsmRegisterYmm, t: [AsmRegisterYmm; 4]) -> Asm {
        let [k, n, nf, p] = t;
        // Clamp, constant first so a NaN x is what comes out.
        self.splat_f(k, EXP_LO)?;
        self.a.vmaxps(dst, k, x)?;
        self.splat_f(k, EXP_HI)?;
        self.a.vminps(dst, k, dst)?;
        let m = self.vf(std::f32::consts::LOG2_E);
        self.a.vmulps(n, dst, m)?;
        let magic = self.vf(MAGIC);
        self.a.vaddps(n, n, magic)?;
        self.a.vsubps(nf, n, magic)?;
        // MAGIC's bits are 0x4B40_0000: n's integer value.
        self.a.vpsubd(n, n, magic)?;
        let m = self.vf(LN2_C1);
        self.a.vmulps(k, nf, m)?;
        self.a.vsubps(dst, dst, k)?;
        let m = self.vf(LN2_C2);
        self.a.vmulps(k, nf, m)?;
        self.a.vsubps(dst, dst, k)?; // r
        self.horner(p, dst, &EXP_P)?;
        self.a.vmulps(nf, dst, dst)?;
        self.a.vmulps(p, p, nf)?;
        self.a.vaddps(p, p, dst)?;
        let one = self.vf(1.0);
        self.a.vaddps(p, p, one)?;
        // 2^n in two halves.
        self.a.vpsrad(nf, n, 1)?;
        self.a.vpsubd(n, n, nf)?;
        let bias = self.v(127);
        self.a.vpaddd(nf, nf, bias)?;
        self.a.vpslld(nf, nf, 23)?;
        self.a.vmulps(p, p, nf)?;
        self.a.vpaddd(n, n, bias)?;
        self.a.vpslld(n, n, 23)?;
        self.a.vmulps(dst, p, n)
    }

    /// `dst = erf(x)`; `dst` may be `x`; `t` are scratch, distinct from both.
    pub fn erf(&mut self, dst: AsmRegisterYmm, x: AsmRegisterYmm, t: [AsmRegisterYmm; 8]) -> Asm {
        let [x2, small, k, z, sign, mask, e, u] = t;
        self.a.vmulps(x2, x, x)?;
        self.horner(small, x2, &ERF_SMALL)?;
        self.a.vmulps(small, small, x)?;
        let m = self.vf(std::f32::consts::FRAC_2_SQRT_PI);
        self.a.vmulps(small, small, m)?;
        let m = self.v(0x7fff_ffff);
        self.a.vandps(z, x, m)?;
        let m = self.v(0x8000_0000);
        self.a.vandps(sign, x, m)?;
        // x is not read again: dst is free from here on.
        let half = self.vf(0.5);
        self.a.vcmpps(mask, z, half, 0x11)?; // z < 0.5 (LT_OQ)
        self.a.vmulps(z, z, half)?;
        let one = self.vf(1.0);
        self.a.vaddps(z, z, one)?;
        self.splat_f(k, 1.0)?;
        self.a.vdivps(z, k, z)?; // t = 1 / (1 + z/2)
        self.horner(e, z, &ERFC_P)?;
        self.a.vsubps(e, e, x2)?; // −z² + P(t)
        self.exp(e, e, [x2, k, u, dst])?;
        self.a.vmulps(e, z, e)?; // erfc
        self.splat_f(k, 1.0)?;
        self.a.vsubps(e, k, e)?;
        self.a.vorps(e, e, sign)?;
        self.a.vblendvps(dst, e, small, mask)
    }
}
