//! Lowering of the elementwise ops, checked against the reference evaluator (kernels run
//! by the kernel interpreter), plus a few hand-computed values and structural checks.

mod common;

use common::{check, compare, floats, infer_types, int, lower, op, rand, s, t, typed_i, Bind, Tol, EXACT, F32};
use kiln_flow::{BinaryOp, Expr, UnaryOp};
use kiln_ir::{Attr, DType, Op, OpKind, Tensor, TensorType};
use kiln_lower::{interpret, Lowered, Output};

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn flt(v: f32) -> Attr {
    Attr::Float(v)
}

fn ti(d: DType, dims: &[usize], v: &[i64]) -> Tensor {
    typed_i(d, dims, v)
}

fn v1(d: DType, v: &[f64]) -> Tensor {
    t(d, &[v.len()], v)
}

const F16: Tol = Tol { rtol: 2e-3, atol: 1e-5 };
const BF16: Tol = Tol { rtol: 1.6e-2, atol: 1e-5 };
const F64: Tol = Tol { rtol: 1e-13, atol: 1e-15 };
/// One step of the coarsest 8-bit float (e5m2: 2 mantissa bits).
const F8: Tol = Tol { rtol: 0.26, atol: 2e-3 };

/// The tolerance of float results of dtype `d` computed in f32 (or f64).
fn tol(d: DType) -> Tol {
    match d {
        DType::F64 => F64,
        DType::F16 => F16,
        DType::BF16 => BF16,
        DType::F32 => F32,
        d if d.is_low_precision_float() => F8,
        _ => EXACT,
    }
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

/// Values where formulas overflow, cancel or meet their special cases.
const SPECIAL: [f64; 27] = [
    f64::NEG_INFINITY,
    -1e30,
    -100.0,
    -30.0,
    -20.0,
    -10.0,
    -3.0,
    -2.5,
    -1.0,
    -0.5,
    -1e-3,
    -1e-6,
    -0.0,
    0.0,
    1e-6,
    1e-3,
    0.5,
    1.0,
    1.5,
    2.5,
    3.0,
    10.0,
    20.0,
    30.0,
    100.0,
    1e30,
    f64::INFINITY,
];

fn special(d: DType) -> Tensor {
    let mut v = SPECIAL.to_vec();
    v.push(f64::NAN);
    v1(d, &v)
}

/// Lowers `op` with explicit result types (for forms shape inference does not take) and
/// compares with the reference; `consts` marks constant operands.
fn check_typed(op: &Op, inputs: &[Option<Tensor>], consts: &[bool], out: &[TensorType], tol: Tol) {
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let want = kiln_ref::eval_op(op, &refs, out).unwrap_or_else(|e| panic!("{}: reference: {e}", op.kind));
    let lowered = lower_with(op, inputs, consts, out);
    let got = interpret(&lowered, &refs, out).unwrap_or_else(|e| panic!("{}: interpret: {e}", op.kind));
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(&format!("{} result {k}", op.kind), g, w, tol);
    }
}

fn lower_with(op: &Op, inputs: &[Option<Tensor>], consts: &[bool], out: &[TensorType]) -> Lowered {
    lower(op, inputs, |i| consts.get(i).copied().unwrap_or(false), out)
}

fn out_types(op: &Op, inputs: &[Option<Tensor>]) -> Vec<TensorType> {
    infer_types(op, inputs, 1)
}

/// Lowers with inferred types and the given constant operands.
fn lowered(op: &Op, inputs: &[Option<Tensor>], consts: &[bool]) -> Lowered {
    lower_with(op, inputs, consts, &out_types(op, inputs))
}

/// Lowers and runs `op`, returning its result (for hand-computed expectations).
fn run(op: &Op, inputs: &[Option<Tensor>]) -> Tensor {
    let out = out_types(op, inputs);
    let l = lower_with(op, inputs, &[], &out);
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    interpret(&l, &refs, &out).unwrap().remove(0)
}

fn one(kind: OpKind, attrs: &[(&str, Attr)], x: Tensor, tol: Tol) {
    check(&op(kind, attrs), &[Some(x)], Bind::Runtime, tol);
}

fn two(kind: OpKind, attrs: &[(&str, Attr)], a: Tensor, b: Tensor, tol: Tol) {
    check(&op(kind, attrs), &[Some(a), Some(b)], Bind::Runtime, tol);
}

fn kernels(l: &Lowered) -> Vec<&kiln_flow::Kernel> {
    l.steps.iter().map(|s| &s.kernel).collect()
}

// ---------------------------------------------------------------------------
// Unary math.
// ---------------------------------------------------------------------------

#[test]
fn float_unary_ops_on_every_float_dtype() {
    use OpKind::*;
    let kinds = [
        Acos, Acosh, Asin, Asinh, Atan, Atanh, Ceil, Cos, Cosh, Erf, Exp, Floor, Log, Round, Sin, Sinh, Sqrt, Tan, Tanh,
    ];
    for d in FLOATS {
        for k in kinds {
            one(k, &[], rand(d, &[3, 7], 11), tol(d));
            let x = if k == Acosh { v1(d, &SPECIAL[8..]) } else { special(d) };
            one(k, &[], x, tol(d));
        }
    }
    // Inside the domains of the inverse functions, and an odd shape.
    let unit = v1(DType::F32, &[-1.0, -0.999, -0.7, -0.25, 0.0, 0.3, 0.875, 0.9999, 1.0]);
    for k in [Acos, Asin, Atanh] {
        one(k, &[], unit.clone(), F32);
    }
    let big = v1(DType::F32, &[1.0, 1.0001, 1.5, 2.0, 10.0, 1e6]);
    for k in [Acosh, Log, Sqrt] {
        one(k, &[], big.clone(), F32);
    }
    one(Exp, &[], rand(DType::F32, &[17], 3), F32);
    one(Erf, &[], rand(DType::F64, &[2, 1, 5], 4), F64);
}

#[test]
fn round_is_half_to_even() {
    let x = v1(DType::F32, &[-3.5, -2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5, 4.5, 2.4999998, -0.49999997]);
    one(OpKind::Round, &[], x.clone(), EXACT);
    // Independently: ties go to the even neighbour.
    let got = run(&op(OpKind::Round, &[]), &[Some(x)]).to_f64_vec();
    assert_eq!(got, vec![-4.0, -2.0, -2.0, -0.0, 0.0, 2.0, 2.0, 4.0, 4.0, 2.0, -0.0]);
}

#[test]
fn abs_neg_sign_relu_on_floats_and_integers() {
    use OpKind::*;
    for k in [Abs, Neg, Sign, Relu] {
        for d in FLOATS {
            one(k, &[], special(d), tol(d));
        }
        for d in [DType::I8, DType::I16, DType::I32, DType::I64, DType::I4] {
            one(k, &[], rand(d, &[4, 5], 7), EXACT);
        }
        one(k, &[], ti(DType::I8, &[4], &[-128, -1, 0, 127]), EXACT);
        one(k, &[], ti(DType::I64, &[3], &[i64::MIN, -5, i64::MAX]), EXACT);
    }
    for k in [Abs, Sign] {
        for d in [DType::U8, DType::U16, DType::U64] {
            one(k, &[], rand(d, &[9], 2), EXACT);
        }
    }
    // Neg and Relu of unsigned values (the reference's wrapping forms).
    let u = ti(DType::U8, &[4], &[0, 1, 200, 255]);
    let ty = vec![u.ty().clone()];
    check_typed(&op(Neg, &[]), &[Some(u.clone())], &[], &ty, EXACT);
    check_typed(&op(Relu, &[]), &[Some(u)], &[], &ty, EXACT);
    // Hand-checked: Abs(i8 -128) wraps to -128, Sign(-0.0) keeps the zero.
    assert_eq!(run(&op(Abs, &[]), &[Some(ti(DType::I8, &[1], &[-128]))]).to_i64_vec().unwrap(), vec![-128]);
    let z = run(&op(Sign, &[]), &[Some(v1(DType::F32, &[-0.0, -7.0, 0.25]))]).to_f64_vec();
    assert!(z[0] == 0.0 && z[0].is_sign_negative() && z[1] == -1.0 && z[2] == 1.0);
}

// ---------------------------------------------------------------------------
// Activations.
// ---------------------------------------------------------------------------

fn activations() -> Vec<(OpKind, Vec<(&'static str, Attr)>)> {
    use OpKind::*;
    vec![
        (Reciprocal, vec![]),
        (Sigmoid, vec![]),
        (Softplus, vec![]),
        (Softsign, vec![]),
        (Mish, vec![]),
        (HardSwish, vec![]),
        (HardSigmoid, vec![]),
        (HardSigmoid, vec![("alpha", flt(0.3)), ("beta", flt(0.25))]),
        (Celu, vec![]),
        (Celu, vec![("alpha", flt(0.7))]),
        (Elu, vec![]),
        (Elu, vec![("alpha", flt(2.5))]),
        (Selu, vec![]),
        (Selu, vec![("alpha", flt(1.5)), ("gamma", flt(0.75))]),
        (LeakyRelu, vec![]),
        (LeakyRelu, vec![("alpha", flt(0.3))]),
        (ThresholdedRelu, vec![]),
        (ThresholdedRelu, vec![("alpha", flt(-0.5))]),
        (Gelu, vec![]),
        (Gelu, vec![("approximate", s("none"))]),
        (Gelu, vec![("approximate", s("tanh"))]),
    ]
}

#[test]
fn activations_on_every_float_dtype() {
    for (k, attrs) in activations() {
        for d in FLOATS {
            one(k, &attrs, rand(d, &[2, 3, 5], 5), tol(d));
            one(k, &attrs, special(d), tol(d));
        }
        one(k, &attrs, rand(DType::F8E4M3FN, &[6], 1), F8);
    }
}

/// Tails where naive formulas lose all relative accuracy (e.g. 1 + eˣ rounding to 1):
/// compared with no absolute slack.
#[test]
fn activations_keep_relative_accuracy_in_the_tails() {
    use OpKind::*;
    let x = v1(DType::F32, &[-80.0, -30.0, -20.0, -10.0, -1e-3, -1e-6, -1e-9, 1e-9, 1e-6, 1e-3, 10.0, 30.0, 80.0]);
    let strict = Tol { rtol: 2e-6, atol: 0.0 };
    for k in [Sigmoid, Softplus, Mish, Elu, Selu, Celu, Softsign, HardSwish] {
        one(k, &[], x.clone(), strict);
    }
    let x64 = v1(DType::F64, &[-700.0, -30.0, -1e-3, -1e-9, 1e-9, 1e-3, 30.0, 700.0]);
    for k in [Sigmoid, Softplus, Elu, Selu] {
        one(k, &[], x64.clone(), Tol { rtol: 1e-13, atol: 0.0 });
    }
    // Hand-computed: σ(−80) = e^{−80}/(1 + e^{−80}) and softplus(−20) = ln(1 + e^{−20}).
    let sig = run(&op(Sigmoid, &[]), &[Some(v1(DType::F32, &[-80.0]))]).to_f64_vec()[0];
    assert!((sig / (-80f64).exp() - 1.0).abs() < 1e-6, "{sig}");
    let sp = run(&op(Softplus, &[]), &[Some(v1(DType::F32, &[-20.0]))]).to_f64_vec()[0];
    assert!((sp / (-20f64).exp().ln_1p() - 1.0).abs() < 1e-6, "{sp}");
    let sp = run(&op(Softplus, &[]), &[Some(v1(DType::F32, &[100.0]))]).to_f64_vec()[0];
    assert_eq!(sp, 100.0);
}

#[test]
fn gelu_formulas_match_hand_values() {
    // Gelu(1) = Φ(1) = ½(1 + erf(1/√2)) = 0.8413447460685429; tanh form: 0.8411919906082768.
    let x = v1(DType::F64, &[1.0, -1.0]);
    let g = run(&op(OpKind::Gelu, &[]), &[Some(x.clone())]).to_f64_vec();
    assert!((g[0] - 0.8413447460685429).abs() < 1e-15 && (g[1] + 0.15865525393145707).abs() < 1e-15, "{g:?}");
    let g = run(&op(OpKind::Gelu, &[("approximate", s("tanh"))]), &[Some(x)]).to_f64_vec();
    assert!((g[0] - 0.8411919906082768).abs() < 1e-15 && (g[1] + 0.15880800939172324).abs() < 1e-15, "{g:?}");
}

#[test]
fn shrink_floats_and_saturating_integers() {
    let attrs = [("bias", flt(1.5)), ("lambd", flt(0.75))];
    for d in FLOATS {
        one(OpKind::Shrink, &[], special(d), tol(d));
        one(OpKind::Shrink, &attrs, rand(d, &[3, 4], 2), tol(d));
    }
    for d in [DType::I8, DType::I32, DType::U8, DType::I64] {
        one(OpKind::Shrink, &attrs, rand(d, &[11], 9), EXACT);
    }
    // A negative bias pushes i8 127 to 137 and u8 0..: saturation, not wrapping.
    let neg_bias = [("bias", flt(-10.0)), ("lambd", flt(0.5))];
    one(OpKind::Shrink, &neg_bias, ti(DType::I8, &[5], &[-128, -120, 0, 120, 127]), EXACT);
    one(OpKind::Shrink, &neg_bias, ti(DType::U8, &[4], &[0, 1, 250, 255]), EXACT);
    let got = run(&op(OpKind::Shrink, &neg_bias), &[Some(ti(DType::I8, &[2], &[127, -128]))]);
    assert_eq!(got.to_i64_vec().unwrap(), vec![127, -128]);
}

#[test]
fn isnan_isinf_with_flags() {
    for d in FLOATS {
        one(OpKind::IsNaN, &[], special(d), EXACT);
        for (n, p) in [(1, 1), (0, 1), (1, 0), (0, 0)] {
            one(OpKind::IsInf, &[("detect_negative", int(n)), ("detect_positive", int(p))], special(d), EXACT);
        }
    }
    one(OpKind::IsNaN, &[], special(DType::F8E5M2), EXACT);
    one(OpKind::IsInf, &[], special(DType::F8E5M2), EXACT);
}

// ---------------------------------------------------------------------------
// Binary ops.
// ---------------------------------------------------------------------------

/// Pairs of broadcasting shapes (numpy rules), with odd extents and scalars.
const SHAPES: [(&[usize], &[usize]); 7] = [
    (&[3, 7], &[3, 7]),
    (&[3, 7], &[7]),
    (&[2, 1, 5], &[4, 1]),
    (&[1], &[2, 3]),
    (&[], &[17]),
    (&[4, 1, 1, 3], &[1, 2, 1]),
    (&[], &[]),
];

#[test]
fn arithmetic_broadcasts_over_dtypes() {
    use OpKind::*;
    let dtypes = NUMERIC;
    for k in [Add, Sub, Mul] {
        // u64 products: see `u64_products`.
        for d in dtypes.into_iter().filter(|&d| !(k == Mul && d == DType::U64)) {
            for (i, (a, b)) in SHAPES.iter().enumerate() {
                two(k, &[], rand(d, a, i as u64), rand(d, b, 100 + i as u64), tol(d));
            }
        }
    }
    // Division with non-zero divisors (the reference rejects integer division by zero).
    for d in dtypes {
        for (i, (a, b)) in SHAPES.iter().enumerate() {
            let den = nonzero(rand(d, b, 200 + i as u64));
            two(Div, &[], rand(d, a, i as u64), den, tol(d));
        }
    }
    // Wrapping and the extremes of signed division.
    two(Mul, &[], ti(DType::I8, &[3], &[100, -128, 127]), ti(DType::I8, &[3], &[3, -1, 127]), EXACT);
    two(Div, &[], ti(DType::I8, &[3], &[-128, -7, 7]), ti(DType::I8, &[3], &[-1, 2, -2]), EXACT);
    two(Div, &[], ti(DType::I64, &[2], &[i64::MIN, -9]), ti(DType::I64, &[2], &[-1, 4]), EXACT);
    two(Div, &[], ti(DType::U64, &[2], &[-1, -2]), ti(DType::U64, &[2], &[3, -1]), EXACT);
    two(Add, &[], ti(DType::U4, &[2], &[15, 9]), ti(DType::U4, &[2], &[15, 9]), EXACT);
    two(Add, &[], ti(DType::I4, &[2], &[7, -8]), ti(DType::I4, &[2], &[7, -8]), EXACT);
    // Special float values.
    for k in [Add, Sub, Mul, Div] {
        two(k, &[], special(DType::F32), v1(DType::F32, &[0.0]), F32);
        two(k, &[], special(DType::F32), v1(DType::F32, &[f64::INFINITY]), F32);
    }
}

/// `x` with zeros replaced by 3 (integers) or left alone (floats).
fn nonzero(x: Tensor) -> Tensor {
    if x.dtype().is_float() {
        return x;
    }
    let v: Vec<i64> = x.to_i64_vec().unwrap().into_iter().map(|v| if v == 0 { 3 } else { v }).collect();
    Tensor::from_i64(x.dtype(), x.shape().clone(), &v).unwrap()
}

#[test]
fn integer_division_by_zero_gives_zero() {
    // The reference rejects it; kernels must not trap and define 0.
    let got = run(&op(OpKind::Div, &[]), &[Some(ti(DType::I32, &[2], &[7, -7])), Some(ti(DType::I32, &[2], &[0, 0]))]);
    assert_eq!(got.to_i64_vec().unwrap(), vec![0, 0]);
}

#[test]
fn mod_with_both_sign_conventions() {
    let signs = [-7.0, -6.0, -1.0, 0.0, 1.0, 5.0, 7.0, 100.0, -100.0];
    let dens = [3.0, -3.0, 5.0, -5.0, 1.0, -1.0, 7.0, -7.0, 9.0];
    for d in [DType::I8, DType::I16, DType::I32, DType::I64, DType::I4] {
        let x = if d == DType::I4 { v1(d, &[-7.0, -6.0, -1.0, 0.0, 1.0, 5.0, 7.0, 3.0, -3.0]) } else { v1(d, &signs) };
        for fmod in [0, 1] {
            two(OpKind::Mod, &[("fmod", int(fmod))], x.clone(), v1(d, &dens), EXACT);
            two(
                OpKind::Mod,
                &[("fmod", int(fmod))],
                t(d, &[3, 1], &[7.0, -7.0, 6.0]),
                t(d, &[4], &[3.0, -3.0, 4.0, -4.0]),
                EXACT,
            );
        }
    }
    two(OpKind::Mod, &[], ti(DType::I8, &[2], &[-128, -128]), ti(DType::I8, &[2], &[-1, 3]), EXACT);
    two(OpKind::Mod, &[("fmod", int(1))], ti(DType::I64, &[2], &[i64::MIN, 5]), ti(DType::I64, &[2], &[-1, -3]), EXACT);
    for d in [DType::U8, DType::U64] {
        for fmod in [0, 1] {
            two(OpKind::Mod, &[("fmod", int(fmod))], rand(d, &[4, 5], 1), nonzero(rand(d, &[5], 2)), EXACT);
        }
    }
    for d in FLOATS {
        two(OpKind::Mod, &[("fmod", int(1))], rand(d, &[3, 5], 1), rand(d, &[5], 2), tol(d));
        two(OpKind::Mod, &[("fmod", int(1))], special(d), v1(d, &[1.5]), tol(d));
    }
    // Float fmod=0 (numpy's mod; shape inference refuses it, the reference defines it).
    let x = v1(DType::F32, &[-7.5, -6.0, -0.25, 0.0, 0.25, 5.5, 7.0, f64::NAN, f64::INFINITY]);
    let y = v1(DType::F32, &[2.0, -2.0, 3.0, -1.5, -1.0, 2.0, -3.0, 1.0, 1.0]);
    let ty = vec![x.ty().clone()];
    check_typed(&op(OpKind::Mod, &[]), &[Some(x), Some(y)], &[], &ty, F32);
    // Hand-checked: −7 mod 3 = 2, 7 mod −3 = −2, fmod(−7, 3) = −1.
    let a = ti(DType::I32, &[2], &[-7, 7]);
    let b = ti(DType::I32, &[2], &[3, -3]);
    let m = run(&op(OpKind::Mod, &[]), &[Some(a.clone()), Some(b.clone())]).to_i64_vec().unwrap();
    assert_eq!(m, vec![2, -2]);
    let f = run(&op(OpKind::Mod, &[("fmod", int(1))]), &[Some(a), Some(b)]).to_i64_vec().unwrap();
    assert_eq!(f, vec![-1, 1]);
}

#[test]
fn pow_float_bases_with_float_and_integer_exponents() {
    let p = op(OpKind::Pow, &[]);
    for d in FLOATS {
        let base = rand(d, &[4, 3], 1);
        for e in [DType::F32, DType::F64, DType::F16, DType::I8, DType::I32, DType::I64, DType::U8, DType::U64] {
            let ex = if e.is_float() { rand(e, &[3], 2) } else { ti(e, &[3], &[0, 3, 7]) };
            check(&p, &[Some(base.clone()), Some(ex)], Bind::Runtime, tol(d));
        }
        check(&p, &[Some(special(d)), Some(v1(d, &[0.5]))], Bind::Runtime, tol(d));
        check(&p, &[Some(special(d)), Some(v1(d, &[-3.0]))], Bind::Runtime, tol(d));
    }
    // Odd exponents beyond 2^24: the parity (so the sign) survives.
    let base = v1(DType::F32, &[-1.0, -1.0, 1.0000001, -0.9999999]);
    let ex = ti(DType::I64, &[4], &[(1 << 24) + 1, (1 << 40) + 3, 1 << 25, (1 << 24) + 1]);
    check(&p, &[Some(base.clone()), Some(ex)], Bind::Runtime, F32);
    let ex = v1(DType::F64, &[16777217.0, 1e15 + 1.0, 0.1, 2.0]);
    check(&p, &[Some(base), Some(ex)], Bind::Runtime, F32);
}

#[test]
fn pow_with_constant_exponents_becomes_arithmetic() {
    let p = op(OpKind::Pow, &[]);
    for d in FLOATS {
        for e in [0.0, 1.0, 2.0, -1.0, 0.5, 3.0, -0.5, 0.1] {
            for x in [special(d), rand(d, &[5, 3], 4)] {
                check(&p, &[Some(x), Some(t(d, &[], &[e]))], Bind::ConstFrom(1), tol(d));
            }
        }
        check(&p, &[Some(special(d)), Some(ti(DType::I64, &[1], &[2]))], Bind::ConstFrom(1), tol(d));
        check(&p, &[Some(special(d)), Some(ti(DType::I64, &[1], &[(1 << 24) + 1]))], Bind::ConstFrom(1), tol(d));
    }
    // x² is one multiply, √x one square root: no pow node, one operand bound.
    let x = rand(DType::F32, &[8], 1);
    for (e, want) in [(2.0, None), (0.5, Some(UnaryOp::Sqrt))] {
        let l = lowered(&p, &[Some(x.clone()), Some(t(DType::F32, &[], &[e]))], &[false, true]);
        let k = kernels(&l)[0];
        assert_eq!(l.steps[0].operands.len(), 1);
        assert!(!k.nodes.iter().any(|n| matches!(n.expr, Expr::Binary(BinaryOp::Pow, ..))), "{k}");
        if let Some(u) = want {
            assert!(k.nodes.iter().any(|n| matches!(n.expr, Expr::Unary(v, _) if v == u)), "{k}");
        }
    }
    // pow(−∞, ½) = +∞ and pow(−0, ½) = +0 (not sqrt's NaN and −0).
    let r = run(&p, &[Some(v1(DType::F32, &[f64::NEG_INFINITY, -0.0, 4.0])), Some(t(DType::F32, &[], &[0.5]))]);
    let r = r.to_f64_vec();
    assert!(r[0] == f64::INFINITY && r[1] == 0.0 && r[1].is_sign_positive() && r[2] == 2.0, "{r:?}");
}

#[test]
fn pow_integer_bases() {
    let p = op(OpKind::Pow, &[]);
    // u64 bases: see `u64_products`.
    let ints = [DType::I8, DType::I16, DType::I32, DType::I64, DType::U8, DType::U16, DType::U32, DType::I4];
    for bd in ints {
        let base = if bd.is_signed_int() {
            ti(bd, &[7, 1], &[-3, -2, -1, 0, 1, 2, 3])
        } else {
            ti(bd, &[7, 1], &[0, 1, 2, 3, 5, 7, 15])
        };
        for ed in [DType::I8, DType::I32, DType::I64, DType::U8, DType::U64] {
            let ev: Vec<i64> = if ed.is_signed_int() {
                vec![-3, -2, -1, 0, 1, 2, 5, 7, 8, 15, 31, 33, 63, 64, 65, 100]
            } else {
                vec![0, 1, 2, 5, 7, 8, 15, 31, 33, 63, 64, 65, 100, 127]
            };
            let ev: Vec<i64> = ev.into_iter().filter(|&e| ti(ed, &[1], &[e]).to_i64_vec().unwrap()[0] == e).collect();
            let ex = ti(ed, &[ev.len()], &ev);
            check(&p, &[Some(base.clone()), Some(ex.clone())], Bind::Runtime, EXACT);
            // A constant scalar exponent.
            for &e in &ev {
                check(&p, &[Some(base.clone()), Some(ti(ed, &[], &[e]))], Bind::ConstFrom(1), EXACT);
            }
        }
        // Float exponents: f64 power, truncated and saturated.
        let ex = v1(DType::F32, &[0.5, 2.0, -1.0, 3.5, 40.0, 1e10, f64::NAN]);
        check(&p, &[Some(base), Some(ex)], Bind::Runtime, EXACT);
    }
    // Huge exponents: only the low bits matter for odd bases; even bases give 0.
    let base = ti(DType::I64, &[6, 1], &[3, -3, 2, -1, 7, 1 << 20]);
    let big = [(1i64 << 62) + 5, (1 << 62) + 4, i64::MAX, (1 << 40) + 1, 1 << 61, 62];
    check(&p, &[Some(base.clone()), Some(ti(DType::I64, &[6], &big))], Bind::Runtime, EXACT);
    check(&p, &[Some(base.clone()), Some(ti(DType::U64, &[3], &[-1, -2, 1 << 63]))], Bind::Runtime, EXACT);
    for e in big {
        check(&p, &[Some(base.clone()), Some(ti(DType::I64, &[], &[e]))], Bind::ConstFrom(1), EXACT);
    }
    check(&p, &[Some(base), Some(ti(DType::U64, &[], &[-1]))], Bind::ConstFrom(1), EXACT);
    // Hand-checked: 3^5 = 243 wraps to −13 in i8; (−1)^−3 = −1; 2^−1 = 0; 1^−7 = 1.
    let r = run(&p, &[Some(ti(DType::I8, &[4], &[3, -1, 2, 1])), Some(ti(DType::I8, &[4], &[5, -3, -1, -7]))]);
    assert_eq!(r.to_i64_vec().unwrap(), vec![-13, -1, 0, 1]);
}

#[test]
fn comparisons() {
    use OpKind::*;
    for k in [Equal, Greater, GreaterOrEqual, Less, LessOrEqual] {
        for d in [DType::F32, DType::F64, DType::F16, DType::I8, DType::I64, DType::U8, DType::U64, DType::I4] {
            for (i, (a, b)) in SHAPES.iter().enumerate() {
                two(k, &[], rand(d, a, i as u64), rand(d, b, i as u64 + 50), EXACT);
            }
        }
        two(k, &[], special(DType::F32), special(DType::F32), EXACT);
        two(k, &[], special(DType::F32), v1(DType::F32, &[f64::NAN]), EXACT);
        // Unsigned order of u64 values above 2^63.
        two(k, &[], ti(DType::U64, &[3], &[-1, 5, 1 << 62]), ti(DType::U64, &[3], &[1, -7, 1 << 62]), EXACT);
    }
    two(Equal, &[], rand(DType::Bool, &[3, 4], 1), rand(DType::Bool, &[4], 2), EXACT);
}

#[test]
fn logical_and_bitwise() {
    use OpKind::*;
    for k in [And, Or, Xor] {
        for (i, (a, b)) in SHAPES.iter().enumerate() {
            two(k, &[], rand(DType::Bool, a, i as u64), rand(DType::Bool, b, i as u64 + 9), EXACT);
        }
    }
    one(Not, &[], rand(DType::Bool, &[3, 5], 3), EXACT);
    let ints = NUMERIC.into_iter().filter(|d| !matches!(d, DType::F32 | DType::F64 | DType::F16 | DType::BF16));
    for d in ints {
        for k in [BitwiseAnd, BitwiseOr, BitwiseXor] {
            two(k, &[], rand(d, &[2, 5], 1), rand(d, &[5], 2), EXACT);
        }
        one(BitwiseNot, &[], rand(d, &[7], 4), EXACT);
    }
    for d in [DType::U8, DType::U16, DType::U32, DType::U64, DType::U4] {
        for dir in ["LEFT", "RIGHT"] {
            let x = ti(d, &[1, 6], &[1, 3, 9, 15, 2, 7]);
            let amounts = ti(d, &[8, 1], &[0, 1, 3, 4, 7, 8, 15, 9]);
            two(BitShift, &[("direction", s(dir))], x, amounts, EXACT);
        }
    }
    let big = ti(DType::U64, &[3], &[-1, 1 << 63, 5]);
    let amounts = ti(DType::U64, &[3], &[63, 64, 200]);
    two(BitShift, &[("direction", s("LEFT"))], big.clone(), amounts.clone(), EXACT);
    two(BitShift, &[("direction", s("RIGHT"))], big, amounts, EXACT);
}

#[test]
fn prelu_slopes() {
    for d in FLOATS {
        let x = rand(d, &[2, 3, 4], 1);
        for sd in [&[1][..], &[4], &[3, 1], &[2, 3, 4], &[]] {
            two(OpKind::PRelu, &[], x.clone(), rand(d, sd, 2), tol(d));
        }
        two(OpKind::PRelu, &[], special(d), v1(d, &[0.25]), tol(d));
    }
    for d in [DType::I8, DType::I32, DType::I64, DType::U8] {
        two(OpKind::PRelu, &[], rand(d, &[3, 5], 1), rand(d, &[5], 2), EXACT);
    }
    two(OpKind::PRelu, &[], ti(DType::I8, &[2], &[-128, -100]), ti(DType::I8, &[1], &[3]), EXACT);
}

// ---------------------------------------------------------------------------
// Variadic ops, Where, Clip.
// ---------------------------------------------------------------------------

#[test]
fn variadic_max_min_sum_mean() {
    use OpKind::*;
    let shapes: [&[usize]; 4] = [&[2, 3, 1], &[3, 5], &[], &[1, 1, 5]];
    for k in [Max, Min, Sum, Mean] {
        for d in FLOATS {
            for n in 1..=4 {
                let ins: Vec<Option<Tensor>> = (0..n).map(|i| Some(rand(d, shapes[i], i as u64 + 1))).collect();
                check(&op(k, &[]), &ins, Bind::Runtime, tol(d));
            }
            let nan = vec![Some(special(d)), Some(v1(d, &[f64::NAN])), Some(special(d))];
            check(&op(k, &[]), &nan, Bind::Runtime, tol(d));
        }
    }
    for k in [Max, Min] {
        for d in [DType::I8, DType::I64, DType::U8, DType::U64, DType::I4] {
            let ins: Vec<Option<Tensor>> = (0..3).map(|i| Some(rand(d, shapes[i], i as u64 + 1))).collect();
            check(&op(k, &[]), &ins, Bind::Runtime, EXACT);
        }
        let u = vec![Some(ti(DType::U64, &[2], &[-1, 3])), Some(ti(DType::U64, &[2], &[5, 1 << 63]))];
        check(&op(k, &[]), &u, Bind::Runtime, EXACT);
    }
    // Integer Sum and Mean (shape inference takes floats only; the reference defines them).
    let cases: Vec<Vec<Tensor>> = vec![
        vec![
            ti(DType::I8, &[4], &[127, -128, -7, 7]),
            ti(DType::I8, &[4], &[127, -128, 2, -2]),
            ti(DType::I8, &[1], &[1]),
        ],
        vec![ti(DType::U8, &[3], &[255, 254, 1]), ti(DType::U8, &[3], &[255, 1, 0])],
        vec![
            ti(DType::I64, &[6], &[i64::MAX, i64::MIN, 5, -2, 3, -1]),
            ti(DType::I64, &[6], &[i64::MAX, i64::MIN, -2, 0, -6, 2]),
            ti(DType::I64, &[6], &[i64::MAX - 1, -1, 0, 0, 0, 0]),
        ],
        vec![ti(DType::U64, &[3], &[-1, -2, 7]), ti(DType::U64, &[3], &[-1, -1, 2])],
        vec![ti(DType::I32, &[2], &[i32::MAX as i64, -9]), ti(DType::I32, &[2], &[i32::MAX as i64, 4])],
        vec![ti(DType::I4, &[3], &[7, -8, -3]), ti(DType::I4, &[3], &[7, -8, 2])],
    ];
    for ins in cases {
        let out = vec![TensorType::new(ins[0].dtype(), ins[0].shape().clone())];
        let ins: Vec<Option<Tensor>> = ins.into_iter().map(Some).collect();
        for k in [Sum, Mean] {
            check_typed(&op(k, &[]), &ins, &[], &out, EXACT);
        }
    }
    // Hand-checked: the mean of i64 MAX and MAX is MAX (no overflow); of 3 and −6, −1.
    let a = ti(DType::I64, &[2], &[i64::MAX, 3]);
    let b = ti(DType::I64, &[2], &[i64::MAX, -6]);
    let l = lower_with(&op(Mean, &[]), &[Some(a.clone()), Some(b.clone())], &[], &[a.ty().clone()]);
    let got = interpret(&l, &[Some(&a), Some(&b)], &[a.ty().clone()]).unwrap();
    assert_eq!(got[0].to_i64_vec().unwrap(), vec![i64::MAX, -1]);
}

#[test]
fn where_broadcasts_three_operands() {
    let shapes: [(&[usize], &[usize], &[usize]); 4] =
        [(&[3, 4], &[3, 4], &[3, 4]), (&[4], &[3, 1], &[]), (&[2, 1, 3], &[1, 5, 1], &[3]), (&[], &[], &[])];
    for d in [
        DType::F32,
        DType::F64,
        DType::F16,
        DType::BF16,
        DType::I8,
        DType::I64,
        DType::U64,
        DType::Bool,
        DType::F8E4M3FN,
        DType::I4,
    ] {
        for (i, (c, x, y)) in shapes.iter().enumerate() {
            let ins = [Some(rand(DType::Bool, c, i as u64)), Some(rand(d, x, 1)), Some(rand(d, y, 2))];
            check(&op(OpKind::Where, &[]), &ins, Bind::Runtime, EXACT);
        }
    }
    let ins = [Some(rand(DType::Bool, &[28], 5)), Some(special(DType::F32)), Some(v1(DType::F32, &[f64::NAN]))];
    check(&op(OpKind::Where, &[]), &ins, Bind::Runtime, EXACT);
}

#[test]
fn clip_bounds_constant_runtime_absent_and_empty() {
    let c = op(OpKind::Clip, &[]);
    for d in [DType::F32, DType::F64, DType::F16, DType::I8, DType::I64, DType::U8, DType::U64] {
        let x = if d.is_float() { special(d) } else { rand(d, &[3, 6], 1) };
        let (lo, hi) = if d.is_unsigned_int() { (2.0, 9.0) } else { (-1.5, 2.0) };
        for bind in [Bind::Runtime, Bind::ConstFrom(1)] {
            check(&c, &[Some(x.clone()), Some(t(d, &[], &[lo])), Some(t(d, &[1], &[hi]))], bind, tol(d));
            check(&c, &[Some(x.clone()), Some(t(d, &[], &[lo]))], bind, tol(d));
            check(&c, &[Some(x.clone()), None, Some(t(d, &[], &[hi]))], bind, tol(d));
            // min > max: max wins (applied last).
            check(&c, &[Some(x.clone()), Some(t(d, &[], &[hi])), Some(t(d, &[], &[lo]))], bind, tol(d));
        }
        check(&c, &[Some(x.clone())], Bind::Runtime, EXACT);
    }
    // A scalar input with bounds of shape [1]; NaN bounds; u64 above 2^63.
    check(
        &c,
        &[Some(t(DType::F32, &[], &[5.0])), Some(v1(DType::F32, &[1.0])), Some(v1(DType::F32, &[3.0]))],
        Bind::Runtime,
        EXACT,
    );
    check(&c, &[Some(special(DType::F32)), Some(t(DType::F32, &[], &[f64::NAN]))], Bind::ConstFrom(1), EXACT);
    let x = ti(DType::U64, &[3], &[-1, 5, 1 << 63]);
    check(&c, &[Some(x), Some(ti(DType::U64, &[], &[6])), Some(ti(DType::U64, &[], &[-5]))], Bind::Runtime, EXACT);
    // An empty bound means no bound (shape inference takes only scalars: explicit types).
    let x = rand(DType::F32, &[4], 3);
    let out = vec![x.ty().clone()];
    let empty = t(DType::F32, &[0], &[]);
    check_typed(&c, &[Some(x.clone()), Some(empty.clone()), Some(t(DType::F32, &[], &[0.5]))], &[], &out, EXACT);
    check_typed(&c, &[Some(x), Some(empty), None], &[true], &out, EXACT);
    // Constant bounds are literals: the kernel reads only x.
    let l = lowered(
        &c,
        &[Some(rand(DType::F32, &[5], 1)), Some(t(DType::F32, &[], &[0.0])), Some(t(DType::F32, &[], &[6.0]))],
        &[false, true, true],
    );
    assert_eq!(l.steps[0].operands.len(), 1);
    assert_eq!(kernels(&l)[0].inputs.len(), 1);
}

// ---------------------------------------------------------------------------
// Cast, CastLike.
// ---------------------------------------------------------------------------

/// The numeric dtypes (4-bit integers included): what arithmetic is tested over.
const NUMERIC: [DType; 14] = [
    DType::F32,
    DType::F64,
    DType::F16,
    DType::BF16,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::I4,
    DType::U4,
];

/// Every dtype a Cast may produce: the numeric ones, bool and the 8-bit floats.
fn cast_targets() -> impl Iterator<Item = DType> {
    let others = [DType::Bool, DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ, DType::F8E8M0FNU];
    NUMERIC.into_iter().chain(others)
}

fn cast_op(to: DType, saturate: Option<i64>) -> Op {
    let mut attrs = vec![("to", int(to.onnx_code().unwrap() as i64))];
    if let Some(s) = saturate {
        attrs.push(("saturate", int(s)));
    }
    op(OpKind::Cast, &attrs)
}

#[test]
fn cast_from_floats_truncates_and_saturates() {
    let vals = [
        -1e10,
        -70000.5,
        -300.7,
        -128.5,
        -127.9,
        -8.5,
        -1.9,
        -0.5,
        -0.0,
        0.0,
        0.4,
        1.5,
        2.5,
        7.9,
        15.5,
        127.9,
        255.5,
        300.2,
        448.0,
        500.0,
        65535.9,
        1e10,
        3e38,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    for from in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::F8E4M3FN, DType::F8E5M2] {
        let x = v1(from, &vals);
        for to in cast_targets() {
            for sat in [None, Some(0)] {
                check(&cast_op(to, sat), &[Some(x.clone())], Bind::Runtime, EXACT);
            }
        }
        let f = v1(from, &[1.0, -2.0]);
        check(&cast_op(DType::F4E2M1FN, None), &[Some(f)], Bind::Runtime, EXACT);
    }
    // Hand-checked: 300.7 → u8 saturates to 255 (not 44), −1.9 → i8 truncates to −1, NaN → 0.
    let r = run(&cast_op(DType::U8, None), &[Some(v1(DType::F32, &[300.7, -5.0, f64::NAN]))]);
    assert_eq!(r.to_i64_vec().unwrap(), vec![255, 0, 0]);
    let r = run(&cast_op(DType::I8, None), &[Some(v1(DType::F32, &[-1.9, 1e9, -1e9]))]);
    assert_eq!(r.to_i64_vec().unwrap(), vec![-1, 127, -128]);
    let r = run(&cast_op(DType::I4, None), &[Some(v1(DType::F32, &[2.7, -2.7, 100.0]))]);
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, -2, 7]);
}

/// Cast to f8E8M0FNU with each `round_mode` (ONNX opset 24; `up` is the default), from
/// f32, f16, f64 and i32: powers of two, values just above and below them, midpoints,
/// the ends of the range, subnormals, zeros, negatives, infinities and NaN.
#[test]
fn cast_to_e8m0_rounds_by_mode() {
    let p = |e: i32| 2f64.powi(e);
    let vals = [
        1.0,
        1.0000001,
        1.4999999,
        1.5,
        1.75,
        0.75,
        3.0,
        6.0,
        1e-3,
        1e3,
        p(127),
        1.25 * p(127),
        1.6 * p(127),
        3e38,
        p(-126),
        p(-127),
        1.25 * p(-127),
        1.5 * p(-127),
        1.75 * p(-127),
        p(-140),
        0.0,
        -0.0,
        -1.0,
        -1e-3,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    for mode in ["up", "down", "nearest"] {
        let cast = op(
            OpKind::Cast,
            &[("to", int(DType::F8E8M0FNU.onnx_code().unwrap() as i64)), ("round_mode", Attr::String(mode.into()))],
        );
        for from in [DType::F32, DType::F16, DType::F64, DType::BF16] {
            check(&cast, &[Some(v1(from, &vals))], Bind::Runtime, EXACT);
        }
        check(&cast, &[Some(ti(DType::I32, &[6], &[0, 1, 3, 5, -7, i32::MAX as i64]))], Bind::Runtime, EXACT);
        // Hand-checked: 1.5 → 1 (down), 2 (up, nearest: ties go up); 1.25 → 1, 2, 1;
        // 0.75 → 0.5, 1, 1; 6 → 4, 8, 8.
        let r = run(&cast, &[Some(v1(DType::F32, &[1.5, 1.25, 0.75, 6.0]))]);
        let want = match mode {
            "down" => [1.0, 1.0, 0.5, 4.0],
            "up" => [2.0, 2.0, 1.0, 8.0],
            _ => [2.0, 1.0, 1.0, 8.0],
        };
        assert_eq!(r.to_f64_vec(), want, "round_mode {mode}");
    }
}

#[test]
fn cast_from_integers_wraps() {
    let i64s = [
        i64::MIN,
        -(1 << 40) - 3,
        -70000,
        -129,
        -128,
        -9,
        -8,
        -1,
        0,
        1,
        7,
        8,
        15,
        16,
        127,
        128,
        255,
        256,
        448,
        65505,
        65535,
        65536,
        (1 << 24) + 1,
        (1 << 24) + 3 + (1 << 16),
        1 << 31,
        (1 << 53) + 1,
        i64::MAX,
    ];
    for from in [
        DType::I64,
        DType::I32,
        DType::I16,
        DType::I8,
        DType::U64,
        DType::U32,
        DType::U8,
        DType::I4,
        DType::U4,
        DType::Bool,
    ] {
        let x = ti(from, &[i64s.len()], &i64s);
        for to in cast_targets() {
            // Wide integers to f16/bf16: see `wide_integers_to_f16_bf16_round_once`.
            if matches!(to, DType::F16 | DType::BF16) && from.bits() > 16 {
                continue;
            }
            check(&cast_op(to, None), &[Some(x.clone())], Bind::Runtime, EXACT);
        }
    }
    // Hand-checked: i32 300 → i8 44, i64 −1 → u4 15, 23 → i4 7, 24 → i4 −8.
    let r = run(&cast_op(DType::I8, None), &[Some(ti(DType::I32, &[1], &[300]))]);
    assert_eq!(r.to_i64_vec().unwrap(), vec![44]);
    let r = run(&cast_op(DType::U4, None), &[Some(ti(DType::I64, &[1], &[-1]))]);
    assert_eq!(r.to_i64_vec().unwrap(), vec![15]);
    let r = run(&cast_op(DType::I4, None), &[Some(ti(DType::I64, &[2], &[23, 24]))]);
    assert_eq!(r.to_i64_vec().unwrap(), vec![7, -8]);
}

#[test]
fn cast_to_the_same_dtype_is_an_alias_and_castlike_reads_only_the_input() {
    let x = rand(DType::F32, &[2, 3], 1);
    let l = lowered(&cast_op(DType::F32, None), &[Some(x.clone())], &[]);
    assert!(l.steps.is_empty());
    assert_eq!(l.outputs, vec![Output::Alias(0)]);
    for to in [DType::F16, DType::I32, DType::Bool, DType::F32] {
        let like = t(to, &[0], &[]);
        let ins = [Some(x.clone()), Some(like.clone())];
        check(&op(OpKind::CastLike, &[]), &ins, Bind::Runtime, EXACT);
        check(&op(OpKind::CastLike, &[("saturate", int(0))]), &ins, Bind::Runtime, EXACT);
        let l = lowered(&op(OpKind::CastLike, &[]), &ins, &[]);
        assert!(l.steps.iter().all(|s| s.operands.len() == 1));
    }
    check(
        &op(OpKind::CastLike, &[]),
        &[Some(special(DType::F64)), Some(t(DType::F8E5M2, &[1], &[0.0]))],
        Bind::Runtime,
        EXACT,
    );
}

// ---------------------------------------------------------------------------
// QuantizeLinear, DequantizeLinear.
// ---------------------------------------------------------------------------

fn q(attrs: &[(&str, Attr)]) -> Op {
    op(OpKind::QuantizeLinear, attrs)
}

fn dq(attrs: &[(&str, Attr)]) -> Op {
    op(OpKind::DequantizeLinear, attrs)
}

/// x values covering ties, saturation and the special values.
fn qx(d: DType) -> Tensor {
    let mut v: Vec<f64> =
        vec![-1e6, -300.0, -129.5, -2.5, -1.5, -0.5, 0.0, 0.5, 1.5, 2.5, 3.5, 126.5, 127.5, 300.0, 1e6];
    if d.is_float() {
        v.extend([f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.3, -0.7]);
    } else {
        v.extend([7.0, -9.0, 12345.0, -2e9, 2e9]);
    }
    t(d, &[4, 5], &v)
}

#[test]
fn quantize_per_tensor() {
    let outs = [DType::U8, DType::I8, DType::U16, DType::I16, DType::I4, DType::U4];
    for xd in [DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32] {
        let x = qx(xd);
        for sd in [DType::F32, DType::F16, DType::F64] {
            for scale in [1.0, 0.5, 3.0, 0.1] {
                let sc = t(sd, &[], &[scale]);
                for bind in [Bind::Runtime, Bind::ConstFrom(1)] {
                    check(&q(&[]), &[Some(x.clone()), Some(sc.clone())], bind, EXACT);
                    for od in outs {
                        let zp = t(od, &[], &[if od.is_unsigned_int() { 3.0 } else { -2.0 }]);
                        check(&q(&[]), &[Some(x.clone()), Some(sc.clone()), Some(zp)], bind, EXACT);
                    }
                }
            }
        }
        let sc = t(DType::I32, &[], &[3.0]);
        check(&q(&[]), &[Some(x.clone()), Some(sc)], Bind::Runtime, EXACT);
    }
    // A zero point of 0, constant (lowered without the NaN select and the sum): NaN,
    // infinities and far values still give the reference's integers.
    for xd in [DType::F32, DType::F64] {
        for od in [DType::I8, DType::U8, DType::I16, DType::I4] {
            for scale in [1.0, 0.1] {
                let ins = [Some(qx(xd)), Some(t(DType::F32, &[], &[scale])), Some(t(od, &[], &[0.0]))];
                check(&q(&[]), &ins, Bind::ConstFrom(1), EXACT);
            }
        }
    }
    // output_dtype without a zero point, one-element scale of shape [1], a [1] zero point
    // beside a scalar scale.
    let x = qx(DType::F32);
    check(&q(&[("output_dtype", int(3))]), &[Some(x.clone()), Some(v1(DType::F32, &[0.7]))], Bind::Runtime, EXACT);
    let ins = [Some(x.clone()), Some(t(DType::F32, &[], &[0.7])), Some(ti(DType::U8, &[1], &[128]))];
    check(&q(&[]), &ins, Bind::Runtime, EXACT);
    check(&q(&[]), &ins, Bind::ConstFrom(1), EXACT);
    // The division precision: f16 for an f32 scale.
    for p in [1, 10, 16, 11] {
        let ins = [Some(rand(DType::F32, &[40], 3)), Some(t(DType::F32, &[], &[0.013]))];
        check(&q(&[("precision", int(p))]), &ins, Bind::Runtime, EXACT);
    }
    // Hand-checked: 2.5 and 3.5 round to even, −129.5/1 saturates, NaN gives the zero point.
    let r = run(
        &q(&[]),
        &[
            Some(v1(DType::F32, &[2.5, 3.5, -129.5, f64::NAN])),
            Some(t(DType::F32, &[], &[1.0])),
            Some(ti(DType::I8, &[], &[0])),
        ],
    );
    assert_eq!(r.to_i64_vec().unwrap(), vec![2, 4, -128, 0]);
}

#[test]
fn quantize_to_float8_with_and_without_saturation() {
    let f8 = [DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ];
    for od in f8 {
        for sat in [1, 0] {
            for xd in [DType::F32, DType::F16] {
                let ins = [Some(qx(xd)), Some(t(DType::F32, &[], &[0.5])), Some(t(od, &[], &[0.0]))];
                check(&q(&[("saturate", int(sat))]), &ins, Bind::Runtime, EXACT);
                let ins =
                    [Some(qx(xd)), Some(v1(DType::F32, &[0.5, 2.0, 0.25, 1.0])), Some(v1(od, &[0.0, 1.0, -2.0, 0.5]))];
                check(&q(&[("saturate", int(sat)), ("axis", int(0))]), &ins, Bind::Runtime, EXACT);
            }
        }
    }
    // f6 (no ONNX code: through the zero point's dtype) and a bf16 scale.
    for od in [DType::F6E3M2FN, DType::F4E2M1FN] {
        let ins = [Some(qx(DType::F32)), Some(t(DType::BF16, &[], &[0.5])), Some(t(od, &[], &[1.0]))];
        check(&q(&[]), &ins, Bind::Runtime, EXACT);
    }
    let ins = [Some(qx(DType::F32)), Some(t(DType::F32, &[], &[0.5]))];
    for code in [23, 24] {
        check(&q(&[("output_dtype", int(code))]), &ins, Bind::Runtime, EXACT);
    }
}

#[test]
fn quantize_per_axis_and_blocked() {
    let x = rand(DType::F32, &[3, 4, 5], 7);
    // Per axis, with positive and negative axes.
    for (axis, n) in [(0i64, 3usize), (1, 4), (2, 5), (-1, 5), (-3, 3)] {
        let sc: Vec<f64> = (0..n).map(|i| 0.01 + 0.007 * i as f64).collect();
        let zp: Vec<i64> = (0..n).map(|i| i as i64 * 3 - 4).collect();
        for od in [DType::I8, DType::I16, DType::I4] {
            let ins = [Some(x.clone()), Some(v1(DType::F32, &sc)), Some(ti(od, &[n], &zp))];
            for bind in [Bind::Runtime, Bind::ConstFrom(1)] {
                check(&q(&[("axis", int(axis))]), &ins, bind, EXACT);
            }
        }
        check(&q(&[("axis", int(axis))]), &[Some(x.clone()), Some(v1(DType::F16, &sc))], Bind::Runtime, EXACT);
    }
    // Blocked along each axis, with blocks that do not divide the extent.
    for (axis, block) in [(0i64, 2usize), (1, 3), (2, 2), (-1, 5), (1, 4)] {
        let a = if axis < 0 { (axis + 3) as usize } else { axis as usize };
        let mut sd: Vec<usize> = vec![3, 4, 5];
        sd[a] = sd[a].div_ceil(block);
        let n: usize = sd.iter().product();
        let sc: Vec<f64> = (0..n).map(|i| 0.02 + 0.003 * i as f64).collect();
        let zp: Vec<i64> = (0..n).map(|i| (i as i64 % 7) * 20).collect();
        let ins = [Some(x.clone()), Some(t(DType::F32, &sd, &sc)), Some(ti(DType::U8, &sd, &zp))];
        check(&q(&[("axis", int(axis)), ("block_size", int(block as i64))]), &ins, Bind::Runtime, EXACT);
    }
}

#[test]
fn dequantize_all_forms() {
    let ints = [DType::U8, DType::I8, DType::U16, DType::I16, DType::I4, DType::U4, DType::I32];
    for xd in ints {
        let x = rand(xd, &[3, 4, 5], 1);
        let big =
            if xd == DType::I32 { ti(xd, &[4], &[i32::MAX as i64, i32::MIN as i64, 123456789, -7]) } else { x.clone() };
        for sd in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            for scale in [0.1, 3.0, 1e-3] {
                for bind in [Bind::Runtime, Bind::ConstFrom(1)] {
                    let sc = t(sd, &[], &[scale]);
                    check(&dq(&[]), &[Some(x.clone()), Some(sc.clone())], bind, EXACT);
                    check(&dq(&[]), &[Some(big.clone()), Some(sc.clone())], bind, EXACT);
                    let zp = t(xd, &[], &[if xd.is_unsigned_int() { 5.0 } else { -3.0 }]);
                    check(&dq(&[]), &[Some(x.clone()), Some(sc), Some(zp)], bind, EXACT);
                }
            }
            // Per axis and blocked.
            let sc = v1(sd, &[0.5, 0.03, 7.0, 0.0011]);
            let zp = v1(xd, &[1.0, 2.0, 3.0, 4.0]);
            check(&dq(&[("axis", int(-2))]), &[Some(x.clone()), Some(sc.clone()), Some(zp)], Bind::Runtime, EXACT);
            let sc = t(sd, &[3, 4, 2], &(0..24).map(|i| 0.01 * (i + 1) as f64).collect::<Vec<_>>());
            check(&dq(&[("axis", int(2)), ("block_size", int(3))]), &[Some(x.clone()), Some(sc)], Bind::Runtime, EXACT);
        }
    }
    for xd in [
        DType::F8E4M3FN,
        DType::F8E4M3FNUZ,
        DType::F8E5M2,
        DType::F8E5M2FNUZ,
        DType::F8E8M0FNU,
        DType::F4E2M1FN,
        DType::F6E3M2FN,
    ] {
        let x = rand(xd, &[2, 6], 3);
        for sd in [DType::F32, DType::F16, DType::BF16, DType::F64] {
            check(&dq(&[]), &[Some(x.clone()), Some(t(sd, &[], &[0.37]))], Bind::Runtime, EXACT);
            let ins = [Some(x.clone()), Some(v1(sd, &[0.37, 3.0])), Some(v1(xd, &[0.5, 1.0]))];
            check(&dq(&[("axis", int(0))]), &ins, Bind::Runtime, EXACT);
        }
    }
    // Hand-checked: (200 − 128)·0.5 = 36.
    let r = run(
        &dq(&[]),
        &[Some(ti(DType::U8, &[1], &[200])), Some(t(DType::F32, &[], &[0.5])), Some(ti(DType::U8, &[], &[128]))],
    );
    assert_eq!(r.to_f64_vec(), vec![36.0]);
}

// ---------------------------------------------------------------------------
// Shapes and structure.
// ---------------------------------------------------------------------------

#[test]
fn empty_tensors() {
    let e = rand(DType::F32, &[0, 3], 1);
    two(OpKind::Add, &[], e.clone(), rand(DType::F32, &[3], 2), EXACT);
    two(OpKind::Add, &[], rand(DType::F32, &[2, 0, 1], 1), rand(DType::F32, &[4], 2), EXACT);
    one(OpKind::Sigmoid, &[], e.clone(), EXACT);
    check(&cast_op(DType::I8, None), &[Some(e.clone())], Bind::Runtime, EXACT);
    check(&op(OpKind::Sum, &[]), &[Some(e.clone()), Some(e.clone()), Some(e.clone())], Bind::Runtime, EXACT);
    let ins = [Some(e), Some(t(DType::F32, &[], &[0.5])), Some(ti(DType::U8, &[], &[1]))];
    check(&q(&[]), &ins, Bind::Runtime, EXACT);
}

#[test]
fn one_kernel_reading_each_operand_at_its_broadcast_index() {
    let a = rand(DType::F32, &[4, 1, 3], 1);
    let b = rand(DType::F32, &[5, 1], 2);
    let l = lowered(&op(OpKind::Add, &[]), &[Some(a), Some(b)], &[]);
    assert_eq!(l.steps.len(), 1);
    let k = kernels(&l)[0];
    assert_eq!(k.output.shape.dims(), &[4, 5, 3]);
    let loads: Vec<usize> = k
        .nodes
        .iter()
        .filter_map(|n| if let Expr::Load { index, .. } = &n.expr { Some(index.len()) } else { None })
        .collect();
    assert_eq!(loads, vec![3, 2]);
    // Sum of four operands is one kernel with four inputs.
    let ins: Vec<Option<Tensor>> = (0..4).map(|i| Some(floats(&[2], &[i as f64, 1.0]))).collect();
    let l = lowered(&op(OpKind::Sum, &[]), &ins, &[]);
    assert_eq!(l.steps.len(), 1);
    assert_eq!(kernels(&l)[0].inputs.len(), 4);
}

// ---------------------------------------------------------------------------
// Corner cases of integer ranges, acosh's domain and rounding once to narrow floats.
// ---------------------------------------------------------------------------

#[test]
fn u64_products() {
    two(OpKind::Mul, &[], rand(DType::U64, &[3, 7], 1), rand(DType::U64, &[7], 2), EXACT);
    two(OpKind::Mul, &[], ti(DType::U64, &[2], &[-1, 1 << 40]), ti(DType::U64, &[2], &[-1, 1 << 30]), EXACT);
    let p = op(OpKind::Pow, &[]);
    let base = ti(DType::U64, &[4, 1], &[0, 2, 3, -1]);
    check(&p, &[Some(base.clone()), Some(ti(DType::U64, &[3], &[0, 5, 65]))], Bind::Runtime, EXACT);
    check(&p, &[Some(base), Some(ti(DType::I64, &[], &[7]))], Bind::ConstFrom(1), EXACT);
}

#[test]
fn acosh_below_minus_one_is_nan() {
    for d in FLOATS {
        one(OpKind::Acosh, &[], v1(d, &[-100.0, -3.0, -2.0, f64::NEG_INFINITY]), tol(d));
    }
}

#[test]
fn wide_integers_to_f16_bf16_round_once() {
    // 2^24 + 2^16 + 3 is just above a bf16 tie: it rounds up to 2^24 + 2^17.
    let r = run(&cast_op(DType::BF16, None), &[Some(ti(DType::I32, &[1], &[(1 << 24) + (1 << 16) + 3]))]);
    assert_eq!(r.to_f64_vec(), vec![16908288.0]);
    for from in [DType::I32, DType::I64, DType::U32, DType::U64] {
        let x = ti(from, &[4], &[65505, 65519, (1 << 24) + (1 << 16) + 1, -(1 << 24) - (1 << 16) - 3]);
        for to in [DType::F16, DType::BF16] {
            check(&cast_op(to, None), &[Some(x.clone())], Bind::Runtime, EXACT);
        }
    }
}

#[test]
fn f64_to_narrow_floats_round_once() {
    // Just above a tie of the target: single rounding goes up, a rounding that loses
    // the low bits first lands on the tie and goes to even (down).
    let cases = [
        (DType::F16, 1.0 + 2f64.powi(-11) + 2f64.powi(-40), 1.0 + 2f64.powi(-10)),
        (DType::BF16, 1.0 + 2f64.powi(-8) + 2f64.powi(-40), 1.0 + 2f64.powi(-7)),
        (DType::F8E4M3FN, 1.0 + 2f64.powi(-4) + 2f64.powi(-40), 1.125),
        (DType::F8E5M2, 1.0 + 2f64.powi(-3) + 2f64.powi(-40), 1.25),
    ];
    for (to, x, want) in cases {
        let r = run(&cast_op(to, None), &[Some(v1(DType::F64, &[x]))]);
        assert_eq!(r.to_f64_vec(), vec![want], "{to}");
    }
}
