//! The tensor-level graph: typed SSA values defined once, by a graph input, a
//! constant, or one output of one node.
//!
//! Nodes are kept in program order; the verifier checks that this order is a
//! topological order (every operand defined before use), which also rules out cycles.

use crate::entity::{Arena, EntityId};
use crate::entity_id;
use crate::infer::{infer, InferError, InferInput};
use crate::op::Op;
use crate::shape::TensorType;
use crate::tensor::Tensor;
use std::collections::HashSet;

entity_id!(
    /// An SSA value.
    ValueId,
    "%"
);
entity_id!(
    /// A node (one operator application).
    NodeId,
    "n"
);

/// How a value is defined.
#[derive(Clone, Debug, PartialEq)]
pub enum ValueDef {
    /// A graph input (index into [`Graph::inputs`]).
    Input,
    /// A constant with known contents (weights, folded shapes).
    Const(Tensor),
    /// Output `index` of `node`.
    Node {
        /// The defining node.
        node: NodeId,
        /// Which of its outputs.
        index: usize,
    },
}

/// One SSA value.
#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    /// Its type (static).
    pub ty: TensorType,
    /// The name it had in the source model (unique within a graph, may be empty).
    pub name: String,
    /// Its definition.
    pub def: ValueDef,
}

impl Value {
    /// The constant contents, if the value is a constant.
    pub fn constant(&self) -> Option<&Tensor> {
        match &self.def {
            ValueDef::Const(t) => Some(t),
            _ => None,
        }
    }
}

/// One operator application.
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The node's name in the source model (may be empty).
    pub name: String,
    /// The operator.
    pub op: Op,
    /// Operands; `None` marks an absent optional input.
    pub inputs: Vec<Option<ValueId>>,
    /// Results, each defined by this node.
    pub outputs: Vec<ValueId>,
}

/// Whose integer arithmetic a quantized graph's QuantizeLinear/DequantizeLinear pairs
/// around float ops (QDQ) stand for: which of those groups become integer ops and with
/// which rounding (`kiln-opt`'s `tensor-fold-quantized-contractions`). A QDQ graph
/// describes a float simulation; the runtime its producer targets decides what is
/// computed on integers, and that is the result kiln reproduces.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum QuantSemantics {
    /// LiteRT's execution of a TFLite model (the TFLite importer's QDQ form, and graphs
    /// built in code): every QDQ contraction is an integer op, other ops stay float
    /// between their (de)quantisations.
    #[default]
    Integer,
    /// ONNX Runtime's CPU execution provider at its default optimisation level (an ONNX
    /// model): as `Integer`, and a quantized GlobalAveragePool that ONNX Runtime fuses is
    /// its `QLinearGlobalAveragePool` (integer sum, one f32 rescale).
    OnnxRuntimeCpu,
}

impl QuantSemantics {
    /// The name in the text form (`graph @name quant NAME (…)`); `integer` is the default
    /// and not printed.
    pub fn as_str(self) -> &'static str {
        match self {
            QuantSemantics::Integer => "integer",
            QuantSemantics::OnnxRuntimeCpu => "onnxruntime_cpu",
        }
    }

    /// The semantics named `s` in the text form.
    pub fn from_name(s: &str) -> Option<QuantSemantics> {
        match s {
            "integer" => Some(QuantSemantics::Integer),
            "onnxruntime_cpu" => Some(QuantSemantics::OnnxRuntimeCpu),
            _ => None,
        }
    }
}

/// A tensor-level program.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    /// The graph's name.
    pub name: String,
    /// Every value.
    pub values: Arena<ValueId, Value>,
    /// Every node, in program order.
    pub nodes: Arena<NodeId, Node>,
    /// Graph inputs, in signature order.
    pub inputs: Vec<ValueId>,
    /// Graph outputs, in signature order.
    pub outputs: Vec<ValueId>,
    /// Input dimensions whose extent the caller chooses at run time, up to a bound
    /// (`--input-shape x=1x1..128`; see [`crate::bounded`]). Empty for a static graph.
    pub bounded: Vec<crate::bounded::BoundedDim>,
    /// Whose integer arithmetic the graph's QDQ groups follow.
    pub quant: QuantSemantics,
}

impl Graph {
    /// An empty graph.
    pub fn new(name: impl Into<String>) -> Graph {
        Graph { name: name.into(), ..Graph::default() }
    }

    /// Adds a graph input.
    pub fn add_input(&mut self, name: impl Into<String>, ty: TensorType) -> ValueId {
        let v = self.values.push(Value { ty, name: name.into(), def: ValueDef::Input });
        self.inputs.push(v);
        v
    }

    /// Adds a constant.
    pub fn add_const(&mut self, name: impl Into<String>, t: Tensor) -> ValueId {
        let ty = t.ty().clone();
        self.values.push(Value { ty, name: name.into(), def: ValueDef::Const(t) })
    }

    /// Adds a node whose results have the given names and types; returns the node
    /// and its result values.
    pub fn add_node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        outputs: Vec<(String, TensorType)>,
    ) -> (NodeId, Vec<ValueId>) {
        let node = NodeId::new(self.nodes.len());
        let outs: Vec<ValueId> = outputs
            .into_iter()
            .enumerate()
            .map(|(index, (n, ty))| self.values.push(Value { ty, name: n, def: ValueDef::Node { node, index } }))
            .collect();
        let id = self.nodes.push(Node { name: name.into(), op, inputs, outputs: outs.clone() });
        debug_assert_eq!(id, node);
        (node, outs)
    }

    /// The value's type.
    pub fn ty(&self, v: ValueId) -> &TensorType {
        &self.values[v].ty
    }

    /// The value's constant contents, if constant.
    pub fn constant(&self, v: ValueId) -> Option<&Tensor> {
        self.values[v].constant()
    }

    /// The result types of `op` applied to these values: [`infer`] given each operand's
    /// type and, for a constant, its contents.
    pub fn infer_op(
        &self,
        op: &Op,
        inputs: &[Option<ValueId>],
        num_outputs: usize,
    ) -> Result<Vec<TensorType>, InferError> {
        let operands: Vec<Option<InferInput>> =
            inputs.iter().map(|o| o.map(|v| InferInput { ty: self.ty(v), value: self.constant(v) })).collect();
        infer(op, &operands, num_outputs)
    }

    /// Nodes whose results reach a graph output (directly or through other nodes).
    pub fn live_nodes(&self) -> HashSet<NodeId> {
        let mut live_values: HashSet<ValueId> = self.outputs.iter().copied().collect();
        let mut live = HashSet::new();
        for (id, node) in self.nodes.iter().collect::<Vec<_>>().into_iter().rev() {
            if node.outputs.iter().any(|o| live_values.contains(o)) {
                live.insert(id);
                live_values.extend(node.inputs.iter().flatten().copied());
            }
        }
        live
    }

    /// The start of a rewrite of this graph: a graph of the same name and quantisation
    /// semantics holding the graph inputs and constants that `keep` accepts (in value
    /// order), its inputs set; and the map from this graph's values to the new one's,
    /// `None` for node results until their nodes are copied ([`Graph::copy_node`]).
    pub fn rewrite_start(&self, keep: impl Fn(ValueId) -> bool) -> (Graph, Vec<Option<ValueId>>) {
        let mut out = Graph::new(self.name.clone());
        out.quant = self.quant;
        let mut map: Vec<Option<ValueId>> = vec![None; self.values.len()];
        for (vid, v) in self.values.iter() {
            if matches!(v.def, ValueDef::Input | ValueDef::Const(_)) && keep(vid) {
                map[vid.index()] = Some(out.values.push(v.clone()));
            }
        }
        out.inputs = self.inputs.iter().filter_map(|v| map[v.index()]).collect();
        (out, map)
    }

    /// Adds node `n` of graph `from` to this one as `op` on `inputs` (values of this
    /// graph), its results named and typed as `n`'s, and maps `n`'s results to them.
    pub fn copy_node(
        &mut self,
        from: &Graph,
        n: &Node,
        op: Op,
        inputs: Vec<Option<ValueId>>,
        map: &mut [Option<ValueId>],
    ) {
        let outs = n.outputs.iter().map(|&o| (from.values[o].name.clone(), from.values[o].ty.clone())).collect();
        let (_, new) = self.add_node(n.name.clone(), op, inputs, outs);
        for (&o, v) in n.outputs.iter().zip(new) {
            map[o.index()] = Some(v);
        }
    }

    /// A copy without dead nodes and without values nothing refers to (graph inputs
    /// always stay). Value and node ids are renumbered densely, keeping their order.
    pub fn without_dead_code(&self) -> Graph {
        let live = self.live_nodes();
        let mut used: HashSet<ValueId> = self.inputs.iter().chain(&self.outputs).copied().collect();
        for id in &live {
            let n = &self.nodes[*id];
            used.extend(n.inputs.iter().flatten().copied());
            used.extend(n.outputs.iter().copied());
        }
        let (mut out, mut map) = self.rewrite_start(|v| used.contains(&v));
        for (nid, n) in self.nodes.iter() {
            if live.contains(&nid) {
                let inputs = n.inputs.iter().map(|i| i.and_then(|v| map[v.index()])).collect();
                out.copy_node(self, n, n.op.clone(), inputs, &mut map);
            }
        }
        out.outputs = self.outputs.iter().filter_map(|v| map[v.index()]).collect();
        out.bounded = self.bounded.clone();
        out
    }
}

/// Prints the graph in the text form (see [`crate::text`]).
impl core::fmt::Display for Graph {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(&crate::text::print(self))
    }
}
