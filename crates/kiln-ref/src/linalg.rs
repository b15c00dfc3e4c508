//! Contractions: MatMul, MatMulInteger, QLinearMatMul, Gemm, Einsum and Det.
//!
//! Float contractions accumulate in `f64` through [`gemm_acc`], a cache-blocked
//! i-k-j product over contiguous row slices whose inner loop vectorises (Conv,
//! ConvTranspose and the recurrent layers use it too). Integer MatMul computes in
//! `i64` with wrapping arithmetic, which equals the result dtype's wrapping
//! arithmetic after the final truncation. MatMulInteger and QLinearMatMul subtract
//! the zero points first and multiply the differences in `f64`: every product is
//! below 2^16 in magnitude, so sums are exact for any K below 2^37.
//!
//! Choices where ONNX is loose:
//! - QLinearMatMul scales and zero points may be per tensor (one element) or per
//!   row of `a` / `y` (M elements) and per column of `b` (N elements); the result is
//!   `round_half_even(acc · (a_scale·b_scale / y_scale)) + y_zero_point`,
//!   saturated (a float result dtype skips the integer rounding), computed for integer
//!   operands in f32 as ONNX Runtime does (`f32(acc)`, the scale in f32).
//! - Einsum lets any dimension of size 1 broadcast against the same label's size
//!   elsewhere; ellipsis dimensions left out of an explicit output are summed.
//! - Det of a singular matrix is exactly 0 (a zero pivot stops the elimination).

use crate::elementwise::{read_f64, read_i64, write_f64};
use crate::util::{broadcast_dims, broadcast_map, row_major_strides, Cx};
use crate::EvalError;
use kiln_ir::attrs::{EinsumAttrs, GemmAttrs};
use kiln_ir::{DType, OpKind, Tensor, TensorType};

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    use OpKind::*;
    match cx.kind() {
        MatMul => Ok(vec![matmul(cx)?]),
        MatMulInteger => Ok(vec![matmul_integer(cx)?]),
        QLinearMatMul => Ok(vec![qlinear_matmul(cx)?]),
        Gemm => Ok(vec![gemm(cx)?]),
        Einsum => Ok(vec![einsum(cx)?]),
        Det => Ok(vec![det(cx)?]),
        _ => Err(cx.unsupported("not a contraction")),
    }
}

// ---------------------------------------------------------------------------
// Reading operands.
// ---------------------------------------------------------------------------

/// Every element as `f64`, like `read_f64`, with a fast path for `f32` and `f64`
/// that decodes the bytes here (this crate is built optimised; large weight
/// tensors make the difference).
pub(crate) fn floats(cx: &Cx, t: &Tensor) -> Result<Vec<f64>, EvalError> {
    let b: &[u8] = t.bytes().as_ref();
    match t.dtype() {
        DType::F32 => Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()),
        DType::F64 => Ok(b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
            .collect()),
        _ => read_f64(cx, t),
    }
}

// ---------------------------------------------------------------------------
// The f64 kernel.
// ---------------------------------------------------------------------------

/// Rows of `b` per block: a `KC × NC` block of `b` stays in the L2 cache.
const KC: usize = 128;
/// Columns per block; also the longest inner loop.
const NC: usize = 512;

/// `c += a · b` for row-major `a` (`m × k`, row stride `lda`), `b` (`k × n`, row
/// stride `ldb`) and `c` (`m × n`, row stride `ldc`). The slices must hold the
/// rows the strides address (the last row needs only its used columns).
///
/// Loop order: blocks of `NC` columns and `KC` rows of `b`, then each row of `a`,
/// then four rows of `b` at a time, then the columns: the innermost loop zips
/// contiguous slices, so it vectorises and does no bounds checks.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_acc(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    lda: usize,
    b: &[f64],
    ldb: usize,
    c: &mut [f64],
    ldc: usize,
) {
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    let mut j0 = 0;
    while j0 < n {
        let nb = NC.min(n - j0);
        let mut k0 = 0;
        while k0 < k {
            let kb = KC.min(k - k0);
            for i in 0..m {
                let arow = &a[i * lda + k0..i * lda + k0 + kb];
                let crow = &mut c[i * ldc + j0..i * ldc + j0 + nb];
                let brow = |kk: usize| &b[(k0 + kk) * ldb + j0..(k0 + kk) * ldb + j0 + nb];
                let mut kk = 0;
                while kk + 4 <= kb {
                    let (a0, a1, a2, a3) = (arow[kk], arow[kk + 1], arow[kk + 2], arow[kk + 3]);
                    let (b0, b1, b2, b3) = (brow(kk), brow(kk + 1), brow(kk + 2), brow(kk + 3));
                    for ((((cv, &x0), &x1), &x2), &x3) in crow.iter_mut().zip(b0).zip(b1).zip(b2).zip(b3) {
                        *cv += a0 * x0 + a1 * x1 + a2 * x2 + a3 * x3;
                    }
                    kk += 4;
                }
                while kk < kb {
                    let a0 = arow[kk];
                    for (cv, &x0) in crow.iter_mut().zip(brow(kk)) {
                        *cv += a0 * x0;
                    }
                    kk += 1;
                }
            }
            k0 += kb;
        }
        j0 += nb;
    }
}

/// `c += a · bᵀ` for row-major `a` (`m × k`), `b` (`n × k`) and `c` (`m × n`), all
/// dense, where row `j` of `b` is decoded on demand by `b_row(j, buf)`: one dot
/// product of contiguous rows per result, `b` streamed once with no copy of it
/// (best when `m` is small). Eight partial sums (a fixed order, so results are
/// deterministic) let the loop vectorise.
pub(crate) fn gemm_nt(
    m: usize,
    n: usize,
    k: usize,
    a: &[f64],
    mut b_row: impl FnMut(usize, &mut [f64]),
    c: &mut [f64],
) {
    let mut brow = vec![0.0; k];
    for j in 0..n {
        b_row(j, &mut brow);
        for i in 0..m {
            let arow = &a[i * k..(i + 1) * k];
            let mut acc = [0.0f64; 8];
            let (a8, b8) = (arow.chunks_exact(8), brow.chunks_exact(8));
            let (ar, br) = (a8.remainder(), b8.remainder());
            for (x, y) in a8.zip(b8) {
                for l in 0..8 {
                    acc[l] += x[l] * y[l];
                }
            }
            let mut s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            for (x, y) in ar.iter().zip(br) {
                s += x * y;
            }
            c[i * n + j] += s;
        }
    }
}

/// The transpose of the row-major `rows × cols` matrix `a`.
pub(crate) fn transpose(a: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    let mut t = vec![0.0; rows * cols];
    // Blocks of 32×32 keep both sides in cache.
    const B: usize = 32;
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            for r in r0..(r0 + B).min(rows) {
                for c in c0..(c0 + B).min(cols) {
                    t[c * rows + r] = a[r * cols + c];
                }
            }
        }
    }
    t
}

/// `c += a · b` in wrapping `i64` (integer MatMul), same layout as [`gemm_acc`]
/// with dense strides.
fn gemm_i64(m: usize, n: usize, k: usize, a: &[i64], b: &[i64], c: &mut [i64]) {
    for i in 0..m {
        let crow = &mut c[i * n..(i + 1) * n];
        for kk in 0..k {
            let av = a[i * k + kk];
            for (cv, &bv) in crow.iter_mut().zip(&b[kk * n..(kk + 1) * n]) {
                *cv = cv.wrapping_add(av.wrapping_mul(bv));
            }
        }
    }
}

// ---------------------------------------------------------------------------
// MatMul family.
// ---------------------------------------------------------------------------

/// The numpy matmul geometry of operands with dims `ad` and `bd`.
struct MatMulShape {
    /// Broadcast batch dims.
    batch: Vec<usize>,
    m: usize,
    k: usize,
    n: usize,
    /// For each batch index, the matrix index into `a` and into `b`.
    a_map: Vec<usize>,
    b_map: Vec<usize>,
    /// The result dims (1-D operands' promoted axes removed).
    out: Vec<usize>,
}

fn matmul_shape(cx: &Cx, ad: &[usize], bd: &[usize]) -> Result<MatMulShape, EvalError> {
    if ad.is_empty() || bd.is_empty() {
        return Err(cx.invalid("MatMul operands must have rank 1 or more"));
    }
    // 1-D a is a row vector [1, K]; 1-D b a column vector [K, 1].
    let a2: Vec<usize> = if ad.len() == 1 { vec![1, ad[0]] } else { ad.to_vec() };
    let b2: Vec<usize> = if bd.len() == 1 { vec![bd[0], 1] } else { bd.to_vec() };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let (k2, n) = (b2[b2.len() - 2], b2[b2.len() - 1]);
    if k != k2 {
        return Err(cx.invalid(format!("inner dimensions differ: {ad:?} × {bd:?}")));
    }
    let ab = &a2[..a2.len() - 2];
    let bb = &b2[..b2.len() - 2];
    let batch = broadcast_dims(&[ab, bb])
        .ok_or_else(|| cx.invalid(format!("batch dimensions of {ad:?} and {bd:?} do not broadcast")))?;
    let a_map = broadcast_map(ab, &batch);
    let b_map = broadcast_map(bb, &batch);
    let mut out = batch.clone();
    if ad.len() > 1 {
        out.push(m);
    }
    if bd.len() > 1 {
        out.push(n);
    }
    Ok(MatMulShape { batch, m, k, n, a_map, b_map, out })
}

/// Checks that the result type has `dims`.
fn check_out(cx: &Cx, ty: &TensorType, dims: &[usize]) -> Result<(), EvalError> {
    if ty.shape.dims() != dims {
        return Err(cx.invalid(format!("result shape {:?} expected, result type says {ty}", dims)));
    }
    Ok(())
}

/// The batched f64 product of `av` and `bv` with geometry `g`.
fn matmul_f64(g: &MatMulShape, av: &[f64], bv: &[f64]) -> Vec<f64> {
    let (m, k, n) = (g.m, g.k, g.n);
    let nb: usize = g.batch.iter().product();
    let mut out = vec![0.0; nb * m * n];
    for bi in 0..nb {
        let a = &av[g.a_map[bi] * m * k..][..m * k];
        let b = &bv[g.b_map[bi] * k * n..][..k * n];
        gemm_acc(m, n, k, a, k, b, n, &mut out[bi * m * n..][..m * n], n);
    }
    out
}

fn matmul(cx: &Cx) -> Result<Tensor, EvalError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let ty = cx.out_type(0)?;
    let g = matmul_shape(cx, a.shape().dims(), b.shape().dims())?;
    check_out(cx, ty, &g.out)?;
    if ty.dtype.is_float() {
        let out = matmul_f64(&g, &floats(cx, a)?, &floats(cx, b)?);
        write_f64(cx, ty, &out)
    } else if ty.dtype.is_int() {
        let (av, bv) = (read_i64(cx, a)?, read_i64(cx, b)?);
        let (m, k, n) = (g.m, g.k, g.n);
        let nb: usize = g.batch.iter().product();
        let mut out = vec![0i64; nb * m * n];
        for bi in 0..nb {
            let a = &av[g.a_map[bi] * m * k..][..m * k];
            let b = &bv[g.b_map[bi] * k * n..][..k * n];
            gemm_i64(m, n, k, a, b, &mut out[bi * m * n..][..m * n]);
        }
        cx.from_i64(ty, &out)
    } else {
        Err(cx.invalid(format!("{} result", ty.dtype)))
    }
}

/// Checks a quantised (8-bit integer) operand.
fn check_q8(cx: &Cx, t: &Tensor, what: &str) -> Result<(), EvalError> {
    match t.dtype() {
        DType::U8 | DType::I8 => Ok(()),
        d => Err(cx.invalid(format!("{what} has dtype {d}, u8 or i8 expected"))),
    }
}

/// Operand `zi`, the optional zero point of the quantised operand `t`, when given: it
/// must have `t`'s dtype.
pub(crate) fn zero_point<'a>(cx: &Cx<'a>, t: &Tensor, zi: usize) -> Result<Option<&'a Tensor>, EvalError> {
    let Some(z) = cx.opt_input(zi) else { return Ok(None) };
    if z.dtype() != t.dtype() {
        return Err(cx.invalid(format!("zero point dtype {} differs from {}", z.dtype(), t.dtype())));
    }
    Ok(Some(z))
}

/// `x − zp` in f64, where the zero point (operand `zi`, optional) is one value, a
/// 1-D tensor per row (`rowwise`: `[M]` read as `[M, 1]`) or per column (`[N]`),
/// or a tensor broadcasting to `x` unidirectionally (`[.., M, 1]`, `[.., 1, N]`).
fn minus_zero_point(cx: &Cx, x: &Tensor, zi: usize, rowwise: bool) -> Result<Vec<f64>, EvalError> {
    let xv = read_f64(cx, x)?;
    let Some(z) = zero_point(cx, x, zi)? else { return Ok(xv) };
    let zv = read_f64(cx, z)?;
    if zv.len() == 1 {
        return Ok(xv.into_iter().map(|v| v - zv[0]).collect());
    }
    let xd = x.shape().dims();
    let zd = z.shape().dims();
    // A 1-D zero point is per row of a ([M] as [M,1]) or per column of b ([N]).
    let zd: Vec<usize> = if zd.len() == 1 && rowwise { vec![zd[0], 1] } else { zd.to_vec() };
    if zd.len() > xd.len() || broadcast_dims(&[&zd, xd]).as_deref() != Some(xd) {
        return Err(cx.invalid(format!("zero point shape {:?} does not fit operand {xd:?}", z.shape().dims())));
    }
    let map = broadcast_map(&zd, xd);
    Ok(xv.iter().zip(map).map(|(&v, i)| v - zv[i]).collect())
}

fn matmul_integer(cx: &Cx) -> Result<Tensor, EvalError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    check_q8(cx, a, "A")?;
    check_q8(cx, b, "B")?;
    let ty = cx.out_type(0)?;
    if !ty.dtype.is_int() {
        return Err(cx.invalid(format!("{} result, i32 expected", ty.dtype)));
    }
    let g = matmul_shape(cx, a.shape().dims(), b.shape().dims())?;
    check_out(cx, ty, &g.out)?;
    let av = minus_zero_point(cx, a, 2, a.shape().rank() > 1)?;
    let bv = minus_zero_point(cx, b, 3, false)?;
    let out = matmul_f64(&g, &av, &bv);
    // Exact integers (see the module docs).
    let iv: Vec<i64> = out.iter().map(|&v| v as i64).collect();
    cx.from_i64(ty, &iv)
}

/// Per-tensor (one element) or per-`n` parameters of operand `i`.
fn qparam(cx: &Cx, i: usize, n: usize, what: &str) -> Result<Vec<f64>, EvalError> {
    let t = cx.input(i)?;
    let v = read_f64(cx, t)?;
    if v.len() == 1 || v.len() == n {
        Ok(v)
    } else {
        Err(cx.invalid(format!("{what} has {} elements, 1 or {n} expected", v.len())))
    }
}

/// `v` quantised into `ty`: integers round half to even and saturate; float
/// dtypes round once (saturating for the 8-bit floats).
pub(crate) fn requantize(cx: &Cx, ty: &TensorType, v: &mut [f64]) -> Result<Tensor, EvalError> {
    if ty.dtype.is_int() {
        for x in v.iter_mut() {
            *x = x.round_ties_even();
        }
    }
    write_f64(cx, ty, v)
}

fn qlinear_matmul(cx: &Cx) -> Result<Tensor, EvalError> {
    let (a, b) = (cx.input(0)?, cx.input(3)?);
    let ty = cx.out_type(0)?;
    let g = matmul_shape(cx, a.shape().dims(), b.shape().dims())?;
    check_out(cx, ty, &g.out)?;
    let (m, n) = (g.m, g.n);
    let a_s = qparam(cx, 1, m, "a_scale")?;
    let a_z = qparam(cx, 2, m, "a_zero_point")?;
    let b_s = qparam(cx, 4, n, "b_scale")?;
    let b_z = qparam(cx, 5, n, "b_zero_point")?;
    let y_s = qparam(cx, 6, m, "y_scale")?;
    let y_z = qparam(cx, 7, m, "y_zero_point")?;
    let pick = |v: &[f64], i: usize| if v.len() == 1 { v[0] } else { v[i] };
    let ak = a.shape().dims().last().copied().unwrap_or(1);
    let av: Vec<f64> =
        read_f64(cx, a)?.iter().enumerate().map(|(j, &x)| x - pick(&a_z, (j / ak.max(1)) % m.max(1))).collect();
    let bv: Vec<f64> = read_f64(cx, b)?.iter().enumerate().map(|(j, &x)| x - pick(&b_z, j % n.max(1))).collect();
    let mut out = matmul_f64(&g, &av, &bv);
    // Integer operands: ONNX Runtime's requantisation, the scale and the product with
    // the (exact) accumulator in f32; 8-bit float operands in f64.
    let int = a.dtype().is_int() && b.dtype().is_int();
    for (j, v) in out.iter_mut().enumerate() {
        let (row, col) = ((j / n.max(1)) % m.max(1), j % n.max(1));
        if int {
            let mult = (pick(&a_s, row) as f32 * pick(&b_s, col) as f32) / pick(&y_s, row) as f32;
            let mut x = *v as f32 * mult;
            if ty.dtype.is_int() {
                x = x.round_ties_even();
            }
            *v = (x + pick(&y_z, row) as f32) as f64;
        } else {
            let mult = pick(&a_s, row) * pick(&b_s, col) / pick(&y_s, row);
            *v *= mult;
            if ty.dtype.is_int() {
                *v = v.round_ties_even();
            }
            *v += pick(&y_z, row);
        }
    }
    write_f64(cx, ty, &out)
}

fn gemm(cx: &Cx) -> Result<Tensor, EvalError> {
    let (a, b) = (cx.input(0)?, cx.input(1)?);
    let ty = cx.out_type(0)?;
    let ga = cx.attrs::<GemmAttrs>()?;
    let (alpha, beta) = (ga.alpha as f64, ga.beta as f64);
    let (ta, tb) = (ga.trans_a, ga.trans_b);
    let (ad, bd) = (a.shape().dims(), b.shape().dims());
    if ad.len() != 2 || bd.len() != 2 {
        return Err(cx.invalid(format!("Gemm needs 2-D operands, got {ad:?} and {bd:?}")));
    }
    let (m, k) = if ta { (ad[1], ad[0]) } else { (ad[0], ad[1]) };
    let (k2, n) = if tb { (bd[1], bd[0]) } else { (bd[0], bd[1]) };
    if k != k2 {
        return Err(cx.invalid(format!("inner dimensions differ: {ad:?} × {bd:?} (transA={ta}, transB={tb})")));
    }
    check_out(cx, ty, &[m, n])?;
    let mut av = floats(cx, a)?;
    if ta {
        av = transpose(&av, k, m);
    }
    let mut acc = vec![0.0; m * n];
    if tb && m <= 8 {
        // Few rows (a fully connected layer on a small batch): dot products with
        // the rows of B beat transposing a large B; f32 weights stay f32.
        let raw: &[u8] = b.bytes().as_ref();
        if b.dtype() == DType::F32 {
            let row = |j: usize, buf: &mut [f64]| {
                for (d, c) in buf.iter_mut().zip(raw[j * k * 4..(j + 1) * k * 4].chunks_exact(4)) {
                    *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64;
                }
            };
            gemm_nt(m, n, k, &av, row, &mut acc);
        } else {
            let bv = floats(cx, b)?;
            gemm_nt(m, n, k, &av, |j, buf| buf.copy_from_slice(&bv[j * k..(j + 1) * k]), &mut acc);
        }
    } else {
        let bv = floats(cx, b)?;
        let bv = if tb { transpose(&bv, n, k) } else { bv };
        gemm_acc(m, n, k, &av, k, &bv, n, &mut acc, n);
    }
    for v in acc.iter_mut() {
        *v *= alpha;
    }
    if let Some(c) = cx.opt_input(2) {
        let cd = c.shape().dims();
        let out = [m, n];
        if cd.len() > 2 || broadcast_dims(&[cd, &out]).as_deref() != Some(&out[..]) {
            return Err(cx.invalid(format!("C of shape {cd:?} does not broadcast to [{m}, {n}]")));
        }
        let cv = floats(cx, c)?;
        for (v, i) in acc.iter_mut().zip(broadcast_map(cd, &out)) {
            *v += beta * cv[i];
        }
    }
    write_f64(cx, ty, &acc)
}

// ---------------------------------------------------------------------------
// Einsum.
// ---------------------------------------------------------------------------

/// One subscript of an Einsum term.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Sub {
    /// A letter, numbered in ASCII order (`A`..`Z` = 0..26, `a`..`z` = 26..52).
    Letter(usize),
    /// `...`.
    Ellipsis,
}

/// Label ids: letters 0..52, then ellipsis dimension `j` (left to right) is 52 + j.
const ELL: usize = 52;

fn parse_term(s: &str) -> Result<Vec<Sub>, String> {
    let mut subs = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            c @ b'A'..=b'Z' => subs.push(Sub::Letter((c - b'A') as usize)),
            c @ b'a'..=b'z' => subs.push(Sub::Letter(26 + (c - b'a') as usize)),
            b'.' => {
                if b.get(i..i + 3) != Some(b"...") {
                    return Err(format!("stray `.` in term `{s}`"));
                }
                if subs.contains(&Sub::Ellipsis) {
                    return Err(format!("two ellipses in term `{s}`"));
                }
                subs.push(Sub::Ellipsis);
                i += 2;
            }
            c if c.is_ascii_whitespace() => {}
            c => return Err(format!("unexpected character `{}` in term `{s}`", c as char)),
        }
        i += 1;
    }
    Ok(subs)
}

/// Expands a term to one label per axis of an operand of `rank` whose ellipsis
/// covers the last `ell_rank`-aligned ellipsis dims (ellipsis of width `w` uses
/// labels `ELL + E - w .. ELL + E`).
fn term_labels(subs: &[Sub], rank: usize, e_total: usize) -> Result<Vec<usize>, String> {
    let letters = subs.iter().filter(|s| matches!(s, Sub::Letter(_))).count();
    let has_ell = subs.contains(&Sub::Ellipsis);
    if (!has_ell && letters != rank) || letters > rank {
        return Err(format!("term has {letters} subscripts, operand has rank {rank}"));
    }
    let w = rank - letters;
    let mut out = Vec::with_capacity(rank);
    for s in subs {
        match *s {
            Sub::Letter(l) => out.push(l),
            Sub::Ellipsis => out.extend((e_total - w..e_total).map(|j| ELL + j)),
        }
    }
    Ok(out)
}

fn einsum(cx: &Cx) -> Result<Tensor, EvalError> {
    let eq = &cx.attrs::<EinsumAttrs>()?.equation;
    let ty = cx.out_type(0)?;
    let ops: Vec<&Tensor> = (0..cx.inputs.len()).map(|i| cx.input(i)).collect::<Result<_, _>>()?;
    let (lhs, rhs) = match eq.split_once("->") {
        Some((l, r)) => (l, Some(r)),
        None => (eq.as_str(), None),
    };
    let terms: Vec<Vec<Sub>> = lhs.split(',').map(parse_term).collect::<Result<_, _>>().map_err(|e| cx.invalid(e))?;
    if terms.len() != ops.len() {
        return Err(cx.invalid(format!("equation `{eq}` has {} terms for {} operands", terms.len(), ops.len())));
    }
    // Widest ellipsis.
    let mut e_total = 0;
    for (t, x) in terms.iter().zip(&ops) {
        let letters = t.iter().filter(|s| matches!(s, Sub::Letter(_))).count();
        if t.contains(&Sub::Ellipsis) {
            e_total = e_total.max(x.shape().rank().saturating_sub(letters));
        }
    }
    let labels: Vec<Vec<usize>> = terms
        .iter()
        .zip(&ops)
        .map(|(t, x)| term_labels(t, x.shape().rank(), e_total))
        .collect::<Result<_, _>>()
        .map_err(|e| cx.invalid(e))?;
    // Label sizes (size 1 broadcasts) and occurrence counts.
    let nl = ELL + e_total;
    let mut size: Vec<Option<usize>> = vec![None; nl];
    let mut count = vec![0usize; nl];
    for (ls, x) in labels.iter().zip(&ops) {
        for (&l, &d) in ls.iter().zip(x.shape().dims()) {
            count[l] += 1;
            size[l] = match size[l] {
                None => Some(d),
                Some(s) if s == d || d == 1 => Some(s),
                Some(1) => Some(d),
                Some(s) => {
                    return Err(cx.invalid(format!("label {} has sizes {s} and {d}", label_name(l))));
                }
            };
        }
    }
    // Output labels.
    let out_labels: Vec<usize> = match rhs {
        Some(r) => {
            let subs = parse_term(r).map_err(|e| cx.invalid(e))?;
            let mut v = Vec::new();
            for s in subs {
                match s {
                    Sub::Letter(l) => {
                        if count[l] == 0 {
                            return Err(cx.invalid(format!("output label {} is not in any input", label_name(l))));
                        }
                        if v.contains(&l) {
                            return Err(cx.invalid(format!("output label {} repeats", label_name(l))));
                        }
                        v.push(l);
                    }
                    Sub::Ellipsis => v.extend(ELL..ELL + e_total),
                }
            }
            v
        }
        None => (ELL..ELL + e_total).chain((0..ELL).filter(|&l| count[l] == 1)).collect(),
    };
    let sum_labels: Vec<usize> = (0..nl).filter(|&l| count[l] > 0 && !out_labels.contains(&l)).collect();
    let loop_labels: Vec<usize> = out_labels.iter().chain(&sum_labels).copied().collect();
    // Ellipsis dims that no operand has (e_total from one operand only) are size 1.
    let sizes: Vec<usize> = loop_labels.iter().map(|&l| size[l].unwrap_or(1)).collect();
    let out_dims: Vec<usize> = sizes[..out_labels.len()].to_vec();
    check_out(cx, ty, &out_dims)?;
    // Per operand, the stride of each loop label (repeated labels add up: diagonals;
    // a size-1 axis against a larger label broadcasts with stride 0).
    let strides: Vec<Vec<usize>> = labels
        .iter()
        .zip(&ops)
        .map(|(ls, x)| {
            let xd = x.shape().dims();
            let xs = row_major_strides(xd);
            loop_labels
                .iter()
                .zip(&sizes)
                .map(|(&l, &sz)| {
                    ls.iter()
                        .enumerate()
                        .filter(|&(ax, &al)| al == l && !(xd[ax] == 1 && sz != 1))
                        .map(|(ax, _)| xs[ax])
                        .sum()
                })
                .collect()
        })
        .collect();
    let n_out: usize = out_dims.iter().product();
    let n_sum: usize = sizes[out_labels.len()..].iter().product();
    let lp = EinsumLoop { strides, sizes, n_out, n_sum };
    if ty.dtype.is_float() {
        let vals: Vec<Vec<f64>> = ops.iter().map(|x| floats(cx, x)).collect::<Result<_, _>>()?;
        write_f64(cx, ty, &lp.run(&vals, 0.0, 1.0, |a, b| a * b, |a, b| a + b))
    } else if ty.dtype.is_int() {
        let vals: Vec<Vec<i64>> = ops.iter().map(|x| read_i64(cx, x)).collect::<Result<_, _>>()?;
        let out = lp.run(&vals, 0, 1, i64::wrapping_mul, i64::wrapping_add);
        cx.from_i64(ty, &out)
    } else {
        Err(cx.invalid(format!("{} result", ty.dtype)))
    }
}

fn label_name(l: usize) -> String {
    match l {
        0..=25 => ((b'A' + l as u8) as char).to_string(),
        26..=51 => ((b'a' + (l - 26) as u8) as char).to_string(),
        _ => format!("...[{}]", l - ELL),
    }
}

/// The loops of an einsum: every combination of loop-label values, output labels
/// outermost.
struct EinsumLoop {
    /// Per operand, the stride of each loop label.
    strides: Vec<Vec<usize>>,
    /// Extent of each loop label.
    sizes: Vec<usize>,
    /// Output elements (product of the output labels' extents).
    n_out: usize,
    /// Terms summed per output element (product of the summed labels' extents).
    n_sum: usize,
}

impl EinsumLoop {
    /// The sum of products over operands `vals` in the ring (`zero`, `one`, `mul`,
    /// `add`), with one running offset per operand.
    fn run<T: Copy>(
        &self,
        vals: &[Vec<T>],
        zero: T,
        one: T,
        mul: impl Fn(T, T) -> T,
        add: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        let (strides, sizes) = (&self.strides, &self.sizes);
        let mut out = vec![zero; self.n_out];
        if self.n_sum == 0 {
            return out;
        }
        let nl = sizes.len();
        let mut idx = vec![0usize; nl];
        let mut offs = vec![0usize; vals.len()];
        for o in out.iter_mut() {
            let mut acc = zero;
            for _ in 0..self.n_sum {
                let mut p = one;
                for (v, &off) in vals.iter().zip(&offs) {
                    p = mul(p, v[off]);
                }
                acc = add(acc, p);
                // Advance the odometer (last label fastest), keeping offsets in step.
                for d in (0..nl).rev() {
                    idx[d] += 1;
                    for (off, s) in offs.iter_mut().zip(strides) {
                        *off += s[d];
                    }
                    if idx[d] < sizes[d] {
                        break;
                    }
                    for (off, s) in offs.iter_mut().zip(strides) {
                        *off -= s[d] * idx[d];
                    }
                    idx[d] = 0;
                }
            }
            *o = acc;
        }
        out
    }
}

// ---------------------------------------------------------------------------
// Det.
// ---------------------------------------------------------------------------

fn det(cx: &Cx) -> Result<Tensor, EvalError> {
    let x = cx.input(0)?;
    let ty = cx.out_type(0)?;
    let xd = x.shape().dims();
    if xd.len() < 2 || xd[xd.len() - 1] != xd[xd.len() - 2] {
        return Err(cx.invalid(format!("Det needs [*, M, M], got {xd:?}")));
    }
    let n = xd[xd.len() - 1];
    check_out(cx, ty, &xd[..xd.len() - 2])?;
    let xv = floats(cx, x)?;
    let batch: usize = xd[..xd.len() - 2].iter().product();
    let out: Vec<f64> = (0..batch).map(|b| lu_det(&xv[b * n * n..(b + 1) * n * n], n)).collect();
    write_f64(cx, ty, &out)
}

/// Determinant of the `n × n` row-major matrix `m` by LU with partial pivoting.
pub(crate) fn lu_det(m: &[f64], n: usize) -> f64 {
    let mut a = m.to_vec();
    let mut det = 1.0;
    for col in 0..n {
        let mut p = col;
        for r in col + 1..n {
            if a[r * n + col].abs() > a[p * n + col].abs() {
                p = r;
            }
        }
        let pivot = a[p * n + col];
        if pivot == 0.0 {
            return 0.0;
        }
        if p != col {
            for c in 0..n {
                a.swap(p * n + c, col * n + c);
            }
            det = -det;
        }
        det *= pivot;
        let (top, rest) = a.split_at_mut((col + 1) * n);
        let prow = &top[col * n + col + 1..col * n + n];
        for r in rest.chunks_exact_mut(n) {
            let f = r[col] / pivot;
            for (x, &y) in r[col + 1..].iter_mut().zip(prow) {
                *x -= f * y;
            }
        }
    }
    det
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Small integers as f64, so every product and sum is exact.
    fn vals(n: usize, seed: usize) -> Vec<f64> {
        (0..n).map(|i| ((i * 7 + seed * 13) % 11) as f64 - 5.0).collect()
    }

    #[test]
    fn gemm_acc_with_strides_matches_loops() {
        // Submatrices of wider buffers: lda, ldb, ldc larger than the used widths,
        // sizes crossing the KC/NC blocks and the 4-row unrolling.
        let (m, n, k) = (3, NC + 37, KC + 6);
        let (lda, ldb, ldc) = (k + 3, n + 5, n + 2);
        let a = vals(m * lda, 1);
        let b = vals(k * ldb, 2);
        let mut c = vals(m * ldc, 3);
        let mut want = c.clone();
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    want[i * ldc + j] += a[i * lda + kk] * b[kk * ldb + j];
                }
            }
        }
        gemm_acc(m, n, k, &a, lda, &b, ldb, &mut c, ldc);
        assert_eq!(c, want);
    }

    #[test]
    fn gemm_nt_matches_loops() {
        let (m, n, k) = (3, 5, 19);
        let a = vals(m * k, 4);
        let b = vals(n * k, 5);
        let mut c = vec![1.0; m * n];
        gemm_nt(m, n, k, &a, |j, buf| buf.copy_from_slice(&b[j * k..(j + 1) * k]), &mut c);
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|kk| a[i * k + kk] * b[j * k + kk]).sum();
                assert_eq!(c[i * n + j], 1.0 + s);
            }
        }
    }

    #[test]
    fn transpose_round_trip() {
        let a = vals(37 * 45, 6);
        let t = transpose(&a, 37, 45);
        assert_eq!(t[3 * 37 + 2], a[2 * 45 + 3]);
        assert_eq!(transpose(&t, 45, 37), a);
    }

    #[test]
    fn det_of_every_4x4_permutation_is_its_sign() {
        // The sign of a permutation is (−1)^inversions.
        let n = 4;
        let mut perm: Vec<usize> = (0..n).collect();
        let mut count = 0;
        loop {
            let inversions =
                (0..n).flat_map(|i| (i + 1..n).map(move |j| (i, j))).filter(|&(i, j)| perm[i] > perm[j]).count();
            let mut m = vec![0.0; n * n];
            for (r, &c) in perm.iter().enumerate() {
                m[r * n + c] = 1.0;
            }
            let sign = if inversions % 2 == 0 { 1.0 } else { -1.0 };
            assert_eq!(lu_det(&m, n), sign, "{perm:?}");
            count += 1;
            // Next permutation in lexicographic order.
            let Some(i) = (0..n - 1).rev().find(|&i| perm[i] < perm[i + 1]) else { break };
            let j = (i + 1..n).rev().find(|&j| perm[j] > perm[i]).unwrap_or(i);
            perm.swap(i, j);
            perm[i + 1..].reverse();
        }
        assert_eq!(count, 24);
    }

    /// Timing of a 1024³ product (run with `--ignored --nocapture`).
    #[test]
    #[ignore]
    fn gemm_1024_timing() {
        let n = 1024;
        let a = vals(n * n, 7);
        let b = vals(n * n, 8);
        let mut c = vec![0.0; n * n];
        let t = std::time::Instant::now();
        gemm_acc(n, n, n, &a, n, &b, n, &mut c, n);
        eprintln!("1024^3 gemm: {:?}", t.elapsed());
    }
}
