//! Element types: the one table of dtype codes, names, storage sizes and NumPy `descr`s.
//!
//! A `.kiln` artifact names the dtype of every signature tensor by its ONNX
//! `TensorProto.DataType` code, so the artifact format is where the codes are defined, and
//! this crate — which both the compiler and the `no_std` runtime depend on — is where the
//! table lives. The compiler's IR (`kiln_ir::DType`) is a re-export of [`DType`]; the
//! runtime and the minimal runner look codes up here too. Keeping the table on this side of
//! the compiler/runtime split lets the runtime name and size dtypes without linking any
//! compiler code.
//!
//! Sub-byte types (`f4E2M1FN`, `i4`, `u4`) are packed two per byte, low nibble first, as
//! in ONNX; `f6E3M2FN` is stored one element per byte (the ONNX wire format has no packed
//! 6-bit layout) and has no ONNX code. Exact conversions between the low-precision float
//! types and `f32` live in the IR (`kiln_ir::lowp`).

use alloc::string::{String, ToString};
use core::fmt;
use core::str::FromStr;

use Numpy::{Descr, MlDtypes};

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

/// One row of the table.
struct Row {
    /// The dtype the row describes.
    dtype: DType,
    /// ONNX `TensorProto.DataType` code; 0 where ONNX has none (0 is ONNX's "undefined").
    code: u32,
    /// Name in the text forms and in messages.
    name: &'static str,
    /// Bits of storage per element (4 for the packed types).
    bits: u32,
    /// Its NumPy type: a builtin one or the `ml_dtypes` package's, never both.
    numpy: Numpy,
}

/// How NumPy holds a dtype.
#[derive(Clone, Copy)]
enum Numpy {
    /// A builtin type, by its little-endian `descr`.
    Descr(&'static str),
    /// A type of the `ml_dtypes` package, by name (NumPy has no builtin for it).
    MlDtypes(&'static str),
}

const fn row(dtype: DType, code: u32, name: &'static str, bits: u32, numpy: Numpy) -> Row {
    Row { dtype, code, name, bits, numpy }
}

/// The table, one row per [`DType`] in declaration order (a test checks the order).
const TABLE: [Row; 22] = [
    row(DType::F32, 1, "f32", 32, Descr("<f4")),
    row(DType::F16, 10, "f16", 16, Descr("<f2")),
    row(DType::BF16, 16, "bf16", 16, MlDtypes("bfloat16")),
    row(DType::F64, 11, "f64", 64, Descr("<f8")),
    row(DType::I8, 3, "i8", 8, Descr("|i1")),
    row(DType::I16, 5, "i16", 16, Descr("<i2")),
    row(DType::I32, 6, "i32", 32, Descr("<i4")),
    row(DType::I64, 7, "i64", 64, Descr("<i8")),
    row(DType::U8, 2, "u8", 8, Descr("|u1")),
    row(DType::U16, 4, "u16", 16, Descr("<u2")),
    row(DType::U32, 12, "u32", 32, Descr("<u4")),
    row(DType::U64, 13, "u64", 64, Descr("<u8")),
    row(DType::Bool, 9, "bool", 8, Descr("|b1")),
    row(DType::I4, 22, "i4", 4, MlDtypes("int4")),
    row(DType::U4, 21, "u4", 4, MlDtypes("uint4")),
    row(DType::F8E4M3FN, 17, "f8E4M3FN", 8, MlDtypes("float8_e4m3fn")),
    row(DType::F8E4M3FNUZ, 18, "f8E4M3FNUZ", 8, MlDtypes("float8_e4m3fnuz")),
    row(DType::F8E5M2, 19, "f8E5M2", 8, MlDtypes("float8_e5m2")),
    row(DType::F8E5M2FNUZ, 20, "f8E5M2FNUZ", 8, MlDtypes("float8_e5m2fnuz")),
    row(DType::F8E8M0FNU, 24, "f8E8M0FNU", 8, MlDtypes("float8_e8m0fnu")),
    row(DType::F6E3M2FN, 0, "f6E3M2FN", 8, MlDtypes("float6_e3m2fn")),
    row(DType::F4E2M1FN, 23, "f4E2M1FN", 4, MlDtypes("float4_e2m1fn")),
];

impl DType {
    /// All dtypes, in declaration order.
    pub const ALL: [DType; 22] = {
        let mut all = [DType::F32; 22];
        let mut i = 0;
        while i < all.len() {
            all[i] = TABLE[i].dtype;
            i += 1;
        }
        all
    };

    fn row(self) -> &'static Row {
        // `DType` is a field-less enum whose discriminants are 0..22 in declaration order,
        // and TABLE has one row per variant in that order, so the index is always in range.
        &TABLE[self as usize]
    }

    /// The ONNX `TensorProto.DataType` code of this dtype, which is also its code in a
    /// `.kiln` signature (`None` for `f6E3M2FN`, which ONNX has no code for).
    pub fn onnx_code(self) -> Option<i32> {
        match self.row().code {
            0 => None,
            c => Some(c as i32),
        }
    }

    /// The dtype of an ONNX `TensorProto.DataType` code, if kiln supports it
    /// (strings and complex numbers are not).
    pub fn from_onnx_code(code: i64) -> Option<DType> {
        u32::try_from(code).ok().and_then(DType::from_code)
    }

    /// The dtype of an artifact's (ONNX) dtype code, `None` for codes kiln does not run.
    pub fn from_code(code: u32) -> Option<DType> {
        if code == 0 {
            return None;
        }
        DType::ALL.iter().copied().find(|d| d.row().code == code)
    }

    /// The name used in the text forms (`f32`, `f8E4M3FN`, …).
    pub fn name(self) -> &'static str {
        self.row().name
    }

    /// Bits of storage per element (4 for packed types).
    pub fn bits(self) -> usize {
        self.row().bits as usize
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

    /// Bytes a dense row-major tensor of `dims` occupies, `None` when that overflows 64
    /// bits (for sizes taken from untrusted input).
    pub fn dense_bytes(self, dims: &[u64]) -> Option<u64> {
        let n = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        if self.is_packed() {
            Some(n.div_ceil(2))
        } else {
            n.checked_mul(self.bits() as u64 / 8)
        }
    }

    /// The little-endian NumPy `descr` of this dtype (`"<f4"`, `"|b1"`), `None` where NumPy
    /// has no such type (bf16, the 8-, 6- and 4-bit floats, the 4-bit integers).
    pub fn npy_descr(self) -> Option<&'static str> {
        match self.row().numpy {
            Descr(d) => Some(d),
            MlDtypes(_) => None,
        }
    }

    /// The name of this dtype in the `ml_dtypes` package (`"bfloat16"`, `"float8_e4m3fn"`,
    /// `"int4"`), for exactly the dtypes NumPy has no builtin for. NumPy saves such arrays
    /// untyped, with a void `descr`: `kiln_npy` documents how kiln reads and writes them.
    pub fn ml_dtypes_name(self) -> Option<&'static str> {
        match self.row().numpy {
            MlDtypes(n) => Some(n),
            Descr(_) => None,
        }
    }

    /// Bytes one element takes in a NumPy array: `ml_dtypes` keeps every sub-byte type
    /// (`int4`, `uint4`, `float4_e2m1fn`, `float6_e3m2fn`) one element per byte, unpacked.
    pub fn numpy_itemsize(self) -> usize {
        self.bits().div_ceil(8)
    }

    /// The dtype of a NumPy `descr` type code without its byte-order character
    /// (`"f4"`, `"b1"`).
    pub fn from_npy_code(code: &str) -> Option<DType> {
        DType::ALL.iter().copied().find(|d| d.npy_descr().and_then(|s| s.get(1..)) == Some(code))
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

    /// The smallest and largest value of an integer or bool dtype (`None` for the float
    /// types).
    pub fn int_range(self) -> Option<(i128, i128)> {
        let bits = self.bits() as u32;
        if self == DType::Bool {
            Some((0, 1))
        } else if self.is_signed_int() {
            Some((-(1 << (bits - 1)), (1 << (bits - 1)) - 1))
        } else if self.is_unsigned_int() {
            Some((0, (1 << bits) - 1))
        } else {
            None
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error of [`DType::from_str`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownDType(pub String);

impl fmt::Display for UnknownDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown dtype `{}`", self.0)
    }
}

impl core::error::Error for UnknownDType {}

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DType::ALL.iter().copied().find(|d| d.name() == s).ok_or_else(|| UnknownDType(s.to_string()))
    }
}

/// Writes an artifact dtype code for a message: its name, or the code when unknown.
#[derive(Clone, Copy, Debug)]
pub struct ShowCode(pub u32);

impl fmt::Display for ShowCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match DType::from_code(self.0) {
            Some(d) => f.write_str(d.name()),
            None => write!(f, "dtype code {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn table_follows_declaration_order() {
        for (i, d) in DType::ALL.iter().enumerate() {
            assert_eq!(*d as usize, i);
            assert_eq!(TABLE[i].dtype, *d);
        }
        assert_eq!(DType::ALL.iter().collect::<alloc::collections::BTreeSet<_>>().len(), 22, "no dtype twice");
        assert_eq!(TABLE.len(), DType::ALL.len());
    }

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(d.name().parse::<DType>(), Ok(d));
        }
        assert!("f33".parse::<DType>().is_err());
        assert_eq!(format!("{}", "f33".parse::<DType>().unwrap_err()), "unknown dtype `f33`");
    }

    #[test]
    fn onnx_codes_round_trip() {
        for d in DType::ALL {
            if let Some(c) = d.onnx_code() {
                assert_eq!(DType::from_onnx_code(c as i64), Some(d));
            }
        }
        assert_eq!(DType::from_onnx_code(1), Some(DType::F32));
        assert_eq!(DType::from_onnx_code(16), Some(DType::BF16));
        assert_eq!(DType::from_onnx_code(24), Some(DType::F8E8M0FNU));
        assert_eq!(DType::from_onnx_code(8), None, "string");
        assert_eq!(DType::from_onnx_code(0), None);
        assert_eq!(DType::from_onnx_code(-1), None);
        assert_eq!(DType::from_onnx_code(1 << 32 | 1), None);
        assert_eq!(DType::F6E3M2FN.onnx_code(), None);
        assert_eq!(format!("{} {}", ShowCode(22), ShowCode(8)), "i4 dtype code 8");
    }

    #[test]
    fn storage() {
        assert_eq!(DType::F4E2M1FN.storage_bytes(3), 2);
        assert_eq!(DType::F32.storage_bytes(3), 12);
        assert_eq!(DType::F6E3M2FN.storage_bytes(3), 3);
        assert_eq!(DType::F32.dense_bytes(&[2, 3]), Some(24));
        assert_eq!(DType::I64.dense_bytes(&[]), Some(8));
        assert_eq!(DType::U4.dense_bytes(&[3]), Some(2));
        assert_eq!(DType::BF16.dense_bytes(&[5, 0]), Some(0));
        assert_eq!(DType::F32.dense_bytes(&[u64::MAX, 2]), None);
        assert_eq!(DType::F32.dense_bytes(&[1 << 62]), None);
    }

    #[test]
    fn int_ranges() {
        let ranges = [
            (DType::I8, i8::MIN as i128, i8::MAX as i128),
            (DType::U8, 0, u8::MAX as i128),
            (DType::I16, i16::MIN as i128, i16::MAX as i128),
            (DType::U16, 0, u16::MAX as i128),
            (DType::I32, i32::MIN as i128, i32::MAX as i128),
            (DType::U32, 0, u32::MAX as i128),
            (DType::I64, i64::MIN as i128, i64::MAX as i128),
            (DType::U64, 0, u64::MAX as i128),
            (DType::I4, -8, 7),
            (DType::U4, 0, 15),
            (DType::Bool, 0, 1),
        ];
        for (d, lo, hi) in ranges {
            assert_eq!(d.int_range(), Some((lo, hi)), "{d}");
        }
        for d in DType::ALL.into_iter().filter(|d| d.is_float()) {
            assert_eq!(d.int_range(), None, "{d}");
        }
    }

    #[test]
    fn numpy_descrs() {
        assert_eq!(DType::F32.npy_descr(), Some("<f4"));
        assert_eq!(DType::Bool.npy_descr(), Some("|b1"));
        assert_eq!(DType::BF16.npy_descr(), None);
        assert_eq!(DType::from_npy_code("i1"), Some(DType::I8));
        assert_eq!(DType::from_npy_code("f2"), Some(DType::F16));
        assert_eq!(DType::from_npy_code("f16"), None);
        assert_eq!(DType::from_npy_code(""), None);
        assert_eq!(DType::BF16.ml_dtypes_name(), Some("bfloat16"));
        assert_eq!((DType::I4.numpy_itemsize(), DType::BF16.numpy_itemsize(), DType::F64.numpy_itemsize()), (1, 2, 8));
        for d in DType::ALL {
            if let Some(s) = d.npy_descr() {
                assert_eq!(DType::from_npy_code(&s[1..]), Some(d));
                assert_eq!(s[2..].parse::<usize>().ok(), Some(d.bits() / 8), "{d}");
            }
        }
    }
}
