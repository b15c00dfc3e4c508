//! Sampling and folding: GridSample, Col2Im, RoiAlign and DeformConv.
//!
//! GridSample follows ONNX's reference implementation step by step: each output
//! point's normalised coordinates (the grid's last axis, x first, so reversed against
//! the input's axes) are mapped to pixel coordinates per `align_corners`, rounded half
//! to even for `nearest`, brought back inside the border for `border` and `reflection`
//! padding, and then interpolated separably (linear: 2 taps per axis, cubic: 4 taps with
//! Keys' coefficients, a = −0.75); a tap outside the input reads 0 (`zeros`), the
//! nearest edge pixel (`border`) or its reflection (`reflection`).
//!
//! Col2Im adds every column of its input back into the image positions its block
//! covers (the inverse of im2col): positions that fall into the padding are dropped.

use crate::util::{out_checked, Cx};
use crate::EvalError;
use kiln_ir::attrs::{Col2ImAttrs, GridSampleAttrs, GridSampleMode, GridSamplePadding};
use kiln_ir::Tensor;

/// Reflects `x` into `[lo, hi]` by the nearer border until it lies inside.
fn reflect(x: f64, lo: f64, hi: f64) -> f64 {
    let rng = hi - lo;
    if rng <= 0.0 {
        return lo;
    }
    if x < lo {
        let dx = lo - x;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            lo + r
        } else {
            hi - r
        }
    } else if x > hi {
        let dx = x - hi;
        let n = (dx / rng).trunc();
        let r = dx - n * rng;
        if n % 2.0 == 0.0 {
            hi - r
        } else {
            lo + r
        }
    } else {
        x
    }
}

/// RoiAlign's sample at `v` along an axis of `n` cells (`v` at least -1): the
/// coordinate, clamped to 0 and held at the last cell past it, and the low and high
/// cells around it.
fn roi_cell(v: f64, n: usize) -> (f64, usize, usize) {
    let v = v.max(0.0);
    let lo = v as usize;
    if lo >= n - 1 {
        ((n - 1) as f64, n - 1, n - 1)
    } else {
        (v, lo, lo + 1)
    }
}

fn cubic_coeffs(t: f64) -> [f64; 4] {
    let a = -0.75;
    let x = t.abs();
    [
        ((a * (x + 1.0) - 5.0 * a) * (x + 1.0) + 8.0 * a) * (x + 1.0) - 4.0 * a,
        ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0,
        ((a + 2.0) * (1.0 - x) - (a + 3.0)) * (1.0 - x) * (1.0 - x) + 1.0,
        ((a * (2.0 - x) - 5.0 * a) * (2.0 - x) + 8.0 * a) * (2.0 - x) - 4.0 * a,
    ]
}

pub(super) fn grid_sample(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.float_input(0)?;
    let grid = cx.float_input(1)?;
    let a = cx.attrs::<GridSampleAttrs>()?;
    let xd = x.shape().dims().to_vec();
    let gd = grid.shape().dims().to_vec();
    if xd.len() < 3 || gd.len() != xd.len() || gd[0] != xd[0] || gd[gd.len() - 1] != xd.len() - 2 {
        return Err(cx.invalid(format!("grid of dims {gd:?} does not fit X of dims {xd:?}")));
    }
    let r = xd.len() - 2;
    let (n, c) = (xd[0], xd[1]);
    let sp = &xd[2..];
    let out_sp = &gd[1..=r];
    let mut od = vec![n, c];
    od.extend_from_slice(out_sp);
    let ty = out_checked(cx, 0, x.dtype(), &od)?;
    let xv = x.to_f64_vec();
    let gv = grid.to_f64_vec();
    let plane: usize = sp.iter().product();
    let npts: usize = out_sp.iter().product();
    let align = a.align_corners;
    let (lo, hi): (Vec<f64>, Vec<f64>) =
        sp.iter().map(|&d| if align { (0.0, d as f64 - 1.0) } else { (-0.5, d as f64 - 0.5) }).unzip();
    // The pixel an integer tap reads along axis `ax`, `None` for a zero.
    let tap = |ax: usize, i: i64| -> Option<usize> {
        let d = sp[ax] as i64;
        match a.padding_mode {
            GridSamplePadding::Zeros => (0..d).contains(&i).then_some(i as usize),
            GridSamplePadding::Border => Some(i.clamp(0, d - 1) as usize),
            GridSamplePadding::Reflection => {
                Some((reflect(i as f64, lo[ax], hi[ax]).trunc() as i64).clamp(0, d - 1) as usize)
            }
        }
    };
    let mut out = vec![0.0; n * c * npts];
    for b in 0..n {
        for p in 0..npts {
            // Pixel coordinates per input axis (grid's last axis reversed).
            let g = &gv[(b * npts + p) * r..(b * npts + p + 1) * r];
            let mut pos = vec![0.0; r];
            for ax in 0..r {
                let v = g[r - 1 - ax];
                let len = sp[ax] as f64;
                let mut u = if align { (v + 1.0) / 2.0 * (len - 1.0) } else { ((v + 1.0) * len - 1.0) / 2.0 };
                if a.mode == GridSampleMode::Nearest {
                    u = u.round_ties_even();
                }
                if u < lo[ax] || u > hi[ax] {
                    match a.padding_mode {
                        GridSamplePadding::Border => u = u.clamp(0.0, len - 1.0),
                        GridSamplePadding::Reflection => u = reflect(u, lo[ax], hi[ax]),
                        GridSamplePadding::Zeros => {}
                    }
                }
                pos[ax] = u;
            }
            // Taps per axis: (index, weight).
            let taps: Vec<Vec<(Option<usize>, f64)>> = (0..r)
                .map(|ax| {
                    let u = pos[ax];
                    match a.mode {
                        GridSampleMode::Nearest => vec![(tap(ax, u as i64), 1.0)],
                        GridSampleMode::Linear => {
                            let f = u.floor();
                            let t = u - f;
                            vec![(tap(ax, f as i64), 1.0 - t), (tap(ax, f as i64 + 1), t)]
                        }
                        GridSampleMode::Cubic => {
                            let f = u.floor();
                            let w = cubic_coeffs(u - f);
                            (0..4).map(|k| (tap(ax, f as i64 - 1 + k as i64), w[k])).collect()
                        }
                    }
                })
                .collect();
            for ch in 0..c {
                let base = (b * c + ch) * plane;
                let mut acc = 0.0;
                let combos: usize = taps.iter().map(Vec::len).product();
                for combo in 0..combos {
                    let mut rem = combo;
                    let mut w = 1.0;
                    let mut off = Some(0usize);
                    for ax in (0..r).rev() {
                        let (i, wt) = taps[ax][rem % taps[ax].len()];
                        rem /= taps[ax].len();
                        w *= wt;
                        let stride: usize = sp[ax + 1..].iter().product();
                        off = match (off, i) {
                            (Some(o), Some(i)) => Some(o + i * stride),
                            _ => None,
                        };
                    }
                    if let Some(o) = off {
                        acc += w * xv[base + o];
                    }
                }
                out[(b * c + ch) * npts + p] = acc;
            }
        }
    }
    cx.from_f64(ty, &out)
}

pub(super) fn col2im(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let image = cx.ints(1)?;
    let block = cx.ints(2)?;
    let a = cx.attrs::<Col2ImAttrs>()?;
    let s = image.len();
    let xd = x.shape().dims().to_vec();
    if xd.len() != 3 || s == 0 || block.len() != s {
        return Err(cx.invalid(format!("input of dims {xd:?}, image_shape {image:?}, block_shape {block:?}")));
    }
    let get = |v: &Option<Vec<i64>>, k: usize, d: i64| v.as_ref().and_then(|v| v.get(k).copied()).unwrap_or(d);
    let mut blocks = Vec::with_capacity(s);
    for d in 0..s {
        let span = get(&a.dilations, d, 1) * (block[d] - 1) + 1;
        let padded = image[d] + get(&a.pads, d, 0) + get(&a.pads, d + s, 0);
        let st = get(&a.strides, d, 1);
        if st < 1 || padded < span || block[d] < 1 || image[d] < 1 {
            return Err(cx.invalid(format!("axis {d}: the block does not fit the image")));
        }
        blocks.push(((padded - span) / st + 1) as usize);
    }
    let kprod: usize = block.iter().map(|&k| k as usize).product();
    let npos: usize = blocks.iter().product();
    if xd[1] % kprod != 0 || xd[2] != npos {
        return Err(cx.invalid(format!("input of dims {xd:?} does not fit {kprod} block elements at {npos} positions")));
    }
    let c = xd[1] / kprod;
    let img: Vec<usize> = image.iter().map(|&v| v as usize).collect();
    let plane: usize = img.iter().product();
    let mut od = vec![xd[0], c];
    od.extend_from_slice(&img);
    let ty = out_checked(cx, 0, x.dtype(), &od)?;
    let xv = x.to_f64_vec();
    let mut out = vec![0.0; xd[0] * c * plane];
    for b in 0..xd[0] {
        for ch in 0..c {
            for ke in 0..kprod {
                // Block element → per-axis offsets (row-major over block).
                let mut kk = vec![0i64; s];
                let mut rem = ke;
                for d in (0..s).rev() {
                    kk[d] = (rem % block[d] as usize) as i64;
                    rem /= block[d] as usize;
                }
                for p in 0..npos {
                    let mut pp = vec![0i64; s];
                    let mut rem = p;
                    for d in (0..s).rev() {
                        pp[d] = (rem % blocks[d]) as i64;
                        rem /= blocks[d];
                    }
                    let mut off = 0usize;
                    let mut inside = true;
                    for d in 0..s {
                        let y = pp[d] * get(&a.strides, d, 1) + kk[d] * get(&a.dilations, d, 1) - get(&a.pads, d, 0);
                        if y < 0 || y >= image[d] {
                            inside = false;
                            break;
                        }
                        off = off * img[d] + y as usize;
                    }
                    if inside {
                        let src = ((b * xd[1]) + ch * kprod + ke) * npos + p;
                        out[(b * c + ch) * plane + off] += xv[src];
                    }
                }
            }
        }
    }
    cx.from_f64(ty, &out)
}

/// RoiAlign: ONNX's reference (a port of ONNX Runtime's), sample by sample: each
/// output bin averages (or takes the largest weighted corner of) a grid of bilinear
/// samples; a sample more than a pixel outside the input counts as 0.
pub(super) fn roi_align(cx: &Cx) -> Result<Tensor, EvalError> {
    use kiln_ir::attrs::{RoiAlignAttrs, RoiAlignCoordinates, RoiAlignMode};
    let x = cx.float_input(0)?;
    let rois = cx.float_input(1)?.to_f64_vec();
    let bi = cx.ints(2)?;
    let a = cx.attrs::<RoiAlignAttrs>()?;
    let xd = x.shape().dims().to_vec();
    if xd.len() != 4 || rois.len() != 4 * bi.len() {
        return Err(cx.invalid(format!("X of dims {xd:?}, {} box values for {} boxes", rois.len(), bi.len())));
    }
    let (n, c, h, w) = (xd[0], xd[1], xd[2], xd[3]);
    let (ph_n, pw_n) = (a.output_height as usize, a.output_width as usize);
    let ty = out_checked(cx, 0, x.dtype(), &[bi.len(), c, ph_n, pw_n])?;
    let xv = x.to_f64_vec();
    let half = a.coordinate_transformation_mode == RoiAlignCoordinates::HalfPixel;
    let scale = f64::from(a.spatial_scale);
    let offset = if half { 0.5 } else { 0.0 };
    let mut out = Vec::with_capacity(bi.len() * c * ph_n * pw_n);
    for (r, &b) in bi.iter().enumerate() {
        let b = usize::try_from(b)
            .ok()
            .filter(|&b| b < n)
            .ok_or_else(|| cx.invalid(format!("batch index {b} outside 0..{n}")))?;
        let bx = &rois[4 * r..4 * r + 4];
        let (sw, sh) = (bx[0] * scale - offset, bx[1] * scale - offset);
        let (ew, eh) = (bx[2] * scale - offset, bx[3] * scale - offset);
        let (mut rw, mut rh) = (ew - sw, eh - sh);
        if !half {
            rw = rw.max(1.0);
            rh = rh.max(1.0);
        }
        let (bh, bw) = (rh / ph_n as f64, rw / pw_n as f64);
        let gh =
            if a.sampling_ratio > 0 { a.sampling_ratio as usize } else { (rh / ph_n as f64).ceil().max(0.0) as usize };
        let gw =
            if a.sampling_ratio > 0 { a.sampling_ratio as usize } else { (rw / pw_n as f64).ceil().max(0.0) as usize };
        let count = (gh * gw).max(1) as f64;
        for ch in 0..c {
            let plane = &xv[(b * c + ch) * h * w..(b * c + ch + 1) * h * w];
            for ph in 0..ph_n {
                for pw in 0..pw_n {
                    let mut acc = 0.0;
                    let mut best: Option<f64> = None;
                    for iy in 0..gh {
                        let yy = sh + ph as f64 * bh + (iy as f64 + 0.5) * bh / gh as f64;
                        for ix in 0..gw {
                            let xx = sw + pw as f64 * bw + (ix as f64 + 0.5) * bw / gw as f64;
                            let corners = if yy < -1.0 || yy > h as f64 || xx < -1.0 || xx > w as f64 {
                                [(0usize, 0.0); 4]
                            } else {
                                let (y, yl, yh) = roi_cell(yy, h);
                                let (xq, xl, xh) = roi_cell(xx, w);
                                let (ly, lx) = (y - yl as f64, xq - xl as f64);
                                let (hy, hx) = (1.0 - ly, 1.0 - lx);
                                [
                                    (yl * w + xl, hy * hx),
                                    (yl * w + xh, hy * lx),
                                    (yh * w + xl, ly * hx),
                                    (yh * w + xh, ly * lx),
                                ]
                            };
                            let terms = corners.map(|(p, wt)| wt * plane[p]);
                            match a.mode {
                                RoiAlignMode::Avg => acc += terms.iter().sum::<f64>(),
                                RoiAlignMode::Max => {
                                    let m = terms.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                                    best = Some(best.map_or(m, |b| b.max(m)));
                                }
                            }
                        }
                    }
                    out.push(match a.mode {
                        RoiAlignMode::Avg => acc / count,
                        RoiAlignMode::Max => best.unwrap_or(0.0),
                    });
                }
            }
        }
    }
    cx.from_f64(ty, &out)
}

/// DeformConv (2-D): a convolution whose every tap reads X at its regular position
/// plus a learned offset, bilinearly (0 outside the input), times the optional mask.
pub(super) fn deform_conv(cx: &Cx) -> Result<Tensor, EvalError> {
    use kiln_ir::attrs::DeformConvAttrs;
    let x = cx.float_input(0)?;
    let wt = cx.float_input(1)?;
    let off = cx.float_input(2)?;
    let bias = cx.opt_input(3).map(|t| t.to_f64_vec());
    let mask = cx.opt_input(4).map(|t| t.to_f64_vec());
    let a = cx.attrs::<DeformConvAttrs>()?;
    let (xd, wd, od) = (x.shape().dims().to_vec(), wt.shape().dims().to_vec(), off.shape().dims().to_vec());
    if xd.len() != 4 || wd.len() != 4 || od.len() != 4 {
        return Err(cx.unsupported("only 2-D deformable convolutions (rank 4)"));
    }
    let (n, ic, ih, iw) = (xd[0], xd[1], xd[2], xd[3]);
    let (oc, icg, kh, kw) = (wd[0], wd[1], wd[2], wd[3]);
    let (oh, ow) = (od[2], od[3]);
    let group = a.group.max(1) as usize;
    let og = a.offset_group.max(1) as usize;
    if ic != icg * group || oc % group != 0 || ic % og != 0 || od[1] != og * 2 * kh * kw || od[0] != n {
        return Err(
            cx.invalid(format!("X {xd:?}, W {wd:?}, offset {od:?} do not fit group {group}, offset_group {og}"))
        );
    }
    let get = |v: &Option<Vec<i64>>, k: usize, d: i64| v.as_ref().and_then(|v| v.get(k).copied()).unwrap_or(d);
    let (sh, sw) = (get(&a.strides, 0, 1) as f64, get(&a.strides, 1, 1) as f64);
    let (dh, dw) = (get(&a.dilations, 0, 1) as f64, get(&a.dilations, 1, 1) as f64);
    let (pt, pl) = (get(&a.pads, 0, 0) as f64, get(&a.pads, 1, 0) as f64);
    let ty = out_checked(cx, 0, x.dtype(), &[n, oc, oh, ow])?;
    let (xv, wv, ov) = (x.to_f64_vec(), wt.to_f64_vec(), off.to_f64_vec());
    let ocg = oc / group;
    let icpo = ic / og;
    let sample = |plane: &[f64], y: f64, xq: f64| -> f64 {
        let (y0, x0) = (y.floor(), xq.floor());
        let (ty_, tx) = (y - y0, xq - x0);
        let mut s = 0.0;
        for (dy, wy) in [(0.0, 1.0 - ty_), (1.0, ty_)] {
            for (dx, wx) in [(0.0, 1.0 - tx), (1.0, tx)] {
                let (yy, xx) = (y0 + dy, x0 + dx);
                if yy >= 0.0 && yy < ih as f64 && xx >= 0.0 && xx < iw as f64 {
                    s += wy * wx * plane[yy as usize * iw + xx as usize];
                }
            }
        }
        s
    };
    let mut out = vec![0.0; n * oc * oh * ow];
    for b in 0..n {
        for o in 0..oc {
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = bias.as_ref().map_or(0.0, |v| v[o]);
                    for cg in 0..icg {
                        let c = (o / ocg) * icg + cg;
                        let g = c / icpo;
                        let plane = &xv[(b * ic + c) * ih * iw..(b * ic + c + 1) * ih * iw];
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let k = ky * kw + kx;
                                let oidx = |d: usize| ((b * od[1] + g * 2 * kh * kw + 2 * k + d) * oh + i) * ow + j;
                                let y = -pt + sh * i as f64 + dh * ky as f64 + ov[oidx(0)];
                                let xq = -pl + sw * j as f64 + dw * kx as f64 + ov[oidx(1)];
                                let m = mask
                                    .as_ref()
                                    .map_or(1.0, |mv| mv[((b * og * kh * kw + g * kh * kw + k) * oh + i) * ow + j]);
                                acc += wv[((o * icg + cg) * kh + ky) * kw + kx] * m * sample(plane, y, xq);
                            }
                        }
                    }
                    out[((b * oc + o) * oh + i) * ow + j] = acc;
                }
            }
        }
    }
    cx.from_f64(ty, &out)
}
