//! Lowering of the reductions (Reduce*, ArgMax, ArgMin) and the pools (AveragePool,
//! MaxPool, LpPool and their Global forms). CumSum is lowered with the movement ops.
//!
//! - **Reduce\*** is one kernel: a fold over one variable per reduced axis. Floats
//!   compute in their compute type; integer Sum/Prod/SumSquare/L1 wrap in their own
//!   width, Mean divides an i64 (u64) sum, truncating; integer L2/LogSum/LogSumExp go
//!   through f64 and saturate, as the reference does. LogSumExp is `m + log Σ exp(x − m)`
//!   with the maximum `m` a nested fold in the same kernel (`m` itself when it is not
//!   finite). An empty reduction is the reference's identity, as a constant (no load).
//! - **ArgMax/ArgMin** fold `argmax`/`argmin` over the axis. For floats NaN wins (the first
//!   one, or the last with `select_last_index`): a second fold finds the first (last) NaN,
//!   and a third, the maximum of `isnan` as 0 or 1, whether there is one.
//! - **Pools** fold over one variable per kernel dimension, reading the input at
//!   `o·stride − pad + k·dilation` with [`Bounds::Pad`] loads where a window can leave it
//!   (0 for sums, the lowest value for maxima). AveragePool without `count_include_pad`
//!   divides by the taps inside the input, a per-dimension count (a fold over that
//!   dimension's taps only, so it does not depend on the other output variables).
//!   MaxPool ignores NaN; its Indices fold `argmax` over the flattened window of
//!   `tap is inside && x == max`, then recheck that tap (−1 when there is none).

use kiln_ir::attrs::{ArgReduceAttrs, PoolAttrs, ReduceAttrs};
use kiln_ir::shape::reduced_dims;
use kiln_ir::{DType, OpKind};

use super::linalg::{
    and, dims, empty_step, expect_out, finish, float_to, fold, in_range, int_bounds, one, sliding_window, types,
    WinDim, R,
};
use super::{compute, flat_index, mean_from_parts, norm_axis, unflatten, LowerError, Lowered, OpCx};
use kiln_flow::kernel::{BinaryOp, Bounds, ExprId, KernelBuilder, ReduceOp, ScalarType, UnaryOp, VarId};

/// Lowers the ops of this family; `None` for ops of other families.
pub(super) fn lower(cx: &OpCx<'_>) -> Option<Result<Lowered, LowerError>> {
    use OpKind::*;
    let r = match cx.op.kind {
        ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMax | ReduceMean | ReduceMin | ReduceProd
        | ReduceSum | ReduceSumSquare => reduce(cx),
        ArgMax | ArgMin => arg_reduce(cx),
        AveragePool => pool(cx, Pool::Avg),
        LpPool => pool(cx, Pool::Lp),
        MaxPool => max_pool(cx),
        GlobalAveragePool => global_pool(cx, Pool::Avg),
        GlobalMaxPool => global_pool(cx, Pool::Max),
        GlobalLpPool => global_pool(cx, Pool::Lp),
        _ => return None,
    };
    Some(r)
}

// ---------------------------------------------------------------------------
// Reduce*.
// ---------------------------------------------------------------------------

/// Loads the operand with the output index `out` where it is kept and a fresh variable
/// per reduced axis; returns those variables and the value converted to `ct`.
fn lane(
    b: &mut KernelBuilder,
    xd: &[usize],
    red: &[bool],
    keep: bool,
    out: &[ExprId],
    ct: ScalarType,
) -> (Vec<VarId>, ExprId) {
    let mut vars = Vec::new();
    let mut idx = Vec::with_capacity(xd.len());
    let mut o = 0;
    for (&n, &r) in xd.iter().zip(red) {
        if r {
            let v = b.new_var(n as u64);
            vars.push(v);
            idx.push(b.var(v));
            if keep {
                o += 1;
            }
        } else {
            idx.push(out[o]);
            o += 1;
        }
    }
    let x = b.load(0, idx);
    (vars, b.convert(x, ct))
}

fn reduce(cx: &OpCx<'_>) -> R<Lowered> {
    use OpKind::*;
    let k = cx.op.kind;
    let x = cx.input_ty(0)?;
    let d = x.dtype;
    let xd = x.shape.dims().to_vec();
    let rank = xd.len();
    let ra = cx.attrs::<ReduceAttrs>()?;
    let (keep, noop) = (ra.keepdims, ra.noop_with_empty_axes);
    let axes = match cx.input(1) {
        None => Vec::new(),
        Some(_) => cx.const_ints(1, "axes")?.unwrap_or_default(),
    };
    let mut red = vec![axes.is_empty() && !noop; rank];
    for &a in &axes {
        let a = norm_axis(cx, a, rank)?;
        if red[a] {
            return Err(cx.unsupported(format!("axis {a} is listed twice")));
        }
        red[a] = true;
    }
    let od = reduced_dims(&xd, &red, keep);
    expect_out(cx, 0, &od)?;
    if d == DType::Bool && !matches!(k, ReduceMax | ReduceMin) {
        return Err(cx.unsupported("bool operand"));
    }
    if od.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let count: usize = xd.iter().zip(&red).filter(|(_, &r)| r).map(|(&n, _)| n).product();
    let float_path = d.is_float() || matches!(k, ReduceL2 | ReduceLogSum | ReduceLogSumExp);
    let ct = if d.is_float() {
        compute(d)
    } else if float_path {
        ScalarType::F64
    } else if k == ReduceMean {
        if d == DType::U64 {
            ScalarType::U64
        } else {
            ScalarType::I64
        }
    } else {
        ScalarType::of_storage(d)
    };
    if count == 0 {
        // The identity of the reduction, as the reference gives it.
        let mut b = cx.builder(0, Vec::new());
        let v = if !float_path && matches!(k, ReduceMax | ReduceMin) {
            let (lo, hi) = int_bounds(d);
            let st = ScalarType::of_storage(d);
            let x = if k == ReduceMax { lo } else { hi };
            b.constant(st, st.wrap(x as u64))
        } else {
            let x = match k {
                ReduceProd => 1.0,
                ReduceMax | ReduceLogSum | ReduceLogSumExp => f64::NEG_INFINITY,
                ReduceMin => f64::INFINITY,
                ReduceMean if float_path => f64::NAN,
                _ => 0.0,
            };
            let f = b.float(ScalarType::F64, x);
            float_to(&mut b, f, d)
        };
        return Ok(one(finish(b, v, &[])?));
    }
    let mut b = cx.builder(0, types(cx, &[0])?);
    let out = b.out_index();
    let (vars, x) = lane(&mut b, &xd, &red, keep, &out, ct);
    let v = match k {
        ReduceSum => fold(&mut b, ReduceOp::Sum, vars, x),
        ReduceL1 => {
            let a = if ct.is_signed() || ct.is_float() { b.unary(UnaryOp::Abs, x) } else { x };
            fold(&mut b, ReduceOp::Sum, vars, a)
        }
        ReduceL2 | ReduceSumSquare => {
            let sq = b.mul(x, x);
            let s = fold(&mut b, ReduceOp::Sum, vars, sq);
            if k == ReduceL2 {
                b.unary(UnaryOp::Sqrt, s)
            } else {
                s
            }
        }
        ReduceLogSum => {
            let s = fold(&mut b, ReduceOp::Sum, vars, x);
            b.unary(UnaryOp::Log, s)
        }
        ReduceMean if ct.is_float() || ct.bits() < 64 || d.bits() < 64 => {
            // Floats, and integers narrower than 64 bits (an exact i64 sum).
            let s = fold(&mut b, ReduceOp::Sum, vars, x);
            let n = b.int(ct, count as i64);
            b.div(s, n)
        }
        ReduceMean => {
            // i64/u64: the sum may not fit, the mean does: from Σ(x/n) and Σ(x%n).
            let n = b.int(ct, count as i64);
            let q = b.div(x, n);
            let q = fold(&mut b, ReduceOp::Sum, vars, q);
            let (vars2, x2) = lane(&mut b, &xd, &red, keep, &out, ct);
            let r = b.binary(BinaryOp::Rem, x2, n);
            let r = fold(&mut b, ReduceOp::Sum, vars2, r);
            mean_from_parts(&mut b, q, r, n, ct.is_signed())
        }
        ReduceProd => fold(&mut b, ReduceOp::Prod, vars, x),
        ReduceMax => fold(&mut b, ReduceOp::Max, vars, x),
        ReduceMin => fold(&mut b, ReduceOp::Min, vars, x),
        ReduceLogSumExp => {
            // m + log Σ exp(x − m), with m the maximum (a fold of its own variables).
            let m = fold(&mut b, ReduceOp::Max, vars, x);
            let (vars2, x2) = lane(&mut b, &xd, &red, keep, &out, ct);
            let z = b.sub(x2, m);
            let e = b.unary(UnaryOp::Exp, z);
            let s = fold(&mut b, ReduceOp::Sum, vars2, e);
            let l = b.unary(UnaryOp::Log, s);
            let r = b.add(m, l);
            let am = b.unary(UnaryOp::Abs, m);
            let inf = b.float(ct, f64::INFINITY);
            let finite = b.binary(BinaryOp::Lt, am, inf);
            b.select(finite, r, m)
        }
        _ => return Err(cx.unsupported("not a reduction")),
    };
    let v = float_to(&mut b, v, cx.output_ty(0).dtype);
    Ok(one(finish(b, v, &[0])?))
}

// ---------------------------------------------------------------------------
// ArgMax / ArgMin.
// ---------------------------------------------------------------------------

fn arg_reduce(cx: &OpCx<'_>) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = x.shape.dims().to_vec();
    let aa = cx.attrs::<ArgReduceAttrs>()?;
    let axis = norm_axis(cx, aa.axis, xd.len())?;
    let (keep, last) = (aa.keepdims, aa.select_last_index);
    let red: Vec<bool> = (0..xd.len()).map(|i| i == axis).collect();
    let od = reduced_dims(&xd, &red, keep);
    expect_out(cx, 0, &od)?;
    if od.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    if xd[axis] == 0 {
        return Err(cx.unsupported("arg-reduction over an empty axis"));
    }
    let op = if cx.op.kind == OpKind::ArgMax { ReduceOp::ArgMax { last } } else { ReduceOp::ArgMin { last } };
    let ct = ScalarType::of_storage(x.dtype);
    let mut b = cx.builder(0, types(cx, &[0])?);
    let out = b.out_index();
    let (vars, v) = lane(&mut b, &xd, &red, keep, &out, ct);
    let best = b.reduce(op, vars, v);
    let res = if ct.is_float() {
        // NaN beats every number: the first (last) NaN, if there is one.
        let (vars2, v2) = lane(&mut b, &xd, &red, keep, &out, ct);
        let isnan = b.unary(UnaryOp::IsNan, v2);
        let at = b.reduce(ReduceOp::ArgMax { last }, vars2, isnan);
        // Whether there is one: the maximum of `isnan` as 0 or 1 (not a load at `at`,
        // whose position no vector kernel can gather from: arg-reductions run a lane per
        // output position there).
        let (vars3, v3) = lane(&mut b, &xd, &red, keep, &out, ct);
        let isnan3 = b.unary(UnaryOp::IsNan, v3);
        let flag = b.cast(isnan3, DType::F32, false);
        let any = b.reduce(ReduceOp::Max, vars3, flag);
        let zero = b.float(ScalarType::F32, 0.0);
        let nan = b.binary(BinaryOp::Gt, any, zero);
        b.select(nan, at, best)
    } else {
        best
    };
    Ok(one(finish(b, res, &[0])?))
}

// ---------------------------------------------------------------------------
// Pools.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Pool {
    Avg,
    Max,
    Lp,
}

/// The windows of a pool over `xd` (`[N, C, spatial..]`), checked against result 0.
fn pool_window(cx: &OpCx<'_>, xd: &[usize]) -> R<Vec<WinDim>> {
    if xd.len() < 3 {
        return Err(cx.unsupported(format!("input of shape {xd:?}: [N, C, D1, ...] expected")));
    }
    let r = xd.len() - 2;
    let pa = cx.attrs::<PoolAttrs>()?;
    let kernel: Vec<usize> = match &pa.kernel_shape {
        Some(k) if k.len() == r && k.iter().all(|&v| (1..=1 << 24).contains(&v)) => {
            k.iter().map(|&v| v as usize).collect()
        }
        Some(k) => return Err(cx.unsupported(format!("kernel_shape {k:?} for {r} spatial dims"))),
        None => return Err(cx.unsupported("kernel_shape is missing")),
    };
    let ceil = pa.ceil_mode;
    let win = sliding_window(cx, &xd[2..], &kernel, ceil)?;
    let mut od = xd[..2].to_vec();
    od.extend(win.iter().map(|w| w.output));
    expect_out(cx, 0, &od)?;
    Ok(win)
}

/// The taps of a window: for output index `out` (`[n, c, o..]`) and window positions
/// `ks` (one per spatial dim), the input index and whether it lies inside the input
/// (`None`: provably always).
fn window_tap(b: &mut KernelBuilder, win: &[WinDim], out: &[ExprId], ks: &[ExprId]) -> (Vec<ExprId>, Option<ExprId>) {
    let mut idx = vec![out[0], out[1]];
    let mut valid = None;
    for (d, w) in win.iter().enumerate() {
        let t = w.tap(b, out[2 + d], ks[d]);
        if !w.inside() {
            let r = in_range(b, t, w.input);
            valid = Some(and(b, valid, r));
        }
        idx.push(t);
    }
    (idx, valid)
}

/// `(Σ |x|^p)^(1/p)` folded over `vars`.
fn lp_fold(b: &mut KernelBuilder, vars: Vec<VarId>, x: ExprId, p: i64) -> ExprId {
    let ct = b.ty(x);
    match p {
        1 => {
            let a = b.unary(UnaryOp::Abs, x);
            fold(b, ReduceOp::Sum, vars, a)
        }
        2 => {
            let sq = b.mul(x, x);
            let s = fold(b, ReduceOp::Sum, vars, sq);
            b.unary(UnaryOp::Sqrt, s)
        }
        _ => {
            let a = b.unary(UnaryOp::Abs, x);
            let pe = b.float(ct, p as f64);
            let ap = b.binary(BinaryOp::Pow, a, pe);
            let s = fold(b, ReduceOp::Sum, vars, ap);
            let inv = b.float(ct, 1.0 / p as f64);
            b.binary(BinaryOp::Pow, s, inv)
        }
    }
}

/// The `p` of LpPool / GlobalLpPool (positive).
fn lp_power(cx: &OpCx<'_>) -> R<i64> {
    let p = cx.attrs::<PoolAttrs>()?.p;
    if p <= 0 {
        return Err(cx.unsupported(format!("p = {p}")));
    }
    Ok(p)
}

fn pool(cx: &OpCx<'_>, kind: Pool) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = x.shape.dims().to_vec();
    let win = pool_window(cx, &xd)?;
    let ct = compute(x.dtype);
    if !ct.is_float() {
        return Err(cx.unsupported("float operand expected"));
    }
    let p = if kind == Pool::Lp { lp_power(cx)? } else { 1 };
    let include_pad = cx.attrs::<PoolAttrs>()?.count_include_pad;
    if cx.output_ty(0).shape.numel() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let mut b = cx.builder(0, types(cx, &[0])?);
    let out = b.out_index();
    let kvars: Vec<VarId> = win.iter().map(|w| b.new_var(w.kernel as u64)).collect();
    let ks: Vec<ExprId> = kvars.iter().map(|&v| b.var(v)).collect();
    let (idx, valid) = window_tap(&mut b, &win, &out, &ks);
    let bounds = if valid.is_some() { Bounds::Pad(0) } else { Bounds::InBounds };
    let xv = b.load_with(0, idx, bounds);
    let v = if kind == Pool::Lp {
        lp_fold(&mut b, kvars, xv, p)
    } else {
        let s = b.reduce(ReduceOp::Sum, kvars, xv);
        // Divisor: the whole kernel, or the taps inside the input (per dimension).
        let mut cnt: Option<ExprId> = None;
        let mut fixed: i64 = 1;
        for (d, w) in win.iter().enumerate() {
            if include_pad || w.inside() {
                fixed *= w.kernel as i64;
                continue;
            }
            let kv = b.new_var(w.kernel as u64);
            let k = b.var(kv);
            let t = w.tap(&mut b, out[2 + d], k);
            let inr = in_range(&mut b, t, w.input);
            let unit = b.index(1);
            let zero = b.index(0);
            let c = b.select(inr, unit, zero);
            let c = b.reduce(ReduceOp::Sum, vec![kv], c);
            cnt = Some(match cnt {
                None => c,
                Some(a) => b.mul(a, c),
            });
        }
        let f = b.index(fixed);
        let n = match cnt {
            None => f,
            Some(c) if fixed == 1 => c,
            Some(c) => b.mul(c, f),
        };
        let n = b.convert(n, ct);
        b.div(s, n)
    };
    Ok(one(finish(b, v, &[0])?))
}

/// Bits of the lowest value of `ct` (the identity of max).
fn lowest_bits(ct: ScalarType) -> u64 {
    if ct.is_float() {
        ct.bits_of_f64(f64::NEG_INFINITY)
    } else {
        ct.wrap(ct.int_range().0 as u64)
    }
}

/// The pool maximum of the window at `out`, NaN ignored (a fold over fresh variables).
fn window_max(b: &mut KernelBuilder, win: &[WinDim], out: &[ExprId], ct: ScalarType) -> ExprId {
    let kvars: Vec<VarId> = win.iter().map(|w| b.new_var(w.kernel as u64)).collect();
    let ks: Vec<ExprId> = kvars.iter().map(|&v| b.var(v)).collect();
    let (idx, valid) = window_tap(b, win, out, &ks);
    let lo_bits = lowest_bits(ct);
    let lo = b.constant(ct, lo_bits);
    let bounds = if valid.is_some() { Bounds::Pad(lo_bits) } else { Bounds::InBounds };
    let xv = b.load_with(0, idx, bounds);
    let key = if ct.is_float() {
        let nan = b.unary(UnaryOp::IsNan, xv);
        b.select(nan, lo, xv)
    } else {
        xv
    };
    b.reduce(ReduceOp::Max, kvars, key)
}

fn max_pool(cx: &OpCx<'_>) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = x.shape.dims().to_vec();
    let win = pool_window(cx, &xd)?;
    let ct = ScalarType::of_storage(x.dtype);
    if ct == ScalarType::Bool {
        return Err(cx.unsupported("bool operand"));
    }
    let nres = cx.outputs.len().min(2);
    if cx.output_ty(0).shape.numel() == 0 {
        let steps = (0..nres).map(|i| empty_step(cx, i).map(|s| (s.kernel, s.operands))).collect::<R<Vec<_>>>()?;
        return Ok(Lowered::per_output(steps));
    }
    let mut kernels = Vec::with_capacity(nres);
    // Values.
    {
        let mut b = cx.builder(0, types(cx, &[0])?);
        let out = b.out_index();
        let m = window_max(&mut b, &win, &out, ct);
        let s = finish(b, m, &[0])?;
        kernels.push((s.kernel, s.operands));
    }
    if nres > 1 {
        if cx.output_ty(1).shape.dims() != cx.output_ty(0).shape.dims() {
            return Err(cx.unsupported("Indices and values differ in shape"));
        }
        let col_major = cx.attrs::<PoolAttrs>()?.storage_order;
        let mut b = cx.builder(1, types(cx, &[0])?);
        let out = b.out_index();
        let m = window_max(&mut b, &win, &out, ct);
        let kernel: Vec<usize> = win.iter().map(|w| w.kernel).collect();
        let taps: usize = kernel.iter().product();
        let lo_bits = lowest_bits(ct);
        // Is the tap at flat window position `w` inside and equal to the maximum? A `w`
        // computed from data is loaded with padding (it is in range, but not provably).
        let hit = |b: &mut KernelBuilder, w: ExprId, from_data: bool| -> (ExprId, Vec<ExprId>) {
            let ks = if kernel.len() == 1 { vec![w] } else { unflatten(b, &kernel, w) };
            let (idx, valid) = window_tap(b, &win, &out, &ks);
            let bounds = if valid.is_some() || from_data { Bounds::Pad(lo_bits) } else { Bounds::InBounds };
            let xv = b.load_with(0, idx.clone(), bounds);
            let eq = b.binary(BinaryOp::Eq, xv, m);
            (and(b, valid, eq), idx)
        };
        let wv = b.new_var(taps as u64);
        let w = b.var(wv);
        let (flag, _) = hit(&mut b, w, false);
        let at = b.reduce(ReduceOp::ArgMax { last: false }, vec![wv], flag);
        let (found, idx) = hit(&mut b, at, true);
        // The flat input index, with the batch and channel offset.
        let sp = &xd[2..];
        let in_sz: i64 = sp.iter().product::<usize>() as i64;
        let within = if col_major {
            let mut acc = b.index(0);
            let mut stride = 1i64;
            for (d, &e) in idx[2..].iter().enumerate() {
                let s = b.index(stride);
                let t = b.mul(e, s);
                acc = b.add(acc, t);
                stride *= sp[d] as i64;
            }
            acc
        } else {
            flat_index(&mut b, sp, &idx[2..])
        };
        let cc = b.index(xd[1] as i64);
        let nc = b.mul(out[0], cc);
        let plane = b.add(nc, out[1]);
        let isz = b.index(in_sz);
        let base = b.mul(plane, isz);
        let flat = b.add(base, within);
        let none = b.index(-1);
        let v = b.select(found, flat, none);
        let s = finish(b, v, &[0])?;
        kernels.push((s.kernel, s.operands));
    }
    Ok(Lowered::per_output(kernels))
}

fn global_pool(cx: &OpCx<'_>, kind: Pool) -> R<Lowered> {
    let x = cx.input_ty(0)?;
    let xd = dims(cx, 0)?;
    if xd.len() < 3 {
        return Err(cx.unsupported(format!("input of shape {xd:?}: [N, C, D1, ...] expected")));
    }
    let mut od = xd[..2].to_vec();
    od.resize(xd.len(), 1);
    expect_out(cx, 0, &od)?;
    let ct = compute(x.dtype);
    if !ct.is_float() {
        return Err(cx.unsupported("float operand expected"));
    }
    let p = if kind == Pool::Lp { lp_power(cx)? } else { 1 };
    if od.iter().product::<usize>() == 0 {
        return Ok(one(empty_step(cx, 0)?));
    }
    let sp = &xd[2..];
    let in_sz: usize = sp.iter().product();
    if in_sz == 0 {
        let mut b = cx.builder(0, Vec::new());
        let v = match kind {
            Pool::Avg => f64::NAN,
            Pool::Max => f64::NEG_INFINITY,
            Pool::Lp => 0.0,
        };
        let v = b.float(ct, v);
        return Ok(one(finish(b, v, &[])?));
    }
    let mut b = cx.builder(0, types(cx, &[0])?);
    let out = b.out_index();
    let vars: Vec<VarId> = sp.iter().map(|&n| b.new_var(n as u64)).collect();
    let mut idx = vec![out[0], out[1]];
    idx.extend(vars.iter().map(|&v| b.var(v)));
    let xv = b.load(0, idx);
    let v = match kind {
        Pool::Avg => {
            let s = b.reduce(ReduceOp::Sum, vars, xv);
            let n = b.float(ct, in_sz as f64);
            b.div(s, n)
        }
        Pool::Max => {
            let lo = b.float(ct, f64::NEG_INFINITY);
            let nan = b.unary(UnaryOp::IsNan, xv);
            let key = b.select(nan, lo, xv);
            b.reduce(ReduceOp::Max, vars, key)
        }
        Pool::Lp => lp_fold(&mut b, vars, xv, p),
    };
    Ok(one(finish(b, v, &[0])?))
}
