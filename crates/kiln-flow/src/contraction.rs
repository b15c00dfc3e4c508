//! Recognising contractions: kernels whose value is, at every output index,
//! an epilogue applied to `Σ_k A[.., m, k] · B[.., k, n]`.
//!
//! A target with matrix microkernels asks [`Contraction::of`] whether a kernel has this
//! shape and, if so, where its operands live: the flat element offset of every operand
//! access as an affine form over the kernel's variables. The epilogue is left as the
//! kernel's own expression DAG above the reduction (bias, activation, residual add,
//! scaling); the target decides which epilogue operations it can apply in registers.
//!
//! The recognised form:
//! - exactly one `Reduce { Sum }` over f32 whose body is `Load(a) · Load(b)` (either
//!   order), both `InBounds` loads of f32 inputs with affine indices (or of f16 or bf16
//!   inputs, each value widened exactly to f32 in its load: half storage,
//!   [`crate::precision`]; the output then may be half too); its variables of
//!   extent above 1 are `k` (one for a matrix product, `ci, kh, kw` for a convolution);
//!   the right operand may instead be an integer load converted to f32,
//!   `Cast(Load(b): i8 | u8 | i16 → f32)`: a weight dequantised in the load
//!   ([`crate::dequant`]), whose scale the epilogue applies; [`Operand::dtype`] says
//!   which (the left operand is always a float load);
//! - the *column group* `n` is the longest run of trailing output variables that `a`
//!   does not read and over which `b` and the output are laid out as one flattened
//!   dimension (for an NCHW 1×1 convolution: `h, w`, so the columns are `h·W + w`);
//!   `b` steps 1 or 2 elements per column, or a convolution's stride;
//! - the row variable `m` is the innermost output variable before the group that `b`
//!   does not read and `a` does, else one that only `b` reads (a depthwise
//!   convolution's output rows); every other output variable is a batch variable.
//!
//! A matrix product `[.., M, K] × [K, N]` is the case `m = r − 2`, `n = [r − 1]`;
//! `Conv` 1×1 in NCHW is `m = co`, `n = [h, w]`, batch `[n]`.
//!
//! Nothing here changes the kernel: a target that does not take the contraction path
//! compiles the same kernel with its general code generator.

use crate::affine::{affine, load_offset, AffineIndex};
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType};
use crate::precision::loads_as_f32;
use kiln_ir::DType;

/// The most loads an epilogue a microkernel reads in place may have
/// ([`Contraction::in_place`]): it keeps a pointer per epilogue operand in a register
/// while it walks a row panel, and x86-64 has four general registers to spare there
/// (`kiln-codegen`'s `cpu::gemm`). Fusion stops adding epilogue operands at this many.
pub const MAX_EPILOGUE_LOADS: usize = 4;

/// A constant operand laid out in panels at compile time ([`crate::layout::pack_constants`]):
/// the input is `[⌈D / width⌉, L, width]` and element `(v, l)` of the operand (`v` the
/// row variable of A or the column variable of B, `l` the flattened reduction) sits at
/// `[v div width, l, v rem width]`, so one panel of `width` rows or columns is one
/// contiguous stream over the whole reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Panel {
    /// The variable the panels cut.
    pub var: u32,
    /// Rows or columns per panel.
    pub width: u64,
    /// Elements from one panel to the next (`L · width`).
    pub stride: i64,
}

/// One operand of the contraction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The kernel input it reads.
    pub input: u32,
    /// Its flat element offset over the kernel's variables; for a [`Panel`] operand,
    /// the offset within the panel (the panel variable's coefficient is 1), to which
    /// `(var div width) · (stride − width)` adds the panel's start.
    pub offset: AffineIndex,
    /// Set when the operand is laid out in panels.
    pub panel: Option<Panel>,
    /// The dtype its input stores: f32, f16 or bf16 (loaded as f32: half storage,
    /// [`crate::precision`]), or for a right operand converted in the load
    /// (`Cast(Load)`, [`crate::dequant`]) the integer type [`INT_OPERANDS`] lists.
    pub dtype: DType,
}

/// The integer dtypes a right operand may store and convert to f32 in its load: each
/// value is exact in f32, and so is each product with an f32 inside an FMA.
pub const INT_OPERANDS: [DType; 3] = [DType::I8, DType::U8, DType::I16];

/// The 8-bit integer dtypes of an integer contraction's operands ([`IntContraction`]).
pub const INT8_OPERANDS: [DType; 2] = [DType::I8, DType::U8];

/// An integer contraction: a kernel whose value is an epilogue over
/// `Σ_k (i32(A[.., m, k]) − za)·(i32(B[.., k, n]) − zb)` with `A` and `B` 8-bit integer
/// (`u8` or `i8`) loads at affine offsets, accumulated in `i32` (exact below 2^15
/// reduction steps); each zero point, where there is one, an `i32` value that no
/// reduction variable moves (a literal, or a load of a zero point per tensor, per row of
/// `A` or per column of `B`). The lowering of MatMulInteger, ConvInteger, QLinearMatMul
/// and QLinearConv writes this form. The operands' roles (rows, columns, batch) are
/// those of a float [`Contraction`]; the code generator decides how it multiplies the
/// bytes (x86-64: `vpdpbusd`, `kiln-codegen`'s `cpu::qgemm`) and applies the zero
/// points as corrections by row and column sums.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IntContraction {
    /// The operands and variables, as for a float contraction (the operands' dtypes are
    /// `u8` or `i8`, read as they are).
    pub c: Contraction,
    /// `A`'s zero point: the `i32` node subtracted from each of its elements.
    pub za: Option<ExprId>,
    /// `B`'s zero point.
    pub zb: Option<ExprId>,
}

impl IntContraction {
    /// Whether an integer microkernel reads this contraction where it lies: `B` steps 1
    /// or 2 elements a column, and every load outside the reduction (the epilogue's and
    /// the zero points') is an `InBounds` load at an affine offset that steps 0 or 1
    /// element a column (`kiln-codegen`'s `cpu::qgemm` keeps their pointers on the
    /// stack, so their number is not bounded as a float tile's are).
    pub fn in_place(&self, k: &Kernel) -> bool {
        if !matches!(self.c.column_step(&self.c.b.offset), Some(1 | 2)) {
            return false;
        }
        let mut seen = vec![false; k.nodes.len()];
        let mut stack = vec![k.root];
        stack.extend(self.za);
        stack.extend(self.zb);
        while let Some(e) = stack.pop() {
            if e == self.c.reduce || std::mem::replace(&mut seen[e.index()], true) {
                continue;
            }
            match &k.node(e).expr {
                Expr::Load { input, index, bounds: Bounds::InBounds } => {
                    let step = load_offset(k, *input, index).and_then(|o| self.c.column_step(&o));
                    if !matches!(step, Some(0 | 1)) {
                        return false;
                    }
                }
                Expr::Load { .. } => return false,
                other => other.for_each_operand(|o| stack.push(o)),
            }
        }
        true
    }
}

/// Whether `e` reads any of `vars`.
fn reads_vars(k: &Kernel, e: ExprId, vars: &[u32]) -> bool {
    let mut stack = vec![e];
    let mut seen = vec![false; k.nodes.len()];
    while let Some(e) = stack.pop() {
        if std::mem::replace(&mut seen[e.index()], true) {
            continue;
        }
        match &k.node(e).expr {
            Expr::Var(v) if vars.contains(&v.0) => return true,
            other => other.for_each_operand(|o| stack.push(o)),
        }
    }
    false
}

/// The kernel's one reduction when it is a sum of type `ty` (`None` when there is none,
/// another, or another kind): its node, the variables of more than one value it sums
/// over (its first variable when none has), all its variables, and its body.
fn sole_sum(k: &Kernel, ty: ScalarType) -> Option<(ExprId, Vec<u32>, Vec<u32>, ExprId)> {
    let mut found = None;
    for (i, node) in k.nodes.iter().enumerate() {
        if let Expr::Reduce { op, vars, body } = &node.expr {
            if found.is_some() || *op != ReduceOp::Sum || node.ty != ty {
                return None;
            }
            let mut wide: Vec<u32> = vars.iter().map(|v| v.0).filter(|&v| k.vars[v as usize] > 1).collect();
            if wide.is_empty() {
                wide.push(vars.first()?.0);
            }
            found = Some((ExprId(i as u32), wide, vars.iter().map(|v| v.0).collect(), *body));
        }
    }
    found
}

/// The offset of a load at `[v div W, l, v rem W]` of a `[P, L, W]` input (a [`Panel`]
/// layout), `l` affine over the kernel's variables and within `0..L`. One panel
/// (`P = 1`, every `v < W`) may also be read at `[0, l, v]`: the kernel builder folds
/// `v div W` and `v rem W` to that (every value of `v` has the quotient 0), and the
/// panel is the same bytes, its zero columns past `v`'s extent there to be read whole.
/// Leading axes before the panels (`[B…, P, L, W]`, one set of panels per batch
/// position: a bidirectional LSTM's weights, one matrix a direction) are read at
/// affine indices within their extents.
pub fn panel_offset(k: &Kernel, input: u32, index: &[ExprId]) -> Option<(AffineIndex, Panel)> {
    let ty = k.inputs.get(input as usize)?;
    let dims = ty.shape.dims();
    let lead = dims.len().checked_sub(3)?;
    let &[p, l, w] = &dims[lead..] else { return None };
    let &[d, mid, r] = index.get(lead..)? else { return None };
    // The leading axes' offset, in elements.
    let mut outer = AffineIndex::constant(0, k.vars.len());
    let mut stride = (p as i64).checked_mul(l as i64)?.checked_mul(w as i64)?;
    for (&e, &extent) in index[..lead].iter().zip(&dims[..lead]).rev() {
        let a = affine(k, e)?;
        let (lo, hi) = a.range(k)?;
        if lo < 0 || hi >= extent as i64 {
            return None;
        }
        outer = outer.plus(&a.scaled(stride)?)?;
        stride = stride.checked_mul(extent as i64)?;
    }
    let split = |e: ExprId, op: BinaryOp| -> Option<u32> {
        let Expr::Binary(o, x, c) = k.node(e).expr else { return None };
        let Expr::Var(v) = k.node(x).expr else { return None };
        (o == op && k.node(c).expr == Expr::Const(w as u64)).then_some(v.0)
    };
    let folded = || -> Option<(u32, u32)> {
        let (Expr::Const(0), Expr::Var(v)) = (&k.node(d).expr, &k.node(r).expr) else { return None };
        (p == 1 && *k.vars.get(v.0 as usize)? <= w as u64).then_some((v.0, v.0))
    };
    let (v, v2) = match (split(d, BinaryOp::Div), split(r, BinaryOp::Rem)) {
        (Some(v), Some(v2)) => (v, v2),
        _ => folded()?,
    };
    let ext = *k.vars.get(v as usize)?;
    if v != v2 || w == 0 || (p as u64).checked_mul(w as u64)? < ext {
        return None;
    }
    let mid = affine(k, mid)?;
    // `l` stays within its axis.
    let (lo, hi) = mid.range(k)?;
    if lo < 0 || hi >= l as i64 || mid.of(v) != 0 {
        return None;
    }
    let width = i64::try_from(w).ok()?;
    let mut off = mid.scaled(width)?.plus(&outer)?;
    if off.coef[v as usize] != 0 {
        return None;
    }
    off.coef[v as usize] = 1;
    Some((off, Panel { var: v, width: w as u64, stride: width.checked_mul(l as i64)? }))
}

/// A recognised contraction (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contraction {
    /// Batch variables (every output variable but `m` and the column group), outermost
    /// first.
    pub batch: Vec<u32>,
    /// The row variable.
    pub m: u32,
    /// The column group, outermost first (flattened, it is one column index).
    pub n: Vec<u32>,
    /// The reduction variables of extent above 1, outermost first (one for a matrix
    /// product; `ci, kh, kw` for a convolution); a lone extent-1 variable when none.
    pub k: Vec<u32>,
    /// `M`, `N` (the product of the group's extents) and `K` (the product of the
    /// reduction's extents).
    pub dims: [u64; 3],
    /// The left operand: offset independent of the columns.
    pub a: Operand,
    /// The right operand: offset independent of `m`.
    pub b: Operand,
    /// The reduction node; the epilogue is the kernel's root expression over it.
    pub reduce: ExprId,
    /// Flattened stride of each group variable (innermost 1).
    n_strides: Vec<i64>,
}

impl Contraction {
    /// The step of `off` per flattened column, if `off` moves along the column group as
    /// one dimension (0 when it does not read the columns at all).
    pub fn column_step(&self, off: &AffineIndex) -> Option<i64> {
        let inner = *self.n.last()?;
        let s = off.of(inner);
        for (&v, &w) in self.n.iter().zip(&self.n_strides) {
            if off.of(v) != s.checked_mul(w)? {
                return None;
            }
        }
        Some(s)
    }

    /// Whether every load of the epilogue (outside the reduction) is an `InBounds`
    /// load at an affine offset, so that a microkernel can address it per tile.
    pub fn epilogue_is_affine(&self, k: &Kernel) -> bool {
        let mut seen = vec![false; k.nodes.len()];
        let mut stack = vec![k.root];
        while let Some(e) = stack.pop() {
            if e == self.reduce || std::mem::replace(&mut seen[e.index()], true) {
                continue;
            }
            match &k.node(e).expr {
                Expr::Load { input, index, bounds: Bounds::InBounds } => {
                    if load_offset(k, *input, index).is_none() {
                        return false;
                    }
                }
                Expr::Load { .. } => return false,
                other => other.for_each_operand(|o| stack.push(o)),
            }
        }
        true
    }

    /// Whether a matrix microkernel reads this contraction where it lies, tile by tile:
    /// `b` steps 1 or 2 elements per column (or is laid out in panels), and the epilogue
    /// has at most [`MAX_EPILOGUE_LOADS`] loads, each an `InBounds` load at an affine
    /// offset that steps 0 or 1 element per column (a bias, a residual in the output's
    /// layout). A contraction
    /// that is not (its right operand or a residual read across a transpose) can only
    /// run on a target's general path, unless a layout transform gathers its columns
    /// first ([`crate::layout::contraction_in_place`]).
    pub fn in_place(&self, k: &Kernel) -> bool {
        let b_step = match self.b.panel {
            Some(_) => Some(1),
            None => self.column_step(&self.b.offset),
        };
        if !matches!(b_step, Some(1 | 2)) {
            return false;
        }
        let mut seen = vec![false; k.nodes.len()];
        let mut stack = vec![k.root];
        let mut loads = 0;
        while let Some(e) = stack.pop() {
            if e == self.reduce || std::mem::replace(&mut seen[e.index()], true) {
                continue;
            }
            match &k.node(e).expr {
                Expr::Load { input, index, bounds: Bounds::InBounds } => {
                    let step = load_offset(k, *input, index).and_then(|o| self.column_step(&o));
                    loads += 1;
                    if !matches!(step, Some(0 | 1)) || loads > MAX_EPILOGUE_LOADS {
                        return false;
                    }
                }
                Expr::Load { .. } => return false,
                other => other.for_each_operand(|o| stack.push(o)),
            }
        }
        true
    }

    /// Recognises `k` as a contraction, or `None`.
    pub fn of(k: &Kernel) -> Option<Contraction> {
        let rank = k.out_rank();
        if rank < 2 || !loads_as_f32(k.output.dtype) || k.output.shape.numel() == 0 {
            return None;
        }
        let (reduce, kv, _, body) = sole_sum(k, ScalarType::F32)?;
        let Expr::Binary(BinaryOp::Mul, x, y) = k.node(body).expr else { return None };
        let load = |e: ExprId| -> Option<Operand> {
            let (load, int) = match &k.node(e).expr {
                Expr::Cast { value, to: DType::F32, .. } => (*value, true),
                _ => (e, false),
            };
            match &k.node(load).expr {
                Expr::Load { input, index, bounds: Bounds::InBounds } => {
                    let dtype = k.inputs.get(*input as usize)?.dtype;
                    if int != INT_OPERANDS.contains(&dtype) || (!int && !loads_as_f32(dtype)) {
                        return None;
                    }
                    // (An integer operand in one panel, `[1, L, W]` with W above the
                    // columns, is affine too; it is read as the panel it is, whose zero
                    // columns a tile may read whole.)
                    let panel = || {
                        let (offset, panel) = panel_offset(k, *input, index)?;
                        Some(Operand { input: *input, offset, panel: Some(panel), dtype })
                    };
                    let plain =
                        || Some(Operand { input: *input, offset: load_offset(k, *input, index)?, panel: None, dtype });
                    if int {
                        panel().or_else(plain)
                    } else {
                        plain().or_else(panel)
                    }
                }
                _ => None,
            }
        };
        let (x, y) = (load(x)?, load(y)?);
        Contraction::with(k, reduce, &kv, x.clone(), y.clone()).or_else(|| Contraction::with(k, reduce, &kv, y, x))
    }

    /// Recognises `k` as an integer contraction ([`IntContraction`]), or `None`.
    pub fn of_int(k: &Kernel) -> Option<IntContraction> {
        if k.out_rank() < 2 || k.output.shape.numel() == 0 {
            return None;
        }
        let (reduce, kv, all_kv, body) = sole_sum(k, ScalarType::I32)?;
        let Expr::Binary(BinaryOp::Mul, x, y) = k.node(body).expr else { return None };
        // `i32(load)` or `i32(load) − z`, `z` an i32 value that no reduction variable
        // moves (a literal, or a zero point's load).
        let side = |e: ExprId| -> Option<(Operand, Option<ExprId>)> {
            let (cast, zero) = match k.node(e).expr {
                Expr::Binary(BinaryOp::Sub, v, z) => (v, Some(z)),
                _ => (e, None),
            };
            if let Some(z) = zero {
                if k.node(z).ty != ScalarType::I32 || reads_vars(k, z, &all_kv) {
                    return None;
                }
            }
            let Expr::Cast { value, to: DType::I32, .. } = k.node(cast).expr else { return None };
            let Expr::Load { input, index, bounds: Bounds::InBounds } = &k.node(value).expr else { return None };
            let dtype = k.inputs.get(*input as usize)?.dtype;
            if !INT8_OPERANDS.contains(&dtype) {
                return None;
            }
            let offset = load_offset(k, *input, index)?;
            Some((Operand { input: *input, offset, panel: None, dtype }, zero))
        };
        let (x, y) = (side(x)?, side(y)?);
        let build = |(a, za): (Operand, Option<ExprId>), (b, zb): (Operand, Option<ExprId>)| {
            let c = Contraction::with_int(k, reduce, &kv, a, b)?;
            Some(IntContraction { c, za, zb })
        };
        build(x.clone(), y.clone()).or_else(|| build(y, x))
    }

    /// [`Contraction::with`] for 8-bit integer operands.
    fn with_int(k: &Kernel, reduce: ExprId, kv: &[u32], a: Operand, b: Operand) -> Option<Contraction> {
        Contraction::with_checked(k, reduce, kv, a, b)
    }

    /// The contraction with `a` as the left operand, if the operands fit that way.
    fn with(k: &Kernel, reduce: ExprId, kv: &[u32], a: Operand, b: Operand) -> Option<Contraction> {
        // An operand converted in its load is the right one (the weights a tile streams).
        if !loads_as_f32(a.dtype) {
            return None;
        }
        Contraction::with_checked(k, reduce, kv, a, b)
    }

    /// [`Contraction::with`] past its operand dtype check.
    fn with_checked(k: &Kernel, reduce: ExprId, kv: &[u32], a: Operand, b: Operand) -> Option<Contraction> {
        let rank = k.out_rank() as u32;
        let ext = |v: u32| k.vars[v as usize];
        // The column group: trailing variables `a` does not read, `b` reads, laid out
        // as one dimension in `b` and in the (row-major) output.
        let mut n: Vec<u32> = Vec::new();
        let mut strides: Vec<i64> = Vec::new();
        let mut width = 1i64;
        // `b` steps 1 or 2 elements per column, or for a convolution (several reduction
        // variables) any stride: code generators take 1 and 2, and a layout pass gathers
        // wider strides into columns. (A product with a transposed B steps K: no.)
        let step = b.offset.of(rank - 1);
        if step < 1 || (step > 2 && kv.len() < 2) {
            return None;
        }
        for v in (0..rank).rev() {
            let e = i64::try_from(ext(v)).ok()?;
            if a.offset.of(v) != 0 || b.offset.of(v) != width * step {
                break;
            }
            n.insert(0, v);
            strides.insert(0, width);
            width = width.checked_mul(e)?;
        }
        let first = *n.first()?;
        // The row variable: innermost before the group that `a` reads and `b` does not
        // (a matrix product's rows, a convolution's output channels); else one that
        // only `b` reads (a depthwise convolution's output rows: each row reads its own
        // rows of `b` with the same `a`); else an extent-1 variable (a single row).
        let before = || (0..first).rev();
        let m = before()
            .find(|&v| a.offset.of(v) != 0 && b.offset.of(v) == 0 && ext(v) > 1)
            .or_else(|| before().find(|&v| a.offset.of(v) == 0 && b.offset.of(v) != 0 && ext(v) > 1))
            .or_else(|| before().find(|&v| ext(v) == 1))?;
        let batch = (0..rank).filter(|&v| v != m && !n.contains(&v)).collect();
        let kk = kv.iter().try_fold(1u64, |acc, &v| acc.checked_mul(ext(v)))?;
        // Panels cut A's rows or B's (single) column variable, nothing else.
        if a.panel.is_some_and(|p| p.var != m) || b.panel.is_some_and(|p| n != [p.var]) {
            return None;
        }
        let dims = [ext(m), width as u64, kk];
        Some(Contraction { batch, m, n, k: kv.to_vec(), dims, a, b, reduce, n_strides: strides })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KernelBuilder;
    use kiln_ir::{Shape, TensorType};

    use crate::test_types::t;

    /// `out[b, m, n] = relu(Σ_k x[b, m, k] · w[k, n] + bias[n])`.
    fn batched(transposed: bool) -> Kernel {
        let w = if transposed { t(&[5, 7]) } else { t(&[7, 5]) };
        let mut kb = KernelBuilder::new("mm", vec![t(&[2, 3, 7]), w, t(&[5])], t(&[2, 3, 5]));
        let o = kb.out_index();
        let kv = kb.new_var(7);
        let kk = kb.var(kv);
        let x = kb.load(0, vec![o[0], o[1], kk]);
        let w = if transposed { kb.load(1, vec![o[2], kk]) } else { kb.load(1, vec![kk, o[2]]) };
        let p = kb.mul(w, x);
        let s = kb.reduce(ReduceOp::Sum, vec![kv], p);
        let bias = kb.load(2, vec![o[2]]);
        let y = kb.add(s, bias);
        let zero = kb.float(ScalarType::F32, 0.0);
        let r = kb.binary(BinaryOp::Max, y, zero);
        kb.finish(r).unwrap()
    }

    #[test]
    fn recognises_a_batched_matmul_with_epilogue() {
        let c = Contraction::of(&batched(false)).expect("a contraction");
        assert_eq!((c.batch.clone(), c.m, c.n.clone(), c.k.clone()), (vec![0], 1, vec![2], vec![3]));
        assert_eq!(c.dims, [3, 5, 7]);
        assert_eq!(c.a.input, 0);
        assert_eq!((c.a.offset.of(0), c.a.offset.of(1), c.a.offset.of(3)), (21, 7, 1));
        assert_eq!(c.b.input, 1);
        assert_eq!((c.b.offset.of(2), c.b.offset.of(3)), (1, 5));
        // Transposed weights: the columns of `w` are not contiguous.
        assert!(Contraction::of(&batched(true)).is_none());
    }

    /// A matmul whose result is split into heads through a flat index:
    /// `out[h, s, d] = Σ_k x[s, k] · w[k, (h·64 + d) rem 256]` and `x[(..) div 256 rem 128, k]`.
    #[test]
    fn flat_indices_taken_apart() {
        let mut kb = KernelBuilder::new("heads", vec![t(&[128, 256]), t(&[256, 256])], t(&[4, 128, 64]));
        let o = kb.out_index();
        let kv = kb.new_var(256);
        let kk = kb.var(kv);
        let (c128, c4, c64, c256) = (kb.index(128), kb.index(4), kb.index(64), kb.index(256));
        // flat = (s·4 + h)·64 + d
        let s4 = kb.mul(o[1], c4);
        let sh = kb.add(s4, o[0]);
        let f = kb.mul(sh, c64);
        let flat = kb.add(f, o[2]);
        let col = kb.binary(BinaryOp::Rem, flat, c256);
        let row = kb.binary(BinaryOp::Div, flat, c256);
        let row = kb.binary(BinaryOp::Rem, row, c128);
        let x = kb.load(0, vec![row, kk]);
        let w = kb.load(1, vec![kk, col]);
        let p = kb.mul(x, w);
        let r = kb.reduce(ReduceOp::Sum, vec![kv], p);
        let k = kb.finish(r).unwrap();
        let c = Contraction::of(&k).expect("a contraction");
        assert_eq!((c.batch.clone(), c.m, c.n.clone()), (vec![0], 1, vec![2]));
        assert_eq!((c.b.offset.of(0), c.b.offset.of(2), c.b.offset.of(3)), (64, 1, 256));
        assert_eq!((c.a.offset.of(1), c.a.offset.of(3)), (256, 1));
        // A remainder whose low part can leave 0..c is not taken apart.
        let mut kb =
            KernelBuilder::new("wrap", vec![t(&[8])], TensorType::new(DType::I64, Shape::new(vec![8]).unwrap()));
        let o = kb.out_index();
        let (c3, c5) = (kb.index(3), kb.index(5));
        let i = kb.add(o[0], c3);
        let r = kb.binary(BinaryOp::Rem, i, c5);
        let _ = kb.load(0, vec![r]);
        let k = kb.finish(r).unwrap();
        assert!(affine(&k, k.root).is_none());
    }

    /// A 1×1 convolution in NCHW: rows are output channels, columns `h·W + w`.
    #[test]
    fn recognises_a_pointwise_convolution() {
        let mut kb = KernelBuilder::new("pw", vec![t(&[2, 8, 5, 6]), t(&[4, 8, 1, 1])], t(&[2, 4, 5, 6]));
        let o = kb.out_index();
        let ci = kb.new_var(8);
        let (kh, kw) = (kb.new_var(1), kb.new_var(1));
        let (c, h, w) = (kb.var(ci), kb.var(kh), kb.var(kw));
        let x = kb.load(0, vec![o[0], c, o[2], o[3]]);
        let f = kb.load(1, vec![o[1], c, h, w]);
        let p = kb.mul(x, f);
        let s = kb.reduce(ReduceOp::Sum, vec![ci, kh, kw], p);
        let c = Contraction::of(&kb.finish(s).unwrap()).expect("a contraction");
        assert_eq!((c.batch.clone(), c.m, c.n.clone(), c.k.clone()), (vec![0], 1, vec![2, 3], vec![4]));
        assert_eq!(c.dims, [4, 30, 8]);
        assert_eq!((c.a.input, c.b.input), (1, 0));
        assert_eq!(c.column_step(&c.b.offset), Some(1));
        assert_eq!(c.column_step(&c.a.offset), Some(0));
    }

    /// `w` packed in panels of 4 columns, `[⌈5/4⌉, 7, 4]`, read at `[n div 4, k, n rem 4]`:
    /// a panel operand; with the division and remainder of different variables, or a
    /// width other than the input's, it is not one.
    #[test]
    fn recognises_panel_operands() {
        let build = |dvar: usize, width: i64| {
            let mut kb = KernelBuilder::new("mm", vec![t(&[3, 7]), t(&[2, 7, 4])], t(&[3, 5]));
            let o = kb.out_index();
            let kv = kb.new_var(7);
            let kk = kb.var(kv);
            let x = kb.load(0, vec![o[0], kk]);
            let c = kb.index(width);
            let d = kb.binary(BinaryOp::Div, o[dvar], c);
            let r = kb.binary(BinaryOp::Rem, o[1], c);
            let w = kb.load(1, vec![d, kk, r]);
            let p = kb.mul(x, w);
            let s = kb.reduce(ReduceOp::Sum, vec![kv], p);
            kb.finish(s)
        };
        let c = Contraction::of(&build(1, 4).unwrap()).expect("a contraction");
        assert_eq!(c.b.panel, Some(Panel { var: 1, width: 4, stride: 28 }));
        assert_eq!((c.b.offset.of(1), c.b.offset.of(2)), (1, 4));
        assert_eq!((c.m, c.n.clone(), c.dims), (0, vec![1], [3, 5, 7]));
        // Rows 0..3 divided by 4 are 0 and fit the 2 panels, but the remainder is the
        // columns': no panel, and the load is not affine either.
        assert!(build(0, 4).ok().and_then(|k| Contraction::of(&k)).is_none());
        // Panels of 2 do not match the input's width of 4 (nor its bounds).
        assert!(build(1, 2).ok().and_then(|k| Contraction::of(&k)).is_none());
    }

    /// An i8 weight in one panel, `[1, 7, 8]` for 5 columns: the kernel builder folds
    /// `n div 8` to 0 and `n rem 8` to `n`, and the load at `[0, k, n]` is still read as
    /// the panel (the weight packing of a narrow integer operand builds exactly this).
    /// Two panels' worth of input read at `[0, k, n]` is its first panel read plainly.
    #[test]
    fn recognises_one_panel_folded() {
        let build = |panels: usize, width: usize| {
            let wt = TensorType::new(DType::I8, Shape::new(vec![panels, 7, width]).unwrap());
            let mut kb = KernelBuilder::new("mm", vec![t(&[3, 7]), wt], t(&[3, 5]));
            let o = kb.out_index();
            let kv = kb.new_var(7);
            let kk = kb.var(kv);
            let x = kb.load(0, vec![o[0], kk]);
            let c = kb.index(width as i64);
            let d = kb.binary(BinaryOp::Div, o[1], c);
            let r = kb.binary(BinaryOp::Rem, o[1], c);
            let w = kb.load(1, vec![d, kk, r]);
            let w = kb.convert(w, ScalarType::F32);
            let p = kb.mul(x, w);
            let s = kb.reduce(ReduceOp::Sum, vec![kv], p);
            kb.finish(s).unwrap()
        };
        let k = build(1, 8);
        let Expr::Load { index, .. } =
            &k.nodes.iter().find(|n| matches!(&n.expr, Expr::Load { input: 1, .. })).unwrap().expr
        else {
            unreachable!()
        };
        assert_eq!(k.node(index[0]).expr, Expr::Const(0), "the builder folds the quotient");
        let c = Contraction::of(&k).expect("a contraction");
        assert_eq!(c.b.panel, Some(Panel { var: 1, width: 8, stride: 56 }));
        assert_eq!((c.b.offset.of(1), c.b.offset.of(2)), (1, 8));
        // `[2, 7, 8]` read at `[0, k, n]` is an affine load of its first panel, not a
        // panel layout.
        let c = Contraction::of(&build(2, 8)).expect("a contraction");
        assert_eq!(c.b.panel, None);
    }

    /// `out[m, n] = Σ_k x[m, k] · w[k·s + ..]` plus `extra` epilogue loads: B read with
    /// its columns `step` elements apart (a transposed operand), each epilogue load a
    /// row of `[M, N]` read at `(m, n)`, or at `(n, m)` of an `[N, M]` input (across the
    /// columns) when `across`.
    fn with_loads(step: usize, extra: usize, across: bool) -> Kernel {
        let (m, k, n) = (3, 4, 5);
        let mut ins = vec![t(&[m, k]), if step == 1 { t(&[k, n]) } else { t(&[n, k]) }];
        for _ in 0..extra {
            ins.push(if across { t(&[n, m]) } else { t(&[m, n]) });
        }
        let mut kb = KernelBuilder::new("mm", ins, t(&[m, n]));
        let o = kb.out_index();
        let kv = kb.new_var(k as u64);
        let kk = kb.var(kv);
        let x = kb.load(0, vec![o[0], kk]);
        let w = if step == 1 { kb.load(1, vec![kk, o[1]]) } else { kb.load(1, vec![o[1], kk]) };
        let p = kb.mul(x, w);
        let mut y = kb.reduce(ReduceOp::Sum, vec![kv], p);
        for i in 0..extra {
            let e = if across { kb.load(2 + i, vec![o[1], o[0]]) } else { kb.load(2 + i, vec![o[0], o[1]]) };
            y = kb.add(y, e);
        }
        kb.finish(y).unwrap()
    }

    #[test]
    fn in_place_contractions() {
        let in_place = |k: &Kernel| Contraction::of(k).map(|c| c.in_place(k));
        assert_eq!(in_place(&with_loads(1, 0, false)), Some(true));
        assert_eq!(in_place(&with_loads(1, MAX_EPILOGUE_LOADS, false)), Some(true));
        // One epilogue operand more than a microkernel has pointer registers for.
        assert_eq!(in_place(&with_loads(1, MAX_EPILOGUE_LOADS + 1, false)), Some(false));
        // A residual read across the columns (a transposed layout).
        assert_eq!(in_place(&with_loads(1, 1, true)), Some(false));
        // A convolution whose image is read with its columns C elements apart (a
        // Transpose of an [N, L, C] sequence fused into it): a contraction, not in place.
        let mut kb = KernelBuilder::new("conv1d", vec![t(&[1, 12, 6]), t(&[4, 6, 3])], t(&[1, 4, 10]));
        let o = kb.out_index();
        let (ci, kw) = (kb.new_var(6), kb.new_var(3));
        let (c, w) = (kb.var(ci), kb.var(kw));
        let pos = kb.add(o[2], w);
        let x = kb.load(0, vec![o[0], pos, c]);
        let f = kb.load(1, vec![o[1], c, w]);
        let p = kb.mul(x, f);
        let s = kb.reduce(ReduceOp::Sum, vec![ci, kw], p);
        let k = kb.finish(s).unwrap();
        let conv = Contraction::of(&k).expect("a contraction");
        assert_eq!(conv.column_step(&conv.b.offset), Some(6));
        assert!(!conv.in_place(&k));
        assert!(!crate::layout::contraction_in_place(&k));
    }

    #[test]
    fn rejects_what_is_not_one() {
        // A plain sum of one operand.
        let mut kb = KernelBuilder::new("sum", vec![t(&[3, 7])], t(&[3, 1]));
        let o = kb.out_index();
        let kv = kb.new_var(7);
        let kk = kb.var(kv);
        let x = kb.load(0, vec![o[0], kk]);
        let s = kb.reduce(ReduceOp::Sum, vec![kv], x);
        let _ = o[1];
        assert!(Contraction::of(&kb.finish(s).unwrap()).is_none());
    }
}
