//! QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear.

use super::ctx::{Class, Ctx, Dims, R};
use crate::attrs::{DequantizeAttrs, QuantizeAttrs};
use crate::dtype::DType;
use crate::shape::{Shape, TensorType};

/// Dtypes a quantized tensor may have.
fn is_quantized(d: DType) -> bool {
    matches!(d, DType::I8 | DType::U8 | DType::I16 | DType::U16 | DType::I4 | DType::U4) || d.is_low_precision_float()
}

/// Checks a scale's (or zero point's) shape against `x`: per tensor (one element),
/// per axis (1-D of x's extent along `axis`), or blocked (`block_size` > 0: x's
/// shape with ceil(extent / block_size) along `axis`).
fn check_scale_shape(cx: &Ctx, x: &TensorType, s: &TensorType, i: usize, what: &str) -> R<()> {
    let (axis, block) = match cx.op.kind {
        crate::op::OpKind::QuantizeLinear => {
            let a = cx.attrs::<QuantizeAttrs>()?;
            (a.axis, a.block_size)
        }
        _ => {
            let a = cx.attrs::<DequantizeAttrs>()?;
            (a.axis, a.block_size)
        }
    };
    let sd = s.shape.dims();
    if sd.is_empty() || (sd == [1] && block == 0) {
        return Ok(());
    }
    let xd = x.shape.dims();
    let axis = cx.axis(axis, xd.len(), "axis")?;
    let want: Vec<usize> = match block {
        0 => vec![xd[axis]],
        b if b > 0 => {
            let b = usize::try_from(b).unwrap_or(usize::MAX);
            let mut w = xd.to_vec();
            w[axis] = xd[axis].div_ceil(b);
            w
        }
        b => return Err(cx.invalid(format_args!("attribute `block_size` must be ≥ 0, got {b}"))),
    };
    if sd != want.as_slice() {
        return Err(
            cx.invalid(format_args!("`{what}` (input {i}) {s} must be a scalar or have shape {} for {x}", Dims(&want)))
        );
    }
    Ok(())
}

/// Checks that a zero point has its scale's shape (a one-element scale may have a
/// zero point of shape [] or [1]).
fn check_zero_point(cx: &Ctx, z: &TensorType, s: &TensorType, i: usize, what: &str) -> R<()> {
    let one = |t: &TensorType| t.shape.dims().is_empty() || t.shape.dims() == [1];
    if z.shape == s.shape || (one(z) && one(s)) {
        Ok(())
    } else {
        Err(cx.invalid(format_args!("`{what}` (input {i}) {z} must have the shape of the scale {s}")))
    }
}

/// QuantizeLinear(x, y_scale, y_zero_point?) → the zero point's dtype, else
/// `output_dtype`, else u8.
pub(super) fn quantize_linear(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req(0, "x")?;
    if !((x.dtype.is_float() && !x.dtype.is_low_precision_float()) || x.dtype == DType::I32) {
        return Err(cx.invalid(format_args!("`x` (input 0) must be a float or int32 tensor, got {x}")));
    }
    let s = cx.req(1, "y_scale")?;
    if !(s.dtype.is_float() || s.dtype == DType::I32) {
        return Err(cx.invalid(format_args!("`y_scale` (input 1) must be a float tensor, got {s}")));
    }
    check_scale_shape(cx, x, s, 1, "y_scale")?;
    // A non-zero code was checked when the op was built.
    let attr = DType::from_onnx_code(cx.attrs::<QuantizeAttrs>()?.output_dtype);
    let out = match cx.opt_ty(2) {
        Some(z) => {
            check_zero_point(cx, z, s, 2, "y_zero_point")?;
            if let Some(a) = attr.filter(|&a| a != z.dtype) {
                return Err(cx.invalid(format_args!(
                    "attribute `output_dtype` ({a}) differs from the dtype of `y_zero_point` {z}"
                )));
            }
            z.dtype
        }
        None => attr.unwrap_or(DType::U8),
    };
    if !is_quantized(out) {
        return Err(cx.invalid(format_args!("cannot quantize to {out}")));
    }
    Ok(vec![TensorType::new(out, x.shape.clone())])
}

/// DequantizeLinear(x, x_scale, x_zero_point?) → the scale's dtype.
pub(super) fn dequantize_linear(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req(0, "x")?;
    if !(is_quantized(x.dtype) || x.dtype == DType::I32) {
        return Err(cx.invalid(format_args!("`x` (input 0) must be a quantized tensor, got {x}")));
    }
    let s = cx.req_class(1, "x_scale", Class::Float)?;
    check_scale_shape(cx, x, s, 1, "x_scale")?;
    if let Some(z) = cx.opt_ty(2) {
        cx.same_dtype(z, 2, "x_zero_point", x)?;
        check_zero_point(cx, z, s, 2, "x_zero_point")?;
    }
    // `output_dtype` (opset 23), else the scale's dtype; a non-zero code was checked when
    // the op was built.
    let out = match DType::from_onnx_code(cx.attrs::<DequantizeAttrs>()?.output_dtype) {
        Some(d) if matches!(d, DType::F32 | DType::F16 | DType::BF16) => d,
        Some(d) => {
            return Err(cx.invalid(format_args!("`output_dtype` must be float, float16 or bfloat16, got {d}")));
        }
        None => s.dtype,
    };
    Ok(vec![TensorType::new(out, x.shape.clone())])
}

/// DynamicQuantizeLinear(x) → (y: u8, y_scale: f32 scalar, y_zero_point: u8 scalar).
pub(super) fn dynamic_quantize_linear(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "x", Class::Float)?;
    Ok(vec![
        TensorType::new(DType::U8, x.shape.clone()),
        TensorType::new(DType::F32, Shape::scalar()),
        TensorType::new(DType::U8, Shape::scalar()),
    ])
}
