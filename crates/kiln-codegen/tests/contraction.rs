//! Contraction microkernels (AVX2+FMA, `cpu::gemm`) against the kernel interpreter:
//! odd M, N, K; batched and broadcast operands; transposed left operands; fused
//! epilogues (bias per column and per row, Relu as compare-and-select, Clip, residual
//! add, Neg/Abs/Sqrt, GELU and sigmoid through inline erf/exp); NaN propagation; workgroup splits; writes outside the output.
//!
//! The microkernel sums in f32 with one FMA per term; the interpreter sums in f64 and
//! rounds once. Each element must lie within `(K + 2)·2⁻²⁴·S` of the interpreter,
//! where `S` is the same kernel evaluated on the absolute values of the inputs (a
//! bound on the sum of |terms| plus the epilogue's magnitude).

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
use kiln_flow::program::{Buffer, BufferId, BufferKind, Dispatch, FlowProgram};
use kiln_flow::{interp, BinaryOp, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp, VarId};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn tt(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

/// Every microkernel variant this machine can run: AVX2 (x86-64-v3) tiles, and
/// 512-bit tiles (x86-64-v4) where the CPU has AVX-512 F.
fn variants() -> Vec<Config> {
    microkernel_variants(false)
}

/// `k` with its operands packed the way `cfg`'s microkernels read constants
/// (`kiln_flow::layout::pack_constants`, every input taken as a constant), and the
/// packed inputs; `None` when nothing is packed.
fn packed(k: &Kernel, inputs: &[&Tensor], cfg: &Config) -> Option<(Kernel, Vec<Tensor>)> {
    let buffer = |ty: TensorType, kind| Buffer { ty, name: "x".into(), kind };
    let mut buffers: Vec<Buffer> =
        inputs.iter().map(|t| buffer(t.ty().clone(), BufferKind::Const((*t).clone()))).collect();
    buffers.push(buffer(k.output.clone(), BufferKind::Result));
    let n = inputs.len() as u32;
    let mut p = FlowProgram {
        extents: Vec::new(),
        name: "p".into(),
        buffers,
        dispatches: vec![Dispatch::new(k.clone(), (0..n).map(BufferId).collect(), BufferId(n), vec![])],
        inputs: vec![],
        outputs: vec![BufferId(n)],
    };
    if pack_for(&mut p, cfg) == 0 {
        return None;
    }
    Some(first_dispatch(&p, None))
}

/// Runs `k` as a microkernel (asserting it took that path) in 1 and 3 splits, as it is
/// and with its operands packed into panels as constants would be, and compares with
/// the interpreter within the bound of the module docs.
fn check_micro(k: &Kernel, inputs: &[&Tensor], kk: usize) {
    let want = interp::run(k, inputs).unwrap();
    let absin: Vec<Tensor> = inputs.iter().map(|t| abs(t)).collect();
    let bound = interp::run(k, &absin.iter().collect::<Vec<_>>()).unwrap().to_vec::<f32>().unwrap();
    let w = want.to_vec::<f32>().unwrap();
    for cfg in variants() {
        let packed = packed(k, inputs, &cfg);
        let mut runs: Vec<(&Kernel, Vec<&Tensor>, &str)> = vec![(k, inputs.to_vec(), "")];
        if let Some((pk, pin)) = &packed {
            // The packed kernel is the same function of the original inputs.
            assert_eq!(interp::run(pk, &pin.iter().collect::<Vec<_>>()).unwrap(), want, "{}: packing", k.name);
            runs.push((pk, pin.iter().collect(), " (packed)"));
        }
        for (k, inputs, how) in runs {
            let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
            // (Depthwise convolutions of at most 9 taps take `cpu::depthwise`, tested in
            // `tests/depthwise.rs`; they are checked here the same way.)
            let taken = m.notes[0].starts_with("contraction") || m.notes[0].starts_with("depthwise");
            assert!(taken, "{}{how}: {}", k.name, m.notes[0]);
            for splits in [1, 3] {
                let got = run_compiled(k, &inputs, &cfg, splits).to_vec::<f32>().unwrap();
                for i in 0..w.len() {
                    let tol = (kk as f32 + 2.0) * f32::EPSILON / 2.0 * bound[i].abs() + 1e-30;
                    let ok = (got[i] - w[i]).abs() <= tol || (got[i].is_nan() && w[i].is_nan());
                    assert!(
                        ok,
                        "{}{how} {:?} splits {splits}: element {i}: got {}, want {} (tol {tol})",
                        k.name, cfg.target, got[i], w[i]
                    );
                }
            }
        }
    }
}

/// `out[b.., m, n] = Σ_k A · B` with A `[b.., m, k]` (or `[k, m]` transposed) and B
/// `[k, n]` shared by every batch (or `[b.., k, n]`).
fn matmul(batch: &[usize], m: usize, kk: usize, n: usize, a_t: bool, b_batched: bool) -> Kernel {
    let mut adims = batch.to_vec();
    adims.extend(if a_t { [kk, m] } else { [m, kk] });
    let mut bdims = if b_batched { batch.to_vec() } else { vec![] };
    bdims.extend([kk, n]);
    let mut odims = batch.to_vec();
    odims.extend([m, n]);
    let mut b = KernelBuilder::new("mm", vec![tt(&adims), tt(&bdims)], tt(&odims));
    let o = b.out_index();
    let r = batch.len();
    let kv = b.new_var(kk as u64);
    let k = b.var(kv);
    let mut ai: Vec<_> = o[..r].to_vec();
    ai.extend(if a_t { [k, o[r]] } else { [o[r], k] });
    let mut bi: Vec<_> = if b_batched { o[..r].to_vec() } else { vec![] };
    bi.extend([k, o[r + 1]]);
    let x = b.load(0, ai);
    let y = b.load(1, bi);
    let p = b.mul(x, y);
    let s = b.reduce(ReduceOp::Sum, vec![kv], p);
    b.finish(s).unwrap()
}

#[test]
fn odd_shapes() {
    require_avx2_fma!(", so no contraction microkernel can run here");
    for &m in &[1, 2, 5, 6, 7, 13] {
        for &n in &[1, 7, 8, 9, 16, 17, 40, 63, 64, 100, 130] {
            // 1 and 3 reduction steps are unrolled in 256-bit tiles, 7 and more loop.
            for &k in &[1, 3, 7, 17, 63] {
                let a = random_f32(&[m, k], 1.0, (m * 1000 + n * 10 + k) as u64);
                let b = random_f32(&[k, n], 1.0, (m * 7 + n * 100 + k) as u64);
                check_micro(&matmul(&[], m, k, n, false, false), &[&a, &b], k);
            }
        }
    }
}

/// Where the CPU has AVX-512 F, x86-64-v4 takes 512-bit tiles for products of at
/// least 16 columns (64 a tile, then the whole vectors of 16 left; 256-bit tiles for
/// the last 1 to 15 columns and narrower products).
#[test]
fn wide_tiles_where_the_target_has_them() {
    if !std::is_x86_feature_detected!("avx512f") {
        eprintln!("skipped: this CPU lacks AVX-512 F");
        return;
    }
    let wide = |m, k, n| {
        let kern = matmul(&[], m, k, n, false, false);
        compile_with(&classify(&[&kern]), &CpuTarget::X86_64V4, &Options::default()).unwrap().notes[0].clone()
    };
    assert_eq!(wide(13, 70, 130), "contraction microkernel (avx-512)");
    assert_eq!(wide(6, 1024, 1024), "contraction microkernel (avx-512)");
    assert_eq!(wide(13, 70, 40), "contraction microkernel (avx-512)");
    assert_eq!(wide(13, 70, 15), "contraction microkernel (avx2+fma)");
    let kern = matmul(&[], 13, 70, 130, false, false);
    let v3 = compile_with(&classify(&[&kern]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
    assert_eq!(v3.notes[0], "contraction microkernel (avx2+fma)");
}

#[test]
fn batched_broadcast_and_transposed() {
    require_avx2_fma!();
    for (batch, m, k, n) in [(vec![3], 7, 17, 20), (vec![2, 3], 6, 9, 8), (vec![2], 13, 130, 33)] {
        for a_t in [false, true] {
            for b_batched in [false, true] {
                let mut ad = batch.clone();
                ad.extend(if a_t { [k, m] } else { [m, k] });
                let mut bd = if b_batched { batch.clone() } else { vec![] };
                bd.extend([k, n]);
                let a = random_f32(&ad, 1.0, 5);
                let b = random_f32(&bd, 1.0, 6);
                check_micro(&matmul(&batch, m, k, n, a_t, b_batched), &[&a, &b], k);
            }
        }
    }
}

/// Gemm-style kernels with epilogues.
fn with_epilogue(m: usize, kk: usize, n: usize, which: &str) -> Kernel {
    let f = ScalarType::F32;
    let ins = vec![tt(&[m, kk]), tt(&[kk, n]), tt(&[n]), tt(&[m, 1]), tt(&[m, n])];
    let mut b = KernelBuilder::new(which, ins, tt(&[m, n]));
    let (o, s) = b.matmul_sum(kk);
    let bias = b.load(2, vec![o[1]]);
    let zero_idx = b.index(0);
    let row = b.load(3, vec![o[0], zero_idx]);
    let res = b.load(4, vec![o[0], o[1]]);
    let zero = b.float(f, 0.0);
    let r = match which {
        "bias_relu" => {
            let v = b.add(s, bias);
            let lt = b.binary(BinaryOp::Lt, v, zero);
            b.select(lt, zero, v)
        }
        "clip_row_scale" => {
            let v = b.mul(s, row);
            let lo = b.float(f, -0.5);
            let hi = b.float(f, 0.75);
            let v = b.binary(BinaryOp::Max, v, lo);
            b.binary(BinaryOp::Min, v, hi)
        }
        "residual_max" => {
            let v = b.add(s, bias);
            let v = b.sub(v, res);
            b.binary(BinaryOp::Max, v, res)
        }
        "neg_abs_sqrt" => {
            let v = b.unary(UnaryOp::Neg, s);
            let v = b.unary(UnaryOp::Abs, v);
            let v = b.unary(UnaryOp::Sqrt, v);
            b.div(v, bias)
        }
        "gelu" => {
            // As exported, of v = s + bias.
            let v = b.add(s, bias);
            gelu(&mut b, v)
        }
        "swish_row_residual" => {
            // v·sigmoid(v) with v = s·row (a per-row broadcast), then max with the
            // residual (both operands vary: NaN-propagating) and a clamp below at −0.25.
            let v = b.mul(s, row);
            let sig = sigmoid(&mut b, v);
            let w = b.mul(v, sig);
            let w = b.binary(BinaryOp::Max, w, res);
            let lo = b.float(f, -0.25);
            let lt = b.binary(BinaryOp::Lt, w, lo);
            b.select(lt, lo, w)
        }
        "sigmoid" => {
            let v = b.add(s, bias);
            sigmoid(&mut b, v)
        }
        "many_live" => {
            // Ten scalings of the sum by powers of two (exact), all live at once: the
            // maximum over them is taken first, then their minimum, and the difference.
            let t: Vec<ExprId> = (0..10)
                .map(|i| {
                    let c = b.float(f, f64::from(1u32 << i) / 8.0);
                    b.mul(s, c)
                })
                .collect();
            let hi = t[1..].iter().fold(t[0], |m, &x| b.binary(BinaryOp::Max, m, x));
            let lo = t[1..].iter().fold(t[0], |m, &x| b.binary(BinaryOp::Min, m, x));
            b.sub(hi, lo)
        }
        "in_band" => {
            // s·row where it lies strictly between −0.5 and 0.75, else 0: an And of two
            // Bools, which has no 16-lane form (the epilogue runs 8 lanes at a time).
            let v = b.mul(s, row);
            let lo = b.float(f, -0.5);
            let hi = b.float(f, 0.75);
            let above = b.binary(BinaryOp::Gt, v, lo);
            let below = b.binary(BinaryOp::Lt, v, hi);
            let both = b.binary(BinaryOp::And, above, below);
            b.select(both, v, zero)
        }
        "five_live" => {
            // Eight values, five registers live at once (three scalings of the sum by
            // powers of two, exact, and the NaN-propagating max's two temporaries):
            // short enough to be evaluated in place, more than a 6×16 tile leaves.
            let t: Vec<ExprId> = [0.5, 2.0, 4.0]
                .iter()
                .map(|&c| {
                    let c = b.float(f, c);
                    b.mul(s, c)
                })
                .collect();
            let m = b.binary(BinaryOp::Max, t[1], t[2]);
            b.add(t[0], m)
        }
        _ => unreachable!(),
    };
    b.finish(r).unwrap()
}

/// `1 / (1 + exp(−v))`, as exported.
fn sigmoid(b: &mut KernelBuilder, v: ExprId) -> ExprId {
    let n = b.unary(UnaryOp::Neg, v);
    let e = b.unary(UnaryOp::Exp, n);
    let one = b.float(ScalarType::F32, 1.0);
    let d = b.add(e, one);
    b.div(one, d)
}

/// The operands of [`with_epilogue`]'s kernels: `a` (`m × k`), `b` (`k × n`), and a
/// bias, a per-row scale and a residual, random.
fn epilogue_operands(a: &Tensor, b: &Tensor, m: usize, n: usize) -> [Tensor; 5] {
    [a.clone(), b.clone(), random_f32(&[n], 1.0, 3), random_f32(&[m, 1], 1.0, 4), random_f32(&[m, n], 1.0, 5)]
}

/// [`with_epilogue`]'s kernels `which` over [`epilogue_operands`], against the
/// interpreter ([`check_micro`]).
fn check_epilogues(a: &Tensor, b: &Tensor, (m, k, n): (usize, usize, usize), which: &[&str]) {
    let ins = epilogue_operands(a, b, m, n);
    let refs: Vec<&Tensor> = ins.iter().collect();
    for which in which {
        check_micro(&with_epilogue(m, k, n, which), &refs, k);
    }
}

/// Epilogues that need more registers than a tile leaves: ten values live at once (too
/// long to be evaluated in place at all: the row loop over the stack), and eight values
/// needing five registers (in place, where a 6×16 tile leaves four: the kernel is
/// emitted again with the epilogue over the stack). Neither is given up to the general
/// path (`check_micro` asserts the contraction path).
#[test]
fn epilogue_beyond_the_spare_registers() {
    require_avx2_fma!();
    for &(m, kk, n) in &[(6, 7, 64), (12, 17, 130), (1, 5, 70)] {
        let a = random_f32(&[m, kk], 1.0, 51);
        let b = random_f32(&[kk, n], 1.0, 52);
        check_epilogues(&a, &b, (m, kk, n), &["many_live", "five_live"]);
    }
}

/// GELU, sigmoid and swish epilogues (inline erf and exp, `cpu::math`) on 1-row, odd and
/// full-panel shapes, with values reaching both of erf's branches and exp's clamps; on
/// x86-64-v4, full 64-column tiles evaluate them sixteen lanes at a time (swish with a
/// per-row scale, a max with the residual and a clamp). Bound:
/// `L·(K + 2)·2⁻²⁴·Σ|a·b| + |bias|` for the sum (`L` the function's Lipschitz
/// constant: GELU 1.13, sigmoid 0.25, swish 1.1 times a row scale ≤ 1) plus 8 ulp of the
/// result for the approximations
/// (measured: erf ≤ 2.34 ulp, exp ≤ 0.99 ulp; `tests/math.rs`).
#[test]
fn transcendental_epilogues() {
    require_avx2_fma!();
    for (which, lip) in [("gelu", 1.13f32), ("sigmoid", 0.25), ("swish_row_residual", 1.13)] {
        for (m, k, n) in [(1, 5, 9), (1, 40, 70), (7, 33, 61), (12, 8, 16), (128, 64, 40), (9, 20, 150)] {
            // Scale 4: sums spread over [−~30, ~30] (erf saturates, exp clamps at large |v|).
            let ins = [
                random_f32(&[m, k], 4.0, 1),
                random_f32(&[k, n], 1.0, 2),
                random_f32(&[n], 3.0, 3),
                random_f32(&[m, 1], 1.0, 4),
                random_f32(&[m, n], 1.0, 5),
            ];
            let refs: Vec<&Tensor> = ins.iter().collect();
            let kern = with_epilogue(m, k, n, which);
            let want = interp::run(&kern, &refs).unwrap().to_vec::<f32>().unwrap();
            let (a, bm, bias) =
                (ins[0].to_vec::<f32>().unwrap(), ins[1].to_vec::<f32>().unwrap(), ins[2].to_vec::<f32>().unwrap());
            for (cfg, splits) in variants().into_iter().flat_map(|c| [(c.clone(), 1), (c, 3)]) {
                // As it is, and with its operands packed as constants would be.
                let packed = packed(&kern, &refs, &cfg);
                let mut runs = vec![(kern.clone(), refs.iter().map(|t| (*t).clone()).collect::<Vec<Tensor>>())];
                runs.extend(packed);
                for (kern, ins) in &runs {
                    let refs: Vec<&Tensor> = ins.iter().collect();
                    let module = compile_with(&classify(&[kern]), &cfg.target, &cfg.options).unwrap();
                    assert!(module.notes[0].starts_with("contraction"), "{which}: {}", module.notes[0]);
                    // Full 64-column tiles: from 64 columns on, past one row (a single row
                    // takes the one-row tiles), B not packed in narrower panels.
                    if cfg.target == CpuTarget::X86_64V4 && m > 1 && n >= 64 && kern.inputs[1].shape.dims()[1] == n {
                        assert!(module.notes[0].ends_with("epilogue on 16 lanes)"), "{which}: {}", module.notes[0]);
                    }
                    let got = run_compiled(kern, &refs, &cfg, splits).to_vec::<f32>().unwrap();
                    for i in 0..m {
                        for j in 0..n {
                            let sabs: f32 =
                                (0..k).map(|q| (a[i * k + q] * bm[q * n + j]).abs()).sum::<f32>() + bias[j].abs();
                            let (g, w) = (got[i * n + j], want[i * n + j]);
                            let tol = lip * (k as f32 + 2.0) * f32::EPSILON / 2.0 * sabs
                                + 8.0 * f32::EPSILON * w.abs()
                                + 1e-30;
                            assert!(
                                (g - w).abs() <= tol,
                                "{which} {m}x{k}x{n} {:?} splits {splits}: [{i},{j}] got {g}, want {w} (tol {tol})",
                                cfg.target
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn fused_epilogues() {
    require_avx2_fma!();
    for which in ["bias_relu", "clip_row_scale", "residual_max", "neg_abs_sqrt"] {
        for (m, k, n) in [(1, 5, 9), (7, 33, 61), (12, 8, 16), (11, 19, 140)] {
            let mut bias = random_f32(&[n], 1.0, 3);
            if which == "neg_abs_sqrt" {
                bias = abs(&bias);
            }
            let ins = [
                random_f32(&[m, k], 1.0, 1),
                random_f32(&[k, n], 1.0, 2),
                bias,
                random_f32(&[m, 1], 1.0, 4),
                random_f32(&[m, n], 1.0, 5),
            ];
            let refs: Vec<&Tensor> = ins.iter().collect();
            let kern = with_epilogue(m, k, n, which);
            if which == "neg_abs_sqrt" {
                // sqrt is not Lipschitz at 0: compare against the interpreter with a
                // relative tolerance instead of the sum bound.
                let want = interp::run(&kern, &refs).unwrap();
                for cfg in variants() {
                    let m = compile_with(&classify(&[&kern]), &cfg.target, &cfg.options).unwrap();
                    assert!(m.notes[0].starts_with("contraction"), "{}", m.notes[0]);
                    let got = run_compiled(&kern, &refs, &cfg, 3);
                    compare(&got, &want, Cmp { zero_sign: true, rtol: 1e-5 * k as f64 }).unwrap();
                }
            } else {
                check_micro(&kern, &refs, k);
            }
        }
    }
}

#[test]
fn nan_propagates_through_relu_and_max() {
    require_avx2_fma!();
    let (m, k, n) = (3, 4, 75);
    let mut a = random_f32(&[m, k], 1.0, 8).to_vec::<f32>().unwrap();
    a[5] = f32::NAN; // row 1
    let a = Tensor::from_vec(Shape::new(vec![m, k]).unwrap(), a).unwrap();
    let ins = epilogue_operands(&a, &random_f32(&[k, n], 1.0, 2), m, n);
    let refs: Vec<&Tensor> = ins.iter().collect();
    for which in ["bias_relu", "clip_row_scale", "residual_max"] {
        let kern = with_epilogue(m, k, n, which);
        for cfg in variants() {
            let got = run_compiled(&kern, &refs, &cfg, 1).to_vec::<f32>().unwrap();
            for (i, v) in got.iter().enumerate() {
                assert_eq!(v.is_nan(), i / n == 1, "{which} {:?}: element {i} = {v}", cfg.target);
            }
        }
    }
}

#[test]
fn general_path_without_avx2_or_when_refused() {
    // Without AVX2 the same kernel compiles through Cranelift.
    let k = matmul(&[], 5, 7, 9, false, false);
    let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V2, &Options::default()).unwrap();
    assert!(m.notes[0].starts_with("general"), "{}", m.notes[0]);
    // An epilogue with a transcendental the microkernels have no inline form of.
    let mut b = KernelBuilder::new("mm_sin", vec![tt(&[2, 3]), tt(&[3, 4])], tt(&[2, 4]));
    let (_, s) = b.matmul_sum(3);
    let e = b.unary(UnaryOp::Sin, s);
    let k = b.finish(e).unwrap();
    let m = compile_with(&classify(&[&k]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
    assert!(m.notes[0].starts_with("general (an epilogue operation"), "{}", m.notes[0]);
    let a = random_f32(&[2, 3], 1.0, 1);
    let bb = random_f32(&[3, 4], 1.0, 2);
    check_with(&k, &[&a, &bb], Cmp { zero_sign: false, rtol: 1e-6 }, &variants());
}

/// A convolution's output element once its input element `xin` is loaded: `xin` times
/// the filter (operand 1) at `[o1, c, y, x]` (`at`, the window variables' values),
/// summed over the window variables `window`, plus output channel `o1`'s bias (operand 2).
fn filtered_sum(b: &mut KernelBuilder, xin: ExprId, o1: ExprId, window: [VarId; 3], at: [ExprId; 3]) -> ExprId {
    let wt = b.load(1, vec![o1, at[0], at[1], at[2]]);
    let p = b.mul(xin, wt);
    let s = b.reduce(ReduceOp::Sum, window.to_vec(), p);
    let bias = b.load(2, vec![o1]);
    b.add(s, bias)
}

/// `Conv` 1×1 in NCHW with a per-channel bias and Relu6: rows are output channels,
/// columns the flattened `h·W + w`.
fn pointwise(n: usize, ci: usize, co: usize, h: usize, w: usize) -> Kernel {
    let ins = vec![tt(&[n, ci, h, w]), tt(&[co, ci, 1, 1]), tt(&[co])];
    let mut b = KernelBuilder::new("pw", ins, tt(&[n, co, h, w]));
    let o = b.out_index();
    let c = b.new_var(ci as u64);
    let (kh, kw) = (b.new_var(1), b.new_var(1));
    let (cv, hv, wv) = (b.var(c), b.var(kh), b.var(kw));
    let x = b.load(0, vec![o[0], cv, o[2], o[3]]);
    let v = filtered_sum(&mut b, x, o[1], [c, kh, kw], [cv, hv, wv]);
    let r = relu6(&mut b, v);
    b.finish(r).unwrap()
}

#[test]
fn pointwise_convolutions() {
    require_avx2_fma!();
    for (n, ci, co, h, w) in [(1, 8, 4, 5, 6), (2, 3, 13, 7, 7), (1, 17, 7, 1, 9), (2, 32, 16, 4, 4)] {
        let x = random_f32(&[n, ci, h, w], 4.0, 1);
        let wt = random_f32(&[co, ci, 1, 1], 2.0, 2);
        let bias = random_f32(&[co], 2.0, 3);
        check_micro(&pointwise(n, ci, co, h, w), &[&x, &wt, &bias], ci);
    }
}

/// B larger than one L2 column block: the columns run in blocks (the last one
/// narrower), every panel of the range per block; the reduction in blocks whose partial
/// sums go through the output; B packed on the stack where 32 row panels or more read
/// it (192 rows), or with twelve rows or more where its rows are a power of two apart
/// (2048 and 4096 bytes: every row in the same few L1 sets), a short last reduction
/// block (130 = 128 + 2) and a tail panel among them.
#[test]
fn column_blocks() {
    require_avx2_fma!();
    for (m, k, n) in [
        (6, 700, 200),
        (1, 1100, 97),
        (13, 300, 500),
        (24, 1024, 64),
        (16, 400, 100),
        (20, 300, 72),
        (12, 256, 1024),
        (13, 130, 512),
        (192, 200, 100),
    ] {
        let a = random_f32(&[m, k], 1.0, 21);
        let b = random_f32(&[k, n], 1.0, 22);
        check_micro(&matmul(&[], m, k, n, false, false), &[&a, &b], k);
        check_epilogues(&a, &b, (m, k, n), &["residual_max"]);
    }
}

/// A convolution over gathered columns (`[ci, kh, kw, oh, ow]`, as the layout pass writes
/// them for narrow rows) by a filter `[co, ci, kh, kw]`: its reduction `ci, kh, kw` steps
/// through both operands as through one index, so it runs as one loop level, and with B
/// over one L2 block (64 channels × 9 taps × 196 columns) and rows enough to reuse it
/// (123 output channels: 21 row panels, A over one L2 block too, so B is not cut into
/// column chunks) that level is blocked, the last block short (576 = 4 × 128 + 64);
/// with 27 output channels (A within one block) the columns are cut into chunks instead.
#[test]
fn gathered_convolutions_block_their_flattened_reduction() {
    require_avx2_fma!();
    for (ci, co, oh, ow) in [(64, 123, 14, 14), (64, 27, 14, 14), (40, 6, 7, 9), (3, 8, 10, 12)] {
        let ins = vec![tt(&[ci, 3, 3, oh, ow]), tt(&[co, ci, 3, 3]), tt(&[co])];
        let mut b = KernelBuilder::new("cols_conv", ins, tt(&[1, co, oh, ow]));
        let o = b.out_index();
        let (c, y, x) = (b.new_var(ci as u64), b.new_var(3), b.new_var(3));
        let (cv, yv, xv) = (b.var(c), b.var(y), b.var(x));
        let cols = b.load(0, vec![cv, yv, xv, o[2], o[3]]);
        let r = filtered_sum(&mut b, cols, o[1], [c, y, x], [cv, yv, xv]);
        let k = b.finish(r).unwrap();
        let inputs = [
            random_f32(&[ci, 3, 3, oh, ow], 1.0, 31),
            random_f32(&[co, ci, 3, 3], 1.0, 32),
            random_f32(&[co], 1.0, 33),
        ];
        check_micro(&k, &inputs.iter().collect::<Vec<_>>(), ci * 9);
    }
}

/// A valid (unpadded) convolution in NCHW with stride `s`, grouped by channel when
/// `depthwise` (then every output row reads its own input rows with the same weights).
#[allow(clippy::too_many_arguments)]
fn conv(n: usize, ci: usize, co: usize, h: usize, w: usize, kh: usize, kw: usize, depthwise: bool, s: usize) -> Kernel {
    let (oh, ow) = ((h - kh) / s + 1, (w - kw) / s + 1);
    let wdims = if depthwise { [co, 1, kh, kw] } else { [co, ci, kh, kw] };
    let ins = vec![tt(&[n, if depthwise { co } else { ci }, h, w]), tt(&wdims), tt(&[co])];
    let mut b = KernelBuilder::new(if depthwise { "dw" } else { "conv" }, ins, tt(&[n, co, oh, ow]));
    let o = b.out_index();
    let c = b.new_var(if depthwise { 1 } else { ci as u64 });
    let (y, x) = (b.new_var(kh as u64), b.new_var(kw as u64));
    let (cv, yv, xv) = (b.var(c), b.var(y), b.var(x));
    let sc = b.index(s as i64);
    let (ohs, ows) = (b.mul(o[2], sc), b.mul(o[3], sc));
    let ih = b.add(ohs, yv);
    let iw = b.add(ows, xv);
    let chan = if depthwise { b.add(o[1], cv) } else { cv };
    let xin = b.load(0, vec![o[0], chan, ih, iw]);
    let r = filtered_sum(&mut b, xin, o[1], [c, y, x], [cv, yv, xv]);
    b.finish(r).unwrap()
}

#[test]
fn convolutions_and_depthwise() {
    require_avx2_fma!();
    // The last three have output rows of 114, 80 and 64 columns: whole 512-bit tiles,
    // then narrower ones (3 and 1 vectors of 16) and a 256-bit tail; at stride 2 the
    // last vector of the last row ends at the input's last element.
    let shapes = [
        (1, 1, 6, 12, 12, 5, 5),
        (2, 3, 7, 9, 20, 3, 3),
        (1, 6, 16, 14, 14, 5, 5),
        (1, 4, 5, 6, 30, 1, 3),
        (1, 3, 13, 11, 39, 3, 3),
        (1, 3, 32, 5, 229, 3, 3),
        (1, 2, 12, 4, 161, 3, 3),
        (2, 3, 8, 3, 129, 3, 3),
        // Window rows of 2 and 4 steps (unrolled in 256-bit tiles, as 3 is), of 5 a loop.
        (1, 3, 8, 6, 41, 2, 4),
        (1, 2, 12, 5, 27, 4, 2),
    ];
    for ((n, ci, co, h, w, kh, kw), depthwise, s) in
        shapes.iter().flat_map(|&sh| [(sh, false, 1), (sh, true, 1), (sh, false, 2), (sh, true, 2)])
    {
        {
            let cin = if depthwise { co } else { ci };
            let x = random_f32(&[n, cin, h, w], 1.0, 31);
            let wd = if depthwise { [co, 1, kh, kw] } else { [co, ci, kh, kw] };
            let wt = random_f32(&wd, 1.0, 32);
            let bias = random_f32(&[co], 1.0, 33);
            let k = conv(n, ci, co, h, w, kh, kw, depthwise, s);
            let kk = if depthwise { kh * kw } else { ci * kh * kw };
            check_micro(&k, &[&x, &wt, &bias], kk);
            if !depthwise && (w - kw) / s + 1 >= 64 && std::is_x86_feature_detected!("avx512f") {
                // Output rows of 64 columns or more take 512-bit tiles at either stride.
                let note =
                    compile_with(&classify(&[&k]), &CpuTarget::X86_64V4, &Options::default()).unwrap().notes[0].clone();
                assert_eq!(note, "contraction microkernel (avx-512; epilogue on 16 lanes)", "{ci}×{h}×{w} stride {s}");
            }
        }
    }
}

/// A convolution whose columns step 3 or 4 input elements is a contraction (the layout
/// pass gathers it into columns in a real program), but no microkernel reads it in
/// place: left as it is, it takes the general path, says why, and computes the same.
#[test]
fn wider_strides_take_the_general_path() {
    require_avx2_fma!();
    for s in [3, 4] {
        let k = conv(1, 3, 8, 9, 41, 3, 3, false, s);
        let ins = [random_f32(&[1, 3, 9, 41], 1.0, 61), random_f32(&[8, 3, 3, 3], 1.0, 62), random_f32(&[8], 1.0, 63)];
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = interp::run(&k, &refs).unwrap();
        for cfg in variants() {
            let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
            assert_eq!(m.notes[0], format!("general (B steps {s} elements a column (1 or 2 here))"));
            assert_eq!(run_compiled(&k, &refs, &cfg, 1), want, "stride {s}");
        }
    }
}

/// Products with fewer than four row panels cut their columns into chunks, one
/// workgroup each (so threads have something to share; the cut that shares best over
/// two and four threads, which for 2×250 is two chunks of 4 and 3 tiles): a single row,
/// five rows, with an epilogue reading per-column and per-row operands.
#[test]
fn column_chunks() {
    require_avx2_fma!();
    for (m, k, n) in [(1, 64, 600), (5, 30, 300), (2, 17, 250)] {
        let a = random_f32(&[m, k], 1.0, 41);
        let b = random_f32(&[k, n], 1.0, 42);
        let kern = matmul(&[], m, k, n, false, false);
        let compiled = compile_with(&classify(&[&kern]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        assert!(compiled.workgroups[0] >= 2, "{m}×{n}: {} workgroups", compiled.workgroups[0]);
        check_micro(&kern, &[&a, &b], k);
        check_epilogues(&a, &b, (m, k, n), &["residual_max", "clip_row_scale"]);
    }
}

/// Products whose B is over one L2 column block (256 KiB) under an A that fits one,
/// with four row panels or more (a classifier head over a sequence, 2.9 and 4.5 MB of
/// B; a 1×1 convolution to few channels over a large map, 0.27–0.39 MB): the columns
/// are cut into chunks of about equal widths, each chunk × panel a workgroup, the chunk
/// outermost, so that threads split B. Tail rows and a tail of columns (odd N, 23 and
/// 17 rows), with and without an epilogue, plain and packed, against the interpreter.
#[test]
fn streamed_b_column_chunks() {
    require_avx2_fma!();
    for (m, k, n, chunks) in [(20, 1024, 1100, 4), (19, 700, 1601, 4), (24, 32, 2501, 2), (23, 17, 4001, 2)] {
        let a = random_f32(&[m, k], 1.0, 51);
        let b = random_f32(&[k, n], 1.0, 52);
        let kern = matmul(&[], m, k, n, false, false);
        let compiled = compile_with(&classify(&[&kern]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        let panels = m.div_ceil(6) as u64;
        assert!(compiled.workgroups[0] >= chunks * panels, "{m}×{n}: {} workgroups", compiled.workgroups[0]);
        check_micro(&kern, &[&a, &b], k);
        check_epilogues(&a, &b, (m, k, n), &["residual_max"]);
    }
}

/// A B that differs by batch position, each position's over one L2 block (a
/// bidirectional LSTM's input projection: one `W` per direction) under an A that fits
/// one, is cut into column chunks the same way, the chunk outermost and then the batch
/// position: a range of workgroups reads its chunk of every position's B once. Tail
/// rows and columns, against the interpreter, plain and packed, split into ranges.
#[test]
fn streamed_b_column_chunks_per_batch_position() {
    require_avx2_fma!();
    for (batch, m, k, n) in [(2usize, 20usize, 300usize, 1100usize), (3, 13, 130, 701)] {
        let a = random_f32(&[batch, m, k], 1.0, 55);
        let b = random_f32(&[batch, k, n], 1.0, 56);
        let kern = matmul(&[batch], m, k, n, false, true);
        let compiled = compile_with(&classify(&[&kern]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        let panels = m.div_ceil(if m % 6 != 0 && m % 4 == 0 { 4 } else { 6 }) as u64;
        let workgroups = compiled.workgroups[0];
        assert!(workgroups >= 2 * batch as u64 * panels, "{batch}×{m}×{n}: {workgroups} workgroups");
        check_micro(&kern, &[&a, &b], k);
    }
}

/// The same with B's rows a power of two apart (4096 and 8192 bytes, which would crowd
/// a few L1 sets), so B is packed on the stack: chunks of one packing block, each packed
/// once by the range that runs it; a reduction of two packing blocks (300 = 256 + 44)
/// and a tail panel (23 rows).
#[test]
fn packed_b_column_chunks() {
    require_avx2_fma!();
    for (m, k, n) in [(16, 300, 1024), (23, 40, 2048)] {
        let a = random_f32(&[m, k], 1.0, 53);
        let b = random_f32(&[k, n], 1.0, 54);
        let kern = matmul(&[], m, k, n, false, false);
        let compiled = compile_with(&classify(&[&kern]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        let panels = m.div_ceil(if m % 6 != 0 && m % 4 == 0 { 4 } else { 6 }) as u64;
        assert!(compiled.workgroups[0] >= (n as u64 / 64) * panels, "{m}×{n}: {} workgroups", compiled.workgroups[0]);
        check_micro(&kern, &[&a, &b], k);
        check_epilogues(&a, &b, (m, k, n), &["residual_max"]);
    }
}

/// [`with_epilogue`]'s kernel `which` for an `m × kk` by `kk × n` product and its five
/// operands (A scaled by `scale`, B, the bias, a per-row scale, a residual), random
/// from a seed of the shape.
fn epilogue_case(m: usize, kk: usize, n: usize, which: &str, scale: f64) -> (Kernel, [Tensor; 5]) {
    let seed = (m * 31 + kk * 7 + n) as u64;
    let ops = [
        random_f32(&[m, kk], scale, seed),
        random_f32(&[kk, n], 1.0, seed + 1),
        random_f32(&[n], 1.0, seed + 2),
        random_f32(&[m, 1], 1.0, seed + 3),
        random_f32(&[m, n], 1.0, seed + 4),
    ];
    (with_epilogue(m, kk, n, which), ops)
}

/// Asserts that `k`, its operands packed as constants, takes channel-vector tiles: the
/// 256-bit form for x86-64-v3, the 512-bit one for x86-64-v4 (compiled whether or not
/// this CPU could run it: `check_micro` runs what it can).
fn assert_channel_vectors(k: &Kernel, inputs: &[&Tensor]) {
    let targets =
        [(CpuTarget::X86_64V3, "(avx2+fma, channel vectors)"), (CpuTarget::X86_64V4, "(avx-512, channel vectors")];
    for (target, form) in targets {
        let cfg = Config { target, options: Options::default() };
        let (pk, _) = packed(k, inputs, &cfg).expect("operands packed");
        let m = compile_with(&classify(&[&pk]), &cfg.target, &cfg.options).unwrap();
        assert!(m.notes[0].contains(form), "{} {:?}: {}", k.name, cfg.target, m.notes[0]);
    }
}

/// 1×1 convolutions with a bias, `(images, in channels, out channels, h, w)`, on random
/// data from `seed`: each takes channel-vector tiles ([`assert_channel_vectors`]) and
/// matches the interpreter ([`check_micro`]).
fn pointwise_channel_vectors(cases: &[(usize, usize, usize, usize, usize)], seed: u64) {
    for &(n, ci, co, h, w) in cases {
        let x = random_f32(&[n, ci, h, w], 4.0, seed);
        let wt = random_f32(&[co, ci, 1, 1], 2.0, seed + 1);
        let bias = random_f32(&[co], 2.0, seed + 2);
        let k = pointwise(n, ci, co, h, w);
        assert_channel_vectors(&k, &[&x, &wt, &bias]);
        check_micro(&k, &[&x, &wt, &bias], ci);
    }
}

/// The 512-bit channel-vector tiles (x86-64-v4: a vector of A's 16 rows from each of
/// two panels × up to 14 columns broadcast from B, balanced widths, transposed 16 × 16
/// in registers, stores masked by an opmask) over every N from 1 to 63: those not a
/// multiple of 8 take them (one to five tiles of 1 to 14 columns), the multiples of 8
/// keep the plain tiles; M from 64 to 1280 in steps of 16 (an odd number of panels
/// leaves the last one alone: a tile of one vector), odd K (one step, up to 321 with B's copy on the
/// stack), every kind of epilogue: in registers (bias and Relu, clamps with a per-row
/// scale, a residual), over the stack on 16 lanes (ten values live; a sigmoid), and on 8
/// lanes (an And of Bools), with and without a batch. Where the CPU lacks AVX-512 F only
/// the x86-64-v3 form runs (`variants`); the paths are asserted either way.
#[test]
fn wide_channel_vector_tiles() {
    require_avx2_fma!();
    let epilogues = ["bias_relu", "clip_row_scale", "residual_max", "many_live", "sigmoid", "in_band"];
    let shapes = (1..64).map(|n| (64 + 16 * (n % 5), [1, 3, 17, 33, 61][n % 5], n, epilogues[n % 6]));
    let more =
        [(1280, 7, 49, "bias_relu"), (144, 321, 13, "residual_max"), (80, 63, 63, "in_band"), (112, 5, 15, "sigmoid")];
    for (m, kk, n, which) in shapes.chain(more) {
        let (k, ops) = epilogue_case(m, kk, n, which, if which == "sigmoid" { 4.0 } else { 1.0 });
        let inputs: Vec<&Tensor> = ops.iter().collect();
        if n % 8 == 0 {
            // Whole column vectors: plain tiles (512-bit from 16 columns on).
            let cfg = Config { target: CpuTarget::X86_64V4, options: Options::default() };
            let (pk, _) = packed(&k, &inputs, &cfg).expect("operands packed");
            let note = &compile_with(&classify(&[&pk]), &cfg.target, &cfg.options).unwrap().notes[0];
            let form = if n >= 16 { "contraction microkernel (avx-512" } else { "contraction microkernel (avx2+fma)" };
            assert!(note.starts_with(form) && !note.contains("channel"), "{n}: {note}");
        } else {
            assert_channel_vectors(&k, &inputs);
        }
        if ["sigmoid", "in_band", "residual_max"].contains(&which) {
            check_bounded(&k, &inputs, m, kk, n, which);
        } else {
            check_micro(&k, &inputs, kk);
        }
    }
    // A batch of 1×1 convolutions on maps of 5×5 and 3×3 (B differs per image, read in
    // place) and of one image on a 7×7 map (B copied to the stack).
    pointwise_channel_vectors(&[(3, 17, 80, 5, 5), (2, 9, 64, 3, 3), (1, 33, 96, 7, 7)], 31);
}

/// Stride-2 convolutions with narrow output rows (13, 7, 6 and 14 columns) to 64 or more
/// channels take channel-vector tiles (each column of B a broadcast of its own element,
/// two elements apart) and match the interpreter: 3×3 windows read in place (several
/// reduction variables) and a 1×1 one (a single reduction variable, whose B is not
/// copied to the stack: the copy takes whole runs of columns).
#[test]
fn strided_channel_vectors() {
    require_avx2_fma!();
    for (i, &(ci, co, h, w, k)) in
        [(5, 96, 9, 27, 3), (3, 64, 7, 15, 3), (17, 64, 5, 11, 1), (8, 128, 11, 29, 3)].iter().enumerate()
    {
        let seed = 61 + 3 * i as u64;
        let x = random_f32(&[1, ci, h, w], 1.0, seed);
        let wt = random_f32(&[co, ci, k, k], 1.0, seed + 1);
        let bias = random_f32(&[co], 1.0, seed + 2);
        let kern = conv(1, ci, co, h, w, k, k, false, 2);
        assert_channel_vectors(&kern, &[&x, &wt, &bias]);
        check_micro(&kern, &[&x, &wt, &bias], ci * k * k);
    }
}

/// [`with_epilogue`]'s sigmoid and in-band selection against the interpreter, on every
/// variant, packed. Sigmoid: within `0.25·(K + 2)·2⁻²⁴·(Σ|a·b| + |bias|) + 8 ulp` (its
/// Lipschitz constant, and exp's approximation as `transcendental_epilogues` bounds
/// it). In band: within `(K + 2)·2⁻²⁴·Σ|a·b|·|row|` of the interpreter, or, where the
/// exact `s·row` lies that close to an edge of the band (either side may be taken),
/// 0 or that close to it. Residual: within `(K + 2)·2⁻²⁴·(Σ|a·b| + |bias| + |res|)`
/// (`check_micro`'s bound, the kernel on absolute values, subtracts the residual).
fn check_bounded(k: &Kernel, inputs: &[&Tensor], m: usize, kk: usize, n: usize, which: &str) {
    let want = interp::run(k, inputs).unwrap().to_vec::<f32>().unwrap();
    let v = |i: usize| inputs[i].to_vec::<f32>().unwrap();
    let (a, bm, bias, row, res) = (v(0), v(1), v(2), v(3), v(4));
    let eps = f32::EPSILON as f64 / 2.0;
    for cfg in variants() {
        let (pk, pin) = packed(k, inputs, &cfg).expect("operands packed");
        let refs: Vec<&Tensor> = pin.iter().collect();
        for splits in [1, 3] {
            let got = run_compiled(&pk, &refs, &cfg, splits).to_vec::<f32>().unwrap();
            for i in 0..m {
                for j in 0..n {
                    let terms = (0..kk).map(|q| a[i * kk + q] as f64 * bm[q * n + j] as f64);
                    let (sum, sabs) = terms.fold((0.0, 0.0), |(s, t), x| (s + x, t + x.abs()));
                    let (g, w) = (got[i * n + j] as f64, want[i * n + j] as f64);
                    let ok = if which == "sigmoid" {
                        let tol =
                            0.25 * (kk as f64 + 2.0) * eps * (sabs + (bias[j] as f64).abs()) + 16.0 * eps * w.abs();
                        (g - w).abs() <= tol + 1e-30
                    } else if which == "residual_max" {
                        let mag = sabs + (bias[j] as f64).abs() + (res[i * n + j] as f64).abs();
                        (g - w).abs() <= (kk as f64 + 2.0) * eps * mag + 1e-30
                    } else {
                        let r = row[i] as f64;
                        let tol = (kk as f64 + 2.0) * eps * sabs * r.abs() + 1e-30;
                        let exact = sum * r;
                        let edge = (exact + 0.5).abs() <= tol || (exact - 0.75).abs() <= tol;
                        (g - w).abs() <= tol || edge && (g == 0.0 || (g - exact).abs() <= tol)
                    };
                    assert!(ok, "{which} {m}x{kk}x{n} {:?} splits {splits}: [{i},{j}] got {g}, want {w}", cfg.target);
                }
            }
        }
    }
}

/// Narrow products (N under 64 and not a multiple of 8) by a constant A of at least 64
/// rows, a multiple of 16, take channel-vector tiles once A is packed (A's rows in the
/// lanes, the tile transposed before its epilogue): whole and masked stores, every kind
/// of epilogue load, tail columns of 1 to 6, 1×1 convolutions on 7×7 maps (B copied tile
/// by tile, or read in place for a batch of 2), a 3×3 convolution.
#[test]
fn channel_vector_tiles() {
    require_avx2_fma!();
    for &(m, kk, n) in &[(64, 7, 49), (64, 1, 1), (96, 17, 9), (80, 64, 13), (64, 5, 63), (128, 33, 7), (64, 300, 50)] {
        for which in ["bias_relu", "clip_row_scale", "residual_max"] {
            let (k, ops) = epilogue_case(m, kk, n, which, 1.0);
            let inputs: Vec<&Tensor> = ops.iter().collect();
            assert_channel_vectors(&k, &inputs);
            check_micro(&k, &inputs, kk);
        }
    }
    pointwise_channel_vectors(&[(1, 32, 64, 7, 7), (2, 24, 96, 7, 7), (1, 16, 64, 3, 5)], 11);
    // A 3×3 convolution: three reduction variables, B read per output row (not copied).
    let x = random_f32(&[1, 4, 7, 9], 1.0, 21);
    let wt = random_f32(&[64, 4, 3, 3], 1.0, 22);
    let bias = random_f32(&[64], 1.0, 23);
    let k = conv(1, 4, 64, 7, 9, 3, 3, false, 1);
    assert_channel_vectors(&k, &[&x, &wt, &bias]);
    check_micro(&k, &[&x, &wt, &bias], 36);
}

/// One thread's speed of the plain f32 matrix product `[M, K] × [K, N]` (both operands
/// run-time inputs, B in place at its pitch, as `matmul1024` compiles), for every
/// microkernel variant this CPU runs: the best and the median of the timed calls, in
/// GFLOP/s. Not a test (ignored): the experiment harness for tuning tiles and blocking.
/// `KILN_GEMM_SHAPES="1024x1024x1024,128x512x128"` (M×K×N, comma-separated) picks the
/// shapes, `KILN_GEMM_CALLS` the timed calls (default 20). Each output is checked
/// against an f64 dot product at 64 sampled places, so a broken tile cannot report a
/// speed. On a loaded machine only calls shorter than a scheduler time slice (a few
/// ms) time the code rather than the sharing: there the best of a large product says
/// little.
///
/// `cargo test -p kiln-codegen --test contraction gemm_speed -- --ignored --nocapture`
#[test]
#[ignore]
fn gemm_speed() {
    use kiln_runtime::cpu::helpers::HELPERS;
    use kiln_runtime::cpu::loader::LoadedCode;
    use std::time::Instant;
    require_avx2_fma!();
    let shapes: Vec<(usize, usize, usize)> = std::env::var("KILN_GEMM_SHAPES")
        .unwrap_or_else(|_| "1024x1024x1024,384x768x768,128x512x128,3136x96x24".into())
        .split(',')
        .map(|s| {
            let d: Vec<usize> = s.trim().split('x').map(|x| x.parse().expect("KILN_GEMM_SHAPES: MxKxN")).collect();
            assert_eq!(d.len(), 3, "KILN_GEMM_SHAPES: MxKxN");
            (d[0], d[1], d[2])
        })
        .collect();
    let calls: usize = std::env::var("KILN_GEMM_CALLS").ok().and_then(|c| c.parse().ok()).unwrap_or(20).max(1);
    for cfg in variants() {
        for &(m, kk, n) in &shapes {
            let k = matmul(&[], m, kk, n, false, false);
            let a = random_f32(&[m, kk], 1.0, 31);
            let b = random_f32(&[kk, n], 1.0, 32);
            let compiled = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
            let exe = &compiled.executable;
            let code = LoadedCode::load(&exe.code, &exe.relocs).unwrap();
            let entry = code.entry(exe.entries[0].1).unwrap();
            let mut bufs = vec![a.bytes().to_vec(), b.bytes().to_vec(), vec![0u8; k.output.storage_bytes()]];
            let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|v| v.as_mut_ptr()).collect();
            let wg = compiled.workgroups[0];
            let mut times = Vec::with_capacity(calls);
            for i in 0..calls + 2 {
                let t = Instant::now();
                // SAFETY (bench): the bindings are live buffers of the kernel's input and
                // output types, in binding order; the helper table is the runtime's.
                unsafe { entry(ptrs.as_ptr(), HELPERS.as_ptr(), 0, wg) };
                if i >= 2 {
                    times.push(t.elapsed().as_secs_f64());
                }
            }
            let (av, bv) = (a.to_vec::<f32>().unwrap(), b.to_vec::<f32>().unwrap());
            let out: Vec<f32> = bufs[2].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            for s in 0..64 {
                let (i, j) = ((s * 7919) % m, (s * 104_729) % n);
                let (mut want, mut bound) = (0f64, 0f64);
                for p in 0..kk {
                    let t = av[i * kk + p] as f64 * bv[p * n + j] as f64;
                    want += t;
                    bound += t.abs();
                }
                let tol = (kk as f64 + 2.0) * f32::EPSILON as f64 / 2.0 * bound + 1e-30;
                assert!(
                    (out[i * n + j] as f64 - want).abs() <= tol,
                    "{m}x{kk}x{n} [{i}, {j}]: {} vs {want}",
                    out[i * n + j]
                );
            }
            times.sort_by(f64::total_cmp);
            let flop = 2.0 * (m * kk * n) as f64;
            let (best, median) = (times[0], times[times.len() / 2]);
            println!(
                "{:?} {m}x{kk}x{n} ({}): best {:.3} ms = {:.1} GFLOP/s, median {:.3} ms = {:.1} GFLOP/s",
                cfg.target,
                compiled.notes[0],
                best * 1e3,
                flop / best / 1e9,
                median * 1e3,
                flop / median / 1e9
            );
        }
    }
}

/// Panels of 4 rows where 4 divides M and 6 does not, unless the columns make panels
/// of 6 and a tail cheaper (256-bit tiles): 32 columns a batch position (a projection
/// split into heads) leave a 4 × 24 tiling a last tile of one vector, where 6 × 16
/// takes two full tiles, so M = 16 runs as panels of 6, 6 and 4 rows (3 a position);
/// 1536 columns tile either way alike and keep panels of 4. Against the interpreter.
#[test]
fn panel_rows_follow_the_columns() {
    require_avx2_fma!();
    for (heads, m, k, n, panels) in [(4usize, 16usize, 64usize, 32usize, 3u64), (2, 16, 40, 1536, 4), (3, 8, 24, 32, 2)]
    {
        let a = random_f32(&[heads, m, k], 1.0, 61);
        let b = random_f32(&[heads, k, n], 1.0, 62);
        let kern = matmul(&[heads], m, k, n, false, true);
        let compiled = compile_with(&classify(&[&kern]), &CpuTarget::X86_64V3, &Options::default()).unwrap();
        assert_eq!(compiled.workgroups[0], heads as u64 * panels, "{heads}×{m}×{k}×{n}");
        check_micro(&kern, &[&a, &b], k);
    }
}

/// `σ(v)` written as `kiln-lower` writes Sigmoid: `select(v ≥ 0, 1, e)/(1 + e)` with
/// `e = e^{−|v|}`.
fn lowered_logistic(b: &mut KernelBuilder, v: ExprId) -> ExprId {
    let f = ScalarType::F32;
    let (zero, one) = (b.float(f, 0.0), b.float(f, 1.0));
    let a = b.unary(UnaryOp::Abs, v);
    let na = b.unary(UnaryOp::Neg, a);
    let e = b.unary(UnaryOp::Exp, na);
    let pos = b.binary(BinaryOp::Ge, v, zero);
    let num = b.select(pos, one, e);
    let den = b.add(one, e);
    b.div(num, den)
}

/// A contraction's epilogue evaluates the logistic function in one piece
/// (`Vx::logistic`): its results are the bits the same nodes give one by one (an
/// elementwise kernel's vector code, which evaluates them so), except where `e^{−|v|}`
/// would be subnormal, there within 2⁻¹²⁶; NaN stays NaN, σ(−∞) = 0, σ(∞) = 1. The
/// product is `v · 1` (one reduction step), so the epilogue sees every input exactly,
/// in channel-vector tiles (3 columns) and in row tiles (64 columns).
#[test]
fn logistic_epilogue_is_its_nodes() {
    require_avx2_fma!();
    let mut xs: Vec<f32> =
        (0..=u32::MAX / 8191).map(|i| f32::from_bits(i * 8191)).filter(|x| x.abs() <= 120.0).collect();
    xs.extend([0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -87.3, -87.4, -103.9, -104.1, 87.4, 1e-30]);
    xs.resize(xs.len().next_multiple_of(64), 0.5);
    let m = xs.len();
    // The nodes one by one: an elementwise kernel.
    let t = tt(&[m]);
    let mut b = KernelBuilder::new("nodes", vec![t.clone()], t);
    let i = b.out_index();
    let v = b.load(0, i);
    let r = lowered_logistic(&mut b, v);
    let nodes = b.finish(r).unwrap();
    let x = Tensor::from_vec(Shape::new(vec![m]).unwrap(), xs.clone()).unwrap();
    let want = run_compiled(&nodes, &[&x], &Config { target: CpuTarget::X86_64V3, options: Options::default() }, 2);
    let want = want.to_vec::<f32>().unwrap();
    for n in [3usize, 64] {
        let mut b = KernelBuilder::new("sigmoid", vec![tt(&[m, 1]), tt(&[1, n])], tt(&[m, n]));
        let (_, s) = b.matmul_sum(1);
        let r = lowered_logistic(&mut b, s);
        let k = b.finish(r).unwrap();
        let a = Tensor::from_vec(Shape::new(vec![m, 1]).unwrap(), xs.clone()).unwrap();
        let ones = Tensor::from_vec(Shape::new(vec![1, n]).unwrap(), vec![1f32; n]).unwrap();
        for cfg in microkernel_variants(false) {
            // Operands packed as constants, as a model's weights are (channel-vector
            // tiles read A in panels).
            let (pk, pin) = packed(&k, &[&a, &ones], &cfg).expect("operands packed");
            let notes = compile_with(&classify(&[&pk]), &cfg.target, &cfg.options).unwrap().notes;
            assert!(notes[0].starts_with("contraction"), "{n} {:?}: {}", cfg.target, notes[0]);
            assert_eq!(notes[0].contains("channel vectors"), n == 3, "{n} {:?}: {}", cfg.target, notes[0]);
            let got = run_compiled(&pk, &pin.iter().collect::<Vec<_>>(), &cfg, 2).to_vec::<f32>().unwrap();
            for (row, (&x, &w)) in xs.iter().zip(&want).enumerate() {
                for j in 0..n {
                    let g = got[row * n + j];
                    let exact = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan());
                    // σ(x) < 2⁻¹²⁶ only where e^{−|x|} is subnormal.
                    let flushed = x < -87.0 && (g - w).abs() <= f32::MIN_POSITIVE;
                    assert!(exact || flushed, "{n} columns {:?}: σ({x}) = {g}, nodes {w}", cfg.target);
                }
            }
            let at = |v: f32| got[xs.iter().position(|&x| x.to_bits() == v.to_bits()).unwrap() * n];
            assert_eq!((at(f32::NEG_INFINITY), at(f32::INFINITY)), (0.0, 1.0), "{n} {:?}", cfg.target);
        }
    }
}
