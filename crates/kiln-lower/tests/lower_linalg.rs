//! Lowering of the contractions (MatMul, Gemm, Einsum, Conv, ConvTranspose, the integer and
//! quantized forms) and Det, checked against the reference evaluator (kernels run by the
//! kernel interpreter), plus hand-computed cases.

mod common;

use common::{
    check, compare, floats, ia, infer_inputs, infer_types, int, ints, lower, op, rand, s, typed, typed_i, Bind, Tol,
    EXACT, F32,
};
use kiln_flow::{Bounds, Expr};
use kiln_ir::infer::infer;
use kiln_ir::{Attr, DType, Op, OpKind, Shape, Tensor};
use kiln_lower::{interpret, lower_op, Lowered, OpCx, OpInput};

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn fl(v: f32) -> Attr {
    Attr::Float(v)
}

/// Integers spread over a dtype's whole range (u8/i8), deterministic.
fn wide(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    let mut st = seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1;
    let v: Vec<i64> = (0..n)
        .map(|_| {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            let b = (st % 256) as i64;
            if dtype == DType::I8 {
                b - 128
            } else {
                b
            }
        })
        .collect();
    typed_i(dtype, dims, &v)
}

/// f16 results: the reference rounds once from f64, the kernel from f32.
const HALF: Tol = Tol { rtol: 2e-3, atol: 2e-3 };
/// f32 sums of many products.
const SUM: Tol = Tol { rtol: 1e-5, atol: 1e-5 };

fn tol_for(d: DType) -> Tol {
    match d {
        DType::F16 | DType::BF16 => HALF,
        DType::F32 => SUM,
        DType::F64 => EXACT,
        _ => EXACT,
    }
}

/// Lowers with operands from `from` on constant.
fn lower_from(op: &Op, inputs: &[Option<Tensor>], from: usize) -> (Lowered, Vec<kiln_ir::TensorType>) {
    let out_types = infer_types(op, inputs, 1);
    (lower(op, inputs, |i| i >= from, &out_types), out_types)
}

/// Lowers and runs `op` (all operands run-time).
fn run(op: &Op, inputs: &[Option<Tensor>]) -> Tensor {
    let (l, out_types) = lower_from(op, inputs, usize::MAX);
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let mut r = interpret(&l, &refs, &out_types).unwrap_or_else(|e| panic!("{}: interpret: {e}", op.kind));
    r.remove(0)
}

/// `check` both with every operand at run time and with every operand constant.
fn check2(op: &Op, inputs: &[Option<Tensor>], tol: Tol) {
    check(op, inputs, Bind::Runtime, tol);
    check(op, inputs, Bind::Const, tol);
}

fn loads(l: &Lowered) -> Vec<Bounds> {
    l.steps
        .iter()
        .flat_map(|s| s.kernel.nodes.iter())
        .filter_map(|n| match n.expr {
            Expr::Load { bounds, .. } => Some(bounds),
            _ => None,
        })
        .collect()
}

// ---------------------------------------------------------------------------
// MatMul.
// ---------------------------------------------------------------------------

#[test]
fn matmul_shapes_and_dtypes() {
    let shapes: [(&[usize], &[usize]); 12] = [
        (&[3, 4], &[4, 5]),
        (&[4], &[4, 5]),
        (&[3, 4], &[4]),
        (&[7], &[7]),
        (&[2, 3, 4], &[4, 5]),
        (&[4], &[2, 4, 5]),
        (&[2, 1, 3, 4], &[5, 4, 2]),
        (&[1, 3, 4], &[6, 4, 1]),
        (&[3, 0], &[0, 2]),
        (&[0, 3], &[3, 2]),
        (&[2, 0, 3, 4], &[4, 1]),
        (&[1, 17], &[17, 1]),
    ];
    let dtypes = [DType::F32, DType::F64, DType::F16, DType::I32, DType::I64, DType::U8, DType::I8, DType::U32];
    let mut n = 0;
    for (i, (a, b)) in shapes.iter().enumerate() {
        for &d in &dtypes {
            let x = rand(d, a, 10 + i as u64);
            let y = rand(d, b, 50 + i as u64);
            check(&op(OpKind::MatMul, &[]), &[Some(x), Some(y)], Bind::Runtime, tol_for(d));
            n += 1;
        }
    }
    assert_eq!(n, 12 * 8);
}

#[test]
fn matmul_hand_computed_and_wrapping() {
    let a = floats(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let b = floats(&[2, 2], &[5.0, 6.0, 7.0, 8.0]);
    assert_eq!(run(&op(OpKind::MatMul, &[]), &[Some(a), Some(b)]).to_f64_vec(), vec![19.0, 22.0, 43.0, 50.0]);
    // i8 products wrap: 100·100 + 100·100 = 20000 ≡ 32 (mod 256).
    let a = typed_i(DType::I8, &[1, 2], &[100, 100]);
    let b = typed_i(DType::I8, &[2, 1], &[100, 100]);
    let got = run(&op(OpKind::MatMul, &[]), &[Some(a.clone()), Some(b.clone())]);
    assert_eq!(got.to_i64_vec().unwrap(), vec![32]);
    check(&op(OpKind::MatMul, &[]), &[Some(a), Some(b)], Bind::Runtime, EXACT);
}

#[test]
fn matmul_loads_are_proved_in_bounds() {
    let x = rand(DType::F32, &[2, 1, 3, 4], 1);
    let y = rand(DType::F32, &[5, 4, 2], 2);
    let (l, _) = lower_from(&op(OpKind::MatMul, &[]), &[Some(x), Some(y)], usize::MAX);
    assert_eq!(l.steps.len(), 1);
    assert!(loads(&l).iter().all(|b| *b == Bounds::InBounds));
}

// ---------------------------------------------------------------------------
// Gemm.
// ---------------------------------------------------------------------------

#[test]
fn gemm_attributes_and_c_broadcast() {
    let (m, k, n) = (3, 5, 4);
    let c_shapes: [Option<&[usize]>; 6] = [None, Some(&[]), Some(&[4]), Some(&[1, 4]), Some(&[3, 1]), Some(&[3, 4])];
    let mut count = 0;
    for d in [DType::F32, DType::F64, DType::F16] {
        for ta in [0, 1] {
            for tb in [0, 1] {
                let a = rand(d, &(if ta == 1 { [k, m] } else { [m, k] }), 3);
                let b = rand(d, &(if tb == 1 { [n, k] } else { [k, n] }), 4);
                for cs in c_shapes {
                    for (alpha, beta) in [(1.0, 1.0), (0.5, -2.0), (2.0, 0.0)] {
                        let o = op(
                            OpKind::Gemm,
                            &[("transA", int(ta)), ("transB", int(tb)), ("alpha", fl(alpha)), ("beta", fl(beta))],
                        );
                        let c = cs.map(|c| rand(d, c, 5));
                        check(&o, &[Some(a.clone()), Some(b.clone()), c], Bind::Runtime, tol_for(d));
                        count += 1;
                    }
                }
            }
        }
    }
    assert_eq!(count, 3 * 4 * 6 * 3);
    // Integers go through f64 like the reference.
    let a = rand(DType::I32, &[3, 5], 1);
    let b = rand(DType::I32, &[5, 2], 2);
    let c = rand(DType::I32, &[2], 3);
    check(&op(OpKind::Gemm, &[("alpha", fl(1.5))]), &[Some(a), Some(b), Some(c)], Bind::Runtime, EXACT);
    // Empty inner dimension: alpha·0 + beta·C.
    let a = rand(DType::F32, &[3, 0], 1);
    let b = rand(DType::F32, &[0, 2], 2);
    let c = rand(DType::F32, &[3, 2], 3);
    check(&op(OpKind::Gemm, &[("beta", fl(0.5))]), &[Some(a), Some(b), Some(c)], Bind::Runtime, EXACT);
}

/// A transposed B computed at run time is copied to `[K, N]` first, so that the
/// product is a contraction (read transposed, it would step K per column and fall to
/// the general path); a constant transposed B is read in place (packed at compile
/// time). Both against the reference evaluator.
#[test]
fn gemm_runtime_transposed_b_stays_a_contraction() {
    use kiln_flow::contraction::Contraction;
    let (m, k, n) = (5, 7, 6);
    for d in [DType::F32, DType::F16] {
        let a = rand(d, &[m, k], 11);
        let b = rand(d, &[n, k], 12);
        let c = rand(d, &[n], 13);
        let o = op(OpKind::Gemm, &[("transB", int(1)), ("alpha", fl(0.5)), ("beta", fl(2.0))]);
        let inputs = [Some(a), Some(b), Some(c)];
        for bind in [Bind::Runtime, Bind::ConstFrom(1)] {
            check(&o, &inputs, bind, tol_for(d));
        }
        let (run_time, _) = lower_from(&o, &inputs, usize::MAX);
        assert_eq!(run_time.steps.len(), 2, "{d:?}: a transpose step, then the product");
        assert!(Contraction::of(&run_time.steps[0].kernel).is_none(), "{d:?}: the copy");
        assert!(Contraction::of(&run_time.steps[1].kernel).is_some(), "{d:?}: the product is a contraction");
        let (constant, _) = lower_from(&o, &inputs, 1);
        assert_eq!(constant.steps.len(), 1, "{d:?}: a constant B is read in place");
    }
}

#[test]
fn gemm_hand_computed() {
    // 2·(A·Bᵀ) + 3·C with A = [[1,2]], B = [[3,4],[5,6]], C = [1, -1].
    let a = floats(&[1, 2], &[1.0, 2.0]);
    let b = floats(&[2, 2], &[3.0, 4.0, 5.0, 6.0]);
    let c = floats(&[2], &[1.0, -1.0]);
    let o = op(OpKind::Gemm, &[("transB", int(1)), ("alpha", fl(2.0)), ("beta", fl(3.0))]);
    assert_eq!(run(&o, &[Some(a), Some(b), Some(c)]).to_f64_vec(), vec![2.0 * 11.0 + 3.0, 2.0 * 17.0 - 3.0]);
}

// ---------------------------------------------------------------------------
// MatMulInteger and QLinearMatMul.
// ---------------------------------------------------------------------------

#[test]
fn matmul_integer_zero_points() {
    for (da, db) in [(DType::U8, DType::U8), (DType::I8, DType::I8), (DType::U8, DType::I8), (DType::I8, DType::U8)] {
        for (ash, bsh) in [(&[3, 7][..], &[7, 4][..]), (&[2, 3, 7], &[7, 4]), (&[7], &[7, 4]), (&[3, 7], &[7])] {
            let a = wide(da, ash, 1);
            let b = wide(db, bsh, 2);
            let m = if ash.len() > 1 { ash[ash.len() - 2] } else { 1 };
            let n = if bsh.len() > 1 { bsh[bsh.len() - 1] } else { 1 };
            let azs: Vec<Option<Tensor>> = vec![None, Some(wide(da, &[], 3)), Some(wide(da, &[1], 4))]
                .into_iter()
                .chain((ash.len() > 1).then(|| Some(wide(da, &[m], 5))))
                .collect();
            let bzs: Vec<Option<Tensor>> =
                vec![None, Some(wide(db, &[], 6)), Some(wide(db, &[n], 7))].into_iter().collect();
            for az in &azs {
                for bz in &bzs {
                    let inputs = vec![Some(a.clone()), Some(b.clone()), az.clone(), bz.clone()];
                    check2(&op(OpKind::MatMulInteger, &[]), &inputs, EXACT);
                }
            }
        }
    }
    // Hand: (200 − 128)·(3 − 1) + (100 − 128)·(5 − 1) = 144 − 112 = 32.
    let a = typed_i(DType::U8, &[1, 2], &[200, 100]);
    let b = typed_i(DType::U8, &[2, 1], &[3, 5]);
    let az = typed_i(DType::U8, &[], &[128]);
    let bz = typed_i(DType::U8, &[], &[1]);
    let got = run(&op(OpKind::MatMulInteger, &[]), &[Some(a), Some(b), Some(az), Some(bz)]);
    assert_eq!(got.to_i64_vec().unwrap(), vec![32]);
}

#[test]
fn qlinear_matmul_per_tensor_and_per_axis() {
    let f = |v: &[f64]| floats(&[v.len()], v);
    for (da, db, dy) in
        [(DType::U8, DType::U8, DType::U8), (DType::I8, DType::I8, DType::I8), (DType::U8, DType::I8, DType::I8)]
    {
        for (ash, bsh) in [(&[3, 6][..], &[6, 4][..]), (&[2, 3, 6], &[6, 4]), (&[6], &[6, 4]), (&[3, 6], &[6])] {
            let a = wide(da, ash, 11);
            let b = wide(db, bsh, 12);
            let m = if ash.len() > 1 { ash[ash.len() - 2] } else { 1 };
            let n = if bsh.len() > 1 { bsh[bsh.len() - 1] } else { 1 };
            // Per tensor, then per row of a / y and per column of b.
            let params = [
                (
                    floats(&[], &[0.02]),
                    wide(da, &[], 1),
                    floats(&[], &[0.05]),
                    wide(db, &[], 2),
                    floats(&[], &[0.7]),
                    wide(dy, &[], 3),
                ),
                (
                    f(&(0..m).map(|i| 0.01 + 0.003 * i as f64).collect::<Vec<_>>()),
                    wide(da, &[m], 4),
                    f(&(0..n).map(|i| 0.04 + 0.01 * i as f64).collect::<Vec<_>>()),
                    wide(db, &[n], 5),
                    f(&(0..m).map(|i| 0.5 + 0.25 * i as f64).collect::<Vec<_>>()),
                    wide(dy, &[m], 6),
                ),
            ];
            for (sa, za, sb, zb, sy, zy) in params {
                let inputs =
                    vec![Some(a.clone()), Some(sa), Some(za), Some(b.clone()), Some(sb), Some(zb), Some(sy), Some(zy)];
                check2(&op(OpKind::QLinearMatMul, &[]), &inputs, EXACT);
            }
        }
    }
}

#[test]
fn qlinear_matmul_rounds_half_to_even_and_saturates() {
    // acc = a·b with zero points 0; scale product 0.5 / 1 makes halves: 1·1 → 0.5 → 0,
    // 1·3 → 1.5 → 2, 1·5 → 2.5 → 2, 1·7 → 3.5 → 4; 1·255 → 127.5 → 128, + zp 200 → 255.
    let a = typed_i(DType::U8, &[1, 1], &[1]);
    let b = typed_i(DType::U8, &[1, 5], &[1, 3, 5, 7, 255]);
    let z = |v: i64| typed_i(DType::U8, &[], &[v]);
    let inputs = vec![
        Some(a),
        Some(floats(&[], &[0.5])),
        Some(z(0)),
        Some(b),
        Some(floats(&[], &[1.0])),
        Some(z(0)),
        Some(floats(&[], &[1.0])),
        Some(z(0)),
    ];
    let got = run(&op(OpKind::QLinearMatMul, &[]), &inputs);
    assert_eq!(got.to_i64_vec().unwrap(), vec![0, 2, 2, 4, 128]);
    let mut inputs = inputs;
    inputs[7] = Some(z(200));
    let got = run(&op(OpKind::QLinearMatMul, &[]), &inputs);
    assert_eq!(got.to_i64_vec().unwrap(), vec![200, 202, 202, 204, 255]);
    check(&op(OpKind::QLinearMatMul, &[]), &inputs, Bind::Runtime, EXACT);
}

// ---------------------------------------------------------------------------
// Conv.
// ---------------------------------------------------------------------------

/// Window attribute sets for `r` spatial dims.
fn conv_cases(r: usize) -> Vec<Vec<(&'static str, Attr)>> {
    let k = |v: i64| ia(&vec![v; r]);
    let mut pads_asym: Vec<i64> = (0..r as i64).map(|i| i % 2).collect();
    pads_asym.extend((0..r as i64).map(|i| 2 - i % 2));
    vec![
        vec![],
        vec![("strides", k(2))],
        vec![("pads", ia(&vec![1; 2 * r]))],
        vec![("pads", ia(&pads_asym)), ("strides", k(2))],
        vec![("dilations", k(2))],
        vec![("dilations", k(2)), ("pads", ia(&vec![2; 2 * r])), ("strides", k(3))],
        vec![("auto_pad", s("SAME_UPPER"))],
        vec![("auto_pad", s("SAME_LOWER")), ("strides", k(2))],
        vec![("auto_pad", s("SAME_UPPER")), ("dilations", k(2)), ("strides", k(2))],
        vec![("auto_pad", s("VALID")), ("strides", k(2))],
    ]
}

/// Checks a convolution `kind` with `attrs` and `group = g`: without a bias, every
/// operand at run time; with `bias`, the weights and bias constant.
fn check_grouped(kind: OpKind, attrs: &[(&str, Attr)], g: usize, x: &Tensor, w: &Tensor, bias: &Tensor) {
    let mut a = attrs.to_vec();
    a.push(("group", int(g as i64)));
    let o = op(kind, &a);
    check(&o, &[Some(x.clone()), Some(w.clone()), None], Bind::Runtime, SUM);
    check(&o, &[Some(x.clone()), Some(w.clone()), Some(bias.clone())], Bind::ConstFrom(1), SUM);
}

fn spatial(r: usize) -> &'static [usize] {
    &[7, 6, 5][..r]
}

#[test]
fn conv_windows_groups_bias() {
    let mut n = 0;
    for r in 1..=3 {
        // (C, M, group, kernel extent)
        for (c, m, g, ke) in [(3, 4, 1, 3), (4, 6, 2, 2), (4, 4, 4, 3), (2, 6, 2, 1), (3, 2, 1, 2)] {
            let mut xd = vec![2, c];
            xd.extend(spatial(r));
            let mut wd = vec![m, c / g];
            wd.extend(vec![ke; r]);
            let x = rand(DType::F32, &xd, 70 + n);
            let w = rand(DType::F32, &wd, 71 + n);
            let bias = rand(DType::F32, &[m], 72);
            for attrs in &conv_cases(r) {
                check_grouped(OpKind::Conv, attrs, g, &x, &w, &bias);
                n += 1;
            }
        }
    }
    assert_eq!(n, 3 * 5 * 10);
}

/// A float convolution with several input channels per group computes
/// `[N, group, M/group, …]` (the group an index of its own) and is recognised as a
/// batch of contractions; a depthwise one (one input channel per group) keeps its
/// `[N, M, …]` form. (Their values are checked in `conv_windows_groups_bias`.)
#[test]
fn grouped_convolutions_are_batches_of_contractions() {
    let x = rand(DType::F32, &[1, 6, 9, 9], 1);
    let w = rand(DType::F32, &[4, 3, 3, 3], 2);
    // (Unpadded: a padded window is a `Pad` load until the layout pass puts the
    // padding in front.)
    let o = op(OpKind::Conv, &[("group", int(2))]);
    let (l, out) = lower_from(&o, &[Some(x), Some(w)], 1);
    let k = &l.steps[0].kernel;
    assert_eq!(k.output.shape.dims(), &[1, 2, 2, 7, 7]);
    assert_eq!(out[0].shape.dims(), &[1, 4, 7, 7]);
    let c = kiln_flow::contraction::Contraction::of(k).expect("a contraction");
    assert_eq!(c.dims[0], 2, "rows: the output channels of one group");
    assert_eq!(c.dims[2], 27, "reduction: 3 channels × 3 × 3");
    let dw = op(OpKind::Conv, &[("group", int(6))]);
    let (l, _) =
        lower_from(&dw, &[Some(rand(DType::F32, &[1, 6, 9, 9], 3)), Some(rand(DType::F32, &[6, 1, 3, 3], 4))], 1);
    assert_eq!(l.steps[0].kernel.output.shape.dims(), &[1, 6, 7, 7]);
}

#[test]
fn conv_dtypes_and_odd_shapes() {
    for d in [DType::F64, DType::F16] {
        let x = rand(d, &[1, 3, 9, 8], 1);
        let w = rand(d, &[5, 3, 3, 2], 2);
        let b = rand(d, &[5], 3);
        let o = op(OpKind::Conv, &[("pads", ia(&[1, 0, 2, 1])), ("strides", ia(&[2, 1]))]);
        check2(&o, &[Some(x), Some(w), Some(b)], tol_for(d));
    }
    // 1x1 kernel, 17 channels, kernel_shape given explicitly.
    let x = rand(DType::F32, &[1, 17, 3, 1], 4);
    let w = rand(DType::F32, &[7, 17, 1, 1], 5);
    check2(&op(OpKind::Conv, &[("kernel_shape", ia(&[1, 1]))]), &[Some(x), Some(w)], SUM);
    // Empty batch.
    let x = rand(DType::F32, &[0, 2, 5], 4);
    let w = rand(DType::F32, &[3, 2, 2], 5);
    check2(&op(OpKind::Conv, &[]), &[Some(x), Some(w)], SUM);
}

#[test]
fn conv_hand_computed_and_padding_bounds() {
    // 1-D: x = [1, 2, 3], w = [1, 10], pads 1: [0·1 + 1·10, 1 + 20, 2 + 30, 3 + 0] = [10, 21, 32, 3].
    let x = floats(&[1, 1, 3], &[1.0, 2.0, 3.0]);
    let w = floats(&[1, 1, 2], &[1.0, 10.0]);
    let o = op(OpKind::Conv, &[("pads", ia(&[1, 1]))]);
    assert_eq!(run(&o, &[Some(x.clone()), Some(w.clone())]).to_f64_vec(), vec![10.0, 21.0, 32.0, 3.0]);
    let (l, _) = lower_from(&o, &[Some(x.clone()), Some(w.clone())], usize::MAX);
    assert!(loads(&l).contains(&Bounds::Pad(0)));
    // Without padding every load is proved in bounds.
    let (l, _) = lower_from(&op(OpKind::Conv, &[]), &[Some(x), Some(w)], usize::MAX);
    assert!(loads(&l).iter().all(|b| *b == Bounds::InBounds));
}

#[test]
fn conv_transpose_variants() {
    let mut n = 0;
    for r in 1..=3 {
        let cases: Vec<Vec<(&str, Attr)>> = {
            let k = |v: i64| ia(&vec![v; r]);
            vec![
                vec![],
                vec![("strides", k(2))],
                vec![("strides", k(3)), ("output_padding", k(1))],
                vec![("pads", ia(&vec![1; 2 * r])), ("strides", k(2))],
                vec![("dilations", k(2)), ("strides", k(2))],
                vec![
                    ("strides", k(2)),
                    ("output_shape", ia(&spatial(r).iter().map(|&d| 2 * d as i64 + 1).collect::<Vec<_>>())),
                ],
                vec![("auto_pad", s("SAME_UPPER")), ("strides", k(2))],
                vec![("auto_pad", s("SAME_LOWER")), ("strides", k(2))],
                vec![("auto_pad", s("VALID")), ("strides", k(2))],
                vec![("pads", ia(&(0..2 * r as i64).map(|i| i % 3).collect::<Vec<_>>())), ("dilations", k(2))],
            ]
        };
        for (c, mg, g, ke) in [(3, 2, 1, 3), (4, 3, 2, 2), (4, 1, 4, 3)] {
            let mut xd = vec![2, c];
            xd.extend(spatial(r).iter().map(|&d| d - 2));
            let mut wd = vec![c, mg];
            wd.extend(vec![ke; r]);
            let x = rand(DType::F32, &xd, 80 + n);
            let w = rand(DType::F32, &wd, 81 + n);
            let bias = rand(DType::F32, &[mg * g], 82);
            for attrs in &cases {
                check_grouped(OpKind::ConvTranspose, attrs, g, &x, &w, &bias);
                n += 1;
            }
        }
    }
    assert_eq!(n, 3 * 3 * 10);
    for d in [DType::F64, DType::F16] {
        let x = rand(d, &[1, 2, 4, 3], 1);
        let w = rand(d, &[2, 3, 3, 2], 2);
        let o = op(OpKind::ConvTranspose, &[("strides", ia(&[2, 3])), ("pads", ia(&[1, 0, 0, 1]))]);
        check2(&o, &[Some(x), Some(w)], tol_for(d));
    }
}

/// ConvTranspose as sub-pixel phases: at stride 2 three kernels — the phase filters (a
/// movement over the weights alone), one product over every phase (`[N, phases, M, U, V]`;
/// a contraction once its input is padded: `filetests/conv-transpose`), the interleave (a movement)
/// — with exactly the taps each phase needs when the kernel extent is a multiple of the
/// stride, and `⌈K / s⌉` (the zeros counted) when it is not. At stride 1 the product is
/// the result: a flipped convolution, a window when depthwise.
#[test]
fn conv_transpose_is_phases_of_a_contraction() {
    use kiln_flow::class::{classify, KernelClass};
    let x = rand(DType::F32, &[1, 4, 5, 6], 1);
    for (k, pads, taps, zeros) in [(4usize, 1i64, 2usize, 0usize), (3, 1, 2, 7), (2, 0, 1, 0)] {
        let w = rand(DType::F32, &[4, 3, k, k], 2);
        let o = op(OpKind::ConvTranspose, &[("strides", ia(&[2, 2])), ("pads", ia(&[pads; 4]))]);
        let (l, out) = lower_from(&o, &[Some(x.clone()), Some(w.clone())], 1);
        assert_eq!(l.steps.len(), 3, "kernel {k}");
        let (filters, product, interleave) = (&l.steps[0].kernel, &l.steps[1].kernel, &l.steps[2].kernel);
        assert_eq!(filters.output.shape.dims(), &[4, 3, 4, taps, taps], "kernel {k}");
        assert_eq!(classify(filters), KernelClass::Movement);
        assert_eq!(l.steps[0].operands, vec![kiln_lower::Operand::Input(1)]);
        let d = out[0].shape.dims();
        // Phase positions: ⌈(O + shift) / 2⌉, the shift 0 or 1.
        let pd = product.output.shape.dims();
        assert_eq!(pd[..3], [1, 4, 3], "kernel {k}");
        for (u, o) in pd[3..].iter().zip(&d[2..]) {
            assert!(*u == o.div_ceil(2) || *u == (o + 1).div_ceil(2), "kernel {k}: {pd:?} for {d:?}");
        }
        assert_eq!(classify(interleave), KernelClass::Movement);
        // The filters hold every weight once per phase it serves, zeros elsewhere.
        let f = kiln_flow::interp::run(filters, &[&w]).unwrap().to_f64_vec();
        assert_eq!(f.iter().filter(|&&v| v == 0.0).count(), zeros * 4 * 3, "kernel {k}");
    }
    // Stride 1: one kernel, the result's shape; depthwise, a window.
    let w = rand(DType::F32, &[4, 3, 3, 3], 3);
    let (l, out) = lower_from(&op(OpKind::ConvTranspose, &[]), &[Some(x.clone()), Some(w)], 1);
    assert_eq!(l.steps.len(), 2);
    assert_eq!(l.steps[1].kernel.output.shape.dims(), out[0].shape.dims());
    let dw = op(OpKind::ConvTranspose, &[("group", int(4)), ("pads", ia(&[1; 4]))]);
    let (l, _) = lower_from(&dw, &[Some(x), Some(rand(DType::F32, &[4, 1, 3, 3], 4))], 1);
    assert_eq!(classify(&l.steps[1].kernel), KernelClass::Window);
}

#[test]
fn conv_transpose_hand_computed() {
    // x = [1, 2], w = [1, 10, 100], stride 2: y = [1, 10, 100+2, 20, 200].
    let x = floats(&[1, 1, 2], &[1.0, 2.0]);
    let w = floats(&[1, 1, 3], &[1.0, 10.0, 100.0]);
    let o = op(OpKind::ConvTranspose, &[("strides", ia(&[2]))]);
    assert_eq!(run(&o, &[Some(x), Some(w)]).to_f64_vec(), vec![1.0, 10.0, 102.0, 20.0, 200.0]);
}

#[test]
fn conv_integer_zero_points_and_padding() {
    for (dx, dw) in [(DType::U8, DType::U8), (DType::I8, DType::I8), (DType::U8, DType::I8)] {
        let x = wide(dx, &[2, 4, 6, 5], 1);
        let w = wide(dw, &[6, 2, 3, 2], 2);
        let xzs = [None, Some(wide(dx, &[], 3)), Some(wide(dx, &[1], 4))];
        let wzs = [None, Some(wide(dw, &[], 5)), Some(wide(dw, &[6], 6))];
        for attrs in [
            vec![("group", int(2))],
            vec![("group", int(2)), ("pads", ia(&[1, 2, 1, 0])), ("strides", ia(&[2, 1]))],
            vec![("group", int(2)), ("auto_pad", s("SAME_LOWER")), ("dilations", ia(&[2, 2]))],
        ] {
            let o = op(OpKind::ConvInteger, &attrs);
            for xz in &xzs {
                for wz in &wzs {
                    let inputs = vec![Some(x.clone()), Some(w.clone()), xz.clone(), wz.clone()];
                    // Zero points constant (padding pads with the zero point) and run-time
                    // (padding is guarded).
                    check(&o, &inputs, Bind::Runtime, EXACT);
                    check(&o, &inputs, Bind::ConstFrom(2), EXACT);
                }
            }
        }
    }
    // Hand: x = [10, 20], zp 10, w = [1, 1], pads 1: [0 + 0, 0 + 10, 10 + 0] (padding contributes 0).
    let x = typed_i(DType::U8, &[1, 1, 2], &[10, 20]);
    let w = typed_i(DType::U8, &[1, 1, 2], &[1, 1]);
    let xz = typed_i(DType::U8, &[], &[10]);
    let got = run(&op(OpKind::ConvInteger, &[("pads", ia(&[1, 1]))]), &[Some(x), Some(w), Some(xz), None]);
    assert_eq!(got.to_i64_vec().unwrap(), vec![0, 10, 10]);
}

#[test]
fn qlinear_conv_per_tensor_and_per_channel() {
    for (dx, dw, dy) in
        [(DType::U8, DType::U8, DType::U8), (DType::I8, DType::I8, DType::I8), (DType::U8, DType::I8, DType::U8)]
    {
        let x = wide(dx, &[1, 4, 5, 6], 1);
        let w = wide(dw, &[4, 2, 3, 3], 2);
        let bias = typed_i(DType::I32, &[4], &[-1000, 0, 77, 5000]);
        let per_channel = [
            (floats(&[], &[0.003]), wide(dw, &[], 3)),
            (floats(&[4], &[0.001, 0.002, 0.004, 0.0035]), wide(dw, &[4], 4)),
        ];
        for (ws, wz) in per_channel {
            for attrs in [
                vec![("group", int(2))],
                vec![("group", int(2)), ("pads", ia(&[1, 1, 1, 1])), ("strides", ia(&[2, 2]))],
            ] {
                for b in [None, Some(bias.clone())] {
                    let inputs = vec![
                        Some(x.clone()),
                        Some(floats(&[], &[0.05])),
                        Some(wide(dx, &[], 7)),
                        Some(w.clone()),
                        Some(ws.clone()),
                        Some(wz.clone()),
                        Some(floats(&[], &[0.9])),
                        Some(wide(dy, &[], 8)),
                        b,
                    ];
                    let o = op(OpKind::QLinearConv, &attrs);
                    check(&o, &inputs, Bind::Runtime, EXACT);
                    check(&o, &inputs, Bind::ConstFrom(1), EXACT);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Einsum.
// ---------------------------------------------------------------------------

#[test]
fn einsum_equations() {
    let cases: [(&str, &[&[usize]]); 18] = [
        ("ij,jk->ik", &[&[3, 4], &[4, 5]]),
        ("ij,jk", &[&[3, 4], &[4, 5]]),
        ("ii->i", &[&[4, 4]]),
        ("ii", &[&[4, 4]]),
        ("ij->ji", &[&[3, 5]]),
        ("ij->", &[&[3, 5]]),
        ("i,i", &[&[7], &[7]]),
        ("i,j->ij", &[&[3], &[4]]),
        ("bij,bjk->bik", &[&[2, 3, 4], &[2, 4, 5]]),
        ("...ij,...jk->...ik", &[&[2, 3, 4], &[2, 4, 5]]),
        ("...ij,jk", &[&[2, 2, 3, 4], &[4, 5]]),
        ("ij,jk,kl->il", &[&[2, 3], &[3, 4], &[4, 2]]),
        ("iij->j", &[&[3, 3, 4]]),
        ("ij,ij->ij", &[&[3, 1], &[3, 4]]),
        ("Ab,bC->AC", &[&[2, 3], &[3, 2]]),
        ("bhqd,bhkd->bhqk", &[&[1, 2, 3, 4], &[1, 2, 5, 4]]),
        ("i...->...", &[&[3, 2, 2]]),
        ("ij,jk->ik", &[&[3, 0], &[0, 2]]),
    ];
    for (eq, shapes) in cases {
        for d in [DType::F32, DType::F64, DType::I32, DType::I64] {
            let inputs: Vec<Option<Tensor>> =
                shapes.iter().enumerate().map(|(i, s)| Some(rand(d, s, 90 + i as u64))).collect();
            let o = op(OpKind::Einsum, &[("equation", s(eq))]);
            check(&o, &inputs, Bind::Runtime, tol_for(d));
        }
    }
    // Hand: trace of [[1,2],[3,4]] is 5; its diagonal is [1, 4].
    let x = floats(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(run(&op(OpKind::Einsum, &[("equation", s("ii"))]), &[Some(x.clone())]).to_f64_vec(), vec![5.0]);
    assert_eq!(run(&op(OpKind::Einsum, &[("equation", s("ii->i"))]), &[Some(x)]).to_f64_vec(), vec![1.0, 4.0]);
}

// ---------------------------------------------------------------------------
// Det.
// ---------------------------------------------------------------------------

#[test]
fn det_batches_and_dtypes() {
    for d in [DType::F64, DType::F32, DType::F16] {
        for dims in [&[1, 1][..], &[2, 2], &[3, 3], &[4, 4], &[2, 5, 5], &[2, 3, 3, 3], &[7, 7], &[0, 3, 3], &[2, 0, 0]]
        {
            let x = rand(d, dims, 100);
            let tol = match d {
                DType::F64 => Tol { rtol: 1e-12, atol: 1e-12 },
                DType::F32 => Tol { rtol: 1e-4, atol: 1e-4 },
                _ => Tol { rtol: 5e-3, atol: 5e-3 },
            };
            check(&op(OpKind::Det, &[]), &[Some(x)], Bind::Runtime, tol);
        }
    }
}

#[test]
fn det_hand_computed_pivots_and_singular() {
    let det = |v: &[f64], n: usize| run(&op(OpKind::Det, &[]), &[Some(typed(DType::F64, &[n, n], v))]).to_f64_vec()[0];
    assert_eq!(det(&[1.0, 2.0, 3.0, 4.0], 2), -2.0);
    // A zero in the top-left corner needs a row swap: det [[0, 1], [1, 0]] = −1.
    assert_eq!(det(&[0.0, 1.0, 1.0, 0.0], 2), -1.0);
    // Singular: a repeated row gives exactly 0, also when later entries are huge or NaN.
    assert_eq!(det(&[1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0, 5.0, 7.0], 3), 0.0);
    assert_eq!(det(&[0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 5.0, f64::NAN], 3), 0.0);
    // Every 3x3 permutation matrix has determinant ±1 (the sign of the permutation).
    let perms = [[0, 1, 2], [0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]];
    let signs = [1.0, -1.0, -1.0, 1.0, 1.0, -1.0];
    for (p, sgn) in perms.iter().zip(signs) {
        let mut m = [0.0; 9];
        for (r, &c) in p.iter().enumerate() {
            m[r * 3 + c] = 1.0;
        }
        assert_eq!(det(&m, 3), sgn, "{p:?}");
    }
    // Triangular: the product of the diagonal.
    assert_eq!(det(&[2.0, 7.0, 1.0, 0.0, 3.0, 5.0, 0.0, 0.0, -4.0], 3), -24.0);
    let x = typed(DType::F64, &[3, 3], &[0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 5.0, f64::NAN]);
    check(&op(OpKind::Det, &[]), &[Some(x)], Bind::Runtime, EXACT);
}

#[test]
fn det_ints_reject_cleanly() {
    let x = ints(&[2, 2], &[1, 2, 3, 4]);
    let xs = [Some(x.clone())];
    let ninfer = infer_inputs(&xs);
    // Det is float-only in shape inference already; lowering an int Det by hand errors.
    assert!(infer(&op(OpKind::Det, &[]), &ninfer, 1).is_err());
    let tys = vec![kiln_ir::TensorType::new(DType::I64, Shape::new(vec![]).unwrap())];
    let opin = vec![Some(OpInput { ty: x.ty(), value: None })];
    let o = op(OpKind::Det, &[]);
    let cx = OpCx { op: &o, name: "t", inputs: &opin, outputs: &tys };
    assert!(lower_op(&cx).is_err());
    let _ = compare;
    let _ = F32;
}

#[test]
fn qlinear_matmul_float8() {
    // 8-bit float operands accumulate in f64; the result is not rounded to an integer.
    let d = DType::F8E4M3FN;
    let a = rand(d, &[3, 5], 1);
    let b = rand(d, &[5, 4], 2);
    let inputs = vec![
        Some(a),
        Some(floats(&[], &[0.5])),
        Some(typed(d, &[], &[0.25])),
        Some(b),
        Some(floats(&[4], &[1.0, 0.5, 0.25, 2.0])),
        Some(typed(d, &[4], &[0.0, 1.0, -1.0, 0.5])),
        Some(floats(&[], &[0.75])),
        Some(typed(d, &[], &[1.0])),
    ];
    check(&op(OpKind::QLinearMatMul, &[]), &inputs, Bind::Runtime, EXACT);
}
