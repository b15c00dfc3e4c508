//! Constant tensors: a [`TensorType`] plus little-endian bytes.
//!
//! Storage is the raw little-endian byte image (packed two per byte for 4-bit
//! types), held in [`Bytes`] so an importer can hand over slices of the model file
//! without copying. Typed access goes through [`Element`] for the native Rust
//! types and through `f32` for the low-precision float types.

use crate::dtype::DType;
use crate::lowp;
use crate::shape::{Shape, TensorType};
use bytes::Bytes;
use half::{bf16, f16};

/// A tensor with known contents.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    ty: TensorType,
    data: Bytes,
}

/// Error building or reading a [`Tensor`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    /// The byte length does not match the type.
    #[error("tensor of type {ty} needs {expected} bytes, got {got}")]
    ByteLength {
        /// The type.
        ty: String,
        /// Bytes the type needs.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The element count does not match the shape.
    #[error("shape {shape} holds {expected} elements, got {got}")]
    ElementCount {
        /// The shape.
        shape: String,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },
    /// Typed access with the wrong Rust type.
    #[error("tensor has dtype {actual}, read as {requested}")]
    DTypeMismatch {
        /// The tensor's dtype.
        actual: DType,
        /// The dtype asked for.
        requested: DType,
    },
    /// Integer access to a float tensor or similar.
    #[error("cannot read a {0} tensor as integers")]
    NotInteger(DType),
}

/// A Rust type that is the exact storage of one dtype.
pub trait Element: Copy + Default + PartialEq + core::fmt::Debug + 'static {
    /// The dtype this type stores.
    const DTYPE: DType;
    /// Decode from little-endian bytes (`bytes.len() == size_of::<Self>()`).
    fn read_le(bytes: &[u8]) -> Self;
    /// Append the little-endian encoding to `out`.
    fn write_le(self, out: &mut Vec<u8>);
}

macro_rules! element_int {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn read_le(b: &[u8]) -> Self {
                let mut a = [0u8; core::mem::size_of::<$t>()];
                a.copy_from_slice(b);
                <$t>::from_le_bytes(a)
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
        }
    )*};
}
element_int!(f32 => F32, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64,
             u8 => U8, u16 => U16, u32 => U32, u64 => U64);

/// The 16-bit floats, stored as their bits.
macro_rules! element_half {
    ($($t:ty => $d:ident),*) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn read_le(b: &[u8]) -> Self {
                <$t>::from_bits(u16::from_le_bytes([b[0], b[1]]))
            }
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_bits().to_le_bytes());
            }
        }
    )*};
}
element_half!(f16 => F16, bf16 => BF16);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn read_le(b: &[u8]) -> Self {
        b[0] != 0
    }
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(self as u8);
    }
}

/// Fails unless `shape` holds `got` elements.
fn check_count(shape: &Shape, got: usize) -> Result<(), TensorError> {
    if got == shape.numel() {
        Ok(())
    } else {
        Err(TensorError::ElementCount { shape: shape.to_string(), expected: shape.numel(), got })
    }
}

impl Tensor {
    /// A tensor from its type and raw little-endian bytes; checks the length.
    pub fn new(ty: TensorType, data: Bytes) -> Result<Tensor, TensorError> {
        let expected = ty.storage_bytes();
        if data.len() != expected {
            return Err(TensorError::ByteLength { ty: ty.to_string(), expected, got: data.len() });
        }
        Ok(Tensor { ty, data })
    }

    /// A tensor of zero bytes (all-zero bits) of the given type.
    pub fn zeros(ty: TensorType) -> Tensor {
        let n = ty.storage_bytes();
        Tensor { ty, data: Bytes::from(vec![0u8; n]) }
    }

    /// A tensor from typed elements.
    pub fn from_vec<T: Element>(shape: Shape, v: Vec<T>) -> Result<Tensor, TensorError> {
        check_count(&shape, v.len())?;
        let mut out = Vec::with_capacity(T::DTYPE.storage_bytes(v.len()));
        for x in v {
            x.write_le(&mut out);
        }
        Ok(Tensor { ty: TensorType::new(T::DTYPE, shape), data: Bytes::from(out) })
    }

    /// A rank-0 tensor.
    pub fn scalar<T: Element>(x: T) -> Tensor {
        let mut out = Vec::new();
        x.write_le(&mut out);
        Tensor { ty: TensorType::new(T::DTYPE, Shape::scalar()), data: Bytes::from(out) }
    }

    /// A tensor of the given dtype from `f64` values, converted as a cast would
    /// (round-to-nearest-even for floats; saturating for low-precision floats
    /// that saturate; truncation toward zero, wrapping, for 8- to 64-bit integers;
    /// round-to-nearest-even with clamping for i4/u4, as ONNX converts them; `x != 0` for bool).
    pub fn from_f64(dtype: DType, shape: Shape, v: &[f64]) -> Result<Tensor, TensorError> {
        check_count(&shape, v.len())?;
        let mut out = Vec::with_capacity(dtype.storage_bytes(v.len()));
        match dtype {
            DType::F32 => v.iter().for_each(|&x| (x as f32).write_le(&mut out)),
            DType::F64 => v.iter().for_each(|&x| x.write_le(&mut out)),
            // Rounded exactly first (`lowp::round_binary`): the `half` crate's
            // `from_f64` looks at only the high 32 bits of the f64, so a value just past
            // a tie (an f32 value with low significand bits set) would round as the tie.
            // Of an exactly representable value it is exact.
            DType::F16 => {
                v.iter().for_each(|&x| f16::from_f64(lowp::round_binary(x, 11, -14, 65504.0)).write_le(&mut out))
            }
            DType::BF16 => v
                .iter()
                .for_each(|&x| bf16::from_f64(lowp::round_binary(x, 8, -126, lowp::BF16_MAX)).write_le(&mut out)),
            DType::Bool => v.iter().for_each(|&x| (x != 0.0).write_le(&mut out)),
            DType::I8 => v.iter().for_each(|&x| (f64_to_i64(x) as i8).write_le(&mut out)),
            DType::I16 => v.iter().for_each(|&x| (f64_to_i64(x) as i16).write_le(&mut out)),
            DType::I32 => v.iter().for_each(|&x| (f64_to_i64(x) as i32).write_le(&mut out)),
            DType::I64 => v.iter().for_each(|&x| f64_to_i64(x).write_le(&mut out)),
            DType::U8 => v.iter().for_each(|&x| (f64_to_i64(x) as u8).write_le(&mut out)),
            DType::U16 => v.iter().for_each(|&x| (f64_to_i64(x) as u16).write_le(&mut out)),
            DType::U32 => v.iter().for_each(|&x| (f64_to_i64(x) as u32).write_le(&mut out)),
            DType::U64 => v.iter().for_each(|&x| f64_to_u64(x).write_le(&mut out)),
            _ => {
                let codes: Vec<u8> = v.iter().map(|&x| lowp::encode(dtype, x as f32, true)).collect();
                return Tensor::from_codes(dtype, shape, &codes);
            }
        }
        Ok(Tensor { ty: TensorType::new(dtype, shape), data: Bytes::from(out) })
    }

    /// A tensor of an 8-bit-or-smaller dtype from one code per element (packs 4-bit types).
    pub fn from_codes(dtype: DType, shape: Shape, codes: &[u8]) -> Result<Tensor, TensorError> {
        check_count(&shape, codes.len())?;
        let data = if dtype.is_packed() {
            codes.chunks(2).map(|c| (c[0] & 0xF) | (c.get(1).copied().unwrap_or(0) << 4)).collect()
        } else {
            codes.to_vec()
        };
        Tensor::new(TensorType::new(dtype, shape), Bytes::from(data))
    }

    /// The type.
    pub fn ty(&self) -> &TensorType {
        &self.ty
    }

    /// The dtype.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.ty.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.ty.shape.numel()
    }

    /// The raw little-endian bytes.
    pub fn bytes(&self) -> &Bytes {
        &self.data
    }

    /// The same data with another shape of equal element count.
    pub fn reshaped(&self, shape: Shape) -> Result<Tensor, TensorError> {
        check_count(&shape, self.numel())?;
        Ok(Tensor { ty: TensorType::new(self.ty.dtype, shape), data: self.data.clone() })
    }

    /// Typed copy of the elements; `T` must be the dtype's storage type.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>, TensorError> {
        if T::DTYPE != self.ty.dtype {
            return Err(TensorError::DTypeMismatch { actual: self.ty.dtype, requested: T::DTYPE });
        }
        let w = core::mem::size_of::<T>();
        Ok(self.data.chunks_exact(w).map(T::read_le).collect())
    }

    /// One code per element for types of 8 bits or fewer (unpacks 4-bit types).
    pub fn codes(&self) -> Vec<u8> {
        let n = self.numel();
        if self.ty.dtype.is_packed() {
            (0..n).map(|i| (self.data[i / 2] >> ((i % 2) * 4)) & 0xF).collect()
        } else {
            self.data.iter().take(n).copied().collect()
        }
    }

    /// Every element as `f64` (exact for all dtypes except `i64`/`u64` beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let d = &self.data;
        match self.ty.dtype {
            DType::F32 => d.chunks_exact(4).map(|b| f32::read_le(b) as f64).collect(),
            DType::F64 => d.chunks_exact(8).map(f64::read_le).collect(),
            DType::F16 => d.chunks_exact(2).map(|b| f16::read_le(b).to_f64()).collect(),
            DType::BF16 => d.chunks_exact(2).map(|b| bf16::read_le(b).to_f64()).collect(),
            DType::I8 => d.iter().map(|&b| b as i8 as f64).collect(),
            DType::U8 => d.iter().map(|&b| b as f64).collect(),
            DType::Bool => d.iter().map(|&b| (b != 0) as u8 as f64).collect(),
            DType::I16 => d.chunks_exact(2).map(|b| i16::read_le(b) as f64).collect(),
            DType::U16 => d.chunks_exact(2).map(|b| u16::read_le(b) as f64).collect(),
            DType::I32 => d.chunks_exact(4).map(|b| i32::read_le(b) as f64).collect(),
            DType::U32 => d.chunks_exact(4).map(|b| u32::read_le(b) as f64).collect(),
            DType::I64 => d.chunks_exact(8).map(|b| i64::read_le(b) as f64).collect(),
            DType::U64 => d.chunks_exact(8).map(|b| u64::read_le(b) as f64).collect(),
            dt => self.codes().into_iter().map(|c| lowp::decode(dt, c) as f64).collect(),
        }
    }

    /// Every element as `i64`, for integer and bool tensors (exact; `u64` wraps).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>, TensorError> {
        let d = &self.data;
        Ok(match self.ty.dtype {
            DType::I8 => d.iter().map(|&b| b as i8 as i64).collect(),
            DType::U8 => d.iter().map(|&b| b as i64).collect(),
            DType::Bool => d.iter().map(|&b| (b != 0) as i64).collect(),
            DType::I16 => d.chunks_exact(2).map(|b| i16::read_le(b) as i64).collect(),
            DType::U16 => d.chunks_exact(2).map(|b| u16::read_le(b) as i64).collect(),
            DType::I32 => d.chunks_exact(4).map(|b| i32::read_le(b) as i64).collect(),
            DType::U32 => d.chunks_exact(4).map(|b| u32::read_le(b) as i64).collect(),
            DType::I64 => d.chunks_exact(8).map(i64::read_le).collect(),
            DType::U64 => d.chunks_exact(8).map(|b| u64::read_le(b) as i64).collect(),
            DType::I4 => self.codes().into_iter().map(|c| ((c << 4) as i8 >> 4) as i64).collect(),
            DType::U4 => self.codes().into_iter().map(|c| c as i64).collect(),
            dt => return Err(TensorError::NotInteger(dt)),
        })
    }

    /// A tensor of an integer (or bool) dtype from `i64` values, wrapping like a C cast.
    pub fn from_i64(dtype: DType, shape: Shape, v: &[i64]) -> Result<Tensor, TensorError> {
        if !(dtype.is_int() || dtype == DType::Bool) {
            return Err(TensorError::NotInteger(dtype));
        }
        check_count(&shape, v.len())?;
        let mut out = Vec::with_capacity(dtype.storage_bytes(v.len()));
        match dtype {
            DType::I8 => v.iter().for_each(|&x| (x as i8).write_le(&mut out)),
            DType::I16 => v.iter().for_each(|&x| (x as i16).write_le(&mut out)),
            DType::I32 => v.iter().for_each(|&x| (x as i32).write_le(&mut out)),
            DType::I64 => v.iter().for_each(|&x| x.write_le(&mut out)),
            DType::U8 => v.iter().for_each(|&x| (x as u8).write_le(&mut out)),
            DType::U16 => v.iter().for_each(|&x| (x as u16).write_le(&mut out)),
            DType::U32 => v.iter().for_each(|&x| (x as u32).write_le(&mut out)),
            DType::U64 => v.iter().for_each(|&x| (x as u64).write_le(&mut out)),
            DType::Bool => v.iter().for_each(|&x| (x != 0).write_le(&mut out)),
            DType::I4 | DType::U4 => {
                let codes: Vec<u8> = v.iter().map(|&x| (x as u8) & 0xF).collect();
                return Tensor::from_codes(dtype, shape, &codes);
            }
            _ => unreachable!("checked integer dtype above"),
        }
        Ok(Tensor { ty: TensorType::new(dtype, shape), data: Bytes::from(out) })
    }
}

/// `f64` → `i64` truncating toward zero; NaN → 0; saturating at the ends.
fn f64_to_i64(x: f64) -> i64 {
    x as i64
}

/// `f64` → `u64` truncating toward zero; negative values wrap like a C cast through `i64`.
fn f64_to_u64(x: f64) -> u64 {
    if x < 0.0 {
        (x as i64) as u64
    } else {
        x as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// f32 values stored as f16/bf16 round to nearest even from the exact value, as
    /// `half`'s `from_f32` (which reads every bit of an f32) does: values just past a
    /// tie, ties, subnormals, overflow, and random bit patterns.
    #[test]
    fn half_storage_rounds_f32_values_exactly() {
        let mut v: Vec<f32> = vec![
            1.0 + 2f32.powi(-11) + 2f32.powi(-23), // just past an f16 tie: up
            1.0 + 2f32.powi(-11),                  // the tie: to even (1.0)
            1.0 + 3.0 * 2f32.powi(-11),            // a tie: to even (up)
            1.0 + 2f32.powi(-8) + 2f32.powi(-23),  // just past a bf16 tie
            65519.0,
            65520.0,
            -3.0e-8,
            6.0e-8,
            f32::MAX,
            f32::MIN_POSITIVE,
            -0.0,
        ];
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..100_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let f = f32::from_bits(x as u32);
            if f.is_finite() {
                v.push(f);
            }
        }
        let shape = Shape::new(vec![v.len()]).unwrap();
        let wide: Vec<f64> = v.iter().map(|&f| f64::from(f)).collect();
        let h = Tensor::from_f64(DType::F16, shape.clone(), &wide).unwrap();
        let b = Tensor::from_f64(DType::BF16, shape, &wide).unwrap();
        for (i, &f) in v.iter().enumerate() {
            let want_h = f16::from_f32(f).to_bits().to_le_bytes();
            let want_b = bf16::from_f32(f).to_bits().to_le_bytes();
            assert_eq!(h.bytes()[2 * i..2 * i + 2], want_h, "f16 of {f:e}");
            assert_eq!(b.bytes()[2 * i..2 * i + 2], want_b, "bf16 of {f:e}");
        }
    }

    #[test]
    fn typed_round_trip() {
        let s = Shape::new(vec![2, 2]).unwrap();
        let t = Tensor::from_vec(s.clone(), vec![1.0f32, -2.0, 3.5, 0.0]).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, -2.0, 3.5, 0.0]);
        assert_eq!(t.to_f64_vec(), vec![1.0, -2.0, 3.5, 0.0]);
        assert!(t.to_vec::<i32>().is_err());
        let i = Tensor::from_i64(DType::I4, s.clone(), &[-8, 7, -1, 0]).unwrap();
        assert_eq!(i.bytes().len(), 2);
        assert_eq!(i.to_i64_vec().unwrap(), vec![-8, 7, -1, 0]);
        assert!(Tensor::from_vec(s, vec![1u8]).is_err());
    }
}
