//! The AVX2 form of the integer contraction microkernel: 16 `ymm` registers of eight
//! i32 lanes, no opmasks, no embedded broadcasts.
//!
//! The planning (recognition, operands, the epilogue's nodes and loads, the work split,
//! the workgroup loop and the block copies' loop) is the 512-bit emitter's, with a block
//! of 16 columns (two vectors) instead of 32 and a tile of [`MR`] rows. What differs:
//!
//! - **Products**: bytes are widened to 16 bits while they are copied, with the zero
//!   points subtracted there (`a − za`, `b − zb`: at most 383 in magnitude, so a 16-bit
//!   lane holds them; a zero point of `B` that varies across the columns is instead
//!   subtracted in the epilogue as `zb[n]·Σ_k (a − za)`, the row sums taken while `A`'s
//!   rows are copied). `B`'s block is copied as `[⌈K/2⌉, 16, 2]` words (two reduction
//!   steps interleaved, `vpunpck{l,h}wd` and `vperm2i128` to keep the columns in order);
//!   each tile first copies its rows of `A` as `[rows, ⌈K/2⌉, 2]` words. One step of
//!   the tile is then a broadcast word pair of `A` a row and one `vpmaddwd` and one
//!   `vpaddd` an accumulator: exact (no `vpmaddubsw`, whose 16-bit sums saturate; each
//!   pair's sum is below 2^19 and `K` ≤ 8192 products below 2^31). No column sums are
//!   needed (row sums only for a zero point of `B` per column); a zero point must be an 8-bit value (a cast of a `u8`/`i8` value, or
//!   a constant in `[−128, 255]`).
//! - **Tile**: [`MR`] rows × 16 columns: 12 accumulators, two vectors of `B`, one
//!   broadcast of `A`, one product. The accumulators are then stored to the stack and
//!   the epilogue runs slot by slot with all 16 registers but those holding its
//!   slot-invariant operands.
//! - **Epilogue**: the same nodes, eight lanes at a time: comparisons give lanes of all
//!   ones (`vpcmpeqd`/`vpcmpgtd`, negated with a `vpxor`), selects are `vblendvps`,
//!   constants are broadcast from the kernel's table, a partial vector's loads and
//!   stores are `vpmaskmovd` (8-bit loads: through eight bytes of scratch),
//!   8-bit results are packed with `vpackssdw` and `vpack{us,ss}wb` and stored as eight
//!   bytes (`vpextrb` a byte in a partial vector).
//! - One column (`N` = 1, `K` ≥ 16) has a form of its own, eight rows in the lanes and
//!   up to four passes of them a workgroup ([`Emitter::function_gemv_ymm`]). An `i8`
//!   `A` against a `u8` column without zero points (a dynamic-int8 model's weight times
//!   its quantised activation) multiplies the bytes of `A` as they are by the column's
//!   low and high nibbles instead of widening them ([`Emitter::nibble_pass`]).
//! - No hoisting of epilogue nodes across rows yet; a tile's slot-invariant operands
//!   are held in registers over its slots ([`Emitter::plan_pins_ymm`]).

use super::*;
use crate::cpu::vector::Op;
use crate::cpu::vector::Src;

/// Columns per block (two vectors of eight lanes).
pub(super) const NB: u64 = 16;
/// Rows of a full tile (12 accumulators).
pub(super) const MR: u64 = 6;
/// Bytes of a tile's spilled accumulators.
const ACC_BYTES: i32 = (MR as i32) * 2 * 32;
/// From the first block copy: the spilled accumulators, the row sums of `A` (where
/// [`Emitter::zb_cols`]), eight bytes of scratch (a partial vector's 8-bit operand).
const ACC_AT: i32 = -ACC_BYTES - 64;
/// Registers an epilogue holds its slot-invariant operands in, at most
/// ([`Emitter::plan_pins_ymm`]; the other eight compute).
pub(super) const MOST_PINS: usize = 8;
/// Rows of one pass of the one-column form (one vector of sums, a row a lane).
const GEMV_ROWS: u64 = 8;
/// Passes of [`GEMV_ROWS`] rows a workgroup of the one-column form, at most: each
/// workgroup copies the column once for all of its passes.
const GEMV_PASSES: u64 = 4;
const ROW_SUMS: i32 = -64;
/// Rows ahead that the nibble form prefetches `A` (the next pass's: its memory streams
/// from L3 or DRAM, a weight of 2.4 MB 53 → 40 µs on one thread).
const PREFETCH_ROWS: i64 = GEMV_ROWS as i64;
const SCRATCH: i32 = -32;

impl Emitter<'_> {
    /// The AVX2 form's own conditions (8-bit zero points, `B`'s the same across the
    /// columns; 8-bit epilogue operands along the columns only in whole vectors).
    pub(super) fn plan_ymm(&mut self) -> R<()> {
        for (z, what) in [(self.za, "A"), (self.zb, "B")] {
            let Some(z) = z else { continue };
            if !eight_bit(self.k, z) {
                return no(format!("a zero point of {what} not known to be 8-bit (AVX2 form)"));
            }
        }
        if let Some(zb) = self.zb {
            if self.dep(zb) & (D_ROW | D_ACC) != 0 {
                return no("a zero point of B that varies across the rows");
            }
        }
        if let Some(za) = self.za {
            if self.dep(za) & (D_COL | D_ACC) != 0 {
                return no("a zero point of A that varies across the columns");
            }
        }
        Ok(())
    }

    /// Passes of [`GEMV_ROWS`] rows a workgroup of the one-column form: as many as
    /// leave [`SPREAD`] workgroups or more, up to [`GEMV_PASSES`], then evened out over
    /// the workgroups that takes (6 groups of rows: 3 and 3, not 4 and 2).
    fn y_gemv_passes(&self) -> u64 {
        let batch: u64 = self.batch_ext.iter().product();
        let groups = self.c.dims[0].div_ceil(GEMV_ROWS);
        let most = (groups * batch / SPREAD).clamp(1, GEMV_PASSES);
        groups.div_ceil(groups.div_ceil(most))
    }

    /// Workgroups of one batch position of the one-column form.
    pub(super) fn y_gemv_workgroups(&self) -> u64 {
        self.c.dims[0].div_ceil(GEMV_ROWS).div_ceil(self.y_gemv_passes())
    }

    /// Chooses [`Self::y_pinned`]: up to `most` of the epilogue's operands that no slot
    /// changes (depending on neither the accumulator, the column nor the row: constants,
    /// per-tensor loads, what is computed from those alone) that a slot-dependent node
    /// reads, in the order the epilogue is walked. A tile evaluates them once into
    /// registers for all its slots ([`Self::pin_ymm`]), instead of a broadcast from
    /// memory each in every slot (the fixed-point requantisation of the TFLite
    /// importer's convolutions reads nine such constants a slot).
    pub(super) fn plan_pins_ymm(&mut self, most: usize) {
        let k = self.k;
        let mut pinned: Vec<ExprId> = Vec::new();
        let mut seen = vec![false; k.nodes.len()];
        let mut stack = vec![k.root];
        while let Some(e) = stack.pop() {
            if std::mem::replace(&mut seen[e.index()], true) || e == self.c.reduce || self.dep(e) == 0 {
                continue;
            }
            if matches!(k.node(e).expr, Expr::Load { .. }) {
                continue;
            }
            let mut ops = Vec::new();
            k.node(e).expr.for_each_operand(|o| ops.push(o));
            for o in ops {
                if self.dep(o) == 0 && !pinned.contains(&o) && o != self.c.reduce {
                    pinned.push(o);
                } else {
                    stack.push(o);
                }
            }
        }
        pinned.truncate(most);
        self.y_pinned = pinned;
    }

    /// Evaluates [`Self::y_pinned`] into registers (from `ymm15` down) for the slots of
    /// a tile; returns each node's register.
    fn pin_ymm(&mut self) -> R<Vec<(ExprId, usize)>> {
        let mut held: Vec<(ExprId, usize)> = Vec::new();
        for p in self.y_pinned.clone() {
            let mut ev = Eval::new(self.uses.clone(), 0, 0, false);
            for &(h, r) in &held {
                ev.memo.insert(h.0, r);
                ev.left.insert(h.0, u32::MAX);
            }
            // (Into the highest free register, taken first, so that the slots' pool is
            // one range.)
            let to = (0..16)
                .rev()
                .find(|t| held.iter().all(|h| h.1 != *t))
                .ok_or_else(|| NotHere("no register to pin".into()))?;
            let mut pool: Vec<usize> = (0..to).rev().filter(|r| held.iter().all(|h| h.1 != *r)).collect();
            pool.push(to);
            let r = self.eval_ymm(p, &mut ev, &mut pool)?;
            if r != to {
                self.a.vmovdqa(YMM[to], YMM[r])?;
            }
            held.push((p, to));
        }
        Ok(held)
    }

    /// `B`'s zero point varies across the columns: subtracted in the epilogue as
    /// `zb[n]·Σ_k (a − za)` (the row sums taken while `A`'s rows are copied), not while
    /// `B` is copied.
    fn zb_cols(&mut self) -> bool {
        self.zb.is_some_and(|z| self.dep(z) != 0)
    }

    /// Bytes of a packed row of `A` (`⌈K/2⌉` word pairs, a multiple of 32).
    fn y_apitch(&self) -> i32 {
        (self.c.dims[2].div_ceil(2) as i32 * 4 + 31) / 32 * 32
    }

    /// Bytes of one block's copy (AVX2 form).
    pub(super) fn y_block_bytes(&self) -> i32 {
        self.c.dims[2].div_ceil(2) as i32 * (NB as i32 * 4)
    }

    /// Bytes before the block copies (AVX2 form: a tile's packed rows of `A`, then its
    /// spilled accumulators; 0 otherwise).
    pub(super) fn y_pre_bytes(&self) -> i32 {
        if self.ymm {
            MR as i32 * self.y_apitch() + ACC_BYTES + 64
        } else {
            0
        }
    }

    /// A zero point (per tensor or, for `A`, per row `i`) as an i32 in `r8d` and as
    /// words in every lane of `ymm15`; `None` where there is none.
    fn zero_words(&mut self, z: Option<ExprId>, i: usize, from_base: bool) -> R<bool> {
        let Some(z) = z else { return Ok(false) };
        let mut ev = Eval::new(self.uses.clone(), i, 0, false);
        ev.from_base = from_base;
        // (One column: a zero point of `B` is one value, read as such.)
        ev.rows_lanes = self.gemv;
        let mut pool: Vec<usize> = (0..16).rev().collect();
        let r = self.eval_ymm(z, &mut ev, &mut pool)?;
        let x = XMM[r];
        self.a.vmovd(r8d, x)?;
        self.a.vpackssdw(ymm15, YMM[r], YMM[r])?;
        Ok(true)
    }

    /// Copies the block of `cols` columns of B at `S_BSRC` into the buffer at `S_BBUF`,
    /// `[⌈K/2⌉, 16, 2]` words, `zb` subtracted (columns past `cols` are not written: they
    /// are never stored).
    pub(super) fn pack_ymm(&mut self, cols: u64) -> R<()> {
        let kk = self.c.dims[2];
        let zb = if self.zb_cols() { false } else { self.zero_words(self.zb, 0, true)? };
        let signed = self.c.b.dtype == DType::I8;
        let table = self.pack_pointers()?;
        let low_bytes = self.t.vector(&mut self.a, 0x00FF_00FF);
        let step = self.b_step;
        // A pair of reduction steps (`rows` of them real).
        let pair = |e: &mut Self, rows: u64| -> R<()> {
            let row_at = |e: &mut Self, t: u64, disp: i64| -> R<AsmMemoryOperand> {
                Ok(match table {
                    Some(_) => {
                        e.a.movsxd(rax, dword_ptr(r11 + 4 * t as i32))?;
                        ptr(rsi + rax + disp as i32)
                    }
                    None => ptr(rsi + (e.b_stride * t as i64 + disp) as i32),
                })
            };
            if cols == NB {
                for t in 0..2u64 {
                    let (y, x) = (YMM[t as usize], XMM[t as usize]);
                    if t >= rows {
                        e.a.vpxor(y, y, y)?;
                        continue;
                    }
                    let at = row_at(e, t, 0)?;
                    if step == 1 {
                        if signed {
                            e.a.vpmovsxbw(y, xmmword_ptr(at))?;
                        } else {
                            e.a.vpmovzxbw(y, xmmword_ptr(at))?;
                        }
                    } else {
                        // Columns 0..7: the even bytes of 0..15; 8..15: the odd bytes of
                        // 15..30 (nothing past the last column is read).
                        e.a.vmovdqu(x, xmmword_ptr(at))?;
                        let at15 = row_at(e, t, 15)?;
                        e.a.vmovdqu(xmm4, xmmword_ptr(at15))?;
                        if signed {
                            e.a.vpsllw(x, x, 8)?;
                            e.a.vpsraw(x, x, 8)?;
                            e.a.vpsraw(xmm4, xmm4, 8)?;
                        } else {
                            e.a.vpand(x, x, xmmword_ptr(low_bytes))?;
                            e.a.vpsrlw(xmm4, xmm4, 8)?;
                        }
                        e.a.vinserti128(y, y, xmm4, 1)?;
                    }
                    if zb {
                        e.a.vpsubw(y, y, ymm15)?;
                    }
                }
                e.a.vpunpcklwd(ymm2, ymm0, ymm1)?;
                e.a.vpunpckhwd(ymm3, ymm0, ymm1)?;
                e.a.vperm2i128(ymm0, ymm2, ymm3, 0x20)?;
                e.a.vperm2i128(ymm1, ymm2, ymm3, 0x31)?;
                e.a.vmovdqa(ymmword_ptr(r10), ymm0)?;
                e.a.vmovdqa(ymmword_ptr(r10 + 32), ymm1)?;
            } else {
                // A partial block: column by column.
                for t in 0..2u64 {
                    for c in 0..cols {
                        let to = word_ptr(r10 + (4 * c + 2 * t) as i32);
                        if t >= rows {
                            e.a.mov(to, 0)?;
                            continue;
                        }
                        let at = row_at(e, t, c as i64 * step)?;
                        if signed {
                            e.a.movsx(ecx, byte_ptr(at))?;
                        } else {
                            e.a.movzx(ecx, byte_ptr(at))?;
                        }
                        if zb {
                            e.a.sub(ecx, r8d)?;
                        }
                        e.a.mov(to, cx)?;
                    }
                }
            }
            e.a.add(r10, (NB * 4) as i32)?;
            match table {
                Some(_) => e.a.add(r11, 8)?,
                None => add_imm(&mut e.a, rsi, 2 * e.b_stride, rax)?,
            }
            Ok(())
        };
        if kk / 2 > 0 {
            self.a.mov(rbx, (kk / 2) as i64)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            pair(self, 2)?;
            self.a.dec(rbx)?;
            self.a.jnz(l)?;
        }
        if !kk.is_multiple_of(2) {
            pair(self, 1)?;
        }
        Ok(())
    }

    /// Copies the tile's `rows` rows of `A` (from its tile pointer) as words, `za`
    /// subtracted, to `[rows, ⌈K/2⌉, 2]` before the spilled accumulators (an odd `K`'s
    /// last word 0).
    fn pack_rows_ymm(&mut self, rows: usize) -> R<()> {
        let kk = self.c.dims[2];
        let ap = self.y_apitch();
        let signed = self.c.a.dtype == DType::I8;
        let pre = self.y_pre_bytes();
        let sums = self.zb_cols();
        let ones = self.t.vector(&mut self.a, 0x0001_0001);
        for i in 0..rows {
            let za = self.zero_words(self.za, i, false)?;
            if sums {
                self.a.vpxor(ymm2, ymm2, ymm2)?;
                self.a.xor(r11d, r11d)?;
            }
            self.a.mov(rsi, qword_ptr(rsp + self.s_tile(0)))?;
            add_imm(&mut self.a, rsi, self.a_pitch * i as i64, rax)?;
            self.a.mov(rdx, qword_ptr(rsp + S_PBP))?;
            add_imm(&mut self.a, rdx, (i as i32 * ap - pre) as i64, rax)?;
            let tail = kk % 16 + u64::from(!kk.is_multiple_of(2));
            self.widen_run(kk, signed, za, sums, ones, tail)?;
            if sums {
                // The row's sum into its slot (before the block copies).
                self.store_sum(ROW_SUMS + 4 * i as i32)?;
            }
        }
        Ok(())
    }

    /// Widens the `kk` bytes at `rsi` (`signed`: `i8`, else `u8`) to words at `rdx`,
    /// minus the zero point (`zero`: `ymm15` as words, `r8d` as an i32); with `sums`,
    /// their sum into `ymm2` (by lanes) and `r11d` (the bytes past the last 16). The
    /// last `kk mod 16` bytes are widened one by one, and words up to `tail` after the
    /// last whole 16 are written, 0 past `kk`. `rsi`, `rdx`, `rcx` and `eax` move.
    fn widen_run(&mut self, kk: u64, signed: bool, zero: bool, sums: bool, ones: CodeLabel, tail: u64) -> R<()> {
        if kk / 16 > 0 {
            self.a.mov(rcx, (kk / 16) as i64)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            if signed {
                self.a.vpmovsxbw(ymm0, xmmword_ptr(rsi))?;
            } else {
                self.a.vpmovzxbw(ymm0, xmmword_ptr(rsi))?;
            }
            if zero {
                self.a.vpsubw(ymm0, ymm0, ymm15)?;
            }
            if sums {
                self.a.vpmaddwd(ymm1, ymm0, ymmword_ptr(ones))?;
                self.a.vpaddd(ymm2, ymm2, ymm1)?;
            }
            self.a.vmovdqu(ymmword_ptr(rdx), ymm0)?;
            self.a.add(rsi, 16)?;
            self.a.add(rdx, 32)?;
            self.a.dec(rcx)?;
            self.a.jnz(l)?;
        }
        let rest = kk % 16;
        for t in 0..tail.max(rest) {
            let to = word_ptr(rdx + 2 * t as i32);
            if t >= rest {
                self.a.mov(to, 0)?;
                continue;
            }
            if signed {
                self.a.movsx(eax, byte_ptr(rsi + t as i32))?;
            } else {
                self.a.movzx(eax, byte_ptr(rsi + t as i32))?;
            }
            if zero {
                self.a.sub(eax, r8d)?;
            }
            if sums {
                self.a.add(r11d, eax)?;
            }
            self.a.mov(to, ax)?;
        }
        Ok(())
    }

    /// The sum of `ymm2`'s lanes and `r11d` stored at `S_PBP + at`.
    fn store_sum(&mut self, at: i32) -> R<()> {
        self.a.vextracti128(xmm3, ymm2, 1)?;
        self.a.vpaddd(xmm2, xmm2, xmm3)?;
        self.a.vpshufd(xmm3, xmm2, 0x4E)?;
        self.a.vpaddd(xmm2, xmm2, xmm3)?;
        self.a.vpshufd(xmm3, xmm2, 0xB1)?;
        self.a.vpaddd(xmm2, xmm2, xmm3)?;
        self.a.vmovd(eax, xmm2)?;
        self.a.add(eax, r11d)?;
        self.a.mov(rdx, qword_ptr(rsp + S_PBP))?;
        self.a.mov(dword_ptr(rdx + at), eax)?;
        Ok(())
    }

    /// One tile (AVX2 form): `rows` rows from row `S_MT`, the block's `cols` columns.
    pub(super) fn tile_ymm(&mut self, rows: u64, cols: u64) -> R<()> {
        let rows_ = rows as usize;
        let nv = cols.div_ceil(8) as usize;
        let kk = self.c.dims[2];
        self.tile_pointers()?;
        self.pack_rows_ymm(rows_)?;
        let ap = self.y_apitch();
        let pre = self.y_pre_bytes();
        // The workgroup's blocks, one after another, against these rows.
        let block = self.blocks_top()?;
        let acc = |i: usize, j: usize| YMM[2 * i + j];
        for i in 0..rows_ {
            for j in 0..nv {
                self.a.vpxor(acc(i, j), acc(i, j), acc(i, j))?;
            }
        }
        self.a.mov(r9, qword_ptr(rsp + S_PBP))?;
        add_imm(&mut self.a, r9, -pre as i64, rax)?;
        self.a.mov(r10, qword_ptr(rsp + S_BBUF))?;
        self.a.mov(rbx, kk.div_ceil(2) as i64)?;
        let mut l = self.a.create_label();
        self.a.set_label(&mut l)?;
        for j in 0..nv {
            self.a.vmovdqa(YMM[12 + j], ymmword_ptr(r10 + 32 * j as i32))?;
        }
        for i in 0..rows_ {
            self.a.vpbroadcastd(ymm14, dword_ptr(r9 + ap * i as i32))?;
            for j in 0..nv {
                self.a.vpmaddwd(ymm15, ymm14, YMM[12 + j])?;
                self.a.vpaddd(acc(i, j), acc(i, j), ymm15)?;
            }
        }
        self.a.add(r9, 4)?;
        self.a.add(r10, (NB * 4) as i32)?;
        self.a.dec(rbx)?;
        self.a.jnz(l)?;
        // Accumulators to the stack; the epilogue slot by slot.
        self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
        for i in 0..rows_ {
            for j in 0..nv {
                let at = ACC_AT + 32 * (2 * i + j) as i32;
                self.a.vmovdqu(ymmword_ptr(rax + at), acc(i, j))?;
            }
        }
        let part = cols % 8;
        let pins = self.pin_ymm()?;
        for i in 0..rows_ {
            for j in 0..nv {
                self.y_lanes = if part != 0 && j == nv - 1 { part } else { 0 };
                self.slot_ymm(i, j, &pins)?;
            }
        }
        self.y_lanes = 0;
        self.blocks_next(block)
    }

    /// The lane mask of a partial vector ([`Self::y_lanes`] lanes) into `ymm[r]`.
    fn lane_mask(&mut self, r: usize) -> R<()> {
        let l = self.t.lanes(&mut self.a, self.y_lanes);
        self.a.vmovdqu(YMM[r], ymmword_ptr(l))?;
        Ok(())
    }

    /// The epilogue of accumulator `(i, j)` (row `i` of the tile, vector `j`), read from
    /// the stack, stored; `pins`: operands held in registers ([`Self::pin_ymm`]), which
    /// it reads and never frees.
    fn slot_ymm(&mut self, i: usize, j: usize, pins: &[(ExprId, usize)]) -> R<()> {
        let masked = self.y_lanes != 0;
        let mut ev = Eval::new(self.uses.clone(), i, j, masked);
        for &(p, r) in pins {
            ev.memo.insert(p.0, r);
            ev.left.insert(p.0, u32::MAX);
        }
        let mut pool: Vec<usize> = (0..16).rev().filter(|r| pins.iter().all(|p| p.1 != *r)).collect();
        let r = take(&mut pool)?;
        self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
        self.a.vmovdqu(YMM[r], ymmword_ptr(rax + (ACC_AT + 32 * (2 * i + j) as i32)))?;
        if self.zb_cols() {
            // − zb[n] · Σ(a − za) of the row.
            let zb = self.zb.ok_or_else(|| NotHere("no zero point".into()))?;
            let z = self.eval_ymm(zb, &mut ev, &mut pool)?;
            let t = take(&mut pool)?;
            self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
            self.a.vpbroadcastd(YMM[t], dword_ptr(rax + (ROW_SUMS + 4 * i as i32)))?;
            self.a.vpmulld(YMM[t], YMM[t], YMM[z])?;
            self.a.vpsubd(YMM[r], YMM[r], YMM[t])?;
            pool.push(t);
            self.release(zb, z, &mut ev, &mut pool);
        }
        ev.memo.insert(self.c.reduce.0, r);
        let root = self.k.root;
        let r = self.eval_ymm(root, &mut ev, &mut pool)?;
        let b = &self.bases[2];
        let disp = (b.per_m * i as i64 + 8 * j as i64) * b.elem;
        let disp = i32::try_from(disp).map_err(|_| NotHere("an output row too far".into()))?;
        self.store_ymm(r, disp, &mut pool)
    }

    /// Stores `ymm[r]` (its [`Self::y_lanes`] first lanes where that is not 0) at the
    /// output's tile pointer plus `disp` bytes.
    fn store_ymm(&mut self, r: usize, disp: i32, pool: &mut Vec<usize>) -> R<()> {
        let masked = self.y_lanes != 0;
        let ob = self.s_tile(2);
        self.a.mov(rax, qword_ptr(rsp + ob))?;
        let y = YMM[r];
        match self.k.output.dtype {
            DType::U8 | DType::I8 => {
                // (In range already: an 8-bit value held in i32 lanes.)
                let t = take(pool)?;
                let x = XMM[t];
                self.a.vextracti128(x, y, 1)?;
                self.a.vpackssdw(x, XMM[r], x)?;
                if self.k.output.dtype == DType::U8 {
                    self.a.vpackuswb(x, x, x)?;
                } else {
                    self.a.vpacksswb(x, x, x)?;
                }
                if masked {
                    for l in 0..self.y_lanes {
                        self.a.vpextrb(byte_ptr(rax + (disp + l as i32)), x, l as i32)?;
                    }
                } else {
                    self.a.vmovq(qword_ptr(rax + disp), x)?;
                }
            }
            _ => {
                if masked {
                    let m = take(pool)?;
                    self.lane_mask(m)?;
                    self.a.vpmaskmovd(ymmword_ptr(rax + disp), YMM[m], y)?;
                } else {
                    self.a.vmovdqu(ymmword_ptr(rax + disp), y)?;
                }
            }
        }
        Ok(())
    }

    /// Evaluates `e` for the accumulator of `ev` (eight lanes) into a register of
    /// `pool` (or the one it already holds).
    pub(super) fn eval_ymm(&mut self, e: ExprId, ev: &mut Eval, pool: &mut Vec<usize>) -> R<usize> {
        if let Some(&r) = ev.memo.get(&e.0) {
            return Ok(r);
        }
        let node = self.k.node(e).clone();
        let r = match node.expr {
            Expr::Const(bits) => {
                let l = self.t.scalar(&mut self.a, const_word(node.ty, bits));
                let r = take(pool)?;
                self.a.vpbroadcastd(YMM[r], dword_ptr(l))?;
                r
            }
            Expr::Load { .. } => {
                let (el, vector, disp) = self.load_address(e, ev, 8)?;
                let r = take(pool)?;
                let y = YMM[r];
                let eight = matches!(el.dtype, DType::U8 | DType::I8);
                match (eight, vector) {
                    (true, false) => {
                        self.byte_to_ecx(el.dtype, disp)?;
                        self.a.vmovd(XMM[r], ecx)?;
                        self.a.vpbroadcastd(y, XMM[r])?;
                    }
                    (false, false) => self.a.vpbroadcastd(y, dword_ptr(rax + disp))?,
                    (true, true) => {
                        // A partial vector's bytes through eight bytes of scratch
                        // (nothing past the last column read).
                        let at = if ev.masked {
                            self.a.mov(rdx, qword_ptr(rsp + S_PBP))?;
                            self.a.mov(qword_ptr(rdx + SCRATCH), 0)?;
                            for l in 0..self.y_lanes as i32 {
                                self.a.mov(cl, byte_ptr(rax + (disp + l)))?;
                                self.a.mov(byte_ptr(rdx + (SCRATCH + l)), cl)?;
                            }
                            qword_ptr(rdx + SCRATCH)
                        } else {
                            qword_ptr(rax + disp)
                        };
                        if el.dtype == DType::U8 {
                            self.a.vpmovzxbd(y, at)?;
                        } else {
                            self.a.vpmovsxbd(y, at)?;
                        }
                    }
                    (false, true) => {
                        if ev.masked {
                            let m = take(pool)?;
                            self.lane_mask(m)?;
                            self.a.vpmaskmovd(y, YMM[m], ymmword_ptr(rax + disp))?;
                            pool.push(m);
                        } else {
                            self.a.vmovdqu(y, ymmword_ptr(rax + disp))?;
                        }
                    }
                }
                r
            }
            Expr::Cast { value, to, .. } => self.cast_at(false, value, to, ev, pool)?,
            Expr::Unary(UnaryOp::IsNan, x) => {
                let v = self.eval_ymm(x, ev, pool)?;
                self.release(x, v, ev, pool);
                let r = take(pool)?;
                self.a.vcmpps(YMM[r], YMM[v], YMM[v], 3)?;
                r
            }
            Expr::Select(c, x, y) => {
                let vc = self.eval_ymm(c, ev, pool)?;
                let vx = self.eval_ymm(x, ev, pool)?;
                let vy = self.eval_ymm(y, ev, pool)?;
                self.release(c, vc, ev, pool);
                self.release(x, vx, ev, pool);
                self.release(y, vy, ev, pool);
                let r = take(pool)?;
                // r = c ? x : y (the lanes of `c` are all ones or zeros).
                self.a.vblendvps(YMM[r], YMM[vy], YMM[vx], YMM[vc])?;
                r
            }
            Expr::Unary(op, x) => self.unary_at(false, op, x, ev, pool)?,
            Expr::Binary(op, x, y) if node.ty == ScalarType::Bool => {
                let vx = self.eval_ymm(x, ev, pool)?;
                let vy = self.eval_ymm(y, ev, pool)?;
                self.release(x, vx, ev, pool);
                self.release(y, vy, ev, pool);
                let r = take(pool)?;
                // Signed i32 comparisons (see the 512-bit form): `>` (operands swapped
                // for `<`) or `=`, the others as the complement of their opposite.
                let (gt, swap, negate) = match op {
                    BinaryOp::Eq => (false, false, false),
                    BinaryOp::Ne => (false, false, true),
                    BinaryOp::Gt => (true, false, false),
                    BinaryOp::Lt => (true, true, false),
                    BinaryOp::Le => (true, false, true),
                    BinaryOp::Ge => (true, true, true),
                    _ => return no("an epilogue comparison"),
                };
                let (a, b) = if swap { (YMM[vy], YMM[vx]) } else { (YMM[vx], YMM[vy]) };
                if gt {
                    self.a.vpcmpgtd(YMM[r], a, b)?;
                } else {
                    self.a.vpcmpeqd(YMM[r], a, b)?;
                }
                if negate {
                    let mut vx = Vx { a: &mut self.a, t: &mut self.t, wide: false, held: &[] };
                    vx.op(Op::Xor, V(r as u8), V(r as u8), Src::C(u32::MAX))?;
                }
                r
            }
            Expr::Binary(op, x, y) => {
                let f = node.ty == ScalarType::F32;
                let (x, y) = self.clamp_order(op, f, x, y);
                let vx = self.eval_ymm(x, ev, pool)?;
                let vy = self.eval_ymm(y, ev, pool)?;
                self.release(x, vx, ev, pool);
                self.release(y, vy, ev, pool);
                let r = take(pool)?;
                binary_regs(&mut self.a, false, f, op, r, vx, vy)?;
                r
            }
            _ => return no("an epilogue node without an 8-lane form"),
        };
        ev.memo.insert(e.0, r);
        Ok(r)
    }
}

impl Emitter<'_> {
    /// The one-column form (`N` = 1, `K` ≥ 16; see [`Emitter::gemv_fits`]): a workgroup
    /// is up to [`GEMV_PASSES`] passes of eight rows ([`Self::y_gemv_passes`]). `B`'s
    /// column is copied once a workgroup as words, `zb` subtracted (`b'`), zero-padded to
    /// a multiple of 16, its sum `Σb'` taken; in each pass, each row's 16-byte chunks
    /// are widened and multiplied with `vpmaddwd` against the copy (each 16 words of it
    /// loaded once for the eight rows) into one accumulator a row (the last chunk is the
    /// row's last 16 bytes, against a copy of the column's last 16 words with those
    /// counted already zeroed: nothing past a row is read); the eight accumulators are
    /// summed across their lanes into one vector of eight rows (`vphaddd`), `za·Σb'`
    /// subtracted, and the epilogue runs on it, rows in the lanes. (A workgroup of one
    /// pass copied the column for every eight rows: a fifth of mlp_int8's first layer.)
    pub(super) fn function_gemv_ymm(&mut self) -> R<()> {
        enter(&mut self.a)?;
        let m = self.c.dims[0];
        let kk = self.c.dims[2];
        let padded = kk.div_ceil(16) * 16;
        let chunks = kk / 16;
        let rem = kk % 16;
        let nibbles = self.y_nibbles();
        // Stack: the coordinates and pointers, 64 bytes of slots (`Σb'`, scratch), the
        // copy of the column and its tail copy (32-byte aligned at run time; the nibble
        // form's: [`Self::nibble_bytes`]).
        let region = self.s_rs();
        let copy = if nibbles { self.nibble_bytes() } else { 2 * padded as i32 + 32 };
        let frame = (region + 32 + 64 + copy + 15) / 16 * 16;
        reserve(&mut self.a, frame)?;
        let done = self.workgroup_range()?;
        self.a.lea(rax, qword_ptr(rsp + (region + 31)))?;
        self.a.and(rax, -32)?;
        self.a.add(rax, 64)?;
        self.a.mov(qword_ptr(rsp + S_PBP), rax)?;
        let groups = m.div_ceil(GEMV_ROWS);
        let passes = self.y_gemv_passes();
        // The workgroup's first group of eight rows, and its passes (`S_TCOUNT`: the
        // last workgroup may have fewer).
        let (top, next) = self.workgroup_top(self.y_gemv_workgroups())?;
        self.imul(rdx, passes as i64)?;
        self.a.mov(qword_ptr(rsp + S_GROUP), rdx)?;
        self.a.mov(rcx, groups as i64)?;
        self.a.sub(rcx, rdx)?;
        self.a.mov(rdx, passes as i64)?;
        self.a.cmp(rcx, rdx)?;
        self.a.cmova(rcx, rdx)?;
        self.a.mov(qword_ptr(rsp + S_TCOUNT), rcx)?;
        self.gemv_pointers(8)?;
        if nibbles {
            self.copy_nibbles()?;
        } else {
            self.copy_column_words()?;
        }
        let pass = self.a.create_label();
        let mut pass_top = self.a.create_label();
        self.a.set_label(&mut pass_top)?;
        let last_rows = m - (groups - 1) * GEMV_ROWS;
        let variants: Vec<(u64, bool)> =
            if last_rows != 8 { vec![(last_rows, true), (8, false)] } else { vec![(8, false)] };
        let pitch = self.a_pitch;
        let a_signed = self.c.a.dtype == DType::I8;
        for (rows, last) in variants {
            let other = self.variant_guard(last && groups > 1, S_GROUP, (groups - 1) as i32)?;
            let n = rows as usize;
            if nibbles {
                self.nibble_pass(rows)?;
            } else {
                for &y in &YMM[..n] {
                    self.a.vpxor(y, y, y)?;
                }
                // acc[r] += widened A[r, chunk] · copy[chunk]
                let chunk = |e: &mut Self, b: AsmMemoryOperand| -> R<()> {
                    e.a.vmovdqu(ymm9, b)?;
                    for (r, &acc) in YMM[..n].iter().enumerate() {
                        let at = xmmword_ptr(r9 + (pitch * r as i64) as i32);
                        if a_signed {
                            e.a.vpmovsxbw(ymm8, at)?;
                        } else {
                            e.a.vpmovzxbw(ymm8, at)?;
                        }
                        e.a.vpmaddwd(ymm8, ymm8, ymm9)?;
                        e.a.vpaddd(acc, acc, ymm8)?;
                    }
                    Ok(())
                };
                self.a.mov(r9, qword_ptr(rsp + self.s_tile(0)))?;
                self.a.mov(rsi, qword_ptr(rsp + S_PBP))?;
                if chunks > 0 {
                    self.a.mov(rcx, chunks as i64)?;
                    let mut l = self.a.create_label();
                    self.a.set_label(&mut l)?;
                    chunk(self, ymmword_ptr(rsi))?;
                    self.a.add(r9, 16)?;
                    self.a.add(rsi, 32)?;
                    self.a.dec(rcx)?;
                    self.a.jnz(l)?;
                }
                if rem > 0 {
                    // The rows' last 16 bytes against the tail copy.
                    self.a.mov(r9, qword_ptr(rsp + self.s_tile(0)))?;
                    add_imm(&mut self.a, r9, kk as i64 - 16, rax)?;
                    self.a.mov(rsi, qword_ptr(rsp + S_PBP))?;
                    chunk(self, ymmword_ptr(rsi + 2 * padded as i32))?;
                }
                for &y in &YMM[n..8] {
                    self.a.vpxor(y, y, y)?;
                }
            }
            // The eight rows' sums into one vector (row r in lane r).
            self.a.vphaddd(ymm0, ymm0, ymm1)?;
            self.a.vphaddd(ymm2, ymm2, ymm3)?;
            self.a.vphaddd(ymm4, ymm4, ymm5)?;
            self.a.vphaddd(ymm6, ymm6, ymm7)?;
            self.a.vphaddd(ymm0, ymm0, ymm2)?;
            self.a.vphaddd(ymm4, ymm4, ymm6)?;
            self.a.vperm2i128(ymm1, ymm0, ymm4, 0x20)?;
            self.a.vperm2i128(ymm2, ymm0, ymm4, 0x31)?;
            self.a.vpaddd(ymm0, ymm1, ymm2)?;
            self.y_lanes = if rows < 8 { rows } else { 0 };
            let mut ev = Eval::new(self.uses.clone(), 0, 0, rows < 8);
            ev.rows_lanes = true;
            let mut pool: Vec<usize> = (1..16).rev().collect();
            if let Some(za) = self.za {
                // − za · Σb'
                let z = self.eval_ymm(za, &mut ev, &mut pool)?;
                let t = take(&mut pool)?;
                self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
                self.a.vpbroadcastd(YMM[t], dword_ptr(rax + ROW_SUMS))?;
                self.a.vpmulld(YMM[t], YMM[t], YMM[z])?;
                self.a.vpsubd(ymm0, ymm0, YMM[t])?;
                pool.push(t);
                self.release(za, z, &mut ev, &mut pool);
            }
            ev.memo.insert(self.c.reduce.0, 0);
            let root = self.k.root;
            let r = self.eval_ymm(root, &mut ev, &mut pool)?;
            self.store_ymm(r, 0, &mut pool)?;
            self.y_lanes = 0;
            self.a.jmp(pass)?;
            self.land(other)?;
        }
        // The next pass: its group, and the pointers of every per-row operand.
        let mut pass = pass;
        self.a.set_label(&mut pass)?;
        self.a.inc(qword_ptr(rsp + S_GROUP))?;
        for bi in 0..self.bases.len() {
            let b = &self.bases[bi];
            if b.per_m != 0 {
                let st = self.s_tile(bi);
                let step = GEMV_ROWS as i64 * b.per_m * b.elem;
                let step = i32::try_from(step).map_err(|_| NotHere("a row step".into()))?;
                self.a.add(qword_ptr(rsp + st), step)?;
            }
        }
        self.a.dec(qword_ptr(rsp + S_TCOUNT))?;
        self.a.jnz(pass_top)?;
        self.workgroup_loop_end(next, top, done, frame)
    }
}

impl Emitter<'_> {
    /// The one-column form's copy of `B`'s column (at the workgroup's `S_TILE(1)`) as
    /// words at `S_PBP`, `zb` subtracted (`b'`), zero-padded to a multiple of 16, and
    /// the copy of its last 16 words with the first `16 − K mod 16` zero after it (where
    /// `K` is not a multiple of 16); `Σb'` into its slot (`ROW_SUMS`).
    fn copy_column_words(&mut self) -> R<()> {
        let kk = self.c.dims[2];
        let padded = kk.div_ceil(16) * 16;
        let rem = kk % 16;
        let zb = self.zero_words(self.zb, 0, true)?;
        let ones = self.t.vector(&mut self.a, 0x0001_0001);
        let b_signed = self.c.b.dtype == DType::I8;
        self.a.mov(rsi, qword_ptr(rsp + self.s_tile(1)))?;
        self.a.mov(rdx, qword_ptr(rsp + S_PBP))?;
        self.a.vpxor(ymm2, ymm2, ymm2)?;
        self.a.xor(r11d, r11d)?;
        self.widen_run(kk, b_signed, zb, true, ones, if rem > 0 { 16 } else { 0 })?;
        if rem > 0 {
            // The tail copy: the column's last 16 words, the first `16 − rem` zero.
            self.a.mov(rdx, qword_ptr(rsp + S_PBP))?;
            for t in 0..16i32 {
                let to = word_ptr(rdx + (2 * padded as i32 + 2 * t));
                if (t as u64) < 16 - rem {
                    self.a.mov(to, 0)?;
                } else {
                    self.a.mov(ax, word_ptr(rdx + (2 * (kk as i32 - 16 + t))))?;
                    self.a.mov(to, ax)?;
                }
            }
        }
        self.store_sum(ROW_SUMS)?;
        Ok(())
    }

    /// Whether the one-column form multiplies bytes by nibbles ([`Self::nibble_pass`]):
    /// `A` is `i8`, `B` is `u8`, neither has a zero point in the kernel (a dynamic-int8
    /// model's weight times its quantised activation, the activation's zero point folded
    /// into the epilogue by `kiln_flow::dequant::fold_int_constant_sums`), `K` ≥ 32.
    pub(super) fn y_nibbles(&self) -> bool {
        self.c.a.dtype == DType::I8
            && self.c.b.dtype == DType::U8
            && self.za.is_none()
            && self.zb.is_none()
            && self.c.dims[2] >= 32
    }

    /// Bytes of one nibble copy ([`Self::copy_nibbles`]): `K` rounded up to 32.
    fn nibble_pitch(&self) -> i32 {
        self.c.dims[2].div_ceil(32) as i32 * 32
    }

    /// Bytes the nibble form keeps after `S_PBP`: the two nibble copies, their two tail
    /// copies, and four spilled accumulators.
    pub(super) fn nibble_bytes(&self) -> i32 {
        2 * self.nibble_pitch() + 64 + 128
    }

    /// The nibble form's copy of `B`'s `u8` column (at the workgroup's `S_TILE(1)`) at
    /// `S_PBP`: its low nibbles (`b & 15`), zero-padded to a multiple of 32 bytes, then
    /// its high nibbles (`b >> 4`) alike; where `K` is not a multiple of 32, the last 32
    /// bytes of each with the first `32 − K mod 32` zero after them (against a row's
    /// last 32 bytes, which the whole chunks counted already).
    fn copy_nibbles(&mut self) -> R<()> {
        let kk = self.c.dims[2];
        let p = self.nibble_pitch();
        let mask = self.t.vector(&mut self.a, 0x0F0F_0F0F);
        self.a.mov(rsi, qword_ptr(rsp + self.s_tile(1)))?;
        self.a.mov(rdx, qword_ptr(rsp + S_PBP))?;
        if kk / 32 > 0 {
            self.a.mov(rcx, (kk / 32) as i64)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            self.a.vmovdqu(ymm0, ymmword_ptr(rsi))?;
            self.a.vpand(ymm1, ymm0, ymmword_ptr(mask))?;
            self.a.vpsrlw(ymm0, ymm0, 4)?;
            self.a.vpand(ymm0, ymm0, ymmword_ptr(mask))?;
            self.a.vmovdqu(ymmword_ptr(rdx), ymm1)?;
            self.a.vmovdqu(ymmword_ptr(rdx + p), ymm0)?;
            self.a.add(rsi, 32)?;
            self.a.add(rdx, 32)?;
            self.a.dec(rcx)?;
            self.a.jnz(l)?;
        }
        let rem = (kk % 32) as i32;
        if rem == 0 {
            return Ok(());
        }
        for t in 0..32 {
            if t < rem {
                self.a.movzx(eax, byte_ptr(rsi + t))?;
                self.a.mov(ecx, eax)?;
                self.a.and(eax, 15)?;
                self.a.shr(ecx, 4)?;
                self.a.mov(byte_ptr(rdx + t), al)?;
                self.a.mov(byte_ptr(rdx + (p + t)), cl)?;
            } else {
                self.a.mov(byte_ptr(rdx + t), 0)?;
                self.a.mov(byte_ptr(rdx + (p + t)), 0)?;
            }
        }
        self.a.mov(rdx, qword_ptr(rsp + S_PBP))?;
        for h in 0..2 {
            for t in 0..32 {
                let to = byte_ptr(rdx + (2 * p + 32 * h + t));
                if t < 32 - rem {
                    self.a.mov(to, 0)?;
                } else {
                    self.a.mov(al, byte_ptr(rdx + (p * h + kk as i32 - 32 + t)))?;
                    self.a.mov(to, al)?;
                }
            }
        }
        Ok(())
    }

    /// The nibble form of a pass's products: the `rows` rows' sums against the column
    /// into `ymm0`..`ymm7` by lanes (0 past `rows`), as the word form leaves them.
    ///
    /// `Σ a·b = 16·Σ a·(b >> 4) + Σ a·(b & 15)`, each half one `vpmaddubsw` a 32 bytes
    /// of a row (the nibble the unsigned operand): a pair's sum is at most
    /// `2·128·15 = 3840` in magnitude, so no 16-bit sum saturates, and eight of them
    /// add into a 16-bit accumulator exactly (`vpaddw`, at most 30720); every eight
    /// chunks the two 16-bit accumulators of a row are widened into its i32 one by a
    /// `vpmaddwd` with 16s and with 1s. Four rows at a time (four i32 and eight 16-bit
    /// accumulators, both nibble vectors, one product); the first four rows' sums wait
    /// on the stack. Per 32 bytes of a row: two `vpmaddubsw` and two `vpaddw`, where the
    /// word form takes two `vpmovsxbw`, two `vpmaddwd` and two `vpaddd`. Each
    /// row's bytes of the next pass are prefetched (`prefetcht0`, one a 64-byte line).
    fn nibble_pass(&mut self, rows: u64) -> R<()> {
        let kk = self.c.dims[2];
        let p = self.nibble_pitch();
        let pitch = self.a_pitch;
        let ones = self.t.vector(&mut self.a, 0x0001_0001);
        let sixteens = self.t.vector(&mut self.a, 0x0010_0010);
        let spill = 2 * p + 64;
        let chunks = kk / 32;
        let rem = (kk % 32) as i32;
        let rest = (chunks % 8) as i32;
        for h in 0..2usize {
            let n = rows.saturating_sub(4 * h as u64).min(4) as usize;
            let acc = |r: usize| YMM[4 * h + r];
            let lo = |r: usize| YMM[4 * (1 - h) + r];
            let hi = |r: usize| YMM[8 + r];
            for r in 0..4 {
                self.a.vpxor(acc(r), acc(r), acc(r))?;
            }
            if n > 0 {
                for r in 0..n {
                    self.a.vpxor(lo(r), lo(r), lo(r))?;
                    self.a.vpxor(hi(r), hi(r), hi(r))?;
                }
                self.a.mov(r9, qword_ptr(rsp + self.s_tile(0)))?;
                add_imm(&mut self.a, r9, pitch * 4 * h as i64, rax)?;
                self.a.mov(r10, qword_ptr(rsp + S_PBP))?;
                self.a.mov(rsi, r10)?;
                // One chunk: the rows' 32 bytes at `r9 + at` against the nibbles at
                // `low` and `low + high`.
                let chunk = |e: &mut Self, at: i32, low: AsmMemoryOperand, high: AsmMemoryOperand| -> R<()> {
                    e.a.vmovdqu(ymm12, low)?;
                    e.a.vmovdqu(ymm13, high)?;
                    for r in 0..n {
                        let row =
                            i32::try_from(pitch * r as i64 + at as i64).map_err(|_| NotHere("a row too far".into()))?;
                        if at % 64 == 0 {
                            // (One a 64-byte line.)
                            let ahead = i32::try_from(pitch * (r as i64 + PREFETCH_ROWS) + at as i64)
                                .map_err(|_| NotHere("a row too far".into()))?;
                            e.a.prefetcht0(byte_ptr(r9 + ahead))?;
                        }
                        e.a.vpmaddubsw(ymm14, ymm12, ymmword_ptr(r9 + row))?;
                        e.a.vpaddw(lo(r), lo(r), ymm14)?;
                        e.a.vpmaddubsw(ymm14, ymm13, ymmword_ptr(r9 + row))?;
                        e.a.vpaddw(hi(r), hi(r), ymm14)?;
                    }
                    Ok(())
                };
                let flush = |e: &mut Self| -> R<()> {
                    for r in 0..n {
                        e.a.vpmaddwd(ymm14, hi(r), ymmword_ptr(sixteens))?;
                        e.a.vpaddd(acc(r), acc(r), ymm14)?;
                        e.a.vpmaddwd(ymm14, lo(r), ymmword_ptr(ones))?;
                        e.a.vpaddd(acc(r), acc(r), ymm14)?;
                        e.a.vpxor(lo(r), lo(r), lo(r))?;
                        e.a.vpxor(hi(r), hi(r), hi(r))?;
                    }
                    Ok(())
                };
                if chunks >= 8 {
                    self.a.mov(rcx, (chunks / 8) as i64)?;
                    let mut l = self.a.create_label();
                    self.a.set_label(&mut l)?;
                    for j in 0..8 {
                        chunk(self, 32 * j, ymmword_ptr(rsi + 32 * j), ymmword_ptr(rsi + (p + 32 * j)))?;
                    }
                    flush(self)?;
                    self.a.add(r9, 256)?;
                    self.a.add(rsi, 256)?;
                    self.a.dec(rcx)?;
                    self.a.jnz(l)?;
                }
                for j in 0..rest {
                    chunk(self, 32 * j, ymmword_ptr(rsi + 32 * j), ymmword_ptr(rsi + (p + 32 * j)))?;
                }
                if rem > 0 {
                    // The rows' last 32 bytes against the tail copies.
                    chunk(self, 32 * rest + rem - 32, ymmword_ptr(r10 + 2 * p), ymmword_ptr(r10 + (2 * p + 32)))?;
                }
                if rest > 0 || rem > 0 {
                    flush(self)?;
                }
            }
            if h == 0 {
                self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
                for r in 0..4 {
                    self.a.vmovdqu(ymmword_ptr(rax + (spill + 32 * r as i32)), YMM[r])?;
                }
            }
        }
        self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
        for r in 0..4 {
            self.a.vmovdqu(YMM[r], ymmword_ptr(rax + (spill + 32 * r as i32)))?;
        }
        Ok(())
    }
}

/// Whether zero point `z` (an i32 node) is an 8-bit value: a cast of a `u8` or `i8`
/// value, or a constant in `[−128, 255]`.
fn eight_bit(k: &Kernel, z: ExprId) -> bool {
    match k.node(z).expr {
        Expr::Const(bits) => (-128..=255).contains(&(bits as u32 as i32)),
        Expr::Cast { value, .. } => matches!(k.node(value).ty, ScalarType::U8 | ScalarType::I8),
        _ => false,
    }
}
