//! The CUDA Rows emitter (`cuda::rows`): which mapping each row length gets, that the
//! threads' walk covers every element of every row exactly once for any grid (on the
//! host, the same arithmetic as the PTX), and that Softmax, LogSoftmax, LayerNorm,
//! every reduction on every type, reductions whose walk strides through memory and fused epilogues take the emitter over rows of 1, 31, 33, 1000 and 4097
//! elements (warp, part of a warp, block, unrolled and looping walks), each module
//! assembled by `ptxas -arch=sm_90a -v` with no spills and no stack frame.
//!
//! The real lowerings (`kiln_lower::lower_op`) of every ONNX reduction, Softmax,
//! LogSoftmax and LayerNormalization give Rows kernels that take it too.
//!
//! The emitted code is also checked for its structure: each reduction computed once
//! per row (one butterfly of shuffles per reduction, two barriers per reduction in the
//! block form) and the row read once where it is kept in registers. No GPU runs these
//! tests (docs/cuda.md); float sums are reassociated, so on a GPU they are within
//! `(n + log₂ G)·2⁻²⁴·Σ|xᵢ|` of the interpreter's, and max/min exactly equal.

mod common;
mod ptxas;
use kiln_ptxsim as ptxsim;

use common::{layernorm, softmax, ty};
use kiln_codegen::cuda::{self, rows};
use kiln_flow::class::{classify, KernelClass};
use kiln_flow::{Kernel, KernelBuilder, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::{DType, Shape, TensorType};
use ptxas::assemble_ptx_verbose;

const LENGTHS: [usize; 5] = [1, 31, 33, 1000, 4097];

/// Compiles `k` (a Rows kernel), checks that the Rows emitter took it and that ptxas
/// assembles it with no spill and no stack; its PTX and note.
fn rows_kernel(k: &Kernel) -> (String, String) {
    assert_eq!(classify(k), KernelClass::Rows, "{}: class", k.name);
    let m = cuda::compile(&[(k, KernelClass::Rows)]).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let note = m.notes[0].clone();
    assert!(note.starts_with("rows ("), "{}: {note}", k.name);
    let usage = assemble_ptx_verbose("cuda-rows", &k.name, m.ptx())
        .unwrap_or_else(|e| panic!("{}: ptxas refused it:\n{e}\n{}", k.name, m.ptx()));
    assert_eq!(usage.len(), 1, "{}: {usage:?}", k.name);
    let u = usage[0].1;
    assert!(u.stack == 0 && u.spill_stores == 0 && u.spill_loads == 0, "{}: {note}: {u:?}", k.name);
    assert!(u.registers > 0, "{}: ptxas -v reported no registers: {u:?}", k.name);
    let l = m.launches[0];
    assert!(
        l.grid >= 1 && l.block >= 64 && l.block <= cuda::BLOCK && l.block.is_multiple_of(32) && l.shared == 0,
        "{l:?}"
    );
    simulate(k, &m);
    (m.ptx().to_string(), note)
}

/// Runs `m`'s one entry (kernel `k`) in the host PTX simulator (its warps' shuffles in
/// lockstep, its barriers checked) against the kernel interpreter, on plain random
/// inputs and on inputs with NaN, ±∞ and −0, over at most 3 blocks (the grid-stride
/// walk over rows turns) and about 2¹⁹ instructions: integers and max/min exactly,
/// float sums within `2⁻¹⁸·|want| + (1 + n)·2⁻¹⁸` for rows of `n` (reassociated sums,
/// `ex2.approx`/`lg2.approx` simulated exactly). The interpreter recomputes a row's
/// reductions for each element, so kernels of more than 2²⁶ elements × reduction lengths run
/// without it (every access, shuffle and barrier still checked).
fn simulate(k: &Kernel, m: &cuda::CudaModule) {
    let n = ptxsim::reduction_length(k);
    let oracle = ptxsim::interpretation_cost(k) <= 1 << 26;
    let l = m.launches[0];
    let c = ptxsim::Check {
        tol: ptxsim::Tol::Rel { rel: 2f64.powi(-18), abs: (1 + n) as f64 * 2f64.powi(-18) },
        max_blocks: Some(3),
        budget: Some(1 << 19),
        oracle,
        ..ptxsim::Check::exact(7)
    };
    let launch = ptxsim::Grid::of(l.grid, l.block, l.shared);
    let o = c.plain_and_specials(k, m.ptx(), 0, launch).unwrap_or_else(|e| panic!("{e}"));
    eprintln!("simulated {} ({}): {} of {} elements compared", k.name, m.notes[0], o.compared, o.elements);
}

fn count(ptx: &str, what: &str) -> usize {
    ptx.matches(what).count()
}

#[test]
fn the_mapping_follows_the_row_length_and_the_layout() {
    use rows::Layout::{AcrossRows, AlongRows, Strided};
    let many = rows::ROWS_FOR_THREADS;
    let cases = [
        (AlongRows, 1, 1, 1),
        (AlongRows, 2, 1, 2),
        (AlongRows, 4, 9, 4),
        (AlongRows, 31, 1, 32),
        (AlongRows, 33, many, 32),
        (AlongRows, 512, 1, 32),
        (AlongRows, 513, 1, 256),
        (AlongRows, 4097, many, 256),
        (AcrossRows, 1000, many, 1),
        (AcrossRows, 7, many, 1),
        (AcrossRows, 1000, many - 1, 256),
        (AcrossRows, 7, 5, 8),
        (Strided, 1000, many, 1),
        (Strided, 1000, many - 1, 256),
    ];
    for (layout, n, rows_n, group) in cases {
        let m = rows::mapping(layout, n, rows_n);
        assert_eq!(m.group, group, "n = {n}, {layout:?}, {rows_n} rows");
        assert_eq!(m.chunks, n.div_ceil(group), "n = {n}");
    }
    assert!(rows::mapping(AlongRows, 4096, 1).unrolled());
    assert!(!rows::mapping(AlongRows, 4097, 1).unrolled());
}

/// Every (row, position) visited exactly once with its store, by every thread
/// mapping, for grids smaller and larger than the rows need; lanes past the last row
/// visit only (clamped) rows that exist, and never store.
#[test]
fn the_walk_covers_every_element_once_for_any_grid() {
    use rows::Layout::{AcrossRows, AlongRows};
    for (layout, n) in
        [(AlongRows, 1u64), (AlongRows, 3), (AlongRows, 31), (AlongRows, 33), (AlongRows, 600), (AcrossRows, 5)]
    {
        let m = rows::mapping(layout, n, rows::ROWS_FOR_THREADS);
        for rows_n in [1u64, 3, 7, 8, 33, 65] {
            let need = m.grid(rows_n);
            for (grid, block) in [(1, m.block(rows_n)), (2, 64), (need, m.block(rows_n)), (need + 3, cuda::BLOCK)] {
                // The block form's shared array has a slot per warp of a 256-thread block.
                let block = if m.group > 32 { cuda::BLOCK } else { block };
                let mut seen = vec![0u32; (rows_n * n) as usize];
                let mut bad = None;
                rows::walk(m, rows_n, n, grid, block, &mut |r, p, stores| {
                    if r >= rows_n || p >= n {
                        bad = Some((r, p));
                    } else if stores {
                        seen[(r * n + p) as usize] += 1;
                    }
                })
                .unwrap_or_else(|e| panic!("{m:?} rows {rows_n} grid {grid}: {e}"));
                assert_eq!(bad, None, "{m:?} rows {rows_n} grid {grid}: visited outside");
                assert!(seen.iter().all(|&c| c == 1), "{m:?} rows {rows_n} grid {grid}: {seen:?}");
            }
        }
    }
}

#[test]
fn softmax_computes_each_reduction_once_and_each_exp_once() {
    for len in LENGTHS {
        for r in [1, 3, 7] {
            let k = softmax(r, len);
            let (ptx, note) = rows_kernel(&k);
            let m = rows::mapping(rows::Layout::AlongRows, len as u64, 1);
            let shuffles = 2 * m.group.min(32).trailing_zeros() as usize;
            assert_eq!(count(&ptx, "shfl.sync.bfly.b32"), shuffles, "len {len}: {note}");
            let barriers = if m.group > 32 { 4 } else { 0 };
            assert_eq!(count(&ptx, "bar.sync"), barriers, "len {len}: {note}");
            if m.unrolled() {
                // The row read once, by the maximum; the sum and the output reuse it.
                assert_eq!(count(&ptx, "ld.global"), m.chunks as usize, "len {len}: {note}");
                // exp(x − max) computed once, by the sum; the output divides it.
                assert_eq!(count(&ptx, "ex2.approx"), m.chunks as usize, "len {len}: {note}");
                assert!(note.contains("2 values kept in registers"), "{note}");
            } else {
                assert!(note.contains("0 values kept"), "{note}");
                assert_eq!(count(&ptx, "ex2.approx"), 2, "len {len}: {note}");
            }
        }
    }
}

#[test]
fn layernorm_takes_the_rows_emitter_at_every_length() {
    for len in LENGTHS {
        for r in [1, 3, 7] {
            let (ptx, note) = rows_kernel(&layernorm(r, len));
            let m = rows::mapping(rows::Layout::AlongRows, len as u64, 1);
            assert_eq!(count(&ptx, "shfl.sync.bfly.b32"), 2 * m.group.min(32).trailing_zeros() as usize, "{note}");
        }
    }
}

/// `x − max − log Σ exp(x − max)`, over the last axis of `[rows, len]`.
fn log_softmax(rows: usize, len: usize) -> Kernel {
    let mut b = KernelBuilder::new("log_softmax", vec![ty(DType::F32, &[rows, len])], ty(DType::F32, &[rows, len]));
    let o = b.out_index();
    let mx = common::reduce_row(&mut b, 0, o[0], len, ReduceOp::Max, |_, x| x);
    let s = common::reduce_row(&mut b, 0, o[0], len, ReduceOp::Sum, |b, x| {
        let d = b.sub(x, mx);
        b.unary(UnaryOp::Exp, d)
    });
    let ls = b.unary(UnaryOp::Log, s);
    let x = b.load(0, vec![o[0], o[1]]);
    let d = b.sub(x, mx);
    let y = b.sub(d, ls);
    b.finish(y).unwrap()
}

/// LayerNorm with a fused epilogue: GELU (erf) of the normalised value plus a
/// residual from another input.
fn layernorm_gelu_residual(rows: usize, len: usize) -> Kernel {
    let mut b = KernelBuilder::new(
        "ln_gelu",
        vec![ty(DType::F32, &[rows, len]), ty(DType::F32, &[len]), ty(DType::F32, &[rows, len])],
        ty(DType::F32, &[rows, len]),
    );
    let o = b.out_index();
    let y = common::normalised(&mut b, &o, len);
    let g = b.load(1, vec![o[1]]);
    let y = b.mul(y, g);
    let y = common::gelu(&mut b, y);
    let res = b.load(2, vec![o[0], o[1]]);
    let y = b.add(y, res);
    b.finish(y).unwrap()
}

#[test]
fn log_softmax_and_fused_epilogues_take_the_rows_emitter() {
    for len in LENGTHS {
        rows_kernel(&log_softmax(5, len));
        rows_kernel(&layernorm_gelu_residual(3, len));
    }
}

/// Every reduction on every type (8/16-bit integers, 64-bit values as two shuffled
/// halves, bool as a predicate), along rows of every length; arg reductions decline.
#[test]
fn every_reduction_on_every_type_takes_the_rows_emitter() {
    for t in ScalarType::ALL {
        for op in ReduceOp::ALL {
            for len in [1, 33, 1000] {
                let d = t.dtype();
                let out = if op.is_arg() { DType::I64 } else { d };
                if t == ScalarType::Bool && op.is_arg() {
                    continue;
                }
                let name = format!("r_{}_{}_{len}", op.name().replace('.', "_"), t.name());
                // (The kernel verifier refuses sums and products of bool.)
                let Ok(k) = row_reduce(&name, d, 3, len, out, op) else {
                    assert!(t == ScalarType::Bool, "{name} refused");
                    continue;
                };
                if op.is_arg() {
                    let m = cuda::compile(&[(&k, classify(&k))]).expect("compiles");
                    assert!(m.notes[0].starts_with("general (an arg reduction"), "{name}: {}", m.notes[0]);
                    continue;
                }
                let (ptx, _) = rows_kernel(&k);
                let m = rows::mapping(rows::Layout::AlongRows, len as u64, 1);
                let halves = if matches!(t, ScalarType::I64 | ScalarType::U64 | ScalarType::F64) { 2 } else { 1 };
                assert_eq!(
                    count(&ptx, "shfl.sync.bfly.b32"),
                    halves * m.group.min(32).trailing_zeros() as usize,
                    "{name}"
                );
            }
        }
    }
}

/// `y[i, 0] = op over j of x[i, j]` (keeping the reduced axis: the output's last axis
/// is the row's, of one element; without it the output's last axis is the reduced
/// rows' and the kernel is General).
fn row_reduce(
    name: &str,
    d: DType,
    rows_n: usize,
    len: usize,
    out: DType,
    op: ReduceOp,
) -> Result<Kernel, kiln_flow::KernelError> {
    let mut b = KernelBuilder::new(name, vec![ty(d, &[rows_n, len])], ty(out, &[rows_n, 1]));
    let o = b.out_index();
    let r = common::reduce_row(&mut b, 0, o[0], len, op, |_, x| x);
    b.finish(r)
}

/// `out[c, 0] = Σₙ x[n, c] / N`: the reduced axis is the outer one in memory.
fn column_mean(n: usize, c: usize) -> Kernel {
    let mut b = KernelBuilder::new("colmean", vec![ty(DType::F32, &[n, c])], ty(DType::F32, &[c, 1]));
    let o = b.out_index();
    let v = b.new_var(n as u64);
    let nv = b.var(v);
    let ld = b.load(0, vec![nv, o[0]]);
    let s = b.reduce(ReduceOp::Sum, vec![v], ld);
    let cnt = b.float(ScalarType::F32, n as f64);
    let r = b.div(s, cnt);
    b.finish(r).unwrap()
}

/// Many columns: a thread per column, consecutive threads on consecutive columns (the
/// loads coalesce across rows). Few: the lanes of a warp or block share a column.
#[test]
fn reductions_along_a_strided_axis_coalesce_across_rows_when_rows_are_many() {
    let many = rows::ROWS_FOR_THREADS as usize;
    for (n, c, want) in [
        (1, many, "a thread per row"),
        (31, many + 3, "a thread per row"),
        (4097, many, "a thread per row"),
        (31, 33, "a warp per row"),
        (4097, 5, "a block of 256 per row"),
    ] {
        let (ptx, note) = rows_kernel(&column_mean(n, c));
        assert!(note.contains(want), "{n}x{c}: {note}");
        if want == "a thread per row" {
            assert_eq!(count(&ptx, "shfl.sync"), 0, "{note}");
        }
    }
}

/// A sum of another input's exponentials over a walk of another length: nothing is
/// kept across walks of different lengths.
#[test]
fn walks_of_different_lengths_share_no_registers() {
    let (rows_n, len, other) = (4, 33, 20);
    let mut b = KernelBuilder::new(
        "other",
        vec![ty(DType::F32, &[rows_n, len]), ty(DType::F32, &[rows_n, other])],
        ty(DType::F32, &[rows_n, len]),
    );
    let o = b.out_index();
    let s = common::reduce_row(&mut b, 1, o[0], other, ReduceOp::Sum, |b, y| b.unary(UnaryOp::Exp, y));
    let x = b.load(0, vec![o[0], o[1]]);
    let e = b.unary(UnaryOp::Exp, x);
    let y = b.div(e, s);
    let k = b.finish(y).unwrap();
    let (_, note) = rows_kernel(&k);
    assert!(note.contains("0 values kept"), "{note}");
}

/// An op's inputs: each one's type, and its value where it is a constant.
type Operands = Vec<(TensorType, Option<kiln_ir::Tensor>)>;

fn ir_op(kind: kiln_ir::OpKind, attrs: &[(&str, kiln_ir::Attr)]) -> kiln_ir::Op {
    let mut a = kiln_ir::Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    kiln_ir::Op::parse(kind, &a).expect("op")
}

/// An axes operand: an i64 constant.
fn axes(a: &[i64]) -> (TensorType, Option<kiln_ir::Tensor>) {
    let t = kiln_ir::Tensor::from_i64(DType::I64, Shape::new(vec![a.len()]).unwrap(), a).unwrap();
    (t.ty().clone(), Some(t))
}

/// The kernels `kiln_lower::lower_op` writes for `op` over inputs of types `inputs`
/// (the `i64` ones, axes, given as values).
fn lowered(op: &kiln_ir::Op, inputs: &[(TensorType, Option<kiln_ir::Tensor>)]) -> Vec<Kernel> {
    use kiln_ir::infer::{infer, InferInput};
    use kiln_lower::{lower_op, OpCx, OpInput};
    let ninfer: Vec<Option<InferInput>> =
        inputs.iter().map(|(t, v)| Some(InferInput { ty: t, value: v.as_ref() })).collect();
    let outs = infer(op, &ninfer, 1).unwrap_or_else(|e| panic!("{}: {e}", op.kind));
    let opin: Vec<Option<OpInput>> = inputs.iter().map(|(t, v)| Some(OpInput { ty: t, value: v.as_ref() })).collect();
    let cx = OpCx { op, name: "k", inputs: &opin, outputs: &outs };
    let l = lower_op(&cx).unwrap_or_else(|e| panic!("{}: {e}", op.kind));
    l.steps.into_iter().map(|s| s.kernel).collect()
}

/// The real lowerings of every ONNX reduction (keeping the reduced axis, the last),
/// Softmax, LogSoftmax and LayerNormalization over rows of each length: every Rows
/// kernel among their steps takes the Rows emitter, with no spills.
#[test]
fn lowered_reductions_softmax_and_layernorm_take_the_rows_emitter() {
    use kiln_ir::{Attr, OpKind as K};
    let f = DType::F32;
    let mut taken = Vec::new();
    for len in LENGTHS {
        let x = (ty(f, &[3, len]), None);
        let x3 = (ty(f, &[2, 3, len]), None);
        let mut ops: Vec<(kiln_ir::Op, Operands)> = Vec::new();
        for kind in [
            K::ReduceL1,
            K::ReduceL2,
            K::ReduceLogSum,
            K::ReduceLogSumExp,
            K::ReduceMax,
            K::ReduceMean,
            K::ReduceMin,
            K::ReduceProd,
            K::ReduceSum,
            K::ReduceSumSquare,
        ] {
            ops.push((ir_op(kind, &[]), vec![x3.clone(), axes(&[-1])]));
        }
        ops.push((ir_op(K::Softmax, &[]), vec![x.clone()]));
        ops.push((ir_op(K::LogSoftmax, &[]), vec![x3.clone()]));
        ops.push((ir_op(K::LayerNormalization, &[]), vec![x.clone(), (ty(f, &[len]), None), (ty(f, &[len]), None)]));
        ops.push((ir_op(K::Softmax, &[("axis", Attr::Int(1))]), vec![x3.clone()]));
        for (op, inputs) in ops {
            for k in lowered(&op, &inputs) {
                if classify(&k) == KernelClass::Rows {
                    let (_, note) = rows_kernel(&k);
                    taken.push(format!("{} [{len}]: {note}", op.kind));
                }
            }
        }
    }
    for t in &taken {
        println!("{t}");
    }
    // Every op above has a Rows kernel at every length over one element (a sum or mean
    // over one element is a copy), but the Softmax over a middle axis (its values vary
    // along two axes: General, unless the last axis has one element).
    for len in LENGTHS.iter().filter(|&&l| l > 1) {
        for kind in [
            "ReduceL1 ",
            "ReduceL2 ",
            "ReduceLogSum ",
            "ReduceLogSumExp ",
            "ReduceMax ",
            "ReduceMean ",
            "ReduceMin ",
            "ReduceProd ",
            "ReduceSum ",
            "ReduceSumSquare ",
            "Softmax ",
            "LogSoftmax ",
            "LayerNormalization ",
        ] {
            let want = format!("{kind}[{len}]");
            assert!(taken.iter().any(|t| t.starts_with(&want)), "no Rows kernel for {want}:\n{}", taken.join("\n"));
        }
    }
}

/// Compiles General kernel `k` and checks that the Rows emitter's whole-output form
/// took it, assembled with no spill; its note.
fn general_kernel(k: &Kernel) -> String {
    assert_eq!(classify(k), KernelClass::General, "{}: class", k.name);
    let m = cuda::compile(&[(k, KernelClass::General)]).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let note = m.notes[0].clone();
    let usage = assemble_ptx_verbose("cuda-rows-general", &k.name, m.ptx())
        .unwrap_or_else(|e| panic!("{}: ptxas refused it:\n{e}", k.name));
    let u = usage[0].1;
    assert!(u.stack == 0 && u.spill_stores == 0 && u.spill_loads == 0, "{}: {note}: {u:?}", k.name);
    simulate(k, &m);
    note
}

/// Reductions of General kernels (over a middle axis, over channels, dropping the
/// reduced axis) take the Rows emitter with a row per output element: a thread per
/// element where elements are many and the loads coalesce across them, a warp or block
/// per element where they are few or the reduced axis is the contiguous one.
#[test]
fn reductions_of_general_kernels_take_a_group_per_output_element() {
    use kiln_ir::{Attr, OpKind as K};
    let f = DType::F32;
    let many = rows::ROWS_FOR_THREADS as usize;
    let cases: Vec<(kiln_ir::Op, Operands, &str)> = vec![
        // A sum over the tokens of [1, T, C]: few columns, a warp each.
        (
            ir_op(K::ReduceSum, &[("keepdims", Attr::Int(0))]),
            vec![(ty(f, &[1, 128, 256]), None), axes(&[1])],
            "a warp per output element",
        ),
        // Many columns: a thread each.
        (
            ir_op(K::ReduceMean, &[("keepdims", Attr::Int(0))]),
            vec![(ty(f, &[1, 33, many]), None), axes(&[1])],
            "a thread per output element",
        ),
        // The mean over the channels of NCHW, keeping the axis.
        (ir_op(K::ReduceMean, &[]), vec![(ty(f, &[2, 24, 112, 112]), None), axes(&[1])], "a thread per output element"),
        (
            ir_op(K::ReduceMax, &[]),
            vec![(ty(f, &[1, 1000, 3, 5]), None), axes(&[1])],
            "a block of 256 per output element",
        ),
        // The last axis dropped: contiguous, lanes along it.
        (
            ir_op(K::ReduceSum, &[("keepdims", Attr::Int(0))]),
            vec![(ty(f, &[3, 1000]), None), axes(&[-1])],
            "a block of 256 per output element",
        ),
        (
            ir_op(K::ReduceL2, &[("keepdims", Attr::Int(0))]),
            vec![(ty(f, &[many, 33]), None), axes(&[-1])],
            "a warp per output element",
        ),
        // Many elements, short reductions: a thread each, as the general mapping.
        (
            ir_op(K::ReduceSum, &[("keepdims", Attr::Int(0))]),
            vec![(ty(f, &[many, 9]), None), axes(&[-1])],
            "a thread per output element",
        ),
    ];
    for (op, inputs, want) in cases {
        let ks = lowered(&op, &inputs);
        let general: Vec<&Kernel> = ks.iter().filter(|k| classify(k) == KernelClass::General).collect();
        assert!(!general.is_empty(), "{}: no General kernel", op.kind);
        for k in general {
            let note = general_kernel(k);
            assert!(note.contains(want), "{} {:?}: {note}", op.kind, inputs[0].0.shape.dims());
        }
    }
    // A General kernel without a reduction keeps the general mapping and its note.
    let mut b =
        KernelBuilder::new("gather", vec![ty(DType::F32, &[16, 8]), ty(DType::I64, &[5])], ty(DType::F32, &[5, 8]));
    let o = b.out_index();
    let i = b.load(1, vec![o[0]]);
    let x = b.load_with(0, vec![i, o[1]], kiln_flow::Bounds::Clamp);
    let k = b.finish(x).unwrap();
    assert_eq!(classify(&k), KernelClass::General);
    let m = cuda::compile(&[(&k, KernelClass::General)]).expect("gather compiles");
    assert_eq!(m.notes[0], "general");
}
