//! Depthwise windows and max pools (`cpu::depthwise`, AVX2+FMA) against the kernel
//! interpreter:
//! padded and unpadded, symmetric and one-sided padding, strides 1 and 2, dilation 2,
//! windows 3×3, 1×3, 3×1, 2×2, output widths from 1 to 113 (one vector, masked tails,
//! several register groups), several batches; epilogues of bias, per-channel scale,
//! Relu6 as compare-and-select, `max`/`min` clamps and HardSwish (the value times a
//! clamped chain of itself); NaN through the clamps;
//! workgroup splits and writes outside the output (`run_compiled`).
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
use kiln_flow::{interp, BinaryOp, Bounds, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn tt(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

/// One depthwise convolution's geometry.
#[derive(Clone, Copy, Debug)]
struct Geo {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    win: [usize; 2],
    stride: [usize; 2],
    dil: [usize; 2],
    /// Leading and trailing padding per axis: `[top, bottom, left, right]`.
    pad: [usize; 4],
}

impl Geo {
    fn out(&self) -> [usize; 2] {
        let oh = (self.h + self.pad[0] + self.pad[1] - self.dil[0] * (self.win[0] - 1) - 1) / self.stride[0] + 1;
        let ow = (self.w + self.pad[2] + self.pad[3] - self.dil[1] * (self.win[1] - 1) - 1) / self.stride[1] + 1;
        [oh, ow]
    }
}

/// A depthwise convolution over `g`; `epilogue` as in [`epilogue_of`] ("none" for none).
fn depthwise(g: Geo, epilogue: &str) -> Kernel {
    let [oh, ow] = g.out();
    let ins = vec![tt(&[g.n, g.c, g.h, g.w]), tt(&[g.c, 1, g.win[0], g.win[1]]), tt(&[g.c]), tt(&[g.c])];
    let mut b = KernelBuilder::new("dw", ins, tt(&[g.n, g.c, oh, ow]));
    let o = b.out_index();
    let grp = b.new_var(1);
    let (y, x) = (b.new_var(g.win[0] as u64), b.new_var(g.win[1] as u64));
    let (gv, yv, xv) = (b.var(grp), b.var(y), b.var(x));
    let ih = window_index(&mut b, g, o[2], yv, 0);
    let iw = window_index(&mut b, g, o[3], xv, 1);
    let chan = b.add(o[1], gv);
    let padded = g.pad.iter().any(|&p| p > 0);
    let bounds = if padded { Bounds::Pad(0) } else { Bounds::InBounds };
    let xin = b.load_with(0, vec![o[0], chan, ih, iw], bounds);
    let wt = b.load(1, vec![o[1], gv, yv, xv]);
    let p = b.mul(xin, wt);
    let s = b.reduce(ReduceOp::Sum, vec![grp, y, x], p);
    let r = epilogue_of(&mut b, s, o[1], 2, epilogue);
    b.finish(r).unwrap()
}

/// Input row (`d` = 0) or column (`d` = 1) of output position `out`, window tap `t`.
fn window_index(b: &mut KernelBuilder, g: Geo, out: ExprId, t: ExprId, d: usize) -> ExprId {
    let s = b.index(g.stride[d] as i64);
    let dl = b.index(g.dil[d] as i64);
    let p = b.index(-(g.pad[2 * d] as i64));
    let os = b.mul(out, s);
    let td = b.mul(t, dl);
    let i = b.add(os, td);
    b.add(i, p)
}

/// `epilogue` applied to `s`, with per-channel bias (input `bias_at`) and scale (the
/// next input): "bias_relu6" (bias add, then Relu6 as two compare-and-selects),
/// "bias_hardswish" (bias add, then HardSwish: the value times a chain of itself),
/// "scale_clip" (scale and bias, `max(−1, ·)`, `min(·, 2)`), anything else: `s`.
fn epilogue_of(b: &mut KernelBuilder, s: ExprId, channel: ExprId, bias_at: usize, epilogue: &str) -> ExprId {
    let f = ScalarType::F32;
    let bias = b.load(bias_at, vec![channel]);
    match epilogue {
        "bias_relu6" => {
            let v = b.add(s, bias);
            relu6(b, v)
        }
        "bias_hardswish" => {
            // As lowered: v · min(max(v / 6 + 0.5, 0), 1), v = s + bias.
            let v = b.add(s, bias);
            let six = b.float(f, 6.0);
            let half = b.float(f, 0.5);
            let zero = b.float(f, 0.0);
            let one = b.float(f, 1.0);
            let g = b.div(v, six);
            let g = b.add(g, half);
            let g = b.binary(BinaryOp::Max, g, zero);
            let g = b.binary(BinaryOp::Min, g, one);
            b.mul(v, g)
        }
        "scale_clip" => {
            let scale = b.load(bias_at + 1, vec![channel]);
            let v = b.mul(s, scale);
            let v = b.add(bias, v);
            let lo = b.float(f, -1.0);
            let hi = b.float(f, 2.0);
            let v = b.binary(BinaryOp::Max, v, lo);
            b.binary(BinaryOp::Min, v, hi)
        }
        _ => s,
    }
}

/// A max pool as the lowering writes it: `max over the window of select(isnan(x), −∞,
/// x)`, −∞ outside the plane; `epilogue` as for [`depthwise`] ([`epilogue_of`]).
fn max_pool(g: Geo, epilogue: &str) -> Kernel {
    let [oh, ow] = g.out();
    let f = ScalarType::F32;
    let ins = vec![tt(&[g.n, g.c, g.h, g.w]), tt(&[g.c]), tt(&[g.c])];
    let mut b = KernelBuilder::new("maxpool", ins, tt(&[g.n, g.c, oh, ow]));
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

fn abs(t: &Tensor) -> Tensor {
    let v: Vec<f32> = t.to_vec::<f32>().unwrap().iter().map(|x| x.abs()).collect();
    Tensor::from_vec(t.shape().clone(), v).unwrap()
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

/// On x86-64-v4, convolutions whose rows have border vectors take their border taps
/// under opmasks (at stride 1 and 2), and say so.
#[test]
fn border_taps_under_opmasks() {
    if targets().len() < 2 {
        return;
    }
    for (w, stride) in [(14, [1, 1]), (7, [1, 1]), (28, [2, 2]), (9, [1, 2])] {
        let g = Geo { n: 1, c: 3, h: 6, w, win: [3, 3], stride, dil: [1, 1], pad: [1, 1, 1, 1] };
        let k = depthwise(g, "bias_relu6");
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
            let k = depthwise(g, epilogue);
            let taps = (g.win[0] * g.win[1]) as f32;
            // HardSwish: slope up to 1.5, the bound's input at most twice the bound (its
            // gate is at least ½ for positive sums), and four more roundings.
            let units = if epilogue == "bias_hardswish" { 3.0 * (taps + 2.0) + 4.0 } else { taps + 2.0 };
            check(&k, &inputs(g, 10 + i as u64), units);
        }
    }
}

#[test]
fn max_pools_match_the_interpreter() {
    require_avx2_fma!();
    let mut n = 0;
    for (h, w) in [(1, 1), (5, 7), (6, 8), (12, 17), (7, 40), (4, 113), (24, 24)] {
        for stride in [[1, 1], [2, 2], [1, 2]] {
            for (win, pad) in [([2, 2], [0, 0, 0, 0]), ([3, 3], [1, 1, 1, 1]), ([3, 3], [0, 1, 0, 1]), ([1, 3], [0, 0, 1, 1])] {
                let g = Geo { n: 2, c: 3, h, w, win, stride, dil: [1, 1], pad };
                let [oh, ow] = if h + pad[0] + pad[1] < win[0] || w + pad[2] + pad[3] < win[1] { [0, 0] } else { g.out() };
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
        let k = depthwise(g, epilogue);
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

/// Forms the depthwise kernel does not take fall back (an epilogue that is not a chain
/// of supported steps, more than 9 taps) and still compute the same values.
#[test]
fn other_forms_take_another_path() {
    let g = Geo { n: 1, c: 2, h: 9, w: 9, win: [5, 5], stride: [1, 1], dil: [1, 1], pad: [2, 2, 2, 2] };
    let k = depthwise(g, "bias_relu6");
    let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
    assert!(!m.notes[0].starts_with("depthwise"), "{}", m.notes[0]);
    let ins = inputs(g, 5);
    let refs: Vec<&Tensor> = ins.iter().collect();
    check_with(
        &k,
        &refs,
        Cmp { zero_sign: true, rtol: 1e-5 },
        &[Config { target: CpuTarget::X86_64V3, options: Options::default() }],
    );
}

/// An AveragePool as `kiln_lower` lowers it: `Σ x` over the window, divided by the
/// kernel's size (`count_include_pad`, or no padding) or by the taps inside the input
/// (the per-position count the window path tabulates at compile time).
fn average_pool(dims: [usize; 4], kernel: [i64; 2], strides: [i64; 2], pads: [i64; 4], include_pad: bool) -> Kernel {
    use kiln_ir::infer::{infer, InferInput};
    use kiln_ir::{Attr, Attrs, Op, OpKind};
    use kiln_lower::{lower_op, OpCx, OpInput};
    let mut a = Attrs::new();
    a.set("kernel_shape", Attr::Ints(kernel.to_vec()));
    a.set("strides", Attr::Ints(strides.to_vec()));
    a.set("pads", Attr::Ints(pads.to_vec()));
    a.set("count_include_pad", Attr::Int(include_pad as i64));
    let op = Op::parse(OpKind::AveragePool, &a).unwrap();
    let x = tt(&dims);
    let out = infer(&op, &[Some(InferInput { ty: &x, value: None })], 1).expect("infer");
    let ins = [Some(OpInput { ty: &x, value: None })];
    let cx = OpCx { op: &op, name: "avg", inputs: &ins, outputs: &out };
    let mut l = lower_op(&cx).expect("lower AveragePool");
    assert_eq!(l.steps.len(), 1);
    l.steps.remove(0).kernel
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
            let want = interp::run(&k, &[&x]).unwrap();
            let padded = pads.iter().any(|&p| p > 0);
            for cfg in targets() {
                let m = compile_with(&classify(&[&k]), &cfg.target, &Options::default()).unwrap();
                assert!(m.notes[0].starts_with("average pool window"), "{dims:?} {pads:?} {cfg:?}: {}", m.notes[0]);
                for splits in [1, 3] {
                    let got = run_compiled(&k, &[&x], &cfg, splits);
                    if let Err(e) = compare(&got, &want, EXACT) {
                        panic!("{dims:?} kernel {kernel:?} strides {strides:?} pads {pads:?} include_pad {include_pad} {cfg:?} splits {splits}: {e}");
                    }
                }
            }
            // The per-position divisor is what the window path tabulates: with padding
            // and without count_include_pad the window's own count varies.
            let d = kiln_flow::window::Depthwise::of(&k).expect("a window");
            let tabulated = d.epilogue.iter().any(|s| {
                matches!(s, kiln_flow::window::Step::Div(kiln_flow::window::StepOperand::Position(_)))
            });
            assert_eq!(tabulated, padded && !include_pad, "{dims:?} {pads:?} include_pad {include_pad}: {:?}", d.epilogue);
        }
    }
}
