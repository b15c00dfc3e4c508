//! Reading and writing NumPy `.npy` images: format versions 1.0 to 3.0, C order,
//! little-endian, every dtype of [`kiln_module::dtype`].
//!
//! This is the one `.npy` codec of kiln. It works on bytes and dtype codes only, so the
//! `no_std` side (the minimal runner, which links the runtime and no compiler code) uses it
//! as is; `kiln_ir::npy` builds `Tensor`s on top of it.
//!
//! [`write`] emits version 1.0 with the header padded so the data starts at a multiple of
//! 64 bytes, as NumPy does. [`read`] takes what NumPy writes and tells apart a damaged
//! file from a valid one kiln cannot use ([`NpyError::is_unsupported`]).
//!
//! # The types NumPy lacks: the `ml_dtypes` convention
//!
//! bf16, the 8-, 6- and 4-bit floats and int4/uint4 have no NumPy builtin; numpy users
//! hold them as arrays of the `ml_dtypes` package (`bfloat16`, `float8_e4m3fn`, …, `int4`,
//! [`DType::ml_dtypes_name`]). `numpy.save` writes such an array *untyped*: its `descr` is
//! a void of the element size, `'<V2'` for `bfloat16` and `'<V1'` for the one-byte types,
//! with the element bits as they are in memory, and `numpy.load` gives back a `|V2`/`|V1`
//! array that `.view(ml_dtypes.bfloat16)` turns into the values. (The one exception is
//! `float8_e5m2`, which `numpy.save` writes as `'<f1'`, a `descr` `numpy.load` itself
//! refuses.) `ml_dtypes` keeps the sub-byte types one element per byte in the low bits
//! (`int4` -1 is `0x0f`), where kiln packs int4, uint4 and f4E2M1FN two to a byte.
//!
//! So the file cannot say which of these types it holds, and kiln follows numpy both ways:
//! - [`write`] emits what `numpy.save` writes for the `ml_dtypes` array, `'<V2'` for bf16
//!   and `'<V1'` for the others (`float8_e5m2` included, so `numpy.load` reads it), the
//!   packed types unpacked one element per byte with the high bits zero. In numpy,
//!   `np.load(f).view(ml_dtypes.X)` gives the same bits back.
//! - [`read_typed`] given the dtype the caller expects (a model input's) reads a void of
//!   that dtype's element size (any byte-order mark), or `'<f1'` for f8E5M2, as that dtype,
//!   packing int4/uint4/f4E2M1FN again; a byte with bits set above the type's width is an
//!   error, not silently cut ([`NpyError::SubByteValue`]: `ml_dtypes` never writes one;
//!   reading, it drops the high nibble of int4/uint4/float4 bytes but not float6's two
//!   high bits, so such a byte means the file holds something else). [`read`], with no
//!   expected dtype, refuses such a file ([`NpyError::Untyped`]): it cannot tell bf16 from
//!   f16 bits or two int8s.
//!
//! What numpy 2.2 and ml_dtypes 0.5 write and read is checked, not assumed, by
//! `kiln-ir/tests/npy_ml_dtypes.rs` against the pinned packages of the test venv.
#![no_std]
#![deny(missing_docs)]

extern crate alloc;

use alloc::borrow::Cow;
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
    /// An untyped (void) `descr`, as NumPy writes for `ml_dtypes` arrays, read without an
    /// expected dtype.
    Untyped(String),
    /// An untyped `descr` whose element size is not the expected dtype's in the `ml_dtypes`
    /// convention (or the expected dtype is one NumPy has a type for).
    UntypedMismatch {
        /// The file's `descr`.
        descr: String,
        /// The dtype the caller expected.
        expected: DType,
    },
    /// A one-byte element of a sub-byte type (int4, uint4, f4E2M1FN, f6E3M2FN) with bits set
    /// above the type's width.
    SubByteValue {
        /// The element type.
        dtype: DType,
        /// The element's index in C order.
        index: u64,
        /// Its byte.
        byte: u8,
    },
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
            NpyError::Version(_)
                | NpyError::UnsupportedDType(_)
                | NpyError::FortranOrder
                | NpyError::Untyped(_)
                | NpyError::UntypedMismatch { .. }
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
            NpyError::Untyped(d) => write!(
                f,
                "dtype '{d}' does not say its type (NumPy writes it for ml_dtypes arrays: bfloat16, float8_*, \
                 int4, ...); kiln reads it only where the expected dtype is known, e.g. a model input"
            ),
            NpyError::UntypedMismatch { descr, expected } => match expected.ml_dtypes_name() {
                Some(ml) => write!(
                    f,
                    "dtype '{descr}' cannot hold {expected}: ml_dtypes.{ml} is saved as '<V{}'",
                    expected.numpy_itemsize()
                ),
                None => write!(
                    f,
                    "dtype '{descr}' does not say its type, and {expected} is saved typed ('{}'), not as a void",
                    expected.npy_descr().unwrap_or("?")
                ),
            },
            NpyError::SubByteValue { dtype, index, byte } => write!(
                f,
                "element {index} is byte {byte:#04x}, not a {dtype} (ml_dtypes keeps it in the low {} bits, the rest zero)",
                sub_byte_width(*dtype).unwrap_or(8)
            ),
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
    /// Little-endian C-order element bytes in kiln's layout (int4, uint4 and f4E2M1FN packed
    /// two per byte): exactly what the shape needs. Borrowed from the image except where
    /// sub-byte elements were packed.
    pub data: Cow<'a, [u8]>,
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
/// NumPy type code; an untyped one (a void, or the `'<f1'` NumPy writes for
/// `ml_dtypes.float8_e5m2`) is read as `expected` where that is an `ml_dtypes` type of the
/// same element size.
fn parse_descr(d: &str, expected: Option<DType>) -> Result<DType, NpyError> {
    let code = d.strip_prefix(['<', '|', '=']).unwrap_or(d);
    if let Some(t) = DType::from_npy_code(code) {
        return Ok(t);
    }
    let size = match code.strip_prefix('V') {
        Some(n) => n.parse::<usize>().ok(),
        None if code == "f1" => Some(1),
        None => None,
    };
    let Some(size) = size else { return Err(NpyError::UnsupportedDType(d.to_string())) };
    let Some(expected) = expected else { return Err(NpyError::Untyped(d.to_string())) };
    let fits = expected.ml_dtypes_name().is_some()
        && expected.numpy_itemsize() == size
        && (code != "f1" || expected == DType::F8E5M2);
    if fits {
        Ok(expected)
    } else {
        Err(NpyError::UntypedMismatch { descr: d.to_string(), expected })
    }
}

/// Bits of a sub-byte type that `ml_dtypes` stores one element per byte.
fn sub_byte_width(dtype: DType) -> Option<u32> {
    match dtype {
        DType::I4 | DType::U4 | DType::F4E2M1FN => Some(4),
        DType::F6E3M2FN => Some(6),
        _ => None,
    }
}

/// Checks NumPy's one-byte elements of a sub-byte type and, for the packed ones, packs
/// them two per byte, low nibble first.
fn from_numpy_layout(dtype: DType, bytes: &[u8]) -> Result<Cow<'_, [u8]>, NpyError> {
    let Some(width) = sub_byte_width(dtype) else { return Ok(Cow::Borrowed(bytes)) };
    if let Some(i) = bytes.iter().position(|&b| b >> width != 0) {
        return Err(NpyError::SubByteValue { dtype, index: i as u64, byte: bytes[i] });
    }
    if !dtype.is_packed() {
        return Ok(Cow::Borrowed(bytes));
    }
    Ok(Cow::Owned(bytes.chunks(2).map(|p| p[0] | p.get(1).map_or(0, |h| h << 4)).collect()))
}

/// Unpacks kiln's two-per-byte elements to NumPy's one per byte.
fn to_numpy_layout(dtype: DType, elements: usize, data: &[u8]) -> Cow<'_, [u8]> {
    if !dtype.is_packed() {
        return Cow::Borrowed(data);
    }
    Cow::Owned(data.iter().flat_map(|b| [b & 0xf, b >> 4]).take(elements).collect())
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

/// Parses an `.npy` image of a type NumPy has; an untyped one (as NumPy writes for
/// `ml_dtypes` arrays) is [`NpyError::Untyped`]: use [`read_typed`] where the dtype is known.
pub fn read(bytes: &[u8]) -> Result<Array<'_>, NpyError> {
    read_typed(bytes, None)
}

/// Parses an `.npy` image, reading an untyped one as `expected` in the `ml_dtypes`
/// convention (see the module documentation). A typed image keeps its own dtype, whatever
/// `expected` is: comparing is the caller's business, with its own message.
pub fn read_typed(bytes: &[u8], expected: Option<DType>) -> Result<Array<'_>, NpyError> {
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
    let dtype = parse_descr(d, expected)?;
    let fortran = field(header, "fortran_order")?;
    if fortran.starts_with("True") {
        return Err(NpyError::FortranOrder);
    } else if !fortran.starts_with("False") {
        return Err(NpyError::BadHeader("fortran_order"));
    }
    let dims = parse_dims(field(header, "shape")?)?;

    let elements = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or(NpyError::ShapeOverflow)?;
    let need = elements.checked_mul(dtype.numpy_itemsize() as u64).ok_or(NpyError::ShapeOverflow)?;
    let rest = &bytes[hend..];
    let data = usize::try_from(need).ok().and_then(|n| rest.get(..n)).ok_or(NpyError::Length {
        elements,
        need,
        have: rest.len() as u64,
    })?;
    let trailing = rest.len() - data.len();
    Ok(Array { dtype, dims, data: from_numpy_layout(dtype, data)?, trailing })
}

/// Parses an `.npy` image like [`read_typed`], refusing bytes after the data (a sign that
/// the header's shape is not the data's: what a runner wants of an input file).
pub fn read_exact(bytes: &[u8], expected: Option<DType>) -> Result<Array<'_>, NpyError> {
    let a = read_typed(bytes, expected)?;
    if a.trailing != 0 {
        let elements: u64 = a.dims.iter().product();
        let need = elements * a.dtype.numpy_itemsize() as u64;
        return Err(NpyError::Length { elements, need, have: need + a.trailing as u64 });
    }
    Ok(a)
}

/// Encodes an array (`data` in kiln's layout) as an `.npy` version 1.0 image (header
/// padded so the data starts at a multiple of 64 bytes, ending in `'\n'`); the types NumPy
/// lacks as NumPy saves their `ml_dtypes` arrays (see the module documentation).
pub fn write(dtype: DType, dims: &[u64], data: &[u8]) -> Result<Vec<u8>, NpyError> {
    let void;
    let d = match dtype.npy_descr() {
        Some(d) => d,
        None => {
            void = format!("<V{}", dtype.numpy_itemsize());
            &void
        }
    };
    let need = dtype.dense_bytes(dims).ok_or(NpyError::ShapeOverflow)?;
    if need != data.len() as u64 {
        return Err(NpyError::DataLength { need, have: data.len() as u64 });
    }
    let elements = dims.iter().product::<u64>();
    let data = to_numpy_layout(dtype, usize::try_from(elements).map_err(|_| NpyError::ShapeOverflow)?, data);
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
    out.extend_from_slice(&data);
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
        assert_eq!(
            read(&f).expect("read"),
            Array { dtype: DType::F32, dims: vec![2, 3], data: Cow::Borrowed(&data), trailing: 0 }
        );
        for (dims, text) in [(&[][..], "()"), (&[7][..], "(7,)"), (&[1, 2, 3][..], "(1, 2, 3)")] {
            let f = write(DType::I64, dims, &vec![0; 8 * dims.iter().product::<u64>() as usize]).expect("write");
            assert!(String::from_utf8_lossy(&f).contains(&format!("'shape': {text}")), "{dims:?}");
            assert_eq!(read(&f).expect("read").dims, dims);
        }
        let b = write(DType::Bool, &[3], &[1, 0, 1]).expect("write");
        assert!(String::from_utf8_lossy(&b).contains("'descr': '|b1'"));
        assert_eq!(*read(&b).expect("read").data, [1, 0, 1]);
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
        assert_eq!((a.dtype, a.dims, &*a.data), (DType::U16, vec![2], &[1, 0, 2, 0][..]));
    }

    /// Pseudo-random bytes of storage for `n` elements of `dtype` in kiln's layout
    /// (a packed type's padding nibble zero, f6's two high bits zero).
    fn kiln_bytes(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed;
        let mut v: Vec<u8> = (0..dtype.storage_bytes(n))
            .map(|_| {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect();
        if dtype == DType::F6E3M2FN {
            v.iter_mut().for_each(|b| *b &= 0x3f);
        }
        if dtype.is_packed() && n % 2 == 1 {
            if let Some(last) = v.last_mut() {
                *last &= 0xf;
            }
        }
        v
    }

    #[test]
    fn every_dtype_round_trips() {
        for dtype in DType::ALL {
            for dims in [&[][..], &[0][..], &[1][..], &[5][..], &[2, 3][..], &[3, 1, 3][..]] {
                let n = dims.iter().product::<u64>() as usize;
                let data = kiln_bytes(dtype, n, n as u64 + dtype as u64);
                let f = write(dtype, dims, &data).expect("write");
                let hint = dtype.ml_dtypes_name().map(|_| dtype);
                let a = read_exact(&f, hint).unwrap_or_else(|e| panic!("{dtype} {dims:?}: {e}"));
                assert_eq!((a.dtype, &a.dims[..], &*a.data), (dtype, dims, &data[..]), "{dtype} {dims:?}");
                // What NumPy sees: the element size and layout of its (ml_dtypes) array.
                let descr = match dtype.npy_descr() {
                    Some(d) => d.to_string(),
                    None => format!("<V{}", dtype.numpy_itemsize()),
                };
                assert!(String::from_utf8_lossy(&f).contains(&format!("'descr': '{descr}'")), "{dtype}");
                let body = &f[f.len() - n * dtype.numpy_itemsize()..];
                if dtype.is_packed() {
                    let nibbles: Vec<u8> = data.iter().flat_map(|b| [b & 0xf, b >> 4]).take(n).collect();
                    assert_eq!(body, nibbles, "{dtype}: one element per byte, low nibble");
                } else {
                    assert_eq!(body, data, "{dtype}");
                }
            }
        }
    }

    #[test]
    fn untyped_files_need_the_expected_dtype() {
        let bf = write(DType::BF16, &[2], &[0x80, 0x3f, 0, 0x40]).expect("write");
        assert_eq!(read(&bf), Err(NpyError::Untyped("<V2".into())));
        let e = read(&bf).unwrap_err();
        assert!(e.is_unsupported() && e.to_string().contains("bfloat16"), "{e}");
        // Any byte-order mark: numpy.load hands back '|V2', numpy.save writes '<V2'.
        for mark in ["|", "=", "<"] {
            let f = replaced(&bf, "'<V2'", &format!("'{mark}V2'"));
            assert_eq!(read_typed(&f, Some(DType::BF16)).map(|a| a.dtype), Ok(DType::BF16), "{mark}");
        }
        // A typed file keeps its type whatever was expected.
        let f16 = replaced(&bf, "'<V2'", "'<f2'");
        assert_eq!(read_typed(&f16, Some(DType::BF16)).map(|a| a.dtype), Ok(DType::F16));
        // The element size must be the expected type's, and only ml_dtypes types are voids.
        for expected in [DType::F8E4M3FN, DType::I4, DType::I16, DType::F16] {
            let e = read_typed(&bf, Some(expected)).unwrap_err();
            assert_eq!(e, NpyError::UntypedMismatch { descr: "<V2".into(), expected });
            assert!(e.is_unsupported() && e.to_string().contains(expected.name()), "{e}");
        }
        // numpy.save writes ml_dtypes.float8_e5m2 as '<f1': that one type only.
        let f8 = write(DType::F8E5M2, &[2], &[0x3c, 0xc0]).expect("write");
        assert!(String::from_utf8_lossy(&f8).contains("'<V1'"), "kiln writes a void numpy.load reads");
        let f1 = replaced(&f8, "'<V1'", "'<f1'");
        assert_eq!(read_typed(&f1, Some(DType::F8E5M2)).map(|a| a.data.into_owned()), Ok(vec![0x3c, 0xc0]));
        assert_eq!(
            read_typed(&f1, Some(DType::F8E4M3FN)),
            Err(NpyError::UntypedMismatch { descr: "<f1".into(), expected: DType::F8E4M3FN })
        );
        assert_eq!(read(&f1), Err(NpyError::Untyped("<f1".into())));
        assert_eq!(read(&replaced(&f8, "'<V1'", "'<Vx'")), Err(NpyError::UnsupportedDType("<Vx".into())));
        assert_eq!(read(&replaced(&f8, "'<V1'", "'<f3'")), Err(NpyError::UnsupportedDType("<f3".into())));
    }

    #[test]
    fn sub_byte_types_pack_and_check_their_bytes() {
        // ml_dtypes.int4 [-8, -1, 0, 7, 1] is the bytes 08 0f 00 07 01; kiln packs them.
        let f = write(DType::I4, &[5], &[0xf8, 0x70, 0x01]).expect("write");
        assert!(f.ends_with(&[0x08, 0x0f, 0x00, 0x07, 0x01]));
        let a = read_typed(&f, Some(DType::I4)).expect("read");
        assert_eq!(*a.data, [0xf8, 0x70, 0x01]);
        for (dtype, byte) in [(DType::I4, 0xff), (DType::U4, 0x10), (DType::F4E2M1FN, 0x80), (DType::F6E3M2FN, 0x40)] {
            let mut g = write(dtype, &[3], &kiln_bytes(dtype, 3, 7)).expect("write");
            let at = g.len() - 2;
            g[at] = byte;
            let e = read_typed(&g, Some(dtype)).unwrap_err();
            assert_eq!(e, NpyError::SubByteValue { dtype, index: 1, byte });
            assert!(!e.is_unsupported() && e.to_string().contains(dtype.name()), "{e}");
        }
        // The one-per-byte image is what the shape needs; a packed-length body is short.
        let short = replaced(&f, "(5,)", "(9,)");
        assert_eq!(read_typed(&short, Some(DType::I4)), Err(NpyError::Length { elements: 9, need: 9, have: 5 }));
        let mut long = f.clone();
        long.push(0);
        assert_eq!(read_exact(&long, Some(DType::I4)), Err(NpyError::Length { elements: 5, need: 5, have: 6 }));
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
        assert_eq!(read_exact(&long, None), Err(NpyError::Length { elements: 2, need: 8, have: 12 }));
        assert_eq!(read_exact(&ok, None).map(|a| a.data.len()), Ok(8));
        assert_eq!(read(b"\x93NUMPY\x01\x00\xff\xff{"), Err(NpyError::TruncatedHeader));
        assert_eq!(read(b"\x93NUMPY\x02\x00\x01\x00"), Err(NpyError::TruncatedHeader));
        assert_eq!(read(b"\x93NUMPY\x04\x00\x00\x00"), Err(NpyError::Version(4)));
        assert_eq!(write(DType::BF16, &[1], &[0]), Err(NpyError::DataLength { need: 2, have: 1 }));
        assert_eq!(write(DType::I4, &[3], &[0]), Err(NpyError::DataLength { need: 2, have: 1 }));
        assert_eq!(write(DType::F32, &[2], &[0; 7]), Err(NpyError::DataLength { need: 8, have: 7 }));
    }
}
