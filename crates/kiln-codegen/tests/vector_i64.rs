//! The i64 forms of the vector kernels (`cpu::rows`) against the kernel interpreter:
//! a cast of i64 data to bool (`x != 0`, an attention mask read as bool), and
//! arg-reductions (ArgMax/ArgMin, first or last position among equals) run a lane per
//! output position, their positions held as i32 lanes and stored widened to i64 — on
//! f32 operands (NaN, ±inf, signed zeros and equal values among them) and bool ones,
//! read contiguously across the output row or at a stride (a gather), and the select
//! between two positions that ArgMax's NaN rule lowers to.
//!
//! Loads whose offset is computed from i64 data read per lane (GatherND's
//! `table[clamp(wrap(idx[.., p, 1]))]`, all-MiniLM's attention mask): the index data
//! gathered into 64-bit lanes, wrapped and clamped there, narrowed to i32 offsets, then a
//! gather of the table — of i64 elements cast to bool (a bool output), or of f32 ones —
//! on indices negative, past either end, and beyond 32 bits.
//!
//! Output rows of 1, 3, 7, 8, 9, 15, 16, 17, 33 and 257 positions (masked tails on both
//! widths), reductions over 1, 2, 5 and 13 positions; each case first asserts that the
//! kernel took the vector path of each width this CPU runs (`CpuModule::paths`), then
//! compares exactly, in 1 and 3 workgroup ranges.

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CodePath, CpuTarget};
use kiln_flow::{BinaryOp, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

const LENGTHS: [usize; 10] = [1, 3, 7, 8, 9, 15, 16, 17, 33, 257];
const DEPTHS: [usize; 4] = [1, 2, 5, 13];

fn tt(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
}

fn check_vector(k: &Kernel, inputs: &[&Tensor]) {
    let variants = microkernel_variants(false);
    for cfg in &variants {
        let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
        let bits = if cfg.target == CpuTarget::X86_64V4 { 512 } else { 256 };
        assert_eq!(m.paths[0], CodePath::Vector { bits }, "{}: {}\n{k}", k.name, m.notes[0]);
    }
    check_with(k, inputs, EXACT, &variants);
}

/// f32 values from a short list with repeats (ties), NaN of both signs, infinities and
/// zeros of both signs, in an order that varies with `shift` and along each column.
fn values(dims: &[usize], shift: usize) -> Tensor {
    const V: [f32; 13] =
        [1.0, 0.0, -0.0, 2.5, f32::NAN, 1.0, f32::INFINITY, -1.0, f32::NEG_INFINITY, 2.5, -f32::NAN, 1e30, -1e30];
    let n: usize = dims.iter().product();
    let bits: Vec<u64> = (0..n).map(|i| V[(i * 7 + shift + i / 11) % V.len()].to_bits() as u64).collect();
    tensor_bits(DType::F32, dims, &bits)
}

#[test]
fn i64_cast_to_bool() {
    require_avx2_fma!();
    let vals: [i64; 8] = [0, 1, -1, 1 << 32, i64::MIN, i64::MAX, 0, 0x1_0000_0000_0000];
    for len in LENGTHS {
        let bits: Vec<u64> = (0..2 * len).map(|i| vals[(i * 3 + i / 5) % vals.len()] as u64).collect();
        let x = tensor_bits(DType::I64, &[2, len], &bits);
        // `cast(x, bool)` selecting between two f32 values, and as f32 itself.
        let mut b = KernelBuilder::new("i64_to_bool", vec![tt(DType::I64, &[2, len])], tt(DType::F32, &[2, len]));
        let o = b.out_index();
        let l = b.load(0, o);
        let c = b.cast(l, DType::Bool, false);
        let two = b.float(ScalarType::F32, 2.0);
        let neg = b.float(ScalarType::F32, -0.5);
        let s = b.select(c, two, neg);
        let f = b.cast(c, DType::F32, false);
        let r = b.add(s, f);
        let k = b.finish(r).unwrap();
        check_vector(&k, &[&x]);
    }
}

/// `op` over axis 1 of `[2, depth, len]` (`strided`: of `[2, len, depth]`, the operand
/// then read at a stride of `depth` along the output row), into `[2, len]` i64; `nan`:
/// of `isnan(x)` (a bool operand).
fn arg_kernel(op: ReduceOp, depth: usize, len: usize, strided: bool, nan: bool) -> Kernel {
    let dims = if strided { [2, len, depth] } else { [2, depth, len] };
    let mut b = KernelBuilder::new(
        format!("arg_{op:?}_{depth}_{len}_{strided}_{nan}").replace([' ', '{', '}', ':'], ""),
        vec![tt(DType::F32, &dims)],
        tt(DType::I64, &[2, len]),
    );
    let o = b.out_index();
    let j = b.new_var(depth as u64);
    let jv = b.var(j);
    let idx = if strided { vec![o[0], o[1], jv] } else { vec![o[0], jv, o[1]] };
    let x = b.load(0, idx);
    let body = if nan { b.unary(UnaryOp::IsNan, x) } else { x };
    let r = b.reduce(op, vec![j], body);
    b.finish(r).unwrap()
}

#[test]
fn arg_reductions_across_the_row() {
    require_avx2_fma!();
    for depth in DEPTHS {
        for len in LENGTHS {
            for strided in [false, true] {
                let dims = if strided { [2, len, depth] } else { [2, depth, len] };
                let x = values(&dims, depth + len);
                for last in [false, true] {
                    for op in [ReduceOp::ArgMax { last }, ReduceOp::ArgMin { last }] {
                        for nan in [false, true] {
                            check_vector(&arg_kernel(op, depth, len, strided, nan), &[&x]);
                        }
                    }
                }
            }
        }
    }
}

/// ArgMax with ONNX's NaN rule as `kiln-lower` writes it: the first (last) NaN where
/// there is one (`max(isnan(x) as f32) > 0`), else the first (last) maximum — a select
/// between two positions.
#[test]
fn arg_max_with_nan_rule() {
    require_avx2_fma!();
    for depth in DEPTHS {
        for len in LENGTHS {
            let x = values(&[2, depth, len], 3 * depth + len);
            for last in [false, true] {
                let mut b =
                    KernelBuilder::new("argmax_nan", vec![tt(DType::F32, &[2, depth, len])], tt(DType::I64, &[2, len]));
                let o = b.out_index();
                let fold = |b: &mut KernelBuilder| {
                    let j = b.new_var(depth as u64);
                    let jv = b.var(j);
                    (j, b.load(0, vec![o[0], jv, o[1]]))
                };
                let (j1, x1) = fold(&mut b);
                let best = b.reduce(ReduceOp::ArgMax { last }, vec![j1], x1);
                let (j2, x2) = fold(&mut b);
                let n2 = b.unary(UnaryOp::IsNan, x2);
                let at = b.reduce(ReduceOp::ArgMax { last }, vec![j2], n2);
                let (j3, x3) = fold(&mut b);
                let n3 = b.unary(UnaryOp::IsNan, x3);
                let f3 = b.cast(n3, DType::F32, false);
                let any = b.reduce(ReduceOp::Max, vec![j3], f3);
                let zero = b.float(ScalarType::F32, 0.0);
                let has = b.binary(BinaryOp::Gt, any, zero);
                let r = b.select(has, at, best);
                let k = b.finish(r).unwrap();
                check_vector(&k, &[&x]);
            }
        }
    }
}

/// A position used as anything but the output (here index arithmetic) keeps the kernel
/// off the vector path, with a reason; it still matches the interpreter.
#[test]
fn position_arithmetic_is_declined() {
    require_avx2_fma!();
    let x = values(&[2, 5, 9], 1);
    let mut b = KernelBuilder::new("argmax_plus", vec![tt(DType::F32, &[2, 5, 9])], tt(DType::I64, &[2, 9]));
    let o = b.out_index();
    let j = b.new_var(5);
    let jv = b.var(j);
    let l = b.load(0, vec![o[0], jv, o[1]]);
    let a = b.reduce(ReduceOp::ArgMax { last: false }, vec![j], l);
    let one = b.constant(ScalarType::I64, 1);
    let r = b.add(a, one);
    let k = b.finish(r).unwrap();
    for cfg in microkernel_variants(false) {
        let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
        assert!(!matches!(m.paths[0], CodePath::Vector { .. }), "{}", m.notes[0]);
    }
    check_with(&k, &[&x], EXACT, &microkernel_variants(false));
}

/// Index data for a table of `n` entries: in range, negative (wrapping), past either
/// end by one or by far, beyond 32 bits, and the i64 extremes.
fn index_data(n: i64, count: usize, shift: usize) -> Vec<u64> {
    let vals = [0, 1, n - 1, n, -1, -n, -n - 1, 5, (1 << 32) + 3, -(1 << 32), i64::MIN, i64::MAX, 2, -3, n + 7];
    (0..count).map(|i| vals[(i * 5 + shift + i / 13) % vals.len()] as u64).collect()
}

/// `table[0, clamp(wrap(idx[r, p, 1]), 0, n − 1)]` over `[2, len]` as GatherND lowers
/// it (`x < 0 ? x + n : x`, then `min(max(·, 0), n − 1)`): the index read at a stride of
/// two i64 elements; `table` i64 (cast to bool, a bool output) or f32 (scaled by 2).
fn gather_nd(n: usize, len: usize, table: DType) -> Kernel {
    let out = if table == DType::I64 { DType::Bool } else { DType::F32 };
    let mut b = KernelBuilder::new(
        format!("gather_nd_{n}_{len}_{}", table.name()),
        vec![tt(DType::I64, &[2, len, 2]), tt(table, &[1, n])],
        tt(out, &[2, len]),
    );
    let o = b.out_index();
    let one = b.index(1);
    let zero = b.index(0);
    let x = b.load(0, vec![o[0], o[1], one]);
    let neg = b.binary(BinaryOp::Lt, x, zero);
    let ext = b.index(n as i64);
    let up = b.add(x, ext);
    let w = b.select(neg, up, x);
    let last = b.index(n as i64 - 1);
    let lo = b.binary(BinaryOp::Max, w, zero);
    let c = b.binary(BinaryOp::Min, lo, last);
    let v = b.load(1, vec![zero, c]);
    let r = if table == DType::I64 {
        b.cast(v, DType::Bool, false)
    } else {
        let two = b.float(ScalarType::F32, 2.0);
        b.mul(v, two)
    };
    b.finish(r).unwrap()
}

#[test]
fn loads_at_offsets_from_i64_data() {
    require_avx2_fma!();
    for n in [1usize, 16, 37] {
        for len in LENGTHS {
            let idx = tensor_bits(DType::I64, &[2, len, 2], &index_data(n as i64, 4 * len, len));
            // Table entries zero and not (an attention mask), distinct per position.
            let ints: Vec<u64> = (0..n).map(|i| if i % 3 == 1 { 0 } else { (i as u64 + 1) << (i % 40) }).collect();
            let mask = tensor_bits(DType::I64, &[1, n], &ints);
            check_vector(&gather_nd(n, len, DType::I64), &[&idx, &mask]);
            let floats: Vec<u64> = (0..n).map(|i| (i as f32 * 0.75 - 3.0).to_bits() as u64).collect();
            let table = tensor_bits(DType::F32, &[1, n], &floats);
            check_vector(&gather_nd(n, len, DType::F32), &[&idx, &table]);
        }
    }
}

/// A bool output of eight lanes (stored as bytes) from an f32 comparison, every tail.
#[test]
fn bool_output_of_a_comparison() {
    require_avx2_fma!();
    for len in LENGTHS {
        let x = values(&[2, len], len);
        let mut b =
            KernelBuilder::new(format!("gt_{len}"), vec![tt(DType::F32, &[2, len])], tt(DType::Bool, &[2, len]));
        let o = b.out_index();
        let l = b.load(0, o);
        let h = b.float(ScalarType::F32, 0.5);
        let r = b.binary(BinaryOp::Gt, l, h);
        let k = b.finish(r).unwrap();
        check_vector(&k, &[&x]);
    }
}
