//! Reference evaluator: elementwise, reduction, normalisation and quantisation ops.
//! Expected values are hand-computed (or closed-form expressions of the definition).

use half::{bf16, f16};
use kiln_ir::{Attr, DType, OpKind, Tensor, TensorType};
mod common;
use common::{run, sh, t, ti, ty};
use kiln_ref::EvalError;

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

/// One result, which must succeed.
fn run1(kind: OpKind, attrs: &[(&str, Attr)], ins: &[&Tensor], out: TensorType) -> Tensor {
    let ins: Vec<Option<&Tensor>> = ins.iter().map(|&t| Some(t)).collect();
    let mut r = run(kind, attrs, &ins, &[out]).unwrap_or_else(|e| panic!("{kind}: {e}"));
    r.remove(0)
}

fn int(v: i64) -> Attr {
    Attr::Int(v)
}

fn float(v: f32) -> Attr {
    Attr::Float(v)
}

/// Exact equality, NaN equal to NaN.
fn same(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g.is_nan() && w.is_nan()) || g == w, "got {got:?}, want {want:?}");
    }
}

/// Relative closeness, NaN equal to NaN.
fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        let ok = (g.is_nan() && w.is_nan()) || g == w || (g - w).abs() <= tol * w.abs().max(1e-30);
        assert!(ok, "got {got:?}, want {want:?}");
    }
}

fn f32s(v: &[f64]) -> Vec<f64> {
    v.iter().map(|&x| x as f32 as f64).collect()
}

const NAN: f32 = f32::NAN;

// ---------------------------------------------------------------------------
// Elementwise.
// ---------------------------------------------------------------------------

#[test]
fn add_broadcasts() {
    let a = t(&[2, 3], &[1f32, 2., 3., 4., 5., 6.]);
    let b = t(&[3], &[10f32, 20., 30.]);
    let r = run1(OpKind::Add, &[], &[&a, &b], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[11., 22., 33., 14., 25., 36.]);
    // [2,1] + [1,3] → outer sum.
    let c = t(&[2, 1], &[1f32, 2.]);
    let d = t(&[1, 3], &[10f32, 20., 30.]);
    let r = run1(OpKind::Add, &[], &[&c, &d], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[11., 21., 31., 12., 22., 32.]);
    // Scalar with an empty tensor.
    let e = t::<f32>(&[0, 3], &[]);
    let s = Tensor::scalar(1f32);
    let r = run1(OpKind::Add, &[], &[&e, &s], ty(DType::F32, &[0, 3]));
    assert_eq!(r.numel(), 0);
    // Shapes that do not broadcast, or a wrong result shape, are errors.
    let bad = t(&[2], &[1f32, 2.]);
    assert!(run(OpKind::Add, &[], &[Some(&a), Some(&bad)], &[ty(DType::F32, &[2, 3])]).is_err());
    assert!(run(OpKind::Add, &[], &[Some(&a), Some(&b)], &[ty(DType::F32, &[3, 3])]).is_err());
    // Mixed dtypes are an error.
    let i = ti(DType::I32, &[3], &[1, 2, 3]);
    assert!(run(OpKind::Add, &[], &[Some(&a), Some(&i)], &[ty(DType::F32, &[2, 3])]).is_err());
    // A missing operand is an error, not a panic.
    assert!(run(OpKind::Add, &[], &[Some(&a), None], &[ty(DType::F32, &[2, 3])]).is_err());
}

#[test]
fn f32_arithmetic_is_ieee_exact() {
    // Computing in f64 and rounding once equals the IEEE f32 result for + - * /.
    let xs = [1e8f32, 1.0, 0.1, 3.0, -7.25, 1.0e-38, 3.4e38, 16777217.0, 0.3];
    let ys = [1.0f32, 3.0, 0.2, 7.0, 0.1, 1.0e-3, 3.4e38, 1.0, -0.7];
    let a = t(&[9], &xs);
    let b = t(&[9], &ys);
    for (k, f) in [
        (OpKind::Add, (|p, q| p + q) as fn(f32, f32) -> f32),
        (OpKind::Sub, |p, q| p - q),
        (OpKind::Mul, |p, q| p * q),
        (OpKind::Div, |p, q| p / q),
    ] {
        let r = run1(k, &[], &[&a, &b], ty(DType::F32, &[9]));
        let want: Vec<f32> = xs.iter().zip(&ys).map(|(&p, &q)| f(p, q)).collect();
        assert_eq!(r.to_vec::<f32>().unwrap(), want, "{k}");
    }
}

#[test]
fn f16_and_bf16_arithmetic() {
    let a = t(&[3], &[f16::from_f32(1.0), f16::from_f32(2048.0), f16::from_f32(60000.0)]);
    let b = t(&[3], &[f16::from_f32(3.0), f16::from_f32(1.0), f16::from_f32(10000.0)]);
    let r = run1(OpKind::Add, &[], &[&a, &b], ty(DType::F16, &[3]));
    // 2048 + 1 is a tie between 2048 and 2050 → 2048 (even); 70000 overflows.
    same(&r.to_f64_vec(), &[4.0, 2048.0, f64::INFINITY]);
    let r = run1(OpKind::Div, &[], &[&a, &b], ty(DType::F16, &[3]));
    assert_eq!(r.to_vec::<f16>().unwrap()[0], f16::from_f32(1.0 / 3.0));
    let c = t(&[2], &[bf16::from_f32(1.0), bf16::from_f32(256.0)]);
    let d = t(&[2], &[bf16::from_f32(3.0), bf16::from_f32(1.0)]);
    let r = run1(OpKind::Add, &[], &[&c, &d], ty(DType::BF16, &[2]));
    // 257 is a tie between 256 and 258 in bf16 → 256.
    same(&r.to_f64_vec(), &[4.0, 256.0]);
}

#[test]
fn integer_division_and_mod() {
    let a = ti(DType::I32, &[4], &[7, -7, 7, -7]);
    let b = ti(DType::I32, &[4], &[2, 2, -2, -2]);
    let r = run1(OpKind::Div, &[], &[&a, &b], ty(DType::I32, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![3, -3, -3, 3]);
    let a = ti(DType::I32, &[4], &[5, -5, 5, -5]);
    let b = ti(DType::I32, &[4], &[3, 3, -3, -3]);
    // fmod = 0: the sign follows the divisor.
    let r = run1(OpKind::Mod, &[], &[&a, &b], ty(DType::I32, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, 1, -1, -2]);
    // fmod = 1: the sign follows the dividend.
    let r = run1(OpKind::Mod, &[("fmod", int(1))], &[&a, &b], ty(DType::I32, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, -2, 2, -2]);
    // Division by zero is an error.
    let z = ti(DType::I32, &[4], &[1, 0, 1, 1]);
    assert!(run(OpKind::Div, &[], &[Some(&a), Some(&z)], &[ty(DType::I32, &[4])]).is_err());
    assert!(run(OpKind::Mod, &[], &[Some(&a), Some(&z)], &[ty(DType::I32, &[4])]).is_err());
    // i8: -128 / -1 wraps; 100 + 100 wraps.
    let a = ti(DType::I8, &[2], &[-128, 100]);
    let b = ti(DType::I8, &[2], &[-1, 100]);
    assert_eq!(run1(OpKind::Div, &[], &[&a, &b], ty(DType::I8, &[2])).to_i64_vec().unwrap(), vec![-128, 1]);
    assert_eq!(run1(OpKind::Add, &[], &[&a, &b], ty(DType::I8, &[2])).to_i64_vec().unwrap(), vec![127, -56]);
    // u64 beyond i64::MAX divides and mods as unsigned.
    let a = t(&[2], &[u64::MAX, 10]);
    let b = t(&[2], &[10u64, 3]);
    let r = run1(OpKind::Div, &[], &[&a, &b], ty(DType::U64, &[2]));
    assert_eq!(r.to_vec::<u64>().unwrap(), vec![u64::MAX / 10, 3]);
    let r = run1(OpKind::Mod, &[], &[&a, &b], ty(DType::U64, &[2]));
    assert_eq!(r.to_vec::<u64>().unwrap(), vec![5, 1]);
}

#[test]
fn float_mod() {
    let a = t(&[4], &[5.5f32, -5.5, 5.5, -5.5]);
    let b = t(&[4], &[2f32, 2., -2., -2.]);
    let r = run1(OpKind::Mod, &[("fmod", int(1))], &[&a, &b], ty(DType::F32, &[4]));
    same(&r.to_f64_vec(), &[1.5, -1.5, 1.5, -1.5]);
    let r = run1(OpKind::Mod, &[], &[&a, &b], ty(DType::F32, &[4]));
    same(&r.to_f64_vec(), &[1.5, 0.5, -0.5, -1.5]);
}

#[test]
fn pow_mixed_dtypes() {
    let a = t(&[2], &[2f32, 3.]);
    let b = t(&[2], &[3f32, 0.5]);
    let r = run1(OpKind::Pow, &[], &[&a, &b], ty(DType::F32, &[2]));
    same(&r.to_f64_vec(), &[8.0, 3f32.sqrt() as f64]);
    // Float base, integer exponent.
    let e = ti(DType::I64, &[2], &[-2, 3]);
    let r = run1(OpKind::Pow, &[], &[&a, &e], ty(DType::F32, &[2]));
    same(&r.to_f64_vec(), &[0.25, 27.0]);
    // Integer base and exponent: exact.
    let ib = ti(DType::I32, &[3], &[2, 3, -2]);
    let ie = ti(DType::I64, &[3], &[10, 3, 3]);
    let r = run1(OpKind::Pow, &[], &[&ib, &ie], ty(DType::I32, &[3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1024, 27, -8]);
    // Large exact power beyond 2^53.
    let ib = ti(DType::I64, &[1], &[3]);
    let ie = ti(DType::I64, &[1], &[39]);
    let r = run1(OpKind::Pow, &[], &[&ib, &ie], ty(DType::I64, &[1]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![4052555153018976267]);
    // Negative integer exponents truncate the real result.
    let ib = ti(DType::I32, &[4], &[2, 1, -1, -1]);
    let ie = ti(DType::I32, &[4], &[-1, -5, -3, -2]);
    let r = run1(OpKind::Pow, &[], &[&ib, &ie], ty(DType::I32, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![0, 1, -1, 1]);
    // Integer base, float exponent: truncated.
    let ib = ti(DType::I32, &[2], &[4, 10]);
    let fe = t(&[2], &[0.5f32, -1.0]);
    let r = run1(OpKind::Pow, &[], &[&ib, &fe], ty(DType::I32, &[2]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, 0]);
}

#[test]
fn comparisons() {
    let a = t(&[3], &[1f32, NAN, 3.]);
    let b = t(&[3], &[1f32, NAN, 2.]);
    let cases = [
        (OpKind::Equal, [1, 0, 0]),
        (OpKind::Greater, [0, 0, 1]),
        (OpKind::GreaterOrEqual, [1, 0, 1]),
        (OpKind::Less, [0, 0, 0]),
        (OpKind::LessOrEqual, [1, 0, 0]),
    ];
    for (k, want) in cases {
        let r = run1(k, &[], &[&a, &b], ty(DType::Bool, &[3]));
        assert_eq!(r.to_i64_vec().unwrap(), want.to_vec(), "{k}");
    }
    // u64 compares as unsigned.
    let a = t(&[1], &[u64::MAX]);
    let b = t(&[1], &[1u64]);
    let r = run1(OpKind::Greater, &[], &[&a, &b], ty(DType::Bool, &[1]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1]);
    // Broadcast comparison of integers.
    let a = ti(DType::I64, &[2, 1], &[1, 5]);
    let b = ti(DType::I64, &[3], &[0, 1, 6]);
    let r = run1(OpKind::Less, &[], &[&a, &b], ty(DType::Bool, &[2, 3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![0, 0, 1, 0, 0, 1]);
}

#[test]
fn logical_and_bitwise() {
    let a = t(&[4], &[false, false, true, true]);
    let b = t(&[4], &[false, true, false, true]);
    for (k, want) in [(OpKind::And, [0, 0, 0, 1]), (OpKind::Or, [0, 1, 1, 1]), (OpKind::Xor, [0, 1, 1, 0])] {
        let r = run1(k, &[], &[&a, &b], ty(DType::Bool, &[4]));
        assert_eq!(r.to_i64_vec().unwrap(), want.to_vec(), "{k}");
    }
    let r = run1(OpKind::Not, &[], &[&a], ty(DType::Bool, &[4]));
    assert_eq!(r.to_vec::<bool>().unwrap(), vec![true, true, false, false]);

    let x = ti(DType::U8, &[2], &[5, 0]);
    let r = run1(OpKind::BitwiseNot, &[], &[&x], ty(DType::U8, &[2]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![250, 255]);
    let p = ti(DType::I32, &[2], &[12, -1]);
    let q = ti(DType::I32, &[2], &[10, 7]);
    for (op, want) in [(OpKind::BitwiseAnd, [8, 7]), (OpKind::BitwiseOr, [14, -1]), (OpKind::BitwiseXor, [6, -8])] {
        assert_eq!(run1(op, &[], &[&p, &q], ty(DType::I32, &[2])).to_i64_vec().unwrap(), want, "{op:?}");
    }
    let i4 = ti(DType::I4, &[2], &[5, -8]);
    let r = run1(OpKind::BitwiseNot, &[], &[&i4], ty(DType::I4, &[2]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![-6, 7]);

    let left = [("direction", Attr::String("LEFT".into()))];
    let right = [("direction", Attr::String("RIGHT".into()))];
    let x = ti(DType::U8, &[3], &[1, 255, 3]);
    let s = ti(DType::U8, &[3], &[3, 1, 8]);
    assert_eq!(run1(OpKind::BitShift, &left, &[&x, &s], ty(DType::U8, &[3])).to_i64_vec().unwrap(), vec![8, 254, 0]);
    let x = t(&[3], &[16u32, 5, u32::MAX]);
    let s = t(&[3], &[2u32, 40, 31]);
    assert_eq!(run1(OpKind::BitShift, &right, &[&x, &s], ty(DType::U32, &[3])).to_vec::<u32>().unwrap(), vec![4, 0, 1]);
    let x = t(&[2], &[u64::MAX, 1]);
    let s = t(&[2], &[63u64, 64]);
    assert_eq!(run1(OpKind::BitShift, &right, &[&x, &s], ty(DType::U64, &[2])).to_vec::<u64>().unwrap(), vec![1, 0]);
    assert!(run(OpKind::BitShift, &[], &[Some(&x), Some(&s)], &[ty(DType::U64, &[2])]).is_err());
}

#[test]
fn variadic_max_min_sum_mean() {
    let a = t(&[3], &[1f32, 5., 3.]);
    let b = t(&[2, 1], &[2f32, 4.]);
    let c = Tensor::scalar(3f32);
    let r = run1(OpKind::Max, &[], &[&a, &b, &c], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[3., 5., 3., 4., 5., 4.]);
    let r = run1(OpKind::Min, &[], &[&a, &b, &c], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[1., 2., 2., 1., 3., 3.]);
    let r = run1(OpKind::Sum, &[], &[&a, &b, &c], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[6., 10., 8., 8., 12., 10.]);
    let r = run1(OpKind::Mean, &[], &[&a, &b, &c], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &f32s(&[2., 10. / 3., 8. / 3., 8. / 3., 4., 10. / 3.]));
    // A single operand is the identity.
    let r = run1(OpKind::Max, &[], &[&a], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &[1., 5., 3.]);
    // NaN propagates through Max and Min.
    let n = t(&[3], &[NAN, 0., 9.]);
    let r = run1(OpKind::Max, &[], &[&a, &n], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &[f64::NAN, 5., 9.]);
    let r = run1(OpKind::Min, &[], &[&n, &a], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &[f64::NAN, 0., 3.]);
    // Integers: exact, unsigned compares, truncated mean.
    let p = ti(DType::I32, &[2], &[1, -1]);
    let q = ti(DType::I32, &[2], &[2, -2]);
    for (op, want) in [(OpKind::Mean, [1, -1]), (OpKind::Max, [2, -1])] {
        assert_eq!(run1(op, &[], &[&p, &q], ty(DType::I32, &[2])).to_i64_vec().unwrap(), want, "{op:?}");
    }
    let u = t(&[2], &[u64::MAX, 3]);
    let v = t(&[2], &[1u64, 4]);
    for (op, want) in [(OpKind::Max, [u64::MAX, 4]), (OpKind::Min, [1, 3]), (OpKind::Mean, [u64::MAX / 2 + 1, 3])] {
        assert_eq!(run1(op, &[], &[&u, &v], ty(DType::U64, &[2])).to_vec::<u64>().unwrap(), want, "{op:?}");
    }
}

#[test]
fn where_and_clip() {
    let c = t(&[2, 1], &[true, false]);
    let x = t(&[3], &[1f32, 2., 3.]);
    let y = Tensor::scalar(0f32);
    let r = run1(OpKind::Where, &[], &[&c, &x, &y], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[1., 2., 3., 0., 0., 0.]);
    // Raw bits are copied (NaN payload, negative zero).
    let x = t(&[2], &[f32::from_bits(0x7fc0_0001), -0.0]);
    let y = t(&[2], &[1f32, 1.]);
    let c = t(&[2], &[true, true]);
    let r = run1(OpKind::Where, &[], &[&c, &x, &y], ty(DType::F32, &[2]));
    let bits: Vec<u32> = r.to_vec::<f32>().unwrap().iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, vec![0x7fc0_0001, 0x8000_0000]);
    // Packed 4-bit values.
    let x = ti(DType::I4, &[3], &[-8, 7, 1]);
    let y = ti(DType::I4, &[3], &[0, 0, 0]);
    let c = t(&[3], &[true, false, true]);
    let r = run1(OpKind::Where, &[], &[&c, &x, &y], ty(DType::I4, &[3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![-8, 0, 1]);

    let x = t(&[4], &[-2f32, 0.5, 3., NAN]);
    let lo = Tensor::scalar(0f32);
    let hi = Tensor::scalar(1f32);
    let r = run(OpKind::Clip, &[], &[Some(&x), Some(&lo), Some(&hi)], &[ty(DType::F32, &[4])]).unwrap();
    same(&r[0].to_f64_vec(), &[0., 0.5, 1., f64::NAN]);
    let r = run(OpKind::Clip, &[], &[Some(&x), None, Some(&hi)], &[ty(DType::F32, &[4])]).unwrap();
    same(&r[0].to_f64_vec(), &[-2., 0.5, 1., f64::NAN]);
    let r = run(OpKind::Clip, &[], &[Some(&x)], &[ty(DType::F32, &[4])]).unwrap();
    same(&r[0].to_f64_vec(), &[-2., 0.5, 3., f64::NAN]);
    // min > max: everything becomes max (numpy's clip).
    let r = run(OpKind::Clip, &[], &[Some(&x), Some(&hi), Some(&lo)], &[ty(DType::F32, &[4])]).unwrap();
    same(&r[0].to_f64_vec(), &[0., 0., 0., f64::NAN]);
    let xi = ti(DType::I32, &[3], &[-5, 5, 50]);
    let lo = ti(DType::I32, &[], &[0]);
    let hi = ti(DType::I32, &[], &[10]);
    let r = run(OpKind::Clip, &[], &[Some(&xi), Some(&lo), Some(&hi)], &[ty(DType::I32, &[3])]).unwrap();
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![0, 5, 10]);
}

#[test]
fn rounding_ops() {
    let x = t(&[8], &[0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999998, 3.7]);
    let r = run1(OpKind::Round, &[], &[&x], ty(DType::F32, &[8]));
    same(&r.to_f64_vec(), &[0., 2., 2., -0., -2., -2., 2., 4.]);
    assert!(r.to_vec::<f32>().unwrap()[3].is_sign_negative());
    let r = run1(OpKind::Ceil, &[], &[&x], ty(DType::F32, &[8]));
    same(&r.to_f64_vec(), &[1., 2., 3., -0., -1., -2., 3., 4.]);
    let r = run1(OpKind::Floor, &[], &[&x], ty(DType::F32, &[8]));
    same(&r.to_f64_vec(), &[0., 1., 2., -1., -2., -3., 2., 3.]);
}

#[test]
fn signed_unary_ops() {
    let x = t(&[4], &[-2f32, 0., 3., NAN]);
    same(&run1(OpKind::Sign, &[], &[&x], ty(DType::F32, &[4])).to_f64_vec(), &[-1., 0., 1., f64::NAN]);
    same(&run1(OpKind::Abs, &[], &[&x], ty(DType::F32, &[4])).to_f64_vec(), &[2., 0., 3., f64::NAN]);
    same(&run1(OpKind::Neg, &[], &[&x], ty(DType::F32, &[4])).to_f64_vec(), &[2., -0., -3., f64::NAN]);
    same(&run1(OpKind::Relu, &[], &[&x], ty(DType::F32, &[4])).to_f64_vec(), &[0., 0., 3., f64::NAN]);
    let i = ti(DType::I8, &[3], &[-128, -3, 7]);
    assert_eq!(run1(OpKind::Abs, &[], &[&i], ty(DType::I8, &[3])).to_i64_vec().unwrap(), vec![-128, 3, 7]);
    assert_eq!(run1(OpKind::Neg, &[], &[&i], ty(DType::I8, &[3])).to_i64_vec().unwrap(), vec![-128, 3, -7]);
    assert_eq!(run1(OpKind::Sign, &[], &[&i], ty(DType::I8, &[3])).to_i64_vec().unwrap(), vec![-1, -1, 1]);
    assert_eq!(run1(OpKind::Relu, &[], &[&i], ty(DType::I8, &[3])).to_i64_vec().unwrap(), vec![0, 0, 7]);
    let u = t(&[2], &[u64::MAX, 0]);
    assert_eq!(run1(OpKind::Sign, &[], &[&u], ty(DType::U64, &[2])).to_vec::<u64>().unwrap(), vec![1, 0]);
    assert_eq!(run1(OpKind::Abs, &[], &[&u], ty(DType::U64, &[2])).to_vec::<u64>().unwrap(), vec![u64::MAX, 0]);
    assert_eq!(run1(OpKind::Relu, &[], &[&u], ty(DType::U64, &[2])).to_vec::<u64>().unwrap(), vec![u64::MAX, 0]);
    // Float-only ops reject integers.
    assert!(run(OpKind::Sqrt, &[], &[Some(&i)], &[ty(DType::I8, &[3])]).is_err());
}

#[test]
fn math_functions() {
    let e = std::f64::consts::E;
    let cases: Vec<(OpKind, f32, f64)> = vec![
        (OpKind::Exp, 1.0, e),
        (OpKind::Log, e as f32, (e as f32 as f64).ln()),
        (OpKind::Sqrt, 2.0, 2f64.sqrt()),
        (OpKind::Reciprocal, 4.0, 0.25),
        (OpKind::Sin, 0.0, 0.0),
        (OpKind::Cos, 0.0, 1.0),
        (OpKind::Tan, 0.0, 0.0),
        (OpKind::Atanh, 0.5, 0.5493061443340549),
        (OpKind::Asinh, 1.0, 0.881373587019543),
        (OpKind::Acosh, 1.0, 0.0),
        (OpKind::Asin, 1.0, std::f64::consts::FRAC_PI_2),
        (OpKind::Acos, -1.0, std::f64::consts::PI),
        (OpKind::Atan, 1.0, std::f64::consts::FRAC_PI_4),
        (OpKind::Sinh, 0.0, 0.0),
        (OpKind::Cosh, 0.0, 1.0),
        (OpKind::Tanh, 0.0, 0.0),
        (OpKind::Erf, 1.0, 0.8427007929497149),
        (OpKind::Erf, -0.5, -0.5204998778130465),
    ];
    for (k, x, want) in cases {
        let r = run1(k, &[], &[&t(&[1], &[x])], ty(DType::F32, &[1]));
        // One rounding of the exact value to f32.
        same(&r.to_f64_vec(), &[want as f32 as f64]);
    }
    let r = run1(OpKind::Log, &[], &[&t(&[2], &[0f32, -1.])], ty(DType::F32, &[2]));
    same(&r.to_f64_vec(), &[f64::NEG_INFINITY, f64::NAN]);
    // f64 operands keep f64 precision.
    let r = run1(OpKind::Erf, &[], &[&t(&[1], &[2f64])], ty(DType::F64, &[1]));
    close(&r.to_f64_vec(), &[0.9953222650189527], 1e-15);
}

#[test]
fn activations() {
    let x = t(&[3], &[-1000f32, 0., 1000.]);
    same(&run1(OpKind::Sigmoid, &[], &[&x], ty(DType::F32, &[3])).to_f64_vec(), &[0., 0.5, 1.]);
    same(
        &run1(OpKind::Softplus, &[], &[&x], ty(DType::F32, &[3])).to_f64_vec(),
        &f32s(&[0., std::f64::consts::LN_2, 1000.]),
    );
    same(&run1(OpKind::Softsign, &[], &[&t(&[2], &[1f32, -3.])], ty(DType::F32, &[2])).to_f64_vec(), &[0.5, -0.75]);

    let x = t(&[3], &[-1f32, 0., 2.]);
    let r = run1(OpKind::LeakyRelu, &[], &[&x], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &[-0.01f32 as f64, 0., 2.]);
    let r = run1(OpKind::LeakyRelu, &[("alpha", float(0.5))], &[&x], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &[-0.5, 0., 2.]);
    let em1 = (-1f64).exp() - 1.0;
    let r = run1(OpKind::Elu, &[], &[&x], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &f32s(&[em1, 0., 2.]));
    let r = run1(OpKind::Celu, &[("alpha", float(2.0))], &[&t(&[3], &[-2f32, 3., NAN])], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &f32s(&[2.0 * em1, 3., f64::NAN]));
    let r = run1(OpKind::Selu, &[], &[&x], ty(DType::F32, &[3]));
    close(&r.to_f64_vec(), &[-1.1113307412864784, 0., 2.0 * 1.0507010221481323], 1e-7);
    let x = t(&[3], &[-10f32, 0., 10.]);
    same(&run1(OpKind::HardSigmoid, &[], &[&x], ty(DType::F32, &[3])).to_f64_vec(), &[0., 0.5, 1.]);
    let x = t(&[4], &[-3f32, 1., 3., 4.]);
    same(&run1(OpKind::HardSwish, &[], &[&x], ty(DType::F32, &[4])).to_f64_vec(), &f32s(&[0., 2. / 3., 3., 4.]));
    let x = t(&[3], &[0.5f32, 1., 2.]);
    same(&run1(OpKind::ThresholdedRelu, &[], &[&x], ty(DType::F32, &[3])).to_f64_vec(), &[0., 0., 2.]);
    let x = t(&[2], &[0f32, 1.]);
    same(&run1(OpKind::Mish, &[], &[&x], ty(DType::F32, &[2])).to_f64_vec(), &f32s(&[0., 0.8650983882673103]));

    // Gelu, exact and tanh forms; the far tail is computed without cancellation.
    let x = t(&[3], &[1f64, -10., 0.]);
    let r = run1(OpKind::Gelu, &[], &[&x], ty(DType::F64, &[3]));
    close(&r.to_f64_vec(), &[0.8413447460685429, -7.619853024160593e-23, 0.], 1e-12);
    let r = run1(OpKind::Gelu, &[("approximate", Attr::String("tanh".into()))], &[&x], ty(DType::F64, &[3]));
    close(&r.to_f64_vec()[..1], &[0.8411919906082768], 1e-12);
    let bad = [("approximate", Attr::String("fast".into()))];
    assert!(run(OpKind::Gelu, &bad, &[Some(&x)], &[ty(DType::F64, &[3])]).is_err());

    // Shrink on floats and integers.
    let x = t(&[4], &[-1f32, -0.3, 0.3, 1.]);
    let r = run1(OpKind::Shrink, &[("bias", float(0.25))], &[&x], ty(DType::F32, &[4]));
    same(&r.to_f64_vec(), &[-0.75, 0., 0., 0.75]);
    let x = ti(DType::I32, &[4], &[-3, -1, 0, 2]);
    let r = run1(OpKind::Shrink, &[("bias", float(1.0)), ("lambd", float(1.5))], &[&x], ty(DType::I32, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![-2, 0, 0, 1]);

    // PRelu with a broadcast slope.
    let x = t(&[2, 2], &[-1f32, 2., -3., 4.]);
    let s = t(&[2], &[0.5f32, 0.25]);
    let r = run1(OpKind::PRelu, &[], &[&x, &s], ty(DType::F32, &[2, 2]));
    same(&r.to_f64_vec(), &[-0.5, 2., -1.5, 4.]);

    let x = t(&[4], &[f32::INFINITY, f32::NEG_INFINITY, 1., NAN]);
    let r = run1(OpKind::IsInf, &[("detect_negative", int(0))], &[&x], ty(DType::Bool, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, 0, 0, 0]);
    let r = run1(OpKind::IsInf, &[], &[&x], ty(DType::Bool, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, 1, 0, 0]);
    let r = run1(OpKind::IsNaN, &[], &[&x], ty(DType::Bool, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![0, 0, 0, 1]);
}

#[test]
fn cast_float_to_int_saturates() {
    let x = t(&[5], &[1.9f32, -1.9, 3e10, -3e10, NAN]);
    let r = run1(OpKind::Cast, &[("to", int(6))], &[&x], ty(DType::I32, &[5]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, -1, i32::MAX as i64, i32::MIN as i64, 0]);
    let x = t(&[3], &[-1f32, 300., 255.9]);
    let r = run1(OpKind::Cast, &[("to", int(2))], &[&x], ty(DType::U8, &[3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![0, 255, 255]);
    let x = t(&[3], &[1e19f32, -1., 2e19]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::U64, &[3]));
    assert_eq!(r.to_vec::<u64>().unwrap(), vec![1e19f32 as u64, 0, u64::MAX]);
    let x = t(&[3], &[7.9f32, -9., 3.]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::I4, &[3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![7, -8, 3]);
    // `to` must agree with the result type.
    assert!(run(OpKind::Cast, &[("to", int(7))], &[Some(&x)], &[ty(DType::I4, &[3])]).is_err());
}

#[test]
fn cast_int_to_int_wraps_and_to_float_rounds_once() {
    let x = ti(DType::I32, &[2], &[300, -129]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::I8, &[2]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![44, 127]);
    // i64 → f32 directly rounded; 2^60 + 2^36 + 1 would round to 2^60 through f64.
    let v = [16777217i64, 16777219, (1 << 60) + (1 << 36) + 1, -((1 << 60) + (1 << 36) + 1)];
    let x = ti(DType::I64, &[4], &v);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::F32, &[4]));
    let want: Vec<f32> = v.iter().map(|&i| i as f32).collect();
    assert_eq!(r.to_vec::<f32>().unwrap(), want);
    assert_eq!(want[2], ((1u64 << 60) + (1 << 37)) as f32);
    // i64 → f16: ties to even, overflow to inf.
    let x = ti(DType::I64, &[4], &[2049, 2051, 65519, 65520]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::F16, &[4]));
    same(&r.to_f64_vec(), &[2048., 2052., 65504., f64::INFINITY]);
    // u64 → f32 / f64 read as unsigned.
    let x = t(&[1], &[u64::MAX]);
    same(&run1(OpKind::Cast, &[], &[&x], ty(DType::F32, &[1])).to_f64_vec(), &[2f64.powi(64)]);
    same(&run1(OpKind::Cast, &[], &[&x], ty(DType::F64, &[1])).to_f64_vec(), &[2f64.powi(64)]);
}

#[test]
fn cast_between_floats_rounds_once() {
    // 1 + 2^-11 + 2^-40: just above the f16 tie → rounds up (through f32 it would tie to 1).
    let x = t(&[2], &[1.0 + 2f64.powi(-11) + 2f64.powi(-40), 1.0 + 2f64.powi(-11)]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::F16, &[2]));
    assert_eq!(r.to_vec::<f16>().unwrap(), vec![f16::from_bits(0x3C01), f16::from_bits(0x3C00)]);
    let x = t(&[2], &[1.0 + 2f64.powi(-8) + 2f64.powi(-40), 1.0 + 2f64.powi(-8)]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::BF16, &[2]));
    assert_eq!(r.to_vec::<bf16>().unwrap(), vec![bf16::from_bits(0x3F81), bf16::from_bits(0x3F80)]);
    let x = t(&[3], &[f16::from_f32(1.5), f16::NEG_INFINITY, f16::NAN]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &[1.5, f64::NEG_INFINITY, f64::NAN]);
}

#[test]
fn cast_bool() {
    let x = t(&[4], &[0f32, -0., 2., NAN]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::Bool, &[4]));
    assert_eq!(r.to_vec::<bool>().unwrap(), vec![false, false, true, true]);
    let b = t(&[2], &[true, false]);
    same(&run1(OpKind::Cast, &[], &[&b], ty(DType::F32, &[2])).to_f64_vec(), &[1., 0.]);
    let i = ti(DType::I32, &[3], &[0, 5, -1]);
    let r = run1(OpKind::Cast, &[], &[&i], ty(DType::Bool, &[3]));
    assert_eq!(r.to_vec::<bool>().unwrap(), vec![false, true, true]);
    // CastLike takes the dtype of its second operand.
    let like = t(&[1], &[0i64]);
    let r = run1(OpKind::CastLike, &[], &[&x, &like], ty(DType::I64, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![0, 0, 2, 0]);
}

#[test]
fn identity_and_dropout() {
    let x = ti(DType::U4, &[3], &[1, 15, 7]);
    let r = run1(OpKind::Identity, &[], &[&x], ty(DType::U4, &[3]));
    assert_eq!(r, x);
    let x = t(&[2], &[1f32, 2.]);
    let r = run(OpKind::Dropout, &[], &[Some(&x)], &[ty(DType::F32, &[2]), ty(DType::Bool, &[2])]).unwrap();
    assert_eq!(r[0], x);
    assert_eq!(r[1].to_vec::<bool>().unwrap(), vec![true, true]);
    let ratio = Tensor::scalar(0.5f32);
    let train = Tensor::scalar(true);
    let e = run(OpKind::Dropout, &[], &[Some(&x), Some(&ratio), Some(&train)], &[ty(DType::F32, &[2])]);
    assert!(matches!(e, Err(EvalError::Unsupported { .. })));
    let zero = Tensor::scalar(0f32);
    let r = run(OpKind::Dropout, &[], &[Some(&x), Some(&zero), Some(&train)], &[ty(DType::F32, &[2])]).unwrap();
    assert_eq!(r[0], x);
}

#[test]
fn large_add_is_fast() {
    let n = 1 << 22;
    let a = t(&[1024, n / 1024], &vec![1.5f32; n]);
    let b = t(&[n / 1024], &vec![2.0f32; n / 1024]);
    let start = std::time::Instant::now();
    let r = run1(OpKind::Add, &[], &[&a, &b], ty(DType::F32, &[1024, n / 1024]));
    let dt = start.elapsed();
    assert_eq!(r.to_vec::<f32>().unwrap()[n - 1], 3.5);
    eprintln!("4M-element broadcast Add: {dt:?}");
    assert!(dt.as_secs_f64() < 1.0, "4M-element Add took {dt:?}");
}

// ---------------------------------------------------------------------------
// Reductions.
// ---------------------------------------------------------------------------

fn axes(v: &[i64]) -> Tensor {
    ti(DType::I64, &[v.len()], v)
}

#[test]
fn reduce_sum_axes_and_keepdims() {
    let x = t(&[2, 3], &[1f32, 2., 3., 4., 5., 6.]);
    let r = run(OpKind::ReduceSum, &[], &[Some(&x), Some(&axes(&[1]))], &[ty(DType::F32, &[2, 1])]).unwrap();
    same(&r[0].to_f64_vec(), &[6., 15.]);
    let k0 = [("keepdims", int(0))];
    let r = run(OpKind::ReduceSum, &k0, &[Some(&x), Some(&axes(&[-2]))], &[ty(DType::F32, &[3])]).unwrap();
    same(&r[0].to_f64_vec(), &[5., 7., 9.]);
    let r = run(OpKind::ReduceSum, &k0, &[Some(&x)], &[ty(DType::F32, &[])]).unwrap();
    same(&r[0].to_f64_vec(), &[21.]);
    let r = run(OpKind::ReduceSum, &[], &[Some(&x), Some(&axes(&[]))], &[ty(DType::F32, &[1, 1])]).unwrap();
    same(&r[0].to_f64_vec(), &[21.]);
    // noop_with_empty_axes: each element reduced alone.
    let noop = [("noop_with_empty_axes", int(1))];
    let r = run(OpKind::ReduceSum, &noop, &[Some(&x), Some(&axes(&[]))], &[ty(DType::F32, &[2, 3])]).unwrap();
    same(&r[0].to_f64_vec(), &[1., 2., 3., 4., 5., 6.]);
    let r = run(OpKind::ReduceSumSquare, &noop, &[Some(&x)], &[ty(DType::F32, &[2, 3])]).unwrap();
    same(&r[0].to_f64_vec(), &[1., 4., 9., 16., 25., 36.]);
    // Wrong result shape, duplicate or out-of-range axes.
    assert!(run(OpKind::ReduceSum, &[], &[Some(&x), Some(&axes(&[1]))], &[ty(DType::F32, &[2])]).is_err());
    assert!(run(OpKind::ReduceSum, &[], &[Some(&x), Some(&axes(&[1, -1]))], &[ty(DType::F32, &[2, 1])]).is_err());
    assert!(run(OpKind::ReduceSum, &[], &[Some(&x), Some(&axes(&[2]))], &[ty(DType::F32, &[2, 1])]).is_err());
}

#[test]
fn reduce_kinds() {
    let x = t(&[2, 2], &[-3f32, 4., 1., 2.]);
    let a1 = axes(&[1]);
    let red = |k: OpKind| run(k, &[], &[Some(&x), Some(&a1)], &[ty(DType::F32, &[2, 1])]).unwrap()[0].to_f64_vec();
    same(&red(OpKind::ReduceL1), &[7., 3.]);
    same(&red(OpKind::ReduceL2), &f32s(&[5., 5f64.sqrt()]));
    same(&red(OpKind::ReduceSumSquare), &[25., 5.]);
    same(&red(OpKind::ReduceMean), &[0.5, 1.5]);
    same(&red(OpKind::ReduceProd), &[-12., 2.]);
    same(&red(OpKind::ReduceMax), &[4., 2.]);
    same(&red(OpKind::ReduceMin), &[-3., 1.]);
    let y = t(&[2], &[1f32, (std::f64::consts::E - 1.0) as f32]);
    let r = run(OpKind::ReduceLogSum, &[("keepdims", int(0))], &[Some(&y)], &[ty(DType::F32, &[])]).unwrap();
    close(&r[0].to_f64_vec(), &[1.0], 1e-6);
    // LogSumExp is stable for large values.
    let z = t(&[2], &[1000f32, 1000.]);
    let r = run(OpKind::ReduceLogSumExp, &[("keepdims", int(0))], &[Some(&z)], &[ty(DType::F32, &[])]).unwrap();
    same(&r[0].to_f64_vec(), &f32s(&[1000.0 + std::f64::consts::LN_2]));
    // NaN propagates through Max/Min.
    let n = t(&[3], &[1f32, NAN, 2.]);
    let r = run(OpKind::ReduceMax, &[("keepdims", int(0))], &[Some(&n)], &[ty(DType::F32, &[])]).unwrap();
    same(&r[0].to_f64_vec(), &[f64::NAN]);
    let r = run(OpKind::ReduceMin, &[("keepdims", int(0))], &[Some(&n)], &[ty(DType::F32, &[])]).unwrap();
    same(&r[0].to_f64_vec(), &[f64::NAN]);
}

#[test]
fn reduce_integers() {
    let x = ti(DType::I32, &[2, 2], &[1, 2, -3, -4]);
    let a1 = axes(&[1]);
    let red =
        |k: OpKind| run(k, &[], &[Some(&x), Some(&a1)], &[ty(DType::I32, &[2, 1])]).unwrap()[0].to_i64_vec().unwrap();
    assert_eq!(red(OpKind::ReduceMean), vec![1, -3]);
    assert_eq!(red(OpKind::ReduceSum), vec![3, -7]);
    assert_eq!(red(OpKind::ReduceL1), vec![3, 7]);
    assert_eq!(red(OpKind::ReduceL2), vec![2, 5]); // sqrt(5) → 2, sqrt(25) → 5
    assert_eq!(red(OpKind::ReduceMax), vec![2, -3]);
    let u = t(&[2], &[u64::MAX, 1]);
    let r = run(OpKind::ReduceMax, &[("keepdims", int(0))], &[Some(&u)], &[ty(DType::U64, &[])]).unwrap();
    assert_eq!(r[0].to_vec::<u64>().unwrap(), vec![u64::MAX]);
    let r = run(OpKind::ReduceMin, &[("keepdims", int(0))], &[Some(&u)], &[ty(DType::U64, &[])]).unwrap();
    assert_eq!(r[0].to_vec::<u64>().unwrap(), vec![1]);
    let b = t(&[3], &[false, true, false]);
    let r = run(OpKind::ReduceMax, &[("keepdims", int(0))], &[Some(&b)], &[ty(DType::Bool, &[])]).unwrap();
    assert_eq!(r[0].to_vec::<bool>().unwrap(), vec![true]);
}

#[test]
fn empty_reductions() {
    let x = t::<f32>(&[2, 0], &[]);
    let a1 = axes(&[1]);
    let red = |k: OpKind| run(k, &[], &[Some(&x), Some(&a1)], &[ty(DType::F32, &[2, 1])]).unwrap()[0].to_f64_vec();
    same(&red(OpKind::ReduceSum), &[0., 0.]);
    same(&red(OpKind::ReduceProd), &[1., 1.]);
    same(&red(OpKind::ReduceMax), &[f64::NEG_INFINITY; 2]);
    same(&red(OpKind::ReduceMin), &[f64::INFINITY; 2]);
    same(&red(OpKind::ReduceLogSumExp), &[f64::NEG_INFINITY; 2]);
    same(&red(OpKind::ReduceLogSum), &[f64::NEG_INFINITY; 2]);
    same(&red(OpKind::ReduceL2), &[0., 0.]);
    let xi = ti(DType::I32, &[2, 0], &[]);
    let redi =
        |k: OpKind| run(k, &[], &[Some(&xi), Some(&a1)], &[ty(DType::I32, &[2, 1])]).unwrap()[0].to_i64_vec().unwrap();
    assert_eq!(redi(OpKind::ReduceMax), vec![i32::MIN as i64; 2]);
    assert_eq!(redi(OpKind::ReduceMin), vec![i32::MAX as i64; 2]);
    assert_eq!(redi(OpKind::ReduceProd), vec![1, 1]);
    // Reducing the non-empty axis of an empty tensor gives an empty result.
    let r = run(OpKind::ReduceSum, &[], &[Some(&x), Some(&axes(&[0]))], &[ty(DType::F32, &[1, 0])]).unwrap();
    assert_eq!(r[0].numel(), 0);
}

#[test]
fn argmax_argmin() {
    let x = t(&[2, 3], &[1f32, 3., 3., NAN, 2., NAN]);
    let r = run1(OpKind::ArgMax, &[("axis", int(1))], &[&x], ty(DType::I64, &[2, 1]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, 0]);
    let last = [("axis", int(-1)), ("select_last_index", int(1)), ("keepdims", int(0))];
    let r = run1(OpKind::ArgMax, &last, &[&x], ty(DType::I64, &[2]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, 2]);
    let y = t(&[2, 3], &[1f32, 3., 1., 2., NAN, 0.]);
    let r = run1(OpKind::ArgMin, &[("axis", int(1))], &[&y], ty(DType::I64, &[2, 1]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![0, 1]);
    let r = run1(OpKind::ArgMin, &[("axis", int(1)), ("select_last_index", int(1))], &[&y], ty(DType::I64, &[2, 1]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, 1]);
    // Default axis 0.
    let r = run1(OpKind::ArgMax, &[], &[&y], ty(DType::I64, &[1, 3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, 1, 0]);
    let u = t(&[3], &[1u64, u64::MAX, 5]);
    assert_eq!(run1(OpKind::ArgMax, &[], &[&u], ty(DType::I64, &[1])).to_i64_vec().unwrap(), vec![1]);
    assert_eq!(run1(OpKind::ArgMin, &[], &[&u], ty(DType::I64, &[1])).to_i64_vec().unwrap(), vec![0]);
    let e = t::<f32>(&[0], &[]);
    assert!(run(OpKind::ArgMax, &[], &[Some(&e)], &[ty(DType::I64, &[1])]).is_err());
}

#[test]
fn cumsum() {
    let x = t(&[4], &[1f32, 2., 3., 4.]);
    let ax = Tensor::scalar(0i32);
    let cs = |attrs: &[(&str, Attr)]| run1(OpKind::CumSum, attrs, &[&x, &ax], ty(DType::F32, &[4])).to_f64_vec();
    same(&cs(&[]), &[1., 3., 6., 10.]);
    same(&cs(&[("exclusive", int(1))]), &[0., 1., 3., 6.]);
    same(&cs(&[("reverse", int(1))]), &[10., 9., 7., 4.]);
    same(&cs(&[("exclusive", int(1)), ("reverse", int(1))]), &[9., 7., 4., 0.]);
    let m = ti(DType::I64, &[2, 3], &[1, 2, 3, 4, 5, 6]);
    let ax = t(&[1], &[-1i64]);
    let r = run1(OpKind::CumSum, &[], &[&m, &ax], ty(DType::I64, &[2, 3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![1, 3, 6, 4, 9, 15]);
    let ax = Tensor::scalar(0i64);
    let r = run1(OpKind::CumSum, &[("reverse", int(1))], &[&m, &ax], ty(DType::I64, &[2, 3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![5, 7, 9, 4, 5, 6]);
}

#[test]
fn softmax_family() {
    let want = [0.09003057317038046, 0.24472847105479767, 0.6652409557748219];
    let x = t(&[1, 3], &[1f32, 2., 3.]);
    let r = run1(OpKind::Softmax, &[], &[&x], ty(DType::F32, &[1, 3]));
    same(&r.to_f64_vec(), &f32s(&want));
    // Large values: stable.
    let big = t(&[1, 3], &[1000f32, 1001., 1002.]);
    let r = run1(OpKind::Softmax, &[], &[&big], ty(DType::F32, &[1, 3]));
    same(&r.to_f64_vec(), &f32s(&want));
    let r = run1(OpKind::LogSoftmax, &[], &[&big], ty(DType::F32, &[1, 3]));
    close(&r.to_f64_vec(), &f32s(&[-2.40760596444438, -1.4076059644443801, -0.40760596444438013]), 1e-7);
    // Along axis 0 (not the flattened 2-D form of opset < 13).
    let y = t(&[2, 2], &[0f32, 5., 0., 5.]);
    let r = run1(OpKind::Softmax, &[("axis", int(0))], &[&y], ty(DType::F32, &[2, 2]));
    same(&r.to_f64_vec(), &[0.5, 0.5, 0.5, 0.5]);
    let h = t(&[2, 3], &[1f32, 3., 3., 2., 1., 0.]);
    let r = run1(OpKind::Hardmax, &[], &[&h], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[0., 1., 0., 1., 0., 0.]);
    let r = run1(OpKind::Hardmax, &[("axis", int(0))], &[&h], ty(DType::F32, &[2, 3]));
    same(&r.to_f64_vec(), &[0., 1., 1., 1., 0., 0.]);
}

#[test]
fn topk() {
    let x = t(&[6], &[1f32, 3., 2., 3., NAN, 0.]);
    let k3 = t(&[1], &[3i64]);
    let outs = [ty(DType::F32, &[3]), ty(DType::I64, &[3])];
    let r = run(OpKind::TopK, &[], &[Some(&x), Some(&k3)], &outs).unwrap();
    same(&r[0].to_f64_vec(), &[f64::NAN, 3., 3.]);
    assert_eq!(r[1].to_i64_vec().unwrap(), vec![4, 1, 3]);
    let k2 = t(&[1], &[2i64]);
    let outs = [ty(DType::F32, &[2]), ty(DType::I64, &[2])];
    let r = run(OpKind::TopK, &[("largest", int(0))], &[Some(&x), Some(&k2)], &outs).unwrap();
    same(&r[0].to_f64_vec(), &[0., 1.]);
    assert_eq!(r[1].to_i64_vec().unwrap(), vec![5, 0]);
    // Along axis 0 of a matrix, integers.
    let m = ti(DType::I32, &[3, 2], &[5, 1, 7, 1, 6, 9]);
    let outs = [ty(DType::I32, &[2, 2]), ty(DType::I64, &[2, 2])];
    let r = run(OpKind::TopK, &[("axis", int(0))], &[Some(&m), Some(&k2)], &outs).unwrap();
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![7, 9, 6, 1]);
    assert_eq!(r[1].to_i64_vec().unwrap(), vec![1, 2, 2, 0]);
    let k9 = t(&[1], &[9i64]);
    assert!(run(OpKind::TopK, &[], &[Some(&x), Some(&k9)], &[ty(DType::F32, &[9]), ty(DType::I64, &[9])]).is_err());
}

// ---------------------------------------------------------------------------
// Normalisations.
// ---------------------------------------------------------------------------

#[test]
fn batch_norm() {
    let x = t(&[1, 2, 1, 2], &[1f32, 2., 3., 4.]);
    let scale = t(&[2], &[1f32, 2.]);
    let b = t(&[2], &[0f32, 1.]);
    let mean = t(&[2], &[1.5f32, 3.]);
    let var = t(&[2], &[0.25f32, 1.]);
    let r = run1(
        OpKind::BatchNormalization,
        &[("epsilon", float(0.0))],
        &[&x, &scale, &b, &mean, &var],
        ty(DType::F32, &[1, 2, 1, 2]),
    );
    same(&r.to_f64_vec(), &[-1., 1., 1., 3.]);
    let tm = [("training_mode", int(1))];
    let ins = [Some(&x), Some(&scale), Some(&b), Some(&mean), Some(&var)];
    assert!(run(OpKind::BatchNormalization, &tm, &ins, &[ty(DType::F32, &[1, 2, 1, 2])]).is_err());
}

#[test]
fn instance_norm() {
    let x = t(&[1, 1, 4], &[1f32, 2., 3., 4.]);
    let s = t(&[1], &[2f32]);
    let b = t(&[1], &[1f32]);
    let r = run1(OpKind::InstanceNormalization, &[("epsilon", float(0.0))], &[&x, &s, &b], ty(DType::F32, &[1, 1, 4]));
    let want: Vec<f64> = [1., 2., 3., 4.].iter().map(|v: &f64| (v - 2.5) * 2.0 / 1.25f64.sqrt() + 1.0).collect();
    same(&r.to_f64_vec(), &f32s(&want));
}

#[test]
fn layer_norm() {
    let x = t(&[2, 2], &[1f32, 3., 2., 2.]);
    let s = t(&[2], &[1f32, 2.]);
    let outs = [ty(DType::F32, &[2, 2]), ty(DType::F32, &[2, 1]), ty(DType::F32, &[2, 1])];
    let r = run(OpKind::LayerNormalization, &[], &[Some(&x), Some(&s), None], &outs).unwrap();
    let e = 1e-5f32 as f64;
    let i0 = 1.0 / (1.0 + e).sqrt();
    let i1 = 1.0 / e.sqrt();
    same(&r[0].to_f64_vec(), &f32s(&[-i0, 2.0 * i0, 0., 0.]));
    same(&r[1].to_f64_vec(), &[2., 2.]);
    same(&r[2].to_f64_vec(), &f32s(&[i0, i1]));
    // axis = 1 of a rank-3 input, with bias; only Y requested.
    let x = t(&[1, 2, 2], &[0f32, 2., 4., 6.]);
    let s = t(&[2, 2], &[1f32, 1., 1., 1.]);
    let b = t(&[2, 2], &[10f32, 10., 10., 10.]);
    let r = run(
        OpKind::LayerNormalization,
        &[("axis", int(1)), ("epsilon", float(0.0))],
        &[Some(&x), Some(&s), Some(&b)],
        &[ty(DType::F32, &[1, 2, 2])],
    )
    .unwrap();
    // mean 3, variance 5.
    let want: Vec<f64> = [0., 2., 4., 6.].iter().map(|v: &f64| (v - 3.0) / 5f64.sqrt() + 10.0).collect();
    same(&r[0].to_f64_vec(), &f32s(&want));
}

#[test]
fn group_norm() {
    let x = t(&[1, 4, 1], &[1f32, 3., 5., 7.]);
    let s = t(&[4], &[1f32, 1., 2., 2.]);
    let b = t(&[4], &[0f32, 0., 1., 1.]);
    let a = [("num_groups", int(2)), ("epsilon", float(0.0))];
    let r = run1(OpKind::GroupNormalization, &a, &[&x, &s, &b], ty(DType::F32, &[1, 4, 1]));
    same(&r.to_f64_vec(), &[-1., 1., -1., 3.]);
    for g in [3, 8, 0, -2] {
        let bad = [("num_groups", int(g))];
        assert!(run(OpKind::GroupNormalization, &bad, &[Some(&x), Some(&s), Some(&b)], &[ty(DType::F32, &[1, 4, 1])])
            .is_err());
    }
}

#[test]
fn lp_norm() {
    let x = t(&[3, 2], &[3f32, 4., -1., 3., 0., 0.]);
    let r = run1(OpKind::LpNormalization, &[], &[&x], ty(DType::F32, &[3, 2]));
    same(&r.to_f64_vec(), &f32s(&[0.6, 0.8, -1.0 / 10f64.sqrt(), 3.0 / 10f64.sqrt(), 0., 0.]));
    let r = run1(OpKind::LpNormalization, &[("p", int(1))], &[&x], ty(DType::F32, &[3, 2]));
    same(&r.to_f64_vec(), &f32s(&[3. / 7., 4. / 7., -0.25, 0.75, 0., 0.]));
    let r = run1(OpKind::LpNormalization, &[("axis", int(0)), ("p", int(1))], &[&x], ty(DType::F32, &[3, 2]));
    same(&r.to_f64_vec(), &f32s(&[0.75, 4. / 7., -0.25, 3. / 7., 0., 0.]));
}

#[test]
fn lrn() {
    let x = t(&[1, 3, 1, 1], &[1f32, 2., 3.]);
    let a = [("size", int(3)), ("alpha", float(3.0)), ("beta", float(1.0)), ("bias", float(1.0))];
    let r = run1(OpKind::LRN, &a, &[&x], ty(DType::F32, &[1, 3, 1, 1]));
    same(&r.to_f64_vec(), &f32s(&[1. / 6., 2. / 15., 3. / 14.]));
    // Even size: one channel below, ceil((2-1)/2) = 1 above → window [c, c+1].
    let a = [("size", int(2)), ("alpha", float(2.0)), ("beta", float(1.0)), ("bias", float(1.0))];
    let r = run1(OpKind::LRN, &a, &[&x], ty(DType::F32, &[1, 3, 1, 1]));
    same(&r.to_f64_vec(), &f32s(&[1. / 6., 2. / 14., 3. / 10.]));
}

#[test]
fn mean_variance_normalization() {
    let x = t(&[2, 1, 1, 2], &[1f32, 3., 5., 7.]);
    let r = run1(OpKind::MeanVarianceNormalization, &[], &[&x], ty(DType::F32, &[2, 1, 1, 2]));
    let sd = 5f64.sqrt() + 1e-9f32 as f64;
    same(&r.to_f64_vec(), &f32s(&[-3. / sd, -1. / sd, 1. / sd, 3. / sd]));
    let r =
        run1(OpKind::MeanVarianceNormalization, &[("axes", Attr::Ints(vec![3]))], &[&x], ty(DType::F32, &[2, 1, 1, 2]));
    let sd = 1.0 + 1e-9f32 as f64;
    same(&r.to_f64_vec(), &f32s(&[-1. / sd, 1. / sd, -1. / sd, 1. / sd]));
}

// ---------------------------------------------------------------------------
// Quantisation.
// ---------------------------------------------------------------------------

#[test]
fn quantize_per_tensor() {
    // The ONNX documentation example.
    let x = t(&[6], &[0f32, 2., 3., 1000., -254., -1000.]);
    let s = Tensor::scalar(2f32);
    let z = Tensor::scalar(128u8);
    let r = run1(OpKind::QuantizeLinear, &[], &[&x, &s, &z], ty(DType::U8, &[6]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![128, 129, 130, 255, 1, 0]);
    // Half to even, then zero point, then saturation.
    let x = t(&[6], &[0.5f32, 1.5, 2.5, -0.5, 200., -300.]);
    let s = Tensor::scalar(1f32);
    let r = run1(OpKind::QuantizeLinear, &[], &[&x, &s, &z], ty(DType::U8, &[6]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![128, 130, 130, 128, 255, 0]);
    // Without a zero point (u8 result).
    let r = run(OpKind::QuantizeLinear, &[], &[Some(&x), Some(&s), None], &[ty(DType::U8, &[6])]).unwrap();
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![0, 2, 2, 0, 200, 0]);
    let z8 = Tensor::scalar(0i8);
    let s2 = Tensor::scalar(2f32);
    let x = t(&[4], &[3f32, 5., -3., 300.]);
    let r = run1(OpKind::QuantizeLinear, &[], &[&x, &s2, &z8], ty(DType::I8, &[4]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, 2, -2, 127]);
    // 4- and 16-bit results.
    let x = t(&[3], &[-10f32, 7.5, 3.4]);
    let z4 = ti(DType::I4, &[], &[0]);
    let r = run1(OpKind::QuantizeLinear, &[], &[&x, &s, &z4], ty(DType::I4, &[3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![-8, 7, 3]);
    let zu4 = ti(DType::U4, &[], &[2]);
    let r = run1(OpKind::QuantizeLinear, &[], &[&x, &s, &zu4], ty(DType::U4, &[3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![0, 10, 5]);
    let z16 = Tensor::scalar(-5i16);
    let x = t(&[2], &[1e6f32, -40000.]);
    let r = run1(OpKind::QuantizeLinear, &[], &[&x, &s, &z16], ty(DType::I16, &[2]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![32767, -32768]);
    // Zero point of the wrong dtype.
    assert!(run(OpKind::QuantizeLinear, &[], &[Some(&x), Some(&s), Some(&z)], &[ty(DType::I8, &[2])]).is_err());
}

#[test]
fn quantize_per_axis_and_blocked() {
    let x = t(&[2, 3], &[2f32, 4., 8., 1., 1., 1.]);
    let s = t(&[3], &[1f32, 2., 4.]);
    let r = run(OpKind::QuantizeLinear, &[], &[Some(&x), Some(&s), None], &[ty(DType::U8, &[2, 3])]).unwrap();
    // 0.5 → 0 and 0.25 → 0.
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![2, 2, 2, 1, 0, 0]);
    let s0 = t(&[2], &[1f32, 0.5]);
    let z0 = t(&[2], &[0u8, 10]);
    let r = run1(OpKind::QuantizeLinear, &[("axis", int(0))], &[&x, &s0, &z0], ty(DType::U8, &[2, 3]));
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, 4, 8, 12, 12, 12]);
    // Blocked along axis 1 with a remainder block: blocks {0,1} and {2}.
    let x = t(&[2, 3], &[3f32, 4., 20., 1., 2., 3.]);
    let s = t(&[2, 2], &[1f32, 10., 0.5, 1.]);
    let a = [("axis", int(1)), ("block_size", int(2))];
    let r = run(OpKind::QuantizeLinear, &a, &[Some(&x), Some(&s), None], &[ty(DType::U8, &[2, 3])]).unwrap();
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![3, 4, 2, 2, 4, 3]);
    let bad = t(&[2, 3], &[1f32; 6]);
    assert!(run(OpKind::QuantizeLinear, &a, &[Some(&x), Some(&bad), None], &[ty(DType::U8, &[2, 3])]).is_err());
    let bad = t(&[2], &[1f32; 2]);
    assert!(run(OpKind::QuantizeLinear, &[], &[Some(&x), Some(&bad), None], &[ty(DType::U8, &[2, 3])]).is_err());
}

#[test]
fn dequantize() {
    let x = ti(DType::U8, &[3], &[0, 128, 255]);
    let s = Tensor::scalar(0.5f32);
    let z = Tensor::scalar(128u8);
    let r = run1(OpKind::DequantizeLinear, &[], &[&x, &s, &z], ty(DType::F32, &[3]));
    same(&r.to_f64_vec(), &[-64., 0., 63.5]);
    let x = ti(DType::I8, &[2, 2], &[-1, 2, 3, -4]);
    let s = t(&[2], &[2f32, 0.5]);
    let z = ti(DType::I8, &[2], &[1, 0]);
    let r = run1(OpKind::DequantizeLinear, &[("axis", int(0))], &[&x, &s, &z], ty(DType::F32, &[2, 2]));
    same(&r.to_f64_vec(), &[-4., 2., 1.5, -2.]);
    let x = ti(DType::I32, &[2], &[100000, -7]);
    let s = Tensor::scalar(0.25f32);
    let r = run(OpKind::DequantizeLinear, &[], &[Some(&x), Some(&s), None], &[ty(DType::F32, &[2])]).unwrap();
    same(&r[0].to_f64_vec(), &[25000., -1.75]);
    // Blocked, f16 result.
    let x = ti(DType::I4, &[1, 4], &[1, -2, 3, 7]);
    let s = t(&[1, 2], &[f16::from_f32(1.0), f16::from_f32(0.5)]);
    let a = [("axis", int(1)), ("block_size", int(2))];
    let r = run(OpKind::DequantizeLinear, &a, &[Some(&x), Some(&s), None], &[ty(DType::F16, &[1, 4])]).unwrap();
    same(&r[0].to_f64_vec(), &[1., -2., 1.5, 3.5]);
    // Per tensor, spelled two ways exporters use: a one-element scale beside a scalar
    // zero point, and the reverse; each equals the scalar-scalar form.
    let x = ti(DType::U8, &[3], &[0, 128, 255]);
    let forms = [(t(&[1], &[0.5f32]), Tensor::scalar(128u8)), (Tensor::scalar(0.5f32), ti(DType::U8, &[1], &[128]))];
    for (s, z) in forms {
        let r = run1(OpKind::DequantizeLinear, &[], &[&x, &s, &z], ty(DType::F32, &[3]));
        same(&r.to_f64_vec(), &[-64., 0., 63.5]);
    }
    // Two scales are not per tensor: a scalar zero point beside them is an error.
    let (x2, s2, z0) = (ti(DType::U8, &[2], &[0, 1]), t(&[2], &[0.5f32, 1.0]), Tensor::scalar(0u8));
    let ins = [Some(&x2), Some(&s2), Some(&z0)];
    assert!(run(OpKind::DequantizeLinear, &[("axis", int(0))], &ins, &[ty(DType::F32, &[2])]).is_err());
}

#[test]
fn dynamic_quantize() {
    // The ONNX documentation example.
    let x = t(&[6], &[0f32, 2., -3., -2.5, 1.34, 0.5]);
    let outs = [ty(DType::U8, &[6]), ty(DType::F32, &[]), ty(DType::U8, &[])];
    let r = run(OpKind::DynamicQuantizeLinear, &[], &[Some(&x)], &outs).unwrap();
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![153, 255, 0, 26, 221, 179]);
    assert_eq!(r[1].to_vec::<f32>().unwrap(), vec![5f32 / 255f32]);
    assert_eq!(r[2].to_i64_vec().unwrap(), vec![153]);
    // All positive: zero point 0. All zero: scale 1.
    let x = t(&[3], &[1f32, 2., 2.55]);
    let outs3 = [ty(DType::U8, &[3]), ty(DType::F32, &[]), ty(DType::U8, &[])];
    let r = run(OpKind::DynamicQuantizeLinear, &[], &[Some(&x)], &outs3).unwrap();
    assert_eq!(r[2].to_i64_vec().unwrap(), vec![0]);
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![100, 200, 255]);
    let z = t(&[2], &[0f32, 0.]);
    let outs = [ty(DType::U8, &[2]), ty(DType::F32, &[]), ty(DType::U8, &[])];
    let r = run(OpKind::DynamicQuantizeLinear, &[], &[Some(&z)], &outs).unwrap();
    assert_eq!(r[0].to_i64_vec().unwrap(), vec![0, 0]);
    assert_eq!(r[1].to_vec::<f32>().unwrap(), vec![1.0]);
    assert_eq!(r[2].to_i64_vec().unwrap(), vec![0]);
}

// ---------------------------------------------------------------------------
// 8-bit floats (through kiln_ir::lowp).
// ---------------------------------------------------------------------------

fn f8(dt: DType, d: &[usize], codes: &[u8]) -> Tensor {
    Tensor::from_codes(dt, sh(d), codes).unwrap()
}

#[test]
fn cast_to_f8_saturate_and_not() {
    let x = t(&[6], &[1f32, 500., -1000., 0.3, 460., NAN]);
    let r = run1(OpKind::Cast, &[], &[&x], ty(DType::F8E4M3FN, &[6]));
    // 0.3 lies between 0.28125 and 0.3125 (spacing 2^-5 there), nearer the latter.
    same(&r.to_f64_vec(), &[1., 448., -448., 0.3125, 448., f64::NAN]);
    let r = run1(OpKind::Cast, &[("saturate", int(0))], &[&x], ty(DType::F8E4M3FN, &[6]));
    same(&r.to_f64_vec(), &[1., f64::NAN, f64::NAN, 0.3125, 448., f64::NAN]);
    let y = t(&[2], &[1e5f32, -1e5]);
    let r = run1(OpKind::Cast, &[("saturate", int(0))], &[&y], ty(DType::F8E5M2, &[2]));
    same(&r.to_f64_vec(), &[f64::INFINITY, f64::NEG_INFINITY]);
    let r = run1(OpKind::Cast, &[], &[&y], ty(DType::F8E5M2, &[2]));
    same(&r.to_f64_vec(), &[57344., -57344.]);
    // f64 → f8 rounds once: 1.0625 is the tie between 1 and 1.125; a bit far below
    // (lost by a plain f32 rounding) decides upward.
    let z = t(&[2], &[1.0625 + 2f64.powi(-40), 1.0625]);
    let r = run1(OpKind::Cast, &[], &[&z], ty(DType::F8E4M3FN, &[2]));
    same(&r.to_f64_vec(), &[1.125, 1.0]);
    // Integers → f8 and back.
    let i = ti(DType::I64, &[3], &[17, -1_000_000, 3]);
    let r = run1(OpKind::Cast, &[], &[&i], ty(DType::F8E4M3FN, &[3]));
    same(&r.to_f64_vec(), &[16., -448., 3.]);
    let back = run1(OpKind::Cast, &[], &[&r], ty(DType::I32, &[3]));
    assert_eq!(back.to_i64_vec().unwrap(), vec![16, -448, 3]);
}

#[test]
fn f8_arithmetic_rounds_once() {
    // 1.0 = 0x38, 0.0625 = 0x18 in E4M3FN; 1.0625 ties to even (1.0).
    let a = f8(DType::F8E4M3FN, &[2], &[0x38, 0x38]);
    let b = f8(DType::F8E4M3FN, &[2], &[0x18, 0x38]);
    let r = run1(OpKind::Add, &[], &[&a, &b], ty(DType::F8E4M3FN, &[2]));
    same(&r.to_f64_vec(), &[1.0, 2.0]);
    let r = run1(OpKind::Where, &[], &[&t(&[2], &[false, true]), &a, &b], ty(DType::F8E4M3FN, &[2]));
    assert_eq!(r.codes(), vec![0x18, 0x38]);
}

#[test]
fn quantize_dequantize_f8() {
    let x = t(&[3], &[1f32, 2., 1000.]);
    let s = Tensor::scalar(2f32);
    let z = f8(DType::F8E4M3FN, &[], &[0]);
    let r = run1(OpKind::QuantizeLinear, &[], &[&x, &s, &z], ty(DType::F8E4M3FN, &[3]));
    same(&r.to_f64_vec(), &[0.5, 1., 448.]);
    let r = run1(OpKind::QuantizeLinear, &[("saturate", int(0))], &[&x, &s, &z], ty(DType::F8E4M3FN, &[3]));
    same(&r.to_f64_vec(), &[0.5, 1., f64::NAN]);
    // 0x38 = 1, 0x40 = 2, 0x7E = 448.
    let q = f8(DType::F8E4M3FN, &[3], &[0x38, 0x40, 0x7E]);
    let s = Tensor::scalar(0.5f32);
    let r = run(OpKind::DequantizeLinear, &[], &[Some(&q), Some(&s), None], &[ty(DType::F32, &[3])]).unwrap();
    same(&r[0].to_f64_vec(), &[0.5, 1., 224.]);
}
