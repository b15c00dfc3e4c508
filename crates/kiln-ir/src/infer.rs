//! Result types of every operator (shape inference).
//!
//! (Being written.) Contract: [`infer`] returns the types of the node's first
//! `num_outputs` results from its operands' types and, where the op needs them
//! (Reshape's shape, Slice's starts, …), the operands' constant contents.

use crate::op::Op;
use crate::shape::TensorType;
use crate::tensor::Tensor;

/// One operand as shape inference sees it.
#[derive(Clone, Copy, Debug)]
pub struct InferInput<'a> {
    /// The operand's type.
    pub ty: &'a TensorType,
    /// Its contents, when it is a constant.
    pub value: Option<&'a Tensor>,
}

/// Why result types could not be inferred.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InferError {
    /// The operands or attributes are invalid for the op (the model is wrong).
    #[error("{0}")]
    Invalid(String),
    /// Valid ONNX, but a form kiln does not support (for example a shape that depends
    /// on run-time data); the message says what would be needed.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Result types of `op` applied to `inputs` (`None` = absent optional input).
pub fn infer(
    op: &Op,
    inputs: &[Option<InferInput<'_>>],
    num_outputs: usize,
) -> Result<Vec<TensorType>, InferError> {
    let _ = (op, inputs, num_outputs);
    Err(InferError::Unsupported("shape inference is being written".into()))
}
