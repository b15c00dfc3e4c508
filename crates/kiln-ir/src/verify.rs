//! The graph verifier. (Being written.)

use crate::graph::Graph;

/// A broken invariant of a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct VerifyError(pub String);

/// Checks every invariant of the tensor level.
pub fn verify(graph: &Graph) -> Result<(), VerifyError> {
    let _ = graph;
    Ok(())
}
