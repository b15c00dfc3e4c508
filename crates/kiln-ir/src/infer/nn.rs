//! Neural-network layers: Conv, ConvInteger, QLinearConv, ConvTranspose, the
//! pools, the normalizations and the recurrent ops (RNN, GRU, LSTM).

use super::ctx::{broadcast_dims, Class, Ctx, Dims, Ints, R};
use crate::attrs::{
    AttentionAttrs, AutoPad, BatchNormAttrs, ConvAttrs, ConvTransposeAttrs, GroupNormAttrs, LayerNormAttrs, PoolAttrs,
    RmsNormAttrs, RnnAttrs, RnnDirection, RotaryEmbeddingAttrs,
};
use crate::dtype::DType;
use crate::shape::TensorType;

/// The sliding-window attributes shared by convolutions and pools.
struct Window {
    strides: Vec<usize>,
    dilations: Vec<usize>,
    /// Begins then ends, `2·n` entries.
    pads: Vec<usize>,
    auto_pad: AutoPad,
}

/// An ints attribute of `n` entries, each ≥ `min`; `default` when absent.
fn ints_n(cx: &Ctx, name: &str, v: Option<&[i64]>, n: usize, min: i64, default: usize) -> R<Vec<usize>> {
    match v {
        None => Ok(vec![default; n]),
        Some(v) => {
            if v.len() != n {
                return Err(cx.invalid(format_args!("attribute `{name}` {} must have {n} entries", Ints(v))));
            }
            v.iter()
                .map(|&x| {
                    usize::try_from(x).ok().filter(|_| x >= min).ok_or_else(|| {
                        cx.invalid(format_args!("attribute `{name}` {} must have entries ≥ {min}", Ints(v)))
                    })
                })
                .collect()
        }
    }
}

fn window(cx: &Ctx, n: usize) -> R<Window> {
    let a = cx.op.window_attrs().map_err(|e| cx.invalid(e))?;
    Ok(Window {
        strides: ints_n(cx, "strides", a.strides, n, 1, 1)?,
        dilations: ints_n(cx, "dilations", a.dilations, n, 1, 1)?,
        pads: ints_n(cx, "pads", a.pads, 2 * n, 0, 0)?,
        auto_pad: a.auto_pad,
    })
}

/// Kernel extent with dilation: d·(k−1)+1.
fn effective_kernel(cx: &Ctx, k: usize, dilation: usize, i: usize) -> R<usize> {
    if k == 0 {
        return Err(cx.invalid(format_args!("the kernel is empty along spatial axis {i}")));
    }
    dilation
        .checked_mul(k - 1)
        .and_then(|v| v.checked_add(1))
        .ok_or_else(|| cx.invalid("the dilated kernel is too large"))
}

/// Output extents of a sliding window (convolution or pool) over `input`.
fn window_out(cx: &Ctx, input: &[usize], kernel: &[usize], w: &Window, ceil: bool) -> R<Vec<usize>> {
    let n = input.len();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let (inp, stride) = (input[i], w.strides[i]);
        let ek = effective_kernel(cx, kernel[i], w.dilations[i], i)?;
        let too_small = |padded: u128| {
            cx.invalid(format_args!(
                "the kernel (extent {ek} with dilation) is larger than the input extent {padded} (with padding) along spatial axis {i}"
            ))
        };
        let o = match w.auto_pad {
            AutoPad::SameUpper | AutoPad::SameLower => inp.div_ceil(stride),
            AutoPad::Valid => {
                if inp < ek {
                    return Err(too_small(inp as u128));
                }
                (inp - ek) / stride + 1
            }
            AutoPad::NotSet => {
                let (pb, pe) = (w.pads[i] as u128, w.pads[i + n] as u128);
                let (inp, ek, stride) = (inp as u128, ek as u128, stride as u128);
                let total = inp + pb + pe;
                if total < ek {
                    return Err(too_small(total));
                }
                let span = total - ek;
                let mut o = if ceil { span.div_ceil(stride) } else { span / stride } + 1;
                // With ceil_mode, a last window that would start in the end padding is dropped.
                if ceil && (o - 1) * stride >= inp + pb {
                    o -= 1;
                }
                usize::try_from(o).map_err(|_| cx.invalid("result is too large"))?
            }
        };
        out.push(o);
    }
    Ok(out)
}

fn group(cx: &Ctx) -> R<usize> {
    let g = match cx.op.kind {
        crate::op::OpKind::ConvTranspose => cx.attrs::<ConvTransposeAttrs>()?.group,
        _ => cx.attrs::<ConvAttrs>()?.group,
    };
    cx.count_attr(g, "group")
}

/// Checks `kernel_shape` (optional for convolutions) against the weights' spatial extents.
fn check_kernel_shape(cx: &Ctx, w: &TensorType, kernel: &[usize]) -> R<()> {
    let ks = cx.op.window_attrs().map_err(|e| cx.invalid(e))?.kernel_shape;
    if let Some(ks) = ks {
        let same =
            ks.len() == kernel.len() && ks.iter().zip(kernel).all(|(&a, &b)| u64::try_from(a).ok() == Some(b as u64));
        if !same {
            return Err(
                cx.invalid(format_args!("attribute `kernel_shape` {} does not match the weights {w}", Ints(ks)))
            );
        }
    }
    Ok(())
}

/// The shape of a convolution of `x` (operand `xi`) with `w` (operand `wi`):
/// [N, M, spatial…]; checks channels and groups. Returns (dims, M).
fn conv_shape(cx: &Ctx, x: &TensorType, xi: usize, w: &TensorType, wi: usize) -> R<(Vec<usize>, usize)> {
    cx.min_rank(x, xi, "X", 3)?;
    cx.rank(w, wi, "W", x.shape.rank())?;
    let (xd, wd) = (x.shape.dims(), w.shape.dims());
    let g = group(cx)?;
    let (c, m) = (xd[1], wd[0]);
    if wd[1].checked_mul(g) != Some(c) {
        return Err(cx.invalid(format_args!(
            "the weights {w} with group {g} take {} input channels, but X {x} has {c}",
            wd[1].saturating_mul(g)
        )));
    }
    if m % g != 0 {
        return Err(
            cx.invalid(format_args!("the output channel count {m} of the weights {w} is not a multiple of group {g}"))
        );
    }
    let kernel = &wd[2..];
    check_kernel_shape(cx, w, kernel)?;
    let win = window(cx, kernel.len())?;
    let sp = window_out(cx, &xd[2..], kernel, &win, false)?;
    let mut out = vec![xd[0], m];
    out.extend(sp);
    Ok((out, m))
}

/// Conv(X, W, B?).
pub(super) fn conv(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let w = cx.req_same(1, "W", x)?;
    let (dims, m) = conv_shape(cx, x, 0, w, 1)?;
    if let Some(b) = cx.opt_ty(2) {
        cx.same_dtype(b, 2, "B", x)?;
        cx.expect_dims(b, 2, "B", &[m])?;
    }
    Ok(vec![cx.tt(x.dtype, dims)?])
}

/// A zero point or scale that is per-tensor (one element) or per output channel ([m]).
fn per_tensor_or_channel(cx: &Ctx, t: &TensorType, i: usize, what: &str, m: usize) -> R<()> {
    let d = t.shape.dims();
    if d.is_empty() || d == [1] || d == [m] {
        Ok(())
    } else {
        Err(cx.invalid(format_args!("`{what}` (input {i}) must be a scalar or have shape [{m}], got {t}")))
    }
}

/// ConvInteger(x, w, x_zero_point?, w_zero_point?) → i32.
pub(super) fn conv_integer(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(4)?;
    let x = cx.req_class(0, "x", Class::Quant8)?;
    let w = cx.req_class(1, "w", Class::Quant8)?;
    let (dims, m) = conv_shape(cx, x, 0, w, 1)?;
    if let Some(z) = cx.opt_ty(2) {
        cx.same_dtype(z, 2, "x_zero_point", x)?;
        cx.expect_scalar(z, 2, "x_zero_point")?;
    }
    if let Some(z) = cx.opt_ty(3) {
        cx.same_dtype(z, 3, "w_zero_point", w)?;
        per_tensor_or_channel(cx, z, 3, "w_zero_point", m)?;
    }
    Ok(vec![cx.tt(DType::I32, dims)?])
}

/// QLinearConv(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
/// y_zero_point, B?) → y_zero_point's dtype.
pub(super) fn qlinear_conv(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(9)?;
    let x = cx.req_class(0, "x", Class::Quant8)?;
    let w = cx.req_class(3, "w", Class::Quant8)?;
    let (dims, m) = conv_shape(cx, x, 0, w, 3)?;
    let xs = cx.req_class(1, "x_scale", Class::Float)?;
    cx.expect_scalar(xs, 1, "x_scale")?;
    let xz = cx.req_same(2, "x_zero_point", x)?;
    cx.expect_scalar(xz, 2, "x_zero_point")?;
    let ws = cx.req_class(4, "w_scale", Class::Float)?;
    per_tensor_or_channel(cx, ws, 4, "w_scale", m)?;
    let wz = cx.req_same(5, "w_zero_point", w)?;
    per_tensor_or_channel(cx, wz, 5, "w_zero_point", m)?;
    let ys = cx.req_class(6, "y_scale", Class::Float)?;
    cx.expect_scalar(ys, 6, "y_scale")?;
    let yz = cx.req_class(7, "y_zero_point", Class::Quant8)?;
    cx.expect_scalar(yz, 7, "y_zero_point")?;
    if let Some(b) = cx.opt_ty(8) {
        if b.dtype != DType::I32 {
            return Err(cx.invalid(format_args!("`B` (input 8) must be an int32 tensor, got {b}")));
        }
        cx.expect_dims(b, 8, "B", &[m])?;
    }
    Ok(vec![cx.tt(yz.dtype, dims)?])
}

/// ConvTranspose(X, W, B?): W is [C, M/group, k…]; output extents from
/// `output_shape`, or stride·(in−1) + output_padding + dilated kernel − pads
/// (in·stride with SAME_UPPER/SAME_LOWER).
pub(super) fn conv_transpose(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let w = cx.req_same(1, "W", x)?;
    cx.min_rank(x, 0, "X", 3)?;
    cx.rank(w, 1, "W", x.shape.rank())?;
    let (xd, wd) = (x.shape.dims(), w.shape.dims());
    let g = group(cx)?;
    let c = xd[1];
    if wd[0] != c {
        return Err(cx.invalid(format_args!("the weights {w} take {} input channels, but X {x} has {c}", wd[0])));
    }
    if c % g != 0 {
        return Err(cx.invalid(format_args!("the input channel count {c} of X {x} is not a multiple of group {g}")));
    }
    let m = wd[1].checked_mul(g).ok_or_else(|| cx.invalid("result is too large"))?;
    if let Some(b) = cx.opt_ty(2) {
        cx.same_dtype(b, 2, "B", x)?;
        cx.expect_dims(b, 2, "B", &[m])?;
    }
    let kernel = &wd[2..];
    let n = kernel.len();
    check_kernel_shape(cx, w, kernel)?;
    let win = window(cx, n)?;
    let a = cx.attrs::<ConvTransposeAttrs>()?;
    let out_pad = ints_n(cx, "output_padding", a.output_padding.as_deref(), n, 0, 0)?;
    let mut out = vec![xd[0], m];
    if let Some(os) = &a.output_shape {
        // Spatial extents; a full [N, C, spatial…] list is accepted too.
        let sp = match os.len() {
            l if l == n => &os[..],
            l if l == n + 2 => &os[2..],
            _ => return Err(cx.invalid(format_args!("attribute `output_shape` {} must have {n} entries", Ints(os)))),
        };
        for &v in sp {
            out.push(cx.extent(v, "`output_shape` entry")?);
        }
    } else {
        for i in 0..n {
            let (inp, stride) = (xd[2 + i] as i128, win.strides[i] as i128);
            let o = match win.auto_pad {
                AutoPad::SameUpper | AutoPad::SameLower => inp * stride,
                AutoPad::NotSet | AutoPad::Valid => {
                    let ek = effective_kernel(cx, kernel[i], win.dilations[i], i)? as i128;
                    let (pb, pe) = if win.auto_pad == AutoPad::Valid {
                        (0, 0)
                    } else {
                        (win.pads[i] as i128, win.pads[i + n] as i128)
                    };
                    stride * (inp - 1) + out_pad[i] as i128 + ek - pb - pe
                }
            };
            let o = usize::try_from(o).map_err(|_| {
                cx.invalid(format_args!(
                    "the output extent along spatial axis {i} would be {o}; check pads and strides"
                ))
            })?;
            out.push(o);
        }
    }
    Ok(vec![cx.tt(x.dtype, out)?])
}

/// AveragePool, MaxPool, LpPool(X): `kernel_shape` required; MaxPool also gives
/// Indices (i64).
pub(super) fn pool(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let is_max = cx.op.kind == crate::op::OpKind::MaxPool;
    let class = if is_max { Class::Numeric } else { Class::Float };
    let x = cx.req_class(0, "X", class)?;
    if is_max && !(x.dtype.is_float() || matches!(x.dtype, DType::I8 | DType::U8)) {
        return Err(cx.invalid(format_args!("`X` (input 0) must be a float, int8 or uint8 tensor, got {x}")));
    }
    cx.min_rank(x, 0, "X", 3)?;
    let xd = x.shape.dims();
    let n = xd.len() - 2;
    let a = cx.attrs::<PoolAttrs>()?;
    if a.kernel_shape.is_none() {
        return Err(cx.invalid("required attribute `kernel_shape` is missing"));
    }
    let kernel = ints_n(cx, "kernel_shape", a.kernel_shape.as_deref(), n, 1, 1)?;
    let win = window(cx, n)?;
    let ceil = a.ceil_mode;
    let mut out = vec![xd[0], xd[1]];
    out.extend(window_out(cx, &xd[2..], &kernel, &win, ceil)?);
    let y = cx.tt(x.dtype, out)?;
    Ok(if is_max { vec![y.clone(), TensorType::new(DType::I64, y.shape)] } else { vec![y] })
}

/// GlobalAveragePool, GlobalMaxPool, GlobalLpPool: [N, C, D…] → [N, C, 1…].
pub(super) fn global_pool(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    cx.min_rank(x, 0, "X", 3)?;
    let d = x.shape.dims();
    let mut out = d[..2].to_vec();
    out.resize(d.len(), 1);
    Ok(vec![cx.tt(x.dtype, out)?])
}

/// Per-channel operands of a normalization: each 1-D of the channel count.
fn per_channel(cx: &Ctx, ops: &[(usize, &str)], c: usize, class: Class) -> R<()> {
    for &(i, what) in ops {
        let t = cx.req_class(i, what, class)?;
        cx.expect_dims(t, i, what, &[c])?;
    }
    Ok(())
}

/// The float input (operand 0, `what`, rank ≥ `min_rank` ≥ 2) of a normalization taking at most
/// `max_inputs` operands, and its channel count (axis 1).
fn channels_input<'b>(cx: &Ctx<'_, 'b>, max_inputs: usize, what: &str, min_rank: usize) -> R<(&'b TensorType, usize)> {
    cx.max_inputs(max_inputs)?;
    let x = cx.req_class(0, what, Class::Float)?;
    cx.min_rank(x, 0, what, min_rank)?;
    Ok((x, x.shape.dims()[1]))
}

/// The scale and bias operands `ops` of a normalization of `x` with `c` channels: each of
/// `x`'s dtype (checked for both first) and of shape `[c]`.
fn scale_and_bias(cx: &Ctx, x: &TensorType, c: usize, ops: [(usize, &str); 2]) -> R<()> {
    for (i, what) in ops {
        let t = cx.req(i, what)?;
        cx.same_dtype(t, i, what, x)?;
    }
    per_channel(cx, &ops, c, Class::Float)
}

/// BatchNormalization(X, scale, B, input_mean, input_var), inference form.
pub(super) fn batch_normalization(cx: &Ctx) -> R<Vec<TensorType>> {
    let (x, c) = channels_input(cx, 5, "X", 2)?;
    if cx.attrs::<BatchNormAttrs>()?.training_mode || cx.num_outputs > 1 {
        return Err(cx.unsupported(
            "training mode (outputs running_mean, running_var) is not supported; only the inference form is",
        ));
    }
    per_channel(cx, &[(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")], c, Class::Float)?;
    Ok(vec![x.clone()])
}

/// InstanceNormalization(input, scale, B).
pub(super) fn instance_normalization(cx: &Ctx) -> R<Vec<TensorType>> {
    let (x, c) = channels_input(cx, 3, "input", 3)?;
    scale_and_bias(cx, x, c, [(1, "scale"), (2, "B")])?;
    Ok(vec![x.clone()])
}

/// GroupNormalization(X, scale, bias): scale and bias per channel (opset 21 form).
pub(super) fn group_normalization(cx: &Ctx) -> R<Vec<TensorType>> {
    let (x, c) = channels_input(cx, 3, "X", 2)?;
    let g = cx.attrs::<GroupNormAttrs>()?.num_groups;
    if g < 1 || !(c as u64).is_multiple_of(g as u64) {
        return Err(cx.invalid(format_args!(
            "attribute `num_groups` = {g} must be ≥ 1 and divide the channel count {c} of {x}"
        )));
    }
    scale_and_bias(cx, x, c, [(1, "scale"), (2, "bias")])?;
    Ok(vec![x.clone()])
}

/// LayerNormalization(X, Scale, B?) → (Y, Mean?, InvStdDev?); Mean and InvStdDev
/// keep X's rank with the normalized axes (from `axis` on) as 1, dtype `stash_type`.
pub(super) fn layer_normalization(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let r = x.shape.rank();
    let a = cx.attrs::<LayerNormAttrs>()?;
    let axis = cx.axis(a.axis, r, "axis")?;
    let norm = &x.shape.dims()[axis..];
    for (i, what) in [(1, "Scale"), (2, "B")] {
        let t = if i == 1 { Some(cx.req(i, what)?) } else { cx.opt_ty(i) };
        if let Some(t) = t {
            cx.same_dtype(t, i, what, x)?;
            if broadcast_dims(norm, t.shape.dims()).as_deref() != Some(norm) {
                return Err(cx.invalid(format_args!(
                    "`{what}` (input {i}) {t} does not broadcast to the normalized shape {}",
                    Dims(norm)
                )));
            }
        }
    }
    let stash = a.stash_type;
    if !stash.is_float() {
        return Err(cx.invalid(format_args!("attribute `stash_type` must name a float dtype, got {stash}")));
    }
    let mut sd = x.shape.dims()[..axis].to_vec();
    sd.resize(r, 1);
    let stat = cx.tt(stash, sd)?;
    Ok(vec![x.clone(), stat.clone(), stat])
}

/// RMSNormalization(X, Scale) → Y: X's type; Scale broadcasts to the normalized shape
/// (the axes from `axis` on).
pub(super) fn rms_normalization(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let a = cx.attrs::<RmsNormAttrs>()?;
    let axis = cx.axis(a.axis, x.shape.rank(), "axis")?;
    let norm = &x.shape.dims()[axis..];
    let s = cx.req(1, "Scale")?;
    cx.same_dtype(s, 1, "Scale", x)?;
    if broadcast_dims(norm, s.shape.dims()).as_deref() != Some(norm) {
        return Err(
            cx.invalid(format_args!("`Scale` (input 1) {s} does not broadcast to the normalized shape {}", Dims(norm)))
        );
    }
    if !a.stash_type.is_float() {
        return Err(cx.invalid(format_args!("attribute `stash_type` must name a float dtype, got {}", a.stash_type)));
    }
    Ok(vec![x.clone()])
}

/// Attention(Q, K, V, attn_mask?, past_key?, past_value?, nonpad_kv_seqlen?) → (Y,
/// present_key?, present_value?, qk_matmul_output?) (see
/// [`AttentionDims`](crate::attrs::AttentionDims)): Y `[B, Hq, S, Dv]` (3-D: `[B, S,
/// Hq·Dv]`), the present keys and values `[B, Hkv, P + L, D | Dv]`, the scores `[B, Hq,
/// S, P + L]`. The mask is bool or Q's dtype and broadcasts to the scores but for its
/// last dimension, which may be shorter (the keys past it are masked).
pub(super) fn attention(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(7)?;
    let q = cx.req_class(0, "Q", Class::Float)?;
    let k = cx.req_same(1, "K", q)?;
    let v = cx.req_same(2, "V", q)?;
    let a = cx.attrs::<AttentionAttrs>()?;
    let (pk, pv) = (cx.opt_ty(4), cx.opt_ty(5));
    if pk.is_some() != pv.is_some() {
        return Err(cx.invalid("`past_key` (input 4) and `past_value` (input 5) must be given together"));
    }
    let past = match pk {
        Some(t) => {
            cx.same_dtype(t, 4, "past_key", q)?;
            cx.rank(t, 4, "past_key", 4)?;
            Some(t.shape.dims()[2])
        }
        None => None,
    };
    let d = a.dims(q.shape.dims(), k.shape.dims(), v.shape.dims(), past).map_err(|m| cx.invalid(m))?;
    let (t, h) = (d.keys(), d.kv_heads);
    if let (Some(pk), Some(pv)) = (pk, pv) {
        cx.expect_dims(pk, 4, "past_key", &[d.batch, h, d.past, d.head])?;
        cx.same_dtype(pv, 5, "past_value", q)?;
        cx.expect_dims(pv, 5, "past_value", &[d.batch, h, d.past, d.v_head])?;
    }
    if let Some(m) = cx.opt_ty(3) {
        if m.dtype != DType::Bool {
            cx.same_dtype(m, 3, "attn_mask", q)?;
        }
        let md = m.shape.dims();
        let scores = d.scores();
        let fits = md.len() <= 4
            && md.last().is_some_and(|&l| l <= t)
            && md.iter().rev().zip(scores.iter().rev()).skip(1).all(|(&x, &y)| x == 1 || x == y);
        if !fits {
            return Err(cx.invalid(format_args!(
                "`attn_mask` (input 3) {m} does not broadcast to the scores {}",
                Dims(&scores)
            )));
        }
    }
    if let Some(n) = cx.opt_ty(6) {
        if n.dtype != DType::I64 {
            return Err(cx.invalid(format_args!("`nonpad_kv_seqlen` (input 6) must be int64, got {n}")));
        }
        cx.expect_dims(n, 6, "nonpad_kv_seqlen", &[d.batch])?;
    }
    if let Some(p) = a.softmax_precision.filter(|p| !p.is_float()) {
        return Err(cx.invalid(format_args!("attribute `softmax_precision` must name a float dtype, got {p}")));
    }
    cx.outputs(vec![
        cx.tt(q.dtype, d.y())?,
        cx.tt(q.dtype, vec![d.batch, h, t, d.head])?,
        cx.tt(q.dtype, vec![d.batch, h, t, d.v_head])?,
        cx.tt(q.dtype, d.scores())?,
    ])
}

/// RotaryEmbedding(input, cos_cache, sin_cache, position_ids?) → input's type. The input
/// is `[B, H, S, D]`, or `[B, S, H·D]` with `num_heads`; the caches hold half the rotated
/// width R (`rotary_embedding_dim`, else D) per position: `[positions, R/2]` indexed by
/// `position_ids` `[B, S]`, or `[B, S, R/2]` without them; caches of D/2 values a
/// position serve any R (their first R/2 are read).
pub(super) fn rotary_embedding(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(4)?;
    let x = cx.req_class(0, "input", Class::Float)?;
    let a = cx.attrs::<RotaryEmbeddingAttrs>()?;
    let xd = x.shape.dims();
    let (b, s, head) = match *xd {
        [b, _, s, head] => (b, s, head),
        [b, s, hidden] => {
            if a.num_heads < 1 {
                return Err(cx.invalid("a 3-D `input` needs the attribute `num_heads`"));
            }
            let n = a.num_heads as usize;
            if hidden % n != 0 {
                return Err(cx.invalid(format_args!("`input` (input 0) {x} does not divide into {n} heads")));
            }
            (b, s, hidden / n)
        }
        _ => return Err(cx.invalid(format_args!("`input` (input 0) must be 3-D or 4-D, got {x}"))),
    };
    let r = if a.rotary_embedding_dim == 0 { head } else { a.rotary_embedding_dim as usize };
    if r > head || r % 2 != 0 {
        return Err(cx.invalid(format_args!(
            "attribute `rotary_embedding_dim` {r} must be even and at most the head size {head}"
        )));
    }
    let cos = cx.req_same(1, "cos_cache", x)?;
    let sin = cx.req_same(2, "sin_cache", x)?;
    let want_last = r / 2;
    match cx.opt_ty(3) {
        Some(p) => {
            if p.dtype != DType::I64 {
                return Err(cx.invalid(format_args!("`position_ids` (input 3) must be int64, got {p}")));
            }
            cx.expect_dims(p, 3, "position_ids", &[b, s])?;
            cx.rank(cos, 1, "cos_cache", 2)?;
        }
        None => cx.rank(cos, 1, "cos_cache", 3)?,
    }
    // Half the rotated width a position, or half the head's (of which the first R/2
    // are read).
    let cd = cos.shape.dims();
    let fits =
        cd.last().is_some_and(|&w| w == want_last || w == head / 2) && (cx.opt_ty(3).is_some() || cd[..2] == [b, s]);
    if !fits {
        return Err(cx.invalid(format_args!(
            "`cos_cache` (input 1) {cos} must be [positions, {want_last}] with `position_ids`, else [{b}, {s}, {want_last}] \
             (or {} values a position)",
            head / 2
        )));
    }
    cx.expect_dims(sin, 2, "sin_cache", cd)?;
    Ok(vec![x.clone()])
}

/// RNN (1 gate), GRU (3 gates), LSTM (4 gates): (X, W, R, B?, sequence_lens?,
/// initial_h?[, initial_c?, P?]) → (Y, Y_h[, Y_c]).
pub(super) fn recurrent(cx: &Ctx, gates: usize) -> R<Vec<TensorType>> {
    let lstm = gates == 4;
    cx.max_inputs(if lstm { 8 } else { 6 })?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let w = cx.req(1, "W")?;
    let r = cx.req(2, "R")?;
    cx.rank(x, 0, "X", 3)?;
    cx.same_dtype(w, 1, "W", x)?;
    cx.same_dtype(r, 2, "R", x)?;
    cx.rank(w, 1, "W", 3)?;
    cx.rank(r, 2, "R", 3)?;
    let a = cx.attrs::<RnnAttrs>()?;
    let nd = match a.direction {
        RnnDirection::Bidirectional => 2,
        RnnDirection::Forward | RnnDirection::Reverse => 1,
    };
    let batch_major = a.layout;
    let xd = x.shape.dims();
    let (seq, batch, input) = if batch_major { (xd[1], xd[0], xd[2]) } else { (xd[0], xd[1], xd[2]) };
    let hidden = match a.hidden_size {
        Some(h) => cx.count_attr(h, "hidden_size")?,
        None => r.shape.dims()[2],
    };
    let big = || cx.invalid("attribute `hidden_size` is too large");
    let gh = hidden.checked_mul(gates).ok_or_else(big)?;
    cx.expect_dims(w, 1, "W", &[nd, gh, input])?;
    cx.expect_dims(r, 2, "R", &[nd, gh, hidden])?;
    if let Some(b) = cx.opt_ty(3) {
        cx.same_dtype(b, 3, "B", x)?;
        cx.expect_dims(b, 3, "B", &[nd, gh.checked_mul(2).ok_or_else(big)?])?;
    }
    if let Some(s) = cx.opt_class(4, "sequence_lens", Class::Index)? {
        cx.expect_dims(s, 4, "sequence_lens", &[batch])?;
    }
    let state = if batch_major { vec![batch, nd, hidden] } else { vec![nd, batch, hidden] };
    let mut states = vec![(5, "initial_h")];
    if lstm {
        states.push((6, "initial_c"));
    }
    for (i, what) in states {
        if let Some(t) = cx.opt_ty(i) {
            cx.same_dtype(t, i, what, x)?;
            cx.expect_dims(t, i, what, &state)?;
        }
    }
    if lstm {
        if let Some(p) = cx.opt_ty(7) {
            cx.same_dtype(p, 7, "P", x)?;
            cx.expect_dims(p, 7, "P", &[nd, hidden.checked_mul(3).ok_or_else(big)?])?;
        }
    }
    let y = if batch_major { vec![batch, seq, nd, hidden] } else { vec![seq, nd, batch, hidden] };
    let mut outs = vec![cx.tt(x.dtype, y)?, cx.tt(x.dtype, state.clone())?];
    if lstm {
        outs.push(cx.tt(x.dtype, state)?);
    }
    Ok(outs)
}
