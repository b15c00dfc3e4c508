//! Kernel classes: the shape of computation a kernel has, decided once at the flow level
//! so that every code generator matches on it instead of trying its emitters in turn.
//!
//! The class is a function of the kernel alone ([`classify`]) and says nothing
//! about a target: a target implements one emitter per class, and where its emitter
//! declines a kernel of that class (a CPU microkernel without an epilogue form, rows too
//! short for a vector) it compiles the kernel the general way and says so. Dispatches
//! carry their kernel's class ([`crate::program::Dispatch::class`]); the flow text form
//! prints it.
//!
//! The classes, decided in this order (the first that fits):
//! 0. [`KernelClass::Attention`]: `softmax(s·Q·Kᵀ + mask)·V` as one kernel, the form
//!    [`crate::attention::Attention::of`] recognises (formed only by
//!    [`crate::attention::form_attention`], after fusion).
//! 1. [`KernelClass::Window`]: a depthwise convolution or a pool over an NCHW image,
//!    each output channel a small window of its own input channel
//!    ([`crate::window::Depthwise::of`]); or an interpolating resample (Resize), each
//!    output a few taps with weights tabulated per position
//!    ([`crate::resample::Resample::is_interpolation`]).
//! 2. [`KernelClass::Contraction`]: an epilogue over `Σ_k A[.., m, k] · B[.., k, n]`,
//!    a matrix product or a convolution ([`crate::contraction::Contraction::of`]).
//! 3. [`KernelClass::Movement`]: no reduction and no arithmetic on values: every output
//!    element is one input element (or a constant, for padding) chosen by index
//!    arithmetic alone — the root is a load, or selects between loads and constants on
//!    conditions that read no input. Copies, transposes, slices, padding, broadcasts,
//!    concatenation, im2col, gathers at indices known at compile time.
//! 4. [`KernelClass::Rows`]: reductions along one axis, row by row: the output's
//!    innermost axis is a row; every reduction folds over one variable; every value of
//!    the kernel is constant along the row, varies along the output's innermost axis,
//!    or varies along exactly one reduction's variable (with the outer output
//!    variables free everywhere). Softmax, LayerNorm, row sums, means and maxima with
//!    their epilogues.
//! 5. [`KernelClass::Elementwise`]: no reduction; each output element is computed from
//!    input elements at positions its output index alone determines (the same index,
//!    a broadcast, or any other index map, such as a fused transpose); a kernel that
//!    reads no input at all (a fill, a range) is elementwise too.
//! 6. [`KernelClass::General`]: anything else — reductions that are none of the above
//!    (a cumulative sum, a reduction across a non-innermost axis, a product of two
//!    reductions' variables), and every kernel whose load indices depend on loaded data
//!    (a gather by a run-time index tensor).
//!
//! A scatter kernel (`crate::kernel`'s "Scatter kernels": each point of its domain
//! stores at a computed position of the output) is [`KernelClass::Movement`], before
//! any of these tests; code generators take it by its [`crate::Kernel::scatter`].
//!
//! A load "at a position its output index alone determines" is one whose index
//! expressions read no input; a kernel with a load whose index does read one (a
//! data-dependent index) is General, whatever else it computes.

use crate::attention::Attention;
use crate::contraction::Contraction;
use crate::kernel::{Expr, Kernel, ScalarType};
use crate::resample::Resample;
use crate::window::Depthwise;

/// The class of a kernel (see the module docs for the precise definitions): the
/// artifact's enum, so the class a dispatch has at the flow level is the one the
/// `.kiln` file records.
pub use kiln_module::program::KernelClass;

/// How fast a kernel of a class runs compared with the others, as a rank (lower is
/// faster): 0 for the classes with register-tiled microkernels (Contraction, Window), 1
/// for Rows (vectorised reductions along a row; Attention, whose emitter tiles its
/// products like a contraction's, is 0 too), 2 for Movement and Elementwise
/// (vectorised copies and pointwise loops), 3 for General (what no class emitter takes).
/// Fusion never puts the work of a kernel of rank 0 or 1 into a kernel of a slower rank
/// (`crate::fuse`). A compiler policy, so it lives here, not on the artifact's enum.
pub trait Rank {
    /// The class's rank.
    fn rank(self) -> u8;
}

impl Rank for KernelClass {
    fn rank(self) -> u8 {
        match self {
            KernelClass::Contraction | KernelClass::Window | KernelClass::Attention => 0,
            KernelClass::Rows => 1,
            KernelClass::Movement | KernelClass::Elementwise => 2,
            KernelClass::General => 3,
        }
    }
}

/// Classifies `k` (the first class of the module docs' list that fits).
pub fn classify(k: &Kernel) -> KernelClass {
    // A scatter stores each point's value at a computed position: data movement.
    if k.scatter.is_some() {
        return KernelClass::Movement;
    }
    if Attention::of(k).is_some() {
        return KernelClass::Attention;
    }
    if Depthwise::of(k).is_some() || Resample::is_interpolation(k) {
        return KernelClass::Window;
    }
    if Contraction::of(k).is_some() {
        return KernelClass::Contraction;
    }
    let Some(data) = reads_data(k) else { return KernelClass::General };
    let at = |e: crate::ExprId| data.get(e.index()).copied().unwrap_or(true);
    // A load at a data-dependent index.
    let gathers = k.nodes.iter().any(|n| matches!(&n.expr, Expr::Load { index, .. } if index.iter().any(|&i| at(i))));
    if gathers {
        return KernelClass::General;
    }
    let reduces = k.nodes.iter().any(|n| matches!(n.expr, Expr::Reduce { .. }));
    if !reduces {
        let moves = at(k.root)
            && k.nodes.iter().enumerate().all(|(i, n)| {
                !data[i]
                    || match n.expr {
                        Expr::Load { .. } => true,
                        Expr::Select(c, _, _) => !at(c),
                        _ => false,
                    }
            });
        return if moves { KernelClass::Movement } else { KernelClass::Elementwise };
    }
    if along_rows(k) {
        KernelClass::Rows
    } else {
        KernelClass::General
    }
}

/// Per node, whether its value depends on a load; `None` for a kernel whose operands do
/// not come before their users (not a valid kernel).
fn reads_data(k: &Kernel) -> Option<Vec<bool>> {
    let mut data: Vec<bool> = Vec::with_capacity(k.nodes.len());
    for n in &k.nodes {
        let mut d = matches!(n.expr, Expr::Load { .. });
        let mut ok = true;
        n.expr.for_each_operand(|o| match data.get(o.index()) {
            Some(&x) => d |= x,
            None => ok = false,
        });
        if !ok {
            return None;
        }
        data.push(d);
    }
    Some(data)
}

/// The structure of [`KernelClass::Rows`]: every reduction over one variable, and every
/// value (a node that is not an i64 index) constant along the row, along the output
/// row, or along one reduction's variable.
fn along_rows(k: &Kernel) -> bool {
    let rank = k.out_rank();
    if rank == 0 {
        return false;
    }
    let u = (rank - 1) as u32;
    let mut reduced: Vec<u32> = Vec::new();
    for n in &k.nodes {
        if let Expr::Reduce { vars, .. } = &n.expr {
            let [v] = vars[..] else { return false };
            reduced.push(v.0);
        }
    }
    let free = k.free_vars();
    k.nodes.iter().zip(&free).all(|(n, fv)| {
        if n.ty == ScalarType::I64 {
            return true;
        }
        let mut axes = fv.iter().filter(|&&v| v >= u);
        match (axes.next(), axes.next()) {
            (None, _) => true,
            (Some(&v), None) => v == u || reduced.contains(&v),
            _ => false,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{BinaryOp, Bounds, ReduceOp, UnaryOp};
    use crate::KernelBuilder;

    use crate::test_types::{matmul_bias, t, ti};

    /// `out[m, n] = Σ_k x[m, k] · w[k, n] + b[n]`.
    #[test]
    fn matmul_is_a_contraction() {
        assert_eq!(classify(&matmul_bias(4, 8, 16)), KernelClass::Contraction);
    }

    /// A 3×3 convolution over 4 input channels, in bounds (its input already padded).
    #[test]
    fn convolution_is_a_contraction() {
        let mut kb = KernelBuilder::new("conv", vec![t(&[1, 4, 10, 10]), t(&[8, 4, 3, 3])], t(&[1, 8, 8, 8]));
        let o = kb.out_index();
        let (ci, kh, kw) = (kb.new_var(4), kb.new_var(3), kb.new_var(3));
        let (c, h, w) = (kb.var(ci), kb.var(kh), kb.var(kw));
        let ih = kb.add(o[2], h);
        let iw = kb.add(o[3], w);
        let x = kb.load(0, vec![o[0], c, ih, iw]);
        let f = kb.load(1, vec![o[1], c, h, w]);
        let p = kb.mul(x, f);
        let s = kb.reduce(ReduceOp::Sum, vec![ci, kh, kw], p);
        assert_eq!(classify(&kb.finish(s).unwrap()), KernelClass::Contraction);
    }

    /// A depthwise 3×3 convolution with zero padding: each channel its own filter.
    #[test]
    fn depthwise_convolution_is_a_window() {
        let mut kb = KernelBuilder::new("dw", vec![t(&[1, 4, 8, 8]), t(&[4, 1, 3, 3])], t(&[1, 4, 8, 8]));
        let o = kb.out_index();
        let (kh, kw) = (kb.new_var(3), kb.new_var(3));
        let (h, w) = (kb.var(kh), kb.var(kw));
        let one = kb.index(1);
        let zero = kb.index(0);
        let ih = kb.add(o[2], h);
        let ih = kb.sub(ih, one);
        let iw = kb.add(o[3], w);
        let iw = kb.sub(iw, one);
        let x = kb.load_with(0, vec![o[0], o[1], ih, iw], Bounds::Pad(0));
        let f = kb.load(1, vec![o[1], zero, h, w]);
        let p = kb.mul(x, f);
        let s = kb.reduce(ReduceOp::Sum, vec![kh, kw], p);
        assert_eq!(classify(&kb.finish(s).unwrap()), KernelClass::Window);
    }

    /// A 2×2 max pool at stride 2 (NaN read as −∞).
    #[test]
    fn max_pool_is_a_window() {
        let mut kb = KernelBuilder::new("pool", vec![t(&[1, 3, 8, 8])], t(&[1, 3, 4, 4]));
        let o = kb.out_index();
        let (kh, kw) = (kb.new_var(2), kb.new_var(2));
        let (h, w) = (kb.var(kh), kb.var(kw));
        let two = kb.index(2);
        let ih = kb.mul(o[2], two);
        let ih = kb.add(ih, h);
        let iw = kb.mul(o[3], two);
        let iw = kb.add(iw, w);
        let x = kb.load(0, vec![o[0], o[1], ih, iw]);
        let nan = kb.unary(UnaryOp::IsNan, x);
        let ninf = kb.float(ScalarType::F32, f64::NEG_INFINITY);
        let v = kb.select(nan, ninf, x);
        let m = kb.reduce(ReduceOp::Max, vec![kh, kw], v);
        assert_eq!(classify(&kb.finish(m).unwrap()), KernelClass::Window);
    }

    /// Softmax over the last axis: a max and a sum along the row.
    #[test]
    fn softmax_is_rows() {
        let mut kb = KernelBuilder::new("sm", vec![t(&[2, 16])], t(&[2, 16]));
        let o = kb.out_index();
        let (a, b) = (kb.new_var(16), kb.new_var(16));
        let (va, vb) = (kb.var(a), kb.var(b));
        let xa = kb.load(0, vec![o[0], va]);
        let mx = kb.reduce(ReduceOp::Max, vec![a], xa);
        let xb = kb.load(0, vec![o[0], vb]);
        let d = kb.sub(xb, mx);
        let e = kb.unary(UnaryOp::Exp, d);
        let s = kb.reduce(ReduceOp::Sum, vec![b], e);
        let x = kb.load(0, vec![o[0], o[1]]);
        let d = kb.sub(x, mx);
        let e = kb.unary(UnaryOp::Exp, d);
        let y = kb.binary(BinaryOp::Div, e, s);
        assert_eq!(classify(&kb.finish(y).unwrap()), KernelClass::Rows);
    }

    /// LayerNorm without affine parameters: mean and variance along the row.
    #[test]
    fn layernorm_is_rows() {
        let mut kb = KernelBuilder::new("ln", vec![t(&[3, 32]), t(&[32])], t(&[3, 32]));
        let o = kb.out_index();
        let n = kb.float(ScalarType::F32, 32.0);
        let (a, b) = (kb.new_var(32), kb.new_var(32));
        let (va, vb) = (kb.var(a), kb.var(b));
        let xa = kb.load(0, vec![o[0], va]);
        let s = kb.reduce(ReduceOp::Sum, vec![a], xa);
        let mean = kb.binary(BinaryOp::Div, s, n);
        let xb = kb.load(0, vec![o[0], vb]);
        let d = kb.sub(xb, mean);
        let d2 = kb.mul(d, d);
        let v = kb.reduce(ReduceOp::Sum, vec![b], d2);
        let var = kb.binary(BinaryOp::Div, v, n);
        let r = kb.unary(UnaryOp::Sqrt, var);
        let x = kb.load(0, vec![o[0], o[1]]);
        let c = kb.sub(x, mean);
        let y = kb.binary(BinaryOp::Div, c, r);
        let g = kb.load(1, vec![o[1]]);
        let y = kb.mul(y, g);
        assert_eq!(classify(&kb.finish(y).unwrap()), KernelClass::Rows);
    }

    /// Padding by 1 on each side of the last axis.
    #[test]
    fn pad_is_movement() {
        let mut kb = KernelBuilder::new("pad", vec![t(&[2, 6])], t(&[2, 8]));
        let o = kb.out_index();
        let one = kb.index(1);
        let i = kb.sub(o[1], one);
        let x = kb.load_with(0, vec![o[0], i], Bounds::Pad(0));
        assert_eq!(classify(&kb.finish(x).unwrap()), KernelClass::Movement);
    }

    #[test]
    fn transpose_and_concat_are_movement() {
        let mut kb = KernelBuilder::new("tr", vec![t(&[5, 7])], t(&[7, 5]));
        let o = kb.out_index();
        let x = kb.load(0, vec![o[1], o[0]]);
        assert_eq!(classify(&kb.finish(x).unwrap()), KernelClass::Movement);
        // Concatenation along the last axis: select(j < 3, a[i, j], b[i, j − 3]).
        let mut kb = KernelBuilder::new("cat", vec![t(&[2, 3]), t(&[2, 4])], t(&[2, 7]));
        let o = kb.out_index();
        let three = kb.index(3);
        let c = kb.binary(BinaryOp::Lt, o[1], three);
        let a = kb.load_with(0, vec![o[0], o[1]], Bounds::Pad(0));
        let jb = kb.sub(o[1], three);
        let b = kb.load_with(1, vec![o[0], jb], Bounds::Pad(0));
        let y = kb.select(c, a, b);
        assert_eq!(classify(&kb.finish(y).unwrap()), KernelClass::Movement);
    }

    /// `a + b[broadcast]`, and a relu of a transposed input: elementwise.
    #[test]
    fn add_is_elementwise() {
        let mut kb = KernelBuilder::new("add", vec![t(&[4, 8]), t(&[8])], t(&[4, 8]));
        let o = kb.out_index();
        let a = kb.load(0, vec![o[0], o[1]]);
        let b = kb.load(1, vec![o[1]]);
        let y = kb.add(a, b);
        assert_eq!(classify(&kb.finish(y).unwrap()), KernelClass::Elementwise);
        let mut kb = KernelBuilder::new("relu_t", vec![t(&[8, 4])], t(&[4, 8]));
        let o = kb.out_index();
        let a = kb.load(0, vec![o[1], o[0]]);
        let z = kb.float(ScalarType::F32, 0.0);
        let y = kb.binary(BinaryOp::Max, a, z);
        assert_eq!(classify(&kb.finish(y).unwrap()), KernelClass::Elementwise);
    }

    /// A gather by a run-time index, and a cumulative sum: general.
    #[test]
    fn gather_and_cumsum_are_general() {
        let mut kb = KernelBuilder::new("gather", vec![t(&[10, 4]), ti(&[3])], t(&[3, 4]));
        let o = kb.out_index();
        let i = kb.load(1, vec![o[0]]);
        let x = kb.load_with(0, vec![i, o[1]], Bounds::Clamp);
        assert_eq!(classify(&kb.finish(x).unwrap()), KernelClass::General);
        // out[i] = Σ_{j ≤ i} x[j].
        let mut kb = KernelBuilder::new("cumsum", vec![t(&[6])], t(&[6]));
        let o = kb.out_index();
        let jv = kb.new_var(6);
        let j = kb.var(jv);
        let x = kb.load(0, vec![j]);
        let le = kb.binary(BinaryOp::Le, j, o[0]);
        let z = kb.float(ScalarType::F32, 0.0);
        let v = kb.select(le, x, z);
        let s = kb.reduce(ReduceOp::Sum, vec![jv], v);
        assert_eq!(classify(&kb.finish(s).unwrap()), KernelClass::General);
    }

    /// The ranks order the classes from the register-tiled microkernels to the scalar
    /// loops, as fusion's no-demotion rule reads them.
    #[test]
    fn ranks() {
        use KernelClass::*;
        assert_eq!(Contraction.rank(), Window.rank());
        assert!(Window.rank() < Rows.rank() && Rows.rank() < Elementwise.rank());
        assert_eq!(Movement.rank(), Elementwise.rank());
        assert!(Elementwise.rank() < General.rank());
    }
}
