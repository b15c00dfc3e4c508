//! Linear algebra: Gemm, MatMul (and its integer and quantized forms), Einsum, Det.

use super::ctx::{broadcast_dims, Class, Ctx, R};
use crate::attrs::{EinsumAttrs, GemmAttrs};
use crate::dtype::DType;
use crate::shape::TensorType;
use std::collections::BTreeMap;

/// Gemm(A, B, C?): op(A)·op(B) with `transA`/`transB`; C broadcasts to [M, N].
pub(super) fn gemm(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let a = cx.req_class(0, "A", Class::Numeric)?;
    let b = cx.req_same(1, "B", a)?;
    cx.rank(a, 0, "A", 2)?;
    cx.rank(b, 1, "B", 2)?;
    let ga = cx.attrs::<GemmAttrs>()?;
    let (ta, tb) = (ga.trans_a, ga.trans_b);
    let (ad, bd) = (a.shape.dims(), b.shape.dims());
    let (m, ka) = if ta { (ad[1], ad[0]) } else { (ad[0], ad[1]) };
    let (kb, n) = if tb { (bd[1], bd[0]) } else { (bd[0], bd[1]) };
    if ka != kb {
        return Err(cx.invalid(format_args!(
            "inner dimensions differ: {a}{} x {b}{}",
            if ta { "ᵀ" } else { "" },
            if tb { "ᵀ" } else { "" }
        )));
    }
    if let Some(c) = cx.opt_ty(2) {
        cx.same_dtype(c, 2, "C", a)?;
        if broadcast_dims(&[m, n], c.shape.dims()).as_deref() != Some(&[m, n][..]) {
            return Err(cx.invalid(format_args!("`C` (input 2) {c} does not broadcast to [{m},{n}]")));
        }
    }
    Ok(vec![cx.tt(a.dtype, vec![m, n])?])
}

/// Numpy matmul shape: 1-D operands are promoted (and the added axis removed),
/// batch dimensions broadcast.
fn matmul_dims(cx: &Ctx, a: &TensorType, b: &TensorType) -> R<Vec<usize>> {
    let (ad, bd) = (a.shape.dims(), b.shape.dims());
    if ad.is_empty() || bd.is_empty() {
        return Err(cx.invalid(format_args!("operands must have rank ≥ 1: {a} x {b}")));
    }
    let a2: Vec<usize> = if ad.len() == 1 { vec![1, ad[0]] } else { ad.to_vec() };
    let b2: Vec<usize> = if bd.len() == 1 { vec![bd[0], 1] } else { bd.to_vec() };
    let (ra, rb) = (a2.len(), b2.len());
    let (m, ka, kb, n) = (a2[ra - 2], a2[ra - 1], b2[rb - 2], b2[rb - 1]);
    if ka != kb {
        return Err(cx.invalid(format_args!("inner dimensions differ: {a} x {b}")));
    }
    let mut out = broadcast_dims(&a2[..ra - 2], &b2[..rb - 2])
        .ok_or_else(|| cx.invalid(format_args!("cannot broadcast the batch dimensions of {a} and {b}")))?;
    if ad.len() > 1 {
        out.push(m);
    }
    if bd.len() > 1 {
        out.push(n);
    }
    Ok(out)
}

/// MatMul(A, B).
pub(super) fn matmul(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let a = cx.req_class(0, "A", Class::Numeric)?;
    let b = cx.req_same(1, "B", a)?;
    Ok(vec![cx.tt(a.dtype, matmul_dims(cx, a, b)?)?])
}

/// MatMulInteger(A, B, a_zero_point?, b_zero_point?) → i32.
pub(super) fn matmul_integer(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(4)?;
    let a = cx.req_class(0, "A", Class::Quant8)?;
    let b = cx.req_class(1, "B", Class::Quant8)?;
    for (i, what, of) in [(2, "a_zero_point", a), (3, "b_zero_point", b)] {
        if let Some(z) = cx.opt_ty(i) {
            cx.same_dtype(z, i, what, of)?;
        }
    }
    Ok(vec![cx.tt(DType::I32, matmul_dims(cx, a, b)?)?])
}

/// QLinearMatMul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
/// y_zero_point) → y_zero_point's dtype.
pub(super) fn qlinear_matmul(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(8)?;
    let a = cx.req(0, "a")?;
    let b = cx.req(3, "b")?;
    let quant = |t: &TensorType| t.dtype.is_int() || t.dtype.is_low_precision_float();
    for (i, what, t) in [(0, "a", a), (3, "b", b)] {
        if !quant(t) {
            return Err(cx.invalid(format_args!("`{what}` (input {i}) must be a quantized (8-bit) tensor, got {t}")));
        }
    }
    for (i, what) in [(1, "a_scale"), (4, "b_scale"), (6, "y_scale")] {
        cx.req_class(i, what, Class::Float)?;
    }
    cx.same_dtype(cx.req(2, "a_zero_point")?, 2, "a_zero_point", a)?;
    cx.same_dtype(cx.req(5, "b_zero_point")?, 5, "b_zero_point", b)?;
    let yz = cx.req(7, "y_zero_point")?;
    if !quant(yz) {
        return Err(cx.invalid(format_args!("`y_zero_point` (input 7) must be a quantized (8-bit) tensor, got {yz}")));
    }
    Ok(vec![cx.tt(yz.dtype, matmul_dims(cx, a, b)?)?])
}

/// Det(X): [*, M, M] → [*].
pub(super) fn det(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    cx.min_rank(x, 0, "X", 2)?;
    let d = x.shape.dims();
    let r = d.len();
    if d[r - 1] != d[r - 2] {
        return Err(cx.invalid(format_args!("the matrices of {x} are not square")));
    }
    Ok(vec![cx.tt(x.dtype, d[..r - 2].to_vec())?])
}

/// One subscript of an Einsum term.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sub {
    Label(u8),
    Ellipsis,
}

/// Parses one term (`ij`, `...ij`, `i...j`); at most one ellipsis.
fn parse_term(cx: &Ctx, term: &str) -> R<Vec<Sub>> {
    let b = term.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c if c.is_ascii_alphabetic() => {
                out.push(Sub::Label(c));
                i += 1;
            }
            b'.' if b.get(i..i + 3) == Some(b"...") => {
                if out.contains(&Sub::Ellipsis) {
                    return Err(cx.invalid(format_args!("term \"{term}\" has more than one ellipsis")));
                }
                out.push(Sub::Ellipsis);
                i += 3;
            }
            _ => {
                return Err(cx.invalid(format_args!(
                    "term \"{term}\" holds a character that is neither a letter nor part of \"...\""
                )))
            }
        }
    }
    Ok(out)
}

/// Einsum(Inputs…) with `equation`: explicit (`->`) or implicit output; ellipses
/// broadcast; a label's extents must agree (1 broadcasts).
pub(super) fn einsum(cx: &Ctx) -> R<Vec<TensorType>> {
    let eq: String = cx.attrs::<EinsumAttrs>()?.equation.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<&str> = lhs.split(',').collect();
    if terms.len() != cx.num_inputs() {
        return Err(cx.invalid(format_args!(
            "equation \"{eq}\" has {} input terms, but the node has {} operands",
            terms.len(),
            cx.num_inputs()
        )));
    }
    let first = cx.req_class(0, "Inputs", Class::Numeric)?;
    let mut labels: BTreeMap<u8, usize> = BTreeMap::new();
    let mut counts: BTreeMap<u8, usize> = BTreeMap::new();
    let mut ell: Option<Vec<usize>> = None;
    for (i, term) in terms.iter().enumerate() {
        let t = cx.req(i, "Inputs")?;
        cx.same_dtype(t, i, "Inputs", first)?;
        let subs = parse_term(cx, term)?;
        let d = t.shape.dims();
        let nlab = subs.iter().filter(|s| matches!(s, Sub::Label(_))).count();
        let has_ell = subs.contains(&Sub::Ellipsis);
        if (has_ell && d.len() < nlab) || (!has_ell && d.len() != nlab) {
            return Err(cx.invalid(format_args!("term \"{term}\" does not match the rank of operand {i} {t}")));
        }
        let ell_rank = d.len() - nlab;
        let mut pos = 0;
        for s in subs {
            match s {
                Sub::Label(c) => {
                    let e = d[pos];
                    pos += 1;
                    *counts.entry(c).or_insert(0) += 1;
                    let slot = labels.entry(c).or_insert(e);
                    if *slot != e {
                        if *slot == 1 {
                            *slot = e;
                        } else if e != 1 {
                            return Err(cx.invalid(format_args!("label '{}' has extents {} and {e}", c as char, *slot)));
                        }
                    }
                }
                Sub::Ellipsis => {
                    let part = &d[pos..pos + ell_rank];
                    pos += ell_rank;
                    let acc = ell.take().unwrap_or_default();
                    ell = Some(broadcast_dims(&acc, part).ok_or_else(|| {
                        cx.invalid(format_args!(
                            "the ellipsis dimensions of operand {i} {t} do not broadcast with the others"
                        ))
                    })?);
                }
            }
        }
    }
    let mut out = Vec::new();
    match rhs {
        Some(rhs) => {
            let subs = parse_term(cx, rhs)?;
            let mut seen = Vec::new();
            for s in subs {
                match s {
                    Sub::Label(c) => {
                        if seen.contains(&c) {
                            return Err(cx.invalid(format_args!("output label '{}' appears more than once", c as char)));
                        }
                        seen.push(c);
                        let e = labels.get(&c).ok_or_else(|| {
                            cx.invalid(format_args!("output label '{}' does not appear in any input term", c as char))
                        })?;
                        out.push(*e);
                    }
                    Sub::Ellipsis => out.extend(ell.iter().flatten().copied()),
                }
            }
        }
        None => {
            // Implicit output: the broadcast ellipsis dimensions, then the labels that
            // appear exactly once, in alphabetical (ASCII) order.
            out.extend(ell.iter().flatten().copied());
            for (c, e) in &labels {
                if counts.get(c) == Some(&1) {
                    out.push(*e);
                }
            }
        }
    }
    Ok(vec![cx.tt(first.dtype, out)?])
}
