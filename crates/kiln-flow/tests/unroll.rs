//! Short sums written out (`kiln_flow::fuse::unroll_short_sums`) and quotients of sums
//! with multiples of the divisor taken apart (the kernel builder): the rewritten kernels,
//! run by the interpreter, against plain formulas in the test.

use kiln_flow::fuse::unroll_short_sums;
use kiln_flow::interp::run;
use kiln_flow::kernel::{BinaryOp, Expr, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::DType;

mod common;
use common::{f32s, ty};

/// `√(Σ_{p<2} part_p²)` where part 0 is `re` and part 1 `im`, chosen by comparing the
/// reduction variable (a Concat of the two parts fused into the sum).
#[test]
fn a_magnitude_over_two_parts_is_written_out() {
    let (r, c) = (3, 5);
    let mut b =
        KernelBuilder::new("mag", vec![ty(DType::F32, &[r, c]), ty(DType::F32, &[r, c])], ty(DType::F32, &[r, c]));
    let o = b.out_index();
    let p = b.new_var(2);
    let pv = b.var(p);
    let one = b.index(1);
    let first = b.binary(BinaryOp::Lt, pv, one);
    let re = b.load(0, o.clone());
    let im = b.load(1, o.clone());
    let part = b.select(first, re, im);
    let sq = b.mul(part, part);
    let s = b.reduce(ReduceOp::Sum, vec![p], sq);
    let m = b.unary(UnaryOp::Sqrt, s);
    let k = b.finish(m).unwrap();
    let u = unroll_short_sums(&k).expect("a sum over two positions");
    assert!(u.nodes.iter().all(|n| !matches!(n.expr, Expr::Reduce { .. } | Expr::Select(..))), "{u:?}");
    assert_eq!(u.vars.len(), 2);
    let re: Vec<f64> = (0..r * c).map(|i| i as f64 * 0.75 - 4.0).collect();
    let im: Vec<f64> = (0..r * c).map(|i| 3.0 - i as f64 * 0.5).collect();
    let (x, y) = (f32s(&[r, c], &re), f32s(&[r, c], &im));
    let got = run(&u, &[&x, &y]).unwrap().to_f64_vec();
    let was = run(&k, &[&x, &y]).unwrap().to_f64_vec();
    for i in 0..r * c {
        let want = ((re[i] as f32).powi(2) as f64 + (im[i] as f32).powi(2) as f64).sqrt();
        assert!((got[i] - want).abs() <= 1e-5 * want.max(1.0), "{i}: {} vs {want}", got[i]);
        assert_eq!(got[i], was[i], "{i}");
    }
}

/// A sum over more positions than it writes out, and a max, stay reductions.
#[test]
fn long_sums_and_other_reductions_stay() {
    for (op, n) in [(ReduceOp::Sum, 5), (ReduceOp::Max, 2)] {
        let mut b = KernelBuilder::new("r", vec![ty(DType::F32, &[2, n])], ty(DType::F32, &[2]));
        let o = b.out_index();
        let j = b.new_var(n as u64);
        let jv = b.var(j);
        let x = b.load(0, vec![o[0], jv]);
        let s = b.reduce(op, vec![j], x);
        let k = b.finish(s).unwrap();
        assert!(unroll_short_sums(&k).is_none(), "{op:?} over {n}");
    }
}

/// `(4·i + j) div 4` and `rem 4` over `i < 3`, `j < 4` (a flat index taken apart again):
/// `i` and `j`, so the copy reads its input at `[i, j]` with no division left; a builder
/// not asked to keeps the division.
#[test]
fn quotients_of_multiples_are_taken_apart() {
    let mut b = KernelBuilder::new("copy", vec![ty(DType::F32, &[3, 4])], ty(DType::F32, &[3, 4]));
    b.take_apart_multiples();
    let o = b.out_index();
    let four = b.index(4);
    let m = b.binary(BinaryOp::Mul, four, o[0]);
    let flat = b.add(m, o[1]);
    let q = b.binary(BinaryOp::Div, flat, four);
    let r = b.binary(BinaryOp::Rem, flat, four);
    assert_eq!((q, r), (o[0], o[1]));
    let x = b.load(0, vec![q, r]);
    let k = b.finish(x).unwrap();
    let v: Vec<f64> = (0..12).map(|i| i as f64 - 5.5).collect();
    assert_eq!(run(&k, &[&f32s(&[3, 4], &v)]).unwrap().to_f64_vec(), v);
    let mut b = KernelBuilder::new("copy", vec![ty(DType::F32, &[3, 4])], ty(DType::F32, &[3, 4]));
    let o = b.out_index();
    let four = b.index(4);
    let m = b.binary(BinaryOp::Mul, four, o[0]);
    let flat = b.add(m, o[1]);
    let q = b.binary(BinaryOp::Div, flat, four);
    assert_ne!(q, o[0]);
}

/// A term that may be negative keeps the division (truncating, as the kernel defines
/// it): `(4·i + j − 2) div 4` and `rem 4`, checked against i64 arithmetic.
#[test]
fn a_possibly_negative_sum_keeps_its_division() {
    let mut b = KernelBuilder::new("q", vec![], ty(DType::I64, &[3, 4, 2]));
    b.take_apart_multiples();
    let o = b.out_index();
    let four = b.index(4);
    let two = b.index(2);
    let m = b.binary(BinaryOp::Mul, o[0], four);
    let j = b.sub(o[1], two);
    let flat = b.add(m, j);
    let q = b.binary(BinaryOp::Div, flat, four);
    let r = b.binary(BinaryOp::Rem, flat, four);
    let zero = b.index(0);
    let pick = b.binary(BinaryOp::Eq, o[2], zero);
    let y = b.select(pick, q, r);
    let k = b.finish(y).unwrap();
    assert!(k.nodes.iter().any(|n| matches!(n.expr, Expr::Binary(BinaryOp::Div, ..))));
    let got = run(&k, &[]).unwrap().to_i64_vec().unwrap();
    for i in 0..3i64 {
        for jj in 0..4i64 {
            let f = 4 * i + jj - 2;
            let at = ((i * 4 + jj) * 2) as usize;
            assert_eq!((got[at], got[at + 1]), (f / 4, f % 4), "i {i} j {jj}");
        }
    }
    assert_eq!(k.nodes[k.root.index()].ty, ScalarType::I64);
}
