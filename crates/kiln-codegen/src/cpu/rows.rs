//! Row kernels as machine code (`iced-x86`): kernels whose output's innermost axis is a
//! row, every other value either constant along the row or read along it, and whose
//! reductions run along a row too — Softmax, LayerNorm, row means and maxima with their
//! epilogues. Cranelift's code for them runs four lanes; this runs sixteen where the
//! target has AVX-512 F (`zmm`, tails under an opmask) and eight elsewhere (AVX2), the
//! same code through [`super::vector`].
//!
//! Every elementwise, row and general kernel whose operations all have a vector form
//! in the shared table ([`super::vops`]: f32, i32/u32, i8/u8 and bool-mask lanes, i64
//! comparisons read from memory) takes this path; the rest stay Cranelift's, with the
//! reason in their note. The vector axis is the output's innermost axis longer than one
//! (for a kernel without a reduction; axes after it have one position: an SE block's
//! `[1, C, 1, 1]`), or its innermost axis; a row shorter than a vector is one masked
//! vector. A workgroup is one row (every output index before the vector axis). Without
//! a reduction, axes before the vector axis join the row while every load reads them
//! contiguously, up to [`JOINED_ROW`] elements (so a large elementwise kernel keeps
//! several workgroups for the threads); where the vector axis is shorter than a vector
//! and nothing joins it so (a transpose to channels last, `[64, 64, 4]`), axes of
//! power-of-two extents join it **by lanes**: each lane decodes its coordinates from its
//! position with a shift and a mask, and a load that does not read the joined axes
//! contiguously is a gather at offsets computed in lanes (64 rows of 256 elements
//! instead of 4096 rows of 4 lanes in 16). Per row,
//! in the kernel's node order:
//! - values constant along the row (row statistics and what is computed from them) are
//!   evaluated once, as vectors of equal lanes kept on the stack;
//! - each reduction (`Sum` or `Max` over one variable) is a loop over its row a vector
//!   at a time, the last vector masked (masked lanes add 0 or compare as −∞), then
//!   folded across lanes;
//! - the output row is a loop that evaluates the kernel's root a vector at a time and
//!   stores it (the last vector masked); a **column reduction** in it (a sum or max over
//!   an axis before the output row's, `Σ_j x[j, i]`: a mean over tokens, a LayerNorm
//!   over channels first) is a loop over its variable for each output vector, each lane
//!   adding in the kernel's order ([`Emit::column_reduction`]).
//!
//! A kernel with a form that has eight lanes only (an i64 conversion to f32) takes eight
//! lanes on an AVX-512 CPU too.
//!
//! **Index lanes.** Index arithmetic that varies along the row — a concatenation's
//! `p < A ? a[min(p, A − 1)] : b[max(p − A, 0)]`, a padding's inside test — runs as i32
//! lanes of positions (`r8 + i`, row coordinates from the stack, [`Emit::lane_eval`];
//! `+ − ×`, min/max, comparisons, selects, and `div`/`rem` by a power of two of a value
//! never negative as a shift and a mask: ConvTranspose's stride-2 phases interleaved)
//! wherever [`lane_form`] bounds every intermediate value within i32: a bool of them is
//! a vector mask, and a load indexed by them a gather at the offsets they give (in
//! bounds by the same ranges). Movement kernels that are not one load (a fused Concat)
//! come here too. A padded load (`Bounds::Pad`) whose index may leave its input checks
//! those dimensions' lanes the same way: lanes outside read nothing (the gather's mask)
//! and take the pad value. An index computed from **i64 data read per lane** (GatherND's
//! `table[clamp(wrap(idx[.., p, 1]))]`) is evaluated in 64-bit lanes ([`lane64_form`],
//! [`Emit::lane_eval64`]: the data gathered by `vpgatherdq`, `+ −` wrapping, max/min,
//! comparisons and selects as the interpreter's i64 arithmetic), and where its range
//! lies within its dimension (a clamp puts it there whatever the data) narrowed to i32
//! offsets for the gather; no clamp is added, so the kernel reads exactly what the
//! interpreter and the general code read.
//!
//! **Registers.** A vector evaluation takes registers from a pool (13 `ymm` on eight
//! lanes; the upper 16 too on sixteen) and gives an operand's back at its last use. A
//! kernel that runs out with operands evaluated in the kernel's order (a fused Concat of
//! many padded pieces is a chain of selects, each holding its condition and piece while
//! the rest of the chain is evaluated) is emitted again with each operation's operands
//! evaluated in decreasing order of their register need ([`register_needs`]: Sethi and
//! Ullman's numbering), so a chain holds about three registers whatever its length. Only
//! then: a kernel that fits keeps its code. In that second form a value kept for a later
//! use that is cheap to make again (a row value, reloaded from its slot; a constant) gives
//! its register up when none is free, unless an operation being evaluated holds it
//! ([`Emit::evict`]): two chains of selects sharing their row conditions (a constant-Q
//! magnitude over concatenated bands) then fit too.
//!
//! On sixteen lanes the kernel holds up to 16 constants in `zmm16`–`zmm31` for its whole
//! run (exp's first, then its own, then erf's): read as memory operands, a polynomial's
//! coefficients cost a load each, and on this machine's AMD EPYC those loads, not the
//! arithmetic, bounded the eight-lane exp (a C loop of the same exp measured 0.55 ns an
//! element with memory operands, 0.35–0.46 with registers, 0.19 on 16 lanes with
//! `vscalefps`). Exp over [128, 1024]: 0.097 ms on eight lanes, 0.030 on sixteen.
//!
//! Two savings, both measured on Softmax over `[4, 128, 128]` on eight lanes (0.133 → 0.082 ms):
//! - where a reduction's operand is also a value of the output row (Softmax's
//!   `exp(x − max)`, summed and then divided), the reduction loop stores it into the
//!   output row and the output loop reads it back: one exp per element instead of two
//!   (an output of bytes, a quantised Softmax, has no room for the 32-bit lanes: the
//!   stash is then a row in the kernel's stack frame, for rows up to 4,096 elements;
//!   Softmax over `[6, 400, 400]` quantised to u8, 5.39 → 3.18 ms on one AVX2 core);
//! - a division of a value along the row by a row value (by the sum) multiplies by its
//!   reciprocal, computed once per row (only with `Options::reassociate`, like the
//!   partial sums: one more rounding).
//!
//! An i8, u8 or bool output is stored from its 32-bit lanes' low bytes: `vpmovdb` on
//! sixteen lanes, `vpshufb` and one 8-byte store on eight ([`Emit::store_bytes8`]; a
//! tail in pieces of 4, 2 and 1 bytes).
//!
//! Operations: those of [`super::vops`] (`+ − × ÷`, `max`/`min` with NaN, comparisons,
//! selects, casts between lane types, rounding, `exp`/`erf`/`tanh`/`log` as the same
//! inline code as everywhere else). Loads are f32, i32, u32, i8, u8 or bool (bytes extended
//! to 32-bit lanes by `vpmovsxbd`/`vpmovzxbd`, a bool then compared with 0; an eight-lane
//! tail read in pieces, never past the row) or i64 under a comparison, in bounds,
//! at offsets that step 0 or 1 element along the row (any other step of 32-bit elements is
//! a gather, `vgatherdps`). An offset is affine, or **row-indexed**: a dimension's index
//! computed from data once per row (an embedding lookup's token id, with its wrap-around
//! and clamp, read at an index affine in the row coordinates once a reshape's `div` and
//! `rem` are taken apart), by scalar code over the row coordinates when the row's base
//! pointers are set ([`Emit::gpr_eval`]), then clamped into the dimension; such loads may clamp (the
//! other dimensions of a clamped load must stay inside by their affine range).
//! Anything else leaves the kernel to the general code generator. Sums are reassociated
//! (one partial sum per lane), as the general generator's vectorised reductions are.

use std::collections::HashMap;

use iced_x86::code_asm::*;
use kiln_flow::affine::{load_offset, AffineIndex};
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::DType;

use super::asm::{add_imm, enter, leave, reserve, Tables, XMM, YMM};
use super::gemm::{no, NotHere, R};
use super::math::held_constants;
use super::vector::{z, Mask, Op, Src, Vx, V};
use super::vops::{
    byte_type, const_word, is_i64_compare, is_i64_data_use, is_i64_to_bool, is_i64_to_f32, lane_type, op_form,
    op_scratch, I64Src,
};

/// Where a value lives along the row.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    /// An index expression (only loads read it).
    Index,
    /// The same for the whole row.
    Row,
    /// Varies along the output row.
    Out,
    /// Varies along the row of reduction `r` (its node).
    Along(u32),
    /// Varies along the output row and along reduction `r`'s variable: the operand of a
    /// column reduction ([`Emit::column_reduction`]), which runs inside the output loop.
    Col(u32),
}

/// A term of a load's offset computed from data once per row (an embedding lookup's
/// token): index expression `expr` of a dimension of `extent` positions and `stride`
/// elements, clamped into the dimension.
#[derive(Clone, PartialEq, Eq, Debug)]
struct RowIndexed {
    expr: ExprId,
    stride: i64,
    extent: i64,
}

/// A load: its base (binding and row-dependent element offset), its step along the row,
/// and in a column reduction's operand its step per iteration of the reduction.
struct LoadPlan {
    base: usize,
    step: i64,
    jstride: i64,
    /// Index terms evaluated as i32 lanes along the row (a concatenation's clamped
    /// positions): (expression, stride in elements); the load is then a gather.
    lanes: Vec<LaneTerm>,
    /// The value of a `Pad` load outside its input (where a lane term is checked).
    pad: u32,
}

/// A term of a load's offset evaluated as i32 lanes ([`Emit::lane_eval`]): index
/// expression `expr` of a dimension of `stride` elements; `check`: the dimension's extent
/// where the index may leave it (a `Pad` load: lanes outside read nothing and take the
/// pad value).
#[derive(Clone, Copy, Debug)]
struct LaneTerm {
    expr: ExprId,
    stride: i64,
    check: Option<i64>,
}

struct Plan {
    place: Vec<Place>,
    loads: HashMap<u32, LoadPlan>,
    /// Distinct (binding, row offset, row-indexed terms) triples; the offset over the
    /// row variables only.
    bases: Vec<(u32, AffineIndex, Vec<RowIndexed>)>,
    /// Row variables (all output variables but the last) and their extents.
    rows: Vec<u64>,
    /// Output row length.
    /// The vector axis (the row runs the output axes `rows.len()..=u`).
    u: u32,
    len: u64,
    /// A reduction whose operand vectors are stored into the output row, and the
    /// output row's value they are (see [`stash`]).
    stash: Option<(u32, u32)>,
    /// The stash is a row of 32-bit elements in the kernel's stack frame, not the
    /// output row (an output of bytes has no room for the operand's lanes).
    stash_in_frame: bool,
    /// Row values that divide values along a row: their reciprocals get a slot, and the
    /// division becomes a multiplication (only where `fast`).
    recip: Vec<u32>,
    /// Bools computed from indices as vector masks ([`Emit::lane_eval`]: a position
    /// compared with a concatenation's boundary, a padding's inside test).
    lane_bool: Vec<bool>,
}

/// The plan of `k` ([`plan_with`]): where the vector axis is shorter than a vector and
/// no axis joins it contiguously (a transpose to channels last, `[64, 64, 4]`), first
/// with axes joined by lanes, then without.
fn plan(k: &Kernel, fast: bool, wide: bool) -> R<Plan> {
    match plan_with(k, fast, wide, true) {
        Ok(p) => Ok(p),
        Err(_) => plan_with(k, fast, wide, false),
    }
}

/// The first output axis of a run `lo..=u` joined by lanes: axes of a power-of-two
/// extent each, together at most [`JOINED_ROW`] elements and each lane's position in
/// them decoded by shifts and masks ([`Emit::lane_eval`]); `u` where the vector axis is
/// a vector or longer, or no axis before it joins.
fn lane_joined_axes(k: &Kernel, u: u32, wide: bool) -> u32 {
    let pow2 = |v: u32| k.vars[v as usize].is_power_of_two();
    if k.vars[u as usize] >= if wide { 16 } else { 8 } || !pow2(u) {
        return u;
    }
    let (mut lo, mut span) = (u, k.vars[u as usize] as i64);
    while lo > 0 && pow2(lo - 1) && span * k.vars[lo as usize - 1] as i64 <= JOINED_ROW {
        lo -= 1;
        span *= k.vars[lo as usize] as i64;
    }
    lo
}

/// Whether the lanes of a row running the axes `lo..=u` can compute output variable `v`
/// from their position: a row coordinate, or a joined axis where every joined extent is
/// a power of two.
fn lane_var(k: &Kernel, v: u32, u: u32, lo: u32) -> bool {
    v < lo || (v == u && lo == u) || (lo..=u).contains(&v) && (lo..=u).all(|x| k.vars[x as usize].is_power_of_two())
}

/// Whether load offset `off` reads the axes `lo..=u` contiguously (or not at all).
fn dense_over(k: &Kernel, off: &AffineIndex, lo: u32, u: u32) -> bool {
    let mut stride = 1i64;
    let dense = (lo..=u).rev().all(|v| {
        let ok = off.of(v) == stride || k.vars[v as usize] == 1;
        stride *= k.vars[v as usize] as i64;
        ok
    });
    dense || (lo..=u).all(|v| off.of(v) == 0)
}

/// The plan of `k`; `lanes_join`: join axes by lanes where the vector axis is short
/// ([`lane_joined_axes`]), loads that do not read them contiguously then gathers at
/// offsets computed in lanes.
fn plan_with(k: &Kernel, fast: bool, wide: bool, lanes_join: bool) -> R<Plan> {
    let rank = k.out_rank();
    if rank == 0 || k.output.shape.numel() == 0 {
        return no("no output axis");
    }
    // (An i8/u8 output, a quantised activation, is stored narrowed from its 32-bit
    // lanes: `vpmovdb` on sixteen lanes, `vpshufb` on eight; a bool output too, its
    // vector mask shifted down to 0 or 1 first.)
    let bytes = matches!(k.output.dtype, DType::I8 | DType::U8 | DType::Bool);
    // Positions: arg-reductions (i64, but below 2³¹) and selects between them, held as
    // i32 lanes and widened to i64 when stored ([`Emit::store_i64`]).
    let position = positions(k);
    let i64_out = k.output.dtype == DType::I64 && position[k.root.index()];
    if !matches!(k.output.dtype, DType::F32 | DType::I32 | DType::U32) && !bytes && !i64_out {
        return no(format!("a {} output (f32, i32 or u32 lanes here)", k.output.dtype.name()));
    }
    // The vector axis: the innermost output axis longer than 1 (axes after it have one
    // position, so the output stays dense row by row); a row shorter than a vector is
    // one masked vector.
    // (With a reduction, the output's innermost axis stays the row: a reduction along
    // it may read the axes before.)
    let reduces = k.nodes.iter().any(|n| matches!(n.expr, Expr::Reduce { .. }));
    let u = if reduces { rank - 1 } else { (0..rank).rev().find(|&v| k.vars[v] > 1).unwrap_or(rank - 1) } as u32;
    // Without a reduction, output axes before the vector axis join it while every load
    // reads the joined axes contiguously (or not at all) and the row stays within
    // `JOINED_ROW` elements: `[C, 14, 14]` runs rows of 196, or of several channels,
    // instead of 14-element rows that each pay for decoding their position.
    let lo = if reduces { u } else { joined_axes(k, u) };
    // (Tried only where it changes the plan.)
    let lane_lo = if lanes_join && !reduces && lo == u { lane_joined_axes(k, u, wide) } else { u };
    let by_lanes = lane_lo < u;
    if lanes_join && !by_lanes {
        return no("no axes to join by lanes");
    }
    let lo = if by_lanes { lane_lo } else { lo };
    let len: u64 = k.vars[lo as usize..=u as usize].iter().product();
    for t in k.inputs.iter().chain([&k.output]) {
        if t.storage_bytes() > i32::MAX as usize {
            return no("an operand over 2 GiB");
        }
    }
    if !fast && k.nodes.iter().any(|n| matches!(n.expr, Expr::Reduce { op: ReduceOp::Sum, .. })) {
        return no("a sum, which eight lanes reassociate");
    }
    let free = k.free_vars();
    // Reduction variable → its reduction node.
    let mut owner: HashMap<u32, u32> = HashMap::new();
    for (i, n) in k.nodes.iter().enumerate() {
        if let Expr::Reduce { op, vars, body } = &n.expr {
            if matches!(op, ReduceOp::ArgMax { .. } | ReduceOp::ArgMin { .. }) {
                if !position[i] || !matches!(k.node(*body).ty, ScalarType::F32 | ScalarType::Bool) {
                    return no("an arg-reduction of other than f32 or bool over one variable");
                }
            } else if !matches!(op, ReduceOp::Sum | ReduceOp::Max) || n.ty != ScalarType::F32 || vars.len() != 1 {
                return no("a reduction other than an f32 sum or max over one variable");
            }
            owner.insert(vars[0].0, i as u32);
        }
    }
    // i64 loads that only i64 comparisons and conversions to f32 read are data (read
    // from memory by them); every other i64 value is index arithmetic.
    let mut compared = vec![false; k.nodes.len()];
    let mut other_use = vec![false; k.nodes.len()];
    for (i, n) in k.nodes.iter().enumerate() {
        let cmp = is_i64_data_use(k, ExprId(i as u32));
        n.expr.for_each_operand(|o| {
            if cmp {
                compared[o.index()] = true;
            } else {
                other_use[o.index()] = true;
            }
        });
    }
    let data_i64 = |i: usize| compared[i] && !other_use[i] && matches!(k.nodes[i].expr, Expr::Load { .. });
    // Output axes other than the vector axis are the row's (those after it have one
    // position).
    let is_row = |v: u32| (v as usize) < rank && !(lo..=u).contains(&v);
    let mut place = Vec::with_capacity(k.nodes.len());
    for (i, n) in k.nodes.iter().enumerate() {
        if n.ty == ScalarType::I64 && !data_i64(i) && !position[i] {
            place.push(Place::Index);
            continue;
        }
        // A comparison of indices (a negative token id's wrap-around) is an index too.
        if let Expr::Binary(op, a, b) = n.expr {
            if op.is_comparison() && place[a.index()] == Place::Index && place[b.index()] == Place::Index {
                place.push(Place::Index);
                continue;
            }
        }
        if n.ty != ScalarType::I64 && !lane_type(n.ty) {
            return no(format!("a {} value", n.ty.name()));
        }
        let mut axes: Vec<u32> =
            free[i].iter().copied().filter(|&v| !is_row(v)).map(|v| if v >= lo && v <= u { u } else { v }).collect();
        axes.dedup();
        let p = match axes[..] {
            [] => Place::Row,
            [v] if v == u => Place::Out,
            [v] => match owner.get(&v) {
                Some(&r) => Place::Along(r),
                None => return no("a variable that is neither a row nor a reduction"),
            },
            // Along the output row and a reduction's variable: a column reduction's
            // operand.
            [a, b] if (a == u || b == u) && owner.contains_key(&(a + b - u)) => Place::Col(owner[&(a + b - u)]),
            _ => return no("a value along two axes"),
        };
        match &n.expr {
            Expr::Const(_) | Expr::Reduce { .. } => {}
            // (A clamped load is checked with its index below.)
            Expr::Load { bounds: Bounds::InBounds | Bounds::Clamp, input, .. } => {
                let d = k.inputs[*input as usize].dtype;
                let lanes = matches!(d, DType::F32 | DType::I32 | DType::U32 | DType::I8 | DType::U8 | DType::Bool);
                if !lanes && d != DType::I64 {
                    return no(format!("a load of {}", d.name()));
                }
            }
            // A padded load of 32-bit elements: checked per lane where it may leave its
            // input (below).
            Expr::Load { bounds: Bounds::Pad(_), input, .. }
                if matches!(k.inputs[*input as usize].dtype, DType::F32 | DType::I32 | DType::U32) => {}
            Expr::Load { .. } => return no("a load that may fall outside its input"),
            // A select between positions: a blend of i32 lanes.
            Expr::Select(..) if position[i] => {}
            _ => op_form(k, ExprId(i as u32), wide).map_err(NotHere)?,
        }
        if position[i] && matches!(n.expr, Expr::Reduce { .. }) && p != Place::Out {
            return no("an arg-reduction along the row (arg-reductions run across rows, a lane per output)");
        }
        place.push(p);
    }
    // Column reductions: those with an operand along the output row. Their operands may
    // read no output value (no reduction nested in another's loop).
    let columns: Vec<u32> = (0..k.nodes.len())
        .filter_map(|i| match place[i] {
            Place::Col(r) => Some(r),
            _ => None,
        })
        .collect();
    // Output values computed from a column reduction.
    let mut from_column = vec![false; k.nodes.len()];
    for (i, n) in k.nodes.iter().enumerate() {
        let mut any = matches!(n.expr, Expr::Reduce { .. }) && columns.contains(&(i as u32));
        n.expr.for_each_operand(|o| any |= from_column[o.index()]);
        from_column[i] = any;
        let inner = matches!(place[i], Place::Col(r) | Place::Along(r) if columns.contains(&r));
        let mut nested = false;
        n.expr.for_each_operand(|o| nested |= inner && from_column[o.index()]);
        if nested {
            return no("a reduction inside a column reduction");
        }
        if let Expr::Reduce { .. } = n.expr {
            if columns.contains(&(i as u32)) && place[i] != Place::Out {
                return no("a column reduction that is not along the output row");
            }
        }
    }
    // Bools of indices that are values (a select's condition) are lanes of positions
    // ([`lane_form`]): vector masks.
    let mut lane_bool = vec![false; k.nodes.len()];
    for i in 0..k.nodes.len() {
        let n = &k.nodes[i];
        let data_use = is_i64_data_use(k, ExprId(i as u32));
        if matches!(n.expr, Expr::Load { .. }) || data_use || place[i] == Place::Index || lane_bool[i] {
            continue;
        }
        let mut ops = Vec::new();
        n.expr.for_each_operand(|o| ops.push(o));
        for o in ops {
            if place[o.index()] != Place::Index || k.node(o).ty != ScalarType::Bool {
                continue;
            }
            if lane_form(k, o, u, lo, 0).is_none() {
                return no("an index used as a value");
            }
            let mut axes: Vec<u32> = free[o.index()].iter().copied().filter(|&v| !is_row(v)).collect();
            axes.dedup();
            place[o.index()] = match axes[..] {
                [] => Place::Row,
                [v] if v == u => Place::Out,
                _ => return no("an index used as a value"),
            };
            lane_bool[o.index()] = true;
        }
    }
    // Index nodes feed loads only.
    for (i, n) in k.nodes.iter().enumerate() {
        if !matches!(n.expr, Expr::Load { .. })
            && !is_i64_compare(k, ExprId(i as u32))
            && !is_i64_to_bool(k, ExprId(i as u32))
            && place[i] != Place::Index
            && !lane_bool[i]
        {
            let mut bad = false;
            n.expr.for_each_operand(|o| bad |= place[o.index()] == Place::Index && n.ty != ScalarType::I64);
            if bad {
                return no("an index used as a value");
            }
        }
    }
    let mut loads = HashMap::new();
    let mut bases: Vec<(u32, AffineIndex, Vec<RowIndexed>)> = Vec::new();
    for (i, n) in k.nodes.iter().enumerate() {
        let Expr::Load { input, index, bounds } = &n.expr else { continue };
        let row_var = |v: u32| v < lo || k.vars.get(v as usize) == Some(&1);
        // (Index lanes computed from i64 data read per lane, [`lane64_form`], in the
        // loads that stay inside their input: a padded load's checked terms are i32.)
        let lane = |e: ExprId| {
            let data = !matches!(bounds, Bounds::Pad(_)) && reads_load(k, e);
            lane_form(k, e, u, lo, 0).or_else(|| data.then(|| lane64_form(k, e, u, lo, 0)).flatten())
        };
        let (off, dynamic, lanes) = match (load_offset(k, *input, index), bounds) {
            (Some(off), Bounds::InBounds) if !by_lanes || dense_over(k, &off, lo, u) => (off, Vec::new(), Vec::new()),
            _ => row_indexed(k, *input, index, *bounds, &row_var, &lane, by_lanes.then_some((lo, u)))?,
        };
        let i64_in = k.inputs[*input as usize].dtype == DType::I64;
        // An i64 load that varies along the row inside index arithmetic: i64 data read
        // per lane (a GatherND's indices), gathered into 64-bit lanes ([`Emit::load64`]).
        let data_lane = place[i] == Place::Index && i64_in && free[i].iter().any(|&v| (lo..=u).contains(&v));
        if data_lane && (by_lanes || *bounds != Bounds::InBounds) {
            return no("i64 index data along axes joined by lanes, or not in bounds");
        }
        let gathers32 = matches!(k.inputs[*input as usize].dtype, DType::F32 | DType::I32 | DType::U32);
        let lanes_ok = gathers32 && matches!(place[i], Place::Out | Place::Row) || i64_in && place[i] == Place::Out;
        if !(lanes.is_empty() || lanes_ok || data_lane) {
            return no("a load at a non-affine offset");
        }
        let reduction_var = |r: u32| match &k.node(ExprId(r)).expr {
            Expr::Reduce { vars, .. } => Some(vars[0].0),
            _ => None,
        };
        let axis = match place[i] {
            Place::Out => Some(u),
            Place::Index if data_lane => Some(u),
            Place::Along(r) if !columns.contains(&r) => reduction_var(r),
            Place::Col(_) | Place::Along(_) => Some(u),
            _ => None,
        };
        let step = axis.map_or(0, |a| off.of(a));
        // In a column reduction's operand, the step per iteration of its variable.
        let jstride = match place[i] {
            Place::Col(r) | Place::Along(r) if columns.contains(&r) => reduction_var(r).map_or(0, |w| off.of(w)),
            _ => 0,
        };
        // Other steps are gathers, of 32-bit elements (f32, i32, u32) or of i64 data
        // (`vpgatherdq`).
        let gathers = gathers32 || i64_in && matches!(place[i], Place::Out | Place::Index);
        let in_reach = step.checked_mul(4 * 16).is_some_and(|b| i32::try_from(b).is_ok());
        if step != 0 && step != 1 && !(gathers && in_reach) {
            return no("a load that strides along the row");
        }
        let mut row = AffineIndex { c: off.c, coef: vec![0; k.vars.len()] };
        for v in 0..lo as usize {
            row.coef[v] = off.of(v as u32);
        }
        let b = match bases.iter().position(|(bi, o, d)| bi == input && *o == row && *d == dynamic) {
            Some(b) => b,
            None => {
                bases.push((*input, row, dynamic));
                bases.len() - 1
            }
        };
        let pad = match bounds {
            Bounds::Pad(bits) => *bits as u32,
            _ => 0,
        };
        loads.insert(i as u32, LoadPlan { base: b, step, jstride, lanes, pad });
    }
    let rows = k.vars[..lo as usize].to_vec();
    // An operand stashed in the output row needs 32-bit elements there; an output of
    // bytes stashes it in the stack frame instead, for rows up to `STASH_FRAME` bytes.
    let stash_in_frame = bytes;
    let stash = if bytes && len * 4 > STASH_FRAME { None } else { stash(k, &place, &free, u) };
    // Divisors that are row values, where the quotient is not: one reciprocal per row,
    // unless the quotient reaches a rounding (the reciprocal's extra rounding moves a
    // quotient such as DynamicQuantizeLinear's −2.5 / (5/255) = −127.49999 onto the tie
    // −127.5, which rounds to −128).
    let rounded = reaches_rounding(k);
    let mut recip = Vec::new();
    if fast {
        for (i, n) in k.nodes.iter().enumerate() {
            if let Expr::Binary(BinaryOp::Div, _, y) = n.expr {
                let row_value = place[y.index()] == Place::Row && !matches!(k.node(y).expr, Expr::Const(_));
                if place[i] != Place::Row && row_value && !rounded[i] && !recip.contains(&y.0) {
                    recip.push(y.0);
                }
            }
        }
    }
    Ok(Plan { place, loads, bases, rows, u, len, stash, stash_in_frame, recip, lane_bool })
}

/// The i64 nodes of `k` that are positions held as i32 lanes: arg-reductions over one
/// variable of fewer than 2³¹ positions, and selects between two positions; each used
/// only by such a select (not as its condition) or as the kernel's root. Other nodes
/// are `false`.
fn positions(k: &Kernel) -> Vec<bool> {
    let mut pos = vec![false; k.nodes.len()];
    for (i, n) in k.nodes.iter().enumerate() {
        pos[i] = match &n.expr {
            Expr::Reduce { op: ReduceOp::ArgMax { .. } | ReduceOp::ArgMin { .. }, vars, .. } => {
                vars.len() == 1 && k.vars[vars[0].0 as usize] <= i32::MAX as u64
            }
            Expr::Select(_, a, b) => pos[a.index()] && pos[b.index()],
            _ => false,
        } && n.ty == ScalarType::I64;
    }
    // A position read by anything else (index arithmetic, a comparison) is not one.
    let mut changed = true;
    while changed {
        changed = false;
        for (i, n) in k.nodes.iter().enumerate() {
            let mut bad = Vec::new();
            match &n.expr {
                Expr::Select(c, ..) if pos[i] => bad.push(*c),
                e => e.for_each_operand(|o| bad.push(o)),
            }
            for o in bad {
                if pos[o.index()] {
                    pos[o.index()] = false;
                    changed = true;
                }
            }
            // A select whose operands stopped being positions stops being one.
            if let Expr::Select(_, a, b) = &n.expr {
                if pos[i] && !(pos[a.index()] && pos[b.index()]) {
                    pos[i] = false;
                    changed = true;
                }
            }
        }
    }
    pos
}

/// The most elements a row of joined axes may have ([`joined_axes`]): 128 vectors of
/// 16 lanes, where a row's set-up is a few instructions against hundreds, and a
/// `[48, 16, 16]` elementwise kernel is 48 rows, not one (which only one thread runs).
const JOINED_ROW: i64 = 2048;

/// The first output axis of the run `lo..=u` that every load reads contiguously (its
/// element offset steps by 1 along `u`, and along each axis before by the extent of the
/// axes after it) or not at all, so the run can be walked as one axis of their product.
fn joined_axes(k: &Kernel, u: u32) -> u32 {
    let offsets: Option<Vec<AffineIndex>> = k
        .nodes
        .iter()
        .filter_map(|n| match &n.expr {
            Expr::Load { input, index, .. } => Some(load_offset(k, *input, index)),
            _ => None,
        })
        .collect();
    let Some(offsets) = offsets else { return u };
    let mut lo = u;
    let mut span = k.vars[u as usize] as i64;
    while lo > 0 {
        let a = lo - 1;
        let fits = offsets.iter().all(|off| {
            let run: Vec<i64> = (lo..=u).map(|v| off.of(v)).collect();
            let untouched = run.iter().all(|&c| c == 0) && off.of(a) == 0;
            let dense = off.of(u) == 1 && off.of(a) == span && {
                let mut stride = 1i64;
                (lo..=u).rev().all(|v| {
                    let ok = off.of(v) == stride;
                    stride *= k.vars[v as usize] as i64;
                    ok
                })
            };
            untouched || dense
        });
        // (An index used other than in a load's offset makes the plan decline anyway.)
        // A joined row stays within JOINED_ROW elements, so a large kernel keeps
        // several workgroups for the threads to share.
        let joined = span.saturating_mul(k.vars[a as usize] as i64);
        if !fits || k.vars[a as usize] == 0 || joined > JOINED_ROW {
            break;
        }
        span = span.saturating_mul(k.vars[a as usize] as i64);
        lo = a;
    }
    lo
}

/// The reduction whose operand, with the reduction's variable read as the output's, is
/// also a value of the output row: `(reduction, value)`. Softmax's sum of
/// `exp(x − max)` is one. The reduction loop then stores each operand vector into the
/// output row, and the output loop reads it back instead of computing it again (a
/// kernel's output never overlaps its inputs, so nothing read later is overwritten).
fn stash(k: &Kernel, place: &[Place], free: &[Vec<u32>], u: u32) -> Option<(u32, u32)> {
    // The output row's values, from the root down to row values.
    let mut out = Vec::new();
    let mut stack = vec![k.root];
    while let Some(e) = stack.pop() {
        if place[e.index()] != Place::Out || out.contains(&e.0) {
            continue;
        }
        out.push(e.0);
        k.node(e).expr.for_each_operand(|o| stack.push(o));
    }
    for (r, n) in k.nodes.iter().enumerate() {
        let Expr::Reduce { vars, body, .. } = &n.expr else { continue };
        // (A column reduction runs inside the output loop.)
        if place[r] != Place::Row {
            continue;
        }
        let w = vars[0].0;
        // Only a computed operand is worth a store and a load.
        if k.vars[w as usize] != k.vars[u as usize] || matches!(k.node(*body).expr, Expr::Load { .. } | Expr::Const(_))
        {
            continue;
        }
        if let Some(&e) = out.iter().find(|&&e| same_along(k, free, *body, ExprId(e), w, u)) {
            return Some((r as u32, e));
        }
    }
    None
}

/// Whether `a`, with variable `w` read as `u`, computes what `b` does.
fn same_along(k: &Kernel, free: &[Vec<u32>], a: ExprId, b: ExprId, w: u32, u: u32) -> bool {
    if a == b {
        return !free[a.index()].iter().any(|&v| v == w || v == u);
    }
    let (na, nb) = (k.node(a), k.node(b));
    if na.ty != nb.ty {
        return false;
    }
    let same = |x: ExprId, y: ExprId| same_along(k, free, x, y, w, u);
    match (&na.expr, &nb.expr) {
        (Expr::Var(x), Expr::Var(y)) => (x.0 == w && y.0 == u) || (x == y && x.0 != w && x.0 != u),
        // A variable of extent 1 is the index 0 (lowering writes either).
        (Expr::Var(x), Expr::Const(0)) | (Expr::Const(0), Expr::Var(x)) => {
            x.0 != w && x.0 != u && k.vars[x.0 as usize] == 1
        }
        (Expr::Const(x), Expr::Const(y)) => x == y,
        (Expr::Load { input: ia, index: xa, bounds: ba }, Expr::Load { input: ib, index: xb, bounds: bb }) => {
            ia == ib && ba == bb && xa.len() == xb.len() && xa.iter().zip(xb).all(|(&x, &y)| same(x, y))
        }
        (Expr::Unary(oa, x), Expr::Unary(ob, y)) => oa == ob && same(*x, *y),
        (Expr::Binary(oa, x1, x2), Expr::Binary(ob, y1, y2)) => oa == ob && same(*x1, *y1) && same(*x2, *y2),
        (Expr::Select(c1, x1, x2), Expr::Select(c2, y1, y2)) => same(*c1, *c2) && same(*x1, *y1) && same(*x2, *y2),
        (Expr::Cast { value: x, to: ta, saturate: sa }, Expr::Cast { value: y, to: tb, saturate: sb }) => {
            ta == tb && sa == sb && same(*x, *y)
        }
        _ => false,
    }
}

/// Per node, whether its value reaches a rounding to an integer: `Round`, `Floor`,
/// `Ceil`, `Trunc`, a cast to an integer dtype, or an integer output's store.
fn reaches_rounding(k: &Kernel) -> Vec<bool> {
    let mut r = vec![false; k.nodes.len()];
    if k.output.dtype.is_int() {
        r[k.root.index()] = true;
    }
    for i in (0..k.nodes.len()).rev() {
        let e = &k.nodes[i].expr;
        let rounds = match e {
            Expr::Unary(UnaryOp::Round | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Trunc, _) => true,
            Expr::Cast { to, .. } => to.is_int(),
            _ => false,
        };
        if rounds || r[i] {
            e.for_each_operand(|o| r[o.index()] = true);
        }
    }
    r
}

/// Emits `k` as a row kernel (code and workgroup count), or says why not. `fast`
/// (`Options::reassociate`) lets sums run as partial sums (one per lane) and a division
/// by a row value be a multiplication by its reciprocal (one more rounding); without it,
/// kernels with a sum are left to the general code generator. `wide`: 16 lanes in `zmm`
/// registers (the target has AVX-512 F) rather than 8 in `ymm`.
pub(crate) fn emit(k: &Kernel, fast: bool, wide: bool) -> R<RowCode> {
    match emit_ordered(k, fast, wide, None) {
        // Operands in the kernel's order hold too many registers at once: evaluate the
        // operand that needs the most registers first ([`register_needs`]). (Only then,
        // so that every kernel that fits keeps its code.)
        Err(NotHere(why)) if why.ends_with(OUT_OF_REGISTERS) => emit_ordered(k, fast, wide, Some(register_needs(k))),
        r => r,
    }
}

/// The end of the reasons a row kernel gives when its vector registers run out.
const OUT_OF_REGISTERS: &str = "needs more registers";

/// For each node, about how many vector registers evaluating it takes when every
/// operation evaluates its operands in decreasing order of need (Sethi and Ullman's
/// numbering, on the expression's tree: a value shared by several uses counts once per
/// use): a leaf 1; an operation of operands needing `n₁ ≥ n₂ ≥ …` the largest of
/// `nᵢ + i − 1` (the operands evaluated earlier each hold a register while the next is
/// evaluated) and 1.
fn register_needs(k: &Kernel) -> Vec<u32> {
    let mut need: Vec<u32> = Vec::with_capacity(k.nodes.len());
    for n in &k.nodes {
        let mut ops: Vec<u32> = Vec::new();
        if matches!(n.expr, Expr::Unary(..) | Expr::Binary(..) | Expr::Select(..) | Expr::Cast { .. }) {
            n.expr.for_each_operand(|o| ops.push(need[o.index()]));
        }
        ops.sort_unstable_by(|a, b| b.cmp(a));
        need.push(ops.iter().enumerate().map(|(i, &m)| m + i as u32).max().unwrap_or(1).max(1));
    }
    need
}

/// [`emit`] with operands evaluated in the kernel's order (`needs` None) or in
/// decreasing order of their register needs.
fn emit_ordered(k: &Kernel, fast: bool, wide: bool, needs: Option<Vec<u32>>) -> R<RowCode> {
    let p = plan(k, fast, wide)?;
    let (stored, reciprocal) = (p.stash.map(|_| p.stash_in_frame), !p.recip.is_empty());
    let held = if wide { held_constants(k.nodes.iter()) } else { Vec::new() };
    let mut e = Emit {
        a: CodeAssembler::new(64)?,
        k,
        p,
        t: Tables::default(),
        slots: HashMap::new(),
        recip_slots: HashMap::new(),
        wide,
        held,
        tail_lanes: 0,
        needs,
        stash_slot: 0,
    };
    let workgroups = e.function()?;
    let row_axes = e.p.rows.len();
    Ok(RowCode { code: e.a.assemble(0)?, workgroups, wide, stored, reciprocal, row_axes })
}

/// A row kernel's code and what it does beyond the plain row loops.
pub(crate) struct RowCode {
    pub code: Vec<u8>,
    pub workgroups: u64,
    /// 16 lanes (AVX-512).
    pub wide: bool,
    /// A reduction stores its operand into the output row (`Some(false)`) or a row in
    /// the stack frame (`Some(true)`), which the output loop reads back ([`stash`]).
    pub stored: Option<bool>,
    /// A division by a row value is a multiplication by its reciprocal.
    pub reciprocal: bool,
    /// A workgroup is one row: the output axes `0..row_axes`, row-major.
    pub row_axes: usize,
}

impl RowCode {
    /// The compile listing's note.
    pub fn note(&self) -> String {
        let mut n = String::from(if self.wide { "row kernel (avx-512" } else { "row kernel (avx2" });
        match self.stored {
            Some(false) => n += "; reduction operand kept in the output",
            Some(true) => n += "; reduction operand kept in the frame",
            None => {}
        }
        if self.reciprocal {
            n += "; reciprocal per row";
        }
        n + ")"
    }
}

struct Emit<'k> {
    a: CodeAssembler,
    k: &'k Kernel,
    p: Plan,
    /// Lane masks and constants, emitted after the code.
    t: Tables,
    /// Row values on the stack (one vector each): node → byte offset from rsp.
    slots: HashMap<u32, i32>,
    /// Reciprocals of the row values in `Plan::recip`: node → byte offset from rsp.
    recip_slots: HashMap<u32, i32>,
    /// 16 lanes (`zmm`) rather than 8.
    wide: bool,
    /// Constants held in registers (16 lanes only).
    held: Vec<(u32, V)>,
    /// Lanes of the tail vector being emitted (what its mask lets through).
    tail_lanes: u64,
    /// Registers each node needs ([`register_needs`]) where operands are evaluated in
    /// decreasing order of need; None: in the kernel's order.
    needs: Option<Vec<u32>>,
    /// Where the stash row starts in the frame (`Plan::stash_in_frame`), from rsp.
    stash_slot: i32,
}

/// The state of one vector evaluation: node → register, remaining uses, free registers.
struct VecEval {
    memo: HashMap<u32, V>,
    uses: HashMap<u32, u32>,
    pool: Vec<V>,
    /// The row value being computed (every other row value comes from its slot).
    computing: Option<u32>,
    /// Registers of the values the operations being evaluated hold (each evaluation's
    /// result until its consumer is emitted): never taken back by [`Emit::evict`].
    pinned: Vec<V>,
}

/// Values of one 64-bit lane evaluation ([`Emit::lane_eval64`]): node → its two
/// halves while later uses remain, and the uses left of each node.
#[derive(Default)]
struct Memo64 {
    vals: HashMap<u32, (V, V)>,
    uses: HashMap<u32, u32>,
}

impl Memo64 {
    /// One use of each of `ops` is done: a value at its last use gives its registers
    /// back to `v`'s pool.
    fn done(&mut self, ops: &[ExprId], v: &mut VecEval) {
        for o in ops {
            let left = self.uses.get_mut(&o.0).map(|u| {
                *u = u.saturating_sub(1);
                *u
            });
            if left.unwrap_or(0) == 0 {
                if let Some((l, h)) = self.vals.remove(&o.0) {
                    v.pool.extend([l, h]);
                }
            }
        }
    }
}

// Stack frame: [0, 8·bases) base pointers, then row values (one vector each), then
// reciprocals, then a stash row when it cannot live in the output.
const S_END: i32 = 0;
const S_ROW: i32 = 8;
const S_BASE: i32 = 16;
/// The longest stash row kept in the frame, in bytes: 4,096 elements of 32 bits (an
/// attention row over 4,096 positions), small beside any thread's stack.
const STASH_FRAME: u64 = 16 * 1024;

/// Registers with fixed roles: the reduction's two accumulators, and fold scratch.
const ACC0: V = V(13);
const ACC1: V = V(14);
const FOLD: [V; 2] = [V(11), V(12)];

impl Emit<'_> {
    fn vx(&mut self) -> Vx<'_> {
        Vx { a: &mut self.a, t: &mut self.t, wide: self.wide, held: &self.held }
    }

    /// The tail mask: `ymm15`, or `k1`.
    fn tail_mask(&self) -> Mask {
        if self.wide {
            Mask(1)
        } else {
            Mask(15)
        }
    }

    /// The mask a NaN-propagating max/min computes (`m` its scratch register on 8 lanes).
    fn nan_mask(&self, m: V) -> Mask {
        if self.wide {
            Mask(3)
        } else {
            Mask(m.0)
        }
    }

    fn function(&mut self) -> R<u64> {
        let k = self.k;
        let rows: u64 = self.p.rows.iter().product();
        let vb = self.vx().bytes();
        // Row values that the root needs, in node order.
        let needed = needed(k);
        // Bases, then the row coordinates (for index lanes), then row values.
        let mut off = self.coord_slot(self.p.rows.len());
        off = (off + vb - 1) / vb * vb;
        for (i, &pl) in self.p.place.iter().enumerate() {
            if pl == Place::Row && needed[i] {
                self.slots.insert(i as u32, off);
                off += vb;
            }
        }
        for &y in &self.p.recip {
            self.recip_slots.insert(y, off);
            off += vb;
        }
        if self.p.stash.is_some() && self.p.stash_in_frame {
            self.stash_slot = off;
            off += (self.p.len as i32 * 4 + vb - 1) / vb * vb;
        }
        let frame = off + 8;
        enter(&mut self.a)?;
        if frame > 4096 {
            reserve(&mut self.a, frame)?;
        } else {
            self.a.sub(rsp, frame)?;
        }
        for (bits, v) in self.held.clone() {
            let l = self.t.scalar(&mut self.a, bits);
            self.vx().broadcast(v, dword_ptr(l))?;
        }
        self.a.mov(rbp, rdi)?;
        self.a.mov(rax, rows as i64)?;
        self.a.cmp(rcx, rax)?;
        self.a.cmova(rcx, rax)?;
        self.a.mov(qword_ptr(rsp + S_END), rcx)?;
        self.a.mov(qword_ptr(rsp + S_ROW), rdx)?;
        let mut done = self.a.create_label();
        self.a.cmp(rdx, rcx)?;
        self.a.jae(done)?;
        let mut top = self.a.create_label();
        self.a.set_label(&mut top)?;
        // Row coordinates (innermost first) into r8.. via div; base pointers to the stack.
        self.bases()?;
        // Output row pointer: out + row·len·4.
        let out = self.k.inputs.len() as i32;
        self.a.mov(r13, qword_ptr(rbp + 8 * out))?;
        self.a.mov(rax, qword_ptr(rsp + S_ROW))?;
        let out_bytes = self.k.output.dtype.storage_bytes(1) as i64;
        self.a.imul_3(rax, rax, (self.p.len as i64 * out_bytes) as i32)?;
        self.a.add(r13, rax)?;
        // Row values and reductions in node order.
        for i in 0..k.nodes.len() {
            if self.p.place[i] != Place::Row || !needed[i] {
                continue;
            }
            let slot = self.slots[&(i as u32)];
            if let Expr::Reduce { op, vars, body } = k.nodes[i].expr.clone() {
                let n = k.vars[vars[0].0 as usize];
                self.reduction(i as u32, op, body, n, slot)?;
            } else {
                let mut v = self.fresh(&[ExprId(i as u32)], |_| true);
                v.computing = Some(i as u32);
                let r = self.eval(ExprId(i as u32), &mut v, None)?;
                self.vx().store(ptr(rsp + slot), r, None)?;
            }
            if let Some(&rs) = self.recip_slots.get(&(i as u32)) {
                let mut x = self.vx();
                x.mov(V(0), Src::C(1f32.to_bits()))?;
                x.op(Op::Div, V(0), V(0), Src::M(ptr(rsp + slot)))?;
                x.store(ptr(rsp + rs), V(0), None)?;
            }
        }
        // The output row.
        let root = k.root;
        let len = self.p.len;
        self.row_loop(len, &mut |e: &mut Self, mask: Option<Mask>| {
            let mut v = e.fresh(&[root], |pl| pl == Place::Out);
            let mut r = e.eval(root, &mut v, mask)?;
            if e.k.output.dtype == DType::Bool {
                // A bool's lanes are all ones or zero: 1 or 0.
                let t = v.pool.pop().ok_or_else(|| NotHere("no register for a bool store".into()))?;
                if e.wide {
                    e.a.vpsrld(z(t), z(r), 31)?;
                } else {
                    e.a.vpsrld(YMM[t.0 as usize], YMM[r.0 as usize], 31)?;
                }
                r = t;
            }
            if out_bytes == 8 {
                // Positions: i32 lanes widened to i64.
                return e.store_i64(r, mask, &mut v);
            }
            if out_bytes == 1 && !e.wide {
                e.store_bytes8(r, mask, &mut v)
            } else if out_bytes == 1 {
                // An i8/u8 value's lanes hold it extended: their low bytes.
                match mask {
                    Some(m) => e.a.vpmovdb(under_mask(xmmword_ptr(r13 + r8), m), z(r))?,
                    None => e.a.vpmovdb(xmmword_ptr(r13 + r8), z(r))?,
                }
                Ok(())
            } else {
                e.vx().store(ptr(r13 + r8 * 4), r, mask)
            }
        })?;
        self.a.mov(rax, qword_ptr(rsp + S_ROW))?;
        self.a.inc(rax)?;
        self.a.mov(qword_ptr(rsp + S_ROW), rax)?;
        self.a.cmp(rax, qword_ptr(rsp + S_END))?;
        self.a.jb(top)?;
        self.a.set_label(&mut done)?;
        leave(&mut self.a, frame)?;
        self.t.emit(&mut self.a)?;
        Ok(rows)
    }

    /// Decodes the row number into its coordinates and writes each base pointer to
    /// the stack.
    fn bases(&mut self) -> R<()> {
        let nrows = self.p.rows.len();
        if nrows > ROW_COORD.len() {
            return no("more than 8 row variables");
        }
        self.a.mov(rax, qword_ptr(rsp + S_ROW))?;
        for d in (0..nrows).rev() {
            self.a.xor(edx, edx)?;
            self.a.mov(rcx, self.p.rows[d] as i64)?;
            self.a.div(rcx)?;
            self.a.mov(ROW_COORD[d], rdx)?;
            let slot = self.coord_slot(d);
            self.a.mov(qword_ptr(rsp + slot), rdx)?;
        }
        for b in 0..self.p.bases.len() {
            let (binding, off, dynamic) = self.p.bases[b].clone();
            let size = elem_size(self.k, binding);
            self.a.mov(rax, qword_ptr(rbp + 8 * binding as i32))?;
            let c = off.c.checked_mul(size).ok_or_else(|| NotHere("offset overflow".into()))?;
            add_imm(&mut self.a, rax, c, rcx)?;
            for (d, &reg) in ROW_COORD.iter().enumerate().take(nrows) {
                let coef = off.of(d as u32) * size;
                if coef != 0 {
                    let coef = i32::try_from(coef).map_err(|_| NotHere("row stride".into()))?;
                    self.a.imul_3(rcx, reg, coef)?;
                    self.a.add(rax, rcx)?;
                }
            }
            let slot = S_BASE + 8 * b as i32;
            self.a.mov(qword_ptr(rsp + slot), rax)?;
            // Row-indexed terms: evaluated from data, clamped into their dimension.
            for t in &dynamic {
                self.gpr_eval(t.expr, 0)?;
                self.clamp_rax(t.extent)?;
                let scale = t.stride.checked_mul(size).and_then(|b| i32::try_from(b).ok());
                let scale = scale.ok_or_else(|| NotHere("row stride".into()))?;
                self.a.imul_3(rax, rax, scale)?;
                self.a.add(qword_ptr(rsp + slot), rax)?;
            }
        }
        Ok(())
    }

    /// A load whose index has lane terms ([`LoadPlan::lanes`]): the element offsets
    /// `step·(r8 + i) + Σ lane·stride` as i32 lanes, then a gather from the row's base;
    /// where a term is checked (a `Pad` load), lanes whose index leaves its dimension
    /// read nothing and take the pad value.
    fn lane_load(
        &mut self,
        base: usize,
        step: i64,
        lanes: &[LaneTerm],
        pad: u32,
        v: &mut VecEval,
        mask: Option<Mask>,
    ) -> R<V> {
        let (idx, [t, t2], inside) = self.lane_offsets(step, lanes, v, mask)?;
        let r = self.result_reg(&[], v)?;
        self.a.mov(rax, qword_ptr(rsp + (S_BASE + 8 * base as i32)))?;
        match inside {
            None => self.vx().gather_at(r, rax, idx, mask, t)?,
            Some(m) => {
                // The gather's mask: inside, and within the tail.
                let gm = if self.wide {
                    self.a.vptestmd(k7, zmm_of(m), zmm_of(m))?;
                    if let Some(tm) = mask {
                        self.a.kandw(k7, k7, k_of(tm))?;
                    }
                    Mask(7)
                } else {
                    self.vx().mov(t2, Src::R(m))?;
                    if let Some(tm) = mask {
                        self.vx().op(Op::And, t2, t2, Src::R(V(tm.0)))?;
                    }
                    Mask(t2.0)
                };
                self.vx().gather_at(r, rax, idx, Some(gm), t)?;
                if pad != 0 {
                    self.vx().mov(t, Src::C(pad))?;
                    self.vx().select(r, m, r, t)?;
                }
                v.pool.push(m);
            }
        }
        v.pool.extend([idx, t, t2]);
        Ok(r)
    }

    /// The element offsets of a load with lane terms ([`LoadPlan::lanes`]), `step·(r8 +
    /// i) + Σ lane·stride`, as i32 lanes, two scratch registers for the gather, and
    /// where a term is checked (a `Pad` load) the mask of the lanes inside every checked
    /// dimension. A term of i64 data read per lane ([`lane64_form`]) is evaluated in
    /// 64-bit lanes and narrowed: its range lies within its dimension (`mask`: the
    /// tail, for the data it reads).
    fn lane_offsets(
        &mut self,
        step: i64,
        lanes: &[LaneTerm],
        v: &mut VecEval,
        mask: Option<Mask>,
    ) -> R<(V, [V; 2], Option<V>)> {
        let imm = |x: i64| i32::try_from(x).ok().map(|w| w as u32);
        let idx = v.pool.pop().ok_or_else(|| NotHere("a gather needs more registers".into()))?;
        let t = self.scratch(2, v)?;
        let (t, t2) = (t[0], t[1]);
        // The lanes inside every checked dimension (all ones until one is checked).
        let inside = if lanes.iter().any(|l| l.check.is_some()) { Some(self.scratch(1, v)?[0]) } else { None };
        if let Some(m) = inside {
            self.vx().mov(m, Src::C(u32::MAX))?;
        }
        self.vx().positions(idx)?;
        let c = imm(step).ok_or_else(|| NotHere("a gather step".into()))?;
        self.vx().mov(t, Src::C(c))?;
        self.vx().int3(BinaryOp::Mul, true, idx, idx, t)?;
        let (u, lo) = (self.p.u, self.p.rows.len() as u32);
        for l in lanes {
            let x = if lane_form(self.k, l.expr, u, lo, 0).is_some() {
                self.lane_eval(l.expr, v)?
            } else {
                self.lane_eval64_narrow(l.expr, v, mask)?
            };
            if let (Some(extent), Some(m)) = (l.check, inside) {
                // 0 ≤ x < extent: x > −1 and extent > x.
                let scratch = self.scratch(2, v)?;
                let mut vx = self.vx();
                vx.mov(t, Src::C(u32::MAX))?;
                vx.int_compare(BinaryOp::Gt, true, t2, x, t, &scratch)?;
                vx.op(Op::And, m, m, Src::R(t2))?;
                let e = imm(extent).ok_or_else(|| NotHere("a padded extent".into()))?;
                vx.mov(t, Src::C(e))?;
                vx.int_compare(BinaryOp::Lt, true, t2, x, t, &scratch)?;
                vx.op(Op::And, m, m, Src::R(t2))?;
                v.pool.extend(scratch);
            }
            let c = imm(l.stride).ok_or_else(|| NotHere("a gather stride".into()))?;
            self.vx().mov(t, Src::C(c))?;
            let mut vx = self.vx();
            vx.int3(BinaryOp::Mul, true, x, x, t)?;
            vx.int3(BinaryOp::Add, true, idx, idx, x)?;
            v.pool.push(x);
        }
        Ok((idx, [t, t2], inside))
    }

    /// Load `e` of i64 data gathered into 64-bit lanes, two halves ([`Vx::gather_i64`]):
    /// at its lane offsets, or at `step` elements a lane; lanes outside the tail `mask`
    /// read nothing and are 0.
    fn load64(&mut self, e: ExprId, v: &mut VecEval, mask: Option<Mask>) -> R<(V, V)> {
        let lp = self.p.loads.get(&e.0).ok_or_else(|| NotHere("an i64 load without a plan".into()))?;
        let (base, step, jstride, lanes) = (lp.base, lp.step, lp.jstride, lp.lanes.clone());
        if jstride != 0 || lanes.iter().any(|l| l.check.is_some()) {
            return no("i64 data gathered in a column reduction or padded");
        }
        let (idx, t, _) = self.lane_offsets(step, &lanes, v, mask)?;
        let (lo, hi) = (self.result_reg(&[], v)?, self.result_reg(&[], v)?);
        self.a.mov(rax, qword_ptr(rsp + (S_BASE + 8 * base as i32)))?;
        self.vx().gather_i64(lo, hi, rax, idx, mask, t)?;
        v.pool.extend([idx, t[0], t[1]]);
        Ok((lo, hi))
    }

    /// Index term `e` ([`lane64_form`]) evaluated in 64-bit lanes and narrowed to i32
    /// lanes (exact: its range lies within its dimension).
    fn lane_eval64_narrow(&mut self, e: ExprId, v: &mut VecEval, mask: Option<Mask>) -> R<V> {
        // Uses of each node this evaluation computes (not those inside the i32 lane
        // forms it widens, nor a load's offsets), so shared values are computed once.
        let (u, lo) = (self.p.u, self.p.rows.len() as u32);
        let mut m = Memo64::default();
        let mut stack = vec![e];
        let mut seen = std::collections::HashSet::new();
        while let Some(x) = stack.pop() {
            if !seen.insert(x.0) || lane_form(self.k, x, u, lo, 0).is_some() {
                continue;
            }
            if matches!(self.k.node(x).expr, Expr::Load { .. }) {
                continue;
            }
            self.k.node(x).expr.for_each_operand(|o| {
                *m.uses.entry(o.0).or_insert(0) += 1;
                stack.push(o);
            });
        }
        let (l, h) = self.lane_eval64(e, v, mask, &mut m)?;
        let t = self.scratch(1, v)?[0];
        let d = self.result_reg(&[], v)?;
        self.vx().narrow_i64(d, l, h, t)?;
        v.pool.extend([l, h, t]);
        Ok(d)
    }

    /// i64 value `e` ([`lane64_form`]) in 64-bit lanes, two halves; values used again
    /// stay in `m` until their last use.
    fn lane_eval64(&mut self, e: ExprId, v: &mut VecEval, mask: Option<Mask>, m: &mut Memo64) -> R<(V, V)> {
        if let Some(&r) = m.vals.get(&e.0) {
            return Ok(r);
        }
        let (u, lo) = (self.p.u, self.p.rows.len() as u32);
        let node = self.k.node(e).clone();
        let r = if lane_form(self.k, e, u, lo, 0).is_some() {
            let x = self.lane_eval(e, v)?;
            let hi = self.result_reg(&[], v)?;
            self.vx().widen_i32(x, hi, x)?;
            (x, hi)
        } else {
            match node.expr {
                Expr::Load { .. } => self.load64(e, v, mask)?,
                Expr::Binary(op, a, b) => {
                    let (xa, xb) = (self.lane_eval64(a, v, mask, m)?, self.lane_eval64(b, v, mask, m)?);
                    let d = (self.result_reg(&[], v)?, self.result_reg(&[], v)?);
                    // (Eight lanes' max/min compare into a scratch register.)
                    let t = if self.wide || !matches!(op, BinaryOp::Max | BinaryOp::Min) {
                        Vec::new()
                    } else {
                        self.scratch(1, v)?
                    };
                    let t0 = t.first().copied().unwrap_or(d.0);
                    self.vx().int64(op, d.0, xa.0, xb.0, t0)?;
                    self.vx().int64(op, d.1, xa.1, xb.1, t0)?;
                    v.pool.extend(t);
                    m.done(&[a, b], v);
                    d
                }
                Expr::Select(c, a, b) => {
                    let mc = self.bool64(c, v, mask, m)?;
                    let (xa, xb) = (self.lane_eval64(a, v, mask, m)?, self.lane_eval64(b, v, mask, m)?);
                    // The 32-bit lane mask widened to 64-bit lanes (all ones stay all ones).
                    let mh = self.result_reg(&[], v)?;
                    self.vx().widen_i32(mc, mh, mc)?;
                    self.vx().select64(mc, xa.0, xb.0)?;
                    self.vx().select64(mh, xa.1, xb.1)?;
                    m.done(&[a, b], v);
                    (mc, mh)
                }
                _ => return no("an i64 index without a 64-bit lane form"),
            }
        };
        // (The term itself, used by none of these nodes, is its caller's to free.)
        if m.uses.get(&e.0).copied().unwrap_or(0) > 0 {
            m.vals.insert(e.0, r);
        }
        Ok(r)
    }

    /// Bool `c` ([`lane64_bool`]) as a 32-bit lane mask.
    fn bool64(&mut self, c: ExprId, v: &mut VecEval, mask: Option<Mask>, m: &mut Memo64) -> R<V> {
        let (u, lo) = (self.p.u, self.p.rows.len() as u32);
        if lane_form(self.k, c, u, lo, 0).is_some() {
            return self.lane_eval(c, v);
        }
        let Expr::Binary(op, a, b) = self.k.node(c).expr else { return no("an i64 condition without a lane form") };
        let (xa, xb) = (self.lane_eval64(a, v, mask, m)?, self.lane_eval64(b, v, mask, m)?);
        let t = self.scratch(3, v)?;
        let d = self.result_reg(&[], v)?;
        self.vx().cmp_i64(op, d, I64Src::Regs(xa.0, xa.1), I64Src::Regs(xb.0, xb.1), None, &t)?;
        v.pool.extend(t);
        m.done(&[a, b], v);
        Ok(d)
    }

    /// The stack slot of row coordinate `d` (after the base pointers).
    fn coord_slot(&self, d: usize) -> i32 {
        S_BASE + 8 * (self.p.bases.len() + d) as i32
    }

    /// Evaluates index expression `e` ([`lane_form`]) as i32 lanes along the row into a
    /// register of `v`'s pool: the position `r8 + i` for the row's variable, a row
    /// coordinate from its slot, a bool as a vector mask; operand registers go back to
    /// the pool.
    fn lane_eval(&mut self, e: ExprId, v: &mut VecEval) -> R<V> {
        let node = self.k.node(e).clone();
        let take = |v: &mut VecEval| v.pool.pop().ok_or_else(|| NotHere("index lanes need more registers".into()));
        let nrows = self.p.rows.len();
        let d = match &node.expr {
            Expr::Const(bits) => {
                let d = take(v)?;
                self.vx().mov(d, Src::C(const_word(node.ty, *bits)))?;
                d
            }
            Expr::Var(x) if (x.0 as usize) < nrows => {
                let d = take(v)?;
                let slot = self.coord_slot(x.0 as usize);
                self.vx().broadcast_dword(d, ptr(rsp + slot))?;
                d
            }
            Expr::Var(x) if self.k.vars.get(x.0 as usize) == Some(&1) => {
                let d = take(v)?;
                self.vx().mov(d, Src::C(0))?;
                d
            }
            Expr::Var(x) => {
                let d = take(v)?;
                self.vx().positions(d)?;
                // An axis of a row joined from several (`lane_var`): the position's
                // digit, every extent a power of two.
                let (lo, u) = (nrows, self.p.u as usize);
                let x = x.0 as usize;
                if lo < u {
                    let after: u64 = self.k.vars[x + 1..=u].iter().product();
                    if after > 1 {
                        self.vx().sra(d, d, after.trailing_zeros() as i32)?;
                    }
                    if x > lo {
                        let m = self.k.vars[x] as u32 - 1;
                        self.vx().op(Op::And, d, d, Src::C(m))?;
                    }
                }
                d
            }
            Expr::Cast { value, .. } => return self.lane_eval(*value, v),
            Expr::Unary(_, a) => {
                let x = self.lane_eval(*a, v)?;
                self.vx().not(x, x)?;
                x
            }
            Expr::Binary(op @ (BinaryOp::Div | BinaryOp::Rem), a, b) => {
                // `lane_form` took these only of a value never negative by a power of two.
                let c = match self.k.node(*b).expr {
                    Expr::Const(c) if (c as i64) > 0 && (c as u64).is_power_of_two() => c as i64,
                    _ => return no("an index divided by other than a power of two"),
                };
                let x = self.lane_eval(*a, v)?;
                if *op == BinaryOp::Div {
                    self.vx().sra(x, x, c.trailing_zeros() as i32)?;
                } else {
                    self.vx().op(Op::And, x, x, Src::C((c - 1) as u32))?;
                }
                x
            }
            Expr::Binary(op, a, b) => {
                let at = self.k.node(*a).ty;
                let x = self.lane_eval(*a, v)?;
                let y = self.lane_eval(*b, v)?;
                let t = self.scratch(2, v)?;
                let mut vx = self.vx();
                match op {
                    BinaryOp::And => vx.op(Op::And, x, x, Src::R(y))?,
                    BinaryOp::Or => vx.op(Op::Or, x, x, Src::R(y))?,
                    BinaryOp::Xor => vx.op(Op::Xor, x, x, Src::R(y))?,
                    BinaryOp::Eq | BinaryOp::Ne if at == ScalarType::Bool => {
                        vx.op(Op::Xor, x, x, Src::R(y))?;
                        if *op == BinaryOp::Eq {
                            vx.not(x, x)?;
                        }
                    }
                    op if op.is_comparison() => vx.int_compare(*op, true, x, x, y, &t)?,
                    op => vx.int3(*op, true, x, x, y)?,
                }
                v.pool.extend(t);
                v.pool.push(y);
                x
            }
            Expr::Select(c, a, b) => {
                let rc = self.lane_eval(*c, v)?;
                let x = self.lane_eval(*a, v)?;
                let y = self.lane_eval(*b, v)?;
                self.vx().select(x, rc, x, y)?;
                v.pool.extend([rc, y]);
                x
            }
            _ => return no("an index without a lane form"),
        };
        Ok(d)
    }

    /// `rax = clamp(rax, 0, extent − 1)` (rcx clobbered).
    fn clamp_rax(&mut self, extent: i64) -> R<()> {
        self.a.xor(ecx, ecx)?;
        self.a.cmp(rax, rcx)?;
        self.a.cmovl(rax, rcx)?;
        self.a.mov(rcx, extent - 1)?;
        self.a.cmp(rax, rcx)?;
        self.a.cmovg(rax, rcx)?;
        Ok(())
    }

    /// Evaluates row-constant index expression `e` ([`gpr_form`]) into `rax` as the
    /// interpreter does (i64 arithmetic wrapping, bools 0 or 1), from the row
    /// coordinates in [`ROW_COORD`] and the kernel's inputs; `rcx` and `rdx` are clobbered
    /// and operands wait on the stack (`depth` values pushed so far, at most
    /// [`GPR_DEPTH`]).
    fn gpr_eval(&mut self, e: ExprId, depth: usize) -> R<()> {
        if depth > GPR_DEPTH {
            return no("an index expression too deep");
        }
        let node = self.k.node(e).clone();
        let rows = self.p.rows.len();
        let row = |v: u32| (v as usize) < rows || self.k.vars.get(v as usize) == Some(&1);
        if let Some(a) = row_affine(self.k, e, &row) {
            // c + Σ coef·coordinate (an axis of one position is 0).
            self.a.mov(rax, a.c)?;
            for (v, &c) in a.coef.iter().enumerate() {
                if c != 0 && v < rows {
                    let c = i32::try_from(c).map_err(|_| NotHere("an index coefficient".into()))?;
                    self.a.imul_3(rcx, ROW_COORD[v], c)?;
                    self.a.add(rax, rcx)?;
                }
            }
            return Ok(());
        }
        // Both operands: a into rax, b into rcx.
        let pair = |s: &mut Self, a: ExprId, b: ExprId| -> R<()> {
            s.gpr_eval(a, depth)?;
            s.a.push(rax)?;
            s.gpr_eval(b, depth + 1)?;
            s.a.mov(rcx, rax)?;
            s.a.pop(rax)?;
            Ok(())
        };
        match &node.expr {
            Expr::Const(bits) => self.a.mov(rax, *bits as i64)?,
            // A row variable's coordinate; an output axis of one position is 0.
            Expr::Var(v) if (v.0 as usize) < self.p.rows.len() => self.a.mov(rax, ROW_COORD[v.0 as usize])?,
            Expr::Var(v) if self.k.vars.get(v.0 as usize) == Some(&1) => self.a.xor(eax, eax)?,
            Expr::Cast { value, .. } => self.gpr_eval(*value, depth)?,
            Expr::Load { input, index, bounds } => {
                // Flat offset Σ index·stride, each index clamped (a no-op for the
                // in-bounds loads the verifier proved), on the stack as it grows.
                let dims: Vec<i64> = self.k.inputs[*input as usize].shape.dims().iter().map(|&d| d as i64).collect();
                self.a.push(0)?;
                let mut stride = 1i64;
                for d in (0..index.len()).rev() {
                    self.gpr_eval(index[d], depth + 1)?;
                    if *bounds == Bounds::Clamp || *bounds == Bounds::InBounds {
                        self.clamp_rax(dims[d])?;
                    }
                    let st = i32::try_from(stride).map_err(|_| NotHere("an index stride".into()))?;
                    self.a.imul_3(rax, rax, st)?;
                    self.a.add(qword_ptr(rsp), rax)?;
                    stride *= dims[d];
                }
                self.a.pop(rax)?;
                self.a.mov(rcx, qword_ptr(rbp + 8 * *input as i32))?;
                match self.k.inputs[*input as usize].dtype {
                    DType::I64 => self.a.mov(rax, qword_ptr(rcx + rax * 8))?,
                    DType::I32 => self.a.movsxd(rax, dword_ptr(rcx + rax * 4))?,
                    d => return no(format!("an index load of {}", d.name())),
                }
            }
            Expr::Binary(op, a, b) => {
                pair(self, *a, *b)?;
                match op {
                    BinaryOp::Add => self.a.add(rax, rcx)?,
                    BinaryOp::Sub => self.a.sub(rax, rcx)?,
                    BinaryOp::Mul => self.a.imul_2(rax, rcx)?,
                    BinaryOp::Min => {
                        self.a.cmp(rax, rcx)?;
                        self.a.cmovg(rax, rcx)?;
                    }
                    BinaryOp::Max => {
                        self.a.cmp(rax, rcx)?;
                        self.a.cmovl(rax, rcx)?;
                    }
                    op if op.is_comparison() => {
                        self.a.cmp(rax, rcx)?;
                        match op {
                            BinaryOp::Eq => self.a.sete(al)?,
                            BinaryOp::Ne => self.a.setne(al)?,
                            BinaryOp::Lt => self.a.setl(al)?,
                            BinaryOp::Le => self.a.setle(al)?,
                            BinaryOp::Gt => self.a.setg(al)?,
                            _ => self.a.setge(al)?,
                        }
                        self.a.movzx(eax, al)?;
                    }
                    op => return no(format!("an index {}", op.name())),
                }
            }
            Expr::Select(c, a, b) => {
                self.gpr_eval(*c, depth)?;
                self.a.push(rax)?;
                pair(self, *a, *b)?;
                self.a.pop(rdx)?;
                self.a.test(rdx, rdx)?;
                // c ? a : b — rax holds a, rcx b.
                self.a.cmovz(rax, rcx)?;
            }
            _ => return no("an index expression without a scalar form here"),
        }
        Ok(())
    }

    /// A loop over `n` elements a vector at a time (`r8` the element index), then the
    /// last `n % lanes` with a lane mask; `body(mask)` emits one vector's work.
    fn row_loop(&mut self, n: u64, body: &mut dyn FnMut(&mut Self, Option<Mask>) -> R<()>) -> R<()> {
        let lanes = self.vx().lanes();
        self.a.xor(r8d, r8d)?;
        let full = n / lanes;
        if full > 0 {
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            body(self, None)?;
            self.a.add(r8, lanes as i32)?;
            self.a.cmp(r8, (full * lanes) as i32)?;
            self.a.jb(l)?;
        }
        if n % lanes > 0 {
            let m = self.tail_mask();
            self.vx().first_lanes(m, n % lanes, eax)?;
            self.tail_lanes = n % lanes;
            body(self, Some(m))?;
        }
        Ok(())
    }

    /// Reduction node `r` (`op` over `n` elements of `body`), its result broadcast to
    /// the stack slot `slot`.
    fn reduction(&mut self, r: u32, op: ReduceOp, body: ExprId, n: u64, slot: i32) -> R<()> {
        // Two accumulators (even and odd vectors) for latency.
        let (acc0, acc1) = (ACC0, ACC1);
        let lanes = self.vx().lanes();
        let init = if op == ReduceOp::Sum { 0u32 } else { f32::NEG_INFINITY.to_bits() };
        for acc in [acc0, acc1] {
            let l = self.t.scalar(&mut self.a, init);
            self.vx().broadcast(acc, dword_ptr(l))?;
        }
        let mut parity = 0usize;
        let mut body_fn = |e: &mut Self, mask: Option<Mask>| -> R<()> {
            let mut v = e.fresh(&[body], |pl| pl == Place::Along(r));
            v.pool.retain(|&x| x != acc0 && x != acc1 && Some(x.0) != mask.map(|m| m.0).filter(|_| !e.wide));
            let x = e.eval(body, &mut v, mask)?;
            if e.p.stash.is_some_and(|(sr, _)| sr == r) {
                let at = e.stash_at();
                e.vx().store(at, x, mask)?;
            }
            if let Some(m) = mask {
                // Masked lanes: 0 for a sum, −∞ for a max.
                if op == ReduceOp::Sum {
                    e.vx().zero_unmasked(x, m)?;
                } else {
                    let t = v.pool.pop().ok_or_else(|| NotHere("registers".into()))?;
                    let mut vx = e.vx();
                    vx.mov(t, Src::C(f32::NEG_INFINITY.to_bits()))?;
                    vx.blend(x, m, t, x)?;
                }
            }
            let acc = if parity % 2 == 0 { acc0 } else { acc1 };
            parity += 1;
            let t1 = v.pool.pop().ok_or_else(|| NotHere("registers".into()))?;
            let t2 = v.pool.pop().ok_or_else(|| NotHere("registers".into()))?;
            e.combine(op, acc, x, [t1, t2])
        };
        // The loop body is emitted once for the full vectors: alternate accumulators by
        // unrolling two vectors per iteration when there are at least two.
        let full = n / lanes;
        self.a.xor(r8d, r8d)?;
        if full >= 2 {
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            body_fn(self, None)?;
            self.a.add(r8, lanes as i32)?;
            body_fn(self, None)?;
            self.a.add(r8, lanes as i32)?;
            self.a.cmp(r8, (full / 2 * 2 * lanes) as i32)?;
            self.a.jb(l)?;
        }
        if full % 2 == 1 {
            body_fn(self, None)?;
            self.a.add(r8, lanes as i32)?;
        }
        if n % lanes > 0 {
            let m = self.tail_mask();
            self.vx().first_lanes(m, n % lanes, eax)?;
            self.tail_lanes = n % lanes;
            body_fn(self, Some(m))?;
        }
        // Fold: the two accumulators, then across lanes (every lane ends with the total).
        self.combine(op, acc0, acc1, FOLD)?;
        let mut step = lanes / 2;
        while step >= 1 {
            self.vx().swap_lanes(acc1, acc0, step)?;
            self.combine(op, acc0, acc1, FOLD)?;
            step /= 2;
        }
        self.vx().store(ptr(rsp + slot), acc0, None)?;
        Ok(())
    }

    /// `acc = op(acc, x)`; `t` is scratch.
    fn combine(&mut self, op: ReduceOp, acc: V, x: V, t: [V; 2]) -> R<()> {
        if op == ReduceOp::Sum {
            self.vx().op(Op::Add, acc, acc, Src::R(x))
        } else {
            self.nan_max_min(true, acc, acc, x, t)
        }
    }

    /// `dst = max(x, y)` (or min): NaN in either gives NaN. `t` is scratch, distinct
    /// from the others; `dst` may be `x` or `y`.
    fn nan_max_min(&mut self, max: bool, dst: V, x: V, y: V, [t, m]: [V; 2]) -> R<()> {
        // vmaxps gives its second operand when either is NaN, so max(x, y) keeps a NaN
        // y; where x is NaN, take x.
        let mask = self.nan_mask(m);
        let mut vx = self.vx();
        vx.op(if max { Op::Max } else { Op::Min }, t, x, Src::R(y))?;
        vx.cmp(mask, x, Src::R(x), 3)?; // UNORD_Q: x is NaN
        vx.blend(dst, mask, t, x)
    }

    /// A fresh evaluation of the nodes under `roots` that `keep` places in the loop (row
    /// values come from their slots).
    fn fresh(&self, roots: &[ExprId], keep: impl Fn(Place) -> bool) -> VecEval {
        let mut uses: HashMap<u32, u32> = HashMap::new();
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<ExprId> = roots.to_vec();
        while let Some(e) = stack.pop() {
            if !seen.insert(e.0) {
                continue;
            }
            let pl = self.p.place[e.index()];
            let n = &self.k.node(e).expr;
            // Below a row value (evaluated already), a load or the stashed value (read
            // from the output row), nothing is evaluated.
            if (pl == Place::Row && !roots.contains(&e))
                || matches!(n, Expr::Load { .. })
                || (pl == Place::Out && self.stashed(e))
                || !keep_or_row(pl, &keep)
            {
                continue;
            }
            // A division by a row value with a reciprocal reads only its dividend.
            let divisor = match n {
                Expr::Binary(BinaryOp::Div, _, y) if pl != Place::Row && self.recip_slots.contains_key(&y.0) => {
                    Some(*y)
                }
                _ => None,
            };
            n.for_each_operand(|o| {
                if Some(o) != divisor {
                    *uses.entry(o.0).or_insert(0) += 1;
                    stack.push(o);
                }
            });
        }
        // 13 registers on 8 lanes (ymm13–15: accumulators and tail mask); on 16, the
        // same and the upper 16 that hold no constant.
        let mut pool: Vec<V> = (0..13).map(V).collect();
        if self.wide {
            pool.extend((16 + self.held.len() as u8..32).map(V));
        }
        pool.reverse();
        VecEval { memo: HashMap::new(), uses, pool, computing: None, pinned: Vec::new() }
    }

    /// The stashed vector at the row position `r8`: in the output row (r13) or in the
    /// frame's stash row.
    fn stash_at(&self) -> AsmMemoryOperand {
        if self.p.stash_in_frame {
            ptr(rsp + r8 * 4 + self.stash_slot)
        } else {
            ptr(r13 + r8 * 4)
        }
    }

    /// Whether `e` is the output row's value that the stashing reduction stored.
    fn stashed(&self, e: ExprId) -> bool {
        self.p.stash.is_some_and(|(_, v)| v == e.0)
    }

    /// A register for a node whose operands are `ops`: an operand's register at its
    /// last use, else a free one.
    fn result_reg(&mut self, ops: &[ExprId], v: &mut VecEval) -> R<V> {
        let memo = &mut v.memo;
        match super::vector::result_reg(ops, &mut v.uses, &mut v.pool, |o| memo.remove(&o)) {
            Some(r) => Ok(r),
            None => self.evict(v).ok_or_else(|| NotHere("a row expression needs more registers".into())),
        }
    }

    /// With operands in order of need ([`Emit::needs`]) only: the register of a value
    /// kept for a later use that is cheap to make again — a row value (reloaded from its
    /// slot) or a constant — and not held by an operation being evaluated; the value is
    /// forgotten, and evaluated again at its next use. (The lowest such node, so the
    /// code is the same on every run.)
    fn evict(&self, v: &mut VecEval) -> Option<V> {
        self.needs.as_ref()?;
        let (&e, _) = v
            .memo
            .iter()
            .filter(|&(&e, r)| {
                let id = ExprId(e);
                let again = matches!(self.k.node(id).expr, Expr::Const(_))
                    || (self.p.place[id.index()] == Place::Row
                        && self.slots.contains_key(&e)
                        && v.computing != Some(e));
                again && !v.pinned.contains(r)
            })
            .min_by_key(|&(&e, _)| e)?;
        v.memo.remove(&e)
    }

    /// Evaluates `e` for the current vector (`r8` the element index; `mask` the lane
    /// mask of a tail vector).
    fn eval(&mut self, e: ExprId, v: &mut VecEval, mask: Option<Mask>) -> R<V> {
        if let Some(&r) = v.memo.get(&e.0) {
            v.pinned.push(r);
            return Ok(r);
        }
        // What `e`'s operands hold is free to go once `e` is computed; `e`'s register is
        // then held for its consumer.
        let mark = v.pinned.len();
        let node = self.k.node(e).clone();
        let pl = self.p.place[e.index()];
        let from_slot = pl == Place::Row
            && self.slots.contains_key(&e.0)
            && !matches!(node.expr, Expr::Const(_))
            && v.computing != Some(e.0);
        let r = if from_slot {
            // A row value evaluated earlier.
            let r = self.result_reg(&[], v)?;
            let at = ptr(rsp + self.slots[&e.0]);
            self.vx().load(r, at, None)?;
            r
        } else if pl == Place::Out && self.stashed(e) {
            // Stored by the reduction loop at this very element.
            let r = self.result_reg(&[], v)?;
            let at = self.stash_at();
            self.vx().load(r, at, mask)?;
            r
        } else if let (Expr::Binary(BinaryOp::Div, x, y), true) = (&node.expr, pl != Place::Row) {
            match self.recip_slots.get(&y.0).copied() {
                Some(rs) => {
                    let rx = self.eval(*x, v, mask)?;
                    let dst = self.result_reg(&[*x], v)?;
                    self.vx().op(Op::Mul, dst, rx, Src::M(ptr(rsp + rs)))?;
                    dst
                }
                None => self.eval_op(e, v, mask)?,
            }
        } else {
            self.eval_op(e, v, mask)?
        };
        v.pinned.truncate(mark);
        v.pinned.push(r);
        v.memo.insert(e.0, r);
        Ok(r)
    }

    /// Evaluates the operands `ops` of one operation, in their order or, with
    /// [`Emit::needs`], the one needing the most registers first; their registers in
    /// the order of `ops`.
    fn eval_operands<const N: usize>(&mut self, ops: [ExprId; N], v: &mut VecEval, mask: Option<Mask>) -> R<[V; N]> {
        let mut order: [usize; N] = core::array::from_fn(|i| i);
        if let Some(need) = &self.needs {
            // Stable: operands of equal need keep their order.
            order.sort_by(|&a, &b| need[ops[b].index()].cmp(&need[ops[a].index()]));
        }
        let mut regs = [V(0); N];
        for i in order {
            regs[i] = self.eval(ops[i], v, mask)?;
        }
        Ok(regs)
    }

    /// Evaluates an operation node (not a row value from its slot, not the stashed value).
    fn eval_op(&mut self, e: ExprId, v: &mut VecEval, mask: Option<Mask>) -> R<V> {
        let node = self.k.node(e).clone();
        if self.p.lane_bool[e.index()] {
            // (Its index operands are not counted as uses: their lanes are this
            // evaluation's own.)
            return self.lane_eval(e, v);
        }
        let r = match &node.expr {
            Expr::Const(bits) => {
                // A copy even of a held constant: the register may be reused as a result.
                let bits = const_word(node.ty, *bits);
                let r = self.result_reg(&[], v)?;
                self.vx().mov(r, Src::C(bits))?;
                r
            }
            Expr::Load { .. } => {
                let lp = &self.p.loads[&e.0];
                let (base, step, jstride) = (lp.base, lp.step, lp.jstride);
                let (lanes, pad) = (lp.lanes.clone(), lp.pad);
                if !lanes.is_empty() {
                    return self.lane_load(base, step, &lanes, pad, v, mask);
                }
                let r = self.result_reg(&[], v)?;
                self.a.mov(rax, qword_ptr(rsp + (S_BASE + 8 * base as i32)))?;
                if jstride != 0 {
                    // Iteration r11 of the column reduction this operand is in.
                    let b = jstride.checked_mul(elem_size(self.k, self.p.bases[base].0));
                    let b = b.and_then(|b| i32::try_from(b).ok()).ok_or_else(|| NotHere("a column stride".into()))?;
                    self.a.imul_3(rcx, r11, b)?;
                    self.a.add(rax, rcx)?;
                }
                let tail = mask.map(|m| (m, self.tail_lanes));
                match (node.ty, step) {
                    (ty, step) if ty == ScalarType::Bool || byte_type(ty) => {
                        let at = if step == 0 { ptr(rax) } else { ptr(rax + r8) };
                        self.vx().load_bytes(ty, r, at, step, tail, [rcx, rdx])?
                    }
                    (_, 0) => self.vx().broadcast(r, dword_ptr(rax))?,
                    (_, 1) => self.vx().load(r, ptr(rax + r8 * 4), mask)?,
                    (_, step) => {
                        // Element r8 of the row is at rax + 4·step·r8.
                        let t = self.scratch(2, v)?;
                        self.a.imul_3(rcx, r8, (4 * step) as i32)?;
                        self.a.add(rcx, rax)?;
                        self.vx().gather(r, rcx, step, mask, [t[0], t[1]])?;
                        v.pool.extend(t);
                    }
                }
                r
            }
            // f32 to f32: the operand's register.
            Expr::Cast { value, to: DType::F32, .. } if self.k.node(*value).ty == ScalarType::F32 => {
                let r = self.eval(*value, v, mask)?;
                if let Some(u) = v.uses.get_mut(&value.0) {
                    *u = u.saturating_sub(1);
                }
                v.memo.remove(&value.0);
                return Ok(r);
            }
            Expr::Binary(op, a, b) if is_i64_compare(self.k, e) => {
                // Operands straight from memory (r9, r10 their base pointers).
                let mut src = [I64Src::Const(0); 2];
                for (j, (x, reg)) in [(*a, r9), (*b, r10)].into_iter().enumerate() {
                    src[j] = self.i64_src(x, reg, v, mask)?;
                }
                let t = self.scratch(3, v)?;
                let dst = self.result_reg(&[*a, *b], v)?;
                self.vx().cmp_i64(*op, dst, src[0], src[1], mask, &t)?;
                v.pool.extend(t);
                give_back(&src, v);
                dst
            }
            Expr::Cast { value, .. } if is_i64_to_bool(self.k, e) => {
                // `x != 0`.
                let src = self.i64_src(*value, r9, v, mask)?;
                let t = self.scratch(3, v)?;
                let dst = self.result_reg(&[*value], v)?;
                self.vx().cmp_i64(BinaryOp::Ne, dst, src, I64Src::Const(0), mask, &t)?;
                v.pool.extend(t);
                give_back(&[src], v);
                dst
            }
            Expr::Cast { value, .. } if is_i64_to_f32(self.k, e) => {
                let src = self.i64_src(*value, r9, v, mask)?;
                let t = self.scratch(6, v)?;
                let dst = self.result_reg(&[*value], v)?;
                self.vx().i64_to_f32(dst, src, mask, &t)?;
                v.pool.extend(t);
                give_back(&[src], v);
                dst
            }
            Expr::Unary(_, x) | Expr::Cast { value: x, .. } => {
                let rx = self.eval(*x, v, mask)?;
                // Scratch first, so the result may take x's register at its last use.
                let t = self.scratch(op_scratch(self.k, e), v)?;
                let dst = self.result_reg(&[*x], v)?;
                {
                    let k = self.k;
                    self.vx().node_op(k, e, dst, &[rx], &t)?;
                }
                v.pool.extend(t);
                dst
            }
            Expr::Binary(_, x, y) => {
                let [rx, ry] = self.eval_operands([*x, *y], v, mask)?;
                let t = self.scratch(op_scratch(self.k, e), v)?;
                let dst = self.result_reg(&[*x, *y], v)?;
                {
                    let k = self.k;
                    self.vx().node_op(k, e, dst, &[rx, ry], &t)?;
                }
                v.pool.extend(t);
                dst
            }
            Expr::Select(c, x, y) => {
                let [rc, rx, ry] = self.eval_operands([*c, *x, *y], v, mask)?;
                let dst = self.result_reg(&[*c, *x, *y], v)?;
                {
                    let k = self.k;
                    self.vx().node_op(k, e, dst, &[rc, rx, ry], &[])?;
                }
                dst
            }
            Expr::Reduce { op, vars, body } if self.p.place[e.index()] == Place::Out => {
                let n = self.k.vars[vars[0].0 as usize];
                self.column_reduction(e.0, *op, *body, n, v, mask)?
            }
            _ => return no("an operation without a row form here"),
        };
        Ok(r)
    }

    /// Column reduction `r` (`op` over `n` values of `body` for each lane of the output
    /// vector: a sum over a non-innermost axis, `Σ_j x[j, i]`), evaluated inside the
    /// output loop as a loop over its variable (`r11`) whose operand loads step by their
    /// `jstride`. Each lane adds its values in the kernel's order (the interpreter's: no
    /// reassociation); lanes outside the tail mask compute what their loads (0) give and
    /// are not stored. The accumulator takes a register of `v`'s pool; the operand is
    /// evaluated with the rest.
    fn column_reduction(
        &mut self,
        r: u32,
        op: ReduceOp,
        body: ExprId,
        n: u64,
        v: &mut VecEval,
        mask: Option<Mask>,
    ) -> R<V> {
        if let ReduceOp::ArgMax { last } | ReduceOp::ArgMin { last } = op {
            return self.arg_column(r, matches!(op, ReduceOp::ArgMax { .. }), last, body, n, v, mask);
        }
        let acc = self.result_reg(&[], v)?;
        let init = if op == ReduceOp::Sum { 0u32 } else { f32::NEG_INFINITY.to_bits() };
        self.vx().mov(acc, Src::C(init))?;
        // (Output values the operand reads, none from a column reduction, are computed
        // in the loop too.)
        let mut inner = self.fresh(&[body], |pl| pl == Place::Col(r) || pl == Place::Along(r) || pl == Place::Out);
        inner.pool = v.pool.clone();
        self.a.xor(r11d, r11d)?;
        let mut top = self.a.create_label();
        self.a.set_label(&mut top)?;
        let x = self.eval(body, &mut inner, mask)?;
        if op == ReduceOp::Sum {
            self.vx().op(Op::Add, acc, acc, Src::R(x))?;
        } else {
            let t = self.scratch(2, &mut inner)?;
            self.nan_max_min(true, acc, acc, x, [t[0], t[1]])?;
        }
        self.a.inc(r11)?;
        self.a.cmp(r11, i32::try_from(n).map_err(|_| NotHere("a column reduction over 2³¹".into()))?)?;
        self.a.jb(top)?;
        Ok(acc)
    }

    /// Arg-reduction `r` as a column reduction (`max` for ArgMax, `last` for the last
    /// position among equals): each lane holds the best value so far and its position
    /// (i32 lanes), as the interpreter folds: the first value seeds them (even NaN),
    /// then a later value replaces them where it compares greater (less; or equal, with
    /// `last`) — ordered comparisons, so a NaN never replaces. A bool operand (vector
    /// masks) orders false before true. The positions are the result.
    #[allow(clippy::too_many_arguments)]
    fn arg_column(
        &mut self,
        r: u32,
        max: bool,
        last: bool,
        body: ExprId,
        n: u64,
        v: &mut VecEval,
        mask: Option<Mask>,
    ) -> R<V> {
        let idx = self.result_reg(&[], v)?;
        let best = v.pool.pop().ok_or_else(|| NotHere("an arg-reduction needs more registers".into()))?;
        let keep = |pl: Place| pl == Place::Col(r) || pl == Place::Along(r) || pl == Place::Out;
        let boolean = self.k.node(body).ty == ScalarType::Bool;
        // Position 0 seeds the lanes.
        self.a.xor(r11d, r11d)?;
        let mut inner = self.fresh(&[body], keep);
        inner.pool = v.pool.clone();
        let x = self.eval(body, &mut inner, mask)?;
        self.vx().mov(best, Src::R(x))?;
        self.vx().mov(idx, Src::C(0))?;
        if n > 1 {
            let n = i32::try_from(n).map_err(|_| NotHere("an arg-reduction over 2³¹".into()))?;
            self.a.mov(r11d, 1)?;
            let mut top = self.a.create_label();
            self.a.set_label(&mut top)?;
            let mut inner = self.fresh(&[body], keep);
            inner.pool = v.pool.clone();
            let x = self.eval(body, &mut inner, mask)?;
            let t = self.scratch(2, &mut inner)?;
            let (t, j) = (t[0], t[1]);
            // The lanes to replace: a vector mask on eight lanes (in `t`), an opmask on
            // sixteen.
            let m = if self.wide { Mask(4) } else { Mask(t.0) };
            if boolean {
                // true > false: x ∧ ¬best (max), ¬x ∧ best (min); with `last` also the
                // equal lanes: x ∨ ¬best, ¬x ∨ best.
                let (a, b) = if max { (x, best) } else { (best, x) };
                let mut vx = self.vx();
                vx.not(t, b)?;
                vx.op(if last { Op::Or } else { Op::And }, t, t, Src::R(a))?;
                if self.wide {
                    self.a.vptestmd(k_of(m), zmm_of(t), zmm_of(t))?;
                }
            } else {
                // GT_OQ, GE_OQ, LT_OQ, LE_OQ: false on NaN.
                let pred = match (max, last) {
                    (true, false) => 0x1E,
                    (true, true) => 0x1D,
                    (false, false) => 0x11,
                    (false, true) => 0x12,
                };
                self.vx().cmp(m, x, Src::R(best), pred)?;
            }
            self.vx().blend(best, m, best, x)?;
            if self.wide {
                self.a.vpbroadcastd(zmm_of(j), r11d)?;
            } else {
                self.a.vmovd(XMM[j.0 as usize], r11d)?;
                self.a.vpbroadcastd(YMM[j.0 as usize], XMM[j.0 as usize])?;
            }
            self.vx().blend(idx, m, idx, j)?;
            self.a.inc(r11)?;
            self.a.cmp(r11, n)?;
            self.a.jb(top)?;
        }
        v.pool.push(best);
        Ok(idx)
    }

    /// Stores the low bytes of eight 32-bit lanes `r` (i8/u8 values, bools as 0 or 1)
    /// into the output row: `vpshufb` gathers each 128-bit half's four into its low
    /// dword, and the two dwords are one 8-byte store; a tail stores its first
    /// `tail_lanes` bytes as pieces of 4, 2 and 1 (never past the row).
    fn store_bytes8(&mut self, r: V, mask: Option<Mask>, v: &mut VecEval) -> R<()> {
        let t = v.pool.pop().ok_or_else(|| NotHere("no register for a byte store".into()))?;
        let q = v.pool.pop().ok_or_else(|| NotHere("no register for a byte store".into()))?;
        let low = 0x0C08_0400;
        let none = 0x8080_8080;
        let l = self.t.words(&mut self.a, &[low, none, none, none, low, none, none, none]);
        let (ty, tx, qx) = (YMM[t.0 as usize], XMM[t.0 as usize], XMM[q.0 as usize]);
        self.a.vpshufb(ty, YMM[r.0 as usize], ymmword_ptr(l))?;
        self.a.vextracti128(qx, ty, 1)?;
        self.a.vpunpckldq(tx, tx, qx)?;
        match mask {
            None => self.a.vmovq(qword_ptr(r13 + r8), tx)?,
            Some(_) => {
                let n = self.tail_lanes as i32;
                self.a.vmovq(rax, tx)?;
                let mut o = 0i32;
                for size in [4i32, 2, 1] {
                    if n - o < size {
                        continue;
                    }
                    match size {
                        4 => self.a.mov(dword_ptr(r13 + r8 + o), eax)?,
                        2 => self.a.mov(word_ptr(r13 + r8 + o), ax)?,
                        _ => self.a.mov(byte_ptr(r13 + r8 + o), al)?,
                    }
                    o += size;
                    if o < n {
                        self.a.shr(rax, 8 * size)?;
                    }
                }
            }
        }
        v.pool.extend([t, q]);
        Ok(())
    }

    /// Stores positions `r` (i32 lanes, each below 2³¹) into the output row as i64
    /// elements, under the tail `mask`; scratch registers come from `v`'s pool.
    fn store_i64(&mut self, r: V, mask: Option<Mask>, v: &mut VecEval) -> R<()> {
        let t = v.pool.pop().ok_or_else(|| NotHere("no register for an i64 store".into()))?;
        if self.wide {
            // Lanes 0–7, then 8–15 (the tail's upper half in k6).
            self.a.vpmovsxdq(zmm_of(t), YMM32[r.0 as usize])?;
            match mask {
                Some(m) => self.a.vmovdqu64(under_mask(zmmword_ptr(r13 + r8 * 8), m), zmm_of(t))?,
                None => self.a.vmovdqu64(zmmword_ptr(r13 + r8 * 8), zmm_of(t))?,
            }
            self.a.vextracti64x4(YMM32[t.0 as usize], zmm_of(r), 1)?;
            self.a.vpmovsxdq(zmm_of(t), YMM32[t.0 as usize])?;
            match mask {
                Some(m) => {
                    self.a.kshiftrw(k_of(Mask(6)), k_of(m), 8)?;
                    self.a.vmovdqu64(under_mask(zmmword_ptr(r13 + r8 * 8 + 64), Mask(6)), zmm_of(t))?
                }
                None => self.a.vmovdqu64(zmmword_ptr(r13 + r8 * 8 + 64), zmm_of(t))?,
            }
            return Ok(());
        }
        let q = v.pool.pop().ok_or_else(|| NotHere("no register for an i64 store".into()))?;
        let (ty, tx, qy, qx) = (YMM[t.0 as usize], XMM[t.0 as usize], YMM[q.0 as usize], XMM[q.0 as usize]);
        for half in 0..2i32 {
            if half == 0 {
                self.a.vpmovsxdq(ty, XMM[r.0 as usize])?;
            } else {
                self.a.vextracti128(tx, YMM[r.0 as usize], 1)?;
                self.a.vpmovsxdq(ty, tx)?;
            }
            let at = ymmword_ptr(r13 + r8 * 8 + 32 * half);
            match mask {
                Some(m) => {
                    // The tail's dword lanes widened to qword lanes.
                    if half == 0 {
                        self.a.vpmovsxdq(qy, XMM[m.0 as usize])?;
                    } else {
                        self.a.vextracti128(qx, YMM[m.0 as usize], 1)?;
                        self.a.vpmovsxdq(qy, qx)?;
                    }
                    self.a.vpmaskmovq(at, qy, ty)?;
                }
                None => self.a.vmovdqu(at, ty)?,
            }
        }
        v.pool.push(q);
        Ok(())
    }

    /// An i64 operand read from memory (an i64 comparison's, a conversion's): a
    /// constant, or load `x` through `reg` (its base pointer, at the element of the
    /// current vector and, in a column reduction, of iteration r11).
    fn i64_src(&mut self, x: ExprId, reg: AsmRegister64, v: &mut VecEval, mask: Option<Mask>) -> R<I64Src> {
        if let Expr::Const(c) = self.k.node(x).expr {
            return Ok(I64Src::Const(c as i64));
        }
        let lp = self.p.loads.get(&x.0).ok_or_else(|| NotHere("an i64 load without a plan".into()))?;
        let (base, step, jstride) = (lp.base, lp.step, lp.jstride);
        if !lp.lanes.is_empty() || !matches!(step, 0 | 1) {
            // At offsets computed in lanes, or strided: gathered into registers.
            let (lo, hi) = self.load64(x, v, mask)?;
            return Ok(I64Src::Regs(lo, hi));
        }
        self.a.mov(reg, qword_ptr(rsp + (S_BASE + 8 * base as i32)))?;
        if jstride != 0 {
            let b = jstride.checked_mul(8).and_then(|b| i32::try_from(b).ok());
            self.a.imul_3(rcx, r11, b.ok_or_else(|| NotHere("a column stride".into()))?)?;
            self.a.add(reg, rcx)?;
        }
        Ok(if step == 0 { I64Src::Broadcast(ptr(reg)) } else { I64Src::Vector(ptr(reg + r8 * 8)) })
    }

    /// `n` scratch registers from the pool.
    fn scratch(&mut self, n: usize, v: &mut VecEval) -> R<Vec<V>> {
        (0..n)
            .map(|_| {
                v.pool
                    .pop()
                    .or_else(|| self.evict(v))
                    .ok_or_else(|| NotHere("a row expression needs more registers".into()))
            })
            .collect()
    }
}

/// The registers of i64 operands gathered into registers ([`I64Src::Regs`]) back to
/// `v`'s pool.
fn give_back(srcs: &[I64Src], v: &mut VecEval) {
    for s in srcs {
        if let I64Src::Regs(lo, hi) = *s {
            v.pool.extend([lo, hi]);
        }
    }
}

/// The `ymm` registers of all 32 vector registers (the low halves of `zmm16`–`zmm31` too).
const YMM32: [AsmRegisterYmm; 32] = [
    ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14, ymm15, ymm16, ymm17,
    ymm18, ymm19, ymm20, ymm21, ymm22, ymm23, ymm24, ymm25, ymm26, ymm27, ymm28, ymm29, ymm30, ymm31,
];

/// The `zmm` register of `v`.
fn zmm_of(v: V) -> AsmRegisterZmm {
    super::vector::z(v)
}

/// The opmask register of `m`.
fn k_of(m: Mask) -> AsmRegisterK {
    super::vector::k(m)
}

/// The row coordinates while a row's bases are computed ([`Emit::bases`]): registers,
/// since coordinates on the stack after the bases would need room (up to 8 row
/// variables).
const ROW_COORD: [AsmRegister64; 8] = [r8, r9, r10, r11, r12, r14, r15, rbx];

/// Operands an index expression ([`Emit::gpr_eval`]) may hold on the stack at once.
const GPR_DEPTH: usize = 16;

/// Whether `e` is an index expression [`Emit::gpr_eval`] computes once per row: i64 (or
/// bool, or i32 loads cast to i64) constants, row variables (`row(v)`), loads of i64/i32
/// tensors, `+ − ×`, min/max, comparisons and selects, within [`GPR_DEPTH`].
fn gpr_form(k: &Kernel, e: ExprId, row: &impl Fn(u32) -> bool, depth: usize) -> bool {
    if depth > GPR_DEPTH {
        return false;
    }
    let node = k.node(e);
    let int = |x: ExprId| matches!(k.node(x).ty, ScalarType::I64 | ScalarType::Bool);
    let sub = |x: ExprId| gpr_form(k, x, row, depth + 1);
    if row_affine(k, e, row).is_some() {
        return true;
    }
    match &node.expr {
        Expr::Const(_) => int(e),
        Expr::Var(v) => row(v.0),
        Expr::Cast { value, to: DType::I64, .. } => {
            matches!(k.node(*value).ty, ScalarType::I64 | ScalarType::I32) && sub(*value)
        }
        Expr::Load { input, index, bounds: Bounds::InBounds | Bounds::Clamp } => {
            matches!(k.inputs[*input as usize].dtype, DType::I64 | DType::I32) && index.iter().all(|&x| sub(x))
        }
        Expr::Binary(op, a, b) => {
            let ok = matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Min | BinaryOp::Max)
                || op.is_comparison();
            ok && k.node(*a).ty == ScalarType::I64 && int(e) && sub(*a) && sub(*b)
        }
        Expr::Select(c, a, b) => int(e) && k.node(*c).ty == ScalarType::Bool && sub(*c) && sub(*a) && sub(*b),
        _ => false,
    }
}

/// An i64 index expression other than a variable or a constant that is affine in the
/// row's coordinates alone (`row(v)`; a reshape's flat index taken apart where exact:
/// `v rem 2048` of a `v < 2048` is `v`), as that form: [`Emit::gpr_eval`] computes it
/// from the coordinates directly.
fn row_affine(k: &Kernel, e: ExprId, row: &impl Fn(u32) -> bool) -> Option<AffineIndex> {
    let node = k.node(e);
    if node.ty != ScalarType::I64 || matches!(node.expr, Expr::Var(_) | Expr::Const(_)) {
        return None;
    }
    let a = kiln_flow::affine::affine(k, e)?;
    a.coef.iter().enumerate().all(|(v, &c)| c == 0 || row(v as u32)).then_some(a)
}

/// The offset of a load whose index is not one affine form: each dimension's index is
/// affine (within the dimension wherever the load clamps) or computed from data once
/// per row ([`gpr_form`]; `row(v)`: whether variable `v` is a row's). Returns the affine
/// part and the row-indexed terms.
fn row_indexed(
    k: &Kernel,
    input: u32,
    index: &[ExprId],
    bounds: Bounds,
    row: &impl Fn(u32) -> bool,
    lane: &impl Fn(ExprId) -> Option<(i64, i64)>,
    joined: Option<(u32, u32)>,
) -> R<SplitOffset> {
    let clamps = bounds == Bounds::Clamp;
    let pads = matches!(bounds, Bounds::Pad(_));
    // An index that may leave its dimension of a padded load: a checked lane term.
    let checked = |e: ExprId, stride: i64, extent: i64| -> R<LaneTerm> {
        match lane(e) {
            Some((lo, hi)) if pads && lo.abs().max(hi.abs()).checked_mul(stride).is_some_and(|b| b < 1 << 28) => {
                Ok(LaneTerm { expr: e, stride, check: Some(extent) })
            }
            _ => no("a load that may fall outside its input"),
        }
    };
    let dims = k.inputs[input as usize].shape.dims();
    let mut flat = AffineIndex { c: 0, coef: vec![0; k.vars.len()] };
    let mut dynamic = Vec::new();
    let mut lanes = Vec::new();
    let mut stride = 1i64;
    for (d, &e) in index.iter().enumerate().rev() {
        let extent = dims[d] as i64;
        match kiln_flow::affine::affine(k, e).or_else(|| clamped_affine(k, e)) {
            // An index along axes joined by lanes: a lane term (the load's gather).
            Some(a) if joined.is_some_and(|(lo, u)| (lo..=u).any(|v| a.of(v) != 0)) => match lane(e) {
                Some((lo, hi)) if lo >= 0 && hi < extent && hi.checked_mul(stride).is_some_and(|b| b < 1 << 28) => {
                    lanes.push(LaneTerm { expr: e, stride, check: None })
                }
                _ => return no("a load along joined axes outside its input"),
            },
            Some(a) => {
                let inside = a.range(k).is_some_and(|(lo, hi)| lo >= 0 && hi < extent);
                if clamps && !inside {
                    return no("a load that may fall outside its input");
                }
                if pads && !inside {
                    lanes.push(checked(e, stride, extent)?);
                    stride = stride.checked_mul(extent).ok_or_else(overflow)?;
                    continue;
                }
                flat.c = a.c.checked_mul(stride).and_then(|x| x.checked_add(flat.c)).ok_or_else(overflow)?;
                for (f, c) in flat.coef.iter_mut().zip(&a.coef) {
                    *f = c.checked_mul(stride).and_then(|x| x.checked_add(*f)).ok_or_else(overflow)?;
                }
            }
            None if pads => lanes.push(checked(e, stride, extent)?),
            None if gpr_form(k, e, row, 0) => dynamic.push(RowIndexed { expr: e, stride, extent }),
            // Along the row, as lanes: inside the dimension by its range (a clamped load
            // too), the offset within 32 bits.
            None => match lane(e) {
                Some((lo, hi)) if lo >= 0 && hi < extent && hi.checked_mul(stride).is_some_and(|b| b < 1 << 28) => {
                    lanes.push(LaneTerm { expr: e, stride, check: None })
                }
                _ => return no("a load at a non-affine offset"),
            },
        }
        stride = stride.checked_mul(extent).ok_or_else(overflow)?;
    }
    Ok((flat, dynamic, lanes))
}

/// The range of index expression `e` evaluated as i32 lanes along the row
/// ([`Emit::lane_eval`]), where it has that form: constants, the row's position (`u`,
/// unless axes are joined into it, `lo < u`), row coordinates, axes of one position;
/// `+ − ×`, min/max, comparisons, bool and/or/xor/not and selects, every intermediate
/// value within i32 (so i32 lanes compute what the kernel's i64 arithmetic does).
fn lane_form(k: &Kernel, e: ExprId, u: u32, lo: u32, depth: usize) -> Option<(i64, i64)> {
    if depth > GPR_DEPTH {
        return None;
    }
    let node = k.node(e);
    let r = |x: ExprId| lane_form(k, x, u, lo, depth + 1);
    let fits = |(a, b): (i64, i64)| (a >= i32::MIN as i64 && b <= i32::MAX as i64).then_some((a, b));
    let (i64t, boolt) = (ScalarType::I64, ScalarType::Bool);
    match &node.expr {
        Expr::Const(b) if node.ty == i64t => fits((*b as i64, *b as i64)),
        Expr::Const(_) if node.ty == boolt => Some((0, 1)),
        Expr::Var(v) => {
            let n = *k.vars.get(v.0 as usize)? as i64;
            (n == 1 || lane_var(k, v.0, u, lo)).then_some(())?;
            fits((0, n - 1))
        }
        Expr::Cast { value, to: DType::I64, .. } if k.node(*value).ty == i64t => r(*value),
        Expr::Unary(UnaryOp::Not, a) if node.ty == boolt => r(*a).map(|_| (0, 1)),
        Expr::Binary(op, a, b) => {
            let at = k.node(*a).ty;
            let (x, y) = (r(*a)?, r(*b)?);
            if (op.is_comparison() && at == i64t)
                || (at == boolt
                    && matches!(op, BinaryOp::And | BinaryOp::Or | BinaryOp::Xor | BinaryOp::Eq | BinaryOp::Ne))
            {
                return Some((0, 1));
            }
            if at != i64t {
                return None;
            }
            let v = match op {
                BinaryOp::Add => (x.0.checked_add(y.0)?, x.1.checked_add(y.1)?),
                BinaryOp::Sub => (x.0.checked_sub(y.1)?, x.1.checked_sub(y.0)?),
                BinaryOp::Mul => {
                    let c =
                        [x.0.checked_mul(y.0)?, x.0.checked_mul(y.1)?, x.1.checked_mul(y.0)?, x.1.checked_mul(y.1)?];
                    (*c.iter().min()?, *c.iter().max()?)
                }
                BinaryOp::Min => (x.0.min(y.0), x.1.min(y.1)),
                BinaryOp::Max => (x.0.max(y.0), x.1.max(y.1)),
                // Of a value never negative by a power of two: a shift or a mask
                // (ConvTranspose's phases interleaved, `p div 2` and `p rem 2`).
                BinaryOp::Div if x.0 >= 0 && pow2(y).is_some() => (x.0 / y.0, x.1 / y.0),
                BinaryOp::Rem if x.0 >= 0 && pow2(y).is_some() => (0, x.1.min(y.0 - 1)),
                _ => return None,
            };
            fits(v)
        }
        Expr::Select(c, a, b) if node.ty == i64t || node.ty == boolt => {
            r(*c)?;
            let (x, y) = (r(*a)?, r(*b)?);
            Some((x.0.min(y.0), x.1.max(y.1)))
        }
        _ => None,
    }
}

/// The range of i64 index expression `e` evaluated in 64-bit lanes along the row
/// ([`Emit::lane_eval64`]) where [`lane_form`] has no i32 form for it because it reads
/// i64 data per lane (a GatherND's index read from its index tensor, wrapped and
/// clamped): in-bounds i64 loads (any value), what `lane_form` takes (sign-extended),
/// `+ −` (wrapping, as the interpreter's i64 arithmetic: a sum that may overflow has
/// any value), signed min/max, and selects on comparisons of such values. `None` for
/// anything else.
fn lane64_form(k: &Kernel, e: ExprId, u: u32, lo: u32, depth: usize) -> Option<(i64, i64)> {
    const ANY: (i64, i64) = (i64::MIN, i64::MAX);
    let node = k.node(e);
    if depth > GPR_DEPTH || node.ty != ScalarType::I64 {
        return None;
    }
    if let Some(r) = lane_form(k, e, u, lo, depth) {
        return Some(r);
    }
    let r = |x: ExprId| lane64_form(k, x, u, lo, depth + 1);
    match &node.expr {
        Expr::Load { input, bounds: Bounds::InBounds, .. } if k.inputs[*input as usize].dtype == DType::I64 => {
            Some(ANY)
        }
        Expr::Binary(op @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Min | BinaryOp::Max), a, b) => {
            let (x, y) = (r(*a)?, r(*b)?);
            Some(match op {
                BinaryOp::Add => x.0.checked_add(y.0).zip(x.1.checked_add(y.1)).unwrap_or(ANY),
                BinaryOp::Sub => x.0.checked_sub(y.1).zip(x.1.checked_sub(y.0)).unwrap_or(ANY),
                BinaryOp::Min => (x.0.min(y.0), x.1.min(y.1)),
                _ => (x.0.max(y.0), x.1.max(y.1)),
            })
        }
        Expr::Select(c, a, b) if lane64_bool(k, *c, u, lo, depth + 1) => {
            let (x, y) = (r(*a)?, r(*b)?);
            Some((x.0.min(y.0), x.1.max(y.1)))
        }
        _ => None,
    }
}

/// Whether expression `e` reads a load (index data).
fn reads_load(k: &Kernel, e: ExprId) -> bool {
    let mut seen = std::collections::HashSet::new();
    let mut stack = vec![e];
    while let Some(x) = stack.pop() {
        if !seen.insert(x.0) {
            continue;
        }
        if matches!(k.node(x).expr, Expr::Load { .. }) {
            return true;
        }
        k.node(x).expr.for_each_operand(|o| stack.push(o));
    }
    false
}

/// Whether bool `e` has a lane form beside [`lane64_form`]'s values: [`lane_form`]'s,
/// or a comparison of two i64 values `lane64_form` takes ([`Emit::bool64`]).
fn lane64_bool(k: &Kernel, e: ExprId, u: u32, lo: u32, depth: usize) -> bool {
    if k.node(e).ty != ScalarType::Bool || depth > GPR_DEPTH {
        return false;
    }
    if lane_form(k, e, u, lo, depth).is_some() {
        return true;
    }
    match k.node(e).expr {
        Expr::Binary(op, a, b) if op.is_comparison() && k.node(a).ty == ScalarType::I64 => {
            lane64_form(k, a, u, lo, depth + 1).is_some() && lane64_form(k, b, u, lo, depth + 1).is_some()
        }
        _ => false,
    }
}

/// The power of two `2^s` a lane range holds alone (a constant divisor): `s`.
fn pow2((lo, hi): (i64, i64)) -> Option<u32> {
    (lo == hi && lo > 0 && (lo as u64).is_power_of_two()).then(|| lo.trailing_zeros())
}

/// `min(max(x, lo), hi)` (or `max(min(x, hi), lo)`) of an affine `x` whose range lies
/// within the constants `lo..=hi` (a clamp lowering wrote along an axis that cannot
/// leave its input): `x` itself.
fn clamped_affine(k: &Kernel, e: ExprId) -> Option<AffineIndex> {
    let konst = |x: ExprId| match k.node(x).expr {
        Expr::Const(b) if k.node(x).ty == ScalarType::I64 => Some(b as i64),
        _ => None,
    };
    let Expr::Binary(outer @ (BinaryOp::Min | BinaryOp::Max), y, c1) = k.node(e).expr else { return None };
    let Expr::Binary(inner @ (BinaryOp::Min | BinaryOp::Max), x, c2) = k.node(y).expr else { return None };
    if inner == outer {
        return None;
    }
    let (b1, b2) = (konst(c1)?, konst(c2)?);
    let (lo, hi) = if outer == BinaryOp::Min { (b2, b1) } else { (b1, b2) };
    let a = kiln_flow::affine::affine(k, x)?;
    let (l, h) = a.range(k)?;
    (l >= lo && h <= hi).then_some(a)
}

/// A load's offset taken apart ([`row_indexed`]): the affine part, the row-indexed terms
/// and the lane terms (expression, stride).
type SplitOffset = (AffineIndex, Vec<RowIndexed>, Vec<LaneTerm>);

fn overflow() -> NotHere {
    NotHere("offset overflow".into())
}

/// Bytes of one element of input `binding` (4, 8 for i64, 1 for i8 and u8).
fn elem_size(k: &Kernel, binding: u32) -> i64 {
    match k.inputs.get(binding as usize).map(|t| t.dtype) {
        Some(DType::I64) => 8,
        Some(DType::I8 | DType::U8 | DType::Bool) => 1,
        _ => 4,
    }
}

fn keep_or_row(pl: Place, keep: &impl Fn(Place) -> bool) -> bool {
    pl == Place::Row || keep(pl)
}

/// The nodes the root depends on.
fn needed(k: &Kernel) -> Vec<bool> {
    let mut need = vec![false; k.nodes.len()];
    need[k.root.index()] = true;
    for i in (0..k.nodes.len()).rev() {
        // (A load's index is its plan's, never a vector.)
        if need[i] && !matches!(k.nodes[i].expr, Expr::Load { .. }) {
            k.nodes[i].expr.for_each_operand(|o| need[o.index()] = true);
        }
    }
    need
}

/// Memory operand `m` written under opmask `k` (a 16-lane tail).
fn under_mask(m: AsmMemoryOperand, k: Mask) -> AsmMemoryOperand {
    match k.0 {
        1 => m.k1(),
        2 => m.k2(),
        3 => m.k3(),
        4 => m.k4(),
        5 => m.k5(),
        6 => m.k6(),
        _ => m.k7(),
    }
}
