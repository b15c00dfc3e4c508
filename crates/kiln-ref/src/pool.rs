//! Pooling: AveragePool, MaxPool (with the optional Indices result), LpPool and
//! their Global forms, over any number of spatial dimensions.
//!
//! Output extents: explicit pads give `floor((in + pads − dk) / s) + 1` (`ceil`
//! with `ceil_mode`, dropping a last window that would start in the end padding,
//! i.e. at or beyond `in + pad_begin`); VALID is the same with no padding;
//! SAME_UPPER/SAME_LOWER give `ceil(in / s)` with the padding split as in Conv.
//! `dk = (k − 1)·dilation + 1`.
//!
//! Each window is the set of its taps that fall inside the input. AveragePool
//! divides by that count, or with `count_include_pad` by the full kernel size: as
//! in ONNX's reference and test data, taps that ceil mode pushes past the end
//! padding count as padding too (PyTorch and ONNX Runtime leave those out).
//! MaxPool ignores NaNs (an all-NaN or empty window gives −inf, Indices −1) and
//! picks the first maximum in row-major window order; Indices are flat input
//! indices including the batch and channel offset, `((n·C + c)·Π in) + i`, where
//! `i` is row-major, or column-major with `storage_order = 1`.

use crate::conv::{auto_pad, explicit_pads, positive_ints, same_pads, AutoPad};
use crate::elementwise::write_f64;
use crate::linalg::floats;
use crate::util::{row_major_strides, Cx};
use crate::EvalError;
use kiln_ir::attrs::PoolAttrs;
use kiln_ir::{OpKind, Tensor, TensorType};

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    use OpKind::*;
    match cx.kind() {
        AveragePool => Ok(vec![pool(cx, Kind::Avg)?]),
        LpPool => {
            let p = cx.attrs::<PoolAttrs>()?.p;
            Ok(vec![pool(cx, Kind::Lp(p as f64))?])
        }
        MaxPool => max_pool(cx),
        GlobalAveragePool => Ok(vec![global(cx, Kind::Avg)?]),
        GlobalMaxPool => Ok(vec![global(cx, Kind::Max)?]),
        GlobalLpPool => {
            let p = cx.attrs::<PoolAttrs>()?.p;
            Ok(vec![global(cx, Kind::Lp(p as f64))?])
        }
        _ => Err(cx.unsupported("not a pooling operator")),
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Avg,
    Max,
    Lp(f64),
}

/// Per spatial dim and output index: the input offsets (index · row-major stride)
/// of the taps inside the input.
struct Taps {
    output: Vec<usize>,
    offsets: Vec<Vec<Vec<usize>>>,
    /// Taps per window, padding included.
    kernel_size: f64,
}

/// The windows of a pool over `x` of dims `xd`; checks that the result type `ty`
/// has the pooled dims before building anything of their size.
fn pool_taps(cx: &Cx, xd: &[usize], ty: &TensorType) -> Result<Taps, EvalError> {
    let input = &xd[2..];
    let r = input.len();
    let a = cx.attrs::<PoolAttrs>()?;
    let kernel: Vec<usize> = match &a.kernel_shape {
        Some(k) if k.len() == r && k.iter().all(|&v| (1..=1 << 24).contains(&v)) => {
            k.iter().map(|&v| v as usize).collect()
        }
        Some(k) => return Err(cx.invalid(format!("kernel_shape {k:?} for {r} spatial dims"))),
        None => return Err(cx.invalid("kernel_shape is missing")),
    };
    let strides = positive_ints(cx, "strides", a.strides.as_deref(), r, 1)?;
    let dilations = positive_ints(cx, "dilations", a.dilations.as_deref(), r, 1)?;
    let ceil_mode = a.ceil_mode;
    let ap = auto_pad(cx)?;
    let (pb, pe) = explicit_pads(cx, r)?;
    let in_strides = row_major_strides(input);
    let mut geometry = Vec::with_capacity(r);
    for d in 0..r {
        let (i, s, dl) = (input[d] as i64, strides[d] as i64, dilations[d] as i64);
        let dk = (kernel[d] as i64 - 1) * dl + 1;
        let (out, b) = match ap {
            AutoPad::SameUpper | AutoPad::SameLower => {
                let (o, b) = same_pads(ap, input[d], strides[d], dk as usize);
                (o as i64, b)
            }
            AutoPad::NotSet | AutoPad::Valid => {
                let (b, e) = if ap == AutoPad::Valid { (0, 0) } else { (pb[d], pe[d]) };
                let span = i + b + e - dk;
                if span < 0 {
                    return Err(cx.invalid(format!(
                        "spatial dim {d}: padded input {} is smaller than the dilated kernel {dk}",
                        i + b + e
                    )));
                }
                let mut o = if ceil_mode { (span + s - 1) / s + 1 } else { span / s + 1 };
                if ceil_mode && (o - 1) * s >= i + b {
                    o -= 1;
                }
                (o, b)
            }
        };
        geometry.push((out.max(0) as usize, b));
    }
    let mut od = xd[..2].to_vec();
    od.extend(geometry.iter().map(|g| g.0));
    check_out(cx, ty, &od)?;
    let kernel_size = kernel.iter().map(|&k| k as f64).product();
    let mut taps = Taps { output: Vec::new(), offsets: Vec::new(), kernel_size };
    for (d, &(out, b)) in geometry.iter().enumerate() {
        let (i, s, dl, k) = (input[d] as i64, strides[d] as i64, dilations[d] as i64, kernel[d] as i64);
        let mut offs = Vec::with_capacity(out);
        for o in 0..out as i64 {
            // Taps start + k·dl inside [0, i).
            let start = o * s - b;
            let lo = if start >= 0 { 0 } else { (-start + dl - 1) / dl };
            let hi = if i - 1 - start < 0 { 0 } else { ((i - 1 - start) / dl + 1).min(k) };
            let v: Vec<usize> = (lo..hi.max(lo)).map(|kk| (start + kk * dl) as usize * in_strides[d]).collect();
            offs.push(v);
        }
        taps.output.push(out);
        taps.offsets.push(offs);
    }
    Ok(taps)
}

fn check_out(cx: &Cx, ty: &TensorType, dims: &[usize]) -> Result<(), EvalError> {
    if ty.shape.dims() != dims {
        return Err(cx.invalid(format!("result shape {dims:?} expected, result type says {ty}")));
    }
    Ok(())
}

/// The pooling input `[N, C, spatial..]` (at least one spatial dim).
fn pool_input<'a>(cx: &Cx<'a>) -> Result<&'a Tensor, EvalError> {
    let x = cx.input(0)?;
    if x.shape().rank() < 3 {
        return Err(cx.invalid(format!("input of shape {:?}: [N, C, D1, ...] expected", x.shape().dims())));
    }
    Ok(x)
}

/// Runs `f(plane_index, output_flat, window_offsets)` over every output element
/// of every `[n, c]` plane.
fn for_each_window(taps: &Taps, planes: usize, mut f: impl FnMut(usize, usize, &[usize])) {
    let r = taps.output.len();
    let out_sz: usize = taps.output.iter().product();
    let mut idx = vec![0usize; r];
    let (mut buf, mut tmp) = (Vec::new(), Vec::new());
    for o in 0..out_sz {
        // The window's offsets, row-major over the window.
        buf.clear();
        buf.push(0usize);
        for (offs, &i) in taps.offsets.iter().zip(&idx) {
            tmp.clear();
            for &b in &buf {
                tmp.extend(offs[i].iter().map(|&x| b + x));
            }
            std::mem::swap(&mut buf, &mut tmp);
        }
        for p in 0..planes {
            f(p, o, &buf);
        }
        for d in (0..r).rev() {
            idx[d] += 1;
            if idx[d] < taps.output[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// AveragePool and LpPool (MaxPool, with its Indices, is [`max_pool`]).
fn pool(cx: &Cx, kind: Kind) -> Result<Tensor, EvalError> {
    let x = pool_input(cx)?;
    let ty = cx.out_type(0)?;
    let xd = x.shape().dims();
    let taps = pool_taps(cx, xd, ty)?;
    let include_pad = cx.attrs::<PoolAttrs>()?.count_include_pad;
    let xv = floats(cx, x)?;
    let planes = xd[0] * xd[1];
    let in_sz: usize = xd[2..].iter().product();
    let out_sz: usize = taps.output.iter().product();
    let mut y = vec![0.0; planes * out_sz];
    let full = taps.kernel_size;
    for_each_window(&taps, planes, |p, o, offs| {
        let plane = &xv[p * in_sz..(p + 1) * in_sz];
        y[p * out_sz + o] = match kind {
            Kind::Avg => {
                let s: f64 = offs.iter().map(|&i| plane[i]).sum();
                s / if include_pad { full } else { offs.len() as f64 }
            }
            Kind::Lp(pw) => lp(offs.iter().map(|&i| plane[i]), pw),
            Kind::Max => offs.iter().fold(f64::NEG_INFINITY, |m, &i| if plane[i] > m { plane[i] } else { m }),
        };
    });
    write_f64(cx, ty, &y)
}

/// `(Σ |x|^p)^(1/p)`.
fn lp(vals: impl Iterator<Item = f64>, p: f64) -> f64 {
    if p == 1.0 {
        vals.map(f64::abs).sum()
    } else if p == 2.0 {
        vals.map(|v| v * v).sum::<f64>().sqrt()
    } else {
        vals.map(|v| v.abs().powf(p)).sum::<f64>().powf(1.0 / p)
    }
}

fn max_pool(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = pool_input(cx)?;
    let ty = cx.out_type(0)?;
    let xd = x.shape().dims();
    let taps = pool_taps(cx, xd, ty)?;
    let want_idx = cx.out_types.len() > 1;
    let col_major = cx.attrs::<PoolAttrs>()?.storage_order;
    let xv = floats(cx, x)?;
    let planes = xd[0] * xd[1];
    let sp = &xd[2..];
    let in_sz: usize = sp.iter().product();
    let out_sz: usize = taps.output.iter().product();
    let mut y = vec![0.0; planes * out_sz];
    let mut ind = vec![-1i64; if want_idx { planes * out_sz } else { 0 }];
    for_each_window(&taps, planes, |p, o, offs| {
        let plane = &xv[p * in_sz..(p + 1) * in_sz];
        let mut best = f64::NEG_INFINITY;
        let mut at = None;
        for &i in offs {
            if plane[i] > best || (at.is_none() && plane[i] == best) {
                best = plane[i];
                at = Some(i);
            }
        }
        y[p * out_sz + o] = best;
        if want_idx {
            if let Some(i) = at {
                let within = if col_major { col_major_index(i, sp) } else { i };
                ind[p * out_sz + o] = (p * in_sz + within) as i64;
            }
        }
    });
    let mut res = vec![write_f64(cx, ty, &y)?];
    if want_idx {
        let ity = cx.out_type(1)?;
        check_out(cx, ity, ty.shape.dims())?;
        res.push(cx.from_i64(ity, &ind)?);
    }
    Ok(res)
}

/// The column-major (first dim fastest) index of row-major flat index `i` in `dims`.
fn col_major_index(mut i: usize, dims: &[usize]) -> usize {
    let mut res = 0;
    let mut mul = 1;
    // Row-major digits come out last dim first; column-major weights grow from dim 0.
    let mut digits = [0usize; kiln_ir::shape::MAX_RANK];
    for d in (0..dims.len()).rev() {
        digits[d] = i % dims[d].max(1);
        i /= dims[d].max(1);
    }
    for (d, &n) in dims.iter().enumerate() {
        res += digits[d] * mul;
        mul *= n;
    }
    res
}

/// GlobalAveragePool, GlobalMaxPool, GlobalLpPool: one value per `[n, c]` plane.
fn global(cx: &Cx, kind: Kind) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = cx.out_type(0)?;
    let xd = x.shape().dims();
    if xd.len() < 2 {
        return Err(cx.invalid(format!("input of shape {xd:?}: [N, C, ...] expected")));
    }
    let mut od = xd[..2].to_vec();
    od.extend(std::iter::repeat_n(1, xd.len() - 2));
    check_out(cx, ty, &od)?;
    let xv = floats(cx, x)?;
    let in_sz: usize = xd[2..].iter().product();
    let planes = xd[0] * xd[1];
    let y: Vec<f64> = (0..planes)
        .map(|p| {
            let plane = &xv[p * in_sz..(p + 1) * in_sz];
            match kind {
                Kind::Avg => plane.iter().sum::<f64>() / in_sz as f64,
                Kind::Max => plane.iter().fold(f64::NEG_INFINITY, |m, &v| if v > m { v } else { m }),
                Kind::Lp(pw) => lp(plane.iter().copied(), pw),
            }
        })
        .collect();
    write_f64(cx, ty, &y)
}
