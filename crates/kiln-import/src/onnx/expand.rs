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
//! A target equal to `ignore_index` reads class 0 (any valid index would do) and gets
//! weight 0, as the ONNX function bodies do.

use super::{At, Importer};
use crate::ImportError;
use kiln_ir::{Attr, Attrs, OpKind, Shape, Tensor, ValueId};

/// Whether `op_type` is expanded here.
pub(crate) fn is_expanded(op_type: &str) -> bool {
    matches!(op_type, "NegativeLogLikelihoodLoss" | "SoftmaxCrossEntropyLoss")
}

/// Imports one node of an expanded op; binds its outputs.
pub(crate) fn expand(
    imp: &mut Importer,
    op_type: &str,
    attrs: &Attrs,
    inputs: &[Option<ValueId>],
    outputs: &[String],
    at: &At,
) -> Result<(), ImportError> {
    let operand = |i: usize, what: &str| inputs.get(i).copied().flatten().ok_or_else(|| at.err(format!("{what} is missing")));
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
        let lp = emit1(imp, OpKind::LogSoftmax, Attrs::default().with("axis", Attr::Int(1)), vec![Some(x)], &out(1), at)?;
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

fn emit1(imp: &mut Importer, kind: OpKind, attrs: Attrs, inputs: Vec<Option<ValueId>>, name: &str, at: &At) -> Result<ValueId, ImportError> {
    let v = imp.emit("", kind, attrs, inputs, &[name.to_string()], at)?;
    v.first().copied().ok_or_else(|| at.err("no result"))
}

fn scalar(imp: &mut Importer, like: ValueId, x: f64, at: &At) -> Result<ValueId, ImportError> {
    let d = imp.g.ty(like).dtype;
    let t = Tensor::from_f64(d, Shape::scalar(), &[x]).map_err(|e| at.err(e.to_string()))?;
    Ok(imp.add_const("", t))
}

fn axes(imp: &mut Importer, a: &[i64], at: &At) -> Result<ValueId, ImportError> {
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
    let one_axis = axes(imp, &[1], at)?;
    let idx = emit1(imp, OpKind::Unsqueeze, none(), vec![Some(index), Some(one_axis)], "", at)?;
    let picked = emit1(imp, OpKind::GatherElements, none().with("axis", Attr::Int(1)), vec![Some(x), Some(idx)], "", at)?;
    let one_axis = axes(imp, &[1], at)?;
    let picked = emit1(imp, OpKind::Squeeze, none(), vec![Some(picked), Some(one_axis)], "", at)?;
    // The weight of each element: weight[target], 0 where ignored.
    let w = match weight {
        Some(w) => Some(emit1(imp, OpKind::Gather, none().with("axis", Attr::Int(0)), vec![Some(w), Some(index)], "", at)?),
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
