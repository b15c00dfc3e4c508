//! Whole kernels: odd shapes and ranks, broadcasting, softmax and layer norm written
//! as one kernel, matmul; what is vectorised; loop-invariant reductions evaluated once
//! per row; reassociated sums within tolerance; compile time.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use common::*;
use kiln_codegen::cpu::{classify, clif_text, compile_with, CpuTarget, Options};
use kiln_flow::lower::broadcast_index;
use kiln_flow::{BinaryOp, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, TensorType};
use kiln_module::abi::{Helper, HelperFn, HELPER_COUNT};
use kiln_runtime::cpu::helpers::HELPERS;
use kiln_runtime::cpu::loader::LoadedCode;

fn tt(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
}

fn notes(k: &Kernel, opts: &Options) -> String {
    let text = clif_text(k, &CpuTarget::X86_64V2, opts, false).unwrap();
    text.lines().take_while(|l| l.starts_with(';')).collect::<Vec<_>>().join("\n")
}

/// Scalar code (float sums in order).
const SCALAR: Options = in_order(false, false);

/// Vector code (float sums in order).
const VEC: Options = in_order(true, false);

/// `a + b * 2` with `b` broadcast to `a`'s shape.
fn broadcast_add(name: &str, a: &[usize], b: &[usize]) -> Kernel {
    let mut kb = KernelBuilder::new(name, vec![tt(DType::F32, a), tt(DType::F32, b)], tt(DType::F32, a));
    let i = kb.out_index();
    let x = kb.load(0, i.clone());
    let bi = broadcast_index(&mut kb, b, &i);
    let y = kb.load(1, bi);
    let two = kb.float(ScalarType::F32, 2.0);
    let y2 = kb.mul(y, two);
    let r = kb.add(x, y2);
    kb.finish(r).unwrap()
}

#[test]
fn odd_shapes_and_ranks() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[], &[]),
        (&[1], &[1]),
        (&[3], &[1]),
        (&[5], &[5]),
        (&[17], &[]),
        (&[33], &[33]),
        (&[3, 5], &[5]),
        (&[5, 3], &[5, 1]),
        (&[1, 17], &[1, 17]),
        (&[2, 3, 5], &[3, 1]),
        (&[3, 1, 33], &[33]),
        (&[2, 3, 5, 17], &[1, 3, 1, 17]),
        (&[1, 1, 1, 1], &[1]),
        (&[2, 2, 3, 4], &[2, 1, 3, 1]),
    ];
    for (n, (a, b)) in cases.iter().enumerate() {
        let k = broadcast_add(&format!("bcast{n}"), a, b);
        let x = random_f32(a, 10.0, 5 + n as u64);
        let y = random_f32(b, 10.0, 50 + n as u64);
        check(&k, &[&x, &y], EXACT);
    }
}

/// Rank-2 output: workgroups are rows; every split of the rows gives the same result.
#[test]
fn workgroup_ranges() {
    let k = broadcast_add("rows", &[7, 2, 5], &[5]);
    let x = random_f32(&[7, 2, 5], 1.0, 1);
    let y = random_f32(&[5], 1.0, 2);
    let m = compile_with(&classify(&[&k]), &CpuTarget::Host, &VEC).unwrap();
    assert_eq!(m.workgroups, vec![14]);
    let want = kiln_flow::interp::run(&k, &[&x, &y]).unwrap();
    for cfg in quick_configs() {
        for splits in [1, 2, 5, 14] {
            let got = run_compiled(&k, &[&x, &y], &cfg, splits);
            compare(&got, &want, EXACT).unwrap();
        }
    }
}

fn matmul(m: usize, kk: usize, n: usize) -> Kernel {
    let f = DType::F32;
    let mut b = KernelBuilder::new("matmul", vec![tt(f, &[m, kk]), tt(f, &[kk, n])], tt(f, &[m, n]));
    let (_, r) = b.matmul_sum(kk);
    b.finish(r).unwrap()
}

#[test]
fn softmax_layernorm_matmul() {
    for (r, c) in [(1, 1), (3, 5), (4, 17), (2, 33), (5, 64)] {
        let x = random_f32(&[r, c], 4.0, 9);
        // exp is inline code within 1 ulp of the interpreter's (`cpu::math`).
        check(&softmax(r, c), &[&x], Cmp { zero_sign: false, rtol: 2e-6 });
        let g = random_f32(&[c], 1.0, 10);
        let bb = random_f32(&[c], 1.0, 11);
        check(&layernorm(r, c), &[&x, &g, &bb], EXACT);
    }
    for (m, k, n) in [(1, 1, 1), (3, 5, 7), (5, 17, 33), (2, 64, 4)] {
        let a = random_f32(&[m, k], 1.0, 12);
        let b = random_f32(&[k, n], 1.0, 13);
        check(&matmul(m, k, n), &[&a, &b], EXACT);
    }
}

#[test]
fn what_is_vectorised() {
    // Softmax: the column loop (exp per lane), the row max (exact); the row sum only
    // when float reassociation is allowed.
    let sm = softmax(4, 64);
    let n = notes(&sm, &VEC);
    assert!(n.contains("v1 (innermost output loop) runs 4 lanes"), "{n}");
    assert!(n.contains("runs v2 4 lanes"), "{n}");
    assert!(!n.contains("runs v3"), "{n}");
    let n = notes(&sm, &Options::default());
    assert!(n.contains("runs v3"), "{n}");
    // Matmul: along the output columns, the k loop inside with a vector accumulator.
    let n = notes(&matmul(5, 17, 33), &VEC);
    assert!(n.contains("v1 (innermost output loop)"), "{n}");
    // Nothing when switched off, and nothing for f64 or strided loads.
    assert!(notes(&sm, &SCALAR).is_empty());
    let mut b = KernelBuilder::new("transpose", vec![tt(DType::F32, &[8, 8])], tt(DType::F32, &[8, 8]));
    let i = b.out_index();
    let l = b.load(0, vec![i[1], i[0]]);
    let k = b.finish(l).unwrap();
    assert!(notes(&k, &VEC).is_empty());
    let mut b = KernelBuilder::new("f64", vec![tt(DType::F64, &[8])], tt(DType::F64, &[8]));
    let i = b.out_index();
    let l = b.load(0, i);
    let k = b.finish(l).unwrap();
    assert!(notes(&k, &VEC).is_empty());
}

/// Integer and mask arithmetic in vector mode: compares, selects, casts, min/max.
#[test]
fn vector_integer_and_masks() {
    let mut b = KernelBuilder::new(
        "ints",
        vec![tt(DType::I32, &[3, 19]), tt(DType::U32, &[19]), tt(DType::F32, &[3, 19])],
        tt(DType::F32, &[3, 19]),
    );
    let i = b.out_index();
    let a = b.load(0, i.clone());
    let u = b.load(1, vec![i[1]]);
    let f = b.load(2, i.clone());
    let three = b.int(ScalarType::I32, 3);
    let a3 = b.mul(a, three);
    let au = b.convert(u, ScalarType::I32);
    let s = b.add(a3, au);
    let mx = b.binary(BinaryOp::Max, s, a);
    let mn = b.binary(BinaryOp::Min, u, u);
    let lt = b.binary(BinaryOp::Lt, mx, three);
    let ult = b.binary(BinaryOp::Ge, mn, u);
    let both = b.binary(BinaryOp::And, lt, ult);
    let fz = b.float(ScalarType::F32, 0.0);
    let fneg = b.binary(BinaryOp::Lt, f, fz);
    let any = b.binary(BinaryOp::Xor, both, fneg);
    let fa = b.convert(mx, ScalarType::F32);
    let fu = b.convert(u, ScalarType::F32);
    let fb = b.convert(any, ScalarType::F32);
    let t = b.add(fa, fb);
    let r = b.select(any, t, fu);
    let neg = b.unary(UnaryOp::Neg, r);
    let ab = b.unary(UnaryOp::Abs, neg);
    let k = b.finish(ab).unwrap();
    assert!(notes(&k, &VEC).contains("innermost output loop"));
    let mut r = Rng(77);
    let av: Vec<u64> = (0..57).map(|_| (r.next() as u32 as i32 >> (r.next() % 31)) as u32 as u64).collect();
    let uv: Vec<u64> = (0..19).map(|_| (r.next() as u32 >> (r.next() % 32)) as u64).collect();
    let a = tensor_bits(DType::I32, &[3, 19], &av);
    let u = tensor_bits(DType::U32, &[19], &uv);
    let f = random_f32(&[3, 19], 1.0, 5);
    check(&k, &[&a, &u, &f], EXACT);
}

/// Float sums vectorised with reassociation: within `(n/4 + 3)·2^-24` relative error
/// of the in-order sum for non-negative data (checked with rtol 1e-5 on rows of up
/// to 1000 elements); integer sums and max/min stay exact.
#[test]
fn reassociated_sums() {
    let opts = Options::default();
    for c in [8, 9, 31, 100, 1000] {
        let mut b = KernelBuilder::new("rowsum", vec![tt(DType::F32, &[3, c])], tt(DType::F32, &[3]));
        let i = b.out_index();
        let r = reduce_row(&mut b, 0, i[0], c, ReduceOp::Sum, |b, l| b.unary(UnaryOp::Abs, l));
        let kern = b.finish(r).unwrap();
        assert!(notes(&kern, &opts).contains("reduce"), "c={c}");
        let x = random_f32(&[3, c], 3.0, c as u64);
        let cfgs: Vec<Config> = [CpuTarget::X86_64V2, CpuTarget::Host]
            .into_iter()
            .map(|t| Config { target: t, options: opts.clone() })
            .collect();
        check_with(&kern, &[&x], Cmp { zero_sign: false, rtol: 1e-5 }, &cfgs);
    }
    // Exact ones: i32 sum (wrapping), f32 max with NaN, over a contiguous variable.
    for (op, d) in [(ReduceOp::Sum, DType::I32), (ReduceOp::Max, DType::F32), (ReduceOp::Min, DType::U32)] {
        let c = 37;
        let ct = ScalarType::of_storage(d);
        let kern = row_reduce("exact_vec_reduce", tt(d, &[4, c]), d, op);
        assert!(notes(&kern, &opts).contains("reduce"), "{op:?} {d:?}");
        let sp = specials(d);
        let v: Vec<u64> = (0..4 * c).map(|j| sp[(j * 7 + j / c) % sp.len()]).collect();
        let x = tensor_bits(d, &[4, c], &v);
        let _ = ct;
        let cfgs: Vec<Config> = [CpuTarget::X86_64, CpuTarget::Host]
            .into_iter()
            .map(|t| Config { target: t, options: opts.clone() })
            .collect();
        check_with(&kern, &[&x], Cmp { zero_sign: true, rtol: 0.0 }, &cfgs);
    }
}

/// Compiles `k` alone for the host with `opts`, runs all its workgroups on `x` with the
/// helper `table`, and returns the output's bytes.
fn run_with_table(k: &Kernel, opts: &Options, table: &[HelperFn; HELPER_COUNT], x: &kiln_ir::Tensor) -> Vec<u8> {
    let m = compile_with(&classify(&[k]), &CpuTarget::Host, opts).unwrap();
    let code = LoadedCode::load(&m.executable.code, &m.executable.relocs).unwrap();
    let entry = code.entry(m.executable.entries[0].1).unwrap();
    let mut xin = x.bytes().to_vec();
    let mut out = vec![0u8; k.output.storage_bytes()];
    let bindings = [xin.as_mut_ptr(), out.as_mut_ptr()];
    // SAFETY (test): bindings of the kernel's types; a helper table of the ABI.
    unsafe { entry(bindings.as_ptr(), table.as_ptr(), 0, m.workgroups[0]) };
    out
}

/// The runtime's helper table with `f` in place of `which`, an `f32 -> f32` helper.
fn helpers_with(which: Helper, f: extern "C" fn(f32) -> f32) -> [HelperFn; HELPER_COUNT] {
    let mut table: [HelperFn; HELPER_COUNT] = HELPERS;
    // SAFETY (test): an `extern "C" fn(f32) -> f32` stored untyped in an entry the
    // kernel calls with exactly that signature (the callers pass `f32 -> f32` helpers).
    table[which as usize] = unsafe { std::mem::transmute::<extern "C" fn(f32) -> f32, HelperFn>(f) };
    table
}

/// `$name`, an `f32 -> f32` helper that counts its calls in `$calls` and returns what the
/// runtime's `$helper` does.
macro_rules! counting_helper {
    ($calls:ident, $name:ident, $helper:path) => {
        static $calls: AtomicUsize = AtomicUsize::new(0);

        extern "C" fn $name(x: f32) -> f32 {
            $calls.fetch_add(1, Ordering::SeqCst);
            $helper(x)
        }
    };
}

counting_helper!(COSH_CALLS, counting_cosh, kiln_runtime::cpu::helpers::cosh_f32);
counting_helper!(SIN_CALLS, counting_sin, kiln_runtime::cpu::helpers::sin_f32);

/// The row max and row sum of a softmax do not read the column variable: they are
/// evaluated once per row, so the transcendental runs 2·rows·cols times (not
/// rows·cols·(cols+1)). (Cosh stands in for exp, which is inline code, not a call.)
#[test]
fn loop_invariant_reductions_run_once_per_row() {
    let (r, c) = (3, 10);
    let k = softmax_with(r, c, UnaryOp::Cosh);
    let x = random_f32(&[r, c], 2.0, 4);
    let table = helpers_with(Helper::CoshF32, counting_cosh);
    for opts in [SCALAR, VEC, Options::default()] {
        COSH_CALLS.store(0, Ordering::SeqCst);
        let out = run_with_table(&k, &opts, &table, &x);
        assert_eq!(COSH_CALLS.load(Ordering::SeqCst), 2 * r * c, "{opts:?}");
        let want = kiln_flow::interp::run(&k, &[&x]).unwrap();
        let tol = if opts.reassociate { 1e-6 } else { 0.0 };
        let got = kiln_ir::Tensor::new(k.output.clone(), out.into()).unwrap();
        compare(&got, &want, Cmp { zero_sign: false, rtol: tol }).unwrap();
    }
}

/// A value with several users is computed once per iteration of its scope.
#[test]
fn shared_nodes_evaluated_once() {
    let mut b = KernelBuilder::new("shared", vec![tt(DType::F32, &[6])], tt(DType::F32, &[6]));
    let i = b.out_index();
    let x = b.load(0, i);
    let e = b.unary(UnaryOp::Sin, x);
    let a = b.mul(e, e);
    let s = b.add(a, e);
    let k = b.finish(s).unwrap();
    let table = helpers_with(Helper::SinF32, counting_sin);
    for opts in [SCALAR, VEC] {
        SIN_CALLS.store(0, Ordering::SeqCst);
        run_with_table(&k, &opts, &table, &random_f32(&[6], 1.0, 3));
        assert_eq!(SIN_CALLS.load(Ordering::SeqCst), 6, "{opts:?}");
    }
}

/// Several kernels in one executable; entries in order; compile time per kernel
/// (printed; run with --nocapture).
#[test]
fn one_executable_many_kernels_and_compile_time() {
    // A long fused elementwise chain: 150 nodes of arithmetic, compares and selects.
    let mut b = KernelBuilder::new(
        "chain150",
        vec![tt(DType::F32, &[64, 64]), tt(DType::F32, &[64])],
        tt(DType::F32, &[64, 64]),
    );
    let i = b.out_index();
    let mut v = b.load(0, i.clone());
    let w = b.load(1, vec![i[1]]);
    for n in 0..36 {
        let c = b.float(ScalarType::F32, 0.5 + n as f64);
        let m = b.mul(v, c);
        let a = b.add(m, w);
        let gt = b.binary(BinaryOp::Gt, a, c);
        v = b.select(gt, a, m);
    }
    let chain = b.finish(v).unwrap();
    assert!(chain.nodes.len() >= 150, "{}", chain.nodes.len());
    let kernels = vec![
        softmax(16, 128),
        layernorm(16, 128),
        matmul(16, 64, 32),
        broadcast_add("add4d", &[2, 3, 5, 17], &[1, 3, 1, 17]),
        chain,
    ];
    let refs: Vec<&Kernel> = kernels.iter().collect();
    let m = compile_with(&classify(&refs), &CpuTarget::Host, &Options::default()).unwrap();
    let names: Vec<&str> = m.executable.entries.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["softmax", "layernorm", "matmul", "add4d", "chain150"]);
    // The matmul is a contraction microkernel where the host has AVX2+FMA: one
    // workgroup per panel of rows. 512-bit tiles take panels of four rows (16 is a
    // multiple of 4, not of 6); 256-bit tiles over 32 columns take 6, 6 and 4 rows (a
    // 4 × 24 tiling would end in a one-vector tile).
    let panels = if !avx2_fma() {
        16
    } else if std::is_x86_feature_detected!("avx512f") {
        4
    } else {
        3
    };
    assert_eq!(m.workgroups, vec![16, 16, panels, 30, 64]);
    // Every entry runs: the chain against the interpreter.
    let x = random_f32(&[64, 64], 2.0, 8);
    let y = random_f32(&[64], 2.0, 9);
    check_with(&kernels[4], &[&x, &y], EXACT, &quick_configs());
    assert!(m.executable.features & 1 != 0);
    for k in &kernels {
        let nodes = k.nodes.len();
        let t = Instant::now();
        let reps = 5;
        for _ in 0..reps {
            compile_with(&classify(&[k]), &CpuTarget::Host, &Options::default()).unwrap();
        }
        let per = t.elapsed() / reps;
        let one = compile_with(&classify(&[k]), &CpuTarget::Host, &Options::default()).unwrap();
        println!(
            "compile time {:>10}: {:>8.2?} ({nodes} nodes, {} bytes of code)",
            k.name,
            per,
            one.executable.code.len()
        );
    }
    // Duplicate names are refused.
    let e = compile_with(&classify(&[&kernels[0], &kernels[0]]), &CpuTarget::Host, &Options::default()).unwrap_err();
    assert!(matches!(e, kiln_codegen::CodegenError::Unsupported { .. }));
}

/// Features recorded per target.
#[test]
fn features_per_target() {
    use kiln_module::program::CpuFeature as F;
    let k = broadcast_add("f", &[4], &[4]);
    let feats = |t| compile_with(&classify(&[&k]), &t, &Options::default()).unwrap().executable.features;
    assert_eq!(feats(CpuTarget::X86_64), F::Sse2.bit());
    let v2 = feats(CpuTarget::X86_64V2);
    assert!(v2 & F::Sse41.bit() != 0 && v2 & F::Sse42.bit() != 0 && v2 & F::Avx.bit() == 0);
    let v3 = feats(CpuTarget::X86_64V3);
    assert!(v3 & F::Avx2.bit() != 0 && v3 & F::Fma.bit() != 0 && v3 & v2 == v2);
}

/// A root that does not read the innermost output variable (a row sum broadcast along
/// the row) is stored four lanes at a time from one splat; integer data too.
#[test]
fn invariant_root_broadcast() {
    for d in [DType::F32, DType::I32] {
        let ct = ScalarType::of_storage(d);
        let mut b = KernelBuilder::new("bcast_sum", vec![tt(d, &[3, 9])], tt(d, &[3, 9]));
        let i = b.out_index();
        let k = b.new_var(9);
        let kv = b.var(k);
        let l = b.load(0, vec![i[0], kv]);
        let s = b.reduce(ReduceOp::Sum, vec![k], l);
        let kern = b.finish(s).unwrap();
        assert!(notes(&kern, &VEC).contains("innermost output loop"));
        let v = specials(d);
        let x = tensor_bits(d, &[3, 9], &(0..27).map(|j| v[j % v.len()]).collect::<Vec<_>>());
        let _ = ct;
        check(&kern, &[&x], EXACT);
        // A constant root.
        let mut b = KernelBuilder::new("fill", vec![], tt(d, &[2, 7]));
        let c = b.int(ct, 7);
        let kern = b.finish(c).unwrap();
        check(&kern, &[], EXACT);
    }
}
