//! The graph verifier.
//!
//! [`verify`] checks every invariant of a tensor-level [`Graph`]; passes run it on their
//! output in debug and test builds. It is split in two so that each half can run on its own:
//!
//! - [`verify_structure`]: the SSA form.
//!   - Every value's definition is consistent: a `Node { node, index }` value is exactly
//!     `nodes[node].outputs[index]`; an `Input` value is listed in [`Graph::inputs`] exactly
//!     once; a constant's tensor has the value's type.
//!   - [`Graph::inputs`] lists only `Input` values, each once.
//!   - Names are unique among values with a non-empty name.
//!   - Every node operand is defined earlier in program order (a graph input, a constant, or
//!     an output of an earlier node). This also rules out cycles.
//!   - Every node output is a value defined by that node at that index, and no value is an
//!     output of two nodes (or twice of one).
//!   - Every graph output exists and is defined.
//! - [`verify_types`]: every node's result types equal what [`infer`] gives for its operands
//!   (types and constant contents). An op that shape inference rejects or does not support is
//!   an error too.
//!
//! Each check reports the first broken invariant it finds, naming the node (id, name, op) and
//! value (id, name) involved. Checks never panic, whatever the graph holds.

use crate::entity::EntityId;
use crate::graph::{Graph, NodeId, Value, ValueDef, ValueId};
use crate::infer::{infer, InferError, InferInput};
use crate::op::OpKind;
use crate::shape::TensorType;
use core::fmt;
use std::collections::HashMap;

/// A node, as named in an error: `node n3 "conv1" (Conv)`.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRef {
    /// The node's id.
    pub id: NodeId,
    /// Its name (may be empty).
    pub name: String,
    /// Its operator.
    pub op: OpKind,
}

impl fmt::Display for NodeRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            write!(f, "node {} ({})", self.id, self.op)
        } else {
            write!(f, "node {} {:?} ({})", self.id, self.name, self.op)
        }
    }
}

/// A value, as named in an error: `%17 "conv1.weight"`.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueRef {
    /// The value's id.
    pub id: ValueId,
    /// Its name (empty when unnamed, or when the id is out of range).
    pub name: String,
}

impl fmt::Display for ValueRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.is_empty() {
            write!(f, "{}", self.id)
        } else {
            write!(f, "{} {:?}", self.id, self.name)
        }
    }
}

/// A broken invariant of a graph. `Display` is one line that says where.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum VerifyError {
    /// A subgraph of a node (an `If` branch: 0 then, 1 else) breaks an invariant.
    #[error("{node}, subgraph {branch}: {error}")]
    Subgraph {
        /// The node carrying the subgraph.
        node: NodeRef,
        /// Which of its subgraphs.
        branch: usize,
        /// What is wrong there.
        error: Box<VerifyError>,
    },
    /// A value claims to be output `index` of a node that does not list it there (or that
    /// does not exist).
    #[error("value {value} claims to be output {index} of node {node}, which {actual}")]
    ValueDefMismatch {
        /// The value.
        value: ValueRef,
        /// The node it names.
        node: NodeId,
        /// The output index it names.
        index: usize,
        /// What is really there, in words.
        actual: String,
    },
    /// A value defined as a graph input is missing from the graph's input list.
    #[error("value {value} is defined as a graph input but is not in the graph's inputs")]
    InputNotListed {
        /// The value.
        value: ValueRef,
    },
    /// The graph's input list names a value id out of range.
    #[error("graph input {position} is {value}, which does not exist")]
    DanglingInput {
        /// Position in [`Graph::inputs`].
        position: usize,
        /// The id.
        value: ValueId,
    },
    /// The graph's input list names a value that is not defined as an input.
    #[error("graph input {position} is {value}, which is {def}, not a graph input")]
    InputNotInputDef {
        /// Position in [`Graph::inputs`].
        position: usize,
        /// The value.
        value: ValueRef,
        /// Its real definition, in words.
        def: String,
    },
    /// The graph's input list names a value twice.
    #[error("graph inputs {first} and {second} are both {value}")]
    InputListedTwice {
        /// The value.
        value: ValueRef,
        /// Its first position in [`Graph::inputs`].
        first: usize,
        /// Its second position.
        second: usize,
    },
    /// A constant's tensor does not have the value's type.
    #[error("constant {value} has type {value_ty} but its tensor is {tensor_ty}")]
    ConstTypeMismatch {
        /// The value.
        value: ValueRef,
        /// The value's declared type.
        value_ty: Box<TensorType>,
        /// The tensor's type.
        tensor_ty: Box<TensorType>,
    },
    /// Two values share a non-empty name.
    #[error("values {first} and {second} are both named {name:?}")]
    DuplicateName {
        /// The name.
        name: String,
        /// The first value with it.
        first: ValueId,
        /// The second.
        second: ValueId,
    },
    /// A node operand is a value id out of range.
    #[error("{node}: operand {operand} is {value}, which does not exist")]
    DanglingOperand {
        /// The node.
        node: NodeRef,
        /// Operand position.
        operand: usize,
        /// The id.
        value: ValueId,
    },
    /// A node operand is not defined before the node (a use before definition, or a cycle).
    #[error("{node}: operand {operand} is {value}, which is not defined before it ({def})")]
    UseBeforeDef {
        /// The node.
        node: NodeRef,
        /// Operand position.
        operand: usize,
        /// The value.
        value: ValueRef,
        /// Its definition, in words.
        def: String,
    },
    /// A node output is a value id out of range.
    #[error("{node}: output {index} is {value}, which does not exist")]
    DanglingResult {
        /// The node.
        node: NodeRef,
        /// Output position.
        index: usize,
        /// The id.
        value: ValueId,
    },
    /// A value is listed as an output of two nodes, or twice by one node.
    #[error("{node}: output {index} is {value}, already output {first_index} of node {first_node}")]
    DefinedTwice {
        /// The node listing it the second time.
        node: NodeRef,
        /// Output position there.
        index: usize,
        /// The value.
        value: ValueRef,
        /// The node listing it first.
        first_node: NodeId,
        /// Output position there.
        first_index: usize,
    },
    /// A node output is a value whose definition says something else.
    #[error("{node}: output {index} is {value}, which is {def}")]
    ResultDefMismatch {
        /// The node.
        node: NodeRef,
        /// Output position.
        index: usize,
        /// The value.
        value: ValueRef,
        /// Its real definition, in words.
        def: String,
    },
    /// A graph output is a value id out of range.
    #[error("graph output {position} is {value}, which does not exist")]
    DanglingOutput {
        /// Position in [`Graph::outputs`].
        position: usize,
        /// The id.
        value: ValueId,
    },
    /// A graph output is a value that nothing defines.
    #[error("graph output {position} is {value}, which is never defined ({def})")]
    UndefinedOutput {
        /// Position in [`Graph::outputs`].
        position: usize,
        /// The value.
        value: ValueRef,
        /// Its definition, in words.
        def: String,
    },
    /// Shape inference failed for a node.
    #[error("{node}: shape inference failed: {error}")]
    Infer {
        /// The node.
        node: NodeRef,
        /// Why.
        error: InferError,
    },
    /// Shape inference gave another number of results than the node has.
    #[error("{node}: shape inference gave {inferred} result types for {declared} outputs")]
    ResultCount {
        /// The node.
        node: NodeRef,
        /// Outputs the node has.
        declared: usize,
        /// Types inference returned.
        inferred: usize,
    },
    /// A node result's type differs from the inferred one.
    #[error("{node}: output {index} {value} has type {declared}, but inference gives {inferred}")]
    TypeMismatch {
        /// The node.
        node: NodeRef,
        /// Output position.
        index: usize,
        /// The value.
        value: ValueRef,
        /// The value's type.
        declared: Box<TensorType>,
        /// The inferred type.
        inferred: Box<TensorType>,
    },
}

/// Checks every invariant of the tensor level: [`verify_structure`], then [`verify_types`].
pub fn verify(graph: &Graph) -> Result<(), VerifyError> {
    verify_structure(graph)?;
    verify_types(graph)?;
    // The subgraphs of control-flow nodes, each on its own (they are closed graphs).
    for (nid, node) in graph.nodes.iter() {
        for (branch, g) in node.op.subgraphs().into_iter().enumerate() {
            verify(g).map_err(|error| VerifyError::Subgraph {
                node: node_ref(graph, nid),
                branch,
                error: Box::new(error),
            })?;
        }
    }
    Ok(())
}

fn node_ref(graph: &Graph, id: NodeId) -> NodeRef {
    let n = &graph.nodes[id];
    NodeRef { id, name: n.name.clone(), op: n.op.kind }
}

fn value_ref(graph: &Graph, id: ValueId) -> ValueRef {
    ValueRef { id, name: graph.values.get(id).map(|v| v.name.clone()).unwrap_or_default() }
}

fn describe_def(v: &Value) -> String {
    match &v.def {
        ValueDef::Input => "a graph input".to_string(),
        ValueDef::Const(_) => "a constant".to_string(),
        ValueDef::Node { node, index } => format!("output {index} of node {node}"),
    }
}

/// Checks the SSA structure: everything but the result types (see the module docs).
pub fn verify_structure(graph: &Graph) -> Result<(), VerifyError> {
    // Graph inputs: in range, defined as inputs, each once.
    let mut input_pos: HashMap<ValueId, usize> = HashMap::new();
    for (position, &v) in graph.inputs.iter().enumerate() {
        let Some(val) = graph.values.get(v) else {
            return Err(VerifyError::DanglingInput { position, value: v });
        };
        if val.def != ValueDef::Input {
            return Err(VerifyError::InputNotInputDef { position, value: value_ref(graph, v), def: describe_def(val) });
        }
        if let Some(&first) = input_pos.get(&v) {
            return Err(VerifyError::InputListedTwice { value: value_ref(graph, v), first, second: position });
        }
        input_pos.insert(v, position);
    }

    // Values: definitions consistent, unique names.
    let mut names: HashMap<&str, ValueId> = HashMap::new();
    for (id, v) in graph.values.iter() {
        if !v.name.is_empty() {
            if let Some(&first) = names.get(v.name.as_str()) {
                return Err(VerifyError::DuplicateName { name: v.name.clone(), first, second: id });
            }
            names.insert(&v.name, id);
        }
        match &v.def {
            ValueDef::Input => {
                if !input_pos.contains_key(&id) {
                    return Err(VerifyError::InputNotListed { value: value_ref(graph, id) });
                }
            }
            ValueDef::Const(t) => {
                if t.ty() != &v.ty {
                    return Err(VerifyError::ConstTypeMismatch {
                        value: value_ref(graph, id),
                        value_ty: Box::new(v.ty.clone()),
                        tensor_ty: Box::new(t.ty().clone()),
                    });
                }
            }
            &ValueDef::Node { node, index } => {
                let actual = match graph.nodes.get(node) {
                    None => Some("does not exist".to_string()),
                    Some(n) => match n.outputs.get(index) {
                        None => Some(format!("has {} outputs", n.outputs.len())),
                        Some(&o) if o != id => Some(format!("lists {o} there")),
                        Some(_) => None,
                    },
                };
                if let Some(actual) = actual {
                    return Err(VerifyError::ValueDefMismatch { value: value_ref(graph, id), node, index, actual });
                }
            }
        }
    }

    // Nodes in program order: operands defined before use, outputs defined here once.
    let mut defined: Vec<bool> =
        graph.values.values().map(|v| matches!(v.def, ValueDef::Input | ValueDef::Const(_))).collect();
    let mut defined_by: Vec<Option<(NodeId, usize)>> = vec![None; graph.values.len()];
    for (nid, node) in graph.nodes.iter() {
        for (operand, v) in node.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            match graph.values.get(v) {
                None => {
                    return Err(VerifyError::DanglingOperand { node: node_ref(graph, nid), operand, value: v });
                }
                Some(val) if !defined[v.index()] => {
                    return Err(VerifyError::UseBeforeDef {
                        node: node_ref(graph, nid),
                        operand,
                        value: value_ref(graph, v),
                        def: describe_def(val),
                    });
                }
                Some(_) => {}
            }
        }
        for (index, &o) in node.outputs.iter().enumerate() {
            let Some(val) = graph.values.get(o) else {
                return Err(VerifyError::DanglingResult { node: node_ref(graph, nid), index, value: o });
            };
            if let Some((first_node, first_index)) = defined_by[o.index()] {
                return Err(VerifyError::DefinedTwice {
                    node: node_ref(graph, nid),
                    index,
                    value: value_ref(graph, o),
                    first_node,
                    first_index,
                });
            }
            if val.def != (ValueDef::Node { node: nid, index }) {
                return Err(VerifyError::ResultDefMismatch {
                    node: node_ref(graph, nid),
                    index,
                    value: value_ref(graph, o),
                    def: describe_def(val),
                });
            }
            defined_by[o.index()] = Some((nid, index));
        }
        for &o in &node.outputs {
            defined[o.index()] = true;
        }
    }

    // Graph outputs.
    for (position, &v) in graph.outputs.iter().enumerate() {
        let Some(val) = graph.values.get(v) else {
            return Err(VerifyError::DanglingOutput { position, value: v });
        };
        if !defined[v.index()] {
            return Err(VerifyError::UndefinedOutput { position, value: value_ref(graph, v), def: describe_def(val) });
        }
    }
    Ok(())
}

/// Checks that every node's result types are what shape inference gives for its operands.
///
/// Meant to run after [`verify_structure`]; on a structurally broken graph it reports a
/// dangling operand or result rather than panicking.
pub fn verify_types(graph: &Graph) -> Result<(), VerifyError> {
    for (nid, node) in graph.nodes.iter() {
        let mut operands = Vec::with_capacity(node.inputs.len());
        for (operand, v) in node.inputs.iter().enumerate() {
            operands.push(match *v {
                None => None,
                Some(v) => {
                    let Some(val) = graph.values.get(v) else {
                        return Err(VerifyError::DanglingOperand { node: node_ref(graph, nid), operand, value: v });
                    };
                    Some(InferInput { ty: &val.ty, value: val.constant() })
                }
            });
        }
        let inferred = infer(&node.op, &operands, node.outputs.len())
            .map_err(|error| VerifyError::Infer { node: node_ref(graph, nid), error })?;
        if inferred.len() != node.outputs.len() {
            return Err(VerifyError::ResultCount {
                node: node_ref(graph, nid),
                declared: node.outputs.len(),
                inferred: inferred.len(),
            });
        }
        for (index, (&o, ty)) in node.outputs.iter().zip(inferred).enumerate() {
            let Some(val) = graph.values.get(o) else {
                return Err(VerifyError::DanglingResult { node: node_ref(graph, nid), index, value: o });
            };
            if val.ty != ty {
                return Err(VerifyError::TypeMismatch {
                    node: node_ref(graph, nid),
                    index,
                    value: value_ref(graph, o),
                    declared: Box::new(val.ty.clone()),
                    inferred: Box::new(ty),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::op::Op;
    use crate::shape::Shape;
    use crate::tensor::Tensor;

    fn f32_ty(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
    }

    /// x, w (const) → a = Add(x, w) → r = Relu(a); outputs [r].
    fn good() -> (Graph, [ValueId; 4]) {
        let mut g = Graph::new("g");
        let x = g.add_input("x", f32_ty(&[2]));
        let w = g.add_const("w", Tensor::from_vec(Shape::new(vec![2]).unwrap(), vec![1.0f32, 2.0]).unwrap());
        let (_, a) = g.add_node("add", Op::new(OpKind::Add), vec![Some(x), Some(w)], vec![("a".into(), f32_ty(&[2]))]);
        let (_, r) = g.add_node("relu", Op::new(OpKind::Relu), vec![Some(a[0])], vec![("r".into(), f32_ty(&[2]))]);
        g.outputs.push(r[0]);
        (g, [x, w, a[0], r[0]])
    }

    fn n(i: usize) -> NodeId {
        NodeId::new(i)
    }

    #[test]
    fn good_graph_passes_structure() {
        let (g, _) = good();
        assert_eq!(verify_structure(&g), Ok(()));
        // Absent optional operands and unnamed values are fine.
        let mut g2 = Graph::new("g2");
        let x = g2.add_input("", f32_ty(&[3]));
        let (_, y) =
            g2.add_node("", Op::new(OpKind::Clip), vec![Some(x), None, None], vec![(String::new(), f32_ty(&[3]))]);
        g2.outputs.push(y[0]);
        assert_eq!(verify_structure(&g2), Ok(()));
        assert_eq!(verify_structure(&Graph::new("empty")), Ok(()));
    }

    #[test]
    fn use_of_a_later_value_is_caught() {
        let (mut g, [_, _, _, r]) = good();
        // add now reads relu's result: a cycle add → relu → add.
        g.nodes[n(0)].inputs[1] = Some(r);
        let e = verify_structure(&g).unwrap_err();
        assert!(matches!(e, VerifyError::UseBeforeDef { ref node, operand: 1, ref value, .. }
            if node.id == n(0) && node.op == OpKind::Add && value.id == r));
        let msg = e.to_string();
        assert!(msg.contains("\"add\"") && msg.contains("Add") && msg.contains("\"r\""), "{msg}");
        assert!(!msg.contains('\n'));
    }

    #[test]
    fn self_use_is_caught() {
        let (mut g, [_, _, a, _]) = good();
        g.nodes[n(0)].inputs[0] = Some(a);
        assert!(matches!(verify_structure(&g), Err(VerifyError::UseBeforeDef { operand: 0, .. })));
    }

    #[test]
    fn dangling_ids_are_caught() {
        let (mut g, _) = good();
        g.nodes[n(1)].inputs[0] = Some(ValueId::new(99));
        let e = verify_structure(&g).unwrap_err();
        assert!(matches!(e, VerifyError::DanglingOperand { ref node, operand: 0, value }
            if node.id == n(1) && value == ValueId::new(99)));
        assert!(e.to_string().contains("%99"), "{e}");

        let (mut g, _) = good();
        g.nodes[n(1)].outputs.push(ValueId::new(42));
        assert!(matches!(verify_structure(&g), Err(VerifyError::DanglingResult { index: 1, .. })));

        let (mut g, _) = good();
        g.inputs.push(ValueId::new(7));
        assert!(matches!(verify_structure(&g), Err(VerifyError::DanglingInput { position: 1, .. })));
    }

    #[test]
    fn duplicate_name_is_caught() {
        let (mut g, [x, _, a, _]) = good();
        g.values[a].name = "x".into();
        assert_eq!(verify_structure(&g), Err(VerifyError::DuplicateName { name: "x".into(), first: x, second: a }));
    }

    #[test]
    fn wrong_constant_type_is_caught() {
        let (mut g, [_, w, _, _]) = good();
        g.values[w].ty = f32_ty(&[3]);
        let e = verify_structure(&g).unwrap_err();
        assert!(matches!(e, VerifyError::ConstTypeMismatch { ref value, .. } if value.id == w));
        assert!(e.to_string().contains("f32[3]") && e.to_string().contains("f32[2]"), "{e}");
    }

    #[test]
    fn undefined_output_is_caught() {
        let (mut g, _) = good();
        g.outputs.push(ValueId::new(50));
        assert!(matches!(verify_structure(&g), Err(VerifyError::DanglingOutput { position: 1, .. })));

        // A value that claims a node which does not exist.
        let (mut g, _) = good();
        let ghost = g.values.push(Value {
            ty: f32_ty(&[2]),
            name: "ghost".into(),
            def: ValueDef::Node { node: n(5), index: 0 },
        });
        g.outputs.push(ghost);
        let e = verify_structure(&g).unwrap_err();
        assert!(matches!(e, VerifyError::ValueDefMismatch { ref value, .. } if value.id == ghost), "{e}");
    }

    #[test]
    fn inconsistent_definitions_are_caught() {
        // A value listed as the output of two nodes.
        let (mut g, [_, _, a, _]) = good();
        g.nodes[n(1)].outputs.push(a);
        assert!(matches!(
            verify_structure(&g),
            Err(VerifyError::DefinedTwice { index: 1, first_node, first_index: 0, .. }) if first_node == n(0)
        ));
        // A node output that is a graph input.
        let (mut g, [x, _, _, _]) = good();
        g.nodes[n(1)].outputs.push(x);
        assert!(matches!(verify_structure(&g), Err(VerifyError::ResultDefMismatch { index: 1, .. })));
        // A value whose def names the wrong index.
        let (mut g, [_, _, a, _]) = good();
        g.values[a].def = ValueDef::Node { node: n(0), index: 1 };
        assert!(matches!(verify_structure(&g), Err(VerifyError::ValueDefMismatch { index: 1, .. })));
        // An input value missing from the input list, one listed twice, a constant listed.
        let (mut g, [x, w, _, _]) = good();
        g.inputs.clear();
        assert!(matches!(verify_structure(&g), Err(VerifyError::InputNotListed { ref value }) if value.id == x));
        g.inputs = vec![x, x];
        assert!(matches!(verify_structure(&g), Err(VerifyError::InputListedTwice { first: 0, second: 1, .. })));
        g.inputs = vec![x, w];
        assert!(matches!(verify_structure(&g), Err(VerifyError::InputNotInputDef { position: 1, .. })));
    }

    #[test]
    fn type_pass_reports_inference_failures() {
        // Whatever shape inference can do today, a result typed i64 for Relu of f32 is wrong:
        // the type pass must reject it (as a mismatch, or as an inference error).
        let mut g = Graph::new("t");
        let x = g.add_input("x", f32_ty(&[2]));
        let (_, r) = g.add_node(
            "relu",
            Op::new(OpKind::Relu),
            vec![Some(x)],
            vec![("r".into(), TensorType::new(DType::I64, Shape::new(vec![2]).unwrap()))],
        );
        g.outputs.push(r[0]);
        assert_eq!(verify_structure(&g), Ok(()));
        let e = verify(&g).unwrap_err();
        assert!(matches!(e, VerifyError::TypeMismatch { .. } | VerifyError::Infer { .. }), "{e}");
        assert!(e.to_string().contains("\"relu\" (Relu)"), "{e}");
    }
}
