//! Lowering of tensor ops into flow kernels.
//!
//! [`lower_op`] turns one tensor-level op, with the types of its operands (and the
//! contents of the constant ones) in an [`OpCx`], into [`Lowered`]: a small DAG of
//! [`Step`]s, each one kernel ([`kiln_flow::kernel::Kernel`]) whose inputs are the op's
//! operands or earlier steps' results, plus where each of the op's results comes from.
//! Most ops are one step; ops whose results are a view of an operand's bytes (Reshape,
//! Squeeze, Flatten, Identity, …) are [`Output::Alias`] and cost nothing. A lowering
//! reads constant operands it needs at compile time (shapes, pads, axes) and binds only
//! the operands its kernels read.
//!
//! Each op family has a module (elementwise, movement, reductions, linear algebra,
//! normalisations, recurrent layers, sampling, transformer ops); [`lower_op`] asks them
//! in turn. Helpers shared by the families (dtype handling, axes, powers) live here; the
//! interface types and the index helpers are kiln-flow's ([`kiln_flow::lower`]),
//! re-exported here.
//!
//! [`form`] and [`form_with`] are dispatch formation with these lowerings: every node
//! of a graph lowered, then fused ([`kiln_flow::program::form`]).
#![deny(missing_docs)]

use kiln_flow::kernel::{ExprId, KernelBuilder, ScalarType};
pub use kiln_flow::program::Formation;
use kiln_flow::program::{FlowError, FlowProgram};
use kiln_ir::{DType, Graph};

pub use kiln_flow::lower::{
    broadcast_index, flat_index, interpret, unflatten, LowerError, Lowered, OpCx, OpInput, Operand, Output, Step,
};

mod dynamic;
mod elementwise;
mod linalg;
mod movement;
mod norm;
mod recurrent;
mod reduce;
mod sample;
mod transformer;

/// Lowers every node of `graph` and fuses the result, shaping the program for targets
/// with contraction microkernels, attention chains fused ([`kiln_flow::program::form`]
/// with [`lower_op`]): every recogniser on, as the formation filetests pin them.
pub fn form(graph: &Graph) -> Result<FlowProgram, FlowError> {
    form_with(graph, Formation::Microkernels, Some(&kiln_flow::attention::accept_all))
}

/// [`form`], shaping the program for `formation`'s kernel forms (see [`Formation`]),
/// attention chains fused where `fused_attention` gives a rule and the rule accepts them.
pub fn form_with(
    graph: &Graph,
    formation: Formation,
    fused_attention: Option<kiln_flow::attention::Accept<'_>>,
) -> Result<FlowProgram, FlowError> {
    kiln_flow::program::form(graph, formation, fused_attention, &lower_op)
}

/// Lowers every node of `graph`, one dispatch per kernel, without fusing.
pub fn lower_graph(graph: &Graph) -> Result<FlowProgram, FlowError> {
    kiln_flow::program::lower_graph(graph, &lower_op)
}

/// Lowers one op (see the module docs).
pub fn lower_op(cx: &OpCx<'_>) -> Result<Lowered, LowerError> {
    let families: [fn(&OpCx<'_>) -> Option<Result<Lowered, LowerError>>; 9] = [
        elementwise::lower,
        movement::lower,
        reduce::lower,
        linalg::lower,
        norm::lower,
        recurrent::lower,
        sample::lower,
        dynamic::lower,
        transformer::lower,
    ];
    for f in families {
        if let Some(r) = f(cx) {
            return r;
        }
    }
    Err(cx.unsupported("no lowering for this op yet"))
}

/// `x^e` for a float `x` and a constant exponent `e` that plain arithmetic computes with
/// the same special values as `pow` (0, ±1, 2, ¼, ½, ¾, 1½: multiplies and square roots,
/// which a code generator vectorises, where `pow` is a call per element); `None` for
/// other exponents. `pow(±0, e)` is +0 and `pow(−∞, e)` +∞ for these positive `e`, where
/// square roots give −0 and NaN: both are put right. The roots round at most three
/// times (about 1.5 ulp from the correctly rounded power).
pub fn pow_by_constant(b: &mut KernelBuilder, x: ExprId, e: f64) -> Option<ExprId> {
    use kiln_flow::kernel::{BinaryOp as B, UnaryOp as U};
    let t = b.ty(x);
    if !t.is_float() {
        return None;
    }
    let r = match e {
        0.0 => return Some(b.float(t, 1.0)),
        1.0 => return Some(x),
        2.0 => return Some(b.mul(x, x)),
        -1.0 => {
            let one = b.float(t, 1.0);
            return Some(b.div(one, x));
        }
        0.5 => b.unary(U::Sqrt, x),
        0.25 => {
            let s = b.unary(U::Sqrt, x);
            b.unary(U::Sqrt, s)
        }
        0.75 => {
            let s = b.unary(U::Sqrt, x);
            let q = b.unary(U::Sqrt, s);
            b.mul(s, q)
        }
        1.5 => {
            let s = b.unary(U::Sqrt, x);
            b.mul(x, s)
        }
        _ => return None,
    };
    // −0 → +0 (a root of −0 is −0; the products of two such are +0 already).
    let zero = b.float(t, 0.0);
    let r = b.add(r, zero);
    let (ni, pi) = (b.float(t, f64::NEG_INFINITY), b.float(t, f64::INFINITY));
    let m = b.binary(B::Eq, x, ni);
    Some(b.select(m, pi, r))
}

/// The truncated mean `Σx / n` of 64-bit integers whose sum may overflow, from the sums
/// `q = Σ(x/n)` and `r = Σ(x%n)`, which cannot: `q + r/n`, and for a `signed` type one
/// step towards zero where that and `r % n` have opposite signs (truncating the two
/// parts separately then went one past truncating the whole). Mean and ReduceMean.
pub(crate) fn mean_from_parts(b: &mut KernelBuilder, q: ExprId, r: ExprId, n: ExprId, signed: bool) -> ExprId {
    use kiln_flow::kernel::BinaryOp as B;
    let a = b.div(r, n);
    let s = b.add(q, a);
    if !signed {
        return s;
    }
    let t = b.ty(s);
    let c = b.binary(B::Rem, r, n);
    let (zero, one) = (b.int(t, 0), b.int(t, 1));
    let sp = b.binary(B::Gt, s, zero);
    let sn = b.binary(B::Lt, s, zero);
    let cp = b.binary(B::Gt, c, zero);
    let cn = b.binary(B::Lt, c, zero);
    let down = b.binary(B::And, sp, cn);
    let up = b.binary(B::And, sn, cp);
    let sm = b.sub(s, one);
    let sa = b.add(s, one);
    let s2 = b.select(down, sm, s);
    b.select(up, sa, s2)
}

/// The compute type a float op of storage dtype `d` computes in.
pub fn compute(d: DType) -> ScalarType {
    ScalarType::of_storage(d)
}

/// Ends a kernel's value: the cast that rounds `e` to the output dtype (identity when
/// the output stores its compute type exactly).
pub fn store(b: &mut KernelBuilder, e: ExprId) -> ExprId {
    let d = b.output().dtype;
    b.cast(e, d, true)
}

/// Normalises a possibly negative axis against `rank`.
pub fn norm_axis(cx: &OpCx<'_>, axis: i64, rank: usize) -> Result<usize, LowerError> {
    let r = rank as i64;
    if axis < -r || axis >= r.max(1) {
        return Err(cx.unsupported(format!("axis {axis} out of range for rank {rank}")));
    }
    Ok(if axis < 0 { (axis + r) as usize } else { axis as usize })
}
