//! Storage precision: the f32 tensors a program stores, narrowed to f16 or bf16, with
//! every kernel still computing in f32 (`kiln compile --precision f16|bf16`).
//!
//! The pass ([`narrow_storage`], the pipeline's `flow-narrow-storage`) changes types
//! only, never an expression. A kernel's load of an f16 or bf16 tensor already yields
//! the exact value widened to f32 ([`crate::kernel::ScalarType::of_storage`]) and its
//! store already rounds an f32 root to nearest even when the output is half (see
//! [`crate::kernel`]'s *Types*), so retyping a buffer and the kernel bindings that read
//! or write it is the whole transformation:
//!
//! - **storage is half**: every f32 constant (weights: half the bytes in the artifact)
//!   and every f32 dispatch result in the arena becomes the half type;
//! - **arithmetic is f32**: a kernel's expression is untouched, so its loads widen to
//!   f32, every operation, sum, maximum, and contraction accumulates in f32, and only
//!   the final store rounds. A contraction's operands are then half and its
//!   accumulator f32 (what `mma … .f32.f16.f16.f32` computes); LayerNorm's and
//!   Softmax's statistics are f32 sums of widened values;
//! - **the API stays f32**: graph inputs are not narrowed (the first kernels that read
//!   them read f32), and the storage of every graph output stays f32 (the kernels that
//!   write outputs write f32). No conversion kernels are added.
//!
//! It runs after dispatch formation, so a value that fusion keeps in a kernel's
//! registers (a matrix product's sum before its bias and activation, a LayerNorm's
//! mean) is never rounded to half: only what is stored is. Integer, bool and f64
//! tensors, and tensors already narrower than f32, are left as they are.
//!
//! ## What stays f32
//!
//! Narrowing must not turn a finite value into an infinity, nor an index into another
//! index. So a buffer (with its aliases) keeps f32 storage when
//! - it is (the storage of) a graph output ([`Kept::Output`]);
//! - it is a constant with a finite element that rounds to ±∞ in the half type: |x| ≥
//!   65520 for f16 (an attention mask of −1e4 narrows, −1e9 does not), |x| above
//!   bf16's largest finite 3.3895e38 rounded (`f32::MIN`, −3.4028e38, which exporters
//!   write as "minus infinity" for masks, rounds to −∞ in bf16 too) ([`Kept::Range`]);
//! - it is a dispatch result whose value may carry such a magnitude: its root reaches,
//!   through operations that pass a magnitude on (`+ − ×`, the numerator of `÷`,
//!   min/max, select, neg/abs/sqrt/rounding, casts, sums and maxima), a literal or pad
//!   value that overflows the half type, or a load of a constant of any dtype with such
//!   an element, or of a result that carries one (outputs included). A
//!   transcendental (`exp`, `tanh`, `erf`, `log`, …) or a comparison ends the chain:
//!   `exp(−1e9 − max)` is 0 in any type. So `scores + mask` with a −1e9 mask stays f32
//!   and the Softmax after it, whose result is in `[0, 1]`, is half ([`Kept::Range`]);
//! - it is a constant whose every nonzero element is below the half type's smallest
//!   normal (f16: 6.1e-5), where half would keep fewer bits than its usual 11
//!   ([`Kept::Tiny`]; a tiny per-tensor scale, not a weight tensor with some small
//!   elements, whose absolute error stays small);
//! - some kernel uses a value loaded from it to compute an index (a gather at
//!   float-computed positions), where rounding would move the read ([`Kept::Index`]);
//! - an attention kernel reads or writes it, where the target's attention emitter
//!   reads and writes f32 ([`Kept::Attention`]: Q, Kᵀ, V, the mask and the result; the
//!   CPU's). On the CUDA target ([`narrow_storage_for`] with `half_attention`) they
//!   narrow like any other buffer: the attention kernel then reads half Q, K and V
//!   (and mask, where it fits) and stores a half result, as the three kernels it
//!   replaces store their intermediates, so the product after it (the output
//!   projection) reads a half operand and takes the tensor cores.
//!
//! Values that overflow only at run time (a logit above 65504 in f16) become ±∞ as
//! f16 arithmetic would make them; bf16 keeps f32's range. The stated tolerances of
//! each model are in `docs/precision.md`.

use kiln_ir::lowp::{round_binary, BF16_MAX};
use kiln_ir::{DType, Tensor};

use crate::kernel::{BinaryOp, Bounds, Expr, Kernel, ReduceOp, ScalarType, UnaryOp};
use crate::program::{BufferId, BufferKind, FlowProgram};

/// The storage type of a program's f32 tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// f32 storage and f32 arithmetic (the pass does nothing).
    #[default]
    F32,
    /// IEEE binary16 storage (11-bit significand, largest finite 65504), f32 arithmetic.
    F16,
    /// bfloat16 storage (8-bit significand, f32's exponent range), f32 arithmetic.
    BF16,
}

impl Precision {
    /// Every precision, in the order the command line lists them.
    pub const ALL: [Precision; 3] = [Precision::F32, Precision::F16, Precision::BF16];

    /// Its name on the command line (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::BF16 => "bf16",
        }
    }

    /// The precision called `name`.
    pub fn from_name(name: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.name() == name)
    }

    /// The dtype f32 tensors are stored in (`None`: f32, nothing narrows).
    pub fn storage(self) -> Option<DType> {
        match self {
            Precision::F32 => None,
            Precision::F16 => Some(DType::F16),
            Precision::BF16 => Some(DType::BF16),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Whether a load of a tensor stored as `d` is an f32 value that a code generator may
/// treat as one: f32 itself, or f16/bf16, widened exactly. (The storage types a
/// contraction's or a window's float operands may have.)
pub fn loads_as_f32(d: DType) -> bool {
    matches!(d, DType::F32 | DType::F16 | DType::BF16)
}

/// Why a buffer kept f32 storage (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kept {
    /// It is (the storage of) a graph output.
    Output,
    /// It holds, or may carry, a finite value that overflows the half type.
    Range,
    /// A constant whose every nonzero element is below the half type's smallest normal.
    Tiny,
    /// A kernel computes an index from its values.
    Index,
    /// An attention kernel reads or writes it on a target whose attention emitter reads
    /// and writes f32 (`crate::attention`: the CPU's).
    Attention,
    /// A scatter kernel updates it (`crate::kernel`'s scatter kernels store plain types:
    /// no rounding between the updates of one element).
    Scatter,
}

/// What [`narrow_storage`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Narrowed {
    /// Storage buffers (constants and dispatch results) narrowed.
    pub narrowed: usize,
    /// Storage buffers that were f32 constants or results and stay f32, and why.
    pub kept: Vec<(BufferId, Kept)>,
}

/// The half format's rounding: `(significand bits, minimum normal exponent, largest
/// finite value)`, the arguments of [`round_binary`] (what the kernel interpreter's
/// store does).
fn format(half: DType) -> (i32, i32, f64) {
    if half == DType::F16 {
        (11, -14, 65504.0)
    } else {
        (8, -126, BF16_MAX)
    }
}

/// Whether the finite `x` becomes ±∞ in `half`.
fn overflows(half: DType, x: f64) -> bool {
    let (p, emin, max) = format(half);
    x.is_finite() && round_binary(x, p, emin, max).is_infinite()
}

/// Narrows the storage of `p`'s f32 tensors to `precision` (see the module docs), an
/// attention kernel's operands and result kept f32 (the CPU target's rule).
/// Nothing changes at [`Precision::F32`].
pub fn narrow_storage(p: &mut FlowProgram, precision: Precision) -> Narrowed {
    narrow_storage_for(p, precision, false)
}

/// [`narrow_storage`], with an attention kernel's operands and result narrowed like
/// any other buffer where `half_attention` holds (the CUDA target, whose attention
/// emitters read and write f16 and bf16).
pub fn narrow_storage_for(p: &mut FlowProgram, precision: Precision, half_attention: bool) -> Narrowed {
    let Some(half) = precision.storage() else { return Narrowed::default() };
    let n = p.buffers.len();
    let candidate: Vec<bool> = (0..n)
        .map(|i| {
            let b = &p.buffers[i];
            b.ty.dtype == DType::F32 && matches!(b.kind, BufferKind::Const(_) | BufferKind::Result)
        })
        .collect();
    let mut kept: Vec<Option<Kept>> = vec![None; n];
    let keep = |kept: &mut Vec<Option<Kept>>, b: BufferId, why: Kept| {
        if candidate[b.index()] && kept[b.index()].is_none() {
            kept[b.index()] = Some(why);
        }
    };
    for &o in &p.outputs {
        keep(&mut kept, p.storage(o), Kept::Output);
    }
    // Per storage buffer, whether it holds or may carry a finite value that overflows
    // the half type: constants of any dtype (an i64 or f64 mask converted in a kernel
    // counts too), then results in dispatch order, so every producer's range is known
    // before its readers'. (Tracked apart from `kept`: an output that carries a mask
    // passes it on to its readers too.)
    let mut range = vec![false; n];
    for (i, b) in p.buffers.iter().enumerate() {
        if let BufferKind::Const(t) = &b.kind {
            range[i] = t.dtype() != DType::Bool && t.to_f64_vec().iter().any(|&x| overflows(half, x));
        }
    }
    for d in &p.dispatches {
        let wide_input = |i: u32| d.operands.get(i as usize).is_some_and(|&o| range[p.storage(o).index()]);
        if carries_range(&d.kernel, half, &wide_input) {
            range[p.storage(d.result).index()] = true;
        }
    }
    for (i, b) in p.buffers.iter().enumerate() {
        if range[i] {
            keep(&mut kept, BufferId(i as u32), Kept::Range);
        } else if let (true, BufferKind::Const(t)) = (candidate[i], &b.kind) {
            if tiny(half, t) {
                keep(&mut kept, BufferId(i as u32), Kept::Tiny);
            }
        }
    }
    for d in &p.dispatches {
        for input in index_inputs(&d.kernel) {
            if let Some(&o) = d.operands.get(input as usize) {
                keep(&mut kept, p.storage(o), Kept::Index);
            }
        }
    }
    for d in p.dispatches.iter().filter(|d| !half_attention && d.class == crate::class::KernelClass::Attention) {
        for &o in d.operands.iter().chain([&d.result]) {
            keep(&mut kept, p.storage(o), Kept::Attention);
        }
    }
    for d in p.dispatches.iter().filter(|d| d.kernel.scatter.is_some()) {
        for &o in d.operands.first().into_iter().chain([&d.result]) {
            keep(&mut kept, p.storage(o), Kept::Scatter);
        }
    }
    let narrow: Vec<bool> = (0..n).map(|i| candidate[i] && kept[i].is_none()).collect();
    let narrowed = narrow.iter().filter(|&&x| x).count();
    if narrowed == 0 {
        return Narrowed { narrowed, kept: report(&kept) };
    }
    let narrowed_storage: Vec<bool> = (0..n).map(|i| narrow[p.storage(BufferId(i as u32)).index()]).collect();
    for (i, b) in p.buffers.iter_mut().enumerate() {
        if !narrowed_storage[i] {
            continue;
        }
        b.ty.dtype = half;
        if let BufferKind::Const(t) = &b.kind {
            // Rounded once, to nearest even (every f32 is exact in f64); finite values
            // stay finite (constants that would not are kept above).
            let v = t.to_f64_vec();
            if let Ok(h) = Tensor::from_f64(half, t.shape().clone(), &v) {
                b.kind = BufferKind::Const(h);
            }
        }
    }
    for d in &mut p.dispatches {
        for (j, &o) in d.operands.iter().enumerate() {
            if narrowed_storage[o.index()] {
                if let Some(t) = d.kernel.inputs.get_mut(j) {
                    t.dtype = half;
                }
            }
        }
        if narrowed_storage[d.result.index()] {
            d.kernel.output.dtype = half;
        }
    }
    p.classify();
    Narrowed { narrowed, kept: report(&kept) }
}

fn report(kept: &[Option<Kept>]) -> Vec<(BufferId, Kept)> {
    kept.iter().enumerate().filter_map(|(i, k)| k.map(|k| (BufferId(i as u32), k))).collect()
}

/// Whether every nonzero finite element of the constant `t` is below `half`'s smallest
/// normal (and some element is nonzero).
fn tiny(half: DType, t: &Tensor) -> bool {
    let (_, emin, _) = format(half);
    let min_normal = 2f64.powi(emin);
    let largest = t.to_f64_vec().iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
    largest > 0.0 && largest < min_normal
}

/// The inputs of `k` that some load's index is computed from (a value read from them
/// decides where another load reads).
fn index_inputs(k: &Kernel) -> Vec<u32> {
    // Backwards over the arena (operands precede users): a node feeds an index when it
    // is one, or is an operand of a node that feeds one.
    let mut feeds = vec![false; k.nodes.len()];
    for i in (0..k.nodes.len()).rev() {
        let expr = &k.nodes[i].expr;
        let all = feeds[i] || matches!(expr, Expr::Load { .. });
        if all {
            expr.for_each_operand(|o| {
                if let Some(f) = feeds.get_mut(o.index()) {
                    *f = true;
                }
            });
        }
    }
    let mut inputs: Vec<u32> = k
        .nodes
        .iter()
        .zip(&feeds)
        .filter_map(|(n, &f)| match n.expr {
            Expr::Load { input, .. } if f => Some(input),
            _ => None,
        })
        .collect();
    inputs.sort_unstable();
    inputs.dedup();
    inputs
}

/// Whether the value `k` stores may carry a magnitude that overflows `half`: its root
/// reaches an overflowing literal or pad value, or a load of an input for which
/// `wide_input` holds, through operations that pass a magnitude on (module docs).
fn carries_range(k: &Kernel, half: DType, wide_input: &dyn Fn(u32) -> bool) -> bool {
    let big = |ty: ScalarType, bits: u64| -> bool {
        match ty {
            ScalarType::F32 => overflows(half, f32::from_bits(bits as u32) as f64),
            ScalarType::F64 => overflows(half, f64::from_bits(bits)),
            // An integer literal converted to float later (a mask built in i64).
            t if t != ScalarType::Bool => overflows(half, t.to_i128(bits) as f64),
            _ => false,
        }
    };
    let mut wide = vec![false; k.nodes.len()];
    for (i, n) in k.nodes.iter().enumerate() {
        let w = |e: crate::ExprId| wide.get(e.index()).copied().unwrap_or(true);
        wide[i] = match &n.expr {
            Expr::Var(_) => false,
            Expr::Const(bits) => big(n.ty, *bits),
            Expr::Load { input, bounds, .. } => {
                wide_input(*input) || matches!(bounds, Bounds::Pad(bits) if big(n.ty, *bits))
            }
            Expr::Unary(op, a) => match op {
                UnaryOp::Neg
                | UnaryOp::Abs
                | UnaryOp::Sqrt
                | UnaryOp::Floor
                | UnaryOp::Ceil
                | UnaryOp::Round
                | UnaryOp::Trunc => w(*a),
                // Bounded (or ±∞ in f32 already), or not a number at all.
                _ => false,
            },
            Expr::Binary(op, a, b) => match op {
                BinaryOp::Div => w(*a),
                BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge => false,
                _ => w(*a) || w(*b),
            },
            Expr::Select(_, a, b) => w(*a) || w(*b),
            Expr::Cast { value, to, .. } => *to != DType::Bool && w(*value),
            Expr::Reduce { op, body, .. } => {
                !matches!(op, ReduceOp::ArgMax { .. } | ReduceOp::ArgMin { .. }) && w(*body)
            }
        };
    }
    wide.get(k.root.index()).copied().unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::interpret;
    use crate::text::parse_program;
    use kiln_ir::Shape;

    /// `h = x·w` (stored, and viewed flat by an alias), `y = exp(flat)` (an output),
    /// `t = tanh(h)` (stored), `z = relu(t[i])` (an output).
    const PROGRAM: &str = r#"flow @t(%0, %1) {
  %0: f32[2,4] = input 0 "x"
  %1: i64[2] = input 1 "i"
  %2: f32[4,4] = const [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6] "w"
  %3: f32[2,4] = result "h"
  %4: f32[8] = alias %3 "flat"
  %5: f32[8] = result "y"
  %6: f32[2,4] = result "t"
  %7: f32[2,4] = result "z"
  %3 = dispatch(%0, %2) class contraction sources ["MatMul m"]
    kernel @k0(%0: f32[2,4], %1: f32[4,4]) -> f32[2,4] {
      vars v0<2 v1<4 v2<4
      e0: i64 = v0
      e1: i64 = v1
      e2: i64 = v2
      e3: f32 = load %0[e0, e2]
      e4: f32 = load %1[e2, e1]
      e5: f32 = mul e3, e4
      e6: f32 = reduce.sum [v2] e5
      yield e6
    }
  %5 = dispatch(%4) class elementwise sources ["Exp e"]
    kernel @k1(%0: f32[8]) -> f32[8] {
      vars v0<8
      e0: i64 = v0
      e1: f32 = load %0[e0]
      e2: f32 = exp e1
      yield e2
    }
  %6 = dispatch(%3) class elementwise sources ["Tanh t"]
    kernel @k2(%0: f32[2,4]) -> f32[2,4] {
      vars v0<2 v1<4
      e0: i64 = v0
      e1: i64 = v1
      e2: f32 = load %0[e0, e1]
      e3: f32 = tanh e2
      yield e3
    }
  %7 = dispatch(%6, %1) class general sources ["Gather g", "Relu r"]
    kernel @k3(%0: f32[2,4], %1: i64[2]) -> f32[2,4] {
      vars v0<2 v1<4
      e0: i64 = v0
      e1: i64 = v1
      e2: i64 = load %1[e0]
      e3: f32 = load %0[e2, e1] clamp
      e4: f32 = 0.0
      e5: bool = lt e3, e4
      e6: f32 = select e5, e4, e3
      yield e6
    }
  return %5, %7
}
"#;

    fn inputs() -> Vec<Tensor> {
        let x: Vec<f64> = (0..8).map(|i| (i as f64 - 3.5) / 3.0).collect();
        vec![
            Tensor::from_f64(DType::F32, Shape::new(vec![2, 4]).unwrap(), &x).unwrap(),
            Tensor::from_i64(DType::I64, Shape::new(vec![2]).unwrap(), &[1, 0]).unwrap(),
        ]
    }

    fn dtypes(p: &FlowProgram) -> Vec<DType> {
        p.buffers.iter().map(|b| b.ty.dtype).collect()
    }

    #[test]
    fn f32_changes_nothing() {
        let mut p = parse_program(PROGRAM).unwrap();
        let before = p.clone();
        assert_eq!(narrow_storage(&mut p, Precision::F32), Narrowed::default());
        assert_eq!(p, before);
    }

    #[test]
    fn storage_narrows_the_api_and_the_arithmetic_stay_f32() {
        for precision in [Precision::F16, Precision::BF16] {
            let mut p = parse_program(PROGRAM).unwrap();
            let f32_program = p.clone();
            let r = narrow_storage(&mut p, precision);
            let h = precision.storage().unwrap();
            let (f, i) = (DType::F32, DType::I64);
            // The weight, `h` and its alias, `t` narrow; inputs and outputs do not.
            assert_eq!(dtypes(&p), [f, i, h, h, h, f, h, f], "{precision}");
            assert_eq!(r.narrowed, 3, "{precision}");
            assert_eq!(r.kept, [(BufferId(5), Kept::Output), (BufferId(7), Kept::Output)], "{precision}");
            for (d, d32) in p.dispatches.iter().zip(&f32_program.dispatches) {
                d.kernel.verify().unwrap_or_else(|e| panic!("{precision}: {}: {e}", d.kernel.name));
                // Types only: the arithmetic is the f32 program's.
                assert_eq!(d.kernel.nodes, d32.kernel.nodes);
                assert_eq!(d.class, d32.class, "{precision}: {}", d.kernel.name);
                for (t, &o) in d.kernel.inputs.iter().zip(&d.operands) {
                    assert_eq!(t, &p.buffer(o).ty);
                }
                assert_eq!(d.kernel.output, p.buffer(d.result).ty);
            }
            // The weight's elements are the f32 ones rounded once.
            let (BufferKind::Const(w), BufferKind::Const(w32)) = (&p.buffers[2].kind, &f32_program.buffers[2].kind)
            else {
                panic!("constants")
            };
            let (p_bits, emin, max) = format(h);
            let rounded: Vec<f64> = w32.to_f64_vec().iter().map(|&x| round_binary(x, p_bits, emin, max)).collect();
            assert_eq!(w.to_f64_vec(), rounded);
            // What it computes: the f32 program's values within a few roundings.
            let (a, b) = (interpret(&p, &inputs()).unwrap(), interpret(&f32_program, &inputs()).unwrap());
            let u = 2f64.powi(-p_bits);
            for (x, y) in a.iter().zip(&b) {
                assert_eq!(x.dtype(), DType::F32);
                for (x, y) in x.to_f64_vec().iter().zip(y.to_f64_vec()) {
                    assert!((x - y).abs() <= 8.0 * u * y.abs().max(1.0), "{precision}: {x} vs {y}");
                }
            }
            assert_ne!(a, b, "{precision}: rounding the storage changes some bits");
        }
    }

    /// `pos = x + 2` (f32, stored), then a load of `table` at `i64(pos)`.
    const GATHER_AT_VALUES: &str = r#"flow @g(%0, %1) {
  %0: f32[4] = input 0 "x"
  %1: f32[8] = input 1 "table"
  %2: f32[4] = result "pos"
  %3: f32[4] = result "y"
  %2 = dispatch(%0) class elementwise sources ["Add a"]
    kernel @k0(%0: f32[4]) -> f32[4] {
      vars v0<4
      e0: i64 = v0
      e1: f32 = load %0[e0]
      e2: f32 = 2.0
      e3: f32 = add e1, e2
      yield e3
    }
  %3 = dispatch(%2, %1) class general sources ["Gather g"]
    kernel @k1(%0: f32[4], %1: f32[8]) -> f32[4] {
      vars v0<4
      e0: i64 = v0
      e1: f32 = load %0[e0]
      e2: i64 = cast e1 to i64
      e3: f32 = load %1[e2] clamp
      yield e3
    }
  return %3
}
"#;

    #[test]
    fn a_value_an_index_is_computed_from_keeps_f32() {
        let mut p = parse_program(GATHER_AT_VALUES).unwrap();
        let r = narrow_storage(&mut p, Precision::F16);
        assert_eq!(r.kept, [(BufferId(2), Kept::Index), (BufferId(3), Kept::Output)]);
        assert_eq!(r.narrowed, 0);
        assert_eq!(dtypes(&p), [DType::F32; 4]);
    }

    /// `s = x·2 + mask` (stored), `p = exp(s)` (stored), `y = p + tiny`: the mask's
    /// range passes to `s`, not through `exp` to `p`.
    fn masked(mask: f32, tiny: f32) -> String {
        format!(
            r#"flow @m(%0) {{
  %0: f32[4] = input 0 "x"
  %1: f32[4] = const [0.0, 0.0, {mask:e}, {mask:e}] "mask"
  %2: f32[4] = const [{tiny:e}, 0.0, {tiny:e}, {tiny:e}] "tiny"
  %3: f32[4] = result "s"
  %4: f32[4] = result "p"
  %5: f32[4] = result "y"
  %3 = dispatch(%0, %1) class elementwise sources ["Add a"]
    kernel @k0(%0: f32[4], %1: f32[4]) -> f32[4] {{
      vars v0<4
      e0: i64 = v0
      e1: f32 = load %0[e0]
      e2: f32 = 2.0
      e3: f32 = mul e1, e2
      e4: f32 = load %1[e0]
      e5: f32 = add e3, e4
      yield e5
    }}
  %4 = dispatch(%3) class elementwise sources ["Exp e"]
    kernel @k1(%0: f32[4]) -> f32[4] {{
      vars v0<4
      e0: i64 = v0
      e1: f32 = load %0[e0]
      e2: f32 = exp e1
      yield e2
    }}
  %5 = dispatch(%4, %2) class elementwise sources ["Add b"]
    kernel @k2(%0: f32[4], %1: f32[4]) -> f32[4] {{
      vars v0<4
      e0: i64 = v0
      e1: f32 = load %0[e0]
      e2: f32 = load %1[e0]
      e3: f32 = add e1, e2
      yield e3
    }}
  return %5
}}
"#
        )
    }

    #[test]
    fn an_overflowing_constant_and_what_carries_it_keep_f32() {
        let (f, h, b) = (DType::F32, DType::F16, DType::BF16);
        // f16: −1e9 overflows, 1e-6 is below the smallest normal (6.1e-5).
        let mut p = parse_program(&masked(-1e9, 1e-6)).unwrap();
        let r = narrow_storage(&mut p, Precision::F16);
        assert_eq!(dtypes(&p), [f, f, f, f, h, f]);
        let kept = [(1, Kept::Range), (2, Kept::Tiny), (3, Kept::Range), (5, Kept::Output)];
        assert_eq!(r.kept, kept.map(|(i, k)| (BufferId(i), k)));
        // 65519 rounds to 65504, 65520 to ∞.
        assert!(!overflows(h, 65519.0) && overflows(h, 65520.0) && overflows(h, -65520.0));
        assert!(!overflows(h, f64::NEG_INFINITY));
        // −1e4 fits f16; a largest element of 1e-4 is a normal.
        let mut p = parse_program(&masked(-1e4, 1e-4)).unwrap();
        narrow_storage(&mut p, Precision::F16);
        assert_eq!(dtypes(&p), [f, h, h, h, h, f]);
        // bf16 has f32's exponents: −1e9 and 1e-6 narrow, f32::MIN rounds to −∞.
        let mut p = parse_program(&masked(-1e9, 1e-6)).unwrap();
        narrow_storage(&mut p, Precision::BF16);
        assert_eq!(dtypes(&p), [f, b, b, b, b, f]);
        let mut p = parse_program(&masked(f32::MIN, 1e-6)).unwrap();
        narrow_storage(&mut p, Precision::BF16);
        assert_eq!(dtypes(&p), [f, f, b, f, b, f]);
        assert!(overflows(b, f32::MIN as f64) && !overflows(b, BF16_MAX));
    }

    #[test]
    fn an_overflowing_literal_keeps_its_result_f32() {
        // `s = x·2 + mask` with the mask a literal instead of a load.
        let src = masked(0.0, 0.0).replace("e4: f32 = load %1[e0]", "e4: f32 = -1000000000.0");
        let mut p = parse_program(&src).unwrap();
        narrow_storage(&mut p, Precision::F16);
        let (f, h) = (DType::F32, DType::F16);
        // (The all-zero constants narrow; they are not read as values here.)
        assert_eq!(dtypes(&p), [f, h, h, f, h, f]);
    }

    #[test]
    fn an_output_that_carries_a_mask_passes_it_on() {
        // `s` is an output too, and `p = −s` (not `exp s`) carries the mask.
        let src = masked(-1e9, 0.0).replace("return %5", "return %5, %3").replace("exp e1", "neg e1");
        let mut p = parse_program(&src).unwrap();
        let r = narrow_storage(&mut p, Precision::F16);
        assert!(r.kept.contains(&(BufferId(3), Kept::Output)) && r.kept.contains(&(BufferId(4), Kept::Range)));
        assert_eq!(p.buffers[4].ty.dtype, DType::F32);
    }

    #[test]
    fn names_round_trip() {
        for p in Precision::ALL {
            assert_eq!(Precision::from_name(p.name()), Some(p));
        }
        assert_eq!(Precision::from_name("fp16"), None);
    }
}
