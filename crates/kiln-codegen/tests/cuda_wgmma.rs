//! The Hopper path of the CUDA Contraction emitter (`cuda::wgmma`): half operands on
//! `wgmma.mma_async.m64nNk16` from shared memory through matrix descriptors.
//!
//! No GPU runs here. What is checked:
//! - the index functions the PTX computes against the PTX ISA's tables (`ptxsim::isa`):
//!   the accumulator fragment, where the copies store each element against where a
//!   `wgmma` reading through the emitter's descriptors finds it (canonical 128-byte
//!   swizzle layouts), the copies covering each tile once;
//! - products (odd `M`, `N`, `K`, batched, broadcast, transposed A, epilogues, f16 and
//!   bf16 outputs and f32) and 1×1 convolutions as implicit GEMM, with every tile the
//!   path takes, run by the host simulator (whose `wgmma` is written from the ISA, and
//!   which fails a run on a race of the pipeline) bit for bit against the kernel
//!   interpreter (inputs whose sums are exact in f32 in any order);
//! - the compiler routes them here, and `ptxas -arch=sm_90a -v` assembles every tile
//!   with no stack and no spills, the 4096³ bf16 product included.

mod common;
#[path = "common/half.rs"]
mod half;
mod ptxas;
use kiln_ptxsim as ptxsim;

use common::Conv;
use half::{conv, matmul};
use kiln_codegen::cuda;
use kiln_codegen::cuda::contraction::{Plan, Tile};
use kiln_codegen::cuda::wgmma::{self, shared_bytes};
use kiln_flow::class::KernelClass;
use kiln_flow::Kernel;
use kiln_ir::DType;

/// A 4096³ bf16 product: the kernel the ≥ 600 TFLOP/s target is measured on (the lead
/// runs it on the GPU): 128×256 tiles, 512 blocks, both operands cp.async.
#[test]
fn a_4096_cubed_bf16_product() {
    let h = DType::BF16;
    let k = matmul((h, h), &[], (false, false), (4096, 4096, 4096), false, false, h);
    let m = cuda::compile(&[(&k, KernelClass::Contraction)]).expect("compile");
    if let Ok(path) = std::env::var("KILN_DUMP_PTX") {
        std::fs::write(path, m.ptx()).expect("write the PTX");
    }
    let note = &m.notes[0];
    assert!(note.starts_with("contraction wgmma m64n256k16 bf16 (128x256 tile"), "{note}");
    assert!(note.contains("A k-major, B mn-major"), "{note}");
    assert_eq!(m.launches[0].grid, 32 * 16);
    assert_eq!((m.launches[0].block, m.launches[0].shared), (256, shared_bytes(128, 256)));
    let res = half::assemble_without_spills("cuda-wgmma", "4096", m.ptx());
    eprintln!("4096³ bf16: {:?}, {} bytes shared", res[0].1, shared_bytes(128, 256));
}

/// Runs `k`'s entry of `ptx` in the host simulator over `launch` on the inputs of `seed`
/// (`half::inputs_of`) and compares every output element with the kernel interpreter's,
/// bit for bit. The inputs make that the right check: each is a multiple of 2⁻⁶ in
/// [-2, 2), so each product is an exact multiple of 2⁻¹² of magnitude at most 4, and
/// every partial sum of at most `K` = 1024 of them is a multiple of 2⁻¹² below 2¹², which
/// f32's 24 bits hold exactly: the sum is exact in f32 in any order (the simulator adds
/// each `wgmma`'s 16 products to the accumulator and rounds once, the interpreter adds
/// one at a time), and the epilogue then computes the same f32 operations on the same
/// value. (For arbitrary inputs the two differ by f32 summation order only: at most
/// `2·K·2⁻²⁴·Σ|aᵢ·bᵢ|`, each of at most `K` roundings on either side erring by at most
/// half an ulp of a partial sum bounded by `Σ|aᵢ·bᵢ|`.) The output starts as NaN bit
/// patterns: an element never written shows.
fn simulate(k: &Kernel, ptx: &str, launch: ptxsim::Grid, seed: u64) {
    let (got, want) = half::simulated(k, ptx, launch, seed);
    assert!(Plan::of(k).expect("plan").dims[3] <= 1024, "{}: K beyond the exact range of the inputs", k.name);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(g.to_bits() == w.to_bits(), "{}: element {i}: {g} against {w}", k.name);
    }
}

/// Kernels whose operands both stream in 16-byte chunks, with `M`, `N`, `K` not
/// multiples of the tiles (`K` from 8 to 1000: one step to 16) (K a multiple of 8 and the contiguous extents multiples of 8:
/// the chunk conditions), batched, transposed A (MN-major A), 1×1 convolutions as
/// implicit GEMM; f16 and bf16 by turns.
fn wgmma_kernels() -> Vec<Kernel> {
    let (h, b) = (DType::F16, DType::BF16);
    vec![
        matmul((h, h), &[], (false, false), (130, 72, 200), false, false, DType::F32),
        matmul((b, b), &[], (false, false), (33, 136, 24), false, true, b),
        matmul((h, h), &[], (false, false), (72, 8, 40), true, true, h),
        matmul((b, b), &[2], (true, true), (40, 200, 16), true, false, DType::F32),
        matmul((h, h), &[3], (false, true), (17, 64, 48), false, true, h),
        // K over 4 steps of 64: the unrolled loop's back edge, the stage ring wrapping.
        matmul((b, b), &[], (false, false), (70, 520, 72), false, true, b),
        matmul((h, h), &[], (false, false), (72, 1000, 136), true, false, DType::F32),
        conv(b, Conv::new(2, (16, 24), (4, 4), (1, 1), 1, 1, 1)),
        conv(h, Conv::new(1, (40, 20), (6, 4), (1, 1), 1, 1, 1)),
    ]
}

/// The emitted PTX (each kernel with the tiles the path takes: 64 or 128 rows by 64 or
/// 128 columns, and 128 × 256) run by the host simulator, whose `wgmma` is written from the PTX
/// ISA (descriptors, swizzle, fragment) independently of `cuda::wgmma`, against the
/// kernel interpreter. The pipeline is checked too: reading a stage before its copies
/// were waited for, fenced for the async proxy and a barrier passed, or copying into a
/// stage a `wgmma` not yet waited for reads, fails the run.
#[test]
fn simulated_wgmma_kernels_match_the_interpreter() {
    let tiles = [(4, 4), (8, 8), (8, 16), (4, 8), (8, 4)];
    for (seed, k) in (1..).zip(wgmma_kernels()) {
        let plan = Plan::of(&k).expect("plan");
        for (j, &(tm, tn)) in tiles.iter().enumerate() {
            if (seed + j) % 2 == 1 && j > 1 {
                continue;
            }
            let e = wgmma::emit_with(&k, &plan, Tile { tm, tn })
                .expect("emit")
                .unwrap_or_else(|w| panic!("{}: {w}", k.name));
            let ptx = format!("{}\n{}", cuda::ptx::HEADER, e.text);
            let l = e.launch;
            eprintln!("{}: {}", k.name, e.note);
            simulate(&k, &ptx, ptxsim::Grid::of(l.grid, l.block, l.shared), seed as u64);
        }
    }
}

/// The emitter's index functions against the PTX ISA's tables (`ptxsim::isa`): each
/// thread's accumulator is the ISA's D fragment element; where the copies store
/// element `(r, k)` of a stage is where a `wgmma` reading through the emitter's
/// descriptor (its start offset, leading and stride byte offsets) finds it by the ISA's
/// canonical 128-byte swizzle layouts, for every warpgroup's rows of A, every column of
/// a B of up to 256 and every `k16` sub-step; the layouts are bijections onto the
/// stage; the threads' chunks cover each tile exactly once.
#[test]
fn index_functions_are_the_isa_tables() {
    use kiln_codegen::cuda::mma::Layout;
    use ptxsim::isa;
    for x in 0..128 {
        for i in 0..128 {
            assert_eq!(wgmma::acc_elem(x, i), isa::wgmma_d(x, i), "thread {x} d{i}");
        }
    }
    for layout in [Layout::KMajor, Layout::RMajor] {
        let d = wgmma::descriptor(layout, 0);
        let (lbo, sbo) = ((((d >> 16) & 0x3FFF) << 4) as u32, (((d >> 32) & 0x3FFF) << 4) as u32);
        assert_eq!(d >> 62, 1, "128-byte swizzle");
        for rows in [64, 128, 256] {
            let mut seen = std::collections::HashSet::new();
            for r in 0..rows {
                for k in 0..wgmma::BK {
                    let o = wgmma::smem_offset(layout, r, k);
                    assert!(o < rows * wgmma::BK * 2 && seen.insert(o), "{layout:?}: ({r}, {k}) at {o}");
                    // The descriptor of the 64 rows holding r (A) or of all rows (B).
                    for r0 in [r - r % 64, 0] {
                        let (mn, j, kk) = (r - r0, k / 16, k % 16);
                        let unswizzled = match layout {
                            Layout::KMajor => isa::sw128_k_major(mn, kk, sbo),
                            Layout::RMajor => isa::sw128_mn_major(mn, kk, lbo, sbo),
                        };
                        let at = isa::swizzle128(wgmma::start_offset(layout, r0, j) + unswizzled);
                        assert_eq!(at, o, "{layout:?}: ({r}, {k}) from rows {r0}");
                    }
                }
            }
            // Copies: each chunk once, 8 elements contiguous along the stored row.
            for threads in [128, 256] {
                let mut chunks = std::collections::HashSet::new();
                for tid in 0..threads {
                    let f = cuda::mma::Feed { layout, cp: true };
                    for e in 0..cuda::feed::items(f, rows, (wgmma::BK, threads)) {
                        let (r, k) = cuda::feed::item(f, rows, (wgmma::BK, threads), tid, e);
                        assert!(r < rows && k < wgmma::BK && chunks.insert((r, k)), "{layout:?} {rows}: ({r}, {k})");
                        for c in 0..8 {
                            let (rr, kk) = if layout == Layout::KMajor { (r, k + c) } else { (r + c, k) };
                            let o = wgmma::smem_offset(layout, rr, kk);
                            assert_eq!(o, wgmma::smem_offset(layout, r, k) + 2 * c, "{layout:?}: chunk ({r}, {k})");
                        }
                    }
                }
                assert_eq!(chunks.len() as u32, rows * wgmma::BK / 8);
            }
        }
    }
}

/// The compiler routes the kernels whose operands both stream in chunks to `wgmma`
/// (`cuda::compile`'s note), and every tile of the path assembles with `ptxas
/// -arch=sm_90a -v` with no stack frame and no spills.
#[test]
fn wgmma_kernels_take_the_path_and_assemble_without_spills() {
    let kernels = wgmma_kernels();
    let with_class: Vec<(&Kernel, KernelClass)> = kernels.iter().map(|k| (k, KernelClass::Contraction)).collect();
    let m = cuda::compile(&with_class).expect("compile");
    for (k, (note, l)) in kernels.iter().zip(m.notes.iter().zip(&m.launches)) {
        match wgmma::plan(&Plan::of(k).expect("plan")) {
            Ok((plan, _, _)) => {
                assert!(note.starts_with("contraction wgmma m64n"), "{}: {note}", k.name);
                assert_eq!((l.block, l.shared), (2 * plan.tile.bm(), shared_bytes(plan.tile.bm(), plan.tile.bn())));
            }
            // Few tiles and a long K: split-K clusters on `mma.sync`.
            Err(why) => {
                assert_eq!(why, "a split of K");
                assert!(note.contains("split-K") && note.ends_with("(wgmma declined: a split of K)"), "{note}");
            }
        }
    }
    // Each thread's two consecutive columns stored together (every output here has an
    // even innermost extent).
    assert!(m.ptx().contains("st.global.v2.f32") && m.ptx().contains("st.global.b32"));
    for (tm, tn) in [(4, 4), (4, 8), (8, 4), (8, 8), (8, 16)] {
        let mut ptx = cuda::ptx::HEADER.to_string();
        for k in &kernels {
            let plan = Plan::of(k).expect("plan");
            let e = wgmma::emit_with(k, &plan, Tile { tm, tn }).expect("emit").expect("the wgmma path");
            ptx = format!("{ptx}\n{}", e.text);
        }
        let tag = format!("{tm}x{tn}");
        let res = half::assemble_without_spills("cuda-wgmma", &tag, &ptx);
        assert_eq!(res.len(), kernels.len(), "one ptxas report per entry");
    }
}

/// One module of several `wgmma` kernels (each declaring its dynamic shared memory at
/// module scope, where PTX makes them alias): each entry simulated from the whole
/// module's text against the interpreter, as the model suites run them.
#[test]
fn a_module_of_wgmma_kernels_simulates_entry_by_entry() {
    let kernels = wgmma_kernels();
    let with_class: Vec<(&Kernel, KernelClass)> = kernels.iter().map(|k| (k, KernelClass::Contraction)).collect();
    let m = cuda::compile(&with_class).expect("compile");
    assert!(m.ptx().matches(".extern .shared").count() >= 2, "several dynamic arrays");
    for (seed, (k, l)) in (1..).zip(kernels.iter().zip(&m.launches)) {
        simulate(k, m.ptx(), ptxsim::Grid::of(l.grid, l.block, l.shared), seed);
    }
}
