//! Lowering of the sampling and folding ops: GridSample, Col2Im, RoiAlign and DeformConv
//! (RoiAlign and DeformConv are documented at their functions).
//!
//! - **GridSample** is one kernel over the output `[N, C, O..]`: it loads the output
//!   point's normalised coordinates from the grid (its last axis reversed against the
//!   input's axes), maps them to pixel coordinates with the reference's operations in
//!   the input's compute type (so `nearest` rounds the same ties), applies the border
//!   or reflection rule to coordinates outside the border, and sums the taps of every
//!   axis (1 nearest, 2 linear, 4 cubic) weighted by the product of their per-axis
//!   weights. A tap outside the input is a select to 0 (`zeros`) or an index clamped or
//!   reflected into the axis; every load clamps, so no grid value can read outside X.
//!   The taps are unrolled (at most 4³), so the kernel has no reduction and lands in
//!   the General class (vectorised along the output's contiguous axis where the target
//!   has vector gathers).
//! - **Col2Im** is the gather form of its scatter-add: an output pixel sums, over the
//!   block elements (one reduction variable per spatial axis), the column entries
//!   whose block position covers it: `t = y + pad − k·dilation`, taken when `t ≥ 0`,
//!   `t % stride == 0` and `t / stride` is a block position.

use kiln_ir::attrs::{Col2ImAttrs, GridSampleAttrs, GridSampleMode, GridSamplePadding};
use kiln_ir::OpKind;

use super::movement::{cubic_inner, cubic_outer, single};
use super::{compute, LowerError, Lowered, OpCx};
use kiln_flow::kernel::{BinaryOp, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType, UnaryOp};

type R<T> = Result<T, LowerError>;

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    let r = match cx.op.kind {
        OpKind::GridSample => grid_sample(cx),
        OpKind::Col2Im => col2im(cx),
        OpKind::RoiAlign => roi_align(cx),
        OpKind::DeformConv => deform_conv(cx),
        _ => return None,
    };
    Some(r)
}

fn idx_c(b: &mut KernelBuilder, e: ExprId, c: i64) -> ExprId {
    if c == 0 {
        return e;
    }
    let k = b.index(c);
    b.add(e, k)
}

/// `e` clamped into `0..n` (i64).
fn clamp_into(b: &mut KernelBuilder, e: ExprId, n: usize) -> ExprId {
    let hi = b.index(n as i64 - 1);
    let lo = b.index(0);
    let e = b.binary(BinaryOp::Min, e, hi);
    b.binary(BinaryOp::Max, e, lo)
}

/// `u` reflected into `[lo, hi]` by the nearer border until inside (ONNX's reference
/// `_gs_reflect`), in float type `t`.
fn reflect(b: &mut KernelBuilder, t: ScalarType, u: ExprId, lo: f64, hi: f64) -> ExprId {
    let rng = hi - lo;
    let (lov, hiv) = (b.float(t, lo), b.float(t, hi));
    if rng <= 0.0 {
        return lov;
    }
    let below = b.binary(BinaryOp::Lt, u, lov);
    let above = b.binary(BinaryOp::Gt, u, hiv);
    let d_lo = b.sub(lov, u);
    let d_hi = b.sub(u, hiv);
    let dx = b.select(below, d_lo, d_hi);
    let rv = b.float(t, rng);
    let q = b.div(dx, rv);
    let n = b.unary(UnaryOp::Trunc, q);
    let nr = b.mul(n, rv);
    let r = b.sub(dx, nr);
    let half = b.float(t, 0.5);
    let h = b.mul(n, half);
    let h = b.unary(UnaryOp::Floor, h);
    let h2 = b.add(h, h);
    let odd = b.sub(n, h2);
    let zero = b.float(t, 0.0);
    let even = b.binary(BinaryOp::Eq, odd, zero);
    let a = b.add(lov, r);
    let z = b.sub(hiv, r);
    let from_below = b.select(even, a, z);
    let from_above = b.select(even, z, a);
    let inner = b.select(above, from_above, u);
    b.select(below, from_below, inner)
}

/// Keys' cubic coefficients (a = −0.75) for the fraction `x` in `[0, 1)`, the
/// reference's expressions.
fn cubic_coeffs(b: &mut KernelBuilder, t: ScalarType, x: ExprId) -> [ExprId; 4] {
    let a = -0.75;
    let c = |b: &mut KernelBuilder, v: f64| b.float(t, v);
    let one = c(b, 1.0);
    let two = c(b, 2.0);
    // ((a·s − 5a)·s + 8a)·s − 4a for s = x + 1 and s = 2 − x.
    let outer = |b: &mut KernelBuilder, s: ExprId| {
        let av = b.float(t, a);
        let k5 = b.float(t, 5.0 * a);
        let k8 = b.float(t, 8.0 * a);
        let k4 = b.float(t, 4.0 * a);
        cubic_outer(b, [av, k5, k8, k4], s)
    };
    // ((a + 2)·s − (a + 3))·s·s + 1 for s = x and s = 1 − x.
    let inner = |b: &mut KernelBuilder, s: ExprId| {
        let k2 = b.float(t, a + 2.0);
        let k3 = b.float(t, a + 3.0);
        let one = b.float(t, 1.0);
        cubic_inner(b, [k2, k3, one], s)
    };
    let xp1 = b.add(x, one);
    let omx = b.sub(one, x);
    let tmx = b.sub(two, x);
    [outer(b, xp1), inner(b, x), inner(b, omx), outer(b, tmx)]
}

/// One tap of an axis: its index (i64), whether it lies inside (`zeros` padding) and
/// its weight (`None`: 1).
type Tap = (ExprId, Option<ExprId>, Option<ExprId>);

fn grid_sample(cx: &OpCx<'_>) -> R<Lowered> {
    let a = cx.attrs::<GridSampleAttrs>()?;
    let xt = cx.input_ty(0)?;
    let gt = cx.input_ty(1)?;
    let xd = xt.shape.dims().to_vec();
    let gd = gt.shape.dims().to_vec();
    if xd.len() < 3 || gd.len() != xd.len() || gd[gd.len() - 1] != xd.len() - 2 {
        return Err(cx.unsupported(format!("grid of dims {gd:?} does not fit X of dims {xd:?}")));
    }
    let r = xd.len() - 2;
    let sp = xd[2..].to_vec();
    let ct = compute(xt.dtype);
    let align = a.align_corners;
    let (mode, pad) = (a.mode, a.padding_mode);
    single(cx, &[0, 1], |b, out| {
        // Per input axis: the taps (index i64, validity, weight).
        let mut taps: Vec<Vec<Tap>> = Vec::with_capacity(r);
        for (ax, &len) in sp.iter().enumerate() {
            let (lo, hi) = if align { (0.0, len as f64 - 1.0) } else { (-0.5, len as f64 - 0.5) };
            let mut gi = vec![out[0]];
            gi.extend_from_slice(&out[2..]);
            gi.push(b.index((r - 1 - ax) as i64));
            let v = b.load(1, gi);
            let v = b.convert(v, ct);
            let one = b.float(ct, 1.0);
            let two = b.float(ct, 2.0);
            let lenf = b.float(ct, len as f64);
            let vp1 = b.add(v, one);
            let mut u = if align {
                let lm1 = b.float(ct, len as f64 - 1.0);
                let h = b.div(vp1, two);
                b.mul(h, lm1)
            } else {
                let s = b.mul(vp1, lenf);
                let s = b.sub(s, one);
                b.div(s, two)
            };
            if mode == GridSampleMode::Nearest {
                u = b.unary(UnaryOp::Round, u);
            }
            if pad != GridSamplePadding::Zeros {
                let (lov, hiv) = (b.float(ct, lo), b.float(ct, hi));
                let below = b.binary(BinaryOp::Lt, u, lov);
                let above = b.binary(BinaryOp::Gt, u, hiv);
                let outside = b.binary(BinaryOp::Or, below, above);
                let fixed = if pad == GridSamplePadding::Border {
                    let z = b.float(ct, 0.0);
                    let m = b.float(ct, len as f64 - 1.0);
                    let c = b.binary(BinaryOp::Max, u, z);
                    b.binary(BinaryOp::Min, c, m)
                } else {
                    reflect(b, ct, u, lo, hi)
                };
                u = b.select(outside, fixed, u);
            }
            // The taps (integral float positions) and their weights.
            let mut raw: Vec<(ExprId, Option<ExprId>)> = Vec::new();
            match mode {
                GridSampleMode::Nearest => raw.push((u, None)),
                GridSampleMode::Linear => {
                    let f = b.unary(UnaryOp::Floor, u);
                    let t = b.sub(u, f);
                    let omt = b.sub(one, t);
                    let f1 = b.add(f, one);
                    raw.push((f, Some(omt)));
                    raw.push((f1, Some(t)));
                }
                GridSampleMode::Cubic => {
                    let f = b.unary(UnaryOp::Floor, u);
                    let t = b.sub(u, f);
                    let w = cubic_coeffs(b, ct, t);
                    for (k, wk) in w.into_iter().enumerate() {
                        let off = b.float(ct, k as f64 - 1.0);
                        let fk = b.add(f, off);
                        raw.push((fk, Some(wk)));
                    }
                }
            }
            // Validity is decided on the float position, so the integer index only
            // addresses the load (a code generator's gather).
            let mut axis_taps = Vec::with_capacity(raw.len());
            for (fpos, w) in raw {
                let (idx, valid) = match pad {
                    GridSamplePadding::Zeros => {
                        let z = b.float(ct, 0.0);
                        let last = b.float(ct, len as f64 - 1.0);
                        let ge = b.binary(BinaryOp::Ge, fpos, z);
                        let le = b.binary(BinaryOp::Le, fpos, last);
                        let ok = b.binary(BinaryOp::And, ge, le);
                        let i = b.convert(fpos, ScalarType::I64);
                        (clamp_into(b, i, len), Some(ok))
                    }
                    GridSamplePadding::Border => {
                        let i = b.convert(fpos, ScalarType::I64);
                        (clamp_into(b, i, len), None)
                    }
                    GridSamplePadding::Reflection => {
                        let rf = reflect(b, ct, fpos, lo, hi);
                        let rt = b.unary(UnaryOp::Trunc, rf);
                        let ri = b.convert(rt, ScalarType::I64);
                        (clamp_into(b, ri, len), None)
                    }
                };
                axis_taps.push((idx, valid, w));
            }
            taps.push(axis_taps);
        }
        // Σ over tap combinations of Π weights · X[n, c, idx..].
        let combos: usize = taps.iter().map(Vec::len).product();
        let mut acc: Option<ExprId> = None;
        for combo in 0..combos {
            let mut rem = combo;
            let mut idx = vec![out[0], out[1]];
            let mut sel = vec![0usize; r];
            for ax in (0..r).rev() {
                sel[ax] = rem % taps[ax].len();
                rem /= taps[ax].len();
            }
            let mut w: Option<ExprId> = None;
            let mut ok: Option<ExprId> = None;
            for ax in 0..r {
                let (i, valid, wt) = taps[ax][sel[ax]];
                idx.push(i);
                if let Some(wt) = wt {
                    w = Some(match w {
                        None => wt,
                        Some(p) => b.mul(p, wt),
                    });
                }
                if let Some(v) = valid {
                    ok = Some(match ok {
                        None => v,
                        Some(p) => b.binary(BinaryOp::And, p, v),
                    });
                }
            }
            let x = b.load_with(0, idx, Bounds::Clamp);
            let x = b.convert(x, ct);
            let x = match ok {
                Some(ok) => {
                    let z = b.float(ct, 0.0);
                    b.select(ok, x, z)
                }
                None => x,
            };
            let term = match w {
                Some(w) => b.mul(w, x),
                None => x,
            };
            acc = Some(match acc {
                None => term,
                Some(s) => b.add(s, term),
            });
        }
        acc.ok_or_else(|| cx.unsupported("no taps"))
    })
}

fn col2im(cx: &OpCx<'_>) -> R<Lowered> {
    let a = cx.attrs::<Col2ImAttrs>()?;
    let image = cx.const_ints(1, "image_shape")?.ok_or_else(|| cx.unsupported("image_shape (operand 1) is missing"))?;
    let block = cx.const_ints(2, "block_shape")?.ok_or_else(|| cx.unsupported("block_shape (operand 2) is missing"))?;
    let g = kiln_ir::infer::col2im_geometry(&image, &block, a).map_err(|m| cx.unsupported(m))?;
    let xt = cx.input_ty(0)?;
    let xd = xt.shape.dims().to_vec();
    let s = g.image.len();
    let kprod: usize = g.block.iter().product();
    let npos: usize = g.blocks.iter().product();
    if xd.len() != 3 || kprod == 0 || xd[1] % kprod != 0 || xd[2] != npos {
        return Err(
            cx.unsupported(format!("input of dims {xd:?} does not fit {kprod} block elements at {npos} positions"))
        );
    }
    let ct = compute(xt.dtype);
    // Row-major strides of the block elements and of the block positions.
    let kstride: Vec<usize> = (0..s).map(|d| g.block[d + 1..].iter().product()).collect();
    let pstride: Vec<usize> = (0..s).map(|d| g.blocks[d + 1..].iter().product()).collect();
    single(cx, &[0], |b, out| {
        let vars: Vec<_> = g.block.iter().map(|&k| b.new_var(k as u64)).collect();
        let mut ok: Option<ExprId> = None;
        let kk = b.index(kprod as i64);
        let mut row = b.mul(out[1], kk);
        let mut col = b.index(0);
        for d in 0..s {
            let k = b.var(vars[d]);
            let kd = b.index(g.dilations[d] as i64);
            let kdil = b.mul(k, kd);
            let y = idx_c(b, out[2 + d], g.pads_begin[d] as i64);
            let t = b.sub(y, kdil);
            let st = b.index(g.strides[d] as i64);
            let z = b.index(0);
            let nonneg = b.binary(BinaryOp::Ge, t, z);
            let rm = b.binary(BinaryOp::Rem, t, st);
            let aligned = b.binary(BinaryOp::Eq, rm, z);
            let p = b.div(t, st);
            let np = b.index(g.blocks[d] as i64);
            let inside = b.binary(BinaryOp::Lt, p, np);
            let c1 = b.binary(BinaryOp::And, nonneg, aligned);
            let c = b.binary(BinaryOp::And, c1, inside);
            ok = Some(match ok {
                None => c,
                Some(o) => b.binary(BinaryOp::And, o, c),
            });
            let ks = b.index(kstride[d] as i64);
            let kpart = b.mul(k, ks);
            row = b.add(row, kpart);
            let p = clamp_into(b, p, g.blocks[d]);
            let ps = b.index(pstride[d] as i64);
            let ppart = b.mul(p, ps);
            col = b.add(col, ppart);
        }
        let x = b.load_with(0, vec![out[0], row, col], Bounds::Clamp);
        let x = b.convert(x, ct);
        let z = b.float(ct, 0.0);
        let ok = ok.ok_or_else(|| cx.unsupported("no spatial axis"))?;
        let v = b.select(ok, x, z);
        Ok(b.reduce(ReduceOp::Sum, vars, v))
    })
}

/// `e` (i64) as compute type `t`.
fn to_float(b: &mut KernelBuilder, e: ExprId, t: ScalarType) -> ExprId {
    b.convert(e, t)
}

/// RoiAlign with a fixed `sampling_ratio`: one kernel over `[R, C, oh, ow]`, a
/// reduction over the sampling grid (two variables) of the reference's bilinear
/// sample (clamped corners, 0 for a sample more than a pixel outside), summed and
/// divided by the count (`avg`) or the largest weighted corner (`max`). The adaptive
/// grid (`sampling_ratio = 0`) depends on each box's run-time size and is refused.
fn roi_align(cx: &OpCx<'_>) -> R<Lowered> {
    use kiln_ir::attrs::{RoiAlignAttrs, RoiAlignCoordinates, RoiAlignMode};
    let a = cx.attrs::<RoiAlignAttrs>()?;
    if a.sampling_ratio < 1 {
        return Err(cx.unsupported(
            "sampling_ratio 0 (a sampling grid sized by each box at run time) is not supported; give a positive sampling_ratio",
        ));
    }
    let xt = cx.input_ty(0)?;
    let xd = xt.shape.dims().to_vec();
    if xd.len() != 4 {
        return Err(cx.unsupported(format!("X of dims {xd:?}: expected rank 4")));
    }
    let (n, h, w) = (xd[0], xd[2], xd[3]);
    let ct = compute(xt.dtype);
    let grid = a.sampling_ratio as usize;
    let (oh, ow) = (a.output_height as f64, a.output_width as f64);
    let half = a.coordinate_transformation_mode == RoiAlignCoordinates::HalfPixel;
    let scale = f64::from(a.spatial_scale);
    let mode = a.mode;
    single(cx, &[0, 1, 2], |b, out| {
        let bi = b.load(2, vec![out[0]]);
        let bi = b.convert(bi, ScalarType::I64);
        let bi = clamp_into(b, bi, n);
        let corner = |b: &mut KernelBuilder, k: i64| {
            let kk = b.index(k);
            let v = b.load(1, vec![out[0], kk]);
            let v = b.convert(v, ct);
            let s = b.float(ct, scale);
            let v = b.mul(v, s);
            let o = b.float(ct, if half { 0.5 } else { 0.0 });
            b.sub(v, o)
        };
        let (sw, sh, ew, eh) = (corner(b, 0), corner(b, 1), corner(b, 2), corner(b, 3));
        let mut rw = b.sub(ew, sw);
        let mut rh = b.sub(eh, sh);
        if !half {
            let one = b.float(ct, 1.0);
            rw = b.binary(BinaryOp::Max, rw, one);
            rh = b.binary(BinaryOp::Max, rh, one);
        }
        let (ohv, owv) = (b.float(ct, oh), b.float(ct, ow));
        let bh = b.div(rh, ohv);
        let bw = b.div(rw, owv);
        let (vy, vx) = (b.new_var(grid as u64), b.new_var(grid as u64));
        let gv = b.float(ct, grid as f64);
        let halfv = b.float(ct, 0.5);
        // yy = start + p·bin + (i + 0.5)·bin / grid, per axis.
        let coord = |b: &mut KernelBuilder, start: ExprId, p: ExprId, bin: ExprId, var| {
            let pf = to_float(b, p, ct);
            let pb = b.mul(pf, bin);
            let s = b.add(start, pb);
            let iv = b.var(var);
            let i = to_float(b, iv, ct);
            let i = b.add(i, halfv);
            let ib = b.mul(i, bin);
            let ib = b.div(ib, gv);
            b.add(s, ib)
        };
        let yy = coord(b, sh, out[2], bh, vy);
        let xx = coord(b, sw, out[3], bw, vx);
        let m1 = b.float(ct, -1.0);
        let (hf, wf) = (b.float(ct, h as f64), b.float(ct, w as f64));
        let c1 = b.binary(BinaryOp::Lt, yy, m1);
        let c2 = b.binary(BinaryOp::Gt, yy, hf);
        let c3 = b.binary(BinaryOp::Lt, xx, m1);
        let c4 = b.binary(BinaryOp::Gt, xx, wf);
        let s1 = b.binary(BinaryOp::Or, c1, c2);
        let s2 = b.binary(BinaryOp::Or, c3, c4);
        let skip = b.binary(BinaryOp::Or, s1, s2);
        // Per axis: (low index, high index, fraction).
        let axis = |b: &mut KernelBuilder, v: ExprId, len: usize| {
            let z = b.float(ct, 0.0);
            let v = b.binary(BinaryOp::Max, v, z);
            let t = b.unary(UnaryOp::Trunc, v);
            let lo = b.convert(t, ScalarType::I64);
            let last = b.index(len as i64 - 1);
            let at_end = b.binary(BinaryOp::Ge, lo, last);
            let lo = b.select(at_end, last, lo);
            let lo1 = idx_c(b, lo, 1);
            let hi = b.select(at_end, last, lo1);
            let lastf = b.float(ct, len as f64 - 1.0);
            let v = b.select(at_end, lastf, v);
            let lof = to_float(b, lo, ct);
            let frac = b.sub(v, lof);
            (clamp_into(b, lo, len), clamp_into(b, hi, len), frac)
        };
        let (yl, yh, ly) = axis(b, yy, h);
        let (xl, xh, lx) = axis(b, xx, w);
        let one = b.float(ct, 1.0);
        let hy = b.sub(one, ly);
        let hx = b.sub(one, lx);
        let mut terms = Vec::with_capacity(4);
        for (yi, wy) in [(yl, hy), (yh, ly)] {
            for (xi, wx) in [(xl, hx), (xh, lx)] {
                let v = b.load_with(0, vec![bi, out[1], yi, xi], Bounds::Clamp);
                let v = b.convert(v, ct);
                let wt = b.mul(wy, wx);
                terms.push(b.mul(wt, v));
            }
        }
        let zero = b.float(ct, 0.0);
        match mode {
            RoiAlignMode::Avg => {
                let s = b.add(terms[0], terms[1]);
                let s = b.add(s, terms[2]);
                let s = b.add(s, terms[3]);
                let s = b.select(skip, zero, s);
                let total = b.reduce(ReduceOp::Sum, vec![vy, vx], s);
                let cnt = b.float(ct, (grid * grid) as f64);
                Ok(b.div(total, cnt))
            }
            RoiAlignMode::Max => {
                let m = b.binary(BinaryOp::Max, terms[0], terms[1]);
                let m = b.binary(BinaryOp::Max, m, terms[2]);
                let m = b.binary(BinaryOp::Max, m, terms[3]);
                let m = b.select(skip, zero, m);
                Ok(b.reduce(ReduceOp::Max, vec![vy, vx], m))
            }
        }
    })
}

/// DeformConv (2-D): one kernel over `[N, oc, oh, ow]` reducing over the group's
/// input channels and the kernel taps; each tap reads X bilinearly (0 outside) at its
/// regular position plus the offset loaded for it, times W and the optional mask.
fn deform_conv(cx: &OpCx<'_>) -> R<Lowered> {
    let a = cx.attrs::<kiln_ir::attrs::DeformConvAttrs>()?;
    let (xt, wt, ot) = (cx.input_ty(0)?, cx.input_ty(1)?, cx.input_ty(2)?);
    let (xd, wd, od) = (xt.shape.dims().to_vec(), wt.shape.dims().to_vec(), ot.shape.dims().to_vec());
    let g = kiln_ir::infer::deform_conv_geometry(&xd, &wd, &od, a).map_err(|m| cx.unsupported(m))?;
    let (ic, ih, iw) = (xd[1], xd[2], xd[3]);
    let (oc, icg, kh, kw) = (wd[0], wd[1], wd[2], wd[3]);
    let ocg = oc / g.group;
    let icpo = ic / g.offset_group;
    let ct = compute(xt.dtype);
    let has_b = cx.input(3).is_some();
    let has_m = cx.input(4).is_some();
    let mut operands = vec![0, 1, 2];
    let bi = has_b.then(|| {
        operands.push(3);
        operands.len() - 1
    });
    let mi = has_m.then(|| {
        operands.push(4);
        operands.len() - 1
    });
    single(cx, &operands, |b, out| {
        let (vc, vy, vx) = (b.new_var(icg as u64), b.new_var(kh as u64), b.new_var(kw as u64));
        let (cg, ky, kx) = (b.var(vc), b.var(vy), b.var(vx));
        let ocgv = b.index(ocg as i64);
        let grp = b.div(out[1], ocgv);
        let icgv = b.index(icg as i64);
        let c = b.mul(grp, icgv);
        let c = b.add(c, cg);
        let icpov = b.index(icpo as i64);
        let og = b.div(c, icpov);
        let kwv = b.index(kw as i64);
        let k = b.mul(ky, kwv);
        let k = b.add(k, kx);
        let kk = b.index((kh * kw) as i64);
        let two = b.index(2);
        let och = b.mul(og, kk);
        let och = b.mul(och, two);
        let k2 = b.mul(k, two);
        let och = b.add(och, k2);
        let och1 = idx_c(b, och, 1);
        let oy = b.load_with(2, vec![out[0], och, out[2], out[3]], Bounds::Clamp);
        let ox = b.load_with(2, vec![out[0], och1, out[2], out[3]], Bounds::Clamp);
        let oy = b.convert(oy, ct);
        let ox = b.convert(ox, ct);
        // Regular position: p·stride + k·dilation − pad, per axis.
        let base = |b: &mut KernelBuilder, p: ExprId, kv: ExprId, d: usize| {
            let s = b.index(g.strides[d] as i64);
            let ps = b.mul(p, s);
            let dl = b.index(g.dilations[d] as i64);
            let kd = b.mul(kv, dl);
            let v = b.add(ps, kd);
            let v = idx_c(b, v, -(g.pads_begin[d] as i64));
            b.convert(v, ct)
        };
        let by = base(b, out[2], ky, 0);
        let bx = base(b, out[3], kx, 1);
        let y = b.add(by, oy);
        let x = b.add(bx, ox);
        let axis = |b: &mut KernelBuilder, v: ExprId, len: usize| {
            let f = b.unary(UnaryOp::Floor, v);
            let t = b.sub(v, f);
            let one = b.float(ct, 1.0);
            let omt = b.sub(one, t);
            let i0 = b.convert(f, ScalarType::I64);
            let i1 = idx_c(b, i0, 1);
            let mut taps = Vec::new();
            for (i, wgt) in [(i0, omt), (i1, t)] {
                let z = b.index(0);
                let n = b.index(len as i64);
                let ge = b.binary(BinaryOp::Ge, i, z);
                let lt = b.binary(BinaryOp::Lt, i, n);
                let ok = b.binary(BinaryOp::And, ge, lt);
                taps.push((clamp_into(b, i, len), ok, wgt));
            }
            taps
        };
        let ty_ = axis(b, y, ih);
        let tx_ = axis(b, x, iw);
        let zero = b.float(ct, 0.0);
        let mut s: Option<ExprId> = None;
        for &(yi, yok, wy) in &ty_ {
            for &(xi, xok, wx) in &tx_ {
                let v = b.load_with(0, vec![out[0], c, yi, xi], Bounds::Clamp);
                let v = b.convert(v, ct);
                let ok = b.binary(BinaryOp::And, yok, xok);
                let v = b.select(ok, v, zero);
                let wgt = b.mul(wy, wx);
                let term = b.mul(wgt, v);
                s = Some(match s {
                    None => term,
                    Some(p) => b.add(p, term),
                });
            }
        }
        let s = s.ok_or_else(|| cx.unsupported("no taps"))?;
        let wv = b.load(1, vec![out[1], cg, ky, kx]);
        let wv = b.convert(wv, ct);
        let mut term = b.mul(wv, s);
        if let Some(mi) = mi {
            let mch = b.mul(og, kk);
            let mch = b.add(mch, k);
            let m = b.load_with(mi, vec![out[0], mch, out[2], out[3]], Bounds::Clamp);
            let m = b.convert(m, ct);
            term = b.mul(term, m);
        }
        let acc = b.reduce(ReduceOp::Sum, vec![vc, vy, vx], term);
        Ok(match bi {
            Some(bi) => {
                let bv = b.load(bi, vec![out[1]]);
                let bv = b.convert(bv, ct);
                b.add(acc, bv)
            }
            None => acc,
        })
    })
}
