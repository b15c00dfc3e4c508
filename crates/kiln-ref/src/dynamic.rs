//! The ops whose result extent depends on the data: NonZero, Compress, Unique,
//! NonMaxSuppression and TopK with a run-time K (`kiln_ir::dynamic`). The reference
//! evaluator gives each result its actual extent, as ONNX does (the compiled plan's
//! result is bound-sized with the extent beside it; the runtime reports the actual
//! shape), plus the extent result; an extent above the node's bound is an error.
//!
//! Plain loops in the order ONNX Runtime defines: NonZero in row-major order; Unique's
//! values ascending (or in order of first occurrence); NonMaxSuppression per batch and
//! class, candidates above the score threshold in descending score (equal scores: lower
//! box index first), a candidate kept unless its IoU with a kept box exceeds the
//! threshold.

use crate::elementwise::{from_raw, raw_elems};
use crate::util::Cx;
use crate::EvalError;
use kiln_ir::attrs::{CompressAttrs, NmsAttrs, UniqueAttrs};
use kiln_ir::{OpKind, Shape, Tensor, TensorType};
use std::cmp::Ordering;

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    match cx.kind() {
        OpKind::NonZero => non_zero(cx),
        OpKind::Compress => compress(cx),
        OpKind::Unique => unique(cx),
        OpKind::NonMaxSuppression => nms(cx),
        OpKind::TopK => top_k(cx),
        k => Err(cx.invalid(format!("{k} is not a data-dependent op"))),
    }
}

/// Result `i`'s type with `axis` set to `n`, after checking `n` against its bound.
fn actual(cx: &Cx, i: usize, axis: usize, n: usize) -> Result<TensorType, EvalError> {
    let ty = cx.out_type(i)?;
    let mut d = ty.shape.dims().to_vec();
    let bound = d.get(axis).copied().ok_or_else(|| cx.invalid(format!("result {i} has no axis {axis}")))?;
    if n > bound {
        return Err(
            cx.invalid(format!("the data needs an extent of {n}, above the bound {bound} (raise it with --max-dim)"))
        );
    }
    d[axis] = n;
    Ok(TensorType::new(ty.dtype, Shape::new(d).map_err(|e| cx.invalid(e.to_string()))?))
}

fn extent(n: usize) -> Tensor {
    Tensor::scalar(n as i64)
}

fn i64s(cx: &Cx, ty: &TensorType, v: &[i64]) -> Result<Tensor, EvalError> {
    cx.from_i64(ty, v)
}

fn non_zero(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = cx.input(0)?;
    let dims = x.shape().dims().to_vec();
    let raw = raw_elems(x);
    let vals = x.to_f64_vec();
    let nz: Vec<usize> =
        (0..x.numel()).filter(|&i| if x.dtype().is_float() { vals[i] != 0.0 } else { raw[i] != 0 }).collect();
    let ty = actual(cx, 0, 1, nz.len())?;
    let strides = x.shape().strides();
    let mut out = vec![0i64; dims.len() * nz.len()];
    for (j, &flat) in nz.iter().enumerate() {
        for d in 0..dims.len() {
            out[d * nz.len() + j] = ((flat / strides[d]) % dims[d]) as i64;
        }
    }
    Ok(vec![i64s(cx, &ty, &out)?, extent(nz.len())])
}

/// `(outer, n, inner)`: the axis's extent and the sizes before and after it.
fn split(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (dims[..axis].iter().product(), dims[axis], dims[axis + 1..].iter().product())
}

fn compress(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = cx.input(0)?;
    let cond: Vec<bool> = cx.input(1)?.to_f64_vec().into_iter().map(|c| c != 0.0).collect();
    let a = cx.attrs::<CompressAttrs>()?;
    let (dims, axis) = match a.axis {
        Some(ax) => (x.shape().dims().to_vec(), cx.axis(ax, x.shape().rank())?),
        None => (vec![x.numel()], 0),
    };
    let (outer, n, inner) = split(&dims, axis);
    if cond.len() > n {
        return Err(cx.invalid(format!("the condition has {} elements, the axis {n}", cond.len())));
    }
    let keep: Vec<usize> = (0..cond.len()).filter(|&i| cond[i]).collect();
    let ty = actual(cx, 0, axis, keep.len())?;
    let raw = raw_elems(x);
    let mut out = Vec::with_capacity(outer * keep.len() * inner);
    for o in 0..outer {
        for &k in &keep {
            out.extend_from_slice(&raw[(o * n + k) * inner..(o * n + k + 1) * inner]);
        }
    }
    Ok(vec![from_raw(cx, &ty, &out)?, extent(keep.len())])
}

/// Compares two slices element by element (floats by value, NaN last; integers
/// exactly).
fn cmp_slices(a: &[f64], b: &[f64]) -> Ordering {
    for (x, y) in a.iter().zip(b) {
        let o = x.partial_cmp(y).unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()));
        if o != Ordering::Equal {
            return o;
        }
    }
    Ordering::Equal
}

fn unique(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = cx.input(0)?;
    let a = cx.attrs::<UniqueAttrs>()?;
    let (dims, axis) = match a.axis {
        Some(ax) => (x.shape().dims().to_vec(), cx.axis(ax, x.shape().rank())?),
        None => (vec![x.numel()], 0),
    };
    let (outer, n, inner) = split(&dims, axis);
    let raw = raw_elems(x);
    let vals = if x.dtype().is_float() {
        x.to_f64_vec()
    } else {
        crate::elementwise::read_i64(cx, x)?.into_iter().map(|v| v as f64).collect()
    };
    // Slice `k` of the axis, as raw words and as comparable values.
    let slice = |k: usize, v: &[f64]| -> Vec<f64> {
        let mut s = Vec::with_capacity(outer * inner);
        for o in 0..outer {
            s.extend_from_slice(&v[(o * n + k) * inner..(o * n + k + 1) * inner]);
        }
        s
    };
    let keys: Vec<Vec<f64>> = (0..n).map(|k| slice(k, &vals)).collect();
    // Equal by value (-0.0 equals 0.0, NaN equals NaN).
    let same = |i: usize, j: usize| cmp_slices(&keys[i], &keys[j]) == Ordering::Equal;
    let mut firsts: Vec<usize> = Vec::new();
    let mut inverse_first = vec![0usize; n];
    for (k, inv) in inverse_first.iter_mut().enumerate() {
        match firsts.iter().position(|&f| same(f, k)) {
            Some(p) => *inv = p,
            None => {
                *inv = firsts.len();
                firsts.push(k);
            }
        }
    }
    // Order of the unique slices: ascending, or first occurrence.
    let mut order: Vec<usize> = (0..firsts.len()).collect();
    if a.sorted {
        order.sort_by(|&p, &q| cmp_slices(&keys[firsts[p]], &keys[firsts[q]]));
    }
    let mut rank = vec![0usize; firsts.len()];
    for (r, &p) in order.iter().enumerate() {
        rank[p] = r;
    }
    let u = firsts.len();
    let mut counts = vec![0i64; u];
    for k in 0..n {
        counts[rank[inverse_first[k]]] += 1;
    }
    let yty = actual(cx, 0, axis, u)?;
    let mut y = Vec::with_capacity(outer * u * inner);
    for o in 0..outer {
        for &p in &order {
            let k = firsts[p];
            y.extend_from_slice(&raw[(o * n + k) * inner..(o * n + k + 1) * inner]);
        }
    }
    let idx: Vec<i64> = order.iter().map(|&p| firsts[p] as i64).collect();
    let inv: Vec<i64> = (0..n).map(|k| rank[inverse_first[k]] as i64).collect();
    let mut out = vec![from_raw(cx, &yty, &y)?];
    let ity = actual(cx, 1, 0, u)?;
    out.push(i64s(cx, &ity, &idx)?);
    out.push(i64s(cx, cx.out_type(2)?, &inv)?);
    let cty = actual(cx, 3, 0, u)?;
    out.push(i64s(cx, &cty, &counts)?);
    out.push(extent(u));
    Ok(out)
}

/// A box's corners `(x_min, y_min, x_max, y_max)`.
fn corners(b: &[f64], center: bool) -> (f64, f64, f64, f64) {
    if center {
        let (hw, hh) = (b[2] / 2.0, b[3] / 2.0);
        (b[0] - hw, b[1] - hh, b[0] + hw, b[1] + hh)
    } else {
        (b[1].min(b[3]), b[0].min(b[2]), b[1].max(b[3]), b[0].max(b[2]))
    }
}

/// Whether two boxes overlap by more than `thr` (intersection over union; boxes of no
/// area never suppress).
fn suppresses(a: &[f64], b: &[f64], center: bool, thr: f64) -> bool {
    let (ax0, ay0, ax1, ay1) = corners(a, center);
    let (bx0, by0, bx1, by1) = corners(b, center);
    let (ix0, ix1) = (ax0.max(bx0), ax1.min(bx1));
    let (iy0, iy1) = (ay0.max(by0), ay1.min(by1));
    if ix1 <= ix0 || iy1 <= iy0 {
        return false;
    }
    let inter = (ix1 - ix0) * (iy1 - iy0);
    let (aa, ab) = ((ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0));
    let union = aa + ab - inter;
    if aa <= 0.0 || ab <= 0.0 || union <= 0.0 {
        return false;
    }
    inter / union > thr
}

fn nms(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let boxes = cx.input(0)?;
    let scores = cx.input(1)?;
    let center = cx.attrs::<NmsAttrs>()?.center_point_box == 1;
    let one = |i: usize| -> Option<f64> { cx.opt_input(i).and_then(|t| t.to_f64_vec().first().copied()) };
    let max_out = match cx.opt_input(2) {
        Some(t) => t.to_i64_vec().map_err(|e| cx.invalid(e.to_string()))?.first().copied().unwrap_or(0).max(0) as usize,
        None => 0,
    };
    let iou = one(3).unwrap_or(0.0);
    if !(0.0..=1.0).contains(&iou) {
        return Err(cx.invalid(format!("iou_threshold {iou} must be in [0, 1]")));
    }
    let score_thr = one(4);
    let (sd, bx, sc) = (scores.shape().dims().to_vec(), boxes.to_f64_vec(), scores.to_f64_vec());
    let (nb, nc, n) = (sd[0], sd[1], sd[2]);
    let mut out: Vec<i64> = Vec::new();
    for b in 0..nb {
        for c in 0..nc {
            let s = &sc[(b * nc + c) * n..(b * nc + c + 1) * n];
            let mut cand: Vec<usize> = (0..n).filter(|&i| score_thr.is_none_or(|t| s[i] > t)).collect();
            cand.sort_by(|&i, &j| s[j].partial_cmp(&s[i]).unwrap_or(Ordering::Equal).then(i.cmp(&j)));
            let mut kept: Vec<usize> = Vec::new();
            for i in cand {
                if kept.len() >= max_out {
                    break;
                }
                let bi = &bx[(b * n + i) * 4..(b * n + i) * 4 + 4];
                if kept.iter().all(|&k| !suppresses(bi, &bx[(b * n + k) * 4..(b * n + k) * 4 + 4], center, iou)) {
                    kept.push(i);
                    out.extend_from_slice(&[b as i64, c as i64, i as i64]);
                }
            }
        }
    }
    let m = out.len() / 3;
    let ty = actual(cx, 0, 0, m)?;
    Ok(vec![i64s(cx, &ty, &out)?, extent(m)])
}

/// TopK with a run-time K: the static TopK at K, plus the extent.
fn top_k(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let k = cx.ints(1)?;
    let k = match k.as_slice() {
        [k] => *k,
        _ => return Err(cx.invalid("K must hold one value")),
    };
    let axis = {
        let a = cx.attrs::<kiln_ir::attrs::TopKAttrs>()?;
        cx.axis(a.axis, cx.input(0)?.shape().rank())?
    };
    let n = usize::try_from(k).map_err(|_| cx.invalid(format!("K = {k} is negative")))?;
    let tys = [actual(cx, 0, axis, n)?, actual(cx, 1, axis, n)?];
    let inner = Cx { op: cx.op, inputs: cx.inputs, out_types: &tys };
    let mut r = crate::reduce::topk(&inner)?;
    r.push(extent(n));
    Ok(r)
}
