//! `tensor-fold-quantized-contractions`: a static-int8 (QDQ) graph's contractions as
//! integer ops.
//!
//! A QDQ model keeps its contractions in float between explicit (de)quantisations:
//!
//! ```text
//! y_q = QuantizeLinear(Conv(DequantizeLinear(x_q, s_x, z_x),
//!                           DequantizeLinear(w_q, s_w, z_w),
//!                           DequantizeLinear(b_q: i32, s_x·s_w, 0)), s_y, z_y)
//! ```
//!
//! ONNX Runtime executes that pattern as one `QLinearConv(x_q, s_x, z_x, w_q, s_w, z_w,
//! s_y, z_y, b_q)` (its QDQ transformer), an integer product requantised once, and so
//! does this pass (`MatMul` the same way into `QLinearMatMul`). The result is the integer
//! execution's, not the float simulation's: the two differ where the float sum's rounding
//! or `y / s_y` vs `acc · (s_x·s_w / s_y)` moves a value across a rounding boundary, by
//! one quantisation step (the model tests count those against ONNX Runtime, which runs
//! the integer form). Integer ops then lower to integer contractions
//! (`kiln_flow::contraction::IntContraction`), which the CPU runs as `vpdpbusd` tiles.
//!
//! Matched: the product's only reader is the QuantizeLinear (per tensor, an 8-bit zero
//! point, not blocked) and its result no graph output; each operand a DequantizeLinear
//! (read by other nodes too or not: ONNX Runtime 1.x leaves a product float where the
//! dequantised input was shared, which on efficientword's ResNet-50 changes no block
//! output against the integer form and costs 5 ms a call, so this pass does not follow
//! it) of
//! `u8`/`i8` (not blocked): `x`/`a` per tensor, `w` per tensor or per output channel
//! (axis 0), `b` of a MatMul per tensor or per column (its last axis); a Conv's bias the
//! DequantizeLinear of an `i32` constant with zero point 0 and scale `s_x·s_w` (as f32,
//! within a relative 10⁻⁶: what ONNX Runtime's fusion assumes). Absent zero points become
//! zero constants. Anything else stays float.
//!
//! A Relu or a Clip with constant bounds between the product and the QuantizeLinear
//! (ONNX Runtime fuses it into QLinearConv too) is folded as well: the integer op, then a
//! saturating integer Clip at the quantised bounds (exact, see `fold_clamped`), which
//! the integer contraction's epilogue applies.
//!
//! With the graph's [`QuantSemantics`] `OnnxRuntimeCpu` (ONNX models),
//! `QuantizeLinear(GlobalAveragePool(DequantizeLinear(x)))` is ONNX Runtime's
//! `QLinearGlobalAveragePool` where ONNX Runtime fuses it (input and output of one type
//! once ONNX Runtime has turned each int8 QuantizeLinear→DequantizeLinear pair with a
//! single consumer into uint8, [`ort_uint8_values`]): an integer sum, one f32 rescale by
//! `s_x / (s_y·f32(N))`, rounded half to even, plus the zero point, saturated. Here it
//! becomes that arithmetic in exact float ops ([`global_average_pool_as_integer`]): the
//! sum of at most 2^24/255 integers is exact in f32, so the result is ONNX Runtime's bit
//! for bit, where the float form (the mean of dequantised values, divided by `s_y`)
//! rounds differently. (`Integer`, LiteRT's semantics for TFLite models, keeps the float
//! form: LiteRT's int8 mean rounds its own way.)
//!
//! Every matching Conv/MatMul folds, whatever the semantics. ONNX Runtime on x86 fuses
//! only those whose activations are uint8 in and out after that conversion (on
//! efficientword's ResNet-50, 33 of 53) and runs the others as DequantizeLinear → f32
//! Conv → QuantizeLinear; their results differ from the integer ones only where ONNX
//! Runtime's f32 sum lands across a rounding boundary from the exact value (its
//! summation error, not a different formula), so the integer form, exact and faster, is
//! kept for them.
//!
//! Then every depthwise QLinearConv (one input channel a group, constant parameters),
//! folded here or imported as one, becomes exact float arithmetic (`depthwise_as_float`):
//! the integer microkernel needs its `B` operand independent of the rows, which a
//! depthwise input is not, so the integer form would run on the scalar general path,
//! while the float form runs on the depthwise window microkernel with the same result.

use crate::rewrite::Action;
use crate::{Pass, PassError};
use kiln_ir::attrs::{ConvAttrs, DequantizeAttrs, QuantizeAttrs};
use kiln_ir::{DType, Graph, Node, NodeId, Op, OpKind, QuantSemantics, Shape, Tensor, ValueId};
use std::collections::{HashMap, HashSet};

/// `tensor-fold-quantized-contractions` (see the module docs).
pub struct FoldQuantizedContractions;

/// A DequantizeLinear's operands.
struct Dq {
    q: ValueId,
    scale: ValueId,
    zero: Option<ValueId>,
    axis: i64,
}

fn dq_of(g: &Graph, producer: &HashMap<ValueId, NodeId>, v: ValueId, dtypes: &[DType]) -> Option<Dq> {
    let n = &g.nodes[*producer.get(&v)?];
    if n.op.kind != OpKind::DequantizeLinear || n.outputs.len() != 1 {
        return None;
    }
    let attrs = n.op.attrs_of::<DequantizeAttrs>().ok()?;
    let q = (*n.inputs.first()?)?;
    let scale = (*n.inputs.get(1)?)?;
    if attrs.block_size != 0 || !dtypes.contains(&g.ty(q).dtype) || g.ty(scale).dtype != DType::F32 {
        return None;
    }
    let zero = n.inputs.get(2).copied().flatten();
    Some(Dq { q, scale, zero, axis: attrs.axis })
}

fn numel(g: &Graph, v: ValueId) -> usize {
    g.ty(v).shape.numel()
}

/// Per tensor: one scale, one zero point (or none).
fn per_tensor(g: &Graph, d: &Dq) -> bool {
    numel(g, d.scale) == 1 && d.zero.is_none_or(|z| numel(g, z) == 1)
}

/// Per tensor, or `n` values along axis `axis` of a rank-`rank` operand.
fn per_axis(g: &Graph, d: &Dq, rank: usize, axis: usize, n: usize) -> bool {
    let a = if d.axis < 0 { d.axis + rank as i64 } else { d.axis };
    let along = a == axis as i64 && numel(g, d.scale) == n && d.zero.is_none_or(|z| numel(g, z) == n);
    per_tensor(g, d) || along
}

/// The zero point of `d`, or a new scalar zero of its operand's dtype.
fn zero_of(g: &mut Graph, d: &Dq) -> Option<ValueId> {
    if let Some(z) = d.zero {
        return Some(z);
    }
    let dtype = g.ty(d.q).dtype;
    let name = format!("{}.zero_point", g.values[d.q].name);
    Some(g.add_const(name, Tensor::from_i64(dtype, Shape::new(vec![]).ok()?, &[0]).ok()?))
}

/// Whether the constant bias scale is `s_x · s_w` (per channel) within 10⁻⁶, and its zero
/// point is 0.
fn bias_fits(g: &Graph, b: &Dq, sx: ValueId, sw: ValueId, m: usize) -> bool {
    let f = |v: ValueId| g.constant(v).map(|t| t.to_f64_vec());
    let (Some(sb), Some(sx), Some(sw)) = (f(b.scale), f(sx), f(sw)) else { return false };
    let zero_ok = match b.zero {
        None => true,
        Some(z) => g.constant(z).is_some_and(|t| t.to_f64_vec().iter().all(|&x| x == 0.0)),
    };
    let at = |v: &[f64], i: usize| if v.len() == 1 { v.first().copied() } else { v.get(i).copied() };
    zero_ok
        && (0..m).all(|i| match (at(&sb, i), at(&sx, 0), at(&sw, i)) {
            (Some(b), Some(x), Some(w)) => {
                let p = (x as f32 * w as f32) as f64;
                (b - p).abs() <= 1e-6 * p.abs()
            }
            _ => false,
        })
}

/// The integer op for the QuantizeLinear node `qn` (of `g`), when it ends the pattern.
fn fold(
    g: &mut Graph,
    qn: &Node,
    producer: &HashMap<ValueId, NodeId>,
    readers: &HashMap<ValueId, usize>,
) -> Option<(Op, Vec<Option<ValueId>>)> {
    let attrs = qn.op.attrs_of::<QuantizeAttrs>().ok()?;
    let y = (*qn.inputs.first()?)?;
    let sy = (*qn.inputs.get(1)?)?;
    let zy = qn.inputs.get(2).copied().flatten()?;
    let int8 = [DType::U8, DType::I8];
    if attrs.block_size != 0
        || attrs.precision != 0
        || numel(g, sy) != 1
        || numel(g, zy) != 1
        || g.ty(sy).dtype != DType::F32
        || !int8.contains(&g.ty(zy).dtype)
        || readers.get(&y) != Some(&1)
        || g.outputs.contains(&y)
    {
        return None;
    }
    let pn = g.nodes[*producer.get(&y)?].clone();
    if pn.outputs.len() != 1 {
        return None;
    }
    // A Relu or constant Clip between the product and the QuantizeLinear: the fold is
    // the caller's (`fold_clamped`), through the product beneath it.
    if matches!(pn.op.kind, OpKind::Relu | OpKind::Clip) {
        return None;
    }
    let input = |i: usize| pn.inputs.get(i).copied().flatten();
    match pn.op.kind {
        OpKind::Conv => {
            let dx = dq_of(g, producer, input(0)?, &int8)?;
            let dw = dq_of(g, producer, input(1)?, &int8)?;
            let wdims = g.ty(dw.q).shape.dims().to_vec();
            let m = *wdims.first()?;
            if !per_tensor(g, &dx) || !per_axis(g, &dw, wdims.len(), 0, m) {
                return None;
            }
            let bias = match input(2) {
                None => None,
                Some(b) => {
                    let db = dq_of(g, producer, b, &[DType::I32])?;
                    if g.constant(db.q).is_none() || !bias_fits(g, &db, dx.scale, dw.scale, m) {
                        return None;
                    }
                    Some(db.q)
                }
            };
            let op = Op::with_typed(OpKind::QLinearConv, pn.op.attrs_of::<ConvAttrs>().ok()?.clone()).ok()?;
            let (zx, zw) = (zero_of(g, &dx)?, zero_of(g, &dw)?);
            let mut inputs =
                vec![Some(dx.q), Some(dx.scale), Some(zx), Some(dw.q), Some(dw.scale), Some(zw), Some(sy), Some(zy)];
            if bias.is_some() {
                inputs.push(bias);
            }
            Some((op, inputs))
        }
        OpKind::MatMul => {
            let da = dq_of(g, producer, input(0)?, &int8)?;
            let db = dq_of(g, producer, input(1)?, &int8)?;
            let bdims = g.ty(db.q).shape.dims().to_vec();
            let n = *bdims.last()?;
            if !per_tensor(g, &da) || bdims.len() < 2 || !per_axis(g, &db, bdims.len(), bdims.len() - 1, n) {
                return None;
            }
            let (za, zb) = (zero_of(g, &da)?, zero_of(g, &db)?);
            let inputs =
                vec![Some(da.q), Some(da.scale), Some(za), Some(db.q), Some(db.scale), Some(zb), Some(sy), Some(zy)];
            Some((Op::new(OpKind::QLinearMatMul), inputs))
        }
        _ => None,
    }
}

/// The bounds of a Relu, or of a Clip with constant f32 scalar bounds (absent: open).
fn clamp_bounds(g: &Graph, n: &Node) -> Option<(f32, f32)> {
    match n.op.kind {
        OpKind::Relu => Some((0.0, f32::INFINITY)),
        OpKind::Clip => {
            let bound = |i: usize, open: f32| match n.inputs.get(i).copied().flatten() {
                None => Some(open),
                Some(v) => {
                    let t = g.constant(v)?;
                    (t.dtype() == DType::F32 && t.ty().shape.numel() == 1).then(|| t.to_f64_vec()[0] as f32)
                }
            };
            let (lo, hi) = (bound(1, f32::NEG_INFINITY)?, bound(2, f32::INFINITY)?);
            (!lo.is_nan() && !hi.is_nan() && lo <= hi).then_some((lo, hi))
        }
        _ => None,
    }
}

/// `QuantizeLinear(act(product))` with `act` a Relu or constant Clip (ONNX Runtime's
/// QDQ form of a convolution with a fused activation): the activation node becomes the
/// integer op (its result retyped to the quantized type) and the QuantizeLinear a
/// saturating integer `Clip(q, Q(lo), Q(hi))`. Exact: quantisation `Q` is monotone
/// (a positive constant scale), and a monotone `Q` commutes with a clamp,
/// `Q(clamp(y, lo, hi)) = clamp(Q(y), Q(lo), Q(hi))`. The integer clamp is an epilogue
/// of the integer contraction (`kiln-codegen`'s `cpu::qgemm`). Returns whether it folded.
fn fold_clamped(
    g: &mut Graph,
    qid: NodeId,
    producer: &HashMap<ValueId, NodeId>,
    readers: &HashMap<ValueId, usize>,
) -> Option<()> {
    let qn = g.nodes[qid].clone();
    let r = (*qn.inputs.first()?)?;
    let aid = *producer.get(&r)?;
    let an = g.nodes[aid].clone();
    let (lo, hi) = clamp_bounds(g, &an)?;
    let y = (*an.inputs.first()?)?;
    let once = |v: ValueId| readers.get(&v) == Some(&1) && !g.outputs.contains(&v);
    if !once(y) || !once(r) || an.outputs.len() != 1 {
        return None;
    }
    let sy = g.constant((*qn.inputs.get(1)?)?)?.to_f64_vec();
    let zq = qn.inputs.get(2).copied().flatten()?;
    let zy = g.constant(zq)?.to_f64_vec();
    let (&[s], &[z]) = (sy.as_slice(), zy.as_slice()) else { return None };
    let s = s as f32;
    if !(s > 0.0 && s.is_finite()) {
        return None;
    }
    let out_ty = g.ty(qn.outputs[0]).clone();
    let (tmin, tmax) = match out_ty.dtype {
        DType::I8 => (-128.0f32, 127.0f32),
        DType::U8 => (0.0, 255.0),
        _ => return None,
    };
    // QuantizeLinear's arithmetic: round half to even of x / s, plus z, saturated.
    let q = |x: f32| ((x / s).round_ties_even() + z as f32).clamp(tmin, tmax) as i64;
    // The pattern as if the QuantizeLinear read the product: fold it into a scratch
    // copy of the QuantizeLinear node.
    let mut as_if = qn.clone();
    as_if.inputs[0] = Some(y);
    let mut readers2 = readers.clone();
    readers2.insert(y, 1);
    let (op, inputs) = fold(g, &as_if, producer, &readers2)?;
    let dtype = out_ty.dtype;
    let scalar = |g: &mut Graph, name: String, v: i64| -> Option<ValueId> {
        Some(g.add_const(name, Tensor::from_i64(dtype, Shape::new(vec![]).ok()?, &[v]).ok()?))
    };
    let name = g.values[qn.outputs[0]].name.clone();
    let qlo = scalar(g, format!("{name}.clamp_lo"), q(lo))?;
    let qhi = scalar(g, format!("{name}.clamp_hi"), q(hi))?;
    // The activation's place takes the integer op (everything it reads is a constant
    // or defined before the product); the QuantizeLinear's, the clamp.
    g.values[r].ty = out_ty;
    g.nodes[aid].op = op;
    g.nodes[aid].inputs = inputs;
    g.nodes[qid].op = Op::new(OpKind::Clip);
    g.nodes[qid].inputs = vec![Some(r), Some(qlo), Some(qhi)];
    Some(())
}

/// A depthwise `QLinearConv` (one input channel a group, each feeding one output
/// channel or, with a depth multiplier, several: then the input's channels are repeated
/// first; constant weights, scales, zero points and bias) in exact float arithmetic, the form the depthwise microkernel runs
/// (the integer contraction microkernel needs `B` independent of the rows, which a
/// depthwise convolution's input is not):
///
/// ```text
/// y = QuantizeLinear(Conv(f32(x) − z_x, f32(w − z_w), f32(b)) · m, 1, z_y),
///     m[c] = f32(s_x·s_w[c]) / s_y  (f32, as the integer lowering computes it)
/// ```
///
/// Every product and partial sum is an integer below 2^24 (checked on the constant
/// weights and bias: `Σ|w − z_w|·255 + |b|`), so the f32 convolution is the i32
/// accumulator exactly, in any order; `QuantizeLinear` with scale 1 is the lowering's
/// `round(acc·m) + z_y`, saturated. The result equals the integer op's bit for bit.
fn depthwise_as_float(
    g: &mut Graph,
    n: &Node,
    inputs: &[Option<ValueId>],
    out: (String, kiln_ir::TensorType),
) -> Option<ValueId> {
    if n.op.kind != OpKind::QLinearConv || n.outputs.len() != 1 {
        return None;
    }
    let attrs = n.op.attrs_of::<ConvAttrs>().ok()?.clone();
    let input = |i: usize| inputs.get(i).copied().flatten();
    let (x, wq) = (input(0)?, input(3)?);
    let xd = g.ty(x).shape.dims().to_vec();
    let wd = g.ty(wq).shape.dims().to_vec();
    let (c, m) = (*xd.get(1)?, *wd.first()?);
    let group = usize::try_from(attrs.group).ok()?;
    if xd.len() < 3 || wd.get(1) != Some(&1) || group != c || c < 2 || m % c != 0 {
        return None;
    }
    // A depth multiplier k = M/C > 1 (each input channel feeding k output channels):
    // the input's channels repeated k times, then a depthwise convolution over M.
    let k = m / c;
    let cst = |i: usize| g.constant(input(i)?).map(|t| t.to_f64_vec());
    let (sx, zx, w, sw, zw, sy, zy) = (cst(1)?, cst(2)?, cst(3)?, cst(4)?, cst(5)?, cst(6)?, cst(7)?);
    let bias = match input(8) {
        None => vec![0.0; m],
        Some(_) => cst(8)?,
    };
    let (&[sx], &[zx], &[sy], &[_]) = (sx.as_slice(), zx.as_slice(), sy.as_slice(), zy.as_slice()) else { return None };
    let at = |v: &[f64], i: usize| if v.len() == 1 { v.first().copied() } else { v.get(i).copied() };
    let taps = w.len() / m;
    let mut wf = Vec::with_capacity(w.len());
    let mut mult = Vec::with_capacity(m);
    for ch in 0..m {
        let (zw, sw, b) = (at(&zw, ch)?, at(&sw, ch)?, *bias.get(ch)?);
        let row = w.get(ch * taps..(ch + 1) * taps)?;
        let bound = row.iter().map(|&v| (v - zw).abs() * 255.0).sum::<f64>() + b.abs();
        if bound >= (1u64 << 24) as f64 {
            return None;
        }
        wf.extend(row.iter().map(|&v| v - zw));
        mult.push(((sx as f32 * sw as f32) / sy as f32) as f64);
    }
    let name = n.name.clone();
    let shape = |dims: &[usize]| Shape::new(dims.to_vec()).ok();
    let fconst = |g: &mut Graph, suffix: &str, dims: &[usize], v: &[f64]| -> Option<ValueId> {
        Some(g.add_const(format!("{name}.{suffix}"), Tensor::from_f64(DType::F32, shape(dims)?, v).ok()?))
    };
    let wv = fconst(g, "float_weight", &wd, &wf)?;
    let bv = fconst(g, "float_bias", &[m], &bias)?;
    let mut mdims = vec![m];
    mdims.extend(std::iter::repeat_n(1, xd.len() - 2));
    let mv = fconst(g, "multiplier", &mdims, &mult)?;
    let zxv = fconst(g, "float_zero_point", &[], &[zx])?;
    let one = fconst(g, "unit_scale", &[], &[1.0])?;
    let f32ty = |d: &[usize]| Some(kiln_ir::TensorType::new(DType::F32, shape(d)?));
    let ydims = out.1.shape.dims().to_vec();
    let step = |g: &mut Graph, what: &str, op: Op, ins: Vec<Option<ValueId>>, dims: &[usize]| -> Option<ValueId> {
        Some(g.add_node(format!("{name}.{what}"), op, ins, vec![(format!("{name}.{what}"), f32ty(dims)?)]).1[0])
    };
    let to = kiln_ir::op::Attrs::new().with("to", kiln_ir::op::Attr::Int(DType::F32.onnx_code()?.into()));
    let cast = Op::parse(OpKind::Cast, &to).ok()?;
    let xf = step(g, "float_input", cast, vec![Some(x)], &xd)?;
    let mut xc = step(g, "centred_input", Op::new(OpKind::Sub), vec![Some(xf), Some(zxv)], &xd)?;
    let mut attrs = attrs;
    if k > 1 {
        let idx: Vec<i64> = (0..m as i64).map(|j| j / k as i64).collect();
        let iv =
            g.add_const(format!("{name}.repeated_channels"), Tensor::from_i64(DType::I64, shape(&[m])?, &idx).ok()?);
        let mut rd = xd.clone();
        rd[1] = m;
        let gather =
            Op::parse(OpKind::Gather, &kiln_ir::op::Attrs::new().with("axis", kiln_ir::op::Attr::Int(1))).ok()?;
        xc = step(g, "repeated_input", gather, vec![Some(xc), Some(iv)], &rd)?;
        attrs.group = m as i64;
    }
    let conv = Op::with_typed(OpKind::Conv, attrs).ok()?;
    let acc = step(g, "float_accumulator", conv, vec![Some(xc), Some(wv), Some(bv)], &ydims)?;
    let scaled = step(g, "scaled", Op::new(OpKind::Mul), vec![Some(acc), Some(mv)], &ydims)?;
    let q = Op::with_typed(OpKind::QuantizeLinear, QuantizeAttrs::default()).ok()?;
    Some(g.add_node(name.clone(), q, vec![Some(scaled), Some(one), input(7)], vec![out]).1[0])
}

/// Every node reading each value, once per operand.
fn consumers(g: &Graph) -> HashMap<ValueId, Vec<NodeId>> {
    let mut c: HashMap<ValueId, Vec<NodeId>> = HashMap::new();
    for (id, n) in g.nodes.iter() {
        for &v in n.inputs.iter().flatten() {
            c.entry(v).or_default().push(id);
        }
    }
    c
}

/// The constant one-element 8-bit zero point operand `i` of node `n`, as an integer.
fn const_zero_point(g: &Graph, n: &Node, i: usize, dtype: DType) -> Option<i64> {
    let z = n.inputs.get(i).copied().flatten()?;
    let t = g.constant(z)?;
    (t.dtype() == dtype && t.ty().shape.numel() == 1).then(|| t.to_i64_vec().ok()?.first().copied()).flatten()
}

/// The int8 values ONNX Runtime's QDQS8ToU8 transform turns into uint8: the result of a
/// QuantizeLinear (per tensor, a constant int8 zero point) whose one consumer, counting
/// one per reader of a DequantizeLinear (ONNX Runtime first gives each consumer of a
/// shared DequantizeLinear its own), is a DequantizeLinear with the same constant zero
/// point; the QuantizeLinear's result not a graph output.
pub fn ort_uint8_values(g: &Graph) -> HashSet<ValueId> {
    let cons = consumers(g);
    let mut out = HashSet::new();
    for (_, q) in g.nodes.iter() {
        let Some(&t) = q.outputs.first() else { continue };
        if q.op.kind != OpKind::QuantizeLinear || g.ty(t).dtype != DType::I8 || g.outputs.contains(&t) {
            continue;
        }
        let Some(zq) = const_zero_point(g, q, 2, DType::I8) else { continue };
        let readers = cons.get(&t).map(Vec::as_slice).unwrap_or(&[]);
        let edges: usize = readers
            .iter()
            .map(|&r| {
                let n = &g.nodes[r];
                match (n.op.kind, n.outputs.first()) {
                    (OpKind::DequantizeLinear, Some(o)) => cons.get(o).map_or(0, Vec::len).max(1),
                    _ => 1,
                }
            })
            .sum();
        let [r] = readers else { continue };
        let dq = &g.nodes[*r];
        if edges == 1 && dq.op.kind == OpKind::DequantizeLinear && const_zero_point(g, dq, 2, DType::I8) == Some(zq) {
            out.insert(t);
        }
    }
    out
}

/// The activation type ONNX Runtime sees for quantized value `t` (see [`ort_uint8_values`]).
fn ort_dtype(g: &Graph, u8s: &HashSet<ValueId>, t: ValueId) -> DType {
    if u8s.contains(&t) {
        DType::U8
    } else {
        g.ty(t).dtype
    }
}

/// `QuantizeLinear(GlobalAveragePool(DequantizeLinear(x)))` (per tensor, constant 8-bit
/// parameters, input and output of one type as ONNX Runtime sees them, the pool read
/// only by the QuantizeLinear) as ONNX Runtime's `QLinearGlobalAveragePool` computes it:
///
/// ```text
/// y = QuantizeLinear((ReduceSum(f32(x), spatial) − N·z_x) · m, 1, z_y),
///     m = f32(s_x) / (f32(s_y) · f32(N))   (f32, the order ONNX Runtime's kernel uses)
/// ```
///
/// The sum is of at most N ≤ 2^24/255 integers, exact in f32 in any order, and
/// QuantizeLinear with scale 1 is `round(acc·m) + z_y`, saturated: ONNX Runtime's
/// integer sum and f32 rescale. `None` when no pool matches.
fn global_average_pool_as_integer(g: &Graph, u8s: &HashSet<ValueId>) -> Option<Graph> {
    let cons = consumers(g);
    let mut producer: HashMap<ValueId, NodeId> = HashMap::new();
    for (id, n) in g.nodes.iter() {
        for &o in &n.outputs {
            producer.insert(o, id);
        }
    }
    // Per matching QuantizeLinear (by its result): the DequantizeLinear's result, the
    // multiplier m and N·z_x.
    let mut plans: HashMap<ValueId, (ValueId, f32, f64)> = HashMap::new();
    for (_, q) in g.nodes.iter() {
        let found = (|| {
            let attrs = q.op.attrs_of::<QuantizeAttrs>().ok()?;
            let (p, y) = ((*q.inputs.first()?)?, *q.outputs.first()?);
            let (sy, zy) = ((*q.inputs.get(1)?)?, (*q.inputs.get(2)?)?);
            if q.op.kind != OpKind::QuantizeLinear || attrs.block_size != 0 || attrs.precision != 0 {
                return None;
            }
            if cons.get(&p).map_or(0, Vec::len) != 1 || g.outputs.contains(&p) {
                return None;
            }
            let pool = &g.nodes[*producer.get(&p)?];
            if pool.op.kind != OpKind::GlobalAveragePool {
                return None;
            }
            let dqv = (*pool.inputs.first()?)?;
            let dqn = &g.nodes[*producer.get(&dqv)?];
            let dattrs = dqn.op.attrs_of::<DequantizeAttrs>().ok()?;
            let x = (*dqn.inputs.first()?)?;
            let sxv = (*dqn.inputs.get(1)?)?;
            let (xt, yt) = (g.ty(x).dtype, g.ty(y).dtype);
            if dqn.op.kind != OpKind::DequantizeLinear || dattrs.block_size != 0 || !matches!(xt, DType::U8 | DType::I8)
            {
                return None;
            }
            if ort_dtype(g, u8s, x) != ort_dtype(g, u8s, y) || !matches!(yt, DType::U8 | DType::I8) {
                return None;
            }
            let one = |v: ValueId| g.constant(v).filter(|t| t.ty().shape.numel() == 1).map(|t| t.to_f64_vec()[0]);
            if g.ty(sxv).dtype != DType::F32 || g.ty(sy).dtype != DType::F32 {
                return None;
            }
            let (sx, sy) = (one(sxv)?, one(sy)?);
            let zx = match dqn.inputs.get(2).copied().flatten() {
                None => 0.0,
                Some(z) => one(z)?,
            };
            one(zy)?;
            let dims = g.ty(x).shape.dims().to_vec();
            let n: usize = dims.get(2..)?.iter().product();
            if dims.len() < 3 || n == 0 || (n as f64) * 255.0 >= (1u64 << 24) as f64 {
                return None;
            }
            let m = (sx as f32) / ((sy as f32) * (n as f32));
            (m.is_finite() && m > 0.0).then_some((y, (dqv, m, n as f64 * zx)))
        })();
        if let Some((y, plan)) = found {
            plans.insert(y, plan);
        }
    }
    if plans.is_empty() {
        return None;
    }
    let watch: HashSet<ValueId> = plans.values().map(|p| p.0).collect();
    // The DequantizeLinear's integer operand in the new graph, by its old result.
    let mut seen: HashMap<ValueId, ValueId> = HashMap::new();
    let (new, rewrote) = crate::rewrite::rebuild_tracked(g, |new, n, inputs| {
        let Some(&o) = n.outputs.first() else { return Action::Keep };
        if watch.contains(&o) {
            if let Some(Some(x)) = inputs.first() {
                seen.insert(o, *x);
            }
            return Action::Keep;
        }
        let Some(&(dqv, m, nz)) = plans.get(&o) else { return Action::Keep };
        let (Some(&x), Some(Some(zy))) = (seen.get(&dqv), inputs.get(2)) else { return Action::Keep };
        match pool_nodes(new, &n.name, x, m, nz, *zy, (g.values[o].name.clone(), g.values[o].ty.clone())) {
            Some(v) => Action::Replace(vec![v]),
            None => Action::Keep,
        }
    });
    rewrote.then_some(new)
}

/// The nodes of [`global_average_pool_as_integer`]'s form, added to `g`; the result.
fn pool_nodes(
    g: &mut Graph,
    name: &str,
    x: ValueId,
    m: f32,
    nz: f64,
    zy: ValueId,
    out: (String, kiln_ir::TensorType),
) -> Option<ValueId> {
    let xd = g.ty(x).shape.dims().to_vec();
    let rank = xd.len();
    let mut pd = xd.clone();
    for d in pd.iter_mut().skip(2) {
        *d = 1;
    }
    let shape = |d: &[usize]| Shape::new(d.to_vec()).ok();
    let f32ty = |d: &[usize]| Some(kiln_ir::TensorType::new(DType::F32, shape(d)?));
    let scalar = |g: &mut Graph, what: &str, v: f64| -> Option<ValueId> {
        Some(g.add_const(format!("{name}.{what}"), Tensor::from_f64(DType::F32, Shape::new(vec![]).ok()?, &[v]).ok()?))
    };
    let step = |g: &mut Graph, what: &str, op: Op, ins: Vec<Option<ValueId>>, dims: &[usize]| -> Option<ValueId> {
        Some(g.add_node(format!("{name}.{what}"), op, ins, vec![(format!("{name}.{what}"), f32ty(dims)?)]).1[0])
    };
    let to = kiln_ir::op::Attrs::new().with("to", kiln_ir::op::Attr::Int(DType::F32.onnx_code()?.into()));
    let xf = step(g, "float_input", Op::parse(OpKind::Cast, &to).ok()?, vec![Some(x)], &xd)?;
    let axes: Vec<i64> = (2..rank as i64).collect();
    let axes = g.add_const(format!("{name}.axes"), Tensor::from_i64(DType::I64, shape(&[axes.len()])?, &axes).ok()?);
    let sum = step(g, "integer_sum", Op::new(OpKind::ReduceSum), vec![Some(xf), Some(axes)], &pd)?;
    let nzv = scalar(g, "zero_point_sum", nz)?;
    let acc = step(g, "accumulator", Op::new(OpKind::Sub), vec![Some(sum), Some(nzv)], &pd)?;
    let mv = scalar(g, "multiplier", m as f64)?;
    let scaled = step(g, "scaled", Op::new(OpKind::Mul), vec![Some(acc), Some(mv)], &pd)?;
    let one = scalar(g, "unit_scale", 1.0)?;
    let q = Op::with_typed(OpKind::QuantizeLinear, QuantizeAttrs::default()).ok()?;
    Some(g.add_node(name.to_string(), q, vec![Some(scaled), Some(one), Some(zy)], vec![out]).1[0])
}

impl Pass for FoldQuantizedContractions {
    fn name(&self) -> &'static str {
        "tensor-fold-quantized-contractions"
    }
    fn summary(&self) -> &'static str {
        "turn DequantizeLinear → Conv/MatMul (→ Relu/Clip) → QuantizeLinear into QLinearConv/QLinearMatMul (+ an integer Clip: integer execution, as ONNX Runtime); a depthwise QLinearConv into its exact float form"
    }
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let readers = crate::tensor::readers(g);
        let mut producer: HashMap<ValueId, NodeId> = HashMap::new();
        for (id, n) in g.nodes.iter() {
            for &o in &n.outputs {
                producer.insert(o, id);
            }
        }
        let ids: Vec<NodeId> =
            g.nodes.iter().filter(|(_, n)| n.op.kind == OpKind::QuantizeLinear).map(|(id, _)| id).collect();
        let mut changed = false;
        // ONNX Runtime's uint8 values, decided on the graph as it comes (before any
        // QuantizeLinear here becomes an integer op).
        let ort = (g.quant == QuantSemantics::OnnxRuntimeCpu).then(|| ort_uint8_values(g));
        let ort_u8 = ort.as_ref();
        for id in ids {
            let qn = g.nodes[id].clone();
            if let Some((op, inputs)) = fold(g, &qn, &producer, &readers) {
                // The QuantizeLinear's result (same type) is now the integer op's; the
                // float product and the dequantisations lose a reader each, and dead
                // code elimination drops what is left unread. (The node stays where
                // it was: everything it reads is defined before the product it replaces.)
                g.nodes[id].op = op;
                g.nodes[id].inputs = inputs;
                changed = true;
            } else if fold_clamped(g, id, &producer, &readers).is_some() {
                changed = true;
            }
        }
        // ONNX Runtime's QLinearGlobalAveragePool (value ids are still those `ort_u8`
        // was computed on: the folds above only changed nodes and added constants).
        if let Some(u8s) = ort_u8 {
            if let Some(new) = global_average_pool_as_integer(g, u8s) {
                *g = new;
                changed = true;
            }
        }
        // Depthwise integer convolutions (folded here or imported as QLinearConv) in
        // exact float arithmetic (`depthwise_as_float`).
        let old = g.clone();
        let (new, rewrote) = crate::rewrite::rebuild_tracked(&old, |new, n, inputs| {
            let Some(&o) = n.outputs.first() else { return Action::Keep };
            let out = (old.values[o].name.clone(), old.values[o].ty.clone());
            match depthwise_as_float(new, n, inputs, out) {
                Some(v) => Action::Replace(vec![v]),
                None => Action::Keep,
            }
        });
        if rewrote {
            *g = new;
            changed = true;
        }
        Ok(changed)
    }
}

/// `tensor-float-integer-contractions` (targets without integer microkernels): an
/// integer contraction in exact float arithmetic.
///
/// `ConvInteger(x, w, z_x, z_w)` and `MatMulInteger(a, b, z_a, z_b)` (8-bit operands, i32
/// result) become
///
/// ```text
/// Cast<i32>(Conv(f32(x) − z_x, f32(w) − z_w))      (MatMul the same way)
/// ```
///
/// where every partial sum of the product is an integer of magnitude below 2²⁴: each
/// output's sum is then exact in f32 whatever the order of its additions, so the result
/// is the i32 accumulator bit for bit. The bound is checked per output row (a
/// convolution's output channel, a product's column) as `Σ_k |w − z_w|·max|x − z_x|`
/// where one operand is a constant (its integers), else `K·max|w − z_w|·max|x − z_x|`
/// over the operands' dtype ranges; a constant operand is stored as its f32 differences
/// (`w − z_w`, its zero point per channel or per column folded in). A run-time operand's
/// zero point must be one constant (absent is 0).
///
/// Where the CPU has no integer microkernel (`qgemm` needs AVX-512 BW/VL), an integer
/// contraction runs on the scalar general path, tens of times slower than the float
/// contraction microkernel that runs this form (a TFLite int8 CONV_2D's `ConvInteger`
/// on an AVX2 host); the i32 epilogue after it (the fixed-point requantisation) stays
/// in its own vector kernel. Where the target has the integer microkernel this pass is
/// left out (`kiln-compiler`), as `tensor-fold-quantized-contractions` is left out where
/// it is not.
pub struct FloatIntegerContractions;

/// f32 of the largest integer every partial sum must stay below.
const EXACT_F32: f64 = (1u64 << 24) as f64;

/// The largest `|v − z|` over the integers of 8-bit `dtype`.
fn span(dtype: DType, z: f64) -> Option<f64> {
    let (lo, hi) = match dtype {
        DType::I8 => (-128.0, 127.0),
        DType::U8 => (0.0, 255.0),
        _ => return None,
    };
    Some(f64::max(z - lo, hi - z))
}

/// One scalar constant's value (absent: 0).
fn scalar_const(g: &Graph, v: Option<ValueId>) -> Option<f64> {
    match v {
        None => Some(0.0),
        Some(v) => match g.constant(v)?.to_f64_vec().as_slice() {
            [z] => Some(*z),
            _ => None,
        },
    }
}

/// The exact float form of an integer convolution or product `n` (see
/// [`FloatIntegerContractions`]), its result replacing `out`; `None` where it does not
/// apply (nothing added).
/// `tag` names the values it adds (unique per rewritten node: one TFLite op may import as
/// several integer products).
fn integer_as_float(
    g: &mut Graph,
    n: &Node,
    inputs: &[Option<ValueId>],
    out: (String, kiln_ir::TensorType),
    tag: &str,
) -> Option<ValueId> {
    let conv = match n.op.kind {
        OpKind::ConvInteger => true,
        OpKind::MatMulInteger => false,
        _ => return None,
    };
    if n.outputs.len() != 1 {
        return None;
    }
    let input = |i: usize| inputs.get(i).copied().flatten();
    let (x, w) = (input(0)?, input(1)?);
    let (xd, wd) = (g.ty(x).shape.dims().to_vec(), g.ty(w).shape.dims().to_vec());
    let (xt, wt) = (g.ty(x).dtype, g.ty(w).dtype);
    // Rows of the constant-operand layout: a convolution's weight [M, C/g, k...] by
    // output channel (its leading axis), a product's right operand [.., K, N] by column.
    let (rows, steps) = if conv {
        let m = *wd.first()?;
        (m, wd.iter().skip(1).product::<usize>())
    } else {
        let (&n_cols, &k) = (wd.last()?, wd.get(wd.len().checked_sub(2)?)?);
        if wd.len() != 2 || xd.last() != Some(&k) {
            return None;
        }
        (n_cols, k)
    };
    if rows == 0 || steps == 0 || out.1.dtype != DType::I32 {
        return None;
    }
    let zx = scalar_const(g, input(2))?;
    let xspan = span(xt, zx)?;
    // The weight's zero point: one, or one per row (a convolution's output channel, a
    // product's column).
    let zw: Vec<f64> = match input(3) {
        None => vec![0.0],
        Some(z) => g.constant(z)?.to_f64_vec(),
    };
    if !(zw.len() == 1 || zw.len() == rows) {
        return None;
    }
    let zw_at = |r: usize| if zw.len() == 1 { zw[0] } else { zw[r] };
    let name = tag.to_string();
    let shape = |dims: &[usize]| Shape::new(dims.to_vec()).ok();
    let f32ty = |d: &[usize]| Some(kiln_ir::TensorType::new(DType::F32, shape(d)?));
    let wv = match g.constant(w) {
        Some(t) => {
            // w − z_w as f32, and each row's bound from its integers.
            let v = t.to_f64_vec();
            let mut f = vec![0.0; v.len()];
            for r in 0..rows {
                let mut bound = 0.0;
                for s in 0..steps {
                    let i = if conv { r * steps + s } else { s * rows + r };
                    let d = *v.get(i)? - zw_at(r);
                    bound += d.abs() * xspan;
                    f[i] = d;
                }
                if bound >= EXACT_F32 {
                    return None;
                }
            }
            g.add_const(format!("{name}.float_weight"), Tensor::from_f64(DType::F32, shape(&wd)?, &f).ok()?)
        }
        None => {
            // A run-time weight: one zero point, the dtype's range.
            let [z] = zw[..] else { return None };
            if steps as f64 * span(wt, z)? * xspan >= EXACT_F32 {
                return None;
            }
            let zv = g.add_const(
                format!("{name}.float_weight_zero_point"),
                Tensor::from_f64(DType::F32, shape(&[])?, &[z]).ok()?,
            );
            centred(g, &name, "weight", w, zv, &wd)?
        }
    };
    let zxv = g.add_const(format!("{name}.float_zero_point"), Tensor::from_f64(DType::F32, shape(&[])?, &[zx]).ok()?);
    let xc = centred(g, &name, "input", x, zxv, &xd)?;
    let ydims = out.1.shape.dims().to_vec();
    let op = if conv {
        Op::with_typed(OpKind::Conv, n.op.attrs_of::<ConvAttrs>().ok()?.clone()).ok()?
    } else {
        Op::new(OpKind::MatMul)
    };
    let what = format!("{name}.float_accumulator");
    let acc = g
        .add_node(format!("{name}.float_accumulator"), op, vec![Some(xc), Some(wv)], vec![(what, f32ty(&ydims)?)])
        .1[0];
    // (A Cast of f32 to i32 lowers to a vector conversion, `cpu::vops`' `f32_to_i32`,
    // with a compare and select for saturation.)
    let to = kiln_ir::op::Attrs::new().with("to", kiln_ir::op::Attr::Int(DType::I32.onnx_code()?.into()));
    let cast = Op::parse(OpKind::Cast, &to).ok()?;
    Some(g.add_node(n.name.clone(), cast, vec![Some(acc)], vec![out]).1[0])
}

/// `f32(v) − z` (`z` an f32 scalar constant), named after `name` and `what`.
/// A constant `v` becomes the constant `v − z`.
fn centred(g: &mut Graph, name: &str, what: &str, v: ValueId, z: ValueId, dims: &[usize]) -> Option<ValueId> {
    let ty = kiln_ir::TensorType::new(DType::F32, Shape::new(dims.to_vec()).ok()?);
    if let (Some(t), Some(zt)) = (g.constant(v), g.constant(z)) {
        let zf = *zt.to_f64_vec().first()?;
        let f: Vec<f64> = t.to_f64_vec().iter().map(|&e| e - zf).collect();
        let t = Tensor::from_f64(DType::F32, ty.shape.clone(), &f).ok()?;
        return Some(g.add_const(format!("{name}.centred_{what}"), t));
    }
    let to = kiln_ir::op::Attrs::new().with("to", kiln_ir::op::Attr::Int(DType::F32.onnx_code()?.into()));
    let cast = Op::parse(OpKind::Cast, &to).ok()?;
    let f = format!("{name}.float_{what}");
    let vf = g.add_node(f.clone(), cast, vec![Some(v)], vec![(f, ty.clone())]).1[0];
    let c = format!("{name}.centred_{what}");
    Some(g.add_node(c.clone(), Op::new(OpKind::Sub), vec![Some(vf), Some(z)], vec![(c, ty)]).1[0])
}

impl Pass for FloatIntegerContractions {
    fn name(&self) -> &'static str {
        "tensor-float-integer-contractions"
    }
    fn summary(&self) -> &'static str {
        "ConvInteger/MatMulInteger whose partial sums stay below 2^24 as an exact f32 Conv/MatMul converted to i32 (targets without integer microkernels)"
    }
    fn run(&self, g: &mut Graph) -> Result<bool, PassError> {
        let old = g.clone();
        let mut seen: HashMap<String, usize> = HashMap::new();
        let (new, rewrote) = crate::rewrite::rebuild_tracked(&old, |new, n, inputs| {
            let Some(&o) = n.outputs.first() else { return Action::Keep };
            let out = (old.values[o].name.clone(), old.values[o].ty.clone());
            // (An unnamed node's values are named after its result.)
            let base = if n.name.is_empty() { out.0.clone() } else { n.name.clone() };
            let count = seen.entry(base.clone()).or_insert(0);
            let tag = if *count == 0 { base } else { format!("{base}.{count}") };
            match integer_as_float(new, n, inputs, out, &tag) {
                Some(v) => {
                    *count += 1;
                    Action::Replace(vec![v])
                }
                None => Action::Keep,
            }
        });
        if rewrote {
            *g = new;
        }
        Ok(rewrote)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::attrs::ConvAttrs;
    use kiln_ir::TensorType;

    fn tt(d: DType, dims: &[usize]) -> TensorType {
        TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
    }
    fn scalar_f32(g: &mut Graph, name: &str, x: f64) -> ValueId {
        g.add_const(name, Tensor::from_f64(DType::F32, Shape::new(vec![]).unwrap(), &[x]).unwrap())
    }
    fn scalar_int(g: &mut Graph, name: &str, d: DType, x: i64) -> ValueId {
        g.add_const(name, Tensor::from_i64(d, Shape::new(vec![]).unwrap(), &[x]).unwrap())
    }

    /// `Q(act(Conv(DQ(x), DQ(w))))` on an i8 input (`act`: Relu, Clip(0, 6) or none),
    /// with `sy`, `zy` the output's quantisation; the graph and its input.
    fn qdq_conv(act: Option<(f64, f64)>, relu: bool, sy: f64, zy: i64) -> (Graph, Tensor) {
        let (c, m, h, w) = (5, 7, 3, 9);
        let mut g = Graph::new("qdq");
        let x = g.add_input("x", tt(DType::I8, &[1, c, h, w]));
        let sx = scalar_f32(&mut g, "sx", 0.04);
        let zx = scalar_int(&mut g, "zx", DType::I8, 3);
        let wv: Vec<i64> = (0..m * c).map(|i| ((i * 37 + 11) % 255) as i64 - 127).collect();
        let wq = g.add_const("w", Tensor::from_i64(DType::I8, Shape::new(vec![m, c, 1, 1]).unwrap(), &wv).unwrap());
        let swv: Vec<f64> = (0..m).map(|i| 0.002 + 0.0013 * i as f64).collect();
        let sw = g.add_const("sw", Tensor::from_f64(DType::F32, Shape::new(vec![m]).unwrap(), &swv).unwrap());
        let dq = |axis: i64| {
            Op::with_typed(OpKind::DequantizeLinear, DequantizeAttrs { axis, ..Default::default() }).unwrap()
        };
        let f = |g: &Graph, v: ValueId| tt(DType::F32, g.ty(v).shape.dims());
        let ty = f(&g, x);
        let (_, xf) = g.add_node("dqx", dq(1), vec![Some(x), Some(sx), Some(zx)], vec![("xf".into(), ty)]);
        let ty = f(&g, wq);
        let (_, wf) = g.add_node("dqw", dq(0), vec![Some(wq), Some(sw)], vec![("wf".into(), ty)]);
        let conv = Op::with_typed(OpKind::Conv, ConvAttrs::default()).unwrap();
        let out = tt(DType::F32, &[1, m, h, w]);
        let (_, y) = g.add_node("conv", conv, vec![Some(xf[0]), Some(wf[0])], vec![("y".into(), out.clone())]);
        let mut y = y[0];
        if relu {
            y = g.add_node("relu", Op::new(OpKind::Relu), vec![Some(y)], vec![("r".into(), out.clone())]).1[0];
        } else if let Some((lo, hi)) = act {
            let (lo, hi) = (scalar_f32(&mut g, "lo", lo), scalar_f32(&mut g, "hi", hi));
            y = g.add_node("clip", Op::new(OpKind::Clip), vec![Some(y), Some(lo), Some(hi)], vec![("r".into(), out)]).1
                [0];
        }
        let syv = scalar_f32(&mut g, "sy", sy);
        let zyv = scalar_int(&mut g, "zy", DType::I8, zy);
        let q = Op::with_typed(OpKind::QuantizeLinear, QuantizeAttrs::default()).unwrap();
        let (_, yq) =
            g.add_node("q", q, vec![Some(y), Some(syv), Some(zyv)], vec![("yq".into(), tt(DType::I8, &[1, m, h, w]))]);
        g.outputs.push(yq[0]);
        let xv: Vec<i64> = (0..c * h * w).map(|i| ((i * 53 + 5) % 256) as i64 - 128).collect();
        (g, Tensor::from_i64(DType::I8, Shape::new(vec![1, c, h, w]).unwrap(), &xv).unwrap())
    }

    fn kinds(g: &Graph) -> Vec<OpKind> {
        g.without_dead_code().nodes.iter().map(|(_, n)| n.op.kind).collect()
    }

    /// A Relu or Clip(0, 6) between the convolution and the QuantizeLinear folds into
    /// QLinearConv + an integer Clip, which computes exactly the clamp of the unclamped
    /// fold's integer result at the quantised bounds (`Q` monotone), and stays within
    /// one step of the float simulation the original graph describes.
    #[test]
    fn clamps_fold_with_the_contraction() {
        for (relu, act, sy, zy) in
            [(true, None, 0.02, -5), (false, Some((0.0, 6.0)), 0.01, -100), (false, Some((-0.3, 0.4)), 0.005, 7)]
        {
            let (g, x) = qdq_conv(act, relu, sy, zy);
            let (plain, _) = qdq_conv(None, false, sy, zy);
            let (mut folded, mut folded_plain) = (g.clone(), plain.clone());
            assert!(FoldQuantizedContractions.run(&mut folded).unwrap());
            assert!(FoldQuantizedContractions.run(&mut folded_plain).unwrap());
            assert_eq!(kinds(&folded), vec![OpKind::QLinearConv, OpKind::Clip], "{relu} {act:?}");
            let run = |g: &Graph| {
                kiln_ref::eval_graph(&g.without_dead_code(), std::slice::from_ref(&x)).unwrap()[0].to_f64_vec()
            };
            let (got, unclamped, float) = (run(&folded), run(&folded_plain), run(&g));
            let (lo, hi) = if relu { (0.0, f64::INFINITY) } else { act.unwrap() };
            let q = |v: f64| ((v as f32 / sy as f32).round_ties_even() as f64 + zy as f64).clamp(-128.0, 127.0);
            let want: Vec<f64> = unclamped.iter().map(|&u| u.clamp(q(lo), q(hi))).collect();
            assert_eq!(got, want, "{relu} {act:?}: the integer clamp");
            assert!(
                got.iter().zip(&float).all(|(a, b)| (a - b).abs() <= 1.0),
                "{relu} {act:?}: against the float form"
            );
            let at_bounds = got.iter().filter(|&&v| v == q(lo) || v == q(hi)).count();
            assert!(at_bounds > 0 && at_bounds < got.len(), "{relu} {act:?}: {at_bounds} of {} at a bound", got.len());
        }
    }

    /// `Q(GlobalAveragePool(DQ(x)))` under ONNX Runtime's semantics becomes its
    /// `QLinearGlobalAveragePool` arithmetic: per channel `round((Σx − N·z_x) · m) + z_y`
    /// with `m = f32(s_x) / (f32(s_y)·f32(N))`, saturated, which differs from the float
    /// form (the mean of the dequantised values divided by `s_y`) for some channels; under
    /// the default (LiteRT) semantics the pool stays float; an input whose type ONNX
    /// Runtime sees differently from the output's (an int8 QuantizeLinear with two
    /// consumers, left int8, against a uint8 output) stays float too.
    #[test]
    fn global_average_pool_as_onnx_runtime_computes_it() {
        let (c, h, w) = (64, 5, 7);
        let n = h * w;
        // s_x / (s_y·N) is 1/2 in real numbers and 0.50000006 in f32, so every odd sum is
        // a tie that ONNX Runtime's f32 rescale rounds up.
        let (sx, zx, sy, zy) = (0.21525f32, -3i64, 0.0123f32, 5i64);
        let build = |quant: QuantSemantics, shared: bool| {
            let mut g = Graph::new("gap");
            g.quant = quant;
            let xf = g.add_input("xf", tt(DType::F32, &[1, c, h, w]));
            let q = |g: &mut Graph, v: ValueId, s: ValueId, z: ValueId, name: &str, d: DType, dims: &[usize]| {
                let op = Op::with_typed(OpKind::QuantizeLinear, QuantizeAttrs::default()).unwrap();
                g.add_node(name, op, vec![Some(v), Some(s), Some(z)], vec![(name.into(), tt(d, dims))]).1[0]
            };
            let dq = |g: &mut Graph, v: ValueId, s: ValueId, z: ValueId, name: &str, dims: &[usize]| {
                let op = Op::with_typed(OpKind::DequantizeLinear, DequantizeAttrs::default()).unwrap();
                g.add_node(name, op, vec![Some(v), Some(s), Some(z)], vec![(name.into(), tt(DType::F32, dims))]).1[0]
            };
            let (sxv, zxv) = (scalar_f32(&mut g, "sx", sx as f64), scalar_int(&mut g, "zx", DType::I8, zx));
            let (syv, zyv) = (scalar_f32(&mut g, "sy", sy as f64), scalar_int(&mut g, "zy", DType::I8, zy));
            let xq = q(&mut g, xf, sxv, zxv, "xq", DType::I8, &[1, c, h, w]);
            let xd = dq(&mut g, xq, sxv, zxv, "xd", &[1, c, h, w]);
            if shared {
                // A second consumer of the int8 tensor: ONNX Runtime leaves it int8.
                let other = dq(&mut g, xq, sxv, zxv, "other", &[1, c, h, w]);
                g.outputs.push(other);
            }
            let pool = g
                .add_node(
                    "pool",
                    Op::new(OpKind::GlobalAveragePool),
                    vec![Some(xd)],
                    vec![("p".into(), tt(DType::F32, &[1, c, 1, 1]))],
                )
                .1[0];
            let yq = q(&mut g, pool, syv, zyv, "yq", DType::I8, &[1, c, 1, 1]);
            let yd = dq(&mut g, yq, syv, zyv, "yd", &[1, c, 1, 1]);
            g.outputs.insert(0, yd);
            g
        };
        let xv: Vec<f64> = (0..c * n).map(|i| (((i * 7919 + 13) % 509) as f64 - 200.0) * 0.0131).collect();
        let x = Tensor::from_f64(DType::F32, Shape::new(vec![1, c, h, w]).unwrap(), &xv).unwrap();
        let run =
            |g: &Graph| kiln_ref::eval_graph(&g.without_dead_code(), std::slice::from_ref(&x)).unwrap()[0].to_f64_vec();
        // The integers the graph quantizes x to, and ONNX Runtime's pool of them.
        let xq: Vec<i64> =
            xv.iter().map(|&v| ((v as f32 / sx).round_ties_even() as i64 + zx).clamp(-128, 127)).collect();
        let m = sx / (sy * n as f32);
        let want: Vec<f64> = (0..c)
            .map(|ch| {
                let acc: i64 = xq[ch * n..(ch + 1) * n].iter().map(|&v| v - zx).sum();
                let y = ((acc as f32 * m).round_ties_even() as i64 + zy).clamp(-128, 127);
                ((y - zy) as f32 * sy) as f64
            })
            .collect();
        // The f32 rescale breaks the ties its own way: some channels differ from the
        // exact mean rounded half to even, so the case tells the two apart.
        let exact: Vec<f64> = (0..c)
            .map(|ch| {
                let acc: i64 = xq[ch * n..(ch + 1) * n].iter().map(|&v| v - zx).sum();
                let y = ((acc as f64 / 2.0).round_ties_even() as i64 + zy).clamp(-128, 127);
                ((y - zy) as f32 * sy) as f64
            })
            .collect();
        assert!(want.iter().zip(&exact).any(|(a, b)| a != b), "no tie the f32 rescale breaks differently");
        let mut g = build(QuantSemantics::OnnxRuntimeCpu, false);
        assert!(FoldQuantizedContractions.run(&mut g).unwrap());
        assert!(kinds(&g).contains(&OpKind::ReduceSum) && !kinds(&g).contains(&OpKind::GlobalAveragePool));
        assert_eq!(run(&g), want);
        for (quant, shared) in [(QuantSemantics::Integer, false), (QuantSemantics::OnnxRuntimeCpu, true)] {
            let mut g = build(quant, shared);
            FoldQuantizedContractions.run(&mut g).unwrap();
            assert!(kinds(&g).contains(&OpKind::GlobalAveragePool), "{quant:?}, shared {shared}");
        }
    }

    /// A depthwise QLinearConv (odd plane, 3×3, padded, strides 1 and 2, non-zero zero
    /// points, per-channel scales, a bias) becomes the float form, which the reference
    /// evaluator computes to exactly the integer op's result; weights whose integer sum
    /// could pass 2^24 stay integer.
    #[test]
    fn depthwise_runs_in_exact_float() {
        let (c, h, w) = (6, 7, 9);
        // (A depth multiplier of 2: each input channel feeds two output channels.)
        for (stride, big, mult) in [(1, false, 1), (2, false, 1), (1, true, 1), (2, false, 2)] {
            let mc = c * mult;
            let mut g = Graph::new("dw");
            let x = g.add_input("x", tt(DType::I8, &[1, c, h, w]));
            let sx = scalar_f32(&mut g, "sx", 0.031);
            let zx = scalar_int(&mut g, "zx", DType::I8, -9);
            let wv: Vec<i64> = (0..mc * 9).map(|i| ((i * 71 + 3) % 255) as i64 - 127).collect();
            let wq =
                g.add_const("w", Tensor::from_i64(DType::I8, Shape::new(vec![mc, 1, 3, 3]).unwrap(), &wv).unwrap());
            let swv: Vec<f64> = (0..mc).map(|i| 0.0021 + 0.00037 * i as f64).collect();
            let sw = g.add_const("sw", Tensor::from_f64(DType::F32, Shape::new(vec![mc]).unwrap(), &swv).unwrap());
            let zwv: Vec<i64> = (0..mc).map(|i| i as i64 % 7 - 2).collect();
            let zw = g.add_const("zw", Tensor::from_i64(DType::I8, Shape::new(vec![mc]).unwrap(), &zwv).unwrap());
            let sy = scalar_f32(&mut g, "sy", 0.006);
            let zy = scalar_int(&mut g, "zy", DType::I8, 11);
            let bv: Vec<i64> = (0..mc).map(|i| if big { 1 << 24 } else { (i as i64 * 997) % 3000 - 1500 }).collect();
            let b = g.add_const("b", Tensor::from_i64(DType::I32, Shape::new(vec![mc]).unwrap(), &bv).unwrap());
            let mut a = kiln_ir::op::Attrs::new();
            a = a.with("group", kiln_ir::op::Attr::Int(c as i64));
            a = a.with("pads", kiln_ir::op::Attr::Ints(vec![1, 1, 1, 1]));
            a = a.with("strides", kiln_ir::op::Attr::Ints(vec![stride, stride]));
            let op = Op::parse(OpKind::QLinearConv, &a).unwrap();
            let (oh, ow) = ((h - 1) / stride as usize + 1, (w - 1) / stride as usize + 1);
            let ins = [x, sx, zx, wq, sw, zw, sy, zy, b].map(Some).to_vec();
            let (_, y) = g.add_node("dw", op, ins, vec![("y".into(), tt(DType::I8, &[1, mc, oh, ow]))]);
            g.outputs.push(y[0]);
            let xv: Vec<i64> = (0..c * h * w).map(|i| ((i * 29 + 1) % 256) as i64 - 128).collect();
            let xt = Tensor::from_i64(DType::I8, Shape::new(vec![1, c, h, w]).unwrap(), &xv).unwrap();
            let mut f = g.clone();
            let changed = FoldQuantizedContractions.run(&mut f).unwrap();
            assert_eq!(changed, !big, "stride {stride}, big {big}");
            if big {
                continue;
            }
            let mut want_kinds = vec![OpKind::Cast, OpKind::Sub, OpKind::Conv, OpKind::Mul, OpKind::QuantizeLinear];
            if mult > 1 {
                want_kinds.insert(2, OpKind::Gather);
            }
            assert_eq!(kinds(&f), want_kinds);
            let run = |g: &Graph| kiln_ref::eval_graph(g, std::slice::from_ref(&xt)).unwrap()[0].clone();
            let (want, got) = (run(&g), run(&f.without_dead_code()));
            assert_eq!(got.ty(), want.ty());
            assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "stride {stride}");
            let v = want.to_f64_vec();
            assert!(v.contains(&-128.0) && v.contains(&127.0) && v.iter().any(|&e| e.abs() < 100.0));
        }
    }

    /// ConvInteger and MatMulInteger in exact float (`FloatIntegerContractions`): the
    /// reference evaluator gives the rewritten graph's i32 results equal to the
    /// original's, with padding (the input's zero point), groups, per-channel weight
    /// zero points, u8 and i8 operands and a run-time right operand; a weight whose
    /// sums could reach 2^24 is left as it is.
    #[test]
    fn integer_contractions_run_in_exact_float() {
        let (h, w) = (5, 7);
        // (input channels, groups, per-channel weight zero points, output channels)
        for (c, group, zw_per, m) in [(6, 1, false, 4), (6, 2, true, 4), (6, 6, false, 6), (600, 1, false, 2)] {
            let big = c > 100;
            let cg = c / group;
            let mut g = Graph::new("conv");
            let x = g.add_input("x", tt(DType::U8, &[1, c, h, w]));
            let zx = scalar_int(&mut g, "zx", DType::U8, 131);
            let wv: Vec<i64> =
                (0..m * cg * 9).map(|i| if big { 127 } else { ((i * 71 + 3) % 255) as i64 - 127 }).collect();
            let wq =
                g.add_const("w", Tensor::from_i64(DType::I8, Shape::new(vec![m, cg, 3, 3]).unwrap(), &wv).unwrap());
            let zw = if zw_per {
                let z: Vec<i64> = (0..m).map(|i| i as i64 % 5 - 2).collect();
                g.add_const("zw", Tensor::from_i64(DType::I8, Shape::new(vec![m]).unwrap(), &z).unwrap())
            } else {
                scalar_int(&mut g, "zw", DType::I8, 0)
            };
            let mut a = kiln_ir::op::Attrs::new();
            a = a.with("group", kiln_ir::op::Attr::Int(group as i64));
            a = a.with("pads", kiln_ir::op::Attr::Ints(vec![1, 1, 1, 1]));
            let op = Op::parse(OpKind::ConvInteger, &a).unwrap();
            let ins = vec![Some(x), Some(wq), Some(zx), Some(zw)];
            let (_, y) = g.add_node("ci", op, ins, vec![("y".into(), tt(DType::I32, &[1, m, h, w]))]);
            g.outputs.push(y[0]);
            let mut f = g.clone();
            let changed = FloatIntegerContractions.run(&mut f).unwrap();
            // 600·9 steps of 127·131 reach past 2^24.
            assert_eq!(changed, !big, "group {group}, {c} channels");
            if big {
                continue;
            }
            assert_eq!(kinds(&f), vec![OpKind::Cast, OpKind::Sub, OpKind::Conv, OpKind::Cast]);
            let xv: Vec<i64> = (0..c * h * w).map(|i| ((i * 29 + 1) % 256) as i64).collect();
            let xt = Tensor::from_i64(DType::U8, Shape::new(vec![1, c, h, w]).unwrap(), &xv).unwrap();
            let run = |g: &Graph| kiln_ref::eval_graph(g, std::slice::from_ref(&xt)).unwrap()[0].clone();
            let (want, got) = (run(&g), run(&f.without_dead_code()));
            assert_eq!(got.ty(), want.ty());
            assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "group {group}");
            assert!(want.to_f64_vec().iter().any(|&v| v.abs() > 1000.0));
        }
        // MatMulInteger: a constant right operand (per-column zero points), and a
        // run-time one.
        for constant in [true, false] {
            let (mm, k, n) = (3, 20, 5);
            let mut g = Graph::new("mm");
            let a = g.add_input("a", tt(DType::I8, &[2, mm, k]));
            let za = scalar_int(&mut g, "za", DType::I8, -7);
            let bv: Vec<i64> = (0..k * n).map(|i| ((i * 37 + 11) % 256) as i64).collect();
            let (b, zb) = if constant {
                let b = g.add_const("b", Tensor::from_i64(DType::U8, Shape::new(vec![k, n]).unwrap(), &bv).unwrap());
                let z: Vec<i64> = (0..n).map(|i| 120 + i as i64).collect();
                (b, g.add_const("zb", Tensor::from_i64(DType::U8, Shape::new(vec![n]).unwrap(), &z).unwrap()))
            } else {
                (g.add_input("b", tt(DType::U8, &[k, n])), scalar_int(&mut g, "zb", DType::U8, 128))
            };
            let (_, y) = g.add_node(
                "mi",
                Op::new(OpKind::MatMulInteger),
                vec![Some(a), Some(b), Some(za), Some(zb)],
                vec![("y".into(), tt(DType::I32, &[2, mm, n]))],
            );
            g.outputs.push(y[0]);
            let mut f = g.clone();
            assert!(FloatIntegerContractions.run(&mut f).unwrap(), "constant {constant}");
            assert!(kinds(&f).contains(&OpKind::MatMul) && !kinds(&f).contains(&OpKind::MatMulInteger));
            let av: Vec<i64> = (0..2 * mm * k).map(|i| ((i * 53 + 5) % 256) as i64 - 128).collect();
            let mut ins = vec![Tensor::from_i64(DType::I8, Shape::new(vec![2, mm, k]).unwrap(), &av).unwrap()];
            if !constant {
                ins.push(Tensor::from_i64(DType::U8, Shape::new(vec![k, n]).unwrap(), &bv).unwrap());
            }
            let run = |g: &Graph| kiln_ref::eval_graph(g, &ins).unwrap()[0].clone();
            assert_eq!(run(&f.without_dead_code()).to_f64_vec(), run(&g).to_f64_vec(), "constant {constant}");
        }
    }
}
