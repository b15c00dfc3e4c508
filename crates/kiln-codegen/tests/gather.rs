//! Table gathers (`cpu::gather`): copies whose load offset is one term per output
//! dimension but not affine — sub-pixel interleaves (`(o + s') div s`, `(o + s') mod s`)
//! of strides 1 to 3 along one or two axes, a depth-to-space, a transpose with a
//! non-unit innermost step, selects on an index — at ranks 1 to 5 and row widths 1 to
//! 70 (every tail length; stride-2 rows of 16 and more take the two-run unpack path,
//! the rest the gather), against the interpreter bit for bit, with workgroup ranges
//! run in order and last first and nothing written outside the output. Kernels the
//! gather must not take (an index reading two variables) fall to the general path and
//! say why.

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
use kiln_flow::{BinaryOp, ExprId, Kernel, KernelBuilder};
use kiln_ir::{DType, Shape, TensorType};

fn tt(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

/// `y[n, m, o…] = P[n, ρ(o), m, (o + shift) div s…]` with `ρ(o)` the flat phase of the
/// digits `(o + shift) mod s` (ConvTranspose's interleave), for spatial extents `out`.
fn interleave(n: usize, m: usize, out: &[usize], strides: &[i64], shifts: &[i64]) -> Kernel {
    let phases: usize = strides.iter().map(|&s| s as usize).product();
    let ext: Vec<usize> = out
        .iter()
        .zip(strides.iter().zip(shifts))
        .map(|(&o, (&s, &sh))| (o + sh as usize).div_ceil(s as usize))
        .collect();
    let mut pd = vec![n, phases, m];
    pd.extend(&ext);
    let mut od = vec![n, m];
    od.extend(out);
    let mut b = KernelBuilder::new("interleave", vec![tt(&pd)], tt(&od));
    let v = interleave_load(&mut b, strides, shifts);
    b.finish(v).unwrap()
}

/// The load of [`interleave`]'s `P[n, ρ(o), m, (o + shift) div s…]` in `b`.
fn interleave_load(b: &mut KernelBuilder, strides: &[i64], shifts: &[i64]) -> ExprId {
    let o = b.out_index();
    let mut flat = b.index(0);
    let mut inner = Vec::new();
    for (d, (&s, &sh)) in strides.iter().zip(shifts).enumerate() {
        let c = b.index(sh);
        let q = b.add(o[2 + d], c);
        let sv = b.index(s);
        let r = b.binary(BinaryOp::Rem, q, sv);
        let f = b.mul(flat, sv);
        flat = b.add(f, r);
        inner.push(b.div(q, sv));
    }
    let mut idx = vec![o[0], flat, o[1]];
    idx.extend(inner);
    b.load(0, idx)
}

/// Compiles `k`, checks it took a table-driven vector copy (the table gather, or the
/// resampling's table copy, which recognises a separable copy whose every axis is a
/// table lookup before the gather is tried), and compares it with the interpreter over
/// several workgroup splits, in order and reversed.
fn check_gather(k: &Kernel, what: &str) {
    let cfg = Config { target: CpuTarget::X86_64V3, options: Options::default() };
    let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
    assert!(["table gather (avx2)", "table copy (avx2)"].contains(&m.notes[0].as_str()), "{what}: {}", m.notes[0]);
    let x = random_f32(k.inputs[0].shape.dims(), 2.0, k.inputs[0].shape.numel() as u64);
    let want = kiln_flow::interp::run(k, &[&x]).unwrap();
    for splits in [1, 3, 7] {
        for reversed in [false, true] {
            let got = run_compiled_in(k, &[&x], &cfg, splits, reversed);
            assert_eq!(got.bytes(), want.bytes(), "{what}: splits {splits} reversed {reversed}");
        }
    }
}

#[test]
fn interleaves_match_the_interpreter() {
    require_avx2_fma!(", so the gather kernel is not used");
    // deepfilternet3's decoder: stride (1, 2), 64 channels, widths 16 and 32.
    check_gather(&interleave(1, 64, &[5, 16], &[1, 2], &[0, 0]), "erb (1, 2)");
    check_gather(&interleave(1, 3, &[7, 32], &[1, 2], &[0, 1]), "erb (1, 2) shifted");
    for w in [1usize, 2, 5, 7, 8, 9, 15, 16, 17, 33, 70] {
        for (s, sh) in [(2i64, 0i64), (2, 1), (3, 2)] {
            check_gather(&interleave(2, 3, &[3, w], &[s, s], &[sh, 0]), &format!("2-D w {w} s {s} shift {sh}"));
            check_gather(&interleave(1, 2, &[w], &[s], &[sh]), &format!("1-D w {w} s {s} shift {sh}"));
        }
    }
    // Rank 5 (three spatial axes, the most outer coordinates the odometer holds).
    check_gather(&interleave(2, 2, &[3, 4, 9], &[2, 1, 3], &[1, 0, 2]), "3-D");
}

/// Depth-to-space (`y[n, c, h·b + i, w·b + j] = x[n, (i·b + j)·C + c, h, w]`) and a
/// transpose whose innermost output step is the input's row length, plus a select on
/// an index (each row's two ends folded together): separable, not affine or not step-1.
#[test]
fn other_separable_copies_match_the_interpreter() {
    require_avx2_fma!(", so the gather kernel is not used");
    let (n, c, h, w, bs) = (2usize, 3usize, 4usize, 5usize, 2i64);
    let mut b = KernelBuilder::new("d2s", vec![tt(&[n, c * 4, h, w])], tt(&[n, c, h * 2, w * 2]));
    let o = b.out_index();
    let bv = b.index(bs);
    let (hi, i) = (b.div(o[2], bv), b.binary(BinaryOp::Rem, o[2], bv));
    let (wi, j) = (b.div(o[3], bv), b.binary(BinaryOp::Rem, o[3], bv));
    let cc = b.index(c as i64);
    let ib = b.mul(i, bv);
    let ij = b.add(ib, j);
    let base = b.mul(ij, cc);
    let ch = b.add(base, o[1]);
    let v = b.load(0, vec![o[0], ch, hi, wi]);
    check_gather(&b.finish(v).unwrap(), "depth-to-space");
    // (Of fewer than 8 rows: `cpu::transpose` takes 8 and more.)
    let mut b = KernelBuilder::new("tr", vec![tt(&[13, 5])], tt(&[5, 13]));
    let o = b.out_index();
    let v = b.load(0, vec![o[1], o[0]]);
    check_gather(&b.finish(v).unwrap(), "transpose");
    // Each row's ends folded together: `x[r, select(c even, c div 2, 9 − c div 2)]`.
    let mut b = KernelBuilder::new("fold", vec![tt(&[6, 10])], tt(&[6, 10]));
    let o = b.out_index();
    let two = b.index(2);
    let zero = b.index(0);
    let r = b.binary(BinaryOp::Rem, o[1], two);
    let even = b.binary(BinaryOp::Eq, r, zero);
    let half = b.div(o[1], two);
    let nine = b.index(9);
    let back = b.sub(nine, half);
    let col = b.select(even, half, back);
    let v = b.load(0, vec![o[0], col]);
    check_gather(&b.finish(v).unwrap(), "folded rows");
}

/// A transpose whose output ends in axes of extent 1 (an `[N, L, C, 1]` image copied
/// to `[C, N, L, 1]` with its axes in a convolution's order, `kiln_flow::layout`): a
/// row is the innermost axis longer than one, so a workgroup gathers a whole row of `L`
/// (not `C·N·L` rows of one element), and each row matches the interpreter.
#[test]
fn trailing_unit_axes_fold_into_rows() {
    require_avx2_fma!(", so the gather kernel is not used");
    let cfg = Config { target: CpuTarget::X86_64V3, options: Options::default() };
    for (n, l, c) in [(1usize, 40usize, 5usize), (2, 9, 3), (1, 1, 7), (3, 17, 1)] {
        let mut b = KernelBuilder::new("image", vec![tt(&[n, l, c, 1])], tt(&[c, n, l, 1]));
        let o = b.out_index();
        let v = b.load(0, vec![o[1], o[2], o[0], o[3]]);
        let k = b.finish(v).unwrap();
        check_gather(&k, &format!("[{n}, {l}, {c}, 1] to [{c}, {n}, {l}, 1]"));
        let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
        assert_eq!(m.notes[0], "table gather (avx2)");
        // Rows of the innermost axis longer than one (L, else N, else C).
        let rows = c * n * l / [l, n, c].into_iter().find(|&d| d > 1).unwrap_or(1);
        assert_eq!(m.workgroups, [rows as u64], "[{n}, {l}, {c}, 1]");
    }
}

/// An index that reads two output variables (`x[(i + j) rem 7]`) is not separable: the
/// general path takes it and its note says why.
#[test]
fn non_separable_index_is_left_to_the_general_path() {
    require_avx2_fma!(", so the gather kernel is not used");
    let mut b = KernelBuilder::new("skew", vec![tt(&[7])], tt(&[5, 6]));
    let o = b.out_index();
    let s: ExprId = b.add(o[0], o[1]);
    let seven = b.index(7);
    let r = b.binary(BinaryOp::Rem, s, seven);
    let v = b.load(0, vec![r]);
    let k = b.finish(v).unwrap();
    let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
    assert!(m.notes[0].starts_with("general (") && m.notes[0].contains("several variables"), "{}", m.notes[0]);
    let x = random_f32(&[7], 1.0, 1);
    let cfg = Config { target: CpuTarget::X86_64V3, options: Options::default() };
    assert_eq!(run_compiled(&k, &[&x], &cfg, 2).bytes(), kiln_flow::interp::run(&k, &[&x]).unwrap().bytes());
}

/// The interleave with an activation fused after it — `max(x, 0)` (NaN stays NaN), a
/// leaky select `x < 0 ? 0.1·x : x`, a clamp to [−1, 1] — evaluated on the gathered
/// vector: bit for bit the interpreter's (but for the sign of a zero from max or min),
/// NaN and infinities in the input included.
#[test]
fn epilogues_over_a_gather_match_the_interpreter() {
    require_avx2_fma!(", so the gather kernel is not used");
    let cfg = Config { target: CpuTarget::X86_64V3, options: Options::default() };
    for (act, w) in [(0, 16usize), (1, 13), (2, 33), (0, 5)] {
        let base = interleave(1, 3, &[4, w], &[2, 2], &[1, 0]);
        // Rebuild with the activation at the root.
        let mut b = KernelBuilder::new("act", base.inputs.clone(), base.output.clone());
        let x = interleave_load(&mut b, &[2, 2], &[1, 0]);
        let zero = b.float(kiln_flow::ScalarType::F32, 0.0);
        let v = match act {
            0 => b.binary(BinaryOp::Max, x, zero),
            1 => {
                let neg = b.binary(BinaryOp::Lt, x, zero);
                let tenth = b.float(kiln_flow::ScalarType::F32, 0.1);
                let s = b.mul(x, tenth);
                b.select(neg, s, x)
            }
            _ => {
                let (lo, hi) = (b.float(kiln_flow::ScalarType::F32, -1.0), b.float(kiln_flow::ScalarType::F32, 1.0));
                let m = b.binary(BinaryOp::Max, x, lo);
                b.binary(BinaryOp::Min, m, hi)
            }
        };
        let k = b.finish(v).unwrap();
        let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
        assert_eq!(m.notes[0], "table gather with epilogue (avx2)", "activation {act}");
        let mut xs = random_f32(k.inputs[0].shape.dims(), 2.0, 9 + act as u64).to_f64_vec();
        for (i, s) in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0].into_iter().enumerate() {
            xs[3 * i + 1] = s;
        }
        let x = kiln_ir::Tensor::from_f64(DType::F32, k.inputs[0].shape.clone(), &xs).unwrap();
        let want = kiln_flow::interp::run(&k, &[&x]).unwrap();
        for splits in [1, 5] {
            let got = run_compiled_in(&k, &[&x], &cfg, splits, true);
            // (max and min of mixed-sign zeros may give either zero, as in the
            // contraction epilogues; NaN matches NaN.)
            compare(&got, &want, Cmp { zero_sign: true, rtol: 0.0 })
                .unwrap_or_else(|e| panic!("activation {act} width {w} splits {splits}: {e}"));
        }
    }
}

/// Copies of 8-byte elements (i64) as gathers of 4-byte pairs: a broadcast along the
/// innermost axis (`y[n, t, h] = x[n, t, 0]`, an attention mask expanded over the
/// hidden size) at every row width 1 to 19 (tails of every length in units), a
/// transpose of fewer than 8 rows and rows reversed under an outer broadcast, over random 64-bit
/// values (both halves of every element set, so a swapped or shifted unit shows), bit
/// for bit against the interpreter over several workgroup splits.
#[test]
fn eight_byte_copies_are_gathers_of_pairs() {
    require_avx2_fma!(", so the gather kernel is not used");
    let cfg = Config { target: CpuTarget::X86_64V3, options: Options::default() };
    let ti = |dims: &[usize]| TensorType::new(DType::I64, Shape::new(dims.to_vec()).unwrap());
    let check = |k: &Kernel, what: &str| {
        let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
        assert_eq!(m.notes[0], "table gather (avx2)", "{what}");
        let mut r = Rng(7 + k.output.shape.numel() as u64);
        let bits: Vec<u64> = (0..k.inputs[0].shape.numel()).map(|_| r.next()).collect();
        let x = tensor_bits(DType::I64, k.inputs[0].shape.dims(), &bits);
        let want = kiln_flow::interp::run(k, &[&x]).unwrap();
        for splits in [1, 3, 7] {
            for reversed in [false, true] {
                let got = run_compiled_in(k, &[&x], &cfg, splits, reversed);
                assert_eq!(got.bytes(), want.bytes(), "{what}: splits {splits} reversed {reversed}");
            }
        }
    };
    for w in 1usize..20 {
        for t in [1usize, 5] {
            let mut b = KernelBuilder::new("expand", vec![ti(&[2, t, 1])], ti(&[2, t, w]));
            let o = b.out_index();
            let zero = b.index(0);
            let v = b.load(0, vec![o[0], o[1], zero]);
            check(&b.finish(v).unwrap(), &format!("[2, {t}, 1] to [2, {t}, {w}]"));
        }
    }
    let mut b = KernelBuilder::new("tr", vec![ti(&[13, 5])], ti(&[5, 13]));
    let o = b.out_index();
    let v = b.load(0, vec![o[1], o[0]]);
    check(&b.finish(v).unwrap(), "transpose");
    // Rows reversed and broadcast over an outer axis (`y[i, j, c] = x[j, 8 − c]`).
    let mut b = KernelBuilder::new("reversed", vec![ti(&[4, 9])], ti(&[3, 4, 9]));
    let o = b.out_index();
    let eight = b.index(8);
    let c = b.sub(eight, o[2]);
    let v = b.load(0, vec![o[1], c]);
    check(&b.finish(v).unwrap(), "reversed rows");
}
