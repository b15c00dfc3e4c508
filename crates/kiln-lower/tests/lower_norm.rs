//! Lowering of the normalisations and composite ops (Softmax family, LayerNorm,
//! BatchNorm, InstanceNorm, GroupNorm, LRN, LpNormalization, MeanVarianceNormalization,
//! DynamicQuantizeLinear, TopK, RNN, GRU, LSTM), checked against the reference evaluator
//! (kernels run by the kernel interpreter), plus hand-computed values and structural
//! checks (kernel counts).

mod common;

use common::{check, floats, infer_types, int, lower, op, rand, s, t, typed_i, Bind, Tol, EXACT, F32};
use kiln_ir::{Attr, DType, Op, OpKind, Tensor, TensorType};
use kiln_lower::{interpret, lower_op, Lowered, OpCx, OpInput};

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn flt(v: f32) -> Attr {
    Attr::Float(v)
}

fn strs(v: &[&str]) -> Attr {
    Attr::Strings(v.iter().map(|x| x.to_string()).collect())
}

fn ti(d: DType, dims: &[usize], v: &[i64]) -> Tensor {
    typed_i(d, dims, v)
}

/// Positive values (variances).
fn pos(d: DType, dims: &[usize], seed: u64) -> Tensor {
    let v: Vec<f64> = rand(DType::F64, dims, seed).to_f64_vec().iter().map(|x| x.abs() + 0.25).collect();
    t(d, dims, &v)
}

const F16: Tol = Tol { rtol: 4e-3, atol: 2e-3 };
const BF16: Tol = Tol { rtol: 2e-2, atol: 1e-2 };
const F64: Tol = Tol { rtol: 1e-12, atol: 1e-13 };
/// Sums of tens of f32 terms, divided by small standard deviations.
const F32L: Tol = Tol { rtol: 1e-4, atol: 1e-5 };

fn tol(d: DType) -> Tol {
    match d {
        DType::F64 => F64,
        DType::F16 => F16,
        DType::BF16 => BF16,
        _ => F32L,
    }
}

const FLOATS: [DType; 4] = [DType::F32, DType::F64, DType::F16, DType::BF16];

fn out_types(op: &Op, inputs: &[Option<Tensor>], n: usize) -> Vec<TensorType> {
    infer_types(op, inputs, n)
}

/// Lowers `op` with `n` results and operands from `first_const` on constant.
fn lowered(op: &Op, inputs: &[Option<Tensor>], first_const: usize, n: usize) -> (Lowered, Vec<TensorType>) {
    let out = out_types(op, inputs, n);
    (lower(op, inputs, |i| i >= first_const, &out), out)
}

/// Lowers and runs `op`, returning its results (for hand-computed expectations).
fn run(op: &Op, inputs: &[Option<Tensor>], first_const: usize, n: usize) -> Vec<Tensor> {
    let (l, out) = lowered(op, inputs, first_const, n);
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    interpret(&l, &refs, &out).unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol * (1.0 + b.abs()), "element {i}: got {a}, want {b}");
    }
}

fn one(kind: OpKind, attrs: &[(&str, Attr)], x: Tensor, tol: Tol) {
    check(&op(kind, attrs), &[Some(x)], Bind::Runtime, tol);
}

// ---------------------------------------------------------------------------
// Softmax, LogSoftmax, Hardmax.
// ---------------------------------------------------------------------------

#[test]
fn softmax_and_log_softmax_on_every_float_dtype_and_axis() {
    for kind in [OpKind::Softmax, OpKind::LogSoftmax] {
        for d in FLOATS {
            one(kind, &[], rand(d, &[3, 17], 1), tol(d));
            for axis in [-3, -2, -1, 0, 1, 2] {
                one(kind, &[("axis", int(axis))], rand(d, &[2, 3, 5], 2), tol(d));
            }
        }
        one(kind, &[], rand(DType::F32, &[7], 3), F32);
        one(kind, &[], rand(DType::F32, &[1], 3), F32);
        one(kind, &[("axis", int(1))], rand(DType::F32, &[4, 5, 1], 4), F32);
        one(kind, &[("axis", int(0))], rand(DType::F32, &[1, 1, 6], 4), F32);
        // Empty tensors.
        one(kind, &[], rand(DType::F32, &[0, 3], 5), F32);
        one(kind, &[], rand(DType::F32, &[3, 0], 5), F32);
    }
}

#[test]
fn softmax_special_values() {
    let inf = f64::INFINITY;
    let rows: [[f64; 4]; 6] = [
        [1000.0, 1000.0, -1000.0, 0.0],
        [-inf, 0.0, 1.0, 2.0],
        [-inf, -inf, -inf, -inf],
        [inf, 0.0, 1.0, 2.0],
        [f64::NAN, 0.0, 1.0, 2.0],
        [-0.0, 0.0, 88.0, -88.0],
    ];
    let v: Vec<f64> = rows.iter().flatten().copied().collect();
    for kind in [OpKind::Softmax, OpKind::LogSoftmax, OpKind::Hardmax] {
        one(kind, &[], floats(&[6, 4], &v), F32);
        one(kind, &[("axis", int(0))], floats(&[6, 4], &v), F32);
    }
}

#[test]
fn softmax_hand_values() {
    // Softmax of [0, ln 3] is [1/4, 3/4]; LogSoftmax is ln of that.
    let x = floats(&[2], &[0.0, 3f64.ln()]);
    let y = run(&op(OpKind::Softmax, &[]), &[Some(x.clone())], 1, 1).remove(0);
    close(&y.to_f64_vec(), &[0.25, 0.75], 1e-6);
    let y = run(&op(OpKind::LogSoftmax, &[]), &[Some(x)], 1, 1).remove(0);
    close(&y.to_f64_vec(), &[0.25f64.ln(), 0.75f64.ln()], 1e-6);
}

#[test]
fn softmax_is_one_kernel_along_the_last_axis_and_three_along_a_middle_one() {
    let x = rand(DType::F32, &[2, 3, 5], 1);
    let (l, _) = lowered(&op(OpKind::Softmax, &[]), &[Some(x.clone())], 1, 1);
    assert_eq!(l.steps.len(), 1);
    // Trailing dimensions of extent 1 do not count as inner.
    let (l, _) = lowered(&op(OpKind::Softmax, &[("axis", int(1))]), &[Some(rand(DType::F32, &[2, 3, 1], 1))], 1, 1);
    assert_eq!(l.steps.len(), 1);
    let (l, _) = lowered(&op(OpKind::Softmax, &[("axis", int(1))]), &[Some(x.clone())], 1, 1);
    assert_eq!(l.steps.len(), 3);
    let (l, _) = lowered(&op(OpKind::Hardmax, &[("axis", int(0))]), &[Some(x)], 1, 1);
    assert_eq!(l.steps.len(), 2);
}

#[test]
fn hardmax_ties_nan_and_dtypes() {
    for d in FLOATS {
        one(OpKind::Hardmax, &[], rand(d, &[4, 9], 7), EXACT);
        for axis in [-3, 0, 1, 2] {
            one(OpKind::Hardmax, &[("axis", int(axis))], rand(d, &[2, 3, 5], 8), EXACT);
        }
    }
    let nan = f64::NAN;
    let v = [
        1.0,
        3.0,
        3.0,
        2.0, // tie: the first maximum
        nan,
        5.0,
        nan,
        1.0, // the first NaN
        1.0,
        2.0,
        f64::INFINITY,
        nan, // a NaN beats +inf
        -1.0,
        -1.0,
        -1.0,
        -1.0,
    ];
    let x = floats(&[4, 4], &v);
    let y = run(&op(OpKind::Hardmax, &[]), &[Some(x.clone())], 1, 1).remove(0);
    let want = [0., 1., 0., 0., 1., 0., 0., 0., 0., 0., 0., 1., 1., 0., 0., 0.];
    assert_eq!(y.to_f64_vec(), want);
    one(OpKind::Hardmax, &[], x.clone(), EXACT);
    one(OpKind::Hardmax, &[("axis", int(0))], x, EXACT);
}

// ---------------------------------------------------------------------------
// LayerNormalization.
// ---------------------------------------------------------------------------

fn layer_norm(attrs: &[(&str, Attr)], x: Tensor, scale: Tensor, bias: Option<Tensor>, tol: Tol) {
    check(&op(OpKind::LayerNormalization, attrs), &[Some(x), Some(scale), bias], Bind::Runtime, tol);
}

#[test]
fn layer_norm_axes_dtypes_and_broadcast_parameters() {
    for d in FLOATS {
        let x = rand(d, &[2, 3, 7], 1);
        layer_norm(&[], x.clone(), rand(d, &[7], 2), Some(rand(d, &[7], 3)), tol(d));
        layer_norm(&[("axis", int(1))], x.clone(), rand(d, &[3, 7], 2), Some(rand(d, &[7], 3)), tol(d));
        layer_norm(&[("axis", int(-2))], x.clone(), rand(d, &[1, 7], 2), None, tol(d));
        layer_norm(&[("axis", int(0))], x.clone(), rand(d, &[2, 3, 7], 2), Some(rand(d, &[1], 3)), tol(d));
        layer_norm(&[("epsilon", flt(0.5))], x, rand(d, &[7], 2), None, tol(d));
    }
    layer_norm(&[], rand(DType::F32, &[17], 4), rand(DType::F32, &[17], 5), None, F32L);
    layer_norm(&[], rand(DType::F32, &[5, 1], 4), rand(DType::F32, &[1], 5), None, F32L);
}

#[test]
fn layer_norm_stash_types() {
    // f64 statistics for an f32 operand; f16 results for the statistics.
    let x = rand(DType::F32, &[3, 7], 1);
    let sc = rand(DType::F32, &[7], 2);
    layer_norm(&[("stash_type", int(11))], x.clone(), sc.clone(), None, F32L);
    layer_norm(&[("stash_type", int(10))], x.clone(), sc.clone(), None, F16);
    layer_norm(&[("stash_type", int(1))], rand(DType::F64, &[3, 7], 1), rand(DType::F64, &[7], 2), None, F64);
    let (l, out) = lowered(&op(OpKind::LayerNormalization, &[("stash_type", int(11))]), &[Some(x), Some(sc)], 9, 3);
    assert_eq!(out[1].dtype, DType::F64);
    assert_eq!(l.outputs.len(), 3);
}

#[test]
fn layer_norm_hand_values_and_structure() {
    // Row [1, 3]: mean 2, variance 1, InvStdDev 1/sqrt(1 + eps) (eps = 0 here).
    let x = floats(&[1, 2], &[1.0, 3.0]);
    let sc = floats(&[2], &[2.0, 1.0]);
    let b = floats(&[2], &[0.5, 0.0]);
    let o = op(OpKind::LayerNormalization, &[("epsilon", flt(0.0))]);
    let r = run(&o, &[Some(x.clone()), Some(sc.clone()), Some(b.clone())], 9, 3);
    close(&r[0].to_f64_vec(), &[-1.5, 1.0], 1e-6);
    close(&r[1].to_f64_vec(), &[2.0], 1e-7);
    close(&r[2].to_f64_vec(), &[1.0], 1e-7);
    // Y alone is one kernel: the statistics are inline.
    let (l, _) = lowered(&o, &[Some(x), Some(sc), Some(b)], 9, 1);
    assert_eq!(l.steps.len(), 1);
}

#[test]
fn layer_norm_of_empty_rows() {
    // The statistics of an empty row are NaN (0/0) as in the reference.
    layer_norm(&[("axis", int(1))], rand(DType::F32, &[3, 0], 1), rand(DType::F32, &[0], 2), None, F32);
    layer_norm(&[], rand(DType::F32, &[0, 4], 1), rand(DType::F32, &[4], 2), None, F32);
}

// ---------------------------------------------------------------------------
// BatchNormalization, InstanceNormalization, GroupNormalization.
// ---------------------------------------------------------------------------

#[test]
fn batch_norm_dtypes_and_ranks() {
    for d in FLOATS {
        for dims in [vec![3, 4], vec![2, 4, 5], vec![2, 4, 3, 3]] {
            let c = dims[1];
            let ins = [
                Some(rand(d, &dims, 1)),
                Some(rand(d, &[c], 2)),
                Some(rand(d, &[c], 3)),
                Some(rand(d, &[c], 4)),
                Some(pos(d, &[c], 5)),
            ];
            check(&op(OpKind::BatchNormalization, &[]), &ins, Bind::Runtime, tol(d));
            check(&op(OpKind::BatchNormalization, &[("epsilon", flt(0.1))]), &ins, Bind::ConstFrom(1), tol(d));
        }
    }
    // Parameters of another float dtype than X.
    let ins = [
        Some(rand(DType::F16, &[2, 3, 4], 1)),
        Some(rand(DType::F32, &[3], 2)),
        Some(rand(DType::F32, &[3], 3)),
        Some(rand(DType::F64, &[3], 4)),
        Some(pos(DType::F64, &[3], 5)),
    ];
    check(&op(OpKind::BatchNormalization, &[]), &ins, Bind::Runtime, F16);
    let ins = [
        Some(rand(DType::F32, &[0, 3], 1)),
        Some(rand(DType::F32, &[3], 2)),
        Some(rand(DType::F32, &[3], 3)),
        Some(rand(DType::F32, &[3], 4)),
        Some(pos(DType::F32, &[3], 5)),
    ];
    check(&op(OpKind::BatchNormalization, &[]), &ins, Bind::Runtime, F32);
}

#[test]
fn batch_norm_hand_value() {
    // (5 − 1)/sqrt(3 + 1)·3 + 0.5 = 6.5 with ε = 1.
    let o = op(OpKind::BatchNormalization, &[("epsilon", flt(1.0))]);
    let ins = [
        Some(floats(&[1, 1], &[5.0])),
        Some(floats(&[1], &[3.0])),
        Some(floats(&[1], &[0.5])),
        Some(floats(&[1], &[1.0])),
        Some(floats(&[1], &[3.0])),
    ];
    let y = run(&o, &ins, 9, 1).remove(0);
    assert_eq!(y.to_f64_vec(), [6.5]);
}

#[test]
fn instance_norm_dtypes_and_ranks() {
    for d in FLOATS {
        for dims in [vec![2, 3, 7], vec![1, 4, 3, 5], vec![2, 2, 1, 1]] {
            let c = dims[1];
            let ins = [Some(rand(d, &dims, 1)), Some(rand(d, &[c], 2)), Some(rand(d, &[c], 3))];
            check(&op(OpKind::InstanceNormalization, &[]), &ins, Bind::Runtime, tol(d));
            check(&op(OpKind::InstanceNormalization, &[("epsilon", flt(0.01))]), &ins, Bind::Runtime, tol(d));
        }
    }
    let ins = [Some(rand(DType::F32, &[2, 3, 0], 1)), Some(rand(DType::F32, &[3], 2)), Some(rand(DType::F32, &[3], 3))];
    check(&op(OpKind::InstanceNormalization, &[]), &ins, Bind::Runtime, F32);
    let (l, _) = lowered(
        &op(OpKind::InstanceNormalization, &[]),
        &[Some(rand(DType::F32, &[2, 3, 7], 1)), Some(rand(DType::F32, &[3], 2)), Some(rand(DType::F32, &[3], 3))],
        9,
        1,
    );
    assert_eq!(l.steps.len(), 1);
}

#[test]
fn group_norm_groups_and_dtypes() {
    for d in FLOATS {
        for (dims, groups) in
            [(vec![2, 6, 5], vec![1, 2, 3, 6]), (vec![1, 4, 2, 3], vec![1, 2, 4]), (vec![3, 4], vec![1, 2, 4])]
        {
            let c = dims[1];
            for g in groups {
                let ins = [Some(rand(d, &dims, 1)), Some(rand(d, &[c], 2)), Some(rand(d, &[c], 3))];
                check(&op(OpKind::GroupNormalization, &[("num_groups", int(g))]), &ins, Bind::Runtime, tol(d));
            }
        }
    }
    let ins = [Some(rand(DType::F32, &[2, 4, 3], 1)), Some(rand(DType::F32, &[4], 2)), Some(rand(DType::F32, &[4], 3))];
    check(&op(OpKind::GroupNormalization, &[("num_groups", int(2)), ("epsilon", flt(0.3))]), &ins, Bind::Runtime, F32L);
    // Several channels per group: statistics kernels first; one channel: one kernel.
    let (l, _) = lowered(&op(OpKind::GroupNormalization, &[("num_groups", int(2))]), &ins, 9, 1);
    assert_eq!(l.steps.len(), 3);
    let (l, _) = lowered(&op(OpKind::GroupNormalization, &[("num_groups", int(4))]), &ins, 9, 1);
    assert_eq!(l.steps.len(), 1);
    let ins = [Some(rand(DType::F32, &[0, 4, 3], 1)), Some(rand(DType::F32, &[4], 2)), Some(rand(DType::F32, &[4], 3))];
    check(&op(OpKind::GroupNormalization, &[("num_groups", int(2))]), &ins, Bind::Runtime, F32);
}

#[test]
fn group_norm_hand_value() {
    // One group of two channels [1], [3]: mean 2, variance 1 (ε = 0): [−1, 1]·scale + bias.
    let o = op(OpKind::GroupNormalization, &[("num_groups", int(1)), ("epsilon", flt(0.0))]);
    let ins = [Some(floats(&[1, 2, 1], &[1.0, 3.0])), Some(floats(&[2], &[2.0, 3.0])), Some(floats(&[2], &[0.0, 1.0]))];
    let y = run(&o, &ins, 9, 1).remove(0);
    close(&y.to_f64_vec(), &[-2.0, 4.0], 1e-6);
}

// ---------------------------------------------------------------------------
// LRN, LpNormalization, MeanVarianceNormalization.
// ---------------------------------------------------------------------------

#[test]
fn lrn_sizes_and_attributes() {
    for d in FLOATS {
        for size in [1, 2, 3, 4, 5, 9] {
            one(OpKind::LRN, &[("size", int(size))], rand(d, &[2, 7, 3], 1), tol(d));
        }
        one(
            OpKind::LRN,
            &[("size", int(3)), ("alpha", flt(0.5)), ("beta", flt(0.3)), ("bias", flt(2.0))],
            rand(d, &[1, 5, 2, 2], 2),
            tol(d),
        );
    }
    one(OpKind::LRN, &[("size", int(3))], rand(DType::F32, &[4, 1, 1], 3), F32);
    one(OpKind::LRN, &[("size", int(3))], rand(DType::F32, &[0, 3, 2], 3), F32);
}

#[test]
fn lrn_hand_value() {
    // Channels [1, 2, 2], size 3, α = 3, β = 1, bias 1: channel 0 sums 1 + 4 = 5 →
    // 1/(1 + 5) ; channel 1 sums 9 → 2/10; channel 2 sums 8 → 2/9.
    let o = op(OpKind::LRN, &[("size", int(3)), ("alpha", flt(3.0)), ("beta", flt(1.0))]);
    let y = run(&o, &[Some(floats(&[1, 3, 1], &[1.0, 2.0, 2.0]))], 9, 1).remove(0);
    close(&y.to_f64_vec(), &[1.0 / 6.0, 0.2, 2.0 / 9.0], 1e-6);
}

#[test]
fn lp_norm_orders_axes_and_zero_rows() {
    for d in FLOATS {
        for p in [1, 2] {
            for axis in [-1, 0, 1, 2] {
                one(OpKind::LpNormalization, &[("p", int(p)), ("axis", int(axis))], rand(d, &[3, 4, 5], 1), tol(d));
            }
        }
    }
    let x = floats(&[2, 3], &[0.0, 0.0, 0.0, 3.0, 0.0, -4.0]);
    for p in [1, 2] {
        one(OpKind::LpNormalization, &[("p", int(p))], x.clone(), F32);
    }
    let y = run(&op(OpKind::LpNormalization, &[]), &[Some(x)], 9, 1).remove(0);
    close(&y.to_f64_vec(), &[0.0, 0.0, 0.0, 0.6, 0.0, -0.8], 1e-7);
}

#[test]
fn mvn_axes() {
    for d in FLOATS {
        let x = rand(d, &[2, 3, 2, 5], 1);
        one(OpKind::MeanVarianceNormalization, &[], x.clone(), tol(d));
        for axes in [vec![2, 3], vec![1], vec![0], vec![-1, 1], vec![0, 1, 2, 3]] {
            one(OpKind::MeanVarianceNormalization, &[("axes", Attr::Ints(axes))], x.clone(), tol(d));
        }
    }
    one(OpKind::MeanVarianceNormalization, &[("axes", Attr::Ints(vec![1]))], rand(DType::F32, &[17, 7], 3), F32L);
    // The default axes with a batch above 1 compute the statistics first.
    let (l, _) =
        lowered(&op(OpKind::MeanVarianceNormalization, &[]), &[Some(rand(DType::F32, &[2, 3, 2, 5], 1))], 9, 1);
    assert_eq!(l.steps.len(), 3);
    let (l, _) =
        lowered(&op(OpKind::MeanVarianceNormalization, &[]), &[Some(rand(DType::F32, &[1, 3, 2, 5], 1))], 9, 1);
    assert_eq!(l.steps.len(), 1);
}

// ---------------------------------------------------------------------------
// DynamicQuantizeLinear.
// ---------------------------------------------------------------------------

#[test]
fn dynamic_quantize_values() {
    let cases = [
        rand(DType::F32, &[3, 7], 1),
        floats(&[4], &[0.0, 0.0, 0.0, 0.0]),
        floats(&[5], &[1.0, 2.0, 3.0, 4.0, 255.0]),
        floats(&[5], &[-1.0, -2.0, -3.0, -4.0, -255.0]),
        floats(&[6], &[f64::NAN, -1.5, 2.5, 0.0, 100.0, -0.5]),
        floats(&[3], &[f64::INFINITY, 1.0, -1.0]),
        floats(&[1], &[-7.0]),
        floats(&[0], &[]),
        floats(&[], &[3.0]),
    ];
    for x in cases {
        one(OpKind::DynamicQuantizeLinear, &[], x, EXACT);
    }
    for d in [DType::F64, DType::F16] {
        one(OpKind::DynamicQuantizeLinear, &[], rand(d, &[2, 9], 4), EXACT);
    }
}

#[test]
fn dynamic_quantize_hand_value() {
    // Range [−1, 254]·(1/1): scale 1, zero point 1; y = x + 1.
    let x = floats(&[3], &[-1.0, 0.0, 254.0]);
    let r = run(&op(OpKind::DynamicQuantizeLinear, &[]), &[Some(x)], 9, 3);
    assert_eq!(r[0].to_i64_vec().unwrap(), [0, 1, 255]);
    assert_eq!(r[1].to_f64_vec(), [1.0]);
    assert_eq!(r[2].to_i64_vec().unwrap(), [1]);
}

// ---------------------------------------------------------------------------
// TopK.
// ---------------------------------------------------------------------------

fn topk(attrs: &[(&str, Attr)], x: Tensor, k: i64) {
    let ins = [Some(x), Some(ti(DType::I64, &[1], &[k]))];
    check(&op(OpKind::TopK, attrs), &ins, Bind::ConstFrom(1), EXACT);
}

#[test]
fn topk_dtypes_axes_and_orders() {
    for d in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8, DType::I8, DType::U64]
    {
        for largest in [0, 1] {
            for k in [0, 1, 3, 7] {
                topk(&[("largest", int(largest))], rand(d, &[3, 7], 1), k);
            }
            topk(&[("largest", int(largest)), ("axis", int(1))], rand(d, &[2, 5, 3], 2), 2);
            topk(&[("largest", int(largest)), ("axis", int(0)), ("sorted", int(0))], rand(d, &[4, 3], 3), 4);
        }
    }
    topk(&[], rand(DType::F32, &[17], 4), 5);
    topk(&[], rand(DType::F32, &[0, 4], 4), 2);
    topk(&[("axis", int(0))], rand(DType::F32, &[0, 4], 4), 0);
}

#[test]
fn topk_ties_and_nan() {
    let nan = f64::NAN;
    let v = [3.0, nan, 1.0, 3.0, -0.0, 0.0, nan, f64::NEG_INFINITY, f64::INFINITY];
    let x = floats(&[9], &v);
    for largest in [0, 1] {
        for k in [1, 4, 9] {
            topk(&[("largest", int(largest))], x.clone(), k);
        }
    }
    // Hand-checked order: NaNs first (lower position first), +inf, then the two 3s.
    let r = run(&op(OpKind::TopK, &[]), &[Some(x.clone()), Some(ti(DType::I64, &[1], &[5]))], 1, 2);
    assert_eq!(r[1].to_i64_vec().unwrap(), [1, 6, 8, 0, 3]);
    let r = run(&op(OpKind::TopK, &[("largest", int(0))]), &[Some(x), Some(ti(DType::I64, &[1], &[4]))], 1, 2);
    assert_eq!(r[1].to_i64_vec().unwrap(), [7, 4, 5, 2]);
    assert_eq!(r[0].to_f64_vec()[0], f64::NEG_INFINITY);
    let ints = ti(DType::I32, &[2, 4], &[5, 5, 1, 5, 2, 2, 2, 2]);
    topk(&[], ints.clone(), 3);
    topk(&[("largest", int(0))], ints, 3);
}

#[test]
fn topk_needs_a_constant_k() {
    let ins = [Some(rand(DType::F32, &[4], 1)), Some(ti(DType::I64, &[1], &[2]))];
    let out = out_types(&op(OpKind::TopK, &[]), &ins, 2);
    let opin: Vec<Option<OpInput>> =
        ins.iter().map(|t| t.as_ref().map(|t| OpInput { ty: t.ty(), value: None })).collect();
    let o = op(OpKind::TopK, &[]);
    let cx = OpCx { op: &o, name: "t", inputs: &opin, outputs: &out };
    assert!(lower_op(&cx).is_err());
}

// ---------------------------------------------------------------------------
// RNN, GRU, LSTM.
// ---------------------------------------------------------------------------

/// Operands of a recurrent layer: X, W, R, B?, sequence_lens?, initial_h?, initial_c?, P?.
#[derive(Clone, Copy)]
struct Rec {
    kind: OpKind,
    d: DType,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    nd: usize,
    layout: i64,
    bias: bool,
    lens: Option<&'static [i64]>,
    init: bool,
    peep: bool,
}

impl Rec {
    fn new(kind: OpKind) -> Rec {
        Rec {
            kind,
            d: DType::F32,
            seq: 4,
            batch: 3,
            input: 5,
            hidden: 2,
            nd: 1,
            layout: 0,
            bias: true,
            lens: None,
            init: false,
            peep: false,
        }
    }

    fn gates(&self) -> usize {
        match self.kind {
            OpKind::LSTM => 4,
            OpKind::GRU => 3,
            _ => 1,
        }
    }

    fn inputs(&self) -> Vec<Option<Tensor>> {
        let (d, g, h) = (self.d, self.gates(), self.hidden);
        let xd = if self.layout == 0 { [self.seq, self.batch, self.input] } else { [self.batch, self.seq, self.input] };
        let sd = if self.layout == 0 { [self.nd, self.batch, h] } else { [self.batch, self.nd, h] };
        // Weights scaled down so the states stay in the activations' sensitive range.
        let scaled = |dims: &[usize], seed: u64, f: f64| {
            let v: Vec<f64> = rand(DType::F64, dims, seed).to_f64_vec().iter().map(|x| x * f).collect();
            t(d, dims, &v)
        };
        let mut v = vec![
            Some(rand(d, &xd, 1)),
            Some(scaled(&[self.nd, g * h, self.input], 2, 0.5)),
            Some(scaled(&[self.nd, g * h, h], 3, 0.5)),
            self.bias.then(|| scaled(&[self.nd, 2 * g * h], 4, 0.5)),
            self.lens.map(|l| ti(DType::I32, &[self.batch], l)),
            self.init.then(|| rand(d, &sd, 5)),
        ];
        if self.kind == OpKind::LSTM {
            v.push(self.init.then(|| rand(d, &sd, 6)));
            v.push(self.peep.then(|| scaled(&[self.nd, 3 * h], 7, 0.5)));
        }
        while v.last().is_some_and(|x| x.is_none()) {
            v.pop();
        }
        v
    }

    fn attrs(&self, extra: &[(&str, Attr)]) -> Vec<(String, Attr)> {
        let dir = match self.nd {
            2 => "bidirectional",
            _ => "forward",
        };
        let mut a = vec![
            ("direction".to_string(), s(dir)),
            ("layout".to_string(), int(self.layout)),
            ("hidden_size".to_string(), int(self.hidden as i64)),
        ];
        for (n, v) in extra {
            a.retain(|x| x.0 != *n);
            a.push((n.to_string(), v.clone()));
        }
        a
    }

    fn op(&self, extra: &[(&str, Attr)]) -> Op {
        let attrs = self.attrs(extra);
        let refs: Vec<(&str, Attr)> = attrs.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
        op(self.kind, &refs)
    }

    fn check(&self, extra: &[(&str, Attr)], bind: Bind) {
        let tol = match self.d {
            DType::F64 => F64,
            DType::F16 => F16,
            DType::BF16 => BF16,
            _ => F32L,
        };
        check(&self.op(extra), &self.inputs(), bind, tol);
    }
}

const KINDS: [OpKind; 3] = [OpKind::RNN, OpKind::GRU, OpKind::LSTM];

#[test]
fn recurrent_directions_layouts_and_states() {
    for kind in KINDS {
        for nd in [1, 2] {
            for layout in [0, 1] {
                for init in [false, true] {
                    let r = Rec { nd, layout, init, ..Rec::new(kind) };
                    r.check(&[], Bind::Runtime);
                    r.check(&[], Bind::Const);
                }
            }
            let r = Rec { nd, bias: false, ..Rec::new(kind) };
            r.check(&[], Bind::Runtime);
            if nd == 1 {
                r.check(&[("direction", s("reverse"))], Bind::Runtime);
                let r = Rec { init: true, layout: 1, ..r };
                r.check(&[("direction", s("reverse"))], Bind::Runtime);
            }
        }
    }
}

#[test]
fn recurrent_dtypes_and_odd_sizes() {
    for kind in KINDS {
        for d in [DType::F64, DType::F16, DType::BF16] {
            Rec { d, init: true, nd: 2, ..Rec::new(kind) }.check(&[], Bind::Runtime);
        }
        Rec { seq: 1, batch: 1, input: 1, hidden: 1, ..Rec::new(kind) }.check(&[], Bind::Runtime);
        Rec { seq: 7, batch: 2, input: 3, hidden: 5, init: true, ..Rec::new(kind) }.check(&[], Bind::Runtime);
        // No time steps: Y is empty, Y_h (and Y_c) the initial state.
        Rec { seq: 0, init: true, ..Rec::new(kind) }.check(&[], Bind::Runtime);
        Rec { seq: 0, layout: 1, init: true, nd: 2, ..Rec::new(kind) }.check(&[], Bind::Runtime);
        Rec { seq: 0, ..Rec::new(kind) }.check(&[], Bind::Runtime);
        // Empty batch, no input features.
        Rec { batch: 0, ..Rec::new(kind) }.check(&[], Bind::Runtime);
        Rec { input: 0, init: true, ..Rec::new(kind) }.check(&[], Bind::Runtime);
    }
}

#[test]
fn recurrent_sequence_lengths() {
    for kind in KINDS {
        for nd in [1, 2] {
            for layout in [0, 1] {
                for lens in [&[4i64, 2, 0][..], &[1, 4, 3], &[4, 4, 4]] {
                    let r = Rec { nd, layout, lens: Some(lens), init: true, ..Rec::new(kind) };
                    r.check(&[], Bind::Runtime);
                    r.check(&[], Bind::Const);
                    r.check(&[("direction", s(if nd == 2 { "bidirectional" } else { "reverse" }))], Bind::Runtime);
                }
            }
        }
        let r = Rec { lens: Some(&[3, 0, 2]), ..Rec::new(kind) };
        r.check(&[("direction", s("reverse"))], Bind::Runtime);
    }
}

#[test]
fn recurrent_activations_and_clip() {
    let all = [
        "Relu",
        "Tanh",
        "Sigmoid",
        "Affine",
        "LeakyRelu",
        "ThresholdedRelu",
        "ScaledTanh",
        "HardSigmoid",
        "Elu",
        "Softsign",
        "Softplus",
    ];
    for (i, a) in all.iter().enumerate() {
        let other = all[(i + 3) % all.len()];
        // RNN: one activation per direction.
        let r = Rec { nd: 2, init: true, ..Rec::new(OpKind::RNN) };
        r.check(&[("activations", strs(&[a, other]))], Bind::Runtime);
        r.check(
            &[
                ("activations", strs(&[a, a])),
                ("activation_alpha", Attr::Floats(vec![0.3, 0.7])),
                ("activation_beta", Attr::Floats(vec![-0.2])),
            ],
            Bind::Runtime,
        );
        // GRU and LSTM: the activation in every position.
        let g = Rec { init: true, ..Rec::new(OpKind::GRU) };
        g.check(&[("activations", strs(&[a, other]))], Bind::Runtime);
        g.check(&[("activations", strs(&["Sigmoid", a]))], Bind::Runtime);
        let l = Rec { init: true, nd: 2, ..Rec::new(OpKind::LSTM) };
        l.check(&[("activations", strs(&["Sigmoid", a, other]))], Bind::Runtime);
        l.check(&[("activations", strs(&[a, "Tanh", "Tanh", "Sigmoid", other, a]))], Bind::Runtime);
    }
    for kind in KINDS {
        for clip in [0.1f32, 0.5, 3.0] {
            Rec { init: true, nd: 2, ..Rec::new(kind) }.check(&[("clip", flt(clip))], Bind::Runtime);
        }
    }
}

#[test]
fn gru_linear_before_reset_and_lstm_options() {
    for lbr in [0, 1] {
        for nd in [1, 2] {
            for init in [false, true] {
                for lens in [None, Some(&[2i64, 4, 1][..])] {
                    let r = Rec { nd, init, lens, ..Rec::new(OpKind::GRU) };
                    r.check(&[("linear_before_reset", int(lbr))], Bind::Runtime);
                }
            }
        }
        Rec { bias: false, ..Rec::new(OpKind::GRU) }.check(&[("linear_before_reset", int(lbr))], Bind::Runtime);
    }
    for peep in [false, true] {
        for forget in [0, 1] {
            for nd in [1, 2] {
                for lens in [None, Some(&[2i64, 4, 1][..])] {
                    let r = Rec { nd, peep, init: true, lens, ..Rec::new(OpKind::LSTM) };
                    r.check(&[("input_forget", int(forget))], Bind::Runtime);
                }
            }
            Rec { peep, layout: 1, ..Rec::new(OpKind::LSTM) }.check(&[("input_forget", int(forget))], Bind::Runtime);
        }
    }
}

#[test]
fn recurrent_kernel_counts() {
    // Projection + per-step kernels of each direction (the recurrent product, then the
    // gates) + Y + Y_h (a copy of the last state: a time-major Y holds the states in
    // place) (+ Y_c where the layout differs).
    let count = |r: Rec, extra: &[(&str, Attr)]| {
        let n = if r.kind == OpKind::LSTM { 3 } else { 2 };
        lowered(&r.op(extra), &r.inputs(), 1, n).0.steps.len()
    };
    let seq = 4;
    assert_eq!(count(Rec { init: true, ..Rec::new(OpKind::RNN) }, &[]), 1 + 2 * seq + 2);
    assert_eq!(count(Rec { init: true, ..Rec::new(OpKind::GRU) }, &[("linear_before_reset", int(1))]), 1 + 2 * seq + 2);
    // Without linear_before_reset: z and r's product, r ⊙ H, its product, H.
    assert_eq!(count(Rec { init: true, ..Rec::new(OpKind::GRU) }, &[]), 1 + 4 * seq + 2);
    // Without an initial state, the first step has no product (and GRU no r ⊙ H).
    assert_eq!(count(Rec::new(OpKind::GRU), &[]), 1 + 1 + 4 * (seq - 1) + 2);
    assert_eq!(count(Rec::new(OpKind::LSTM), &[]), 1 + 2 + 3 * (seq - 1) + 2);
    // Each direction of a bidirectional layer is a chain of its own.
    assert_eq!(count(Rec { nd: 2, init: true, ..Rec::new(OpKind::RNN) }, &[]), 1 + 2 * 2 * seq + 2);
    // Batch-major results need their own Y_h and Y_c kernels.
    assert_eq!(count(Rec { layout: 1, ..Rec::new(OpKind::LSTM) }, &[]), 1 + 2 + 3 * (seq - 1) + 3);
}

#[test]
fn rnn_hand_value() {
    // One step, one hidden unit, Relu: h = relu(2·3 + 0.5·h0 + 1 + 0) with h0 = 4 → 9.
    let o = op(OpKind::RNN, &[("activations", strs(&["Relu"])), ("hidden_size", int(1))]);
    let ins = [
        Some(floats(&[1, 1, 1], &[3.0])),
        Some(floats(&[1, 1, 1], &[2.0])),
        Some(floats(&[1, 1, 1], &[0.5])),
        Some(floats(&[1, 2], &[1.0, 0.0])),
        None,
        Some(floats(&[1, 1, 1], &[4.0])),
    ];
    let r = run(&o, &ins, 9, 2);
    assert_eq!(r[0].to_f64_vec(), [9.0]);
    assert_eq!(r[1].to_f64_vec(), [9.0]);
}
