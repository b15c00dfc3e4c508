//! Recognising contractions: kernels whose value is, at every output index,
//! an epilogue applied to `Σ_k A[.., m, k] · B[.., k, n]`.
//!
//! A target with matrix microkernels asks [`Contraction::of`] whether a kernel has this
//! shape and, if so, where its operands live: the flat element offset of every operand
//! access as an affine form over the kernel's variables. The epilogue is left as the
//! kernel's own expression DAG above the reduction (bias, activation, residual add,
//! scaling); the target decides which epilogue operations it can apply in registers.
//!
//! The recognised form, for an output of rank `r ≥ 2`:
//! - `n` is the innermost output variable, `m` the one before it, the rest are batch
//!   variables;
//! - exactly one `Reduce { Sum, [k] }` over f32 whose body is `Load(a) · Load(b)`
//!   (either order), both `InBounds` loads of f32 inputs with affine indices;
//! - `a`'s offset does not depend on `n`; `b`'s does not depend on `m`.
//!
//! Nothing here changes the kernel: a target that does not take the contraction path
//! compiles the same kernel with its general code generator.

use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType, UnaryOp};
use kiln_ir::DType;

/// `c + Σ coef[v]·v` over the kernel's variables (flat element offsets, i64).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffineIndex {
    /// The constant term.
    pub c: i64,
    /// One coefficient per kernel variable.
    pub coef: Vec<i64>,
}

impl AffineIndex {
    fn constant(c: i64, nvars: usize) -> AffineIndex {
        AffineIndex { c, coef: vec![0; nvars] }
    }

    fn scaled(mut self, k: i64) -> Option<AffineIndex> {
        self.c = self.c.checked_mul(k)?;
        for c in &mut self.coef {
            *c = c.checked_mul(k)?;
        }
        Some(self)
    }

    fn plus(mut self, o: &AffineIndex) -> Option<AffineIndex> {
        self.c = self.c.checked_add(o.c)?;
        for (a, b) in self.coef.iter_mut().zip(&o.coef) {
            *a = a.checked_add(*b)?;
        }
        Some(self)
    }

    /// The coefficient of variable `v`.
    pub fn of(&self, v: u32) -> i64 {
        self.coef.get(v as usize).copied().unwrap_or(0)
    }
}

/// The affine form of i64 expression `e`, when it is one (no overflow in the
/// coefficients, no data-dependent or non-linear terms).
pub fn affine(k: &Kernel, e: ExprId) -> Option<AffineIndex> {
    let nv = k.vars.len();
    let node = k.nodes.get(e.index())?;
    if node.ty != ScalarType::I64 {
        return None;
    }
    match &node.expr {
        Expr::Var(v) => {
            let mut a = AffineIndex::constant(0, nv);
            *a.coef.get_mut(v.0 as usize)? = 1;
            Some(a)
        }
        Expr::Const(bits) => Some(AffineIndex::constant(*bits as i64, nv)),
        Expr::Binary(BinaryOp::Add, a, b) => affine(k, *a)?.plus(&affine(k, *b)?),
        Expr::Binary(BinaryOp::Sub, a, b) => affine(k, *a)?.plus(&affine(k, *b)?.scaled(-1)?),
        Expr::Binary(BinaryOp::Mul, a, b) => {
            let (a, b) = (affine(k, *a)?, affine(k, *b)?);
            if a.coef.iter().all(|&c| c == 0) {
                b.scaled(a.c)
            } else if b.coef.iter().all(|&c| c == 0) {
                a.scaled(b.c)
            } else {
                None
            }
        }
        Expr::Unary(UnaryOp::Neg, a) => affine(k, *a)?.scaled(-1),
        _ => None,
    }
}

/// The flat element offset of an `InBounds` load (row-major), as an affine form.
pub fn load_offset(k: &Kernel, input: u32, index: &[ExprId]) -> Option<AffineIndex> {
    let ty = k.inputs.get(input as usize)?;
    let dims = ty.shape.dims();
    if dims.len() != index.len() {
        return None;
    }
    let mut stride = 1i64;
    let mut flat = AffineIndex::constant(0, k.vars.len());
    for (d, &e) in index.iter().enumerate().rev() {
        flat = flat.plus(&affine(k, e)?.scaled(stride)?)?;
        stride = stride.checked_mul(i64::try_from(dims[d]).ok()?)?;
    }
    Some(flat)
}

/// One operand of the contraction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The kernel input it reads.
    pub input: u32,
    /// Its flat element offset over the kernel's variables.
    pub offset: AffineIndex,
}

/// A recognised contraction (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contraction {
    /// Batch variables (outer output dimensions), outermost first.
    pub batch: Vec<u32>,
    /// The row variable.
    pub m: u32,
    /// The column variable (innermost output dimension).
    pub n: u32,
    /// The reduction variable.
    pub k: u32,
    /// Extents of `m`, `n`, `k`.
    pub dims: [u64; 3],
    /// The left operand: offset independent of `n`.
    pub a: Operand,
    /// The right operand: offset independent of `m`.
    pub b: Operand,
    /// The reduction node; the epilogue is the kernel's root expression over it.
    pub reduce: ExprId,
}

impl Contraction {
    /// Recognises `k` as a contraction, or `None`.
    pub fn of(k: &Kernel) -> Option<Contraction> {
        let rank = k.out_rank();
        if rank < 2 || k.output.dtype != DType::F32 || k.output.shape.numel() == 0 {
            return None;
        }
        let (m, n) = ((rank - 2) as u32, (rank - 1) as u32);
        let mut found = None;
        for (i, node) in k.nodes.iter().enumerate() {
            if let Expr::Reduce { op, vars, body } = &node.expr {
                if found.is_some() || *op != ReduceOp::Sum || vars.len() != 1 || node.ty != ScalarType::F32 {
                    return None;
                }
                found = Some((ExprId(i as u32), vars[0].0, *body));
            }
        }
        let (reduce, kv, body) = found?;
        let Expr::Binary(BinaryOp::Mul, x, y) = k.node(body).expr else { return None };
        let load = |e: ExprId| -> Option<Operand> {
            match &k.node(e).expr {
                Expr::Load { input, index, bounds: Bounds::InBounds }
                    if k.inputs.get(*input as usize)?.dtype == DType::F32 =>
                {
                    Some(Operand { input: *input, offset: load_offset(k, *input, index)? })
                }
                _ => None,
            }
        };
        let (x, y) = (load(x)?, load(y)?);
        let (a, b) = if x.offset.of(n) == 0 && y.offset.of(m) == 0 {
            (x, y)
        } else if y.offset.of(n) == 0 && x.offset.of(m) == 0 {
            (y, x)
        } else {
            return None;
        };
        // Anything else in the kernel (the epilogue) must not read `k`: it only can
        // through the reduction, which the verifier guarantees.
        let dims = [k.vars[m as usize], k.vars[n as usize], k.vars[kv as usize]];
        Some(Contraction { batch: (0..m).collect(), m, n, k: kv, dims, a, b, reduce })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KernelBuilder;
    use kiln_ir::{Shape, TensorType};

    fn t(dims: &[usize]) -> TensorType {
        TensorType::new(DType::F32, Shape::new(dims).unwrap())
    }

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
        assert_eq!((c.batch.clone(), c.m, c.n, c.k), (vec![0], 1, 2, 3));
        assert_eq!(c.dims, [3, 5, 7]);
        assert_eq!(c.a.input, 0);
        assert_eq!((c.a.offset.of(0), c.a.offset.of(1), c.a.offset.of(3)), (21, 7, 1));
        assert_eq!(c.b.input, 1);
        assert_eq!((c.b.offset.of(2), c.b.offset.of(3)), (1, 5));
        // Transposed weights are still a contraction; the column stride says so.
        let c = Contraction::of(&batched(true)).expect("a contraction");
        assert_eq!((c.b.offset.of(2), c.b.offset.of(3)), (7, 1));
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
