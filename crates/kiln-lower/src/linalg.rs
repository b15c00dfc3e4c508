//! Lowering of the contraction ops: MatMul, Gemm, Einsum, Conv, ConvTranspose, their
//! integer and quantized forms (MatMulInteger, QLinearMatMul, ConvInteger, QLinearConv),
//! and Det.
//!
//! - **Contractions** are one kernel: a `reduce.sum` over the contracted variables of a
//!   product of loads at affine indices. Floats accumulate in their compute type (f32 for
//!   f32 and the narrower floats, f64 for f64), integers in their own width (wrapping).
//!   These kernels are the portable form; a code generator may substitute tuned
//!   microkernels for them.
//! - **Convolutions** read the input at `o·stride − pad_begin + k·dilation`; a window that
//!   can leave the input uses a [`Bounds::Pad`] load (0 for Conv, the zero point for the
//!   integer forms when it is a constant, else an explicit range guard), so padding never
//!   reaches memory. Groups pick the input channel `(m / (M/group))·(C/group) + c`; a
//!   float convolution with several input channels per group instead computes
//!   `[N, group, M/group, …]` with the group as an index of its own (affine channels: a
//!   batch of contractions), which the op's result views as `[N, M, …]`.
//! - **ConvTranspose** is sub-pixel convolution: output `o` takes tap `k` from input `i`
//!   where `o + pad = i·stride + k·dilation`, so writing `o + shift = stride·u + ρ`, each
//!   phase `ρ` of the output is an ordinary stride-1 convolution over the input at `u`
//!   with the taps `k ≡ ρ + pad − shift (mod stride)` of the filter ([`Phases`]). Three
//!   kernels: the phase filters `W'[ρ, m, c, t…]` (a copy of `W`, zero where a phase has
//!   fewer taps; folded at compile time when `W` is a constant), one product
//!   `P[n, ρ, m, u…] = Σ_{c,t} W'·x (+ bias)` over every phase at once — the phase (the
//!   dimensions' phases as one flat axis) a batch index, `x` read at `u + lo + t`
//!   through `Pad` bounds exactly as a Conv, so the padding layout transform and the
//!   contraction recogniser take it like one — and the interleave
//!   `y[n, m, o…] = P[n, ρ(o), m, (o + shift) div s…]`, `ρ(o)` the flat phase of the
//!   digits `(o + shift) mod s`: a pure copy (a table gather on the CPU). No multiply-add is spent on the zeros a zero-inserted input would have
//!   (`stride^r` times the work), and nothing is scattered: the col2im form (a product
//!   into per-input-pixel columns, then a scatter-add) would need a reduction across
//!   overlapping windows, which no fast kernel class holds. The cost is the interleave
//!   (one pass over the result) and, where the kernel extent is not a multiple of the
//!   stride, zero taps in the phases that have fewer (`shift` is chosen for the fewest).
//!   At stride 1 the phases are one and the product is the result: a Conv with the
//!   filter flipped, a contraction or (depthwise) a window.
//! - **Integer forms** subtract the zero points in i32 and accumulate in i32 (exact for the
//!   8-bit operands below 2^15 taps). QLinear forms then rescale as ONNX Runtime does,
//!   in f32 with the reference's operations in its order (`f32(acc) · (s_a·s_b / s_y)`,
//!   round half to even, add the output zero point, saturate), so their results match
//!   both bit for bit. (8-bit float operands rescale in f64.)
//! - **Einsum** parses the equation; output letters are output variables, the other
//!   letters one reduction; a letter repeated within an operand reads a diagonal, an axis
//!   of extent 1 against a larger extent broadcasts.
//! - **Det** is Gaussian elimination with partial pivoting, one step per column: a kernel
//!   computes the trailing submatrix of the next step and another the running
//!   determinant (pivot row by `argmax |a|`, a zero pivot zeroes the rest, so the result is
//!   exactly 0 as in the reference).

use kiln_ir::attrs::{ConvAttrs, ConvTransposeAttrs, EinsumAttrs, GemmAttrs};
use kiln_ir::{DType, OpKind, Shape, TensorType};

use super::{broadcast_index, compute, store, unflatten, LowerError, Lowered, OpCx, Operand, Output, Step};
use kiln_flow::kernel::{BinaryOp, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType, UnaryOp, VarId};

pub(super) type R<T> = Result<T, LowerError>;

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    use OpKind::*;
    let r = match cx.op.kind {
        MatMul => matmul(cx),
        Gemm => gemm(cx),
        MatMulInteger => matmul_integer(cx),
        QLinearMatMul => qlinear_matmul(cx),
        Conv => conv(cx, ConvKind::Float),
        ConvInteger => conv(cx, ConvKind::Integer),
        QLinearConv => conv(cx, ConvKind::QLinear),
        ConvTranspose => conv_transpose(cx),
        Einsum => einsum(cx),
        Det => det(cx),
        _ => return None,
    };
    Some(r)
}

// ---------------------------------------------------------------------------
// Helpers shared with the reductions and pools.
// ---------------------------------------------------------------------------

/// Dimensions of operand `i`.
pub(super) fn dims(cx: &OpCx<'_>, i: usize) -> R<Vec<usize>> {
    Ok(cx.input_ty(i)?.shape.dims().to_vec())
}

/// Dimensions of result `i`.
pub(super) fn out_dims(cx: &OpCx<'_>, i: usize) -> R<Vec<usize>> {
    match cx.outputs.get(i) {
        Some(t) => Ok(t.shape.dims().to_vec()),
        None => Err(cx.unsupported(format!("result {i} has no type"))),
    }
}

/// Checks that result `i` has dimensions `want`.
pub(super) fn expect_out(cx: &OpCx<'_>, i: usize, want: &[usize]) -> R<()> {
    let got = out_dims(cx, i)?;
    if got != want {
        return Err(cx.unsupported(format!("result {i} has dims {got:?}, the operands give {want:?}")));
    }
    Ok(())
}

/// Types of the given operands, in order (the kernel's inputs).
pub(super) fn types(cx: &OpCx<'_>, ops: &[usize]) -> R<Vec<TensorType>> {
    ops.iter().map(|&i| cx.input_ty(i).cloned()).collect()
}

/// A kernel for result `result` that reads nothing and stores zeros (for empty results:
/// nothing to compute, and no load could be proved in bounds).
pub(super) fn empty_step(cx: &OpCx<'_>, result: usize) -> R<Step> {
    let Some(out) = cx.outputs.get(result) else {
        return Err(cx.unsupported(format!("result {result} has no type")));
    };
    let mut b = cx.builder(result, Vec::new());
    let z = b.constant(ScalarType::of_storage(out.dtype), 0);
    let root = store(&mut b, z);
    Ok(Step { kernel: b.finish(root)?, operands: Vec::new() })
}

/// Ends a kernel whose inputs are the op operands `ops`: stores `value` (rounded to the
/// output dtype).
pub(super) fn finish(mut b: KernelBuilder, value: ExprId, ops: &[usize]) -> R<Step> {
    let root = store(&mut b, value);
    Ok(Step { kernel: b.finish(root)?, operands: ops.iter().map(|&i| Operand::Input(i)).collect() })
}

/// One step computing the op's only result.
pub(super) fn one(step: Step) -> Lowered {
    Lowered { steps: vec![step], outputs: vec![Output::Step(0)] }
}

/// Kernel input position of op operand `op` in the operand list `ops`.
pub(super) fn pos(ops: &[usize], op: usize) -> usize {
    ops.iter().position(|&o| o == op).unwrap_or(usize::MAX)
}

/// `e * scale + offset` (i64), without the operations that are identities.
pub(super) fn affine(b: &mut KernelBuilder, e: ExprId, scale: i64, offset: i64) -> ExprId {
    let s = match scale {
        0 => return b.index(offset),
        1 => e,
        _ => {
            let k = b.index(scale);
            b.mul(e, k)
        }
    };
    if offset == 0 {
        return s;
    }
    let k = b.index(offset);
    b.add(s, k)
}

/// `op` folded over `vars`; the body itself when there are none.
pub(super) fn fold(b: &mut KernelBuilder, op: ReduceOp, vars: Vec<VarId>, body: ExprId) -> ExprId {
    if vars.is_empty() {
        body
    } else {
        b.reduce(op, vars, body)
    }
}

/// `0 <= e < n` (Bool).
pub(super) fn in_range(b: &mut KernelBuilder, e: ExprId, n: usize) -> ExprId {
    let z = b.index(0);
    let ge = b.binary(BinaryOp::Ge, e, z);
    let k = b.index(n as i64);
    let lt = b.binary(BinaryOp::Lt, e, k);
    b.binary(BinaryOp::And, ge, lt)
}

/// `a && b`, where `a` may be absent (true).
pub(super) fn and(b: &mut KernelBuilder, a: Option<ExprId>, c: ExprId) -> ExprId {
    match a {
        None => c,
        Some(a) => b.binary(BinaryOp::And, a, c),
    }
}

/// The element at row-major flat position `flat` of input `input` (dims `dims`): a
/// scalar-like tensor (one element) reads its only element.
pub(super) fn load_flat(b: &mut KernelBuilder, input: usize, dims: &[usize], flat: ExprId) -> ExprId {
    let idx = if dims.iter().product::<usize>() == 1 {
        let z = b.index(0);
        vec![z; dims.len()]
    } else if dims.len() == 1 {
        vec![flat]
    } else {
        unflatten(b, dims, flat)
    };
    b.load(input, idx)
}

/// The value range of integer dtype `d`.
pub(super) fn int_bounds(d: DType) -> (i128, i128) {
    match d {
        DType::Bool => (0, 1),
        DType::I4 => (-8, 7),
        DType::U4 => (0, 15),
        d => ScalarType::of_storage(d).int_range(),
    }
}

/// A float `e` converted to integer dtype `d` as the reference writes floats into
/// integers: truncated toward zero, saturated to the dtype's range, NaN to 0. For other
/// dtypes, the plain conversion.
pub(super) fn float_to(b: &mut KernelBuilder, e: ExprId, d: DType) -> ExprId {
    let t = b.ty(e);
    if !d.is_int() || !t.is_float() {
        // The store converts.
        return e;
    }
    let (lo, hi) = int_bounds(d);
    let mut v = e;
    if matches!(d, DType::I4 | DType::U4) {
        v = b.unary(UnaryOp::Trunc, v);
    }
    let l = b.float(t, lo as f64);
    let h = b.float(t, hi as f64);
    // max/min propagate NaN, which the conversion turns into 0.
    v = b.binary(BinaryOp::Max, v, l);
    v = b.binary(BinaryOp::Min, v, h);
    b.cast(v, d, true)
}

// ---------------------------------------------------------------------------
// Sliding windows (Conv and the pools).
// ---------------------------------------------------------------------------

pub(super) use kiln_ir::attrs::AutoPad;

/// Bound on window attributes (strides, dilations, pads): far above real models, low
/// enough that index arithmetic cannot overflow.
const MAX_ATTR: i64 = 1 << 24;

/// An ints attribute `name` (value `v`) of `len` values in `min..=2^24` (`default` each
/// when absent or empty).
pub(super) fn window_ints(
    cx: &OpCx<'_>,
    name: &str,
    v: Option<&[i64]>,
    len: usize,
    min: i64,
    default: i64,
) -> R<Vec<i64>> {
    match v {
        None => Ok(vec![default; len]),
        Some(v) if v.is_empty() => Ok(vec![default; len]),
        Some(v) => {
            if v.len() != len || v.iter().any(|&x| !(min..=MAX_ATTR).contains(&x)) {
                return Err(cx.unsupported(format!("{name} = {v:?}: {len} values in {min}..=2^24 expected")));
            }
            Ok(v.to_vec())
        }
    }
}

/// One spatial dimension of a sliding window: output position `o` and tap `k` read input
/// position `o·stride − pad + k·dilation`.
#[derive(Clone, Debug)]
pub(super) struct WinDim {
    /// Input extent.
    pub input: usize,
    /// Taps.
    pub kernel: usize,
    pub stride: i64,
    pub dilation: i64,
    /// Padding before the input (the offset of the first window).
    pub pad: i64,
    /// Output extent.
    pub output: usize,
}

impl WinDim {
    /// The input position of output position `o` and tap `k`.
    pub(super) fn tap(&self, b: &mut KernelBuilder, o: ExprId, k: ExprId) -> ExprId {
        let base = affine(b, o, self.stride, -self.pad);
        if self.kernel == 1 {
            return base;
        }
        let kk = affine(b, k, self.dilation, 0);
        b.add(base, kk)
    }

    /// Every tap of every window lies inside the input.
    pub(super) fn inside(&self) -> bool {
        if self.output == 0 || self.kernel == 0 {
            return true;
        }
        let lo = -self.pad;
        let hi = (self.output as i64 - 1) * self.stride - self.pad + (self.kernel as i64 - 1) * self.dilation;
        lo >= 0 && hi < self.input as i64
    }
}

/// The windows of a Conv-style operator or pool over spatial extents `input` with
/// `kernel` taps: strides, dilations, pads / auto_pad and (pools) ceil mode, with the
/// output extents and leading pads the reference computes.
pub(super) fn sliding_window(cx: &OpCx<'_>, input: &[usize], kernel: &[usize], ceil: bool) -> R<Vec<WinDim>> {
    let r = input.len();
    let w = cx.window()?;
    let strides = window_ints(cx, "strides", w.strides, r, 1, 1)?;
    let dilations = window_ints(cx, "dilations", w.dilations, r, 1, 1)?;
    let pads = window_ints(cx, "pads", w.pads, 2 * r, 0, 0)?;
    let ap = w.auto_pad;
    let mut out = Vec::with_capacity(r);
    for d in 0..r {
        let (i, s, dl) = (input[d] as i64, strides[d], dilations[d]);
        if kernel[d] == 0 || kernel[d] as i64 > MAX_ATTR {
            return Err(cx.unsupported(format!("kernel extent {} on spatial dim {d}", kernel[d])));
        }
        let dk = (kernel[d] as i64 - 1) * dl + 1;
        let (o, pb) = match ap {
            AutoPad::SameUpper | AutoPad::SameLower => {
                let o = (i + s - 1) / s;
                let total = ((o - 1).max(0) * s + dk - i).max(0);
                let pb = if ap == AutoPad::SameUpper { total / 2 } else { total - total / 2 };
                (o, pb)
            }
            AutoPad::NotSet | AutoPad::Valid => {
                let (pb, pe) = if ap == AutoPad::Valid { (0, 0) } else { (pads[d], pads[d + r]) };
                let span = i + pb + pe - dk;
                if span < 0 {
                    return Err(cx.unsupported(format!("spatial dim {d}: the padded input is smaller than the kernel")));
                }
                let mut o = if ceil { (span + s - 1) / s + 1 } else { span / s + 1 };
                if ceil && (o - 1) * s >= i + pb {
                    o -= 1;
                }
                (o, pb)
            }
        };
        out.push(WinDim {
            input: input[d],
            kernel: kernel[d],
            stride: s,
            dilation: dl,
            pad: pb,
            output: o.max(0) as usize,
        });
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// MatMul family.
// ---------------------------------------------------------------------------

/// numpy matmul geometry.
struct MmGeom {
    /// Broadcast batch dims.
    batch: Vec<usize>,
    k: usize,
    /// Batch dims of each operand (without the matrix dims).
    a_batch: Vec<usize>,
    b_batch: Vec<usize>,
    /// Operand ranks.
    a_rank: usize,
    b_rank: usize,
    m: usize,
    n: usize,
    out: Vec<usize>,
}

fn mm_geom(cx: &OpCx<'_>, ad: &[usize], bd: &[usize]) -> R<MmGeom> {
    if ad.is_empty() || bd.is_empty() {
        return Err(cx.unsupported("operands of rank 0"));
    }
    let a2: Vec<usize> = if ad.len() == 1 { vec![1, ad[0]] } else { ad.to_vec() };
    let b2: Vec<usize> = if bd.len() == 1 { vec![bd[0], 1] } else { bd.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(cx.unsupported(format!("inner dimensions differ: {ad:?} x {bd:?}")));
    }
    let ab = a2[..a2.len() - 2].to_vec();
    let bb = b2[..b2.len() - 2].to_vec();
    let rank = ab.len().max(bb.len());
    let mut batch = vec![1usize; rank];
    for (j, slot) in batch.iter_mut().enumerate() {
        let get = |v: &[usize]| if j + v.len() >= rank { v[j + v.len() - rank] } else { 1 };
        let (x, y) = (get(&ab), get(&bb));
        *slot = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(cx.unsupported(format!("batch dimensions of {ad:?} and {bd:?} do not broadcast"))),
        };
    }
    let mut out = batch.clone();
    if ad.len() > 1 {
        out.push(m);
    }
    if bd.len() > 1 {
        out.push(n);
    }
    Ok(MmGeom { batch, k, a_batch: ab, b_batch: bb, a_rank: ad.len(), b_rank: bd.len(), m, n, out })
}

/// Indices of the product's operands for output index `out` and contraction index `kv`:
/// `(a index, b index, row, column)` where row and column are the output's matrix
/// position (0 for a 1-D operand).
fn mm_index(
    b: &mut KernelBuilder,
    g: &MmGeom,
    out: &[ExprId],
    kv: ExprId,
) -> (Vec<ExprId>, Vec<ExprId>, ExprId, ExprId) {
    let nb = g.batch.len();
    let bvars = &out[..nb];
    let zero = b.index(0);
    let row = if g.a_rank > 1 { out[nb] } else { zero };
    let col = if g.b_rank > 1 { out[out.len() - 1] } else { zero };
    let mut ai = broadcast_index(b, &g.a_batch, bvars);
    if g.a_rank > 1 {
        ai.push(row);
    }
    ai.push(kv);
    let mut bi = broadcast_index(b, &g.b_batch, bvars);
    bi.push(kv);
    if g.b_rank > 1 {
        bi.push(col);
    }
    (ai, bi, row, col)
}

/// `Σ_k term(k)` over a contraction of `k` positions (`term` gets the index expression
/// of `k`), or the zero of `ct` when there are none.
fn contract(
    b: &mut KernelBuilder,
    k: usize,
    ct: ScalarType,
    term: impl FnOnce(&mut KernelBuilder, ExprId) -> R<ExprId>,
) -> R<ExprId> {
    if k == 0 {
        return Ok(b.constant(ct, 0));
    }
    let kvar = b.new_var(k as u64);
    let kv = b.var(kvar);
    let p = term(b, kv)?;
    Ok(b.reduce(ReduceOp::Sum, vec![kvar], p))
}

fn matmul(cx: &OpCx<'_>) -> R<Lowered> {
    let (ad, bd) = (dims(cx, 0)?, dims(cx, 1)?);
    let g = mm_geom(cx, &ad, &bd)?;
    expect_out(cx, 0, &g.out)?;
    let d = cx.output_ty(0).dtype;
    let ct = compute(d);
    if ct == ScalarType::Bool || cx.input_ty(0)?.dtype != cx.input_ty(1)?.dtype {
        return Err(cx.unsupported("operands must share a numeric dtype"));
    }
    if g.out.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let ops = [0, 1];
    let mut b = cx.builder(0, types(cx, &ops)?);
    let out = b.out_index();
    let acc = contract(&mut b, g.k, ct, |b, kv| {
        let (ai, bi, _, _) = mm_index(b, &g, &out, kv);
        let x = b.load(0, ai);
        let y = b.load(1, bi);
        Ok(b.mul(x, y))
    })?;
    Ok(one(finish(b, acc, &ops)?))
}

fn gemm(cx: &OpCx<'_>) -> R<Lowered> {
    let (ad, bd) = (dims(cx, 0)?, dims(cx, 1)?);
    if ad.len() != 2 || bd.len() != 2 {
        return Err(cx.unsupported("Gemm needs 2-D operands"));
    }
    let ga = cx.attrs::<GemmAttrs>()?;
    let (alpha, beta) = (ga.alpha as f64, ga.beta as f64);
    let (ta, tb) = (ga.trans_a, ga.trans_b);
    let (m, k) = if ta { (ad[1], ad[0]) } else { (ad[0], ad[1]) };
    let (k2, n) = if tb { (bd[1], bd[0]) } else { (bd[0], bd[1]) };
    if k != k2 {
        return Err(cx.unsupported("inner dimensions differ"));
    }
    expect_out(cx, 0, &[m, n])?;
    let d = cx.output_ty(0).dtype;
    // Floats compute in their compute type; integers as the reference does, through f64.
    let ct = if d.is_float() { compute(d) } else { ScalarType::F64 };
    if m * n == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let c = cx.input(2);
    let ops: Vec<usize> = if c.is_some() { vec![0, 1, 2] } else { vec![0, 1] };
    let mut inputs = types(cx, &ops)?;
    let mut operands: Vec<Operand> = ops.iter().map(|&i| Operand::Input(i)).collect();
    let mut steps = Vec::new();
    // A transposed B computed at run time is copied to `[K, N]` by a step of its own
    // (a movement dispatch), so that the product reads its columns in order and stays
    // a contraction: read transposed, the product steps K per column, which no
    // contraction path takes, and falls to the general one. A constant B is laid out
    // in panels at compile time whatever its order, so it is read in place.
    let tb = if tb && cx.input(1).is_some_and(|x| x.value.is_none()) {
        let bty = cx.input_ty(1)?;
        let tty = TensorType::new(bty.dtype, Shape::new(vec![k, n]).map_err(|e| cx.unsupported(e.to_string()))?);
        let mut t = KernelBuilder::new(format!("{}_bt", cx.name), vec![bty.clone()], tty.clone());
        let o = t.out_index();
        let v = t.load(0, vec![o[1], o[0]]);
        let root = store(&mut t, v);
        steps.push(Step { kernel: t.finish(root)?, operands: vec![Operand::Input(1)] });
        inputs[1] = tty;
        operands[1] = Operand::Step(0);
        false
    } else {
        tb
    };
    let mut b = cx.builder(0, inputs);
    let out = b.out_index();
    let (i, j) = (out[0], out[1]);
    let mut acc = contract(&mut b, k, ct, |b, kv| {
        let ai = if ta { vec![kv, i] } else { vec![i, kv] };
        let bi = if tb { vec![j, kv] } else { vec![kv, j] };
        let x = b.load(0, ai);
        let x = b.convert(x, ct);
        let y = b.load(1, bi);
        let y = b.convert(y, ct);
        Ok(b.mul(x, y))
    })?;
    if alpha != 1.0 {
        let a = b.float(ct, alpha);
        acc = b.mul(acc, a);
    }
    if let Some(c) = c {
        let cd = c.ty.shape.dims().to_vec();
        if cd.len() > 2 || cd.iter().rev().zip([n, m]).any(|(&x, y)| x != 1 && x != y) {
            return Err(cx.unsupported(format!("C of shape {cd:?} does not broadcast to [{m}, {n}]")));
        }
        let ci = broadcast_index(&mut b, &cd, &out);
        let cv = b.load(2, ci);
        let mut cv = b.convert(cv, ct);
        if beta != 1.0 {
            let be = b.float(ct, beta);
            cv = b.mul(cv, be);
        }
        acc = b.add(acc, cv);
    }
    let v = float_to(&mut b, acc, d);
    let root = store(&mut b, v);
    steps.push(Step { kernel: b.finish(root)?, operands });
    Ok(Lowered { outputs: vec![Output::Step(steps.len() - 1)], steps })
}

/// Index of a zero point of shape `zd` for an operand element at `index` (operand dims
/// `xd`): one element, per row (`rowwise`, a 1-D `[M]` read as `[M, 1]`), or a shape
/// broadcasting to the operand.
fn zero_point_index(
    cx: &OpCx<'_>,
    b: &mut KernelBuilder,
    zd: &[usize],
    xd: &[usize],
    index: &[ExprId],
    rowwise: bool,
) -> R<Vec<ExprId>> {
    if zd.iter().product::<usize>() == 1 {
        let z = b.index(0);
        return Ok(vec![z; zd.len()]);
    }
    if zd.len() == 1 && rowwise && xd.len() >= 2 {
        if zd[0] != xd[xd.len() - 2] {
            return Err(cx.unsupported(format!("zero point of shape {zd:?} for an operand {xd:?}")));
        }
        return Ok(vec![index[xd.len() - 2]]);
    }
    let fits = zd.len() <= xd.len() && zd.iter().rev().zip(xd.iter().rev()).all(|(&z, &x)| z == 1 || z == x);
    if !fits {
        return Err(cx.unsupported(format!("zero point of shape {zd:?} for an operand {xd:?}")));
    }
    Ok(broadcast_index(b, zd, index))
}

fn matmul_integer(cx: &OpCx<'_>) -> R<Lowered> {
    let (ad, bd) = (dims(cx, 0)?, dims(cx, 1)?);
    let g = mm_geom(cx, &ad, &bd)?;
    expect_out(cx, 0, &g.out)?;
    for i in [0, 1] {
        if !matches!(cx.input_ty(i)?.dtype, DType::U8 | DType::I8) {
            return Err(cx.unsupported("operands must be u8 or i8"));
        }
    }
    if g.out.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let mut ops = vec![0, 1];
    for i in [2, 3] {
        if cx.input(i).is_some() {
            ops.push(i);
        }
    }
    let ct = ScalarType::I32;
    let mut b = cx.builder(0, types(cx, &ops)?);
    let out = b.out_index();
    let acc = contract(&mut b, g.k, ct, |b, kv| {
        let (ai, bi, _, _) = mm_index(b, &g, &out, kv);
        let x = b.load(0, ai.clone());
        let mut x = b.convert(x, ct);
        let y = b.load(1, bi.clone());
        let mut y = b.convert(y, ct);
        if cx.input(2).is_some() {
            let zd = dims(cx, 2)?;
            let zi = zero_point_index(cx, b, &zd, &ad, &ai, ad.len() > 1)?;
            let z = b.load(pos(&ops, 2), zi);
            let z = b.convert(z, ct);
            x = b.sub(x, z);
        }
        if cx.input(3).is_some() {
            let zd = dims(cx, 3)?;
            let zi = zero_point_index(cx, b, &zd, &bd, &bi, false)?;
            let z = b.load(pos(&ops, 3), zi);
            let z = b.convert(z, ct);
            y = b.sub(y, z);
        }
        Ok(b.mul(x, y))
    })?;
    Ok(one(finish(b, acc, &ops)?))
}

/// The value (in `ft`) of a per-tensor (one element) or per-`n` parameter (operand `op`,
/// kernel input `input`) at position `at`.
fn qparam(
    cx: &OpCx<'_>,
    b: &mut KernelBuilder,
    (op, input): (usize, usize),
    n: usize,
    at: ExprId,
    ft: ScalarType,
) -> R<ExprId> {
    let pd = dims(cx, op)?;
    let numel: usize = pd.iter().product();
    if numel != 1 && numel != n {
        return Err(cx.unsupported(format!("operand {op} has {numel} elements, 1 or {n} expected")));
    }
    let v = load_flat(b, input, &pd, at);
    Ok(b.convert(v, ft))
}

/// The end of a quantized operator: `acc` (an exact integer, i32 or f64) times `mult`
/// (f32 for an i32 `acc`, else f64), rounded half to even for an integer result, plus
/// the zero point `zp`, written into `d` (saturating). For integer operands this is ONNX
/// Runtime's requantisation (`float(acc) · scale`, `scale = s_a·s_b / s_y` in f32,
/// rounded to nearest even), so that an integer result matches it, not only the ONNX
/// reference's exact arithmetic.
fn requantize(b: &mut KernelBuilder, acc: ExprId, mult: ExprId, zp: ExprId, d: DType) -> ExprId {
    let ft = b.ty(mult);
    let a = b.convert(acc, ft);
    let mut v = b.mul(a, mult);
    if d.is_int() {
        v = b.unary(UnaryOp::Round, v);
    }
    v = b.add(v, zp);
    float_to(b, v, d)
}

fn qlinear_matmul(cx: &OpCx<'_>) -> R<Lowered> {
    let (ad, bd) = (dims(cx, 0)?, dims(cx, 3)?);
    let g = mm_geom(cx, &ad, &bd)?;
    expect_out(cx, 0, &g.out)?;
    let d = cx.output_ty(0).dtype;
    let (at, bt) = (cx.input_ty(0)?.dtype, cx.input_ty(3)?.dtype);
    for (i, zt) in [(2, at), (5, bt)] {
        if cx.input_ty(i)?.dtype != zt {
            return Err(cx.unsupported(format!("zero point (operand {i}) dtype differs from its operand's")));
        }
    }
    if g.out.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    // Integer operands accumulate exactly in i32; 8-bit float ones in f64.
    let ct = if at.is_int() && bt.is_int() { ScalarType::I32 } else { ScalarType::F64 };
    let ops: Vec<usize> = (0..8).collect();
    let mut b = cx.builder(0, types(cx, &ops)?);
    let out = b.out_index();
    let zero = b.index(0);
    let row = if g.a_rank > 1 { out[g.batch.len()] } else { zero };
    let col = if g.b_rank > 1 { out[out.len() - 1] } else { zero };
    let acc = contract(&mut b, g.k, ct, |b, kv| {
        let (ai, bi, row, col) = mm_index(b, &g, &out, kv);
        let x = centred(cx, b, (0, ai), (2, g.m, row), ct)?;
        let y = centred(cx, b, (3, bi), (5, g.n, col), ct)?;
        Ok(b.mul(x, y))
    })?;
    let ft = if ct == ScalarType::I32 { ScalarType::F32 } else { ScalarType::F64 };
    let sa = qparam(cx, &mut b, (1, 1), g.m, row, ft)?;
    let sb = qparam(cx, &mut b, (4, 4), g.n, col, ft)?;
    let sy = qparam(cx, &mut b, (6, 6), g.m, row, ft)?;
    let zy = qparam(cx, &mut b, (7, 7), g.m, row, ft)?;
    let ab = b.mul(sa, sb);
    let mult = b.div(ab, sy);
    let v = requantize(&mut b, acc, mult, zy, d);
    Ok(one(finish(b, v, &ops)?))
}

/// Operand `op` at `index` minus its zero point (operand `zp`, per tensor or one per
/// `n` positions, taken at `at`), both converted to `ct`.
fn centred(
    cx: &OpCx<'_>,
    b: &mut KernelBuilder,
    (op, index): (usize, Vec<ExprId>),
    (zp, n, at): (usize, usize, ExprId),
    ct: ScalarType,
) -> R<ExprId> {
    let v = b.load(op, index);
    let v = b.convert(v, ct);
    let zd = dims(cx, zp)?;
    check_numel(cx, zp, &zd, n)?;
    let z = load_flat(b, zp, &zd, at);
    let z = b.convert(z, ct);
    Ok(b.sub(v, z))
}

fn check_numel(cx: &OpCx<'_>, op: usize, d: &[usize], n: usize) -> R<()> {
    let numel: usize = d.iter().product();
    if numel != 1 && numel != n {
        return Err(cx.unsupported(format!("operand {op} has {numel} elements, 1 or {n} expected")));
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Convolutions.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum ConvKind {
    Float,
    Integer,
    QLinear,
}

/// The `kernel_shape` attribute, when present, must equal the weights' spatial extents.
fn check_kernel_shape(cx: &OpCx<'_>, from_weights: &[usize]) -> R<()> {
    if let Some(k) = cx.window()?.kernel_shape {
        if !k.is_empty() && !k.iter().map(|&x| x as usize).eq(from_weights.iter().copied()) {
            return Err(cx.unsupported(format!("kernel_shape {k:?} differs from the weights' {from_weights:?}")));
        }
    }
    Ok(())
}

fn group_attr(cx: &OpCx<'_>) -> R<usize> {
    let g = match cx.op.kind {
        OpKind::ConvTranspose => cx.attrs::<ConvTransposeAttrs>()?.group,
        _ => cx.attrs::<ConvAttrs>()?.group,
    };
    if g < 1 {
        return Err(cx.unsupported(format!("group = {g}")));
    }
    Ok(g as usize)
}

/// A convolution's output dims, `[n, m]` then each window axis's output extent, checked
/// against the op's output type; `None` for an empty output (nothing to compute).
fn conv_out_dims(cx: &OpCx<'_>, n: usize, m: usize, win: &[WinDim]) -> R<Option<Vec<usize>>> {
    let mut od = vec![n, m];
    od.extend(win.iter().map(|w| w.output));
    expect_out(cx, 0, &od)?;
    Ok((od.iter().product::<usize>() != 0).then_some(od))
}

fn conv(cx: &OpCx<'_>, kind: ConvKind) -> R<Lowered> {
    let (xi, wi) = if kind == ConvKind::QLinear { (0, 3) } else { (0, 1) };
    let (xd, wd) = (dims(cx, xi)?, dims(cx, wi)?);
    if xd.len() < 3 || wd.len() != xd.len() {
        return Err(cx.unsupported(format!("X {xd:?} and W {wd:?}: equal ranks of 3 or more expected")));
    }
    let g = group_attr(cx)?;
    let (n, c, m) = (xd[0], xd[1], wd[0]);
    if wd[1].checked_mul(g) != Some(c) || m % g != 0 {
        return Err(cx.unsupported(format!("X {xd:?}, W {wd:?} and group {g} do not fit")));
    }
    let (cg, mg) = (wd[1], m / g);
    check_kernel_shape(cx, &wd[2..])?;
    let win = sliding_window(cx, &xd[2..], &wd[2..], false)?;
    let Some(od) = conv_out_dims(cx, n, m, &win)? else { return Ok(one(empty_step(cx, 0)?)) };
    let d = cx.output_ty(0).dtype;
    let xt = cx.input_ty(xi)?.dtype;
    // Operands: X, W, then what each kind reads.
    let (ops, xz, wz, bias): (Vec<usize>, Option<usize>, Option<usize>, Option<usize>) = match kind {
        ConvKind::Float => {
            let bias = cx.input(2).map(|_| 2);
            let mut ops = vec![0, 1];
            ops.extend(bias);
            (ops, None, None, bias)
        }
        ConvKind::Integer => {
            let xz = cx.input(2).map(|_| 2);
            let wz = cx.input(3).map(|_| 3);
            let mut ops = vec![0, 1];
            ops.extend(xz);
            ops.extend(wz);
            (ops, xz, wz, None)
        }
        ConvKind::QLinear => {
            let bias = cx.input(8).map(|_| 8);
            let mut ops: Vec<usize> = (0..8).collect();
            ops.extend(bias);
            (ops, Some(2), Some(5), bias)
        }
    };
    if kind != ConvKind::Float {
        for i in [xi, wi] {
            if !matches!(cx.input_ty(i)?.dtype, DType::U8 | DType::I8) {
                return Err(cx.unsupported("operands must be u8 or i8"));
            }
        }
    }
    let ct = if kind == ConvKind::Float { compute(d) } else { ScalarType::I32 };
    if kind == ConvKind::Float && !ct.is_float() {
        return Err(cx.unsupported("float operands expected"));
    }
    // A grouped convolution that is not depthwise (several input channels per group)
    // computes `[N, group, M/group, spatial…]`, the group an index of its own: the
    // channels it reads are then affine in the output index (`g·C/group + c`, not
    // `(m div M/group)·C/group + c`), so it is a batch of contractions a code generator's
    // microkernels take; the result is that tensor viewed as `[N, M, spatial…]`.
    let split = kind == ConvKind::Float && g > 1 && cg > 1;
    let mut b = if split {
        let mut dims = vec![n, g, mg];
        dims.extend(&od[2..]);
        let ty = TensorType::new(d, Shape::new(dims).map_err(|e| cx.unsupported(e.to_string()))?);
        KernelBuilder::new(cx.name.to_string(), types(cx, &ops)?, ty)
    } else {
        cx.builder(0, types(cx, &ops)?)
    };
    let out = b.out_index();
    let sp = if split { 3 } else { 2 };
    // The output channel `m`, and the group's first input channel where split.
    let (mv, split_chan) = if split {
        let q = b.index(mg as i64);
        let gm = b.mul(out[1], q);
        let m = b.add(gm, out[2]);
        (m, Some(affine(&mut b, out[1], cg as i64, 0)))
    } else {
        (out[1], None)
    };
    let taps: usize = wd[2..].iter().product();
    let acc = if cg * taps == 0 {
        b.constant(ct, 0)
    } else {
        let cvar = b.new_var(cg as u64);
        let kvars: Vec<VarId> = wd[2..].iter().map(|&k| b.new_var(k as u64)).collect();
        let cv = b.var(cvar);
        let chan = if let Some(base) = split_chan {
            b.add(base, cv)
        } else if g == 1 {
            cv
        } else {
            let q = b.index(mg as i64);
            let grp = b.div(mv, q);
            let base = affine(&mut b, grp, cg as i64, 0);
            b.add(base, cv)
        };
        let mut xidx = vec![out[0], chan];
        let mut widx = vec![mv, cv];
        let mut guard = None;
        for (dd, w) in win.iter().enumerate() {
            let kv = b.var(kvars[dd]);
            let t = w.tap(&mut b, out[sp + dd], kv);
            if !w.inside() {
                let r = in_range(&mut b, t, w.input);
                guard = Some(and(&mut b, guard, r));
            }
            xidx.push(t);
            widx.push(kv);
        }
        // Padding reads 0, or the zero point when it is a known constant (x − zp = 0).
        let xz_const = match xz {
            Some(i) => {
                cx.input(i).and_then(|z| z.value).and_then(|t| t.to_i64_vec().ok()).and_then(|v| v.first().copied())
            }
            None => Some(0),
        };
        let bounds = match (guard, xz_const) {
            (None, _) => Bounds::InBounds,
            (Some(_), Some(z)) => Bounds::Pad(ScalarType::of_storage(xt).bits_of_i64(z)),
            (Some(_), None) => Bounds::Pad(0),
        };
        let x = b.load_with(0, xidx, bounds);
        let w = b.load(pos(&ops, wi), widx);
        let p = if kind == ConvKind::Float {
            b.mul(x, w)
        } else {
            let mut x = b.convert(x, ct);
            let mut w = b.convert(w, ct);
            if let Some(i) = xz {
                let z = scalar_load(cx, &mut b, i, pos(&ops, i))?;
                let z = b.convert(z, ct);
                x = b.sub(x, z);
                if let (Some(gd), None) = (guard, xz_const) {
                    let zero = b.constant(ct, 0);
                    x = b.select(gd, x, zero);
                }
            }
            if let Some(i) = wz {
                let zd = dims(cx, i)?;
                check_numel(cx, i, &zd, m)?;
                let z = load_flat(&mut b, pos(&ops, i), &zd, mv);
                let z = b.convert(z, ct);
                w = b.sub(w, z);
            }
            b.mul(x, w)
        };
        let mut vars = vec![cvar];
        vars.extend(kvars);
        b.reduce(ReduceOp::Sum, vars, p)
    };
    let acc = match bias {
        Some(i) => {
            let bd = dims(cx, i)?;
            if bd != [m] {
                return Err(cx.unsupported(format!("bias of shape {bd:?}, [{m}] expected")));
            }
            let bv = b.load(pos(&ops, i), vec![mv]);
            let bv = b.convert(bv, ct);
            b.add(acc, bv)
        }
        None => acc,
    };
    let v = if kind == ConvKind::QLinear {
        let zero = b.index(0);
        let f = ScalarType::F32;
        let sx = qparam(cx, &mut b, (1, 1), 1, zero, f)?;
        let sw = qparam(cx, &mut b, (4, 4), m, mv, f)?;
        let sy = qparam(cx, &mut b, (6, 6), 1, zero, f)?;
        let zy = qparam(cx, &mut b, (7, 7), 1, zero, f)?;
        let xw = b.mul(sx, sw);
        let mult = b.div(xw, sy);
        requantize(&mut b, acc, mult, zy, d)
    } else {
        acc
    };
    Ok(one(finish(b, v, &ops)?))
}

/// The only element of a one-element operand.
fn scalar_load(cx: &OpCx<'_>, b: &mut KernelBuilder, op: usize, input: usize) -> R<ExprId> {
    let zd = dims(cx, op)?;
    if zd.iter().product::<usize>() != 1 {
        return Err(cx.unsupported(format!("operand {op} must have one element")));
    }
    let z = b.index(0);
    Ok(b.load(input, vec![z; zd.len()]))
}

fn conv_transpose(cx: &OpCx<'_>) -> R<Lowered> {
    let (xd, wd) = (dims(cx, 0)?, dims(cx, 1)?);
    if xd.len() < 3 || wd.len() != xd.len() {
        return Err(cx.unsupported(format!("X {xd:?} and W {wd:?}: equal ranks of 3 or more expected")));
    }
    let g = group_attr(cx)?;
    let (n, c) = (xd[0], xd[1]);
    if c != wd[0] || c % g != 0 {
        return Err(cx.unsupported(format!("X {xd:?}, W {wd:?} and group {g} do not fit")));
    }
    let (cg, mg) = (c / g, wd[1]);
    let m = mg * g;
    let r = xd.len() - 2;
    let input = &xd[2..];
    let kernel = &wd[2..];
    check_kernel_shape(cx, kernel)?;
    let ct = cx.attrs::<ConvTransposeAttrs>()?;
    let strides = window_ints(cx, "strides", ct.strides.as_deref(), r, 1, 1)?;
    let dilations = window_ints(cx, "dilations", ct.dilations.as_deref(), r, 1, 1)?;
    let out_pad = window_ints(cx, "output_padding", ct.output_padding.as_deref(), r, 0, 0)?;
    let pads = window_ints(cx, "pads", ct.pads.as_deref(), 2 * r, 0, 0)?;
    let ap = ct.auto_pad;
    let out_shape: Option<Vec<i64>> = match &ct.output_shape {
        Some(v) if v.is_empty() => None,
        Some(v) if v.len() >= r && v.iter().all(|&o| (0..=1 << 40).contains(&o)) => Some(v[v.len() - r..].to_vec()),
        Some(v) => return Err(cx.unsupported(format!("output_shape = {v:?}"))),
        None => None,
    };
    let mut ph = Vec::with_capacity(r);
    for d in 0..r {
        if kernel[d] == 0 || kernel[d] as i64 > MAX_ATTR {
            return Err(cx.unsupported(format!("kernel extent {}", kernel[d])));
        }
        let dk = (kernel[d] as i64 - 1) * dilations[d] + 1;
        let full = strides[d] * (input[d] as i64 - 1) + out_pad[d] + dk;
        let target = match (&out_shape, ap) {
            (Some(os), _) => Some(os[d]),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(input[d] as i64 * strides[d]),
            _ => None,
        };
        let (o, pb) = match target {
            Some(t) => {
                let total = full - t;
                let half = total.div_euclid(2);
                (t, if ap == AutoPad::SameUpper { half } else { total - half })
            }
            None if ap == AutoPad::Valid => (full, 0),
            None => (full - pads[d] - pads[d + r], pads[d]),
        };
        if !(0..=MAX_ATTR * MAX_ATTR).contains(&o) {
            return Err(cx.unsupported(format!("spatial dim {d}: output extent {o}")));
        }
        ph.push(Phases::new(input[d], kernel[d], strides[d], dilations[d], pb, o as usize));
    }
    let mut od = vec![n, m];
    od.extend(ph.iter().map(|p| p.output));
    expect_out(cx, 0, &od)?;
    if od.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let d = cx.output_ty(0).dtype;
    let ctype = compute(d);
    if !ctype.is_float() {
        return Err(cx.unsupported("float operands expected"));
    }
    let bias = match cx.input(2) {
        Some(_) if dims(cx, 2)? != [m] => return Err(cx.unsupported(format!("bias must have shape [{m}]"))),
        Some(_) => Some(2),
        None => None,
    };
    let ty = |cx: &OpCx<'_>, dims: Vec<usize>| -> R<TensorType> {
        Ok(TensorType::new(d, Shape::new(dims).map_err(|e| cx.unsupported(e.to_string()))?))
    };
    // Phase axes only where some stride is above 1 (else the product is the result).
    let phased = ph.iter().any(|p| p.stride > 1);
    // Several output channels per group in several groups: the group is an axis of its
    // own, so the input channel it reads is affine (as for Conv).
    let split = g > 1 && mg > 1;
    let taps: usize = ph.iter().map(|p| p.taps).product();
    // Every combination of the dimensions' phases, as one flat axis (ρ row-major).
    let phases: usize = ph.iter().map(|p| p.stride as usize).product();
    let empty = cg * taps == 0 || input.contains(&0);
    let mut steps: Vec<Step> = Vec::new();
    // 1. The phase filters W'[ρ, m, c, t…] = W[chan, m mod M/g, k…] for the tap k of
    //    phase ρ and tap t (0 where that phase has no such tap). A copy of W: folded at
    //    compile time when W is a constant.
    if !empty {
        let mut wdims = vec![phases, m, cg];
        wdims.extend(ph.iter().map(|p| p.taps));
        let mut b = KernelBuilder::new(format!("{}_filters", cx.name), types(cx, &[1])?, ty(cx, wdims)?);
        let o = b.out_index();
        let (mv, cv) = (o[1], o[2]);
        let (chan, j) = if g == 1 {
            (cv, mv)
        } else {
            let q = b.index(mg as i64);
            let grp = b.div(mv, q);
            let base = affine(&mut b, grp, cg as i64, 0);
            (b.add(base, cv), b.binary(BinaryOp::Rem, mv, q))
        };
        let mut widx = vec![chan, j];
        let mut valid: Option<ExprId> = None;
        let mut inner = phases as i64;
        for (dd, p) in ph.iter().enumerate() {
            // k·dilation = ρ + pad − shift − stride·(lo + step·t), ρ this dimension's
            // digit of the flat phase.
            inner /= p.stride;
            let rho = if p.stride > 1 {
                let q = b.index(inner);
                let hi = b.div(o[0], q);
                let s = b.index(p.stride);
                b.binary(BinaryOp::Rem, hi, s)
            } else {
                b.index(0)
            };
            let t = o[3 + dd];
            let base = affine(&mut b, rho, 1, p.pad - p.shift - p.stride * p.lo);
            let st = affine(&mut b, t, p.stride * p.step, 0);
            let kd = b.sub(base, st);
            let ok = in_range(&mut b, kd, ((p.kernel as i64 - 1) * p.dilation + 1) as usize);
            let mut ok = ok;
            let k = if p.dilation == 1 {
                kd
            } else {
                let dl = b.index(p.dilation);
                let rem = b.binary(BinaryOp::Rem, kd, dl);
                let z = b.index(0);
                let exact = b.binary(BinaryOp::Eq, rem, z);
                ok = b.binary(BinaryOp::And, ok, exact);
                b.div(kd, dl)
            };
            valid = Some(and(&mut b, valid, ok));
            widx.push(k);
        }
        let wv = b.load_with(0, widx, Bounds::Clamp);
        let v = match valid {
            Some(ok) => {
                let z = b.constant(ScalarType::of_storage(d), 0);
                b.select(ok, wv, z)
            }
            None => wv,
        };
        let root = b.finish(v)?;
        steps.push(Step { kernel: root, operands: vec![Operand::Input(1)] });
    }
    // 2. The product P[n, ρ, m, u…] = Σ_{c, t…} W'[ρ, m, c, t…] · x[n, chan, u + lo + step·t…]
    //    (+ bias): one contraction over every phase at once, the phase a batch index.
    let mut pdims = vec![n];
    if phased {
        pdims.push(phases);
    }
    if split {
        pdims.extend([g, mg]);
    } else {
        pdims.push(m);
    }
    pdims.extend(ph.iter().map(|p| p.extent));
    let pty = ty(cx, pdims)?;
    let mut pin = types(cx, &[0])?;
    let mut pops = vec![Operand::Input(0)];
    if !empty {
        pin.push(steps[0].kernel.output.clone());
        pops.push(Operand::Step(0));
    }
    if let Some(i) = bias {
        pin.push(cx.input_ty(i)?.clone());
        pops.push(Operand::Input(i));
    }
    let bias_input = pin.len() - 1;
    let mut b = KernelBuilder::new(format!("{}_product", cx.name), pin, pty);
    let o = b.out_index();
    let nr = usize::from(phased);
    let (mv, gj) = if split {
        let (gv, jv) = (o[1 + nr], o[2 + nr]);
        let q = b.index(mg as i64);
        let gm = b.mul(gv, q);
        (b.add(gm, jv), Some(gv))
    } else {
        (o[1 + nr], None)
    };
    let us: Vec<ExprId> = o[o.len() - r..].to_vec();
    let acc = if empty {
        b.constant(ctype, 0)
    } else {
        let cvar = b.new_var(cg as u64);
        let tvars: Vec<VarId> = ph.iter().map(|p| b.new_var(p.taps as u64)).collect();
        let cv = b.var(cvar);
        let chan = match gj {
            Some(gv) => {
                let base = affine(&mut b, gv, cg as i64, 0);
                b.add(base, cv)
            }
            None if g == 1 => cv,
            // One output channel per group (mg = 1): group m reads channels m·C/g + c.
            None => {
                let base = affine(&mut b, mv, cg as i64, 0);
                b.add(base, cv)
            }
        };
        let mut xidx = vec![o[0], chan];
        let mut widx: Vec<ExprId> = Vec::with_capacity(2 * r + 2);
        let mut inside = true;
        for (dd, p) in ph.iter().enumerate() {
            let t = b.var(tvars[dd]);
            let base = affine(&mut b, us[dd], 1, p.lo);
            let st = affine(&mut b, t, p.step, 0);
            xidx.push(b.add(base, st));
            inside &= p.inside();
        }
        widx.push(if phased { o[1] } else { b.index(0) });
        widx.extend([mv, cv]);
        widx.extend(tvars.iter().map(|&t| b.var(t)));
        let x = b.load_with(0, xidx, if inside { Bounds::InBounds } else { Bounds::Pad(0) });
        let w = b.load(1, widx);
        let p = b.mul(x, w);
        let mut vars = vec![cvar];
        vars.extend(tvars);
        b.reduce(ReduceOp::Sum, vars, p)
    };
    let acc = match bias {
        Some(_) => {
            let bv = b.load(bias_input, vec![mv]);
            b.add(acc, bv)
        }
        None => acc,
    };
    let root = store(&mut b, acc);
    let product = b.finish(root)?;
    steps.push(Step { kernel: product, operands: pops });
    let p_step = steps.len() - 1;
    if !phased {
        return Ok(Lowered { steps, outputs: vec![Output::Step(p_step)] });
    }
    // 3. The interleave: y[n, m, o…] = P[n, ρ, m, (o + shift) div s…], ρ the flat phase
    //    of the digits (o + shift) mod s.
    let pty = steps[p_step].kernel.output.clone();
    let mut b = cx.builder(0, vec![pty]);
    let o = b.out_index();
    let mut flat = b.index(0);
    let mut inner = Vec::with_capacity(r);
    for (dd, p) in ph.iter().enumerate() {
        let q = affine(&mut b, o[2 + dd], 1, p.shift);
        let s = b.index(p.stride);
        let rho = b.binary(BinaryOp::Rem, q, s);
        let f = b.mul(flat, s);
        flat = b.add(f, rho);
        inner.push(b.div(q, s));
    }
    let mut idx = vec![o[0], flat];
    if split {
        let q = b.index(mg as i64);
        idx.push(b.div(o[1], q));
        idx.push(b.binary(BinaryOp::Rem, o[1], q));
    } else {
        idx.push(o[1]);
    }
    idx.extend(inner);
    let v = b.load(0, idx);
    steps.push(Step { kernel: b.finish(v)?, operands: vec![Operand::Step(p_step)] });
    Ok(Lowered { outputs: vec![Output::Step(steps.len() - 1)], steps })
}

/// One spatial dimension of a ConvTranspose as sub-pixel phases (see the module docs):
/// output `o` takes input `i` through tap `k` where `o + pad = i·stride + k·dilation`.
/// With `o + shift = stride·u + ρ` (phase `ρ`, phase position `u`), phase `ρ`'s taps read
/// input `u + lo + step·t` for `t` in `0..taps`, tap `t` being kernel position
/// `(ρ + pad − shift − stride·(lo + step·t)) / dilation` where that is a whole position
/// inside the kernel (else the phase has no tap `t`: its filter is 0 there).
#[derive(Clone, Debug)]
struct Phases {
    input: usize,
    kernel: usize,
    stride: i64,
    dilation: i64,
    pad: i64,
    output: usize,
    /// `shift` in `0..stride`, chosen for the fewest taps.
    shift: i64,
    /// Input offset of tap 0.
    lo: i64,
    /// Input step per tap (the dilation at stride 1, else 1).
    step: i64,
    /// Taps per phase.
    taps: usize,
    /// Phase positions `u`: `⌈(output + shift) / stride⌉`.
    extent: usize,
}

impl Phases {
    fn new(input: usize, kernel: usize, stride: i64, dilation: i64, pad: i64, output: usize) -> Phases {
        let span = (kernel as i64 - 1) * dilation;
        let (shift, lo, step, taps) = if stride == 1 {
            // Tap t is kernel position K − 1 − t: input o + pad − span + dilation·t.
            (0, pad - span, dilation, kernel)
        } else {
            // Input offsets e with e·stride = ρ + pad − shift − k·dilation, over every ρ:
            // from ⌈(pad − shift − span) / s⌉ to ⌊(s − 1 + pad − shift) / s⌋.
            (0..stride)
                .map(|shift| {
                    let hi = (stride - 1 + pad - shift).div_euclid(stride);
                    let lo = -(span - pad + shift).div_euclid(stride);
                    (shift, lo, 1, (hi - lo + 1).max(0) as usize)
                })
                .min_by_key(|&(shift, _, _, taps)| (taps, shift))
                .unwrap_or((0, 0, 1, 0))
        };
        let extent = ((output as i64 + shift + stride - 1) / stride) as usize;
        Phases { input, kernel, stride, dilation, pad, output, shift, lo, step, taps, extent }
    }

    /// Every tap of every phase position reads inside the input.
    fn inside(&self) -> bool {
        let last = self.extent as i64 - 1 + self.lo + self.step * (self.taps as i64 - 1);
        self.lo >= 0 && last < self.input as i64
    }
}

// ---------------------------------------------------------------------------
// Einsum.
// ---------------------------------------------------------------------------

/// Labels: letters 0..52 (`A`..`Z`, then `a`..`z`), then ellipsis dimension `j` is 52 + j.
const ELL: usize = 52;

/// One term of the equation: its letters, and where its ellipsis is (if any).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Term {
    /// Subscripts in order; `None` marks the ellipsis.
    subs: Vec<Option<usize>>,
}

fn parse_term(s: &str) -> Result<Term, String> {
    let mut subs = Vec::new();
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            c @ b'A'..=b'Z' => subs.push(Some((c - b'A') as usize)),
            c @ b'a'..=b'z' => subs.push(Some(26 + (c - b'a') as usize)),
            b'.' => {
                if bytes.get(i..i + 3) != Some(b"...") || subs.contains(&None) {
                    return Err(format!("bad ellipsis in `{s}`"));
                }
                subs.push(None);
                i += 2;
            }
            c if c.is_ascii_whitespace() => {}
            c => return Err(format!("unexpected `{}` in `{s}`", c as char)),
        }
        i += 1;
    }
    Ok(Term { subs })
}

impl Term {
    fn letters(&self) -> usize {
        self.subs.iter().filter(|s| s.is_some()).count()
    }

    /// One label per axis of an operand of `rank`; the ellipsis covers the last of the
    /// `e_total` ellipsis labels.
    fn labels(&self, rank: usize, e_total: usize) -> Result<Vec<usize>, String> {
        let letters = self.letters();
        let has_ell = self.subs.contains(&None);
        if letters > rank || (!has_ell && letters != rank) {
            return Err(format!("a term of {letters} letters for an operand of rank {rank}"));
        }
        let w = rank - letters;
        let mut out = Vec::with_capacity(rank);
        for s in &self.subs {
            match s {
                Some(l) => out.push(*l),
                None => out.extend((e_total - w..e_total).map(|j| ELL + j)),
            }
        }
        Ok(out)
    }
}

fn einsum(cx: &OpCx<'_>) -> R<Lowered> {
    let eq = &cx.attrs::<EinsumAttrs>()?.equation;
    let nops = cx.inputs.len();
    let ds: Vec<Vec<usize>> = (0..nops).map(|i| dims(cx, i)).collect::<R<_>>()?;
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let bad = |e: String| cx.unsupported(format!("equation `{eq}`: {e}"));
    let terms: Vec<Term> = lhs.split(',').map(parse_term).collect::<Result<_, _>>().map_err(bad)?;
    if terms.len() != nops {
        return Err(bad(format!("{} terms for {nops} operands", terms.len())));
    }
    let mut e_total = 0;
    for (t, d) in terms.iter().zip(&ds) {
        if t.subs.contains(&None) {
            e_total = e_total.max(d.len().saturating_sub(t.letters()));
        }
    }
    let labels: Vec<Vec<usize>> =
        terms.iter().zip(&ds).map(|(t, d)| t.labels(d.len(), e_total)).collect::<Result<_, _>>().map_err(bad)?;
    let nl = ELL + e_total;
    let mut size: Vec<Option<usize>> = vec![None; nl];
    let mut count = vec![0usize; nl];
    for (ls, d) in labels.iter().zip(&ds) {
        for (&l, &e) in ls.iter().zip(d) {
            count[l] += 1;
            size[l] = match size[l] {
                None => Some(e),
                Some(s) if s == e || e == 1 => Some(s),
                Some(1) => Some(e),
                Some(s) => return Err(bad(format!("a label has extents {s} and {e}"))),
            };
        }
    }
    let out_labels: Vec<usize> = match rhs {
        Some(r) => {
            let t = parse_term(r).map_err(bad)?;
            let mut v = Vec::new();
            for s in t.subs {
                match s {
                    Some(l) => {
                        if count[l] == 0 || v.contains(&l) {
                            return Err(bad("an output letter is missing from the inputs or repeats".into()));
                        }
                        v.push(l);
                    }
                    None => v.extend(ELL..ELL + e_total),
                }
            }
            v
        }
        None => (ELL..nl).chain((0..ELL).filter(|&l| count[l] == 1)).collect(),
    };
    let sum_labels: Vec<usize> = (0..nl).filter(|&l| count[l] > 0 && !out_labels.contains(&l)).collect();
    let od: Vec<usize> = out_labels.iter().map(|&l| size[l].unwrap_or(1)).collect();
    expect_out(cx, 0, &od)?;
    let d = cx.output_ty(0).dtype;
    let ct = compute(d);
    if ct == ScalarType::Bool || (0..nops).any(|i| cx.inputs[i].map(|x| x.ty.dtype) != Some(d)) {
        return Err(cx.unsupported("operands must share the result's numeric dtype"));
    }
    if od.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let ops: Vec<usize> = (0..nops).collect();
    let mut b = cx.builder(0, types(cx, &ops)?);
    let out = b.out_index();
    let sum_sizes: Vec<usize> = sum_labels.iter().map(|&l| size[l].unwrap_or(1)).collect();
    let v = if sum_sizes.contains(&0) {
        b.constant(ct, 0)
    } else {
        let mut var_of: Vec<Option<ExprId>> = vec![None; nl];
        for (&l, &e) in out_labels.iter().zip(&out) {
            var_of[l] = Some(e);
        }
        let mut svars = Vec::with_capacity(sum_labels.len());
        for (&l, &s) in sum_labels.iter().zip(&sum_sizes) {
            let v = b.new_var(s as u64);
            svars.push(v);
            var_of[l] = Some(b.var(v));
        }
        let mut prod: Option<ExprId> = None;
        for (i, (ls, dd)) in labels.iter().zip(&ds).enumerate() {
            let mut idx = Vec::with_capacity(ls.len());
            for (&l, &e) in ls.iter().zip(dd) {
                let sz = size[l].unwrap_or(1);
                let Some(v) = var_of[l] else { return Err(bad("a label has no variable".into())) };
                idx.push(if e == 1 && sz != 1 { b.index(0) } else { v });
            }
            let x = b.load(i, idx);
            prod = Some(match prod {
                None => x,
                Some(p) => b.mul(p, x),
            });
        }
        let body = match prod {
            Some(p) => p,
            None => b.constant(ct, 1),
        };
        fold(&mut b, ReduceOp::Sum, svars, body)
    };
    Ok(one(finish(b, v, &ops)?))
}

// ---------------------------------------------------------------------------
// Det.
// ---------------------------------------------------------------------------

/// Largest matrix Det lowers (two kernels per column).
const DET_MAX: usize = 128;

fn det(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let r = xd.len();
    if r < 2 || xd[r - 1] != xd[r - 2] {
        return Err(cx.unsupported(format!("Det needs [*, M, M], got {xd:?}")));
    }
    let n = xd[r - 1];
    let bd = xd[..r - 2].to_vec();
    expect_out(cx, 0, &bd)?;
    let d = cx.output_ty(0).dtype;
    let ct = compute(d);
    if !ct.is_float() {
        return Err(cx.unsupported("float operand expected"));
    }
    if bd.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    if n == 0 {
        let mut b = cx.builder(0, Vec::new());
        let v = b.float(ct, 1.0);
        return Ok(one(finish(b, v, &[])?));
    }
    if n > DET_MAX {
        return Err(cx.unsupported(format!("matrices larger than {DET_MAX}x{DET_MAX}")));
    }
    let nb = bd.len();
    let ty = |cx: &OpCx<'_>, dims: Vec<usize>| -> R<TensorType> {
        let s = Shape::new(dims).map_err(|e| cx.unsupported(e.to_string()))?;
        Ok(TensorType::new(ct.dtype(), s))
    };
    let mut steps: Vec<Step> = Vec::new();
    // The current matrix (A_k: the trailing (n−k)×(n−k) block) and running determinant.
    let mut a_op = Operand::Input(0);
    let mut a_ty = cx.input_ty(0)?.clone();
    let mut d_op: Option<(Operand, TensorType)> = None;
    for k in 0..n {
        let s = n - k;
        // The pivot of A_k: first row of the largest |a[r, 0]|, and its value.
        let pivot = |b: &mut KernelBuilder, batch: &[ExprId]| -> (ExprId, ExprId) {
            let rv = b.new_var(s as u64);
            let rvx = b.var(rv);
            let z = b.index(0);
            let mut idx = batch.to_vec();
            idx.extend([rvx, z]);
            let x = b.load(0, idx);
            let ax = b.unary(UnaryOp::Abs, x);
            let p = b.reduce(ReduceOp::ArgMax { last: false }, vec![rv], ax);
            let mut idx = batch.to_vec();
            idx.extend([p, z]);
            let pv = b.load_with(0, idx, Bounds::Clamp);
            (p, pv)
        };
        // The determinant so far, times this pivot (negated when rows swap).
        {
            let last = k + 1 == n;
            let mut inputs = vec![a_ty.clone()];
            let mut operands = vec![a_op];
            if let Some((o, t)) = &d_op {
                inputs.push(t.clone());
                operands.push(*o);
            }
            let mut b = if last {
                cx.builder(0, inputs)
            } else {
                KernelBuilder::new(format!("{}_d{k}", cx.name), inputs, ty(cx, bd.clone())?)
            };
            let batch = b.out_index();
            let (p, pv) = pivot(&mut b, &batch);
            let prev = if d_op.is_some() { b.load(1, batch.clone()) } else { b.float(ct, 1.0) };
            let neg = b.unary(UnaryOp::Neg, prev);
            let z = b.index(0);
            let swapped = b.binary(BinaryOp::Ne, p, z);
            let sd = b.select(swapped, neg, prev);
            let dv = b.mul(sd, pv);
            let zf = b.float(ct, 0.0);
            let is0 = b.binary(BinaryOp::Eq, pv, zf);
            let v = b.select(is0, zf, dv);
            let root = store(&mut b, v);
            steps.push(Step { kernel: b.finish(root)?, operands });
            d_op = Some((Operand::Step(steps.len() - 1), ty(cx, bd.clone())?));
        }
        if s == 1 {
            break;
        }
        // A_{k+1}[i, j] = a[r', j+1] − (a[r', 0] / pivot)·a[p, j+1], r' the row i+1 after
        // the swap of rows 0 and p; zeros after a zero pivot.
        let mut nd = bd.clone();
        nd.extend([s - 1, s - 1]);
        let nty = ty(cx, nd)?;
        let mut b = KernelBuilder::new(format!("{}_a{k}", cx.name), vec![a_ty.clone()], nty.clone());
        let idx = b.out_index();
        let batch = idx[..nb].to_vec();
        let (p, pv) = pivot(&mut b, &batch);
        let (i, j) = (idx[nb], idx[nb + 1]);
        let r1 = affine(&mut b, i, 1, 1);
        let c1 = affine(&mut b, j, 1, 1);
        let z = b.index(0);
        let hit = b.binary(BinaryOp::Eq, r1, p);
        let rr = b.select(hit, z, r1);
        let at = |b: &mut KernelBuilder, row: ExprId, col: ExprId, bounds: Bounds| {
            let mut ix = batch.clone();
            ix.extend([row, col]);
            b.load_with(0, ix, bounds)
        };
        let x = at(&mut b, rr, c1, Bounds::InBounds);
        let x0 = at(&mut b, rr, z, Bounds::InBounds);
        let y = at(&mut b, p, c1, Bounds::Clamp);
        let f = b.div(x0, pv);
        let fy = b.mul(f, y);
        let v = b.sub(x, fy);
        let zf = b.float(ct, 0.0);
        let is0 = b.binary(BinaryOp::Eq, pv, zf);
        let v = b.select(is0, zf, v);
        let root = store(&mut b, v);
        steps.push(Step { kernel: b.finish(root)?, operands: vec![a_op] });
        a_op = Operand::Step(steps.len() - 1);
        a_ty = nty;
    }
    let outputs = vec![match d_op {
        Some((Operand::Step(s), _)) => Output::Step(s),
        _ => return Err(cx.unsupported("no determinant step")),
    }];
    Ok(Lowered { steps, outputs })
}
