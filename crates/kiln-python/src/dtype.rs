//! The dtypes of a module's signature (ONNX `TensorProto.DataType` codes) as numpy
//! dtypes and as ONNX Runtime's type strings.

use numpy::{Element, PyArrayDescr};
use pyo3::prelude::*;

/// One dtype as Python sees it.
pub(crate) struct Dtype {
    /// numpy's name (`"float32"`), or for a dtype numpy lacks the usual name elsewhere
    /// (`"bfloat16"`, as ml_dtypes calls it).
    pub(crate) name: &'static str,
    /// ONNX Runtime's `NodeArg.type` (`"tensor(float)"`).
    pub(crate) ort: &'static str,
}

/// The dtype of ONNX code `code`.
pub(crate) fn of(code: u32) -> Dtype {
    let (name, ort) = match code {
        1 => ("float32", "tensor(float)"),
        2 => ("uint8", "tensor(uint8)"),
        3 => ("int8", "tensor(int8)"),
        4 => ("uint16", "tensor(uint16)"),
        5 => ("int16", "tensor(int16)"),
        6 => ("int32", "tensor(int32)"),
        7 => ("int64", "tensor(int64)"),
        9 => ("bool", "tensor(bool)"),
        10 => ("float16", "tensor(float16)"),
        11 => ("float64", "tensor(double)"),
        12 => ("uint32", "tensor(uint32)"),
        13 => ("uint64", "tensor(uint64)"),
        16 => ("bfloat16", "tensor(bfloat16)"),
        17 => ("float8_e4m3fn", "tensor(float8e4m3fn)"),
        18 => ("float8_e4m3fnuz", "tensor(float8e4m3fnuz)"),
        19 => ("float8_e5m2", "tensor(float8e5m2)"),
        20 => ("float8_e5m2fnuz", "tensor(float8e5m2fnuz)"),
        21 => ("uint4", "tensor(uint4)"),
        22 => ("int4", "tensor(int4)"),
        23 => ("float4_e2m1fn", "tensor(float4e2m1fn)"),
        24 => ("float8_e8m0fnu", "tensor(float8e8m0fnu)"),
        _ => ("unknown", "tensor(unknown)"),
    };
    Dtype { name, ort }
}

/// numpy's descriptor for ONNX code `code`, `None` where numpy has no such dtype (the
/// 4- and 8-bit floats, bfloat16, the 4-bit integers).
pub(crate) fn descr(py: Python<'_>, code: u32) -> Option<Bound<'_, PyArrayDescr>> {
    Some(match code {
        1 => f32::get_dtype(py),
        2 => u8::get_dtype(py),
        3 => i8::get_dtype(py),
        4 => u16::get_dtype(py),
        5 => i16::get_dtype(py),
        6 => i32::get_dtype(py),
        7 => i64::get_dtype(py),
        9 => bool::get_dtype(py),
        // numpy's `float16` ('e'), made from its name: the Rust side never touches the
        // elements, so no `half` dependency for it.
        10 => PyArrayDescr::new(py, "float16").ok()?,
        11 => f64::get_dtype(py),
        12 => u32::get_dtype(py),
        13 => u64::get_dtype(py),
        _ => return None,
    })
}
