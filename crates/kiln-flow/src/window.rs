//! Recognising sliding windows over channel planes — depthwise convolutions, max pools
//! and average pools — that read their input through `Pad` bounds.
//!
//! A depthwise convolution (`Conv` with `group = C`, one filter per channel) is a
//! sliding window over each channel plane: `out[n, c, oh, ow] = epilogue(Σ_{kh,kw}
//! x[n, c, sh·oh + dh·kh + ph, sw·ow + dw·kw + pw] · w[c, kh, kw])`, reading 0 outside
//! the plane. A max pool is the same window with `max` for `Σ ·w`, NaN ignored and −∞
//! outside the plane ([`WindowOp::Max`]); an average pool the plain `Σ x`
//! ([`WindowOp::Sum`]) with its divisor in the epilogue. A target with a direct kernel for this form
//! handles the plane's border itself (masked loads at the edges), so the padded copy
//! that [`crate::layout::materialize_padding`] would put in front of a convolution, a
//! full extra pass over the input, is not made; fusion keeps the epilogue in the form
//! below.
//!
//! The recognised form, [`Depthwise::of`]:
//! - f32 output `[N, C, OH, OW]` (NCHW) and input (either may be stored as f16 or
//!   bf16 instead, loaded as f32: [`crate::precision`]) `[N, C, H, W]`, the same `C`, or the
//!   1-D forms `[N, C, OL]` and `[N, C, L]` (a plane of one row, [`Depthwise`] holds
//!   them as `[N, C, 1, L]`);
//! - exactly one reduction that reads an input (folds over indices alone belong to an
//!   epilogue operand): a `Reduce { Sum }` whose body is `Load(x) · Load(w)` (either
//!   order) or `Load(x)` alone, or a `Reduce { Max }` whose body is `select(isnan(Load(x)), −∞, Load(x))`
//!   (MaxPool as lowered): `x` with `InBounds` bounds or `Pad` by 0 (a sum) or −∞ (a
//!   maximum), index `(n, c, sh·oh + dh·kh + ph, sw·ow + dw·kw + pw)` with any strides
//!   and dilations (each to [`MAX_STRIDE`], asymmetric ones included) and any offsets
//!   (padding, and the extra trailing windows of a pool's ceil mode, read as padding);
//!   `w` in bounds at an affine offset over `c`, `kh`, `kw`; reduction variables of
//!   extent 1 (a group index) are ignored; at most [`MAX_TAPS`] taps ([`MAX_STRIDED_TAPS`]
//!   at column strides past 1);
//! - an epilogue that is a chain from the sum to the result, each step one of `+ − × ÷`
//!   with a constant, a per-channel value (an affine load over `c`: bias, folded
//!   batch-norm scale) or a value of the output row and column alone that reads no
//!   input (an average pool's count of taps inside the plane, tabulated here for every
//!   position, at most [`MAX_POSITIONS`] of them), a clamp against a constant (`max`, `min`, and `Relu`/`Clip`
//!   as compare-and-select), or the running value times such a chain of itself
//!   (HardSwish).
//!
//! A plane of one column with a window along its rows (`[KH, 1]` over `[H, 1]`, as
//! FSMN's memory blocks write a 1-D convolution) is held as the row it is in memory.
//! One output column with a window of more than 8 columns is not a window: each output
//! reduces a stretch of a row (an SE block's row sum, a global pool), which vectors
//! along the output row would compute one lane at a time.
//!
//! **Grouped convolutions are not windows.** A convolution with several input channels
//! per group (`1 < C/group`) is lowered as `[N, group, M/group, …]` with the group an
//! index of its own (`kiln_lower`'s linalg module), which makes it a batch of
//! contractions ([`crate::contraction`]): each group is a product of `M/group` filter
//! rows and `C/group · KH · KW` image rows, where every loaded image vector is used by
//! `M/group` outputs, which a matrix tile exploits and a window (one output channel
//! per input plane) cannot. Only one input channel per output channel is a window.
//! A channel multiplier (`M = k·C`, `group = C`) reads channel `m / k`, not affine in
//! the output index, and is not recognised here.
//!
//! Nothing here changes a kernel.

use crate::affine::{affine, load_offset, AffineIndex};
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType, UnaryOp};
use crate::precision::loads_as_f32;
use kiln_ir::DType;

/// Most taps (`kh × kw`) of a recognised window at column stride 1: a target unrolls
/// the taps, so this bounds its code (169 taps of 12 vectors, one FMA each: about 14 KB
/// a row group); 13×13 windows (YOLO's SPPF pools), 1-D windows of 169 taps. A kernel
/// that runs once per inference pays for its code on every call (fetched cold): the
/// 256-tap stride-2 1-D convolutions of a CQT front end took 60 µs more as windows
/// than as contractions.
pub const MAX_TAPS: u64 = 169;
/// Most taps at column strides past 1, where a tap is several instructions (two loads
/// and a shuffle, or a gather): 7×7 and 8×8 windows, 1-D windows of 64 taps.
pub const MAX_STRIDED_TAPS: u64 = 64;
/// Largest stride and dilation of a recognised window (far above real models; keeps
/// the offsets a target computes small).
pub const MAX_STRIDE: i64 = 64;
/// Most output positions (`OH × OW`) a per-position epilogue value is tabulated for.
pub const MAX_POSITIONS: u64 = 16 * 1024;

/// A value an epilogue step combines with the running value.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOperand {
    /// An f32 constant's bits.
    Const(u32),
    /// A per-channel f32 value: input `input` at flat offset `offset` (affine over the
    /// channel variable only).
    Channel {
        /// The kernel input.
        input: u32,
        /// Its flat element offset.
        offset: AffineIndex,
    },
    /// A per-position f32 value computed from the output row and column alone, with no
    /// load (an average pool's count of taps inside the plane): the f32 bits at every
    /// `(oh, ow)`, row after row, worked out here at compile time.
    Position(Vec<u32>),
}

/// One epilogue step applied to the running value `v`.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// `v + o`.
    Add(StepOperand),
    /// `v − o`.
    Sub(StepOperand),
    /// `o − v`.
    SubFrom(StepOperand),
    /// `v · o`.
    Mul(StepOperand),
    /// `v / o`.
    Div(StepOperand),
    /// `o / v`.
    DivInto(StepOperand),
    /// `max(c, v)` for a non-NaN constant `c`: a NaN `v` stays NaN.
    Max(u32),
    /// `min(c, v)` for a non-NaN constant `c`: a NaN `v` stays NaN.
    Min(u32),
    /// `v · f(v)`, `f` these steps applied to a copy of `v` (none of them `MulSelf`):
    /// HardSwish, `v · min(max(v/6 + 0.5, 0), 1)`, and `v · sigmoid`-like gates.
    MulSelf(Vec<Step>),
}

/// What a window computes over its taps.
#[derive(Debug, Clone, PartialEq)]
pub enum WindowOp {
    /// `Σ x·w`, a depthwise convolution; 0 outside the plane.
    Conv {
        /// Kernel input read as the filter `w`.
        w: u32,
        /// The filter's flat element offset (over `c`, `kh`, `kw`).
        w_offset: AffineIndex,
    },
    /// `max x` with NaN ignored (read as −∞), a max pool; −∞ outside the plane.
    Max,
    /// `Σ x`, an average pool's sum (its divisor is an epilogue step); 0 outside the
    /// plane.
    Sum,
}

/// A recognised window: a depthwise convolution or a max pool (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Depthwise {
    /// Kernel input read as the image `x`.
    pub x: u32,
    /// What the window computes.
    pub op: WindowOp,
    /// Output dims `[N, C, OH, OW]`.
    pub out_dims: [u64; 4],
    /// Input dims `[N, C, H, W]`.
    pub in_dims: [u64; 4],
    /// Variables of the window rows and columns (`None` for an extent of 1).
    pub taps: [Option<u32>; 2],
    /// Window extents `[KH, KW]`.
    pub window: [u64; 2],
    /// Strides `[sh, sw]` (1 or 2).
    pub stride: [i64; 2],
    /// Dilations `[dh, dw]`.
    pub dilation: [i64; 2],
    /// Offsets `[ph, pw]`: input row `sh·oh + dh·kh + ph` (negative for leading padding).
    pub offset: [i64; 2],
    /// The reduction node.
    pub reduce: ExprId,
    /// The epilogue, from the sum outwards.
    pub epilogue: Vec<Step>,
}

impl Depthwise {
    /// Recognises `k` (see the module docs), or `None`.
    pub fn of(k: &Kernel) -> Option<Depthwise> {
        let rank = k.out_rank();
        if !(rank == 3 || rank == 4) || !loads_as_f32(k.output.dtype) {
            return None;
        }
        let out_dims = plane_dims(&k.output.shape)?;
        if out_dims.contains(&0) {
            return None;
        }
        let mut found = None;
        for (i, n) in k.nodes.iter().enumerate() {
            if let Expr::Reduce { op, vars, body } = &n.expr {
                // A fold over indices alone (an average pool's count of taps inside the
                // plane) is part of an epilogue operand, tabulated there.
                if !k.reads_an_input(ExprId(i as u32)) {
                    continue;
                }
                if found.is_some() || !matches!(op, ReduceOp::Sum | ReduceOp::Max) || n.ty != ScalarType::F32 {
                    return None;
                }
                found = Some((ExprId(i as u32), *op, vars.clone(), *body));
            }
        }
        let (reduce, rop, rvars, body) = found?;
        let wide: Vec<u32> = rvars.iter().map(|v| v.0).filter(|&v| k.vars[v as usize] > 1).collect();
        // The image load, its index, whether it is padded, and the filter load.
        let image = |e: ExprId| match &k.node(e).expr {
            Expr::Load { input, index, bounds: b @ (Bounds::InBounds | Bounds::Pad(0)) } if index.len() == rank => {
                Some((*input, index.clone(), matches!(b, Bounds::Pad(_))))
            }
            _ => None,
        };
        let (x, xi, padded, filter) = match (rop, image(body)) {
            // Σ x alone: an average pool's sum.
            (ReduceOp::Sum, Some((x, xi, padded))) => (x, xi, padded, None),
            (ReduceOp::Sum, None) => {
                let Expr::Binary(BinaryOp::Mul, p, q) = k.node(body).expr else { return None };
                [(p, q), (q, p)].into_iter().find_map(|(a, b)| {
                    let (xa, xidx, padded) = image(a)?;
                    let Expr::Load { input: wa, index: widx, bounds: Bounds::InBounds } = &k.node(b).expr else {
                        return None;
                    };
                    Some((xa, xidx, padded, Some((*wa, widx.clone()))))
                })?
            }
            _ => {
                // select(isnan(x), −∞, x), x padded (if at all) by −∞.
                let Expr::Select(c, lo, v) = k.node(body).expr else { return None };
                let neg_inf = f32::NEG_INFINITY.to_bits() as u64;
                if k.node(c).expr != Expr::Unary(UnaryOp::IsNan, v) || k.node(lo).expr != Expr::Const(neg_inf) {
                    return None;
                }
                let Expr::Load { input: xa, index: xidx, bounds } = &k.node(v).expr else { return None };
                if !matches!(bounds, Bounds::InBounds) && *bounds != Bounds::Pad(neg_inf) {
                    return None;
                }
                (xidx.len() == rank).then(|| (*xa, xidx.clone(), matches!(bounds, Bounds::Pad(_)), None))?
            }
        };
        if !loads_as_f32(k.inputs.get(x as usize)?.dtype) {
            return None;
        }
        if let Some((w, _)) = &filter {
            if !loads_as_f32(k.inputs.get(*w as usize)?.dtype) {
                return None;
            }
        }
        if k.inputs[x as usize].shape.rank() != rank {
            return None;
        }
        let in_dims = plane_dims(&k.inputs[x as usize].shape)?;
        if in_dims[0] != out_dims[0] || in_dims[1] != out_dims[1] {
            return None;
        }
        // Coefficients that matter: variables of extent 1 are always 0.
        let live = |a: &AffineIndex, v: usize| if k.vars[v] > 1 { a.coef[v] } else { 0 };
        let only = |a: &AffineIndex, allowed: &[u32]| {
            (0..k.vars.len()).all(|v| allowed.contains(&(v as u32)) || live(a, v) == 0)
        };
        // n and c read as themselves.
        for d in 0..2 {
            let a = affine(k, xi[d])?;
            if a.c != 0 || !only(&a, &[d as u32]) || (out_dims[d] > 1 && a.coef[d] != 1) {
                return None;
            }
        }
        // Rows and columns: s·o + dl·t + c, with t the one reduction variable it reads
        // (a 1-D window has no row axis: one row, one window row).
        let mut taps = [None; 2];
        let mut window = [1u64; 2];
        let mut stride = [1i64; 2];
        let mut dilation = [1i64; 2];
        let mut offset = [0i64; 2];
        for d in 0..2 {
            // The axis of the index (and output variable) for plane axis d.
            let o = match (rank, d) {
                (4, _) => 2 + d,
                (_, 1) => 2,
                _ => continue,
            };
            let a = affine(k, xi[o])?;
            let t: Vec<u32> = wide.iter().copied().filter(|&v| a.coef[v as usize] != 0).collect();
            let mut allowed = vec![o as u32];
            allowed.extend(&t);
            if t.len() > 1 || !only(&a, &allowed) {
                return None;
            }
            stride[d] = if out_dims[2 + d] > 1 { live(&a, o) } else { 1 };
            if !(1..=MAX_STRIDE).contains(&stride[d]) {
                return None;
            }
            if let Some(&t) = t.first() {
                taps[d] = Some(t);
                window[d] = k.vars[t as usize];
                dilation[d] = a.coef[t as usize];
                if !(1..=MAX_STRIDE).contains(&dilation[d]) {
                    return None;
                }
            }
            offset[d] = a.c;
            if offset[d].abs() > MAX_STRIDE * MAX_TAPS as i64 {
                return None;
            }
        }
        // Every wide reduction variable is a window axis.
        if wide.iter().any(|v| !taps.contains(&Some(*v))) || window[0] * window[1] > MAX_TAPS {
            return None;
        }
        // In bounds without padding: the loads must stay inside the plane.
        if !padded {
            for d in 0..2 {
                let lo = offset[d];
                let hi = offset[d] + stride[d] * (out_dims[2 + d] as i64 - 1) + dilation[d] * (window[d] as i64 - 1);
                if lo < 0 || hi >= in_dims[2 + d] as i64 {
                    return None;
                }
            }
        }
        let op = match filter {
            None if rop == ReduceOp::Sum => WindowOp::Sum,
            Some((w, wi)) => {
                let w_offset = load_offset(k, w, &wi)?;
                let mut w_vars = vec![1u32];
                w_vars.extend(taps.iter().flatten());
                if !only(&w_offset, &w_vars) {
                    return None;
                }
                WindowOp::Conv { w, w_offset }
            }
            None => WindowOp::Max,
        };
        let epilogue = chain(k, reduce)?;
        let mut d = Depthwise { x, op, out_dims, in_dims, taps, window, stride, dilation, offset, reduce, epilogue };
        // A plane of one column whose window does not move along it (a `[KH, 1]` window
        // over `[H, 1]`: FSMN's memory blocks) is, in memory, one row: the same elements
        // in the same order, with the window along the row.
        if d.in_dims[3] == 1 && d.out_dims[3] == 1 && d.window[1] == 1 && d.offset[1] == 0 && d.in_dims[2] > 1 {
            d.in_dims.swap(2, 3);
            d.out_dims.swap(2, 3);
            d.taps.swap(0, 1);
            d.window.swap(0, 1);
            d.stride.swap(0, 1);
            d.dilation.swap(0, 1);
            d.offset.swap(0, 1);
        }
        // One output column per row and a window wider than a vector (SE blocks' row
        // sums, global pools): each output is a reduction of a row, which a window
        // kernel (vectors along the output row) would compute one lane at a time; that
        // is a row reduction's form, not a sliding window's.
        if d.out_dims[3] == 1 && d.window[1] > 8 {
            return None;
        }
        if d.stride[1] > 1 && d.window[0] * d.window[1] > MAX_STRIDED_TAPS {
            return None;
        }
        Some(d)
    }
}

/// `[N, C, H, W]` of an NCHW tensor, `[N, C, 1, L]` of an NCL one; `None` for other ranks.
fn plane_dims(s: &kiln_ir::Shape) -> Option<[u64; 4]> {
    match *s.dims() {
        [n, c, l] => Some([n as u64, c as u64, 1, l as u64]),
        [n, c, h, w] => Some([n as u64, c as u64, h as u64, w as u64]),
        _ => None,
    }
}

/// The epilogue from the reduction `r` to the root as steps, or `None` when it is not
/// a chain of supported steps.
fn chain(k: &Kernel, r: ExprId) -> Option<Vec<Step>> {
    chain_between(k, r, k.root, false)
}

/// The steps that take `from`'s value to `to`'s, or `None`; `nested`: inside a
/// `MulSelf` (which does not nest).
fn chain_between(k: &Kernel, from: ExprId, to: ExprId, nested: bool) -> Option<Vec<Step>> {
    let mut steps = Vec::new();
    let mut e = to;
    while e != from {
        let node = k.node(e);
        if node.ty != ScalarType::F32 {
            return None;
        }
        let (next, step) = match &node.expr {
            Expr::Cast { value, to: DType::F32, .. } if k.node(*value).ty == ScalarType::F32 => {
                e = *value;
                continue;
            }
            Expr::Binary(op, a, b) => {
                let (oa, ob) = (operand(k, *a), operand(k, *b));
                let (v, o, v_first) = match (oa, ob) {
                    (None, Some(o)) => (*a, o, true),
                    (Some(o), None) => (*b, o, false),
                    (None, None) if *op == BinaryOp::Mul && !nested => {
                        // v · f(v): one operand is the running value, the other a chain of it.
                        let (v, inner) = [(*a, *b), (*b, *a)]
                            .into_iter()
                            .find_map(|(v, f)| chain_between(k, v, f, true).map(|inner| (v, inner)))?;
                        steps.push(Step::MulSelf(inner));
                        e = v;
                        continue;
                    }
                    _ => return None,
                };
                let step = match (op, v_first) {
                    (BinaryOp::Add, _) => Step::Add(o),
                    (BinaryOp::Mul, _) => Step::Mul(o),
                    (BinaryOp::Sub, true) => Step::Sub(o),
                    (BinaryOp::Sub, false) => Step::SubFrom(o),
                    (BinaryOp::Div, true) => Step::Div(o),
                    (BinaryOp::Div, false) => Step::DivInto(o),
                    (BinaryOp::Max | BinaryOp::Min, _) => {
                        let StepOperand::Const(c) = o else { return None };
                        if f32::from_bits(c).is_nan() {
                            return None;
                        }
                        if *op == BinaryOp::Max {
                            Step::Max(c)
                        } else {
                            Step::Min(c)
                        }
                    }
                    _ => return None,
                };
                (v, step)
            }
            Expr::Select(c, then, otherwise) => {
                // select(v < c, c, v) = max(c, v); select(v > c, c, v) = min(c, v).
                let Expr::Binary(op @ (BinaryOp::Lt | BinaryOp::Gt), v, cc) = k.node(*c).expr else { return None };
                let bits = |x: ExprId| match k.node(x).expr {
                    Expr::Const(b) if k.node(x).ty == ScalarType::F32 && !f32::from_bits(b as u32).is_nan() => {
                        Some(b as u32)
                    }
                    _ => None,
                };
                let kc = bits(cc)?;
                if v != *otherwise || bits(*then) != Some(kc) {
                    return None;
                }
                (v, if op == BinaryOp::Lt { Step::Max(kc) } else { Step::Min(kc) })
            }
            _ => return None,
        };
        steps.push(step);
        e = next;
    }
    steps.reverse();
    Some(steps)
}

/// `e` as a step operand: an f32 constant, a per-channel load, or a value of the output
/// row and column alone (tabulated).
fn operand(k: &Kernel, e: ExprId) -> Option<StepOperand> {
    let node = k.node(e);
    if node.ty != ScalarType::F32 {
        return None;
    }
    if !matches!(node.expr, Expr::Const(_) | Expr::Load { .. }) {
        return position(k, e);
    }
    match &node.expr {
        Expr::Const(b) => Some(StepOperand::Const(*b as u32)),
        Expr::Load { input, index, bounds: Bounds::InBounds } => {
            if !loads_as_f32(k.inputs.get(*input as usize)?.dtype) {
                return None;
            }
            let offset = load_offset(k, *input, index)?;
            let per_channel = (0..k.vars.len()).all(|v| v == 1 || k.vars[v] == 1 || offset.coef[v] == 0);
            per_channel.then_some(StepOperand::Channel { input: *input, offset })
        }
        _ => None,
    }
}

/// `e` tabulated over the output rows and columns when it reads no input and depends on
/// no other output variable (the kernel is rank 4, `[n, c, oh, ow]`, or rank 3, `[n, c, ow]`).
fn position(k: &Kernel, e: ExprId) -> Option<StepOperand> {
    let [_, _, oh_n, ow_n] = plane_dims(&k.output.shape)?;
    if oh_n * ow_n > MAX_POSITIONS {
        return None;
    }
    let rank = k.out_rank() as u32;
    let free = k.free_vars();
    if free[e.index()].iter().any(|&v| v < 2 || v >= rank && k.vars[v as usize] > 1) {
        return None;
    }
    let mut ev = crate::interp::NodeEval::new(k, e)?;
    let mut values = Vec::with_capacity((oh_n * ow_n) as usize);
    for oh in 0..oh_n as i64 {
        for ow in 0..ow_n as i64 {
            let env: &[i64] = if rank == 4 { &[0, 0, oh, ow] } else { &[0, 0, ow] };
            values.push(ev.at(env) as u32);
        }
    }
    // One value everywhere is a constant.
    if values.iter().all(|&v| v == values[0]) {
        return Some(StepOperand::Const(values[0]));
    }
    Some(StepOperand::Position(values))
}
