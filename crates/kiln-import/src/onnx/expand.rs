//! Operators ONNX defines as functions of other operators, imported as those
//! operators (so every later stage sees only canonical ops and fuses them as usual):
//!
//! - `NegativeLogLikelihoodLoss(input [N, C, d…], target [N, d…], weight [C]?)`:
//!   `loss[n, d…] = −input[n, target[n, d…], d…] · weight[target[n, d…]]`, 0 where
//!   `target == ignore_index`; `reduction` `none` keeps `[N, d…]`, `sum` adds it all,
//!   `mean` divides that sum by the sum of the weights taken (the count of targets not
//!   ignored when there is no weight).
//! - `SoftmaxCrossEntropyLoss(scores, labels, weights?)`: the above on
//!   `LogSoftmax(scores, axis = 1)`, whose value is the optional second output.
//!
//! - `HannWindow`, `HammingWindow`, `BlackmanWindow(size)`: constants, computed here
//!   from the (constant) size in f64 and rounded once to `output_datatype`:
//!   `a0 − a1·cos(2πn/N) + a2·cos(4πn/N)` with N = size (periodic) or size − 1.
//!
//! - `CenterCropPad(input, shape)`: a Slice of the centre of every axis longer than the
//!   (constant) target size, then a zero Pad of every shorter one, split in two with
//!   the smaller half first.
//!
//! - `AffineGrid(theta [N, r, r+1], size)`: the constant grid of normalised output
//!   coordinates `[(x, y[, z]), 1]` (per `align_corners`) times θᵀ: a MatMul with a
//!   Transpose, reshaped to `[N, (D,) H, W, r]`.
//!
//! A target equal to `ignore_index` reads class 0 (any valid index would do) and gets
//! weight 0, as the ONNX function bodies do.

use super::{At, Importer, NodeCx};
use crate::ImportError;
use kiln_ir::{Attr, Attrs, OpKind, Shape, Tensor, ValueId};

/// The most elements an expansion computes as a constant (a hostile size must not make
/// import allocate without bound).
const MAX_CONST_ELEMENTS: usize = 1 << 22;

/// Whether `op_type` is expanded here.
pub(crate) fn is_expanded(op_type: &str) -> bool {
    matches!(
        op_type,
        "NegativeLogLikelihoodLoss"
            | "SoftmaxCrossEntropyLoss"
            | "HannWindow"
            | "HammingWindow"
            | "BlackmanWindow"
            | "CenterCropPad"
            | "AffineGrid"
    )
}

/// Imports one node of an expanded op; binds its outputs.
pub(crate) fn expand(imp: &mut Importer, node: &NodeCx, inputs: &[Option<ValueId>]) -> Result<(), ImportError> {
    let NodeCx { op_type, attrs, outputs, at, .. } = *node;
    let operand =
        |i: usize, what: &str| inputs.get(i).copied().flatten().ok_or_else(|| at.err(format!("{what} is missing")));
    if op_type.ends_with("Window") || op_type == "CenterCropPad" || op_type == "AffineGrid" {
        let v = if op_type == "AffineGrid" {
            affine_grid(imp, attrs, operand(0, "theta")?, operand(1, "size")?, at)?
        } else if op_type == "CenterCropPad" {
            center_crop_pad(imp, attrs, operand(0, "input")?, operand(1, "shape")?, at)?
        } else {
            window(imp, op_type, attrs, operand(0, "size")?, at)?
        };
        let name = outputs.first().cloned().unwrap_or_default();
        if !name.is_empty() {
            imp.bind(&name, v);
        }
        return Ok(());
    }
    let x = operand(0, "operand 0")?;
    let target = operand(1, "operand 1")?;
    let weight = inputs.get(2).copied().flatten();
    let reduction = match attrs.get("reduction") {
        None => "mean".to_string(),
        Some(Attr::String(s)) if ["none", "sum", "mean"].contains(&s.as_str()) => s.clone(),
        Some(other) => return Err(at.err(format!("reduction {other:?}: expected none, sum or mean"))),
    };
    let ignore = match attrs.get("ignore_index") {
        None => None,
        Some(Attr::Int(i)) => Some(*i),
        Some(other) => return Err(at.err(format!("ignore_index {other:?}: expected an integer"))),
    };
    let out = |k: usize| outputs.get(k).cloned().unwrap_or_default();
    let log_prob = if op_type == "SoftmaxCrossEntropyLoss" {
        let lp =
            emit1(imp, OpKind::LogSoftmax, Attrs::default().with("axis", Attr::Int(1)), vec![Some(x)], &out(1), at)?;
        if outputs.len() > 1 && !outputs[1].is_empty() {
            imp.bind(&outputs[1], lp);
        }
        lp
    } else {
        x
    };
    let loss = nll(imp, log_prob, target, weight, &reduction, ignore, &out(0), at)?;
    if !out(0).is_empty() {
        imp.bind(&out(0), loss);
    }
    Ok(())
}

fn emit1(
    imp: &mut Importer,
    kind: OpKind,
    attrs: Attrs,
    inputs: Vec<Option<ValueId>>,
    name: &str,
    at: &At,
) -> Result<ValueId, ImportError> {
    let v = imp.emit("", kind, attrs, inputs, &[name.to_string()], at)?;
    v.first().copied().ok_or_else(|| at.err("no result"))
}

fn scalar(imp: &mut Importer, like: ValueId, x: f64, at: &At) -> Result<ValueId, ImportError> {
    let d = imp.g.ty(like).dtype;
    let t = Tensor::from_f64(d, Shape::scalar(), &[x]).map_err(|e| at.err(e.to_string()))?;
    Ok(imp.add_const("", t))
}

fn axes_const(imp: &mut Importer, a: &[i64], at: &At) -> Result<ValueId, ImportError> {
    let t = Tensor::from_vec(Shape::new([a.len()]).map_err(|e| at.err(e.to_string()))?, a.to_vec())
        .map_err(|e| at.err(e.to_string()))?;
    Ok(imp.add_const("", t))
}

#[allow(clippy::too_many_arguments)]
fn nll(
    imp: &mut Importer,
    x: ValueId,
    target: ValueId,
    weight: Option<ValueId>,
    reduction: &str,
    ignore: Option<i64>,
    name: &str,
    at: &At,
) -> Result<ValueId, ImportError> {
    let none = Attrs::default;
    // Ignored targets read class 0 and weigh 0.
    let (index, mask) = match ignore {
        Some(i) => {
            let iv = scalar(imp, target, i as f64, at)?;
            let mask = emit1(imp, OpKind::Equal, none(), vec![Some(target), Some(iv)], "", at)?;
            let zero = scalar(imp, target, 0.0, at)?;
            let index = emit1(imp, OpKind::Where, none(), vec![Some(mask), Some(zero), Some(target)], "", at)?;
            (index, Some(mask))
        }
        None => (target, None),
    };
    let one_axis = axes_const(imp, &[1], at)?;
    let idx = emit1(imp, OpKind::Unsqueeze, none(), vec![Some(index), Some(one_axis)], "", at)?;
    let picked =
        emit1(imp, OpKind::GatherElements, none().with("axis", Attr::Int(1)), vec![Some(x), Some(idx)], "", at)?;
    let one_axis = axes_const(imp, &[1], at)?;
    let picked = emit1(imp, OpKind::Squeeze, none(), vec![Some(picked), Some(one_axis)], "", at)?;
    // The weight of each element: weight[target], 0 where ignored.
    let w = match weight {
        Some(w) => {
            Some(emit1(imp, OpKind::Gather, none().with("axis", Attr::Int(0)), vec![Some(w), Some(index)], "", at)?)
        }
        None => None,
    };
    let w = match (w, mask) {
        (Some(w), Some(m)) => {
            let zero = scalar(imp, x, 0.0, at)?;
            Some(emit1(imp, OpKind::Where, none(), vec![Some(m), Some(zero), Some(w)], "", at)?)
        }
        (None, Some(m)) => {
            let (zero, one) = (scalar(imp, x, 0.0, at)?, scalar(imp, x, 1.0, at)?);
            Some(emit1(imp, OpKind::Where, none(), vec![Some(m), Some(zero), Some(one)], "", at)?)
        }
        (w, None) => w,
    };
    let last = |r: &str| if r == reduction { name } else { "" };
    let neg = emit1(imp, OpKind::Neg, none(), vec![Some(picked)], if w.is_none() { last("none") } else { "" }, at)?;
    let loss = match w {
        Some(w) => emit1(imp, OpKind::Mul, none(), vec![Some(neg), Some(w)], last("none"), at)?,
        None => neg,
    };
    let all = none().with("keepdims", Attr::Int(0));
    Ok(match (reduction, w) {
        ("none", _) => loss,
        ("sum", _) => emit1(imp, OpKind::ReduceSum, all, vec![Some(loss)], name, at)?,
        (_, Some(w)) => {
            let s = emit1(imp, OpKind::ReduceSum, all.clone(), vec![Some(loss)], "", at)?;
            let ws = emit1(imp, OpKind::ReduceSum, all, vec![Some(w)], "", at)?;
            emit1(imp, OpKind::Div, none(), vec![Some(s), Some(ws)], name, at)?
        }
        (_, None) => emit1(imp, OpKind::ReduceMean, all, vec![Some(loss)], name, at)?,
    })
}

/// The integers of the constant operand `v` (`what` names it in the error when it is not a constant).
fn const_ints(imp: &Importer, v: ValueId, what: &str, at: &At) -> Result<Vec<i64>, ImportError> {
    let Some(t) = imp.g.constant(v) else {
        return Err(at.err(format!(
            "{what} must be a constant: `{}` depends on run-time data (bind it with --input-value)",
            imp.g.values[v].name
        )));
    };
    t.to_i64_vec().map_err(|e| at.err(e.to_string()))
}

/// A window function's values as a constant.
fn window(imp: &mut Importer, op_type: &str, attrs: &Attrs, size: ValueId, at: &At) -> Result<ValueId, ImportError> {
    let n = match const_ints(imp, size, "size (operand 0)", at)?.as_slice() {
        [n] if (0..=MAX_CONST_ELEMENTS as i64).contains(n) => *n as usize,
        other => return Err(at.err(format!("size {other:?}: expected one count of at most {MAX_CONST_ELEMENTS}"))),
    };
    let int = |name: &str, default: i64| match attrs.get(name) {
        Some(Attr::Int(v)) => *v,
        _ => default,
    };
    let dtype = kiln_ir::DType::from_onnx_code(int("output_datatype", 1))
        .ok_or_else(|| at.err(format!("output_datatype {} is not a known type", int("output_datatype", 1))))?;
    let (a0, a1, a2) = match op_type {
        "HannWindow" => (0.5, 0.5, 0.0),
        "HammingWindow" => (25.0 / 46.0, 21.0 / 46.0, 0.0),
        _ => (0.42, 0.5, 0.08),
    };
    let period = if int("periodic", 1) != 0 { n as f64 } else { n.saturating_sub(1) as f64 };
    let tau = 2.0 * std::f64::consts::PI;
    let v: Vec<f64> = (0..n)
        .map(|i| {
            let x = i as f64 / period;
            a0 - a1 * (tau * x).cos() + a2 * (2.0 * tau * x).cos()
        })
        .collect();
    let t = Tensor::from_f64(dtype, Shape::new([n]).map_err(|e| at.err(e.to_string()))?, &v)
        .map_err(|e| at.err(e.to_string()))?;
    Ok(imp.add_const("", t))
}

/// `CenterCropPad` as Slice and Pad (see the module docs).
fn center_crop_pad(
    imp: &mut Importer,
    attrs: &Attrs,
    x: ValueId,
    shape: ValueId,
    at: &At,
) -> Result<ValueId, ImportError> {
    let sizes = const_ints(imp, shape, "shape (operand 1)", at)?;
    let dims: Vec<i64> = imp.g.ty(x).shape.dims().iter().map(|&d| d as i64).collect();
    let rank = dims.len() as i64;
    let axes: Vec<i64> = match attrs.get("axes") {
        Some(Attr::Ints(a)) => a.clone(),
        None => (0..rank).collect(),
        Some(other) => return Err(at.err(format!("axes {other:?}: expected integers"))),
    };
    if axes.len() != sizes.len() {
        return Err(at.err(format!("{} axes but {} sizes", axes.len(), sizes.len())));
    }
    let (mut starts, mut ends, mut slice_axes) = (Vec::new(), Vec::new(), Vec::new());
    let mut pads = vec![0i64; 2 * dims.len()];
    for (&a, &s) in axes.iter().zip(&sizes) {
        let a = if a < 0 { a + rank } else { a };
        if !(0..rank).contains(&a) || s < 0 {
            return Err(at.err(format!("axis {a} / size {s} out of range for rank {rank}")));
        }
        let d = dims[a as usize];
        if d > s {
            let start = (d - s) / 2;
            starts.push(start);
            ends.push(start + s);
            slice_axes.push(a);
        } else if d < s {
            let before = (s - d) / 2;
            pads[a as usize] = before;
            pads[a as usize + dims.len()] = s - d - before;
        }
    }
    let mut v = x;
    if !slice_axes.is_empty() {
        let (st, en, ax) =
            (axes_const(imp, &starts, at)?, axes_const(imp, &ends, at)?, axes_const(imp, &slice_axes, at)?);
        v = emit1(imp, OpKind::Slice, Attrs::default(), vec![Some(v), Some(st), Some(en), Some(ax)], "", at)?;
    }
    if pads.iter().any(|&p| p != 0) {
        let p = axes_const(imp, &pads, at)?;
        v = emit1(imp, OpKind::Pad, Attrs::default(), vec![Some(v), Some(p)], "", at)?;
    }
    Ok(v)
}

/// `AffineGrid` as a constant base grid times θᵀ (see the module docs).
fn affine_grid(
    imp: &mut Importer,
    attrs: &Attrs,
    theta: ValueId,
    size: ValueId,
    at: &At,
) -> Result<ValueId, ImportError> {
    let size = const_ints(imp, size, "size (operand 1)", at)?;
    let r = match size.len() {
        4 => 2,
        5 => 3,
        n => return Err(at.err(format!("size has {n} elements; expected 4 (2-D) or 5 (3-D)"))),
    };
    let spatial: Vec<usize> = size[2..].iter().map(|&d| usize::try_from(d).unwrap_or(0)).collect();
    let n = usize::try_from(size[0]).map_err(|_| at.err("negative batch size"))?;
    let count = spatial.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX);
    if count == 0 || count > MAX_CONST_ELEMENTS / (r + 1) || spatial.len() != r {
        return Err(at.err(format!(
            "size {size:?}: expected positive extents of at most {} points",
            MAX_CONST_ELEMENTS / (r + 1)
        )));
    }
    let align = matches!(attrs.get("align_corners"), Some(Attr::Int(v)) if *v != 0);
    let coord = |i: usize, len: usize| -> f64 {
        if align {
            if len > 1 {
                -1.0 + 2.0 * i as f64 / (len - 1) as f64
            } else {
                0.0
            }
        } else {
            (2.0 * i as f64 + 1.0) / len as f64 - 1.0
        }
    };
    // Rows in output order; columns x (last axis), y, (z), 1.
    let mut base = Vec::with_capacity(count * (r + 1));
    for flat in 0..count {
        let mut rem = flat;
        let mut idx = vec![0usize; r];
        for d in (0..r).rev() {
            idx[d] = rem % spatial[d];
            rem /= spatial[d];
        }
        for d in (0..r).rev() {
            base.push(coord(idx[d], spatial[d]));
        }
        base.push(1.0);
    }
    let dtype = imp.g.ty(theta).dtype;
    let bt = Tensor::from_f64(dtype, Shape::new([1, count, r + 1]).map_err(|e| at.err(e.to_string()))?, &base)
        .map_err(|e| at.err(e.to_string()))?;
    let base = imp.add_const("", bt);
    let perm = Attrs::default().with("perm", Attr::Ints(vec![0, 2, 1]));
    let tt = emit1(imp, OpKind::Transpose, perm, vec![Some(theta)], "", at)?;
    let g = emit1(imp, OpKind::MatMul, Attrs::default(), vec![Some(base), Some(tt)], "", at)?;
    let mut dims = vec![n as i64];
    dims.extend(spatial.iter().map(|&d| d as i64));
    dims.push(r as i64);
    let shape = axes_const(imp, &dims, at)?;
    emit1(imp, OpKind::Reshape, Attrs::default(), vec![Some(g), Some(shape)], "", at)
}
