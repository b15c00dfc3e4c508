//! `Scan`, unrolled at import like `Loop` with a constant trip count.
//!
//! The trip count is the length of the scan inputs along their scan axes, known
//! from their shapes at compile time. Each trip inlines the body (its own scope;
//! nested `If`, `Loop` and `Scan` import as anywhere else) with the state
//! variables in fixed slots and, per scan input, the slice of this trip (a
//! `Gather` of one constant index, from the end for direction 1). The scan outputs
//! are the trips' results stacked along their scan axes (`Unsqueeze` + `Concat`,
//! in reverse trip order for direction 1).
//!
//! Opset 8's form has a batch axis in front of every state and scan input and an
//! optional `sequence_lens`: each batch row is scanned on its own and the results
//! stacked; `sequence_lens` must be absent or a constant equal to the scan length.

use super::seq::{norm_axis, Val};
use super::{At, Importer, NodeCx};
use crate::ImportError;
use kiln_ir::{Attr, Attrs, OpKind, Shape, Tensor, ValueId};

use super::proto::GraphProto;

fn ints(attrs: &Attrs, name: &str, n: usize, at: &At) -> Result<Vec<i64>, ImportError> {
    match attrs.get(name) {
        None => Ok(vec![0; n]),
        Some(Attr::Ints(v)) if v.len() == n => Ok(v.clone()),
        Some(Attr::Ints(v)) => Err(at.err(format!("attribute `{name}` has {} entries, expected {n}", v.len()))),
        Some(other) => Err(at.err(format!("attribute `{name}` must be a list of ints, it is {other:?}"))),
    }
}

/// A `Scan` node's results (see the module docs).
pub(crate) fn import(imp: &mut Importer, node: &NodeCx, operands: &[Option<Val>]) -> Result<Vec<Val>, ImportError> {
    let NodeCx { label, attrs, outputs, subgraphs, at, .. } = *node;
    let body = *subgraphs.get("body").ok_or_else(|| at.err("attribute `body` is missing"))?;
    let m = match attrs.get("num_scan_inputs") {
        Some(Attr::Int(m)) if *m >= 1 => *m as usize,
        Some(Attr::Int(m)) => {
            return Err(at.err(format!("num_scan_inputs is {m}; a Scan needs at least one scan input")))
        }
        _ => return Err(at.err("attribute `num_scan_inputs` is missing")),
    };
    let legacy = imp.opset < 9;
    let first = usize::from(legacy);
    let mut vals: Vec<ValueId> = Vec::with_capacity(operands.len());
    for (k, o) in operands.iter().enumerate().skip(first) {
        match o {
            Some(Val::T(v)) => vals.push(*v),
            Some(other) => return Err(at.err(format!("operand {k} must be a tensor, it is {}", other.describe()))),
            None => return Err(at.err(format!("operand {k} is missing"))),
        }
    }
    if vals.len() < m {
        return Err(at.err(format!("num_scan_inputs is {m}, the node has {} operands after the options", vals.len())));
    }
    let n = vals.len() - m;
    if body.input.len() != n + m {
        return Err(at.err(format!(
            "the body takes {} inputs; the Scan passes {n} states and {m} scan inputs",
            body.input.len()
        )));
    }
    if body.output.len() < n {
        return Err(at.err(format!("the body gives {} outputs; it needs {n} states", body.output.len())));
    }
    let k = body.output.len() - n;
    let (states, scans) = vals.split_at(n);
    let results = if !legacy {
        let spec = Spec {
            in_dirs: ints(attrs, "scan_input_directions", m, at)?,
            in_axes: ints(attrs, "scan_input_axes", m, at)?,
            out_dirs: ints(attrs, "scan_output_directions", k, at)?,
            out_axes: ints(attrs, "scan_output_axes", k, at)?,
        };
        let (s, o) = scan(imp, label, body, states, scans, &spec, at)?;
        s.into_iter().chain(o).collect::<Vec<_>>()
    } else {
        // Axes within one batch row (see `legacy_scan`).
        let spec = Spec {
            in_dirs: ints(attrs, "directions", m, at)?,
            in_axes: vec![0; m],
            out_dirs: vec![0; k],
            out_axes: vec![0; k],
        };
        legacy_scan(imp, label, body, operands.first().cloned().flatten(), states, scans, spec, at)?
    };
    if results.len() < outputs.len() {
        return Err(at.err(format!("the Scan has {} outputs, its body gives {}", outputs.len(), results.len())));
    }
    Ok(results.into_iter().map(Val::T).collect())
}

/// Directions (0 forward, 1 backward) and axes of the scan inputs and outputs.
struct Spec {
    in_dirs: Vec<i64>,
    in_axes: Vec<i64>,
    out_dirs: Vec<i64>,
    out_axes: Vec<i64>,
}

fn one(v: Vec<ValueId>, what: &str, at: &At) -> Result<ValueId, ImportError> {
    v.first().copied().ok_or_else(|| at.err(format!("internal: {what} gave no result")))
}

fn scalar_index(imp: &mut Importer, i: usize) -> ValueId {
    imp.add_const("", Tensor::scalar(i as i64))
}

fn axes_const(imp: &mut Importer, axis: usize, at: &At) -> Result<ValueId, ImportError> {
    let t = Tensor::from_vec(Shape::new([1]).map_err(|e| at.err(e.to_string()))?, vec![axis as i64])
        .map_err(|e| at.err(e.to_string()))?;
    Ok(imp.add_const("", t))
}

/// `x` at index `i` of `axis` (the axis removed).
fn take(imp: &mut Importer, label: &str, x: ValueId, axis: usize, i: usize, at: &At) -> Result<ValueId, ImportError> {
    let idx = scalar_index(imp, i);
    let a = Attrs::new().with("axis", Attr::Int(axis as i64));
    one(imp.emit(label, OpKind::Gather, a, vec![Some(x), Some(idx)], &[String::new()], at)?, "Gather", at)
}

/// `parts` stacked along a new `axis`.
fn stack(imp: &mut Importer, label: &str, parts: &[ValueId], axis: usize, at: &At) -> Result<ValueId, ImportError> {
    let axes = axes_const(imp, axis, at)?;
    let mut rows = Vec::with_capacity(parts.len());
    for &p in parts {
        rows.push(Some(one(
            imp.emit(label, OpKind::Unsqueeze, Attrs::new(), vec![Some(p), Some(axes)], &[String::new()], at)?,
            "Unsqueeze",
            at,
        )?));
    }
    let a = Attrs::new().with("axis", Attr::Int(axis as i64));
    one(imp.emit(label, OpKind::Concat, a, rows, &[String::new()], at)?, "Concat", at)
}

/// The opset-9+ scan: final states and scan outputs.
fn scan(
    imp: &mut Importer,
    label: &str,
    body: &GraphProto,
    states: &[ValueId],
    scans: &[ValueId],
    spec: &Spec,
    at: &At,
) -> Result<(Vec<ValueId>, Vec<ValueId>), ImportError> {
    let mut axes = Vec::with_capacity(scans.len());
    let mut trips: Option<usize> = None;
    for (j, &x) in scans.iter().enumerate() {
        let dims = imp.g.ty(x).shape.dims().to_vec();
        let a = norm_axis(spec.in_axes[j], dims.len(), at)?;
        let t = dims[a];
        match trips {
            Some(t0) if t0 != t => {
                return Err(
                    at.err(format!("scan input {j} has {t} entries along its scan axis {a}, scan input 0 has {t0}"))
                )
            }
            _ => trips = Some(t),
        }
        axes.push(a);
    }
    let trips = trips.unwrap_or(0);
    if trips == 0 {
        return Err(
            at.err("unsupported: a Scan of zero trips (its scan outputs would be empty tensors of unknown shape)")
        );
    }
    let mut cur: Vec<ValueId> = states.to_vec();
    let mut parts: Vec<Vec<ValueId>> = vec![Vec::with_capacity(trips); spec.out_dirs.len()];
    for t in 0..trips {
        let tag = format!("{label}#{t}");
        let mut args: Vec<Val> = cur.iter().map(|&v| Val::T(v)).collect();
        for (j, &x) in scans.iter().enumerate() {
            let i = if spec.in_dirs[j] == 1 { trips - 1 - t } else { t };
            args.push(Val::T(take(imp, &tag, x, axes[j], i, at)?));
        }
        let outs = imp.inline_graph(body, args, at)?;
        let mut it = outs.iter().enumerate();
        for s in cur.iter_mut() {
            let Some((o, v)) = it.next() else { break };
            *s = v
                .tensor()
                .ok_or_else(|| at.err(format!("body output {o} (a state) must be a tensor, it is {}", v.describe())))?;
        }
        for p in parts.iter_mut() {
            let Some((o, v)) = it.next() else { break };
            p.push(v.tensor().ok_or_else(|| {
                at.err(format!("body output {o} (a scan output) must be a tensor, it is {}", v.describe()))
            })?);
        }
    }
    let mut outs = Vec::with_capacity(parts.len());
    for (k, mut p) in parts.into_iter().enumerate() {
        if spec.out_dirs[k] == 1 {
            p.reverse();
        }
        let rank = imp.g.ty(p[0]).shape.rank();
        let a = norm_axis(spec.out_axes[k], rank + 1, at)?;
        outs.push(stack(imp, label, &p, a, at)?);
    }
    Ok((cur, outs))
}

/// Opset 8's batched scan: one scan per batch row, results stacked on axis 0.
#[allow(clippy::too_many_arguments)]
fn legacy_scan(
    imp: &mut Importer,
    label: &str,
    body: &GraphProto,
    sequence_lens: Option<Val>,
    states: &[ValueId],
    scans: &[ValueId],
    spec: Spec,
    at: &At,
) -> Result<Vec<ValueId>, ImportError> {
    let batch = imp.g.ty(scans[0]).shape.dims().first().copied().unwrap_or(0);
    let seq_len = imp.g.ty(scans[0]).shape.dims().get(1).copied().unwrap_or(0);
    if batch == 0 {
        return Err(
            at.err("unsupported: a Scan over an empty batch (its outputs would be empty tensors of unknown shape)")
        );
    }
    if let Some(sl) = sequence_lens {
        let t = sl.tensor().and_then(|v| imp.g.constant(v).cloned());
        let Some(t) = t else {
            return Err(at.err("unsupported: `sequence_lens` depends on run-time data; a static plan needs every row's length at compile time"));
        };
        if t.to_f64_vec().iter().any(|&l| l as usize != seq_len) {
            return Err(at.err(format!(
                "unsupported: `sequence_lens` {:?} shorter than the scan axis ({seq_len})",
                t.to_f64_vec()
            )));
        }
    }
    for &x in states.iter().chain(scans) {
        if imp.g.ty(x).shape.dims().first().copied() != Some(batch) {
            return Err(
                at.err(format!("every state and scan input needs batch axis {batch} first, one is {}", imp.g.ty(x)))
            );
        }
    }
    let mut rows: Vec<Vec<ValueId>> = Vec::with_capacity(batch);
    for b in 0..batch {
        let s: Vec<ValueId> = states.iter().map(|&x| take(imp, label, x, 0, b, at)).collect::<Result<_, _>>()?;
        let x: Vec<ValueId> = scans.iter().map(|&x| take(imp, label, x, 0, b, at)).collect::<Result<_, _>>()?;
        let (fs, so) = scan(imp, label, body, &s, &x, &spec, at)?;
        rows.push(fs.into_iter().chain(so).collect());
    }
    let n_out = rows.first().map_or(0, Vec::len);
    (0..n_out)
        .map(|k| {
            let parts: Vec<ValueId> = rows.iter().map(|r| r[k]).collect();
            stack(imp, label, &parts, 0, at)
        })
        .collect()
}
