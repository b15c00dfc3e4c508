//! Reading and writing NumPy `.npy` files as [`Tensor`]s. Used by the CLI for inputs and
//! outputs and by tests for reference data.
//!
//! The codec itself is [`kiln_npy`] (shared with the minimal runner); this layer only turns
//! its arrays into tensors and back. Bytes after the data are ignored on reading. The
//! dtypes NumPy lacks (bf16, the 8-, 6- and 4-bit floats, int4/uint4) follow the
//! `ml_dtypes` convention described in [`kiln_npy`]: NumPy saves them untyped, so reading
//! one needs the dtype the caller expects ([`read_typed`]).

use crate::shape::{Shape, ShapeError, TensorType};
use crate::tensor::{Tensor, TensorError};
use crate::DType;
use bytes::Bytes;

/// Why an `.npy` file could not be read or written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NpyError {
    /// The codec refused the image (damaged, or content kiln cannot use: see
    /// [`kiln_npy::NpyError::is_unsupported`]).
    #[error(transparent)]
    Codec(#[from] kiln_npy::NpyError),
    /// A shape the IR does not allow (rank or element count).
    #[error("unsupported .npy content: {0}")]
    Shape(#[from] ShapeError),
    /// The data does not fit the tensor type.
    #[error("not a valid .npy file: {0}")]
    Tensor(#[from] TensorError),
}

/// Reads an `.npy` image of a type NumPy has (an untyped one is an error: see
/// [`read_typed`]).
pub fn read(bytes: &[u8]) -> Result<Tensor, NpyError> {
    read_typed(bytes, None)
}

/// Reads an `.npy` image, taking an untyped one (NumPy's file for an `ml_dtypes` array) as
/// `expected`; a typed image keeps its own dtype, for the caller to compare.
pub fn read_typed(bytes: &[u8], expected: Option<DType>) -> Result<Tensor, NpyError> {
    let a = kiln_npy::read_typed(bytes, expected)?;
    let dims = a
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| kiln_npy::NpyError::ShapeOverflow))
        .collect::<Result<Vec<_>, _>>()?;
    let ty = TensorType::new(a.dtype, Shape::new(dims)?);
    Ok(Tensor::new(ty, Bytes::copy_from_slice(&a.data))?)
}

/// Writes a tensor as an `.npy` (version 1.0) image.
pub fn write(t: &Tensor) -> Result<Vec<u8>, NpyError> {
    let dims: Vec<u64> = t.shape().dims().iter().map(|&d| d as u64).collect();
    Ok(kiln_npy::write(t.dtype(), &dims, t.bytes())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let t = Tensor::from_vec(Shape::new(vec![2, 3]).unwrap(), vec![1i64, 2, 3, 4, 5, 6]).unwrap();
        let b = write(&t).unwrap();
        assert_eq!((b.len() - t.bytes().len()) % 64, 0);
        assert_eq!(read(&b).unwrap(), t);
        let s = Tensor::scalar(2.5f32);
        assert_eq!(read(&write(&s).unwrap()).unwrap(), s);
        let v = Tensor::from_vec(Shape::new(vec![3]).unwrap(), vec![true, false, true]).unwrap();
        assert_eq!(read(&write(&v).unwrap()).unwrap(), v);
        // int4 [-8, 7, -1]: packed in the tensor, one a byte in the file.
        let ty = TensorType::new(DType::I4, Shape::new(vec![3]).unwrap());
        let i4 = Tensor::new(ty, Bytes::from_static(&[0x78, 0x0f])).unwrap();
        let f = write(&i4).unwrap();
        assert!(f.ends_with(&[0x08, 0x07, 0x0f]));
        assert_eq!(read_typed(&f, Some(DType::I4)).unwrap(), i4);
        assert!(matches!(read(&f), Err(NpyError::Codec(kiln_npy::NpyError::Untyped(_)))));
    }

    #[test]
    fn rejects_garbage() {
        assert!(read(b"hello").is_err());
        assert!(read(b"\x93NUMPY\x01\x00\xff\xff{").is_err());
        let t = Tensor::scalar(1.0f64);
        let mut b = write(&t).unwrap();
        b.truncate(b.len() - 1);
        assert!(read(&b).is_err());
    }
}
