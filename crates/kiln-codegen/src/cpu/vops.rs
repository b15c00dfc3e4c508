//! The one table of vector operations that the machine-code kernels share: which
//! kernel operations have a vector form ([`op_form`]), how many scratch registers each
//! needs ([`op_scratch`]), and how each is written ([`Vx::node_op`]) in either width
//! ([`super::vector`]: eight lanes in `ymm`, sixteen in `zmm`). The vector kernels
//! ([`super::rows`], which every elementwise, row and general kernel with a vector form
//! takes) and the contraction epilogues ([`super::gemm`]) both evaluate their
//! operations through it, so a form added here serves both.
//!
//! ## Lanes
//! Every value is a vector of 32-bit lanes: f32, i32 or u32 bits, or a **bool as a
//! vector mask** — all ones (true) or zero (false) in each lane, in both widths (on
//! sixteen lanes a comparison writes an opmask register, `k4`, which is widened into a
//! vector with `vpternlogd` on a register zeroed first; a select narrows its condition back with `vptestmd` into
//! `k5`). A bool therefore lives in an ordinary register, can be stored on the stack,
//! selected on, negated (`xor` with all ones) and cast: to f32 as `and` with 1.0, to
//! i32 as a shift right by 31.
//!
//! **i8 and u8 values** are 32-bit lanes too, holding the value sign-extended (i8) or
//! zero-extended (u8) — the lanes `vpmovsxbd`/`vpmovzxbd` load. Comparisons, max/min,
//! selects and the bitwise operations keep that form as they are (signed 32-bit
//! comparisons order both: a u8 lane is at most 255); `+ − ×`, negation, absolute value
//! and `not` compute on the 32-bit lanes and then wrap to eight bits again
//! ([`Vx::wrap8`]: a shift left by 24 and an arithmetic one right for i8, `and 0xFF` for
//! u8), as the interpreter wraps. A cast to f32 is `vcvtdq2ps` (exact), to i32/u32 the
//! lane as it is (the interpreter sign-extends i8 and zero-extends u8 too); casts from
//! f32 to i8/u8 are [`Vx::f32_to_8bit`].
//!
//! i64 values have no lanes here; an i64 **comparison** whose operands are i64 loads or
//! constants (a sequence mask, `arange(n) < length`) reads its operands straight from
//! memory into two registers of 64-bit lanes per vector (`vpcmpgtq`/`vpcmpeqq`, or
//! `vpcmpq` into opmasks), and writes the 32-bit lane mask of its result
//! ([`Vx::cmp_i64`]); an i64 **conversion to f32** of such an operand (a mask input) is
//! the other operation on i64 data with a vector form (eight lanes, correctly rounded
//! through f64 rounded to odd: [`Vx::i64_to_f32`]); a **cast to bool** of such an
//! operand is the comparison `x != 0` ([`is_i64_to_bool`], either width).
//!
//! **i64 index lanes.** Where a load's offset is computed from i64 data read per lane
//! (GatherND's index tensor), the row kernels evaluate that index in 64-bit lanes, two
//! registers per vector (lanes `0..n/2`, then the rest): the data gathered by
//! `vpgatherdq` ([`Vx::gather_i64`]), positions and constants widened from i32 lanes
//! ([`Vx::widen_i32`]), `+ −` wrapping and signed max/min ([`Vx::int64`]), comparisons
//! into 32-bit lane masks ([`Vx::cmp_i64`] on register operands, [`I64Src::Regs`]) and
//! selects on them ([`Vx::select64`]); the result, whose range lies inside its dimension,
//! is narrowed to i32 offsets exactly ([`Vx::narrow_i64`]). An i64 operand of a
//! comparison or conversion that is read at such offsets, or at a stride, is gathered
//! the same way.
//!
//! f32 `Pow` with a run-time exponent is `super::math`'s `Vx::pow` (`exp(y·ln|x|)` with
//! C's special cases), in the row kernels and in contraction epilogues alike.
//!
//! ## Semantics
//! Exactly the kernel interpreter's (`kiln_flow::interp`), lane by lane: f32 `max`/`min`
//! give NaN when either operand is NaN; comparisons are ordered (false on NaN) except
//! `ne` (true on NaN); a cast of f32 to bool is `x != 0` (NaN is true); integer
//! arithmetic wraps; floor/ceil/round (half to even)/trunc are `vroundps`/
//! `vrndscaleps`; f32 to i8/u8 truncates to an i64, saturating (NaN gives 0), then
//! wraps to eight bits (so 300.0 gives 44 and +inf gives −1 as i8, 255 as u8).

use iced_x86::code_asm::*;
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ScalarType as S, UnaryOp};
use kiln_ir::DType;

use super::asm::XMM;
use super::gemm::{NotHere, R};
use super::math::{has_vector_form, vector_scratch, POW_SCRATCH};
use super::vector::{k as kreg, y, z, zk, Mask, Op, Src, Vx, V};

/// `self.a.$ins` on the registers `$r…` as `zmm` (a wide `Vx`) or `ymm`, then the
/// operands `$extra…` as given (immediates, memory).
macro_rules! at_width {
    ($s:ident, $ins:ident($($r:expr),+ $(; $($extra:expr),+)?)) => {
        if $s.wide {
            $s.a.$ins($(z($r)),+ $($(, $extra)+)?)?
        } else {
            $s.a.$ins($(y($r)),+ $($(, $extra)+)?)?
        }
    };
}

/// Whether values of type `t` are lanes of a vector register (f32, i32, u32, bool, and
/// i8/u8 extended to 32 bits).
pub(crate) fn lane_type(t: S) -> bool {
    matches!(t, S::F32 | S::I32 | S::U32 | S::Bool) || byte_type(t)
}

/// Whether `t` is i8 or u8: 32-bit lanes holding the value sign- or zero-extended.
pub(crate) fn byte_type(t: S) -> bool {
    matches!(t, S::I8 | S::U8)
}

/// An operand of an i64 comparison ([`Vx::cmp_i64`]).
#[derive(Clone, Copy)]
pub(crate) enum I64Src {
    /// Consecutive elements from this address (the lane-0 element), one per lane.
    Vector(AsmMemoryOperand),
    /// One element at this address, in every lane.
    Broadcast(AsmMemoryOperand),
    /// A constant.
    Const(i64),
    /// Values already in registers, 64-bit lanes in two halves (lanes `0..n/2` in the
    /// first): data gathered per lane ([`Vx::gather_i64`]) or i64 lane arithmetic.
    Regs(V, V),
}

/// Whether `e` is an i64 comparison of the form [`Vx::cmp_i64`] takes: both operands
/// in-bounds loads of an i64 tensor, or constants.
pub(crate) fn is_i64_compare(k: &Kernel, e: ExprId) -> bool {
    let Expr::Binary(op, a, b) = k.node(e).expr else { return false };
    op.is_comparison() && k.node(a).ty == S::I64 && is_i64_data(k, a) && is_i64_data(k, b)
}

/// Whether `x` is i64 data the i64 vector forms read: an in-bounds load of an i64
/// tensor, or a constant.
fn is_i64_data(k: &Kernel, x: ExprId) -> bool {
    match &k.node(x).expr {
        Expr::Const(_) => true,
        Expr::Load { input, bounds: Bounds::InBounds, .. } => k.inputs[*input as usize].dtype == DType::I64,
        _ => false,
    }
}

/// Whether `e` is a conversion of i64 data to f32 of the form [`Vx::i64_to_f32`] takes:
/// its operand an in-bounds load of an i64 tensor, or a constant.
pub(crate) fn is_i64_to_f32(k: &Kernel, e: ExprId) -> bool {
    let Expr::Cast { value, to: DType::F32, .. } = k.node(e).expr else { return false };
    k.node(value).ty == S::I64 && is_i64_data(k, value)
}

/// Whether `e` is a cast of i64 data to bool (`x != 0`, the interpreter's cast), which
/// is an i64 comparison with 0 ([`Vx::cmp_i64`]): its operand an in-bounds load of an
/// i64 tensor, or a constant (an attention mask read as bool).
pub(crate) fn is_i64_to_bool(k: &Kernel, e: ExprId) -> bool {
    let Expr::Cast { value, to: DType::Bool, .. } = k.node(e).expr else { return false };
    k.node(value).ty == S::I64 && is_i64_data(k, value)
}

/// Whether `e` reads i64 data with a vector form: an i64 comparison, or a conversion of
/// i64 to f32 or to bool.
pub(crate) fn is_i64_data_use(k: &Kernel, e: ExprId) -> bool {
    is_i64_compare(k, e) || is_i64_to_f32(k, e) || is_i64_to_bool(k, e)
}

/// Whether operation node `e` (a unary, binary, select or cast: loads, constants and
/// reductions are each emitter's own) has a vector form on `wide` (16-lane) or 8-lane
/// vectors; `Err` names what has none.
pub(crate) fn op_form(k: &Kernel, e: ExprId, wide: bool) -> Result<(), String> {
    use BinaryOp as B;
    let node = k.node(e);
    let ty_of = |x: ExprId| k.node(x).ty;
    let ok = match &node.expr {
        Expr::Unary(op, a) => match ty_of(*a) {
            S::F32 => {
                has_vector_form(*op)
                    || matches!(op, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc | UnaryOp::IsNan)
            }
            S::I32 | S::U32 | S::I8 | S::U8 => matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not),
            S::Bool => *op == UnaryOp::Not,
            _ => false,
        },
        Expr::Binary(op, a, _) => match ty_of(*a) {
            S::F32 => !matches!(op, B::Rem | B::And | B::Or | B::Xor | B::Shl | B::Shr),
            S::I32 | S::U32 | S::I8 | S::U8 => !matches!(op, B::Div | B::Rem | B::Pow | B::Shl | B::Shr),
            S::Bool => matches!(op, B::And | B::Or | B::Xor | B::Eq | B::Ne),
            S::I64 => is_i64_compare(k, e),
            _ => false,
        },
        Expr::Select(_, a, _) => lane_type(ty_of(*a)),
        Expr::Cast { value, to, .. } => {
            let to_ty = S::of_storage(*to);
            to_ty.dtype() == *to
                && matches!(
                    (ty_of(*value), to_ty),
                    (S::F32, S::F32)
                        | (S::I32 | S::U32, S::I32 | S::U32)
                        | (S::Bool, S::F32 | S::I32 | S::U32 | S::Bool)
                        | (S::F32 | S::I32 | S::U32, S::Bool)
                        | (S::I32, S::F32)
                        | (S::I8 | S::U8, S::F32 | S::I32 | S::U32 | S::I8 | S::U8 | S::Bool)
                        | (S::F32 | S::I32 | S::U32 | S::Bool, S::I8 | S::U8)
                )
                || (wide && ty_of(*value) == S::U32 && to_ty == S::F32)
                // f32 to a 32-bit integer: eight lanes (`Vx::f32_to_i32`).
                || (!wide && ty_of(*value) == S::F32 && matches!(to_ty, S::I32 | S::U32) && to_ty.dtype() == *to)
                || (!wide && is_i64_to_f32(k, e))
                || is_i64_to_bool(k, e)
        }
        _ => false,
    };
    if ok && lane_type(node.ty) {
        Ok(())
    } else if let Expr::Cast { value, to, .. } = &node.expr {
        Err(format!("a cast of {} to {} without a vector form", ty_of(*value).name(), to.name()))
    } else {
        Err(format!("{} of {} without a vector form", describe(&node.expr), node.ty.name()))
    }
}

fn describe(e: &Expr) -> String {
    match e {
        Expr::Unary(op, _) => op.name().to_string(),
        Expr::Binary(op, _, _) => op.name().to_string(),
        Expr::Select(..) => "select".into(),
        Expr::Cast { to, .. } => format!("a cast to {}", to.name()),
        Expr::Load { .. } => "a load".into(),
        Expr::Reduce { .. } => "a reduction".into(),
        _ => "a value".into(),
    }
}

/// Scratch registers [`Vx::node_op`] needs for node `e` (distinct from its operands'
/// and its result's).
pub(crate) fn op_scratch(k: &Kernel, e: ExprId) -> usize {
    let node = k.node(e);
    match &node.expr {
        Expr::Unary(op, a) if k.node(*a).ty == S::F32 => vector_scratch(*op),
        Expr::Unary(UnaryOp::Neg, _) => 1,
        Expr::Cast { value, to: DType::I8 | DType::U8, .. } if k.node(*value).ty == S::F32 => 1,
        Expr::Cast { value, to: DType::I32 | DType::U32, .. } if k.node(*value).ty == S::F32 => 3,
        Expr::Cast { value, to: DType::Bool, .. } if k.node(*value).ty == S::I64 => 3,
        Expr::Cast { value, .. } if k.node(*value).ty == S::I64 => 6,
        Expr::Binary(op, a, _) => match (k.node(*a).ty, op) {
            (S::F32, BinaryOp::Max | BinaryOp::Min) => 2,
            (S::F32, BinaryOp::Pow) => POW_SCRATCH,
            (S::U32, op) if op.is_comparison() => 2,
            (S::I64, _) => 3,
            _ => 0,
        },
        _ => 0,
    }
}

/// The `vcmpps` predicate of a float comparison (ordered, `ne` unordered).
pub(crate) fn float_pred(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Eq => 0x00,
        BinaryOp::Ne => 0x04,
        BinaryOp::Lt => 0x11,
        BinaryOp::Le => 0x12,
        BinaryOp::Gt => 0x1E,
        _ => 0x1D,
    }
}

/// The 32-bit lane word of a constant node of type `ty`: a true `Bool` is all ones
/// (the vector masks' form), a false one 0, anything else its low 32 bits.
pub(crate) fn const_word(ty: S, bits: u64) -> u32 {
    match ty {
        S::Bool if bits != 0 => u32::MAX,
        // Sign-extended, as i8 lanes are.
        S::I8 => bits as u8 as i8 as i32 as u32,
        _ => bits as u32,
    }
}

/// The reciprocal's bits of an f32 constant `e` that is a power of two with a normal
/// reciprocal: `x / c` is then `x · (1/c)`, the same exact value rounded once (a
/// QuantizeLinear to TFLite's fixed output scales, 1/128 and 1/256: a `vmulps` where a
/// `vdivps` costs several times as much).
fn exact_reciprocal(k: &Kernel, e: ExprId) -> Option<u32> {
    let node = k.node(e);
    let Expr::Const(bits) = node.expr else { return None };
    let c = f32::from_bits(bits as u32);
    let r = 1.0 / c;
    (node.ty == S::F32 && c.is_normal() && r.is_normal() && c.to_bits() & 0x7F_FFFF == 0).then_some(r.to_bits())
}

/// The `vpcmpd`/`vpcmpq` predicate of an integer comparison.
fn int_pred(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Eq => 0,
        BinaryOp::Lt => 1,
        BinaryOp::Le => 2,
        BinaryOp::Ne => 4,
        BinaryOp::Ge => 5,
        _ => 6,
    }
}

/// Opmask registers the wide forms use: a comparison's result, a select's condition,
/// the upper half of a tail mask (`k1` is the tail, `k2` erf's, `k3` max/min's).
const K_CMP: Mask = Mask(4);
const K_SEL: Mask = Mask(5);
const K_HALF: Mask = Mask(6);

impl Vx<'_> {
    /// `d` = all ones where opmask `m` is set, else zero (16 lanes). `vpternlogd` reads
    /// its destination, so `d` is zeroed first (an idiom the CPU knows depends on
    /// nothing): without it the lanes wait for `d`'s previous value, which in a row
    /// loop is the last iteration's result, and every vector of the row then waits for
    /// the one before (a QuantizeLinear + DequantizeLinear with a zero point, whose
    /// `isnan` select is such a mask, over `[48, 16, 16]`: 13.0 → 4.6 µs).
    fn mask_to_vector(&mut self, d: V, m: Mask) -> R<()> {
        self.a.vpxord(z(d), z(d), z(d))?;
        self.a.vpternlogd(zk(d, m).z(), z(d), z(d), 0xFF)?;
        Ok(())
    }

    /// `d` = the vector mask of the lanes where `x` is not 0; `d` may be `x`.
    fn nonzero(&mut self, d: V, x: V) -> R<()> {
        if self.wide {
            self.a.vptestmd(kreg(K_CMP), z(x), z(x))?;
            self.mask_to_vector(d, K_CMP)
        } else {
            let zero = self.t.vector(self.a, 0);
            self.a.vpcmpeqd(y(d), y(x), ymmword_ptr(zero))?;
            self.not(d, d)
        }
    }

    /// `d = !x` for a vector mask.
    pub fn not(&mut self, d: V, x: V) -> R<()> {
        self.op(Op::Xor, d, x, Src::C(u32::MAX))
    }

    /// `d = c ? t : f`, lane by lane, for a vector mask `c`.
    pub fn select(&mut self, d: V, c: V, t: V, f: V) -> R<()> {
        if self.wide {
            self.a.vptestmd(kreg(K_SEL), z(c), z(c))?;
            self.a.vblendmps(zk(d, K_SEL), z(f), z(t))?;
        } else {
            self.a.vblendvps(y(d), y(f), y(t), y(c))?;
        }
        Ok(())
    }

    /// `d = x pred s` as a vector mask (a `vcmpps` predicate, [`float_pred`]).
    pub fn cmp_vector(&mut self, d: V, x: V, s: Src, pred: i32) -> R<()> {
        if self.wide {
            self.cmp(K_CMP, x, s, pred)?;
            self.mask_to_vector(d, K_CMP)
        } else {
            self.cmp(Mask(d.0), x, s, pred)
        }
    }

    /// `d = max(x, y)` (or min) on f32 lanes: NaN in either gives NaN. `t` is scratch,
    /// distinct from the others; `d` may be `x` or `y`.
    pub fn max_min(&mut self, max: bool, d: V, x: V, yv: V, t: [V; 2]) -> R<()> {
        // vmaxps gives its second operand when either is NaN, so max(x, y) keeps a NaN
        // y; where x is NaN, take x.
        let m = if self.wide { Mask(3) } else { Mask(t[1].0) };
        self.op(if max { Op::Max } else { Op::Min }, t[0], x, Src::R(yv))?;
        self.cmp(m, x, Src::R(x), 3)?; // UNORD_Q: x is NaN
        self.blend(d, m, t[0], x)
    }

    /// A three-operand integer instruction on registers of the width in use.
    pub fn int3(&mut self, op: BinaryOp, signed: bool, d: V, x: V, yv: V) -> R<()> {
        use BinaryOp as B;
        macro_rules! both {
            ($ins:ident) => {
                at_width!(self, $ins(d, x, yv))
            };
        }
        match (op, signed) {
            (B::Add, _) => both!(vpaddd),
            (B::Sub, _) => both!(vpsubd),
            (B::Mul, _) => both!(vpmulld),
            (B::Min, true) => both!(vpminsd),
            (B::Max, true) => both!(vpmaxsd),
            (B::Min, false) => both!(vpminud),
            (B::Max, false) => both!(vpmaxud),
            (B::And, _) => return self.op(Op::And, d, x, Src::R(yv)),
            (B::Or, _) => return self.op(Op::Or, d, x, Src::R(yv)),
            (B::Xor, _) => return self.op(Op::Xor, d, x, Src::R(yv)),
            _ => return Err(NotHere(format!("vector integer {}", op.name()))),
        }
        Ok(())
    }

    /// `d = x op y` as a vector mask, on i32 (`signed`) or u32 lanes; `t` is scratch
    /// (two registers for u32 on eight lanes).
    pub fn int_compare(&mut self, op: BinaryOp, signed: bool, d: V, x: V, yv: V, t: &[V]) -> R<()> {
        use BinaryOp as B;
        if self.wide {
            if signed {
                self.a.vpcmpd(kreg(K_CMP), z(x), z(yv), int_pred(op))?;
            } else {
                self.a.vpcmpud(kreg(K_CMP), z(x), z(yv), int_pred(op))?;
            }
            return self.mask_to_vector(d, K_CMP);
        }
        // AVX2 has `>` and `==` on signed lanes: unsigned lanes compare with their sign
        // bits flipped.
        let (x, yv) = if signed {
            (x, yv)
        } else {
            let [tx, ty] = [t[0], t[1]];
            self.op(Op::Xor, tx, x, Src::C(0x8000_0000))?;
            self.op(Op::Xor, ty, yv, Src::C(0x8000_0000))?;
            (tx, ty)
        };
        let (a, b, negate) = match op {
            B::Eq | B::Ne => (x, yv, op == B::Ne),
            B::Gt | B::Le => (x, yv, op == B::Le),
            _ => (yv, x, op == B::Ge), // Lt: y > x; Ge: !(y > x)
        };
        if matches!(op, B::Eq | B::Ne) {
            self.a.vpcmpeqd(y(d), y(a), y(b))?;
        } else {
            self.a.vpcmpgtd(y(d), y(a), y(b))?;
        }
        if negate {
            self.not(d, d)?;
        }
        Ok(())
    }

    /// Loads half `h` (lanes `4h..4h+4` on eight lanes, `8h..8h+8` on sixteen) of i64
    /// operand `s` into `d`; `tail`: the lane mask of a partial vector (`q` is scratch
    /// for its 64-bit form on eight lanes).
    fn load_i64_half(&mut self, d: V, s: I64Src, h: i32, tail: Option<Mask>, q: V) -> R<()> {
        let half_bytes = self.bytes();
        match s {
            I64Src::Vector(m) => {
                let m = m + half_bytes * h;
                match (tail, self.wide) {
                    (None, false) => self.a.vmovdqu(y(d), m)?,
                    (None, true) => self.a.vmovdqu64(z(d), m)?,
                    (Some(t), false) => {
                        // The 32-bit lane mask's half, widened to 64-bit lanes.
                        if h == 0 {
                            self.a.vpmovsxdq(y(q), xmm(V(t.0))?)?;
                        } else {
                            self.a.vextracti128(xmm(q)?, y(V(t.0)), 1)?;
                            self.a.vpmovsxdq(y(q), xmm(q)?)?;
                        }
                        self.a.vpmaskmovq(y(d), y(q), m)?;
                    }
                    (Some(t), true) => {
                        let km = if h == 0 {
                            t
                        } else {
                            self.a.kshiftrw(kreg(K_HALF), kreg(t), 8)?;
                            K_HALF
                        };
                        self.a.vmovdqu64(zk(d, km).z(), m)?;
                    }
                }
            }
            I64Src::Broadcast(m) => {
                at_width!(self, vpbroadcastq(d; qword_ptr(m)));
            }
            I64Src::Const(c) => {
                let l = self.t.words(self.a, &[c as u32, (c >> 32) as u32]);
                at_width!(self, vpbroadcastq(d; qword_ptr(l)));
            }
            I64Src::Regs(lo, hi) => {
                let r = if h == 0 { lo } else { hi };
                if r != d && self.wide {
                    self.a.vmovdqa64(z(d), z(r))?;
                } else if r != d {
                    self.a.vmovdqa(y(d), y(r))?;
                }
            }
        }
        Ok(())
    }

    /// `(lo, hi)` = the i32 lanes of `x` sign-extended to 64-bit lanes, in two halves
    /// (lanes `0..n/2` in `lo`); `lo` may be `x`, `hi` may not.
    pub fn widen_i32(&mut self, lo: V, hi: V, x: V) -> R<()> {
        if self.wide {
            self.a.vextracti64x4(y32(hi), z(x), 1)?;
            self.a.vpmovsxdq(z(lo), y32(x))?;
            self.a.vpmovsxdq(z(hi), y32(hi))?;
        } else {
            self.a.vextracti128(xmm(hi)?, y(x), 1)?;
            self.a.vpmovsxdq(y(lo), xmm(x)?)?;
            self.a.vpmovsxdq(y(hi), xmm(hi)?)?;
        }
        Ok(())
    }

    /// `d` = the low dwords of the 64-bit lanes `(lo, hi)` as i32 lanes (exact where
    /// every value fits 32 bits); `t` scratch (sixteen lanes).
    pub fn narrow_i64(&mut self, d: V, lo: V, hi: V, t: V) -> R<()> {
        if self.wide {
            self.a.vpmovqd(y32(t), z(hi))?;
            self.a.vpmovqd(y32(d), z(lo))?;
            self.a.vinserti64x4(z(d), z(d), y32(t), 1)?;
        } else {
            // Per 128-bit half, dwords 0 and 2 of lo then of hi; then the pairs in order.
            self.a.vshufps(y(d), y(lo), y(hi), 0x88)?;
            self.a.vpermpd(y(d), y(d), 0xD8)?;
        }
        Ok(())
    }

    /// `(lo, hi)` = the 64-bit elements at `base + 8·idx[i]` for lanes `i` (`idx`:
    /// element offsets in i32 lanes), by `vpgatherdq` per half; a tail mask reads only
    /// its lanes, the others are 0. `m`: two scratch registers (the index half and, on
    /// eight lanes, the gather's mask); on sixteen lanes opmask `k7` is clobbered.
    pub fn gather_i64(&mut self, lo: V, hi: V, base: AsmRegister64, idx: V, tail: Option<Mask>, m: [V; 2]) -> R<()> {
        for (h, d) in [(0, lo), (1, hi)] {
            if self.wide {
                let ix = if h == 0 {
                    y32(idx)
                } else {
                    self.a.vextracti64x4(y32(m[0]), z(idx), 1)?;
                    y32(m[0])
                };
                match (tail, h) {
                    (None, _) => self.a.kxnorw(k7, k0, k0)?,
                    (Some(tm), 0) => self.a.kmovw(k7, kreg(tm))?,
                    (Some(tm), _) => self.a.kshiftrw(k7, kreg(tm), 8)?,
                }
                self.a.vpxorq(z(d), z(d), z(d))?;
                self.a.vpgatherdq(z(d).k7(), ptr(base + ix * 8))?;
            } else {
                let ix = if h == 0 {
                    xmm(idx)?
                } else {
                    self.a.vextracti128(xmm(m[0])?, y(idx), 1)?;
                    xmm(m[0])?
                };
                match tail {
                    None => self.a.vpcmpeqq(y(m[1]), y(m[1]), y(m[1]))?,
                    // The 32-bit lane mask's half, widened to 64-bit lanes.
                    Some(tm) if h == 0 => self.a.vpmovsxdq(y(m[1]), xmm(V(tm.0))?)?,
                    Some(tm) => {
                        self.a.vextracti128(xmm(m[1])?, y(V(tm.0)), 1)?;
                        self.a.vpmovsxdq(y(m[1]), xmm(m[1])?)?;
                    }
                }
                self.a.vpxor(y(d), y(d), y(d))?;
                self.a.vpgatherdq_3(y(d), ptr(base + ix * 8), y(m[1]))?;
            }
        }
        Ok(())
    }

    /// `d = x op y` on one half of 64-bit lanes, the interpreter's i64 arithmetic: `+`
    /// and `−` wrapping, signed `max`/`min`; `t` scratch (eight lanes' max/min), distinct
    /// from `d`, `x` and `y`.
    pub fn int64(&mut self, op: BinaryOp, d: V, x: V, yv: V, t: V) -> R<()> {
        use BinaryOp as B;
        match (op, self.wide) {
            (B::Add, _) => at_width!(self, vpaddq(d, x, yv)),
            (B::Sub, _) => at_width!(self, vpsubq(d, x, yv)),
            (B::Max, true) => self.a.vpmaxsq(z(d), z(x), z(yv))?,
            (B::Min, true) => self.a.vpminsq(z(d), z(x), z(yv))?,
            (B::Max | B::Min, false) => {
                // t = x > y; max takes x there, min takes y.
                self.a.vpcmpgtq(y(t), y(x), y(yv))?;
                let (a, b) = if op == B::Max { (yv, x) } else { (x, yv) };
                self.a.vblendvpd(y(d), y(a), y(b), y(t))?;
            }
            _ => return Err(NotHere(format!("i64 lane operation {}", op.name()))),
        }
        Ok(())
    }

    /// `m = m ? x : y` bitwise on one half of 64-bit lanes (`m` all ones or zero in
    /// each 64-bit lane).
    pub fn select64(&mut self, m: V, x: V, yv: V) -> R<()> {
        if self.wide {
            self.a.vpternlogq(z(m), z(x), z(yv), 0xCA)?;
        } else {
            self.a.vblendvpd(y(m), y(yv), y(x), y(m))?;
        }
        Ok(())
    }

    /// `d = a op b` as a 32-bit lane mask, for i64 operands read from memory or constant
    /// (see the module docs); `t`: three scratch registers distinct from `d`.
    pub fn cmp_i64(&mut self, op: BinaryOp, d: V, a: I64Src, b: I64Src, tail: Option<Mask>, t: &[V]) -> R<()> {
        use BinaryOp as B;
        let [t0, t1, q] = [t[0], t[1], t[2]];
        if self.wide {
            for (h, km) in [(0, K_CMP), (1, K_SEL)] {
                self.load_i64_half(t0, a, h, tail, q)?;
                self.load_i64_half(t1, b, h, tail, q)?;
                self.a.vpcmpq(kreg(km), z(t0), z(t1), int_pred(op))?;
            }
            // k4 = k5:k4 (lanes 8..16 from the upper half).
            self.a.kunpckbw(kreg(K_CMP), kreg(K_SEL), kreg(K_CMP))?;
            return self.mask_to_vector(d, K_CMP);
        }
        // Per half, `>` or `==` on 64-bit lanes (operands swapped for `<`, `>=`).
        let swap = matches!(op, B::Lt | B::Ge);
        let negate = matches!(op, B::Ne | B::Le | B::Ge);
        let halves = [t0, t1];
        for (h, &r) in halves.iter().enumerate() {
            let other = if h == 0 { t1 } else { d };
            let (first, second) = if swap { (b, a) } else { (a, b) };
            self.load_i64_half(r, first, h as i32, tail, q)?;
            self.load_i64_half(other, second, h as i32, tail, q)?;
            if matches!(op, B::Eq | B::Ne) {
                self.a.vpcmpeqq(y(r), y(r), y(other))?;
            } else {
                self.a.vpcmpgtq(y(r), y(r), y(other))?;
            }
        }
        // Each 64-bit lane is all ones or zero: its low dword stands for it. Per 128-bit
        // half, dwords 0 and 2 of t0 then of t1; then the 64-bit pairs in order.
        self.a.vshufps(y(d), y(t0), y(t1), 0x88)?;
        self.a.vpermpd(y(d), y(d), 0xD8)?;
        if negate {
            self.not(d, d)?;
        }
        Ok(())
    }

    /// `d = x` wrapped to eight bits in the lane form of `ty` (i8: sign-extended, u8:
    /// zero-extended); `x` holds any 32-bit integer.
    pub fn wrap8(&mut self, ty: S, d: V, x: V) -> R<()> {
        if ty == S::I8 {
            at_width!(self, vpslld(d, x; 24));
            at_width!(self, vpsrad(d, d; 24));
            Ok(())
        } else {
            self.op(Op::And, d, x, Src::C(0xFF))
        }
    }

    /// `d = x` (f32) converted to i8 or u8 (`ty`) as the interpreter does: truncated to
    /// an i64, saturating (NaN gives 0), then wrapped to eight bits. `vcvttps2dq` gives
    /// the truncation wherever it fits 32 bits, and 0x8000_0000 elsewhere (NaN, |x| ≥
    /// 2³¹), which wraps to 0: right for NaN, for x ≤ −2⁶³ (i64::MIN wraps to 0) and for
    /// 2³¹ ≤ |x| < 2⁶³ (such a float is a multiple of 2⁸, its low byte 0). Only x ≥ 2⁶³
    /// (+inf included) differs: i64::MAX, whose low byte is 0xFF (−1 as i8, 255 as u8).
    /// `t` is scratch on eight lanes, distinct from `d` and `x`, and `m` on sixteen;
    /// `d` may be `x`.
    pub fn f32_to_8bit(&mut self, ty: S, d: V, x: V, t: V, m: Mask) -> R<()> {
        const TWO_63: u32 = 0x5F00_0000;
        let ones = if ty == S::I8 { u32::MAX } else { 0xFF };
        if self.wide {
            self.cmp(m, x, Src::C(TWO_63), 0x1D)?; // GE_OQ: false on NaN
            self.a.vcvttps2dq(z(d), z(x))?;
            self.wrap8(ty, d, d)?;
            let c = self.t.scalar(self.a, ones);
            self.a.vpord(zk(d, m), z(d), dword_bcst(c))?;
        } else {
            self.cmp(Mask(t.0), x, Src::C(TWO_63), 0x1D)?;
            self.a.vcvttps2dq(y(d), y(x))?;
            self.wrap8(ty, d, d)?;
            if ty == S::U8 {
                self.op(Op::And, t, t, Src::C(0xFF))?;
            }
            self.op(Op::Or, d, d, Src::R(t))?;
        }
        Ok(())
    }

    /// `d` = f32 `x` as the interpreter casts it to i32 or u32 (the same bits): truncated
    /// toward zero to an i64 (saturating, NaN 0) and wrapped to 32 bits; eight lanes.
    /// `t` is scratch, distinct from `d` and `x`; `d` may be `x`.
    ///
    /// `vcvttps2dq` is that where `|x| < 2³¹` and gives `0x8000_0000` elsewhere (and for
    /// NaN). There the lane takes `x − 2³²·⌊x·2⁻³²⌋`, exact because `x` is then a
    /// multiple of 2⁸ (24 significant bits) and the difference its low 32 bits, in
    /// `[0, 2³²)`, converted as `vcvttps2dq(· − 2³¹) ⊕ 2³¹`: NaN and ±∞ give 0 there
    /// (NaN, and −∞ as i64::MIN, are 0 in the interpreter too); `x ≥ 2⁶³` (i64::MAX) is all
    /// ones. Where `x` is −2³¹ both forms agree.
    pub fn f32_to_i32(&mut self, d: V, x: V, t: [V; 3]) -> R<()> {
        const TWO_M32: u32 = 0x2F80_0000;
        const TWO_32: u32 = 0x4F80_0000;
        const TWO_31: u32 = 0x4F00_0000;
        const TWO_63: u32 = 0x5F00_0000;
        const INDEFINITE: u32 = 0x8000_0000;
        if self.wide {
            return Err(NotHere("a conversion of f32 to i32 on sixteen lanes".into()));
        }
        let [big, small, top] = t;
        self.op(Op::Mul, big, x, Src::C(TWO_M32))?;
        self.round(big, big, 9)?;
        self.op(Op::Mul, big, big, Src::C(TWO_32))?;
        self.op(Op::Sub, big, x, Src::R(big))?;
        self.op(Op::Sub, big, big, Src::C(TWO_31))?;
        self.a.vcvttps2dq(y(big), y(big))?;
        self.op(Op::Xor, big, big, Src::C(INDEFINITE))?;
        self.a.vcvttps2dq(y(small), y(x))?;
        self.cmp(Mask(top.0), x, Src::C(TWO_63), 0x1D)?; // GE_OQ: false on NaN
                                                         // (x is not read after this: d may be x.)
        let l = self.t.vector(self.a, INDEFINITE);
        self.a.vpcmpeqd(y(d), y(small), ymmword_ptr(l))?;
        self.blend(d, Mask(d.0), small, big)?;
        self.op(Op::Or, d, d, Src::R(top))
    }

    /// `d` = the i8, u8 or bool (`ty`) bytes at `at`, one a lane: i8 sign-extended, u8
    /// zero-extended, bool as a vector mask (true where the byte is not 0). With `step`
    /// 0 the one byte at `at` in every lane (`g[0]` is clobbered); with `step` 1 the
    /// consecutive bytes, where a tail `(mask, n)` reads only the first `n` (on sixteen
    /// lanes under the opmask, which suppresses faults on the lanes it leaves out; on
    /// eight, as pieces of 4, 2 and 1 bytes gathered in `g[0]` through `g[1]`), the
    /// other lanes 0.
    pub fn load_bytes(
        &mut self,
        ty: S,
        d: V,
        at: AsmMemoryOperand,
        step: i64,
        tail: Option<(Mask, u64)>,
        g: [AsmRegister64; 2],
    ) -> R<()> {
        let signed = ty == S::I8;
        match (tail, self.wide) {
            _ if step == 0 => self.broadcast_byte(ty, d, at, g[0])?,
            (None, true) => extend_bytes(&mut self.a, signed, z(d), at)?,
            (Some((m, _)), true) => extend_bytes(&mut self.a, signed, zk(d, m).z(), at)?,
            (None, false) => extend_bytes(&mut self.a, signed, y(d), at)?,
            (Some((_, n)), false) => {
                let [acc, piece] = g;
                let acc32 = gpr32_of(acc)?;
                let piece32 = gpr32_of(piece)?;
                self.a.xor(acc32, acc32)?;
                let mut o = 0i32;
                for size in [4u64, 2, 1] {
                    if (n - o as u64) < size {
                        continue;
                    }
                    match size {
                        4 => self.a.mov(piece32, dword_ptr(at + o))?,
                        2 => self.a.movzx(piece32, word_ptr(at + o))?,
                        _ => self.a.movzx(piece32, byte_ptr(at + o))?,
                    }
                    if o > 0 {
                        self.a.shl(piece, 8 * o)?;
                    }
                    self.a.or(acc, piece)?;
                    o += size as i32;
                }
                let x = xmm(d)?;
                self.a.vmovq(x, acc)?;
                extend_bytes(&mut self.a, signed, y(d), x)?
            }
        }
        if ty == S::Bool {
            self.nonzero(d, d)?;
        }
        Ok(())
    }

    /// `d` = the 32-bit elements at `base + 4·idx[i]` for lanes `i` (`idx`: element
    /// offsets in i32 lanes), by `vgatherdps`; a tail mask reads only its lanes, the
    /// others are 0. `m`: scratch on eight lanes (the gather's mask); on sixteen, opmask
    /// `k7` is clobbered.
    pub fn gather_at(&mut self, d: V, base: AsmRegister64, idx: V, tail: Option<Mask>, m: V) -> R<()> {
        if self.wide {
            self.a.vpxord(z(d), z(d), z(d))?;
            match tail {
                None => self.a.kxnorw(k7, k0, k0)?,
                Some(tm) => self.a.kmovw(k7, kreg(tm))?,
            }
            self.a.vgatherdps(z(d).k7(), ptr(base + z(idx) * 4))?;
        } else {
            self.a.vpxor(y(d), y(d), y(d))?;
            match tail {
                None => self.a.vpcmpeqd(y(m), y(m), y(m))?,
                Some(tm) => self.a.vmovaps(y(m), y(V(tm.0)))?,
            }
            self.a.vgatherdps_3(y(d), ptr(base + y(idx) * 4), y(m))?;
        }
        Ok(())
    }

    /// `d` = `r8 + i` in lane `i` (a position along the row); `d` only.
    pub fn positions(&mut self, d: V) -> R<()> {
        let iota: Vec<u32> = (0..self.lanes() as u32).collect();
        let l = self.t.words(self.a, &iota);
        if self.wide {
            // (From the general register: zmm16–31 have no VEX-encodable xmm half.)
            self.a.vpbroadcastd(z(d), r8d)?;
            self.a.vpaddd(z(d), z(d), zmmword_ptr(l))?;
        } else {
            let x = xmm(d)?;
            self.a.vmovd(x, r8d)?;
            self.a.vpbroadcastd(y(d), x)?;
            self.a.vpaddd(y(d), y(d), ymmword_ptr(l))?;
        }
        Ok(())
    }

    /// `d` = the 32-bit integer at `at` in every lane.
    pub fn broadcast_dword(&mut self, d: V, at: AsmMemoryOperand) -> R<()> {
        at_width!(self, vpbroadcastd(d; dword_ptr(at)));
        Ok(())
    }

    /// `d` = the 32-bit elements at `base + 4·step·i` for lanes `i` (a load that strides
    /// along the row: a transposed operand), by `vgatherdps`; a tail mask reads only its
    /// lanes (a gather reads nothing under a clear mask lane), the others are 0. `t`:
    /// two scratch registers distinct from `d` (the lane offsets, and on eight lanes the
    /// gather's mask, which it clears); on sixteen lanes opmask `k7` is clobbered.
    pub fn gather(&mut self, d: V, base: AsmRegister64, step: i64, tail: Option<Mask>, t: [V; 2]) -> R<()> {
        let lanes = self.lanes() as i64;
        let words: Vec<u32> = (0..lanes).map(|i| (i * step) as i32 as u32).collect();
        if words.iter().zip(0..).any(|(&w, i)| w as i32 as i64 != i * step) {
            return Err(NotHere("a gather stride past 32 bits".into()));
        }
        let l = self.t.words(self.a, &words);
        let [idx, m] = t;
        // The lane offsets from the table, then the gather at them.
        if self.wide {
            self.a.vmovdqu32(z(idx), zmmword_ptr(l))?;
        } else {
            self.a.vmovdqu(y(idx), ymmword_ptr(l))?;
        }
        self.gather_at(d, base, idx, tail, m)
    }

    /// `d` = the i8, u8 or bool (`ty`) at `at` in every lane, extended (bool as u8);
    /// `g` is clobbered.
    fn broadcast_byte(&mut self, ty: S, d: V, at: AsmMemoryOperand, g: AsmRegister64) -> R<()> {
        let g32 = gpr32_of(g)?;
        if ty == S::I8 {
            self.a.movsx(g32, byte_ptr(at))?;
        } else {
            self.a.movzx(g32, byte_ptr(at))?;
        }
        if self.wide {
            self.a.vpbroadcastd(z(d), g32)?;
        } else {
            let x = xmm(d)?;
            self.a.vmovd(x, g32)?;
            self.a.vpbroadcastd(y(d), x)?;
        }
        Ok(())
    }

    /// `d` = i64 operand `s` converted to f32, rounded to nearest even as the
    /// interpreter's `as f32` (eight lanes: AVX2 has no i64 conversion). Per half of
    /// four lanes: the high dwords (signed) and the low ones (unsigned) convert exactly
    /// to f64 (`hi·2³²`, `lo`); their sum `s` rounds once, and Fast2Sum gives its error
    /// `e` exactly (`|hi·2³²| ≥ lo` wherever `hi ≠ 0`). Rounding `s` to odd — where
    /// `e ≠ 0` and `s`'s last bit is even, one ulp towards `e` — keeps the sticky
    /// information, so the final `vcvtpd2ps` rounds correctly (53 ≥ 24 + 2 bits: no double
    /// rounding; `2⁶⁰ + 2³⁶ + 1` rounds up, not to the tie's even `2⁶⁰`). `t`: six scratch
    /// registers distinct from `d`.
    pub fn i64_to_f32(&mut self, d: V, s: I64Src, tail: Option<Mask>, t: &[V]) -> R<()> {
        if self.wide || t.len() < 6 {
            return Err(NotHere("an i64 conversion on sixteen lanes".into()));
        }
        let [q, t1, t2, t3, t4, t5] = [t[0], t[1], t[2], t[3], t[4], t[5]];
        if [d, q, t1, t2, t3, t4, t5].iter().any(|r| r.0 >= 16) {
            return Err(NotHere("an i64 conversion in a register without an xmm half".into()));
        }
        let x = |v: V| XMM[v.0 as usize];
        let two32 = self.t.words(self.a, &[0, 0x41F0_0000, 0, 0x41F0_0000, 0, 0x41F0_0000, 0, 0x41F0_0000]);
        let one = self.t.words(self.a, &[1, 0, 1, 0, 1, 0, 1, 0]);
        let odd_dwords = self.t.words(self.a, &[1, 3, 5, 7, 1, 3, 5, 7]);
        let even_dwords = self.t.words(self.a, &[0, 2, 4, 6, 0, 2, 4, 6]);
        for h in 0..2 {
            self.load_i64_half(q, s, h, tail, t1)?;
            // hi·2³² and lo as f64, exactly.
            self.a.vmovdqu(y(t2), ymmword_ptr(odd_dwords))?;
            self.a.vpermd(y(t1), y(t2), y(q))?;
            self.a.vcvtdq2pd(y(t1), x(t1))?;
            self.a.vmulpd(y(t1), y(t1), ymmword_ptr(two32))?;
            self.a.vmovdqu(y(t2), ymmword_ptr(even_dwords))?;
            self.a.vpermd(y(t2), y(t2), y(q))?;
            self.a.vcvtdq2pd(y(t2), x(t2))?;
            self.a.vxorpd(y(t5), y(t5), y(t5))?;
            self.a.vcmppd(y(t3), y(t2), y(t5), 0x11)?; // lo read as negative: + 2³²
            self.a.vandpd(y(t3), y(t3), ymmword_ptr(two32))?;
            self.a.vaddpd(y(t2), y(t2), y(t3))?;
            // s = hi + lo rounded; e = the exact remainder (Fast2Sum).
            self.a.vaddpd(y(t3), y(t1), y(t2))?;
            self.a.vsubpd(y(t4), y(t3), y(t1))?;
            self.a.vsubpd(y(t4), y(t2), y(t4))?;
            // Round to odd: where e ≠ 0 and s is even, s ± 1 ulp towards e.
            self.a.vcmppd(y(t1), y(t4), y(t5), 0x0C)?; // NEQ_OQ
            self.a.vpxor(y(t2), y(t4), y(t3))?;
            self.a.vpcmpgtq(y(t2), y(t5), y(t2))?; // signs differ: −1
            self.a.vpor(y(t2), y(t2), ymmword_ptr(one))?; // −1 or +1
            self.a.vpand(y(t4), y(t3), ymmword_ptr(one))?;
            self.a.vpcmpeqq(y(t4), y(t4), y(t5))?; // s even
            self.a.vpand(y(t4), y(t4), y(t1))?;
            self.a.vpand(y(t2), y(t2), y(t4))?;
            self.a.vpaddq(y(t3), y(t3), y(t2))?;
            let half = if h == 0 { d } else { t1 };
            self.a.vcvtpd2ps(x(half), y(t3))?;
        }
        self.a.vinsertf128(y(d), y(d), x(t1), 1)?;
        Ok(())
    }

    /// `d = round(x)` by `vroundps`/`vrndscaleps` mode `imm` (8 nearest even, 9 floor,
    /// 10 ceil, 11 trunc; exceptions suppressed).
    pub(crate) fn round(&mut self, d: V, x: V, imm: i32) -> R<()> {
        if self.wide {
            self.a.vrndscaleps(z(d), z(x), imm)?;
        } else {
            self.a.vroundps(y(d), y(x), imm)?;
        }
        Ok(())
    }

    /// Writes operation node `e` of `k` (one [`op_form`] accepts; not an i64 comparison,
    /// which reads memory: [`Vx::cmp_i64`]) into `d`, from its operands' registers `ops`
    /// in operand order; `t` holds [`op_scratch`] registers distinct from them and `d`.
    /// `d` may be an operand's register.
    pub fn node_op(&mut self, k: &Kernel, e: ExprId, d: V, ops: &[V], t: &[V]) -> R<()> {
        use BinaryOp as B;
        let node = k.node(e);
        let arg = |i: usize| ops.get(i).copied().ok_or_else(|| NotHere("an operand without a register".into()));
        let arg_t = |t: &[V]| t.first().copied().ok_or_else(|| NotHere("a cast without its scratch register".into()));
        match &node.expr {
            Expr::Unary(op, a) => {
                let x = arg(0)?;
                match (op, k.node(*a).ty) {
                    (UnaryOp::Floor, S::F32) => self.round(d, x, 9),
                    (UnaryOp::Ceil, S::F32) => self.round(d, x, 10),
                    (UnaryOp::Round, S::F32) => self.round(d, x, 8),
                    (UnaryOp::Trunc, S::F32) => self.round(d, x, 11),
                    (UnaryOp::IsNan, S::F32) => self.cmp_vector(d, x, Src::R(x), 3),
                    (op, S::F32) => self.unary(*op, d, x, t),
                    (UnaryOp::Not, ty) => {
                        self.not(d, x)?;
                        if ty == S::U8 {
                            self.wrap8(ty, d, d)?;
                        }
                        Ok(())
                    }
                    (UnaryOp::Neg, ty) => {
                        self.op(Op::Xor, t[0], t[0], Src::R(t[0]))?;
                        self.int3(B::Sub, true, d, t[0], x)?;
                        if byte_type(ty) {
                            self.wrap8(ty, d, d)?;
                        }
                        Ok(())
                    }
                    (UnaryOp::Abs, ty @ (S::I32 | S::I8)) => {
                        at_width!(self, vpabsd(d, x));
                        if ty == S::I8 {
                            // |−128| = 128 wraps to −128.
                            self.wrap8(ty, d, d)?;
                        }
                        Ok(())
                    }
                    (UnaryOp::Abs, _) => self.mov(d, Src::R(x)),
                    (op, t) => Err(NotHere(format!("vector {} of {t}", op.name()))),
                }
            }
            Expr::Binary(op, a, b) => {
                let (x, yv) = (arg(0)?, arg(1)?);
                match k.node(*a).ty {
                    S::F32 => match op {
                        B::Div if exact_reciprocal(k, *b).is_some() => {
                            self.op(Op::Mul, d, x, Src::C(exact_reciprocal(k, *b).unwrap_or(0)))
                        }
                        B::Max | B::Min => self.max_min(*op == B::Max, d, x, yv, [t[0], t[1]]),
                        op if op.is_comparison() => self.cmp_vector(d, x, Src::R(yv), float_pred(*op)),
                        B::Add => self.op(Op::Add, d, x, Src::R(yv)),
                        B::Sub => self.op(Op::Sub, d, x, Src::R(yv)),
                        B::Mul => self.op(Op::Mul, d, x, Src::R(yv)),
                        B::Div => self.op(Op::Div, d, x, Src::R(yv)),
                        B::Pow if t.len() >= POW_SCRATCH => {
                            self.pow(d, x, yv, [t[0], t[1], t[2], t[3], t[4], t[5], t[6]])
                        }
                        _ => Err(NotHere(format!("vector {} of f32", op.name()))),
                    },
                    S::Bool => match op {
                        B::And => self.op(Op::And, d, x, Src::R(yv)),
                        B::Or => self.op(Op::Or, d, x, Src::R(yv)),
                        B::Xor | B::Ne => self.op(Op::Xor, d, x, Src::R(yv)),
                        B::Eq => {
                            self.op(Op::Xor, d, x, Src::R(yv))?;
                            self.not(d, d)
                        }
                        _ => Err(NotHere(format!("vector {} of bool", op.name()))),
                    },
                    ty @ (S::I32 | S::U32) => {
                        let signed = ty == S::I32;
                        if op.is_comparison() {
                            self.int_compare(*op, signed, d, x, yv, t)
                        } else {
                            self.int3(*op, signed, d, x, yv)
                        }
                    }
                    // Extended bytes order as signed 32-bit lanes, both i8 and u8.
                    ty @ (S::I8 | S::U8) => {
                        if op.is_comparison() {
                            self.int_compare(*op, true, d, x, yv, t)
                        } else {
                            self.int3(*op, true, d, x, yv)?;
                            if matches!(op, B::Add | B::Sub | B::Mul) {
                                self.wrap8(ty, d, d)?;
                            }
                            Ok(())
                        }
                    }
                    ty => Err(NotHere(format!("vector {} of {ty}", op.name()))),
                }
            }
            Expr::Select(..) => self.select(d, arg(0)?, arg(1)?, arg(2)?),
            Expr::Cast { value, to, .. } => {
                let x = arg(0)?;
                match (k.node(*value).ty, S::of_storage(*to)) {
                    (S::Bool, S::F32) => self.op(Op::And, d, x, Src::C(1f32.to_bits())),
                    (S::Bool, S::I32 | S::U32) => {
                        at_width!(self, vpsrld(d, x; 31));
                        Ok(())
                    }
                    (S::F32, S::Bool) => self.cmp_vector(d, x, Src::C(0), 0x04),
                    (S::F32, to @ (S::I8 | S::U8)) => {
                        let t0 = arg_t(t)?;
                        self.f32_to_8bit(to, d, x, t0, K_CMP)
                    }
                    (S::F32, S::I32 | S::U32) if !self.wide => match t {
                        [t0, t1, t2, ..] => self.f32_to_i32(d, x, [*t0, *t1, *t2]),
                        _ => Err(NotHere("a conversion to i32 without its scratch registers".into())),
                    },
                    (S::I8 | S::U8, S::F32) => {
                        at_width!(self, vcvtdq2ps(d, x));
                        Ok(())
                    }
                    // To a byte from a wider integer or the other byte type: wrapped.
                    (from, to @ (S::I8 | S::U8)) if from != to && from != S::Bool => self.wrap8(to, d, x),
                    (S::Bool, S::I8 | S::U8) => {
                        at_width!(self, vpsrld(d, x; 31));
                        Ok(())
                    }
                    (S::I32 | S::U32 | S::I8 | S::U8, S::Bool) => self.nonzero(d, x),
                    (S::I32, S::F32) => {
                        at_width!(self, vcvtdq2ps(d, x));
                        Ok(())
                    }
                    (S::U32, S::F32) if self.wide => {
                        self.a.vcvtudq2ps(z(d), z(x))?;
                        Ok(())
                    }
                    // Same bits: f32 to f32, bool to bool, between i32 and u32.
                    (from, to) if from == to || (from != S::F32 && to != S::F32 && from != S::Bool) => {
                        self.mov(d, Src::R(x))
                    }
                    (from, to) => Err(NotHere(format!("a vector cast of {from} to {to}"))),
                }
            }
            _ => Err(NotHere("a vector operation that is not one".into())),
        }
    }
}

/// The 32-bit half of a general register.
fn gpr32_of(r: AsmRegister64) -> R<AsmRegister32> {
    const PAIRS: [(AsmRegister64, AsmRegister32); 16] = [
        (rax, eax),
        (rcx, ecx),
        (rdx, edx),
        (rbx, ebx),
        (rsp, esp),
        (rbp, ebp),
        (rsi, esi),
        (rdi, edi),
        (r8, r8d),
        (r9, r9d),
        (r10, r10d),
        (r11, r11d),
        (r12, r12d),
        (r13, r13d),
        (r14, r14d),
        (r15, r15d),
    ];
    PAIRS.iter().find(|p| p.0 == r).map(|p| p.1).ok_or_else(|| NotHere("a general register".into()))
}

/// The `ymm` half of vector register `v` (0–31; 16–31 EVEX only).
fn y32(v: V) -> AsmRegisterYmm {
    const Y: [AsmRegisterYmm; 32] = [
        ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14, ymm15, ymm16,
        ymm17, ymm18, ymm19, ymm20, ymm21, ymm22, ymm23, ymm24, ymm25, ymm26, ymm27, ymm28, ymm29, ymm30, ymm31,
    ];
    Y[v.0 as usize]
}

/// The `xmm` half of vector register `v` (VEX-encodable: `v` below 16).
fn xmm(v: V) -> R<AsmRegisterXmm> {
    XMM.get(v.0 as usize).copied().ok_or_else(|| NotHere("a register without a VEX xmm half".into()))
}

/// `vpmovsxbd` (signed) or `vpmovzxbd` of `src` into `dst`, at whatever width and
/// masking `dst` has: each byte of `src` extended to a 32-bit lane.
fn extend_bytes<D, F>(a: &mut CodeAssembler, signed: bool, dst: D, src: F) -> Result<(), IcedError>
where
    CodeAssembler: asm_traits::CodeAsmVpmovsxbd<D, F> + asm_traits::CodeAsmVpmovzxbd<D, F>,
{
    if signed {
        a.vpmovsxbd(dst, src)
    } else {
        a.vpmovzxbd(dst, src)
    }
}
