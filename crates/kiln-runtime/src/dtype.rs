//! The dtypes an artifact's signature may name, by ONNX `TensorProto.DataType` code:
//! names for messages and storage sizes for the load-time checks.
//!
//! The table itself is `kiln_module::dtype` (the artifact format defines the codes); this
//! module only answers by code, the form the signature carries.

pub use kiln_module::dtype::DType;

/// The dtype's name (`"f32"`), `None` for codes kiln does not run (strings, complex).
pub fn name(code: u32) -> Option<&'static str> {
    DType::from_code(code).map(DType::name)
}

/// Bytes a dense row-major tensor of `dims` occupies, or `None` for an unknown dtype or
/// a size that overflows 64 bits.
pub fn storage_bytes(code: u32, dims: &[u64]) -> Option<u64> {
    DType::from_code(code)?.dense_bytes(dims)
}

/// Writes a dtype for a message: its name, or its code when unknown.
pub(crate) use kiln_module::dtype::ShowCode as Show;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn by_code() {
        assert_eq!(storage_bytes(1, &[2, 3]), Some(24));
        assert_eq!(storage_bytes(21, &[3]), Some(2));
        assert_eq!(storage_bytes(8, &[1]), None);
        assert_eq!(storage_bytes(1, &[u64::MAX, 2]), None);
        assert_eq!((name(16), name(0), name(8)), (Some("bf16"), None, None));
    }
}
