//! The Hopper path of the CUDA Contraction emitter (`cuda::wgmma`): half operands on
//! `wgmma.mma_async.m64nNk16` from shared memory through matrix descriptors.

mod common;
mod ptxas;
mod ptxsim;

use common::{ty, Conv, MatMul};
use kiln_codegen::cuda;
use kiln_codegen::cuda::wgmma::shared_bytes;
use kiln_flow::class::KernelClass;
use kiln_flow::{BinaryOp, Kernel, KernelBuilder, ScalarType};
use kiln_ir::DType;

/// `out[.., m, n] = epi(Σ_k a[.., m, k] · w[.., k, n])`, both operands `dt`.
fn matmul(
    dt: DType,
    batch: &[usize],
    batched: (bool, bool),
    (m, k, n): (usize, usize, usize),
    a_t: bool,
    bias_relu: bool,
    out_dt: DType,
) -> Kernel {
    let mm = MatMul { batch, batched, mkn: (m, k, n), a_t, dtypes: (dt, dt) };
    let mut ins = mm.inputs();
    if bias_relu {
        ins.push(ty(dt, &[m]));
    }
    let name = format!("wg_{}_{}_{m}_{k}_{n}_{}{}", dt.name(), batch.len(), u8::from(a_t), u8::from(bias_relu));
    let mut kb = KernelBuilder::new(name, ins, ty(out_dt, &mm.out()));
    let (mut y, row, _) = mm.sum(&mut kb);
    if bias_relu {
        let b = kb.load(2, vec![row]);
        let s = kb.add(y, b);
        let z = kb.float(ScalarType::F32, 0.0);
        y = kb.binary(BinaryOp::Max, s, z);
    }
    kb.finish(y).expect("matmul kernel")
}

/// A 4096³ bf16 product: the kernel the ≥ 600 TFLOP/s target is measured on (the lead
/// runs it on the GPU): 128×256 tiles, 512 blocks, both operands cp.async.
#[test]
fn a_4096_cubed_bf16_product() {
    let h = DType::BF16;
    let k = matmul(h, &[], (false, false), (4096, 4096, 4096), false, false, h);
    let m = cuda::compile(&[(&k, KernelClass::Contraction)]).expect("compile");
    if let Ok(path) = std::env::var("KILN_DUMP_PTX") {
        std::fs::write(path, m.ptx()).expect("write the PTX");
    }
    let note = &m.notes[0];
    assert!(note.starts_with("contraction wgmma m64n256k16 bf16 (128x256 tile"), "{note}");
    assert!(note.contains("A k-major, B mn-major"), "{note}");
    assert_eq!(m.launches[0].grid, 32 * 16);
    assert_eq!((m.launches[0].block, m.launches[0].shared), (256, shared_bytes(128, 256)));
    let res = ptxas::assemble_ptx_verbose("cuda-wgmma", "4096", m.ptx()).unwrap_or_else(|e| panic!("ptxas: {e}"));
    let u = res[0].1;
    eprintln!("4096³ bf16: {u:?}, {} bytes shared", shared_bytes(128, 256));
    assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0));
}
