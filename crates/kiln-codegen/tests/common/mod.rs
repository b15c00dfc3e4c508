//! Shared test machinery: compile kernels, load them with the runtime's loader, run
//! them on buffers, and compare with the kernel interpreter (`kiln_flow::interp`).
#![allow(dead_code)]

use bytes::Bytes;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options, Packing};
use kiln_flow::layout::pack_constants;
use kiln_flow::program::{BufferKind, FlowProgram};
use kiln_flow::{interp, BinaryOp, Bounds, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{Attr, Attrs, DType, Op, OpKind, Shape, Tensor, TensorType};
use kiln_runtime::cpu::helpers::HELPERS;
use kiln_runtime::cpu::loader::LoadedCode;

/// One way of compiling: a target and options.
#[derive(Debug, Clone)]
pub struct Config {
    pub target: CpuTarget,
    pub options: Options,
}

/// The microkernel variants this machine can run: x86-64-v3 (AVX2) and, where the CPU
/// has AVX-512 F (and VL, when `vl`: code that writes `ymm` registers under opmasks),
/// x86-64-v4; where it does not, that variant is skipped, and said so once.
pub fn microkernel_variants(vl: bool) -> Vec<Config> {
    let mut v = vec![Config { target: CpuTarget::X86_64V3, options: Options::default() }];
    if std::is_x86_feature_detected!("avx512f") && (!vl || std::is_x86_feature_detected!("avx512vl")) {
        v.push(Config { target: CpuTarget::X86_64V4, options: Options::default() });
    } else {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| eprintln!("skipped: the x86-64-v4 (AVX-512) variants, this CPU lacks AVX-512 F or VL"));
    }
    v
}

/// Whether this CPU has AVX2 and FMA, which the x86-64-v3 microkernels need.
pub fn avx2_fma() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

/// Returns from the calling test, saying that it is skipped (and, when given, what is
/// then not tested), where this CPU lacks AVX2+FMA.
#[macro_export]
macro_rules! require_avx2_fma {
    () => {
        $crate::require_avx2_fma!("")
    };
    ($why:literal) => {
        if !$crate::common::avx2_fma() {
            eprintln!(concat!("skipped: this CPU lacks AVX2+FMA", $why));
            return;
        }
    };
}

/// Every target this machine can run, with and without vectorisation (float
/// reductions never reassociated, so every result is comparable bit for bit).
pub fn configs() -> Vec<Config> {
    let mut targets = vec![CpuTarget::X86_64, CpuTarget::X86_64V2];
    if avx2_fma() {
        targets.push(CpuTarget::X86_64V3);
    }
    targets.push(CpuTarget::Host);
    let mut out = Vec::new();
    for t in targets {
        for vectorize in [false, true] {
            out.push(Config { target: t, options: in_order(vectorize, vectorize) });
        }
    }
    out
}

/// A few configurations for larger tests.
pub fn quick_configs() -> Vec<Config> {
    vec![
        Config { target: CpuTarget::X86_64V2, options: in_order(false, false) },
        Config { target: CpuTarget::Host, options: in_order(true, true) },
    ]
}

/// Options that keep float sums in order (never reassociated) and math inline, without
/// the contraction microkernels: results comparable bit for bit.
pub const fn in_order(vectorize: bool, unroll: bool) -> Options {
    Options { vectorize, reassociate: false, contraction_kernels: false, inline_math: true, unroll }
}

/// Bytes with guard zones on both sides, to catch stray writes.
struct Guarded {
    buf: Vec<u8>,
    len: usize,
}

const GUARD: usize = 64;
const CANARY: u8 = 0xA5;

impl Guarded {
    fn new(data: &[u8]) -> Guarded {
        let mut buf = vec![CANARY; data.len() + 2 * GUARD];
        buf[GUARD..GUARD + data.len()].copy_from_slice(data);
        Guarded { buf, len: data.len() }
    }
    fn ptr(&mut self) -> *mut u8 {
        // In bounds: GUARD <= buf.len().
        self.buf[GUARD..].as_mut_ptr()
    }
    fn data(&self) -> &[u8] {
        &self.buf[GUARD..GUARD + self.len]
    }
    fn guards_intact(&self) -> bool {
        self.buf[..GUARD].iter().chain(&self.buf[GUARD + self.len..]).all(|&b| b == CANARY)
    }
}

/// Compiles `k` with `cfg`, runs it on `inputs` (all workgroups, in `splits` calls),
/// and returns the output. The output starts as 0xA5 bytes, so a byte the kernel does
/// not write (a missed element, the padding nibble of a packed type) shows.
pub fn run_compiled(k: &Kernel, inputs: &[&Tensor], cfg: &Config, splits: u64) -> Tensor {
    run_compiled_in(k, inputs, cfg, splits, false)
}

/// [`run_compiled`], the `splits` ranges run last first when `reversed` (a kernel that
/// writes past its range's end into the next range then clobbers what that range
/// already wrote, as another thread's range could be).
pub fn run_compiled_in(k: &Kernel, inputs: &[&Tensor], cfg: &Config, splits: u64, reversed: bool) -> Tensor {
    let m =
        compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap_or_else(|e| panic!("compile {}: {e}", k.name));
    let exe = &m.executable;
    let code = LoadedCode::load(&exe.code, &exe.relocs).unwrap_or_else(|e| panic!("load: {e}"));
    let entry = code.entry(exe.entries[0].1).expect("entry");
    let mut ins: Vec<Guarded> = inputs.iter().map(|t| Guarded::new(t.bytes())).collect();
    let mut out = Guarded::new(&vec![0xA5u8; k.output.storage_bytes()]);
    let mut bindings: Vec<*mut u8> = ins.iter_mut().map(|g| g.ptr()).collect();
    bindings.push(out.ptr());
    let wg = m.workgroups[0];
    let splits = splits.clamp(1, wg.max(1));
    let mut ranges = Vec::new();
    let mut at = 0;
    for s in 0..splits {
        let end = if s + 1 == splits { wg } else { at + wg / splits };
        ranges.push((at, end));
        at = end;
    }
    if reversed {
        ranges.reverse();
    }
    for (at, end) in ranges {
        // SAFETY (test): the bindings are live buffers of the kernel's input and output
        // types, in binding order; the helper table is the runtime's.
        unsafe { entry(bindings.as_ptr(), HELPERS.as_ptr(), at, end) };
    }
    // Also: an empty range and a range past the end do nothing.
    // SAFETY (test): as above.
    unsafe { entry(bindings.as_ptr(), HELPERS.as_ptr(), wg, wg + 5) };
    assert!(out.guards_intact(), "{}: a write outside the output", k.name);
    for (i, g) in ins.iter().enumerate() {
        assert!(g.guards_intact(), "{}: input {i} was written around", k.name);
        assert_eq!(g.data(), inputs[i].bytes().as_ref(), "{}: input {i} was modified", k.name);
    }
    Tensor::new(k.output.clone(), Bytes::copy_from_slice(out.data())).expect("output tensor")
}

/// A buffer of `len` bytes with an inaccessible page on each side, its bytes placed
/// against one of them: a kernel that reads or writes a byte past that end faults.
struct Fenced {
    base: *mut u8,
    map_len: usize,
    at: *mut u8,
    len: usize,
}

impl Fenced {
    /// `data` placed right after the leading fence (`at_end` false) or ending right at
    /// the trailing one.
    fn new(data: &[u8], at_end: bool) -> Fenced {
        // SAFETY (test): sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let inner = data.len().div_ceil(page).max(1) * page;
        let map_len = inner + 2 * page;
        let (rw, private) = (libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
        // SAFETY (test): an anonymous private mapping of map_len bytes, no address hint.
        let base = unsafe { libc::mmap(std::ptr::null_mut(), map_len, rw, private, -1, 0) };
        assert!(base != libc::MAP_FAILED, "mmap");
        let base = base as *mut u8;
        // SAFETY (test): both fences are whole pages of the mapping just made.
        unsafe {
            assert_eq!(libc::mprotect(base.cast(), page, libc::PROT_NONE), 0);
            assert_eq!(libc::mprotect(base.add(page + inner).cast(), page, libc::PROT_NONE), 0);
        }
        let offset = if at_end { page + inner - data.len() } else { page };
        // SAFETY (test): offset + data.len() <= page + inner, inside the writable pages.
        let at = unsafe { base.add(offset) };
        // SAFETY (test): `at` has data.len() writable bytes; the regions do not overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        Fenced { base, map_len, at, len: data.len() }
    }

    fn data(&self) -> &[u8] {
        // SAFETY (test): `at` has `len` initialised bytes, mapped while `self` lives.
        unsafe { std::slice::from_raw_parts(self.at, self.len) }
    }
}

impl Drop for Fenced {
    fn drop(&mut self) {
        // SAFETY (test): the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.map_len) };
    }
}

/// Runs `k` (one call over every workgroup) with each operand, inputs and output, placed
/// against an inaccessible page, once against the page before it and once against the
/// page after it, and checks that both runs agree bit for bit with
/// [`run_compiled`]'s result: a kernel that reads or writes past an operand's first or
/// last byte (a whole vector where a masked one was due) faults here.
pub fn check_fenced(k: &Kernel, inputs: &[&Tensor], cfg: &Config) {
    let want = run_compiled(k, inputs, cfg, 1);
    let m =
        compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap_or_else(|e| panic!("compile {}: {e}", k.name));
    let exe = &m.executable;
    let code = LoadedCode::load(&exe.code, &exe.relocs).unwrap_or_else(|e| panic!("load: {e}"));
    let entry = code.entry(exe.entries[0].1).expect("entry");
    for at_end in [false, true] {
        let ins: Vec<Fenced> = inputs.iter().map(|t| Fenced::new(t.bytes(), at_end)).collect();
        let out = Fenced::new(&vec![0xA5u8; k.output.storage_bytes()], at_end);
        let mut bindings: Vec<*mut u8> = ins.iter().map(|f| f.at).collect();
        bindings.push(out.at);
        // SAFETY (test): the bindings are live buffers of the kernel's operand types,
        // in binding order; the helper table is the runtime's.
        unsafe { entry(bindings.as_ptr(), HELPERS.as_ptr(), 0, m.workgroups[0]) };
        let end = if at_end { "end" } else { "start" };
        assert_eq!(out.data(), want.bytes().as_ref(), "{} {:?}: operands fenced at their {end}", k.name, cfg.target);
    }
}

/// How to compare two outputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cmp {
    /// +0 and -0 count as equal (float min/max on mixed-sign zeros: see the tests).
    pub zero_sign: bool,
    /// Relative tolerance of floats (0: bits must agree, NaN matching any NaN).
    pub rtol: f64,
}

pub const EXACT: Cmp = Cmp { zero_sign: false, rtol: 0.0 };

/// Float bits of element `i` as f64, or None for integer dtypes.
fn float_at(t: &Tensor, i: usize) -> Option<f64> {
    let b = t.bytes();
    Some(match t.dtype() {
        DType::F32 => f32::from_le_bytes(b[4 * i..4 * i + 4].try_into().unwrap()) as f64,
        DType::F64 => f64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap()),
        DType::F16 | DType::BF16 => {
            let h = u16::from_le_bytes(b[2 * i..2 * i + 2].try_into().unwrap());
            if t.dtype() == DType::F16 {
                f16_value(h)
            } else {
                f32::from_bits((h as u32) << 16) as f64
            }
        }
        _ => return None,
    })
}

/// The value of f16 bits, decoded independently of the code under test.
pub fn f16_value(h: u16) -> f64 {
    let sign = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = ((h >> 10) & 0x1f) as i32;
    let m = (h & 0x3ff) as f64;
    sign * match e {
        0 => m * 2f64.powi(-24),
        31 if m == 0.0 => f64::INFINITY,
        31 => f64::NAN,
        _ => (1.0 + m / 1024.0) * 2f64.powi(e - 15),
    }
}

/// Compares `got` with `want` element by element; returns the first difference.
pub fn compare(got: &Tensor, want: &Tensor, cmp: Cmp) -> Result<(), String> {
    if got.ty() != want.ty() {
        return Err(format!("type {} vs {}", got.ty(), want.ty()));
    }
    if got.dtype().is_packed() {
        // Two elements a byte: compare bytes, name the elements.
        for (i, (g, w)) in got.bytes().iter().zip(want.bytes().iter()).enumerate() {
            if g != w {
                return Err(format!("elements {}..={}: got byte {g:#04x}, want {w:#04x}", 2 * i, 2 * i + 1));
            }
        }
        return Ok(());
    }
    let n = got.numel();
    let size = got.dtype().storage_bytes(1);
    for i in 0..n {
        if let (Some(g), Some(w)) = (float_at(got, i), float_at(want, i)) {
            let same_bits = g.to_bits() == w.to_bits();
            let ok = same_bits
                || (g.is_nan() && w.is_nan())
                || (cmp.zero_sign && g == 0.0 && w == 0.0)
                || (cmp.rtol > 0.0 && (g - w).abs() <= cmp.rtol * w.abs().max(1e-30));
            if !ok {
                return Err(format!("element {i}: got {g:e} ({:#x}), want {w:e} ({:#x})", g.to_bits(), w.to_bits()));
            }
        } else {
            let (g, w) = (&got.bytes()[i * size..(i + 1) * size], &want.bytes()[i * size..(i + 1) * size]);
            if g != w {
                return Err(format!("element {i}: got bytes {g:?}, want {w:?}"));
            }
        }
    }
    Ok(())
}

/// Runs `k` under every configuration in `cfgs` (and two workgroup splits) and checks
/// each result against the interpreter.
pub fn check_with(k: &Kernel, inputs: &[&Tensor], cmp: Cmp, cfgs: &[Config]) {
    let want = interp::run(k, inputs).unwrap_or_else(|e| panic!("interp {}: {e}", k.name));
    for cfg in cfgs {
        for splits in [1, 3] {
            let got = run_compiled(k, inputs, cfg, splits);
            if let Err(e) = compare(&got, &want, cmp) {
                panic!("kernel {} under {:?} (splits {splits}): {e}\n{k}", k.name, cfg);
            }
        }
    }
}

/// [`check_with`] over every configuration.
pub fn check(k: &Kernel, inputs: &[&Tensor], cmp: Cmp) {
    check_with(k, inputs, cmp, &configs());
}

/// A tensor from raw bits of its compute type (`bits[i]` is element `i`).
pub fn tensor_bits(dtype: DType, dims: &[usize], bits: &[u64]) -> Tensor {
    let shape = Shape::new(dims.to_vec()).expect("shape");
    assert_eq!(shape.numel(), bits.len(), "element count");
    let size = dtype.storage_bytes(1);
    let mut data = Vec::with_capacity(bits.len() * size);
    for &b in bits {
        data.extend_from_slice(&b.to_le_bytes()[..size]);
    }
    Tensor::new(TensorType::new(dtype, shape), Bytes::from(data)).expect("tensor")
}

/// Deterministic pseudo-random numbers.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 52) as f64 - 1.0
    }
}

/// f32 values of `n` pseudo-random elements in [-scale, scale) as tensor `dims`.
pub fn random_f32(dims: &[usize], scale: f64, seed: u64) -> Tensor {
    let mut r = Rng(seed.max(1));
    let n: usize = dims.iter().product();
    let bits: Vec<u64> = (0..n).map(|_| ((r.unit() * scale) as f32).to_bits() as u64).collect();
    tensor_bits(DType::F32, dims, &bits)
}

/// Interesting stored values (bits in the storage dtype) of every dtype: zeros, ones,
/// extremes, NaN and infinities, halves for rounding, values near conversion limits.
pub fn specials(d: DType) -> Vec<u64> {
    // Zeros, ones, and halves for rounding: the same values in both widths.
    const BOTH: [f64; 10] = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5];
    let f32s: Vec<f32> = BOTH
        .iter()
        .map(|&v| v as f32)
        .chain([
            3.75,
            -3.75,
            0.3,
            -7.0,
            100.25,
            1e-3,
            1e30,
            -1e30,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-40,
            -1e-40,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            4194304.5,
            16777216.0,
            2147483648.0,
            -2147483904.0,
            -2147483648.0,
            9.3e18,
            -9.3e18,
            1.9e19,
            65504.0,
            65520.0,
            300.0,
            -129.0,
            255.5,
            1e10,
        ])
        .collect();
    let f64s: Vec<f64> = BOTH
        .iter()
        .copied()
        .chain([
            0.1,
            -7.25,
            1e-300,
            1e300,
            -1e300,
            f64::MAX,
            f64::MIN,
            f64::MIN_POSITIVE,
            5e-324,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
            2251799813685248.5,
            9007199254740993.0,
            9.3e18,
            -9.3e18,
            9223372036854775807.0,
            -9223372036854775808.0,
            1.9e19,
            18446744073709551615.0,
            3.4028235677973366e38,
            1e40,
            65504.0,
            70000.0,
            -4294967296.0,
            255.5,
            1e-8,
        ])
        .collect();
    let ints = |bits: u32, signed: bool| -> Vec<u64> {
        let mask = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let max = if signed { (mask >> 1) as i128 } else { mask as i128 };
        let min = if signed { -(max + 1) } else { 0 };
        let mut v: Vec<i128> =
            vec![0, 1, -1, 2, -2, 3, 5, -7, 100, -100, bits as i128 - 1, bits as i128, bits as i128 + 1, 12345, -12345];
        v.extend([min, min + 1, max, max - 1, max / 2, 77777777777, -5555555555555]);
        v.into_iter().map(|x| (x as u64) & mask).collect()
    };
    match d {
        DType::F32 => f32s.iter().map(|x| x.to_bits() as u64).collect(),
        DType::F64 => f64s.iter().map(|x| x.to_bits()).collect(),
        DType::F16 => {
            vec![
                0x0000, 0x8000, 0x3c00, 0xbc00, 0x3800, 0x3e00, 0x7bff, 0xfbff, 0x0001, 0x8001, 0x03ff, 0x0400, 0x7c00,
                0xfc00, 0x7e00, 0x7d01, 0x3555, 0x4248, 0xc900, 0x5bff,
            ]
        }
        DType::BF16 => {
            vec![
                0x0000, 0x8000, 0x3f80, 0xbf80, 0x3f00, 0x3fc0, 0x7f7f, 0xff7f, 0x0001, 0x8001, 0x007f, 0x0080, 0x7f80,
                0xff80, 0x7fc0, 0x7f81, 0x3eab, 0x4049, 0xc2c8, 0x4f00,
            ]
        }
        DType::Bool => vec![0, 1],
        DType::I8 => ints(8, true),
        DType::I16 => ints(16, true),
        DType::I32 => ints(32, true),
        DType::I64 => ints(64, true),
        DType::U8 => ints(8, false),
        DType::U16 => ints(16, false),
        DType::U32 => ints(32, false),
        DType::U64 => ints(64, false),
        _ => Vec::new(),
    }
}

/// The value of bf16 bits.
pub fn bf16_value(h: u16) -> f64 {
    f32::from_bits((h as u32) << 16) as f64
}

/// Correct rounding of `x` to f16 or bf16 (nearest, ties to the even encoding,
/// infinity from halfway past the largest finite value; NaN gives a quiet NaN),
/// found by searching a table of every finite value: independent of any conversion
/// code under test.
pub fn round_oracle(d: DType, x: f64) -> u16 {
    let (inf, value): (u16, fn(u16) -> f64) = match d {
        DType::F16 => (0x7c00, f16_value),
        _ => (0x7f80, bf16_value),
    };
    if x.is_nan() {
        return inf | (inf >> 1 & !inf);
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let a = x.abs();
    let max = value(inf - 1);
    let step = max - value(inf - 2);
    if a >= max + step / 2.0 {
        return sign | inf;
    }
    // Binary search over the encodings 0..inf (ordered like their values).
    let (mut lo, mut hi) = (0u16, inf - 1);
    if a >= max {
        return sign | (inf - 1);
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if value(mid) <= a {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let (dl, dh) = (a - value(lo), value(hi) - a);
    let pick = if dl < dh || (dl == dh && lo % 2 == 0) { lo } else { hi };
    sign | pick
}

/// GELU of `v` (f32) as models export it: `0.5·v·(1 + erf(v / √2))`.
pub fn gelu(b: &mut KernelBuilder, v: ExprId) -> ExprId {
    let f = ScalarType::F32;
    let half = b.float(f, 0.5);
    let h = b.mul(v, half);
    let r2 = b.float(f, std::f64::consts::SQRT_2);
    let d = b.div(v, r2);
    let e = b.unary(UnaryOp::Erf, d);
    let one = b.float(f, 1.0);
    let e = b.add(e, one);
    b.mul(h, e)
}

/// `v` clipped to [0, 6] in f32 as the Relu6 epilogue is lowered (two selects:
/// `v < 0 ? 0 : v`, then `v > 6 ? 6 : v`).
pub fn relu6(b: &mut KernelBuilder, v: ExprId) -> ExprId {
    let f = ScalarType::F32;
    let zero = b.float(f, 0.0);
    let six = b.float(f, 6.0);
    let lt = b.binary(BinaryOp::Lt, v, zero);
    let v = b.select(lt, zero, v);
    let gt = b.binary(BinaryOp::Gt, v, six);
    b.select(gt, six, v)
}

/// The tensor type of `d` and shape `dims`.
pub fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).expect("shape"))
}

/// The f32 tensor type of shape `dims`.
pub fn f32_type(dims: &[usize]) -> TensorType {
    ty(DType::F32, dims)
}

/// `kernels` compiled for CUDA into one module, each asserted first to be of class
/// `class`.
pub fn compile_cuda(kernels: &[Kernel], class: kiln_flow::class::KernelClass) -> kiln_codegen::cuda::CudaModule {
    let with_class: Vec<_> = kernels.iter().map(|k| (k, kiln_flow::class::classify(k))).collect();
    for (k, c) in &with_class {
        assert_eq!(*c, class, "{}", k.name);
    }
    kiln_codegen::cuda::compile(&with_class).expect("compile")
}

/// A batched matrix product `Σ_k a[.., m, k] · w[.., k, n]` as the reduction of a
/// kernel being built (the CUDA Contraction suites build theirs with it): `a` is input
/// 0, `w` input 1.
#[derive(Debug, Clone, Copy)]
pub struct MatMul<'a> {
    /// The output's batch dimensions.
    pub batch: &'a [usize],
    /// Whether `a` and `w` carry the batch dimensions (else each is broadcast over them).
    pub batched: (bool, bool),
    /// `M`, `K`, `N`.
    pub mkn: (usize, usize, usize),
    /// `a` stored transposed (`[.., k, m]`).
    pub a_t: bool,
    /// The storage types of `a` and `w` (an integer is converted to f32 in the load).
    pub dtypes: (DType, DType),
}

impl MatMul<'_> {
    /// The output's dimensions, `[batch.., m, n]`.
    pub fn out(&self) -> Vec<usize> {
        let (m, _, n) = self.mkn;
        [self.batch, &[m, n]].concat()
    }

    /// The types of `a` and `w`.
    pub fn inputs(&self) -> Vec<TensorType> {
        let (m, k, n) = self.mkn;
        let with = |on: bool, d: &[usize]| if on { [self.batch, d].concat() } else { d.to_vec() };
        let a_dims = if self.a_t { [k, m] } else { [m, k] };
        vec![ty(self.dtypes.0, &with(self.batched.0, &a_dims)), ty(self.dtypes.1, &with(self.batched.1, &[k, n]))]
    }

    /// The sum over `k` in `kb`, and the output's row and column index.
    pub fn sum(&self, kb: &mut KernelBuilder) -> (ExprId, ExprId, ExprId) {
        let o = kb.out_index();
        let kv = kb.new_var(self.mkn.1 as u64);
        let kk = kb.var(kv);
        let r = self.batch.len();
        let pre = |on: bool| if on { o[..r].to_vec() } else { vec![] };
        let (a_b, w_b) = self.batched;
        let ai = if self.a_t { [pre(a_b), vec![kk, o[r]]].concat() } else { [pre(a_b), vec![o[r], kk]].concat() };
        let x = kb.load(0, ai);
        let w = kb.load(1, [pre(w_b), vec![kk, o[r + 1]]].concat());
        let w = if self.dtypes.1.is_float() { w } else { kb.cast(w, DType::F32, false) };
        let p = kb.mul(x, w);
        (kb.reduce(ReduceOp::Sum, vec![kv], p), o[r], o[r + 1])
    }
}

/// A convolution in NCHW over an input already padded (in-bounds loads, as the lowering
/// makes them after its padding kernel) as the reduction of a kernel being built: `n`
/// images of `ci` channels (input 0) to `co` channels (filter: input 1) of `h × w`, a
/// `kh × kw` window with stride `s` and dilation `d`, `g` groups. With `g > 1` the
/// output is `[n, g, co/g, h, w]` and the group an index of its own, as the lowering
/// makes grouped convolutions with several input channels per group.
#[derive(Debug, Clone, Copy)]
pub struct Conv {
    pub n: usize,
    /// Input and output channels.
    pub channels: (usize, usize),
    /// The output's height and width.
    pub hw: (usize, usize),
    /// The window's height and width.
    pub window: (usize, usize),
    pub stride: usize,
    pub dilation: usize,
    pub groups: usize,
}

impl Conv {
    /// `n` images, `(ci, co)` channels, an `(h, w)` output, a `(kh, kw)` window, stride
    /// `s`, dilation `d`, `g` groups.
    pub fn new(
        n: usize,
        channels: (usize, usize),
        hw: (usize, usize),
        window: (usize, usize),
        s: usize,
        d: usize,
        g: usize,
    ) -> Conv {
        Conv { n, channels, hw, window, stride: s, dilation: d, groups: g }
    }

    /// The output's dimensions.
    pub fn out(&self) -> Vec<usize> {
        let ((_, co), (h, w), g) = (self.channels, self.hw, self.groups);
        if g > 1 {
            vec![self.n, g, co / g, h, w]
        } else {
            vec![self.n, co, h, w]
        }
    }

    /// The (padded) image's and the filter's dimensions.
    pub fn inputs(&self) -> [Vec<usize>; 2] {
        let ((ci, co), (h, w), (kh, kw)) = (self.channels, self.hw, self.window);
        let (s, d) = (self.stride, self.dilation);
        let (hi, wi) = ((h - 1) * s + (kh - 1) * d + 1, (w - 1) * s + (kw - 1) * d + 1);
        [vec![self.n, ci, hi, wi], vec![co, ci / self.groups, kh, kw]]
    }

    /// The sum over the window and the group's input channels in `kb`, the output
    /// channel's index and the output column's.
    pub fn sum(&self, kb: &mut KernelBuilder) -> (ExprId, ExprId, ExprId) {
        let ((ci, co), (kh, kw), g) = (self.channels, self.window, self.groups);
        let (cig, cog) = (ci / g, co / g);
        let o = kb.out_index();
        let (civ, khv, kwv) = (kb.new_var(cig as u64), kb.new_var(kh as u64), kb.new_var(kw as u64));
        let (c, y, x) = (kb.var(civ), kb.var(khv), kb.var(kwv));
        let sc = kb.index(self.stride as i64);
        let sp = if g > 1 { 3 } else { 2 };
        let (oy, ox) = (kb.mul(o[sp], sc), kb.mul(o[sp + 1], sc));
        let (dy, dx) = if self.dilation > 1 {
            let dc = kb.index(self.dilation as i64);
            (kb.mul(y, dc), kb.mul(x, dc))
        } else {
            (y, x)
        };
        let (iy, ix) = (kb.add(oy, dy), kb.add(ox, dx));
        let (chan, oc) = if g > 1 {
            let (cgi, cgo) = (kb.index(cig as i64), kb.index(cog as i64));
            let base_i = kb.mul(o[1], cgi);
            let base_o = kb.mul(o[1], cgo);
            (kb.add(base_i, c), kb.add(base_o, o[2]))
        } else {
            (c, o[1])
        };
        let img = kb.load(0, vec![o[0], chan, iy, ix]);
        let f = kb.load(1, vec![oc, c, y, x]);
        let p = kb.mul(img, f);
        (kb.reduce(ReduceOp::Sum, vec![civ, khv, kwv], p), oc, o[sp + 1])
    }
}

/// `op` over `k < len` of `f(x[row, k])`, `x` input `input`: a reduction along one row
/// inside a kernel being built (`f` maps each loaded element first; `|_, v| v` for none).
pub fn reduce_row(
    b: &mut KernelBuilder,
    input: usize,
    row: ExprId,
    len: usize,
    op: ReduceOp,
    f: impl FnOnce(&mut KernelBuilder, ExprId) -> ExprId,
) -> ExprId {
    let k = b.new_var(len as u64);
    let kv = b.var(k);
    let x = b.load(input, vec![row, kv]);
    let v = f(b, x);
    b.reduce(op, vec![k], v)
}

/// LayerNorm's normalised value before its scale: `(x − mean) / sqrt(var + 1e-5)` of
/// input 0 (`[rows, len]`, f32) at output position `o` (row `o[0]`, column `o[1]`).
pub fn normalised(b: &mut KernelBuilder, o: &[ExprId], len: usize) -> ExprId {
    let f = ScalarType::F32;
    let n = b.float(f, len as f64);
    let sum = reduce_row(b, 0, o[0], len, ReduceOp::Sum, |_, x| x);
    let mean = b.div(sum, n);
    let ss = reduce_row(b, 0, o[0], len, ReduceOp::Sum, |b, x| {
        let dq = b.sub(x, mean);
        b.mul(dq, dq)
    });
    let var = b.div(ss, n);
    let eps = b.float(f, 1e-5);
    let ve = b.add(var, eps);
    let sd = b.unary(UnaryOp::Sqrt, ve);
    let x = b.load(0, vec![o[0], o[1]]);
    let d = b.sub(x, mean);
    b.div(d, sd)
}

/// LayerNorm over the last axis of `[rows, len]` with per-column scale and shift.
pub fn layernorm(rows: usize, len: usize) -> Kernel {
    let mut b = KernelBuilder::new(
        "layernorm",
        vec![f32_type(&[rows, len]), f32_type(&[len]), f32_type(&[len])],
        f32_type(&[rows, len]),
    );
    let o = b.out_index();
    let nrm = normalised(&mut b, &o, len);
    let g = b.load(1, vec![o[1]]);
    let bt = b.load(2, vec![o[1]]);
    let y = b.mul(nrm, g);
    let y = b.add(y, bt);
    b.finish(y).unwrap()
}

/// `y[i] = op over j of x[i, j]`: a reduction along the last axis of a `[rows, cols]`
/// input of type `input`, to `[rows]` of `out`.
pub fn row_reduce(name: impl Into<String>, input: TensorType, out: DType, op: ReduceOp) -> Kernel {
    let (rows, cols) = (input.shape.dims()[0], input.shape.dims()[1]);
    let mut b = KernelBuilder::new(name, vec![input], TensorType::new(out, Shape::new(vec![rows]).unwrap()));
    let i = b.out_index();
    let r = reduce_row(&mut b, 0, i[0], cols, op, |_, x| x);
    b.finish(r).unwrap()
}

/// `softmax(x)` over the last axis of `[rows, len]`.
pub fn softmax(rows: usize, len: usize) -> Kernel {
    softmax_with(rows, len, UnaryOp::Exp)
}

/// Softmax with `op` in place of exp (`Cosh`: a transcendental the helper table serves).
pub fn softmax_with(rows: usize, len: usize, op: UnaryOp) -> Kernel {
    let mut b = KernelBuilder::new("softmax", vec![f32_type(&[rows, len])], f32_type(&[rows, len]));
    let o = b.out_index();
    let y = softmax_at(&mut b, &o, len, op);
    b.finish(y).unwrap()
}

/// Softmax's value (with `op` in place of exp) of input 0 (`[rows, len]`, f32) at
/// output position `o` (row `o[0]`, column `o[1]`): `op(x − max) / Σ op(x − max)`.
pub fn softmax_at(b: &mut KernelBuilder, o: &[ExprId], len: usize, op: UnaryOp) -> ExprId {
    let mx = reduce_row(b, 0, o[0], len, ReduceOp::Max, |_, x| x);
    let sum = reduce_row(b, 0, o[0], len, ReduceOp::Sum, |b, x| {
        let d = b.sub(x, mx);
        b.unary(op, d)
    });
    let x = b.load(0, vec![o[0], o[1]]);
    let d = b.sub(x, mx);
    let e = b.unary(op, d);
    b.div(e, sum)
}

/// `|t|` of an f32 tensor (the inputs of an error bound).
pub fn abs(t: &Tensor) -> Tensor {
    let v: Vec<f32> = t.to_vec::<f32>().unwrap().iter().map(|x| x.abs()).collect();
    Tensor::from_vec(t.shape().clone(), v).unwrap()
}

/// Packs `p`'s constants into panels as `cfg` wants them
/// (`kiln_flow::layout::pack_constants`); how many it packed.
pub fn pack_for(p: &mut FlowProgram, cfg: &Config) -> usize {
    let packing = Packing::new(&cfg.target, &cfg.options).unwrap();
    pack_constants(p, &|k, c| packing.widths(k, c))
}

/// The kernel of `p`'s first dispatch and its operands: the constants, and `input` for
/// a program input (panics on any other operand).
pub fn first_dispatch(p: &FlowProgram, input: Option<&Tensor>) -> (Kernel, Vec<Tensor>) {
    let d = &p.dispatches[0];
    let tensors = d
        .operands
        .iter()
        .map(|&b| match (&p.buffer(b).kind, input) {
            (BufferKind::Const(t), _) => t.clone(),
            (BufferKind::Input(_), Some(a)) => a.clone(),
            (other, _) => panic!("operand {other:?}"),
        })
        .collect();
    (d.kernel.clone(), tensors)
}

/// One depthwise window's geometry (the CPU depthwise suite's convolutions and pools,
/// and the CUDA window suite's fused convolutions).
#[derive(Clone, Copy, Debug)]
pub struct Geo {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub win: [usize; 2],
    pub stride: [usize; 2],
    pub dil: [usize; 2],
    /// Leading and trailing padding per axis: `[top, bottom, left, right]`.
    pub pad: [usize; 4],
}

impl Geo {
    /// The output's height and width.
    pub fn out(&self) -> [usize; 2] {
        let oh = (self.h + self.pad[0] + self.pad[1] - self.dil[0] * (self.win[0] - 1) - 1) / self.stride[0] + 1;
        let ow = (self.w + self.pad[2] + self.pad[3] - self.dil[1] * (self.win[1] - 1) - 1) / self.stride[1] + 1;
        [oh, ow]
    }
}

/// A hand-built depthwise convolution over `g` (inputs: image, filter `[C, 1, kh, kw]`,
/// bias, scale), summing `x · w` over the window; `epilogue` as in [`epilogue_of`]
/// ("none" for none).
pub fn depthwise(name: &str, g: Geo, epilogue: &str) -> Kernel {
    let [oh, ow] = g.out();
    let ins = vec![
        f32_type(&[g.n, g.c, g.h, g.w]),
        f32_type(&[g.c, 1, g.win[0], g.win[1]]),
        f32_type(&[g.c]),
        f32_type(&[g.c]),
    ];
    let mut b = KernelBuilder::new(name, ins, f32_type(&[g.n, g.c, oh, ow]));
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
    b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Input row (`d` = 0) or column (`d` = 1) of output position `out`, window tap `t`:
/// `out · stride + t · dilation − leading pad` (the tap multiplied only where the
/// dilation is above 1).
pub fn window_index(b: &mut KernelBuilder, g: Geo, out: ExprId, t: ExprId, d: usize) -> ExprId {
    let s = b.index(g.stride[d] as i64);
    let dl = (g.dil[d] > 1).then(|| b.index(g.dil[d] as i64));
    let p = b.index(-(g.pad[2 * d] as i64));
    let os = b.mul(out, s);
    let td = match dl {
        Some(dl) => b.mul(t, dl),
        None => t,
    };
    let i = b.add(os, td);
    b.add(i, p)
}

/// `epilogue` applied to `s`, with per-channel bias (input `bias_at`) and scale (the
/// next input): "bias_relu6" (bias add, then Relu6 as two compare-and-selects),
/// "relu" (`max(s, 0)`, no bias), "bias_hardswish" (bias add, then HardSwish: the
/// value times a chain of itself), "scale_clip" (scale and bias, `max(−1, ·)`,
/// `min(·, 2)`), anything else: `s`.
pub fn epilogue_of(b: &mut KernelBuilder, s: ExprId, channel: ExprId, bias_at: usize, epilogue: &str) -> ExprId {
    let f = ScalarType::F32;
    let bias = b.load(bias_at, vec![channel]);
    match epilogue {
        "bias_relu6" => {
            let v = b.add(s, bias);
            relu6(b, v)
        }
        "relu" => {
            let zero = b.float(f, 0.0);
            b.binary(BinaryOp::Max, s, zero)
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

/// The one kernel `kind` (attributes `a`, inputs of types `ins`, none of them constant)
/// lowers to through `kiln_lower`, or why there is none: parsing, inference or lowering
/// refused the op, or it lowered to several kernels.
pub fn lower_one(kind: OpKind, a: &Attrs, ins: &[TensorType]) -> Result<Kernel, String> {
    use kiln_ir::infer::{infer, InferInput};
    use kiln_lower::{lower_op, OpCx, OpInput};
    let op = Op::parse(kind, a).map_err(|e| format!("parse: {e}"))?;
    let inf: Vec<Option<InferInput>> = ins.iter().map(|t| Some(InferInput { ty: t, value: None })).collect();
    let out = infer(&op, &inf, 1).map_err(|e| format!("infer: {e}"))?;
    let cins: Vec<Option<OpInput>> = ins.iter().map(|t| Some(OpInput { ty: t, value: None })).collect();
    let cx = OpCx { op: &op, name: "op", inputs: &cins, outputs: &out };
    let mut l = lower_op(&cx).map_err(|e| format!("lower: {e}"))?;
    match l.steps.len() {
        1 => Ok(l.steps.remove(0).kernel),
        n => Err(format!("lowered to {n} kernels")),
    }
}

/// One window op's attributes as ONNX states them: kernel, strides, dilations, pads
/// (all begins, then all ends), ceil mode. Its methods lower the depthwise `Conv`, the
/// `MaxPool` and the `AveragePool` of these attributes over an f32 input of shape `x`
/// (the CPU depthwise and CUDA window suites).
pub struct Win<'a> {
    pub kernel: &'a [i64],
    pub strides: &'a [i64],
    pub dil: &'a [i64],
    pub pads: &'a [i64],
    pub ceil: bool,
}

impl Win<'_> {
    fn attrs(&self) -> Attrs {
        let mut a = Attrs::new();
        a.set("kernel_shape", Attr::Ints(self.kernel.to_vec()));
        a.set("strides", Attr::Ints(self.strides.to_vec()));
        a.set("pads", Attr::Ints(self.pads.to_vec()));
        a
    }

    /// A depthwise `Conv` (group = C, with bias; `ceil` is not an attribute of Conv).
    pub fn conv(&self, x: &[usize]) -> Result<Kernel, String> {
        let c = x[1];
        let mut a = self.attrs();
        a.set("group", Attr::Int(c as i64));
        a.set("dilations", Attr::Ints(self.dil.to_vec()));
        let mut wd = vec![c, 1];
        wd.extend(self.kernel.iter().map(|&k| k as usize));
        lower_one(OpKind::Conv, &a, &[f32_type(x), f32_type(&wd), f32_type(&[c])])
    }

    /// A `MaxPool`.
    pub fn max_pool(&self, x: &[usize]) -> Result<Kernel, String> {
        let mut a = self.attrs();
        a.set("ceil_mode", Attr::Int(self.ceil as i64));
        a.set("dilations", Attr::Ints(self.dil.to_vec()));
        lower_one(OpKind::MaxPool, &a, &[f32_type(x)])
    }

    /// An `AveragePool` (`dil` is not an attribute of AveragePool), counting the padding
    /// in its divisor where `include_pad`.
    pub fn average_pool(&self, x: &[usize], include_pad: bool) -> Result<Kernel, String> {
        let mut a = self.attrs();
        a.set("ceil_mode", Attr::Int(self.ceil as i64));
        a.set("count_include_pad", Attr::Int(include_pad as i64));
        lower_one(OpKind::AveragePool, &a, &[f32_type(x)])
    }
}

/// The tensors one lowered step reads: the op's inputs by position and the results of
/// the steps before it.
pub fn step_operands<'a>(
    operands: &[kiln_lower::Operand],
    inputs: &'a [Option<Tensor>],
    results: &'a [Tensor],
) -> Vec<&'a Tensor> {
    operands
        .iter()
        .map(|&o| match o {
            kiln_lower::Operand::Input(i) => inputs[i].as_ref().expect("operand"),
            kiln_lower::Operand::Step(s) => &results[s],
        })
        .collect()
}
