//! The inline f32 `exp`, `erf`, `tanh` and `log` (`cpu::math`) against f64 references, over sweeps
//! of f32 inputs, in scalar and vectorised code (which must agree bit for bit), with
//! the special values (NaN, ±inf, ±0, the overflow and underflow edges).
//!
//! Errors are in units of the last place of the correctly rounded f32 result (for a
//! subnormal result, the subnormal spacing). Bounds asserted: exp ≤ 2 ulp, erf ≤ 4 ulp,
//! tanh ≤ 3 ulp, log ≤ 2 ulp
//! (`--nocapture` prints the measured worst case; docs/pipeline.md quotes it).

mod common;

use common::*;
use kiln_codegen::cpu::{CpuTarget, Options};
use kiln_flow::{Kernel, KernelBuilder, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn kernel(op: UnaryOp, n: usize) -> Kernel {
    let t = TensorType::new(DType::F32, Shape::new(vec![n]).unwrap());
    let mut b = KernelBuilder::new(format!("k_{}", op.name()), vec![t.clone()], t);
    let i = b.out_index();
    let l = b.load(0, i);
    let r = b.unary(op, l);
    b.finish(r).unwrap()
}

/// Every `step`-th f32 bit pattern with a value in `lo..=hi`, plus the specials.
fn inputs(lo: f32, hi: f32, step: u32) -> Vec<f32> {
    let mut v: Vec<f32> =
        (0..=u32::MAX / step).map(|i| f32::from_bits(i * step)).filter(|x| (lo..=hi).contains(x)).collect();
    v.extend([0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, lo, hi, 1e-30, -1e-30, 0.5, -0.5, 0.4999999]);
    v
}

/// Runs `op` over `xs` scalar and vectorised on each target form: x86-64-v2 (the
/// polynomials as multiply then add) and this host (fused multiply-adds where it has
/// FMA); asserts that scalar and vector code of one target agree bit for bit, and
/// returns each target's results.
fn run(op: UnaryOp, xs: &[f32]) -> Vec<(&'static str, Vec<f32>)> {
    let k = kernel(op, xs.len());
    let x = Tensor::from_vec(Shape::new(vec![xs.len()]).unwrap(), xs.to_vec()).unwrap();
    let mut out = Vec::new();
    for (name, target) in [("x86-64-v2", CpuTarget::X86_64V2), ("host", CpuTarget::Host)] {
        let scalar = Config { target, options: in_order(false, false) };
        let vector = Config { target, options: Options::default() };
        let a = run_compiled(&k, &[&x], &scalar, 1).to_vec::<f32>().unwrap();
        let b = run_compiled(&k, &[&x], &vector, 2).to_vec::<f32>().unwrap();
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert!(
                p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()),
                "{name} {}({}): scalar {p}, vector {q}",
                op.name(),
                xs[i]
            );
        }
        out.push((name, a));
    }
    out
}

/// Distance in units of the last place of the f32 nearest to `want`.
fn ulps(got: f32, want: f64) -> f64 {
    let w = want as f32;
    let ulp = if w.is_finite() && w != 0.0 {
        (f32::from_bits(w.abs().to_bits() + 1) - w.abs()) as f64
    } else {
        f32::from_bits(1) as f64
    };
    (got as f64 - want).abs() / ulp
}

/// The largest error in ulps of `got` against `want(x)` over the finite `xs`, with the
/// `x` it is at; NaN inputs must give NaN, infinite ones `at_inf(x)` exactly.
fn worst_ulps(xs: &[f32], got: &[f32], want: impl Fn(f32) -> f64, at_inf: impl Fn(f32) -> f32) -> (f64, f32) {
    let mut worst = (0.0f64, 0.0f32);
    for (&x, &g) in xs.iter().zip(got) {
        if x.is_nan() {
            assert!(g.is_nan());
            continue;
        }
        if x.is_infinite() {
            assert_eq!(g, at_inf(x));
            continue;
        }
        let u = ulps(g, want(x));
        if u > worst.0 {
            worst = (u, x);
        }
    }
    worst
}

#[test]
fn exp_error() {
    let xs = inputs(-103.0, 88.72, 1021);
    for (target, got) in run(UnaryOp::Exp, &xs) {
        let worst = worst_ulps(&xs, &got, |x| (x as f64).exp(), |x| if x > 0.0 { f32::INFINITY } else { 0.0 });
        println!("exp ({target}): worst {:.3} ulp at {}", worst.0, worst.1);
        assert!(worst.0 <= 2.0, "exp ({target}): {:.3} ulp at {}", worst.0, worst.1);
    }
    // Overflow and underflow edges.
    for (target, edge) in run(UnaryOp::Exp, &[88.8, 100.0, -104.0, -200.0, 88.72283]) {
        assert_eq!(&edge[..4], &[f32::INFINITY, f32::INFINITY, 0.0, 0.0], "{target}");
        assert!(edge[4].is_finite() && edge[4] > 3.4e38, "{target}");
    }
}

#[test]
fn erf_error() {
    let xs = inputs(-6.0, 6.0, 1021);
    for (target, got) in run(UnaryOp::Erf, &xs) {
        let worst = worst_ulps(&xs, &got, |x| libm::erf(x as f64), f32::signum);
        println!("erf ({target}): worst {:.3} ulp at {}", worst.0, worst.1);
        assert!(worst.0 <= 4.0, "erf ({target}): {:.3} ulp at {}", worst.0, worst.1);
    }
}

#[test]
fn tanh_error() {
    let xs = inputs(-10.0, 10.0, 1021);
    for (target, got) in run(UnaryOp::Tanh, &xs) {
        let worst = worst_ulps(&xs, &got, |x| (x as f64).tanh(), f32::signum);
        println!("tanh ({target}): worst {:.3} ulp at {}", worst.0, worst.1);
        assert!(worst.0 <= 3.0, "tanh ({target}): {:.3} ulp at {}", worst.0, worst.1);
    }
    // Signed zeros, the switch between the two forms, saturation (e^{2|x|} overflows
    // to +inf beyond 44.5), and tiny values (x itself).
    let edges = [0.0, -0.0, 0.625, -0.625, 0.62499994, 44.0, -45.0, 1e30, -1e30, 1e-20, -1e-20];
    for (target, got) in run(UnaryOp::Tanh, &edges) {
        assert_eq!(got[0].to_bits(), 0.0f32.to_bits(), "{target}");
        assert_eq!(got[1].to_bits(), (-0.0f32).to_bits(), "{target}");
        for (i, &x) in edges.iter().enumerate().skip(2) {
            assert!(ulps(got[i], (x as f64).tanh()) <= 3.0, "{target}: tanh({x}) = {}", got[i]);
        }
        assert_eq!(&got[6..9], &[-1.0, 1.0, -1.0], "{target}");
    }
}

#[test]
fn log_error() {
    // Every positive f32 from the smallest subnormal to the largest finite.
    let mut xs = inputs(f32::from_bits(1), f32::MAX, 1021);
    xs.retain(|&x| x.is_nan() || x > 0.0);
    for (target, got) in run(UnaryOp::Log, &xs) {
        let worst = worst_ulps(&xs, &got, |x| (x as f64).ln(), |_| f32::INFINITY);
        println!("log ({target}): worst {:.3} ulp at {}", worst.0, worst.1);
        assert!(worst.0 <= 2.0, "log ({target}): {:.3} ulp at {}", worst.0, worst.1);
    }
    // Around 1 (where log is near 0 and the relative error counts), zeros, negatives.
    let near_one: Vec<f32> = (-2000..2000).map(|i| f32::from_bits((1.0f32.to_bits() as i32 + i) as u32)).collect();
    for (target, got) in run(UnaryOp::Log, &near_one) {
        let worst = worst_ulps(&near_one, &got, |x| (x as f64).ln(), |_| f32::INFINITY);
        assert!(worst.0 <= 2.0, "log near 1 ({target}): {:.3} ulp at {}", worst.0, worst.1);
    }
    for (target, got) in run(UnaryOp::Log, &[0.0, -0.0, -1.0, -f32::MIN_POSITIVE, f32::NEG_INFINITY, 1.0]) {
        assert_eq!(&got[..2], &[f32::NEG_INFINITY, f32::NEG_INFINITY], "{target}");
        assert!(got[2..5].iter().all(|v| v.is_nan()), "{target}: {got:?}");
        assert_eq!(got[5].to_bits(), 0.0f32.to_bits(), "{target}");
    }
}
