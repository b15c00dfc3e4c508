//! The dtypes an artifact's signature may name, by ONNX `TensorProto.DataType` code:
//! names for messages and storage sizes for the load-time checks.

/// Name and bits of storage per element of an ONNX dtype code (4 for the packed types,
/// two elements a byte), or `None` for codes kiln does not run (strings, complex).
pub fn info(code: u32) -> Option<(&'static str, u32)> {
    Some(match code {
        1 => ("f32", 32),
        2 => ("u8", 8),
        3 => ("i8", 8),
        4 => ("u16", 16),
        5 => ("i16", 16),
        6 => ("i32", 32),
        7 => ("i64", 64),
        9 => ("bool", 8),
        10 => ("f16", 16),
        11 => ("f64", 64),
        12 => ("u32", 32),
        13 => ("u64", 64),
        16 => ("bf16", 16),
        17 => ("f8E4M3FN", 8),
        18 => ("f8E4M3FNUZ", 8),
        19 => ("f8E5M2", 8),
        20 => ("f8E5M2FNUZ", 8),
        21 => ("u4", 4),
        22 => ("i4", 4),
        23 => ("f4E2M1FN", 4),
        24 => ("f8E8M0FNU", 8),
        _ => return None,
    })
}

/// The dtype's name (`"f32"`), `None` for codes kiln does not run.
pub fn name(code: u32) -> Option<&'static str> {
    info(code).map(|(n, _)| n)
}

/// Bytes a dense row-major tensor of `dims` occupies, or `None` for an unknown dtype or
/// a size that overflows 64 bits.
pub fn storage_bytes(code: u32, dims: &[u64]) -> Option<u64> {
    let (_, bits) = info(code)?;
    let n = dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
    if bits == 4 {
        Some(n.div_ceil(2))
    } else {
        n.checked_mul(u64::from(bits / 8))
    }
}

/// Writes a dtype for a message: its name, or its code when unknown.
pub(crate) struct Show(pub u32);

impl core::fmt::Display for Show {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match name(self.0) {
            Some(n) => f.write_str(n),
            None => write!(f, "dtype code {}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(storage_bytes(1, &[2, 3]), Some(24));
        assert_eq!(storage_bytes(7, &[]), Some(8));
        assert_eq!(storage_bytes(21, &[3]), Some(2));
        assert_eq!(storage_bytes(16, &[5, 0]), Some(0));
        assert_eq!(storage_bytes(8, &[1]), None);
        assert_eq!(storage_bytes(1, &[u64::MAX, 2]), None);
        assert_eq!(storage_bytes(1, &[1 << 62]), None);
    }
}
