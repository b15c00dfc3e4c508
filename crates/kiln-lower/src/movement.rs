//! Lowering of the data-movement and index-generating ops.
//!
//! - **Views** (Identity, Dropout's output, Reshape, Flatten, Squeeze, Unsqueeze, a
//!   Transpose that moves only axes of extent 1) are [`Output::Alias`] of their operand
//!   and cost nothing.
//! - **Re-indexing** (Transpose, Slice, Pad, Concat, Split, Expand, Tile, DepthToSpace,
//!   SpaceToDepth, Trilu) is one load per output element at an index that is affine in the
//!   output index (plus `div`/`rem` by constants, and `min`/`max` where Pad folds an index
//!   back into its axis), so the verifier proves every load in bounds. Shape-like operands
//!   (starts, pads, axes, repeats, k) are compile-time constants.
//! - **Data-dependent indexing** (Gather, GatherElements, GatherND, ReverseSequence, OneHot,
//!   the scatters) reads indices from a tensor: a negative index is wrapped once
//!   (`i < 0 ? i + n : i`) and the load that uses it clamps ([`Bounds::Clamp`]), so an
//!   invalid index reads some element of the tensor, never memory outside it.
//! - **Scatters** (ScatterElements, ScatterND) are scatter kernels
//!   (`kiln_flow::kernel`'s "Scatter kernels"): the output starts as the data, and each
//!   update, in row-major order over the updates, is stored at the output position its
//!   index names, combined with the element there by the reduction (add, mul, max, min;
//!   `or`/`and` for bool) or replacing it (`none`: the last update to an element wins,
//!   deterministically, where ONNX leaves duplicates undefined). An index is wrapped once
//!   when negative; an update whose index is still outside its axis is dropped (it writes
//!   nothing). The work is one step per update, not per output element. Data of a narrow
//!   float type (f16, bf16, 8-bit), whose elements would round between updates, take the
//!   gather form instead: an output element reduces over the update positions whose
//!   index hits it (the last such position for `none`, a `max` over `position + 1`).
//! - **Generators** (Range, ConstantOfShape, EyeLike, Shape, Size) are kernels without
//!   inputs (Range reads start and delta when they are not constants).
//! - **CumSum** is a masked sum over the scanned axis.
//! - **Resize** computes every source coordinate from the output index in `f64` with the
//!   operations of the reference, in the same order, so nearest picks exactly the reference's
//!   element; a nearest axis whose index table equals `clamp((i·P + Q) / R)` for small
//!   integers (checked against the table at compile time) uses that integer form instead.
//!   Linear and cubic weigh taps with the reference's formulas (antialias, exclude_outside
//!   included), one reduction variable per interpolated axis, the last axis innermost.
//!   `kiln_flow::resample` recognises exactly these forms and tabulates their indices and
//!   weights at compile time for the code generators: a change here must keep them.

use kiln_ir::attrs as ka;
use kiln_ir::attrs::{
    CoordinateTransformationMode as Ctm, NearestMode, ResizeMode as RMode, ScatterReduction as Reduction,
};
use kiln_ir::{DType, OpKind, Tensor, TensorType};

use super::{
    broadcast_index, flat_index, norm_axis, store, unflatten, LowerError, Lowered, OpCx, OpInput, Operand, Output, Step,
};
use kiln_flow::kernel::{BinaryOp, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType, UnaryOp, VarId};

type R<T> = Result<T, LowerError>;

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    use OpKind::*;
    let r = match cx.op.kind {
        Identity | Reshape | Flatten | Squeeze | Unsqueeze => view(cx),
        Dropout => dropout(cx),
        Transpose => transpose(cx),
        Slice => slice(cx),
        Pad => pad(cx),
        Concat => concat(cx),
        Split => split(cx),
        Gather => gather(cx),
        GatherElements => gather_elements(cx),
        GatherND => gather_nd(cx),
        Expand => expand(cx),
        Tile => tile(cx),
        DepthToSpace => depth_to_space(cx),
        SpaceToDepth => space_to_depth(cx),
        ReverseSequence => reverse_sequence(cx),
        Trilu => trilu(cx),
        OneHot => one_hot(cx),
        EyeLike => eye_like(cx),
        Range => range(cx),
        ConstantOfShape => constant_of_shape(cx),
        Shape => shape(cx),
        Size => size(cx),
        CumSum => cumsum(cx),
        ScatterElements => scatter_elements(cx),
        ScatterND => scatter_nd(cx),
        Resize => resize(cx),
        _ => return None,
    };
    Some(r)
}

// ---------------------------------------------------------------------------
// Shared helpers.
// ---------------------------------------------------------------------------

/// The kernel of result `result`; kernel input `j` is op operand `operands[j]`. `body`
/// gets the builder and the output index and returns the value before the store. An empty
/// result gets a kernel that reads nothing (its loads could not be proved in bounds, and
/// it has nothing to compute).
fn step<F>(cx: &OpCx<'_>, result: usize, operands: &[usize], body: F) -> R<Step>
where
    F: FnOnce(&mut KernelBuilder, &[ExprId]) -> R<ExprId>,
{
    step_with(cx, result, operands, body, store)
}

/// [`step`] whose value `body` returns is stored by `end` (the element-wise ops' own
/// `finish`; [`store`] for the others).
pub(crate) fn step_with<F>(
    cx: &OpCx<'_>,
    result: usize,
    operands: &[usize],
    body: F,
    end: fn(&mut KernelBuilder, ExprId) -> ExprId,
) -> R<Step>
where
    F: FnOnce(&mut KernelBuilder, &[ExprId]) -> R<ExprId>,
{
    let Some(out) = cx.outputs.get(result) else {
        return Err(cx.unsupported(format!("result {result} has no type")));
    };
    if out.shape.numel() == 0 {
        let mut b = cx.builder(result, Vec::new());
        let z = b.constant(ScalarType::of_storage(out.dtype), 0);
        let root = store(&mut b, z);
        return Ok(Step { kernel: b.finish(root)?, operands: Vec::new() });
    }
    let types = operands.iter().map(|&i| cx.input_ty(i).cloned()).collect::<R<Vec<TensorType>>>()?;
    let mut b = cx.builder(result, types);
    let index = b.out_index();
    let v = body(&mut b, &index)?;
    let root = end(&mut b, v);
    Ok(Step { kernel: b.finish(root)?, operands: operands.iter().map(|&i| Operand::Input(i)).collect() })
}

/// The op as the one kernel [`step`] builds for result 0.
pub(crate) fn single<F>(cx: &OpCx<'_>, operands: &[usize], body: F) -> R<Lowered>
where
    F: FnOnce(&mut KernelBuilder, &[ExprId]) -> R<ExprId>,
{
    Ok(Lowered { steps: vec![step(cx, 0, operands, body)?], outputs: vec![Output::Step(0)] })
}

/// Dimensions of operand `i`.
fn dims(cx: &OpCx<'_>, i: usize) -> R<Vec<usize>> {
    Ok(cx.input_ty(i)?.shape.dims().to_vec())
}

/// Dimensions of result `i`.
fn out_dims(cx: &OpCx<'_>, i: usize) -> R<Vec<usize>> {
    match cx.outputs.get(i) {
        Some(t) => Ok(t.shape.dims().to_vec()),
        None => Err(cx.unsupported(format!("result {i} has no type"))),
    }
}

/// Checks that result 0 has `want` as its dimensions.
fn expect_out(cx: &OpCx<'_>, want: &[usize]) -> R<()> {
    let got = out_dims(cx, 0)?;
    if got != want {
        return Err(cx.unsupported(format!("result type has dims {got:?}, the operands give {want:?}")));
    }
    Ok(())
}

/// A required constant integer operand.
fn req_ints(cx: &OpCx<'_>, i: usize, what: &str) -> R<Vec<i64>> {
    cx.const_ints(i, what)?.ok_or_else(|| cx.unsupported(format!("{what} (operand {i}) is missing")))
}

/// Axes normalised against `rank`, each at most once.
fn unique_axes(cx: &OpCx<'_>, axes: &[i64], rank: usize) -> R<Vec<usize>> {
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(cx, a, rank)?;
        if seen[n] {
            return Err(cx.unsupported(format!("axis {a} is listed twice")));
        }
        seen[n] = true;
        out.push(n);
    }
    Ok(out)
}

/// `e * scale + offset` (i64), without the operations that are identities.
fn affine(b: &mut KernelBuilder, e: ExprId, scale: i64, offset: i64) -> ExprId {
    if scale == 0 {
        return b.index(offset);
    }
    let s = if scale == 1 {
        e
    } else {
        let k = b.index(scale);
        b.mul(e, k)
    };
    add_c(b, s, offset)
}

/// `e + c` (i64).
fn add_c(b: &mut KernelBuilder, e: ExprId, c: i64) -> ExprId {
    if c == 0 {
        return e;
    }
    let k = b.index(c);
    b.add(e, k)
}

/// `e` (known to lie in `lo..=hi`) forced into `0..n` with `max`/`min` where the range
/// needs it; a no-op on the values the caller uses, it lets the verifier prove the load.
fn fit(b: &mut KernelBuilder, e: ExprId, lo: i64, hi: i64, n: usize) -> ExprId {
    let mut e = e;
    if hi > n as i64 - 1 {
        let k = b.index(n as i64 - 1);
        e = b.binary(BinaryOp::Min, e, k);
    }
    if lo < 0 {
        let k = b.index(0);
        e = b.binary(BinaryOp::Max, e, k);
    }
    e
}

/// `e` clamped into `0..n` (i64).
fn clamp_index(b: &mut KernelBuilder, e: ExprId, n: usize) -> ExprId {
    fit(b, e, -1, n as i64, n)
}

/// A data index as i64.
fn to_i64(b: &mut KernelBuilder, e: ExprId) -> ExprId {
    b.convert(e, ScalarType::I64)
}

/// A (possibly negative) index into an axis of `n`, wrapped once: `i < 0 ? i + n : i`.
fn wrap_neg(b: &mut KernelBuilder, i: ExprId, n: usize) -> ExprId {
    let z = b.index(0);
    let neg = b.binary(BinaryOp::Lt, i, z);
    let up = add_c(b, i, n as i64);
    b.select(neg, up, i)
}

/// A loaded index operand as an i64 wrapped into an axis of `n`.
fn data_index(b: &mut KernelBuilder, input: usize, index: Vec<ExprId>, n: usize) -> ExprId {
    let raw = b.load(input, index);
    let i = to_i64(b, raw);
    wrap_neg(b, i, n)
}

fn and(b: &mut KernelBuilder, acc: Option<ExprId>, c: ExprId) -> Option<ExprId> {
    Some(match acc {
        None => c,
        Some(a) => b.binary(BinaryOp::And, a, c),
    })
}

fn or(b: &mut KernelBuilder, acc: Option<ExprId>, c: ExprId) -> Option<ExprId> {
    Some(match acc {
        None => c,
        Some(a) => b.binary(BinaryOp::Or, a, c),
    })
}

/// Bits of element `i` of `t` as a value of compute type `ct`.
fn elem_bits(t: &Tensor, i: usize, ct: ScalarType) -> u64 {
    if t.dtype().is_float() {
        ct.bits_of_f64(t.to_f64_vec().get(i).copied().unwrap_or(0.0))
    } else {
        ct.bits_of_i64(t.to_i64_vec().ok().and_then(|v| v.get(i).copied()).unwrap_or(0))
    }
}

/// The row-major index of flat position `f` in `dims`, as constants.
fn const_index(b: &mut KernelBuilder, dims: &[usize], f: usize) -> Vec<ExprId> {
    let mut idx = vec![0i64; dims.len()];
    let mut rest = f;
    for d in (0..dims.len()).rev() {
        let n = dims[d].max(1);
        idx[d] = (rest % n) as i64;
        rest /= n;
    }
    idx.into_iter().map(|i| b.index(i)).collect()
}

/// The lowest value of `ct` (-inf for floats).
fn lowest(ct: ScalarType) -> u64 {
    if ct.is_float() {
        ct.bits_of_f64(f64::NEG_INFINITY)
    } else {
        ct.wrap(ct.int_range().0 as u64)
    }
}

/// The highest value of `ct` (+inf for floats).
fn highest(ct: ScalarType) -> u64 {
    if ct.is_float() {
        ct.bits_of_f64(f64::INFINITY)
    } else {
        ct.wrap(ct.int_range().1 as u64)
    }
}

// ---------------------------------------------------------------------------
// Views.
// ---------------------------------------------------------------------------

/// Checks that result `i` has operand 0's dtype and element count.
fn check_view(cx: &OpCx<'_>, i: usize) -> R<()> {
    let x = cx.input_ty(0)?;
    let Some(y) = cx.outputs.get(i) else {
        return Err(cx.unsupported(format!("result {i} has no type")));
    };
    if x.dtype != y.dtype || x.shape.numel() != y.shape.numel() {
        return Err(cx.unsupported(format!("result {y} is not a view of operand {x}")));
    }
    Ok(())
}

fn view(cx: &OpCx<'_>) -> R<Lowered> {
    if cx.outputs.len() != 1 {
        return Err(cx.unsupported(format!("{} results, 1 expected", cx.outputs.len())));
    }
    check_view(cx, 0)?;
    Ok(Lowered { steps: Vec::new(), outputs: vec![Output::Alias(0)] })
}

fn dropout(cx: &OpCx<'_>) -> R<Lowered> {
    let training = match cx.const_input(2, "training_mode")? {
        Some(t) => t.to_f64_vec().first().is_some_and(|&v| v != 0.0),
        None => false,
    };
    if training {
        let ratio = match cx.const_input(1, "ratio")? {
            Some(t) => t.to_f64_vec().first().copied().unwrap_or(0.5),
            None => 0.5,
        };
        if ratio != 0.0 {
            return Err(cx.unsupported("training mode with a non-zero ratio is random"));
        }
    }
    check_view(cx, 0)?;
    let mut lowered = Lowered { steps: Vec::new(), outputs: vec![Output::Alias(0)] };
    if cx.outputs.len() > 1 {
        lowered.steps.push(step(cx, 1, &[], |b, _| Ok(b.int(ScalarType::Bool, 1)))?);
        lowered.outputs.push(Output::Step(0));
    }
    Ok(lowered)
}

// ---------------------------------------------------------------------------
// Re-indexing.
// ---------------------------------------------------------------------------

fn transpose(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let r = xd.len();
    let perm: Vec<usize> = match &cx.attrs::<ka::TransposeAttrs>()?.perm {
        Some(p) => {
            let mut seen = vec![false; r];
            let ok = p.len() == r
                && p.iter().all(|&a| match usize::try_from(a) {
                    Ok(a) if a < r && !seen[a] => {
                        seen[a] = true;
                        true
                    }
                    _ => false,
                });
            if !ok {
                return Err(cx.unsupported(format!("perm {p:?} is not a permutation of rank {r}")));
            }
            p.iter().map(|&a| a as usize).collect()
        }
        None => (0..r).rev().collect(),
    };
    let want: Vec<usize> = perm.iter().map(|&p| xd[p]).collect();
    expect_out(cx, &want)?;
    // Only axes of extent 1 move (the others keep their order): the bytes are the
    // operand's, a view.
    let moved: Vec<usize> = perm.iter().copied().filter(|&p| xd[p] != 1).collect();
    if moved.windows(2).all(|w| w[0] < w[1]) {
        return view(cx);
    }
    single(cx, &[0], |b, out| {
        let mut idx = out.to_vec();
        for (k, &p) in perm.iter().enumerate() {
            idx[p] = out[k];
        }
        Ok(b.load(0, idx))
    })
}

fn slice(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let r = xd.len();
    let starts = req_ints(cx, 1, "starts")?;
    let ends = req_ints(cx, 2, "ends")?;
    let n = starts.len();
    let axes = cx.const_ints(3, "axes")?.unwrap_or_else(|| (0..n as i64).collect());
    let steps = cx.const_ints(4, "steps")?.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err(cx.unsupported("starts, ends, axes and steps differ in length"));
    }
    let axes = unique_axes(cx, &axes, r)?;
    let mut first = vec![0i64; r];
    let mut stride = vec![1i64; r];
    let mut want = xd.clone();
    for (k, &a) in axes.iter().enumerate() {
        let (d, st) = (xd[a] as i128, steps[k] as i128);
        if st == 0 {
            return Err(cx.unsupported("step 0"));
        }
        let (mut s, mut e) = (starts[k] as i128, ends[k] as i128);
        if s < 0 {
            s += d;
        }
        if e < 0 {
            e += d;
        }
        let count = if st > 0 {
            s = s.clamp(0, d);
            e = e.clamp(0, d);
            (e - s + st - 1).div_euclid(st).max(0)
        } else {
            s = s.max(0).min(d - 1);
            e = e.max(-1).min(d - 1);
            (s - e - st - 1).div_euclid(-st).max(0)
        };
        want[a] = count as usize;
        first[a] = s as i64;
        stride[a] = st.clamp(-(1 << 62), 1 << 62) as i64;
    }
    expect_out(cx, &want)?;
    single(cx, &[0], |b, out| {
        // With one element on an axis the step never matters (and may be huge).
        let idx = (0..r).map(|d| affine(b, out[d], if want[d] == 1 { 0 } else { stride[d] }, first[d])).collect();
        Ok(b.load(0, idx))
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PadMode {
    Constant,
    Edge,
    Reflect,
    Wrap,
}

fn pad(cx: &OpCx<'_>) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = x.shape.dims().to_vec();
    let r = xd.len();
    let pads = req_ints(cx, 1, "pads")?;
    let mode = match cx.attrs::<ka::PadAttrs>()?.mode {
        ka::PadMode::Constant => PadMode::Constant,
        ka::PadMode::Edge => PadMode::Edge,
        ka::PadMode::Reflect => PadMode::Reflect,
        ka::PadMode::Wrap => PadMode::Wrap,
    };
    let axes = match cx.const_ints(3, "axes")? {
        Some(a) => unique_axes(cx, &a, r)?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.unsupported(format!("{} pads for {} axes", pads.len(), axes.len())));
    }
    // Per axis: (elements cropped at the start, length kept, elements added at the start),
    // the cropping done before the padding.
    let mut plan: Vec<Option<(i64, i64, i64)>> = vec![None; r];
    let mut want = xd.clone();
    let mut grows = false;
    for (k, &a) in axes.iter().enumerate() {
        let (pb, pe) = (pads[k] as i128, pads[k + axes.len()] as i128);
        if pb == 0 && pe == 0 {
            continue;
        }
        let d = xd[a] as i128;
        let len = d - (-pb).max(0) - (-pe).max(0);
        if len < 0 {
            return Err(cx.unsupported(format!("pads {pb}, {pe} crop more than the {d} elements of axis {a}")));
        }
        let n = pb.max(0) + len + pe.max(0);
        if n > u32::MAX as i128 {
            return Err(cx.unsupported("result too large"));
        }
        if len == 0 && mode != PadMode::Constant && n > 0 {
            return Err(cx.unsupported(format!("cannot pad an empty axis in mode {mode:?}")));
        }
        grows |= pb > 0 || pe > 0;
        plan[a] = Some(((-pb).max(0) as i64, len as i64, pb.max(0) as i64));
        want[a] = n as usize;
    }
    expect_out(cx, &want)?;
    let ct = ScalarType::of_storage(x.dtype);
    // The pad value: a constant, or operand 2 read at run time.
    let runtime_value = match cx.input(2) {
        Some(v) if v.value.is_none() && v.ty.shape.numel() > 0 => Some(v.ty.shape.rank()),
        _ => None,
    };
    let pad_bits = match cx.input(2) {
        Some(OpInput { value: Some(t), .. }) if t.numel() > 0 => elem_bits(t, 0, ct),
        _ => 0,
    };
    let needs_value = mode == PadMode::Constant && grows;
    let operands: &[usize] = if needs_value && runtime_value.is_some() { &[0, 2] } else { &[0] };
    single(cx, operands, |b, out| {
        let mut idx = out.to_vec();
        let mut inside: Option<ExprId> = None;
        for (a, p) in plan.iter().enumerate() {
            let Some((crop, len, add)) = *p else { continue };
            let v = out[a];
            idx[a] = match mode {
                PadMode::Constant => {
                    let i = add_c(b, v, crop - add);
                    if needs_value && runtime_value.is_some() {
                        let z = b.index(0);
                        let ge = b.binary(BinaryOp::Ge, i, z);
                        let n = b.index(xd[a] as i64);
                        let lt = b.binary(BinaryOp::Lt, i, n);
                        let c = b.binary(BinaryOp::And, ge, lt);
                        inside = and(b, inside, c);
                    }
                    i
                }
                PadMode::Edge => {
                    let i = add_c(b, v, -add);
                    let hi = want[a] as i64 - 1 - add;
                    let i = fit(b, i, -add, hi, len as usize);
                    add_c(b, i, crop)
                }
                PadMode::Wrap => {
                    // i + m*len with m*len >= add keeps the dividend non-negative.
                    let m = (add + len - 1) / len * len;
                    let i = add_c(b, v, m - add);
                    let n = b.index(len);
                    let i = b.binary(BinaryOp::Rem, i, n);
                    add_c(b, i, crop)
                }
                PadMode::Reflect if len == 1 => b.index(crop),
                PadMode::Reflect => {
                    let p = 2 * (len - 1);
                    let m = (add + p - 1) / p * p;
                    let i = add_c(b, v, m - add);
                    let pk = b.index(p);
                    let i = b.binary(BinaryOp::Rem, i, pk);
                    // Folded back: min(i, p - i), which is below len; the last min only
                    // tells the verifier so.
                    let back = b.sub(pk, i);
                    let f = b.binary(BinaryOp::Min, i, back);
                    let last = b.index(len - 1);
                    let f = b.binary(BinaryOp::Min, f, last);
                    add_c(b, f, crop)
                }
            };
        }
        if !needs_value {
            return Ok(b.load(0, idx));
        }
        match (runtime_value, inside) {
            (Some(rank), Some(inside)) => {
                let xv = b.load_with(0, idx, Bounds::Clamp);
                let zeros = vec![b.index(0); rank];
                let pv = b.load(1, zeros);
                let pv = b.convert(pv, ct);
                Ok(b.select(inside, xv, pv))
            }
            _ => Ok(b.load_with(0, idx, Bounds::Pad(pad_bits))),
        }
    })
}

fn concat(cx: &OpCx<'_>) -> R<Lowered> {
    let od = out_dims(cx, 0)?;
    let r = od.len();
    let a = norm_axis(cx, cx.attrs::<ka::ConcatAttrs>()?.axis, r)?;
    // (operand, offset on the axis, extent on the axis) of every non-empty piece.
    let mut pieces: Vec<(usize, i64, i64)> = Vec::new();
    let mut off = 0i64;
    for i in 0..cx.inputs.len() {
        let d = dims(cx, i)?;
        if d.len() != r || d.iter().zip(&od).enumerate().any(|(k, (x, y))| k != a && x != y) {
            return Err(cx.unsupported(format!("operand {i} of dims {d:?} does not fit a result of {od:?}")));
        }
        if d[a] > 0 {
            pieces.push((i, off, d[a] as i64));
        }
        off += d[a] as i64;
    }
    if off != od[a] as i64 {
        return Err(cx.unsupported(format!("operands give {off} elements on axis {a}, the result has {}", od[a])));
    }
    let operands: Vec<usize> = pieces.iter().map(|p| p.0).collect();
    let total = off;
    single(cx, &operands, |b, out| {
        let v = out[a];
        let mut value: Option<ExprId> = None;
        for (j, &(_, off, len)) in pieces.iter().enumerate().rev() {
            let mut idx = out.to_vec();
            let i = add_c(b, v, -off);
            idx[a] = fit(b, i, -off, total - 1 - off, len as usize);
            let x = b.load(j, idx);
            value = Some(match value {
                None => x,
                Some(rest) => {
                    let end = b.index(off + len);
                    let c = b.binary(BinaryOp::Lt, v, end);
                    b.select(c, x, rest)
                }
            });
        }
        value.ok_or_else(|| cx.unsupported("no operand has elements"))
    })
}

fn split(cx: &OpCx<'_>) -> R<Lowered> {
    let axis = cx.attrs::<ka::SplitAttrs>()?.axis;
    let xd = dims(cx, 0)?;
    let r = xd.len();
    let a = norm_axis(cx, axis, r)?;
    // The results are consecutive chunks of the axis; their types give the chunk sizes
    // (the `split` operand or `num_outputs` decided them in shape inference).
    let mut steps = Vec::with_capacity(cx.outputs.len());
    let mut start = 0usize;
    for (i, ty) in cx.outputs.iter().enumerate() {
        let d = ty.shape.dims();
        if d.len() != r || d.iter().zip(&xd).enumerate().any(|(k, (x, y))| k != a && x != y) {
            return Err(cx.unsupported(format!("result {i} of dims {d:?} is not a chunk of {xd:?}")));
        }
        let s = start as i64;
        steps.push(step(cx, i, &[0], |b, out| {
            let mut idx = out.to_vec();
            idx[a] = add_c(b, out[a], s);
            Ok(b.load(0, idx))
        })?);
        start += d[a];
    }
    if start > xd[a] {
        return Err(cx.unsupported(format!("chunks of {start} elements exceed the axis of {}", xd[a])));
    }
    let outputs = (0..steps.len()).map(Output::Step).collect();
    Ok(Lowered { steps, outputs })
}

fn expand(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let od = out_dims(cx, 0)?;
    let skip = od.len().checked_sub(xd.len());
    let ok = skip.is_some_and(|s| xd.iter().zip(&od[s..]).all(|(&x, &o)| x == o || x == 1));
    if !ok {
        return Err(cx.unsupported(format!("dims {xd:?} do not broadcast to {od:?}")));
    }
    single(cx, &[0], |b, out| {
        let idx = broadcast_index(b, &xd, out);
        Ok(b.load(0, idx))
    })
}

fn tile(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let od = out_dims(cx, 0)?;
    // The result type holds the repeats (`od = xd · repeats`); a constant repeats operand
    // must agree with it.
    if let Some(reps) = cx.input(1).and_then(|i| i.value).and_then(|t| t.to_i64_vec().ok()) {
        let want: Vec<i64> = xd.iter().zip(&od).map(|(&d, &o)| o.checked_div(d).map_or(-1, |r| r as i64)).collect();
        if reps.len() != xd.len() || reps.iter().zip(&want).any(|(&r, &w)| w >= 0 && r != w) {
            return Err(cx.unsupported(format!("repeats {reps:?} do not turn {xd:?} into {od:?}")));
        }
    }
    if od.len() != xd.len() || xd.iter().zip(&od).any(|(&d, &o)| if d == 0 { o != 0 } else { o % d != 0 }) {
        return Err(cx.unsupported(format!("dims {od:?} do not repeat {xd:?}")));
    }
    single(cx, &[0], |b, out| {
        let idx = (0..xd.len())
            .map(|d| {
                if od[d] == xd[d] {
                    out[d]
                } else {
                    let n = b.index(xd[d] as i64);
                    b.binary(BinaryOp::Rem, out[d], n)
                }
            })
            .collect();
        Ok(b.load(0, idx))
    })
}

/// `(N, C, H, W)` of a rank-4 operand 0 and the block size.
fn nchw_block(cx: &OpCx<'_>) -> R<([usize; 4], usize)> {
    let d = dims(cx, 0)?;
    let dims: [usize; 4] =
        d.as_slice().try_into().map_err(|_| cx.unsupported(format!("operand rank {} is not 4", d.len())))?;
    let b = match cx.op.kind {
        OpKind::DepthToSpace => cx.attrs::<ka::DepthToSpaceAttrs>()?.blocksize,
        _ => cx.attrs::<ka::SpaceToDepthAttrs>()?.blocksize,
    };
    if b <= 0 {
        return Err(cx.unsupported(format!("blocksize {b}")));
    }
    Ok((dims, b as usize))
}

fn depth_to_space(cx: &OpCx<'_>) -> R<Lowered> {
    let ([n, c, h, w], bs) = nchw_block(cx)?;
    if c % (bs * bs) != 0 {
        return Err(cx.unsupported(format!("channels {c} not divisible by blocksize² {}", bs * bs)));
    }
    let co = c / (bs * bs);
    expect_out(cx, &[n, co, h * bs, w * bs])?;
    let dcr = cx.attrs::<ka::DepthToSpaceAttrs>()?.mode == ka::DepthToSpaceMode::Dcr;
    let (bs, co) = (bs as i64, co as i64);
    single(cx, &[0], |b, out| {
        let k = b.index(bs);
        let (hh, i) = (b.div(out[2], k), b.binary(BinaryOp::Rem, out[2], k));
        let (ww, j) = (b.div(out[3], k), b.binary(BinaryOp::Rem, out[3], k));
        // DCR: channel (i*b + j)*C' + c'; CRD: channel c'*b*b + i*b + j.
        let (sc, si, sj) = if dcr { (1, bs * co, co) } else { (bs * bs, bs, 1) };
        let ch = affine(b, out[1], sc, 0);
        let ti = affine(b, i, si, 0);
        let tj = affine(b, j, sj, 0);
        let ch = b.add(ch, ti);
        let ch = b.add(ch, tj);
        Ok(b.load(0, vec![out[0], ch, hh, ww]))
    })
}

fn space_to_depth(cx: &OpCx<'_>) -> R<Lowered> {
    let ([n, c, h, w], bs) = nchw_block(cx)?;
    if h % bs != 0 || w % bs != 0 {
        return Err(cx.unsupported(format!("spatial dims {h}x{w} not divisible by blocksize {bs}")));
    }
    expect_out(cx, &[n, c * bs * bs, h / bs, w / bs])?;
    let (bs, c) = (bs as i64, c as i64);
    single(cx, &[0], |b, out| {
        // Output channel (i*b + j)*C + c reads (c, h'*b + i, w'*b + j).
        let ck = b.index(c);
        let cc = b.binary(BinaryOp::Rem, out[1], ck);
        let ij = b.div(out[1], ck);
        let k = b.index(bs);
        let i = b.div(ij, k);
        let j = b.binary(BinaryOp::Rem, ij, k);
        let hh = affine(b, out[2], bs, 0);
        let hh = b.add(hh, i);
        let ww = affine(b, out[3], bs, 0);
        let ww = b.add(ww, j);
        Ok(b.load(0, vec![out[0], cc, hh, ww]))
    })
}

fn reverse_sequence(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    if xd.len() < 2 {
        return Err(cx.unsupported(format!("operand rank {} < 2", xd.len())));
    }
    let ra = cx.attrs::<ka::ReverseSequenceAttrs>()?;
    let (ba, ta) = (ra.batch_axis, ra.time_axis);
    let (ba, ta) = match (ba, ta) {
        (0, 1) => (0, 1),
        (1, 0) => (1, 0),
        _ => return Err(cx.unsupported(format!("batch_axis {ba} and time_axis {ta} must be 0 and 1"))),
    };
    let ld = dims(cx, 1)?;
    if ld != [xd[ba]] {
        return Err(cx.unsupported(format!("sequence_lens of dims {ld:?} for a batch of {}", xd[ba])));
    }
    expect_out(cx, &xd)?;
    single(cx, &[0, 1], |b, out| {
        let len = b.load(1, vec![out[ba]]);
        let len = to_i64(b, len);
        let t = out[ta];
        let within = b.binary(BinaryOp::Lt, t, len);
        let last = add_c(b, len, -1);
        let back = b.sub(last, t);
        let src = b.select(within, back, t);
        let mut idx = out.to_vec();
        idx[ta] = src;
        Ok(b.load_with(0, idx, Bounds::Clamp))
    })
}

fn trilu(cx: &OpCx<'_>) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = x.shape.dims().to_vec();
    let r = xd.len();
    if r < 2 {
        return Err(cx.unsupported(format!("operand rank {r} < 2")));
    }
    let k = match cx.const_ints(1, "k")? {
        None => 0,
        Some(v) if v.len() == 1 => v[0],
        Some(v) => return Err(cx.unsupported(format!("k has {} elements", v.len()))),
    };
    let upper = cx.attrs::<ka::TriluAttrs>()?.upper;
    expect_out(cx, &xd)?;
    let ct = ScalarType::of_storage(x.dtype);
    single(cx, &[0], |b, out| {
        // Kept: j - i >= k (upper) or j - i <= k (lower).
        let diff = b.sub(out[r - 1], out[r - 2]);
        let kk = b.index(k);
        let keep = b.binary(if upper { BinaryOp::Ge } else { BinaryOp::Le }, diff, kk);
        let v = b.load(0, out.to_vec());
        let z = b.constant(ct, 0);
        Ok(b.select(keep, v, z))
    })
}

// ---------------------------------------------------------------------------
// Data-dependent indexing.
// ---------------------------------------------------------------------------

/// Gather's and GatherElements' data dims, index dims and normalised axis.
fn gather_operands(cx: &OpCx<'_>) -> R<(Vec<usize>, Vec<usize>, usize)> {
    let axis = cx.attrs::<ka::GatherAttrs>()?.axis;
    let xd = dims(cx, 0)?;
    let id = dims(cx, 1)?;
    let a = norm_axis(cx, axis, xd.len())?;
    Ok((xd, id, a))
}

/// Whether indices of dims `id` fit data of dims `xd` element by element along axis `a`
/// (GatherElements, ScatterElements): the same rank, no larger on the other axes.
fn fits_along(xd: &[usize], id: &[usize], a: usize) -> bool {
    id.len() == xd.len() && id.iter().zip(xd).enumerate().all(|(d, (&m, &n))| d == a || m <= n)
}

fn gather(cx: &OpCx<'_>) -> R<Lowered> {
    let (xd, id, a) = gather_operands(cx)?;
    let q = id.len();
    let want: Vec<usize> = xd[..a].iter().chain(&id).chain(&xd[a + 1..]).copied().collect();
    expect_out(cx, &want)?;
    let n = xd[a];
    // Constant indices that form a progression (a scalar, or a rank-1 run) become an
    // affine index that the verifier proves in bounds.
    if let Some(t) = cx.input(1).and_then(|i| i.value) {
        if let Ok(v) = t.to_i64_vec() {
            let norm: Vec<i64> = v.iter().map(|&k| if k < 0 { k + n as i64 } else { k }).collect();
            let in_range = norm.iter().all(|&k| (0..n as i64).contains(&k));
            let st = if norm.len() > 1 { norm[1] - norm[0] } else { 0 };
            let progression = norm.iter().enumerate().all(|(i, &k)| k == norm[0] + st * i as i64);
            if in_range && progression && q <= 1 && !norm.is_empty() {
                let first = norm[0];
                return single(cx, &[0], |b, out| {
                    let k = if q == 0 { b.index(first) } else { affine(b, out[a], st, first) };
                    let mut idx = out[..a].to_vec();
                    idx.push(k);
                    idx.extend_from_slice(&out[a + q..]);
                    Ok(b.load(0, idx))
                });
            }
        }
    }
    single(cx, &[0, 1], |b, out| {
        let k = data_index(b, 1, out[a..a + q].to_vec(), n);
        let mut idx = out[..a].to_vec();
        idx.push(k);
        idx.extend_from_slice(&out[a + q..]);
        Ok(b.load_with(0, idx, Bounds::Clamp))
    })
}

fn gather_elements(cx: &OpCx<'_>) -> R<Lowered> {
    let (xd, id, a) = gather_operands(cx)?;
    if !fits_along(&xd, &id, a) {
        return Err(cx.unsupported(format!("indices of dims {id:?} do not fit data of dims {xd:?}")));
    }
    expect_out(cx, &id)?;
    single(cx, &[0, 1], |b, out| {
        let k = data_index(b, 1, out.to_vec(), xd[a]);
        let mut idx = out.to_vec();
        idx[a] = k;
        Ok(b.load_with(0, idx, Bounds::Clamp))
    })
}

fn gather_nd(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let id = dims(cx, 1)?;
    let bd = cx.attrs::<ka::GatherNdAttrs>()?.batch_dims;
    let q = id.len();
    let bd = usize::try_from(bd).map_err(|_| cx.unsupported(format!("batch_dims {bd}")))?;
    if q == 0 || bd >= q || bd > xd.len() || xd[..bd] != id[..bd] || bd + id[q - 1] > xd.len() {
        return Err(cx.unsupported(format!("indices of dims {id:?} do not fit data of dims {xd:?}")));
    }
    let m = id[q - 1];
    let want: Vec<usize> = id[..q - 1].iter().chain(&xd[bd + m..]).copied().collect();
    expect_out(cx, &want)?;
    single(cx, &[0, 1], |b, out| {
        let mut idx = out[..bd].to_vec();
        for j in 0..m {
            let mut ii = out[..q - 1].to_vec();
            ii.push(b.index(j as i64));
            idx.push(data_index(b, 1, ii, xd[bd + j]));
        }
        idx.extend_from_slice(&out[q - 1..]);
        Ok(b.load_with(0, idx, Bounds::Clamp))
    })
}

fn one_hot(cx: &OpCx<'_>) -> R<Lowered> {
    let it = cx.input_ty(0)?;
    let r = it.shape.rank();
    let a = norm_axis(cx, cx.attrs::<ka::OneHotAttrs>()?.axis, r + 1)?;
    let od = out_dims(cx, 0)?;
    let want_rest: Vec<usize> = it.shape.dims().to_vec();
    if od.len() != r + 1 || od[..a] != want_rest[..a] || od[a + 1..] != want_rest[a..] {
        return Err(cx.unsupported(format!("result dims {od:?} for indices {it}")));
    }
    let depth = od[a] as i64;
    let vd = dims(cx, 2)?;
    if vd.iter().product::<usize>() != 2 {
        return Err(cx.unsupported(format!("values of dims {vd:?}, 2 elements expected")));
    }
    let float = it.dtype.is_float();
    let mut lowered = single(cx, &[0, 2], |b, out| {
        let mut ii = out[..a].to_vec();
        ii.extend_from_slice(&out[a + 1..]);
        let raw = b.load(0, ii);
        // Float indices truncate toward zero; NaN is no index at all.
        let k = to_i64(b, raw);
        let p = out[a];
        let h1 = b.binary(BinaryOp::Eq, k, p);
        let pm = add_c(b, p, -depth);
        let h2 = b.binary(BinaryOp::Eq, k, pm);
        let mut hit = b.binary(BinaryOp::Or, h1, h2);
        if float {
            let nan = b.unary(UnaryOp::IsNan, raw);
            let ok = b.unary(UnaryOp::Not, nan);
            hit = b.binary(BinaryOp::And, hit, ok);
        }
        let on_i = const_index(b, &vd, 1);
        let off_i = const_index(b, &vd, 0);
        let on = b.load(1, on_i);
        let off = b.load(1, off_i);
        Ok(b.select(hit, on, off))
    })?;
    if cx.outputs.len() > 1 {
        // A run-time depth (kiln_ir::dynamic): it must truncate to the compiled extent.
        let rank = cx.input_ty(1)?.shape.rank();
        lowered.steps.push(step(cx, 1, &[1], |b, _| {
            let z = vec![b.index(0); rank];
            let d = b.load(0, z);
            let d = to_i64(b, d);
            let want = b.int(ScalarType::I64, depth);
            let ne = b.binary(BinaryOp::Ne, d, want);
            let one = b.int(ScalarType::I64, 1);
            let zero = b.int(ScalarType::I64, 0);
            Ok(b.select(ne, one, zero))
        })?);
        lowered.outputs.push(Output::Step(1));
    }
    Ok(lowered)
}

fn reduction(cx: &OpCx<'_>) -> R<Reduction> {
    Ok(match cx.op.kind {
        OpKind::ScatterElements => cx.attrs::<ka::ScatterElementsAttrs>()?.reduction,
        _ => cx.attrs::<ka::ScatterNdAttrs>()?.reduction,
    })
}

/// How a scatter reduction folds the updates that hit one element and combines the fold
/// with the data element: (fold, combination, identity of both). Bool adds as `or` and
/// multiplies as `and`. (`None` takes the last update and never asks.)
fn reduction_ops(r: Reduction, ct: ScalarType) -> (ReduceOp, BinaryOp, u64) {
    let boolean = ct == ScalarType::Bool;
    match r {
        Reduction::Add if boolean => (ReduceOp::Max, BinaryOp::Or, 0),
        Reduction::Mul if boolean => (ReduceOp::Min, BinaryOp::And, 1),
        Reduction::Add => (ReduceOp::Sum, BinaryOp::Add, 0),
        Reduction::Mul => (ReduceOp::Prod, BinaryOp::Mul, ct.bits_of_i64(1)),
        Reduction::Max => (ReduceOp::Max, BinaryOp::Max, lowest(ct)),
        Reduction::Min | Reduction::None => (ReduceOp::Min, BinaryOp::Min, highest(ct)),
    }
}

/// The value of a scatter at one output element. `hit` says whether the update at the
/// position of the reduction variables `vars` (flat position `flat`, of `count`) lands on
/// the element, `update(b, position)` loads the update at a position (the variables, or
/// the flat position of the last hit); `data` is the data element.
#[allow(clippy::too_many_arguments)]
fn scatter_value(
    b: &mut KernelBuilder,
    red: Reduction,
    vars: Vec<VarId>,
    hit: ExprId,
    flat: ExprId,
    count: usize,
    data: ExprId,
    update: &mut dyn FnMut(&mut KernelBuilder, Option<ExprId>) -> ExprId,
) -> ExprId {
    let ct = b.ty(data);
    if red == Reduction::None {
        // The last position that hits, plus one (0: none).
        let next = add_c(b, flat, 1);
        let z = b.index(0);
        let body = b.select(hit, next, z);
        let m = b.reduce(ReduceOp::Max, vars, body);
        let any = b.binary(BinaryOp::Gt, m, z);
        let last = add_c(b, m, -1);
        let last = clamp_index(b, last, count);
        let u = update(b, Some(last));
        return b.select(any, u, data);
    }
    let (fold, comb, ident) = reduction_ops(red, ct);
    let u = update(b, None);
    let id = b.constant(ct, ident);
    let body = b.select(hit, u, id);
    let folded = b.reduce(fold, vars, body);
    b.binary(comb, data, folded)
}

/// A scatter (operands data, indices, updates) as a scatter kernel over the updates'
/// index space `ud` (see the module docs); `None` where the data's type would round
/// between updates (the caller takes the gather form). `place(b, u)` gives, for update
/// position `u`, the output position it goes to and which of its coordinates come from
/// the indices (those are checked against their axis: outside it, the update is
/// dropped; the others are in range by the shapes).
fn scatter_store<F>(cx: &OpCx<'_>, red: Reduction, ud: &[usize], place: F) -> R<Option<Lowered>>
where
    F: FnOnce(&mut KernelBuilder, &[ExprId]) -> R<(Vec<ExprId>, Vec<usize>)>,
{
    let Some(out) = cx.outputs.first() else {
        return Err(cx.unsupported("the result has no type"));
    };
    let ct = ScalarType::of_storage(out.dtype);
    if ct.dtype() != out.dtype || cx.input_ty(0)? != out {
        return Ok(None);
    }
    let xd = out.shape.dims().to_vec();
    let boolean = ct == ScalarType::Bool;
    let combine = match red {
        Reduction::None => None,
        Reduction::Add | Reduction::Max if boolean => Some(BinaryOp::Or),
        Reduction::Mul | Reduction::Min if boolean => Some(BinaryOp::And),
        Reduction::Add => Some(BinaryOp::Add),
        Reduction::Mul => Some(BinaryOp::Mul),
        Reduction::Max => Some(BinaryOp::Max),
        Reduction::Min => Some(BinaryOp::Min),
    };
    let types = (0..3).map(|i| cx.input_ty(i).cloned()).collect::<R<Vec<TensorType>>>()?;
    let mut b = cx.builder(0, types);
    let domain: Vec<u64> = ud.iter().map(|&d| d as u64).collect();
    let u = b.scatter_domain(&domain);
    let (pos, checked) = place(&mut b, &u)?;
    let mut valid: Option<ExprId> = None;
    for &d in &checked {
        let z = b.index(0);
        let lo = b.binary(BinaryOp::Ge, pos[d], z);
        let n = b.index(xd[d] as i64);
        let hi = b.binary(BinaryOp::Lt, pos[d], n);
        valid = and(&mut b, valid, lo);
        valid = and(&mut b, valid, hi);
    }
    let flat = flat_index(&mut b, &xd, &pos);
    let at = match valid {
        Some(v) => {
            let none = b.index(-1);
            b.select(v, flat, none)
        }
        None => flat,
    };
    let value = b.load(2, u);
    let kernel = b.finish_scatter(value, at, combine)?;
    let step = Step { kernel, operands: (0..3).map(Operand::Input).collect() };
    Ok(Some(Lowered { steps: vec![step], outputs: vec![Output::Step(0)] }))
}

fn scatter_elements(cx: &OpCx<'_>) -> R<Lowered> {
    let axis = cx.attrs::<ka::ScatterElementsAttrs>()?.axis;
    let xd = dims(cx, 0)?;
    let id = dims(cx, 1)?;
    let ud = dims(cx, 2)?;
    let r = xd.len();
    let a = norm_axis(cx, axis, r)?;
    if ud != id || !fits_along(&xd, &id, a) {
        return Err(cx.unsupported(format!("indices {id:?} / updates {ud:?} do not fit data of dims {xd:?}")));
    }
    let red = reduction(cx)?;
    expect_out(cx, &xd)?;
    if id.contains(&0) {
        return single(cx, &[0], |b, out| Ok(b.load(0, out.to_vec())));
    }
    if let Some(s) = scatter_store(cx, red, &ud, |b, u| {
        // Update u goes to u with its axis coordinate replaced by the index there.
        let k = data_index(b, 1, u.to_vec(), xd[a]);
        let mut pos = u.to_vec();
        pos[a] = k;
        Ok((pos, vec![a]))
    })? {
        return Ok(s);
    }
    single(cx, &[0, 1, 2], |b, out| {
        let data = b.load(0, out.to_vec());
        // Update position u: u_d = p_d off the axis (p_d must be within the indices'
        // extent), the reduction variable t on it.
        let mut valid: Option<ExprId> = None;
        let mut u = out.to_vec();
        for d in 0..r {
            if d != a && id[d] < xd[d] {
                let n = b.index(id[d] as i64);
                let c = b.binary(BinaryOp::Lt, out[d], n);
                valid = and(b, valid, c);
                u[d] = fit(b, out[d], 0, xd[d] as i64 - 1, id[d]);
            }
        }
        let t = b.new_var(id[a] as u64);
        let tv = b.var(t);
        let mut ut = u.clone();
        ut[a] = tv;
        let k = data_index(b, 1, ut.clone(), xd[a]);
        let mut hit = b.binary(BinaryOp::Eq, k, out[a]);
        if let Some(v) = valid {
            hit = b.binary(BinaryOp::And, hit, v);
        }
        let mut update = |b: &mut KernelBuilder, last: Option<ExprId>| {
            let mut ui = ut.clone();
            if let Some(l) = last {
                ui[a] = l;
            }
            b.load(2, ui)
        };
        Ok(scatter_value(b, red, vec![t], hit, tv, id[a], data, &mut update))
    })
}

fn scatter_nd(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let id = dims(cx, 1)?;
    let ud = dims(cx, 2)?;
    let q = id.len();
    if q == 0 || id[q - 1] > xd.len() {
        return Err(cx.unsupported(format!("indices of dims {id:?} do not fit data of dims {xd:?}")));
    }
    let m = id[q - 1];
    let tuples: Vec<usize> = id[..q - 1].to_vec();
    let want_u: Vec<usize> = tuples.iter().chain(&xd[m..]).copied().collect();
    if ud != want_u {
        return Err(cx.unsupported(format!("updates of dims {ud:?}, {want_u:?} expected")));
    }
    let red = reduction(cx)?;
    expect_out(cx, &xd)?;
    let count: usize = tuples.iter().product();
    if count == 0 {
        return single(cx, &[0], |b, out| Ok(b.load(0, out.to_vec())));
    }
    let tq = tuples.len();
    if let Some(s) = scatter_store(cx, red, &ud, |b, u| {
        // Update (t, rest) goes to (indices[t, 0..m], rest).
        let mut pos = Vec::with_capacity(xd.len());
        for j in 0..m {
            let mut ii = u[..tq].to_vec();
            ii.push(b.index(j as i64));
            pos.push(data_index(b, 1, ii, xd[j]));
        }
        pos.extend_from_slice(&u[tq..]);
        Ok((pos, (0..m).collect()))
    })? {
        return Ok(s);
    }
    single(cx, &[0, 1, 2], |b, out| {
        let data = b.load(0, out.to_vec());
        // One reduction variable per tuple dimension (a single tuple still needs one).
        let mut vars: Vec<VarId> = tuples.iter().map(|&e| b.new_var(e as u64)).collect();
        let ts: Vec<ExprId> = vars.iter().map(|&v| b.var(v)).collect();
        if vars.is_empty() {
            vars.push(b.new_var(1));
        }
        let mut hit: Option<ExprId> = None;
        for j in 0..m {
            let mut ii = ts.clone();
            ii.push(b.index(j as i64));
            let k = data_index(b, 1, ii, xd[j]);
            let c = b.binary(BinaryOp::Eq, k, out[j]);
            hit = and(b, hit, c);
        }
        let hit = match hit {
            Some(h) => h,
            None => b.int(ScalarType::Bool, 1),
        };
        let flat = flat_index(b, &tuples, &ts);
        let rest = out[m..].to_vec();
        let mut update = |b: &mut KernelBuilder, last: Option<ExprId>| {
            let mut ui = match last {
                Some(l) => unflatten(b, &tuples, l),
                None => ts.clone(),
            };
            ui.extend_from_slice(&rest);
            b.load(2, ui)
        };
        Ok(scatter_value(b, red, vars, hit, flat, count, data, &mut update))
    })
}

// ---------------------------------------------------------------------------
// Generators.
// ---------------------------------------------------------------------------

fn eye_like(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    if xd.len() != 2 {
        return Err(cx.unsupported(format!("operand rank {} is not 2", xd.len())));
    }
    expect_out(cx, &xd)?;
    let k = cx.attrs::<ka::EyeLikeAttrs>()?.k;
    let ct = ScalarType::of_storage(cx.outputs[0].dtype);
    single(cx, &[], |b, out| {
        let diff = b.sub(out[1], out[0]);
        let kk = b.index(k);
        let on = b.binary(BinaryOp::Eq, diff, kk);
        let one = b.int(ct, 1);
        let zero = b.int(ct, 0);
        Ok(b.select(on, one, zero))
    })
}

/// A scalar operand of Range: its constant value, or the kernel input that holds it.
enum Scalar {
    Const(f64, i64),
    Input(usize, usize),
}

fn range(cx: &OpCx<'_>) -> R<Lowered> {
    let od = out_dims(cx, 0)?;
    if od.len() != 1 {
        return Err(cx.unsupported(format!("result dims {od:?}, rank 1 expected")));
    }
    let dt = cx.outputs[0].dtype;
    let mut operands = Vec::new();
    let mut scalar = |i: usize| -> R<Scalar> {
        let inp = cx.input(i).ok_or_else(|| cx.unsupported(format!("operand {i} is absent")))?;
        if inp.ty.shape.numel() != 1 {
            return Err(cx.unsupported(format!("operand {i} is {}, a scalar expected", inp.ty)));
        }
        Ok(match inp.value {
            Some(t) => Scalar::Const(
                t.to_f64_vec().first().copied().unwrap_or(0.0),
                t.to_i64_vec().ok().and_then(|v| v.first().copied()).unwrap_or(0),
            ),
            None => {
                operands.push(i);
                Scalar::Input(operands.len() - 1, inp.ty.shape.rank())
            }
        })
    };
    let start = scalar(0)?;
    let delta = scalar(2)?;
    let float = dt.is_float();
    if dt == DType::Bool {
        return Err(cx.unsupported("bool range"));
    }
    // Floats compute start + i·delta in f64 and round once (as the definition reads);
    // integers compute in their own width, wrapping.
    let ct = if float { ScalarType::F64 } else { ScalarType::of_storage(dt) };
    let mut lowered = single(cx, &operands, |b, out| {
        let get = |b: &mut KernelBuilder, s: &Scalar| match *s {
            Scalar::Const(f, i) => {
                if float {
                    b.float(ct, f)
                } else {
                    b.int(ct, i)
                }
            }
            Scalar::Input(j, rank) => {
                let z = vec![b.index(0); rank];
                let v = b.load(j, z);
                b.convert(v, ct)
            }
        };
        let s = get(b, &start);
        let d = get(b, &delta);
        let i = b.convert(out[0], ct);
        let step = b.mul(i, d);
        Ok(b.add(s, step))
    })?;
    if cx.outputs.len() > 1 {
        lowered.steps.push(range_check(cx, od[0])?);
        lowered.outputs.push(Output::Step(1));
    }
    Ok(lowered)
}

/// The shape check of a Range with run-time operands (kiln_ir::dynamic): 1 unless
/// `max(ceil((limit - start) / delta), 0)` is the compiled length `n`, computed as shape
/// inference computes it (floats in f32, f64 for f64; integers exactly).
fn range_check(cx: &OpCx<'_>, n: usize) -> R<Step> {
    let dt = cx.input_ty(0)?.dtype;
    if !dt.is_float() {
        // Integer operands of at most 16 elements are bound at compile time in practice;
        // a run-time integer Range is not shape-checked yet.
        return Err(cx.unsupported("run-time integer Range operands"));
    }
    let ct = if dt == DType::F64 { ScalarType::F64 } else { ScalarType::F32 };
    step(cx, 1, &[0, 1, 2], |b, _| {
        let mut get = |j: usize| {
            let rank = cx.input_ty(j).map(|t| t.shape.rank()).unwrap_or(0);
            let z = vec![b.index(0); rank];
            let v = b.load(j, z);
            b.convert(v, ct)
        };
        let s = get(0);
        let l = get(1);
        let d = get(2);
        let t = b.sub(l, s);
        let q = b.div(t, d);
        let q = b.unary(UnaryOp::Ceil, q);
        let z = b.float(ct, 0.0);
        let q = b.binary(BinaryOp::Max, q, z);
        let nk = b.float(ct, n as f64);
        let ne = b.binary(BinaryOp::Ne, q, nk);
        let one = b.int(ScalarType::I64, 1);
        let zero = b.int(ScalarType::I64, 0);
        Ok(b.select(ne, one, zero))
    })
}

fn constant_of_shape(cx: &OpCx<'_>) -> R<Lowered> {
    let dt = out_ty(cx)?.dtype;
    let ct = ScalarType::of_storage(dt);
    let bits = match &cx.attrs::<ka::ConstantOfShapeAttrs>()?.value {
        Some(v) if v.numel() == 1 => elem_bits(v, 0, ct),
        Some(v) => return Err(cx.unsupported(format!("value has {} elements, 1 expected", v.numel()))),
        None => 0,
    };
    single(cx, &[], |b, _| Ok(b.constant(ct, bits)))
}

fn out_ty<'a>(cx: &OpCx<'a>) -> R<&'a TensorType> {
    cx.outputs.first().ok_or_else(|| cx.unsupported("no result type"))
}

fn shape(cx: &OpCx<'_>) -> R<Lowered> {
    let xd = dims(cx, 0)?;
    let r = xd.len() as i64;
    let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
    let sa = cx.attrs::<ka::ShapeAttrs>()?;
    let start = clamp(sa.start);
    let end = match sa.end {
        Some(e) => clamp(e),
        None => xd.len(),
    };
    let vals: Vec<i64> = xd[start..end.max(start)].iter().map(|&d| d as i64).collect();
    expect_out(cx, &[vals.len()])?;
    single(cx, &[], |b, out| {
        // A select chain over the few dimensions.
        let mut v = b.index(vals.last().copied().unwrap_or(0));
        for (i, &d) in vals.iter().enumerate().rev().skip(1) {
            let ii = b.index(i as i64);
            let c = b.binary(BinaryOp::Eq, out[0], ii);
            let dv = b.index(d);
            v = b.select(c, dv, v);
        }
        Ok(v)
    })
}

fn size(cx: &OpCx<'_>) -> R<Lowered> {
    let n = cx.input_ty(0)?.shape.numel() as i64;
    expect_out(cx, &[])?;
    single(cx, &[], |b, _| Ok(b.index(n)))
}

// ---------------------------------------------------------------------------
// CumSum.
// ---------------------------------------------------------------------------

fn cumsum(cx: &OpCx<'_>) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = x.shape.dims().to_vec();
    let axis = match req_ints(cx, 1, "axis")?.as_slice() {
        [a] => *a,
        v => return Err(cx.unsupported(format!("axis has {} elements", v.len()))),
    };
    let a = norm_axis(cx, axis, xd.len())?;
    let ca = cx.attrs::<ka::CumSumAttrs>()?;
    let (exclusive, reverse) = (ca.exclusive, ca.reverse);
    let ct = ScalarType::of_storage(x.dtype);
    if ct == ScalarType::Bool {
        return Err(cx.unsupported("bool operand"));
    }
    expect_out(cx, &xd)?;
    let n = xd[a];
    single(cx, &[0], |b, out| {
        // out[k] = Σ x[t] over t <= k (< k exclusive; >= k / > k reversed).
        let t = b.new_var(n as u64);
        let tv = b.var(t);
        let op = match (reverse, exclusive) {
            (false, false) => BinaryOp::Le,
            (false, true) => BinaryOp::Lt,
            (true, false) => BinaryOp::Ge,
            (true, true) => BinaryOp::Gt,
        };
        let take = b.binary(op, tv, out[a]);
        let mut idx = out.to_vec();
        idx[a] = tv;
        let v = b.load(0, idx);
        let z = b.constant(ct, 0);
        let body = b.select(take, v, z);
        Ok(b.reduce(ReduceOp::Sum, vec![t], body))
    })
}

// ---------------------------------------------------------------------------
// Resize.
// ---------------------------------------------------------------------------

/// What decides the source coordinates of one resized axis.
struct AxisMap {
    ctm: Ctm,
    n_in: usize,
    n_out: usize,
    /// The output length the transforms use (`scale · n_in` when a scale is given).
    len_out: f64,
    /// The scale (for a run-time scale: the smallest one that gives `n_out`, which sizes
    /// the antialiasing taps).
    scale: f64,
    roi: (f64, f64),
    /// Where the kernel reads a run-time scale: (kernel input, element).
    scale_at: Option<(usize, usize)>,
    /// Where it reads a run-time roi: (kernel input, start element, end element).
    roi_at: Option<(usize, usize, usize)>,
}

/// Interpolation parameters (linear and cubic).
struct Interp {
    mode: RMode,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
}

impl AxisMap {
    /// The source coordinate of output index `x`, `None` where tf_crop_and_resize
    /// extrapolates (the reference's arithmetic, operation for operation).
    fn coord(&self, x: f64) -> Option<f64> {
        let (i, o, s) = (self.n_in as f64, self.len_out, self.scale);
        Some(match self.ctm {
            Ctm::HalfPixel => (x + 0.5) / s - 0.5,
            Ctm::HalfPixelSymmetric => {
                let (offset, s) = self.symmetric();
                offset + (x + 0.5) / s - 0.5
            }
            Ctm::PytorchHalfPixel => {
                if o > 1.0 {
                    (x + 0.5) / s - 0.5
                } else {
                    0.0
                }
            }
            Ctm::AlignCorners => {
                if o != 1.0 {
                    x * (i - 1.0) / (o - 1.0)
                } else {
                    0.0
                }
            }
            Ctm::Asymmetric => x / s,
            Ctm::TfCropAndResize => {
                let (a, b) = self.roi;
                let c = if o != 1.0 {
                    a * (i - 1.0) + x * (b - a) * (i - 1.0) / (o - 1.0)
                } else {
                    0.5 * (a + b) * (i - 1.0)
                };
                if c < 0.0 || c > i - 1.0 {
                    return None;
                }
                c
            }
        })
    }

    /// The offset and scale of half_pixel_symmetric.
    fn symmetric(&self) -> (f64, f64) {
        let (i, s) = (self.n_in as f64, self.scale);
        let adjustment = self.n_out as f64 / (s * i);
        (i / 2.0 * (1.0 - adjustment), s)
    }

    /// [`AxisMap::coord_expr`] with a compile-time scale and roi (the form
    /// `kiln_flow::resample` recognises).
    fn coord_expr_const(&self, b: &mut KernelBuilder, v: ExprId) -> (ExprId, Option<ExprId>) {
        const F: ScalarType = ScalarType::F64;
        let (i, o, s) = (self.n_in as f64, self.len_out, self.scale);
        let x = b.convert(v, F);
        // (x + 0.5) / s
        let half_pixel = |b: &mut KernelBuilder, s: f64| {
            let h = b.float(F, 0.5);
            let t = b.add(x, h);
            let sk = b.float(F, s);
            b.div(t, sk)
        };
        let c = match self.ctm {
            Ctm::HalfPixel => {
                let t = half_pixel(b, s);
                less_half(b, t)
            }
            Ctm::HalfPixelSymmetric => {
                let (offset, s) = self.symmetric();
                let t = half_pixel(b, s);
                let ok = b.float(F, offset);
                let t = b.add(ok, t);
                less_half(b, t)
            }
            Ctm::PytorchHalfPixel => {
                if o > 1.0 {
                    let t = half_pixel(b, s);
                    less_half(b, t)
                } else {
                    b.float(F, 0.0)
                }
            }
            Ctm::AlignCorners => {
                if o != 1.0 {
                    let ik = b.float(F, i - 1.0);
                    let t = b.mul(x, ik);
                    let ok = b.float(F, o - 1.0);
                    b.div(t, ok)
                } else {
                    b.float(F, 0.0)
                }
            }
            Ctm::Asymmetric => {
                let sk = b.float(F, s);
                b.div(x, sk)
            }
            Ctm::TfCropAndResize => {
                let (ra, rb) = self.roi;
                let c = if o != 1.0 {
                    let base = b.float(F, ra * (i - 1.0));
                    let w = b.float(F, rb - ra);
                    let t = b.mul(x, w);
                    let ik = b.float(F, i - 1.0);
                    let t = b.mul(t, ik);
                    let ok = b.float(F, o - 1.0);
                    let t = b.div(t, ok);
                    b.add(base, t)
                } else {
                    b.float(F, 0.5 * (ra + rb) * (i - 1.0))
                };
                return (c, Some(extrapolates(b, c, i)));
            }
        };
        (c, None)
    }

    /// Whether the kernel reads this axis's scale or roi at run time.
    fn run_time(&self) -> bool {
        self.scale_at.is_some() || self.roi_at.is_some()
    }

    /// The scale in a kernel: read from its operand when it is run-time data.
    fn scale_expr(&self, b: &mut KernelBuilder) -> ExprId {
        const F: ScalarType = ScalarType::F64;
        match self.scale_at {
            Some((j, k)) => {
                let i = b.index(k as i64);
                let v = b.load(j, vec![i]);
                b.convert(v, F)
            }
            None => b.float(F, self.scale),
        }
    }

    /// The output length the transforms use, in a kernel (`scale · n_in` for a run-time
    /// scale).
    fn len_out_expr(&self, b: &mut KernelBuilder, s: ExprId) -> ExprId {
        const F: ScalarType = ScalarType::F64;
        if self.scale_at.is_some() {
            let ik = b.float(F, self.n_in as f64);
            b.mul(s, ik)
        } else {
            b.float(F, self.len_out)
        }
    }

    /// The roi's start and end in a kernel.
    fn roi_expr(&self, b: &mut KernelBuilder) -> (ExprId, ExprId) {
        const F: ScalarType = ScalarType::F64;
        match self.roi_at {
            Some((j, ka, kb)) => {
                let mut get = |k: usize| {
                    let i = b.index(k as i64);
                    let v = b.load(j, vec![i]);
                    b.convert(v, F)
                };
                let ra = get(ka);
                let rb = get(kb);
                (ra, rb)
            }
            None => (b.float(F, self.roi.0), b.float(F, self.roi.1)),
        }
    }

    /// [`AxisMap::coord`] in a kernel: the f64 coordinate of output index `v`, and for
    /// tf_crop_and_resize the condition under which it extrapolates. A run-time scale or
    /// roi is read from its operand, the same operations in the same order.
    fn coord_expr(&self, b: &mut KernelBuilder, v: ExprId) -> (ExprId, Option<ExprId>) {
        if !self.run_time() {
            return self.coord_expr_const(b, v);
        }
        const F: ScalarType = ScalarType::F64;
        let i = self.n_in as f64;
        let x = b.convert(v, F);
        let s = self.scale_expr(b);
        let o = self.len_out_expr(b, s);
        // (x + 0.5) / s
        let half_pixel = |b: &mut KernelBuilder, s: ExprId| {
            let h = b.float(F, 0.5);
            let t = b.add(x, h);
            b.div(t, s)
        };
        let one = b.float(F, 1.0);
        let c = match self.ctm {
            Ctm::HalfPixel => {
                let t = half_pixel(b, s);
                less_half(b, t)
            }
            Ctm::HalfPixelSymmetric => {
                // offset = i/2 · (1 - n_out / (s · i))
                let ik = b.float(F, i);
                let si = b.mul(s, ik);
                let nk = b.float(F, self.n_out as f64);
                let adjustment = b.div(nk, si);
                let t = b.sub(one, adjustment);
                let hk = b.float(F, i / 2.0);
                let offset = b.mul(hk, t);
                let t = half_pixel(b, s);
                let t = b.add(offset, t);
                less_half(b, t)
            }
            Ctm::PytorchHalfPixel => {
                let t = half_pixel(b, s);
                let t = less_half(b, t);
                let z = b.float(F, 0.0);
                let gt = b.binary(BinaryOp::Gt, o, one);
                b.select(gt, t, z)
            }
            Ctm::AlignCorners => {
                let ik = b.float(F, i - 1.0);
                let t = b.mul(x, ik);
                let om = b.sub(o, one);
                let t = b.div(t, om);
                let z = b.float(F, 0.0);
                let ne = b.binary(BinaryOp::Ne, o, one);
                b.select(ne, t, z)
            }
            Ctm::Asymmetric => b.div(x, s),
            Ctm::TfCropAndResize => {
                let (ra, rb) = self.roi_expr(b);
                let ik = b.float(F, i - 1.0);
                // a·(i-1) + x·(b-a)·(i-1)/(o-1)
                let base = b.mul(ra, ik);
                let w = b.sub(rb, ra);
                let t = b.mul(x, w);
                let t = b.mul(t, ik);
                let om = b.sub(o, one);
                let t = b.div(t, om);
                let moved = b.add(base, t);
                // 0.5·(a+b)·(i-1)
                let h = b.float(F, 0.5);
                let sum = b.add(ra, rb);
                let mid = b.mul(h, sum);
                let mid = b.mul(mid, ik);
                let ne = b.binary(BinaryOp::Ne, o, one);
                let c = b.select(ne, moved, mid);
                return (c, Some(extrapolates(b, c, i)));
            }
        };
        (c, None)
    }
}

/// `t − 0.5`, the last step of the half-pixel transforms (after any offset is added).
fn less_half(b: &mut KernelBuilder, t: ExprId) -> ExprId {
    let h = b.float(ScalarType::F64, 0.5);
    b.sub(t, h)
}

/// Keys' cubic weight of an outer tap (distance `r` in `[1, 2)`):
/// `((a·r − 5a)·r + 8a)·r − 4a`, given the constants `[a, 5a, 8a, 4a]`. Resize and
/// GridSample build their constants where they need them and share the polynomial.
pub(crate) fn cubic_outer(b: &mut KernelBuilder, [a, a5, a8, a4]: [ExprId; 4], r: ExprId) -> ExprId {
    let t = b.mul(a, r);
    let t = b.sub(t, a5);
    let t = b.mul(t, r);
    let t = b.add(t, a8);
    let t = b.mul(t, r);
    b.sub(t, a4)
}

/// Keys' cubic weight of an inner tap (distance `r` in `[0, 1)`):
/// `((a+2)·r − (a+3))·r·r + 1`, given the constants `[a + 2, a + 3, 1]`.
pub(crate) fn cubic_inner(b: &mut KernelBuilder, [a2, a3, one]: [ExprId; 3], r: ExprId) -> ExprId {
    let t = b.mul(a2, r);
    let t = b.sub(t, a3);
    let t = b.mul(t, r);
    let t = b.mul(t, r);
    b.add(t, one)
}

/// Whether the f64 source coordinate `c` lies outside `[0, i - 1]`: where
/// tf_crop_and_resize writes its extrapolation value.
fn extrapolates(b: &mut KernelBuilder, c: ExprId, i: f64) -> ExprId {
    const F: ScalarType = ScalarType::F64;
    let z = b.float(F, 0.0);
    let below = b.binary(BinaryOp::Lt, c, z);
    let last = b.float(F, i - 1.0);
    let above = b.binary(BinaryOp::Gt, c, last);
    b.binary(BinaryOp::Or, below, above)
}

/// The nearest source index of coordinate `c` (the reference's rounding and clamping).
fn nearest_index(c: f64, mode: NearestMode, n_in: usize) -> usize {
    let fl = c.floor();
    let i = if c == fl {
        c
    } else {
        let f = c - fl;
        match mode {
            NearestMode::RoundPreferFloor => {
                if f <= 0.5 {
                    fl
                } else {
                    fl + 1.0
                }
            }
            NearestMode::RoundPreferCeil => {
                if f < 0.5 {
                    fl
                } else {
                    fl + 1.0
                }
            }
            NearestMode::Floor => fl,
            NearestMode::Ceil => fl + 1.0,
        }
    };
    i.clamp(0.0, n_in as f64 - 1.0) as usize
}

/// [`nearest_index`] in a kernel.
fn nearest_expr(b: &mut KernelBuilder, c: ExprId, mode: NearestMode, n_in: usize) -> ExprId {
    const F: ScalarType = ScalarType::F64;
    let fl = b.unary(UnaryOp::Floor, c);
    let one = b.float(F, 1.0);
    let up = b.add(fl, one);
    let i = match mode {
        NearestMode::Floor => fl,
        NearestMode::Ceil => {
            let exact = b.binary(BinaryOp::Eq, c, fl);
            b.select(exact, fl, up)
        }
        NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => {
            // An integer coordinate has fraction 0 and stays.
            let f = b.sub(c, fl);
            let h = b.float(F, 0.5);
            let op = if mode == NearestMode::RoundPreferFloor { BinaryOp::Le } else { BinaryOp::Lt };
            let down = b.binary(op, f, h);
            b.select(down, fl, up)
        }
    };
    let i = to_i64(b, i);
    clamp_index(b, i, n_in)
}

/// Integers `(P, Q, R)` with `table[j] = clamp(floor((j·P + Q) / R), 0, n_in - 1)` for every
/// `j`, trying the ratios in `cands` (`P >= 0`, `R >= 1`).
fn fit_affine(table: &[usize], n_in: usize, cands: &[(i64, i64)]) -> Option<(i64, i64, i64)> {
    let last = n_in as i128 - 1;
    'cand: for &(p, r) in cands {
        if p < 0 || r < 1 {
            continue;
        }
        let (p, r) = (p as i128, r as i128);
        let (mut lo, mut hi) = (i128::MIN, i128::MAX);
        for (j, &t) in table.iter().enumerate() {
            let (t, base) = (t as i128, j as i128 * p);
            // floor((base + Q) / R) >= t unless t is 0 (clamped from below) ...
            if t > 0 {
                lo = lo.max(t * r - base);
            }
            // ... and <= t unless t is the last index (clamped from above).
            if t < last {
                hi = hi.min((t + 1) * r - 1 - base);
            }
            if lo > hi {
                continue 'cand;
            }
        }
        let q = 0i128.clamp(lo, hi);
        if q.abs() > 1 << 40 {
            continue;
        }
        return Some((p as i64, q as i64, r as i64));
    }
    None
}

/// Candidate ratios `P / R` for the index map of an axis: the sizes, the sizes less one
/// (align_corners), and the convergents of the continued fraction of `1 / scale`.
fn ratio_candidates(m: &AxisMap) -> Vec<(i64, i64)> {
    let (n_in, n_out, scale) = (m.n_in as i64, m.n_out as i64, m.scale);
    let mut c = vec![(n_in, n_out.max(1))];
    if n_out > 1 {
        c.push((n_in - 1, n_out - 1));
    }
    if m.len_out.fract() == 0.0 && m.len_out > 1.0 && m.len_out < 1e9 {
        c.push((n_in - 1, m.len_out as i64 - 1));
    }
    let y = 1.0 / scale;
    if y.is_finite() && y > 0.0 {
        let (mut h0, mut h1, mut k0, mut k1) = (0i64, 1i64, 1i64, 0i64);
        let mut rest = y;
        for _ in 0..24 {
            let a = rest.floor();
            if a > 1e9 {
                break;
            }
            let a = a as i64;
            let (h2, k2) = (a * h1 + h0, a * k1 + k0);
            if k2 > 1 << 16 || h2 > 1 << 24 {
                break;
            }
            c.push((h2, k2));
            (h0, h1, k0, k1) = (h1, h2, k1, k2);
            let f = rest - a as f64;
            if f < 1e-12 {
                break;
            }
            rest = 1.0 / f;
        }
    }
    // Lowest terms, the cheapest form (smallest divisor) first.
    let gcd = |mut a: i64, mut b: i64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a.max(1)
    };
    let mut c: Vec<(i64, i64)> =
        c.into_iter().filter(|&(p, r)| p >= 0 && r >= 1).map(|(p, r)| (p / gcd(p, r), r / gcd(p, r))).collect();
    c.sort_by_key(|&(p, r)| (r, p));
    c.dedup();
    c
}

/// The interpolation weights of the reference for `ratio` (the first tap sits at offset
/// `1 - n/2` from `x0`), computed at compile time to find axes that resize to themselves.
fn coeffs(p: &Interp, ratio: f64, scale: f64) -> Vec<f64> {
    let a = p.cubic_a;
    match (p.mode, p.antialias) {
        (RMode::Cubic, false) => {
            let (r1, q, q1) = (ratio + 1.0, 1.0 - ratio, 2.0 - ratio);
            vec![
                ((a * r1 - 5.0 * a) * r1 + 8.0 * a) * r1 - 4.0 * a,
                ((a + 2.0) * ratio - (a + 3.0)) * ratio * ratio + 1.0,
                ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                ((a * q1 - 5.0 * a) * q1 + 8.0 * a) * q1 - 4.0 * a,
            ]
        }
        // Linear (nearest never asks).
        (_, false) => vec![1.0 - ratio, ratio],
        (mode, true) => {
            let (start, n) = antialias_taps(mode, scale);
            let s = scale.min(1.0);
            let mut c: Vec<f64> = (start..start + n as i64).map(|i| aa_weight(mode, a, s, i as f64, ratio)).collect();
            let sum: f64 = c.iter().sum();
            c.iter_mut().for_each(|w| *w /= sum);
            c
        }
    }
}

/// The first tap offset and the tap count of an antialiasing kernel.
fn antialias_taps(mode: RMode, scale: f64) -> (i64, usize) {
    let s = scale.min(1.0);
    if mode == RMode::Cubic {
        let start = (-2.0 / s).floor() as i64 + 1;
        (start, (2 - 2 * start) as usize)
    } else {
        let start = (-1.0 / s).floor() as i64 + 1;
        (start, (2 - 2 * start) as usize)
    }
}

/// The unnormalised antialiasing weight of the tap at offset `i`.
fn aa_weight(mode: RMode, a: f64, s: f64, i: f64, ratio: f64) -> f64 {
    if mode == RMode::Linear {
        return (1.0 - ((i - ratio) * s).abs()).clamp(0.0, 1.0);
    }
    let x = (s * (i - ratio)).abs();
    let (x2, x3) = (x * x, x * x * x);
    if x <= 1.0 {
        (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
    } else if x < 2.0 {
        a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
    } else {
        0.0
    }
}

/// The number of taps per output index.
fn tap_count(p: &Interp, scale: f64) -> usize {
    match (p.mode, p.antialias) {
        (_, true) => antialias_taps(p.mode, scale).1,
        (RMode::Cubic, false) => 4,
        _ => 2,
    }
}

/// True when linear/cubic interpolation maps every output index of the axis to the same
/// input index with weight 1 (the reference skips such axes); an error for a coordinate
/// the reference rejects.
fn interp_identity(cx: &OpCx<'_>, m: &AxisMap, p: &Interp) -> R<bool> {
    if m.run_time() {
        // Only an axis of one element stays itself whatever the scale or roi (every tap
        // clamps to it and the weights sum to 1).
        return Ok(m.n_in == 1 && m.n_out == 1);
    }
    let mut identity = m.n_in == m.n_out;
    let last = m.n_in as i64 - 1;
    for j in 0..m.n_out {
        let Some(x) = m.coord(j as f64) else {
            identity = false;
            continue;
        };
        if !x.is_finite() || x.abs() > 1e15 {
            return Err(cx.unsupported(format!("source coordinate {x} of output index {j}")));
        }
        if !identity {
            continue;
        }
        let fl = x.floor();
        let (x0, ratio) = if x == fl { (fl as i64 - 1, 1.0) } else { (fl as i64, x - fl) };
        let mut c = coeffs(p, ratio, m.scale);
        let first = x0 + 1 - (c.len() / 2) as i64;
        if p.exclude_outside {
            for (k, w) in c.iter_mut().enumerate() {
                if !(0..=last).contains(&(first + k as i64)) {
                    *w = 0.0;
                }
            }
            let sum: f64 = c.iter().sum();
            c.iter_mut().for_each(|w| *w /= sum);
        }
        let mut own = 0.0;
        let mut others = true;
        for (k, &w) in c.iter().enumerate() {
            if (first + k as i64).clamp(0, last) == j as i64 {
                own += w;
            } else {
                others &= w == 0.0;
            }
        }
        identity = own == 1.0 && others;
    }
    Ok(identity)
}

/// One interpolated axis inside a kernel: the tap variable, the source index and the f64
/// weight of the tap.
struct AxisTaps {
    var: VarId,
    index: ExprId,
    weight: ExprId,
    extrapolate: Option<ExprId>,
}

/// The taps of an interpolated axis for output index `v` (the reference's weights,
/// renormalised as it does).
fn interp_axis(b: &mut KernelBuilder, m: &AxisMap, p: &Interp, v: ExprId) -> AxisTaps {
    const F: ScalarType = ScalarType::F64;
    let (c, extrapolate) = m.coord_expr(b, v);
    let n = tap_count(p, m.scale);
    let fl = b.unary(UnaryOp::Floor, c);
    let exact = b.binary(BinaryOp::Eq, c, fl);
    let one = b.float(F, 1.0);
    let below = b.sub(fl, one);
    let x0 = b.select(exact, below, fl);
    let frac = b.sub(c, fl);
    let ratio = b.select(exact, one, frac);
    let x0 = to_i64(b, x0);
    let first = add_c(b, x0, 1 - (n / 2) as i64);
    let last = m.n_in as i64 - 1;
    let a = p.cubic_a;
    let s = m.scale.min(1.0);
    // A run-time scale: read in the kernel (the taps cover the smallest scale that
    // gives the compiled extent; taps past a kernel's support weigh 0).
    let s_run = m.scale_at.map(|_| {
        let sv = m.scale_expr(b);
        let one = b.float(F, 1.0);
        b.binary(BinaryOp::Min, sv, one)
    });
    let aa_start = antialias_taps(p.mode, m.scale).0;
    // The raw weight of the tap at variable value `t`.
    let raw = |b: &mut KernelBuilder, t: ExprId| -> ExprId {
        let k = |b: &mut KernelBuilder, x: f64| b.float(F, x);
        match (p.mode, p.antialias) {
            // Linear (nearest never asks).
            (RMode::Linear | RMode::Nearest, false) => {
                let z = b.index(0);
                let is0 = b.binary(BinaryOp::Eq, t, z);
                let w0 = b.sub(one, ratio);
                b.select(is0, w0, ratio)
            }
            (RMode::Cubic, false) => {
                let ka = k(b, a);
                let k5a = k(b, 5.0 * a);
                let k8a = k(b, 8.0 * a);
                let k4a = k(b, 4.0 * a);
                let ka2 = k(b, a + 2.0);
                let ka3 = k(b, a + 3.0);
                let two = k(b, 2.0);
                let outer = |b: &mut KernelBuilder, r: ExprId| cubic_outer(b, [ka, k5a, k8a, k4a], r);
                let inner = |b: &mut KernelBuilder, r: ExprId| cubic_inner(b, [ka2, ka3, one], r);
                let r1 = b.add(ratio, one);
                let q = b.sub(one, ratio);
                let q1 = b.sub(two, ratio);
                let w = [outer(b, r1), inner(b, ratio), inner(b, q), outer(b, q1)];
                let mut acc = w[3];
                for kk in (0..3).rev() {
                    let ki = b.index(kk as i64);
                    let is = b.binary(BinaryOp::Eq, t, ki);
                    acc = b.select(is, w[kk], acc);
                }
                acc
            }
            (mode, true) => {
                let off = add_c(b, t, aa_start);
                let i = b.convert(off, F);
                let sk = match s_run {
                    Some(e) => e,
                    None => k(b, s),
                };
                let d = b.sub(i, ratio);
                if mode == RMode::Linear {
                    let d = b.mul(d, sk);
                    let d = b.unary(UnaryOp::Abs, d);
                    let w = b.sub(one, d);
                    let z = k(b, 0.0);
                    let w = b.binary(BinaryOp::Max, w, z);
                    b.binary(BinaryOp::Min, w, one)
                } else {
                    let x = b.mul(sk, d);
                    let x = b.unary(UnaryOp::Abs, x);
                    let x2 = b.mul(x, x);
                    let x3 = b.mul(x2, x);
                    // (a+2)x³ - (a+3)x² + 1 for x <= 1.
                    let ka2 = k(b, a + 2.0);
                    let ka3 = k(b, a + 3.0);
                    let t1 = b.mul(ka2, x3);
                    let t2 = b.mul(ka3, x2);
                    let near = b.sub(t1, t2);
                    let near = b.add(near, one);
                    // a·x³ - 5a·x² + 8a·x - 4a for 1 < x < 2.
                    let ka = k(b, a);
                    let k5a = k(b, 5.0 * a);
                    let k8a = k(b, 8.0 * a);
                    let k4a = k(b, 4.0 * a);
                    let u1 = b.mul(ka, x3);
                    let u2 = b.mul(k5a, x2);
                    let u3 = b.mul(k8a, x);
                    let far = b.sub(u1, u2);
                    let far = b.add(far, u3);
                    let far = b.sub(far, k4a);
                    let z = k(b, 0.0);
                    let two = k(b, 2.0);
                    let le1 = b.binary(BinaryOp::Le, x, one);
                    let lt2 = b.binary(BinaryOp::Lt, x, two);
                    let w = b.select(lt2, far, z);
                    b.select(le1, near, w)
                }
            }
        }
    };
    let inside = |b: &mut KernelBuilder, t: ExprId| -> ExprId {
        let pos = b.add(first, t);
        let z = b.index(0);
        let ge = b.binary(BinaryOp::Ge, pos, z);
        let l = b.index(last);
        let le = b.binary(BinaryOp::Le, pos, l);
        b.binary(BinaryOp::And, ge, le)
    };
    // The normalised weight of tap `t`; `sum_var` makes a fresh variable for a sum.
    let weight = |b: &mut KernelBuilder, t: ExprId| -> ExprId {
        let w = raw(b, t);
        if p.antialias {
            let u = b.new_var(n as u64);
            let uv = b.var(u);
            let wu = raw(b, uv);
            let sum = b.reduce(ReduceOp::Sum, vec![u], wu);
            b.div(w, sum)
        } else {
            w
        }
    };
    let var = b.new_var(n as u64);
    let tv = b.var(var);
    let mut w = weight(b, tv);
    if p.exclude_outside {
        let z = b.float(F, 0.0);
        let ins = inside(b, tv);
        let wi = b.select(ins, w, z);
        let u = b.new_var(n as u64);
        let uv = b.var(u);
        let wu = weight(b, uv);
        let insu = inside(b, uv);
        let wu = b.select(insu, wu, z);
        let sum = b.reduce(ReduceOp::Sum, vec![u], wu);
        w = b.div(wi, sum);
    }
    let pos = b.add(first, tv);
    let index = clamp_index(b, pos, m.n_in);
    AxisTaps { var, index, weight: w, extrapolate }
}

/// The extrapolation value as a value of compute type `ct` (converted as the reference
/// writes it: integers truncated and saturated).
fn extrapolation_bits(ev: f64, ct: ScalarType) -> u64 {
    if ct.is_float() || ct == ScalarType::Bool {
        return ct.bits_of_f64(ev);
    }
    let (lo, hi) = ct.int_range();
    let v = if ev.is_nan() { 0 } else { (ev.trunc() as i128).clamp(lo, hi) };
    ct.wrap(v as u64)
}

fn resize(cx: &OpCx<'_>) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = x.shape.dims().to_vec();
    let r = xd.len();
    let ty = out_ty(cx)?;
    let od = ty.shape.dims().to_vec();
    if ty.dtype != x.dtype || od.len() != r {
        return Err(cx.unsupported(format!("result type {ty} for operand {x}")));
    }
    let ra = cx.attrs::<ka::ResizeAttrs>()?;
    let (mode, ctm, nearest) = (ra.mode, ra.coordinate_transformation_mode, ra.nearest_mode);
    let params =
        Interp { mode, cubic_a: ra.cubic_coeff_a as f64, exclude_outside: ra.exclude_outside, antialias: ra.antialias };
    let ev = ra.extrapolation_value as f64;
    let policy = ra.keep_aspect_ratio_policy;
    let axes = match &ra.axes {
        Some(a) => unique_axes(cx, a, r)?,
        None => (0..r).collect(),
    };
    // Operands that are absent or empty count as absent.
    let present = |i: usize, what: &str| -> R<Option<&Tensor>> {
        match cx.input(i) {
            Some(inp) if inp.ty.shape.numel() > 0 => cx.const_input(i, what),
            _ => Ok(None),
        }
    };
    // `scales` and `roi` may be run-time data: the kernel then reads them (kernel inputs
    // after X), and with run-time scales a second result checks at run time that they
    // give the compiled dims (kiln_ir::dynamic).
    let run_time = |i: usize| cx.input(i).is_some_and(|inp| inp.ty.shape.numel() > 0 && inp.value.is_none());
    let mut operands = vec![0usize];
    let scales_at = run_time(2).then(|| {
        operands.push(2);
        operands.len() - 1
    });
    let roi_at = run_time(1).then(|| {
        operands.push(1);
        operands.len() - 1
    });
    let roi = if roi_at.is_some() { None } else { present(1, "roi")?.map(Tensor::to_f64_vec) };
    let scales = if scales_at.is_some() {
        // The smallest scale that gives each compiled extent (the check refuses others).
        let n = cx.input_ty(2)?.shape.numel();
        if n != axes.len() {
            return Err(cx.unsupported(format!("{n} scales for {} axes", axes.len())));
        }
        Some(axes.iter().map(|&a| if xd[a] == 0 { 1.0 } else { od[a] as f64 / xd[a] as f64 * (1.0 - 1e-6) }).collect())
    } else {
        present(2, "scales")?.map(Tensor::to_f64_vec)
    };
    if scales_at.is_some() && cx.outputs.len() < 2 {
        return Err(cx.unsupported("run-time `scales` without the shape check result"));
    }
    let sizes = match present(3, "sizes")? {
        Some(t) => Some(t.to_i64_vec().map_err(|e| cx.unsupported(format!("sizes: {e}")))?),
        None => None,
    };
    let mut scale = vec![1.0f64; r];
    match (&scales, &sizes) {
        (Some(s), None) => {
            if s.len() != axes.len() {
                return Err(cx.unsupported(format!("{} scales for {} axes", s.len(), axes.len())));
            }
            for (&a, &v) in axes.iter().zip(s) {
                if !(v > 0.0 && v.is_finite()) {
                    return Err(cx.unsupported(format!("scale {v}")));
                }
                scale[a] = v;
            }
        }
        (None, Some(s)) => {
            if s.len() != axes.len() {
                return Err(cx.unsupported(format!("{} sizes for {} axes", s.len(), axes.len())));
            }
            let ratios: Vec<f64> = axes.iter().zip(s).map(|(&a, &v)| v as f64 / xd[a] as f64).collect();
            let common = match policy {
                ka::KeepAspectRatioPolicy::Stretch => None,
                ka::KeepAspectRatioPolicy::NotLarger => Some(ratios.iter().copied().fold(f64::INFINITY, f64::min)),
                ka::KeepAspectRatioPolicy::NotSmaller => Some(ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
            };
            for (&a, v) in axes.iter().zip(ratios) {
                scale[a] = common.unwrap_or(v);
            }
        }
        _ => return Err(cx.unsupported("exactly one of scales and sizes must be given")),
    }
    let mut rois = vec![(0.0f64, 1.0f64); r];
    if let Some(j) = roi_at {
        let n = cx.input_ty(1)?.shape.numel();
        if n != 2 * axes.len() {
            return Err(cx.unsupported(format!("roi has {n} values for {} axes", axes.len())));
        }
        let _ = j;
    } else if let Some(v) = &roi {
        if v.len() != 2 * axes.len() {
            return Err(cx.unsupported(format!("roi has {} values for {} axes", v.len(), axes.len())));
        }
        for (k, &a) in axes.iter().enumerate() {
            rois[a] = (v[k], v[k + axes.len()]);
        }
    } else if ctm == Ctm::TfCropAndResize {
        return Err(cx.unsupported("tf_crop_and_resize needs roi"));
    }
    let mut resized = vec![false; r];
    for &a in &axes {
        resized[a] = true;
    }
    for d in 0..r {
        if !resized[d] && od[d] != xd[d] {
            return Err(cx.unsupported(format!("axis {d} is not resized but changes from {} to {}", xd[d], od[d])));
        }
    }
    if ty.shape.numel() == 0 {
        // `step` gives an empty result a kernel without inputs; the body never runs.
        let mut lowered = single(cx, &[], |_, _| Err(cx.unsupported("empty result")))?;
        if scales_at.is_some() {
            lowered.steps.push(scales_check(cx, &axes, &xd, &od)?);
            lowered.outputs.push(Output::Step(lowered.steps.len() - 1));
        }
        return Ok(lowered);
    }
    if x.shape.numel() == 0 {
        return Err(cx.unsupported("cannot resize an empty tensor to a non-empty one"));
    }
    let fractional = scales.is_some() || policy != ka::KeepAspectRatioPolicy::Stretch;
    let maps: Vec<AxisMap> = (0..r)
        .map(|a| AxisMap {
            ctm,
            n_in: xd[a],
            n_out: od[a],
            len_out: if fractional { scale[a] * xd[a] as f64 } else { od[a] as f64 },
            scale: scale[a],
            roi: rois[a],
            scale_at: scales_at.and_then(|j| axes.iter().position(|&b| b == a).map(|k| (j, k))),
            roi_at: roi_at.and_then(|j| axes.iter().position(|&b| b == a).map(|k| (j, k, k + axes.len()))),
        })
        .collect();
    let ct = ScalarType::of_storage(x.dtype);
    let mut lowered = if mode == RMode::Nearest {
        resize_nearest(cx, &maps, &resized, nearest, ev, ct, &operands)?
    } else {
        resize_interp(cx, &maps, &resized, &params, ev, x.dtype, &operands)?
    };
    if scales_at.is_some() {
        lowered.steps.push(scales_check(cx, &axes, &xd, &od)?);
        lowered.outputs.push(Output::Step(lowered.steps.len() - 1));
    }
    Ok(lowered)
}

/// The shape check of run-time scales (result 1): the number of resized axes whose
/// extent `floor(n_in · scale)` (in f32, as shape inference computes it) is not the
/// compiled one.
fn scales_check(cx: &OpCx<'_>, axes: &[usize], xd: &[usize], od: &[usize]) -> R<Step> {
    step(cx, 1, &[2], |b, _| {
        const F: ScalarType = ScalarType::F32;
        let mut count: Option<ExprId> = None;
        for (k, &a) in axes.iter().enumerate() {
            let i = b.index(k as i64);
            let sv = b.load(0, vec![i]);
            let sv = b.convert(sv, F);
            let nk = b.float(F, xd[a] as f64);
            let p = b.mul(nk, sv);
            let p = b.unary(UnaryOp::Floor, p);
            let ok = b.float(F, od[a] as f64);
            let ne = b.binary(BinaryOp::Ne, p, ok);
            let one = b.int(ScalarType::I64, 1);
            let zero = b.int(ScalarType::I64, 0);
            let c = b.select(ne, one, zero);
            count = Some(match count {
                Some(acc) => b.add(acc, c),
                None => c,
            });
        }
        Ok(count.unwrap_or_else(|| b.int(ScalarType::I64, 0)))
    })
}

/// How a nearest axis finds its source index.
enum NearestAxis {
    /// Output index = source index.
    Same,
    /// `clamp(floor((i·P + Q) / R))`.
    Affine(i64, i64, i64),
    /// The f64 coordinate, rounded in the kernel.
    Coord,
}

fn resize_nearest(
    cx: &OpCx<'_>,
    maps: &[AxisMap],
    resized: &[bool],
    nearest: NearestMode,
    ev: f64,
    ct: ScalarType,
    operands: &[usize],
) -> R<Lowered> {
    let mut plan = Vec::with_capacity(maps.len());
    for (a, m) in maps.iter().enumerate() {
        if !resized[a] || (m.run_time() && m.n_in == 1 && m.n_out == 1) {
            plan.push(NearestAxis::Same);
            continue;
        }
        if m.run_time() {
            plan.push(NearestAxis::Coord);
            continue;
        }
        let mut table = Vec::with_capacity(m.n_out);
        let mut fills = false;
        for j in 0..m.n_out {
            match m.coord(j as f64) {
                None => fills = true,
                Some(c) if !c.is_finite() => {
                    return Err(cx.unsupported(format!("source coordinate {c} of output index {j}")));
                }
                Some(c) => table.push(nearest_index(c, nearest, m.n_in)),
            }
        }
        plan.push(if fills {
            NearestAxis::Coord
        } else if m.n_in == m.n_out && table.iter().enumerate().all(|(j, &t)| t == j) {
            NearestAxis::Same
        } else {
            match fit_affine(&table, m.n_in, &ratio_candidates(m)) {
                Some((p, q, r)) => NearestAxis::Affine(p, q, r),
                None => NearestAxis::Coord,
            }
        });
    }
    single(cx, operands, |b, out| {
        let mut idx = out.to_vec();
        let mut fill: Option<ExprId> = None;
        for (a, m) in maps.iter().enumerate() {
            idx[a] = match plan[a] {
                NearestAxis::Same => out[a],
                NearestAxis::Affine(p, q, r) => {
                    let num = affine(b, out[a], p, q);
                    let lo = q.min(0);
                    let hi_num = (m.n_out as i64 - 1) * p + q;
                    let (i, hi) = if r == 1 {
                        (num, hi_num)
                    } else {
                        let rk = b.index(r);
                        (b.div(num, rk), hi_num / r)
                    };
                    fit(b, i, lo, hi, m.n_in)
                }
                NearestAxis::Coord => {
                    let (c, extrapolate) = m.coord_expr(b, out[a]);
                    if let Some(e) = extrapolate {
                        fill = or(b, fill, e);
                    }
                    nearest_expr(b, c, nearest, m.n_in)
                }
            };
        }
        let v = b.load(0, idx);
        Ok(match fill {
            Some(f) => {
                let e = b.constant(ct, extrapolation_bits(ev, ct));
                b.select(f, e, v)
            }
            None => v,
        })
    })
}

fn resize_interp(
    cx: &OpCx<'_>,
    maps: &[AxisMap],
    resized: &[bool],
    p: &Interp,
    ev: f64,
    dt: DType,
    operands: &[usize],
) -> R<Lowered> {
    let mut active = Vec::new();
    for (a, m) in maps.iter().enumerate() {
        if resized[a] && !interp_identity(cx, m, p)? {
            active.push(a);
        }
    }
    // Floats interpolate in their compute type, integers in f64 (then round to nearest
    // even and saturate, as the reference does).
    let ct = ScalarType::of_storage(dt);
    let vt = if ct.is_float() { ct } else { ScalarType::F64 };
    single(cx, operands, |b, out| {
        let taps: Vec<AxisTaps> = active.iter().map(|&a| interp_axis(b, &maps[a], p, out[a])).collect();
        let mut idx = out.to_vec();
        for (t, &a) in taps.iter().zip(&active) {
            idx[a] = t.index;
        }
        let x = b.load(0, idx);
        let mut v = b.convert(x, vt);
        // The last axis innermost, as the reference's passes go.
        for t in taps.iter().rev() {
            let w = b.convert(t.weight, vt);
            let body = b.mul(w, v);
            v = b.reduce(ReduceOp::Sum, vec![t.var], body);
        }
        let mut fill = None;
        for t in &taps {
            if let Some(e) = t.extrapolate {
                fill = or(b, fill, e);
            }
        }
        if let Some(f) = fill {
            let e = b.float(vt, ev);
            v = b.select(f, e, v);
        }
        if dt.is_int() {
            v = b.unary(UnaryOp::Round, v);
            let (lo, hi) = ct.int_range();
            let hk = b.float(vt, hi as f64);
            v = b.binary(BinaryOp::Min, v, hk);
            let lk = b.float(vt, lo as f64);
            v = b.binary(BinaryOp::Max, v, lk);
        }
        Ok(v)
    })
}
