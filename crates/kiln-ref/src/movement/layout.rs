//! Ops that reshape, reorder, select or replicate elements without looking at
//! their values.
//!
//! Choices where ONNX leaves room:
//! - Pad with negative pads crops first and then pads the cropped tensor (so
//!   `edge`, `reflect` and `wrap` read the cropped borders); `reflect` and `wrap`
//!   with pads larger than the axis repeat periodically; `edge`/`reflect`/`wrap`
//!   of an empty axis that needs padding is an error.
//! - Split by `num_outputs` uses chunks of `ceil(n / num_outputs)` with a smaller
//!   last chunk (a split that would leave a negative chunk is an error); without
//!   `split` or `num_outputs` the axis must divide evenly into the results.
//! - ReverseSequence needs every sequence length in `0..=time`.

use super::{build, elems, gather_tensor, out_checked, to_usize, unique_axes, Ax, FILL};
use crate::util::{broadcast_dims, row_major_strides, Cx};
use crate::EvalError;
use kiln_ir::attrs::{
    ConcatAttrs, DepthToSpaceAttrs, DepthToSpaceMode, FlattenAttrs, PadAttrs, PadMode, ReshapeAttrs,
    ReverseSequenceAttrs, ShapeAttrs, SpaceToDepthAttrs, SplitAttrs, TransposeAttrs, TriluAttrs,
};
use kiln_ir::{DType, OpKind, Tensor};

/// The same elements with the dims of result 0 (checked to be `dims`).
fn reshaped(cx: &Cx, x: &Tensor, dims: &[usize]) -> Result<Tensor, EvalError> {
    let ty = out_checked(cx, 0, x.dtype(), dims)?;
    x.reshaped(ty.shape.clone()).map_err(|e| cx.invalid(e.to_string()))
}

pub(super) fn reshape(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let shape = cx.ints(1)?;
    let allowzero = cx.attrs::<ReshapeAttrs>()?.allowzero;
    let xd = x.shape().dims();
    let mut dims = Vec::with_capacity(shape.len());
    let mut infer = None;
    for (i, &s) in shape.iter().enumerate() {
        if s == -1 {
            if infer.is_some() {
                return Err(cx.invalid("shape has more than one -1"));
            }
            infer = Some(i);
            dims.push(1);
        } else if s == 0 && !allowzero {
            let d = xd.get(i).ok_or_else(|| {
                cx.invalid(format!("shape[{i}] = 0 copies a dimension the input (rank {}) lacks", xd.len()))
            })?;
            dims.push(*d);
        } else {
            dims.push(to_usize(cx, s, "shape entry")?);
        }
    }
    let known = dims.iter().try_fold(1usize, |p, &d| p.checked_mul(d));
    let known = known.ok_or_else(|| cx.invalid(format!("shape {shape:?} is too large")))?;
    if let Some(i) = infer {
        if known == 0 || x.numel() % known != 0 {
            return Err(cx.invalid(format!("cannot infer the -1 of {shape:?} for {} elements", x.numel())));
        }
        dims[i] = x.numel() / known;
    } else if known != x.numel() {
        return Err(cx.invalid(format!("shape {shape:?} does not hold {} elements", x.numel())));
    }
    reshaped(cx, x, &dims)
}

pub(super) fn flatten(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let r = xd.len();
    let axis = cx.attrs::<FlattenAttrs>()?.axis;
    // Accepted range [-r, r]; a negative axis counts from the rank.
    let a = if axis < 0 { axis + r as i64 } else { axis };
    let a = usize::try_from(a)
        .ok()
        .filter(|&a| a <= r)
        .ok_or_else(|| cx.invalid(format!("axis {axis} out of range for rank {r}")))?;
    let dims = [xd[..a].iter().product(), xd[a..].iter().product()];
    reshaped(cx, x, &dims)
}

pub(super) fn squeeze(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let drop: Vec<bool> = match cx.opt_input(1) {
        Some(_) => {
            let mut drop = vec![false; xd.len()];
            for a in unique_axes(cx, &cx.ints(1)?, xd.len())? {
                if xd[a] != 1 {
                    return Err(cx.invalid(format!("cannot squeeze axis {a} of extent {}", xd[a])));
                }
                drop[a] = true;
            }
            drop
        }
        None => xd.iter().map(|&d| d == 1).collect(),
    };
    let dims: Vec<usize> = xd.iter().zip(&drop).filter(|(_, &s)| !s).map(|(&d, _)| d).collect();
    reshaped(cx, x, &dims)
}

pub(super) fn unsqueeze(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let axes = cx.ints(1)?;
    let r = xd.len() + axes.len();
    let mut ins = vec![false; r];
    for a in unique_axes(cx, &axes, r)? {
        ins[a] = true;
    }
    let mut it = xd.iter();
    let dims: Vec<usize> = ins
        .iter()
        .map(|&n| if n { Some(1) } else { it.next().copied() })
        .collect::<Option<_>>()
        .ok_or_else(|| cx.invalid("bad axes"))?;
    reshaped(cx, x, &dims)
}

pub(super) fn shape(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let r = xd.len() as i64;
    let clamp = |v: i64| (if v < 0 { v.saturating_add(r) } else { v }).clamp(0, r) as usize;
    let sa = cx.attrs::<ShapeAttrs>()?;
    let start = clamp(sa.start);
    let end = match sa.end {
        Some(e) => clamp(e),
        None => xd.len(),
    };
    let v: Vec<i64> = xd[start..end.max(start)].iter().map(|&d| d as i64).collect();
    let ty = out_checked(cx, 0, DType::I64, &[v.len()])?;
    cx.from_i64(ty, &v)
}

pub(super) fn size(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = out_checked(cx, 0, DType::I64, &[])?;
    cx.from_i64(ty, &[x.numel() as i64])
}

pub(super) fn expand(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let shape: Vec<usize> =
        cx.ints(1)?.into_iter().map(|s| to_usize(cx, s, "shape entry")).collect::<Result<_, _>>()?;
    let out =
        broadcast_dims(&[xd, &shape]).ok_or_else(|| cx.invalid(format!("cannot broadcast {xd:?} with {shape:?}")))?;
    let ty = out_checked(cx, 0, x.dtype(), &out)?;
    let strides = row_major_strides(xd);
    let off = out.len() - xd.len();
    let axes = (0..out.len())
        .map(|i| {
            let s = if i < off || xd[i - off] == 1 { 0 } else { strides[i - off] };
            Ax::lin(s, out[i])
        })
        .collect();
    gather_tensor(cx, x, ty, axes, &[])
}

pub(super) fn tile(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let reps = cx.ints(1)?;
    if reps.len() != xd.len() {
        return Err(cx.invalid(format!("{} repeats for rank {}", reps.len(), xd.len())));
    }
    let reps: Vec<usize> = reps.into_iter().map(|r| to_usize(cx, r, "repeat")).collect::<Result<_, _>>()?;
    let out: Vec<usize> = xd
        .iter()
        .zip(&reps)
        .map(|(&d, &r)| d.checked_mul(r))
        .collect::<Option<_>>()
        .ok_or_else(|| cx.invalid("result too large"))?;
    let ty = out_checked(cx, 0, x.dtype(), &out)?;
    // Output axis d is the pair (repeat, element): index r * xd[d] + i reads element i.
    let strides = row_major_strides(xd);
    let axes = (0..xd.len()).flat_map(|d| [Ax::lin(0, reps[d]), Ax::lin(strides[d], xd[d])]).collect();
    gather_tensor(cx, x, ty, axes, &[])
}

pub(super) fn transpose(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let r = xd.len();
    let perm: Vec<usize> = match &cx.attrs::<TransposeAttrs>()?.perm {
        Some(p) => {
            if p.len() != r {
                return Err(cx.invalid(format!("perm {p:?} for rank {r}")));
            }
            let mut seen = vec![false; r];
            p.iter()
                .map(|&a| match usize::try_from(a) {
                    Ok(a) if a < r && !seen[a] => {
                        seen[a] = true;
                        Ok(a)
                    }
                    _ => Err(cx.invalid(format!("perm {p:?} is not a permutation"))),
                })
                .collect::<Result<_, _>>()?
        }
        None => (0..r).rev().collect(),
    };
    let out: Vec<usize> = perm.iter().map(|&p| xd[p]).collect();
    let ty = out_checked(cx, 0, x.dtype(), &out)?;
    let strides = row_major_strides(xd);
    let axes = perm.iter().map(|&p| Ax::lin(strides[p], xd[p])).collect();
    gather_tensor(cx, x, ty, axes, &[])
}

pub(super) fn slice(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let r = xd.len();
    let starts = cx.ints(1)?;
    let ends = cx.ints(2)?;
    let n = starts.len();
    let axes = cx.opt_ints(3)?.unwrap_or_else(|| (0..n as i64).collect());
    let steps = cx.opt_ints(4)?.unwrap_or_else(|| vec![1; n]);
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err(cx.invalid("starts, ends, axes and steps differ in length"));
    }
    let axes = unique_axes(cx, &axes, r)?;
    let strides = row_major_strides(xd);
    let mut ax: Vec<Ax> = (0..r).map(|d| Ax::lin(strides[d], xd[d])).collect();
    let mut out = xd.to_vec();
    for (k, &a) in axes.iter().enumerate() {
        let (d, step) = (xd[a] as i128, steps[k] as i128);
        if step == 0 {
            return Err(cx.invalid("step 0"));
        }
        let (mut s, mut e) = (starts[k] as i128, ends[k] as i128);
        if s < 0 {
            s += d;
        }
        if e < 0 {
            e += d;
        }
        let count = if step > 0 {
            let (s, e) = (s.max(0).min(d), e.max(0).min(d));
            (e - s + step - 1).div_euclid(step).max(0)
        } else {
            s = s.max(0).min(d - 1);
            e = e.max(-1).min(d - 1);
            (s - e - step - 1).div_euclid(-step).max(0)
        };
        let s = if step > 0 { s.max(0).min(d) } else { s };
        out[a] = count as usize;
        ax[a] = if count == 0 {
            Ax::lin(0, 0)
        } else {
            let st = strides[a] as i128;
            Ax::Lin { start: (s * st) as usize, stride: (step * st) as isize, len: count as usize }
        };
    }
    let ty = out_checked(cx, 0, x.dtype(), &out)?;
    gather_tensor(cx, x, ty, ax, &[])
}

pub(super) fn pad(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let r = xd.len();
    let pads = cx.ints(1)?;
    let mode = cx.attrs::<PadAttrs>()?.mode;
    let axes = match cx.opt_ints(3)? {
        Some(axes) => unique_axes(cx, &axes, r)?,
        None => (0..r).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.invalid(format!("{} pads for {} axes", pads.len(), axes.len())));
    }
    // Per padded axis: (axis, elements cropped at the start, length kept, added at the start).
    let mut plan = Vec::with_capacity(axes.len());
    let mut out = xd.to_vec();
    for (k, &a) in axes.iter().enumerate() {
        let (pb, pe) = (pads[k] as i128, pads[k + axes.len()] as i128);
        if pb == 0 && pe == 0 {
            continue;
        }
        let d = xd[a] as i128;
        // Crop first, then pad the remaining `len` elements starting at `crop`.
        let len = d - (-pb).max(0) - (-pe).max(0);
        if len < 0 {
            return Err(cx.invalid(format!("pads {pb}, {pe} crop more than the {d} elements of axis {a}")));
        }
        let n = pb.max(0) + len + pe.max(0);
        if n > kiln_ir::shape::MAX_ELEMENTS as i128 {
            return Err(cx.invalid("result too large"));
        }
        if len == 0 && mode != PadMode::Constant && n > 0 {
            return Err(cx.invalid(format!("cannot pad an empty axis in mode {mode}")));
        }
        plan.push((a, (-pb).max(0), len, pb.max(0)));
        out[a] = n as usize;
    }
    let ty = out_checked(cx, 0, x.dtype(), &out)?;
    let strides = row_major_strides(xd);
    let mut ax: Vec<Ax> = (0..r).map(|d| Ax::lin(strides[d], xd[d])).collect();
    for (a, crop, len, add) in plan {
        let table = (0..out[a] as i128)
            .map(|j| {
                let i = j - add;
                let src = if (0..len).contains(&i) {
                    i
                } else {
                    match mode {
                        PadMode::Edge => i.max(0).min(len - 1),
                        PadMode::Wrap => i.rem_euclid(len),
                        PadMode::Reflect if len == 1 => 0,
                        PadMode::Reflect => {
                            let p = 2 * (len - 1);
                            let m = i.rem_euclid(p);
                            if m >= len {
                                p - m
                            } else {
                                m
                            }
                        }
                        PadMode::Constant => return FILL,
                    }
                };
                ((crop + src) * strides[a] as i128) as usize
            })
            .collect();
        ax[a] = Ax::Map(table);
    }
    let fill = super::first_elem_or_zero(cx, cx.opt_input(2), x.dtype())?;
    gather_tensor(cx, x, ty, ax, &fill)
}

pub(super) fn concat(cx: &Cx) -> Result<Tensor, EvalError> {
    let ins: Vec<&Tensor> = (0..cx.inputs.len()).map(|i| cx.input(i)).collect::<Result<_, _>>()?;
    let first = *ins.first().ok_or_else(|| cx.invalid("no inputs"))?;
    let d0 = first.shape().dims();
    let r = d0.len();
    let a = cx.axis(cx.attrs::<ConcatAttrs>()?.axis, r)?;
    let mut out = d0.to_vec();
    out[a] = 0;
    for t in &ins {
        let d = t.shape().dims();
        if t.dtype() != first.dtype()
            || d.len() != r
            || d.iter().zip(d0).enumerate().any(|(i, (x, y))| i != a && x != y)
        {
            return Err(cx.invalid(format!("cannot concatenate {} with {}", first.ty(), t.ty())));
        }
        out[a] += d[a];
    }
    let ty = out_checked(cx, 0, first.dtype(), &out)?;
    let outer: usize = d0[..a].iter().product();
    let inner: usize = d0[a + 1..].iter().product();
    let es: Vec<_> = ins.iter().map(|t| elems(t)).collect();
    let w = es[0].w;
    let mut data = Vec::with_capacity(ty.shape.numel() * w);
    for o in 0..outer {
        for (t, e) in ins.iter().zip(&es) {
            let block = t.shape().dims()[a] * inner * w;
            let chunk = e.data.get(o * block..(o + 1) * block).ok_or_else(|| cx.invalid("short input"))?;
            data.extend_from_slice(chunk);
        }
    }
    build(cx, ty, data)
}

pub(super) fn split(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let split = cx.attrs::<SplitAttrs>()?;
    let a = cx.axis(split.axis, xd.len())?;
    let n = xd[a];
    let results = cx.out_types.len();
    let sizes: Vec<usize> = if let Some(s) = cx.opt_ints(1)? {
        let s: Vec<usize> = s.into_iter().map(|v| to_usize(cx, v, "split")).collect::<Result<_, _>>()?;
        if s.iter().try_fold(0usize, |t, &v| t.checked_add(v)) != Some(n) {
            return Err(cx.invalid(format!("split {s:?} does not sum to {n}")));
        }
        s
    } else if let Some(k) = split.num_outputs {
        let k = to_usize(cx, k, "num_outputs")?;
        if k == 0 {
            return Err(cx.invalid("num_outputs 0"));
        }
        let chunk = n.div_ceil(k);
        let rest = n
            .checked_sub(chunk * (k - 1))
            .ok_or_else(|| cx.invalid(format!("axis of {n} cannot be split into {k} chunks of {chunk}")))?;
        let mut s = vec![chunk; k];
        s[k - 1] = rest;
        s
    } else {
        if results == 0 || n % results != 0 {
            return Err(cx.invalid(format!("axis of {n} does not split evenly into {results}")));
        }
        vec![n / results; results]
    };
    if sizes.len() < results {
        return Err(cx.invalid(format!("{} chunks for {results} results", sizes.len())));
    }
    let outer: usize = xd[..a].iter().product();
    let inner: usize = xd[a + 1..].iter().product();
    let e = elems(x);
    let w = e.w;
    let mut res = Vec::with_capacity(results);
    let mut start = 0usize;
    for (i, &len) in sizes.iter().enumerate().take(results) {
        let mut dims = xd.to_vec();
        dims[a] = len;
        let ty = out_checked(cx, i, x.dtype(), &dims)?;
        let mut data = Vec::with_capacity(outer * len * inner * w);
        for o in 0..outer {
            let b = ((o * n + start) * inner) * w;
            let chunk = e.data.get(b..b + len * inner * w).ok_or_else(|| cx.invalid("short input"))?;
            data.extend_from_slice(chunk);
        }
        res.push(build(cx, ty, data)?);
        start += len;
    }
    Ok(res)
}

/// `(N, C, H, W)` of a rank-4 operand and the block size.
fn nchw_block(cx: &Cx, x: &Tensor) -> Result<([usize; 4], usize), EvalError> {
    let d = x.shape().dims();
    let dims: [usize; 4] = d.try_into().map_err(|_| cx.invalid(format!("input rank {} is not 4", d.len())))?;
    let b = match cx.kind() {
        OpKind::DepthToSpace => cx.attrs::<DepthToSpaceAttrs>()?.blocksize,
        _ => cx.attrs::<SpaceToDepthAttrs>()?.blocksize,
    };
    let b = to_usize(cx, b, "blocksize")?;
    if b == 0 {
        return Err(cx.invalid("blocksize 0"));
    }
    Ok((dims, b))
}

pub(super) fn depth_to_space(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ([n, c, h, w], b) = nchw_block(cx, x)?;
    if c % (b * b) != 0 {
        return Err(cx.invalid(format!("channels {c} not divisible by blocksize² {}", b * b)));
    }
    let co = c / (b * b);
    let ty = out_checked(cx, 0, x.dtype(), &[n, co, h * b, w * b])?;
    let sc = h * w;
    // Output (n, c', h, i, w, j) with y = h*b + i, x = w*b + j.
    let (s_c, s_i, s_j) = match cx.attrs::<DepthToSpaceAttrs>()?.mode {
        // Input channel (i*b + j)*C' + c'.
        DepthToSpaceMode::Dcr => (sc, b * co * sc, co * sc),
        // Input channel c'*b*b + i*b + j.
        DepthToSpaceMode::Crd => (b * b * sc, b * sc, sc),
    };
    let axes =
        vec![Ax::lin(c * sc, n), Ax::lin(s_c, co), Ax::lin(w, h), Ax::lin(s_i, b), Ax::lin(1, w), Ax::lin(s_j, b)];
    gather_tensor(cx, x, ty, axes, &[])
}

pub(super) fn space_to_depth(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ([n, c, h, w], b) = nchw_block(cx, x)?;
    if h % b != 0 || w % b != 0 {
        return Err(cx.invalid(format!("spatial dims {h}x{w} not divisible by blocksize {b}")));
    }
    let (ho, wo) = (h / b, w / b);
    let ty = out_checked(cx, 0, x.dtype(), &[n, c * b * b, ho, wo])?;
    // Output (n, i, j, c, h', w'): channel (i*b + j)*C + c reads (c, h'*b + i, w'*b + j).
    let axes = vec![
        Ax::lin(c * h * w, n),
        Ax::lin(w, b),
        Ax::lin(1, b),
        Ax::lin(h * w, c),
        Ax::lin(b * w, ho),
        Ax::lin(b, wo),
    ];
    gather_tensor(cx, x, ty, axes, &[])
}

pub(super) fn reverse_sequence(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    if xd.len() < 2 {
        return Err(cx.invalid(format!("input rank {} < 2", xd.len())));
    }
    let ra = cx.attrs::<ReverseSequenceAttrs>()?;
    let (ba, ta) = (ra.batch_axis, ra.time_axis);
    if !matches!((ba, ta), (0, 1) | (1, 0)) {
        return Err(cx.invalid(format!("batch_axis {ba} and time_axis {ta} must be 0 and 1")));
    }
    let (nb, nt) = if ba == 0 { (xd[0], xd[1]) } else { (xd[1], xd[0]) };
    let lens = cx.ints(1)?;
    if lens.len() != nb {
        return Err(cx.invalid(format!("{} sequence lengths for a batch of {nb}", lens.len())));
    }
    let lens: Vec<usize> = lens
        .into_iter()
        .map(|l| match usize::try_from(l) {
            Ok(l) if l <= nt => Ok(l),
            _ => Err(cx.invalid(format!("sequence length {l} outside 0..={nt}"))),
        })
        .collect::<Result<_, _>>()?;
    let ty = out_checked(cx, 0, x.dtype(), xd)?;
    let inner: usize = xd[2..].iter().product();
    let e = elems(x);
    let blk = inner * e.w;
    let mut data = Vec::with_capacity(e.data.len());
    for p in 0..xd[0] {
        for q in 0..xd[1] {
            let (bi, t) = if ba == 0 { (p, q) } else { (q, p) };
            let src_t = if t < lens[bi] { lens[bi] - 1 - t } else { t };
            let (sp, sq) = if ba == 0 { (p, src_t) } else { (src_t, q) };
            let o = (sp * xd[1] + sq) * blk;
            data.extend_from_slice(e.data.get(o..o + blk).ok_or_else(|| cx.invalid("short input"))?);
        }
    }
    build(cx, ty, data)
}

pub(super) fn trilu(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let r = xd.len();
    if r < 2 {
        return Err(cx.invalid(format!("input rank {r} < 2")));
    }
    let k = match cx.opt_ints(1)?.as_deref() {
        Some([k]) => *k,
        Some(v) => return Err(cx.invalid(format!("k has {} elements", v.len()))),
        None => 0,
    };
    let upper = cx.attrs::<TriluAttrs>()?.upper;
    let ty = out_checked(cx, 0, x.dtype(), xd)?;
    let (rows, cols) = (xd[r - 2], xd[r - 1]);
    let e = elems(x);
    let w = e.w;
    let mut data = e.data.into_owned();
    for (i, row) in data.chunks_exact_mut(cols.max(1) * w).enumerate() {
        if cols == 0 {
            break;
        }
        let i = (i % rows.max(1)) as i128;
        // Columns kept: j - i >= k (upper) or j - i <= k (lower).
        let edge = i + k as i128;
        let (zs, ze) = if upper {
            (0, edge.max(0).min(cols as i128) as usize)
        } else {
            ((edge + 1).max(0).min(cols as i128) as usize, cols)
        };
        row[zs * w..ze * w].fill(0);
    }
    build(cx, ty, data)
}
