//! A minimal `.npy` reader and writer: little-endian, C order, the dtypes a kiln
//! signature can name that NumPy has (ONNX codes in, ONNX codes out).

/// NumPy `descr` of an ONNX dtype code.
pub fn descr(dtype: u32) -> Option<&'static str> {
    Some(match dtype {
        1 => "<f4",
        2 => "|u1",
        3 => "|i1",
        4 => "<u2",
        5 => "<i2",
        6 => "<i4",
        7 => "<i8",
        9 => "|b1",
        10 => "<f2",
        11 => "<f8",
        12 => "<u4",
        13 => "<u8",
        _ => return None,
    })
}

fn dtype_of(descr: &str) -> Option<u32> {
    let (order, code) = descr.split_at_checked(1)?;
    if !matches!(order, "<" | "|" | "=") {
        return None;
    }
    (1..=13).find(|&d| descr_matches(d, code))
}

fn descr_matches(dtype: u32, code: &str) -> bool {
    descr(dtype).is_some_and(|d| &d[1..] == code)
}

/// A parsed array: ONNX dtype, shape, and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Array {
    /// ONNX dtype code.
    pub dtype: u32,
    /// Shape.
    pub dims: Vec<u64>,
    /// Little-endian C-order bytes.
    pub data: Vec<u8>,
}

/// The value text after `'key':` in a header dict.
fn field<'h>(header: &'h str, key: &str) -> Result<&'h str, String> {
    let k = format!("'{key}'");
    let at = header.find(&k).ok_or_else(|| format!("header has no '{key}'"))?;
    let rest = header[at + k.len()..].trim_start();
    rest.strip_prefix(':').map(str::trim_start).ok_or_else(|| format!("header: no ':' after '{key}'"))
}

/// Parses a `.npy` file.
pub fn read(bytes: &[u8]) -> Result<Array, String> {
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err("not a .npy file (bad magic)".into());
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format!(".npy version {v} is not supported")),
    };
    let header = bytes.get(hstart..hstart + hlen).ok_or("truncated .npy header")?;
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text")?;
    let d = field(header, "descr")?;
    let q = d.chars().next().filter(|c| *c == '\'' || *c == '"').ok_or("descr is not a string")?;
    let d = d[1..].split(q).next().unwrap_or_default();
    let dtype = dtype_of(d).ok_or_else(|| format!("dtype '{d}' is not supported (little-endian numbers and bools)"))?;
    if field(header, "fortran_order")?.starts_with("True") {
        return Err("Fortran-order arrays are not supported; save a C-order array".into());
    }
    let s = field(header, "shape")?;
    let s = s.strip_prefix('(').and_then(|s| s.split(')').next()).ok_or("shape is not a tuple")?;
    let dims = s
        .split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| x.trim_end_matches('L').parse::<u64>().map_err(|_| format!("bad dimension '{x}' in shape")))
        .collect::<Result<Vec<_>, _>>()?;
    let n = dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d)).ok_or("shape overflows")?;
    let size = kiln_runtime::dtype::storage_bytes(dtype, &dims).ok_or("shape overflows")?;
    let data = &bytes[hstart + hlen..];
    if data.len() as u64 != size {
        return Err(format!("{n} elements need {size} bytes of data, the file has {}", data.len()));
    }
    Ok(Array { dtype, dims, data: data.to_vec() })
}

/// Encodes an array as `.npy` version 1.0 (header padded to a multiple of 64 bytes).
pub fn write(dtype: u32, dims: &[u64], data: &[u8]) -> Result<Vec<u8>, String> {
    let d = descr(dtype).ok_or("NumPy has no such dtype")?;
    let shape = match dims {
        [one] => format!("({one},)"),
        _ => format!("({})", dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{d}', 'fortran_order': False, 'shape': {shape}, }}");
    let total = 10 + header.len() + 1;
    header.push_str(&" ".repeat(total.next_multiple_of(64) - total));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(b"\x93NUMPY\x01\x00");
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_layout() {
        let data: Vec<u8> = [1.5f32, -2.0, 0.25, 8.0, 0.0, 1.0].iter().flat_map(|x| x.to_le_bytes()).collect();
        let f = write(1, &[2, 3], &data).expect("write");
        assert_eq!(&f[..8], b"\x93NUMPY\x01\x00");
        let hlen = u16::from_le_bytes([f[8], f[9]]) as usize;
        assert_eq!((10 + hlen) % 64, 0);
        assert_eq!(f[10 + hlen - 1], b'\n');
        assert_eq!(read(&f).expect("read"), Array { dtype: 1, dims: vec![2, 3], data });
        for (dims, text) in [(&[][..], "()"), (&[7][..], "(7,)"), (&[1, 2, 3][..], "(1, 2, 3)")] {
            let f = write(7, dims, &vec![0; 8 * dims.iter().product::<u64>() as usize]).expect("write");
            assert!(String::from_utf8_lossy(&f).contains(&format!("'shape': {text}")), "{dims:?}");
            assert_eq!(read(&f).expect("read").dims, dims);
        }
    }

    #[test]
    fn reads_what_numpy_writes() {
        // np.save of np.array([[1, 2]], dtype=np.int32): the header NumPy writes.
        let mut f = b"\x93NUMPY\x01\x00v\x00{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2), }".to_vec();
        f.resize(10 + 0x76 - 1, b' ');
        f.push(b'\n');
        f.extend([1, 0, 0, 0, 2, 0, 0, 0]);
        let a = read(&f).expect("read");
        assert_eq!((a.dtype, a.dims), (6, vec![1, 2]));
        assert!(read(&replaced(&f, "'<i4'", "'|b1'")).is_err(), "two bools are 2 bytes, the file has 8");
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
        let ok = write(1, &[2], &[0; 8]).expect("write");
        assert!(read(&replaced(&ok, "'<f4'", "'>f4'")).unwrap_err().contains(">f4"));
        assert!(read(&replaced(&ok, "False", "True ")).unwrap_err().contains("Fortran"));
        assert!(read(&ok[..ok.len() - 1]).unwrap_err().contains("8 bytes"));
        assert!(read(b"hello").is_err());
        assert!(write(16, &[1], &[0, 0]).is_err(), "bf16 has no NumPy dtype");
    }
}
