//! The CUDA elementwise emitter (`cuda::elementwise`) on outputs and inputs of 1 and 2
//! bytes an element: f16, bf16, i16, u16 (up to 8 lanes a thread) and i8, u8, bool (up
//! to 16), packed into 32-bit words for one `st.global.v4/v2.b32` or `.b32`, and
//! narrow inputs read as words and unpacked.
//!
//! Every module is assembled by `ptxas -arch=sm_90a -v` (no stack frame, no spills)
//! and every kernel runs in the host PTX simulator (`kiln-ptxsim`) over its whole
//! launch, compared with the kernel interpreter bit for bit (NaN only as NaN: the PTX
//! ISA's conversions give the canonical NaN, the interpreter keeps a payload): on
//! random inputs with and without NaN, ±∞ and −0, and, for the conversions, on inputs
//! chosen to hit every rounding case: every f16 and every bf16 bit pattern, random f32
//! bit patterns over all exponents, ties to even, overflow to ∞, subnormals, and
//! integers that wrap.

mod ptxas;
use kiln_ptxsim as ptxsim;

use kiln_codegen::cuda;
use kiln_flow::class::{classify, KernelClass};
use kiln_flow::{BinaryOp, ExprId, Kernel, KernelBuilder, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn ty(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).expect("shape"))
}

/// Compiles `kernels` into one module; ptxas must accept it with no local memory in
/// any entry. Prints each entry's registers (the cost of the lanes).
fn build(tag: &str, kernels: &[Kernel]) -> cuda::CudaModule {
    let with_class: Vec<(&Kernel, KernelClass)> = kernels.iter().map(|k| (k, classify(k))).collect();
    let m = cuda::compile(&with_class).unwrap_or_else(|e| panic!("{tag}: {e}"));
    let usage = ptxas::assemble_ptx_verbose("cuda-elementwise", tag, m.ptx())
        .unwrap_or_else(|e| panic!("{tag}: ptxas refused the module:\n{e}"));
    assert_eq!(usage.len(), kernels.len(), "{tag}: ptxas -v reported {usage:?}");
    for (name, u) in &usage {
        assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{tag}: {name} uses local memory: {u:?}");
        let i = kernels.iter().position(|k| &k.name == name).expect("a kernel of the module");
        eprintln!("{tag}: {name}: {} registers; {}", u.registers, m.notes[i]);
    }
    m
}

fn grid(m: &cuda::CudaModule, i: usize) -> ptxsim::Grid {
    let l = m.launches[i];
    ptxsim::Grid { grid: l.grid as u32, block: l.block, shared: l.shared }
}

/// Runs every entry over its whole launch on random inputs (integers in `ints`), with
/// and without float specials, and compares every element exactly.
fn simulate(tag: &str, kernels: &[Kernel], m: &cuda::CudaModule, ints: (i64, i64)) {
    for (i, k) in kernels.iter().enumerate() {
        for specials in [false, true] {
            let c = ptxsim::Check { specials, ints, ..ptxsim::Check::exact(i as u64 + 7) };
            let o = ptxsim::check_against_interpreter(k, m.ptx(), i, grid(m, i), &c)
                .unwrap_or_else(|e| panic!("{tag}: {e}"));
            assert_eq!(o.compared, k.output.shape.numel(), "{tag}: {}", k.name);
        }
    }
}

/// Runs entry `i` of `m` (kernel `k`) over its whole launch on `inputs` and compares
/// every output element's bytes with the interpreter's run of `oracle` (`k` itself, or
/// a twin defined to store the same values) on them (a NaN with any NaN).
fn simulate_on(k: &Kernel, oracle: &Kernel, m: &cuda::CudaModule, i: usize, inputs: &[Tensor]) {
    let (got_t, want) = ptxsim::run_beside_interpreter(k, oracle, m.ptx(), i, grid(m, i), inputs);
    let got = got_t.bytes();
    let (gv, wv) = (got_t.to_f64_vec(), want.to_f64_vec());
    let esz = k.output.dtype.storage_bytes(1);
    let wb = want.bytes();
    let input = inputs[0].to_f64_vec();
    for j in 0..gv.len() {
        let (g, w) = (&got[j * esz..(j + 1) * esz], &wb[j * esz..(j + 1) * esz]);
        let ok = g == w || (gv[j].is_nan() && wv[j].is_nan());
        assert!(
            ok,
            "{}: element {j} (input {:e}): got {g:02X?} ({}), want {w:02X?} ({})",
            k.name, input[j], gv[j], wv[j]
        );
    }
}

/// The lanes the emitter should give a row of `row` elements of `size` bytes: the
/// widest group of 16, 8 or 4 bytes that tiles it.
fn lanes(size: usize, row: usize) -> Option<usize> {
    [16, 8, 4].into_iter().map(|g| g / size).find(|&l| row.is_multiple_of(l))
}

/// `out[i, j]` from `x[i, j]`, `y[0, j]` (broadcast over rows), `w[i, j + 3]` (a scalar
/// load at a shifted index) of dtype `d` and `z[i, 0]` (f32, once per group).
fn mixed(d: DType, row: usize) -> Kernel {
    let name = format!("m_{}_{row}", d.name());
    let inputs = vec![ty(d, &[3, row]), ty(d, &[1, row]), ty(d, &[3, row + 3]), ty(DType::F32, &[3, 1])];
    let mut b = KernelBuilder::new(&name, inputs, ty(d, &[3, row]));
    let idx = b.out_index();
    let (zero, three) = (b.index(0), b.index(3));
    let j3 = b.add(idx[1], three);
    let x = b.load(0, idx.clone());
    let y = b.load(1, vec![zero, idx[1]]);
    let w = b.load(2, vec![idx[0], j3]);
    let z = b.load(3, vec![idx[0], zero]);
    let zf = b.float(ScalarType::F32, 0.0);
    let pos = b.binary(BinaryOp::Gt, z, zf);
    let r = if d == DType::Bool {
        let a = b.binary(BinaryOp::And, x, y);
        let o = b.binary(BinaryOp::Xor, x, w);
        b.select(pos, a, o)
    } else if d.is_float() {
        // f32 arithmetic on widened halves, rounded once by the closing Cast.
        let p = b.mul(x, y);
        let q = b.add(p, z);
        let r = b.sub(q, w);
        b.cast(r, d, true)
    } else {
        let s = b.add(x, y);
        let t = b.sub(x, w);
        b.select(pos, s, t)
    };
    b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn narrow_outputs_take_the_widest_group_their_rows_allow() {
    let mut kernels = Vec::new();
    let mut want = Vec::new();
    for d in [DType::F16, DType::BF16, DType::I16, DType::U16, DType::I8, DType::U8, DType::Bool] {
        let size = d.storage_bytes(1);
        let rows: &[usize] =
            if size == 2 { &[2, 4, 6, 8, 12, 16, 24, 40, 5, 3] } else { &[4, 8, 12, 16, 20, 32, 48, 6, 2] };
        for &row in rows {
            kernels.push(mixed(d, row));
            want.push(lanes(size, row));
        }
    }
    let m = build("narrow", &kernels);
    for ((k, note), l) in kernels.iter().zip(&m.notes).zip(&want) {
        match l {
            Some(l) => {
                let words = l * k.output.dtype.storage_bytes(1) / 4;
                let st = if words == 1 { "b32".to_string() } else { format!("v{words}.b32") };
                // x and y are read whole; w (shifted) and z (per row) are not.
                let class = classify(k).name();
                assert_eq!(note, &format!("{class} ({l} lanes, {st} store, 2 vector loads)"), "{}", k.name);
            }
            None => assert!(note.starts_with("general (rows of"), "{}: {note}", k.name),
        }
    }
    simulate("narrow", &kernels, &m, (-128, 127));
    // Wide integers: i16/u16 lanes that wrap.
    let wide: Vec<Kernel> = [DType::I16, DType::U16].iter().map(|&d| mixed(d, 16)).collect();
    let mw = build("narrow16", &wide);
    simulate("narrow16", &wide, &mw, (-32768, 32767));
}

/// `out = cast(f(x), to)` over `[rows, row]`.
fn unary_cast(
    name: &str,
    from: DType,
    to: DType,
    dims: &[usize],
    f: impl Fn(&mut KernelBuilder, ExprId) -> ExprId,
) -> Kernel {
    let mut b = KernelBuilder::new(name, vec![ty(from, dims)], ty(to, dims));
    let idx = b.out_index();
    let x = b.load(0, idx);
    let r = f(&mut b, x);
    let r = b.cast(r, to, true);
    b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn narrow_inputs_are_read_as_words_and_unpacked() {
    let dims = [5, 32];
    let mut kernels = Vec::new();
    let pairs = [
        // Half to half: 128-bit loads and stores.
        (DType::F16, DType::F16),
        (DType::BF16, DType::BF16),
        (DType::F16, DType::BF16),
        (DType::BF16, DType::F16),
        // Half to 4- and 8-byte outputs: 8 and 4 bytes a group.
        (DType::F16, DType::F32),
        (DType::BF16, DType::F32),
        (DType::F16, DType::F64),
        (DType::BF16, DType::I32),
        // Bytes to wider and narrower lanes.
        (DType::I8, DType::F32),
        (DType::U8, DType::F16),
        (DType::Bool, DType::F32),
        (DType::Bool, DType::BF16),
        (DType::I8, DType::I8),
        (DType::U8, DType::Bool),
        (DType::I16, DType::I8),
        (DType::U16, DType::F16),
        (DType::I8, DType::I16),
        // Wide to narrow: two or more 16-byte loads a group.
        (DType::F32, DType::BF16),
        (DType::F32, DType::U8),
        (DType::F64, DType::F16),
        (DType::I32, DType::I8),
        (DType::I64, DType::Bool),
    ];
    for (from, to) in pairs {
        let name = format!("w_{}_{}", from.name(), to.name());
        kernels.push(unary_cast(&name, from, to, &dims, |b, x| {
            // A little arithmetic in the input's compute type (none on bool).
            let t = b.ty(x);
            if t == ScalarType::Bool {
                return x;
            }
            let one = if t.is_float() { b.float(t, 0.75) } else { b.int(t, 3) };
            b.binary(BinaryOp::Mul, x, one)
        }));
    }
    let m = build("words", &kernels);
    for (k, note) in kernels.iter().zip(&m.notes) {
        assert!(note.ends_with(", 1 vector loads)"), "{}: {note}", k.name);
    }
    let ptx = m.ptx();
    let entry = |name: &str| -> &str {
        let s = ptx.find(&format!(".entry {name}(")).expect("entry");
        let e = ptx[s..].find("\n}\n").map_or(ptx.len(), |e| s + e);
        &ptx[s..e]
    };
    // A half → half kernel reads and writes 128 bits a thread, with nothing scalar.
    let hh = entry("w_f16_f16");
    assert!(hh.contains("ld.global.v4.b32") && hh.contains("st.global.v4.b32"), "{hh}");
    assert!(!hh.contains("ld.global.b16") && !hh.contains("st.global.b16"), "{hh}");
    assert!(entry("w_f16_f32").contains("ld.global.v2.b32"));
    assert!(entry("w_i8_f32").contains("ld.global.b32"));
    assert_eq!(entry("w_f32_bf16").matches("ld.global.v4.f32").count(), 2);
    assert_eq!(entry("w_f32_u8").matches("ld.global.v4.f32").count(), 4);
    simulate("words", &kernels, &m, (-128, 127));
}

fn f32_tensor(dims: &[usize], bits: &[u32]) -> Tensor {
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    Tensor::new(ty(DType::F32, dims), bytes.into()).expect("f32 tensor")
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// f32 bit patterns that hit every rounding case of f16 and bf16 and of the integer
/// conversions, then random patterns over all exponents; `n` in all.
fn f32_cases(n: usize) -> Vec<u32> {
    let f = |x: f32| x.to_bits();
    let mut v = vec![
        f(0.0),
        f(-0.0),
        f(1.0),
        f(-1.0),
        // f16 ties (1 + 2⁻¹¹ to even below, 1 + 3·2⁻¹¹ to even above) and near-ties.
        f(1.0 + 2f32.powi(-11)),
        f(1.0 + 3.0 * 2f32.powi(-11)),
        f(-(1.0 + 2f32.powi(-11))),
        f(1.0 + 2f32.powi(-11) + 2f32.powi(-23)),
        // bf16 ties and near-ties.
        f(1.0 + 2f32.powi(-8)),
        f(1.0 + 3.0 * 2f32.powi(-8)),
        f(-(1.0 + 3.0 * 2f32.powi(-8))),
        f(1.0 + 2f32.powi(-8) - 2f32.powi(-23)),
        // f16's largest finite, the last value rounding to it, the tie to ∞, beyond.
        f(65504.0),
        f(65519.0),
        f(65520.0),
        f(-65520.0),
        f(1.0e6),
        // bf16's largest finite and f32's largest (rounds to ∞ in bf16).
        0x7F7F_0000,
        0x7F7F_7FFF,
        0x7F7F_8000,
        f(f32::MAX),
        f(f32::MIN),
        // f16 subnormals: the smallest, its half (tie to 0), 3/2 of it (tie to 2), less.
        f(2f32.powi(-24)),
        f(2f32.powi(-25)),
        f(3.0 * 2f32.powi(-25)),
        f(2f32.powi(-26)),
        f(-2f32.powi(-25)),
        f(2f32.powi(-14) - 2f32.powi(-25)),
        // f32 subnormals (bf16 subnormals).
        0x0000_0001,
        0x0000_8000,
        0x0001_8000,
        0x8000_8000,
        0x007F_FFFF,
        f(f32::NAN),
        f(-f32::NAN),
        0x7F80_0001,
        0x7FC0_1234,
        f(f32::INFINITY),
        f(f32::NEG_INFINITY),
        // Integer conversions: truncation, wrapping, saturation to 64 bits.
        f(127.9),
        f(-128.5),
        f(255.5),
        f(256.0),
        f(-1.5),
        f(300.7),
        f(-40000.0),
        f(65535.9),
        f(1.0e20),
        f(-1.0e20),
        f(0.4),
    ];
    let mut s = 0x1234_5678_9ABC_DEF1u64;
    while v.len() < n {
        v.push(xorshift(&mut s) as u32);
    }
    v.truncate(n);
    v
}

#[test]
fn casts_from_f32_round_and_wrap_as_the_interpreter() {
    let dims = [64, 48];
    let n = dims[0] * dims[1];
    let input = f32_tensor(&dims, &f32_cases(n));
    let outs = [DType::F16, DType::BF16, DType::I16, DType::U16, DType::I8, DType::U8, DType::Bool];
    let kernels: Vec<Kernel> =
        outs.iter().map(|&to| unary_cast(&format!("c_f32_{}", to.name()), DType::F32, to, &dims, |_, x| x)).collect();
    let m = build("cast_f32", &kernels);
    for (i, k) in kernels.iter().enumerate() {
        assert!(m.notes[i].starts_with("elementwise ("), "{}: {}", k.name, m.notes[i]);
        simulate_on(k, k, &m, i, std::slice::from_ref(&input));
    }
    // The store's own rounding (a root of f32 arithmetic, no Cast): x·1, stored.
    let (rounded, twins) = store_rounded(DType::F32, &[DType::F16, DType::BF16], &dims, |b, x| {
        let one = b.float(ScalarType::F32, 1.0);
        b.mul(x, one)
    });
    let m = build("store_f32", &rounded);
    for (i, (k, twin)) in rounded.iter().zip(&twins).enumerate() {
        simulate_on(k, twin, &m, i, std::slice::from_ref(&input));
    }
}

/// Kernels `out = f(x)` of f32 roots stored to each of `outs` with no Cast (the store
/// rounds to nearest even, kernel module docs, *Types*), and their twins
/// `out = cast(f(x))`, whose interpretation is the oracle: the interpreter rounds a
/// Cast exactly (`lowp::round_binary`), while its store of a non-Cast root goes through
/// `Tensor::from_f64` and the `half` crate's `f16/bf16::from_f64`, which drops the low
/// 32 bits of the f64 before rounding (a value just above a tie rounds as the tie).
fn store_rounded(
    from: DType,
    outs: &[DType],
    dims: &[usize],
    f: impl Fn(&mut KernelBuilder, ExprId) -> ExprId,
) -> (Vec<Kernel>, Vec<Kernel>) {
    let mut kernels = Vec::new();
    let mut twins = Vec::new();
    for &to in outs {
        for cast in [false, true] {
            let name = format!("s_{}_{}", from.name(), to.name());
            let mut b = KernelBuilder::new(&name, vec![ty(from, dims)], ty(to, dims));
            let idx = b.out_index();
            let x = b.load(0, idx);
            let r = f(&mut b, x);
            let r = if cast { b.cast(r, to, true) } else { r };
            let k = b.finish(r).unwrap_or_else(|e| panic!("{name}: {e}"));
            if cast {
                twins.push(k)
            } else {
                kernels.push(k)
            }
        }
    }
    (kernels, twins)
}

#[test]
fn every_half_bit_pattern_converts_as_the_interpreter() {
    // All 65536 patterns of each half type, widened exactly and narrowed again.
    let dims = [2048, 32];
    let all: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
    let mut kernels = Vec::new();
    let mut twins = Vec::new();
    let mut inputs = Vec::new();
    for from in [DType::F16, DType::BF16] {
        let t = Tensor::new(ty(from, &dims), all.clone().into()).expect("half tensor");
        for to in [DType::F32, DType::F16, DType::BF16, DType::I8, DType::U16, DType::Bool] {
            kernels.push(unary_cast(&format!("h_{}_{}", from.name(), to.name()), from, to, &dims, |_, x| x));

            inputs.push(t.clone());
        }
        // Half → half arithmetic rounded once by the store (no Cast): x·x − x.
        let (k, twin) = store_rounded(from, &[from], &dims, |b, x| {
            let sq = b.mul(x, x);
            b.sub(sq, x)
        });
        kernels.extend(k);
        twins.extend(twin);
        inputs.push(t);
    }
    let m = build("halves", &kernels);
    for (i, (k, t)) in kernels.iter().zip(&inputs).enumerate() {
        assert!(m.notes[i].ends_with(", 1 vector loads)"), "{}: {}", k.name, m.notes[i]);
        let oracle = twins.iter().find(|w| w.name == k.name).unwrap_or(k);
        simulate_on(k, oracle, &m, i, std::slice::from_ref(t));
    }
}

#[test]
fn integer_casts_to_narrow_types_wrap_as_the_interpreter() {
    let dims = [32, 64];
    let n = dims[0] * dims[1];
    let mut s = 0xDEAD_BEEF_u64;
    let mut v: Vec<i64> = vec![0, 1, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32769, 65535, 65536];
    v.extend(i32::MIN as i64..i32::MIN as i64 + 4);
    v.extend(i32::MAX as i64 - 3..=i32::MAX as i64);
    v.extend((0..).map(|_| xorshift(&mut s) as u32 as i32 as i64).take(n - v.len()));
    let input = Tensor::from_i64(DType::I32, Shape::new(dims.to_vec()).expect("shape"), &v).expect("i32 tensor");
    let outs = [DType::F16, DType::BF16, DType::I16, DType::U16, DType::I8, DType::U8, DType::Bool];
    let kernels: Vec<Kernel> =
        outs.iter().map(|&to| unary_cast(&format!("c_i32_{}", to.name()), DType::I32, to, &dims, |_, x| x)).collect();
    let m = build("cast_i32", &kernels);
    for (i, k) in kernels.iter().enumerate() {
        simulate_on(k, k, &m, i, std::slice::from_ref(&input));
    }
}

#[test]
fn long_lane_bodies_assemble_without_spills() {
    // Eight half lanes of GELU (erf's inline sequence), sixteen byte lanes of a
    // division and a square root: the lanes are unrolled, so these are the
    // register-heavy forms.
    let dims = [4, 64];
    let gelu = |b: &mut KernelBuilder, x: ExprId| {
        let c = b.float(ScalarType::F32, std::f64::consts::FRAC_1_SQRT_2);
        let half = b.float(ScalarType::F32, 0.5);
        let one = b.float(ScalarType::F32, 1.0);
        let s = b.mul(x, c);
        let e = b.unary(UnaryOp::Erf, s);
        let p = b.add(e, one);
        let h = b.mul(x, half);
        b.mul(h, p)
    };
    let kernels = vec![
        unary_cast("g_bf16", DType::BF16, DType::BF16, &dims, gelu),
        unary_cast("g_f16", DType::F16, DType::F16, &dims, gelu),
        // Correctly rounded operations only, so the integer and bool lanes compare
        // exactly: (x² + 1) / (√|x| + ½) · 30.
        unary_cast("x_u8", DType::F32, DType::U8, &dims, exact_body),
        unary_cast("x_bool", DType::BF16, DType::Bool, &dims, |b, x| {
            let r = exact_body(b, x);
            let k = b.float(ScalarType::F32, 40.0);
            b.binary(BinaryOp::Gt, r, k)
        }),
    ];
    let m = build("long", &kernels);
    for (k, note) in kernels.iter().zip(&m.notes) {
        assert!(note.starts_with("elementwise ("), "{}: {note}", k.name);
    }
    // GELU's erf is within its approximation's error (simulated exactly here): its
    // lanes are compared within one bf16 unit; the others exactly.
    for (i, k) in kernels.iter().enumerate() {
        let tol = if k.name.starts_with("g_") {
            ptxsim::Tol::Rel { rel: 2f64.powi(-7), abs: 2f64.powi(-18) }
        } else {
            ptxsim::Tol::Exact
        };
        let c = ptxsim::Check { specials: true, tol, ..ptxsim::Check::exact(i as u64 + 1) };
        let o =
            ptxsim::check_against_interpreter(k, m.ptx(), i, grid(&m, i), &c).unwrap_or_else(|e| panic!("long: {e}"));
        assert_eq!(o.compared, k.output.shape.numel());
    }
}

fn exact_body(b: &mut KernelBuilder, x: ExprId) -> ExprId {
    let one = b.float(ScalarType::F32, 1.0);
    let half = b.float(ScalarType::F32, 0.5);
    let k = b.float(ScalarType::F32, 30.0);
    let sq = b.mul(x, x);
    let n = b.add(sq, one);
    let a = b.unary(UnaryOp::Abs, x);
    let r = b.unary(UnaryOp::Sqrt, a);
    let d = b.add(r, half);
    let q = b.div(n, d);
    b.mul(q, k)
}
