//! kiln's tensor-level IR.
//!
//! The first level of kiln's pipeline (see `docs/pipeline.md`): a typed SSA graph of
//! high-level operators with ONNX semantics and fully static shapes.
//!
//! - [`dtype`]: every element type, [`lowp`]: exact low-precision float conversions;
//! - [`shape`]: static shapes and tensor types; [`tensor`]: constant tensors;
//! - [`op`]: the closed operator set and attributes; [`graph`]: values, nodes, graphs;
//! - [`infer`]: per-op result types (shape inference);
//! - [`dynamic`]: data-dependent result extents (bounds, extent values, which ops may
//!   read a bounded result);
//! - [`verify`]: the graph verifier run between passes;
//! - [`text`]: the text form (print → parse → print is identical);
//! - [`npy`]: reading and writing `.npy` files.
#![deny(missing_docs)]

pub mod attrs;
pub mod bounded;
pub mod dtype;
pub mod dynamic;
pub mod entity;
pub mod graph;
pub mod infer;
pub mod lowp;
pub mod npy;
pub mod op;
pub mod shape;
pub mod tensor;
pub mod text;
pub mod verify;

pub use attrs::OpAttrs;
pub use dtype::DType;
pub use graph::{Graph, Node, NodeId, QuantSemantics, Value, ValueDef, ValueId};
pub use op::{Attr, Attrs, Op, OpKind};
pub use shape::{Shape, TensorType};
pub use tensor::Tensor;
