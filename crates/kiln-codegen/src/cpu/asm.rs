//! What the machine-code kernels (`gemm`, `depthwise`, `rows`, `pad`, `copy`, `gather`,
//! `resample`) share: the register names, the callee-saved registers a kernel saves and
//! restores, the entry of a kernel over rows and its odometer's decode, an immediate
//! add, and the read-only tables each kernel carries after its code (lane masks, vector
//! constants, broadcast scalars).

use std::collections::HashMap;

use iced_x86::code_asm::*;

use super::gemm::R;

pub(crate) const YMM: [AsmRegisterYmm; 16] =
    [ymm0, ymm1, ymm2, ymm3, ymm4, ymm5, ymm6, ymm7, ymm8, ymm9, ymm10, ymm11, ymm12, ymm13, ymm14, ymm15];

pub(crate) const XMM: [AsmRegisterXmm; 16] =
    [xmm0, xmm1, xmm2, xmm3, xmm4, xmm5, xmm6, xmm7, xmm8, xmm9, xmm10, xmm11, xmm12, xmm13, xmm14, xmm15];

pub(crate) const ZMM: [AsmRegisterZmm; 32] = [
    zmm0, zmm1, zmm2, zmm3, zmm4, zmm5, zmm6, zmm7, zmm8, zmm9, zmm10, zmm11, zmm12, zmm13, zmm14, zmm15, zmm16, zmm17,
    zmm18, zmm19, zmm20, zmm21, zmm22, zmm23, zmm24, zmm25, zmm26, zmm27, zmm28, zmm29, zmm30, zmm31,
];

/// `r{k}`: vector register `r` (`ymm` or `zmm`) written under opmask `k` (1–7;
/// merging unless `.z()` follows).
macro_rules! under_mask {
    ($r:expr, $k:expr) => {
        match $k {
            1 => $r.k1(),
            2 => $r.k2(),
            3 => $r.k3(),
            4 => $r.k4(),
            5 => $r.k5(),
            6 => $r.k6(),
            _ => $r.k7(),
        }
    };
}
pub(crate) use under_mask;

/// The System V callee-saved registers, in push order.
const SAVED: [AsmRegister64; 6] = [rbx, rbp, r12, r13, r14, r15];

/// Saves the callee-saved registers (the caller then reserves its frame).
pub(crate) fn enter(a: &mut CodeAssembler) -> R<()> {
    for r in SAVED {
        a.push(r)?;
    }
    Ok(())
}

/// Reserves a frame of `frame` bytes, growing the stack a page at a time and touching
/// each page (a guard page is never skipped).
pub(crate) fn reserve(a: &mut CodeAssembler, frame: i32) -> R<()> {
    let mut left = frame;
    while left > 0 {
        let step = left.min(4096);
        a.sub(rsp, step)?;
        a.or(qword_ptr(rsp), 0)?;
        left -= step;
    }
    Ok(())
}

/// Releases a frame of `frame` bytes, restores the callee-saved registers and returns
/// (after `vzeroupper`).
pub(crate) fn leave(a: &mut CodeAssembler, frame: i32) -> R<()> {
    a.vzeroupper()?;
    a.add(rsp, frame)?;
    for r in SAVED.iter().rev() {
        a.pop(*r)?;
    }
    a.ret()?;
    Ok(())
}

/// The entry of a kernel whose workgroups are the rows `0..rows` (`copy`, `gather`,
/// `resample`): saves the callee-saved registers, reserves `frame` bytes, clamps the end
/// (`rcx`) to `rows` and loads `r10` = row (`rdx`, the begin), `r11` = end, `r8` = the
/// first binding (x) and `r9` = the second (out). Returns the label an empty range jumps
/// to (the caller sets it before `leave`).
pub(crate) fn enter_rows(a: &mut CodeAssembler, frame: i32, rows: i64) -> R<CodeLabel> {
    enter(a)?;
    a.sub(rsp, frame)?;
    // rdi bindings, rdx begin, rcx end (clamped to the row count).
    a.mov(rax, rows)?;
    a.cmp(rcx, rax)?;
    a.cmova(rcx, rax)?;
    a.mov(r10, rdx)?; // row
    a.mov(r11, rcx)?; // end
    let done = a.create_label();
    a.cmp(r10, r11)?;
    a.jae(done)?;
    a.mov(r8, qword_ptr(rdi))?; // x
    a.mov(r9, qword_ptr(rdi + 8))?; // out
    Ok(done)
}

/// Outer dimensions a row odometer keeps in registers (`copy`, `gather`).
pub(crate) const COORD: [AsmRegister64; 5] = [r12, r13, r14, r15, rbx];

/// The registers of a leaf row kernel (no frame: the padding and the 1-byte copy): from
/// the System V arguments (rdi bindings, rdx begin, rcx end), `r8` the first binding
/// (the input), `r9` the second (the output), `r10` the row and `r11` the end, clamped
/// to `rows`.
pub(crate) fn leaf_row_registers(a: &mut CodeAssembler, rows: i64) -> R<()> {
    a.mov(rax, rows)?;
    a.cmp(rcx, rax)?;
    a.cmova(rcx, rax)?;
    a.mov(r8, qword_ptr(rdi))?;
    a.mov(r9, qword_ptr(rdi + 8))?;
    a.mov(r10, rdx)?;
    a.mov(r11, rcx)?;
    Ok(())
}

/// Opens the row loop over `r10 .. r11` ([`leaf_row_registers`]): the label of its top
/// (placed here) and of its end (for the caller to place after [`leaf_row_next`]).
pub(crate) fn leaf_row_loop(a: &mut CodeAssembler) -> R<(CodeLabel, CodeLabel)> {
    let done = a.create_label();
    let mut top = a.create_label();
    a.cmp(r10, r11)?;
    a.jae(done)?;
    a.set_label(&mut top)?;
    Ok((top, done))
}

/// Closes the row loop [`leaf_row_loop`] opened: the next row, back to `top` until `r11`.
pub(crate) fn leaf_row_next(a: &mut CodeAssembler, top: CodeLabel) -> R<()> {
    a.inc(r10)?;
    a.cmp(r10, r11)?;
    a.jb(top)?;
    Ok(())
}

/// Decodes row `r10` into the coordinates `COORD[d]` of the outer dims `dims`
/// (innermost last); clobbers `rax`, `rcx`, `rdx`.
pub(crate) fn decode_row(a: &mut CodeAssembler, dims: &[i64]) -> R<()> {
    a.mov(rax, r10)?;
    divide_out(a, dims, |a, d| Ok(a.mov(COORD[d], rdx)?))
}

/// Divides `rax` (a row index) by the outer dims `dims`, innermost (last) first; after
/// each division `rdx` holds dimension `d`'s coordinate and `digit(a, d)` uses it.
/// Clobbers `rax`, `rcx`, `rdx`.
pub(crate) fn divide_out(
    a: &mut CodeAssembler,
    dims: &[i64],
    mut digit: impl FnMut(&mut CodeAssembler, usize) -> R<()>,
) -> R<()> {
    for d in (0..dims.len()).rev() {
        a.xor(edx, edx)?;
        a.mov(rcx, dims[d])?;
        a.div(rcx)?;
        digit(a, d)?;
    }
    Ok(())
}

/// A copy-like kernel over the rows of an output of dims `dims` (`copy`, `gather`), its
/// entry emitted: [`enter_rows`] with an 8-byte frame, the tail's lane mask in `ymm15`,
/// `rdi` = out + row·w·4 and the first row's coordinates ([`decode_row`]).
pub(crate) struct RowKernel {
    pub a: CodeAssembler,
    pub t: Tables,
    /// Where an empty range jumps to ([`end_rows`] sets it).
    pub done: CodeLabel,
    /// The outer dims (all but the row).
    pub outer: usize,
    /// The row's length.
    pub w: i64,
    /// Whole vectors and the tail of a row.
    pub full: i64,
    pub tail: i64,
    /// The row count (the workgroup count).
    pub rows: i64,
}

impl RowKernel {
    const FRAME: i32 = 8;

    /// Starts the kernel; see the type.
    pub fn begin(dims: &[i64]) -> R<Self> {
        let outer = dims.len() - 1;
        let w = dims[outer];
        let rows: i64 = dims[..outer].iter().product();
        let mut a = CodeAssembler::new(64)?;
        let mut t = Tables::default();
        let done = enter_rows(&mut a, Self::FRAME, rows)?;
        t.load_lanes(&mut a, ymm15, w % 8)?;
        // Destination: out + row·w·4.
        a.imul_3(rdi, r10, (w * 4) as i32)?;
        a.add(rdi, r9)?;
        decode_row(&mut a, &dims[..outer])?;
        Ok(RowKernel { a, t, done, outer, w, full: w / 8, tail: w % 8, rows })
    }
}

/// Ends a [`RowKernel`]: sets `done`, leaves, and emits the tables; the code and the
/// workgroup count.
pub(crate) fn end_rows(mut a: CodeAssembler, t: &Tables, mut done: CodeLabel, rows: i64) -> R<(Vec<u8>, u64)> {
    a.set_label(&mut done)?;
    leave(&mut a, RowKernel::FRAME)?;
    t.emit(&mut a)?;
    Ok((a.assemble(0)?, rows as u64))
}

/// `dst += imm` for any 64-bit `imm` (through `scratch` when it needs more than 32 bits).
pub(crate) fn add_imm(a: &mut CodeAssembler, dst: AsmRegister64, imm: i64, scratch: AsmRegister64) -> R<()> {
    if imm == 0 {
        return Ok(());
    }
    match i32::try_from(imm) {
        Ok(i) => a.add(dst, i)?,
        Err(_) => {
            a.mov(scratch, imm)?;
            a.add(dst, scratch)?;
        }
    }
    Ok(())
}

/// A kernel's read-only data, emitted after its code: lane masks (eight 32-bit words,
/// all ones where bit `i` of the pattern is set), 32-byte vector constants (eight copies,
/// read as memory operands) and 4-byte scalars (read by broadcasts). Each value is
/// stored once; the tables come out sorted, so the code is the same from run to run.
#[derive(Default)]
pub(crate) struct Tables {
    masks: HashMap<u8, CodeLabel>,
    vectors: HashMap<u32, CodeLabel>,
    scalars: HashMap<u32, CodeLabel>,
    /// Whole vectors given word by word (index vectors of permutes).
    words: Vec<(Vec<u32>, CodeLabel)>,
}

impl Tables {
    /// The lane mask with lane `i` on where bit `i` of `bits` is set.
    pub fn mask(&mut self, a: &mut CodeAssembler, bits: u8) -> CodeLabel {
        *self.masks.entry(bits).or_insert_with(|| a.create_label())
    }

    /// The mask of the first `lanes` lanes (1 to 8).
    pub fn lanes(&mut self, a: &mut CodeAssembler, lanes: u64) -> CodeLabel {
        self.mask(a, ((1u16 << lanes.min(8)) - 1) as u8)
    }

    /// Loads the mask of the first `lanes` lanes into `reg`, when `lanes` is not 0
    /// (the tail of a row of whole vectors).
    pub fn load_lanes(&mut self, a: &mut CodeAssembler, reg: AsmRegisterYmm, lanes: i64) -> R<()> {
        if lanes > 0 {
            let l = self.lanes(a, lanes as u64);
            a.vmovups(reg, ymmword_ptr(l))?;
        }
        Ok(())
    }

    /// Eight copies of `bits`, 32 bytes.
    pub fn vector(&mut self, a: &mut CodeAssembler, bits: u32) -> CodeLabel {
        *self.vectors.entry(bits).or_insert_with(|| a.create_label())
    }

    /// `bits` alone, 4 bytes.
    pub fn scalar(&mut self, a: &mut CodeAssembler, bits: u32) -> CodeLabel {
        *self.scalars.entry(bits).or_insert_with(|| a.create_label())
    }

    /// The vector of `words`, as given.
    pub fn words(&mut self, a: &mut CodeAssembler, words: &[u32]) -> CodeLabel {
        if let Some((_, l)) = self.words.iter().find(|(w, _)| w == words) {
            return *l;
        }
        let l = a.create_label();
        self.words.push((words.to_vec(), l));
        l
    }

    /// Emits the tables at the assembler's current position.
    pub fn emit(&self, a: &mut CodeAssembler) -> R<()> {
        let sorted = |m: &HashMap<u32, CodeLabel>| {
            let mut v: Vec<(u32, CodeLabel)> = m.iter().map(|(&k, &l)| (k, l)).collect();
            v.sort_by_key(|e| e.0);
            v
        };
        let mut masks: Vec<(u8, CodeLabel)> = self.masks.iter().map(|(&k, &l)| (k, l)).collect();
        masks.sort_by_key(|e| e.0);
        for (bits, mut l) in masks {
            a.set_label(&mut l)?;
            let words: Vec<u32> = (0..8).map(|i| if bits >> i & 1 == 1 { u32::MAX } else { 0 }).collect();
            a.dd(&words)?;
        }
        for (words, l) in &self.words {
            let mut l = *l;
            a.set_label(&mut l)?;
            a.dd(words)?;
        }
        for (bits, mut l) in sorted(&self.vectors) {
            a.set_label(&mut l)?;
            a.dd(&[bits; 8])?;
        }
        for (bits, mut l) in sorted(&self.scalars) {
            a.set_label(&mut l)?;
            a.dd(&[bits])?;
        }
        Ok(())
    }
}
