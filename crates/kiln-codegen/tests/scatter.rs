//! Scatter kernels (`kiln_flow::kernel`'s "Scatter kernels": each point of a domain
//! stores at a position computed from an index tensor) on both targets, against the
//! kernel interpreter bit for bit: every combination (none, add, mul, max, min; or/and
//! on bool) on f32, f64, i32, i64, u8 and bool, domains of rank 0 to 2 and odd extents,
//! indices with duplicates, negatives and positions outside the output (which must
//! write nothing: the CPU runs write into guard zones that must stay intact).
//!
//! CPU: compiled under every configuration (`common::check`), and once more with input
//! 0 and the output the same bytes (the planner's in-place placement: no copy).
//! CUDA: the one-block mapping (`cuda::general::emit_scatter`) assembled by `ptxas`
//! and run in the PTX simulator over its whole launch on random inputs (indices in
//! −9..=9 against outputs of 6 to 35 elements), with NaN and infinities among the
//! floats.

mod common;
mod ptxas;
use kiln_ptxsim as ptxsim;

use common::*;
use kiln_codegen::cpu::{classify, compile_with};
use kiln_codegen::cuda;
use kiln_flow::class::KernelClass;
use kiln_flow::{interp, BinaryOp, Kernel, KernelBuilder};
use kiln_ir::{DType, Shape, Tensor, TensorType};
use kiln_runtime::cpu::helpers::HELPERS;
use kiln_runtime::cpu::loader::LoadedCode;

fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
}

/// A scatter of updates of dims `domain` into `out` dims: each point reads a flat
/// position from an i64 index tensor of the domain's dims (a negative one wrapped once
/// as ONNX does, then stored as is: the kernel drops what lies outside).
fn scatter(name: &str, d: DType, out: &[usize], domain: &[usize], combine: Option<BinaryOp>) -> Kernel {
    let mut b = KernelBuilder::new(name, vec![ty(d, out), ty(DType::I64, domain), ty(d, domain)], ty(d, out));
    let dom: Vec<u64> = domain.iter().map(|&x| x as u64).collect();
    let u = b.scatter_domain(&dom);
    let raw = b.load(1, u.clone());
    let z = b.index(0);
    let neg = b.binary(BinaryOp::Lt, raw, z);
    let n: usize = out.iter().product();
    let nn = b.index(n as i64);
    let up = b.add(raw, nn);
    let at = b.select(neg, up, raw);
    let v = b.load(2, u);
    b.finish_scatter(v, at, combine).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Every kernel the tests run.
fn kernels() -> Vec<Kernel> {
    let shapes: [(&[usize], &[usize]); 4] = [(&[6], &[]), (&[2, 3], &[5]), (&[5, 7], &[3, 4]), (&[35], &[1, 9])];
    let mut ks = Vec::new();
    for (si, (out, domain)) in shapes.iter().enumerate() {
        for d in [DType::F32, DType::F64, DType::I32, DType::I64, DType::U8, DType::Bool] {
            let ops: Vec<Option<BinaryOp>> = if d == DType::Bool {
                vec![None, Some(BinaryOp::Or), Some(BinaryOp::And)]
            } else {
                vec![None, Some(BinaryOp::Add), Some(BinaryOp::Mul), Some(BinaryOp::Max), Some(BinaryOp::Min)]
            };
            for op in ops {
                let tag = op.map_or("none", |o| o.name());
                ks.push(scatter(&format!("sc{si}_{}_{tag}", d.name()), d, out, domain, op));
            }
        }
    }
    ks
}

/// Indices with duplicates, negatives and positions outside `0..numel` (and outside
/// after wrapping), as an i64 tensor of `dims`.
fn indices(dims: &[usize], numel: usize, seed: u64) -> Tensor {
    let mut r = Rng(seed | 1);
    let n: usize = dims.iter().product();
    let span = 2 * numel as u64 + 6;
    let v: Vec<i64> = (0..n).map(|_| (r.next() % span) as i64 - numel as i64 - 3).collect();
    Tensor::from_i64(DType::I64, Shape::new(dims.to_vec()).unwrap(), &v).unwrap()
}

fn values(t: &TensorType, seed: u64) -> Tensor {
    let mut r = Rng(seed | 1);
    let n = t.shape.numel();
    if t.dtype.is_float() {
        let v: Vec<f64> = (0..n).map(|_| (r.unit() * 8.0).round() / 4.0).collect();
        Tensor::from_f64(t.dtype, t.shape.clone(), &v).unwrap()
    } else {
        let hi = if t.dtype == DType::Bool { 2 } else { 7 };
        let v: Vec<i64> = (0..n).map(|_| (r.next() % hi) as i64).collect();
        Tensor::from_i64(t.dtype, t.shape.clone(), &v).unwrap()
    }
}

fn inputs(k: &Kernel, seed: u64) -> Vec<Tensor> {
    vec![
        values(&k.inputs[0], seed),
        indices(k.inputs[1].shape.dims(), k.output.shape.numel(), seed + 1),
        values(&k.inputs[2], seed + 2),
    ]
}

#[test]
fn scatters_run_on_the_cpu_as_the_interpreter_says() {
    for (i, k) in kernels().iter().enumerate() {
        assert_eq!(kiln_flow::class::classify(k), KernelClass::Movement);
        let ins = inputs(k, i as u64 * 7 + 1);
        let refs: Vec<&Tensor> = ins.iter().collect();
        check(k, &refs, EXACT);
    }
}

/// Input 0 and the output the same bytes: the kernel skips the copy and updates them.
#[test]
fn scatters_update_in_place_on_the_cpu() {
    let cfg = &configs()[0];
    for (i, k) in kernels().iter().enumerate() {
        let ins = inputs(k, i as u64 * 11 + 3);
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = interp::run(k, &refs).unwrap();
        let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
        assert_eq!(m.workgroups[0], 1, "{}: one workgroup", k.name);
        let exe = &m.executable;
        let code = LoadedCode::load(&exe.code, &exe.relocs).unwrap();
        let entry = code.entry(exe.entries[0].1).unwrap();
        let mut data = ins[0].bytes().to_vec();
        let mut idx = ins[1].bytes().to_vec();
        let mut upd = ins[2].bytes().to_vec();
        let bindings: Vec<*mut u8> = vec![data.as_mut_ptr(), idx.as_mut_ptr(), upd.as_mut_ptr(), data.as_mut_ptr()];
        // SAFETY (test): live buffers of the kernel's types in binding order (input 0 and
        // the output the same bytes, as the planner places them); the runtime's helpers.
        unsafe { entry(bindings.as_ptr(), HELPERS.as_ptr(), 0, 1) };
        let got = Tensor::new(k.output.clone(), data.into()).unwrap();
        if let Err(e) = compare(&got, &want, EXACT) {
            panic!("{} in place: {e}", k.name);
        }
    }
}

#[test]
fn scatters_run_on_cuda_as_the_interpreter_says() {
    let ks = kernels();
    let with_class: Vec<(&Kernel, KernelClass)> = ks.iter().map(|k| (k, KernelClass::Movement)).collect();
    let m = cuda::compile(&with_class).unwrap_or_else(|e| panic!("{e}"));
    if let Err(e) = ptxas::assemble_ptx("scatter", "scatter", m.ptx()) {
        panic!("ptxas refused the scatters:\n{e}");
    }
    for (i, k) in ks.iter().enumerate() {
        assert!(m.notes[i].starts_with("scatter"), "{}: {}", k.name, m.notes[i]);
        let l = m.launches[i];
        assert_eq!(l.grid, 1, "{}: one block", k.name);
        let c = ptxsim::Check { ints: (-9, 9), ..ptxsim::Check::exact(i as u64 + 5) };
        let launch = ptxsim::Grid::of(l.grid, l.block, l.shared);
        if let Err(e) = c.plain_and_specials(k, m.ptx(), i, launch) {
            panic!("{e}");
        }
    }
}
