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
//! # Checked, and not yet
//!
//! No GPU has run these kernels. `tests/cuda_mma.rs` checks the index functions above
//! against the PTX ISA's tables, models the whole data flow on the host from them
//! against the kernel interpreter, and assembles the kernels with `ptxas -v` (no
//! stack, no spills). Contractions whose operands both take `cp.async` and whose `K`
//! is not split run on Hopper's `wgmma` instead ([`super::wgmma`]); this kernel is their
//! fallback. Not yet: TMA copies and thread-block clusters' multicast, and `cp.async`
//! for chunks that straddle `K`.

use kiln_flow::Kernel;
use kiln_ir::DType;

use super::contraction::{
    self, choose_split, choose_tile, linear, operand_element, operand_row, pred, u32_op, BlockStart, Map, Order, Plan,
    Var,
};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::{internal, Entry, Launch, BLOCK};
use crate::CodegenError;

/// `k` per stage.
pub const BK: u32 = 32;

/// Shared-memory stages.
pub const STAGES: u32 = 3;

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

/// The byte offset of element `(r, k)` in a stage's tile of `rows` rows.
pub fn smem_offset(layout: Layout, rows: u32, r: u32, k: u32) -> u32 {
    match layout {
        Layout::KMajor => r * 64 + (((k / 8) ^ ((r / 2) % 4)) * 16) + (k % 8) * 2,
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

/// Items (chunks or elements) of a `rows × BK` tile each thread copies.
pub fn items(f: Feed, rows: u32) -> u32 {
    if f.cp {
        rows * BK / 8 / BLOCK
    } else {
        rows * BK / BLOCK
    }
}

/// Item `e` of thread `tid`: `(r, k)` within a tile of `rows` rows, its first element
/// (a chunk holds 8 elements along `k` (KMajor) or `r` (RMajor)). Consecutive threads
/// take consecutive chunks or elements along the stored rows.
pub fn item(f: Feed, rows: u32, tid: u32, e: u32) -> (u32, u32) {
    match (f.cp, f.layout) {
        (true, Layout::KMajor) => {
            let q = tid + BLOCK * e;
            (q / 4, 8 * (q % 4))
        }
        (true, Layout::RMajor) => {
            let (q, per) = (tid + BLOCK * e, rows / 8);
            (8 * (q % per), q / per)
        }
        (false, Layout::KMajor) => (tid / BK + (BLOCK / BK) * e, tid % BK),
        (false, Layout::RMajor) => (tid % rows, tid / rows + (BLOCK / rows) * e),
    }
}

/// Bytes of shared memory of a block of `bm × bn`.
pub fn shared_bytes(bm: u32, bn: u32) -> u32 {
    STAGES * (bm + bn) * BK * 2
}

/// `plan` as this path runs it: the tile of [`choose_tile`], the split of
/// [`choose_split`] (64×64 tiles only), each block's part of `K` a multiple of [`BK`].
pub fn plan(plan: &Plan) -> Plan {
    let mut plan = plan.clone();
    let [nb, m, n, kk] = plan.dims;
    plan.tile = choose_tile(nb, m, n);
    plan.split = choose_split(plan.tile, plan.tile.blocks(nb, m, n), kk);
    plan.k_chunk = kk.div_ceil(u64::from(plan.split)).div_ceil(u64::from(BK)) * u64::from(BK);
    plan
}

/// The entry of `k` on the tensor cores, or why not.
pub fn emit(k: &Kernel, plan: &Plan) -> Result<Result<Entry, String>, CodegenError> {
    emit_planned(k, &self::plan(plan))
}

fn emit_planned(k: &Kernel, plan: &Plan) -> Result<Result<Entry, String>, CodegenError> {
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
    Emitter { k, plan: &plan, fa, fb }.body(&mut p)?;
    let text = p.finish().map_err(|e| internal(k, e))?;
    let how = |f: Feed| {
        let l = if f.layout == Layout::KMajor { "k-major" } else { "row-major" };
        format!("{l} {}", if f.cp { "cp.async" } else { "registers" })
    };
    let (bm, bn) = (plan.tile.bm(), plan.tile.bn());
    let split = if plan.split > 1 { format!(", split-K over clusters of {}", plan.split) } else { String::new() };
    let note = format!(
        "contraction mma.sync m16n8k16 {} ({bm}x{bn} tile, {STAGES} stages, A {}, B {}, {} blocks{split}; batches {nb}, M {m}, N {n}, K {kk})",
        dt.name(),
        how(fa),
        how(fb),
        plan.grid()
    );
    let launch = Launch { grid: plan.grid(), block: BLOCK, shared: 0, params: (k.inputs.len() + 1) as u32 };
    Ok(Ok(Entry { text, launch, note }))
}

/// Shared memory of a block under `plan`: the stages (a split's partial tile, `BM·BN`
/// f32, reuses them).
pub fn block_shared(plan: &Plan) -> u32 {
    let (bm, bn) = (plan.tile.bm(), plan.tile.bn());
    if plan.split > 1 {
        shared_bytes(bm, bn).max(bm * bn * 4)
    } else {
        shared_bytes(bm, bn)
    }
}

/// `smem_offset` in PTX (`r`, `k` u32 registers).
fn smem_regs(p: &mut Ptx, layout: Layout, rows: u32, r: Reg, k: Reg) -> Reg {
    let (hi, lo, sw) = match layout {
        Layout::KMajor => {
            let c = u32_op(p, "shr.u32", k, Imm::U(3).into());
            let s = u32_op(p, "shr.u32", r, Imm::U(1).into());
            let s = u32_op(p, "and.b32", s, Imm::U(3).into());
            let hi = u32_op(p, "shl.b32", r, Imm::U(6).into());
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

/// One item a thread copies per step.
struct Item {
    /// `k` within the step.
    k_in: Reg,
    /// The tile row (chunk) is in range.
    in_range: Reg,
    /// Element offset of `(row, k = 0)`, batch included.
    off: Reg,
    /// Byte offset of its shared slot within a stage.
    sts: Reg,
    /// Where `k` is linear: the global address at the next step to issue.
    ptr: Option<Reg>,
}

/// One operand's copies.
struct Src {
    feed: Feed,
    map: Map,
    items: Vec<Item>,
    /// Element offset per unit of `k` where linear.
    linear: Option<i64>,
    base: Reg,
}

struct Emitter<'a> {
    k: &'a Kernel,
    plan: &'a Plan,
    fa: Feed,
    fb: Feed,
}

impl Emitter<'_> {
    /// The copies of `map` (tile of `rows` rows from row `first` of `total`), into
    /// stages from shared address `first_stage`.
    #[allow(clippy::too_many_arguments)]
    fn src(
        &self,
        p: &mut Ptx,
        f: Feed,
        map: &Map,
        (rows, first, total): (u32, Reg, u64),
        vars: &[Var],
        bat: Reg,
        base: Reg,
        (tid, k_start): (Reg, Option<Reg>),
        first_stage: Reg,
    ) -> Src {
        let lin = linear(&self.plan.ks, map, BK);
        let mut out = Vec::new();
        for e in 0..items(f, rows) {
            // `item` in PTX.
            let (r_in, k_in) = match (f.cp, f.layout) {
                (true, Layout::KMajor) => {
                    let q = u32_op(p, "add.u32", tid, Imm::U(u64::from(BLOCK * e)).into());
                    let r = u32_op(p, "shr.u32", q, Imm::U(2).into());
                    let c = u32_op(p, "and.b32", q, Imm::U(3).into());
                    (r, u32_op(p, "shl.b32", c, Imm::U(3).into()))
                }
                (true, Layout::RMajor) => {
                    let q = u32_op(p, "add.u32", tid, Imm::U(u64::from(BLOCK * e)).into());
                    let per = rows / 8;
                    let c = u32_op(p, "rem.u32", q, Imm::U(per.into()).into());
                    let r = u32_op(p, "shl.b32", c, Imm::U(3).into());
                    (r, u32_op(p, "div.u32", q, Imm::U(per.into()).into()))
                }
                (false, Layout::KMajor) => {
                    let r = u32_op(p, "shr.u32", tid, Imm::U(5).into());
                    let r = u32_op(p, "add.u32", r, Imm::U(u64::from((BLOCK / BK) * e)).into());
                    (r, u32_op(p, "and.b32", tid, Imm::U(u64::from(BK - 1)).into()))
                }
                (false, Layout::RMajor) => {
                    let r = u32_op(p, "rem.u32", tid, Imm::U(rows.into()).into());
                    let k = u32_op(p, "div.u32", tid, Imm::U(rows.into()).into());
                    (r, u32_op(p, "add.u32", k, Imm::U(u64::from((BLOCK / rows) * e)).into()))
                }
            };
            let (in_range, off, ptr) =
                operand_row(p, (map, vars, bat), (first, r_in, total), lin, (k_in, k_start), (base, 2));
            let sts = smem_regs(p, f.layout, rows, r_in, k_in);
            let sts = u32_op(p, "add.u32", sts, first_stage.into());
            out.push(Item { k_in, in_range, off, sts, ptr });
        }
        Src { feed: f, map: map.clone(), items: out, linear: lin, base }
    }

    /// Issues step `k0` of `s` into the stage `stage` bytes past the first: `cp.async` chunks, or loads
    /// into fresh b16 registers (returned; the caller stores them). Steps the pointers.
    fn issue(&self, p: &mut Ptx, s: &Src, (k0, k_end): (Reg, &Opd), stage: u32) -> Vec<Reg> {
        let mut vals = Vec::new();
        for it in &s.items {
            let (ok, (addr, _)) = operand_element(
                p,
                (&self.plan.ks, &s.map),
                (k0, it.k_in, k_end),
                (it.in_range, it.off, it.ptr.map(|a| (a, 0))),
                (s.base, 2),
            );
            if s.feed.cp {
                // Out of range: nothing read (src-size 0, from the base), 16 zero bytes.
                let src = p.reg(RegClass::B64);
                p.op("selp.b64", &[src.into(), addr.into(), s.base.into(), ok.into()]);
                let n = p.reg(RegClass::B32);
                p.op("selp.u32", &[n.into(), Imm::U(16).into(), Imm::U(0).into(), ok.into()]);
                let dst = Opd::Addr(it.sts, i64::from(stage));
                p.op("cp.async.cg.shared.global", &[dst, Opd::Addr(src, 0), Imm::U(16).into(), n.into()]);
            } else {
                let v = p.reg(RegClass::B16);
                p.op("mov.b16", &[v.into(), Imm::I(0).into()]);
                p.op_if(ok, false, "ld.global.b16", &[v.into(), Opd::Addr(addr, 0)]);
                vals.push(v);
            }
        }
        if let Some(step) = s.linear {
            for it in &s.items {
                if let Some(a) = it.ptr {
                    p.op("add.s64", &[a.into(), a.into(), Imm::I(step * i64::from(BK) * 2).into()]);
                }
            }
        }
        vals
    }

    /// Stores register-staged `vals` of `s` into the stage `stage` bytes past the first.
    fn store(p: &mut Ptx, s: &Src, vals: &[Reg], stage: u32) {
        for (it, &v) in s.items.iter().zip(vals) {
            p.op("st.shared.b16", &[Opd::Addr(it.sts, i64::from(stage)), v.into()]);
        }
    }

    /// Each fragment load's lane address in the first stage (from shared address
    /// `first`): `[idx][kk]` for `count` fragment loads 16 rows apart from row `r0`, at
    /// `k = 16·kk`.
    #[allow(clippy::too_many_arguments)]
    fn ldm_offsets(
        p: &mut Ptx,
        side: Side,
        f: Feed,
        (rows, first): (u32, Reg),
        r0: Reg,
        lane: Reg,
        count: u32,
    ) -> Vec<[Reg; 2]> {
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
            let o0 = smem_regs(p, f.layout, rows, r, dk);
            let k1 = u32_op(p, "add.u32", dk, Imm::U(16).into());
            let o1 = smem_regs(p, f.layout, rows, r, k1);
            out.push([u32_op(p, "add.u32", o0, first.into()), u32_op(p, "add.u32", o1, first.into())]);
        }
        out
    }

    fn body(&self, p: &mut Ptx) -> Result<(), CodegenError> {
        let (k, plan) = (self.k, self.plan);
        let t = plan.tile;
        let (bm, bn) = (t.bm(), t.bn());
        let (wr, wc) = WARPS;
        let (wm_rows, wn_cols) = (bm / wr, bn / wc);
        let (mi, ni) = (wm_rows / 16, wn_cols / 8);
        let [_, m, n, _] = plan.dims;
        let bases = p.binding_bases(k.inputs.len() + 1);
        p.directive(&format!(".maxntid {BLOCK}, 1, 1"));
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
        let (a_stage, b_stage) = (bm * BK * 2, bn * BK * 2);
        // (A split's partial tile reuses it: BM·BN f32.)
        let smem = p.shared("stages", block_shared(plan), 128);
        let a_first = p.reg(RegClass::B32);
        p.op("mov.u32", &[a_first.into(), Opd::Sym(smem)]);
        let b_first = u32_op(p, "add.u32", a_first, Imm::U(u64::from(STAGES * a_stage)).into());

        let sa =
            self.src(p, self.fa, &plan.a, (bm, m0, m), &plan.rows, a_bat, bases[plan.a.input], (tid, k_start), a_first);
        let sb =
            self.src(p, self.fb, &plan.b, (bn, n0, n), &plan.cols, b_bat, bases[plan.b.input], (tid, k_start), b_first);

        // Fragment offsets: the warp's rows of A from wm·BM/2, of B from wn·BN/4.
        let ra = u32_op(p, "mul.lo.u32", wm, Imm::U(wm_rows.into()).into());
        let rb = u32_op(p, "mul.lo.u32", wn, Imm::U(wn_cols.into()).into());
        let oa = Emitter::ldm_offsets(p, Side::A, self.fa, (bm, a_first), ra, lane, mi);
        let ob = Emitter::ldm_offsets(p, Side::B, self.fb, (bn, b_first), rb, lane, ni / 2);

        let acc: Vec<Reg> = (0..mi * ni * 4).map(|_| p.mov(RegClass::F32, "f32", Imm::F32(0).into())).collect();

        // Prologue: steps 0 .. STAGES-1 into stages 0 .. STAGES-1.
        let kq = p.mov(RegClass::B32, "u32", k_start.map_or(Imm::U(0).into(), Opd::R));
        for st in 0..STAGES - 1 {
            let va = self.issue(p, &sa, (kq, &k_end), st * a_stage);
            let vb = self.issue(p, &sb, (kq, &k_end), st * b_stage);
            Emitter::store(p, &sa, &va, st * a_stage);
            Emitter::store(p, &sb, &vb, st * b_stage);
            p.op("cp.async.commit_group", &[]);
            p.op("add.u32", &[kq.into(), kq.into(), Imm::U(BK.into()).into()]);
        }

        // The loop, unrolled over the stages: copy `u` runs the steps `t ≡ u (mod
        // STAGES)`, reading stage `u` and writing stage `(u + STAGES - 1) mod STAGES`
        // (immediate offsets), leaving after the last step.
        let steps = plan.k_chunk / u64::from(BK);
        let step = p.mov(RegClass::B32, "u32", Imm::U(0).into());
        let ty = if plan.a.dtype == DType::F16 { "f16" } else { "bf16" };
        let mma = format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32");
        let ldm = |f: Feed| {
            format!(
                "ldmatrix.sync.aligned.m8n8.x4{}.shared.b16",
                if f.layout == Layout::RMajor { ".trans" } else { "" }
            )
        };
        let (head, exit) = (p.label(), p.label());
        p.place(head);
        for u in 0..STAGES {
            let wr = (u + STAGES - 1) % STAGES;
            p.op("cp.async.wait_group", &[Imm::I(i64::from(STAGES) - 2).into()]);
            p.op("bar.sync", &[Imm::I(0).into()]);
            let va = self.issue(p, &sa, (kq, &k_end), wr * a_stage);
            let vb = self.issue(p, &sb, (kq, &k_end), wr * b_stage);
            p.op("cp.async.commit_group", &[]);
            for kk in 0..2 {
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
            Emitter::store(p, &sa, &va, wr * a_stage);
            Emitter::store(p, &sb, &vb, wr * b_stage);
            p.op("add.u32", &[kq.into(), kq.into(), Imm::U(BK.into()).into()]);
            p.op("add.u32", &[step.into(), step.into(), Imm::U(1).into()]);
            let more = pred(p, "setp.lt.u32", step, Imm::U(steps).into());
            if u + 1 < STAGES {
                p.bra(Some((more, true)), exit);
            } else {
                p.bra(Some((more, false)), head);
            }
        }
        p.place(exit);
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
        contraction::epilogue(k, plan, p, &bases, (&rows, &cols, &vals), &bvars)
    }
}
