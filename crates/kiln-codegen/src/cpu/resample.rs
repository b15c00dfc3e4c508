//! Resampling kernels (Resize, Upsample) as machine code (`iced-x86`), from the tables
//! of taps `kiln_flow::resample` works out at compile time: interpolations (linear,
//! cubic, antialiased, any coordinate transformation) and table copies (nearest).
//!
//! The output is viewed as `[P, H, W]`: the innermost axis `W`, the one before it `H`,
//! and every axis before that (`P`, planes) read at the output index. `H` and `W` each
//! read the input at the output index or from a table. A workgroup is one output row
//! `(p, y)`, as for general kernels; the first row of a range is decoded with one
//! division, the rest step `y` and `p` like an odometer.
//!
//! Per output row:
//! 1. **Vertical.** An interpolated `H` combines its `T_y` source rows (offsets and
//!    weights from row `y` of the `H` table) into one row of `W_in` values,
//!    `Σ_t w_t · x[p, i_t, :]`, eight columns at a time (a masked last vector), up to
//!    four rows per pass (more taps: further passes add into the row). The row goes to
//!    the stack when `W` is resampled too, else straight to the output. A copied `H`
//!    only picks the source row.
//! 2. **Horizontal.** A resampled `W` takes each output vector from that row and sums
//!    its `T_x` taps with the column weights, `Σ_t w_t · row[i_t]`. Where every output
//!    vector's taps lie within eight source columns (any upscale, mild downscales) the
//!    vector loads those eight columns once and each tap is one `vpermps` by the
//!    table's indices relative to the window; otherwise each tap is a gather
//!    (`vgatherdps` / `vpgatherdd`, several times slower). The tables are padded to
//!    whole vectors with index 0 and weight 0, and the last vector is stored masked.
//!
//! A row or column the table marks as filled (tf_crop_and_resize outside its region of
//! interest) takes the fill value: the whole row, or per column by a blend.
//!
//! Numerics: the weights are the kernel's own f32 values (tabulated by its interpreter),
//! each product rounded once (the first tap a multiply, the others FMAs). The kernel sums
//! the taps of `W` inside those of `H`; this code combines `H` first, so it reassociates
//! `Σ_y w_y Σ_x w_x v` as `Σ_x w_x Σ_y w_y v` (an error of a few f32 ulps of the
//! largest partial product; bounded in `crates/kiln-codegen/tests/resample.rs`). A
//! copy moves bits and equals the interpreter exactly.
//!
//! Declined (to the general path, with a note): axes other than the last two resampled
//! (an NHWC image), elements other than 4 bytes, tables over [`MAX_TABLE_BYTES`], a
//! source row over [`MAX_ROW`] elements.

use iced_x86::code_asm::*;
use kiln_flow::resample::{Axis, AxisTable, Resample};
use kiln_flow::Kernel;

use super::asm::{enter_rows, leave, Tables, YMM};
use super::gemm::{no, NotHere, R};

/// Largest source row held on the stack (elements).
const MAX_ROW: u64 = 8192;
/// Largest tables carried after the code.
const MAX_TABLE_BYTES: usize = 4 << 20;
/// Source rows combined in one vertical pass.
const ROWS_PER_PASS: usize = 4;

/// The form this emitter takes.
struct Plan<'a> {
    /// Planes, input rows, input columns, output rows, output columns.
    p: i64,
    h_in: i64,
    w_in: i64,
    h_out: i64,
    w_out: i64,
    /// Row table (`None`: read at the output row).
    h: Option<&'a AxisTable>,
    /// Column table (`None`: read at the output column).
    w: Option<&'a AxisTable>,
    weights: bool,
    fill: u32,
}

/// The `[P, H, W]` view of `r`, or why not.
fn view(r: &Resample) -> R<Plan<'_>> {
    let rank = r.out_dims.len();
    fn table(a: &Axis) -> Option<&AxisTable> {
        match a {
            Axis::Same => None,
            Axis::Table(t) => Some(t),
        }
    }
    if r.axes[..rank.saturating_sub(2)].iter().any(|a| !matches!(a, Axis::Same)) {
        return no("a resampled axis before the last two");
    }
    let dim = |d: &[u64], back: usize| if rank >= back { d[rank - back] as i64 } else { 1 };
    let (h, w) = (if rank >= 2 { table(&r.axes[rank - 2]) } else { None }, table(&r.axes[rank - 1]));
    let p: i64 = r.out_dims[..rank.saturating_sub(2)].iter().map(|&d| d as i64).product();
    Ok(Plan {
        p,
        h_in: dim(&r.in_dims, 2),
        w_in: dim(&r.in_dims, 1),
        h_out: dim(&r.out_dims, 2),
        w_out: dim(&r.out_dims, 1),
        h,
        w,
        weights: r.weights,
        fill: r.fill.unwrap_or(0) as u32,
    })
}

/// Emits `k` as a resampling (code and workgroup count), or says why not.
pub(crate) fn emit(k: &Kernel) -> R<(Vec<u8>, u64)> {
    let r = Resample::of(k).ok_or_else(|| NotHere("not a tabulated resampling".into()))?;
    if k.output.dtype.storage_bytes(1) != 4 {
        return no("elements other than 4 bytes");
    }
    let limit = i32::MAX as usize;
    if k.inputs[0].storage_bytes() > limit / 2 || k.output.storage_bytes() > limit / 2 {
        return no("an operand over 1 GiB");
    }
    let v = view(&r)?;
    if v.w.is_some() && v.h.is_some_and(|_| v.weights) && v.w_in as u64 > MAX_ROW {
        return no("source rows over 8192 elements");
    }
    let ty = v.h.map_or(1, |t| t.taps);
    let tx = v.w.map_or(1, |t| t.taps);
    let w_pad = (v.w_out + 7) / 8 * 8;
    let table_bytes =
        v.h.map_or(0, |_| v.h_out as usize * (4 + 8 * ty)) + v.w.map_or(0, |_| w_pad as usize * 4 * (2 * tx + 2));
    if table_bytes > MAX_TABLE_BYTES {
        return no("tables over 4 MiB");
    }
    let bases = v.w.and_then(|w| windows(w, v.w_in, v.w_out));
    let rows = v.p * v.h_out;
    let plane_in = v.h_in * v.w_in * 4;
    let row_in = v.w_in * 4;
    let row_out = v.w_out * 4;
    // The stack row (vertical result for a resampled W), whole vectors.
    let tmp_bytes = if v.w.is_some() && v.h.is_some() && v.weights { (v.w_in + 7) / 8 * 32 } else { 0 };
    let frame = (tmp_bytes + 8) as i32;

    let mut a = CodeAssembler::new(64)?;
    let mut t = Tables::default();
    let mut ylab = a.create_label();
    let mut xlab = a.create_label();
    let mut done = enter_rows(&mut a, frame, rows)?;
    // r12 = p, r13 = y, r14 = output row, r15 = input plane.
    a.mov(rax, r10)?;
    a.xor(edx, edx)?;
    a.mov(rcx, v.h_out)?;
    a.div(rcx)?;
    a.mov(r12, rax)?;
    a.mov(r13, rdx)?;
    a.imul_3(r14, r10, row_out as i32)?;
    a.add(r14, r9)?;
    a.imul_3(r15, r12, plane_in as i32)?;
    a.add(r15, r8)?;
    // Lane masks of the last vectors of an input row and an output row.
    let (in_tail, out_tail) = (v.w_in % 8, v.w_out % 8);
    t.load_lanes(&mut a, ymm15, in_tail)?;
    t.load_lanes(&mut a, ymm14, out_tail)?;
    let fill_lab = t.vector(&mut a, v.fill);
    a.vmovups(ymm13, ymmword_ptr(fill_lab))?;
    let h_fills = v.h.is_some_and(|h| !h.fill.is_empty());
    let w_fills = v.w.is_some_and(|w| !w.fill.is_empty());
    let rec = 4 + 4 * ty as i32 * if v.weights { 2 } else { 1 };

    let mut top = a.create_label();
    let mut next = a.create_label();
    let mut fill_row = a.create_label();
    a.set_label(&mut top)?;
    if v.h.is_some() {
        // rbx = the row's record: fill flag, source row offsets, weights.
        a.imul_3(rbx, r13, rec)?;
        a.lea(rax, ptr(ylab))?;
        a.add(rbx, rax)?;
        if h_fills {
            a.cmp(dword_ptr(rbx), 0)?;
            a.jne(fill_row)?;
        }
    }
    // rsi = the source row the horizontal step reads (when it reads one).
    match (v.h, v.weights) {
        (Some(_), true) => {
            // Vertical combination into the stack row or the output row.
            let (dst, to_out) = if v.w.is_some() { (rsp, false) } else { (r14, true) };
            vertical(&mut a, &v, ty, dst, to_out, in_tail)?;
            a.mov(rsi, rsp)?;
        }
        (Some(_), false) => {
            a.movsxd(rsi, dword_ptr(rbx + 4))?;
            a.add(rsi, r15)?;
        }
        (None, _) => {
            a.imul_3(rsi, r13, row_in as i32)?;
            a.add(rsi, r15)?;
        }
    }
    if let Some(wt) = v.w {
        horizontal(&mut a, &v, wt, w_pad, w_fills, out_tail, bases.is_some(), &mut xlab)?;
    } else if !(v.h.is_some() && v.weights) {
        // A copied row.
        copy_row(&mut a, v.w_out, out_tail)?;
    }
    a.set_label(&mut next)?;
    a.add(r14, row_out as i32)?;
    a.inc(r10)?;
    a.cmp(r10, r11)?;
    a.jae(done)?;
    a.inc(r13)?;
    a.cmp(r13, v.h_out as i32)?;
    a.jb(top)?;
    a.xor(r13d, r13d)?;
    a.inc(r12)?;
    a.add(r15, plane_in as i32)?;
    a.jmp(top)?;
    if h_fills {
        a.set_label(&mut fill_row)?;
        let full = v.w_out / 8;
        if full > 0 {
            a.xor(edi, edi)?;
            let mut lp = a.create_label();
            a.set_label(&mut lp)?;
            a.vmovups(ymmword_ptr(r14 + rdi), ymm13)?;
            a.add(rdi, 32)?;
            a.cmp(rdi, (full * 32) as i32)?;
            a.jb(lp)?;
        }
        if out_tail > 0 {
            a.vmaskmovps(ymmword_ptr(r14 + 32 * full as i32), ymm14, ymm13)?;
        }
        a.jmp(next)?;
    }
    a.set_label(&mut done)?;
    leave(&mut a, frame)?;
    t.emit(&mut a)?;
    // The row table: per output row, its fill flag, source row byte offsets, weights.
    if let Some(h) = v.h {
        a.set_label(&mut ylab)?;
        let mut words = Vec::with_capacity(v.h_out as usize * rec as usize / 4);
        for y in 0..v.h_out as usize {
            words.push(h.fills(y) as u32);
            for j in 0..ty {
                words.push((h.index[y * ty + j] as i64 * row_in) as u32);
            }
            if v.weights {
                words.extend_from_slice(&h.weight[y * ty..(y + 1) * ty]);
            }
        }
        a.dd(&words)?;
    }
    // The column table: per tap, indices and weights of every padded column; fill masks.
    if let Some(w) = v.w {
        a.set_label(&mut xlab)?;
        let wp = w_pad as usize;
        let mut words = vec![0u32; wp * (2 * tx + 2)];
        for x in 0..v.w_out as usize {
            // A window's base is its first column's word of the last plane.
            let base = bases.as_ref().map_or(0, |b| b[x / 8]);
            for j in 0..tx {
                words[j * wp + x] = w.index[x * tx + j] - base;
                if v.weights {
                    words[(tx + j) * wp + x] = w.weight[x * tx + j];
                }
            }
            words[2 * tx * wp + x] = if w.fills(x) { u32::MAX } else { 0 };
            if x % 8 == 0 {
                words[(2 * tx + 1) * wp + x] = base * 4;
            }
        }
        a.dd(&words)?;
    }
    Ok((a.assemble(0)?, rows as u64))
}

/// Registers holding the source rows of one vertical pass.
const ROW_REGS: [AsmRegister64; ROWS_PER_PASS] = [rax, rcx, rdx, rdi];

/// `dst[0..W_in] = Σ_t w_t · src_t[0..W_in]` for the taps of the row record at `rbx`.
fn vertical(a: &mut CodeAssembler, v: &Plan, ty: usize, dst: AsmRegister64, to_out: bool, tail: i64) -> R<()> {
    let full = v.w_in / 8;
    for g in (0..ty).step_by(ROWS_PER_PASS) {
        let n = (ty - g).min(ROWS_PER_PASS);
        for j in 0..n {
            let r = ROW_REGS[j];
            a.movsxd(r, dword_ptr(rbx + 4 + 4 * (g + j) as i32))?;
            a.add(r, r15)?;
            a.vbroadcastss(YMM[8 + j], dword_ptr(rbx + 4 + 4 * (ty + g + j) as i32))?;
        }
        // One vector at byte offset `at` (a register or a constant), `masked` lanes.
        let step = |a: &mut CodeAssembler,
                    col: AsmMemoryOperand,
                    src: &dyn Fn(AsmRegister64) -> AsmMemoryOperand,
                    masked: bool|
         -> R<()> {
            for j in 0..n {
                let x = YMM[1 + j];
                if masked {
                    a.vmaskmovps(x, ymm15, src(ROW_REGS[j]))?;
                } else {
                    a.vmovups(x, src(ROW_REGS[j]))?;
                }
            }
            if g == 0 {
                a.vmulps(ymm0, ymm1, ymm8)?;
            } else if masked && to_out {
                a.vmaskmovps(ymm0, ymm15, col)?;
                a.vfmadd231ps(ymm0, ymm1, ymm8)?;
            } else {
                a.vmovups(ymm0, col)?;
                a.vfmadd231ps(ymm0, ymm1, ymm8)?;
            }
            for j in 1..n {
                a.vfmadd231ps(ymm0, YMM[1 + j], YMM[8 + j])?;
            }
            if masked && to_out {
                a.vmaskmovps(col, ymm15, ymm0)?;
            } else {
                a.vmovups(col, ymm0)?;
            }
            Ok(())
        };
        each_vector(a, rsi, full, tail, &|a, pos, masked| step(a, pos(dst), pos, masked))?;
    }
    Ok(())
}

/// The output row from the source row at `rsi` through the column table.
fn horizontal(
    a: &mut CodeAssembler,
    v: &Plan,
    wt: &AxisTable,
    w_pad: i64,
    fills: bool,
    tail: i64,
    permute: bool,
    xlab: &mut CodeLabel,
) -> R<()> {
    let tx = wt.taps;
    let plane = (w_pad * 4) as i32;
    let full = v.w_out / 8;
    a.lea(rdx, ptr(*xlab))?;
    let step =
        |a: &mut CodeAssembler, at: AsmMemoryOperand, off: &dyn Fn(i32) -> AsmMemoryOperand, masked: bool| -> R<()> {
            if permute {
                // The vector's window of eight source columns.
                a.movsxd(rax, off((2 * tx as i32 + 1) * plane))?;
                if v.w_in < 8 {
                    a.vmaskmovps(ymm5, ymm15, ptr(rsi + rax))?;
                } else {
                    a.vmovups(ymm5, ptr(rsi + rax))?;
                }
            }
            for j in 0..tx as i32 {
                a.vmovdqu(ymm2, off(j * plane))?;
                let x = if v.weights { ymm1 } else { ymm0 };
                if permute {
                    a.vpermps(x, ymm2, ymm5)?;
                } else {
                    a.vpcmpeqd(ymm3, ymm3, ymm3)?;
                    if v.weights {
                        a.vgatherdps_3(x, ptr(rsi + ymm2 * 4), ymm3)?;
                    } else {
                        a.vpgatherdd_3(x, ptr(rsi + ymm2 * 4), ymm3)?;
                    }
                }
                if v.weights {
                    if j == 0 {
                        a.vmulps(ymm0, ymm1, off((tx as i32 + j) * plane))?;
                    } else {
                        a.vfmadd231ps(ymm0, ymm1, off((tx as i32 + j) * plane))?;
                    }
                }
            }
            if fills {
                a.vmovdqu(ymm4, off(2 * tx as i32 * plane))?;
                a.vblendvps(ymm0, ymm0, ymm13, ymm4)?;
            }
            if masked {
                a.vmaskmovps(at, ymm14, ymm0)?;
            } else {
                a.vmovups(at, ymm0)?;
            }
            Ok(())
        };
    each_vector(a, rdi, full, tail, &|a, pos, masked| step(a, pos(r14), &|o| pos(rdx) + o, masked))
}

/// The address of a row's vector from a base register.
type VectorAt<'a> = &'a dyn Fn(AsmRegister64) -> AsmMemoryOperand;

/// Runs `step` over a row's `full` whole vectors (their byte offset counted in `i`
/// from 0 by 32), then, `masked`, over its last `tail` columns.
fn each_vector(
    a: &mut CodeAssembler,
    i: AsmRegister64,
    full: i64,
    tail: i64,
    step: &dyn Fn(&mut CodeAssembler, VectorAt<'_>, bool) -> R<()>,
) -> R<()> {
    if full > 0 {
        a.xor(i, i)?;
        let mut lp = a.create_label();
        a.set_label(&mut lp)?;
        step(a, &|base| ymmword_ptr(base + i), false)?;
        a.add(i, 32)?;
        a.cmp(i, (full * 32) as i32)?;
        a.jb(lp)?;
    }
    if tail > 0 {
        let at = (full * 32) as i32;
        step(a, &|base| ymmword_ptr(base + at), true)?;
    }
    Ok(())
}

/// Per output vector (eight columns), the first of eight source columns that hold all its
/// taps, or `None` when some vector's taps spread wider: then each vector is gathered.
/// The window stays inside the row (it starts at most at `W_in - 8`; a row of fewer
/// than eight columns is read masked from column 0).
fn windows(w: &AxisTable, w_in: i64, w_out: i64) -> Option<Vec<u32>> {
    let mut bases = Vec::new();
    for c in (0..w_out as usize).step_by(8) {
        let lanes = &w.index[c * w.taps..((c + 8).min(w_out as usize)) * w.taps];
        let (lo, hi) = (*lanes.iter().min()?, *lanes.iter().max()?);
        if hi - lo >= 8 {
            return None;
        }
        bases.push(if w_in >= 8 { lo.min(w_in as u32 - 8) } else { 0 });
    }
    Some(bases)
}

/// The output row as a copy of the source row at `rsi`.
fn copy_row(a: &mut CodeAssembler, w: i64, tail: i64) -> R<()> {
    let full = w / 8;
    if full > 0 {
        a.xor(edi, edi)?;
        let mut lp = a.create_label();
        a.set_label(&mut lp)?;
        a.vmovups(ymm0, ymmword_ptr(rsi + rdi))?;
        a.vmovups(ymmword_ptr(r14 + rdi), ymm0)?;
        a.add(rdi, 32)?;
        a.cmp(rdi, (full * 32) as i32)?;
        a.jb(lp)?;
    }
    if tail > 0 {
        let at = (full * 32) as i32;
        a.vmaskmovps(ymm0, ymm14, ymmword_ptr(rsi + at))?;
        a.vmaskmovps(ymmword_ptr(r14 + at), ymm14, ymm0)?;
    }
    Ok(())
}
