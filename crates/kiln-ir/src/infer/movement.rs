//! Data movement and shape computations: Reshape, Expand, Tile, Slice, Pad,
//! Squeeze/Unsqueeze, Split, Concat, the Gathers and Scatters, Transpose, Flatten,
//! DepthToSpace/SpaceToDepth, Shape/Size, ConstantOfShape, EyeLike, OneHot, Range,
//! Trilu, ReverseSequence and Resize.

use super::ctx::{broadcast_dims, Class, Ctx, Ints, R};
use crate::attrs::{
    ConcatAttrs, ConstantOfShapeAttrs, DepthToSpaceAttrs, EyeLikeAttrs, FlattenAttrs, GatherAttrs, GatherNdAttrs,
    KeepAspectRatioPolicy, OneHotAttrs, PadAttrs, PadMode, RangeAttrs, ReshapeAttrs, ResizeAttrs, ReverseSequenceAttrs,
    ScatterElementsAttrs, ShapeAttrs, SpaceToDepthAttrs, SplitAttrs, TransposeAttrs,
};
use crate::dtype::DType;
use crate::shape::TensorType;

/// The required constant 1-D integer operand `i`.
fn req_int_list(cx: &Ctx, i: usize, what: &str) -> R<Vec<i64>> {
    cx.req(i, what)?;
    cx.int_list(i, what)?.ok_or_else(|| cx.invalid(format_args!("operand `{what}` (input {i}) is required")))
}

/// The required constant axes operand `i` (1-D, or a scalar).
fn req_axes_list(cx: &Ctx, i: usize, what: &str) -> R<Vec<i64>> {
    cx.req(i, what)?;
    cx.axes_list(i, what)?.ok_or_else(|| cx.invalid(format_args!("operand `{what}` (input {i}) is required")))
}

/// Product of extents, `None` on overflow.
fn product(d: &[usize]) -> Option<usize> {
    d.iter().try_fold(1usize, |a, &b| a.checked_mul(b))
}

/// Reshape(data, shape): 0 copies the input extent (unless `allowzero`), -1 is inferred.
pub(super) fn reshape(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let data = cx.req(0, "data")?;
    let spec = req_int_list(cx, 1, "shape")?;
    let allowzero = cx.attrs::<ReshapeAttrs>()?.allowzero;
    let in_dims = data.shape.dims();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &s) in spec.iter().enumerate() {
        let d = match s {
            -1 => {
                if infer_at.is_some() {
                    return Err(cx.invalid(format_args!("`shape` {} has more than one -1", Ints(&spec))));
                }
                infer_at = Some(i);
                1
            }
            0 if !allowzero => *in_dims.get(i).ok_or_else(|| {
                cx.invalid(format_args!(
                    "`shape` {} copies input dimension {i} (entry 0), but the input {data} has rank {}",
                    Ints(&spec),
                    in_dims.len()
                ))
            })?,
            s if s < 0 => return Err(cx.invalid(format_args!("`shape` {} has invalid entry {s}", Ints(&spec)))),
            s => cx.extent(s, "`shape` entry")?,
        };
        out.push(d);
    }
    if allowzero && infer_at.is_some() && spec.contains(&0) {
        return Err(cx.invalid(format_args!("with allowzero=1, `shape` {} may not hold both 0 and -1", Ints(&spec))));
    }
    let numel = data.shape.numel();
    let mismatch = || cx.invalid(format_args!("cannot reshape {data} ({numel} elements) to shape {}", Ints(&spec)));
    let known = product(&out).ok_or_else(mismatch)?;
    if let Some(k) = infer_at {
        if known == 0 || numel % known != 0 {
            return Err(mismatch());
        }
        out[k] = numel / known;
    } else if known != numel {
        return Err(mismatch());
    }
    Ok(vec![cx.tt(data.dtype, out)?])
}

/// Expand(input, shape): numpy broadcast of the input's shape with `shape`.
pub(super) fn expand(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req(0, "input")?;
    let spec = req_int_list(cx, 1, "shape")?;
    let dims = spec.iter().map(|&s| cx.extent(s, "`shape` entry")).collect::<R<Vec<usize>>>()?;
    let out = broadcast_dims(x.shape.dims(), &dims)
        .ok_or_else(|| cx.invalid(format_args!("cannot broadcast {x} with shape {}", Ints(&spec))))?;
    Ok(vec![cx.tt(x.dtype, out)?])
}

/// Tile(input, repeats): one non-negative repeat per dimension.
pub(super) fn tile(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req(0, "input")?;
    let reps = req_int_list(cx, 1, "repeats")?;
    if reps.len() != x.shape.rank() {
        return Err(cx.invalid(format_args!("`repeats` {} must have one entry per dimension of {x}", Ints(&reps))));
    }
    let mut out = Vec::with_capacity(reps.len());
    for (&d, &r) in x.shape.dims().iter().zip(&reps) {
        let r = cx.extent(r, "`repeats` entry")?;
        out.push(
            d.checked_mul(r).ok_or_else(|| cx.invalid(format_args!("{x} tiled by {} is too large", Ints(&reps))))?,
        );
    }
    Ok(vec![cx.tt(x.dtype, out)?])
}

/// Elements a Slice keeps along one dimension of extent `dim` (ONNX clamping rules).
pub(super) fn slice_len(dim: usize, start: i64, end: i64, step: i64) -> usize {
    let d = dim as i128;
    let (mut s, mut e, st) = (start as i128, end as i128, step as i128);
    if s < 0 {
        s += d;
    }
    if e < 0 {
        e += d;
    }
    let n = if st > 0 {
        let (s, e) = (s.clamp(0, d), e.clamp(0, d));
        if e > s {
            (e - s + st - 1) / st
        } else {
            0
        }
    } else {
        if d == 0 {
            return 0;
        }
        let (s, e) = (s.clamp(0, d - 1), e.clamp(-1, d - 1));
        if s > e {
            (s - e - st - 1) / -st
        } else {
            0
        }
    };
    // 0 ≤ n ≤ dim by construction.
    n as usize
}

/// Checks that the named integer lists `a` and `b` have the same length.
fn same_length(cx: &Ctx, (an, a): (&str, &[i64]), (bn, b): (&str, &[i64])) -> R<()> {
    if a.len() != b.len() {
        return Err(cx.invalid(format_args!("`{an}` {} and `{bn}` {} differ in length", Ints(a), Ints(b))));
    }
    Ok(())
}

/// Slice(data, starts, ends, axes?, steps?).
pub(super) fn slice(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(5)?;
    let data = cx.req(0, "data")?;
    let starts = req_int_list(cx, 1, "starts")?;
    let ends = req_int_list(cx, 2, "ends")?;
    let rank = data.shape.rank();
    same_length(cx, ("starts", &starts), ("ends", &ends))?;
    let axes = match cx.int_list(3, "axes")? {
        Some(a) => {
            same_length(cx, ("axes", &a), ("starts", &starts))?;
            cx.axes(&a, rank, "axis")?
        }
        None => {
            if starts.len() > rank {
                return Err(
                    cx.invalid(format_args!("`starts` {} has more entries than {data} has dimensions", Ints(&starts)))
                );
            }
            (0..starts.len()).collect()
        }
    };
    let steps = match cx.int_list(4, "steps")? {
        Some(s) => {
            same_length(cx, ("steps", &s), ("starts", &starts))?;
            if s.contains(&0) {
                return Err(cx.invalid(format_args!("`steps` {} holds a 0", Ints(&s))));
            }
            s
        }
        None => vec![1; starts.len()],
    };
    let mut out = data.shape.dims().to_vec();
    for (j, &ax) in axes.iter().enumerate() {
        out[ax] = slice_len(out[ax], starts[j], ends[j], steps[j]);
    }
    Ok(vec![cx.tt(data.dtype, out)?])
}

/// Pad(data, pads, constant_value?, axes?): `pads` = begins then ends, one per axis.
pub(super) fn pad(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(4)?;
    let data = cx.req(0, "data")?;
    let mode = cx.attrs::<PadAttrs>()?.mode;
    let pads = req_int_list(cx, 1, "pads")?;
    if let Some(v) = cx.opt_ty(2) {
        cx.same_dtype(v, 2, "constant_value", data)?;
        cx.expect_scalar(v, 2, "constant_value")?;
    }
    let rank = data.shape.rank();
    let axes = match cx.int_list(3, "axes")? {
        Some(a) => cx.axes(&a, rank, "axis")?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(cx.invalid(format_args!(
            "`pads` {} must have 2 entries per padded axis ({} axes)",
            Ints(&pads),
            axes.len()
        )));
    }
    let n = axes.len();
    let mut out = data.shape.dims().to_vec();
    for (j, &ax) in axes.iter().enumerate() {
        let (b, e) = (pads[j], pads[j + n]);
        let d = out[ax];
        if mode != PadMode::Constant && d == 0 && (b > 0 || e > 0) {
            return Err(cx.invalid(format_args!("mode {mode} cannot pad axis {ax} of {data}: it is empty")));
        }
        let new = d as i128 + b as i128 + e as i128;
        out[ax] = usize::try_from(new).map_err(|_| {
            cx.invalid(format_args!("`pads` {} remove more than the {d} elements of axis {ax} of {data}", Ints(&pads)))
        })?;
    }
    Ok(vec![cx.tt(data.dtype, out)?])
}

/// Squeeze(data, axes?): removes the listed extent-1 axes, or every extent-1 axis.
pub(super) fn squeeze(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let data = cx.req(0, "data")?;
    let dims = data.shape.dims();
    let axes = cx.axes_list(1, "axes")?.unwrap_or_default();
    let out = if axes.is_empty() {
        dims.iter().copied().filter(|&d| d != 1).collect()
    } else {
        let axes = cx.axes(&axes, dims.len(), "axis")?;
        for &a in &axes {
            if dims[a] != 1 {
                return Err(
                    cx.invalid(format_args!("cannot squeeze axis {a} of {data}: its extent is {}, not 1", dims[a]))
                );
            }
        }
        dims.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, &d)| d).collect()
    };
    Ok(vec![cx.tt(data.dtype, out)?])
}

/// Unsqueeze(data, axes): inserts extent-1 axes at the listed positions of the result.
pub(super) fn unsqueeze(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let data = cx.req(0, "data")?;
    let axes = req_axes_list(cx, 1, "axes")?;
    let out_rank = data.shape.rank() + axes.len();
    if out_rank > crate::shape::MAX_RANK {
        return Err(
            cx.unsupported(format_args!("result rank {out_rank} exceeds the maximum rank {}", crate::shape::MAX_RANK))
        );
    }
    let axes = cx.axes(&axes, out_rank, "axis")?;
    let mut src = data.shape.dims().iter();
    let out = (0..out_rank).map(|i| if axes.contains(&i) { 1 } else { src.next().copied().unwrap_or(1) }).collect();
    Ok(vec![cx.tt(data.dtype, out)?])
}

/// Split(input, split?) into the node's results along `axis`.
pub(super) fn split(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req(0, "input")?;
    let sa = cx.attrs::<SplitAttrs>()?;
    let axis = cx.axis(sa.axis, x.shape.rank(), "axis")?;
    let dim = x.shape.dims()[axis];
    let attr_n = sa.num_outputs;
    let sizes: Vec<usize> = match (cx.int_list(1, "split")?, attr_n) {
        (Some(_), Some(_)) => {
            return Err(cx.invalid("give either the `split` operand or the `num_outputs` attribute, not both"))
        }
        (Some(split), None) => {
            let sizes = split.iter().map(|&s| cx.extent(s, "`split` entry")).collect::<R<Vec<usize>>>()?;
            if sizes.iter().try_fold(0usize, |a, &b| a.checked_add(b)) != Some(dim) {
                return Err(cx.invalid(format_args!(
                    "`split` {} does not sum to the extent {dim} of axis {axis} of {x}",
                    Ints(&split)
                )));
            }
            sizes
        }
        (None, Some(n)) => {
            let n = cx.count_attr(n, "num_outputs")?;
            let chunk = dim.div_ceil(n);
            // The last chunk is smaller when the extent does not divide evenly.
            let last = chunk.checked_mul(n - 1).and_then(|u| dim.checked_sub(u)).ok_or_else(|| {
                cx.invalid(format_args!(
                    "cannot split the extent {dim} of axis {axis} of {x} into {n} parts of {chunk}"
                ))
            })?;
            // Only the results the node lists (never more than n) are materialised.
            (0..n.min(cx.num_outputs)).map(|i| if i + 1 == n { last } else { chunk }).collect()
        }
        (None, None) => {
            let n = cx.num_outputs;
            if n == 0 {
                return Ok(Vec::new());
            }
            if dim % n != 0 {
                return Err(cx.invalid(format_args!(
                    "cannot split the extent {dim} of axis {axis} of {x} into {n} equal parts; give `split` or `num_outputs`"
                )));
            }
            vec![dim / n; n]
        }
    };
    sizes
        .into_iter()
        .map(|s| {
            let mut d = x.shape.dims().to_vec();
            d[axis] = s;
            cx.tt(x.dtype, d)
        })
        .collect()
}

/// Concat(inputs…) along `axis` (required).
pub(super) fn concat(cx: &Ctx) -> R<Vec<TensorType>> {
    if cx.num_inputs() == 0 {
        return Err(cx.invalid("needs at least one operand"));
    }
    let first = cx.req(0, "inputs")?;
    let rank = first.shape.rank();
    if rank == 0 {
        return Err(cx.invalid(format_args!("cannot concatenate scalars ({first})")));
    }
    let axis = cx.axis(cx.attrs::<ConcatAttrs>()?.axis, rank, "axis")?;
    let mut out = first.shape.dims().to_vec();
    for i in 1..cx.num_inputs() {
        let t = cx.req(i, "inputs")?;
        cx.same_dtype(t, i, "inputs", first)?;
        let d = t.shape.dims();
        let compatible =
            d.len() == rank && d.iter().zip(first.shape.dims()).enumerate().all(|(j, (a, b))| j == axis || a == b);
        if !compatible {
            return Err(cx.invalid(format_args!("cannot concatenate {first} and {t} along axis {axis}")));
        }
        out[axis] = out[axis].checked_add(d[axis]).ok_or_else(|| cx.invalid("result is too large"))?;
    }
    Ok(vec![cx.tt(first.dtype, out)?])
}

/// The operands of the Gather family: `data` (rank ≥ 1) and integer `indices`.
fn gather_operands<'b>(cx: &Ctx<'_, 'b>) -> R<(&'b TensorType, &'b TensorType)> {
    cx.max_inputs(2)?;
    let data = cx.req(0, "data")?;
    let ind = cx.req_class(1, "indices", Class::Index)?;
    cx.min_rank(data, 0, "data", 1)?;
    Ok((data, ind))
}

/// The operands of the Scatter family: `data` (rank ≥ 1), integer `indices` and `updates`.
fn scatter_operands<'b>(cx: &Ctx<'_, 'b>) -> R<(&'b TensorType, &'b TensorType, &'b TensorType)> {
    cx.max_inputs(3)?;
    let data = cx.req(0, "data")?;
    let ind = cx.req_class(1, "indices", Class::Index)?;
    let upd = cx.req(2, "updates")?;
    cx.min_rank(data, 0, "data", 1)?;
    Ok((data, ind, upd))
}

/// Gather(data, indices): data[:axis] + indices + data[axis+1:].
pub(super) fn gather(cx: &Ctx) -> R<Vec<TensorType>> {
    let (data, ind) = gather_operands(cx)?;
    let axis = cx.axis(cx.attrs::<GatherAttrs>()?.axis, data.shape.rank(), "axis")?;
    let d = data.shape.dims();
    if let Some(v) = cx.opt(1).and_then(|x| x.value) {
        let n = d[axis] as i64;
        if let Ok(vals) = v.to_i64_vec() {
            if let Some(bad) = vals.iter().find(|&&k| k < -n || k >= n) {
                return Err(cx.invalid(format_args!("index {bad} is out of range for axis {axis} of {data}")));
            }
        }
    }
    let mut out = d[..axis].to_vec();
    out.extend_from_slice(ind.shape.dims());
    out.extend_from_slice(&d[axis + 1..]);
    Ok(vec![cx.tt(data.dtype, out)?])
}

/// GatherElements(data, indices): the indices' shape, data's dtype.
pub(super) fn gather_elements(cx: &Ctx) -> R<Vec<TensorType>> {
    let (data, ind) = gather_operands(cx)?;
    cx.rank(ind, 1, "indices", data.shape.rank())?;
    cx.axis(cx.attrs::<GatherAttrs>()?.axis, data.shape.rank(), "axis")?;
    Ok(vec![TensorType::new(data.dtype, ind.shape.clone())])
}

/// GatherND(data, indices) with `batch_dims`.
pub(super) fn gather_nd(cx: &Ctx) -> R<Vec<TensorType>> {
    let (data, ind) = gather_operands(cx)?;
    cx.min_rank(ind, 1, "indices", 1)?;
    let (d, q) = (data.shape.dims(), ind.shape.dims());
    let b = cx.attrs::<GatherNdAttrs>()?.batch_dims;
    let b = usize::try_from(b).ok().filter(|&b| b < d.len().min(q.len())).ok_or_else(|| {
        cx.invalid(format_args!("attribute `batch_dims` = {b} must be ≥ 0 and less than the ranks of {data} and {ind}"))
    })?;
    if d[..b] != q[..b] {
        return Err(cx.invalid(format_args!("the first {b} (batch) dimensions of {data} and {ind} differ")));
    }
    let last = q[q.len() - 1];
    if last < 1 || last > d.len() - b {
        return Err(cx.invalid(format_args!(
            "the last extent of {ind} must be between 1 and {} (rank of {data} minus batch_dims)",
            d.len() - b
        )));
    }
    let mut out = q[..q.len() - 1].to_vec();
    out.extend_from_slice(&d[b + last..]);
    Ok(vec![cx.tt(data.dtype, out)?])
}

/// ScatterElements(data, indices, updates): the data's type.
pub(super) fn scatter_elements(cx: &Ctx) -> R<Vec<TensorType>> {
    let (data, ind, upd) = scatter_operands(cx)?;
    cx.rank(ind, 1, "indices", data.shape.rank())?;
    cx.same_dtype(upd, 2, "updates", data)?;
    cx.expect_dims(upd, 2, "updates", ind.shape.dims())?;
    cx.axis(cx.attrs::<ScatterElementsAttrs>()?.axis, data.shape.rank(), "axis")?;
    Ok(vec![data.clone()])
}

/// ScatterND(data, indices, updates): the data's type.
pub(super) fn scatter_nd(cx: &Ctx) -> R<Vec<TensorType>> {
    let (data, ind, upd) = scatter_operands(cx)?;
    cx.min_rank(ind, 1, "indices", 1)?;
    cx.same_dtype(upd, 2, "updates", data)?;
    let (d, q) = (data.shape.dims(), ind.shape.dims());
    let k = q[q.len() - 1];
    if k < 1 || k > d.len() {
        return Err(cx.invalid(format_args!("the last extent of {ind} must be between 1 and the rank of {data}")));
    }
    let mut want = q[..q.len() - 1].to_vec();
    want.extend_from_slice(&d[k..]);
    cx.expect_dims(upd, 2, "updates", &want)?;
    Ok(vec![data.clone()])
}

/// Transpose(data) by `perm` (default: reversed axes).
pub(super) fn transpose(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req(0, "data")?;
    let d = x.shape.dims();
    let perm: Vec<usize> = match &cx.attrs::<TransposeAttrs>()?.perm {
        Some(p) => {
            let ok = p.len() == d.len() && {
                let mut seen = vec![false; d.len()];
                p.iter().all(|&a| {
                    usize::try_from(a).ok().and_then(|a| seen.get_mut(a)).is_some_and(|s| !std::mem::replace(s, true))
                })
            };
            if !ok {
                return Err(cx.invalid(format_args!(
                    "`perm` {} is not a permutation of the {} axes of {x}",
                    Ints(p),
                    d.len()
                )));
            }
            p.iter().map(|&a| a as usize).collect()
        }
        None => (0..d.len()).rev().collect(),
    };
    let out = perm.iter().map(|&a| d[a]).collect();
    Ok(vec![cx.tt(x.dtype, out)?])
}

/// Flatten(input) at `axis` (default 1, in [-r, r]) into a matrix.
pub(super) fn flatten(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req(0, "input")?;
    let d = x.shape.dims();
    // `axis` is in [-r, r]; a negative one counts from the back of the r dimensions.
    let a = cx.attrs::<FlattenAttrs>()?.axis;
    let r = d.len() as i64;
    if a < -r || a > r {
        return Err(cx.invalid(format_args!("axis {a} is out of range for rank {r} (valid: {} to {r})", -r)));
    }
    let axis = if a < 0 { (a + r) as usize } else { a as usize };
    // Both products divide numel (≤ 2^48) unless an extent is 0: then each is ≤ an extent product
    // of at most 8 extents ≤ 2^48, which still may overflow; check.
    let a = product(&d[..axis]).ok_or_else(|| cx.invalid("result is too large"))?;
    let b = product(&d[axis..]).ok_or_else(|| cx.invalid("result is too large"))?;
    Ok(vec![cx.tt(x.dtype, vec![a, b])?])
}

/// The rank-4 `input` of DepthToSpace or SpaceToDepth, and its `blocksize`.
fn block_input<'b>(cx: &Ctx<'_, 'b>) -> R<(&'b TensorType, usize)> {
    cx.max_inputs(1)?;
    let x = cx.req(0, "input")?;
    cx.rank(x, 0, "input", 4)?;
    let b = match cx.op.kind {
        crate::op::OpKind::DepthToSpace => cx.attrs::<DepthToSpaceAttrs>()?.blocksize,
        _ => cx.attrs::<SpaceToDepthAttrs>()?.blocksize,
    };
    Ok((x, cx.count_attr(b, "blocksize")?))
}

/// DepthToSpace: [N, C, H, W] → [N, C/b², H·b, W·b].
pub(super) fn depth_to_space(cx: &Ctx) -> R<Vec<TensorType>> {
    let (x, b) = block_input(cx)?;
    let d = x.shape.dims();
    let bb = b.checked_mul(b).ok_or_else(|| cx.invalid("`blocksize` is too large"))?;
    if d[1] % bb != 0 {
        return Err(cx.invalid(format_args!("the channel count of {x} is not a multiple of blocksize² = {bb}")));
    }
    let too_big = || cx.invalid("result is too large");
    let out = vec![d[0], d[1] / bb, d[2].checked_mul(b).ok_or_else(too_big)?, d[3].checked_mul(b).ok_or_else(too_big)?];
    Ok(vec![cx.tt(x.dtype, out)?])
}

/// SpaceToDepth: [N, C, H, W] → [N, C·b², H/b, W/b].
pub(super) fn space_to_depth(cx: &Ctx) -> R<Vec<TensorType>> {
    let (x, b) = block_input(cx)?;
    let d = x.shape.dims();
    if d[2] % b != 0 || d[3] % b != 0 {
        return Err(cx.invalid(format_args!("the spatial extents of {x} are not multiples of blocksize {b}")));
    }
    let c = b.checked_mul(b).and_then(|bb| d[1].checked_mul(bb)).ok_or_else(|| cx.invalid("result is too large"))?;
    Ok(vec![cx.tt(x.dtype, vec![d[0], c, d[2] / b, d[3] / b])?])
}

/// Shape(data) with `start`/`end` (clamped to [0, rank]) → i64[len].
pub(super) fn shape(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req(0, "data")?;
    let r = x.shape.rank() as i64;
    let clamp = |v: i64| if v < 0 { v.saturating_add(r).max(0) } else { v.min(r) };
    let a = cx.attrs::<ShapeAttrs>()?;
    let start = clamp(a.start);
    let end = clamp(a.end.unwrap_or(r));
    let n = (end - start).max(0) as usize;
    Ok(vec![cx.tt(DType::I64, vec![n])?])
}

/// Size(data) → i64 scalar.
pub(super) fn size(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    cx.req(0, "data")?;
    Ok(vec![TensorType::new(DType::I64, crate::shape::Shape::scalar())])
}

/// ConstantOfShape(input): the shape in the constant input, the dtype of `value`.
pub(super) fn constant_of_shape(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let t = cx.req(0, "input")?;
    if t.dtype != DType::I64 {
        return Err(cx.invalid(format_args!("`input` (input 0) must be an int64 tensor, got {t}")));
    }
    let spec = req_int_list(cx, 0, "input")?;
    let dims = spec.iter().map(|&s| cx.extent(s, "`input` entry")).collect::<R<Vec<usize>>>()?;
    let dtype = match &cx.attrs::<ConstantOfShapeAttrs>()?.value {
        Some(v) => {
            if v.numel() != 1 {
                return Err(cx.invalid(format_args!("attribute `value` must hold one element, got {}", v.ty())));
            }
            v.dtype()
        }
        None => DType::F32,
    };
    Ok(vec![cx.tt(dtype, dims)?])
}

/// EyeLike(input): 2-D; the dtype of `dtype`, or the input's.
pub(super) fn eye_like(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(1)?;
    let x = cx.req(0, "input")?;
    cx.rank(x, 0, "input", 2)?;
    let dtype = cx.attrs::<EyeLikeAttrs>()?.dtype.unwrap_or(x.dtype);
    Ok(vec![TensorType::new(dtype, x.shape.clone())])
}

/// OneHot(indices, depth, values): `depth` (constant) inserted at `axis`; values' dtype.
pub(super) fn one_hot(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let ind = cx.req_class(0, "indices", Class::Numeric)?;
    let depth_t = cx.req_class(1, "depth", Class::Numeric)?;
    let values = cx.req(2, "values")?;
    cx.expect_scalar(depth_t, 1, "depth")?;
    if values.shape.dims() != [2] {
        return Err(cx.invalid(format_args!("`values` (input 2) must have shape [2], got {values}")));
    }
    let r = ind.shape.rank();
    let oa = cx.attrs::<OneHotAttrs>()?;
    let axis = cx.axis(oa.axis, r + 1, "axis")?;
    if cx.opt(1).is_some_and(|d| d.value.is_none()) {
        // Run-time depth: the dims compiled for (`kiln_dims`), checked at run time.
        let mut want = ind.shape.dims().to_vec();
        want.insert(axis, 0);
        let dims = checked_dims(cx, oa.dims.as_deref(), "depth", &want, &[axis])?;
        return checked(cx, cx.tt(values.dtype, dims)?);
    }
    let depth = cx
        .constant(1, "depth")?
        .and_then(|v| v.to_f64_vec().first().copied())
        .ok_or_else(|| cx.invalid("`depth` (input 1) must hold one element"))?;
    // ONNX converts depth to an integer (truncation); it must be positive.
    let depth = depth.trunc();
    if !(depth >= 1.0 && depth <= crate::shape::MAX_ELEMENTS as f64) {
        return Err(cx.invalid(format_args!("`depth` must be a positive integer, got {depth}")));
    }
    let mut out = ind.shape.dims().to_vec();
    out.insert(axis, depth as usize);
    Ok(vec![cx.tt(values.dtype, out)?])
}

/// Range(start, limit, delta): all constant scalars of one dtype;
/// length max(ceil((limit - start) / delta), 0).
pub(super) fn range(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let start = cx.req_class(0, "start", Class::Numeric)?;
    let names = ["start", "limit", "delta"];
    for (i, what) in names.iter().enumerate() {
        let t = cx.req(i, what)?;
        cx.same_dtype(t, i, what, start)?;
        cx.expect_scalar(t, i, what)?;
    }
    if (0..3).any(|i| cx.opt(i).is_some_and(|t| t.value.is_none())) {
        // Run-time operands: the length compiled for (`kiln_dims`), checked at run time.
        let dims = checked_dims(cx, cx.attrs::<RangeAttrs>()?.dims.as_deref(), "start, limit or delta", &[0], &[0])?;
        return checked(cx, cx.tt(start.dtype, dims)?);
    }
    let mut vals = [0f64; 3];
    let mut ints = [0i64; 3];
    for (i, what) in names.iter().enumerate() {
        let v = cx
            .constant(i, what)?
            .ok_or_else(|| cx.invalid(format_args!("operand `{what}` (input {i}) is required")))?;
        vals[i] = v.to_f64_vec().first().copied().unwrap_or(0.0);
        if let Ok(iv) = v.to_i64_vec() {
            ints[i] = iv.first().copied().unwrap_or(0);
        }
    }
    let n: i128 = if start.dtype.is_int() {
        let (s, l, d) = (ints[0] as i128, ints[1] as i128, ints[2] as i128);
        if d == 0 {
            return Err(cx.invalid("`delta` must not be 0"));
        }
        // ceil((l - s) / d) for either sign of d.
        let num = l - s;
        let q = num / d;
        if num % d != 0 && ((num < 0) == (d < 0)) {
            q + 1
        } else {
            q
        }
    } else {
        let [s, l, d] = vals;
        if d == 0.0 {
            return Err(cx.invalid("`delta` must not be 0"));
        }
        // Computed in the operands' precision (f32 for the narrower float types).
        let q = if start.dtype == DType::F64 {
            ((l - s) / d).ceil()
        } else {
            (((l as f32) - (s as f32)) / (d as f32)).ceil() as f64
        };
        if q.is_nan() {
            return Err(cx.invalid(format_args!("cannot compute the length of Range({s}, {l}, {d})")));
        }
        if q > crate::shape::MAX_ELEMENTS as f64 {
            return Err(cx.invalid(format_args!("Range({s}, {l}, {d}) has too many elements")));
        }
        q.max(0.0) as i128
    };
    let n = usize::try_from(n.max(0)).map_err(|_| cx.invalid("result has too many elements"))?;
    Ok(vec![cx.tt(start.dtype, vec![n])?])
}

/// The result dims of a shape-checked node (see [`crate::dynamic`]): `declared`
/// (`kiln_dims`), which must agree with `want` except along the axes `free` that the
/// run-time operand `what` decides.
fn checked_dims(cx: &Ctx, declared: Option<&[i64]>, what: &str, want: &[usize], free: &[usize]) -> R<Vec<usize>> {
    let Some(d) = declared else {
        return Err(cx.unsupported(format_args!(
            "`{what}` depends on run-time data: declare the result's shape (in the model, or with \
             --output-shape NAME=DIMS) or make it a constant"
        )));
    };
    if d.len() != want.len() {
        return Err(cx.invalid(format_args!("`kiln_dims` {} has rank {}, expected {}", Ints(d), d.len(), want.len())));
    }
    let mut out = Vec::with_capacity(d.len());
    for (ax, (&e, &w)) in d.iter().zip(want).enumerate() {
        let e = cx.extent(e, "`kiln_dims` entry")?;
        if !free.contains(&ax) && e != w {
            return Err(cx.invalid(format_args!("`kiln_dims` {} disagrees with the operands along axis {ax}", Ints(d))));
        }
        out.push(e);
    }
    Ok(out)
}

/// A shape-checked node's results: `ty` and, when asked for, the `i64` check.
fn checked(cx: &Ctx, ty: TensorType) -> R<Vec<TensorType>> {
    let mut outs = vec![ty];
    if cx.num_outputs > 1 {
        outs.push(cx.tt(DType::I64, Vec::new())?);
    }
    Ok(outs)
}

/// Trilu(input, k?): rank ≥ 2, same type.
pub(super) fn trilu(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req(0, "input")?;
    cx.min_rank(x, 0, "input", 2)?;
    if let Some(k) = cx.opt_class(1, "k", Class::Index)? {
        cx.expect_scalar(k, 1, "k")?;
    }
    Ok(vec![x.clone()])
}

/// ReverseSequence(input, sequence_lens): same type.
pub(super) fn reverse_sequence(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req(0, "input")?;
    let lens = cx.req_class(1, "sequence_lens", Class::Index)?;
    cx.min_rank(x, 0, "input", 2)?;
    let a = cx.attrs::<ReverseSequenceAttrs>()?;
    let (b, t) = (a.batch_axis, a.time_axis);
    if !matches!((b, t), (0, 1) | (1, 0)) {
        return Err(
            cx.invalid(format_args!("`batch_axis` and `time_axis` must be 0 and 1 in some order, got {b} and {t}"))
        );
    }
    cx.expect_dims(lens, 1, "sequence_lens", &[x.shape.dims()[b as usize]])?;
    Ok(vec![x.clone()])
}

/// Resize(X, roi?, scales?, sizes?): from scales floor(extent·scale); from sizes,
/// adjusted by `keep_aspect_ratio_policy`; only the axes in `axes` change.
pub(super) fn resize(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(4)?;
    let x = cx.req(0, "X")?;
    let ra = cx.attrs::<ResizeAttrs>()?;
    let policy = ra.keep_aspect_ratio_policy;
    let rank = x.shape.rank();
    let axes = match &ra.axes {
        Some(a) => cx.axes(a, rank, "axis")?,
        None => (0..rank).collect(),
    };
    // An empty operand counts as absent (exporters pass empty `scales` next to `sizes`).
    let present = |i: usize| cx.opt_ty(i).filter(|t| t.shape.numel() > 0);
    let scales_t = present(2);
    let sizes_t = present(3);
    let in_dims = x.shape.dims();
    let mut out = in_dims.to_vec();
    match (scales_t, sizes_t) {
        (Some(_), Some(_)) => {
            return Err(cx.invalid("give either `scales` or `sizes`, not both"));
        }
        (None, None) => return Err(cx.invalid("needs `scales` or `sizes`")),
        (Some(t), None) if cx.opt(2).is_some_and(|s| s.value.is_none()) => {
            // Run-time scales: the result has the dims compiled for (`kiln_dims`), which
            // the node's second result checks at run time.
            cx.check_class(t, 2, "scales", Class::Float)?;
            cx.rank(t, 2, "scales", 1)?;
            if t.shape.numel() != axes.len() {
                return Err(cx.invalid(format_args!(
                    "`scales` has {} entries, expected {} (one per resized axis)",
                    t.shape.numel(),
                    axes.len()
                )));
            }
            let Some(d) = &ra.dims else {
                return Err(cx.unsupported(
                    "`scales` (input 2) depends on run-time data: declare the result's shape \
                     (in the model, or with --output-shape NAME=DIMS) or make `scales` a constant",
                ));
            };
            if d.len() != rank {
                return Err(cx.invalid(format_args!("`kiln_dims` {} has rank {}, X has {rank}", Ints(d), d.len())));
            }
            for (ax, &e) in d.iter().enumerate() {
                let e = cx.extent(e, "`kiln_dims` entry")?;
                if !axes.contains(&ax) && e != in_dims[ax] {
                    return Err(
                        cx.invalid(format_args!("`kiln_dims` {} changes axis {ax}, which is not resized", Ints(d)))
                    );
                }
                out[ax] = e;
            }
            let mut outs = vec![cx.tt(x.dtype, out)?];
            if cx.num_outputs > 1 {
                outs.push(cx.tt(DType::I64, Vec::new())?);
            }
            return Ok(outs);
        }
        (Some(t), None) => {
            cx.check_class(t, 2, "scales", Class::Float)?;
            cx.rank(t, 2, "scales", 1)?;
            let v = cx.constant(2, "scales")?.map(|v| v.to_f64_vec()).unwrap_or_default();
            if v.len() != axes.len() {
                return Err(cx.invalid(format_args!(
                    "`scales` has {} entries, expected {} (one per resized axis)",
                    v.len(),
                    axes.len()
                )));
            }
            for (&ax, &s) in axes.iter().zip(&v) {
                let s = s as f32;
                if !(s > 0.0 && s.is_finite()) {
                    return Err(cx.invalid(format_args!("`scales` entry {s} must be positive")));
                }
                let o = (in_dims[ax] as f32 * s).floor();
                out[ax] = to_extent(cx, o)?;
            }
        }
        (None, Some(t)) => {
            if t.dtype != DType::I64 {
                return Err(cx.invalid(format_args!("`sizes` (input 3) must be an int64 tensor, got {t}")));
            }
            let v = req_int_list(cx, 3, "sizes")?;
            if v.len() != axes.len() {
                return Err(cx.invalid(format_args!(
                    "`sizes` {} has {} entries, expected {} (one per resized axis)",
                    Ints(&v),
                    v.len(),
                    axes.len()
                )));
            }
            let sizes = v.iter().map(|&s| cx.extent(s, "`sizes` entry")).collect::<R<Vec<usize>>>()?;
            if policy == KeepAspectRatioPolicy::Stretch {
                for (&ax, &s) in axes.iter().zip(&sizes) {
                    out[ax] = s;
                }
            } else {
                let mut scale: Option<f32> = None;
                for (&ax, &s) in axes.iter().zip(&sizes) {
                    if in_dims[ax] == 0 {
                        return Err(cx.invalid(format_args!("cannot keep the aspect ratio of {x}: axis {ax} is empty")));
                    }
                    let r = s as f32 / in_dims[ax] as f32;
                    scale = Some(match scale {
                        None => r,
                        Some(c) if policy == KeepAspectRatioPolicy::NotLarger => c.min(r),
                        Some(c) => c.max(r),
                    });
                }
                let scale = scale.unwrap_or(1.0);
                for &ax in &axes {
                    // Round half up.
                    out[ax] = to_extent(cx, (scale * in_dims[ax] as f32 + 0.5).floor())?;
                }
            }
        }
    }
    Ok(vec![cx.tt(x.dtype, out)?])
}

fn to_extent(cx: &Ctx, v: f32) -> R<usize> {
    if v.is_finite() && v >= 0.0 && (v as f64) <= crate::shape::MAX_ELEMENTS as f64 {
        Ok(v as usize)
    } else {
        Err(cx.invalid(format_args!("result extent {v} is out of range")))
    }
}

/// GridSample(X [N, C, D1..Dr], grid [N, O1..Or, r]): `[N, C, O1..Or]`, r = 2 or 3.
pub(super) fn grid_sample(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(2)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let g = cx.req_class(1, "grid", Class::Float)?;
    let (xd, gd) = (x.shape.dims(), g.shape.dims());
    if !matches!(xd.len(), 4 | 5) {
        return Err(
            cx.unsupported(format_args!("X has rank {}; kiln samples 2-D and 3-D inputs (rank 4 or 5)", xd.len()))
        );
    }
    let r = xd.len() - 2;
    if gd.len() != xd.len() || gd[0] != xd[0] || gd[r + 1] != r {
        return Err(
            cx.invalid(format_args!("grid of dims {gd:?} does not fit X of dims {xd:?}: expected [N, out.., {r}]"))
        );
    }
    let mut dims = vec![xd[0], xd[1]];
    dims.extend_from_slice(&gd[1..=r]);
    Ok(vec![cx.tt(x.dtype, dims)?])
}

/// Col2Im(input [N, C·∏block, L], image_shape, block_shape): `[N, C, image..]`, where L
/// is the number of block positions the strides, pads and dilations give.
pub(super) fn col2im(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req(0, "input")?;
    cx.rank(x, 0, "input", 3)?;
    let image = req_int_list(cx, 1, "image_shape")?;
    let block = req_int_list(cx, 2, "block_shape")?;
    let a = cx.attrs::<crate::attrs::Col2ImAttrs>()?;
    let geo = col2im_geometry(&image, &block, a).map_err(|m| cx.invalid(m))?;
    let xd = x.shape.dims();
    let kprod = product(&geo.block).unwrap_or(0);
    if kprod == 0 || xd[1] % kprod != 0 || Some(xd[2]) != product(&geo.blocks) {
        return Err(cx.invalid(format_args!(
            "input of dims {xd:?} does not fit blocks {:?} at {:?} positions",
            geo.block, geo.blocks
        )));
    }
    let mut dims = vec![xd[0], xd[1] / kprod];
    dims.extend_from_slice(&geo.image);
    Ok(vec![cx.tt(x.dtype, dims)?])
}

/// Col2Im's geometry: per spatial axis the image extent, block extent, dilation,
/// stride, begin pad and the number of block positions.
#[derive(Clone, Debug, PartialEq)]
pub struct Col2ImGeometry {
    /// Image extent per axis.
    pub image: Vec<usize>,
    /// Block extent per axis.
    pub block: Vec<usize>,
    /// Dilation per axis.
    pub dilations: Vec<usize>,
    /// Stride per axis.
    pub strides: Vec<usize>,
    /// Begin pad per axis.
    pub pads_begin: Vec<usize>,
    /// Block positions per axis.
    pub blocks: Vec<usize>,
}

/// Checks Col2Im's operands and attributes and gives its geometry.
pub fn col2im_geometry(image: &[i64], block: &[i64], a: &crate::attrs::Col2ImAttrs) -> Result<Col2ImGeometry, String> {
    let s = image.len();
    if s == 0 || block.len() != s {
        return Err(format!("image_shape {image:?} and block_shape {block:?} must have the same non-zero length"));
    }
    let ones = vec![1i64; s];
    let zeros = vec![0i64; 2 * s];
    let dil = a.dilations.as_deref().unwrap_or(&ones);
    let st = a.strides.as_deref().unwrap_or(&ones);
    let pads = a.pads.as_deref().unwrap_or(&zeros);
    if dil.len() != s || st.len() != s || pads.len() != 2 * s {
        return Err(format!("dilations, strides and pads must cover the {s} spatial axes"));
    }
    let pos = |v: i64, what: &str| {
        usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| format!("{what} {v} must be positive"))
    };
    let mut g = Col2ImGeometry {
        image: Vec::new(),
        block: Vec::new(),
        dilations: Vec::new(),
        strides: Vec::new(),
        pads_begin: Vec::new(),
        blocks: Vec::new(),
    };
    for d in 0..s {
        let (im, k, di, sd) = (
            pos(image[d], "image extent")?,
            pos(block[d], "block extent")?,
            pos(dil[d], "dilation")?,
            pos(st[d], "stride")?,
        );
        let (pb, pe) = (pads[d], pads[d + s]);
        if pb < 0 || pe < 0 {
            return Err(format!("pads {pads:?} must not be negative"));
        }
        let span = di
            .checked_mul(k - 1)
            .and_then(|v| v.checked_add(1))
            .and_then(|v| i64::try_from(v).ok())
            .ok_or("block span overflows")?;
        let padded = (im as i64).checked_add(pb).and_then(|v| v.checked_add(pe)).ok_or("pads overflow")?;
        if padded < span {
            return Err(format!("block of span {span} does not fit the padded image extent {padded} on axis {d}"));
        }
        g.blocks.push(((padded - span) / sd as i64 + 1) as usize);
        g.image.push(im);
        g.block.push(k);
        g.dilations.push(di);
        g.strides.push(sd);
        g.pads_begin.push(pb as usize);
    }
    Ok(g)
}

/// RoiAlign(X [N, C, H, W], rois [R, 4], batch_indices [R]): `[R, C, oh, ow]`.
pub(super) fn roi_align(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(3)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let rois = cx.req_class(1, "rois", Class::Float)?;
    let bi = cx.req_class(2, "batch_indices", Class::Index)?;
    cx.rank(x, 0, "X", 4)?;
    cx.rank(rois, 1, "rois", 2)?;
    let r = rois.shape.dims()[0];
    cx.expect_dims(rois, 1, "rois", &[r, 4])?;
    cx.expect_dims(bi, 2, "batch_indices", &[r])?;
    let a = cx.attrs::<crate::attrs::RoiAlignAttrs>()?;
    let oh = cx.count_attr(a.output_height, "output_height")?;
    let ow = cx.count_attr(a.output_width, "output_width")?;
    if a.sampling_ratio < 0 {
        return Err(cx.invalid(format_args!("sampling_ratio {} must not be negative", a.sampling_ratio)));
    }
    Ok(vec![cx.tt(x.dtype, vec![r, x.shape.dims()[1], oh, ow])?])
}

/// DeformConv's 2-D geometry: kernel, strides, dilations, begin pads, output extent,
/// groups and offset groups.
#[derive(Clone, Debug, PartialEq)]
pub struct DeformConvGeometry {
    /// Kernel extent (rows, columns).
    pub kernel: [usize; 2],
    /// Strides.
    pub strides: [usize; 2],
    /// Dilations.
    pub dilations: [usize; 2],
    /// Begin pads.
    pub pads_begin: [usize; 2],
    /// Output extent.
    pub out: [usize; 2],
    /// Convolution groups.
    pub group: usize,
    /// Offset groups.
    pub offset_group: usize,
}

/// Checks DeformConv's operand dims (X, W, offset) and attributes; gives its geometry.
pub fn deform_conv_geometry(
    xd: &[usize],
    wd: &[usize],
    od: &[usize],
    a: &crate::attrs::DeformConvAttrs,
) -> Result<DeformConvGeometry, String> {
    if xd.len() != 4 || wd.len() != 4 || od.len() != 4 {
        return Err(format!("X {xd:?}, W {wd:?} and offset {od:?} must have rank 4 (2-D deformable convolution)"));
    }
    let pos = |v: i64, what: &str| {
        usize::try_from(v).ok().filter(|&v| v > 0).ok_or_else(|| format!("{what} {v} must be positive"))
    };
    let two = |v: &Option<Vec<i64>>, n: usize, d: i64, what: &str| -> Result<Vec<i64>, String> {
        let v = v.clone().unwrap_or_else(|| vec![d; n]);
        if v.len() != n {
            return Err(format!("{what} {v:?} must have {n} entries"));
        }
        Ok(v)
    };
    let ks = two(&a.kernel_shape, 2, 0, "kernel_shape")?;
    let kernel = if a.kernel_shape.is_some() {
        [pos(ks[0], "kernel extent")?, pos(ks[1], "kernel extent")?]
    } else {
        [wd[2], wd[3]]
    };
    if kernel != [wd[2], wd[3]] {
        return Err(format!("kernel_shape {kernel:?} differs from W's {:?}", &wd[2..]));
    }
    let st = two(&a.strides, 2, 1, "strides")?;
    let dl = two(&a.dilations, 2, 1, "dilations")?;
    let pd = two(&a.pads, 4, 0, "pads")?;
    if pd.iter().any(|&p| p < 0) {
        return Err(format!("pads {pd:?} must not be negative"));
    }
    let group = pos(a.group, "group")?;
    let og = pos(a.offset_group, "offset_group")?;
    let (n, c, oc) = (xd[0], xd[1], wd[0]);
    if Some(c) != wd[1].checked_mul(group) || oc % group != 0 || c % og != 0 {
        return Err(format!(
            "X has {c} channels, W {wd:?}, group {group}, offset_group {og}: the channels do not divide"
        ));
    }
    let strides = [pos(st[0], "stride")?, pos(st[1], "stride")?];
    let dilations = [pos(dl[0], "dilation")?, pos(dl[1], "dilation")?];
    let mut out = [0usize; 2];
    for d in 0..2 {
        let span = (kernel[d] - 1)
            .checked_mul(dilations[d])
            .and_then(|v| v.checked_add(1))
            .and_then(|v| i64::try_from(v).ok())
            .ok_or("the kernel span overflows")?;
        let padded =
            (xd[2 + d] as i64).checked_add(pd[d]).and_then(|v| v.checked_add(pd[d + 2])).ok_or("pads overflow")?;
        if padded < span {
            return Err(format!("the kernel of span {span} does not fit the padded extent {padded}"));
        }
        out[d] = ((padded - span) / strides[d] as i64 + 1) as usize;
    }
    let offsets = product(&[og, 2, kernel[0], kernel[1]]).ok_or("the offset channel count overflows")?;
    let want = [n, offsets, out[0], out[1]];
    if od != want {
        return Err(format!("offset of dims {od:?}; expected {want:?}"));
    }
    Ok(DeformConvGeometry {
        kernel,
        strides,
        dilations,
        pads_begin: [pd[0] as usize, pd[1] as usize],
        out,
        group,
        offset_group: og,
    })
}

/// DeformConv(X, W, offset, B?, mask?): `[N, oc, oh, ow]` (2-D only).
pub(super) fn deform_conv(cx: &Ctx) -> R<Vec<TensorType>> {
    cx.max_inputs(5)?;
    let x = cx.req_class(0, "X", Class::Float)?;
    let w = cx.req_same(1, "W", x)?;
    let off = cx.req_same(2, "offset", x)?;
    let a = cx.attrs::<crate::attrs::DeformConvAttrs>()?;
    let (xd, wd, od) = (x.shape.dims(), w.shape.dims(), off.shape.dims());
    if xd.len() != 4 {
        return Err(
            cx.unsupported(format_args!("X has rank {}; kiln supports 2-D deformable convolutions (rank 4)", xd.len()))
        );
    }
    let g = deform_conv_geometry(xd, wd, od, a).map_err(|m| cx.invalid(m))?;
    if let Some(b) = cx.opt_ty(3) {
        cx.same_dtype(b, 3, "B", x)?;
        cx.expect_dims(b, 3, "B", &[wd[0]])?;
    }
    if let Some(m) = cx.opt_ty(4) {
        cx.same_dtype(m, 4, "mask", x)?;
        let taps = g.offset_group * g.kernel[0] * g.kernel[1]; // no overflow: twice it is offset's extent
        cx.expect_dims(m, 4, "mask", &[xd[0], taps, g.out[0], g.out[1]])?;
    }
    Ok(vec![cx.tt(x.dtype, vec![xd[0], wd[0], g.out[0], g.out[1]])?])
}
