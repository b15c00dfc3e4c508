//! The kernel IR: builder, verifier and interpreter on hand-built kernels whose
//! expected values are computed by hand or by plain formulas in the test.

use kiln_flow::interp::run;
use kiln_flow::kernel::{BinaryOp, Bounds, KernelBuilder, KernelError, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor};

mod common;
use common::{f32s, ty};

#[test]
fn matmul_as_a_reduce() {
    // [2,3] x [3,2]
    let mut b =
        KernelBuilder::new("mm", vec![ty(DType::F32, &[2, 3]), ty(DType::F32, &[3, 2])], ty(DType::F32, &[2, 2]));
    let (_, s) = b.matmul_sum(3);
    let kern = b.finish(s).unwrap();
    let x = f32s(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let y = f32s(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
    let r = run(&kern, &[&x, &y]).unwrap();
    // [1 2 3; 4 5 6] · [7 8; 9 10; 11 12] = [58 64; 139 154]
    assert_eq!(r.to_f64_vec(), vec![58., 64., 139., 154.]);
}

#[test]
fn softmax_in_one_kernel() {
    let n = 5;
    let mut b = KernelBuilder::new("sm", vec![ty(DType::F32, &[2, n])], ty(DType::F32, &[2, n]));
    let o = b.out_index();
    let j = b.new_var(n as u64);
    let jv = b.var(j);
    let xj = b.load(0, vec![o[0], jv]);
    let m = b.reduce(ReduceOp::Max, vec![j], xj);
    let k = b.new_var(n as u64);
    let kv = b.var(k);
    let xk = b.load(0, vec![o[0], kv]);
    let d = b.sub(xk, m);
    let e = b.unary(UnaryOp::Exp, d);
    let s = b.reduce(ReduceOp::Sum, vec![k], e);
    let x = b.load(0, o.clone());
    let dx = b.sub(x, m);
    let ex = b.unary(UnaryOp::Exp, dx);
    let y = b.div(ex, s);
    let kern = b.finish(y).unwrap();
    let v = [0.5, -1.0, 2.0, 0.0, 3.25, 10.0, 10.0, -10.0, 1.0, 0.0];
    let r = run(&kern, &[&f32s(&[2, n], &v)]).unwrap().to_f64_vec();
    for row in 0..2 {
        let xs = &v[row * n..(row + 1) * n];
        let mx = xs.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = xs.iter().map(|x| (x - mx).exp()).sum();
        for c in 0..n {
            let want = (xs[c] - mx).exp() / sum;
            assert!((r[row * n + c] - want).abs() < 1e-6, "row {row} col {c}: {} vs {want}", r[row * n + c]);
        }
    }
}

#[test]
fn verifier_rejects_a_load_it_cannot_prove_in_bounds() {
    let mut b = KernelBuilder::new("shift", vec![ty(DType::F32, &[4])], ty(DType::F32, &[4]));
    let o = b.out_index();
    let one = b.index(1);
    let i = b.add(o[0], one);
    let x = b.load(0, vec![i]);
    match b.finish(x) {
        Err(KernelError::OutOfBounds { lo: 1, hi: 4, extent: 4, .. }) => {}
        other => panic!("expected OutOfBounds, got {other:?}"),
    }
}

#[test]
fn padded_and_clamped_loads() {
    // y[i] = x[i - 1] padded with 9, plus x[clamp(i + 1)].
    let mut b = KernelBuilder::new("pad", vec![ty(DType::I32, &[3])], ty(DType::I32, &[3]));
    let o = b.out_index();
    let one = b.index(1);
    let im1 = b.sub(o[0], one);
    let ip1 = b.add(o[0], one);
    let p = b.load_with(0, vec![im1], Bounds::Pad(9));
    let c = b.load_with(0, vec![ip1], Bounds::Clamp);
    let y = b.add(p, c);
    let kern = b.finish(y).unwrap();
    let x = Tensor::from_i64(DType::I32, Shape::new(vec![3]).unwrap(), &[10, 20, 30]).unwrap();
    // i=0: 9 + x[1]=20 → 29; i=1: 10 + 30 = 40; i=2: 20 + x[clamp 3 → 2]=30 → 50.
    assert_eq!(run(&kern, &[&x]).unwrap().to_i64_vec().unwrap(), vec![29, 40, 50]);
}

#[test]
fn data_dependent_indices_must_be_clamped() {
    let mut b = KernelBuilder::new("gather", vec![ty(DType::F32, &[3]), ty(DType::I64, &[2])], ty(DType::F32, &[2]));
    let o = b.out_index();
    let i = b.load(1, vec![o[0]]);
    let x = b.load(0, vec![i]);
    assert!(matches!(b.finish(x), Err(KernelError::OutOfBounds { .. })));
    let mut b = KernelBuilder::new("gather", vec![ty(DType::F32, &[3]), ty(DType::I64, &[2])], ty(DType::F32, &[2]));
    let o = b.out_index();
    let i = b.load(1, vec![o[0]]);
    let x = b.load_with(0, vec![i], Bounds::Clamp);
    let kern = b.finish(x).unwrap();
    let idx = Tensor::from_i64(DType::I64, Shape::new(vec![2]).unwrap(), &[2, 99]).unwrap();
    let r = run(&kern, &[&f32s(&[3], &[1., 2., 3.]), &idx]).unwrap();
    assert_eq!(r.to_f64_vec(), vec![3., 3.]);
}

#[test]
fn type_errors_are_reported_by_finish() {
    let mut b = KernelBuilder::new("bad", vec![ty(DType::F32, &[2])], ty(DType::F32, &[2]));
    let o = b.out_index();
    let x = b.load(0, o.clone());
    let y = b.add(x, o[0]); // f32 + i64
    assert!(matches!(b.finish(y), Err(KernelError::Type { .. })));
}

#[test]
fn a_reduce_variable_cannot_escape() {
    let mut b = KernelBuilder::new("esc", vec![ty(DType::F32, &[2, 3])], ty(DType::F32, &[2]));
    let o = b.out_index();
    let k = b.new_var(3);
    let kv = b.var(k);
    let x = b.load(0, vec![o[0], kv]);
    let s = b.reduce(ReduceOp::Sum, vec![k], x);
    let y = b.add(s, x); // `x` reads k outside the reduce
    assert!(matches!(b.finish(y), Err(KernelError::Structure { .. })));
}

#[test]
fn integer_division_never_traps() {
    let mut b = KernelBuilder::new("div", vec![ty(DType::I32, &[4]), ty(DType::I32, &[4])], ty(DType::I32, &[4]));
    let o = b.out_index();
    let x = b.load(0, o.clone());
    let y = b.load(1, o.clone());
    let q = b.div(x, y);
    let r = b.binary(BinaryOp::Rem, x, y);
    let s = b.add(q, r);
    let kern = b.finish(s).unwrap();
    let xs = Tensor::from_i64(DType::I32, Shape::new(vec![4]).unwrap(), &[7, -7, i32::MIN as i64, 5]).unwrap();
    let ys = Tensor::from_i64(DType::I32, Shape::new(vec![4]).unwrap(), &[2, 2, -1, 0]).unwrap();
    // 7/2=3 r1 → 4; -7/2=-3 r-1 → -4; MIN/-1 = MIN r0 → MIN; 5/0 = 0 r0 → 0.
    let got = run(&kern, &[&xs, &ys]).unwrap().to_i64_vec().unwrap();
    assert_eq!(got, vec![4, -4, i32::MIN as i64, 0]);
}

#[test]
fn casts_follow_onnx() {
    let mut b = KernelBuilder::new("cast", vec![ty(DType::F32, &[5])], ty(DType::I8, &[5]));
    let o = b.out_index();
    let x = b.load(0, o);
    let c = b.cast(x, DType::I8, true);
    let kern = b.finish(c).unwrap();
    let r = run(&kern, &[&f32s(&[5], &[300.7, -1.9, f64::NAN, 127.0, -129.0])]).unwrap();
    // Truncate to 64 bits, then wrap: 300 → 44, -1, NaN → 0, 127, -129 → 127.
    assert_eq!(r.to_i64_vec().unwrap(), vec![44, -1, 0, 127, 127]);
    let mut b = KernelBuilder::new("half", vec![ty(DType::F32, &[2])], ty(DType::F16, &[2]));
    let o = b.out_index();
    let x = b.load(0, o);
    let c = b.cast(x, DType::F16, true);
    assert_eq!(b.ty(c), ScalarType::F32);
    let kern = b.finish(c).unwrap();
    // 1 + 2^-11 is halfway between f16 neighbours 1 and 1 + 2^-10: ties to even → 1.
    let r = run(&kern, &[&f32s(&[2], &[1.0 + 2f64.powi(-11), 65520.0])]).unwrap();
    assert_eq!(r.to_f64_vec()[0], 1.0);
    assert!(r.to_f64_vec()[1].is_infinite());
}

#[test]
fn argmax_first_and_last() {
    for (last, want) in [(false, 1), (true, 3)] {
        let mut b = KernelBuilder::new("am", vec![ty(DType::F32, &[5])], ty(DType::I64, &[]));
        let k = b.new_var(5);
        let kv = b.var(k);
        let x = b.load(0, vec![kv]);
        let a = b.reduce(ReduceOp::ArgMax { last }, vec![k], x);
        let kern = b.finish(a).unwrap();
        let r = run(&kern, &[&f32s(&[5], &[1., 4., 2., 4., 0.])]).unwrap();
        assert_eq!(r.to_i64_vec().unwrap(), vec![want]);
    }
}

#[test]
fn printing_lists_every_node() {
    let mut b = KernelBuilder::new("p", vec![ty(DType::F32, &[3])], ty(DType::F32, &[3]));
    let o = b.out_index();
    let x = b.load(0, o);
    let e = b.unary(UnaryOp::Exp, x);
    let kern = b.finish(e).unwrap();
    let text = kern.to_string();
    assert!(text.starts_with("kernel @p(%0: f32[3]) -> f32[3] {"), "{text}");
    assert!(text.contains("= exp e1"), "{text}");
    assert!(text.trim_end().ends_with("yield e2\n}") || text.contains("yield e2"), "{text}");
}

#[test]
fn constant_conditions_choose_one_piece() {
    // A fused chain of loop trips, as a Concat of three trips' rows then a Slice of the
    // last one: trip k's piece reads row min(max(k, 0), 2) at (0 * 4 + i) % 4, and the
    // chain selects it where `2 < k` fails from the last trip down. Every index and
    // condition is a constant or the output variable, so the kernel is the last trip's
    // piece alone: one load, no select, no clamp, no remainder.
    let mut b = KernelBuilder::new("trips", vec![ty(DType::F32, &[3, 4])], ty(DType::F32, &[4]));
    let i = b.out_index()[0];
    let (zero, two, four, last) = (b.index(0), b.index(2), b.index(4), b.index(2));
    let mut chain = None;
    for k in (0..3).rev() {
        let kk = b.index(k);
        let lo = b.binary(BinaryOp::Max, kk, zero);
        let row = b.binary(BinaryOp::Min, lo, two);
        let z = b.binary(BinaryOp::Max, zero, zero);
        let base = b.binary(BinaryOp::Mul, z, four);
        let at = b.add(base, i);
        let col = b.binary(BinaryOp::Rem, at, four);
        let x = b.load(0, vec![row, col]);
        let piece = b.binary(BinaryOp::Mul, x, x);
        chain = Some(match chain {
            None => piece,
            Some(rest) => {
                let later = b.binary(BinaryOp::Lt, last, kk);
                b.select(later, piece, rest)
            }
        });
    }
    let kern = b.finish(chain.unwrap()).unwrap();
    let text = kern.to_string();
    assert!(!text.contains("select") && !text.contains("rem") && !text.contains("min"), "{text}");
    assert_eq!(text.matches("load").count(), 1, "{text}");
    let x = f32s(&[3, 4], &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.]);
    assert_eq!(run(&kern, &[&x]).unwrap().to_f64_vec(), vec![81., 100., 121., 144.]);
}

#[test]
fn constant_comparisons_follow_the_operand_type() {
    // -1 < 1 as i32; 0xFFFF_FFFF < 1 fails as u32. A remainder by less than the
    // variable's extent stays.
    for (d, x, want) in [(DType::I32, -1i64, 1i64), (DType::U32, 0xFFFF_FFFF, 0)] {
        let mut b = KernelBuilder::new("cmp", vec![], ty(DType::I64, &[5]));
        let i = b.out_index()[0];
        let t = ScalarType::of_storage(d);
        let (x, one) = (b.int(t, x), b.int(t, 1));
        let lt = b.binary(BinaryOp::Lt, x, one);
        let three = b.index(3);
        let r = b.binary(BinaryOp::Rem, i, three);
        let (hundred, zero) = (b.index(100), b.index(0));
        let picked = b.select(lt, hundred, zero);
        let s = b.add(picked, r);
        let kern = b.finish(s).unwrap();
        assert!(!kern.to_string().contains("lt") && kern.to_string().contains("rem"), "{kern}");
        let got = run(&kern, &[]).unwrap().to_i64_vec().unwrap();
        assert_eq!(got, (0..5).map(|i| want * 100 + i % 3).collect::<Vec<_>>(), "{d:?}");
    }
}

#[test]
fn a_quotient_every_value_shares_is_a_constant() {
    // ((79 + v0) · 4 + v1) over v0 < 1, v1 < 4 (a reshape's flat index at a fixed step):
    // divided by 4 it is 79 everywhere, and its remainder is the flat index less 316.
    // Row 79 − 78 = 1 of x, read along v1: no division or remainder is left.
    let mut b = KernelBuilder::new("step", vec![ty(DType::F32, &[3, 4])], ty(DType::F32, &[1, 4]));
    let o = b.out_index();
    let (c79, four, c78) = (b.index(79), b.index(4), b.index(78));
    let t = b.add(c79, o[0]);
    let scaled = b.binary(BinaryOp::Mul, t, four);
    let flat = b.add(scaled, o[1]);
    let q = b.div(flat, four);
    let row = b.binary(BinaryOp::Sub, q, c78);
    let col = b.binary(BinaryOp::Rem, flat, four);
    let x = b.load(0, vec![row, col]);
    let kern = b.finish(x).unwrap();
    let text = kern.to_string();
    assert!(!text.contains("div") && !text.contains("rem"), "{text}");
    let x = f32s(&[3, 4], &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.]);
    assert_eq!(run(&kern, &[&x]).unwrap().to_f64_vec(), vec![5., 6., 7., 8.]);
}

#[test]
fn a_quotient_by_zero_is_left_to_the_kernel() {
    // `v / 0` and `v % 0` (a fuzzed or malformed kernel) are not folded, and building
    // them does not trap: the kernel's own semantics (0 for both) run.
    let mut b = KernelBuilder::new("zero", vec![], ty(DType::I64, &[3]));
    let o = b.out_index();
    let zero = b.index(0);
    let q = b.div(o[0], zero);
    let r = b.binary(BinaryOp::Rem, o[0], zero);
    let s = b.add(q, r);
    let kern = b.finish(s).unwrap();
    let text = kern.to_string();
    assert!(text.contains("div") && text.contains("rem"), "{text}");
    assert_eq!(run(&kern, &[]).unwrap().to_i64_vec().unwrap(), vec![0, 0, 0]);
}

/// A scatter kernel over 5 updates into 4 elements: positions from an index tensor
/// (one out of range), each combined in order with what is there.
fn scatter_kernel(combine: Option<BinaryOp>) -> kiln_flow::Kernel {
    let mut b = KernelBuilder::new(
        "sc",
        vec![ty(DType::F32, &[4]), ty(DType::I64, &[5]), ty(DType::F32, &[5])],
        ty(DType::F32, &[4]),
    );
    let u = b.scatter_domain(&[5]);
    let at = b.load(1, u.clone());
    let v = b.load(2, u);
    b.finish_scatter(v, at, combine).unwrap()
}

#[test]
fn scatter_stores_each_point_in_order() {
    let x = f32s(&[4], &[1., 2., 3., 4.]);
    let idx = Tensor::from_i64(DType::I64, Shape::new(vec![5]).unwrap(), &[2, 0, 2, 7, -1]).unwrap();
    let u = f32s(&[5], &[10., 20., 30., 40., 50.]);
    // Element 2 is hit twice (10, then 30); 7 and -1 lie outside the output: dropped.
    let cases = [
        (None, [20., 2., 30., 4.]),
        (Some(BinaryOp::Add), [21., 2., 43., 4.]),
        (Some(BinaryOp::Mul), [20., 2., 900., 4.]),
        (Some(BinaryOp::Max), [20., 2., 30., 4.]),
        (Some(BinaryOp::Min), [1., 2., 3., 4.]),
    ];
    for (combine, want) in cases {
        let r = run(&scatter_kernel(combine), &[&x, &idx, &u]).unwrap();
        assert_eq!(r.to_f64_vec(), want.to_vec(), "{combine:?}");
    }
}

#[test]
fn scatter_kernels_are_checked() {
    let k = scatter_kernel(Some(BinaryOp::Add));
    assert_eq!(k.index_rank(), 1);
    assert_eq!(k.index_dims(), &[5]);
    // A combination the type has no meaning for.
    let mut bad = k.clone();
    bad.scatter.as_mut().unwrap().combine = Some(BinaryOp::Sub);
    assert!(matches!(bad.verify(), Err(KernelError::Type { .. })));
    let mut bad = k.clone();
    bad.scatter.as_mut().unwrap().combine = Some(BinaryOp::Or);
    assert!(matches!(bad.verify(), Err(KernelError::Type { .. })));
    // A position that is not an i64.
    let mut bad = k.clone();
    let root = bad.root;
    bad.scatter.as_mut().unwrap().at = root;
    assert!(matches!(bad.verify(), Err(KernelError::Type { .. })));
    // Input 0 must have the output's type (it is what the output starts as).
    let mut bad = k.clone();
    bad.inputs[0] = ty(DType::F32, &[5]);
    assert!(matches!(bad.verify(), Err(KernelError::Structure { .. })));
    // A narrow output would round between updates.
    let mut b = KernelBuilder::new("h", vec![ty(DType::F16, &[4]), ty(DType::F32, &[2])], ty(DType::F16, &[4]));
    let u = b.scatter_domain(&[2]);
    let v = b.load(1, u.clone());
    assert!(b.finish_scatter(v, u[0], None).is_err());
}
