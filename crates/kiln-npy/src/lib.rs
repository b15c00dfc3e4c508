//! Reading and writing NumPy `.npy` images: format versions 1.0 to 3.0, C order,
//! little-endian, the dtypes of [`kiln_module::dtype`] that NumPy has.
//!
//! This is the one `.npy` codec of kiln. It works on bytes and dtype codes only, so the
//! `no_std` side (the minimal runner, which links the runtime and no compiler code) uses it
//! as is; `kiln_ir::npy` builds `Tensor`s on top of it.
//!
//! [`write`] emits version 1.0 with the header padded so the data starts at a multiple of
//! 64 bytes, as NumPy does. [`read`] takes what NumPy writes and tells apart a damaged
//! file from a valid one kiln cannot use ([`NpyError::is_unsupported`]).
#![no_std]
#![deny(missing_docs)]

extern crate alloc;

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
pub use kiln_module::dtype::DType;

const MAGIC: &[u8] = b"\x93NUMPY";

/// Why an `.npy` image could not be read or written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NpyError {
    /// The image does not start with `\x93NUMPY` and a version.
    BadMagic,
    /// A format version other than 1, 2 or 3.
    Version(u8),
    /// The header length runs past the end of the image.
    TruncatedHeader,
    /// The header is not UTF-8.
    HeaderNotText,
    /// The header dict has no such key, or its value is malformed.
    BadHeader(&'static str),
    /// A `descr` kiln does not read (big-endian, structured, strings, …).
    UnsupportedDType(String),
    /// A Fortran-order array.
    FortranOrder,
    /// A shape entry that is not a non-negative integer.
    BadDimension(String),
    /// The shape's byte size overflows.
    ShapeOverflow,
    /// The data is not as long as the shape needs.
    Length {
        /// Elements of the shape.
        elements: u64,
        /// Bytes they need.
        need: u64,
        /// Bytes the image has after the header.
        have: u64,
    },
    /// Writing a dtype NumPy has no type for.
    NoNumpyDType(DType),
    /// Writing data whose length does not match the shape.
    DataLength {
        /// Bytes the shape needs.
        need: u64,
        /// Bytes given.
        have: u64,
    },
}

impl NpyError {
    /// True for a well-formed image with content kiln cannot use (as opposed to a damaged
    /// one).
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            NpyError::Version(_) | NpyError::UnsupportedDType(_) | NpyError::FortranOrder | NpyError::NoNumpyDType(_)
        )
    }
}

impl fmt::Display for NpyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NpyError::BadMagic => f.write_str("not a .npy file (bad magic)"),
            NpyError::Version(v) => write!(f, ".npy version {v} is not supported"),
            NpyError::TruncatedHeader => f.write_str("truncated .npy header"),
            NpyError::HeaderNotText => f.write_str("the .npy header is not text"),
            NpyError::BadHeader(what) => write!(f, "bad .npy header: {what}"),
            NpyError::UnsupportedDType(d) => {
                write!(f, "dtype '{d}' is not supported (little-endian numbers and bools)")
            }
            NpyError::FortranOrder => f.write_str("Fortran-order arrays are not supported; save a C-order array"),
            NpyError::BadDimension(d) => write!(f, "bad dimension '{d}' in shape"),
            NpyError::ShapeOverflow => f.write_str("shape overflows"),
            NpyError::Length { elements, need, have } => {
                write!(f, "{elements} elements need {need} bytes of data, the file has {have}")
            }
            NpyError::NoNumpyDType(d) => write!(f, "NumPy has no dtype for {d}"),
            NpyError::DataLength { need, have } => write!(f, "the shape needs {need} bytes of data, got {have}"),
        }
    }
}

impl core::error::Error for NpyError {}

/// A parsed image: dtype, shape and the bytes of its elements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Array<'a> {
    /// Element type.
    pub dtype: DType,
    /// Shape (`[]` for a scalar).
    pub dims: Vec<u64>,
    /// Little-endian C-order element bytes: exactly what the shape needs.
    pub data: &'a [u8],
    /// Bytes after the data (NumPy writes none; callers decide whether to refuse them).
    pub trailing: usize,
}

/// The value text after `'key':` in a header dict.
fn field<'h>(header: &'h str, key: &'static str) -> Result<&'h str, NpyError> {
    let quoted = |q: char| header.find(&format!("{q}{key}{q}")).map(|at| at + key.len() + 2);
    let end = quoted('\'').or_else(|| quoted('"')).ok_or(NpyError::BadHeader(key))?;
    let rest = header.get(end..).ok_or(NpyError::BadHeader(key))?.trim_start();
    rest.strip_prefix(':').map(str::trim_start).ok_or(NpyError::BadHeader(key))
}

/// The dtype of a `descr` string: an optional byte-order mark (`<`, `|` or `=`) and a
/// NumPy type code.
fn parse_descr(d: &str) -> Result<DType, NpyError> {
    let code = d.strip_prefix(['<', '|', '=']).unwrap_or(d);
    DType::from_npy_code(code).ok_or_else(|| NpyError::UnsupportedDType(d.to_string()))
}

fn parse_dims(shape: &str) -> Result<Vec<u64>, NpyError> {
    let inner = shape.strip_prefix('(').and_then(|s| s.split(')').next()).ok_or(NpyError::BadHeader("shape"))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.trim_end_matches('L').parse::<u64>().map_err(|_| NpyError::BadDimension(x.to_string())))
        .collect()
}

/// Parses an `.npy` image.
pub fn read(bytes: &[u8]) -> Result<Array<'_>, NpyError> {
    let (Some(magic), Some(&major)) = (bytes.get(..MAGIC.len()), bytes.get(6)) else {
        return Err(NpyError::BadMagic);
    };
    if magic != MAGIC || bytes.len() < 10 {
        return Err(NpyError::BadMagic);
    }
    let (hlen, hstart) = match (major, bytes) {
        (1, [_, _, _, _, _, _, _, _, a, b, ..]) => (usize::from(u16::from_le_bytes([*a, *b])), 10usize),
        (2 | 3, [_, _, _, _, _, _, _, _, a, b, c, d, ..]) => (u32::from_le_bytes([*a, *b, *c, *d]) as usize, 12),
        (2 | 3, _) => return Err(NpyError::TruncatedHeader),
        (v, _) => return Err(NpyError::Version(v)),
    };
    let hend = hstart.checked_add(hlen).filter(|&e| e <= bytes.len()).ok_or(NpyError::TruncatedHeader)?;
    let header = bytes.get(hstart..hend).ok_or(NpyError::TruncatedHeader)?;
    let header = core::str::from_utf8(header).map_err(|_| NpyError::HeaderNotText)?;

    let d = field(header, "descr")?;
    let q = d.chars().next().filter(|c| *c == '\'' || *c == '"').ok_or(NpyError::BadHeader("descr"))?;
    let d = d[1..].split(q).next().unwrap_or_default();
    let dtype = parse_descr(d)?;
    let fortran = field(header, "fortran_order")?;
    if fortran.starts_with("True") {
        return Err(NpyError::FortranOrder);
    } else if !fortran.starts_with("False") {
        return Err(NpyError::BadHeader("fortran_order"));
    }
    let dims = parse_dims(field(header, "shape")?)?;

    let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or(NpyError::ShapeOverflow)?;
    let need = dtype.dense_bytes(&dims).ok_or(NpyError::ShapeOverflow)?;
    let rest = &bytes[hend..];
    let data = usize::try_from(need).ok().and_then(|n| rest.get(..n)).ok_or(NpyError::Length {
        elements,
        need,
        have: rest.len() as u64,
    })?;
    Ok(Array { dtype, dims, data, trailing: rest.len() - data.len() })
}

/// Parses an `.npy` image like [`read`], refusing bytes after the data (a sign that the
/// header's shape is not the data's: what a runner wants of an input file).
pub fn read_exact(bytes: &[u8]) -> Result<Array<'_>, NpyError> {
    let a = read(bytes)?;
    if a.trailing != 0 {
        let need = a.data.len() as u64;
        let elements = a.dims.iter().product();
        return Err(NpyError::Length { elements, need, have: need + a.trailing as u64 });
    }
    Ok(a)
}

/// Encodes an array as an `.npy` version 1.0 image (header padded so the data starts at a
/// multiple of 64 bytes, ending in `'\n'`).
pub fn write(dtype: DType, dims: &[u64], data: &[u8]) -> Result<Vec<u8>, NpyError> {
    let d = dtype.npy_descr().ok_or(NpyError::NoNumpyDType(dtype))?;
    let need = dtype.dense_bytes(dims).ok_or(NpyError::ShapeOverflow)?;
    if need != data.len() as u64 {
        return Err(NpyError::DataLength { need, have: data.len() as u64 });
    }
    let shape = match dims {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    let total = MAGIC.len() + 4 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let hlen = u16::try_from(header.len()).map_err(|_| NpyError::ShapeOverflow)?;
    let mut out = Vec::with_capacity(MAGIC.len() + 4 + header.len() + data.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&hlen.to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn round_trip_and_layout() {
        let data = f32_bytes(&[1.5, -2.0, 0.25, 8.0, 0.0, 1.0]);
        let f = write(DType::F32, &[2, 3], &data).expect("write");
        assert_eq!(&f[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([f[8], f[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        assert_eq!(f[10 + hlen - 1], b'\n');
        assert_eq!(read(&f).expect("read"), Array { dtype: DType::F32, dims: vec![2, 3], data: &data, trailing: 0 });
        for (dims, text) in [(&[][..], "()"), (&[7][..], "(7,)"), (&[1, 2, 3][..], "(1, 2, 3)")] {
            let f = write(DType::I64, dims, &vec![0; 8 * dims.iter().product::<u64>() as usize]).expect("write");
            assert!(String::from_utf8_lossy(&f).contains(&format!("'shape': {text}")), "{dims:?}");
            assert_eq!(read(&f).expect("read").dims, dims);
        }
        let b = write(DType::Bool, &[3], &[1, 0, 1]).expect("write");
        assert!(String::from_utf8_lossy(&b).contains("'descr': '|b1'"));
        assert_eq!(read(&b).expect("read").data, [1, 0, 1]);
    }

    #[test]
    fn writes_the_header_numpy_writes() {
        // np.save of np.zeros((2, 3), np.float32), byte for byte up to the data.
        let mut want = b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }".to_vec();
        want.resize(10 + 0x76 - 1, b' ');
        want.push(b'\n');
        want.extend([0; 24]);
        assert_eq!(write(DType::F32, &[2, 3], &[0; 24]).expect("write"), want);
    }

    #[test]
    fn reads_what_numpy_writes() {
        // np.save of np.array([[1, 2]], dtype=np.int32): the header NumPy writes.
        let mut f = b"\x93NUMPY\x01\x00v\x00{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2), }".to_vec();
        f.resize(10 + 0x76 - 1, b' ');
        f.push(b'\n');
        f.extend([1, 0, 0, 0, 2, 0, 0, 0]);
        let a = read(&f).expect("read");
        assert_eq!((a.dtype, a.dims, a.trailing), (DType::I32, vec![1, 2], 0));
        let bools = replaced(&f, "'<i4'", "'|b1'");
        let b = read(&bools).expect("two bools and six bytes more");
        assert_eq!((b.data.len(), b.trailing), (2, 6));
        // Version 2.0 has a four-byte header length; double quotes and 'L' suffixes occur
        // in files written by other tools.
        let mut v2 = b"\x93NUMPY\x02\x00".to_vec();
        let h = b"{\"descr\": \"<u2\", \"fortran_order\": False, \"shape\": (2L,), }\n";
        v2.extend((h.len() as u32).to_le_bytes());
        v2.extend(h);
        v2.extend([1, 0, 2, 0]);
        let a = read(&v2).expect("read v2");
        assert_eq!((a.dtype, a.dims, a.data), (DType::U16, vec![2], &[1, 0, 2, 0][..]));
    }

    fn replaced(f: &[u8], from: &str, to: &str) -> Vec<u8> {
        assert_eq!(from.len(), to.len());
        let i = f.windows(from.len()).position(|w| w == from.as_bytes()).expect("present");
        let mut g = f.to_vec();
        g[i..i + to.len()].copy_from_slice(to.as_bytes());
        g
    }

    #[test]
    fn rejects_what_it_cannot_read() {
        let ok = write(DType::F32, &[2], &[0; 8]).expect("write");
        let big = read(&replaced(&ok, "'<f4'", "'>f4'")).unwrap_err();
        assert_eq!(big, NpyError::UnsupportedDType(">f4".into()));
        assert!(big.is_unsupported() && big.to_string().contains(">f4"));
        assert_eq!(read(&replaced(&ok, "False", "True ")), Err(NpyError::FortranOrder));
        assert_eq!(read(&replaced(&ok, "False", "Nope ")), Err(NpyError::BadHeader("fortran_order")));
        assert_eq!(read(&replaced(&ok, "(2,)", "(x,)")), Err(NpyError::BadDimension("x".into())));
        let short = read(&ok[..ok.len() - 1]).unwrap_err();
        assert_eq!(short, NpyError::Length { elements: 2, need: 8, have: 7 });
        assert!(!short.is_unsupported() && short.to_string().contains("8 bytes"));
        assert_eq!(
            read(&replaced(&ok, "(2,)", "(9,)")).unwrap_err().to_string(),
            "9 elements need 36 bytes of data, the file has 8"
        );
        let huge = |dim: &str| {
            let h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({dim},), }}\n");
            let mut f = b"\x93NUMPY\x01\x00".to_vec();
            f.extend((h.len() as u16).to_le_bytes());
            f.extend(h.as_bytes());
            f
        };
        assert_eq!(read(&huge("-1")), Err(NpyError::BadDimension("-1".into())));
        assert_eq!(read(&huge("4611686018427387904")), Err(NpyError::ShapeOverflow));
        assert_eq!(read(b"hello"), Err(NpyError::BadMagic));
        let mut long = ok.clone();
        long.extend([0; 4]);
        assert_eq!(read(&long).map(|a| a.trailing), Ok(4));
        assert_eq!(read_exact(&long), Err(NpyError::Length { elements: 2, need: 8, have: 12 }));
        assert_eq!(read_exact(&ok).map(|a| a.data.len()), Ok(8));
        assert_eq!(read(b"\x93NUMPY\x01\x00\xff\xff{"), Err(NpyError::TruncatedHeader));
        assert_eq!(read(b"\x93NUMPY\x02\x00\x01\x00"), Err(NpyError::TruncatedHeader));
        assert_eq!(read(b"\x93NUMPY\x04\x00\x00\x00"), Err(NpyError::Version(4)));
        assert_eq!(write(DType::BF16, &[1], &[0, 0]), Err(NpyError::NoNumpyDType(DType::BF16)));
        assert_eq!(write(DType::F32, &[2], &[0; 7]), Err(NpyError::DataLength { need: 8, have: 7 }));
    }
}
