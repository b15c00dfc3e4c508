//! The flow level of kiln.
//!
//! A model at the tensor level is a graph of high-level ops. At the flow level it is a
//! DAG of *dispatches*; each dispatch computes one tensor with one [`kernel::Kernel`]:
//! a loop over the output's index space whose body is a scalar expression. The body
//! reads input tensors at computed indices, may reduce over extra index variables
//! (sums, maxima, contractions), and converts between dtypes. Every tensor op lowers
//! to such kernels (crate `kiln-lower`, through the interface in [`lower`]); [`program`]
//! builds the DAG of dispatches from the lowered ops; fusing a producer into its
//! consumer is substituting the producer's expression for the consumer's load of it
//! ([`fuse`]). Every dispatch
//! carries its kernel's class ([`class`]: contraction, window, rows, movement,
//! elementwise, general or attention), decided here once from the kernel's shape ([`affine`] is the
//! one index analysis behind it); code generators (`kiln-codegen`) consume kernels and
//! match on their class; [`interp`] is their executable specification. [`precision`]
//! narrows what a program stores to f16 or bf16, its kernels still computing in f32.
#![deny(missing_docs)]

pub mod affine;
pub mod attention;
pub mod class;
pub mod concat;
pub mod contraction;
pub mod dequant;
pub mod fold;
pub mod fuse;
pub mod interp;
pub mod kernel;

pub use kernel::{
    BinaryOp, Bounds, Expr, ExprId, Kernel, KernelBuilder, KernelError, ReduceOp, ScalarType, Scatter, UnaryOp, VarId,
};
pub mod layout;
pub mod lower;
pub mod mx;
pub mod precision;
pub mod program;
pub mod resample;
#[cfg(test)]
mod test_types;
pub mod text;
pub mod window;
