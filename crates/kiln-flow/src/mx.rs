//! Block-scaled (MX) weights dequantised in the contraction's load.
//!
//! An MX weight stores narrow float elements (`f4E2M1FN`, `f6E3M2FN`, `f8E4M3FN`) and one
//! scale per block of elements along the reduction (`f8E8M0FNU` powers of two, or any
//! float): ONNX's blocked `DequantizeLinear(w, scale, axis = 0, block_size = B)` before a
//! `MatMul`. [`crate::dequant`] takes weights whose scale is constant along the
//! reduction; a block scale is not, so this pass splits the reduction at the blocks
//! instead:
//!
//! ```text
//! P:  Wf[k, n]   = E(k, n) · S(k, n)                (elementwise, over constants only;
//!                                                    S constant on blocks of B rows)
//! D:  out[·]     = epi( Σ_k A[m, k] · Wf[k, n] )
//! ⇒
//! D1: part[b, ·] = Σ_j A[m, b·B + j] · f32(W[b·B + j, n])       (a contraction)
//! D2: out[·]     = epi( Σ_b part[b, ·] · S'[b, n] )
//! ```
//!
//! `W = E · 2^p` as integers — `i8` or `i16`, `p` the smallest power that makes every
//! element integral (1 for `f4E2M1FN`, whose values are halves up to 6; 4 for
//! `f6E3M2FN`) — and `S' = S · 2^-p`, one per block and column. `D1` is an ordinary
//! contraction whose right operand is an integer converted in its load
//! ([`crate::contraction::INT_OPERANDS`]: the same load the per-column form uses, so the
//! microkernels and every target that reads [`Contraction`]s take it as it is), with
//! the block as a batch variable; `D2` sums the blocks' partial products with their
//! scales and applies the epilogue. The f32 weight is never written: the arena holds
//! `part` (blocks × output elements) instead, and the pass only applies where that is
//! no larger than the f32 weight would be (few rows: a decoder's one token).
//!
//! **What is matched.** `D` is a [`Contraction`] with one reduction variable `k` whose
//! right operand is a 2-D f32 input `[K, N]` read at `[k, e]` (`e` free of `k`) and
//! produced by `P`, its only reader, which reads constants only and whose root is `E · S`
//! (either order, optionally computed in f64 and rounded to f32), `E` the side that
//! reads a low-precision float input. `E`, `S` and `P`'s value are evaluated at compile
//! time with the kernel interpreter; the block size `B` is the largest of `K`, 256, 128,
//! 64, 32, 16 and 8 that divides `K` and over whose blocks every `S` is constant (so a
//! `K` that is not a multiple of the format's block, with its short last block, is left
//! to the general path); every `E · 2^p` must fit i16, `S'` must be exact in f32, and
//! `f32(E · S)` must be `P`'s value at every element. `D1` must be a contraction.
//!
//! **Numerics.** Before: each `Wf = round(E·S)` (exact for an E8M0 scale), then one f32
//! rounding per FMA. After: `A·W` exact in each FMA, one rounding per step of a block's
//! sum, one for the scale, one per block in the sum over blocks: both within
//! `(K + K/B + 1)·u·Σ|A·Wf|` of the exact value (`u = 2^-24`).

use crate::affine::affine;
use crate::class::classify;
use crate::contraction::Contraction;
use crate::interp;
use crate::kernel::{BinaryOp, Expr, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType, VarId};
use crate::program::{BufferKind, Dispatch, FlowProgram};
use kiln_ir::{DType, Shape, Tensor, TensorType};

/// Rewrites every contraction that reads a block-scaled constant weight (see the module
/// docs); returns how many. The producers they no longer read are left for
/// [`FlowProgram::remove_dead`].
pub fn block_scaled_in_load(p: &mut FlowProgram) -> usize {
    let mut done = 0;
    // From the last dispatch down: each rewrite inserts one before its consumer.
    for d in (0..p.dispatches.len()).rev() {
        let Some(r) = plan(p, d) else { continue };
        let name = p.buffer(p.storage(p.dispatches[d].operands[r.b_input as usize])).name.clone();
        let w = p.add(r.w.ty().clone(), format!("{name}.mx"), BufferKind::Const(r.w));
        let s = p.add(r.scale.ty().clone(), format!("{name}.mx_scale"), BufferKind::Const(r.scale));
        let part = p.add(r.d1.output.clone(), format!("{name}.mx_blocks"), BufferKind::Result);
        let mut sources = p.dispatches[r.producer].sources.clone();
        let disp = &mut p.dispatches[d];
        sources.append(&mut disp.sources);
        let a = disp.operands[r.a_input as usize];
        let first = Dispatch::new(r.d1, vec![a, w], part, sources.clone()).guarded(disp.guard.clone());
        disp.operands[r.b_input as usize] = part;
        disp.operands.push(s);
        disp.kernel = r.d2;
        disp.class = classify(&disp.kernel);
        disp.sources = sources;
        p.dispatches.insert(d, first);
        done += 1;
    }
    done
}

struct Plan {
    d1: Kernel,
    d2: Kernel,
    /// The integer weight `W` and the scales `S'` (`[K/B, N]`, f32).
    w: Tensor,
    scale: Tensor,
    a_input: u32,
    b_input: u32,
    producer: usize,
}

fn plan(p: &FlowProgram, d: usize) -> Option<Plan> {
    let disp = &p.dispatches[d];
    let k = &disp.kernel;
    let c = Contraction::of(k)?;
    if c.k.len() != 1 || k.output.dtype != DType::F32 || c.b.dtype != DType::F32 || c.b.panel.is_some() {
        return None;
    }
    let kv = c.k[0];
    let Expr::Reduce { op: ReduceOp::Sum, vars, body } = &k.node(c.reduce).expr else { return None };
    if vars.as_slice() != [VarId(kv)] || k.vars.len() != k.out_rank() + 1 {
        return None;
    }
    let Expr::Binary(BinaryOp::Mul, x, y) = k.node(*body).expr else { return None };
    let is_b = |e: ExprId| matches!(&k.node(e).expr, Expr::Load { input, .. } if *input == c.b.input);
    let bload = if is_b(x) {
        x
    } else if is_b(y) {
        y
    } else {
        return None;
    };
    let Expr::Load { index, .. } = &k.node(bload).expr else { return None };
    let bt = &k.inputs[c.b.input as usize];
    let (kk, nn) = match bt.shape.dims() {
        &[kk, nn] => (kk, nn),
        _ => return None,
    };
    if k.node(index[0]).expr != Expr::Var(VarId(kv))
        || k.vars[kv as usize] != kk as u64
        || affine(k, index[1])?.of(kv) != 0
    {
        return None;
    }
    let loads = k.nodes.iter().filter(|n| matches!(&n.expr, Expr::Load { input, .. } if *input == c.b.input)).count();
    if loads != 1 || c.a.input == c.b.input {
        return None;
    }
    // The producer: P, read by D alone.
    let s = p.storage(disp.operands[c.b.input as usize]);
    let pi = p.producers()[s.index()]?;
    if crate::fuse::reader_counts(p)[s.index()] != 1 || p.outputs.iter().any(|&o| p.storage(o) == s) {
        return None;
    }
    let (e, sc) = split(p, pi, kk * nn)?;
    // W = E·2^p as integers.
    let pw = (0..=15).find(|&q| e.iter().all(|v| (v * f64::from(1u32 << q)).fract() == 0.0))?;
    let ints: Vec<i64> = e.iter().map(|v| (v * f64::from(1u32 << pw)) as i64).collect();
    if ints.iter().any(|&v| !(-32768..=32767).contains(&v)) {
        return None;
    }
    // The block size.
    let constant_on =
        |bs: usize| (0..kk).all(|r| r % bs == 0 || (0..nn).all(|n| sc[r * nn + n] == sc[(r - 1) * nn + n]));
    let bs = [kk, 256, 128, 64, 32, 16, 8].into_iter().filter(|&b| b <= kk && kk % b == 0).find(|&b| constant_on(b))?;
    let nb = kk / bs;
    if nb * k.output.shape.numel() > kk * nn {
        return None;
    }
    let unscale = 1.0 / f64::from(1u32 << pw);
    let mut scales = Vec::with_capacity(nb * nn);
    for b in 0..nb {
        for n in 0..nn {
            let v = sc[b * bs * nn + n] * unscale;
            if (v as f32) as f64 != v || !v.is_finite() {
                return None;
            }
            scales.push(v as f32);
        }
    }
    let (lo, hi) = ints.iter().fold((0, 0), |(l, h), &v| (v.min(l), v.max(h)));
    let (wd, bytes): (DType, Vec<u8>) = if lo >= -128 && hi <= 127 {
        (DType::I8, ints.iter().map(|&v| v as i8 as u8).collect())
    } else {
        (DType::I16, ints.iter().flat_map(|&v| (v as i16).to_le_bytes()).collect())
    };
    let w = Tensor::new(TensorType::new(wd, Shape::new(vec![kk, nn]).ok()?), bytes.into()).ok()?;
    let scale = Tensor::from_vec(Shape::new(vec![nb, nn]).ok()?, scales).ok()?;
    let d1 = blocks_kernel(k, &c, kv, bload, wd, nb, bs)?;
    Contraction::of(&d1)?;
    let d2 = sum_kernel(k, &c, index[1], nb, nn)?;
    Some(Plan { d1, d2, w, scale, a_input: c.a.input, b_input: c.b.input, producer: pi })
}

/// Producer `pi` (of `numel` elements) as the element values `E` and scales `S` at every
/// element, in f64, checked to give `P`'s own value; `None` unless it has the form of
/// the module docs.
fn split(p: &FlowProgram, pi: usize, numel: usize) -> Option<(Vec<f64>, Vec<f64>)> {
    let d = &p.dispatches[pi];
    let k = &d.kernel;
    if k.output.dtype != DType::F32 || k.vars.len() != k.out_rank() || k.output.shape.numel() != numel {
        return None;
    }
    let mut consts = Vec::with_capacity(d.operands.len());
    for &o in &d.operands {
        let BufferKind::Const(t) = &p.buffer(p.storage(o)).kind else { return None };
        consts.push(t);
    }
    let mut root = k.root;
    if let Expr::Cast { value, to: DType::F32, .. } = k.node(root).expr {
        if k.node(value).ty == ScalarType::F64 {
            root = value;
        }
    }
    let Expr::Binary(BinaryOp::Mul, a, b) = k.node(root).expr else { return None };
    let reads_lowp = |e: ExprId| {
        let mut stack = vec![e];
        while let Some(e) = stack.pop() {
            match &k.node(e).expr {
                Expr::Load { input, .. } => {
                    let dt = k.inputs[*input as usize].dtype;
                    if dt.is_low_precision_float() && dt != DType::F8E8M0FNU {
                        return true;
                    }
                }
                other => other.for_each_operand(|o| stack.push(o)),
            }
        }
        false
    };
    let (e, s) = match (reads_lowp(a), reads_lowp(b)) {
        (true, false) => (a, b),
        (false, true) => (b, a),
        _ => return None,
    };
    let value = |r: ExprId| -> Option<Vec<f64>> {
        let mut kr = k.clone();
        kr.root = r;
        kr.output = TensorType::new(k.node(r).ty.dtype(), k.output.shape.clone());
        Some(interp::run(&kr, &consts).ok()?.to_f64_vec())
    };
    let (ev, sv, pv) = (value(e)?, value(s)?, interp::run(k, &consts).ok()?.to_f64_vec());
    let exact = ev.iter().zip(&sv).zip(&pv).all(|((e, s), p)| e.is_finite() && ((e * s) as f32) as f64 == *p);
    exact.then_some((ev, sv))
}

/// `D1`: the reduction of `k` split at blocks of `bs`, the block its outermost output
/// variable, reading A (input 0) and the integer weight (input 1, of `wd`).
fn blocks_kernel(
    k: &Kernel,
    c: &Contraction,
    kv: u32,
    bload: ExprId,
    wd: DType,
    nb: usize,
    bs: usize,
) -> Option<Kernel> {
    let r = k.out_rank();
    let a_ty = k.inputs[c.a.input as usize].clone();
    let w_ty = TensorType::new(wd, k.inputs[c.b.input as usize].shape.clone());
    let mut dims = vec![nb];
    dims.extend_from_slice(k.output.shape.dims());
    let out = TensorType::new(DType::F32, Shape::new(dims).ok()?);
    let mut b = KernelBuilder::new(format!("{}_mx_blocks", k.name), vec![a_ty, w_ty], out);
    let j = b.new_var(bs as u64);
    let need = needed(k, c.reduce, None);
    let mut map: Vec<Option<ExprId>> = vec![None; k.nodes.len()];
    for i in 0..k.nodes.len() {
        if !need[i] {
            continue;
        }
        let node = &k.nodes[i];
        let m = |e: &ExprId| map[e.index()];
        let new = match &node.expr {
            Expr::Var(v) if v.0 == kv => {
                let blk = b.var(VarId(0));
                let size = b.index(bs as i64);
                let start = b.mul(blk, size);
                let jj = b.var(j);
                b.add(start, jj)
            }
            Expr::Var(v) if (v.0 as usize) < r => b.var(VarId(v.0 + 1)),
            Expr::Var(_) => return None,
            Expr::Load { input, index, bounds } => {
                let index: Vec<ExprId> = index.iter().map(m).collect::<Option<_>>()?;
                if ExprId(i as u32) == bload {
                    let l = b.raw(ScalarType::of_storage(wd), Expr::Load { input: 1, index, bounds: *bounds });
                    b.cast(l, DType::F32, true)
                } else if *input == c.a.input {
                    b.raw(node.ty, Expr::Load { input: 0, index, bounds: *bounds })
                } else {
                    return None;
                }
            }
            Expr::Reduce { op, body, .. } => b.raw(node.ty, Expr::Reduce { op: *op, vars: vec![j], body: m(body)? }),
            other => {
                let e = other.try_map_operands(|o| m(&o))?;
                b.raw(node.ty, e)
            }
        };
        map[i] = Some(new);
    }
    b.finish(map[c.reduce.index()]?).ok()
}

/// `D2`: `k` with its reduction replaced by the sum over `nb` blocks of the partial
/// products (input `c.b.input`, now `[nb, out…]`) times the scales (a new last input
/// `[nb, nn]`, read at `[block, e]`, `e` the weight's column index `col`).
fn sum_kernel(k: &Kernel, c: &Contraction, col: ExprId, nb: usize, nn: usize) -> Option<Kernel> {
    let r = k.out_rank();
    let mut inputs = k.inputs.clone();
    let mut dims = vec![nb];
    dims.extend_from_slice(k.output.shape.dims());
    inputs[c.b.input as usize] = TensorType::new(DType::F32, Shape::new(dims).ok()?);
    let scale_input = inputs.len();
    inputs.push(TensorType::new(DType::F32, Shape::new(vec![nb, nn]).ok()?));
    let mut b = KernelBuilder::new(k.name.clone(), inputs, k.output.clone());
    let blk = b.new_var(nb as u64);
    let need = needed(k, k.root, Some((c.reduce, col)));
    let mut map: Vec<Option<ExprId>> = vec![None; k.nodes.len()];
    for i in 0..k.nodes.len() {
        if !need[i] {
            continue;
        }
        let node = &k.nodes[i];
        let new = if ExprId(i as u32) == c.reduce {
            let mut idx = vec![b.var(blk)];
            idx.extend((0..r).map(|v| b.var(VarId(v as u32))));
            let part = b.load(c.b.input as usize, idx);
            let bv = b.var(blk);
            let sidx = vec![bv, map[col.index()]?];
            let s = b.load(scale_input, sidx);
            let body = b.mul(part, s);
            b.reduce(ReduceOp::Sum, vec![blk], body)
        } else {
            match &node.expr {
                Expr::Var(v) if (v.0 as usize) < r => b.var(*v),
                Expr::Var(_) => return None,
                other => {
                    let e = other.try_map_operands(|o| map[o.index()])?;
                    b.raw(node.ty, e)
                }
            }
        };
        map[i] = Some(new);
    }
    b.finish(map[k.root.index()]?).ok()
}

/// The nodes `root` needs; with `cut = Some((reduce, col))`, `reduce`'s operands are
/// replaced by `col` (the nodes of the weight's column index).
fn needed(k: &Kernel, root: ExprId, cut: Option<(ExprId, ExprId)>) -> Vec<bool> {
    let mut need = vec![false; k.nodes.len()];
    let mut stack = vec![root];
    while let Some(e) = stack.pop() {
        if std::mem::replace(&mut need[e.index()], true) {
            continue;
        }
        match cut {
            Some((r, col)) if r == e => stack.push(col),
            _ => k.node(e).expr.for_each_operand(|o| stack.push(o)),
        }
    }
    need
}
