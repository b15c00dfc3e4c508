//! Recognising resampling kernels — Resize and Upsample as `kiln-lower` writes them —
//! and tabulating their taps at compile time.
//!
//! Every resized axis of a Resize maps each output position to a few source positions
//! and weights that depend on that axis's output index alone, and every shape is static,
//! so all of them are known before the kernel runs. The lowering computes them in the
//! kernel from the output index (in `f64`, with the reference's formulas), which keeps
//! the kernel its own specification; this module finds that form and evaluates those
//! index and weight expressions once per (output position, tap) with the kernel
//! interpreter ([`crate::interp::NodeEval`]), so a code generator runs from tables and
//! computes nothing but the weighted sums.
//!
//! Two forms, one input `x` of the output's rank:
//! - **Interpolation** (linear, cubic, antialiased; [`Resample::weights`]): an f32 output
//!   `[.., n_out, ..]` that is a nest of sums, one per interpolated axis `d`,
//!   `Σ_{t_d} w_d(o_d, t_d) · (..)`, around one in-bounds load
//!   `x[.., i_d(o_d, t_d), ..]`. The weight `w_d` (an f32 value, usually an f64
//!   expression rounded once) and the index `i_d` read no input and depend on the axis's
//!   output variable and its tap variable alone; every other axis is read at the output
//!   index. The kernel's class is [`crate::class::KernelClass::Window`]: a small stencil
//!   per output, with weights that vary with the position instead of a filter.
//! - **Table copy** (nearest): an in-bounds load whose index along each axis depends on
//!   that axis's output variable alone, and is not an affine copy along the output rows
//!   (an affine offset with unit step in the innermost output variable, which an affine
//!   copy takes); the class is [`crate::class::KernelClass::Movement`].
//!
//! Either may sit under `select(c, fill, ..)` with a constant `fill` and a condition that
//! is an `or` of conditions each on one resized axis's output variable (tf_crop_and_resize
//! extrapolating outside the region of interest): tabulated as a flag per position.
//!
//! [`Resample::is_interpolation`] and [`Resample::is_table_copy`] check the structure alone (cheap, for classification and
//! fusion); [`Resample::of`] also tabulates. The tables hold exactly the values the
//! interpreter computes for those nodes, so a code generator that sums the taps in f32
//! differs from the interpreter only in the order of its roundings. Nothing here changes
//! a kernel.

use crate::affine::load_offset;
use crate::interp::NodeEval;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType};

/// Most taps of one interpolated axis (an antialiased cubic downscale by `s` has about
/// `4/s`).
pub const MAX_TAPS: u64 = 64;
/// Most table entries (positions × taps, all axes together) tabulated.
pub const MAX_ENTRIES: u64 = 1 << 20;

/// How one axis of the output reads the input.
#[derive(Debug, Clone, PartialEq)]
pub enum Axis {
    /// Output index = input index (the axis is not resized).
    Same,
    /// From tables: `taps` (index, weight) pairs per output position.
    Table(AxisTable),
}

/// The taps of one resized axis.
#[derive(Debug, Clone, PartialEq)]
pub struct AxisTable {
    /// Taps per output position (1 for a copy).
    pub taps: usize,
    /// Source index of every (output position, tap), position-major.
    pub index: Vec<u32>,
    /// f32 bits of the weight of every (output position, tap), position-major (1 for an
    /// axis tabulated only for its fills); empty for a copy.
    pub weight: Vec<u32>,
    /// Output positions whose result is the fill value; empty when none is.
    pub fill: Vec<bool>,
}

impl AxisTable {
    /// Whether output position `o` takes the fill value.
    pub fn fills(&self, o: usize) -> bool {
        self.fill.get(o).copied().unwrap_or(false)
    }
}

/// A recognised resampling kernel (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Resample {
    /// Input dims.
    pub in_dims: Vec<u64>,
    /// Output dims.
    pub out_dims: Vec<u64>,
    /// Per output axis.
    pub axes: Vec<Axis>,
    /// Weighted taps (interpolation), or one tap copied (nearest).
    pub weights: bool,
    /// The fill value's bits in the output's compute type, when some position fills.
    pub fill: Option<u64>,
}

/// What the structural match found.
struct Shape {
    /// Per input axis: its index expression.
    index: Vec<ExprId>,
    /// Per tap variable: (variable, its axis, its weight node).
    taps: Vec<(u32, usize, ExprId)>,
    /// The fill condition leaves with their axis, and the fill value.
    fill: Option<(Vec<(ExprId, usize)>, u64)>,
}

impl Resample {
    /// Whether `k` is an interpolation of the module docs (no tables are computed).
    pub fn is_interpolation(k: &Kernel) -> bool {
        shape(k).is_some_and(|s| !s.taps.is_empty())
    }

    /// Whether `k` is a table copy of the module docs (no tables are computed).
    pub fn is_table_copy(k: &Kernel) -> bool {
        shape(k).is_some_and(|s| s.taps.is_empty())
    }

    /// Recognises `k` and tabulates its axes, or `None`.
    pub fn of(k: &Kernel) -> Option<Resample> {
        let s = shape(k)?;
        let in_dims: Vec<u64> = k.inputs[0].shape.dims().iter().map(|&d| d as u64).collect();
        let out_dims: Vec<u64> = k.output.shape.dims().iter().map(|&d| d as u64).collect();
        let rank = out_dims.len();
        let mut entries = 0u64;
        let mut env = vec![0i64; k.vars.len()];
        let mut axes = Vec::with_capacity(rank);
        for d in 0..rank {
            let fills: Vec<ExprId> =
                s.fill.iter().flat_map(|(l, _)| l.iter()).filter(|&&(_, a)| a == d).map(|&(e, _)| e).collect();
            let taps: Vec<&(u32, usize, ExprId)> = s.taps.iter().filter(|t| t.1 == d).collect();
            if taps.len() > 1 {
                return None;
            }
            let same =
                matches!(k.node(s.index[d]).expr, Expr::Var(v) if v.0 as usize == d) && in_dims[d] == out_dims[d];
            if same && taps.is_empty() && fills.is_empty() {
                axes.push(Axis::Same);
                continue;
            }
            let n = out_dims[d] as usize;
            let tv = taps.first().map(|t| t.0 as usize);
            let nt = tv.map_or(1, |v| k.vars[v] as usize);
            entries += (n * nt) as u64;
            if entries > MAX_ENTRIES {
                return None;
            }
            let mut index_ev = NodeEval::new(k, s.index[d])?;
            let mut weight_ev = match taps.first() {
                Some(t) => Some(NodeEval::new(k, t.2)?),
                None => None,
            };
            let mut fill_ev: Vec<NodeEval> = fills.iter().map(|&e| NodeEval::new(k, e)).collect::<Option<_>>()?;
            let mut t = AxisTable { taps: nt, index: Vec::with_capacity(n * nt), weight: Vec::new(), fill: Vec::new() };
            for o in 0..n {
                env.iter_mut().for_each(|e| *e = 0);
                env[d] = o as i64;
                if !fill_ev.is_empty() {
                    let f = fill_ev.iter_mut().any(|ev| ev.at(&env) != 0);
                    if f && t.fill.is_empty() {
                        t.fill = vec![false; n];
                    }
                    if f {
                        t.fill[o] = true;
                    }
                }
                for j in 0..nt {
                    if let Some(v) = tv {
                        env[v] = j as i64;
                    }
                    let i = index_ev.at(&env) as i64;
                    // The verifier proved the load in bounds; checked again, as a table
                    // entry is an address.
                    if i < 0 || i as u64 >= in_dims[d] {
                        return None;
                    }
                    t.index.push(i as u32);
                    match weight_ev.as_mut() {
                        Some(ev) => t.weight.push(ev.at(&env) as u32),
                        // An interpolation's axis tabulated for its fills alone.
                        None if !s.taps.is_empty() => t.weight.push(1f32.to_bits()),
                        None => {}
                    }
                }
            }
            axes.push(Axis::Table(t));
        }
        Some(Resample { in_dims, out_dims, axes, weights: !s.taps.is_empty(), fill: s.fill.map(|f| f.1) })
    }
}

/// The structural match of the module docs.
fn shape(k: &Kernel) -> Option<Shape> {
    if k.inputs.len() != 1 {
        return None;
    }
    let (x, o) = (&k.inputs[0], &k.output);
    let rank = o.shape.rank();
    if rank == 0 || x.shape.rank() != rank || x.dtype != o.dtype || o.shape.numel() == 0 || x.shape.numel() == 0 {
        return None;
    }
    let free = k.free_vars();
    let fv = |e: ExprId| &free[e.index()];
    // An optional fill around the value.
    let (mut e, fill) = match &k.node(k.root).expr {
        Expr::Select(c, a, b) if matches!(k.node(*a).expr, Expr::Const(_)) && !k.reads_an_input(*c) => {
            let Expr::Const(bits) = k.node(*a).expr else { return None };
            let mut leaves = Vec::new();
            or_leaves(k, *c, &mut leaves);
            let mut fl = Vec::with_capacity(leaves.len());
            for l in leaves {
                match fv(l)[..] {
                    [v] if (v as usize) < rank => fl.push((l, v as usize)),
                    // A condition on no variable (an axis of one output position): its
                    // value holds for every position of the last axis.
                    [] => fl.push((l, rank - 1)),
                    _ => return None,
                }
            }
            (*b, Some((fl, bits)))
        }
        _ => (k.root, None),
    };
    // The nest of weighted sums.
    let mut taps: Vec<(u32, usize, ExprId)> = Vec::new();
    let mut tap_vars: Vec<u32> = Vec::new();
    let mut pending: Vec<(u32, ExprId)> = Vec::new();
    loop {
        match &k.node(e).expr {
            Expr::Reduce { op: ReduceOp::Sum, vars, body } if vars.len() == 1 => {
                let Expr::Binary(BinaryOp::Mul, a, b) = k.node(*body).expr else { return None };
                let (w, inner) = match (k.reads_an_input(a), k.reads_an_input(b)) {
                    (false, true) => (a, b),
                    (true, false) => (b, a),
                    _ => return None,
                };
                let v = vars[0].0;
                if k.vars[v as usize] > MAX_TAPS || tap_vars.contains(&v) {
                    return None;
                }
                tap_vars.push(v);
                pending.push((v, w));
                e = inner;
            }
            Expr::Load { input: 0, index, bounds: Bounds::InBounds } if index.len() == rank => break,
            _ => return None,
        }
    }
    let Expr::Load { index, .. } = &k.node(e).expr else { return None };
    let interpolates = !pending.is_empty();
    // (Interpolating in f32 whether the storage is f32 or, narrowed, f16/bf16.)
    if interpolates && (!crate::precision::loads_as_f32(o.dtype) || k.node(k.root).ty != ScalarType::F32) {
        return None;
    }
    // Each axis's index reads its own output variable and at most one tap variable.
    let mut moved = false;
    for (d, &ie) in index.iter().enumerate() {
        let mut own_tap = None;
        for &v in fv(ie) {
            if v as usize == d {
                continue;
            }
            if !tap_vars.contains(&v) || own_tap.replace(v).is_some() {
                return None;
            }
        }
        let same =
            matches!(k.node(ie).expr, Expr::Var(v) if v.0 as usize == d) && x.shape.dims()[d] == o.shape.dims()[d];
        moved |= !same;
        if let Some(t) = own_tap {
            let &(_, w) = pending.iter().find(|p| p.0 == t)?;
            if fv(w).iter().any(|&v| v != t && v as usize != d) {
                return None;
            }
            taps.push((t, d, w));
        }
    }
    // Every tap variable indexes some axis.
    if taps.len() != pending.len() || !moved {
        return None;
    }
    // A copy at an affine offset that runs along the output rows is an affine copy, not
    // a table copy.
    if !interpolates && load_offset(k, 0, index).is_some_and(|off| off.of((rank - 1) as u32) == 1) {
        return None;
    }
    Some(Shape { index: index.clone(), taps, fill })
}

/// The leaves of an `or` tree.
fn or_leaves(k: &Kernel, e: ExprId, out: &mut Vec<ExprId>) {
    match k.node(e).expr {
        Expr::Binary(BinaryOp::Or, a, b) if k.node(e).ty == ScalarType::Bool => {
            or_leaves(k, a, out);
            or_leaves(k, b, out);
        }
        _ => out.push(e),
    }
}
