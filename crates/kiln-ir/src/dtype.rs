//! Element types.
//!
//! The dtype table — codes, names, storage sizes, NumPy `descr`s — is defined once, in
//! `kiln_module::dtype`, and re-exported here. It lives in the artifact crate because the
//! `.kiln` format defines the dtype codes and the `no_std` runtime must read them without
//! linking compiler code; the dependency runs compiler → artifact format, never back.
//! Exact conversions between the low-precision float types and `f32` live in
//! [`crate::lowp`].

pub use kiln_module::dtype::{DType, UnknownDType};
