//! Weights dequantised in the contraction's load.
//!
//! A weight-only quantised model stores a weight as integers and a scale (ONNX `Cast` then
//! `Mul`, or `DequantizeLinear` with a per-tensor or per-axis scale and zero point), and
//! its matrix product reads the f32 weight `B = (q − z)·s`. Folding that at compile time
//! would carry the weight in f32 (four times the int8 bytes; `kiln-opt`'s folding policy
//! declines), and leaving it as a dispatch writes the whole f32 weight into the arena on
//! every call before the product reads it. Instead, this pass rewrites the pair:
//!
//! ```text
//! P:  B[i]   = I(i) · S(i)                 (elementwise, over constants only)
//! D:  out[·] = epi( Σ_k A[m, k] · B[k, n] )
//! ⇒
//! D': out[·] = epi( (Σ_k A[m, k] · f32(W[k, n])) · S'[n] )
//! ```
//!
//! where `W = I` as integers — `i8`, `u8` or `i16`, the narrowest that holds every
//! value (a zero point is subtracted here, once: `u8` with zero points becomes `i16`
//! where `q − z` leaves 0..255) — and `S'` is `S` with the axes that vary with the
//! reduction dropped, which requires `S` to be constant along them: a per-tensor scale
//! (then a literal), or a per-column one (`[1, N]`, `DequantizeLinear` along the
//! columns' axis). `W` stays in its integer dtype; the contraction recogniser takes
//! `Cast(Load(W))` as a right operand ([`crate::contraction::INT_OPERANDS`]), weight
//! packing lays it out in panels like any constant, and a target converts it in the load
//! (x86-64: `vpmovsxbd`/`vpmovzxbd`/`vpmovsxwd` + `vcvtdq2ps`). The scale is an ordinary
//! epilogue multiply. `P` loses its last reader and drops out.
//!
//! **Why here** (at the flow level, after fusion) rather than as a tensor-level op: the
//! kernel IR already has integer loads and conversions, so the recogniser gains one
//! operand form instead of a new op threaded through the IR, the reference evaluator and
//! every lowering; the pair is matched after fusion has put the dequantisation chain,
//! whatever ops it came from (`Cast`/`Sub`/`Mul`, `DequantizeLinear`, per-tensor
//! parameters as literals), into one elementwise kernel; the split into integers and
//! scale is decided with the constants' values in hand (storage type from the actual
//! range, constancy of the scale checked, not assumed); and the reference evaluator
//! keeps evaluating the original graph, so the model tests stay a real differential
//! test of this rewrite.
//!
//! **What is matched.** `P`'s root is `I · S` (either order) or `I` alone (`S = 1`),
//! where `I` reads an integer input; `P` reads only constants, has no reduction, and
//! `D` is its one reader, through one load that is a factor of `D`'s one `Σ` product.
//! `I` and `S` are evaluated at compile time with the kernel semantics
//! ([`crate::interp`]'s scalar operations) at every element: every `I` must be an integer
//! in i16's range (so `I = W` exactly) and every `S` finite. After the rewrite `D'` must
//! be a [`Contraction`] whose right operand is `W`, one element a column, with affine
//! epilogue loads; anything else is left as it was. Weight packing then lays `W` out in
//! panels where it reads only the columns and the reduction (a product's weight); where
//! it also reads a batch or row variable (a product whose result is split into heads)
//! it stays as it is.
//!
//! **Numerics.** Before: each `B = round(I·S)`, then the f32 sum of `A·B` (one rounding
//! per FMA). After: the f32 sum of `A·W` — each product exact inside its FMA (`A` has a
//! 24-bit significand, `|W| < 2¹⁵`), one rounding per FMA as before — then one rounding
//! for `·S'`. Both are within `(K + 1)·u·|S|·Σ_k |A_k·W_k|` (u = 2⁻²⁴) of the exact
//! `S·Σ A·W` (`γ_K` for the sum, `u` for the scale or for `B`'s own rounding), so they
//! differ by at most twice that; a constant-scale weight loses nothing but the order of
//! one rounding. The tests (`kiln-codegen/tests/gemm.rs`, the int8 cases) check
//! microkernels against the f64 sum with this bound.

use crate::affine::{affine, load_offset, AffineIndex};
use crate::class::KernelClass;
use crate::contraction::{Contraction, INT_OPERANDS};
use crate::interp;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType};
use crate::program::{BufferKind, FlowProgram};
use kiln_ir::{DType, Shape, Tensor, TensorType};

/// Rewrites every contraction that reads a dequantised constant weight to read the
/// integers and apply the scale in its epilogue (see the module docs). Returns how many
/// were rewritten; the producers they no longer read are left for
/// [`FlowProgram::remove_dead`].
pub fn dequantize_in_load(p: &mut FlowProgram) -> usize {
    let mut done = 0;
    for d in 0..p.dispatches.len() {
        let Some(r) = rewrite(p, d) else { continue };
        let name = p.buffer(p.storage(p.dispatches[d].operands[r.input as usize])).name.clone();
        let w = p.add(r.w.ty().clone(), format!("{name}.int"), BufferKind::Const(r.w));
        let scale = r.scale.map(|s| p.add(s.ty().clone(), format!("{name}.scale"), BufferKind::Const(s)));
        let mut sources = p.dispatches[r.producer].sources.clone();
        let dispatch = &mut p.dispatches[d];
        dispatch.operands[r.input as usize] = w;
        dispatch.operands.extend(scale);
        dispatch.kernel = r.kernel;
        dispatch.class = KernelClass::of(&dispatch.kernel);
        sources.append(&mut dispatch.sources);
        dispatch.sources = sources;
        done += 1;
    }
    done
}

/// A rewritten consumer: its kernel, the integer weight taking input `input`'s place,
/// the scale vector (a new last input) unless the scale is a literal, and the producer
/// it no longer reads.
struct Rewrite {
    kernel: Kernel,
    input: u32,
    w: Tensor,
    scale: Option<Tensor>,
    producer: usize,
}

/// The scale the epilogue multiplies by.
enum Scale {
    /// One value (not 1).
    Literal(f32),
    /// `S'`, read at the load's index with the reduction's axes at 0.
    Vector(Tensor, Vec<bool>),
}

fn rewrite(p: &FlowProgram, d: usize) -> Option<Rewrite> {
    let k = &p.dispatches[d].kernel;
    let mut reduces = k.nodes.iter().enumerate().filter(|(_, n)| matches!(n.expr, Expr::Reduce { .. }));
    let (ri, rnode) = reduces.next()?;
    if reduces.next().is_some() || rnode.ty != ScalarType::F32 || k.output.dtype != DType::F32 {
        return None;
    }
    let Expr::Reduce { op: ReduceOp::Sum, body, .. } = &rnode.expr else { return None };
    let Expr::Binary(BinaryOp::Mul, x, y) = k.node(*body).expr else { return None };
    let producers = p.producers();
    let readers = crate::fuse::reader_counts(p);
    for load in [x, y] {
        let Expr::Load { input, bounds: Bounds::InBounds, .. } = &k.node(load).expr else { continue };
        let input = *input;
        if k.inputs.get(input as usize)?.dtype != DType::F32 || loads_of(k, input) != 1 {
            continue;
        }
        let s = p.storage(p.dispatches[d].operands[input as usize]);
        let Some(pi) = producers[s.index()] else { continue };
        if readers[s.index()] != 1 || p.outputs.iter().any(|&o| p.storage(o) == s) {
            continue;
        }
        let Some((w, scale)) = split_producer(p, pi, k.inputs[input as usize].shape.dims()) else { continue };
        let Some((kernel, scale)) = rebuilt(k, ExprId(ri as u32), load, input, w.dtype(), scale) else { continue };
        return Some(Rewrite { kernel, input, w, scale, producer: pi });
    }
    None
}

/// The loads of `k` that read input `input`.
fn loads_of(k: &Kernel, input: u32) -> usize {
    k.nodes.iter().filter(|n| matches!(&n.expr, Expr::Load { input: i, .. } if *i == input)).count()
}

/// Producer `pi` as integers `W` (in `dims`, the consumer's view of its result) and the
/// per-element scale, both evaluated at compile time; `None` unless it is a
/// dequantisation (see the module docs).
fn split_producer(p: &FlowProgram, pi: usize, dims: &[usize]) -> Option<(Tensor, Vec<f32>)> {
    let d = &p.dispatches[pi];
    let k = &d.kernel;
    if k.output.dtype != DType::F32 || k.vars.len() != k.out_rank() || k.output.shape.numel() != dims.iter().product() {
        return None;
    }
    let mut data = Vec::with_capacity(d.operands.len());
    for &o in &d.operands {
        let BufferKind::Const(t) = &p.buffer(p.storage(o)).kind else { return None };
        data.push(interp::decode(t));
    }
    let reads_int = |e: ExprId| {
        let mut stack = vec![e];
        while let Some(e) = stack.pop() {
            match &k.node(e).expr {
                Expr::Load { input, .. } => {
                    if k.inputs[*input as usize].dtype.is_int() {
                        return true;
                    }
                }
                other => other.for_each_operand(|o| stack.push(o)),
            }
        }
        false
    };
    let root = k.node(k.root);
    let (int, scale) = match root.expr {
        Expr::Binary(BinaryOp::Mul, a, b) if root.ty == ScalarType::F32 && reads_int(a) => (a, Some(b)),
        Expr::Binary(BinaryOp::Mul, a, b) if root.ty == ScalarType::F32 && reads_int(b) => (b, Some(a)),
        _ if root.ty == ScalarType::F32 && reads_int(k.root) => (k.root, None),
        _ => return None,
    };
    let roots: Vec<ExprId> = [Some(int), scale].into_iter().flatten().collect();
    let values = evaluate(k, &data, &roots)?;
    let ints: Vec<i64> = values[0]
        .iter()
        .map(|&b| {
            let v = f32::from_bits(b as u32);
            (v.fract() == 0.0 && (-32768.0..=32767.0).contains(&v)).then_some(v as i64)
        })
        .collect::<Option<_>>()?;
    let (lo, hi) = ints.iter().fold((0, 0), |(lo, hi), &v| (v.min(lo), v.max(hi)));
    let dtype = if lo >= -128 && hi <= 127 {
        DType::I8
    } else if lo >= 0 && hi <= 255 {
        DType::U8
    } else {
        DType::I16
    };
    debug_assert!(INT_OPERANDS.contains(&dtype));
    let w = Tensor::from_i64(dtype, Shape::new(dims.to_vec()).ok()?, &ints).ok()?;
    let scale: Vec<f32> = match values.get(1) {
        Some(s) => s.iter().map(|&b| f32::from_bits(b as u32)).collect(),
        None => vec![1.0; ints.len()],
    };
    scale.iter().all(|s| s.is_finite()).then_some((w, scale))
}

/// The values of `roots` (f32 nodes of `k`, an elementwise kernel over constants
/// `data`) at every output element, row-major; `None` where a load is not affine or
/// leaves its input, or a node is one the evaluation does not take (a reduction).
fn evaluate(k: &Kernel, data: &[Vec<u64>], roots: &[ExprId]) -> Option<Vec<Vec<u64>>> {
    // The value nodes the roots need (not the index arithmetic inside loads), in order.
    let mut need = vec![false; k.nodes.len()];
    let mut offsets: Vec<Option<AffineIndex>> = vec![None; k.nodes.len()];
    for &r in roots {
        need[r.index()] = true;
    }
    for i in (0..k.nodes.len()).rev() {
        if !need[i] {
            continue;
        }
        match &k.nodes[i].expr {
            Expr::Load { input, index, bounds: Bounds::InBounds } => {
                offsets[i] = Some(load_offset(k, *input, index)?);
            }
            Expr::Load { .. } | Expr::Reduce { .. } | Expr::Var(_) => return None,
            other => other.for_each_operand(|o| need[o.index()] = true),
        }
    }
    let order: Vec<usize> = (0..k.nodes.len()).filter(|&i| need[i]).collect();
    let dims = k.output.shape.dims();
    let numel: usize = dims.iter().product();
    let rank = dims.len();
    // Row by row (the last axis innermost): each load at its row's start plus a step.
    let last = if rank == 0 { 1 } else { dims[rank - 1] };
    let rows = numel.checked_div(last).unwrap_or(0);
    let (mut start, mut step) = (vec![0i64; k.nodes.len()], vec![0i64; k.nodes.len()]);
    let mut out = vec![Vec::with_capacity(numel); roots.len()];
    let mut val = vec![0u64; k.nodes.len()];
    let mut idx = vec![0i64; rank];
    for _ in 0..rows {
        for &i in &order {
            if let Some(off) = &offsets[i] {
                start[i] = (0..rank.saturating_sub(1)).fold(off.c, |acc, v| acc + off.of(v as u32) * idx[v]);
                step[i] = if rank == 0 { 0 } else { off.of(rank as u32 - 1) };
            }
        }
        for j in 0..last as i64 {
            for &i in &order {
                val[i] = match &k.nodes[i].expr {
                    Expr::Load { input, .. } => {
                        let at = usize::try_from(start[i] + step[i] * j).ok()?;
                        *data.get(*input as usize)?.get(at)?
                    }
                    Expr::Const(bits) => *bits,
                    Expr::Cast { value, to, saturate } => {
                        interp::cast(k.node(*value).ty, val[value.index()], *to, *saturate)
                    }
                    Expr::Unary(op, a) => interp::unary(*op, k.node(*a).ty, val[a.index()]),
                    Expr::Binary(op, a, b) => interp::binary(*op, k.node(*a).ty, val[a.index()], val[b.index()]),
                    Expr::Select(c, a, b) => {
                        if val[c.index()] != 0 {
                            val[a.index()]
                        } else {
                            val[b.index()]
                        }
                    }
                    Expr::Var(_) | Expr::Reduce { .. } => return None,
                };
            }
            for (o, r) in out.iter_mut().zip(roots) {
                o.push(val[r.index()]);
            }
        }
        for d in (0..rank.saturating_sub(1)).rev() {
            idx[d] += 1;
            if (idx[d] as usize) < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    Some(out)
}

/// `k` with its product's load `load` of input `input` reading integers of `dtype`
/// converted to f32, and the reduction `reduce` times the scale; the scale vector to
/// bind as the new last input, if any. `None` unless the result is a contraction with
/// the integers as its right operand, one element a column.
fn rebuilt(
    k: &Kernel,
    reduce: ExprId,
    load: ExprId,
    input: u32,
    dtype: DType,
    scale: Vec<f32>,
) -> Option<(Kernel, Option<Tensor>)> {
    let Expr::Load { index, .. } = &k.node(load).expr else { return None };
    let dims = k.inputs[input as usize].shape.dims().to_vec();
    // The axes the reduction moves along: the scale must not vary along them.
    let free = k.free_vars();
    let rvars: Vec<u32> = (k.out_rank() as u32..k.vars.len() as u32).collect();
    let mut along = Vec::with_capacity(dims.len());
    for &e in index {
        let a = affine(k, e)?;
        let moves = rvars.iter().any(|&v| a.of(v) != 0);
        // An axis kept in the scale's index must not name a reduction variable at all
        // (it is evaluated outside the reduction).
        if !moves && free[e.index()].iter().any(|v| rvars.contains(v)) {
            return None;
        }
        along.push(moves);
    }
    let scale = scale_of(&dims, &along, &scale)?;
    let mut inputs = k.inputs.clone();
    inputs[input as usize] = TensorType::new(dtype, Shape::new(dims.clone()).ok()?);
    let svec = match &scale {
        Some(Scale::Vector(t, _)) => {
            inputs.push(t.ty().clone());
            Some(t.clone())
        }
        _ => None,
    };
    let mut b = KernelBuilder::new(k.name.clone(), inputs, k.output.clone());
    for &e in &k.vars[k.out_rank()..] {
        b.new_var(e);
    }
    let mut map: Vec<ExprId> = Vec::with_capacity(k.nodes.len());
    for (i, node) in k.nodes.iter().enumerate() {
        let expr = node.expr.map_operands(|e| map[e.index()]);
        let id = if i == load.index() {
            let l = b.raw(ScalarType::of_storage(dtype), expr);
            b.raw(ScalarType::F32, Expr::Cast { value: l, to: DType::F32, saturate: false })
        } else if i == reduce.index() {
            let r = b.raw(node.ty, expr);
            let s = match &scale {
                None => None,
                Some(Scale::Literal(v)) => Some(b.float(ScalarType::F32, *v as f64)),
                Some(Scale::Vector(_, along)) => {
                    let idx: Vec<ExprId> =
                        index.iter().zip(along).map(|(&e, &a)| if a { b.index(0) } else { map[e.index()] }).collect();
                    Some(b.raw(ScalarType::F32, Expr::Load { input: k.inputs.len() as u32, index: idx, bounds: Bounds::InBounds }))
                }
            };
            match s {
                Some(s) => b.raw(ScalarType::F32, Expr::Binary(BinaryOp::Mul, r, s)),
                None => r,
            }
        } else {
            b.raw(node.ty, expr)
        };
        map.push(id);
    }
    let kernel = b.finish(map[k.root.index()]).ok()?;
    let c = Contraction::of(&kernel)?;
    let ok = c.b.input == input
        && c.b.dtype == dtype
        && c.column_step(&c.b.offset) == Some(1)
        && c.epilogue_is_affine(&kernel);
    ok.then_some((kernel, svec))
}

/// The scale as the epilogue applies it: nothing for 1, a literal for one value, else
/// the values with the axes in `along` (which they must not vary along) dropped to
/// extent 1. `None` when the scale varies along the reduction.
fn scale_of(dims: &[usize], along: &[bool], s: &[f32]) -> Option<Option<Scale>> {
    let first = *s.first()?;
    if s.iter().all(|x| x.to_bits() == first.to_bits()) {
        return Some((first != 1.0).then_some(Scale::Literal(first)));
    }
    let mut strides = vec![1usize; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * dims[d + 1];
    }
    let kept: Vec<usize> = dims.iter().zip(along).map(|(&e, &a)| if a { 1 } else { e }).collect();
    let mut out = Vec::with_capacity(kept.iter().product());
    let mut idx = vec![0usize; dims.len()];
    // Where each element's scale is read: its own index with the `along` axes at 0
    // (kept up to date as the index steps).
    let mut base = 0usize;
    for (flat, &x) in s.iter().enumerate() {
        if x.to_bits() != s.get(base)?.to_bits() {
            return None;
        }
        if base == flat {
            out.push(x);
        }
        for d in (0..dims.len()).rev() {
            idx[d] += 1;
            if !along[d] {
                base += strides[d];
            }
            if idx[d] < dims[d] {
                break;
            }
            if !along[d] {
                base -= dims[d] * strides[d];
            }
            idx[d] = 0;
        }
    }
    let t = Tensor::from_vec(Shape::new(kept).ok()?, out).ok()?;
    Some(Some(Scale::Vector(t, along.to_vec())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{interpret, Buffer, BufferId, Dispatch};
    use crate::test_types::t;

    /// The producer `B[k, n] = (f32(q[k, n]) + offset) · s[0, n]` of a `[K, N]` weight,
    /// `q` an i8 constant (or a graph input, `q_input`), `s` per column (or, `s_rows`, one
    /// per row of B: along the reduction), and the product `x · B` reading it; with
    /// `shared`, B is a graph output too.
    fn program(offset: f32, q_input: bool, s_rows: bool, shared: bool) -> FlowProgram {
        let (m, kk, n) = (3usize, 7usize, 5usize);
        let q: Vec<i64> = (0..kk * n).map(|i| (i as i64 * 37) % 256 - 128).collect();
        let q = Tensor::from_i64(DType::I8, Shape::new(vec![kk, n]).unwrap(), &q).unwrap();
        let sdims = if s_rows { [kk, 1] } else { [1, n] };
        let s: Vec<f32> = (0..sdims[0] * sdims[1]).map(|i| 0.01 * (i + 1) as f32).collect();
        let s = Tensor::from_vec(Shape::new(sdims.to_vec()).unwrap(), s).unwrap();
        let mut b = KernelBuilder::new("dq", vec![q.ty().clone(), s.ty().clone()], t(&[kk, n]));
        let o = b.out_index();
        let x = b.load(0, vec![o[0], o[1]]);
        let mut v = b.convert(x, ScalarType::F32);
        if offset != 0.0 {
            let c = b.float(ScalarType::F32, offset as f64);
            v = b.add(v, c);
        }
        let zero = b.index(0);
        let sv = if s_rows { b.load(1, vec![o[0], zero]) } else { b.load(1, vec![zero, o[1]]) };
        let r = b.mul(v, sv);
        let dq = b.finish(r).unwrap();
        let mut b = KernelBuilder::new("mm", vec![t(&[m, kk]), t(&[kk, n])], t(&[m, n]));
        let o = b.out_index();
        let kv = b.new_var(kk as u64);
        let k = b.var(kv);
        let x = b.load(0, vec![o[0], k]);
        let w = b.load(1, vec![k, o[1]]);
        let p = b.mul(x, w);
        let r = b.reduce(ReduceOp::Sum, vec![kv], p);
        let mm = b.finish(r).unwrap();
        let buf = |ty: TensorType, kind| Buffer { ty, name: "b".into(), kind };
        let qkind = if q_input { BufferKind::Input(1) } else { BufferKind::Const(q.clone()) };
        let mut outputs = vec![BufferId(5)];
        if shared {
            outputs.push(BufferId(3));
        }
        FlowProgram {
            name: "p".into(),
            buffers: vec![
                buf(t(&[m, kk]), BufferKind::Input(0)),
                buf(q.ty().clone(), qkind),
                buf(s.ty().clone(), BufferKind::Const(s)),
                buf(t(&[kk, n]), BufferKind::Result),
                buf(t(&[m, n]), BufferKind::Result),
                buf(t(&[m, n]), BufferKind::Result),
            ],
            dispatches: vec![
                Dispatch::new(dq, vec![BufferId(1), BufferId(2)], BufferId(3), vec!["Dequantize".into()]),
                Dispatch::new(mm, vec![BufferId(0), BufferId(3)], BufferId(5), vec!["MatMul".into()]),
            ],
            inputs: if q_input { vec![BufferId(0), BufferId(1)] } else { vec![BufferId(0)] },
            outputs,
        }
    }

    /// Per-column int8: the product reads the integers and scales in its epilogue, the
    /// dequantising dispatch drops out, and the program computes what it did (within
    /// the module docs' bound: here `K = 7`, so 9 roundings of the magnitudes' sum).
    #[test]
    fn a_per_column_weight_is_read_as_integers() {
        let mut p = program(0.0, false, false, false);
        let x = Tensor::from_vec(Shape::new(vec![3, 7]).unwrap(), (0..21).map(|i| (i as f32 * 0.7).sin()).collect()).unwrap();
        let want = interpret(&p, std::slice::from_ref(&x)).unwrap()[0].to_vec::<f32>().unwrap();
        assert_eq!(dequantize_in_load(&mut p), 1);
        p.remove_dead();
        assert_eq!(p.dispatches.len(), 1);
        let d = &p.dispatches[0];
        assert_eq!(d.class, KernelClass::Contraction);
        assert_eq!(d.sources, ["Dequantize", "MatMul"]);
        let c = Contraction::of(&d.kernel).unwrap();
        assert_eq!((c.b.dtype, d.kernel.inputs.len()), (DType::I8, 3));
        let got = interpret(&p, &[x]).unwrap()[0].to_vec::<f32>().unwrap();
        for (g, w) in got.iter().zip(&want) {
            // |terms| ≤ 1 · 128 · 0.05 each, 7 of them.
            assert!((g - w).abs() <= 18.0 * f32::EPSILON / 2.0 * 7.0 * 128.0 * 0.05, "{g} vs {w}");
        }
        // Nothing more to do.
        assert_eq!(dequantize_in_load(&mut p), 0);
    }

    /// What is left as it is: values that are not integers, integers that are not
    /// constants, a scale along the reduction, a weight something else reads too.
    #[test]
    fn declines_what_is_not_a_dequantised_constant() {
        assert_eq!(dequantize_in_load(&mut program(0.5, false, false, false)), 0);
        assert_eq!(dequantize_in_load(&mut program(0.0, true, false, false)), 0);
        assert_eq!(dequantize_in_load(&mut program(0.0, false, true, false)), 0);
        assert_eq!(dequantize_in_load(&mut program(0.0, false, false, true)), 0);
        // An integer offset is still integers (the zero point of `q + 1`): taken.
        assert_eq!(dequantize_in_load(&mut program(1.0, false, false, false)), 1);
    }
}
