//! Tests of the contraction, convolution, pooling and recurrent operators of the
//! reference evaluator. Expected values are hand-computed, follow from the ONNX
//! formulas evaluated directly in the test, or come from naive loops written
//! from the operator's definition (never from the evaluator itself).

use kiln_ir::{Attr, Attrs, DType, Op, OpKind, Shape, Tensor, TensorType};
use kiln_ref::eval_op;

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn shape(d: &[usize]) -> Shape {
    Shape::new(d.to_vec()).unwrap()
}

/// An f64 tensor.
fn t(d: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F64, shape(d), v).unwrap()
}

/// A tensor of dtype `dt` from integers.
fn ti(dt: DType, d: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_i64(dt, shape(d), v).unwrap()
}

/// An f64 tensor 0, 1, 2, … of shape `d`.
fn iota(d: &[usize]) -> Tensor {
    let n: usize = d.iter().product();
    t(d, &(0..n).map(|i| i as f64).collect::<Vec<_>>())
}

/// Deterministic pseudo-random small integers as f64 (exact products and sums).
fn ints(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) % 7) as f64 - 3.0
        })
        .collect()
}

fn op(kind: OpKind, attrs: &[(&str, Attr)]) -> Op {
    let mut a = Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    Op::parse(kind, &a).unwrap()
}

/// The op, or `None` when its attributes are rejected at parse.
fn checked_op(kind: OpKind, attrs: &[(&str, Attr)]) -> Option<Op> {
    let mut a = Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    Op::parse(kind, &a).ok()
}

fn ints_attr(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// Runs `o` with results of the given dtypes and dims.
fn run(o: &Op, ins: &[Option<&Tensor>], outs: &[(DType, &[usize])]) -> Vec<Tensor> {
    let tys: Vec<TensorType> = outs.iter().map(|(d, s)| TensorType::new(*d, shape(s))).collect();
    eval_op(o, ins, &tys).unwrap_or_else(|e| panic!("{} failed: {e}", o.kind))
}

/// Runs `o` on f64 operands, one f64 result of dims `out`, returned as values.
fn run1(o: &Op, ins: &[Option<&Tensor>], out: &[usize]) -> Vec<f64> {
    run(o, ins, &[(DType::F64, out)])[0].to_f64_vec()
}

fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "lengths differ: {got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "element {i}: got {g}, want {w}\n{got:?}\n{want:?}");
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ---------------------------------------------------------------------------
// MatMul, Gemm, MatMulInteger, QLinearMatMul.
// ---------------------------------------------------------------------------

#[test]
fn matmul_2d() {
    let a = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let b = t(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
    let y = run1(&op(OpKind::MatMul, &[]), &[Some(&a), Some(&b)], &[2, 2]);
    assert_eq!(y, vec![58., 64., 139., 154.]);
}

#[test]
fn matmul_1d_promotion() {
    let a = t(&[3], &[1., 2., 3.]);
    let b = t(&[3, 2], &[7., 8., 9., 10., 11., 12.]);
    let m = op(OpKind::MatMul, &[]);
    assert_eq!(run1(&m, &[Some(&a), Some(&b)], &[2]), vec![58., 64.]);
    let a2 = t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let ones = t(&[3], &[1., 1., 1.]);
    assert_eq!(run1(&m, &[Some(&a2), Some(&ones)], &[2]), vec![6., 15.]);
    assert_eq!(run1(&m, &[Some(&a), Some(&ones)], &[]), vec![6.]);
    // A 1-D operand against a batched one: [3] · [2, 3, 2] → [2, 2].
    let bb = t(&[2, 3, 2], &[7., 8., 9., 10., 11., 12., 1., 0., 0., 1., 1., 1.]);
    assert_eq!(run1(&m, &[Some(&a), Some(&bb)], &[2, 2]), vec![58., 64., 4., 5.]);
}

/// Naive batched matmul of row-major operands broadcast to batch `batch`.
#[allow(clippy::too_many_arguments)]
fn naive_matmul(
    a: &[f64],
    ab: &[usize],
    b: &[f64],
    bb: &[usize],
    batch: &[usize],
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f64> {
    let nb: usize = batch.iter().product();
    let mut out = vec![0.0; nb * m * n];
    let flat = |idx: &[usize], dims: &[usize]| {
        // Right-aligned broadcast index.
        let off = idx.len() - dims.len();
        let mut f = 0;
        for (i, &d) in dims.iter().enumerate() {
            f = f * d + if d == 1 { 0 } else { idx[off + i] };
        }
        f
    };
    for bi in 0..nb {
        let mut idx = vec![0; batch.len()];
        let mut r = bi;
        for d in (0..batch.len()).rev() {
            idx[d] = r % batch[d];
            r /= batch[d];
        }
        let (fa, fb) = (flat(&idx, ab), flat(&idx, bb));
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for kk in 0..k {
                    s += a[(fa * m + i) * k + kk] * b[(fb * k + kk) * n + j];
                }
                out[(bi * m + i) * n + j] = s;
            }
        }
    }
    out
}

#[test]
fn matmul_batch_broadcast() {
    let (m, k, n) = (3, 4, 5);
    let av = ints(2 * m * k, 1);
    let bv = ints(3 * k * n, 2);
    let a = t(&[2, 1, m, k], &av);
    let b = t(&[3, k, n], &bv);
    let y = run1(&op(OpKind::MatMul, &[]), &[Some(&a), Some(&b)], &[2, 3, m, n]);
    assert_eq!(y, naive_matmul(&av, &[2, 1], &bv, &[3], &[2, 3], m, k, n));
}

#[test]
fn matmul_large_blocks_exact() {
    // Crosses the kernel's row and column blocks and its 4-row unrolling remainder.
    let (m, k, n) = (5, 263, 601);
    let av = ints(m * k, 3);
    let bv = ints(k * n, 4);
    let y = run1(&op(OpKind::MatMul, &[]), &[Some(&t(&[m, k], &av)), Some(&t(&[k, n], &bv))], &[m, n]);
    assert_eq!(y, naive_matmul(&av, &[], &bv, &[], &[], m, k, n));
}

#[test]
fn matmul_f32_and_int_wrapping() {
    let a = Tensor::from_f64(DType::F32, shape(&[1, 2]), &[0.5, 1.5]).unwrap();
    let b = Tensor::from_f64(DType::F32, shape(&[2, 1]), &[2.0, 4.0]).unwrap();
    let y = run(&op(OpKind::MatMul, &[]), &[Some(&a), Some(&b)], &[(DType::F32, &[1, 1])]);
    assert_eq!(y[0].to_f64_vec(), vec![7.0]);
    let a = ti(DType::I32, &[1, 2], &[1 << 30, 3]);
    let b = ti(DType::I32, &[2, 1], &[4, -2]);
    let y = run(&op(OpKind::MatMul, &[]), &[Some(&a), Some(&b)], &[(DType::I32, &[1, 1])]);
    // 2^32 wraps to 0 in i32; plus 3·(−2).
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![-6]);
}

#[test]
fn matmul_bad_shapes_are_errors() {
    let a = t(&[2, 3], &[0.; 6]);
    let b = t(&[2, 2], &[0.; 4]);
    let tys = [TensorType::new(DType::F64, shape(&[2, 2]))];
    assert!(eval_op(&op(OpKind::MatMul, &[]), &[Some(&a), Some(&b)], &tys).is_err());
    // A wrong result type is an error too.
    let b = t(&[3, 2], &[0.; 6]);
    let tys = [TensorType::new(DType::F64, shape(&[3, 3]))];
    assert!(eval_op(&op(OpKind::MatMul, &[]), &[Some(&a), Some(&b)], &tys).is_err());
    assert!(eval_op(&op(OpKind::MatMul, &[]), &[Some(&a)], &tys).is_err());
}

#[test]
fn gemm_transposes_alpha_beta_bias() {
    // A = [[1,2],[3,4]], B = [[5,6],[7,8]]; AᵀB = [[26,30],[38,44]], ABᵀ = [[17,23],[39,53]],
    // AᵀBᵀ = [[23,31],[34,46]], AB = [[19,22],[43,50]].
    let a = t(&[2, 2], &[1., 2., 3., 4.]);
    let b = t(&[2, 2], &[5., 6., 7., 8.]);
    let cases = [
        (0, 0, [19., 22., 43., 50.]),
        (1, 0, [26., 30., 38., 44.]),
        (0, 1, [17., 23., 39., 53.]),
        (1, 1, [23., 31., 34., 46.]),
    ];
    for (ta, tb, want) in cases {
        let g = op(OpKind::Gemm, &[("transA", Attr::Int(ta)), ("transB", Attr::Int(tb))]);
        assert_eq!(run1(&g, &[Some(&a), Some(&b)], &[2, 2]), want.to_vec(), "transA={ta} transB={tb}");
    }
    // alpha = 2, beta = 0.5, C broadcast as [N], [M, 1], scalar and [M, N].
    let g = op(OpKind::Gemm, &[("alpha", Attr::Float(2.0)), ("beta", Attr::Float(0.5))]);
    let c_n = t(&[2], &[10., 20.]);
    assert_eq!(run1(&g, &[Some(&a), Some(&b), Some(&c_n)], &[2, 2]), vec![43., 54., 91., 110.]);
    let c_m1 = t(&[2, 1], &[10., 20.]);
    assert_eq!(run1(&g, &[Some(&a), Some(&b), Some(&c_m1)], &[2, 2]), vec![43., 49., 96., 110.]);
    let c_s = t(&[], &[4.]);
    assert_eq!(run1(&g, &[Some(&a), Some(&b), Some(&c_s)], &[2, 2]), vec![40., 46., 88., 102.]);
    let c_mn = t(&[2, 2], &[2., 4., 6., 8.]);
    assert_eq!(run1(&g, &[Some(&a), Some(&b), Some(&c_mn)], &[2, 2]), vec![39., 46., 89., 104.]);
    // Non-square with transA: A is [K=3, M=2].
    let a = t(&[3, 2], &[1., 4., 2., 5., 3., 6.]);
    let b = t(&[3, 1], &[1., 1., 1.]);
    let g = op(OpKind::Gemm, &[("transA", Attr::Int(1))]);
    assert_eq!(run1(&g, &[Some(&a), Some(&b)], &[2, 1]), vec![6., 15.]);
    // C that does not broadcast.
    let c_bad = t(&[3], &[0.; 3]);
    let tys = [TensorType::new(DType::F64, shape(&[2, 1]))];
    assert!(eval_op(&g, &[Some(&a), Some(&b), Some(&c_bad)], &tys).is_err());
}

#[test]
fn matmul_integer_zero_points() {
    // A − 1 = [[0,1],[2,3]]; B − [5,6] per column = [[0,0],[2,2]].
    let a = ti(DType::U8, &[2, 2], &[1, 2, 3, 4]);
    let b = ti(DType::U8, &[2, 2], &[5, 6, 7, 8]);
    let az = ti(DType::U8, &[], &[1]);
    let bz = ti(DType::U8, &[2], &[5, 6]);
    let o = op(OpKind::MatMulInteger, &[]);
    let y = run(&o, &[Some(&a), Some(&b), Some(&az), Some(&bz)], &[(DType::I32, &[2, 2])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![2, 2, 6, 6]);
    // Per-row zero point of A: rows minus 1 and 3 → [[0,1],[0,1]]; no B zero point.
    let az = ti(DType::U8, &[2], &[1, 3]);
    let y = run(&o, &[Some(&a), Some(&b), Some(&az), None], &[(DType::I32, &[2, 2])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![7, 8, 7, 8]);
    // Signed extremes: (−128)·(−128)·2 = 32768.
    let a = ti(DType::I8, &[1, 2], &[-128, -128]);
    let b = ti(DType::I8, &[2, 1], &[-128, -128]);
    let y = run(&o, &[Some(&a), Some(&b)], &[(DType::I32, &[1, 1])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![32768]);
}

#[test]
fn qlinear_matmul_by_hand() {
    // a − 2 = [[0, 2]], b − 1 = [[1],[3]] → acc = 6; 6 · (0.5·0.25 / 0.125) = 6, + 10.
    let a = ti(DType::U8, &[1, 2], &[2, 4]);
    let b = ti(DType::U8, &[2, 1], &[2, 4]);
    let f = |v: f64| t(&[], &[v]);
    let (a_s, b_s, y_s) = (f(0.5), f(0.25), f(0.125));
    let a_z = ti(DType::U8, &[], &[2]);
    let b_z = ti(DType::U8, &[], &[1]);
    let y_z = ti(DType::U8, &[], &[10]);
    let o = op(OpKind::QLinearMatMul, &[]);
    let qmm = |y_s: &Tensor| {
        let ins = [Some(&a), Some(&a_s), Some(&a_z), Some(&b), Some(&b_s), Some(&b_z), Some(y_s), Some(&y_z)];
        run(&o, &ins, &[(DType::U8, &[1, 1])])[0].to_i64_vec().unwrap()
    };
    assert_eq!(qmm(&y_s), vec![16]);
    // Rounding half to even and saturation: y_scale 0.5 → 1.5 rounds to 2; y_scale 0.001 → 750 + 10 saturates to 255.
    assert_eq!(qmm(&f(0.5)), vec![12]);
    assert_eq!(qmm(&f(0.001)), vec![255]);
}

// ---------------------------------------------------------------------------
// Einsum.
// ---------------------------------------------------------------------------

fn einsum(eq: &str, ins: &[&Tensor], out: &[usize]) -> Vec<f64> {
    let o = op(OpKind::Einsum, &[("equation", Attr::String(eq.to_string()))]);
    let ins: Vec<Option<&Tensor>> = ins.iter().map(|x| Some(*x)).collect();
    run1(&o, &ins, out)
}

#[test]
fn einsum_matmul_forms() {
    let (av, bv) = (ints(12, 5), ints(20, 6));
    let a = t(&[3, 4], &av);
    let b = t(&[4, 5], &bv);
    let want = naive_matmul(&av, &[], &bv, &[], &[], 3, 4, 5);
    assert_eq!(einsum("ij,jk->ik", &[&a, &b], &[3, 5]), want);
    assert_eq!(einsum("ij,jk", &[&a, &b], &[3, 5]), want); // implicit output "ik"
    assert_eq!(einsum(" i j , j k -> i k ", &[&a, &b], &[3, 5]), want);
    let (av, bv) = (ints(2 * 3 * 4, 7), ints(2 * 4 * 2, 8));
    let a = t(&[2, 3, 4], &av);
    let b = t(&[2, 4, 2], &bv);
    assert_eq!(einsum("bij,bjk->bik", &[&a, &b], &[2, 3, 2]), naive_matmul(&av, &[2], &bv, &[2], &[2], 3, 4, 2));
}

#[test]
fn einsum_diagonal_trace_transpose_sum() {
    let x = iota(&[3, 3]);
    assert_eq!(einsum("ii->i", &[&x], &[3]), vec![0., 4., 8.]);
    assert_eq!(einsum("ii", &[&x], &[]), vec![12.]);
    assert_eq!(einsum("ij->", &[&x], &[]), vec![36.]);
    assert_eq!(einsum("ij->j", &[&x], &[3]), vec![9., 12., 15.]);
    assert_eq!(einsum("ji", &[&iota(&[2, 3])], &[3, 2]), vec![0., 3., 1., 4., 2., 5.]); // implicit: "ij" sorted
    assert_eq!(einsum("ij->ji", &[&iota(&[2, 3])], &[3, 2]), vec![0., 3., 1., 4., 2., 5.]);
    let v = t(&[3], &[1., 2., 3.]);
    assert_eq!(einsum("i,i", &[&v, &v], &[]), vec![14.]);
    assert_eq!(einsum("i,j->ij", &[&v, &t(&[2], &[1., 10.])], &[3, 2]), vec![1., 10., 2., 20., 3., 30.]);
    // Batched diagonal.
    let x = iota(&[2, 2, 2]);
    assert_eq!(einsum("bii->bi", &[&x], &[2, 2]), vec![0., 3., 4., 7.]);
}

#[test]
fn einsum_ellipsis() {
    // "...ij->...ji" on [2, 2, 3]: per batch transpose.
    let x = iota(&[2, 2, 3]);
    let mut want = Vec::new();
    for b in 0..2 {
        for j in 0..3 {
            for i in 0..2 {
                want.push((b * 6 + i * 3 + j) as f64);
            }
        }
    }
    assert_eq!(einsum("...ij->...ji", &[&x], &[2, 3, 2]), want);
    // Ellipsis of width 0, and broadcasting ellipsis dims: [2,1,1,2] · [3,2,2] → [2,3,1,2].
    assert_eq!(einsum("...ij->...ji", &[&iota(&[2, 3])], &[3, 2]), vec![0., 3., 1., 4., 2., 5.]);
    let (av, bv) = (ints(2 * 2, 9), ints(3 * 2 * 2, 10));
    let a = t(&[2, 1, 1, 2], &av);
    let b = t(&[3, 2, 2], &bv);
    let y = einsum("...ij,...jk->...ik", &[&a, &b], &[2, 3, 1, 2]);
    assert_eq!(y, naive_matmul(&av, &[2, 1], &bv, &[3], &[2, 3], 1, 2, 2));
    // Implicit output puts the ellipsis first.
    let x = iota(&[2, 3]);
    assert_eq!(einsum("...i", &[&x], &[2, 3]), (0..6).map(|v| v as f64).collect::<Vec<_>>());
}

#[test]
fn einsum_errors() {
    let x = iota(&[2, 3]);
    let tys = [TensorType::new(DType::F64, shape(&[2]))];
    for eq in ["ii->i", "ijk->i", "ij->k", "ij->ii", "i.j->i"] {
        let o = op(OpKind::Einsum, &[("equation", Attr::String(eq.into()))]);
        assert!(eval_op(&o, &[Some(&x)], &tys).is_err(), "{eq}");
    }
}

// ---------------------------------------------------------------------------
// Det.
// ---------------------------------------------------------------------------

#[test]
fn det_known_matrices() {
    let d = op(OpKind::Det, &[]);
    assert_close(&run1(&d, &[Some(&t(&[2, 2], &[1., 2., 3., 4.]))], &[]), &[-2.0], 1e-12);
    // The classic 3×3 example: 6(−14−40) − 1(28−10) + 1(32+4) = −306.
    let m = t(&[3, 3], &[6., 1., 1., 4., -2., 5., 2., 8., 7.]);
    assert_close(&run1(&d, &[Some(&m)], &[]), &[-306.0], 1e-12);
    // Batch: a permutation (needs pivoting), a singular matrix, the identity.
    let b = t(&[3, 2, 2], &[0., 1., 1., 0., 1., 2., 2., 4., 1., 0., 0., 1.]);
    assert_close(&run1(&d, &[Some(&b)], &[3]), &[-1.0, 0.0, 1.0], 1e-12);
    // Upper triangular 4×4: product of the diagonal.
    let u = t(&[4, 4], &[2., 5., 7., 1., 0., 3., 2., 9., 0., 0., -1., 4., 0., 0., 0., 0.5]);
    assert_close(&run1(&d, &[Some(&u)], &[]), &[-3.0], 1e-12);
    let tys = [TensorType::new(DType::F64, shape(&[]))];
    assert!(eval_op(&d, &[Some(&iota(&[2, 3]))], &tys).is_err());
}

// ---------------------------------------------------------------------------
// Conv.
// ---------------------------------------------------------------------------

/// Conv by its definition: nested loops over every output and every tap.
#[allow(clippy::too_many_arguments)]
fn naive_conv2d(
    x: &[f64],
    [n, c, h, w]: [usize; 4],
    wt: &[f64],
    [m, cg, kh, kw]: [usize; 4],
    group: usize,
    [sh, sw]: [usize; 2],
    [dh, dw]: [usize; 2],
    [pt, pl]: [i64; 2],
    [oh, ow]: [usize; 2],
) -> Vec<f64> {
    let mg = m / group;
    let mut y = vec![0.0; n * m * oh * ow];
    let window = Window { k: [kh, kw], stride: [sh, sw], dil: [dh, dw], pad: [pt, pl] };
    for ni in 0..n {
        for mi in 0..m {
            let xc0 = mi / mg * cg;
            for ci in 0..cg {
                window.each_tap([oh, ow], [h, w], |[oy, ox], [ky, kx], [iy, ix]| {
                    y[((ni * m + mi) * oh + oy) * ow + ox] +=
                        x[((ni * c + xc0 + ci) * h + iy) * w + ix] * wt[((mi * cg + ci) * kh + ky) * kw + kx];
                });
            }
        }
    }
    y
}

/// A 2-D window's geometry: taps, strides, dilations, leading pads.
struct Window {
    k: [usize; 2],
    stride: [usize; 2],
    dil: [usize; 2],
    pad: [i64; 2],
}

impl Window {
    /// Calls `f(p, t, q)` for every position `p` below `from` and tap `t` below the
    /// window whose `q = p · stride + t · dilation − pad` lies below `to` (in that order:
    /// positions, then taps, row-major). Conv gathers input `q` into output `p`;
    /// ConvTranspose scatters input `p` into output `q`.
    fn each_tap(&self, from: [usize; 2], to: [usize; 2], mut f: impl FnMut([usize; 2], [usize; 2], [usize; 2])) {
        let at = |p: usize, t: usize, d: usize| (p * self.stride[d] + t * self.dil[d]) as i64 - self.pad[d];
        for py in 0..from[0] {
            for px in 0..from[1] {
                for ty in 0..self.k[0] {
                    for tx in 0..self.k[1] {
                        let (qy, qx) = (at(py, ty, 0), at(px, tx, 1));
                        if qy < 0 || qx < 0 || qy >= to[0] as i64 || qx >= to[1] as i64 {
                            continue;
                        }
                        f([py, px], [ty, tx], [qy as usize, qx as usize]);
                    }
                }
            }
        }
    }
}

#[test]
fn conv_single_channel_by_hand() {
    let x = t(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let w = t(&[1, 1, 2, 2], &[1., 0., 0., 1.]);
    let y = run1(&op(OpKind::Conv, &[]), &[Some(&x), Some(&w)], &[1, 1, 2, 2]);
    assert_eq!(y, vec![6., 8., 12., 14.]);
}

#[test]
fn conv_padded_and_strided() {
    // x = 0..24 (5×5), 3×3 ones.
    let x = iota(&[1, 1, 5, 5]);
    let w = t(&[1, 1, 3, 3], &[1.; 9]);
    let o = op(OpKind::Conv, &[("pads", ints_attr(&[1, 1, 1, 1]))]);
    let y = run1(&o, &[Some(&x), Some(&w)], &[1, 1, 5, 5]);
    #[rustfmt::skip]
    let want = [12., 21., 27., 33., 24., 33., 54., 63., 72., 51., 63., 99., 108., 117., 81.,
        93., 144., 153., 162., 111., 72., 111., 117., 123., 84.];
    assert_eq!(y, want.to_vec());
    let o = op(OpKind::Conv, &[("pads", ints_attr(&[1, 1, 1, 1])), ("strides", ints_attr(&[2, 2]))]);
    let y = run1(&o, &[Some(&x), Some(&w)], &[1, 1, 3, 3]);
    assert_eq!(y, vec![12., 27., 24., 63., 108., 81., 72., 117., 84.]);
    // Asymmetric padding (top 1, left 0, bottom 1, right 0), strides 2: rows start −1, 1, 3.
    let o = op(OpKind::Conv, &[("pads", ints_attr(&[1, 0, 1, 0])), ("strides", ints_attr(&[2, 2]))]);
    let y = run1(&o, &[Some(&x), Some(&w)], &[1, 1, 3, 2]);
    assert_eq!(y, vec![21., 33., 99., 117., 111., 123.]);
}

#[test]
fn conv_dilated() {
    let x = iota(&[1, 1, 4, 4]);
    let w = t(&[1, 1, 2, 2], &[1.; 4]);
    let o = op(OpKind::Conv, &[("dilations", ints_attr(&[2, 2]))]);
    assert_eq!(run1(&o, &[Some(&x), Some(&w)], &[1, 1, 2, 2]), vec![20., 24., 36., 40.]);
}

#[test]
fn conv_grouped_and_depthwise_with_bias() {
    // Depthwise: channel 0 × 2 + 1, channel 1 × 3 − 1.
    let x = t(&[1, 2, 1, 2], &[1., 2., 3., 4.]);
    let w = t(&[2, 1, 1, 1], &[2., 3.]);
    let b = t(&[2], &[1., -1.]);
    let o = op(OpKind::Conv, &[("group", Attr::Int(2))]);
    assert_eq!(run1(&o, &[Some(&x), Some(&w), Some(&b)], &[1, 2, 1, 2]), vec![3., 5., 8., 11.]);
    // Two groups of two channels: out 0 = x0 + x1, out 1 = x2 − x3.
    let x = t(&[1, 4, 1, 1], &[1., 2., 3., 5.]);
    let w = t(&[2, 2, 1, 1], &[1., 1., 1., -1.]);
    assert_eq!(run1(&o, &[Some(&x), Some(&w)], &[1, 2, 1, 1]), vec![3., -2.]);
    // Channel counts that do not fit the group are errors.
    let tys = [TensorType::new(DType::F64, shape(&[1, 2, 1, 1]))];
    let o3 = op(OpKind::Conv, &[("group", Attr::Int(3))]);
    assert!(eval_op(&o3, &[Some(&x), Some(&w)], &tys).is_err());
}

#[test]
fn conv_1d_and_3d() {
    let x = t(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let w = t(&[1, 1, 2], &[1., -1.]);
    assert_eq!(run1(&op(OpKind::Conv, &[]), &[Some(&x), Some(&w)], &[1, 1, 4]), vec![-1.; 4]);
    let o = op(OpKind::Conv, &[("pads", ints_attr(&[1, 1])), ("strides", ints_attr(&[2]))]);
    assert_eq!(run1(&o, &[Some(&x), Some(&w)], &[1, 1, 3]), vec![-1.; 3]);
    let x = t(&[1, 1, 2, 2, 2], &[1., 2., 3., 4., 5., 6., 7., 8.]);
    let w = t(&[1, 1, 2, 2, 2], &[1.; 8]);
    assert_eq!(run1(&op(OpKind::Conv, &[]), &[Some(&x), Some(&w)], &[1, 1, 1, 1, 1]), vec![36.]);
    // 3-D with padding 1 in depth only: depth windows start −1, 0, 1 → [1..4], all, [5..8].
    let o = op(OpKind::Conv, &[("pads", ints_attr(&[1, 0, 0, 1, 0, 0]))]);
    assert_eq!(run1(&o, &[Some(&x), Some(&w)], &[1, 1, 3, 1, 1]), vec![10., 36., 26.]);
}

#[test]
fn conv_auto_pad() {
    let x = t(&[1, 1, 4], &[1., 2., 3., 4.]);
    let w = t(&[1, 1, 2], &[1., 10.]);
    let ap = |s: &str| op(OpKind::Conv, &[("auto_pad", Attr::String(s.into()))]);
    assert_eq!(run1(&ap("SAME_UPPER"), &[Some(&x), Some(&w)], &[1, 1, 4]), vec![21., 32., 43., 4.]);
    assert_eq!(run1(&ap("SAME_LOWER"), &[Some(&x), Some(&w)], &[1, 1, 4]), vec![10., 21., 32., 43.]);
    assert_eq!(run1(&ap("VALID"), &[Some(&x), Some(&w)], &[1, 1, 3]), vec![21., 32., 43.]);
    // SAME with stride 2: out = ceil(4/2) = 2, total pad = max(0, 2 + 2 − 4) = 0.
    let o = op(OpKind::Conv, &[("auto_pad", Attr::String("SAME_UPPER".into())), ("strides", ints_attr(&[2]))]);
    assert_eq!(run1(&o, &[Some(&x), Some(&w)], &[1, 1, 2]), vec![21., 43.]);
}

#[test]
fn conv_matches_definition() {
    // Batches, channels, groups, strides, dilations, asymmetric pads; and one case
    // big enough that im2col splits the output rows into several tiles.
    struct Case {
        x: [usize; 4],
        m: usize,
        group: usize,
        k: [usize; 2],
        s: [usize; 2],
        d: [usize; 2],
        p: [i64; 4],
    }
    let cases = [
        Case { x: [2, 4, 7, 6], m: 6, group: 2, k: [3, 2], s: [2, 1], d: [1, 2], p: [1, 0, 2, 1] },
        Case { x: [1, 3, 9, 9], m: 3, group: 3, k: [3, 3], s: [1, 1], d: [1, 1], p: [1, 1, 1, 1] },
        Case { x: [1, 2, 5, 8], m: 4, group: 1, k: [1, 1], s: [1, 1], d: [1, 1], p: [0, 0, 0, 0] },
        Case { x: [1, 2, 5, 8], m: 4, group: 1, k: [1, 1], s: [2, 3], d: [1, 1], p: [0, 0, 0, 0] },
        Case { x: [1, 64, 62, 22], m: 8, group: 1, k: [3, 3], s: [1, 1], d: [1, 1], p: [0, 0, 0, 0] },
        Case { x: [1, 2, 4, 4], m: 2, group: 1, k: [2, 2], s: [3, 3], d: [1, 1], p: [3, 3, 3, 3] },
    ];
    for (ci, cs) in cases.iter().enumerate() {
        let [n, c, h, w] = cs.x;
        let cg = c / cs.group;
        let xv = ints(n * c * h * w, 11 + ci as u64);
        let wv = ints(cs.m * cg * cs.k[0] * cs.k[1], 12 + ci as u64);
        let dk = |i: usize| (cs.k[i] - 1) * cs.d[i] + 1;
        let oh = (h + cs.p[0] as usize + cs.p[2] as usize - dk(0)) / cs.s[0] + 1;
        let ow = (w + cs.p[1] as usize + cs.p[3] as usize - dk(1)) / cs.s[1] + 1;
        let want = naive_conv2d(
            &xv,
            cs.x,
            &wv,
            [cs.m, cg, cs.k[0], cs.k[1]],
            cs.group,
            cs.s,
            cs.d,
            [cs.p[0], cs.p[1]],
            [oh, ow],
        );
        let o = op(
            OpKind::Conv,
            &[
                ("group", Attr::Int(cs.group as i64)),
                ("strides", ints_attr(&cs.s.map(|v| v as i64))),
                ("dilations", ints_attr(&cs.d.map(|v| v as i64))),
                ("pads", ints_attr(&cs.p)),
                ("kernel_shape", ints_attr(&cs.k.map(|v| v as i64))),
            ],
        );
        let y = run1(&o, &[Some(&t(&cs.x, &xv)), Some(&t(&[cs.m, cg, cs.k[0], cs.k[1]], &wv))], &[n, cs.m, oh, ow]);
        assert_eq!(y, want, "case {ci}");
    }
}

#[test]
fn conv_errors() {
    let x = iota(&[1, 1, 2, 2]);
    let w = t(&[1, 1, 3, 3], &[1.; 9]);
    let tys = [TensorType::new(DType::F64, shape(&[1, 1, 0, 0]))];
    assert!(eval_op(&op(OpKind::Conv, &[]), &[Some(&x), Some(&w)], &tys).is_err());
    let w = t(&[1, 1, 2, 2], &[1.; 4]);
    let tys = [TensorType::new(DType::F64, shape(&[1, 1, 1, 1]))];
    let bad = op(OpKind::Conv, &[("strides", ints_attr(&[0, 1]))]);
    assert!(eval_op(&bad, &[Some(&x), Some(&w)], &tys).is_err());
    let bad = op(OpKind::Conv, &[("pads", ints_attr(&[1, 1]))]);
    assert!(eval_op(&bad, &[Some(&x), Some(&w)], &tys).is_err());
    let bad = op(OpKind::Conv, &[("kernel_shape", ints_attr(&[3, 3]))]);
    assert!(eval_op(&bad, &[Some(&x), Some(&w)], &tys).is_err());
    let b = t(&[2], &[0., 0.]);
    assert!(eval_op(&op(OpKind::Conv, &[]), &[Some(&x), Some(&w), Some(&b)], &tys).is_err());
}

#[test]
fn conv_integer_zero_points() {
    // x − 1 = 1..9, 2×2 ones: window sums.
    let x = ti(DType::U8, &[1, 1, 3, 3], &[2, 3, 4, 5, 6, 7, 8, 9, 10]);
    let w = ti(DType::U8, &[1, 1, 2, 2], &[1, 1, 1, 1]);
    let xz = ti(DType::U8, &[], &[1]);
    let o = op(OpKind::ConvInteger, &[]);
    let y = run(&o, &[Some(&x), Some(&w), Some(&xz)], &[(DType::I32, &[1, 1, 2, 2])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![12, 16, 24, 28]);
    // Padding is the zero point: it contributes nothing.
    let o = op(OpKind::ConvInteger, &[("pads", ints_attr(&[1, 1, 0, 0]))]);
    let y = run(&o, &[Some(&x), Some(&w), Some(&xz)], &[(DType::I32, &[1, 1, 3, 3])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![1, 3, 5, 5, 12, 16, 11, 24, 28]);
    // Weight zero point per output channel: w − [1, 0] → channel 0 all zero, channel 1 ones.
    let w2 = ti(DType::U8, &[2, 1, 2, 2], &[1, 1, 1, 1, 1, 1, 1, 1]);
    let wz = ti(DType::U8, &[2], &[1, 0]);
    let o = op(OpKind::ConvInteger, &[]);
    let y = run(&o, &[Some(&x), Some(&w2), Some(&xz), Some(&wz)], &[(DType::I32, &[1, 2, 2, 2])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![0, 0, 0, 0, 12, 16, 24, 28]);
}

#[test]
fn qlinear_conv_rounding() {
    // x − 10 = [0,10,20,30]; w − 1 = 2; acc + bias 2 = [2,22,42,62];
    // × 0.5·2/4 = [0.5,5.5,10.5,15.5] → half to even [0,6,10,16] + 5.
    let x = ti(DType::U8, &[1, 1, 2, 2], &[10, 20, 30, 40]);
    let w = ti(DType::U8, &[1, 1, 1, 1], &[3]);
    let f = |v: f64| Tensor::from_f64(DType::F32, Shape::scalar(), &[v]).unwrap();
    let (xs, ws, ys) = (f(0.5), f(2.0), f(4.0));
    let xz = ti(DType::U8, &[], &[10]);
    let wz = ti(DType::U8, &[], &[1]);
    let yz = ti(DType::U8, &[], &[5]);
    let b = ti(DType::I32, &[1], &[2]);
    let o = op(OpKind::QLinearConv, &[]);
    let ins = [Some(&x), Some(&xs), Some(&xz), Some(&w), Some(&ws), Some(&wz), Some(&ys), Some(&yz), Some(&b)];
    let y = run(&o, &ins, &[(DType::U8, &[1, 1, 2, 2])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![5, 11, 15, 21]);
}

// ---------------------------------------------------------------------------
// ConvTranspose.
// ---------------------------------------------------------------------------

#[test]
fn conv_transpose_1d_by_hand() {
    let x = t(&[1, 1, 3], &[1., 2., 3.]);
    let w = t(&[1, 1, 2], &[1., 10.]);
    let ct = |a: &[(&str, Attr)]| op(OpKind::ConvTranspose, a);
    let xw = [Some(&x), Some(&w)];
    assert_eq!(run1(&ct(&[]), &xw, &[1, 1, 4]), vec![1., 12., 23., 30.]);
    let s2 = ("strides", ints_attr(&[2]));
    assert_eq!(run1(&ct(std::slice::from_ref(&s2)), &xw, &[1, 1, 6]), vec![1., 10., 2., 20., 3., 30.]);
    assert_eq!(run1(&ct(&[s2.clone(), ("pads", ints_attr(&[1, 1]))]), &xw, &[1, 1, 4]), vec![10., 2., 20., 3.]);
    assert_eq!(
        run1(&ct(&[s2.clone(), ("output_padding", ints_attr(&[1]))]), &xw, &[1, 1, 7]),
        vec![1., 10., 2., 20., 3., 30., 0.]
    );
    assert_eq!(run1(&ct(&[("dilations", ints_attr(&[2]))]), &xw, &[1, 1, 5]), vec![1., 2., 13., 20., 30.]);
    // Bias.
    let b = t(&[1], &[100.]);
    assert_eq!(run1(&ct(&[]), &[Some(&x), Some(&w), Some(&b)], &[1, 1, 4]), vec![101., 112., 123., 130.]);
}

#[test]
fn conv_transpose_output_shape_and_auto_pad() {
    let x = t(&[1, 1, 3], &[1., 2., 3.]);
    let w = t(&[1, 1, 2], &[1., 10.]);
    let xw = [Some(&x), Some(&w)];
    let s2 = ("strides", ints_attr(&[2]));
    let os = |v: i64| ("output_shape", ints_attr(&[v]));
    let ap = |s: &str| ("auto_pad", Attr::String(s.into()));
    let ct = |a: &[(&str, Attr)]| op(OpKind::ConvTranspose, a);
    // Full output 6; asking for 7 pads the end (total padding −1).
    assert_eq!(run1(&ct(&[s2.clone(), os(7)]), &xw, &[1, 1, 7]), vec![1., 10., 2., 20., 3., 30., 0.]);
    // Asking for 4 crops one each side; for 5, NOTSET crops the start, SAME_UPPER the end.
    assert_eq!(run1(&ct(&[s2.clone(), os(4)]), &xw, &[1, 1, 4]), vec![10., 2., 20., 3.]);
    assert_eq!(run1(&ct(&[s2.clone(), os(5)]), &xw, &[1, 1, 5]), vec![10., 2., 20., 3., 30.]);
    assert_eq!(run1(&ct(&[s2.clone(), os(5), ap("SAME_UPPER")]), &xw, &[1, 1, 5]), vec![1., 10., 2., 20., 3.]);
    // The full shape [N, M, L] is accepted too.
    let full = ("output_shape", ints_attr(&[1, 1, 4]));
    assert_eq!(run1(&ct(&[s2.clone(), full]), &xw, &[1, 1, 4]), vec![10., 2., 20., 3.]);
    // auto_pad without output_shape: output = input · stride = 3, total padding 1.
    assert_eq!(run1(&ct(&[ap("SAME_UPPER")]), &xw, &[1, 1, 3]), vec![1., 12., 23.]);
    assert_eq!(run1(&ct(&[ap("SAME_LOWER")]), &xw, &[1, 1, 3]), vec![12., 23., 30.]);
    assert_eq!(run1(&ct(&[ap("VALID")]), &xw, &[1, 1, 4]), vec![1., 12., 23., 30.]);
}

#[test]
fn conv_transpose_matches_scatter_definition() {
    // 2-D, batch 2, 4 input channels, 2 groups, 3 output channels per group, strides,
    // dilations, asymmetric pads and output padding.
    let (n, c, h, w) = (2, 4, 3, 4);
    let (group, mg, kh, kw) = (2, 3, 3, 2);
    let (sh, sw, dh, dw) = (2, 3, 1, 2);
    let (pt, pl, pb, pr) = (1i64, 0i64, 0i64, 2i64);
    let (oph, opw) = (1, 0);
    let cg = c / group;
    let m = mg * group;
    let oh = (sh * (h - 1) + oph + (kh - 1) * dh + 1) as i64 - pt - pb;
    let ow = (sw * (w - 1) + opw + (kw - 1) * dw + 1) as i64 - pl - pr;
    let (oh, ow) = (oh as usize, ow as usize);
    let xv = ints(n * c * h * w, 21);
    let wv = ints(c * mg * kh * kw, 22);
    let bv = ints(m, 23);
    // Scatter: each input element adds x · w into every output it reaches.
    let window = Window { k: [kh, kw], stride: [sh, sw], dil: [dh, dw], pad: [pt, pl] };
    let mut want = vec![0.0; n * m * oh * ow];
    for ni in 0..n {
        for mi in 0..m {
            for v in &mut want[(ni * m + mi) * oh * ow..(ni * m + mi + 1) * oh * ow] {
                *v = bv[mi];
            }
        }
        for ci in 0..c {
            for mo in 0..mg {
                let mi = ci / cg * mg + mo;
                window.each_tap([h, w], [oh, ow], |[iy, ix], [ky, kx], [oy, ox]| {
                    want[((ni * m + mi) * oh + oy) * ow + ox] +=
                        xv[((ni * c + ci) * h + iy) * w + ix] * wv[((ci * mg + mo) * kh + ky) * kw + kx];
                });
            }
        }
    }
    let o = op(
        OpKind::ConvTranspose,
        &[
            ("group", Attr::Int(group as i64)),
            ("strides", ints_attr(&[sh as i64, sw as i64])),
            ("dilations", ints_attr(&[dh as i64, dw as i64])),
            ("pads", ints_attr(&[pt, pl, pb, pr])),
            ("output_padding", ints_attr(&[oph as i64, opw as i64])),
        ],
    );
    let y = run1(
        &o,
        &[Some(&t(&[n, c, h, w], &xv)), Some(&t(&[c, mg, kh, kw], &wv)), Some(&t(&[m], &bv))],
        &[n, m, oh, ow],
    );
    assert_eq!(y, want);
}

// ---------------------------------------------------------------------------
// Pooling.
// ---------------------------------------------------------------------------

fn pool_op(kind: OpKind, k: &[i64], extra: &[(&str, Attr)]) -> Op {
    let mut a: Vec<(&str, Attr)> = vec![("kernel_shape", ints_attr(k))];
    a.extend(extra.iter().cloned());
    op(kind, &a)
}

#[test]
fn max_and_average_pool_2x2() {
    let x = iota(&[1, 1, 4, 4]);
    let s = ("strides", ints_attr(&[2, 2]));
    assert_eq!(
        run1(&pool_op(OpKind::MaxPool, &[2, 2], std::slice::from_ref(&s)), &[Some(&x)], &[1, 1, 2, 2]),
        vec![5., 7., 13., 15.]
    );
    assert_eq!(
        run1(&pool_op(OpKind::AveragePool, &[2, 2], &[s]), &[Some(&x)], &[1, 1, 2, 2]),
        vec![2.5, 4.5, 10.5, 12.5]
    );
}

#[test]
fn pool_ceil_mode() {
    let x = t(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let s2 = ("strides", ints_attr(&[2]));
    let ceil = ("ceil_mode", Attr::Int(1));
    let mp = |a: &[(&str, Attr)]| pool_op(OpKind::MaxPool, &[2], a);
    let ap = |a: &[(&str, Attr)]| pool_op(OpKind::AveragePool, &[2], a);
    assert_eq!(run1(&mp(std::slice::from_ref(&s2)), &[Some(&x)], &[1, 1, 2]), vec![2., 4.]);
    assert_eq!(run1(&mp(&[s2.clone(), ceil.clone()]), &[Some(&x)], &[1, 1, 3]), vec![2., 4., 5.]);
    assert_eq!(run1(&ap(&[s2.clone(), ceil.clone()]), &[Some(&x)], &[1, 1, 3]), vec![1.5, 3.5, 5.]);
    // A last window that would start in the end padding is dropped: length 4, pads
    // [0, 1], ceil gives 3 windows by the formula but the third starts at 4 = in + 0.
    let x4 = t(&[1, 1, 4], &[1., 2., 3., 4.]);
    let pads = ("pads", ints_attr(&[0, 1]));
    assert_eq!(run1(&mp(&[s2.clone(), ceil.clone(), pads]), &[Some(&x4)], &[1, 1, 2]), vec![2., 4.]);
    // Leading padding: windows start −1, 1, 3 (the last starts inside the input).
    let pads = ("pads", ints_attr(&[1, 0]));
    assert_eq!(run1(&mp(&[s2.clone(), ceil.clone(), pads]), &[Some(&x)], &[1, 1, 3]), vec![1., 3., 5.]);
}

#[test]
fn average_pool_count_include_pad() {
    let x = t(&[1, 1, 3, 3], &[1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let pads = ("pads", ints_attr(&[1, 1, 1, 1]));
    let inc = ("count_include_pad", Attr::Int(1));
    let y = run1(&pool_op(OpKind::AveragePool, &[3, 3], std::slice::from_ref(&pads)), &[Some(&x)], &[1, 1, 3, 3]);
    assert_close(&y, &[3., 3.5, 4., 4.5, 5., 5.5, 6., 6.5, 7.], 1e-15);
    let y = run1(&pool_op(OpKind::AveragePool, &[3, 3], &[pads, inc.clone()]), &[Some(&x)], &[1, 1, 3, 3]);
    assert_close(&y, &[12. / 9., 21. / 9., 16. / 9., 27. / 9., 5., 33. / 9., 24. / 9., 39. / 9., 28. / 9.], 1e-15);
    // 1-D, k 3, s 2, pads [1, 1], ceil: windows [−1..1], [1..3], [3..5].
    let x5 = t(&[1, 1, 5], &[1., 2., 3., 4., 5.]);
    let a = [("strides", ints_attr(&[2])), ("pads", ints_attr(&[1, 1])), ("ceil_mode", Attr::Int(1))];
    let y = run1(&pool_op(OpKind::AveragePool, &[3], &a), &[Some(&x5)], &[1, 1, 3]);
    assert_close(&y, &[1.5, 3., 4.5], 1e-15);
    let mut a2 = a.to_vec();
    a2.push(inc.clone());
    let y = run1(&pool_op(OpKind::AveragePool, &[3], &a2), &[Some(&x5)], &[1, 1, 3]);
    assert_close(&y, &[1., 3., 3.], 1e-15);
    // Ceil mode past the end padding: those taps count as padding with
    // count_include_pad (ONNX's test data), not without.
    let x6 = t(&[1, 1, 6], &[1., 2., 3., 4., 5., 6.]);
    let a = [("strides", ints_attr(&[2])), ("ceil_mode", Attr::Int(1))];
    let y = run1(&pool_op(OpKind::AveragePool, &[3], &a), &[Some(&x6)], &[1, 1, 3]);
    assert_close(&y, &[2., 4., 5.5], 1e-15);
    let mut a2 = a.to_vec();
    a2.push(inc);
    let y = run1(&pool_op(OpKind::AveragePool, &[3], &a2), &[Some(&x6)], &[1, 1, 3]);
    assert_close(&y, &[2., 4., 11. / 3.], 1e-15);
}

#[test]
fn pool_same_padding_and_dilations() {
    let x = t(&[1, 1, 4], &[1., 2., 3., 4.]);
    let ap = |s: &str| ("auto_pad", Attr::String(s.into()));
    assert_eq!(
        run1(&pool_op(OpKind::MaxPool, &[2], &[ap("SAME_UPPER")]), &[Some(&x)], &[1, 1, 4]),
        vec![2., 3., 4., 4.]
    );
    assert_eq!(
        run1(&pool_op(OpKind::AveragePool, &[2], &[ap("SAME_UPPER")]), &[Some(&x)], &[1, 1, 4]),
        vec![1.5, 2.5, 3.5, 4.]
    );
    assert_eq!(
        run1(&pool_op(OpKind::AveragePool, &[2], &[ap("SAME_LOWER")]), &[Some(&x)], &[1, 1, 4]),
        vec![1., 1.5, 2.5, 3.5]
    );
    let inc = ("count_include_pad", Attr::Int(1));
    assert_eq!(
        run1(&pool_op(OpKind::AveragePool, &[2], &[ap("SAME_LOWER"), inc]), &[Some(&x)], &[1, 1, 4]),
        vec![0.5, 1.5, 2.5, 3.5]
    );
    assert_eq!(run1(&pool_op(OpKind::MaxPool, &[2], &[ap("VALID")]), &[Some(&x)], &[1, 1, 3]), vec![2., 3., 4.]);
    let x = t(&[1, 1, 5], &[1., 5., 2., 4., 3.]);
    let dil = ("dilations", ints_attr(&[2]));
    assert_eq!(
        run1(&pool_op(OpKind::MaxPool, &[2], std::slice::from_ref(&dil)), &[Some(&x)], &[1, 1, 3]),
        vec![2., 5., 3.]
    );
    assert_eq!(run1(&pool_op(OpKind::AveragePool, &[2], &[dil]), &[Some(&x)], &[1, 1, 3]), vec![1.5, 4.5, 2.5]);
}

#[test]
fn max_pool_indices() {
    // Two images × two channels; maxima: 4 at (0,1), 8 at (1,0), 9 at (1,1), 3 at (0,0).
    #[rustfmt::skip]
    let x = t(&[2, 2, 2, 2], &[1., 4., 3., 2.,  5., 6., 8., 7.,  0., 1., 2., 9.,  3., -1., -2., 3.]);
    let o = pool_op(OpKind::MaxPool, &[2, 2], &[]);
    let outs = [(DType::F64, &[2, 2, 1, 1][..]), (DType::I64, &[2, 2, 1, 1][..])];
    let y = run(&o, &[Some(&x)], &outs);
    assert_eq!(y[0].to_f64_vec(), vec![4., 8., 9., 3.]);
    // Row-major within the plane plus (n·C + c)·4; ties go to the first.
    assert_eq!(y[1].to_i64_vec().unwrap(), vec![1, 6, 11, 12]);
    let o = pool_op(OpKind::MaxPool, &[2, 2], &[("storage_order", Attr::Int(1))]);
    let y = run(&o, &[Some(&x)], &outs);
    // Column-major within the plane: (h, w) → h + w·2.
    assert_eq!(y[1].to_i64_vec().unwrap(), vec![2, 5, 11, 12]);
    // Strided 1-D with padding: indices ignore the padding.
    let x = t(&[1, 1, 5], &[1., 5., 2., 4., 3.]);
    let o = pool_op(OpKind::MaxPool, &[2], &[("pads", ints_attr(&[1, 0])), ("strides", ints_attr(&[2]))]);
    let y = run(&o, &[Some(&x)], &[(DType::F64, &[1, 1, 3]), (DType::I64, &[1, 1, 3])]);
    assert_eq!(y[0].to_f64_vec(), vec![1., 5., 4.]);
    assert_eq!(y[1].to_i64_vec().unwrap(), vec![0, 1, 3]);
}

#[test]
fn max_pool_u8_and_3d() {
    let x = ti(DType::U8, &[1, 1, 4], &[3, 250, 7, 1]);
    let o = pool_op(OpKind::MaxPool, &[2], &[("strides", ints_attr(&[2]))]);
    let y = run(&o, &[Some(&x)], &[(DType::U8, &[1, 1, 2])]);
    assert_eq!(y[0].to_i64_vec().unwrap(), vec![250, 7]);
    let x = iota(&[1, 1, 3, 3, 3]);
    let y = run1(&pool_op(OpKind::MaxPool, &[2, 2, 2], &[]), &[Some(&x)], &[1, 1, 2, 2, 2]);
    assert_eq!(y, vec![13., 14., 16., 17., 22., 23., 25., 26.]);
    let y = run1(&pool_op(OpKind::AveragePool, &[3, 3, 3], &[]), &[Some(&x)], &[1, 1, 1, 1, 1]);
    assert_eq!(y, vec![13.]);
}

#[test]
fn lp_pool() {
    let x = t(&[1, 1, 2], &[3., -4.]);
    let lp = |p: i64| pool_op(OpKind::LpPool, &[2], &[("p", Attr::Int(p))]);
    assert_close(&run1(&lp(2), &[Some(&x)], &[1, 1, 1]), &[5.], 1e-15);
    assert_close(&run1(&lp(1), &[Some(&x)], &[1, 1, 1]), &[7.], 1e-15);
    assert_close(&run1(&lp(3), &[Some(&x)], &[1, 1, 1]), &[91f64.cbrt()], 1e-14);
    // Padding contributes zero.
    let o = pool_op(OpKind::LpPool, &[2], &[("pads", ints_attr(&[1, 1]))]);
    assert_close(&run1(&o, &[Some(&x)], &[1, 1, 3]), &[3., 5., 4.], 1e-15);
}

#[test]
fn global_pools() {
    let x = t(&[1, 2, 2, 2], &[1., 2., 3., 4., -1., -2., -3., -4.]);
    let g = |k: OpKind| run1(&op(k, &[]), &[Some(&x)], &[1, 2, 1, 1]);
    assert_eq!(g(OpKind::GlobalAveragePool), vec![2.5, -2.5]);
    assert_eq!(g(OpKind::GlobalMaxPool), vec![4., -1.]);
    assert_close(&g(OpKind::GlobalLpPool), &[30f64.sqrt(), 30f64.sqrt()], 1e-15);
    let o = op(OpKind::GlobalLpPool, &[("p", Attr::Int(1))]);
    assert_eq!(run1(&o, &[Some(&x)], &[1, 2, 1, 1]), vec![10., 10.]);
    let x1 = t(&[2, 1, 3], &[1., 2., 6., 0., 0., 3.]);
    assert_eq!(run1(&op(OpKind::GlobalAveragePool, &[]), &[Some(&x1)], &[2, 1, 1]), vec![3., 1.]);
}

#[test]
fn pool_errors() {
    let x = iota(&[1, 1, 2, 2]);
    let tys = [TensorType::new(DType::F64, shape(&[1, 1, 1, 1]))];
    assert!(eval_op(&op(OpKind::MaxPool, &[]), &[Some(&x)], &tys).is_err()); // no kernel_shape
    assert!(eval_op(&pool_op(OpKind::MaxPool, &[3, 3], &[]), &[Some(&x)], &tys).is_err());
    assert!(eval_op(&pool_op(OpKind::MaxPool, &[2], &[]), &[Some(&x)], &tys).is_err());
    let bad_ty = [TensorType::new(DType::F64, shape(&[1, 1, 2, 2]))];
    assert!(eval_op(&pool_op(OpKind::MaxPool, &[2, 2], &[]), &[Some(&x)], &bad_ty).is_err());
}

// ---------------------------------------------------------------------------
// Recurrent layers.
// ---------------------------------------------------------------------------

/// LSTM, one step, input 1, hidden 1, from the ONNX gate equations.
#[test]
fn lstm_single_step_by_hand() {
    let x = t(&[1, 1, 1], &[1.0]);
    // Gate order i, o, f, c.
    let w = t(&[1, 4, 1], &[0.1, 0.2, 0.3, 0.4]);
    let r = t(&[1, 4, 1], &[0.5, 0.6, 0.7, 0.8]);
    let b = t(&[1, 8], &[0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08]);
    let h0 = t(&[1, 1, 1], &[0.5]);
    let c0 = t(&[1, 1, 1], &[0.25]);
    let o = op(OpKind::LSTM, &[("hidden_size", Attr::Int(1))]);
    let outs = [(DType::F64, &[1, 1, 1, 1][..]), (DType::F64, &[1, 1, 1][..]), (DType::F64, &[1, 1, 1][..])];
    let ins = [Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0), Some(&c0)];
    let y = run(&o, &ins, &outs);
    let i = sigmoid(0.1 + 0.5 * 0.5 + 0.01 + 0.05);
    let f = sigmoid(0.3 + 0.7 * 0.5 + 0.03 + 0.07);
    let ct = (0.4f64 + 0.8 * 0.5 + 0.04 + 0.08).tanh();
    let c = f * 0.25 + i * ct;
    let og = sigmoid(0.2 + 0.6 * 0.5 + 0.02 + 0.06);
    let h = og * c.tanh();
    assert_close(&y[0].to_f64_vec(), &[h], 1e-14);
    assert_close(&y[1].to_f64_vec(), &[h], 1e-14);
    assert_close(&y[2].to_f64_vec(), &[c], 1e-14);
    // Peepholes P = [pi, po, pf]: i and f see C(t−1), o sees C(t).
    let p = t(&[1, 3], &[0.1, 0.2, 0.3]);
    let ins = [Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0), Some(&c0), Some(&p)];
    let y = run(&o, &ins, &outs);
    let i = sigmoid(0.1 + 0.5 * 0.5 + 0.01 + 0.05 + 0.1 * 0.25);
    let f = sigmoid(0.3 + 0.7 * 0.5 + 0.03 + 0.07 + 0.3 * 0.25);
    let c = f * 0.25 + i * ct;
    let og = sigmoid(0.2 + 0.6 * 0.5 + 0.02 + 0.06 + 0.2 * c);
    assert_close(&y[2].to_f64_vec(), &[c], 1e-14);
    assert_close(&y[1].to_f64_vec(), &[og * c.tanh()], 1e-14);
    // input_forget: f = 1 − i.
    let o2 = op(OpKind::LSTM, &[("input_forget", Attr::Int(1))]);
    let ins = [Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0), Some(&c0)];
    let y = run(&o2, &ins, &outs);
    let i = sigmoid(0.1 + 0.5 * 0.5 + 0.01 + 0.05);
    let c = (1.0 - i) * 0.25 + i * ct;
    assert_close(&y[2].to_f64_vec(), &[c], 1e-14);
}

/// Multi-step LSTM with two hidden units, checked against the equations written out.
#[test]
fn lstm_two_steps_two_units() {
    let (seq, hid, inp) = (2, 2, 3);
    let xv = ints(seq * inp, 31).iter().map(|v| v * 0.25).collect::<Vec<_>>();
    let wv = ints(4 * hid * inp, 32).iter().map(|v| v * 0.125).collect::<Vec<_>>();
    let rv = ints(4 * hid * hid, 33).iter().map(|v| v * 0.125).collect::<Vec<_>>();
    let bv = ints(8 * hid, 34).iter().map(|v| v * 0.0625).collect::<Vec<_>>();
    let (mut h, mut c) = (vec![0.0; hid], vec![0.0; hid]);
    let mut ys = Vec::new();
    for s in 0..seq {
        let xs = &xv[s * inp..(s + 1) * inp];
        let gate = |g: usize, j: usize, h: &[f64]| {
            let row = g * hid + j;
            (0..inp).map(|k| wv[row * inp + k] * xs[k]).sum::<f64>()
                + (0..hid).map(|k| rv[row * hid + k] * h[k]).sum::<f64>()
                + bv[row]
                + bv[4 * hid + row]
        };
        let (mut hn, mut cn) = (vec![0.0; hid], vec![0.0; hid]);
        for j in 0..hid {
            let i = sigmoid(gate(0, j, &h));
            let o = sigmoid(gate(1, j, &h));
            let f = sigmoid(gate(2, j, &h));
            let g = gate(3, j, &h).tanh();
            cn[j] = f * c[j] + i * g;
            hn[j] = o * cn[j].tanh();
        }
        h = hn;
        c = cn;
        ys.extend(&h);
    }
    let o = op(OpKind::LSTM, &[("hidden_size", Attr::Int(hid as i64))]);
    let ins = [
        Some(t(&[seq, 1, inp], &xv)),
        Some(t(&[1, 4 * hid, inp], &wv)),
        Some(t(&[1, 4 * hid, hid], &rv)),
        Some(t(&[1, 8 * hid], &bv)),
    ];
    let refs: Vec<Option<&Tensor>> = ins.iter().map(|x| x.as_ref()).collect();
    let y = run(&o, &refs, &[(DType::F64, &[seq, 1, 1, hid]), (DType::F64, &[1, 1, hid])]);
    assert_close(&y[0].to_f64_vec(), &ys, 1e-13);
    assert_close(&y[1].to_f64_vec(), &h, 1e-13);
}

/// Random-ish operands for a recurrent layer with `g` gates.
fn rnn_operands(g: usize, dirs: usize, seq: usize, batch: usize, inp: usize, hid: usize, seed: u64) -> [Tensor; 5] {
    let sc = |v: Vec<f64>, s: f64| v.into_iter().map(|x| x * s).collect::<Vec<_>>();
    [
        t(&[seq, batch, inp], &sc(ints(seq * batch * inp, seed), 0.25)),
        t(&[dirs, g * hid, inp], &sc(ints(dirs * g * hid * inp, seed + 1), 0.125)),
        t(&[dirs, g * hid, hid], &sc(ints(dirs * g * hid * hid, seed + 2), 0.125)),
        t(&[dirs, 2 * g * hid], &sc(ints(dirs * 2 * g * hid, seed + 3), 0.0625)),
        t(&[dirs, batch, hid], &sc(ints(dirs * batch * hid, seed + 4), 0.5)),
    ]
}

/// The reversed time axis of a `[seq, ...]` tensor.
fn reverse_time(x: &Tensor) -> Tensor {
    let d = x.shape().dims();
    let per: usize = d[1..].iter().product();
    let v = x.to_f64_vec();
    let mut out = Vec::with_capacity(v.len());
    for s in (0..d[0]).rev() {
        out.extend_from_slice(&v[s * per..(s + 1) * per]);
    }
    t(d, &out)
}

/// Slices direction `d` out of `[num_dir, ...]` weights.
fn dir(x: &Tensor, d: usize) -> Tensor {
    let dims = x.shape().dims();
    let per: usize = dims[1..].iter().product();
    let mut nd = dims.to_vec();
    nd[0] = 1;
    t(&nd, &x.to_f64_vec()[d * per..(d + 1) * per])
}

#[test]
fn recurrent_directions_are_consistent() {
    // Identities: reverse = forward on the reversed sequence (Y reversed back);
    // bidirectional = forward and reverse stacked.
    let (seq, batch, inp, hid) = (3, 2, 2, 3);
    for (kind, g, n_states) in [(OpKind::LSTM, 4, 3), (OpKind::GRU, 3, 2), (OpKind::RNN, 1, 2)] {
        let [x, w, r, b, h0] = rnn_operands(g, 2, seq, batch, inp, hid, 40);
        let ydims = [seq, 2, batch, hid];
        let hdims = [2, batch, hid];
        let bi = op(kind, &[("direction", Attr::String("bidirectional".into()))]);
        let mut outs = vec![(DType::F64, &ydims[..]), (DType::F64, &hdims[..])];
        if n_states == 3 {
            outs.push((DType::F64, &hdims[..]));
        }
        let ins = [Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)];
        let yb = run(&bi, &ins, &outs);
        let y1 = [seq, 1, batch, hid];
        let h1 = [1, batch, hid];
        let one = [(DType::F64, &y1[..]), (DType::F64, &h1[..])];
        let (w0, r0, b0, h00) = (dir(&w, 0), dir(&r, 0), dir(&b, 0), dir(&h0, 0));
        let fwd = run(&op(kind, &[]), &[Some(&x), Some(&w0), Some(&r0), Some(&b0), None, Some(&h00)], &one);
        let (w1, r1, b1, h01) = (dir(&w, 1), dir(&r, 1), dir(&b, 1), dir(&h0, 1));
        let rev_op = op(kind, &[("direction", Attr::String("reverse".into()))]);
        let rev = run(&rev_op, &[Some(&x), Some(&w1), Some(&r1), Some(&b1), None, Some(&h01)], &one);
        let xr = reverse_time(&x);
        let fwd_on_rev = run(&op(kind, &[]), &[Some(&xr), Some(&w1), Some(&r1), Some(&b1), None, Some(&h01)], &one);
        assert_close(&rev[0].to_f64_vec(), &reverse_time(&fwd_on_rev[0]).to_f64_vec(), 1e-14);
        assert_close(&rev[1].to_f64_vec(), &fwd_on_rev[1].to_f64_vec(), 1e-14);
        // Bidirectional Y: [seq, 2, batch, hid] interleaves the two directions per step.
        let (ybv, fv, rv) = (yb[0].to_f64_vec(), fwd[0].to_f64_vec(), rev[0].to_f64_vec());
        let per = batch * hid;
        for s in 0..seq {
            assert_close(&ybv[(2 * s) * per..(2 * s + 1) * per], &fv[s * per..(s + 1) * per], 1e-14);
            assert_close(&ybv[(2 * s + 1) * per..(2 * s + 2) * per], &rv[s * per..(s + 1) * per], 1e-14);
        }
        let mut hh = fwd[1].to_f64_vec();
        hh.extend(rev[1].to_f64_vec());
        assert_close(&yb[1].to_f64_vec(), &hh, 1e-14);
    }
}

#[test]
fn recurrent_layout_1_is_a_transpose() {
    let (seq, batch, inp, hid) = (3, 2, 2, 2);
    for (kind, g) in [(OpKind::LSTM, 4), (OpKind::GRU, 3), (OpKind::RNN, 1)] {
        let [x, w, r, b, h0] = rnn_operands(g, 1, seq, batch, inp, hid, 50);
        let y0 = run(
            &op(kind, &[]),
            &[Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)],
            &[(DType::F64, &[seq, 1, batch, hid]), (DType::F64, &[1, batch, hid])],
        );
        // X [seq, batch, inp] → [batch, seq, inp]; h0 [1, batch, hid] → [batch, 1, hid].
        let xv = x.to_f64_vec();
        let mut xt = vec![0.0; xv.len()];
        for s in 0..seq {
            for bb in 0..batch {
                for k in 0..inp {
                    xt[(bb * seq + s) * inp + k] = xv[(s * batch + bb) * inp + k];
                }
            }
        }
        let x1 = t(&[batch, seq, inp], &xt);
        let h01 = t(&[batch, 1, hid], &h0.to_f64_vec());
        let y1 = run(
            &op(kind, &[("layout", Attr::Int(1))]),
            &[Some(&x1), Some(&w), Some(&r), Some(&b), None, Some(&h01)],
            &[(DType::F64, &[batch, seq, 1, hid]), (DType::F64, &[batch, 1, hid])],
        );
        let (a, bv) = (y0[0].to_f64_vec(), y1[0].to_f64_vec());
        for s in 0..seq {
            for bb in 0..batch {
                for j in 0..hid {
                    assert_eq!(a[(s * batch + bb) * hid + j], bv[(bb * seq + s) * hid + j]);
                }
            }
        }
        assert_eq!(y0[1].to_f64_vec(), y1[1].to_f64_vec());
    }
}

#[test]
fn recurrent_sequence_lens() {
    // Batch row 1 stops after one step: its Y is zero at step 1 and Y_h is its
    // state after step 0, which equals a one-step run.
    let (seq, batch, inp, hid) = (2, 2, 2, 2);
    let [x, w, r, b, h0] = rnn_operands(3, 1, seq, batch, inp, hid, 60);
    let lens = ti(DType::I32, &[2], &[2, 1]);
    let o = op(OpKind::GRU, &[]);
    let y = run(
        &o,
        &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens), Some(&h0)],
        &[(DType::F64, &[seq, 1, batch, hid]), (DType::F64, &[1, batch, hid])],
    );
    let yv = y[0].to_f64_vec();
    assert_eq!(&yv[(batch + 1) * hid..(batch + 2) * hid], &[0.0, 0.0]);
    let x0 = t(&[1, batch, inp], &x.to_f64_vec()[..batch * inp]);
    let one = run(
        &o,
        &[Some(&x0), Some(&w), Some(&r), Some(&b), None, Some(&h0)],
        &[(DType::F64, &[1, 1, batch, hid]), (DType::F64, &[1, batch, hid])],
    );
    let hv = y[1].to_f64_vec();
    assert_eq!(&hv[hid..2 * hid], &one[1].to_f64_vec()[hid..2 * hid]);
    assert_eq!(&yv[hid..2 * hid], &one[0].to_f64_vec()[hid..2 * hid]);
    // Reverse with lengths: row 1 (length 1) only sees step 0.
    let rev = op(OpKind::GRU, &[("direction", Attr::String("reverse".into()))]);
    let y = run(
        &rev,
        &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens), Some(&h0)],
        &[(DType::F64, &[seq, 1, batch, hid]), (DType::F64, &[1, batch, hid])],
    );
    assert_eq!(&y[1].to_f64_vec()[hid..2 * hid], &one[1].to_f64_vec()[hid..2 * hid]);
}

#[test]
fn gru_single_step_by_hand() {
    // Input 1, hidden 1; gate order z, r, h.
    let x = t(&[1, 1, 1], &[1.0]);
    let w = t(&[1, 3, 1], &[0.1, 0.2, 0.3]);
    let r = t(&[1, 3, 1], &[0.4, 0.5, 0.6]);
    let b = t(&[1, 6], &[0.01, 0.02, 0.03, 0.04, 0.05, 0.06]);
    let h0 = t(&[1, 1, 1], &[0.5]);
    let ins = [Some(&x), Some(&w), Some(&r), Some(&b), None, Some(&h0)];
    let z = sigmoid(0.1 + 0.4 * 0.5 + 0.01 + 0.04);
    let rg = sigmoid(0.2 + 0.5 * 0.5 + 0.02 + 0.05);
    let outs = [(DType::F64, &[1, 1, 1, 1][..]), (DType::F64, &[1, 1, 1][..])];
    // linear_before_reset = 0: h~ = tanh(Wh·x + Rh·(r ⊙ H) + Rbh + Wbh).
    let ht = (0.3 + 0.6 * (rg * 0.5) + 0.06 + 0.03f64).tanh();
    let y = run(&op(OpKind::GRU, &[]), &ins, &outs);
    assert_close(&y[1].to_f64_vec(), &[(1.0 - z) * ht + z * 0.5], 1e-14);
    // linear_before_reset = 1: h~ = tanh(Wh·x + r ⊙ (Rh·H + Rbh) + Wbh).
    let ht = (0.3 + rg * (0.6 * 0.5 + 0.06) + 0.03f64).tanh();
    let y = run(&op(OpKind::GRU, &[("linear_before_reset", Attr::Int(1))]), &ins, &outs);
    assert_close(&y[1].to_f64_vec(), &[(1.0 - z) * ht + z * 0.5], 1e-14);
}

#[test]
fn rnn_by_hand_with_activations_and_clip() {
    let x = t(&[2, 1, 1], &[1.0, -2.0]);
    let w = t(&[1, 1, 1], &[0.5]);
    let r = t(&[1, 1, 1], &[0.25]);
    let b = t(&[1, 2], &[0.125, 0.125]);
    let ins = [Some(&x), Some(&w), Some(&r), Some(&b)];
    let outs = [(DType::F64, &[2, 1, 1, 1][..]), (DType::F64, &[1, 1, 1][..])];
    // Default Tanh.
    let h1 = (0.5f64 + 0.25).tanh();
    let h2 = (-1.0 + 0.25 * h1 + 0.25).tanh();
    let y = run(&op(OpKind::RNN, &[]), &ins, &outs);
    assert_close(&y[0].to_f64_vec(), &[h1, h2], 1e-14);
    // LeakyRelu with alpha 0.5.
    let o = op(
        OpKind::RNN,
        &[("activations", Attr::Strings(vec!["LeakyRelu".into()])), ("activation_alpha", Attr::Floats(vec![0.5]))],
    );
    let h1 = 0.75;
    let pre2 = -1.0 + 0.25 * h1 + 0.25;
    let y = run(&o, &ins, &outs);
    assert_close(&y[0].to_f64_vec(), &[h1, 0.5 * pre2], 1e-14);
    // Clip 0.5 bounds the pre-activations: tanh(0.5), then tanh(−0.5).
    let o = op(OpKind::RNN, &[("clip", Attr::Float(0.5))]);
    let y = run(&o, &ins, &outs);
    assert_close(&y[0].to_f64_vec(), &[0.5f64.tanh(), (-0.5f64).tanh()], 1e-14);
    // HardSigmoid (alpha, beta) and Affine take two parameters each, consumed in order.
    let o = op(
        OpKind::RNN,
        &[
            ("activations", Attr::Strings(vec!["Affine".into()])),
            ("activation_alpha", Attr::Floats(vec![2.0])),
            ("activation_beta", Attr::Floats(vec![1.0])),
        ],
    );
    let h1 = 2.0 * 0.75 + 1.0;
    let h2 = 2.0 * (-1.0 + 0.25 * h1 + 0.25) + 1.0;
    let y = run(&o, &ins, &outs);
    assert_close(&y[0].to_f64_vec(), &[h1, h2], 1e-14);
}

#[test]
fn recurrent_errors() {
    let [x, w, r, b, _] = rnn_operands(4, 1, 2, 1, 2, 2, 70);
    let tys = [TensorType::new(DType::F64, shape(&[2, 1, 1, 2]))];
    // W with the wrong gate count for GRU.
    assert!(eval_op(&op(OpKind::GRU, &[]), &[Some(&x), Some(&w), Some(&r), Some(&b)], &tys).is_err());
    // Unknown activation, bad direction, negative clip, bad hidden_size.
    let bad = [
        op(OpKind::LSTM, &[("activations", Attr::Strings(vec!["Nope".into(); 3]))]),
        op(OpKind::LSTM, &[("clip", Attr::Float(-1.0))]),
        op(OpKind::LSTM, &[("hidden_size", Attr::Int(3))]),
    ];
    for o in &bad {
        assert!(eval_op(o, &[Some(&x), Some(&w), Some(&r), Some(&b)], &tys).is_err(), "{o:?}");
    }
    // A bad direction is rejected when the op is built.
    assert!(checked_op(OpKind::LSTM, &[("direction", Attr::String("sideways".into()))]).is_none());
    assert!(eval_op(&op(OpKind::LSTM, &[]), &[Some(&x), Some(&w)], &tys).is_err());
}

// ---------------------------------------------------------------------------
// Odd inputs: errors or empty results, never panics.
// ---------------------------------------------------------------------------

/// Evaluates, returning whether it succeeded (a panic fails the test).
fn try_op(o: &Op, ins: &[Option<&Tensor>], outs: &[(DType, &[usize])]) -> bool {
    let tys: Vec<TensorType> = outs.iter().map(|(d, s)| TensorType::new(*d, shape(s))).collect();
    eval_op(o, ins, &tys).is_ok()
}

#[test]
fn odd_inputs_do_not_panic() {
    let f = DType::F64;
    let conv = op(OpKind::Conv, &[]);
    // Empty batch, empty channels, no output channels.
    assert!(try_op(&conv, &[Some(&iota(&[0, 1, 3, 3])), Some(&iota(&[1, 1, 2, 2]))], &[(f, &[0, 1, 2, 2])]));
    let y =
        run1(&conv, &[Some(&iota(&[1, 0, 3, 3])), Some(&iota(&[1, 0, 2, 2])), Some(&t(&[1], &[7.]))], &[1, 1, 2, 2]);
    assert_eq!(y, vec![7.; 4]);
    assert!(try_op(&conv, &[Some(&iota(&[1, 1, 3, 3])), Some(&iota(&[0, 1, 2, 2]))], &[(f, &[1, 0, 2, 2])]));
    // Absurd attributes.
    let x = iota(&[1, 1, 3, 3]);
    let w = iota(&[1, 1, 2, 2]);
    for a in [
        ("pads", ints_attr(&[1 << 40, 0, 0, 0])),
        ("dilations", ints_attr(&[1 << 30, 1])),
        ("strides", ints_attr(&[-1, 1])),
        ("group", Attr::Int(-2)),
        ("group", Attr::Int(i64::MAX)),
        ("auto_pad", Attr::String("SIDEWAYS".into())),
        ("pads", Attr::Float(1.0)),
    ] {
        // Each is rejected when the op is built, or else when it runs.
        if let Some(conv) = checked_op(OpKind::Conv, std::slice::from_ref(&a)) {
            assert!(!try_op(&conv, &[Some(&x), Some(&w)], &[(f, &[1, 1, 2, 2])]), "{a:?}");
        }
        if let Some(ct) = checked_op(OpKind::ConvTranspose, std::slice::from_ref(&a)) {
            assert!(!try_op(&ct, &[Some(&x), Some(&w)], &[(f, &[1, 1, 4, 4])]), "{a:?}");
        }
    }
    let ct = op(OpKind::ConvTranspose, &[("output_shape", ints_attr(&[-3, 4]))]);
    assert!(!try_op(&ct, &[Some(&x), Some(&w)], &[(f, &[1, 1, 4, 4])]));
    let _ = try_op(
        &op(OpKind::ConvTranspose, &[]),
        &[Some(&iota(&[1, 1, 0])), Some(&iota(&[1, 1, 2]))],
        &[(f, &[1, 1, 1])],
    );
    // Pools.
    let mp = pool_op(OpKind::MaxPool, &[1 << 30], &[]);
    assert!(!try_op(&mp, &[Some(&iota(&[1, 1, 3]))], &[(f, &[1, 1, 1])]));
    assert!(!try_op(&pool_op(OpKind::MaxPool, &[1], &[]), &[Some(&iota(&[1, 1, 0]))], &[(f, &[1, 1, 0])]));
    assert!(try_op(&pool_op(OpKind::AveragePool, &[2, 2], &[]), &[Some(&iota(&[0, 3, 4, 4]))], &[(f, &[0, 3, 3, 3])]));
    assert!(!try_op(&pool_op(OpKind::MaxPool, &[2], &[]), &[Some(&iota(&[4]))], &[(f, &[3])]));
    // Contractions with empty dims: a zero-length sum is 0.
    let mm = op(OpKind::MatMul, &[]);
    assert_eq!(run1(&mm, &[Some(&iota(&[2, 0])), Some(&iota(&[0, 3]))], &[2, 3]), vec![0.; 6]);
    assert!(try_op(&mm, &[Some(&iota(&[0, 3])), Some(&iota(&[3, 0]))], &[(f, &[0, 0])]));
    assert!(!try_op(&mm, &[Some(&iota(&[])), Some(&iota(&[3]))], &[(f, &[])]));
    let g = op(OpKind::Gemm, &[]);
    assert_eq!(run1(&g, &[Some(&iota(&[1, 0])), Some(&iota(&[0, 2]))], &[1, 2]), vec![0., 0.]);
    assert!(!try_op(&g, &[Some(&iota(&[2])), Some(&iota(&[2, 2]))], &[(f, &[1, 2])]));
    assert_eq!(run1(&op(OpKind::Det, &[]), &[Some(&iota(&[0, 0]))], &[]), vec![1.]);
    assert_eq!(einsum("->", &[&t(&[], &[3.])], &[]), vec![3.]);
    assert_eq!(einsum("ij->", &[&iota(&[0, 4])], &[]), vec![0.]);
    assert_eq!(einsum("i,i->i", &[&iota(&[0]), &iota(&[0])], &[0]), Vec::<f64>::new());
    let e = op(OpKind::Einsum, &[("equation", Attr::String("ij,jk->ik".into()))]);
    assert!(!try_op(&e, &[Some(&iota(&[2, 2]))], &[(f, &[2, 2])]));
    assert!(checked_op(OpKind::Einsum, &[]).is_none());
    // Recurrent: zero steps leave the initial state; bad lengths are errors.
    let [_, w, r, b, h0] = rnn_operands(1, 1, 1, 1, 2, 2, 80);
    let x0 = t(&[0, 1, 2], &[]);
    let y = run(
        &op(OpKind::RNN, &[]),
        &[Some(&x0), Some(&w), Some(&r), Some(&b), None, Some(&h0)],
        &[(f, &[0, 1, 1, 2]), (f, &[1, 1, 2])],
    );
    assert_eq!(y[1].to_f64_vec(), h0.to_f64_vec());
    let x = t(&[1, 1, 2], &[1., 2.]);
    let lens = ti(DType::I32, &[1], &[-1]);
    assert!(!try_op(
        &op(OpKind::RNN, &[]),
        &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens)],
        &[(f, &[1, 1, 1, 2])]
    ));
    let lens = ti(DType::I32, &[1], &[0]);
    assert!(try_op(
        &op(OpKind::RNN, &[]),
        &[Some(&x), Some(&w), Some(&r), Some(&b), Some(&lens)],
        &[(f, &[1, 1, 1, 2])]
    ));
    assert!(checked_op(OpKind::RNN, &[("layout", Attr::Int(2))]).is_none());
    assert!(!try_op(
        &op(OpKind::RNN, &[]),
        &[Some(&x), Some(&w), Some(&r)],
        &[(f, &[1, 1, 1, 2]), (f, &[1, 1, 2]), (f, &[1, 1, 2])]
    ));
}
