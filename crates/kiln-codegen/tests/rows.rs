//! Row kernels (`cpu::rows`, AVX2) against the kernel interpreter: Softmax and
//! LayerNorm as the lowering writes them, over row lengths from 8 to 130 (full vectors
//! and masked tails) and several rows, split across workgroups; a row maximum broadcast
//! along the row; NaN through the maximum; writes outside the output (`run_compiled`).
//!
//! Bounds: Softmax within `(L + 8)·2⁻²⁴` relative (exp is within 1 ulp, the sum is
//! reassociated over `L` terms); LayerNorm within `10⁻⁵·(1 + |want|)` (inputs in
//! [−1, 1], the variance a sum of `L` squares).

mod common;

use common::*;
use kiln_codegen::cpu::{compile_with, CpuTarget, Options};
use kiln_flow::{interp, BinaryOp, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

fn tt(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

fn cfg() -> Config {
    Config { target: CpuTarget::X86_64V3, options: Options::default() }
}

/// `softmax(x)` over the last axis of `[rows, len]`.
fn softmax(rows: usize, len: usize) -> Kernel {
    let mut b = KernelBuilder::new("softmax", vec![tt(&[rows, len])], tt(&[rows, len]));
    let o = b.out_index();
    let m = b.new_var(len as u64);
    let mv = b.var(m);
    let xm = b.load(0, vec![o[0], mv]);
    let mx = b.reduce(ReduceOp::Max, vec![m], xm);
    let s = b.new_var(len as u64);
    let sv = b.var(s);
    let xs = b.load(0, vec![o[0], sv]);
    let d = b.sub(xs, mx);
    let e = b.unary(UnaryOp::Exp, d);
    let sum = b.reduce(ReduceOp::Sum, vec![s], e);
    let x = b.load(0, vec![o[0], o[1]]);
    let d = b.sub(x, mx);
    let e = b.unary(UnaryOp::Exp, d);
    let y = b.div(e, sum);
    b.finish(y).unwrap()
}

/// LayerNorm over the last axis of `[rows, len]` with per-column scale and shift.
fn layernorm(rows: usize, len: usize) -> Kernel {
    let f = ScalarType::F32;
    let mut b = KernelBuilder::new("layernorm", vec![tt(&[rows, len]), tt(&[len]), tt(&[len])], tt(&[rows, len]));
    let o = b.out_index();
    let n = b.float(f, len as f64);
    let a = b.new_var(len as u64);
    let av = b.var(a);
    let xa = b.load(0, vec![o[0], av]);
    let sum = b.reduce(ReduceOp::Sum, vec![a], xa);
    let mean = b.div(sum, n);
    let q = b.new_var(len as u64);
    let qv = b.var(q);
    let xq = b.load(0, vec![o[0], qv]);
    let dq = b.sub(xq, mean);
    let sq = b.mul(dq, dq);
    let ss = b.reduce(ReduceOp::Sum, vec![q], sq);
    let var = b.div(ss, n);
    let eps = b.float(f, 1e-5);
    let ve = b.add(var, eps);
    let sd = b.unary(UnaryOp::Sqrt, ve);
    let x = b.load(0, vec![o[0], o[1]]);
    let d = b.sub(x, mean);
    let nrm = b.div(d, sd);
    let g = b.load(1, vec![o[1]]);
    let bt = b.load(2, vec![o[1]]);
    let y = b.mul(nrm, g);
    let y = b.add(y, bt);
    b.finish(y).unwrap()
}

/// `max(x[i, ..]) − x[i, j]`, clamped below at 0 with a `max` (a row value broadcast
/// and a binary max).
fn row_max_gap(rows: usize, len: usize) -> Kernel {
    let mut b = KernelBuilder::new("gap", vec![tt(&[rows, len])], tt(&[rows, len]));
    let o = b.out_index();
    let m = b.new_var(len as u64);
    let mv = b.var(m);
    let xm = b.load(0, vec![o[0], mv]);
    let mx = b.reduce(ReduceOp::Max, vec![m], xm);
    let x = b.load(0, vec![o[0], o[1]]);
    let d = b.sub(mx, x);
    let zero = b.float(ScalarType::F32, 0.0);
    let y = b.binary(BinaryOp::Max, d, zero);
    b.finish(y).unwrap()
}

fn run_all(k: &Kernel, ins: &[Tensor]) -> (Vec<f32>, Vec<Vec<f32>>) {
    let m = compile_with(&[k], &CpuTarget::X86_64V3, &Options::default()).unwrap();
    assert_eq!(m.notes[0], "row kernel (avx2)", "{}", k.name);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(k, &refs).unwrap().to_vec::<f32>().unwrap();
    let got = [1, 3].iter().map(|&s| run_compiled(k, &refs, &cfg(), s).to_vec::<f32>().unwrap()).collect();
    (want, got)
}

#[test]
fn softmax_rows() {
    if !avx2_fma() {
        eprintln!("skipped: this CPU lacks AVX2+FMA");
        return;
    }
    for (rows, len) in [(1, 8), (3, 9), (5, 13), (4, 64), (7, 100), (2, 128), (3, 130)] {
        let k = softmax(rows, len);
        let (want, got) = run_all(&k, &[random_f32(&[rows, len], 8.0, 11)]);
        let tol = (len as f32 + 8.0) * f32::EPSILON / 2.0;
        for g in got {
            for (i, (a, w)) in g.iter().zip(&want).enumerate() {
                assert!((a - w).abs() <= tol * w.abs(), "{rows}x{len}: [{i}] got {a}, want {w}");
            }
        }
    }
}

#[test]
fn layernorm_rows() {
    if !avx2_fma() {
        eprintln!("skipped: this CPU lacks AVX2+FMA");
        return;
    }
    for (rows, len) in [(1, 8), (3, 11), (6, 64), (5, 129), (2, 256)] {
        let k = layernorm(rows, len);
        let ins = [random_f32(&[rows, len], 1.0, 3), random_f32(&[len], 1.0, 4), random_f32(&[len], 1.0, 5)];
        let (want, got) = run_all(&k, &ins);
        for g in got {
            for (i, (a, w)) in g.iter().zip(&want).enumerate() {
                assert!((a - w).abs() <= 1e-5 * (1.0 + w.abs()), "{rows}x{len}: [{i}] got {a}, want {w}");
            }
        }
    }
}

#[test]
fn row_values_and_nan() {
    if !avx2_fma() {
        eprintln!("skipped: this CPU lacks AVX2+FMA");
        return;
    }
    let (rows, len) = (3, 21);
    let mut x = random_f32(&[rows, len], 1.0, 7).to_vec::<f32>().unwrap();
    x[len + 20] = f32::NAN; // row 1, in the masked tail
    let x = Tensor::from_vec(Shape::new(vec![rows, len]).unwrap(), x).unwrap();
    let k = row_max_gap(rows, len);
    let (want, got) = run_all(&k, &[x]);
    for g in got {
        for (i, (a, w)) in g.iter().zip(&want).enumerate() {
            // Row 1's maximum is NaN, so its whole row is.
            assert_eq!(a.is_nan(), i / len == 1, "[{i}] got {a}");
            assert!(a.is_nan() && w.is_nan() || a == w, "[{i}] got {a}, want {w}");
        }
    }
}
