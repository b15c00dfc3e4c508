//! Reductions (ReduceSum … ReduceLogSumExp), ArgMax/ArgMin, CumSum, the softmax
//! family (Softmax, LogSoftmax, Hardmax: along one axis, opset-13 form) and TopK.
//!
//! Floats reduce in `f64` and round once; integer Sum/Prod/SumSquare/L1 wrap like
//! the dtype, Max/Min compare exactly (unsigned as `u64`), Mean is the truncated
//! exact mean; integer L2/LogSum/LogSumExp go through `f64` and truncate.
//! Reducing over an empty set of elements gives the identity of the reduction:
//! Sum/L1/L2/SumSquare 0, Prod 1, Max −inf (or the dtype's minimum), Min +inf (or
//! its maximum), LogSum and LogSumExp −inf, Mean NaN (0 for integers).
//! With `noop_with_empty_axes=1` and no axes, each element is reduced alone (so
//! ReduceSumSquare squares, ReduceL1 takes |x|, as the ONNX reference does).
//! NaN: Reduce Max/Min propagate it; ArgMax/ArgMin and Hardmax pick the first NaN
//! (the last one with `select_last_index=1`), as numpy does; TopK orders NaN above
//! every number and returns ties lower index first; `sorted=0` still sorts.

use crate::elementwise::{icmp, int_range, raw_elems, read_f64, read_i64, widen, write_f64};
use crate::util::{broadcast_map, Cx};
use crate::EvalError;
use kiln_ir::attrs::{ArgReduceAttrs, CumSumAttrs, ReduceAttrs, SoftmaxAttrs, TopKAttrs};
use kiln_ir::shape::reduced_dims;
use kiln_ir::{DType, OpKind, Tensor};
use std::cmp::Ordering;

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    use OpKind::*;
    match cx.kind() {
        ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMax | ReduceMean | ReduceMin | ReduceProd
        | ReduceSum | ReduceSumSquare => Ok(vec![reduce(cx)?]),
        ArgMax | ArgMin => Ok(vec![arg_reduce(cx)?]),
        CumSum => Ok(vec![cumsum(cx)?]),
        Softmax | LogSoftmax | Hardmax => Ok(vec![softmax(cx)?]),
        TopK => topk(cx),
        _ => Err(cx.unsupported("not a reduction")),
    }
}

/// `v` (row-major, of dims `dims`) with each lane along `axis` replaced by what `f`
/// writes for it: `f(lane, out)` gets the lane's values and a zeroed lane to fill.
pub(crate) fn map_lanes(v: &[f64], dims: &[usize], axis: usize, mut f: impl FnMut(&[f64], &mut [f64])) -> Vec<f64> {
    let (outer, n, inner) = split_at_axis(dims, axis);
    let mut out = vec![0.0; v.len()];
    let (mut lane, mut res) = (vec![0.0; n], vec![0.0; n]);
    for o in 0..outer {
        for i in 0..inner {
            let idx = |k: usize| (o * n + k) * inner + i;
            for (k, l) in lane.iter_mut().enumerate() {
                *l = v[idx(k)];
            }
            res.fill(0.0);
            f(&lane, &mut res);
            for (k, r) in res.iter().enumerate() {
                out[idx(k)] = *r;
            }
        }
    }
    out
}

/// `(outer, n, inner)` sizes around `axis`: element `(o, k, i)` is at `(o*n + k)*inner + i`.
pub(crate) fn split_at_axis(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    (outer, dims[axis], inner)
}

use crate::util::out_checked;

fn reduce(cx: &Cx) -> Result<Tensor, EvalError> {
    use OpKind::*;
    let k = cx.kind();
    let x = cx.input(0)?;
    let d = x.dtype();
    let xd = x.shape().dims();
    let rank = xd.len();
    let ra = cx.attrs::<ReduceAttrs>()?;
    let (keep, noop) = (ra.keepdims, ra.noop_with_empty_axes);
    let axes = cx.opt_ints(1)?.unwrap_or_default();
    let mut red = vec![axes.is_empty() && !noop; rank];
    for &a in &axes {
        let a = cx.axis(a, rank)?;
        if red[a] {
            return Err(cx.invalid(format!("axis {a} is listed twice")));
        }
        red[a] = true;
    }
    let ty = out_checked(cx, 0, d, &reduced_dims(xd, &red, keep))?;
    let kd = reduced_dims(xd, &red, true);
    let m: usize = kd.iter().product();
    let count: usize = xd.iter().zip(&red).filter(|(_, &r)| r).map(|(&n, _)| n).product();
    let map = broadcast_map(&kd, xd);

    let float_path = d.is_float() || matches!(k, ReduceL2 | ReduceLogSum | ReduceLogSumExp);
    if float_path {
        let v = read_f64(cx, x)?;
        let mut acc = vec![0.0f64; m];
        match k {
            ReduceMax | ReduceMin | ReduceLogSumExp => {
                let max = k != ReduceMin;
                acc.fill(if max { f64::NEG_INFINITY } else { f64::INFINITY });
                for (&o, &p) in map.iter().zip(&v) {
                    let a = &mut acc[o];
                    // Once NaN, stays NaN.
                    if !a.is_nan() && (p.is_nan() || (max && p > *a) || (!max && p < *a)) {
                        *a = p;
                    }
                }
                if k == ReduceLogSumExp {
                    let mut s = vec![0.0f64; m];
                    for (&o, &p) in map.iter().zip(&v) {
                        if acc[o].is_finite() {
                            s[o] += (p - acc[o]).exp();
                        }
                    }
                    for (a, s) in acc.iter_mut().zip(&s) {
                        if a.is_finite() {
                            *a += s.ln();
                        }
                    }
                }
            }
            ReduceProd => {
                acc.fill(1.0);
                map.iter().zip(&v).for_each(|(&o, &p)| acc[o] *= p);
            }
            _ => {
                let f: fn(f64) -> f64 = match k {
                    ReduceL1 => f64::abs,
                    ReduceL2 | ReduceSumSquare => |p| p * p,
                    _ => |p| p,
                };
                map.iter().zip(&v).for_each(|(&o, &p)| acc[o] += f(p));
                let g: fn(f64, f64) -> f64 = match k {
                    ReduceL2 => |s, _| s.sqrt(),
                    ReduceLogSum => |s, _| s.ln(),
                    ReduceMean => |s, n| s / n,
                    _ => |s, _| s,
                };
                acc.iter_mut().for_each(|s| *s = g(*s, count as f64));
            }
        }
        return write_f64(cx, ty, &acc);
    }

    let v = read_i64(cx, x)?;
    let uns = d.is_unsigned_int();
    let acc: Vec<i64> = match k {
        ReduceMax | ReduceMin => {
            let max = k == ReduceMax;
            let (lo, hi) = int_range(d);
            let mut acc = vec![if max { lo as i64 } else { hi as i64 }; m];
            for (&o, &p) in map.iter().zip(&v) {
                let want = if max { Ordering::Greater } else { Ordering::Less };
                if icmp(p, acc[o], uns) == want {
                    acc[o] = p;
                }
            }
            acc
        }
        ReduceMean => {
            let mut s = vec![0i128; m];
            map.iter().zip(&v).for_each(|(&o, &p)| s[o] += widen(p, uns));
            s.iter().map(|&s| if count == 0 { 0 } else { (s / count as i128) as i64 }).collect()
        }
        ReduceProd => {
            let mut acc = vec![1i64; m];
            map.iter().zip(&v).for_each(|(&o, &p)| acc[o] = acc[o].wrapping_mul(p));
            acc
        }
        _ => {
            let f: fn(i64) -> i64 = match (k, uns) {
                (ReduceL1, false) => i64::wrapping_abs,
                (ReduceSumSquare, _) => |p| p.wrapping_mul(p),
                _ => |p| p,
            };
            let mut acc = vec![0i64; m];
            map.iter().zip(&v).for_each(|(&o, &p)| acc[o] = acc[o].wrapping_add(f(p)));
            acc
        }
    };
    cx.from_i64(ty, &acc)
}

/// For arg-reductions: does candidate `x` replace the current best `b`?
/// `greater` is true for ArgMax; NaN wins over numbers, the first NaN (or the last
/// with `last`) over other NaNs; ties go to the first (or last) index.
fn better_f(x: f64, b: f64, greater: bool, last: bool) -> bool {
    match (x.is_nan(), b.is_nan()) {
        (_, true) => last && x.is_nan(),
        (true, false) => true,
        (false, false) => (if greater { x > b } else { x < b }) || (last && x == b),
    }
}

fn better_i(x: i64, b: i64, uns: bool, greater: bool, last: bool) -> bool {
    match icmp(x, b, uns) {
        Ordering::Greater => greater,
        Ordering::Less => !greater,
        Ordering::Equal => last,
    }
}

fn arg_reduce(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let d = x.dtype();
    let xd = x.shape().dims();
    let aa = cx.attrs::<ArgReduceAttrs>()?;
    let axis = cx.axis(aa.axis, xd.len())?;
    let (keep, last) = (aa.keepdims, aa.select_last_index);
    let greater = cx.kind() == OpKind::ArgMax;
    let red: Vec<bool> = (0..xd.len()).map(|i| i == axis).collect();
    let ty = out_checked(cx, 0, DType::I64, &reduced_dims(xd, &red, keep))?;
    let (outer, n, inner) = split_at_axis(xd, axis);
    if n == 0 && outer * inner > 0 {
        return Err(cx.invalid("arg-reduction over an empty axis"));
    }
    let out = if d.is_float() {
        let v = x.to_f64_vec();
        arg_best(&v, outer, n, inner, |a, b| better_f(a, b, greater, last))
    } else {
        let v = read_i64(cx, x)?;
        let uns = d.is_unsigned_int();
        arg_best(&v, outer, n, inner, |a, b| better_i(a, b, uns, greater, last))
    };
    cx.from_i64(ty, &out)
}

/// For each of the `outer·inner` lines of `v` (`[outer, n, inner]`) along its middle
/// axis, the index of the best element: the first, replaced by each later one `better`
/// than the best so far.
fn arg_best<T: Copy>(v: &[T], outer: usize, n: usize, inner: usize, better: impl Fn(T, T) -> bool) -> Vec<i64> {
    let mut out = vec![0i64; outer * inner];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| v[(o * n + k) * inner + i];
            let mut best = 0;
            for k in 1..n {
                if better(at(k), at(best)) {
                    best = k;
                }
            }
            out[o * inner + i] = best as i64;
        }
    }
    out
}

fn cumsum(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let d = x.dtype();
    let xd = x.shape().dims();
    let ty = out_checked(cx, 0, d, xd)?;
    let a = cx.ints(1)?;
    if a.len() != 1 {
        return Err(cx.invalid("axis must hold one value"));
    }
    let axis = cx.axis(a[0], xd.len())?;
    let ca = cx.attrs::<CumSumAttrs>()?;
    let (exclusive, reverse) = (ca.exclusive, ca.reverse);
    let (outer, n, inner) = split_at_axis(xd, axis);
    // Visits every lane in scan order, calling `step(index)`.
    let scan = |f: &mut dyn FnMut(usize, bool)| {
        for o in 0..outer {
            for i in 0..inner {
                for s in 0..n {
                    let k = if reverse { n - 1 - s } else { s };
                    f((o * n + k) * inner + i, s == 0);
                }
            }
        }
    };
    if d.is_float() {
        let v = x.to_f64_vec();
        let mut out = vec![0.0; v.len()];
        let mut run = 0.0;
        scan(&mut |j, first| {
            if first {
                run = 0.0;
            }
            if exclusive {
                out[j] = run;
                run += v[j];
            } else {
                run += v[j];
                out[j] = run;
            }
        });
        return write_f64(cx, ty, &out);
    }
    let v = read_i64(cx, x)?;
    let mut out = vec![0i64; v.len()];
    let mut run = 0i64;
    scan(&mut |j, first| {
        if first {
            run = 0;
        }
        if exclusive {
            out[j] = run;
            run = run.wrapping_add(v[j]);
        } else {
            run = run.wrapping_add(v[j]);
            out[j] = run;
        }
    });
    cx.from_i64(ty, &out)
}

fn softmax(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.float_input(0)?;
    let xd = x.shape().dims();
    let ty = out_checked(cx, 0, x.dtype(), xd)?;
    let axis = cx.axis(cx.attrs::<SoftmaxAttrs>()?.axis, xd.len())?;
    let kind = cx.kind();
    let out = map_lanes(&x.to_f64_vec(), xd, axis, |lane, out| match kind {
        OpKind::Hardmax => {
            let mut best = 0;
            for k in 1..lane.len() {
                if better_f(lane[k], lane[best], true, false) {
                    best = k;
                }
            }
            if let Some(o) = out.get_mut(best) {
                *o = 1.0;
            }
        }
        kind => {
            let m = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = lane.iter().map(|&v| (v - m).exp()).sum();
            for (o, &v) in out.iter_mut().zip(lane) {
                let z = v - m;
                *o = if kind == OpKind::Softmax { z.exp() / s } else { z - s.ln() };
            }
        }
    });
    write_f64(cx, ty, &out)
}

/// Total order for TopK: NaN above every number, NaNs equal.
fn total_cmp_nan_high(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

pub(crate) fn topk(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = cx.input(0)?;
    let d = x.dtype();
    let xd = x.shape().dims();
    let ta = cx.attrs::<TopKAttrs>()?;
    let axis = cx.axis(ta.axis, xd.len())?;
    let largest = ta.largest;
    let kv = cx.ints(1)?;
    if kv.len() != 1 {
        return Err(cx.invalid("K must hold one value"));
    }
    let (outer, n, inner) = split_at_axis(xd, axis);
    let k = usize::try_from(kv[0])
        .ok()
        .filter(|&k| k <= n)
        .ok_or_else(|| cx.invalid(format!("K = {} out of range for axis of size {n}", kv[0])))?;
    let mut od = xd.to_vec();
    od[axis] = k;
    let vty = out_checked(cx, 0, d, &od)?;
    let ity = if cx.out_types.len() > 1 { Some(out_checked(cx, 1, DType::I64, &od)?) } else { None };

    // Sort keys: floats with NaN highest, integers exactly.
    let fv = if d.is_float() { Some(x.to_f64_vec()) } else { None };
    let iv = if d.is_float() { None } else { Some(read_i64(cx, x)?) };
    let uns = d.is_unsigned_int();
    let cmp = |a: usize, b: usize| -> Ordering {
        match (&fv, &iv) {
            (Some(f), _) => total_cmp_nan_high(f[a], f[b]),
            (_, Some(i)) => icmp(i[a], i[b], uns),
            _ => Ordering::Equal,
        }
    };
    let raw = raw_elems(x);
    let mut vals = Vec::with_capacity(outer * k * inner);
    let mut idxs = vec![0i64; outer * k * inner];
    let mut lane: Vec<usize> = Vec::with_capacity(n);
    vals.resize(outer * k * inner, 0u64);
    for o in 0..outer {
        for i in 0..inner {
            lane.clear();
            lane.extend((0..n).map(|j| (o * n + j) * inner + i));
            // Stable sort: equal keys keep the lower index first.
            if largest {
                lane.sort_by(|&a, &b| cmp(b, a));
            } else {
                lane.sort_by(|&a, &b| cmp(a, b));
            }
            for (j, &src) in lane.iter().take(k).enumerate() {
                let dst = (o * k + j) * inner + i;
                vals[dst] = raw[src];
                idxs[dst] = ((src / inner) % n.max(1)) as i64;
            }
        }
    }
    let mut out = vec![crate::elementwise::from_raw(cx, vty, &vals)?];
    if let Some(ity) = ity {
        out.push(cx.from_i64(ity, &idxs)?);
    }
    Ok(out)
}
