//! Affine copies as machine code (`iced-x86`): `out[q] = x[off(q)]` with in-bounds
//! loads, `off` affine in the output index and stepping one element along the output's
//! innermost axis, 4-byte elements (8-byte ones, i64, as pairs of them; 1-byte ones, an
//! integer convolution's 8-bit image, unrolled moves or a `rep movsb` a row; short rows
//! at a step other than 1, a strided convolution's, a byte at a time) — the column gathers a convolution with narrow
//! windows reads (`kiln_flow::layout`'s im2col: `cols[c, kh, kw, oh, ow] = x[n, c, oh +
//! kh, ow + kw]`), slices, concatenation pieces and broadcasts of rows.
//!
//! Every output row (all output dimensions but the innermost) is one contiguous run of
//! the input. A workgroup is one row, as for general kernels. Only the first row of a
//! range is decoded (one division per outer dimension); after it the row coordinates
//! step like an odometer, moving the source pointer by constant strides. Each row is
//! copied 8 lanes at a time; its last, partial vector is read masked (nothing past the
//! run is read) but stored whole, its extra lanes landing in the next row, which is
//! written after it — except in the range's last row, stored masked (the next row may
//! be another thread's). The general code generator decodes every row with divisions
//! and runs four lanes.

use iced_x86::code_asm::*;
use kiln_flow::affine::load_offset;
use kiln_flow::{Bounds, Expr, Kernel};

use super::asm::{divide_out, end_rows, leaf_row_loop, leaf_row_next, leaf_row_registers, RowKernel, COORD};
use super::gemm::{no, NotHere, R};

/// Shortest row worth a row of its own (shorter ones stay general).
const MIN_ROW: i64 = 4;

/// A recognised copy.
struct Copy {
    /// Output dims.
    dims: Vec<i64>,
    /// Source element offset: constant, and per outer output dimension.
    c: i64,
    coef: Vec<i64>,
    /// Source elements between consecutive elements of a row (1 but for [`recognise_bytes`]).
    step: i64,
}

fn recognise(k: &Kernel) -> R<Copy> {
    let Expr::Load { input: 0, index, bounds: Bounds::InBounds } = &k.node(k.root).expr else {
        return no("not a copy");
    };
    let (x, o) = (&k.inputs[0], &k.output);
    // 8-byte elements (i64 index tensors) move as pairs of 4-byte units.
    let units = match x.dtype.storage_bytes(1) {
        4 => 1,
        8 => 2,
        _ => 0,
    };
    if k.inputs.len() != 1 || x.dtype != o.dtype || units == 0 {
        return no("not a 4- or 8-byte copy of one input");
    }
    let rank = o.shape.rank();
    if rank < 2 || rank - 1 > COORD.len() || o.shape.numel() == 0 {
        return no("a copy of another rank");
    }
    let limit = i32::MAX as usize;
    if x.storage_bytes() > limit || o.storage_bytes() > limit {
        return no("an operand over 2 GiB");
    }
    let mut dims: Vec<i64> = o.shape.dims().iter().map(|&d| d as i64).collect();
    dims[rank - 1] *= units;
    if dims[rank - 1] < MIN_ROW {
        return no("rows shorter than 4 elements");
    }
    let off = load_offset(k, 0, index).ok_or_else(|| NotHere("a non-affine copy index".into()))?;
    // Only output variables, the innermost with step 1.
    if off.coef.iter().enumerate().any(|(v, &c)| v >= rank && c != 0 && k.vars[v] > 1) || off.of((rank - 1) as u32) != 1
    {
        return no("a copy that does not run along the output's rows");
    }
    let coef: Vec<i64> = (0..rank - 1).map(|d| if dims[d] > 1 { off.of(d as u32) * units } else { 0 }).collect();
    let c = off.c * units;
    for &c in coef.iter().chain([&c]) {
        if c.checked_mul(4).is_none_or(|b| b.unsigned_abs() > limit as u64) {
            return no("a copy stride over 2 GiB");
        }
    }
    Ok(Copy { dims, c, coef, step: 1 })
}

/// Emits `k` as an affine copy (code and workgroup count), or says why not.
pub(crate) fn emit(k: &Kernel) -> R<(Vec<u8>, u64)> {
    if let Some(p) = recognise_bytes(k) {
        return emit_bytes(&p);
    }
    let p = recognise(k)?;
    let RowKernel { mut a, t, done, outer, w, full, tail, rows } = RowKernel::begin(&p.dims)?;
    // Source: x + (c + Σ coef·q)·4.
    a.lea(rsi, qword_ptr(r8 + (p.c * 4) as i32))?;
    for d in 0..outer {
        if p.coef[d] != 0 {
            a.imul_3(rdx, COORD[d], (p.coef[d] * 4) as i32)?;
            a.add(rsi, rdx)?;
        }
    }
    // One row: whole vectors, then the tail read masked and stored whole (`last`:
    // stored masked).
    let row = |a: &mut CodeAssembler, last: bool| -> R<()> {
        for v in 0..full as i32 {
            a.vmovups(ymm0, ymmword_ptr(rsi + 32 * v))?;
            a.vmovups(ymmword_ptr(rdi + 32 * v), ymm0)?;
        }
        if tail > 0 {
            let at = 32 * full as i32;
            a.vmaskmovps(ymm0, ymm15, ymmword_ptr(rsi + at))?;
            if last {
                a.vmaskmovps(ymmword_ptr(rdi + at), ymm15, ymm0)?;
            } else {
                a.vmovups(ymmword_ptr(rdi + at), ymm0)?;
            }
        }
        Ok(())
    };
    let mut top = a.create_label();
    let mut last = a.create_label();
    a.set_label(&mut top)?;
    a.lea(rax, qword_ptr(r10 + 1))?;
    a.cmp(rax, r11)?;
    a.jae(last)?;
    row(&mut a, false)?;
    a.add(rdi, (w * 4) as i32)?;
    a.inc(r10)?;
    // The odometer: the innermost outer coordinate steps; at its extent it returns to
    // 0 and the next one steps.
    for d in (0..outer).rev() {
        a.inc(COORD[d])?;
        if p.coef[d] != 0 {
            a.add(rsi, (p.coef[d] * 4) as i32)?;
        }
        if d == 0 {
            // (The row count ends the loop before the outermost wraps.)
            a.jmp(top)?;
            break;
        }
        a.cmp(COORD[d], p.dims[d] as i32)?;
        a.jb(top)?;
        a.xor(COORD[d], COORD[d])?;
        if p.coef[d] != 0 {
            let back = p.coef[d] * p.dims[d] * 4;
            let back = i32::try_from(back).map_err(|_| NotHere("a copy stride over 2 GiB".into()))?;
            a.sub(rsi, back)?;
        }
    }
    a.set_label(&mut last)?;
    row(&mut a, true)?;
    end_rows(a, &t, done, rows)
}

/// A copy of 1-byte elements (i8, u8, bool) whose rows are contiguous runs of the input,
/// as [`recognise`] takes 4-byte ones (offsets in bytes), or rows of at most
/// [`STRIDED_MOST`] bytes at another step (a strided integer convolution's columns);
/// `None` for anything else.
fn recognise_bytes(k: &Kernel) -> Option<Copy> {
    let Expr::Load { input: 0, index, bounds: Bounds::InBounds } = &k.node(k.root).expr else { return None };
    let (x, o) = (k.inputs.first()?, &k.output);
    if k.inputs.len() != 1 || x.dtype != o.dtype || x.dtype.storage_bytes(1) != 1 || x.dtype.is_packed() {
        return None;
    }
    let rank = o.shape.rank();
    let limit = i32::MAX as usize;
    if rank < 2 || o.shape.numel() == 0 || x.storage_bytes() > limit || o.storage_bytes() > limit {
        return None;
    }
    let dims: Vec<i64> = o.shape.dims().iter().map(|&d| d as i64).collect();
    let off = load_offset(k, 0, index)?;
    // Rows read at a step other than 1 (a strided convolution's columns) move byte by
    // byte, so only short ones.
    let step = off.of((rank - 1) as u32);
    let w = dims[rank - 1];
    if off.coef.iter().enumerate().any(|(v, &c)| v >= rank && c != 0 && k.vars[v] > 1)
        || (step != 1 && (w > STRIDED_MOST || rank - 1 > COORD.len()))
    {
        return None;
    }
    let coef: Vec<i64> = (0..rank - 1).map(|d| if dims[d] > 1 { off.of(d as u32) } else { 0 }).collect();
    let reach = step.checked_mul(w).map_or(u64::MAX, |r| r.unsigned_abs());
    if coef.iter().chain([&off.c]).any(|c| c.unsigned_abs() > limit as u64) || reach > limit as u64 {
        return None;
    }
    Some(Copy { dims, c: off.c, coef, step })
}

/// Rows of at least this many bytes move by `rep movsb`; shorter ones by unrolled
/// moves (its start-up cost, with a division per outer dimension to decode each row,
/// was about 9 ns a row: efficientword's im2col of 2-byte rows, 21870 of them, took
/// 0.2 ms).
const REP_MOVSB_BYTES: i64 = 256;

/// Longest row of a 1-byte copy whose row steps other than 1 element (moved a byte at
/// a time, unrolled).
const STRIDED_MOST: i64 = 32;

/// Emits a 1-byte copy ([`recognise_bytes`]) as the 4-byte copy runs: only the range's
/// first row decoded, the others stepping like an odometer; each row of `w` bytes moved
/// by straight-line moves of 32, 16, 8, 4, 2 and 1 bytes (`w` is known here; nothing
/// past the row is read or written), or by `rep movsb` from [`REP_MOVSB_BYTES`]; a row
/// read at another step (a strided convolution's columns) a byte at a time. More
/// outer dimensions than the odometer holds: [`emit_bytes_decoded`].
fn emit_bytes(p: &Copy) -> R<(Vec<u8>, u64)> {
    let rank = p.dims.len();
    let outer = rank - 1;
    let back: Option<Vec<i32>> = (0..outer).map(|d| i32::try_from(p.coef[d] * p.dims[d]).ok()).collect();
    let (Some(back), true) = (back, outer <= COORD.len()) else {
        return if p.step == 1 { emit_bytes_decoded(p) } else { no("a strided byte copy stride over 2 GiB") };
    };
    let RowKernel { mut a, t, done, w, rows, .. } = RowKernel::begin(&p.dims)?;
    // Destination: out + row·w (`begin` set it for 4-byte elements).
    a.imul_3(rdi, r10, w as i32)?;
    a.add(rdi, r9)?;
    // Source: x + c + Σ coef·q.
    a.lea(rsi, qword_ptr(r8 + p.c as i32))?;
    for (&q, &coef) in COORD.iter().zip(&p.coef[..outer]) {
        if coef != 0 {
            a.imul_3(rdx, q, coef as i32)?;
            a.add(rsi, rdx)?;
        }
    }
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    if p.step != 1 {
        // (`recognise_bytes` bounds `w · step` within 2 GiB.)
        for j in 0..w {
            a.movzx(eax, byte_ptr(rsi + (j * p.step) as i32))?;
            a.mov(byte_ptr(rdi + j as i32), al)?;
        }
        a.add(rdi, w as i32)?;
    } else if w >= REP_MOVSB_BYTES {
        // (`rep movsb` leaves rdi at the next row's start.)
        a.mov(rdx, rsi)?;
        a.mov(ecx, w as i32)?;
        a.rep().movsb()?;
        a.mov(rsi, rdx)?;
    } else {
        // Widest first: after the 32-byte moves fewer than 32 bytes are left, so each
        // narrower move runs at most once.
        let mut at = 0i32;
        let w = w as i32;
        for size in [32, 16, 8, 4, 2, 1] {
            while w - at >= size {
                move_bytes(&mut a, size, at)?;
                at += size;
            }
        }
        a.add(rdi, w)?;
    }
    a.inc(r10)?;
    a.cmp(r10, r11)?;
    a.jae(done)?;
    // The odometer, as in [`emit`].
    for d in (0..outer).rev() {
        a.inc(COORD[d])?;
        if p.coef[d] != 0 {
            a.add(rsi, p.coef[d] as i32)?;
        }
        if d == 0 {
            break;
        }
        a.cmp(COORD[d], p.dims[d] as i32)?;
        a.jb(top)?;
        a.xor(COORD[d], COORD[d])?;
        if p.coef[d] != 0 {
            a.sub(rsi, back[d])?;
        }
    }
    a.jmp(top)?;
    end_rows(a, &t, done, rows)
}

/// Moves `size` bytes (32, 16, 8, 4, 2 or 1) from `rsi + at` to `rdi + at`, through
/// `ymm0`/`xmm0` or `rax`.
fn move_bytes(a: &mut CodeAssembler, size: i32, at: i32) -> R<()> {
    match size {
        32 => {
            a.vmovdqu(ymm0, ymmword_ptr(rsi + at))?;
            a.vmovdqu(ymmword_ptr(rdi + at), ymm0)?;
        }
        16 => {
            a.vmovdqu(xmm0, xmmword_ptr(rsi + at))?;
            a.vmovdqu(xmmword_ptr(rdi + at), xmm0)?;
        }
        8 => {
            a.mov(rax, qword_ptr(rsi + at))?;
            a.mov(qword_ptr(rdi + at), rax)?;
        }
        4 => {
            a.mov(eax, dword_ptr(rsi + at))?;
            a.mov(dword_ptr(rdi + at), eax)?;
        }
        2 => {
            a.mov(ax, word_ptr(rsi + at))?;
            a.mov(word_ptr(rdi + at), ax)?;
        }
        _ => {
            a.mov(al, byte_ptr(rsi + at))?;
            a.mov(byte_ptr(rdi + at), al)?;
        }
    }
    Ok(())
}

/// Emits a 1-byte copy ([`recognise_bytes`]) of more outer dimensions than the odometer
/// holds: per row, its source decoded (one division per outer dimension) and the run
/// moved by `rep movsb`.
fn emit_bytes_decoded(p: &Copy) -> R<(Vec<u8>, u64)> {
    let rank = p.dims.len();
    let w = p.dims[rank - 1];
    let rows: i64 = p.dims[..rank - 1].iter().product();
    let mut a = CodeAssembler::new(64)?;
    leaf_row_registers(&mut a, rows)?;
    let (top, mut done) = leaf_row_loop(&mut a)?;
    a.imul_3(rdi, r10, w as i32)?;
    a.add(rdi, r9)?;
    a.lea(rsi, qword_ptr(r8 + p.c as i32))?;
    a.mov(rax, r10)?;
    divide_out(&mut a, &p.dims[..rank - 1], |a, d| {
        if p.coef[d] != 0 {
            a.imul_3(rdx, rdx, p.coef[d] as i32)?;
            a.add(rsi, rdx)?;
        }
        Ok(())
    })?;
    a.mov(ecx, w as i32)?;
    a.rep().movsb()?;
    leaf_row_next(&mut a, top)?;
    a.set_label(&mut done)?;
    a.ret()?;
    Ok((a.assemble(0)?, rows as u64))
}
