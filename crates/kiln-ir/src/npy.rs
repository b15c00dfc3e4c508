//! Reading and writing NumPy `.npy` files (format versions 1.0 to 3.0, C order,
//! little-endian). Used by the CLI for inputs and outputs and by tests for
//! reference data.

use crate::dtype::DType;
use crate::shape::{Shape, TensorType};
use crate::tensor::Tensor;
use bytes::Bytes;

/// Why an `.npy` file could not be read or written.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NpyError {
    /// Not an `.npy` file or a damaged header.
    #[error("not a valid .npy file: {0}")]
    Format(String),
    /// A valid file that kiln cannot use.
    #[error("unsupported .npy content: {0}")]
    Unsupported(String),
}

const MAGIC: &[u8] = b"\x93NUMPY";

fn descr(d: DType) -> Option<&'static str> {
    Some(match d {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::F16 => "<f2",
        DType::I8 => "|i1",
        DType::I16 => "<i2",
        DType::I32 => "<i4",
        DType::I64 => "<i8",
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::U32 => "<u4",
        DType::U64 => "<u8",
        DType::Bool => "|b1",
        _ => return None,
    })
}

fn parse_descr(s: &str) -> Option<DType> {
    let s = s.trim_start_matches(['<', '|', '=']);
    Some(match s {
        "f4" => DType::F32,
        "f8" => DType::F64,
        "f2" => DType::F16,
        "i1" => DType::I8,
        "i2" => DType::I16,
        "i4" => DType::I32,
        "i8" => DType::I64,
        "u1" => DType::U8,
        "u2" => DType::U16,
        "u4" => DType::U32,
        "u8" => DType::U64,
        "b1" => DType::Bool,
        _ => return None,
    })
}

/// Finds `'key': value` in the header dict and returns the raw value text.
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let pat = format!("'{key}':");
    let start = header.find(&pat)? + pat.len();
    let rest = header[start..].trim_start();
    let end = if rest.starts_with('(') {
        rest.find(')')? + 1
    } else if let Some(stripped) = rest.strip_prefix('\'') {
        stripped.find('\'')? + 2
    } else {
        rest.find([',', '}'])?
    };
    Some(rest[..end].trim())
}

/// Reads an `.npy` image.
pub fn read(bytes: &[u8]) -> Result<Tensor, NpyError> {
    let fmt = |m: &str| NpyError::Format(m.to_string());
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(fmt("missing \\x93NUMPY magic"));
    }
    let major = bytes[6];
    let (hlen, hstart) = match major {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10usize),
        2 | 3 => {
            if bytes.len() < 12 {
                return Err(fmt("truncated header"));
            }
            (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12)
        }
        v => return Err(NpyError::Unsupported(format!("format version {v}"))),
    };
    let hend = hstart.checked_add(hlen).filter(|&e| e <= bytes.len()).ok_or_else(|| fmt("truncated header"))?;
    let header = core::str::from_utf8(&bytes[hstart..hend]).map_err(|_| fmt("header is not text"))?;
    let d = dict_value(header, "descr").ok_or_else(|| fmt("no 'descr' in header"))?;
    let d = d.trim_matches('\'');
    let dtype = parse_descr(d).ok_or_else(|| NpyError::Unsupported(format!("dtype '{d}'")))?;
    if d.starts_with('>') {
        return Err(NpyError::Unsupported("big-endian data".into()));
    }
    let fo = dict_value(header, "fortran_order").ok_or_else(|| fmt("no 'fortran_order' in header"))?;
    if fo != "False" {
        return Err(NpyError::Unsupported("Fortran-ordered array".into()));
    }
    let sh = dict_value(header, "shape").ok_or_else(|| fmt("no 'shape' in header"))?;
    let dims: Vec<usize> = sh
        .trim_matches(['(', ')'])
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| fmt("bad shape in header")))
        .collect::<Result<_, _>>()?;
    let shape = Shape::new(dims).map_err(|e| NpyError::Unsupported(e.to_string()))?;
    let ty = TensorType::new(dtype, shape);
    let need = ty.storage_bytes();
    let data = &bytes[hend..];
    if data.len() < need {
        return Err(fmt(&format!("data has {} bytes, shape needs {need}", data.len())));
    }
    Tensor::new(ty, Bytes::copy_from_slice(&data[..need])).map_err(|e| fmt(&e.to_string()))
}

/// Writes a tensor as an `.npy` (version 1.0) image.
pub fn write(t: &Tensor) -> Result<Vec<u8>, NpyError> {
    let d = descr(t.dtype())
        .ok_or_else(|| NpyError::Unsupported(format!("NumPy has no dtype for {}", t.dtype())))?;
    let dims = t.shape().dims();
    let shape = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    // Pad so the data starts 64-byte aligned; the header ends with '\n'.
    let total = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat((64 - total % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + t.bytes().len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(t.bytes());
    Ok(out)
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
