//! Exact conversions between the low-precision storage types and `f32`.
//!
//! (Being written: see the module contract below.)
//!
//! Contract:
//! - `decode(dtype, code)`: the exact `f32` value of one element code (4-bit codes in the low nibble).
//! - `encode(dtype, x, saturate)`: round-to-nearest-even from `f32`, with the saturation and NaN
//!   rules of the ONNX spec (Cast with `saturate`) and the OCP MX spec.

use crate::dtype::DType;

/// The exact `f32` value of one element code of a low-precision float or 4-bit integer dtype.
pub fn decode(dtype: DType, code: u8) -> f32 {
    let _ = (dtype, code);
    unimplemented!("lowp::decode")
}

/// The code nearest to `x` (round-to-nearest-even), following the dtype's saturation/NaN rules.
pub fn encode(dtype: DType, x: f32, saturate: bool) -> u8 {
    let _ = (dtype, x, saturate);
    unimplemented!("lowp::encode")
}
