//! Operators without an ONNX function body that have a closed form in canonical ops,
//! imported as that form (every later stage, the reference evaluator included, sees
//! only canonical ops, and fusion treats them as usual):
//!
//! - `DFT(input [.., n, 1|2], dft_length?, axis?)` and `STFT(signal, frame_step,
//!   window?, frame_length?)`: a **product with a constant basis**. With the signal
//!   length static the transform is a matrix: rows are the input's (sample, re/im)
//!   pairs, columns the output's (frequency, re/im) pairs, entries `±cos`, `±sin` of
//!   `2π·j·k/L` computed in f64 (from `j·k mod L`) and rounded once (×1/L for the
//!   inverse; rows past `dft_length` zero, which truncates; a longer `dft_length` pads
//!   with zeros, which the missing rows give). The op becomes Transpose (the signal
//!   axis next to the complex axis) · Reshape · **MatMul** (a Contraction on the fast
//!   path) · Reshape · Transpose. STFT first takes its frames with one Gather of
//!   constant indices and multiplies them by the window (a run-time operand), then
//!   uses the same basis; `onesided` keeps the first `L/2 + 1` columns.
//! - `MelWeightMatrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz,
//!   upper_edge_hertz)`: the counts are constants (they fix the shape); the band edges
//!   may be run-time values, so the triangular filters are computed by elementwise ops
//!   over a constant grid of (bin, band), in the operations and order of ONNX's
//!   reference (mel = 2595·log10(1 + f/700), edges floored to bins).
//! - `MaxUnpool(X, I, output_shape?)`: ScatterElements of X's elements at the flat
//!   indices I into zeros of the inferred shape, then a zero Pad up to `output_shape`.
//! - Training-mode `BatchNormalization`: the batch statistics (ReduceMean over every
//!   axis but 1, population variance), the normalisation with them, and the running
//!   statistics `input·momentum + batch·(1 − momentum)`.
//! - `ai.onnx.preview.training` `Adagrad`, `Adam`, `Momentum` (one or several tensors
//!   per node): their update rules as elementwise ops; `T` is an operand (`T > 0`
//!   selects the bias correction), so a run-time step count works too.
//! - `ai.onnx.ml` `Binarizer` (Where(X > threshold, 1, 0)) and `ArrayFeatureExtractor`
//!   (Gather along the last axis; a 1-D input gives `[1, k]`).
//! - `ai.onnx.ml` `TreeEnsemble` (opset 5): the trees are constants, so every leaf's path
//!   is known at import. The node conditions of a batch are one elementwise block over
//!   the gathered features (`[N, nodes]`, each node's comparison selected by a constant
//!   mask; set membership as an Equal against the node's padded member list), a leaf is
//!   reached where the count of its path's conditions met (two **MatMuls** with constant
//!   0/1 path matrices) equals its path length, and the aggregate is a MatMul with the
//!   leaf weights per target (SUM, AVERAGE) or a masked ReduceMin/ReduceMax (MIN, MAX;
//!   a target no reached leaf scores is 0, as in ONNX Runtime).
//!   Only `post_transform` NONE is accepted (ONNX's reference ignores the others).
//! - `TfIdfVectorizer` over integers: the pool is constant, so for every n-gram length
//!   and skip distance the matches of all pool n-grams of that length are one Equal of
//!   the shifted slices of X against the pool's columns, ANDed over the n items and
//!   summed over the start positions; the counts go to their output slots through a
//!   MatMul with a constant 0/1 matrix, then TF, IDF or TFIDF weighting (weight `i` on
//!   output slot `i`, as ONNX Runtime and ONNX's reference apply them). Unigrams count at
//!   skip distance 1 only, as ONNX's reference counts them. String pools are refused.
//! - `com.microsoft` `DynamicQuantizeLSTM` (ONNX Runtime's dynamic-int8 LSTM: int8 or
//!   uint8 weights `W [dirs, input, 4·hidden]`, `R [dirs, hidden, 4·hidden]`, already
//!   transposed, with per-tensor `[dirs]` or per-gate-column `[dirs, 4·hidden]` scales
//!   and zero points): the recurrence unrolled over the (static) sequence, in ONNX
//!   Runtime's arithmetic step by step. The input projection quantizes the whole
//!   sequence at once (`DynamicQuantizeLinear` of `X` as `[seq·batch, input]`: u8, scale
//!   from the range including 0, zero point rounded half to even), multiplies it by `W`
//!   with `MatMulInteger` (exact i32) and scales by `f32(s_x·s_w)`; each step quantizes
//!   the previous hidden state `[batch, hidden]` the same way, adds
//!   `f32(acc·f32(s_h·s_r))` to that step's projection (the product written as
//!   `(Rᵀ · h_qᵀ)ᵀ`, `R` transposed once here: the weight as the left operand, read in
//!   place), then the summed bias
//!   `f32(Wb + Rb)`; the gates (i, o, f, c in ONNX order) are `σ, σ, σ, tanh`,
//!   `C = C₋₁·f + i·c̃`, `H = tanh(C)·o`. The state is quantized per step over the whole
//!   batch, which is ONNX Runtime's order with one intra-op thread (with several threads
//!   and a batch above 4 it quantizes per thread's rows). Refused: `sequence_lens`,
//!   peepholes, `clip`, `input_forget`, activations other than the default.

use super::{At, Importer, NodeCx};
use crate::ImportError;
use kiln_ir::{Attr, Attrs, DType, OpKind, Shape, Tensor, ValueId};
use std::collections::HashMap;

/// The most elements of a constant basis or index table built here.
const MAX_CONST_ELEMENTS: usize = 1 << 24;

/// The domain an op of this module belongs to, `None` for ops not decomposed here.
pub(crate) fn domain_of(op_type: &str) -> Option<&'static str> {
    match op_type {
        "DFT" | "STFT" | "MelWeightMatrix" | "MaxUnpool" | "TfIdfVectorizer" => Some(""),
        "Adagrad" | "Adam" | "Momentum" => Some("ai.onnx.preview.training"),
        "Binarizer" | "ArrayFeatureExtractor" | "TreeEnsemble" => Some("ai.onnx.ml"),
        "DynamicQuantizeLSTM" => Some("com.microsoft"),
        _ => None,
    }
}

/// Whether a BatchNormalization node asks for training mode (decomposed here).
pub(crate) fn is_training_batch_norm(attrs: &Attrs, declared_outputs: usize) -> bool {
    matches!(attrs.get("training_mode"), Some(Attr::Int(v)) if *v != 0) || declared_outputs > 1
}

type R<T> = Result<T, ImportError>;

struct Cx<'i, 'a, 'b> {
    imp: &'i mut Importer,
    at: &'a At<'b>,
}

impl Cx<'_, '_, '_> {
    fn op(&mut self, kind: OpKind, attrs: Attrs, inputs: Vec<Option<ValueId>>) -> R<ValueId> {
        let v = self.imp.emit("", kind, attrs, inputs, &[String::new()], self.at)?;
        v.first().copied().ok_or_else(|| self.at.err("no result"))
    }
    fn bin(&mut self, kind: OpKind, a: ValueId, b: ValueId) -> R<ValueId> {
        self.op(kind, Attrs::default(), vec![Some(a), Some(b)])
    }
    fn un(&mut self, kind: OpKind, a: ValueId) -> R<ValueId> {
        self.op(kind, Attrs::default(), vec![Some(a)])
    }
    fn add(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.bin(OpKind::Add, a, b)
    }
    fn sub(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.bin(OpKind::Sub, a, b)
    }
    fn mul(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.bin(OpKind::Mul, a, b)
    }
    fn div(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.bin(OpKind::Div, a, b)
    }
    /// `Where(c, a, b)`.
    fn select(&mut self, c: ValueId, a: ValueId, b: ValueId) -> R<ValueId> {
        self.op(OpKind::Where, Attrs::default(), vec![Some(c), Some(a), Some(b)])
    }
    /// `(a − b) / (c − d)`, and its divisor `c − d` (computed first).
    fn ratio(&mut self, (a, b): (ValueId, ValueId), (c, d): (ValueId, ValueId)) -> R<(ValueId, ValueId)> {
        let divisor = self.sub(c, d)?;
        let dividend = self.sub(a, b)?;
        Ok((self.div(dividend, divisor)?, divisor))
    }
    /// `And(low_test(j, lo), high_test(j, hi))`: whether `j` lies between `lo` and `hi`,
    /// each end compared by its test.
    fn within(
        &mut self,
        j: ValueId,
        (low_test, lo): (OpKind, ValueId),
        (high_test, hi): (OpKind, ValueId),
    ) -> R<ValueId> {
        let above = self.bin(low_test, j, lo)?;
        let below = self.bin(high_test, j, hi)?;
        self.bin(OpKind::And, above, below)
    }
    /// A scalar constant of dtype `d`.
    fn scalar(&mut self, d: DType, x: f64) -> R<ValueId> {
        let t = Tensor::from_f64(d, Shape::scalar(), &[x]).map_err(|e| self.at.err(e.to_string()))?;
        Ok(self.imp.add_const("", t))
    }
    fn tensor(&mut self, d: DType, dims: &[usize], v: &[f64]) -> R<ValueId> {
        let shape = Shape::new(dims.to_vec()).map_err(|e| self.at.err(e.to_string()))?;
        let t = Tensor::from_f64(d, shape, v).map_err(|e| self.at.err(e.to_string()))?;
        Ok(self.imp.add_const("", t))
    }
    fn ints(&mut self, v: &[i64]) -> R<ValueId> {
        let t = Tensor::from_vec(Shape::new([v.len()]).map_err(|e| self.at.err(e.to_string()))?, v.to_vec())
            .map_err(|e| self.at.err(e.to_string()))?;
        Ok(self.imp.add_const("", t))
    }
    fn reshape(&mut self, x: ValueId, dims: &[i64]) -> R<ValueId> {
        let s = self.ints(dims)?;
        self.bin(OpKind::Reshape, x, s)
    }
    fn transpose(&mut self, x: ValueId, perm: &[usize]) -> R<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(x);
        }
        let a = Attrs::default().with("perm", Attr::Ints(perm.iter().map(|&p| p as i64).collect()));
        self.op(OpKind::Transpose, a, vec![Some(x)])
    }
    fn dims(&self, v: ValueId) -> Vec<usize> {
        self.imp.g.ty(v).shape.dims().to_vec()
    }
    fn dtype(&self, v: ValueId) -> DType {
        self.imp.g.ty(v).dtype
    }
    /// The integers of a constant operand.
    fn const_ints(&self, v: ValueId, what: &str) -> R<Vec<i64>> {
        let Some(t) = self.imp.g.constant(v) else {
            return Err(self.at.err(format!(
                "{what} must be a constant: `{}` depends on run-time data (bind it with --input-value)",
                self.imp.g.values[v].name
            )));
        };
        t.to_i64_vec().map_err(|e| self.at.err(e.to_string()))
    }
    fn const_int(&self, v: ValueId, what: &str) -> R<i64> {
        match self.const_ints(v, what)?.as_slice() {
            [x] => Ok(*x),
            other => Err(self.at.err(format!("{what} has {} elements; expected one", other.len()))),
        }
    }
}

fn int_attr(attrs: &Attrs, name: &str, default: i64, at: &At) -> R<i64> {
    match attrs.get(name) {
        None => Ok(default),
        Some(Attr::Int(v)) => Ok(*v),
        Some(o) => Err(at.err(format!("attribute `{name}` is {}, expected an int", o.kind_name()))),
    }
}

fn float_attr(attrs: &Attrs, name: &str, default: Option<f32>, at: &At) -> R<f64> {
    match (attrs.get(name), default) {
        (None, Some(d)) => Ok(f64::from(d)),
        (None, None) => Err(at.err(format!("required attribute `{name}` is missing"))),
        (Some(Attr::Float(v)), _) => Ok(f64::from(*v)),
        (Some(o), _) => Err(at.err(format!("attribute `{name}` is {}, expected a float", o.kind_name()))),
    }
}

fn ints_attr(attrs: &Attrs, name: &str, at: &At) -> R<Option<Vec<i64>>> {
    match attrs.get(name) {
        None => Ok(None),
        Some(Attr::Ints(v)) => Ok(Some(v.clone())),
        Some(o) => Err(at.err(format!("attribute `{name}` is {}, expected ints", o.kind_name()))),
    }
}

/// Imports one node of a decomposed op and binds its outputs.
pub(crate) fn decompose(imp: &mut Importer, node: &NodeCx, inputs: &[Option<ValueId>]) -> Result<(), ImportError> {
    let NodeCx { op_type, attrs, outputs, at, .. } = *node;
    let mut cx = Cx { imp, at };
    let operand = |i: usize, what: &str| {
        inputs.get(i).copied().flatten().ok_or_else(|| at.err(format!("{what} (operand {i}) is missing")))
    };
    let results: Vec<ValueId> = match op_type {
        "DFT" => vec![dft(&mut cx, attrs, inputs)?],
        "STFT" => vec![stft(&mut cx, attrs, inputs)?],
        "MelWeightMatrix" => vec![mel_weight_matrix(&mut cx, attrs, inputs)?],
        "MaxUnpool" => {
            vec![max_unpool(&mut cx, attrs, operand(0, "X")?, operand(1, "I")?, inputs.get(2).copied().flatten())?]
        }
        "BatchNormalization" => batch_norm_training(&mut cx, attrs, inputs, outputs.len())?,
        "Adagrad" | "Adam" | "Momentum" => optimizer(&mut cx, op_type, attrs, inputs)?,
        "TreeEnsemble" => vec![tree_ensemble(&mut cx, attrs, operand(0, "X")?)?],
        "TfIdfVectorizer" => vec![tfidf(&mut cx, attrs, operand(0, "X")?)?],
        "DynamicQuantizeLSTM" => dynamic_quantize_lstm(&mut cx, attrs, inputs, outputs.len())?,
        "Binarizer" => {
            let x = operand(0, "X")?;
            let d = cx.dtype(x);
            let t = float_attr(attrs, "threshold", Some(0.0), at)?;
            let (tv, one, zero) = (cx.scalar(d, t)?, cx.scalar(d, 1.0)?, cx.scalar(d, 0.0)?);
            let gt = cx.bin(OpKind::Greater, x, tv)?;
            vec![cx.select(gt, one, zero)?]
        }
        "ArrayFeatureExtractor" => {
            let (x, y) = (operand(0, "X")?, operand(1, "Y")?);
            let rank = cx.dims(x).len();
            if rank == 0 {
                return Err(at.err("X is a scalar; expected at least one axis"));
            }
            let idx = cx.reshape(y, &[-1])?;
            let a = Attrs::default().with("axis", Attr::Int(rank as i64 - 1));
            let z = cx.op(OpKind::Gather, a, vec![Some(x), Some(idx)])?;
            if rank == 1 {
                vec![cx.reshape(z, &[1, -1])?]
            } else {
                vec![z]
            }
        }
        other => return Err(at.err(format!("{other} is not decomposed"))),
    };
    for (name, v) in outputs.iter().zip(results) {
        if !name.is_empty() {
            imp_bind(cx.imp, name, v);
        }
    }
    Ok(())
}

fn imp_bind(imp: &mut Importer, name: &str, v: ValueId) {
    imp.bind(name, v);
}

/// The DFT basis: rows (sample j < n, re/im of the input when `complex`), columns
/// (frequency k < kept, re/im); see the module docs.
fn dft_basis(n: usize, complex: bool, len: usize, kept: usize, inverse: bool) -> Vec<f64> {
    let c = if complex { 2 } else { 1 };
    let sigma = if inverse { -1.0 } else { 1.0 };
    let scale = if inverse { 1.0 / len as f64 } else { 1.0 };
    let mut w = vec![0.0; n * c * kept * 2];
    let cols = kept * 2;
    for j in 0..n.min(len) {
        for k in 0..kept {
            let theta = 2.0 * std::f64::consts::PI * ((j * k) % len) as f64 / len as f64;
            let (s, co) = theta.sin_cos();
            let re_row = j * c * cols;
            w[re_row + 2 * k] = co * scale;
            w[re_row + 2 * k + 1] = -sigma * s * scale;
            if complex {
                let im_row = (j * c + 1) * cols;
                w[im_row + 2 * k] = sigma * s * scale;
                w[im_row + 2 * k + 1] = co * scale;
            }
        }
    }
    w
}

/// A transform: `n` samples (complex or real) to `kept` of the `len` frequencies.
struct Transform {
    n: usize,
    complex: bool,
    len: usize,
    kept: usize,
    inverse: bool,
}

/// `x [lead.., n·c]` times the basis, reshaped to `[lead.., kept, 2]`.
fn times_basis(cx: &mut Cx, x: ValueId, lead: &[usize], tr: Transform) -> R<ValueId> {
    let Transform { n, complex, len, kept, inverse } = tr;
    let c = if complex { 2 } else { 1 };
    if n.saturating_mul(c).saturating_mul(kept).saturating_mul(2) > MAX_CONST_ELEMENTS {
        return Err(cx.at.err(format!(
            "a transform of {n} samples to {kept} frequencies is larger than kiln's constant basis limit"
        )));
    }
    let d = cx.dtype(x);
    let w = dft_basis(n, complex, len, kept, inverse);
    let basis = cx.tensor(d, &[n * c, kept * 2], &w)?;
    let y = cx.bin(OpKind::MatMul, x, basis)?;
    let mut shape: Vec<i64> = lead.iter().map(|&v| v as i64).collect();
    shape.extend([kept as i64, 2]);
    cx.reshape(y, &shape)
}

fn dft(cx: &mut Cx, attrs: &Attrs, inputs: &[Option<ValueId>]) -> R<ValueId> {
    let at = cx.at;
    let x = inputs.first().copied().flatten().ok_or_else(|| at.err("input (operand 0) is missing"))?;
    let xd = cx.dims(x);
    let rank = xd.len();
    if rank < 3 || !matches!(xd[rank - 1], 1 | 2) {
        return Err(at.err(format!("input of dims {xd:?}: expected [batch, .., signal, 1 or 2]")));
    }
    if !cx.dtype(x).is_float() {
        return Err(at.err(format!("input is {}; expected a float type", cx.dtype(x))));
    }
    let axis = if at.opset >= 20 {
        match inputs.get(2).copied().flatten() {
            Some(a) => cx.const_int(a, "axis (operand 2)")?,
            None => -2,
        }
    } else {
        int_attr(attrs, "axis", 1, at)?
    };
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 1 || a > r - 2 {
        return Err(at.err(format!(
            "axis {axis} out of range for input of rank {rank} (the batch and complex axes cannot be transformed)"
        )));
    }
    let a = a as usize;
    let n = xd[a];
    let len = match inputs.get(1).copied().flatten() {
        Some(v) => {
            let l = cx.const_int(v, "dft_length (operand 1)")?;
            usize::try_from(l)
                .ok()
                .filter(|&l| l > 0)
                .ok_or_else(|| at.err(format!("dft_length {l} must be positive")))?
        }
        None => n,
    };
    let onesided = int_attr(attrs, "onesided", 0, at)? != 0;
    let inverse = int_attr(attrs, "inverse", 0, at)? != 0;
    if onesided && inverse {
        return Err(at.err("onesided with inverse is not defined for DFT"));
    }
    let complex = xd[rank - 1] == 2;
    if onesided && complex {
        return Err(at.err("onesided needs a real input (last axis 1)"));
    }
    let kept = if onesided { len / 2 + 1 } else { len };
    // Bring the signal axis next to the complex axis: [others.., n, c].
    let mut perm: Vec<usize> = (0..rank - 1).filter(|&i| i != a).collect();
    perm.push(a);
    perm.push(rank - 1);
    let t = cx.transpose(x, &perm)?;
    let lead: Vec<usize> = perm[..rank - 2].iter().map(|&i| xd[i]).collect();
    let mut flat: Vec<i64> = lead.iter().map(|&v| v as i64).collect();
    flat.push((n * xd[rank - 1]) as i64);
    let t = cx.reshape(t, &flat)?;
    let y = times_basis(cx, t, &lead, Transform { n, complex, len, kept, inverse })?;
    // y is [others.., kept, 2]; put `kept` back at axis a.
    let mut back = vec![0usize; rank];
    // y's axis i holds: i < rank-2 → original axis perm[i]; rank-2 → a; rank-1 → complex.
    for (i, &p) in perm.iter().enumerate() {
        back[p] = i;
    }
    cx.transpose(y, &back)
}

fn stft(cx: &mut Cx, attrs: &Attrs, inputs: &[Option<ValueId>]) -> R<ValueId> {
    let at = cx.at;
    let x = inputs.first().copied().flatten().ok_or_else(|| at.err("signal (operand 0) is missing"))?;
    let xd = cx.dims(x);
    if xd.len() != 3 || !matches!(xd[2], 1 | 2) {
        return Err(at.err(format!("signal of dims {xd:?}: expected [batch, length, 1 or 2]")));
    }
    let step_v = inputs.get(1).copied().flatten().ok_or_else(|| at.err("frame_step (operand 1) is missing"))?;
    let step = cx.const_int(step_v, "frame_step (operand 1)")?;
    let window = inputs.get(2).copied().flatten();
    let wlen = match window {
        Some(w) => match cx.dims(w).as_slice() {
            [l] => Some(*l),
            other => return Err(at.err(format!("window of dims {other:?}: expected one axis"))),
        },
        None => None,
    };
    let flen = match inputs.get(3).copied().flatten() {
        Some(v) => Some(cx.const_int(v, "frame_length (operand 3)")?),
        None => None,
    };
    let fl = match (flen, wlen) {
        (Some(f), Some(w)) if f != w as i64 => {
            return Err(at.err(format!("frame_length {f} differs from the window's length {w}")))
        }
        (Some(f), _) => usize::try_from(f)
            .ok()
            .filter(|&f| f > 0)
            .ok_or_else(|| at.err(format!("frame_length {f} must be positive")))?,
        (None, Some(w)) => w,
        (None, None) => return Err(at.err("neither window nor frame_length is given")),
    };
    if step < 1 || fl > xd[1] || fl == 0 {
        return Err(at.err(format!("frame_step {step} / frame length {fl} do not fit a signal of {}", xd[1])));
    }
    let step = step as usize;
    let frames = (xd[1] - fl) / step + 1;
    let onesided = int_attr(attrs, "onesided", 1, at)? != 0;
    let complex = xd[2] == 2;
    if onesided && complex {
        return Err(at.err("onesided needs a real signal (last axis 1)"));
    }
    if frames.saturating_mul(fl) > MAX_CONST_ELEMENTS {
        return Err(at.err("too many frames"));
    }
    let idx: Vec<i64> = (0..frames).flat_map(|f| (0..fl).map(move |j| (f * step + j) as i64)).collect();
    let idx_t = Tensor::from_vec(Shape::new([frames, fl]).map_err(|e| at.err(e.to_string()))?, idx)
        .map_err(|e| at.err(e.to_string()))?;
    let idx_v = cx.imp.add_const("", idx_t);
    let g = cx.op(OpKind::Gather, Attrs::default().with("axis", Attr::Int(1)), vec![Some(x), Some(idx_v)])?;
    // g: [batch, frames, fl, c]
    let g = match window {
        Some(w) => {
            let w2 = cx.reshape(w, &[fl as i64, 1])?;
            let w2 = if cx.dtype(w2) != cx.dtype(x) {
                let to = cx.dtype(x).onnx_code().map(i64::from).unwrap_or(1);
                cx.op(OpKind::Cast, Attrs::default().with("to", Attr::Int(to)), vec![Some(w2)])?
            } else {
                w2
            };
            cx.mul(g, w2)?
        }
        None => g,
    };
    let c = xd[2];
    let g = cx.reshape(g, &[xd[0] as i64, frames as i64, (fl * c) as i64])?;
    let kept = if onesided { fl / 2 + 1 } else { fl };
    times_basis(cx, g, &[xd[0], frames], Transform { n: fl, complex, len: fl, kept, inverse: false })
}

fn mel_weight_matrix(cx: &mut Cx, attrs: &Attrs, inputs: &[Option<ValueId>]) -> R<ValueId> {
    let at = cx.at;
    let op = |i: usize, what: &str| {
        inputs.get(i).copied().flatten().ok_or_else(|| at.err(format!("{what} (operand {i}) is missing")))
    };
    let m = cx.const_int(op(0, "num_mel_bins")?, "num_mel_bins (operand 0)")?;
    let l = cx.const_int(op(1, "dft_length")?, "dft_length (operand 1)")?;
    let sr = cx.const_int(op(2, "sample_rate")?, "sample_rate (operand 2)")?;
    let (lo, hi) = (op(3, "lower_edge_hertz")?, op(4, "upper_edge_hertz")?);
    if m < 1 || l < 1 || sr < 1 || (m as u64).saturating_mul(l as u64) > MAX_CONST_ELEMENTS as u64 {
        return Err(at.err(format!("num_mel_bins {m}, dft_length {l}, sample_rate {sr}: expected positive counts")));
    }
    let (m, l) = (m as usize, l as usize);
    let bins = l / 2 + 1;
    let out_dt = DType::from_onnx_code(int_attr(attrs, "output_datatype", 1, at)?)
        .ok_or_else(|| at.err("output_datatype is not a known type"))?;
    // Compute in f64 like the reference (NumPy promotes the f32 edges with Python floats).
    let f = DType::F64;
    let to = |d: DType| Attrs::default().with("to", Attr::Int(d.onnx_code().map(i64::from).unwrap_or(11)));
    let lo = cx.op(OpKind::Cast, to(f), vec![Some(lo)])?;
    let hi = cx.op(OpKind::Cast, to(f), vec![Some(hi)])?;
    let mel = |cx: &mut Cx, hz: ValueId| -> R<ValueId> {
        let c700 = cx.scalar(f, 700.0)?;
        let one = cx.scalar(f, 1.0)?;
        let q = cx.div(hz, c700)?;
        let q = cx.add(one, q)?;
        let ln = cx.un(OpKind::Log, q)?;
        let k = cx.scalar(f, 2595.0 / std::f64::consts::LN_10)?;
        cx.mul(ln, k)
    };
    let (lm, hm) = (mel(cx, lo)?, mel(cx, hi)?);
    let count = cx.scalar(f, (m + 2) as f64)?;
    let span = cx.sub(hm, lm)?;
    let step = cx.div(span, count)?;
    let ar: Vec<f64> = (0..m + 2).map(|i| i as f64).collect();
    let ar = cx.tensor(f, &[m + 2], &ar)?;
    let pts = cx.mul(ar, step)?;
    let pts = cx.add(pts, lm)?;
    let c2595 = cx.scalar(f, 2595.0)?;
    let e = cx.div(pts, c2595)?;
    let ten = cx.scalar(f, 10.0)?;
    let p = cx.bin(OpKind::Pow, ten, e)?;
    let one = cx.scalar(f, 1.0)?;
    let p = cx.sub(p, one)?;
    let c700 = cx.scalar(f, 700.0)?;
    let hz = cx.mul(c700, p)?;
    let lp1 = cx.scalar(f, (l + 1) as f64)?;
    let srv = cx.scalar(f, sr as f64)?;
    let fb = cx.mul(lp1, hz)?;
    let fb = cx.div(fb, srv)?;
    let fb = cx.un(OpKind::Floor, fb)?; // [m + 2] bin edges
    let slice = |cx: &mut Cx, s: i64| -> R<ValueId> {
        let (st, en, ax) = (cx.ints(&[s])?, cx.ints(&[s + m as i64])?, cx.ints(&[0])?);
        cx.op(OpKind::Slice, Attrs::default(), vec![Some(fb), Some(st), Some(en), Some(ax)])
    };
    let (low, center, high) = (slice(cx, 0)?, slice(cx, 1)?, slice(cx, 2)?); // [m]
    let jv: Vec<f64> = (0..bins).map(|j| j as f64).collect();
    let j = cx.tensor(f, &[bins, 1], &jv)?; // [bins, 1]
    let zero = cx.scalar(f, 0.0)?;
    // Rising edge: (j − low)/(center − low) on low ≤ j ≤ center; 1 at j == center when
    // center == low.
    let (rise, ltc) = cx.ratio((j, low), (center, low))?;
    let in_rise = cx.within(j, (OpKind::GreaterOrEqual, low), (OpKind::LessOrEqual, center))?;
    let ltc0 = cx.bin(OpKind::Equal, ltc, zero)?;
    let at_c = cx.bin(OpKind::Equal, j, center)?;
    let one_at_c = cx.select(at_c, one, zero)?;
    let rise = cx.select(in_rise, rise, zero)?;
    let rise = cx.select(ltc0, one_at_c, rise)?;
    // Falling edge (written after, so it wins): (high − j)/(high − center) on center ≤ j < high.
    let (fall, cth) = cx.ratio((high, j), (high, center))?;
    let in_fall = cx.within(j, (OpKind::GreaterOrEqual, center), (OpKind::Less, high))?;
    let pos = cx.bin(OpKind::Greater, cth, zero)?;
    let in_fall = cx.bin(OpKind::And, in_fall, pos)?;
    let w = cx.select(in_fall, fall, rise)?;
    let code = out_dt.onnx_code().map(i64::from).unwrap_or(1);
    cx.op(OpKind::Cast, Attrs::default().with("to", Attr::Int(code)), vec![Some(w)])
}

fn max_unpool(cx: &mut Cx, attrs: &Attrs, x: ValueId, i: ValueId, out_shape: Option<ValueId>) -> R<ValueId> {
    let at = cx.at;
    let xd = cx.dims(x);
    if xd.len() < 3 || cx.dims(i) != xd {
        return Err(
            at.err(format!("X of dims {xd:?} and I of dims {:?}: expected the same dims, rank ≥ 3", cx.dims(i)))
        );
    }
    let s = xd.len() - 2;
    let kernel =
        ints_attr(attrs, "kernel_shape", at)?.ok_or_else(|| at.err("required attribute `kernel_shape` is missing"))?;
    let strides = ints_attr(attrs, "strides", at)?.unwrap_or_else(|| vec![1; s]);
    let pads = ints_attr(attrs, "pads", at)?.unwrap_or_else(|| vec![0; 2 * s]);
    if kernel.len() != s || strides.len() != s || pads.len() != 2 * s {
        return Err(at.err(format!("kernel_shape, strides and pads must cover the {s} spatial axes")));
    }
    let mut inferred: Vec<i64> = xd[..2].iter().map(|&v| v as i64).collect();
    for d in 0..s {
        inferred.push((xd[d + 2] as i64 - 1) * strides[d] - pads[d] - pads[d + s] + kernel[d]);
    }
    if inferred.iter().any(|&v| v < 1) {
        return Err(at.err(format!("the unpooled dims {inferred:?} are not positive")));
    }
    let target = match out_shape {
        Some(v) => cx.const_ints(v, "output_shape (operand 2)")?,
        None => inferred.clone(),
    };
    if target.len() != inferred.len() || target.iter().zip(&inferred).any(|(t, i)| t < i) {
        return Err(at.err(format!("output_shape {target:?} is smaller than the unpooled dims {inferred:?}")));
    }
    let total: i64 = inferred.iter().product();
    if total as u64 > MAX_CONST_ELEMENTS as u64 {
        return Err(at.err("the unpooled tensor is too large"));
    }
    let zeros = cx.tensor(cx.dtype(x), &[total as usize], &vec![0.0; total as usize])?;
    let fi = cx.reshape(i, &[-1])?;
    let fx = cx.reshape(x, &[-1])?;
    let a = Attrs::default().with("axis", Attr::Int(0));
    let y = cx.op(OpKind::ScatterElements, a, vec![Some(zeros), Some(fi), Some(fx)])?;
    let y = cx.reshape(y, &inferred)?;
    if target == inferred {
        return Ok(y);
    }
    let mut p = vec![0i64; inferred.len()];
    p.extend(target.iter().zip(&inferred).map(|(t, i)| t - i));
    let pv = cx.ints(&p)?;
    cx.bin(OpKind::Pad, y, pv)
}

fn batch_norm_training(cx: &mut Cx, attrs: &Attrs, inputs: &[Option<ValueId>], num_outputs: usize) -> R<Vec<ValueId>> {
    let at = cx.at;
    let op = |i: usize, what: &str| {
        inputs.get(i).copied().flatten().ok_or_else(|| at.err(format!("{what} (operand {i}) is missing")))
    };
    let (x, s, b, mean, var) = (op(0, "X")?, op(1, "scale")?, op(2, "B")?, op(3, "input_mean")?, op(4, "input_var")?);
    let xd = cx.dims(x);
    if xd.len() < 2 {
        return Err(at.err(format!("X of dims {xd:?}: expected [N, C, ..]")));
    }
    if at.opset < 14 && num_outputs > 3 {
        return Err(at.err("the saved mean and variance outputs (opset < 14) are not supported"));
    }
    let eps = float_attr(attrs, "epsilon", Some(1e-5), at)?;
    let momentum = float_attr(attrs, "momentum", Some(0.9), at)?;
    let d = cx.dtype(x);
    let axes: Vec<i64> = (0..xd.len() as i64).filter(|&a| a != 1).collect();
    let axv = cx.ints(&axes)?;
    let keep = Attrs::default().with("keepdims", Attr::Int(1));
    let m = cx.op(OpKind::ReduceMean, keep.clone(), vec![Some(x), Some(axv)])?;
    let xc = cx.sub(x, m)?;
    let sq = cx.mul(xc, xc)?;
    let axv = cx.ints(&axes)?;
    let v = cx.op(OpKind::ReduceMean, keep, vec![Some(sq), Some(axv)])?;
    let e = cx.scalar(d, eps)?;
    let ve = cx.add(v, e)?;
    let sd = cx.un(OpKind::Sqrt, ve)?;
    let norm = cx.div(xc, sd)?;
    // scale and B are [C]: reshape to [C, 1, ..].
    let mut cshape = vec![-1i64];
    cshape.extend(std::iter::repeat_n(1, xd.len() - 2));
    let s2 = cx.reshape(s, &cshape)?;
    let b2 = cx.reshape(b, &cshape)?;
    let y = cx.mul(norm, s2)?;
    let y = cx.add(y, b2)?;
    let mut outs = vec![y];
    if num_outputs > 1 {
        let flat_m = cx.reshape(m, &[-1])?;
        let flat_v = cx.reshape(v, &[-1])?;
        let (k, k1) = (cx.scalar(d, momentum)?, cx.scalar(d, 1.0 - momentum)?);
        let rm = cx.mul(mean, k)?;
        let bm = cx.mul(flat_m, k1)?;
        outs.push(cx.add(rm, bm)?);
        let rv = cx.mul(var, k)?;
        let bv = cx.mul(flat_v, k1)?;
        outs.push(cx.add(rv, bv)?);
    }
    Ok(outs)
}

/// `Adagrad`, `Adam` and `Momentum` (see the module docs).
fn optimizer(cx: &mut Cx, op_type: &str, attrs: &Attrs, inputs: &[Option<ValueId>]) -> R<Vec<ValueId>> {
    let at = cx.at;
    let all: Vec<ValueId> = inputs
        .iter()
        .enumerate()
        .map(|(i, v)| v.ok_or_else(|| at.err(format!("operand {i} is missing"))))
        .collect::<R<_>>()?;
    let per = match op_type {
        "Adam" => 4,
        _ => 3,
    };
    if all.len() < 2 + per || !(all.len() - 2).is_multiple_of(per) {
        return Err(at.err(format!("{} operands: expected R, T and {per} tensors per optimised tensor", all.len())));
    }
    let n = (all.len() - 2) / per;
    let (r, t) = (all[0], all[1]);
    let mut outs = vec![Vec::new(); per - 1];
    for i in 0..n {
        let x = all[2 + i];
        let g = all[2 + n + i];
        let d = cx.dtype(x);
        let rd = if cx.dtype(r) != d { cast(cx, r, d)? } else { r };
        let tf = cast(cx, t, d)?;
        let zero_i = cx.scalar(cx.dtype(t), 0.0)?;
        let t_pos = cx.bin(OpKind::Greater, t, zero_i)?;
        let nc = float_attr(attrs, "norm_coefficient", if op_type == "Momentum" { None } else { Some(0.0) }, at)?;
        let ncv = cx.scalar(d, nc)?;
        let nx = cx.mul(ncv, x)?;
        let greg = cx.add(nx, g)?;
        match op_type {
            "Adagrad" => {
                let h = all[2 + 2 * n + i];
                let decay = cx.scalar(d, float_attr(attrs, "decay_factor", Some(0.0), at)?)?;
                let eps = cx.scalar(d, float_attr(attrs, "epsilon", Some(0.0), at)?)?;
                let one = cx.scalar(d, 1.0)?;
                let td = cx.mul(tf, decay)?;
                let den = cx.add(one, td)?;
                let r_ = cx.div(rd, den)?;
                let g2 = cx.mul(greg, greg)?;
                let h_new = cx.add(h, g2)?;
                let hs = cx.un(OpKind::Sqrt, h_new)?;
                let hs = cx.add(hs, eps)?;
                let rg = cx.mul(r_, greg)?;
                let q = cx.div(rg, hs)?;
                let x_new = cx.sub(x, q)?;
                outs[0].push(x_new);
                outs[1].push(h_new);
            }
            "Momentum" => {
                let v = all[2 + 2 * n + i];
                let alpha = cx.scalar(d, float_attr(attrs, "alpha", None, at)?)?;
                let beta = cx.scalar(d, float_attr(attrs, "beta", None, at)?)?;
                let mode = match attrs.get("mode") {
                    Some(Attr::String(s)) if s == "standard" || s == "nesterov" => s.clone(),
                    other => return Err(at.err(format!("mode {other:?}: expected \"standard\" or \"nesterov\""))),
                };
                let one = cx.scalar(d, 1.0)?;
                let beta_adj = cx.select(t_pos, beta, one)?;
                let av = cx.mul(alpha, v)?;
                let bg = cx.mul(beta_adj, greg)?;
                let v_new = cx.add(av, bg)?;
                let step = if mode == "standard" {
                    v_new
                } else {
                    let av2 = cx.mul(alpha, v_new)?;
                    cx.add(greg, av2)?
                };
                let rs = cx.mul(rd, step)?;
                let x_new = cx.sub(x, rs)?;
                outs[0].push(x_new);
                outs[1].push(v_new);
            }
            _ => {
                let v = all[2 + 2 * n + i];
                let h = all[2 + 3 * n + i];
                let a = float_attr(attrs, "alpha", Some(0.9), at)?;
                let b = float_attr(attrs, "beta", Some(0.999), at)?;
                let eps = cx.scalar(d, float_attr(attrs, "epsilon", Some(0.0), at)?)?;
                let post = float_attr(attrs, "norm_coefficient_post", Some(0.0), at)?;
                let (av, a1) = (cx.scalar(d, a)?, cx.scalar(d, 1.0 - a)?);
                let (bv, b1) = (cx.scalar(d, b)?, cx.scalar(d, 1.0 - b)?);
                let t1 = cx.mul(av, v)?;
                let t2 = cx.mul(a1, greg)?;
                let v_new = cx.add(t1, t2)?;
                let g2 = cx.mul(greg, greg)?;
                let t3 = cx.mul(bv, h)?;
                let t4 = cx.mul(b1, g2)?;
                let h_new = cx.add(t3, t4)?;
                let hs = cx.un(OpKind::Sqrt, h_new)?;
                let hs = cx.add(hs, eps)?;
                // r·sqrt(1 − β^t)/(1 − α^t) when t > 0, else r.
                let one = cx.scalar(d, 1.0)?;
                let bt = cx.bin(OpKind::Pow, bv, tf)?;
                let at_ = cx.bin(OpKind::Pow, av, tf)?;
                let nb = cx.sub(one, bt)?;
                let nb = cx.un(OpKind::Sqrt, nb)?;
                let na = cx.sub(one, at_)?;
                let rn = cx.mul(rd, nb)?;
                let radj = cx.div(rn, na)?;
                let radj = cx.select(t_pos, radj, rd)?;
                let q = cx.div(v_new, hs)?;
                let rq = cx.mul(radj, q)?;
                let x_new = cx.sub(x, rq)?;
                let x_fin = if post != 0.0 {
                    let k = cx.scalar(d, 1.0 - post)?;
                    cx.mul(k, x_new)?
                } else {
                    x_new
                };
                outs[0].push(x_fin);
                outs[1].push(v_new);
                outs[2].push(h_new);
            }
        }
    }
    Ok(outs.into_iter().flatten().collect())
}

fn cast(cx: &mut Cx, v: ValueId, d: DType) -> R<ValueId> {
    let code = d.onnx_code().map(i64::from).ok_or_else(|| cx.at.err(format!("{d} has no ONNX code")))?;
    cx.op(OpKind::Cast, Attrs::default().with("to", Attr::Int(code)), vec![Some(v)])
}

/// A float tensor attribute's values.
fn tensor_attr(attrs: &Attrs, name: &str, at: &At) -> R<Option<Vec<f64>>> {
    match attrs.get(name) {
        None => Ok(None),
        Some(Attr::Tensor(t)) => Ok(Some(t.to_f64_vec())),
        Some(Attr::Floats(v)) => Ok(Some(v.iter().map(|&x| f64::from(x)).collect())),
        Some(o) => Err(at.err(format!("attribute `{name}` is {}, expected a tensor", o.kind_name()))),
    }
}

/// A leaf's path: (node, outcome) pairs from the root.
type Path = Vec<(usize, bool)>;

/// `TreeEnsemble` (see the module docs).
fn tree_ensemble(cx: &mut Cx, attrs: &Attrs, x: ValueId) -> R<ValueId> {
    let at = cx.at;
    let xd = cx.dims(x);
    let d = cx.dtype(x);
    if xd.len() != 2 || !d.is_float() {
        return Err(at.err(format!("X is {} of dims {xd:?}; expected a float [N, features]", d)));
    }
    let req_ints = |name: &str| {
        ints_attr(attrs, name, at)?.ok_or_else(|| at.err(format!("required attribute `{name}` is missing")))
    };
    let req_tensor = |name: &str| {
        tensor_attr(attrs, name, at)?.ok_or_else(|| at.err(format!("required attribute `{name}` is missing")))
    };
    let splits = req_tensor("nodes_splits")?;
    let features = req_ints("nodes_featureids")?;
    let modes: Vec<i64> = match attrs.get("nodes_modes") {
        Some(Attr::Tensor(t)) => t.to_i64_vec().map_err(|e| at.err(e.to_string()))?,
        Some(Attr::Ints(v)) => v.clone(),
        _ => return Err(at.err("required attribute `nodes_modes` is missing")),
    };
    let (tn, fnid) = (req_ints("nodes_truenodeids")?, req_ints("nodes_falsenodeids")?);
    let (tl, fl) = (req_ints("nodes_trueleafs")?, req_ints("nodes_falseleafs")?);
    let targets = req_ints("leaf_targetids")?;
    let weights = req_tensor("leaf_weights")?;
    let roots = req_ints("tree_roots")?;
    let n_targets = int_attr(attrs, "n_targets", 1, at)?;
    let agg = int_attr(attrs, "aggregate_function", 1, at)?;
    let post = int_attr(attrs, "post_transform", 0, at)?;
    let tracks = ints_attr(attrs, "nodes_missing_value_tracks_true", at)?;
    let members = tensor_attr(attrs, "membership_values", at)?;
    let nn = splits.len();
    if [features.len(), modes.len(), tn.len(), fnid.len(), tl.len(), fl.len()].iter().any(|&l| l != nn)
        || targets.len() != weights.len()
        || tracks.as_ref().is_some_and(|t| t.len() != nn)
    {
        return Err(at.err("the nodes_* (and leaf_*) attributes must have one entry per node (leaf)"));
    }
    if post != 0 {
        return Err(at.err(format!("post_transform {post} is not supported (only NONE, 0)")));
    }
    if !(0..=3).contains(&agg) || n_targets < 1 || targets.iter().any(|&t| !(0..n_targets).contains(&t)) {
        return Err(at.err(format!("aggregate_function {agg}, n_targets {n_targets}, leaf_targetids {targets:?}")));
    }
    if features.iter().any(|&f| !(0..xd[1] as i64).contains(&f)) || modes.iter().any(|&m| !(0..=6).contains(&m)) {
        return Err(at.err("a node reads a feature X does not have, or has an unknown mode"));
    }
    // Walk every tree (true branch first, as ONNX's reference builds them, which is also
    // the order the member lists are read in): each leaf's path of (node, outcome).
    let mut member_iter = members.unwrap_or_default().into_iter();
    let mut member_sets: Vec<Option<Vec<f64>>> = vec![None; nn];
    let mut leaves: Vec<(usize, Path)> = Vec::new();
    let nl = weights.len();
    let idx = |v: i64, n: usize, what: &str| {
        usize::try_from(v).ok().filter(|&v| v < n).ok_or_else(|| at.err(format!("{what} {v} out of range")))
    };
    for &root in &roots {
        let r = idx(root, nn.max(nl), "tree root")?;
        let root_is_leaf = r < nn && tl[r] != 0 && fl[r] != 0 && tn[r] == fnid[r];
        if root_is_leaf || r >= nn {
            leaves.push((idx(root, nl, "leaf")?, Vec::new()));
            continue;
        }
        // (node or leaf index, whether a leaf, the path to it)
        let mut stack: Vec<(usize, bool, Path)> = vec![(r, false, Vec::new())];
        let mut steps = 0usize;
        while let Some((node, is_leaf, path)) = stack.pop() {
            steps += 1;
            if steps > 4 * (nn + nl) + 4 || path.len() > nn {
                return Err(at.err("the trees have a cycle"));
            }
            if is_leaf {
                leaves.push((idx(node as i64, nl, "leaf")?, path));
                continue;
            }
            if modes[node] == 6 && member_sets[node].is_none() {
                let mut set = Vec::new();
                for v in member_iter.by_ref() {
                    if v.is_nan() {
                        break;
                    }
                    set.push(v);
                }
                member_sets[node] = Some(set);
            }
            let mut fp = path.clone();
            fp.push((node, false));
            let mut tp = path;
            tp.push((node, true));
            // Pushed false first so the true branch is walked first.
            stack.push((idx(fnid[node], if fl[node] != 0 { nl } else { nn }, "false branch")?, fl[node] != 0, fp));
            stack.push((idx(tn[node], if tl[node] != 0 { nl } else { nn }, "true branch")?, tl[node] != 0, tp));
        }
    }
    let nleaves = leaves.len();
    if nleaves == 0 || nn.saturating_mul(nleaves) > MAX_CONST_ELEMENTS {
        return Err(at.err("the ensemble has no leaves, or too many"));
    }
    let k = nn.max(1);
    // Conditions [N, nodes] as bools.
    let fidx = Tensor::from_vec(Shape::new([k]).map_err(|e| at.err(e.to_string()))?, {
        let mut f = features.clone();
        f.resize(k, 0);
        f
    })
    .map_err(|e| at.err(e.to_string()))?;
    let fidx = cx.imp.add_const("", fidx);
    let xg = cx.op(OpKind::Gather, Attrs::default().with("axis", Attr::Int(1)), vec![Some(x), Some(fidx)])?;
    let mut split_v = splits.clone();
    split_v.resize(k, 0.0);
    let sv = cx.tensor(d, &[k], &split_v)?;
    let mut cond: Option<ValueId> = None;
    let mask = |cx: &mut Cx, pick: &dyn Fn(usize) -> bool| -> R<ValueId> {
        let v: Vec<i64> = (0..k).map(|i| i64::from(i < nn && pick(i))).collect();
        let t = Tensor::from_vec(Shape::new([k]).map_err(|e| cx.at.err(e.to_string()))?, v)
            .map_err(|e| cx.at.err(e.to_string()))?;
        let c = cx.imp.add_const("", t);
        cast(cx, c, DType::Bool)
    };
    for (mode, kind) in [
        (0, OpKind::LessOrEqual),
        (1, OpKind::Less),
        (2, OpKind::GreaterOrEqual),
        (3, OpKind::Greater),
        (4, OpKind::Equal),
        (5, OpKind::Equal),
    ] {
        if !modes.contains(&mode) {
            continue;
        }
        let mut c = cx.bin(kind, xg, sv)?;
        if mode == 5 {
            c = cx.un(OpKind::Not, c)?;
        }
        let m = mask(cx, &|i| modes[i] == mode)?;
        let c = cx.bin(OpKind::And, c, m)?;
        cond = Some(match cond {
            None => c,
            Some(p) => cx.bin(OpKind::Or, p, c)?,
        });
    }
    if modes.contains(&6) {
        let width = member_sets.iter().flatten().map(Vec::len).max().unwrap_or(0).max(1);
        let mut table = vec![f64::NAN; k * width];
        for (i, s) in member_sets.iter().enumerate() {
            for (j, &v) in s.iter().flatten().enumerate() {
                table[i * width + j] = v;
            }
        }
        let tv = cx.tensor(d, &[k, width], &table)?;
        let ax = cx.ints(&[2])?;
        let xu = cx.bin(OpKind::Unsqueeze, xg, ax)?;
        let eq = cx.bin(OpKind::Equal, xu, tv)?;
        let eqf = cast(cx, eq, d)?;
        let ax = cx.ints(&[2])?;
        let any =
            cx.op(OpKind::ReduceMax, Attrs::default().with("keepdims", Attr::Int(0)), vec![Some(eqf), Some(ax)])?;
        let zero = cx.scalar(d, 0.0)?;
        let hit = cx.bin(OpKind::Greater, any, zero)?;
        let m = mask(cx, &|i| modes[i] == 6)?;
        let c = cx.bin(OpKind::And, hit, m)?;
        cond = Some(match cond {
            None => c,
            Some(p) => cx.bin(OpKind::Or, p, c)?,
        });
    }
    if let Some(t) = &tracks {
        if t.iter().any(|&v| v != 0) {
            let nan = cx.un(OpKind::IsNaN, xg)?;
            let m = mask(cx, &|i| t[i] != 0)?;
            let c = cx.bin(OpKind::And, nan, m)?;
            cond = Some(match cond {
                None => c,
                Some(p) => cx.bin(OpKind::Or, p, c)?,
            });
        }
    }
    let cond = match cond {
        Some(c) => c,
        None => {
            let z = cx.scalar(d, 0.0)?;
            cx.bin(OpKind::Greater, xg, z)? // no node: never read (every path is empty)
        }
    };
    let cf = cast(cx, cond, d)?;
    // Leaves reached: Σ conditions met along the path == its length.
    let mut pt = vec![0.0; k * nleaves];
    let mut pf = vec![0.0; k * nleaves];
    let mut plen = vec![0.0; nleaves];
    for (l, (_, path)) in leaves.iter().enumerate() {
        plen[l] = path.len() as f64;
        for &(node, outcome) in path {
            if outcome {
                pt[node * nleaves + l] += 1.0;
            } else {
                pf[node * nleaves + l] += 1.0;
            }
        }
    }
    let ptv = cx.tensor(d, &[k, nleaves], &pt)?;
    let pfv = cx.tensor(d, &[k, nleaves], &pf)?;
    let one = cx.scalar(d, 1.0)?;
    let ncf = cx.sub(one, cf)?;
    let a = cx.bin(OpKind::MatMul, cf, ptv)?;
    let b = cx.bin(OpKind::MatMul, ncf, pfv)?;
    let met = cx.add(a, b)?;
    let lens = cx.tensor(d, &[nleaves], &plen)?;
    let reached = cx.bin(OpKind::Equal, met, lens)?; // [N, leaves]
    let t = n_targets as usize;
    let ntrees = roots.len() as f64;
    match agg {
        0 | 1 => {
            let mut w = vec![0.0; nleaves * t];
            for (l, &(leaf, _)) in leaves.iter().enumerate() {
                w[l * t + targets[leaf] as usize] = if agg == 0 { weights[leaf] / ntrees } else { weights[leaf] };
            }
            let wv = cx.tensor(d, &[nleaves, t], &w)?;
            let rf = cast(cx, reached, d)?;
            cx.bin(OpKind::MatMul, rf, wv)
        }
        _ => {
            let big = if d == DType::F64 { f64::MAX } else { f64::from(f32::MAX) };
            let fill = if agg == 2 { big } else { -big };
            let mut w = vec![fill; nleaves * t];
            let mut own = vec![0i64; nleaves * t];
            for (l, &(leaf, _)) in leaves.iter().enumerate() {
                w[l * t + targets[leaf] as usize] = weights[leaf];
                own[l * t + targets[leaf] as usize] = 1;
            }
            let wv = cx.tensor(d, &[nleaves, t], &w)?;
            let ov = Tensor::from_vec(Shape::new([nleaves, t]).map_err(|e| at.err(e.to_string()))?, own)
                .map_err(|e| at.err(e.to_string()))?;
            let ov = cx.imp.add_const("", ov);
            let ov = cast(cx, ov, DType::Bool)?;
            let ax = cx.ints(&[2])?;
            let r3 = cx.bin(OpKind::Unsqueeze, reached, ax)?; // [N, leaves, 1]
            let sel = cx.bin(OpKind::And, r3, ov)?;
            let fv = cx.scalar(d, fill)?;
            let vals = cx.select(sel, wv, fv)?;
            let ax = cx.ints(&[1])?;
            let kind = if agg == 2 { OpKind::ReduceMin } else { OpKind::ReduceMax };
            let best = cx.op(kind, Attrs::default().with("keepdims", Attr::Int(0)), vec![Some(vals), Some(ax)])?;
            // A target no reached leaf scores is 0, as in ONNX Runtime (ONNX's reference
            // leaves the float type's extreme there).
            let self_ = cast(cx, sel, d)?;
            let ax = cx.ints(&[1])?;
            let any =
                cx.op(OpKind::ReduceMax, Attrs::default().with("keepdims", Attr::Int(0)), vec![Some(self_), Some(ax)])?;
            let zero = cx.scalar(d, 0.0)?;
            let scored = cx.bin(OpKind::Greater, any, zero)?;
            cx.select(scored, best, zero)
        }
    }
}

/// `TfIdfVectorizer` over an integer pool (see the module docs).
fn tfidf(cx: &mut Cx, attrs: &Attrs, x: ValueId) -> R<ValueId> {
    let at = cx.at;
    let xd = cx.dims(x);
    let d = cx.dtype(x);
    if !matches!(d, DType::I32 | DType::I64) || !matches!(xd.len(), 1 | 2) || xd.contains(&0) {
        return Err(at.err(format!("X is {d} of dims {xd:?}; kiln supports int32/int64 [C] or [B, C] (no strings)")));
    }
    if attrs.get("pool_strings").is_some() {
        return Err(at.err("pool_strings: string tensors are not supported"));
    }
    let need = |name: &str| {
        ints_attr(attrs, name, at)?.ok_or_else(|| at.err(format!("required attribute `{name}` is missing")))
    };
    let (minn, maxn, skip) = (
        int_attr(attrs, "min_gram_length", 0, at)?,
        int_attr(attrs, "max_gram_length", 0, at)?,
        int_attr(attrs, "max_skip_count", 0, at)?,
    );
    let counts = need("ngram_counts")?;
    let indexes = need("ngram_indexes")?;
    let pool = need("pool_int64s")?;
    let weights = tensor_attr(attrs, "weights", at)?;
    let mode = match attrs.get("mode") {
        Some(Attr::String(m)) if ["TF", "IDF", "TFIDF"].contains(&m.as_str()) => m.clone(),
        other => return Err(at.err(format!("mode {other:?}: expected TF, IDF or TFIDF"))),
    };
    if minn < 1 || maxn < minn || skip < 0 || indexes.iter().any(|&i| i < 0) || indexes.is_empty() {
        return Err(at.err(format!(
            "min_gram_length {minn}, max_gram_length {maxn}, max_skip_count {skip}, ngram_indexes {indexes:?}"
        )));
    }
    let out_size = *indexes.iter().max().unwrap_or(&0) as usize + 1;
    // Weights apply per output slot (as ONNX Runtime and ONNX's reference read them);
    // a slot past the list weighs 0.
    let weights: Option<Vec<f64>> = weights.map(|mut w| {
        w.resize(out_size, 0.0);
        w
    });
    let (b, l) = if xd.len() == 1 { (1, xd[0]) } else { (xd[0], xd[1]) };
    let x2 = cx.reshape(x, &[b as i64, l as i64])?;
    // Pool n-grams per length, each with its global number (for ngram_indexes).
    let mut per_len: Vec<(usize, usize, Vec<i64>)> = Vec::new(); // (n, first global id, items)
    let mut gid = 0usize;
    for (i, &start) in counts.iter().enumerate() {
        let n = i + 1;
        let end = counts.get(i + 1).copied().unwrap_or(pool.len() as i64);
        let (st, en) = (usize::try_from(start).ok(), usize::try_from(end).ok());
        let (Some(st), Some(en)) = (st, en) else { return Err(at.err("ngram_counts out of range")) };
        if st > en || en > pool.len() || (en - st) % n != 0 {
            return Err(at.err(format!("ngram_counts {counts:?} does not split a pool of {}", pool.len())));
        }
        let g = (en - st) / n;
        if g > 0 && (minn as usize..=maxn as usize).contains(&n) {
            per_len.push((n, gid, pool[st..en].to_vec()));
        }
        gid += g;
    }
    if indexes.len() < gid {
        return Err(at.err(format!("{} ngram_indexes for {gid} pool n-grams", indexes.len())));
    }
    let f = DType::F32;
    let mut parts: Vec<(ValueId, usize, usize)> = Vec::new(); // (counts [B, g], first id, g)
    for (n, first, items) in &per_len {
        let (n, g) = (*n, items.len() / *n);
        let dists: Vec<usize> = if n == 1 { vec![1] } else { (1..=skip as usize + 1).collect() };
        let mut total: Option<ValueId> = None;
        for dist in dists {
            let span = dist * (n - 1);
            if span >= l {
                continue;
            }
            let p = l - span;
            let mut all: Option<ValueId> = None;
            for j in 0..n {
                let (st, en, ax) = (cx.ints(&[(j * dist) as i64])?, cx.ints(&[(j * dist + p) as i64])?, cx.ints(&[1])?);
                let sl = cx.op(OpKind::Slice, Attrs::default(), vec![Some(x2), Some(st), Some(en), Some(ax)])?;
                let ax = cx.ints(&[2])?;
                let su = cx.bin(OpKind::Unsqueeze, sl, ax)?; // [B, P, 1]
                let col: Vec<i64> = (0..g).map(|k| items[k * n + j]).collect();
                let ct = Tensor::from_i64(d, Shape::new([g]).map_err(|e| at.err(e.to_string()))?, &col)
                    .map_err(|e| at.err(e.to_string()))?;
                let cv = cx.imp.add_const("", ct);
                let eq = cx.bin(OpKind::Equal, su, cv)?; // [B, P, g]
                all = Some(match all {
                    None => eq,
                    Some(a) => cx.bin(OpKind::And, a, eq)?,
                });
            }
            let Some(all) = all else { continue };
            let fl = cast(cx, all, f)?;
            let ax = cx.ints(&[1])?;
            let c =
                cx.op(OpKind::ReduceSum, Attrs::default().with("keepdims", Attr::Int(0)), vec![Some(fl), Some(ax)])?;
            total = Some(match total {
                None => c,
                Some(t) => cx.add(t, c)?,
            });
        }
        if let Some(t) = total {
            parts.push((t, *first, g));
        }
    }
    let out_dims: Vec<i64> = if xd.len() == 1 { vec![out_size as i64] } else { vec![b as i64, out_size as i64] };
    if parts.is_empty() {
        let zeros = cx.tensor(f, &[b, out_size], &vec![0.0; b * out_size])?;
        return cx.reshape(zeros, &out_dims);
    }
    let width: usize = parts.iter().map(|p| p.2).sum();
    let mut m = vec![0.0; width * out_size];
    let mut row = 0;
    for &(_, first, g) in &parts {
        for k in 0..g {
            m[row * out_size + indexes[first + k] as usize] = 1.0;
            row += 1;
        }
    }
    let cat = if parts.len() == 1 {
        parts[0].0
    } else {
        let ins = parts.iter().map(|p| Some(p.0)).collect();
        cx.op(OpKind::Concat, Attrs::default().with("axis", Attr::Int(1)), ins)?
    };
    let mv = cx.tensor(f, &[width, out_size], &m)?;
    let freq = cx.bin(OpKind::MatMul, cat, mv)?; // [B, out]
    let y = match (mode.as_str(), &weights) {
        ("TF", _) => freq,
        ("IDF", w) => {
            let zero = cx.scalar(f, 0.0)?;
            let seen = cx.bin(OpKind::Greater, freq, zero)?;
            let w = match w {
                Some(w) => cx.tensor(f, &[out_size], &w[..out_size])?,
                None => cx.scalar(f, 1.0)?,
            };
            cx.select(seen, w, zero)?
        }
        (_, Some(w)) => {
            let wv = cx.tensor(f, &[out_size], &w[..out_size])?;
            cx.mul(freq, wv)?
        }
        (_, None) => freq,
    };
    cx.reshape(y, &out_dims)
}

/// `com.microsoft` `DynamicQuantizeLSTM` → `[Y, Y_h, Y_c]` (see the module docs).
fn dynamic_quantize_lstm(cx: &mut Cx, attrs: &Attrs, inputs: &[Option<ValueId>], n_out: usize) -> R<Vec<ValueId>> {
    let at = cx.at;
    let input = |i: usize| inputs.get(i).copied().flatten();
    let need = |i: usize, what: &str| input(i).ok_or_else(|| at.err(format!("{what} (operand {i}) is missing")));
    let (x, w, r) = (need(0, "X")?, need(1, "W")?, need(2, "R")?);
    let (ws, wz, rs, rz) =
        (need(8, "W_scale")?, need(9, "W_zero_point")?, need(10, "R_scale")?, need(11, "R_zero_point")?);
    for (i, what) in [(4, "sequence_lens"), (7, "P (peepholes)")] {
        if input(i).is_some() {
            return Err(at.err(format!("unsupported: {what} (operand {i})")));
        }
    }
    if attrs.get("clip").is_some() || int_attr(attrs, "input_forget", 0, at)? != 0 {
        return Err(at.err("unsupported: attribute `clip` or `input_forget`"));
    }
    if let Some(Attr::Strings(a)) = attrs.get("activations") {
        let default = ["sigmoid", "tanh", "tanh"];
        if a.len() % 3 != 0 || a.iter().enumerate().any(|(k, s)| !s.eq_ignore_ascii_case(default[k % 3])) {
            return Err(at.err(format!("unsupported: activations {a:?} (only Sigmoid, Tanh, Tanh)")));
        }
    }
    let direction = match attrs.get("direction") {
        None => "forward".to_string(),
        Some(Attr::String(s)) => s.clone(),
        Some(o) => return Err(at.err(format!("attribute `direction` is {}, expected a string", o.kind_name()))),
    };
    let dirs: Vec<bool> = match direction.as_str() {
        "forward" => vec![false],
        "reverse" => vec![true],
        "bidirectional" => vec![false, true],
        d => return Err(at.err(format!("attribute `direction` is `{d}`; expected forward, reverse or bidirectional"))),
    };
    let hidden = int_attr(attrs, "hidden_size", 0, at)?;
    let (xd, wd, rd) = (cx.dims(x), cx.dims(w), cx.dims(r));
    let nd = dirs.len();
    let hs = usize::try_from(hidden).map_err(|_| at.err(format!("hidden_size {hidden}")))?;
    if xd.len() != 3 || wd.len() != 3 || rd.len() != 3 || hs == 0 {
        return Err(at.err(format!(
            "X {xd:?}, W {wd:?}, R {rd:?}, hidden_size {hs}: expected rank-3 X, W, R and hidden_size > 0"
        )));
    }
    let (seq, batch, isz) = (xd[0], xd[1], xd[2]);
    if wd != [nd, isz, 4 * hs] || rd != [nd, hs, 4 * hs] {
        return Err(at.err(format!(
            "W {wd:?} and R {rd:?}: expected [{nd}, {isz}, {}] and [{nd}, {hs}, {}]",
            4 * hs,
            4 * hs
        )));
    }
    if !cx.dtype(x).is_float() || cx.dtype(x) != DType::F32 {
        return Err(at.err(format!("X is {}; expected f32", cx.dtype(x))));
    }
    for (v, what) in [(ws, "W_scale"), (wz, "W_zero_point"), (rs, "R_scale"), (rz, "R_zero_point")] {
        let d = cx.dims(v);
        if !(d == [nd] || d == [nd, 4 * hs]) {
            return Err(at.err(format!("{what} {d:?}: expected [{nd}] or [{nd}, {}]", 4 * hs)));
        }
    }
    let to = |d: DType| -> R<Attrs> {
        let code = d.onnx_code().ok_or_else(|| at.err(format!("{d} has no ONNX code")))?;
        Ok(Attrs::default().with("to", Attr::Int(code.into())))
    };
    let (to_f32, axis0, axis1) =
        (to(DType::F32)?, Attrs::default().with("axis", Attr::Int(0)), Attrs::default().with("axis", Attr::Int(1)));
    // Operand `v`'s slice for direction `d` along axis 0 (rank drops by one).
    let pick = |cx: &mut Cx, v: ValueId, d: usize| -> R<ValueId> {
        let i = cx.scalar(DType::I64, d as f64)?;
        cx.op(OpKind::Gather, Attrs::default().with("axis", Attr::Int(0)), vec![Some(v), Some(i)])
    };
    // Columns [lo, hi) of a 2-D value (the bounds' constants made once).
    let (ax0, ax1) = (cx.ints(&[0])?, cx.ints(&[1])?);
    let mut bounds: HashMap<usize, ValueId> = HashMap::new();
    for b in (0..=8).map(|k| k * hs) {
        let v = cx.ints(&[b as i64])?;
        bounds.insert(b, v);
    }
    let cols = |cx: &mut Cx, v: ValueId, lo: usize, hi: usize| -> R<ValueId> {
        let (s, e) = (bounds[&lo], bounds[&hi]);
        cx.op(OpKind::Slice, Attrs::default(), vec![Some(v), Some(s), Some(e), Some(ax1)])
    };
    // u8 DynamicQuantizeLinear of `a`: the quantized value, its scale and zero point.
    let dynamic_quantize = |cx: &mut Cx, a: ValueId| -> R<(ValueId, ValueId, ValueId)> {
        let q = cx.imp.emit(
            "",
            OpKind::DynamicQuantizeLinear,
            Attrs::default(),
            vec![Some(a)],
            &[String::new(), String::new(), String::new()],
            cx.at,
        )?;
        Ok((q[0], q[1], q[2]))
    };
    // u8 DynamicQuantizeLinear, then MatMulInteger with `b`, in f32 times `s·s_b`.
    let qmatmul = |cx: &mut Cx, a: ValueId, b: ValueId, sb: ValueId, zb: ValueId| -> R<ValueId> {
        let (aq, sa, za) = dynamic_quantize(cx, a)?;
        let acc = cx.op(OpKind::MatMulInteger, Attrs::default(), vec![Some(aq), Some(b), Some(za), Some(zb)])?;
        let accf = cx.op(OpKind::Cast, to_f32.clone(), vec![Some(acc)])?;
        let m = cx.mul(sa, sb)?;
        cx.mul(accf, m)
    };
    // The recurrent product the other way round: `(Rᵀ · h_qᵀ)ᵀ`, `Rᵀ` `[4·hidden, hidden]`
    // (the direction's weight transposed, once, here where it is a constant) with its
    // zero point per row, the quantized state a column per batch row, `s_h·s_r` per row:
    // the same i32 sums and the same f32 products as `h_q · R`. A recurrence multiplies a
    // few state rows by a large constant weight at every step; as the left operand the
    // weight is read in place, row by row along the reduction (one column: a matrix-vector
    // kernel), where as the right one each step's product would first interleave the
    // whole weight for its tiles.
    let qmatmul_t = |cx: &mut Cx, a: ValueId, bt: ValueId, sb: ValueId, zb: ValueId| -> R<ValueId> {
        let (aq, sa, za) = dynamic_quantize(cx, a)?;
        let rows = 4 * hs;
        let aqt = if batch == 1 { cx.reshape(aq, &[hs as i64, 1])? } else { cx.transpose(aq, &[1, 0])? };
        let acc = cx.op(OpKind::MatMulInteger, Attrs::default(), vec![Some(bt), Some(aqt), Some(zb), Some(za)])?;
        let accf = cx.op(OpKind::Cast, to_f32.clone(), vec![Some(acc)])?;
        let sb = if cx.dims(sb).is_empty() { sb } else { cx.reshape(sb, &[rows as i64, 1])? };
        let m = cx.mul(sa, sb)?;
        let st = cx.mul(accf, m)?;
        if batch == 1 {
            cx.reshape(st, &[1, rows as i64])
        } else {
            cx.transpose(st, &[1, 0])
        }
    };
    // Direction `d`'s `R` transposed to `[4·hidden, hidden]`: a new constant where `R` is
    // one, else a Transpose.
    let transposed = |cx: &mut Cx, d: usize| -> R<ValueId> {
        if let Some(t) = cx.imp.g.constant(r) {
            let es = t.dtype().storage_bytes(1);
            let src = t.bytes();
            let (k, n) = (hs, 4 * hs);
            if es > 0 && src.len() == nd * k * n * es {
                let base = d * k * n * es;
                let mut out = vec![0u8; k * n * es];
                for j in 0..n {
                    for i in 0..k {
                        let from = base + (i * n + j) * es;
                        out[(j * k + i) * es..(j * k + i + 1) * es].copy_from_slice(&src[from..from + es]);
                    }
                }
                let shape = Shape::new(vec![n, k]).map_err(|e| at.err(e.to_string()))?;
                let tt = Tensor::new(kiln_ir::TensorType::new(t.dtype(), shape), out.into())
                    .map_err(|e| at.err(e.to_string()))?;
                return Ok(cx.imp.add_const("", tt));
            }
        }
        let rd = pick(cx, r, d)?;
        cx.transpose(rd, &[1, 0])
    };
    let x2 = cx.reshape(x, &[(seq * batch) as i64, isz as i64])?;
    let (mut ys, mut yhs, mut ycs) = (Vec::new(), Vec::new(), Vec::new());
    for (d, &reverse) in dirs.iter().enumerate() {
        let (wdir, rdir) = (pick(cx, w, d)?, transposed(cx, d)?);
        let (wsd, wzd, rsd, rzd) = (pick(cx, ws, d)?, pick(cx, wz, d)?, pick(cx, rs, d)?, pick(cx, rz, d)?);
        let proj = qmatmul(cx, x2, wdir, wsd, wzd)?;
        let bias = match input(3) {
            None => None,
            Some(b) => {
                if cx.dims(b) != [nd, 8 * hs] {
                    return Err(at.err(format!("B {:?}: expected [{nd}, {}]", cx.dims(b), 8 * hs)));
                }
                let bd = pick(cx, b, d)?;
                let bd = cx.reshape(bd, &[1, (8 * hs) as i64])?;
                let (wb, rb) = (cols(cx, bd, 0, 4 * hs)?, cols(cx, bd, 4 * hs, 8 * hs)?);
                Some(cx.add(wb, rb)?)
            }
        };
        let state = |cx: &mut Cx, i: usize| -> R<ValueId> {
            match input(i) {
                Some(v) => {
                    if cx.dims(v) != [nd, batch, hs] {
                        return Err(at.err(format!(
                            "initial state (operand {i}) {:?}: expected [{nd}, {batch}, {hs}]",
                            cx.dims(v)
                        )));
                    }
                    pick(cx, v, d)
                }
                None => cx.tensor(DType::F32, &[batch, hs], &vec![0.0; batch * hs]),
            }
        };
        let (mut h, mut c) = (state(cx, 5)?, state(cx, 6)?);
        let mut hs_t = vec![None; seq];
        for step in 0..seq {
            let t = if reverse { seq - 1 - step } else { step };
            let rows = cx.ints(&[(t * batch) as i64])?;
            let rows_end = cx.ints(&[((t + 1) * batch) as i64])?;
            let p = cx.op(OpKind::Slice, Attrs::default(), vec![Some(proj), Some(rows), Some(rows_end), Some(ax0)])?;
            let s = qmatmul_t(cx, h, rdir, rsd, rzd)?;
            let mut g = cx.add(p, s)?;
            if let Some(b) = bias {
                g = cx.add(g, b)?;
            }
            let gate = |cx: &mut Cx, k: usize, kind: OpKind| -> R<ValueId> {
                let v = cols(cx, g, k * hs, (k + 1) * hs)?;
                cx.un(kind, v)
            };
            let (i, o, f, cc) = (
                gate(cx, 0, OpKind::Sigmoid)?,
                gate(cx, 1, OpKind::Sigmoid)?,
                gate(cx, 2, OpKind::Sigmoid)?,
                gate(cx, 3, OpKind::Tanh)?,
            );
            let (cf, ic) = (cx.mul(c, f)?, cx.mul(i, cc)?);
            c = cx.add(cf, ic)?;
            let tc = cx.un(OpKind::Tanh, c)?;
            h = cx.mul(tc, o)?;
            hs_t[t] = Some(h);
        }
        let parts: Vec<Option<ValueId>> = hs_t
            .into_iter()
            .map(|v| v.map(|v| cx.reshape(v, &[1, 1, batch as i64, hs as i64])).transpose())
            .collect::<R<_>>()?;
        ys.push(if seq == 1 { parts[0] } else { Some(cx.op(OpKind::Concat, axis0.clone(), parts)?) });
        yhs.push(Some(cx.reshape(h, &[1, batch as i64, hs as i64])?));
        ycs.push(Some(cx.reshape(c, &[1, batch as i64, hs as i64])?));
    }
    let join = |cx: &mut Cx, v: Vec<Option<ValueId>>, a: &Attrs| -> R<ValueId> {
        match v.as_slice() {
            [Some(one)] => Ok(*one),
            _ => cx.op(OpKind::Concat, a.clone(), v),
        }
    };
    let mut out = vec![join(cx, ys, &axis1)?];
    if n_out > 1 {
        out.push(join(cx, yhs, &axis0)?);
    }
    if n_out > 2 {
        out.push(join(cx, ycs, &axis0)?);
    }
    Ok(out)
}
