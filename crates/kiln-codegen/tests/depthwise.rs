//! Depthwise windows and max pools (`cpu::depthwise`, AVX2+FMA) against the kernel
//! interpreter:
//! padded and unpadded, symmetric and one-sided padding, strides 1 and 2, dilation 2,
//! windows 3×3, 1×3, 3×1, 2×2, output widths from 1 to 113 (one vector, masked tails,
//! several register groups), several batches; epilogues of bias, per-channel scale,
//! Relu6 as compare-and-select, `max`/`min` clamps and HardSwish (the value times a
//! clamped chain of itself); NaN through the clamps;
//! workgroup splits and writes outside the output (`run_compiled`); every operand
//! against an inaccessible page at its start and at its end (`check_fenced`: border
//! vectors read whole where they stay inside the plane must never reach past it).
//!
//! The kernel sums in f32 with one FMA per tap; the interpreter sums in f64 and rounds
//! once. Each element must lie within `(taps + 2)·2⁻²⁴·S` of the interpreter, `S` the
//! same kernel on the absolute values of the inputs (a bound on the sum of |terms| and
//! the epilogue's magnitude); after HardSwish `(3·(taps + 2) + 4)·2⁻²⁴·S` (its slope is
//! at most 1.5, `S` at least half the sum's bound, and its gate rounds four times). Max pools (MaxPool as lowered: NaN ignored, −∞ padding)
//! over the same geometries, with NaN in the input and windows of NaN only, must give the
//! interpreter's values exactly (a maximum does not round).

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
use kiln_flow::{interp, Bounds, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{Shape, Tensor};

/// A max pool as the lowering writes it: `max over the window of select(isnan(x), −∞,
/// x)`, −∞ outside the plane; `epilogue` as for [`depthwise`] ([`epilogue_of`]).
fn max_pool(g: Geo, epilogue: &str) -> Kernel {
    let [oh, ow] = g.out();
    let f = ScalarType::F32;
    let ins = vec![f32_type(&[g.n, g.c, g.h, g.w]), f32_type(&[g.c]), f32_type(&[g.c])];
    let mut b = KernelBuilder::new("maxpool", ins, f32_type(&[g.n, g.c, oh, ow]));
    let o = b.out_index();
    let (y, x) = (b.new_var(g.win[0] as u64), b.new_var(g.win[1] as u64));
    let (yv, xv) = (b.var(y), b.var(x));
    let ih = window_index(&mut b, g, o[2], yv, 0);
    let iw = window_index(&mut b, g, o[3], xv, 1);
    let neg_inf = f32::NEG_INFINITY.to_bits() as u64;
    let padded = g.pad.iter().any(|&p| p > 0);
    let bounds = if padded { Bounds::Pad(neg_inf) } else { Bounds::InBounds };
    let xin = b.load_with(0, vec![o[0], o[1], ih, iw], bounds);
    let lo = b.float(f, f64::NEG_INFINITY);
    let nan = b.unary(UnaryOp::IsNan, xin);
    let key = b.select(nan, lo, xin);
    let m = b.reduce(ReduceOp::Max, vec![y, x], key);
    let r = epilogue_of(&mut b, m, o[1], 1, epilogue);
    b.finish(r).unwrap()
}

fn inputs(g: Geo, seed: u64) -> Vec<Tensor> {
    vec![
        random_f32(&[g.n, g.c, g.h, g.w], 2.0, seed),
        random_f32(&[g.c, 1, g.win[0], g.win[1]], 1.0, seed + 1),
        random_f32(&[g.c], 1.0, seed + 2),
        random_f32(&[g.c], 1.0, seed + 3),
    ]
}

/// Compiles and runs `k` (which must take the depthwise path) and compares it with the
/// interpreter within `units` half-ulps of `S` (see the module docs).
fn check(k: &Kernel, ins: &[Tensor], units: f32) {
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(k, &refs).unwrap().to_vec::<f32>().unwrap();
    let absin: Vec<Tensor> = ins.iter().map(abs).collect();
    let bound = interp::run(k, &absin.iter().collect::<Vec<_>>()).unwrap().to_vec::<f32>().unwrap();
    for cfg in targets() {
        let m = compile_with(&classify(&[k]), &cfg.target, &Options::default()).unwrap();
        assert!(m.notes[0].starts_with("depthwise"), "{} {:?}: {}", k.name, cfg.target, m.notes[0]);
        check_fenced(k, &refs, &cfg);
        for splits in [1, 3] {
            let got = run_compiled(k, &refs, &cfg, splits).to_vec::<f32>().unwrap();
            for i in 0..want.len() {
                let tol = units * f32::EPSILON / 2.0 * bound[i].abs() + 1e-30;
                let ok = (got[i] - want[i]).abs() <= tol || (got[i].is_nan() && want[i].is_nan());
                assert!(
                    ok,
                    "{} {:?} splits {splits}: element {i}: got {}, want {} (tol {tol})",
                    k.name, cfg.target, got[i], want[i]
                );
            }
        }
    }
}

/// x86-64-v3, and x86-64-v4 where the CPU has AVX-512 F and VL (border taps under
/// opmasks).
fn targets() -> Vec<Config> {
    microkernel_variants(true)
}

/// Runs `k` on `x` for every target in 1 and 3 splits, bit for bit the interpreter's;
/// `note`: how each target must say it compiled `k` (a prefix); `what` names the case.
fn check_exact(k: &Kernel, x: &Tensor, note: Option<&str>, what: &str) {
    let want = interp::run(k, &[x]).unwrap();
    for cfg in targets() {
        if let Some(note) = note {
            let m = compile_with(&classify(&[k]), &cfg.target, &Options::default()).unwrap();
            assert!(m.notes[0].starts_with(note), "{what} {cfg:?}: {}", m.notes[0]);
        }
        check_fenced(k, &[x], &cfg);
        for splits in [1, 3] {
            let got = run_compiled(k, &[x], &cfg, splits);
            if let Err(e) = compare(&got, &want, EXACT) {
                panic!("{what} {cfg:?} splits {splits}: {e}");
            }
        }
    }
}

/// On x86-64-v4, convolutions whose rows have border vectors take their border taps
/// under opmasks (at stride 1 and 2), and say so.
#[test]
fn border_taps_under_opmasks() {
    if targets().len() < 2 {
        return;
    }
    for (w, stride) in [(14, [1, 1]), (7, [1, 1]), (28, [2, 2]), (9, [1, 2])] {
        let g = Geo { n: 1, c: 3, h: 6, w, win: [3, 3], stride, dil: [1, 1], pad: [1, 1, 1, 1] };
        let k = depthwise("dw", g, "bias_relu6");
        let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V4, &Options::default()).unwrap();
        assert_eq!(m.notes[0], "depthwise window (avx2+fma, avx-512 border masks)", "{g:?}");
        let v3 = compile_with(&classify(&[&k]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        assert_eq!(v3.notes[0], "depthwise window (avx2+fma)", "{g:?}");
    }
    // A max pool's border loads: merged under the mask into −∞.
    let g = Geo { n: 1, c: 3, h: 12, w: 17, win: [3, 3], stride: [1, 1], dil: [1, 1], pad: [1, 1, 1, 1] };
    let m = compile_with(&classify(&[&max_pool(g, "none")]), &CpuTarget::X86_64V4, &Options::default()).unwrap();
    assert_eq!(m.notes[0], "max pool window (avx2, avx-512 border masks)", "{g:?}");
}

/// Checks the depthwise convolution of `g` with `epilogue` on inputs of `seed`, within
/// `(taps + 2)` half-ulps; HardSwish: slope up to 1.5, the bound's input at most twice
/// the bound (its gate is at least ½ for positive sums), and four more roundings.
fn check_convolution(g: Geo, epilogue: &str, seed: u64) {
    let k = depthwise("dw", g, epilogue);
    let taps = (g.win[0] * g.win[1]) as f32;
    let units = if epilogue == "bias_hardswish" { 3.0 * (taps + 2.0) + 4.0 } else { taps + 2.0 };
    check(&k, &inputs(g, seed), units);
}

#[test]
fn windows_strides_padding_and_widths() {
    require_avx2_fma!();
    let mut cases = Vec::new();
    for (h, w) in [(1, 1), (5, 7), (6, 8), (9, 9), (12, 17), (7, 40), (4, 113), (3, 128)] {
        for stride in [[1, 1], [2, 2], [1, 2], [2, 1]] {
            for (win, pad) in [
                ([3, 3], [1, 1, 1, 1]),
                ([3, 3], [0, 0, 0, 0]),
                ([3, 3], [0, 1, 0, 1]),
                ([1, 3], [0, 0, 2, 1]),
                ([3, 1], [1, 1, 0, 0]),
                ([2, 2], [1, 0, 1, 0]),
            ] {
                let g = Geo { n: 1, c: 3, h, w, win, stride, dil: [1, 1], pad };
                // Skip geometries with no output (the window does not fit).
                if h + pad[0] + pad[1] < win[0] || w + pad[2] + pad[3] < win[1] {
                    continue;
                }
                cases.push(g);
            }
        }
    }
    cases.push(Geo { n: 2, c: 5, h: 11, w: 19, win: [3, 3], stride: [1, 1], dil: [2, 2], pad: [2, 2, 2, 2] });
    cases.push(Geo { n: 3, c: 2, h: 8, w: 30, win: [3, 3], stride: [2, 2], dil: [2, 1], pad: [2, 1, 1, 0] });
    for (i, g) in cases.into_iter().enumerate() {
        let [oh, ow] = g.out();
        if oh == 0 || ow == 0 || ow > 128 {
            continue;
        }
        for epilogue in ["bias_relu6", "bias_hardswish", "scale_clip", "none"] {
            check_convolution(g, epilogue, 10 + i as u64);
        }
    }
}

#[test]
fn max_pools_match_the_interpreter() {
    require_avx2_fma!();
    let mut n = 0;
    for (h, w) in [(1, 1), (5, 7), (6, 8), (12, 17), (7, 40), (4, 113), (24, 24)] {
        for stride in [[1, 1], [2, 2], [1, 2]] {
            for (win, pad) in
                [([2, 2], [0, 0, 0, 0]), ([3, 3], [1, 1, 1, 1]), ([3, 3], [0, 1, 0, 1]), ([1, 3], [0, 0, 1, 1])]
            {
                let g = Geo { n: 2, c: 3, h, w, win, stride, dil: [1, 1], pad };
                let [oh, ow] =
                    if h + pad[0] + pad[1] < win[0] || w + pad[2] + pad[3] < win[1] { [0, 0] } else { g.out() };
                if oh == 0 || ow == 0 || ow > 128 {
                    continue;
                }
                for epilogue in ["none", "bias_relu6", "bias_hardswish", "scale_clip"] {
                    let k = max_pool(g, epilogue);
                    let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
                    assert_eq!(m.notes[0], "max pool window (avx2)", "{g:?}");
                    // NaN here and there (ignored), and all of plane 1 NaN (every window
                    // empty: −∞, then the epilogue).
                    let mut x = random_f32(&[2, 3, h, w], 2.0, 40 + n).to_vec::<f32>().unwrap();
                    for i in (0..x.len()).step_by(7) {
                        x[i] = f32::NAN;
                    }
                    for v in &mut x[h * w..2 * h * w] {
                        *v = f32::NAN;
                    }
                    let ins = [
                        Tensor::from_vec(Shape::new(vec![2, 3, h, w]).unwrap(), x).unwrap(),
                        random_f32(&[3], 1.0, 41 + n),
                        random_f32(&[3], 1.0, 42 + n),
                    ];
                    n += 1;
                    let refs: Vec<&Tensor> = ins.iter().collect();
                    let want = interp::run(&k, &refs).unwrap().to_vec::<f32>().unwrap();
                    targets().iter().for_each(|cfg| check_fenced(&k, &refs, cfg));
                    for (cfg, splits) in targets().into_iter().flat_map(|c| [(c.clone(), 1), (c, 4)]) {
                        let got = run_compiled(&k, &refs, &cfg, splits).to_vec::<f32>().unwrap();
                        for i in 0..want.len() {
                            let same = got[i] == want[i] || (got[i].is_nan() && want[i].is_nan());
                            assert!(
                                same,
                                "{g:?} {epilogue} {:?} splits {splits}: [{i}] got {}, want {}",
                                cfg.target, got[i], want[i]
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(n > 100, "only {n} cases ran");
}

#[test]
fn nan_passes_the_clamps() {
    require_avx2_fma!();
    let g = Geo { n: 1, c: 2, h: 4, w: 10, win: [3, 3], stride: [1, 1], dil: [1, 1], pad: [1, 1, 1, 1] };
    let mut ins = inputs(g, 3);
    let mut x = ins[0].to_vec::<f32>().unwrap();
    x[5] = f32::NAN; // channel 0, row 0, column 5
    ins[0] = Tensor::from_vec(Shape::new(vec![1, 2, 4, 10]).unwrap(), x).unwrap();
    for epilogue in ["bias_relu6", "scale_clip"] {
        let k = depthwise("dw", g, epilogue);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = interp::run(&k, &refs).unwrap().to_vec::<f32>().unwrap();
        for cfg in targets() {
            let got = run_compiled(&k, &refs, &cfg, 1).to_vec::<f32>().unwrap();
            for i in 0..want.len() {
                assert_eq!(
                    got[i].is_nan(),
                    want[i].is_nan(),
                    "{epilogue} {:?}: element {i}: got {}, want {}",
                    cfg.target,
                    got[i],
                    want[i]
                );
            }
        }
        assert!(want.iter().filter(|v| v.is_nan()).count() >= 6, "{epilogue}: the NaN reached its window");
    }
}

/// Forms the window kernel does not take fall back (more than `MAX_TAPS` taps; one
/// output column from a window wider than a vector, a row reduction) and still compute
/// the same values.
#[test]
fn other_forms_take_another_path() {
    let too_many = Geo { n: 1, c: 2, h: 20, w: 20, win: [17, 16], stride: [1, 1], dil: [1, 1], pad: [8, 8, 8, 7] };
    assert!((too_many.win[0] * too_many.win[1]) as u64 > kiln_flow::window::MAX_TAPS);
    let row_sum = Geo { n: 1, c: 3, h: 4, w: 20, win: [1, 20], stride: [1, 1], dil: [1, 1], pad: [0, 0, 0, 0] };
    assert_eq!(row_sum.out()[1], 1);
    for (i, g) in [too_many, row_sum].into_iter().enumerate() {
        let k = depthwise("dw", g, "bias_relu6");
        assert!(kiln_flow::window::Depthwise::of(&k).is_none(), "{g:?}");
        let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        assert!(!m.notes[0].starts_with("depthwise"), "{}", m.notes[0]);
        let ins = inputs(g, 5 + i as u64);
        let refs: Vec<&Tensor> = ins.iter().collect();
        check_with(
            &k,
            &refs,
            Cmp { zero_sign: true, rtol: 1e-5 },
            &[Config { target: CpuTarget::X86_64V3, options: Options::default() }],
        );
    }
}

/// An AveragePool as `kiln_lower` lowers it: `Σ x` over the window, divided by the
/// kernel's size (`count_include_pad`, or no padding) or by the taps inside the input
/// (the per-position count the window path tabulates at compile time).
fn average_pool(dims: [usize; 4], kernel: [i64; 2], strides: [i64; 2], pads: [i64; 4], include_pad: bool) -> Kernel {
    let w = Win { kernel: &kernel, strides: &strides, dil: &[1, 1], pads: &pads, ceil: false };
    w.average_pool(&dims, include_pad).expect("lower")
}

/// Average pools take the window path (a sum, then the divisor: a constant, or a table
/// of per-position counts) and give the interpreter's bits: both add the taps in f32 in
/// the same order and divide once (a tap outside the plane adds nothing in the kernel, 0
/// in the interpreter; a sum from +0 cannot be −0, so the two agree).
#[test]
fn average_pools_are_windows_with_the_interpreters_bits() {
    require_avx2_fma!();
    let mut n = 0;
    for (dims, kernel, strides, pads) in [
        ([1, 3, 35, 35], [3, 3], [1, 1], [1, 1, 1, 1]),
        ([2, 2, 17, 17], [3, 3], [1, 1], [1, 1, 1, 1]),
        ([1, 4, 13, 21], [3, 3], [2, 2], [1, 1, 1, 1]),
        ([1, 2, 9, 30], [3, 3], [1, 2], [0, 1, 0, 1]),
        ([1, 3, 8, 8], [2, 2], [2, 2], [0, 0, 0, 0]),
        ([1, 2, 12, 40], [3, 1], [1, 1], [1, 1, 0, 0]),
        ([1, 2, 5, 7], [3, 3], [1, 1], [2, 2, 2, 2]),
    ] {
        for include_pad in [false, true] {
            let k = average_pool(dims, kernel, strides, pads, include_pad);
            let x = random_f32(&dims, 2.0, 90 + n);
            n += 1;
            let padded = pads.iter().any(|&p| p > 0);
            let what =
                format!("{dims:?} kernel {kernel:?} strides {strides:?} pads {pads:?} include_pad {include_pad}");
            check_exact(&k, &x, Some("average pool window"), &what);
            // The per-position divisor is what the window path tabulates: with padding
            // and without count_include_pad the window's own count varies.
            let d = kiln_flow::window::Depthwise::of(&k).expect("a window");
            let tabulated = d
                .epilogue
                .iter()
                .any(|s| matches!(s, kiln_flow::window::Step::Div(kiln_flow::window::StepOperand::Position(_))));
            assert_eq!(
                tabulated,
                padded && !include_pad,
                "{dims:?} {pads:?} include_pad {include_pad}: {:?}",
                d.epilogue
            );
        }
    }
}

/// Windows past the old limits: 5×5 and 7×7, 1-D rows of up to 31 taps and columns of
/// 31, strides 3 and 4 (columns gathered) and asymmetric ones, dilations to 3, rows
/// wider than 16 vectors (the interior groups of a row run as a loop), and more taps
/// than registers hold (each tap broadcast where it is used). Same bound as
/// [`windows_strides_padding_and_widths`]: `(taps + 2)` half-ulps of `S` (the error of
/// an f32 sum of `taps` products is at most `taps` roundings of the sum of |terms|,
/// and the bias and clamps add two); HardSwish `3·(taps + 2) + 4`.
#[test]
fn large_windows_any_stride_and_wide_rows() {
    require_avx2_fma!();
    let cases = [
        Geo { n: 1, c: 3, h: 12, w: 17, win: [5, 5], stride: [1, 1], dil: [1, 1], pad: [2, 2, 2, 2] },
        Geo { n: 1, c: 2, h: 11, w: 40, win: [5, 5], stride: [2, 2], dil: [1, 1], pad: [2, 2, 2, 2] },
        Geo { n: 2, c: 2, h: 9, w: 23, win: [7, 7], stride: [1, 1], dil: [1, 1], pad: [3, 3, 3, 3] },
        Geo { n: 1, c: 2, h: 14, w: 14, win: [7, 7], stride: [2, 2], dil: [1, 1], pad: [3, 2, 3, 2] },
        Geo { n: 1, c: 2, h: 1, w: 70, win: [1, 31], stride: [1, 1], dil: [1, 1], pad: [0, 0, 15, 15] },
        Geo { n: 1, c: 2, h: 40, w: 3, win: [31, 1], stride: [1, 1], dil: [1, 1], pad: [15, 15, 0, 0] },
        Geo { n: 1, c: 3, h: 13, w: 29, win: [3, 3], stride: [3, 3], dil: [1, 1], pad: [1, 1, 1, 1] },
        Geo { n: 1, c: 2, h: 9, w: 61, win: [3, 5], stride: [1, 4], dil: [1, 1], pad: [1, 1, 2, 2] },
        Geo { n: 1, c: 2, h: 17, w: 20, win: [5, 3], stride: [3, 1], dil: [1, 1], pad: [2, 2, 1, 1] },
        Geo { n: 1, c: 2, h: 10, w: 33, win: [5, 5], stride: [2, 1], dil: [1, 1], pad: [2, 2, 2, 2] },
        Geo { n: 1, c: 2, h: 10, w: 33, win: [5, 5], stride: [1, 2], dil: [1, 1], pad: [2, 2, 2, 2] },
        Geo { n: 1, c: 2, h: 15, w: 30, win: [3, 5], stride: [1, 1], dil: [3, 2], pad: [3, 3, 4, 4] },
        Geo { n: 1, c: 2, h: 12, w: 26, win: [4, 4], stride: [1, 3], dil: [2, 3], pad: [0, 3, 5, 0] },
        // Wide rows: 160 and 300 columns (the interior in a loop), at strides 1 and 2.
        Geo { n: 1, c: 2, h: 4, w: 160, win: [3, 3], stride: [1, 1], dil: [1, 1], pad: [1, 1, 1, 1] },
        Geo { n: 1, c: 2, h: 5, w: 320, win: [3, 3], stride: [2, 2], dil: [1, 1], pad: [1, 1, 1, 1] },
        Geo { n: 1, c: 2, h: 4, w: 300, win: [5, 5], stride: [1, 1], dil: [1, 1], pad: [2, 2, 2, 2] },
        Geo { n: 1, c: 1, h: 3, w: 250, win: [3, 3], stride: [1, 3], dil: [1, 1], pad: [1, 1, 1, 1] },
        // Unpadded, the window inside the plane.
        Geo { n: 1, c: 2, h: 12, w: 150, win: [5, 5], stride: [1, 1], dil: [1, 1], pad: [0, 0, 0, 0] },
    ];
    for (i, g) in cases.into_iter().enumerate() {
        for epilogue in ["bias_relu6", "bias_hardswish", "none"] {
            check_convolution(g, epilogue, 200 + i as u64);
        }
    }
}

/// 1-D depthwise convolutions (`Conv` over `[N, C, L]`, as lowered, bias included) are
/// windows along one row: 9, 20 and 31 taps, padded or not, strides 1 to 3, dilation
/// 2; and a `[K, 1]` window over a one-column plane (FSMN's memory blocks) is the same
/// row. Bound: `(taps + 2)` half-ulps of `S`, as above (the bias is one rounding).
#[test]
fn one_dimensional_windows_are_rows() {
    require_avx2_fma!();
    use kiln_ir::{Attr, Attrs, OpKind};
    let mut n = 0;
    for (c, l, k, stride, dil, pads) in [
        (4, 80, 9, 1, 1, [4, 4]),
        (3, 119, 20, 1, 1, [0, 0]),
        (3, 100, 20, 1, 1, [19, 0]),
        (2, 200, 31, 1, 1, [15, 15]),
        (2, 90, 31, 2, 1, [15, 15]),
        (2, 77, 7, 3, 2, [6, 6]),
    ] {
        for two_d in [false, true] {
            // 1-D over [N, C, L], or 2-D over a one-column plane [N, C, L, 1].
            let mut a = Attrs::new();
            a.set("group", Attr::Int(c as i64));
            let xd = if two_d {
                a.set("strides", Attr::Ints(vec![stride, 1]));
                a.set("dilations", Attr::Ints(vec![dil, 1]));
                a.set("pads", Attr::Ints(vec![pads[0], 0, pads[1], 0]));
                vec![1, c, l, 1]
            } else {
                a.set("strides", Attr::Ints(vec![stride]));
                a.set("dilations", Attr::Ints(vec![dil]));
                a.set("pads", Attr::Ints(pads.to_vec()));
                vec![1, c, l]
            };
            let wd = if two_d { vec![c, 1, k, 1] } else { vec![c, 1, k] };
            let kern = lower_one(OpKind::Conv, &a, &[f32_type(&xd), f32_type(&wd), f32_type(&[c])]).expect("lower");
            let d = kiln_flow::window::Depthwise::of(&kern).expect("a window");
            assert_eq!((d.in_dims[2], d.in_dims[3], d.window), (1, l as u64, [1, k as u64]), "{xd:?} {wd:?}");
            let ins = [random_f32(&xd, 2.0, 300 + n), random_f32(&wd, 1.0, 301 + n), random_f32(&[c], 1.0, 302 + n)];
            n += 3;
            check(&kern, &ins, k as f32 + 2.0);
        }
    }
}

/// Max pools of any window as lowered (MaxPool: NaN ignored, −∞ padding), exactly the
/// interpreter's values: YOLO's SPPF windows (5×5, 9×9, 13×13 at stride 1, padded to
/// the same size) whose output rows share their window rows' maxima, ceil mode (2×2 at
/// stride 2 over odd and wide planes: U²-Net), strides 3 and (2, 1), dilation 2, 1-D
/// pools; NaN here and there and one plane all NaN.
#[test]
fn max_pools_of_any_window() {
    require_avx2_fma!();
    for (n, (dims, kernel, strides, dil, pads, ceil)) in [
        (vec![1, 3, 13, 13], vec![5, 5], vec![1, 1], vec![1, 1], vec![2, 2, 2, 2], false),
        (vec![1, 3, 13, 13], vec![9, 9], vec![1, 1], vec![1, 1], vec![4, 4, 4, 4], false),
        (vec![1, 2, 13, 13], vec![13, 13], vec![1, 1], vec![1, 1], vec![6, 6, 6, 6], false),
        (vec![1, 2, 20, 20], vec![13, 13], vec![1, 1], vec![1, 1], vec![6, 6, 6, 6], false),
        (vec![2, 2, 23, 37], vec![2, 2], vec![2, 2], vec![1, 1], vec![0, 0, 0, 0], true),
        (vec![1, 2, 9, 641], vec![2, 2], vec![2, 2], vec![1, 1], vec![0, 0, 0, 0], true),
        (vec![1, 2, 11, 160], vec![3, 3], vec![2, 2], vec![1, 1], vec![1, 1, 1, 1], true),
        (vec![1, 2, 16, 45], vec![3, 3], vec![3, 3], vec![1, 1], vec![1, 1, 1, 1], true),
        (vec![1, 2, 15, 30], vec![3, 5], vec![2, 1], vec![2, 1], vec![2, 2, 1, 3], false),
        (vec![1, 3, 50], vec![7], vec![2], vec![1], vec![3, 3], true),
    ]
    .into_iter()
    .enumerate()
    {
        let w = Win { kernel: &kernel, strides: &strides, dil: &dil, pads: &pads, ceil };
        let k = w.max_pool(&dims).expect("lower");
        let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        assert_eq!(m.notes[0], "max pool window (avx2)", "{dims:?} {kernel:?}");
        let numel: usize = dims.iter().product();
        let plane: usize = dims[2..].iter().product();
        let mut x = random_f32(&dims, 2.0, 500 + n as u64).to_vec::<f32>().unwrap();
        for i in (0..numel).step_by(11) {
            x[i] = f32::NAN;
        }
        for v in &mut x[plane..2 * plane] {
            *v = f32::NAN;
        }
        let x = Tensor::from_vec(Shape::new(dims.clone()).unwrap(), x).unwrap();
        check_exact(&k, &x, None, &format!("{dims:?} kernel {kernel:?} strides {strides:?} pads {pads:?} ceil {ceil}"));
    }
}

/// Average pools past the old limits, as lowered, with the interpreter's bits (the
/// same f32 sums in the same order, one division): 5×5 and 7×7 windows, ceil mode,
/// padding with and without `count_include_pad`, stride 3, wide rows.
#[test]
fn average_pools_of_any_window() {
    require_avx2_fma!();
    let mut n = 0;
    for (dims, kernel, strides, pads, ceil) in [
        ([1, 2, 13, 13], [5, 5], [1, 1], [2, 2, 2, 2], false),
        ([1, 2, 15, 17], [7, 7], [2, 2], [3, 3, 3, 3], true),
        ([1, 2, 16, 45], [3, 3], [3, 3], [1, 1, 1, 1], true),
        ([1, 2, 7, 600], [3, 3], [1, 1], [1, 1, 1, 1], false),
        ([1, 2, 9, 31], [2, 2], [2, 2], [0, 0, 0, 0], true),
    ] {
        for include_pad in [false, true] {
            let w = Win { kernel: &kernel, strides: &strides, dil: &[1, 1], pads: &pads, ceil };
            let k = w.average_pool(&dims, include_pad).expect("lower");
            let x = random_f32(&dims, 2.0, 600 + n);
            n += 1;
            let what = format!(
                "{dims:?} kernel {kernel:?} strides {strides:?} pads {pads:?} ceil {ceil} include_pad {include_pad}"
            );
            check_exact(&k, &x, Some("average pool window"), &what);
        }
    }
}
