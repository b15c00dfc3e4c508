//! Kernels from the real lowerings (`kiln_lower::lower_op`), compiled and run
//! step by step against the kernel interpreter. Ops not lowered yet are skipped and
//! listed; every kernel that is produced must compile and match bit for bit.

mod common;

use common::*;
use kiln_ir::infer::{infer, InferInput};
use kiln_ir::{Attr, Attrs, DType, Op, OpKind, Shape, Tensor};
use kiln_lower::{lower_op, OpCx, OpInput};

fn op(kind: OpKind, attrs: &[(&str, Attr)]) -> Op {
    let mut a = Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    Op::parse(kind, &a).unwrap()
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I64, Shape::new(vec![v.len()]).unwrap(), v).unwrap()
}

/// Pseudo-random data of any dtype: floats in [-2, 2), small integers, bools.
fn data(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let shape = Shape::new(dims.to_vec()).unwrap();
    let n = shape.numel();
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    if dtype.is_float() {
        let v: Vec<f64> = (0..n).map(|_| (r.next() % 4096) as f64 / 1024.0 - 2.0).collect();
        Tensor::from_f64(dtype, shape, &v).unwrap()
    } else {
        let v: Vec<i64> = (0..n)
            .map(|_| {
                let x = (r.next() % 19) as i64;
                if dtype == DType::Bool {
                    x & 1
                } else if dtype.is_unsigned_int() {
                    x
                } else {
                    x - 9
                }
            })
            .collect();
        Tensor::from_i64(dtype, shape, &v).unwrap()
    }
}

/// Floats with every special value of `pow`'s base: ±∞, ±0, negatives, NaN.
fn specials() -> Tensor {
    let v = [f64::NEG_INFINITY, -2.5, -1.0, -0.0, 0.0, 1e-30, 0.5, 1.0, 2.0, 17.0, 1e30, f64::INFINITY, f64::NAN];
    Tensor::from_f64(DType::F32, Shape::new(vec![v.len()]).unwrap(), &v).unwrap()
}

fn scalar(x: f64) -> Tensor {
    Tensor::from_f64(DType::F32, Shape::new(vec![]).unwrap(), &[x]).unwrap()
}

struct Case {
    op: Op,
    inputs: Vec<Option<Tensor>>,
    /// Operands from this position on are compile-time constants.
    const_from: usize,
}

fn case(op: Op, inputs: Vec<Option<Tensor>>, const_from: usize) -> Case {
    Case { op, inputs, const_from }
}

fn cases() -> Vec<Case> {
    use OpKind as K;
    let f = DType::F32;
    let x = |dims: &[usize], s| Some(data(f, dims, s));
    // Resize of `input` in `mode` by `scales` (no roi).
    let resize = |mode: &str, input, scales: &[f64]| {
        let scales = Tensor::from_f64(f, Shape::new(vec![scales.len()]).unwrap(), scales).unwrap();
        case(op(K::Resize, &[("mode", Attr::String(mode.into()))]), vec![input, None, Some(scales)], 1)
    };
    let mut v = vec![
        case(op(K::Transpose, &[("perm", Attr::Ints(vec![0, 2, 1]))]), vec![x(&[2, 3, 5], 1)], 1),
        case(op(K::Transpose, &[("perm", Attr::Ints(vec![1, 0]))]), vec![Some(data(DType::I64, &[7, 3], 2))], 1),
        case(
            op(K::Slice, &[]),
            vec![x(&[4, 9], 3), Some(i64s(&[1, 8])), Some(i64s(&[4, 0])), Some(i64s(&[0, 1])), Some(i64s(&[2, -3]))],
            1,
        ),
        case(
            op(K::Pad, &[("mode", Attr::String("constant".into()))]),
            vec![x(&[3, 5], 4), Some(i64s(&[1, 2, 0, 3]))],
            1,
        ),
        case(
            op(K::Pad, &[("mode", Attr::String("reflect".into()))]),
            vec![x(&[3, 5], 5), Some(i64s(&[2, 1, 1, 3]))],
            1,
        ),
        case(op(K::Pad, &[("mode", Attr::String("edge".into()))]), vec![x(&[3, 5], 6), Some(i64s(&[1, 2, 3, 1]))], 1),
        case(op(K::Pad, &[("mode", Attr::String("wrap".into()))]), vec![x(&[3, 5], 7), Some(i64s(&[1, 2, 3, 1]))], 1),
        case(op(K::Concat, &[("axis", Attr::Int(1))]), vec![x(&[2, 3], 8), x(&[2, 1], 9), x(&[2, 5], 10)], 3),
        case(op(K::Split, &[("axis", Attr::Int(1)), ("num_outputs", Attr::Int(3))]), vec![x(&[2, 7], 11)], 1),
        case(
            op(K::Gather, &[("axis", Attr::Int(1))]),
            vec![
                x(&[3, 5], 12),
                Some(Tensor::from_i64(DType::I64, Shape::new(vec![2, 2]).unwrap(), &[0, -1, 4, 2]).unwrap()),
            ],
            2,
        ),
        case(
            op(K::Gather, &[("axis", Attr::Int(0))]),
            vec![Some(data(DType::F16, &[6, 3], 13)), Some(i64s(&[5, 0, -2, 3]))],
            1,
        ),
        case(
            op(K::GatherElements, &[("axis", Attr::Int(1))]),
            vec![
                x(&[3, 4], 14),
                Some(Tensor::from_i64(DType::I64, Shape::new(vec![3, 2]).unwrap(), &[0, 3, -1, 2, 1, 1]).unwrap()),
            ],
            1,
        ),
        case(op(K::Expand, &[]), vec![x(&[3, 1], 15), Some(i64s(&[2, 3, 4]))], 1),
        case(op(K::Tile, &[]), vec![x(&[2, 3], 16), Some(i64s(&[2, 3]))], 1),
        case(op(K::DepthToSpace, &[("blocksize", Attr::Int(2))]), vec![x(&[1, 8, 2, 3], 17)], 1),
        case(op(K::SpaceToDepth, &[("blocksize", Attr::Int(2))]), vec![x(&[1, 2, 4, 6], 18)], 1),
        case(
            op(K::Trilu, &[("upper", Attr::Int(0))]),
            vec![x(&[4, 5], 19), Some(Tensor::from_i64(DType::I64, Shape::scalar(), &[1]).unwrap())],
            1,
        ),
        case(
            op(K::CumSum, &[]),
            vec![x(&[3, 17], 20), Some(Tensor::from_i64(DType::I64, Shape::scalar(), &[1]).unwrap())],
            1,
        ),
        case(
            op(K::CumSum, &[("exclusive", Attr::Int(1)), ("reverse", Attr::Int(1))]),
            vec![
                Some(data(DType::I32, &[5, 4], 21)),
                Some(Tensor::from_i64(DType::I64, Shape::scalar(), &[0]).unwrap()),
            ],
            1,
        ),
        case(
            op(K::Range, &[]),
            vec![
                Some(Tensor::from_f64(f, Shape::scalar(), &[1.5]).unwrap()),
                Some(Tensor::from_f64(f, Shape::scalar(), &[9.0]).unwrap()),
                Some(Tensor::from_f64(f, Shape::scalar(), &[0.75]).unwrap()),
            ],
            0,
        ),
        case(op(K::EyeLike, &[("k", Attr::Int(1))]), vec![x(&[4, 6], 22)], 1),
        case(
            op(K::OneHot, &[("axis", Attr::Int(-1))]),
            vec![
                Some(i64s(&[0, 3, -1, 7])),
                Some(Tensor::from_i64(DType::I64, Shape::scalar(), &[5]).unwrap()),
                Some(Tensor::from_f64(f, Shape::new(vec![2]).unwrap(), &[-1.0, 2.0]).unwrap()),
            ],
            1,
        ),
        resize("nearest", x(&[1, 1, 3, 4], 23), &[1.0, 1.0, 2.0, 1.5]),
        resize("linear", x(&[1, 2, 3, 4], 24), &[1.0, 1.0, 1.7, 0.6]),
        case(
            op(K::ScatterElements, &[("axis", Attr::Int(0))]),
            vec![
                x(&[3, 3], 25),
                Some(Tensor::from_i64(DType::I64, Shape::new(vec![2, 3]).unwrap(), &[1, 0, 2, 0, 2, 1]).unwrap()),
                x(&[2, 3], 26),
            ],
            1,
        ),
        // Elementwise, reductions, linear algebra and normalisations: lowered as the
        // other families land.
        case(op(K::Add, &[]), vec![x(&[2, 3, 5], 27), x(&[5], 28)], 2),
        case(op(K::Mul, &[]), vec![Some(data(DType::I32, &[4, 7], 29)), Some(data(DType::I32, &[4, 1], 30))], 2),
        case(op(K::Div, &[]), vec![Some(data(DType::I64, &[9], 31)), Some(i64s(&[3, -2, 7, 1, -1, 5, 9, -4, 2]))], 2),
        case(op(K::Relu, &[]), vec![x(&[3, 17], 33)], 1),
        case(op(K::Sigmoid, &[]), vec![x(&[33], 34)], 1),
        case(op(K::Tanh, &[]), vec![x(&[5, 5], 35)], 1),
        case(op(K::Erf, &[]), vec![x(&[17], 36)], 1),
        case(op(K::Gelu, &[]), vec![x(&[2, 9], 37)], 1),
        case(op(K::Where, &[]), vec![Some(data(DType::Bool, &[3, 4], 38)), x(&[3, 4], 39), x(&[4], 40)], 3),
        case(op(K::Cast, &[("to", Attr::Int(10))]), vec![x(&[3, 6], 41)], 1),
        case(op(K::Cast, &[("to", Attr::Int(16))]), vec![x(&[3, 6], 42)], 1),
        case(op(K::Cast, &[("to", Attr::Int(6))]), vec![x(&[3, 6], 43)], 1),
        case(op(K::Pow, &[]), vec![x(&[8], 44), x(&[8], 45)], 2),
        // Constant exponents computed by square roots: the special values of pow too.
        case(op(K::Pow, &[]), vec![Some(specials()), Some(scalar(0.75))], 1),
        case(op(K::Pow, &[]), vec![Some(specials()), Some(scalar(0.25))], 1),
        case(op(K::Pow, &[]), vec![Some(specials()), Some(scalar(1.5))], 1),
        case(op(K::Pow, &[]), vec![Some(specials()), Some(scalar(0.5))], 1),
        case(
            op(
                K::LRN,
                &[
                    ("size", Attr::Int(5)),
                    ("alpha", Attr::Float(2e-2)),
                    ("beta", Attr::Float(0.75)),
                    ("bias", Attr::Float(2.0)),
                ],
            ),
            vec![x(&[1, 7, 3, 4], 73)],
            1,
        ),
        case(op(K::LRN, &[("size", Attr::Int(3)), ("beta", Attr::Float(0.6))]), vec![x(&[2, 4, 5], 74)], 1),
        // A window wider than those written out term by term: a fold.
        case(op(K::LRN, &[("size", Attr::Int(17))]), vec![x(&[1, 20, 2, 3], 75)], 1),
        case(op(K::ReduceSum, &[]), vec![x(&[3, 4, 5], 46), Some(i64s(&[1]))], 1),
        case(op(K::ReduceMax, &[("keepdims", Attr::Int(0))]), vec![x(&[3, 4, 5], 47), Some(i64s(&[0, 2]))], 1),
        case(op(K::ReduceMean, &[]), vec![x(&[6, 10], 48), Some(i64s(&[-1]))], 1),
        case(op(K::ArgMax, &[("axis", Attr::Int(1))]), vec![x(&[4, 9], 49)], 1),
        case(
            op(K::ArgMin, &[("axis", Attr::Int(0)), ("select_last_index", Attr::Int(1))]),
            vec![Some(data(DType::I8, &[6, 5], 50))],
            1,
        ),
        case(op(K::Softmax, &[]), vec![x(&[3, 17], 51)], 1),
        case(op(K::LogSoftmax, &[("axis", Attr::Int(0))]), vec![x(&[5, 4], 52)], 1),
        case(op(K::MatMul, &[]), vec![x(&[3, 5], 53), x(&[5, 7], 54)], 2),
        case(op(K::MatMul, &[]), vec![x(&[2, 3, 5], 55), x(&[5, 4], 56)], 2),
        case(op(K::Gemm, &[("transB", Attr::Int(1))]), vec![x(&[3, 6], 57), x(&[5, 6], 58), x(&[5], 59)], 1),
        case(
            op(K::Conv, &[("pads", Attr::Ints(vec![1, 1, 1, 1])), ("strides", Attr::Ints(vec![2, 1]))]),
            vec![x(&[1, 2, 5, 6], 60), x(&[3, 2, 3, 3], 61), x(&[3], 62)],
            1,
        ),
        case(
            op(
                K::MaxPool,
                &[
                    ("kernel_shape", Attr::Ints(vec![3, 3])),
                    ("pads", Attr::Ints(vec![1, 1, 1, 1])),
                    ("strides", Attr::Ints(vec![2, 2])),
                ],
            ),
            vec![x(&[1, 2, 7, 6], 63)],
            1,
        ),
        case(op(K::GlobalAveragePool, &[]), vec![x(&[2, 3, 4, 5], 64)], 1),
        case(op(K::LayerNormalization, &[]), vec![x(&[3, 16], 65), x(&[16], 66), x(&[16], 67)], 1),
        case(
            op(K::BatchNormalization, &[]),
            vec![
                x(&[2, 3, 4], 68),
                x(&[3], 69),
                x(&[3], 70),
                x(&[3], 71),
                Some(data(f, &[3], 72).reshaped(Shape::new(vec![3]).unwrap()).unwrap()),
            ],
            1,
        ),
    ];
    // Batch-norm variance must be positive.
    if let Some(c) = v.last_mut() {
        c.inputs[4] = Some(Tensor::from_f64(f, Shape::new(vec![3]).unwrap(), &[0.5, 1.25, 2.0]).unwrap());
    }
    v.extend(sample_cases());
    v
}

/// GridSample, Col2Im, RoiAlign and DeformConv (General kernels with computed
/// indices, selects to zero and reductions over taps).
fn sample_cases() -> Vec<Case> {
    use OpKind as K;
    let f = DType::F32;
    let x = |dims: &[usize], s| Some(data(f, dims, s));
    let st = |v: &str| Attr::String(v.into());
    let mut v = Vec::new();
    for (k, (mode, pad, align)) in
        [("linear", "zeros", 0), ("nearest", "border", 1), ("cubic", "reflection", 0), ("cubic", "zeros", 1)]
            .into_iter()
            .enumerate()
    {
        let o =
            op(K::GridSample, &[("mode", st(mode)), ("padding_mode", st(pad)), ("align_corners", Attr::Int(align))]);
        v.push(case(o, vec![x(&[2, 3, 5, 7], 80 + k as u64), x(&[2, 4, 3, 2], 90 + k as u64)], 2));
    }
    v.push(case(
        op(K::GridSample, &[("padding_mode", st("reflection")), ("align_corners", Attr::Int(1))]),
        vec![x(&[1, 2, 3, 4, 5], 94), x(&[1, 2, 3, 2, 3], 95)],
        2,
    ));
    v.push(case(
        op(
            K::Col2Im,
            &[
                ("dilations", Attr::Ints(vec![1, 2])),
                ("pads", Attr::Ints(vec![1, 0, 2, 1])),
                ("strides", Attr::Ints(vec![2, 1])),
            ],
        ),
        vec![x(&[2, 12, 16], 96), Some(i64s(&[6, 7])), Some(i64s(&[2, 3]))],
        1,
    ));
    let rois = Tensor::from_f64(
        f,
        Shape::new(vec![3, 4]).unwrap(),
        &[0.3, 1.7, 6.2, 4.9, -2.5, -1.0, 3.0, 12.0, 1.25, 0.5, 9.75, 7.5],
    )
    .unwrap();
    for mode in ["avg", "max"] {
        v.push(case(
            op(
                K::RoiAlign,
                &[
                    ("mode", st(mode)),
                    ("output_height", Attr::Int(3)),
                    ("output_width", Attr::Int(4)),
                    ("sampling_ratio", Attr::Int(2)),
                ],
            ),
            vec![x(&[2, 3, 7, 9], 97), Some(rois.clone()), Some(i64s(&[1, 0, 1]))],
            3,
        ));
    }
    v.push(case(
        op(
            K::DeformConv,
            &[
                ("group", Attr::Int(2)),
                ("offset_group", Attr::Int(2)),
                ("strides", Attr::Ints(vec![2, 1])),
                ("pads", Attr::Ints(vec![1, 0, 2, 1])),
            ],
        ),
        vec![x(&[1, 4, 5, 6], 98), x(&[6, 2, 3, 2], 99), x(&[1, 24, 3, 6], 100), x(&[6], 101), x(&[1, 12, 3, 6], 102)],
        5,
    ));
    v
}

fn out_count(op: &Op, ninfer: &[Option<InferInput<'_>>]) -> usize {
    if let Some(n) = op.attrs_of::<kiln_ir::attrs::SplitAttrs>().ok().and_then(|a| a.num_outputs) {
        return n as usize;
    }
    (1..=3).rev().find(|&n| infer(op, ninfer, n).is_ok()).unwrap_or(1)
}

#[test]
fn lowered_ops_compile_and_match() {
    let mut done = Vec::new();
    let mut skipped = Vec::new();
    let mut kernels = 0;
    let mut interp_failed = Vec::new();
    for c in cases() {
        let ninfer: Vec<Option<InferInput>> =
            c.inputs.iter().map(|t| t.as_ref().map(|t| InferInput { ty: t.ty(), value: Some(t) })).collect();
        let n = out_count(&c.op, &ninfer);
        let Ok(out_types) = infer(&c.op, &ninfer, n) else {
            skipped.push(format!("{} (infer)", c.op.kind));
            continue;
        };
        let opin: Vec<Option<OpInput>> = c
            .inputs
            .iter()
            .enumerate()
            .map(|(i, t)| t.as_ref().map(|t| OpInput { ty: t.ty(), value: (i >= c.const_from).then_some(t) }))
            .collect();
        let name = format!("k{}", done.len() + skipped.len());
        let cx = OpCx { op: &c.op, name: &name, inputs: &opin, outputs: &out_types };
        let lowered = match lower_op(&cx) {
            Ok(l) => l,
            Err(e) => {
                skipped.push(format!("{} ({e})", c.op.kind));
                continue;
            }
        };
        // Our results feed the next steps; each step is compared with the interpreter
        // where it can run (it overflows on some padded loads, a kiln-flow bug), and the
        // op's results with the reference evaluator.
        let mut results: Vec<Tensor> = Vec::new();
        for step in &lowered.steps {
            let args = step_operands(&step.operands, &c.inputs, &results);
            let cfgs = quick_configs();
            let got = run_compiled(&step.kernel, &args, &cfgs[0], 2);
            let want = std::panic::catch_unwind(|| kiln_flow::interp::run(&step.kernel, &args).unwrap());
            // exp, erf, tanh and log of f32 are inline code within a few ulp of libm
            // (`cpu::math`); kernels using them compare with a tolerance, every other
            // kernel exactly.
            use kiln_flow::UnaryOp as U;
            let approximated = step.kernel.nodes.iter().any(|n| {
                n.ty == kiln_flow::ScalarType::F32
                    && matches!(n.expr, kiln_flow::Expr::Unary(U::Exp | U::Erf | U::Tanh | U::Log, _))
            });
            let cmp = if approximated { Cmp { zero_sign: false, rtol: 1e-5 } } else { EXACT };
            match want {
                Ok(want) => {
                    for cfg in &cfgs {
                        let got = run_compiled(&step.kernel, &args, cfg, 2);
                        if let Err(e) = compare(&got, &want, cmp) {
                            panic!("{} kernel {} under {cfg:?}: {e}\n{}", c.op.kind, step.kernel.name, step.kernel);
                        }
                    }
                }
                Err(_) => {
                    interp_failed.push(c.op.kind.to_string());
                    for cfg in &cfgs[1..] {
                        let other = run_compiled(&step.kernel, &args, cfg, 2);
                        compare(&other, &got, EXACT).unwrap();
                    }
                }
            }
            kernels += 1;
            results.push(got);
        }
        let refs: Vec<Option<&Tensor>> = c.inputs.iter().map(|t| t.as_ref()).collect();
        let want = match kiln_ref::eval_op(&c.op, &refs, &out_types) {
            Ok(w) => w,
            Err(e) => panic!("{}: reference: {e}", c.op.kind),
        };
        for (r, (o, w)) in lowered.outputs.iter().zip(&want).enumerate() {
            let got = match *o {
                kiln_lower::Output::Step(s) => results[s].clone(),
                kiln_lower::Output::Alias(i) => c.inputs[i].as_ref().unwrap().reshaped(w.shape().clone()).unwrap(),
            };
            // Lowerings may round differently from the reference (transcendentals,
            // summation order): a small tolerance here; the kernel-level check above
            // is exact.
            let tol = if w.dtype().is_float() { 1e-4 } else { 0.0 };
            let (g, wv) = (got.to_f64_vec(), w.to_f64_vec());
            for (j, (a, b)) in g.iter().zip(&wv).enumerate() {
                let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * (1.0 + b.abs());
                assert!(ok, "{} result {r} element {j}: got {a}, reference {b}", c.op.kind);
            }
        }
        done.push(c.op.kind.to_string());
    }
    println!("lowered and checked: {} ops, {kernels} kernels: {}", done.len(), done.join(" "));
    println!("not lowered yet: {}", skipped.join("; "));
    println!("interpreter could not run (checked against kiln-ref only): {}", interp_failed.join(" "));
    assert!(!done.is_empty());
}
