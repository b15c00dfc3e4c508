//! Every operation on every type, against the kernel interpreter: unary, binary, casts,
//! reductions, loads with each bounds mode, stores of every dtype.

mod common;

use common::*;
use kiln_flow::{BinaryOp, Bounds, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, Tensor, TensorType};

const TYPES: [ScalarType; 11] = ScalarType::ALL;

/// Every storage dtype the CPU backend handles.
const STORAGE: [DType; 13] = {
    use DType::*;
    [Bool, I8, I16, I32, I64, U8, U16, U32, U64, F32, F64, F16, BF16]
};

fn tt(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
}

/// `y[i] = cast(x[i])` to `to` (saturating where `saturate`), `x` one-dimensional.
fn cast_kernel(name: impl Into<String>, x: &Tensor, to: DType, saturate: bool) -> Kernel {
    let mut b = KernelBuilder::new(name, vec![x.ty().clone()], tt(to, &[x.numel()]));
    let i = b.out_index();
    let l = b.load(0, i);
    let c = b.cast(l, to, saturate);
    b.finish(c).unwrap()
}

/// `y[i] = x[i]` stored as `to`, `x` one-dimensional (a load of `x`'s storage type, a
/// store to `to`'s).
fn copy_kernel(name: &str, x: &Tensor, to: DType) -> Kernel {
    let mut b = KernelBuilder::new(name, vec![x.ty().clone()], tt(to, &[x.numel()]));
    let i = b.out_index();
    let l = b.load(0, i);
    b.finish(l).unwrap()
}

/// f32 bit patterns around the finite values of the float type `d` of `ncodes` codes:
/// each value, its f32 neighbours (±1 and ±2 ulp) and its negation, and the midpoint and
/// quarter point to the next code's value.
fn probes_around(d: DType, ncodes: u32) -> Vec<u64> {
    let mut v: Vec<u64> = Vec::new();
    for c in 0..ncodes {
        let f = kiln_ir::lowp::decode(d, c as u8);
        if f.is_finite() {
            for delta in [-2i64, -1, 0, 1, 2] {
                v.push((f.to_bits() as i64 + delta) as u32 as u64);
                v.push((-f).to_bits() as u64);
            }
            let next = kiln_ir::lowp::decode(d, (c + 1) as u8);
            if next.is_finite() && c + 1 < ncodes {
                v.push(((f + next) / 2.0).to_bits() as u64);
                v.push((0.75 * f + 0.25 * next).to_bits() as u64);
            }
        }
    }
    v
}

fn values(d: DType) -> Tensor {
    let v = specials(d);
    tensor_bits(d, &[v.len()], &v)
}

#[test]
fn unary_every_type() {
    let mut count = 0;
    for t in TYPES {
        for op in UnaryOp::ALL {
            if (op.float_only() && !t.is_float()) || (op == UnaryOp::Neg && t == ScalarType::Bool) {
                continue;
            }
            if op == UnaryOp::Not && t.is_float() {
                // Accepted by the verifier but undefined by the kernel docs: rejected.
                let x = values(t.dtype());
                let mut b = KernelBuilder::new("not_float", vec![x.ty().clone()], tt(t.dtype(), &[x.numel()]));
                let i = b.out_index();
                let l = b.load(0, i);
                let r = b.unary(op, l);
                let k = b.finish(r).unwrap();
                let e = kiln_codegen::compile(&[&k], &kiln_codegen::CpuTarget::X86_64V2).unwrap_err();
                assert!(matches!(e, kiln_codegen::CodegenError::Unsupported { .. }), "{e}");
                continue;
            }
            let x = values(t.dtype());
            let n = x.numel();
            let out = if op == UnaryOp::IsNan { DType::Bool } else { t.dtype() };
            let mut b =
                KernelBuilder::new(format!("u_{}_{}", op.name(), t.name()), vec![x.ty().clone()], tt(out, &[n]));
            let i = b.out_index();
            let l = b.load(0, i);
            let r = b.unary(op, l);
            let k = b.finish(r).unwrap();
            // exp, erf, tanh and log of f32 are inline code within 3 ulp of libm
            // (`cpu::math`, measured in tests/math.rs); everything else matches exactly.
            let inline =
                matches!(op, UnaryOp::Exp | UnaryOp::Erf | UnaryOp::Tanh | UnaryOp::Log) && t == ScalarType::F32;
            check(&k, &[&x], if inline { Cmp { zero_sign: false, rtol: 4e-7 } } else { EXACT });
            count += 1;
        }
    }
    assert_eq!(count, 2 * 23 + 8 * 3 + 2);
}

#[test]
fn binary_every_type() {
    let mut count = 0;
    for t in TYPES {
        for op in BinaryOp::ALL {
            let ok = op.accepts(t);
            // Not yet checkable against the interpreter: the verifier's range analysis
            // overflows i128 on a u64 product (kiln-flow `int_ranges`); see
            // `u64_multiply` for an independent check.
            if !ok || (op == BinaryOp::Mul && t == ScalarType::U64) {
                continue;
            }
            let x = values(t.dtype());
            let m = x.numel();
            let out = if op.is_comparison() { DType::Bool } else { t.dtype() };
            let mut b = KernelBuilder::new(
                format!("b_{}_{}", op.name(), t.name()),
                vec![x.ty().clone(), x.ty().clone()],
                tt(out, &[m, m]),
            );
            let i = b.out_index();
            let l0 = b.load(0, vec![i[0]]);
            let l1 = b.load(1, vec![i[1]]);
            let r = b.binary(op, l0, l1);
            let k = b.finish(r).unwrap();
            // Float min/max of +0 and -0: the interpreter's `f64::min` leaves the sign
            // of the result to the compiler (it changes with the opt level); the
            // generated code follows IEEE 754-2019 minimum/maximum (-0 < +0).
            let cmp = if t.is_float() && matches!(op, BinaryOp::Min | BinaryOp::Max) {
                Cmp { zero_sign: true, ..EXACT }
            } else {
                EXACT
            };
            check(&k, &[&x, &x], cmp);
            count += 1;
        }
    }
    assert!(count > 150, "{count}");
}

/// Mixed-sign zeros in min/max, checked against IEEE 754-2019 directly.
#[test]
fn min_max_signed_zeros() {
    let x = tensor_bits(DType::F32, &[2], &[0.0f32.to_bits() as u64, (-0.0f32).to_bits() as u64]);
    for (op, want) in [(BinaryOp::Min, [0.0f32, -0.0, -0.0, -0.0]), (BinaryOp::Max, [0.0, 0.0, 0.0, -0.0])] {
        let mut b = KernelBuilder::new("mm", vec![x.ty().clone(), x.ty().clone()], tt(DType::F32, &[2, 2]));
        let i = b.out_index();
        let l0 = b.load(0, vec![i[0]]);
        let l1 = b.load(1, vec![i[1]]);
        let r = b.binary(op, l0, l1);
        let k = b.finish(r).unwrap();
        for cfg in configs() {
            let got = run_compiled(&k, &[&x, &x], &cfg, 1).to_vec::<f32>().unwrap();
            let bits: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
            let want: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
            assert_eq!(bits, want, "{op:?} {cfg:?}");
        }
    }
}

#[test]
fn casts_every_pair() {
    let mut count = 0;
    for from in STORAGE {
        for to in STORAGE {
            let x = values(from);
            let k = cast_kernel(format!("c_{}_{}", from.name(), to.name()), &x, to, true);
            check(&k, &[&x], EXACT);
            count += 1;
        }
    }
    assert_eq!(count, 169);
}

fn reduce_input(t: ScalarType, cols: usize) -> Tensor {
    let mut v = specials(t.dtype());
    let rows = v.len().div_ceil(cols);
    // Rotate the specials through the rows; repeat some to make ties.
    let base = v.clone();
    while v.len() < rows * cols {
        v.push(base[v.len() % base.len()]);
    }
    tensor_bits(t.dtype(), &[rows, cols], &v)
}

#[test]
fn reductions_every_type() {
    let ops = ReduceOp::ALL;
    let mut count = 0;
    for t in TYPES {
        for op in ops {
            if t == ScalarType::Bool && matches!(op, ReduceOp::Sum | ReduceOp::Prod) {
                continue;
            }
            for cols in [1, 3, 7, 17] {
                let x = reduce_input(t, cols);
                let out = if op.is_arg() { DType::I64 } else { t.dtype() };
                let name = format!("r_{}_{}_{cols}", op.name().replace('.', "_"), t.name());
                let k = row_reduce(name, x.ty().clone(), out, op);
                let cmp = if t.is_float() && matches!(op, ReduceOp::Max | ReduceOp::Min) {
                    Cmp { zero_sign: true, ..EXACT }
                } else {
                    EXACT
                };
                check_with(&k, &[&x], cmp, &quick_configs());
                count += 1;
            }
        }
    }
    assert!(count > 300, "{count}");
}

/// A reduce over two variables, and a reduce nested in another.
#[test]
fn multi_variable_and_nested_reductions() {
    let x = random_f32(&[3, 5, 7], 2.0, 7);
    // out[i] = sum_{j,k} x[i,j,k]
    let mut b = KernelBuilder::new("sum2", vec![x.ty().clone()], tt(DType::F32, &[3]));
    let i = b.out_index();
    let (j, k) = (b.new_var(5), b.new_var(7));
    let (jv, kv) = (b.var(j), b.var(k));
    let l = b.load(0, vec![i[0], jv, kv]);
    let r = b.reduce(ReduceOp::Sum, vec![j, k], l);
    let kern = b.finish(r).unwrap();
    check(&kern, &[&x], EXACT);
    // out[i] = max_j (sum_k x[i,j,k] * x[i,j,0])
    let mut b = KernelBuilder::new("nested", vec![x.ty().clone()], tt(DType::F32, &[3]));
    let i = b.out_index();
    let (j, k) = (b.new_var(5), b.new_var(7));
    let (jv, kv) = (b.var(j), b.var(k));
    let zero = b.index(0);
    let l = b.load(0, vec![i[0], jv, kv]);
    let l0 = b.load(0, vec![i[0], jv, zero]);
    let p = b.mul(l, l0);
    let s = b.reduce(ReduceOp::Sum, vec![k], p);
    let r = b.reduce(ReduceOp::Max, vec![j], s);
    let kern = b.finish(r).unwrap();
    check(&kern, &[&x], EXACT);
}

#[test]
fn pad_and_clamp_every_storage_dtype() {
    for d in STORAGE {
        let x = values(d);
        let n = x.numel();
        let ct = ScalarType::of_storage(d);
        let pad_bits = match ct {
            ScalarType::F32 => 7.5f32.to_bits() as u64,
            ScalarType::F64 => (-2.25f64).to_bits(),
            ScalarType::Bool => 1,
            t => t.bits_of_i64(-3),
        };
        for (bounds, tag) in [(Bounds::Pad(pad_bits), "pad"), (Bounds::Clamp, "clamp")] {
            let mut b = KernelBuilder::new(format!("{tag}_{}", d.name()), vec![x.ty().clone()], tt(d, &[n + 9]));
            let i = b.out_index();
            let three = b.index(4);
            let idx = b.sub(i[0], three);
            let l = b.load_with(0, vec![idx], bounds);
            let r = b.cast(l, d, true);
            let k = b.finish(r).unwrap();
            check(&k, &[&x], EXACT);
        }
    }
    // Two dimensions: out[i, j] = x[2i - 1, j - 2], checked against a direct
    // computation (the interpreter's flat index overflows on a negative index in a
    // leading dimension, kiln-flow `interp.rs`).
    let x = random_f32(&[4, 6], 1.0, 3);
    let xv = x.to_vec::<f32>().unwrap();
    for bounds in [Bounds::Pad(0), Bounds::Clamp] {
        let mut b = KernelBuilder::new("pad2", vec![x.ty().clone()], tt(DType::F32, &[5, 9]));
        let i = b.out_index();
        let two = b.index(2);
        let one = b.index(1);
        let r0 = b.mul(i[0], two);
        let r0 = b.sub(r0, one);
        let c0 = b.sub(i[1], two);
        let l = b.load_with(0, vec![r0, c0], bounds);
        let k = b.finish(l).unwrap();
        let mut want = Vec::new();
        for r in 0..5i64 {
            for c in 0..9i64 {
                let (rr, cc) = (2 * r - 1, c - 2);
                want.push(match bounds {
                    Bounds::Clamp => xv[(rr.clamp(0, 3) * 6 + cc.clamp(0, 5)) as usize],
                    _ if (0..4).contains(&rr) && (0..6).contains(&cc) => xv[(rr * 6 + cc) as usize],
                    _ => 0.0,
                });
            }
        }
        for cfg in configs() {
            let got = run_compiled(&k, &[&x], &cfg, 2).to_vec::<f32>().unwrap();
            assert_eq!(got, want, "{bounds:?} {cfg:?}");
        }
    }
    // An empty input reads the pad value, or 0 when clamped.
    let e = tensor_bits(DType::F32, &[0], &[]);
    for bounds in [Bounds::Pad(1.5f32.to_bits() as u64), Bounds::Clamp] {
        let mut b = KernelBuilder::new("empty_in", vec![e.ty().clone()], tt(DType::F32, &[3]));
        let i = b.out_index();
        let l = b.load_with(0, i, bounds);
        let k = b.finish(l).unwrap();
        check(&k, &[&e], EXACT);
    }
}

/// A gather: indices loaded from data, clamped.
#[test]
fn data_dependent_indices() {
    let x = random_f32(&[10], 5.0, 11);
    let idx = tensor_bits(DType::I64, &[8], &[0, 3, 9, 10, u64::MAX, 5, 1 << 40, 2]);
    for bounds in [Bounds::Clamp, Bounds::Pad(f32::NAN.to_bits() as u64)] {
        let mut b = KernelBuilder::new("gather", vec![x.ty().clone(), idx.ty().clone()], tt(DType::F32, &[8]));
        let i = b.out_index();
        let j = b.load(1, i);
        let l = b.load_with(0, vec![j], bounds);
        let k = b.finish(l).unwrap();
        check(&k, &[&x, &idx], EXACT);
    }
}

/// Select on every type, with a computed condition.
#[test]
fn select_every_type() {
    for t in TYPES {
        let x = values(t.dtype());
        let n = x.numel();
        let mut b = KernelBuilder::new(format!("sel_{}", t.name()), vec![x.ty().clone()], tt(t.dtype(), &[n, n]));
        let i = b.out_index();
        let a = b.load(0, vec![i[0]]);
        let c = b.load(0, vec![i[1]]);
        let cond = b.binary(BinaryOp::Lt, a, c);
        let r = b.select(cond, c, a);
        let k = b.finish(r).unwrap();
        check_with(&k, &[&x], EXACT, &quick_configs());
    }
}

/// Stores of a non-cast f32 root into f16/bf16 outputs round to nearest even.
#[test]
fn narrow_float_outputs_round() {
    let x = tensor_bits(
        DType::F32,
        &[8],
        &[
            1.0f32,
            1.0 + 2f32.powi(-10),
            1.0 + 2f32.powi(-11),
            1.0 + 3.0 * 2f32.powi(-11),
            65519.0,
            65520.0,
            1e-8,
            -3.0e-5,
        ]
        .iter()
        .map(|v| v.to_bits() as u64)
        .collect::<Vec<_>>(),
    );
    for d in [DType::F16, DType::BF16] {
        let mut b = KernelBuilder::new("narrow_out", vec![x.ty().clone()], tt(d, &[8]));
        let i = b.out_index();
        let l = b.load(0, i);
        let two = b.float(ScalarType::F32, 3.0);
        let r = b.mul(l, two);
        let k = b.finish(r).unwrap();
        check(&k, &[&x], EXACT);
    }
}

/// Rank-0 output, rank-0 input, and an output with a zero-sized dimension.
#[test]
fn degenerate_shapes() {
    let s = tensor_bits(DType::F32, &[], &[2.5f32.to_bits() as u64]);
    let mut b = KernelBuilder::new("scalar", vec![s.ty().clone()], tt(DType::F32, &[]));
    let l = b.load(0, vec![]);
    let r = b.unary(UnaryOp::Exp, l);
    let k = b.finish(r).unwrap();
    check(&k, &[&s], EXACT);

    let x = random_f32(&[0, 5], 1.0, 1);
    for dims in [[0usize, 5], [3, 0]] {
        let mut b = KernelBuilder::new("empty", vec![s.ty().clone()], tt(DType::F32, &dims));
        let l = b.load(0, vec![]);
        let k = b.finish(l).unwrap();
        check(&k, &[&s], EXACT);
    }
    let _ = x;
    // A reduce over an empty variable gives the identity; argmax gives 0.
    let e = tensor_bits(DType::I32, &[3, 0], &[]);
    for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::ArgMin { last: false }] {
        let out = if op.is_arg() { DType::I64 } else { DType::I32 };
        let mut b = KernelBuilder::new("empty_reduce", vec![e.ty().clone()], tt(out, &[3]));
        let i = b.out_index();
        let j = b.new_var(0);
        let jv = b.var(j);
        let l = b.load_with(0, vec![i[0], jv], Bounds::Clamp);
        let r = b.reduce(op, vec![j], l);
        let k = b.finish(r).unwrap();
        check(&k, &[&e], EXACT);
    }
}

/// u64 products wrap (values cast from u32 times constants, including full-range ones).
#[test]
fn u64_multiply() {
    let v = specials(DType::U32);
    let x = tensor_bits(DType::U32, &[v.len()], &v);
    for c in [3u64, u64::MAX, 0x8000_0000_0000_0001, 0xdead_beef_1234_5678] {
        let mut b = KernelBuilder::new("mul_u64", vec![x.ty().clone()], tt(DType::U64, &[v.len()]));
        let i = b.out_index();
        let l = b.load(0, i);
        let w = b.convert(l, ScalarType::U64);
        let cc = b.constant(ScalarType::U64, c);
        let r = b.mul(w, cc);
        let k = b.finish(r).unwrap();
        check(&k, &[&x], EXACT);
        let want: Vec<u64> = v.iter().map(|&a| a.wrapping_mul(c)).collect();
        let got = run_compiled(&k, &[&x], &configs()[0], 1).to_vec::<u64>().unwrap();
        assert_eq!(got, want);
    }
}

/// Division and remainder by constants: guarded `sdiv` for signed data, multiply-high
/// for unsigned or provably non-negative dividends (index arithmetic).
#[test]
fn division_by_constants() {
    let divisors: [i64; 10] = [1, 2, 3, 7, 10, 64, 1000, 12345, 1 << 31, 0x7fff_ffff];
    for t in [ScalarType::I32, ScalarType::I64, ScalarType::U32, ScalarType::U64, ScalarType::I8, ScalarType::U16] {
        let x = values(t.dtype());
        let n = x.numel();
        for &c in &divisors {
            for op in [BinaryOp::Div, BinaryOp::Rem] {
                let mut b = KernelBuilder::new("divc", vec![x.ty().clone()], tt(t.dtype(), &[n]));
                let i = b.out_index();
                let l = b.load(0, i);
                let cc = b.int(t, c);
                let r = b.binary(op, l, cc);
                let k = b.finish(r).unwrap();
                check_with(&k, &[&x], EXACT, &quick_configs());
            }
        }
    }
    // Non-negative index arithmetic up to 2^62.
    for &c in &divisors {
        for (mul, add) in [(1_000_000_007i64, 5i64), (1 << 56, 3), (3, 0)] {
            for op in [BinaryOp::Div, BinaryOp::Rem] {
                let mut b = KernelBuilder::new("divi", vec![], tt(DType::I64, &[50]));
                let i = b.out_index();
                let m = b.index(mul);
                let a = b.index(add);
                let p = b.mul(i[0], m);
                let s = b.add(p, a);
                let cc = b.index(c);
                let r = b.binary(op, s, cc);
                let k = b.finish(r).unwrap();
                check_with(&k, &[], EXACT, &quick_configs());
            }
        }
    }
}

/// Rounding to f16 and bf16 from f32 and f64 values on and next to ties, against an
/// independent table oracle. (The interpreter rounds through `half`, whose f64
/// conversions ignore the low 32 bits of the f64, so values just off a tie — those
/// below — round as ties there; these are checked here rather than against it.)
#[test]
fn narrow_float_rounding() {
    for d in [DType::F16, DType::BF16] {
        let value = if d == DType::F16 { f16_value } else { bf16_value };
        let top: u16 = if d == DType::F16 { 0x7bff } else { 0x7f7f };
        let mut r = Rng(5);
        let mut xs64: Vec<f64> = Vec::new();
        for _ in 0..400 {
            let h = (r.next() % top as u64) as u16;
            let (a, b) = (value(h), value(h + 1));
            let mid = (a + b) / 2.0;
            let eps = mid.abs() * 2f64.powi(-40);
            xs64.extend([mid, mid + eps, mid - eps, -mid, -(mid + eps), a, b]);
        }
        xs64.extend([65519.0, 65520.0, 65520.0 - 1e-9, 1e-30, 2f64.powi(-25) * (1.0 + 1e-12), 1e300]);
        // f32 sources: ties and one f32 ulp either side.
        let xs32: Vec<f32> = xs64
            .iter()
            .flat_map(|&x| {
                let m = x as f32;
                [m, f32::from_bits(m.to_bits() + 1), f32::from_bits(m.to_bits().wrapping_sub(1))]
            })
            .filter(|v| v.is_finite())
            .collect();
        let sources: [(DType, Vec<u64>); 2] = [
            (DType::F64, xs64.iter().map(|x| x.to_bits()).collect()),
            (DType::F32, xs32.iter().map(|x| x.to_bits() as u64).collect()),
        ];
        for (src, bits) in sources {
            let x = tensor_bits(src, &[bits.len()], &bits);
            let k = cast_kernel("round_narrow", &x, d, true);
            let want: Vec<u16> = bits
                .iter()
                .map(|&b| {
                    let v = if src == DType::F64 { f64::from_bits(b) } else { f32::from_bits(b as u32) as f64 };
                    round_oracle(d, v)
                })
                .collect();
            for cfg in quick_configs() {
                let got = run_compiled(&k, &[&x], &cfg, 1);
                let got: Vec<u16> = got.bytes().chunks(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
                for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g,
                        w,
                        "{src:?} -> {d:?} element {j}: {:e}",
                        if src == DType::F64 { f64::from_bits(bits[j]) } else { f32::from_bits(bits[j] as u32) as f64 }
                    );
                }
            }
        }
    }
}

const F8_TYPES: [DType; 4] = [DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ];

/// The 8-bit floats: every code loaded (decoded to f32), and f32 values around every
/// representable value, the overflow thresholds, the subnormals and the specials cast to
/// each type (with and without saturation) and stored as codes, against the interpreter
/// (which uses `kiln_ir::lowp`).
#[test]
fn f8_load_cast_store() {
    for d in F8_TYPES {
        let codes: Vec<u64> = (0..256).collect();
        let x = tensor_bits(d, &[256], &codes);
        check(&copy_kernel("f8_load", &x, DType::F32), &[&x], EXACT);

        // Every decoded value, its neighbours and midpoints, and the specials.
        let mut v = probes_around(d, 256);
        for s in [
            0.0f32,
            -0.0,
            1e-30,
            -1e-30,
            1e30,
            -1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            464.0,
            480.0,
            61440.0,
        ] {
            v.push(s.to_bits() as u64);
        }
        let x = tensor_bits(DType::F32, &[v.len()], &v);
        for sat in [true, false] {
            let k = cast_kernel("f8_cast", &x, d, sat);
            check(&k, &[&x], EXACT);
        }
        // An f32 value stored without a cast rounds as a non-saturating cast would.
        check(&copy_kernel("f8_store", &x, d), &[&x], EXACT);
    }
}

/// The OCP MX element types (`f6E3M2FN`, `f4E2M1FN` packed two to a byte) and the scale
/// type `f8E8M0FNU`: every code loaded, f32 values around every representable value (and
/// midpoints, the range's ends, subnormals, zeros, infinities, NaN) cast with and without
/// `saturate` and stored as codes, odd element counts for the packed type, and a plain
/// f32 store, against the interpreter (which uses `kiln_ir::lowp`).
#[test]
fn mx_types_load_cast_store() {
    for (d, ncodes) in [(DType::F6E3M2FN, 64u32), (DType::F4E2M1FN, 16), (DType::F8E8M0FNU, 256)] {
        // Every code, then again to an odd count.
        let codes: Vec<u8> = (0..2 * ncodes + 1).map(|c| (c % ncodes) as u8).collect();
        let x = Tensor::from_codes(d, Shape::new(vec![codes.len()]).unwrap(), &codes).unwrap();
        check(&copy_kernel("mx_load", &x, DType::F32), &[&x], EXACT);

        let mut v = probes_around(d, ncodes);
        for s in [0.0f32, -0.0, 1e-30, -1e-30, 1e30, -1e30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, 30.0, 7.0, 3e38]
        {
            v.push(s.to_bits() as u64);
        }
        for bits in [1u32, 0x0040_0000, 0x0050_0000, 0x005f_ffff, 0x0060_0000, 0x007f_ffff, 0x7f7f_ffff, 0x7f40_0000] {
            v.push(bits as u64);
        }
        if v.len() % 2 == 0 {
            v.push(1.0f32.to_bits() as u64);
        }
        let x = tensor_bits(DType::F32, &[v.len()], &v);
        for sat in [true, false] {
            let k = cast_kernel("mx_cast", &x, d, sat);
            check(&k, &[&x], EXACT);
        }
        check(&copy_kernel("mx_store", &x, d), &[&x], EXACT);
        // From f64 (rounded to f32 to odd first) and from integers.
        for from in [DType::F64, DType::I32, DType::I8] {
            let src = values(from);
            let k = cast_kernel("mx_cast_from", &src, d, true);
            check(&k, &[&src], EXACT);
        }
    }
}

/// The packed 4-bit integers: odd element counts (a byte shared by two elements, one
/// of them the last), every nibble loaded, and casts from f32 specials, from every
/// integer type's specials and from i4 itself stored packed, under every workgroup
/// split the harness tries.
#[test]
fn int4_load_cast_store() {
    for d in [DType::I4, DType::U4] {
        let bytes: Vec<u8> = (0..=255u8).collect();
        let n = 511;
        let x = Tensor::new(tt(d, &[n]), bytes::Bytes::from(bytes)).unwrap();
        let mut b = KernelBuilder::new("i4_load", vec![x.ty().clone()], tt(DType::I32, &[n]));
        let i = b.out_index();
        let l = b.load(0, i);
        let r = b.convert(l, ScalarType::I32);
        let k = b.finish(r).unwrap();
        check(&k, &[&x], EXACT);
        for from in [DType::F32, DType::F64, DType::I8, DType::I32, DType::I64, DType::U64, DType::I4] {
            let src = if from == DType::I4 { x.clone() } else { values(from) };
            let k = cast_kernel("i4_cast", &src, d, true);
            check(&k, &[&src], EXACT);
        }
    }
}
