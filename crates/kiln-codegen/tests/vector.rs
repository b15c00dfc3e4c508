//! The vector forms of general kernels (`cpu::vops`, run by `cpu::rows` on eight lanes
//! and, where this CPU has AVX-512 F, sixteen) against the kernel interpreter: every
//! operation of the shared vector table on each lane type it takes (f32, i32, u32,
//! i8 and u8 extended to 32 bits, bool as a vector mask), i64 comparisons read from
//! memory, rows shorter than a vector, trailing axes of one position, a reduction over
//! a comparison mask, and contraction epilogues that use the table (an i64 mask; the
//! quantize–dequantize round trip of the int8 graphs).
//!
//! Every case runs over row lengths 1, 3, 7, 8, 9, 15, 16, 17, 33 and 257 (below,
//! at and across both vector widths, with masked tails), on two rows, split into 1 and
//! 3 workgroup ranges (`run_compiled` also checks that nothing outside the output is
//! written). Inputs cycle through `specials` (zeros of both signs, ±inf, NaN, halves,
//! integer extremes), so NaN and infinities meet every operation. Each case first
//! asserts, from the classification the compiler reports (`CpuModule::paths`), that the
//! kernel took a vector path of the expected width, so a case cannot pass on the
//! general code generator.
//!
//! Bounds: exact (NaN matches any NaN), except exp and erf (the inline functions, within
//! 4·10⁻⁷ relative of libm: `tests/math.rs`), and f32 max/min of mixed-sign zeros,
//! whose sign the interpreter leaves open (see `ops.rs`).

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CodePath};
use kiln_flow::{BinaryOp, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

const LENGTHS: [usize; 10] = [1, 3, 7, 8, 9, 15, 16, 17, 33, 257];
const ROWS: usize = 2;

fn tt(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
}

/// `dims` elements of dtype `d`, cycling through its special values from `shift` on;
/// every third element is the one at shift 0 whatever `shift` is, so two inputs of
/// different shifts also hold equal pairs (which tell `<` from `<=`).
fn cycled(d: DType, dims: &[usize], shift: usize) -> Tensor {
    let s = specials(d);
    let n: usize = dims.iter().product();
    let bits: Vec<u64> = (0..n).map(|i| s[(i * 7 + if i % 3 == 0 { 0 } else { shift }) % s.len()]).collect();
    tensor_bits(d, dims, &bits)
}

/// Per row length of [`LENGTHS`], two `[ROWS, len]` operands of `d`: `x` cycled from
/// 0, `y` from `shift`.
fn operands(d: DType, shift: usize) -> impl Iterator<Item = (usize, Tensor, Tensor)> {
    LENGTHS.into_iter().map(move |len| (len, cycled(d, &[ROWS, len], 0), cycled(d, &[ROWS, len], shift)))
}

/// Checks `k` against the interpreter on every vector width this CPU runs, after
/// asserting that it took the vector path of that width.
fn check_vector(k: &Kernel, inputs: &[&Tensor], cmp: Cmp) {
    let variants = microkernel_variants(false);
    for cfg in &variants {
        let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
        let bits = if cfg.target == kiln_codegen::cpu::CpuTarget::X86_64V4 { 512 } else { 256 };
        assert_eq!(m.paths[0], CodePath::Vector { bits }, "{}: {}\n{k}", k.name, m.notes[0]);
    }
    check_with(k, inputs, cmp, &variants);
}

/// Checks the contraction `k` against the interpreter, exactly, on every vector width this
/// CPU runs, after asserting that each width compiled it as a contraction microkernel
/// (`what` names the case in a failure).
fn check_microkernel(k: &Kernel, inputs: &[&Tensor], what: &str) {
    let variants = microkernel_variants(false);
    for cfg in &variants {
        let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
        assert!(m.notes[0].starts_with("contraction microkernel"), "{what}: {}", m.notes[0]);
    }
    check_with(k, inputs, EXACT, &variants);
}

/// Rows and depth of the contraction-epilogue tests' products, `[EPI_M, EPI_K] ×
/// [EPI_K, n]`.
const EPI_M: usize = 5;
const EPI_K: usize = 12;

/// A contraction epilogue on the microkernel: the product of two matrices of small
/// integers (`small_integers` with `seeds`, so the sum is exact in any order) and `n`
/// columns, then `epilogue(b, o, sum)` over the output index `o`, reading the inputs
/// `extra` (inputs 2 on), checked exactly against the interpreter by
/// [`check_microkernel`].
fn check_epilogue(
    name: &str,
    n: usize,
    seeds: [u64; 2],
    extra: &[Tensor],
    epilogue: impl FnOnce(&mut KernelBuilder, Vec<ExprId>, ExprId) -> ExprId,
) {
    let f = DType::F32;
    let mut types = vec![tt(f, &[EPI_M, EPI_K]), tt(f, &[EPI_K, n])];
    types.extend(extra.iter().map(|t| t.ty().clone()));
    let mut b = KernelBuilder::new(name, types, tt(f, &[EPI_M, n]));
    let (o, sum) = b.matmul_sum(EPI_K);
    let r = epilogue(&mut b, o, sum);
    let k = b.finish(r).unwrap();
    let ab = [small_integers(&[EPI_M, EPI_K], seeds[0]), small_integers(&[EPI_K, n], seeds[1])];
    let refs: Vec<&Tensor> = ab.iter().chain(extra).collect();
    check_microkernel(&k, &refs, &format!("{name} n={n}"));
}

/// `out[r, j] = f(x[r, j], y[r, j])` for inputs of dtype `d` and an output of `out`.
fn binary_kernel(
    name: &str,
    d: DType,
    out: DType,
    len: usize,
    f: impl Fn(&mut KernelBuilder, ExprId, ExprId) -> ExprId,
) -> Kernel {
    let mut b = KernelBuilder::new(name, vec![tt(d, &[ROWS, len]), tt(d, &[ROWS, len])], tt(out, &[ROWS, len]));
    let o = b.out_index();
    let x = b.load(0, o.clone());
    let y = b.load(1, o);
    let r = f(&mut b, x, y);
    b.finish(r).unwrap()
}

/// A bool as 1.0 or 0.0 (the output has f32 lanes).
fn as_f32(b: &mut KernelBuilder, c: ExprId) -> ExprId {
    b.cast(c, DType::F32, false)
}

#[test]
fn f32_operations() {
    require_avx2_fma!();
    let f = DType::F32;
    for (len, x, y) in operands(f, 5) {
        for op in [
            UnaryOp::Neg,
            UnaryOp::Abs,
            UnaryOp::Sqrt,
            UnaryOp::Floor,
            UnaryOp::Ceil,
            UnaryOp::Round,
            UnaryOp::Trunc,
            UnaryOp::Exp,
            UnaryOp::Erf,
        ] {
            let k = binary_kernel(&format!("u_{}", op.name()), f, f, len, |b, x, _| b.unary(op, x));
            let inline = matches!(op, UnaryOp::Exp | UnaryOp::Erf);
            check_vector(&k, &[&x, &y], if inline { Cmp { zero_sign: false, rtol: 4e-7 } } else { EXACT });
        }
        let k = binary_kernel("isnan", f, f, len, |b, x, _| {
            let c = b.unary(UnaryOp::IsNan, x);
            as_f32(b, c)
        });
        check_vector(&k, &[&x, &y], EXACT);
        for op in BinaryOp::ALL {
            let k = match op {
                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min => {
                    binary_kernel(&format!("b_{}", op.name()), f, f, len, |b, x, y| b.binary(op, x, y))
                }
                op if op.is_comparison() => binary_kernel(&format!("c_{}", op.name()), f, f, len, |b, x, y| {
                    let c = b.binary(op, x, y);
                    as_f32(b, c)
                }),
                _ => continue,
            };
            let cmp =
                if matches!(op, BinaryOp::Max | BinaryOp::Min) { Cmp { zero_sign: true, ..EXACT } } else { EXACT };
            check_vector(&k, &[&x, &y], cmp);
        }
    }
}

/// The integer operations a vector lane computes by itself, besides the comparisons:
/// arithmetic that wraps (`+ − ×`), max and min, and the bitwise ones.
fn lane_arithmetic(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::And
            | BinaryOp::Or
            | BinaryOp::Xor
    )
}

#[test]
fn integer_operations() {
    require_avx2_fma!();
    for d in [DType::I32, DType::U32] {
        for (len, x, y) in operands(d, 3) {
            for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Not] {
                let k = binary_kernel(&format!("u_{}", op.name()), d, d, len, |b, x, _| b.unary(op, x));
                check_vector(&k, &[&x, &y], EXACT);
            }
            for op in BinaryOp::ALL {
                let k = match op {
                    op if lane_arithmetic(op) => {
                        binary_kernel(&format!("b_{}", op.name()), d, d, len, |b, x, y| b.binary(op, x, y))
                    }
                    op if op.is_comparison() => binary_kernel(&format!("c_{}", op.name()), d, d, len, |b, x, y| {
                        let c = b.binary(op, x, y);
                        b.cast(c, d, false)
                    }),
                    _ => continue,
                };
                check_vector(&k, &[&x, &y], EXACT);
            }
        }
    }
}

#[test]
fn bool_masks_select_and_casts() {
    require_avx2_fma!();
    let f = DType::F32;
    for (len, x, y) in operands(f, 4) {
        // Two masks combined every way a bool is, then selected on and cast.
        for op in [BinaryOp::And, BinaryOp::Or, BinaryOp::Xor, BinaryOp::Eq, BinaryOp::Ne] {
            let k = binary_kernel(&format!("m_{}", op.name()), f, f, len, |b, x, y| {
                let lt = b.binary(BinaryOp::Lt, x, y);
                let zero = b.float(ScalarType::F32, 0.0);
                let pos = b.binary(BinaryOp::Gt, x, zero);
                let m = b.binary(op, lt, pos);
                let n = b.unary(UnaryOp::Not, m);
                b.select(n, x, y)
            });
            check_vector(&k, &[&x, &y], EXACT);
        }
        // f32 → bool (NaN is true) → i32 → f32; and a bool constant.
        let k = binary_kernel("casts", f, f, len, |b, x, _| {
            let c = b.cast(x, DType::Bool, false);
            let t = b.constant(ScalarType::Bool, 1);
            let c = b.binary(BinaryOp::And, c, t);
            let i = b.cast(c, DType::I32, false);
            b.cast(i, DType::F32, false)
        });
        check_vector(&k, &[&x, &y], EXACT);
        // i32 → bool and i32 → f32; a select on i32 lanes.
        let (xi, yi) = (cycled(DType::I32, &[ROWS, len], 0), cycled(DType::I32, &[ROWS, len], 2));
        let k = binary_kernel("int_casts", DType::I32, f, len, |b, x, y| {
            let c = b.cast(x, DType::Bool, false);
            let s = b.select(c, x, y);
            b.cast(s, DType::F32, false)
        });
        check_vector(&k, &[&xi, &yi], EXACT);
    }
}

/// i8 and u8 values as 32-bit lanes: f32 converted to them (truncated to an i64,
/// saturating, NaN 0, then wrapped: the specials hold NaN, ±inf, ±2³¹, ±9.3e18 on either
/// side of 2⁶³, 1e30, 300, −129, 255.5 and halves) and back, every operation that wraps
/// (`+ − ×`, negation, absolute value, `not`) and those that keep the extended form
/// (max/min, comparisons, bitwise, select), with results read out as f32 and as i32.
#[test]
fn byte_lanes_from_f32() {
    require_avx2_fma!();
    let f = DType::F32;
    for len in LENGTHS {
        let (x, y) = (cycled(f, &[ROWS, len], 0), cycled(f, &[ROWS, len], 5));
        for d in [DType::I8, DType::U8] {
            let k = binary_kernel(&format!("to_{}", d.name()), f, f, len, |b, x, _| {
                let q = b.cast(x, d, true);
                b.cast(q, DType::F32, false)
            });
            check_vector(&k, &[&x, &y], EXACT);
            for op in [UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Not] {
                let k = binary_kernel(&format!("{}_u_{}", d.name(), op.name()), f, DType::I32, len, |b, x, _| {
                    let q = b.cast(x, d, false);
                    let r = b.unary(op, q);
                    b.cast(r, DType::I32, false)
                });
                check_vector(&k, &[&x, &y], EXACT);
            }
            for op in BinaryOp::ALL {
                if !lane_arithmetic(op) && !op.is_comparison() {
                    continue;
                }
                let k = binary_kernel(&format!("{}_b_{}", d.name(), op.name()), f, DType::I32, len, |b, x, y| {
                    let (qx, qy) = (b.cast(x, d, false), b.cast(y, d, false));
                    let r = b.binary(op, qx, qy);
                    if op.is_comparison() {
                        // The mask selects between the bytes, then casts to i32.
                        let s = b.select(r, qx, qy);
                        b.cast(s, DType::I32, false)
                    } else {
                        b.cast(r, DType::I32, false)
                    }
                });
                check_vector(&k, &[&x, &y], EXACT);
            }
        }
    }
}

/// i8 and u8 tensors read as lanes (along the row with masked tails, and one byte per
/// row broadcast), cast to and from every lane type: i32 and u32 wrap into bytes, a
/// byte of the other signedness wraps, bool gives 0 or 1, and a byte gives f32 exactly.
/// Row lengths add tails of 2, 4, 5, 6, 12, 13 and 14 bytes to [`LENGTHS`]' 1, 3, 7, 9
/// and 15, so every combination of the 4-, 2- and 1-byte pieces of an eight-lane tail
/// is read.
#[test]
fn byte_loads_and_casts() {
    require_avx2_fma!();
    for d in [DType::I8, DType::U8] {
        let other = if d == DType::I8 { DType::U8 } else { DType::I8 };
        for len in LENGTHS.into_iter().chain([2, 4, 5, 6, 12, 13, 14]) {
            let (x, y) = (cycled(d, &[ROWS, len], 0), cycled(d, &[ROWS, len], 3));
            // A DequantizeLinear: (x − zero point[row])·scale[row], the zero point a byte
            // broadcast along the row.
            let zp = cycled(d, &[ROWS, 1], 2);
            let sc = cycled(DType::F32, &[ROWS, 1], 2);
            let mut b = KernelBuilder::new(
                "dequant",
                vec![tt(d, &[ROWS, len]), tt(d, &[ROWS, 1]), tt(DType::F32, &[ROWS, 1])],
                tt(DType::F32, &[ROWS, len]),
            );
            let o = b.out_index();
            let lx = b.load(0, o.clone());
            let z = b.index(0);
            let lz = b.load(1, vec![o[0], z]);
            let ls = b.load(2, vec![o[0], z]);
            let (fx, fz) = (b.cast(lx, DType::F32, false), b.cast(lz, DType::F32, false));
            let diff = b.sub(fx, fz);
            let r = b.mul(diff, ls);
            let k = b.finish(r).unwrap();
            check_vector(&k, &[&x, &zp, &sc], EXACT);
            // Byte arithmetic straight from memory, to i32 and u32.
            for out in [DType::I32, DType::U32] {
                let k = binary_kernel(&format!("{}_loads", d.name()), d, out, len, |b, x, y| {
                    let s = b.add(x, y);
                    let m = b.binary(BinaryOp::Mul, s, x);
                    b.cast(m, out, false)
                });
                check_vector(&k, &[&x, &y], EXACT);
            }
            // Casts into bytes from i32, u32, the other byte type and bool; out of
            // bytes into bool and the other byte type.
            for from in [DType::I32, DType::U32] {
                let (xi, yi) = (cycled(from, &[ROWS, len], 0), cycled(from, &[ROWS, len], 4));
                let k = binary_kernel(&format!("{}_to_{}", from.name(), d.name()), from, DType::F32, len, |b, x, y| {
                    let q = b.cast(x, d, false);
                    let c = b.binary(BinaryOp::Lt, x, y);
                    let qc = b.cast(c, d, false);
                    let s = b.add(q, qc);
                    b.cast(s, DType::F32, false)
                });
                check_vector(&k, &[&xi, &yi], EXACT);
            }
            let k = binary_kernel(&format!("{}_to_{}", d.name(), other.name()), d, DType::I32, len, |b, x, y| {
                let o = b.cast(x, other, false);
                let c = b.cast(y, DType::Bool, false);
                let yo = b.cast(y, other, false);
                let s = b.select(c, o, yo);
                b.cast(s, DType::I32, false)
            });
            check_vector(&k, &[&x, &y], EXACT);
        }
    }
}

/// i64 values around the dword boundaries (equal low halves, different high halves),
/// and the extremes.
fn i64_values(dims: &[usize], shift: usize) -> Tensor {
    let vals: [i64; 12] = [0, 1, -1, 5, 80, 1 << 32, (1 << 32) + 5, -(1 << 32), i64::MIN, i64::MAX, 79, 0x7fff_ffff];
    let n: usize = dims.iter().product();
    let bits: Vec<u64> = (0..n).map(|i| vals[(i * 5 + shift) % vals.len()] as u64).collect();
    tensor_bits(DType::I64, dims, &bits)
}

#[test]
fn i64_comparisons_from_memory() {
    require_avx2_fma!();
    for len in LENGTHS {
        let (x, y) = (i64_values(&[ROWS, len], 0), i64_values(&[ROWS, len], 7));
        let s = i64_values(&[1], 4);
        for op in [BinaryOp::Eq, BinaryOp::Ne, BinaryOp::Lt, BinaryOp::Le, BinaryOp::Gt, BinaryOp::Ge] {
            // Two vectors; a vector and a broadcast (a sequence mask); a constant.
            let mut b = KernelBuilder::new(
                format!("q_{}", op.name()),
                vec![tt(DType::I64, &[ROWS, len]), tt(DType::I64, &[ROWS, len]), tt(DType::I64, &[1])],
                tt(DType::F32, &[ROWS, len]),
            );
            let o = b.out_index();
            let lx = b.load(0, o.clone());
            let ly = b.load(1, o);
            let z = b.index(0);
            let ls = b.load(2, vec![z]);
            let c80 = b.constant(ScalarType::I64, 80);
            let c1 = b.binary(op, lx, ly);
            let c2 = b.binary(op, lx, ls);
            let c3 = b.binary(op, c80, ly);
            let a = b.binary(BinaryOp::Xor, c1, c2);
            let a = b.binary(BinaryOp::Or, a, c3);
            let f1 = b.cast(a, DType::F32, false);
            let f2 = b.cast(c2, DType::F32, false);
            let two = b.float(ScalarType::F32, 2.0);
            let f2 = b.mul(f2, two);
            let r = b.add(f1, f2);
            let k = b.finish(r).unwrap();
            check_vector(&k, &[&x, &y, &s], EXACT);
        }
    }
}

#[test]
fn short_rows_and_unit_axes() {
    require_avx2_fma!();
    for len in LENGTHS {
        // Relu over [1, n, 1]: the vector axis is the middle one.
        let x = cycled(DType::F32, &[1, len, 1], 1);
        let mut b = KernelBuilder::new("relu", vec![tt(DType::F32, &[1, len, 1])], tt(DType::F32, &[1, len, 1]));
        let o = b.out_index();
        let l = b.load(0, o);
        let zero = b.float(ScalarType::F32, 0.0);
        let lt = b.binary(BinaryOp::Lt, l, zero);
        let r = b.select(lt, zero, l);
        let k = b.finish(r).unwrap();
        check_vector(&k, &[&x], EXACT);
        // A masked row sum: `Σⱼ x[r, j]·[j < n] / s` into [rows, 1] (one output lane a
        // row), the mask an i64 comparison of a position table with a length.
        let xs = random_f32(&[3, len], 1.0, len as u64);
        let pos: Vec<u64> = (0..len as u64).collect();
        let pos = tensor_bits(DType::I64, &[len], &pos);
        let n = tensor_bits(DType::I64, &[1], &[(len as u64).div_ceil(2)]);
        let mut b = KernelBuilder::new(
            "masked_sum",
            vec![tt(DType::F32, &[3, len]), tt(DType::I64, &[len]), tt(DType::I64, &[1])],
            tt(DType::F32, &[3, 1]),
        );
        let o = b.out_index();
        let j = b.new_var(len as u64);
        let jv = b.var(j);
        let x = b.load(0, vec![o[0], jv]);
        let p = b.load(1, vec![jv]);
        let z = b.index(0);
        let nl = b.load(2, vec![z]);
        let m = b.binary(BinaryOp::Lt, p, nl);
        let mf = b.cast(m, DType::F32, false);
        let v = b.mul(x, mf);
        let s = b.reduce(ReduceOp::Sum, vec![j], v);
        let k = b.finish(s).unwrap();
        // The sum is reassociated (one partial sum per lane): within len·2⁻²⁴·Σ|x|.
        let want = kiln_flow::interp::run(&k, &[&xs, &pos, &n]).unwrap().to_vec::<f32>().unwrap();
        for cfg in microkernel_variants(false) {
            let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
            assert!(matches!(m.paths[0], CodePath::Vector { .. }), "{}", m.notes[0]);
            let got = run_compiled(&k, &[&xs, &pos, &n], &cfg, 3).to_vec::<f32>().unwrap();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() <= len as f32 * f32::EPSILON * 2.0, "{len}: got {g}, want {w}");
            }
        }
    }
}

/// A matrix product whose epilogue multiplies by a column mask from an i64 comparison
/// (`(pos[n] < len) as f32`, a sequence mask fused into a convolution) and adds a
/// residual: the contraction microkernel takes it, with the comparison and the cast
/// from the shared vector table, over column counts with masked tails. The sum is
/// the microkernel's (`tests/contraction.rs` bounds it); here the masked columns must be
/// exactly 0 + residual·0 and the others within `K·2⁻²³·Σ|a·b|`.
#[test]
fn contraction_epilogue_with_an_i64_mask() {
    require_avx2_fma!();
    let (m, kk) = (EPI_M, EPI_K);
    for n in LENGTHS {
        let f = DType::F32;
        let mut b = KernelBuilder::new(
            "masked_mm",
            vec![tt(f, &[m, kk]), tt(f, &[kk, n]), tt(f, &[m, n]), tt(DType::I64, &[n]), tt(DType::I64, &[1])],
            tt(f, &[m, n]),
        );
        let (o, s) = b.matmul_sum(kk);
        let res = b.load(2, o.clone());
        let p = b.load(3, vec![o[1]]);
        let z = b.index(0);
        let len = b.load(4, vec![z]);
        let lt = b.binary(BinaryOp::Lt, p, len);
        let mf = b.cast(lt, DType::F32, false);
        let a = b.add(s, res);
        let r = b.mul(a, mf);
        let k = b.finish(r).unwrap();
        let ins = [
            random_f32(&[m, kk], 1.0, 3),
            random_f32(&[kk, n], 1.0, 4),
            random_f32(&[m, n], 1.0, 5),
            tensor_bits(DType::I64, &[n], &(0..n as u64).collect::<Vec<_>>()),
            tensor_bits(DType::I64, &[1], &[(n as u64 + 1) / 2]),
        ];
        let refs: Vec<&Tensor> = ins.iter().collect();
        let want = kiln_flow::interp::run(&k, &refs).unwrap().to_vec::<f32>().unwrap();
        for cfg in microkernel_variants(false) {
            let module = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
            assert!(module.notes[0].starts_with("contraction microkernel"), "{n}: {}", module.notes[0]);
            let got = run_compiled(&k, &refs, &cfg, 3).to_vec::<f32>().unwrap();
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let masked = i % n >= (n + 1) / 2;
                let ok = if masked { *g == 0.0 } else { (g - w).abs() <= kk as f32 * 2.0 * f32::EPSILON * 16.0 };
                assert!(ok, "n={n} [{i}]: got {g}, want {w}");
            }
        }
    }
}

/// Loads that stride along the row (a transposed operand, as gathers): `x[j, r]` of an
/// `[len, 3]` (f32 and i32) or `[len, 5]` input read along `j` beside a contiguous
/// `y[r, j]`, and a row maximum over a strided column (its tail masked to −∞), over
/// every row length (masked tails on both widths).
#[test]
fn strided_loads() {
    require_avx2_fma!();
    for len in LENGTHS {
        for (d, cols) in [(DType::F32, 3), (DType::I32, 3), (DType::F32, 5)] {
            let mut b =
                KernelBuilder::new("transposed", vec![tt(d, &[len, cols]), tt(d, &[cols, len])], tt(d, &[cols, len]));
            let o = b.out_index();
            let x = b.load(0, vec![o[1], o[0]]);
            let y = b.load(1, o);
            let r = b.binary(BinaryOp::Sub, x, y);
            let k = b.finish(r).unwrap();
            let ins = [cycled(d, &[len, cols], 0), cycled(d, &[cols, len], 3)];
            check_vector(&k, &[&ins[0], &ins[1]], EXACT);
        }
        let x = cycled(DType::F32, &[len, 3], 1);
        let mut b = KernelBuilder::new("column_max", vec![tt(DType::F32, &[len, 3])], tt(DType::F32, &[3, 1]));
        let o = b.out_index();
        let j = b.new_var(len as u64);
        let jv = b.var(j);
        let l = b.load(0, vec![jv, o[0]]);
        let m = b.reduce(ReduceOp::Max, vec![j], l);
        let k = b.finish(m).unwrap();
        check_vector(&k, &[&x], EXACT);
    }
}

/// Integer-valued f32 in [−20, 20]: products and sums of at most 2²⁴ in magnitude are
/// exact in any order, so a contraction over them matches the interpreter exactly.
fn small_integers(dims: &[usize], seed: u64) -> Tensor {
    let mut r = Rng(seed);
    let n: usize = dims.iter().product();
    let bits: Vec<u64> = (0..n).map(|_| (((r.next() % 41) as f32) - 20.0).to_bits() as u64).collect();
    tensor_bits(DType::F32, dims, &bits)
}

/// Contraction epilogues of the static-int8 graphs: QuantizeLinear then
/// DequantizeLinear (`x/s`, NaN to 0, rounded half to even, plus a zero point that is
/// an i8/u8 constant cast to f32, clamped, cast to the byte and back, minus the zero
/// point, times s), a raw f32 → byte → f32 cast (truncating and wrapping), and
/// floor/ceil/trunc, all on the contraction microkernel of both widths (a select on
/// `isnan` included). The matrices hold small integers, so the sums are exact in any
/// order; the residual added before the epilogue cycles through the f32 specials
/// (NaN, ±inf, halves, values past 2³¹ and 2⁶³), and the scale 0.5 turns odd sums into
/// ties: the comparison with the interpreter is exact.
#[test]
fn contraction_epilogue_quantize_round_trip() {
    require_avx2_fma!();
    for n in LENGTHS {
        let f = DType::F32;
        let residual = [cycled(f, &[EPI_M, n], 1)];
        for d in [DType::I8, DType::U8] {
            let st = if d == DType::I8 { ScalarType::I8 } else { ScalarType::U8 };
            let (lo, hi, zp) = if d == DType::I8 { (-128.0, 127.0, 253u64) } else { (0.0, 255.0, 128) };
            for variant in ["qdq", "cast", "floor", "ceil", "trunc"] {
                check_epilogue(&format!("{variant}_{d}"), n, [3 + n as u64, 5], &residual, |b, o, sum| {
                    let res = b.load(2, o);
                    let x = b.add(sum, res);
                    match variant {
                        "qdq" => {
                            let s = b.float(ScalarType::F32, 0.5);
                            let q = b.div(x, s);
                            let zc = b.constant(st, zp);
                            let z = b.cast(zc, DType::F32, false);
                            let nan = b.unary(UnaryOp::IsNan, q);
                            let rq = b.unary(UnaryOp::Round, q);
                            let zero = b.float(ScalarType::F32, 0.0);
                            let rq = b.select(nan, zero, rq);
                            let rq = b.add(rq, z);
                            let (l, h) = (b.float(ScalarType::F32, lo), b.float(ScalarType::F32, hi));
                            let rq = b.binary(BinaryOp::Max, rq, l);
                            let rq = b.binary(BinaryOp::Min, rq, h);
                            let qb = b.cast(rq, d, true);
                            let back = b.cast(qb, DType::F32, false);
                            let back = b.sub(back, z);
                            b.mul(back, s)
                        }
                        "cast" => {
                            let qb = b.cast(x, d, false);
                            b.cast(qb, DType::F32, false)
                        }
                        "floor" => b.unary(UnaryOp::Floor, x),
                        "ceil" => b.unary(UnaryOp::Ceil, x),
                        _ => b.unary(UnaryOp::Trunc, x),
                    }
                });
            }
        }
    }
}

/// A contraction epilogue that reads bool tensors (an attention mask: a per-row and a
/// per-column bool, and-ed, selecting 0 or the lowest f32 to add to the product), on
/// the contraction microkernel over every column count (tails of 1..7 bytes read in
/// pieces); the bool bytes alternate irregularly, and the sums are of small integers,
/// so the comparison with the interpreter is exact.
#[test]
fn contraction_epilogue_with_bool_loads() {
    require_avx2_fma!();
    let m = EPI_M;
    for n in LENGTHS {
        let bools =
            |len: usize, seed: u64| -> Vec<u64> { (0..len as u64).map(|i| ((i * 7 + seed) % 5 < 3) as u64).collect() };
        let masks = [tensor_bits(DType::Bool, &[m, 1], &bools(m, 1)), tensor_bits(DType::Bool, &[1, n], &bools(n, 2))];
        check_epilogue("attention_mask", n, [11, 13], &masks, |b, o, sum| {
            let z = b.index(0);
            let rm = b.load(2, vec![o[0], z]);
            let cm = b.load(3, vec![z, o[1]]);
            let both = b.binary(BinaryOp::And, rm, cm);
            let (zero, low) = (b.float(ScalarType::F32, 0.0), b.float(ScalarType::F32, f32::MIN as f64));
            let add = b.select(both, zero, low);
            b.add(sum, add)
        });
    }
}

/// Bool tensors read by a row kernel: along the row (masked tails of every length) and
/// one per row broadcast, selecting between two f32 rows.
#[test]
fn bool_loads() {
    require_avx2_fma!();
    let f = DType::F32;
    for len in LENGTHS.into_iter().chain([2, 4, 5, 6, 12, 13, 14]) {
        let mut b = KernelBuilder::new(
            "where",
            vec![tt(DType::Bool, &[ROWS, len]), tt(DType::Bool, &[ROWS, 1]), tt(f, &[ROWS, len]), tt(f, &[ROWS, len])],
            tt(f, &[ROWS, len]),
        );
        let o = b.out_index();
        let z = b.index(0);
        let c = b.load(0, o.clone());
        let rc = b.load(1, vec![o[0], z]);
        let x = b.load(2, o.clone());
        let y = b.load(3, o);
        let c = b.binary(BinaryOp::And, c, rc);
        let r = b.select(c, x, y);
        let k = b.finish(r).unwrap();
        let bits: Vec<u64> = (0..(ROWS * len) as u64).map(|i| ((i * 5 + 1) % 3 == 0) as u64).collect();
        let ins = [
            tensor_bits(DType::Bool, &[ROWS, len], &bits),
            tensor_bits(DType::Bool, &[ROWS, 1], &[1, 0]),
            cycled(f, &[ROWS, len], 0),
            cycled(f, &[ROWS, len], 3),
        ];
        let refs: Vec<&Tensor> = ins.iter().collect();
        check_vector(&k, &refs, EXACT);
    }
}

/// Embedding lookups: a table row picked by a token id read from memory once per row
/// (`x[clamp(id < 0 ? id + V : id), :]`, a clamped load as Gather lowers it) plus a
/// position row, over every row length, with ids that wrap (−1, −V), that fall outside
/// on either side (clamped: V, V + 3, −V − 2), and i32 ids cast to i64; and an i8 table
/// cast to f32 and scaled (a weight-only quantised embedding), its clamps written as
/// `min(max(·))` on an in-bounds load; and i32 ids read through a reshape's flat index
/// (`ids[0, t rem T]`, affine once the remainder is taken apart), as a one-hot product
/// rewritten into a lookup reads them. (Rows of one element
/// are left out: the vector axis is then the tokens', along which the id varies — a
/// gather, not a row-indexed load.)
#[test]
fn row_indexed_loads() {
    require_avx2_fma!();
    let (v, t) = (7usize, 9usize);
    let ids: [i64; 9] = [0, 6, -1, -7, 7, 10, -9, 3, 5];
    for len in LENGTHS.into_iter().filter(|&l| l > 1) {
        for (table_ty, id_ty, reshaped) in [
            (DType::F32, DType::I64, false),
            (DType::F32, DType::I32, false),
            (DType::I8, DType::I64, false),
            (DType::F32, DType::I32, true),
        ] {
            let mut b = KernelBuilder::new(
                "embedding",
                vec![tt(table_ty, &[v, len]), tt(id_ty, &[1, t]), tt(DType::F32, &[t, len])],
                tt(DType::F32, &[1, t, len]),
            );
            let o = b.out_index();
            let z = b.index(0);
            let at = if reshaped {
                let tv = b.index(t as i64);
                b.binary(BinaryOp::Rem, o[1], tv)
            } else {
                o[1]
            };
            let id = b.load(1, vec![z, at]);
            let id = b.cast(id, DType::I64, false);
            let neg = b.binary(BinaryOp::Lt, id, z);
            let vv = b.index(v as i64);
            let wrapped = b.add(id, vv);
            let row = b.select(neg, wrapped, id);
            let e = if table_ty == DType::F32 {
                b.load_with(0, vec![row, o[2]], kiln_flow::Bounds::Clamp)
            } else {
                // Clamps written as index arithmetic (as the int8 graph's Gather has
                // them) on an in-bounds load: the row's from data, the column's a no-op.
                let clamp = |b: &mut KernelBuilder, x: ExprId, n: usize| {
                    let (lo, hi) = (b.index(0), b.index(n as i64 - 1));
                    let x = b.binary(BinaryOp::Max, x, lo);
                    b.binary(BinaryOp::Min, x, hi)
                };
                let row = clamp(&mut b, row, v);
                let col = clamp(&mut b, o[2], len);
                let e = b.load(0, vec![row, col]);
                let f = b.cast(e, DType::F32, false);
                let s = b.float(ScalarType::F32, 0.25);
                b.mul(f, s)
            };
            let p = b.load(2, vec![o[1], o[2]]);
            let r = b.add(e, p);
            let k = b.finish(r).unwrap();
            let idt = tensor_bits(id_ty, &[1, t], &ids.iter().map(|&i| id_ty_bits(id_ty, i)).collect::<Vec<_>>());
            let ins = [cycled(table_ty, &[v, len], 0), idt, cycled(DType::F32, &[t, len], 2)];
            let refs: Vec<&Tensor> = ins.iter().collect();
            check_vector(&k, &refs, EXACT);
        }
    }
}

/// The stored bits of `x` as a `d` (i32 or i64).
fn id_ty_bits(d: DType, x: i64) -> u64 {
    if d == DType::I32 {
        x as i32 as u32 as u64
    } else {
        x as u64
    }
}

/// i64 values converted to f32 in a contraction epilogue (an attention mask input cast
/// to f32 and added): a per-element and a per-row operand over every column count,
/// holding the i64 specials (the extremes, values across 2³² and 2⁵³) and double-rounding
/// traps — `±(2⁶⁰ + 2³⁶ ± 1)`, whose f64 rounding lands on an f32 tie, the tie itself,
/// `2²⁴ + 1` and `2⁵³ + 3` — so the result must round correctly, not through f64. The
/// sums are of small integers and the comparison with the interpreter is exact.
#[test]
fn contraction_epilogue_i64_to_f32() {
    require_avx2_fma!();
    let (m, f) = (EPI_M, DType::F32);
    let mut vals: Vec<i64> = specials(DType::I64).into_iter().map(|b| b as i64).collect();
    for x in
        [(1i64 << 60) + (1 << 36) + 1, (1 << 60) + (1 << 36) - 1, (1 << 60) + (1 << 36), (1 << 24) + 1, (1 << 53) + 3]
    {
        vals.extend([x, -x]);
    }
    let pick = |len: usize, shift: usize| -> Vec<u64> {
        (0..len).map(|i| vals[(i * 5 + shift) % vals.len()] as u64).collect()
    };
    for n in LENGTHS {
        let masks = [tensor_bits(DType::I64, &[m, n], &pick(m * n, 0)), tensor_bits(DType::I64, &[m], &pick(m, 3))];
        check_epilogue("i64_mask", n, [17, 19], &masks, |b, o, sum| {
            let x = b.load(2, o.clone());
            let r = b.load(3, vec![o[0]]);
            let (fx, fr) = (b.cast(x, f, false), b.cast(r, f, false));
            let a = b.add(sum, fx);
            b.mul(a, fr)
        });
    }
}

/// Column reductions (a sum or max over an axis before the output row's, `Σ_j x[b, j, i]`,
/// run inside the output loop): a plain column sum over the f32 specials (NaN and ±inf
/// propagate as in the interpreter), a column max of a product with a value along the
/// reduction only plus an output-row value, and a masked mean (two column sums, one
/// divided by the clamped other), over two row counts (one, and three rows of bases)
/// and every row length. Each lane adds in the kernel's order, so the comparison is
/// exact.
#[test]
fn column_reductions() {
    require_avx2_fma!();
    let f = DType::F32;
    let j = 5usize;
    for len in LENGTHS {
        for rows in [1usize, 3] {
            let x = cycled(f, &[rows, j, len], 0);
            let y = cycled(f, &[j], 4);
            let m = cycled(f, &[rows, j, len], 6);
            let z = cycled(f, &[rows, len], 2);
            for variant in ["sum", "max", "mean"] {
                let mut b = KernelBuilder::new(
                    variant,
                    vec![tt(f, &[rows, j, len]), tt(f, &[j]), tt(f, &[rows, j, len]), tt(f, &[rows, len])],
                    tt(f, &[rows, len]),
                );
                let o = b.out_index();
                let w = b.new_var(j as u64);
                let wv = b.var(w);
                let lx = b.load(0, vec![o[0], wv, o[1]]);
                let r = match variant {
                    "sum" => b.reduce(ReduceOp::Sum, vec![w], lx),
                    "max" => {
                        let ly = b.load(1, vec![wv]);
                        let p = b.mul(lx, ly);
                        let mx = b.reduce(ReduceOp::Max, vec![w], p);
                        let lz = b.load(3, o.clone());
                        b.add(mx, lz)
                    }
                    _ => {
                        let lm = b.load(2, vec![o[0], wv, o[1]]);
                        let p = b.mul(lx, lm);
                        let s = b.reduce(ReduceOp::Sum, vec![w], p);
                        let w2 = b.new_var(j as u64);
                        let wv2 = b.var(w2);
                        let lm2 = b.load(2, vec![o[0], wv2, o[1]]);
                        let c = b.reduce(ReduceOp::Sum, vec![w2], lm2);
                        let eps = b.float(ScalarType::F32, 1e-9);
                        let c = b.binary(BinaryOp::Max, c, eps);
                        b.div(s, c)
                    }
                };
                let k = b.finish(r).unwrap();
                let cmp = Cmp { zero_sign: variant != "sum", ..EXACT };
                check_vector(&k, &[&x, &y, &m, &z], cmp);
            }
        }
    }
}

/// A masked mean over tokens as sentence encoders pool (`Σ_t x[t, i]·m[t, i] /
/// max(Σ_t m[t, i], 1e-9)` with `m` an i64 attention mask converted to f32 in both column
/// reductions): eight lanes (the i64 conversion has no sixteen-lane form), so on an
/// AVX-512 CPU the kernel takes the eight-lane row kernel too. The mask holds 0/1 and
/// the i64 specials.
#[test]
fn column_reductions_of_an_i64_mask() {
    require_avx2_fma!();
    let f = DType::F32;
    let t = 7usize;
    let s = specials(DType::I64);
    for len in LENGTHS {
        let mut b = KernelBuilder::new(
            "masked_mean",
            vec![tt(f, &[1, t, len]), tt(DType::I64, &[1, t, len])],
            tt(f, &[1, len]),
        );
        let o = b.out_index();
        let z = b.index(0);
        let (w, w2) = (b.new_var(t as u64), b.new_var(t as u64));
        let (wv, wv2) = (b.var(w), b.var(w2));
        let x = b.load(0, vec![z, wv, o[1]]);
        let m = b.load(1, vec![z, wv, o[1]]);
        let mf = b.cast(m, f, false);
        let p = b.mul(x, mf);
        let sum = b.reduce(ReduceOp::Sum, vec![w], p);
        let m2 = b.load(1, vec![z, wv2, o[1]]);
        let mf2 = b.cast(m2, f, false);
        let cnt = b.reduce(ReduceOp::Sum, vec![w2], mf2);
        let eps = b.float(ScalarType::F32, 1e-9);
        let c = b.binary(BinaryOp::Max, cnt, eps);
        let r = b.div(sum, c);
        let k = b.finish(r).unwrap();
        let bits: Vec<u64> =
            (0..t * len).map(|i| if i % 3 == 0 { s[(i / 3) % s.len()] } else { (i % 2) as u64 }).collect();
        let ins = [cycled(f, &[1, t, len], 1), tensor_bits(DType::I64, &[1, t, len], &bits)];
        for cfg in microkernel_variants(false) {
            let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
            assert_eq!(m.paths[0], CodePath::Vector { bits: 256 }, "{}", m.notes[0]);
        }
        check_with(&k, &[&ins[0], &ins[1]], Cmp { zero_sign: true, ..EXACT }, &microkernel_variants(false));
    }
}

/// Index lanes: positions along the row as i32 lanes. A concatenation along the row
/// (`p < A ? a[r, min(p, A − 1)] : b[max(p − A, 0), r]`, the second part transposed, as
/// fused Concat kernels read their pieces: gathers at computed offsets, a select on a
/// position mask) and a padding written as index arithmetic (`inside(p − 1) ?
/// f(x[r, clamp(p − 1)]) : 0` with the row coordinate tested too), over every row
/// length; the loads stay in bounds by their clamps, and the comparison is exact.
#[test]
fn index_lanes() {
    require_avx2_fma!();
    let f = DType::F32;
    let rows = 3usize;
    for len in LENGTHS.into_iter().filter(|&l| l > 1) {
        let a_len = len / 2 + 1;
        let b_len = len - a_len;
        if b_len > 0 {
            let mut b =
                KernelBuilder::new("concat", vec![tt(f, &[rows, a_len]), tt(f, &[b_len, rows])], tt(f, &[rows, len]));
            let o = b.out_index();
            let p = o[1];
            let (ca, ca1, zero) = (b.index(a_len as i64), b.index(a_len as i64 - 1), b.index(0));
            let pa = b.binary(BinaryOp::Min, p, ca1);
            let la = b.load(0, vec![o[0], pa]);
            let pb = b.sub(p, ca);
            let pb = b.binary(BinaryOp::Max, pb, zero);
            let lb = b.load(1, vec![pb, o[0]]);
            let c = b.binary(BinaryOp::Lt, p, ca);
            let r = b.select(c, la, lb);
            let k = b.finish(r).unwrap();
            let ins = [cycled(f, &[rows, a_len], 0), cycled(f, &[b_len, rows], 3)];
            check_vector(&k, &[&ins[0], &ins[1]], EXACT);
        }
        // A padding by one on each side of [rows, len − 2], as index arithmetic.
        let n = len - 2;
        if n > 0 {
            let mut b = KernelBuilder::new("pad", vec![tt(f, &[rows, n])], tt(f, &[rows, len]));
            let o = b.out_index();
            let (zero, one, last, last_row) = (b.index(0), b.index(1), b.index(n as i64 - 1), b.index(rows as i64 - 1));
            let q = b.sub(o[1], one);
            let ge = b.binary(BinaryOp::Ge, q, zero);
            let le = b.binary(BinaryOp::Le, q, last);
            let inside = b.binary(BinaryOp::And, ge, le);
            let row_ok = b.binary(BinaryOp::Le, o[0], last_row);
            let inside = b.binary(BinaryOp::And, inside, row_ok);
            let qc = b.binary(BinaryOp::Max, q, zero);
            let qc = b.binary(BinaryOp::Min, qc, last);
            let x = b.load(0, vec![o[0], qc]);
            let two = b.float(ScalarType::F32, 2.0);
            let v = b.mul(x, two);
            let fz = b.float(ScalarType::F32, 0.0);
            let r = b.select(inside, v, fz);
            let k = b.finish(r).unwrap();
            check_vector(&k, &[&cycled(f, &[rows, n], 1)], EXACT);
        }
    }
}

/// Padded loads in a row kernel (`Bounds::Pad`), checked per lane where the index may
/// leave the input: a shift along the row past both ends (`x[r, j − 2]`, pad 7.5), a
/// row shift that pads whole rows (`y[r − 1, j]`, pad 0), and an index that leaves a
/// dimension of one position (`z[r, j, max(r − 1, 0)]`, as fused Pad chains read),
/// over every row length; exact.
#[test]
fn padded_loads() {
    require_avx2_fma!();
    let f = DType::F32;
    let rows = 3usize;
    for len in LENGTHS.into_iter().filter(|&l| l > 3) {
        let n = len - 3;
        let mut b = KernelBuilder::new(
            "padded",
            vec![tt(f, &[rows, n]), tt(f, &[rows, len]), tt(f, &[rows, len, 1])],
            tt(f, &[rows, len]),
        );
        let o = b.out_index();
        let (one, two, zero) = (b.index(1), b.index(2), b.index(0));
        let j2 = b.sub(o[1], two);
        let x = b.load_with(0, vec![o[0], j2], kiln_flow::Bounds::Pad(7.5f32.to_bits() as u64));
        let r1 = b.sub(o[0], one);
        let y = b.load_with(1, vec![r1, o[1]], kiln_flow::Bounds::Pad(0));
        let m = b.binary(BinaryOp::Max, r1, zero);
        let z = b.load_with(2, vec![o[0], o[1], m], kiln_flow::Bounds::Pad(0));
        let s = b.add(x, y);
        let r = b.add(s, z);
        let k = b.finish(r).unwrap();
        let ins = [cycled(f, &[rows, n], 0), cycled(f, &[rows, len], 3), cycled(f, &[rows, len, 1], 5)];
        check_vector(&k, &[&ins[0], &ins[1], &ins[2]], EXACT);
    }
}

/// Output axes joined into one vector axis where every load reads them contiguously:
/// an `[a, b, c]` elementwise kernel with a full input, a per-`a` input (untouched
/// along the run) and an input with its first two axes swapped (contiguous along `c`
/// only, which keeps the axes apart), over odd sizes.
#[test]
fn joined_axes() {
    require_avx2_fma!();
    let f = DType::F32;
    for (a, b2, c) in [(3, 7, 9), (2, 1, 17), (5, 3, 2), (1, 15, 16)] {
        for transposed in [false, true] {
            let mut kb = KernelBuilder::new(
                "joined",
                vec![tt(f, &[a, b2, c]), tt(f, &[a]), tt(f, &[b2, a, c])],
                tt(f, &[a, b2, c]),
            );
            let o = kb.out_index();
            let x = kb.load(0, o.clone());
            let s = kb.load(1, vec![o[0]]);
            let mut r = kb.mul(x, s);
            if transposed {
                let t = kb.load(2, vec![o[1], o[0], o[2]]);
                r = kb.add(r, t);
            }
            let zero = kb.float(ScalarType::F32, 0.0);
            let r = kb.binary(BinaryOp::Max, r, zero);
            let k = kb.finish(r).unwrap();
            let ins = [cycled(f, &[a, b2, c], 0), cycled(f, &[a], 3), cycled(f, &[b2, a, c], 5)];
            let refs: Vec<&Tensor> = ins.iter().collect();
            check_vector(&k, &refs, Cmp { zero_sign: true, ..EXACT });
        }
    }
}

/// `x^y` with `y` a run-time value (`cpu::math`'s `Vx::pow`: `exp(y·ln|x|)` and the
/// special cases of C's `pow`), on the row kernels and in a contraction's epilogue, on
/// every vector width this CPU runs, against the interpreter (libm's `powf`): exact
/// (sign included) wherever that gives 0, ±1, ±inf or NaN, else within
/// `(2 + |y·ln|x||)·2⁻²³` relative (the error of `ln` carried through the exponent) and
/// one subnormal step, ±inf allowed where that bound reaches past the largest float.
/// Inputs: every pair of special values (both zeros, ±1, ±inf, NaN, subnormals, the
/// largest floats, halves, odd and even integers of both signs, integers past 2²⁴), then
/// a sweep of positive bases to powers in range and negative bases to integer powers.
#[test]
fn f32_pow_with_a_run_time_exponent() {
    require_avx2_fma!();
    let sp: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-40,
        -1e-40,
        f32::MAX,
        -f32::MAX,
        0.5,
        -0.5,
        2.0,
        -2.0,
        3.0,
        -3.0,
        1.5,
        -1.5,
        0.25,
        7.0,
        -7.0,
        16777217.0,
        33554432.0,
        -33554433.0,
        2147483648.0,
        4294967296.0,
        1e-3,
        100.0,
        -100.0,
    ];
    let (mut xs, mut ys): (Vec<f32>, Vec<f32>) = sp.iter().flat_map(|&x| sp.iter().map(move |&y| (x, y))).unzip();
    let mut r = Rng(0x5EED_0F_0123_4567);
    for i in 0..4000 {
        let (x, y) = if i % 2 == 0 {
            let x = (r.unit() * 7.0).exp2() as f32;
            (x, (r.unit() * 80.0 / f64::from(x).log2().abs().max(1.0)) as f32)
        } else {
            (-(r.unit().abs() * 4.0 + 0.01) as f32, (r.unit() * 20.0).round() as f32)
        };
        xs.push(x);
        ys.push(y);
    }
    let n = xs.len();
    let f = DType::F32;
    let t = |v: &[f32]| tensor_bits(f, &[1, n], &v.iter().map(|x| x.to_bits() as u64).collect::<Vec<_>>());
    let (tx, ty) = (t(&xs), t(&ys));
    let mut b = KernelBuilder::new("pow", vec![tt(f, &[1, n]), tt(f, &[1, n])], tt(f, &[1, n]));
    let o = b.out_index();
    let (x, y) = (b.load(0, o.clone()), b.load(1, o));
    let p = b.binary(BinaryOp::Pow, x, y);
    let k = b.finish(p).unwrap();
    let variants = microkernel_variants(false);
    let check = |got: &Tensor, what: &str| {
        for i in 0..n {
            let g = f32::from_le_bytes(got.bytes()[4 * i..4 * i + 4].try_into().unwrap());
            let w = libm::powf(xs[i], ys[i]);
            let exact = w == 0.0 || w.is_infinite() || w.is_nan() || w.abs() == 1.0;
            let ok = if exact {
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
            } else {
                let bound = (2.0 + (f64::from(ys[i]) * f64::from(xs[i].abs()).ln()).abs()) * 2f64.powi(-23);
                let (g, w) = (f64::from(g), f64::from(w));
                // Within the bound, plus one subnormal step; a result within the bound of
                // the largest float may round to ±inf.
                let overflow =
                    g.is_infinite() && g.signum() == w.signum() && w.abs() * (1.0 + bound) > f64::from(f32::MAX);
                overflow || (g - w).abs() <= bound * w.abs() + 2f64.powi(-149)
            };
            assert!(ok, "{what}: pow({:e}, {:e}) = {g:e}, libm {w:e}", xs[i], ys[i]);
        }
    };
    for cfg in &variants {
        let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
        let bits = if cfg.target == kiln_codegen::cpu::CpuTarget::X86_64V4 { 512 } else { 256 };
        assert_eq!(m.paths[0], CodePath::Vector { bits }, "{}", m.notes[0]);
        for splits in [1, 3] {
            check(&run_compiled(&k, &[&tx, &ty], cfg, splits), &format!("row kernel {:?}", cfg.target));
        }
    }
    // A product's epilogue: (A·B)^y, the base the product of small integers (exact in
    // any order), the exponent a run-time value per element.
    let (m_, kk, cols) = (3, 4, 37);
    let ab = [small_integers(&[m_, kk], 11), small_integers(&[kk, cols], 12)];
    let exps: Vec<f32> = (0..m_ * cols).map(|i| [0.5, -1.0, 3.0, 0.0, 1.7, -2.5, 2.0][i % 7]).collect();
    let te = tensor_bits(f, &[m_, cols], &exps.iter().map(|x| x.to_bits() as u64).collect::<Vec<_>>());
    let mut b = KernelBuilder::new(
        "pow_epilogue",
        vec![tt(f, &[m_, kk]), tt(f, &[kk, cols]), tt(f, &[m_, cols])],
        tt(f, &[m_, cols]),
    );
    let (o, sum) = b.matmul_sum(kk);
    let e = b.load(2, o);
    let p = b.binary(BinaryOp::Pow, sum, e);
    let k = b.finish(p).unwrap();
    let want = kiln_flow::interp::run(&k, &[&ab[0], &ab[1], &te]).unwrap();
    for cfg in &variants {
        let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
        assert!(m.notes[0].starts_with("contraction microkernel"), "{}", m.notes[0]);
        let got = run_compiled(&k, &[&ab[0], &ab[1], &te], cfg, 1);
        for i in 0..m_ * cols {
            let g = f32::from_le_bytes(got.bytes()[4 * i..4 * i + 4].try_into().unwrap());
            let w = f32::from_le_bytes(want.bytes()[4 * i..4 * i + 4].try_into().unwrap());
            let ok = g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()) || ((g - w) / w).abs() <= 1e-5;
            assert!(ok, "epilogue {:?} element {i}: {g:e}, interpreter {w:e}", cfg.target);
        }
    }
}

/// A bool output (a comparison, a mask's negation, a bool load passed through) stored
/// as bytes of 0 or 1: on sixteen lanes by the row kernels (the mask shifted down, then
/// `vpmovdb`), elsewhere by the general path; every row length, exactly against the
/// interpreter.
#[test]
fn bool_outputs() {
    require_avx2_fma!();
    let f = DType::F32;
    let variants = microkernel_variants(false);
    for (len, x, y) in operands(f, 4) {
        let k = binary_kernel("bool_out", f, DType::Bool, len, |b, x, y| {
            let lt = b.binary(BinaryOp::Lt, x, y);
            let nan = b.unary(UnaryOp::IsNan, x);
            let n = b.unary(UnaryOp::Not, nan);
            b.binary(BinaryOp::And, lt, n)
        });
        for cfg in &variants {
            let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
            if cfg.target == kiln_codegen::cpu::CpuTarget::X86_64V4 {
                assert_eq!(m.paths[0], CodePath::Vector { bits: 512 }, "{}", m.notes[0]);
            }
        }
        check_with(&k, &[&x, &y], EXACT, &variants);
    }
}

/// f32 to i32 and u32 (`Vx::f32_to_i32`, eight lanes: a sixteen-lane target takes eight
/// for it): the interpreter's truncation to i64 (saturating, NaN 0) wrapped to 32 bits,
/// on the special values and on each side of ±2³¹, ±2³², ±2⁶³, with low bits set above
/// 2³¹ (where `vcvttps2dq` alone gives 0x8000_0000).
#[test]
fn f32_to_32bit_integers() {
    require_avx2_fma!();
    let f = DType::F32;
    let big: Vec<f64> = vec![
        2147483648.0,
        -2147483648.0,
        2147483520.0,
        -2147483520.0,
        3000000000.0,
        -3000000000.0,
        4294967040.0,
        -4294967040.0,
        4294967296.0,
        4294967296.0 + 512.0,
        -4294967296.0 - 1536.0,
        1.5e12,
        -1.5e12,
        9.2233715e18,
        -9.2233715e18,
        9.223372e18,
        -9.223372e18,
        1e30,
        -1e30,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -0.75,
        16777215.0,
        -16777216.0,
    ];
    for len in LENGTHS {
        let n = ROWS * len;
        let x = Tensor::from_f64(
            f,
            Shape::new(vec![ROWS, len]).unwrap(),
            &(0..n).map(|i| big[i * 5 % big.len()]).collect::<Vec<_>>(),
        )
        .unwrap();
        let y = cycled(f, &[ROWS, len], 0);
        for d in [DType::I32, DType::U32] {
            for (name, input) in [("big", &x), ("special", &y)] {
                let k = binary_kernel(&format!("f32_to_{}_{name}", d.name()), f, d, len, |b, x, _| b.cast(x, d, false));
                let variants = microkernel_variants(false);
                for cfg in &variants {
                    let m = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
                    assert!(matches!(m.paths[0], CodePath::Vector { .. }), "{}: {}", k.name, m.notes[0]);
                }
                check_with(&k, &[input, input], EXACT, &variants);
            }
        }
    }
}
