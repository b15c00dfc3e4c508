//! Contractions of half operands (both f16 or both bf16) on Hopper's warpgroup tensor
//! cores: `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}.{f16,bf16}` with both
//! operands read from shared memory through matrix descriptors, fed by a multistage
//! `cp.async` ring in dynamic shared memory.
//!
//! As [`super::mma`] (whose module docs this one follows), the kernel computes what the
//! f32 kernel computes: each product of two half operands is exact in f32 and the sum
//! is accumulated in f32, only the summation order differs (the ISA leaves the order and
//! internal precision of a `wgmma`'s 16-term sums unspecified). The mapping is
//! [`Plan`]'s (row, column and batch variables, affine operand offsets: implicit GEMM
//! for convolutions, [`BlockStart`], the epilogue of `contraction::epilogue`); only the
//! main loop is this module's.
//!
//! # The block
//!
//! A block of `BM / 64` warpgroups (128 threads each) computes a `BM × BN` tile
//! ([`choose`]: `BM, BN ∈ {64, 128}` or 128 × 256): warpgroup `w` owns rows
//! `64w .. 64w + 64` and issues one `wgmma … m64n{BN}k16` per 16 `k`. Its accumulator
//! fragment (PTX ISA, "Register Fragments and Shared Memory Matrix Layouts", D of
//! `m64nNk16`, f32) is `BN / 2` f32 registers per thread ([`acc_elem`]): warp `v` of
//! the group holds rows `16v ..`, and register `i` of lane `l` is row `16v + l/4 +
//! 8·((i/2) mod 2)`, column `8·(i/4) + 2·(l mod 4) + i mod 2`. 128 × 256 (for grids
//! that fill the 132 multiprocessors several times over) gives 128 accumulators per
//! thread in 256 threads, one block per multiprocessor.
//!
//! # Shared memory and descriptors
//!
//! [`STAGES`] = 4 stages of [`BK`] = 64 `k`, each an A tile (`BM × 64` halves) and a B
//! tile (`BN × 64`), 1024-byte aligned (the dynamic array's address rounded up at run
//! time), in the 128-byte swizzle's canonical layouts (PTX ISA, "Shared Memory Matrix
//! Layout"; [`smem_offset`]), chosen per operand by [`mma::feed`]'s layout:
//! - K-major ([`Layout::KMajor`], the operand's `k` contiguous in global memory): row
//!   `r` is 128 bytes (its 64 `k`), 16-byte chunk `c` stored at chunk `c ⊕ (r mod 8)`;
//!   8 rows make a 1024-byte swizzle atom. Descriptor: stride byte offset (between
//!   8-row groups) 1024; the leading byte offset is unused for swizzled K-major layouts
//!   (16). A `k16` sub-step `j` starts `32j` bytes into the rows (the swizzle is a
//!   function of the address bits, so a start inside the atom reads the right chunks:
//!   `(2j + c) ⊕ (r mod 8)`).
//! - MN-major ([`Layout::RMajor`], the operand's rows contiguous: MatMul's B `[K, N]`
//!   row-major): atoms of 8 `k` × 64 rows (each `k` a 128-byte row of 64 tile rows,
//!   chunk `c` at `c ⊕ (k mod 8)`), the 8 atoms of one group of 64 rows consecutive
//!   along `k`. Descriptor: leading byte offset (between 64-row groups) 8192, stride byte
//!   offset (between 8-`k` groups) 1024, transpose flag set. Sub-step `j` starts at
//!   `2048j`.
//!
//! The descriptor ([`descriptor`]): bits 0–13 the start address / 16, 16–29 the leading
//! byte offset / 16, 32–45 the stride byte offset / 16, 49–51 the base offset (0: every
//! atom is 1024-byte aligned), 62–63 the swizzle mode (1: 128 bytes). In the loop each
//! descriptor is a register fixed before it plus an immediate (stage and sub-step).
//!
//! # Filling the stages
//!
//! (The copies are [`super::feed`]'s, shared with [`super::mma`]: every item with its
//! own pointer and shared slot, [`smem_offset`]'s layout.)
//! Only operands [`mma::feed`] copies with `cp.async` take this path (16-byte chunks of
//! 8 consecutive elements, 16-byte aligned, wholly in or out of range, zero-filled out
//! of range); every other contraction goes to [`super::mma`]. Both swizzles permute
//! whole chunks, so each chunk lands contiguous ([`feed::item`]). The pipeline, `T = ⌈K /
//! 64⌉`, stage `s mod 4` holding step `s`, [`AHEAD`] = 2 steps in flight:
//! ```text
//! issue steps 0, 1 → stages 0, 1 (each its own cp.async group)
//! for t in 0..T:
//!     cp.async.wait_group 1             (this thread's copies of step t landed)
//!     fence.proxy.async.shared::cta     (… and visible to the async proxy: wgmma)
//!     bar.sync                          (everyone's; everyone passed the wgmma wait
//!                                        of step t-1, so step t-2's wgmmas are done)
//!     issue step t+2 → stage (t+2) mod 4 = (t-2) mod 4; commit
//!     wgmma.fence; 4 × wgmma (k16 sub-steps) on stage t mod 4; wgmma.commit_group
//!     wgmma.wait_group 1                (step t-1's wgmmas done; step t's may run on)
//! wgmma.wait_group 0; cp.async.wait_all; epilogue
//! ```
//! Stage `(t+2) mod 4` was last read by step `t-2`'s wgmmas, which every warpgroup
//! waited for before the barrier of step `t`. The loop is unrolled over the 4 stages.
//!
//! # The epilogue
//!
//! Thread `x` of warpgroup `w` holds rows `m0 + 64w + 16(x/32) + (x mod 32)/4 + 8h` and
//! columns `n0 + 8j + 2(x mod 4) + c`; `contraction::epilogue` evaluates the kernel's
//! root at each in range, in groups of [`EPILOGUE_COLS`] columns (so that the column
//! offsets of a 256-wide tile are not all live with the accumulators), each thread's
//! two consecutive columns stored together (`st.global.v2.f32`, or two halves in one
//! `st.global.b32`) where [`Plan::pair_store`] allows.
//!
//! # Declined (to [`super::mma`])
//!
//! Operands that are not both `cp.async`-fed, splits of `K` ([`choose_split`]), mixed
//! operand types, a block past [`MAX_SHARED`].
//!
//! # Checked, and not yet
//!
//! No GPU has run these kernels. `tests/cuda_wgmma.rs` runs them in the host PTX
//! simulator (whose `wgmma` is written from the ISA: descriptor decoding, the 128-byte
//! swizzle, the accumulator fragment) against the kernel interpreter, and assembles them
//! with `ptxas -v` (no spills). Not yet: TMA copies and multicast, producer/consumer
//! warp specialisation, split-K.

use kiln_flow::Kernel;
use kiln_ir::DType;

use super::contraction::{self, choose_split, choose_tile, linear, pred, u32_op, BlockStart, Plan, Tile, SMS};
use super::feed::{self, Ring, Steps};
use super::mma::{self, Feed, Layout};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::{internal, Entry, Launch};
use crate::CodegenError;

/// `k` per stage: one 128-byte swizzle row of halves.
pub const BK: u32 = 64;

/// Shared-memory stages.
pub const STAGES: u32 = 4;

/// Steps whose copies are in flight ahead of the one computed.
pub const AHEAD: u32 = STAGES - 2;

/// Columns per call of the epilogue.
pub const EPILOGUE_COLS: usize = 16;

/// Most dynamic shared memory a Hopper block may have (227 KiB).
pub const MAX_SHARED: u32 = 227 * 1024;

/// Threads of a warpgroup.
pub const WARPGROUP: u32 = 128;

/// The byte offset of element `(r, k)` of a stage's operand tile (see the module docs).
pub fn smem_offset(layout: Layout, r: u32, k: u32) -> u32 {
    match layout {
        Layout::KMajor => r * 128 + (((k / 8) ^ (r % 8)) * 16) + (k % 8) * 2,
        Layout::RMajor => {
            (r / 64) * 8192 + (k / 8) * 1024 + (k % 8) * 128 + ((((r % 64) / 8) ^ (k % 8)) * 16) + (r % 8) * 2
        }
    }
}

/// The byte offset (from the tile) where the descriptor of rows `r0 ..` (a multiple of
/// 64) at `k16` sub-step `j` starts.
pub fn start_offset(layout: Layout, r0: u32, j: u32) -> u32 {
    match layout {
        Layout::KMajor => r0 * 128 + 32 * j,
        Layout::RMajor => (r0 / 64) * 8192 + 2048 * j,
    }
}

/// The matrix descriptor of a tile in `layout` starting at shared address `start`
/// (bits 0–13 `start / 16`; leading and stride byte offsets / 16 at 16–29 and 32–45;
/// base offset 0; 128-byte swizzle, 1, at 62–63).
pub fn descriptor(layout: Layout, start: u32) -> u64 {
    u64::from((start >> 4) & 0x3FFF) | desc_high(layout)
}

/// The descriptor's bits other than the start address.
fn desc_high(layout: Layout) -> u64 {
    let (lbo, sbo): (u64, u64) = match layout {
        Layout::KMajor => (16, 1024),
        Layout::RMajor => (8192, 1024),
    };
    ((lbo >> 4) << 16) | ((sbo >> 4) << 32) | (1 << 62)
}

/// The `(row, column)` of accumulator `i` of thread `x` of a warpgroup (PTX ISA, D of
/// `m64nNk16`).
pub fn acc_elem(x: u32, i: u32) -> (u32, u32) {
    let lane = x % 32;
    (16 * (x / 32) + lane / 4 + 8 * ((i / 2) % 2), 8 * (i / 4) + 2 * (lane % 4) + i % 2)
}

/// Bytes of dynamic shared memory of a `bm × bn` block: the stages and 1024 bytes to
/// align them.
pub fn shared_bytes(bm: u32, bn: u32) -> u32 {
    STAGES * (bm + bn) * BK * 2 + 1024
}

/// The tile for `batches` products of `m × n`, or `None` where the plan splits `K`
/// (those go to [`super::mma`]): [`choose_tile`]'s, widened to 128 × 256 where a grid of
/// those still has at least two blocks per multiprocessor.
pub fn choose(batches: u64, m: u64, n: u64, k: u64) -> Option<Tile> {
    let t = choose_tile(batches, m, n);
    if choose_split(t, t.blocks(batches, m, n), k) > 1 {
        return None;
    }
    let wide = Tile { tm: 8, tn: 16 };
    if t == (Tile { tm: 8, tn: 8 }) && wide.blocks(batches, m, n) >= 2 * SMS {
        return Some(wide);
    }
    Some(t)
}

/// `plan` as this path runs it ([`choose`]'s tile), or why not.
pub fn plan(plan: &Plan) -> Result<(Plan, Feed, Feed), String> {
    let [nb, m, n, kk] = plan.dims;
    let tile = choose(nb, m, n, kk).ok_or("a split of K")?;
    plan_with(plan, tile)
}

/// `plan` run with block tile `tile` (`BM, BN ∈ {64, 128}`, or 128 × 256), or why not.
pub fn plan_with(plan: &Plan, tile: Tile) -> Result<(Plan, Feed, Feed), String> {
    let dt = plan.a.dtype;
    if !matches!(dt, DType::F16 | DType::BF16) || plan.b.dtype != dt {
        return Err(format!("{} × {} operands", plan.a.dtype.name(), plan.b.dtype.name()));
    }
    // 64 × 256 would leave one warpgroup 128 accumulators and 20 chunks to copy a
    // step: past 255 registers.
    if !matches!((tile.bm(), tile.bn()), (64 | 128, 64 | 128) | (128, 256)) {
        return Err(format!("a {}x{} tile", tile.bm(), tile.bn()));
    }
    // Hopper's 227 KiB of shared memory a block; the descriptors' 14-bit start field
    // (address / 16) reaches 256 KiB.
    if shared_bytes(tile.bm(), tile.bn()) > MAX_SHARED {
        return Err(format!("{} bytes of shared memory", shared_bytes(tile.bm(), tile.bn())));
    }
    let kk = plan.dims[3];
    let mut plan = plan.clone();
    plan.tile = tile;
    plan.split = 1;
    plan.k_chunk = kk.div_ceil(u64::from(BK)) * u64::from(BK);
    let fa = mma::feed(&plan, &plan.a, &plan.rows);
    let fb = mma::feed(&plan, &plan.b, &plan.cols);
    for (name, f, map) in [("A", fa, &plan.a), ("B", fb, &plan.b)] {
        if !f.cp || linear(&plan.ks, map, BK).is_none() {
            return Err(format!("operand {name} not copied in 16-byte chunks"));
        }
    }
    if plan.grid() > contraction::LIMIT {
        return Err(format!("{} blocks", plan.grid()));
    }
    Ok((plan, fa, fb))
}

/// The entry of `k` on the warpgroup tensor cores, or why not.
pub fn emit(k: &Kernel, plan: &Plan) -> Result<Result<Entry, String>, CodegenError> {
    let [nb, m, n, kk] = plan.dims;
    match choose(nb, m, n, kk) {
        Some(tile) => emit_with(k, plan, tile),
        None => Ok(Err("a split of K".into())),
    }
}

/// The entry of `k` with block tile `tile` (see [`plan_with`]), or why not.
pub fn emit_with(k: &Kernel, plan: &Plan, tile: Tile) -> Result<Result<Entry, String>, CodegenError> {
    let (plan, fa, fb) = match self::plan_with(plan, tile) {
        Ok(x) => x,
        Err(why) => return Ok(Err(why)),
    };
    let [nb, m, n, kk] = plan.dims;
    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    Emitter { k, plan: &plan, fa, fb }.body(&mut p)?;
    let text = p.finish().map_err(|e| internal(k, e))?;
    let how = |f: Feed| if f.layout == Layout::KMajor { "k-major" } else { "mn-major" };
    let (bm, bn) = (plan.tile.bm(), plan.tile.bn());
    let note = format!(
        "contraction wgmma m64n{bn}k16 {} ({bm}x{bn} tile, {STAGES} stages of {BK}, A {}, B {}, {} blocks; batches {nb}, M {m}, N {n}, K {kk})",
        plan.a.dtype.name(),
        how(fa),
        how(fb),
        plan.grid()
    );
    let launch =
        Launch { grid: plan.grid(), block: 2 * bm, shared: shared_bytes(bm, bn), params: (k.inputs.len() + 1) as u32 };
    Ok(Ok(Entry { text, launch, note }))
}

/// `smem_offset` in PTX (`r`, `k` u32 registers).
fn smem_regs(p: &mut Ptx, layout: Layout, r: Reg, k: Reg) -> Reg {
    let (base, chunk, sel, lo) = match layout {
        Layout::KMajor => {
            let base = u32_op(p, "shl.b32", r, Imm::U(7).into());
            let c = u32_op(p, "shr.u32", k, Imm::U(3).into());
            let s = u32_op(p, "and.b32", r, Imm::U(7).into());
            (base, c, s, u32_op(p, "and.b32", k, Imm::U(7).into()))
        }
        Layout::RMajor => {
            let g = u32_op(p, "shr.u32", r, Imm::U(6).into());
            let base = u32_op(p, "shl.b32", g, Imm::U(13).into());
            let kg = u32_op(p, "shl.b32", k, Imm::U(7).into());
            let base = u32_op(p, "add.u32", base, kg.into());
            let c = u32_op(p, "shr.u32", r, Imm::U(3).into());
            let c = u32_op(p, "and.b32", c, Imm::U(7).into());
            let s = u32_op(p, "and.b32", k, Imm::U(7).into());
            (base, c, s, u32_op(p, "and.b32", r, Imm::U(7).into()))
        }
    };
    // (k/8)·1024 + (k%8)·128 = k·128 for RMajor: `kg` above.
    let sw = u32_op(p, "xor.b32", chunk, sel.into());
    let sw = u32_op(p, "shl.b32", sw, Imm::U(4).into());
    let lo = u32_op(p, "shl.b32", lo, Imm::U(1).into());
    let o = u32_op(p, "add.u32", base, sw.into());
    u32_op(p, "add.u32", o, lo.into())
}

struct Emitter<'a> {
    k: &'a Kernel,
    plan: &'a Plan,
    fa: Feed,
    fb: Feed,
}

impl Emitter<'_> {
    fn body(&self, p: &mut Ptx) -> Result<(), CodegenError> {
        let (k, plan) = (self.k, self.plan);
        let (bm, bn) = (plan.tile.bm(), plan.tile.bn());
        let threads = 2 * bm;
        let [_, m, n, _] = plan.dims;
        let bases = p.binding_bases(k.inputs.len() + 1);
        p.directive(&format!(".maxntid {threads}, 1, 1"));
        let tid = p.special("%tid.x");
        let bid = p.special("%ctaid.x");
        let wg = u32_op(p, "shr.u32", tid, Imm::U(7).into());
        let x = u32_op(p, "and.b32", tid, Imm::U(u64::from(WARPGROUP - 1)).into());
        let BlockStart { k_start, k_end, m0, n0, bvars, a_bat, b_bat, .. } = BlockStart::open(p, plan, bid);
        debug_assert!(k_start.is_none());

        // Dynamic shared memory, from its first 1024-byte boundary: [A stages | B stages].
        let (a_stage, b_stage) = (bm * BK * 2, bn * BK * 2);
        let smem = p.dynamic_shared("stages", 1024);
        let raw = p.mov(RegClass::B32, "u32", Opd::Sym(smem));
        let a_first = u32_op(p, "add.u32", raw, Imm::U(1023).into());
        let a_first = u32_op(p, "and.b32", a_first, Imm::U(!1023u64 & 0xFFFF_FFFF).into());
        let b_first = u32_op(p, "add.u32", a_first, Imm::U(u64::from(STAGES * a_stage)).into());

        // Every item its own pointer and slot (no compact addressing: 128 accumulators).
        let ring = Ring {
            ks: &plan.ks,
            bk: BK,
            threads,
            smem: &|p, layout, _, r, k| smem_regs(p, layout, r, k),
            compact: &|_, _, _| None,
        };
        let a_in = (a_bat, bases[plan.a.input]);
        let sa = feed::src(&ring, p, self.fa, &plan.a, (bm, m0, m), &plan.rows, a_in, (tid, None), a_first);
        let b_in = (b_bat, bases[plan.b.input]);
        let sb = feed::src(&ring, p, self.fb, &plan.b, (bn, n0, n), &plan.cols, b_in, (tid, None), b_first);

        // Descriptors of stage 0, sub-step 0: A at the warpgroup's 64 rows, B whole.
        let desc = |p: &mut Ptx, layout: Layout, at: Reg| {
            let a4 = u32_op(p, "shr.u32", at, Imm::U(4).into());
            let a4 = u32_op(p, "and.b32", a4, Imm::U(0x3FFF).into());
            let w = p.reg(RegClass::B64);
            p.op("cvt.u64.u32", &[w.into(), a4.into()]);
            let d = p.reg(RegClass::B64);
            p.op("or.b64", &[d.into(), w.into(), Imm::U(desc_high(layout)).into()]);
            d
        };
        let wg_off = u32_op(p, "mul.lo.u32", wg, Imm::U(u64::from(start_offset(self.fa.layout, 64, 0))).into());
        let a_at = u32_op(p, "add.u32", a_first, wg_off.into());
        let da0 = desc(p, self.fa.layout, a_at);
        let db0 = desc(p, self.fb.layout, b_first);

        let acc: Vec<Reg> = (0..bn / 2).map(|_| p.mov(RegClass::F32, "f32", Imm::F32(0).into())).collect();
        // wgmma's scale-d: D = A·B + D.
        let accumulate = pred(p, "setp.ge.u32", tid, Imm::U(0).into());

        // Prologue: steps 0 .. AHEAD into stages 0 .. AHEAD.
        // Both operands are `cp.async`-fed: nothing is register-staged.
        let kq = p.mov(RegClass::B32, "u32", Imm::U(0).into());
        feed::prologue(&ring, p, (&sa, &sb), (a_stage, b_stage), (kq, &k_end), AHEAD);

        let ty = if plan.a.dtype == DType::F16 { "f16" } else { "bf16" };
        let op = format!("wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.{ty}.{ty}");
        let trans = |f: Feed| Imm::I(i64::from(f.layout == Layout::RMajor));
        let steps = Steps::open(&ring, p, plan.k_chunk, STAGES);
        for u in 0..STAGES {
            let ws = (u + AHEAD) % STAGES;
            p.op("cp.async.wait_group", &[Imm::I(i64::from(AHEAD) - 1).into()]);
            p.op("fence.proxy.async.shared::cta", &[]);
            p.op("bar.sync", &[Imm::I(0).into()]);
            feed::issue(&ring, p, &sa, (kq, &k_end), ws * a_stage);
            feed::issue(&ring, p, &sb, (kq, &k_end), ws * b_stage);
            p.op("cp.async.commit_group", &[]);
            p.op("wgmma.fence.sync.aligned", &[]);
            for j in 0..BK / 16 {
                let step_of = |layout: Layout, stage: u32| u64::from((stage * u + start_offset(layout, 0, j)) >> 4);
                let da = p.reg(RegClass::B64);
                p.op("add.s64", &[da.into(), da0.into(), Imm::U(step_of(self.fa.layout, a_stage)).into()]);
                let db = p.reg(RegClass::B64);
                p.op("add.s64", &[db.into(), db0.into(), Imm::U(step_of(self.fb.layout, b_stage)).into()]);
                p.op(
                    &op,
                    &[
                        Opd::Vec(acc.clone()),
                        da.into(),
                        db.into(),
                        accumulate.into(),
                        Imm::I(1).into(),
                        Imm::I(1).into(),
                        trans(self.fa).into(),
                        trans(self.fb).into(),
                    ],
                );
            }
            p.op("wgmma.commit_group.sync.aligned", &[]);
            p.op("wgmma.wait_group.sync.aligned", &[Imm::I(1).into()]);
            steps.end_copy(&ring, p, kq, u);
        }
        p.place(steps.exit);
        p.op("wgmma.wait_group.sync.aligned", &[Imm::I(0).into()]);
        p.op("cp.async.wait_all", &[]);

        // The thread's rows (acc_elem: h = 0, 1) and columns (8j + 2·(x % 4) + c).
        let warp = u32_op(p, "shr.u32", x, Imm::U(5).into());
        let r0 = u32_op(p, "shl.b32", wg, Imm::U(6).into());
        let w16 = u32_op(p, "shl.b32", warp, Imm::U(4).into());
        let r0 = u32_op(p, "add.u32", r0, w16.into());
        let lane = u32_op(p, "and.b32", x, Imm::U(31).into());
        let g = u32_op(p, "shr.u32", lane, Imm::U(2).into());
        let r0 = u32_op(p, "add.u32", r0, g.into());
        let r0 = u32_op(p, "add.u32", r0, m0.into());
        let rows: Vec<Reg> = (0..2).map(|h| u32_op(p, "add.u32", r0, Imm::U(8 * h).into())).collect();
        let t4 = u32_op(p, "and.b32", lane, Imm::U(3).into());
        let t2 = u32_op(p, "shl.b32", t4, Imm::U(1).into());
        let c0 = u32_op(p, "add.u32", n0, t2.into());
        let ncols = bn / 4;
        // Column y = 2j + c is accumulator 4j + 2h + c of row h.
        for y0 in (0..ncols as usize).step_by(EPILOGUE_COLS) {
            let ys: Vec<u32> = (y0 as u32..(y0 + EPILOGUE_COLS).min(ncols as usize) as u32).collect();
            let cols: Vec<Reg> =
                ys.iter().map(|&y| u32_op(p, "add.u32", c0, Imm::U(u64::from(8 * (y / 2) + y % 2)).into())).collect();
            let vals: Vec<Reg> = (0..2u32)
                .flat_map(|h| ys.iter().map(move |&y| (h, y)))
                .map(|(h, y)| acc[(4 * (y / 2) + 2 * h + y % 2) as usize])
                .collect();
            contraction::epilogue(k, plan, p, &bases, (&rows, &cols, &vals), &bvars, true)?;
        }
        Ok(())
    }
}
