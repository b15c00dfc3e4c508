//! Import errors: one line each, naming what and where.

use core::fmt;

/// An operator kiln cannot import.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// The op type.
    pub op_type: String,
    /// Its domain (`""` is the default ONNX domain).
    pub domain: String,
    /// The opset version of that domain the model imports.
    pub opset: i64,
    /// Name of the first node using it (or `#index` when unnamed).
    pub node: String,
    /// How many nodes use it.
    pub count: usize,
}

impl fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let domain = if self.domain.is_empty() { "ai.onnx" } else { &self.domain };
        write!(f, "{} ({domain} opset {}, node `{}`", self.op_type, self.opset, self.node)?;
        if self.count > 1 {
            write!(f, " and {} more", self.count - 1)?;
        }
        f.write_str(")")
    }
}

/// A graph input whose dimensions are not all known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FreeDims {
    /// The input's name.
    pub name: String,
    /// Its declared shape, free dimensions by their names (`?` when unnamed), e.g. `Nx3x224x224`.
    pub declared: String,
    /// A `--input-shape` value that binds it: the declared shape with every free dimension 1.
    pub suggested: String,
}

/// Why a model could not be imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The model file could not be read.
    #[error("cannot read `{path}`: {message}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        message: String,
    },
    /// The bytes are not a valid model.
    #[error("not a valid ONNX model: {0}")]
    Decode(String),
    /// A structural problem of the model (no graph, an undefined value, ...).
    #[error("invalid model: {0}")]
    Model(String),
    /// Operators kiln does not support (all of them, listed at once).
    #[error("unsupported operators: {}", list(.0))]
    Unsupported(Vec<UnsupportedOp>),
    /// A node could not be imported.
    #[error("node `{node}` ({op_type}, opset {opset}): {message}")]
    Node {
        /// The node's name (or `#index`).
        node: String,
        /// Its op type.
        op_type: String,
        /// The opset of its domain.
        opset: i64,
        /// What is wrong.
        message: String,
    },
    /// A graph input could not be bound.
    #[error("input `{name}`: {message}")]
    Input {
        /// The input's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// Graph inputs with free dimensions and no `--input-shape` (all of them, at once).
    #[error(
        "free input dimensions: {}; bind them with --input-shape, e.g. {} (free dimensions set to 1)",
        .0.iter().map(|f| format!("input `{}` ({})", f.name, f.declared)).collect::<Vec<_>>().join(", "),
        .0.iter().map(|f| format!("--input-shape {}={}", f.name, f.suggested)).collect::<Vec<_>>().join(" ")
    )]
    FreeDims(Vec<FreeDims>),
    /// A tensor (initializer, constant, attribute) could not be decoded.
    #[error("tensor `{name}`: {message}")]
    Tensor {
        /// The tensor's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The bytes are not a valid TFLite flatbuffer (where and what).
    #[error("not a valid TFLite model: {0}")]
    TfliteDecode(String),
    /// TFLite operators kiln does not support (all of them, listed at once).
    #[error("unsupported TFLite operators: {}", .0.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(", "))]
    TfliteUnsupported(Vec<TfliteUnsupportedOp>),
    /// A TFLite operator could not be imported.
    #[error("TFLite operator {index} ({op}, subgraph {subgraph}, output `{output}`): {message}")]
    TfliteOp {
        /// The subgraph.
        subgraph: u32,
        /// The operator's index in it.
        index: u32,
        /// The op's name.
        op: String,
        /// The name of its first output tensor.
        output: String,
        /// What is wrong.
        message: String,
    },
    /// The imported graph failed verification (an importer bug or an invalid model).
    #[error("imported graph is invalid: {0}")]
    Verify(String),
}

fn list(ops: &[UnsupportedOp]) -> String {
    ops.iter().map(|o| o.to_string()).collect::<Vec<_>>().join(", ")
}

/// A TFLite operator kiln cannot import: every use of one op, in one subgraph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TfliteUnsupportedOp {
    /// The op's name (`RFFT2D`, or `CUSTOM:name` for a custom op).
    pub op: String,
    /// The subgraph.
    pub subgraph: usize,
    /// The indices of the operators that use it, in that subgraph.
    pub operators: Vec<usize>,
}

impl fmt::Display for TfliteUnsupportedOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.operators.len() == 1 { "" } else { "s" };
        let list = self.operators.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(", ");
        write!(f, "{} (subgraph {}, operator{s} {list})", self.op, self.subgraph)
    }
}
