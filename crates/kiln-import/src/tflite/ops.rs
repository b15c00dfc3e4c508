//! The translation of each TFLite builtin operator into kiln ops (ONNX semantics).
//!
//! Each handler reads its operands through the importer's layout and quantisation
//! view ([`Importer::raw`] for stored values, [`Importer::real`] for real numbers) and
//! records its results with [`Importer::set_raw`] / [`Importer::set_real`]; see the
//! parent module for the layout and quantisation rules. [`supported`] lists the
//! builtin codes handled here; the importer refuses a model using any other before it
//! translates anything.

use super::schema::tflite as fb;
use super::{identity, Importer, Perm, NCHW};
use crate::ImportError;
use fb::BuiltinOperator as B;
use kiln_ir::{Attr, Attrs, DType, OpKind, Shape, Tensor, ValueId};

/// The builtin operators the importer translates.
const SUPPORTED: &[B] = &[
    B::Add,
    B::Sub,
    B::Mul,
    B::Div,
    B::Pow,
    B::Maximum,
    B::Minimum,
    B::SquaredDifference,
    B::FloorDiv,
    B::FloorMod,
    B::Equal,
    B::NotEqual,
    B::Greater,
    B::GreaterEqual,
    B::Less,
    B::LessEqual,
    B::LogicalAnd,
    B::LogicalOr,
    B::LogicalNot,
    B::Conv2d,
    B::DepthwiseConv2d,
    B::TransposeConv,
    B::FullyConnected,
    B::BatchMatmul,
    B::AveragePool2d,
    B::MaxPool2d,
    B::Mean,
    B::Sum,
    B::ReduceMax,
    B::ReduceMin,
    B::ReduceProd,
    B::Reshape,
    B::Squeeze,
    B::ExpandDims,
    B::Transpose,
    B::Concatenation,
    B::Split,
    B::SplitV,
    B::Pack,
    B::Unpack,
    B::Pad,
    B::Padv2,
    B::MirrorPad,
    B::StridedSlice,
    B::Slice,
    B::Gather,
    B::GatherNd,
    B::ResizeBilinear,
    B::ResizeNearestNeighbor,
    B::Softmax,
    B::LogSoftmax,
    B::Logistic,
    B::Tanh,
    B::Relu,
    B::Relu6,
    B::ReluN1To1,
    B::Relu0To1,
    B::LeakyRelu,
    B::Prelu,
    B::HardSwish,
    B::Gelu,
    B::Elu,
    B::Exp,
    B::Log,
    B::Sqrt,
    B::Rsqrt,
    B::Square,
    B::Abs,
    B::Neg,
    B::Sin,
    B::Cos,
    B::Floor,
    B::Ceil,
    B::Round,
    B::Sign,
    B::Quantize,
    B::Dequantize,
    B::Select,
    B::SelectV2,
    B::ReverseV2,
    B::Cast,
    B::Shape,
    B::Range,
    B::Fill,
    B::L2Normalization,
    B::AddN,
    B::ArgMax,
    B::ArgMin,
    B::Tile,
    B::BroadcastTo,
    B::DepthToSpace,
    B::SpaceToDepth,
    B::Rfft2d,
    B::ComplexAbs,
    B::Real,
    B::Imag,
];

/// Whether the builtin operator `code` is translated.
pub(crate) fn supported(code: i32) -> bool {
    SUPPORTED.iter().any(|&b| b as i32 == code)
}

macro_rules! options {
    ($imp:expr, $op:expr, $variant:ident) => {
        match &$op.options {
            Some(fb::BuiltinOptions::$variant(o)) => Some(&**o),
            _ => None,
        }
    };
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// The real range a fused activation clamps to (open: infinite); `None` for one that
/// is not a clamp (TANH, SIGN_BIT). NONE is the whole line.
fn clamp_range(act: fb::ActivationFunctionType) -> Option<(f64, f64)> {
    use fb::ActivationFunctionType as A;
    match act {
        A::None => Some((f64::NEG_INFINITY, f64::INFINITY)),
        A::Relu => Some((0.0, f64::INFINITY)),
        A::Relu6 => Some((0.0, 6.0)),
        A::ReluN1To1 => Some((-1.0, 1.0)),
        A::Tanh | A::SignBit => None,
    }
}

/// Explicit `[begin.., end..]` pads for TFLite padding `p` over spatial extents
/// `input` with kernel `k`, stride `s`, dilation `d`.
fn same_pads(p: fb::Padding, input: &[usize], k: &[usize], s: &[usize], d: &[usize]) -> Vec<i64> {
    let n = input.len();
    let mut pads = vec![0i64; 2 * n];
    if p == fb::Padding::Same {
        for i in 0..n {
            let out = input[i].div_ceil(s[i].max(1));
            let eff = (k[i].max(1) - 1) * d[i].max(1) + 1;
            let total = ((out.max(1) - 1) * s[i] + eff).saturating_sub(input[i]) as i64;
            pads[i] = total / 2;
            pads[n + i] = total - total / 2;
        }
    }
    pads
}

impl Importer<'_> {
    /// The index of input `i` of `op` (an error when absent).
    fn input(&self, op: &super::reader::Operator, i: usize) -> Result<usize, ImportError> {
        match op.inputs.get(i) {
            Some(&t) if t >= 0 => Ok(t as usize),
            _ => Err(self.err(format!("input {i} is missing"))),
        }
    }

    fn opt_input(&self, op: &super::reader::Operator, i: usize) -> Option<usize> {
        op.inputs.get(i).filter(|&&t| t >= 0).map(|&t| t as usize)
    }

    fn output(&self, op: &super::reader::Operator, i: usize) -> Result<usize, ImportError> {
        match op.outputs.get(i) {
            Some(&t) if t >= 0 => Ok(t as usize),
            _ => Err(self.err(format!("output {i} is missing"))),
        }
    }

    pub(crate) fn dims(&self, v: ValueId) -> Vec<usize> {
        self.g.ty(v).shape.dims().to_vec()
    }

    /// The layout an elementwise op over `ts` runs in: NCHW when a computed operand was
    /// produced so and every computed operand is rank 4 (or a single element), else
    /// TFLite order (of rank `rank`).
    fn elementwise_layout(&self, ts: &[usize]) -> Result<Perm, ImportError> {
        let mut nchw = false;
        let mut rank = 0;
        for &t in ts {
            rank = rank.max(self.rank(t)?);
        }
        for &t in ts {
            let computed = self.held[t].by_layout.first().is_some_and(|(_, v)| self.g.constant(*v).is_none());
            if !computed {
                continue;
            }
            let (p, v) = &self.held[t].by_layout[0];
            let r = self.g.ty(*v).shape.rank();
            let single = self.g.ty(*v).shape.numel() == 1;
            if p.as_slice() == NCHW {
                nchw = true;
            } else if r != 4 && !single {
                return Ok(identity(rank));
            }
        }
        if nchw && rank == 4 {
            Ok(NCHW.to_vec())
        } else {
            Ok(identity(rank))
        }
    }

    /// Operand `t` of an elementwise op running in layout `lay` (real numbers): a
    /// lower-rank operand is raised to the layout's rank first (broadcasting).
    fn operand(&mut self, t: usize, lay: &[usize]) -> Result<ValueId, ImportError> {
        let r = self.rank(t)?;
        if r == lay.len() {
            return self.real(t, lay);
        }
        let v = self.real(t, &identity(r))?;
        if lay == identity(lay.len()).as_slice() || self.g.ty(v).shape.numel() == 1 {
            return Ok(v);
        }
        let mut dims: Vec<i64> = vec![1; lay.len() - r];
        dims.extend(self.dims(v).iter().map(|&d| d as i64));
        let shape = self.i64s(&dims);
        let v = self.emit1(OpKind::Reshape, Attrs::new(), vec![Some(v), Some(shape)])?;
        self.transpose(v, lay)
    }

    /// A fused activation applied to real-valued `v` before it becomes tensor `out`.
    /// A quantised result is clamped as integers (LiteRT's way), so a contraction
    /// keeps its QuantizeLinear as its only reader.
    fn finish(
        &mut self,
        out: usize,
        lay: &[usize],
        v: ValueId,
        act: fb::ActivationFunctionType,
    ) -> Result<(), ImportError> {
        let stored = self.activated(out, lay, v, act)?;
        self.set_raw(out, lay, stored);
        Ok(())
    }

    /// Real-valued `v` through fused activation `act`, stored as tensor `out` stores
    /// its values (in layout `lay`).
    fn activated(
        &mut self,
        out: usize,
        lay: &[usize],
        v: ValueId,
        act: fb::ActivationFunctionType,
    ) -> Result<ValueId, ImportError> {
        use fb::ActivationFunctionType as A;
        match act {
            A::None => return self.quantize_to(out, lay, v),
            A::Tanh => {
                let v = self.emit1(OpKind::Tanh, Attrs::new(), vec![Some(v)])?;
                return self.quantize_to(out, lay, v);
            }
            A::SignBit => return Err(self.err("fused activation SIGN_BIT is not supported")),
            _ => {}
        }
        let Some((lo, hi)) = clamp_range(act) else { return self.quantize_to(out, lay, v) };
        if let Some(q) = self.quant(out).filter(|q| q.scale.len() == 1) {
            let (s, z) = (q.scale[0] as f64, q.zero_point[0] as f64);
            let qv = self.quantize_to(out, lay, v)?;
            let dtype = self.g.ty(qv).dtype;
            let (tmin, tmax) = match dtype {
                DType::I8 => (-128.0, 127.0),
                DType::U8 => (0.0, 255.0),
                DType::I16 => (-32768.0, 32767.0),
                _ => return Err(self.err(format!("quantised {dtype:?} result"))),
            };
            let qlo = (z + (lo / s).round()).max(tmin);
            let qhi = if hi.is_finite() { (z + (hi / s).round()).min(tmax) } else { tmax };
            if qlo <= tmin && qhi >= tmax {
                // The type's range already clamps.
                return Ok(qv);
            }
            let (a, b) = (self.scalar(dtype, qlo)?, self.scalar(dtype, qhi)?);
            return self.emit1(OpKind::Clip, Attrs::new(), vec![Some(qv), Some(a), Some(b)]);
        }
        let v = self.clip(v, lo, hi)?;
        self.quantize_to(out, lay, v)
    }

    fn clip(&mut self, v: ValueId, lo: f64, hi: f64) -> Result<ValueId, ImportError> {
        let dtype = self.g.ty(v).dtype;
        if lo == 0.0 && hi.is_infinite() {
            return self.emit1(OpKind::Relu, Attrs::new(), vec![Some(v)]);
        }
        let a = self.scalar(dtype, lo)?;
        let b = if hi.is_finite() { Some(self.scalar(dtype, hi)?) } else { None };
        self.emit1(OpKind::Clip, Attrs::new(), vec![Some(v), Some(a), b])
    }

    /// Imports one operator.
    pub(crate) fn import_op(&mut self, op: &super::reader::Operator) -> Result<(), ImportError> {
        let super::reader::OpCode::Builtin(code) = self.m.opcodes[op.opcode] else {
            return Err(self.err("custom operators are not supported"));
        };
        let b = fb::BuiltinOperator::try_from(code).map_err(|_| self.err("unknown builtin operator"))?;
        // Complex tensors are two real ones: only these ops know to read both parts.
        const COMPLEX_OK: &[B] = &[
            B::Reshape,
            B::Squeeze,
            B::ExpandDims,
            B::Transpose,
            B::Slice,
            B::StridedSlice,
            B::Gather,
            B::GatherNd,
            B::ReverseV2,
            B::Tile,
            B::BroadcastTo,
            B::Concatenation,
            B::Split,
            B::SplitV,
            B::Cast,
            B::ComplexAbs,
            B::Real,
            B::Imag,
            B::Shape,
        ];
        if !COMPLEX_OK.contains(&b) {
            if let Some(&t) =
                op.inputs.iter().find(|&&t| t >= 0 && self.held.get(t as usize).is_some_and(|h| h.imag.is_some()))
            {
                return Err(self.err(format!("complex operand (tensor {t}); kiln reads complex tensors only through data movement, COMPLEX_ABS, REAL, IMAG and CAST")));
            }
        }
        use fb::ActivationFunctionType as A;
        match b {
            B::Add | B::Sub | B::Mul | B::Div => {
                let act = match b {
                    B::Add => options!(self, op, AddOptions).map(|o| o.fused_activation_function),
                    B::Sub => options!(self, op, SubOptions).map(|o| o.fused_activation_function),
                    B::Mul => options!(self, op, MulOptions).map(|o| o.fused_activation_function),
                    _ => options!(self, op, DivOptions).map(|o| o.fused_activation_function),
                }
                .unwrap_or(A::None);
                let kind = match b {
                    B::Add => OpKind::Add,
                    B::Sub => OpKind::Sub,
                    B::Mul => OpKind::Mul,
                    _ => OpKind::Div,
                };
                // Integer arithmetic (shape computations) stays integer.
                let (x, y) = (self.input(op, 0)?, self.input(op, 1)?);
                let lay = self.elementwise_layout(&[x, y])?;
                let (a, c) = (self.operand(x, &lay)?, self.operand(y, &lay)?);
                let v = self.emit1(kind, Attrs::new(), vec![Some(a), Some(c)])?;
                let out = self.output(op, 0)?;
                self.finish(out, &lay, v, act)
            }
            B::Pow
            | B::Maximum
            | B::Minimum
            | B::Equal
            | B::NotEqual
            | B::Greater
            | B::GreaterEqual
            | B::Less
            | B::LessEqual
            | B::LogicalAnd
            | B::LogicalOr
            | B::Prelu => {
                let kind = match b {
                    B::Pow => OpKind::Pow,
                    B::Maximum => OpKind::Max,
                    B::Minimum => OpKind::Min,
                    B::Equal | B::NotEqual => OpKind::Equal,
                    B::Greater => OpKind::Greater,
                    B::GreaterEqual => OpKind::GreaterOrEqual,
                    B::Less => OpKind::Less,
                    B::LessEqual => OpKind::LessOrEqual,
                    B::LogicalAnd => OpKind::And,
                    B::LogicalOr => OpKind::Or,
                    _ => OpKind::PRelu,
                };
                let (x, y) = (self.input(op, 0)?, self.input(op, 1)?);
                let lay = self.elementwise_layout(&[x, y])?;
                let (a, c) = (self.operand(x, &lay)?, self.operand(y, &lay)?);
                let mut v = self.emit1(kind, Attrs::new(), vec![Some(a), Some(c)])?;
                if b == B::NotEqual {
                    v = self.emit1(OpKind::Not, Attrs::new(), vec![Some(v)])?;
                }
                let out = self.output(op, 0)?;
                self.set_real(out, &lay, v)
            }
            B::SquaredDifference => {
                let (x, y) = (self.input(op, 0)?, self.input(op, 1)?);
                let lay = self.elementwise_layout(&[x, y])?;
                let (a, c) = (self.operand(x, &lay)?, self.operand(y, &lay)?);
                let d = self.emit1(OpKind::Sub, Attrs::new(), vec![Some(a), Some(c)])?;
                let v = self.emit1(OpKind::Mul, Attrs::new(), vec![Some(d), Some(d)])?;
                let out = self.output(op, 0)?;
                self.set_real(out, &lay, v)
            }
            B::FloorDiv | B::FloorMod => {
                let (x, y) = (self.input(op, 0)?, self.input(op, 1)?);
                let lay = self.elementwise_layout(&[x, y])?;
                let (a, c) = (self.operand(x, &lay)?, self.operand(y, &lay)?);
                let int = self.g.ty(a).dtype.is_int();
                let v = if int {
                    // Python-style modulo (the divisor's sign), then an exact division.
                    let m = self.emit1(OpKind::Mod, Attrs::new(), vec![Some(a), Some(c)])?;
                    if b == B::FloorMod {
                        m
                    } else {
                        let d = self.emit1(OpKind::Sub, Attrs::new(), vec![Some(a), Some(m)])?;
                        self.emit1(OpKind::Div, Attrs::new(), vec![Some(d), Some(c)])?
                    }
                } else {
                    let q = self.emit1(OpKind::Div, Attrs::new(), vec![Some(a), Some(c)])?;
                    let f = self.emit1(OpKind::Floor, Attrs::new(), vec![Some(q)])?;
                    if b == B::FloorDiv {
                        f
                    } else {
                        let p = self.emit1(OpKind::Mul, Attrs::new(), vec![Some(f), Some(c)])?;
                        self.emit1(OpKind::Sub, Attrs::new(), vec![Some(a), Some(p)])?
                    }
                };
                let out = self.output(op, 0)?;
                self.set_real(out, &lay, v)
            }
            B::LogicalNot
            | B::Logistic
            | B::Tanh
            | B::Relu
            | B::Relu6
            | B::ReluN1To1
            | B::Relu0To1
            | B::LeakyRelu
            | B::HardSwish
            | B::Gelu
            | B::Elu
            | B::Exp
            | B::Log
            | B::Sqrt
            | B::Rsqrt
            | B::Square
            | B::Abs
            | B::Neg
            | B::Sin
            | B::Cos
            | B::Floor
            | B::Ceil
            | B::Round
            | B::Sign => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let lay = self.elementwise_layout(&[x])?;
                // Max-like activations commute with a shared quantisation: run them
                // on the integers.
                let on_ints = matches!(b, B::Relu | B::Relu6 | B::ReluN1To1 | B::Relu0To1) && self.quant(x).is_some();
                if on_ints && self.same_quant(x, out) && self.quant(x).is_some_and(|q| q.scale.len() == 1) {
                    let v = self.real(x, &lay)?;
                    let act = match b {
                        B::Relu => A::Relu,
                        B::Relu6 => A::Relu6,
                        B::ReluN1To1 => A::ReluN1To1,
                        _ => A::None,
                    };
                    if act != A::None {
                        return self.finish(out, &lay, v, act);
                    }
                }
                let a = self.real(x, &lay)?;
                let e = |imp: &mut Self, k: OpKind, attrs: Attrs, v: ValueId| imp.emit1(k, attrs, vec![Some(v)]);
                let v = match b {
                    B::LogicalNot => e(self, OpKind::Not, Attrs::new(), a)?,
                    B::Logistic => e(self, OpKind::Sigmoid, Attrs::new(), a)?,
                    B::Tanh => e(self, OpKind::Tanh, Attrs::new(), a)?,
                    B::Relu => e(self, OpKind::Relu, Attrs::new(), a)?,
                    B::Relu6 => self.clip(a, 0.0, 6.0)?,
                    B::ReluN1To1 => self.clip(a, -1.0, 1.0)?,
                    B::Relu0To1 => self.clip(a, 0.0, 1.0)?,
                    B::LeakyRelu => {
                        let alpha = options!(self, op, LeakyReluOptions).map_or(0.2, |o| o.alpha);
                        e(self, OpKind::LeakyRelu, Attrs::new().with("alpha", Attr::Float(alpha)), a)?
                    }
                    B::HardSwish => e(self, OpKind::HardSwish, Attrs::new(), a)?,
                    B::Gelu => {
                        let approx = options!(self, op, GeluOptions).is_some_and(|o| o.approximate);
                        let attrs =
                            Attrs::new().with("approximate", Attr::String(if approx { "tanh" } else { "none" }.into()));
                        e(self, OpKind::Gelu, attrs, a)?
                    }
                    B::Elu => e(self, OpKind::Elu, Attrs::new(), a)?,
                    B::Exp => e(self, OpKind::Exp, Attrs::new(), a)?,
                    B::Log => e(self, OpKind::Log, Attrs::new(), a)?,
                    B::Sqrt => e(self, OpKind::Sqrt, Attrs::new(), a)?,
                    B::Rsqrt => {
                        let s = e(self, OpKind::Sqrt, Attrs::new(), a)?;
                        e(self, OpKind::Reciprocal, Attrs::new(), s)?
                    }
                    B::Square => self.emit1(OpKind::Mul, Attrs::new(), vec![Some(a), Some(a)])?,
                    B::Abs => e(self, OpKind::Abs, Attrs::new(), a)?,
                    B::Neg => e(self, OpKind::Neg, Attrs::new(), a)?,
                    B::Sin => e(self, OpKind::Sin, Attrs::new(), a)?,
                    B::Cos => e(self, OpKind::Cos, Attrs::new(), a)?,
                    B::Floor => e(self, OpKind::Floor, Attrs::new(), a)?,
                    B::Ceil => e(self, OpKind::Ceil, Attrs::new(), a)?,
                    B::Round => e(self, OpKind::Round, Attrs::new(), a)?,
                    _ => e(self, OpKind::Sign, Attrs::new(), a)?,
                };
                self.set_real(out, &lay, v)
            }
            B::Conv2d | B::DepthwiseConv2d => self.conv(op, b == B::DepthwiseConv2d),
            B::TransposeConv => self.transpose_conv(op),
            B::FullyConnected => self.fully_connected(op),
            B::BatchMatmul => {
                let o = options!(self, op, BatchMatMulOptions);
                let (adj_x, adj_y) = o.map_or((false, false), |o| (o.adj_x, o.adj_y));
                let (x, y) = (self.input(op, 0)?, self.input(op, 1)?);
                let (rx, ry) = (self.rank(x)?, self.rank(y)?);
                if rx < 2 || ry < 2 {
                    return Err(self.err(format!("operands of rank {rx} and {ry}; expected 2 or more")));
                }
                let swap = |r: usize| -> Perm {
                    let mut p = identity(r);
                    p.swap(r - 1, r - 2);
                    p
                };
                let out = self.output(op, 0)?;
                let (px, py) =
                    (if adj_x { swap(rx) } else { identity(rx) }, if adj_y { swap(ry) } else { identity(ry) });
                if self.int8_batch_matmul((x, &px), (y, &py), out)? {
                    return Ok(());
                }
                let a = if adj_x { self.real(x, &swap(rx))? } else { self.real(x, &identity(rx))? };
                let c = if adj_y { self.real(y, &swap(ry))? } else { self.real(y, &identity(ry))? };
                let v = self.emit1(OpKind::MatMul, Attrs::new(), vec![Some(a), Some(c)])?;
                let r = self.g.ty(v).shape.rank();
                self.set_real(out, &identity(r), v)
            }
            B::AveragePool2d | B::MaxPool2d => {
                let o = options!(self, op, Pool2DOptions).ok_or_else(|| self.err("options are missing"))?;
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let max = b == B::MaxPool2d;
                let on_ints = max && self.same_quant(x, out) && self.quant(x).is_some();
                let a = if on_ints { self.raw(x, &NCHW)? } else { self.real(x, &NCHW)? };
                let d = self.dims(a);
                if d.len() != 4 {
                    return Err(self.err(format!("input of rank {}, expected 4", d.len())));
                }
                let k = [o.filter_height.max(1) as usize, o.filter_width.max(1) as usize];
                let s = [o.stride_h.max(1) as usize, o.stride_w.max(1) as usize];
                let pads = same_pads(o.padding, &d[2..], &k, &s, &[1, 1]);
                let attrs = Attrs::new()
                    .with("kernel_shape", ints(&[k[0] as i64, k[1] as i64]))
                    .with("strides", ints(&[s[0] as i64, s[1] as i64]))
                    .with("pads", ints(&pads));
                let kind = if max { OpKind::MaxPool } else { OpKind::AveragePool };
                let v = self.emit1(kind, attrs, vec![Some(a)])?;
                if on_ints {
                    // Max pooling commutes with the shared quantisation.
                    let act = o.fused_activation_function;
                    if act == A::None {
                        self.set_raw(out, &NCHW, v);
                        return Ok(());
                    }
                    let r = self.real_of_raw(x, v)?;
                    return self.finish(out, &NCHW, r, act);
                }
                self.finish(out, &NCHW, v, o.fused_activation_function)
            }
            B::Mean | B::Sum | B::ReduceMax | B::ReduceMin | B::ReduceProd => {
                let keep = options!(self, op, ReducerOptions).is_some_and(|o| o.keep_dims);
                let kind = match b {
                    B::Mean => OpKind::ReduceMean,
                    B::Sum => OpKind::ReduceSum,
                    B::ReduceMax => OpKind::ReduceMax,
                    B::ReduceMin => OpKind::ReduceMin,
                    _ => OpKind::ReduceProd,
                };
                let x = self.input(op, 0)?;
                let r = self.rank(x)? as i64;
                let mut axes: Vec<usize> = Vec::new();
                for a in self.ints_of(self.input(op, 1)?, "the axes")? {
                    let a = if a < 0 { a + r } else { a };
                    if !(0..r).contains(&a) {
                        return Err(self.err(format!("axis {a} out of range for rank {r}")));
                    }
                    if !axes.contains(&(a as usize)) {
                        axes.push(a as usize);
                    }
                }
                // Reduce in the layout the operand is in when the kept axes stay in order.
                let lay = match self.produced_layout(x) {
                    Some(p)
                        if p.as_slice() == NCHW
                            && (keep || {
                                let kept: Vec<usize> = p.iter().copied().filter(|a| !axes.contains(a)).collect();
                                kept.windows(2).all(|w| w[0] < w[1])
                            }) =>
                    {
                        p
                    }
                    _ => identity(r as usize),
                };
                let held_axes: Vec<i64> =
                    axes.iter().map(|a| lay.iter().position(|p| p == a).unwrap_or(0) as i64).collect();
                let out = self.output(op, 0)?;
                if b == B::Mean && self.int8_mean(x, out, &lay, &held_axes, &axes, keep)? {
                    return Ok(());
                }
                let a = self.real(x, &lay)?;
                let axes_v = self.i64s(&held_axes);
                let attrs = Attrs::new().with("keepdims", Attr::Int(keep as i64));
                let v = self.emit1(kind, attrs, vec![Some(a), Some(axes_v)])?;
                let out_lay = if keep { lay } else { identity(self.g.ty(v).shape.rank()) };
                self.set_real(out, &out_lay, v)
            }
            B::Reshape | B::Squeeze | B::ExpandDims => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let (kind, arg) = match b {
                    B::Reshape => {
                        let shape = match self.opt_input(op, 1) {
                            Some(s) => self.ints_of(s, "the new shape")?,
                            None => match options!(self, op, ReshapeOptions).and_then(|o| o.new_shape.clone()) {
                                Some(s) => s.iter().map(|&d| d as i64).collect(),
                                None => self.desc(out).shape.iter().map(|&d| d as i64).collect(),
                            },
                        };
                        (OpKind::Reshape, shape)
                    }
                    B::Squeeze => {
                        let r = self.rank(x)?;
                        let mut axes: Vec<i64> = options!(self, op, SqueezeOptions)
                            .and_then(|o| o.squeeze_dims.clone())
                            .unwrap_or_default()
                            .iter()
                            .map(|&a| a as i64)
                            .collect();
                        if axes.is_empty() {
                            let v = self.any_value(x)?;
                            axes = self
                                .dims(v)
                                .iter()
                                .enumerate()
                                .filter(|(_, &d)| d == 1)
                                .map(|(i, _)| i as i64)
                                .collect();
                            if self.held[x].imag.is_none() && self.produced_layout(x).is_some_and(|p| p != identity(r))
                            {
                                let n = self.native_of(x, r)?;
                                axes = self
                                    .dims(n)
                                    .iter()
                                    .enumerate()
                                    .filter(|(_, &d)| d == 1)
                                    .map(|(i, _)| i as i64)
                                    .collect();
                            }
                        }
                        (OpKind::Squeeze, axes)
                    }
                    _ => {
                        let a = self.ints_of(self.input(op, 1)?, "the axis")?;
                        (OpKind::Unsqueeze, a)
                    }
                };
                self.movement(op, x, out, |imp, v| {
                    let a = imp.i64s(&arg);
                    imp.emit1(kind, Attrs::new(), vec![Some(v), Some(a)])
                })
            }
            B::Transpose => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let perm = self.ints_of(self.input(op, 1)?, "the permutation")?;
                let r = self.rank(x)? as i64;
                let perm: Vec<i64> = perm.iter().map(|&p| if p < 0 { p + r } else { p }).collect();
                self.movement(op, x, out, |imp, v| {
                    imp.emit1(OpKind::Transpose, Attrs::new().with("perm", ints(&perm)), vec![Some(v)])
                })
            }
            B::Concatenation => self.concat(op),
            B::Split | B::SplitV => self.split(op, b == B::SplitV),
            B::Pack => {
                let n = op.inputs.len();
                let first = self.input(op, 0)?;
                let r = self.rank(first)? as i64;
                let axis = options!(self, op, PackOptions).map_or(0, |o| o.axis as i64);
                let axis = if axis < 0 { axis + r + 1 } else { axis };
                let out = self.output(op, 0)?;
                let ins: Vec<usize> = (0..n).map(|i| self.input(op, i)).collect::<Result<_, _>>()?;
                let quant_ok = ins.iter().all(|&t| self.same_quant(t, out));
                let mut parts = Vec::new();
                for &t in &ins {
                    let v = if quant_ok {
                        self.raw(t, &identity(r as usize))?
                    } else {
                        self.real(t, &identity(r as usize))?
                    };
                    let a = self.i64s(&[axis]);
                    parts.push(Some(self.emit1(OpKind::Unsqueeze, Attrs::new(), vec![Some(v), Some(a)])?));
                }
                let v = self.emit1(OpKind::Concat, Attrs::new().with("axis", Attr::Int(axis)), parts)?;
                let lay = identity(r as usize + 1);
                if quant_ok {
                    self.set_raw(out, &lay, v);
                    Ok(())
                } else {
                    self.set_real(out, &lay, v)
                }
            }
            B::Unpack => {
                let x = self.input(op, 0)?;
                let r = self.rank(x)? as i64;
                if r == 0 {
                    return Err(self.err("a scalar operand"));
                }
                let axis = options!(self, op, UnpackOptions).map_or(0, |o| o.axis as i64);
                let axis = if axis < 0 { axis + r } else { axis };
                let n = op.outputs.len();
                let v = self.native_of(x, r as usize)?;
                let parts = self.emit(
                    OpKind::Split,
                    Attrs::new().with("axis", Attr::Int(axis)).with("num_outputs", Attr::Int(n as i64)),
                    vec![Some(v)],
                    n,
                )?;
                for (i, p) in parts.into_iter().enumerate() {
                    let out = self.output(op, i)?;
                    let a = self.i64s(&[axis]);
                    let s = self.emit1(OpKind::Squeeze, Attrs::new(), vec![Some(p), Some(a)])?;
                    if self.same_quant(x, out) {
                        self.set_raw(out, &identity(r as usize - 1), s);
                    } else {
                        let real = self.real_of_raw(x, s)?;
                        self.set_real(out, &identity(r as usize - 1), real)?;
                    }
                }
                Ok(())
            }
            B::Pad | B::Padv2 | B::MirrorPad => self.pad(op, b),
            B::StridedSlice => self.strided_slice(op),
            B::Slice => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let begin = self.ints_of(self.input(op, 1)?, "the begin")?;
                let size = self.ints_of(self.input(op, 2)?, "the size")?;
                let v0 = self.any_value(x)?;
                let r = self.g.ty(v0).shape.rank();
                let dims = {
                    let n = if self.held[x].imag.is_some() { v0 } else { self.native_of(x, r)? };
                    self.dims(n)
                };
                if begin.len() != r || size.len() != r {
                    return Err(self.err(format!("begin/size of {}/{} entries for rank {r}", begin.len(), size.len())));
                }
                let ends: Vec<i64> = (0..r)
                    .map(|i| if size[i] < 0 { dims[i] as i64 } else { begin[i].saturating_add(size[i]) })
                    .collect();
                self.movement(op, x, out, |imp, v| {
                    let (s, e) = (imp.i64s(&begin), imp.i64s(&ends));
                    imp.emit1(OpKind::Slice, Attrs::new(), vec![Some(v), Some(s), Some(e)])
                })
            }
            B::Gather => {
                let o = options!(self, op, GatherOptions);
                if o.is_some_and(|o| o.batch_dims != 0) {
                    return Err(self.err("batch_dims other than 0 is not supported"));
                }
                let axis = o.map_or(0, |o| o.axis as i64);
                let x = self.input(op, 0)?;
                let idx = self.input(op, 1)?;
                let ir = self.rank(idx)?;
                let i = self.native_of(idx, ir)?;
                let out = self.output(op, 0)?;
                self.movement(op, x, out, |imp, v| {
                    imp.emit1(OpKind::Gather, Attrs::new().with("axis", Attr::Int(axis)), vec![Some(v), Some(i)])
                })
            }
            B::GatherNd => {
                let x = self.input(op, 0)?;
                let idx = self.input(op, 1)?;
                let ir = self.rank(idx)?;
                let i = self.native_of(idx, ir)?;
                let i = self.cast(i, DType::I64)?;
                let out = self.output(op, 0)?;
                self.movement(op, x, out, |imp, v| imp.emit1(OpKind::GatherND, Attrs::new(), vec![Some(v), Some(i)]))
            }
            B::ResizeBilinear | B::ResizeNearestNeighbor => {
                let (align, half) = if b == B::ResizeBilinear {
                    options!(self, op, ResizeBilinearOptions)
                        .map_or((false, false), |o| (o.align_corners, o.half_pixel_centers))
                } else {
                    options!(self, op, ResizeNearestNeighborOptions)
                        .map_or((false, false), |o| (o.align_corners, o.half_pixel_centers))
                };
                let x = self.input(op, 0)?;
                let size = self.ints_of(self.input(op, 1)?, "the size")?;
                if size.len() != 2 || self.rank(x)? != 4 {
                    return Err(self.err("expected a rank-4 input and a size of two entries"));
                }
                if b == B::ResizeBilinear {
                    let out = self.output(op, 0)?;
                    if self.int8_resize_bilinear(x, out, &size, align, half)? {
                        return Ok(());
                    }
                }
                let a = self.real(x, &NCHW)?;
                let d = self.dims(a);
                let sizes = self.i64s(&[d[0] as i64, d[1] as i64, size[0], size[1]]);
                let ctm = if align {
                    "align_corners"
                } else if half {
                    "half_pixel"
                } else {
                    "asymmetric"
                };
                let mut attrs = Attrs::new().with("coordinate_transformation_mode", Attr::String(ctm.into()));
                if b == B::ResizeBilinear {
                    attrs.set("mode", Attr::String("linear".into()));
                } else {
                    // TensorFlow: floor(x·scale) (asymmetric), floor((x+½)·scale)
                    // (half pixel: ONNX's (x+½)·scale − ½ rounded half up), round(x·scale)
                    // (align corners).
                    let nearest = if align || half { "round_prefer_ceil" } else { "floor" };
                    attrs.set("mode", Attr::String("nearest".into()));
                    attrs.set("nearest_mode", Attr::String(nearest.into()));
                }
                let v = self.emit1(OpKind::Resize, attrs, vec![Some(a), None, None, Some(sizes)])?;
                let out = self.output(op, 0)?;
                self.set_real(out, &NCHW, v)
            }
            B::Softmax | B::LogSoftmax => {
                let x = self.input(op, 0)?;
                let r = self.rank(x)?;
                if r == 0 {
                    return Err(self.err("a scalar operand"));
                }
                let lay = match self.produced_layout(x) {
                    Some(p) if p.as_slice() == NCHW => p,
                    _ => identity(r),
                };
                let axis = lay.iter().position(|&p| p == r - 1).unwrap_or(r - 1) as i64;
                let mut a = self.real(x, &lay)?;
                let beta =
                    if b == B::Softmax { options!(self, op, SoftmaxOptions).map_or(1.0, |o| o.beta) } else { 1.0 };
                if beta != 1.0 {
                    let s = self.scalar(self.g.ty(a).dtype, beta as f64)?;
                    a = self.emit1(OpKind::Mul, Attrs::new(), vec![Some(a), Some(s)])?;
                }
                let kind = if b == B::Softmax { OpKind::Softmax } else { OpKind::LogSoftmax };
                let v = self.emit1(kind, Attrs::new().with("axis", Attr::Int(axis)), vec![Some(a)])?;
                let out = self.output(op, 0)?;
                self.set_real(out, &lay, v)
            }
            B::Quantize | B::Dequantize => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let lay = self.elementwise_layout(&[x])?;
                let v = self.real(x, &lay)?;
                self.set_real(out, &lay, v)
            }
            B::Select | B::SelectV2 => {
                let (c, x, y) = (self.input(op, 0)?, self.input(op, 1)?, self.input(op, 2)?);
                let lay = self.elementwise_layout(&[c, x, y])?;
                let (cv, xv, yv) = (self.operand(c, &lay)?, self.operand(x, &lay)?, self.operand(y, &lay)?);
                let v = self.emit1(OpKind::Where, Attrs::new(), vec![Some(cv), Some(xv), Some(yv)])?;
                let out = self.output(op, 0)?;
                self.set_real(out, &lay, v)
            }
            B::ReverseV2 => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let axes = self.ints_of(self.input(op, 1)?, "the axes")?;
                let n = axes.len();
                self.movement(op, x, out, |imp, v| {
                    let s = imp.i64s(&vec![-1; n]);
                    let e = imp.i64s(&vec![i64::MIN; n]);
                    let a = imp.i64s(&axes);
                    let st = imp.i64s(&vec![-1; n]);
                    imp.emit1(OpKind::Slice, Attrs::new(), vec![Some(v), Some(s), Some(e), Some(a), Some(st)])
                })
            }
            B::Cast => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let v = match self.complex(x) {
                    // A complex value cast to a real type keeps its real part.
                    Some((re, _)) => re,
                    None => {
                        let r = self.rank(x)?;
                        self.raw(x, &identity(r))?
                    }
                };
                let to =
                    super::tensor_dtype(self.desc(out).dtype).ok_or_else(|| self.err("unsupported result type"))?;
                let v = self.cast(v, to)?;
                let r = self.g.ty(v).shape.rank();
                self.set_raw(out, &identity(r), v);
                Ok(())
            }
            B::Shape => {
                let x = self.input(op, 0)?;
                let v = self.any_value(x)?;
                let dims: Vec<i64> = self.dims(v).iter().map(|&d| d as i64).collect();
                let dims = if self.held[x].imag.is_some()
                    || self.produced_layout(x).is_none_or(|p| p == identity(dims.len()))
                {
                    dims
                } else {
                    let n = self.native_of(x, dims.len())?;
                    self.dims(n).iter().map(|&d| d as i64).collect()
                };
                let out = self.output(op, 0)?;
                let to = super::tensor_dtype(self.desc(out).dtype).unwrap_or(DType::I32);
                let t = Tensor::from_i64(to, Shape::new(vec![dims.len()]).map_err(|e| self.err(e.to_string()))?, &dims)
                    .map_err(|e| self.err(e.to_string()))?;
                let c = self.konst(t);
                self.set_raw(out, &[0], c);
                Ok(())
            }
            B::Range => {
                let (s, l, d) = (self.input(op, 0)?, self.input(op, 1)?, self.input(op, 2)?);
                let vs: Vec<ValueId> = [s, l, d].iter().map(|&t| self.raw(t, &[])).collect::<Result<_, _>>()?;
                let v = self.emit1(OpKind::Range, Attrs::new(), vs.into_iter().map(Some).collect())?;
                let out = self.output(op, 0)?;
                self.set_raw(out, &[0], v);
                Ok(())
            }
            B::Fill => {
                let dims = self.ints_of(self.input(op, 0)?, "the dims")?;
                let x = self.input(op, 1)?;
                let v = self.raw(x, &[])?;
                let shape = self.i64s(&dims);
                let e = self.emit1(OpKind::Expand, Attrs::new(), vec![Some(v), Some(shape)])?;
                let out = self.output(op, 0)?;
                self.set_raw(out, &identity(dims.len()), e);
                Ok(())
            }
            B::Tile | B::BroadcastTo => {
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let arg = self.ints_of(self.input(op, 1)?, "the multiples")?;
                let kind = if b == B::Tile { OpKind::Tile } else { OpKind::Expand };
                self.movement(op, x, out, |imp, v| {
                    let a = imp.i64s(&arg);
                    imp.emit1(kind, Attrs::new(), vec![Some(v), Some(a)])
                })
            }
            B::L2Normalization => {
                let x = self.input(op, 0)?;
                let r = self.rank(x)?;
                let a = self.real(x, &identity(r))?;
                let sq = self.emit1(OpKind::Mul, Attrs::new(), vec![Some(a), Some(a)])?;
                let axes = self.i64s(&[r as i64 - 1]);
                let sum = self.emit1(OpKind::ReduceSum, Attrs::new(), vec![Some(sq), Some(axes)])?;
                let norm = self.emit1(OpKind::Sqrt, Attrs::new(), vec![Some(sum)])?;
                // LiteRT: x / max(‖x‖, 1e-6).
                let eps = self.scalar(self.g.ty(a).dtype, 1e-6)?;
                let norm = self.emit1(OpKind::Max, Attrs::new(), vec![Some(norm), Some(eps)])?;
                let v = self.emit1(OpKind::Div, Attrs::new(), vec![Some(a), Some(norm)])?;
                let out = self.output(op, 0)?;
                let act = options!(self, op, L2NormOptions).map_or(A::None, |o| o.fused_activation_function);
                self.finish(out, &identity(r), v, act)
            }
            B::AddN => {
                let ins: Vec<usize> = (0..op.inputs.len()).map(|i| self.input(op, i)).collect::<Result<_, _>>()?;
                let lay = self.elementwise_layout(&ins)?;
                let vs: Vec<Option<ValueId>> =
                    ins.iter().map(|&t| self.operand(t, &lay).map(Some)).collect::<Result<_, _>>()?;
                let v = self.emit1(OpKind::Sum, Attrs::new(), vs)?;
                let out = self.output(op, 0)?;
                self.set_real(out, &lay, v)
            }
            B::ArgMax | B::ArgMin => {
                let x = self.input(op, 0)?;
                let r = self.rank(x)? as i64;
                if r == 0 {
                    return Err(self.err("a scalar operand"));
                }
                let axis = self.ints_of(self.input(op, 1)?, "the axis")?.first().copied().unwrap_or(0);
                let axis = if axis < 0 { axis + r } else { axis };
                let a = self.real(x, &identity(r as usize))?;
                let kind = if b == B::ArgMax { OpKind::ArgMax } else { OpKind::ArgMin };
                let v = self.emit1(
                    kind,
                    Attrs::new().with("axis", Attr::Int(axis)).with("keepdims", Attr::Int(0)),
                    vec![Some(a)],
                )?;
                let out = self.output(op, 0)?;
                self.set_real(out, &identity(r as usize - 1), v)
            }
            B::DepthToSpace | B::SpaceToDepth => {
                let bs = if b == B::DepthToSpace {
                    options!(self, op, DepthToSpaceOptions).map(|o| o.block_size)
                } else {
                    options!(self, op, SpaceToDepthOptions).map(|o| o.block_size)
                }
                .ok_or_else(|| self.err("options are missing"))?;
                let x = self.input(op, 0)?;
                let out = self.output(op, 0)?;
                let on_ints = self.same_quant(x, out) && self.quant(x).is_some();
                let a = if on_ints { self.raw(x, &NCHW)? } else { self.real(x, &NCHW)? };
                let mut attrs = Attrs::new().with("blocksize", Attr::Int(bs as i64));
                // TensorFlow's NHWC depth_to_space is ONNX's DCR order.
                let kind = if b == B::DepthToSpace {
                    attrs.set("mode", Attr::String("DCR".into()));
                    OpKind::DepthToSpace
                } else {
                    OpKind::SpaceToDepth
                };
                let v = self.emit1(kind, attrs, vec![Some(a)])?;
                if on_ints {
                    self.set_raw(out, &NCHW, v);
                    Ok(())
                } else {
                    self.set_real(out, &NCHW, v)
                }
            }
            B::Rfft2d => self.rfft2d(op),
            B::ComplexAbs | B::Real | B::Imag => {
                let x = self.input(op, 0)?;
                let (re, im) = self.complex(x).ok_or_else(|| self.err("the input is not complex"))?;
                let v = match b {
                    B::Real => re,
                    B::Imag => im,
                    _ => {
                        let r2 = self.emit1(OpKind::Mul, Attrs::new(), vec![Some(re), Some(re)])?;
                        let i2 = self.emit1(OpKind::Mul, Attrs::new(), vec![Some(im), Some(im)])?;
                        let s = self.emit1(OpKind::Add, Attrs::new(), vec![Some(r2), Some(i2)])?;
                        self.emit1(OpKind::Sqrt, Attrs::new(), vec![Some(s)])?
                    }
                };
                let out = self.output(op, 0)?;
                let r = self.g.ty(v).shape.rank();
                self.set_real(out, &identity(r), v)
            }
            _ => Err(self.err("not translated")),
        }
    }

    /// Any value held for tensor `t` (to read its rank or extents in that layout).
    fn any_value(&mut self, t: usize) -> Result<ValueId, ImportError> {
        match self.held[t].by_layout.first() {
            Some((_, v)) => Ok(*v),
            None => {
                let r = self.rank(t)?;
                self.native_of(t, r)
            }
        }
    }

    /// Real numbers of `v`, which holds values stored as tensor `t` stores them.
    fn real_of_raw(&mut self, t: usize, v: ValueId) -> Result<ValueId, ImportError> {
        let Some(q) = self.quant(t) else { return Ok(v) };
        if q.scale.len() != 1 {
            return Err(self.err("per-channel quantisation on a data-movement result"));
        }
        let dtype = self.g.ty(v).dtype;
        let (s, z, _) = self.qparams(q, dtype, &[])?;
        self.emit1(OpKind::DequantizeLinear, Attrs::new(), vec![Some(v), Some(s), Some(z)])
    }

    /// A data-movement op `f` from `x` to `out` in TFLite order: on both parts of a
    /// complex tensor, on the integers when `x` and `out` share their quantisation.
    fn movement(
        &mut self,
        _op: &super::reader::Operator,
        x: usize,
        out: usize,
        f: impl Fn(&mut Self, ValueId) -> Result<ValueId, ImportError>,
    ) -> Result<(), ImportError> {
        if let Some((re, im)) = self.complex(x) {
            let (a, b) = (f(self, re)?, f(self, im)?);
            self.set_complex(out, a, b);
            return Ok(());
        }
        let r = self.rank(x)?;
        if self.same_quant(x, out) {
            let v = self.raw(x, &identity(r))?;
            let y = f(self, v)?;
            let ry = self.g.ty(y).shape.rank();
            self.set_raw(out, &identity(ry), y);
            return Ok(());
        }
        let v = self.real(x, &identity(r))?;
        let y = f(self, v)?;
        let ry = self.g.ty(y).shape.rank();
        self.set_real(out, &identity(ry), y)
    }

    fn conv(&mut self, op: &super::reader::Operator, depthwise: bool) -> Result<(), ImportError> {
        let (pad, sw, sh, act, dw, dh) = if depthwise {
            let o = options!(self, op, DepthwiseConv2DOptions).ok_or_else(|| self.err("options are missing"))?;
            (o.padding, o.stride_w, o.stride_h, o.fused_activation_function, o.dilation_w_factor, o.dilation_h_factor)
        } else {
            let o = options!(self, op, Conv2DOptions).ok_or_else(|| self.err("options are missing"))?;
            (o.padding, o.stride_w, o.stride_h, o.fused_activation_function, o.dilation_w_factor, o.dilation_h_factor)
        };
        let (x, w) = (self.input(op, 0)?, self.input(op, 1)?);
        if self.rank(x)? != 4 || self.rank(w)? != 4 {
            return Err(self.err("expected a rank-4 input and filter"));
        }
        let a = self.real(x, &NCHW)?;
        // OHWI → OIHW; depthwise 1HWO → O1HW.
        let wperm: [usize; 4] = if depthwise { [3, 0, 1, 2] } else { NCHW };
        let f = self.real(w, &wperm)?;
        let (xd, fd) = (self.dims(a), self.dims(f));
        let group = if depthwise {
            xd[1]
        } else {
            if fd[1] == 0 || xd[1] % fd[1] != 0 {
                return Err(self.err(format!("{} input channels, filter of {} channels", xd[1], fd[1])));
            }
            xd[1] / fd[1]
        };
        let k = [fd[2], fd[3]];
        let s = [sh.max(1) as usize, sw.max(1) as usize];
        let d = [dh.max(1) as usize, dw.max(1) as usize];
        let pads = same_pads(pad, &xd[2..], &k, &s, &d);
        let attrs = Attrs::new()
            .with("strides", ints(&[s[0] as i64, s[1] as i64]))
            .with("dilations", ints(&[d[0] as i64, d[1] as i64]))
            .with("pads", ints(&pads))
            .with("group", Attr::Int(group as i64));
        // int8 in LiteRT's arithmetic (tflite/int8.rs); the dequantised operands above
        // are then left unread.
        if let (false, Some(range)) = (depthwise, clamp_range(act)) {
            let out = self.output(op, 0)?;
            if self.int8_conv((x, w, self.opt_input(op, 2)), out, &attrs, range)? {
                return Ok(());
            }
        }
        let bias = match self.opt_input(op, 2) {
            Some(bt) => Some(self.real(bt, &[0])?),
            None => None,
        };
        let v = self.emit1(OpKind::Conv, attrs, vec![Some(a), Some(f), bias])?;
        let out = self.output(op, 0)?;
        self.finish(out, &NCHW, v, act)
    }

    fn transpose_conv(&mut self, op: &super::reader::Operator) -> Result<(), ImportError> {
        let o = options!(self, op, TransposeConvOptions).ok_or_else(|| self.err("options are missing"))?;
        let out_shape = self.ints_of(self.input(op, 0)?, "the output shape")?;
        let (w, x) = (self.input(op, 1)?, self.input(op, 2)?);
        let a = self.real(x, &NCHW)?;
        // OHWI → IOHW (ConvTranspose's [C_in, C_out, kH, kW]).
        let f = self.real(w, &[3, 0, 1, 2])?;
        let (xd, fd) = (self.dims(a), self.dims(f));
        if out_shape.len() != 4 || xd.len() != 4 {
            return Err(self.err("expected a rank-4 input and output shape"));
        }
        let s = [o.stride_h.max(1) as usize, o.stride_w.max(1) as usize];
        let k = [fd[2], fd[3]];
        let out_hw = [out_shape[1] as usize, out_shape[2] as usize];
        let mut pads = vec![0i64; 4];
        let mut out_pad = vec![0i64; 2];
        for i in 0..2 {
            // LiteRT pads as the convolution from the output to the input would.
            let before = same_pads(o.padding, &[out_hw[i]], &[k[i]], &[s[i]], &[1])[0];
            let full = (xd[2 + i].saturating_sub(1) * s[i] + k[i]) as i64;
            let after = full - before - out_hw[i] as i64;
            pads[i] = before;
            if after >= 0 {
                pads[2 + i] = after;
            } else {
                out_pad[i] = -after;
            }
        }
        let attrs = Attrs::new()
            .with("strides", ints(&[s[0] as i64, s[1] as i64]))
            .with("pads", ints(&pads))
            .with("output_padding", ints(&out_pad));
        let bias = match self.opt_input(op, 3) {
            Some(bt) => Some(self.real(bt, &[0])?),
            None => None,
        };
        let v = self.emit1(OpKind::ConvTranspose, attrs, vec![Some(a), Some(f), bias])?;
        let out = self.output(op, 0)?;
        self.finish(out, &NCHW, v, o.fused_activation_function)
    }

    fn fully_connected(&mut self, op: &super::reader::Operator) -> Result<(), ImportError> {
        let o = options!(self, op, FullyConnectedOptions);
        let act = o.map_or(fb::ActivationFunctionType::None, |o| o.fused_activation_function);
        let keep = o.is_some_and(|o| o.keep_num_dims);
        if o.is_some_and(|o| o.weights_format != fb::FullyConnectedOptionsWeightsFormat::Default) {
            return Err(self.err("shuffled weights are not supported"));
        }
        let (x, w) = (self.input(op, 0)?, self.input(op, 1)?);
        let rx = self.rank(x)?;
        if rx == 0 || self.rank(w)? != 2 {
            return Err(self.err("expected a non-scalar input and a rank-2 filter"));
        }
        let out = self.output(op, 0)?;
        if self.quant(x).is_some() && self.quant(w).is_some() && self.quant(out).is_some() && !keep {
            return self.quantized_dense(op, x, w, out, act);
        }
        let a = self.real(x, &identity(rx))?;
        // [O, K] read as [K, O]: the product's right operand.
        let f = self.real(w, &[1, 0])?;
        let (xd, fd) = (self.dims(a), self.dims(f));
        let kdim = fd[0];
        let a2 = if rx == 2 && xd[1] == kdim {
            a
        } else {
            let shape = self.i64s(&[-1, kdim as i64]);
            self.emit1(OpKind::Reshape, Attrs::new(), vec![Some(a), Some(shape)])?
        };
        let mut v = self.emit1(OpKind::MatMul, Attrs::new(), vec![Some(a2), Some(f)])?;
        if let Some(bt) = self.opt_input(op, 2) {
            let bv = self.real(bt, &[0])?;
            v = self.emit1(OpKind::Add, Attrs::new(), vec![Some(v), Some(bv)])?;
        }
        if keep && rx != 2 {
            let mut dims: Vec<i64> = xd[..rx - 1].iter().map(|&d| d as i64).collect();
            dims.push(fd[1] as i64);
            let shape = self.i64s(&dims);
            v = self.emit1(OpKind::Reshape, Attrs::new(), vec![Some(v), Some(shape)])?;
        }
        let r = self.g.ty(v).shape.rank();
        self.finish(out, &identity(r), v, act)
    }

    /// A quantised FULLY_CONNECTED as a 1x1 convolution over `[N, K, 1, 1]`: the QDQ
    /// form of a product with a bias (`QLinearMatMul` has none), which
    /// `tensor-fold-quantized-contractions` makes a `QLinearConv`; the reshapes run on
    /// the integers.
    fn quantized_dense(
        &mut self,
        op: &super::reader::Operator,
        x: usize,
        w: usize,
        out: usize,
        act: fb::ActivationFunctionType,
    ) -> Result<(), ImportError> {
        let rx = self.rank(x)?;
        let xr = self.raw(x, &identity(rx))?;
        let wr = self.raw(w, &[0, 1])?;
        let (o, k) = (self.dims(wr)[0] as i64, self.dims(wr)[1] as i64);
        let s4 = self.i64s(&[-1, k, 1, 1]);
        let x4 = self.emit1(OpKind::Reshape, Attrs::new(), vec![Some(xr), Some(s4)])?;
        let w4s = self.i64s(&[o, k, 1, 1]);
        let w4 = self.emit1(OpKind::Reshape, Attrs::new(), vec![Some(wr), Some(w4s)])?;
        let deq = |imp: &mut Self, t: usize, v: ValueId, rank: usize| -> Result<ValueId, ImportError> {
            let q = imp.quant(t).ok_or_else(|| imp.err("not quantised"))?;
            let dtype = imp.g.ty(v).dtype;
            let (s, z, axis) = imp.qparams(q, dtype, &identity(rank))?;
            imp.emit1(
                OpKind::DequantizeLinear,
                Attrs::new().with("axis", Attr::Int(axis)),
                vec![Some(v), Some(s), Some(z)],
            )
        };
        let xf = deq(self, x, x4, 4)?;
        let wf = deq(self, w, w4, 4)?;
        let bias = match self.opt_input(op, 2) {
            Some(bt) => Some(self.real(bt, &[0])?),
            None => None,
        };
        let attrs = Attrs::new().with("kernel_shape", ints(&[1, 1]));
        let y = self.emit1(OpKind::Conv, attrs, vec![Some(xf), Some(wf), bias])?;
        let yq = self.activated(out, &identity(4), y, act)?;
        let s2 = self.i64s(&[-1, o]);
        let y2 = self.emit1(OpKind::Reshape, Attrs::new(), vec![Some(yq), Some(s2)])?;
        self.set_raw(out, &[0, 1], y2);
        Ok(())
    }

    fn concat(&mut self, op: &super::reader::Operator) -> Result<(), ImportError> {
        let o = options!(self, op, ConcatenationOptions);
        let act = o.map_or(fb::ActivationFunctionType::None, |o| o.fused_activation_function);
        let ins: Vec<usize> = (0..op.inputs.len()).map(|i| self.input(op, i)).collect::<Result<_, _>>()?;
        let out = self.output(op, 0)?;
        let Some(&first) = ins.first() else { return Err(self.err("no operands")) };
        let r = self.rank(first)? as i64;
        let axis = o.map_or(0, |o| o.axis as i64);
        let axis = if axis < 0 { axis + r } else { axis };
        if ins.iter().any(|&t| self.complex(t).is_some()) {
            let mut re = Vec::new();
            let mut im = Vec::new();
            for &t in &ins {
                let (a, b) = self.complex(t).ok_or_else(|| self.err("complex and real operands"))?;
                re.push(Some(a));
                im.push(Some(b));
            }
            let a = self.emit1(OpKind::Concat, Attrs::new().with("axis", Attr::Int(axis)), re)?;
            let b = self.emit1(OpKind::Concat, Attrs::new().with("axis", Attr::Int(axis)), im)?;
            self.set_complex(out, a, b);
            return Ok(());
        }
        let lay = self.elementwise_layout(&ins)?;
        let lay = if lay.len() == r as usize { lay } else { identity(r as usize) };
        let held_axis = lay.iter().position(|&p| p as i64 == axis).unwrap_or(0) as i64;
        let on_ints = act == fb::ActivationFunctionType::None && ins.iter().all(|&t| self.same_quant(t, out));
        let vs: Vec<Option<ValueId>> = ins
            .iter()
            .map(|&t| if on_ints { self.raw(t, &lay) } else { self.real(t, &lay) }.map(Some))
            .collect::<Result<_, _>>()?;
        let v = self.emit1(OpKind::Concat, Attrs::new().with("axis", Attr::Int(held_axis)), vs)?;
        if on_ints {
            self.set_raw(out, &lay, v);
            return Ok(());
        }
        self.finish(out, &lay, v, act)
    }

    fn split(&mut self, op: &super::reader::Operator, v_form: bool) -> Result<(), ImportError> {
        // SPLIT: (axis, input); SPLIT_V: (input, sizes, axis).
        let (x, axis_t) =
            if v_form { (self.input(op, 0)?, self.input(op, 2)?) } else { (self.input(op, 1)?, self.input(op, 0)?) };
        let r = self.rank(x)? as i64;
        let axis = self.ints_of(axis_t, "the axis")?.first().copied().unwrap_or(0);
        let axis = if axis < 0 { axis + r } else { axis };
        if !(0..r).contains(&axis) {
            return Err(self.err(format!("axis {axis} out of range for rank {r}")));
        }
        let lay = match self.produced_layout(x) {
            Some(p) if p.len() == r as usize => p,
            _ => identity(r as usize),
        };
        let lay = if self.complex(x).is_some() { identity(r as usize) } else { lay };
        let held_axis = lay.iter().position(|&p| p as i64 == axis).unwrap_or(0) as i64;
        let n = op.outputs.len();
        let v0 = self.any_value(x)?;
        let extent = self.dims(v0)[lay.iter().position(|&p| p as i64 == axis).unwrap_or(0)] as i64;
        let sizes: Vec<i64> = if v_form {
            let mut s = self.ints_of(self.input(op, 1)?, "the sizes")?;
            if let Some(i) = s.iter().position(|&d| d < 0) {
                let rest = s.iter().filter(|&&d| d >= 0).fold(0i64, |a, &d| a.saturating_add(d));
                s[i] = extent.saturating_sub(rest);
            }
            s
        } else {
            if n == 0 || extent % n as i64 != 0 {
                return Err(self.err(format!("{extent} elements do not split into {n} equal parts")));
            }
            vec![extent / n as i64; n]
        };
        let outs: Vec<usize> = (0..n).map(|i| self.output(op, i)).collect::<Result<_, _>>()?;
        let attrs = Attrs::new().with("axis", Attr::Int(held_axis));
        if let Some((re, im)) = self.complex(x) {
            let s1 = self.i64s(&sizes);
            let a = self.emit(OpKind::Split, attrs.clone(), vec![Some(re), Some(s1)], n)?;
            let b = self.emit(OpKind::Split, attrs, vec![Some(im), Some(s1)], n)?;
            for (i, &o) in outs.iter().enumerate() {
                self.set_complex(o, a[i], b[i]);
            }
            return Ok(());
        }
        let on_ints = outs.iter().all(|&o| self.same_quant(x, o));
        let v = if on_ints { self.raw(x, &lay)? } else { self.real(x, &lay)? };
        let s = self.i64s(&sizes);
        let parts = self.emit(OpKind::Split, attrs, vec![Some(v), Some(s)], n)?;
        for (i, &o) in outs.iter().enumerate() {
            if on_ints {
                self.set_raw(o, &lay, parts[i]);
            } else {
                self.set_real(o, &lay, parts[i])?;
            }
        }
        Ok(())
    }

    fn pad(&mut self, op: &super::reader::Operator, b: B) -> Result<(), ImportError> {
        let x = self.input(op, 0)?;
        let out = self.output(op, 0)?;
        let p = self.ints_of(self.input(op, 1)?, "the paddings")?;
        let r = self.rank(x)?;
        if p.len() != 2 * r {
            return Err(self.err(format!("{} padding entries for rank {r}", p.len())));
        }
        let mode = if b == B::MirrorPad {
            let symmetric = matches!(&op.options, Some(fb::BuiltinOptions::MirrorPadOptions(o)) if o.mode == fb::MirrorPadMode::Symmetric);
            if symmetric {
                return self.symmetric_pad(op, x, out, &p);
            }
            "reflect"
        } else {
            "constant"
        };
        let lay = match self.produced_layout(x) {
            Some(l) if l.len() == r && self.complex(x).is_none() => l,
            _ => identity(r),
        };
        // [[b0, e0], [b1, e1], ..] in TFLite order → [b.., e..] in the held order.
        let mut pads = vec![0i64; 2 * r];
        for (i, &axis) in lay.iter().enumerate() {
            pads[i] = p[2 * axis];
            pads[r + i] = p[2 * axis + 1];
        }
        let attrs = Attrs::new().with("mode", Attr::String(mode.into()));
        let on_ints = self.same_quant(x, out);
        let value_t = if b == B::Padv2 { self.opt_input(op, 2) } else { None };
        let v = if on_ints { self.raw(x, &lay)? } else { self.real(x, &lay)? };
        let dtype = self.g.ty(v).dtype;
        let value = match (value_t, self.quant(x)) {
            (Some(t), _) => {
                let c = if on_ints { self.raw(t, &[])? } else { self.real(t, &[])? };
                Some(c)
            }
            // A quantised tensor pads with the zero point's integer (real 0).
            (None, Some(q)) if on_ints && mode == "constant" => Some(self.scalar(dtype, q.zero_point[0] as f64)?),
            _ => None,
        };
        let pv = self.i64s(&pads);
        let y = self.emit1(OpKind::Pad, attrs, vec![Some(v), Some(pv), value])?;
        if on_ints {
            self.set_raw(out, &lay, y);
            Ok(())
        } else {
            self.set_real(out, &lay, y)
        }
    }

    /// MIRROR_PAD SYMMETRIC (the edge repeated; ONNX's `reflect` leaves it out): per
    /// axis, the first `b` and last `e` elements reversed (slices of step −1) and
    /// concatenated on either side.
    fn symmetric_pad(
        &mut self,
        op: &super::reader::Operator,
        x: usize,
        out: usize,
        p: &[i64],
    ) -> Result<(), ImportError> {
        let v0 = self.any_value(x)?;
        let r = self.g.ty(v0).shape.rank();
        let dims = {
            let n = if self.held[x].imag.is_some() { v0 } else { self.native_of(x, r)? };
            self.dims(n)
        };
        for (axis, &d) in dims.iter().enumerate() {
            let (b, e) = (p[2 * axis], p[2 * axis + 1]);
            if b < 0 || e < 0 || b > d as i64 || e > d as i64 {
                return Err(self.err(format!("SYMMETRIC padding ({b}, {e}) of an axis of {d}")));
            }
        }
        let pads = p.to_vec();
        self.movement(op, x, out, |imp, v| {
            let mut y = v;
            for (axis, &d) in dims.iter().enumerate() {
                let (b, e) = (pads[2 * axis], pads[2 * axis + 1]);
                if b == 0 && e == 0 {
                    continue;
                }
                let d = d as i64;
                let rev = |imp: &mut Self, from: i64, count: i64, y: ValueId| -> Result<ValueId, ImportError> {
                    // Elements from-count+1 ..= from, last first.
                    let end = if from - count < 0 { i64::MIN } else { from - count };
                    let (s, en, a, st) =
                        (imp.i64s(&[from]), imp.i64s(&[end]), imp.i64s(&[axis as i64]), imp.i64s(&[-1]));
                    imp.emit1(OpKind::Slice, Attrs::new(), vec![Some(y), Some(s), Some(en), Some(a), Some(st)])
                };
                let mut parts = Vec::new();
                if b > 0 {
                    parts.push(Some(rev(imp, b - 1, b, y)?));
                }
                parts.push(Some(y));
                if e > 0 {
                    parts.push(Some(rev(imp, d - 1, e, y)?));
                }
                y = imp.emit1(OpKind::Concat, Attrs::new().with("axis", Attr::Int(axis as i64)), parts)?;
            }
            Ok(y)
        })
    }

    /// STRIDED_SLICE: the sparse spec (with an ellipsis and new axes) made dense over the
    /// input's axes, one `Slice`, then a `Reshape` that drops the shrunk axes and inserts
    /// the new ones.
    fn strided_slice(&mut self, op: &super::reader::Operator) -> Result<(), ImportError> {
        let o = options!(self, op, StridedSliceOptions).cloned().unwrap_or_default();
        let x = self.input(op, 0)?;
        let out = self.output(op, 0)?;
        let begin = self.ints_of(self.input(op, 1)?, "the begin")?;
        let end = self.ints_of(self.input(op, 2)?, "the end")?;
        let strides = match self.opt_input(op, 3) {
            Some(t) => self.ints_of(t, "the strides")?,
            None => vec![1; begin.len()],
        };
        let v0 = self.any_value(x)?;
        let r = self.g.ty(v0).shape.rank();
        let dims = {
            let n = if self.held[x].imag.is_some() { v0 } else { self.native_of(x, r)? };
            self.dims(n)
        };
        let n = begin.len();
        let bit = |m: i32, i: usize| i < 32 && (m >> i) & 1 == 1;
        let explicit = (0..n).filter(|&i| !bit(o.ellipsis_mask, i) && !bit(o.new_axis_mask, i)).count();
        if end.len() != n
            || strides.len() != n
            || explicit > r
            || (0..n).filter(|&i| bit(o.ellipsis_mask, i)).count() > 1
        {
            return Err(self.err(format!(
                "begin/end/strides of {}/{}/{} entries (ellipsis mask {:#x}) for rank {r}",
                n,
                end.len(),
                strides.len(),
                o.ellipsis_mask
            )));
        }
        /// Where an output axis comes from.
        enum Out {
            /// Input axes `a..b`, taken whole or sliced.
            Axes(usize, usize),
            /// A new axis of extent 1.
            New,
        }
        let mut layout = Vec::new();
        let (mut s, mut e, mut st, mut axes) = (vec![], vec![], vec![], vec![]);
        let mut reshape = false;
        let mut cur = 0usize;
        for i in 0..n {
            if bit(o.ellipsis_mask, i) {
                let k = r - explicit;
                layout.push(Out::Axes(cur, cur + k));
                cur += k;
                continue;
            }
            if bit(o.new_axis_mask, i) {
                layout.push(Out::New);
                reshape = true;
                continue;
            }
            let step = strides[i];
            if step == 0 {
                return Err(self.err("a stride of 0"));
            }
            let d = dims[cur] as i64;
            let mut b = begin[i];
            let mut en = if o.offset { begin[i].saturating_add(end[i]) } else { end[i] };
            if bit(o.shrink_axis_mask, i) {
                if b < 0 {
                    b = b.saturating_add(d);
                }
                en = b.saturating_add(1);
                s.push(b);
                e.push(en);
                st.push(1);
                axes.push(cur as i64);
                reshape = true;
                cur += 1;
                continue;
            }
            if bit(o.begin_mask, i) {
                b = if step > 0 { 0 } else { i64::MAX };
            }
            if bit(o.end_mask, i) {
                en = if step > 0 { i64::MAX } else { i64::MIN };
            }
            s.push(b);
            e.push(en);
            st.push(step);
            axes.push(cur as i64);
            layout.push(Out::Axes(cur, cur + 1));
            cur += 1;
        }
        layout.push(Out::Axes(cur, r));
        self.movement(op, x, out, |imp, v| {
            let y = if axes.is_empty() {
                v
            } else {
                let (sv, ev, av, tv) = (imp.i64s(&s), imp.i64s(&e), imp.i64s(&axes), imp.i64s(&st));
                imp.emit1(OpKind::Slice, Attrs::new(), vec![Some(v), Some(sv), Some(ev), Some(av), Some(tv)])?
            };
            if !reshape {
                return Ok(y);
            }
            let yd = imp.dims(y);
            let mut shape = Vec::new();
            for l in &layout {
                match *l {
                    Out::Axes(a, b) => shape.extend(yd[a..b].iter().map(|&d| d as i64)),
                    Out::New => shape.push(1),
                }
            }
            let sv = imp.i64s(&shape);
            imp.emit1(OpKind::Reshape, Attrs::new(), vec![Some(y), Some(sv)])
        })
    }

    /// RFFT2D of a real signal: over the last axis a product with the constant
    /// `[N, N/2+1]` cosine and (negated) sine bases; over the axis before, when its FFT
    /// length is above 1, a complex DFT as products with `[M, M]` bases from the left.
    fn rfft2d(&mut self, op: &super::reader::Operator) -> Result<(), ImportError> {
        let x = self.input(op, 0)?;
        let len = self.ints_of(self.input(op, 1)?, "the FFT lengths")?;
        let r = self.rank(x)?;
        if len.len() != 2 || r < 2 || len.iter().any(|&l| l < 1) {
            return Err(self.err("expected two FFT lengths and an input of rank 2 or more"));
        }
        let (m, n) = (len[0] as usize, len[1] as usize);
        // The bases are constants of the artifact: n·(n/2+1) and m² elements.
        const MOST: usize = 1 << 24;
        if n.saturating_mul(n / 2 + 1) > MOST || m.saturating_mul(m) > MOST {
            return Err(self.err(format!("FFT lengths {m}x{n}: the DFT bases would exceed {MOST} elements")));
        }
        let mut a = self.real(x, &identity(r))?;
        if self.g.ty(a).dtype != DType::F32 {
            return Err(self.err("RFFT2D of a non-float32 input"));
        }
        // Crop or zero-pad the last two axes to the FFT lengths.
        let d = self.dims(a);
        let (h, w) = (d[r - 2], d[r - 1]);
        if h > m || w > n {
            let (s, e, ax) =
                (self.i64s(&[0, 0]), self.i64s(&[m as i64, n as i64]), self.i64s(&[r as i64 - 2, r as i64 - 1]));
            a = self.emit1(OpKind::Slice, Attrs::new(), vec![Some(a), Some(s), Some(e), Some(ax)])?;
        }
        let d = self.dims(a);
        let (h, w) = (d[r - 2], d[r - 1]);
        if h < m || w < n {
            let mut pads = vec![0i64; 2 * r];
            pads[2 * r - 2] = (m - h) as i64;
            pads[2 * r - 1] = (n - w) as i64;
            let pv = self.i64s(&pads);
            a = self.emit1(OpKind::Pad, Attrs::new(), vec![Some(a), Some(pv)])?;
        }
        let bins = n / 2 + 1;
        let mk = |imp: &mut Self, v: Vec<f32>, rows: usize, cols: usize| imp.matrix(v, rows, cols);
        let (mut re, mut im) = match four_step_split(n) {
            Some((n1, n2)) => self.four_step_rdft(a, n, n1, n2)?,
            None => {
                let cos = mk(self, basis(f64::cos, n, bins, n, 1.0), n, bins)?;
                let sin = mk(self, basis(f64::sin, n, bins, n, -1.0), n, bins)?;
                let re = self.emit1(OpKind::MatMul, Attrs::new(), vec![Some(a), Some(cos)])?;
                let im = self.emit1(OpKind::MatMul, Attrs::new(), vec![Some(a), Some(sin)])?;
                (re, im)
            }
        };
        if m > 1 {
            // (C − iS)(Xr + iXi) = C·Xr + S·Xi + i(C·Xi − S·Xr), S = sin (positive).
            let c = mk(self, basis(f64::cos, m, m, m, 1.0), m, m)?;
            let s = mk(self, basis(f64::sin, m, m, m, 1.0), m, m)?;
            let mm = |imp: &mut Self, l: ValueId, r: ValueId| {
                imp.emit1(OpKind::MatMul, Attrs::new(), vec![Some(l), Some(r)])
            };
            let (cr, si) = (mm(self, c, re)?, mm(self, s, im)?);
            let (ci, sr) = (mm(self, c, im)?, mm(self, s, re)?);
            re = self.emit1(OpKind::Add, Attrs::new(), vec![Some(cr), Some(si)])?;
            im = self.emit1(OpKind::Sub, Attrs::new(), vec![Some(ci), Some(sr)])?;
        }
        let out = self.output(op, 0)?;
        self.set_complex(out, re, im);
        Ok(())
    }
}

/// `sign · f(2π·(i·k mod len)/len)` for `i < rows`, `k < cols`, row-major.
fn basis(f: fn(f64) -> f64, rows: usize, cols: usize, len: usize, sign: f64) -> Vec<f32> {
    let mut v = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for k in 0..cols {
            let ang = 2.0 * std::f64::consts::PI * ((i * k) % len) as f64 / len as f64;
            v.push((sign * f(ang)) as f32);
        }
    }
    v
}

/// `N = N1·N2` for the four-step DFT, `N1` the largest divisor not above √N, when
/// that is at least 8 (below, the direct product is as cheap).
fn four_step_split(n: usize) -> Option<(usize, usize)> {
    if n < 64 {
        return None;
    }
    let n1 = (8..=n.isqrt()).rev().find(|&d| n.is_multiple_of(d))?;
    Some((n1, n / n1))
}

impl Importer<'_> {
    /// A `[rows, cols]` f32 constant.
    fn matrix(&mut self, v: Vec<f32>, rows: usize, cols: usize) -> Result<ValueId, ImportError> {
        let shape = Shape::new(vec![rows, cols]).map_err(|e| self.err(e.to_string()))?;
        let t = Tensor::from_vec(shape, v).map_err(|e| self.err(e.to_string()))?;
        Ok(self.konst(t))
    }

    /// The first `N/2+1` bins of the DFT of real `a` over its last axis (of length
    /// `n = n1·n2`), as the four-step (Cooley–Tukey) factorisation in products: with
    /// `n = n2·j1 + j2` and `k = k1 + n1·k2`,
    /// `X[k] = Σ_j2 W_n2^(j2·k2) · W_n^(j2·k1) · Σ_j1 x[n2·j1 + j2] · W_n1^(j1·k1)`:
    /// an `[n1, n1]` product from the left, a twiddle, an `[n2, K2]` product from the
    /// right (only the `K2 = ⌈(n/2+1)/n1⌉` columns the bins need), then the `[k1, k2]`
    /// result reordered to `k`. About `(n1 + 2·K2)/(n/2)` of the direct product's work.
    fn four_step_rdft(
        &mut self,
        a: ValueId,
        n: usize,
        n1: usize,
        n2: usize,
    ) -> Result<(ValueId, ValueId), ImportError> {
        let bins = n / 2 + 1;
        let k2n = bins.div_ceil(n1).min(n2);
        let dims = self.dims(a);
        let prefix: Vec<i64> = dims[..dims.len() - 1].iter().map(|&d| d as i64).collect();
        let mm =
            |imp: &mut Self, l: ValueId, r: ValueId| imp.emit1(OpKind::MatMul, Attrs::new(), vec![Some(l), Some(r)]);
        let bin =
            |imp: &mut Self, k: OpKind, l: ValueId, r: ValueId| imp.emit1(k, Attrs::new(), vec![Some(l), Some(r)]);
        let shape = self.i64s(&[prefix.as_slice(), &[n1 as i64, n2 as i64]].concat());
        let x = self.emit1(OpKind::Reshape, Attrs::new(), vec![Some(a), Some(shape)])?;
        // A = F1·X over j1 (rows): F1 = C1 − i·S1.
        let c1 = self.matrix(basis(f64::cos, n1, n1, n1, 1.0), n1, n1)?;
        let s1 = self.matrix(basis(f64::sin, n1, n1, n1, -1.0), n1, n1)?;
        let (ar, ai) = (mm(self, c1, x)?, mm(self, s1, x)?);
        // B = A ⊙ W_n^(j2·k1).
        let tr = self.matrix(basis(f64::cos, n1, n2, n, 1.0), n1, n2)?;
        let ti = self.matrix(basis(f64::sin, n1, n2, n, -1.0), n1, n2)?;
        let (p, q) = (bin(self, OpKind::Mul, ar, tr)?, bin(self, OpKind::Mul, ai, ti)?);
        let br = bin(self, OpKind::Sub, p, q)?;
        let (p, q) = (bin(self, OpKind::Mul, ar, ti)?, bin(self, OpKind::Mul, ai, tr)?);
        let bi = bin(self, OpKind::Add, p, q)?;
        // Y = B·F2 over j2 (columns): (Br + i·Bi)(C2 − i·S2).
        let c2 = self.matrix(basis(f64::cos, n2, k2n, n2, 1.0), n2, k2n)?;
        let s2 = self.matrix(basis(f64::sin, n2, k2n, n2, 1.0), n2, k2n)?;
        let (p, q) = (mm(self, br, c2)?, mm(self, bi, s2)?);
        let yr = bin(self, OpKind::Add, p, q)?;
        let (p, q) = (mm(self, bi, c2)?, mm(self, br, s2)?);
        let yi = bin(self, OpKind::Sub, p, q)?;
        // [k1, k2] → k = k1 + n1·k2: transpose, flatten, keep the first n/2+1 bins.
        let r = dims.len() + 1;
        let mut perm: Vec<usize> = (0..r).collect();
        perm.swap(r - 1, r - 2);
        let part = |imp: &mut Self, y: ValueId| -> Result<ValueId, ImportError> {
            let t = imp.transpose(y, &perm)?;
            let shape = imp.i64s(&[prefix.as_slice(), &[(k2n * n1) as i64]].concat());
            let f = imp.emit1(OpKind::Reshape, Attrs::new(), vec![Some(t), Some(shape)])?;
            let (st, en, ax) = (imp.i64s(&[0]), imp.i64s(&[bins as i64]), imp.i64s(&[-1]));
            imp.emit1(OpKind::Slice, Attrs::new(), vec![Some(f), Some(st), Some(en), Some(ax)])
        };
        Ok((part(self, yr)?, part(self, yi)?))
    }
}
