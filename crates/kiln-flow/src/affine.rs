//! The affine-index analysis: every i64 index expression of a kernel as
//! `c + Σ coef·atom`, where an atom is an index variable or a node that is not affine
//! in them.
//!
//! One analysis serves two readers, in one of two [`Mode`]s:
//! - the recognisers of this crate ([`crate::contraction`], [`crate::window`],
//!   [`crate::class`]) and the layout transforms ask [`Mode::Exact`]: the form must be
//!   affine in the variables alone, with no overflow anywhere in its coefficients, and a
//!   `div` or `rem` by a constant is taken apart where that is exact (a reshape's flat
//!   index split back into coordinates); they read the result as an [`AffineIndex`];
//! - a code generator building address chains asks [`Mode::Address`]: arithmetic wraps
//!   as the machine's index arithmetic does, and whatever is not affine (a `div`, a
//!   loaded index) stays an opaque [`Atom::Node`] term that the code computes.
//!
//! Both modes take the same expression forms apart the same way (`Var`, `Const`, `+`,
//! `−`, `×` by a constant, `neg`); they differ only where the brief of the reader does.

use std::collections::HashMap;

use crate::kernel::{BinaryOp, Expr, ExprId, Kernel, ScalarType, UnaryOp};

/// An opaque term of an affine form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Atom {
    /// The value of an index variable.
    Var(u32),
    /// The value of a node that is not affine in the variables (only in
    /// [`Mode::Address`]).
    Node(u32),
}

/// How the analysis treats overflow and what is not affine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Checked arithmetic (an overflow makes the expression not affine); opaque terms make
    /// it not affine; `x div c` and `x rem c` are taken apart where exact.
    Exact,
    /// Wrapping arithmetic; anything not affine is an [`Atom::Node`] term; `div` and
    /// `rem` are opaque.
    Address,
}

/// `c + Σ coef·atom`, with no zero coefficients, terms in the order they were first met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Affine {
    /// The constant term.
    pub c: i64,
    /// The terms with their coefficients.
    pub terms: Vec<(Atom, i64)>,
}

fn mul(x: i64, y: i64, mode: Mode) -> Option<i64> {
    match mode {
        Mode::Exact => x.checked_mul(y),
        Mode::Address => Some(x.wrapping_mul(y)),
    }
}

fn add(x: i64, y: i64, mode: Mode) -> Option<i64> {
    match mode {
        Mode::Exact => x.checked_add(y),
        Mode::Address => Some(x.wrapping_add(y)),
    }
}

impl Affine {
    /// The constant `c`.
    pub fn constant(c: i64) -> Affine {
        Affine { c, terms: Vec::new() }
    }

    /// The atom `a` alone.
    pub fn atom(a: Atom) -> Affine {
        Affine { c: 0, terms: vec![(a, 1)] }
    }

    fn push(&mut self, a: Atom, k: i64, mode: Mode) -> Option<()> {
        if let Some(t) = self.terms.iter_mut().find(|t| t.0 == a) {
            t.1 = add(t.1, k, mode)?;
        } else {
            self.terms.push((a, k));
        }
        self.terms.retain(|t| t.1 != 0);
        Some(())
    }

    /// `k · self` (`None` on overflow in [`Mode::Exact`]).
    pub fn scaled(&self, k: i64, mode: Mode) -> Option<Affine> {
        let mut r = Affine { c: mul(self.c, k, mode)?, terms: Vec::new() };
        for &(a, x) in &self.terms {
            r.push(a, mul(x, k, mode)?, mode)?;
        }
        Some(r)
    }

    /// `self + o` (`None` on overflow in [`Mode::Exact`]).
    pub fn plus(&self, o: &Affine, mode: Mode) -> Option<Affine> {
        let mut r = self.clone();
        r.c = add(r.c, o.c, mode)?;
        for &(a, k) in &o.terms {
            r.push(a, k, mode)?;
        }
        Some(r)
    }

    /// `k · self`, wrapping.
    pub fn wrapping_scaled(&self, k: i64) -> Affine {
        self.scaled(k, Mode::Address).unwrap_or_else(|| unreachable_wrapping(self))
    }

    /// `self + o`, wrapping.
    pub fn wrapping_plus(&self, o: &Affine) -> Affine {
        self.plus(o, Mode::Address).unwrap_or_else(|| unreachable_wrapping(self))
    }

    /// The dense form over `nvars` variables, when every term is a variable below
    /// `nvars`.
    pub fn index(&self, nvars: usize) -> Option<AffineIndex> {
        let mut coef = vec![0; nvars];
        for &(a, k) in &self.terms {
            let Atom::Var(v) = a else { return None };
            *coef.get_mut(v as usize)? = k;
        }
        Some(AffineIndex { c: self.c, coef })
    }
}

/// Wrapping arithmetic never fails; this keeps the signatures free of `unwrap`.
#[cold]
fn unreachable_wrapping(a: &Affine) -> Affine {
    a.clone()
}

/// `c + Σ coef[v]·v` over a kernel's variables (flat element offsets, i64): the exact
/// affine form of [`Mode::Exact`], one coefficient per variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AffineIndex {
    /// The constant term.
    pub c: i64,
    /// One coefficient per kernel variable.
    pub coef: Vec<i64>,
}

impl AffineIndex {
    pub(crate) fn constant(c: i64, nvars: usize) -> AffineIndex {
        AffineIndex { c, coef: vec![0; nvars] }
    }

    pub(crate) fn scaled(mut self, k: i64) -> Option<AffineIndex> {
        self.c = self.c.checked_mul(k)?;
        for c in &mut self.coef {
            *c = c.checked_mul(k)?;
        }
        Some(self)
    }

    pub(crate) fn plus(mut self, o: &AffineIndex) -> Option<AffineIndex> {
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

    /// The least and greatest values over `k`'s index space (`None` on overflow).
    pub fn range(&self, k: &Kernel) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (self.c, self.c);
        for (v, &coef) in self.coef.iter().enumerate() {
            let top = coef.checked_mul(i64::try_from(*k.vars.get(v)?).ok()?.checked_sub(1)?)?;
            lo = lo.checked_add(top.min(0))?;
            hi = hi.checked_add(top.max(0))?;
        }
        Some((lo, hi))
    }

    fn sparse(&self) -> Affine {
        let terms = self.coef.iter().enumerate().filter(|(_, &k)| k != 0).map(|(v, &k)| (Atom::Var(v as u32), k));
        Affine { c: self.c, terms: terms.collect() }
    }
}

/// The analysis of one kernel in one [`Mode`], memoised per node.
#[derive(Debug)]
pub struct AffineCx<'k> {
    k: &'k Kernel,
    mode: Mode,
    memo: HashMap<u32, Option<Affine>>,
}

impl<'k> AffineCx<'k> {
    /// An analysis of `k` in `mode`.
    pub fn new(k: &'k Kernel, mode: Mode) -> AffineCx<'k> {
        AffineCx { k, mode, memo: HashMap::new() }
    }

    /// The affine form of node `e`: in [`Mode::Address`] always one (a node that is not
    /// affine is its own atom); in [`Mode::Exact`], `None` unless `e` is an i64 node
    /// affine in the variables alone.
    pub fn of(&mut self, e: ExprId) -> Option<Affine> {
        if let Some(a) = self.memo.get(&e.0) {
            return a.clone();
        }
        let r = self.compute(e);
        let r = match (r, self.mode) {
            (None, Mode::Address) => Some(Affine::atom(Atom::Node(e.0))),
            (r, _) => r,
        };
        self.memo.insert(e.0, r.clone());
        r
    }

    /// [`AffineCx::of`] in [`Mode::Address`], where it always has a form.
    pub fn address(&mut self, e: ExprId) -> Affine {
        self.of(e).unwrap_or_else(|| Affine::atom(Atom::Node(e.0)))
    }

    /// The dense form of node `e` over the kernel's variables ([`Mode::Exact`] results).
    pub fn index(&mut self, e: ExprId) -> Option<AffineIndex> {
        self.of(e)?.index(self.k.vars.len())
    }

    /// The form of `e` from its operands' forms (`None`: opaque, or an overflow in
    /// [`Mode::Exact`]).
    fn compute(&mut self, e: ExprId) -> Option<Affine> {
        let (k, mode) = (self.k, self.mode);
        let node = k.nodes.get(e.index())?;
        if node.ty != ScalarType::I64 {
            return None;
        }
        match &node.expr {
            Expr::Var(v) => Some(Affine::atom(Atom::Var(v.0))),
            Expr::Const(bits) => Some(Affine::constant(*bits as i64)),
            Expr::Binary(BinaryOp::Add, a, b) => {
                let (a, b) = (self.of(*a)?, self.of(*b)?);
                a.plus(&b, mode)
            }
            Expr::Binary(BinaryOp::Sub, a, b) => {
                let (a, b) = (self.of(*a)?, self.of(*b)?);
                a.plus(&b.scaled(-1, mode)?, mode)
            }
            Expr::Binary(BinaryOp::Mul, a, b) => {
                let (a, b) = (self.of(*a)?, self.of(*b)?);
                if a.terms.is_empty() {
                    b.scaled(a.c, mode)
                } else if b.terms.is_empty() {
                    a.scaled(b.c, mode)
                } else {
                    None
                }
            }
            Expr::Unary(UnaryOp::Neg, a) => self.of(*a)?.scaled(-1, mode),
            Expr::Binary(op @ (BinaryOp::Rem | BinaryOp::Div), a, b) if mode == Mode::Exact => {
                // `x rem c` and `x div c` of a non-negative affine `x = hi + lo`, where every
                // term of `hi` is a multiple of `c` and `lo` stays in `0..c`: `lo` and
                // `hi / c` (a reshape's flat index taken apart again).
                let Expr::Const(c) = k.node(*b).expr else { return None };
                let c = c as i64;
                if c <= 0 {
                    return None;
                }
                let x = self.index(*a)?;
                let nv = k.vars.len();
                let mut low = AffineIndex::constant(x.c, nv);
                let mut high = AffineIndex::constant(0, nv);
                for (v, &coef) in x.coef.iter().enumerate() {
                    if coef % c == 0 {
                        high.coef[v] = coef / c;
                    } else {
                        low.coef[v] = coef;
                    }
                }
                let (min, _) = x.range(k)?;
                let (lmin, lmax) = low.range(k)?;
                if min < 0 || lmin < 0 || lmax >= c {
                    return None;
                }
                Some(if *op == BinaryOp::Rem { low } else { high }.sparse())
            }
            _ => None,
        }
    }
}

/// The exact affine form of i64 expression `e` ([`Mode::Exact`]), when it is one (no
/// overflow in the coefficients, no data-dependent or non-linear terms).
pub fn affine(k: &Kernel, e: ExprId) -> Option<AffineIndex> {
    AffineCx::new(k, Mode::Exact).index(e)
}

/// The flat element offset of an `InBounds` load (row-major), as an exact affine form.
pub fn load_offset(k: &Kernel, input: u32, index: &[ExprId]) -> Option<AffineIndex> {
    let ty = k.inputs.get(input as usize)?;
    let dims = ty.shape.dims();
    if dims.len() != index.len() {
        return None;
    }
    let mut cx = AffineCx::new(k, Mode::Exact);
    let mut stride = 1i64;
    let mut flat = AffineIndex::constant(0, k.vars.len());
    for (d, &e) in index.iter().enumerate().rev() {
        flat = flat.plus(&cx.index(e)?.scaled(stride)?)?;
        stride = stride.checked_mul(i64::try_from(dims[d]).ok()?)?;
    }
    Some(flat)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::Bounds;
    use crate::KernelBuilder;

    use crate::test_types::t;

    /// `x[(2·v0 − v1 + 3) div 4]`-like indices in both modes.
    #[test]
    fn both_modes_take_the_same_forms_apart() {
        let mut kb = KernelBuilder::new("k", vec![t(&[64])], t(&[4, 8]));
        let o = kb.out_index();
        let (c2, c3, c8) = (kb.index(2), kb.index(3), kb.index(8));
        let a = kb.mul(o[0], c8);
        let b = kb.add(a, o[1]);
        let d = kb.mul(c2, b);
        let s = kb.sub(d, o[1]);
        let s = kb.add(s, c3);
        let q = kb.binary(BinaryOp::Div, b, c8);
        let x = kb.load(0, vec![b]);
        // Every node live, so that `finish` renumbers none.
        let xs = kb.load_with(0, vec![s], Bounds::Clamp);
        let xq = kb.load_with(0, vec![q], Bounds::Clamp);
        let y = kb.add(x, xs);
        let y = kb.add(y, xq);
        let k = kb.finish(y).unwrap();
        // 2·(8·v0 + v1) − v1 + 3 = 16·v0 + v1 + 3.
        let want = AffineIndex { c: 3, coef: vec![16, 1] };
        assert_eq!(affine(&k, s), Some(want.clone()));
        let mut cx = AffineCx::new(&k, Mode::Address);
        assert_eq!(cx.address(s), Affine { c: 3, terms: vec![(Atom::Var(0), 16), (Atom::Var(1), 1)] });
        // (8·v0 + v1) div 8 = v0 exactly (v1 < 8); an opaque node for addresses.
        assert_eq!(affine(&k, q), Some(AffineIndex { c: 0, coef: vec![1, 0] }));
        assert_eq!(cx.address(q), Affine::atom(Atom::Node(q.0)));
        // A loaded value is not an index in either mode.
        assert_eq!(affine(&k, x), None);
        assert_eq!(cx.address(x), Affine::atom(Atom::Node(x.0)));
    }

    #[test]
    fn exact_mode_refuses_overflow_address_mode_wraps() {
        let mut kb = KernelBuilder::new("k", vec![t(&[4])], t(&[4]));
        let o = kb.out_index();
        let big = kb.index(i64::MAX);
        let m = kb.mul(o[0], big);
        let two = kb.index(2);
        let m2 = kb.mul(m, two);
        let x = kb.load_with(0, vec![m], Bounds::Clamp);
        let x2 = kb.load_with(0, vec![m2], Bounds::Clamp);
        let y = kb.add(x, x2);
        let k = kb.finish(y).unwrap();
        assert!(affine(&k, m).is_some());
        assert_eq!(affine(&k, m2), None);
        let mut cx = AffineCx::new(&k, Mode::Address);
        assert_eq!(cx.address(m2).terms, vec![(Atom::Var(0), i64::MAX.wrapping_mul(2))]);
    }
}
