//! Values of a graph's signature as ONNX test data stores them (`TensorProto`,
//! `SequenceProto`, `OptionalProto`), and their flattening into the tensors a
//! compiled graph takes and gives (see `seq`'s module docs).

use super::proto::{type_proto, ModelProto, OptionalProto, SequenceProto, TensorProto, TypeProto};
use super::tensor::{tensor_from_proto, ExternalFiles};
use crate::{ImportError, ImportOptions};
use bytes::Bytes;
use kiln_ir::Tensor;
use prost::Message;
use std::collections::HashSet;

/// The kind of a graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// A tensor.
    Tensor,
    /// A sequence of tensors.
    Sequence,
    /// An optional of the inner kind.
    Optional(Box<ValueKind>),
}

/// A value of one of the [`ValueKind`]s.
#[derive(Clone, Debug)]
pub enum Value {
    /// A tensor.
    Tensor(Tensor),
    /// A sequence of tensors.
    Sequence(Vec<Tensor>),
    /// An optional: `None` when empty.
    Optional(Option<Box<Value>>),
}

impl Value {
    /// The tensors of this value under the names the importer gives them at the
    /// edge of a graph: `name`, `name[i]` per sequence element, nothing for an
    /// empty optional.
    pub fn flatten(&self, name: &str) -> Vec<(String, Tensor)> {
        match self {
            Value::Tensor(t) => vec![(name.to_string(), t.clone())],
            Value::Sequence(items) => {
                items.iter().enumerate().map(|(i, t)| (super::seq::element_name(name, i), t.clone())).collect()
            }
            Value::Optional(None) => Vec::new(),
            Value::Optional(Some(v)) => v.flatten(name),
        }
    }

    /// Records this value's form for input `name` in `opts` (a sequence's element
    /// shapes, an optional's absence), as a user would with `--input-shape`.
    pub fn describe_input(&self, name: &str, opts: &mut ImportOptions) {
        match self {
            Value::Tensor(_) => {}
            Value::Sequence(items) => {
                opts.input_sequences
                    .push((name.to_string(), items.iter().map(|t| t.shape().dims().to_vec()).collect()));
            }
            Value::Optional(None) => opts.absent_inputs.push(name.to_string()),
            Value::Optional(Some(v)) => v.describe_input(name, opts),
        }
    }
}

fn kind_of(t: Option<&TypeProto>) -> ValueKind {
    match t.and_then(|t| t.value.as_ref()) {
        Some(type_proto::Value::SequenceType(_)) => ValueKind::Sequence,
        Some(type_proto::Value::OptionalType(o)) => ValueKind::Optional(Box::new(kind_of(o.elem_type.as_deref()))),
        _ => ValueKind::Tensor,
    }
}

/// The kinds of a model's graph inputs (initializers left out) and outputs, by name.
#[allow(clippy::type_complexity)]
pub fn signature(data: Bytes) -> Result<(Vec<(String, ValueKind)>, Vec<(String, ValueKind)>), ImportError> {
    let model = ModelProto::decode(data).map_err(|e| ImportError::Decode(e.to_string()))?;
    let graph = model.graph.as_ref().ok_or_else(|| ImportError::Model("the model has no graph".into()))?;
    let inits: HashSet<&str> = graph.initializer.iter().filter_map(|t| t.name.as_deref()).collect();
    let ins = graph
        .input
        .iter()
        .filter(|i| !i.name.as_deref().is_some_and(|n| inits.contains(n)))
        .map(|i| (i.name.clone().unwrap_or_default(), kind_of(i.r#type.as_ref())))
        .collect();
    let outs = graph.output.iter().map(|o| (o.name.clone().unwrap_or_default(), kind_of(o.r#type.as_ref()))).collect();
    Ok((ins, outs))
}

/// Decodes one test-data file holding a value of `kind`.
pub fn decode_value(data: Bytes, kind: &ValueKind) -> Result<Value, ImportError> {
    let dec = |e: prost::DecodeError| ImportError::Decode(e.to_string());
    match kind {
        ValueKind::Tensor => {
            let t = TensorProto::decode(data).map_err(dec)?;
            Ok(Value::Tensor(tensor_from_proto(&t, &mut ExternalFiles::new(None))?))
        }
        ValueKind::Sequence => sequence(&SequenceProto::decode(data).map_err(dec)?),
        ValueKind::Optional(_) => optional(&OptionalProto::decode(data).map_err(dec)?),
    }
}

fn sequence(s: &SequenceProto) -> Result<Value, ImportError> {
    if !s.sequence_values.is_empty() || !s.optional_values.is_empty() {
        return Err(ImportError::Decode("only sequences of tensors are supported".into()));
    }
    let items = s
        .tensor_values
        .iter()
        .map(|t| tensor_from_proto(t, &mut ExternalFiles::new(None)))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Value::Sequence(items))
}

fn optional(o: &OptionalProto) -> Result<Value, ImportError> {
    // `elem_type`: 0 undefined (empty), 1 tensor, 3 sequence, 5 optional.
    Ok(Value::Optional(match (o.elem_type.unwrap_or(0), &o.tensor_value, &o.sequence_value, &o.optional_value) {
        (1, Some(t), _, _) => Some(Box::new(Value::Tensor(tensor_from_proto(t, &mut ExternalFiles::new(None))?))),
        (3, _, Some(s), _) => Some(Box::new(sequence(s)?)),
        (5, _, _, Some(inner)) => Some(Box::new(optional(inner)?)),
        _ => None,
    }))
}
