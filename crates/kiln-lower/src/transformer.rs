//! Opset 23's transformer ops.
//!
//! **Attention** becomes the kernels an exporter's own graph of the op lowers to, so
//! that fusion and the attention pass (`kiln_flow::attention`) treat both alike: K's
//! present keys transposed to `[B, Hkv, D, T]` (a movement dispatch, so the score
//! product reads its keys at unit stride), the scores `scale·Q·Kᵀ` with the softcap and
//! the mask terms (a loaded float mask, a bool mask as `0 / −∞`, the causal triangle,
//! the padded keys) added, a Softmax over the keys (the Softmax op's own lowering) and
//! the product with V. With grouped heads (Hq = G·Hkv) the head axis is split into
//! `[Hkv, G]`, so every operand stays an affine read (query head `g·G + r` reads K/V
//! head `g`); the results are the same bytes as `[B, Hq, …]`. A 3-D Q, K or V is read
//! through its index (`[b, s, h·D + e]`), and Y of a 3-D Q is written as `[B, S, Hq, Dv]`,
//! which is `[B, S, Hq·Dv]`. The present keys and values (cache then new) are a copy each
//! where there is a cache or the input is 3-D, else K and V themselves. The scores
//! output (`qk_matmul_output`) is a kernel of its own for the stage its mode names, or
//! the softmax's result. Scores of a half-precision op are kept in f32.
//!
//! **RotaryEmbedding** is one elementwise kernel: each element of the rotated width
//! reads its pair partner and the cosine and sine of its position (gathered through
//! `position_ids`, clamped into the caches).

use kiln_flow::kernel::{BinaryOp as B, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType as S, UnaryOp as U};
use kiln_ir::attrs::{AttentionAttrs, AttentionDims, RotaryEmbeddingAttrs};
use kiln_ir::{DType, Op, OpKind, Shape, TensorType};

use crate::{compute, store, LowerError, Lowered, OpCx, OpInput, Operand, Output, Step};

type R<T> = Result<T, LowerError>;

pub(super) fn lower(cx: &OpCx<'_>) -> Option<R<Lowered>> {
    match cx.op.kind {
        OpKind::Attention => Some(attention(cx)),
        OpKind::RotaryEmbedding => Some(rotary_embedding(cx)),
        _ => None,
    }
}

/// A tensor type of `dims`.
fn ty(cx: &OpCx<'_>, dtype: DType, dims: Vec<usize>) -> R<TensorType> {
    Ok(TensorType::new(dtype, Shape::new(dims).map_err(|e| cx.unsupported(e.to_string()))?))
}

/// `e·k + c` on indices.
fn lin(b: &mut KernelBuilder, e: ExprId, k: usize, c: ExprId) -> ExprId {
    let k = b.index(k as i64);
    let m = b.mul(e, k);
    b.add(m, c)
}

/// Adds a step computing `body(builder, output index)` (stored in the output dtype)
/// over the given inputs; its index. The index reads 0 on axes of extent 1.
fn step(
    cx: &OpCx<'_>,
    steps: &mut Vec<Step>,
    suffix: &str,
    inputs: &[(Operand, TensorType)],
    out: TensorType,
    body: impl FnOnce(&mut KernelBuilder, &[ExprId]) -> R<ExprId>,
) -> R<usize> {
    let ones: Vec<bool> = out.shape.dims().iter().map(|&d| d == 1).collect();
    let mut b = KernelBuilder::new(format!("{}_{suffix}", cx.name), inputs.iter().map(|i| i.1.clone()).collect(), out);
    // An axis of extent 1 is read at index 0, as the other lowerings (the Softmax's
    // among them) read it: the copies of the scores then match wherever they are.
    let mut idx = b.out_index();
    for (i, one) in ones.into_iter().enumerate() {
        if one {
            idx[i] = b.index(0);
        }
    }
    let v = body(&mut b, &idx)?;
    let root = store(&mut b, v);
    steps.push(Step { kernel: b.finish(root)?, operands: inputs.iter().map(|i| i.0).collect() });
    Ok(steps.len() - 1)
}

/// How the attention kernels read Q, K and V (see the module docs).
struct Geometry {
    d: AttentionDims,
    /// Query heads per K/V head.
    group: usize,
}

impl Geometry {
    /// The head axes of the scores and of Y: `[Hkv, G]` with grouped heads, else `[H]`.
    fn heads(&self) -> Vec<usize> {
        if self.group > 1 {
            vec![self.d.kv_heads, self.group]
        } else {
            vec![self.d.q_heads]
        }
    }

    /// (query head, K/V head) of the head index expressions `h` (one or two, as
    /// [`Geometry::heads`]).
    fn head_of(&self, b: &mut KernelBuilder, h: &[ExprId]) -> (ExprId, ExprId) {
        match *h {
            [g, r] => (lin(b, g, self.group, r), g),
            [h] => (h, h),
            _ => unreachable!("one or two head axes"),
        }
    }

    /// The index of element `e` of head `h` at sequence position `s` of a Q, K or V
    /// operand with `heads` heads of width `w` (3-D or 4-D).
    fn at(&self, b: &mut KernelBuilder, bi: ExprId, h: ExprId, s: ExprId, e: ExprId, w: usize) -> Vec<ExprId> {
        if self.d.packed {
            vec![bi, s, lin(b, h, w, e)]
        } else {
            vec![bi, h, s, e]
        }
    }
}

/// The present keys (or values) at `[b, g, t, e]`: the cache (input `cache`) before
/// `past`, the new ones (input `new`) after it. Loads are in bounds: each index is
/// clamped into its operand, the select picks the one meant.
#[allow(clippy::too_many_arguments)]
fn present_at(
    b: &mut KernelBuilder,
    geo: &Geometry,
    new: usize,
    cache: Option<usize>,
    [bi, g, t, e]: [ExprId; 4],
    w: usize,
    ct: S,
) -> ExprId {
    let p = geo.d.past;
    let Some(cache) = cache.filter(|_| p > 0) else {
        let ix = geo.at(b, bi, g, t, e, w);
        let x = b.load(new, ix);
        return b.convert(x, ct);
    };
    let last = b.index(p as i64 - 1);
    let tc = b.binary(B::Min, t, last);
    let old = b.load(cache, vec![bi, g, tc, e]);
    let old = b.convert(old, ct);
    let pc = b.index(p as i64);
    let zero = b.index(0);
    let tn = b.sub(t, pc);
    let tn = b.binary(B::Max, tn, zero);
    let ix = geo.at(b, bi, g, tn, e, w);
    let fresh = b.load(new, ix);
    let fresh = b.convert(fresh, ct);
    let is_old = b.binary(B::Lt, t, pc);
    b.select(is_old, old, fresh)
}

/// The stages of the scores (`qk_matmul_output_mode`'s numbering, 4 the softmax input).
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Stage {
    Product,
    Masked,
    Capped,
}

fn attention(cx: &OpCx<'_>) -> R<Lowered> {
    let a = cx.attrs::<AttentionAttrs>()?;
    let (qt, kt, vt) = (cx.input_ty(0)?, cx.input_ty(1)?, cx.input_ty(2)?);
    let has = |i: usize| cx.input(i).is_some();
    let past = cx.input(4).map(|p| p.ty.shape.dims().get(2).copied().unwrap_or(0));
    if has(4) != has(5) {
        return Err(cx.unsupported("past_key and past_value must be given together"));
    }
    let d = a.dims(qt.shape.dims(), kt.shape.dims(), vt.shape.dims(), past).map_err(|m| cx.unsupported(m))?;
    if [d.batch, d.q_heads, d.queries, d.keys(), d.head, d.v_head].contains(&0) {
        return Err(cx.unsupported("an empty dimension"));
    }
    let geo = Geometry { d, group: d.q_heads / d.kv_heads };
    let dt = qt.dtype;
    let ct = compute(dt);
    // Scores of a half-precision op are stored in f32.
    let st = if matches!(dt, DType::F16 | DType::BF16) { DType::F32 } else { dt };
    let (t, p, dh, dv, hk) = (d.keys(), d.past, d.head, d.v_head, d.kv_heads);
    let cache = |i: usize| has(i).then_some(i);
    let input = |i: usize| -> R<(Operand, TensorType)> { Ok((Operand::Input(i), cx.input_ty(i)?.clone())) };
    let mut steps: Vec<Step> = Vec::new();

    // The present keys and values, where they are not K and V themselves.
    let copied = p > 0 || d.packed;
    let mut present = [None, None];
    for (slot, (new, old, w)) in [(1usize, 4usize, dh), (2, 5, dv)].into_iter().enumerate() {
        let wanted = cx.outputs.len() > slot + 1 || (slot == 1 && p > 0);
        if copied && wanted {
            let mut ins = vec![input(new)?];
            if let Some(c) = cache(old) {
                ins.push(input(c)?);
            }
            let geo = &geo;
            let s = step(cx, &mut steps, ["pk", "pv"][slot], &ins, ty(cx, dt, vec![d.batch, hk, t, w])?, |b, o| {
                let c = (ins.len() > 1).then_some(1);
                Ok(present_at(b, geo, 0, c, [o[0], o[1], o[2], o[3]], w, ct))
            })?;
            present[slot] = Some(s);
        }
    }

    // Kᵀ: [B, Hkv, D, T].
    let kt_step = {
        let mut ins = vec![input(1)?];
        if let Some(c) = cache(4) {
            ins.push(input(c)?);
        }
        let geo = &geo;
        step(cx, &mut steps, "kt", &ins, ty(cx, dt, vec![d.batch, hk, dh, t])?, |b, o| {
            let c = (ins.len() > 1).then_some(1);
            Ok(present_at(b, geo, 0, c, [o[0], o[1], o[3], o[2]], dh, ct))
        })?
    };

    // The scores [B, heads.., S, T] up to a stage.
    let heads = geo.heads();
    let nh = heads.len();
    let mut sdims = vec![d.batch];
    sdims.extend(&heads);
    sdims.extend([d.queries, t]);
    let scores_ty = ty(cx, st, sdims.clone())?;
    let mask = cx.input(3).map(|m| m.ty.clone());
    let nonpad = cx.input(6).map(|n| n.ty.clone());
    if nonpad.as_ref().is_some_and(|n| n.dtype != DType::I64) {
        return Err(cx.unsupported("nonpad_kv_seqlen must be int64"));
    }
    let scale = a.scale_for(dh);
    let cap = a.softcap as f64;
    let causal = a.is_causal;
    let kt_ty = steps[kt_step].kernel.output.clone();
    let scores = |steps: &mut Vec<Step>, upto: Stage, suffix: &str| -> R<usize> {
        let mut ins = vec![input(0)?, (Operand::Step(kt_step), kt_ty.clone())];
        let mask_slot = mask.as_ref().map(|m| {
            ins.push((Operand::Input(3), m.clone()));
            ins.len() - 1
        });
        let nonpad_slot = nonpad.as_ref().map(|n| {
            ins.push((Operand::Input(6), n.clone()));
            ins.len() - 1
        });
        let (geo, mask) = (&geo, &mask);
        step(cx, steps, suffix, &ins, ty(cx, st, sdims.clone())?, |b, o| {
            let (bi, i, j) = (o[0], o[nh + 1], o[nh + 2]);
            let (qh, g) = geo.head_of(b, &o[1..=nh]);
            let e = b.new_var(dh as u64);
            let ev = b.var(e);
            let qi = geo.at(b, bi, qh, i, ev, dh);
            let x = b.load(0, qi);
            let x = b.convert(x, ct);
            let y = b.load(1, vec![bi, g, ev, j]);
            let y = b.convert(y, ct);
            let m = b.mul(x, y);
            let dot = b.reduce(ReduceOp::Sum, vec![e], m);
            let sc = b.float(ct, scale);
            let mut s = b.mul(dot, sc);
            if upto == Stage::Product {
                return Ok(s);
            }
            // The mask terms, summed.
            let ninf = b.float(ct, f64::NEG_INFINITY);
            let zero = b.float(ct, 0.0);
            let mut terms: Vec<ExprId> = Vec::new();
            if let (Some(slot), Some(mt)) = (mask_slot, mask.as_ref()) {
                let md = mt.shape.dims();
                let full = [bi, qh, i, j];
                let skip = 4 - md.len();
                let lm = *md.last().unwrap_or(&1);
                let mut ix: Vec<ExprId> = Vec::with_capacity(md.len());
                for (axis, &n) in md.iter().enumerate() {
                    ix.push(if n == 1 { b.index(0) } else { full[skip + axis] });
                }
                // Keys past the mask's last dimension are masked.
                let short = lm < t;
                if short {
                    let last = b.index(lm as i64 - 1);
                    let jl = ix.len() - 1;
                    ix[jl] = b.binary(B::Min, j, last);
                }
                let v = b.load(slot, ix);
                let mut term = if mt.dtype == DType::Bool { b.select(v, zero, ninf) } else { b.convert(v, ct) };
                if short {
                    let end = b.index(lm as i64);
                    let inside = b.binary(B::Lt, j, end);
                    term = b.select(inside, term, ninf);
                }
                terms.push(term);
            }
            if causal {
                let pi = b.index(p as i64);
                let lim = b.add(i, pi);
                let after = b.binary(B::Gt, j, lim);
                terms.push(b.select(after, ninf, zero));
            }
            if let Some(slot) = nonpad_slot {
                let n = b.load(slot, vec![bi]);
                let n = b.convert(n, S::I64);
                let jl = b.convert(j, S::I64);
                let inside = b.binary(B::Lt, jl, n);
                terms.push(b.select(inside, zero, ninf));
            }
            if let Some(first) = terms.first().copied() {
                let sum = terms[1..].iter().fold(first, |acc, &t| b.add(acc, t));
                s = b.add(s, sum);
            }
            if upto == Stage::Masked || cap <= 0.0 {
                return Ok(s);
            }
            let c = b.float(ct, cap);
            let r = b.div(s, c);
            let th = b.unary(U::Tanh, r);
            Ok(b.mul(th, c))
        })
    };
    let s_step = scores(&mut steps, Stage::Capped, "s")?;

    // The softmax over the keys: the Softmax op's lowering, reading the scores.
    let softmax = Op::new(OpKind::Softmax);
    let name = format!("{}_sm", cx.name);
    let sm_in = [Some(OpInput { ty: &scores_ty, value: None })];
    let sm_out = [scores_ty.clone()];
    let sub = OpCx { op: &softmax, name: &name, inputs: &sm_in, outputs: &sm_out };
    let sm = crate::lower_op(&sub)?;
    let base = steps.len();
    for s in sm.steps {
        let operands = s
            .operands
            .iter()
            .map(|&o| match o {
                Operand::Input(_) => Operand::Step(s_step),
                Operand::Step(k) => Operand::Step(base + k),
            })
            .collect();
        steps.push(Step { kernel: s.kernel, operands });
    }
    let probs = match sm.outputs.first() {
        Some(Output::Step(k)) => base + k,
        _ => return Err(cx.unsupported("the softmax of the scores is not a kernel")),
    };

    // Y = P·V: [B, heads.., S, Dv], or [B, S, heads.., Dv] for a 3-D Q.
    let mut ydims = vec![d.batch];
    if d.packed {
        ydims.push(d.queries);
        ydims.extend(&heads);
    } else {
        ydims.extend(&heads);
        ydims.push(d.queries);
    }
    ydims.push(dv);
    let v_in = match present[1] {
        Some(s) if p > 0 => (Operand::Step(s), steps[s].kernel.output.clone()),
        _ => input(2)?,
    };
    let v_4d = p > 0 || !d.packed;
    let ins = [(Operand::Step(probs), scores_ty.clone()), v_in];
    let geo_ref = &geo;
    let y = step(cx, &mut steps, "y", &ins, ty(cx, dt, ydims)?, |b, o| {
        let (bi, hs, i, c) =
            if d.packed { (o[0], &o[2..2 + nh], o[1], o[2 + nh]) } else { (o[0], &o[1..1 + nh], o[1 + nh], o[2 + nh]) };
        let (_, g) = geo_ref.head_of(b, hs);
        let j = b.new_var(t as u64);
        let jv = b.var(j);
        let mut pi = vec![bi];
        pi.extend_from_slice(hs);
        pi.extend([i, jv]);
        let pr = b.load(0, pi);
        let pr = b.convert(pr, ct);
        let vi = if v_4d { vec![bi, g, jv, c] } else { geo_ref.at(b, bi, g, jv, c, dv) };
        let v = b.load(1, vi);
        let v = b.convert(v, ct);
        let m = b.mul(pr, v);
        Ok(b.reduce(ReduceOp::Sum, vec![j], m))
    })?;

    let mut outputs = vec![Output::Step(y)];
    for slot in 1..cx.outputs.len().min(3) {
        outputs.push(match present[slot - 1] {
            Some(s) => Output::Step(s),
            None => Output::Alias(slot),
        });
    }
    if cx.outputs.len() > 3 {
        let o = match a.qk_matmul_output_mode {
            0 => scores(&mut steps, Stage::Product, "qk")?,
            1 => scores(&mut steps, Stage::Masked, "qk")?,
            2 => s_step,
            _ => probs,
        };
        // A half-precision op's scores are f32 here: the result is their rounding.
        let o = if st != dt {
            let from = steps[o].kernel.output.clone();
            let out = ty(cx, dt, sdims.clone())?;
            step(cx, &mut steps, "qk_out", &[(Operand::Step(o), from)], out, |b, ix| {
                let x = b.load(0, ix.to_vec());
                Ok(b.convert(x, ct))
            })?
        } else {
            o
        };
        outputs.push(Output::Step(o));
    }
    Ok(Lowered { steps, outputs })
}

fn rotary_embedding(cx: &OpCx<'_>) -> R<Lowered> {
    let a = cx.attrs::<RotaryEmbeddingAttrs>()?;
    let xt = cx.input_ty(0)?;
    let xd = xt.shape.dims().to_vec();
    // The result as [B, H, S, D], or [B, S, H, D] for a 3-D input (the same bytes).
    let (odims, packed) = match xd[..] {
        [_, _, _, _] => (xd.clone(), false),
        [bn, s, w] if a.num_heads > 0 && w % a.num_heads as usize == 0 => {
            let h = a.num_heads as usize;
            (vec![bn, s, h, w / h], true)
        }
        _ => return Err(cx.unsupported(format!("input {xt} is neither [B, H, S, D] nor [B, S, H·D] with num_heads"))),
    };
    let dh = odims[3];
    let r = if a.rotary_embedding_dim == 0 { dh } else { a.rotary_embedding_dim as usize };
    if r > dh || r % 2 != 0 || r == 0 {
        return Err(cx.unsupported(format!("rotary_embedding_dim {r} for head size {dh}")));
    }
    if odims.contains(&0) {
        return Err(cx.unsupported("an empty dimension"));
    }
    let half = r / 2;
    let ct = compute(xt.dtype);
    let ids = cx.input(3).map(|p| p.ty.clone());
    let rows = cx.input_ty(1)?.shape.dims().first().copied().unwrap_or(0);
    let mut ins = vec![(Operand::Input(0), xt.clone()), (Operand::Input(1), cx.input_ty(1)?.clone())];
    ins.push((Operand::Input(2), cx.input_ty(2)?.clone()));
    if let Some(p) = &ids {
        ins.push((Operand::Input(3), p.clone()));
    }
    let interleaved = a.interleaved;
    let mut steps = Vec::new();
    let out = ty(cx, xt.dtype, odims.clone())?;
    step(cx, &mut steps, "rot", &ins, out, |b, o| {
        let (bi, h, s, e) = if packed { (o[0], o[2], o[1], o[3]) } else { (o[0], o[1], o[2], o[3]) };
        let at = |b: &mut KernelBuilder, e: ExprId| -> Vec<ExprId> {
            if packed {
                let w = b.index(dh as i64);
                let hw = b.mul(h, w);
                vec![bi, s, b.add(hw, e)]
            } else {
                vec![bi, h, s, e]
            }
        };
        let two = b.index(2);
        let hc = b.index(half as i64);
        // The pair: its first and second element and the frequency k.
        let (k, first, e1, e2) = if interleaved {
            let k = b.binary(B::Div, e, two);
            let top = b.index(half as i64 - 1);
            let k = b.binary(B::Min, k, top);
            let par = b.binary(B::Rem, e, two);
            let z = b.index(0);
            let first = b.binary(B::Eq, par, z);
            let e1 = b.mul(k, two);
            let one = b.index(1);
            let e2 = b.add(e1, one);
            (k, first, e1, e2)
        } else {
            let k = b.binary(B::Rem, e, hc);
            let first = b.binary(B::Lt, e, hc);
            let e2 = b.add(k, hc);
            (k, first, k, e2)
        };
        let i1 = at(b, e1);
        let x1 = b.load(0, i1);
        let x1 = b.convert(x1, ct);
        let i2 = at(b, e2);
        let x2 = b.load(0, i2);
        let x2 = b.convert(x2, ct);
        let row = match &ids {
            Some(_) => {
                let pid = b.load(3, vec![bi, s]);
                let pid = b.convert(pid, S::I64);
                let z = b.int(S::I64, 0);
                let top = b.int(S::I64, rows as i64 - 1);
                let pid = b.binary(B::Max, pid, z);
                let pid = b.binary(B::Min, pid, top);
                vec![pid, k]
            }
            None => vec![bi, s, k],
        };
        let c = b.load_with(1, row.clone(), Bounds::Clamp);
        let c = b.convert(c, ct);
        let sn = b.load_with(2, row, Bounds::Clamp);
        let sn = b.convert(sn, ct);
        let a1 = b.mul(x1, c);
        let a2 = b.mul(x2, sn);
        let re = b.sub(a1, a2);
        let b1 = b.mul(x2, c);
        let b2 = b.mul(x1, sn);
        let im = b.add(b1, b2);
        let rot = b.select(first, re, im);
        let ix = at(b, e);
        let x = b.load(0, ix);
        let x = b.convert(x, ct);
        let rc = b.index(r as i64);
        let inside = b.binary(B::Lt, e, rc);
        Ok(b.select(inside, rot, x))
    })?;
    Ok(Lowered { steps, outputs: vec![Output::Step(0)] })
}
