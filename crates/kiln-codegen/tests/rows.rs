//! Row kernels (`cpu::rows`, AVX2) against the kernel interpreter: Softmax and
//! LayerNorm as the lowering writes them, over row lengths from 8 to 130 (full vectors
//! and masked tails) and several rows, split across workgroups; a row maximum broadcast
//! along the row; NaN through the maximum; writes outside the output (`run_compiled`).
//! Softmax keeps its `exp(x − max)` in the output row between the sum and the output
//! loop, and multiplies by the sum's reciprocal; kernels whose sum reads another input
//! or another length must not keep anything, and give the same results.
//! Elementwise kernels with exp or erf (sigmoid, GELU) take the row path too, and must
//! give the general code generator's bits exactly (the same inline functions).
//! Quantisation round trips (an `isnan` select in every vector) bit for bit: a transpose
//! to channels last whose short rows join by lanes, ConvTranspose's interleaved phases
//! (index lanes with `div`/`rem` by 2), rows of joined axes kept within 2048 elements
//! (the workgroup counts checked); a division by a power of two, multiplied by its
//! reciprocal, bit for bit with the division.
//!
//! Bounds: Softmax within `(L + 11)·2⁻²⁴` relative (exp is within 1 ulp, the sum is
//! reassociated over `L` terms, the reciprocal and its product round twice);
//! LayerNorm within `10⁻⁵·(1 + |want|)` (inputs in [−1, 1], the variance a sum of `L`
//! squares).

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
use kiln_flow::{interp, BinaryOp, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn tt(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

/// The widths under test, with the note's start: eight lanes (x86-64-v3), and sixteen
/// (x86-64-v4) where this CPU has AVX-512 F (skipped, and said so, where it does not).
fn widths() -> Vec<(CpuTarget, &'static str)> {
    let mut w = vec![(CpuTarget::X86_64V3, "row kernel (avx2")];
    if std::is_x86_feature_detected!("avx512f") {
        w.push((CpuTarget::X86_64V4, "row kernel (avx-512"));
    } else {
        eprintln!("16-lane row kernels skipped: this CPU lacks AVX-512 F");
    }
    w
}

/// `max(x[i, ..]) − x[i, j]`, clamped below at 0 with a `max` (a row value broadcast
/// and a binary max).
fn row_max_gap(rows: usize, len: usize) -> Kernel {
    let mut b = KernelBuilder::new("gap", vec![tt(&[rows, len])], tt(&[rows, len]));
    let o = b.out_index();
    let mx = reduce_row(&mut b, 0, o[0], len, ReduceOp::Max, |_, x| x);
    let x = b.load(0, vec![o[0], o[1]]);
    let d = b.sub(mx, x);
    let zero = b.float(ScalarType::F32, 0.0);
    let y = b.binary(BinaryOp::Max, d, zero);
    b.finish(y).unwrap()
}

/// `exp(x[i, j]) / Σₖ exp(y[i, k])`: a sum whose operand is not the output's (another
/// input, or another length).
fn exp_over_other_sum(rows: usize, len: usize, other: usize) -> Kernel {
    let mut b = KernelBuilder::new("other", vec![tt(&[rows, len]), tt(&[rows, other])], tt(&[rows, len]));
    let o = b.out_index();
    let sum = reduce_row(&mut b, 1, o[0], other, ReduceOp::Sum, |b, y| b.unary(UnaryOp::Exp, y));
    let x = b.load(0, vec![o[0], o[1]]);
    let e = b.unary(UnaryOp::Exp, x);
    let y = b.div(e, sum);
    b.finish(y).unwrap()
}

/// An elementwise kernel over `[rows, len]`: `sigmoid(x) = 1 / (1 + exp(−x))`,
/// `gelu(x) = x·½·(1 + erf(x/√2))` or `erf(x) + exp(x)·c[j]` (a per-column input).
fn elementwise(what: &str, rows: usize, len: usize) -> Kernel {
    let f = ScalarType::F32;
    let mut b = KernelBuilder::new(what, vec![tt(&[rows, len]), tt(&[len])], tt(&[rows, len]));
    let o = b.out_index();
    let x = b.load(0, vec![o[0], o[1]]);
    let one = b.float(f, 1.0);
    let y = match what {
        "sigmoid" => {
            let n = b.unary(UnaryOp::Neg, x);
            let e = b.unary(UnaryOp::Exp, n);
            let d = b.add(one, e);
            b.div(one, d)
        }
        "gelu" => gelu(&mut b, x),
        _ => {
            let c = b.load(1, vec![o[1]]);
            let e = b.unary(UnaryOp::Exp, x);
            let r = b.unary(UnaryOp::Erf, x);
            let p = b.mul(e, c);
            b.add(r, p)
        }
    };
    b.finish(y).unwrap()
}

fn run_all(k: &Kernel, ins: &[Tensor], target: (CpuTarget, &str)) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (want, got, note) = run_noted(k, ins, target.0);
    assert_eq!(note, format!("{})", target.1), "{}", k.name);
    (want, got)
}

/// Compiles `k` for `target` with the default options, runs it split into 1 and 3
/// workgroup ranges, and returns the interpreter's result, the compiled ones and the
/// kernel's note.
fn run_noted(k: &Kernel, ins: &[Tensor], target: CpuTarget) -> (Vec<f32>, Vec<Vec<f32>>, String) {
    let m = compile_with(&classify(&[k]), &target, &Options::default()).unwrap();
    let note = m.notes[0].clone();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(k, &refs).unwrap().to_vec::<f32>().unwrap();
    let cfg = Config { target, options: Options::default() };
    let got = [1, 3].iter().map(|&s| run_compiled(k, &refs, &cfg, s).to_vec::<f32>().unwrap()).collect();
    (want, got, note)
}

/// Asserts that every run's result `got` is `close` to the interpreter's `want`,
/// element by element (`what` names the case in the message).
fn assert_close(got: &[Vec<f32>], want: &[f32], close: impl Fn(f32, f32) -> bool, what: &str) {
    for g in got {
        for (i, (&a, &w)) in g.iter().zip(want).enumerate() {
            assert!(close(a, w), "{what}: [{i}] got {a}, want {w}");
        }
    }
}

#[test]
fn softmax_rows() {
    require_avx2_fma!();
    for (target, kind) in widths() {
        for (rows, len) in [(1, 8), (3, 9), (5, 13), (2, 16), (4, 64), (7, 100), (2, 128), (3, 130)] {
            let k = softmax(rows, len);
            let (want, got, note) = run_noted(&k, &[random_f32(&[rows, len], 8.0, 11)], target);
            assert_eq!(note, format!("{kind}; reduction operand kept in the output; reciprocal per row)"));
            let tol = (len as f32 + 11.0) * f32::EPSILON / 2.0;
            assert_close(&got, &want, |a, w| (a - w).abs() <= tol * w.abs(), &format!("{rows}x{len}"));
        }
    }
}

/// Softmax quantised to u8 (`clamp(round(softmax(x) / s), 0, 255)`, a QDQ model's
/// Softmax and QuantizeLinear in one kernel): the output row has no room for `exp(x −
/// max)`'s 32-bit lanes, so the kernel keeps them in its stack frame (up to 4,096
/// elements, a frame of several pages at 4,096), and a longer row computes exp twice.
/// The division by the sum stays a division (the result reaches a rounding), but the
/// sum is reassociated: a quotient within an ulp of a rounding tie may round the other
/// way, so every byte is within one step of the interpreter's and at most 1% differ.
#[test]
fn quantised_softmax_keeps_its_operand_in_the_frame() {
    require_avx2_fma!();
    for (target, kind) in widths() {
        for (rows, len) in [(3, 9), (2, 100), (2, 400), (2, 1030), (1, 4096), (1, 4097)] {
            let out = TensorType::new(DType::U8, Shape::new(vec![rows, len]).unwrap());
            let mut b = KernelBuilder::new("qsoftmax", vec![tt(&[rows, len])], out);
            let o = b.out_index();
            let f = ScalarType::F32;
            let y = softmax_at(&mut b, &o, len, UnaryOp::Exp);
            let s = b.float(f, 1.0 / 256.0 + 1e-5);
            let y = b.div(y, s);
            let r = b.unary(UnaryOp::Round, y);
            let (lo, hi) = (b.float(f, 0.0), b.float(f, 255.0));
            let r = b.binary(BinaryOp::Max, r, lo);
            let r = b.binary(BinaryOp::Min, r, hi);
            let q = b.cast(r, DType::U8, false);
            let k = b.finish(q).unwrap();
            let m = compile_with(&classify(&[&k]), &target, &Options::default()).unwrap();
            let kept = if len <= 4096 { "; reduction operand kept in the frame" } else { "" };
            assert_eq!(m.notes[0], format!("{kind}{kept})"), "{rows}x{len}");
            let x = random_f32(&[rows, len], 8.0, 23);
            let want = interp::run(&k, &[&x]).unwrap().to_vec::<u8>().unwrap();
            let cfg = Config { target, options: Options::default() };
            for splits in [1, 3] {
                let got = run_compiled(&k, &[&x], &cfg, splits).to_vec::<u8>().unwrap();
                let off = got.iter().zip(&want).filter(|(a, w)| a != w).count();
                for (i, (&a, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(a.abs_diff(w) <= 1, "{rows}x{len}: [{i}] got {a}, want {w}");
                }
                assert!(off * 100 <= got.len(), "{rows}x{len}: {off} of {} bytes off by one", got.len());
            }
        }
    }
}

#[test]
fn layernorm_rows() {
    require_avx2_fma!();
    for (target, kind) in widths() {
        for (rows, len) in [(1, 8), (3, 11), (6, 64), (5, 129), (2, 256)] {
            let k = layernorm(rows, len);
            let ins = [random_f32(&[rows, len], 1.0, 3), random_f32(&[len], 1.0, 4), random_f32(&[len], 1.0, 5)];
            let (want, got, note) = run_noted(&k, &ins, target);
            // The normalising division is by the row's deviation; the mean's by a constant.
            assert_eq!(note, format!("{kind}; reciprocal per row)"));
            assert_close(&got, &want, |a, w| (a - w).abs() <= 1e-5 * (1.0 + w.abs()), &format!("{rows}x{len}"));
        }
    }
}

#[test]
fn row_values_and_nan() {
    require_avx2_fma!();
    for target in widths() {
        // Row 1's NaN in the masked tail of both widths, then in a full vector.
        for (rows, len, at) in [(3, 21, 20), (3, 37, 5)] {
            let mut x = random_f32(&[rows, len], 1.0, 7).to_vec::<f32>().unwrap();
            x[len + at] = f32::NAN;
            let x = Tensor::from_vec(Shape::new(vec![rows, len]).unwrap(), x).unwrap();
            let k = row_max_gap(rows, len);
            let (want, got) = run_all(&k, &[x], target);
            for g in got {
                for (i, (a, w)) in g.iter().zip(&want).enumerate() {
                    // Row 1's maximum is NaN, so its whole row is.
                    assert_eq!(a.is_nan(), i / len == 1, "[{i}] got {a}");
                    assert!(a.is_nan() && w.is_nan() || a == w, "[{i}] got {a}, want {w}");
                }
            }
        }
    }
}

#[test]
fn sums_of_other_operands_keep_nothing() {
    require_avx2_fma!();
    // Another input of the same length, then the same input's shape but another length.
    for (target, kind) in widths() {
        for (rows, len, other) in [(3, 37, 37), (2, 64, 64), (3, 37, 20), (2, 16, 64)] {
            let k = exp_over_other_sum(rows, len, other);
            let ins = [random_f32(&[rows, len], 4.0, 21), random_f32(&[rows, other], 4.0, 22)];
            let (want, got, note) = run_noted(&k, &ins, target);
            assert_eq!(note, format!("{kind}; reciprocal per row)"), "{rows}x{len}, sum over {other}");
            let tol = (other as f32 + 11.0) * f32::EPSILON / 2.0;
            assert_close(&got, &want, |a, w| (a - w).abs() <= tol * w.abs(), &format!("{rows}x{len}/{other}"));
        }
    }
}

#[test]
fn exact_division_without_reassociation() {
    require_avx2_fma!();
    // Without leave to reassociate, a kernel with a sum is the general generator's, and a
    // division stays a division.
    let exact = Options { reassociate: false, ..Options::default() };
    for (target, kind) in widths() {
        let m = compile_with(&classify(&[&softmax(3, 37)]), &target, &exact).unwrap();
        assert!(m.notes[0].starts_with("general"), "{}", m.notes[0]);
        let m = compile_with(&classify(&[&elementwise("sigmoid", 3, 37)]), &target, &exact).unwrap();
        assert_eq!(m.notes[0], format!("{kind})"));
    }
}

#[test]
fn elementwise_transcendentals_match_the_general_path() {
    require_avx2_fma!();
    for (target, kind) in widths() {
        let general = Config { target, options: Options { contraction_kernels: false, ..Options::default() } };
        for what in ["sigmoid", "gelu", "mixed"] {
            for (rows, len) in [(1, 8), (3, 37), (2, 64), (4, 130)] {
                let k = elementwise(what, rows, len);
                // Values past both ends of exp's range, results in the subnormal range (exp
                // of −88 to −104: one rounding, the 16-lane scale in a single instruction),
                // and NaN, in full vectors and in tails.
                let mut x = random_f32(&[rows, len], 12.0, 31).to_vec::<f32>().unwrap();
                let special = [-200.0, 120.0, f32::NAN, -0.0, 89.5, -104.5, -88.5, -95.25, -100.1, -103.9, 88.7, -87.4];
                for (i, v) in special.into_iter().enumerate() {
                    let at = (i * 7 + len - 1) % x.len();
                    x[at] = v;
                }
                let x = Tensor::from_vec(Shape::new(vec![rows, len]).unwrap(), x).unwrap();
                let c = random_f32(&[len], 2.0, 32);
                let ins = [x, c];
                let (want, got, note) = run_noted(&k, &ins, target);
                assert_eq!(note, format!("{kind})"), "{what}");
                let refs: Vec<&Tensor> = ins.iter().collect();
                let gen = run_compiled(&k, &refs, &general, 1).to_vec::<f32>().unwrap();
                for g in got {
                    for (i, ((a, b), w)) in g.iter().zip(&gen).zip(&want).enumerate() {
                        assert!(a.to_bits() == b.to_bits(), "{what} {rows}x{len}: [{i}] row {a}, general {b}");
                        // exp and erf within a few ulp of the interpreter's (libm's).
                        let close = a == w || (a - w).abs() <= 1e-5 * w.abs() + 1e-6 || a.is_nan() && w.is_nan();
                        assert!(close, "{what} {rows}x{len}: [{i}] got {a}, want {w}");
                    }
                }
            }
        }
    }
}

/// A quantisation round trip of `x` (scale `s`, zero point 3, int8 range) as the
/// lowering writes it: `(clamp(select(isnan(x/s), 0, round(x/s)) + 3) − 3)·s`, a
/// comparison made a vector mask in every vector of the row.
fn round_trip(b: &mut KernelBuilder, x: kiln_flow::ExprId, s: f64) -> kiln_flow::ExprId {
    let f = ScalarType::F32;
    let s = b.float(f, s);
    let y = b.div(x, s);
    let nan = b.unary(UnaryOp::IsNan, y);
    let r = b.unary(UnaryOp::Round, y);
    let zero = b.float(f, 0.0);
    let r = b.select(nan, zero, r);
    let zp = b.float(f, 3.0);
    let q = b.add(r, zp);
    let (lo, hi) = (b.float(f, -128.0), b.float(f, 127.0));
    let q = b.binary(BinaryOp::Max, q, lo);
    let q = b.binary(BinaryOp::Min, q, hi);
    let d = b.sub(q, zp);
    b.mul(d, s)
}

/// The interpreter's result and every compiled run, bit for bit (NaN as NaN).
fn assert_bits(got: &[Vec<f32>], want: &[f32], what: &str) {
    for g in got {
        for (i, (&a, &w)) in g.iter().zip(want).enumerate() {
            assert!(a.to_bits() == w.to_bits() || a.is_nan() && w.is_nan(), "{what}: [{i}] got {a}, want {w}");
        }
    }
}

/// Random values with NaN and values past the int8 range scattered in.
fn with_specials(dims: &[usize], seed: u64) -> Tensor {
    let mut x = random_f32(dims, 10.0, seed).to_vec::<f32>().unwrap();
    let n = x.len();
    for (i, v) in [f32::NAN, 1e4, -1e4, -0.0, 0.25, 0.75].into_iter().enumerate() {
        x[(i * 37 + 5) % n] = v;
    }
    Tensor::from_vec(Shape::new(dims.to_vec()).unwrap(), x).unwrap()
}

/// A round trip of a `[C, H, W]` input written `[H, W, C]` (a transpose to channels
/// last): with `C` shorter than a vector and every extent a power of two, `H` and `W`
/// join the row by lanes (rows of at most 2048 elements, each lane decoding its
/// coordinates, the load a gather); otherwise one row per `(h, w)`. Also an elementwise
/// `[48, 16, 16]` round trip, read contiguously: rows of 256, 48 workgroups.
#[test]
fn short_rows_join_by_lanes_and_joined_rows_stay_bounded() {
    require_avx2_fma!();
    for (target, kind) in widths() {
        let wide = kind.contains("avx-512");
        // Rows on 16 lanes and on 8: at most 2048 elements joined, only axes of a power
        // of two, and no joining of an axis as long as a vector.
        for (h, w, c, rows16, rows8) in
            [(64, 64, 4, 64, 64), (8, 16, 2, 1, 1), (4, 8, 8, 1, 32), (64, 64, 3, 4096, 4096), (5, 8, 4, 5, 5)]
        {
            let rows = if wide { rows16 } else { rows8 };
            let mut b = KernelBuilder::new("nhwc", vec![tt(&[c, h, w])], tt(&[h, w, c]));
            let o = b.out_index();
            let x = b.load(0, vec![o[2], o[0], o[1]]);
            let y = round_trip(&mut b, x, 0.0166);
            let k = b.finish(y).unwrap();
            let (want, got, note) = run_noted(&k, &[with_specials(&[c, h, w], 41)], target);
            assert_eq!(note, format!("{kind})"), "{h}x{w}x{c}");
            assert_bits(&got, &want, &format!("{h}x{w}x{c}"));
            let m = compile_with(&classify(&[&k]), &target, &Options::default()).unwrap();
            assert_eq!(m.workgroups[0], rows as u64, "{h}x{w}x{c}: rows");
        }
        let mut b = KernelBuilder::new("hswish", vec![tt(&[48, 16, 16])], tt(&[48, 16, 16]));
        let o = b.out_index();
        let x = b.load(0, vec![o[0], o[1], o[2]]);
        let y = round_trip(&mut b, x, 0.0593);
        let k = b.finish(y).unwrap();
        let (want, got, note) = run_noted(&k, &[with_specials(&[48, 16, 16], 42)], target);
        assert_eq!(note, format!("{kind})"));
        assert_bits(&got, &want, "48x16x16");
        let m = compile_with(&classify(&[&k]), &target, &Options::default()).unwrap();
        assert_eq!(m.workgroups[0], 48);
    }
}

/// ConvTranspose's stride-2 phases interleaved, `y[c, h, w] = x[(h rem 2)·2 + w rem 2,
/// c, h div 2, w div 2]`, round-tripped: index lanes divide and take remainders by
/// powers of two, so the kernel is a row kernel (gathers at offsets computed in lanes),
/// not the general path.
#[test]
fn interleaved_phases_are_index_lanes() {
    require_avx2_fma!();
    for (target, kind) in widths() {
        for (c, h, w) in [(8, 16, 16), (3, 6, 20), (2, 4, 34)] {
            let mut b = KernelBuilder::new("phases", vec![tt(&[4, c, h / 2, w / 2])], tt(&[c, h, w]));
            let o = b.out_index();
            let two = b.index(2);
            let (hr, wr) = (b.binary(BinaryOp::Rem, o[1], two), b.binary(BinaryOp::Rem, o[2], two));
            let hr2 = b.mul(hr, two);
            let phase = b.add(hr2, wr);
            let (hd, wd) = (b.binary(BinaryOp::Div, o[1], two), b.binary(BinaryOp::Div, o[2], two));
            let x = b.load(0, vec![phase, o[0], hd, wd]);
            let y = round_trip(&mut b, x, 0.029);
            let k = b.finish(y).unwrap();
            let (want, got, note) = run_noted(&k, &[with_specials(&[4, c, h / 2, w / 2], 43)], target);
            assert_eq!(note, format!("{kind})"), "{c}x{h}x{w}");
            assert_bits(&got, &want, &format!("{c}x{h}x{w}"));
        }
    }
}

/// `x / c` for constants `c`: a power of two with a normal reciprocal is multiplied by
/// its reciprocal, which must give the division's bits exactly (results in the subnormal
/// range, overflowing, NaN, infinities, signed zeros); other divisors divide.
#[test]
fn division_by_a_power_of_two_is_exact() {
    require_avx2_fma!();
    let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0, 1e-38, -3e-39, 1.5e-45, 3e38, -2.9e38, 1.0];
    for (target, kind) in widths() {
        for c in [
            0.0078125f32,
            0.00390625,
            -0.5,
            2.0,
            1024.0,
            2.0f32.powi(-126),
            2.0f32.powi(126),
            0.0301,
            6.0,
            2.0f32.powi(127),
        ] {
            let len = 37;
            let mut b = KernelBuilder::new("divc", vec![tt(&[2, len])], tt(&[2, len]));
            let o = b.out_index();
            let x = b.load(0, vec![o[0], o[1]]);
            let cc = b.float(ScalarType::F32, c as f64);
            let y = b.div(x, cc);
            let k = b.finish(y).unwrap();
            let mut xs = random_f32(&[2, len], 1e3, 44).to_vec::<f32>().unwrap();
            xs[..special.len()].copy_from_slice(&special);
            let x = Tensor::from_vec(Shape::new(vec![2, len]).unwrap(), xs).unwrap();
            let (want, got, note) = run_noted(&k, &[x], target);
            assert_eq!(note, format!("{kind})"), "{c}");
            assert_bits(&got, &want, &format!("x / {c}"));
        }
    }
}

/// `chains` row-wise concatenations of `pieces` inputs each (`x_p[j]` on the row `p`
/// owns, chosen by a chain of selects on the row index, as a fused Concat of padded pieces
/// writes it), squared and summed — with two chains, a constant-Q magnitude `√(re² + im²)`
/// over concatenated bands without the root. In the kernel's order each select holds its
/// condition and piece while the rest of its chain is evaluated, and with two chains each
/// condition is kept for the second.
fn concatenations(chains: usize, pieces: usize, len: usize) -> Kernel {
    let inputs = (0..chains * pieces).map(|_| tt(&[len])).collect();
    let mut b = KernelBuilder::new("stacked", inputs, tt(&[pieces + 2, len]));
    let o = b.out_index();
    let conds: Vec<_> = (0..pieces - 1)
        .map(|p| {
            let bound = b.index(p as i64 + 1);
            b.binary(BinaryOp::Lt, o[0], bound)
        })
        .collect();
    let mut y = None;
    for chain in 0..chains {
        let mut v = b.load(chain * pieces + pieces - 1, vec![o[1]]);
        for p in (0..pieces - 1).rev() {
            let x = b.load(chain * pieces + p, vec![o[1]]);
            v = b.select(conds[p], x, v);
        }
        let sq = b.mul(v, v);
        y = Some(match y {
            None => sq,
            Some(acc) => b.add(acc, sq),
        });
    }
    b.finish(y.unwrap()).unwrap()
}

/// The interpreter's and the compiled results of [`concatenations`] of 12 pieces, bit for
/// bit (selects, products, sums in the same order), and a row kernel's note on both widths.
fn check_concatenations(chains: usize, seed: u64) {
    for (target, kind) in widths() {
        for len in [8, 37] {
            let k = concatenations(chains, 12, len);
            let ins: Vec<Tensor> = (0..12 * chains as u64).map(|i| random_f32(&[len], 2.0, seed + i)).collect();
            let (want, got, note) = run_noted(&k, &ins, target);
            assert_eq!(note, format!("{kind})"), "{chains} chains, length {len}");
            assert_close(&got, &want, |a, w| a.to_bits() == w.to_bits(), &format!("{chains} chains, length {len}"));
        }
    }
}

#[test]
fn deep_select_chains_evaluate_the_largest_operand_first() {
    require_avx2_fma!();
    // One chain of 12 pieces: the kernel's order holds more values than eight-lane kernels
    // have registers for; evaluated the deeper operand first (`rows::register_needs`), it
    // is a row kernel on both widths.
    check_concatenations(1, 40);
}

#[test]
fn row_values_kept_for_later_uses_are_reloaded_when_registers_run_out() {
    require_avx2_fma!();
    // Two chains: eleven row conditions kept for the second chain do not fit beside it in
    // eight-lane registers; those not held by the operation being evaluated are given up
    // and reloaded from their row slots at their next use (`Emit::evict`).
    check_concatenations(2, 60);
}
