//! Recognising concatenations: kernels that copy each input, whole, into its own range of
//! one output axis — Concat as `kiln-lower` writes it, not fused with anything.
//!
//! The form, [`Concat::of`]: the root is a chain `select(v_a < e_1, x_1, select(v_a <
//! e_2, x_2, … x_n))` over one output variable `v_a`, where each `x_j` is an in-bounds
//! load of a different input `j`, whose dims are the output's but `e_j − e_{j−1}` along
//! axis `a`, at the output index with `v_a − e_{j−1}` along `a` (the lowering may
//! clamp that index into the input's range: the index is checked by evaluating it
//! over the branch's range, not by its form).
//!
//! Such a kernel moves every input element exactly once, to a place that depends on
//! nothing but the input and its offset on the axis; where every axis before `a` has
//! extent 1, each input's place is one contiguous range of the output's bytes. The
//! stream level then lets each input's producer write that range directly and runs no
//! concatenation at all (`kiln_compiler::stream`, in-place concatenation). Nothing here
//! changes a kernel.

use crate::interp::NodeEval;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, ScalarType};

/// A recognised concatenation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concat {
    /// The axis.
    pub axis: usize,
    /// Per piece, in output order: the kernel input and its first position on the axis.
    pub pieces: Vec<(u32, u64)>,
}

impl Concat {
    /// Recognises `k` (see the module docs), or `None`.
    pub fn of(k: &Kernel) -> Option<Concat> {
        if k.scatter.is_some() {
            return None;
        }
        let rank = k.out_rank();
        let od = k.output.shape.dims();
        if rank == 0 || k.inputs.len() < 2 || k.output.shape.numel() == 0 {
            return None;
        }
        // The chain of selects: (branch, end of its range).
        let mut branches: Vec<(ExprId, Option<i64>)> = Vec::new();
        let mut axis = None;
        let mut e = k.root;
        while let Expr::Select(c, x, rest) = k.node(e).expr {
            let Expr::Binary(BinaryOp::Lt, v, end) = k.node(c).expr else { return None };
            if k.node(end).ty != ScalarType::I64 {
                return None;
            }
            let (Expr::Var(var), Expr::Const(end)) = (&k.node(v).expr, &k.node(end).expr) else { return None };
            let a = var.0 as usize;
            if a >= rank || *axis.get_or_insert(a) != a {
                return None;
            }
            branches.push((x, Some(*end as i64)));
            e = rest;
        }
        branches.push((e, None));
        let a = axis?;
        let mut pieces = Vec::with_capacity(branches.len());
        let mut start = 0i64;
        let mut env = vec![0i64; k.vars.len()];
        let free = k.free_vars();
        for (x, end) in branches {
            let end = end.unwrap_or(od[a] as i64);
            let Expr::Load { input, index, bounds: Bounds::InBounds } = &k.node(x).expr else { return None };
            let t = k.inputs.get(*input as usize)?;
            let xd = t.shape.dims();
            if t.dtype != k.output.dtype
                || xd.len() != rank
                || end <= start
                || xd[a] as i64 != end - start
                || pieces.iter().any(|&(i, _)| i == *input)
            {
                return None;
            }
            for (d, &ie) in index.iter().enumerate() {
                if d == a {
                    continue;
                }
                if xd[d] != od[d] || !matches!(k.node(ie).expr, Expr::Var(v) if v.0 as usize == d) {
                    return None;
                }
            }
            if free[index[a].index()].iter().any(|&v| v as usize != a) {
                return None;
            }
            let mut ev = NodeEval::new(k, index[a])?;
            for v in start..end {
                env[a] = v;
                if ev.at(&env) as i64 != v - start {
                    return None;
                }
            }
            pieces.push((*input, start as u64));
            start = end;
        }
        (start == od[a] as i64 && pieces.len() == k.inputs.len()).then_some(Concat { axis: a, pieces })
    }
}
