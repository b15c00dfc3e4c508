//! Element types.
//!
//! Every dtype kiln knows, with its storage size and its textual name. Sub-byte
//! types (`f4E2M1FN`, `i4`, `u4`) are packed two per byte, low nibble first, as
//! in ONNX; `f6E3M2FN` is stored one element per byte (the ONNX wire format has no
//! packed 6-bit layout). Exact conversions between the low-precision float types
//! and `f32` live in [`crate::lowp`].

use core::fmt;
use core::str::FromStr;

/// An element type.
#[allow(missing_docs)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    /// 4-bit signed integer, packed two per byte.
    I4,
    /// 4-bit unsigned integer, packed two per byte.
    U4,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, finite only (NaN = S.1111.111).
    F8E4M3FN,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits, finite only, unsigned zero (NaN = 0x80).
    F8E4M3FNUZ,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits, IEEE-like (Inf and NaN).
    F8E5M2,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits, finite only, unsigned zero (NaN = 0x80).
    F8E5M2FNUZ,
    /// 8-bit unsigned exponent-only scale type of the OCP MX spec (2^(e-127), NaN = 0xFF).
    F8E8M0FNU,
    /// 6-bit float of the OCP MX spec, 3 exponent bits, 2 mantissa bits, finite only.
    F6E3M2FN,
    /// 4-bit float of the OCP MX spec, 2 exponent bits, 1 mantissa bit, finite only; packed.
    F4E2M1FN,
}

impl DType {
    /// All dtypes, in declaration order.
    pub const ALL: [DType; 22] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U8,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::Bool,
        DType::I4,
        DType::U4,
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0FNU,
        DType::F6E3M2FN,
        DType::F4E2M1FN,
    ];

    /// The ONNX `TensorProto.DataType` code of this dtype (`None` for `f6E3M2FN`,
    /// which ONNX has no code for).
    pub fn onnx_code(self) -> Option<i32> {
        Some(match self {
            DType::F32 => 1,
            DType::U8 => 2,
            DType::I8 => 3,
            DType::U16 => 4,
            DType::I16 => 5,
            DType::I32 => 6,
            DType::I64 => 7,
            DType::Bool => 9,
            DType::F16 => 10,
            DType::F64 => 11,
            DType::U32 => 12,
            DType::U64 => 13,
            DType::BF16 => 16,
            DType::F8E4M3FN => 17,
            DType::F8E4M3FNUZ => 18,
            DType::F8E5M2 => 19,
            DType::F8E5M2FNUZ => 20,
            DType::U4 => 21,
            DType::I4 => 22,
            DType::F4E2M1FN => 23,
            DType::F8E8M0FNU => 24,
            DType::F6E3M2FN => return None,
        })
    }

    /// The dtype of an ONNX `TensorProto.DataType` code, if kiln supports it
    /// (strings and complex numbers are not).
    pub fn from_onnx_code(code: i64) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.onnx_code().map(i64::from) == Some(code))
    }

    /// The name used in the text form (`f32`, `f8E4M3FN`, …).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::Bool => "bool",
            DType::I4 => "i4",
            DType::U4 => "u4",
            DType::F8E4M3FN => "f8E4M3FN",
            DType::F8E4M3FNUZ => "f8E4M3FNUZ",
            DType::F8E5M2 => "f8E5M2",
            DType::F8E5M2FNUZ => "f8E5M2FNUZ",
            DType::F8E8M0FNU => "f8E8M0FNU",
            DType::F6E3M2FN => "f6E3M2FN",
            DType::F4E2M1FN => "f4E2M1FN",
        }
    }

    /// Bits of storage per element (4 for packed types).
    pub fn bits(self) -> usize {
        match self {
            DType::F64 | DType::I64 | DType::U64 => 64,
            DType::F32 | DType::I32 | DType::U32 => 32,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 16,
            DType::I8
            | DType::U8
            | DType::Bool
            | DType::F8E4M3FN
            | DType::F8E4M3FNUZ
            | DType::F8E5M2
            | DType::F8E5M2FNUZ
            | DType::F8E8M0FNU
            | DType::F6E3M2FN => 8,
            DType::I4 | DType::U4 | DType::F4E2M1FN => 4,
        }
    }

    /// True for types stored two elements per byte.
    pub fn is_packed(self) -> bool {
        self.bits() == 4
    }

    /// Bytes needed to store `n` elements.
    pub fn storage_bytes(self, n: usize) -> usize {
        if self.is_packed() {
            n.div_ceil(2)
        } else {
            n * (self.bits() / 8)
        }
    }

    /// Floating-point types, including the low-precision storage types.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DType::F32
                | DType::F16
                | DType::BF16
                | DType::F64
                | DType::F8E4M3FN
                | DType::F8E4M3FNUZ
                | DType::F8E5M2
                | DType::F8E5M2FNUZ
                | DType::F8E8M0FNU
                | DType::F6E3M2FN
                | DType::F4E2M1FN
        )
    }

    /// Low-precision float storage types (converted through `f32`).
    pub fn is_low_precision_float(self) -> bool {
        self.is_float() && !matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }

    /// Integer types (signed or unsigned), not bool.
    pub fn is_int(self) -> bool {
        self.is_signed_int() || self.is_unsigned_int()
    }

    /// Signed integer types.
    pub fn is_signed_int(self) -> bool {
        matches!(self, DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::I4)
    }

    /// Unsigned integer types.
    pub fn is_unsigned_int(self) -> bool {
        matches!(self, DType::U8 | DType::U16 | DType::U32 | DType::U64 | DType::U4)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error of [`DType::from_str`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype `{0}`")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownDType(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("f33".parse::<DType>().is_err());
    }

    #[test]
    fn onnx_codes_round_trip() {
        for d in DType::ALL {
            if let Some(c) = d.onnx_code() {
                assert_eq!(DType::from_onnx_code(c as i64), Some(d));
            }
        }
        assert_eq!(DType::from_onnx_code(1), Some(DType::F32));
        assert_eq!(DType::from_onnx_code(8), None);
    }

    #[test]
    fn storage() {
        assert_eq!(DType::F4E2M1FN.storage_bytes(3), 2);
        assert_eq!(DType::F32.storage_bytes(3), 12);
        assert_eq!(DType::F6E3M2FN.storage_bytes(3), 3);
    }
}
