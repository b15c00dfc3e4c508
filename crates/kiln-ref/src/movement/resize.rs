//! Resize (opset 19 attributes), for any rank.
//!
//! Every resized axis maps output index `x` to a source coordinate `x_original`
//! by the `coordinate_transformation_mode`, with `scale` the given scale when
//! `scales` is given and `out / in` (or the common scale of a
//! `keep_aspect_ratio_policy`) when `sizes` is. The output shape is the result
//! type's. Then:
//! - `nearest` rounds `x_original` by `nearest_mode` (an integer stays), clamps it
//!   into the axis and copies element bytes (bit-exact for every dtype);
//! - `linear` and `cubic` weigh neighbours as the ONNX definition does: with
//!   `x0 = floor(x_original)` and `ratio = x_original - x0` (an integer
//!   coordinate counts as `x0 = x_original - 1`, `ratio = 1`), `linear` weighs
//!   `x0, x0+1` by `1-ratio, ratio`, `cubic` weighs `x0-1 … x0+2` by the cubic
//!   convolution kernel with `a = cubic_coeff_a`; with `antialias=1` the kernel is
//!   stretched by `1/scale` when downscaling (more taps) and normalised;
//!   neighbours outside the axis read its edge, or get weight 0 with
//!   `exclude_outside=1` (the rest renormalised). Axes are interpolated one at a
//!   time (separably), the last axis first, in `f64`, rounded once at the end;
//!   integer results round to nearest (ties to even) and saturate.
//! - `tf_crop_and_resize`: an `x_original` outside `[0, in-1]` gives
//!   `extrapolation_value`.
//! - `align_corners` and `tf_crop_and_resize` divide by `length_resized - 1` and
//!   `pytorch_half_pixel` tests `length_resized > 1`, where `length_resized` is
//!   the fractional `scale * in` when `scales` is given (as the ONNX reference
//!   and its test data do) and the output size otherwise; `pytorch_half_pixel` and
//!   `align_corners` map a length-1 output to 0, as the ONNX definition states.

use super::{elems, gather_tensor, unique_axes, Ax, FILL};
use crate::elementwise::{read_f64, write_f64};
use crate::util::{row_major_strides, Cx};
use crate::EvalError;
use kiln_ir::attrs::{
    CoordinateTransformationMode as Ctm, KeepAspectRatioPolicy, NearestMode as Nearest, ResizeAttrs, ResizeMode as Mode,
};
use kiln_ir::{Shape, Tensor, TensorType};

/// Everything that decides the coordinates of one axis.
struct AxisMap {
    ctm: Ctm,
    /// Input extent.
    n_in: usize,
    /// Output extent.
    n_out: usize,
    /// The output length the transforms use: `scale * n_in` when the scale is given
    /// (or set by a keep_aspect_ratio_policy), else `n_out`.
    len_out: f64,
    /// Scale used by the transforms.
    scale: f64,
    /// `(start, end)` of the region of interest (tf_crop_and_resize).
    roi: (f64, f64),
}

impl AxisMap {
    /// `x_original` of output index `x`, or `None` where tf_crop_and_resize extrapolates.
    fn coord(&self, x: usize) -> Option<f64> {
        let (x, i, o, s) = (x as f64, self.n_in as f64, self.len_out, self.scale);
        Some(match self.ctm {
            Ctm::HalfPixel => (x + 0.5) / s - 0.5,
            Ctm::HalfPixelSymmetric => {
                let adjustment = self.n_out as f64 / (s * i);
                let offset = i / 2.0 * (1.0 - adjustment);
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
}

/// Interpolation taps of one axis: `n` (index, weight) pairs per output index.
struct Taps {
    n: usize,
    idx: Vec<usize>,
    wt: Vec<f64>,
    /// Output indices that take the extrapolation value.
    extrapolate: Vec<bool>,
}

impl Taps {
    /// True when the axis maps every output index to the same input index with weight 1.
    fn is_identity(&self, n_in: usize) -> bool {
        let n_out = self.extrapolate.len();
        n_out == n_in
            && !self.extrapolate.iter().any(|&e| e)
            && (0..n_out).all(|j| {
                let taps = (j * self.n..(j + 1) * self.n).map(|t| (self.idx[t], self.wt[t]));
                let own: f64 = taps.clone().filter(|&(i, _)| i == j).map(|(_, w)| w).sum();
                own == 1.0 && taps.filter(|&(i, _)| i != j).all(|(_, w)| w == 0.0)
            })
    }
}

/// The kernel weights for `ratio` in `(0, 1]`, first at offset `1 - n/2` from `x0`.
fn coeffs(mode: Mode, ratio: f64, scale: f64, a: f64, antialias: bool, out: &mut Vec<f64>) {
    out.clear();
    match (mode, antialias) {
        (Mode::Linear, false) => out.extend([1.0 - ratio, ratio]),
        (Mode::Cubic, false) => {
            let (r1, q, q1) = (ratio + 1.0, 1.0 - ratio, 2.0 - ratio);
            out.extend([
                ((a * r1 - 5.0 * a) * r1 + 8.0 * a) * r1 - 4.0 * a,
                ((a + 2.0) * ratio - (a + 3.0)) * ratio * ratio + 1.0,
                ((a + 2.0) * q - (a + 3.0)) * q * q + 1.0,
                ((a * q1 - 5.0 * a) * q1 + 8.0 * a) * q1 - 4.0 * a,
            ]);
        }
        (Mode::Linear, true) => {
            let s = scale.min(1.0);
            let start = (-1.0 / s).floor() as i64 + 1;
            let footprint = 2 - 2 * start;
            out.extend((start..start + footprint).map(|i| (1.0 - ((i as f64 - ratio) * s).abs()).clamp(0.0, 1.0)));
            let sum: f64 = out.iter().sum();
            out.iter_mut().for_each(|c| *c /= sum);
        }
        (Mode::Cubic, true) => {
            let s = scale.min(1.0);
            let start = (-2.0 / s).floor() as i64 + 1;
            let end = 2 - start;
            out.extend((start..end).map(|i| {
                let x = (s * (i as f64 - ratio)).abs();
                let (x2, x3) = (x * x, x * x * x);
                if x <= 1.0 {
                    (a + 2.0) * x3 - (a + 3.0) * x2 + 1.0
                } else if x < 2.0 {
                    a * x3 - 5.0 * a * x2 + 8.0 * a * x - 4.0 * a
                } else {
                    0.0
                }
            }));
            let sum: f64 = out.iter().sum();
            out.iter_mut().for_each(|c| *c /= sum);
        }
        (Mode::Nearest, _) => {}
    }
}

struct Params {
    mode: Mode,
    cubic_a: f64,
    exclude_outside: bool,
    antialias: bool,
}

fn taps(cx: &Cx, m: &AxisMap, p: &Params) -> Result<Taps, EvalError> {
    let mut t = Taps { n: 0, idx: Vec::new(), wt: Vec::new(), extrapolate: Vec::with_capacity(m.n_out) };
    let mut c = Vec::new();
    let last = m.n_in as i64 - 1;
    for j in 0..m.n_out {
        let Some(x) = m.coord(j) else {
            t.extrapolate.push(true);
            // Keep the layout: n taps per index, unused.
            coeffs(p.mode, 1.0, m.scale, p.cubic_a, p.antialias, &mut c);
            t.n = c.len();
            t.idx.extend(std::iter::repeat_n(0, c.len()));
            t.wt.extend(std::iter::repeat_n(0.0, c.len()));
            continue;
        };
        if !x.is_finite() || x.abs() > 1e15 {
            return Err(cx.invalid(format!("source coordinate {x} of output index {j}")));
        }
        t.extrapolate.push(false);
        let fl = x.floor();
        let (x0, ratio) = if x == fl { (fl as i64 - 1, 1.0) } else { (fl as i64, x - fl) };
        coeffs(p.mode, ratio, m.scale, p.cubic_a, p.antialias, &mut c);
        t.n = c.len();
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
        for (k, &w) in c.iter().enumerate() {
            t.idx.push((first + k as i64).clamp(0, last) as usize);
            t.wt.push(w);
        }
    }
    Ok(t)
}

/// Interpolates `cur` (dims `dims`) along axis `a` by `t`, in place of `cur`/`dims`.
fn pass(cur: &mut Vec<f64>, dims: &mut [usize], a: usize, t: &Taps, ev: f64) {
    let outer: usize = dims[..a].iter().product();
    let inner: usize = dims[a + 1..].iter().product();
    let (n_in, n_out) = (dims[a], t.extrapolate.len());
    let mut out = vec![0.0f64; outer * n_out * inner];
    for o in 0..outer {
        for j in 0..n_out {
            let dst = &mut out[(o * n_out + j) * inner..(o * n_out + j + 1) * inner];
            if t.extrapolate[j] {
                dst.fill(ev);
                continue;
            }
            for k in j * t.n..(j + 1) * t.n {
                let (w, i) = (t.wt[k], t.idx[k]);
                let src = &cur[(o * n_in + i) * inner..(o * n_in + i + 1) * inner];
                for (d, &s) in dst.iter_mut().zip(src) {
                    *d += w * s;
                }
            }
        }
    }
    dims[a] = n_out;
    *cur = out;
}

/// Resize with run-time `scales` compiled for the dims of its first result type
/// (`kiln_dims`, see `kiln_ir::dynamic`): the resized tensor and the shape check, the
/// number of resized axes whose extent `floor(n_in · scale)` (in f32) is not the
/// compiled one. A non-zero count is an error, as the runtime fails the call.
pub(super) fn resize_checked(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let od = cx.out_type(0)?.shape.dims();
    let ra = cx.attrs::<ResizeAttrs>()?;
    let axes = match &ra.axes {
        Some(a) => unique_axes(cx, a, xd.len())?,
        None => (0..xd.len()).collect(),
    };
    let scales = match cx.opt_input(2).filter(|t| t.numel() > 0) {
        Some(t) => t.to_f64_vec(),
        None => return Err(cx.invalid("the shape-checked form needs `scales`")),
    };
    if scales.len() != axes.len() || od.len() != xd.len() {
        return Err(cx.invalid(format!("{} scales for {} axes", scales.len(), axes.len())));
    }
    let differ = axes.iter().zip(&scales).filter(|&(&a, &s)| (xd[a] as f32 * s as f32).floor() != od[a] as f32).count();
    if differ != 0 {
        let got: Vec<f32> = axes.iter().zip(&scales).map(|(&a, &s)| (xd[a] as f32 * s as f32).floor()).collect();
        return Err(cx.invalid(format!(
            "the run-time scales give the resized axes {axes:?} extents {got:?}, not those of the compiled dims {od:?}"
        )));
    }
    let y = resize(cx)?;
    let check =
        Tensor::from_vec(kiln_ir::Shape::scalar(), vec![differ as i64]).map_err(|e| cx.invalid(e.to_string()))?;
    Ok(vec![y, check])
}

pub(super) fn resize(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let r = xd.len();
    let ty: &TensorType = cx.out_type(0)?;
    let od = ty.shape.dims();
    if ty.dtype != x.dtype() || od.len() != r {
        return Err(cx.invalid(format!("result type {ty} for input {}", x.ty())));
    }
    let ra = cx.attrs::<ResizeAttrs>()?;
    let (mode, ctm, nearest) = (ra.mode, ra.coordinate_transformation_mode, ra.nearest_mode);
    let params =
        Params { mode, cubic_a: ra.cubic_coeff_a as f64, exclude_outside: ra.exclude_outside, antialias: ra.antialias };
    let ev = ra.extrapolation_value as f64;
    let policy = ra.keep_aspect_ratio_policy;
    let axes = match &ra.axes {
        Some(a) => unique_axes(cx, a, r)?,
        None => (0..r).collect(),
    };
    let present = |i: usize| cx.opt_input(i).filter(|t| t.numel() > 0);
    let floats = |i: usize| present(i).map(|t| read_f64(cx, t)).transpose();
    let roi = floats(1)?;
    let scales = floats(2)?;
    let sizes = match present(3) {
        Some(_) => Some(cx.ints(3)?),
        None => None,
    };
    let mut scale = vec![1.0f64; r];
    match (&scales, &sizes) {
        (Some(s), None) => {
            if s.len() != axes.len() {
                return Err(cx.invalid(format!("{} scales for {} axes", s.len(), axes.len())));
            }
            for (&a, &v) in axes.iter().zip(s) {
                if !(v > 0.0 && v.is_finite()) {
                    return Err(cx.invalid(format!("scale {v}")));
                }
                scale[a] = v;
            }
        }
        (None, Some(s)) => {
            if s.len() != axes.len() {
                return Err(cx.invalid(format!("{} sizes for {} axes", s.len(), axes.len())));
            }
            let ratios = axes.iter().zip(s).map(|(&a, &v)| v as f64 / xd[a] as f64);
            let common = match policy {
                KeepAspectRatioPolicy::Stretch => None,
                KeepAspectRatioPolicy::NotLarger => Some(ratios.clone().fold(f64::INFINITY, f64::min)),
                KeepAspectRatioPolicy::NotSmaller => Some(ratios.clone().fold(f64::NEG_INFINITY, f64::max)),
            };
            for (&a, v) in axes.iter().zip(ratios) {
                scale[a] = common.unwrap_or(v);
            }
        }
        _ => return Err(cx.invalid("exactly one of scales and sizes must be given")),
    }
    let mut rois = vec![(0.0f64, 1.0f64); r];
    if let Some(v) = &roi {
        if v.len() != 2 * axes.len() {
            return Err(cx.invalid(format!("roi has {} values for {} axes", v.len(), axes.len())));
        }
        for (k, &a) in axes.iter().enumerate() {
            rois[a] = (v[k], v[k + axes.len()]);
        }
    } else if ctm == Ctm::TfCropAndResize {
        return Err(cx.invalid("tf_crop_and_resize needs roi"));
    }
    let mut resized = vec![false; r];
    for &a in &axes {
        resized[a] = true;
    }
    for d in 0..r {
        if !resized[d] && od[d] != xd[d] {
            return Err(cx.invalid(format!("axis {d} is not resized but changes from {} to {}", xd[d], od[d])));
        }
    }
    if ty.shape.numel() == 0 {
        return Tensor::new(ty.clone(), Vec::new().into()).map_err(|e| cx.invalid(e.to_string()));
    }
    if x.numel() == 0 {
        return Err(cx.invalid("cannot resize an empty tensor to a non-empty one"));
    }
    // With `scales` (or a common scale) the transforms see the fractional output
    // length `scale * in`, as the ONNX reference does; with plain `sizes`, the size.
    let fractional = scales.is_some() || policy != KeepAspectRatioPolicy::Stretch;
    let map = |a: usize| AxisMap {
        ctm,
        n_in: xd[a],
        n_out: od[a],
        len_out: if fractional { scale[a] * xd[a] as f64 } else { od[a] as f64 },
        scale: scale[a],
        roi: rois[a],
    };

    if mode == Mode::Nearest {
        let fill_t = write_f64(cx, &TensorType::new(x.dtype(), Shape::scalar()), &[ev])?;
        let fill = elems(&fill_t).data.into_owned();
        let strides = row_major_strides(xd);
        let mut ax = Vec::with_capacity(r);
        for a in 0..r {
            if !resized[a] {
                ax.push(Ax::lin(strides[a], xd[a]));
                continue;
            }
            let m = map(a);
            let last = xd[a] as f64 - 1.0;
            let mut table = Vec::with_capacity(od[a]);
            for j in 0..od[a] {
                let Some(c) = m.coord(j) else {
                    table.push(FILL);
                    continue;
                };
                if !c.is_finite() {
                    return Err(cx.invalid(format!("source coordinate {c} of output index {j}")));
                }
                let fl = c.floor();
                let i = if c == fl {
                    c
                } else {
                    let f = c - fl;
                    match nearest {
                        Nearest::RoundPreferFloor => {
                            if f <= 0.5 {
                                fl
                            } else {
                                fl + 1.0
                            }
                        }
                        Nearest::RoundPreferCeil => {
                            if f < 0.5 {
                                fl
                            } else {
                                fl + 1.0
                            }
                        }
                        Nearest::Floor => fl,
                        Nearest::Ceil => fl + 1.0,
                    }
                };
                table.push(i.clamp(0.0, last) as usize * strides[a]);
            }
            ax.push(Ax::Map(table));
        }
        return gather_tensor(cx, x, ty, ax, &fill);
    }

    let mut cur = read_f64(cx, x)?;
    let mut dims = xd.to_vec();
    for a in (0..r).rev() {
        if !resized[a] {
            continue;
        }
        let t = taps(cx, &map(a), &params)?;
        if t.is_identity(xd[a]) {
            continue;
        }
        pass(&mut cur, &mut dims, a, &t, ev);
    }
    if x.dtype().is_int() {
        cur.iter_mut().for_each(|v| *v = v.round_ties_even());
    }
    write_f64(cx, ty, &cur)
}
