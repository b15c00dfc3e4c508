//! Convolutions: Conv, ConvInteger, QLinearConv and ConvTranspose, over any
//! number of spatial dimensions (`[N, C, D1, .., Dn]`, n ≥ 1).
//!
//! Conv is im2col per image and group followed by [`gemm_acc`]: the columns of a
//! tile of whole output rows (`Kd = C/group · Πkernel` rows, one per channel and
//! kernel tap) are gathered, then `W_g [M/group × Kd] · col` accumulates into the
//! contiguous output rows. A 1×..×1 kernel with unit strides and no padding reads
//! the input directly. ConvTranspose is the mirror: `col = W_gᵀ · x_g`, then each
//! column row is scattered (col2im) into the output.
//!
//! ConvInteger and QLinearConv subtract the zero points first (so padding counts as
//! the zero point, i.e. contributes nothing) and multiply the differences in `f64`,
//! exact for kernels below 2^37 taps. QLinearConv then rounds (in f32, as ONNX Runtime
//! computes `f32(acc) · (x_scale·w_scale / y_scale)`)
//! `acc · (x_scale · w_scale[m] / y_scale)` half to even, adds `y_zero_point` and
//! saturates.
//!
//! ConvTranspose: `output_shape` (spatial dims, or the full shape) takes precedence
//! over `pads`; the padding it implies is split as ONNX says (SAME_UPPER puts the
//! smaller half first, any other mode the larger half).

use crate::elementwise::write_f64;
use crate::linalg::{floats, gemm_acc, requantize, transpose, zero_point};
use crate::util::{row_major_strides, Cx};
use crate::EvalError;
use kiln_ir::attrs::{ConvAttrs, ConvTransposeAttrs};
use kiln_ir::{DType, OpKind, Tensor, TensorType};

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    use OpKind::*;
    match cx.kind() {
        Conv => Ok(vec![conv(cx)?]),
        ConvInteger => Ok(vec![conv_integer(cx)?]),
        QLinearConv => Ok(vec![qlinear_conv(cx)?]),
        ConvTranspose => Ok(vec![conv_transpose(cx)?]),
        _ => Err(cx.unsupported("not a convolution")),
    }
}

// ---------------------------------------------------------------------------
// Attributes shared with pool.rs.
// ---------------------------------------------------------------------------

pub(crate) use kiln_ir::attrs::AutoPad;

/// The `auto_pad` attribute.
pub(crate) fn auto_pad(cx: &Cx) -> Result<AutoPad, EvalError> {
    Ok(cx.window()?.auto_pad)
}

/// Bound on strides, dilations, pads and output paddings: far above any real model,
/// low enough that window arithmetic cannot overflow.
pub(crate) const MAX_ATTR: i64 = 1 << 24;

/// An ints attribute `name` (value `v`) of `len` positive values (default all `default`).
pub(crate) fn positive_ints(
    cx: &Cx,
    name: &str,
    v: Option<&[i64]>,
    len: usize,
    default: usize,
) -> Result<Vec<usize>, EvalError> {
    match v {
        None => Ok(vec![default; len]),
        Some(v) if v.is_empty() => Ok(vec![default; len]),
        Some(v) => {
            if v.len() != len || v.iter().any(|&x| !(1..=MAX_ATTR).contains(&x)) {
                return Err(cx.invalid(format!("{name} = {v:?}: {len} values in 1..=2^24 expected")));
            }
            Ok(v.iter().map(|&x| x as usize).collect())
        }
    }
}

/// The `pads` attribute as (begin, end) per spatial dim (non-negative; default 0).
pub(crate) fn explicit_pads(cx: &Cx, len: usize) -> Result<(Vec<i64>, Vec<i64>), EvalError> {
    match cx.window()?.pads {
        None => Ok((vec![0; len], vec![0; len])),
        Some(v) if v.is_empty() => Ok((vec![0; len], vec![0; len])),
        Some(v) => {
            if v.len() != 2 * len || v.iter().any(|&x| !(0..=MAX_ATTR).contains(&x)) {
                return Err(cx.invalid(format!("pads = {v:?}: {} values in 0..=2^24 expected", 2 * len)));
            }
            Ok((v[..len].to_vec(), v[len..].to_vec()))
        }
    }
}

/// The `kernel_shape` attribute, checked against `from_weights` when given.
fn kernel_shape(cx: &Cx, from_weights: &[usize]) -> Result<Vec<usize>, EvalError> {
    let given = cx.window()?.kernel_shape;
    let k = positive_ints(cx, "kernel_shape", given, from_weights.len(), 1)?;
    if given.is_some() && k != from_weights {
        return Err(cx.invalid(format!("kernel_shape {k:?} differs from the weights' {from_weights:?}")));
    }
    if from_weights.iter().any(|&d| d == 0 || d as i64 > MAX_ATTR) {
        return Err(cx.invalid(format!("kernel of shape {from_weights:?}")));
    }
    Ok(from_weights.to_vec())
}

/// The sliding-window geometry of one convolution along its spatial dims.
#[derive(Clone, Debug)]
pub(crate) struct Window {
    /// Input extents.
    pub input: Vec<usize>,
    /// Output extents.
    pub output: Vec<usize>,
    pub kernel: Vec<usize>,
    pub strides: Vec<usize>,
    pub dilations: Vec<usize>,
    /// Padding before each dim (negative values crop; only ConvTranspose has them).
    pub pad_begin: Vec<i64>,
}

/// Output extent and leading pad of one dim for Conv-style operators (no ceil mode).
/// `dk` is the dilated kernel extent.
pub(crate) fn same_pads(ap: AutoPad, input: usize, stride: usize, dk: usize) -> (usize, i64) {
    let out = input.div_ceil(stride);
    let total = ((out.saturating_sub(1)) * stride + dk).saturating_sub(input) as i64;
    let begin = if ap == AutoPad::SameUpper { total / 2 } else { total - total / 2 };
    (out, begin)
}

/// The geometry of Conv, ConvInteger and QLinearConv.
fn conv_window(cx: &Cx, input: &[usize], wk: &[usize]) -> Result<Window, EvalError> {
    let r = input.len();
    let kernel = kernel_shape(cx, wk)?;
    let win = cx.window()?;
    let strides = positive_ints(cx, "strides", win.strides, r, 1)?;
    let dilations = positive_ints(cx, "dilations", win.dilations, r, 1)?;
    let ap = auto_pad(cx)?;
    let (pb, pe) = explicit_pads(cx, r)?;
    let mut output = Vec::with_capacity(r);
    let mut pad_begin = Vec::with_capacity(r);
    for d in 0..r {
        let dk = (kernel[d] - 1) * dilations[d] + 1;
        let (o, b) = match ap {
            AutoPad::NotSet | AutoPad::Valid => {
                let (b, e) = if ap == AutoPad::Valid { (0, 0) } else { (pb[d], pe[d]) };
                let span = input[d] as i64 + b + e;
                if span < dk as i64 {
                    return Err(cx.invalid(format!(
                        "spatial dim {d}: padded input {span} is smaller than the dilated kernel {dk}"
                    )));
                }
                (((span - dk as i64) / strides[d] as i64 + 1) as usize, b)
            }
            AutoPad::SameUpper | AutoPad::SameLower => same_pads(ap, input[d], strides[d], dk),
        };
        output.push(o);
        pad_begin.push(b);
    }
    Ok(Window { input: input.to_vec(), output, kernel, strides, dilations, pad_begin })
}

// ---------------------------------------------------------------------------
// Conv core.
// ---------------------------------------------------------------------------

/// Operand shapes of a convolution: `x [N, C, in..]`, `w [M, C/group, k..]`.
struct ConvDims {
    n: usize,
    c: usize,
    m: usize,
    group: usize,
}

fn conv_dims(cx: &Cx, xd: &[usize], wd: &[usize]) -> Result<ConvDims, EvalError> {
    if xd.len() < 3 || wd.len() != xd.len() {
        return Err(cx.invalid(format!("X {xd:?} and W {wd:?}: ranks of 3 or more, equal, expected")));
    }
    let group = cx.attrs::<ConvAttrs>()?.group;
    if group < 1 {
        return Err(cx.invalid(format!("group = {group}")));
    }
    let group = group as usize;
    let (n, c, m) = (xd[0], xd[1], wd[0]);
    if wd[1].checked_mul(group) != Some(c) || m % group != 0 {
        return Err(cx.invalid(format!("X {xd:?}, W {wd:?} and group {group} do not fit")));
    }
    Ok(ConvDims { n, c, m, group })
}

/// Output rows (of the innermost spatial dim) per im2col tile: about 2^19 column
/// elements (4 MiB), at least one row.
fn rows_per_tile(kd: usize, row_len: usize) -> usize {
    ((1usize << 19) / kd.saturating_mul(row_len).max(1)).max(1)
}

/// Runs `f(r0, rows, col)` for the tiles of at most `tile_rows` rows that cover rows
/// `0..n_rows`, `col` holding `kd` zeroed column rows of `rows·row_len` values each.
fn for_each_tile(
    n_rows: usize,
    tile_rows: usize,
    kd: usize,
    row_len: usize,
    col: &mut Vec<f64>,
    mut f: impl FnMut(usize, usize, &mut [f64]),
) {
    let mut r0 = 0;
    while r0 < n_rows {
        let rows = tile_rows.min(n_rows - r0);
        col.clear();
        col.resize(kd * rows * row_len, 0.0);
        f(r0, rows, col);
        r0 += rows;
    }
}

/// Odometer over the outer (all but the last) spatial dims of `dims`.
fn advance(idx: &mut [usize], dims: &[usize]) {
    for d in (0..idx.len()).rev() {
        idx[d] += 1;
        if idx[d] < dims[d] {
            return;
        }
        idx[d] = 0;
    }
}

/// For each kernel tap (row-major over the kernel dims), its multi-index.
fn kernel_taps(kernel: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = kernel.iter().product();
    let mut taps = Vec::with_capacity(n);
    let mut idx = vec![0usize; kernel.len()];
    for _ in 0..n {
        taps.push(idx.clone());
        advance(&mut idx, kernel);
    }
    taps
}

/// The convolution of `x [N, C, in..]` (f64) with `w [M, C/group, k..]`, plus
/// `bias [M]`, over window `win`: `y [N, M, out..]`.
fn conv_f64(x: &[f64], w: &[f64], bias: Option<&[f64]>, cd: &ConvDims, win: &Window) -> Vec<f64> {
    let r = win.input.len();
    let in_sz: usize = win.input.iter().product();
    let out_sz: usize = win.output.iter().product();
    let k_sz: usize = win.kernel.iter().product();
    let (cg, mg) = (cd.c / cd.group, cd.m / cd.group);
    let kd = cg * k_sz;
    let mut y = vec![0.0; cd.n * cd.m * out_sz];
    if let Some(b) = bias {
        for (i, plane) in y.chunks_exact_mut(out_sz.max(1)).enumerate() {
            plane.fill(b[i % cd.m]);
        }
    }
    if y.is_empty() || kd == 0 {
        return y;
    }
    let direct = win.kernel.iter().all(|&k| k == 1)
        && win.strides.iter().all(|&s| s == 1)
        && win.pad_begin.iter().all(|&p| p == 0)
        && win.output == win.input;
    let row_len = win.output[r - 1];
    let n_rows = out_sz / row_len.max(1);
    let tile_rows = rows_per_tile(kd, row_len);
    let taps = kernel_taps(&win.kernel);
    let in_strides = row_major_strides(&win.input);
    let mut col = Vec::new();
    for ni in 0..cd.n {
        for g in 0..cd.group {
            let xg = &x[(ni * cd.c + g * cg) * in_sz..(ni * cd.c + (g + 1) * cg) * in_sz];
            let wg = &w[g * mg * kd..(g + 1) * mg * kd];
            let yg = &mut y[(ni * cd.m + g * mg) * out_sz..(ni * cd.m + (g + 1) * mg) * out_sz];
            if direct {
                gemm_acc(mg, out_sz, kd, wg, kd, xg, in_sz, yg, out_sz);
                continue;
            }
            for_each_tile(n_rows, tile_rows, kd, row_len, &mut col, |r0, rows, col| {
                let pt = rows * row_len;
                im2col(xg, cg, win, &taps, &in_strides, r0, rows, col);
                gemm_acc(mg, pt, kd, wg, kd, col, pt, &mut yg[r0 * row_len..], out_sz);
            });
        }
    }
    y
}

/// Fills `col` (zeroed, `cg·taps × rows·row_len`) with the input values each kernel
/// tap sees at output rows `r0..r0+rows` (rows = positions of the outer spatial dims).
#[allow(clippy::too_many_arguments)]
fn im2col(
    xg: &[f64],
    cg: usize,
    win: &Window,
    taps: &[Vec<usize>],
    in_strides: &[usize],
    r0: usize,
    rows: usize,
    col: &mut [f64],
) {
    let in_sz: usize = win.input.iter().product();
    let row_len = win.output[win.output.len() - 1];
    let pt = rows * row_len;
    let s = win.strides[win.strides.len() - 1];
    let mut cr = 0; // column row
    for c in 0..cg {
        let xc = &xg[c * in_sz..(c + 1) * in_sz];
        for tap in taps {
            let dst_row = &mut col[cr * pt..(cr + 1) * pt];
            cr += 1;
            tap_runs(win, tap, &win.output, &win.input, in_strides, r0, rows, |rr, lo, hi, at| {
                let dst = &mut dst_row[rr * row_len + lo..rr * row_len + hi];
                if s == 1 {
                    dst.copy_from_slice(&xc[at..at + (hi - lo)]);
                } else {
                    for (dv, &sv) in dst.iter_mut().zip(xc[at..].iter().step_by(s)) {
                        *dv = sv;
                    }
                }
            });
        }
    }
}

/// Walks the positions one kernel tap connects between the side a convolution
/// walks row by row (`walked`: the output for im2col, the input for col2im) and its
/// partner side: position `p` of a walked dim meets `p·s − pb + k·dl` of the
/// partner's. For each of the `rows` walked rows from `r0` (positions of the outer
/// dims) whose outer partner position lies inside `partner`, calls
/// `run(rr, lo, hi, at)`: walked columns `lo..hi` of row `rr` meet partner positions
/// inside it, the first at flat offset `at` (with `partner_strides`), the next ones
/// `s` apart.
#[allow(clippy::too_many_arguments)]
fn tap_runs(
    win: &Window,
    tap: &[usize],
    walked: &[usize],
    partner: &[usize],
    partner_strides: &[usize],
    r0: usize,
    rows: usize,
    mut run: impl FnMut(usize, usize, usize, usize),
) {
    let last = walked.len() - 1;
    let row_len = walked[last];
    let (s, dl, pb, pw) =
        (win.strides[last] as i64, win.dilations[last] as i64, win.pad_begin[last], partner[last] as i64);
    // Walked columns whose partner position c·s − pb + k·dl lies in [0, pw).
    let base = tap[last] as i64 * dl - pb;
    let lo = if base >= 0 { 0 } else { (-base + s - 1) / s };
    let hi = if pw - base <= 0 { 0 } else { ((pw - base + s - 1) / s).min(row_len as i64) };
    let (lo, hi) = (lo.min(hi) as usize, hi.max(0) as usize);
    if hi <= lo {
        return;
    }
    let start = (lo as i64 * s + base) as usize;
    let outer_dims = &walked[..last];
    let mut idx = crate::util::unravel(r0, outer_dims);
    for rr in 0..rows {
        // Offset of the partner row for this walked row and tap (None: padding).
        let mut off = Some(0usize);
        for d in 0..last {
            let p = idx[d] as i64 * win.strides[d] as i64 - win.pad_begin[d] + tap[d] as i64 * win.dilations[d] as i64;
            if p < 0 || p >= partner[d] as i64 {
                off = None;
                break;
            }
            off = off.map(|o| o + p as usize * partner_strides[d]);
        }
        if let Some(off) = off {
            run(rr, lo, hi, off + start);
        }
        advance(&mut idx, outer_dims);
    }
}

/// Checks the result type against `dims`.
fn check_out(cx: &Cx, ty: &TensorType, dims: &[usize]) -> Result<(), EvalError> {
    if ty.shape.dims() != dims {
        return Err(cx.invalid(format!("result shape {dims:?} expected, result type says {ty}")));
    }
    Ok(())
}

/// Result dims `[N, M, out..]`.
fn out_dims(cd: &ConvDims, win: &Window) -> Vec<usize> {
    let mut v = vec![cd.n, cd.m];
    v.extend(&win.output);
    v
}

/// An optional per-output-channel operand of `m` values.
fn bias(cx: &Cx, i: usize, m: usize) -> Result<Option<Vec<f64>>, EvalError> {
    match cx.opt_input(i) {
        None => Ok(None),
        Some(b) => {
            if b.numel() != m || b.shape().rank() != 1 {
                return Err(cx.invalid(format!("bias has shape {:?}, [{m}] expected", b.shape().dims())));
            }
            Ok(Some(floats(cx, b)?))
        }
    }
}

/// The channel dims and the window of a Conv-style operator with input `x` and
/// weights `w`, checked against the result type `ty`.
fn conv_geometry(cx: &Cx, x: &Tensor, w: &Tensor, ty: &TensorType) -> Result<(ConvDims, Window), EvalError> {
    let (xd, wd) = (x.shape().dims(), w.shape().dims());
    let cd = conv_dims(cx, xd, wd)?;
    let win = conv_window(cx, &xd[2..], &wd[2..])?;
    check_out(cx, ty, &out_dims(&cd, &win))?;
    Ok((cd, win))
}

fn conv(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let ty = cx.out_type(0)?;
    let (cd, win) = conv_geometry(cx, x, w, ty)?;
    let b = bias(cx, 2, cd.m)?;
    let y = conv_f64(&floats(cx, x)?, &floats(cx, w)?, b.as_deref(), &cd, &win);
    write_f64(cx, ty, &y)
}

/// An 8-bit integer operand minus its zero point (operand `zi`): one value, or
/// (`per_channel` of the weights) one per output channel.
fn minus_zp(cx: &Cx, t: &Tensor, zi: usize, per_channel: bool) -> Result<Vec<f64>, EvalError> {
    if !matches!(t.dtype(), DType::U8 | DType::I8) {
        return Err(cx.invalid(format!("{} operand, u8 or i8 expected", t.dtype())));
    }
    let mut v = floats(cx, t)?;
    let Some(z) = zero_point(cx, t, zi)? else { return Ok(v) };
    let zv = floats(cx, z)?;
    let m = t.shape().dims().first().copied().unwrap_or(1);
    if zv.len() == 1 {
        v.iter_mut().for_each(|x| *x -= zv[0]);
    } else if per_channel && zv.len() == m {
        let per = t.numel() / m.max(1);
        for (i, x) in v.iter_mut().enumerate() {
            *x -= zv[i / per.max(1)];
        }
    } else {
        return Err(cx.invalid(format!("zero point has {} elements", zv.len())));
    }
    Ok(v)
}

fn conv_integer(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let ty = cx.out_type(0)?;
    if !ty.dtype.is_int() {
        return Err(cx.invalid(format!("{} result, i32 expected", ty.dtype)));
    }
    let (cd, win) = conv_geometry(cx, x, w, ty)?;
    let xv = minus_zp(cx, x, 2, false)?;
    let wv = minus_zp(cx, w, 3, true)?;
    let y = conv_f64(&xv, &wv, None, &cd, &win);
    let iv: Vec<i64> = y.iter().map(|&v| v as i64).collect();
    cx.from_i64(ty, &iv)
}

/// A scale operand: one value or `m` values.
fn scales(cx: &Cx, i: usize, m: usize) -> Result<Vec<f64>, EvalError> {
    let v = floats(cx, cx.input(i)?)?;
    if v.len() == 1 || v.len() == m {
        Ok(v)
    } else {
        Err(cx.invalid(format!("input {i} has {} elements, 1 or {m} expected", v.len())))
    }
}

fn qlinear_conv(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, w) = (cx.input(0)?, cx.input(3)?);
    let ty = cx.out_type(0)?;
    let (cd, win) = conv_geometry(cx, x, w, ty)?;
    let xs = scales(cx, 1, 1)?[0];
    let ws = scales(cx, 4, cd.m)?;
    let ys = scales(cx, 6, 1)?[0];
    let yz = match cx.opt_input(7) {
        Some(z) => floats(cx, z)?.first().copied().unwrap_or(0.0),
        None => 0.0,
    };
    let xv = minus_zp(cx, x, 2, false)?;
    let wv = minus_zp(cx, w, 5, true)?;
    let b = bias(cx, 8, cd.m)?;
    let mut y = conv_f64(&xv, &wv, b.as_deref(), &cd, &win);
    let plane: usize = win.output.iter().product();
    // ONNX Runtime's requantisation: the scale `x_scale·w_scale / y_scale` and the
    // product with the (exact) accumulator in f32, rounded half to even.
    for (i, v) in y.iter_mut().enumerate() {
        let m = (i / plane.max(1)) % cd.m;
        let mult = (xs as f32 * ws[if ws.len() == 1 { 0 } else { m }] as f32) / ys as f32;
        *v = ((*v as f32 * mult).round_ties_even() + yz as f32) as f64;
    }
    requantize(cx, ty, &mut y)
}

// ---------------------------------------------------------------------------
// ConvTranspose.
// ---------------------------------------------------------------------------

fn conv_transpose(cx: &Cx) -> Result<Tensor, EvalError> {
    let (x, w) = (cx.input(0)?, cx.input(1)?);
    let ty = cx.out_type(0)?;
    let (xd, wd) = (x.shape().dims(), w.shape().dims());
    if xd.len() < 3 || wd.len() != xd.len() {
        return Err(cx.invalid(format!("X {xd:?} and W {wd:?}: ranks of 3 or more, equal, expected")));
    }
    let ct = cx.attrs::<ConvTransposeAttrs>()?;
    let group = ct.group;
    if group < 1 {
        return Err(cx.invalid(format!("group = {group}")));
    }
    let group = group as usize;
    let (n, c) = (xd[0], xd[1]);
    if c != wd[0] || c % group != 0 || wd[1].checked_mul(group).is_none() {
        return Err(cx.invalid(format!("X {xd:?}, W {wd:?} and group {group} do not fit")));
    }
    let mg = wd[1];
    let m = mg * group;
    let r = xd.len() - 2;
    let input = &xd[2..];
    let kernel = kernel_shape(cx, &wd[2..])?;
    let strides = positive_ints(cx, "strides", ct.strides.as_deref(), r, 1)?;
    let dilations = positive_ints(cx, "dilations", ct.dilations.as_deref(), r, 1)?;
    let out_pad: Vec<i64> = match &ct.output_padding {
        None => vec![0; r],
        Some(v) if v.is_empty() => vec![0; r],
        Some(v) if v.len() == r && v.iter().all(|&p| (0..=MAX_ATTR).contains(&p)) => v.clone(),
        Some(v) => return Err(cx.invalid(format!("output_padding = {v:?}"))),
    };
    let ap = auto_pad(cx)?;
    let (pb, pe) = explicit_pads(cx, r)?;
    let out_shape: Option<Vec<i64>> = match &ct.output_shape {
        Some(v) if v.len() >= r && v.iter().all(|&o| (0..=1 << 40).contains(&o)) => Some(v[v.len() - r..].to_vec()),
        Some(v) if v.is_empty() => None,
        Some(v) => return Err(cx.invalid(format!("output_shape = {v:?}"))),
        None => None,
    };
    let mut output = Vec::with_capacity(r);
    let mut pad_begin = Vec::with_capacity(r);
    for d in 0..r {
        let dk = ((kernel[d] - 1) * dilations[d] + 1) as i64;
        let full = strides[d] as i64 * (input[d] as i64 - 1) + out_pad[d] + dk;
        let target = match (&out_shape, ap) {
            (Some(os), _) => Some(os[d]),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some(input[d] as i64 * strides[d] as i64),
            _ => None,
        };
        let (o, b) = match target {
            Some(t) => {
                // Floor halves: a negative total (a larger output) pads the end first.
                let total = full - t;
                let half = total.div_euclid(2);
                let b = if ap == AutoPad::SameUpper { half } else { total - half };
                (t, b)
            }
            None if ap == AutoPad::Valid => (full, 0),
            None => (full - pb[d] - pe[d], pb[d]),
        };
        if o < 0 {
            return Err(cx.invalid(format!("spatial dim {d}: output extent {o}")));
        }
        output.push(o as usize);
        pad_begin.push(b);
    }
    let win = Window { input: input.to_vec(), output, kernel, strides, dilations, pad_begin };
    let mut od = vec![n, m];
    od.extend(&win.output);
    check_out(cx, ty, &od)?;
    let b = bias(cx, 2, m)?;
    let y = conv_transpose_f64(&floats(cx, x)?, &floats(cx, w)?, b.as_deref(), n, c, group, mg, &win);
    write_f64(cx, ty, &y)
}

/// The transposed convolution of `x [N, C, in..]` with `w [C, M/group, k..]`.
#[allow(clippy::too_many_arguments)]
fn conv_transpose_f64(
    x: &[f64],
    w: &[f64],
    bias: Option<&[f64]>,
    n: usize,
    c: usize,
    group: usize,
    mg: usize,
    win: &Window,
) -> Vec<f64> {
    let r = win.input.len();
    let m = mg * group;
    let cg = c / group;
    let in_sz: usize = win.input.iter().product();
    let out_sz: usize = win.output.iter().product();
    let k_sz: usize = win.kernel.iter().product();
    let kd = mg * k_sz;
    let mut y = vec![0.0; n * m * out_sz];
    if let Some(b) = bias {
        for (i, plane) in y.chunks_exact_mut(out_sz.max(1)).enumerate() {
            plane.fill(b[i % m]);
        }
    }
    if y.is_empty() || in_sz == 0 || kd == 0 {
        return y;
    }
    let row_len = win.input[r - 1];
    let n_rows = in_sz / row_len;
    let tile_rows = rows_per_tile(kd, row_len);
    let taps = kernel_taps(&win.kernel);
    let out_strides = row_major_strides(&win.output);
    let mut col = Vec::new();
    for g in 0..group {
        // W_gᵀ: [(M/group)·Πk × C/group].
        let wt = transpose(&w[g * cg * kd..(g + 1) * cg * kd], cg, kd);
        for ni in 0..n {
            let xg = &x[(ni * c + g * cg) * in_sz..(ni * c + (g + 1) * cg) * in_sz];
            let yg = &mut y[(ni * m + g * mg) * out_sz..(ni * m + (g + 1) * mg) * out_sz];
            for_each_tile(n_rows, tile_rows, kd, row_len, &mut col, |r0, rows, col| {
                let pt = rows * row_len;
                gemm_acc(kd, pt, cg, &wt, cg, &xg[r0 * row_len..], in_sz, col, pt);
                col2im(col, yg, mg, win, &taps, &out_strides, r0, rows);
            });
        }
    }
    y
}

/// Adds each column row of `col` (`mg·taps × rows·row_len`, input rows
/// `r0..r0+rows`) into the output positions its kernel tap reaches.
#[allow(clippy::too_many_arguments)]
fn col2im(
    col: &[f64],
    yg: &mut [f64],
    mg: usize,
    win: &Window,
    taps: &[Vec<usize>],
    out_strides: &[usize],
    r0: usize,
    rows: usize,
) {
    let out_sz: usize = win.output.iter().product();
    let row_len = win.input[win.input.len() - 1];
    let pt = rows * row_len;
    let s = win.strides[win.strides.len() - 1];
    let mut cr = 0;
    for mi in 0..mg {
        let yc = &mut yg[mi * out_sz..(mi + 1) * out_sz];
        for tap in taps {
            let src_row = &col[cr * pt..(cr + 1) * pt];
            cr += 1;
            tap_runs(win, tap, &win.input, &win.output, out_strides, r0, rows, |rr, lo, hi, at| {
                let src = &src_row[rr * row_len + lo..rr * row_len + hi];
                if s == 1 {
                    for (dv, &sv) in yc[at..at + (hi - lo)].iter_mut().zip(src) {
                        *dv += sv;
                    }
                } else {
                    for (dv, &sv) in yc[at..].iter_mut().step_by(s).zip(src) {
                        *dv += sv;
                    }
                }
            });
        }
    }
}
