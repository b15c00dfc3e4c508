//! Bounded input dimensions: an input axis whose extent the caller chooses at run
//! time, up to a bound declared at compile time (`--input-shape ids=1x1..128`).
//!
//! The graph stays static: the input is typed at its **bound**, and every value
//! derived from it is **stored at the bound** (strides, layouts, the arena plan and
//! every reshape stay those of the bound shape). The actual extent is an extra graph
//! input, an `i64` scalar (listed last among the inputs, [`BoundedDim::extent`]), that
//! the runtime writes from the size of the caller's tensor; the caller never passes it.
//! Positions past the extent hold padding, which no result at a position before the
//! extent may read:
//!
//! - position-wise ops (element-wise ops with broadcasting, Transpose, reshapes that
//!   keep the axis an axis of its own, Gather of other axes or with bounded indices,
//!   reductions, soft-maxes and normalisations over other axes, MatMul with the axis
//!   among its rows or columns) compute the padding like any other position, and carry
//!   the axis to their results ([`analyse`]);
//! - ops that mix positions along the axis read the extent: a reduction or a soft-max
//!   over it, and a MatMul whose inner dimension it is, see their operand with the
//!   padding replaced by the op's identity (`Where(iota < extent, x, identity)`,
//!   [`mask`]); their results are static along the reduced axis;
//! - anything else (Shape or Size of it, a reshape merging it with another axis, a
//!   Gather or Slice or Concat along it, LayerNormalization over it, …) is refused at
//!   compile time with a [`DynamicError`] naming the node and op.
//!
//! A static operand whose extent along the axis equals the bound (a position-embedding
//! table of a model exported at its largest length) is read as the same dimension: at
//! actual length `n`, its first `n` positions meet the first `n` of the input.

use crate::attrs::{GatherAttrs, GemmAttrs, LayerNormAttrs, ReduceAttrs, SoftmaxAttrs, TransposeAttrs};
use crate::dynamic::{is_elementwise, is_reduction, masked, mean_of, normalise, reduced_axes, DynamicError};
use crate::entity::EntityId;
use crate::graph::{Graph, Node, ValueId};
use crate::op::{Op, OpKind};
use crate::{DType, Shape, Tensor, TensorType};

/// One bounded input dimension of a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundedDim {
    /// The input (an index into [`Graph::inputs`]).
    pub input: usize,
    /// Its axis whose extent is chosen at run time.
    pub axis: usize,
    /// The smallest extent the caller may give.
    pub min: usize,
    /// The largest: the input's static extent along `axis`.
    pub bound: usize,
    /// The `i64` scalar input holding the actual extent (an index into
    /// [`Graph::inputs`]; the runtime writes it, the caller does not pass it).
    pub extent: usize,
}

/// The bounded axes of one value: (axis, index into [`Graph::bounded`]), by axis.
pub type Axes = Vec<(usize, usize)>;

/// The bounded axes of every value of `g` (indexed by value), or the first node that
/// cannot run on a bounded dimension (see the module docs). Every graph output may
/// carry the dimension along one axis at most.
pub fn analyse(g: &Graph) -> Result<Vec<Axes>, DynamicError> {
    let axes = analyse_with(g, true)?;
    for &o in &g.outputs {
        if axes[o.index()].len() > 1 {
            return Err(DynamicError {
                node: g.values[o].name.clone(),
                op: OpKind::Identity,
                reason: "a graph output carries bounded dimensions along more than one axis".into(),
            });
        }
    }
    Ok(axes)
}

/// [`analyse`], or with `strict` off, a node it would refuse gives static results.
pub fn analyse_with(g: &Graph, strict: bool) -> Result<Vec<Axes>, DynamicError> {
    let mut of: Vec<Axes> = vec![Vec::new(); g.values.len()];
    for (k, b) in g.bounded.iter().enumerate() {
        if let Some(&v) = g.inputs.get(b.input) {
            of[v.index()] = vec![(b.axis, k)];
        }
    }
    for node in g.nodes.values() {
        if node.inputs.iter().flatten().all(|v| of[v.index()].is_empty()) {
            continue;
        }
        match propagate(g, node, &of) {
            Ok(out) => {
                for (r, axes) in out.into_iter().enumerate() {
                    if let Some(&v) = node.outputs.get(r) {
                        of[v.index()] = axes;
                    }
                }
            }
            Err(reason) if strict => {
                let label = if node.name.is_empty() { node.op.kind.name().to_string() } else { node.name.clone() };
                return Err(DynamicError { node: label, op: node.op.kind, reason });
            }
            Err(_) => {}
        }
    }
    Ok(of)
}

/// Where `axes` (of a value of `dims`) land in a value of `out` holding the same
/// elements in the same row-major order: each axis must stay an axis of its own with
/// the same elements before it.
fn reshaped(dims: &[usize], out: &[usize], axes: &Axes) -> Result<Axes, String> {
    let mut res = Vec::new();
    for &(a, k) in axes {
        let before: usize = dims[..a].iter().product();
        let b = (0..out.len())
            .find(|&b| out[b] == dims[a] && out[..b].iter().product::<usize>() == before)
            .ok_or_else(|| {
                format!(
                    "the reshape from {dims:?} to {out:?} merges or splits the bounded axis {a}; \
                     it must stay an axis of its own"
                )
            })?;
        res.push((b, k));
    }
    Ok(res)
}

/// The bounded axes of each result of `node`, from those of its operands.
fn propagate(g: &Graph, node: &Node, of: &[Axes]) -> Result<Vec<Axes>, String> {
    use OpKind::*;
    let axes_of =
        |i: usize| -> Axes { node.inputs.get(i).copied().flatten().map_or(Vec::new(), |v| of[v.index()].clone()) };
    let dims_of = |i: usize| -> Vec<usize> {
        node.inputs.get(i).copied().flatten().map_or(Vec::new(), |v| g.ty(v).shape.dims().to_vec())
    };
    let out_dims =
        |r: usize| -> Vec<usize> { node.outputs.get(r).map_or(Vec::new(), |&v| g.ty(v).shape.dims().to_vec()) };
    let ints = |i: usize| -> Option<Vec<i64>> {
        node.inputs.get(i).copied().flatten().and_then(|v| g.constant(v)).and_then(|t| t.to_i64_vec().ok())
    };
    let dynamic_operands: Vec<usize> = (0..node.inputs.len()).filter(|&i| !axes_of(i).is_empty()).collect();
    let only = |allowed: &[usize]| -> Result<(), String> {
        match dynamic_operands.iter().find(|i| !allowed.contains(i)) {
            Some(i) => Err(format!("operand {i} carries a bounded dimension, which this op cannot take there")),
            None => Ok(()),
        }
    };
    let k = node.op.kind;
    match k {
        _ if is_elementwise(k) => {
            let r = out_dims(0).len();
            let mut res: Axes = Vec::new();
            for i in 0..node.inputs.len() {
                let ri = dims_of(i).len();
                for (a, d) in axes_of(i) {
                    let x = r - ri + a;
                    match res.iter().find(|(y, _)| *y == x) {
                        Some(&(_, e)) if e != d => {
                            return Err(format!("two different bounded dimensions meet along axis {x}"))
                        }
                        Some(_) => {}
                        None => res.push((x, d)),
                    }
                }
            }
            res.sort_unstable();
            let mut out = vec![res];
            out.resize(node.outputs.len(), Vec::new());
            Ok(out)
        }
        Transpose => {
            only(&[0])?;
            let a = node.op.attrs_of::<TransposeAttrs>().map_err(|e| e.to_string())?;
            let r = dims_of(0).len();
            let perm: Vec<usize> = match &a.perm {
                Some(p) => p.iter().map(|&x| x as usize).collect(),
                None => (0..r).rev().collect(),
            };
            let mut res: Axes =
                axes_of(0).into_iter().filter_map(|(a, d)| perm.iter().position(|&p| p == a).map(|j| (j, d))).collect();
            res.sort_unstable();
            Ok(vec![res])
        }
        Reshape | Squeeze | Unsqueeze | Flatten => {
            only(&[0])?;
            Ok(vec![reshaped(&dims_of(0), &out_dims(0), &axes_of(0))?])
        }
        MatMul => {
            only(&[0, 1])?;
            let (da, db, dy) = (dims_of(0), dims_of(1), out_dims(0));
            if da.len() < 2 || db.len() < 2 {
                return Err("a MatMul of a 1-D operand on a bounded dimension is not supported".into());
            }
            let (ra, rb, ry) = (da.len(), db.len(), dy.len());
            let mut res: Axes = Vec::new();
            let mut push = |x: usize, d: usize| -> Result<(), String> {
                match res.iter().find(|(y, _)| *y == x) {
                    Some(&(_, e)) if e != d => Err(format!("two different bounded dimensions meet along axis {x}")),
                    Some(_) => Ok(()),
                    None => {
                        res.push((x, d));
                        Ok(())
                    }
                }
            };
            for (a, d) in axes_of(0) {
                if a == ra - 1 {
                    continue; // the inner dimension: masked (`mask`)
                }
                push(if a == ra - 2 { ry - 2 } else { ry - ra + a }, d)?;
            }
            for (a, d) in axes_of(1) {
                if a == rb - 2 {
                    continue;
                }
                push(if a == rb - 1 { ry - 1 } else { ry - rb + a }, d)?;
            }
            res.sort_unstable();
            Ok(vec![res])
        }
        Gemm => {
            only(&[0, 1, 2])?;
            let a = node.op.attrs_of::<GemmAttrs>().map_err(|e| e.to_string())?;
            let mut res: Axes = Vec::new();
            // A's rows (axis 0, or 1 transposed) and B's columns (1, or 0 transposed).
            for (x, d) in axes_of(0) {
                if x == usize::from(a.trans_a) {
                    res.push((0, d));
                }
            }
            for (x, d) in axes_of(1) {
                if x == usize::from(!a.trans_b) {
                    res.push((1, d));
                }
            }
            let rc = dims_of(2).len();
            for (x, d) in axes_of(2) {
                let y = 2 - rc + x;
                if !res.iter().any(|&(z, _)| z == y) {
                    res.push((y, d));
                }
            }
            res.sort_unstable();
            res.dedup_by_key(|(x, _)| *x);
            Ok(vec![res])
        }
        Softmax | LogSoftmax => {
            only(&[0])?;
            Ok(vec![axes_of(0)])
        }
        LayerNormalization => {
            only(&[0])?;
            let a = node.op.attrs_of::<LayerNormAttrs>().map_err(|e| e.to_string())?;
            let r = dims_of(0).len();
            let first = normalise(a.axis, r).ok_or("axis out of range")?;
            if let Some((x, _)) = axes_of(0).into_iter().find(|&(x, _)| x >= first) {
                return Err(format!("it normalises over the bounded axis {x}"));
            }
            let mut out = vec![axes_of(0)];
            out.resize(node.outputs.len(), Vec::new());
            Ok(out)
        }
        ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMax | ReduceMean | ReduceMin | ReduceProd
        | ReduceSum | ReduceSumSquare => {
            only(&[0])?;
            let a = node.op.attrs_of::<ReduceAttrs>().map_err(|e| e.to_string())?;
            let r = dims_of(0).len();
            let axes = reduced_axes(g, node, a, r);
            let mut res = Vec::new();
            for (x, d) in axes_of(0) {
                if axes.contains(&x) {
                    if crate::dynamic::identity(k, g.ty(node.inputs[0].ok_or("no operand")?).dtype).is_none() {
                        return Err(format!("it reduces over the bounded axis {x} and kiln has no mask for it"));
                    }
                    continue;
                }
                res.push((if a.keepdims { x } else { x - axes.iter().filter(|&&y| y < x).count() }, d));
            }
            Ok(vec![res])
        }
        Gather => {
            let a = node.op.attrs_of::<GatherAttrs>().map_err(|e| e.to_string())?;
            let rd = dims_of(0).len();
            let ri = dims_of(1).len();
            let ga = normalise(a.axis, rd).ok_or("axis out of range")?;
            let mut res = Vec::new();
            for (x, d) in axes_of(0) {
                if x == ga {
                    return Err(format!("it indexes along the bounded axis {x}"));
                }
                res.push((if x < ga { x } else { x - 1 + ri }, d));
            }
            for (x, d) in axes_of(1) {
                res.push((ga + x, d));
            }
            res.sort_unstable();
            Ok(vec![res])
        }
        Slice | Concat | Pad | Expand | Tile => {
            only(&[0])?;
            if k == Concat && node.inputs.len() > 1 {
                return Err("a Concat of a bounded value is not supported".into());
            }
            // Only along other axes: the bounded axes keep their extent.
            let (x, y) = (dims_of(0), out_dims(0));
            let axes = axes_of(0);
            if x.len() != y.len() {
                return Err("it changes the rank of a bounded value".into());
            }
            if k == Slice {
                let sliced: Vec<usize> = match ints(3) {
                    Some(ax) => ax.iter().filter_map(|&a| normalise(a, x.len())).collect(),
                    None => (0..x.len()).collect(),
                };
                if let Some(&(a, _)) = axes.iter().find(|(a, _)| sliced.contains(a)) {
                    return Err(format!("it slices along the bounded axis {a}"));
                }
            }
            if let Some(&(a, _)) = axes.iter().find(|&&(a, _)| x[a] != y[a]) {
                return Err(format!("it changes the extent of the bounded axis {a}"));
            }
            Ok(vec![axes])
        }
        Shape | Size => {
            Err("it reads the extent of a bounded dimension as data, which the static plan cannot give".into())
        }
        _ => Err("kiln does not run this op on a bounded dimension (see docs/bounded-shapes.md)".into()),
    }
}

/// Rewrites every op that mixes positions along a bounded axis to read the extent (see
/// the module docs): reductions and soft-maxes over it, and MatMuls with it as their
/// inner dimension, see the padding replaced by their identity; a ReduceMean over it
/// becomes a sum divided by the actual count. Other nodes are copied, in order.
pub fn mask(g: &Graph) -> Graph {
    let of = analyse_with(g, false).unwrap_or_default();
    let (mut out, mut map) = g.rewrite_start(|_| true);
    out.bounded = g.bounded.clone();
    let ext_of =
        |out: &Graph, d: usize| -> Option<ValueId> { g.bounded.get(d).and_then(|b| out.inputs.get(b.extent).copied()) };
    let scalar = |dtype: DType, x: f64| Tensor::from_f64(dtype, Shape::scalar(), &[x]).ok();
    for (_, n) in g.nodes.iter() {
        let mut inputs: Vec<Option<ValueId>> = n.inputs.iter().map(|i| i.and_then(|v| map[v.index()])).collect();
        let mut op = n.op.clone();
        let axes_of =
            |i: usize| -> Axes { n.inputs.get(i).copied().flatten().map_or(Vec::new(), |v| of[v.index()].clone()) };
        let ty_of = |i: usize| -> Option<TensorType> { n.inputs.get(i).copied().flatten().map(|v| g.ty(v).clone()) };
        let mut mean_count: Option<(Vec<ValueId>, f64)> = None;
        match n.op.kind {
            OpKind::Softmax | OpKind::LogSoftmax => {
                if let (Ok(a), Some(ty), Some(x)) = (n.op.attrs_of::<SoftmaxAttrs>(), ty_of(0), inputs[0]) {
                    let ax = normalise(a.axis, ty.shape.rank());
                    for (x_axis, d) in axes_of(0) {
                        if Some(x_axis) == ax {
                            if let (Some(ext), Some(fill)) = (ext_of(&out, d), scalar(ty.dtype, f64::NEG_INFINITY)) {
                                inputs[0] = Some(masked(&mut out, x, &ty, x_axis, g.bounded[d].bound, ext, fill));
                            }
                        }
                    }
                }
            }
            OpKind::MatMul => {
                for (i, inner) in [(0usize, 1usize), (1, 2)] {
                    let Some(ty) = ty_of(i) else { continue };
                    let r = ty.shape.rank();
                    if r < 2 {
                        continue;
                    }
                    for (x_axis, d) in axes_of(i) {
                        if x_axis == r - inner {
                            if let (Some(ext), Some(fill), Some(x)) =
                                (ext_of(&out, d), scalar(ty.dtype, 0.0), inputs[i])
                            {
                                inputs[i] = Some(masked(&mut out, x, &ty, x_axis, g.bounded[d].bound, ext, fill));
                            }
                        }
                    }
                }
            }
            k if is_reduction(k) => {
                if let (Ok(a), Some(ty)) = (n.op.attrs_of::<ReduceAttrs>(), ty_of(0)) {
                    let axes = reduced_axes(g, n, a, ty.shape.rank());
                    let mut exts = Vec::new();
                    for (x_axis, d) in axes_of(0) {
                        if !axes.contains(&x_axis) {
                            continue;
                        }
                        if let (Some(ext), Some(fill), Some(x)) =
                            (ext_of(&out, d), crate::dynamic::identity(n.op.kind, ty.dtype), inputs[0])
                        {
                            inputs[0] = Some(masked(&mut out, x, &ty, x_axis, g.bounded[d].bound, ext, fill));
                            exts.push(ext);
                        }
                    }
                    if n.op.kind == OpKind::ReduceMean && !exts.is_empty() {
                        let dyn_axes: Vec<usize> = axes_of(0).iter().map(|&(x, _)| x).collect();
                        let others: f64 =
                            axes.iter().filter(|x| !dyn_axes.contains(x)).map(|&x| ty.shape.dims()[x] as f64).product();
                        op = Op::with_typed(OpKind::ReduceSum, a.clone()).unwrap_or(op);
                        mean_count = Some((exts, others));
                    }
                }
            }
            _ => {}
        }
        match mean_count {
            None => out.copy_node(g, n, op, inputs, &mut map),
            Some((exts, others)) => {
                map[n.outputs[0].index()] = Some(mean_of(&mut out, g, n, op, inputs, &exts, others))
            }
        }
    }
    out.outputs = g.outputs.iter().filter_map(|v| map[v.index()]).collect();
    out
}
