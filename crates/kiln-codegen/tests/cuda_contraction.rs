//! The CUDA Contraction emitter (`cuda::contraction`): matrix products (transposed,
//! batched, broadcast), convolutions as implicit GEMM (1×1, 3×3, strided, dilated,
//! grouped) at odd `M`, `N`, `K`, with fused epilogues and integer right operands.
//!
//! No GPU runs here (docs/cuda.md). What is checked:
//! - every kernel takes the emitter, and its module is assembled by `ptxas -arch=sm_90a
//!   -v` with no stack frame and no spills (the accumulators stay in registers);
//! - on the host, the arithmetic the PTX performs, written as plain functions of the
//!   plan (`Plan::block`, `Tile::row`/`col`, `Order::slot`, `Plan::a_offset` …): the
//!   blocks' tiles cover every output element exactly once, the threads' loads cover
//!   every element of an operand tile exactly once and store it without bank conflicts,
//!   and the implicit-GEMM address of every `(batch, m, n, k)` equals the offset the
//!   kernel's own load index gives (evaluated here from the index expressions, not from
//!   the affine analysis), as does the output offset.

mod common;
mod ptxas;
use kiln_ptxsim as ptxsim;

use std::collections::HashMap;

use common::{compile_cuda, f32_type, Conv, MatMul};
use kiln_codegen::cuda::contraction::{
    choose_split, choose_tile, reduce_groups, reduce_slot, slots, split_large_tile, Order, Plan, Tile, BK, MAX_SPLIT,
    PAD,
};
use kiln_codegen::cuda::skinny::{Skinny, COLS, MAX_ROWS, MOST_ROWS};
use kiln_codegen::cuda::tune::Tune;
use kiln_codegen::cuda::{self, BLOCK};
use kiln_flow::class::{classify, KernelClass};
use kiln_flow::{BinaryOp, Expr, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, TensorType};
use ptxas::{assemble_ptx_verbose, Usage};

/// The epilogues the kernels below fuse.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Epi {
    /// The sum as it is.
    None,
    /// `max(Σ + bias[row], 0)`.
    BiasRelu,
    /// `tanh(Σ + bias[col]) + residual[out index]`.
    BiasTanhResidual,
}

/// Adds `epi`'s inputs to `ins` (a bias of `rows` or `cols` elements, a residual of the
/// output's shape) and returns its expression over `s`.
fn epilogue(kb: &mut KernelBuilder, epi: Epi, s: ExprId, row: ExprId, col: ExprId, first: usize) -> ExprId {
    match epi {
        Epi::None => s,
        Epi::BiasRelu => {
            let b = kb.load(first, vec![row]);
            let y = kb.add(s, b);
            let z = kb.float(ScalarType::F32, 0.0);
            kb.binary(BinaryOp::Max, y, z)
        }
        Epi::BiasTanhResidual => {
            let b = kb.load(first, vec![col]);
            let y = kb.add(s, b);
            let y = kb.unary(UnaryOp::Tanh, y);
            let idx = kb.out_index();
            let r = kb.load(first + 1, idx);
            kb.add(y, r)
        }
    }
}

fn epi_inputs(epi: Epi, rows: usize, cols: usize, out: &[usize]) -> Vec<TensorType> {
    match epi {
        Epi::None => vec![],
        Epi::BiasRelu => vec![f32_type(&[rows])],
        Epi::BiasTanhResidual => vec![f32_type(&[cols]), f32_type(out)],
    }
}

/// `out[.., m, n] = epi(Σ_k a[.., m, k] · w[.., k, n])`: `a` transposed (`[.., k, m]`)
/// when `a_t`; each operand carries the batch dimensions when its flag says so (else it
/// is broadcast over them); `w` stores `wdt` (an integer is converted in the load).
#[allow(clippy::too_many_arguments)]
fn matmul(
    batch: &[usize],
    batched: (bool, bool),
    m: usize,
    k: usize,
    n: usize,
    a_t: bool,
    wdt: DType,
    epi: Epi,
) -> Kernel {
    let mm = MatMul { batch, batched, mkn: (m, k, n), a_t, dtypes: (DType::F32, wdt) };
    let mut ins = mm.inputs();
    ins.extend(epi_inputs(epi, m, n, &mm.out()));
    let name = format!("mm_{}_{m}_{k}_{n}_{}{}_{}", batch.len(), u8::from(a_t), wdt.name(), epi as u8);
    let mut kb = KernelBuilder::new(name, ins, f32_type(&mm.out()));
    let (s, row, col) = mm.sum(&mut kb);
    let y = epilogue(&mut kb, epi, s, row, col, 2);
    kb.finish(y).expect("matmul kernel")
}

/// A convolution `c` with the epilogue `epi`.
fn conv(c: Conv, epi: Epi) -> Kernel {
    let Conv { n, channels: (ci, co), hw: (h, w), window: (kh, kw), stride: s, dilation: d, groups: g } = c;
    let out = c.out();
    let mut ins = c.inputs().map(|d| f32_type(&d)).to_vec();
    ins.extend(epi_inputs(epi, co, w, &out));
    let name = format!("conv_{n}_{ci}_{co}_{h}x{w}_{kh}x{kw}_s{s}_d{d}_g{g}_{}", epi as u8);
    let mut kb = KernelBuilder::new(name, ins, f32_type(&out));
    let (sum, oc, ox) = c.sum(&mut kb);
    let yv = epilogue(&mut kb, epi, sum, oc, ox, 2);
    kb.finish(yv).expect("conv kernel")
}

/// Every kernel of the suite.
fn suite() -> Vec<Kernel> {
    let mut ks = Vec::new();
    let odd = [1, 7, 33, 127, 1000];
    for (i, &m) in odd.iter().enumerate() {
        let k = odd[(i + 2) % odd.len()];
        let n = odd[(i + 4) % odd.len()];
        ks.push(matmul(&[], (false, false), m, k, n, false, DType::F32, Epi::None));
        ks.push(matmul(&[], (false, false), n, m, k, true, DType::F32, Epi::BiasRelu));
    }
    ks.push(matmul(&[], (false, false), 1024, 1024, 1024, false, DType::F32, Epi::None));
    ks.push(matmul(&[], (false, false), 4096, 256, 4096, false, DType::F32, Epi::BiasTanhResidual));
    // Batched: both operands, the weights broadcast, the activations broadcast.
    ks.push(matmul(&[2, 3], (true, true), 33, 7, 127, false, DType::F32, Epi::BiasTanhResidual));
    ks.push(matmul(&[4], (true, false), 127, 33, 7, false, DType::F32, Epi::BiasRelu));
    ks.push(matmul(&[5], (false, true), 7, 1000, 33, true, DType::F32, Epi::None));
    // Integer weights converted in the load.
    ks.push(matmul(&[], (false, false), 33, 127, 1000, false, DType::I8, Epi::BiasRelu));
    ks.push(matmul(&[], (false, false), 7, 33, 127, false, DType::U8, Epi::None));
    ks.push(matmul(&[], (false, false), 127, 7, 33, false, DType::I16, Epi::None));
    // Convolutions.
    ks.push(conv(Conv::new(1, (32, 64), (56, 56), (1, 1), 1, 1, 1), Epi::BiasRelu));
    ks.push(conv(Conv::new(1, (320, 1280), (7, 7), (1, 1), 1, 1, 1), Epi::None));
    ks.push(conv(Conv::new(2, (3, 33), (17, 13), (3, 3), 1, 1, 1), Epi::BiasRelu));
    ks.push(conv(Conv::new(1, (3, 32), (112, 112), (3, 3), 2, 1, 1), Epi::BiasRelu));
    ks.push(conv(Conv::new(1, (7, 5), (9, 11), (3, 3), 1, 2, 1), Epi::BiasTanhResidual));
    ks.push(conv(Conv::new(1, (8, 12), (10, 10), (5, 3), 2, 2, 1), Epi::None));
    ks.push(conv(Conv::new(2, (8, 12), (9, 7), (3, 3), 1, 1, 4), Epi::BiasRelu));
    ks.push(conv(Conv::new(1, (64, 64), (14, 14), (3, 3), 1, 1, 2), Epi::BiasTanhResidual));
    ks
}

/// `ptxas -v` over `ptx`: each entry's [`Usage`], by name; panics where ptxas refuses it.
fn resources(tag: &str, ptx: &str) -> Vec<(String, Usage)> {
    assemble_ptx_verbose("cuda-contraction", tag, ptx)
        .unwrap_or_else(|e| panic!("{tag}: ptxas refused the module:\n{e}"))
}

#[test]
fn every_kernel_takes_the_emitter_and_assembles_without_spills() {
    let kernels = suite();
    let m = compile_cuda(&kernels, KernelClass::Contraction);
    for (k, (note, launch)) in kernels.iter().zip(m.notes.iter().zip(&m.launches)) {
        assert!(note.starts_with("contraction ("), "{}: {note}", k.name);
        let plan = Plan::of(k).expect("a plan");
        // Few rows: the lane-per-column kernel and its grid.
        let grid = match Skinny::of(&plan) {
            Some(s) => {
                assert!(note.starts_with("contraction (few rows"), "{}: {note}", k.name);
                s.grid()
            }
            None => plan.grid(),
        };
        assert_eq!(launch.grid, grid, "{}", k.name);
        assert_eq!(launch.block, BLOCK);
    }
    let res = resources("suite", m.ptx());
    assert_eq!(res.len(), kernels.len(), "one ptxas report per entry");
    for (name, u) in &res {
        assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{name}: stack frame or spills ({u:?})");
        assert!(u.registers <= 255, "{name}: {} registers", u.registers);
    }
}

/// An independent evaluator of index expressions: the kernel's own `Var`, `Const`,
/// `+ − × div rem neg` nodes at the variables' values.
fn index_value(k: &Kernel, e: ExprId, env: &[i64]) -> i64 {
    match &k.node(e).expr {
        Expr::Var(v) => env[v.0 as usize],
        Expr::Const(bits) => *bits as i64,
        Expr::Binary(op, a, b) => {
            let (a, b) = (index_value(k, *a, env), index_value(k, *b, env));
            match op {
                BinaryOp::Add => a + b,
                BinaryOp::Sub => a - b,
                BinaryOp::Mul => a * b,
                BinaryOp::Div => a.div_euclid(b),
                BinaryOp::Rem => a.rem_euclid(b),
                other => panic!("index op {other:?}"),
            }
        }
        Expr::Unary(UnaryOp::Neg, a) => -index_value(k, *a, env),
        other => panic!("index node {other:?}"),
    }
}

/// Row-major flat offset of `idx` in `dims`.
fn flat(dims: &[usize], idx: &[i64]) -> i64 {
    dims.iter().zip(idx).fold(0, |acc, (&d, &i)| {
        assert!(i >= 0 && (i as usize) < d, "index {i} out of 0..{d}");
        acc * d as i64 + i
    })
}

/// The flat offset of the operand load reading `input` inside the reduction, at `env`.
fn operand_offset(k: &Kernel, input: usize, env: &[i64]) -> i64 {
    let node = k
        .nodes
        .iter()
        .find_map(|n| match &n.expr {
            Expr::Load { input: i, index, .. } if *i as usize == input => Some(index.clone()),
            _ => None,
        })
        .expect("the operand's load");
    let idx: Vec<i64> = node.iter().map(|&e| index_value(k, e, env)).collect();
    flat(k.inputs[input].shape.dims(), &idx)
}

/// Row-major flat index of the values of `vars` in `env` (the inverse of `split`).
fn join(vars: &[(u32, u64)], env: &[i64]) -> u64 {
    vars.iter().fold(0, |acc, &(v, e)| acc * e + env[v as usize] as u64)
}

/// For every point of the kernel's index space (output and reduction variables), the
/// plan's `(batch, m, n, k)` addresses equal the kernel's own load and store offsets.
#[test]
fn implicit_gemm_addresses_are_the_kernels_index_maps() {
    for k in suite() {
        let plan = Plan::of(&k).expect("a plan");
        let total: u64 = k.vars.iter().product();
        // Walk a subsample of large spaces (every point of small ones).
        let stride = (total / 200_000).max(1) | 1;
        let mut env = vec![0i64; k.vars.len()];
        let mut p = 0u64;
        while p < total {
            let mut rest = p;
            for v in (0..k.vars.len()).rev() {
                env[v] = (rest % k.vars[v]) as i64;
                rest /= k.vars[v];
            }
            let (bi, m, n, kk) =
                (join(&plan.batch, &env), join(&plan.rows, &env), join(&plan.cols, &env), join(&plan.ks, &env));
            assert!(bi < plan.dims[0] && m < plan.dims[1] && n < plan.dims[2] && kk < plan.dims[3]);
            assert_eq!(plan.a_offset(bi, m, kk), operand_offset(&k, plan.a.input, &env), "{}: A at {env:?}", k.name);
            assert_eq!(plan.b_offset(bi, n, kk), operand_offset(&k, plan.b.input, &env), "{}: B at {env:?}", k.name);
            let out_rank = k.out_rank();
            assert_eq!(plan.out_offset(bi, m, n), flat(k.output.shape.dims(), &env[..out_rank]), "{}: output", k.name);
            let idx = plan.out_index(bi, m, n);
            assert_eq!(idx.iter().map(|&x| x as i64).collect::<Vec<_>>(), env[..out_rank].to_vec(), "{}", k.name);
            for (v, x) in plan.k_index(kk) {
                assert_eq!(x as i64, env[v as usize], "{}: k variable {v}", k.name);
            }
            p += stride;
        }
    }
}

/// The blocks' tiles, the threads' accumulators within them: every output element of
/// every batch exactly once, and nothing in range left out.
#[test]
fn tiles_cover_every_output_exactly_once() {
    for k in suite() {
        let plan = Plan::of(&k).expect("a plan");
        let [nb, m, n, _] = plan.dims;
        if nb * m * n > 3_000_000 {
            continue;
        }
        let t = plan.tile;
        let mut seen = vec![0u8; (nb * m * n) as usize];
        for tile in 0..plan.grid() / u64::from(plan.split) {
            let (bi, m0, n0) = plan.block(tile);
            assert!(bi < nb, "{}: tile {tile} past the batches", k.name);
            for tid in 0..BLOCK {
                let (tx, ty) = (tid % 16, tid / 16);
                for i in 0..t.tm {
                    for j in 0..t.tn {
                        let (r, c) = (m0 + u64::from(t.row(ty, i)), n0 + u64::from(t.col(tx, j)));
                        if r < m && c < n {
                            seen[((bi * m + r) * n + c) as usize] += 1;
                        }
                    }
                }
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "{}: an element computed {} times", k.name, seen.iter().max().unwrap());
        // Vector stores: 4 columns from a multiple of 4 are 4 consecutive, aligned
        // output elements, in range together.
        if plan.vector_store() {
            assert_eq!(n % 4, 0, "{}", k.name);
            for bi in 0..nb {
                for r in (0..m).step_by(7) {
                    for c in (0..n).step_by(4) {
                        let o = plan.out_offset(bi, r, c);
                        assert_eq!(o % 4, 0, "{}", k.name);
                        for l in 1..4 {
                            assert_eq!(plan.out_offset(bi, r, c + l), o + l as i64, "{}", k.name);
                        }
                    }
                }
            }
        }
    }
    // The thread rows of a tile are a permutation of its rows.
    for t in [Tile { tm: 8, tn: 8 }, Tile { tm: 4, tn: 8 }, Tile { tm: 8, tn: 4 }, Tile { tm: 4, tn: 4 }] {
        let mut rows: Vec<u32> = (0..16).flat_map(|ty| (0..t.tm).map(move |i| t.row(ty, i))).collect();
        rows.sort_unstable();
        assert_eq!(rows, (0..t.bm()).collect::<Vec<_>>());
        let mut cols: Vec<u32> = (0..16).flat_map(|tx| (0..t.tn).map(move |j| t.col(tx, j))).collect();
        cols.sort_unstable();
        assert_eq!(cols, (0..t.bn()).collect::<Vec<_>>());
    }
}

/// Each load order covers every `(k, r)` of a `rows × BK` tile exactly once, and the 32
/// lanes of a warp store each slot to 32 distinct shared banks.
#[test]
fn operand_loads_cover_the_tile_without_bank_conflicts() {
    for rows in [64u32, 128] {
        for order in [Order::AlongK, Order::AlongRows] {
            let mut seen = HashMap::new();
            for tid in 0..BLOCK {
                for e in 0..slots(rows) {
                    let (k, r) = order.slot(rows, tid, e);
                    assert!(k < BK && r < rows, "{order:?} {rows}: ({k}, {r})");
                    *seen.entry((k, r)).or_insert(0) += 1;
                }
            }
            assert_eq!(seen.len() as u32, rows * BK);
            assert!(seen.values().all(|&c| c == 1));
            for warp in 0..BLOCK / 32 {
                for e in 0..slots(rows) {
                    let mut banks: Vec<u32> = (0..32)
                        .map(|lane| {
                            let (k, r) = order.slot(rows, warp * 32 + lane, e);
                            (k * (rows + PAD) + r) % 32
                        })
                        .collect();
                    banks.sort_unstable();
                    banks.dedup();
                    assert_eq!(banks.len(), 32, "{order:?} {rows}: warp {warp} slot {e}");
                }
            }
        }
    }
    // The order follows the smaller stride.
    assert_eq!(Order::of(Some(1024), Some(1)), Order::AlongK);
    assert_eq!(Order::of(Some(1), Some(1024)), Order::AlongRows);
    assert_eq!(Order::of(Some(2), Some(1)), Order::AlongK);
    assert_eq!(Order::of(None, Some(1)), Order::AlongK);
    assert_eq!(Order::of(Some(1), None), Order::AlongRows);
}

/// The tile rule: the least work on the busiest multiprocessor (`Tile::cost`).
#[test]
fn tile_choice() {
    let tile = |nb, m, n| {
        let t = choose_tile(nb, m, n);
        (t.bm(), t.bn())
    };
    assert_eq!(tile(1, 4096, 4096), (128, 128));
    assert_eq!(tile(1, 1024, 1024), (128, 64));
    assert_eq!(tile(1, 512, 2048), (64, 128));
    assert_eq!(tile(1, 320, 49), (64, 64));
    assert_eq!(tile(16, 1024, 1024), (128, 128));
    assert_eq!(tile(1, 1, 1), (64, 64));
    // A thin product: no 128-row tile over 32 rows.
    assert_eq!(tile(1, 32, 12544), (64, 128));
    assert_eq!(tile(1, 1280, 49), (64, 64));
}

/// A contraction this emitter declines (a right operand in CPU panels) falls to the
/// general mapping with the reason in its note, and still assembles.
#[test]
fn panel_operands_decline_to_general() {
    let mut kb = KernelBuilder::new("panel", vec![f32_type(&[3, 7]), f32_type(&[2, 7, 4])], f32_type(&[3, 5]));
    let o = kb.out_index();
    let kv = kb.new_var(7);
    let kk = kb.var(kv);
    let x = kb.load(0, vec![o[0], kk]);
    let c = kb.index(4);
    let d = kb.binary(BinaryOp::Div, o[1], c);
    let r = kb.binary(BinaryOp::Rem, o[1], c);
    let w = kb.load(1, vec![d, kk, r]);
    let p = kb.mul(x, w);
    let s = kb.reduce(ReduceOp::Sum, vec![kv], p);
    let k = kb.finish(s).expect("kernel");
    assert_eq!(classify(&k), KernelClass::Contraction);
    let m = cuda::compile(&[(&k, KernelClass::Contraction)]).expect("compile");
    assert_eq!(m.notes[0], "general (an operand laid out in CPU panels)");
    let _ = resources("panel", m.ptx());
}

/// The kernels of the real lowerings (`kiln_lower::lower_op`) of MatMul (batched,
/// broadcast), Gemm (transposed operands, a bias), Conv (1×1, padded 3×3, strided,
/// dilated, grouped): every Contraction kernel among them takes the emitter, reads
/// where its index maps say, and assembles with no stack frame and no spills.
#[test]
fn lowered_contractions_take_the_emitter() {
    use kiln_ir::infer::{infer, InferInput};
    use kiln_ir::{Attr, Attrs, Op, OpKind, Tensor};
    use kiln_lower::{lower_op, OpCx, OpInput};

    let op = |kind: OpKind, attrs: &[(&str, Attr)]| {
        let mut a = Attrs::new();
        for (n, v) in attrs {
            a.set(*n, v.clone());
        }
        Op::parse(kind, &a).expect("op")
    };
    let t = |dims: &[usize]| {
        let shape = Shape::new(dims.to_vec()).expect("shape");
        let v: Vec<f64> = (0..shape.numel()).map(|i| (i % 7) as f64 - 3.0).collect();
        Tensor::from_f64(DType::F32, shape, &v).expect("tensor")
    };
    let ints = |v: &[i64]| Attr::Ints(v.to_vec());
    // (op, inputs, index of the first constant input)
    let cases: Vec<(Op, Vec<Tensor>, usize)> = vec![
        (op(OpKind::MatMul, &[]), vec![t(&[2, 33, 7]), t(&[7, 127])], 1),
        (op(OpKind::MatMul, &[]), vec![t(&[3, 1, 5, 9]), t(&[4, 9, 6])], 2),
        (op(OpKind::MatMul, &[]), vec![t(&[127, 1000]), t(&[1000, 33])], 1),
        (op(OpKind::Gemm, &[("transA", Attr::Int(1))]), vec![t(&[7, 33]), t(&[7, 127]), t(&[127])], 1),
        (op(OpKind::Gemm, &[("alpha", Attr::Float(0.5))]), vec![t(&[33, 7]), t(&[7, 1000]), t(&[1000])], 1),
        // A transposed right operand (`transB`) reads its columns K apart: kiln-flow's
        // recogniser leaves that to the layout pass (which stores constant weights as
        // `[K, N]` before classification), so the kernel lowered here is no Contraction.
        (op(OpKind::Gemm, &[("transB", Attr::Int(1))]), vec![t(&[33, 7]), t(&[127, 7]), t(&[127])], 1),
        (op(OpKind::Conv, &[]), vec![t(&[1, 16, 9, 7]), t(&[33, 16, 1, 1]), t(&[33])], 1),
        (op(OpKind::Conv, &[("pads", ints(&[1, 1, 1, 1]))]), vec![t(&[2, 7, 13, 11]), t(&[33, 7, 3, 3]), t(&[33])], 1),
        (op(OpKind::Conv, &[("strides", ints(&[2, 2]))]), vec![t(&[1, 3, 17, 15]), t(&[8, 3, 3, 3])], 1),
        (op(OpKind::Conv, &[("dilations", ints(&[2, 2]))]), vec![t(&[1, 5, 9, 9]), t(&[7, 5, 3, 3]), t(&[7])], 1),
        (op(OpKind::Conv, &[("group", Attr::Int(2))]), vec![t(&[1, 8, 10, 6]), t(&[12, 4, 3, 3]), t(&[12])], 1),
        (
            op(OpKind::ConvTranspose, &[("strides", ints(&[2, 2])), ("pads", ints(&[1, 1, 1, 1]))]),
            vec![t(&[1, 6, 5, 7]), t(&[6, 4, 3, 3]), t(&[4])],
            1,
        ),
    ];
    let mut kernels = Vec::new();
    for (i, (op, inputs, const_from)) in cases.iter().enumerate() {
        let ninfer: Vec<Option<InferInput>> =
            inputs.iter().map(|t| Some(InferInput { ty: t.ty(), value: Some(t) })).collect();
        let outs = infer(op, &ninfer, 1).unwrap_or_else(|e| panic!("{}: {e}", op.kind));
        let opin: Vec<Option<OpInput>> = inputs
            .iter()
            .enumerate()
            .map(|(j, t)| Some(OpInput { ty: t.ty(), value: (j >= *const_from).then_some(t) }))
            .collect();
        let name = format!("low{i}");
        let cx = OpCx { op, name: &name, inputs: &opin, outputs: &outs };
        let lowered = lower_op(&cx).unwrap_or_else(|e| panic!("{}: {e}", op.kind));
        let before = kernels.len();
        let classes: Vec<&str> = lowered.steps.iter().map(|s| classify(&s.kernel).name()).collect();
        kernels.extend(lowered.steps.into_iter().map(|s| s.kernel).filter(|k| classify(k) == KernelClass::Contraction));
        // Padded loads (case 7, and ConvTranspose's phases) keep a kernel out of the
        // class until the compiler splits the padding into its own kernel (every model's
        // convolutions reach the emitter that way: docs/cuda.md); a transposed B (case 5)
        // until the layout pass stores it as [K, N].
        let expected = !matches!(i, 5 | 7 | 11);
        assert_eq!(kernels.len() > before, expected, "{} (case {i}): {classes:?}", op.kind);
    }
    let with_class: Vec<(&Kernel, KernelClass)> = kernels.iter().map(|k| (k, KernelClass::Contraction)).collect();
    let m = cuda::compile(&with_class).expect("compile");
    for (k, note) in kernels.iter().zip(&m.notes) {
        assert!(note.starts_with("contraction ("), "{}: {note}", k.name);
        // Every output element's operands, at a few reduction indices.
        let plan = Plan::of(k).expect("a plan");
        let [nb, mm, nn, kk] = plan.dims;
        for bi in 0..nb {
            for r in 0..mm {
                for c in 0..nn {
                    for q in [0, kk / 2, kk - 1] {
                        let mut env = vec![0i64; k.vars.len()];
                        for (v, x) in plan.out_index(bi, r, c).into_iter().enumerate() {
                            env[v] = x as i64;
                        }
                        for (v, x) in plan.k_index(q) {
                            env[v as usize] = x as i64;
                        }
                        assert_eq!(plan.a_offset(bi, r, q), operand_offset(k, plan.a.input, &env), "{}", k.name);
                        assert_eq!(plan.b_offset(bi, c, q), operand_offset(k, plan.b.input, &env), "{}", k.name);
                    }
                }
            }
        }
    }
    for (name, u) in resources("lowered", m.ptx()) {
        assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{name}: stack frame or spills ({u:?})");
    }
}

/// The emitted PTX, run by the host simulator (`ptxsim`: every global access checked
/// against its binding, every barrier reached by all threads), against the kernel
/// interpreter: every output element written, each within the difference between an
/// FMA chain and the interpreter's rounded products and sums (`K · 2⁻²¹ · Σ|a·b|`
/// bounded by `K · 4 · 2⁻²⁰`, plus the epilogue's one rounding).
#[test]
fn simulated_kernels_match_the_interpreter() {
    let kernels = vec![
        matmul(&[], (false, false), 7, 33, 1, false, DType::F32, Epi::None),
        matmul(&[], (false, false), 1, 7, 33, true, DType::F32, Epi::BiasRelu),
        matmul(&[], (false, false), 130, 37, 70, false, DType::F32, Epi::BiasRelu),
        matmul(&[], (false, false), 33, 127, 7, true, DType::F32, Epi::None),
        matmul(&[2], (true, true), 9, 17, 5, false, DType::F32, Epi::BiasRelu),
        matmul(&[3], (false, true), 5, 18, 9, true, DType::F32, Epi::None),
        matmul(&[2], (true, false), 20, 16, 3, false, DType::F32, Epi::None),
        matmul(&[], (false, false), 9, 40, 20, false, DType::I8, Epi::BiasRelu),
        matmul(&[], (false, false), 5, 9, 66, false, DType::U8, Epi::None),
        matmul(&[], (false, false), 70, 19, 132, false, DType::F32, Epi::BiasTanhResidual),
        matmul(&[2], (true, true), 9, 17, 8, false, DType::F32, Epi::BiasRelu),
        conv(Conv::new(2, (5, 7), (3, 4), (1, 1), 1, 1, 1), Epi::BiasRelu),
        // Split-K over clusters of 4 and of 8 (half the threads sum).
        matmul(&[], (false, false), 40, 300, 50, false, DType::F32, Epi::BiasRelu),
        matmul(&[], (false, false), 9, 600, 72, false, DType::F32, Epi::BiasTanhResidual),
        conv(Conv::new(1, (256, 20), (7, 7), (1, 1), 1, 1, 1), Epi::BiasRelu),
        conv(Conv::new(1, (5, 7), (6, 5), (3, 3), 1, 1, 1), Epi::BiasRelu),
        conv(Conv::new(2, (3, 4), (4, 3), (3, 2), 2, 2, 1), Epi::None),
        conv(Conv::new(1, (6, 8), (5, 4), (3, 3), 1, 1, 2), Epi::BiasRelu),
        conv(Conv::new(1, (16, 9), (7, 7), (1, 1), 1, 1, 1), Epi::None),
    ];
    simulate_each(&kernels, "contraction (", 1);
}

/// Each of `kernels` compiled alone (its note starting with `note`) and run by the host
/// simulator against the kernel interpreter on the random inputs of seeds `seed0`,
/// `seed0 + 1`, …: every output element written, each within the bound of
/// [`simulated_kernels_match_the_interpreter`].
fn simulate_each(kernels: &[Kernel], note: &str, seed0: u64) {
    simulate_each_for(kernels, note, seed0, cuda::tune::Arch::Sm90a);
}

/// [`simulate_each`] with the kernels written for `arch`.
fn simulate_each_for(kernels: &[Kernel], note: &str, seed0: u64, arch: cuda::tune::Arch) {
    for (seed, k) in (seed0..).zip(kernels) {
        let m = cuda::compile_for(&[(k, classify(k))], arch).expect("compile");
        assert!(m.notes[0].starts_with(note), "{}: {}", k.name, m.notes[0]);
        eprintln!("{}: {}", k.name, m.notes[0]);
        simulate_compiled(k, &m, seed, &k.name);
    }
}

/// Module `m`'s one kernel, compiled from `k`, run by the host simulator against the
/// kernel interpreter on the random inputs of `seed`: every output element written, each
/// within the bound of [`simulated_kernels_match_the_interpreter`]. `what` names the
/// case in a failure.
fn simulate_compiled(k: &Kernel, m: &cuda::CudaModule, seed: u64, what: &str) {
    let kk = Plan::of(k).expect("plan").dims[3] as f64;
    let l = m.launches[0];
    let launch = ptxsim::Grid::of(l.grid, l.block, l.shared);
    let c = ptxsim::Check {
        tol: ptxsim::Tol::Rel { rel: 2f64.powi(-22), abs: kk * 4.0 * 2f64.powi(-20) },
        ..ptxsim::Check::exact(seed)
    };
    let o = ptxsim::check_against_interpreter(k, m.ptx(), 0, launch, &c).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(o.compared, o.elements, "{what}: every element");
}

/// The default's 128×128 tile split over `K` (`split_large_tile`): where 128×128 tiles
/// leave at least half of the 132 multiprocessors idle, a chosen tile that does not split
/// gives way when the split tile's modelled time is lower, with parts of at least 256;
/// a 1024³ product (128 blocks of 128×64 before) compiles to 64 tiles split in two, the
/// kernel the knob's `f32=128x128s2` simulates above.
#[test]
fn large_tiles_split_where_the_grid_is_small() {
    let (big, tall) = (Tile { tm: 8, tn: 8 }, Tile { tm: 8, tn: 4 });
    assert_eq!(choose_tile(1, 1024, 1024), tall);
    assert_eq!(split_large_tile(1, 1024, 1024, 1024, tall), Some((big, 2)));
    // Parts shorter than 256, a grid of 128×128 tiles over half the machine, or the
    // large tile chosen already: no change.
    assert_eq!(split_large_tile(1, 1024, 1024, 500, tall), None);
    assert_eq!(split_large_tile(1, 2048, 1024, 4096, tall), None);
    assert_eq!(split_large_tile(1, 512, 512, 4096, big), None);
    // A small grid splits further, up to one wave.
    assert_eq!(split_large_tile(1, 256, 512, 8192, Tile { tm: 4, tn: 4 }).map(|(_, s)| s), Some(8));
    let k = matmul(&[], (false, false), 1024, 1024, 1024, false, DType::F32, Epi::None);
    let m = cuda::compile(&[(&k, classify(&k))]).expect("compile");
    assert!(m.notes[0].starts_with("contraction (128x128 tile"), "{}", m.notes[0]);
    assert!(m.notes[0].contains("128 blocks, split-K over clusters of 2"), "{}", m.notes[0]);
}

/// The split-K rule, and the reduction's slots: the ranks' threads sum every group of 4
/// columns of a tile exactly once, for every tile and split (the default splits 64×64
/// tiles only; the measurement knob `KILN_CUDA_TUNE` any).
#[test]
fn split_k_covers_the_tile_once() {
    let small = Tile { tm: 4, tn: 4 };
    assert_eq!(choose_split(Tile { tm: 8, tn: 8 }, 1, 4096), 1);
    assert_eq!(choose_split(small, 100, 4096), 1);
    assert_eq!(choose_split(small, 5, 960), 8);
    assert_eq!(choose_split(small, 20, 320), 4);
    assert_eq!(choose_split(small, 1, 100), 1);
    assert_eq!(choose_split(small, 1, 300), 4);
    for tile in TILES {
        for split in [2, 4, 8] {
            assert!(split <= MAX_SPLIT);
            let g = tile.bn() / 4;
            let mut seen = vec![0u8; (tile.bm() * g) as usize];
            for rank in 0..split {
                for tid in 0..BLOCK {
                    for q in 0..reduce_groups(tile, split) {
                        if let Some((r, c)) = reduce_slot(tile, split, rank, tid, q) {
                            assert_eq!(c % 4, 0);
                            assert!(r < tile.bm() && c < tile.bn());
                            seen[(r * g + c / 4) as usize] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{tile:?} split {split}");
        }
    }
    // The mobilenet tail's shapes split; a full grid does not.
    let k = conv(Conv::new(1, (320, 1280), (7, 7), (1, 1), 1, 1, 1), Epi::None);
    let plan = Plan::of(&k).expect("plan");
    assert_eq!((plan.split, plan.grid()), (4, 80));
    assert!(plan.k_chunk.is_multiple_of(u64::from(BK)) && plan.k_chunk * u64::from(plan.split) >= plan.dims[3]);
    let big = matmul(&[], (false, false), 1024, 1024, 1024, false, DType::F32, Epi::None);
    assert_eq!(Plan::of(&big).expect("plan").split, 1);
}

/// Every tile of the f32 kernel.
const TILES: [Tile; 4] = [Tile { tm: 8, tn: 8 }, Tile { tm: 8, tn: 4 }, Tile { tm: 4, tn: 8 }, Tile { tm: 4, tn: 4 }];

/// The f32 variants the measurement knob names (`KILN_CUDA_TUNE=f32=…`, what
/// `scripts/cuda-tune-sweep.sh` times): every tile with and without a split, the split
/// over 2 to 8 blocks, run by the simulator against the interpreter on odd shapes
/// (partial tiles, a part of `K` that is empty or short, batches, transposes, integer
/// weights, implicit GEMM, each epilogue) and assembled over the whole suite by ptxas
/// with no spills (a transposed row operand keeps its own tile). Partial tiles of 64 KiB (128×128 split) take dynamic shared memory.
#[test]
fn tuned_f32_variants_match_the_interpreter_and_do_not_spill() {
    let kernels = vec![
        matmul(&[], (false, false), 130, 37, 70, false, DType::F32, Epi::BiasRelu),
        matmul(&[], (false, false), 33, 127, 20, false, DType::F32, Epi::BiasTanhResidual),
        matmul(&[2], (true, false), 20, 70, 9, false, DType::I8, Epi::None),
        matmul(&[], (false, false), 17, 300, 132, false, DType::F32, Epi::None),
        conv(Conv::new(1, (5, 20), (6, 5), (3, 3), 1, 1, 1), Epi::BiasRelu),
    ];
    let suite = suite();
    for v in ["128x128s4", "128x128s2", "128x64s2", "128x64s4", "64x128s2", "64x64s8", "128x128", "64x64"] {
        let tune = Tune::parse(&format!("f32={v}")).expect("variant");
        let f = tune.f32.expect("f32 variant");
        // A transposed row operand keeps its own tile.
        let t = matmul(&[], (false, false), 70, 40, 30, true, DType::F32, Epi::None);
        let m = cuda::compile_tuned(&[(&t, classify(&t))], &tune).expect("compile");
        assert_eq!(m.notes, cuda::compile(&[(&t, classify(&t))]).expect("compile").notes);
        for (seed, k) in (7..).zip(&kernels) {
            let m = cuda::compile_tuned(&[(k, classify(k))], &tune).expect("compile");
            let want = format!("contraction ({}x{} tile", f.tile.bm(), f.tile.bn());
            assert!(m.notes[0].starts_with(&want), "{v} {}: {}", k.name, m.notes[0]);
            let plan = Plan::of(k).expect("plan").retiled(f.tile, f.split).expect("plan");
            let l = m.launches[0];
            assert_eq!(l.grid, plan.grid());
            assert_eq!(l.shared, cuda::dynamic_bytes(plan.shared_bytes()));
            simulate_compiled(k, &m, seed, &format!("{v} {}", k.name));
        }
        let with_class: Vec<_> = suite.iter().map(|k| (k, classify(k))).collect();
        let m = cuda::compile_tuned(&with_class, &tune).expect("compile");
        for (name, u) in resources(&format!("tune-{v}"), m.ptx()) {
            if name.starts_with("mm_0_1024_1024_1024") {
                eprintln!("f32={v} {name}: {u:?}");
            }
            assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{v} {name}: spills ({u:?})");
        }
    }
}

/// Products of at most [`MAX_ROWS`] rows take the lane-per-column kernel
/// (`cuda::skinny`): its blocks cover every column of every batch once, the ranks of a
/// split and the warps of a block take every `k` once, each lane's column is summed by
/// exactly one rank, and the split rule spreads short grids over the multiprocessors.
#[test]
fn few_row_products_cover_columns_and_k_once() {
    for (batch, m, k, n) in
        [(0usize, 1, 784, 512), (0, 1, 300, 50), (1, 7, 33, 1000), (2, 3, 600, 40), (0, 8, 20, 7), (0, 16, 150, 100)]
    {
        let b: Vec<usize> = vec![3; batch];
        let kern = matmul(&b, (batch > 0, batch > 0), m, k, n, false, DType::F32, Epi::None);
        let plan = Plan::of(&kern).expect("plan");
        let s = Skinny::of(&plan).expect("few rows");
        let [nb, _, n, kk] = plan.dims;
        assert!(s.split.is_power_of_two() && s.split <= MAX_SPLIT);
        assert!(s.k_chunk * u64::from(s.split) >= kk && s.k_chunk * u64::from(s.split - 1) < kk);
        let mut cols = vec![0u32; (nb * n) as usize];
        let mut ks = vec![0u32; (nb * n.div_ceil(COLS) * kk) as usize];
        for bid in 0..s.grid() {
            let (bi, n0, rank) = s.block(n, bid);
            assert!(bi < nb && n0 < n && rank < s.split);
            if rank == 0 {
                for c in n0..(n0 + COLS).min(n) {
                    cols[(bi * n + c) as usize] += 1;
                }
            }
            let tile = bid / u64::from(s.split);
            for w in 0..BLOCK / 32 {
                for kx in s.k_of(kk, rank, w) {
                    ks[(tile * kk + kx) as usize] += 1;
                }
            }
        }
        assert!(cols.iter().all(|&c| c == 1), "{}: columns", kern.name);
        assert!(ks.iter().all(|&c| c == 1), "{}: reduction indices", kern.name);
        for lane in 0..32 {
            assert_eq!((0..s.split).filter(|&r| s.owner(lane) == r).count(), 1);
        }
    }
    // The split: a short grid over a long K splits 8 ways; a full grid does not.
    let split = |m, k, n| {
        let kern = matmul(&[], (false, false), m, k, n, false, DType::F32, Epi::None);
        Skinny::of(&Plan::of(&kern).expect("plan")).map(|s| (s.split, s.grid()))
    };
    assert_eq!(split(1, 784, 512), Some((8, 128)));
    assert_eq!(split(1, 256, 10), Some((8, 8)));
    assert_eq!(split(1, 4096, 8192), Some((1, 256)));
    assert_eq!(split(1, 40, 64), Some((1, 2)));
    assert_eq!(split(12, 784, 512), Some((8, 128)));
    assert_eq!(split(17, 784, 512), None);
    // 9 to 16 rows only where the tiled grid would not fill the multiprocessors.
    assert_eq!(split(16, 64, 200_000), None);
}

/// The lane-per-column kernel run by the host simulator against the kernel
/// interpreter, with the summation-order bound of `simulated_kernels_match_the_interpreter`:
/// splits of 2 to 8 (distributed shared memory), batches, integer weights, implicit
/// GEMM with few output channels, columns that leave a tile part empty.
#[test]
fn simulated_few_row_kernels_match_the_interpreter() {
    let kernels = vec![
        matmul(&[], (false, false), 1, 300, 50, false, DType::F32, Epi::BiasRelu),
        matmul(&[], (false, false), 3, 1000, 70, false, DType::F32, Epi::BiasTanhResidual),
        matmul(&[2], (true, true), 1, 600, 40, false, DType::F32, Epi::BiasRelu),
        matmul(&[], (false, false), 8, 130, 33, true, DType::F32, Epi::None),
        matmul(&[], (false, false), 2, 400, 33, false, DType::I8, Epi::BiasRelu),
        matmul(&[], (false, false), 12, 300, 50, false, DType::F32, Epi::BiasTanhResidual),
        matmul(&[2], (true, true), 16, 45, 40, true, DType::F32, Epi::BiasRelu),
        conv(Conv::new(1, (6, 16), (10, 10), (5, 5), 1, 1, 1), Epi::BiasRelu),
        matmul(&[3], (false, true), 4, 90, 9, true, DType::U8, Epi::None),
        conv(Conv::new(1, (24, 1), (9, 11), (3, 3), 1, 1, 1), Epi::BiasRelu),
        conv(Conv::new(2, (16, 6), (5, 7), (3, 3), 2, 1, 1), Epi::BiasTanhResidual),
    ];
    simulate_each(&kernels, "contraction (few rows", 100);
    assert!(MAX_ROWS >= 8 && MOST_ROWS >= 16);
}

/// The kernels that split `K` over a cluster on sm_90a, written for sm_80 (no clusters:
/// `--cuda-arch sm_80`): the module declares `.target sm_80`, no kernel splits (its
/// note says so, and its grid is the tiles alone), and the simulator's results match
/// the interpreter as on sm_90a.
#[test]
fn split_k_kernels_written_for_sm_80_split_nothing_and_match_the_interpreter() {
    use cuda::tune::Arch;
    let tiled = vec![
        matmul(&[], (false, false), 40, 300, 50, false, DType::F32, Epi::BiasRelu),
        matmul(&[], (false, false), 9, 600, 72, false, DType::F32, Epi::BiasTanhResidual),
        conv(Conv::new(1, (256, 20), (7, 7), (1, 1), 1, 1, 1), Epi::BiasRelu),
    ];
    let few_rows = vec![
        matmul(&[], (false, false), 1, 300, 50, false, DType::F32, Epi::BiasRelu),
        matmul(&[2], (true, true), 1, 600, 40, false, DType::F32, Epi::BiasRelu),
    ];
    for k in tiled.iter().chain(&few_rows) {
        let hopper = cuda::compile_for(&[(k, classify(k))], Arch::Sm90a).expect("compile");
        assert!(hopper.notes[0].contains("split-K over clusters"), "{}: {}", k.name, hopper.notes[0]);
        let ampere = cuda::compile_for(&[(k, classify(k))], Arch::Sm80).expect("compile");
        assert!(ampere.ptx().starts_with(".version 8.0\n.target sm_80\n"), "{}", k.name);
        assert!(!ampere.notes[0].contains("cluster"), "{}: {}", k.name, ampere.notes[0]);
        assert!(!ampere.ptx().contains("cluster"), "{}", k.name);
        assert!(ampere.launches[0].grid < hopper.launches[0].grid, "{}: the tiles alone", k.name);
    }
    // A retile that asks for a split (the large-tile rule, a tuned tile) keeps a plan
    // without clusters unsplit, each block's part of `K` the whole of it.
    for k in &tiled {
        let plan = Plan::of(k).expect("plan").without_clusters().expect("plan");
        let kk = plan.dims[3];
        let r = plan.retiled(Tile { tm: 8, tn: 8 }, 2).expect("retile");
        assert_eq!((r.split, r.clusters), (1, false), "{}", k.name);
        assert!(r.k_chunk >= kk && r.k_chunk < kk + u64::from(BK), "{}: k_chunk {} for K {kk}", k.name, r.k_chunk);
    }
    simulate_each_for(&tiled, "contraction (", 200, Arch::Sm80);
    simulate_each_for(&few_rows, "contraction (few rows", 300, Arch::Sm80);
}
