//! The CUDA target's 8-bit floats (`f8E4M3FN`, `f8E4M3FNUZ`, `f8E5M2`, `f8E5M2FNUZ`)
//! and 4-bit integers (`i4`, `u4`, two a byte): loads, stores and casts
//! (`cuda::expr::lowp`, the general mapping's byte-per-thread form for 4-bit outputs).
//!
//! Every module is assembled by `ptxas -arch=sm_90a -v` (no local memory) and every
//! kernel runs over its whole launch in the host PTX simulator (`kiln-ptxsim`: every
//! global access checked against its binding; each output byte must be written), its
//! output compared byte for byte with the kernel interpreter's (`kiln_ir::lowp`), a NaN
//! code with any NaN code of its type: on every code of each 8-bit type, on f32 inputs
//! at every value of the type, every midpoint (ties to even), one f32 ulp either side
//! of it, the overflow boundary, subnormals and specials, under `saturate` and without,
//! on f64 inputs just off the midpoints (rounded to odd through f32), on integers past
//! the range; and on odd element counts, transposed and padded reads of packed nibbles.

mod ptxas;
use kiln_ptxsim as ptxsim;

use kiln_codegen::cuda;
use kiln_flow::class::classify;
use kiln_flow::{Bounds, Kernel, KernelBuilder, ScalarType};
use kiln_ir::{lowp, DType, Shape, Tensor, TensorType};

const F8S: [DType; 4] = [DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ];

fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).expect("shape"))
}

/// `out[i] = cast(x[i] as `from`, to, saturate)` over `n` elements.
fn cast_kernel(from: DType, to: DType, n: usize, saturate: bool) -> Kernel {
    let name = format!("c_{}_{}_{}_{n}", from.name(), to.name(), if saturate { "sat" } else { "nosat" });
    let mut b = KernelBuilder::new(&name, vec![ty(from, &[n])], ty(to, &[n]));
    let idx = b.out_index();
    let x = b.load(0, idx);
    let r = b.cast(x, to, saturate);
    b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Compiles `kernels` into one module accepted by ptxas with no local memory.
fn build(tag: &str, kernels: &[Kernel]) -> cuda::CudaModule {
    let with: Vec<_> = kernels.iter().map(|k| (k, classify(k))).collect();
    let m = cuda::compile(&with).unwrap_or_else(|e| panic!("{tag}: {e}"));
    let usage = ptxas::assemble_ptx_verbose("cuda-lowp", tag, m.ptx())
        .unwrap_or_else(|e| panic!("{tag}: ptxas refused the module:\n{e}"));
    assert_eq!(usage.len(), kernels.len());
    for (name, u) in &usage {
        assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{tag}: {name} uses local memory: {u:?}");
    }
    m
}

/// Runs entry `i` of `m` on `inputs` and compares its output bytes with the
/// interpreter's (NaN codes as NaN).
fn check(k: &Kernel, m: &cuda::CudaModule, i: usize, inputs: &[Tensor]) {
    let l = m.launches[i];
    let grid = ptxsim::Grid { grid: l.grid as u32, block: l.block, shared: l.shared };
    let (got, want) = ptxsim::run_beside_interpreter(k, k, m.ptx(), i, grid, inputs);
    let (gv, wv) = (got.to_f64_vec(), want.to_f64_vec());
    let xs = inputs[0].to_f64_vec();
    let d = k.output.dtype;
    for j in 0..wv.len() {
        let same = if d.storage_bytes(1) == 1 && !d.is_packed() {
            got.bytes()[j] == want.bytes()[j] || (gv[j].is_nan() && wv[j].is_nan())
        } else {
            gv[j].to_bits() == wv[j].to_bits() || (gv[j].is_nan() && wv[j].is_nan())
        };
        assert!(same, "{}: element {j} (input {:e}): got {:e}, interpreter {:e}", k.name, xs[j], gv[j], wv[j]);
    }
    if d.is_packed() {
        assert_eq!(got.bytes(), want.bytes(), "{}: packed bytes (padding nibble included)", k.name);
    }
}

fn f32s(v: &[f32]) -> Tensor {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::new(ty(DType::F32, &[v.len()]), b.into()).expect("f32")
}

fn f64s(v: &[f64]) -> Tensor {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::new(ty(DType::F64, &[v.len()]), b.into()).expect("f64")
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// f32 inputs that hit every rounding case of 8-bit float `d`: each finite value, each
/// midpoint between neighbours (and past the largest), one f32 ulp either side,
/// both signs, specials, tiny values and random bit patterns.
fn rounding_inputs(d: DType) -> Vec<f32> {
    let mut vals: Vec<f32> = (0..=255u8).map(|c| lowp::decode(d, c)).filter(|x| x.is_finite() && *x >= 0.0).collect();
    vals.sort_by(f32::total_cmp);
    vals.dedup();
    let mut v = Vec::new();
    let top = *vals.last().expect("values");
    let gap = top - vals[vals.len() - 2];
    vals.push(top + gap);
    vals.push(top + 2.0 * gap);
    for w in vals.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        for x in [w[0], mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)] {
            v.push(x);
            v.push(-x);
        }
    }
    v.extend(ptxsim::f32_specials());
    v.extend([1e-30, -1e-30]);
    let mut s = 0x0123_4567_89AB_CDEFu64;
    for _ in 0..20_000 {
        v.push(f32::from_bits(xorshift(&mut s) as u32));
    }
    v
}

#[test]
fn every_f8_code_loads_exactly_and_every_rounding_case_stores_exactly() {
    let mut kernels = Vec::new();
    let mut inputs = Vec::new();
    for d in F8S {
        // Every code, to f32 (and back to the type: a load and a store).
        let codes: Vec<u8> = (0..=255u8).collect();
        let t = Tensor::from_codes(d, Shape::new(vec![256]).expect("shape"), &codes).expect("codes");
        kernels.push(cast_kernel(d, DType::F32, 256, true));
        inputs.push(t.clone());
        kernels.push(cast_kernel(d, d, 256, false));
        inputs.push(t);
        let xs = rounding_inputs(d);
        for sat in [true, false] {
            kernels.push(cast_kernel(DType::F32, d, xs.len(), sat));
            inputs.push(f32s(&xs));
        }
        // f64 just off each midpoint, below f32's resolution: rounded to odd on the way.
        let ds: Vec<f64> = xs
            .iter()
            .filter(|x| x.is_finite())
            .flat_map(|&x| [f64::from(x), f64::from(x) * (1.0 + 2f64.powi(-40)), f64::from(x) * (1.0 - 2f64.powi(-40))])
            .chain([f64::MAX, -f64::MAX, 1e-300, -1e-300, f64::NAN, f64::INFINITY])
            .collect();
        for sat in [true, false] {
            kernels.push(cast_kernel(DType::F64, d, ds.len(), sat));
            inputs.push(f64s(&ds));
        }
        // Integers past every range, and f16 (through f32), to the type.
        let ints: Vec<i64> = [
            0,
            1,
            -1,
            7,
            17,
            255,
            449,
            465,
            479,
            481,
            57343,
            57344,
            61439,
            61440,
            61441,
            1 << 24,
            (1 << 24) + 1,
            i64::MAX,
            i64::MIN,
        ]
        .into_iter()
        .flat_map(|x: i64| [x, x.wrapping_neg()])
        .collect();
        for it in [DType::I32, DType::I64, DType::U64, DType::U8, DType::I16] {
            let t = Tensor::from_i64(it, Shape::new(vec![ints.len()]).expect("shape"), &ints).expect("ints");
            for sat in [true, false] {
                kernels.push(cast_kernel(it, d, ints.len(), sat));
                inputs.push(t.clone());
            }
        }
        let hs: Vec<f64> = (0..2048).map(|i| f64::from(i as f32 * 37.5 - 38400.0)).collect();
        kernels.push(cast_kernel(DType::F16, d, hs.len(), false));
        inputs.push(Tensor::from_f64(DType::F16, Shape::new(vec![hs.len()]).expect("shape"), &hs).expect("f16"));
    }
    let m = build("f8", &kernels);
    for (i, (k, t)) in kernels.iter().zip(&inputs).enumerate() {
        check(k, &m, i, std::slice::from_ref(t));
    }
}

#[test]
fn nibbles_load_store_and_cast_two_to_a_byte() {
    let mut kernels = Vec::new();
    let mut inputs: Vec<Tensor> = Vec::new();
    for d in [DType::I4, DType::U4] {
        // Every code at both nibble positions, odd counts, to i32, f32 and back.
        for n in [1usize, 7, 32, 33, 1001] {
            let codes: Vec<u8> = (0..n).map(|i| ((i * 7 + 3) % 16) as u8).collect();
            let t = Tensor::from_codes(d, Shape::new(vec![n]).expect("shape"), &codes).expect("codes");
            for to in [DType::I32, DType::F32, d, DType::I8] {
                kernels.push(cast_kernel(d, to, n, true));
                inputs.push(t.clone());
            }
        }
        // Floats: ties, out of range, NaN, ±∞, −0; odd counts.
        let mut xs: Vec<f32> = (-40..=40).map(|i| i as f32 * 0.25).collect();
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -0.0,
            1e30,
            -1e30,
            7.5,
            8.5,
            15.5,
            16.5,
            -8.5,
            -7.5,
            0.49999997,
        ]);
        kernels.push(cast_kernel(DType::F32, d, xs.len(), true));
        inputs.push(f32s(&xs));
        let ds: Vec<f64> = xs.iter().map(|&x| f64::from(x)).chain([0.5 + 1e-12, 2.5 - 1e-12, 7.5 + 1e-13]).collect();
        kernels.push(cast_kernel(DType::F64, d, ds.len(), true));
        inputs.push(f64s(&ds));
        let ints: Vec<i64> = vec![0, 1, -1, 7, 8, -8, -9, 15, 16, 300, -300, i64::MAX, i64::MIN, 5];
        for it in [DType::I32, DType::I64, DType::U64, DType::U8, DType::I8] {
            let t = Tensor::from_i64(it, Shape::new(vec![ints.len()]).expect("shape"), &ints).expect("ints");
            kernels.push(cast_kernel(it, d, ints.len(), true));
            inputs.push(t);
        }
        // A transpose of a packed 3×5 (nibbles at computed indices), and a padded read.
        let codes: Vec<u8> = (0..15u8).collect();
        let t = Tensor::from_codes(d, Shape::new(vec![3, 5]).expect("shape"), &codes).expect("codes");
        let mut b = KernelBuilder::new(format!("t_{}", d.name()), vec![ty(d, &[3, 5])], ty(d, &[5, 3]));
        let idx = b.out_index();
        let x = b.load(0, vec![idx[1], idx[0]]);
        kernels.push(b.finish(x).expect("transpose"));
        inputs.push(t.clone());
        let ct = ScalarType::of_storage(d);
        let mut b = KernelBuilder::new(format!("p_{}", d.name()), vec![ty(d, &[3, 5])], ty(d, &[4, 7]));
        let idx = b.out_index();
        let one = b.index(1);
        let i = b.sub(idx[0], one);
        let j = b.sub(idx[1], one);
        let x = b.load_with(0, vec![i, j], Bounds::Pad(ct.bits_of_i64(5)));
        kernels.push(b.finish(x).expect("padded"));
        inputs.push(t);
    }
    let m = build("nibbles", &kernels);
    for (i, (k, t)) in kernels.iter().zip(&inputs).enumerate() {
        if kiln_codegen::cuda::expr::is_nibble(k.output.dtype) {
            assert_eq!(m.notes[i], "general (4-bit output: a thread per byte)", "{}", k.name);
        }
        check(k, &m, i, std::slice::from_ref(t));
    }
}

#[test]
fn random_kernels_over_low_precision_types_match_the_interpreter() {
    // The simulator's random inputs (with NaN, ±∞, −0) through each type and back.
    let mut kernels = Vec::new();
    for d in F8S.into_iter().chain([DType::I4, DType::U4]) {
        for (from, to) in [(d, DType::F32), (DType::F32, d), (d, d)] {
            kernels.push(cast_kernel(from, to, 37, false));
            kernels.push(cast_kernel(from, to, 37, true));
        }
    }
    let m = build("random", &kernels);
    for (i, k) in kernels.iter().enumerate() {
        let l = m.launches[i];
        let c = ptxsim::Check { ints: (-20, 20), ..ptxsim::Check::exact(i as u64 + 3) };
        c.plain_and_specials(k, m.ptx(), i, ptxsim::Grid::of(l.grid, l.block, l.shared))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}
