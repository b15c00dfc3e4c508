//! Contractions with few rows (`M ≤ 8`, and `M ≤ 16` where the tiled kernel's grid
//! would leave multiprocessors idle): a matrix–vector product, a classifier's fully
//! connected layers at batch 1, a convolution with a handful of output channels.
//!
//! The tiled kernel ([`super::contraction`]) gives each block a tile of at least 64
//! rows: at `M = 1` it computes 64 times the work it keeps, and its blocks each walk a
//! long stretch of `K` alone. A product with few rows is bound by reading `B` (each of
//! its elements is used `M` times), so this kernel is laid out for that read:
//!
//! - a block of 256 threads (8 warps) owns 32 consecutive columns of one batch, one per
//!   lane: a warp's loads of `B` at one `k` are 32 consecutive columns (one 128-byte
//!   line where the columns are contiguous), its loads of `A` one address (a
//!   broadcast);
//! - every thread keeps the `M` sums of its column in registers; warp `w` takes `k = w,
//!   w + 8, w + 16, …` of its block's part of `K`, [`UNROLL`] of them per loop trip,
//!   their loads issued before their multiply-adds so that many reads are in flight;
//! - the 8 warps' sums meet in shared memory and are added in warp order (warp `w`
//!   adds rows `w` and `w + 8`);
//! - where the column tiles alone leave the multiprocessors idle and `K` is long, a
//!   cluster of 2, 4 or 8 blocks shares each tile, rank `r` summing its own part of
//!   `K` ([`Skinny::of`]); after a cluster barrier, lane `l` of rank `l mod split`
//!   adds the ranks' sums in rank order through distributed shared memory (`mapa`,
//!   `ld.shared::cluster`); a last cluster barrier keeps every block's shared memory
//!   until all have read it. No workspace, no atomics, a fixed order of summation.
//!
//! The epilogue (bias, activation, residual, the store in the output's type) is the
//! tiled kernel's ([`super::contraction::epilogue`]), run by the thread that holds the
//! finished sum. Operand types are those of the f32 kernel, widened in the load
//! ([`super::contraction::load_f32`]): f32, f16 or bf16 for `A`, those or i8/u8/i16
//! for `B`; so half weights halve the bytes this kernel reads and it takes them in
//! place of the tensor-core kernel, whose 64-row tiles would be as empty.

use kiln_flow::Kernel;

use super::contraction::{
    batch_offsets, element_address, epilogue, linear, load_f32, map_offset, pred, stepped_address,
};
use super::contraction::{u32_op, Map, Plan, Var};
use super::contraction::{MAX_SPLIT, SMS};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::{internal, Entry, Launch, BLOCK};
use crate::CodegenError;

/// Rows this kernel always takes (one warp per row sums the warps' results).
pub const MAX_ROWS: u64 = (BLOCK / 32) as u64;

/// Most rows this kernel takes (each warp sums two rows): from `MAX_ROWS + 1` on, only
/// where the tiled kernel's grid would not fill the multiprocessors (a latency-bound
/// product, which a tile of 64 rows would compute at a quarter of its work or less).
pub const MOST_ROWS: u64 = 2 * MAX_ROWS;

/// Warps per block.
const WARPS: u32 = BLOCK / 32;

/// Reduction steps (each `WARPS` apart) a warp loads before it multiplies.
pub const UNROLL: u32 = 8;

/// Columns per block: one per lane.
pub const COLS: u64 = 32;

/// Shortest part of `K` a block of a split sums.
const MIN_PART: u64 = 32;

/// How a few-row contraction is spread over the grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skinny {
    /// Blocks (one cluster) sharing each column tile, each summing its own part of `K`.
    pub split: u32,
    /// `K` per block of a split.
    pub k_chunk: u64,
    /// Column tiles: batches × ⌈N / 32⌉.
    pub tiles: u64,
}

impl Skinny {
    /// The layout for `plan`, or `None` where it has more than [`MAX_ROWS`] rows and
    /// the tiled kernel's grid fills the multiprocessors, or more than [`MOST_ROWS`].
    /// The split is the largest power of two up to [`MAX_SPLIT`] that keeps the grid
    /// within two blocks per multiprocessor and each block's part of `K` at least 32
    /// long (1 where the plan has no clusters, [`Plan::clusters`]).
    pub fn of(plan: &Plan) -> Option<Skinny> {
        let [nb, m, n, kk] = plan.dims;
        if m > MOST_ROWS || (m > MAX_ROWS && plan.tile.blocks(nb, m, n) >= SMS) {
            return None;
        }
        let tiles = nb.saturating_mul(n.div_ceil(COLS));
        let mut split = 1u32;
        while plan.clusters
            && split < MAX_SPLIT
            && tiles.saturating_mul(u64::from(2 * split)) <= 2 * SMS
            && kk.div_ceil(u64::from(2 * split)) >= MIN_PART
        {
            split *= 2;
        }
        Some(Skinny { split, k_chunk: kk.div_ceil(u64::from(split)), tiles })
    }

    /// Blocks in the grid.
    pub fn grid(&self) -> u64 {
        self.tiles.saturating_mul(u64::from(self.split))
    }

    /// Block `bid`'s `(batch, first column, rank)`.
    pub fn block(&self, n: u64, bid: u64) -> (u64, u64, u32) {
        let split = u64::from(self.split);
        let (tile, rank) = (bid / split, bid % split);
        let nt = n.div_ceil(COLS);
        (tile / nt, (tile % nt) * COLS, rank as u32)
    }

    /// The reduction indices warp `w` of rank `rank` sums, in its order.
    pub fn k_of(&self, k_total: u64, rank: u32, w: u32) -> impl Iterator<Item = u64> {
        let start = u64::from(rank) * self.k_chunk;
        let end = (start + self.k_chunk).min(k_total);
        (start + u64::from(w)..end).step_by(WARPS as usize)
    }

    /// The rank of a split that sums lane `lane`'s column.
    pub fn owner(&self, lane: u32) -> u32 {
        lane % self.split
    }
}

/// The entry of `k` under `plan`, or why this kernel declines it.
pub fn emit(k: &Kernel, plan: &Plan) -> Result<Result<Entry, String>, CodegenError> {
    let Some(s) = Skinny::of(plan) else {
        return Ok(Err(format!("{} rows", plan.dims[1])));
    };
    if s.grid() > super::contraction::LIMIT {
        return Ok(Err(format!("{} blocks", s.grid())));
    }
    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    body(k, plan, s, &mut p)?;
    let text = p.finish().map_err(|e| internal(k, e))?;
    let [nb, m, n, kk] = plan.dims;
    let split = if s.split > 1 { format!(", split-K over clusters of {}", s.split) } else { String::new() };
    let note = format!(
        "contraction (few rows: a lane per column, {WARPS} warps along K, {} blocks{split}; batches {nb}, M {m}, N {n}, K {kk})",
        s.grid()
    );
    let launch = Launch { grid: s.grid(), block: BLOCK, shared: 0, params: (k.inputs.len() + 1) as u32 };
    Ok(Ok(Entry { text, launch, note }))
}

/// One operand's reads: per row (of `A`: each row; of `B`: the lane's column) the
/// element offset at `k = 0`, and where the reduction is one linear stride the address
/// of the first `k` the warp reads (stepped by the loop).
struct Operand {
    map: Map,
    size: i64,
    base: Reg,
    /// Element offset per unit of `k`, when linear.
    step: Option<i64>,
    offs: Vec<Reg>,
    ptrs: Vec<Reg>,
}

impl Operand {
    #[allow(clippy::too_many_arguments)]
    fn new(p: &mut Ptx, plan: &Plan, map: &Map, base: Reg, bat: Reg, rows: &[(Reg, &[Var])], k0: Reg) -> Operand {
        let size = map.dtype.storage_bytes(1) as i64;
        let step = linear(&plan.ks, map, UNROLL * WARPS);
        let mut offs = Vec::new();
        let mut ptrs = Vec::new();
        for &(r, vars) in rows {
            let off = map_offset(p, bat, map, vars, r);
            if let Some(st) = step {
                ptrs.push(stepped_address(p, off, (k0, st), (base, size)));
            }
            offs.push(off);
        }
        Operand { map: map.clone(), size, base, step, offs, ptrs }
    }

    /// Row `i`'s element at `k0 + u·WARPS` (the warp's `u`-th step of this trip), widened,
    /// 0 unless `ok`.
    fn load(&self, p: &mut Ptx, plan: &Plan, i: usize, (k0, u): (Reg, u32), ok: Reg) -> Reg {
        let addr = match self.step {
            Some(st) => Opd::Addr(self.ptrs[i], i64::from(u * WARPS) * st * self.size),
            None => {
                let k = u32_op(p, "add.u32", k0, Imm::U(u64::from(u * WARPS)).into());
                let off = map_offset(p, self.offs[i], &self.map, &plan.ks, k);
                Opd::Addr(element_address(p, off, (self.base, self.size)), 0)
            }
        };
        load_f32(p, self.map.dtype, ok, addr)
    }

    /// Steps the pointers by one trip.
    fn advance(&self, p: &mut Ptx) {
        if let Some(st) = self.step {
            for &a in &self.ptrs {
                p.op("add.s64", &[a.into(), a.into(), Imm::I(st * i64::from(UNROLL * WARPS) * self.size).into()]);
            }
        }
    }
}

fn body(k: &Kernel, plan: &Plan, s: Skinny, p: &mut Ptx) -> Result<(), CodegenError> {
    let [_, m, n, kk] = plan.dims;
    let rows = m as u32;
    let mut bases = Vec::new();
    for i in 0..k.inputs.len() + 1 {
        let raw = p.reg(RegClass::B64);
        p.op("ld.param.u64", &[raw.into(), p.param(i)]);
        let g = p.reg(RegClass::B64);
        p.op("cvta.to.global.u64", &[g.into(), raw.into()]);
        bases.push(g);
    }
    p.directive(&format!(".maxntid {BLOCK}, 1, 1"));
    if s.split > 1 {
        p.directive(&format!(".reqnctapercluster {}, 1, 1", s.split));
    }
    let tid = p.special("%tid.x");
    let bid = p.special("%ctaid.x");
    let lane = u32_op(p, "and.b32", tid, Imm::U(31).into());
    let warp = u32_op(p, "shr.u32", tid, Imm::U(5).into());
    // Block bid: tile bid / split (batch, column tile), rank bid % split (Skinny::block).
    let (tile, rank) = if s.split > 1 {
        let rank = p.special("%cluster_ctarank");
        (u32_op(p, "div.u32", bid, Imm::U(s.split.into()).into()), Some(rank))
    } else {
        (bid, None)
    };
    let nt = Imm::U(n.div_ceil(COLS));
    let ntile = u32_op(p, "rem.u32", tile, nt.into());
    let bi = u32_op(p, "div.u32", tile, nt.into());
    let n0 = u32_op(p, "mul.lo.u32", ntile, Imm::U(COLS).into());
    let col = u32_op(p, "add.u32", n0, lane.into());
    let col_ok = pred(p, "setp.lt.u32", col, Imm::U(n).into());
    // This block's part of K: [k_start, k_end); the warp starts at k_start + warp.
    let (k_start, k_end) = match rank {
        Some(r) => {
            let ks = u32_op(p, "mul.lo.u32", r, Imm::U(s.k_chunk).into());
            let e = u32_op(p, "add.u32", ks, Imm::U(s.k_chunk).into());
            (ks, u32_op(p, "min.u32", e, Imm::U(kk).into()))
        }
        None => (p.mov(RegClass::B32, "u32", Imm::U(0).into()), p.mov(RegClass::B32, "u32", Imm::U(kk).into())),
    };
    let k0 = u32_op(p, "add.u32", k_start, warp.into());
    let (bvars, a_bat, b_bat) = batch_offsets(p, plan, bi);
    let row_regs: Vec<Reg> = (0..rows).map(|i| p.mov(RegClass::B32, "u32", Imm::U(i.into()).into())).collect();
    let a_rows: Vec<(Reg, &[Var])> = row_regs.iter().map(|&r| (r, plan.rows.as_slice())).collect();
    let a = Operand::new(p, plan, &plan.a, bases[plan.a.input], a_bat, &a_rows, k0);
    let b = Operand::new(p, plan, &plan.b, bases[plan.b.input], b_bat, &[(col, plan.cols.as_slice())], k0);

    let acc: Vec<Reg> = (0..rows).map(|_| p.mov(RegClass::F32, "f32", Imm::F32(0).into())).collect();
    let trips = s.k_chunk.div_ceil(u64::from(UNROLL * WARPS));
    let trip = p.mov(RegClass::B32, "u32", Imm::U(0).into());
    let head = p.label();
    p.place(head);
    // Loads of UNROLL steps first, then their multiply-adds.
    let mut loaded = Vec::new();
    for u in 0..UNROLL {
        let ku = u32_op(p, "add.u32", k0, Imm::U(u64::from(u * WARPS)).into());
        let k_ok = pred(p, "setp.lt.u32", ku, k_end.into());
        let ok = p.reg(RegClass::Pred);
        p.op("and.pred", &[ok.into(), k_ok.into(), col_ok.into()]);
        let bv = b.load(p, plan, 0, (k0, u), ok);
        let av: Vec<Reg> = (0..rows as usize).map(|i| a.load(p, plan, i, (k0, u), k_ok)).collect();
        loaded.push((av, bv));
    }
    for (av, bv) in loaded {
        for (&c, x) in acc.iter().zip(av) {
            p.op("fma.rn.f32", &[c.into(), x.into(), bv.into(), c.into()]);
        }
    }
    p.op("add.u32", &[k0.into(), k0.into(), Imm::U(u64::from(UNROLL * WARPS)).into()]);
    a.advance(p);
    b.advance(p);
    p.op("add.u32", &[trip.into(), trip.into(), Imm::U(1).into()]);
    let more = pred(p, "setp.lt.u32", trip, Imm::U(trips).into());
    p.bra(Some((more, false)), head);

    // The warps' sums: red[w][i][lane]; then warp `w` adds rows `w + 8q` (those below
    // M) in warp order.
    let red_bytes = WARPS * rows * 32 * 4;
    let part_bytes = rows * 32 * 4;
    let smem = p.shared("sums", red_bytes + part_bytes, 16);
    let s0 = p.mov(RegClass::B32, "u32", Opd::Sym(smem));
    let lane4 = u32_op(p, "shl.b32", lane, Imm::U(2).into());
    let mine = p.reg(RegClass::B32);
    p.op("mad.lo.u32", &[mine.into(), warp.into(), Imm::U(u64::from(rows * 128)).into(), lane4.into()]);
    let mine = u32_op(p, "add.u32", mine, s0.into());
    for (i, &c) in acc.iter().enumerate() {
        p.op("st.shared.f32", &[Opd::Addr(mine, i as i64 * 128), c.into()]);
    }
    p.op("bar.sync", &[Imm::I(0).into()]);
    // Row `warp + 8q`'s sums of lane `lane`: red + (w·M + warp + 8q)·128 + lane·4, and
    // its finished sum part[warp + 8q][lane] (a split).
    let at = p.reg(RegClass::B32);
    p.op("mad.lo.u32", &[at.into(), warp.into(), Imm::U(128).into(), lane4.into()]);
    let at = u32_op(p, "add.u32", at, s0.into());
    let groups = rows.div_ceil(WARPS);
    let row_of: Vec<(Reg, Reg, i64)> = (0..groups)
        .map(|q| {
            let r = u32_op(p, "add.u32", warp, Imm::U(u64::from(WARPS * q)).into());
            let ok = pred(p, "setp.lt.u32", r, Imm::U(m).into());
            (r, ok, i64::from(WARPS * q * 128))
        })
        .collect();
    match rank {
        None => {
            for &(r, ok, off) in &row_of {
                let skip = p.label();
                p.branch(Some((ok, true)), skip);
                let sum = warp_sum(p, (at, off), rows);
                epilogue(k, plan, p, &bases, (&[r], &[col], &[sum]), &bvars, false)?;
                p.place(skip);
            }
        }
        Some(rank) => {
            let part = u32_op(p, "add.u32", at, Imm::U(u64::from(red_bytes)).into());
            for &(_, ok, off) in &row_of {
                let skip = p.label();
                p.branch(Some((ok, true)), skip);
                let sum = warp_sum(p, (at, off), rows);
                p.op("st.shared.f32", &[Opd::Addr(part, off), sum.into()]);
                p.place(skip);
            }
            p.op("barrier.cluster.arrive", &[]);
            p.op("barrier.cluster.wait", &[]);
            // Lane l's column is summed by rank l mod split (Skinny::owner).
            let owner = u32_op(p, "rem.u32", lane, Imm::U(s.split.into()).into());
            let is_owner = pred(p, "setp.eq.u32", owner, rank.into());
            for &(r, ok, off) in &row_of {
                let skip = p.label();
                let go = p.reg(RegClass::Pred);
                p.op("and.pred", &[go.into(), is_owner.into(), ok.into()]);
                p.branch(Some((go, true)), skip);
                let mut total = acc[0];
                for x in 0..s.split {
                    let remote = p.reg(RegClass::B32);
                    p.op("mapa.shared::cluster.u32", &[remote.into(), part.into(), Imm::U(x.into()).into()]);
                    let v = p.reg(RegClass::F32);
                    p.op("ld.shared::cluster.f32", &[v.into(), Opd::Addr(remote, off)]);
                    total = if x == 0 {
                        v
                    } else {
                        let d = p.reg(RegClass::F32);
                        p.op("add.rn.f32", &[d.into(), total.into(), v.into()]);
                        d
                    };
                }
                epilogue(k, plan, p, &bases, (&[r], &[col], &[total]), &bvars, false)?;
                p.place(skip);
            }
            p.op("barrier.cluster.arrive", &[]);
            p.op("barrier.cluster.wait", &[]);
        }
    }
    Ok(())
}

/// The sum over the warps `w = 0 .. 8` of the shared f32 at `at + off + w·rows·128`, in
/// warp order.
fn warp_sum(p: &mut Ptx, (at, off): (Reg, i64), rows: u32) -> Reg {
    let mut sum = p.reg(RegClass::F32);
    p.op("ld.shared.f32", &[sum.into(), Opd::Addr(at, off)]);
    for w in 1..WARPS {
        let v = p.reg(RegClass::F32);
        p.op("ld.shared.f32", &[v.into(), Opd::Addr(at, off + i64::from(w * rows * 128))]);
        let d = p.reg(RegClass::F32);
        p.op("add.rn.f32", &[d.into(), sum.into(), v.into()]);
        sum = d;
    }
    sum
}
