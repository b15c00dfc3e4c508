//! What both runners do alike (`kiln-run`, which includes this file by path, and
//! `kiln-run-nostd`): read an input `.npy`, allocate an output, lay the outputs over their
//! buffers for a run and name their files. Core and alloc only.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use kiln_module::sections::TensorView;
use kiln_npy::{DType, NpyError};
use kiln_runtime::TensorMut;

/// `name` with every character outside `[A-Za-z0-9._-]` replaced by `_`, and `.npy`.
pub fn file_name(name: &str) -> String {
    let mut s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') { c } else { '_' }).collect();
    s.push_str(".npy");
    s
}

/// `len` zero bytes for a buffer whose size the artifact gave, or an error naming it.
pub fn zeroed(len: u64, what: &str) -> Result<Vec<u8>, String> {
    let refused = || format!("cannot allocate the {len} bytes of {what}");
    let n = usize::try_from(len).map_err(|_| refused())?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|_| refused())?;
    v.resize(n, 0);
    Ok(v)
}

/// An input array: dtype code, shape and its bytes.
pub struct Input {
    pub dtype: u32,
    pub dims: Vec<u64>,
    pub data: Vec<u8>,
}

/// Reads an input `.npy` for a signature input of dtype code `expected` (which an untyped
/// file, NumPy's for an `ml_dtypes` array, is read as), refusing bytes after the data (a
/// sign of a shape mismatch).
pub fn read_npy(bytes: &[u8], expected: u32) -> Result<Input, NpyError> {
    let a = kiln_npy::read_exact(bytes, DType::from_code(expected))?;
    let dtype = a.dtype.onnx_code().map_or(0, |c| c as u32);
    Ok(Input { dtype, dims: a.dims, data: a.data.into_owned() })
}

/// The outputs `descs` over their buffers `data` (one each, as [`zeroed`] made them),
/// for one invoke.
pub fn output_tensors<'d>(descs: &'d [TensorView<'_>], data: &'d mut [Vec<u8>]) -> Vec<TensorMut<'d>> {
    descs.iter().zip(data).map(|(t, d)| TensorMut { dtype: t.dtype, dims: &t.dims, data: d }).collect()
}
