//! Data-dependent result extents in a static graph.
//!
//! NonZero, Compress, Unique, NonMaxSuppression and TopK with a run-time K produce a
//! result whose extent along one axis depends on the data. kiln keeps its graph static:
//! such a result is typed with its **bound** along that axis (derived from the operand
//! shapes, e.g. NonZero's element count, or declared smaller with `--max-dim`, the
//! `kiln_bound` attribute), and the node has one more result, its **extent**: an `i64`
//! scalar holding the actual number of entries, computed by the same kernels. The
//! elements past the extent are padding (zeros); nothing reads them as data.
//!
//! A value derived position by position from such a result keeps its data-dependent
//! axis and its extent (element-wise ops, Cast, Transpose, Unsqueeze, Gather along
//! another axis or with those indices, Slice along other axes, reductions and
//! soft-maxes along other axes). An op that would mix or reduce along the
//! data-dependent axis is refused at compile time by [`analyse`] with a
//! [`DynamicError`] naming the node, because its kernel would read padding as data.
//! The compiler carries each graph output's axis and extent to the artifact; the
//! runtime checks every extent against its bound (a typed run-time error, never a
//! silent truncation) and reports each output's actual shape.
//!
//! A **shape check** uses the same machinery without a bounded result: Resize with
//! run-time `scales`, OneHot with a run-time `depth` and Range with run-time operands
//! are compiled for the result dims the model (or `--output-shape`) declares
//! (`kiln_dims`), and the node's second result, an `i64` scalar, counts the axes whose
//! extent the run-time operands give otherwise. The plan carries it as an extent of bound
//! 0 that sizes no output; the runtime fails a call where it is not 0 (a typed error).

use crate::attrs::{ArgReduceAttrs, GatherAttrs, ReduceAttrs, SoftmaxAttrs, TopKAttrs, TransposeAttrs};
use crate::entity::EntityId;
use crate::graph::{Graph, Node, ValueId};
use crate::op::OpKind;

/// A value's data-dependent axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DynAxis {
    /// The axis whose extent is only known at run time.
    pub axis: usize,
    /// The `i64` scalar value holding the actual extent.
    pub extent: ValueId,
    /// The bound: the value's static extent along `axis`.
    pub bound: usize,
}

/// An op that needs the data-dependent extent but cannot use it (compile time).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("node `{node}` ({op}): {reason}")]
pub struct DynamicError {
    /// The node's name (or its op type when unnamed).
    pub node: String,
    /// Its op.
    pub op: OpKind,
    /// Why it cannot run on a bounded result.
    pub reason: String,
}

/// The bounded results of a data-dependent op with `num_results` results (empty for
/// other ops; the extent result is not among them).
pub fn source_results(op: &crate::op::Op, num_results: usize) -> Vec<usize> {
    match op.kind {
        OpKind::NonZero | OpKind::NonMaxSuppression | OpKind::Compress => vec![0],
        OpKind::Unique => vec![0, 1, 3],
        OpKind::TopK if num_results == 3 => vec![0, 1],
        _ => Vec::new(),
    }
}

/// Whether the node is a data-dependent op in its bounded form: which of its results
/// are bounded along which axis, and which result is the extent.
pub fn source(node: &Node, g: &Graph) -> Option<(Vec<(usize, usize)>, usize)> {
    let n = node.outputs.len();
    match node.op.kind {
        OpKind::NonZero => Some((vec![(0, 1)], 1)),
        OpKind::NonMaxSuppression => Some((vec![(0, 0)], 1)),
        OpKind::Compress => {
            let a = node.op.attrs_of::<crate::attrs::CompressAttrs>().ok()?;
            Some((vec![(0, operand_axis(node, g, a.axis)?)], 1))
        }
        OpKind::Unique => {
            let a = node.op.attrs_of::<crate::attrs::UniqueAttrs>().ok()?;
            Some((vec![(0, operand_axis(node, g, a.axis)?), (1, 0), (3, 0)], 4))
        }
        // A shape check (Resize with run-time `scales`, compiled for the dims in
        // `kiln_dims`): no bounded result; the second result counts the axes whose
        // extent the run-time operands give otherwise, which must be 0.
        OpKind::Resize | OpKind::OneHot | OpKind::Range if n == 2 => Some((Vec::new(), 1)),
        OpKind::TopK if n == 3 => {
            let a = node.op.attrs_of::<TopKAttrs>().ok()?;
            let axis = operand_axis(node, g, Some(a.axis))?;
            Some((vec![(0, axis), (1, axis)], 2))
        }
        _ => None,
    }
}

/// `axis` of `node`'s first operand, normalised; 0 where the op has none (it works on
/// the flattened operand). `None` when the axis is out of range or the operand absent.
fn operand_axis(node: &Node, g: &Graph, axis: Option<i64>) -> Option<usize> {
    let x = g.ty(node.inputs.first().copied().flatten()?);
    match axis {
        Some(ax) => normalise(ax, x.shape.rank()),
        None => Some(0),
    }
}

/// Axis `a` of a value of rank `rank`, counted from the end when negative; `None` out of range.
pub(crate) fn normalise(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// The axes a reduction `node` (of an operand of rank `r`) reduces: its constant `axes`
/// operand, else none (`noop_with_empty_axes`) or all of them.
pub(crate) fn reduced_axes(g: &Graph, node: &Node, a: &ReduceAttrs, r: usize) -> Vec<usize> {
    match node.inputs.get(1).copied().flatten().and_then(|v| g.constant(v)).and_then(|t| t.to_i64_vec().ok()) {
        Some(v) if !v.is_empty() => v.iter().filter_map(|&x| normalise(x, r)).collect(),
        _ if a.noop_with_empty_axes => Vec::new(),
        _ => (0..r).collect(),
    }
}

/// Whether `g` (or an `If` branch in it) has a data-dependent op.
pub fn has_sources(g: &Graph) -> bool {
    g.nodes.values().any(|n| {
        source(n, g).is_some()
            || n.op
                .attrs_of::<crate::attrs::IfAttrs>()
                .is_ok_and(|a| has_sources(&a.then_branch) || has_sources(&a.else_branch))
    })
}

/// The data-dependent axis of every value of `g` (indexed by value), or the first node
/// that cannot run on a bounded operand (see the module docs).
pub fn analyse(g: &Graph) -> Result<Vec<Option<DynAxis>>, DynamicError> {
    analyse_with(g, true)
}

/// [`analyse`], or with `strict` off, a node it would refuse gives results of static
/// extent instead of an error (the reference evaluator computes such a node at the
/// actual shapes, where a reduction along the data-dependent axis is just a reduction).
pub fn analyse_with(g: &Graph, strict: bool) -> Result<Vec<Option<DynAxis>>, DynamicError> {
    let mut dyn_of: Vec<Option<DynAxis>> = vec![None; g.values.len()];
    for node in g.nodes.values() {
        let label = if node.name.is_empty() { node.op.kind.name().to_string() } else { node.name.clone() };
        let err = |reason: String| DynamicError { node: label.clone(), op: node.op.kind, reason };
        let operands: Vec<(usize, DynAxis)> = node
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.and_then(|v| dyn_of[v.index()]).map(|d| (i, d)))
            .collect();
        if let Some((results, extent)) = source(node, g) {
            if let Some((i, _)) = operands.first() {
                return Err(err(format!("operand {i} has a data-dependent extent itself; kiln bounds one level only")));
            }
            let e = node.outputs[extent];
            for (r, axis) in results {
                if let Some(&v) = node.outputs.get(r) {
                    let bound = g.ty(v).shape.dims()[axis];
                    dyn_of[v.index()] = Some(DynAxis { axis, extent: e, bound });
                }
            }
            continue;
        }
        if node.op.kind == OpKind::If {
            let a = node.op.attrs_of::<crate::attrs::IfAttrs>().map_err(|e| err(e.to_string()))?;
            if has_sources(&a.then_branch) || has_sources(&a.else_branch) {
                return Err(err("a data-dependent op inside a run-time If branch is not supported".into()));
            }
        }
        if operands.is_empty() {
            continue;
        }
        let out = match propagate(g, node, &operands) {
            Ok(out) => out,
            Err(e) if strict => return Err(err(e)),
            Err(_) => continue,
        };
        for (r, axis) in out {
            let v = node.outputs[r];
            let bound = g.ty(v).shape.dims()[axis];
            dyn_of[v.index()] = Some(DynAxis { axis, extent: operands[0].1.extent, bound });
        }
    }
    Ok(dyn_of)
}

/// The results of `node` that keep the data-dependent axis of its operands, and where.
fn propagate(g: &Graph, node: &Node, operands: &[(usize, DynAxis)]) -> Result<Vec<(usize, usize)>, String> {
    use OpKind::*;
    let (i0, d0) = operands[0];
    if let Some((i, d)) = operands.iter().find(|(_, d)| d.extent != d0.extent) {
        return Err(format!(
            "operands {i0} and {i} have different data-dependent extents ({} and {})",
            d0.extent, d.extent
        ));
    }
    let in_rank = |i: usize| node.inputs[i].map_or(0, |v| g.ty(v).shape.rank());
    let out_rank = |r: usize| node.outputs.get(r).map_or(0, |&v| g.ty(v).shape.rank());
    let ints = |i: usize| -> Option<Vec<i64>> {
        node.inputs.get(i).copied().flatten().and_then(|v| g.constant(v)).and_then(|t| t.to_i64_vec().ok())
    };
    let along = || format!("it would mix or reduce along the data-dependent axis {} of operand {i0}", d0.axis);
    let k = node.op.kind;
    match k {
        // Element-wise: the axis right-aligned into the result; every other operand
        // must broadcast along it (extent 1 or absent) or share the extent.
        _ if is_elementwise(k) => {
            let r = out_rank(0);
            let axis = r - in_rank(i0) + d0.axis;
            for &(i, d) in operands {
                if r - in_rank(i) + d.axis != axis {
                    return Err(format!("operands {i0} and {i} are data-dependent along different axes"));
                }
            }
            let is_operand = |i: usize| operands.iter().any(|&(j, _)| j == i);
            // CastLike's second operand only gives the dtype; Clip's bounds are scalars.
            let shaped = if matches!(k, CastLike) { 1 } else { node.inputs.len() };
            for (i, v) in node.inputs.iter().enumerate().take(shaped) {
                let Some(v) = v else { continue };
                if is_operand(i) || is_extent_mask(g, *v, d0.extent) {
                    continue;
                }
                let dims = g.ty(*v).shape.dims();
                let off = r - dims.len();
                if axis >= off && dims[axis - off] != 1 {
                    return Err(format!(
                        "operand {i} ({}) has a static extent along the data-dependent axis {axis}",
                        g.ty(*v)
                    ));
                }
            }
            Ok((0..node.outputs.len().min(1)).map(|r| (r, axis)).collect())
        }
        Transpose => {
            let a = node.op.attrs_of::<TransposeAttrs>().map_err(|e| e.to_string())?;
            let r = in_rank(0);
            let perm: Vec<usize> = match &a.perm {
                Some(p) => p.iter().map(|&x| x as usize).collect(),
                None => (0..r).rev().collect(),
            };
            let axis = perm.iter().position(|&p| p == d0.axis).ok_or("the permutation does not list the axis")?;
            Ok(vec![(0, axis)])
        }
        Unsqueeze => {
            let r = out_rank(0);
            let axes: Vec<usize> =
                ints(1).ok_or("Unsqueeze's axes must be a constant")?.iter().filter_map(|&a| normalise(a, r)).collect();
            let kept: Vec<usize> = (0..r).filter(|x| !axes.contains(x)).collect();
            Ok(vec![(0, kept[d0.axis])])
        }
        Squeeze => {
            let rin = in_rank(0);
            let axes: Vec<usize> = match ints(1) {
                Some(a) => a.iter().filter_map(|&a| normalise(a, rin)).collect(),
                None => {
                    let dims = g.ty(node.inputs[0].ok_or("no operand")?).shape.dims();
                    (0..rin).filter(|&x| dims[x] == 1).collect()
                }
            };
            if axes.contains(&d0.axis) {
                return Err(along());
            }
            Ok(vec![(0, d0.axis - axes.iter().filter(|&&x| x < d0.axis).count())])
        }
        Gather => {
            let a = node.op.attrs_of::<GatherAttrs>().map_err(|e| e.to_string())?;
            let rd = in_rank(0);
            let ga = normalise(a.axis, rd).ok_or("axis out of range")?;
            let ri = in_rank(1);
            if operands.len() > 1 {
                return Err("both data and indices have a data-dependent extent".into());
            }
            match i0 {
                0 if d0.axis == ga => Err(along()),
                0 => Ok(vec![(0, if d0.axis < ga { d0.axis } else { d0.axis - 1 + ri })]),
                _ => Ok(vec![(0, ga + d0.axis)]),
            }
        }
        Slice if i0 == 0 => {
            let (x, y) = (g.ty(node.inputs[0].ok_or("no operand")?), g.ty(node.outputs[0]));
            let steps = ints(4);
            let axes = ints(3);
            let step = match (&axes, &steps) {
                (Some(ax), Some(st)) => ax
                    .iter()
                    .zip(st)
                    .find(|(&a, _)| normalise(a, x.shape.rank()) == Some(d0.axis))
                    .map_or(1, |(_, &s)| s),
                (None, Some(st)) => st.get(d0.axis).copied().unwrap_or(1),
                _ => 1,
            };
            if x.shape.dims()[d0.axis] != y.shape.dims()[d0.axis] || step != 1 {
                return Err(along());
            }
            Ok(vec![(0, d0.axis)])
        }
        _ if is_reduction(k) && i0 == 0 => {
            let a = node.op.attrs_of::<ReduceAttrs>().map_err(|e| e.to_string())?;
            let axes = reduced_axes(g, node, a, in_rank(0));
            if axes.contains(&d0.axis) {
                // Masked by the extent (`mask_reductions`): the padding holds the
                // reduction's identity, so the result has a static extent.
                return if is_masked(g, node.inputs[0], d0.extent) { Ok(Vec::new()) } else { Err(along()) };
            }
            let axis = if a.keepdims { d0.axis } else { d0.axis - axes.iter().filter(|&&x| x < d0.axis).count() };
            Ok(vec![(0, axis)])
        }
        ArgMax | ArgMin => {
            let a = node.op.attrs_of::<ArgReduceAttrs>().map_err(|e| e.to_string())?;
            let ax = normalise(a.axis, in_rank(0)).ok_or("axis out of range")?;
            if ax == d0.axis {
                return Err(along());
            }
            Ok(vec![(0, if a.keepdims || d0.axis < ax { d0.axis } else { d0.axis - 1 })])
        }
        Softmax | LogSoftmax | Hardmax => {
            let a = node.op.attrs_of::<SoftmaxAttrs>().map_err(|e| e.to_string())?;
            if normalise(a.axis, in_rank(0)) == Some(d0.axis) {
                return Err(along());
            }
            Ok(vec![(0, d0.axis)])
        }
        _ => Err(format!(
            "{}; kiln runs only position-wise ops on a result of data-dependent extent \
             (see docs/dynamic-outputs.md)",
            along()
        )),
    }
}

/// Whether value `v` is `Less(_, extent)`: the mask [`mask_reductions`] builds.
fn is_extent_mask(g: &Graph, v: ValueId, extent: ValueId) -> bool {
    match g.values[v].def {
        crate::graph::ValueDef::Node { node, .. } => {
            let n = &g.nodes[node];
            n.op.kind == OpKind::Less && n.inputs.get(1).copied().flatten() == Some(extent)
        }
        _ => false,
    }
}

/// Whether value `v` is `Where(mask, x, identity)` with the extent mask.
fn is_masked(g: &Graph, v: Option<ValueId>, extent: ValueId) -> bool {
    let Some(v) = v else { return false };
    match g.values[v].def {
        crate::graph::ValueDef::Node { node, .. } => {
            let n = &g.nodes[node];
            n.op.kind == OpKind::Where
                && n.inputs.first().copied().flatten().is_some_and(|m| is_extent_mask(g, m, extent))
        }
        _ => false,
    }
}

/// Whether `kind` is element-wise (with broadcasting): a data-dependent or bounded
/// axis of an operand passes to the same axis of the result, right-aligned. Both
/// analyses ([`analyse`], [`crate::bounded::analyse`]) take these ops the same way.
pub(crate) fn is_elementwise(kind: OpKind) -> bool {
    use OpKind::*;
    #[rustfmt::skip]
    const ELEMENTWISE: &[OpKind] = &[
        Abs, Acos, Acosh, Add, And, Asin, Asinh, Atan, Atanh, BitShift, BitwiseAnd, BitwiseNot, BitwiseOr,
        BitwiseXor, Cast, CastLike, Ceil, Celu, Clip, Cos, Cosh, Div, Elu, Equal, Erf, Exp, Floor, Gelu, Greater,
        GreaterOrEqual, HardSigmoid, HardSwish, Identity, IsInf, IsNaN, LeakyRelu, Less, LessOrEqual, Log, Max,
        Mean, Min, Mish, Mod, Mul, Neg, Not, Or, Pow, PRelu, Reciprocal, Relu, Round, Selu, Shrink, Sigmoid, Sign,
        Sin, Sinh, Softplus, Softsign, Sqrt, Sub, Sum, Tan, Tanh, ThresholdedRelu, Where, Xor, Dropout,
    ];
    ELEMENTWISE.contains(&kind)
}

/// Whether `kind` is one of the `Reduce*` ops (ReduceAttrs, an optional `axes` operand).
pub(crate) fn is_reduction(kind: OpKind) -> bool {
    use OpKind::*;
    #[rustfmt::skip]
    const REDUCTIONS: &[OpKind] = &[
        ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp, ReduceMax, ReduceMean, ReduceMin, ReduceProd, ReduceSum,
        ReduceSumSquare,
    ];
    REDUCTIONS.contains(&kind)
}

/// The value a reduction leaves unchanged, as a scalar of `dtype` (`None` where kiln
/// has no mask for the reduction).
pub(crate) fn identity(kind: OpKind, dtype: crate::DType) -> Option<crate::Tensor> {
    use OpKind::*;
    let f = |x: f64| crate::Tensor::from_f64(dtype, crate::Shape::scalar(), &[x]).ok();
    let float = dtype.is_float();
    match kind {
        ReduceSum | ReduceSumSquare | ReduceL1 | ReduceL2 | ReduceLogSum | ReduceMean => f(0.0),
        ReduceProd => f(1.0),
        ReduceLogSumExp if float => f(f64::NEG_INFINITY),
        ReduceMax if float => f(f64::NEG_INFINITY),
        ReduceMin if float => f(f64::INFINITY),
        // (No mask for the packed 4-bit types.)
        ReduceMax | ReduceMin if dtype.is_int() && !dtype.is_packed() => {
            let (lo, hi) = dtype.int_range()?;
            let v = if kind == ReduceMax { lo } else { hi };
            // u64's largest value wraps to -1: Tensor::from_i64 wraps to the dtype.
            crate::Tensor::from_i64(dtype, crate::Shape::scalar(), &[v as i64]).ok()
        }
        _ => None,
    }
}

/// `Where(iota < extent, x, fill)` along `axis` of `x` (of type `ty`, `bound` there): the
/// positions past the run-time extent `ext` replaced by `fill`. Shared by the
/// data-dependent masking here and the bounded-input masking ([`crate::bounded::mask`]).
pub(crate) fn masked(
    out: &mut Graph,
    x: ValueId,
    ty: &crate::TensorType,
    axis: usize,
    bound: usize,
    ext: ValueId,
    fill: crate::Tensor,
) -> ValueId {
    use crate::op::Op;
    use crate::{DType, Shape, Tensor, TensorType};
    let mut idims = vec![1usize; ty.shape.rank()];
    idims[axis] = bound;
    let iota: Vec<i64> = (0..bound as i64).collect();
    let ishape = Shape::new(idims).unwrap_or_else(|_| Shape::scalar());
    let iota =
        out.add_const("", Tensor::from_i64(DType::I64, ishape.clone(), &iota).unwrap_or_else(|_| Tensor::scalar(0i64)));
    let (_, m) = out.add_node(
        String::new(),
        Op::new(OpKind::Less),
        vec![Some(iota), Some(ext)],
        vec![(String::new(), TensorType::new(DType::Bool, ishape))],
    );
    let f = out.add_const("", fill);
    let (_, w) = out.add_node(
        String::new(),
        Op::new(OpKind::Where),
        vec![Some(m[0]), Some(x), Some(f)],
        vec![(String::new(), ty.clone())],
    );
    w[0]
}

/// ReduceMean node `n` of `g` over run-time extents, added to `out` as `sum / count`:
/// `op` (the ReduceSum it became) on `inputs`, divided by the product of `others` (the
/// static extents of the other reduced axes) and each of the i64 `extents` cast to the
/// result's dtype. The quotient, named and typed as `n`'s result, is returned.
pub(crate) fn mean_of(
    out: &mut Graph,
    g: &Graph,
    n: &Node,
    op: crate::op::Op,
    inputs: Vec<Option<ValueId>>,
    extents: &[ValueId],
    others: f64,
) -> ValueId {
    use crate::op::{Attr, Attrs, Op};
    use crate::{Shape, Tensor, TensorType};
    let outs: Vec<(String, TensorType)> =
        n.outputs.iter().map(|&o| (g.values[o].name.clone(), g.ty(o).clone())).collect();
    let ty = outs[0].1.clone();
    let (_, sum) = out.add_node(n.name.clone(), op, inputs, vec![(String::new(), ty.clone())]);
    let sty = TensorType::new(ty.dtype, Shape::scalar());
    let mut attrs = Attrs::new();
    attrs.set("to", Attr::Int(ty.dtype.onnx_code().map_or(1, i64::from)));
    let cast = Op::parse(OpKind::Cast, &attrs).unwrap_or_else(|_| Op::new(OpKind::Identity));
    let k = Tensor::from_f64(ty.dtype, Shape::scalar(), &[others]).unwrap_or_else(|_| Tensor::scalar(1.0f32));
    let mut cnt = out.add_const("", k);
    for &e in extents {
        let (_, c) = out.add_node(String::new(), cast.clone(), vec![Some(e)], vec![(String::new(), sty.clone())]);
        let (_, m) = out.add_node(
            String::new(),
            Op::new(OpKind::Mul),
            vec![Some(cnt), Some(c[0])],
            vec![(String::new(), sty.clone())],
        );
        cnt = m[0];
    }
    let (_, q) = out.add_node(String::new(), Op::new(OpKind::Div), vec![Some(sum[0]), Some(cnt)], outs);
    q[0]
}

/// Rewrites every reduction along a data-dependent axis to read the extent: its operand
/// becomes `Where(iota < extent, x, identity)` (the padding holds the reduction's
/// identity: 0 for sums, 1 for a product, ∓∞ or the dtype's limits for a maximum or
/// minimum), and ReduceMean becomes a ReduceSum divided by the extent times the other
/// reduced extents. Nodes are kept in program order; other nodes are copied. Run before
/// [`analyse`], which accepts exactly these masked reductions.
pub fn mask_reductions(g: &Graph) -> Graph {
    use crate::op::Op;
    let dyn_of = analyse_with(g, false).unwrap_or_default();
    let (mut out, mut map) = g.rewrite_start(|_| true);
    let m = |map: &Vec<Option<ValueId>>, v: ValueId| map[v.index()];
    for (_, n) in g.nodes.iter() {
        let mut inputs: Vec<Option<ValueId>> = n.inputs.iter().map(|i| i.and_then(|v| m(&map, v))).collect();
        let mut op = n.op.clone();
        let mut mean_count: Option<(ValueId, f64)> = None;
        let reduce = is_reduction(n.op.kind);
        let d = n.inputs.first().copied().flatten().and_then(|x| dyn_of.get(x.index()).copied().flatten());
        if let (true, Some(d), Some(x), Ok(a)) =
            (reduce, d, n.inputs.first().copied().flatten(), n.op.attrs_of::<ReduceAttrs>())
        {
            let xt = g.ty(x).clone();
            let axes = reduced_axes(g, n, a, xt.shape.rank());
            let (Some(id), Some(ext)) = (identity(n.op.kind, xt.dtype), m(&map, d.extent)) else {
                // No mask for this reduction: left for analyse to refuse.
                out.copy_node(g, n, op, inputs, &mut map);
                continue;
            };
            if axes.contains(&d.axis) {
                inputs[0] = inputs[0].map(|x| masked(&mut out, x, &xt, d.axis, d.bound, ext, id));
                if n.op.kind == OpKind::ReduceMean {
                    let others: f64 =
                        axes.iter().filter(|&&a| a != d.axis).map(|&a| xt.shape.dims()[a] as f64).product();
                    op = Op::with_typed(OpKind::ReduceSum, a.clone()).unwrap_or(op);
                    mean_count = Some((ext, others));
                }
            }
        }
        match mean_count {
            None => out.copy_node(g, n, op, inputs, &mut map),
            Some((ext, others)) => {
                map[n.outputs[0].index()] = Some(mean_of(&mut out, g, n, op, inputs, &[ext], others))
            }
        }
    }
    out.outputs = g.outputs.iter().filter_map(|v| map[v.index()]).collect();
    out.bounded = g.bounded.clone();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Tensor};

    #[test]
    fn integer_max_and_min_identities_are_the_dtype_limits() {
        let limits = [
            (DType::I8, Tensor::scalar(i8::MIN), Tensor::scalar(i8::MAX)),
            (DType::U8, Tensor::scalar(u8::MIN), Tensor::scalar(u8::MAX)),
            (DType::I16, Tensor::scalar(i16::MIN), Tensor::scalar(i16::MAX)),
            (DType::U16, Tensor::scalar(u16::MIN), Tensor::scalar(u16::MAX)),
            (DType::I32, Tensor::scalar(i32::MIN), Tensor::scalar(i32::MAX)),
            (DType::U32, Tensor::scalar(u32::MIN), Tensor::scalar(u32::MAX)),
            (DType::I64, Tensor::scalar(i64::MIN), Tensor::scalar(i64::MAX)),
            (DType::U64, Tensor::scalar(u64::MIN), Tensor::scalar(u64::MAX)),
        ];
        for (d, lo, hi) in limits {
            assert_eq!(identity(OpKind::ReduceMax, d), Some(lo), "{d}");
            assert_eq!(identity(OpKind::ReduceMin, d), Some(hi), "{d}");
        }
        for d in [DType::I4, DType::U4] {
            assert_eq!(identity(OpKind::ReduceMax, d), None, "{d}");
        }
    }
}
