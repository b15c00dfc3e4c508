//! Unit tests of the reader and the op mapping, on models built here with planus's
//! builder. Numbers are checked against plain NHWC loops written in this file (an
//! oracle independent of the importer's layout handling), evaluated with kiln-ref.

use super::schema::tflite as fb;
use super::*;
use fb::BuiltinOperator as B;

/// A signature's `(name, tensor)` inputs and outputs.
type Names = Vec<(String, u32)>;

/// A TFLite model under construction.
#[derive(Default)]
struct M {
    tensors: Vec<fb::Tensor>,
    buffers: Vec<fb::Buffer>,
    ops: Vec<fb::Operator>,
    codes: Vec<B>,
    signature: Option<(Names, Names)>,
}

impl M {
    fn new() -> M {
        M { buffers: vec![fb::Buffer::default()], ..M::default() }
    }

    fn tensor(&mut self, name: &str, shape: &[i32], ty: fb::TensorType, data: Option<Vec<u8>>) -> i32 {
        let buffer = match data {
            Some(d) => {
                self.buffers.push(fb::Buffer { data: Some(d), ..Default::default() });
                self.buffers.len() as u32 - 1
            }
            None => 0,
        };
        self.tensors.push(fb::Tensor {
            shape: Some(shape.to_vec()),
            type_: ty,
            buffer,
            name: Some(name.into()),
            ..Default::default()
        });
        self.tensors.len() as i32 - 1
    }

    fn f32(&mut self, name: &str, shape: &[i32]) -> i32 {
        self.tensor(name, shape, fb::TensorType::Float32, None)
    }

    fn konst(&mut self, name: &str, shape: &[i32], v: &[f32]) -> i32 {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, shape, fb::TensorType::Float32, Some(bytes))
    }

    fn ints(&mut self, name: &str, v: &[i32]) -> i32 {
        let bytes = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.tensor(name, &[v.len() as i32], fb::TensorType::Int32, Some(bytes))
    }

    /// A tensor with quantisation parameters: `scale` and `zero` per tensor (one each) or
    /// per channel (of dimension 0; set `quantized_dimension` for another).
    fn quantized(
        &mut self,
        name: &str,
        shape: &[i32],
        ty: fb::TensorType,
        data: Option<Vec<u8>>,
        scale: Vec<f32>,
        zero: Vec<i64>,
    ) -> i32 {
        let t = self.tensor(name, shape, ty, data);
        let q = fb::QuantizationParameters { scale: Some(scale), zero_point: Some(zero), ..Default::default() };
        self.tensors[t as usize].quantization = Some(Box::new(q));
        t
    }

    fn op(&mut self, code: B, ins: &[i32], outs: &[i32], options: Option<fb::BuiltinOptions>) {
        let idx = match self.codes.iter().position(|&c| c == code) {
            Some(i) => i,
            None => {
                self.codes.push(code);
                self.codes.len() - 1
            }
        };
        self.ops.push(fb::Operator {
            opcode_index: idx as u32,
            inputs: Some(ins.to_vec()),
            outputs: Some(outs.to_vec()),
            builtin_options: options,
            ..Default::default()
        });
    }

    fn finish(self, inputs: &[i32], outputs: &[i32]) -> Vec<u8> {
        let codes = self
            .codes
            .iter()
            .map(|&c| fb::OperatorCode {
                deprecated_builtin_code: (c as i32).min(127) as i8,
                builtin_code: c,
                version: 1,
                ..Default::default()
            })
            .collect();
        let signature_defs = self.signature.map(|(i, o)| {
            let map =
                |l: Names| Some(l.into_iter().map(|(n, t)| fb::TensorMap { name: Some(n), tensor_index: t }).collect());
            vec![fb::SignatureDef {
                inputs: map(i),
                outputs: map(o),
                signature_key: Some("serving_default".into()),
                subgraph_index: 0,
            }]
        });
        let model = fb::Model {
            version: 3,
            operator_codes: Some(codes),
            subgraphs: Some(vec![fb::SubGraph {
                tensors: Some(self.tensors),
                inputs: Some(inputs.to_vec()),
                outputs: Some(outputs.to_vec()),
                operators: Some(self.ops),
                name: Some("main".into()),
                ..Default::default()
            }]),
            buffers: Some(self.buffers),
            signature_defs,
            ..Default::default()
        };
        let mut b = planus::Builder::new();
        let mut bytes = b.finish(&model, Some(*b"TFL3")).to_vec();
        // planus 1.3's builder writes the identifier before the root offset (it builds
        // back to front), the offset relative to where it put it: put both where
        // flatbuffers (and planus's reader) expect them.
        if bytes[..4] == *b"TFL3" {
            bytes[..8].rotate_left(4);
            let root = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) + 4;
            bytes[..4].copy_from_slice(&root.to_le_bytes());
        }
        bytes
    }
}

fn import(bytes: Vec<u8>) -> Result<Graph, ImportError> {
    import_bytes(Bytes::from(bytes), &ImportOptions::default())
}

fn count(g: &Graph, k: OpKind) -> usize {
    g.nodes.iter().filter(|(_, n)| n.op.kind == k).count()
}

/// Conv2D options: square `stride`, fused `act`.
fn conv_options(padding: fb::Padding, stride: i32, act: fb::ActivationFunctionType) -> Option<fb::BuiltinOptions> {
    let o = fb::Conv2DOptions {
        padding,
        stride_w: stride,
        stride_h: stride,
        fused_activation_function: act,
        ..Default::default()
    };
    Some(fb::BuiltinOptions::Conv2DOptions(Box::new(o)))
}

/// DepthwiseConv2D options: square `stride`, depth multiplier 1, fused `act`.
fn depthwise_options(padding: fb::Padding, stride: i32, act: fb::ActivationFunctionType) -> Option<fb::BuiltinOptions> {
    let o = fb::DepthwiseConv2DOptions {
        padding,
        stride_w: stride,
        stride_h: stride,
        depth_multiplier: 1,
        fused_activation_function: act,
        ..Default::default()
    };
    Some(fb::BuiltinOptions::DepthwiseConv2DOptions(Box::new(o)))
}

/// Pool2D options: a square `size` window at stride `size`.
fn pool_options(padding: fb::Padding, size: i32) -> Option<fb::BuiltinOptions> {
    let o = fb::Pool2DOptions {
        padding,
        stride_w: size,
        stride_h: size,
        filter_width: size,
        filter_height: size,
        ..Default::default()
    };
    Some(fb::BuiltinOptions::Pool2DOptions(Box::new(o)))
}

/// Little-endian bytes of int32 values (a bias buffer).
fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `values(n, seed)` as int8 bytes at `scale` (weights of a quantised op).
fn int8_values(n: usize, seed: u32, scale: f32) -> Vec<u8> {
    values(n, seed).iter().map(|v| ((v * scale) as i8) as u8).collect()
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s % 2000) as f32 / 1000.0 - 1.0
        })
        .collect()
}

fn eval(g: &Graph, x: Vec<f32>) -> Vec<f32> {
    let ty = g.ty(g.inputs[0]).clone();
    let t = Tensor::from_vec(ty.shape.clone(), x).expect("input");
    let out = kiln_ref::eval_graph(g, &[t]).expect("evaluation");
    out[0].to_vec::<f32>().expect("f32 output")
}

/// Plain NHWC convolution (`OHWI` filter, or depthwise `1HWO` with multiplier 1), SAME
/// or VALID padding as TensorFlow defines it, then bias and ReLU when asked.
#[allow(clippy::too_many_arguments)]
fn conv_nhwc(
    x: &[f32],
    (h, w, c): (usize, usize, usize),
    f: &[f32],
    (o, kh, kw): (usize, usize, usize),
    bias: &[f32],
    stride: usize,
    same: bool,
    depthwise: bool,
    relu: bool,
) -> (Vec<f32>, usize, usize) {
    let (oh, ow) =
        if same { (h.div_ceil(stride), w.div_ceil(stride)) } else { ((h - kh) / stride + 1, (w - kw) / stride + 1) };
    let pt = if same { ((oh - 1) * stride + kh).saturating_sub(h) / 2 } else { 0 };
    let pl = if same { ((ow - 1) * stride + kw).saturating_sub(w) / 2 } else { 0 };
    let mut y = vec![0f32; oh * ow * o];
    for oy in 0..oh {
        for ox in 0..ow {
            for oc in 0..o {
                let mut acc = bias[oc];
                for ky in 0..kh {
                    for kx in 0..kw {
                        let iy = (oy * stride + ky) as isize - pt as isize;
                        let ix = (ox * stride + kx) as isize - pl as isize;
                        if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                            continue;
                        }
                        let (iy, ix) = (iy as usize, ix as usize);
                        if depthwise {
                            acc += x[(iy * w + ix) * c + oc] * f[(ky * kw + kx) * o + oc];
                        } else {
                            for ic in 0..c {
                                acc += x[(iy * w + ix) * c + ic] * f[((oc * kh + ky) * kw + kx) * c + ic];
                            }
                        }
                    }
                }
                y[(oy * ow + ox) * o + oc] = if relu { acc.max(0.0) } else { acc };
            }
        }
    }
    (y, oh, ow)
}

fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "element count");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "element {i}: {a} vs {b}");
    }
}

/// CONV_2D (SAME, stride 2, fused ReLU) → DEPTHWISE_CONV_2D (VALID) → ADD of a
/// per-channel constant → MAX_POOL_2D: one transpose in, one out, and the NHWC result.
/// The model, its constants (w1, b1, w2, shift) and an input.
struct ConvNet {
    bytes: Vec<u8>,
    w1: Vec<f32>,
    b1: Vec<f32>,
    w2: Vec<f32>,
    shift: Vec<f32>,
    x: Vec<f32>,
}

fn conv_net() -> ConvNet {
    let mut m = M::new();
    let x = m.f32("x", &[1, 7, 6, 3]);
    let (w1, b1, w2, shift) = (values(4 * 3 * 3 * 3, 1), values(4, 2), values(3 * 3 * 4, 3), values(4, 4));
    let w1t = m.konst("w1", &[4, 3, 3, 3], &w1);
    let b1t = m.konst("b1", &[4], &b1);
    let c1 = m.f32("c1", &[1, 4, 3, 4]);
    m.op(B::Conv2d, &[x, w1t, b1t], &[c1], conv_options(fb::Padding::Same, 2, fb::ActivationFunctionType::Relu));
    let w2t = m.konst("w2", &[1, 3, 3, 4], &w2);
    let c2 = m.f32("c2", &[1, 2, 1, 4]);
    m.op(
        B::DepthwiseConv2d,
        &[c1, w2t, -1],
        &[c2],
        depthwise_options(fb::Padding::Valid, 1, fb::ActivationFunctionType::None),
    );
    let sh = m.konst("shift", &[4], &shift);
    let a = m.f32("a", &[1, 2, 1, 4]);
    m.op(B::Add, &[c2, sh], &[a], Some(fb::BuiltinOptions::AddOptions(Box::default())));
    let y = m.f32("y", &[1, 1, 1, 4]);
    m.op(B::MaxPool2d, &[a], &[y], pool_options(fb::Padding::Same, 2));
    ConvNet { bytes: m.finish(&[x], &[y]), w1, b1, w2, shift, x: values(7 * 6 * 3, 9) }
}

#[test]
fn conv_net_matches_nhwc_loops_with_one_transpose_each_way() {
    let ConvNet { bytes, w1, b1, w2, shift, x } = conv_net();
    let g = import(bytes).expect("import");
    assert_eq!(count(&g, OpKind::Conv), 2);
    // NHWC → NCHW at the input, NCHW → NHWC at the output; filters stored permuted.
    assert_eq!(count(&g, OpKind::Transpose), 2, "{g}");
    let got = eval(&g, x.clone());
    let (c1, h1, w1o) = conv_nhwc(&x, (7, 6, 3), &w1, (4, 3, 3), &b1, 2, true, false, true);
    assert_eq!((h1, w1o), (4, 3));
    let (c2, h2, w2o) = conv_nhwc(&c1, (4, 3, 4), &w2, (4, 3, 3), &[0.0; 4], 1, false, true, false);
    assert_eq!((h2, w2o), (2, 1));
    let a: Vec<f32> = c2.iter().enumerate().map(|(i, v)| v + shift[i % 4]).collect();
    // 2x2 max pool, SAME over [2, 1]: one window holding both rows.
    let want: Vec<f32> = (0..4).map(|c| a[c].max(a[4 + c])).collect();
    assert_close(&got, &want);
}

#[test]
fn signature_names_the_inputs_and_outputs() {
    let mut m = M::new();
    let x = m.f32("serving_x:0", &[2, 3]);
    let y = m.f32("Identity", &[2, 3]);
    m.op(B::Logistic, &[x], &[y], None);
    m.signature = Some((vec![("audio".into(), x as u32)], vec![("scores".into(), y as u32)]));
    let g = import(m.finish(&[x], &[y])).expect("import");
    assert_eq!(g.values[g.inputs[0]].name, "audio");
    assert_eq!(g.values[g.outputs[0]].name, "scores");
    let got = eval(&g, vec![0.0, 1.0, -1.0, 2.0, -2.0, 0.5]);
    let want: Vec<f32> = [0.0f32, 1.0, -1.0, 2.0, -2.0, 0.5].iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect();
    assert_close(&got, &want);
}

#[test]
fn every_unsupported_op_is_named_at_once() {
    let mut m = M::new();
    let x = m.f32("x", &[1, 4]);
    let a = m.f32("a", &[1, 4]);
    let b = m.f32("b", &[1, 4]);
    let c = m.f32("c", &[1, 4]);
    let d = m.f32("d", &[1, 4]);
    m.op(B::Svdf, &[x], &[a], None);
    m.op(B::Relu, &[a], &[b], None);
    m.op(B::Lstm, &[b], &[c], None);
    m.op(B::Svdf, &[c], &[d], None);
    let err = import(m.finish(&[x], &[d])).expect_err("unsupported");
    match &err {
        ImportError::TfliteUnsupported(ops) => {
            assert_eq!(ops.len(), 2);
            assert_eq!((ops[0].op.as_str(), ops[0].subgraph, ops[0].operators.clone()), ("SVDF", 0, vec![0, 3]));
            assert_eq!((ops[1].op.as_str(), ops[1].operators.clone()), ("LSTM", vec![2]));
        }
        e => panic!("expected TfliteUnsupported, got {e:?}"),
    }
    assert_eq!(
        err.to_string(),
        "unsupported TFLite operators: SVDF (subgraph 0, operators 0, 3), LSTM (subgraph 0, operator 2)"
    );
}

#[test]
fn malformed_files_are_typed_errors() {
    let decode = |b: &[u8]| match import(b.to_vec()) {
        Err(ImportError::TfliteDecode(m)) => m,
        r => panic!("expected TfliteDecode, got {r:?}"),
    };
    assert!(decode(b"").contains("too few"));
    assert!(decode(b"\x08\0\0\0TFL").contains("too few"));
    assert!(decode(b"\x08\0\0\0ONNX\0\0\0\0").contains("TFL3"));
    // A root offset past the end.
    assert!(!decode(b"\xff\xff\0\0TFL3\0\0\0\0").is_empty());
    let good = conv_net().bytes;
    // Every truncation is refused with a typed error (the buffers sit at the end, so
    // no prefix is a complete model).
    for n in 0..good.len() {
        let r = std::panic::catch_unwind(|| import(good[..n].to_vec()));
        match r {
            Ok(Err(_)) => {}
            Ok(Ok(_)) => panic!("a model truncated to {n} of {} bytes imported", good.len()),
            Err(_) => panic!("a model truncated to {n} bytes panicked"),
        }
    }
}

#[test]
fn corrupted_bytes_never_panic() {
    let good = conv_net().bytes;
    for i in 0..good.len() {
        for v in [0x00u8, 0xff, 0x7f, 0x80] {
            let mut b = good.clone();
            b[i] = v;
            let r = std::panic::catch_unwind(|| import(b));
            assert!(r.is_ok(), "byte {i} set to {v:#x}: the importer panicked");
        }
    }
}

/// An int8 CONV_2D becomes an integer convolution (`ConvInteger`) requantised in LiteRT's
/// fixed-point arithmetic (tflite/int8.rs): evaluated, it equals `kiln-ref`'s TFLite
/// CONV_2D (double rounding, the fused ReLU a clamp at the zero point) on every element.
#[test]
fn quantized_conv_is_an_integer_contraction() {
    let mut m = M::new();
    let i8t = fb::TensorType::Int8;
    let x = m.quantized("x", &[1, 5, 5, 2], i8t, None, vec![0.05], vec![3]);
    let wq = int8_values(3 * 3 * 3 * 2, 5, 100.0);
    let w = m.quantized("w", &[3, 3, 3, 2], i8t, Some(wq.clone()), vec![0.01, 0.02, 0.03], vec![0, 0, 0]);
    let bias = [100, -50, 7];
    let bq = i32_bytes(&bias);
    let b = m.quantized("b", &[3], fb::TensorType::Int32, Some(bq), vec![0.0005, 0.001, 0.0015], vec![0, 0, 0]);
    let y = m.quantized("y", &[1, 5, 5, 3], i8t, None, vec![0.1], vec![-5]);
    m.op(B::Conv2d, &[x, w, b], &[y], conv_options(fb::Padding::Same, 1, fb::ActivationFunctionType::Relu));
    let g = import(m.finish(&[x], &[y])).expect("import");
    assert_eq!(g.ty(g.inputs[0]).dtype, DType::I8);
    assert_eq!(g.ty(g.outputs[0]).dtype, DType::I8);
    let mut opt = g.clone();
    kiln_opt::run_tensor_pipeline(&mut opt).expect("passes");
    assert_eq!(count(&opt, OpKind::ConvInteger), 1, "{opt}");
    assert_eq!(count(&opt, OpKind::Conv) + count(&opt, OpKind::QLinearConv), 0, "{opt}");
    let xs: Vec<i8> = values(50, 6).iter().map(|v| (v * 128.0) as i8).collect();
    let t = Tensor::from_vec(g.ty(g.inputs[0]).shape.clone(), xs.clone()).expect("input");
    let out = kiln_ref::eval_graph(&opt, &[t]).expect("eval");
    let ys = out[0].to_vec::<i8>().expect("i8");
    use kiln_ref::tflite_quant as tq;
    let q = tq::Requant {
        input_zero_point: 3,
        output_zero_point: -5,
        scales: tq::channel_scales(0.05, &[0.01, 0.02, 0.03], 0.1),
        range: (-5, 127),
        rounding: tq::Rounding::Double,
    };
    let shape = tq::ConvShape { input: [1, 5, 5, 2], weights: [3, 3, 3, 2], stride: 1, same: true };
    let wi: Vec<i8> = wq.iter().map(|&v| v as i8).collect();
    let want = tq::conv2d(&xs, &wi, &bias, &shape, &q);
    assert_eq!(ys, want);
    assert!(ys.iter().any(|&v| v > -5) && ys.contains(&-5));
}

#[test]
fn float16_weights_fold_into_float32_constants() {
    let mut m = M::new();
    let x = m.f32("x", &[1, 3]);
    let w: Vec<f32> = values(6, 11);
    let wh: Vec<u8> = w.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    let w16 = m.tensor("w16", &[2, 3], fb::TensorType::Float16, Some(wh));
    let w32 = m.f32("w32", &[2, 3]);
    m.op(B::Dequantize, &[w16], &[w32], None);
    let y = m.f32("y", &[1, 2]);
    m.op(B::FullyConnected, &[x, w32, -1], &[y], Some(fb::BuiltinOptions::FullyConnectedOptions(Box::default())));
    let g = import(m.finish(&[x], &[y])).expect("import");
    assert_eq!(count(&g, OpKind::Cast), 0, "{g}");
    assert_eq!(count(&g, OpKind::MatMul), 1);
    let xv = vec![0.5, -1.0, 2.0];
    let got = eval(&g, xv.clone());
    let wr: Vec<f32> = w.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect();
    let want: Vec<f32> = (0..2).map(|o| (0..3).map(|k| xv[k] * wr[o * 3 + k]).sum()).collect();
    assert_close(&got, &want);
}

#[test]
fn rfft2d_is_a_real_dft() {
    let mut m = M::new();
    let n = 8;
    let x = m.f32("x", &[2, 1, n]);
    let len = m.ints("len", &[1, n]);
    let c = m.tensor("c", &[2, 1, n / 2 + 1], fb::TensorType::Complex64, None);
    m.op(B::Rfft2d, &[x, len], &[c], None);
    let y = m.f32("y", &[2, 1, n / 2 + 1]);
    m.op(B::ComplexAbs, &[c], &[y], None);
    let g = import(m.finish(&[x], &[y])).expect("import");
    let xv = values(2 * n as usize, 13);
    let got = eval(&g, xv.clone());
    let mut want = Vec::new();
    for row in xv.chunks(n as usize) {
        for k in 0..=(n as usize / 2) {
            let (mut re, mut im) = (0f64, 0f64);
            for (t, v) in row.iter().enumerate() {
                let a = -2.0 * std::f64::consts::PI * (k * t) as f64 / n as f64;
                re += *v as f64 * a.cos();
                im += *v as f64 * a.sin();
            }
            want.push((re * re + im * im).sqrt() as f32);
        }
    }
    assert_close(&got, &want);
}

#[test]
fn strided_slice_masks_and_shrink() {
    let mut m = M::new();
    let x = m.f32("x", &[3, 4]);
    let (b, e, s) = (m.ints("b", &[1, 3]), m.ints("e", &[0, 0]), m.ints("s", &[1, -1]));
    let y = m.f32("y", &[4]);
    // Row 1 (shrunk), columns from 3 down to the start (end mask, negative stride).
    let o = fb::StridedSliceOptions { end_mask: 2, shrink_axis_mask: 1, ..Default::default() };
    m.op(B::StridedSlice, &[x, b, e, s], &[y], Some(fb::BuiltinOptions::StridedSliceOptions(Box::new(o))));
    let g = import(m.finish(&[x], &[y])).expect("import");
    let xv: Vec<f32> = (0..12).map(|v| v as f32).collect();
    assert_eq!(eval(&g, xv), vec![7.0, 6.0, 5.0, 4.0]);
}

/// The seeds of the `import_tflite` fuzz target: small models that reach the reader,
/// the layout handling, quantisation, complex tensors and the signature.
fn fuzz_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let conv = conv_net().bytes;
    let mut m = M::new();
    let x = m.f32("serving_x:0", &[2, 8]);
    let len = m.ints("len", &[1, 8]);
    let c = m.tensor("c", &[2, 5], fb::TensorType::Complex64, None);
    m.op(B::Rfft2d, &[x, len], &[c], None);
    let y = m.f32("y", &[2, 5]);
    m.op(B::ComplexAbs, &[c], &[y], None);
    let z = m.f32("z", &[2, 5]);
    m.op(B::Softmax, &[y], &[z], Some(fb::BuiltinOptions::SoftmaxOptions(Box::new(fb::SoftmaxOptions { beta: 1.0 }))));
    m.signature = Some((vec![("audio".into(), x as u32)], vec![("scores".into(), z as u32)]));
    let rfft = m.finish(&[x], &[z]);
    let mut m = M::new();
    let (i8t, i32t) = (fb::TensorType::Int8, fb::TensorType::Int32);
    let zeros = |s: &[f32], z: i64| vec![z; s.len()];
    let x = m.quantized("x", &[1, 6, 6, 2], i8t, None, vec![0.05], vec![1]);
    // A 3x3 convolution, per-channel weights, int32 bias at s_x·s_w, fused ReLU.
    let sw = vec![0.01, 0.02, 0.015, 0.03];
    let wq = int8_values(4 * 3 * 3 * 2, 21, 127.0);
    let w = m.quantized("w", &[4, 3, 3, 2], i8t, Some(wq), sw.clone(), zeros(&sw, 0));
    let sb: Vec<f32> = sw.iter().map(|s| s * 0.05).collect();
    let b = m.quantized("b", &[4], i32t, Some(i32_bytes(&[40, -30, 25, -10])), sb.clone(), zeros(&sb, 0));
    let y = m.quantized("y", &[1, 6, 6, 4], i8t, None, vec![0.04], vec![-20]);
    m.op(B::Conv2d, &[x, w, b], &[y], conv_options(fb::Padding::Same, 1, fb::ActivationFunctionType::Relu));
    // A depthwise 3x3 convolution, per-channel (dimension 3 of `1HWO`), ReLU6.
    let sd = vec![0.02, 0.01, 0.03, 0.025];
    let dq = int8_values(3 * 3 * 4, 23, 127.0);
    let dw = m.quantized("dw", &[1, 3, 3, 4], i8t, Some(dq), sd.clone(), zeros(&sd, 0));
    m.tensors[dw as usize].quantization.as_mut().expect("set").quantized_dimension = 3;
    let sdb: Vec<f32> = sd.iter().map(|s| s * 0.04).collect();
    let db = m.quantized("db", &[4], i32t, Some(i32_bytes(&[5, -7, 9, 0])), sdb.clone(), zeros(&sdb, 0));
    let dy = m.quantized("dy", &[1, 6, 6, 4], i8t, None, vec![0.03], vec![-50]);
    let relu6 = fb::ActivationFunctionType::Relu6;
    m.op(B::DepthwiseConv2d, &[y, dw, db], &[dy], depthwise_options(fb::Padding::Same, 1, relu6));
    // Average pooling keeps the quantisation.
    let p = m.quantized("p", &[1, 3, 3, 4], i8t, None, vec![0.03], vec![-50]);
    m.op(B::AveragePool2d, &[dy], &[p], pool_options(fb::Padding::Valid, 2));
    let r = m.quantized("r", &[1, 36], i8t, None, vec![0.03], vec![-50]);
    let shape = m.ints("shape", &[1, 36]);
    m.op(B::Reshape, &[p, shape], &[r], None);
    // A dense layer: int8 weights per tensor, int32 bias.
    let f = m.quantized("f", &[5, 36], i8t, Some(int8_values(5 * 36, 22, 127.0)), vec![0.02], vec![0]);
    let fbq = i32_bytes(&[100, -200, 50, 0, 300]);
    let fbias = m.quantized("fb", &[5], i32t, Some(fbq), vec![0.03 * 0.02], vec![0]);
    let o = m.quantized("o", &[1, 5], i8t, None, vec![0.1], vec![3]);
    m.op(B::FullyConnected, &[r, f, fbias], &[o], Some(fb::BuiltinOptions::FullyConnectedOptions(Box::default())));
    let r = o;
    let qconv = m.finish(&[x], &[r]);
    vec![
        ("conv_net.tflite", conv),
        ("rfft_signature.tflite", rfft),
        ("int8_net.tflite", qconv),
        ("decoder.tflite", decoder()),
    ]
}

/// The committed seeds are what [`fuzz_seeds`] builds (`KILN_BLESS=1` rewrites them),
/// and each imports.
#[test]
fn fuzz_seeds_are_current() {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/import_tflite");
    let bless = std::env::var_os("KILN_BLESS").is_some();
    for (name, bytes) in fuzz_seeds() {
        import(bytes.clone()).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        let path = dir.join(name);
        if bless {
            std::fs::create_dir_all(&dir).expect("corpus dir");
            std::fs::write(&path, &bytes).expect("write seed");
        }
        let committed =
            std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (KILN_BLESS=1 writes it)", path.display()));
        assert!(committed == bytes, "{} differs from what the test builds (KILN_BLESS=1 rewrites it)", path.display());
    }
}

/// The int8 seed's convolution becomes an integer convolution in LiteRT's fixed-point
/// requantisation (`ConvInteger`), its dense layer (a bias: a 1x1 convolution) a
/// `QLinearConv`, and its depthwise convolution the exact f32 form the quantized
/// fold gives depthwise products (integer-valued operands and sums below 2^24, so the
/// window microkernel computes the integer result; `kiln-opt`'s `quant.rs`): one grouped
/// f32 Conv, no float product elsewhere; the output stays int8.
#[test]
fn int8_net_contractions_are_integer() {
    let (_, bytes) = fuzz_seeds().into_iter().find(|(n, _)| *n == "int8_net.tflite").expect("int8 seed");
    let g = import(bytes).expect("import");
    let mut opt = g.clone();
    kiln_opt::run_tensor_pipeline(&mut opt).expect("passes");
    assert_eq!(count(&opt, OpKind::ConvInteger), 1, "{opt}");
    assert_eq!(count(&opt, OpKind::QLinearConv), 1, "{opt}");
    assert_eq!(count(&opt, OpKind::Conv), 1, "{opt}");
    assert_eq!(count(&opt, OpKind::MatMul), 0, "{opt}");
    assert_eq!(opt.ty(opt.outputs[0]).dtype, DType::I8);
}

/// TRANSPOSE_CONV (SAME, stride 2) → RESIZE_BILINEAR (half-pixel) → RESIZE_NEAREST_NEIGHBOR
/// (half-pixel) → AVERAGE_POOL_2D (SAME, the border averaging fewer taps) → MEAN over the
/// spatial axes: the windowed ops whose padding and coordinate rules differ from ONNX's.
fn decoder() -> Vec<u8> {
    let mut m = M::new();
    let x = m.f32("x", &[1, 3, 4, 2]);
    let shape = m.ints("out_shape", &[1, 6, 8, 3]);
    let w = m.konst("w", &[3, 3, 3, 2], &values(3 * 3 * 3 * 2, 31));
    let b = m.konst("b", &[3], &values(3, 32));
    let t = m.f32("t", &[1, 6, 8, 3]);
    let tc = fb::TransposeConvOptions { padding: fb::Padding::Same, stride_w: 2, stride_h: 2, ..Default::default() };
    m.op(B::TransposeConv, &[shape, w, x, b], &[t], Some(fb::BuiltinOptions::TransposeConvOptions(Box::new(tc))));
    let size = m.ints("size", &[9, 11]);
    let r = m.f32("r", &[1, 9, 11, 3]);
    let rb = fb::ResizeBilinearOptions { half_pixel_centers: true, ..Default::default() };
    m.op(B::ResizeBilinear, &[t, size], &[r], Some(fb::BuiltinOptions::ResizeBilinearOptions(Box::new(rb))));
    let size2 = m.ints("size2", &[5, 7]);
    let n = m.f32("n", &[1, 5, 7, 3]);
    let rn = fb::ResizeNearestNeighborOptions { half_pixel_centers: true, ..Default::default() };
    m.op(
        B::ResizeNearestNeighbor,
        &[r, size2],
        &[n],
        Some(fb::BuiltinOptions::ResizeNearestNeighborOptions(Box::new(rn))),
    );
    let p = m.f32("p", &[1, 3, 4, 3]);
    let pool = fb::Pool2DOptions {
        padding: fb::Padding::Same,
        stride_w: 2,
        stride_h: 2,
        filter_width: 3,
        filter_height: 3,
        ..Default::default()
    };
    m.op(B::AveragePool2d, &[n], &[p], Some(fb::BuiltinOptions::Pool2DOptions(Box::new(pool))));
    let axes = m.ints("axes", &[1, 2]);
    let y = m.f32("y", &[1, 3]);
    m.op(B::Mean, &[p, axes], &[y], Some(fb::BuiltinOptions::ReducerOptions(Box::default())));
    m.finish(&[x], &[y, p])
}

#[test]
fn strided_slice_ellipsis_and_new_axis() {
    let mut m = M::new();
    let x = m.f32("x", &[2, 3, 4]);
    // x[..., 1, None]: an ellipsis over the first two axes, the last shrunk to index 1,
    // then a new axis.
    let (b, e, s) = (m.ints("b", &[0, 1, 0]), m.ints("e", &[0, 2, 0]), m.ints("s", &[1, 1, 1]));
    let y = m.f32("y", &[2, 3, 1]);
    let o = fb::StridedSliceOptions { ellipsis_mask: 1, shrink_axis_mask: 2, new_axis_mask: 4, ..Default::default() };
    m.op(B::StridedSlice, &[x, b, e, s], &[y], Some(fb::BuiltinOptions::StridedSliceOptions(Box::new(o))));
    let g = import(m.finish(&[x], &[y])).expect("import");
    assert_eq!(g.ty(g.outputs[0]).shape.dims(), &[2, 3, 1]);
    let xv: Vec<f32> = (0..24).map(|v| v as f32).collect();
    assert_eq!(eval(&g, xv), vec![1.0, 5.0, 9.0, 13.0, 17.0, 21.0]);
}

/// A length the four-step factorisation takes (256 = 16·16), against a direct DFT.
#[test]
fn rfft2d_four_step_matches_a_direct_dft() {
    for n in [256usize, 96] {
        let mut m = M::new();
        let x = m.f32("x", &[3, 1, n as i32]);
        let len = m.ints("len", &[1, n as i32]);
        let c = m.tensor("c", &[3, 1, n as i32 / 2 + 1], fb::TensorType::Complex64, None);
        m.op(B::Rfft2d, &[x, len], &[c], None);
        let re = m.f32("re", &[3, 1, n as i32 / 2 + 1]);
        m.op(B::Real, &[c], &[re], None);
        let im = m.f32("im", &[3, 1, n as i32 / 2 + 1]);
        m.op(B::Imag, &[c], &[im], None);
        let g = import(m.finish(&[x], &[re, im])).expect("import");
        assert!(count(&g, OpKind::MatMul) >= 6, "n = {n}: the four-step form");
        let xv = values(3 * n, 17);
        let t = Tensor::from_vec(g.ty(g.inputs[0]).shape.clone(), xv.clone()).expect("input");
        let out = kiln_ref::eval_graph(&g, &[t]).expect("evaluation");
        let (gr, gi) = (out[0].to_vec::<f32>().expect("re"), out[1].to_vec::<f32>().expect("im"));
        let mut i = 0;
        for row in xv.chunks(n) {
            for k in 0..=n / 2 {
                let (mut r, mut q) = (0f64, 0f64);
                for (t, v) in row.iter().enumerate() {
                    let a = -2.0 * std::f64::consts::PI * ((k * t) % n) as f64 / n as f64;
                    r += *v as f64 * a.cos();
                    q += *v as f64 * a.sin();
                }
                assert!((gr[i] as f64 - r).abs() < 1e-4 * (1.0 + r.abs()), "n {n} bin {k}: re {} vs {r}", gr[i]);
                assert!((gi[i] as f64 - q).abs() < 1e-4 * (1.0 + q.abs()), "n {n} bin {k}: im {} vs {q}", gi[i]);
                i += 1;
            }
        }
    }
}

#[test]
fn mirror_pad_symmetric_repeats_the_edge() {
    let mut m = M::new();
    let x = m.f32("x", &[2, 3]);
    let p = m.ints("p", &[1, 0, 2, 3]);
    let y = m.f32("y", &[3, 8]);
    let o = fb::MirrorPadOptions { mode: fb::MirrorPadMode::Symmetric };
    m.op(B::MirrorPad, &[x, p], &[y], Some(fb::BuiltinOptions::MirrorPadOptions(Box::new(o))));
    let g = import(m.finish(&[x], &[y])).expect("import");
    // numpy.pad([[1, 2, 3], [4, 5, 6]], ((1, 0), (2, 3)), mode="symmetric"):
    let want = [
        2.0, 1.0, 1.0, 2.0, 3.0, 3.0, 2.0, 1.0, //
        2.0, 1.0, 1.0, 2.0, 3.0, 3.0, 2.0, 1.0, //
        5.0, 4.0, 4.0, 5.0, 6.0, 6.0, 5.0, 4.0,
    ];
    assert_eq!(eval(&g, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]), want);
}

#[test]
fn complex_operands_of_real_ops_are_refused() {
    let mut m = M::new();
    let x = m.f32("x", &[1, 8]);
    let len = m.ints("len", &[1, 8]);
    let c = m.tensor("c", &[1, 5], fb::TensorType::Complex64, None);
    m.op(B::Rfft2d, &[x, len], &[c], None);
    let d = m.tensor("d", &[1, 5], fb::TensorType::Complex64, None);
    m.op(B::Mul, &[c, c], &[d], Some(fb::BuiltinOptions::MulOptions(Box::default())));
    let y = m.f32("y", &[1, 5]);
    m.op(B::ComplexAbs, &[d], &[y], None);
    match import(m.finish(&[x], &[y])) {
        Err(ImportError::TfliteOp { index: 1, op, message, .. }) => {
            assert_eq!(op, "MUL");
            assert!(message.contains("complex operand"), "{message}");
        }
        r => panic!("expected a TfliteOp error at operator 1, got {r:?}"),
    }
}

/// int8 BATCH_MATMUL, MEAN (over one axis; over the spatial axes with keep_dims) and
/// RESIZE_BILINEAR (half-pixel centres) import as LiteRT's integer forms: kiln-ref's
/// evaluation of the imported graph equals TFLite's integer arithmetic written here
/// per element (i128 fixed-point products; the resize's four corners per output pixel,
/// not the importer's separable passes).
#[test]
fn int8_litert_forms_match_integer_loops() {
    use super::int8::{multiply_by_quantized, Rounding};
    let i8t = fb::TensorType::Int8;
    let mut m = M::new();
    // K = 130: the accumulator bound (K·255²) times the multiplier is past 2²⁰, so the
    // fixed-point product takes the f64 split form; the MEANs take the 32-bit lane form.
    let (k, rows, cols) = (130usize, 3usize, 5usize);
    let a = m.quantized("a", &[1, rows as i32, k as i32], i8t, None, vec![0.031], vec![-7]);
    let b = m.quantized("b", &[1, k as i32, cols as i32], i8t, None, vec![0.027], vec![4]);
    let y = m.quantized("y", &[1, rows as i32, cols as i32], i8t, None, vec![0.61], vec![3]);
    m.op(B::BatchMatmul, &[a, b], &[y], Some(fb::BuiltinOptions::BatchMatMulOptions(Box::default())));
    let x = m.quantized("x", &[1, 40, 6], i8t, None, vec![0.05], vec![-20]);
    let ax = m.ints("mean_axes", &[1]);
    let mean = m.quantized("mean", &[1, 6], i8t, None, vec![0.013], vec![11]);
    m.op(B::Mean, &[x, ax], &[mean], Some(fb::BuiltinOptions::ReducerOptions(Box::default())));
    let img = m.quantized("img", &[1, 3, 5, 2], i8t, None, vec![0.04], vec![9]);
    let sp = m.ints("spatial_axes", &[1, 2]);
    let pooled = m.quantized("pooled", &[1, 1, 1, 2], i8t, None, vec![0.017], vec![-30]);
    let keep = fb::ReducerOptions { keep_dims: true };
    m.op(B::Mean, &[img, sp], &[pooled], Some(fb::BuiltinOptions::ReducerOptions(Box::new(keep))));
    let size = m.ints("size", &[6, 9]);
    let big = m.quantized("big", &[1, 6, 9, 2], i8t, None, vec![0.04], vec![9]);
    let rb = fb::ResizeBilinearOptions { half_pixel_centers: true, ..Default::default() };
    m.op(B::ResizeBilinear, &[img, size], &[big], Some(fb::BuiltinOptions::ResizeBilinearOptions(Box::new(rb))));
    let g = import(m.finish(&[a, b, x, img], &[y, mean, pooled, big])).expect("import");
    // BATCH_MATMUL's, and the resize's width pass as two (`32·(x·a) + x·b`).
    assert_eq!(count(&g, OpKind::MatMulInteger), 3, "{g}");
    assert_eq!(count(&g, OpKind::DequantizeLinear), 0, "{g}");

    let raw =
        |n: usize, seed: u32| -> Vec<i64> { values(n, seed).iter().map(|v| (v * 127.9).floor() as i64).collect() };
    let tensor =
        |v: &[i64], dims: &[usize]| Tensor::from_i64(DType::I8, Shape::new(dims.to_vec()).unwrap(), v).unwrap();
    let (av, bv, xv, iv) = (raw(rows * k, 71), raw(k * cols, 72), raw(40 * 6, 73), raw(3 * 5 * 2, 74));
    let ins =
        [tensor(&av, &[1, rows, k]), tensor(&bv, &[1, k, cols]), tensor(&xv, &[1, 40, 6]), tensor(&iv, &[1, 3, 5, 2])];
    let out = kiln_ref::eval_graph(&g, &ins).expect("evaluation");
    let got: Vec<Vec<i64>> = out.iter().map(|t| t.to_i64_vec().unwrap()).collect();
    let sat = |v: i64| v.clamp(-128, 127);

    let real = 0.031f32 as f64 * 0.027f32 as f64 / 0.61f32 as f64;
    let want: Vec<i64> = (0..rows * cols)
        .map(|o| {
            let (r, c) = (o / cols, o % cols);
            let acc: i64 = (0..k).map(|i| (av[r * k + i] + 7) * (bv[i * cols + c] - 4)).sum();
            sat(multiply_by_quantized(acc, real, Rounding::Double) + 3)
        })
        .collect();
    assert_eq!(got[0], want, "BATCH_MATMUL");

    let real = 0.05f32 as f64 / (0.013f32 as f64 * 40.0);
    let want: Vec<i64> = (0..6)
        .map(|c| sat(multiply_by_quantized((0..40).map(|i| xv[i * 6 + c] + 20).sum(), real, Rounding::Double) + 11))
        .collect();
    assert_eq!(got[1], want, "MEAN over one axis");

    let t = 9.0f32 * 0.04 / 0.017;
    let bias = -30 - (if t > 0.0 { t + 0.5 } else { t - 0.5 }).trunc() as i64;
    let real = (0.04f32 / (15.0 * 0.017f32)) as f64;
    let want: Vec<i64> = (0..2)
        .map(|c| sat(multiply_by_quantized((0..15).map(|i| iv[i * 2 + c]).sum(), real, Rounding::Single) + bias))
        .collect();
    assert_eq!(got[2], want, "MEAN over the spatial axes, keep_dims");

    // TFLite's ResizeBilinearInteger, per output pixel (NHWC).
    let (ih, iw, oh, ow) = (3i64, 5i64, 6i64, 9i64);
    let (hs, ws) = (((1 << 10) * ih + oh / 2) / oh, ((1 << 10) * iw + ow / 2) / ow);
    let at = |v: i64, s: i64, n: i64| {
        let p = v * s + s / 2 - (1 << 9);
        (p, (p / 1024).max(0), ((p + 1023) / 1024).min(n - 1))
    };
    let mut want = Vec::new();
    for oy in 0..oh {
        let (py, y0, y1) = at(oy, hs, ih);
        for ox in 0..ow {
            let (px, x0, x1) = at(ox, ws, iw);
            for c in 0..2 {
                let v = |y: i64, x: i64| iv[((y * iw + x) * 2 + c) as usize];
                let (dy, dx) = (py - 1024 * y0, px - 1024 * x0);
                let s = v(y0, x0) * (1024 - dy) * (1024 - dx)
                    + v(y1, x0) * dy * (1024 - dx)
                    + v(y0, x1) * (1024 - dy) * dx
                    + v(y1, x1) * dy * dx;
                want.push((s + if s > 0 { 1 << 19 } else { -(1 << 19) }) / (1 << 20));
            }
        }
    }
    assert_eq!(got[3], want, "RESIZE_BILINEAR");
}
