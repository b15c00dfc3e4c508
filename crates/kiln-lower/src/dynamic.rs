//! Lowering of the ops whose result extent depends on the data (NonZero, Compress,
//! NonMaxSuppression; TopK's run-time-K form is [`super::norm`]'s): each result is
//! computed at its bound, and one more kernel writes the extent, an `i64` scalar (see
//! `kiln_ir::dynamic`). Positions past the extent hold padding.
//!
//! Every kernel is a pure function of its output index, so a compaction is two
//! counting kernels: the *position* of every selected element (how many selected
//! elements precede it, O(n²) for n candidates) and, per output position, the element
//! whose position it is (O(bound·n)). Greedy NonMaxSuppression is sequential (a box is
//! kept when no *kept* box before it overlaps it); it is unrolled like a recurrent
//! layer, one small dispatch per candidate in score order, each deciding one box per
//! batch and class from the state the previous one wrote (O(n) each), after an O(n²)
//! suppression table of every pair's IoU test. A loop-carrying kernel form would make
//! each of these one dispatch.
//!
//! Unique compares slices (single elements without `axis`) pairwise: a table of equal
//! pairs, each slice's first occurrence, and for `sorted` the position of the first
//! differing element of every pair, which orders slices lexicographically (O(n²·s) for
//! n slices of s elements); positions, counts and the inverse follow by counting.

use kiln_ir::attrs as ka;
use kiln_ir::{DType, OpKind};

use super::norm::{build, out_ty, result_name, sel, tensor_ty};
use super::{LowerError, Lowered, OpCx, Operand, Output, Step};
use kiln_flow::kernel::{BinaryOp as B, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType as S};
use kiln_ir::TensorType;

type R<T> = Result<T, LowerError>;

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    let r = match cx.op.kind {
        OpKind::NonZero => non_zero(cx),
        OpKind::Compress => compress(cx),
        OpKind::NonMaxSuppression => nms(cx),
        OpKind::Unique => unique(cx),
        _ => return None,
    };
    Some(r)
}

fn i64_ty(cx: &OpCx<'_>, dims: Vec<usize>) -> R<TensorType> {
    tensor_ty(cx, DType::I64, dims)
}

/// `c ? 1 : 0` as i64.
fn one_if(b: &mut KernelBuilder, c: ExprId) -> ExprId {
    let (one, zero) = (b.index(1), b.index(0));
    sel(b, c, one, zero)
}

/// The flat index `flat` split into coordinates of `dims`.
fn coords(b: &mut KernelBuilder, dims: &[usize], flat: ExprId) -> Vec<ExprId> {
    super::unflatten(b, dims, flat)
}

/// The kernel `name` (of type `ty`, one element per index) counting the 1s of the i64
/// flags `flags` (of type `ty`, `n` of them) before each index: the position of each
/// flagged index among the flagged ones.
fn count_before(name: String, ty: &TensorType, flags: Operand, n: usize) -> R<Step> {
    build(name, ty.clone(), &[(flags, ty.clone())], |b, idx| {
        let j = b.new_var(n as u64);
        let je = b.var(j);
        let m = b.load(0, vec![je]);
        let before = b.binary(B::Lt, je, idx[0]);
        let zero = b.index(0);
        let c = sel(b, before, m, zero);
        Ok(b.reduce(ReduceOp::Sum, vec![j], c))
    })
}

/// The kernel `name` (of type `ty`) whose element `p` is the index `i < n` flagged 1 in
/// operand 0 whose position (operand 1, [`count_before`] of the flags) is `p`: the
/// flagged indices in order, 0 past their count.
fn flagged_at(name: String, ty: TensorType, binds: &[(Operand, TensorType)], n: usize) -> R<Step> {
    build(name, ty, binds, |b, idx| {
        let i = b.new_var(n as u64);
        let ie = b.var(i);
        let f = b.load(0, vec![ie]);
        let p = b.load(1, vec![ie]);
        let one = b.index(1);
        let flagged = b.binary(B::Eq, f, one);
        let at = b.binary(B::Eq, p, idx[0]);
        let hit = b.binary(B::And, flagged, at);
        let zero = b.index(0);
        let c = sel(b, hit, ie, zero);
        Ok(b.reduce(ReduceOp::Sum, vec![i], c))
    })
}

/// The steps of a compaction over `n` candidates whose 0/1 mask is step `mask` (an
/// `i64[n]`): the position of each (step +1) and, per output position `p < bound`, the
/// candidate there (step +2, 0 past the extent); and the extent (step +3).
fn compaction(cx: &OpCx<'_>, steps: &mut Vec<Step>, mask: usize, n: usize, bound: usize) -> R<(usize, usize)> {
    let mty = i64_ty(cx, vec![n])?;
    let pos = steps.len();
    steps.push(count_before(format!("{}_pos", cx.name), &mty, Operand::Step(mask), n)?);
    let src = steps.len();
    let sty = i64_ty(cx, vec![bound])?;
    let binds = [(Operand::Step(mask), mty.clone()), (Operand::Step(pos), mty.clone())];
    steps.push(flagged_at(format!("{}_src", cx.name), sty, &binds, n)?);
    Ok((src, extent_step(cx, steps, mask, &mty)?))
}

/// The extent: the sum of a 0/1 mask step.
fn extent_step(cx: &OpCx<'_>, steps: &mut Vec<Step>, mask: usize, mty: &TensorType) -> R<usize> {
    let dims = mty.shape.dims().to_vec();
    let name = result_name(cx, cx.outputs.len() - 1);
    steps.push(build(name, i64_ty(cx, Vec::new())?, &[(Operand::Step(mask), mty.clone())], |b, _| {
        let vars: Vec<_> = dims.iter().map(|&d| b.new_var(d as u64)).collect();
        let idx: Vec<ExprId> = vars.iter().map(|&v| b.var(v)).collect();
        let m = b.load(0, idx);
        Ok(b.reduce(ReduceOp::Sum, vars, m))
    })?);
    Ok(steps.len() - 1)
}

/// The lowering of an op whose result is the last of `steps` and whose extent is step
/// `ext`.
fn with_extent(steps: Vec<Step>, ext: usize) -> Lowered {
    let res = steps.len() - 1;
    Lowered { steps, outputs: vec![Output::Step(res), Output::Step(ext)] }
}

/// Element `at` along `axis` of input 0 (of dims `dims`), at the other coordinates of
/// the output index `idx`; with `flat`, element `at` of the flattened input. Clamped:
/// `at` comes from a buffer the verifier cannot bound.
fn load_along(b: &mut KernelBuilder, flat: bool, dims: &[usize], idx: &[ExprId], axis: usize, at: ExprId) -> ExprId {
    if flat {
        let c = coords(b, dims, at);
        b.load_with(0, c, Bounds::Clamp)
    } else {
        let mut ix = idx.to_vec();
        ix[axis] = at;
        b.load_with(0, ix, Bounds::Clamp)
    }
}

/// Whether element `e` (of dtype `d`) is nonzero.
fn nonzero(b: &mut KernelBuilder, e: ExprId, d: DType) -> ExprId {
    let ct = S::of_storage(d);
    let z = if ct.is_float() { b.float(ct, 0.0) } else { b.int(ct, 0) };
    b.binary(B::Ne, e, z)
}

/// NonZero(X) → (indices [rank, bound], extent).
fn non_zero(cx: &OpCx<'_>) -> R<Lowered> {
    let xt = cx.input_ty(0)?.clone();
    let xd = xt.shape.dims().to_vec();
    let n = xt.shape.numel();
    let oty = out_ty(cx, 0)?.clone();
    let bound = oty.shape.dims()[1];
    let mut steps = Vec::new();
    let mty = i64_ty(cx, vec![n])?;
    let d = xt.dtype;
    steps.push(build(format!("{}_mask", cx.name), mty, &[(Operand::Input(0), xt.clone())], |b, idx| {
        let c = coords(b, &xd, idx[0]);
        let x = b.load(0, c);
        let nz = nonzero(b, x, d);
        Ok(one_if(b, nz))
    })?);
    let (src, ext) = compaction(cx, &mut steps, 0, n, bound)?;
    let sty = i64_ty(cx, vec![bound])?;
    let strides: Vec<usize> = xt.shape.strides();
    let dims = xd.clone();
    steps.push(build(result_name(cx, 0), oty, &[(Operand::Step(src), sty)], |b, idx| {
        let s = b.load(0, vec![idx[1]]);
        // Coordinate idx[0] of flat index s: (s / stride) % dim, by a select over axes.
        let mut v = b.index(0);
        for (a, (&st, &dm)) in strides.iter().zip(&dims).enumerate() {
            let stv = b.index(st as i64);
            let q = b.binary(B::Div, s, stv);
            let dmv = b.index(dm.max(1) as i64);
            let r = b.binary(B::Rem, q, dmv);
            let av = b.index(a as i64);
            let is = b.binary(B::Eq, idx[0], av);
            v = sel(b, is, r, v);
        }
        Ok(v)
    })?);
    Ok(with_extent(steps, ext))
}

/// Compress(input, condition) → (output, extent).
fn compress(cx: &OpCx<'_>) -> R<Lowered> {
    let xt = cx.input_ty(0)?.clone();
    let ct = cx.input_ty(1)?.clone();
    let a = cx.attrs::<ka::CompressAttrs>()?;
    let len = ct.shape.numel();
    let axis = match a.axis {
        Some(ax) => super::norm_axis(cx, ax, xt.shape.rank())?,
        None => 0,
    };
    let oty = out_ty(cx, 0)?.clone();
    let bound = oty.shape.dims()[axis];
    let mut steps = Vec::new();
    let mty = i64_ty(cx, vec![len])?;
    steps.push(build(format!("{}_mask", cx.name), mty, &[(Operand::Input(1), ct.clone())], |b, idx| {
        let c = b.load(0, vec![idx[0]]);
        let nz = nonzero(b, c, DType::Bool);
        Ok(one_if(b, nz))
    })?);
    let (src, ext) = compaction(cx, &mut steps, 0, len, bound)?;
    let sty = i64_ty(cx, vec![bound])?;
    let flat = a.axis.is_none();
    let xd = xt.shape.dims().to_vec();
    let binds = [(Operand::Input(0), xt.clone()), (Operand::Step(src), sty)];
    steps.push(build(result_name(cx, 0), oty, &binds, |b, idx| {
        let s = b.load(1, vec![idx[axis]]);
        Ok(load_along(b, flat, &xd, idx, axis, s))
    })?);
    Ok(with_extent(steps, ext))
}

/// NonMaxSuppression → (selected_indices [bound, 3], extent): see the module docs.
fn nms(cx: &OpCx<'_>) -> R<Lowered> {
    let bt = cx.input_ty(0)?.clone();
    let st = cx.input_ty(1)?.clone();
    let center = cx.attrs::<ka::NmsAttrs>()?.center_point_box == 1;
    let (nb, n) = (bt.shape.dims()[0], bt.shape.dims()[1]);
    let nc = st.shape.dims()[1];
    let oty = out_ty(cx, 0)?.clone();
    let ft = S::of_storage(bt.dtype);
    let ct = if ft.bits() > 32 { ft } else { S::F32 };
    let opt = |i: usize| -> R<Option<TensorType>> { Ok(cx.input(i).map(|_| cx.input_ty(i)).transpose()?.cloned()) };
    let (max_t, iou_t, thr_t) = (opt(2)?, opt(3)?, opt(4)?);
    let first = |b: &mut KernelBuilder, j: usize, ty: &TensorType| -> ExprId {
        let z = (0..ty.shape.rank()).map(|_| b.index(0)).collect();
        b.load(j, z)
    };
    let mut steps: Vec<Step> = Vec::new();
    let sty3 = i64_ty(cx, vec![nb, nc, n])?;
    // valid[b,c,i]: the score is above the threshold (every box without one).
    let mut binds = vec![(Operand::Input(1), st.clone())];
    if let Some(t) = &thr_t {
        binds.push((Operand::Input(4), t.clone()));
    }
    steps.push(build(format!("{}_valid", cx.name), sty3.clone(), &binds, |b, idx| {
        let s = b.load(0, idx.to_vec());
        let s = b.convert(s, ct);
        match &thr_t {
            Some(t) => {
                let th = first(b, 1, t);
                let th = b.convert(th, ct);
                let gt = b.binary(B::Gt, s, th);
                Ok(one_if(b, gt))
            }
            None => Ok(b.index(1)),
        }
    })?);
    let valid = 0;
    // rank[b,c,i]: the position in processing order (valid first, then by score
    // descending, equal scores lower index first).
    steps.push(build(
        format!("{}_rank", cx.name),
        sty3.clone(),
        &[(Operand::Input(1), st.clone()), (Operand::Step(valid), sty3.clone())],
        |b, idx| {
            let (bi, ci, i) = (idx[0], idx[1], idx[2]);
            let j = b.new_var(n as u64);
            let je = b.var(j);
            let si = b.load(0, vec![bi, ci, i]);
            let sj = b.load(0, vec![bi, ci, je]);
            let vi = b.load(1, vec![bi, ci, i]);
            let vj = b.load(1, vec![bi, ci, je]);
            let gt = b.binary(B::Gt, vj, vi);
            let eqv = b.binary(B::Eq, vj, vi);
            let higher = b.binary(B::Gt, sj, si);
            let same = b.binary(B::Eq, sj, si);
            let lower = b.binary(B::Lt, je, i);
            let tie = b.binary(B::And, same, lower);
            let by_score = b.binary(B::Or, higher, tie);
            let by_score = b.binary(B::And, eqv, by_score);
            let before = b.binary(B::Or, gt, by_score);
            let c = one_if(b, before);
            Ok(b.reduce(ReduceOp::Sum, vec![j], c))
        },
    )?);
    let rank = 1;
    // order[b,c,p]: the box at position p.
    steps.push(build(format!("{}_order", cx.name), sty3.clone(), &[(Operand::Step(rank), sty3.clone())], |b, idx| {
        let i = b.new_var(n as u64);
        let ie = b.var(i);
        let r = b.load(0, vec![idx[0], idx[1], ie]);
        let hit = b.binary(B::Eq, r, idx[2]);
        let zero = b.index(0);
        let c = sel(b, hit, ie, zero);
        Ok(b.reduce(ReduceOp::Sum, vec![i], c))
    })?);
    let order = 2;
    // over[b,i,j]: box j's IoU with box i exceeds the threshold.
    let oty3 = i64_ty(cx, vec![nb, n, n])?;
    let mut binds = vec![(Operand::Input(0), bt.clone())];
    if let Some(t) = &iou_t {
        binds.push((Operand::Input(3), t.clone()));
    }
    steps.push(build(format!("{}_overlap", cx.name), oty3.clone(), &binds, |b, idx| {
        let bx = |b: &mut KernelBuilder, i: ExprId| -> [ExprId; 4] {
            let v: Vec<ExprId> = (0..4)
                .map(|k| {
                    let ke = b.index(k);
                    let x = b.load(0, vec![idx[0], i, ke]);
                    b.convert(x, ct)
                })
                .collect();
            if center {
                let half = b.float(ct, 0.5);
                let hw = b.mul(v[2], half);
                let hh = b.mul(v[3], half);
                [b.sub(v[0], hw), b.sub(v[1], hh), b.add(v[0], hw), b.add(v[1], hh)]
            } else {
                [
                    b.binary(B::Min, v[1], v[3]),
                    b.binary(B::Min, v[0], v[2]),
                    b.binary(B::Max, v[1], v[3]),
                    b.binary(B::Max, v[0], v[2]),
                ]
            }
        };
        let a = bx(b, idx[1]);
        let c = bx(b, idx[2]);
        let ix0 = b.binary(B::Max, a[0], c[0]);
        let ix1 = b.binary(B::Min, a[2], c[2]);
        let iy0 = b.binary(B::Max, a[1], c[1]);
        let iy1 = b.binary(B::Min, a[3], c[3]);
        let wx = b.sub(ix1, ix0);
        let wy = b.sub(iy1, iy0);
        let zero = b.float(ct, 0.0);
        let okx = b.binary(B::Gt, wx, zero);
        let oky = b.binary(B::Gt, wy, zero);
        let inter = b.mul(wx, wy);
        let aw = b.sub(a[2], a[0]);
        let ah = b.sub(a[3], a[1]);
        let area_a = b.mul(aw, ah);
        let cw = b.sub(c[2], c[0]);
        let ch = b.sub(c[3], c[1]);
        let area_c = b.mul(cw, ch);
        let sum = b.add(area_a, area_c);
        let union = b.sub(sum, inter);
        let thr = match &iou_t {
            Some(t) => {
                let x = first(b, 1, t);
                b.convert(x, ct)
            }
            None => b.float(ct, 0.0),
        };
        let iou = b.div(inter, union);
        let over = b.binary(B::Gt, iou, thr);
        let mut ok = b.binary(B::And, okx, oky);
        for x in [inter, area_a, area_c, union] {
            let pos = b.binary(B::Gt, x, zero);
            ok = b.binary(B::And, ok, pos);
        }
        let hit = b.binary(B::And, ok, over);
        Ok(one_if(b, hit))
    })?);
    let overlap = 3;
    // One step per position t: kept[b,c,i] (0/1), box order[b,c,t] decided.
    let max_bind = max_t.clone().map(|t| (Operand::Input(2), t));
    let mut kept: Option<usize> = None;
    for t in 0..n {
        let mut binds = vec![
            (Operand::Step(valid), sty3.clone()),
            (Operand::Step(order), sty3.clone()),
            (Operand::Step(overlap), oty3.clone()),
        ];
        if let Some(k) = kept {
            binds.push((Operand::Step(k), sty3.clone()));
        }
        let mi = binds.len();
        if let Some(m) = &max_bind {
            binds.push(m.clone());
        }
        let has_prev = kept.is_some();
        let max_ty = max_t.clone();
        steps.push(build(format!("{}_step{t}", cx.name), sty3.clone(), &binds, |b, idx| {
            let (bi, ci, i) = (idx[0], idx[1], idx[2]);
            let te = b.index(t as i64);
            let cur = b.load(1, vec![bi, ci, te]);
            let cur = clamp_index(b, cur, n);
            let prev_i = if has_prev { b.load(3, vec![bi, ci, i]) } else { b.index(0) };
            if !has_prev && max_ty.is_none() {
                return Ok(b.index(0));
            }
            // Kept so far, and kept boxes that overlap the current one.
            let (count, hits) = if has_prev {
                let j = b.new_var(n as u64);
                let je = b.var(j);
                let kj = b.load(3, vec![bi, ci, je]);
                let count = b.reduce(ReduceOp::Sum, vec![j], kj);
                let j2 = b.new_var(n as u64);
                let je2 = b.var(j2);
                let kj2 = b.load(3, vec![bi, ci, je2]);
                let ov = b.load_with(2, vec![bi, je2, cur], Bounds::Clamp);
                let both = b.mul(kj2, ov);
                (count, b.reduce(ReduceOp::Sum, vec![j2], both))
            } else {
                (b.index(0), b.index(0))
            };
            let max = match &max_ty {
                Some(m) => {
                    let x = first(b, mi, m);
                    b.convert(x, S::I64)
                }
                None => b.index(0),
            };
            let v = b.load_with(0, vec![bi, ci, cur], Bounds::Clamp);
            let one = b.index(1);
            let zero = b.index(0);
            let is_valid = b.binary(B::Eq, v, one);
            let room = b.binary(B::Lt, count, max);
            let free = b.binary(B::Eq, hits, zero);
            let keep = b.binary(B::And, is_valid, room);
            let keep = b.binary(B::And, keep, free);
            let here = b.binary(B::Eq, i, cur);
            let decided = one_if(b, keep);
            Ok(sel(b, here, decided, prev_i))
        })?);
        kept = Some(steps.len() - 1);
    }
    // Zero candidates: nothing kept.
    let kept = match kept {
        Some(k) => k,
        None => {
            steps.push(build(format!("{}_none", cx.name), sty3.clone(), &[], |b, _| Ok(b.index(0)))?);
            steps.len() - 1
        }
    };
    // slot[b,c,i]: the output row of a kept box (rows in batch, class, then processing
    // order): kept boxes of earlier (batch, class) pairs plus those before it in order.
    steps.push(build(
        format!("{}_slot", cx.name),
        sty3.clone(),
        &[(Operand::Step(kept), sty3.clone()), (Operand::Step(rank), sty3.clone())],
        |b, idx| {
            let (bi, ci, i) = (idx[0], idx[1], idx[2]);
            let (vb, vc, vi) = (b.new_var(nb as u64), b.new_var(nc as u64), b.new_var(n as u64));
            let (eb, ec, ei) = (b.var(vb), b.var(vc), b.var(vi));
            let k = b.load(0, vec![eb, ec, ei]);
            let ncv = b.index(nc as i64);
            let pair_j = b.mul(eb, ncv);
            let pair_j = b.add(pair_j, ec);
            let pair_i = b.mul(bi, ncv);
            let pair_i = b.add(pair_i, ci);
            let earlier = b.binary(B::Lt, pair_j, pair_i);
            let same = b.binary(B::Eq, pair_j, pair_i);
            let rj = b.load(1, vec![eb, ec, ei]);
            let ri = b.load(1, vec![bi, ci, i]);
            let before = b.binary(B::Lt, rj, ri);
            let in_pair = b.binary(B::And, same, before);
            let counts = b.binary(B::Or, earlier, in_pair);
            let zero = b.index(0);
            let c = sel(b, counts, k, zero);
            Ok(b.reduce(ReduceOp::Sum, vec![vb, vc, vi], c))
        },
    )?);
    let slot = steps.len() - 1;
    let binds = [(Operand::Step(kept), sty3.clone()), (Operand::Step(slot), sty3.clone())];
    steps.push(build(result_name(cx, 0), oty, &binds, |b, idx| {
        let (r, col) = (idx[0], idx[1]);
        let (vb, vc, vi) = (b.new_var(nb as u64), b.new_var(nc as u64), b.new_var(n as u64));
        let (eb, ec, ei) = (b.var(vb), b.var(vc), b.var(vi));
        let k = b.load(0, vec![eb, ec, ei]);
        let s = b.load(1, vec![eb, ec, ei]);
        let one = b.index(1);
        let is_kept = b.binary(B::Eq, k, one);
        let at = b.binary(B::Eq, s, r);
        let hit = b.binary(B::And, is_kept, at);
        let c0 = b.index(0);
        let is0 = b.binary(B::Eq, col, c0);
        let is1 = b.binary(B::Eq, col, one);
        let v = sel(b, is1, ec, ei);
        let v = sel(b, is0, eb, v);
        let zero = b.index(0);
        let c = sel(b, hit, v, zero);
        Ok(b.reduce(ReduceOp::Sum, vec![vb, vc, vi], c))
    })?);
    let res = steps.len() - 1;
    let ext = extent_step(cx, &mut steps, kept, &sty3)?;
    Ok(Lowered { steps, outputs: vec![Output::Step(res), Output::Step(ext)] })
}

/// `x` clamped into `0..n` (an index loaded from a buffer the verifier cannot bound).
fn clamp_index(b: &mut KernelBuilder, x: ExprId, n: usize) -> ExprId {
    let lo = b.index(0);
    let hi = b.index(n.saturating_sub(1) as i64);
    let m = b.binary(B::Max, x, lo);
    b.binary(B::Min, m, hi)
}

/// Unique(X) → (Y, indices, inverse_indices, counts, extent): see the module docs.
fn unique(cx: &OpCx<'_>) -> R<Lowered> {
    let xt = cx.input_ty(0)?.clone();
    let a = cx.attrs::<ka::UniqueAttrs>()?;
    let xd = xt.shape.dims().to_vec();
    let (dims, axis) = match a.axis {
        Some(ax) => (xd.clone(), super::norm_axis(cx, ax, xd.len())?),
        None => (vec![xt.shape.numel()], 0),
    };
    let n = dims[axis];
    let (outer_dims, inner_dims) = (dims[..axis].to_vec(), dims[axis + 1..].to_vec());
    let (outer, inner): (usize, usize) = (outer_dims.iter().product(), inner_dims.iter().product());
    let s = outer * inner;
    let yty = out_ty(cx, 0)?.clone();
    let bound = yty.shape.dims()[axis];
    let float = xt.dtype.is_float();
    let ct = if float { S::F64 } else { S::I64 };
    let flat = a.axis.is_none();
    // Element `e` (0..s, row-major over the other axes) of slice `k`, in the compute type.
    let elem = move |b: &mut KernelBuilder, k: ExprId, e: ExprId| -> ExprId {
        let idx = if flat {
            super::unflatten(b, &xd, k)
        } else {
            let inn = b.index(inner.max(1) as i64);
            let o = b.binary(B::Div, e, inn);
            let i = b.binary(B::Rem, e, inn);
            let mut idx = super::unflatten(b, &outer_dims, o);
            idx.push(k);
            idx.extend(super::unflatten(b, &inner_dims, i));
            idx
        };
        let v = b.load_with(0, idx, Bounds::Clamp);
        b.convert(v, ct)
    };
    let same = move |b: &mut KernelBuilder, x: ExprId, y: ExprId| -> ExprId {
        let eq = b.binary(B::Eq, x, y);
        if float {
            let (nx, ny) =
                (b.unary(kiln_flow::kernel::UnaryOp::IsNan, x), b.unary(kiln_flow::kernel::UnaryOp::IsNan, y));
            let both = b.binary(B::And, nx, ny);
            b.binary(B::Or, eq, both)
        } else {
            eq
        }
    };
    let xb = (Operand::Input(0), xt.clone());
    let nn = i64_ty(cx, vec![n, n])?;
    let n1 = i64_ty(cx, vec![n])?;
    let mut steps: Vec<Step> = Vec::new();
    // eq[i, j]: slices i and j are equal.
    steps.push(build(format!("{}_eq", cx.name), nn.clone(), std::slice::from_ref(&xb), |b, idx| {
        let v = b.new_var(s as u64);
        let e = b.var(v);
        let (x, y) = (elem(b, idx[0], e), elem(b, idx[1], e));
        let eq = same(b, x, y);
        let ne = b.unary(kiln_flow::kernel::UnaryOp::Not, eq);
        let c = one_if(b, ne);
        let diff = b.reduce(ReduceOp::Sum, vec![v], c);
        let zero = b.index(0);
        let none = b.binary(B::Eq, diff, zero);
        Ok(one_if(b, none))
    })?);
    let eq = 0;
    // first[i]: no equal slice before i.
    steps.push(build(format!("{}_first", cx.name), n1.clone(), &[(Operand::Step(eq), nn.clone())], |b, idx| {
        let j = b.new_var(n as u64);
        let je = b.var(j);
        let e = b.load(0, vec![je, idx[0]]);
        let before = b.binary(B::Lt, je, idx[0]);
        let zero = b.index(0);
        let c = sel(b, before, e, zero);
        let dups = b.reduce(ReduceOp::Sum, vec![j], c);
        let none = b.binary(B::Eq, dups, zero);
        Ok(one_if(b, none))
    })?);
    let first = 1;
    // pos[i]: the output position of a first occurrence.
    let pos = if a.sorted {
        // less[j, i]: slice j sorts before slice i (first differing element smaller;
        // NaN last).
        steps.push(build(format!("{}_less", cx.name), nn.clone(), std::slice::from_ref(&xb), |b, idx| {
            let v = b.new_var(s as u64);
            let e = b.var(v);
            let (x, y) = (elem(b, idx[0], e), elem(b, idx[1], e));
            let eq = same(b, x, y);
            let sv = b.index(s as i64);
            let d = sel(b, eq, sv, e);
            let d = b.reduce(ReduceOp::Min, vec![v], d);
            let dc = clamp_index(b, d, s);
            let (x, y) = (elem(b, idx[0], dc), elem(b, idx[1], dc));
            let mut lt = b.binary(B::Lt, x, y);
            if float {
                let nx = b.unary(kiln_flow::kernel::UnaryOp::IsNan, x);
                let ny = b.unary(kiln_flow::kernel::UnaryOp::IsNan, y);
                let nnx = b.unary(kiln_flow::kernel::UnaryOp::Not, nx);
                let nan_after = b.binary(B::And, nnx, ny);
                lt = b.binary(B::Or, lt, nan_after);
            }
            let differs = b.binary(B::Lt, d, sv);
            let before = b.binary(B::And, differs, lt);
            Ok(one_if(b, before))
        })?);
        let less = steps.len() - 1;
        let binds = [(Operand::Step(first), n1.clone()), (Operand::Step(less), nn.clone())];
        steps.push(build(format!("{}_pos", cx.name), n1.clone(), &binds, |b, idx| {
            let j = b.new_var(n as u64);
            let je = b.var(j);
            let f = b.load(0, vec![je]);
            let l = b.load(1, vec![je, idx[0]]);
            let c = b.mul(f, l);
            Ok(b.reduce(ReduceOp::Sum, vec![j], c))
        })?);
        steps.len() - 1
    } else {
        steps.push(count_before(format!("{}_pos", cx.name), &n1, Operand::Step(first), n)?);
        steps.len() - 1
    };
    // inverse[k]: the position of k's first occurrence.
    let binds = [(Operand::Step(eq), nn.clone()), (Operand::Step(first), n1.clone()), (Operand::Step(pos), n1.clone())];
    steps.push(build(result_name(cx, 2), out_ty(cx, 2)?.clone(), &binds, |b, idx| {
        let j = b.new_var(n as u64);
        let je = b.var(j);
        let e = b.load(0, vec![je, idx[0]]);
        let f = b.load(1, vec![je]);
        let p = b.load(2, vec![je]);
        let hit = b.mul(e, f);
        let one = b.index(1);
        let is = b.binary(B::Eq, hit, one);
        let zero = b.index(0);
        let c = sel(b, is, p, zero);
        Ok(b.reduce(ReduceOp::Sum, vec![j], c))
    })?);
    let inverse = steps.len() - 1;
    // indices[p]: the first occurrence at position p (0 past the extent).
    let bty = i64_ty(cx, vec![bound])?;
    let binds = [(Operand::Step(first), n1.clone()), (Operand::Step(pos), n1.clone())];
    steps.push(flagged_at(result_name(cx, 1), bty.clone(), &binds, n)?);
    let indices = steps.len() - 1;
    // counts[p]: how many slices have their first occurrence at position p.
    steps.push(build(result_name(cx, 3), bty.clone(), &[(Operand::Step(inverse), n1.clone())], |b, idx| {
        let k = b.new_var(n as u64);
        let ke = b.var(k);
        let v = b.load(0, vec![ke]);
        let at = b.binary(B::Eq, v, idx[0]);
        let c = one_if(b, at);
        Ok(b.reduce(ReduceOp::Sum, vec![k], c))
    })?);
    let counts = steps.len() - 1;
    // Y: the slices at the indices.
    let binds = [xb.clone(), (Operand::Step(indices), bty.clone())];
    let xdims = xt.shape.dims().to_vec();
    steps.push(build(result_name(cx, 0), yty, &binds, |b, idx| {
        let k = b.load(1, vec![idx[axis]]);
        Ok(load_along(b, flat, &xdims, idx, axis, k))
    })?);
    let y = steps.len() - 1;
    let ext = extent_step(cx, &mut steps, first, &n1)?;
    Ok(Lowered {
        steps,
        outputs: vec![
            Output::Step(y),
            Output::Step(indices),
            Output::Step(inverse),
            Output::Step(counts),
            Output::Step(ext),
        ],
    })
}
