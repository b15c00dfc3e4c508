//! Rebuilding a graph node by node: the way passes change a graph (the arenas are
//! append-only, so a pass writes a new graph with dense ids, in program order).

use kiln_ir::entity::EntityId;
use kiln_ir::{Graph, Node, Tensor, ValueId};

/// What to do with one node.
pub enum Action {
    /// Keep it.
    Keep,
    /// Drop it; each result becomes the given (already rewritten) value.
    Replace(Vec<ValueId>),
    /// Drop it; its results become these constants.
    Constants(Vec<Tensor>),
}

/// Rebuilds `g`. `decide` sees each node with its operands already mapped into the
/// new graph (`new` is the graph so far, to which it may add nodes and constants that
/// a `Replace` then names) and says what to do with it. Graph inputs
/// and constants are kept (constants in the order they appear; unused ones are left
/// for dead-code elimination).
pub fn rebuild(g: &Graph, mut decide: impl FnMut(&mut Graph, &Node, &[Option<ValueId>]) -> Action) -> Graph {
    let (mut new, mut map) = g.rewrite_start(|_| true);
    for (_, n) in g.nodes.iter() {
        let inputs: Vec<Option<ValueId>> = n.inputs.iter().map(|i| i.and_then(|v| map[v.index()])).collect();
        match decide(&mut new, n, &inputs) {
            Action::Keep => new.copy_node(g, n, n.op.clone(), inputs, &mut map),
            Action::Replace(vals) => {
                for (&o, v) in n.outputs.iter().zip(vals) {
                    map[o.index()] = Some(v);
                }
            }
            Action::Constants(ts) => {
                for (&o, t) in n.outputs.iter().zip(ts) {
                    map[o.index()] = Some(new.add_const(g.values[o].name.clone(), t));
                }
            }
        }
    }
    new.outputs = g.outputs.iter().filter_map(|v| map[v.index()]).collect();
    new.bounded = g.bounded.clone();
    new
}

/// [`rebuild`], also saying whether `decide` rewrote any node (answered anything but
/// [`Action::Keep`]).
pub fn rebuild_tracked(
    g: &Graph,
    mut decide: impl FnMut(&mut Graph, &Node, &[Option<ValueId>]) -> Action,
) -> (Graph, bool) {
    let mut changed = false;
    let new = rebuild(g, |new, n, inputs| {
        let action = decide(new, n, inputs);
        changed |= !matches!(action, Action::Keep);
        action
    });
    (new, changed)
}
