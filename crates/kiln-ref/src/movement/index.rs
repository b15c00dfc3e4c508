//! Indexing: Gather, GatherElements, GatherND, ScatterElements, ScatterND, OneHot.
//!
//! Indices may be negative (counting from the end); an index out of range is an
//! `Invalid` error. Scatter with `reduction=none` copies element bytes (with a
//! repeated index the last update wins); add/mul/max/min combine one update at a
//! time in the data's dtype, rounding after each step as sequential code in that
//! dtype would: floats through `f64` (max/min propagate NaN), integers wrapping
//! (unsigned compared as unsigned), bool as 0/1 (add = or, mul = and).
//! OneHot: float indices and depth are truncated toward zero; an index outside
//! `-depth..depth` gives a row of off values.

use super::{build, elems, norm_index, out_checked, to_usize, width, Elems};
use crate::elementwise::{icmp, read_f64};
use crate::util::{row_major_strides, Cx};
use crate::EvalError;
use half::{bf16, f16};
use kiln_ir::attrs::{
    GatherAttrs, GatherNdAttrs, OneHotAttrs, ScatterElementsAttrs, ScatterNdAttrs, ScatterReduction as Reduction,
};
use kiln_ir::lowp::{f64_to_f32_odd, round_binary, BF16_MAX};
use kiln_ir::{lowp, DType, OpKind, Tensor};

/// Integer contents of an index operand (`int32`/`int64`).
fn indices(cx: &Cx, i: usize) -> Result<Vec<i64>, EvalError> {
    let t = cx.input(i)?;
    if !matches!(t.dtype(), DType::I32 | DType::I64) {
        return Err(cx.invalid(format!("indices have dtype {}, expected i32 or i64", t.dtype())));
    }
    cx.ints(i)
}

/// The operands of an op that indexes its data along one axis (Gather,
/// GatherElements, ScatterElements).
struct AlongAxis<'a> {
    /// The data (input 0).
    x: &'a Tensor,
    /// The axis, checked against the data's rank.
    a: usize,
    /// The indices (input 1).
    idx: Vec<i64>,
    /// The indices' dims.
    id: &'a [usize],
}

/// Reads the [`AlongAxis`] operands, `axis` the op's attribute.
fn along_axis<'a>(cx: &Cx<'a>, axis: i64) -> Result<AlongAxis<'a>, EvalError> {
    let x = cx.input(0)?;
    let a = cx.axis(axis, x.shape().rank())?;
    let idx = indices(cx, 1)?;
    let id = cx.input(1)?.shape().dims();
    Ok(AlongAxis { x, a, idx, id })
}

fn copy_elem(cx: &Cx, src: &Elems, i: usize, out: &mut Vec<u8>) -> Result<(), EvalError> {
    out.extend_from_slice(src.get(i).ok_or_else(|| cx.invalid("element out of range"))?);
    Ok(())
}

pub(super) fn gather(cx: &Cx) -> Result<Tensor, EvalError> {
    let AlongAxis { x, a, idx, id } = along_axis(cx, cx.attrs::<GatherAttrs>()?.axis)?;
    let xd = x.shape().dims();
    let out: Vec<usize> = xd[..a].iter().chain(id).chain(&xd[a + 1..]).copied().collect();
    let ty = out_checked(cx, 0, x.dtype(), &out)?;
    let n = xd[a];
    let idx: Vec<usize> = idx.iter().map(|&i| norm_index(cx, i, n)).collect::<Result<_, _>>()?;
    let outer: usize = xd[..a].iter().product();
    let inner: usize = xd[a + 1..].iter().product();
    let e = elems(x);
    let blk = inner * e.w;
    let mut data = Vec::with_capacity(ty.shape.numel() * e.w);
    for o in 0..outer {
        for &k in &idx {
            let s = (o * n + k) * blk;
            data.extend_from_slice(e.data.get(s..s + blk).ok_or_else(|| cx.invalid("short input"))?);
        }
    }
    build(cx, ty, data)
}

/// Visits every multi-index of `dims` in row-major order.
fn for_each_index(dims: &[usize], mut f: impl FnMut(&[usize]) -> Result<(), EvalError>) -> Result<(), EvalError> {
    if dims.contains(&0) {
        return Ok(());
    }
    let mut idx = vec![0usize; dims.len()];
    loop {
        f(&idx)?;
        let mut d = dims.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Checks the shapes of GatherElements/ScatterElements: `idx` of the data's rank,
/// no larger than the data on the other axes.
fn check_elements_shapes(cx: &Cx, xd: &[usize], id: &[usize], a: usize) -> Result<(), EvalError> {
    if id.len() != xd.len() || id.iter().zip(xd).enumerate().any(|(i, (&m, &n))| i != a && m > n) {
        return Err(cx.invalid(format!("indices of shape {id:?} do not fit data of shape {xd:?}")));
    }
    Ok(())
}

/// The flat offset (row-major strides `st`) of index `p` with its coordinate on axis `a`
/// replaced by `k`: where GatherElements reads and ScatterElements writes.
fn offset_along(p: &[usize], st: &[usize], a: usize, k: usize) -> usize {
    p.iter().zip(st).enumerate().map(|(d, (&i, &s))| if d == a { k * s } else { i * s }).sum()
}

pub(super) fn gather_elements(cx: &Cx) -> Result<Tensor, EvalError> {
    let AlongAxis { x, a, idx, id } = along_axis(cx, cx.attrs::<GatherAttrs>()?.axis)?;
    let xd = x.shape().dims();
    check_elements_shapes(cx, xd, id, a)?;
    let ty = out_checked(cx, 0, x.dtype(), id)?;
    let st = row_major_strides(xd);
    let e = elems(x);
    let mut data = Vec::with_capacity(idx.len() * e.w);
    let mut flat = 0usize;
    for_each_index(id, |p| {
        let k = norm_index(cx, idx[flat], xd[a])?;
        flat += 1;
        let src = offset_along(p, &st, a, k);
        copy_elem(cx, &e, src, &mut data)
    })?;
    build(cx, ty, data)
}

/// GatherND/ScatterND geometry: for data dims `xd`, index dims `id` and
/// `batch_dims` b, returns (batches, tuples per batch, tuple length m, slice size).
fn nd_geometry(cx: &Cx, xd: &[usize], id: &[usize], b: usize) -> Result<(usize, usize, usize, usize), EvalError> {
    let q = id.len();
    if q == 0 || b >= q || b > xd.len() || xd[..b] != id[..b] {
        return Err(cx.invalid(format!("indices of shape {id:?} do not fit data of shape {xd:?}")));
    }
    let m = id[q - 1];
    if b + m > xd.len() {
        return Err(cx.invalid(format!("index tuples of {m} exceed data rank {}", xd.len())));
    }
    let batches = xd[..b].iter().product();
    let tuples = id[b..q - 1].iter().product();
    let slice = xd[b + m..].iter().product();
    Ok((batches, tuples, m, slice))
}

/// Row-major position of the index tuple `tuple` within `dims` (entries may be negative).
fn nd_offset(cx: &Cx, tuple: &[i64], dims: &[usize]) -> Result<usize, EvalError> {
    let mut off = 0usize;
    for (&i, &n) in tuple.iter().zip(dims) {
        off = off * n + norm_index(cx, i, n)?;
    }
    Ok(off)
}

pub(super) fn gather_nd(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let idx = indices(cx, 1)?;
    let id = cx.input(1)?.shape().dims();
    let b = to_usize(cx, cx.attrs::<GatherNdAttrs>()?.batch_dims, "batch_dims")?;
    let (batches, tuples, m, slice) = nd_geometry(cx, xd, id, b)?;
    let out: Vec<usize> = id[..id.len() - 1].iter().chain(&xd[b + m..]).copied().collect();
    let ty = out_checked(cx, 0, x.dtype(), &out)?;
    let e = elems(x);
    let batch_len: usize = xd[b..].iter().product();
    let blk = slice * e.w;
    let mut data = Vec::with_capacity(ty.shape.numel() * e.w);
    for bi in 0..batches {
        for t in 0..tuples {
            let tuple = &idx[(bi * tuples + t) * m..(bi * tuples + t + 1) * m];
            let off = bi * batch_len + nd_offset(cx, tuple, &xd[b..b + m])? * slice;
            let s = off * e.w;
            data.extend_from_slice(e.data.get(s..s + blk).ok_or_else(|| cx.invalid("short input"))?);
        }
    }
    build(cx, ty, data)
}

// ---------------------------------------------------------------------------
// Scatter.
// ---------------------------------------------------------------------------

fn reduction(cx: &Cx) -> Result<Reduction, EvalError> {
    Ok(match cx.kind() {
        OpKind::ScatterElements => cx.attrs::<ScatterElementsAttrs>()?.reduction,
        _ => cx.attrs::<ScatterNdAttrs>()?.reduction,
    })
}

/// One element value: floats as `f64`, integers and bool as `i64` (bits of `u64`).
#[derive(Clone, Copy)]
enum Num {
    F(f64),
    I(i64),
}

/// Decodes one element record of dtype `d` (codes for 8-bit-and-smaller types).
fn decode(d: DType, b: &[u8]) -> Num {
    let mut a = [0u8; 8];
    a[..b.len().min(8)].copy_from_slice(&b[..b.len().min(8)]);
    let u = u64::from_le_bytes(a);
    match d {
        DType::F32 => Num::F(f32::from_bits(u as u32) as f64),
        DType::F64 => Num::F(f64::from_bits(u)),
        DType::F16 => Num::F(f16::from_bits(u as u16).to_f64()),
        DType::BF16 => Num::F(bf16::from_bits(u as u16).to_f64()),
        DType::I8 => Num::I(u as u8 as i8 as i64),
        DType::I16 => Num::I(u as u16 as i16 as i64),
        DType::I32 => Num::I(u as u32 as i32 as i64),
        DType::I64 | DType::U64 | DType::U8 | DType::U16 | DType::U32 | DType::U4 => Num::I(u as i64),
        DType::Bool => Num::I((u != 0) as i64),
        DType::I4 => Num::I((((u as u8) << 4) as i8 >> 4) as i64),
        _ => Num::F(lowp::decode(d, u as u8) as f64),
    }
}

/// Encodes `v` into the record `out` of dtype `d` (rounding floats to nearest
/// even, wrapping integers).
fn encode(d: DType, v: Num, out: &mut [u8]) {
    let x = match v {
        Num::F(x) => x,
        Num::I(i) => i as f64,
    };
    let i = match v {
        Num::I(i) => i,
        Num::F(x) => x as i64,
    };
    let bits: u64 = match d {
        DType::F32 => (x as f32).to_bits() as u64,
        DType::F64 => x.to_bits(),
        DType::F16 => f16::from_f64(round_binary(x, 11, -14, 65504.0)).to_bits() as u64,
        DType::BF16 => bf16::from_f64(round_binary(x, 8, -126, BF16_MAX)).to_bits() as u64,
        DType::Bool => (i != 0) as u64,
        DType::I4 | DType::U4 => (i as u64) & 0xF,
        dt if dt.is_int() => i as u64,
        dt => lowp::encode(dt, f64_to_f32_odd(x), true) as u64,
    };
    let n = out.len().min(8);
    out[..n].copy_from_slice(&bits.to_le_bytes()[..n]);
}

/// Combines the record `dst` with the update record `upd` under `r` (not `None`).
fn combine(d: DType, r: Reduction, dst: &mut [u8], upd: &[u8]) {
    let uns = d.is_unsigned_int();
    let v = match (decode(d, dst), decode(d, upd)) {
        (Num::F(a), Num::F(b)) => Num::F(match r {
            Reduction::Add => a + b,
            Reduction::Mul => a * b,
            _ if a.is_nan() || b.is_nan() => f64::NAN,
            Reduction::Max => a.max(b),
            _ => a.min(b),
        }),
        (Num::I(a), Num::I(b)) => Num::I(match r {
            Reduction::Add => a.wrapping_add(b),
            Reduction::Mul => a.wrapping_mul(b),
            Reduction::Max => {
                if icmp(a, b, uns).is_ge() {
                    a
                } else {
                    b
                }
            }
            _ => {
                if icmp(a, b, uns).is_le() {
                    a
                } else {
                    b
                }
            }
        }),
        _ => return,
    };
    encode(d, v, dst);
}

/// Writes the update record `upd` over element `i` of `out` under `r`.
fn apply(cx: &Cx, d: DType, r: Reduction, out: &mut [u8], w: usize, i: usize, upd: &[u8]) -> Result<(), EvalError> {
    let dst = out.get_mut(i * w..(i + 1) * w).ok_or_else(|| cx.invalid("element out of range"))?;
    if r == Reduction::None {
        dst.copy_from_slice(upd);
    } else {
        combine(d, r, dst, upd);
    }
    Ok(())
}

pub(super) fn scatter_elements(cx: &Cx) -> Result<Tensor, EvalError> {
    let AlongAxis { x, a, idx, id } = along_axis(cx, cx.attrs::<ScatterElementsAttrs>()?.axis)?;
    let xd = x.shape().dims();
    let u = cx.input(2)?;
    if u.shape().dims() != id || u.dtype() != x.dtype() {
        return Err(cx.invalid(format!("updates {} do not match indices {id:?} / data {}", u.ty(), x.ty())));
    }
    check_elements_shapes(cx, xd, id, a)?;
    let r = reduction(cx)?;
    let ty = out_checked(cx, 0, x.dtype(), xd)?;
    let st = row_major_strides(xd);
    let e = elems(x);
    let ue = elems(u);
    let w = e.w;
    let mut data = e.data.into_owned();
    let mut flat = 0usize;
    for_each_index(id, |p| {
        let k = norm_index(cx, idx[flat], xd[a])?;
        let dst = offset_along(p, &st, a, k);
        let upd = ue.get(flat).ok_or_else(|| cx.invalid("short updates"))?;
        flat += 1;
        apply(cx, x.dtype(), r, &mut data, w, dst, upd)
    })?;
    build(cx, ty, data)
}

pub(super) fn scatter_nd(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let xd = x.shape().dims();
    let idx = indices(cx, 1)?;
    let id = cx.input(1)?.shape().dims();
    let u = cx.input(2)?;
    let (_, tuples, m, slice) = nd_geometry(cx, xd, id, 0)?;
    let want: Vec<usize> = id[..id.len() - 1].iter().chain(&xd[m..]).copied().collect();
    if u.shape().dims() != want || u.dtype() != x.dtype() {
        return Err(cx.invalid(format!("updates {} do not match {want:?} / data {}", u.ty(), x.ty())));
    }
    let r = reduction(cx)?;
    let ty = out_checked(cx, 0, x.dtype(), xd)?;
    let e = elems(x);
    let ue = elems(u);
    let w = e.w;
    let mut data = e.data.into_owned();
    for t in 0..tuples {
        let off = nd_offset(cx, &idx[t * m..(t + 1) * m], &xd[..m])? * slice;
        for k in 0..slice {
            let upd = ue.get(t * slice + k).ok_or_else(|| cx.invalid("short updates"))?;
            apply(cx, x.dtype(), r, &mut data, w, off + k, upd)?;
        }
    }
    build(cx, ty, data)
}

// ---------------------------------------------------------------------------
// OneHot.
// ---------------------------------------------------------------------------

/// Integer values of a numeric operand, floats truncated toward zero.
fn truncated_ints(cx: &Cx, i: usize) -> Result<Vec<i64>, EvalError> {
    let t = cx.input(i)?;
    if t.dtype().is_float() {
        Ok(read_f64(cx, t)?.into_iter().map(|x| if x.is_nan() { i64::MIN } else { x as i64 }).collect())
    } else {
        cx.ints(i)
    }
}

pub(super) fn one_hot(cx: &Cx) -> Result<Tensor, EvalError> {
    let ind = cx.input(0)?;
    let id = ind.shape().dims();
    let idx = truncated_ints(cx, 0)?;
    let depth = match truncated_ints(cx, 1)?.as_slice() {
        [d] if *d > 0 => *d,
        v => return Err(cx.invalid(format!("depth {v:?} is not one positive value"))),
    };
    let values = cx.input(2)?;
    if values.numel() != 2 {
        return Err(cx.invalid(format!("values has {} elements, expected 2", values.numel())));
    }
    let r = id.len();
    let axis = cx.attrs::<OneHotAttrs>()?.axis;
    let a = crate::util::norm_axis(axis, r + 1)
        .ok_or_else(|| cx.invalid(format!("axis {axis} out of range for rank {r}")))?;
    let dn = to_usize(cx, depth, "depth")?;
    let out: Vec<usize> = id[..a].iter().chain(&[dn]).chain(&id[a..]).copied().collect();
    let ty = out_checked(cx, 0, values.dtype(), &out)?;
    let ve = elems(values);
    let (off, on) = (ve.get(0).unwrap_or(&[]), ve.get(1).unwrap_or(&[]));
    let outer: usize = id[..a].iter().product();
    let inner: usize = id[a..].iter().product();
    let w = width(values.dtype());
    let mut data = Vec::with_capacity(ty.shape.numel().saturating_mul(w));
    for o in 0..outer {
        for k in 0..depth {
            for i in 0..inner {
                let v = idx[o * inner + i];
                let hit = (v >= -depth && v < depth) && (if v < 0 { v + depth } else { v }) == k;
                data.extend_from_slice(if hit { on } else { off });
            }
        }
    }
    build(cx, ty, data)
}
