//! Contraction kernels (matrix products, batched products, convolutions as implicit
//! GEMM) as register-tiled SIMT kernels in exact f32 FMA.
//!
//! # The mapping
//!
//! [`Plan::of`] takes [`Contraction::of`]'s operands (two loads `A`, `B` at affine flat
//! offsets, their product summed over the reduction variables) and sorts every output
//! variable of extent above 1 into one of three sets, by which operand reads it:
//! - a *column* variable: `A` does not read it (the image positions of a convolution,
//!   the columns of a product, a broadcast axis);
//! - a *row* variable: `A` reads it and `B` does not (output channels, product rows);
//! - a *batch* variable: both read it (a batched product, a convolution's group).
//!
//! `M`, `N` and the batch count are the products of each set's extents, `K` the
//! product of the reduction variables' extents; a row, column, batch or `k` index is
//! taken apart into its variables row-major (outermost first, [`split`]). The kernel
//! computes `C[batch][m][n] = Σ_k A(batch, m, k) · B(batch, n, k)` where each operand
//! element is read at `c + Σ coef(v)·v` of the kernel's own affine offset: a
//! convolution's image is read through its window map as it is (implicit GEMM, no
//! im2col buffer), and any transpose of either operand is only a different set of
//! coefficients.
//!
//! # The kernel
//!
//! One block of 256 threads computes a `BM × BN` tile of one batch ([`Tile`]); tile
//! `bid / split` of the one-dimensional grid is `(batch, mtile, ntile)` with `ntile`
//! fastest ([`Plan::block`]; `split` is 1 but for split-K, below), and the grid is
//! exactly `batches · ⌈M/BM⌉ · ⌈N/BN⌉ · split` blocks ([`Plan::grid`]). Thread
//! `tid` is `(ty, tx) = (tid / 16, tid % 16)` and owns the `TM × TN` accumulators of
//! tile rows `(i / 4)·64 + 4·ty + i % 4` and tile columns `(j / 4)·64 + 4·tx + j % 4`
//! ([`Tile::row`], [`Tile::col`]), all in registers with fixed names.
//!
//! The reduction walks `K` in steps of `BK = 16`. Shared memory holds two buffers per
//! operand, each `BK` rows of `BM + 4` (or `BN + 4`) f32 (`As[buf][k][m]`,
//! `Bs[buf][k][n]`). Each thread loads `R·BK/256` elements of each operand per step
//! ([`Slot`]), in one of two orders chosen per operand so that a warp reads memory
//! along the operand's smaller stride ([`Order`]): along `k` (8 consecutive `k` of 4
//! rows per warp) or along the rows (`r = tid % R`, `k = tid / R + (256/R)·e`).
//! Either way element `(k, r)` goes to shared slot `k·(R + 4) + r`: the 4 floats of
//! padding put the 8 `k` rows a warp writes in the `k` order in distinct banks, and keep
//! every row 16-byte aligned for the `ld.shared.v4` reads. A load is predicated on
//! `r < R_total && k < K` and writes 0 where it does not hold: nothing is read out of
//! range, and the zeros add nothing.
//!
//! The pipeline (register prefetch, one barrier per step), with `T = ⌈K / BK⌉`:
//! ```text
//! load step 0 → regs; regs → buf 0; bar          (rd = buf 0, wr = buf 1)
//! for t in 0..T:
//!     load step t+1 → regs   (at t = T-1 every k ≥ K: all predicated off, zeros)
//!     compute from rd        (BK × (TM/4 + TN/4) ld.shared.v4 and TM·TN fma.rn.f32)
//!     regs → wr
//!     bar
//!     swap rd, wr
//! ```
//! Invariants: a thread writes `wr` in step `t` only after the barrier that ended step
//! `t - 1`, by which every thread has finished reading `wr` (it was `rd` in step
//! `t - 1`); a thread reads `rd` in step `t` only after the barrier that ended step
//! `t - 1`, after every thread stored it. So one barrier per step suffices.
//!
//! The epilogue: for each of the thread's rows in range (`m < M`) and each column in
//! range (`n < N`), the kernel's root expression is evaluated by [`Eval`] with the
//! reduction node given as that accumulator, and stored at the output's row-major
//! offset; 4 consecutive columns with one `st.global.v4.f32` where the output's layout
//! allows ([`Plan::vector_store`]). Nodes that read neither a column variable nor the
//! reduction (a bias per output channel) are evaluated once per row. Elements out of
//! range are branched over (their epilogue loads would be out of range).
//!
//! # Split-K in a cluster
//!
//! Where the tiles leave most of the 132 multiprocessors idle and `K` is long (the
//! 7×7 layers of a classifier: `M` a few hundred, `N = 49`, `K` up to 960), each tile
//! is shared by a cluster of 2, 4 or 8 consecutive blocks ([`choose_split`],
//! `.reqnctapercluster`): rank `r` sums `k` in `[r·Kc, min((r+1)·Kc, K))`, writes its
//! partial tile to its own shared memory, and after a cluster barrier sums rows
//! `r·64/split ..` of all the partial tiles in rank order through distributed shared
//! memory (`mapa`, `ld.shared::cluster`) and runs the epilogue on them
//! ([`reduce_slot`]); a last cluster barrier keeps every block's shared memory until
//! all have read it. No workspace, no atomics, a fixed summation order. The default
//! splits only 64×64 tiles; the reduction takes any tile and split (rank `r` owns rows
//! `r·BM/split ..`, `BN/4` threads along a row), which the measurement knob
//! (`KILN_CUDA_TUNE=f32=BMxBNsS`, [`super::tune`]) uses: a partial tile over 48 KiB
//! (128×128) is dynamic shared memory.
//!
//! # Tiles
//!
//! [`choose_tile`]: of `128×128` (8×8 per thread), `128×64`, `64×128` and `64×64` (4×4
//! per thread), the one whose busiest multiprocessor has the least work,
//! `⌈blocks / 132⌉ · BM · BN` weighted by the thread tile's cost per element
//! ([`Tile::cost`]): large tiles where the grid fills the H200's 132 multiprocessors
//! anyway, smaller ones where it would not.
//!
//! # Declined (to the general mapping)
//!
//! Operands laid out in CPU panels, operand storage other than f32 (and i8/u8/i16
//! weights, converted in the load), extents or offsets beyond 32-bit tile arithmetic
//! (`M`, `N`, `K`, batches ≥ 2³¹, coefficients outside i32, a grid over 2³¹ − 1
//! blocks). The recogniser already keeps out every product that is not a plain
//! multiply-accumulate of two loads, operands in padded loads (the compiler splits the
//! padding into its own kernel first) and a right operand read across its columns.

use std::collections::HashSet;

use kiln_flow::contraction::{Contraction, Operand};
use kiln_flow::{Expr, ExprId, Kernel, ScalarType};
use kiln_ir::DType;

use super::expr::Eval;
use super::ptx::{Imm, Label, Opd, Ptx, Reg, RegClass};
use super::tune::Tune;
use super::{internal, Entry, Launch, BLOCK};
use crate::CodegenError;

/// Multiprocessors of the H200 (and H100 SXM).
pub const SMS: u64 = 132;

/// The reduction step: `k` values per shared-memory buffer.
pub const BK: u32 = 16;

/// f32 of padding per `k` row of a shared buffer.
pub const PAD: u32 = 4;

/// Largest extent, count or grid the 32-bit tile arithmetic takes.
pub const LIMIT: u64 = (1 << 31) - 1;

/// A block's tile: each of the 16 × 16 threads holds `tm × tn` accumulators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tile {
    /// Rows per thread (4 or 8).
    pub tm: u32,
    /// Columns per thread (4 or 8).
    pub tn: u32,
}

impl Tile {
    /// Rows per block.
    pub fn bm(self) -> u32 {
        16 * self.tm
    }

    /// Columns per block.
    pub fn bn(self) -> u32 {
        16 * self.tn
    }

    /// Blocks covering `batches` × `m` × `n`.
    pub fn blocks(self, batches: u64, m: u64, n: u64) -> u64 {
        batches.saturating_mul(m.div_ceil(u64::from(self.bm()))).saturating_mul(n.div_ceil(u64::from(self.bn())))
    }

    /// The tile row of thread row `ty`'s `i`-th accumulator row.
    pub fn row(self, ty: u32, i: u32) -> u32 {
        (i / 4) * 64 + 4 * ty + i % 4
    }

    /// The tile column of thread column `tx`'s `j`-th accumulator column.
    pub fn col(self, tx: u32, j: u32) -> u32 {
        (j / 4) * 64 + 4 * tx + j % 4
    }

    /// Bytes of one shared buffer of `rows` tile rows.
    fn buffer(rows: u32) -> u32 {
        BK * (rows + PAD) * 4
    }

    /// Bytes of shared memory a block uses: two buffers of each operand.
    pub fn shared_bytes(self) -> u32 {
        2 * Tile::buffer(self.bm()) + 2 * Tile::buffer(self.bn())
    }
}

impl Tile {
    /// The relative time per tile element (×20) of a thread tile: more accumulators
    /// per thread need fewer shared loads and less loop overhead per FMA (8×8: 2 + 2
    /// `ld.shared.v4` per 64 FMAs; 8×4: 3 per 32; 4×4: 2 per 16).
    pub fn weight(self) -> u64 {
        match self.tm * self.tn {
            64 => 20,
            32 => 23,
            _ => 28,
        }
    }

    /// The model time of `batches` products of `m × n` under this tile: the work of the
    /// busiest multiprocessor, `⌈blocks / SMS⌉ · BM · BN · weight`.
    pub fn cost(self, batches: u64, m: u64, n: u64) -> u64 {
        let waves = self.blocks(batches, m, n).div_ceil(SMS);
        waves.saturating_mul(u64::from(self.bm() * self.bn()) * self.weight())
    }
}

/// The tile for `batches` products of `m × n`: the least [`Tile::cost`] among 128×128,
/// 128×64, 64×128 and 64×64 (on a tie the earlier: the larger tile, and of the two
/// halves the one whose short side lies along the smaller of `m`, `n`).
pub fn choose_tile(batches: u64, m: u64, n: u64) -> Tile {
    let (tall, wide) = (Tile { tm: 8, tn: 4 }, Tile { tm: 4, tn: 8 });
    let halves = if m >= n { [tall, wide] } else { [wide, tall] };
    let all = [Tile { tm: 8, tn: 8 }, halves[0], halves[1], Tile { tm: 4, tn: 4 }];
    let mut best = all[0];
    for t in all {
        if t.cost(batches, m, n) < best.cost(batches, m, n) {
            best = t;
        }
    }
    best
}

/// Most blocks of a split (a portable cluster holds 8).
pub const MAX_SPLIT: u32 = 8;

/// How many blocks share each output tile of a grid of `blocks` tiles, each summing
/// `K / split` (a split-K within one thread-block cluster, summed through distributed
/// shared memory): where the grid leaves at least half of the 132 multiprocessors idle
/// and `K` is long, the largest power of two up to [`MAX_SPLIT`] that keeps the grid
/// within one wave and each part at least 64 long. Only 64×64 tiles split (their
/// partial sums, 16 KiB, fit the operand buffers).
pub fn choose_split(tile: Tile, blocks: u64, k: u64) -> u32 {
    if tile != (Tile { tm: 4, tn: 4 }) || blocks.saturating_mul(2) > SMS {
        return 1;
    }
    let mut s = 1;
    while s < MAX_SPLIT && blocks * u64::from(2 * s) <= SMS && k.div_ceil(u64::from(2 * s)) >= 64 {
        s *= 2;
    }
    s
}

/// A 128×128 tile split over `K` in place of `chosen` (a tile that does not split): where
/// a grid of 128×128 tiles leaves at least half of the multiprocessors idle, the largest
/// power of two `s` up to [`MAX_SPLIT`] that keeps the grid within one wave with parts
/// of `K / s ≥ 256`, taken where its modelled time, [`Tile::cost`] over `s`, is below
/// `chosen`'s. An 8×8 thread tile needs the fewest shared loads per FMA, and the split
/// gives back the blocks the larger tile takes away. Measured on an H100 (`KILN_CUDA_TUNE`
/// sweep, docs/cuda.md): a 1024³ product 73.7 µs as 128 blocks of 128×64, 68.3 µs as
/// 64 tiles of 128×128 split in two.
pub fn split_large_tile(batches: u64, m: u64, n: u64, k: u64, chosen: Tile) -> Option<(Tile, u32)> {
    let big = Tile { tm: 8, tn: 8 };
    let blocks = big.blocks(batches, m, n);
    if chosen == big || blocks.saturating_mul(2) > SMS {
        return None;
    }
    let mut s = 1u32;
    while s < MAX_SPLIT && blocks * u64::from(2 * s) <= SMS && k.div_ceil(u64::from(2 * s)) >= 256 {
        s *= 2;
    }
    (s > 1 && big.cost(batches, m, n) / u64::from(s) < chosen.cost(batches, m, n)).then_some((big, s))
}

/// Where thread `tid` of rank `rank` of a split of `split` sums the partial tiles of a
/// `BM × BN` tile: rows `rank·BM/split ..` are that rank's, and each of their groups of
/// 4 columns goes to one thread, `G = BN/4` threads along a row (`q`-th group of the
/// thread: row `rank·BM/split + tid/G + (256/G)·q`, columns `4·(tid % G) ..+4`); `None`
/// where the thread has no `q`-th group.
pub fn reduce_slot(tile: Tile, split: u32, rank: u32, tid: u32, q: u32) -> Option<(u32, u32)> {
    let (rows, g) = (tile.bm() / split, tile.bn() / 4);
    let r = tid / g + (BLOCK / g) * q;
    (r < rows).then_some((rank * rows + r, 4 * (tid % g)))
}

/// Groups a thread sums per rank of a split of `split` of a `BM × BN` tile: `BM·BN /
/// (4·split·256)`, at least one (64×64 split over 8: half the threads have none).
pub fn reduce_groups(tile: Tile, split: u32) -> u32 {
    (tile.bm() * tile.bn() / 4 / split / BLOCK).max(1)
}

/// An operand's flat element offset: `c + Σ coef[v]·v` over the kernel's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Map {
    /// The kernel input it reads.
    pub input: usize,
    /// The input's storage type (f32, or an integer converted to f32 in the load).
    pub dtype: DType,
    /// The constant term.
    pub c: i64,
    /// One coefficient per kernel variable.
    pub coef: Vec<i64>,
}

impl Map {
    fn of(o: &Operand) -> Map {
        Map { input: o.input as usize, dtype: o.dtype, c: o.offset.c, coef: o.offset.coef.clone() }
    }

    /// The coefficient of variable `v`.
    pub fn at(&self, v: u32) -> i64 {
        self.coef.get(v as usize).copied().unwrap_or(0)
    }
}

/// A variable and its extent.
pub type Var = (u32, u64);

/// How a kernel maps onto tiles (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// Batch variables, outermost first.
    pub batch: Vec<Var>,
    /// Row variables.
    pub rows: Vec<Var>,
    /// Column variables.
    pub cols: Vec<Var>,
    /// Reduction variables of extent above 1.
    pub ks: Vec<Var>,
    /// Output variables of extent 1 (always 0).
    pub ones: Vec<u32>,
    /// Batch count, `M`, `N`, `K`.
    pub dims: [u64; 4],
    /// The row operand (reads no column variable).
    pub a: Map,
    /// The column operand.
    pub b: Map,
    /// The output's row-major element stride per output variable.
    pub out: Vec<i64>,
    /// The block tile.
    pub tile: Tile,
    /// Blocks (one cluster) sharing each output tile, each summing its own part of
    /// `K` ([`choose_split`]); 1: none.
    pub split: u32,
    /// Whether `K` may be split over the blocks of a cluster at all (false on
    /// [`super::tune::Arch::Sm80`], which has no clusters: `split` stays 1 there).
    pub clusters: bool,
    /// `K` per block of a split: a multiple of [`BK`].
    pub k_chunk: u64,
    /// The reduction node (the accumulator in the epilogue).
    pub reduce: ExprId,
    /// The output's storage type.
    pub out_dtype: DType,
}

/// `x` taken apart into `vars` row-major (outermost first): the innermost is `x mod
/// extent`, and so on outwards; the outermost takes what is left (equal to its value
/// when `x` is below the product of the extents). What the PTX's [`split_regs`] computes.
pub fn split(vars: &[Var], x: u64) -> Vec<u64> {
    let mut out = vec![0; vars.len()];
    let mut rest = x;
    for d in (0..vars.len()).rev() {
        if d == 0 {
            out[0] = rest;
        } else {
            out[d] = rest % vars[d].1;
            rest /= vars[d].1;
        }
    }
    out
}

impl Plan {
    /// The plan of `k`, or why this emitter declines it.
    pub fn of(k: &Kernel) -> Result<Plan, String> {
        let c = Contraction::of(k).ok_or("not a recognised contraction")?;
        if c.a.panel.is_some() || c.b.panel.is_some() {
            return Err("an operand laid out in CPU panels".into());
        }
        let (a, b) = (Map::of(&c.a), Map::of(&c.b));
        let float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
        if !float(a.dtype) || !(float(b.dtype) || matches!(b.dtype, DType::I8 | DType::U8 | DType::I16)) {
            return Err(format!("{} × {} operands", a.dtype.name(), b.dtype.name()));
        }
        let ext = |v: u32| k.vars.get(v as usize).copied().unwrap_or(0);
        let (mut batch, mut rows, mut cols, mut ones) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for v in 0..k.out_rank() as u32 {
            let e = ext(v);
            if e == 1 {
                ones.push(v);
            } else if a.at(v) == 0 {
                cols.push((v, e));
            } else if b.at(v) == 0 {
                rows.push((v, e));
            } else {
                batch.push((v, e));
            }
        }
        let Expr::Reduce { vars, .. } = &k.node(c.reduce).expr else {
            return Err("no reduction".into());
        };
        let ks: Vec<Var> = vars.iter().map(|v| (v.0, ext(v.0))).filter(|&(_, e)| e != 1).collect();
        let prod = |vs: &[Var]| vs.iter().try_fold(1u64, |acc, &(_, e)| acc.checked_mul(e));
        let dims = [prod(&batch), prod(&rows), prod(&cols), prod(&ks)];
        let [Some(nb), Some(m), Some(n), Some(kk)] = dims else {
            return Err("extents overflow".into());
        };
        if [nb, m, n, kk].iter().any(|&d| d == 0 || d > LIMIT) {
            return Err(format!("batches {nb}, M {m}, N {n}, K {kk} beyond 32-bit tile arithmetic"));
        }
        let dims = out_strides(k);
        let fits = |x: i64| i32::try_from(x).is_ok();
        if !a.coef.iter().chain(&b.coef).chain(&dims).all(|&x| fits(x)) {
            return Err("an offset coefficient outside i32".into());
        }
        let tile = choose_tile(nb, m, n);
        let split = choose_split(tile, tile.blocks(nb, m, n), kk);
        let k_chunk = kk.div_ceil(u64::from(split)).div_ceil(u64::from(BK)) * u64::from(BK);
        let plan = Plan {
            batch,
            rows,
            cols,
            ks,
            ones,
            dims: [nb, m, n, kk],
            a,
            b,
            out: dims,
            tile,
            split,
            clusters: true,
            k_chunk,
            reduce: c.reduce,
            out_dtype: k.output.dtype,
        };
        if plan.grid() > LIMIT {
            return Err(format!("{} blocks", plan.grid()));
        }
        Ok(plan)
    }

    /// This plan with tile `tile` and a split of `split` (each block's part of `K` a
    /// multiple of [`BK`]), or why not (a grid beyond 32-bit arithmetic).
    pub fn retiled(&self, tile: Tile, split: u32) -> Result<Plan, String> {
        let kk = self.dims[3];
        let mut p = self.clone();
        p.tile = tile;
        p.split = if self.clusters { split } else { 1 };
        p.k_chunk = kk.div_ceil(u64::from(p.split)).div_ceil(u64::from(BK)) * u64::from(BK);
        if p.grid() > LIMIT {
            return Err(format!("{} blocks", p.grid()));
        }
        Ok(p)
    }

    /// This plan on a GPU without thread-block clusters: the same tile, `K` never
    /// split (see [`Plan::clusters`]).
    pub fn without_clusters(&self) -> Result<Plan, String> {
        let mut p = self.retiled(self.tile, 1)?;
        p.clusters = false;
        Ok(p)
    }

    /// Bytes of shared memory a block of the f32 kernel uses: the operand buffers, and
    /// for a split its partial tile (`BM·BN` f32) over them.
    pub fn shared_bytes(&self) -> u32 {
        let t = self.tile;
        if self.split > 1 {
            t.shared_bytes().max(t.bm() * t.bn() * 4)
        } else {
            t.shared_bytes()
        }
    }

    /// Whether the epilogue stores each thread's groups of 4 consecutive columns with one
    /// `st.global.v4.f32`: the innermost column variable is the output's innermost axis
    /// (stride 1) and its extent a multiple of 4, so that 4 columns from a multiple of 4
    /// are 4 consecutive elements at a 16-byte aligned offset (every other stride is a
    /// multiple of that extent), and in range together (`N` is a multiple of 4 too); and
    /// the output stores f32.
    pub fn vector_store(&self) -> bool {
        self.out_dtype == DType::F32
            && self.cols.last().is_some_and(|&(v, e)| self.out.get(v as usize) == Some(&1) && e % 4 == 0)
    }

    /// Whether an epilogue whose threads hold pairs of consecutive columns from an even
    /// one stores each pair with one `st.global.v2.f32` / `st.global.b32` (two halves):
    /// the innermost column variable is the output's innermost axis (stride 1) and its
    /// extent even, so that such a pair is two consecutive elements at an even offset
    /// (every other stride is a multiple of that extent) in range together (`N` even);
    /// the output stores f32, f16 or bf16.
    pub fn pair_store(&self) -> bool {
        matches!(self.out_dtype, DType::F32 | DType::F16 | DType::BF16)
            && self.cols.last().is_some_and(|&(v, e)| self.out.get(v as usize) == Some(&1) && e % 2 == 0)
    }

    /// Blocks in the grid: batches × row tiles × column tiles × split.
    pub fn grid(&self) -> u64 {
        let [nb, m, n, _] = self.dims;
        self.tile.blocks(nb, m, n).saturating_mul(u64::from(self.split))
    }

    /// Output tile `tile`'s `(batch, first row, first column)`; block `bid` computes
    /// tile `bid / split`, reduction part `bid % split` (its rank in its cluster).
    pub fn block(&self, tile: u64) -> (u64, u64, u64) {
        let [_, m, n, _] = self.dims;
        let nt = n.div_ceil(u64::from(self.tile.bn()));
        let mt = m.div_ceil(u64::from(self.tile.bm()));
        let rest = tile / nt;
        (rest / mt, (rest % mt) * u64::from(self.tile.bm()), (tile % nt) * u64::from(self.tile.bn()))
    }

    fn sum(map_c: i64, coef: impl Fn(u32) -> i64, vars: &[Var], x: u64) -> i64 {
        let vals = split(vars, x);
        vars.iter().zip(vals).fold(map_c, |acc, (&(v, _), x)| acc.wrapping_add(coef(v).wrapping_mul(x as i64)))
    }

    /// The element offset the kernel reads `A` at for batch `bi`, row `m` and
    /// reduction index `kk` (the PTX's arithmetic, on the host).
    pub fn a_offset(&self, bi: u64, m: u64, kk: u64) -> i64 {
        let f = |v| self.a.at(v);
        let o = Plan::sum(self.a.c, f, &self.batch, bi);
        let o = Plan::sum(o, f, &self.rows, m);
        Plan::sum(o, f, &self.ks, kk)
    }

    /// The element offset the kernel reads `B` at for batch `bi`, column `n` and
    /// reduction index `kk`.
    pub fn b_offset(&self, bi: u64, n: u64, kk: u64) -> i64 {
        let f = |v| self.b.at(v);
        let o = Plan::sum(self.b.c, f, &self.batch, bi);
        let o = Plan::sum(o, f, &self.cols, n);
        Plan::sum(o, f, &self.ks, kk)
    }

    /// The output element offset of `(bi, m, n)`.
    pub fn out_offset(&self, bi: u64, m: u64, n: u64) -> i64 {
        let f = |v: u32| self.out.get(v as usize).copied().unwrap_or(0);
        let o = Plan::sum(0, f, &self.batch, bi);
        let o = Plan::sum(o, f, &self.rows, m);
        Plan::sum(o, f, &self.cols, n)
    }

    /// The output variables' values at `(bi, m, n)` (what the epilogue sets).
    pub fn out_index(&self, bi: u64, m: u64, n: u64) -> Vec<u64> {
        let mut idx = vec![0; self.out.len()];
        for (vars, x) in [(&self.batch, bi), (&self.rows, m), (&self.cols, n)] {
            for (&(v, _), x) in vars.iter().zip(split(vars, x)) {
                idx[v as usize] = x;
            }
        }
        idx
    }

    /// The reduction variables' values at `kk`.
    pub fn k_index(&self, kk: u64) -> Vec<(u32, u64)> {
        self.ks.iter().map(|&(v, _)| v).zip(split(&self.ks, kk)).collect()
    }
}

/// The row-major element strides of `k`'s output.
fn out_strides(k: &Kernel) -> Vec<i64> {
    let dims = k.output.shape.dims();
    let mut s = vec![0i64; dims.len()];
    let mut w = 1i64;
    for d in (0..dims.len()).rev() {
        s[d] = w;
        w = w.saturating_mul(dims[d] as i64);
    }
    s
}

/// The reduction's offset per unit of `k` for `map`, when the reduction variables `ks`
/// are one linear stride in it (each variable's coefficient the next one's times its
/// extent; 0 when there are none), and a pointer stepping `bk` of them (at up to 8
/// bytes an element) stays within an i32 immediate.
pub fn linear(ks: &[Var], map: &Map, bk: u32) -> Option<i64> {
    for w in ks.windows(2) {
        let inner = map.at(w[1].0).checked_mul(i64::try_from(w[1].1).ok()?)?;
        if map.at(w[0].0) != inner {
            return None;
        }
    }
    let step = ks.last().map_or(0, |&(v, _)| map.at(v));
    // The pointer steps `bk · step · size` bytes per step, and a slot's offset from
    // its row's pointer is less: keep them in i32 (an address's immediate).
    i32::try_from(step.checked_mul(i64::from(bk) * 8)?).ok().map(|_| step)
}

/// The order in which a block's threads load an operand tile (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Consecutive threads take consecutive `k`: 8 of them, then the next row.
    AlongK,
    /// Consecutive threads take consecutive rows: `r = tid % R`, `k = tid / R + (256/R)·e`.
    AlongRows,
}

impl Order {
    /// The order for an operand whose innermost tile variable steps `r_step` elements
    /// and whose innermost reduction variable steps `k_step` (`None`: no such
    /// variable): along the rows when their step is not the larger.
    pub fn of(r_step: Option<i64>, k_step: Option<i64>) -> Order {
        match (r_step, k_step) {
            (None, _) => Order::AlongK,
            (_, None) => Order::AlongRows,
            (Some(r), Some(k)) if r.unsigned_abs() <= k.unsigned_abs() => Order::AlongRows,
            _ => Order::AlongK,
        }
    }

    /// Slot `e` of thread `tid`: `(k, r)` within a tile of `rows` rows. Along `k`, a
    /// warp takes 8 consecutive `k` of 4 rows (`k = tid % 8 + 8·(e % (BK/8))`, `r = tid
    /// / 8 + 32·(e / (BK/8))`), so that its 32 shared stores fall in 32 banks.
    pub fn slot(self, rows: u32, tid: u32, e: u32) -> (u32, u32) {
        let kg = BK / 8;
        match self {
            Order::AlongK => (tid % 8 + 8 * (e % kg), tid / 8 + (BLOCK / 8) * (e / kg)),
            Order::AlongRows => (tid / rows + (BLOCK / rows) * e, tid % rows),
        }
    }
}

/// Elements of a `rows × BK` tile each thread loads.
pub fn slots(rows: u32) -> u32 {
    rows * BK / BLOCK
}

/// The entry of `k`, or why this emitter declines it.
pub fn emit(k: &Kernel, tune: &Tune) -> Result<Result<Entry, String>, CodegenError> {
    let plan = match Plan::of(k) {
        // Without clusters (sm_80) no block shares its tile's `K` with others.
        Ok(p) if !tune.arch.clusters() => match p.without_clusters() {
            Ok(p) => p,
            Err(why) => return Ok(Err(why)),
        },
        Ok(p) => p,
        Err(why) => return Ok(Err(why)),
    };
    // Few rows (`skinny::Skinny::of` says which): a lane per column (any operand types,
    // widened in the loads).
    if let Ok(e) = super::skinny::emit(k, &plan)? {
        return Ok(Ok(e));
    }
    // Half operands: the tensor cores, or why not (then f32 FMA, widening in the loads).
    let half = |d: DType| matches!(d, DType::F16 | DType::BF16);
    let mut declined = String::new();
    if half(plan.a.dtype) || half(plan.b.dtype) {
        // Hopper's warpgroup MMA where both operands stream in 16-byte chunks, else
        // `mma.sync` (which register-stages what cp.async cannot copy, and splits K);
        // `KILN_CUDA_TUNE=wgmma=off` times `mma.sync` on the products wgmma takes.
        let wg_why = if !tune.arch.wgmma() {
            format!("no wgmma on {}", tune.arch.name())
        } else if !tune.wgmma {
            format!("{}=wgmma=off", super::tune::VAR)
        } else {
            match super::wgmma::emit(k, &plan)? {
                Ok(e) => return Ok(Ok(e)),
                Err(why) => why,
            }
        };
        match super::mma::emit(k, &plan, &tune.mma)? {
            Ok(mut e) => {
                e.note = format!("{} (wgmma declined: {wg_why})", e.note);
                return Ok(Ok(e));
            }
            Err(why) => declined = format!("; tensor cores declined: {why}"),
        }
    }
    // The measurement knob's tile and split (`tune`), where it names one, for products
    // whose row operand is read along `k` (the plain `[M, K] × [K, N]` layout it is
    // measured on; an 8×8 tile of a transposed row operand spills a few bytes under the
    // 128 registers of `.minnctapersm 2`). Others keep their own choice.
    let along_k = |m: &Map, vars: &[Var]| {
        Order::of(vars.last().map(|&(v, _)| m.at(v)), plan.ks.last().map(|&(v, _)| m.at(v))) == Order::AlongK
    };
    // By default, a 128×128 tile split over K where the grid would leave the GPU half
    // idle ([`split_large_tile`]), for the same products (a transposed row operand keeps
    // its tile for the same reason).
    let [nb, m, n, kk] = plan.dims;
    let wide = (plan.split == 1)
        .then(|| split_large_tile(nb, m, n, kk, plan.tile))
        .flatten()
        .map(|(tile, split)| super::tune::F32 { tile, split });
    let plan = match tune.f32.or(wide).filter(|_| along_k(&plan.a, &plan.rows)) {
        Some(f) => match plan.retiled(f.tile, f.split) {
            Ok(p) => p,
            Err(why) => return Ok(Err(why)),
        },
        None => plan,
    };
    let text = Emitter::run(k, &plan, tune.f32_occupancy)?;
    let t = plan.tile;
    let [nb, m, n, kk] = plan.dims;
    let split = if plan.split > 1 { format!(", split-K over clusters of {}", plan.split) } else { String::new() };
    let note = format!(
        "contraction ({}x{} tile, {}x{} per thread, {} blocks{split}; batches {nb}, M {m}, N {n}, K {kk}{declined})",
        t.bm(),
        t.bn(),
        t.tm,
        t.tn,
        plan.grid()
    );
    let shared = super::dynamic_bytes(plan.shared_bytes());
    let launch = Launch { grid: plan.grid(), block: BLOCK, shared, params: (k.inputs.len() + 1) as u32 };
    Ok(Ok(Entry { text, launch, note }))
}

/// `x` (u32) taken apart into `vars` as [`split`] does: one u32 register per variable.
pub(super) fn split_regs(p: &mut Ptx, x: Reg, vars: &[Var]) -> Vec<Reg> {
    let extents: Vec<u64> = vars.iter().map(|v| v.1).collect();
    super::digits(p, x, &extents, (RegClass::B32, "u32"))
}

/// `acc + Σ coef(v)·x_v` (s64; each `x_v` a u32 below 2³¹, each coefficient in i32).
pub(super) fn affine_regs(p: &mut Ptx, acc: Reg, coef: &dyn Fn(u32) -> i64, vars: &[Var], xs: &[Reg]) -> Reg {
    let mut acc = acc;
    for (&(v, _), &x) in vars.iter().zip(xs) {
        let c = coef(v);
        if c == 0 {
            continue;
        }
        let t = p.reg(RegClass::B64);
        p.op("mul.wide.s32", &[t.into(), x.into(), Imm::I(c).into()]);
        let s = p.reg(RegClass::B64);
        p.op("add.s64", &[s.into(), acc.into(), t.into()]);
        acc = s;
    }
    acc
}

/// Where operand row `r_in` of a block's tile (rows counted from `first`) reads: whether
/// it is one of the operand's `total` rows, its element offset at k = 0 (`map` at the
/// row's tile variables `vars`, from the batch offset `bat`), and, where the operand
/// steps linearly along the reduction (`lin` elements per unit of k), the address of its
/// element at `k` (+ `k_start`): `base` + `size` bytes per element. Both the f32 kernel's
/// loaders and the tensor-core kernel's copies place their rows with it.
pub(super) fn operand_row(
    p: &mut Ptx,
    (map, vars, bat): (&Map, &[Var], Reg),
    (first, r_in, total): (Reg, Reg, u64),
    lin: Option<i64>,
    (k, k_start): (Reg, Option<Reg>),
    (base, size): (Reg, i64),
) -> (Reg, Reg, Option<Reg>) {
    let r = u32_op(p, "add.u32", first, r_in.into());
    let in_range = pred(p, "setp.lt.u32", r, Imm::U(total).into());
    let off = map_offset(p, bat, map, vars, r);
    let ptr = lin.map(|step| {
        // The row's element at the block's first step.
        let k = match k_start {
            Some(k0) => u32_op(p, "add.u32", k, k0.into()),
            None => k,
        };
        stepped_address(p, off, (k, step), (base, size))
    });
    (in_range, off, ptr)
}

/// `acc` plus the terms of `map` at `x` taken apart into the variables `vars`
/// ([`split_regs`], then [`affine_regs`]): an operand's element offset (s64) at a row,
/// a column, a batch or a step of the reduction.
pub(super) fn map_offset(p: &mut Ptx, acc: Reg, map: &Map, vars: &[Var], x: Reg) -> Reg {
    let xs = split_regs(p, x, vars);
    affine_regs(p, acc, &|v| map.at(v), vars, &xs)
}

/// `base + off · size`: the address of element offset `off` (s64) of an operand of
/// `size`-byte elements at `base`.
pub(super) fn element_address(p: &mut Ptx, off: Reg, (base, size): (Reg, i64)) -> Reg {
    let a = p.reg(RegClass::B64);
    p.op("mad.lo.s64", &[a.into(), off.into(), Imm::I(size).into(), base.into()]);
    a
}

/// The address of the element `k` (u32) steps of `step` elements on from element offset
/// `off`: `base + (off + k · step) · size`. Where an operand steps linearly along the
/// reduction, a row's pointer starts there and is then advanced by immediates.
pub(super) fn stepped_address(p: &mut Ptx, off: Reg, (k, step): (Reg, i64), base_size: (Reg, i64)) -> Reg {
    let t = p.reg(RegClass::B64);
    p.op("mul.wide.s32", &[t.into(), k.into(), Imm::I(step).into()]);
    let o = p.reg(RegClass::B64);
    p.op("add.s64", &[o.into(), off.into(), t.into()]);
    element_address(p, o, base_size)
}

/// The batch variables of batch `bi` (u32, outermost first), and `A`'s and `B`'s element
/// offsets there (s64, from their constant terms): what every kind of contraction block
/// computes first.
pub(super) fn batch_offsets(p: &mut Ptx, plan: &Plan, bi: Reg) -> (Vec<Reg>, Reg, Reg) {
    let bvars = split_regs(p, bi, &plan.batch);
    let constant = |p: &mut Ptx, c: i64| p.mov(RegClass::B64, "s64", Imm::I(c).into());
    let (ac, bc) = (constant(p, plan.a.c), constant(p, plan.b.c));
    let a_bat = affine_regs(p, ac, &|v| plan.a.at(v), &plan.batch, &bvars);
    let b_bat = affine_regs(p, bc, &|v| plan.b.at(v), &plan.batch, &bvars);
    (bvars, a_bat, b_bat)
}

/// One operand element of storage type `dtype` at `addr`, widened to a fresh f32
/// register (exactly: f16/bf16 widen exactly, integers convert exactly); 0 where `ok`
/// does not hold, and then nothing is read.
pub(super) fn load_f32(p: &mut Ptx, dtype: DType, ok: Reg, addr: Opd) -> Reg {
    let v = p.reg(RegClass::F32);
    match dtype {
        DType::F32 => {
            p.op("mov.f32", &[v.into(), Imm::F32(0).into()]);
            p.op_if(ok, false, "ld.global.f32", &[v.into(), addr]);
        }
        DType::F16 | DType::BF16 => {
            let h = if dtype == DType::F16 { "f16" } else { "bf16" };
            let raw = p.reg(RegClass::B16);
            p.op("mov.b16", &[raw.into(), Imm::I(0).into()]);
            p.op_if(ok, false, "ld.global.b16", &[raw.into(), addr]);
            p.op(&format!("cvt.f32.{h}"), &[v.into(), raw.into()]);
        }
        d => {
            let ty = match d {
                DType::I8 => "s8",
                DType::U8 => "u8",
                _ => "s16",
            };
            let raw = p.reg(RegClass::B32);
            p.op("mov.b32", &[raw.into(), Imm::I(0).into()]);
            p.op_if(ok, false, &format!("ld.global.{ty}"), &[raw.into(), addr]);
            p.op("cvt.rn.f32.s32", &[v.into(), raw.into()]);
        }
    }
    v
}

/// What every block of a contraction kernel (the f32 one and the tensor-core one)
/// computes first from its block index: its part of a split of `K`, the origin of its
/// output tile, and its batch's variables and operand offsets.
pub(super) struct BlockStart {
    /// Its rank in its cluster (a split only).
    pub rank: Option<Reg>,
    /// The first `k` of its part (a split only; else 0).
    pub k_start: Option<Reg>,
    /// The end of its part of `K` (a register for a split, else `K`).
    pub k_end: Opd,
    /// The tile's first row.
    pub m0: Reg,
    /// The tile's first column.
    pub n0: Reg,
    /// The batch variables (u32), outermost first.
    pub bvars: Vec<Reg>,
    /// `A`'s element offset at the batch (s64).
    pub a_bat: Reg,
    /// `B`'s element offset at the batch (s64).
    pub b_bat: Reg,
}

impl BlockStart {
    /// The start of block `bid` (a u32 register) under `plan`.
    pub(super) fn open(p: &mut Ptx, plan: &Plan, bid: Reg) -> BlockStart {
        let t = plan.tile;
        let [_, m, n, kk] = plan.dims;
        // A split: block bid computes tile bid / split over k in [k_start, k_end), its
        // rank in its cluster (of `split` consecutive blocks) being bid % split.
        let (tile, rank, k_start, k_end) = if plan.split > 1 {
            p.directive(&format!(".reqnctapercluster {}, 1, 1", plan.split));
            let rank = p.special("%cluster_ctarank");
            let tile = u32_op(p, "div.u32", bid, Imm::U(plan.split.into()).into());
            let k_start = u32_op(p, "mul.lo.u32", rank, Imm::U(plan.k_chunk).into());
            let e = u32_op(p, "add.u32", k_start, Imm::U(plan.k_chunk).into());
            let e = u32_op(p, "min.u32", e, Imm::U(kk).into());
            (tile, Some(rank), Some(k_start), Opd::R(e))
        } else {
            (bid, None, None, Opd::I(Imm::U(kk)))
        };
        // Tile = (batch, mtile, ntile), ntile fastest (Plan::block).
        let nt = Imm::U(n.div_ceil(u64::from(t.bn())));
        let mt = Imm::U(m.div_ceil(u64::from(t.bm())));
        let ntile = u32_op(p, "rem.u32", tile, nt.into());
        let rest = u32_op(p, "div.u32", tile, nt.into());
        let mtile = u32_op(p, "rem.u32", rest, mt.into());
        let bi = u32_op(p, "div.u32", rest, mt.into());
        let m0 = u32_op(p, "mul.lo.u32", mtile, Imm::U(t.bm().into()).into());
        let n0 = u32_op(p, "mul.lo.u32", ntile, Imm::U(t.bn().into()).into());
        let (bvars, a_bat, b_bat) = batch_offsets(p, plan, bi);
        BlockStart { rank, k_start, k_end, m0, n0, bvars, a_bat, b_bat }
    }
}

/// A thread's element of an operand row at step `k0`: the predicate that it is read
/// (its row `in_range`, and its `k`, `k0 + k_in`, below `k_end`) and its address with an
/// immediate offset: the row's own pointer `ptr` where the operand steps linearly along
/// the reduction, else `base` + `size` bytes per element at the row's offset `off` plus
/// the reduction variables' terms of `map`. The f32 kernel's loads and the tensor-core
/// kernel's copies both read through it.
pub(super) fn operand_element(
    p: &mut Ptx,
    (ks, map): (&[Var], &Map),
    (k0, k_in, k_end): (Reg, Reg, &Opd),
    (in_range, off, ptr): (Reg, Reg, Option<(Reg, i64)>),
    (base, size): (Reg, i64),
) -> (Reg, (Reg, i64)) {
    let kabs = u32_op(p, "add.u32", k0, k_in.into());
    let kin = pred(p, "setp.lt.u32", kabs, k_end.clone());
    let ok = p.reg(RegClass::Pred);
    p.op("and.pred", &[ok.into(), kin.into(), in_range.into()]);
    let addr = match ptr {
        Some(a) => a,
        None => {
            let off = map_offset(p, off, map, ks, kabs);
            (element_address(p, off, (base, size)), 0)
        }
    };
    (ok, addr)
}

pub(super) fn u32_op(p: &mut Ptx, op: &str, a: Reg, b: Opd) -> Reg {
    let d = p.reg(RegClass::B32);
    p.op(op, &[d.into(), a.into(), b]);
    d
}

pub(super) fn pred(p: &mut Ptx, op: &str, a: Reg, b: Opd) -> Reg {
    let d = p.reg(RegClass::Pred);
    p.op(op, &[d.into(), a.into(), b]);
    d
}

/// One element a thread loads per reduction step: shared slot, row predicate, offset.
struct Slot {
    /// `k` within the step.
    k_in: Reg,
    /// The tile row is in range.
    in_range: Reg,
    /// Element offset of `(row, k = 0)`, batch included.
    off: Reg,
    /// Byte offset of the element's shared slot within a buffer.
    sts: Reg,
    /// Where the reduction index is one linear stride: a global address that steps by
    /// a constant per step (shared by the slots of one tile row) and this slot's byte
    /// offset from it.
    ptr: Option<(Reg, i64)>,
}

/// What the slots of one tile row share: the row's predicate, offset and pointer.
#[derive(Clone, Copy)]
struct Row {
    in_range: Reg,
    off: Reg,
    ptr: Option<Reg>,
}

/// One operand's loads.
struct Loader {
    map: Map,
    slots: Vec<Slot>,
    /// Bytes per element.
    size: i64,
    /// The element offset per unit of `k`, when the reduction is one linear stride.
    linear: Option<i64>,
    base: Reg,
}

struct Emitter<'a> {
    k: &'a Kernel,
    plan: &'a Plan,
    /// Resident blocks per multiprocessor forced by the measurement knob (`occ=`).
    occupancy: Option<u32>,
}

impl<'a> Emitter<'a> {
    fn run(k: &'a Kernel, plan: &'a Plan, occupancy: Option<u32>) -> Result<String, CodegenError> {
        let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
        Emitter { k, plan, occupancy }.body(&mut p)?;
        p.finish().map_err(|e| internal(k, e))
    }

    /// The reduction's offset per unit of `k` for `map`, when the reduction variables
    /// are one linear stride in it (each variable's coefficient the next one's times its
    /// extent); 0 when there are none.
    fn linear(&self, map: &Map) -> Option<i64> {
        linear(&self.plan.ks, map, BK)
    }

    /// The loader of `map` over tiles of `rows` rows starting at row `first` of
    /// `total`, its tile variables `vars`, its batch offset `bat`.
    #[allow(clippy::too_many_arguments)]
    fn loader(
        &self,
        p: &mut Ptx,
        map: &Map,
        rows: u32,
        first: Reg,
        total: u64,
        vars: &[Var],
        bat: Reg,
        base: Reg,
        (tid, k_start): (Reg, Option<Reg>),
    ) -> Loader {
        let order = Order::of(vars.last().map(|&(v, _)| map.at(v)), self.plan.ks.last().map(|&(v, _)| map.at(v)));
        let size = map.dtype.storage_bytes(1) as i64;
        let linear = self.linear(map);
        let mut out = Vec::new();
        let shift = rows.trailing_zeros();
        let kg = BK / 8;
        // `k` of the first slot of each row (every row's pointer is at that `k`).
        let k_first = match order {
            Order::AlongK => u32_op(p, "and.b32", tid, Imm::U(7).into()),
            Order::AlongRows => u32_op(p, "shr.u32", tid, Imm::U(shift.into()).into()),
        };
        let mut groups: Vec<Option<Row>> = vec![None; slots(rows) as usize];
        for e in 0..slots(rows) {
            // (k, r) of this slot, as `Order::slot` computes them; `g` its tile row's
            // group of slots and `dk` its `k` past the group's first.
            let (dk, g) = match order {
                Order::AlongK => (8 * (e % kg), e / kg),
                Order::AlongRows => ((BLOCK / rows) * e, 0),
            };
            let k_in = u32_op(p, "add.u32", k_first, Imm::U(dk.into()).into());
            let r_in = match order {
                Order::AlongK => {
                    let r = u32_op(p, "shr.u32", tid, Imm::U(3).into());
                    u32_op(p, "add.u32", r, Imm::U(u64::from((BLOCK / 8) * g)).into())
                }
                Order::AlongRows => u32_op(p, "and.b32", tid, Imm::U(u64::from(rows - 1)).into()),
            };
            let row = match groups[g as usize] {
                Some(row) => row,
                None => {
                    let (in_range, off, ptr) = operand_row(
                        p,
                        (map, vars, bat),
                        (first, r_in, total),
                        linear,
                        (k_first, k_start),
                        (base, size),
                    );
                    let row = Row { in_range, off, ptr };
                    groups[g as usize] = Some(row);
                    row
                }
            };
            // Shared slot (k·(rows + PAD) + r)·4.
            let sts = p.reg(RegClass::B32);
            p.op("mad.lo.u32", &[sts.into(), k_in.into(), Imm::U(u64::from(rows + PAD)).into(), r_in.into()]);
            let sts = u32_op(p, "shl.b32", sts, Imm::U(2).into());
            let ptr = row.ptr.zip(linear).map(|(a, step)| (a, i64::from(dk) * step * size));
            out.push(Slot { k_in, in_range: row.in_range, off: row.off, sts, ptr });
        }
        Loader { map: map.clone(), slots: out, size, linear, base }
    }

    /// Loads step `k0`'s elements of `l` into fresh f32 registers (0 where out of
    /// range); linear pointers are read as they are (the caller steps them).
    fn load(&self, p: &mut Ptx, l: &Loader, k0: Reg, k_end: &Opd) -> Vec<Reg> {
        let mut vals = Vec::new();
        for s in &l.slots {
            let (ok, (addr, at)) = operand_element(
                p,
                (&self.plan.ks, &l.map),
                (k0, s.k_in, k_end),
                (s.in_range, s.off, s.ptr),
                (l.base, l.size),
            );
            vals.push(load_f32(p, l.map.dtype, ok, Opd::Addr(addr, at)));
        }
        vals
    }

    /// Steps the linear pointers of `l` by one reduction step.
    fn advance(p: &mut Ptx, l: &Loader) {
        if let Some(step) = l.linear {
            let mut done: Vec<Reg> = Vec::new();
            for s in &l.slots {
                if let Some((a, _)) = s.ptr {
                    if !done.contains(&a) {
                        p.op("add.s64", &[a.into(), a.into(), Imm::I(step * i64::from(BK) * l.size).into()]);
                        done.push(a);
                    }
                }
            }
        }
    }

    /// Stores `vals` into their shared slots of the buffer at `buf`.
    fn store(p: &mut Ptx, l: &Loader, vals: &[Reg], buf: Reg) {
        for (s, &v) in l.slots.iter().zip(vals) {
            let a = u32_op(p, "add.u32", buf, s.sts.into());
            p.op("st.shared.f32", &[Opd::Addr(a, 0), v.into()]);
        }
    }

    fn body(&self, p: &mut Ptx) -> Result<(), CodegenError> {
        let (k, plan) = (self.k, self.plan);
        let t = plan.tile;
        let [_, m, n, _] = plan.dims;
        let bases = p.binding_bases(k.inputs.len() + 1);
        // 256 threads; and where both operands step linearly along `k` (no `k` taken
        // apart per load) and the grid has more blocks than multiprocessors, two blocks
        // per multiprocessor: ptxas then keeps to 128 registers (an 8×8 tile takes ~185
        // otherwise, one block per multiprocessor). A grid of at most one block per
        // multiprocessor has nothing to gain from the second and leaves ptxas its
        // registers (matmul1024's 128 blocks: 3% faster on an H100). An implicit-GEMM
        // window keeps more addresses live and would spill under 128. The tests and
        // every model check that nothing spills.
        p.directive(&format!(".maxntid {BLOCK}, 1, 1"));
        // The one-block case says so (`.minnctapersm 1`): with no directive ptxas may
        // still hold a product to 128 registers and spill a few bytes (a 1×1
        // convolution's 128×128 tile did).
        let linear = self.linear(&plan.a).is_some() && self.linear(&plan.b).is_some();
        let rule = linear.then_some(if plan.grid() > SMS { 2 } else { 1 });
        if let Some(b) = self.occupancy.or(rule) {
            p.directive(&format!(".minnctapersm {b}"));
        }
        let tid = p.special("%tid.x");
        let bid = p.special("%ctaid.x");
        let tx = u32_op(p, "and.b32", tid, Imm::U(15).into());
        let ty = u32_op(p, "shr.u32", tid, Imm::U(4).into());
        let BlockStart { rank, k_start, k_end, m0, n0, bvars, a_bat, b_bat } = BlockStart::open(p, plan, bid);

        // Shared memory: [A buf 0 | A buf 1 | B buf 0 | B buf 1].
        let (abuf, bbuf) = (Tile::buffer(t.bm()), Tile::buffer(t.bn()));
        // (A split's partial sums reuse it: BM·BN f32.)
        let smem = super::declare_shared(p, "tiles", plan.shared_bytes(), 16);
        let s0 = p.reg(RegClass::B32);
        p.op("mov.u32", &[s0.into(), Opd::Sym(smem)]);
        let a_rd = p.mov(RegClass::B32, "u32", s0.into());
        let a_wr = u32_op(p, "add.u32", s0, Imm::U(abuf.into()).into());
        let b_rd = u32_op(p, "add.u32", s0, Imm::U((2 * abuf).into()).into());
        let b_wr = u32_op(p, "add.u32", s0, Imm::U((2 * abuf + bbuf).into()).into());

        let la = self.loader(p, &plan.a, t.bm(), m0, m, &plan.rows, a_bat, bases[plan.a.input], (tid, k_start));
        let lb = self.loader(p, &plan.b, t.bn(), n0, n, &plan.cols, b_bat, bases[plan.b.input], (tid, k_start));

        // Accumulators, zero.
        let acc: Vec<Reg> = (0..t.tm * t.tn).map(|_| p.mov(RegClass::F32, "f32", Imm::F32(0).into())).collect();
        // This thread's 16-byte column of each buffer: 4·ty rows of A, 4·tx columns of B.
        let ty16 = u32_op(p, "shl.b32", ty, Imm::U(4).into());
        let tx16 = u32_op(p, "shl.b32", tx, Imm::U(4).into());

        // Prologue: step 0 into the first buffers, which are read first.
        let k0 = p.mov(RegClass::B32, "u32", k_start.map_or(Imm::U(0).into(), Opd::R));
        let va = self.load(p, &la, k0, &k_end);
        let vb = self.load(p, &lb, k0, &k_end);
        Emitter::store(p, &la, &va, a_rd);
        Emitter::store(p, &lb, &vb, b_rd);
        p.op("bar.sync", &[Imm::I(0).into()]);

        let steps = plan.k_chunk / u64::from(BK);
        let step = p.mov(RegClass::B32, "u32", Imm::U(0).into());
        let head = p.label();
        p.place(head);
        // Prefetch step t + 1 (all predicated off past K).
        p.op("add.u32", &[k0.into(), k0.into(), Imm::U(BK.into()).into()]);
        Emitter::advance(p, &la);
        Emitter::advance(p, &lb);
        let va = self.load(p, &la, k0, &k_end);
        let vb = self.load(p, &lb, k0, &k_end);
        // Compute from the read buffers.
        let a_th = u32_op(p, "add.u32", a_rd, ty16.into());
        let b_th = u32_op(p, "add.u32", b_rd, tx16.into());
        for kq in 0..BK {
            let frag = |p: &mut Ptx, at: Reg, rows: u32, per: u32| -> Vec<Reg> {
                let mut f = Vec::new();
                for c in 0..per / 4 {
                    let regs: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::F32)).collect();
                    let off = (kq * (rows + PAD) * 4 + c * 256) as i64;
                    p.op("ld.shared.v4.f32", &[Opd::Vec(regs.clone()), Opd::Addr(at, off)]);
                    f.extend(regs);
                }
                f
            };
            let fa = frag(p, a_th, t.bm(), t.tm);
            let fb = frag(p, b_th, t.bn(), t.tn);
            for (i, &x) in fa.iter().enumerate() {
                for (j, &y) in fb.iter().enumerate() {
                    let c = acc[i * t.tn as usize + j];
                    p.op("fma.rn.f32", &[c.into(), x.into(), y.into(), c.into()]);
                }
            }
        }
        Emitter::store(p, &la, &va, a_wr);
        Emitter::store(p, &lb, &vb, b_wr);
        p.op("bar.sync", &[Imm::I(0).into()]);
        for (x, y) in [(a_rd, a_wr), (b_rd, b_wr)] {
            let tmp = p.mov(RegClass::B32, "u32", x.into());
            p.op("mov.u32", &[x.into(), y.into()]);
            p.op("mov.u32", &[y.into(), tmp.into()]);
        }
        p.op("add.u32", &[step.into(), step.into(), Imm::U(1).into()]);
        let more = pred(p, "setp.lt.u32", step, Imm::U(steps).into());
        p.bra(Some((more, false)), head);

        match rank {
            None => {
                // The thread's own rows and columns.
                let tx4 = u32_op(p, "shl.b32", tx, Imm::U(2).into());
                let ty4 = u32_op(p, "shl.b32", ty, Imm::U(2).into());
                let c0 = u32_op(p, "add.u32", n0, tx4.into());
                let r0 = u32_op(p, "add.u32", m0, ty4.into());
                let rows: Vec<Reg> =
                    (0..t.tm).map(|i| u32_op(p, "add.u32", r0, Imm::U(t.row(0, i).into()).into())).collect();
                let cols: Vec<Reg> =
                    (0..t.tn).map(|j| u32_op(p, "add.u32", c0, Imm::U(t.col(0, j).into()).into())).collect();
                self.epilogue(p, &bases, (&rows, &cols, &acc), &bvars, if plan.vector_store() { 4 } else { 1 })
            }
            Some(rank) => {
                Emitter::store_partials(p, t, (tx, ty), s0, &acc);
                split_reduce(self.k, self.plan, p, &bases, (tid, rank), (m0, n0, s0), &bvars)
            }
        }
    }

    /// A split's end, first part: each block writes its partial tile `acc` to its shared
    /// memory at `s0` (`part[row][col]`, row-major `BM × BN`, over the operand buffers,
    /// which the last step's barrier has freed). Then [`Emitter::split_reduce`]: after a
    /// cluster barrier, rank `r` sums rows `r·BM/split ..` of every block's partial tile
    /// in rank order (distributed shared memory, `mapa` + `ld.shared::cluster`) and runs
    /// the epilogue on them ([`reduce_slot`]); a last cluster barrier keeps every block's
    /// shared memory alive until all have read it.
    fn store_partials(p: &mut Ptx, t: Tile, (tx, ty): (Reg, Reg), s0: Reg, acc: &[Reg]) {
        let row_bytes = t.bn() * 4;
        // Partials: thread rows Tile::row(ty, i), columns Tile::col(tx, 4c ..+4).
        let ty_off = u32_op(p, "mul.lo.u32", ty, Imm::U((4 * row_bytes).into()).into());
        let tx_off = u32_op(p, "shl.b32", tx, Imm::U(4).into());
        let at = u32_op(p, "add.u32", s0, ty_off.into());
        let at = u32_op(p, "add.u32", at, tx_off.into());
        for i in 0..t.tm {
            for c in 0..t.tn / 4 {
                let off = i64::from(t.row(0, i) * row_bytes + t.col(0, 4 * c) * 4);
                let v: Vec<Reg> = (0..4).map(|l| acc[(i * t.tn + 4 * c + l) as usize]).collect();
                p.op("st.shared.v4.f32", &[Opd::Addr(at, off), Opd::Vec(v)]);
            }
        }
    }

    /// Evaluates the kernel's root at each (row, column) of `rows × cols` in range,
    /// the reduction given as `vals[i · cols + j]`, and stores it: `lanes` (1, 2 or 4)
    /// consecutive columns at a time, from a multiple of `lanes`, with one
    /// `st.global.v{lanes}.f32` where `lanes` > 1 ([`Plan::vector_store`],
    /// [`Plan::pair_store`]).
    fn epilogue(
        &self,
        p: &mut Ptx,
        bases: &[Reg],
        (rows, colr, acc): (&[Reg], &[Reg], &[Reg]),
        bvars: &[Reg],
        lanes: usize,
    ) -> Result<(), CodegenError> {
        let (k, plan) = (self.k, self.plan);
        let [_, m, n, _] = plan.dims;
        let ostride = |v: u32| plan.out.get(v as usize).copied().unwrap_or(0);
        let zero = p.mov(RegClass::B64, "u64", Imm::U(0).into());
        let o_bat = affine_regs(p, zero, &ostride, &plan.batch, bvars);
        let wide = |p: &mut Ptx, r: Reg| {
            let d = p.reg(RegClass::B64);
            p.op("cvt.u64.u32", &[d.into(), r.into()]);
            d
        };
        let bvars64: Vec<Reg> = bvars.iter().map(|&r| wide(p, r)).collect();
        // Columns: index, in-range predicate, variables, output offset.
        let mut cols = Vec::new();
        for &c in colr {
            let ok = pred(p, "setp.lt.u32", c, Imm::U(n).into());
            let xs = split_regs(p, c, &plan.cols);
            let off = affine_regs(p, zero, &ostride, &plan.cols, &xs);
            let xs: Vec<Reg> = xs.iter().map(|&r| wide(p, r)).collect();
            cols.push((ok, xs, off));
        }
        // Which nodes read a column variable or the reduction: evaluated per element.
        let free = k.free_vars();
        let mut per_elem = vec![false; k.nodes.len()];
        for (i, node) in k.nodes.iter().enumerate() {
            let mut d = i == plan.reduce.index() || free[i].iter().any(|v| plan.cols.iter().any(|c| c.0 == *v));
            node.expr.for_each_operand(|o| d |= per_elem.get(o.index()).copied().unwrap_or(true));
            per_elem[i] = d;
        }
        let out_base = bases[k.inputs.len()];
        let mut ev = Eval::new(k, p, bases[..k.inputs.len()].to_vec());
        for &v in &plan.ones {
            ev.set_var(v as usize, zero);
        }
        for (&(v, _), &r) in plan.batch.iter().zip(&bvars64) {
            ev.set_var(v as usize, r);
        }
        let root_ty = k.node(k.root).ty;
        // Pairs store the root's f32 values (narrowed to half where the output is).
        let lanes = if lanes == 2 && root_ty != ScalarType::F32 { 1 } else { lanes };
        for (i, &r) in rows.iter().enumerate() {
            let ok = pred(ev.p, "setp.lt.u32", r, Imm::U(m).into());
            let row_end: Label = ev.p.label();
            ev.p.branch(Some((ok, true)), row_end);
            let xs = split_regs(ev.p, r, &plan.rows);
            let o_row = affine_regs(ev.p, o_bat, &ostride, &plan.rows, &xs);
            ev.push_scope();
            for (&(v, _), &x) in plan.rows.iter().zip(&xs) {
                let x = wide(ev.p, x);
                ev.set_var(v as usize, x);
            }
            // Every node that is not per element, once per row, never entering the
            // reduction (its body reads the reduction's variables, which have no
            // registers here).
            ev.hoist_where(k.root, &|_, e| !per_elem[e.index()], &mut HashSet::from([plan.reduce]))?;
            // Groups of `lanes` columns: in range together, stored together.
            for j0 in (0..cols.len()).step_by(lanes) {
                let (cok, _, coff) = &cols[j0];
                let skip = ev.p.label();
                ev.p.branch(Some((*cok, true)), skip);
                let mut vals = Vec::with_capacity(lanes);
                for (j, (_, cxs, _)) in cols.iter().enumerate().skip(j0).take(lanes) {
                    ev.push_scope();
                    for (&(v, _), &x) in plan.cols.iter().zip(cxs) {
                        ev.set_var(v as usize, x);
                    }
                    ev.given.insert(plan.reduce, acc[i * cols.len() + j]);
                    vals.push(ev.value(k.root)?);
                    ev.given.clear();
                    ev.pop_scope();
                }
                let off = ev.p.reg(RegClass::B64);
                ev.p.op("add.s64", &[off.into(), o_row.into(), (*coff).into()]);
                let addr = ev.address(out_base, off, k.output.dtype)?;
                match lanes {
                    1 => ev.store_at(addr, k.output.dtype, root_ty, vals[0])?,
                    2 if k.output.dtype == DType::F32 => {
                        ev.p.op("st.global.v2.f32", &[Opd::Addr(addr, 0), Opd::Vec(vals)]);
                    }
                    2 => {
                        let h0 = ev.narrow(vals[0], k.output.dtype, root_ty)?;
                        let h1 = ev.narrow(vals[1], k.output.dtype, root_ty)?;
                        let w = ev.p.reg(RegClass::B32);
                        ev.p.op("mov.b32", &[w.into(), Opd::Vec(vec![h0, h1])]);
                        ev.p.op("st.global.b32", &[Opd::Addr(addr, 0), w.into()]);
                    }
                    _ => ev.p.op("st.global.v4.f32", &[Opd::Addr(addr, 0), Opd::Vec(vals)]),
                }
                ev.p.place(skip);
            }
            ev.pop_scope();
            ev.p.place(row_end);
        }
        Ok(())
    }
}

/// A split's end, once each block of the cluster has written its partial `BM × BN` tile
/// (row-major f32) to its shared memory at `s0` and may overwrite nothing there any
/// more: the cluster barrier, rank `rank`'s sums of [`reduce_slot`] in rank order,
/// their epilogue, and the last cluster barrier (see [`Plan::split`]). The f32 kernel's
/// and the tensor-core path's.
#[allow(clippy::too_many_arguments)]
pub(super) fn split_reduce(
    k: &Kernel,
    plan: &Plan,
    p: &mut Ptx,
    bases: &[Reg],
    (tid, rank): (Reg, Reg),
    (m0, n0, s0): (Reg, Reg, Reg),
    bvars: &[Reg],
) -> Result<(), CodegenError> {
    let this = Emitter { k, plan, occupancy: None };
    let t = plan.tile;
    let split = plan.split;
    let row_bytes = t.bn() * 4;
    p.op("barrier.cluster.arrive", &[]);
    p.op("barrier.cluster.wait", &[]);
    let done = p.label();
    if reduce_groups(t, split) * BLOCK * split > t.bm() * t.bn() / 4 {
        // Fewer groups than threads: the rest skip to the last barrier.
        let active = pred(p, "setp.lt.u32", tid, Imm::U(u64::from(t.bm() * t.bn() / 4 / split)).into());
        p.branch(Some((active, true)), done);
    }
    // reduce_slot: row rank·rows + tid/G + (256/G)·q, columns 4·(tid % G) ..+4,
    // G = BN/4 (a power of two).
    let g = t.bn() / 4;
    let tx = u32_op(p, "and.b32", tid, Imm::U(u64::from(g - 1)).into());
    let ty = u32_op(p, "shr.u32", tid, Imm::U(u64::from(g.trailing_zeros())).into());
    let rows_per = t.bm() / split;
    let r_base = u32_op(p, "mul.lo.u32", rank, Imm::U(rows_per.into()).into());
    let r_base = u32_op(p, "add.u32", r_base, ty.into());
    let tx4 = u32_op(p, "shl.b32", tx, Imm::U(2).into());
    let mut rows = Vec::new();
    let mut vals = Vec::new();
    for q in 0..reduce_groups(t, split) {
        let r_in = u32_op(p, "add.u32", r_base, Imm::U(u64::from((BLOCK / g) * q)).into());
        let local = p.reg(RegClass::B32);
        p.op("mad.lo.u32", &[local.into(), r_in.into(), Imm::U(row_bytes.into()).into(), s0.into()]);
        let c_off = u32_op(p, "shl.b32", tx4, Imm::U(2).into());
        let local = u32_op(p, "add.u32", local, c_off.into());
        let mut sum: Vec<Reg> = Vec::new();
        for s in 0..split {
            let remote = p.reg(RegClass::B32);
            p.op("mapa.shared::cluster.u32", &[remote.into(), local.into(), Imm::U(s.into()).into()]);
            let part: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::F32)).collect();
            p.op("ld.shared::cluster.v4.f32", &[Opd::Vec(part.clone()), Opd::Addr(remote, 0)]);
            sum = if sum.is_empty() {
                part
            } else {
                sum.iter()
                    .zip(&part)
                    .map(|(&a, &b)| {
                        let d = p.reg(RegClass::F32);
                        p.op("add.rn.f32", &[d.into(), a.into(), b.into()]);
                        d
                    })
                    .collect()
            };
        }
        rows.push(u32_op(p, "add.u32", m0, r_in.into()));
        vals.extend(sum);
    }
    let c0 = u32_op(p, "add.u32", n0, tx4.into());
    let cols: Vec<Reg> = (0..4).map(|l| u32_op(p, "add.u32", c0, Imm::U(l).into())).collect();
    this.epilogue(p, bases, (&rows, &cols, &vals), bvars, if plan.vector_store() { 4 } else { 1 })?;
    p.place(done);
    p.op("barrier.cluster.arrive", &[]);
    p.op("barrier.cluster.wait", &[]);
    Ok(())
}

/// The epilogue of `k` under `plan` for another emitter's accumulators (the tensor-core
/// paths): the root evaluated at each `(rows[i], cols[j])` in range with the reduction
/// given as `acc[i · cols.len() + j]`; `bvars` are the batch variables' u32 registers.
/// With `pairs`, two consecutive columns (from an even one) are stored with one
/// `st.global.v2.f32` where [`Plan::pair_store`] allows; else one element at a time.
pub(super) fn epilogue(
    k: &Kernel,
    plan: &Plan,
    p: &mut Ptx,
    bases: &[Reg],
    parts: (&[Reg], &[Reg], &[Reg]),
    bvars: &[Reg],
    pairs: bool,
) -> Result<(), CodegenError> {
    Emitter { k, plan, occupancy: None }.epilogue(
        p,
        bases,
        parts,
        bvars,
        if pairs && plan.pair_store() { 2 } else { 1 },
    )
}
