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
            let x = g.ty(node.inputs.first().copied().flatten()?);
            let axis = match a.axis {
                Some(ax) => normalise(ax, x.shape.rank())?,
                None => 0,
            };
            Some((vec![(0, axis)], 1))
        }
        OpKind::Unique => {
            let a = node.op.attrs_of::<crate::attrs::UniqueAttrs>().ok()?;
            let x = g.ty(node.inputs.first().copied().flatten()?);
            let axis = match a.axis {
                Some(ax) => normalise(ax, x.shape.rank())?,
                None => 0,
            };
            Some((vec![(0, axis), (1, 0), (3, 0)], 4))
        }
        OpKind::TopK if n == 3 => {
            let a = node.op.attrs_of::<TopKAttrs>().ok()?;
            let x = g.ty(node.inputs.first().copied().flatten()?);
            let axis = normalise(a.axis, x.shape.rank())?;
            Some((vec![(0, axis), (1, axis)], 2))
        }
        _ => None,
    }
}

fn normalise(a: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if a < 0 { a + r } else { a };
    (0..r).contains(&a).then_some(a as usize)
}

/// Whether `g` (or an `If` branch in it) has a data-dependent op.
pub fn has_sources(g: &Graph) -> bool {
    g.nodes.values().any(|n| {
        source(n, g).is_some()
            || n.op.attrs_of::<crate::attrs::IfAttrs>().is_ok_and(|a| has_sources(&a.then_branch) || has_sources(&a.else_branch))
    })
}

/// The data-dependent axis of every value of `g` (indexed by value), or the first node
/// that cannot run on a bounded operand (see the module docs).
pub fn analyse(g: &Graph) -> Result<Vec<Option<DynAxis>>, DynamicError> {
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
        let out = propagate(g, node, &operands).map_err(err)?;
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
    let ints = |i: usize| -> Option<Vec<i64>> { node.inputs.get(i).copied().flatten().and_then(|v| g.constant(v)).and_then(|t| t.to_i64_vec().ok()) };
    let along = || format!("it would mix or reduce along the data-dependent axis {} of operand {i0}", d0.axis);
    let k = node.op.kind;
    match k {
        // Element-wise: the axis right-aligned into the result; every other operand
        // must broadcast along it (extent 1 or absent) or share the extent.
        Abs | Acos | Acosh | Add | And | Asin | Asinh | Atan | Atanh | BitShift | BitwiseAnd | BitwiseNot
        | BitwiseOr | BitwiseXor | Cast | CastLike | Ceil | Celu | Clip | Cos | Cosh | Div | Elu | Equal | Erf
        | Exp | Floor | Gelu | Greater | GreaterOrEqual | HardSigmoid | HardSwish | Identity | IsInf | IsNaN
        | LeakyRelu | Less | LessOrEqual | Log | Max | Mean | Min | Mish | Mod | Mul | Neg | Not | Or | Pow
        | PRelu | Reciprocal | Relu | Round | Selu | Shrink | Sigmoid | Sign | Sin | Sinh | Softplus | Softsign
        | Sqrt | Sub | Sum | Tan | Tanh | ThresholdedRelu | Where | Xor | Dropout => {
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
                if is_operand(i) {
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
            let axes: Vec<usize> = ints(1)
                .ok_or("Unsqueeze's axes must be a constant")?
                .iter()
                .filter_map(|&a| normalise(a, r))
                .collect();
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
        ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMax | ReduceMean | ReduceMin | ReduceProd
        | ReduceSum | ReduceSumSquare
            if i0 == 0 =>
        {
            let a = node.op.attrs_of::<ReduceAttrs>().map_err(|e| e.to_string())?;
            let r = in_rank(0);
            let axes: Vec<usize> = match ints(1) {
                Some(v) if !v.is_empty() => v.iter().filter_map(|&x| normalise(x, r)).collect(),
                _ if a.noop_with_empty_axes => Vec::new(),
                _ => (0..r).collect(),
            };
            if axes.contains(&d0.axis) {
                return Err(along());
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
