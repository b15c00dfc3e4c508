//! Lowering of the reductions (Reduce*, ArgMax, ArgMin) and the pools, checked against the
//! reference evaluator (kernels run by the kernel interpreter), plus hand-computed cases.

mod common;

use common::{
    check, compare, floats, ia, infer_types, int, ints, lower, lower_fails, op, rand, s, typed, typed_i, Bind, Tol,
    EXACT, F32,
};
use kiln_flow::{Expr, ReduceOp};
use kiln_ir::{Attr, DType, Op, OpKind, Tensor};
use kiln_lower::{interpret, Lowered};

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn i64s(v: &[i64]) -> Tensor {
    ints(&[v.len()], v)
}

/// f16 results: the reference rounds once from f64, the kernel from f32.
const HALF: Tol = Tol { rtol: 2e-3, atol: 2e-3 };

fn tol_for(d: DType) -> Tol {
    match d {
        DType::F16 | DType::BF16 => HALF,
        DType::F32 => F32,
        _ => EXACT,
    }
}

const REDUCES: [OpKind; 10] = [
    OpKind::ReduceL1,
    OpKind::ReduceL2,
    OpKind::ReduceLogSum,
    OpKind::ReduceLogSumExp,
    OpKind::ReduceMax,
    OpKind::ReduceMean,
    OpKind::ReduceMin,
    OpKind::ReduceProd,
    OpKind::ReduceSum,
    OpKind::ReduceSumSquare,
];

/// Lowers with exactly `nout` results (operands from `from` on constant).
fn lower_n(op: &Op, inputs: &[Option<Tensor>], nout: usize, from: usize) -> (Lowered, Vec<kiln_ir::TensorType>) {
    let out_types = infer_types(op, inputs, nout);
    (lower(op, inputs, |i| i >= from, &out_types), out_types)
}

/// Lowers and runs `op` with `nout` results.
fn run_n(op: &Op, inputs: &[Option<Tensor>], nout: usize) -> Vec<Tensor> {
    let (l, out_types) = lower_n(op, inputs, nout, 1);
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    interpret(&l, &refs, &out_types).unwrap_or_else(|e| panic!("{}: interpret: {e}", op.kind))
}

/// Like `common::check` with exactly `nout` results.
fn check_n(op: &Op, inputs: &[Option<Tensor>], nout: usize, tol: Tol) {
    let out_types = infer_types(op, inputs, nout);
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let want = kiln_ref::eval_op(op, &refs, &out_types).unwrap_or_else(|e| panic!("{}: reference: {e}", op.kind));
    let got = run_n(op, inputs, nout);
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(&format!("{} result {k}", op.kind), g, w, tol);
    }
}

/// Number of `Reduce` nodes of each kernel.
fn reduce_ops(l: &Lowered) -> Vec<Vec<ReduceOp>> {
    l.steps
        .iter()
        .map(|s| {
            s.kernel
                .nodes
                .iter()
                .filter_map(|n| match n.expr {
                    Expr::Reduce { op, .. } => Some(op),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

fn lower_err(op: &Op, inputs: &[Option<Tensor>], from: usize) -> String {
    lower_fails(op, inputs, |i| i >= from, &infer_types(op, inputs, 1))
}

// ---------------------------------------------------------------------------
// Reduce*.
// ---------------------------------------------------------------------------

#[test]
fn reduce_every_kind_dtype_and_axes() {
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::I32, DType::I8, DType::U8, DType::I64, DType::U16];
    let axes_cases: [Option<&[i64]>; 6] = [None, Some(&[1]), Some(&[-1]), Some(&[0, 2]), Some(&[2, 0, 1]), Some(&[-3])];
    let mut n = 0;
    for kind in REDUCES {
        for (di, &d) in dtypes.iter().enumerate() {
            let x = rand(d, &[2, 3, 5], 7 + di as u64);
            for axes in axes_cases {
                for keep in [0, 1] {
                    let o = op(kind, &[("keepdims", int(keep))]);
                    let inputs = vec![Some(x.clone()), axes.map(i64s)];
                    check(&o, &inputs, Bind::ConstFrom(1), tol_for(d));
                    n += 1;
                }
            }
        }
    }
    assert_eq!(n, 10 * 8 * 6 * 2);
}

#[test]
fn reduce_odd_shapes() {
    for kind in REDUCES {
        for dims in [&[7][..], &[17, 1], &[1, 1, 1], &[3, 1, 7, 2], &[1]] {
            let x = rand(DType::F32, dims, 3);
            let r = dims.len() as i64;
            for axes in [None, Some(vec![r - 1]), Some(vec![0])] {
                let o = op(kind, &[]);
                check(&o, &[Some(x.clone()), axes.as_deref().map(i64s)], Bind::ConstFrom(1), F32);
            }
        }
    }
}

#[test]
fn reduce_noop_with_empty_axes() {
    // No axes (absent or an empty list) with noop_with_empty_axes: each element alone.
    for kind in REDUCES {
        for d in [DType::F32, DType::I32] {
            let x = rand(d, &[3, 4], 11);
            let o = op(kind, &[("noop_with_empty_axes", int(1))]);
            check(&o, &[Some(x.clone()), None], Bind::ConstFrom(1), tol_for(d));
            check(&o, &[Some(x.clone()), Some(i64s(&[]))], Bind::ConstFrom(1), tol_for(d));
            // Given axes still reduce.
            check(&o, &[Some(x.clone()), Some(i64s(&[0]))], Bind::ConstFrom(1), tol_for(d));
            // Without noop, an empty list reduces everything.
            let o = op(kind, &[("noop_with_empty_axes", int(0))]);
            check(&o, &[Some(x), Some(i64s(&[]))], Bind::ConstFrom(1), tol_for(d));
        }
    }
}

#[test]
fn reduce_empty_is_the_identity() {
    for kind in REDUCES {
        for d in [DType::F32, DType::F64, DType::I32, DType::I8, DType::U8, DType::U64, DType::F16] {
            let x = rand(d, &[2, 0, 3], 1);
            for keep in [0, 1] {
                let o = op(kind, &[("keepdims", int(keep))]);
                check(&o, &[Some(x.clone()), Some(i64s(&[1]))], Bind::ConstFrom(1), EXACT);
                // The result itself empty.
                check(&o, &[Some(x.clone()), Some(i64s(&[2]))], Bind::ConstFrom(1), EXACT);
            }
        }
    }
    // Hand-checked: sum of nothing is 0, product 1, max -inf, min +inf, mean NaN.
    let x = floats(&[0, 2], &[]);
    let got = |k: OpKind| {
        let r = run_n(&op(k, &[("keepdims", int(0))]), &[Some(x.clone()), Some(i64s(&[0]))], 1);
        r[0].to_f64_vec()
    };
    assert_eq!(got(OpKind::ReduceSum), vec![0.0, 0.0]);
    assert_eq!(got(OpKind::ReduceProd), vec![1.0, 1.0]);
    assert_eq!(got(OpKind::ReduceMax), vec![f64::NEG_INFINITY; 2]);
    assert_eq!(got(OpKind::ReduceMin), vec![f64::INFINITY; 2]);
    assert!(got(OpKind::ReduceMean).iter().all(|v| v.is_nan()));
}

#[test]
fn reduce_max_min_bool() {
    let x = rand(DType::Bool, &[3, 4, 2], 5);
    for kind in [OpKind::ReduceMax, OpKind::ReduceMin] {
        for axes in [None, Some(&[1i64][..]), Some(&[0, 2][..])] {
            check(&op(kind, &[]), &[Some(x.clone()), axes.map(i64s)], Bind::ConstFrom(1), EXACT);
        }
        let e = rand(DType::Bool, &[2, 0], 5);
        check(&op(kind, &[]), &[Some(e), Some(i64s(&[1]))], Bind::ConstFrom(1), EXACT);
    }
}

#[test]
fn reduce_special_values() {
    let inf = f64::INFINITY;
    let nan = f64::NAN;
    let rows = [
        [1.0, nan, 3.0, -1.0],
        [inf, 1.0, 2.0, 0.5],
        [-inf, -inf, -inf, -inf],
        [-inf, 2.0, -3.0, 1.0],
        [1000.0, 999.0, 1001.0, 998.0],
        [-1000.0, -999.0, -1001.0, -998.0],
        [0.0, -0.0, 0.0, 0.0],
        [inf, -inf, 1.0, 2.0],
    ];
    let v: Vec<f64> = rows.iter().flatten().copied().collect();
    for d in [DType::F32, DType::F64] {
        let x = typed(d, &[rows.len(), 4], &v);
        for kind in REDUCES {
            check(&op(kind, &[]), &[Some(x.clone()), Some(i64s(&[1]))], Bind::ConstFrom(1), tol_for(d));
        }
    }
    // LogSumExp is stable: log(e^1000 + e^999 + e^1001 + e^998) = 1001 + log(1 + e^-1 + e^-2 + e^-3).
    let x = floats(&[1, 4], &[1000.0, 999.0, 1001.0, 998.0]);
    let r = run_n(&op(OpKind::ReduceLogSumExp, &[("keepdims", int(0))]), &[Some(x), None], 1);
    let want = 1001.0 + (1.0 + (-1.0f64).exp() + (-2.0f64).exp() + (-3.0f64).exp()).ln();
    assert!((r[0].to_f64_vec()[0] - want).abs() < 1e-3, "{:?}", r[0].to_f64_vec());
}

#[test]
fn reduce_integers_wrap_and_saturate() {
    // i8 sums and products wrap; SumSquare of 100 wraps; Mean truncates toward zero.
    let x = typed_i(DType::I8, &[2, 3], &[100, 100, 100, -7, -8, 2]);
    for kind in REDUCES {
        check(&op(kind, &[]), &[Some(x.clone()), Some(i64s(&[1]))], Bind::ConstFrom(1), EXACT);
    }
    let got = run_n(&op(OpKind::ReduceSum, &[("keepdims", int(0))]), &[Some(x.clone()), Some(i64s(&[1]))], 1);
    assert_eq!(got[0].to_i64_vec().unwrap(), vec![44, -13]); // 300 - 256 = 44
    let got = run_n(&op(OpKind::ReduceMean, &[("keepdims", int(0))]), &[Some(x.clone()), Some(i64s(&[1]))], 1);
    assert_eq!(got[0].to_i64_vec().unwrap(), vec![100, -4]); // -13/3 = -4.33 → -4
                                                             // L2 of i8 through f64 saturates at 127: sqrt(3·100²) = 173.2.
    let got = run_n(&op(OpKind::ReduceL2, &[("keepdims", int(0))]), &[Some(x), Some(i64s(&[1]))], 1);
    assert_eq!(got[0].to_i64_vec().unwrap(), vec![127, 10]); // sqrt(49+64+4) = 10.8
                                                             // u64 and i64 extremes.
    let big = typed_i(DType::I64, &[3], &[i64::MAX, i64::MIN, -1]);
    let ubig = typed_i(DType::U64, &[3], &[-1, 5, 7]);
    for kind in REDUCES {
        check(&op(kind, &[]), &[Some(big.clone()), None], Bind::ConstFrom(1), EXACT);
        check(&op(kind, &[]), &[Some(ubig.clone()), None], Bind::ConstFrom(1), EXACT);
    }
}

#[test]
fn reduce_log_sum_exp_is_one_kernel_with_nested_max() {
    let x = rand(DType::F32, &[4, 6], 2);
    let (l, _) = lower_n(&op(OpKind::ReduceLogSumExp, &[]), &[Some(x), Some(i64s(&[1]))], 1, 1);
    assert_eq!(l.steps.len(), 1);
    let ops = &reduce_ops(&l)[0];
    assert!(ops.contains(&ReduceOp::Max) && ops.contains(&ReduceOp::Sum), "{ops:?}");
    // Only the data operand is bound.
    assert_eq!(l.steps[0].kernel.inputs.len(), 1);
}

#[test]
fn reduce_hand_computed() {
    let x = floats(&[2, 3], &[1.0, -2.0, 3.0, 4.0, 5.0, -6.0]);
    let r = |k: OpKind, axes: &[i64]| {
        run_n(&op(k, &[("keepdims", int(0))]), &[Some(x.clone()), Some(i64s(axes))], 1)[0].to_f64_vec()
    };
    assert_eq!(r(OpKind::ReduceSum, &[1]), vec![2.0, 3.0]);
    assert_eq!(r(OpKind::ReduceSum, &[0]), vec![5.0, 3.0, -3.0]);
    assert_eq!(r(OpKind::ReduceL1, &[1]), vec![6.0, 15.0]);
    assert_eq!(r(OpKind::ReduceSumSquare, &[1]), vec![14.0, 77.0]);
    assert_eq!(r(OpKind::ReduceProd, &[0]), vec![4.0, -10.0, -18.0]);
    assert_eq!(r(OpKind::ReduceMax, &[1]), vec![3.0, 5.0]);
    assert_eq!(r(OpKind::ReduceMin, &[0, 1]), vec![-6.0]);
    assert_eq!(r(OpKind::ReduceMean, &[0]), vec![2.5, 1.5, -1.5]);
}

#[test]
fn reduce_axes_must_be_constant() {
    let x = rand(DType::F32, &[2, 3], 1);
    let e = lower_err(&op(OpKind::ReduceSum, &[]), &[Some(x), Some(i64s(&[1]))], 2);
    assert!(e.contains("constant"), "{e}");
}

// ---------------------------------------------------------------------------
// ArgMax / ArgMin.
// ---------------------------------------------------------------------------

#[test]
fn arg_reduce_dtypes_axes_attrs() {
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::I32, DType::I8, DType::U8, DType::I64, DType::U32];
    let mut n = 0;
    for kind in [OpKind::ArgMax, OpKind::ArgMin] {
        for (i, &d) in dtypes.iter().enumerate() {
            // Small integer ranges make ties common.
            let x = rand(d, &[3, 4, 5], 40 + i as u64);
            for axis in [0, 1, 2, -1, -3] {
                for keep in [0, 1] {
                    for last in [0, 1] {
                        let o =
                            op(kind, &[("axis", int(axis)), ("keepdims", int(keep)), ("select_last_index", int(last))]);
                        check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
                        n += 1;
                    }
                }
            }
        }
    }
    assert_eq!(n, 2 * 8 * 5 * 2 * 2);
}

#[test]
fn arg_reduce_ties_and_nan_hand_checked() {
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    // Rows: ties, NaN in the middle, two NaNs, inf with a later NaN, all equal.
    let rows: [[f64; 5]; 5] = [
        [1.0, 3.0, 0.0, 3.0, 1.0],
        [1.0, nan, 5.0, 0.0, 2.0],
        [nan, 1.0, nan, 9.0, -9.0],
        [inf, 1.0, -inf, nan, 0.0],
        [2.0, 2.0, 2.0, 2.0, 2.0],
    ];
    let v: Vec<f64> = rows.iter().flatten().copied().collect();
    let x = floats(&[5, 5], &v);
    let run = |k: OpKind, last: i64| {
        let o = op(k, &[("axis", int(1)), ("keepdims", int(0)), ("select_last_index", int(last))]);
        run_n(&o, &[Some(x.clone())], 1)[0].to_i64_vec().unwrap()
    };
    // NaN wins for both ArgMax and ArgMin (first NaN, or the last one with select_last_index).
    assert_eq!(run(OpKind::ArgMax, 0), vec![1, 1, 0, 3, 0]);
    assert_eq!(run(OpKind::ArgMax, 1), vec![3, 1, 2, 3, 4]);
    assert_eq!(run(OpKind::ArgMin, 0), vec![2, 1, 0, 3, 0]);
    assert_eq!(run(OpKind::ArgMin, 1), vec![2, 1, 2, 3, 4]);
    for kind in [OpKind::ArgMax, OpKind::ArgMin] {
        for last in [0, 1] {
            let o = op(kind, &[("axis", int(1)), ("select_last_index", int(last))]);
            check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
            let o = op(kind, &[("axis", int(0)), ("select_last_index", int(last))]);
            check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
        }
    }
}

#[test]
fn arg_reduce_odd_shapes_and_empty() {
    for dims in [&[7][..], &[1, 17], &[17, 1], &[2, 0, 3]] {
        let x = rand(DType::F32, dims, 9);
        for kind in [OpKind::ArgMax, OpKind::ArgMin] {
            check(&op(kind, &[("axis", int(0))]), &[Some(x.clone())], Bind::Runtime, EXACT);
            check(&op(kind, &[("axis", int(-1))]), &[Some(x.clone())], Bind::Runtime, EXACT);
        }
    }
    // Integer ArgMax has a single fold (no NaN handling).
    let x = rand(DType::I32, &[4, 5], 1);
    let (l, _) = lower_n(&op(OpKind::ArgMax, &[("axis", int(1))]), &[Some(x)], 1, 1);
    assert_eq!(reduce_ops(&l)[0].len(), 1);
}

// ---------------------------------------------------------------------------
// Pools.
// ---------------------------------------------------------------------------

/// Window attribute sets over `r` spatial dims.
fn window_cases(r: usize) -> Vec<Vec<(&'static str, Attr)>> {
    let k = |v: i64| ia(&vec![v; r]);
    let mut pads_asym: Vec<i64> = (0..r as i64).map(|i| i % 2).collect();
    pads_asym.extend((0..r as i64).map(|i| 1 - i % 2));
    vec![
        vec![("kernel_shape", k(2))],
        vec![("kernel_shape", k(3)), ("strides", k(2))],
        vec![("kernel_shape", k(3)), ("pads", ia(&vec![1; 2 * r]))],
        vec![("kernel_shape", k(2)), ("pads", ia(&pads_asym)), ("strides", k(2))],
        vec![("kernel_shape", k(2)), ("dilations", k(2))],
        vec![("kernel_shape", k(3)), ("strides", k(2)), ("ceil_mode", int(1))],
        vec![("kernel_shape", k(3)), ("strides", k(2)), ("pads", ia(&vec![1; 2 * r])), ("ceil_mode", int(1))],
        vec![("kernel_shape", k(3)), ("auto_pad", s("SAME_UPPER")), ("strides", k(2))],
        vec![("kernel_shape", k(2)), ("auto_pad", s("SAME_LOWER"))],
        vec![("kernel_shape", k(2)), ("auto_pad", s("SAME_UPPER")), ("dilations", k(2))],
        vec![("kernel_shape", k(3)), ("auto_pad", s("VALID")), ("strides", k(2))],
        vec![("kernel_shape", k(1))],
    ]
}

fn spatial(r: usize) -> Vec<usize> {
    let mut d = vec![2, 3];
    d.extend([7, 6, 5][..r].iter());
    d
}

#[test]
fn average_pool_windows() {
    let mut n = 0;
    for r in 1..=3 {
        let x = rand(DType::F32, &spatial(r), 20 + r as u64);
        for attrs in window_cases(r) {
            for include in [0, 1] {
                let mut a = attrs.clone();
                a.push(("count_include_pad", int(include)));
                check(&op(OpKind::AveragePool, &a), &[Some(x.clone())], Bind::Runtime, F32);
                n += 1;
            }
        }
    }
    assert_eq!(n, 3 * 12 * 2);
    for d in [DType::F64, DType::F16] {
        let x = rand(d, &[1, 2, 9, 8], 3);
        let a = [("kernel_shape", ia(&[3, 2])), ("pads", ia(&[1, 0, 1, 1])), ("strides", ia(&[2, 1]))];
        check(&op(OpKind::AveragePool, &a), &[Some(x)], Bind::Runtime, tol_for(d));
    }
}

#[test]
fn average_pool_hand_computed() {
    // 1x1x3x3 = 1..9, kernel 2x2, pads 1 everywhere, stride 2: corners see 1, 2 (or 4) taps.
    let x = floats(&[1, 1, 3, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    let a = [("kernel_shape", ia(&[2, 2])), ("pads", ia(&[1, 1, 1, 1])), ("strides", ia(&[2, 2]))];
    let got = run_n(&op(OpKind::AveragePool, &a), &[Some(x.clone())], 1)[0].to_f64_vec();
    // Windows: {1}, {2,3}, {4,7}, {5,6,8,9}.
    assert_eq!(got, vec![1.0, 2.5, 5.5, 7.0]);
    let mut a = a.to_vec();
    a.push(("count_include_pad", int(1)));
    let got = run_n(&op(OpKind::AveragePool, &a), &[Some(x)], 1)[0].to_f64_vec();
    assert_eq!(got, vec![0.25, 1.25, 2.75, 7.0]);
}

#[test]
fn lp_pool_powers() {
    for r in 1..=2 {
        let x = rand(DType::F32, &spatial(r), 30 + r as u64);
        for attrs in window_cases(r) {
            for p in [1, 2, 3] {
                let mut a = attrs.clone();
                a.push(("p", int(p)));
                check(&op(OpKind::LpPool, &a), &[Some(x.clone())], Bind::Runtime, Tol { rtol: 1e-5, atol: 1e-5 });
            }
        }
    }
    let x = floats(&[1, 1, 4], &[3.0, -4.0, 1.0, 0.0]);
    let got = run_n(&op(OpKind::LpPool, &[("kernel_shape", ia(&[2])), ("strides", ia(&[2]))]), &[Some(x)], 1);
    assert_eq!(got[0].to_f64_vec(), vec![5.0, 1.0]);
}

#[test]
fn max_pool_values_and_indices() {
    let mut n = 0;
    for r in 1..=3 {
        for d in [DType::F32, DType::I8, DType::U8] {
            let x = rand(d, &spatial(r), 50 + r as u64);
            for attrs in window_cases(r) {
                for order in [0, 1] {
                    let mut a = attrs.clone();
                    a.push(("storage_order", int(order)));
                    check_n(&op(OpKind::MaxPool, &a), &[Some(x.clone())], 2, EXACT);
                    n += 1;
                }
                check_n(&op(OpKind::MaxPool, &attrs), &[Some(x.clone())], 1, EXACT);
            }
        }
    }
    assert_eq!(n, 3 * 3 * 12 * 2);
    for d in [DType::F64, DType::F16] {
        let x = rand(d, &[2, 2, 6, 5], 3);
        let a = [("kernel_shape", ia(&[3, 2])), ("pads", ia(&[1, 1, 1, 0])), ("dilations", ia(&[2, 1]))];
        check_n(&op(OpKind::MaxPool, &a), &[Some(x)], 2, EXACT);
    }
}

#[test]
fn max_pool_nan_padding_and_ties_hand_checked() {
    let nan = f64::NAN;
    let ninf = f64::NEG_INFINITY;
    // 1x1x6: windows of 2 with pads 1, stride 2: [pad, a0] [a1, a2] [a3, a4] [a5, pad].
    let x = floats(&[1, 1, 6], &[nan, 2.0, 2.0, nan, nan, ninf]);
    let a = [("kernel_shape", ia(&[2])), ("pads", ia(&[1, 1])), ("strides", ia(&[2]))];
    let got = run_n(&op(OpKind::MaxPool, &a), &[Some(x.clone())], 2);
    // NaN is ignored: an all-NaN window gives -inf and index -1; ties give the first.
    assert_eq!(got[0].to_f64_vec(), vec![ninf, 2.0, ninf, ninf]);
    assert_eq!(got[1].to_i64_vec().unwrap(), vec![-1, 1, -1, 5]);
    check_n(&op(OpKind::MaxPool, &a), &[Some(x)], 2, EXACT);
    // Indices carry the batch and channel offset; column-major within the plane.
    let x = floats(&[1, 2, 2, 3], &[0.0, 1.0, 9.0, 3.0, 4.0, 5.0, 7.0, 0.0, 0.0, 0.0, 0.0, 8.0]);
    let a = [("kernel_shape", ia(&[2, 3]))];
    let got = run_n(&op(OpKind::MaxPool, &a), &[Some(x.clone())], 2);
    assert_eq!(got[0].to_f64_vec(), vec![9.0, 8.0]);
    assert_eq!(got[1].to_i64_vec().unwrap(), vec![2, 6 + 5]);
    let mut a = a.to_vec();
    a.push(("storage_order", int(1)));
    let got = run_n(&op(OpKind::MaxPool, &a), &[Some(x)], 2);
    // (0, 2) column-major in 2x3 is 2·2 + 0 = 4; (1, 2) is 2·2 + 1 = 5.
    assert_eq!(got[1].to_i64_vec().unwrap(), vec![4, 6 + 5]);
}

#[test]
fn max_pool_is_bounds_safe_with_big_pads() {
    // Pads as large as the kernel allows: windows entirely in the padding.
    let x = rand(DType::F32, &[1, 2, 3, 3], 8);
    let a = [("kernel_shape", ia(&[3, 3])), ("pads", ia(&[2, 2, 2, 2])), ("strides", ia(&[1, 2]))];
    check_n(&op(OpKind::MaxPool, &a), &[Some(x.clone())], 2, EXACT);
    for include in [0, 1] {
        let mut aa = a.to_vec();
        aa.push(("count_include_pad", int(include)));
        check(&op(OpKind::AveragePool, &aa), &[Some(x.clone())], Bind::Runtime, F32);
    }
}

#[test]
fn global_pools() {
    for kind in [OpKind::GlobalAveragePool, OpKind::GlobalMaxPool, OpKind::GlobalLpPool] {
        for d in [DType::F32, DType::F64, DType::F16] {
            for dims in [&[2, 3, 5][..], &[1, 2, 3, 4], &[2, 1, 2, 3, 2], &[1, 1, 1], &[0, 2, 3], &[1, 2, 0]] {
                let x = rand(d, dims, 60);
                check(&op(kind, &[]), &[Some(x)], Bind::Runtime, tol_for(d));
            }
        }
    }
    for p in [1, 3] {
        let x = rand(DType::F32, &[2, 3, 4, 4], 61);
        check(&op(OpKind::GlobalLpPool, &[("p", int(p))]), &[Some(x)], Bind::Runtime, Tol { rtol: 1e-5, atol: 1e-5 });
    }
    let nan = f64::NAN;
    let x = floats(&[1, 2, 3], &[nan, 1.0, -1.0, nan, nan, nan]);
    let got = run_n(&op(OpKind::GlobalMaxPool, &[]), &[Some(x.clone())], 1);
    assert_eq!(got[0].to_f64_vec(), vec![1.0, f64::NEG_INFINITY]);
    check(&op(OpKind::GlobalMaxPool, &[]), &[Some(x)], Bind::Runtime, EXACT);
}
