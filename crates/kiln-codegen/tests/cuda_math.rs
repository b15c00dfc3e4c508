//! Accuracy of the CUDA target's transcendental sequences (`cuda::expr::math`): `log`,
//! `pow`, `asin`, `acos`, `atan` in f32, and `log`, `exp`, `pow` in f64.
//!
//! These sequences use only operations that round once (`.rn` arithmetic, `fma.rn`,
//! exact conversions, bit manipulation) and no `.approx` instruction, so the host PTX
//! simulator (`kiln-ptxsim`) computes exactly what the GPU computes: the errors
//! measured here are the GPU's. Each kernel (`out[i] = op(in[i])`, assembled by
//! `ptxas -arch=sm_90a -v` with no local memory) runs over dense sweeps of inputs, and
//! each element is compared with an independent reference: Rust's f64 `ln`, `powf`,
//! `asin`, `acos`, `atan` rounded to f32 (within 1 ulp of the exact value's rounding,
//! measured in units of the f32 result), and, for special values (±0, ±∞, NaN, values
//! out of the domain, subnormals), the kernel interpreter's `libm` values exactly.

mod ptxas;
use kiln_ptxsim as ptxsim;

use kiln_codegen::cuda;
use kiln_flow::class::classify;
use kiln_flow::{interp, BinaryOp, Kernel, KernelBuilder, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn ty(d: DType, n: usize) -> TensorType {
    TensorType::new(d, Shape::new(vec![n]).expect("shape"))
}

/// `out[i] = op(x[i])` (unary) or `op(x[i], y[i])` (binary) over `n` elements of `d`.
fn kernel(name: &str, d: DType, n: usize, op: Result<UnaryOp, BinaryOp>) -> Kernel {
    let arity = if op.is_ok() { 1 } else { 2 };
    let mut b = KernelBuilder::new(name, vec![ty(d, n); arity], ty(d, n));
    let idx = b.out_index();
    let x = b.load(0, idx.clone());
    let r = match op {
        Ok(u) => b.unary(u, x),
        Err(bo) => {
            let y = b.load(1, idx);
            b.binary(bo, x, y)
        }
    };
    b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The module of `k`, assembled by ptxas with no stack frame or spills.
fn build(k: &Kernel) -> cuda::CudaModule {
    let m = cuda::compile(&[(k, classify(k))]).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let usage = ptxas::assemble_ptx_verbose("cuda-math", &k.name, m.ptx())
        .unwrap_or_else(|e| panic!("{}: ptxas refused the module:\n{e}", k.name));
    for (name, u) in &usage {
        assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{name} uses local memory: {u:?}");
    }
    m
}

/// Runs `k`'s module (entry 0, its whole launch) on `inputs`; the output's bytes.
fn simulate(k: &Kernel, m: &cuda::CudaModule, inputs: &[Tensor]) -> Vec<u8> {
    let e = ptxsim::parse(m.ptx(), 0).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let mut bufs: Vec<Vec<u8>> = inputs.iter().map(|t| t.bytes().to_vec()).collect();
    bufs.push(vec![0xA5; k.output.storage_bytes()]);
    let mut g = ptxsim::Global::new(bufs);
    let l = m.launches[0];
    let grid = ptxsim::Grid { grid: l.grid as u32, block: l.block, shared: l.shared };
    let lim = ptxsim::Limits { total: u64::MAX, ..ptxsim::Limits::default() };
    ptxsim::run(&e, grid, &mut g, lim).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    assert!(g.written.pop().expect("the output").iter().all(|&w| w), "{}: an element never written", k.name);
    g.bufs.pop().expect("the output")
}

fn f32s(t: &[f32]) -> Tensor {
    let b: Vec<u8> = t.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::new(ty(DType::F32, t.len()), b.into()).expect("f32 tensor")
}

fn f64s(t: &[f64]) -> Tensor {
    let b: Vec<u8> = t.iter().flat_map(|x| x.to_le_bytes()).collect();
    Tensor::new(ty(DType::F64, t.len()), b.into()).expect("f64 tensor")
}

fn as_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn as_f64(b: &[u8]) -> Vec<f64> {
    b.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes"))).collect()
}

/// Distance in f32 ulps (on the ordered integer line; −0 and +0 are 0 apart).
fn ulps32(a: f32, b: f32) -> u64 {
    let ord = |x: f32| {
        let b = x.to_bits() as i32;
        i64::from(if b < 0 { i32::MIN.wrapping_sub(b) } else { b })
    };
    (ord(a) - ord(b)).unsigned_abs()
}

fn ulps64(a: f64, b: f64) -> u64 {
    let ord = |x: f64| {
        let b = x.to_bits() as i64;
        i128::from(if b < 0 { i64::MIN.wrapping_sub(b) } else { b })
    };
    (ord(a) - ord(b)).unsigned_abs() as u64
}

/// Every pair `(x, y)` of `values`, as the two operands' columns.
fn every_pair<T: Copy>(values: &[T]) -> (Vec<T>, Vec<T>) {
    values.iter().flat_map(|&x| values.iter().map(move |&y| (x, y))).unzip()
}

/// `n` operand pairs, the `i`th `draw(i, s)` of the generator state `s`.
fn draw_pairs<T>(s: &mut u64, n: usize, mut draw: impl FnMut(usize, &mut u64) -> (T, T)) -> (Vec<T>, Vec<T>) {
    (0..n).map(|i| draw(i, s)).unzip()
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// The largest ulp distance of `got` from `want` (same NaN-ness and infinities
/// required), with the worst input.
fn worst32(what: &str, inputs: &[f32], got: &[f32], want: impl Fn(usize) -> f32) -> u64 {
    let mut worst = (0, 0usize);
    for (i, &g) in got.iter().enumerate() {
        let w = want(i);
        if w.is_nan() || g.is_nan() {
            assert!(w.is_nan() && g.is_nan(), "{what}({:e}): got {g:e}, want {w:e}", inputs[i]);
            continue;
        }
        let u = ulps32(g, w);
        if u > worst.0 {
            worst = (u, i);
        }
    }
    eprintln!(
        "{what}: {} inputs, worst {} ulp at {:e} (input {}: got {:e}, want {:e})",
        got.len(),
        worst.0,
        inputs[worst.1],
        worst.1,
        got[worst.1],
        want(worst.1)
    );
    worst.0
}

/// Every input compared with the kernel interpreter (libm): special results exactly.
fn exact_against_interpreter(k: &Kernel, m: &cuda::CudaModule, inputs: &[Tensor]) {
    near_interpreter(k, m, inputs, 1);
}

/// `op` of every f32 special value against the interpreter ([`exact_against_interpreter`]).
fn specials_exact(op: UnaryOp) {
    let sp = ptxsim::f32_specials();
    let k = kernel(&format!("{}_specials", op.name()), DType::F32, sp.len(), Ok(op));
    exact_against_interpreter(&k, &build(&k), &[f32s(&sp)]);
}

/// [`exact_against_interpreter`] with other values within `ulps` of libm's.
fn near_interpreter(k: &Kernel, m: &cuda::CudaModule, inputs: &[Tensor], ulps: u64) {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let want = interp::run(k, &refs).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let got = simulate(k, m, inputs);
    let w = want.to_f64_vec();
    let g = Tensor::new(k.output.clone(), got.into()).expect("output").to_f64_vec();
    let xs: Vec<Vec<f64>> = inputs.iter().map(Tensor::to_f64_vec).collect();
    for i in 0..w.len() {
        let args: Vec<f64> = xs.iter().map(|x| x[i]).collect();
        // Zeros (with their sign), infinities and NaN exactly; other values within
        // `ulps` of libm's (itself within an ulp of the exact value).
        let ordinary = w[i].is_finite() && w[i] != 0.0 && g[i].is_finite() && g[i] != 0.0;
        let ok = if ordinary {
            let u = if k.output.dtype == DType::F32 { ulps32(g[i] as f32, w[i] as f32) } else { ulps64(g[i], w[i]) };
            u <= ulps
        } else {
            (w[i].is_nan() && g[i].is_nan()) || w[i].to_bits() == g[i].to_bits()
        };
        assert!(ok, "{}{args:?}: got {:e}, interpreter {:e}", k.name, g[i], w[i]);
    }
}

/// Inputs for `log`: every f32 of [0.5, 2) with a stride of 5 (3.4M, every mantissa
/// residue), random positive bit patterns over every exponent and the subnormals.
fn log_inputs() -> Vec<f32> {
    let mut v: Vec<f32> = (0x3F00_0000u32..0x4000_0000).step_by(5).map(f32::from_bits).collect();
    let mut s = 0x1234_5678_9ABC_DEF1u64;
    for _ in 0..400_000 {
        v.push(f32::from_bits((xorshift(&mut s) as u32) & 0x7F7F_FFFF));
    }
    for _ in 0..50_000 {
        v.push(f32::from_bits((xorshift(&mut s) as u32) & 0x007F_FFFF));
    }
    v
}

#[test]
fn f32_log_is_within_one_ulp_over_its_whole_range() {
    let xs = log_inputs();
    let k = kernel("log_f32", DType::F32, xs.len(), Ok(UnaryOp::Log));
    let m = build(&k);
    assert!(!m.ptx().contains("approx"), "log uses an approximate instruction");
    let got = as_f32(&simulate(&k, &m, &[f32s(&xs)]));
    let worst = worst32("log f32", &xs, &got, |i| (f64::from(xs[i])).ln() as f32);
    assert!(worst <= 1, "log f32: {worst} ulp");
    // log(1 + tiny), where an absolute error bound is no bound at all.
    let near: Vec<f32> =
        (1..20_000u32).flat_map(|j| [f32::from_bits(0x3F80_0000 + j), f32::from_bits(0x3F80_0000 - j)]).collect();
    let k = kernel("log_near1", DType::F32, near.len(), Ok(UnaryOp::Log));
    let m = build(&k);
    let got = as_f32(&simulate(&k, &m, &[f32s(&near)]));
    let worst = worst32("log f32 near 1", &near, &got, |i| (f64::from(near[i])).ln() as f32);
    assert!(worst <= 1, "log f32 near 1: {worst} ulp");
    specials_exact(UnaryOp::Log);
}

#[test]
fn f32_pow_is_correctly_rounded_on_sweeps_and_exact_on_special_values() {
    let mut s = 0xDEAD_BEEF_0123_4567u64;
    let (xs, ys) = draw_pairs(&mut s, 300_000, |i, s| {
        let r = xorshift(s);
        match i % 4 {
            // Bases near 1 to large powers (where log's relative error is all).
            0 => (1.0 + ((r & 0xFFFF) as f32 - 32768.0) * 2f32.powi(-22), ((r >> 20) % 200_000) as f32 - 100_000.0),
            // Any positive base, powers that keep the result in range.
            1 => {
                let x = f32::from_bits(((r as u32) & 0x3FFF_FFFF) + 0x0080_0000);
                let lx = f64::from(x).log2().abs().max(1.0);
                (x, (((r >> 32) % 2001) as f64 / 1000.0 - 1.0) as f32 * (120.0 / lx) as f32)
            }
            // Negative bases to integer powers.
            2 => (-(((r & 0xFFFF) as f32) / 4096.0 + 0.01), ((r >> 24) % 41) as f32 - 20.0),
            // Small integers and halves.
            _ => (((r & 0xFF) as f32) / 16.0, (((r >> 16) % 33) as f32 - 16.0) / 2.0),
        }
    });
    let k = kernel("pow_f32", DType::F32, xs.len(), Err(BinaryOp::Pow));
    let m = build(&k);
    assert!(!m.ptx().contains("approx"), "pow uses an approximate instruction");
    let got = as_f32(&simulate(&k, &m, &[f32s(&xs), f32s(&ys)]));
    let worst = worst32("pow f32", &xs, &got, |i| f64::from(xs[i]).powf(f64::from(ys[i])) as f32);
    assert!(worst <= 1, "pow f32: {worst} ulp");
    // Every pair of special values against libm's powf.
    let (xs, ys) = every_pair(&ptxsim::f32_specials());
    let k = kernel("pow_specials", DType::F32, xs.len(), Err(BinaryOp::Pow));
    exact_against_interpreter(&k, &build(&k), &[f32s(&xs), f32s(&ys)]);
}

#[test]
fn f64_exp_and_log_are_within_a_few_ulp() {
    let mut s = 0x0F0F_1234_5678_9ABCu64;
    let mut xs: Vec<f64> = (0..200_000).map(|_| (xorshift(&mut s) as f64 / u64::MAX as f64) * 1400.0 - 700.0).collect();
    xs.extend((0..100_000).map(|_| (xorshift(&mut s) as f64 / u64::MAX as f64) * 2.0 - 1.0));
    let mut ls: Vec<f64> = (0..200_000).map(|_| f64::from_bits(xorshift(&mut s) & 0x7FEF_FFFF_FFFF_FFFF)).collect();
    ls.extend((0..100_000).map(|_| 1.0 + ((xorshift(&mut s) >> 11) as f64 - 2f64.powi(52)) * 2f64.powi(-60)));
    ls.extend((0..20_000).map(|_| f64::from_bits(xorshift(&mut s) & 0x000F_FFFF_FFFF_FFFF)));
    for (op, xs, exact) in [(UnaryOp::Exp, xs, f64::exp as fn(f64) -> f64), (UnaryOp::Log, ls, f64::ln)] {
        let k = kernel(&format!("{}_f64", op.name()), DType::F64, xs.len(), Ok(op));
        let got = as_f64(&simulate(&k, &build(&k), &[f64s(&xs)]));
        let worst = (0..xs.len()).map(|i| ulps64(got[i], exact(xs[i]))).max().unwrap_or(0);
        eprintln!("{} f64: worst {worst} ulp", op.name());
        assert!(worst <= 2, "{} f64: {worst} ulp", op.name());
    }
    let sp: Vec<f64> = ptxsim::f32_specials()
        .into_iter()
        .map(f64::from)
        .chain([f64::MAX, f64::MIN_POSITIVE, 5e-324, 709.7, 709.8, -745.0, -746.0, -800.0])
        .collect();
    for op in [UnaryOp::Exp, UnaryOp::Log] {
        let k = kernel(&format!("{}_f64_specials", op.name()), DType::F64, sp.len(), Ok(op));
        exact_against_interpreter(&k, &build(&k), &[f64s(&sp)]);
    }
}

/// Inputs of `[-lim, lim]`: dense strides over `[2⁻¹³, lim]` (both signs), random
/// bit patterns below; and random values of every exponent.
fn trig_inputs(lim: f32) -> Vec<f32> {
    let lo = 0x3900_0000u32; // 2⁻¹³
    let hi = lim.to_bits();
    let step = ((hi - lo) / 1_000_000).max(1) as usize;
    let mut v: Vec<f32> = (lo..=hi).step_by(step).flat_map(|b| [f32::from_bits(b), -f32::from_bits(b)]).collect();
    let mut s = 0x5555_AAAA_1234_4321u64;
    for _ in 0..100_000 {
        let b = (xorshift(&mut s) as u32) % lo;
        v.push(f32::from_bits(b | ((xorshift(&mut s) as u32) & 0x8000_0000)));
    }
    for _ in 0..200_000 {
        v.push(f32::from_bits(xorshift(&mut s) as u32 & 0xFF7F_FFFF));
    }
    v.extend(ptxsim::f32_specials());
    v
}

#[test]
fn f32_inverse_trigonometric_functions_are_within_one_ulp() {
    // The operation, the end of the dense sweep, the reference.
    type Case = (UnaryOp, f32, fn(f64) -> f64);
    let cases: [Case; 3] =
        [(UnaryOp::Asin, 1.0, f64::asin), (UnaryOp::Acos, 1.0, f64::acos), (UnaryOp::Atan, 1e4, f64::atan)];
    for (op, lim, exact) in cases {
        let xs = trig_inputs(lim);
        let k = kernel(&format!("{}_f32", op.name()), DType::F32, xs.len(), Ok(op));
        let m = build(&k);
        assert!(!m.ptx().contains("approx"), "{} uses an approximate instruction", op.name());
        let got = as_f32(&simulate(&k, &m, &[f32s(&xs)]));
        let worst = worst32(op.name(), &xs, &got, |i| exact(f64::from(xs[i])) as f32);
        assert!(worst <= 1, "{}: {worst} ulp", op.name());
        specials_exact(op);
    }
}

#[test]
fn f64_pow_is_within_its_stated_bound() {
    let mut s = 0x7777_1111_2222_3333u64;
    let (xs, ys) = draw_pairs(&mut s, 200_000, |i, s| {
        let r = xorshift(s);
        let u = (xorshift(s) >> 11) as f64 / 2f64.powi(53);
        match i % 3 {
            0 => (1.0 + (u - 0.5) * 1e-6, ((r % 2_000_001) as f64 - 1e6) * 0.37),
            1 => {
                let x = f64::from_bits((r & 0x3FFF_FFFF_FFFF_FFFF) + 0x0010_0000_0000_0000);
                (x, (u * 2.0 - 1.0) * 700.0 / x.ln().abs().max(1.0))
            }
            _ => (-(u * 100.0 + 0.01), ((r >> 40) % 61) as f64 - 30.0),
        }
    });
    let k = kernel("pow_f64", DType::F64, xs.len(), Err(BinaryOp::Pow));
    let m = build(&k);
    let got = as_f64(&simulate(&k, &m, &[f64s(&xs), f64s(&ys)]));
    let mut worst = 0.0f64;
    for i in 0..xs.len() {
        let want = xs[i].powf(ys[i]);
        let t = (ys[i] * xs[i].abs().ln()).abs();
        let u = ulps64(got[i], want) as f64;
        // e^(y·ln|x|): 2·|y·ln x| + 4 ulp; binary powering (integer |y| ≤ 64): |y| + 1.
        let powered = if ys[i].fract() == 0.0 && ys[i].abs() <= 64.0 { ys[i].abs() + 1.0 } else { 0.0 };
        let bound = (2.0 * t + 4.0).max(powered);
        assert!(
            u <= bound,
            "pow f64({:e}, {:e}): got {:e}, want {want:e}: {u} ulp (bound {bound})",
            xs[i],
            ys[i],
            got[i]
        );
        worst = worst.max(u / bound);
    }
    eprintln!("pow f64: worst {worst:.3} of the bound");
    // Integer powers of integers are exact where the result is (ONNX's Pow of mixed
    // types computes in f64 and may truncate to an integer).
    let (xs, ys): (Vec<f64>, Vec<f64>) =
        (-20..=20).flat_map(|x| (-12..=40).map(move |y| (f64::from(x), f64::from(y)))).unzip();
    let k = kernel("pow_f64_ints", DType::F64, xs.len(), Err(BinaryOp::Pow));
    let got = as_f64(&simulate(&k, &build(&k), &[f64s(&xs), f64s(&ys)]));
    for i in 0..xs.len() {
        let want = xs[i].powf(ys[i]);
        if want.abs() < 2f64.powi(53) && want.fract() == 0.0 {
            assert_eq!(got[i].to_bits(), want.to_bits(), "pow f64({}, {})", xs[i], ys[i]);
        }
    }
    let sp: Vec<f64> = ptxsim::f32_specials().into_iter().map(f64::from).collect();
    let (xs, ys) = every_pair(&sp);
    // Non-integer powers of these bases have |y·ln x| ≤ 78: within the bound's 160 ulp.
    let k = kernel("pow_f64_specials", DType::F64, xs.len(), Err(BinaryOp::Pow));
    near_interpreter(&k, &build(&k), &[f64s(&xs), f64s(&ys)], 160);
}

#[test]
fn fmod_is_exact_at_every_quotient() {
    // Quotients from below 1 to the whole exponent range (the reduction loop), both
    // signs, subnormal divisors, and the special values.
    let mut s = 0x2468_ACE0_1357_9BDFu64;
    let (xs, ys) = draw_pairs(&mut s, 100_000, |i, s| {
        let a = f64::from_bits(xorshift(s) & 0xFFEF_FFFF_FFFF_FFFF);
        let b = match i % 4 {
            0 => f64::from_bits(xorshift(s) & 0x800F_FFFF_FFFF_FFFF),
            1 => a * ((xorshift(s) % 1000) as f64 / 999.0 + 1e-3),
            _ => f64::from_bits(xorshift(s) & 0xFFEF_FFFF_FFFF_FFFF),
        };
        (a, b)
    });
    let k = kernel("fmod_f64", DType::F64, xs.len(), Err(BinaryOp::Rem));
    let m = build(&k);
    let got = as_f64(&simulate(&k, &m, &[f64s(&xs), f64s(&ys)]));
    for i in 0..xs.len() {
        let want = libm::fmod(xs[i], ys[i]);
        assert!(
            got[i].to_bits() == want.to_bits() || (got[i].is_nan() && want.is_nan()),
            "fmod f64({:e}, {:e}): got {:e}, want {want:e}",
            xs[i],
            ys[i],
            got[i]
        );
    }
    let sp: Vec<f64> =
        ptxsim::f32_specials().into_iter().map(f64::from).chain([f64::MAX, 5e-324, 1e300, -1e-300]).collect();
    let (xs, ys) = every_pair(&sp);
    let k = kernel("fmod_f64_specials", DType::F64, xs.len(), Err(BinaryOp::Rem));
    near_interpreter(&k, &build(&k), &[f64s(&xs), f64s(&ys)], 0);
    // f32 through f64: exact too, at every quotient.
    let xs: Vec<f32> = (0..50_000).map(|_| f32::from_bits(xorshift(&mut s) as u32 & 0xFF7F_FFFF)).collect();
    let ys: Vec<f32> = (0..50_000).map(|_| f32::from_bits(xorshift(&mut s) as u32 & 0xFF7F_FFFF)).collect();
    let k = kernel("fmod_f32", DType::F32, xs.len(), Err(BinaryOp::Rem));
    near_interpreter(&k, &build(&k), &[f32s(&xs), f32s(&ys)], 0);
    let (xs, ys) = every_pair(&ptxsim::f32_specials());
    let k = kernel("fmod_f32_specials", DType::F32, xs.len(), Err(BinaryOp::Rem));
    near_interpreter(&k, &build(&k), &[f32s(&xs), f32s(&ys)], 0);
}

#[test]
fn constant_exponents_give_the_general_sequences_values() {
    // out = pow(x, c) with c a constant node (specialised at compile time) against the
    // same kernel with c an input (the general sequence), bit for bit, on every kind of
    // base; f32 also within 1 ulp of the correctly rounded value.
    let mut s = 0x1111_2222_3333_4444u64;
    let mut xs: Vec<f32> = (0..20_000).map(|_| f32::from_bits(xorshift(&mut s) as u32)).collect();
    xs.extend((0..20_000).map(|_| ((xorshift(&mut s) % 20_000) as f32 - 10_000.0) / 1000.0));
    xs.extend(ptxsim::f32_specials());
    let exps = [0.0f64, -0.0, 1.0, 2.0, 0.5, 3.0, -1.0, -2.0, 5.0, 7.0, 64.0, -64.0, 65.0, 0.25, -0.5, 1.5, 63.0, -3.0];
    for d in [DType::F32, DType::F64] {
        let mut kernels = Vec::new();
        for (i, &c) in exps.iter().enumerate() {
            let name = format!("pow_const_{}_{i}", d.name());
            let mut b = KernelBuilder::new(&name, vec![ty(d, xs.len())], ty(d, xs.len()));
            let idx = b.out_index();
            let x = b.load(0, idx);
            let t = kiln_flow::ScalarType::of_storage(d);
            let y = b.float(t, c);
            let r = b.binary(BinaryOp::Pow, x, y);
            kernels.push(b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}")));
        }
        let general = kernel(&format!("pow_var_{}", d.name()), d, xs.len(), Err(BinaryOp::Pow));
        let gm = build(&general);
        let xt = if d == DType::F32 { f32s(&xs) } else { f64s(&xs.iter().map(|&x| f64::from(x)).collect::<Vec<_>>()) };
        for (k, &c) in kernels.iter().zip(&exps) {
            let m = build(k);
            if d == DType::F32 && [0.0, 1.0, 2.0, 0.5].contains(&c) {
                assert!(!m.ptx().contains("f64"), "{}: pow(x, {c}) leaves f32", k.name);
            }
            let yt = if d == DType::F32 { f32s(&vec![c as f32; xs.len()]) } else { f64s(&vec![c; xs.len()]) };
            let want = simulate(&general, &gm, &[xt.clone(), yt]);
            let got = simulate(k, &m, std::slice::from_ref(&xt));
            let w = d.storage_bytes(1);
            for i in 0..xs.len() {
                let (g, v) = (&got[i * w..(i + 1) * w], &want[i * w..(i + 1) * w]);
                let nan = |b: &[u8]| {
                    if w == 4 {
                        f32::from_le_bytes(b.try_into().expect("4")).is_nan()
                    } else {
                        f64::from_le_bytes(b.try_into().expect("8")).is_nan()
                    }
                };
                assert!(g == v || (nan(g) && nan(v)), "{}: pow({:e}, {c}): {g:02X?} vs {v:02X?}", k.name, xs[i]);
            }
            if d == DType::F32 {
                let got = as_f32(&got);
                let worst = worst32(&k.name, &xs, &got, |i| f64::from(xs[i]).powf(c) as f32);
                assert!(worst <= 1, "{}: {worst} ulp", k.name);
            }
        }
    }
}

#[test]
fn f32_inverse_hyperbolic_functions_keep_their_relative_precision() {
    // Near 0 (and near 1 for acosh) too, where log(x + √(x² ± 1)) loses it.
    let mut s = 0x9999_8888_7777_6666u64;
    let mut xs: Vec<f32> = (0..300_000).map(|_| f32::from_bits(xorshift(&mut s) as u32 & 0xFF7F_FFFF)).collect();
    xs.extend((1..50_000u32).map(|j| f32::from_bits(0x3F80_0000 + j * 3)));
    xs.extend((1..50_000u32).map(|j| f32::from_bits(0x3F80_0000 - j * 3)));
    xs.extend(ptxsim::f32_specials());
    type Case = (UnaryOp, fn(f64) -> f64);
    let cases: [Case; 3] = [(UnaryOp::Asinh, f64::asinh), (UnaryOp::Acosh, f64::acosh), (UnaryOp::Atanh, f64::atanh)];
    for (op, exact) in cases {
        let k = kernel(&format!("{}_f32", op.name()), DType::F32, xs.len(), Ok(op));
        let m = build(&k);
        let got = as_f32(&simulate(&k, &m, &[f32s(&xs)]));
        let worst = worst32(op.name(), &xs, &got, |i| {
            let x = f64::from(xs[i]);
            if op == UnaryOp::Acosh && x < 1.0 {
                f32::NAN
            } else {
                exact(x) as f32
            }
        });
        assert!(worst <= 2, "{}: {worst} ulp", op.name());
        specials_exact(op);
    }
}
