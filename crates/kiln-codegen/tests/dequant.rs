//! Weights dequantised in the contraction's load (`kiln_flow::dequant`, `cpu::gemm`'s
//! integer B): a product `A · B` whose constant `B` is computed from integers — `i8`
//! times a per-column or per-tensor scale, `u8` with and without zero points (per
//! column and per tensor), the extremes −128/127 and 0/255 included — is rewritten to
//! read the integers (`i8`, `u8` or `i16` panels) and scale in its epilogue, compiled as
//! a microkernel (256- and 512-bit tiles where the CPU has them; the 256-bit tiles of
//! two row panels or more read B converted onto the stack, the note says which), run in
//! 1 and 3 workgroup splits, and compared with the interpreter running the original two
//! kernels.
//!
//! Bound (u = 2⁻²⁴, the unit roundoff; `S_i` the original kernel evaluated on `|A|`
//! and `|B|`, which bounds `Σ|A·B|` and, with a bias and Relu, what those add): the
//! interpreter computes `B = round(W·s)`, then each `A·B` rounded and summed in f32 in
//! order, then the bias (one rounding each): within `(K + 2)·u·S_i` of the exact
//! `s·Σ A·W + bias`. The microkernel sums `A·W` in f32 with one FMA a term (each
//! product exact inside it: a 24-bit significand times an integer below 2¹⁵), in
//! whatever blocking of the reduction, then rounds once for `·s` and once for the bias:
//! within `(K + 2)·u·S_i` too (the first FMA is exact). So element `i` must lie within
//! `(2K + 4)·u·S_i` of the interpreter; the rewritten kernel in the interpreter (products
//! rounded, then the scale) likewise.

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget};
use kiln_flow::contraction::Contraction;
use kiln_flow::program::{Buffer, BufferId, BufferKind, Dispatch, FlowProgram};
use kiln_flow::{interp, BinaryOp, Kernel, KernelBuilder, ReduceOp, ScalarType};
use kiln_ir::{DType, Shape, Tensor, TensorType};

fn tt(dtype: DType, dims: &[usize]) -> TensorType {
    TensorType::new(dtype, Shape::new(dims.to_vec()).unwrap())
}

/// How the weight is quantised.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    /// `f32(q: i8) · s[n]`.
    I8Column,
    /// `f32(q: i8) · s`, `s` a literal.
    I8Tensor,
    /// `(f32(q: u8) − f32(z[n]: u8)) · s[n]` (becomes i16: `q − z` spans −255..255).
    U8ZeroColumn,
    /// `(f32(q: u8) − 128) · s[n]` (becomes i8).
    U8ZeroTensor,
    /// `f32(q: u8) · s[n]` (stays u8).
    U8Column,
}

impl Form {
    const ALL: [Form; 5] = [Form::I8Column, Form::I8Tensor, Form::U8ZeroColumn, Form::U8ZeroTensor, Form::U8Column];

    fn q_dtype(self) -> DType {
        match self {
            Form::I8Column | Form::I8Tensor => DType::I8,
            _ => DType::U8,
        }
    }
}

/// The narrowest of i8, u8 and i16 that holds every one of `w`.
fn narrowest(w: &[i64]) -> DType {
    if w.iter().all(|&x| (-128..=127).contains(&x)) {
        DType::I8
    } else if w.iter().all(|&x| (0..=255).contains(&x)) {
        DType::U8
    } else {
        DType::I16
    }
}

/// The dequantising kernel `B[k, n]` of `form`, its constant inputs (`q` with its
/// first row at the dtype's minimum and its second at the maximum, random elsewhere),
/// and the integers `q − z` it scales.
fn producer(form: Form, kk: usize, n: usize, seed: u64) -> (Kernel, Vec<Tensor>, Vec<i64>) {
    let mut r = Rng(seed.max(1));
    let qd = form.q_dtype();
    let (lo, hi) = if qd == DType::I8 { (-128i64, 127i64) } else { (0, 255) };
    let qv: Vec<i64> = (0..kk * n)
        .map(|i| match i / n {
            0 => lo,
            1 => hi,
            _ => lo + (r.next() % (hi - lo + 1) as u64) as i64,
        })
        .collect();
    let q = tensor_bits(qd, &[kk, n], &qv.iter().map(|&v| v as u64 & 0xff).collect::<Vec<_>>());
    let s: Vec<u64> = (0..n).map(|_| ((0.001 + 0.05 * (r.unit() + 1.0)) as f32).to_bits() as u64).collect();
    let s = tensor_bits(DType::F32, &[1, n], &s);
    let zv: Vec<i64> = (0..n).map(|_| (r.next() % 256) as i64).collect();
    let z = tensor_bits(DType::U8, &[n], &zv.iter().map(|&v| v as u64).collect::<Vec<_>>());
    let w: Vec<i64> = qv
        .iter()
        .enumerate()
        .map(|(i, &q)| match form {
            Form::U8ZeroColumn => q - zv[i % n],
            Form::U8ZeroTensor => q - 128,
            _ => q,
        })
        .collect();
    let mut inputs = vec![q.ty().clone()];
    let mut consts = vec![q];
    if matches!(form, Form::I8Column | Form::U8ZeroColumn | Form::U8ZeroTensor | Form::U8Column) {
        inputs.push(s.ty().clone());
        consts.push(s);
    }
    if form == Form::U8ZeroColumn {
        inputs.push(z.ty().clone());
        consts.push(z);
    }
    let mut b = KernelBuilder::new("dq", inputs, tt(DType::F32, &[kk, n]));
    let o = b.out_index();
    let x = b.load(0, vec![o[0], o[1]]);
    let mut v = b.convert(x, ScalarType::F32);
    match form {
        Form::U8ZeroColumn => {
            let z = b.load(2, vec![o[1]]);
            let z = b.convert(z, ScalarType::F32);
            v = b.sub(v, z);
        }
        Form::U8ZeroTensor => {
            let z = b.float(ScalarType::F32, 128.0);
            v = b.sub(v, z);
        }
        _ => {}
    }
    let s = if form == Form::I8Tensor {
        b.float(ScalarType::F32, 0.0123)
    } else {
        let zero = b.index(0);
        b.load(1, vec![zero, o[1]])
    };
    let root = b.mul(v, s);
    (b.finish(root).unwrap(), consts, w)
}

/// `out[m, n] = Σ_k A[m, k] · B[k, n]`, with `+ bias[n]` and a Relu when `epilogue`;
/// with `heads` above 1, the result split into heads of `n / heads` columns as it is
/// computed, `out[h, m, d]` at column `h·(n / heads) + d` (an attention projection: B
/// then reads a batch variable, and is not packed).
fn product(m: usize, kk: usize, n: usize, epilogue: bool, heads: usize) -> Kernel {
    let mut inputs = vec![tt(DType::F32, &[m, kk]), tt(DType::F32, &[kk, n])];
    if epilogue {
        inputs.push(tt(DType::F32, &[n]));
    }
    let d = n / heads;
    let out = if heads > 1 { tt(DType::F32, &[heads, m, d]) } else { tt(DType::F32, &[m, n]) };
    let mut b = KernelBuilder::new("mm", inputs, out);
    let o = b.out_index();
    let (row, col) = if heads > 1 {
        let dc = b.index(d as i64);
        let h = b.mul(o[0], dc);
        (o[1], b.add(h, o[2]))
    } else {
        (o[0], o[1])
    };
    let kv = b.new_var(kk as u64);
    let k = b.var(kv);
    let x = b.load(0, vec![row, k]);
    let w = b.load(1, vec![k, col]);
    let p = b.mul(x, w);
    let mut r = b.reduce(ReduceOp::Sum, vec![kv], p);
    if epilogue {
        let bias = b.load(2, vec![col]);
        r = b.add(r, bias);
        let zero = b.float(ScalarType::F32, 0.0);
        r = b.binary(BinaryOp::Max, r, zero);
    }
    b.finish(r).unwrap()
}

/// The program `P; D` (the dequantisation, the product reading it), rewritten and,
/// where `packs`, packed for `cfg` (the integer weight laid out in panels where the
/// microkernels take it so): the one dispatch left, its operands (`a` as the input),
/// and whether the weight was packed.
fn rewritten(p: &FlowProgram, a: &Tensor, cfg: &Config, packs: bool) -> (Kernel, Vec<Tensor>, bool) {
    let mut p = p.clone();
    assert_eq!(kiln_flow::dequant::dequantize_in_load(&mut p), 1, "the product reads the integers");
    p.remove_dead();
    assert_eq!(p.dispatches.len(), 1, "the dequantising dispatch is gone");
    let packed = packs && pack_for(&mut p, cfg) == 1;
    let (k, inputs) = first_dispatch(&p, Some(a));
    (k, inputs, packed)
}

/// Products in heads whose weight [`check`] ran laid out in panels, one set a head.
static PACKED_HEADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Checks `form` on an `m × kk × n` product (split into `heads`, see [`product`]);
/// returns the dtype the weight was stored in.
fn check(form: Form, m: usize, kk: usize, n: usize, epilogue: bool, heads: usize) -> DType {
    let seed = (m * 1_000_003 + kk * 1009 + n * 7 + form as usize) as u64;
    let (pk, consts, w) = producer(form, kk, n, seed);
    let a = random_f32(&[m, kk], 2.0, seed ^ 0x5eed);
    let bias = random_f32(&[n], 1.0, seed ^ 0xb1a5);
    let dk = product(m, kk, n, epilogue, heads);
    // The original: B through the interpreter, then the product.
    let b = interp::run(&pk, &consts.iter().collect::<Vec<_>>()).unwrap();
    let mut ins = vec![&a, &b];
    if epilogue {
        ins.push(&bias);
    }
    let want = interp::run(&dk, &ins).unwrap().to_vec::<f32>().unwrap();
    let (aa, ab, abias) = (abs(&a), abs(&b), abs(&bias));
    let mut absins = vec![&aa, &ab];
    if epilogue {
        absins.push(&abias);
    }
    let bound = interp::run(&product(m, kk, n, epilogue, heads), &absins).unwrap().to_vec::<f32>().unwrap();
    // The flow program.
    let buffer = |ty: TensorType, kind| Buffer { ty, name: "x".into(), kind };
    let mut buffers = vec![buffer(a.ty().clone(), BufferKind::Input(0))];
    buffers.extend(consts.iter().map(|t| buffer(t.ty().clone(), BufferKind::Const(t.clone()))));
    let nc = consts.len() as u32;
    let bbuf = BufferId(nc + 1);
    buffers.push(buffer(b.ty().clone(), BufferKind::Result));
    let mut operands = vec![BufferId(0), bbuf];
    if epilogue {
        buffers.push(buffer(bias.ty().clone(), BufferKind::Const(bias.clone())));
        operands.push(BufferId(nc + 2));
    }
    let out = BufferId(buffers.len() as u32);
    buffers.push(buffer(dk.output.clone(), BufferKind::Result));
    let p = FlowProgram {
        extents: Vec::new(),
        name: "p".into(),
        buffers,
        dispatches: vec![
            Dispatch::new(pk, (1..=nc).map(BufferId).collect(), bbuf, vec!["Dequantize".into()]),
            Dispatch::new(dk, operands, out, vec!["MatMul".into()]),
        ],
        inputs: vec![BufferId(0)],
        outputs: vec![out],
    };
    let name = format!(
        "{form:?} {m}x{kk}x{n}{}{}",
        if epilogue { " +bias relu" } else { "" },
        if heads > 1 { format!(" in {heads} heads") } else { String::new() }
    );
    // Split into heads, B is also run as it is (a constant the packing leaves alone,
    // read by other products too).
    let packings: &[bool] = if heads > 1 { &[true, false] } else { &[true] };
    for (cfg, &packs) in
        microkernel_variants(false).into_iter().flat_map(|c| packings.iter().map(move |p| (c.clone(), p)))
    {
        let name = format!("{name}{}", if packs { "" } else { " (unpacked)" });
        let (k, inputs, packed) = rewritten(&p, &a, &cfg, packs);
        assert!(packed || heads > 1 || !packs, "{name}: the integer weight's packing");
        if packed && heads > 1 {
            PACKED_HEADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let c = Contraction::of(&k).expect("a contraction");
        assert_eq!(c.b.dtype, narrowest(&w), "{name}: the weight's storage");
        assert_eq!(c.b.panel.is_some(), packed, "{name}: in panels");
        let inputs: Vec<&Tensor> = inputs.iter().collect();
        // The rewritten kernel in the interpreter, within the same bound.
        let flow = interp::run(&k, &inputs).unwrap().to_vec::<f32>().unwrap();
        let module = compile_with(&classify(&[&k]), &cfg.target, &cfg.options).unwrap();
        assert!(module.notes[0].starts_with("contraction microkernel"), "{name}: {}", module.notes[0]);
        // With 256-bit tiles, two full row panels or more (of 6 rows, or 4 where 4
        // divides M and 6 does not; where the columns make panels of 6 cheaper even
        // so, as heads of 32 columns at M = 16, M has two of those too) convert B onto
        // the stack once; fewer, and the 512-bit tiles, convert it in the tiles' loads.
        let rows = if m % 6 != 0 && m % 4 == 0 { 4 } else { 6 };
        assert_eq!(
            module.notes[0].ends_with("; integer B converted on the stack"),
            cfg.target == CpuTarget::X86_64V3 && m >= 2 * rows,
            "{name}: {}",
            module.notes[0]
        );
        for splits in [1, 3] {
            let got = run_compiled(&k, &inputs, &cfg, splits).to_vec::<f32>().unwrap();
            for i in 0..want.len() {
                let tol = (2.0 * kk as f32 + 4.0) * f32::EPSILON / 2.0 * bound[i] + 1e-30;
                assert!(
                    (flow[i] - want[i]).abs() <= tol,
                    "{name}: interpreter of the rewrite, element {i}: {} vs {}",
                    flow[i],
                    want[i]
                );
                assert!(
                    (got[i] - want[i]).abs() <= tol,
                    "{name} {:?} splits {splits}: element {i}: got {}, want {} (tol {tol})",
                    cfg.target,
                    got[i],
                    want[i]
                );
            }
        }
    }
    narrowest(&w)
}

#[test]
fn odd_shapes_every_form() {
    require_avx2_fma!(", so no contraction microkernel can run here");
    let mut stored = std::collections::BTreeSet::new();
    for form in Form::ALL {
        for &m in &[1, 5, 16] {
            for &kk in &[1, 7, 64, 384] {
                for &n in &[1, 9, 33, 1536] {
                    // (The largest shapes once per form is enough: they only repeat tiles.)
                    if kk == 384 && n == 1536 && m != 16 {
                        continue;
                    }
                    stored.insert(format!("{}", check(form, m, kk, n, (m + kk + n) % 2 == 0, 1)));
                }
            }
        }
    }
    // Every storage the rewrite picks was tested.
    assert_eq!(stored.into_iter().collect::<Vec<_>>(), ["i16", "i8", "u8"]);
}

/// A product split into heads as it is computed (B reads the head, a batch variable):
/// laid out in panels a head, and as it is, where whole vectors of its columns are
/// loaded as they are, and the last 1..7 columns of a head one by one; with two row
/// panels or more, each head's B is converted onto the stack by its first workgroup,
/// column blocks of a tile's width and reduction blocks of 256 rows, a head's last
/// block narrower (13 rows: two panels of 6 and a tail row; 16: four of 4).
#[test]
fn unpacked_weights_in_heads() {
    require_avx2_fma!(", so no contraction microkernel can run here");
    for form in [Form::I8Column, Form::U8ZeroColumn] {
        for &(m, kk, n, heads) in &[
            (16, 64, 128, 4),
            (5, 7, 36, 4),
            (16, 33, 39, 3),
            (1, 384, 384, 12),
            (6, 20, 130, 2),
            (13, 40, 87, 3),
            (16, 300, 100, 2),
            (12, 9, 60, 5),
        ] {
            check(form, m, kk, n, true, heads);
            check(form, m, kk, n, false, heads);
        }
    }
    assert!(PACKED_HEADS.load(std::sync::atomic::Ordering::Relaxed) > 0, "no weight in heads was packed");
}

/// A bias and Relu after the scale, in every tile kind, for each form.
#[test]
fn with_an_epilogue() {
    require_avx2_fma!(", so no contraction microkernel can run here");
    for form in Form::ALL {
        for &(m, kk, n) in &[(6, 40, 70), (4, 300, 130), (1, 17, 200), (13, 5, 24)] {
            check(form, m, kk, n, true, 1);
        }
    }
}
