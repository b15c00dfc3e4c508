//! The 8-bit floats (`f8E4M3FN`, `f8E4M3FNUZ`, `f8E5M2`, `f8E5M2FNUZ`) and the 4-bit
//! integers (`i4`, `u4`) of the expression evaluator: loads, stores and casts with
//! `kiln_ir::lowp`'s exact semantics (the kernel interpreter's), in integer and exact
//! f32 arithmetic (no `cvt` to the hardware's e4m3/e5m2 formats: they know neither
//! the FNUZ encodings nor a non-saturating overflow). The sequences are those of the
//! CPU code generator (`cpu/emit.rs`: `f8_round`, `f8_encode`, `f8_decode`,
//! `clamp_int4`), written in PTX.
//!
//! - An 8-bit float computes in f32. A cast to one rounds once to nearest even
//!   (`|x|·2^(m−e)` is exact, adding and subtracting 2²³ rounds it to an integer,
//!   scaled back exactly), then overflow (the rounded magnitude above the largest
//!   finite value) gives ±max with `saturate`, else ±∞ (E5M2) or NaN; the FNUZ types
//!   have no −0. The value of a cast is that rounded f32. A store rounds the same way
//!   without saturating (a no-op on a cast's value) and writes the code: exponent
//!   rebiased and the top mantissa bits, or for subnormals the exact multiple of the
//!   smallest step; NaN as ±0x7F (E4M3FN, E5M2) or 0x80 (FNUZ), ±∞ as ±0x7C (E5M2).
//!   A load decodes the code exactly.
//! - A cast from f64 (or a wide integer) first rounds to f32 *to odd* (so the one
//!   rounding to the narrow format is still correct); integers are clamped to ±2²⁴
//!   first, beyond which every 8-bit float overflows anyway.
//! - `i4`/`u4` compute in i8/u8. A cast rounds a float to nearest even after clamping to
//!   `[−8, 7]`/`[0, 15]` (NaN → 0) and clamps an integer. Elements are packed two to a
//!   byte, the lower index in the low nibble: a load reads the element's byte and
//!   extracts its nibble (sign-extended for `i4`); stores are the general mapping's
//!   business (`general.rs`: one thread per byte, both nibbles in one `st.global.u8`, so
//!   no two threads write the same byte), which stores the value's low four bits as the
//!   interpreter does.

use kiln_flow::ScalarType;
use kiln_ir::DType;

use super::super::ptx::{Imm, Opd, Reg, RegClass};
use super::{class, sfx, Eval, R};

const F: RegClass = RegClass::F32;
const B: RegClass = RegClass::B32;

/// An 8-bit float format.
#[derive(Clone, Copy)]
pub(super) struct F8 {
    man: u32,
    bias: i32,
    max: f32,
    /// All-ones exponent is ±∞ (mantissa 0) or NaN (E5M2).
    ieee: bool,
    /// No −0; 0x80 is the only NaN (the FNUZ formats).
    uz: bool,
}

impl F8 {
    pub(super) fn of(d: DType) -> Option<F8> {
        Some(match d {
            DType::F8E4M3FN => F8 { man: 3, bias: 7, max: 448.0, ieee: false, uz: false },
            DType::F8E4M3FNUZ => F8 { man: 3, bias: 8, max: 240.0, ieee: false, uz: true },
            DType::F8E5M2 => F8 { man: 2, bias: 15, max: 57344.0, ieee: true, uz: false },
            DType::F8E5M2FNUZ => F8 { man: 2, bias: 16, max: 57344.0, ieee: false, uz: true },
            _ => return None,
        })
    }
}

/// Whether `d` is a 4-bit integer (two elements a byte).
pub fn is_nibble(d: DType) -> bool {
    matches!(d, DType::I4 | DType::U4)
}

fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

impl Eval<'_, '_> {
    fn b32(&mut self, opcode: &str, a: Reg, b: Opd) -> Reg {
        self.op2(B, opcode, a, b)
    }

    /// f32 `x` rounded to 8-bit float `f` (module docs), as an f32.
    pub(super) fn f8_round(&mut self, f: F8, x: Reg, saturate: bool) -> Reg {
        let a = self.op1(F, "abs.f32", x);
        let bits = self.op1(B, "mov.b32", a);
        // The exponent of |x|, at least the format's smallest normal one.
        let e = self.b32("shr.u32", bits, Imm::I(23).into());
        let e = self.b32("sub.s32", e, Imm::I(127).into());
        let e = self.b32("max.s32", e, Imm::I(i64::from(1 - f.bias)).into());
        // scale = 2^(m − e), unscale = 2^(e − m): both normal.
        let sc = self.p.reg(B);
        self.p.op("sub.s32", &[sc.into(), Imm::I(i64::from(f.man) + 127).into(), e.into()]);
        let sc = self.b32("shl.b32", sc, Imm::I(23).into());
        let scale = self.op1(F, "mov.b32", sc);
        let un = self.b32("add.s32", e, Imm::I(127 - i64::from(f.man)).into());
        let un = self.b32("shl.b32", un, Imm::I(23).into());
        let unscale = self.op1(F, "mov.b32", un);
        // |x|·2^(m−e) < 2^(m+1) (∞ or NaN past 2²³); ± 2²³ rounds it to nearest even.
        let y = self.op2(F, "mul.rn.f32", a, scale.into());
        let magic = self.f32c(pow2(23));
        let big = self.setp("ge", "f32", y, magic.into());
        let r = self.op2(F, "add.rn.f32", y, magic.into());
        let r = self.op2(F, "sub.rn.f32", r, magic.into());
        let r = self.select(ScalarType::F32, big, y, r);
        let r = self.op2(F, "mul.rn.f32", r, unscale.into());
        let max = self.f32c(f.max);
        let over = self.setp("gt", "f32", r, max.into());
        let out = if saturate {
            max
        } else if f.ieee {
            self.f32c(f32::INFINITY)
        } else {
            self.f32c(f32::NAN)
        };
        let r = self.select(ScalarType::F32, over, out, r);
        let r = if f.uz {
            // No −0: a negative x that rounds to 0 gives +0.
            let nz = self.setp("ne", "f32", r, Imm::F32(0).into());
            let xneg = self.setp("lt", "f32", x, Imm::F32(0).into());
            let flip = self.op2(RegClass::Pred, "and.pred", nz, xneg.into());
            let neg = self.op1(F, "neg.f32", r);
            self.select(ScalarType::F32, flip, neg, r)
        } else {
            self.op2(F, "copysign.f32", x, r.into())
        };
        let nan = self.setp("nan", "f32", x, x.into());
        self.select(ScalarType::F32, nan, x, r)
    }

    /// The code (low byte of a b32) of `v`, a value of 8-bit float `f`, ±∞ or NaN.
    fn f8_encode(&mut self, f: F8, v: Reg) -> Reg {
        let a = self.op1(F, "abs.f32", v);
        let bits = self.op1(B, "mov.b32", v);
        let abits = self.op1(B, "mov.b32", a);
        // Normal: the exponent rebiased, the top mantissa bits.
        let e = self.b32("shr.u32", abits, Imm::I(23).into());
        let e = self.b32("add.s32", e, Imm::I(i64::from(f.bias) - 127).into());
        let e = self.b32("shl.b32", e, Imm::I(i64::from(f.man)).into());
        let m = self.b32("shr.u32", abits, Imm::I(23 - i64::from(f.man)).into());
        let m = self.b32("and.b32", m, Imm::I((1 << f.man) - 1).into());
        let normal = self.b32("or.b32", e, m.into());
        // Subnormal (or zero): the exact multiple of the smallest step.
        let step = self.f32c(pow2(f.man as i32 - 1 + f.bias));
        let q = self.op2(F, "mul.rn.f32", a, step.into());
        let sub = self.op1(B, "cvt.rzi.u32.f32", q);
        let is_sub = self.setp("lt", "f32", a, Imm::F32(pow2(1 - f.bias).to_bits()).into());
        let mag = self.select(ScalarType::U32, is_sub, sub, normal);
        let sign = self.b32("shr.u32", bits, Imm::I(24).into());
        let sign = self.b32("and.b32", sign, Imm::I(0x80).into());
        let mut code = self.b32("or.b32", mag, sign.into());
        if f.uz {
            let z = self.setp("eq", "u32", mag, Imm::I(0).into());
            let zero = self.p.mov(B, "b32", Imm::I(0).into());
            code = self.select(ScalarType::U32, z, zero, code);
        }
        let (nan_code, inf_code) = if f.uz {
            let c = self.p.mov(B, "b32", Imm::I(0x80).into());
            (c, c)
        } else {
            let n = self.b32("or.b32", sign, Imm::I(0x7F).into());
            let i = if f.ieee { self.b32("or.b32", sign, Imm::I(0x7C).into()) } else { n };
            (n, i)
        };
        let is_inf = self.setp("eq", "f32", a, Imm::F32(f32::INFINITY.to_bits()).into());
        let code = self.select(ScalarType::U32, is_inf, inf_code, code);
        let is_nan = self.setp("nan", "f32", v, v.into());
        self.select(ScalarType::U32, is_nan, nan_code, code)
    }

    /// The f32 value of `code` (a b32 holding the byte zero-extended) of 8-bit float `f`.
    fn f8_decode(&mut self, f: F8, code: Reg) -> Reg {
        let ebits = 7 - f.man;
        let e = self.b32("shr.u32", code, Imm::I(i64::from(f.man)).into());
        let e = self.b32("and.b32", e, Imm::I((1 << ebits) - 1).into());
        let m = self.b32("and.b32", code, Imm::I((1 << f.man) - 1).into());
        // Normal: the exponent rebiased, the mantissa at the top.
        let ne = self.b32("add.s32", e, Imm::I(127 - i64::from(f.bias)).into());
        let ne = self.b32("shl.b32", ne, Imm::I(23).into());
        let nm = self.b32("shl.b32", m, Imm::I(23 - i64::from(f.man)).into());
        let normal = self.b32("or.b32", ne, nm.into());
        let normal = self.op1(F, "mov.b32", normal);
        // Subnormal: m · 2^(1 − bias − m), exact.
        let mf = self.op1(F, "cvt.rn.f32.u32", m);
        let step = self.f32c(pow2(1 - f.bias - f.man as i32));
        let sub = self.op2(F, "mul.rn.f32", mf, step.into());
        let is_sub = self.setp("eq", "u32", e, Imm::I(0).into());
        let mag = self.select(ScalarType::F32, is_sub, sub, normal);
        let s = self.b32("and.b32", code, Imm::I(0x80).into());
        let neg = self.setp("ne", "u32", s, Imm::I(0).into());
        let negv = self.op1(F, "neg.f32", mag);
        let v = self.select(ScalarType::F32, neg, negv, mag);
        let nan = self.f32c(f32::NAN);
        if f.uz {
            let is_nan = self.setp("eq", "u32", code, Imm::I(0x80).into());
            self.select(ScalarType::F32, is_nan, nan, v)
        } else if f.ieee {
            let top = self.setp("eq", "u32", e, Imm::I((1 << ebits) - 1).into());
            let m0 = self.setp("eq", "u32", m, Imm::I(0).into());
            let inf = self.f32c(f32::INFINITY);
            let ninf = self.f32c(f32::NEG_INFINITY);
            let sinf = self.select(ScalarType::F32, neg, ninf, inf);
            let special = self.select(ScalarType::F32, m0, sinf, nan);
            self.select(ScalarType::F32, top, special, v)
        } else {
            let low = self.b32("and.b32", code, Imm::I(0x7F).into());
            let is_nan = self.setp("eq", "u32", low, Imm::I(0x7F).into());
            self.select(ScalarType::F32, is_nan, nan, v)
        }
    }

    /// `x` (type `from`) as an f32 that one later rounding to a format of at most 22
    /// significand bits rounds correctly: itself from f32, rounded to odd from f64,
    /// integers clamped to ±2²⁴ (beyond every 8-bit float's range) and converted
    /// exactly.
    fn f32_once(&mut self, from: ScalarType, x: Reg) -> Reg {
        match from {
            ScalarType::F32 => x,
            ScalarType::F64 => {
                // Rounded to nearest; where inexact, of it and its neighbour towards x
                // the one with an odd last bit (exactly one of the two is).
                let y = self.op1(F, "cvt.rn.f32.f64", x);
                let back = self.op1(RegClass::F64, "cvt.f64.f32", y);
                let inexact = self.setp("ne", "f64", back, x.into());
                let ax = self.op1(RegClass::F64, "abs.f64", x);
                let ab = self.op1(RegClass::F64, "abs.f64", back);
                let up = self.setp("gt", "f64", ax, ab.into());
                let yb = self.op1(B, "mov.b32", y);
                let step = self.p.reg(B);
                self.p.op("selp.b32", &[step.into(), Imm::I(1).into(), Imm::I(-1).into(), up.into()]);
                let nb = self.b32("add.s32", yb, step.into());
                let odd = self.b32("and.b32", yb, Imm::I(1).into());
                let even = self.setp("eq", "u32", odd, Imm::I(0).into());
                let fix = self.op2(RegClass::Pred, "and.pred", inexact, even.into());
                let r = self.select(ScalarType::U32, fix, nb, yb);
                self.op1(F, "mov.b32", r)
            }
            _ => {
                let lim = 1i64 << 24;
                let c = self.clamp_int(from, x, -lim, lim);
                self.op1(F, &format!("cvt.rn.f32.{}", sfx(from)), c)
            }
        }
    }

    /// Integer `x` of type `from` clamped to `[lo, hi]` (`lo ≤ 0 ≤ hi`), in its own
    /// register class.
    fn clamp_int(&mut self, from: ScalarType, x: Reg, lo: i64, hi: i64) -> Reg {
        let c = class(from);
        let s = sfx(from);
        let m = self.op2(c, &format!("min.{s}"), x, Imm::I(hi).into());
        if from.is_signed() {
            self.op2(c, &format!("max.{s}"), m, Imm::I(lo).into())
        } else {
            m
        }
    }

    /// ONNX `Cast` of `v` (type `from`, not bool) to 8-bit float `to`: the f32 value.
    pub(super) fn cast_f8(&mut self, from: ScalarType, v: Reg, f: F8, saturate: bool) -> Reg {
        let y = self.f32_once(from, v);
        self.f8_round(f, y, saturate)
    }

    /// ONNX `Cast` of `v` (type `from`, not bool) to `i4`/`u4` (`to`): the value in
    /// the i8/u8 register (module docs).
    pub(super) fn cast_nibble(&mut self, from: ScalarType, v: Reg, to: DType) -> Reg {
        let (lo, hi) = if to == DType::I4 { (-8i64, 7i64) } else { (0, 15) };
        if !from.is_float() {
            let c = self.clamp_int(from, v, lo, hi);
            return match class(from) {
                RegClass::B64 => self.op1(B, "cvt.u32.u64", c),
                _ => c,
            };
        }
        let y = self.f32_once(from, v);
        let l = self.f32c(lo as f32);
        let h = self.f32c(hi as f32);
        let c = self.op2(F, "max.f32", y, l.into());
        let c = self.op2(F, "min.f32", c, h.into());
        let zero = self.f32c(0.0);
        let nan = self.setp("nan", "f32", y, y.into());
        let c = self.select(ScalarType::F32, nan, zero, c);
        self.op1(B, "cvt.rni.s32.f32", c)
    }

    /// The byte at `addr` in a 32-bit register, zero-extended (0 where `skip` holds,
    /// without a load).
    fn load_byte(&mut self, addr: Reg, skip: Option<Reg>) -> Reg {
        let raw = self.p.reg(B);
        match skip {
            Some(s) => {
                self.p.op("mov.b32", &[raw.into(), Imm::I(0).into()]);
                self.p.op_if(s, true, "ld.global.u8", &[raw.into(), Opd::Addr(addr, 0)]);
            }
            None => self.p.op("ld.global.u8", &[raw.into(), Opd::Addr(addr, 0)]),
        }
        raw
    }

    /// The element of 4-bit `dtype` at flat index `flat` (i64) of the binding at `base`,
    /// in its compute type's register (skipped where `skip` holds: 0).
    pub(super) fn load_nibble(&mut self, base: Reg, flat: Reg, dtype: DType, skip: Option<Reg>) -> Reg {
        let byte = self.op2(RegClass::B64, "shr.u64", flat, Imm::I(1).into());
        let addr = self.op2(RegClass::B64, "add.s64", base, byte.into());
        let lo = self.op1(B, "cvt.u32.u64", flat);
        let odd = self.b32("and.b32", lo, Imm::I(1).into());
        let shift = self.b32("shl.b32", odd, Imm::I(2).into());
        let raw = self.load_byte(addr, skip);
        let n = self.b32("shr.u32", raw, shift.into());
        let n = self.b32("shl.b32", n, Imm::I(28).into());
        let op = if dtype == DType::I4 { "shr.s32" } else { "shr.u32" };
        self.b32(op, n, Imm::I(28).into())
    }

    /// An 8-bit float element at `addr` (skipped where `skip` holds), as f32.
    pub(super) fn load_f8(&mut self, f: F8, addr: Reg, skip: Option<Reg>) -> Reg {
        let raw = self.load_byte(addr, skip);
        self.f8_decode(f, raw)
    }

    /// Stores f32 `v` as 8-bit float `f` at `addr`: rounded without saturating, coded.
    pub(super) fn store_f8(&mut self, f: F8, addr: Reg, v: Reg) -> R<()> {
        let r = self.f8_round(f, v, false);
        let code = self.f8_encode(f, r);
        self.p.op("st.global.u8", &[Opd::Addr(addr, 0), code.into()]);
        Ok(())
    }
}
