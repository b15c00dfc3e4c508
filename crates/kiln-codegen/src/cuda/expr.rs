//! A kernel's scalar expression DAG as PTX: the per-element evaluator every CUDA
//! emitter builds on.
//!
//! Values live in registers by compute type: `Bool` in a predicate, 8-, 16- and 32-bit
//! integers in a 32-bit register kept normalised (sign- or zero-extended from their
//! width, re-normalised after every operation that can leave it, so wrapping is the
//! kernel's), 64-bit integers and indices in 64-bit registers, f32 and f64 in float
//! registers. Float arithmetic is written with explicit `.rn` rounding so ptxas cannot
//! contract `a*b+c` into an FMA the kernel did not ask for.
//!
//! Reductions become counted loops (one per variable, outermost first). Before a loop
//! opens, every node of its body that does not read the loop's variables is evaluated
//! once outside it (hoisting); a node evaluated inside a loop is cached only for that
//! iteration's scope.
//!
//! Transcendentals are inline sequences with the error bounds stated at each: f32
//! `exp` by Cody–Waite reduction and `ex2.approx` (a few ulp), `tanh` and `sinh` by a
//! short series near 0 and `exp` past it, `erf` by a series near 0 and
//! Abramowitz–Stegun 7.1.26 past it (absolute error 1.5e-7), `sin`/`cos` by reduction
//! modulo 2π and `sin.approx`/`cos.approx` (absolute error about 2^-20). `log` (f32,
//! f64), f64 `exp`, `pow` (f32 computed in f64, and f64), f32 `asin`/`acos`/`atan`
//! use no `.approx` instruction and are within about an ulp over their whole range;
//! `fmod` (f32, f64) is exact ([`math`]). The other f64 transcendentals are declined
//! with a typed error. 8-bit floats and 4-bit integers: [`lowp`].

use std::collections::{HashMap, HashSet};

use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::DType;

use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use crate::CodegenError;

mod lowp;
mod math;

pub use lowp::is_nibble;
use lowp::F8;

/// The register class of values of type `t`.
pub fn class(t: ScalarType) -> RegClass {
    match t {
        ScalarType::Bool => RegClass::Pred,
        ScalarType::I64 | ScalarType::U64 => RegClass::B64,
        ScalarType::F32 => RegClass::F32,
        ScalarType::F64 => RegClass::F64,
        _ => RegClass::B32,
    }
}

/// The PTX type suffix of arithmetic on `t` (8- and 16-bit integers compute in 32 bits).
fn sfx(t: ScalarType) -> &'static str {
    match t {
        ScalarType::F32 => "f32",
        ScalarType::F64 => "f64",
        ScalarType::I64 => "s64",
        ScalarType::U64 => "u64",
        t if t.is_signed() => "s32",
        _ => "u32",
    }
}

/// Bit-type suffix of `t`'s register (`b32`, `b64`, `f32`, ...).
fn bsfx(t: ScalarType) -> &'static str {
    match class(t) {
        RegClass::B64 => "b64",
        RegClass::F32 => "f32",
        RegClass::F64 => "f64",
        _ => "b32",
    }
}

/// What a storage dtype loads as and stores from: the `ld`/`st` type and whether the
/// value passes through a 16-bit float conversion.
pub fn storage(d: DType) -> Option<(&'static str, Option<&'static str>)> {
    Some(match d {
        DType::F32 => ("f32", None),
        DType::F64 => ("f64", None),
        DType::I8 => ("s8", None),
        DType::U8 | DType::Bool => ("u8", None),
        DType::I16 => ("s16", None),
        DType::U16 => ("u16", None),
        DType::I32 => ("s32", None),
        DType::U32 => ("u32", None),
        DType::I64 => ("s64", None),
        DType::U64 => ("u64", None),
        DType::F16 => ("b16", Some("f16")),
        DType::BF16 => ("b16", Some("bf16")),
        _ => return None,
    })
}

/// Evaluates a kernel's nodes into registers.
pub struct Eval<'k, 'p> {
    k: &'k Kernel,
    /// The builder.
    pub p: &'p mut Ptx,
    /// Global base address of each input.
    inputs: Vec<Reg>,
    /// The register of each variable, where defined.
    vars: Vec<Option<Reg>>,
    scopes: Vec<HashMap<ExprId, Reg>>,
    free: Vec<Vec<u32>>,
    /// Values given from outside (vector loads' lanes), checked first.
    pub given: HashMap<ExprId, Reg>,
}

type R<T> = Result<T, CodegenError>;

impl<'k, 'p> Eval<'k, 'p> {
    /// An evaluator of `k` whose input `i` starts at global address `inputs[i]`.
    pub fn new(k: &'k Kernel, p: &'p mut Ptx, inputs: Vec<Reg>) -> Eval<'k, 'p> {
        Eval {
            k,
            p,
            inputs,
            vars: vec![None; k.vars.len()],
            scopes: vec![HashMap::new()],
            free: k.free_vars(),
            given: HashMap::new(),
        }
    }

    fn unsupported(&self, what: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported { kernel: self.k.name.clone(), what: format!("{} (CUDA target)", what.into()) }
    }

    /// Sets output variable `v` to the i64 in `r`.
    pub fn set_var(&mut self, v: usize, r: Reg) {
        if let Some(s) = self.vars.get_mut(v) {
            *s = Some(r);
        }
    }

    /// Global base address of input `i`.
    pub fn input(&self, i: usize) -> Reg {
        self.inputs[i]
    }

    /// Opens a scope: values evaluated until [`Eval::pop_scope`] are forgotten then.
    pub fn push_scope(&mut self) {
        self.scopes.push(HashMap::new());
    }

    /// Closes the scope [`Eval::push_scope`] opened.
    pub fn pop_scope(&mut self) {
        if self.scopes.len() > 1 {
            self.scopes.pop();
        }
    }

    /// Forgets every cached value (a new element of a grid-stride loop).
    pub fn reset(&mut self) {
        self.scopes = vec![HashMap::new()];
    }

    /// The register holding node `e`'s value, emitting it if needed.
    pub fn value(&mut self, e: ExprId) -> R<Reg> {
        if let Some(&r) = self.given.get(&e) {
            return Ok(r);
        }
        for s in self.scopes.iter().rev() {
            if let Some(&r) = s.get(&e) {
                return Ok(r);
            }
        }
        let r = self.emit(e)?;
        if let Some(s) = self.scopes.last_mut() {
            s.insert(e, r);
        }
        Ok(r)
    }

    fn ty(&self, e: ExprId) -> ScalarType {
        self.k.node(e).ty
    }

    fn emit(&mut self, e: ExprId) -> R<Reg> {
        let node = self.k.node(e).clone();
        let t = node.ty;
        match &node.expr {
            Expr::Var(v) => self.vars.get(v.0 as usize).copied().flatten().ok_or_else(|| CodegenError::Internal {
                kernel: self.k.name.clone(),
                what: format!("v{} read outside its scope", v.0),
            }),
            Expr::Const(bits) => Ok(self.constant(t, *bits)),
            Expr::Load { input, index, bounds } => {
                let idx: Vec<Reg> = index.iter().map(|&i| self.value(i)).collect::<R<_>>()?;
                self.load(*input as usize, &idx, *bounds, t)
            }
            Expr::Unary(op, a) => {
                let at = self.ty(*a);
                let a = self.value(*a)?;
                self.unary(*op, at, a)
            }
            Expr::Binary(BinaryOp::Pow, a, b) if self.ty(*a).is_float() && self.constant_of(*b).is_some() => {
                let at = self.ty(*a);
                let y = self.constant_of(*b).unwrap_or(0);
                let y = if at == ScalarType::F32 { f64::from(f32::from_bits(y as u32)) } else { f64::from_bits(y) };
                let x = self.value(*a)?;
                Ok(self.pow_const(class(at), x, y))
            }
            Expr::Binary(op, a, b) => {
                let at = self.ty(*a);
                let (a, b) = (self.value(*a)?, self.value(*b)?);
                self.binary(*op, at, a, b)
            }
            Expr::Select(c, a, b) => {
                let (c, a, b) = (self.value(*c)?, self.value(*a)?, self.value(*b)?);
                Ok(self.select(t, c, a, b))
            }
            Expr::Cast { value, to, saturate } => {
                let from = self.ty(*value);
                let v = self.value(*value)?;
                self.cast(from, v, *to, *saturate)
            }
            Expr::Reduce { op, vars, body } => self.reduce(*op, t, vars, *body),
        }
    }

    /// The bits of node `e` where it is a constant.
    fn constant_of(&self, e: ExprId) -> Option<u64> {
        match self.k.node(e).expr {
            Expr::Const(bits) => Some(bits),
            _ => None,
        }
    }

    /// A register holding constant `bits` of type `t`.
    pub fn constant(&mut self, t: ScalarType, bits: u64) -> Reg {
        match class(t) {
            RegClass::Pred => {
                let r = self.p.mov(RegClass::B32, "b32", Imm::I((bits != 0) as i64).into());
                let p = self.p.reg(RegClass::Pred);
                self.p.op("setp.ne.u32", &[p.into(), r.into(), Imm::I(0).into()]);
                p
            }
            RegClass::F32 => self.p.mov(RegClass::F32, "f32", Imm::F32(bits as u32).into()),
            RegClass::F64 => self.p.mov(RegClass::F64, "f64", Imm::F64(bits).into()),
            RegClass::B64 => self.p.mov(RegClass::B64, "b64", Imm::U(bits).into()),
            _ => self.p.mov(RegClass::B32, "b32", Imm::I(t.to_i128(bits) as i64).into()),
        }
    }

    fn f32c(&mut self, x: f32) -> Reg {
        self.p.mov(RegClass::F32, "f32", Imm::F32(x.to_bits()).into())
    }

    /// `x` re-normalised to `t`'s width (8/16-bit integers; others unchanged).
    fn norm(&mut self, t: ScalarType, x: Reg) -> Reg {
        let op = match t {
            ScalarType::I8 => "cvt.s32.s8",
            ScalarType::U8 => "cvt.u32.u8",
            ScalarType::I16 => "cvt.s32.s16",
            ScalarType::U16 => "cvt.u32.u16",
            _ => return x,
        };
        let d = self.p.reg(RegClass::B32);
        self.p.op(op, &[d.into(), x.into()]);
        d
    }

    fn op2(&mut self, c: RegClass, opcode: &str, a: Reg, b: Opd) -> Reg {
        let d = self.p.reg(c);
        self.p.op(opcode, &[d.into(), a.into(), b]);
        d
    }

    fn op1(&mut self, c: RegClass, opcode: &str, a: Reg) -> Reg {
        let d = self.p.reg(c);
        self.p.op(opcode, &[d.into(), a.into()]);
        d
    }

    fn op3(&mut self, c: RegClass, opcode: &str, a: Reg, b: Reg, x: Reg) -> Reg {
        let d = self.p.reg(c);
        self.p.op(opcode, &[d.into(), a.into(), b.into(), x.into()]);
        d
    }

    fn setp(&mut self, cmp: &str, ty: &str, a: Reg, b: Opd) -> Reg {
        let d = self.p.reg(RegClass::Pred);
        self.p.op(&format!("setp.{cmp}.{ty}"), &[d.into(), a.into(), b]);
        d
    }

    /// `c ? a : b` for values of type `t`.
    pub fn select(&mut self, t: ScalarType, c: Reg, a: Reg, b: Reg) -> Reg {
        if t == ScalarType::Bool {
            let ca = self.op2(RegClass::Pred, "and.pred", c, a.into());
            let nc = self.op1(RegClass::Pred, "not.pred", c);
            let nb = self.op2(RegClass::Pred, "and.pred", nc, b.into());
            return self.op2(RegClass::Pred, "or.pred", ca, nb.into());
        }
        let d = self.p.reg(class(t));
        self.p.op(&format!("selp.{}", bsfx(t)), &[d.into(), a.into(), b.into(), c.into()]);
        d
    }

    /// The element of input `input` at `idx` (i64 registers), by `bounds`.
    fn load(&mut self, input: usize, idx: &[Reg], bounds: Bounds, t: ScalarType) -> R<Reg> {
        let Some(ty) = self.k.inputs.get(input) else {
            return Err(CodegenError::Internal { kernel: self.k.name.clone(), what: format!("input {input}") });
        };
        let (dtype, dims) = (ty.dtype, ty.shape.dims().to_vec());
        if dims.contains(&0) {
            return Ok(self.constant(t, 0));
        }
        let mut outside: Option<Reg> = None;
        let mut flat: Option<Reg> = None;
        for (&i, &n) in idx.iter().zip(&dims) {
            let i = match bounds {
                Bounds::Clamp => {
                    let a = self.op2(RegClass::B64, "max.s64", i, Imm::I(0).into());
                    self.op2(RegClass::B64, "min.s64", a, Imm::I(n as i64 - 1).into())
                }
                Bounds::Pad(_) => {
                    // Unsigned: a negative index is above every extent.
                    let o = self.setp("ge", "u64", i, Imm::I(n as i64).into());
                    outside = Some(match outside {
                        None => o,
                        Some(prev) => self.op2(RegClass::Pred, "or.pred", prev, o.into()),
                    });
                    i
                }
                Bounds::InBounds => i,
            };
            flat = Some(match flat {
                None => i,
                Some(f) => {
                    let d = self.p.reg(RegClass::B64);
                    self.p.op("mad.lo.s64", &[d.into(), f.into(), Imm::I(n as i64).into(), i.into()]);
                    d
                }
            });
        }
        let flat = match flat {
            Some(f) => f,
            None => self.p.mov(RegClass::B64, "b64", Imm::I(0).into()),
        };
        if is_nibble(dtype) {
            let v = self.load_nibble(self.inputs[input], flat, dtype, outside);
            return Ok(match (bounds, outside) {
                (Bounds::Pad(bits), Some(o)) => {
                    let pad = self.constant(t, bits);
                    self.select(t, o, pad, v)
                }
                _ => v,
            });
        }
        let addr = self.address(self.inputs[input], flat, dtype)?;
        match (bounds, outside) {
            (Bounds::Pad(bits), Some(o)) => {
                let pad = self.constant(t, bits);
                let v = self.load_at(addr, dtype, t, Some(o))?;
                Ok(self.select(t, o, pad, v))
            }
            _ => self.load_at(addr, dtype, t, None),
        }
    }

    /// `base + flat * size(dtype)`.
    /// 4-bit elements have no address of their own ([`is_nibble`]): an internal error.
    pub fn address(&mut self, base: Reg, flat: Reg, dtype: DType) -> R<Reg> {
        if is_nibble(dtype) {
            return Err(CodegenError::Internal {
                kernel: self.k.name.clone(),
                what: format!("an element address of packed {}", dtype.name()),
            });
        }
        let size = dtype.storage_bytes(1) as i64;
        let d = self.p.reg(RegClass::B64);
        self.p.op("mad.lo.s64", &[d.into(), flat.into(), Imm::I(size).into(), base.into()]);
        Ok(d)
    }

    /// A value of compute type `t` loaded from storage `dtype` at `addr` (skipped,
    /// leaving an unspecified value, where `skip` holds).
    pub fn load_at(&mut self, addr: Reg, dtype: DType, t: ScalarType, skip: Option<Reg>) -> R<Reg> {
        if let Some(f) = F8::of(dtype) {
            return Ok(self.load_f8(f, addr, skip));
        }
        let Some((st, half)) = storage(dtype) else {
            return Err(self.unsupported(format!("{} loads", dtype.name())));
        };
        let raw_class = match (half, class(t)) {
            (Some(_), _) => RegClass::B16,
            (None, RegClass::Pred) => RegClass::B32,
            (None, c) => c,
        };
        let raw = self.p.reg(raw_class);
        // Defined on the skipped path too, so no read of an unwritten register.
        let zero = Imm::zero(raw_class);
        let mov = match raw_class {
            RegClass::B16 => "mov.b16",
            RegClass::B32 => "mov.b32",
            RegClass::B64 => "mov.b64",
            RegClass::F32 => "mov.f32",
            _ => "mov.f64",
        };
        if skip.is_some() {
            self.p.op(mov, &[raw.into(), zero.into()]);
        }
        let ld = format!("ld.global.{st}");
        match skip {
            Some(s) => self.p.op_if(s, true, &ld, &[raw.into(), Opd::Addr(addr, 0)]),
            None => self.p.op(&ld, &[raw.into(), Opd::Addr(addr, 0)]),
        }
        self.widen(raw, dtype, t)
    }

    /// The value of compute type `t` of `raw`, an element of storage `dtype` as its
    /// `ld.global` leaves it: the 16 bits of an f16/bf16 in a `.b16` register (widened
    /// exactly to f32), an integer sign- or zero-extended into 32 bits by its `ld` type
    /// (kept as it is), a bool's byte (its predicate, `x != 0`), a 32- or 64-bit value.
    pub fn widen(&mut self, raw: Reg, dtype: DType, t: ScalarType) -> R<Reg> {
        let Some((_, half)) = storage(dtype) else {
            return Err(self.unsupported(format!("{} loads", dtype.name())));
        };
        Ok(match (half, t) {
            (Some(h), _) => self.op1(RegClass::F32, &format!("cvt.f32.{h}"), raw),
            (None, ScalarType::Bool) => self.setp("ne", "u32", raw, Imm::I(0).into()),
            _ => raw,
        })
    }

    /// Stores `v` (compute type `t`) as `dtype` at `addr`.
    pub fn store_at(&mut self, addr: Reg, dtype: DType, t: ScalarType, v: Reg) -> R<()> {
        if let Some(f) = F8::of(dtype) {
            return self.store_f8(f, addr, v);
        }
        let Some((st, _)) = storage(dtype) else {
            return Err(self.unsupported(format!("{} stores", dtype.name())));
        };
        let v = self.narrow(v, dtype, t)?;
        self.p.op(&format!("st.global.{st}"), &[Opd::Addr(addr, 0), v.into()]);
        Ok(())
    }

    /// What `st.global` of storage `dtype` stores for `v` (compute type `t`): an f32
    /// rounded to nearest even into the 16 bits of an f16/bf16 (`.b16` register), a
    /// bool as 1 or 0 (`.b32`), any other value as it is (8- and 16-bit integers are
    /// normalised in 32 bits: their low bits are the element).
    pub fn narrow(&mut self, v: Reg, dtype: DType, t: ScalarType) -> R<Reg> {
        let Some((_, half)) = storage(dtype) else {
            return Err(self.unsupported(format!("{} stores", dtype.name())));
        };
        Ok(match (half, t) {
            (Some(h), _) => self.op1(RegClass::B16, &format!("cvt.rn.{h}.f32"), v),
            (None, ScalarType::Bool) => {
                let d = self.p.reg(RegClass::B32);
                self.p.op("selp.u32", &[d.into(), Imm::I(1).into(), Imm::I(0).into(), v.into()]);
                d
            }
            _ => v,
        })
    }

    fn unary(&mut self, op: UnaryOp, t: ScalarType, a: Reg) -> R<Reg> {
        let c = class(t);
        if t == ScalarType::Bool {
            return Ok(match op {
                UnaryOp::Not => self.op1(c, "not.pred", a),
                UnaryOp::IsNan => self.constant(ScalarType::Bool, 0),
                _ => a,
            });
        }
        if !t.is_float() {
            let r = match op {
                UnaryOp::Neg => self.op1(c, &format!("neg.{}", sfx(t).replace('u', "s")), a),
                UnaryOp::Abs if t.is_signed() => self.op1(c, &format!("abs.{}", sfx(t)), a),
                UnaryOp::Not => self.op1(c, &format!("not.{}", bsfx(t)), a),
                UnaryOp::IsNan => return Ok(self.constant(ScalarType::Bool, 0)),
                _ => a,
            };
            return Ok(self.norm(t, r));
        }
        let f = sfx(t);
        let simple = |op: UnaryOp| -> Option<String> {
            Some(match op {
                UnaryOp::Neg => format!("neg.{f}"),
                UnaryOp::Abs => format!("abs.{f}"),
                UnaryOp::Sqrt => format!("sqrt.rn.{f}"),
                UnaryOp::Floor => format!("cvt.rmi.{f}.{f}"),
                UnaryOp::Ceil => format!("cvt.rpi.{f}.{f}"),
                UnaryOp::Round => format!("cvt.rni.{f}.{f}"),
                UnaryOp::Trunc => format!("cvt.rzi.{f}.{f}"),
                _ => return None,
            })
        };
        if let Some(opcode) = simple(op) {
            return Ok(self.op1(c, &opcode, a));
        }
        if op == UnaryOp::Not {
            // Not a float operation; the interpreter's value for it is NaN.
            let nan = if t == ScalarType::F32 { f32::NAN.to_bits() as u64 } else { f64::NAN.to_bits() };
            return Ok(self.constant(t, nan));
        }
        if op == UnaryOp::IsNan {
            let d = self.p.reg(RegClass::Pred);
            self.p.op(&format!("setp.nan.{f}"), &[d.into(), a.into(), a.into()]);
            return Ok(d);
        }
        if t == ScalarType::F64 {
            return match op {
                UnaryOp::Exp => Ok(self.exp64(a)),
                UnaryOp::Log => Ok(self.log_of(RegClass::F64, a)),
                _ => Err(self.unsupported(format!("f64 {}", op.name()))),
            };
        }
        match op {
            UnaryOp::Exp => Ok(self.exp(a)),
            UnaryOp::Log => Ok(self.log(a)),
            UnaryOp::Tanh => Ok(self.tanh(a)),
            UnaryOp::Erf => Ok(self.erf(a)),
            UnaryOp::Sin => Ok(self.sincos(a, "sin")),
            UnaryOp::Cos => Ok(self.sincos(a, "cos")),
            UnaryOp::Tan => {
                let s = self.sincos(a, "sin");
                let c = self.sincos(a, "cos");
                Ok(self.op2(RegClass::F32, "div.rn.f32", s, c.into()))
            }
            UnaryOp::Sinh | UnaryOp::Cosh => {
                let e = self.exp(a);
                let one = self.f32c(1.0);
                let inv = self.op2(RegClass::F32, "div.rn.f32", one, e.into());
                let half = self.f32c(0.5);
                if op == UnaryOp::Cosh {
                    let s = self.op2(RegClass::F32, "add.rn.f32", e, inv.into());
                    return Ok(self.op2(RegClass::F32, "mul.rn.f32", s, half.into()));
                }
                let s = self.op2(RegClass::F32, "sub.rn.f32", e, inv.into());
                let far = self.op2(RegClass::F32, "mul.rn.f32", s, half.into());
                // x + x^3/6 + x^5/120 + x^7/5040 below 0.5 (relative error < 2e-9).
                let near = self.series(a, &[1.0, 1.0 / 6.0, 1.0 / 120.0, 1.0 / 5040.0]);
                let ax = self.op1(RegClass::F32, "abs.f32", a);
                let small = self.setp("lt", "f32", ax, Imm::F32(0.5f32.to_bits()).into());
                Ok(self.select(ScalarType::F32, small, near, far))
            }
            UnaryOp::Asinh => Ok(self.asinh(a)),
            UnaryOp::Acosh => Ok(self.acosh(a)),
            UnaryOp::Atan => Ok(self.atan(a)),
            UnaryOp::Asin => Ok(self.asin_acos(a, false)),
            UnaryOp::Acos => Ok(self.asin_acos(a, true)),
            UnaryOp::Atanh => Ok(self.atanh(a)),
            _ => Err(self.unsupported(format!("f32 {}", op.name()))),
        }
    }

    /// `x * (c0 + c1 x^2 + c2 x^4 + ...)` (Horner in x^2).
    fn series(&mut self, x: Reg, c: &[f32]) -> Reg {
        let x2 = self.op2(RegClass::F32, "mul.rn.f32", x, x.into());
        let mut acc = self.f32c(c[c.len() - 1]);
        for &k in c[..c.len() - 1].iter().rev() {
            let kc = self.f32c(k);
            acc = self.op3(RegClass::F32, "fma.rn.f32", acc, x2, kc);
        }
        self.op2(RegClass::F32, "mul.rn.f32", acc, x.into())
    }

    /// f32 `e^x`: n = round(x / ln 2) (clamped so 2^n splits into two normal halves),
    /// r = x - n ln 2 in two steps (Cody–Waite), `ex2.approx(r / ln 2) · 2^⌊n/2⌋ ·
    /// 2^⌈n/2⌉`; a few ulp over the whole range, infinities and NaN propagated.
    fn exp(&mut self, x: Reg) -> Reg {
        let log2e = self.f32c(std::f32::consts::LOG2_E);
        let t = self.op2(RegClass::F32, "mul.rn.f32", x, log2e.into());
        let n = self.op1(RegClass::B32, "cvt.rni.s32.f32", t);
        let n = self.op2(RegClass::B32, "max.s32", n, Imm::I(-252).into());
        let n = self.op2(RegClass::B32, "min.s32", n, Imm::I(254).into());
        let nf = self.op1(RegClass::F32, "cvt.rn.f32.s32", n);
        let nneg = self.op1(RegClass::F32, "neg.f32", nf);
        let hi = self.f32c(0.693_145_75);
        let lo = self.f32c(1.428_606_8e-6);
        let r = self.op3(RegClass::F32, "fma.rn.f32", nneg, hi, x);
        let r = self.op3(RegClass::F32, "fma.rn.f32", nneg, lo, r);
        let r2 = self.op2(RegClass::F32, "mul.rn.f32", r, log2e.into());
        let e = self.op1(RegClass::F32, "ex2.approx.f32", r2);
        let n1 = self.op2(RegClass::B32, "shr.s32", n, Imm::I(1).into());
        let n2 = self.op2(RegClass::B32, "sub.s32", n, n1.into());
        let mut acc = e;
        for h in [n1, n2] {
            let b = self.op2(RegClass::B32, "add.s32", h, Imm::I(127).into());
            let b = self.op2(RegClass::B32, "shl.b32", b, Imm::I(23).into());
            let s = self.op1(RegClass::F32, "mov.b32", b);
            acc = self.op2(RegClass::F32, "mul.rn.f32", acc, s.into());
        }
        acc
    }

    /// f32 natural log, about 1 ulp relative over the whole range ([`math`]).
    fn log(&mut self, x: Reg) -> Reg {
        self.log_of(RegClass::F32, x)
    }

    /// f32 tanh: an odd series below |x| = 0.125, else `sign(x)·(1 - 2/(e^{2|x|}+1))`.
    fn tanh(&mut self, x: Reg) -> Reg {
        let ax = self.op1(RegClass::F32, "abs.f32", x);
        let two = self.f32c(2.0);
        let a2 = self.op2(RegClass::F32, "mul.rn.f32", ax, two.into());
        let e = self.exp(a2);
        let one = self.f32c(1.0);
        let d = self.op2(RegClass::F32, "add.rn.f32", e, one.into());
        let q = self.op2(RegClass::F32, "div.rn.f32", two, d.into());
        let far = self.op2(RegClass::F32, "sub.rn.f32", one, q.into());
        let far = self.op2(RegClass::F32, "copysign.f32", x, far.into());
        let near = self.series(x, &[1.0, -1.0 / 3.0, 2.0 / 15.0, -17.0 / 315.0]);
        let small = self.setp("lt", "f32", ax, Imm::F32(0.125f32.to_bits()).into());
        self.select(ScalarType::F32, small, near, far)
    }

    /// f32 erf: the Maclaurin series below |x| = 0.5, Abramowitz–Stegun 7.1.26 past it.
    fn erf(&mut self, x: Reg) -> Reg {
        let k = 2.0 / std::f32::consts::PI.sqrt();
        let near = self.series(x, &[k, -k / 3.0, k / 10.0, -k / 42.0, k / 216.0, -k / 1320.0]);
        let ax = self.op1(RegClass::F32, "abs.f32", x);
        let p = self.f32c(0.327_591_1);
        let one = self.f32c(1.0);
        let d = self.op3(RegClass::F32, "fma.rn.f32", p, ax, one);
        let t = self.op2(RegClass::F32, "div.rn.f32", one, d.into());
        let a = [0.254_829_6f32, -0.284_496_74, 1.421_413_7, -1.453_152_1, 1.061_405_4];
        let mut poly = self.f32c(a[4]);
        for &c in a[..4].iter().rev() {
            let cc = self.f32c(c);
            poly = self.op3(RegClass::F32, "fma.rn.f32", poly, t, cc);
        }
        poly = self.op2(RegClass::F32, "mul.rn.f32", poly, t.into());
        let sq = self.op2(RegClass::F32, "mul.rn.f32", ax, ax.into());
        let nsq = self.op1(RegClass::F32, "neg.f32", sq);
        let e = self.exp(nsq);
        let m = self.op2(RegClass::F32, "mul.rn.f32", poly, e.into());
        let far = self.op2(RegClass::F32, "sub.rn.f32", one, m.into());
        let far = self.op2(RegClass::F32, "copysign.f32", x, far.into());
        let small = self.setp("lt", "f32", ax, Imm::F32(0.5f32.to_bits()).into());
        self.select(ScalarType::F32, small, near, far)
    }

    /// f32 sin or cos: x reduced modulo 2π in two steps, then `sin.approx`/`cos.approx`.
    fn sincos(&mut self, x: Reg, which: &str) -> Reg {
        let inv = self.f32c(1.0 / (2.0 * std::f32::consts::PI));
        let t = self.op2(RegClass::F32, "mul.rn.f32", x, inv.into());
        let k = self.op1(RegClass::F32, "cvt.rni.f32.f32", t);
        let nk = self.op1(RegClass::F32, "neg.f32", k);
        let hi = self.f32c(6.283_185_5);
        let lo = self.f32c(-1.748_455_7e-7);
        let r = self.op3(RegClass::F32, "fma.rn.f32", nk, hi, x);
        let r = self.op3(RegClass::F32, "fma.rn.f32", nk, lo, r);
        self.op1(RegClass::F32, &format!("{which}.approx.f32"), r)
    }

    /// `op(a, b)` on values of type `t` (the kernel docs' semantics).
    pub fn binary(&mut self, op: BinaryOp, t: ScalarType, a: Reg, b: Reg) -> R<Reg> {
        use BinaryOp as B;
        let c = class(t);
        if t == ScalarType::Bool {
            let na = self.op1(RegClass::Pred, "not.pred", a);
            let nb = self.op1(RegClass::Pred, "not.pred", b);
            let p = RegClass::Pred;
            return Ok(match op {
                B::And | B::Min | B::Mul => self.op2(p, "and.pred", a, b.into()),
                B::Or | B::Max | B::Add => self.op2(p, "or.pred", a, b.into()),
                B::Xor | B::Ne | B::Sub => self.op2(p, "xor.pred", a, b.into()),
                B::Eq => {
                    let x = self.op2(p, "xor.pred", a, b.into());
                    self.op1(p, "not.pred", x)
                }
                B::Lt => self.op2(p, "and.pred", na, b.into()),
                B::Le => self.op2(p, "or.pred", na, b.into()),
                B::Gt => self.op2(p, "and.pred", a, nb.into()),
                B::Ge => self.op2(p, "or.pred", a, nb.into()),
                _ => return Err(self.unsupported(format!("bool {}", op.name()))),
            });
        }
        let s = sfx(t);
        if op.is_comparison() {
            let cmp = match op {
                B::Eq => "eq",
                B::Ne if t.is_float() => "neu",
                B::Ne => "ne",
                B::Lt => "lt",
                B::Le => "le",
                B::Gt => "gt",
                _ => "ge",
            };
            return Ok(self.setp(cmp, s, a, b.into()));
        }
        if t.is_float() {
            return Ok(match op {
                B::Add => self.op2(c, &format!("add.rn.{s}"), a, b.into()),
                B::Sub => self.op2(c, &format!("sub.rn.{s}"), a, b.into()),
                B::Mul => self.op2(c, &format!("mul.rn.{s}"), a, b.into()),
                B::Div => self.op2(c, &format!("div.rn.{s}"), a, b.into()),
                B::Min | B::Max if t == ScalarType::F32 => {
                    self.op2(c, &format!("{}.NaN.f32", if op == B::Min { "min" } else { "max" }), a, b.into())
                }
                B::Min | B::Max => {
                    let m = self.op2(c, if op == B::Min { "min.f64" } else { "max.f64" }, a, b.into());
                    let nan = self.setp("nan", "f64", a, b.into());
                    let q = self.p.mov(c, "f64", Imm::F64(f64::NAN.to_bits()).into());
                    self.select(t, nan, q, m)
                }
                B::Pow => self.pow_of(c, a, b),
                B::Rem if t == ScalarType::F32 => self.fmod(a, b),
                B::Rem => self.fmod64(a, b),
                _ => return Err(self.unsupported(format!("{t} {}", op.name()))),
            });
        }
        let wide = c == RegClass::B64;
        let bt = if wide { "b64" } else { "b32" };
        let r = match op {
            B::Add => self.op2(c, &format!("add.{s}"), a, b.into()),
            B::Sub => self.op2(c, &format!("sub.{s}"), a, b.into()),
            B::Mul => self.op2(c, &format!("mul.lo.{s}"), a, b.into()),
            B::Min => self.op2(c, &format!("min.{s}"), a, b.into()),
            B::Max => self.op2(c, &format!("max.{s}"), a, b.into()),
            B::And => self.op2(c, &format!("and.{bt}"), a, b.into()),
            B::Or => self.op2(c, &format!("or.{bt}"), a, b.into()),
            B::Xor => self.op2(c, &format!("xor.{bt}"), a, b.into()),
            B::Shl | B::Shr => {
                let amount = if wide {
                    let m = self.op2(RegClass::B64, "min.u64", b, Imm::I(64).into());
                    self.op1(RegClass::B32, "cvt.u32.u64", m)
                } else {
                    b
                };
                let opc = match (op, t.is_signed()) {
                    (B::Shl, _) => format!("shl.{bt}"),
                    (_, true) => format!("shr.{}", if wide { "s64" } else { "s32" }),
                    _ => format!("shr.{}", if wide { "u64" } else { "u32" }),
                };
                self.op2(c, &opc, a, amount.into())
            }
            B::Div | B::Rem => {
                // A zero divisor gives 0; MIN / -1 gives -MIN (wrapped), MIN % -1 gives 0.
                let zero = self.setp("eq", s, b, Imm::I(0).into());
                let one = self.p.mov(c, bt, Imm::I(1).into());
                let safe = self.select(t, zero, one, b);
                let (safe, m1) = if t.is_signed() {
                    let m1 = self.setp("eq", s, b, Imm::I(-1).into());
                    (self.select(t, m1, one, safe), Some(m1))
                } else {
                    (safe, None)
                };
                let q = self.op2(c, &format!("{}.{s}", if op == B::Div { "div" } else { "rem" }), a, safe.into());
                let z = self.p.mov(c, bt, Imm::I(0).into());
                let q = match m1 {
                    Some(m1) if op == B::Div => {
                        let n = self.op1(c, &format!("neg.{}", s.replace('u', "s")), a);
                        self.select(t, m1, n, q)
                    }
                    Some(m1) => self.select(t, m1, z, q),
                    None => q,
                };
                self.select(t, zero, z, q)
            }
            _ => return Err(self.unsupported(format!("{t} {}", op.name()))),
        };
        Ok(self.norm(t, r))
    }

    /// f32 `fmod(x, y)`: the f64 one of the exact f64 operands ([`math`]), whose
    /// exact result is an f32.
    fn fmod(&mut self, x: Reg, y: Reg) -> Reg {
        let xd = self.op1(RegClass::F64, "cvt.f64.f32", x);
        let yd = self.op1(RegClass::F64, "cvt.f64.f32", y);
        let r = self.fmod64(xd, yd);
        self.op1(RegClass::F32, "cvt.rn.f32.f64", r)
    }

    /// Integer conversion between integer compute types (wrapping).
    fn int_convert(&mut self, from: ScalarType, v: Reg, to: ScalarType) -> Reg {
        match (class(from), class(to)) {
            (RegClass::B64, RegClass::B64) => v,
            (RegClass::B64, _) => {
                let r = self.op1(RegClass::B32, "cvt.u32.u64", v);
                match to {
                    ScalarType::I32 | ScalarType::U32 => r,
                    _ => self.norm(to, r),
                }
            }
            (_, RegClass::B64) => {
                self.op1(RegClass::B64, if from.is_signed() { "cvt.s64.s32" } else { "cvt.u64.u32" }, v)
            }
            _ => self.norm(to, v),
        }
    }

    /// ONNX `Cast` of `v` (type `from`) to the values of `to`.
    fn cast(&mut self, from: ScalarType, v: Reg, to: DType, saturate: bool) -> R<Reg> {
        let ct = ScalarType::of_storage(to);
        if from == ScalarType::Bool {
            let one = self.constant(ct, ct.bits_of_i64(1));
            let zero = self.constant(ct, 0);
            return Ok(self.select(ct, v, one, zero));
        }
        if let Some(f) = F8::of(to) {
            return Ok(self.cast_f8(from, v, f, saturate));
        }
        if is_nibble(to) {
            return Ok(self.cast_nibble(from, v, to));
        }
        match to {
            DType::Bool => {
                let cmp = if from.is_float() { "neu" } else { "ne" };
                Ok(self.setp(cmp, sfx(from), v, Imm::zero(class(from)).into()))
            }
            DType::F16 | DType::BF16 => {
                let h = if to == DType::F16 { "f16" } else { "bf16" };
                // Rounded once, from f32 or f64 (an integer goes through f64, exactly
                // below 2^53).
                let src = match from {
                    ScalarType::F32 => v,
                    ScalarType::F64 => v,
                    _ => self.op1(RegClass::F64, &format!("cvt.rn.f64.{}", sfx(from)), v),
                };
                let fs = if from == ScalarType::F32 { "f32" } else { "f64" };
                let hb = self.op1(RegClass::B16, &format!("cvt.rn.{h}.{fs}"), src);
                Ok(self.op1(RegClass::F32, &format!("cvt.f32.{h}"), hb))
            }
            _ if ct.is_float() => Ok(match (from, ct) {
                (f, t) if f == t => v,
                (ScalarType::F32, _) => self.op1(RegClass::F64, "cvt.f64.f32", v),
                (ScalarType::F64, _) => self.op1(RegClass::F32, "cvt.rn.f32.f64", v),
                (f, t) => self.op1(class(t), &format!("cvt.rn.{}.{}", sfx(t), sfx(f)), v),
            }),
            _ if storage(to).is_none() => Err(self.unsupported(format!("casts to {}", to.name()))),
            _ if from.is_float() => {
                let fs = sfx(from);
                let s = self.op1(RegClass::B64, &format!("cvt.rzi.s64.{fs}"), v);
                if ct == ScalarType::U64 {
                    let u = self.op1(RegClass::B64, &format!("cvt.rzi.u64.{fs}"), v);
                    let zero = if from == ScalarType::F32 { Imm::F32(0) } else { Imm::F64(0) };
                    let nonneg = self.setp("ge", fs, v, zero.into());
                    return Ok(self.select(ScalarType::U64, nonneg, u, s));
                }
                Ok(self.int_convert(ScalarType::I64, s, ct))
            }
            _ => Ok(self.int_convert(from, v, ct)),
        }
    }

    /// Nodes under `e` that can be evaluated now (every variable they read defined):
    /// evaluated, so a loop opened next does not recompute them.
    fn hoist(&mut self, e: ExprId, seen: &mut HashSet<ExprId>) -> R<()> {
        self.hoist_where(
            e,
            &|ev, e| ev.free[e.index()].iter().all(|&v| ev.vars.get(v as usize).is_some_and(Option::is_some)),
            seen,
        )
    }

    /// Evaluates the highest nodes under `e` that are `ready` (all of them, once each:
    /// nodes in `seen` are skipped, and entered into it), so that code placed after
    /// this, in a loop, finds them computed. Constants and variables stay where they
    /// are used: they cost nothing there.
    pub fn hoist_where(
        &mut self,
        e: ExprId,
        ready: &dyn Fn(&Eval<'k, 'p>, ExprId) -> bool,
        seen: &mut HashSet<ExprId>,
    ) -> R<()> {
        if !seen.insert(e) {
            return Ok(());
        }
        if ready(self, e) {
            if !matches!(self.k.node(e).expr, Expr::Const(_) | Expr::Var(_)) {
                self.value(e)?;
            }
            return Ok(());
        }
        let mut ops = Vec::new();
        self.k.node(e).expr.for_each_operand(|o| ops.push(o));
        for o in ops {
            self.hoist_where(o, ready, seen)?;
        }
        Ok(())
    }

    /// A fold of `body` over `vars` as nested counted loops.
    fn reduce(&mut self, op: ReduceOp, ty: ScalarType, vars: &[kiln_flow::VarId], body: ExprId) -> R<Reg> {
        let bt = self.ty(body);
        self.hoist(body, &mut HashSet::new())?;
        let acc = match identity(op, bt) {
            Some(bits) => self.constant(bt, bits),
            None => self.p.mov(RegClass::B64, "b64", Imm::I(0).into()),
        };
        // Arg reductions: the best value so far and whether there is one.
        let (best, found) = if op.is_arg() {
            let b = self.constant(bt, 0);
            let f = self.constant(ScalarType::Bool, 0);
            (Some(b), Some(f))
        } else {
            (None, None)
        };
        let mut loops = Vec::new();
        for v in vars {
            let extent = self.k.vars.get(v.0 as usize).copied().unwrap_or(0);
            let r = self.p.mov(RegClass::B64, "b64", Imm::I(0).into());
            let (head, end) = (self.p.label(), self.p.label());
            self.p.place(head);
            let done = self.setp("ge", "s64", r, Imm::I(extent as i64).into());
            self.p.bra(Some((done, false)), end);
            self.set_var(v.0 as usize, r);
            self.scopes.push(HashMap::new());
            loops.push((r, head, end));
        }
        let x = self.value(body)?;
        match op {
            ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min => {
                let b = match op {
                    ReduceOp::Sum => BinaryOp::Add,
                    ReduceOp::Prod => BinaryOp::Mul,
                    ReduceOp::Max => BinaryOp::Max,
                    _ => BinaryOp::Min,
                };
                let n = self.binary(b, bt, acc, x)?;
                self.copy(acc, n);
            }
            ReduceOp::ArgMax { last } | ReduceOp::ArgMin { last } => {
                let (best, found) = (best.unwrap_or(acc), found.unwrap_or(acc));
                let cmp = if matches!(op, ReduceOp::ArgMax { .. }) { BinaryOp::Gt } else { BinaryOp::Lt };
                let better = self.binary(cmp, bt, x, best)?;
                let better = if last {
                    let eq = self.binary(BinaryOp::Eq, bt, x, best)?;
                    self.op2(RegClass::Pred, "or.pred", better, eq.into())
                } else {
                    better
                };
                let nf = self.op1(RegClass::Pred, "not.pred", found);
                let take = self.op2(RegClass::Pred, "or.pred", better, nf.into());
                let nb = self.select(bt, take, x, best);
                self.copy(best, nb);
                // The position: row-major over the reduction's variables.
                let mut pos: Option<Reg> = None;
                for (v, (r, _, _)) in vars.iter().zip(&loops) {
                    let extent = self.k.vars.get(v.0 as usize).copied().unwrap_or(0) as i64;
                    pos = Some(match pos {
                        None => *r,
                        Some(p) => {
                            let d = self.p.reg(RegClass::B64);
                            self.p.op("mad.lo.s64", &[d.into(), p.into(), Imm::I(extent).into(), (*r).into()]);
                            d
                        }
                    });
                }
                let pos = pos.unwrap_or(acc);
                let na = self.select(ScalarType::I64, take, pos, acc);
                self.copy(acc, na);
                let t = self.constant(ScalarType::Bool, 1);
                self.copy(found, t);
            }
        }
        for (v, (r, head, end)) in vars.iter().zip(loops).rev() {
            self.scopes.pop();
            self.p.op("add.s64", &[r.into(), r.into(), Imm::I(1).into()]);
            self.p.bra(None, head);
            self.p.place(end);
            if let Some(s) = self.vars.get_mut(v.0 as usize) {
                *s = None;
            }
        }
        let _ = ty;
        Ok(acc)
    }

    fn copy(&mut self, dst: Reg, src: Reg) {
        self.p.copy(dst, src);
    }
}

/// The bits of `op`'s identity on values of `t` (an accumulator's first value, the
/// interpreter's): 0, 1, the lowest or the highest value (−∞/+∞ for floats); `None` for
/// the arg reductions, whose accumulator is a position.
pub fn identity(op: ReduceOp, t: ScalarType) -> Option<u64> {
    Some(match op {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => t.bits_of_i64(1),
        ReduceOp::Max => lowest(t),
        ReduceOp::Min => highest(t),
        ReduceOp::ArgMax { .. } | ReduceOp::ArgMin { .. } => return None,
    })
}

fn lowest(t: ScalarType) -> u64 {
    match t {
        ScalarType::F32 => f32::NEG_INFINITY.to_bits() as u64,
        ScalarType::F64 => f64::NEG_INFINITY.to_bits(),
        _ => t.wrap(t.int_range().0 as u64),
    }
}

fn highest(t: ScalarType) -> u64 {
    match t {
        ScalarType::F32 => f32::INFINITY.to_bits() as u64,
        ScalarType::F64 => f64::INFINITY.to_bits(),
        _ => t.wrap(t.int_range().1 as u64),
    }
}
