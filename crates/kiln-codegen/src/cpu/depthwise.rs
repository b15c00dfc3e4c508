//! Depthwise convolutions and max and average pools, 2-D and 1-D
//! ([`kiln_flow::window::Depthwise`]), as AVX2+FMA machine code written with `iced-x86`,
//! reading the unpadded input directly.
//!
//! A workgroup is one channel plane `(n, c)` (a 1-D window's plane is one row). A
//! filter of at most [`TAPS_IN_REGISTERS`] taps is broadcast into registers once per
//! plane; a larger one (5×5, 7×7, 1-D windows of 20 or 31 taps) keeps one tap register
//! and broadcasts each tap from the filter where it is used, once per group of
//! vectors, which leaves 12 to 13 registers to accumulators. Per-channel epilogue
//! values go to the stack as vectors. Each output row is computed in groups of up to
//! `G` vectors of 8 columns, `G` the registers left over: per tap one FMA per vector,
//! reading the input row in place. Rows narrower than `G` vectors are taken several at
//! a time (a 7-wide plane: 4 or 5 rows), so independent FMA chains overlap. A wide
//! row's interior groups (every load and store whole) are one loop that moves the row
//! pointers a group on per turn, so the code does not grow with the row's width; only
//! the border groups are unrolled. The border is handled where it is, with no padded copy of the input:
//! - a window row outside the plane is skipped (one compare per window row, emitted
//!   only for rows that can fall outside);
//! - columns outside the plane are masked lanes, 0 (the padding value): a vector whose
//!   lanes are all inside is an FMA with a memory operand; a border vector that stays
//!   inside the plane (its lanes past the row are other rows' elements) is read whole
//!   and blended with 0 (`vblendps`); only one that would reach past the plane (the
//!   first row's left border, the last row's right border) is a `vmaskmovps` load that
//!   reads nothing there, which costs about five plain loads on AMD Zen. The row loop's
//!   first and last turns are unrolled where theirs would, so the turns between blend
//!   ([`Emit::block_reads_inside`]). On AMD Zen (one thread): 14×14 × 384 channels 0.278
//!   → 0.102 ms, 7×7 × 960 0.239 → 0.083, 28×28 × 192 0.317 → 0.159, 56×56 × 144 0.475
//!   → 0.343.
//!
//! Where the target has AVX-512 F and VL, border vectors take opmasks instead (`k1`–`k7`,
//! one per lane pattern, set once per call): a convolution's tap is one FMA under the
//! mask (masked lanes neither read memory nor change the accumulator: zero padding), a
//! stride-2 half one zeroing masked load, where either was a mask load and a
//! `vmaskmovps` too; a max pool's border load is one load merged under the mask into
//! −∞, where it was a mask load, a `vmaskmovps` and a blend. On 3×3 depthwise
//! convolutions (one thread): 14×14 × 384 channels 0.040 → 0.024 ms, 7×7 × 960 0.032 →
//! 0.016, 28×28 × 192 0.061 → 0.047, 56×56 × 144 0.149 → 0.130, 14×14 × 576 at stride 2
//! 0.028 → 0.020.
//!
//! A max pool keeps −∞ in one register instead of taps: its accumulators start there,
//! each tap is `vmaxps acc, x, acc` (which gives `acc` where `x` is NaN: NaN is
//! ignored, as MaxPool wants), and lanes outside the plane are blended to −∞. Its
//! taps go input row by input row: the maximum along a window row is taken once and
//! folded into every output row of the block whose window holds that input row, so
//! `R` output rows of a `KH × KW` window cost about `(R + KH − 1)·KW + R·KH` maxima, not
//! `R·KH·KW` (YOLO's SPPF 13×13 pools over 13×13 planes: blocks of 6 rows, 3× fewer).
//!
//! Stride-2 columns take the even elements of two loads (`vshufps`, the second half
//! from memory where it is whole), their lanes in an order that one `vpermpd` of each
//! sum puts right before the epilogue (one a tap did: mobilenet_v2's four stride-2
//! 3×3 depthwise convolutions, see `Emit::fetch`); wider
//! column strides gather their 8 columns (`vgatherdps` under the mask of the lanes
//! inside the row). Any row stride is a pointer step. The
//! epilogue steps (bias, scale, clamps) apply to each vector before the store. A row's
//! last vector is stored whole where its extra lanes stay inside the plane (they land
//! in rows stored after it); only the plane's last rows mask it.
//!
//! ## Numerics
//! Each output is the f32 sum over the taps in row-major order from 0, one rounding
//! per FMA, then the epilogue steps in the kernel's order (exact clamps: `max(c, v)`
//! keeps a NaN `v`).

use iced_x86::code_asm::*;
use kiln_flow::window::{Depthwise, Step, StepOperand, WindowOp};
use kiln_flow::Kernel;

use super::asm::{enter, leave, under_mask, Tables, YMM};
use super::gemm::{no, NotHere, R};

/// Taps a convolution keeps in registers for a whole plane; one of more taps
/// broadcasts each tap from the filter where it is used (one load for every vector of
/// a group), which leaves more registers to accumulators.
const TAPS_IN_REGISTERS: u64 = 9;

/// A compiled window kernel.
pub(crate) struct WindowCode {
    pub code: Vec<u8>,
    pub workgroups: u64,
    /// The compile listing's note.
    pub note: &'static str,
    /// Whether it uses AVX-512 (F and VL) opmasks.
    pub avx512: bool,
}

/// Emits `k` as a window kernel, or says why not. `avx512vl`: the target has AVX-512 F
/// and VL, so a convolution's border taps may be FMAs under an opmask (a max pool's,
/// loads under one).
pub(crate) fn emit(k: &Kernel, avx512vl: bool) -> R<WindowCode> {
    let Some(d) = Depthwise::of(k) else { return no("not a depthwise window") };
    // f32 lanes only: half storage (`--precision`) runs on the general path.
    if super::gemm::half_storage(k) {
        return no("f16 or bf16 storage (f32 lanes only)");
    }
    let limit = i32::MAX as usize;
    if k.inputs.iter().chain([&k.output]).any(|t| t.storage_bytes() > limit) {
        return no("an operand over 2 GiB");
    }
    let mut e = Emit::new(&d, k.inputs.len())?;
    if avx512vl {
        e.plan_opmasks();
    }
    let avx512 = !e.opmasks.is_empty();
    let note = match d.op {
        WindowOp::Conv { .. } if avx512 => "depthwise window (avx2+fma, avx-512 border masks)",
        WindowOp::Conv { .. } => "depthwise window (avx2+fma)",
        WindowOp::Max if avx512 => "max pool window (avx2, avx-512 border masks)",
        WindowOp::Max => "max pool window (avx2)",
        WindowOp::Sum if avx512 => "average pool window (avx2, avx-512 border masks)",
        WindowOp::Sum => "average pool window (avx2)",
    };
    let (code, workgroups) = e.run()?;
    Ok(WindowCode { code, workgroups, note, avx512 })
}

/// `r{k}`: register `r` written under opmask `k` (1–7), merging.
fn under(r: AsmRegisterYmm, k: u8) -> AsmRegisterYmm {
    under_mask!(r, k)
}

struct Emit<'d> {
    a: CodeAssembler,
    d: &'d Depthwise,
    /// The output's binding slot (after the inputs).
    out_slot: usize,
    /// Per-channel epilogue operands, one stack vector each.
    channel: Vec<(u32, kiln_flow::affine::AffineIndex)>,
    /// Lane masks and constants, emitted after the code.
    t: Tables,
    /// Registers: taps, then scratch, then accumulators. A convolution of more than
    /// [`TAPS_IN_REGISTERS`] taps has one tap register, filled per use from the filter
    /// (`r15`); a max pool's one holds −∞.
    taps: Vec<AsmRegisterYmm>,
    /// Whether a convolution's taps are all held in `taps`.
    taps_held: bool,
    scratch: Vec<AsmRegisterYmm>,
    accs: Vec<AsmRegisterYmm>,
    /// Lane patterns of border columns held in opmask registers `k1`–`k7` (the
    /// pattern's bits, the register's number), set once per call.
    opmasks: Vec<(u8, u8)>,
    /// The first output rows (`r14`) of every block the code being emitted runs for:
    /// one for an unrolled block, each turn's for the loop's.
    at_rows: Vec<i64>,
}

impl<'d> Emit<'d> {
    fn new(d: &'d Depthwise, inputs: usize) -> R<Emit<'d>> {
        let all_taps = d.window[0] * d.window[1];
        let taps_held = all_taps <= TAPS_IN_REGISTERS;
        // A max pool's one "tap" register holds −∞; a sum has no filter; a convolution
        // of many taps broadcasts each into one register where it is used.
        let ntaps = match d.op {
            WindowOp::Max => 1,
            WindowOp::Sum => 0,
            WindowOp::Conv { .. } if taps_held => all_taps as usize,
            WindowOp::Conv { .. } => 1,
        };
        // Scratch: the loaded vector, the second half of a stride-2 load (or a gather's
        // index vector), and a lane mask last; a max pool also the maximum along a
        // window row shared by several output rows.
        let mut nscratch = if d.stride[1] == 1 { 2 } else { 3 };
        if d.op == WindowOp::Max {
            nscratch += 1;
        }
        let mut channel = Vec::new();
        let inner = d.epilogue.iter().flat_map(|s| match s {
            Step::MulSelf(inner) => inner.as_slice(),
            _ => &[],
        });
        for s in d.epilogue.iter().chain(inner) {
            if let Step::Add(o) | Step::Sub(o) | Step::SubFrom(o) | Step::Mul(o) | Step::Div(o) | Step::DivInto(o) = s {
                if let StepOperand::Channel { input, offset } = o {
                    if !channel.iter().any(|(i, f)| i == input && f == offset) {
                        channel.push((*input, offset.clone()));
                    }
                }
            }
        }
        Ok(Emit {
            a: CodeAssembler::new(64)?,
            d,
            out_slot: inputs,
            channel,
            t: Tables::default(),
            taps: YMM[..ntaps].to_vec(),
            taps_held,
            scratch: YMM[ntaps..ntaps + nscratch].to_vec(),
            accs: YMM[ntaps + nscratch..].to_vec(),
            opmasks: Vec::new(),
            at_rows: Vec::new(),
        })
    }

    /// Gives the border columns' lane patterns (which depend only on a vector's place
    /// in the row and the window column) opmask registers, the first seven of them:
    /// such a tap is then one FMA whose masked lanes neither read memory nor change
    /// the accumulator (zero padding), where it was a mask load, a `vmaskmovps` and an
    /// FMA.
    fn plan_opmasks(&mut self) {
        let d = self.d;
        let (ow_n, w) = (d.out_dims[3] as i64, d.in_dims[3] as i64);
        let (sw, dil_w, pw, kw_n) = (d.stride[1], d.dilation[1], d.offset[1], d.window[1] as i64);
        if sw > 2 {
            // (Wider strides gather their columns under a vector mask.)
            return;
        }
        for j in 0..(ow_n + 7) / 8 {
            for kw in 0..kw_n {
                let col = sw * 8 * j + dil_w * kw + pw;
                // (A stride-2 vector is put together from two loads: 8 columns apart.)
                for first in if sw == 1 { vec![col] } else { vec![col, col + 8] } {
                    let bits = Self::inside(first, w);
                    if bits != 0 && bits != 0xff && self.opmask(bits).is_none() && self.opmasks.len() < 7 {
                        self.opmasks.push((bits, self.opmasks.len() as u8 + 1));
                    }
                }
            }
        }
    }

    /// The opmask register number holding lane pattern `bits`, if one does.
    fn opmask(&self, bits: u8) -> Option<u8> {
        self.opmasks.iter().find(|m| m.0 == bits).map(|m| m.1)
    }

    fn const_label(&mut self, bits: u32) -> CodeLabel {
        self.t.scalar(&mut self.a, bits)
    }

    /// The mask with lane `i` on where bit `i` of `bits` is set.
    fn mask_label(&mut self, bits: u8) -> CodeLabel {
        self.t.mask(&mut self.a, bits)
    }

    /// Lanes `e` of `0..8` with `0 ≤ first + e < extent`, as bits.
    fn inside(first: i64, extent: i64) -> u8 {
        (0..8).filter(|e| (0..extent).contains(&(first + e))).fold(0u8, |m, e| m | (1 << e))
    }

    /// Whether the 8 elements at `rbx + disp·4`, on window row `row` (the input row
    /// `sh·r14 + row`), lie inside the input plane at every output row `r14` the code
    /// being emitted runs at ([`Emit::at_rows`]), where that input row is read at all
    /// (outside the plane [`Emit::row_check`] skips it). Lanes outside the row but
    /// inside the plane are other rows' elements: a whole load reads them harmlessly
    /// and a blend drops them; only the plane's first and last rows can reach past it.
    fn whole_read_inside(&self, row: i64, disp: i64) -> bool {
        let d = self.d;
        let (h, w, sh, ph) = (d.in_dims[2] as i64, d.in_dims[3] as i64, d.stride[0], d.offset[0]);
        !self.at_rows.is_empty()
            && self
                .at_rows
                .iter()
                .all(|&oh| !(0..h).contains(&(sh * oh + row)) || self.vector_in_plane((sh * oh + ph) * w + disp))
    }

    /// Whether the 8 elements from element `o` of the input plane are all in it.
    fn vector_in_plane(&self, o: i64) -> bool {
        let [_, _, h, w] = self.d.in_dims.map(|x| x as i64);
        o >= 0 && o + 8 <= h * w
    }

    /// `dst` = 8 elements at `rbx + disp·4` (window row `row`, as for
    /// [`Emit::whole_read_inside`]) whose lanes `bits` are inside the row (0 elsewhere);
    /// `None` when no lane is. Lanes outside are read and blended to 0 where the whole
    /// vector stays inside the plane, else not read at all (a mask load: `vmaskmovps`
    /// costs about five plain loads and a blend on AMD Zen).
    fn load(&mut self, dst: AsmRegisterYmm, disp: i64, bits: u8, row: i64) -> R<bool> {
        let at = ymmword_ptr(rbx + (disp * 4) as i32);
        match bits {
            0 => Ok(false),
            0xff => {
                self.a.vmovups(dst, at)?;
                Ok(true)
            }
            _ => {
                if let Some(k) = self.opmask(bits) {
                    // Zeroing: lanes outside read nothing and are 0.
                    self.a.evex().vmovups(under(dst, k).z(), at)?;
                    return Ok(true);
                }
                if self.whole_read_inside(row, disp) {
                    self.a.vxorps(dst, dst, dst)?;
                    self.a.vblendps(dst, dst, at, u32::from(bits))?;
                    return Ok(true);
                }
                let l = self.mask_label(bits);
                let m = self.scratch[self.scratch.len() - 1];
                self.a.vmovups(m, ymmword_ptr(l))?;
                self.a.vmaskmovps(dst, m, at)?;
                Ok(true)
            }
        }
    }

    /// `dst` = 8 elements at `rbx + disp·4` (window row `row`) for a max pool: lanes
    /// outside the row (not in `bits`) are −∞.
    fn load_max(&mut self, dst: AsmRegisterYmm, disp: i64, bits: u8, row: i64) -> R<()> {
        let neg_inf = self.taps[0];
        match bits {
            0 => self.a.vmovaps(dst, neg_inf)?,
            0xff => self.a.vmovups(dst, ymmword_ptr(rbx + (disp * 4) as i32))?,
            _ => match self.opmask(bits) {
                Some(k) => {
                    // −∞, then the lanes inside under the mask (merging).
                    self.a.vmovaps(dst, neg_inf)?;
                    self.a.evex().vmovups(under(dst, k), ymmword_ptr(rbx + (disp * 4) as i32))?;
                }
                None if self.whole_read_inside(row, disp) => {
                    // The lanes inside from memory, −∞ elsewhere: one blend.
                    self.a.vblendps(dst, neg_inf, ymmword_ptr(rbx + (disp * 4) as i32), u32::from(bits))?;
                }
                None => {
                    self.load(dst, disp, bits, row)?;
                    let m = self.scratch[self.scratch.len() - 1];
                    self.a.vblendvps(dst, neg_inf, dst, m)?;
                }
            },
        }
        Ok(())
    }

    fn run(mut self) -> R<(Vec<u8>, u64)> {
        let d = self.d;
        let [n, c, oh_n, ow_n] = d.out_dims.map(|x| x as i64);
        let [_, _, h, w] = d.in_dims.map(|x| x as i64);
        let planes = n * c;
        let ph = d.offset[0];
        let (kh_n, kw_n) = (d.window[0] as i64, d.window[1] as i64);
        let vectors = (ow_n + 7) / 8;
        let g = self.accs.len() as i64;
        let frame = 32 * self.channel.len() as i32 + 8;

        enter(&mut self.a)?;
        self.a.sub(rsp, frame)?;
        // rdi bindings, rdx begin, rcx end (clamped to the plane count).
        self.a.mov(rbp, rdi)?;
        self.a.mov(rax, planes)?;
        self.a.cmp(rcx, rax)?;
        self.a.cmova(rcx, rax)?;
        self.a.mov(r10, rdx)?;
        self.a.mov(r11, rcx)?;
        let mut done = self.a.create_label();
        self.a.cmp(r10, r11)?;
        self.a.jae(done)?;
        // rdi: the byte offset of the output column a loop over a row's groups is at
        // (0 outside such loops; per-position epilogue tables add it).
        self.a.xor(edi, edi)?;
        self.a.mov(r8, qword_ptr(rbp + 8 * d.x as i32))?;
        self.a.mov(r9, qword_ptr(rbp + 8 * self.out_slot as i32))?;
        for (bits, k) in self.opmasks.clone() {
            self.a.mov(eax, i32::from(bits))?;
            let kr = [k1, k2, k3, k4, k5, k6, k7][usize::from(k) - 1];
            self.a.kmovw(kr, eax)?;
        }
        let mut plane = self.a.create_label();
        self.a.set_label(&mut plane)?;
        // c = plane mod C.
        self.a.mov(rax, r10)?;
        self.a.xor(edx, edx)?;
        self.a.mov(rcx, c)?;
        self.a.div(rcx)?;
        match &d.op {
            WindowOp::Conv { w, w_offset: woff } => {
                // Filter taps.
                let coef = |v: Option<u32>| v.map_or(0, |v| woff.of(v));
                let (w_c, w_kh, w_kw) = (woff.of(1), coef(d.taps[0]), coef(d.taps[1]));
                self.a.mov(r15, qword_ptr(rbp + 8 * *w as i32))?;
                let stride = i32::try_from(w_c * 4).map_err(|_| NotHere("filter stride".into()))?;
                self.a.imul_3(rsi, rdx, stride)?;
                self.a.add(r15, rsi)?;
                for kh in 0..kh_n {
                    for kw in 0..kw_n {
                        if !self.taps_held {
                            break;
                        }
                        let t = self.taps[(kh * kw_n + kw) as usize];
                        let off = i32::try_from((woff.c + w_kh * kh + w_kw * kw) * 4)
                            .map_err(|_| NotHere("filter offset".into()))?;
                        self.a.vbroadcastss(t, dword_ptr(r15 + off))?;
                    }
                }
            }
            WindowOp::Max => {
                let l = self.const_label(f32::NEG_INFINITY.to_bits());
                self.a.vbroadcastss(self.taps[0], dword_ptr(l))?;
            }
            WindowOp::Sum => {}
        }
        // Per-channel epilogue values, one stack vector each.
        for j in 0..self.channel.len() {
            let (input, off) = self.channel[j].clone();
            let t = self.scratch[0];
            self.a.mov(rax, qword_ptr(rbp + 8 * input as i32))?;
            self.a.imul_3(rsi, rdx, i32::try_from(off.of(1) * 4).map_err(|_| NotHere("channel stride".into()))?)?;
            self.a.vbroadcastss(t, dword_ptr(rax + rsi + (off.c * 4) as i32))?;
            self.a.vmovups(ymmword_ptr(rsp + 32 * j as i32), t)?;
        }
        // Plane pointers: r12 input plane, r13 output row, rbx input row of window row 0.
        self.a.imul_3(r12, r10, (h * w * 4) as i32)?;
        self.a.add(r12, r8)?;
        self.a.imul_3(r13, r10, (oh_n * ow_n * 4) as i32)?;
        self.a.add(r13, r9)?;
        self.a.lea(rbx, qword_ptr(r12 + (ph * w * 4) as i32))?;
        self.a.xor(r14d, r14d)?;
        // Rows in blocks of `rows_per`: a row of fewer vectors than accumulators takes
        // several output rows at once, so the taps' FMA chains of different rows
        // overlap (one row's nine FMAs are one dependent chain).
        let rows_per = if vectors >= g { 1 } else { (g / vectors).min(oh_n) };
        // A row's last vector is stored whole (8 lanes) while that stays inside the
        // plane: lanes past the row's end land in the next rows, which are stored
        // after it (a masked store costs about nine plain ones here). The loop runs
        // the rows where every store is whole; the rest are unrolled, their last
        // stores masked.
        let safe_rows = if 8 * vectors > oh_n * ow_n { 0 } else { (oh_n * ow_n - 8 * vectors) / ow_n + 1 };
        let looped = safe_rows.min(oh_n) / rows_per * rows_per;
        // The loop's first and last turns are unrolled where their border loads would
        // reach past the plane (its first row's left border, its last row's right
        // border) and so make every turn's mask loads: the turns between read whole
        // vectors and blend.
        let (mut first, mut last) = (0, looped);
        if looped > 0 && !self.block_reads_inside(0, rows_per) {
            first = rows_per;
        }
        if last > first && !self.block_reads_inside(last - rows_per, rows_per) {
            last -= rows_per;
        }
        let mut oh = 0;
        while oh < first {
            self.unrolled_block(rows_per, vectors, g, oh)?;
            self.step_rows(rows_per)?;
            oh += rows_per;
        }
        if last > first {
            self.at_rows = (first..last).step_by(rows_per as usize).collect();
            let mut row = self.a.create_label();
            self.a.set_label(&mut row)?;
            self.row_block(rows_per, vectors, g, None)?;
            self.step_rows(rows_per)?;
            self.a.cmp(r14, last as i32)?;
            self.a.jb(row)?;
            oh = last;
        }
        while oh < oh_n {
            let rows = rows_per.min(oh_n - oh);
            self.unrolled_block(rows, vectors, g, oh)?;
            oh += rows;
            if oh < oh_n {
                self.step_rows(rows)?;
            }
        }
        self.a.inc(r10)?;
        self.a.cmp(r10, r11)?;
        self.a.jb(plane)?;
        self.a.set_label(&mut done)?;
        leave(&mut self.a, frame)?;
        self.t.emit(&mut self.a)?;
        Ok((self.a.assemble(0)?, planes as u64))
    }

    /// [`Emit::row_block`] of output rows `oh .. oh + rows`, emitted for them alone.
    fn unrolled_block(&mut self, rows: i64, vectors: i64, g: i64, oh: i64) -> R<()> {
        self.at_rows = vec![oh];
        self.row_block(rows, vectors, g, Some(oh))
    }

    /// Whether every border load (a vector partly outside its row) of output rows
    /// `oh .. oh + rows` that has no opmask stays inside the plane, so that
    /// [`Emit::load`] can read it whole and blend.
    fn block_reads_inside(&self, oh: i64, rows: i64) -> bool {
        let d = self.d;
        let (h, w) = (d.in_dims[2] as i64, d.in_dims[3] as i64);
        let (sh, sw, dil_h, dil_w, ph, pw) =
            (d.stride[0], d.stride[1], d.dilation[0], d.dilation[1], d.offset[0], d.offset[1]);
        // (Wider column strides gather under a mask: nothing to blend.)
        let halves: &[i64] = match sw {
            1 => &[0],
            2 => &[0, 8],
            _ => &[],
        };
        let vectors = (d.out_dims[3] as i64 + 7) / 8;
        let rows_read = (0..rows).flat_map(|r| (0..d.window[0] as i64).map(move |kh| sh * (oh + r) + dil_h * kh + ph));
        let cols = (0..vectors).flat_map(|j| (0..d.window[1] as i64).map(move |kw| sw * 8 * j + dil_w * kw + pw));
        let cols: Vec<i64> = cols.flat_map(|c| halves.iter().map(move |s| c + s)).collect();
        rows_read.filter(|row| (0..h).contains(row)).all(|row| {
            cols.iter().all(|&c| {
                let bits = Self::inside(c, w);
                let border = bits != 0 && bits != 0xff && self.opmask(bits).is_none();
                !border || self.vector_in_plane(row * w + c)
            })
        })
    }

    /// Moves the row pointers and counter `rows` output rows on.
    fn step_rows(&mut self, rows: i64) -> R<()> {
        let d = self.d;
        let (ow_n, w, sh) = (d.out_dims[3] as i64, d.in_dims[3] as i64, d.stride[0]);
        self.a.add(r13, (rows * ow_n * 4) as i32)?;
        self.a.add(rbx, (rows * sh * w * 4) as i32)?;
        self.a.add(r14, rows as i32)?;
        Ok(())
    }

    /// Output rows `r14 .. r14 + rows` (every vector of each), in groups of at most `g`
    /// accumulators; `at`: the first row's number when known here (then stores that
    /// would leave the plane are masked), `None` inside the loop (every store whole).
    ///
    /// A run of groups whose every load and store is whole (the row's interior) is one
    /// loop over the first of them, moving the row pointers a group on per turn, so
    /// a row's code does not grow with its width.
    fn row_block(&mut self, rows: i64, vectors: i64, g: i64, at: Option<i64>) -> R<()> {
        if rows > 1 {
            return self.group(rows, 0, vectors, at);
        }
        let groups: Vec<(i64, i64)> = (0..vectors).step_by(g as usize).map(|j0| (j0, (j0 + g).min(vectors))).collect();
        let whole = |e: &Self, (j0, j1): (i64, i64)| j1 - j0 == g && (j0..j1).all(|j| e.interior(j));
        let first = groups.iter().position(|&gr| whole(self, gr));
        let run = first.map_or(0, |f| groups[f..].iter().take_while(|&&gr| whole(self, gr)).count());
        let mut i = 0;
        while i < groups.len() {
            if Some(i) == first && run >= 2 {
                let (j0, j1) = groups[i];
                let sw = self.d.stride[1];
                let (step_in, step_out) = (32 * sw * g, 32 * g);
                let n = run as i64;
                let total_in = i32::try_from(step_in * n).map_err(|_| NotHere("row too wide".into()))?;
                self.a.mov(edx, n as i32)?;
                let mut top = self.a.create_label();
                self.a.set_label(&mut top)?;
                self.group(1, j0, j1, at)?;
                self.a.add(rbx, step_in as i32)?;
                self.a.add(r13, step_out as i32)?;
                self.a.add(rdi, step_out as i32)?;
                self.a.dec(edx)?;
                self.a.jnz(top)?;
                self.a.sub(rbx, total_in)?;
                self.a.sub(r13, (step_out * n) as i32)?;
                self.a.xor(edi, edi)?;
                i += run;
                continue;
            }
            let (j0, j1) = groups[i];
            self.group(1, j0, j1, at)?;
            i += 1;
        }
        Ok(())
    }

    /// Whether output vector `j` of a row is whole (8 columns) and reads whole vectors
    /// inside the row at every window column.
    fn interior(&self, j: i64) -> bool {
        let d = self.d;
        let (ow_n, w) = (d.out_dims[3] as i64, d.in_dims[3] as i64);
        let (sw, dil_w, pw) = (d.stride[1], d.dilation[1], d.offset[1]);
        // Input columns a vector's load spans (a stride-2 vector is two loads).
        let span = if sw == 2 { 16 } else { 7 * sw + 1 };
        8 * j + 8 <= ow_n
            && (0..d.window[1] as i64).all(|kw| {
                let col = sw * 8 * j + dil_w * kw + pw;
                col >= 0 && col + span <= w
            })
    }

    /// `rax` = input row `r14·sh + first` (the row window row `kh` of output row
    /// `r14 + r` reads, `first = dh·kh + ph + sh·r`), then a jump to the returned label
    /// when it is outside the plane; `None` (and no code) when no output row puts it
    /// outside.
    fn row_check(&mut self, first: i64, last: i64) -> R<Option<CodeLabel>> {
        let d = self.d;
        let (h, sh) = (d.in_dims[2] as i64, d.stride[0]);
        if first >= 0 && last < h {
            return Ok(None);
        }
        let l = self.a.create_label();
        let first = i32::try_from(first).map_err(|_| NotHere("row offset".into()))?;
        if matches!(sh, 1 | 2 | 4 | 8) {
            self.a.lea(rax, qword_ptr(r14 * sh as u32 + first))?;
        } else {
            self.a.imul_3(rax, r14, sh as i32)?;
            self.a.add(rax, first)?;
        }
        self.a.cmp(rax, h as i32)?;
        self.a.jae(l)?; // (unsigned: a negative row is above every extent)
        Ok(Some(l))
    }

    /// `dst` = the 8 input elements of a vector whose lane 0 reads input column `col`
    /// (at `rbx + disp·4`, window row `row` as for [`Emit::whole_read_inside`]), lane `e`
    /// column `col + sw·e`: 0 outside the row (−∞ for a max pool). `false` (and `dst`
    /// unset) when no lane is inside and the value would be 0.
    fn fetch(&mut self, dst: AsmRegisterYmm, disp: i64, col: i64, row: i64) -> R<bool> {
        let d = self.d;
        let (w, sw) = (d.in_dims[3] as i64, d.stride[1]);
        let max = d.op == WindowOp::Max;
        let (t1, m) = (self.scratch[1], self.scratch[self.scratch.len() - 1]);
        match sw {
            1 => {
                let bits = Self::inside(col, w);
                if max {
                    self.load_max(dst, disp, bits, row)?;
                    Ok(true)
                } else {
                    self.load(dst, disp, bits, row)
                }
            }
            2 => {
                // 16 elements from col; the even ones as `vshufps` leaves them, per
                // 128-bit lane (elements 0 2 8 10 | 4 6 12 14: columns 0 1 4 5 | 2 3 6 7).
                // Every tap's vector is in that order, so the sums (or maxima) are too:
                // [`Emit::group`] puts them in order, one `vpermpd` an output vector
                // where one a tap did (3×3 stride 2: 9 shuffles an output vector, not 18).
                let (lo, hi) = (Self::inside(col, w), Self::inside(col + 8, w));
                if max {
                    self.load_max(dst, disp, lo, row)?;
                    self.load_max(t1, disp + 8, hi, row)?;
                } else {
                    let even = |m: u8| (0..4).any(|e| m >> (2 * e) & 1 == 1);
                    if !even(lo) && !even(hi) {
                        return Ok(false);
                    }
                    if !self.load(dst, disp, lo, row)? {
                        self.a.vxorps(dst, dst, dst)?;
                    }
                    if hi == 0xff {
                        // A whole second half: the shuffle's memory operand.
                        let at = ymmword_ptr(rbx + ((disp + 8) * 4) as i32);
                        self.a.vshufps(dst, dst, at, 0x88)?;
                        return Ok(true);
                    }
                    if !self.load(t1, disp + 8, hi, row)? {
                        self.a.vxorps(t1, t1, t1)?;
                    }
                }
                self.a.vshufps(dst, dst, t1, 0x88)?;
                Ok(true)
            }
            _ => {
                // A gather of lanes col + sw·e under the mask of those inside the row.
                let bits = (0..8).filter(|e| (0..w).contains(&(col + sw * e))).fold(0u8, |b, e| b | 1 << e);
                if max {
                    self.a.vmovaps(dst, self.taps[0])?;
                } else if bits == 0 {
                    return Ok(false);
                } else {
                    self.a.vxorps(dst, dst, dst)?;
                }
                if bits == 0 {
                    return Ok(true);
                }
                let index: Vec<u32> = (0..8).map(|e| (sw * e) as u32).collect();
                let l = self.t.words(&mut self.a, &index);
                self.a.vmovdqu(t1, ymmword_ptr(l))?;
                if bits == 0xff {
                    self.a.vpcmpeqd(m, m, m)?;
                } else {
                    let l = self.mask_label(bits);
                    self.a.vmovups(m, ymmword_ptr(l))?;
                }
                let disp = i32::try_from(disp * 4).map_err(|_| NotHere("column offset".into()))?;
                self.a.vgatherdps_3(dst, ymmword_ptr(rbx + t1 * 4 + disp), m)?;
                Ok(true)
            }
        }
    }

    /// Output vectors `j0..j1` of rows `r14 .. r14 + rows`: sum, epilogue, store
    /// (`at` as for [`Emit::row_block`]).
    fn group(&mut self, rows: i64, j0: i64, j1: i64, at: Option<i64>) -> R<()> {
        let d = self.d;
        let [_, _, oh_n, ow_n] = d.out_dims.map(|x| x as i64);
        let w = d.in_dims[3] as i64;
        let (sh, sw) = (d.stride[0], d.stride[1]);
        let (dil_h, dil_w) = (d.dilation[0], d.dilation[1]);
        let (ph, pw) = (d.offset[0], d.offset[1]);
        let (kh_n, kw_n) = (d.window[0] as i64, d.window[1] as i64);
        let nv = (j1 - j0) as usize;
        // Accumulator of (row r, vector j0 + i): accs[r·nv + i].
        let accs: Vec<AsmRegisterYmm> = self.accs[..rows as usize * nv].to_vec();
        let max = d.op == WindowOp::Max;
        for &r in &accs {
            if max {
                self.a.vmovaps(r, self.taps[0])?;
            } else {
                self.a.vxorps(r, r, r)?;
            }
        }
        if max {
            self.max_taps(rows, j0, &accs)?;
        }
        for kh in 0..kh_n {
            if max {
                break;
            }
            for r in 0..rows {
                // Window row kh of output row oh + r reads input row sh·(oh + r) + dh·kh
                // + ph: check it where some output row puts it outside the plane.
                let first = dil_h * kh + ph + sh * r;
                let skip = self.row_check(first, dil_h * kh + ph + sh * (oh_n - 1))?;
                for kw in 0..kw_n {
                    // (A sum has no tap register: its "tap" is never read.)
                    let tap = match d.op {
                        WindowOp::Sum => self.scratch[0],
                        _ if !self.taps_held => {
                            let t = self.taps[0];
                            self.broadcast_tap(t, kh, kw)?;
                            t
                        }
                        _ => self.taps[(kh * kw_n + kw) as usize],
                    };
                    for i in 0..nv {
                        let acc = accs[r as usize * nv + i];
                        let j = j0 + i as i64;
                        // First input column of the vector's lane 0.
                        let col = sw * 8 * j + dil_w * kw + pw;
                        let disp = (sh * r + dil_h * kh) * w + col;
                        let t0 = self.scratch[0];
                        if sw == 1 {
                            let bits = Self::inside(col, w);
                            let at = ymmword_ptr(rbx + (disp * 4) as i32);
                            if bits == 0xff {
                                self.add_tap_at(acc, None, tap, at)?;
                            } else if let Some(k) = self.opmask(bits) {
                                self.add_tap_at(acc, Some(k), tap, at)?;
                            } else if self.load(t0, disp, bits, first)? {
                                self.add_tap(acc, tap, t0)?;
                            }
                        } else if self.fetch(t0, disp, col, first)? {
                            self.add_tap(acc, tap, t0)?;
                        }
                    }
                }
                if let Some(mut l) = skip {
                    self.a.set_label(&mut l)?;
                }
            }
        }
        if sw == 2 {
            // A stride-2 window's sums hold columns 0 1 4 5 2 3 6 7 ([`Emit::fetch`]):
            // pairs 0 2 1 3 put them in order.
            for &r in &accs {
                self.a.vpermpd(r, r, 0xD8)?;
            }
        }
        self.epilogue(&accs, nv, j0)?;
        for r in 0..rows {
            for i in 0..nv {
                let acc = accs[r as usize * nv + i];
                let j = j0 + i as i64;
                let to = ymmword_ptr(r13 + (4 * (r * ow_n + 8 * j)) as i32);
                let lanes = (ow_n - 8 * j).min(8);
                let inside = at.is_none_or(|oh| (oh + r) * ow_n + 8 * j + 8 <= oh_n * ow_n);
                if lanes == 8 || inside {
                    self.a.vmovups(to, acc)?;
                } else {
                    let l = self.mask_label(((1u16 << lanes) - 1) as u8);
                    let m = self.scratch[0];
                    self.a.vmovups(m, ymmword_ptr(l))?;
                    self.a.vmaskmovps(to, m, acc)?;
                }
            }
        }
        Ok(())
    }

    /// `t` = the convolution's filter tap `(kh, kw)` of this channel, broadcast.
    fn broadcast_tap(&mut self, t: AsmRegisterYmm, kh: i64, kw: i64) -> R<()> {
        let d = self.d;
        let WindowOp::Conv { w_offset: woff, .. } = &d.op else { return no("a tap of a window without a filter") };
        let coef = |v: Option<u32>| v.map_or(0, |v| woff.of(v));
        let off = (woff.c + coef(d.taps[0]) * kh + coef(d.taps[1]) * kw) * 4;
        let off = i32::try_from(off).map_err(|_| NotHere("filter offset".into()))?;
        self.a.vbroadcastss(t, dword_ptr(r15 + off))?;
        Ok(())
    }

    /// A max pool's taps into `accs` (rows `r14 .. r14 + rows`, vectors from `j0`),
    /// one input row at a time: the maximum along a window row of input row `u` is
    /// taken once and folded into every output row whose window holds that row (with
    /// stride 1, a `KH`-row window over `R` output rows reads `R + KH − 1` input rows,
    /// not `R·KH`), so a block of rows costs about `(R + KH − 1)·KW + R·KH` maxima
    /// instead of `R·KH·KW`. (The maximum is exact in any order.)
    fn max_taps(&mut self, rows: i64, j0: i64, accs: &[AsmRegisterYmm]) -> R<()> {
        let d = self.d;
        let oh_n = d.out_dims[2] as i64;
        let w = d.in_dims[3] as i64;
        let (sh, sw) = (d.stride[0], d.stride[1]);
        let (dil_h, dil_w) = (d.dilation[0], d.dilation[1]);
        let (ph, pw) = (d.offset[0], d.offset[1]);
        let (kh_n, kw_n) = (d.window[0] as i64, d.window[1] as i64);
        let nv = accs.len() / rows as usize;
        let neg_inf = self.taps[0];
        let (t0, hmax) = (self.scratch[0], self.scratch[self.scratch.len() - 2]);
        let span = sh * (rows - 1) + dil_h * (kh_n - 1) + 1;
        for u in 0..span {
            // The (output row, window row) pairs that read input row u of the block.
            let pairs: Vec<i64> = (0..rows)
                .filter(|&r| {
                    let k = u - sh * r;
                    k >= 0 && k % dil_h == 0 && k / dil_h < kh_n
                })
                .collect();
            let Some(&r_min) = pairs.first() else { continue };
            let skip = self.row_check(ph + u, ph + u + sh * (oh_n - 1 - r_min))?;
            for i in 0..nv {
                let j = j0 + i as i64;
                // One pair: straight into its accumulator; several: their shared row
                // maximum first (from −∞: a NaN first load must not stick).
                let single = pairs.len() == 1;
                let target = if single { accs[pairs[0] as usize * nv + i] } else { hmax };
                for kw in 0..kw_n {
                    let col = sw * 8 * j + dil_w * kw + pw;
                    self.fetch(t0, u * w + col, col, ph + u)?;
                    // vmaxps gives its second source where the first is NaN.
                    let prev = if !single && kw == 0 { neg_inf } else { target };
                    self.a.vmaxps(target, t0, prev)?;
                }
                if !single {
                    for &r in &pairs {
                        let acc = accs[r as usize * nv + i];
                        self.a.vmaxps(acc, hmax, acc)?;
                    }
                }
            }
            if let Some(mut l) = skip {
                self.a.set_label(&mut l)?;
            }
        }
        Ok(())
    }

    /// `acc += tap · x` (a convolution) or `acc += x` (a sum).
    fn add_tap(&mut self, acc: AsmRegisterYmm, tap: AsmRegisterYmm, x: AsmRegisterYmm) -> R<()> {
        if self.d.op == WindowOp::Sum {
            self.a.vaddps(acc, acc, x)?;
        } else {
            self.a.vfmadd231ps(acc, tap, x)?;
        }
        Ok(())
    }

    /// [`Emit::add_tap`] of the 8 elements at `at`; under opmask `k` (merging), the
    /// lanes outside it read nothing and keep `acc`.
    fn add_tap_at(&mut self, acc: AsmRegisterYmm, k: Option<u8>, tap: AsmRegisterYmm, at: AsmMemoryOperand) -> R<()> {
        let (a, dst) = match k {
            Some(k) => (self.a.evex(), under(acc, k)),
            None => (&mut self.a, acc),
        };
        if self.d.op == WindowOp::Sum {
            a.vaddps(dst, acc, at)?;
        } else {
            a.vfmadd231ps(dst, tap, at)?;
        }
        Ok(())
    }

    /// Applies the epilogue steps to `accs`: `accs[r·nv + i]` holds output vector `j0 + i`
    /// of row `r14 + r`.
    fn epilogue(&mut self, accs: &[AsmRegisterYmm], nv: usize, j0: i64) -> R<()> {
        for s in self.d.epilogue.clone() {
            match &s {
                Step::Add(StepOperand::Position(v))
                | Step::Sub(StepOperand::Position(v))
                | Step::Mul(StepOperand::Position(v))
                | Step::Div(StepOperand::Position(v)) => {
                    // Each vector's own values, from a table of every position (its
                    // rows padded by a vector of ones: a row's last vector may read past
                    // the last position, into lanes that are never stored).
                    let ow_n = self.d.out_dims[3] as i64;
                    let mut words = v.clone();
                    words.extend([1f32.to_bits(); 8]);
                    let l = self.t.words(&mut self.a, &words);
                    self.a.lea(rax, qword_ptr(l))?;
                    self.a.imul_3(rsi, r14, (ow_n * 4) as i32)?;
                    self.a.add(rsi, rax)?;
                    self.a.add(rsi, rdi)?;
                    for (idx, &acc) in accs.iter().enumerate() {
                        let (r, i) = ((idx / nv) as i64, (idx % nv) as i64);
                        let at = ymmword_ptr(rsi + (4 * (r * ow_n + 8 * (j0 + i))) as i32);
                        match &s {
                            Step::Add(_) => self.a.vaddps(acc, acc, at)?,
                            Step::Sub(_) => self.a.vsubps(acc, acc, at)?,
                            Step::Mul(_) => self.a.vmulps(acc, acc, at)?,
                            _ => self.a.vdivps(acc, acc, at)?,
                        }
                    }
                }
                Step::MulSelf(inner) => {
                    // Per accumulator: a copy through the inner steps, then the product.
                    let c = self.scratch[1];
                    for &acc in accs {
                        self.a.vmovaps(c, acc)?;
                        for is in inner {
                            self.step(is, &[c])?;
                        }
                        self.a.vmulps(acc, acc, c)?;
                    }
                }
                _ => self.step(&s, accs)?,
            }
        }
        Ok(())
    }

    /// Applies one step (not `MulSelf`) to `regs`; `scratch[0]` holds its operand.
    fn step(&mut self, s: &Step, regs: &[AsmRegisterYmm]) -> R<()> {
        let t = self.scratch[0];
        // The operand: a register (constant broadcast, or a stack vector loaded where it
        // must be the first source) or the stack vector as memory.
        let (o, first) = match s {
            Step::Add(o) | Step::Sub(o) | Step::Mul(o) | Step::Div(o) => (Some(o.clone()), false),
            Step::SubFrom(o) | Step::DivInto(o) => (Some(o.clone()), true),
            Step::Max(b) | Step::Min(b) => (Some(StepOperand::Const(*b)), true),
            Step::MulSelf(_) => return no("a nested v · f(v) step"),
        };
        let mut mem = None;
        match o {
            Some(StepOperand::Position(_)) => return no("a per-position value as this step's operand"),
            Some(StepOperand::Const(bits)) => {
                let l = self.const_label(bits);
                self.a.vbroadcastss(t, dword_ptr(l))?;
            }
            Some(StepOperand::Channel { input, offset }) => {
                let j = self.channel.iter().position(|(i, f)| *i == input && *f == offset).unwrap_or(0);
                let at = ymmword_ptr(rsp + 32 * j as i32);
                if first {
                    self.a.vmovups(t, at)?;
                } else {
                    mem = Some(at);
                }
            }
            None => {}
        }
        for &r in regs {
            match (s, mem) {
                (Step::Add(_), Some(m)) => self.a.vaddps(r, r, m)?,
                (Step::Add(_), None) => self.a.vaddps(r, r, t)?,
                (Step::Sub(_), Some(m)) => self.a.vsubps(r, r, m)?,
                (Step::Sub(_), None) => self.a.vsubps(r, r, t)?,
                (Step::Mul(_), Some(m)) => self.a.vmulps(r, r, m)?,
                (Step::Mul(_), None) => self.a.vmulps(r, r, t)?,
                (Step::Div(_), Some(m)) => self.a.vdivps(r, r, m)?,
                (Step::Div(_), None) => self.a.vdivps(r, r, t)?,
                (Step::SubFrom(_), _) => self.a.vsubps(r, t, r)?,
                (Step::DivInto(_), _) => self.a.vdivps(r, t, r)?,
                // The constant first: vmaxps/vminps give the second source on NaN.
                (Step::Max(_), _) => self.a.vmaxps(r, t, r)?,
                (Step::Min(_), _) => self.a.vminps(r, t, r)?,
                (Step::MulSelf(_), _) => return no("a nested v · f(v) step"),
            }
        }
        Ok(())
    }
}
