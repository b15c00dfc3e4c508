//! Tensor-level passes. Each is small and does one thing; the pipeline order is
//! [`crate::registry`]'s: elide no-op nodes first (so folding and CSE see through
//! them), fold, fold batch normalisations into the convolutions before them, then
//! merge equal constants (which makes more nodes look alike), merge equal nodes, and
//! drop what nothing uses last.
//!
//! No pass removes or renames a graph output: an output defined by a node that
//! would go away keeps its node (outputs carry the model's names).

use crate::fold::{constant_operands, fold_from_type, try_fold};
use crate::rewrite::{rebuild, Action};
use crate::{Pass, PassError};
use kiln_ir::entity::EntityId;
use kiln_ir::{Graph, Node, OpKind, ValueDef, ValueId};
use std::collections::HashMap;

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
            OpKind::Transpose => match n.op.attrs.ints("perm") {
                Ok(Some(p)) => p.iter().enumerate().all(|(i, &a)| a == i as i64),
                // Default perm reverses the axes: a no-op for rank ≤ 1.
                Ok(None) => tx.shape.rank() <= 1,
                Err(_) => false,
            },
            _ => false,
        }
    }
}

impl Pass for ElideIdentities {
    fn name(&self) -> &'static str {
        "tensor-elide-identities"
    }
    fn summary(&self) -> &'static str {
        "remove Identity, inference Dropout, and Cast/Reshape/Expand/Tile/Transpose nodes that change nothing"
    }
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let mut changed = false;
        let new = rebuild(g, |_, n, inputs| {
            if Self::is_noop(g, n) && !defines_output(g, n) {
                if let Some(Some(x)) = inputs.first() {
                    changed = true;
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
    fn name(&self) -> &'static str {
        "tensor-fold-constants"
    }
    fn summary(&self) -> &'static str {
        "evaluate nodes with constant operands (and Shape/Size of any value) with the reference evaluator"
    }
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let mut changed = false;
        let mut failure = None;
        let new = rebuild(g, |new, n, inputs| {
            let tys: Vec<_> = n.outputs.iter().map(|&o| g.ty(o).clone()).collect();
            if let (Some(Some(x)), [out]) = (inputs.first(), tys.as_slice()) {
                if let Some(r) = fold_from_type(&n.op, new.ty(*x), out) {
                    return match r {
                        Ok(t) => {
                            changed = true;
                            Action::Constants(vec![t])
                        }
                        Err(e) => {
                            failure.get_or_insert(format!("node `{}` ({}): {e}", n.name, n.op.kind));
                            Action::Keep
                        }
                    };
                }
            }
            let Some(consts) = constant_operands(new, inputs) else { return Action::Keep };
            match try_fold(&n.op, &consts, &tys) {
                Ok(Some(ts)) => {
                    changed = true;
                    Action::Constants(ts)
                }
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
    fn name(&self) -> &'static str {
        "tensor-deduplicate-constants"
    }
    fn summary(&self) -> &'static str {
        "merge constants with the same type and bytes"
    }
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
    fn name(&self) -> &'static str {
        "tensor-eliminate-common-subexpressions"
    }
    fn summary(&self) -> &'static str {
        "merge nodes with the same op, attributes and operands"
    }
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let mut seen: HashMap<CseKey, Vec<(kiln_ir::Op, Vec<ValueId>)>> = HashMap::new();
        let mut changed = false;
        let new = rebuild(g, |new, n, inputs| {
            let key = (n.op.kind, inputs.to_vec());
            let tys: Vec<_> = n.outputs.iter().map(|&o| g.ty(o).clone()).collect();
            if !defines_output(g, n) {
                if let Some(cands) = seen.get(&key) {
                    for (op, outs) in cands {
                        let same_types = outs.len() == tys.len() && outs.iter().zip(&tys).all(|(o, t)| new.ty(*o) == t);
                        if *op == n.op && same_types {
                            changed = true;
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
    fn name(&self) -> &'static str {
        "tensor-eliminate-dead-code"
    }
    fn summary(&self) -> &'static str {
        "remove nodes and constants that no graph output depends on"
    }
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
        let stat = |i: usize| f32s(*bn.inputs.get(i)?).map(|(v, _)| v).filter(|v| v.len() == m);
        let (scale, shift, mean, var) = (stat(1)?, stat(2)?, stat(3)?, stat(4)?);
        if b.len() != m {
            return None;
        }
        let eps = bn.op.attrs.float_or("epsilon", 1e-5).ok()? as f64;
        let s: Vec<f64> = (0..m).map(|c| scale[c] as f64 / (var[c] as f64 + eps).sqrt()).collect();
        let per = w.len() / m;
        let w2: Vec<f32> = w.iter().enumerate().map(|(i, &x)| (x as f64 * s[i / per]) as f32).collect();
        let b2: Vec<f32> = (0..m).map(|c| ((b[c] as f64 - mean[c] as f64) * s[c] + shift[c] as f64) as f32).collect();
        let b_shape = kiln_ir::Shape::new(vec![m]).ok()?;
        Some((kiln_ir::Tensor::from_vec(wshape, w2).ok()?, kiln_ir::Tensor::from_vec(b_shape, b2).ok()?))
    }
}

impl Pass for FoldBatchNorm {
    fn name(&self) -> &'static str {
        "tensor-fold-batch-norm"
    }
    fn summary(&self) -> &'static str {
        "fold an inference BatchNormalization into the Conv that feeds only it (constant f32 filter and statistics)"
    }
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        // Readers of each value (graph outputs count), and the node defining it.
        let mut readers: HashMap<ValueId, usize> = HashMap::new();
        let mut producer: HashMap<ValueId, kiln_ir::NodeId> = HashMap::new();
        for (id, n) in g.nodes.iter() {
            for v in n.inputs.iter().flatten() {
                *readers.entry(*v).or_insert(0) += 1;
            }
            for &o in &n.outputs {
                producer.insert(o, id);
            }
        }
        for v in &g.outputs {
            *readers.entry(*v).or_insert(0) += 1;
        }
        let mut folds = Vec::new();
        for (bid, bn) in g.nodes.iter() {
            let training = bn.op.attrs.int_or("training_mode", 0).unwrap_or(1) != 0;
            if bn.op.kind != OpKind::BatchNormalization || bn.outputs.len() != 1 || training {
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
