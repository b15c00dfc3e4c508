//! Lowering of the normalisations and composite ops: the Softmax family, LayerNorm,
//! BatchNorm (inference), InstanceNorm, GroupNorm, LRN, LpNormalization,
//! MeanVarianceNormalization, DynamicQuantizeLinear and TopK. (The recurrent layers are
//! [`super::recurrent`]'s.)
//!
//! ## Statistics
//! A normalisation divides its operand into *rows* (the elements that share the kept
//! index: the axis of a Softmax, the trailing axes of a LayerNorm, the spatial axes of
//! an InstanceNorm, …) and computes per-row statistics (maximum, sum, mean, inverse
//! standard deviation) with reduces. The code generator places a node at the loop depth
//! of its innermost free variable, so a statistic whose row is made of the *innermost*
//! dimensions is computed once per row inside the one kernel of the op. When the row
//! is not innermost (Softmax over a middle axis, MeanVarianceNormalization over
//! `[0, 2, 3]` with a batch above 1, GroupNorm with several channels per group), the
//! inline statistic would be recomputed for every element of the row; those ops get
//! one small kernel per statistic (of the kept shape, in the compute type) before the
//! kernel of the result, which loads them. [`Staged`] makes that choice.
//!
//! Statistics are two-pass (mean, then mean of squared deviations) like the
//! reference evaluator, in the compute type: f32 for f32 and narrower floats, f64
//! for f64 (LayerNormalization: f64 also when `stash_type` names f64).
//!
//! ## TopK
//! Three kernels: the rank of every element in the sorted order of its row (the
//! number of elements that come before it: larger, or equal at a lower position; NaN
//! above every number), the indices (the position whose rank is the output position)
//! and the values (a clamped gather of X at those indices). The rank kernel is
//! O(n²) per row of n elements (acceptable for now; a sort-based lowering would need
//! kernel-level loops), the others O(k·n) and O(k).

use kiln_ir::attrs as ka;
use kiln_ir::{DType, OpKind, Shape, TensorType};

use super::{broadcast_index, norm_axis, store, LowerError, Lowered, OpCx, Operand, Output, Step};
use kiln_flow::kernel::{BinaryOp as B, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType as S, UnaryOp as U, VarId};

type R<T> = Result<T, LowerError>;

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    use OpKind::*;
    let r = match cx.op.kind {
        Softmax | LogSoftmax => softmax(cx),
        Hardmax => hardmax(cx),
        LayerNormalization => layer_norm(cx),
        RMSNormalization => rms_norm(cx),
        BatchNormalization => batch_norm(cx),
        InstanceNormalization => instance_norm(cx),
        GroupNormalization => group_norm(cx),
        LRN => lrn(cx),
        LpNormalization => lp_norm(cx),
        MeanVarianceNormalization => mvn(cx),
        DynamicQuantizeLinear => dynamic_quantize(cx),
        TopK => topk(cx),
        _ => return None,
    };
    Some(r)
}

// ---------------------------------------------------------------------------
// Shared helpers.
// ---------------------------------------------------------------------------

/// Dimensions of operand `i`.
pub(super) fn dims(cx: &OpCx<'_>, i: usize) -> R<Vec<usize>> {
    Ok(cx.input_ty(i)?.shape.dims().to_vec())
}

/// Result type `i`.
pub(super) fn out_ty<'a>(cx: &OpCx<'a>, i: usize) -> R<&'a TensorType> {
    cx.outputs.get(i).ok_or_else(|| cx.unsupported(format!("result {i} has no type")))
}

/// The float operand 0 and its compute type.
pub(super) fn float_x(cx: &OpCx<'_>) -> R<(DType, S)> {
    let d = cx.input_ty(0)?.dtype;
    if !d.is_float() {
        return Err(cx.unsupported(format!("{} operand, a float dtype is required", d.name())));
    }
    Ok((d, S::of_storage(d)))
}

/// A float op along one axis of input 0: its compute type, the input's dims and `axis`
/// normalised against their rank.
fn float_along(cx: &OpCx<'_>, axis: i64) -> R<(S, Vec<usize>, usize)> {
    let (_, ct) = float_x(cx)?;
    let xd = dims(cx, 0)?;
    let axis = norm_axis(cx, axis, xd.len())?;
    Ok((ct, xd, axis))
}

/// The kernel name of result `i` (as [`OpCx::builder`] names them).
pub(super) fn result_name(cx: &OpCx<'_>, i: usize) -> String {
    if cx.outputs.len() > 1 {
        format!("{}_{i}", cx.name)
    } else {
        cx.name.to_string()
    }
}

/// A tensor type from parts (the dims come from existing tensors, so they are valid).
pub(super) fn tensor_ty(cx: &OpCx<'_>, d: DType, dims: Vec<usize>) -> R<TensorType> {
    let shape = Shape::new(dims).map_err(|e| cx.unsupported(e.to_string()))?;
    Ok(TensorType::new(d, shape))
}

/// One kernel: output `out`, kernel input `j` bound to `binds[j]`. `body` gets the
/// builder and the output index and returns the value (stored rounded to the output
/// dtype). An empty output gets a kernel that reads nothing.
pub(super) fn build<F>(name: String, out: TensorType, binds: &[(Operand, TensorType)], body: F) -> R<Step>
where
    F: FnOnce(&mut KernelBuilder, &[ExprId]) -> R<ExprId>,
{
    if out.shape.numel() == 0 {
        let ct = S::of_storage(out.dtype);
        let mut b = KernelBuilder::new(name, Vec::new(), out);
        let z = b.constant(ct, 0);
        let root = store(&mut b, z);
        return Ok(Step { kernel: b.finish(root)?, operands: Vec::new() });
    }
    let mut b = KernelBuilder::new(name, binds.iter().map(|x| x.1.clone()).collect(), out);
    let idx = b.out_index();
    let v = body(&mut b, &idx)?;
    let root = store(&mut b, v);
    Ok(Step { kernel: b.finish(root)?, operands: binds.iter().map(|x| x.0).collect() })
}

/// Bindings of op operands `ops` (kernel inputs in that order).
fn input_binds(cx: &OpCx<'_>, ops: &[usize]) -> R<Vec<(Operand, TensorType)>> {
    ops.iter().map(|&i| Ok((Operand::Input(i), cx.input_ty(i)?.clone()))).collect()
}

/// Element of input `j` at `idx`, converted to `ct`. An empty input (read only under a
/// reduce over zero elements, which never evaluates it) is read with padding, since
/// no index of it is in bounds.
pub(super) fn ld(b: &mut KernelBuilder, j: usize, idx: Vec<ExprId>, ct: S) -> ExprId {
    let empty = b.inputs().get(j).is_some_and(|t| t.shape.numel() == 0);
    let v = if empty { b.load_with(j, idx, Bounds::Pad(0)) } else { b.load(j, idx) };
    b.convert(v, ct)
}

/// A fold of `body` over `vars` (the body itself when there are none).
fn fold(b: &mut KernelBuilder, op: ReduceOp, vars: Vec<VarId>, body: ExprId) -> ExprId {
    if vars.is_empty() {
        body
    } else {
        b.reduce(op, vars, body)
    }
}

pub(super) fn lit(b: &mut KernelBuilder, ct: S, x: f64) -> ExprId {
    b.float(ct, x)
}

pub(super) fn sel(b: &mut KernelBuilder, c: ExprId, x: ExprId, y: ExprId) -> ExprId {
    b.select(c, x, y)
}

/// `min(max(x, lo), hi)` (NaN stays NaN).
pub(super) fn clamp(b: &mut KernelBuilder, x: ExprId, lo: ExprId, hi: ExprId) -> ExprId {
    let m = b.binary(B::Max, x, lo);
    b.binary(B::Min, m, hi)
}

/// `1/sqrt(var + eps)`.
fn inv_std(b: &mut KernelBuilder, var: ExprId, eps: f64) -> ExprId {
    let ct = b.ty(var);
    let e = lit(b, ct, eps);
    let s = b.add(var, e);
    let r = b.unary(U::Sqrt, s);
    let one = lit(b, ct, 1.0);
    b.div(one, r)
}

/// The index over `dims` at kept index `idx`: reduced positions become new reduction
/// variables (returned, outermost first), kept positions of extent 1 read 0 (so the
/// value does not depend on their variables), the others take `idx`.
fn over(b: &mut KernelBuilder, dims: &[usize], reduced: &[bool], idx: &[ExprId]) -> (Vec<VarId>, Vec<ExprId>) {
    let mut vars = Vec::new();
    let mut ix = Vec::with_capacity(dims.len());
    for (i, &d) in dims.iter().enumerate() {
        if reduced[i] {
            let v = b.new_var(d as u64);
            vars.push(v);
            ix.push(b.var(v));
        } else if d == 1 {
            ix.push(b.index(0));
        } else {
            ix.push(idx[i]);
        }
    }
    (vars, ix)
}

/// Mean of input 0 (of `dims`) over the `reduced` positions at kept index `idx`.
fn mean_of(b: &mut KernelBuilder, dims: &[usize], reduced: &[bool], idx: &[ExprId], ct: S) -> ExprId {
    let (vars, ix) = over(b, dims, reduced, idx);
    let x = ld(b, 0, ix, ct);
    let s = fold(b, ReduceOp::Sum, vars, x);
    let n = count(dims, reduced);
    let c = lit(b, ct, n as f64);
    b.div(s, c)
}

/// Population variance of input 0 around `mean`.
fn var_of(b: &mut KernelBuilder, dims: &[usize], reduced: &[bool], idx: &[ExprId], mean: ExprId) -> ExprId {
    let ct = b.ty(mean);
    let (vars, ix) = over(b, dims, reduced, idx);
    let x = ld(b, 0, ix, ct);
    let d = b.sub(x, mean);
    let sq = b.mul(d, d);
    let s = fold(b, ReduceOp::Sum, vars, sq);
    let n = count(dims, reduced);
    let c = lit(b, ct, n as f64);
    b.div(s, c)
}

/// Number of elements of a row.
fn count(dims: &[usize], reduced: &[bool]) -> usize {
    dims.iter().zip(reduced).filter(|(_, &r)| r).map(|(&d, _)| d).product()
}

/// A per-row statistic: built at a kept index from the earlier statistics' values.
type StatFn<'f> = Box<dyn Fn(&mut KernelBuilder, &[ExprId], &[ExprId]) -> R<ExprId> + 'f>;

/// A normalisation with per-row statistics (see the module docs).
struct Staged<'f> {
    /// Dims of the normalised operand (kernel input 0).
    dims: Vec<usize>,
    /// Which of its dimensions a row spans.
    reduced: Vec<bool>,
    /// Op operands the kernels read, as kernel inputs `0..`.
    data: Vec<usize>,
    /// The statistics, in order, with their compute types.
    stats: Vec<(S, StatFn<'f>)>,
}

impl<'f> Staged<'f> {
    /// The kept shape (reduced dimensions as 1).
    fn kept_dims(&self) -> Vec<usize> {
        self.dims.iter().zip(&self.reduced).map(|(&d, &r)| if r { 1 } else { d }).collect()
    }

    /// Whether inline statistics are computed once per row: no reduced dimension of
    /// extent above 1 lies outside the last kept dimension of extent above 1.
    fn inline(&self) -> bool {
        let last = (0..self.dims.len()).rev().find(|&i| !self.reduced[i] && self.dims[i] > 1);
        match last {
            None => true,
            Some(l) => (0..l).all(|i| !self.reduced[i] || self.dims[i] <= 1),
        }
    }

    /// The statistics computed inline at kept index `idx`.
    fn inline_stats(&self, b: &mut KernelBuilder, idx: &[ExprId], upto: usize) -> R<Vec<ExprId>> {
        let mut vals = Vec::with_capacity(upto);
        for (_, f) in &self.stats[..upto] {
            let v = f(b, idx, &vals)?;
            vals.push(v);
        }
        Ok(vals)
    }

    /// The op's result 0 as `fin(builder, index, statistics)`, after the statistic
    /// kernels where they are not inline. Returns the steps (the last is result 0).
    fn steps<F>(&self, cx: &OpCx<'_>, fin: F) -> R<Vec<Step>>
    where
        F: FnOnce(&mut KernelBuilder, &[ExprId], &[ExprId]) -> R<ExprId>,
    {
        let out = out_ty(cx, 0)?.clone();
        let data = input_binds(cx, &self.data)?;
        if self.inline() || out.shape.numel() == 0 {
            let step = build(result_name(cx, 0), out, &data, |b, idx| {
                let st = self.inline_stats(b, idx, self.stats.len())?;
                fin(b, idx, &st)
            })?;
            return Ok(vec![step]);
        }
        let kd = self.kept_dims();
        let nd = self.data.len();
        let mut steps: Vec<Step> = Vec::new();
        let mut binds = data;
        for (k, (ct, f)) in self.stats.iter().enumerate() {
            let ty = tensor_ty(cx, ct.dtype(), kd.clone())?;
            let step = build(format!("{}_st{k}", cx.name), ty.clone(), &binds, |b, idx| {
                let prev: Vec<ExprId> = (0..k).map(|j| b.load(nd + j, idx.to_vec())).collect();
                f(b, idx, &prev)
            })?;
            steps.push(step);
            binds.push((Operand::Step(k), ty));
        }
        let step = build(result_name(cx, 0), out, &binds, |b, idx| {
            let ix = broadcast_index(b, &kd, idx);
            let st: Vec<ExprId> = (0..self.stats.len()).map(|j| b.load(nd + j, ix.clone())).collect();
            fin(b, idx, &st)
        })?;
        steps.push(step);
        Ok(steps)
    }

    /// A kernel for result `r` (of the kept shape) storing statistic `k`.
    fn stat_result(&self, cx: &OpCx<'_>, r: usize, k: usize) -> R<Step> {
        let out = out_ty(cx, r)?.clone();
        if out.shape.dims() != self.kept_dims() {
            return Err(cx.unsupported(format!("result {r} has type {out}, expected dims {:?}", self.kept_dims())));
        }
        let data = input_binds(cx, &self.data)?;
        build(result_name(cx, r), out, &data, |b, idx| {
            let st = self.inline_stats(b, idx, k + 1)?;
            Ok(st[k])
        })
    }
}

/// The one result of an op made of `steps` (the last one).
fn lowered_last(steps: Vec<Step>) -> Lowered {
    let last = steps.len().saturating_sub(1);
    Lowered { steps, outputs: vec![Output::Step(last)] }
}

// ---------------------------------------------------------------------------
// Softmax, LogSoftmax, Hardmax.
// ---------------------------------------------------------------------------

/// The row Softmax, LogSoftmax and Hardmax work along: [`float_along`] their `axis`, and
/// the mask that reduces exactly that axis.
fn softmax_row(cx: &OpCx<'_>) -> R<(S, Vec<usize>, usize, Vec<bool>)> {
    let (ct, xd, axis) = float_along(cx, cx.attrs::<ka::SoftmaxAttrs>()?.axis)?;
    let reduced: Vec<bool> = (0..xd.len()).map(|i| i == axis).collect();
    Ok((ct, xd, axis, reduced))
}

/// Softmax and LogSoftmax: `m` = row max, `s` = Σ exp(x − m); `exp(x − m)/s` or
/// `(x − m) − log s`.
fn softmax(cx: &OpCx<'_>) -> R<Lowered> {
    let (ct, xd, _, reduced) = softmax_row(cx)?;
    let (d1, r1) = (xd.clone(), reduced.clone());
    let (d2, r2) = (xd.clone(), reduced.clone());
    let max: StatFn = Box::new(move |b, idx, _| {
        let (vars, ix) = over(b, &d1, &r1, idx);
        let x = ld(b, 0, ix, ct);
        Ok(fold(b, ReduceOp::Max, vars, x))
    });
    let sum: StatFn = Box::new(move |b, idx, prev| {
        let (vars, ix) = over(b, &d2, &r2, idx);
        let x = ld(b, 0, ix, ct);
        let z = b.sub(x, prev[0]);
        let e = b.unary(U::Exp, z);
        Ok(fold(b, ReduceOp::Sum, vars, e))
    });
    let st = Staged { dims: xd, reduced, data: vec![0], stats: vec![(ct, max), (ct, sum)] };
    let log = cx.op.kind == OpKind::LogSoftmax;
    let steps = st.steps(cx, |b, idx, s| {
        let x = ld(b, 0, idx.to_vec(), ct);
        let z = b.sub(x, s[0]);
        Ok(if log {
            let l = b.unary(U::Log, s[1]);
            b.sub(z, l)
        } else {
            let e = b.unary(U::Exp, z);
            b.div(e, s[1])
        })
    })?;
    Ok(lowered_last(steps))
}

/// Hardmax: 1 at the first maximum of the row (the first NaN if there is one), else 0.
fn hardmax(cx: &OpCx<'_>) -> R<Lowered> {
    let (ct, xd, axis, reduced) = softmax_row(cx)?;
    let (d1, r1) = (xd.clone(), reduced.clone());
    let pos: StatFn = Box::new(move |b, idx, _| {
        // Three folds over the same row: whether it has a NaN, the first NaN, the
        // first maximum (used only without NaN, where the order is total).
        let fold1 = |b: &mut KernelBuilder, op: ReduceOp, nan: bool| {
            let (vars, ix) = over(b, &d1, &r1, idx);
            let x = ld(b, 0, ix, ct);
            let body = if nan { b.unary(U::IsNan, x) } else { x };
            b.reduce(op, vars, body)
        };
        let has_nan = fold1(b, ReduceOp::Max, true);
        let first_nan = fold1(b, ReduceOp::ArgMax { last: false }, true);
        let first_max = fold1(b, ReduceOp::ArgMax { last: false }, false);
        Ok(sel(b, has_nan, first_nan, first_max))
    });
    let st = Staged { dims: xd, reduced, data: vec![0], stats: vec![(S::I64, pos)] };
    let steps = st.steps(cx, |b, idx, s| {
        let hit = b.binary(B::Eq, idx[axis], s[0]);
        let (one, zero) = (lit(b, ct, 1.0), lit(b, ct, 0.0));
        Ok(sel(b, hit, one, zero))
    })?;
    Ok(lowered_last(steps))
}

// ---------------------------------------------------------------------------
// Normalisations.
// ---------------------------------------------------------------------------

/// The mean and inverse-standard-deviation statistics of input 0 over `reduced`.
fn mean_inv_stats<'f>(xd: &[usize], reduced: &[bool], ct: S, eps: f64) -> Vec<(S, StatFn<'f>)> {
    let (d1, r1) = (xd.to_vec(), reduced.to_vec());
    let (d2, r2) = (xd.to_vec(), reduced.to_vec());
    let mean: StatFn = Box::new(move |b, idx, _| Ok(mean_of(b, &d1, &r1, idx, ct)));
    let inv: StatFn = Box::new(move |b, idx, prev| {
        let var = var_of(b, &d2, &r2, idx, prev[0]);
        Ok(inv_std(b, var, eps))
    });
    vec![(ct, mean), (ct, inv)]
}

/// LayerNormalization → (Y, Mean?, InvStdDev?) over the axes from `axis` on.
fn layer_norm(cx: &OpCx<'_>) -> R<Lowered> {
    let la = cx.attrs::<ka::LayerNormAttrs>()?;
    let (xct, xd, axis) = float_along(cx, la.axis)?;
    let eps = la.epsilon as f64;
    let stash = la.stash_type;
    if !stash.is_float() {
        return Err(cx.unsupported(format!("stash_type = {stash}")));
    }
    let ct = if xct == S::F64 || S::of_storage(stash) == S::F64 { S::F64 } else { S::F32 };
    if cx.outputs.is_empty() || cx.outputs.len() > 3 {
        return Err(cx.unsupported(format!("{} results", cx.outputs.len())));
    }
    let reduced: Vec<bool> = (0..xd.len()).map(|i| i >= axis).collect();
    let sd = dims(cx, 1)?;
    let bd = cx.input(2).map(|t| t.ty.shape.dims().to_vec());
    let mut data = vec![0, 1];
    if bd.is_some() {
        data.push(2);
    }
    let stats = mean_inv_stats(&xd, &reduced, ct, eps);
    let st = Staged { dims: xd.clone(), reduced, data, stats };
    let mut steps = st.steps(cx, |b, idx, s| {
        let x = ld(b, 0, idx.to_vec(), ct);
        let c = b.sub(x, s[0]);
        let n = b.mul(c, s[1]);
        let si = broadcast_index(b, &sd, idx);
        let sc = ld(b, 1, si, ct);
        let y = b.mul(n, sc);
        Ok(match &bd {
            Some(bd) => {
                let bi = broadcast_index(b, bd, idx);
                let bias = ld(b, 2, bi, ct);
                b.add(y, bias)
            }
            None => y,
        })
    })?;
    let mut outputs = vec![Output::Step(steps.len() - 1)];
    for r in 1..cx.outputs.len() {
        steps.push(st.stat_result(cx, r, r - 1)?);
        outputs.push(Output::Step(steps.len() - 1));
    }
    Ok(Lowered { steps, outputs })
}

/// RMSNormalization → `Y = X·r·Scale`, `r = 1/sqrt(mean(X²) + ε)` over the axes from
/// `axis` on (one statistic per row, as LayerNormalization's).
fn rms_norm(cx: &OpCx<'_>) -> R<Lowered> {
    let ra = cx.attrs::<ka::RmsNormAttrs>()?;
    let (xct, xd, axis) = float_along(cx, ra.axis)?;
    let eps = ra.epsilon as f64;
    let stash = ra.stash_type;
    if !stash.is_float() {
        return Err(cx.unsupported(format!("stash_type = {stash}")));
    }
    let ct = if xct == S::F64 || S::of_storage(stash) == S::F64 { S::F64 } else { S::F32 };
    if cx.outputs.len() != 1 {
        return Err(cx.unsupported(format!("{} results", cx.outputs.len())));
    }
    let reduced: Vec<bool> = (0..xd.len()).map(|i| i >= axis).collect();
    let sd = dims(cx, 1)?;
    let (d1, r1) = (xd.clone(), reduced.clone());
    let inv: StatFn = Box::new(move |b, idx, _| {
        let (vars, ix) = over(b, &d1, &r1, idx);
        let x = ld(b, 0, ix, ct);
        let sq = b.mul(x, x);
        let s = fold(b, ReduceOp::Sum, vars, sq);
        let c = lit(b, ct, count(&d1, &r1) as f64);
        let mean_square = b.div(s, c);
        Ok(inv_std(b, mean_square, eps))
    });
    let st = Staged { dims: xd.clone(), reduced, data: vec![0, 1], stats: vec![(ct, inv)] };
    let steps = st.steps(cx, |b, idx, s| {
        let x = ld(b, 0, idx.to_vec(), ct);
        let n = b.mul(x, s[0]);
        let si = broadcast_index(b, &sd, idx);
        let sc = ld(b, 1, si, ct);
        Ok(b.mul(n, sc))
    })?;
    Ok(Lowered { outputs: vec![Output::Step(steps.len() - 1)], steps })
}

/// BatchNormalization (inference): `(x − mean[c])/sqrt(var[c] + ε)·scale[c] + B[c]`.
fn batch_norm(cx: &OpCx<'_>) -> R<Lowered> {
    let ba = cx.attrs::<ka::BatchNormAttrs>()?;
    if ba.training_mode || cx.outputs.len() != 1 {
        return Err(cx.unsupported("training mode (only the inference form is supported)"));
    }
    let (_, ct) = float_x(cx)?;
    let xd = dims(cx, 0)?;
    if xd.len() < 2 {
        return Err(cx.unsupported("X must have rank 2 or more"));
    }
    let c = xd[1];
    for i in 1..5 {
        let d = dims(cx, i)?;
        if d != [c] {
            return Err(cx.unsupported(format!("operand {i} has dims {d:?}, [{c}] expected")));
        }
        if !cx.input_ty(i)?.dtype.is_float() {
            return Err(cx.unsupported(format!("operand {i} must be a float")));
        }
    }
    let eps = ba.epsilon as f64;
    let binds = input_binds(cx, &[0, 1, 2, 3, 4])?;
    let step = build(result_name(cx, 0), out_ty(cx, 0)?.clone(), &binds, |b, idx| {
        let x = ld(b, 0, idx.to_vec(), ct);
        let p: Vec<ExprId> = (1..5).map(|j| ld(b, j, vec![idx[1]], ct)).collect();
        let c = b.sub(x, p[2]);
        let e = lit(b, ct, eps);
        let v = b.add(p[3], e);
        let sd = b.unary(U::Sqrt, v);
        let n = b.div(c, sd);
        let y = b.mul(n, p[0]);
        Ok(b.add(y, p[1]))
    })?;
    Ok(lowered_last(vec![step]))
}

/// `(x − mean)·inv·scale[c] + bias[c]` over the rows of `st` (per-channel operands 1
/// and 2).
fn per_channel_norm(cx: &OpCx<'_>, st: &Staged<'_>, ct: S) -> R<Lowered> {
    let steps = st.steps(cx, |b, idx, s| {
        let x = ld(b, 0, idx.to_vec(), ct);
        let c = b.sub(x, s[0]);
        let n = b.mul(c, s[1]);
        let sc = ld(b, 1, vec![idx[1]], ct);
        let bias = ld(b, 2, vec![idx[1]], ct);
        let y = b.mul(n, sc);
        Ok(b.add(y, bias))
    })?;
    Ok(lowered_last(steps))
}

/// Checks that operands 1 and 2 are per-channel vectors of `c` elements.
fn check_per_channel(cx: &OpCx<'_>, c: usize) -> R<()> {
    for i in 1..3 {
        let d = dims(cx, i)?;
        if d != [c] {
            return Err(cx.unsupported(format!("operand {i} has dims {d:?}, [{c}] expected")));
        }
    }
    Ok(())
}

/// InstanceNormalization: statistics per (batch, channel) over the spatial axes.
fn instance_norm(cx: &OpCx<'_>) -> R<Lowered> {
    let (_, ct) = float_x(cx)?;
    let xd = dims(cx, 0)?;
    if xd.len() < 2 {
        return Err(cx.unsupported("input must have rank 2 or more"));
    }
    check_per_channel(cx, xd[1])?;
    let eps = cx.attrs::<ka::InstanceNormAttrs>()?.epsilon as f64;
    let reduced: Vec<bool> = (0..xd.len()).map(|i| i >= 2).collect();
    let st = Staged {
        dims: xd.clone(),
        reduced: reduced.clone(),
        data: vec![0, 1, 2],
        stats: mean_inv_stats(&xd, &reduced, ct, eps),
    };
    per_channel_norm(cx, &st, ct)
}

/// GroupNormalization: statistics per (batch, group of `C/num_groups` channels),
/// scale and bias per channel. With one channel per group it is InstanceNorm's one
/// kernel; otherwise the statistics are kernels over `[N, num_groups]` (inline they
/// would be recomputed for every channel of a group).
fn group_norm(cx: &OpCx<'_>) -> R<Lowered> {
    let (_, ct) = float_x(cx)?;
    let xd = dims(cx, 0)?;
    if xd.len() < 2 {
        return Err(cx.unsupported("X must have rank 2 or more"));
    }
    let c = xd[1];
    check_per_channel(cx, c)?;
    let ga = cx.attrs::<ka::GroupNormAttrs>()?;
    let g = ga.num_groups;
    let g = usize::try_from(g)
        .ok()
        .filter(|&g| g > 0 && g <= c.max(1) && c % g == 0)
        .ok_or_else(|| cx.unsupported(format!("num_groups = {g} does not divide {c} channels")))?;
    let eps = ga.epsilon as f64;
    let per = c / g;
    let reduced: Vec<bool> = (0..xd.len()).map(|i| i >= 2).collect();
    if per == 1 || out_ty(cx, 0)?.shape.numel() == 0 {
        let st = Staged {
            dims: xd.clone(),
            reduced: reduced.clone(),
            data: vec![0, 1, 2],
            stats: mean_inv_stats(&xd, &reduced, ct, eps),
        };
        return per_channel_norm(cx, &st, ct);
    }
    let n: usize = per * xd[2..].iter().product::<usize>();
    // X index of element (cg, s…) of group `grp` of batch `bn`, with the new variables.
    let group_index = |b: &mut KernelBuilder, bn: ExprId, grp: ExprId| -> (Vec<VarId>, Vec<ExprId>) {
        let cv = b.new_var(per as u64);
        let mut vars = vec![cv];
        let p = b.index(per as i64);
        let base = b.mul(grp, p);
        let cve = b.var(cv);
        let ch = b.add(base, cve);
        let mut ix = vec![bn, ch];
        for &d in &xd[2..] {
            let v = b.new_var(d as u64);
            vars.push(v);
            ix.push(b.var(v));
        }
        (vars, ix)
    };
    let sty = tensor_ty(cx, ct.dtype(), vec![xd[0], g])?;
    let xb = input_binds(cx, &[0])?;
    let mean = build(format!("{}_st0", cx.name), sty.clone(), &xb, |b, idx| {
        let (vars, ix) = group_index(b, idx[0], idx[1]);
        let x = ld(b, 0, ix, ct);
        let s = fold(b, ReduceOp::Sum, vars, x);
        let cnt = lit(b, ct, n as f64);
        Ok(b.div(s, cnt))
    })?;
    let mut binds = xb.clone();
    binds.push((Operand::Step(0), sty.clone()));
    let inv = build(format!("{}_st1", cx.name), sty.clone(), &binds, |b, idx| {
        let m = b.load(1, idx.to_vec());
        let (vars, ix) = group_index(b, idx[0], idx[1]);
        let x = ld(b, 0, ix, ct);
        let d = b.sub(x, m);
        let sq = b.mul(d, d);
        let s = fold(b, ReduceOp::Sum, vars, sq);
        let cnt = lit(b, ct, n as f64);
        let var = b.div(s, cnt);
        Ok(inv_std(b, var, eps))
    })?;
    let mut binds = input_binds(cx, &[0, 1, 2])?;
    binds.push((Operand::Step(0), sty.clone()));
    binds.push((Operand::Step(1), sty));
    let y = build(result_name(cx, 0), out_ty(cx, 0)?.clone(), &binds, |b, idx| {
        let p = b.index(per as i64);
        let grp = b.div(idx[1], p);
        let si = vec![idx[0], grp];
        let m = b.load(3, si.clone());
        let inv = b.load(4, si);
        let x = ld(b, 0, idx.to_vec(), ct);
        let c = b.sub(x, m);
        let nrm = b.mul(c, inv);
        let sc = ld(b, 1, vec![idx[1]], ct);
        let bias = ld(b, 2, vec![idx[1]], ct);
        let y = b.mul(nrm, sc);
        Ok(b.add(y, bias))
    })?;
    Ok(lowered_last(vec![mean, inv, y]))
}

/// Widest LRN channel window written out term by term (see [`lrn`]).
const LRN_UNROLLED: i64 = 16;

/// LRN: `x / (bias + α/size · Σ x²)^β`, the sum over the channels
/// `c − ⌊(size−1)/2⌋ ..= c + ⌈(size−1)/2⌉` that exist.
fn lrn(cx: &OpCx<'_>) -> R<Lowered> {
    let (_, ct) = float_x(cx)?;
    let xd = dims(cx, 0)?;
    if xd.len() < 2 {
        return Err(cx.unsupported("input must have rank 2 or more"));
    }
    let la = cx.attrs::<ka::LrnAttrs>()?;
    let (alpha, beta, bias) = (la.alpha as f64, la.beta as f64, la.bias as f64);
    let size = la.size;
    if size < 1 {
        return Err(cx.unsupported(format!("size = {size}")));
    }
    let below = (size - 1) / 2;
    let binds = input_binds(cx, &[0])?;
    let step = build(result_name(cx, 0), out_ty(cx, 0)?.clone(), &binds, |b, idx| {
        // The square of channel `c − below + k`, 0 outside the channels: an in-bounds
        // load at the channel clamped into range, masked where it was not (the row it
        // reads is contiguous, so a code generator loads it a vector at a time; a load
        // padded by 0 is not vectorised).
        let square = |b: &mut KernelBuilder, ke: ExprId| {
            let off = b.index(-below);
            let c0 = b.add(idx[1], off);
            let ch = b.add(c0, ke);
            let zero = b.index(0);
            let last = b.index(xd[1] as i64 - 1);
            let lo = b.binary(B::Max, ch, zero);
            let clamped = b.binary(B::Min, lo, last);
            let mut ix = idx.to_vec();
            ix[1] = clamped;
            let w = ld(b, 0, ix, ct);
            let sq = b.mul(w, w);
            let inside = b.binary(B::Eq, clamped, ch);
            let z = lit(b, ct, 0.0);
            sel(b, inside, sq, z)
        };
        // A window of a few channels (5 in AlexNet and GoogLeNet) is written out as a
        // sum of its terms, in the fold's order from +0: an elementwise kernel, which
        // code generators vectorise along the rows, where a fold of 5 steps per element
        // had stayed scalar. Wider windows stay a fold.
        let s = if size <= LRN_UNROLLED {
            let mut acc = lit(b, ct, 0.0);
            for j in 0..size {
                let ke = b.index(j);
                let t = square(b, ke);
                acc = b.add(acc, t);
            }
            acc
        } else {
            let k = b.new_var(size as u64);
            let ke = b.var(k);
            let sq = square(b, ke);
            b.reduce(ReduceOp::Sum, vec![k], sq)
        };
        let a = lit(b, ct, alpha / size as f64);
        let t = b.mul(a, s);
        let bi = lit(b, ct, bias);
        let base = b.add(bi, t);
        // β = ¾ (AlexNet, GoogLeNet, ZFNet…): square roots, not a pow call per element.
        let den = match super::pow_by_constant(b, base, beta) {
            Some(d) => d,
            None => {
                let be = lit(b, ct, beta);
                b.binary(B::Pow, base, be)
            }
        };
        let x = ld(b, 0, idx.to_vec(), ct);
        Ok(b.div(x, den))
    })?;
    Ok(lowered_last(vec![step]))
}

/// LpNormalization (p = 1 or 2) along `axis`; a zero norm gives 0.
fn lp_norm(cx: &OpCx<'_>) -> R<Lowered> {
    let la = cx.attrs::<ka::LpNormAttrs>()?;
    let (ct, xd, axis) = float_along(cx, la.axis)?;
    let p = la.p;
    if p != 1 && p != 2 {
        return Err(cx.unsupported(format!("p = {p}, 1 or 2 expected")));
    }
    let reduced: Vec<bool> = (0..xd.len()).map(|i| i == axis).collect();
    let (d1, r1) = (xd.clone(), reduced.clone());
    let norm: StatFn = Box::new(move |b, idx, _| {
        let (vars, ix) = over(b, &d1, &r1, idx);
        let x = ld(b, 0, ix, ct);
        let t = if p == 1 { b.unary(U::Abs, x) } else { b.mul(x, x) };
        let s = fold(b, ReduceOp::Sum, vars, t);
        Ok(if p == 1 { s } else { b.unary(U::Sqrt, s) })
    });
    let st = Staged { dims: xd, reduced, data: vec![0], stats: vec![(ct, norm)] };
    let steps = st.steps(cx, |b, idx, s| {
        let x = ld(b, 0, idx.to_vec(), ct);
        let zero = lit(b, ct, 0.0);
        let is0 = b.binary(B::Eq, s[0], zero);
        let q = b.div(x, s[0]);
        Ok(sel(b, is0, zero, q))
    })?;
    Ok(lowered_last(steps))
}

/// MeanVarianceNormalization: `(x − mean)/(sqrt(var) + 1e-9)` over `axes`.
fn mvn(cx: &OpCx<'_>) -> R<Lowered> {
    let (_, ct) = float_x(cx)?;
    let xd = dims(cx, 0)?;
    let axes = &cx.attrs::<ka::MvnAttrs>()?.axes;
    let mut reduced = vec![false; xd.len()];
    for &a in axes {
        reduced[norm_axis(cx, a, xd.len())?] = true;
    }
    let (d1, r1) = (xd.clone(), reduced.clone());
    let (d2, r2) = (xd.clone(), reduced.clone());
    let mean: StatFn = Box::new(move |b, idx, _| Ok(mean_of(b, &d1, &r1, idx, ct)));
    let den: StatFn = Box::new(move |b, idx, prev| {
        let var = var_of(b, &d2, &r2, idx, prev[0]);
        let sd = b.unary(U::Sqrt, var);
        let e = lit(b, ct, 1e-9f32 as f64);
        Ok(b.add(sd, e))
    });
    let st = Staged { dims: xd, reduced, data: vec![0], stats: vec![(ct, mean), (ct, den)] };
    let steps = st.steps(cx, |b, idx, s| {
        let x = ld(b, 0, idx.to_vec(), ct);
        let c = b.sub(x, s[0]);
        Ok(b.div(c, s[1]))
    })?;
    Ok(lowered_last(steps))
}

// ---------------------------------------------------------------------------
// DynamicQuantizeLinear.
// ---------------------------------------------------------------------------

/// The scale and the zero point (as an integral f32, or NaN) of DynamicQuantizeLinear,
/// in f32 as ONNX defines them: range `[min(0, min x), max(0, max x)]` ignoring NaN,
/// scale = range/255 (1 for an empty range), zero point = round(clamp(−min/scale)).
/// The folds read no output variable, so a kernel computes them once.
///
/// Both folds are maxima over the axes of more than one element (an axis of one reads
/// 0): `min(0, min x) = −max(0, max −x)` exactly (negation is exact, and `−x > 0` is
/// `x < 0`, false for NaN as well), the form vector row kernels reduce.
fn dq_params(b: &mut KernelBuilder, xd: &[usize]) -> (ExprId, ExprId) {
    let wide: Vec<bool> = xd.iter().map(|&d| d != 1).collect();
    let extreme = |b: &mut KernelBuilder, negate: bool| {
        let (vars, ix) = over(b, xd, &wide, &[]);
        let mut x = ld(b, 0, ix, S::F32);
        if negate {
            x = b.unary(U::Neg, x);
        }
        let zero = lit(b, S::F32, 0.0);
        let keep = b.binary(B::Gt, x, zero);
        let body = sel(b, keep, x, zero);
        let r = fold(b, ReduceOp::Max, vars, body);
        // An empty operand folds to −inf: the range still includes 0.
        b.binary(B::Max, r, zero)
    };
    let mx = extreme(b, false);
    let nmn = extreme(b, true);
    let mn = b.unary(U::Neg, nmn);
    let same = b.binary(B::Eq, mx, mn);
    let range = b.sub(mx, mn);
    let c255 = lit(b, S::F32, 255.0);
    let q = b.div(range, c255);
    let one = lit(b, S::F32, 1.0);
    let scale = sel(b, same, one, q);
    let zero = lit(b, S::F32, 0.0);
    let r = b.div(mn, scale);
    let neg = b.sub(zero, r);
    let cl = clamp(b, neg, zero, c255);
    let zp = b.unary(U::Round, cl);
    (scale, zp)
}

/// DynamicQuantizeLinear → (y: u8, y_scale: f32 scalar, y_zero_point: u8 scalar), one
/// kernel each.
fn dynamic_quantize(cx: &OpCx<'_>) -> R<Lowered> {
    float_x(cx)?;
    let xd = dims(cx, 0)?;
    let n = cx.outputs.len();
    if n == 0 || n > 3 {
        return Err(cx.unsupported(format!("{n} results")));
    }
    let binds = input_binds(cx, &[0])?;
    let mut steps = Vec::with_capacity(n);
    steps.push(build(result_name(cx, 0), out_ty(cx, 0)?.clone(), &binds, |b, idx| {
        let (scale, zp) = dq_params(b, &xd);
        let x = ld(b, 0, idx.to_vec(), S::F32);
        let d = b.div(x, scale);
        let q = b.unary(U::Round, d);
        let nan = b.unary(U::IsNan, q);
        let zero = lit(b, S::F32, 0.0);
        let q = sel(b, nan, zero, q);
        let t = b.add(q, zp);
        let c255 = lit(b, S::F32, 255.0);
        Ok(clamp(b, t, zero, c255))
    })?);
    for r in 1..n {
        steps.push(build(result_name(cx, r), out_ty(cx, r)?.clone(), &binds, |b, _| {
            let (scale, zp) = dq_params(b, &xd);
            Ok(if r == 1 { scale } else { zp })
        })?);
    }
    Ok(Lowered { steps, outputs: (0..n).map(Output::Step).collect() })
}

// ---------------------------------------------------------------------------
// TopK.
// ---------------------------------------------------------------------------

/// TopK(X, K) → (values, indices): see the module docs. Rows are sorted as the
/// reference does: largest (or smallest) first, NaN above every number, equal values
/// lower position first; `sorted = 0` sorts too.
fn topk(cx: &OpCx<'_>) -> R<Lowered> {
    let ta = cx.attrs::<ka::TopKAttrs>()?;
    let axis = ta.axis;
    let xt = cx.input_ty(0)?.clone();
    let xd = xt.shape.dims().to_vec();
    let axis = norm_axis(cx, axis, xd.len())?;
    let largest = ta.largest;
    // The three-result form (a run-time K, kiln_ir::dynamic) sorts up to its bound and
    // copies K out as the extent.
    let dynamic = cx.outputs.len() == 3;
    let k = if dynamic {
        out_ty(cx, 0)?.shape.dims().get(axis).copied().unwrap_or(0) as i64
    } else {
        match cx.const_ints(1, "K")?.as_deref() {
            Some([k]) => *k,
            _ => return Err(cx.unsupported("K must be a constant of one element")),
        }
    };
    let n = xd[axis];
    let k = usize::try_from(k)
        .ok()
        .filter(|&k| k <= n)
        .ok_or_else(|| cx.unsupported(format!("K = {k} out of range for an axis of {n}")))?;
    let mut od = xd.clone();
    od[axis] = k;
    let vty = out_ty(cx, 0)?.clone();
    if vty.shape.dims() != od || vty.dtype != xt.dtype {
        return Err(cx.unsupported(format!("result 0 has type {vty}")));
    }
    let nres = if dynamic { 2 } else { cx.outputs.len() };
    let extent = |steps: &mut Vec<Step>, outputs: &mut Vec<Output>| -> R<()> {
        if dynamic {
            let kty = cx.input_ty(1)?.clone();
            let zeros = vec![0i64; kty.shape.rank()];
            steps.push(build(
                result_name(cx, 2),
                tensor_ty(cx, DType::I64, Vec::new())?,
                &[(Operand::Input(1), kty)],
                |b, _| {
                    let idx = zeros.iter().map(|&z| b.index(z)).collect();
                    Ok(b.load(0, idx))
                },
            )?);
            outputs.push(Output::Step(steps.len() - 1));
        }
        Ok(())
    };
    if nres > 2 {
        return Err(cx.unsupported(format!("{nres} results")));
    }
    let ity = tensor_ty(cx, DType::I64, od)?;
    if nres == 2 && out_ty(cx, 1)? != &ity {
        return Err(cx.unsupported(format!("result 1 has type {}", out_ty(cx, 1)?)));
    }
    let ct = S::of_storage(xt.dtype);
    let xb = input_binds(cx, &[0])?;
    let mut steps = Vec::with_capacity(3);
    if vty.shape.numel() == 0 {
        // Nothing to sort into: both results are empty.
        steps.push(build(result_name(cx, 0), vty, &[], |b, _| Ok(b.int(ct, 0)))?);
        let mut outputs = vec![Output::Step(0)];
        if nres == 2 {
            steps.push(build(result_name(cx, 1), ity.clone(), &[], |b, _| Ok(b.index(0)))?);
            outputs.push(Output::Step(1));
        }
        extent(&mut steps, &mut outputs)?;
        return Ok(Lowered { steps, outputs });
    }
    // Step 0: the rank of every element (O(n²) per row).
    let rty = tensor_ty(cx, DType::I64, xd.clone())?;
    steps.push(build(format!("{}_rank", cx.name), rty.clone(), &xb, |b, idx| {
        let xj = b.load(0, idx.to_vec());
        let i = b.new_var(n as u64);
        let ie = b.var(i);
        let mut ix = idx.to_vec();
        ix[axis] = ie;
        let xi = b.load(0, ix);
        let (first, eq) = if ct.is_float() {
            let (ni, nj) = (b.unary(U::IsNan, xi), b.unary(U::IsNan, xj));
            let strict = b.binary(if largest { B::Gt } else { B::Lt }, xi, xj);
            // NaN is above every number: first when largest, last otherwise.
            let (hi, lo) = if largest { (ni, nj) } else { (nj, ni) };
            let not_lo = b.unary(U::Not, lo);
            let nan_first = b.binary(B::And, hi, not_lo);
            let first = b.binary(B::Or, strict, nan_first);
            let same = b.binary(B::Eq, xi, xj);
            let both = b.binary(B::And, ni, nj);
            (first, b.binary(B::Or, same, both))
        } else {
            (b.binary(if largest { B::Gt } else { B::Lt }, xi, xj), b.binary(B::Eq, xi, xj))
        };
        let lower = b.binary(B::Lt, ie, idx[axis]);
        let tie = b.binary(B::And, eq, lower);
        let before = b.binary(B::Or, first, tie);
        let (one, zero) = (b.index(1), b.index(0));
        let c = sel(b, before, one, zero);
        Ok(b.reduce(ReduceOp::Sum, vec![i], c))
    })?);
    // Step 1: the indices: the position of rank p (O(k·n) per row).
    let iname = if nres == 2 { result_name(cx, 1) } else { format!("{}_idx", cx.name) };
    steps.push(build(iname, ity.clone(), &[(Operand::Step(0), rty)], |b, idx| {
        let j = b.new_var(n as u64);
        let je = b.var(j);
        let mut ix = idx.to_vec();
        ix[axis] = je;
        let r = b.load(0, ix);
        let hit = b.binary(B::Eq, r, idx[axis]);
        let zero = b.index(0);
        let c = sel(b, hit, je, zero);
        Ok(b.reduce(ReduceOp::Sum, vec![j], c))
    })?);
    // Step 2: the values, gathered at the indices (clamped: the verifier cannot know
    // they are positions of the row).
    let mut binds = xb;
    binds.push((Operand::Step(1), ity));
    steps.push(build(result_name(cx, 0), vty, &binds, |b, idx| {
        let p = b.load(1, idx.to_vec());
        let mut ix = idx.to_vec();
        ix[axis] = p;
        Ok(b.load_with(0, ix, Bounds::Clamp))
    })?);
    let mut outputs = vec![Output::Step(2)];
    if nres == 2 {
        outputs.push(Output::Step(1));
    }
    extent(&mut steps, &mut outputs)?;
    Ok(Lowered { steps, outputs })
}
