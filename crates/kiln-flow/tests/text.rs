//! The flow level's text form: hand-written texts parse to hand-built kernels and
//! programs, every printed kernel and program parses back to an equal one and prints
//! identically (random kernels from a seeded generator; programs formed from graphs are
//! checked by kiln-lower's filetests, every one of them), constants keep their exact
//! bits, errors point at the offending token, and mutated texts never panic the parser.

use kiln_filetest::fuzz::XorShiftStar as Rng;
use kiln_flow::kernel::{
    BinaryOp, Bounds, Expr, ExprId, Kernel, KernelBuilder, Node, ReduceOp, ScalarType, UnaryOp, VarId,
};
use kiln_flow::program::{Buffer, BufferId, BufferKind, Dispatch, FlowProgram};
use kiln_flow::text::{parse_kernel, parse_program, print_kernel, print_program};
use kiln_ir::{DType, Tensor, TensorType};

mod common;
use common::ty;

fn node(ty: ScalarType, expr: Expr) -> Node {
    Node { ty, expr }
}

fn e(i: u32) -> ExprId {
    ExprId(i)
}

/// Asserts print → parse → print is identical and parse(print(k)) == k.
fn round_trip_kernel(k: &Kernel) {
    let text = print_kernel(k);
    let back = parse_kernel(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, k, "\n{text}");
    assert_eq!(print_kernel(&back), text);
}

fn round_trip_program(p: &FlowProgram) -> String {
    let text = print_program(p);
    let back = parse_program(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(&back, p, "\n{text}");
    assert_eq!(print_program(&back), text);
    text
}

const EVERY_FORM: &str = "\
kernel @every_form(%0: f32[2,3], %1: i64[3], %2: bool[2]) -> f32[2,3] {
  vars v0<2 v1<3 v2<3 v3<3
  e0: i64 = v0
  e1: i64 = v1
  e2: f32 = load %0[e0, e1]
  e3: i64 = load %1[e1] clamp
  e4: bool = load %2[e0] pad 1
  e5: f32 = -0.0
  e6: f32 = nan(0x7FC00001)
  e7: f32 = max e2, e5
  e8: f32 = select e4, e7, e6
  e9: i64 = v2
  e10: f32 = load %0[e0, e9] pad -inf
  e11: f32 = reduce.max [v2] e10
  e12: i64 = v3
  e13: f32 = load %0[e0, e12]
  e14: i64 = reduce.argmax.last [v3] e13
  e15: i64 = add e3, e14
  e16: f32 = cast e15 to f32
  e17: f32 = exp e16
  e18: f32 = add e8, e11
  e19: f32 = mul e18, e17
  e20: f32 = cast e19 to f8E4M3FN nosat
  e21: f64 = 1e-300
  e22: u64 = 18446744073709551615
  e23: i8 = -128
  e24: f32 = nan
  e25: f64 = nan(0xFFF0000000000001)
  e26: f32 = 1.0000001
  e27: f32 = 1e-45
  yield e19
}";

#[test]
fn every_form_parses_to_the_kernel_it_describes() {
    let k = parse_kernel(EVERY_FORM).unwrap_or_else(|e| panic!("{e}"));
    use ScalarType::*;
    let want = Kernel {
        name: "every_form".into(),
        inputs: vec![ty(DType::F32, &[2, 3]), ty(DType::I64, &[3]), ty(DType::Bool, &[2])],
        output: ty(DType::F32, &[2, 3]),
        vars: vec![2, 3, 3, 3],
        nodes: vec![
            node(I64, Expr::Var(VarId(0))),
            node(I64, Expr::Var(VarId(1))),
            node(F32, Expr::Load { input: 0, index: vec![e(0), e(1)], bounds: Bounds::InBounds }),
            node(I64, Expr::Load { input: 1, index: vec![e(1)], bounds: Bounds::Clamp }),
            node(Bool, Expr::Load { input: 2, index: vec![e(0)], bounds: Bounds::Pad(1) }),
            node(F32, Expr::Const(0x8000_0000)),
            node(F32, Expr::Const(0x7FC0_0001)),
            node(F32, Expr::Binary(BinaryOp::Max, e(2), e(5))),
            node(F32, Expr::Select(e(4), e(7), e(6))),
            node(I64, Expr::Var(VarId(2))),
            node(F32, Expr::Load { input: 0, index: vec![e(0), e(9)], bounds: Bounds::Pad(0xFF80_0000) }),
            node(F32, Expr::Reduce { op: ReduceOp::Max, vars: vec![VarId(2)], body: e(10) }),
            node(I64, Expr::Var(VarId(3))),
            node(F32, Expr::Load { input: 0, index: vec![e(0), e(12)], bounds: Bounds::InBounds }),
            node(I64, Expr::Reduce { op: ReduceOp::ArgMax { last: true }, vars: vec![VarId(3)], body: e(13) }),
            node(I64, Expr::Binary(BinaryOp::Add, e(3), e(14))),
            node(F32, Expr::Cast { value: e(15), to: DType::F32, saturate: true }),
            node(F32, Expr::Unary(UnaryOp::Exp, e(16))),
            node(F32, Expr::Binary(BinaryOp::Add, e(8), e(11))),
            node(F32, Expr::Binary(BinaryOp::Mul, e(18), e(17))),
            node(F32, Expr::Cast { value: e(19), to: DType::F8E4M3FN, saturate: false }),
            node(F64, Expr::Const(1e-300f64.to_bits())),
            node(U64, Expr::Const(u64::MAX)),
            node(I8, Expr::Const(0x80)),
            node(F32, Expr::Const(0x7FC0_0000)),
            node(F64, Expr::Const(0xFFF0_0000_0000_0001)),
            // 1 + 2^-23, the f32 after 1.0.
            node(F32, Expr::Const(0x3F80_0001)),
            // The smallest subnormal f32.
            node(F32, Expr::Const(1)),
        ],
        root: e(19),
        scatter: None,
    };
    assert_eq!(k, want);
    assert_eq!(print_kernel(&k), EVERY_FORM);
}

#[test]
fn float_constants_print_exactly() {
    // (bits, text) pairs worked out by hand.
    let f32s: [(u32, &str); 10] = [
        (0x3F80_0000, "1.0"),
        (0x8000_0000, "-0.0"),
        (0x0000_0000, "0.0"),
        (0x7F80_0000, "inf"),
        (0xFF80_0000, "-inf"),
        (0x7FC0_0000, "nan"),
        (0xFFC0_0000, "nan(0xFFC00000)"),
        (0x7F80_0001, "nan(0x7F800001)"),
        (0x3DCC_CCCD, "0.1"),
        (0x7F7F_FFFF, "3.4028235e38"),
    ];
    for (bits, text) in f32s {
        check_constant(DType::F32, ScalarType::F32, u64::from(bits), "f32", text);
    }
    let f64s: [(u64, &str); 4] = [
        (0x7FF8_0000_0000_0000, "nan"),
        (0x7FF8_0000_0000_0001, "nan(0x7FF8000000000001)"),
        (1, "5e-324"),
        (0xBFF0_0000_0000_0000, "-1.0"),
    ];
    for (bits, text) in f64s {
        check_constant(DType::F64, ScalarType::F64, bits, "f64", text);
    }
}

/// Asserts a kernel yielding the constant `bits` of type `st` prints it as
/// `e0: {name} = {text}`, and round-trips.
fn check_constant(d: DType, st: ScalarType, bits: u64, name: &str, text: &str) {
    let mut b = KernelBuilder::new("c", vec![], ty(d, &[]));
    let c = b.constant(st, bits);
    let k = b.finish(c).unwrap();
    let printed = print_kernel(&k);
    assert!(printed.contains(&format!("e0: {name} = {text}\n")), "{bits:#x}: {printed}");
    round_trip_kernel(&k);
}

#[test]
fn pad_values_are_written_in_the_load_type() {
    let cases: [(DType, u64, &str); 6] = [
        (DType::F32, 0xFF80_0000, "pad -inf"),
        (DType::F32, 0x8000_0000, "pad -0.0"),
        (DType::I8, 0xFF, "pad -1"),
        (DType::U8, 0xFF, "pad 255"),
        (DType::Bool, 1, "pad 1"),
        (DType::F64, 0x7FF8_0000_0000_0002, "pad nan(0x7FF8000000000002)"),
    ];
    for (d, bits, text) in cases {
        let mut b = KernelBuilder::new("p", vec![ty(d, &[3])], ty(d, &[5]));
        let o = b.out_index();
        let one = b.index(1);
        let i = b.sub(o[0], one);
        let x = b.load_with(0, vec![i], Bounds::Pad(bits));
        let k = b.finish(x).unwrap();
        let printed = print_kernel(&k);
        assert!(printed.contains(&format!("load %0[e2] {text}\n")), "{printed}");
        round_trip_kernel(&k);
    }
}

/// A random well-typed kernel: loads of every input dtype (in bounds, padded or
/// clamped), constants with random bits, every unary and binary operation the types
/// allow, selects, casts to random dtypes, and reductions with their own variables.
fn random_kernel(rng: &mut Rng) -> Option<Kernel> {
    let rank = rng.below(3);
    let dims: Vec<usize> = (0..rank).map(|_| 1 + rng.below(4)).collect();
    let ninputs = rng.below(4);
    let inputs: Vec<TensorType> = (0..ninputs)
        .map(|_| {
            let d = *rng.pick(&DType::ALL);
            if rng.below(2) == 0 {
                ty(d, &dims)
            } else {
                let r = rng.below(3);
                let ds: Vec<usize> = (0..r).map(|_| 1 + rng.below(5)).collect();
                ty(d, &ds)
            }
        })
        .collect();
    let out_dtype = *rng.pick(&DType::ALL);
    let mut b = KernelBuilder::new(format!("r{}", rng.below(1000)), inputs.clone(), ty(out_dtype, &dims));
    let out = b.out_index();
    let mut pool: Vec<ExprId> = out.clone();
    let zero = b.index(0);
    pool.push(zero);
    let types = ScalarType::ALL;
    // Interesting constant bits: NaNs with payloads, signed zeros, infinities, extremes.
    let special: [u64; 10] = [
        0,
        1,
        0x8000_0000,
        0x7FC0_0001,
        0xFF80_0000,
        0x7FF0_0000_0000_0001,
        0x8000_0000_0000_0000,
        u64::MAX,
        0x7F7F_FFFF,
        0x3FB9_9999_9999_999A,
    ];
    let load = |b: &mut KernelBuilder, rng: &mut Rng, extra: Option<ExprId>| -> Option<ExprId> {
        if inputs.is_empty() {
            return None;
        }
        let i = rng.below(inputs.len());
        let t = &inputs[i];
        let st = ScalarType::of_storage(t.dtype);
        if t.shape.dims() == dims.as_slice() && extra.is_none() && rng.below(2) == 0 {
            let idx = (0..rank).map(|d| out[d]).collect();
            return Some(b.load(i, idx));
        }
        let mut idx = Vec::new();
        for d in 0..t.shape.rank() {
            let base = match (extra, rank) {
                (Some(x), _) if d == 0 => x,
                (_, 0) => b.index(rng.below(3) as i64 - 1),
                _ => out[rng.below(rank)],
            };
            let shift = b.index(rng.below(3) as i64 - 1);
            idx.push(b.add(base, shift));
        }
        let bounds = if rng.below(2) == 0 {
            let bits = st.wrap(*rng.pick(&special));
            Bounds::Pad(bits)
        } else {
            Bounds::Clamp
        };
        Some(b.load_with(i, idx, bounds))
    };
    for _ in 0..(3 + rng.below(20)) {
        let choice = rng.below(9);
        let new = match choice {
            0 => {
                let t = *rng.pick(&types);
                let bits = if rng.below(2) == 0 { *rng.pick(&special) } else { rng.next() };
                Some(b.constant(t, bits))
            }
            1 => load(&mut b, rng, None),
            2 => {
                let a = *rng.pick(&pool);
                let at = b.ty(a);
                let ops: Vec<UnaryOp> = UnaryOp::ALL
                    .iter()
                    .copied()
                    .filter(|op| (!op.float_only() || at.is_float()) && (*op != UnaryOp::Neg || at != ScalarType::Bool))
                    .collect();
                (!ops.is_empty()).then(|| b.unary(*rng.pick(&ops), a))
            }
            3 | 4 => {
                let a = *rng.pick(&pool);
                let at = b.ty(a);
                let same: Vec<ExprId> = pool.iter().copied().filter(|&x| b.ty(x) == at).collect();
                let c = *rng.pick(&same);
                let op = *rng.pick(&BinaryOp::ALL);
                // u64 products are left out: see the report on `Kernel::verify`.
                let ok = op.accepts(at) && !(op == BinaryOp::Mul && at == ScalarType::U64);
                ok.then(|| b.binary(op, a, c))
            }
            5 => {
                let conds: Vec<ExprId> = pool.iter().copied().filter(|&x| b.ty(x) == ScalarType::Bool).collect();
                if conds.is_empty() {
                    None
                } else {
                    let c = *rng.pick(&conds);
                    let a = *rng.pick(&pool);
                    Some(b.select(c, a, a))
                }
            }
            6 => {
                let a = *rng.pick(&pool);
                let to = *rng.pick(&DType::ALL);
                Some(b.cast(a, to, rng.below(2) == 0))
            }
            _ => {
                // A reduction over one or two new variables.
                let v = b.new_var(1 + rng.below(4) as u64);
                let vv = b.var(v);
                let body = load(&mut b, rng, Some(vv))?;
                let bt = b.ty(body);
                let op = *rng.pick(&ReduceOp::ALL);
                if bt == ScalarType::Bool && matches!(op, ReduceOp::Sum | ReduceOp::Prod) {
                    None
                } else if !op.is_arg() && rng.below(2) == 0 {
                    let w = b.new_var(1 + rng.below(3) as u64);
                    let wv = b.var(w);
                    let wc = b.convert(wv, bt);
                    let body2 = if bt == ScalarType::Bool {
                        b.binary(BinaryOp::And, body, wc)
                    } else {
                        b.binary(BinaryOp::Max, body, wc)
                    };
                    Some(b.reduce(op, vec![v, w], body2))
                } else {
                    Some(b.reduce(op, vec![v], body))
                }
            }
        };
        if let Some(n) = new {
            pool.push(n);
        }
    }
    let last = *pool.last()?;
    let root = b.cast(last, out_dtype, rng.below(2) == 0);
    b.finish(root).ok()
}

#[test]
fn random_kernels_round_trip() {
    let mut rng = Rng(0x5EED_F10A_7E47_0001);
    let mut built = 0;
    for _ in 0..3000 {
        if let Some(k) = random_kernel(&mut rng) {
            round_trip_kernel(&k);
            built += 1;
        }
    }
    assert!(built > 1500, "only {built} random kernels were valid");
}

fn tensor(d: DType, dims: &[usize], bytes: Vec<u8>) -> Tensor {
    Tensor::new(ty(d, dims), bytes.into()).unwrap()
}

/// A constant buffer named `name` whose tensor has the buffer's type.
fn const_buffer(name: &str, d: DType, dims: &[usize], bytes: Vec<u8>) -> Buffer {
    Buffer { ty: ty(d, dims), name: name.into(), kind: BufferKind::Const(tensor(d, dims, bytes)) }
}

/// A program whose buffers cover every kind, with constants of every dtype inline and
/// in blobs.
fn sample_program() -> FlowProgram {
    let mut buffers = vec![
        Buffer { ty: ty(DType::F32, &[2, 3]), name: "x".into(), kind: BufferKind::Input(0) },
        Buffer { ty: ty(DType::F32, &[3]), name: "".into(), kind: BufferKind::Input(1) },
    ];
    let f32_bits = [0x3F80_0000u32, 0x8000_0000, 0x7FC0_0001];
    let bytes: Vec<u8> = f32_bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    buffers.push(const_buffer("bias \"b\"\n", DType::F32, &[3], bytes));
    // 20 elements: a blob, with arbitrary bytes (NaN payloads included).
    let big: Vec<u8> = (0..80u32).map(|i| (i * 37 + 11) as u8).collect();
    buffers.push(const_buffer("w", DType::F32, &[4, 5], big));
    // A constant whose tensor type differs from its buffer's.
    let c: Vec<u8> = [1i64, -2].iter().flat_map(|v| v.to_le_bytes()).collect();
    buffers.push(Buffer {
        ty: ty(DType::I64, &[1, 2]),
        name: "shape".into(),
        kind: BufferKind::Const(tensor(DType::I64, &[2], c)),
    });
    // f16 (1.0, 1/3 rounded, a NaN with payload, -inf), bf16, bool (one byte not 0/1:
    // a blob), i4 with an odd count, f8 codes, an empty tensor.
    buffers.push(const_buffer("h", DType::F16, &[4], vec![0x00, 0x3C, 0x55, 0x35, 0x01, 0x7E, 0x00, 0xFC]));
    buffers.push(const_buffer("", DType::BF16, &[2], vec![0x80, 0x3F, 0xC1, 0xFF]));
    buffers.push(const_buffer("", DType::Bool, &[3], vec![1, 0, 1]));
    buffers.push(const_buffer("", DType::Bool, &[2], vec![1, 2]));
    buffers.push(const_buffer("", DType::I4, &[3], vec![0x8F, 0x07]));
    buffers.push(const_buffer("", DType::F8E4M3FN, &[2], vec![0x38, 0xFF]));
    buffers.push(const_buffer("", DType::U8, &[0], vec![]));
    // Results and an alias.
    buffers.push(Buffer { ty: ty(DType::F32, &[2, 3]), name: "y".into(), kind: BufferKind::Result });
    buffers.push(Buffer { ty: ty(DType::F32, &[6]), name: "y.flat".into(), kind: BufferKind::Alias(BufferId(12)) });
    let mut b =
        KernelBuilder::new("k0_0", vec![ty(DType::F32, &[2, 3]), ty(DType::F32, &[3])], ty(DType::F32, &[2, 3]));
    let o = b.out_index();
    let x = b.load(0, o.clone());
    let y = b.load(1, vec![o[1]]);
    let s = b.add(x, y);
    let k = b.finish(s).unwrap();
    let d =
        Dispatch::new(k, vec![BufferId(0), BufferId(2)], BufferId(12), vec!["Add add1".into(), "Relu \u{1}".into()]);
    FlowProgram {
        extents: Vec::new(),
        name: "sample model".into(),
        buffers,
        dispatches: vec![d],
        inputs: vec![BufferId(0), BufferId(1)],
        outputs: vec![BufferId(13), BufferId(3)],
    }
}

#[test]
fn program_round_trips_with_every_kind_of_buffer() {
    let text = round_trip_program(&sample_program());
    // Spot checks of the forms, written out by hand.
    for line in [
        "flow @\"sample model\"(%0, %1) {",
        "  %0: f32[2,3] = input 0 \"x\"",
        "  %1: f32[3] = input 1",
        "  %2: f32[3] = const [1.0, -0.0, nan(0x7FC00001)] \"bias \\\"b\\\"\\n\"",
        "  %3: f32[4,5] = const blob(0) \"w\"",
        "  %4: i64[1,2] = const i64[2] [1, -2] \"shape\"",
        // 0x3555 is the f16 nearest 1/3: 0.333251953125, shortest f32 form 0.33325195.
        "  %5: f16[4] = const [1.0, 0.33325195, nan(0x7E01), -inf] \"h\"",
        "  %6: bf16[2] = const [1.0, nan(0xFFC1)]",
        "  %7: bool[3] = const [true, false, true]",
        "  %8: bool[2] = const blob(1)",
        "  %9: i4[3] = const [-1, -8, 7]",
        "  %10: f8E4M3FN[2] = const [0x38, 0xFF]",
        "  %11: u8[0] = const []",
        "  %12: f32[2,3] = result \"y\"",
        "  %13: f32[6] = alias %12 \"y.flat\"",
        "  %12 = dispatch(%0, %2) class elementwise sources [\"Add add1\", \"Relu \\u{1}\"]",
        "    kernel @k0_0(%0: f32[2,3], %1: f32[3]) -> f32[2,3] {",
        "      yield e4",
        "    }",
        "  return %13, %3",
        "blobs {",
        "  0:",
        "  1:",
        "    \"AQI=\"",
    ] {
        assert!(text.lines().any(|l| l == line), "missing line {line:?} in\n{text}");
    }
    // The blob of %3: 80 bytes, 57 on the first line (76 base64 characters).
    let blob_lines: Vec<&str> = text.lines().skip_while(|l| *l != "  0:").skip(1).take(2).collect();
    assert_eq!(blob_lines[0].trim().len(), 78);
}

#[test]
fn large_constants_go_to_blobs_and_keep_their_bytes() {
    let mut p = sample_program();
    for n in [17usize, 57, 58, 1000] {
        let bytes: Vec<u8> = (0..n * 4).map(|i| (i * 131 + 7) as u8).collect();
        p.buffers[3] = Buffer {
            ty: ty(DType::F32, &[n]),
            name: "w".into(),
            kind: BufferKind::Const(tensor(DType::F32, &[n], bytes)),
        };
        let text = round_trip_program(&p);
        assert!(text.contains("const blob(0)"));
    }
    // 16 elements are inline.
    let bytes: Vec<u8> = (0..64).map(|i| (i * 3) as u8).collect();
    p.buffers[3] = Buffer {
        ty: ty(DType::U32, &[16]),
        name: "w".into(),
        kind: BufferKind::Const(tensor(DType::U32, &[16], bytes)),
    };
    let text = round_trip_program(&p);
    assert!(text.contains("%3: u32[16] = const [151388928, "), "{text}");
}

/// The position and message of a parse error.
fn err_kernel(src: &str) -> (usize, usize, String) {
    let e = parse_kernel(src).unwrap_err();
    (e.line, e.col, e.message)
}

fn err_program(src: &str) -> (usize, usize, String) {
    let e = parse_program(src).unwrap_err();
    (e.line, e.col, e.message)
}

#[test]
fn errors_name_the_line_column_and_what_was_expected() {
    let base = "kernel @k(%0: f32[2]) -> f32[2] {\n  vars v0<2\n  e0: i64 = v0\n  e1: f32 = load %0[e0]\n  yield e1\n}";
    assert!(parse_kernel(base).is_ok());
    let cases: Vec<(String, (usize, usize), &str)> = vec![
        (base.replace("vars v0<2", "vars v0 2"), (2, 11), "expected `<` after the variable"),
        (base.replace("e1: f32 = load", "e1 f32 = load"), (4, 6), "expected `:` after the node number"),
        (base.replace("load %0[e0]", "load %0[e1]"), (4, 21), "e1 is not defined before its use"),
        (base.replace("load %0[e0]", "load %3[e0]"), (4, 18), "input %3 does not exist"),
        (base.replace("e1: f32 = load", "e1: f33 = load"), (4, 7), "expected a scalar type"),
        (base.replace("yield e1", "yield e7"), (5, 9), "the root e7 does not exist"),
        (base.replace("e1: f32 = load", "e2: f32 = load"), (4, 3), "expected `e1`"),
        (base.replace("e0: i64 = v0", "e0: i64 = v9"), (3, 13), "variable v9 does not exist"),
        (base.replace("e0: i64 = v0", "e0: i64 = frob e0"), (3, 13), "unknown operation `frob`"),
        // The verifier's complaints point at the node.
        (base.replace("e1: f32 = load", "e1: i32 = load"), (4, 3), "invalid kernel"),
        (base.replace("vars v0<2", "vars v0<3"), (2, 3), "the first variables must be the output's dimensions"),
        (base.replace("yield e1\n}", "yield e1\n"), (6, 1), "expected `}` after `yield eN`"),
        (format!("{base} x"), (6, 3), "expected end of input, found `x`"),
        (base.replace("e0: i64 = v0", "e0: i64 = \"v0"), (3, 13), "unterminated string"),
        (base.replace("e0: i64 = v0", "e0: i64 = $"), (3, 13), "unexpected character '$'"),
        (base.replace("e0: i64 = v0", "e0: i64 = 99999999999999999999"), (3, 13), "out of range for i64"),
    ];
    for (src, (line, col), msg) in cases {
        let (l, c, m) = err_kernel(&src);
        assert_eq!((l, c), (line, col), "{m}\n{src}");
        assert!(m.contains(msg), "{m:?} should contain {msg:?}");
    }
    let prog = print_program(&sample_program());
    let cases: Vec<(String, &str)> = vec![
        (prog.replace("  %2: f32[3] = const", "  %5: f32[3] = const"), "expected `%2` (buffers are defined in order)"),
        (prog.replace("alias %12", "alias %13"), "an alias must refer to an earlier buffer"),
        (prog.replace("blob(0)", "blob(7)"), "blob 7 is not defined"),
        (prog.replace("dispatch(%0, %2)", "dispatch(%0, %3)"), "%3 is f32[4,5] but the kernel reads f32[3] there"),
        (prog.replace("dispatch(%0, %2)", "dispatch(%0)"), "1 operands for a kernel of 2 inputs"),
        (prog.replace("return %13, %3", "return %13, %30"), "buffer %30 is not defined"),
        (prog.replace("flow @\"sample model\"(%0, %1)", "flow @\"sample model\"(%1, %0)"), "program input 0 is %1"),
        (prog.replace("const [true, false, true]", "const [true, false]"), "the constant has 2 elements, type bool[3] needs 3"),
        (prog.replace("const [1.0, 0.33325195,", "const [1.0, 0.3333,"), "`0.3333` is not exactly a f16 value"),
        (prog.replace("%12: f32[2,3] = result", "%12: f32[2,3] = alias %0"), "is written by a dispatch but is not a `result` buffer"),
        (prog.replace("  return", "  %13 = dispatch(%12, %2)\n    kernel @a(%0: f32[2,3], %1: f32[3]) -> f32[2,3] {\n      vars v0<2 v1<3\n      e0: i64 = v0\n      yield e0\n    }\n  return"), "invalid kernel"),
    ];
    for (src, msg) in cases {
        let (l, c, m) = err_program(&src);
        assert!(m.contains(msg), "{l}:{c}: {m:?} should contain {msg:?}");
        assert!(l > 0 && c > 0);
    }
    // Positions in a program: the kernel's node line inside the dispatch.
    let bad = prog.replace("      e4: f32 = add e2, e3", "      e4: f32 = add e2, e9");
    let (l, c, m) = err_program(&bad);
    let want_line = prog.lines().position(|x| x == "      e4: f32 = add e2, e3").unwrap() + 1;
    assert_eq!((l, c), (want_line, 25), "{m}");
    // An unread base64 character: the column inside the string.
    let bad = prog.replace("\"AQI=\"", "\"AQ!=\"");
    let (l, c, m) = err_program(&bad);
    let want_line = prog.lines().position(|x| x == "    \"AQI=\"").unwrap() + 1;
    assert_eq!((l, c), (want_line, 8), "{m}");
    // A read of a result before it is written.
    let two = "flow @p(%0) {
  %0: f32[2] = input 0
  %1: f32[2] = result
  %2: f32[2] = result
  %2 = dispatch(%1) class movement
    kernel @a(%0: f32[2]) -> f32[2] {
      vars v0<2
      e0: i64 = v0
      e1: f32 = load %0[e0]
      yield e1
    }
  %1 = dispatch(%0) class movement
    kernel @b(%0: f32[2]) -> f32[2] {
      vars v0<2
      e0: i64 = v0
      e1: f32 = load %0[e0]
      yield e1
    }
  return %2
}
";
    assert_eq!(err_program(two), (5, 17, "%1 is read before a dispatch writes it".to_string()));
    let fixed = two.replacen("%2 = dispatch(%1)", "%1 = dispatch(%0)", 1).replacen(
        "  %1 = dispatch(%0) class movement\n    kernel @b",
        "  %2 = dispatch(%1) class movement\n    kernel @b",
        1,
    );
    let p = parse_program(&fixed).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(print_program(&p), fixed);
    // The class is optional (the kernel's own when left out), and must be the kernel's.
    let bare = fixed.replace(" class movement", "");
    assert_eq!(parse_program(&bare).map(|p| print_program(&p)), Ok(fixed.clone()));
    let wrong = fixed.replacen("class movement", "class rows", 1);
    assert_eq!(err_program(&wrong), (5, 27, "class rows, but the kernel is of class movement".to_string()));
    let unknown = fixed.replacen("class movement", "class gemm", 1);
    let (line, col, msg) = err_program(&unknown);
    assert_eq!((line, col), (5, 27));
    assert!(msg.starts_with("unknown kernel class `gemm`"), "{msg}");
}

/// Random edits of valid texts: the parser returns (never panics), and whatever it
/// accepts prints to a text that parses back to the same thing.
#[test]
fn mutations_never_panic() {
    let mut rng = Rng(0xBAD5_EED0_1234_5678);
    let mut bases: Vec<String> = vec![EVERY_FORM.to_string(), print_program(&sample_program())];
    let mut krng = Rng(77);
    while bases.len() < 8 {
        if let Some(k) = random_kernel(&mut krng) {
            bases.push(print_kernel(&k));
        }
    }
    let pieces = [
        "%",
        "%0",
        "%99",
        "e",
        "e0",
        "e999",
        "v",
        "v0",
        "v9",
        "<",
        ">",
        "->",
        "-",
        "@",
        "(",
        ")",
        "[",
        "]",
        "{",
        "}",
        ",",
        ":",
        "=",
        "\"",
        "\\",
        "0x",
        "0x7FC00001",
        "-1",
        "1e",
        "1e-",
        "nan(",
        "nan(0x1)",
        "inf",
        "-inf",
        "blob(",
        "blob(0)",
        "blobs",
        "load",
        "pad",
        "clamp",
        "reduce.sum",
        "reduce.argmax",
        "cast",
        "to",
        "nosat",
        "select",
        "kernel",
        "flow",
        "dispatch",
        "sources",
        "return",
        "yield",
        "vars",
        "const",
        "alias",
        "input",
        "result",
        "f32",
        "u64",
        "bool",
        "i4",
        "f16",
        "\n",
        " ",
        "//",
        "é",
        "99999999999999999999999",
        "18446744073709551616",
        "281474976710657",
        "=\"",
        "AAAA",
        "====",
    ];
    let mut accepted = 0;
    for round in 0..20_000 {
        let base = &bases[round % bases.len()];
        let mut s: Vec<char> = base.chars().collect();
        for _ in 0..1 + rng.below(3) {
            let at = rng.below(s.len() + 1);
            match rng.below(5) {
                0 if at < s.len() => {
                    s.remove(at);
                }
                1 => {
                    let p: Vec<char> = rng.pick(&pieces).chars().collect();
                    s.splice(at..at, p);
                }
                2 if at < s.len() => {
                    s[at] = char::from(b' ' + rng.below(95) as u8);
                }
                3 => {
                    // Duplicate or drop a span.
                    let end = (at + rng.below(12)).min(s.len());
                    if rng.below(2) == 0 {
                        let span: Vec<char> = s[at..end].to_vec();
                        s.splice(end..end, span);
                    } else {
                        s.drain(at..end);
                    }
                }
                _ => {
                    // Swap two lines.
                    let text: String = s.iter().collect();
                    let mut lines: Vec<&str> = text.lines().collect();
                    if lines.len() > 2 {
                        let a = rng.below(lines.len());
                        let b = rng.below(lines.len());
                        lines.swap(a, b);
                    }
                    s = lines.join("\n").chars().collect();
                }
            }
        }
        let text: String = s.into_iter().collect();
        if text.starts_with("kernel") {
            if let Ok(k) = parse_kernel(&text) {
                accepted += 1;
                let again = parse_kernel(&print_kernel(&k)).unwrap_or_else(|e| panic!("{e}\n{text}"));
                assert_eq!(again, k);
            }
        } else if let Ok(p) = parse_program(&text) {
            accepted += 1;
            let again = parse_program(&print_program(&p)).unwrap_or_else(|e| panic!("{e}\n{text}"));
            assert_eq!(again, p);
        }
        // Each parser also meets the other's text.
        let _ = parse_kernel(&text);
        let _ = parse_program(&text);
    }
    assert!(accepted > 100, "only {accepted} mutants parsed");
}

const SCATTER: &str = "kernel @sc(%0: f32[4,3], %1: i64[2,1], %2: f32[2,3]) -> f32[4,3] {
  vars v0<2 v1<3
  e0: i64 = v0
  e1: i64 = 0
  e2: i64 = load %1[e0, e1]
  e3: i64 = v1
  e4: i64 = 3
  e5: i64 = mul e2, e4
  e6: i64 = add e5, e3
  e7: f32 = load %2[e0, e3]
  scatter.add [v0, v1] e7 at e6
}";

#[test]
fn scatter_kernels_round_trip() {
    let k = parse_kernel(SCATTER).unwrap_or_else(|e| panic!("{e}"));
    let sc = k.scatter.clone().expect("a scatter kernel");
    assert_eq!((sc.rank, sc.at, sc.combine), (2, e(6), Some(BinaryOp::Add)));
    assert_eq!(print_kernel(&k), SCATTER);
    round_trip_kernel(&k);
    // No combination, and a single point.
    let none = SCATTER.replace("scatter.add", "scatter");
    round_trip_kernel(&parse_kernel(&none).unwrap_or_else(|e| panic!("{e}")));
    // Errors: a domain not made of the first variables, an unknown combination, a
    // missing position, a combination the value's type has none of.
    let (_, _, m) = err_kernel(&SCATTER.replace("[v0, v1]", "[v1]"));
    assert!(m.contains("expected `v0`"), "{m}");
    let (_, _, m) = err_kernel(&SCATTER.replace("scatter.add", "scatter.sub"));
    assert!(m.contains("cannot combine"), "{m}");
    let (_, _, m) = err_kernel(&SCATTER.replace("scatter.add", "scatter.frob"));
    assert!(m.contains("unknown scatter combination"), "{m}");
    let (_, _, m) = err_kernel(&SCATTER.replace(" at e6", ""));
    assert!(m.contains("expected `at eN`"), "{m}");
}
