//! Translation of an ONNX node from the model's opset into kiln's canonical form
//! (opset-22 semantics, see `kiln_ir::op`): operands that older opsets carried as
//! attributes become constant inputs, renamed and retired ops map to their
//! successors, and semantics that changed (2-D coercion of Softmax before opset 13,
//! legacy `broadcast`/`axis` of binary ops before opset 7) are rewritten.

use super::{At, Importer};
use crate::ImportError;
use kiln_ir::{Attr, Attrs, DType, OpKind, Shape, Tensor, ValueId};

/// A node in canonical form, ready for [`Importer::emit`].
pub(crate) struct Canon {
    pub kind: OpKind,
    pub attrs: Attrs,
    pub inputs: Vec<Option<ValueId>>,
}

const REDUCE_18: &[&str] = &[
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSumSquare",
];

const LEGACY_BROADCAST: &[&str] = &["Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"];

pub(crate) fn canonicalize(
    imp: &mut Importer,
    op_type: &str,
    mut attrs: Attrs,
    mut inputs: Vec<Option<ValueId>>,
    num_outputs: usize,
    total_outputs: usize,
    at: &At,
) -> Result<Canon, ImportError> {
    let v = imp.opset;
    let mut kind_name = op_type;
    match op_type {
        "ReduceSum" if v < 13 => ints_attr_to_input(imp, &mut attrs, &mut inputs, "axes", 1)?,
        r if v < 18 && REDUCE_18.contains(&r) => ints_attr_to_input(imp, &mut attrs, &mut inputs, "axes", 1)?,
        "Squeeze" | "Unsqueeze" if v < 13 => ints_attr_to_input(imp, &mut attrs, &mut inputs, "axes", 1)?,
        "Split" if v < 13 => ints_attr_to_input(imp, &mut attrs, &mut inputs, "split", 1)?,
        _ => {}
    }
    if op_type == "Split" && inputs.get(1).copied().flatten().is_none() && attrs.get("num_outputs").is_none() {
        // Without `split`, the parts are as many as the node's outputs — all of them,
        // including unused ones the importer does not materialise.
        attrs.set("num_outputs", Attr::Int(total_outputs as i64));
    }
    match op_type {
        "Slice" if v < 10 => {
            ints_attr_to_input(imp, &mut attrs, &mut inputs, "starts", 1)?;
            ints_attr_to_input(imp, &mut attrs, &mut inputs, "ends", 2)?;
            ints_attr_to_input(imp, &mut attrs, &mut inputs, "axes", 3)?;
        }
        "Reshape" if v < 5 => ints_attr_to_input(imp, &mut attrs, &mut inputs, "shape", 1)?,
        "TopK" if v < 10 => {
            let k = take_int(&mut attrs, "k", at)?.ok_or_else(|| at.err("attribute `k` is missing"))?;
            let c = imp.add_const("", tensor_i64(&[k], true)?);
            set_input(&mut inputs, 1, c);
        }
        "Clip" if v < 11 => {
            let dtype = operand_dtype(imp, &inputs, 0, at)?;
            for (i, name) in [(1, "min"), (2, "max")] {
                if let Some(x) = take_float(&mut attrs, name, at)? {
                    let t = Tensor::from_f64(dtype, Shape::scalar(), &[x as f64]).map_err(|e| at.err(e.to_string()))?;
                    let c = imp.add_const("", t);
                    set_input(&mut inputs, i, c);
                }
            }
        }
        "Pad" if v < 11 => {
            let pads = match attrs.remove("pads").or_else(|| attrs.remove("paddings")) {
                Some(Attr::Ints(p)) => p,
                _ => return Err(at.err("attribute `pads` is missing")),
            };
            let c = imp.add_const("", tensor_i64(&pads, false)?);
            set_input(&mut inputs, 1, c);
            let value = take_float(&mut attrs, "value", at)?.unwrap_or(0.0);
            let dtype = operand_dtype(imp, &inputs, 0, at)?;
            let t = Tensor::from_f64(dtype, Shape::scalar(), &[value as f64]).map_err(|e| at.err(e.to_string()))?;
            let c = imp.add_const("", t);
            set_input(&mut inputs, 2, c);
        }
        "Upsample" | "Resize" if op_type == "Upsample" || v < 11 => {
            // Upsample (7, 9) and Resize-10 are Resize with asymmetric coordinates.
            let scales = if op_type == "Upsample" && v < 9 {
                let s = match attrs.remove("scales") {
                    Some(Attr::Floats(s)) => s,
                    _ => return Err(at.err("attribute `scales` is missing")),
                };
                let t = Tensor::from_vec(Shape::new([s.len()]).map_err(|e| at.err(e.to_string()))?, s)
                    .map_err(|e| at.err(e.to_string()))?;
                Some(imp.add_const("", t))
            } else {
                inputs.get(1).copied().flatten()
            };
            let mode = match attrs.remove("mode") {
                Some(Attr::String(m)) if m == "bilinear" || m == "linear" => "linear",
                Some(Attr::String(m)) if m == "nearest" => "nearest",
                None => "nearest",
                Some(other) => return Err(at.err(format!("unsupported mode {other:?}"))),
            };
            attrs = Attrs::default()
                .with("mode", Attr::String(mode.into()))
                .with("coordinate_transformation_mode", Attr::String("asymmetric".into()));
            if mode == "nearest" {
                attrs.set("nearest_mode", Attr::String("floor".into()));
            }
            inputs = vec![inputs.first().copied().flatten(), None, scales];
            kind_name = "Resize";
        }
        "Resize" => {
            // roi / scales given as empty tensors mean "absent".
            for i in [1, 2, 3] {
                if let Some(Some(x)) = inputs.get(i) {
                    if imp.g.ty(*x).shape.numel() == 0 {
                        inputs[i] = None;
                    }
                }
            }
        }
        "Scatter" => kind_name = "ScatterElements",
        "GridSample" => {
            // Opset 16 spelled the modes `bilinear` and `bicubic`.
            let renamed = match attrs.get("mode") {
                Some(Attr::String(m)) if m == "bilinear" => Some("linear"),
                Some(Attr::String(m)) if m == "bicubic" => Some("cubic"),
                _ => None,
            };
            if let Some(m) = renamed {
                attrs.set("mode", Attr::String(m.to_string()));
            }
        }
        "Dropout" => {
            for a in ["ratio", "is_test", "consumed_inputs", "seed"] {
                attrs.remove(a);
            }
            if v < 10 && num_outputs > 1 {
                // The mask had the input's type before opset 10 (bool since).
                return Err(at.err("the mask output of Dropout before opset 10 is not supported"));
            }
        }
        "BatchNormalization" => {
            if take_int(&mut attrs, "training_mode", at)?.unwrap_or(0) != 0 || num_outputs > 1 {
                return Err(at.err("training mode (running statistics outputs) is not supported"));
            }
            if take_int(&mut attrs, "spatial", at)?.unwrap_or(1) == 0 {
                return Err(at.err("spatial=0 (per-activation statistics) is not supported"));
            }
            for a in ["is_test", "consumed_inputs", "momentum"] {
                attrs.remove(a);
            }
        }
        "Gemm" => {
            attrs.remove("broadcast");
        }
        "Cast" => {
            if let Some(Attr::String(s)) = attrs.get("to").cloned() {
                let d = onnx_type_name(&s).ok_or_else(|| at.err(format!("unknown type `{s}` in `to`")))?;
                attrs.set("to", Attr::Int(d));
            }
        }
        "Concat" if v < 4 && attrs.get("axis").is_none() => attrs.set("axis", Attr::Int(1)),
        "Softmax" | "LogSoftmax" | "Hardmax" if v < 13 => {
            return coerce_2d(imp, op_type, attrs, inputs, at);
        }
        b if v < 7 && LEGACY_BROADCAST.contains(&b) => {
            let broadcast = take_int(&mut attrs, "broadcast", at)?.unwrap_or(0);
            let axis = take_int(&mut attrs, "axis", at)?;
            if broadcast != 0 {
                if let (Some(axis), Some(Some(a)), Some(Some(b))) = (axis, inputs.first(), inputs.get(1)) {
                    let ra = imp.g.ty(*a).shape.rank() as i64;
                    let bd: Vec<usize> = imp.g.ty(*b).shape.dims().to_vec();
                    let fits = |a: i64| (0..=ra).contains(&a).then(|| ra - a - bd.len() as i64).filter(|t| *t >= 0);
                    let normalised = if axis < 0 { axis.checked_add(ra) } else { Some(axis) };
                    let Some(trailing) = normalised.and_then(fits) else {
                        return Err(at.err(format!("legacy broadcast axis {axis} does not fit a rank-{ra} input")));
                    };
                    let mut nd: Vec<i64> = bd.iter().map(|&d| d as i64).collect();
                    nd.extend(std::iter::repeat_n(1, trailing as usize));
                    let shape = imp.add_const("", tensor_i64(&nd, false)?);
                    let r = imp.emit(
                        "",
                        OpKind::Reshape,
                        Attrs::default(),
                        vec![Some(*b), Some(shape)],
                        &[String::new()],
                        at,
                    )?;
                    inputs[1] = Some(r[0]);
                }
            }
        }
        _ => {}
    }
    let kind: OpKind = kind_name.parse().map_err(|_| at.err(format!("`{kind_name}` is not a supported operator")))?;
    Ok(Canon { kind, attrs, inputs })
}

/// Softmax-family ops before opset 13 flatten the input to 2-D at `axis` (default 1)
/// and normalise over the second dimension.
fn coerce_2d(
    imp: &mut Importer,
    op_type: &str,
    mut attrs: Attrs,
    inputs: Vec<Option<ValueId>>,
    at: &At,
) -> Result<Canon, ImportError> {
    let kind: OpKind = op_type.parse().map_err(|_| at.err("unknown op"))?;
    let x = inputs.first().copied().flatten().ok_or_else(|| at.err("input is missing"))?;
    let dims = imp.g.ty(x).shape.dims().to_vec();
    let rank = dims.len() as i64;
    let axis = take_int(&mut attrs, "axis", at)?.unwrap_or(1);
    let axis = if axis < 0 { axis + rank } else { axis };
    if !(0..rank).contains(&axis) {
        return Err(at.err(format!("axis {axis} out of range for rank {rank}")));
    }
    if axis == rank - 1 {
        return Ok(Canon { kind, attrs: Attrs::default().with("axis", Attr::Int(-1)), inputs: vec![Some(x)] });
    }
    let outer: usize = dims[..axis as usize].iter().product();
    let inner: usize = dims[axis as usize..].iter().product();
    let s2 = imp.add_const("", tensor_i64(&[outer as i64, inner as i64], false)?);
    let flat = imp.emit("", OpKind::Reshape, Attrs::default(), vec![Some(x), Some(s2)], &[String::new()], at)?;
    let y =
        imp.emit("", kind, Attrs::default().with("axis", Attr::Int(-1)), vec![Some(flat[0])], &[String::new()], at)?;
    let back: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
    let s = imp.add_const("", tensor_i64(&back, false)?);
    Ok(Canon { kind: OpKind::Reshape, attrs: Attrs::default(), inputs: vec![Some(y[0]), Some(s)] })
}

fn set_input(inputs: &mut Vec<Option<ValueId>>, i: usize, v: ValueId) {
    if inputs.len() <= i {
        inputs.resize(i + 1, None);
    }
    inputs[i] = Some(v);
}

/// Moves an ints attribute into input position `i` as a 1-D i64 constant.
fn ints_attr_to_input(
    imp: &mut Importer,
    attrs: &mut Attrs,
    inputs: &mut Vec<Option<ValueId>>,
    name: &str,
    i: usize,
) -> Result<(), ImportError> {
    match attrs.remove(name) {
        Some(Attr::Ints(v)) => {
            let c = imp.add_const("", tensor_i64(&v, false)?);
            set_input(inputs, i, c);
        }
        Some(Attr::Int(x)) => {
            let c = imp.add_const("", tensor_i64(&[x], false)?);
            set_input(inputs, i, c);
        }
        Some(_) | None => {}
    }
    Ok(())
}

fn tensor_i64(v: &[i64], _one: bool) -> Result<Tensor, ImportError> {
    Tensor::from_vec(Shape::new([v.len()]).map_err(|e| ImportError::Model(e.to_string()))?, v.to_vec())
        .map_err(|e| ImportError::Model(e.to_string()))
}

fn take_int(attrs: &mut Attrs, name: &str, at: &At) -> Result<Option<i64>, ImportError> {
    match attrs.remove(name) {
        None => Ok(None),
        Some(Attr::Int(x)) => Ok(Some(x)),
        Some(a) => Err(at.err(format!("attribute `{name}` should be an int, found {}", a.kind_name()))),
    }
}

fn take_float(attrs: &mut Attrs, name: &str, at: &At) -> Result<Option<f32>, ImportError> {
    match attrs.remove(name) {
        None => Ok(None),
        Some(Attr::Float(x)) => Ok(Some(x)),
        Some(Attr::Int(x)) => Ok(Some(x as f32)),
        Some(a) => Err(at.err(format!("attribute `{name}` should be a float, found {}", a.kind_name()))),
    }
}

fn operand_dtype(imp: &Importer, inputs: &[Option<ValueId>], i: usize, at: &At) -> Result<DType, ImportError> {
    inputs.get(i).copied().flatten().map(|v| imp.g.ty(v).dtype).ok_or_else(|| at.err(format!("input {i} is missing")))
}

/// ONNX type names used by Cast before opset 6.
fn onnx_type_name(s: &str) -> Option<i64> {
    Some(match s.to_ascii_uppercase().as_str() {
        "FLOAT" => 1,
        "UINT8" => 2,
        "INT8" => 3,
        "UINT16" => 4,
        "INT16" => 5,
        "INT32" => 6,
        "INT64" => 7,
        "BOOL" => 9,
        "FLOAT16" => 10,
        "DOUBLE" => 11,
        "UINT32" => 12,
        "UINT64" => 13,
        _ => return None,
    })
}
