//! Padding kernels (`cpu::pad`): `out[q] = x[q + c]` with `Pad` bounds, against the
//! interpreter, bit for bit: pads on every side, crops (positive shifts), rows wholly
//! outside the input, widths below, at and above the vector width, a non-zero pad
//! value, ranks 1 to 4, workgroup splits, nothing written outside the output.
//!
//! Affine copies (`cpu::copy`): im2col column gathers, strided row picks, broadcast
//! rows and crops, ranks 2 to 6, row widths 4 to 70 (tails of every length), bit for
//! bit, with workgroup ranges run in order and last first (a range's last row must not
//! write into the next range).

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
use kiln_flow::{Bounds, ExprId, Kernel, KernelBuilder};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn tt(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

/// `out[q] = x[q + shift]`, pad value `value` outside `x`.
fn padding(in_dims: &[usize], out_dims: &[usize], shift: &[i64], value: f32) -> Kernel {
    let mut b = KernelBuilder::new("pad", vec![tt(in_dims)], tt(out_dims));
    let q = b.out_index();
    let idx = q
        .iter()
        .zip(shift)
        .map(|(&qd, &s)| {
            let c = b.index(s);
            b.add(qd, c)
        })
        .collect();
    let v = b.load_with(0, idx, Bounds::Pad(value.to_bits() as u64));
    b.finish(v).unwrap()
}

#[test]
fn paddings_match_the_interpreter() {
    require_avx2_fma!(", so the padding kernel is not used");
    let cases: Vec<(Vec<usize>, Vec<usize>, Vec<i64>, f32)> = vec![
        (vec![1, 3, 5, 6], vec![1, 3, 7, 8], vec![0, 0, -1, -1], 0.0),
        (vec![2, 4, 9, 70], vec![2, 4, 13, 74], vec![0, 0, -2, -2], 0.0),
        (vec![1, 2, 4, 4], vec![1, 2, 6, 5], vec![0, 0, -1, -1], 1.5),
        (vec![3, 20], vec![5, 30], vec![-1, -3], -2.0),
        (vec![37], vec![41], vec![-2], 0.25),
        (vec![2, 3, 16], vec![2, 3, 8], vec![0, 0, 4], 0.0),
        (vec![2, 9, 9], vec![4, 5, 12], vec![1, 2, -1], 0.0),
        (vec![1, 1, 3, 3], vec![1, 1, 11, 11], vec![0, 0, -4, -4], 0.0),
        (vec![1, 2, 7, 100], vec![1, 2, 9, 230], vec![0, 0, -1, -100], 0.0),
    ];
    for (i, (inp, out, shift, value)) in cases.into_iter().enumerate() {
        let k = padding(&inp, &out, &shift, value);
        let m = compile_with(&classify(&[&k]), &CpuTarget::Host, &Options::default()).unwrap();
        assert!(m.notes[0].starts_with("padding copy"), "case {i}: {}", m.notes[0]);
        let x = random_f32(&inp, 3.0, i as u64);
        let host = Config { target: CpuTarget::Host, options: Options::default() };
        check_with(&k, &[&x], EXACT, std::slice::from_ref(&host));
        // Rows of 8 or more store whole vectors only: inside the output row, and reads
        // inside x's row (operands against inaccessible pages).
        check_fenced(&k, &[&x], &host);
    }
}

/// 1-byte paddings (an 8-bit image padded with its zero point, in front of an integer
/// convolution): the same shapes, i8 and u8, pad values at both ends of the range.
#[test]
fn byte_paddings_match_the_interpreter() {
    require_avx2_fma!(", so the padding kernel is not used");
    let cases: Vec<(Vec<usize>, Vec<usize>, Vec<i64>)> = vec![
        (vec![1, 3, 5, 6], vec![1, 3, 7, 8], vec![0, 0, -1, -1]),
        (vec![2, 4, 9, 70], vec![2, 4, 13, 74], vec![0, 0, -2, -2]),
        (vec![3, 20], vec![5, 30], vec![-1, -3]),
        (vec![37], vec![41], vec![-2]),
        (vec![2, 3, 16], vec![2, 3, 8], vec![0, 0, 4]),
        (vec![2, 9, 9], vec![4, 5, 12], vec![1, 2, -1]),
        (vec![1, 2, 7, 100], vec![1, 2, 9, 230], vec![0, 0, -1, -100]),
    ];
    for (i, (inp, out, shift)) in cases.into_iter().enumerate() {
        for (dtype, pad) in [(DType::U8, 0u64), (DType::U8, 255), (DType::I8, 0x80), (DType::I8, 0x7F)] {
            let t = |d: &[usize]| TensorType::new(dtype, Shape::new(d.to_vec()).unwrap());
            let mut b = KernelBuilder::new("pad8", vec![t(&inp)], t(&out));
            let q = b.out_index();
            let idx = q
                .iter()
                .zip(&shift)
                .map(|(&qd, &s)| {
                    let c = b.index(s);
                    b.add(qd, c)
                })
                .collect();
            let v = b.load_with(0, idx, Bounds::Pad(pad));
            let k = b.finish(v).unwrap();
            let m = compile_with(&classify(&[&k]), &CpuTarget::Host, &Options::default()).unwrap();
            assert!(m.notes[0].starts_with("padding copy"), "case {i}: {}", m.notes[0]);
            let n: usize = inp.iter().product();
            let bits: Vec<u64> = (0..n as u64).map(|j| (j * 37 + i as u64) % 256).collect();
            let x = tensor_bits(dtype, &inp, &bits);
            check_with(&k, &[&x], EXACT, &[Config { target: CpuTarget::Host, options: Options::default() }]);
        }
    }
}

/// `out[q] = x[Σ_d coef[d]·q_d + c]` over `x` flattened (in bounds), elements of dtype
/// `d`, through a rank-1 view: `x` is read at the flat offset, so any affine map is
/// expressible.
fn copy_of(d: DType, in_len: usize, out_dims: &[usize], coef: &[i64], c: i64) -> Kernel {
    let t = |dims: &[usize]| TensorType::new(d, Shape::new(dims.to_vec()).unwrap());
    let mut b = KernelBuilder::new("copy", vec![t(&[in_len])], t(out_dims));
    let q = b.out_index();
    let mut at: ExprId = b.index(c);
    for (d, &k) in coef.iter().enumerate() {
        if k != 0 {
            let kk = b.index(k);
            let t = b.mul(q[d], kk);
            at = b.add(at, t);
        }
    }
    let v = b.load(0, vec![at]);
    b.finish(v).unwrap()
}

/// Affine copies `(output dims, coefficients per output dim, constant)` that both
/// element sizes are tested on; the input is sized to the largest offset read.
fn copy_cases() -> Vec<(Vec<usize>, Vec<i64>, i64)> {
    vec![
        // im2col of a [1, 6, 14, 14] map for a 5×5 window: cols[c, kh, kw, oh, ow].
        (vec![6, 5, 5, 10, 10], vec![196, 14, 1, 14, 1], 0),
        // of a [1, 1, 32, 32] map, 28 columns (3 vectors and a tail of 4).
        (vec![5, 5, 28, 28], vec![32, 1, 32, 1], 0),
        // every other row of a 2-D array, from an offset (a strided slice).
        (vec![7, 13], vec![2 * 20, 1], 5),
        // one row broadcast over two outer dims.
        (vec![3, 4, 9], vec![0, 0, 1], 2),
    ]
}

#[test]
fn affine_copies_match_the_interpreter() {
    require_avx2_fma!(", so the copy kernel is not used");
    let mut cases = copy_cases();
    cases.extend([
        // rank 6, widths 4 and 8.
        (vec![2, 1, 3, 2, 2, 4], vec![200, 0, 50, 16, 5, 1], 3),
        (vec![2, 2, 2, 2, 2, 8], vec![300, 100, 40, 16, 8, 1], 0),
    ]);
    for w in [4usize, 5, 7, 8, 9, 15, 16, 17, 33, 70] {
        cases.push((vec![3, 5, w], vec![(w as i64 + 3) * 6, w as i64 + 3, 1], 1));
    }
    check_affine_copies(DType::F32, cases, |in_len| random_f32(&[in_len], 1.0, in_len as u64));
}

/// Each case `(out dims, coefficients, constant)` as an affine copy of `dtype` from an
/// input just long enough for the last element it reads (`input(len)`), compiled for
/// AVX2: the copy kernel takes it, and its result equals the interpreter's bit for bit,
/// its ranges run in 1, 3 and 7 parts, in order and last first.
fn check_affine_copies(dtype: DType, cases: Vec<(Vec<usize>, Vec<i64>, i64)>, input: impl Fn(usize) -> Tensor) {
    let cfg = Config { target: CpuTarget::X86_64V3, options: Options::default() };
    for (dims, coef, c) in cases {
        let last: i64 = c + dims.iter().zip(&coef).map(|(&d, &k)| (d as i64 - 1) * k).sum::<i64>();
        let in_len = last as usize + 1;
        let k = copy_of(dtype, in_len, &dims, &coef, c);
        let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
        assert_eq!(m.notes[0], "affine copy (avx)", "{dims:?}");
        let x = input(in_len);
        let want = kiln_flow::interp::run(&k, &[&x]).unwrap();
        for splits in [1, 3, 7] {
            for reversed in [false, true] {
                let got = run_compiled_in(&k, &[&x], &cfg, splits, reversed);
                assert_eq!(got.bytes(), want.bytes(), "{dims:?} {coef:?} splits {splits} reversed {reversed}");
            }
        }
    }
}

/// Affine copies of 1-byte elements (i8, u8: an integer convolution's image gathered
/// into columns): the im2col shapes above, rows of 1 to 300 bytes (every piece of the
/// unrolled moves: 32, 16, 8, 4, 2 and 1 bytes, and `rep movsb` from 256), one of six
/// outer dimensions (more than the odometer holds: each row decoded), and rows of up to
/// 32 bytes read at a step of 0, 2 or 3 (moved a byte at a time).
#[test]
fn byte_copies_match_the_interpreter() {
    require_avx2_fma!(", so the copy kernel is not used");
    let mut cases = copy_cases();
    for w in [1usize, 2, 3, 5, 7, 15, 16, 17, 31, 32, 33, 63, 70, 255, 256, 300] {
        cases.push((vec![3, 5, w], vec![(w as i64 + 3) * 6, w as i64 + 3, 1], 1));
    }
    cases.push((vec![2, 2, 2, 2, 2, 2, 5], vec![224, 112, 56, 28, 14, 7, 1], 1));
    // Rows at a step of 2 or 3 (a strided convolution's columns) or 0, of 1 to 32 bytes:
    // a byte at a time.
    for (w, s) in [(1usize, 2i64), (2, 2), (5, 2), (16, 3), (31, 2), (32, 2), (7, 0)] {
        cases.push((vec![3, 3, 2, w], vec![7 * 2 * s.max(1) * w as i64, 2 * s.max(1) * w as i64, 3, s], 1));
    }
    for dtype in [DType::U8, DType::I8] {
        check_affine_copies(dtype, cases.clone(), |in_len| {
            let bits: Vec<u64> = (0..in_len as u64).map(|j| (j * 73 + 11) % 256).collect();
            tensor_bits(dtype, &[in_len], &bits)
        });
    }
}

/// Affine copies of 8-byte elements (i64), moved as pairs of 4-byte units: strided row
/// picks, broadcast rows and crops over row widths 2 to 35 (4 to 70 units: tails of
/// every length), bit for bit, ranges run in order and last first. The values are i64
/// specials (the extremes, values across the 32-bit boundary).
#[test]
fn i64_copies_match_the_interpreter() {
    require_avx2_fma!(", so the copy kernel is not used");
    let mut cases: Vec<(Vec<usize>, Vec<i64>, i64)> =
        vec![(vec![7, 13], vec![2 * 20, 1], 5), (vec![3, 4, 9], vec![0, 0, 1], 2)];
    for w in [2usize, 3, 4, 5, 8, 9, 17, 35] {
        cases.push((vec![3, 5, w], vec![(w as i64 + 3) * 6, w as i64 + 3, 1], 1));
    }
    let s = specials(DType::I64);
    check_affine_copies(DType::I64, cases, |in_len| {
        let bits: Vec<u64> = (0..in_len).map(|i| s[(i * 5) % s.len()]).collect();
        tensor_bits(DType::I64, &[in_len], &bits)
    });
}

/// A slice along an axis before the last two (`x[:, :, 100:119, :]` of a
/// `[1, C, 119, 1]` map, and of `[2, C, 30, 6]`): a table copy the resampling emitter
/// declines (it resamples the last two axes only), taken by a vector form instead: an
/// affine copy (rows of 6 elements), or a row kernel along the sliced axis (rows of one
/// element, shorter than a copy's 4).
#[test]
fn outer_axis_slices_are_affine_copies() {
    require_avx2_fma!(", so the copy kernel is not used");
    for (n, c, h, w, from, len) in [(1usize, 128usize, 119usize, 1usize, 100i64, 19usize), (2, 5, 30, 6, 7, 11)] {
        let mut b = KernelBuilder::new("slice", vec![tt(&[n, c, h, w])], tt(&[n, c, len, w]));
        let q = b.out_index();
        let f = b.index(from);
        let y = b.add(q[2], f);
        // (Axes of one position read at index 0, as lowered slices read them.)
        let (n0, w0) = if n == 1 { (b.index(0), b.index(0)) } else { (q[0], q[3]) };
        let w0 = if w == 1 { w0 } else { q[3] };
        let v = b.load(0, vec![n0, q[1], y, w0]);
        let k = b.finish(v).unwrap();
        let x = random_f32(&[n, c, h, w], 1.0, 9);
        for cfg in microkernel_variants(false) {
            let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
            let want = if w == 1 { "row kernel" } else { "affine copy (avx)" };
            assert!(m.notes[0].starts_with(want), "{n}x{c}x{h}x{w}: {}", m.notes[0]);
        }
        check_with(&k, &[&x], EXACT, &microkernel_variants(false));
    }
}
