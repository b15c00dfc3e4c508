//! Tensor-level passes. Each is small and does one thing; the pipeline order is
//! [`crate::registry`]'s: elide no-op nodes first (so folding and CSE see through
//! them), fold, then merge equal constants (which makes more nodes look alike),
//! merge equal nodes, and drop what nothing uses last.
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
