//! Integer contractions (`cpu::qgemm`): MatMulInteger, QLinearMatMul, ConvInteger and
//! QLinearConv lowered by `kiln_lower`, compiled as integer microkernels (`vpdpbusd`
//! where this CPU has AVX-512 VNNI, its exact 16-bit form for `x86-64-v4`), run in one
//! and three workgroup splits, and compared with the kernel interpreter bit for bit and
//! with the reference evaluator (`kiln_ref`).
//!
//! Exactness: the accumulator is an exact i32 sum (8-bit products, fewer than 2^15
//! steps) in both, whatever the order; the zero-point corrections are exact i32
//! identities; the requantisation epilogue evaluates the kernel's own f32 operations
//! in the same order (each IEEE-rounded the same way), so every element must be equal.
//!
//! Shapes are odd on purpose: single rows and columns, `K` of every residue mod 4 and
//! 64 (the masked tail step and the masked row-sum chunk), columns past one block of 32
//! and not a multiple of 16 (masked stores), more rows than one 12-row tile, batches;
//! the operands span the full 8-bit range (both extremes), zero points included. Wide
//! ones too (`N` of 16 blocks of 32 and more, a partial block after them): a workgroup
//! then takes several blocks, sharing each tile's row sums and hoisted epilogue values.
//! And one column (`N` = 1: a matrix times a vector), which runs rows in the lanes
//! (in the AVX2 form up to four passes of eight rows a workgroup, the last workgroup
//! with fewer passes and a partial last pass).
//!
//! Every case runs at x86-64-v3 too (the AVX2 form, 16-bit products, on any AVX2 host),
//! and at x86-64-v4 and the host where this CPU has AVX-512 BW/VL.

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
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

/// Integers over the whole range of `dtype` (the first two elements its extremes).
fn ints(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let shape = Shape::new(dims.to_vec()).unwrap();
    let n = shape.numel();
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let (lo, hi) = match dtype {
        DType::U8 => (0i64, 255i64),
        DType::I8 => (-128, 127),
        _ => (-1000, 1000),
    };
    let v: Vec<i64> = (0..n)
        .map(|i| match i {
            0 => lo,
            1 => hi,
            _ => lo + (r.next() % (hi - lo + 1) as u64) as i64,
        })
        .collect();
    Tensor::from_i64(dtype, shape, &v).unwrap()
}

fn scales(dims: &[usize], seed: u64) -> Tensor {
    let shape = Shape::new(dims.to_vec()).unwrap();
    let mut r = Rng(seed | 1);
    let v: Vec<f64> = (0..shape.numel()).map(|_| ((r.next() % 1000) as f64 + 1.0) * 1e-5).collect();
    Tensor::from_f64(DType::F32, shape, &v).unwrap()
}

fn int_scalar(dtype: DType, x: i64) -> Tensor {
    Tensor::from_i64(dtype, Shape::new(vec![]).unwrap(), &[x]).unwrap()
}

fn f32_scalar(x: f64) -> Tensor {
    Tensor::from_f64(DType::F32, Shape::new(vec![]).unwrap(), &[x]).unwrap()
}

/// The integer microkernel configurations this CPU can run: x86-64-v3 (the AVX2 form,
/// on every AVX2 host), and where it has AVX-512 BW/VL x86-64-v4 (16-bit products) and
/// the host (VNNI where it has it).
fn int8_configs() -> Vec<Config> {
    let mut cfgs = Vec::new();
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        cfgs.push(Config { target: CpuTarget::X86_64V3, options: Options::default() });
    } else {
        eprintln!("skipped: this CPU lacks AVX2/FMA (the AVX2 integer microkernel)");
    }
    if std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vl") {
        cfgs.push(Config { target: CpuTarget::X86_64V4, options: Options::default() });
        cfgs.push(Config { target: CpuTarget::Host, options: Options::default() });
    } else {
        eprintln!("skipped: this CPU lacks AVX-512 BW/VL (the 512-bit integer microkernel)");
    }
    cfgs
}

/// The integer-microkernel configurations, or a return from the test where this CPU has
/// none (`int8_configs` says the test is skipped).
macro_rules! int8_configs_or_skip {
    () => {{
        let cfgs = int8_configs();
        if cfgs.is_empty() {
            return;
        }
        cfgs
    }};
}

/// Lowers `op` on `inputs`, checks that every kernel reading 8-bit operands in a
/// reduction compiles as an integer microkernel (`expect_micro`) and that each matches
/// the interpreter and, the op's result, the reference evaluator.
fn check_op(op: &Op, inputs: &[Option<Tensor>], expect_micro: bool) {
    let ninfer: Vec<Option<InferInput>> =
        inputs.iter().map(|t| t.as_ref().map(|t| InferInput { ty: t.ty(), value: Some(t) })).collect();
    let out_types = infer(op, &ninfer, 1).unwrap_or_else(|e| panic!("{}: infer: {e}", op.kind));
    // Zero points and scales are compile-time constants (as in a model).
    let opin: Vec<Option<OpInput>> = inputs
        .iter()
        .map(|t| t.as_ref().map(|t| OpInput { ty: t.ty(), value: (t.shape().numel() <= 64).then_some(t) }))
        .collect();
    let cx = OpCx { op, name: "q", inputs: &opin, outputs: &out_types };
    let lowered = lower_op(&cx).unwrap_or_else(|e| panic!("{}: lower: {e}", op.kind));
    let mut results: Vec<Tensor> = Vec::new();
    for step in &lowered.steps {
        let args = step_operands(&step.operands, &inputs, &results);
        let want = kiln_flow::interp::run(&step.kernel, &args).unwrap();
        for cfg in int8_configs() {
            let m = compile_with(&classify(&[&step.kernel]), &cfg.target, &cfg.options).unwrap();
            let note = &m.notes[0];
            if expect_micro {
                assert!(
                    note.starts_with("integer contraction microkernel"),
                    "{} under {:?}: {note}\n{}",
                    op.kind,
                    cfg.target,
                    step.kernel
                );
            }
            for splits in [1, 3] {
                let got = run_compiled(&step.kernel, &args, &cfg, splits);
                if let Err(e) = compare(&got, &want, EXACT) {
                    panic!("{} under {:?} ({note}), splits {splits}: {e}\n{}", op.kind, cfg.target, step.kernel);
                }
            }
        }
        results.push(want);
    }
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let want = kiln_ref::eval_op(op, &refs, &out_types).unwrap();
    let got = match lowered.outputs[0] {
        kiln_lower::Output::Step(s) => &results[s],
        kiln_lower::Output::Alias(_) => panic!("an alias"),
    };
    assert_eq!(got.to_f64_vec(), want[0].to_f64_vec(), "{}: reference", op.kind);
}

const SHAPES: [(usize, usize, usize); 15] = [
    (1, 1, 1),
    (9, 32, 1),
    (1, 5, 7),
    (5, 3, 7),
    (13, 4, 33),
    (12, 17, 16),
    (25, 67, 70),
    (3, 64, 32),
    (40, 130, 100),
    (7, 2, 1),
    (14, 37, 1000),
    (26, 9, 1024),
    (37, 150, 1),
    // One column over many rows: the AVX2 form's workgroups of several passes of eight
    // rows (25 groups, 3 a workgroup, the last alone and partial; 65 groups, 4 a
    // workgroup, the last alone with 3 rows).
    (197, 70, 1),
    (515, 33, 1),
];

#[test]
fn matmul_integer() {
    int8_configs_or_skip!();
    let mm = op(OpKind::MatMulInteger, &[]);
    for (i, &(m, k, n)) in SHAPES.iter().enumerate() {
        for (at, bt) in [(DType::U8, DType::I8), (DType::I8, DType::I8), (DType::U8, DType::U8), (DType::I8, DType::U8)]
        {
            let s = i as u64 * 10;
            let a = ints(at, &[m, k], s + 1);
            let b = ints(bt, &[k, n], s + 2);
            // No zero points; one each per tensor; a per-column one for B.
            check_op(&mm, &[Some(a.clone()), Some(b.clone())], true);
            let za = int_scalar(at, if at == DType::U8 { 131 } else { -7 });
            let zb = int_scalar(bt, if bt == DType::U8 { 3 } else { 100 });
            check_op(&mm, &[Some(a.clone()), Some(b.clone()), Some(za), Some(zb)], true);
            let zbn = ints(bt, &[n], s + 3);
            check_op(&mm, &[Some(a), Some(b), None, Some(zbn)], true);
        }
    }
    // A batch of products, B shared.
    let a = ints(DType::U8, &[2, 3, 9, 21], 5);
    let b = ints(DType::I8, &[21, 40], 6);
    check_op(&mm, &[Some(a), Some(b)], true);
}

#[test]
fn qlinear_matmul() {
    int8_configs_or_skip!();
    let q = op(OpKind::QLinearMatMul, &[]);
    for (i, &(m, k, n)) in SHAPES.iter().enumerate() {
        for (at, bt, yt) in
            [(DType::U8, DType::I8, DType::U8), (DType::I8, DType::I8, DType::I8), (DType::U8, DType::U8, DType::U8)]
        {
            let s = 100 + i as u64 * 10;
            let a = ints(at, &[m, k], s + 1);
            let b = ints(bt, &[k, n], s + 2);
            let za = int_scalar(at, if at == DType::U8 { 128 } else { -3 });
            let zb = if bt == DType::U8 { ints(bt, &[n], s + 3) } else { int_scalar(bt, 0) };
            let sb = if n > 1 { scales(&[n], s + 4) } else { f32_scalar(0.003) };
            let zy = int_scalar(yt, if yt == DType::U8 { 120 } else { 5 });
            // A small y scale saturates some results at both ends.
            let sy = f32_scalar(if i % 2 == 0 { 0.02 } else { 0.0005 });
            let inputs = [Some(a), Some(f32_scalar(0.05)), Some(za), Some(b), Some(sb), Some(zb), Some(sy), Some(zy)];
            check_op(&q, &inputs, true);
        }
    }
}

fn conv_attrs(pads: usize, stride: usize) -> Vec<(&'static str, Attr)> {
    vec![("pads", Attr::Ints(vec![pads as i64; 4])), ("strides", Attr::Ints(vec![stride as i64; 2]))]
}

#[test]
fn conv_integer() {
    int8_configs_or_skip!();
    for &(c, mo, h, w, kh, stride) in
        &[(3, 4, 9, 11, 3, 1), (8, 13, 7, 7, 1, 1), (5, 20, 12, 40, 3, 2), (16, 24, 6, 37, 1, 2)]
    {
        let attrs = conv_attrs(0, stride);
        let conv = op(OpKind::ConvInteger, &attrs);
        for (xt, wt) in [(DType::U8, DType::I8), (DType::U8, DType::U8), (DType::I8, DType::I8)] {
            let x = ints(xt, &[2, c, h, w], c as u64);
            let wgt = ints(wt, &[mo, c, kh, kh], mo as u64);
            check_op(&conv, &[Some(x.clone()), Some(wgt.clone())], true);
            let zx = int_scalar(xt, if xt == DType::U8 { 77 } else { -100 });
            let zw = ints(wt, &[mo], 9);
            check_op(&conv, &[Some(x), Some(wgt), Some(zx), Some(zw)], true);
        }
    }
    // Padded: the zero point pads, the kernel is not this form (general path), still exact.
    let conv = op(OpKind::ConvInteger, &conv_attrs(1, 1));
    let x = ints(DType::U8, &[1, 3, 6, 5], 1);
    let wgt = ints(DType::U8, &[2, 3, 3, 3], 2);
    check_op(&conv, &[Some(x), Some(wgt), Some(int_scalar(DType::U8, 9))], false);
}

#[test]
fn qlinear_conv() {
    int8_configs_or_skip!();
    for &(c, mo, h, w, kh, stride) in &[
        (8, 16, 7, 7, 1, 1),
        (3, 5, 9, 13, 3, 2),
        (32, 40, 5, 45, 3, 1),
        (6, 25, 30, 35, 1, 1),
        (3, 13, 41, 47, 3, 2),
        (70, 19, 1, 1, 1, 1),
    ] {
        let conv = op(OpKind::QLinearConv, &conv_attrs(0, stride));
        for (xt, wt, yt) in [(DType::U8, DType::I8, DType::U8), (DType::I8, DType::I8, DType::I8)] {
            let s = (c * mo) as u64;
            let x = ints(xt, &[1, c, h, w], s);
            let wgt = ints(wt, &[mo, c, kh, kh], s + 1);
            let bias = ints(DType::I32, &[mo], s + 2);
            let zx = int_scalar(xt, if xt == DType::U8 { 128 } else { -128 });
            let zy = int_scalar(yt, if yt == DType::U8 { 100 } else { -20 });
            let inputs = [
                Some(x),
                Some(f32_scalar(0.02)),
                Some(zx),
                Some(wgt),
                Some(scales(&[mo], s + 3)),
                Some(int_scalar(wt, 0)),
                Some(f32_scalar(0.07)),
                Some(zy),
                Some(bias),
            ];
            check_op(&conv, &inputs, true);
        }
    }
}

/// `out[m, n] = epi(Σ_k (i32(a[m, k]) − za)·i32(b[k, n]))`, `epi` per `what`:
/// `"erf"`: `erf(f32(acc)·s[m]) + r[m, n]` (f32 out: a transcendental epilogue, 8-row
/// tiles, a per-row and a per-column load); `"wrap"`: `u8(f32(acc)·s[m] + 0.5)` with no
/// clamp (f32 → u8 wraps like the interpreter: truncate, saturate to i64, low byte);
/// `"select"`: `isnan(x) ? 0 : round(x)` then `i32`-exact `i8` output after clamping;
/// `"clamp"`: `round(x)` clamped and cast to `i8` with no select (a NaN passes the clamp
/// and converts to 0: the short conversion of a clamped value).
fn epilogue_kernel(what: &str, m: usize, k: usize, n: usize) -> kiln_flow::Kernel {
    use kiln_flow::{BinaryOp, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
    let t = |d: DType, dims: &[usize]| kiln_ir::TensorType::new(d, Shape::new(dims.to_vec()).unwrap());
    let out = match what {
        "erf" => DType::F32,
        "wrap" => DType::U8,
        _ => DType::I8,
    };
    let ins = vec![t(DType::U8, &[m, k]), t(DType::I8, &[k, n]), t(DType::F32, &[m]), t(DType::F32, &[m, n])];
    let mut b = KernelBuilder::new(format!("epi_{what}"), ins, t(out, &[m, n]));
    let o = b.out_index();
    let kv = b.new_var(k as u64);
    let kk = b.var(kv);
    let x = b.load(0, vec![o[0], kk]);
    let x = b.convert(x, ScalarType::I32);
    let za = b.int(ScalarType::I32, 100);
    let x = b.sub(x, za);
    let w = b.load(1, vec![kk, o[1]]);
    let w = b.convert(w, ScalarType::I32);
    let p = b.mul(x, w);
    let acc = b.reduce(ReduceOp::Sum, vec![kv], p);
    let f = b.convert(acc, ScalarType::F32);
    let s = b.load(2, vec![o[0]]);
    let v = b.mul(f, s);
    let root = match what {
        "erf" => {
            let e = b.unary(UnaryOp::Erf, v);
            let r = b.load(3, vec![o[0], o[1]]);
            b.add(e, r)
        }
        "wrap" => {
            let h = b.float(ScalarType::F32, 0.5);
            let v = b.add(v, h);
            b.cast(v, DType::U8, true)
        }
        _ => {
            let r = b.unary(UnaryOp::Round, v);
            let v = if what == "clamp" {
                r
            } else {
                let nan = b.unary(UnaryOp::IsNan, v);
                let zero = b.float(ScalarType::F32, 0.0);
                b.select(nan, zero, r)
            };
            let (lo, hi) = (b.float(ScalarType::F32, -128.0), b.float(ScalarType::F32, 127.0));
            let v = b.binary(BinaryOp::Max, v, lo);
            let v = b.binary(BinaryOp::Min, v, hi);
            b.cast(v, DType::I8, true)
        }
    };
    b.finish(root).unwrap()
}

#[test]
fn epilogues() {
    let cfgs = int8_configs_or_skip!();
    for what in ["erf", "wrap", "select", "clamp"] {
        for &(m, k, n) in &[(1, 3, 5), (9, 17, 40), (20, 70, 33), (10, 6, 777), (21, 100, 1)] {
            let kernel = epilogue_kernel(what, m, k, n);
            let a = ints(DType::U8, &[m, k], 1);
            let b = ints(DType::I8, &[k, n], 2);
            // Scales that send some values far out of u8's range (wrapping), and a NaN.
            let mut sv: Vec<f64> = (0..m).map(|i| [0.001, 0.02, 3.0, -0.7][i % 4]).collect();
            if m > 5 {
                sv[5] = f64::NAN;
            }
            let s = Tensor::from_f64(DType::F32, Shape::new(vec![m]).unwrap(), &sv).unwrap();
            let r = Tensor::from_f64(DType::F32, Shape::new(vec![m, n]).unwrap(), &vec![0.25; m * n]).unwrap();
            let inputs = [&a, &b, &s, &r];
            let want = kiln_flow::interp::run(&kernel, &inputs).unwrap();
            for cfg in &cfgs {
                let note = compile_with(&classify(&[&kernel]), &cfg.target, &cfg.options).unwrap().notes[0].clone();
                assert!(note.starts_with("integer contraction microkernel"), "{what}: {note}");
                for splits in [1, 3] {
                    let got = run_compiled(&kernel, &inputs, cfg, splits);
                    // erf is the general path's inline code: within a few ulp of libm.
                    let cmp = if what == "erf" { Cmp { zero_sign: false, rtol: 1e-5 } } else { EXACT };
                    if let Err(e) = compare(&got, &want, cmp) {
                        panic!("{what} {m}x{k}x{n} under {:?}: {e}", cfg.target);
                    }
                }
            }
        }
    }
}

/// A row kernel with a u8 result (a QuantizeLinear after a Softmax: `round(softmax(x) /
/// s) + z`, clamped, cast) is a 16-lane row kernel storing bytes, and matches the
/// interpreter; rows of every length mod 16 (the masked tail).
#[test]
fn row_kernels_store_bytes() {
    use kiln_flow::{BinaryOp, KernelBuilder, ScalarType, UnaryOp};
    // (The 16-lane row kernel: the AVX-512 configurations only.)
    let cfgs: Vec<Config> =
        int8_configs_or_skip!().into_iter().filter(|c| !matches!(c.target, CpuTarget::X86_64V3)).collect();
    for len in [1usize, 15, 16, 17, 40] {
        let rows = 3;
        let sm = softmax(rows, len);
        // q = u8(min(max(round(y / s) + 3, 0), 255)) over the softmax `y`.
        let t = |d: DType, dims: &[usize]| kiln_ir::TensorType::new(d, Shape::new(dims.to_vec()).unwrap());
        let mut b = KernelBuilder::new("q", vec![t(DType::F32, &[rows, len])], t(DType::U8, &[rows, len]));
        let o = b.out_index();
        let y = b.load(0, o.clone());
        let s = b.float(ScalarType::F32, 1.0 / 255.0);
        let v = b.binary(BinaryOp::Div, y, s);
        let v = b.unary(UnaryOp::Round, v);
        let z = b.float(ScalarType::F32, 3.0);
        let v = b.add(v, z);
        let (lo, hi) = (b.float(ScalarType::F32, 0.0), b.float(ScalarType::F32, 255.0));
        let v = b.binary(BinaryOp::Max, v, lo);
        let v = b.binary(BinaryOp::Min, v, hi);
        let v = b.cast(v, DType::U8, true);
        let q = b.finish(v).unwrap();
        let x = Tensor::from_f64(
            DType::F32,
            Shape::new(vec![rows, len]).unwrap(),
            &(0..rows * len).map(|i| ((i * 37) % 11) as f64 * 0.3 - 1.0).collect::<Vec<_>>(),
        )
        .unwrap();
        let y = kiln_flow::interp::run(&sm, &[&x]).unwrap();
        let want = kiln_flow::interp::run(&q, &[&y]).unwrap();
        for cfg in &cfgs {
            let note = compile_with(&classify(&[&q]), &cfg.target, &cfg.options).unwrap().notes[0].clone();
            assert!(note.contains("row kernel (avx-512)"), "{len}: {note}");
            let got = run_compiled(&q, &[&y], cfg, 2);
            compare(&got, &want, EXACT).unwrap_or_else(|e| panic!("{len}: {e}"));
        }
    }
}

/// `QLinearMatMul` (`a` u8 or i8, `b` i8, result `yt`) followed by a saturating `Clip`
/// on the quantized result, as one kernel the way fusion writes it: the QLinear
/// lowering's requantisation `sat(round(f32(acc) · (s_a·s_b / s_y)) + z_y)` cast to
/// `yt`, then `x < lo ? lo : x` and `x > hi ? hi : x` on `yt` values (the Clip
/// lowering's comparisons and selects).
fn clamped_kernel(
    at: DType,
    yt: DType,
    (m, k, n): (usize, usize, usize),
    q: [f64; 3],
    z: [i64; 2],
    lo: i64,
    hi: i64,
) -> kiln_flow::Kernel {
    use kiln_flow::{BinaryOp, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
    let t = |d: DType, dims: &[usize]| kiln_ir::TensorType::new(d, Shape::new(dims.to_vec()).unwrap());
    let st = |d: DType| if d == DType::U8 { ScalarType::U8 } else { ScalarType::I8 };
    let mut b = KernelBuilder::new("clamped", vec![t(at, &[m, k]), t(DType::I8, &[k, n])], t(yt, &[m, n]));
    let o = b.out_index();
    let kv = b.new_var(k as u64);
    let kk = b.var(kv);
    let x = b.load(0, vec![o[0], kk]);
    let x = b.convert(x, ScalarType::I32);
    let za = b.int(ScalarType::I32, z[0]);
    let x = b.sub(x, za);
    let w = b.load(1, vec![kk, o[1]]);
    let w = b.convert(w, ScalarType::I32);
    let p = b.mul(x, w);
    let acc = b.reduce(ReduceOp::Sum, vec![kv], p);
    let (sa, sb, sy) = (b.float(ScalarType::F32, q[0]), b.float(ScalarType::F32, q[1]), b.float(ScalarType::F32, q[2]));
    let sab = b.mul(sa, sb);
    let scale = b.binary(BinaryOp::Div, sab, sy);
    let f = b.convert(acc, ScalarType::F32);
    let v = b.mul(f, scale);
    let v = b.unary(UnaryOp::Round, v);
    let zy = b.float(ScalarType::F32, z[1] as f64);
    let v = b.add(v, zy);
    let (tmin, tmax) = if yt == DType::U8 { (0.0, 255.0) } else { (-128.0, 127.0) };
    let (fmin, fmax) = (b.float(ScalarType::F32, tmin), b.float(ScalarType::F32, tmax));
    let v = b.binary(BinaryOp::Max, v, fmin);
    let v = b.binary(BinaryOp::Min, v, fmax);
    let y = b.cast(v, yt, true);
    let (l, h) = (b.int(st(yt), lo), b.int(st(yt), hi));
    let below = b.binary(BinaryOp::Lt, y, l);
    let y = b.select(below, l, y);
    let above = b.binary(BinaryOp::Gt, y, h);
    let y = b.select(above, h, y);
    b.finish(y).unwrap()
}

/// A saturating clamp on a QLinear result (a fused ReLU/ReLU6 from the TFLite importer,
/// or a QDQ activation folded by `tensor-fold-quantized-contractions`) stays on the
/// integer microkernel, and equals the reference evaluator's `QLinearMatMul` then
/// `Clip`, element for element (odd shapes, bounds inside and at the type's ends).
#[test]
fn clamped_epilogue() {
    let cfgs = int8_configs_or_skip!();
    for (at, yt, zy, lo, hi) in [
        (DType::U8, DType::U8, 100, 100, 190),
        (DType::I8, DType::I8, -20, -20, 60),
        (DType::I8, DType::I8, -128, -128, 127),
        (DType::U8, DType::I8, 5, -3, 4),
    ] {
        for &(m, k, n) in &[(1, 3, 5), (9, 17, 40), (20, 70, 33), (13, 4, 1), (11, 5, 600)] {
            let za = if at == DType::U8 { 128 } else { -7 };
            let q = [0.02, 0.003, 0.05];
            let kernel = clamped_kernel(at, yt, (m, k, n), q, [za, zy], lo, hi);
            let a = ints(at, &[m, k], 7);
            let b = ints(DType::I8, &[k, n], 8);
            let inputs = [&a, &b];
            let want = kiln_flow::interp::run(&kernel, &inputs).unwrap();
            // The reference evaluator: QLinearMatMul, then Clip.
            let qin = [
                Some(&a),
                Some(&f32_scalar(q[0])),
                Some(&int_scalar(at, za)),
                Some(&b),
                Some(&f32_scalar(q[1])),
                Some(&int_scalar(DType::I8, 0)),
                Some(&f32_scalar(q[2])),
                Some(&int_scalar(yt, zy)),
            ];
            let qin: Vec<Option<&Tensor>> = qin.to_vec();
            let yty = [kiln_ir::TensorType::new(yt, Shape::new(vec![m, n]).unwrap())];
            let y = kiln_ref::eval_op(&Op::new(OpKind::QLinearMatMul), &qin, &yty).unwrap();
            let (l, h) = (int_scalar(yt, lo), int_scalar(yt, hi));
            let r = kiln_ref::eval_op(&Op::new(OpKind::Clip), &[Some(&y[0]), Some(&l), Some(&h)], &yty).unwrap();
            assert_eq!(want.to_f64_vec(), r[0].to_f64_vec(), "interpreter against the reference");
            let clamped = want.to_f64_vec().iter().filter(|&&x| x == lo as f64 || x == hi as f64).count();
            assert!(clamped > 0 || m * n < 8, "{yt:?} {m}x{k}x{n}: no element at a bound");
            for cfg in &cfgs {
                let note = compile_with(&classify(&[&kernel]), &cfg.target, &cfg.options).unwrap().notes[0].clone();
                assert!(note.starts_with("integer contraction microkernel"), "{yt:?}: {note}");
                for splits in [1, 3] {
                    let got = run_compiled(&kernel, &inputs, cfg, splits);
                    if let Err(e) = compare(&got, &want, EXACT) {
                        panic!("{at:?}->{yt:?} {m}x{k}x{n} under {:?}: {e}", cfg.target);
                    }
                }
            }
        }
    }
}

/// `out[m] = Σ_k i32(a[m, k])·i32(b[k]) − i32(z)·s[m]` with `a` i8 `[m, k]`, `b` u8
/// `[k, 1]`, `z` a u8 scalar and `s` i32 `[m]`: a dynamic-int8 recurrent step after
/// `kiln_flow::dequant::fold_int_constant_sums` (the weight's rows, the quantised state's
/// column, its zero point folded into the epilogue with the weight's row sums). In the
/// AVX2 form this is the one-column form's nibble products (`vpmaddubsw` against the
/// state's low and high nibbles, eight chunks of 32 bytes a 16-bit accumulator).
fn column_kernel(m: usize, k: usize) -> kiln_flow::Kernel {
    use kiln_flow::{KernelBuilder, ReduceOp, ScalarType};
    let t = |d: DType, dims: &[usize]| kiln_ir::TensorType::new(d, Shape::new(dims.to_vec()).unwrap());
    let ins = vec![t(DType::I8, &[m, k]), t(DType::U8, &[k, 1]), t(DType::U8, &[]), t(DType::I32, &[m])];
    let mut b = KernelBuilder::new("column", ins, t(DType::I32, &[m, 1]));
    let o = b.out_index();
    let kv = b.new_var(k as u64);
    let kk = b.var(kv);
    let x = b.load(0, vec![o[0], kk]);
    let x = b.convert(x, ScalarType::I32);
    let w = b.load(1, vec![kk, o[1]]);
    let w = b.convert(w, ScalarType::I32);
    let p = b.mul(x, w);
    let acc = b.reduce(ReduceOp::Sum, vec![kv], p);
    let z = b.load(2, vec![]);
    let z = b.convert(z, ScalarType::I32);
    let s = b.load(3, vec![o[0]]);
    let zs = b.mul(z, s);
    let root = b.sub(acc, zs);
    b.finish(root).unwrap()
}

/// The one-column form of an i8 weight against a u8 column without zero points
/// ([`column_kernel`]) matches the interpreter exactly: `K` a multiple of 256 (whole
/// groups of eight 32-byte chunks), with chunks left after the groups and a partial
/// last chunk (the tail copies), exactly 32; rows of every count mod 8 and mod 4 (a
/// pass's second four rows partial or empty) and several passes a workgroup. The
/// operands' extremes (rows of −128 and of 127 against a column of 255) put each
/// 16-bit accumulator at its bound (eight chunks of `2·128·15`).
#[test]
fn one_column_nibbles() {
    let cfgs = int8_configs_or_skip!();
    for &(m, k) in &[(8, 256), (40, 768), (13, 300), (3, 95), (21, 32), (6, 33), (66, 520), (197, 287)] {
        let kernel = column_kernel(m, k);
        let mut a = ints(DType::I8, &[m, k], (m * k) as u64).to_f64_vec();
        a[..k].fill(-128.0);
        if m > 1 {
            a[k..2 * k].fill(127.0);
        }
        let a = Tensor::from_f64(DType::I8, Shape::new(vec![m, k]).unwrap(), &a).unwrap();
        let full = Tensor::from_i64(DType::U8, Shape::new(vec![k, 1]).unwrap(), &vec![255; k]).unwrap();
        let z = int_scalar(DType::U8, 131);
        let s = ints(DType::I32, &[m], 3);
        for b in [full, ints(DType::U8, &[k, 1], k as u64)] {
            let inputs = [&a, &b, &z, &s];
            let want = kiln_flow::interp::run(&kernel, &inputs).unwrap();
            for cfg in &cfgs {
                let note = compile_with(&classify(&[&kernel]), &cfg.target, &cfg.options).unwrap().notes[0].clone();
                assert!(note.starts_with("integer contraction microkernel"), "{m}x{k}: {note}");
                for splits in [1, 3] {
                    let got = run_compiled(&kernel, &inputs, cfg, splits);
                    if let Err(e) = compare(&got, &want, EXACT) {
                        panic!("{m}x{k} under {:?}, splits {splits}: {e}", cfg.target);
                    }
                }
            }
        }
    }
}
