//! Weights dequantised in the contraction's load.
//!
//! A weight-only quantised model stores a weight as integers and a scale (ONNX `Cast` then
//! `Mul`, or `DequantizeLinear` with a per-tensor or per-axis scale and zero point), and
//! its matrix product reads the f32 weight `B = (q − z)·s`. Folding that at compile time
//! would carry the weight in f32 (four times the int8 bytes; `kiln-opt`'s folding policy
//! declines above 64 KB, and keeps doing so), and leaving it as a dispatch writes the
//! whole f32 weight into the arena on every call before the product reads it. Instead,
//! this pass rewrites the pair:
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
//! ([`crate::interp`]'s scalar operations; the common forms read straight from the
//! constants' bytes, `direct`) at every element: every `I` must be an integer
//! in i16's range (so `I = W` exactly) and every `S` finite. After the rewrite `D'` must
//! be a [`Contraction`] whose right operand is `W`, one element a column, with affine
//! epilogue loads; anything else is left as it was. Weight packing then lays `W` out in
//! panels where it reads only the columns and the reduction (a product's weight); where
//! it also reads a batch or row variable (a product whose result is split into heads)
//! it stays as it is.
//!
//! **Numerics** (u = 2⁻²⁴, the unit roundoff). Before: each `B = round(I·S)` (one
//! rounding), then the f32 sum of `A·B` (one rounding per FMA). After: the f32 sum of
//! `A·W` — each product exact inside its FMA (`A` has a 24-bit significand, `|W| < 2¹⁵`,
//! so the product needs at most 39 bits and the FMA rounds only the sum), one rounding
//! per FMA as before — then one rounding for `·S'`. Both lie within
//! `(K + 1)·u·|S|·Σ_k |A_k·W_k|` (to first order) of the exact `S·Σ A·W`: `K` roundings
//! of the sum, plus `B`'s own rounding before or the scale's rounding after. So the two
//! differ by at most twice that, and by the order of one rounding for `K = 1`. The
//! kernel tests (`kiln-codegen/tests/dequant.rs`) check the microkernels and the
//! rewritten kernel against the interpreter running the original pair with
//! `(2K + 4)·u·Σ|A|·|B|` (the interpreter rounds each product too).

use crate::affine::{affine, load_offset, AffineIndex};
use crate::class::classify;
use crate::contraction::{Contraction, INT_OPERANDS};
use crate::interp;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType};
use crate::program::{BufferId, BufferKind, FlowProgram};
use kiln_ir::{DType, Shape, Tensor, TensorType};
use std::collections::HashMap;

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
        dispatch.class = classify(&dispatch.kernel);
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
    let mut consts = Vec::with_capacity(d.operands.len());
    for &o in &d.operands {
        let BufferKind::Const(t) = &p.buffer(p.storage(o)).kind else { return None };
        consts.push(t);
    }
    let (int, scale) = parts(k)?;
    let (ints, scale) = match direct(k, &consts, int, scale) {
        Some(v) => v,
        None => evaluated(k, &consts, int, scale)?,
    };
    let (lo, hi) = ints.iter().fold((0, 0), |(lo, hi), &v| (v.min(lo), v.max(hi)));
    let (dtype, bytes): (DType, Vec<u8>) = if lo >= -128 && hi <= 127 {
        (DType::I8, ints.iter().map(|&v| v as i8 as u8).collect())
    } else if lo >= 0 && hi <= 255 {
        (DType::U8, ints.iter().map(|&v| v as u8).collect())
    } else {
        (DType::I16, ints.iter().flat_map(|&v| (v as i16).to_le_bytes()).collect())
    };
    debug_assert!(INT_OPERANDS.contains(&dtype));
    let w = Tensor::new(TensorType::new(dtype, Shape::new(dims.to_vec()).ok()?), bytes.into()).ok()?;
    scale.iter().all(|s| s.is_finite()).then_some((w, scale))
}

/// `k`'s root as integers times a scale: `(I, Some(S))` for `I · S` (either order) or
/// `(I, None)` for `I` alone, `I` the side that reads an integer input.
fn parts(k: &Kernel) -> Option<(ExprId, Option<ExprId>)> {
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
    if root.ty != ScalarType::F32 {
        return None;
    }
    match root.expr {
        Expr::Binary(BinaryOp::Mul, a, b) if reads_int(a) => Some((a, Some(b))),
        Expr::Binary(BinaryOp::Mul, a, b) if reads_int(b) => Some((b, Some(a))),
        _ if reads_int(k.root) => Some((k.root, None)),
        _ => None,
    }
}

/// `I` and `S` (1 when absent) at every element of `k`, evaluated with the kernel
/// semantics ([`evaluate`]); `None` unless every `I` is an integer in i16's range.
fn evaluated(k: &Kernel, consts: &[&Tensor], int: ExprId, scale: Option<ExprId>) -> Option<(Vec<i32>, Vec<f32>)> {
    let data: Vec<Vec<u64>> = consts.iter().map(|t| interp::decode(t)).collect();
    let roots: Vec<ExprId> = [Some(int), scale].into_iter().flatten().collect();
    let values = evaluate(k, &data, &roots)?;
    let ints: Vec<i32> = values[0]
        .iter()
        .map(|&b| {
            let v = f32::from_bits(b as u32);
            (v.fract() == 0.0 && (-32768.0..=32767.0).contains(&v)).then_some(v as i32)
        })
        .collect::<Option<_>>()?;
    let scale: Vec<f32> = match values.get(1) {
        Some(s) => s.iter().map(|&b| f32::from_bits(b as u32)).collect(),
        None => vec![1.0; ints.len()],
    };
    Some((ints, scale))
}

/// A value [`direct`] reads at every element: a load of a constant (its bytes, dtype
/// and offset in elements, affine over the kernel's variables), or a literal.
enum Leaf<'t> {
    Load { bytes: &'t [u8], dtype: DType, offset: AffineIndex },
    Const(f32),
}

impl Leaf<'_> {
    /// Element `i` of a load as an integer (8- and 16-bit integer dtypes).
    fn int(bytes: &[u8], dtype: DType, i: usize) -> Option<i32> {
        Some(match dtype {
            DType::I8 => *bytes.get(i)? as i8 as i32,
            DType::U8 => *bytes.get(i)? as i32,
            DType::I16 => i16::from_le_bytes(bytes.get(2 * i..2 * i + 2)?.try_into().ok()?) as i32,
            DType::U16 => u16::from_le_bytes(bytes.get(2 * i..2 * i + 2)?.try_into().ok()?) as i32,
            _ => return None,
        })
    }

    /// Element `i` of an f32 load.
    fn float(bytes: &[u8], i: usize) -> Option<f32> {
        Some(f32::from_le_bytes(bytes.get(4 * i..4 * i + 4)?.try_into().ok()?))
    }
}

/// [`evaluated`] without the general evaluator, for the forms models use — `I` is
/// `f32(q)` or `f32(q) − z`, with `q` an 8- or 16-bit integer constant and `z` one too or
/// an integral literal; `S` an f32 constant or literal — read straight from the
/// constants' bytes (a transformer's weights are millions of elements: this takes a few
/// nanoseconds each, the evaluator tens). The results are the same: `f32(q) − f32(z)`
/// is exact in f32 for these integers, and `S` is read as it is. `None` for any other
/// form.
fn direct(k: &Kernel, consts: &[&Tensor], int: ExprId, scale: Option<ExprId>) -> Option<(Vec<i32>, Vec<f32>)> {
    let none = AffineIndex::constant(0, k.vars.len());
    // A load of a constant of a dtype `ok` accepts.
    let load = |e: ExprId, ok: &dyn Fn(DType) -> bool| -> Option<Leaf<'_>> {
        let Expr::Load { input, index, bounds: Bounds::InBounds } = &k.node(e).expr else { return None };
        let t = consts.get(*input as usize)?;
        (ok(t.dtype()) && t.dtype() == k.inputs[*input as usize].dtype)
            .then(|| Some(Leaf::Load { bytes: t.bytes(), dtype: t.dtype(), offset: load_offset(k, *input, index)? }))?
    };
    let small = |d: DType| matches!(d, DType::I8 | DType::U8 | DType::I16 | DType::U16);
    // `f32(q)`: q an 8- or 16-bit integer load, or an integer literal.
    let int_leaf = |e: ExprId| -> Option<Leaf<'_>> {
        let Expr::Cast { value, to: DType::F32, .. } = k.node(e).expr else { return None };
        match k.node(value).expr {
            Expr::Const(bits) if k.node(value).ty.is_int() => {
                let v = k.node(value).ty.to_i128(bits);
                (v.unsigned_abs() < 1 << 24).then_some(Leaf::Const(v as f32))
            }
            _ => load(value, &small),
        }
    };
    let literal = |e: ExprId| match k.node(e).expr {
        Expr::Const(bits) if k.node(e).ty == ScalarType::F32 => Some(Leaf::Const(f32::from_bits(bits as u32))),
        _ => None,
    };
    let (q, z) = match k.node(int).expr {
        Expr::Binary(BinaryOp::Sub, a, b) => (int_leaf(a)?, Some(int_leaf(b).or_else(|| literal(b))?)),
        _ => (int_leaf(int)?, None),
    };
    let s = match scale {
        Some(e) => Some(load(e, &|d| d == DType::F32).or_else(|| literal(e))?),
        None => None,
    };
    let Leaf::Load { bytes: qb, dtype: qd, offset: qo } = q else { return None };
    // The zero point: a load, or an integral literal.
    let (zb, zd, zo, zc) = match z {
        None => (&[][..], DType::I8, none.clone(), 0),
        Some(Leaf::Const(x)) if x.fract() == 0.0 && x.abs() < 16_777_216.0 => {
            (&[][..], DType::I8, none.clone(), x as i32)
        }
        Some(Leaf::Const(_)) => return None,
        Some(Leaf::Load { bytes, dtype, offset }) => (bytes, dtype, offset, 0),
    };
    let (sb, so, sc) = match s {
        None => (&[][..], none.clone(), 1.0),
        Some(Leaf::Const(x)) => (&[][..], none.clone(), x),
        Some(Leaf::Load { bytes, offset, .. }) => (bytes, offset, 0.0),
    };
    let (z_load, s_load) = (!zb.is_empty(), !sb.is_empty());
    let dims = k.output.shape.dims();
    let numel: usize = dims.iter().product();
    let rank = dims.len();
    let last = if rank == 0 { 1 } else { dims[rank - 1] };
    let rows = numel.checked_div(last).unwrap_or(0);
    let step = |o: &AffineIndex| if rank == 0 { 0 } else { o.of(rank as u32 - 1) };
    let start =
        |o: &AffineIndex, idx: &[i64]| (0..rank.saturating_sub(1)).fold(o.c, |acc, v| acc + o.of(v as u32) * idx[v]);
    let (qs, zs, ss) = (step(&qo), step(&zo), step(&so));
    let mut ints = Vec::with_capacity(numel);
    let mut scales = Vec::with_capacity(numel);
    let mut idx = vec![0i64; rank];
    let (mut lo, mut hi) = (0i32, 0i32);
    for _ in 0..rows {
        let (q0, z0, s0) = (start(&qo, &idx), start(&zo, &idx), start(&so, &idx));
        let at = ints.len();
        if qs == 1 && !z_load && matches!(qd, DType::I8 | DType::U8) {
            // (A row of 8-bit integers in a row: the common case, as one slice.)
            let row = qb.get(usize::try_from(q0).ok()?..usize::try_from(q0).ok()? + last)?;
            if qd == DType::I8 {
                ints.extend(row.iter().map(|&b| b as i8 as i32 - zc));
            } else {
                ints.extend(row.iter().map(|&b| b as i32 - zc));
            }
            let (rlo, rhi) = ints[at..].iter().fold((lo, hi), |(l, h), &w| (l.min(w), h.max(w)));
            (lo, hi) = (rlo, rhi);
            if s_load && ss == 1 {
                let from = usize::try_from(s0).ok()?.checked_mul(4)?;
                let row = sb.get(from..from + 4 * last)?;
                scales.extend(row.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
            } else {
                for j in 0..last as i64 {
                    scales.push(if s_load { Leaf::float(sb, usize::try_from(s0 + ss * j).ok()?)? } else { sc });
                }
            }
        } else {
            for j in 0..last as i64 {
                let qv = Leaf::int(qb, qd, usize::try_from(q0 + qs * j).ok()?)?;
                let zv = if z_load { Leaf::int(zb, zd, usize::try_from(z0 + zs * j).ok()?)? } else { zc };
                let w = qv - zv;
                lo = lo.min(w);
                hi = hi.max(w);
                ints.push(w);
                scales.push(if s_load { Leaf::float(sb, usize::try_from(s0 + ss * j).ok()?)? } else { sc });
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
    (lo >= -32768 && hi <= 32767).then_some((ints, scales))
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
    let mut b = KernelBuilder::rewriting(k, inputs);
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
                    Some(b.raw(
                        ScalarType::F32,
                        Expr::Load { input: k.inputs.len() as u32, index: idx, bounds: Bounds::InBounds },
                    ))
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
    let rank = dims.len();
    // Row by row (the last axis): where each row's scales are read is its own index with
    // the `along` axes at 0 (kept up to date as the index steps), the whole row when the
    // last axis is kept, else its first element.
    let last = dims.last().copied().unwrap_or(1).max(1);
    let bits = |x: &f32| x.to_bits();
    let mut idx = vec![0usize; rank];
    let mut base = 0usize;
    for (r, row) in s.chunks(last).enumerate() {
        let flat = r * last;
        if rank > 0 && !along[rank - 1] {
            if !row.iter().map(bits).eq(s.get(base..base + row.len())?.iter().map(bits)) {
                return None;
            }
            if base == flat {
                out.extend_from_slice(row);
            }
        } else {
            let want = s.get(base)?.to_bits();
            if row.iter().any(|x| x.to_bits() != want) {
                return None;
            }
            if base == flat {
                out.push(row[0]);
            }
        }
        for d in (0..rank.saturating_sub(1)).rev() {
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

/// Rewrites every integer contraction ([`crate::contraction::IntContraction`]) that
/// reads one constant operand `X` against a run-time operand `Y`, so that a microkernel
/// computes no sums of `X` on a call:
///
/// ```text
/// Σ_k (x − zx)·(y − zy)  =  Σ_k (x' − zx')·y − zy·S,   S = Σ_k (x − zx)
/// ```
///
/// `S` (per row of a constant left operand, per column of a right one: the variables
/// `X` reads besides the reduction) is computed here, once, as a new `i32` constant
/// input; where `zy` is a constant too (a literal, or a load of constants over the same
/// variables) `zy·S` is that constant instead. Where `X` and `Y` have the same
/// signedness (`i8 × i8`, TFLite's form), `X` is stored flipped, `x' = x ⊕ 0x80` of the
/// other 8-bit type (`x + 128` of `u8` for `i8`, `x − 128` of `i8` for `u8`), with
/// `zx' = zx ± 128`, so the operands differ in sign as `vpdpbusd` wants without
/// flipping `Y` on every call (which needs `X`'s sums by `δ = ±128`). A `zx'` the same
/// at every row or column is a literal (none where it is 0). Every step is exact in
/// wrapping `i32` arithmetic, so the kernel's values are the same bits. What is left
/// for `cpu::qgemm` to sum on a call is `Σ y` where `zx'` is not 0 (one column's or one
/// row's worth, once per block), instead of `X`'s sums per tile per workgroup (a
/// matrix-vector product on a constant matrix summed every row twice). Returns how many
/// dispatches were rewritten; constants they no longer read are left for
/// [`FlowProgram::remove_dead`].
pub fn fold_int_constant_sums(p: &mut FlowProgram) -> usize {
    let mut done = 0;
    // Flipped copies by source, and sum vectors by content: shared by every dispatch
    // that reads them (a recurrence's steps).
    let mut flipped: HashMap<BufferId, BufferId> = HashMap::new();
    let mut sums: HashMap<(Vec<usize>, Vec<u8>), BufferId> = HashMap::new();
    for d in 0..p.dispatches.len() {
        let Some(r) = int_sums(p, d) else { continue };
        let source = p.storage(p.dispatches[d].operands[r.input as usize]);
        let name = p.buffer(source).name.clone();
        let x = match r.flipped {
            None => p.dispatches[d].operands[r.input as usize],
            Some(t) => match flipped.get(&source) {
                Some(&b) => b,
                None => {
                    let b = p.add(t.ty().clone(), format!("{name}.flipped"), BufferKind::Const(t));
                    flipped.insert(source, b);
                    b
                }
            },
        };
        let s = r.sums.map(|t| {
            let key = (t.shape().dims().to_vec(), t.bytes().to_vec());
            match sums.get(&key) {
                Some(&b) => b,
                None => {
                    let b = p.add(t.ty().clone(), format!("{name}.sums"), BufferKind::Const(t));
                    sums.insert(key, b);
                    b
                }
            }
        });
        let dispatch = &mut p.dispatches[d];
        dispatch.operands[r.input as usize] = x;
        dispatch.operands.extend(s);
        dispatch.kernel = r.kernel;
        dispatch.class = classify(&dispatch.kernel);
        done += 1;
    }
    done
}

/// One rewrite of [`fold_int_constant_sums`]: the kernel, the constant operand's input,
/// its flipped copy (where it is flipped), and the sums (the new last input; none where
/// the run-time operand has no zero point).
struct IntSums {
    kernel: Kernel,
    input: u32,
    flipped: Option<Tensor>,
    sums: Option<Tensor>,
}

/// The value of `e` (bits of its type) with the variables at `vals` (`None`: a variable
/// not given), reading constant inputs `data`; `None` where `e` reads anything else.
fn value_at(k: &Kernel, data: &[Option<Vec<u64>>], e: ExprId, vals: &[Option<i64>]) -> Option<u64> {
    let node = k.node(e);
    Some(match &node.expr {
        Expr::Const(bits) => *bits,
        Expr::Var(v) => match vals.get(v.0 as usize)? {
            Some(x) => *x as u64,
            None if k.vars.get(v.0 as usize) == Some(&1) => 0,
            None => return None,
        },
        Expr::Cast { value, to, saturate } => {
            interp::cast(k.node(*value).ty, value_at(k, data, *value, vals)?, *to, *saturate)
        }
        Expr::Unary(op, a) => interp::unary(*op, k.node(*a).ty, value_at(k, data, *a, vals)?),
        Expr::Binary(op, a, b) => {
            interp::binary(*op, k.node(*a).ty, value_at(k, data, *a, vals)?, value_at(k, data, *b, vals)?)
        }
        Expr::Select(c, a, b) => {
            if value_at(k, data, *c, vals)? != 0 {
                value_at(k, data, *a, vals)?
            } else {
                value_at(k, data, *b, vals)?
            }
        }
        Expr::Load { input, index, bounds: Bounds::InBounds } => {
            let dims = k.inputs.get(*input as usize)?.shape.dims();
            let mut at = 0usize;
            for (&ix, &n) in index.iter().zip(dims) {
                let i = usize::try_from(value_at(k, data, ix, vals)? as i64).ok().filter(|&i| i < n)?;
                at = at * n + i;
            }
            *data.get(*input as usize)?.as_ref()?.get(at)?
        }
        Expr::Load { .. } | Expr::Reduce { .. } => return None,
    })
}

/// Where each step of a flat reduction over `vars` (row-major, the first outermost)
/// starts in an operand indexed by `off`, counted from `base`; `None` on overflow.
pub(crate) fn step_offsets(k: &Kernel, off: &AffineIndex, vars: &[u32], base: i64) -> Option<Vec<i64>> {
    let ext: Vec<u64> = vars.iter().map(|&v| k.vars[v as usize]).collect();
    let l: u64 = ext.iter().product();
    let mut starts = Vec::with_capacity(usize::try_from(l).ok()?);
    let mut digit = vec![0i64; ext.len()];
    for li in 0..l {
        let mut rest = li;
        for (i, &e) in ext.iter().enumerate().rev() {
            digit[i] = (rest % e) as i64;
            rest /= e;
        }
        let at = vars.iter().zip(&digit).try_fold(base, |acc, (&v, &x)| acc.checked_add(off.of(v).checked_mul(x)?));
        starts.push(at?);
    }
    Some(starts)
}

/// The inputs the expression `e` loads (outside any reduction).
fn inputs_read(k: &Kernel, e: ExprId, out: &mut Vec<u32>) {
    if let Expr::Load { input, .. } = &k.node(e).expr {
        if !out.contains(input) {
            out.push(*input);
        }
    }
    k.node(e).expr.for_each_operand(|o| inputs_read(k, o, out));
}

/// How many nodes of `k` take `e` as an operand.
fn users(k: &Kernel, e: ExprId) -> usize {
    let mut n = 0;
    for node in &k.nodes {
        node.expr.for_each_operand(|o| n += usize::from(o == e));
    }
    n
}

fn int_sums(p: &FlowProgram, d: usize) -> Option<IntSums> {
    let k = &p.dispatches[d].kernel;
    let ic = Contraction::of_int(k)?;
    let c = &ic.c;
    let konst = |input: u32| match &p.buffer(p.storage(*p.dispatches[d].operands.get(input as usize)?)).kind {
        BufferKind::Const(t) => Some(t),
        _ => None,
    };
    let (x, y) = match (konst(c.a.input), konst(c.b.input)) {
        (Some(_), None) => (&c.a, &c.b),
        (None, Some(_)) => (&c.b, &c.a),
        _ => return None,
    };
    let t = konst(x.input)?;
    let flip = x.dtype == y.dtype;
    let Expr::Reduce { vars: rvars, body, .. } = &k.node(c.reduce).expr else { return None };
    let rvars: Vec<u32> = rvars.iter().map(|v| v.0).collect();
    let Expr::Binary(BinaryOp::Mul, m0, m1) = k.node(*body).expr else { return None };
    // Each factor: (the factor, its cast, its load's input, its zero point).
    let factor = |e: ExprId| -> Option<(ExprId, ExprId, ExprId, u32, Option<ExprId>)> {
        let (cast, z) = match k.node(e).expr {
            Expr::Binary(BinaryOp::Sub, v, z) => (v, Some(z)),
            _ => (e, None),
        };
        let Expr::Cast { value, .. } = k.node(cast).expr else { return None };
        let Expr::Load { input, .. } = k.node(value).expr else { return None };
        Some((e, cast, value, input, z))
    };
    let (f0, f1) = (factor(m0)?, factor(m1)?);
    let (fx, fy) = if f0.3 == x.input { (f0, f1) } else { (f1, f0) };
    let (xside, xcast, xload, _, zx) = fx;
    let (yside, ycast, _, _, zy) = fy;
    if fx.3 != x.input || fy.3 != y.input || (zy.is_none() && !flip) || loads_of(k, x.input) != 1 {
        return None;
    }
    if users(k, xside) != 1 || users(k, yside) != 1 || users(k, xcast) != 1 || users(k, *body) != 1 {
        return None;
    }
    // The variables the sums run over: those X reads besides the reduction.
    let out_rank = k.out_rank() as u32;
    let svars: Vec<u32> = (0..k.vars.len() as u32).filter(|&v| x.offset.of(v) != 0 && !rvars.contains(&v)).collect();
    if svars.is_empty() || svars.iter().any(|&v| v >= out_rank) {
        return None;
    }
    let sdims: Vec<usize> = svars.iter().map(|&v| k.vars[v as usize] as usize).collect();
    let count: usize = sdims.iter().product();
    let kext: Vec<u64> = rvars.iter().map(|&v| k.vars[v as usize]).collect();
    let kk: u64 = kext.iter().product();
    if count == 0 || kk == 0 || (count as u64).checked_mul(kk)? > (1 << 30) {
        return None;
    }
    // The constants the zero points read.
    let mut data: Vec<Option<Vec<u64>>> = vec![None; k.inputs.len()];
    let mut read = Vec::new();
    for z in [zx, zy].into_iter().flatten() {
        inputs_read(k, z, &mut read);
    }
    for &i in &read {
        if let Some(t) = konst(i).filter(|t| t.shape().numel() <= 1 << 20) {
            data[i as usize] = Some(interp::decode(t));
        }
    }
    // Offsets of the reduction's steps in X (row-major over the reduction variables).
    let koffs = step_offsets(k, &x.offset, &rvars, 0)?;
    let xt = ScalarType::of_storage(t.dtype());
    let xs = interp::decode(t);
    let i32t = ScalarType::I32;
    let mut vals: Vec<Option<i64>> = vec![None; k.vars.len()];
    let mut idx = vec![0usize; svars.len()];
    let mut out = Vec::with_capacity(count);
    let mut zxs = Vec::with_capacity(count);
    let mut zy_const = zy.is_some();
    for _ in 0..count {
        for (&v, &i) in svars.iter().zip(&idx) {
            vals[v as usize] = Some(i as i64);
        }
        let z = match zx {
            Some(z) => i32t.to_i128(value_at(k, &data, z, &vals)?) as i64,
            None => 0,
        };
        zxs.push(z);
        let base = svars.iter().zip(&idx).fold(x.offset.c, |acc, (&v, &i)| acc + x.offset.of(v) * i as i64);
        let mut s = 0i64;
        for &o in &koffs {
            let at = usize::try_from(base + o).ok()?;
            s += xt.to_i128(*xs.get(at)?) as i64 - z;
        }
        let s = s as i32;
        let v = match zy.filter(|_| zy_const) {
            Some(zy) => match value_at(k, &data, zy, &vals) {
                Some(b) => s.wrapping_mul(i32t.to_i128(b) as i32),
                None => {
                    zy_const = false;
                    s
                }
            },
            None => s,
        };
        out.push(v);
        for a in (0..idx.len()).rev() {
            idx[a] += 1;
            if idx[a] < sdims[a] {
                break;
            }
            idx[a] = 0;
        }
    }
    if zy.is_some() && !zy_const {
        // (A zero point known only at run time: the sums alone, times it in the epilogue.)
        out.clear();
        idx.iter_mut().for_each(|i| *i = 0);
        for (n, z) in zxs.iter().enumerate() {
            let mut rest = n;
            for a in (0..idx.len()).rev() {
                idx[a] = rest % sdims[a];
                rest /= sdims[a];
            }
            let base = svars.iter().zip(&idx).fold(x.offset.c, |acc, (&v, &i)| acc + x.offset.of(v) * i as i64);
            let s: i64 = koffs.iter().map(|&o| xt.to_i128(xs[(base + o) as usize]) as i64 - z).sum();
            out.push(s as i32);
        }
    }
    let sums = match zy {
        Some(_) => Some(Tensor::from_vec(Shape::new(sdims.clone()).ok()?, out).ok()?),
        None => None,
    };
    // X flipped, and its zero point then.
    let (new_dtype, delta) = match (flip, t.dtype()) {
        (false, dt) => (dt, 0),
        (true, DType::I8) => (DType::U8, 128),
        (true, DType::U8) => (DType::I8, -128),
        _ => return None,
    };
    let flipped = flip
        .then(|| {
            let bytes: Vec<u8> = t.bytes().iter().map(|b| b ^ 0x80).collect();
            Tensor::new(TensorType::new(new_dtype, t.shape().clone()), bytes::Bytes::from(bytes)).ok()
        })
        .flatten();
    if flip && flipped.is_none() {
        return None;
    }
    let first = zxs[0] + delta;
    let uniform = zxs.iter().all(|&z| z + delta == first);
    // The kernel: X's load of the new dtype, its zero point `zx + δ` (a literal where
    // uniform, none where 0), Y's without its zero point, and the reduction less the
    // sums' term.
    let mut inputs = k.inputs.clone();
    inputs[x.input as usize] = TensorType::new(new_dtype, t.shape().clone());
    let s_input = inputs.len();
    inputs.extend(sums.as_ref().map(|s| s.ty().clone()));
    let mut b = KernelBuilder::rewriting(k, inputs);
    let mut map: Vec<ExprId> = Vec::with_capacity(k.nodes.len());
    for (i, node) in k.nodes.iter().enumerate() {
        let m = |e: ExprId| map[e.index()];
        let e = ExprId(i as u32);
        let new = if e == xload {
            b.raw(ScalarType::of_storage(new_dtype), node.expr.map_operands(m))
        } else if e == xside {
            let cast = if xcast == xside { b.raw(node.ty, node.expr.map_operands(m)) } else { m(xcast) };
            let z = if uniform {
                (first != 0).then(|| b.int(i32t, first))
            } else {
                let z = m(zx.unwrap_or(e));
                let dz = b.int(i32t, delta);
                Some(if zx.is_some() { b.raw(i32t, Expr::Binary(BinaryOp::Add, z, dz)) } else { dz })
            };
            match z {
                Some(z) => b.raw(i32t, Expr::Binary(BinaryOp::Sub, cast, z)),
                None => cast,
            }
        } else if e == yside && zy.is_some() {
            m(ycast)
        } else if e == c.reduce && zy.is_some() {
            let r = b.raw(node.ty, node.expr.map_operands(m));
            let index: Vec<ExprId> = svars.iter().map(|&v| b.var(crate::kernel::VarId(v))).collect();
            let s = b.raw(i32t, Expr::Load { input: s_input as u32, index, bounds: Bounds::InBounds });
            let term = match zy.filter(|_| !zy_const) {
                Some(zy) => b.raw(i32t, Expr::Binary(BinaryOp::Mul, m(zy), s)),
                None => s,
            };
            b.raw(i32t, Expr::Binary(BinaryOp::Sub, r, term))
        } else {
            b.raw(node.ty, node.expr.map_operands(m))
        };
        map.push(new);
    }
    let kernel = b.finish(map[k.root.index()]).ok()?;
    // The same contraction, its run-time operand without a zero point.
    let nic = Contraction::of_int(&kernel)?;
    let (nx, zy2) = if nic.c.a.input == x.input { (&nic.c.a, nic.zb) } else { (&nic.c.b, nic.za) };
    if nx.input != x.input || nx.dtype != new_dtype || zy2.is_some() || nic.c.dims != c.dims {
        return None;
    }
    Some(IntSums { kernel, input: x.input, flipped, sums })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::{interpret, BufferId, Dispatch};
    use crate::test_types::{buf, t};

    /// The producer `B[k, n] = (f32(q[k, n]) + offset) · s[0, n]` of a `[K, N]` weight,
    /// `q` an i8 constant (or a graph input, `q_input`), `s` per column (or, `s_rows`, one
    /// per row of B: along the reduction), and the product `x · B` reading it; with
    /// `shared`, B is a graph output too.
    fn program(offset: f32, q_input: bool, s_rows: bool, shared: bool) -> FlowProgram {
        let q: Vec<i64> = (0..7 * 5).map(|i| (i as i64 * 37) % 256 - 128).collect();
        let q = Tensor::from_i64(DType::I8, Shape::new(vec![7, 5]).unwrap(), &q).unwrap();
        program_of(q, offset, q_input, s_rows, shared)
    }

    /// [`program`] with the weight's integers `q` (`[7, 5]`).
    fn program_of(q: Tensor, offset: f32, q_input: bool, s_rows: bool, shared: bool) -> FlowProgram {
        let (m, kk, n) = (3usize, 7usize, 5usize);
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
        let (_, r) = b.matmul_sum(kk);
        let mm = b.finish(r).unwrap();
        let qkind = if q_input { BufferKind::Input(1) } else { BufferKind::Const(q.clone()) };
        let mut outputs = vec![BufferId(5)];
        if shared {
            outputs.push(BufferId(3));
        }
        FlowProgram {
            extents: Vec::new(),
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
        let x = Tensor::from_vec(Shape::new(vec![3, 7]).unwrap(), (0..21).map(|i| (i as f32 * 0.7).sin()).collect())
            .unwrap();
        let want = interpret(&p, std::slice::from_ref(&x)).unwrap()[0].to_vec::<f32>().unwrap();
        assert_eq!(dequantize_in_load(&mut p), 1);
        p.remove_dead();
        assert_eq!(p.dispatches.len(), 1);
        let d = &p.dispatches[0];
        assert_eq!(d.class, crate::class::KernelClass::Contraction);
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

    /// The direct reading of the common forms gives what the general evaluation gives:
    /// i8, u8 and i16 weights, zero points per column (u8 loads) and per tensor (an
    /// integer literal converted, an f32 literal), scales per column and literal.
    #[test]
    fn direct_reading_agrees_with_the_evaluation() {
        let (kk, n) = (6usize, 11usize);
        for (qd, zero, literal_scale) in [
            (DType::I8, 0, false),
            (DType::U8, 1, false),
            (DType::U8, 2, true),
            (DType::I16, 3, false),
            (DType::U8, 0, true),
        ] {
            let q: Vec<i64> =
                (0..kk * n).map(|i| (i as i64 * 97) % 256 - if qd == DType::U8 { 0 } else { 128 }).collect();
            let q = Tensor::from_i64(qd, Shape::new(vec![kk, n]).unwrap(), &q).unwrap();
            let z = Tensor::from_i64(
                DType::U8,
                Shape::new(vec![n]).unwrap(),
                &(0..n as i64).map(|i| i * 23 % 256).collect::<Vec<_>>(),
            )
            .unwrap();
            let sc = Tensor::from_vec(Shape::new(vec![1, n]).unwrap(), (0..n).map(|i| 0.5f32.powi(i as i32)).collect())
                .unwrap();
            let mut b = KernelBuilder::new("dq", vec![q.ty().clone(), z.ty().clone(), sc.ty().clone()], t(&[kk, n]));
            let o = b.out_index();
            let x = b.load(0, vec![o[0], o[1]]);
            let mut v = b.convert(x, ScalarType::F32);
            let zv = match zero {
                1 => {
                    let zl = b.load(1, vec![o[1]]);
                    Some(b.convert(zl, ScalarType::F32))
                }
                2 => {
                    let c = b.int(ScalarType::U8, 128);
                    Some(b.convert(c, ScalarType::F32))
                }
                3 => Some(b.float(ScalarType::F32, -7.0)),
                _ => None,
            };
            if let Some(zv) = zv {
                v = b.sub(v, zv);
            }
            let sv = if literal_scale {
                b.float(ScalarType::F32, 0.375)
            } else {
                let zero = b.index(0);
                b.load(2, vec![zero, o[1]])
            };
            let r = b.mul(sv, v);
            let k = b.finish(r).unwrap();
            let consts = [&q, &z, &sc];
            let (int, scale) = parts(&k).expect("integers times a scale");
            let fast = direct(&k, &consts, int, scale).expect("a form read directly");
            assert_eq!(Some(fast), evaluated(&k, &consts, int, scale), "{qd} zero {zero}");
        }
    }

    /// A 4-bit weight (two a byte) goes through the general evaluation and is stored
    /// widened, one i8 a value (0..15 fits too): four times smaller than f32, and what
    /// the tiles read.
    #[test]
    fn four_bit_weights_are_widened() {
        for (qd, want) in [(DType::I4, DType::I8), (DType::U4, DType::I8)] {
            let vals: Vec<i64> = (0..35).map(|i| if qd == DType::I4 { i % 16 - 8 } else { i % 16 }).collect();
            let q = Tensor::from_i64(qd, Shape::new(vec![7, 5]).unwrap(), &vals).unwrap();
            let mut p = program_of(q, 0.0, false, false, false);
            let x =
                Tensor::from_vec(Shape::new(vec![3, 7]).unwrap(), (0..21).map(|i| (i as f32 * 0.3).cos()).collect())
                    .unwrap();
            let want_out = interpret(&p, std::slice::from_ref(&x)).unwrap()[0].to_vec::<f32>().unwrap();
            assert_eq!(dequantize_in_load(&mut p), 1, "{qd}");
            p.remove_dead();
            let c = Contraction::of(&p.dispatches[0].kernel).unwrap();
            assert_eq!(c.b.dtype, want);
            let got = interpret(&p, &[x]).unwrap()[0].to_vec::<f32>().unwrap();
            for (g, w) in got.iter().zip(&want_out) {
                assert!((g - w).abs() <= 18.0 * f32::EPSILON / 2.0 * 7.0 * 16.0 * 0.05, "{g} vs {w}");
            }
        }
    }
    /// `out[m, n] = Σ_k (i32(a[m, k]) − za)·(i32(b[k, n]) − zb)` with `a` (`[4, 9]`) and
    /// `b` (`[9, 5]`) of `ad`/`bd`, one of them a constant (`a_const`); `za`: none, a
    /// literal, or per row of a constant vector; `zb`: none, a literal, or a graph input
    /// (known at run time only).
    fn int_program(ad: DType, bd: DType, a_const: bool, za: u8, zb: u8) -> (FlowProgram, Vec<Tensor>) {
        let (m, kk, n) = (4usize, 9usize, 5usize);
        let vals = |d: DType, len: usize, seed: i64| -> Tensor {
            let lo = if d == DType::U8 { 0 } else { -128 };
            let v: Vec<i64> = (0..len as i64).map(|i| (i * 37 + seed * 11) % 256 + lo).collect();
            let dims = if seed == 1 { vec![m, kk] } else { vec![kk, n] };
            Tensor::from_i64(d, Shape::new(dims).unwrap(), &v).unwrap()
        };
        let (a, bt) = (vals(ad, m * kk, 1), vals(bd, kk * n, 2));
        let zrow = Tensor::from_i64(ad, Shape::new(vec![m]).unwrap(), &[3, -2, 0, 5].map(|x| x.max(0) as i64)).unwrap();
        let zin = Tensor::from_i64(bd, Shape::new(vec![1]).unwrap(), &[7]).unwrap();
        let i32o = TensorType::new(DType::I32, Shape::new(vec![m, n]).unwrap());
        let mut b = KernelBuilder::new(
            "qmm",
            vec![a.ty().clone(), bt.ty().clone(), zrow.ty().clone(), zin.ty().clone()],
            i32o.clone(),
        );
        let o = b.out_index();
        let kv = b.new_var(kk as u64);
        let kx = b.var(kv);
        let la = b.load(0, vec![o[0], kx]);
        let lb = b.load(1, vec![kx, o[1]]);
        let mut ca = b.cast(la, DType::I32, false);
        let mut cb = b.cast(lb, DType::I32, false);
        match za {
            1 => {
                let z = b.int(ScalarType::I32, 6);
                ca = b.sub(ca, z);
            }
            2 => {
                let z = b.load(2, vec![o[0]]);
                let z = b.cast(z, DType::I32, false);
                ca = b.sub(ca, z);
            }
            _ => {}
        }
        match zb {
            1 => {
                let z = b.int(ScalarType::I32, -4);
                cb = b.sub(cb, z);
            }
            2 => {
                let zero = b.index(0);
                let z = b.load(3, vec![zero]);
                let z = b.cast(z, DType::I32, false);
                cb = b.sub(cb, z);
            }
            _ => {}
        }
        let pr = b.mul(ca, cb);
        let r = b.reduce(ReduceOp::Sum, vec![kv], pr);
        let kernel = b.finish(r).unwrap();
        let (ak, bk) = if a_const {
            (BufferKind::Const(a.clone()), BufferKind::Input(0))
        } else {
            (BufferKind::Input(0), BufferKind::Const(bt.clone()))
        };
        let p = FlowProgram {
            extents: Vec::new(),
            name: "p".into(),
            buffers: vec![
                buf(a.ty().clone(), ak),
                buf(bt.ty().clone(), bk),
                buf(zrow.ty().clone(), BufferKind::Const(zrow)),
                buf(zin.ty().clone(), BufferKind::Input(1)),
                buf(i32o, BufferKind::Result),
            ],
            dispatches: vec![Dispatch::new(
                kernel,
                vec![BufferId(0), BufferId(1), BufferId(2), BufferId(3)],
                BufferId(4),
                vec!["MatMulInteger".into()],
            )],
            inputs: if a_const { vec![BufferId(1), BufferId(3)] } else { vec![BufferId(0), BufferId(3)] },
            outputs: vec![BufferId(4)],
        };
        let given = if a_const { bt } else { a };
        (p, vec![given, zin])
    }

    /// The sums of a constant operand fold into a constant (the run-time operand's zero
    /// point hoisted, the constant flipped where the signs agree) and the program
    /// computes the same integers, checked by the interpreter on the program before.
    #[test]
    fn constant_operand_sums_fold_exactly() {
        let mut taken = 0;
        for (ad, bd) in [(DType::I8, DType::I8), (DType::U8, DType::I8), (DType::I8, DType::U8), (DType::U8, DType::U8)]
        {
            for a_const in [true, false] {
                for za in 0..3 {
                    for zb in 0..3 {
                        let (mut p, inputs) = int_program(ad, bd, a_const, za, zb);
                        let want = interpret(&p, &inputs).unwrap()[0].to_vec::<i32>().unwrap();
                        let n = fold_int_constant_sums(&mut p);
                        // The run-time side's zero point, or signs to flip: something to fold
                        // (not where the constant's own zero point is known at run time).
                        let (yz, same) = if a_const { (zb, ad == bd) } else { (za, ad == bd) };
                        let xz_known = a_const || zb != 2;
                        let expect = usize::from((yz != 0 || same) && xz_known);
                        assert_eq!(n, expect, "{ad:?} {bd:?} a_const {a_const} za {za} zb {zb}");
                        taken += n;
                        p.remove_dead();
                        let got = interpret(&p, &inputs).unwrap()[0].to_vec::<i32>().unwrap();
                        assert_eq!(got, want, "{ad:?} {bd:?} a_const {a_const} za {za} zb {zb}");
                        if n == 1 {
                            let k = &p.dispatches[0].kernel;
                            let ic = Contraction::of_int(k).unwrap();
                            let (x, zy) = if a_const { (&ic.c.a, ic.zb) } else { (&ic.c.b, ic.za) };
                            assert!(zy.is_none());
                            let y = if a_const { &ic.c.b } else { &ic.c.a };
                            assert_ne!(x.dtype, y.dtype);
                            // Nothing more to do.
                            assert_eq!(fold_int_constant_sums(&mut p), 0);
                        }
                    }
                }
            }
        }
        assert!(taken > 20);
    }
}
