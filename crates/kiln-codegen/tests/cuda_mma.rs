//! The tensor-core path of the CUDA Contraction emitter (`cuda::mma`): half operands
//! (f16 × f16, bf16 × bf16) on `mma.sync.m16n8k16`.
//!
//! No GPU runs here. What is checked:
//! - the index functions the PTX computes, on the host, against the PTX ISA's tables
//!   (written out from the ISA in `ptxsim::isa`): every lane's `ldmatrix` row
//!   addresses, through `ldmatrix`'s documented distribution, give each lane exactly
//!   the A and B fragment elements `mma.m16n8k16` expects; the shared swizzles are
//!   bijections that keep 16-byte chunks contiguous; each `ldmatrix` phase is free of
//!   bank conflicts; the warps' accumulators cover the block tile exactly once; the
//!   threads' copies cover each operand tile exactly once, and a `cp.async` chunk is
//!   wholly in or out of range (zero-filled);
//! - matrix products (plain, transposed, batched, broadcast, with epilogues) and
//!   convolutions (1×1, 3×3, strided, grouped) at f16 and bf16 with odd `M`, `N`, `K`
//!   take the path, and `ptxas -arch=sm_90a -v` assembles them with no stack frame and
//!   no spills; mixed operand types decline with a reason, to the f32 kernel.

mod common;
#[path = "common/half.rs"]
mod half;
mod ptxas;
use kiln_ptxsim as ptxsim;

use std::collections::HashSet;

use common::{compile_cuda, Conv};
use half::{conv, inputs_of, matmul};
use kiln_codegen::cuda::contraction::{Plan, Tile};
use kiln_codegen::cuda::mma;
use kiln_codegen::cuda::mma::{
    a_elem, b_elem, c_elem, feed, item, items, ldm_lane, ldmatrix, shared_bytes, smem_offset, warps, Feed, Layout,
    Shape, Side, WARPS,
};
use kiln_codegen::cuda::tune::Tune;
use kiln_codegen::cuda::{self, BLOCK};
use kiln_flow::class::{classify, KernelClass};
use kiln_flow::Kernel;
use kiln_ir::DType;
use ptxsim::isa;

#[test]
fn fragment_maps_are_the_isa_tables() {
    for lane in 0..32 {
        for i in 0..4 {
            for h in 0..2 {
                assert_eq!(a_elem(lane, i, h), isa::a(lane, 2 * i + h));
            }
            assert_eq!(c_elem(lane, i), isa::c(lane, i));
        }
        for q in 0..2 {
            for h in 0..2 {
                assert_eq!(b_elem(lane, q, h), isa::b(lane, 2 * q + h));
            }
        }
    }
}

/// The element `(r, k)` of a tile that element `c` of the 16-byte row lane `l`
/// addresses holds, for a fragment at `(r0, k0)`: KMajor rows run along `k`, RMajor
/// rows along `r`.
fn row_elem(side: Side, layout: Layout, (r0, k0): (u32, u32), l: u32, c: u32) -> (u32, u32) {
    let (dr, dk) = ldm_lane(side, layout, l);
    match layout {
        Layout::KMajor => (r0 + dr, k0 + dk + c),
        Layout::RMajor => (r0 + dr + c, k0 + dk),
    }
}

#[test]
fn ldmatrix_gives_each_lane_its_fragment() {
    for layout in [Layout::KMajor, Layout::RMajor] {
        let trans = layout == Layout::RMajor;
        for lane in 0..32 {
            for i in 0..4 {
                for h in 0..2 {
                    // A: register i is A register i.
                    let got = ldmatrix(trans, lane, i, h, |row, c| row_elem(Side::A, layout, (16, 32), row, c));
                    let (r, k) = a_elem(lane, i, h);
                    assert_eq!(got, (16 + r, 32 + k), "A {layout:?} lane {lane} reg {i}.{h}");
                    // B: registers 0, 1 are columns 0–7's fragment, 2, 3 columns 8–15's.
                    let got = ldmatrix(trans, lane, i, h, |row, c| row_elem(Side::B, layout, (32, 16), row, c));
                    let (k, n) = b_elem(lane, i % 2, h);
                    assert_eq!(got, (32 + 8 * (i / 2) + n, 16 + k), "B {layout:?} lane {lane} reg {i}.{h}");
                }
            }
        }
    }
}

#[test]
fn swizzles_are_bijections_keeping_chunks_whole() {
    for layout in [Layout::KMajor, Layout::RMajor] {
        for (rows, bk) in [(64, 32), (128, 32), (256, 32), (64, 64), (128, 64), (256, 64)] {
            let mut seen = HashSet::new();
            for r in 0..rows {
                for k in 0..bk {
                    let o = smem_offset(layout, rows, bk, r, k);
                    assert!(o.is_multiple_of(2) && o < rows * bk * 2, "{layout:?} {rows}: ({r}, {k}) at {o}");
                    assert!(seen.insert(o), "{layout:?} {rows}: ({r}, {k}) collides");
                    // Chunks stay contiguous: the element 8-aligned along the stored row,
                    // plus its place in the chunk.
                    let (first, c) = match layout {
                        Layout::KMajor => (smem_offset(layout, rows, bk, r, k - k % 8), k % 8),
                        Layout::RMajor => (smem_offset(layout, rows, bk, r - r % 8, k), r % 8),
                    };
                    assert_eq!(o, first + 2 * c);
                    assert_eq!(first % 16, 0);
                }
            }
        }
    }
}

/// Each 8-lane phase of every `ldmatrix` a warp issues reads 8 distinct 16-byte bank
/// groups (the 128-byte window of 32 banks holds 8).
#[test]
fn ldmatrix_is_free_of_bank_conflicts() {
    for layout in [Layout::KMajor, Layout::RMajor] {
        for (rows, bk) in [(64, 32), (128, 32), (256, 32), (64, 64), (128, 64), (256, 64)] {
            for side in [Side::A, Side::B] {
                for r0 in (0..rows).step_by(16) {
                    for k0 in (0..bk).step_by(16) {
                        for i in 0..4 {
                            let groups: HashSet<u32> = (8 * i..8 * i + 8)
                                .map(|l| {
                                    let (r, k) = row_elem(side, layout, (r0, k0), l, 0);
                                    (smem_offset(layout, rows, bk, r, k) / 16) % 8
                                })
                                .collect();
                            assert_eq!(groups.len(), 8, "{layout:?} {rows} {side:?} ({r0}, {k0}) matrix {i}");
                        }
                    }
                }
            }
        }
    }
}

/// The warps' accumulators (rows `wm·BM/2 + 16i + c_elem.row`, columns `wn·BN/4 + 8j +
/// c_elem.col`, as the emitter's epilogue computes them) cover the tile exactly once.
#[test]
fn accumulators_cover_the_tile_once() {
    let shapes = [(128, 128, BLOCK), (128, 64, BLOCK), (64, 128, BLOCK), (64, 64, BLOCK), (128, 256, BLOCK)];
    for (bm, bn, threads) in shapes.into_iter().chain([(256, 128, BLOCK), (128, 128, 128)]) {
        let ws = warps(Tile { tm: bm / 16, tn: bn / 16 }, threads);
        assert_eq!(ws.0 * ws.1, threads / 32);
        if bm.max(bn) == 256 || threads == 128 {
            assert_eq!((bm / ws.0, bn / ws.1), (64, 64));
        } else {
            assert_eq!(ws, WARPS);
        }
        let (wr, wc) = (bm / ws.0, bn / ws.1);
        let mut seen = vec![0u32; (bm * bn) as usize];
        for warp in 0..threads / 32 {
            let (wm, wn) = (warp / ws.1, warp % ws.1);
            for lane in 0..32 {
                for i in 0..wr / 16 {
                    for j in 0..wc / 8 {
                        for q in 0..4 {
                            let (r, c) = c_elem(lane, q);
                            let (r, c) = (wm * wr + 16 * i + r, wn * wc + 8 * j + c);
                            seen[(r * bn + c) as usize] += 1;
                        }
                    }
                }
            }
        }
        assert!(seen.iter().all(|&x| x == 1), "{bm}x{bn}");
        assert!(bm.max(bn) > 128 || shared_bytes(bm, bn, Shape::default()) <= 48 * 1024);
    }
}

/// Every element of an operand tile is copied exactly once, each chunk's 8 elements
/// along the stored row.
#[test]
fn copies_cover_each_tile_once() {
    for layout in [Layout::KMajor, Layout::RMajor] {
        for cp in [false, true] {
            let cases = [(64, 32), (128, 32), (256, 32), (64, 64), (128, 64), (256, 64)];
            // Four warps copy chunks only (the kernel takes them with cp.async only).
            let threads: &[u32] = if cp { &[BLOCK, 128] } else { &[BLOCK] };
            for ((rows, bk), &nt) in cases.into_iter().flat_map(|c| threads.iter().map(move |t| (c, t))) {
                let f = Feed { layout, cp };
                let mut seen = vec![0u32; (rows * bk) as usize];
                for tid in 0..nt {
                    for e in 0..items(f, rows, (bk, nt)) {
                        let (r, k) = item(f, rows, (bk, nt), tid, e);
                        let n = if cp { 8 } else { 1 };
                        for c in 0..n {
                            let (r, k) = match layout {
                                Layout::KMajor => (r, k + c),
                                Layout::RMajor => (r + c, k),
                            };
                            assert!(r < rows && k < bk, "{f:?} {rows}: ({r}, {k})");
                            seen[(r * bk + k) as usize] += 1;
                        }
                    }
                }
                assert!(seen.iter().all(|&x| x == 1), "{f:?} {rows}");
            }
        }
    }
}

fn suite(dt: DType) -> Vec<Kernel> {
    let mut ks = Vec::new();
    let odd = [1, 7, 33, 127, 1000];
    for (i, &m) in odd.iter().enumerate() {
        let k = odd[(i + 2) % odd.len()];
        let n = odd[(i + 4) % odd.len()];
        ks.push(matmul((dt, dt), &[], (false, false), (m, k, n), false, false, DType::F32));
        ks.push(matmul((dt, dt), &[], (false, false), (n, m, k), true, true, dt));
    }
    // Aligned: cp.async for both operands.
    ks.push(matmul((dt, dt), &[], (false, false), (128, 256, 512), false, true, dt));
    ks.push(matmul((dt, dt), &[2, 3], (true, true), (33, 64, 127), false, false, DType::F32));
    ks.push(matmul((dt, dt), &[4], (true, false), (127, 40, 64), false, true, dt));
    ks.push(matmul((dt, dt), &[5], (false, true), (7, 1000, 33), true, false, dt));
    ks.push(conv(dt, Conv::new(1, (32, 64), (56, 56), (1, 1), 1, 1, 1)));
    ks.push(conv(dt, Conv::new(2, (24, 40), (28, 28), (1, 1), 1, 1, 1)));
    ks.push(conv(dt, Conv::new(1, (320, 1280), (7, 7), (1, 1), 1, 1, 1)));
    ks.push(conv(dt, Conv::new(2, (3, 33), (17, 13), (3, 3), 1, 1, 1)));
    ks.push(conv(dt, Conv::new(1, (3, 32), (112, 112), (3, 3), 2, 1, 1)));
    ks.push(conv(dt, Conv::new(2, (8, 12), (9, 7), (3, 3), 1, 1, 4)));
    ks
}

/// The operands' feeds, as the emitter picks them.
fn feeds(k: &Kernel) -> (Feed, Feed) {
    let plan = Plan::of(k).expect("a plan");
    (feed(&plan, &plan.a, &plan.rows), feed(&plan, &plan.b, &plan.cols))
}

#[test]
fn feeds_follow_the_operand_strides() {
    let h = DType::F16;
    // A [M, K] along k, B [K, N] along n: both cp.async where aligned.
    let k = matmul((h, h), &[], (false, false), (128, 256, 512), false, false, h);
    assert_eq!(feeds(&k), (Feed { layout: Layout::KMajor, cp: true }, Feed { layout: Layout::RMajor, cp: true }));
    // A transposed: stored [K, M], read along m.
    let k = matmul((h, h), &[], (false, false), (128, 256, 512), true, false, h);
    assert_eq!(feeds(&k).0, Feed { layout: Layout::RMajor, cp: true });
    // Odd K or N: register-staged.
    let k = matmul((h, h), &[], (false, false), (128, 33, 127), false, false, h);
    assert_eq!(feeds(&k), (Feed { layout: Layout::KMajor, cp: false }, Feed { layout: Layout::RMajor, cp: false }));
    // A 1×1 convolution's image: rows and columns one run of 28·28 (a multiple of 8,
    // though 28 is not), channels 784 apart; 14·14 is no multiple of 8.
    let k = conv(h, Conv::new(1, (16, 32), (28, 28), (1, 1), 1, 1, 1));
    assert_eq!(feeds(&k), (Feed { layout: Layout::KMajor, cp: true }, Feed { layout: Layout::RMajor, cp: true }));
    let k = conv(h, Conv::new(1, (16, 32), (14, 14), (1, 1), 1, 1, 1));
    assert_eq!(feeds(&k).1, Feed { layout: Layout::RMajor, cp: false });
    // A 3×3 window's image: k is no single stride.
    let k = conv(h, Conv::new(1, (16, 32), (16, 16), (3, 3), 1, 1, 1));
    assert!(!feeds(&k).1.cp);
}

/// Every `cp.async` chunk of a tile at any block and step is wholly in or out of range
/// (`M`/`N` along rows, `K` along `k`), so the zero-fill of a chunk out of range drops
/// nothing in range; and a chunk in range is 8 consecutive elements from a multiple of
/// 8 (16 bytes, aligned) at the operand offsets the plan gives.
#[test]
fn cp_chunks_are_aligned_runs_wholly_in_or_out_of_range() {
    let h = DType::BF16;
    let kernels = [
        matmul((h, h), &[], (false, false), (128, 256, 512), false, false, h),
        matmul((h, h), &[], (false, false), (40, 24, 8), true, false, h),
        matmul((h, h), &[3], (true, false), (8, 8, 1000), false, false, h),
        conv(h, Conv::new(2, (24, 40), (28, 28), (1, 1), 1, 1, 1)),
    ];
    for kern in &kernels {
        let plan = Plan::of(kern).expect("plan");
        let [nb, m, n, kk] = plan.dims;
        let (fa, fb) = feeds(kern);
        for (f, total, side) in [(fa, m, Side::A), (fb, n, Side::B)] {
            assert!(f.cp, "{}: {f:?}", kern.name);
            let off = |bi: u64, r: u64, k: u64| match side {
                Side::A => plan.a_offset(bi, r, k),
                Side::B => plan.b_offset(bi, r, k),
            };
            let cases = [(64u32, 32u32, BLOCK), (128, 32, BLOCK), (256, 32, BLOCK), (64, 64, BLOCK), (128, 64, BLOCK)];
            for (rows, bk, nt) in cases.into_iter().chain([(256, 64, BLOCK), (128, 32, 128), (128, 64, 128)]) {
                for bi in 0..nb {
                    for first in (0..total).step_by(rows as usize) {
                        for k0 in (0..kk).step_by(bk as usize) {
                            for tid in 0..nt {
                                for e in 0..items(f, rows, (bk, nt)) {
                                    let (r, k) = item(f, rows, (bk, nt), tid, e);
                                    let at = |c: u64| match f.layout {
                                        Layout::KMajor => (first + u64::from(r), k0 + u64::from(k) + c),
                                        Layout::RMajor => (first + u64::from(r) + c, k0 + u64::from(k)),
                                    };
                                    let ins: Vec<bool> = (0..8).map(|c| at(c).0 < total && at(c).1 < kk).collect();
                                    assert!(ins.iter().all(|&x| x == ins[0]), "{} {f:?}", kern.name);
                                    if ins[0] {
                                        let o0 = off(bi, at(0).0, at(0).1);
                                        assert_eq!(o0 % 8, 0, "{} {f:?}", kern.name);
                                        for c in 1..8 {
                                            assert_eq!(off(bi, at(c).0, at(c).1), o0 + c as i64, "{} {f:?}", kern.name);
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn half_kernels_take_the_tensor_cores_and_assemble_without_spills() {
    let _ = ptxas::ptxas();
    for dt in [DType::F16, DType::BF16] {
        let kernels = suite(dt);
        let m = compile_cuda(&kernels, KernelClass::Contraction);
        for (k, (note, launch)) in kernels.iter().zip(m.notes.iter().zip(&m.launches)) {
            // Products of few rows take the lane-per-column kernel (`cuda::skinny`);
            // those whose operands both stream in 16-byte chunks Hopper's `wgmma`
            // (`cuda::wgmma`, tests/cuda_wgmma.rs), the others `mma.sync`.
            let plan = Plan::of(k).expect("plan");
            let few = plan.dims[1] <= kiln_codegen::cuda::skinny::MAX_ROWS;
            let wg = kiln_codegen::cuda::wgmma::plan(&plan).is_ok();
            let want = match (few, wg) {
                (true, _) => "contraction (few rows",
                (false, true) => "contraction wgmma m64n",
                (false, false) => "contraction mma.sync m16n8k16",
            };
            assert!(note.starts_with(want), "{}: {note}", k.name);
            if !few && !wg {
                assert!(note.contains("(wgmma declined: "), "{}: {note}", k.name);
                // The default pipeline: 4 stages where both operands take `cp.async`
                // (and 4 warps on a 128×128 tile), else 3 and eight warps.
                let sh = mma::shape(&plan, &Tune::default().mma);
                let cp = note.contains("A k-major cp.async") || note.contains("A row-major cp.async");
                let cp = cp && (note.contains("B k-major cp.async") || note.contains("B row-major cp.async"));
                assert_eq!(sh.stages, if cp { 4 } else { 3 }, "{}: {note}", k.name);
                assert!(note.contains(&format!("{} stages of 32 k", sh.stages)), "{}: {note}", k.name);
                assert_eq!(launch.block, sh.threads);
                assert!(sh.threads == BLOCK || cp, "{}: {note}", k.name);
            }
        }
        let ptx = m.ptx();
        for v in TUNES {
            let tune = mma_tune(v);
            let with_class: Vec<_> = kernels.iter().map(|k| (k, classify(k))).collect();
            let tuned = cuda::compile_tuned(&with_class, &tune).expect("compile");
            half::assemble_without_spills("cuda-mma", &format!("{}-{v}", dt.name()), tuned.ptx());
        }
        assert!(ptx.contains("ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
        assert!(ptx.contains("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"));
        assert!(ptx.contains("cp.async.cg.shared.global"));
        let res = half::assemble_without_spills("cuda-mma", dt.name(), ptx);
        assert_eq!(res.len(), kernels.len(), "one ptxas report per entry");
    }
}

/// A 4096³ bf16 product on `mma.sync` (`cuda::mma::emit`; the compiler takes
/// `cuda::wgmma` for it, tests/cuda_wgmma.rs). Both operands `cp.async`, 128×128
/// tiles, 1024 blocks; the default pipeline, 4 warps of 64×64, 4 stages of 32 and
/// paired stores, measured 323 µs (425 TFLOP/s) on an H100, where the pipeline before
/// it (8 warps of 64×32, 3 stages, single stores) took 411 µs (docs/cuda.md). (A
/// 256×128 tile with warps of 64×64 in dynamic shared memory was tried: one block of
/// 234 registers a thread per multiprocessor, and 461 µs against this kernel's 410 µs
/// on an H100.)
#[test]
fn a_4096_cubed_bf16_product() {
    let h = DType::BF16;
    let k = matmul((h, h), &[], (false, false), (4096, 4096, 4096), false, false, h);
    let e =
        mma::emit(&k, &Plan::of(&k).expect("plan"), &Tune::default().mma).expect("emit").expect("the mma.sync path");
    let ptx = format!("{}\n{}", cuda::ptx::HEADER, e.text);
    if let Ok(path) = std::env::var("KILN_DUMP_PTX") {
        std::fs::write(path, &ptx).expect("write the PTX");
    }
    let note = &e.note;
    assert!(
        note.contains("mma.sync")
            && note.contains("128x128")
            && note.contains("A k-major cp.async, B row-major cp.async"),
        "{note}"
    );
    assert_eq!(e.launch.grid, 32 * 32);
    assert_eq!(e.launch.block, 128, "{note}");
    assert!(note.contains("4 stages of 32 k, 4 warps, v2 stores"), "{note}");
    let res = half::assemble_without_spills("cuda-mma", "4096", &ptx);
    eprintln!("4096³ bf16: {:?}, {} bytes shared", res[0].1, shared_bytes(128, 128, Shape::default()));
    // Each variant of the knob: k step 64 (both operands cp.async), its resources.
    for v in TUNES {
        let tune = mma_tune(v);
        let m = cuda::compile_tuned(&[(&k, KernelClass::Contraction)], &tune).expect("compile");
        let res = half::assemble_without_spills("cuda-mma", &format!("4096-{v}"), m.ptx());
        let u = res[0].1;
        let sh = mma::shape(&Plan::of(&k).expect("plan"), &tune.mma);
        assert_eq!(sh.bk, tune.mma.bk, "{v}");
        eprintln!("4096³ bf16 {v:12}: {u:?}, {} bytes shared, {}", shared_bytes(128, 128, sh), m.notes[0]);
    }
}

/// Mixed operand types decline the tensor cores with a reason and take the f32 kernel,
/// which widens the half operand in its load.
#[test]
fn mixed_operands_take_the_f32_kernel() {
    let cases = [(DType::F32, DType::F16), (DType::F16, DType::BF16), (DType::BF16, DType::F32)];
    let kernels: Vec<Kernel> = cases
        .iter()
        .map(|&(a, b)| matmul((a, b), &[], (false, false), (33, 127, 7), false, true, DType::F32))
        .collect();
    let with_class: Vec<(&Kernel, KernelClass)> = kernels.iter().map(|k| (k, KernelClass::Contraction)).collect();
    let m = cuda::compile(&with_class).expect("compile");
    for (k, note) in kernels.iter().zip(&m.notes) {
        assert!(note.starts_with("contraction (") && note.contains("tensor cores declined:"), "{}: {note}", k.name);
    }
    ptxas::assemble_ptx("cuda-mma", "mixed", m.ptx()).unwrap_or_else(|e| panic!("ptxas: {e}"));
}

/// The emitted PTX run by the host simulator (`kiln-ptxsim`, which models `mma.sync`,
/// `ldmatrix` and `cp.async` from the PTX ISA independently of `cuda::mma`'s index
/// functions) against the kernel interpreter: every output element written, within
/// the f32 summation-order bound (`K · 4 · 2⁻²⁰` for these inputs: |products| ≤ 4,
/// partial sums ≤ 4K, each f32 rounding ≤ 2⁻²⁴ of it, the simulator sums exactly and
/// rounds once, the interpreter rounds each step) plus one rounding of the output type.
/// The pipeline is checked too: a read of a stage before the copies into it were waited
/// for and a barrier passed fails the run (a race), as does a copy out of range.
/// Covers split-K and the mixed kernels at the end (on the f32 kernel).
#[test]
fn simulated_half_kernels_match_the_interpreter() {
    let (h, b) = (DType::F16, DType::BF16);
    let mut kernels = vec![
        matmul((h, h), &[], (false, false), (7, 33, 1), false, false, DType::F32),
        matmul((b, b), &[], (false, false), (1, 7, 33), true, true, b),
        matmul((h, h), &[], (false, false), (130, 37, 70), false, true, h),
        matmul((b, b), &[], (false, false), (64, 64, 136), false, false, DType::F32),
        matmul((h, h), &[2], (true, true), (9, 17, 8), false, true, h),
        matmul((b, b), &[3], (false, true), (5, 18, 9), true, false, b),
    ];
    kernels.extend(convolutions());
    kernels.extend([
        matmul((h, h), &[], (false, false), (40, 300, 50), false, false, h),
        // Mixed: the f32 kernel, widening the half operand in its load.
        matmul((DType::F32, h), &[], (false, false), (33, 20, 7), false, true, DType::F32),
        matmul((b, DType::F32), &[], (false, false), (9, 40, 20), true, false, DType::F32),
    ]);
    for (seed, k) in (1..).zip(&kernels) {
        let m = cuda::compile(&[(k, classify(k))]).expect("compile");
        assert!(m.notes[0].starts_with("contraction "), "{}: {}", k.name, m.notes[0]);
        let l = &m.launches[0];
        simulate(k, m.ptx(), ptxsim::Grid::of(l.grid, l.block, l.shared), seed);
    }
}

/// The pipelines the measurement knob names (`KILN_CUDA_TUNE=mma=…`, what
/// `scripts/cuda-tune-sweep.sh` times), and the default.
const TUNES: [&str; 19] = [
    "",
    "mma=bk32s3",
    "mma=bk32s4t128x128w4v2",
    "mma=bk64s3",
    "mma=bk64s4",
    "mma=bk64s2",
    "mma=bk32s4",
    "mma=bk32s4b2",
    "mma=bk32s3b2",
    "mma=bk32s3t128x128",
    "mma=bk64s3t128x128",
    "mma=bk32s3t128x128w4",
    "mma=bk64s3t128x128w4",
    "mma=bk32s3t128x128v2",
    "mma=bk64s3t128x128w4v2",
    "mma=bk32s3t128x256",
    "mma=bk32s4t256x128",
    "mma=bk64s3t128x256",
    "mma=bk64s3t256x128",
];

/// Variant `v` of [`TUNES`] on `mma.sync` itself: with `wgmma=off`, so that the products
/// the warpgroup kernel would take (tests/cuda_wgmma.rs) run this kernel's pipeline.
fn mma_tune(v: &str) -> Tune {
    Tune::parse(&format!("{v},wgmma=off")).expect("variant")
}

/// Every pipeline of [`TUNES`] run by the simulator against the interpreter, as
/// [`simulated_half_kernels_match_the_interpreter`] does: `cp.async` operands with `K`
/// not a multiple of the step (a last step partly zero-filled), partial tiles,
/// batches, a 1×1 convolution, a split-K whose last ranks have nothing to sum, and a
/// register-staged product (which keeps 32 `k` a step); dynamic shared memory above
/// 48 KiB. The simulator fails a read of a stage before its copies were waited for.
#[test]
fn simulated_pipelines_match_the_interpreter() {
    let (h, b) = (DType::F16, DType::BF16);
    let kernels = [
        matmul((h, h), &[], (false, false), (130, 200, 72), false, true, h),
        matmul((b, b), &[2], (true, true), (24, 72, 40), false, false, DType::F32),
        matmul((h, h), &[], (false, false), (72, 96, 136), true, false, DType::F32),
        matmul((b, b), &[], (false, false), (40, 600, 48), false, false, b),
        matmul((h, h), &[], (false, false), (33, 70, 20), false, true, DType::F32),
        conv(b, Conv::new(1, (24, 40), (8, 8), (1, 1), 1, 1, 1)),
    ];
    for v in TUNES {
        let tune = mma_tune(v);
        for (seed, k) in (40..).zip(&kernels) {
            let m = cuda::compile_tuned(&[(k, classify(k))], &tune).expect("compile");
            assert!(m.notes[0].starts_with("contraction mma.sync"), "{v} {}: {}", k.name, m.notes[0]);
            let plan = Plan::of(k).expect("plan");
            let sh = mma::shape(&plan, &tune.mma);
            let l = &m.launches[0];
            assert_eq!(l.shared, cuda::dynamic_bytes(mma::block_shared(&mma::plan(&plan, sh), sh)), "{v}");
            assert_eq!(l.block, sh.threads, "{v}");
            eprintln!("{v} {}: {}", k.name, m.notes[0]);
            simulate(k, m.ptx(), ptxsim::Grid::of(l.grid, l.block, l.shared), seed);
        }
    }
}

/// The convolutions both the simulated and the modelled checks take: two images, a 4×4
/// window, stride 3, two groups; f16 and bf16 by turns.
fn convolutions() -> Vec<Kernel> {
    let (h, b) = (DType::F16, DType::BF16);
    vec![
        conv(h, Conv::new(2, (5, 7), (3, 4), (1, 1), 1, 1, 1)),
        conv(b, Conv::new(1, (16, 24), (4, 4), (1, 1), 1, 1, 1)),
        conv(h, Conv::new(1, (5, 7), (6, 5), (3, 3), 1, 1, 1)),
        conv(b, Conv::new(1, (6, 8), (5, 4), (3, 3), 1, 1, 2)),
    ]
}

/// Runs `k`'s entry of `ptx` in the host simulator over `launch` on the inputs of `seed`
/// (`half::inputs_of`) and compares every output element with the kernel interpreter within
/// the f32 summation-order bound plus one rounding of the output type (see
/// [`simulated_half_kernels_match_the_interpreter`]). The output starts as NaN bit
/// patterns: an element never written shows.
fn simulate(k: &Kernel, ptx: &str, launch: ptxsim::Grid, seed: u64) {
    let (got, want) = half::simulated(k, ptx, launch, seed);
    let kk = Plan::of(k).expect("plan").dims[3] as f64;
    let ulp = match k.output.dtype {
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => 2f64.powi(-22),
    };
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = kk * 4.0 * 2f64.powi(-20) + w.abs() * ulp;
        assert!((g - w).abs() <= tol, "{}: element {i}: {g} against {w}", k.name);
    }
}

/// The tensor-core kernel's data flow, modelled on the host from the same index
/// functions the PTX computes, each instruction as the PTX ISA defines it: per block
/// and step, the copies ([`item`], zero out of range) into a stage laid out by
/// [`smem_offset`]; per warp, lane and `k16`, `ldmatrix.x4` at the lane's address
/// ([`ldm_lane`]) reading 8 consecutive halves there, as [`ldmatrix`] distributes
/// them; `mma` as the product of the A and B tiles the lanes' registers hold (by the ISA
/// tables, each element held exactly once), added to the accumulator each lane holds
/// ([`c_elem`]); the store at the epilogue's row and column. Returns the output by
/// flat offset (NaN where never written).
fn model(k: &Kernel, ins: &[kiln_ir::Tensor], tune: &Tune) -> Vec<f64> {
    let plan0 = Plan::of(k).expect("plan");
    let sh = mma::shape(&plan0, &tune.mma);
    let bk = sh.bk;
    let plan = mma::plan(&plan0, sh);
    let [nb, m, n, kk] = plan.dims;
    let (bm, bn) = (plan.tile.bm(), plan.tile.bn());
    let nt = sh.threads;
    let ws = warps(plan.tile, nt);
    let (wr, wc) = (bm / ws.0, bn / ws.1);
    let (mi, ni) = (wr / 16, wc / 8);
    let fa = feed(&plan, &plan.a, &plan.rows);
    let fb = feed(&plan, &plan.b, &plan.cols);
    let av = ins[plan.a.input].to_f64_vec();
    let bv = ins[plan.b.input].to_f64_vec();
    let mut out = vec![f64::NAN; k.output.shape.numel()];
    for tile in 0..plan.tile.blocks(nb, m, n) {
        let (bi, m0, n0) = plan.block(tile);
        // acc[warp][lane][i][j][q], summed over the ranks of a split in rank order.
        let mut acc = vec![0f64; (nt * mi * ni * 4) as usize];
        for rank in 0..u64::from(plan.split) {
            let k_end = ((rank + 1) * plan.k_chunk).min(kk);
            for k0 in (rank * plan.k_chunk..(rank + 1) * plan.k_chunk).step_by(bk as usize) {
                let fill = |f: Feed, rows: u32, first: u64, total: u64, side: Side| {
                    let mut st = vec![f64::NAN; (rows * bk) as usize];
                    for tid in 0..nt {
                        for e in 0..items(f, rows, (bk, nt)) {
                            let (r, q) = item(f, rows, (bk, nt), tid, e);
                            for c in 0..if f.cp { 8 } else { 1 } {
                                let (r, q) = if f.layout == Layout::KMajor { (r, q + c) } else { (r + c, q) };
                                let (gr, gk) = (first + u64::from(r), k0 + u64::from(q));
                                let v = if gr < total && gk < k_end {
                                    match side {
                                        Side::A => av[plan.a_offset(bi, gr, gk) as usize],
                                        Side::B => bv[plan.b_offset(bi, gr, gk) as usize],
                                    }
                                } else {
                                    0.0
                                };
                                st[(smem_offset(f.layout, rows, bk, r, q) / 2) as usize] = v;
                            }
                        }
                    }
                    st
                };
                let sa = fill(fa, bm, m0, m, Side::A);
                let sb = fill(fb, bn, n0, n, Side::B);
                // ldmatrix.x4 of a warp at fragment origin (r0, q0): regs[lane][i][h].
                let ldm = |st: &[f64], f: Feed, rows: u32, side: Side, (r0, q0): (u32, u32)| {
                    let addr = |l: u32| {
                        let (dr, dk) = ldm_lane(side, f.layout, l);
                        smem_offset(f.layout, rows, bk, r0 + dr, q0 + dk) / 2
                    };
                    let mut regs = vec![[[0f64; 2]; 4]; 32];
                    for (lane, reg) in regs.iter_mut().enumerate() {
                        for (i, pair) in reg.iter_mut().enumerate() {
                            for (h, x) in pair.iter_mut().enumerate() {
                                let trans = f.layout == Layout::RMajor;
                                *x = ldmatrix(trans, lane as u32, i as u32, h as u32, |row, c| {
                                    st[(addr(row) + c) as usize]
                                });
                            }
                        }
                    }
                    regs
                };
                for warp in 0..nt / 32 {
                    let (wm, wn) = (warp / ws.1, warp % ws.1);
                    for q16 in (0..bk).step_by(16) {
                        let af: Vec<_> = (0..mi).map(|i| ldm(&sa, fa, bm, Side::A, (wm * wr + 16 * i, q16))).collect();
                        let bf: Vec<_> =
                            (0..ni / 2).map(|j| ldm(&sb, fb, bn, Side::B, (wn * wc + 16 * j, q16))).collect();
                        for i in 0..mi {
                            let a: [[f64; 16]; 16] = fragment_tile(4, a_elem, |lane, r, h| {
                                af[i as usize][lane as usize][r as usize][h as usize]
                            });
                            for j in 0..ni {
                                let b: [[f64; 8]; 16] = fragment_tile(2, b_elem, |lane, q, h| {
                                    bf[(j / 2) as usize][lane as usize][(2 * (j % 2) + q) as usize][h as usize]
                                });
                                for lane in 0..32 {
                                    for q in 0..4 {
                                        let (x, y) = c_elem(lane, q);
                                        let d: f64 = (0..16).map(|z| a[x as usize][z] * b[z][y as usize]).sum();
                                        let at = (((warp * 32 + lane) * mi + i) * ni + j) * 4 + q;
                                        acc[at as usize] += d;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for warp in 0..nt / 32 {
            let (wm, wn) = (warp / ws.1, warp % ws.1);
            for lane in 0..32 {
                for i in 0..mi {
                    for j in 0..ni {
                        for q in 0..4 {
                            let (x, y) = c_elem(lane, q);
                            let row = m0 + u64::from(wm * wr + 16 * i + x);
                            let col = n0 + u64::from(wn * wc + 8 * j + y);
                            if row < m && col < n {
                                let o = plan.out_offset(bi, row, col) as usize;
                                assert!(out[o].is_nan(), "{}: ({bi}, {row}, {col}) stored twice", k.name);
                                out[o] = acc[((((warp * 32 + lane) * mi + i) * ni + j) * 4 + q) as usize];
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// The `R × C` tile a warp's fragment registers hold: register `r` (of `regs`) of lane
/// `lane` holds two halves, half `h` being element `elem(lane, r, h)` of the tile with
/// the value `value(lane, r, h)`. Each element must be held exactly once.
fn fragment_tile<const R: usize, const C: usize>(
    regs: u32,
    elem: impl Fn(u32, u32, u32) -> (u32, u32),
    value: impl Fn(u32, u32, u32) -> f64,
) -> [[f64; C]; R] {
    let mut t = [[f64::NAN; C]; R];
    for lane in 0..32 {
        for r in 0..regs {
            for h in 0..2 {
                let (x, y) = elem(lane, r, h);
                assert!(t[x as usize][y as usize].is_nan(), "element ({x}, {y}) held twice");
                t[x as usize][y as usize] = value(lane, r, h);
            }
        }
    }
    t
}

/// The modelled data flow ([`model`]) computes every output element of products and
/// convolutions at odd sizes (register-staged and `cp.async` operands, both layouts,
/// every tile shape) within the f32 summation-order bound of the interpreter's sums
/// (and a half output's rounding).
#[test]
fn modelled_kernels_match_the_interpreter() {
    let (h, b, f) = (DType::F16, DType::BF16, DType::F32);
    let mut kernels = vec![
        matmul((h, h), &[], (false, false), (7, 33, 1), false, false, f),
        matmul((b, b), &[], (false, false), (1, 7, 33), true, false, f),
        matmul((h, h), &[], (false, false), (130, 37, 70), false, false, f),
        matmul((b, b), &[], (false, false), (200, 64, 136), false, false, f),
        matmul((h, h), &[], (false, false), (72, 48, 300), true, false, f),
        matmul((h, h), &[2], (true, true), (9, 17, 8), false, false, f),
        matmul((b, b), &[3], (false, true), (5, 18, 9), true, false, f),
        matmul((h, h), &[2], (true, false), (40, 80, 16), false, false, f),
    ];
    kernels.extend(convolutions());
    kernels.extend([
        // Split-K over clusters of 4 and 8.
        matmul((h, h), &[], (false, false), (40, 300, 50), false, false, f),
        matmul((b, b), &[], (false, false), (9, 600, 72), false, false, f),
        conv(h, Conv::new(1, (256, 20), (7, 7), (1, 1), 1, 1, 1)),
    ]);
    let mut seen = HashSet::new();
    let mut splits = HashSet::new();
    let mut shapes = HashSet::new();
    let tunes: Vec<Tune> = TUNES.iter().map(|v| mma_tune(v)).collect();
    for ((seed, k), tune) in kernels.iter().enumerate().flat_map(|sk| tunes.iter().map(move |t| (sk, t))) {
        let plan0 = Plan::of(k).expect("plan");
        let plan = mma::plan(&plan0, mma::shape(&plan0, &tune.mma));
        splits.insert(plan.split);
        shapes.insert(mma::shape(&plan0, &tune.mma));
        let (fa, fb) = feeds(k);
        seen.insert((fa, fb));
        let ins = inputs_of(k, seed as u64 + 1);
        let refs: Vec<&kiln_ir::Tensor> = ins.iter().collect();
        let want = kiln_flow::interp::run(k, &refs).expect("interpreter").to_f64_vec();
        let got = model(k, &ins, tune);
        // The convolutions add a bias the model leaves out: compare sums only.
        let bias: Vec<f64> = if k.inputs.len() > 2 { ins[2].to_f64_vec() } else { vec![] };
        let kk = plan.dims[3] as f64;
        // A half output rounds the interpreter's value once more.
        let ulp = match k.output.dtype {
            DType::F16 => 2f64.powi(-11),
            DType::BF16 => 2f64.powi(-8),
            _ => 0.0,
        };
        for (o, (g, w)) in got.iter().zip(&want).enumerate() {
            let stored = w.abs() * ulp;
            let w = if bias.is_empty() {
                *w
            } else {
                // NCHW (or N, G, C/G, H, W): the output channel of offset `o`.
                let dims = k.output.shape.dims();
                let sp = dims[dims.len() - 2] * dims[dims.len() - 1];
                let ch = if dims.len() == 5 { (o / sp) % (dims[1] * dims[2]) } else { (o / sp) % dims[1] };
                w - bias[ch]
            };
            let tol = kk * 4.0 * 2f64.powi(-20) + w.abs() * 2f64.powi(-21) + stored;
            assert!((g - w).abs() <= tol, "{}: element {o}: {g} against {w}", k.name);
        }
    }
    assert!(seen.len() >= 4, "feeds covered: {seen:?}");
    assert!(shapes.iter().any(|s| s.bk == 64), "a k step of 64 modelled: {shapes:?}");
    assert!(splits.len() >= 3, "splits covered: {splits:?}");
}
