//! Transposing copies as machine code (`iced-x86`, AVX): `out[o.., i, j] = x[c + Σ
//! coef·o + i + S·j]`, a copy of 4-byte elements whose innermost output axis `j` steps
//! `S > 1` elements through the input and the axis before it, `i`, steps 1 (a
//! Transpose of the last two axes, the image a convolution reads across a transpose:
//! `kiln_flow::layout`). [`super::copy`] takes copies whose rows are contiguous runs of
//! the input; [`super::gather`] would take this one too, but gathers each output row
//! element by element, eight lanes `S` elements apart: every lane a different line of
//! the input, each line fetched again for each of the output rows that share it.
//!
//! Here a workgroup is a block of eight output rows (`i0..i0 + 8` of one outer
//! position), walked along `j` eight columns at a time: eight loads of eight contiguous
//! input elements (input rows `j..j + 8`, elements `i0..i0 + 8`), an 8 × 8 transpose in
//! registers (`vunpck{l,h}ps`, `vshufps`, `vperm2f128`), eight stores of eight output
//! elements. Every input line is read once per block. The last 1..7 columns are
//! stored under a lane mask; a last block of fewer than eight rows reads its input under
//! a lane mask (nothing past `i0 + rows` is read) and stores only its rows. Output axes of
//! extent 1 are dropped (their offset folds into `c`).
//!
//! magika's image copy (`[512, 256]` to `[256, 512]`) went from 84 µs as a table gather to
//! the figure in `docs/benchmarks.md`.

use iced_x86::code_asm::*;
use kiln_flow::affine::load_offset;
use kiln_flow::{Bounds, Expr, Kernel};

use super::asm::{decode_row, end_rows, enter_rows, Tables, COORD, YMM};
use super::gemm::{no, NotHere, R};

/// Rows and columns of a block.
const B: i64 = 8;

/// A recognised transpose: outer dims and their source coefficients, then the rows
/// (`i`, step 1) and columns (`j`, step `s`).
struct Transpose {
    outer: Vec<(i64, i64)>,
    rows: i64,
    cols: i64,
    s: i64,
    c: i64,
}

fn recognise(k: &Kernel) -> R<Transpose> {
    let Expr::Load { input: 0, index, bounds: Bounds::InBounds } = &k.node(k.root).expr else {
        return no("not a copy");
    };
    let (x, o) = (&k.inputs[0], &k.output);
    if k.inputs.len() != 1 || x.dtype != o.dtype || x.dtype.storage_bytes(1) != 4 {
        return no("not a 4-byte copy of one input");
    }
    let limit = i32::MAX as usize;
    if x.storage_bytes() > limit || o.storage_bytes() > limit || o.shape.numel() == 0 {
        return no("an operand over 2 GiB, or empty");
    }
    let off = load_offset(k, 0, index).ok_or_else(|| NotHere("a non-affine copy index".into()))?;
    let rank = o.shape.rank();
    if off.coef.iter().enumerate().any(|(v, &c)| v >= rank && c != 0 && k.vars[v] > 1) {
        return no("an index that reads a reduction variable");
    }
    // The output axes longer than one, with their steps through the input.
    let axes: Vec<(i64, i64)> =
        (0..rank).filter(|&d| o.shape.dims()[d] > 1).map(|d| (o.shape.dims()[d] as i64, off.of(d as u32))).collect();
    let [outer @ .., (rows, 1), (cols, s)] = axes.as_slice() else {
        return no("not a transpose of the last two axes longer than one");
    };
    if *s <= 1 || *rows < B || *cols < B || outer.len() >= COORD.len() {
        return no("not a transpose of blocks of 8 × 8");
    }
    // Every byte offset the code forms fits 32 bits: the input's and the output's sizes.
    if s.checked_mul(4 * B).is_none_or(|b| b > limit as i64) || (cols * 4 * B) > limit as i64 {
        return no("a stride over 2 GiB");
    }
    Ok(Transpose { outer: outer.to_vec(), rows: *rows, cols: *cols, s: *s, c: off.c })
}

/// Emits `k` as a transposing copy (code and workgroup count), or says why not.
pub(crate) fn emit(k: &Kernel) -> R<(Vec<u8>, u64)> {
    let p = recognise(k)?;
    let nb = (p.rows + B - 1) / B;
    let part = p.rows % B;
    let blocks: i64 = p.outer.iter().map(|o| o.0).product::<i64>() * nb;
    let (full, tail) = (p.cols / B, p.cols % B);
    let mut a = CodeAssembler::new(64)?;
    let mut t = Tables::default();
    let done = enter_rows(&mut a, 8, blocks)?;
    let mut dims: Vec<i64> = p.outer.iter().map(|o| o.0).collect();
    dims.push(nb);
    let nd = dims.len();
    let col_mask = (tail > 0).then(|| t.lanes(&mut a, tail as u64));
    let row_mask = (part > 0).then(|| t.lanes(&mut a, part as u64));
    let (s4, row4) = ((p.s * 4) as i32, (p.cols * 4) as i32);
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    // This block's coordinates, its source (rsi) and destination (rdi).
    decode_row(&mut a, &dims)?;
    a.mov(rsi, r8)?;
    a.mov(rdi, r9)?;
    let mut out_stride = p.rows * p.cols;
    for d in (0..nd - 1).rev() {
        a.imul_3(rax, COORD[d], i32::try_from(p.outer[d].1 * 4).map_err(|_| NotHere("a stride over 2 GiB".into()))?)?;
        a.add(rsi, rax)?;
        a.imul_3(rax, COORD[d], i32::try_from(out_stride * 4).map_err(|_| NotHere("a stride over 2 GiB".into()))?)?;
        a.add(rdi, rax)?;
        out_stride *= p.outer[d].0;
    }
    // Row block: i0 = 8·q → source + i0·4, destination + i0·cols·4.
    a.imul_3(rax, COORD[nd - 1], 4 * B as i32)?;
    a.add(rsi, rax)?;
    a.imul_3(rax, COORD[nd - 1], B as i32 * row4)?;
    a.add(rdi, rax)?;
    a.add(rsi, i32::try_from(p.c * 4).map_err(|_| NotHere("an offset over 2 GiB".into()))?)?;
    // Full blocks, and a last block of `part` rows where there is one.
    let mut last = a.create_label();
    let mut next = a.create_label();
    if part > 0 {
        a.cmp(COORD[nd - 1], (nb - 1) as i32)?;
        a.je(last)?;
    }
    block(&mut a, B, full, tail, col_mask, None, s4, row4)?;
    a.jmp(next)?;
    a.set_label(&mut last)?;
    if part > 0 {
        block(&mut a, part, full, tail, col_mask, row_mask, s4, row4)?;
    } else {
        a.nop()?;
    }
    a.set_label(&mut next)?;
    a.inc(r10)?;
    a.cmp(r10, r11)?;
    a.jb(top)?;
    end_rows(a, &t, done, blocks)
}

/// One block of `rows` output rows from `rsi` into `rdi`: `full` groups of eight
/// columns, then `tail` columns under `col_mask`; with `row_mask` (fewer than eight
/// rows) each input read is masked to the rows.
#[allow(clippy::too_many_arguments)]
fn block(
    a: &mut CodeAssembler,
    rows: i64,
    full: i64,
    tail: i64,
    col_mask: Option<CodeLabel>,
    row_mask: Option<CodeLabel>,
    s4: i32,
    row4: i32,
) -> R<()> {
    // rdx: source of the column group; rcx: its destination; rax: groups left.
    a.mov(rdx, rsi)?;
    a.mov(rcx, rdi)?;
    let group = |a: &mut CodeAssembler, cols: i64| -> R<()> {
        if let Some(m) = row_mask {
            a.vmovups(ymm15, ymmword_ptr(m))?;
        }
        for (b, &reg) in YMM.iter().enumerate().take(B as usize) {
            if (b as i64) < cols {
                let at = ymmword_ptr(rdx + s4 * b as i32);
                match row_mask {
                    Some(_) => a.vmaskmovps(reg, ymm15, at)?,
                    None => a.vmovups(reg, at)?,
                }
            } else {
                a.vxorps(reg, reg, reg)?;
            }
        }
        transpose8(a)?;
        // Row r of the block is in ymm8 + r.
        if cols < B {
            if let Some(m) = col_mask {
                a.vmovups(ymm0, ymmword_ptr(m))?;
            }
        }
        for r in 0..rows as usize {
            let at = ymmword_ptr(rcx + row4 * r as i32);
            if cols < B {
                a.vmaskmovps(at, ymm0, YMM[8 + r])?;
            } else {
                a.vmovups(at, YMM[8 + r])?;
            }
        }
        Ok(())
    };
    if full > 0 {
        a.mov(rax, full)?;
        let mut each = a.create_label();
        a.set_label(&mut each)?;
        group(a, B)?;
        a.add(rdx, s4 * B as i32)?;
        a.add(rcx, 4 * B as i32)?;
        a.dec(rax)?;
        a.jnz(each)?;
    }
    if tail > 0 {
        group(a, tail)?;
    }
    Ok(())
}

/// Transposes the 8 × 8 block in `ymm0..8` (row b in `ymm b`) into `ymm8..16` (row r
/// of the result, column b of the input, in `ymm 8 + r`).
fn transpose8(a: &mut CodeAssembler) -> R<()> {
    // Pairs of rows interleaved: t_{2k}, t_{2k+1} = unpack lo, hi of rows 2k, 2k + 1.
    for k in 0..4 {
        a.vunpcklps(YMM[8 + 2 * k], YMM[2 * k], YMM[2 * k + 1])?;
        a.vunpckhps(YMM[9 + 2 * k], YMM[2 * k], YMM[2 * k + 1])?;
    }
    // Quads: u from t0/t2, t1/t3 (rows 0–3) and t4/t6, t5/t7 (rows 4–7).
    for (base, t) in [(0usize, 8usize), (4, 12)] {
        a.vshufps(YMM[base], YMM[t], YMM[t + 2], 0x44)?;
        a.vshufps(YMM[base + 1], YMM[t], YMM[t + 2], 0xEE)?;
        a.vshufps(YMM[base + 2], YMM[t + 1], YMM[t + 3], 0x44)?;
        a.vshufps(YMM[base + 3], YMM[t + 1], YMM[t + 3], 0xEE)?;
    }
    // Halves: result row r < 4 takes the low lanes of u_r and u_{r+4}, row r + 4 the high.
    for r in 0..4 {
        a.vperm2f128(YMM[8 + r], YMM[r], YMM[r + 4], 0x20)?;
        a.vperm2f128(YMM[12 + r], YMM[r], YMM[r + 4], 0x31)?;
    }
    Ok(())
}
