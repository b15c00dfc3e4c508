//! What the tensor-core suites (`tests/cuda_mma.rs`, `tests/cuda_wgmma.rs`) share:
//! their half-operand kernels, inputs exact in either half type, a run of an entry in
//! the host simulator beside the interpreter, and `ptxas -v` with no local memory.
//! Included by those suites only (`#[path]`): it uses their `ptxas` and `ptxsim`
//! modules.

use kiln_flow::{BinaryOp, Kernel, KernelBuilder, ScalarType};
use kiln_ir::DType;

use super::common::{ty, Conv, MatMul};
use super::{ptxas, ptxsim};

/// `out[.., m, n] = epi(Σ_k a[.., m, k] · w[.., k, n])` with both operands stored as
/// `dt` (`adt` for `a`): `a` transposed when `a_t`; batch dims on either operand.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    (adt, dt): (DType, DType),
    batch: &[usize],
    batched: (bool, bool),
    (m, k, n): (usize, usize, usize),
    a_t: bool,
    bias_relu: bool,
    out_dt: DType,
) -> Kernel {
    let mm = MatMul { batch, batched, mkn: (m, k, n), a_t, dtypes: (adt, dt) };
    let mut ins = mm.inputs();
    if bias_relu {
        ins.push(ty(dt, &[m]));
    }
    let name = format!(
        "hmm_{}_{}_{}_{m}_{k}_{n}_{}{}",
        adt.name(),
        dt.name(),
        batch.len(),
        u8::from(a_t),
        u8::from(bias_relu)
    );
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

/// A convolution `c` over an already padded NCHW input stored as `dt`, with a bias.
pub fn conv(dt: DType, c: Conv) -> Kernel {
    let Conv { n, channels: (ci, co), hw: (h, w), window: (kh, _), stride: s, groups: g, .. } = c;
    let mut ins = c.inputs().map(|d| ty(dt, &d)).to_vec();
    ins.push(ty(dt, &[co]));
    let name = format!("hconv_{}_{n}_{ci}_{co}_{h}x{w}_{kh}_s{s}_g{g}", dt.name());
    let mut kb = KernelBuilder::new(name, ins, ty(dt, &c.out()));
    let (sum, oc, _) = c.sum(&mut kb);
    let b = kb.load(2, vec![oc]);
    let yv = kb.add(sum, b);
    kb.finish(yv).expect("conv kernel")
}

/// Inputs of `k` exactly representable in f16 and bf16 (multiples of 1/64 in [-2, 2):
/// at most 8 significant bits), so the products are exact in f32 whatever the type.
pub fn inputs_of(k: &Kernel, seed: u64) -> Vec<kiln_ir::Tensor> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    k.inputs
        .iter()
        .map(|t| {
            let v: Vec<f64> = (0..t.shape.numel()).map(|_| (next() % 256) as f64 / 64.0 - 2.0).collect();
            kiln_ir::Tensor::from_f64(t.dtype, t.shape.clone(), &v).expect("tensor")
        })
        .collect()
}

/// `k`'s entry of `ptx` run by the host simulator over `launch` on the inputs of `seed`
/// ([`inputs_of`]), the output starting as NaN bit patterns (an element never written
/// shows): `(got, want)`, by flat offset, `want` the kernel interpreter's.
pub fn simulated(k: &Kernel, ptx: &str, launch: ptxsim::Grid, seed: u64) -> (Vec<f64>, Vec<f64>) {
    let ins = inputs_of(k, seed);
    let refs: Vec<&kiln_ir::Tensor> = ins.iter().collect();
    let want = kiln_flow::interp::run(k, &refs).expect("interpreter");
    let entry = ptxsim::parse_named(ptx, &k.name).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let mut data: Vec<Vec<u8>> = ins.iter().map(|t| t.bytes().to_vec()).collect();
    data.push(vec![0xFF; k.output.dtype.storage_bytes(k.output.shape.numel())]);
    let mut g = ptxsim::Global::new(data);
    ptxsim::run(&entry, launch, &mut g, ptxsim::Limits::default()).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let got = kiln_ir::Tensor::new(k.output.clone(), g.bufs[k.inputs.len()].clone().into()).expect("output");
    (got.to_f64_vec(), want.to_f64_vec())
}

/// `ptx` assembled by `ptxas -arch=sm_90a -v` (`suite`, `tag` name the files), each
/// entry's usage printed and checked: no stack frame, no spills. Returns the usages.
pub fn assemble_without_spills(suite: &str, tag: &str, ptx: &str) -> Vec<(String, ptxas::Usage)> {
    let res = ptxas::assemble_ptx_verbose(suite, tag, ptx).unwrap_or_else(|e| panic!("ptxas {tag}: {e}"));
    for (name, u) in &res {
        eprintln!("{tag} {name}: {} registers", u.registers);
        assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{tag} {name}: stack or spills: {u:?}");
    }
    res
}
