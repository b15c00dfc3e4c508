//! Shape and data movement, generators and indexing: Reshape, Flatten, Squeeze,
//! Unsqueeze, Shape, Size, Expand, Tile, Transpose, Slice, Pad, Concat, Split,
//! DepthToSpace, SpaceToDepth, ReverseSequence, Trilu ([`layout`]); Gather,
//! GatherElements, GatherND, ScatterElements, ScatterND, OneHot ([`index`]);
//! Range, ConstantOfShape, EyeLike ([`generate`]); Resize ([`resize`]).
//!
//! Ops that only move elements work on the raw element bytes, so they are
//! bit-exact for every dtype (NaN payloads included). Elements are read as
//! fixed-width records ([`Elems`]): the storage bytes for byte-sized dtypes, one
//! code byte per element for the packed 4-bit dtypes (repacked on output).
//! Most of them reduce to one primitive, [`gather_axes`]: every output axis has a
//! table of source offsets (or an affine rule), and an output element reads the
//! sum of its axes' offsets.

mod generate;
mod index;
mod layout;
mod resize;
mod sample;

use crate::util::Cx;
use crate::EvalError;
use kiln_ir::{DType, OpKind, Tensor, TensorType};
use std::borrow::Cow;

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    use OpKind::*;
    let t = match cx.kind() {
        Reshape => layout::reshape(cx)?,
        Flatten => layout::flatten(cx)?,
        Squeeze => layout::squeeze(cx)?,
        Unsqueeze => layout::unsqueeze(cx)?,
        Shape => layout::shape(cx)?,
        Size => layout::size(cx)?,
        Expand => layout::expand(cx)?,
        Tile => layout::tile(cx)?,
        Transpose => layout::transpose(cx)?,
        Slice => layout::slice(cx)?,
        Pad => layout::pad(cx)?,
        Concat => layout::concat(cx)?,
        Split => return layout::split(cx),
        DepthToSpace => layout::depth_to_space(cx)?,
        SpaceToDepth => layout::space_to_depth(cx)?,
        ReverseSequence => layout::reverse_sequence(cx)?,
        Trilu => layout::trilu(cx)?,
        Gather => index::gather(cx)?,
        GatherElements => index::gather_elements(cx)?,
        GatherND => index::gather_nd(cx)?,
        ScatterElements => index::scatter_elements(cx)?,
        ScatterND => index::scatter_nd(cx)?,
        OneHot => index::one_hot(cx)?,
        Range => generate::range(cx)?,
        ConstantOfShape => generate::constant_of_shape(cx)?,
        EyeLike => generate::eye_like(cx)?,
        Resize if cx.out_types.len() == 2 => return resize::resize_checked(cx),
        Resize => resize::resize(cx)?,
        GridSample => sample::grid_sample(cx)?,
        Col2Im => sample::col2im(cx)?,
        RoiAlign => sample::roi_align(cx)?,
        DeformConv => sample::deform_conv(cx)?,
        _ => return Err(cx.unsupported("not a data movement operator")),
    };
    if matches!(cx.kind(), OneHot | Range) && cx.out_types.len() == 2 {
        // The shape-checked form (kiln_ir::dynamic): the op already refused operands
        // that give other dims than its result type's, so the check holds 0.
        let check = Tensor::from_vec(kiln_ir::Shape::scalar(), vec![0i64]).map_err(|e| cx.invalid(e.to_string()))?;
        return Ok(vec![t, check]);
    }
    Ok(vec![t])
}

// ---------------------------------------------------------------------------
// Elements as byte records.
// ---------------------------------------------------------------------------

/// Bytes per element record of dtype `d` (1 for the packed 4-bit dtypes, whose
/// records are codes).
pub(super) fn width(d: DType) -> usize {
    if d.is_packed() {
        1
    } else {
        d.bits() / 8
    }
}

/// A tensor's elements as records of `w` bytes each.
pub(super) struct Elems<'a> {
    /// Bytes per element.
    pub w: usize,
    /// `numel * w` bytes.
    pub data: Cow<'a, [u8]>,
}

impl Elems<'_> {
    /// The record of element `i`, if it exists.
    pub fn get(&self, i: usize) -> Option<&[u8]> {
        self.data.get(i.checked_mul(self.w)?..(i + 1).checked_mul(self.w)?)
    }
}

/// The elements of `t` (borrowed storage, or unpacked codes for 4-bit dtypes).
pub(super) fn elems(t: &Tensor) -> Elems<'_> {
    if t.dtype().is_packed() {
        Elems { w: 1, data: Cow::Owned(t.codes()) }
    } else {
        Elems { w: width(t.dtype()), data: Cow::Borrowed(&t.bytes()[..]) }
    }
}

/// A tensor of type `ty` from element records (codes for the packed dtypes).
pub(super) fn build(cx: &Cx, ty: &TensorType, data: Vec<u8>) -> Result<Tensor, EvalError> {
    let r = if ty.dtype.is_packed() {
        Tensor::from_codes(ty.dtype, ty.shape.clone(), &data)
    } else {
        Tensor::new(ty.clone(), data.into())
    };
    r.map_err(|e| cx.invalid(e.to_string()))
}

/// The record of the first element of `t`, or a zero record when `t` is absent.
pub(super) fn first_elem_or_zero(cx: &Cx, t: Option<&Tensor>, d: DType) -> Result<Vec<u8>, EvalError> {
    match t {
        Some(v) if v.numel() > 0 => {
            if v.dtype() != d {
                return Err(cx.invalid(format!("value has dtype {}, expected {d}", v.dtype())));
            }
            let e = elems(v);
            Ok(e.get(0).map(<[u8]>::to_vec).unwrap_or_else(|| vec![0; e.w]))
        }
        _ => Ok(vec![0; width(d)]),
    }
}

pub(super) use crate::util::out_checked;

/// Converts a count from the operands into `usize`, or an error.
pub(super) fn to_usize(cx: &Cx, v: i64, what: &str) -> Result<usize, EvalError> {
    usize::try_from(v).map_err(|_| cx.invalid(format!("{what} {v} is negative")))
}

/// An index in `-n..n` normalised into `0..n`.
pub(super) fn norm_index(cx: &Cx, i: i64, n: usize) -> Result<usize, EvalError> {
    let n = n as i64;
    let j = if i < 0 { i + n } else { i };
    if (0..n).contains(&j) {
        Ok(j as usize)
    } else {
        Err(cx.invalid(format!("index {i} out of range for a dimension of {n}")))
    }
}

/// Axes normalised against `rank`, with repeats rejected.
pub(super) fn unique_axes(cx: &Cx, axes: &[i64], rank: usize) -> Result<Vec<usize>, EvalError> {
    let mut seen = vec![false; rank];
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = cx.axis(a, rank)?;
        if seen[n] {
            return Err(cx.invalid(format!("axis {a} is listed twice")));
        }
        seen[n] = true;
        out.push(n);
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// The gather primitive.
// ---------------------------------------------------------------------------

/// An entry of an [`Ax::Map`] table meaning "no source element: use the fill value".
pub(super) const FILL: usize = usize::MAX;

/// How one output axis maps to source element offsets.
#[derive(Clone, Debug)]
pub(super) enum Ax {
    /// Output index `i` reads offset `start + i * stride`.
    Lin {
        /// Offset of index 0.
        start: usize,
        /// Offset step per index (0 repeats, negative walks backwards).
        stride: isize,
        /// Extent of the output axis.
        len: usize,
    },
    /// Output index `i` reads offset `table[i]` ([`FILL`]: the fill value).
    Map(Vec<usize>),
}

impl Ax {
    /// An axis reading `len` elements `stride` apart from 0.
    pub fn lin(stride: usize, len: usize) -> Ax {
        Ax::Lin { start: 0, stride: stride as isize, len }
    }

    fn len(&self) -> usize {
        match self {
            Ax::Lin { len, .. } => *len,
            Ax::Map(t) => t.len(),
        }
    }
}

/// The elements `out[i_0, …, i_k] = src[Σ_d offset_d(i_d)]` (in records of `w`
/// bytes), or `fill` where some axis maps to [`FILL`]. The output has the extents
/// of the axes, row-major. An offset outside `src` is an error (a caller bug or
/// bad operand), never a panic.
pub(super) fn gather_axes(src: &[u8], w: usize, axes: Vec<Ax>, fill: &[u8]) -> Result<Vec<u8>, String> {
    let n = axes.iter().try_fold(1usize, |n, a| n.checked_mul(a.len()));
    let n = n.ok_or("too many elements")?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let bytes = n.checked_mul(w).ok_or("too many elements")?;
    // The fill value is only needed (and checked) where a FILL occurs.
    let fill_elem = || -> Result<&[u8], String> {
        if fill.len() != w {
            return Err("fill value of the wrong width".into());
        }
        Ok(fill)
    };
    // Simplify: fold extent-1 axes into the base offset, merge adjacent affine axes.
    let mut base: isize = 0;
    let mut ax: Vec<Ax> = Vec::with_capacity(axes.len());
    for a in axes {
        let a = match a {
            Ax::Lin { start, stride, len } => {
                base += start as isize;
                Ax::Lin { start: 0, stride, len }
            }
            m => m,
        };
        if a.len() == 1 {
            match a {
                Ax::Lin { .. } => {}
                Ax::Map(t) => {
                    if t[0] == FILL {
                        return Ok(fill_elem()?.repeat(n));
                    }
                    base += t[0] as isize;
                }
            }
            continue;
        }
        if let (Some(Ax::Lin { stride: s1, len: l1, .. }), Ax::Lin { stride: s2, len: l2, .. }) = (ax.last_mut(), &a) {
            if *s1 == s2 * *l2 as isize {
                *s1 = *s2;
                *l1 *= *l2;
                continue;
            }
        }
        ax.push(a);
    }
    let mut out: Vec<u8> = Vec::with_capacity(bytes);
    let elem = |o: isize| -> Result<&[u8], String> {
        usize::try_from(o)
            .ok()
            .and_then(|o| src.get(o.checked_mul(w)?..o.checked_mul(w)?.checked_add(w)?))
            .ok_or_else(|| format!("source element {o} out of range"))
    };
    let Some(last) = ax.pop() else {
        out.extend_from_slice(elem(base)?);
        return Ok(out);
    };
    let rows = n / last.len();
    let mut idx = vec![0usize; ax.len()];
    for _ in 0..rows {
        // The row's base offset, or None for a filled row.
        let mut rb = Some(base);
        for (a, &i) in ax.iter().zip(&idx) {
            match a {
                Ax::Lin { stride, .. } => rb = rb.map(|b| b + i as isize * stride),
                Ax::Map(t) => {
                    if t[i] == FILL {
                        rb = None;
                    } else {
                        rb = rb.map(|b| b + t[i] as isize);
                    }
                }
            }
        }
        match (rb, &last) {
            (None, l) => {
                let f = fill_elem()?;
                for _ in 0..l.len() {
                    out.extend_from_slice(f);
                }
            }
            (Some(b), Ax::Lin { stride: 1, len, .. }) => {
                let s = usize::try_from(b).map_err(|_| "negative offset".to_string())?;
                let run = s
                    .checked_mul(w)
                    .zip(s.checked_add(*len).and_then(|e| e.checked_mul(w)))
                    .and_then(|(a, b)| src.get(a..b))
                    .ok_or_else(|| format!("source run at {s} out of range"))?;
                out.extend_from_slice(run);
            }
            (Some(b), Ax::Lin { stride, len, .. }) => {
                for i in 0..*len {
                    out.extend_from_slice(elem(b + i as isize * stride)?);
                }
            }
            (Some(b), Ax::Map(t)) => {
                for &o in t {
                    if o == FILL {
                        out.extend_from_slice(fill_elem()?);
                    } else {
                        out.extend_from_slice(elem(b + o as isize)?);
                    }
                }
            }
        }
        // Next row (last outer axis fastest).
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < ax[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
    Ok(out)
}

/// [`gather_axes`] from tensor `t` into a tensor of type `ty`.
pub(super) fn gather_tensor(
    cx: &Cx,
    t: &Tensor,
    ty: &TensorType,
    axes: Vec<Ax>,
    fill: &[u8],
) -> Result<Tensor, EvalError> {
    let e = elems(t);
    let data = gather_axes(&e.data, e.w, axes, fill).map_err(|m| cx.invalid(m))?;
    build(cx, ty, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(src: &[u8], axes: Vec<Ax>) -> Vec<u8> {
        gather_axes(src, 1, axes, &[99]).unwrap()
    }

    #[test]
    fn gather_primitive() {
        let src: Vec<u8> = (0..6).collect();
        // Identity of a 2x3 (merges into one run).
        assert_eq!(g(&src, vec![Ax::lin(3, 2), Ax::lin(1, 3)]), src);
        // Transpose to 3x2.
        assert_eq!(g(&src, vec![Ax::lin(1, 3), Ax::lin(3, 2)]), vec![0, 3, 1, 4, 2, 5]);
        // Broadcast a row.
        assert_eq!(g(&src, vec![Ax::lin(0, 2), Ax::lin(1, 2)]), vec![0, 1, 0, 1]);
        // Reverse with a negative stride.
        assert_eq!(g(&src, vec![Ax::Lin { start: 5, stride: -2, len: 3 }]), vec![5, 3, 1]);
        // A map with fill.
        assert_eq!(g(&src, vec![Ax::lin(3, 2), Ax::Map(vec![FILL, 2, 0])]), vec![99, 2, 0, 99, 5, 3]);
        assert_eq!(g(&src, vec![Ax::Map(vec![FILL]), Ax::lin(1, 2)]), vec![99, 99]);
        // Out of range is an error, not a panic.
        assert!(gather_axes(&src, 1, vec![Ax::lin(4, 3)], &[0]).is_err());
        assert!(gather_axes(&src, 1, vec![Ax::Lin { start: 0, stride: -1, len: 2 }], &[0]).is_err());
        // Empty.
        assert_eq!(g(&src, vec![Ax::lin(1, 0), Ax::lin(1, 3)]), Vec::<u8>::new());
        // Scalar.
        assert_eq!(g(&src, vec![]), vec![0]);
    }
}
