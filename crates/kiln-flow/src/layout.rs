//! Layout transforms that make kernels contractions ([`crate::contraction`]), so a
//! target's matrix microkernels apply to them, and lay their constant operands out the
//! way those microkernels read them. All run on the flow program and keep every
//! kernel's results unchanged:
//!
//! - [`materialize_padding`]: a convolution reads its input through `Pad` bounds
//!   (indices outside the tensor read 0). A dispatch in front of it writes the padded
//!   input once; the convolution then reads that in bounds, at indices shifted by the
//!   padding, which makes it a contraction (one extra pass over the input, instead of
//!   a bounds check per multiply-add). A depthwise convolution ([`crate::window`]) is
//!   left as it is: its kernel handles the border itself. An integer convolution
//!   ([`crate::contraction::IntContraction`]) is padded with its input's zero point.
//! - [`relayout_constants`]: a constant right operand that is not column-contiguous
//!   (`Gemm` with `transB = 1`, a recurrent layer's weights) is copied at compile time
//!   into a `[batch.., K, N]` constant, one copy however many dispatches read it so.
//!
//! - [`materialize_columns`]: a convolution with few output columns reads its image
//!   through a gathered copy laid out as the rows of one wide product (`im2col`); one
//!   that reads its image across a transpose reads a copy with the axes put back in
//!   the output's order instead, where that makes it a product over wide columns read
//!   in place (the image copied once rather than once per filter tap).
//! - [`pack_constants`]: the constant operands of contractions are copied into the
//!   panels of the target's tiles (weight pre-packing); the widths are the target's
//!   answer ([`PanelWidths`]), so this one runs when the target is known.
//!
//! Each transform is taken only when the rewritten kernel is a contraction.

use crate::affine::load_offset;
use crate::class::{classify, KernelClass};
use crate::contraction::Contraction;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, KernelBuilder, ReduceOp, VarId};
use crate::program::{BufferId, BufferKind, Dispatch, FlowProgram};
use crate::window::Depthwise;
use kiln_ir::{DType, Shape, Tensor, TensorType};
use std::collections::HashMap;

/// Puts a padding dispatch in front of every kernel that becomes a contraction when
/// its `Pad`-bounded operand is read in bounds from a padded copy. Returns how many
/// were added.
pub fn materialize_padding(p: &mut FlowProgram) -> usize {
    put_in_front(p, "padding", "padded", padded)
}

/// Rewrites every dispatch for which `rewrite` gives (its new kernel, a producer
/// kernel, the operand slot the producer's result replaces): a dispatch computing the
/// producer from that operand goes in front of it, into a new buffer named
/// `OPERAND.suffix`, and the dispatch reads that (in the slot, or in a new last input
/// when the rewritten kernel has one more). Returns how many were rewritten.
fn put_in_front(
    p: &mut FlowProgram,
    what: &str,
    suffix: &str,
    rewrite: impl Fn(&Kernel) -> Option<(Kernel, Kernel, u32)>,
) -> usize {
    let mut out: Vec<Dispatch> = Vec::with_capacity(p.dispatches.len());
    let mut added = 0;
    let dispatches = std::mem::take(&mut p.dispatches);
    for mut d in dispatches {
        if let Some((kernel, producer, input)) = rewrite(&d.kernel) {
            let source = d.operands[input as usize];
            let ty = producer.output.clone();
            let buf = p.add(ty, format!("{}.{suffix}", p.buffer(source).name), BufferKind::Result);
            out.push(
                Dispatch::new(
                    producer,
                    vec![source],
                    buf,
                    vec![format!("{what} for {}", d.sources.first().map_or("?", |s| s.as_str()))],
                )
                .guarded(d.guard.clone()),
            );
            if kernel.inputs.len() > d.operands.len() {
                d.operands.push(buf);
            } else {
                d.operands[input as usize] = buf;
            }
            d.kernel = kernel;
            d.class = classify(&d.kernel);
            added += 1;
        }
        out.push(d);
    }
    p.dispatches = out;
    added
}

/// Output columns below which a convolution's image is gathered into columns
/// ([`materialize_columns`]).
pub const GATHER_BELOW_COLUMNS: u64 = 32;
/// Largest gathered column tensor, in elements.
const GATHER_MOST: u64 = 1 << 22;

/// Gathers the image of a narrow convolution into columns ("im2col"): a contraction
/// whose column group is one narrow output axis (`ow` of a `k×k` convolution, fewer
/// than [`GATHER_BELOW_COLUMNS`] columns, with `oh` a batch variable) runs tiles that
/// are mostly empty lanes; one whose columns step more than 2 input elements (a stride-4
/// convolution) has no microkernel that reads them in place. A dispatch in front of it writes `B'[.., ci, kh, kw, oh,
/// ow] = x[.., ci, s·oh + kh, s·ow + kw]` and the kernel reads that instead, which
/// makes its columns `oh·OW + ow` (one product of `OH·OW` columns and `CI·KH·KW` rows
/// of B). A convolution whose image a reordered copy makes such a product
/// (`relaid`) reads that copy instead of gathered columns. Runs after fusion, so the
/// gather is not fused back. Returns how many were added.
pub fn materialize_columns(p: &mut FlowProgram) -> usize {
    put_in_front(p, "image", "image", relaid) + put_in_front(p, "columns", "columns", gathered)
}

/// Whether `k` is a contraction that a matrix microkernel reads in place
/// ([`Contraction::in_place`]), or will be once [`materialize_columns`] gathers its
/// image into columns. Fusion keeps this true of every kernel it was true of
/// (`crate::fuse`).
pub fn contraction_in_place(k: &Kernel) -> bool {
    let direct = |k: &Kernel| Contraction::of(k).is_some_and(|c| c.in_place(k));
    direct(k) || relaid(k).is_some() || gathered(k).is_some_and(|(g, _, _)| direct(&g))
}

/// `k` reading its image through a copy with the image's axes reordered to follow the
/// output's, the copy and the input slot it replaces; `None` unless the result is a
/// contraction that a microkernel reads in place over at least
/// [`GATHER_BELOW_COLUMNS`] columns, from a copy no larger than gathered columns would
/// be.
///
/// A convolution that took in a Transpose of its image (a 1-D convolution over an
/// `[N, L, C]` sequence, written as Transpose to `[N, C, L, 1]` and a `k×1` Conv)
/// reads its columns `C` elements apart and its rows are one column wide. Gathering
/// its columns would copy the image `KH·KW` times, one element per row; undoing the
/// transpose instead copies it once, along whole rows, and the product then reads the
/// copy in place (`B[ci·kh][l] = x'[ci, l + kh]`: columns 1 element apart). The same
/// holds of a right operand computed at run time and read across (a dequantised
/// weight `[CO, CI, K]` of a convolution whose output took in a Transpose to `[L, CO]`
/// is copied to `[CI, K, CO]`).
///
/// The order: each axis of the image is keyed by the innermost output variable its
/// index reads (an axis that reads none, an input channel, goes first), and the axes
/// are stably sorted by it, so the output's column variables read the innermost axes in
/// their own order.
fn relaid(k: &Kernel) -> Option<(Kernel, Kernel, u32)> {
    let c = Contraction::of(k)?;
    if c.b.dtype != DType::F32 || c.b.panel.is_some() || (c.in_place(k) && c.dims[1] >= GATHER_BELOW_COLUMNS) {
        return None;
    }
    let load = product_load(k, &c, c.b.input)?;
    let Expr::Load { index, .. } = &k.node(load).expr else { return None };
    let rank = k.out_rank();
    let keys: Vec<i64> = index
        .iter()
        .map(|&e| {
            let f = crate::affine::affine(k, e)?;
            Some((0..rank).rev().find(|&v| f.of(v as u32) != 0).map_or(-1, |v| v as i64))
        })
        .collect::<Option<_>>()?;
    let xty = k.inputs[c.b.input as usize].clone();
    let xd = xty.shape.dims();
    let mut perm: Vec<usize> = (0..index.len()).collect();
    perm.sort_by_key(|&a| keys[a]);
    // Only axes of extent 1 moved: the same bytes in the same order.
    let moved: Vec<usize> = perm.iter().copied().filter(|&a| xd[a] > 1).collect();
    if moved.windows(2).all(|w| w[0] < w[1]) {
        return None;
    }
    let ty = TensorType::new(DType::F32, Shape::new(perm.iter().map(|&a| xd[a]).collect::<Vec<_>>()).ok()?);
    let new_input = if loads_of(k, c.b.input) == 1 { c.b.input } else { k.inputs.len() as u32 };
    let kernel = rebuild_load(k, load, new_input, &ty, &mut |_, old| perm.iter().map(|&a| old[a]).collect())?;
    let wide = Contraction::of(&kernel)?;
    let cols = wide.dims[1].checked_mul(wide.dims[2])?;
    if !wide.in_place(&kernel) || wide.dims[1] < GATHER_BELOW_COLUMNS || xty.shape.numel() as u64 > cols {
        return None;
    }
    // The copy: image'[q] = image[q at the axes' old places].
    let mut b = KernelBuilder::new(format!("{}_image", k.name), vec![xty], ty);
    let q = b.out_index();
    let mut idx = vec![q[0]; q.len()];
    for (i, &a) in perm.iter().enumerate() {
        idx[a] = q[i];
    }
    let v = b.load(0, idx);
    Some((kernel, b.finish(v).ok()?, c.b.input))
}

/// `k` reading gathered columns, the gathering kernel and the input slot it replaces;
/// `None` unless the result is a contraction over the wider column group.
fn gathered(k: &Kernel) -> Option<(Kernel, Kernel, u32)> {
    // (An integer convolution's 8-bit image is gathered the same way.)
    let int = Contraction::of(k).is_none();
    let c = match Contraction::of(k) {
        Some(c) => c,
        None => Contraction::of_int(k)?.c,
    };
    let r = k.out_rank();
    let [n0] = c.n[..] else { return None };
    // Narrow rows, or a column step above 2 (which no microkernel reads in place). A
    // 1×1 convolution (one reduction variable) of stride 1 is a product over all its
    // positions already; strided, its rows are narrow like any other's.
    let step = c.b.offset.of(n0);
    let wide_step = step > 2;
    if (c.k.len() < 2 && step <= 1)
        || n0 as usize != r - 1
        || r < 3
        || (k.vars[n0 as usize] >= GATHER_BELOW_COLUMNS && !wide_step)
    {
        return None;
    }
    let x = (r - 2) as u32;
    if !c.batch.contains(&x) || c.a.offset.of(x) != 0 || c.b.offset.of(x) == 0 {
        return None;
    }
    // (A weight converted in its load is no image to gather. An integer image's
    // strided columns are gathered where its rows are narrow: the CPU's byte copy moves
    // a strided row a byte at a time, unrolled, up to 32 bytes; read in place instead,
    // efficientword's stride-2 3×3 convolution 486 → 486 on an 11×5 map took 0.60 ms,
    // its stride-1 twin over gathered columns 0.18 + 0.015.)
    if (c.b.dtype != DType::F32 && !int) || (int && step != 1 && k.vars[n0 as usize] >= GATHER_BELOW_COLUMNS) {
        return None;
    }
    let load = product_load(k, &c, c.b.input)?;
    let Expr::Load { index, .. } = &k.node(load).expr else { return None };
    // Columns tensor axes: the batch variables B reads (but x), the reduction, x, n0.
    let mut axes: Vec<u32> = c.batch.iter().copied().filter(|&v| v != x && c.b.offset.of(v) != 0).collect();
    axes.extend(&c.k);
    axes.extend([x, n0]);
    let dims: Vec<usize> = axes.iter().map(|&v| k.vars[v as usize] as usize).collect();
    if dims.iter().map(|&d| d as u64).product::<u64>() > GATHER_MOST {
        return None;
    }
    let ty = TensorType::new(if int { c.b.dtype } else { DType::F32 }, Shape::new(dims).ok()?);
    // The gathering kernel: its output index takes the place of `axes`; any other
    // variable B's index mentions has coefficient 0 there (extent 1), so it reads 0.
    let xty = k.inputs[c.b.input as usize].clone();
    let mut b = KernelBuilder::new(format!("{}_cols", k.name), vec![xty], ty.clone());
    let o = b.out_index();
    let mut memo: std::collections::HashMap<u32, ExprId> = std::collections::HashMap::new();
    let mut idx = Vec::with_capacity(index.len());
    for &e in index {
        idx.push(copy_index(k, e, &mut b, &axes, &o, &mut memo)?);
    }
    let v = b.load(0, idx);
    let gather = b.finish(v).ok()?;
    // The kernel reads the columns at its own variables.
    let new_input = if loads_of(k, c.b.input) == 1 { c.b.input } else { k.inputs.len() as u32 };
    let kernel = rebuild_load(k, load, new_input, &ty, &mut |b, _| axes.iter().map(|&v| b.var(VarId(v))).collect())?;
    let wide = if int { Contraction::of_int(&kernel)?.c } else { Contraction::of(&kernel)? };
    if wide.n != [x, n0] || !wide.epilogue_is_affine(&kernel) {
        return None;
    }
    Some((kernel, gather, c.b.input))
}

/// Copies index expression `e` of `k` into `b`, variable `axes[i]` read as `o[i]` and
/// any other variable as 0 (only extent-1 variables reach here with a coefficient).
fn copy_index(
    k: &Kernel,
    e: ExprId,
    b: &mut KernelBuilder,
    axes: &[u32],
    o: &[ExprId],
    memo: &mut std::collections::HashMap<u32, ExprId>,
) -> Option<ExprId> {
    if let Some(&id) = memo.get(&e.0) {
        return Some(id);
    }
    let node = k.node(e);
    let id = match &node.expr {
        Expr::Var(v) => match axes.iter().position(|&a| a == v.0) {
            Some(i) => o[i],
            None if k.vars[v.0 as usize] == 1 => b.index(0),
            None => return None,
        },
        Expr::Const(bits) => b.raw(node.ty, Expr::Const(*bits)),
        Expr::Binary(op, x, y) => {
            let (x, y) = (copy_index(k, *x, b, axes, o, memo)?, copy_index(k, *y, b, axes, o, memo)?);
            b.raw(node.ty, Expr::Binary(*op, x, y))
        }
        Expr::Unary(op, x) => {
            let x = copy_index(k, *x, b, axes, o, memo)?;
            b.raw(node.ty, Expr::Unary(*op, x))
        }
        _ => return None,
    };
    memo.insert(e.0, id);
    Some(id)
}

/// `k` reading its padded operand (in the operand's slot, or a new last input when
/// other loads read the operand too), the padding kernel and the operand's slot; `None`
/// unless the result is a contraction.
fn padded(k: &Kernel) -> Option<(Kernel, Kernel, u32)> {
    // A depthwise window handles its own border (`crate::window`).
    if Contraction::of(k).is_some() || Depthwise::of(k).is_some() {
        return None;
    }
    let body = k.nodes.iter().find_map(|n| match &n.expr {
        Expr::Reduce { op: ReduceOp::Sum, body, .. } => Some(*body),
        _ => None,
    })?;
    let Expr::Binary(BinaryOp::Mul, x, y) = k.node(body).expr else { return None };
    // An integer contraction's operand is `i32(load) − zero point` (padded with the
    // zero point, so the padding contributes nothing either way).
    let int = k.node(body).ty == crate::kernel::ScalarType::I32;
    let operand_load = |e: ExprId| {
        let e = match k.node(e).expr {
            Expr::Binary(BinaryOp::Sub, v, _) if int => v,
            _ => e,
        };
        match k.node(e).expr {
            Expr::Cast { value, .. } if int => value,
            _ => e,
        }
    };
    for load in [operand_load(x), operand_load(y)] {
        let Expr::Load { input, index, bounds: Bounds::Pad(bits) } = &k.node(load).expr else { continue };
        let ty = k.inputs.get(*input as usize)?;
        let dtype_ok = if int { matches!(ty.dtype, DType::U8 | DType::I8) } else { ty.dtype == DType::F32 };
        if !dtype_ok {
            continue;
        }
        // Range of every index; the padded tensor covers it.
        let dims = ty.shape.dims();
        let mut shift = Vec::with_capacity(dims.len());
        let mut pdims = Vec::with_capacity(dims.len());
        for (d, &e) in index.iter().enumerate() {
            let (lo, hi) = crate::affine::affine(k, e)?.range(k)?;
            let s = (-lo).max(0);
            shift.push(s);
            pdims.push(usize::try_from((hi + 1).max(dims[d] as i64) + s).ok()?);
        }
        if shift.iter().all(|&s| s == 0) && pdims.iter().zip(dims).all(|(p, d)| p == d) {
            continue;
        }
        let padded_ty = TensorType::new(ty.dtype, Shape::new(pdims).ok()?);
        // The padded copy takes the operand's place unless another load reads it too.
        let new_input = if loads_of(k, *input) == 1 { *input } else { k.inputs.len() as u32 };
        let kernel = rebuild_load(k, load, new_input, &padded_ty, &mut |b, idx| {
            idx.iter()
                .zip(&shift)
                .map(|(&e, &s)| {
                    let c = b.index(s);
                    b.add(e, c)
                })
                .collect()
        })?;
        let taken = if int {
            Contraction::of_int(&kernel).is_some_and(|c| c.c.epilogue_is_affine(&kernel))
        } else {
            Contraction::of(&kernel).is_some_and(|c| c.epilogue_is_affine(&kernel))
        };
        if !taken {
            continue;
        }
        // The padding kernel: padded[q] = x[q − shift] (the pad value outside x).
        let mut b = KernelBuilder::new(format!("{}_pad", k.name), vec![ty.clone()], padded_ty.clone());
        let q = b.out_index();
        let idx: Vec<ExprId> = q
            .iter()
            .zip(&shift)
            .map(|(&qd, &s)| {
                let c = b.index(-s);
                b.add(qd, c)
            })
            .collect();
        let v = b.load_with(0, idx, Bounds::Pad(*bits));
        let pad_kernel = b.finish(v).ok()?;
        return Some((kernel, pad_kernel, *input));
    }
    None
}

/// How many load nodes of `k` read input `input`.
fn loads_of(k: &Kernel, input: u32) -> usize {
    k.nodes.iter().filter(|n| matches!(&n.expr, Expr::Load { input: i, .. } if *i == input)).count()
}

/// The load of input `input` in the product under `c`'s reduction (under the
/// conversion of an operand converted in its load).
fn product_load(k: &Kernel, c: &Contraction, input: u32) -> Option<ExprId> {
    let Expr::Reduce { body, .. } = k.node(c.reduce).expr else { return None };
    let Expr::Binary(BinaryOp::Mul, x, y) = k.node(body).expr else { return None };
    // (An integer operand is `i32(load) − zero point`.)
    let through = |e: ExprId| {
        let e = match k.node(e).expr {
            Expr::Binary(BinaryOp::Sub, v, _) => v,
            _ => e,
        };
        match k.node(e).expr {
            Expr::Cast { value, .. } => value,
            _ => e,
        }
    };
    [x, y].into_iter().map(through).find(|&e| matches!(k.node(e).expr, Expr::Load { input: i, .. } if i == input))
}

/// `k` with load node `load` reading input `new_input` (of type `ty`: the operand's own
/// slot, or one appended to the inputs) in bounds at `index(builder, old indices)`.
fn rebuild_load(
    k: &Kernel,
    load: ExprId,
    new_input: u32,
    ty: &TensorType,
    index: &mut dyn FnMut(&mut KernelBuilder, &[ExprId]) -> Vec<ExprId>,
) -> Option<Kernel> {
    let mut inputs = k.inputs.clone();
    match inputs.get_mut(new_input as usize) {
        Some(slot) => *slot = ty.clone(),
        None => inputs.push(ty.clone()),
    }
    let mut b = KernelBuilder::rewriting(k, inputs);
    let mut map: Vec<ExprId> = Vec::with_capacity(k.nodes.len());
    for (i, node) in k.nodes.iter().enumerate() {
        let m = |e: ExprId| map[e.index()];
        let expr = match &node.expr {
            Expr::Load { index: old, .. } if i == load.index() => {
                let old: Vec<ExprId> = old.iter().map(|&e| m(e)).collect();
                let idx = index(&mut b, &old);
                Expr::Load { input: new_input, index: idx, bounds: Bounds::InBounds }
            }
            Expr::Load { input, index, bounds } => {
                Expr::Load { input: *input, index: index.iter().map(|&e| m(e)).collect(), bounds: *bounds }
            }
            Expr::Unary(op, a) => Expr::Unary(*op, m(*a)),
            Expr::Binary(op, a, c) => Expr::Binary(*op, m(*a), m(*c)),
            Expr::Select(c, a, e) => Expr::Select(m(*c), m(*a), m(*e)),
            Expr::Cast { value, to, saturate } => Expr::Cast { value: m(*value), to: *to, saturate: *saturate },
            Expr::Reduce { op, vars, body } => Expr::Reduce { op: *op, vars: vars.clone(), body: m(*body) },
            e @ (Expr::Var(_) | Expr::Const(_)) => e.clone(),
        };
        map.push(b.raw(node.ty, expr));
    }
    b.finish(map[k.root.index()]).ok()
}

/// Lays constant right operands out for the contraction they feed: where a kernel is
/// `Σ_k A · B` except that the constant `B` is not column-contiguous (`Gemm` with
/// `transB = 1`, a `MatMul` by a transposed weight, a recurrent layer's `W` and `R`),
/// `B` is copied at compile time into a new `[batch.., K, N]` constant and the kernel
/// reads that instead, which makes it a [`Contraction`]. `B` may also read batch
/// variables that `A` reads (one product per direction of a bidirectional layer).
/// Dispatches that read the same constant the same way (every time step of a
/// recurrence) share one copy. Returns how many operands were laid out.
pub fn relayout_constants(p: &mut FlowProgram) -> usize {
    let mut done = 0;
    let mut made: HashMap<(BufferId, Vec<(u64, i64)>, i64), BufferId> = HashMap::new();
    for d in 0..p.dispatches.len() {
        if Contraction::of(&p.dispatches[d].kernel).is_some() {
            continue;
        }
        let Some(r) = relayout_one(p, d) else { continue };
        let k = &mut p.dispatches[d].kernel;
        let old = (k.inputs[r.input].clone(), k.nodes[r.load].expr.clone());
        k.inputs[r.input] = r.ty.clone();
        if let Expr::Load { index: ix, .. } = &mut k.nodes[r.load].expr {
            *ix = r.index.clone();
        }
        if k.verify().is_err() || Contraction::of(k).is_none() {
            k.inputs[r.input] = old.0;
            k.nodes[r.load].expr = old.1;
            continue;
        }
        let key = (r.source, r.layout.clone(), r.c);
        let b = match made.get(&key) {
            Some(&b) => b,
            None => {
                let Some(tensor) = r.materialize(p) else {
                    let k = &mut p.dispatches[d].kernel;
                    k.inputs[r.input] = old.0;
                    k.nodes[r.load].expr = old.1;
                    continue;
                };
                let name = format!("{}.kn", p.buffer(r.source).name);
                let b = p.add(tensor.ty().clone(), name, BufferKind::Const(tensor));
                made.insert(key, b);
                b
            }
        };
        p.dispatches[d].operands[r.input] = b;
        p.dispatches[d].class = classify(&p.dispatches[d].kernel);
        done += 1;
    }
    done
}

/// The panel widths a target packs a contraction's constant operands at (`None`: that
/// operand stays as it is). A target answers this from its own tile shapes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PanelWidths {
    /// Rows per panel of a constant left operand (the tile's rows).
    pub a: Option<u64>,
    /// Columns per panel of a constant right operand (the tile's columns).
    pub b: Option<u64>,
}

/// Packs the constant operands of contractions into the panels their target's tiles
/// read ([`crate::contraction::Panel`]): a left operand in panels of rows, a right one
/// in panels of columns, each panel one contiguous stream over the whole reduction
/// (rows or columns past the end are zeros). The packing is done here, once, at compile
/// time; the kernel reads the packed constant at `[v div W, l, v rem W]`, which every
/// target can evaluate and the contraction recognises as a panel operand. An operand
/// that steps with batch variables gets one set of panels a batch position, as leading
/// axes (`[B…, P, L, W]` read at `[b…, v div W, l, v rem W]`). Operands that other loads
/// read too, or that read variables besides the panel variable, the reduction and the
/// batch, are left alone. A constant is packed only where every reader of it is an
/// operand packed into the same bytes (one reader, or the recurrent products of every
/// time step, which read one weight the same way): they then share one packed copy, so
/// no constant is carried twice and the constants stay the same size but for the zeros
/// that pad the last panel. Returns how many operands were packed. The target answers
/// `widths` from a kernel and its class (only contractions are packed); a packed
/// dispatch is classified again.
pub fn pack_constants(p: &mut FlowProgram, widths: &dyn Fn(&Kernel, KernelClass) -> PanelWidths) -> usize {
    let mut done = 0;
    // Readers of each buffer's storage: a constant is packed only where each of its
    // readers is an operand being packed the same way, so no constant is carried twice.
    let mut readers = vec![0usize; p.buffers.len()];
    for d in &p.dispatches {
        for &o in &d.operands {
            readers[p.storage(o).index()] += 1;
        }
    }
    for &o in &p.outputs {
        readers[p.storage(o).index()] += 1;
    }
    // The widths of every dispatch as it is before packing (the answer for the right
    // operand is the one for the kernel whose left operand is not packed yet).
    let ws: Vec<PanelWidths> = p.dispatches.iter().map(|d| widths(&d.kernel, d.class)).collect();
    // Left operands first, then right ones (a kernel is recognised again after its left
    // operand is packed: its nodes are renumbered).
    for left in [true, false] {
        let mut plans: HashMap<BufferId, SharedPack> = HashMap::new();
        for (d, &w) in ws.iter().enumerate() {
            let Some(c) = Contraction::of(&p.dispatches[d].kernel) else { continue };
            let (operand, width, var) =
                if left { (&c.a, w.a, Some(c.m)) } else { (&c.b, w.b, (c.n.len() == 1).then(|| c.n[0])) };
            let (Some(width), Some(var), None) = (width, var, operand.panel) else { continue };
            let source = p.storage(p.dispatches[d].operands[operand.input as usize]);
            if plans.get(&source).is_some_and(|x| !x.same) {
                continue;
            }
            let k = &p.dispatches[d].kernel;
            let Some((kernel, tensor)) = packed_one(p, d, k, &c, operand, var, width) else { continue };
            let reader = (d, kernel, operand.input);
            match plans.get_mut(&source) {
                None => {
                    plans.insert(source, SharedPack { tensor, readers: vec![reader], same: true });
                }
                Some(plan) => {
                    plan.same = plan.tensor == tensor;
                    plan.readers.push(reader);
                }
            }
        }
        let mut plans: Vec<(BufferId, SharedPack)> = plans.into_iter().collect();
        plans.sort_by_key(|x| x.0);
        for (source, SharedPack { tensor, readers: packed, same }) in plans {
            if !same || packed.len() != readers[source.index()] {
                continue;
            }
            let name =
                format!("{}.panels{}", p.buffer(source).name, tensor.ty().shape.dims().last().copied().unwrap_or(0));
            let buffer = p.add(tensor.ty().clone(), name, BufferKind::Const(tensor));
            readers.push(packed.len());
            for (d, kernel, input) in packed {
                p.dispatches[d].kernel = kernel;
                p.dispatches[d].operands[input as usize] = buffer;
                p.dispatches[d].class = classify(&p.dispatches[d].kernel);
                done += 1;
            }
        }
    }
    done
}

/// One constant's packing in [`pack_constants`]: the packed copy of its first reader,
/// the readers whose packing gives the same bytes (dispatch, new kernel, operand slot),
/// and whether every reader so far did.
struct SharedPack {
    tensor: Tensor,
    readers: Vec<(usize, Kernel, u32)>,
    same: bool,
}

/// Dispatch `d`'s kernel reading `operand` (a constant) in panels of `width` along
/// `var`, and the packed constant; `None` when the operand is not one to pack.
fn packed_one(
    p: &FlowProgram,
    d: usize,
    k: &Kernel,
    c: &Contraction,
    operand: &crate::contraction::Operand,
    var: u32,
    width: u64,
) -> Option<(Kernel, Tensor)> {
    let BufferKind::Const(t) = &p.buffer(p.storage(p.dispatches[d].operands[operand.input as usize])).kind else {
        return None;
    };
    let off = &operand.offset;
    // Batch variables the operand steps with (one set of panels each position, as
    // leading axes), outermost first.
    let batch: Vec<u32> = c.batch.iter().copied().filter(|&b| off.of(b) != 0 && k.vars[b as usize] > 1).collect();
    let reads_only = off.coef.iter().enumerate().all(|(v, &x)| {
        x == 0 || v as u32 == var || c.k.contains(&(v as u32)) || k.vars[v] == 1 || batch.contains(&(v as u32))
    });
    // (One panel would be the operand itself at another pitch; but an integer operand,
    // converted in its load, is packed whatever its width: the panel's zero columns let
    // a tile read whole vectors of it, where there are no masked byte loads.)
    let es = t.dtype().storage_bytes(1);
    let int = t.dtype() == operand.dtype && crate::contraction::INT_OPERANDS.contains(&t.dtype());
    let one_panel = k.vars[var as usize] <= width;
    if !(t.dtype() == DType::F32 || int) || width == 0 || (one_panel && !int) || !reads_only || off.of(var) == 0 {
        return None;
    }
    if loads_of(k, operand.input) != 1 {
        return None;
    }
    let load = product_load(k, c, operand.input)?;
    // The packed tensor: [B…, ⌈D / W⌉, L, W], zeros past D.
    let ext = k.vars[var as usize];
    let kext: Vec<u64> = c.k.iter().map(|&v| k.vars[v as usize]).collect();
    let l: u64 = kext.iter().product();
    let panels = ext.div_ceil(width);
    let bext: Vec<u64> = batch.iter().map(|&b| k.vars[b as usize]).collect();
    let positions: u64 = bext.iter().product();
    let per_position = panels.checked_mul(l)?.checked_mul(width)?;
    let count = per_position.checked_mul(positions)?;
    if count > (1 << 28) {
        return None;
    }
    // Where each step of the flat reduction starts in the operand (reduction
    // variables row-major, outermost first).
    let starts = crate::dequant::step_offsets(k, off, &c.k, off.c)?;
    // Copied as bytes (the tensor's own little-endian elements, `es` bytes each): a run
    // of columns at once where the operand steps one element per panel position.
    let (src, step) = (t.bytes(), off.of(var));
    let element = |i: i64| -> Option<std::ops::Range<usize>> {
        let at = usize::try_from(i).ok()?.checked_mul(es)?;
        (at + es <= src.len()).then(|| at..at + es)
    };
    let mut out = vec![0u8; count as usize * es];
    for (position, panels_out) in out.chunks_exact_mut(per_position as usize * es).enumerate() {
        // The batch position's first element in the operand (batch variables row-major).
        let mut rest = position as u64;
        let mut shift = 0i64;
        for (&b, &e) in batch.iter().zip(&bext).rev() {
            shift = shift.checked_add(off.of(b).checked_mul((rest % e) as i64)?)?;
            rest /= e;
        }
        for (pi, panel) in panels_out.chunks_exact_mut(l as usize * width as usize * es).enumerate() {
            let first = pi as u64 * width;
            let cols = (ext - first).min(width) as usize;
            for (row, &start) in panel.chunks_exact_mut(width as usize * es).zip(&starts) {
                let at = start.checked_add(shift)?.checked_add(step.checked_mul(first as i64)?)?;
                if step == 1 {
                    let (from, to) = (element(at)?.start, element(at + cols as i64 - 1)?.end);
                    row[..cols * es].copy_from_slice(&src[from..to]);
                } else {
                    for (r, x) in row[..cols * es].chunks_exact_mut(es).enumerate() {
                        x.copy_from_slice(&src[element(at + step * r as i64)?]);
                    }
                }
            }
        }
    }
    let mut dims: Vec<usize> = bext.iter().map(|&e| e as usize).collect();
    dims.extend([panels as usize, l as usize, width as usize]);
    let shape = Shape::new(dims).ok()?;
    let tensor = Tensor::new(TensorType::new(t.dtype(), shape), bytes::Bytes::from(out)).ok()?;
    let ty = tensor.ty().clone();
    let kernel = rebuild_load(k, load, operand.input, &ty, &mut |b, _| {
        let mut index: Vec<ExprId> = batch.iter().map(|&bv| b.var(VarId(bv))).collect();
        let v = b.var(VarId(var));
        let w = b.index(width as i64);
        let div = b.binary(BinaryOp::Div, v, w);
        let v2 = b.var(VarId(var));
        let rem = b.binary(BinaryOp::Rem, v2, w);
        // The flat reduction index, row-major over the reduction variables.
        let mut mid = b.index(0);
        let mut stride = 1i64;
        for (&kv, &e) in c.k.iter().zip(&kext).rev() {
            let x = b.var(VarId(kv));
            let s = b.index(stride);
            let term = b.mul(x, s);
            mid = b.add(mid, term);
            stride *= e as i64;
        }
        index.extend([div, mid, rem]);
        index
    })?;
    let packed = Contraction::of(&kernel)?;
    let side = if operand.input == c.a.input { packed.a.panel } else { packed.b.panel };
    (side.is_some_and(|s| s.var == var && s.width == width) && packed.epilogue_is_affine(&kernel))
        .then_some((kernel, tensor))
}

/// A relayout of one dispatch's constant right operand ([`relayout_constants`]).
struct Relayout {
    /// The kernel input and the load node that reads it.
    input: usize,
    load: usize,
    /// The constant (its storage).
    source: BufferId,
    /// `(extent, element step in the source)` of each axis of the copy: the batch
    /// variables, then `k`, then `n`.
    layout: Vec<(u64, i64)>,
    /// The source element of the copy's first element.
    c: i64,
    /// The copy's type and the load's new index.
    ty: TensorType,
    index: Vec<ExprId>,
}

impl Relayout {
    /// The copy: element `(i₀, …)` is source element `c + Σ iₐ·stepₐ`.
    fn materialize(&self, p: &FlowProgram) -> Option<Tensor> {
        let BufferKind::Const(t) = &p.buffer(self.source).kind else { return None };
        let src = t.to_vec::<f32>().ok()?;
        let count: u64 = self.layout.iter().map(|a| a.0).product();
        let mut out = Vec::with_capacity(usize::try_from(count).ok()?);
        let mut at = vec![0u64; self.layout.len()];
        for _ in 0..count {
            let mut off = self.c;
            for (&i, &(_, step)) in at.iter().zip(&self.layout) {
                off = off.checked_add(step.checked_mul(i as i64)?)?;
            }
            out.push(*src.get(usize::try_from(off).ok()?)?);
            for a in (0..at.len()).rev() {
                at[a] += 1;
                if at[a] < self.layout[a].0 {
                    break;
                }
                at[a] = 0;
            }
        }
        Tensor::from_vec(self.ty.shape.clone(), out).ok()
    }
}

/// The relayout of dispatch `d`'s constant right operand, if it has one to lay out.
fn relayout_one(p: &FlowProgram, d: usize) -> Option<Relayout> {
    let k = &p.dispatches[d].kernel;
    let rank = k.out_rank();
    if rank < 2 || k.output.dtype != DType::F32 {
        return None;
    }
    let n = (rank - 1) as u32;
    let (reduce, kv) = k.nodes.iter().enumerate().find_map(|(i, node)| match &node.expr {
        Expr::Reduce { op: ReduceOp::Sum, vars, .. } => {
            let wide: Vec<u32> = vars.iter().map(|v| v.0).filter(|&v| k.vars[v as usize] > 1).collect();
            (wide.len() == 1).then(|| (i, wide[0]))
        }
        _ => None,
    })?;
    let Expr::Reduce { body, .. } = &k.nodes[reduce].expr else { return None };
    let Expr::Binary(BinaryOp::Mul, x, y) = k.node(*body).expr else { return None };
    for (b, a) in [(y, x), (x, y)] {
        let Expr::Load { input, index, bounds: Bounds::InBounds } = &k.node(b).expr else { continue };
        let Expr::Load { input: ai, index: aix, bounds: Bounds::InBounds } = &k.node(a).expr else { continue };
        let (input, ai) = (*input as usize, *ai as usize);
        let source = p.storage(p.dispatches[d].operands[input]);
        let BufferKind::Const(t) = &p.buffer(source).kind else { continue };
        if t.dtype() != DType::F32 || input == ai {
            continue;
        }
        let (boff, aoff) = (load_offset(k, input as u32, index)?, load_offset(k, ai as u32, aix)?);
        // B reads k, n, extent-1 variables and batch variables: other output variables
        // (one that is the product's row instead leaves no contraction, checked after).
        let batch: Vec<u32> = (0..n).filter(|&v| boff.of(v) != 0 && k.vars[v as usize] > 1).collect();
        let fits =
            boff.coef.iter().enumerate().all(|(v, &c)| {
                c == 0 || v as u32 == kv || v as u32 == n || k.vars[v] == 1 || batch.contains(&(v as u32))
            });
        if !fits || aoff.of(n) != 0 || boff.of(n) == 1 || boff.of(n) == 0 {
            continue;
        }
        // No other load reads this input.
        if loads_of(k, input as u32) != 1 {
            continue;
        }
        // Var nodes for the batch variables, k and n placed before the load (its new index).
        let var_node = |v: u32| k.nodes[..b.index()].iter().position(|nd| nd.expr == Expr::Var(VarId(v)));
        let axes: Vec<u32> = batch.iter().copied().chain([kv, n]).collect();
        let mut new_index = Vec::with_capacity(axes.len());
        for &v in &axes {
            new_index.push(ExprId(var_node(v)? as u32));
        }
        let layout: Vec<(u64, i64)> = axes.iter().map(|&v| (k.vars[v as usize], boff.of(v))).collect();
        let dims: Vec<usize> = layout.iter().map(|a| usize::try_from(a.0).ok()).collect::<Option<_>>()?;
        let ty = TensorType::new(DType::F32, Shape::new(dims).ok()?);
        return Some(Relayout { input, load: b.index(), source, layout, c: boff.c, ty, index: new_index });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Shape;

    use crate::test_types::{buf, matmul_bias, program, seeded, t};

    /// `Gemm` with `transB = 1`: the constant is laid out `[K, N]` at compile time, the
    /// kernel becomes a contraction, and its results do not change.
    #[test]
    fn transposed_constant_laid_out() {
        let (m, kk, n) = (3usize, 5usize, 4usize);
        let mut kb = KernelBuilder::new("gemm", vec![t(&[m, kk]), t(&[n, kk])], t(&[m, n]));
        let o = kb.out_index();
        let kv = kb.new_var(kk as u64);
        let k = kb.var(kv);
        let x = kb.load(0, vec![o[0], k]);
        let w = kb.load(1, vec![o[1], k]);
        let p = kb.mul(x, w);
        let r = kb.reduce(ReduceOp::Sum, vec![kv], p);
        let kernel = kb.finish(r).unwrap();
        assert!(Contraction::of(&kernel).is_none());
        let xs: Vec<f32> = (0..m * kk).map(|i| i as f32 * 0.5 - 3.0).collect();
        let ws: Vec<f32> = (0..n * kk).map(|i| (i as f32 * 0.37).sin()).collect();
        let (xt, wt) = (
            Tensor::from_vec(Shape::new(vec![m, kk]).unwrap(), xs).unwrap(),
            Tensor::from_vec(Shape::new(vec![n, kk]).unwrap(), ws).unwrap(),
        );
        let want = crate::interp::run(&kernel, &[&xt, &wt]).unwrap();
        let mut prog = program(
            vec![
                buf(t(&[m, kk]), BufferKind::Input(0)),
                buf(t(&[n, kk]), BufferKind::Const(wt.clone())),
                buf(t(&[m, n]), BufferKind::Result),
            ],
            vec![Dispatch::new(kernel, vec![BufferId(0), BufferId(1)], BufferId(2), vec!["Gemm".into()])],
            vec![BufferId(0)],
            vec![BufferId(2)],
        );
        assert_eq!(relayout_constants(&mut prog), 1);
        let d = &prog.dispatches[0];
        let c = Contraction::of(&d.kernel).expect("a contraction now");
        assert_eq!(c.dims, [m as u64, n as u64, kk as u64]);
        let BufferKind::Const(laid) = &prog.buffer(d.operands[1]).kind else { panic!("not a constant") };
        assert_eq!(laid.shape().dims(), &[kk, n]);
        let got = crate::interp::run(&d.kernel, &[&xt, laid]).unwrap();
        assert_eq!(got, want);
        // Already a contraction: nothing to do.
        assert_eq!(relayout_constants(&mut prog), 0);
    }

    /// A recurrent layer's per-direction product, `out[d, b, q] = Σ_k h[d, b, k] ·
    /// r[d, q, k]`, read by three dispatches (three time steps): each becomes a
    /// contraction over one shared `[d, K, N]` copy, with its results unchanged; a
    /// dispatch reading only the first half of the rows gets a copy of its own.
    #[test]
    fn batched_transposed_constant_laid_out_once() {
        let (nd, b, kk, n) = (2usize, 3usize, 5usize, 6usize);
        let step = |rows: usize| {
            let mut kb = KernelBuilder::new("step", vec![t(&[nd, b, kk]), t(&[nd, n, kk])], t(&[nd, b, rows]));
            let o = kb.out_index();
            let kv = kb.new_var(kk as u64);
            let k = kb.var(kv);
            let h = kb.load(0, vec![o[0], o[1], k]);
            let r = kb.load(1, vec![o[0], o[2], k]);
            let p = kb.mul(h, r);
            let s = kb.reduce(ReduceOp::Sum, vec![kv], p);
            kb.finish(s).unwrap()
        };
        let (full, half) = (step(n), step(n / 2));
        assert!(Contraction::of(&full).is_none());
        let (h, r) = (seeded(&[nd, b, kk], 1.0), seeded(&[nd, n, kk], 2.0));
        let mut buffers =
            vec![buf(t(&[nd, b, kk]), BufferKind::Input(0)), buf(t(&[nd, n, kk]), BufferKind::Const(r.clone()))];
        let mut dispatches = Vec::new();
        for (i, k) in [&full, &full, &full, &half].into_iter().enumerate() {
            buffers.push(buf(k.output.clone(), BufferKind::Result));
            dispatches.push(Dispatch::new(k.clone(), vec![BufferId(0), BufferId(1)], BufferId(2 + i as u32), vec![]));
        }
        let mut prog = program(buffers, dispatches, vec![BufferId(0)], (2..6).map(BufferId).collect());
        assert_eq!(relayout_constants(&mut prog), 4);
        let copies: Vec<BufferId> = prog.dispatches.iter().map(|d| d.operands[1]).collect();
        assert!(copies[0] == copies[1] && copies[1] == copies[2] && copies[3] != copies[0], "{copies:?}");
        for (d, want_kernel) in prog.dispatches.iter().zip([&full, &full, &full, &half]) {
            assert_eq!(d.class, KernelClass::Contraction);
            let BufferKind::Const(laid) = &prog.buffer(d.operands[1]).kind else { panic!("not a constant") };
            let cols = want_kernel.output.shape.dims()[2];
            assert_eq!(laid.shape().dims(), &[nd, kk, cols]);
            let want = crate::interp::run(want_kernel, &[&h, &r]).unwrap();
            assert_eq!(crate::interp::run(&d.kernel, &[&h, laid]).unwrap(), want);
        }
    }

    /// A product by a constant `[K, N]` and a 1×1 convolution by constant weights:
    /// the constant operands are packed into panels (B in columns, A in rows, zeros
    /// past the end), the kernels read them as panel operands, and their results do
    /// not change. An operand that is a graph input, or a panel that would be the
    /// whole operand, or a constant something else reads too, is left alone.
    #[test]
    fn constants_packed_in_panels() {
        use crate::contraction::Panel;
        // out[m, n] = Σ_k x[m, k] · w[k, n] + bias[n]
        let (m, kk, n) = (5usize, 7usize, 37usize);
        let mm = matmul_bias(m, kk, n);
        // out[co, h, w] = Σ_ci f[co, ci, 0, 0] · x[ci, h, w]
        let (co, ci, hw) = (10usize, 3usize, 4usize);
        let mut kb = KernelBuilder::new("pw", vec![t(&[ci, hw, hw]), t(&[co, ci, 1, 1])], t(&[co, hw, hw]));
        let o = kb.out_index();
        let (cv, kh, kw) = (kb.new_var(ci as u64), kb.new_var(1), kb.new_var(1));
        let (c, h, w) = (kb.var(cv), kb.var(kh), kb.var(kw));
        let x = kb.load(0, vec![c, o[1], o[2]]);
        let f = kb.load(1, vec![o[0], c, h, w]);
        let pr = kb.mul(f, x);
        let s = kb.reduce(ReduceOp::Sum, vec![cv, kh, kw], pr);
        let pw = kb.finish(s).unwrap();
        let (xt, wt, bt) = (seeded(&[m, kk], 1.0), seeded(&[kk, n], 2.0), seeded(&[n], 3.0));
        let (it, ft) = (seeded(&[ci, hw, hw], 4.0), seeded(&[co, ci, 1, 1], 5.0));
        let want_mm = crate::interp::run(&mm, &[&xt, &wt, &bt]).unwrap();
        let want_pw = crate::interp::run(&pw, &[&it, &ft]).unwrap();
        let mut prog = program(
            vec![
                buf(t(&[m, kk]), BufferKind::Input(0)),
                buf(t(&[kk, n]), BufferKind::Const(wt.clone())),
                buf(t(&[n]), BufferKind::Const(bt.clone())),
                buf(t(&[m, n]), BufferKind::Result),
                buf(t(&[ci, hw, hw]), BufferKind::Input(1)),
                buf(t(&[co, ci, 1, 1]), BufferKind::Const(ft.clone())),
                buf(t(&[co, hw, hw]), BufferKind::Result),
            ],
            vec![
                Dispatch::new(mm, vec![BufferId(0), BufferId(1), BufferId(2)], BufferId(3), vec![]),
                Dispatch::new(pw, vec![BufferId(4), BufferId(5)], BufferId(6), vec![]),
            ],
            vec![BufferId(0), BufferId(4)],
            vec![BufferId(3), BufferId(6)],
        );
        // A panel as wide as the operand is no packing at all.
        let whole = |_: &Kernel, _: KernelClass| PanelWidths { a: Some(16), b: Some(64) };
        assert_eq!(pack_constants(&mut prog.clone(), &whole), 0);
        let widths = |_: &Kernel, _: KernelClass| PanelWidths { a: Some(4), b: Some(16) };
        // A constant with another reader (here: it is also an output) stays as it is.
        let mut shared = prog.clone();
        shared.outputs.push(BufferId(1));
        assert_eq!(pack_constants(&mut shared, &widths), 1);
        assert_eq!(shared.dispatches[0].operands[1], BufferId(1));
        assert_eq!(pack_constants(&mut prog, &widths), 2);
        let konst = |b: BufferId| match &prog.buffer(b).kind {
            BufferKind::Const(t) => t.clone(),
            other => panic!("{other:?}"),
        };
        // The product: B in 3 panels of 16 columns over K = 7; x, a graph input, as it was.
        let d = &prog.dispatches[0];
        let c = Contraction::of(&d.kernel).expect("still a contraction");
        assert_eq!((c.a.panel, c.b.panel), (None, Some(Panel { var: 1, width: 16, stride: 7 * 16 })));
        let packed = konst(d.operands[1]);
        assert_eq!(packed.shape().dims(), &[3, kk, 16]);
        let pv = packed.to_vec::<f32>().unwrap();
        let wv = wt.to_vec::<f32>().unwrap();
        // [panel 1, k 2, column 5] is w[2, 21]; past column 36, zeros.
        assert_eq!(pv[(kk + 2) * 16 + 5], wv[2 * n + 21]);
        assert!(pv[(2 * kk + 2) * 16 + 5..(2 * kk + 3) * 16].iter().all(|&x| x == 0.0));
        assert_eq!(crate::interp::run(&d.kernel, &[&xt, &packed, &bt]).unwrap(), want_mm);
        // The convolution: its weights in 3 panels of 4 output channels over ci.
        let d = &prog.dispatches[1];
        let c = Contraction::of(&d.kernel).expect("still a contraction");
        assert_eq!((c.a.panel, c.b.panel), (Some(Panel { var: 0, width: 4, stride: 3 * 4 }), None));
        let packed = konst(d.operands[1]);
        assert_eq!(packed.shape().dims(), &[3, ci, 4]);
        assert_eq!(crate::interp::run(&d.kernel, &[&it, &packed]).unwrap(), want_pw);
        // Packed once: nothing more to do.
        assert_eq!(pack_constants(&mut prog, &widths), 0);
    }

    /// A constant read the same way by several products (a recurrent weight, read by the
    /// product of every time step) is packed once, and every reader reads that copy; if
    /// one reader would read it in another layout (or not packed at all), no reader's
    /// copy is made, so the constant is never carried twice.
    #[test]
    fn constants_shared_by_products_packed_once() {
        let (m, kk, n) = (1usize, 9usize, 37usize);
        let (wt, bt) = (seeded(&[kk, n], 2.0), seeded(&[n], 3.0));
        let xs: Vec<Tensor> = (0..3).map(|i| seeded(&[m, kk], 10.0 + i as f32)).collect();
        // Three products of the same weight and bias, each of its own input.
        let build = |readers: usize| {
            let mut buffers =
                vec![buf(t(&[kk, n]), BufferKind::Const(wt.clone())), buf(t(&[n]), BufferKind::Const(bt.clone()))];
            let mut dispatches = Vec::new();
            for i in 0..readers {
                let x = BufferId(buffers.len() as u32);
                buffers.push(buf(t(&[m, kk]), BufferKind::Input(i)));
                buffers.push(buf(t(&[m, n]), BufferKind::Result));
                let out = BufferId(x.0 + 1);
                dispatches.push(Dispatch::new(matmul_bias(m, kk, n), vec![x, BufferId(0), BufferId(1)], out, vec![]));
            }
            let inputs = (0..readers).map(|i| BufferId(2 + 2 * i as u32)).collect();
            let outputs = (0..readers).map(|i| BufferId(3 + 2 * i as u32)).collect();
            program(buffers, dispatches, inputs, outputs)
        };
        let widths = |_: &Kernel, _: KernelClass| PanelWidths { a: None, b: Some(16) };
        let mut prog = build(3);
        let before = prog.buffers.len();
        assert_eq!(pack_constants(&mut prog, &widths), 3);
        assert_eq!(prog.buffers.len(), before + 1, "one packed copy");
        let packed = prog.dispatches[0].operands[1];
        for (i, d) in prog.dispatches.iter().enumerate() {
            assert_eq!(d.operands[1], packed, "reader {i}");
            let BufferKind::Const(pt) = &prog.buffer(packed).kind else { panic!("not a constant") };
            let want = crate::interp::run(&matmul_bias(m, kk, n), &[&xs[i], &wt, &bt]).unwrap();
            assert_eq!(crate::interp::run(&d.kernel, &[&xs[i], pt, &bt]).unwrap(), want, "reader {i}");
        }
        // One reader asks for another panel width: the readers would need two copies.
        // (The widths are asked once per dispatch, in order.)
        let mut prog = build(3);
        let counted = std::cell::Cell::new(0usize);
        let uneven = |_: &Kernel, _: KernelClass| {
            counted.set(counted.get() + 1);
            PanelWidths { a: None, b: Some(if counted.get() == 2 { 8 } else { 16 }) }
        };
        assert_eq!(pack_constants(&mut prog, &uneven), 0);
        assert_eq!(counted.get(), 3);
        assert!(prog.dispatches.iter().all(|d| d.operands[1] == BufferId(0)));
        // One reader does not take packing: the others keep the original too.
        let mut prog = build(3);
        let counted = std::cell::Cell::new(0usize);
        let partial = |_: &Kernel, _: KernelClass| {
            counted.set(counted.get() + 1);
            PanelWidths { a: None, b: (counted.get() != 3).then_some(16) }
        };
        assert_eq!(pack_constants(&mut prog, &partial), 0);
        assert!(prog.dispatches.iter().all(|d| d.operands[1] == BufferId(0)));
    }

    /// A 1-D convolution over a `[N, L, C]` sequence that took in the Transpose to
    /// `[N, C, L, 1]` (a `KH×1` Conv, as tf2onnx writes `Conv1D`), with a bias:
    /// `out[n, co, l, 0] = Σ x[n, l + kh, ci] · w[co, ci, kh] + b[co]`, reading the
    /// sequence at its own `[N, L, C, 1]` shape.
    fn conv1d_across(n: usize, l: usize, c: usize, co: usize, kh: usize) -> Kernel {
        let ol = l - kh + 1;
        let mut b =
            KernelBuilder::new("conv", vec![t(&[n, l, c, 1]), t(&[co, c, kh, 1]), t(&[co])], t(&[n, co, ol, 1]));
        let o = b.out_index();
        let (ci, y, x) = (b.new_var(c as u64), b.new_var(kh as u64), b.new_var(1));
        let (cv, yv, xv) = (b.var(ci), b.var(y), b.var(x));
        let pos = b.add(o[2], yv);
        let col = b.add(o[3], xv);
        let xin = b.load(0, vec![o[0], pos, cv, col]);
        let wt = b.load(1, vec![o[1], cv, yv, xv]);
        let p = b.mul(xin, wt);
        let r = b.reduce(ReduceOp::Sum, vec![ci, y, x], p);
        let bias = b.load(2, vec![o[1]]);
        let y = b.add(r, bias);
        b.finish(y).unwrap()
    }

    fn filled(dims: &[usize], f: f32) -> Tensor {
        let n: usize = dims.iter().product();
        Tensor::from_vec(Shape::new(dims.to_vec()).unwrap(), (0..n).map(|i| (i as f32 * f).sin()).collect()).unwrap()
    }

    /// A convolution reading its image across a transpose: with wide output rows, the
    /// image is copied once with its axes in the output's order (`[C, N, L, 1]`: the
    /// input channel first, then the axes that follow the output's) and the product
    /// reads that copy in place over all `L − KH + 1` positions; with narrow rows, the
    /// copy would not make wide columns, and the columns are gathered as before. Both
    /// programs compute what the kernel did.
    #[test]
    fn image_read_across_a_transpose_relaid() {
        for (n, l, c, co, kh, relaid) in [(1, 40, 5, 3, 3, true), (2, 45, 7, 4, 5, true), (1, 12, 6, 4, 3, false)] {
            let kernel = conv1d_across(n, l, c, co, kh);
            let ol = l - kh + 1;
            let before = Contraction::of(&kernel).expect("a contraction");
            // Rows of one column (`ow`): the positions read C elements apart are batch.
            assert_eq!(before.dims, [co as u64, 1, (c * kh) as u64]);
            assert!(contraction_in_place(&kernel));
            let (xs, ws, bs) = (filled(&[n, l, c, 1], 0.7), filled(&[co, c, kh, 1], 0.3), filled(&[co], 1.1));
            let want = crate::interp::run(&kernel, &[&xs, &ws, &bs]).unwrap();
            let mut prog = program(
                vec![
                    buf(t(&[n, l, c, 1]), BufferKind::Input(0)),
                    buf(t(&[co, c, kh, 1]), BufferKind::Const(ws.clone())),
                    buf(t(&[co]), BufferKind::Const(bs.clone())),
                    buf(t(&[n, co, ol, 1]), BufferKind::Result),
                ],
                vec![Dispatch::new(
                    kernel,
                    vec![BufferId(0), BufferId(1), BufferId(2)],
                    BufferId(3),
                    vec!["Transpose + Conv".into()],
                )],
                vec![BufferId(0)],
                vec![BufferId(3)],
            );
            assert_eq!(materialize_columns(&mut prog), 1);
            let (copy, conv) = (&prog.dispatches[0], &prog.dispatches[1]);
            assert_eq!(
                copy.sources,
                [if relaid { "image for Transpose + Conv" } else { "columns for Transpose + Conv" }]
            );
            let copied = crate::interp::run(&copy.kernel, &[&xs]).unwrap();
            let wide = Contraction::of(&conv.kernel).expect("still a contraction");
            assert!(wide.in_place(&conv.kernel));
            if relaid {
                // The image once, channels first; the product over every position.
                assert_eq!(prog.buffer(copy.result).ty.shape.dims(), &[c, n, l, 1]);
                assert_eq!(
                    (wide.dims, wide.column_step(&wide.b.offset)),
                    ([co as u64, ol as u64, (c * kh) as u64], Some(1))
                );
            } else {
                // Gathered columns: the image once per filter tap.
                assert_eq!(prog.buffer(copy.result).ty.shape.numel(), c * kh * ol * n);
            }
            assert_eq!(conv.operands, vec![copy.result, BufferId(1), BufferId(2)]);
            let got = crate::interp::run(&conv.kernel, &[&copied, &ws, &bs]).unwrap();
            assert_eq!(got, want, "{n}×{l}×{c} → {co}, {kh} taps");
            assert_eq!(materialize_columns(&mut prog), 0);
        }
    }

    /// A 3×3 convolution with padding 1: after materialisation it is a contraction, a
    /// padding dispatch comes first, and the two together compute what it did.
    #[test]
    fn padding_materialised() {
        let (c, h, w, co) = (2usize, 5usize, 6usize, 3usize);
        let mut b = KernelBuilder::new("conv", vec![t(&[1, c, h, w]), t(&[co, c, 3, 3])], t(&[1, co, h, w]));
        let o = b.out_index();
        let (ci, y, x) = (b.new_var(c as u64), b.new_var(3), b.new_var(3));
        let (cv, yv, xv) = (b.var(ci), b.var(y), b.var(x));
        let m1 = b.index(-1);
        let ih = b.add(o[2], yv);
        let ih = b.add(ih, m1);
        let iw = b.add(o[3], xv);
        let iw = b.add(iw, m1);
        let xin = b.load_with(0, vec![o[0], cv, ih, iw], Bounds::Pad(0));
        let wt = b.load(1, vec![o[1], cv, yv, xv]);
        let p = b.mul(xin, wt);
        let r = b.reduce(ReduceOp::Sum, vec![ci, y, x], p);
        let kernel = b.finish(r).unwrap();
        assert!(Contraction::of(&kernel).is_none());
        let xs = Tensor::from_vec(
            Shape::new(vec![1, c, h, w]).unwrap(),
            (0..c * h * w).map(|i| (i as f32 * 0.7).cos()).collect(),
        )
        .unwrap();
        let ws = Tensor::from_vec(
            Shape::new(vec![co, c, 3, 3]).unwrap(),
            (0..co * c * 9).map(|i| (i as f32 * 0.3).sin()).collect(),
        )
        .unwrap();
        let want = crate::interp::run(&kernel, &[&xs, &ws]).unwrap();
        let mut prog = program(
            vec![
                buf(t(&[1, c, h, w]), BufferKind::Input(0)),
                buf(t(&[co, c, 3, 3]), BufferKind::Const(ws.clone())),
                buf(t(&[1, co, h, w]), BufferKind::Result),
            ],
            vec![Dispatch::new(kernel, vec![BufferId(0), BufferId(1)], BufferId(2), vec!["Conv".into()])],
            vec![BufferId(0)],
            vec![BufferId(2)],
        );
        assert_eq!(materialize_padding(&mut prog), 1);
        assert_eq!(prog.dispatches.len(), 2);
        let (pad, conv) = (&prog.dispatches[0], &prog.dispatches[1]);
        assert_eq!(prog.buffer(pad.result).ty.shape.dims(), &[1, c, h + 2, w + 2]);
        assert!(Contraction::of(&conv.kernel).is_some());
        let padded = crate::interp::run(&pad.kernel, &[&xs]).unwrap();
        assert_eq!(conv.operands, vec![pad.result, BufferId(1)]);
        let got = crate::interp::run(&conv.kernel, &[&padded, &ws]).unwrap();
        assert_eq!(got, want);
        assert_eq!(materialize_padding(&mut prog), 0);
    }
}
