//! Rough single-thread timings of generated code (ignored by default; run with
//! `cargo test -p kiln-codegen --test bench -- --ignored --nocapture`).

mod common;

use std::time::Instant;

use common::{in_order, random_f32, row_reduce, softmax};
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
use kiln_flow::{Kernel, KernelBuilder, ReduceOp};
use kiln_ir::{DType, Tensor};
use kiln_runtime::cpu::helpers::HELPERS;
use kiln_runtime::cpu::loader::LoadedCode;

fn time(k: &Kernel, inputs: &[&Tensor], opts: &Options) -> f64 {
    let m = compile_with(&classify(&[k]), &CpuTarget::Host, opts).unwrap();
    let code = LoadedCode::load(&m.executable.code, &m.executable.relocs).unwrap();
    let entry = code.entry(m.executable.entries[0].1).unwrap();
    let mut bufs: Vec<Vec<u8>> = inputs.iter().map(|t| t.bytes().to_vec()).collect();
    bufs.push(vec![0u8; k.output.storage_bytes()]);
    let ptrs: Vec<*mut u8> = bufs.iter_mut().map(|b| b.as_mut_ptr()).collect();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        // SAFETY (bench): bindings of the kernel's types.
        unsafe { entry(ptrs.as_ptr(), HELPERS.as_ptr(), 0, m.workgroups[0]) };
        best = best.min(t.elapsed().as_secs_f64());
    }
    best
}

#[test]
#[ignore]
fn bench() {
    let (r, c) = (1024, 4096);
    let a = random_f32(&[r, c], 1.0, 1);
    let b2 = random_f32(&[r, c], 1.0, 2);
    let mut b = KernelBuilder::new("add", vec![a.ty().clone(), a.ty().clone()], a.ty().clone());
    let i = b.out_index();
    let x = b.load(0, i.clone());
    let y = b.load(1, i);
    let s = b.add(x, y);
    let add = b.finish(s).unwrap();

    let rowsum = row_reduce("rowsum", a.ty().clone(), DType::F32, ReduceOp::Sum);

    let sm_in = random_f32(&[1024, 1024], 4.0, 3);
    let softmax = softmax(1024, 1024);

    let n = 256;
    let ma = random_f32(&[n, n], 1.0, 4);
    let mut b = KernelBuilder::new("matmul", vec![ma.ty().clone(), ma.ty().clone()], ma.ty().clone());
    let (_, s) = b.matmul_sum(n);
    let matmul = b.finish(s).unwrap();

    let t_in = random_f32(&[2048, 2048], 1.0, 5);
    let mut b = KernelBuilder::new("transpose", vec![t_in.ty().clone()], t_in.ty().clone());
    let i = b.out_index();
    let l = b.load(0, vec![i[1], i[0]]);
    let transpose = b.finish(l).unwrap();

    for (name, opts) in [("scalar", in_order(false, false)), ("vector", Options::default())] {
        let t = time(&add, &[&a, &b2], &opts);
        println!("{name} add 1024x4096: {:.2} ms, {:.1} GB/s", t * 1e3, 3.0 * 16.0 * 1024.0 * 1024.0 / t / 1e9);
        let t = time(&rowsum, &[&a], &opts);
        println!("{name} rowsum 1024x4096: {:.2} ms, {:.1} GB/s", t * 1e3, 16.0 * 1024.0 * 1024.0 / t / 1e9);
        let t = time(&softmax, &[&sm_in], &opts);
        println!("{name} softmax 1024x1024: {:.2} ms, {:.1} ns/element", t * 1e3, t * 1e9 / (1024.0 * 1024.0));
        let t = time(&matmul, &[&ma, &ma], &opts);
        println!("{name} matmul 256^3: {:.2} ms, {:.2} GFLOP/s", t * 1e3, 2.0 * 256f64.powi(3) / t / 1e9);
        let t = time(&transpose, &[&t_in], &opts);
        println!("{name} transpose 2048^2: {:.2} ms, {:.1} GB/s", t * 1e3, 2.0 * 16.0 * 1024.0 * 1024.0 / t / 1e9);
    }
}
