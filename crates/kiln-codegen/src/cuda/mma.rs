//! Contractions of half operands (both f16 or both bf16) on the tensor cores:
//! `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`, fed by `ldmatrix` from a
//! multistage shared-memory ring filled with `cp.async`.
//!
//! The kernel computes what the f32 kernel ([`super::contraction`]) computes: each
//! product of two half operands is exact in f32 and the sum is accumulated in f32; only
//! the summation order differs (the tensor core adds 16 products at a time). The
//! mapping is [`Plan`]'s, unchanged: row, column and batch variables, `M`, `N`, `K`,
//! the operands' affine offsets (implicit GEMM for convolutions), the block of each
//! output tile ([`Plan::block`]) and the epilogue through [`super::expr`]
//! (`contraction::epilogue`). This module only replaces the main loop.
//!
//! # The block
//!
//! A block of 256 threads (8 warps) computes a `BM × BN` tile, `BM, BN ∈ {64, 128}`
//! ([`super::contraction::choose_tile`]). Warp `w` computes rows `(w / 4)·BM/2 ..` and
//! columns `(w % 4)·BN/4 ..` of it: `MI × NI` fragments of 16 × 8 (`MI = BM/32`, `NI =
//! BN/32`), `4·MI·NI` f32 accumulators per thread (64 for 128×128). The reduction walks
//! `K` in steps of [`BK`] = 32 (two `k16` sub-steps).
//!
//! # Fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", f16/bf16)
//!
//! With `g = lane / 4` and `t = lane % 4` ([`a_elem`], [`b_elem`], [`c_elem`]):
//! - A (16 × 16, row-major), four `.b32` registers of two halves each: register `i`,
//!   half `h` holds `(row g + 8·(i % 2), k 2t + h + 8·(i / 2))`;
//! - B (16 × 8, "col"), two registers: register `q`, half `h` holds `(k 2t + h + 8q,
//!   column g)`;
//! - C/D (16 × 8 f32), four registers: `c_i` is `(row g + 8·(i / 2), column 2t + i % 2)`.
//!
//! # Shared memory
//!
//! [`STAGES`] = 3 stages, each an A tile of `BM × 32` and a B tile of `BN × 32` halves
//! (48 KiB for 128×128: the static limit). Each operand tile is stored in one of two
//! [`Layout`]s, chosen per operand by which of its strides is the smaller in global
//! memory (as the f32 kernel's load [`super::contraction::Order`]):
//! - [`Layout::KMajor`]: row `r` holds its 32 `k` (64 bytes, 4 chunks of 16 bytes);
//!   chunk `c` of row `r` is stored at chunk `c ⊕ ((r / 2) mod 4)`;
//! - [`Layout::RMajor`]: row `k` holds the tile's `R` rows (`2R` bytes, `R/8` chunks);
//!   chunk `c` of row `k` is stored at chunk `c ⊕ (k mod 8)`.
//!
//! ([`smem_offset`].) Both swizzles permute whole 16-byte chunks within a row, so every
//! chunk stays contiguous. Fragments come from `ldmatrix.x4` (four 8×8 matrices, the
//! 8 row addresses of matrix `i` from lanes `8i..8i+8`, [`ldm_lane`]): non-transposed
//! from a KMajor tile, `.trans` from an RMajor one. The 8 rows of one matrix fall in 8
//! distinct 16-byte bank groups under either swizzle (KMajor: 8 consecutive `r` at one
//! chunk; RMajor: 8 consecutive `k` at one chunk), so the loads are conflict-free.
//!
//! # Filling the stages
//!
//! (The copies are [`super::feed`]'s, which [`super::wgmma`] shares; this module gives
//! it the layout, the `k` step, the threads and where compact addressing applies.)
//! An operand is copied with `cp.async.cg.shared.global` 16-byte chunks ([`Feed::cp`])
//! where each chunk is 8 consecutive elements of global memory, 16-byte aligned, and
//! wholly in or out of range: KMajor with `k` one stride-1 run and `K` a multiple of 8,
//! or RMajor with the innermost tile variables one stride-1 run (an image's rows and
//! columns) whose length is a multiple of 8; the constant, every other coefficient
//! (and the `k` step) multiples of 8 (bindings are 64-byte aligned). A chunk out of range is zero-filled (`src-size` 0, from the
//! operand's base address). Every other operand is register-staged, like the f32
//! kernel: each thread loads its elements (`ld.global.b16`, predicated, 0 out of range)
//! and stores them to shared memory after the step's math.
//!
//! The pipeline, `T = ⌈K / 32⌉`, stage `s mod 3` holding step `s`:
//! ```text
//! issue steps 0, 1 → stages 0, 1 (each its own commit group)
//! for t in 0..T:
//!     cp.async.wait_group 1; bar.sync  (step t's copies landed; all threads are done
//!                                       with step t-1, so its stage is free)
//!     issue step t+2 → stage (t+2) mod 3: cp.async, or loads into registers; commit
//!     2 × (ldmatrix A, B; MI·NI mma) on stage t mod 3
//!     register-staged values → stage (t+2) mod 3
//! cp.async.wait_all; epilogue
//! ```
//! Stage `(t+2) mod 3` was last read in step `t-1`, which every thread finished before
//! the barrier of step `t`; it is read again in step `t+2`, after two more barriers. A
//! step past `K` issues only zero-filled chunks and predicated-off loads. The loop is
//! unrolled over the 3 stages, so every stage address is a register fixed before the
//! loop plus an immediate (no stage pointers to rotate).
//!
//! # The epilogue
//!
//! Each thread's accumulators are rows `m0 + (w/4)·BM/2 + 16i + g + 8h` and
//! columns `n0 + (w%4)·BN/4 + 8j + 2t + c`; the f32 kernel's epilogue evaluates the
//! kernel's root at each in range (`m < M`, `n < N`) and stores it as the output's
//! type (`cvt.rn` to a half output).
//!
//! # Split-K
//!
//! As the f32 kernel does ([`choose_split`]: 64×64 tiles where the grid leaves most
//! multiprocessors idle and `K` is long), a cluster of 2–8 blocks shares each tile, rank
//! `r` summing `k` in `[r·Kc, min((r+1)·Kc, K))` (`Kc` a multiple of [`BK`]; the copies
//! are predicated on `k` below the part's end). After its last step each block writes
//! its accumulators to its shared memory as a row-major 64×64 f32 tile (over the
//! stages, after a barrier), and the f32 kernel's cluster reduction
//! (`contraction::split_reduce`: ranks' partial tiles summed in rank order
//! through distributed shared memory, then the epilogue) finishes the tile.
//!
//! # Declined (to the f32 kernel, which widens half operands in its loads)
//!
//! Operands of different types (f16 × bf16, f32 × half): rounding an f32 operand to
//! half would change the result.
//!
//! # Variants ([`Shape`], the measurement knob `KILN_CUDA_TUNE`, [`super::tune`])
//!
//! The pipeline above, [`BK`] = 32 and [`STAGES`] = 3 with 8 warps, is [`Shape::default`]
//! and what a register-staged operand runs. Where both operands take `cp.async`, the
//! default ([`tune::Mma::default`], measured fastest on an H100: docs/cuda.md) is 4
//! stages of 32 and, on a 128×128 tile, 4 warps of 64×64 (128 threads, two blocks a
//! multiprocessor); every kernel stores pairs of columns (`v2`, below) where the output
//! allows. A [`Shape`] may name a `k` step of 64 (KMajor rows of 128 bytes, 8 chunks, swizzled by `r mod 8`:
//! [`smem_offset`]), 2–4 stages (over 48 KiB: dynamic shared memory, the launch's
//! `shared`), `.minnctapersm 2`, and a tile of 128×128, 128×256 or 256×128 (the last
//! two with warps of 64×64, [`warps`]). The loop is the same, unrolled over the
//! stages, `bk/16` `k16` sub-steps a stage, `cp.async.wait_group stages-2`. A
//! non-default shape also copies compactly: a thread's chunk `e` of an operand lies a
//! constant `(rows, k, shared bytes)` from its chunk 0 ([`item_delta`], checked over
//! every thread at compile time), so where `k` is linear and the rows one variable
//! its global address is chunk 0's pointer plus an immediate, and its shared slot
//! chunk 0's plus an immediate: one pointer and one offset per thread and operand
//! (a predicate per row where rows differ) instead of one per chunk.
//!
//! # Checked, and not yet
//!
//! The default kernel has run on an H100 (docs/cuda.md); the `KILN_CUDA_TUNE` variants
//! only in the sweep there. `tests/cuda_mma.rs` checks the index functions above
//! against the PTX ISA's tables (at both `k` steps, 128 and 256 threads), models the
//! whole data flow on the host from them against the kernel interpreter, runs the
//! emitted PTX of every variant in the host simulator against the interpreter, and
//! assembles the kernels with `ptxas -v` (no stack, no spills). Contractions whose
//! operands both take `cp.async` and whose `K` is not split run on Hopper's `wgmma`
//! instead ([`super::wgmma`]); this kernel is their fallback. Not yet: TMA copies and
//! thread-block clusters' multicast, and `cp.async` for chunks that straddle `K`.

use kiln_flow::Kernel;
use kiln_ir::DType;

use super::contraction::{self, choose_split, choose_tile, linear, u32_op, BlockStart, Map, Order, Plan, Tile, Var};
use super::feed::{self, Ring, Steps};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::{internal, tune, Entry, Launch, BLOCK};
use crate::CodegenError;

/// `k` per stage, by default ([`Shape`]).
pub const BK: u32 = 32;

/// Shared-memory stages, by default ([`Shape`]).
pub const STAGES: u32 = 3;

/// A kernel's pipeline: `k` per stage, stages, resident blocks asked of ptxas, and a
/// block tile other than [`choose_tile`]'s. The default is [`BK`], [`STAGES`], 1,
/// none; the measurement knob ([`tune::Mma`]) names others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Shape {
    /// `k` per stage (32 or 64).
    pub bk: u32,
    /// Shared-memory stages (2–4).
    pub stages: u32,
    /// `.minnctapersm` (1: no directive).
    pub min_blocks: u32,
    /// The block tile, where not [`choose_tile`]'s: 128×128, 128×256 or 256×128
    /// ([`warps`]).
    pub tile: Option<Tile>,
    /// Threads a block: [`BLOCK`], or 128 (4 warps of 64×64 on a 128×128 tile).
    pub threads: u32,
    /// The epilogue stores a thread's two consecutive columns (`2t`, `2t + 1` of a
    /// fragment) with one `st.global.v2.f32` where the output allows
    /// ([`Plan::pair_store`]).
    pub pairs: bool,
}

impl Default for Shape {
    fn default() -> Shape {
        Shape { bk: BK, stages: STAGES, min_blocks: 1, tile: None, threads: BLOCK, pairs: false }
    }
}

/// Warps along the rows and columns of `tile` for blocks of `threads`: [`WARPS`]
/// (warps of `BM/2 × BN/4`: 64×32 at 128×128); 4 × 2 for a tile of 256 rows, so that
/// 128×256 and 256×128 tiles both have warps of 64×64 (32 `mma` per 4 + 4
/// `ldmatrix.x4` a `k16`, against 16 per 4 + 2 at 64×32: a third less shared-memory
/// traffic per product); 2 × 2 for 4 warps (128 threads: 64×64 at 128×128).
pub fn warps(tile: Tile, threads: u32) -> (u32, u32) {
    if threads == 128 {
        (2, 2)
    } else if tile.bm() == 256 {
        (4, 2)
    } else {
        WARPS
    }
}

/// Warps along the tile's rows and columns.
pub const WARPS: (u32, u32) = (2, 4);

/// How an operand tile is stored in a stage (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Row `r` holds its 32 `k`.
    KMajor,
    /// Row `k` holds the tile's rows.
    RMajor,
}

/// The byte offset of element `(r, k)` in a stage's tile of `rows` rows and `bk` `k`
/// (32 or 64).
pub fn smem_offset(layout: Layout, rows: u32, bk: u32, r: u32, k: u32) -> u32 {
    match layout {
        Layout::KMajor => {
            // `C = bk/8` chunks a row, `8/C` rows a 128-byte line: chunk c of row r at
            // c ⊕ ((r / (8/C)) mod C).
            let c = bk / 8;
            r * bk * 2 + (((k / 8) ^ ((r / (8 / c)) % c)) * 16) + (k % 8) * 2
        }
        Layout::RMajor => k * rows * 2 + (((r / 8) ^ (k % 8)) * 16) + (r % 8) * 2,
    }
}

/// Which operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The row operand (mma's A).
    A,
    /// The column operand (mma's B).
    B,
}

/// The element `(dr, dk)` past a fragment's first `(r, k)` whose 16-byte row lane
/// `lane` addresses in an `ldmatrix.x4`: matrix `i = lane / 8`, its row `j = lane % 8`.
/// For A the matrices are (rows 0–7, k 0–7), (8–15, 0–7), (0–7, 8–15), (8–15, 8–15);
/// for B (columns 0–7, k 0–7), (0–7, 8–15), (8–15, 0–7), (8–15, 8–15): registers 0, 1
/// are the B fragment of columns 0–7, registers 2, 3 that of columns 8–15. A stored row
/// is one `r` (KMajor) or one `k` (RMajor).
pub fn ldm_lane(side: Side, layout: Layout, lane: u32) -> (u32, u32) {
    let (i, j) = (lane / 8, lane % 8);
    let (sel_r, sel_k) = match side {
        Side::A => (i % 2, i / 2),
        Side::B => (i / 2, i % 2),
    };
    match layout {
        Layout::KMajor => (8 * sel_r + j, 8 * sel_k),
        Layout::RMajor => (8 * sel_r, 8 * sel_k + j),
    }
}

/// The `(row, k)` of half `h` of A register `i` of lane `lane` (PTX ISA).
pub fn a_elem(lane: u32, i: u32, h: u32) -> (u32, u32) {
    (lane / 4 + 8 * (i % 2), 2 * (lane % 4) + h + 8 * (i / 2))
}

/// The `(k, column)` of half `h` of B register `q` of lane `lane` (PTX ISA).
pub fn b_elem(lane: u32, q: u32, h: u32) -> (u32, u32) {
    (2 * (lane % 4) + h + 8 * q, lane / 4)
}

/// The `(row, column)` of accumulator `i` of lane `lane` (PTX ISA).
pub fn c_elem(lane: u32, i: u32) -> (u32, u32) {
    (lane / 4 + 8 * (i / 2), 2 * (lane % 4) + i % 2)
}

/// What `ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16` gives lane `lane` in
/// register `i`, half `h`, as the PTX ISA defines it, where `addr(l)` is the 16-byte
/// row lane `l` addresses and `elem(row, c)` element `c` of such a row: without
/// `.trans`, element `2·(lane % 4) + h` of row `lane / 4` of matrix `i`; with it,
/// element `lane / 4` of row `2·(lane % 4) + h`.
pub fn ldmatrix<T>(trans: bool, lane: u32, i: u32, h: u32, elem: impl Fn(u32, u32) -> T) -> T {
    if trans {
        elem(8 * i + 2 * (lane % 4) + h, lane / 4)
    } else {
        elem(8 * i + lane / 4, 2 * (lane % 4) + h)
    }
}

/// How an operand gets into shared memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Feed {
    /// Its layout in a stage.
    pub layout: Layout,
    /// 16-byte `cp.async` chunks (else register-staged elements).
    pub cp: bool,
}

/// The feed of operand `map` whose tile variables are `vars` (see the module docs).
pub fn feed(plan: &Plan, map: &Map, vars: &[Var]) -> Feed {
    let r_step = vars.last().map(|&(v, _)| map.at(v));
    let k_step = plan.ks.last().map(|&(v, _)| map.at(v));
    let layout = match Order::of(r_step, k_step) {
        Order::AlongK => Layout::KMajor,
        Order::AlongRows => Layout::RMajor,
    };
    let a8 = |x: i64| x % 8 == 0;
    let batch_ok = a8(map.c) && plan.batch.iter().all(|&(v, _)| a8(map.at(v)));
    let cp = match (linear(&plan.ks, map, BK), layout) {
        (Some(s), Layout::KMajor) => {
            s == 1 && plan.dims[3].is_multiple_of(8) && batch_ok && vars.iter().all(|&(v, _)| a8(map.at(v)))
        }
        (Some(s), Layout::RMajor) => {
            // The innermost variables that are one stride-1 run (each coefficient the
            // next one's times its extent: an image's rows and columns), `run` long.
            let mut first = vars.len();
            let mut run = 1u64;
            let mut next: Option<i64> = Some(1);
            while first > 0 {
                let (v, e) = vars[first - 1];
                if Some(map.at(v)) != next {
                    break;
                }
                run = run.saturating_mul(e);
                next = map.at(v).checked_mul(i64::try_from(e).unwrap_or(i64::MAX));
                first -= 1;
            }
            first < vars.len()
                && run.is_multiple_of(8)
                && a8(s)
                && batch_ok
                && vars[..first].iter().all(|&(v, _)| a8(map.at(v)))
        }
        (None, _) => false,
    };
    Feed { layout, cp }
}

pub use super::feed::{item, items};

/// Bytes of the stages of a block of `bm × bn` under `shape`.
pub fn shared_bytes(bm: u32, bn: u32, shape: Shape) -> u32 {
    shape.stages * (bm + bn) * shape.bk * 2
}

/// The pipeline of `plan` under the knob `tune`: its stages, and its `k` step and
/// blocks per multiprocessor where both operands are copied by `cp.async` (a
/// register-staged operand keeps [`BK`], 64 would stage twice the registers, and one
/// block: its addresses need more than 128 registers).
pub fn shape(plan: &Plan, tune: &tune::Mma) -> Shape {
    let fa = feed(plan, &plan.a, &plan.rows);
    let fb = feed(plan, &plan.b, &plan.cols);
    let wide = |m: &Map| linear(&plan.ks, m, tune.bk).is_some();
    let cp = fa.cp && fb.cp;
    let bk = if cp && wide(&plan.a) && wide(&plan.b) { tune.bk } else { BK };
    // Two blocks a multiprocessor hold ptxas to 128 registers, which the copies of a
    // register-staged operand (a 3×3 window's addresses) would spill; a large tile
    // stages twice the elements beside 128 accumulators a thread.
    let min_blocks = if cp { tune.min_blocks } else { 1 };
    // A register-staged operand keeps at most the 3 stages it was measured with.
    let stages = if cp { tune.stages } else { tune.stages.min(STAGES) };
    let tile = tune.tile.filter(|_| cp).map(|(bm, bn)| Tile { tm: bm / 16, tn: bn / 16 });
    // Four warps only on a 128×128 tile (never split: the cluster reduction takes 256
    // threads).
    let [nb, m, n, _] = plan.dims;
    let big = Tile { tm: 8, tn: 8 };
    let threads = if cp && tune.warps4 && tile.unwrap_or_else(|| choose_tile(nb, m, n)) == big { 128 } else { BLOCK };
    Shape { bk, stages, min_blocks, tile, threads, pairs: tune.pairs }
}

/// `plan` as this path runs it under `shape`: the tile of [`choose_tile`], the split of
/// [`choose_split`] (64×64 tiles only), each block's part of `K` a multiple of the `k`
/// step.
pub fn plan(plan: &Plan, shape: Shape) -> Plan {
    let mut plan = plan.clone();
    let [nb, m, n, kk] = plan.dims;
    plan.tile = shape.tile.unwrap_or_else(|| choose_tile(nb, m, n));
    plan.split = if plan.clusters { choose_split(plan.tile, plan.tile.blocks(nb, m, n), kk) } else { 1 };
    let bk = u64::from(shape.bk);
    plan.k_chunk = kk.div_ceil(u64::from(plan.split)).div_ceil(bk) * bk;
    plan
}

/// The entry of `k` on the tensor cores under the knob `tune`, or why not.
pub fn emit(k: &Kernel, plan: &Plan, tune: &tune::Mma) -> Result<Result<Entry, String>, CodegenError> {
    let sh = shape(plan, tune);
    let planned = self::plan(plan, sh);
    if sh.threads != BLOCK && planned.split > 1 {
        return Err(internal(k, super::ptx::PtxError("four warps and a split".into())));
    }
    emit_planned(k, &planned, sh)
}

fn emit_planned(k: &Kernel, plan: &Plan, sh: Shape) -> Result<Result<Entry, String>, CodegenError> {
    let dt = plan.a.dtype;
    if !matches!(dt, DType::F16 | DType::BF16) || plan.b.dtype != dt {
        return Ok(Err(format!("{} × {} operands", plan.a.dtype.name(), plan.b.dtype.name())));
    }
    let plan = plan.clone();
    let [nb, m, n, kk] = plan.dims;
    if plan.grid() > contraction::LIMIT {
        return Ok(Err(format!("{} blocks", plan.grid())));
    }
    let fa = feed(&plan, &plan.a, &plan.rows);
    let fb = feed(&plan, &plan.b, &plan.cols);
    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    Emitter { k, plan: &plan, fa, fb, sh }.body(&mut p)?;
    let text = p.finish().map_err(|e| internal(k, e))?;
    let how = |f: Feed| {
        let l = if f.layout == Layout::KMajor { "k-major" } else { "row-major" };
        format!("{l} {}", if f.cp { "cp.async" } else { "registers" })
    };
    let (bm, bn) = (plan.tile.bm(), plan.tile.bn());
    let split = if plan.split > 1 { format!(", split-K over clusters of {}", plan.split) } else { String::new() };
    let note = format!(
        "contraction mma.sync m16n8k16 {} ({bm}x{bn} tile, {} stages of {} k{}, A {}, B {}, {} blocks{split}; batches {nb}, M {m}, N {n}, K {kk})",
        dt.name(),
        sh.stages,
        sh.bk,
        if sh.min_blocks > 1 { format!(", {} blocks per multiprocessor", sh.min_blocks) } else { String::new() }
            + &if sh.threads != BLOCK { format!(", {} warps", sh.threads / 32) } else { String::new() }
            + if sh.pairs && plan.pair_store() { ", v2 stores" } else { "" },
        how(fa),
        how(fb),
        plan.grid()
    );
    let shared = super::dynamic_bytes(block_shared(&plan, sh));
    let launch = Launch { grid: plan.grid(), block: sh.threads, shared, params: (k.inputs.len() + 1) as u32 };
    Ok(Ok(Entry { text, launch, note }))
}

/// Shared memory of a block under `plan` and `shape`: the stages (a split's partial
/// tile, `BM·BN` f32, reuses them).
pub fn block_shared(plan: &Plan, shape: Shape) -> u32 {
    let (bm, bn) = (plan.tile.bm(), plan.tile.bn());
    if plan.split > 1 {
        shared_bytes(bm, bn, shape).max(bm * bn * 4)
    } else {
        shared_bytes(bm, bn, shape)
    }
}

/// `smem_offset` in PTX (`r`, `k` u32 registers).
fn smem_regs(p: &mut Ptx, layout: Layout, (rows, bk): (u32, u32), r: Reg, k: Reg) -> Reg {
    let (hi, lo, sw) = match layout {
        Layout::KMajor => {
            let chunks = bk / 8;
            let c = u32_op(p, "shr.u32", k, Imm::U(3).into());
            let s = u32_op(p, "shr.u32", r, Imm::U(u64::from((8 / chunks).trailing_zeros())).into());
            let s = u32_op(p, "and.b32", s, Imm::U(u64::from(chunks - 1)).into());
            let hi = u32_op(p, "shl.b32", r, Imm::U(u64::from((bk * 2).trailing_zeros())).into());
            let lo = u32_op(p, "and.b32", k, Imm::U(7).into());
            (hi, lo, u32_op(p, "xor.b32", c, s.into()))
        }
        Layout::RMajor => {
            let c = u32_op(p, "shr.u32", r, Imm::U(3).into());
            let s = u32_op(p, "and.b32", k, Imm::U(7).into());
            let hi = u32_op(p, "mul.lo.u32", k, Imm::U(u64::from(rows * 2)).into());
            let lo = u32_op(p, "and.b32", r, Imm::U(7).into());
            (hi, lo, u32_op(p, "xor.b32", c, s.into()))
        }
    };
    let sw = u32_op(p, "shl.b32", sw, Imm::U(4).into());
    let lo = u32_op(p, "shl.b32", lo, Imm::U(1).into());
    let o = u32_op(p, "add.u32", hi, sw.into());
    u32_op(p, "add.u32", o, lo.into())
}

/// Where item `e` of every thread lies at a constant distance from the thread's item 0
/// (see [`feed::src`], `Ring::compact`): `(dr, dk, shared bytes)`, or `None`.
pub fn item_delta(f: Feed, rows: u32, (bk, threads): (u32, u32), e: u32) -> Option<(u32, u32, i64)> {
    let mut out = None;
    for tid in 0..threads {
        let (r0, k0) = item(f, rows, (bk, threads), tid, 0);
        let (r, k) = item(f, rows, (bk, threads), tid, e);
        let (dr, dk) = (r.checked_sub(r0)?, k.checked_sub(k0)?);
        let ds = i64::from(smem_offset(f.layout, rows, bk, r, k)) - i64::from(smem_offset(f.layout, rows, bk, r0, k0));
        match out {
            None => out = Some((dr, dk, ds)),
            Some(o) if o != (dr, dk, ds) => return None,
            Some(_) => {}
        }
    }
    out
}

struct Emitter<'a> {
    k: &'a Kernel,
    plan: &'a Plan,
    fa: Feed,
    fb: Feed,
    sh: Shape,
}

impl Emitter<'_> {
    /// Each fragment load's lane address in the first stage (from shared address
    /// `first`): `[idx][kk]` for `count` fragment loads 16 rows apart from row `r0`, at
    /// `k = 16·kk` (`kk < bk/16`).
    #[allow(clippy::too_many_arguments)]
    fn ldm_offsets(
        p: &mut Ptx,
        side: Side,
        f: Feed,
        (rows, bk, first): (u32, u32, Reg),
        r0: Reg,
        lane: Reg,
        count: u32,
    ) -> Vec<Vec<Reg>> {
        // ldm_lane in PTX.
        let i = u32_op(p, "shr.u32", lane, Imm::U(3).into());
        let j = u32_op(p, "and.b32", lane, Imm::U(7).into());
        let i0 = u32_op(p, "and.b32", i, Imm::U(1).into());
        let i1 = u32_op(p, "shr.u32", i, Imm::U(1).into());
        let (sel_r, sel_k) = match side {
            Side::A => (i0, i1),
            Side::B => (i1, i0),
        };
        let sel_r = u32_op(p, "shl.b32", sel_r, Imm::U(3).into());
        let sel_k = u32_op(p, "shl.b32", sel_k, Imm::U(3).into());
        let (dr, dk) = match f.layout {
            Layout::KMajor => (u32_op(p, "add.u32", sel_r, j.into()), sel_k),
            Layout::RMajor => (sel_r, u32_op(p, "add.u32", sel_k, j.into())),
        };
        let rbase = u32_op(p, "add.u32", r0, dr.into());
        let mut out = Vec::new();
        for idx in 0..count {
            let r = u32_op(p, "add.u32", rbase, Imm::U(u64::from(16 * idx)).into());
            let per_k: Vec<Reg> = (0..bk / 16)
                .map(|kk| {
                    let k = if kk == 0 { dk } else { u32_op(p, "add.u32", dk, Imm::U(u64::from(16 * kk)).into()) };
                    smem_regs(p, f.layout, (rows, bk), r, k)
                })
                .collect();
            out.push(per_k.into_iter().map(|o| u32_op(p, "add.u32", o, first.into())).collect());
        }
        out
    }

    fn body(&self, p: &mut Ptx) -> Result<(), CodegenError> {
        let (k, plan) = (self.k, self.plan);
        let t = plan.tile;
        let (bm, bn) = (t.bm(), t.bn());
        let (wr, wc) = warps(t, self.sh.threads);
        let (wm_rows, wn_cols) = (bm / wr, bn / wc);
        let (mi, ni) = (wm_rows / 16, wn_cols / 8);
        let [_, m, n, _] = plan.dims;
        let bases = p.binding_bases(k.inputs.len() + 1);
        let Shape { bk, stages, min_blocks, .. } = self.sh;
        p.directive(&format!(".maxntid {}, 1, 1", self.sh.threads));
        if min_blocks > 1 {
            p.directive(&format!(".minnctapersm {min_blocks}"));
        }
        let tid = p.special("%tid.x");
        let bid = p.special("%ctaid.x");
        let lane = u32_op(p, "and.b32", tid, Imm::U(31).into());
        let warp = u32_op(p, "shr.u32", tid, Imm::U(5).into());
        let wm = u32_op(p, "shr.u32", warp, Imm::U(wc.trailing_zeros().into()).into());
        let wn = u32_op(p, "and.b32", warp, Imm::U((wc - 1).into()).into());
        let g = u32_op(p, "shr.u32", lane, Imm::U(2).into());
        let t4 = u32_op(p, "and.b32", lane, Imm::U(3).into());
        let BlockStart { rank, k_start, k_end, m0, n0, bvars, a_bat, b_bat } = BlockStart::open(p, plan, bid);

        // Shared memory: [A stage 0..3 | B stage 0..3].
        let (a_stage, b_stage) = (bm * bk * 2, bn * bk * 2);
        // (A split's partial tile reuses it: BM·BN f32.)
        let smem = super::declare_shared(p, "stages", block_shared(plan, self.sh), 128);
        let a_first = p.reg(RegClass::B32);
        p.op("mov.u32", &[a_first.into(), Opd::Sym(smem)]);
        let b_first = u32_op(p, "add.u32", a_first, Imm::U(u64::from(stages * a_stage)).into());

        let (sh, nt) = (self.sh, self.sh.threads);
        let ring = Ring {
            ks: &plan.ks,
            bk,
            threads: nt,
            smem: &|p, layout, rows, r, k| smem_regs(p, layout, (rows, bk), r, k),
            compact: &|f, rows, e| (f.cp && sh != Shape::default()).then(|| item_delta(f, rows, (bk, nt), e)).flatten(),
        };
        let a_in = (a_bat, bases[plan.a.input]);
        let sa = feed::src(&ring, p, self.fa, &plan.a, (bm, m0, m), &plan.rows, a_in, (tid, k_start), a_first);
        let b_in = (b_bat, bases[plan.b.input]);
        let sb = feed::src(&ring, p, self.fb, &plan.b, (bn, n0, n), &plan.cols, b_in, (tid, k_start), b_first);

        // Fragment offsets: the warp's rows of A from wm·BM/2, of B from wn·BN/4.
        let ra = u32_op(p, "mul.lo.u32", wm, Imm::U(wm_rows.into()).into());
        let rb = u32_op(p, "mul.lo.u32", wn, Imm::U(wn_cols.into()).into());
        let oa = Emitter::ldm_offsets(p, Side::A, self.fa, (bm, bk, a_first), ra, lane, mi);
        let ob = Emitter::ldm_offsets(p, Side::B, self.fb, (bn, bk, b_first), rb, lane, ni / 2);

        let acc: Vec<Reg> = (0..mi * ni * 4).map(|_| p.mov(RegClass::F32, "f32", Imm::F32(0).into())).collect();

        // Prologue: steps 0 .. stages-1 into stages 0 .. stages-1.
        let kq = p.mov(RegClass::B32, "u32", k_start.map_or(Imm::U(0).into(), Opd::R));
        feed::prologue(&ring, p, (&sa, &sb), (a_stage, b_stage), (kq, &k_end), stages - 1);

        // The loop, unrolled over the stages: copy `u` runs the steps `t ≡ u (mod
        // stages)`, reading stage `u` and writing stage `(u + stages - 1) mod stages`
        // (immediate offsets), leaving after the last step.
        let ty = if plan.a.dtype == DType::F16 { "f16" } else { "bf16" };
        let mma = format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32");
        let ldm = |f: Feed| {
            format!(
                "ldmatrix.sync.aligned.m8n8.x4{}.shared.b16",
                if f.layout == Layout::RMajor { ".trans" } else { "" }
            )
        };
        let steps = Steps::open(&ring, p, plan.k_chunk, stages);
        for u in 0..stages {
            let wr = (u + stages - 1) % stages;
            p.op("cp.async.wait_group", &[Imm::I(i64::from(stages) - 2).into()]);
            p.op("bar.sync", &[Imm::I(0).into()]);
            let va = feed::issue(&ring, p, &sa, (kq, &k_end), wr * a_stage);
            let vb = feed::issue(&ring, p, &sb, (kq, &k_end), wr * b_stage);
            p.op("cp.async.commit_group", &[]);
            for kk in 0..(bk / 16) as usize {
                let mut af = Vec::new();
                for o in &oa {
                    let r: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::B32)).collect();
                    p.op(&ldm(self.fa), &[Opd::Vec(r.clone()), Opd::Addr(o[kk], i64::from(u * a_stage))]);
                    af.push(r);
                }
                let mut bf = Vec::new();
                for o in &ob {
                    let r: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::B32)).collect();
                    p.op(&ldm(self.fb), &[Opd::Vec(r.clone()), Opd::Addr(o[kk], i64::from(u * b_stage))]);
                    bf.push(vec![r[0], r[1]]);
                    bf.push(vec![r[2], r[3]]);
                }
                for (i, a) in af.iter().enumerate() {
                    for (j, b) in bf.iter().enumerate() {
                        let c: Vec<Reg> = (0..4).map(|q| acc[(i * ni as usize + j) * 4 + q]).collect();
                        p.op(&mma, &[Opd::Vec(c.clone()), Opd::Vec(a.clone()), Opd::Vec(b.clone()), Opd::Vec(c)]);
                    }
                }
            }
            feed::store(p, &sa, &va, wr * a_stage);
            feed::store(p, &sb, &vb, wr * b_stage);
            steps.end_copy(&ring, p, kq, u);
        }
        p.place(steps.exit);
        p.op("cp.async.wait_all", &[]);
        if let Some(rank) = rank {
            // A split: the partial tile over the stages (every warp is done reading them
            // after the barrier), row-major BM × BN f32, then the cluster's sums.
            p.op("bar.sync", &[Imm::I(0).into()]);
            let row = u32_op(p, "add.u32", ra, g.into());
            let t2 = u32_op(p, "shl.b32", t4, Imm::U(1).into());
            let col = u32_op(p, "add.u32", rb, t2.into());
            let at = p.reg(RegClass::B32);
            p.op("mad.lo.u32", &[at.into(), row.into(), Imm::U(u64::from(bn * 4)).into(), a_first.into()]);
            let col4 = u32_op(p, "shl.b32", col, Imm::U(2).into());
            let at = u32_op(p, "add.u32", at, col4.into());
            for i in 0..mi {
                for j in 0..ni {
                    for h in 0..2 {
                        let off = i64::from(((16 * i + 8 * h) * bn + 8 * j) * 4);
                        let c = (i * ni + j) as usize * 4 + 2 * h as usize;
                        p.op("st.shared.v2.f32", &[Opd::Addr(at, off), Opd::Vec(vec![acc[c], acc[c + 1]])]);
                    }
                }
            }
            return contraction::split_reduce(k, plan, p, &bases, (tid, rank), (m0, n0, a_first), &bvars);
        }

        // The thread's rows and columns (c_elem), accumulators row-major over them.
        let r0 = u32_op(p, "add.u32", m0, ra.into());
        let r0 = u32_op(p, "add.u32", r0, g.into());
        let t2 = u32_op(p, "shl.b32", t4, Imm::U(1).into());
        let c0 = u32_op(p, "add.u32", n0, rb.into());
        let c0 = u32_op(p, "add.u32", c0, t2.into());
        let rows: Vec<Reg> = (0..2 * mi)
            .map(|x| u32_op(p, "add.u32", r0, Imm::U(u64::from(16 * (x / 2) + 8 * (x % 2))).into()))
            .collect();
        let cols: Vec<Reg> =
            (0..2 * ni).map(|y| u32_op(p, "add.u32", c0, Imm::U(u64::from(8 * (y / 2) + y % 2)).into())).collect();
        let vals: Vec<Reg> = (0..2 * mi)
            .flat_map(|x| (0..2 * ni).map(move |y| (x, y)))
            .map(|(x, y)| acc[(((x / 2) * ni + y / 2) * 4 + 2 * (x % 2) + y % 2) as usize])
            .collect();
        contraction::epilogue(k, plan, p, &bases, (&rows, &cols, &vals), &bvars, self.sh.pairs)
    }
}
