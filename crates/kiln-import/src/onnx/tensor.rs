//! `TensorProto` → [`Tensor`]: raw data (zero-copy), typed fields, external data.

use super::proto::{tensor_proto::DataLocation, TensorProto};
use crate::ImportError;
use bytes::Bytes;
use kiln_ir::{DType, Shape, Tensor, TensorType};
use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};

/// Files holding external tensor data, read once each and sliced per tensor.
#[derive(Default)]
pub(crate) struct ExternalFiles {
    base_dir: Option<PathBuf>,
    files: HashMap<PathBuf, Bytes>,
}

impl ExternalFiles {
    pub fn new(base_dir: Option<PathBuf>) -> Self {
        ExternalFiles { base_dir, files: HashMap::new() }
    }

    fn read(&mut self, name: &str, location: &str) -> Result<Bytes, ImportError> {
        let err = |message: String| ImportError::Tensor { name: name.to_string(), message };
        let rel = Path::new(location);
        if rel.is_absolute() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return Err(err(format!(
                "external data location `{location}` must be a relative path inside the model's directory"
            )));
        }
        let Some(base) = &self.base_dir else {
            return Err(err(format!(
                "data is in external file `{location}`, but the model was not loaded from a file"
            )));
        };
        let path = base.join(rel);
        if let Some(b) = self.files.get(&path) {
            return Ok(b.clone());
        }
        let data =
            std::fs::read(&path).map_err(|e| err(format!("cannot read external data `{}`: {e}", path.display())))?;
        let b = Bytes::from(data);
        self.files.insert(path, b.clone());
        Ok(b)
    }
}

/// Decodes one tensor.
pub(crate) fn tensor_from_proto(t: &TensorProto, ext: &mut ExternalFiles) -> Result<Tensor, ImportError> {
    let name = t.name.clone().unwrap_or_default();
    let err = |message: String| ImportError::Tensor { name: name.clone(), message };
    let code = t.data_type.unwrap_or(0);
    let dtype = match code {
        8 => return Err(err("string tensors are not supported".into())),
        14 | 15 => return Err(err("complex tensors are not supported".into())),
        c => DType::from_onnx_code(c as i64).ok_or_else(|| err(format!("unknown data type code {c}")))?,
    };
    if t.segment.is_some() {
        return Err(err("segmented tensors are not supported".into()));
    }
    let dims = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| err(format!("negative dimension {d}"))))
        .collect::<Result<Vec<_>, _>>()?;
    let shape = Shape::new(dims).map_err(|e| err(e.to_string()))?;
    let ty = TensorType::new(dtype, shape);
    let n = ty.shape.numel();
    let nbytes = ty.storage_bytes();
    let check = |got: usize, what: &str| {
        if got == nbytes {
            Ok(())
        } else {
            Err(err(format!("{ty} needs {nbytes} bytes of {what}, found {got}")))
        }
    };

    if t.data_location == Some(DataLocation::External as i32) {
        let mut location = None;
        let mut offset = 0usize;
        let mut length = None;
        for e in &t.external_data {
            let v = e.value.as_deref().unwrap_or("");
            let num = || {
                v.parse::<usize>().map_err(|_| {
                    err(format!("external data `{}` = `{v}` is not a number", e.key.as_deref().unwrap_or("")))
                })
            };
            match e.key.as_deref().unwrap_or("") {
                "location" => location = Some(v.to_string()),
                "offset" => offset = num()?,
                "length" => length = Some(num()?),
                _ => {}
            }
        }
        let location = location.ok_or_else(|| err("external data without a `location`".into()))?;
        let file = ext.read(&name, &location)?;
        let len = length.unwrap_or(nbytes);
        let end = offset.checked_add(len).filter(|&e| e <= file.len()).ok_or_else(|| {
            err(format!("external data range {offset}+{len} is past the end of `{location}` ({} bytes)", file.len()))
        })?;
        check(len, "external data")?;
        return Tensor::new(ty.clone(), file.slice(offset..end)).map_err(|e| err(e.to_string()));
    }

    if let Some(raw) = &t.raw_data {
        if !raw.is_empty() || n == 0 {
            check(raw.len(), "raw_data")?;
            return Tensor::new(ty.clone(), raw.clone()).map_err(|e| err(e.to_string()));
        }
    }

    // Typed fields.
    // Not preallocated: `nbytes` comes from the file's dims and is only trusted
    // once the data fields (already in memory) are found to match it.
    let mut out: Vec<u8> = Vec::new();
    let count_err =
        |got: usize, field: &str, want: usize| err(format!("{ty} needs {want} values in {field}, found {got}"));
    match dtype {
        DType::F32 => {
            if t.float_data.len() != n {
                return Err(count_err(t.float_data.len(), "float_data", n));
            }
            t.float_data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        DType::F64 => {
            if t.double_data.len() != n {
                return Err(count_err(t.double_data.len(), "double_data", n));
            }
            t.double_data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        DType::I64 => {
            if t.int64_data.len() != n {
                return Err(count_err(t.int64_data.len(), "int64_data", n));
            }
            t.int64_data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        }
        DType::U32 | DType::U64 => {
            if t.uint64_data.len() != n {
                return Err(count_err(t.uint64_data.len(), "uint64_data", n));
            }
            let w = dtype.bits() / 8;
            t.uint64_data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()[..w]));
        }
        _ if dtype.is_packed() => {
            // Two 4-bit elements per int32 value (its low byte).
            let want = n.div_ceil(2);
            if t.int32_data.len() != want {
                return Err(count_err(t.int32_data.len(), "int32_data", want));
            }
            t.int32_data.iter().for_each(|&x| out.push(x as u8));
        }
        _ => {
            // One element per int32 value: ints, bool, and the bit patterns of
            // f16/bf16 and the 8-bit float types.
            if t.int32_data.len() != n {
                return Err(count_err(t.int32_data.len(), "int32_data", n));
            }
            let w = dtype.bits().div_ceil(8);
            t.int32_data.iter().for_each(|x| out.extend_from_slice(&x.to_le_bytes()[..w]));
        }
    }
    check(out.len(), "data")?;
    Tensor::new(ty, Bytes::from(out)).map_err(|e| err(e.to_string()))
}
