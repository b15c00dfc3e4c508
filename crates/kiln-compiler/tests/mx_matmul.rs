//! Matrix products over block-scaled (MX) weights through the whole pipeline against
//! kiln-ref: `MatMul(x, DequantizeLinear(w, scale, axis = 0, block_size = B))` with `w`
//! of `f4E2M1FN`, `f6E3M2FN` or `f8E4M3FN` and the scale `f8E8M0FNU` (the OCP MX
//! formats) or `f32`, one scale per block of `B` rows of the reduction and per column,
//! over odd shapes: reductions that are not a multiple of the block (a short last
//! block), one row and several, a batch, one column. The weight is a constant (small
//! ones are folded at compile time; large ones read in the contraction's load by
//! `kiln_flow::mx` where K is a multiple of the block, else dequantised by their own
//! kernel at run time) or a run-time input (its codes read and decoded by the compiled
//! kernel).

use kiln_compiler::{compile, Options};
use kiln_ir::attrs::DequantizeAttrs;
use kiln_ir::{DType, Graph, Op, OpKind, Shape, Tensor, TensorType};

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut r = kiln_filetest::fuzz::XorShift::spread(seed);
    (0..n).map(|_| (r.next() % 2000) as f64 / 1024.0 - 1.0).collect()
}

/// Deterministic codes below `limit`.
fn codes(n: usize, seed: u64, limit: u64) -> Vec<u8> {
    let mut r = kiln_filetest::fuzz::XorShift::spread(seed);
    (0..n).map(|_| (r.next() % limit) as u8).collect()
}

fn shape(d: &[usize]) -> Shape {
    Shape::new(d.to_vec()).unwrap()
}

struct Case {
    /// Leading dims of `x` (batch and rows).
    rows: &'static [usize],
    k: usize,
    n: usize,
    block: usize,
    w: DType,
    scale: DType,
    /// The weight is a graph input rather than a constant.
    w_input: bool,
    /// `kiln_flow::mx` reads the weight's elements in the contraction's load: a constant
    /// too large to fold, K a multiple of the block, few rows.
    in_load: bool,
}

fn run(c: &Case, seed: u64) {
    let label = format!("x[{:?}, {}] · dq({} [{}, {}], {} blocks of {})", c.rows, c.k, c.w, c.k, c.n, c.scale, c.block);
    let mut xd: Vec<usize> = c.rows.to_vec();
    xd.push(c.k);
    let mut yd: Vec<usize> = c.rows.to_vec();
    yd.push(c.n);
    let blocks = c.k.div_ceil(c.block);
    // Weight codes: every code of the 4- and 6-bit types; for f8E4M3FN the finite codes
    // of magnitude below 8 (0x00..0x4F and their negatives) — not NaN (0x7F/0xFF).
    let wcodes: Vec<u8> = match c.w {
        DType::F4E2M1FN => codes(c.k * c.n, seed, 16),
        DType::F6E3M2FN => codes(c.k * c.n, seed, 64),
        _ => codes(c.k * c.n, seed, 0x50).into_iter().enumerate().map(|(i, b)| b | ((i as u8 & 1) << 7)).collect(),
    };
    let w = Tensor::from_codes(c.w, shape(&[c.k, c.n]), &wcodes).unwrap();
    // Scales: 2^-3 .. 2^3 (E8M0 codes 124..130), or f32 values in [0.05, 1.05).
    let s = if c.scale == DType::F8E8M0FNU {
        let sc: Vec<u8> = codes(blocks * c.n, seed + 1, 7).into_iter().map(|b| b + 124).collect();
        Tensor::from_codes(c.scale, shape(&[blocks, c.n]), &sc).unwrap()
    } else {
        let sv: Vec<f64> = values(blocks * c.n, seed + 1).into_iter().map(|v| v.abs() + 0.05).collect();
        Tensor::from_f64(c.scale, shape(&[blocks, c.n]), &sv).unwrap()
    };
    let x = Tensor::from_f64(DType::F32, shape(&xd), &values(xd.iter().product(), seed + 2)).unwrap();

    let mut g = Graph::new("mx");
    let xv = g.add_input("x", TensorType::new(DType::F32, shape(&xd)));
    let wv = if c.w_input { g.add_input("w", w.ty().clone()) } else { g.add_const("w", w.clone()) };
    let sv = g.add_const("scale", s);
    let dq = Op::with_typed(
        OpKind::DequantizeLinear,
        // An E8M0 scale needs `output_dtype` (else the result would be E8M0).
        DequantizeAttrs {
            axis: 0,
            block_size: c.block as i64,
            output_dtype: DType::F32.onnx_code().unwrap() as i64,
            ..Default::default()
        },
    )
    .unwrap();
    let (_, b) = g.add_node(
        "dq",
        dq,
        vec![Some(wv), Some(sv)],
        vec![("b".into(), TensorType::new(DType::F32, shape(&[c.k, c.n])))],
    );
    let (_, y) = g.add_node(
        "mm",
        Op::new(OpKind::MatMul),
        vec![Some(xv), Some(b[0])],
        vec![("y".into(), TensorType::new(DType::F32, shape(&yd)))],
    );
    g.outputs = vec![y[0]];

    let feeds: Vec<Tensor> = if c.w_input { vec![x.clone(), w.clone()] } else { vec![x.clone()] };
    let want = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{label}: reference: {e}"));
    let compiled = compile(&g, &Options::default()).unwrap_or_else(|e| panic!("{label}: compile: {e}"));
    let blocks = compiled.flow.dispatches.iter().find(|d| d.kernel.name.ends_with("_mx_blocks"));
    assert_eq!(blocks.is_some(), c.in_load, "{label}: the block-scaled product in the load");
    if let Some(d) = blocks {
        assert_eq!(d.class, kiln_flow::class::KernelClass::Contraction, "{label}: {}", d.kernel.name);
        // No dispatch writes the f32 weight.
        let f32_weight = compiled.flow.dispatches.iter().any(|d| d.kernel.output.shape.dims() == [c.k, c.n]);
        assert!(!f32_weight, "{label}: the f32 weight is still computed");
    }
    let module = kiln_runtime::Module::load(&compiled.artifact, compiled.weights.as_deref()).unwrap();
    let mut inst = kiln_runtime::Instance::new(&module).unwrap();
    let mut out = vec![0u8; want[0].ty().storage_bytes()];
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    inst.invoke(&ins, &mut [&mut out[..]]).unwrap_or_else(|e| panic!("{label}: invoke: {e}"));
    let got = Tensor::new(want[0].ty().clone(), out.into()).unwrap();
    // Every weight and product is exact in f32 (an MX element times a power of two, or
    // times an f32 scale: one rounding); the compiled sum differs from the reference's
    // (f64, rounded once) by the f32 roundings of at most K additions: K·2^-24 of the
    // sum of magnitudes, below 1e-5 of the largest |y| times K / 100 here, plus slack.
    let wanted = want[0].to_f64_vec();
    let scale = wanted.iter().fold(0f64, |m, v| m.max(v.abs())).max(1.0);
    let tol = 1e-6 * scale * (c.k as f64).max(16.0);
    for (i, (a, b)) in got.to_f64_vec().iter().zip(&wanted).enumerate() {
        assert!((a - b).abs() <= tol, "{label}: element {i}: {a}, the reference gives {b} (tolerance {tol:e})");
    }
}

#[test]
fn block_scaled_matmul_matches_the_reference() {
    let case = |rows: &'static [usize], k, n, block, w, scale, w_input| Case {
        rows,
        k,
        n,
        block,
        w,
        scale,
        w_input,
        in_load: false,
    };
    let in_load = |rows: &'static [usize], k, n, block, w, scale| Case {
        rows,
        k,
        n,
        block,
        w,
        scale,
        w_input: false,
        in_load: true,
    };
    use DType::{F32, F4E2M1FN as F4, F6E3M2FN as F6, F8E4M3FN as F8, F8E8M0FNU as E8};
    let cases = [
        // MXFP4 (32-element blocks, E8M0 scales): a short last block, one row (decode).
        case(&[1], 70, 13, 32, F4, E8, false),
        case(&[5], 64, 9, 32, F4, E8, true),
        case(&[2, 3], 45, 1, 32, F4, E8, true),
        // A constant weight too large to fold (f32 copy > 64 KB): dequantised at run time.
        case(&[3], 301, 70, 32, F4, E8, false),
        // MXFP6 and MXFP8, and f32 block scales with a block of 16.
        // (f6E3M2FN has no ONNX dtype code, so no artifact signature code: it cannot be a
        // graph input; a constant too large to fold is decoded at run time instead.)
        case(&[4], 290, 65, 32, F6, E8, false),
        case(&[1], 33, 7, 16, F8, E8, true),
        case(&[3], 37, 6, 16, F4, F32, true),
        case(&[2], 290, 65, 32, F8, E8, false),
        // Constants too large to fold, K a multiple of the block: read in the load.
        in_load(&[2], 320, 70, 32, F4, E8),
        in_load(&[2, 3], 96, 200, 32, F4, E8),
        in_load(&[1], 96, 700, 32, F8, E8),
        in_load(&[4], 64, 300, 32, F6, E8),
        in_load(&[4], 48, 400, 16, F4, F32),
    ];
    for (i, c) in cases.iter().enumerate() {
        run(c, 100 + 7 * i as u64);
    }
}
