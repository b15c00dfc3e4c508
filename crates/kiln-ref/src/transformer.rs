//! Opset 23's transformer ops: Attention and RotaryEmbedding, evaluated in f64 from
//! their definitions (one loop nest each, no decomposition into other ops).

use crate::elementwise::{read_f64, read_i64, write_f64};
use crate::util::Cx;
use crate::EvalError;
use kiln_ir::attrs::{AttentionAttrs, RotaryEmbeddingAttrs};
use kiln_ir::{DType, OpKind, Tensor};

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    match cx.kind() {
        OpKind::Attention => attention(cx),
        OpKind::RotaryEmbedding => Ok(vec![rotary_embedding(cx)?]),
        k => Err(cx.unsupported(format!("{k} is not a transformer op"))),
    }
}

/// Attention: per batch `b`, query head `h` (reading K/V head `h / (Hq/Hkv)`), query
/// `i` and key `j` of the cached-then-new keys,
///
/// ```text
/// s    = scale·Σ_e Q[b,h,i,e]·K[b,g,j,e]   (softcap c > 0: c·tanh(s/c))
///        + mask[b,h,i,j]                    (float: added; bool: 0 where true, −∞ where false;
///                                            keys past the mask's last dimension: −∞)
///        − ∞ where causal and j > i + past   (past: the cached keys)
///        − ∞ where j ≥ nonpad_kv_seqlen[b]
/// Y    = Σ_j softmax_j(s)·V[b,g,j,d]
/// ```
///
/// The fourth result is the scores after the product (mode 0), the mask (1), the
/// softcap (2) or the softmax (3). A row whose every key is masked gives NaN, as the
/// softmax of −∞ does.
fn attention(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    let a = cx.attrs::<AttentionAttrs>()?;
    let (q, k, v) = (cx.float_input(0)?, cx.float_input(1)?, cx.float_input(2)?);
    let (past_k, past_v) = (cx.opt_input(4), cx.opt_input(5));
    let past = match (past_k, past_v) {
        (Some(p), Some(_)) if p.shape().rank() == 4 => Some(p.shape().dims()[2]),
        (None, None) => None,
        _ => return Err(cx.invalid("past_key and past_value must be given together, 4-D")),
    };
    let d = a.dims(q.shape().dims(), k.shape().dims(), v.shape().dims(), past).map_err(|m| cx.invalid(m))?;
    let (bn, hq, hk, sq, lk, p, dh, dv) =
        (d.batch, d.q_heads, d.kv_heads, d.queries, d.new_keys, d.past, d.head, d.v_head);
    let t = d.keys();
    let group = hq / hk;
    // Q as [B, Hq, S, D] and K, V as [B, Hkv, L, ·], whichever layout they come in.
    let (qv, kv, vv) = (read_f64(cx, q)?, read_f64(cx, k)?, read_f64(cx, v)?);
    let at = |b: usize, h: usize, s: usize, e: usize, heads: usize, seq: usize, w: usize| {
        if d.packed {
            (b * seq + s) * heads * w + h * w + e
        } else {
            ((b * heads + h) * seq + s) * w + e
        }
    };
    // The present keys and values: the cache, then the new ones.
    let present = |new: &[f64], cache: Option<&Tensor>, w: usize| -> Result<Vec<f64>, EvalError> {
        let cache = match cache {
            Some(c) => read_f64(cx, c)?,
            None => Vec::new(),
        };
        let mut out = vec![0.0; bn * hk * t * w];
        for b in 0..bn {
            for g in 0..hk {
                for j in 0..t {
                    for e in 0..w {
                        out[((b * hk + g) * t + j) * w + e] = if j < p {
                            cache[((b * hk + g) * p + j) * w + e]
                        } else {
                            new[at(b, g, j - p, e, hk, lk, w)]
                        };
                    }
                }
            }
        }
        Ok(out)
    };
    let pk = present(&kv, past_k, dh)?;
    let pv = present(&vv, past_v, dv)?;
    // The additive mask at [b, h, i, j].
    let mask = match cx.opt_input(3) {
        Some(m) => {
            let md = m.shape().dims().to_vec();
            if md.len() > 4 || md.last().is_none_or(|&l| l > t) {
                return Err(cx.invalid(format!("attn_mask {} does not fit the scores", m.ty())));
            }
            let vals = read_f64(cx, m)?;
            Some((md, vals, m.dtype() == DType::Bool))
        }
        None => None,
    };
    let mask_at = |b: usize, h: usize, i: usize, j: usize| -> f64 {
        let Some((md, vals, boolean)) = &mask else { return 0.0 };
        let full = [b, h, i, j];
        let skip = 4 - md.len();
        if j >= *md.last().unwrap_or(&0) {
            return f64::NEG_INFINITY;
        }
        let mut flat = 0;
        for (axis, &n) in md.iter().enumerate() {
            let x = if n == 1 { 0 } else { full[skip + axis] };
            flat = flat * n + x;
        }
        match (*boolean, vals[flat]) {
            (true, x) if x != 0.0 => 0.0,
            (true, _) => f64::NEG_INFINITY,
            (false, x) => x,
        }
    };
    let nonpad = match cx.opt_input(6) {
        Some(n) => {
            let n = read_i64(cx, n)?;
            if n.len() != bn {
                return Err(cx.invalid(format!("nonpad_kv_seqlen holds {} lengths for batch {bn}", n.len())));
            }
            Some(n)
        }
        None => None,
    };
    let scale = a.scale_for(dh);
    let cap = a.softcap as f64;
    let mode = a.qk_matmul_output_mode;
    let mut y = vec![0.0; bn * hq * sq * dv];
    let mut qk_out = vec![0.0; bn * hq * sq * t];
    let mut s = vec![0.0; t];
    for b in 0..bn {
        for h in 0..hq {
            let g = h / group;
            for i in 0..sq {
                for (j, sj) in s.iter_mut().enumerate() {
                    let mut dot = 0.0;
                    for e in 0..dh {
                        dot += qv[at(b, h, i, e, hq, sq, dh)] * pk[((b * hk + g) * t + j) * dh + e];
                    }
                    let x = dot * scale;
                    let row = ((b * hq + h) * sq + i) * t + j;
                    if mode == 0 {
                        qk_out[row] = x;
                    }
                    let mut x = x + mask_at(b, h, i, j);
                    if a.is_causal && j > i + p {
                        x = f64::NEG_INFINITY;
                    }
                    if nonpad.as_ref().is_some_and(|n| (j as i64) >= n[b]) {
                        x = f64::NEG_INFINITY;
                    }
                    if mode == 1 {
                        qk_out[row] = x;
                    }
                    if cap > 0.0 {
                        x = cap * (x / cap).tanh();
                    }
                    if mode == 2 {
                        qk_out[row] = x;
                    }
                    *sj = x;
                }
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let sum: f64 = s.iter().map(|&x| (x - max).exp()).sum();
                for (j, sj) in s.iter_mut().enumerate() {
                    *sj = (*sj - max).exp() / sum;
                    if mode == 3 {
                        qk_out[((b * hq + h) * sq + i) * t + j] = *sj;
                    }
                }
                for c in 0..dv {
                    let acc: f64 = (0..t).map(|j| s[j] * pv[((b * hk + g) * t + j) * dv + c]).sum();
                    y[at(b, h, i, c, hq, sq, dv)] = acc;
                }
            }
        }
    }
    let mut out = vec![write_f64(cx, cx.out_type(0)?, &y)?];
    let rest = [pk, pv, qk_out];
    for (r, vals) in rest.iter().enumerate().take(cx.out_types.len().saturating_sub(1)) {
        out.push(write_f64(cx, cx.out_type(r + 1)?, vals)?);
    }
    Ok(out)
}

/// RotaryEmbedding: per batch `b`, head `h`, position `s` of the input and pair `k <
/// R/2` of the rotated width R (`rotary_embedding_dim`, else the head size), the pair
/// `(x₁, x₂)` — elements `(2k, 2k+1)` when interleaved, else `(k, k + R/2)` — becomes
/// `(x₁·cos − x₂·sin, x₂·cos + x₁·sin)` with `cos = cos_cache[position_ids[b, s], k]`
/// (`cos_cache[b, s, k]` without position ids), likewise `sin`; elements past R pass
/// through.
fn rotary_embedding(cx: &Cx) -> Result<Tensor, EvalError> {
    let a = cx.attrs::<RotaryEmbeddingAttrs>()?;
    let x = cx.float_input(0)?;
    let xd = x.shape().dims().to_vec();
    let (bn, heads, sn, dh) = match xd[..] {
        [b, h, s, d] => (b, h, s, d),
        [b, s, w] if a.num_heads > 0 && w % a.num_heads as usize == 0 => {
            (b, a.num_heads as usize, s, w / a.num_heads as usize)
        }
        _ => return Err(cx.invalid(format!("input {} is neither [B, H, S, D] nor [B, S, H·D] with num_heads", x.ty()))),
    };
    let r = if a.rotary_embedding_dim == 0 { dh } else { a.rotary_embedding_dim as usize };
    if r > dh || r % 2 != 0 {
        return Err(cx.invalid(format!("rotary_embedding_dim {r} must be even and at most the head size {dh}")));
    }
    let half = r / 2;
    let (cos_t, sin_t) = (cx.float_input(1)?, cx.float_input(2)?);
    let width = *cos_t.shape().dims().last().unwrap_or(&0);
    if width < half || sin_t.shape().dims() != cos_t.shape().dims() {
        return Err(cx.invalid(format!(
            "caches {} and {} hold fewer than {half} values a position",
            cos_t.ty(),
            sin_t.ty()
        )));
    }
    let (cos, sin) = (read_f64(cx, cos_t)?, read_f64(cx, sin_t)?);
    // The cache row of (b, s).
    let rows = cos.len() / width.max(1);
    let positions = match cx.opt_input(3) {
        Some(p) => {
            let ids = read_i64(cx, p)?;
            if ids.len() != bn * sn {
                return Err(cx.invalid(format!("position_ids {} is not [{bn}, {sn}]", p.ty())));
            }
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                match usize::try_from(id) {
                    Ok(i) if i < rows => out.push(i),
                    _ => return Err(cx.invalid(format!("position id {id} is outside the caches' {rows} positions"))),
                }
            }
            out
        }
        None if rows == bn * sn => (0..rows).collect(),
        None => return Err(cx.invalid(format!("caches {} are not [{bn}, {sn}, ·]", cos_t.ty()))),
    };
    let xv = read_f64(cx, x)?;
    let at = |b: usize, h: usize, s: usize, e: usize| {
        if xd.len() == 4 {
            ((b * heads + h) * sn + s) * dh + e
        } else {
            (b * sn + s) * heads * dh + h * dh + e
        }
    };
    let mut y = xv.clone();
    for b in 0..bn {
        for s in 0..sn {
            let row = positions[b * sn + s] * width;
            for h in 0..heads {
                for k in 0..half {
                    let (e1, e2) = if a.interleaved { (2 * k, 2 * k + 1) } else { (k, k + half) };
                    let (x1, x2) = (xv[at(b, h, s, e1)], xv[at(b, h, s, e2)]);
                    let (c, sn_) = (cos[row + k], sin[row + k]);
                    y[at(b, h, s, e1)] = x1 * c - x2 * sn_;
                    y[at(b, h, s, e2)] = x2 * c + x1 * sn_;
                }
            }
        }
    }
    write_f64(cx, cx.out_type(0)?, &y)
}
