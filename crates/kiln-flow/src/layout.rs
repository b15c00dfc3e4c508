//! Layout transforms that make kernels contractions ([`crate::contraction`]), so a
//! target's matrix microkernels apply to them. Both run on the flow program and keep
//! every kernel's results unchanged:
//!
//! - [`materialize_padding`]: a convolution reads its input through `Pad` bounds
//!   (indices outside the tensor read 0). A dispatch in front of it writes the padded
//!   input once; the convolution then reads that in bounds, at indices shifted by the
//!   padding, which makes it a contraction (one extra pass over the input, instead of
//!   a bounds check per multiply-add). A depthwise convolution ([`crate::window`]) is
//!   left as it is: its kernel handles the border itself.
//! - [`relayout_constants`]: a constant right operand that is not column-contiguous
//!   (`Gemm` with `transB = 1`) is copied at compile time into a `[K, N]` constant.
//!
//! - [`materialize_columns`]: a convolution with few output columns reads its image
//!   through a gathered copy laid out as the rows of one wide product (`im2col`).
//!
//! Each transform is taken only when the rewritten kernel is a contraction.

use crate::contraction::{load_offset, Contraction};
use crate::window::Depthwise;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, KernelBuilder, ReduceOp, VarId};
use crate::program::{BufferKind, Dispatch, FlowProgram};
use kiln_ir::{DType, Shape, Tensor, TensorType};

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
            out.push(Dispatch {
                kernel: producer,
                operands: vec![source],
                result: buf,
                sources: vec![format!("{what} for {}", d.sources.first().map_or("?", |s| s.as_str()))],
            });
            if kernel.inputs.len() > d.operands.len() {
                d.operands.push(buf);
            } else {
                d.operands[input as usize] = buf;
            }
            d.kernel = kernel;
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
/// are mostly empty lanes. A dispatch in front of it writes `B'[.., ci, kh, kw, oh,
/// ow] = x[.., ci, s·oh + kh, s·ow + kw]` and the kernel reads that instead, which
/// makes its columns `oh·OW + ow` (one product of `OH·OW` columns and `CI·KH·KW` rows
/// of B). Runs after fusion, so the gather is not fused back. Returns how many were
/// added.
pub fn materialize_columns(p: &mut FlowProgram) -> usize {
    put_in_front(p, "columns", "columns", gathered)
}

/// `k` reading gathered columns, the gathering kernel and the input slot it replaces;
/// `None` unless the result is a contraction over the wider column group.
fn gathered(k: &Kernel) -> Option<(Kernel, Kernel, u32)> {
    let c = Contraction::of(k)?;
    let r = k.out_rank();
    let [n0] = c.n[..] else { return None };
    if c.k.len() < 2 || n0 as usize != r - 1 || r < 3 || k.vars[n0 as usize] >= GATHER_BELOW_COLUMNS {
        return None;
    }
    let x = (r - 2) as u32;
    if !c.batch.contains(&x) || c.a.offset.of(x) != 0 || c.b.offset.of(x) == 0 {
        return None;
    }
    // The B load in the reduction's body.
    let Expr::Reduce { body, .. } = k.node(c.reduce).expr else { return None };
    let Expr::Binary(BinaryOp::Mul, p, q) = k.node(body).expr else { return None };
    let load = [p, q].into_iter().find(|&e| matches!(k.node(e).expr, Expr::Load { input, .. } if input == c.b.input))?;
    let Expr::Load { index, .. } = &k.node(load).expr else { return None };
    // Columns tensor axes: the batch variables B reads (but x), the reduction, x, n0.
    let mut axes: Vec<u32> = c.batch.iter().copied().filter(|&v| v != x && c.b.offset.of(v) != 0).collect();
    axes.extend(&c.k);
    axes.extend([x, n0]);
    let dims: Vec<usize> = axes.iter().map(|&v| k.vars[v as usize] as usize).collect();
    if dims.iter().map(|&d| d as u64).product::<u64>() > GATHER_MOST {
        return None;
    }
    let ty = TensorType::new(DType::F32, Shape::new(dims).ok()?);
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
    let readers =
        k.nodes.iter().filter(|n| matches!(&n.expr, Expr::Load { input: i, .. } if *i == c.b.input)).count();
    let new_input = if readers == 1 { c.b.input } else { k.inputs.len() as u32 };
    let kernel = rebuild_load(k, load, new_input, &ty, &mut |b, _| axes.iter().map(|&v| b.var(VarId(v))).collect())?;
    let wide = Contraction::of(&kernel)?;
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
    for load in [x, y] {
        let Expr::Load { input, index, bounds: Bounds::Pad(bits) } = &k.node(load).expr else { continue };
        let ty = k.inputs.get(*input as usize)?;
        if ty.dtype != DType::F32 {
            continue;
        }
        // Range of every index; the padded tensor covers it.
        let dims = ty.shape.dims();
        let mut shift = Vec::with_capacity(dims.len());
        let mut pdims = Vec::with_capacity(dims.len());
        for (d, &e) in index.iter().enumerate() {
            let a = crate::contraction::affine(k, e)?;
            let (mut lo, mut hi) = (a.c, a.c);
            for (v, &c) in a.coef.iter().enumerate() {
                let top = c.checked_mul(i64::try_from(k.vars[v]).ok()? - 1)?;
                lo += top.min(0);
                hi += top.max(0);
            }
            let s = (-lo).max(0);
            shift.push(s);
            pdims.push(usize::try_from((hi + 1).max(dims[d] as i64) + s).ok()?);
        }
        if shift.iter().all(|&s| s == 0) && pdims.iter().zip(dims).all(|(p, d)| p == d) {
            continue;
        }
        let padded_ty = TensorType::new(DType::F32, Shape::new(pdims).ok()?);
        // The padded copy takes the operand's place unless another load reads it too.
        let readers =
            k.nodes.iter().filter(|n| matches!(&n.expr, Expr::Load { input: i, .. } if i == input)).count();
        let new_input = if readers == 1 { *input } else { k.inputs.len() as u32 };
        let kernel = rebuild_load(k, load, new_input, &padded_ty, &mut |b, idx| {
            idx.iter()
                .zip(&shift)
                .map(|(&e, &s)| {
                    let c = b.index(s);
                    b.add(e, c)
                })
                .collect()
        })?;
        if !Contraction::of(&kernel).is_some_and(|c| c.epilogue_is_affine(&kernel)) {
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
    let mut b = KernelBuilder::new(k.name.clone(), inputs, k.output.clone());
    for &e in &k.vars[k.out_rank()..] {
        b.new_var(e);
    }
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
/// `transB = 1`, a `MatMul` by a transposed weight), `B` is copied at compile time into
/// a new `[K, N]` constant and the kernel reads that instead, which makes it a
/// [`Contraction`]. Returns how many operands were laid out.
pub fn relayout_constants(p: &mut FlowProgram) -> usize {
    let mut done = 0;
    for d in 0..p.dispatches.len() {
        if Contraction::of(&p.dispatches[d].kernel).is_some() {
            continue;
        }
        let Some((input, load, tensor, index)) = relayout_one(p, d) else { continue };
        let k = &mut p.dispatches[d].kernel;
        let old = (k.inputs[input].clone(), k.nodes[load].expr.clone());
        k.inputs[input] = tensor.ty().clone();
        if let Expr::Load { index: ix, .. } = &mut k.nodes[load].expr {
            *ix = index;
        }
        if k.verify().is_err() || Contraction::of(k).is_none() {
            k.inputs[input] = old.0;
            k.nodes[load].expr = old.1;
            continue;
        }
        let name = format!("{}.kn", p.buffer(p.dispatches[d].operands[input]).name);
        let b = p.add(tensor.ty().clone(), name, BufferKind::Const(tensor));
        p.dispatches[d].operands[input] = b;
        done += 1;
    }
    done
}

/// For dispatch `d`: the input to lay out, its load node, the new `[K, N]` constant and
/// the load's new index.
fn relayout_one(p: &FlowProgram, d: usize) -> Option<(usize, usize, Tensor, Vec<ExprId>)> {
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
        let operand = p.storage(p.dispatches[d].operands[input]);
        let BufferKind::Const(t) = &p.buffer(operand).kind else { continue };
        if t.dtype() != DType::F32 || input == ai {
            continue;
        }
        let (boff, aoff) = (load_offset(k, input as u32, index)?, load_offset(k, ai as u32, aix)?);
        // B reads only k and n (and extent-1 variables); A does not read n.
        let only_kn = boff.coef.iter().enumerate().all(|(v, &c)| c == 0 || v as u32 == kv || v as u32 == n || k.vars[v] == 1);
        if !only_kn || aoff.of(n) != 0 || boff.of(n) == 1 || boff.of(n) == 0 {
            continue;
        }
        // No other load reads this input.
        let loads = k.nodes.iter().filter(|nd| matches!(&nd.expr, Expr::Load { input: i, .. } if *i as usize == input)).count();
        if loads != 1 {
            continue;
        }
        // Var nodes for k and n placed before the load (its new index).
        let var_node = |v: u32| k.nodes[..b.index()].iter().position(|nd| nd.expr == Expr::Var(VarId(v)));
        let (ek, en) = (var_node(kv)?, var_node(n)?);
        let (kk, nn) = (k.vars[kv as usize] as usize, k.vars[n as usize] as usize);
        let src = t.to_vec::<f32>().ok()?;
        let mut out = Vec::with_capacity(kk * nn);
        for ki in 0..kk as i64 {
            for ni in 0..nn as i64 {
                let at = boff.c + boff.of(kv) * ki + boff.of(n) * ni;
                out.push(*src.get(usize::try_from(at).ok()?)?);
            }
        }
        let tensor = Tensor::from_vec(Shape::new(vec![kk, nn]).ok()?, out).ok()?;
        debug_assert_eq!(tensor.ty(), &TensorType::new(DType::F32, Shape::new(vec![kk, nn]).ok()?));
        return Some((input, b.index(), tensor, vec![ExprId(ek as u32), ExprId(en as u32)]));
    }
    None
}


#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::Shape;

    fn t(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, Shape::new(dims).unwrap())
    }

    /// `Gemm` with `transB = 1`: the constant is laid out `[K, N]` at compile time, the
    /// kernel becomes a contraction, and its results do not change.
    #[test]
    fn transposed_constant_laid_out() {
        use crate::program::{Buffer, BufferId, Dispatch};
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
        let buf = |ty: TensorType, kind| Buffer { ty, name: "b".into(), kind };
        let mut prog = FlowProgram {
            name: "g".into(),
            buffers: vec![
                buf(t(&[m, kk]), BufferKind::Input(0)),
                buf(t(&[n, kk]), BufferKind::Const(wt.clone())),
                buf(t(&[m, n]), BufferKind::Result),
            ],
            dispatches: vec![Dispatch {
                kernel,
                operands: vec![BufferId(0), BufferId(1)],
                result: BufferId(2),
                sources: vec!["Gemm".into()],
            }],
            inputs: vec![BufferId(0)],
            outputs: vec![BufferId(2)],
        };
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

    /// A 3×3 convolution with padding 1: after materialisation it is a contraction, a
    /// padding dispatch comes first, and the two together compute what it did.
    #[test]
    fn padding_materialised() {
        use crate::program::{Buffer, BufferId};
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
        let xs = Tensor::from_vec(Shape::new(vec![1, c, h, w]).unwrap(), (0..c * h * w).map(|i| (i as f32 * 0.7).cos()).collect()).unwrap();
        let ws = Tensor::from_vec(Shape::new(vec![co, c, 3, 3]).unwrap(), (0..co * c * 9).map(|i| (i as f32 * 0.3).sin()).collect()).unwrap();
        let want = crate::interp::run(&kernel, &[&xs, &ws]).unwrap();
        let buf = |ty: TensorType, kind| Buffer { ty, name: "b".into(), kind };
        let mut prog = FlowProgram {
            name: "g".into(),
            buffers: vec![
                buf(t(&[1, c, h, w]), BufferKind::Input(0)),
                buf(t(&[co, c, 3, 3]), BufferKind::Const(ws.clone())),
                buf(t(&[1, co, h, w]), BufferKind::Result),
            ],
            dispatches: vec![Dispatch {
                kernel,
                operands: vec![BufferId(0), BufferId(1)],
                result: BufferId(2),
                sources: vec!["Conv".into()],
            }],
            inputs: vec![BufferId(0)],
            outputs: vec![BufferId(2)],
        };
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
