//! Sequences and optionals, resolved at import time.
//!
//! A static plan has no run-time lists, so the importer keeps them itself: a name
//! is bound to a [`Val`], which is a tensor, a *sequence of known length* (one IR
//! tensor per element, each its own value with its own shape) or an *optional of
//! known presence* (`Opt(None)` or `Opt(Some(..))`). The sequence ops
//! (`SequenceConstruct`, `SequenceInsert`, `SequenceAt`, …) edit these lists while
//! the graph is imported, the way `Loop` unrolling keeps loop-carried values in
//! fixed slots: what reaches the IR is plain tensor ops (`Split` for
//! `SplitToSequence`, `Concat` for `ConcatFromSequence`, the body of a `SequenceMap`
//! once per element). A position or a presence that depends on run-time data is
//! refused with an error naming the node.
//!
//! At the edges of the graph a sequence input `x` of n elements is n tensor inputs
//! `x[0]` … `x[n-1]` (their shapes given by [`crate::ImportOptions::input_sequences`]),
//! an optional input is its element's inputs when present and nothing when
//! absent ([`crate::ImportOptions::absent_inputs`]); outputs are flattened the same
//! way ([`Val::flatten`]). A run-time `If` whose branches give sequences needs both
//! branches to give the same number of tensors: the `If` node then has one result
//! per tensor.

use super::{At, Importer, NodeCx};
use crate::{ImportError, ImportOptions};
use kiln_ir::{Attr, Attrs, DType, OpKind, Shape, Tensor, TensorType, ValueId};
use std::collections::HashMap;

use super::proto::{type_proto, GraphProto, TypeProto};

/// What a name is bound to while a graph is imported.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Val {
    /// A tensor of the IR.
    T(ValueId),
    /// A sequence of known length: its elements, in order.
    Seq(Vec<ValueId>),
    /// An optional of known presence.
    Opt(Option<Box<Val>>),
}

impl Val {
    /// The tensor, where this is one.
    pub fn tensor(&self) -> Option<ValueId> {
        match self {
            Val::T(v) => Some(*v),
            _ => None,
        }
    }

    /// The tensors this holds, each with the name it has at the edge of a graph:
    /// `name` for a tensor (and a present optional tensor), `name[i]` for element
    /// `i` of a sequence, nothing for an absent optional.
    pub fn flatten(&self, name: &str) -> Vec<(String, ValueId)> {
        match self {
            Val::T(v) => vec![(name.to_string(), *v)],
            Val::Seq(items) => items.iter().enumerate().map(|(i, &v)| (element_name(name, i), v)).collect(),
            Val::Opt(None) => Vec::new(),
            Val::Opt(Some(x)) => x.flatten(name),
        }
    }

    /// Whether `self` and `other` hold the same number of tensors in the same places.
    pub fn same_form(&self, other: &Val) -> bool {
        match (self, other) {
            (Val::T(_), Val::T(_)) => true,
            (Val::Seq(a), Val::Seq(b)) => a.len() == b.len(),
            (Val::Opt(None), Val::Opt(None)) => true,
            (Val::Opt(Some(a)), Val::Opt(Some(b))) => a.same_form(b),
            _ => false,
        }
    }

    /// This form with its tensors taken from `it`, in [`Val::flatten`]'s order.
    pub fn rebuild(&self, it: &mut impl Iterator<Item = ValueId>) -> Option<Val> {
        Some(match self {
            Val::T(_) => Val::T(it.next()?),
            Val::Seq(items) => Val::Seq(items.iter().map(|_| it.next()).collect::<Option<_>>()?),
            Val::Opt(None) => Val::Opt(None),
            Val::Opt(Some(x)) => Val::Opt(Some(Box::new(x.rebuild(it)?))),
        })
    }

    /// A few words for errors: "a tensor", "a sequence of 3 tensors", …
    pub fn describe(&self) -> String {
        match self {
            Val::T(_) => "a tensor".into(),
            Val::Seq(items) => format!("a sequence of {} tensors", items.len()),
            Val::Opt(None) => "an empty optional".into(),
            Val::Opt(Some(x)) => format!("an optional holding {}", x.describe()),
        }
    }
}

/// The name of element `i` of sequence `name` at the edge of a graph.
pub fn element_name(name: &str, i: usize) -> String {
    format!("{name}[{i}]")
}

/// The ops this module imports.
pub(crate) fn handles(op: &str) -> bool {
    matches!(
        op,
        "SequenceConstruct"
            | "SequenceEmpty"
            | "SequenceInsert"
            | "SequenceErase"
            | "SequenceAt"
            | "SequenceLength"
            | "SplitToSequence"
            | "ConcatFromSequence"
            | "SequenceMap"
            | "Optional"
            | "OptionalHasElement"
            | "OptionalGetElement"
            | "Scan"
    )
}

/// The operands of an op that takes tensors only; a sequence or an optional is an
/// error naming the operand.
pub(crate) fn tensors(
    operands: &[Option<Val>],
    names: &[String],
    at: &At,
) -> Result<Vec<Option<ValueId>>, ImportError> {
    operands
        .iter()
        .enumerate()
        .map(|(k, o)| match o {
            None => Ok(None),
            Some(Val::T(v)) => Ok(Some(*v)),
            Some(other) => Err(at.err(format!(
                "operand `{}` is {}; this op takes tensors",
                names.get(k).map(String::as_str).unwrap_or("?"),
                other.describe()
            ))),
        })
        .collect()
}

fn int_attr(attrs: &Attrs, name: &str, default: i64, at: &At) -> Result<i64, ImportError> {
    match attrs.get(name) {
        None => Ok(default),
        Some(Attr::Int(i)) => Ok(*i),
        Some(other) => Err(at.err(format!("attribute `{name}` must be an int, it is {other:?}"))),
    }
}

fn i64_tensor(v: &[i64], at: &At) -> Result<Tensor, ImportError> {
    let shape = Shape::new([v.len()]).map_err(|e| at.err(e.to_string()))?;
    Tensor::from_vec(shape, v.to_vec()).map_err(|e| at.err(e.to_string()))
}

/// `axis` of a tensor of rank `rank`, made non-negative.
pub(crate) fn norm_axis(axis: i64, rank: usize, at: &At) -> Result<usize, ImportError> {
    let r = rank as i64;
    if axis < -r || axis >= r {
        return Err(at.err(format!("axis {axis} is outside [-{r}, {}] for rank {rank}", r - 1)));
    }
    Ok(if axis < 0 { axis + r } else { axis } as usize)
}

/// Imports one op of this module and binds its results.
pub(crate) fn import(imp: &mut Importer, node: &NodeCx, operands: &[Option<Val>]) -> Result<(), ImportError> {
    let NodeCx { label, op_type: op, attrs, outputs, subgraphs, at, .. } = *node;
    let arg = |k: usize| operands.get(k).cloned().flatten();
    let seq_arg = |k: usize| match arg(k) {
        Some(Val::Seq(items)) => Ok(items),
        Some(other) => Err(at.err(format!("operand {k} must be a sequence, it is {}", other.describe()))),
        None => Err(at.err(format!("operand {k} (a sequence) is missing"))),
    };
    let tensor_arg = |k: usize| match arg(k) {
        Some(Val::T(v)) => Ok(v),
        Some(other) => Err(at.err(format!("operand {k} must be a tensor, it is {}", other.describe()))),
        None => Err(at.err(format!("operand {k} (a tensor) is missing"))),
    };
    let out0 = outputs.first().cloned().unwrap_or_default();
    let results: Vec<Val> = match op {
        "SequenceConstruct" => {
            let items = (0..operands.len()).map(tensor_arg).collect::<Result<Vec<_>, _>>()?;
            same_dtype(imp, &items, at)?;
            vec![Val::Seq(items)]
        }
        "SequenceEmpty" => vec![Val::Seq(Vec::new())],
        "SequenceLength" => {
            let n = seq_arg(0)?.len();
            vec![Val::T(imp.add_const(&out0, Tensor::scalar(n as i64)))]
        }
        "SequenceAt" => {
            let items = seq_arg(0)?;
            match arg(1) {
                Some(Val::T(p)) if imp.g.constant(p).is_none() => {
                    vec![Val::T(select(imp, label, &items, p, &out0, at)?)]
                }
                p => {
                    let p =
                        position(imp, p, items.len(), false, at)?.ok_or_else(|| at.err("the position is missing"))?;
                    vec![Val::T(items[p])]
                }
            }
        }
        "SequenceInsert" => {
            let mut items = seq_arg(0)?;
            let t = tensor_arg(1)?;
            let p = position(imp, arg(2), items.len(), true, at)?.unwrap_or(items.len());
            items.insert(p, t);
            same_dtype(imp, &items, at)?;
            vec![Val::Seq(items)]
        }
        "SequenceErase" => {
            let mut items = seq_arg(0)?;
            if items.is_empty() {
                return Err(at.err("the sequence is empty: there is nothing to erase"));
            }
            let p = position(imp, arg(1), items.len(), false, at)?.unwrap_or(items.len() - 1);
            items.remove(p);
            vec![Val::Seq(items)]
        }
        "SplitToSequence" => vec![Val::Seq(split_to_sequence(imp, label, attrs, tensor_arg(0)?, arg(1), at)?)],
        "ConcatFromSequence" => {
            vec![Val::T(concat_from_sequence(imp, label, attrs, &seq_arg(0)?, &out0, at)?)]
        }
        "SequenceMap" => sequence_map(imp, operands, outputs, subgraphs, at)?,
        "Optional" => vec![Val::Opt(arg(0).map(Box::new))],
        "OptionalHasElement" => {
            let has = match arg(0) {
                None | Some(Val::Opt(None)) => false,
                Some(_) => true,
            };
            vec![Val::T(imp.add_const(&out0, Tensor::scalar(has)))]
        }
        "OptionalGetElement" => match arg(0) {
            Some(Val::Opt(Some(x))) => vec![*x],
            Some(Val::Opt(None)) => {
                return Err(at.err("the optional is empty (known at compile time): it has no element to get"))
            }
            Some(v) => vec![v],
            None => return Err(at.err("the operand is missing")),
        },
        "Scan" => super::scan::import(imp, node, operands)?,
        _ => return Err(at.err("internal: not a sequence op")),
    };
    imp.bind_vals(outputs, results);
    Ok(())
}

/// Every element of a sequence has one element type.
fn same_dtype(imp: &Importer, items: &[ValueId], at: &At) -> Result<(), ImportError> {
    if let Some(&first) = items.first() {
        let d = imp.g.ty(first).dtype;
        if let Some(&v) = items.iter().find(|&&v| imp.g.ty(v).dtype != d) {
            return Err(at.err(format!("a sequence holds one element type: {} and {}", imp.g.ty(first), imp.g.ty(v))));
        }
    }
    Ok(())
}

/// A position operand (one integer, negative counting from the end) resolved at
/// compile time: `None` where it is absent. `end_ok`: `len` itself is allowed (an
/// insertion at the end).
fn position(imp: &Importer, p: Option<Val>, len: usize, end_ok: bool, at: &At) -> Result<Option<usize>, ImportError> {
    let Some(p) = p else { return Ok(None) };
    let Val::T(v) = p else {
        return Err(at.err(format!("the position must be a tensor, it is {}", p.describe())));
    };
    let Some(t) = imp.g.constant(v) else {
        return Err(at.err(
            "unsupported: the position depends on run-time data; a static plan places sequence elements at compile time (bind the inputs it reads with --input-value)",
        ));
    };
    let p = match t.to_f64_vec().as_slice() {
        [x] => *x as i64,
        _ => return Err(at.err(format!("the position must hold one element, it is {}", t.ty()))),
    };
    let n = len as i64;
    let hi = if end_ok { n } else { n - 1 };
    if p < -n || p > hi {
        return Err(at.err(format!("position {p} is outside [-{n}, {hi}] for a sequence of {len} elements")));
    }
    Ok(Some(if p < 0 { p + n } else { p } as usize))
}

/// `SequenceAt` with a position computed at run time: a select over the bounded
/// candidates, i.e. the elements stacked on a new axis 0 and a `Gather` of the
/// position (negative counts from the end). Every element must have one type. A
/// position outside the sequence reads the nearest element (a static plan has no
/// run-time error path; ONNX makes it an error).
fn select(
    imp: &mut Importer,
    label: &str,
    items: &[ValueId],
    p: ValueId,
    out: &str,
    at: &At,
) -> Result<ValueId, ImportError> {
    let Some(&first) = items.first() else {
        return Err(at.err("the sequence is empty: there is no element to take"));
    };
    let ty = imp.g.ty(first).clone();
    if let Some(&v) = items.iter().find(|&&v| *imp.g.ty(v) != ty) {
        return Err(at.err(format!(
            "unsupported: the position depends on run-time data and the elements differ in type ({ty} and {}), so no one tensor can hold the one picked; bind the inputs the position reads with --input-value",
            imp.g.ty(v)
        )));
    }
    let pt = imp.g.ty(p).clone();
    if pt.shape.numel() != 1 || !matches!(pt.dtype, DType::I32 | DType::I64) {
        return Err(at.err(format!("the position must be one int32 or int64, it is {pt}")));
    }
    let axes = imp.add_const("", i64_tensor(&[0], at)?);
    let mut rows = Vec::with_capacity(items.len());
    for &e in items {
        let u = imp.emit(label, OpKind::Unsqueeze, Attrs::new(), vec![Some(e), Some(axes)], &[String::new()], at)?;
        rows.push(Some(u.first().copied().ok_or_else(|| at.err("internal: Unsqueeze gave no result"))?));
    }
    let a0 = Attrs::new().with("axis", Attr::Int(0));
    let stacked = imp.emit(label, OpKind::Concat, a0.clone(), rows, &[String::new()], at)?;
    let stacked = stacked.first().copied().ok_or_else(|| at.err("internal: Concat gave no result"))?;
    // A scalar index drops the stacking axis.
    let shape0 = imp.add_const(
        "",
        Tensor::from_vec(Shape::new([0]).map_err(|e| at.err(e.to_string()))?, Vec::<i64>::new())
            .map_err(|e| at.err(e.to_string()))?,
    );
    let idx = imp.emit(label, OpKind::Reshape, Attrs::new(), vec![Some(p), Some(shape0)], &[String::new()], at)?;
    let idx = idx.first().copied().ok_or_else(|| at.err("internal: Reshape gave no result"))?;
    let r = imp.emit(label, OpKind::Gather, a0, vec![Some(stacked), Some(idx)], &[out.to_string()], at)?;
    r.first().copied().ok_or_else(|| at.err("internal: Gather gave no result"))
}

/// `SplitToSequence`: one `Split` (and a `Squeeze` per piece for `keepdims = 0`
/// without `split`).
fn split_to_sequence(
    imp: &mut Importer,
    label: &str,
    attrs: &Attrs,
    x: ValueId,
    split: Option<Val>,
    at: &At,
) -> Result<Vec<ValueId>, ImportError> {
    let dims = imp.g.ty(x).shape.dims().to_vec();
    let axis = norm_axis(int_attr(attrs, "axis", 0, at)?, dims.len(), at)?;
    let keepdims = int_attr(attrs, "keepdims", 1, at)? != 0;
    let dim = dims[axis];
    let (sizes, squeeze): (Vec<i64>, bool) = match split {
        None => (vec![1; dim], !keepdims),
        Some(Val::T(s)) => {
            let Some(t) = imp.g.constant(s) else {
                return Err(at.err(
                    "unsupported: `split` depends on run-time data; a static plan needs the number of pieces at compile time (bind it with --input-value)",
                ));
            };
            let v = t.to_i64_vec().map_err(|e| at.err(e.to_string()))?;
            if t.shape().rank() == 0 {
                let c = v.first().copied().unwrap_or(0);
                if c <= 0 {
                    return Err(at.err(format!("`split` is {c}; a piece size must be positive")));
                }
                let c = c as usize;
                ((0..dim.div_ceil(c)).map(|i| (c.min(dim - i * c)) as i64).collect(), false)
            } else {
                (v, false)
            }
        }
        Some(other) => return Err(at.err(format!("`split` must be a tensor, it is {}", other.describe()))),
    };
    if sizes.iter().any(|&s| s < 0) || sizes.iter().sum::<i64>() != dim as i64 {
        return Err(at.err(format!("`split` {sizes:?} does not add up to dimension {axis} ({dim})")));
    }
    if sizes.is_empty() {
        return Ok(Vec::new());
    }
    let split_t = imp.add_const("", i64_tensor(&sizes, at)?);
    let names = vec![String::new(); sizes.len()];
    let a = Attrs::new().with("axis", Attr::Int(axis as i64));
    let pieces = imp.emit(label, OpKind::Split, a, vec![Some(x), Some(split_t)], &names, at)?;
    if !squeeze {
        return Ok(pieces);
    }
    let axes = imp.add_const("", i64_tensor(&[axis as i64], at)?);
    let mut out = Vec::with_capacity(pieces.len());
    for p in pieces {
        let s = imp.emit(label, OpKind::Squeeze, Attrs::new(), vec![Some(p), Some(axes)], &[String::new()], at)?;
        out.push(s.first().copied().ok_or_else(|| at.err("internal: Squeeze gave no result"))?);
    }
    Ok(out)
}

/// `ConcatFromSequence`: a `Concat` of the elements (each unsqueezed first for
/// `new_axis = 1`).
fn concat_from_sequence(
    imp: &mut Importer,
    label: &str,
    attrs: &Attrs,
    items: &[ValueId],
    out: &str,
    at: &At,
) -> Result<ValueId, ImportError> {
    let Some(&first) = items.first() else {
        return Err(at.err("the sequence is empty: there is nothing to concatenate (and no element type)"));
    };
    let rank = imp.g.ty(first).shape.rank();
    let new_axis = int_attr(attrs, "new_axis", 0, at)? != 0;
    let axis = match attrs.get("axis") {
        Some(Attr::Int(a)) => *a,
        _ => return Err(at.err("attribute `axis` (an int) is missing")),
    };
    let axis = norm_axis(axis, rank + usize::from(new_axis), at)?;
    let mut parts = Vec::with_capacity(items.len());
    if new_axis {
        let axes = imp.add_const("", i64_tensor(&[axis as i64], at)?);
        for &p in items {
            let u =
                imp.emit(label, OpKind::Unsqueeze, Attrs::new(), vec![Some(p), Some(axes)], &[String::new()], at)?;
            parts.push(Some(u.first().copied().ok_or_else(|| at.err("internal: Unsqueeze gave no result"))?));
        }
    } else {
        parts.extend(items.iter().map(|&p| Some(p)));
    }
    let a = Attrs::new().with("axis", Attr::Int(axis as i64));
    let r = imp.emit(label, OpKind::Concat, a, parts, &[out.to_string()], at)?;
    r.first().copied().ok_or_else(|| at.err("internal: Concat gave no result"))
}

/// `SequenceMap`: the body inlined once per element; tensor operands are passed
/// to every application, sequence operands one element each.
fn sequence_map(
    imp: &mut Importer,
    operands: &[Option<Val>],
    outputs: &[String],
    subgraphs: &HashMap<String, &GraphProto>,
    at: &At,
) -> Result<Vec<Val>, ImportError> {
    let body = *subgraphs.get("body").ok_or_else(|| at.err("attribute `body` is missing"))?;
    let n = match operands.first() {
        Some(Some(Val::Seq(items))) => items.len(),
        Some(Some(other)) => {
            return Err(at.err(format!("the first operand must be a sequence, it is {}", other.describe())))
        }
        _ => return Err(at.err("the first operand (a sequence) is missing")),
    };
    if body.output.len() < outputs.len() {
        return Err(at.err(format!("the body gives {} outputs, the node has {}", body.output.len(), outputs.len())));
    }
    let mut results: Vec<Vec<ValueId>> = vec![Vec::with_capacity(n); outputs.len()];
    for i in 0..n {
        let mut args = Vec::with_capacity(operands.len());
        for (k, o) in operands.iter().enumerate() {
            args.push(match o {
                Some(Val::Seq(items)) => Val::T(*items.get(i).ok_or_else(|| {
                    at.err(format!("operand {k} is a sequence of {} elements, operand 0 of {n}", items.len()))
                })?),
                Some(Val::T(v)) => Val::T(*v),
                Some(other) => {
                    return Err(
                        at.err(format!("operand {k} is {}; SequenceMap takes sequences and tensors", other.describe()))
                    )
                }
                None => return Err(at.err(format!("operand {k} is missing"))),
            });
        }
        let outs = imp.inline_graph(body, args, at)?;
        for (k, r) in results.iter_mut().enumerate() {
            let o = &outs[k];
            r.push(
                o.tensor()
                    .ok_or_else(|| at.err(format!("body output {k} must be a tensor, it is {}", o.describe())))?,
            );
        }
    }
    Ok(results.into_iter().map(Val::Seq).collect())
}

impl Importer {
    /// Imports `body` in place (a scope of its own, its inputs bound to `args`) and
    /// gives its outputs: the application of a `SequenceMap` or a `Scan` trip.
    pub(crate) fn inline_graph(&mut self, body: &GraphProto, args: Vec<Val>, at: &At) -> Result<Vec<Val>, ImportError> {
        if body.input.len() != args.len() {
            return Err(at.err(format!("the body takes {} inputs, it is given {}", body.input.len(), args.len())));
        }
        self.scopes.push(HashMap::new());
        let r = (|| {
            self.import_initializers(body)?;
            for (vi, a) in body.input.iter().zip(args) {
                self.bind_val(vi.name.as_deref().unwrap_or_default(), a);
            }
            self.import_body(body)?;
            self.resolve_outputs(&body.output, "body", at)
        })();
        self.scopes.pop();
        r
    }

    /// A graph input of any kind (see the module docs).
    pub(crate) fn signature_input(
        &mut self,
        name: &str,
        ty: Option<&TypeProto>,
        opts: &ImportOptions,
    ) -> Result<Val, ImportError> {
        let ierr = |message: String| ImportError::Input { name: name.to_string(), message };
        let absent = opts.absent_inputs.iter().any(|n| n == name);
        match ty.and_then(|t| t.value.as_ref()) {
            Some(type_proto::Value::OptionalType(o)) => {
                if absent {
                    return Ok(Val::Opt(None));
                }
                let inner = self.signature_input(name, o.elem_type.as_deref(), opts)?;
                Ok(Val::Opt(Some(Box::new(inner))))
            }
            _ if absent => Err(ierr("it is given as absent (--input-absent), but it is not an optional".into())),
            Some(type_proto::Value::TensorType(tt)) => Ok(Val::T(self.tensor_input(name, tt, opts)?)),
            Some(type_proto::Value::SequenceType(st)) => {
                let Some(type_proto::Value::TensorType(et)) = st.elem_type.as_ref().and_then(|t| t.value.as_ref())
                else {
                    return Err(ierr("only sequences of tensors are supported".into()));
                };
                let code = et.elem_type.unwrap_or(0);
                let dtype = DType::from_onnx_code(code as i64)
                    .ok_or_else(|| ierr(format!("element type code {code} is not supported")))?;
                let Some((_, shapes)) = opts.input_sequences.iter().find(|(n, _)| n == name) else {
                    return Err(ierr(
                        "it is a sequence: a static plan needs its length and its elements' shapes; give them with --input-sequence NAME=DIMS;DIMS;...".into(),
                    ));
                };
                let declared: Option<Vec<Option<usize>>> = et.shape.as_ref().map(|s| {
                    use super::proto::tensor_shape_proto::dimension::Value as D;
                    s.dim
                        .iter()
                        .map(|d| match d.value {
                            Some(D::DimValue(v)) if v >= 0 => Some(v as usize),
                            _ => None,
                        })
                        .collect()
                });
                let mut items = Vec::with_capacity(shapes.len());
                for (i, dims) in shapes.iter().enumerate() {
                    if let Some(decl) = &declared {
                        let fits =
                            decl.len() == dims.len() && decl.iter().zip(dims).all(|(d, &g)| d.is_none_or(|d| d == g));
                        if !fits {
                            return Err(ierr(format!(
                                "element {i} is given shape {dims:?}, the model declares its elements {decl:?} (None: free)"
                            )));
                        }
                    }
                    let shape = Shape::new(dims.clone()).map_err(|e| ierr(e.to_string()))?;
                    let n = self.fresh_name(&element_name(name, i));
                    items.push(self.g.add_input(n, TensorType::new(dtype, shape)));
                }
                Ok(Val::Seq(items))
            }
            Some(_) => Err(ierr("map and sparse tensor inputs are not supported".into())),
            None => Err(ierr("the input has no type".into())),
        }
    }
}
