//! Padding kernels as machine code (`iced-x86`): `out[q] = x[q + c]` with `Pad` bounds
//! (what `kiln_flow::layout::materialize_padding` puts in front of a convolution, and
//! what `Pad` with a constant lowers to), 4-byte elements, and 1-byte ones (an integer
//! convolution's input, padded with its zero point).
//!
//! A workgroup is one output row (every output dimension but the innermost), as for
//! general kernels. All offsets are constants, so per row the code only decides
//! whether the row maps into `x` at all; a row that does is written as three runs —
//! pad values, one contiguous copy (8 lanes at a time), pad values — and a row that
//! does not is all pad values. In a row of at least 8 elements every store is a whole
//! vector inside the row: the pad runs first, a partial vector of pad values overlapping
//! columns of the copy, which is written after them and ends in the 8 elements ending at
//! its end; narrower rows mask their tails. Nothing is read outside `x`, nor written
//! outside the row.

use iced_x86::code_asm::*;
use kiln_flow::affine::affine;
use kiln_flow::{Bounds, Expr, Kernel};

use super::asm::{divide_out, leaf_row_loop, leaf_row_next, leaf_row_registers, Tables};
use super::gemm::{no, NotHere, R};

/// A recognised padding kernel.
struct Padding {
    /// Per output dimension: the input index is `q + shift`.
    shift: Vec<i64>,
    /// The input's dims.
    in_dims: Vec<i64>,
    /// The output's dims.
    out_dims: Vec<i64>,
    /// The pad value's bits.
    value: u32,
}

/// What both emitters derive from a [`Padding`] for its rows: the innermost extents, the
/// columns `lo..hi` whose input column `x + c` lies in `0..w_in`, the row count and the
/// input's strides in elements.
struct Rows {
    w_out: i64,
    c: i64,
    lo: i64,
    hi: i64,
    rows: i64,
    in_stride: Vec<i64>,
}

impl Padding {
    fn rows(&self) -> Rows {
        let rank = self.out_dims.len();
        let w_out = self.out_dims[rank - 1];
        let (w_in, c) = (self.in_dims[rank - 1], self.shift[rank - 1]);
        // Columns x with 0 ≤ x + c < w_in: lo..hi.
        let lo = (-c).clamp(0, w_out);
        let hi = (w_in - c).clamp(lo, w_out);
        let rows: i64 = self.out_dims[..rank - 1].iter().product();
        let mut in_stride = vec![1i64; rank];
        for d in (0..rank - 1).rev() {
            in_stride[d] = in_stride[d + 1] * self.in_dims[d + 1];
        }
        Rows { w_out, c, lo, hi, rows, in_stride }
    }
}

fn recognise(k: &Kernel) -> R<Padding> {
    let Expr::Load { input: 0, index, bounds: Bounds::Pad(bits) } = &k.node(k.root).expr else {
        return no("not a padding");
    };
    let (x, o) = (&k.inputs[0], &k.output);
    let bytes = x.dtype.storage_bytes(1);
    let packed = x.dtype.is_packed();
    if k.inputs.len() != 1
        || x.dtype != o.dtype
        || !(bytes == 4 || bytes == 1 && !packed)
        || index.len() != o.shape.rank()
    {
        return no("not a 1- or 4-byte padding of one input");
    }
    let rank = o.shape.rank();
    if rank == 0 || o.shape.numel() == 0 || x.shape.numel() == 0 {
        return no("an empty or rank-0 padding");
    }
    let mut shift = Vec::with_capacity(rank);
    for (d, &e) in index.iter().enumerate() {
        let a = affine(k, e).ok_or_else(|| NotHere("a non-affine padding index".into()))?;
        if a.coef.iter().enumerate().any(|(v, &c)| c != if v == d { 1 } else { 0 }) {
            return no("a padding index other than q + c");
        }
        shift.push(a.c);
    }
    let dims = |t: &kiln_ir::TensorType| t.shape.dims().iter().map(|&d| d as i64).collect::<Vec<_>>();
    let limit = i32::MAX as usize;
    if x.storage_bytes() > limit || o.storage_bytes() > limit {
        return no("an operand over 2 GiB");
    }
    Ok(Padding { shift, in_dims: dims(x), out_dims: dims(o), value: *bits as u32 })
}

/// Emits `k` as a padding kernel (code and workgroup count), or says why not.
pub(crate) fn emit(k: &Kernel) -> R<(Vec<u8>, u64)> {
    let p = recognise(k)?;
    if k.inputs[0].dtype.storage_bytes(1) == 1 {
        return emit_bytes(&p);
    }
    let Rows { w_out, c, lo, hi, rows, in_stride } = p.rows();
    let mut a = CodeAssembler::new(64)?;
    let mut t = Tables::default();
    let value = t.scalar(&mut a, p.value);
    let mut mask = |a: &mut CodeAssembler, lanes: u64| -> CodeLabel { t.lanes(a, lanes) };
    a.push(rbx)?;
    leaf_row_registers(&mut a, rows)?;
    a.vbroadcastss(ymm0, dword_ptr(value))?;
    let (top, mut done) = leaf_row_loop(&mut a)?;
    // out row pointer: out + row·w_out·4.
    a.imul_3(rsi, r10, (w_out * 4) as i32)?;
    a.add(rsi, r9)?;
    // Source row: decode the row into outer coordinates, check each maps into x.
    let mut fill = a.create_label();
    source_row(&mut a, &p, &in_stride, 4, rbx, fill)?;
    // rbx: x's row. Pad runs, then the copy run. A row of at least 8 elements takes no
    // masked stores (a `vmaskmovps` store costs tens of cycles on AMD Zen, and a row
    // had two or three): a pad run's partial vector is a whole one inside the row (pad
    // values over columns the copy, written after, overwrites), and the copy's last
    // partial vector is the 8 elements ending at the run's end, read and written whole.
    let whole = w_out >= 8;
    let store_run = |a: &mut CodeAssembler,
                     mask: &mut dyn FnMut(&mut CodeAssembler, u64) -> CodeLabel,
                     from: i64,
                     to: i64|
     -> R<()> {
        let mut x = from;
        while x + 8 <= to {
            a.vmovups(ymmword_ptr(rsi + (x * 4) as i32), ymm0)?;
            x += 8;
        }
        if x < to && whole {
            a.vmovups(ymmword_ptr(rsi + (x.min(w_out - 8) * 4) as i32), ymm0)?;
        } else if x < to {
            let l = mask(a, (to - x) as u64);
            a.vmovups(ymm1, ymmword_ptr(l))?;
            a.vmaskmovps(ymmword_ptr(rsi + (x * 4) as i32), ymm1, ymm0)?;
        }
        Ok(())
    };
    store_run(&mut a, &mut mask, 0, lo)?;
    store_run(&mut a, &mut mask, hi, w_out)?;
    let n = hi - lo;
    if n > 0 {
        // Copy x[lo + c .. hi + c] to out[lo .. hi]: 32 columns per iteration, then 8s, then
        // the last 8 (a masked tail where the run is under 8).
        let src0 = (lo + c) * 4;
        let dst0 = lo * 4;
        let mut x = 0i64;
        if n >= 64 {
            a.lea(rdi, qword_ptr(rbx + src0 as i32))?;
            a.lea(rdx, qword_ptr(rsi + dst0 as i32))?;
            a.mov(rcx, n / 32)?;
            let mut l32 = a.create_label();
            a.set_label(&mut l32)?;
            for v in 0..4 {
                a.vmovups(ymm2, ymmword_ptr(rdi + 32 * v))?;
                a.vmovups(ymmword_ptr(rdx + 32 * v), ymm2)?;
            }
            a.add(rdi, 128)?;
            a.add(rdx, 128)?;
            a.dec(rcx)?;
            a.jnz(l32)?;
            x = n / 32 * 32;
        }
        while x + 8 <= n {
            a.vmovups(ymm2, ymmword_ptr(rbx + (src0 + x * 4) as i32))?;
            a.vmovups(ymmword_ptr(rsi + (dst0 + x * 4) as i32), ymm2)?;
            x += 8;
        }
        if x < n && n >= 8 {
            // The run's last 8 elements (inside x's row and the output row).
            a.vmovups(ymm2, ymmword_ptr(rbx + (src0 + (n - 8) * 4) as i32))?;
            a.vmovups(ymmword_ptr(rsi + (dst0 + (n - 8) * 4) as i32), ymm2)?;
        } else if x < n {
            let l = mask(&mut a, (n - x) as u64);
            a.vmovups(ymm1, ymmword_ptr(l))?;
            a.vmaskmovps(ymm2, ymm1, ymmword_ptr(rbx + (src0 + x * 4) as i32))?;
            a.vmaskmovps(ymmword_ptr(rsi + (dst0 + x * 4) as i32), ymm1, ymm2)?;
        }
    }
    let mut next = a.create_label();
    a.jmp(next)?;
    a.set_label(&mut fill)?;
    a.nop()?;
    store_run(&mut a, &mut mask, 0, w_out)?;
    a.set_label(&mut next)?;
    leaf_row_next(&mut a, top)?;
    a.set_label(&mut done)?;
    a.vzeroupper()?;
    a.pop(rbx)?;
    a.ret()?;
    t.emit(&mut a)?;
    Ok((a.assemble(0)?, rows as u64))
}

/// Points `src` at x's row for output row `r10` (from `r8`, x): the row decoded into
/// outer coordinates, each shifted into x and checked to fall inside it, else a jump
/// to `fill` (a row of pad values). Elements of `bytes` bytes; clobbers `rax`, `rcx`,
/// `rdx`.
fn source_row(
    a: &mut CodeAssembler,
    p: &Padding,
    in_stride: &[i64],
    bytes: i64,
    src: AsmRegister64,
    fill: CodeLabel,
) -> R<()> {
    a.mov(rax, r10)?;
    a.mov(src, r8)?;
    // (rdx = q_d, rax = the rest.)
    divide_out(a, &p.out_dims[..p.out_dims.len() - 1], |a, d| {
        if p.shift[d] != 0 {
            a.add(rdx, p.shift[d] as i32)?;
        }
        a.cmp(rdx, p.in_dims[d] as i32)?;
        a.jae(fill)?; // (unsigned: a negative index is above every extent)
        a.imul_3(rdx, rdx, (in_stride[d] * bytes) as i32)?;
        a.add(src, rdx)?;
        Ok(())
    })
}

/// A padding of 1-byte elements (an 8-bit image padded with its zero point, in front of
/// an integer convolution): the same three runs a row, each one string instruction
/// (`rep stosb` of the pad value, `rep movsb` of the copy), which move whole lines at a
/// time on CPUs with fast string operations.
fn emit_bytes(p: &Padding) -> R<(Vec<u8>, u64)> {
    let Rows { w_out, c, lo, hi, rows, in_stride } = p.rows();
    let value = (p.value & 0xFF) as i32;
    let mut a = CodeAssembler::new(64)?;
    a.push(rbx)?;
    a.push(r12)?;
    leaf_row_registers(&mut a, rows)?;
    let (top, mut done) = leaf_row_loop(&mut a)?;
    // rbx: out + row·w_out.
    a.imul_3(rbx, r10, w_out as i32)?;
    a.add(rbx, r9)?;
    let mut fill = a.create_label();
    source_row(&mut a, p, &in_stride, 1, r12, fill)?;
    // r12: x's row. Pad run, copy run, pad run.
    let fill_run = |a: &mut CodeAssembler, from: i64, to: i64| -> R<()> {
        if to > from {
            a.lea(rdi, qword_ptr(rbx + from as i32))?;
            a.mov(ecx, (to - from) as i32)?;
            a.mov(eax, value)?;
            a.rep().stosb()?;
        }
        Ok(())
    };
    fill_run(&mut a, 0, lo)?;
    if hi > lo {
        a.lea(rsi, qword_ptr(r12 + (lo + c) as i32))?;
        a.lea(rdi, qword_ptr(rbx + lo as i32))?;
        a.mov(ecx, (hi - lo) as i32)?;
        a.rep().movsb()?;
    }
    fill_run(&mut a, hi, w_out)?;
    let mut next = a.create_label();
    a.jmp(next)?;
    a.set_label(&mut fill)?;
    a.nop()?;
    fill_run(&mut a, 0, w_out)?;
    a.set_label(&mut next)?;
    leaf_row_next(&mut a, top)?;
    a.set_label(&mut done)?;
    a.pop(r12)?;
    a.pop(rbx)?;
    a.ret()?;
    Ok((a.assemble(0)?, rows as u64))
}
