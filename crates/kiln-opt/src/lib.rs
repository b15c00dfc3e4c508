//! kiln's passes over the tensor level (and, next, dispatch formation into the flow
//! level).
//!
//! Every pass has a name (`<level>-<verb>-<noun>`), a one-line summary and a
//! filetest named after it (`tests/filetests/<name>*.kir`). [`registry`] lists them
//! (`kiln list-passes` prints it); [`run_passes`] runs a list by name
//! and verifies the graph after each pass.
//!
//! - [`fold`]: the constant-folding policy, shared with the importer;
//! - [`rewrite`]: rebuilding a graph with nodes replaced or dropped;
//! - [`tensor`]: the tensor-level passes;
//! - [`quant`]: a QDQ graph's contractions as integer ops.
#![deny(missing_docs)]

pub mod fold;
pub mod quant;
pub mod rewrite;
pub mod tensor;

use kiln_ir::Graph;

/// Why a pass failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PassError {
    /// No pass has this name.
    #[error("unknown pass `{0}` (`kiln list-passes` lists them)")]
    UnknownPass(String),
    /// The graph is invalid after a pass: a bug in that pass.
    #[error("internal error: the graph is invalid after pass `{pass}`: {message}")]
    Verify {
        /// The pass.
        pass: &'static str,
        /// The verifier's message.
        message: String,
    },
    /// A pass could not complete (e.g. folding found an invalid op).
    #[error("pass `{pass}`: {message}")]
    Failed {
        /// The pass.
        pass: &'static str,
        /// What went wrong.
        message: String,
    },
}

/// One pass.
pub trait Pass: Sync {
    /// `<level>-<verb>-<noun>`.
    fn name(&self) -> &'static str;
    /// One line saying what it does.
    fn summary(&self) -> &'static str;
    /// Transforms `graph`; returns whether anything changed.
    fn run(&self, graph: &mut Graph) -> Result<bool, PassError>;
}

/// Every pass, in the order the default tensor pipeline runs them.
pub fn registry() -> &'static [&'static dyn Pass] {
    &[
        &tensor::ElideIdentities,
        // Before folding: folding turns a constant weight's DequantizeLinear into f32.
        &quant::FoldQuantizedContractions,
        &tensor::FoldConstants,
        // After folding: it reads a convolution's weight as a constant (the importer's
        // layout change of it folded); `kiln-compiler` runs it only where the target has
        // no integer microkernels.
        &quant::FloatIntegerContractions,
        &tensor::FoldBatchNorm,
        &tensor::FoldChannelAffine,
        &tensor::RewriteOneHotProducts,
        &tensor::FoldLookupTables,
        &tensor::DeduplicateConstants,
        &tensor::EliminateCommonSubexpressions,
        &tensor::EliminateDeadCode,
    ]
}

/// The pass called `name`.
pub fn find(name: &str) -> Result<&'static dyn Pass, PassError> {
    registry().iter().copied().find(|p| p.name() == name).ok_or_else(|| PassError::UnknownPass(name.to_string()))
}

/// Runs the named passes in order, verifying the graph after each.
pub fn run_passes(graph: &mut Graph, names: &[&str]) -> Result<(), PassError> {
    for name in names {
        let pass = find(name)?;
        run_nested(pass, graph)?;
        kiln_ir::verify::verify(graph).map_err(|e| PassError::Verify { pass: pass.name(), message: e.to_string() })?;
    }
    Ok(())
}

/// Runs `pass` on `graph`, then inside every subgraph (an `If`'s branches, which are
/// closed graphs: a pass keeps their inputs and output types, the node's contract).
fn run_nested(pass: &dyn Pass, graph: &mut Graph) -> Result<(), PassError> {
    pass.run(graph)?;
    for node in graph.nodes.values_mut() {
        for g in node.op.subgraphs_mut() {
            run_nested(pass, g)?;
        }
    }
    Ok(())
}

/// Runs the whole tensor pipeline ([`registry`] order) once, as for a target with
/// integer microkernels: without [`quant::FloatIntegerContractions`], which
/// `kiln-compiler` runs only for targets that have none.
pub fn run_tensor_pipeline(graph: &mut Graph) -> Result<(), PassError> {
    let skip = quant::FloatIntegerContractions.name();
    let names: Vec<&str> = registry().iter().map(|p| p.name()).filter(|&n| n != skip).collect();
    run_passes(graph, &names)
}
