//! Tensor-level passes. Each is small and does one thing; the pipeline order is
//! [`crate::registry`]'s: elide no-op nodes first (so folding and CSE see through
//! them), fold, fold batch normalisations into the convolutions before them, merge
//! the per-channel scales and shifts left (other batch normalisations, Mul/Add by
//! per-channel constants) into one of each, rewrite products of one-hot encodings as
//! the row lookups they are and fold the elementwise ops after a lookup into its
//! table, then merge equal constants (which makes more nodes look alike), merge equal nodes, and
//! drop what nothing uses last.
//!
//! No pass removes or renames a graph output: an output defined by a node that
//! would go away keeps its node (outputs carry the model's names).

use crate::fold::{constant_operands, fold_from_type, try_fold};
use crate::rewrite::{rebuild, rebuild_tracked, Action};
use crate::{Pass, PassError};
use kiln_ir::entity::EntityId;
use kiln_ir::{Graph, Node, OpKind, ValueDef, ValueId};
use std::collections::HashMap;

/// How many node operands and graph outputs read each value.
pub(crate) fn readers(g: &Graph) -> HashMap<ValueId, usize> {
    let mut readers: HashMap<ValueId, usize> = HashMap::new();
    for (_, n) in g.nodes.iter() {
        for v in n.inputs.iter().flatten() {
            *readers.entry(*v).or_insert(0) += 1;
        }
    }
    for v in &g.outputs {
        *readers.entry(*v).or_insert(0) += 1;
    }
    readers
}

/// The `name` and `summary` of a tensor pass's [`Pass`] impl.
macro_rules! named {
    ($name:literal, $summary:literal) => {
        fn name(&self) -> &'static str {
            $name
        }
        fn summary(&self) -> &'static str {
            $summary
        }
    };
}

fn defines_output(g: &Graph, n: &Node) -> bool {
    n.outputs.iter().any(|o| g.outputs.contains(o))
}

/// `tensor-elide-identities`: removes nodes whose result is their first operand
/// unchanged.
pub struct ElideIdentities;

impl ElideIdentities {
    fn is_noop(g: &Graph, n: &Node) -> bool {
        let (Some(Some(x)), [y]) = (n.inputs.first(), n.outputs.as_slice()) else {
            return false;
        };
        let (tx, ty) = (g.ty(*x), g.ty(*y));
        if tx != ty {
            return false;
        }
        match n.op.kind {
            OpKind::Identity | OpKind::Dropout => true,
            // Same type in and out: nothing moves.
            OpKind::Cast
            | OpKind::CastLike
            | OpKind::Reshape
            | OpKind::Flatten
            | OpKind::Expand
            | OpKind::Squeeze
            | OpKind::Unsqueeze
            | OpKind::Tile => true,
            OpKind::Transpose => match n.op.attrs_of::<kiln_ir::attrs::TransposeAttrs>().map(|a| &a.perm) {
                Ok(Some(p)) => p.iter().enumerate().all(|(i, &a)| a == i as i64),
                // Default perm reverses the axes: a no-op for rank ≤ 1.
                Ok(None) => tx.shape.rank() <= 1,
                Err(_) => false,
            },
            // The same shape taken with positive steps: along every axis longer than one,
            // every element from the first (as tf2onnx writes a strided_slice of `:`).
            OpKind::Slice => match n.inputs.get(4).copied().flatten() {
                None => true,
                Some(s) => g.constant(s).and_then(|t| t.to_i64_vec().ok()).is_some_and(|v| v.iter().all(|&s| s > 0)),
            },
            _ => false,
        }
    }
}

impl Pass for ElideIdentities {
    named!(
        "tensor-elide-identities",
        "remove Identity, inference Dropout, and Cast/Reshape/Expand/Tile/Transpose/Slice nodes that change nothing"
    );
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let (new, changed) = rebuild_tracked(g, |_, n, inputs| {
            if Self::is_noop(g, n) && !defines_output(g, n) {
                if let Some(Some(x)) = inputs.first() {
                    return Action::Replace(vec![*x]);
                }
            }
            Action::Keep
        });
        *g = new;
        Ok(changed)
    }
}

/// `tensor-fold-constants`: evaluates nodes whose operands are all constants (and
/// Shape/Size of any value) at compile time, within the policy of [`crate::fold`].
pub struct FoldConstants;

impl Pass for FoldConstants {
    named!(
        "tensor-fold-constants",
        "evaluate nodes with constant operands (and Shape/Size of any value) with the reference evaluator"
    );
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let mut failure = None;
        let (new, changed) = rebuild_tracked(g, |new, n, inputs| {
            let tys: Vec<_> = n.outputs.iter().map(|&o| g.ty(o).clone()).collect();
            if let (Some(Some(x)), [out]) = (inputs.first(), tys.as_slice()) {
                if let Some(r) = fold_from_type(&n.op, new.ty(*x), out) {
                    return match r {
                        Ok(t) => Action::Constants(vec![t]),
                        Err(e) => {
                            failure.get_or_insert(format!("node `{}` ({}): {e}", n.name, n.op.kind));
                            Action::Keep
                        }
                    };
                }
            }
            let Some(consts) = constant_operands(new, inputs) else { return Action::Keep };
            match try_fold(&n.op, &consts, &tys) {
                Ok(Some(ts)) => Action::Constants(ts),
                Ok(None) => Action::Keep,
                Err(e) => {
                    failure.get_or_insert(format!("node `{}` ({}): {e}", n.name, n.op.kind));
                    Action::Keep
                }
            }
        });
        if let Some(message) = failure {
            return Err(PassError::Failed { pass: self.name(), message });
        }
        *g = new;
        Ok(changed)
    }
}

/// `tensor-deduplicate-constants`: makes every use of byte-identical constants of
/// one type refer to the first of them.
pub struct DeduplicateConstants;

impl Pass for DeduplicateConstants {
    named!("tensor-deduplicate-constants", "merge constants with the same type and bytes");
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let mut first: HashMap<(String, &[u8]), ValueId> = HashMap::new();
        let mut canon: Vec<Option<ValueId>> = vec![None; g.values.len()];
        for (vid, v) in g.values.iter() {
            if let ValueDef::Const(t) = &v.def {
                let key = (t.ty().to_string(), t.bytes().as_ref());
                let c = *first.entry(key).or_insert(vid);
                if c != vid {
                    canon[vid.index()] = Some(c);
                }
            }
        }
        let mut changed = false;
        for node in g.nodes.values_mut() {
            for v in node.inputs.iter_mut().flatten() {
                if let Some(c) = canon[v.index()] {
                    *v = c;
                    changed = true;
                }
            }
        }
        if changed {
            *g = g.without_dead_code();
        }
        Ok(changed)
    }
}

/// Nodes are candidates for merging when their op kind and operands agree.
type CseKey = (OpKind, Vec<Option<ValueId>>);

/// `tensor-eliminate-common-subexpressions`: a node with the same op, attributes
/// and operands as an earlier one reuses the earlier one's results.
pub struct EliminateCommonSubexpressions;

impl Pass for EliminateCommonSubexpressions {
    named!("tensor-eliminate-common-subexpressions", "merge nodes with the same op, attributes and operands");
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let mut seen: HashMap<CseKey, Vec<(kiln_ir::Op, Vec<ValueId>)>> = HashMap::new();
        let (new, changed) = rebuild_tracked(g, |new, n, inputs| {
            let key = (n.op.kind, inputs.to_vec());
            let tys: Vec<_> = n.outputs.iter().map(|&o| g.ty(o).clone()).collect();
            if !defines_output(g, n) {
                if let Some(cands) = seen.get(&key) {
                    for (op, outs) in cands {
                        let same_types = outs.len() == tys.len() && outs.iter().zip(&tys).all(|(o, t)| new.ty(*o) == t);
                        if *op == n.op && same_types {
                            return Action::Replace(outs.clone());
                        }
                    }
                }
            }
            // Recorded after it is added: its new result ids follow the graph so far.
            let first = new.values.len();
            let outs = (0..n.outputs.len()).map(|i| ValueId::new(first + i)).collect();
            seen.entry(key).or_default().push((n.op.clone(), outs));
            Action::Keep
        });
        *g = new;
        Ok(changed)
    }
}

/// `tensor-eliminate-dead-code`: drops nodes and constants no output depends on.
pub struct EliminateDeadCode;

impl Pass for EliminateDeadCode {
    named!("tensor-eliminate-dead-code", "remove nodes and constants that no graph output depends on");
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let new = g.without_dead_code();
        let changed = new.nodes.len() != g.nodes.len() || new.values.len() != g.values.len();
        *g = new;
        Ok(changed)
    }
}

/// `tensor-fold-batch-norm`: folds an inference `BatchNormalization` into the `Conv`
/// that feeds it and nothing else, when the filter, the bias (if any) and the four
/// statistics are f32 constants: with `s = scale / √(var + ε)` per output channel,
/// `W' = W · s` (along the filter's first axis) and `b' = (b − mean) · s + B`.
///
/// The convolution then needs no epilogue for it: without the fold, every element pays
/// a subtraction, a division by a square root computed per element and a multiply-add,
/// and a depthwise convolution followed by one cannot fuse it at all (its epilogue only
/// takes per-channel constants). The folded values are rounded once to f32 from f64.
pub struct FoldBatchNorm;

/// An inference BatchNormalization's statistics per channel: `s = scale / √(var + ε)`
/// (in f64), its bias and its mean.
struct BatchNormStats {
    s: Vec<f64>,
    bias: Vec<f32>,
    mean: Vec<f32>,
}

/// The statistics of `bn` (inference form, one result) whose operands are `inputs`
/// (values of `g`), when its scale, bias, mean and variance are f32 constants of `m`
/// values each.
fn batch_norm_stats(g: &Graph, bn: &Node, inputs: &[Option<ValueId>], m: usize) -> Option<BatchNormStats> {
    if bn.op.kind != OpKind::BatchNormalization || bn.outputs.len() != 1 {
        return None;
    }
    let attrs = bn.op.attrs_of::<kiln_ir::attrs::BatchNormAttrs>().ok()?;
    if attrs.training_mode {
        return None;
    }
    let stat = |i: usize| {
        let t = g.constant((*inputs.get(i)?)?)?;
        (t.dtype() == kiln_ir::DType::F32).then(|| t.to_vec::<f32>().ok()).flatten().filter(|v| v.len() == m)
    };
    let (scale, bias, mean, var) = (stat(1)?, stat(2)?, stat(3)?, stat(4)?);
    let eps = attrs.epsilon as f64;
    let s = scale.iter().zip(&var).map(|(&a, &v)| a as f64 / (v as f64 + eps).sqrt()).collect();
    Some(BatchNormStats { s, bias, mean })
}

impl FoldBatchNorm {
    /// `(W', b')` for the Conv node `conv` and the BatchNormalization node `bn`, or `None`.
    fn folded(g: &Graph, conv: &Node, bn: &Node) -> Option<(kiln_ir::Tensor, kiln_ir::Tensor)> {
        let f32s = |v: Option<ValueId>| -> Option<(Vec<f32>, kiln_ir::Shape)> {
            let t = g.constant(v?)?;
            if t.dtype() != kiln_ir::DType::F32 {
                return None;
            }
            Some((t.to_vec::<f32>().ok()?, t.shape().clone()))
        };
        let (w, wshape) = f32s(*conv.inputs.get(1)?)?;
        let m = *wshape.dims().first()?;
        if wshape.rank() < 3 || m == 0 {
            return None;
        }
        let b = match conv.inputs.get(2).copied().flatten() {
            Some(v) => f32s(Some(v))?.0,
            None => vec![0.0; m],
        };
        let BatchNormStats { s, bias: shift, mean } = batch_norm_stats(g, bn, &bn.inputs, m)?;
        if b.len() != m {
            return None;
        }
        let per = w.len() / m;
        let w2: Vec<f32> = w.iter().enumerate().map(|(i, &x)| (x as f64 * s[i / per]) as f32).collect();
        let b2: Vec<f32> = (0..m).map(|c| ((b[c] as f64 - mean[c] as f64) * s[c] + shift[c] as f64) as f32).collect();
        let b_shape = kiln_ir::Shape::new(vec![m]).ok()?;
        Some((kiln_ir::Tensor::from_vec(wshape, w2).ok()?, kiln_ir::Tensor::from_vec(b_shape, b2).ok()?))
    }
}

impl Pass for FoldBatchNorm {
    named!(
        "tensor-fold-batch-norm",
        "fold an inference BatchNormalization into the Conv that feeds only it (constant f32 filter and statistics)"
    );
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        // Readers of each value (graph outputs count), and the node defining it.
        let readers = readers(g);
        let mut producer: HashMap<ValueId, kiln_ir::NodeId> = HashMap::new();
        for (id, n) in g.nodes.iter() {
            for &o in &n.outputs {
                producer.insert(o, id);
            }
        }
        let mut folds = Vec::new();
        for (bid, bn) in g.nodes.iter() {
            // (`folded` takes only inference batch norms of one result.)
            if bn.op.kind != OpKind::BatchNormalization || bn.outputs.len() != 1 {
                continue;
            }
            let Some(Some(x)) = bn.inputs.first() else { continue };
            let Some(&cid) = producer.get(x) else { continue };
            let conv = &g.nodes[cid];
            if conv.op.kind != OpKind::Conv || conv.outputs.len() != 1 || readers.get(x) != Some(&1) {
                continue;
            }
            // (A graph output keeps its node and its name.)
            if g.ty(*x) != g.ty(bn.outputs[0]) || g.outputs.contains(&bn.outputs[0]) {
                continue;
            }
            if let Some((w, b)) = Self::folded(g, conv, bn) {
                folds.push((cid, bid, w, b));
            }
        }
        if folds.is_empty() {
            return Ok(false);
        }
        // The folded BatchNormalizations, by their result.
        let mut folded = std::collections::HashSet::new();
        for (cid, bid, w, b) in folds {
            let name = g.values[g.nodes[cid].outputs[0]].name.clone();
            let wv = g.add_const(format!("{name}.folded_w"), w);
            let bv = g.add_const(format!("{name}.folded_b"), b);
            let x = g.nodes[cid].inputs[0];
            g.nodes[cid].inputs = vec![x, Some(wv), Some(bv)];
            folded.insert(g.nodes[bid].outputs[0]);
        }
        // Their readers read the convolution instead.
        let new = rebuild(g, |_, n, inputs| match inputs.first() {
            Some(Some(x)) if n.outputs.first().is_some_and(|o| folded.contains(o)) => Action::Replace(vec![*x]),
            _ => Action::Keep,
        });
        *g = new;
        Ok(true)
    }
}

/// `tensor-fold-channel-affine`: merges chains of per-channel scales and shifts by
/// constants into one scale and one shift. An inference `BatchNormalization` with f32
/// constant statistics is `x·s + t` (`s = scale/√(var + ε)`, `t = bias − mean·s`); a
/// `Mul`, `Add` or `Sub` of an f32 value of rank ≥ 2 by a constant that varies along
/// axis 1 at most (a scalar, or ones but the channel's extent `C` there) is one too.
/// Where such an op reads the result of another and is its only reader, the two become
/// `x·s' + t'` (`s' = s₁·s₂`, `t' = t₁·s₂ + t₂`, worked out in f64 and rounded once),
/// emitted as a `Mul` and an `Add` (either left out when it would change nothing); a
/// lone `BatchNormalization` is emitted so too.
///
/// A convolution whose filter is not a constant (so the batch norm after it cannot fold
/// into it) followed by a batch norm, a `Mul` and an `Add` had six per-channel operands
/// in its epilogue, more than a contraction tile keeps pointers for; after this pass it
/// has two. Rounding: the products and sums of constants round once instead of at each
/// step, so results move by about an ulp of the largest term.
pub struct FoldChannelAffine;

/// `x·scale + shift`, per channel (`scale` and `shift` of length `C`).
#[derive(Clone)]
struct ChannelAffine {
    x: ValueId,
    scale: Vec<f64>,
    shift: Vec<f64>,
}

impl FoldChannelAffine {
    /// The per-channel values of constant `c` for a value of type `ty` (f32, rank ≥ 2,
    /// `C` channels on axis 1): `c` must broadcast to `ty` without enlarging it and vary
    /// along axis 1 at most.
    fn per_channel(ty: &kiln_ir::TensorType, c: &kiln_ir::Tensor) -> Option<Vec<f64>> {
        let xd = ty.shape.dims();
        if ty.dtype != kiln_ir::DType::F32 || c.dtype() != kiln_ir::DType::F32 || xd.len() < 2 {
            return None;
        }
        let ch = xd[1];
        let cd = c.shape().dims();
        if cd.len() > xd.len() {
            return None;
        }
        let lead = xd.len() - cd.len();
        for (i, &d) in cd.iter().enumerate() {
            let axis = lead + i;
            let ok = d == 1 || (axis == 1 && d == ch);
            if !ok {
                return None;
            }
        }
        let v = c.to_vec::<f32>().ok()?;
        match v.len() {
            1 => Some(vec![v[0] as f64; ch]),
            n if n == ch => Some(v.iter().map(|&x| x as f64).collect()),
            _ => None,
        }
    }

    /// Node `n` (its operands already in `g`) as `x·scale + shift` of one operand `x`.
    fn affine_of(g: &Graph, n: &Node, inputs: &[Option<ValueId>]) -> Option<ChannelAffine> {
        if n.outputs.len() != 1 {
            return None;
        }
        match n.op.kind {
            OpKind::BatchNormalization => {
                let x = inputs.first().copied().flatten()?;
                let ty = g.ty(x);
                if ty.dtype != kiln_ir::DType::F32 {
                    return None;
                }
                // (Verified graphs: X of rank ≥ 2, statistics of shape [C].)
                let BatchNormStats { s, bias, mean } = batch_norm_stats(g, n, inputs, *ty.shape.dims().get(1)?)?;
                let t: Vec<f64> = (0..s.len()).map(|c| bias[c] as f64 - mean[c] as f64 * s[c]).collect();
                Some(ChannelAffine { x, scale: s, shift: t })
            }
            OpKind::Mul | OpKind::Add | OpKind::Sub => {
                let (a, b) = (inputs.first().copied().flatten()?, inputs.get(1).copied().flatten()?);
                // The variable operand and the constant; a Sub's constant must be second.
                let (x, c) = match (g.constant(a), g.constant(b)) {
                    (None, Some(c)) => (a, c),
                    (Some(c), None) if n.op.kind != OpKind::Sub => (b, c),
                    _ => return None,
                };
                let ty = g.ty(x);
                let v = Self::per_channel(ty, c)?;
                let ch = v.len();
                Some(match n.op.kind {
                    OpKind::Mul => ChannelAffine { x, scale: v, shift: vec![0.0; ch] },
                    OpKind::Add => ChannelAffine { x, scale: vec![1.0; ch], shift: v },
                    _ => ChannelAffine { x, scale: vec![1.0; ch], shift: v.iter().map(|s| -s).collect() },
                })
            }
            _ => None,
        }
    }

    /// `[1, C, 1, …]` of `v` rounded to f32, for a value of rank `rank`.
    fn constant(v: &[f64], rank: usize) -> Option<kiln_ir::Tensor> {
        let mut dims = vec![1; rank];
        dims[1] = v.len();
        let shape = kiln_ir::Shape::new(dims).ok()?;
        kiln_ir::Tensor::from_vec(shape, v.iter().map(|&x| x as f32).collect()).ok()
    }
}

impl Pass for FoldChannelAffine {
    named!(
        "tensor-fold-channel-affine",
        "merge chains of per-channel scales and shifts by constants (BatchNormalization, Mul, Add, Sub) into one Mul and one Add"
    );
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        // Readers of each value of the old graph (graph outputs count).
        let readers = readers(g);
        // Per value of the new graph that an affine node defines: its form, and whether
        // the value it stands for has that one reader (so its form may merge into it).
        let mut forms: HashMap<ValueId, (ChannelAffine, bool)> = HashMap::new();
        let mut changed = false;
        let old: &Graph = g;
        let new = rebuild(old, |new, n, inputs| {
            let Some(mut f) = Self::affine_of(new, n, inputs) else { return Action::Keep };
            let single = readers.get(&n.outputs[0]) == Some(&1);
            let (out_name, out_ty) = (old.values[n.outputs[0]].name.clone(), old.ty(n.outputs[0]).clone());
            let merged = match forms.get(&f.x) {
                Some((inner, true)) if inner.scale.len() == f.scale.len() => {
                    let scale: Vec<f64> = inner.scale.iter().zip(&f.scale).map(|(a, b)| a * b).collect();
                    let shift: Vec<f64> =
                        inner.shift.iter().zip(&f.scale).zip(&f.shift).map(|((t, s), u)| t * s + u).collect();
                    f = ChannelAffine { x: inner.x, scale, shift };
                    true
                }
                _ => false,
            };
            if !merged && n.op.kind != OpKind::BatchNormalization {
                // Nothing to merge into: the node as it is, its form remembered for the
                // op after it.
                let (_, outs) = new.add_node(n.name.clone(), n.op.clone(), inputs.to_vec(), vec![(out_name, out_ty)]);
                forms.insert(outs[0], (f, single));
                return Action::Replace(outs);
            }
            let rank = out_ty.shape.rank();
            let (Some(sc), Some(sh)) = (Self::constant(&f.scale, rank), Self::constant(&f.shift, rank)) else {
                return Action::Keep;
            };
            if new.ty(f.x) != &out_ty {
                return Action::Keep;
            }
            changed = true;
            // x·S + T, the Mul left out for a scale of ones (the Add is kept when both
            // would go: the result is a node of its own, with its name).
            let scaled = f.scale.iter().any(|&s| s as f32 != 1.0);
            let shifted = f.shift.iter().any(|&t| t as f32 != 0.0) || !scaled;
            let mut v = f.x;
            if scaled {
                let c = new.add_const(format!("{out_name}.scale"), sc);
                let name = if shifted { format!("{out_name}.scaled") } else { out_name.clone() };
                let op = kiln_ir::Op::new(OpKind::Mul);
                let node = format!("{}.scale", if n.name.is_empty() { &out_name } else { &n.name });
                v = new.add_node(node, op, vec![Some(v), Some(c)], vec![(name, out_ty.clone())]).1[0];
            }
            if shifted {
                let c = new.add_const(format!("{out_name}.shift"), sh);
                let op = kiln_ir::Op::new(OpKind::Add);
                v = new.add_node(n.name.clone(), op, vec![Some(v), Some(c)], vec![(out_name, out_ty)]).1[0];
            }
            forms.insert(v, (f, single));
            Action::Replace(vec![v])
        });
        *g = new;
        Ok(changed)
    }
}

/// `tensor-rewrite-one-hot-products`: a one-hot encoding multiplied by a constant
/// matrix, `MatMul(Cast(Equal(x, [0, 1, …, K − 1])), W)` with `x` of shape `[.., 1]`
/// (how JAX and tf2onnx write an embedding lookup: `jax.nn.one_hot`, then a dense
/// layer), becomes the lookup it is: `Gather([W; 0], Min(Max(x, −1), K))`, row `x` of `W`
/// where `0 ≤ x < K` and the appended zero row where not (Gather reads index `−1` as
/// the last row), as the one-hot of an index out of range is all zeros. The indices
/// are clipped as i64 (an i32 `x` is cast first): the lookup's index is then computed
/// once per row of the result by the vector kernels' scalar code, which works in i64. Exact for a
/// finite `W`: each sum is one product by 1 and the rest by 0. The one-hot tensor (`K`
/// values per index) is then neither written nor read by a product `K` times the
/// lookup's work (magika: a `[2048, 257] × [257, 64]` product and the 2 MB encoding
/// in front of it).
pub struct RewriteOneHotProducts;

impl RewriteOneHotProducts {
    /// `(x, W)` where MatMul node `n` (its operands in `g`) is such a product.
    fn matched(g: &Graph, n: &Node, inputs: &[Option<ValueId>]) -> Option<(ValueId, kiln_ir::Tensor)> {
        use kiln_ir::DType;
        if n.op.kind != OpKind::MatMul {
            return None;
        }
        let (a, w) = (inputs.first().copied().flatten()?, inputs.get(1).copied().flatten()?);
        let wt = g.constant(w)?;
        let &[k, _] = wt.shape().dims() else { return None };
        if wt.dtype() != DType::F32 || !wt.to_vec::<f32>().ok()?.iter().all(|v| v.is_finite()) {
            return None;
        }
        let def = |v: ValueId| match g.values[v].def {
            ValueDef::Node { node, .. } => Some(&g.nodes[node]),
            _ => None,
        };
        let cast = def(a)?;
        let ad = g.ty(a).shape.dims();
        if cast.op.kind != OpKind::Cast || g.ty(a).dtype != DType::F32 || ad.len() < 2 || ad.last() != Some(&k) {
            return None;
        }
        let eq = def(cast.inputs.first().copied().flatten()?)?;
        if eq.op.kind != OpKind::Equal {
            return None;
        }
        let (p, q) = (eq.inputs.first().copied().flatten()?, eq.inputs.get(1).copied().flatten()?);
        let lead = &ad[..ad.len() - 1];
        [(p, q), (q, p)].into_iter().find_map(|(x, t)| {
            // The table: 0, 1, …, K − 1 along the last axis, extent 1 on the others.
            let tab = g.constant(t)?;
            let td = tab.shape().dims();
            let iota = tab.to_i64_vec().ok()?.iter().enumerate().all(|(i, &v)| v == i as i64);
            let flat = td.last() == Some(&k) && td.len() <= ad.len() && td[..td.len() - 1].iter().all(|&d| d == 1);
            // The indices: `[.., 1]` over the product's rows, of a type Gather takes.
            let xt = g.ty(x);
            let xd = xt.shape.dims();
            let rows = xd.len() == ad.len() && xd[..xd.len() - 1] == *lead && xd.last() == Some(&1);
            (iota && flat && rows && matches!(xt.dtype, DType::I32 | DType::I64)).then(|| (x, wt.clone()))
        })
    }
}

impl Pass for RewriteOneHotProducts {
    named!(
        "tensor-rewrite-one-hot-products",
        "rewrite a one-hot encoding times a constant matrix (MatMul(Cast(Equal(x, 0..K)), W)) as a row lookup Gather([W; 0], Min(Max(x, -1), K))"
    );
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        use kiln_ir::{DType, Op, Shape, Tensor, TensorType};
        let old: &Graph = g;
        let (new, changed) = rebuild_tracked(old, |new, n, inputs| {
            let Some((x, w)) = Self::matched(new, n, inputs) else { return Action::Keep };
            let (out_name, out_ty) = (old.values[n.outputs[0]].name.clone(), old.ty(n.outputs[0]).clone());
            let xt = new.ty(x).clone();
            let lead = xt.shape.dims()[..xt.shape.rank() - 1].to_vec();
            let base = if n.name.is_empty() { out_name.clone() } else { n.name.clone() };
            let x = match xt.dtype {
                DType::I64 => x,
                _ => {
                    let Some(code) = DType::I64.onnx_code() else { return Action::Keep };
                    let to = kiln_ir::op::Attrs::new().with("to", kiln_ir::op::Attr::Int(code.into()));
                    let Ok(op) = Op::parse(OpKind::Cast, &to) else { return Action::Keep };
                    let ty = TensorType::new(DType::I64, xt.shape.clone());
                    new.add_node(format!("{base}.wide"), op, vec![Some(x)], vec![(format!("{out_name}.wide"), ty)]).1[0]
                }
            };
            let &[k, cols] = w.shape().dims() else { return Action::Keep };
            let mut rows = w.to_vec::<f32>().unwrap_or_default();
            rows.resize((k + 1) * cols, 0.0);
            let dims: Vec<i64> = lead.iter().map(|&d| d as i64).collect();
            let consts = || -> Option<_> {
                Some((
                    Tensor::from_vec(Shape::new(vec![k + 1, cols]).ok()?, rows).ok()?,
                    Tensor::from_i64(DType::I64, Shape::new(vec![dims.len()]).ok()?, &dims).ok()?,
                    Tensor::from_i64(DType::I64, Shape::scalar(), &[-1]).ok()?,
                    Tensor::from_i64(DType::I64, Shape::scalar(), &[k as i64]).ok()?,
                    Shape::new(lead.clone()).ok()?,
                ))
            };
            let Some((table, shape, lo, hi, index_shape)) = consts() else { return Action::Keep };
            let index_ty = TensorType::new(DType::I64, index_shape);
            let shape = new.add_const(format!("{out_name}.index.shape"), shape);
            let index = new.add_node(
                format!("{base}.index"),
                Op::new(OpKind::Reshape),
                vec![Some(x), Some(shape)],
                vec![(format!("{out_name}.index"), index_ty.clone())],
            );
            let (lo, hi) = (new.add_const(format!("{out_name}.lo"), lo), new.add_const(format!("{out_name}.hi"), hi));
            // Max then Min rather than Clip: each reads its operand once, so the lookup's
            // index, computed once per row by scalar code, loads `x` once per use.
            let above = new.add_node(
                format!("{base}.above"),
                Op::new(OpKind::Max),
                vec![Some(index.1[0]), Some(lo)],
                vec![(format!("{out_name}.above"), index_ty.clone())],
            );
            let clipped = new.add_node(
                format!("{base}.clip"),
                Op::new(OpKind::Min),
                vec![Some(above.1[0]), Some(hi)],
                vec![(format!("{out_name}.clipped"), index_ty)],
            );
            let table = new.add_const(format!("{out_name}.rows"), table);
            let gather = new.add_node(
                n.name.clone(),
                Op::new(OpKind::Gather),
                vec![Some(table), Some(clipped.1[0])],
                vec![(out_name, out_ty)],
            );
            Action::Replace(gather.1)
        });
        *g = new;
        Ok(changed)
    }
}

/// `tensor-fold-lookup-tables`: an elementwise op over rows looked up in a constant
/// table, `f(Gather(T, i), c…)` with every other operand a constant that does not vary
/// along the indices, is the lookup of `f` applied to the table, `Gather(f(T, c…), i)`:
/// evaluated once per table row at compile time rather than once per index at run
/// time. Chains fold op by op (magika's GELU after its byte embedding: a bias, the
/// cubic, tanh, two scales and products of the chain's own values become one table of
/// 258 rows, looked up for its 2048 bytes). Taken where the table has no more elements
/// than the lookup's result (a small vocabulary looked up many times), so no constant
/// grows past the tensor it replaces; the intermediate tables nothing reads any more
/// are left to `tensor-eliminate-dead-code`. Exact: the same operation on the same
/// operands, per element.
pub struct FoldLookupTables;

/// A value that is `Gather(table, index)` along axis 0.
#[derive(Clone)]
struct Lookup {
    table: kiln_ir::Tensor,
    index: ValueId,
}

impl FoldLookupTables {
    /// Whether `kind` computes each result element from the operands' elements at its
    /// own (broadcast) index alone.
    fn elementwise(kind: OpKind) -> bool {
        use OpKind::*;
        matches!(
            kind,
            Add | Sub
                | Mul
                | Div
                | Max
                | Min
                | Pow
                | Neg
                | Abs
                | Relu
                | Tanh
                | Sigmoid
                | Erf
                | Exp
                | Log
                | Sqrt
                | Reciprocal
                | LeakyRelu
                | Elu
                | Selu
                | Celu
                | Softplus
                | Softsign
                | HardSigmoid
                | HardSwish
                | Gelu
                | Mish
                | Clip
        )
    }

    /// Constant `c`, an operand of a result of rank `r` whose first `q` axes are the
    /// indices', as an operand of the table (`[1, data axes…]`): `None` unless it is the
    /// same at every index (of extent 1 there, or equal slices).
    fn table_operand(c: &kiln_ir::Tensor, r: usize, q: usize) -> Option<kiln_ir::Tensor> {
        let cd = c.shape().dims();
        if cd.len() > r {
            return None;
        }
        let mut pd = vec![1usize; r - cd.len()];
        pd.extend_from_slice(cd);
        let inner: usize = pd[q..].iter().product();
        let mut dims = vec![1usize];
        dims.extend_from_slice(&pd[q..]);
        let shape = kiln_ir::Shape::new(dims).ok()?;
        if pd[..q].iter().all(|&d| d == 1) {
            return c.reshaped(shape).ok();
        }
        // Equal slices along the index axes: the first one.
        let bytes = c.bytes();
        let width = c.dtype().storage_bytes(inner);
        if width == 0 || !bytes.len().is_multiple_of(width) || !bytes.chunks(width).all(|s| s == &bytes[..width]) {
            return None;
        }
        kiln_ir::Tensor::new(kiln_ir::TensorType::new(c.dtype(), shape), bytes.slice(..width)).ok()
    }
}

impl Pass for FoldLookupTables {
    named!(
        "tensor-fold-lookup-tables",
        "fold elementwise ops over a Gather of a constant table (other operands constants the same at every index) into the table"
    );
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        use kiln_ir::{Op, TensorType};
        let old: &Graph = g;
        let mut forms: HashMap<ValueId, Lookup> = HashMap::new();
        let mut changed = false;
        let new = rebuild(old, |new, n, inputs| {
            let [out] = n.outputs.as_slice() else { return Action::Keep };
            let (out_name, out_ty) = (old.values[*out].name.clone(), old.ty(*out).clone());
            // A lookup in a constant table along axis 0: kept, and remembered.
            if n.op.kind == OpKind::Gather {
                let axis0 = n.op.attrs_of::<kiln_ir::attrs::GatherAttrs>().is_ok_and(|a| a.axis == 0);
                let (Some(Some(t)), Some(Some(i))) = (inputs.first(), inputs.get(1)) else { return Action::Keep };
                let Some(table) = new.constant(*t).cloned() else { return Action::Keep };
                if !axis0 || new.constant(*i).is_some() || table.shape().rank() == 0 {
                    return Action::Keep;
                }
                let (_, outs) = new.add_node(n.name.clone(), n.op.clone(), inputs.to_vec(), vec![(out_name, out_ty)]);
                forms.insert(outs[0], Lookup { table, index: *i });
                return Action::Replace(outs);
            }
            if !Self::elementwise(n.op.kind) {
                return Action::Keep;
            }
            // The lookup the op reads (one index for all), its operands over the table.
            let Some(lookup) = inputs.iter().flatten().find_map(|v| forms.get(v)).cloned() else { return Action::Keep };
            let q = new.ty(lookup.index).shape.rank();
            let r = out_ty.shape.rank();
            let looked_up: Vec<usize> = [new.ty(lookup.index).shape.dims(), &lookup.table.shape().dims()[1..]].concat();
            if out_ty.shape.dims() != looked_up.as_slice() || lookup.table.numel() > out_ty.shape.numel() {
                return Action::Keep;
            }
            let mut operands: Vec<Option<kiln_ir::Tensor>> = Vec::with_capacity(inputs.len());
            for v in inputs {
                let Some(v) = v else {
                    operands.push(None);
                    continue;
                };
                let t = match (forms.get(v), new.constant(*v)) {
                    (Some(l), _) if l.index == lookup.index && l.table.shape() == lookup.table.shape() => {
                        l.table.clone()
                    }
                    (None, Some(c)) => match Self::table_operand(c, r, q) {
                        Some(t) => t,
                        None => return Action::Keep,
                    },
                    _ => return Action::Keep,
                };
                operands.push(Some(t));
            }
            let refs: Vec<Option<&kiln_ir::Tensor>> = operands.iter().map(|o| o.as_ref()).collect();
            let ty = TensorType::new(out_ty.dtype, lookup.table.shape().clone());
            let Ok(Some(mut folded)) = try_fold(&n.op, &refs, std::slice::from_ref(&ty)) else { return Action::Keep };
            let Some(table) = folded.pop() else { return Action::Keep };
            changed = true;
            let t = new.add_const(format!("{out_name}.table"), table.clone());
            let (_, outs) = new.add_node(
                n.name.clone(),
                Op::new(OpKind::Gather),
                vec![Some(t), Some(lookup.index)],
                vec![(out_name, out_ty)],
            );
            forms.insert(outs[0], Lookup { table, index: lookup.index });
            Action::Replace(outs)
        });
        *g = new;
        Ok(changed)
    }
}
