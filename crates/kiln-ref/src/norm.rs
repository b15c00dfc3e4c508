//! Normalisations: BatchNormalization (inference form), InstanceNormalization,
//! LayerNormalization (Y, Mean, InvStdDev), GroupNormalization (opset 21: scale and
//! bias per channel), LpNormalization, LRN and MeanVarianceNormalization.
//!
//! Statistics are two-pass (mean, then mean of squared deviations: the population
//! variance) in `f64`, whatever `stash_type` says; results round once to the
//! result dtype. Choices: LpNormalization of an all-zero lane gives zeros (as ONNX
//! Runtime), and uses |x| for p = 1; MeanVarianceNormalization is
//! `(x − mean) / (sqrt(var) + 1e-9)` as the ONNX function body defines it.

use crate::elementwise::{check_unidirectional, expand, read_f64, write_f64};
use crate::reduce::map_lanes;
use crate::util::Cx;
use crate::EvalError;
use kiln_ir::attrs::{
    BatchNormAttrs, GroupNormAttrs, InstanceNormAttrs, LayerNormAttrs, LpNormAttrs, LrnAttrs, MvnAttrs, RmsNormAttrs,
};
use kiln_ir::{OpKind, Tensor, TensorType};

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    use OpKind::*;
    match cx.kind() {
        BatchNormalization => batch_norm(cx),
        InstanceNormalization => Ok(vec![instance_norm(cx)?]),
        LayerNormalization => layer_norm(cx),
        RMSNormalization => Ok(vec![rms_norm(cx)?]),
        GroupNormalization => Ok(vec![group_norm(cx)?]),
        LpNormalization => Ok(vec![lp_norm(cx)?]),
        LRN => Ok(vec![lrn(cx)?]),
        MeanVarianceNormalization => Ok(vec![mvn(cx)?]),
        _ => Err(cx.unsupported("not a normalisation")),
    }
}

/// The `epsilon` of the normalisation being evaluated.
fn eps(cx: &Cx) -> Result<f64, EvalError> {
    let e = match cx.kind() {
        OpKind::BatchNormalization => cx.attrs::<BatchNormAttrs>()?.epsilon,
        OpKind::InstanceNormalization => cx.attrs::<InstanceNormAttrs>()?.epsilon,
        OpKind::LayerNormalization => cx.attrs::<LayerNormAttrs>()?.epsilon,
        _ => cx.attrs::<GroupNormAttrs>()?.epsilon,
    };
    Ok(e as f64)
}

/// RMSNormalization: `Y = X / sqrt(mean(X²) + ε) · Scale`, the mean over the axes from
/// `axis` on (in f64).
fn rms_norm(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, ty) = x_and_out(cx)?;
    let xd = x.shape().dims();
    let a = cx.attrs::<RmsNormAttrs>()?;
    let axis = cx.axis(a.axis, xd.len())?;
    let e = a.epsilon as f64;
    let inner: usize = xd[axis..].iter().product();
    let s = cx.input(1)?;
    check_unidirectional(cx, s.shape().dims(), xd)?;
    let scale = expand(read_f64(cx, s)?, s.shape().dims(), xd);
    let v = x.to_f64_vec();
    let mut y = vec![0.0; v.len()];
    for (o, lane) in v.chunks(inner.max(1)).enumerate() {
        let mean_square = lane.iter().map(|x| x * x).sum::<f64>() / lane.len() as f64;
        let inv = 1.0 / (mean_square + e).sqrt();
        for (j, &xj) in lane.iter().enumerate() {
            let k = o * inner + j;
            y[k] = xj * inv * scale[k];
        }
    }
    write_f64(cx, ty, &y)
}

/// The float operand `X` and the result type, which must match it.
fn x_and_out<'a>(cx: &Cx<'a>) -> Result<(&'a Tensor, &'a TensorType), EvalError> {
    let x = cx.float_input(0)?;
    let ty = cx.out_type(0)?;
    if ty != x.ty() {
        return Err(cx.invalid(format!("result type {ty} differs from X {}", x.ty())));
    }
    Ok((x, ty))
}

/// Batch, channels and elements per channel of an `[N, C, ...]` operand (rank ≥ 2).
fn nc_inner(cx: &Cx, x: &Tensor) -> Result<(usize, usize, usize), EvalError> {
    let xd = x.shape().dims();
    if xd.len() < 2 {
        return Err(cx.invalid("input must have rank 2 or more"));
    }
    Ok((xd[0], xd[1], xd[2..].iter().product()))
}

/// A per-channel operand: `c` values.
fn per_channel(cx: &Cx, i: usize, c: usize, what: &str) -> Result<Vec<f64>, EvalError> {
    let t = cx.input(i)?;
    if t.numel() != c {
        return Err(cx.invalid(format!("{what} has {} elements, {c} channels expected", t.numel())));
    }
    read_f64(cx, t)
}

/// Mean and population variance of `vals`.
fn stats(vals: impl Iterator<Item = f64> + Clone) -> (f64, f64) {
    let (mut n, mut s) = (0usize, 0.0);
    for v in vals.clone() {
        n += 1;
        s += v;
    }
    let mean = s / n as f64;
    let var = vals.map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
    (mean, var)
}

fn batch_norm(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    if cx.attrs::<BatchNormAttrs>()?.training_mode || cx.out_types.len() > 1 {
        return Err(cx.unsupported("training mode (only the inference form is supported)"));
    }
    let (x, ty) = x_and_out(cx)?;
    let xd = x.shape().dims();
    let c = if xd.len() >= 2 { xd[1] } else { 1 };
    let inner: usize = xd.iter().skip(2).product();
    let scale = per_channel(cx, 1, c, "scale")?;
    let bias = per_channel(cx, 2, c, "B")?;
    let mean = per_channel(cx, 3, c, "input_mean")?;
    let var = per_channel(cx, 4, c, "input_var")?;
    let e = eps(cx)?;
    let v = x.to_f64_vec();
    let out: Vec<f64> = v
        .iter()
        .enumerate()
        .map(|(j, &p)| {
            let ch = (j / inner.max(1)) % c.max(1);
            (p - mean[ch]) / (var[ch] + e).sqrt() * scale[ch] + bias[ch]
        })
        .collect();
    Ok(vec![write_f64(cx, ty, &out)?])
}

fn instance_norm(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, ty) = x_and_out(cx)?;
    let (n, c, inner) = nc_inner(cx, x)?;
    let scale = per_channel(cx, 1, c, "scale")?;
    let bias = per_channel(cx, 2, c, "B")?;
    let e = eps(cx)?;
    let v = x.to_f64_vec();
    let mut out = vec![0.0; v.len()];
    for b in 0..n {
        for ch in 0..c {
            let base = (b * c + ch) * inner;
            let lane = &v[base..base + inner];
            let (mean, var) = stats(lane.iter().copied());
            let inv = 1.0 / (var + e).sqrt();
            for (o, &p) in out[base..base + inner].iter_mut().zip(lane) {
                *o = (p - mean) * inv * scale[ch] + bias[ch];
            }
        }
    }
    write_f64(cx, ty, &out)
}

fn layer_norm(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let (x, ty) = x_and_out(cx)?;
    let xd = x.shape().dims();
    let axis = cx.axis(cx.attrs::<LayerNormAttrs>()?.axis, xd.len())?;
    let e = eps(cx)?;
    let outer: usize = xd[..axis].iter().product();
    let inner: usize = xd[axis..].iter().product();
    let s = cx.input(1)?;
    check_unidirectional(cx, s.shape().dims(), xd)?;
    let scale = expand(read_f64(cx, s)?, s.shape().dims(), xd);
    let bias = match cx.opt_input(2) {
        Some(b) => {
            check_unidirectional(cx, b.shape().dims(), xd)?;
            Some(expand(read_f64(cx, b)?, b.shape().dims(), xd))
        }
        None => None,
    };
    let v = x.to_f64_vec();
    let mut y = vec![0.0; v.len()];
    let mut means = vec![0.0; outer];
    let mut invs = vec![0.0; outer];
    for o in 0..outer {
        let base = o * inner;
        let lane = &v[base..base + inner];
        let (mean, var) = stats(lane.iter().copied());
        let inv = 1.0 / (var + e).sqrt();
        means[o] = mean;
        invs[o] = inv;
        for j in base..base + inner {
            y[j] = (v[j] - mean) * inv * scale[j] + bias.as_ref().map_or(0.0, |b| b[j]);
        }
    }
    let mut out = vec![write_f64(cx, ty, &y)?];
    let stat_dims: Vec<usize> = (0..xd.len()).map(|i| if i < axis { xd[i] } else { 1 }).collect();
    for (i, vals) in [(1, &means), (2, &invs)] {
        if cx.out_types.len() > i {
            let sty = cx.out_type(i)?;
            if sty.shape.dims() != stat_dims || !sty.dtype.is_float() {
                return Err(cx.invalid(format!("result {i} has type {sty}, expected a float of {stat_dims:?}")));
            }
            out.push(write_f64(cx, sty, vals)?);
        }
    }
    Ok(out)
}

fn group_norm(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, ty) = x_and_out(cx)?;
    let (n, c, inner) = nc_inner(cx, x)?;
    let g = cx.attrs::<GroupNormAttrs>()?.num_groups;
    let g = usize::try_from(g)
        .ok()
        .filter(|&g| g > 0 && g <= c.max(1) && c % g == 0)
        .ok_or_else(|| cx.invalid(format!("num_groups = {g} does not divide {c} channels")))?;
    let scale = per_channel(cx, 1, c, "scale")?;
    let bias = per_channel(cx, 2, c, "bias")?;
    let e = eps(cx)?;
    let v = x.to_f64_vec();
    let mut out = vec![0.0; v.len()];
    let per = c / g * inner;
    for b in 0..n {
        for grp in 0..g {
            let base = (b * g + grp) * per;
            let lane = &v[base..base + per];
            let (mean, var) = stats(lane.iter().copied());
            let inv = 1.0 / (var + e).sqrt();
            for j in base..base + per {
                let ch = (j / inner.max(1)) % c;
                out[j] = (v[j] - mean) * inv * scale[ch] + bias[ch];
            }
        }
    }
    write_f64(cx, ty, &out)
}

fn lp_norm(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, ty) = x_and_out(cx)?;
    let xd = x.shape().dims();
    let la = cx.attrs::<LpNormAttrs>()?;
    let axis = cx.axis(la.axis, xd.len())?;
    let p = la.p;
    if p != 1 && p != 2 {
        return Err(cx.invalid(format!("p = {p}, 1 or 2 expected")));
    }
    let out = map_lanes(&x.to_f64_vec(), xd, axis, |lane, out| {
        let norm = if p == 1 {
            lane.iter().map(|v| v.abs()).sum::<f64>()
        } else {
            lane.iter().map(|v| v * v).sum::<f64>().sqrt()
        };
        for (o, &v) in out.iter_mut().zip(lane) {
            *o = if norm == 0.0 { 0.0 } else { v / norm };
        }
    });
    write_f64(cx, ty, &out)
}

fn lrn(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, ty) = x_and_out(cx)?;
    let (outer, c, inner) = nc_inner(cx, x)?;
    let la = cx.attrs::<LrnAttrs>()?;
    let (alpha, beta, bias) = (la.alpha as f64, la.beta as f64, la.bias as f64);
    let size = la.size;
    if size < 1 {
        return Err(cx.invalid(format!("size = {size}")));
    }
    let below = ((size - 1) / 2) as usize;
    let above = (size as usize - 1).div_ceil(2);
    let v = x.to_f64_vec();
    let mut out = vec![0.0; v.len()];
    for o in 0..outer {
        for ch in 0..c {
            let lo = ch.saturating_sub(below);
            let hi = (ch + above).min(c - 1);
            for i in 0..inner {
                let idx = |k: usize| (o * c + k) * inner + i;
                let sq: f64 = (lo..=hi).map(|k| v[idx(k)] * v[idx(k)]).sum();
                out[idx(ch)] = v[idx(ch)] / (bias + alpha / size as f64 * sq).powf(beta);
            }
        }
    }
    write_f64(cx, ty, &out)
}

fn mvn(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, ty) = x_and_out(cx)?;
    let xd = x.shape().dims();
    let rank = xd.len();
    let axes = &cx.attrs::<MvnAttrs>()?.axes;
    let mut red = vec![false; rank];
    for a in axes {
        red[cx.axis(*a, rank)?] = true;
    }
    let kd: Vec<usize> = xd.iter().zip(&red).map(|(&n, &r)| if r { 1 } else { n }).collect();
    let m: usize = kd.iter().product();
    let count = xd.iter().zip(&red).filter(|(_, &r)| r).map(|(&n, _)| n).product::<usize>() as f64;
    let map = crate::util::broadcast_map(&kd, xd);
    let v = x.to_f64_vec();
    let mut mean = vec![0.0; m];
    map.iter().zip(&v).for_each(|(&o, &p)| mean[o] += p);
    mean.iter_mut().for_each(|s| *s /= count);
    let mut var = vec![0.0; m];
    map.iter().zip(&v).for_each(|(&o, &p)| var[o] += (p - mean[o]) * (p - mean[o]));
    var.iter_mut().for_each(|s| *s /= count);
    let e = 1e-9f32 as f64;
    let out: Vec<f64> = map.iter().zip(&v).map(|(&o, &p)| (p - mean[o]) / (var[o].sqrt() + e)).collect();
    write_f64(cx, ty, &out)
}
