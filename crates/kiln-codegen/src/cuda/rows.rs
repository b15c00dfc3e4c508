//! Rows kernels (Softmax, LogSoftmax, LayerNorm, row sums, means, maxima and their
//! fused prologues and epilogues; global pools over NCHW are Window kernels): each
//! reduction once per row, by a group of threads that cooperate on the row.
//!
//! A Rows kernel (`kiln_flow::class`) has an output `[outer…, L]`; a *row* is one
//! position of the outer axes (`R` rows, the flat index of the outer axes), and every
//! value of the kernel is constant along the row (a *row value*: a reduction's result
//! and what is computed from it), varies along the output's last axis, or varies along
//! one reduction's variable. Per row, in node order, each reduction walks its
//! variable's positions and folds them; then the output row's `L` elements are
//! computed and stored. Row values are computed once per row, before the walk that
//! needs them; reductions' values are held in registers (all threads of the group
//! hold the same value).
//!
//! **Mapping** ([`mapping`]): `G` threads per row, walking the positions of a walk
//! `p = lane, lane + G, …` (lane in `0..G`).
//! - When every load that varies along a walk reads consecutive elements along it
//!   (the reduced axis innermost in memory), consecutive lanes
//!   read consecutive elements: `G = min(32, next power of two ≥ n)` for rows of
//!   `n ≤ 512` positions (the longest walk): a warp per row, or `32 / G` rows per warp
//!   for short rows; one block of 256 threads per row beyond.
//! - Where a load strides through memory along its walk but reads consecutive
//!   elements from one row to the next (a reduction over an outer axis, the rows the
//!   contiguous one), and there are rows enough for a thread each to give every
//!   multiprocessor two warps ([`ROWS_FOR_THREADS`]): `G = 1`, a thread per row, the
//!   reduction serial in the thread, consecutive threads on consecutive rows, so the
//!   loads coalesce across rows.
//!   Loads that stride both ways, with as many rows, take a thread per row too.
//! - Otherwise (few rows) as for contiguous rows: the loads do not coalesce, but the
//!   row's positions are read in parallel.
//!
//! General kernels with reductions ([`emit_general`]: a reduction over an axis other
//! than the output's last, or one that drops its axis) take the same code with every
//! output axis a row axis: each output element is a row of one element, and its
//! reductions are folded by its group (a sum over the tokens of `[1, T, C]`: many
//! columns, a thread each, the loads coalescing across them; few, a warp each). Many
//! elements whose walks are at most 32 long take a thread each whatever the layout.
//!
//! Warps (for `G ≤ 32`) or blocks (for `G = 256`) walk rows grid-stride, so any grid is
//! correct: a warp takes rows `base .. base + 32/G` (its lanes `lane / G` apart) and
//! steps by the grid's warps × `32/G`; a block takes row `base` and steps by the grid's
//! blocks. The loop condition reads only `base`, the same for every thread of the warp
//! (block), so every thread of a warp runs every shuffle, and every thread of a block
//! every `bar.sync`. A lane whose row is past the end (the last warp, when `R` is not a
//! multiple of `32/G`) computes the last row again (its index clamped, so every load is
//! in bounds) and stores nothing.
//!
//! Blocks are 256 threads in the block form (its shared array has a slot for each of
//! the 8 warps, so the launch must keep that size); in the warp forms, 8 warps halved
//! down to 2 while fewer than two blocks per multiprocessor would come of it
//! ([`Mapping::block`]): 512 rows of a warp each run as 256 blocks of 2 warps, not 64
//! of 8.
//!
//! **Combining**: each thread folds its positions serially, then the group combines:
//! butterfly shuffles (`shfl.sync.bfly`, offsets `G/2 … 1`, full mask; every lane ends
//! with the same value, the operations being commutative), and for a block, lane 0 of
//! each warp stores its warp's value into a static shared array, `bar.sync`, every
//! thread folds the 8 warp values in warp order, `bar.sync` (so the next combine may
//! reuse the array).
//!
//! **The row in registers**: where each thread walks at most [`UNROLL`] positions
//! (`⌈n / G⌉`), the walks are unrolled, and a value that two walks compute at the same
//! positions (the same *form*, `forms`: Softmax's `x` in the maximum and the sum, its
//! `exp(x − max)` in the sum and the output; LayerNorm's `x` in the mean and the
//! variance, `x − mean` in the variance and the output) is computed once: a later walk
//! stops at it and uses the registers of the first (`keep`; at most [`CACHE_WORDS`]
//! 32-bit words a thread). A held register is defined in its walk under the same
//! guard (position within the walk's length, the same for walks of the same length)
//! as every later use. Longer walks are loops that read global memory again (the row
//! stays in L1/L2).
//!
//! **Numerics**: max and min are exact (`max.NaN`/`min.NaN`, the interpreter's NaN
//! propagation, whatever the order); integer sums and products wrap as the
//! interpreter's do, in any order. Float sums and products are reassociated — each
//! thread's `⌈n/G⌉` positions in order, then a tree of `log₂ G` shuffles (and 8 warp
//! values in order for a block) — so they round differently from the interpreter's
//! serial fold: an f32 sum is within `(⌈n/G⌉ + log₂ G + 8)·2⁻²⁴·Σ|xᵢ|` of the exact
//! one, the interpreter's within `n·2⁻²⁴·Σ|xᵢ|`, so the two within
//! `(2n + 16)·2⁻²⁴·Σ|xᵢ|` of each other (the CPU row kernels reassociate too; their
//! tests hold Softmax within `(L + 11)·2⁻²⁴` relative). The signed zero of a max or
//! min over `+0` and `−0` follows `max.NaN`/`min.NaN`, as on the general path.
//!
//! Declined (to the general mapping, with the reason): arg reductions (whose tie and
//! NaN rules depend on the order the positions are visited), a reduction over several
//! variables, a value that varies along two walks (not a Rows kernel), rank-0 or empty
//! outputs, outputs stored as types the CUDA target does not store.

use std::collections::{HashMap, HashSet};

use kiln_flow::affine::load_offset;
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType};

use super::expr::{identity, storage, Eval};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::{decompose, internal, Entry, Ids, Launch, BLOCK, MAX_GRID};
use crate::CodegenError;

/// Threads of a warp.
const WARP: u64 = 32;

/// The longest walk a warp (or part of one) takes; longer rows get a block.
pub const WARP_MAX: u64 = 512;

/// Most positions a thread walks with the walk unrolled (and its loads kept).
pub const UNROLL: u64 = 16;

/// Most 32-bit registers a thread spends on loads kept between walks.
pub const CACHE_WORDS: u64 = 32;

/// Warps of a block of [`BLOCK`] threads (the block form's, and the most the warp
/// forms take).
const WARPS: u64 = BLOCK as u64 / WARP;

/// Multiprocessors of the H200.
const MULTIPROCESSORS: u64 = 132;

/// The static shared array of the block form: one 8-byte slot per warp.
const PARTIALS: &str = "rows_partials";

/// How a kernel's rows are spread over threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mapping {
    /// Threads per row: 1, 2, 4, 8, 16, 32 (within a warp) or [`BLOCK`] (a block).
    pub group: u64,
    /// Positions each thread walks along the longest walk (`⌈n / group⌉`).
    pub chunks: u64,
}

impl Mapping {
    /// Rows a warp takes at once (for groups within a warp).
    pub fn rows_per_warp(self) -> u64 {
        if self.group <= WARP {
            WARP / self.group
        } else {
            1
        }
    }

    /// Whether every walk is unrolled (each thread's positions known at compile time).
    pub fn unrolled(self) -> bool {
        self.chunks <= UNROLL
    }

    /// Threads per block for `rows` rows: [`BLOCK`] for the block form; for groups
    /// within a warp, 8 warps, halved (down to 2) while that leaves fewer than two
    /// blocks per multiprocessor of an H200 (132), so few rows still spread over the GPU.
    pub fn block(self, rows: u64) -> u32 {
        if self.group > WARP {
            return BLOCK;
        }
        let warps = rows.div_ceil(self.rows_per_warp());
        let mut per_block = WARPS;
        while per_block > 2 && warps.div_ceil(per_block) < 2 * MULTIPROCESSORS {
            per_block /= 2;
        }
        (per_block * WARP) as u32
    }

    /// Blocks of [`Mapping::block`] threads for `rows` rows: one per row (a block's
    /// worth of rows for groups within a warp), at most [`MAX_GRID`].
    pub fn grid(self, rows: u64) -> u64 {
        let per_block = if self.group <= WARP { u64::from(self.block(rows)) / WARP * self.rows_per_warp() } else { 1 };
        rows.div_ceil(per_block).clamp(1, MAX_GRID)
    }
}

/// Fewest rows for a thread per row: two warps on each of the H200's multiprocessors.
pub const ROWS_FOR_THREADS: u64 = 2 * MULTIPROCESSORS * WARP;

/// How the loads along the walks lie in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every load along a walk reads consecutive elements along it.
    AlongRows,
    /// Some load strides along its walk, and every such load reads consecutive
    /// elements from one row to the next.
    AcrossRows,
    /// Some load strides both along its walk and across rows (or is not affine).
    Strided,
}

/// The mapping of a kernel of `rows` rows whose longest walk has `longest` positions
/// and whose loads lie as `layout` says (see the module docs).
pub fn mapping(layout: Layout, longest: u64, rows: u64) -> Mapping {
    let longest = longest.max(1);
    let group = if layout != Layout::AlongRows && rows >= ROWS_FOR_THREADS {
        1
    } else if longest <= WARP_MAX {
        longest.next_power_of_two().min(WARP)
    } else {
        u64::from(BLOCK)
    };
    Mapping { group, chunks: longest.div_ceil(group) }
}

/// The positions the threads of a `grid` of `block`-thread blocks visit under `m`, on
/// the host: `visit(row, position, stores)` for each thread's each position along a
/// walk of `len` over `rows` rows, in the order the PTX does (the same arithmetic as
/// [`emit`]'s), with `stores` false for a lane whose row is past the end (it computes
/// the clamped row). Also checks that every thread of a warp (block, for the block
/// form) runs the row loop the same number of times: `Err` names one that does not.
pub fn walk(
    m: Mapping,
    rows: u64,
    len: u64,
    grid: u64,
    block: u32,
    visit: &mut dyn FnMut(u64, u64, bool),
) -> Result<(), String> {
    let block = u64::from(block);
    let g = m.group;
    let mut trips: HashMap<u64, u64> = HashMap::new();
    for b in 0..grid {
        for t in 0..block {
            let (mut base, stride, lane, unit) = if g <= WARP {
                let gtid = b * block + t;
                let rw = m.rows_per_warp();
                ((gtid >> 5) * rw, ((grid * block) >> 5) * rw, (t & 31) % g, gtid >> 5)
            } else {
                (b, grid, t, b)
            };
            let sub = if g <= WARP { (t & 31) / g } else { 0 };
            let mut n = 0;
            while base < rows {
                let raw = base + sub;
                let row = raw.min(rows - 1);
                let mut p = lane;
                while p < len {
                    visit(row, p, raw < rows);
                    p += g;
                }
                base += stride;
                n += 1;
            }
            if *trips.entry(unit).or_insert(n) != n {
                return Err(format!("block {b} thread {t}: {n} row trips, its warp (block) differs"));
            }
        }
    }
    Ok(())
}

/// One reduction of the kernel.
struct Red {
    node: ExprId,
    op: ReduceOp,
    var: u32,
    body: ExprId,
    ty: ScalarType,
}

struct Plan {
    /// The row's output variables (`0..u`): all but the last, or all.
    u: usize,
    /// The output row's variable (the last output variable), if it is not a row's.
    out_walk: Option<u32>,
    len: u64,
    rows: u64,
    reds: Vec<Red>,
    map: Mapping,
    /// Values kept between walks: each node's form (see [`forms`]).
    kept: HashMap<ExprId, usize>,
    /// How many forms are kept.
    kept_forms: usize,
}

type Declined<T> = Result<T, String>;

/// The nodes `e` depends on (itself included) without entering reductions.
fn subtree(k: &Kernel, e: ExprId, out: &mut Vec<ExprId>, seen: &mut HashSet<ExprId>) {
    if !seen.insert(e) {
        return;
    }
    if !matches!(k.node(e).expr, Expr::Reduce { .. }) {
        k.node(e).expr.for_each_operand(|o| subtree(k, o, out, seen));
    }
    out.push(e);
}

fn nodes_of(k: &Kernel, e: ExprId) -> Vec<ExprId> {
    let mut out = Vec::new();
    subtree(k, e, &mut out, &mut HashSet::new());
    out
}

/// The plan of `k`, its output rows split as the Rows class does (`whole` false: the
/// last output axis is the row's), or with every output axis a row axis and rows of one
/// element (`whole`: see [`emit_general`]).
fn plan(k: &Kernel, whole: bool) -> Declined<Plan> {
    let rank = k.out_rank();
    if rank == 0 {
        return Err("rank-0 output".into());
    }
    if k.output.shape.numel() == 0 {
        return Err("empty output".into());
    }
    if storage(k.output.dtype).is_none() {
        return Err(format!("{} output", k.output.dtype.name()));
    }
    let u = if whole { rank } else { rank - 1 };
    let len = if whole { 1 } else { k.vars[u] };
    let rows: u64 = k.vars[..u].iter().product();
    // The nodes the root needs, reductions included.
    let mut live = vec![false; k.nodes.len()];
    live[k.root.index()] = true;
    for i in (0..k.nodes.len()).rev() {
        if live[i] {
            k.nodes[i].expr.for_each_operand(|o| live[o.index()] = true);
        }
    }
    let free = k.free_vars();
    let mut reds = Vec::new();
    for (i, n) in k.nodes.iter().enumerate() {
        let Expr::Reduce { op, vars, body } = &n.expr else { continue };
        if !live[i] {
            continue;
        }
        if op.is_arg() {
            return Err("an arg reduction (its tie and NaN rules depend on the order)".into());
        }
        let [w] = vars[..] else { return Err("a reduction over several variables".into()) };
        if free[body.index()].iter().any(|&v| v as usize >= u && v != w.0) {
            return Err("a reduction whose operand varies along another walk".into());
        }
        reds.push(Red { node: ExprId(i as u32), op: *op, var: w.0, body: *body, ty: k.node(*body).ty });
    }
    if whole && reds.is_empty() {
        return Err("no reduction".into());
    }
    if free[k.root.index()].iter().any(|&v| v as usize > u || (whole && v as usize == u)) {
        return Err("an output reading a reduction's variable".into());
    }
    // The walk each live node varies along (at most one).
    let walk_of = |i: usize| -> Declined<Option<u32>> {
        let mut axes = free[i].iter().filter(|&&v| v as usize >= u);
        match (axes.next(), axes.next()) {
            (a, None) => Ok(a.copied()),
            _ => Err("a value along two walks".into()),
        }
    };
    let extent = |v: u32| k.vars[v as usize];
    let longest = reds.iter().map(|r| extent(r.var)).chain([len]).max().unwrap_or(1);
    // Contiguous: every load along a walk steps by one element along it.
    // Across rows: consecutive rows differ by one in the last outer variable that has
    // more than one value.
    let last_outer = (0..u as u32).rev().find(|&v| extent(v) > 1);
    let mut layout = Layout::AlongRows;
    for (i, n) in k.nodes.iter().enumerate() {
        let Expr::Load { input, index, .. } = &n.expr else { continue };
        if !live[i] {
            continue;
        }
        let Some(axis) = walk_of(i)? else { continue };
        let off = load_offset(k, *input, index);
        if off.as_ref().is_some_and(|off| off.of(axis) == 1) {
            continue;
        }
        let across = off.is_some_and(|off| last_outer.is_some_and(|v| off.of(v) == 1));
        layout = if across && layout != Layout::Strided { Layout::AcrossRows } else { Layout::Strided };
    }
    let mut axis = Vec::with_capacity(k.nodes.len());
    for (i, &l) in live.iter().enumerate() {
        axis.push(if l { walk_of(i)? } else { None });
    }
    // Many output elements of General kernels, each with short reductions (or strided
    // ones): a thread each, as the general mapping has, so no lanes idle and no
    // shuffles for a few positions each.
    let map = if whole && rows >= ROWS_FOR_THREADS && (layout != Layout::AlongRows || longest <= WARP) {
        Mapping { group: 1, chunks: longest.max(1) }
    } else {
        mapping(layout, longest, rows)
    };
    let out_walk = (!whole).then_some(u as u32);
    let (kept, kept_forms) = if map.unrolled() { keep(k, u, out_walk, &reds, &axis, map) } else { (HashMap::new(), 0) };
    Ok(Plan { u, out_walk, len, rows, reds, map, kept, kept_forms })
}

/// Each node's *form*, a number equal for nodes that compute the same value at the same
/// position of walks of the same length: a walk's variable is the position (with the
/// walk's length), an in-bounds load is its input and affine element offset (outer
/// variables of extent 1 read as 0), a reduction is itself, anything else its
/// operation, type and operands' forms.
fn forms(k: &Kernel, u: usize) -> Vec<usize> {
    let mut ids: HashMap<String, usize> = HashMap::new();
    let mut out: Vec<usize> = Vec::with_capacity(k.nodes.len());
    for (i, n) in k.nodes.iter().enumerate() {
        let mut ops = Vec::new();
        n.expr.for_each_operand(|o| ops.push(out.get(o.index()).copied().unwrap_or(usize::MAX)));
        let text = match &n.expr {
            Expr::Var(v) if v.0 as usize >= u => format!("pos {}", k.vars[v.0 as usize]),
            Expr::Var(v) if k.vars[v.0 as usize] == 1 => format!("{:?} 0", n.ty),
            Expr::Const(bits) => format!("{:?} {bits}", n.ty),
            Expr::Reduce { .. } => format!("reduction {i}"),
            Expr::Load { input, index, bounds: Bounds::InBounds } => match load_offset(k, *input, index) {
                Some(off) => {
                    let mut t = format!("load {input} {}", off.c);
                    for (v, &c) in off.coef.iter().enumerate() {
                        if c != 0 && (v >= u || k.vars[v] > 1) {
                            let what = if v >= u { format!("pos {}", k.vars[v]) } else { format!("v{v}") };
                            t.push_str(&format!(" {c}·{what}"));
                        }
                    }
                    t
                }
                None => format!("load {input} {ops:?}"),
            },
            Expr::Var(v) => format!("v{}", v.0),
            Expr::Unary(op, _) => format!("unary {op:?} {:?} {ops:?}", n.ty),
            Expr::Binary(op, _, _) => format!("binary {op:?} {:?} {ops:?}", n.ty),
            Expr::Select(..) => format!("select {:?} {ops:?}", n.ty),
            Expr::Cast { to, saturate, .. } => format!("cast {to:?} {saturate} {ops:?}"),
            Expr::Load { input, bounds, .. } => format!("load {input} {bounds:?} {ops:?}"),
        };
        let next = ids.len();
        out.push(*ids.entry(text).or_insert(next));
    }
    out
}

/// The values to keep in registers between walks (their nodes, each with its form, and
/// how many forms): walking the walks in order (reductions, then the output row), a
/// walk stops at a value whose form an earlier walk computed, while the registers that
/// holding it costs (one a position, two for 64-bit values) fit in [`CACHE_WORDS`];
/// the forms it stopped at are kept.
fn keep(
    k: &Kernel,
    u: usize,
    out_walk: Option<u32>,
    reds: &[Red],
    axis: &[Option<u32>],
    map: Mapping,
) -> (HashMap<ExprId, usize>, usize) {
    let form = forms(k, u);
    // The walks in the order they are emitted: each reduction's, then the output row's.
    let mut walks: Vec<(u32, Vec<ExprId>)> = reds.iter().map(|r| (r.var, vec![r.body])).collect();
    if let Some(v) = out_walk {
        walks.push((v, vec![k.root]));
    }
    let mut available: HashSet<usize> = HashSet::new();
    let mut used: HashSet<usize> = HashSet::new();
    let mut words = 0;
    for (var, roots) in &walks {
        let mut computed = Vec::new();
        let mut stack: Vec<ExprId> = roots.clone();
        let mut seen = HashSet::new();
        while let Some(e) = stack.pop() {
            if !seen.insert(e) || axis.get(e.index()).copied().flatten() != Some(*var) {
                continue;
            }
            // A position costs nothing to have again.
            if matches!(k.node(e).expr, Expr::Var(_) | Expr::Const(_)) {
                continue;
            }
            let f = form[e.index()];
            if available.contains(&f) {
                let size =
                    if matches!(super::expr::class(k.node(e).ty), RegClass::B64 | RegClass::F64) { 2 } else { 1 };
                let w = k.vars[*var as usize].div_ceil(map.group) * size;
                if used.contains(&f) {
                    continue;
                }
                if words + w <= CACHE_WORDS {
                    words += w;
                    used.insert(f);
                    continue;
                }
            }
            computed.push(f);
            k.node(e).expr.for_each_operand(|o| stack.push(o));
        }
        available.extend(computed);
    }
    let kept: HashMap<ExprId, usize> = (0..k.nodes.len())
        .filter(|&i| used.contains(&form[i]) && axis.get(i).copied().flatten().is_some())
        .map(|i| (ExprId(i as u32), form[i]))
        .collect();
    (kept, used.len())
}

/// The entry of Rows kernel `k`, or why this emitter declines it.
pub fn emit(k: &Kernel) -> Result<Result<Entry, String>, CodegenError> {
    match plan(k, false) {
        Ok(p) => emit_plan(k, p),
        Err(why) => Ok(Err(why)),
    }
}

/// The entry of General kernel `k` with reductions, each output element a row of one
/// element (every output axis a row axis), or why this emitter declines it: a
/// reduction over an axis that is not the output's last (a sum over the channels of
/// NCHW, over the tokens of `[1, T, C]`), or one that drops the reduced axis, is no
/// Rows kernel (its values vary along the output's last axis and the reduction's), but
/// as long as each reduction's operand varies along its own variable alone besides the
/// output's, a group of threads can fold it for each output element: threads along the
/// contiguous axis (a thread per element) where there are many, lanes sharing the
/// reduction where there are few. Declines what [`emit`] declines, and kernels
/// without a reduction.
pub fn emit_general(k: &Kernel) -> Result<Result<Entry, String>, CodegenError> {
    match plan(k, true) {
        Ok(p) => emit_plan(k, p),
        Err(why) => Ok(Err(why)),
    }
}

fn emit_plan(k: &Kernel, plan: Plan) -> Result<Result<Entry, String>, CodegenError> {
    let m = plan.map;
    let nb = k.inputs.len() + 1;
    let mut p = Ptx::new(&k.name, nb);
    if m.group > WARP {
        p.op(&format!(".shared .align 8 .b8 {PARTIALS}[{}]", WARPS * 8), &[]);
    }
    let bases = p.binding_bases(nb);
    let ids = Ids::read(&mut p);
    let Ids { tid, ctaid, nctaid, .. } = ids;
    let lane = p.reg(RegClass::B32);
    p.op("and.b32", &[lane.into(), tid.into(), Imm::I(31).into()]);
    let rows = plan.rows;
    // The row loop's base and stride, the lane within the group, the row's offset from
    // the base (see the module docs and `walk`, which mirrors this arithmetic).
    let (base, stride, glane, sub) = if m.group <= WARP {
        let gtid = ids.global_thread(&mut p);
        let warp = p.reg(RegClass::B64);
        p.op("shr.u64", &[warp.into(), gtid.into(), Imm::I(5).into()]);
        let rw = m.rows_per_warp();
        let base = p.reg(RegClass::B64);
        p.op("mul.lo.u64", &[base.into(), warp.into(), Imm::I(rw as i64).into()]);
        let threads = ids.grid_threads(&mut p);
        let warps = p.reg(RegClass::B64);
        p.op("shr.u64", &[warps.into(), threads.into(), Imm::I(5).into()]);
        let stride = p.reg(RegClass::B64);
        p.op("mul.lo.u64", &[stride.into(), warps.into(), Imm::I(rw as i64).into()]);
        let gl = p.reg(RegClass::B32);
        p.op("and.b32", &[gl.into(), lane.into(), Imm::I(m.group as i64 - 1).into()]);
        let sub = p.reg(RegClass::B32);
        p.op("shr.u32", &[sub.into(), lane.into(), Imm::I(m.group.trailing_zeros() as i64).into()]);
        let sub64 = p.reg(RegClass::B64);
        p.op("cvt.u64.u32", &[sub64.into(), sub.into()]);
        (base, stride, gl, Some(sub64))
    } else {
        let base = p.reg(RegClass::B64);
        p.op("cvt.u64.u32", &[base.into(), ctaid.into()]);
        let stride = p.reg(RegClass::B64);
        p.op("cvt.u64.u32", &[stride.into(), nctaid.into()]);
        (base, stride, tid, None)
    };
    let glane64 = p.reg(RegClass::B64);
    p.op("cvt.u64.u32", &[glane64.into(), glane.into()]);
    // Block form: lane 0 of each warp, and its warp's slot of the shared array.
    let block = if m.group > WARP {
        let first = p.reg(RegClass::Pred);
        p.op("setp.eq.u32", &[first.into(), lane.into(), Imm::I(0).into()]);
        let warp = p.reg(RegClass::B32);
        p.op("shr.u32", &[warp.into(), tid.into(), Imm::I(5).into()]);
        let slots = p.reg(RegClass::B64);
        p.op("mov.u64", &[slots.into(), Opd::Special(PARTIALS)]);
        let slot = p.reg(RegClass::B64);
        p.op("mad.wide.u32", &[slot.into(), warp.into(), Imm::I(8).into(), slots.into()]);
        Some(Block { first, slots, slot })
    } else {
        None
    };
    let (head, end) = (p.label(), p.label());
    p.place(head);
    let done = p.reg(RegClass::Pred);
    p.op("setp.ge.u64", &[done.into(), base.into(), Imm::U(rows).into()]);
    // Uniform: `base` is the same for every thread of the warp (block).
    p.bra(Some((done, false)), end);
    let (row, valid) = match sub {
        Some(sub) => {
            let raw = p.reg(RegClass::B64);
            p.op("add.s64", &[raw.into(), base.into(), sub.into()]);
            let row = p.reg(RegClass::B64);
            p.op("min.u64", &[row.into(), raw.into(), Imm::U(rows - 1).into()]);
            // Lanes past the last row exist only where the rows do not fill the warps.
            let valid = if !rows.is_multiple_of(m.rows_per_warp()) {
                let v = p.reg(RegClass::Pred);
                p.op("setp.lt.u64", &[v.into(), raw.into(), Imm::U(rows).into()]);
                Some(v)
            } else {
                None
            };
            (row, valid)
        }
        None => (base, None),
    };
    let dims = k.output.shape.dims().to_vec();
    let outer = decompose(&mut p, row, &dims[..plan.u]);
    let mut ev = Eval::new(k, &mut p, bases[..k.inputs.len()].to_vec());
    for (d, &r) in outer.iter().enumerate() {
        ev.set_var(d, r);
    }
    let mut cx = Cx { k, plan: &plan, glane: glane64, held: HashMap::new() };
    for red in &plan.reds {
        let acc = cx.reduce(&mut ev, red)?;
        let acc = cx.combine(&mut ev, red, acc, block.as_ref())?;
        ev.given.insert(red.node, acc);
    }
    // The output row.
    let out_base = bases[k.inputs.len()];
    let root = k.root;
    let out_ty = k.node(root).ty;
    let dtype = k.output.dtype;
    let len = plan.len;
    cx.positions(&mut ev, plan.out_walk, &[root], len, valid, &mut |ev, pos| {
        let v = ev.value(root)?;
        let flat = ev.p.reg(RegClass::B64);
        ev.p.op("mad.lo.s64", &[flat.into(), row.into(), Imm::I(len as i64).into(), pos.into()]);
        let addr = ev.address(out_base, flat, dtype)?;
        ev.store_at(addr, dtype, out_ty, v)
    })?;
    drop(ev);
    p.op("add.s64", &[base.into(), base.into(), stride.into()]);
    p.bra(None, head);
    p.place(end);
    let text = p.finish().map_err(|e| internal(k, e))?;
    let unit = if plan.out_walk.is_some() { "row" } else { "output element" };
    let form = match m.group {
        1 => format!("a thread per {unit}"),
        32 => format!("a warp per {unit}"),
        g if g > WARP => format!("a block of {g} per {unit}"),
        g => format!("{g} lanes per {unit}"),
    };
    let walks = if m.unrolled() { "unrolled" } else { "loops" };
    let note = format!(
        "rows ({form}, {} positions a thread, {walks}, {} values kept in registers)",
        m.chunks, plan.kept_forms
    );
    let launch = Launch { grid: m.grid(rows), block: m.block(rows), shared: 0, params: nb as u32 };
    Ok(Ok(Entry { text, launch, note }))
}

/// The block form's shared slots.
struct Block {
    /// Lane 0 of its warp.
    first: Reg,
    /// The array's address.
    slots: Reg,
    /// This warp's slot.
    slot: Reg,
}

/// What the walks share.
struct Cx<'a> {
    k: &'a Kernel,
    plan: &'a Plan,
    /// The thread's lane in its group (i64).
    glane: Reg,
    /// Kept values' registers by form and unrolled position.
    held: HashMap<(usize, u64), Reg>,
}

type R<T> = Result<T, CodegenError>;

impl Cx<'_> {
    /// Walks `var` over `0..extent` (this thread's positions) for the values `roots`,
    /// calling `each` with the position in an i64 register, `var` (if any: a row of one
    /// element has none) set to it, in a scope of its own; skips positions past the
    /// end, and all of them where `valid` (a predicate) is false.
    fn positions(
        &mut self,
        ev: &mut Eval<'_, '_>,
        var: Option<u32>,
        roots: &[ExprId],
        extent: u64,
        valid: Option<Reg>,
        each: &mut dyn FnMut(&mut Eval<'_, '_>, Reg) -> R<()>,
    ) -> R<()> {
        let g = self.plan.map.group;
        let k = self.k;
        // Row values first, once per row, outside every branch.
        let free = k.free_vars();
        let mut mine: Vec<ExprId> = Vec::new();
        for &r in roots {
            for e in nodes_of(k, r) {
                if !mine.contains(&e) {
                    mine.push(e);
                }
            }
        }
        for &e in &mine {
            let row_value = free[e.index()].iter().all(|&v| (v as usize) < self.plan.u);
            if row_value && !matches!(k.node(e).expr, Expr::Const(_) | Expr::Var(_)) && !ev.given.contains_key(&e) {
                ev.value(e)?;
            }
        }
        let kept: Vec<(ExprId, usize)> = mine.iter().filter_map(|e| self.plan.kept.get(e).map(|f| (*e, *f))).collect();
        if self.plan.map.unrolled() {
            for c in 0..extent.div_ceil(g) {
                let pos = if c == 0 {
                    self.glane
                } else {
                    let r = ev.p.reg(RegClass::B64);
                    ev.p.op("add.s64", &[r.into(), self.glane.into(), Imm::I((c * g) as i64).into()]);
                    r
                };
                // Only the last position may be past the end, for some lanes.
                let tail = (c + 1) * g > extent;
                let skip = if tail || valid.is_some() {
                    let l = ev.p.label();
                    let mut ok = None;
                    if tail {
                        let t = ev.p.reg(RegClass::Pred);
                        ev.p.op("setp.lt.u64", &[t.into(), pos.into(), Imm::U(extent).into()]);
                        ok = Some(t);
                    }
                    if let Some(v) = valid {
                        ok = Some(match ok {
                            None => v,
                            Some(t) => {
                                let both = ev.p.reg(RegClass::Pred);
                                ev.p.op("and.pred", &[both.into(), t.into(), v.into()]);
                                both
                            }
                        });
                    }
                    if let Some(ok) = ok {
                        // Divergent: not `bra.uni`.
                        ev.p.op_if(ok, true, "bra", &[l.into()]);
                    }
                    Some(l)
                } else {
                    None
                };
                ev.push_scope();
                if let Some(v) = var {
                    ev.set_var(v as usize, pos);
                }
                // Operands before users (`nodes_of` lists them so): a value held from
                // an earlier walk is given; one computed here first is held.
                for &(e, f) in &kept {
                    match self.held.get(&(f, c)) {
                        Some(&r) => {
                            ev.given.insert(e, r);
                        }
                        None => {
                            let r = ev.value(e)?;
                            self.held.insert((f, c), r);
                        }
                    }
                }
                each(ev, pos)?;
                for (e, _) in &kept {
                    ev.given.remove(e);
                }
                ev.pop_scope();
                if let Some(l) = skip {
                    ev.p.place(l);
                }
            }
        } else {
            let pos = ev.p.reg(RegClass::B64);
            ev.p.op("mov.b64", &[pos.into(), self.glane.into()]);
            let (head, next, end) = (ev.p.label(), ev.p.label(), ev.p.label());
            ev.p.place(head);
            let past = ev.p.reg(RegClass::Pred);
            ev.p.op("setp.ge.u64", &[past.into(), pos.into(), Imm::U(extent).into()]);
            ev.p.op_if(past, false, "bra", &[end.into()]);
            if let Some(v) = valid {
                ev.p.op_if(v, true, "bra", &[next.into()]);
            }
            ev.push_scope();
            if let Some(v) = var {
                ev.set_var(v as usize, pos);
            }
            each(ev, pos)?;
            ev.pop_scope();
            ev.p.place(next);
            ev.p.op("add.s64", &[pos.into(), pos.into(), Imm::I(g as i64).into()]);
            ev.p.bra(None, head);
            ev.p.place(end);
        }
        Ok(())
    }

    /// This thread's fold of `red` over its positions.
    fn reduce(&mut self, ev: &mut Eval<'_, '_>, red: &Red) -> R<Reg> {
        let bits = identity(red.op, red.ty).ok_or_else(|| CodegenError::Internal {
            kernel: self.k.name.clone(),
            what: "an arg reduction in the rows emitter".into(),
        })?;
        let acc = ev.constant(red.ty, bits);
        let op = binary_of(red.op);
        let (ty, body) = (red.ty, red.body);
        let extent = self.k.vars[red.var as usize];
        self.positions(ev, Some(red.var), &[body], extent, None, &mut |ev, _| {
            let x = ev.value(body)?;
            let n = ev.binary(op, ty, acc, x)?;
            ev.p.copy(acc, n);
            Ok(())
        })?;
        Ok(acc)
    }

    /// The group's fold of the threads' values `acc` (every thread of the group ends
    /// with it).
    fn combine(&mut self, ev: &mut Eval<'_, '_>, red: &Red, acc: Reg, block: Option<&Block>) -> R<Reg> {
        let g = self.plan.map.group;
        let op = binary_of(red.op);
        let mut off = g.min(WARP) / 2;
        while off >= 1 {
            let other = shfl_bfly(ev.p, acc, off);
            let n = ev.binary(op, red.ty, acc, other)?;
            ev.p.copy(acc, n);
            off /= 2;
        }
        let Some(b) = block else { return Ok(acc) };
        let (word, raw) = as_word(ev.p, acc);
        ev.p.op_if(b.first, false, &format!("st.shared.{word}"), &[Opd::Addr(b.slot, 0), raw.into()]);
        ev.p.op("bar.sync", &[Imm::I(0).into()]);
        let mut all: Option<Reg> = None;
        for w in 0..WARPS {
            let r = ev.p.reg(raw.class);
            ev.p.op(&format!("ld.shared.{word}"), &[r.into(), Opd::Addr(b.slots, (w * 8) as i64)]);
            let v = from_word(ev.p, acc.class, r);
            all = Some(match all {
                None => v,
                Some(a) => ev.binary(op, red.ty, a, v)?,
            });
        }
        // Every thread has read every slot before any is written again.
        ev.p.op("bar.sync", &[Imm::I(0).into()]);
        let all = all.unwrap_or(acc);
        ev.p.copy(acc, all);
        Ok(acc)
    }
}

/// The binary operation a reduction folds with.
fn binary_of(op: ReduceOp) -> BinaryOp {
    match op {
        ReduceOp::Sum => BinaryOp::Add,
        ReduceOp::Prod => BinaryOp::Mul,
        ReduceOp::Max => BinaryOp::Max,
        _ => BinaryOp::Min,
    }
}

/// `v` as a 32- or 64-bit word for a shuffle or a shared slot: its type suffix and
/// register (a predicate becomes 0 or 1).
fn as_word(p: &mut Ptx, v: Reg) -> (&'static str, Reg) {
    match v.class {
        RegClass::Pred => {
            let r = p.reg(RegClass::B32);
            p.op("selp.u32", &[r.into(), Imm::I(1).into(), Imm::I(0).into(), v.into()]);
            ("b32", r)
        }
        RegClass::B64 | RegClass::F64 => ("b64", v),
        _ => ("b32", v),
    }
}

/// The value of class `c` a word from [`as_word`] holds.
fn from_word(p: &mut Ptx, c: RegClass, w: Reg) -> Reg {
    if c == RegClass::Pred {
        let r = p.reg(RegClass::Pred);
        p.op("setp.ne.u32", &[r.into(), w.into(), Imm::I(0).into()]);
        r
    } else {
        w
    }
}

/// The value `v` of the lane `off` away by xor (`shfl.sync.bfly`, every lane of the
/// warp taking part); 64-bit values as two 32-bit halves. The attention kernels'
/// row reductions take it too.
pub(super) fn shfl_bfly(p: &mut Ptx, v: Reg, off: u64) -> Reg {
    let shfl = |p: &mut Ptx, d: Reg, a: Reg| {
        p.op(
            "shfl.sync.bfly.b32",
            &[d.into(), a.into(), Imm::I(off as i64).into(), Imm::I(31).into(), Imm::U(0xFFFF_FFFF).into()],
        );
    };
    match v.class {
        RegClass::B64 | RegClass::F64 => {
            let (lo, hi) = (p.reg(RegClass::B32), p.reg(RegClass::B32));
            p.op("mov.b64", &[Opd::Vec(vec![lo, hi]), v.into()]);
            let (slo, shi) = (p.reg(RegClass::B32), p.reg(RegClass::B32));
            shfl(p, slo, lo);
            shfl(p, shi, hi);
            let d = p.reg(v.class);
            p.op("mov.b64", &[d.into(), Opd::Vec(vec![slo, shi])]);
            d
        }
        _ => {
            let (_, w) = as_word(p, v);
            let d = p.reg(w.class);
            shfl(p, d, w);
            from_word(p, v.class, d)
        }
    }
}
