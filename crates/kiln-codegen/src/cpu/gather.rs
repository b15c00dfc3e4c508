//! Table gathers as machine code (`iced-x86`, AVX2 `vgatherdps`): `out[q] = x[off(q)]`
//! with an in-bounds load whose element offset is *separable* — a sum of one term per
//! output dimension, `off(q) = c + Σ_d G_d(q_d)` — but not affine, so [`super::copy`]
//! does not take it. Each index expression of the load reads at most one output
//! variable, in any way (`div`, `rem`, selects on it): the interleave of ConvTranspose's
//! sub-pixel phases (`y[n, m, o] = P[n, (o + s') mod s, m, (o + s') div s]`:
//! `kiln_lower`'s linalg module), depth-to-space and pixel shuffles, transposes whose
//! innermost step is not 1, and any affine copy as well. An index that reads several
//! variables is taken apart at `+`, `−` and products by constants (a flat index over
//! digits that each read one variable, such as the interleave's flat phase).
//!
//! Every `G_d` is tabulated at compile time from the index expressions (evaluated with
//! the interpreter's integer semantics, so the tables are what the kernel means) and
//! carried after the code: one 32-bit offset per position of each outer dimension and of
//! the innermost one. A workgroup is one output row (every dimension but the innermost
//! longer than one: trailing axes of extent 1 fold into the offset), as for the other
//! copies; the first row of a range is decoded with divisions and the
//! rest step like an odometer. A row's source base is `x + (c + Σ G_d(q_d))·4`; its
//! elements are gathered 8 at a time with the innermost table as the index vector, the
//! last 1..7 under a lane mask (masked lanes are neither read nor written).
//!
//! A copy of 8-byte elements (an i64 index tensor broadcast or transposed) is the same
//! gather over pairs of 4-byte units: offsets doubled, the innermost dimension twice as
//! long with its table `2·G(q) + h` for unit `h` of position `q`.

use iced_x86::code_asm::*;
use kiln_flow::interp;
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ScalarType};

use super::asm::{end_rows, RowKernel, Tables, COORD};
use super::gemm::{no, NotHere, R};
use super::math::{has_vector_form, vector_scratch};
use super::vector::{Mask, Op, Src, Vx, V};
use super::vops::const_word;

/// Most table entries (over every dimension) a kernel carries.
const MOST_ENTRIES: u64 = 1 << 16;

/// A recognised gather.
struct Gather {
    /// Output dims, outer ones of extent 1 dropped and adjacent ones merged down to
    /// the odometer's registers (the rows in the same order).
    dims: Vec<i64>,
    /// The constant offset `c` (elements), dimensions of extent 1 folded in.
    c: i64,
    /// `G_d` per dimension of `dims` (elements); the innermost empty for an extent of 1.
    tables: Vec<Vec<i32>>,
    /// The load (the root, for a plain copy).
    load: ExprId,
}

/// The value of index expression `e` at `var = x` (`None` for what it does not
/// evaluate: loads, reductions, casts, other variables).
fn eval(k: &Kernel, e: ExprId, var: Option<u32>, x: i64) -> Option<u64> {
    let node = k.node(e);
    if !matches!(node.ty, ScalarType::I64 | ScalarType::Bool) {
        return None;
    }
    Some(match &node.expr {
        Expr::Var(v) if Some(v.0) == var => x as u64,
        Expr::Const(bits) => *bits,
        Expr::Binary(op, a, b) => {
            let t = k.node(*a).ty;
            interp::binary(*op, t, eval(k, *a, var, x)?, eval(k, *b, var, x)?)
        }
        Expr::Unary(op, a) => interp::unary(*op, k.node(*a).ty, eval(k, *a, var, x)?),
        Expr::Select(c, a, b) => {
            if eval(k, *c, var, x)? != 0 {
                eval(k, *a, var, x)?
            } else {
                eval(k, *b, var, x)?
            }
        }
        _ => return None,
    })
}

/// `scale · e` as a sum of terms that each read at most one variable, appended to
/// `out` as `(variable, scale, term)`: `e` itself when it reads one variable or none,
/// else taken apart at `+`, `−` and products by a constant (a flat index over several
/// digits, each computed from one variable).
fn split(
    k: &Kernel,
    free: &[Vec<u32>],
    e: ExprId,
    scale: i64,
    out: &mut Vec<(Option<u32>, i64, ExprId)>,
) -> Option<()> {
    let mut vars = free[e.index()].clone();
    vars.sort_unstable();
    vars.dedup();
    if vars.len() <= 1 {
        out.push((vars.first().copied(), scale, e));
        return Some(());
    }
    let constant = |x: ExprId| match k.node(x).expr {
        Expr::Const(bits) if k.node(x).ty == ScalarType::I64 => Some(bits as i64),
        _ => None,
    };
    match k.node(e).expr {
        Expr::Binary(BinaryOp::Add, a, b) => {
            split(k, free, a, scale, out)?;
            split(k, free, b, scale, out)
        }
        Expr::Binary(BinaryOp::Sub, a, b) => {
            split(k, free, a, scale, out)?;
            split(k, free, b, scale.checked_neg()?, out)
        }
        Expr::Binary(BinaryOp::Mul, a, b) => match (constant(a), constant(b)) {
            (_, Some(y)) => split(k, free, a, scale.checked_mul(y)?, out),
            (Some(x), _) => split(k, free, b, scale.checked_mul(x)?, out),
            _ => None,
        },
        _ => None,
    }
}

/// The one load of `k` (of input 0, in bounds) and whether the kernel is that load
/// alone; `None` when there are other loads or reductions.
fn the_load(k: &Kernel) -> Option<(ExprId, bool)> {
    let mut found = None;
    for (i, n) in k.nodes.iter().enumerate() {
        match &n.expr {
            Expr::Load { input: 0, bounds: Bounds::InBounds, .. } if found.is_none() => found = Some(ExprId(i as u32)),
            Expr::Load { .. } | Expr::Reduce { .. } => return None,
            _ => {}
        }
    }
    found.map(|l| (l, l == k.root))
}

/// Whether an elementwise kernel is one for this emitter rather than the row kernels or
/// the general loops: its one load is not at an affine offset stepping 0 or 1 element
/// along the output's rows (which those vectorise).
pub(crate) fn takes_elementwise(k: &Kernel) -> bool {
    let Some((load, false)) = the_load(k) else { return false };
    let Expr::Load { index, .. } = &k.node(load).expr else { return false };
    let rank = k.out_rank();
    let plain = rank > 0
        && kiln_flow::affine::load_offset(k, 0, index).is_some_and(|off| matches!(off.of((rank - 1) as u32), 0 | 1));
    !plain && recognise(k).is_ok()
}

fn recognise(k: &Kernel) -> R<Gather> {
    let Some((load, copy)) = the_load(k) else { return no("not one in-bounds load") };
    let Expr::Load { index, .. } = &k.node(load).expr else { return no("not a load") };
    let (x, o) = (&k.inputs[0], &k.output);
    let four = |d: kiln_ir::DType| d.storage_bytes(1) == 4;
    // 8-byte elements (i64 index tensors) move as pairs of 4-byte units: a copy only.
    let eight = copy && x.dtype == o.dtype && x.dtype.storage_bytes(1) == 8;
    if k.inputs.len() != 1 || !(eight || four(x.dtype) && four(o.dtype) && !(copy && x.dtype != o.dtype)) {
        return no("not a 4- or 8-byte copy of one input");
    }
    if !copy && (x.dtype != kiln_ir::DType::F32 || o.dtype != kiln_ir::DType::F32) {
        return no("an epilogue over a load that is not f32");
    }
    let rank = o.shape.rank();
    if rank == 0 || o.shape.numel() == 0 || index.len() != x.shape.rank() {
        return no("a copy of another rank");
    }
    let limit = i32::MAX as usize;
    if x.storage_bytes() > limit || o.storage_bytes() > limit {
        return no("an operand over 2 GiB");
    }
    let dims: Vec<i64> = o.shape.dims().iter().map(|&d| d as i64).collect();
    if dims.iter().map(|&d| d as u64).sum::<u64>() > MOST_ENTRIES {
        return no("offset tables too large");
    }
    let free = k.free_vars();
    let xd = x.shape.dims();
    let mut strides = vec![1i64; xd.len()];
    for i in (0..xd.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * xd[i + 1] as i64;
    }
    let mut c = 0i64;
    let mut g: Vec<Vec<i64>> = dims.iter().map(|&d| vec![0; d as usize]).collect();
    for (i, &e) in index.iter().enumerate() {
        let mut parts = Vec::new();
        split(k, &free, e, strides[i], &mut parts)
            .ok_or_else(|| NotHere("an index that reads several variables".into()))?;
        for (var, scale, term) in parts {
            let at = |q: i64| -> R<i64> {
                let v = eval(k, term, var, q).ok_or_else(|| NotHere("an index the tables cannot evaluate".into()))?;
                (v as i64).checked_mul(scale).ok_or_else(|| NotHere("an offset overflow".into()))
            };
            match var {
                Some(v) if (v as usize) < rank => {
                    for (q, slot) in g[v as usize].iter_mut().enumerate() {
                        *slot += at(q as i64)?;
                    }
                }
                Some(_) => return no("an index that reads a reduction variable"),
                None => c += at(0)?,
            }
        }
    }
    // Every offset inside the input (the verifier proved the load in bounds; this
    // keeps the tables honest).
    let lo = c + g.iter().map(|t| t.iter().copied().min().unwrap_or(0)).sum::<i64>();
    let hi = c + g.iter().map(|t| t.iter().copied().max().unwrap_or(0)).sum::<i64>();
    if lo < 0 || hi >= x.shape.numel() as i64 || g.iter().flatten().any(|&v| i32::try_from(v).is_err()) {
        return no("an offset outside the input");
    }
    // 8-byte elements: every offset in 4-byte units (doubled), the innermost dimension
    // twice as long, its position `2q + h` reading unit `h` of element `q`'s pair.
    let mut dims = dims;
    if eight {
        c *= 2;
        let last = g.len() - 1;
        for (d, t) in g.iter_mut().enumerate() {
            *t = if d == last {
                t.iter().flat_map(|&v| [2 * v, 2 * v + 1]).collect()
            } else {
                t.iter().map(|&v| 2 * v).collect()
            };
        }
        dims[last] *= 2;
        if dims.iter().map(|&d| d as u64).sum::<u64>() > MOST_ENTRIES {
            return no("offset tables too large");
        }
        if g.iter().flatten().any(|&v| i32::try_from(v).is_err()) {
            return no("an offset over 2 GiB");
        }
    }
    // Outer dimensions of extent 1 fold into `c`; while there are more than the
    // odometer holds, the adjacent pair with the fewest positions becomes one dimension
    // (its table the sums), which keeps the rows in order.
    // Innermost dimensions of extent 1 fold into `c` too, so that a row is the
    // innermost dimension longer than one (an image copied to `[C, L, 1]` runs rows of
    // `L`, not `C·L` rows of one).
    let mut rank = rank;
    while rank > 1 && dims[rank - 1] == 1 {
        c += g.pop().map_or(0, |t| t[0]);
        rank -= 1;
    }
    let inner = g.pop().unwrap_or_default();
    let mut outer: Vec<(i64, Vec<i64>)> = Vec::new();
    for (d, t) in g.into_iter().enumerate() {
        if dims[d] == 1 {
            c += t[0];
        } else {
            outer.push((dims[d], t));
        }
    }
    while outer.len() > COORD.len() {
        let i = (0..outer.len() - 1).min_by_key(|&i| outer[i].0 * outer[i + 1].0).unwrap_or(0);
        let (e2, t2) = outer.remove(i + 1);
        let (e1, t1) = std::mem::take(&mut outer[i]);
        let merged: Vec<i64> = t1.iter().flat_map(|&a| t2.iter().map(move |&b| a + b)).collect();
        outer[i] = (e1 * e2, merged);
        if outer.iter().map(|o| o.0 as u64).sum::<u64>() + dims[rank - 1] as u64 > MOST_ENTRIES {
            return no("offset tables too large");
        }
    }
    let mut vdims: Vec<i64> = outer.iter().map(|o| o.0).collect();
    vdims.push(dims[rank - 1]);
    let fit = |t: Vec<i64>| -> R<Vec<i32>> {
        t.into_iter().map(|v| i32::try_from(v).map_err(|_| NotHere("an offset over 2 GiB".into()))).collect()
    };
    let mut tables: Vec<Vec<i32>> = outer.into_iter().map(|(_, t)| fit(t)).collect::<R<_>>()?;
    // An innermost extent of 1 reads offset 0 of its (empty) table.
    if dims[rank - 1] == 1 {
        c += inner[0];
        tables.push(Vec::new());
    } else {
        tables.push(fit(inner)?);
    }
    Ok(Gather { dims: vdims, c, tables, load })
}

/// Emits `k` as a table gather (code and workgroup count), or says why not.
pub(crate) fn emit(k: &Kernel) -> R<(Vec<u8>, u64)> {
    let p = recognise(k)?;
    let RowKernel { mut a, mut t, done, outer, w, full, tail, rows } = RowKernel::begin(&p.dims)?;
    // The innermost table, padded to whole vectors (an extent of 1 reads offset 0).
    let mut inner: Vec<u32> =
        if p.tables[outer].is_empty() { vec![0] } else { p.tables[outer].iter().map(|&v| v as u32).collect() };
    inner.resize(inner.len().div_ceil(8) * 8, 0);
    let inner_label = t.words(&mut a, &inner);
    let outer_labels: Vec<Option<CodeLabel>> = p.tables[..outer]
        .iter()
        .map(|g| {
            (!g.is_empty()).then(|| {
                let mut words: Vec<u32> = g.iter().map(|&v| v as u32).collect();
                words.resize(words.len().div_ceil(8) * 8, 0);
                t.words(&mut a, &words)
            })
        })
        .collect();
    let c4 = i32::try_from(p.c * 4).map_err(|_| NotHere("an offset over 2 GiB".into()))?;
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    // The row's source: x + (c + Σ G_d(q_d))·4.
    a.lea(rsi, qword_ptr(r8 + c4))?;
    for d in 0..outer {
        if let Some(l) = outer_labels[d] {
            a.lea(rax, qword_ptr(l))?;
            a.movsxd(rdx, dword_ptr(rax + COORD[d] * 4))?;
            a.lea(rsi, qword_ptr(rsi + rdx * 4))?;
        }
    }
    a.lea(rcx, qword_ptr(inner_label))?;
    // One vector: gather (under the tail mask for the last), the epilogue, store.
    let vector = |a: &mut CodeAssembler,
                  t: &mut Tables,
                  at: AsmMemoryOperand,
                  idx: AsmMemoryOperand,
                  out: AsmMemoryOperand,
                  masked: bool|
     -> R<()> {
        a.vmovdqu(ymm1, idx)?;
        if masked {
            a.vmovaps(ymm2, ymm15)?;
            a.vxorps(ymm0, ymm0, ymm0)?;
        } else {
            a.vpcmpeqd(ymm2, ymm2, ymm2)?;
        }
        a.vgatherdps_3(ymm0, at, ymm2)?;
        let r = epilogue(k, p.load, &mut Vx { a: &mut *a, t: &mut *t, wide: false, held: &[] })?;
        let ry = super::asm::YMM[r.0 as usize];
        if masked {
            a.vmaskmovps(out, ymm15, ry)?;
        } else {
            a.vmovups(out, ry)?;
        }
        Ok(())
    };
    // Two interleaved runs (`T[2i] = T[0] + i`, `T[2i + 1] = T[1] + i`: a stride-2
    // phase interleave): blocks of 16 from two plain loads and two unpacks; the gather
    // takes the rest of the row.
    let pairs = interleaved_pair(&p.tables[outer]);
    let blocks = if pairs.is_some() { w / 16 } else { 0 };
    if let Some((first, second)) = pairs.filter(|_| blocks > 0) {
        let (f4, s4) = (first * 4, second * 4);
        // rax: the runs' byte offset; rdx: the output's.
        a.xor(eax, eax)?;
        a.xor(edx, edx)?;
        let mut each = a.create_label();
        a.set_label(&mut each)?;
        a.vmovups(ymm0, ymmword_ptr(rsi + rax + f4))?;
        a.vmovups(ymm2, ymmword_ptr(rsi + rax + s4))?;
        a.vunpcklps(ymm1, ymm0, ymm2)?;
        a.vunpckhps(ymm2, ymm0, ymm2)?;
        for (half, sel) in [(0, 0x20), (32, 0x31)] {
            a.vperm2f128(ymm0, ymm1, ymm2, sel)?;
            let r = epilogue(k, p.load, &mut Vx { a: &mut a, t: &mut t, wide: false, held: &[] })?;
            a.vmovups(ymmword_ptr(rdi + rdx + half), super::asm::YMM[r.0 as usize])?;
        }
        a.add(rax, 32)?;
        a.add(rdx, 64)?;
        a.cmp(rdx, (blocks * 64) as i32)?;
        a.jb(each)?;
    }
    if full > 2 * blocks {
        // rdx: the vector's byte offset in the row.
        a.mov(edx, (blocks * 64) as i32)?;
        let mut each = a.create_label();
        a.set_label(&mut each)?;
        vector(&mut a, &mut t, ymmword_ptr(rsi + ymm1 * 4), ymmword_ptr(rcx + rdx), ymmword_ptr(rdi + rdx), false)?;
        a.add(rdx, 32)?;
        a.cmp(rdx, (full * 32) as i32)?;
        a.jb(each)?;
    }
    if tail > 0 {
        let at = 32 * full as i32;
        vector(&mut a, &mut t, ymmword_ptr(rsi + ymm1 * 4), ymmword_ptr(rcx + at), ymmword_ptr(rdi + at), true)?;
    }
    a.add(rdi, (w * 4) as i32)?;
    a.inc(r10)?;
    a.cmp(r10, r11)?;
    a.jae(done)?;
    // The odometer: the innermost outer coordinate steps; at its extent it returns to
    // 0 and the next one steps.
    for d in (0..outer).rev() {
        a.inc(COORD[d])?;
        if d == 0 {
            break;
        }
        a.cmp(COORD[d], p.dims[d] as i32)?;
        a.jb(top)?;
        a.xor(COORD[d], COORD[d])?;
    }
    a.jmp(top)?;
    end_rows(a, &t, done, rows)
}

/// `(T[0], T[1])` when the innermost table is two interleaved runs of unit step,
/// `T[2i] = T[0] + i` and `T[2i + 1] = T[1] + i`, with offsets that fit 32 bits in bytes.
fn interleaved_pair(t: &[i32]) -> Option<(i32, i32)> {
    let (&a, &b) = (t.first()?, t.get(1)?);
    let ok =
        t.iter().enumerate().all(|(w, &v)| v as i64 == if w % 2 == 0 { a as i64 } else { b as i64 } + (w / 2) as i64);
    let fits = |x: i32| x.checked_mul(4).is_some() && (x as i64 + t.len() as i64) * 4 < i32::MAX as i64;
    (ok && fits(a) && fits(b)).then_some((a, b))
}

/// Evaluates `k`'s root over the gathered vector in `ymm0` (the load `load`), eight
/// lanes, one register per value from `ymm3`–`ymm14` (a plain copy: `ymm0` itself);
/// returns the result's register. The operations and their NaN rules are the contraction
/// epilogue's (`super::gemm`): `+ − × ÷`, `max`/`min` (NaN in either operand gives NaN),
/// comparisons and selects, `neg`, `abs`, `sqrt`, `exp`, `erf`, casts from f32 to f32.
fn epilogue(k: &Kernel, load: ExprId, vx: &mut Vx<'_>) -> R<V> {
    let mut reg: std::collections::HashMap<u32, V> = std::collections::HashMap::new();
    reg.insert(load.0, V(0));
    let mut free: Vec<V> = (3..15).rev().map(V).collect();
    value(k, k.root, vx, &mut reg, &mut free)
}

fn value(
    k: &Kernel,
    e: ExprId,
    vx: &mut Vx<'_>,
    reg: &mut std::collections::HashMap<u32, V>,
    free: &mut Vec<V>,
) -> R<V> {
    if let Some(&r) = reg.get(&e.0) {
        return Ok(r);
    }
    let node = k.node(e).clone();
    if !matches!(node.ty, ScalarType::F32 | ScalarType::Bool) {
        return no(format!("an epilogue value of type {}", node.ty.name()));
    }
    let take = |free: &mut Vec<V>| free.pop().ok_or_else(|| NotHere("an epilogue that needs more registers".into()));
    let r = match &node.expr {
        Expr::Const(bits) => {
            let bits = const_word(node.ty, *bits);
            let d = take(free)?;
            vx.mov(d, Src::C(bits))?;
            d
        }
        Expr::Cast { value: v, .. } if k.node(*v).ty == ScalarType::F32 && node.ty == ScalarType::F32 => {
            value(k, *v, vx, reg, free)?
        }
        Expr::Select(c, x, y) => {
            let (rc, rx, ry) =
                (value(k, *c, vx, reg, free)?, value(k, *x, vx, reg, free)?, value(k, *y, vx, reg, free)?);
            let d = take(free)?;
            vx.blend(d, Mask(rc.0), ry, rx)?;
            d
        }
        Expr::Binary(op, x, y) => {
            let (rx, ry) = (value(k, *x, vx, reg, free)?, value(k, *y, vx, reg, free)?);
            let d = take(free)?;
            let arith = match op {
                BinaryOp::Add => Some(Op::Add),
                BinaryOp::Sub => Some(Op::Sub),
                BinaryOp::Mul => Some(Op::Mul),
                BinaryOp::Div => Some(Op::Div),
                BinaryOp::And => Some(Op::And),
                BinaryOp::Or => Some(Op::Or),
                _ => None,
            };
            let pred = match op {
                BinaryOp::Eq => Some(0x00),
                BinaryOp::Ne => Some(0x04),
                BinaryOp::Lt => Some(0x11),
                BinaryOp::Le => Some(0x12),
                BinaryOp::Gt => Some(0x1E),
                BinaryOp::Ge => Some(0x1D),
                _ => None,
            };
            match (op, arith, pred) {
                (_, Some(o), _) => vx.op(o, d, rx, Src::R(ry))?,
                (_, _, Some(p)) => vx.cmp(Mask(d.0), rx, Src::R(ry), p)?,
                (BinaryOp::Max | BinaryOp::Min, _, _) => {
                    // vmaxps/vminps give the second operand when either is NaN: where
                    // x is NaN, x.
                    let m = take(free)?;
                    vx.op(if *op == BinaryOp::Max { Op::Max } else { Op::Min }, d, rx, Src::R(ry))?;
                    vx.cmp(Mask(m.0), rx, Src::R(rx), 3)?; // UNORD_Q
                    vx.blend(d, Mask(m.0), d, rx)?;
                    free.push(m);
                }
                _ => return no(format!("epilogue operation {}", op.name())),
            }
            d
        }
        Expr::Unary(op, x) if has_vector_form(*op) => {
            let rx = value(k, *x, vx, reg, free)?;
            let mut t = Vec::with_capacity(vector_scratch(*op));
            for _ in 0..vector_scratch(*op) {
                t.push(take(free)?);
            }
            let d = take(free)?;
            vx.unary(*op, d, rx, &t)?;
            free.extend(t);
            d
        }
        _ => return no("an epilogue operation without a vector form here"),
    };
    reg.insert(e.0, r);
    Ok(r)
}
