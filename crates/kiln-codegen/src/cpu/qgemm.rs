//! Integer contraction microkernels: 8-bit operands, i32 accumulators, AVX-512 machine
//! code written with `iced-x86`, and an AVX2 form ([`avx2`]) for CPUs without AVX-512
//! BW/VL.
//!
//! The two widths share the planning below (recognition, operands, the epilogue's
//! nodes, loads and dependencies, the work split, the workgroup loop and the loop over a
//! workgroup's block copies: [`Emitter`] with its `ymm` flag). They differ in the copy,
//! the tile and the epilogue's instructions: 512-bit blocks of 32 columns, four
//! reduction steps a lane (`vpdpbusd` or its 16-bit form), zero points as row/column-sum
//! corrections, 12 × 32 tiles in 24 `zmm` accumulators, opmasks and embedded broadcasts;
//! AVX2 blocks of 16 columns widened to 16 bits with the zero points subtracted while
//! copied, two reduction steps a lane (`vpmaddwd`), 6 × 16 tiles in 12 `ymm`
//! accumulators, lane masks in registers (`vpmaskmovd`, `vblendvps`) — the [`avx2`]
//! module's doc.
//!
//! A kernel that [`Contraction::of_int`] recognises — an epilogue over
//! `Σ_k (i32(A[m, k]) − za)·(i32(B[k, n]) − zb)`, `A` and `B` each `u8` or `i8` (the
//! lowering of MatMulInteger, ConvInteger, QLinearMatMul and QLinearConv) — is emitted
//! here with the same kernel ABI as every other kernel (`kiln_module::abi`).
//!
//! ## Products of bytes
//! `vpdpbusd` (AVX-512 VNNI) multiplies the four unsigned bytes of each 32-bit lane of
//! one operand by the four signed bytes of the same lane of the other and adds the four
//! products to an i32 lane: 64 multiply-adds an instruction. Both operands must hold
//! four consecutive reduction steps per lane. `A`'s row is contiguous along the
//! reduction (a weight `[M, C·KH·KW]`, an activation `[M, K]`), so four steps of one row
//! are one 32-bit word, broadcast to every lane; `B` (`[K, N]`, its columns 1 or 2 bytes
//! apart — a strided convolution's even bytes taken with `vpmovwb` — each reduction
//! step's row anywhere: a convolution's `ci, kh, kw` through a table of row offsets)
//! is copied at the start of each workgroup into a stack buffer `[⌈K/4⌉, 32, 4]` (four
//! rows interleaved byte by byte with `vpunpck{l,h}{bw,wd}`; rows past `K` are zero), one
//! block of 32 columns, which every row tile of the workgroup then streams. Without VNNI
//! (AVX-512 BW only: `--target-cpu x86-64-v4`) each `vpdpbusd` is computed exactly from
//! the even and odd bytes widened to 16 bits and two `vpmaddwd` (no `vpmaddubsw`, whose
//! 16-bit sums saturate).
//!
//! ## Signedness and zero points
//! The unsigned operand of `vpdpbusd` is `A` where `A` is `u8`, else `B`. Where both have
//! the same signedness, `B` is flipped while it is copied (`b' = b ⊕ 0x80`, which is
//! `b + δ` with `δ = 128` for `i8` and `−128` for `u8`). Then, exactly in i32,
//!
//! ```text
//! Σ_k (a − za)(b − zb) = Σ_k a·b' − (zb + δ)·Σ_k a − za·Σ_k b' + K·za·(zb + δ)
//! ```
//!
//! so the tile computes `Σ a·b'` and the epilogue subtracts the row sums of `A`
//! (computed per tile, only where `zb + δ` can be non-zero) and the column sums of `b'`
//! (computed after the copy, only where `za` can be non-zero). Padded reduction steps
//! (`K` rounded up to 4) are zero in the copy, so they add nothing to either sum.
//!
//! ## Work split and tiles
//! A workgroup is one batch position, up to 16 whole blocks of 32 columns (as many as
//! leave 8 workgroups or more and whose copies fit 64 KiB; a partial last block is a
//! workgroup of its own) and one group of rows (all `M` rows unless there are too few
//! blocks to give threads work; then the rows are cut into groups, each copying the same
//! blocks). The workgroup copies its blocks first; then for each tile of rows it
//! computes what depends on the row alone once — `A`'s row sums folded with the zero
//! points into one correction word a row, and the epilogue's row-invariant values (a
//! QLinear op's `s_a·s_b / s_y`, a `vdivps`) — and runs the tile over every block. A
//! tile is 12 rows × 32 columns: 24 accumulators, two vectors of `b'`, one broadcast of
//! `A`, per four reduction steps. The last `K mod 4` steps read `A` with a byte mask
//! (nothing past a row's end); the last columns of a partial block are stored under an
//! opmask.
//!
//! ## One column
//! A kernel of one column (`N` = 1: a fully connected layer on one vector) whose `B`
//! column is contiguous along the reduction, and whose output and per-row operands step
//! one element a row, wastes 31 of 32 columns in a tile; it runs instead with rows in
//! the lanes ([`Emitter::function_gemv`]): a workgroup is 16 rows, each row one
//! `vpdpbusd` per 64 bytes of its reduction against the same 64 bytes of the column (its
//! row sums by the same loads), summed across the lanes; the 16 sums then go through the
//! corrections and the epilogue as one vector (per-row operands loaded as vectors).
//! Where no row sums are needed (a constant `A`'s sums are folded at compile time,
//! `kiln_flow::dequant::fold_int_constant_sums`), the 16 rows run in one pass, each
//! 64 bytes of the column loaded once for all of them, and their 16 vectors are summed
//! by one transposing reduction (45 instructions, not 8 a row).
//!
//! ## Epilogue
//! After the corrections the epilogue is evaluated on each accumulator, 16 lanes at a
//! time, from the kernel's own expression: i32 and f32 arithmetic (`and` of i32 too),
//! conversions, rounding (`vrndscaleps`), clamps with a constant bound (NaN passes through as in the
//! interpreter), loads of f32, i32, u8 and i8 operands per row, per column or per tensor
//! (a QLinear op's scales, zero points and bias), comparisons, selects and max/min of
//! integers held in i32 lanes (i8 sign-extended, u8 zero-extended: a saturating
//! `Clip` on a quantized result, as a fused ReLU/ReLU6 arrives from the TFLite importer
//! or from a QDQ activation), and a store of f32, i32 or an 8-bit value (`vpmovdb`; an
//! f32 clamped by a constant converts with `vcvttps2dq` and the wrap alone). An
//! operand the same in every lane (a 32-bit constant, a per-tensor or per-row f32/i32
//! load, a hoisted value) is read as an embedded broadcast (`{1to16}`) of the arithmetic
//! instruction, not into a register first. QLinear's requantisation is `round_half_even(f32(acc)
//! · (s_a·s_b / s_y)) + z_y`, saturated: ONNX Runtime's order of operations. Anything else
//! declines the kernel (it then runs on the general path, as on a CPU without AVX2).

use std::collections::HashMap;

use iced_x86::code_asm::*;
use kiln_flow::affine::load_offset;
use kiln_flow::contraction::{Contraction, IntContraction};
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ScalarType, UnaryOp};
use kiln_ir::DType;

use super::asm::{add_imm, enter, leave, reserve, Tables, XMM, YMM, ZMM};
use super::gemm::{no, NotHere, R};
use super::math;
use super::vector::{Mask, Vx, V};

mod avx2;

/// Columns per workgroup block (two vectors of 16 lanes).
const NB: u64 = 32;
/// Vectors of a block.
const NV: usize = 2;
/// Rows of a full tile (24 accumulators, 8 registers for the epilogue).
const MR: u64 = 12;
/// Rows of a full tile whose epilogue computes a transcendental (16 accumulators: erf
/// and tanh need 8 scratch registers besides their operand and result).
const MR_TRANSCENDENTAL: u64 = 8;
/// The most reduction steps (the copy of a block, `⌈K/4⌉·128` bytes, is on the stack).
const MOST_K: u64 = 8192;
/// Workgroups below which rows are cut into groups.
const SPREAD: u64 = 8;
/// What an epilogue node depends on: the accumulator, the column, the row.
const D_ACC: u8 = 1;
const D_COL: u8 = 2;
const D_ROW: u8 = 4;

/// A compiled integer contraction.
pub(crate) struct QGemmCode {
    pub code: Vec<u8>,
    pub workgroups: u64,
    /// It uses `vpdpbusd` (AVX-512 VNNI).
    pub vnni: bool,
}

/// A pointer a workgroup needs: a binding and its element offset.
#[derive(Clone)]
struct Base {
    binding: u32,
    /// Bytes per element.
    elem: i64,
    /// Constant element offset.
    c: i64,
    /// Element coefficients of the batch variables.
    batch: Vec<i64>,
    /// Elements per row.
    per_m: i64,
    /// Elements per column (0 or 1).
    per_n: i64,
}

/// An epilogue load: its base and the dtype it reads.
#[derive(Clone, Copy)]
struct ELoad {
    base: usize,
    dtype: DType,
}

/// Emits `k` as an integer contraction microkernel, or says why not. `vnni`: the target
/// has AVX-512 VNNI (else the byte products are widened to 16 bits).
pub(crate) fn emit(k: &Kernel, vnni: bool) -> R<QGemmCode> {
    emit_width(k, vnni, false)
}

/// Emits `k` as the AVX2 (`ymm`) integer contraction microkernel ([`avx2`]), or says
/// why not.
pub(crate) fn emit_avx2(k: &Kernel) -> R<QGemmCode> {
    emit_width(k, false, true)
}

fn emit_width(k: &Kernel, vnni: bool, ymm: bool) -> R<QGemmCode> {
    let Some(ic) = Contraction::of_int(k) else { return no("not an integer contraction") };
    // With the row-invariant epilogue hoisted, else (it ran out of registers) without.
    // (The AVX2 form hoists nothing: its epilogue has every register to itself but the
    // slot-invariant operands it holds, up to `pins` of them.)
    let attempt = |hoist: bool, pins: usize| -> R<QGemmCode> {
        let mut e = Emitter::new(k, ic.clone(), vnni, hoist && !ymm, ymm)?;
        if ymm && !e.gemv {
            e.plan_pins_ymm(pins);
        }
        if e.gemv && ymm {
            e.function_gemv_ymm()?;
        } else if e.gemv {
            e.function_gemv()?;
        } else {
            e.function()?;
        }
        let code = e.a.assemble(0)?;
        Ok(QGemmCode { code, workgroups: e.workgroups(), vnni })
    };
    if ymm {
        return attempt(false, avx2::MOST_PINS)
            .or_else(|_| attempt(false, avx2::MOST_PINS / 2))
            .or_else(|_| attempt(false, 0));
    }
    attempt(true, 0).or_else(|_| attempt(false, 0))
}

struct Emitter<'k> {
    a: CodeAssembler,
    k: &'k Kernel,
    c: Contraction,
    za: Option<ExprId>,
    zb: Option<ExprId>,
    t: Tables,
    vnni: bool,
    /// A is the unsigned operand of `vpdpbusd`.
    a_unsigned: bool,
    /// `δ` of the flip of `B` (0: none).
    delta: i32,
    /// Row sums of A and column sums of `b'` are needed.
    need_ra: bool,
    need_cb: bool,
    /// A, B, the output, then the epilogue loads.
    bases: Vec<Base>,
    eloads: HashMap<u32, ELoad>,
    /// Byte offsets of B's reduction steps, when they are not `k · stride`.
    b_table: Option<Vec<i32>>,
    /// Byte stride of B's reduction steps where they are.
    b_stride: i64,
    /// Byte pitch of A's rows.
    a_pitch: i64,
    /// Elements from one column of B to the next (1 or 2: a strided convolution).
    b_step: i64,
    /// Epilogue nodes, and how often each is an operand there.
    uses: HashMap<u32, u32>,
    /// What each epilogue node depends on ([`D_ACC`], [`D_COL`], [`D_ROW`] bits).
    deps: HashMap<u32, u8>,
    /// Epilogue nodes the same in every lane of a row (not the accumulator, no operand
    /// load across the columns) that are computed, not loaded: evaluated once per row of
    /// a tile into the stack (`s_h`), then broadcast in every slot of the row (a QLinear
    /// op's `s_a·s_b / s_y`: one `vdivps` a row, not one an accumulator).
    hoisted: Vec<ExprId>,
    hoist_at: HashMap<u32, usize>,
    /// The zero-point corrections of a row, `K·za·(zb + δ) − (zb + δ)·Σa`, computed once
    /// per row of a tile into `s_rs` (`za` and `zb` are the same across the columns).
    corr_pre: bool,
    /// `za · Σb'` computed once per block into `s_cb` (`za` is one value per tensor).
    za_pre: bool,
    /// One column (a matrix times a vector): rows in the lanes ([`Self::function_gemv`]).
    gemv: bool,
    /// Rows of a full tile ([`MR`], or [`MR_TRANSCENDENTAL`]).
    mr: u64,
    /// The epilogue computes exp, erf, tanh or log.
    transcendental: bool,
    /// The AVX2 form ([`avx2`]): 16-bit products of 16 columns in two `ymm` vectors.
    ymm: bool,
    /// Columns of the tile's partial vector (AVX2 form; 0: every vector whole).
    y_lanes: u64,
    /// The epilogue's operands the same in every slot (constants, per-tensor loads and
    /// what is computed from them alone), held in registers over a tile's slots (AVX2
    /// form: [`Self::plan_pins_ymm`]).
    y_pinned: Vec<ExprId>,
    /// Workgroup split: `blocks` workgroups along the columns, each `nblk` whole blocks
    /// of 32 columns (the last fewer) out of `full`, then one of the `part` columns left
    /// (where `part` is not 0).
    blocks: u64,
    nblk: u64,
    full: u64,
    part: u64,
    groups: u64,
    rows_per_group: u64,
    batch_ext: Vec<u64>,
}

// Stack frame.
const S_END: i32 = 0;
const S_N0: i32 = 8;
const S_MT: i32 = 16;
const S_TCOUNT: i32 = 24;
const S_PBP: i32 = 32;
const S_GROUP: i32 = 40;
/// The copy of the current block (its column sums after it).
const S_BBUF: i32 = 48;
/// Blocks left in the workgroup's loop.
const S_BLEFT: i32 = 56;
/// B's columns of the block being copied.
const S_BSRC: i32 = 64;
/// Blocks of this workgroup.
const S_BCNT: i32 = 72;
const S_COORD: i32 = 80;
/// Bytes of the copies of a workgroup's blocks, at most (several blocks a workgroup
/// share the row sums and the hoisted epilogue values of each tile).
const BLOCK_BYTES: u64 = 64 * 1024;
/// Blocks of one workgroup, at most.
const MOST_BLOCKS: u64 = 16;

/// `vpdpbusd`, or its exact widened form, from registers.
#[derive(Clone, Copy)]
struct Dot {
    vnni: bool,
    /// `0x00FF00FF` in every lane (the widened form's even bytes).
    lo: AsmRegisterZmm,
    t0: AsmRegisterZmm,
    t1: AsmRegisterZmm,
}

impl Dot {
    /// `acc += Σ u·s` by lane, `u` the unsigned and `s` the signed bytes.
    fn emit(&self, a: &mut CodeAssembler, acc: AsmRegisterZmm, u: AsmRegisterZmm, s: AsmRegisterZmm) -> R<()> {
        if self.vnni {
            a.vpdpbusd(acc, u, s)?;
            return Ok(());
        }
        let (t0, t1) = (self.t0, self.t1);
        a.vpandd(t0, u, self.lo)?;
        a.vpsllw(t1, s, 8)?;
        a.vpsraw(t1, t1, 8)?;
        a.vpmaddwd(t0, t0, t1)?;
        a.vpaddd(acc, acc, t0)?;
        a.vpsrlw(t0, u, 8)?;
        a.vpsraw(t1, s, 8)?;
        a.vpmaddwd(t0, t0, t1)?;
        a.vpaddd(acc, acc, t0)?;
        Ok(())
    }
}

impl<'k> Emitter<'k> {
    fn new(k: &'k Kernel, ic: IntContraction, vnni: bool, hoist: bool, ymm: bool) -> R<Emitter<'k>> {
        let IntContraction { c, za, zb } = ic;
        let [m, n, kk] = c.dims;
        if kk == 0 || kk > MOST_K {
            return no(format!("{kk} reduction steps (1 to {MOST_K} here)"));
        }
        for t in k.inputs.iter().chain([&k.output]) {
            if t.storage_bytes() as u64 > i32::MAX as u64 {
                return no("an operand over 2 GiB");
            }
        }
        let mut e = Emitter {
            a: CodeAssembler::new(64)?,
            k,
            c,
            za,
            zb,
            t: Tables::default(),
            vnni,
            a_unsigned: false,
            delta: 0,
            need_ra: false,
            need_cb: false,
            bases: Vec::new(),
            eloads: HashMap::new(),
            b_table: None,
            b_stride: 0,
            a_pitch: 0,
            b_step: 1,
            uses: HashMap::new(),
            deps: HashMap::new(),
            hoisted: Vec::new(),
            hoist_at: HashMap::new(),
            corr_pre: false,
            za_pre: false,
            gemv: false,
            mr: MR,
            transcendental: false,
            ymm,
            y_lanes: 0,
            y_pinned: Vec::new(),
            blocks: 0,
            nblk: 1,
            full: n / nb_of(ymm),
            part: n % nb_of(ymm),
            groups: 1,
            rows_per_group: m,
            batch_ext: Vec::new(),
        };
        e.batch_ext = e.c.batch.iter().map(|&v| k.vars[v as usize]).collect();
        let (ad, bd) = (e.c.a.dtype, e.c.b.dtype);
        e.a_unsigned = ad == DType::U8;
        if ad == bd {
            e.delta = if bd == DType::U8 { -128 } else { 128 };
        }
        e.need_cb = za.is_some();
        e.need_ra = zb.is_some() || e.delta != 0;
        e.plan_operands()?;
        e.plan_epilogue()?;
        // (The AVX2 form's one-column form reads a row's last 16 bytes as its tail.)
        e.gemv = e.gemv_fits() && (!ymm || kk >= 16);
        if ymm {
            e.plan_ymm()?;
        }
        if !hoist || e.gemv {
            e.hoisted.clear();
            e.hoist_at.clear();
            e.corr_pre = false;
            e.za_pre = false;
        }
        // Whole blocks taken several a workgroup while enough workgroups are left for the
        // threads (and their copies fit `BLOCK_BYTES`).
        let batch: u64 = e.batch_ext.iter().product();
        let per_block = e.block_bytes();
        let cap = (BLOCK_BYTES / per_block as u64).clamp(1, MOST_BLOCKS);
        e.nblk = (e.full * batch / SPREAD).clamp(1, cap).min(e.full.max(1));
        e.blocks = e.full.div_ceil(e.nblk) + u64::from(e.part != 0);
        // Rows cut into groups where blocks are too few to share among threads.
        if ymm {
            e.mr = avx2::MR;
        } else if e.transcendental {
            e.mr = MR_TRANSCENDENTAL;
        }
        let tiles = m.div_ceil(e.mr);
        if batch * e.blocks < SPREAD {
            let g = tiles.min(SPREAD.div_ceil(batch * e.blocks)).max(1);
            e.rows_per_group = tiles.div_ceil(g) * e.mr;
            e.groups = m.div_ceil(e.rows_per_group);
        }
        Ok(e)
    }

    /// Whether the one-column form takes the kernel: `N` = 1, `B`'s column contiguous
    /// along the reduction, the output and every per-row operand one element a row.
    fn gemv_fits(&self) -> bool {
        let kk = self.c.dims[2];
        self.c.dims[1] == 1
            && self.b_table.is_none()
            && (kk == 1 || self.b_stride == 1)
            && self.bases.get(2).is_some_and(|b| b.per_m == 1)
            && self.bases.iter().skip(3).all(|b| matches!(b.per_m, 0 | 1))
    }

    /// The batch coordinates of the workgroup (`rax`: its batch position, consumed)
    /// into their stack slots, innermost last.
    fn batch_coords(&mut self) -> R<()> {
        for (i, &d) in self.batch_ext.clone().iter().enumerate().rev() {
            self.a.xor(edx, edx)?;
            self.a.mov(rcx, d as i64)?;
            self.a.div(rcx)?;
            self.a.mov(qword_ptr(rsp + (S_COORD + 8 * i as i32)), rdx)?;
        }
        Ok(())
    }

    /// A one-column workgroup's set-up after its group (`S_GROUP`) is stored: the batch
    /// coordinates ([`Self::batch_coords`]), then each base's pointer at this batch
    /// position and at the group's first row (`rows` rows a group).
    fn gemv_pointers(&mut self, rows: i64) -> R<()> {
        self.batch_coords()?;
        for bi in 0..self.bases.len() {
            let b = self.base_at_batch(bi)?;
            self.a.mov(qword_ptr(rsp + self.s_base(bi)), rax)?;
            if b.per_m != 0 {
                self.a.mov(rcx, qword_ptr(rsp + S_GROUP))?;
                self.imul(rcx, rows * b.per_m * b.elem)?;
                self.a.add(rax, rcx)?;
            }
            self.a.mov(qword_ptr(rsp + self.s_tile(bi)), rax)?;
        }
        Ok(())
    }

    fn workgroups(&self) -> u64 {
        if self.gemv && self.ymm {
            return self.batch_ext.iter().product::<u64>() * self.y_gemv_workgroups();
        }
        if self.gemv {
            return self.batch_ext.iter().product::<u64>() * self.c.dims[0].div_ceil(16);
        }
        self.batch_ext.iter().product::<u64>() * self.blocks * self.groups
    }

    /// Flat reduction index → each reduction variable's digit.
    fn k_digits(&self, mut flat: u64) -> Vec<(u32, i64)> {
        let mut out = Vec::new();
        for &v in self.c.k.iter().rev() {
            let ext = self.k.vars[v as usize];
            out.push((v, (flat % ext) as i64));
            flat /= ext;
        }
        out
    }

    fn plan_operands(&mut self) -> R<()> {
        let c = &self.c;
        let k = self.k;
        let [_, _, kk] = c.dims;
        let fits = |x: i64| i32::try_from(x).is_ok();
        // A: contiguous along the flattened reduction; not moved by the columns.
        for f in 0..kk {
            let off: i64 = self.k_digits(f).iter().map(|&(v, d)| c.a.offset.of(v) * d).sum();
            if off != f as i64 {
                return no("A is not contiguous along the reduction");
            }
        }
        let a_pitch = c.a.offset.of(c.m);
        if !fits(a_pitch * MR as i64) || c.column_step(&c.a.offset) != Some(0) {
            return no("A's rows are too far apart");
        }
        self.a_pitch = a_pitch;
        // B: one row per reduction step, its columns contiguous, shared by the rows.
        let Some(b_step) = c.column_step(&c.b.offset).filter(|s| (1..=2).contains(s)) else {
            return no("B's columns are not 1 or 2 elements apart");
        };
        if c.b.offset.of(c.m) != 0 {
            return no("B moves with the rows");
        }
        self.b_step = b_step;
        let offs: Vec<i64> =
            (0..kk).map(|f| self.k_digits(f).iter().map(|&(v, d)| c.b.offset.of(v) * d).sum()).collect();
        let stride = if kk > 1 { offs[1] } else { 0 };
        if offs.iter().enumerate().all(|(f, &o)| o == f as i64 * stride) && fits(stride * 4) {
            self.b_stride = stride;
        } else {
            let t: Option<Vec<i32>> = offs.iter().map(|&o| i32::try_from(o).ok()).collect();
            let Some(t) = t else { return no("B's rows are too far apart") };
            self.b_table = Some(t);
        }
        let batch_coefs = |off: &kiln_flow::affine::AffineIndex| c.batch.iter().map(|&v| off.of(v)).collect();
        self.bases.push(Base {
            binding: c.a.input,
            elem: 1,
            c: c.a.offset.c,
            batch: batch_coefs(&c.a.offset),
            per_m: a_pitch,
            per_n: 0,
        });
        self.bases.push(Base {
            binding: c.b.input,
            elem: 1,
            c: c.b.offset.c,
            batch: batch_coefs(&c.b.offset),
            per_m: 0,
            per_n: b_step,
        });
        // The output, row-major.
        let dims = k.output.shape.dims();
        let mut strides = vec![0i64; dims.len()];
        let mut s = 1i64;
        for d in (0..dims.len()).rev() {
            strides[d] = s;
            s = s.saturating_mul(dims[d] as i64);
        }
        let Some(elem) = out_elem(k.output.dtype) else {
            return no(format!("an output of dtype {}", k.output.dtype.name()));
        };
        self.bases.push(Base {
            binding: k.inputs.len() as u32,
            elem,
            c: 0,
            batch: c.batch.iter().map(|&v| strides[v as usize]).collect(),
            per_m: strides[c.m as usize],
            per_n: 1,
        });
        Ok(())
    }

    /// The epilogue's nodes (above the reduction, and the zero points): each supported,
    /// each load planned.
    fn plan_epilogue(&mut self) -> R<()> {
        let k = self.k;
        let mut roots = vec![k.root];
        roots.extend(self.za);
        roots.extend(self.zb);
        let mut seen = vec![false; k.nodes.len()];
        let mut stack = roots.clone();
        let mut order = Vec::new();
        while let Some(e) = stack.pop() {
            if std::mem::replace(&mut seen[e.index()], true) {
                continue;
            }
            order.push(e);
            // (A load's index is addressing, planned with the load.)
            if e == self.c.reduce || matches!(k.node(e).expr, Expr::Load { .. }) {
                continue;
            }
            k.node(e).expr.for_each_operand(|o| stack.push(o));
        }
        for &e in &order {
            if e != self.c.reduce && !matches!(k.node(e).expr, Expr::Load { .. }) {
                k.node(e).expr.for_each_operand(|o| *self.uses.entry(o.0).or_insert(0) += 1);
            }
        }
        // The corrections use each zero point once more; the root is stored.
        for r in roots {
            *self.uses.entry(r.0).or_insert(0) += 1;
        }
        for &e in &order {
            if e == self.c.reduce {
                continue;
            }
            let node = k.node(e);
            let ty = node.ty;
            let ok = match &node.expr {
                Expr::Const(_) => ty == ScalarType::F32 || is_int32(ty),
                Expr::Load { input, index, bounds } => {
                    if *bounds != Bounds::InBounds {
                        return no("an epilogue load that is not in bounds");
                    }
                    let dtype = k.inputs.get(*input as usize).map(|t| t.dtype);
                    let Some(dtype) = dtype.filter(|d| matches!(d, DType::F32 | DType::I32 | DType::U8 | DType::I8))
                    else {
                        return no("an epilogue load of a dtype other than f32, i32, u8 or i8");
                    };
                    let Some(off) = load_offset(k, *input, index) else { return no("an epilogue load not affine") };
                    let Some(per_n) = self.c.column_step(&off).filter(|s| (0..=1).contains(s)) else {
                        return no("an epilogue load across the columns");
                    };
                    let outer = |v: u32| v == self.c.m || self.c.n.contains(&v) || self.c.batch.contains(&v);
                    if (0..k.vars.len() as u32).any(|v| !outer(v) && off.of(v) != 0) {
                        return no("an epilogue load moved by the reduction");
                    }
                    let elem = if matches!(dtype, DType::U8 | DType::I8) { 1 } else { 4 };
                    self.eloads.insert(e.0, ELoad { base: self.bases.len(), dtype });
                    self.bases.push(Base {
                        binding: *input,
                        elem,
                        c: off.c,
                        batch: self.c.batch.iter().map(|&v| off.of(v)).collect(),
                        per_m: off.of(self.c.m),
                        per_n,
                    });
                    true
                }
                Expr::Cast { value, to, .. } => {
                    let from = k.node(*value).ty;
                    let from_int = is_int32(from);
                    match to {
                        DType::I32 => from_int,
                        DType::F32 => from_int || from == ScalarType::F32,
                        DType::U8 | DType::I8 => from == ScalarType::F32,
                        _ => false,
                    }
                }
                // A comparison of integers held as i32 lanes (i8/i16 sign-extended,
                // u8/u16 zero-extended, so a signed i32 comparison orders them): a
                // saturating clamp on a quantized result (`Clip` of i8 after QLinearConv).
                Expr::Binary(op, x, y) if ty == ScalarType::Bool => {
                    let tx = k.node(*x).ty;
                    tx == k.node(*y).ty && is_int32(tx) && int_cmp(*op).is_some()
                }
                Expr::Binary(op, x, y) => {
                    let (tx, ty2) = (k.node(*x).ty, k.node(*y).ty);
                    let const_side =
                        matches!(k.node(*x).expr, Expr::Const(_)) || matches!(k.node(*y).expr, Expr::Const(_));
                    (tx == ty && ty2 == ty)
                        && match ty {
                            ScalarType::F32 => match op {
                                BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div => true,
                                // (Against a constant bound, so that a NaN passes.)
                                BinaryOp::Max | BinaryOp::Min => const_side,
                                _ => false,
                            },
                            // (`And`: a fixed-point product's low bits, tflite/int8.rs.)
                            ScalarType::I32 => matches!(
                                op,
                                BinaryOp::Add
                                    | BinaryOp::Sub
                                    | BinaryOp::Mul
                                    | BinaryOp::Max
                                    | BinaryOp::Min
                                    | BinaryOp::And
                            ),
                            // (Narrow integers stay within their range under max/min.)
                            t if is_int32(t) => matches!(op, BinaryOp::Max | BinaryOp::Min),
                            _ => false,
                        }
                }
                Expr::Unary(op, x) => {
                    let f = k.node(*x).ty == ScalarType::F32;
                    match op {
                        UnaryOp::Round | UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Trunc => ty == ScalarType::F32,
                        // (Bools are lanes of all ones or zeros.)
                        UnaryOp::IsNan => f,
                        &op if math::has_vector_form(op) && f && ty == ScalarType::F32 => {
                            self.transcendental |= math::vector_scratch(op) > 0;
                            true
                        }
                        _ => false,
                    }
                }
                Expr::Select(c, x, y) => {
                    k.node(*c).ty == ScalarType::Bool
                        && k.node(*x).ty == ty
                        && k.node(*y).ty == ty
                        && (ty == ScalarType::F32 || is_int32(ty))
                }
                _ => false,
            };
            if !ok {
                return no(format!("an epilogue node e{} without a 16-lane form here", e.0));
            }
        }
        // What the root stores.
        let root_ty = k.node(k.root).ty;
        let store_ok = match k.output.dtype {
            DType::F32 => root_ty == ScalarType::F32,
            DType::I32 => root_ty == ScalarType::I32,
            // A cast to the 8-bit type, or a value of that type (held extended in i32
            // lanes, so `vpmovdb` stores its byte).
            DType::U8 | DType::I8 => {
                matches!(k.node(k.root).expr, Expr::Cast { to, .. } if to == k.output.dtype)
                    || (root_ty == ScalarType::U8 && k.output.dtype == DType::U8)
                    || (root_ty == ScalarType::I8 && k.output.dtype == DType::I8)
            }
            _ => false,
        };
        if !store_ok {
            return no("a result other than f32, i32, or a value cast to u8/i8");
        }
        self.plan_hoisting(&order);
        Ok(())
    }

    /// What an epilogue node depends on (memoised in `deps`).
    fn dep(&mut self, e: ExprId) -> u8 {
        if let Some(&d) = self.deps.get(&e.0) {
            return d;
        }
        let d = if e == self.c.reduce {
            D_ACC
        } else if let Some(el) = self.eloads.get(&e.0) {
            let b = &self.bases[el.base];
            (if b.per_n != 0 { D_COL } else { 0 }) | (if b.per_m != 0 { D_ROW } else { 0 })
        } else {
            let mut ops = Vec::new();
            self.k.node(e).expr.for_each_operand(|o| ops.push(o));
            ops.into_iter().fold(0, |d, o| d | self.dep(o))
        };
        self.deps.insert(e.0, d);
        d
    }

    /// Chooses [`Self::hoisted`], [`Self::corr_pre`] and [`Self::za_pre`].
    fn plan_hoisting(&mut self, order: &[ExprId]) {
        let k = self.k;
        let lane_uniform = |e: &mut Self, x: ExprId| e.dep(x) & (D_ACC | D_COL) == 0;
        let computed = |x: ExprId| {
            !matches!(k.node(x).expr, Expr::Const(_) | Expr::Load { .. })
                && (k.node(x).ty == ScalarType::F32 || is_int32(k.node(x).ty))
        };
        let mut cand: Vec<ExprId> = Vec::new();
        for &e in order {
            if e == self.c.reduce || matches!(k.node(e).expr, Expr::Load { .. }) || lane_uniform(self, e) {
                continue;
            }
            let mut ops = Vec::new();
            k.node(e).expr.for_each_operand(|o| ops.push(o));
            for o in ops {
                if lane_uniform(self, o) && computed(o) && !cand.contains(&o) {
                    cand.push(o);
                }
            }
        }
        for z in [self.za, self.zb].into_iter().flatten() {
            if lane_uniform(self, z) && computed(z) && !cand.contains(&z) {
                cand.push(z);
            }
        }
        for (i, &h) in cand.iter().enumerate() {
            self.hoist_at.insert(h.0, i);
        }
        self.hoisted = cand;
        let uniform_z = |e: &mut Self, z: Option<ExprId>| z.is_none_or(|z| lane_uniform(e, z));
        self.corr_pre = self.need_ra && uniform_z(self, self.zb) && (!self.need_cb || uniform_z(self, self.za));
        self.za_pre = self.need_cb && self.za.is_some_and(|z| self.dep(z) == 0) && (self.corr_pre || !self.need_ra);
    }

    fn s_base(&self, b: usize) -> i32 {
        S_COORD + 8 * (self.batch_ext.len() + b) as i32
    }
    fn s_tile(&self, b: usize) -> i32 {
        self.s_base(self.bases.len() + b)
    }
    /// A's row sums of a tile (12 words).
    fn s_rs(&self) -> i32 {
        (self.s_tile(self.bases.len()) + 63) / 64 * 64
    }
    /// The hoisted values of a tile's rows ([`Self::hoisted`], `MR` words each).
    fn s_h(&self) -> i32 {
        self.s_rs() + 64
    }
    /// The copy of a block of B (aligned to 64 bytes at run time).
    fn s_buf(&self) -> i32 {
        self.s_h() + ((4 * MR as i32 * self.hoisted.len() as i32) + 63) / 64 * 64
    }
    /// Bytes of one block's copy and its column sums (the AVX2 form: the copy alone).
    fn block_bytes(&self) -> i32 {
        if self.ymm {
            return self.y_block_bytes();
        }
        self.c.dims[2].div_ceil(4) as i32 * (NB as i32 * 4) + 64 * NV as i32
    }
    /// Columns of a block.
    fn nb(&self) -> u64 {
        nb_of(self.ymm)
    }
    fn frame_size(&self) -> i32 {
        let buf = self.block_bytes() * self.nblk as i32 + 64 + self.y_pre_bytes();
        (self.s_buf() + buf + 15) / 16 * 16
    }

    fn function(&mut self) -> R<()> {
        enter(&mut self.a)?;
        let frame = self.frame_size();
        reserve(&mut self.a, frame)?;
        // rdi bindings, rdx begin, rcx end (clamped).
        let done = self.workgroup_range()?;
        let at = self.s_buf() + 63;
        self.a.lea(rax, qword_ptr(rsp + at))?;
        self.a.and(rax, -64)?;
        // (The AVX2 form's packed rows of A and its spilled accumulators come first.)
        let pre = self.y_pre_bytes() as i64;
        add_imm(&mut self.a, rax, pre, rcx)?;
        self.a.mov(qword_ptr(rsp + S_PBP), rax)?;
        // Decode: group, block, then batch coordinates innermost first.
        let (top, next) = self.workgroup_top(self.groups)?;
        self.a.mov(qword_ptr(rsp + S_GROUP), rdx)?;
        self.a.xor(edx, edx)?;
        self.a.mov(rcx, self.blocks as i64)?;
        self.a.div(rcx)?;
        self.a.mov(r8, rdx)?;
        self.batch_coords()?;
        // The first column: `bw · nblk · 32`, or (the partial block's workgroup) `full · 32`;
        // the blocks: `min(nblk, full − n0/32)` (0 there: its path sets 1).
        let nb = self.nb();
        let full_cols = (self.full * nb) as i64;
        self.imul(r8, (self.nblk * nb) as i64)?;
        self.a.mov(rcx, full_cols)?;
        self.a.cmp(r8, rcx)?;
        self.a.cmova(r8, rcx)?;
        self.a.mov(qword_ptr(rsp + S_N0), r8)?;
        self.a.sub(rcx, r8)?;
        self.a.shr(rcx, nb.trailing_zeros() as i32)?;
        self.a.mov(rdx, self.nblk as i64)?;
        self.a.cmp(rcx, rdx)?;
        self.a.cmova(rcx, rdx)?;
        self.a.mov(qword_ptr(rsp + S_BCNT), rcx)?;
        // Base pointers (row 0 of this batch position, column n0).
        for bi in 0..self.bases.len() {
            let b = self.base_at_batch(bi)?;
            if b.per_n != 0 {
                self.add_scaled(S_N0, b.per_n * b.elem)?;
            }
            let s = self.s_base(bi);
            self.a.mov(qword_ptr(rsp + s), rax)?;
        }
        // Variants: the last block may be partial, the last group may have fewer rows.
        let m = self.c.dims[0];
        let last_rows = m - (self.groups - 1) * self.rows_per_group;
        // (The partial block's workgroup first; then whole blocks.)
        let mut col_variants: Vec<(u64, bool)> = Vec::new();
        if self.part != 0 {
            col_variants.push((self.part, self.full > 0));
        }
        if self.full > 0 {
            col_variants.push((nb, false));
        }
        let row_variants: Vec<(u64, bool)> = if last_rows != self.rows_per_group {
            vec![(last_rows, true), (self.rows_per_group, false)]
        } else {
            vec![(self.rows_per_group, false)]
        };
        for &(cols, last_block) in &col_variants {
            let other_cols = self.variant_guard(last_block, S_N0, full_cols as i32)?;
            if cols != nb {
                self.a.mov(qword_ptr(rsp + S_BCNT), 1)?;
            }
            self.pack_blocks(cols)?;
            for &(rows, last_group) in &row_variants {
                let other_rows = self.variant_guard(last_group, S_GROUP, (self.groups - 1) as i32)?;
                self.rows(rows, cols)?;
                self.a.jmp(next)?;
                self.land(other_rows)?;
            }
            self.land(other_cols)?;
        }
        self.workgroup_loop_end(next, top, done, frame)
    }

    /// `rax` = base `bi`'s binding at this batch position (its coordinates at
    /// `S_COORD`, `rcx` scratch); returns the base.
    fn base_at_batch(&mut self, bi: usize) -> R<Base> {
        let b = self.bases[bi].clone();
        self.a.mov(rax, qword_ptr(r15 + 8 * b.binding as i32))?;
        add_imm(&mut self.a, rax, b.c * b.elem, rcx)?;
        for (i, &coef) in b.batch.iter().enumerate() {
            if coef != 0 {
                self.a.mov(rcx, qword_ptr(rsp + (S_COORD + 8 * i as i32)))?;
                self.imul(rcx, coef * b.elem)?;
                self.a.add(rax, rcx)?;
            }
        }
        Ok(b)
    }

    /// The workgroup range's set-up (`rdi` bindings, `rdx` begin, `rcx` end): the end
    /// clamped to the workgroup count into `S_END`, the bindings in `r15`, the workgroup
    /// in `r14`; returns the label past the loop, jumped to at once for an empty range.
    fn workgroup_range(&mut self) -> R<CodeLabel> {
        self.a.mov(rax, self.workgroups() as i64)?;
        self.a.cmp(rcx, rax)?;
        self.a.cmova(rcx, rax)?;
        self.a.mov(qword_ptr(rsp + S_END), rcx)?;
        self.a.mov(r15, rdi)?;
        self.a.mov(r14, rdx)?;
        let done = self.a.create_label();
        self.a.cmp(r14, rcx)?;
        self.a.jae(done)?;
        Ok(done)
    }

    /// The workgroup loop's end (`next`: the next workgroup, back to `top` while below
    /// `S_END`), then `done`, the frame's release and the constant tables.
    fn workgroup_loop_end(&mut self, mut next: CodeLabel, top: CodeLabel, mut done: CodeLabel, frame: i32) -> R<()> {
        self.a.set_label(&mut next)?;
        self.a.inc(r14)?;
        self.a.cmp(r14, qword_ptr(rsp + S_END))?;
        self.a.jb(top)?;
        self.a.set_label(&mut done)?;
        leave(&mut self.a, frame)?;
        self.t.emit(&mut self.a)
    }

    /// The one-column form: a workgroup is 16 rows (of one batch position); each row's
    /// products are one `vpdpbusd` per 64 bytes of its reduction against the same bytes
    /// of `B`'s column (flipped where both have one signedness; `A`'s row sums by the
    /// same loads), 8 rows at a time, summed across the lanes into the stack; the 16 sums
    /// are then one vector, rows in the lanes, through the corrections and the epilogue
    /// (per-row operands loaded as vectors, per-tensor ones broadcast) and stored.
    fn function_gemv(&mut self) -> R<()> {
        enter(&mut self.a)?;
        let gv = self.s_rs();
        let frame = (gv + 3 * 64 + 64 + 15) / 16 * 16;
        self.a.sub(rsp, frame)?;
        let done = self.workgroup_range()?;
        let m = self.c.dims[0];
        let kk = self.c.dims[2];
        let groups = m.div_ceil(16);
        let (top, next) = self.workgroup_top(groups)?;
        self.a.mov(qword_ptr(rsp + S_GROUP), rdx)?;
        self.gemv_pointers(16)?;
        self.load_lo()?;
        let (chunks, part) = self.k_chunks(kk)?;
        let ones = self.t.scalar(&mut self.a, 0x0101_0101);
        self.a.vpbroadcastd(zmm18, dword_ptr(ones))?;
        let flip = if self.delta != 0 { Some(self.t.scalar(&mut self.a, 0x8080_8080)) } else { None };
        if let Some(f) = flip {
            self.a.vpbroadcastd(zmm19, dword_ptr(f))?;
        }
        let d = self.dot();
        let a_unsigned = self.a_unsigned;
        // B's chunk into zmm16 (flipped; masked bytes zero).
        let load_b = |e: &mut Self, at: AsmMemoryOperand, masked: bool| -> R<()> {
            if masked {
                // (The flip is by 32-bit lanes: the bytes past the reduction are zeroed
                // again after it, byte by byte.)
                e.a.vmovdqu8(zmm16.k3().z(), at)?;
                if flip.is_some() {
                    e.a.vpxord(zmm16, zmm16, zmm19)?;
                    e.a.vmovdqu8(zmm16.k3().z(), zmm16)?;
                }
            } else {
                e.a.vmovdqu8(zmm16, at)?;
                if flip.is_some() {
                    e.a.vpxord(zmm16, zmm16, zmm19)?;
                }
            }
            Ok(())
        };
        // The lanes of ZMM[r] (r < 16) summed into its lane 0 (zmm20/21 scratch, whole
        // registers: EVEX forms), stored.
        let hsum = |e: &mut Self, r: usize, at: i32| -> R<()> {
            e.a.vextracti64x4(ymm20, ZMM[r], 1)?;
            e.a.vpaddd(zmm20, zmm20, ZMM[r])?;
            e.a.vextracti32x4(xmm21, zmm20, 1)?;
            e.a.vpaddd(zmm20, zmm20, zmm21)?;
            e.a.vpshufd(zmm21, zmm20, 0x4E)?;
            e.a.vpaddd(zmm20, zmm20, zmm21)?;
            e.a.vpshufd(zmm21, zmm20, 0xB1)?;
            e.a.vpaddd(ZMM[r], zmm20, zmm21)?;
            e.a.vmovd(dword_ptr(rsp + at), XMM[r])?;
            Ok(())
        };
        // Σb' over the column (for za).
        if self.need_cb {
            self.a.mov(rsi, qword_ptr(rsp + self.s_tile(1)))?;
            self.a.vpxord(zmm0, zmm0, zmm0)?;
            let col = |e: &mut Self, at: AsmMemoryOperand, masked: bool| -> R<()> {
                load_b(e, at, masked)?;
                if a_unsigned {
                    d.emit(&mut e.a, zmm0, zmm18, zmm16)
                } else {
                    d.emit(&mut e.a, zmm0, zmm16, zmm18)
                }
            };
            self.chunked_columns(chunks, part, &[rsi], |e, masked| col(e, zmmword_ptr(rsi), masked))?;
            hsum(self, 0, gv + 128)?;
        }
        let last_rows = m - (groups - 1) * 16;
        let variants: Vec<(u64, bool)> =
            if last_rows != 16 { vec![(last_rows, true), (16, false)] } else { vec![(16, false)] };
        let pitch = self.a_pitch;
        // Row `r`'s 64 bytes of `A` (at `r9 + r·pitch`; masked bytes zero) into zmm17,
        // then each `acc += ` its products with the other operand of the pair (zmm16 the
        // column, zmm18 the ones of the row sums), the unsigned one first.
        let row = |e: &mut Self, r: usize, masked: bool, accs: &[(AsmRegisterZmm, AsmRegisterZmm)]| -> R<()> {
            let at = zmmword_ptr(r9 + (pitch * r as i64) as i32);
            if masked {
                e.a.vmovdqu8(zmm17.k3().z(), at)?;
            } else {
                e.a.vmovdqu8(zmm17, at)?;
            }
            for &(acc, with) in accs {
                if a_unsigned {
                    d.emit(&mut e.a, acc, zmm17, with)?;
                } else {
                    d.emit(&mut e.a, acc, with, zmm17)?;
                }
            }
            Ok(())
        };
        for (rows, last) in variants {
            let other = self.variant_guard(last && groups > 1, S_GROUP, (groups - 1) as i32)?;
            if !self.need_ra && i32::try_from(pitch * 16).is_ok() {
                // Without row sums: the 16 rows at once, each `B` chunk loaded once,
                // then the 16 vectors reduced to one of 16 sums.
                let n = rows as usize;
                for r in 0..16 {
                    self.a.vpxord(ZMM[r], ZMM[r], ZMM[r])?;
                }
                self.a.mov(rsi, qword_ptr(rsp + self.s_tile(1)))?;
                self.a.mov(r9, qword_ptr(rsp + self.s_tile(0)))?;
                let step = |e: &mut Self, masked: bool| -> R<()> {
                    load_b(e, zmmword_ptr(rsi), masked)?;
                    for r in 0..n {
                        row(e, r, masked, &[(ZMM[r], zmm16)])?;
                    }
                    Ok(())
                };
                self.chunked_columns(chunks, part, &[rsi, r9], step)?;
                self.sum_lanes16()?;
                self.a.vmovdqu32(zmmword_ptr(rsp + gv), zmm0)?;
            } else {
                for h in 0..2u64 {
                    let n = rows.saturating_sub(8 * h).min(8) as usize;
                    if n == 0 {
                        continue;
                    }
                    for r in 0..n {
                        self.a.vpxord(ZMM[r], ZMM[r], ZMM[r])?;
                        self.a.vpxord(ZMM[8 + r], ZMM[8 + r], ZMM[8 + r])?;
                    }
                    self.a.mov(rsi, qword_ptr(rsp + self.s_tile(1)))?;
                    self.a.mov(r9, qword_ptr(rsp + self.s_tile(0)))?;
                    add_imm(&mut self.a, r9, pitch * 8 * h as i64, rax)?;
                    let need_ra = self.need_ra;
                    let step = |e: &mut Self, masked: bool| -> R<()> {
                        load_b(e, zmmword_ptr(rsi), masked)?;
                        for r in 0..n {
                            let both = [(ZMM[r], zmm16), (ZMM[8 + r], zmm18)];
                            row(e, r, masked, &both[..if need_ra { 2 } else { 1 }])?;
                        }
                        Ok(())
                    };
                    self.chunked_columns(chunks, part, &[rsi, r9], step)?;
                    for r in 0..n {
                        hsum(self, r, gv + 4 * (8 * h as i32 + r as i32))?;
                        if need_ra {
                            hsum(self, 8 + r, gv + 64 + 4 * (8 * h as i32 + r as i32))?;
                        }
                    }
                }
            }
            // The 16 sums as one vector; the corrections; the epilogue; the store.
            let masked = rows < 16;
            if masked {
                self.a.mov(eax, ((1u32 << rows) - 1) as i32)?;
                self.a.kmovw(k1, eax)?;
            }
            let mut ev = Eval::new(self.uses.clone(), 0, 0, masked);
            ev.rows_lanes = true;
            let mut pool: Vec<usize> = (1..29).rev().collect();
            self.a.vmovdqu32(zmm0, zmmword_ptr(rsp + gv))?;
            let kk32 = kk as u32;
            let mut za_reg = None;
            if self.need_cb {
                let za = self.za.ok_or_else(|| NotHere("column sums without a zero point".into()))?;
                let z = self.eval(za, &mut ev, &mut pool)?;
                let t = take(&mut pool)?;
                self.a.vpmulld(ZMM[t], ZMM[z], dword_bcst(rsp + (gv + 128)))?;
                self.a.vpsubd(zmm0, zmm0, ZMM[t])?;
                pool.push(t);
                za_reg = Some((za, z));
            }
            if self.need_ra {
                let z2 = self.zb_delta(&mut ev, &mut pool)?;
                let t = take(&mut pool)?;
                self.a.vpmulld(ZMM[t], ZMM[z2], zmmword_ptr(rsp + (gv + 64)))?;
                self.a.vpsubd(zmm0, zmm0, ZMM[t])?;
                if let Some((_, z)) = za_reg {
                    self.a.vpmulld(ZMM[t], ZMM[z], ZMM[z2])?;
                    let kl = self.t.scalar(&mut self.a, kk32);
                    self.a.vpmulld(ZMM[t], ZMM[t], dword_bcst(kl))?;
                    self.a.vpaddd(zmm0, zmm0, ZMM[t])?;
                }
                pool.push(t);
                pool.push(z2);
            }
            if let Some((za, z)) = za_reg {
                self.release(za, z, &mut ev, &mut pool);
            }
            if let Some(zb) = self.zb {
                if let Some(&r) = ev.memo.get(&zb.0) {
                    self.release(zb, r, &mut ev, &mut pool);
                }
            }
            ev.memo.insert(self.c.reduce.0, 0);
            let root = self.k.root;
            let r = self.eval(root, &mut ev, &mut pool)?;
            self.a.mov(rax, qword_ptr(rsp + self.s_tile(2)))?;
            let z = ZMM[r];
            match self.k.output.dtype {
                DType::U8 | DType::I8 => {
                    if masked {
                        self.a.vpmovdb(xmmword_ptr(rax).k1(), z)?;
                    } else {
                        self.a.vpmovdb(xmmword_ptr(rax), z)?;
                    }
                }
                _ => {
                    if masked {
                        self.a.vmovdqu32(zmmword_ptr(rax).k1(), z)?;
                    } else {
                        self.a.vmovdqu32(zmmword_ptr(rax), z)?;
                    }
                }
            }
            self.a.jmp(next)?;
            self.land(other)?;
        }
        self.workgroup_loop_end(next, top, done, frame)
    }

    /// The lanes of each of `zmm0`..`zmm15` summed, into lane `r` of `zmm0` for register
    /// `r` (a transposing reduction: pairs interleaved by dwords and added, then by
    /// quadwords, then 128-bit lanes twice; 45 instructions for 16 rows, where a
    /// horizontal sum a row is 8). `zmm20`/`zmm21` scratch.
    fn sum_lanes16(&mut self) -> R<()> {
        for i in 0..8 {
            let (x, y) = (ZMM[2 * i], ZMM[2 * i + 1]);
            self.a.vpunpckldq(zmm20, x, y)?;
            self.a.vpunpckhdq(zmm21, x, y)?;
            self.a.vpaddd(ZMM[i], zmm20, zmm21)?;
        }
        for i in 0..4 {
            let (x, y) = (ZMM[2 * i], ZMM[2 * i + 1]);
            self.a.vpunpcklqdq(zmm20, x, y)?;
            self.a.vpunpckhqdq(zmm21, x, y)?;
            self.a.vpaddd(ZMM[i], zmm20, zmm21)?;
        }
        // (Lanes 0 and 2 of each, then 1 and 3: the halves of each row group added.)
        for n in [2, 1] {
            for i in 0..n {
                let (x, y) = (ZMM[2 * i], ZMM[2 * i + 1]);
                self.a.vshufi32x4(zmm20, x, y, 0x88)?;
                self.a.vshufi32x4(zmm21, x, y, 0xDD)?;
                self.a.vpaddd(ZMM[i], zmm20, zmm21)?;
            }
        }
        Ok(())
    }

    /// The reduction in 64-byte chunks: `chunks` times `body(unmasked)` in an `rcx`
    /// loop, each pass advancing `regs` by 64 bytes, then, for a partial last chunk
    /// (`part` bytes, under the byte mask the caller set in `k3`), `body(masked)` once.
    fn chunked_columns(
        &mut self,
        chunks: u64,
        part: u64,
        regs: &[AsmRegister64],
        body: impl Fn(&mut Self, bool) -> R<()>,
    ) -> R<()> {
        if chunks > 0 {
            self.a.mov(rcx, chunks as i64)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            body(self, false)?;
            for &r in regs {
                self.a.add(r, 64)?;
            }
            self.a.dec(rcx)?;
            self.a.jnz(l)?;
        }
        if part != 0 {
            body(self, true)?;
        }
        Ok(())
    }

    fn imul(&mut self, r: AsmRegister64, imm: i64) -> R<()> {
        match i32::try_from(imm) {
            Ok(i) => self.a.imul_3(r, r, i)?,
            Err(_) => {
                self.a.mov(rdx, imm)?;
                self.a.imul_2(r, rdx)?;
            }
        }
        Ok(())
    }

    fn dot(&self) -> Dot {
        Dot { vnni: self.vnni, lo: zmm31, t0: zmm29, t1: zmm30 }
    }

    /// `lo` of [`Dot`] into `zmm31` (the widened form only).
    fn load_lo(&mut self) -> R<()> {
        if !self.vnni {
            let l = self.t.scalar(&mut self.a, 0x00FF_00FF);
            self.a.vpbroadcastd(zmm31, dword_ptr(l))?;
        }
        Ok(())
    }

    /// Copies the workgroup's `S_BCNT` blocks of `cols` columns each (one block where
    /// `cols` is not 32) into its buffers, one after another.
    fn pack_blocks(&mut self, cols: u64) -> R<()> {
        self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
        self.a.mov(qword_ptr(rsp + S_BBUF), rax)?;
        self.a.mov(rax, qword_ptr(rsp + self.s_base(1)))?;
        self.a.mov(qword_ptr(rsp + S_BSRC), rax)?;
        self.a.mov(rax, qword_ptr(rsp + S_BCNT))?;
        self.a.mov(qword_ptr(rsp + S_BLEFT), rax)?;
        let mut l = self.a.create_label();
        self.a.set_label(&mut l)?;
        self.pack(cols)?;
        self.a.add(qword_ptr(rsp + S_BBUF), self.block_bytes())?;
        self.a.add(qword_ptr(rsp + S_BSRC), (self.nb() as i64 * self.b_step) as i32)?;
        self.a.dec(qword_ptr(rsp + S_BLEFT))?;
        self.a.jnz(l)?;
        Ok(())
    }

    /// Offset of a block's column sums from its copy.
    fn cb_off(&self) -> i32 {
        self.c.dims[2].div_ceil(4) as i32 * (NB as i32 * 4)
    }

    /// Copies the block of `cols` columns of B at `S_BSRC` into the buffer at `S_BBUF`,
    /// `[⌈K/4⌉, 32, 4]` (flipped where [`Self::delta`] says), and its column sums into
    /// the stack where they are needed.
    fn pack(&mut self, cols: u64) -> R<()> {
        if self.ymm {
            return self.pack_ymm(cols);
        }
        let kk = self.c.dims[2];
        let chunks = cols.div_ceil(16) as usize;
        let part = cols % 16;
        let stride2 = self.b_step == 2;
        if stride2 {
            // Even bytes of 32 (the last not read), or of the partial chunk's columns.
            self.a.mov(eax, 0x7FFF_FFFF)?;
            self.a.kmovd(k5, eax)?;
            if part != 0 {
                self.a.mov(eax, ((1u64 << (2 * part - 1)) - 1) as i32)?;
                self.a.kmovd(k3, eax)?;
            }
        } else if part != 0 {
            self.a.mov(eax, ((1u32 << part) - 1) as i32)?;
            self.a.kmovw(k3, eax)?;
        }
        let flip = if self.delta != 0 { Some(self.t.vector(&mut self.a, 0x8080_8080)) } else { None };
        let table = self.pack_pointers()?;
        let quads = kk / 4;
        let rest = kk % 4;
        // One quad of rows (`rows` of them real): into xmm0..3 per chunk, interleaved,
        // stored.
        let quad = |e: &mut Self, rows: u64| -> R<()> {
            for c8 in 0..chunks {
                for t in 0..4u64 {
                    let r = XMMS[t as usize];
                    if t >= rows {
                        e.a.vpxor(r, r, r)?;
                        continue;
                    }
                    let disp = 16 * c8 as i32 * e.b_step as i32;
                    let at = match table {
                        Some(_) => {
                            e.a.movsxd(rax, dword_ptr(r11 + 4 * t as i32))?;
                            ptr(rsi + rax + disp)
                        }
                        None => ptr(rsi + (e.b_stride * t as i64 + disp as i64) as i32),
                    };
                    let last = c8 == chunks - 1 && part != 0;
                    if stride2 {
                        let y = YMMS[t as usize];
                        if last {
                            e.a.vmovdqu8(y.k3().z(), ymmword_ptr(at))?;
                        } else {
                            e.a.vmovdqu8(y.k5().z(), ymmword_ptr(at))?;
                        }
                        e.a.vpmovwb(r, y)?;
                    } else if last {
                        e.a.vmovdqu8(r.k3().z(), xmmword_ptr(at))?;
                    } else {
                        e.a.vmovdqu8(r, xmmword_ptr(at))?;
                    }
                    if let Some(f) = flip {
                        e.a.vpxor(r, r, xmmword_ptr(f))?;
                    }
                }
                e.a.vpunpcklbw(xmm4, xmm0, xmm1)?;
                e.a.vpunpckhbw(xmm5, xmm0, xmm1)?;
                e.a.vpunpcklbw(xmm6, xmm2, xmm3)?;
                e.a.vpunpckhbw(xmm7, xmm2, xmm3)?;
                e.a.vpunpcklwd(xmm0, xmm4, xmm6)?;
                e.a.vpunpckhwd(xmm1, xmm4, xmm6)?;
                e.a.vpunpcklwd(xmm2, xmm5, xmm7)?;
                e.a.vpunpckhwd(xmm3, xmm5, xmm7)?;
                for q in 0..4 {
                    e.a.vmovdqu(xmmword_ptr(r10 + (64 * c8 as i32 + 16 * q)), XMMS[q as usize])?;
                }
            }
            // (Chunks past the columns are never read into a stored column.)
            e.a.add(r10, (NB * 4) as i32)?;
            match table {
                Some(_) => e.a.add(r11, 16)?,
                None => add_imm(&mut e.a, rsi, 4 * e.b_stride, rax)?,
            }
            Ok(())
        };
        if quads > 0 {
            self.a.mov(rbx, quads as i64)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            quad(self, 4)?;
            self.a.dec(rbx)?;
            self.a.jnz(l)?;
        }
        if rest > 0 {
            quad(self, rest)?;
        }
        if self.need_cb {
            // Column sums of b' over the copy (padded rows are zero).
            self.load_lo()?;
            let ones = self.t.scalar(&mut self.a, 0x0101_0101);
            self.a.vpbroadcastd(zmm28, dword_ptr(ones))?;
            for j in 0..NV {
                self.a.vpxord(ZMM[j], ZMM[j], ZMM[j])?;
            }
            self.a.mov(r10, qword_ptr(rsp + S_BBUF))?;
            self.a.mov(rbx, kk.div_ceil(4) as i64)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            let d = self.dot();
            for j in 0..chunks {
                self.a.vmovdqu32(zmm27, zmmword_ptr(r10 + 64 * j as i32))?;
                if self.a_unsigned {
                    d.emit(&mut self.a, ZMM[j], zmm28, zmm27)?;
                } else {
                    d.emit(&mut self.a, ZMM[j], zmm27, zmm28)?;
                }
            }
            self.a.add(r10, (NB * 4) as i32)?;
            self.a.dec(rbx)?;
            self.a.jnz(l)?;
            if self.za_pre {
                // `za · Σb'` (one `za` for the tensor).
                let za = self.za.ok_or_else(|| NotHere("column sums without a zero point".into()))?;
                let mut ev = Eval::new(self.uses.clone(), 0, 0, false);
                ev.precompute = true;
                ev.from_base = true;
                let mut pool: Vec<usize> = (NV..16).rev().collect();
                let z = self.eval(za, &mut ev, &mut pool)?;
                for j in 0..NV {
                    self.a.vpmulld(ZMM[j], ZMM[j], ZMM[z])?;
                }
            }
            self.a.mov(r10, qword_ptr(rsp + S_BBUF))?;
            for j in 0..NV {
                let at = self.cb_off() + 64 * j as i32;
                self.a.vmovdqu32(zmmword_ptr(r10 + at), ZMM[j])?;
            }
        }
        Ok(())
    }

    /// The tiles of a group of `rows` rows (from row `group · rows_per_group`) over a
    /// block of `cols` columns.
    fn rows(&mut self, rows: u64, cols: u64) -> R<()> {
        self.a.mov(rax, qword_ptr(rsp + S_GROUP))?;
        self.imul(rax, self.rows_per_group as i64)?;
        self.a.mov(qword_ptr(rsp + S_MT), rax)?;
        let mr = self.mr;
        let full = rows / mr;
        let tail = rows % mr;
        if full > 0 {
            self.a.mov(qword_ptr(rsp + S_TCOUNT), full as i32)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            self.tile(mr, cols)?;
            self.a.add(qword_ptr(rsp + S_MT), mr as i32)?;
            self.a.dec(qword_ptr(rsp + S_TCOUNT))?;
            self.a.jnz(l)?;
        }
        if tail > 0 {
            self.tile(tail, cols)?;
        }
        Ok(())
    }

    /// One tile: `rows` rows from row `S_MT`, the block's `cols` columns.
    fn tile(&mut self, rows: u64, cols: u64) -> R<()> {
        if self.ymm {
            return self.tile_ymm(rows, cols);
        }
        let rows_ = rows as usize;
        let nv = cols.div_ceil(16) as usize;
        let kk = self.c.dims[2];
        self.tile_pointers()?;
        // The row-invariant epilogue values, once per row (the accumulators are free).
        let hoisted = self.hoisted.clone();
        if !hoisted.is_empty() {
            for i in 0..rows_ {
                let mut ev = Eval::new(self.uses.clone(), i, 0, false);
                ev.precompute = true;
                let mut pool: Vec<usize> = (0..16).rev().collect();
                for (hi, &h) in hoisted.iter().enumerate() {
                    let r = self.eval(h, &mut ev, &mut pool)?;
                    let at = self.s_h() + 4 * (hi as i32 * MR as i32 + i as i32);
                    self.a.vmovd(dword_ptr(rsp + at), XMM[r])?;
                }
            }
        }
        self.load_lo()?;
        let d = self.dot();
        let pitch = self.a_pitch;
        if self.need_ra {
            // Row sums of A, each over its K bytes (the last chunk under a byte mask).
            let ones = self.t.scalar(&mut self.a, 0x0101_0101);
            self.a.vpbroadcastd(zmm28, dword_ptr(ones))?;
            let (chunks, part) = self.k_chunks(kk)?;
            let st = self.s_tile(0);
            for i in 0..rows_ {
                self.a.mov(rax, qword_ptr(rsp + st))?;
                add_imm(&mut self.a, rax, pitch * i as i64, rcx)?;
                self.a.vpxord(zmm1, zmm1, zmm1)?;
                let acc = |e: &mut Self, at: AsmMemoryOperand, masked: bool| -> R<()> {
                    if masked {
                        e.a.vmovdqu8(zmm27.k3().z(), at)?;
                    } else {
                        e.a.vmovdqu8(zmm27, at)?;
                    }
                    if e.a_unsigned {
                        d.emit(&mut e.a, zmm1, zmm27, zmm28)
                    } else {
                        d.emit(&mut e.a, zmm1, zmm28, zmm27)
                    }
                };
                self.chunked_columns(chunks, part, &[rax], |e, masked| acc(e, zmmword_ptr(rax), masked))?;
                // Horizontal sum into lane 0.
                self.a.vextracti64x4(ymm2, zmm1, 1)?;
                self.a.vpaddd(ymm1, ymm1, ymm2)?;
                self.a.vextracti128(xmm2, ymm1, 1)?;
                self.a.vpaddd(xmm1, xmm1, xmm2)?;
                self.a.vpshufd(xmm2, xmm1, 0x4E)?;
                self.a.vpaddd(xmm1, xmm1, xmm2)?;
                self.a.vpshufd(xmm2, xmm1, 0xB1)?;
                self.a.vpaddd(xmm1, xmm1, xmm2)?;
                if self.corr_pre {
                    // `K·za·(zb + δ) − (zb + δ)·Σa` in its place.
                    let mut ev = Eval::new(self.uses.clone(), i, 0, false);
                    let mut pool: Vec<usize> = (3..16).rev().collect();
                    let z2 = self.zb_delta(&mut ev, &mut pool)?;
                    let t = take(&mut pool)?;
                    self.a.vpbroadcastd(ZMM[t], xmm1)?;
                    self.a.vpmulld(ZMM[t], ZMM[t], ZMM[z2])?;
                    let u = take(&mut pool)?;
                    match self.za.filter(|_| self.need_cb) {
                        Some(za) => {
                            let z = self.eval(za, &mut ev, &mut pool)?;
                            self.a.vpmulld(ZMM[u], ZMM[z], ZMM[z2])?;
                            let kl = self.t.scalar(&mut self.a, kk as u32);
                            self.a.vpmulld(ZMM[u], ZMM[u], dword_bcst(kl))?;
                        }
                        None => self.a.vpxord(ZMM[u], ZMM[u], ZMM[u])?,
                    }
                    self.a.vpsubd(ZMM[t], ZMM[u], ZMM[t])?;
                    let at = self.s_rs() + 4 * i as i32;
                    self.a.vmovd(dword_ptr(rsp + at), XMM[t])?;
                } else {
                    let at = self.s_rs() + 4 * i as i32;
                    self.a.vmovd(dword_ptr(rsp + at), xmm1)?;
                }
            }
        }
        // The workgroup's blocks, one after another, against these rows.
        let block = self.blocks_top()?;
        let acc = |i: usize, j: usize| ZMM[i * NV + j];
        let breg = |j: usize| ZMM[24 + j];
        let areg = zmm26;
        for i in 0..rows_ {
            for j in 0..nv {
                self.a.vpxord(acc(i, j), acc(i, j), acc(i, j))?;
            }
        }
        let st = self.s_tile(0);
        self.a.mov(r9, qword_ptr(rsp + st))?;
        self.a.mov(r10, qword_ptr(rsp + S_BBUF))?;
        let quads = kk / 4;
        let rest = kk % 4;
        let step = |e: &mut Self, tail: bool| -> R<()> {
            for j in 0..nv {
                e.a.vmovdqu32(breg(j), zmmword_ptr(r10 + 64 * j as i32))?;
            }
            for i in 0..rows_ {
                let at = dword_ptr(r9 + (pitch * i as i64) as i32);
                if tail {
                    e.a.vmovdqu8(xmm26.k1().z(), xmmword_ptr(r9 + (pitch * i as i64) as i32))?;
                    e.a.vpbroadcastd(areg, xmm26)?;
                } else {
                    e.a.vpbroadcastd(areg, at)?;
                }
                for j in 0..nv {
                    if e.a_unsigned {
                        d.emit(&mut e.a, acc(i, j), areg, breg(j))?;
                    } else {
                        d.emit(&mut e.a, acc(i, j), breg(j), areg)?;
                    }
                }
            }
            Ok(())
        };
        if quads > 0 {
            self.a.mov(rbx, quads as i64)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            step(self, false)?;
            self.a.add(r9, 4)?;
            self.a.add(r10, (NB * 4) as i32)?;
            self.a.dec(rbx)?;
            self.a.jnz(l)?;
        }
        if rest > 0 {
            self.a.mov(eax, ((1u32 << rest) - 1) as i32)?;
            self.a.kmovw(k1, eax)?;
            step(self, true)?;
        }
        // Epilogue, accumulator by accumulator. Opmasks: `k1` the columns' tail (the
        // reduction's tail is done with it), `k2` erf's, `k4`/`k5` conversions' and
        // selects' (the conventions of `super::vops`).
        let part = cols % 16;
        if part != 0 {
            self.a.mov(eax, ((1u32 << part) - 1) as i32)?;
            self.a.kmovw(k1, eax)?;
        }
        // (The registers of the reduction, and accumulators a short tile leaves unused.)
        let mut pool: Vec<usize> = (rows_ * NV..32).rev().collect();
        self.a.mov(r11, qword_ptr(rsp + S_BBUF))?;
        for i in 0..rows_ {
            for j in 0..nv {
                let masked = part != 0 && j == nv - 1;
                self.slot(i, j, acc(i, j), masked, &mut pool)?;
            }
        }
        self.blocks_next(block)
    }

    /// The epilogue of accumulator `(i, j)` (row `i` of the tile, vector `j`), stored;
    /// its register returns to `pool` with those the evaluation used.
    fn slot(&mut self, i: usize, j: usize, acc: AsmRegisterZmm, masked: bool, pool: &mut Vec<usize>) -> R<()> {
        let mut ev = Eval::new(self.uses.clone(), i, j, masked);
        let accn = ZMM.iter().position(|&z| z == acc).unwrap_or(0);
        // Corrections (see the module docs).
        let kk = self.c.dims[2] as i32;
        if self.za_pre || self.corr_pre {
            // Precomputed: `za·Σb'` per column, the rest per row.
            if self.need_cb {
                if self.za_pre {
                    let at = self.cb_off() + 64 * j as i32;
                    self.a.vpsubd(acc, acc, zmmword_ptr(r11 + at))?;
                } else {
                    let (za, z) = self.sub_column_sums(acc, j, &mut ev, pool)?;
                    self.release(za, z, &mut ev, pool);
                }
            }
            if self.need_ra {
                if self.corr_pre {
                    let at = self.s_rs() + 4 * i as i32;
                    self.a.vpaddd(acc, acc, dword_bcst(rsp + at))?;
                } else {
                    return no("row corrections not precomputed with the column sums");
                }
            }
        } else if self.need_cb {
            let (za, z) = self.sub_column_sums(acc, j, &mut ev, pool)?;
            if self.need_ra {
                let z2 = self.zb_delta(&mut ev, pool)?;
                // + K·za·(zb + δ)
                let t = take(pool)?;
                self.a.vpmulld(ZMM[t], ZMM[z], ZMM[z2])?;
                let kl = self.t.scalar(&mut self.a, kk as u32);
                let u = take(pool)?;
                self.a.vpbroadcastd(ZMM[u], dword_ptr(kl))?;
                self.a.vpmulld(ZMM[t], ZMM[t], ZMM[u])?;
                self.a.vpaddd(acc, acc, ZMM[t])?;
                self.ra_term(i, acc, z2, pool)?;
                pool.push(t);
                pool.push(u);
                pool.push(z2);
            }
            self.release(za, z, &mut ev, pool);
        } else if self.need_ra {
            let z2 = self.zb_delta(&mut ev, pool)?;
            self.ra_term(i, acc, z2, pool)?;
            pool.push(z2);
        }
        if let Some(zb) = self.zb {
            if let Some(&r) = ev.memo.get(&zb.0) {
                self.release(zb, r, &mut ev, pool);
            }
        }
        ev.memo.insert(self.c.reduce.0, accn);
        let root = self.k.root;
        let r = self.eval(root, &mut ev, pool)?;
        // Store.
        let ob = self.s_tile(2);
        self.a.mov(rax, qword_ptr(rsp + ob))?;
        let b = &self.bases[2];
        let disp = (b.per_m * i as i64 + 16 * j as i64) * b.elem;
        let disp = i32::try_from(disp).map_err(|_| NotHere("an output row too far".into()))?;
        let z = ZMM[r];
        match self.k.output.dtype {
            DType::U8 | DType::I8 => {
                let at = xmmword_ptr(rax + disp);
                if masked {
                    self.a.vpmovdb(at.k1(), z)?;
                } else {
                    self.a.vpmovdb(at, z)?;
                }
            }
            _ => {
                let at = zmmword_ptr(rax + disp);
                if masked {
                    self.a.vmovdqu32(at.k1(), z)?;
                } else {
                    self.a.vmovdqu32(at, z)?;
                }
            }
        }
        self.release(root, r, &mut ev, pool);
        // Whatever is still held (an accumulator the epilogue never read) goes back.
        for (_, r) in ev.memo.drain() {
            if !pool.contains(&r) {
                pool.push(r);
            }
        }
        if !pool.contains(&accn) {
            pool.push(accn);
        }
        Ok(())
    }

    /// Each base's pointer at the tile's first row (`S_MT`) into its tile slot.
    fn tile_pointers(&mut self) -> R<()> {
        for bi in 0..self.bases.len() {
            let b = self.bases[bi].clone();
            let sb = self.s_base(bi);
            self.a.mov(rax, qword_ptr(rsp + sb))?;
            if b.per_m != 0 {
                self.add_scaled(S_MT, b.per_m * b.elem)?;
            }
            let st = self.s_tile(bi);
            self.a.mov(qword_ptr(rsp + st), rax)?;
        }
        Ok(())
    }

    /// `rax += [rsp + slot] · scale` (`rcx` scratch).
    fn add_scaled(&mut self, slot: i32, scale: i64) -> R<()> {
        self.a.mov(rcx, qword_ptr(rsp + slot))?;
        self.imul(rcx, scale)?;
        self.a.add(rax, rcx)?;
        Ok(())
    }

    /// The top of the workgroup loop (its label, and the label of the next workgroup's
    /// step, made after it): workgroup `r14` divided by `count`, the quotient in `rax`,
    /// the remainder in `rdx`.
    fn workgroup_top(&mut self, count: u64) -> R<(CodeLabel, CodeLabel)> {
        let mut top = self.a.create_label();
        let next = self.a.create_label();
        self.a.set_label(&mut top)?;
        self.a.mov(rax, r14)?;
        self.a.xor(edx, edx)?;
        self.a.mov(rcx, count as i64)?;
        self.a.div(rcx)?;
        Ok((top, next))
    }

    /// Where `when` (a variant of the last group or block only): a jump, for the
    /// workgroups whose `[rsp + slot]` is below `limit`, to the label returned, which
    /// [`Self::land`] sets after the variant.
    fn variant_guard(&mut self, when: bool, slot: i32, limit: i32) -> R<Option<CodeLabel>> {
        if !when {
            return Ok(None);
        }
        let l = self.a.create_label();
        self.a.cmp(qword_ptr(rsp + slot), limit)?;
        self.a.jb(l)?;
        Ok(Some(l))
    }

    /// Sets the label of [`Self::variant_guard`], if it made one.
    fn land(&mut self, other: Option<CodeLabel>) -> R<()> {
        if let Some(mut l) = other {
            self.a.set_label(&mut l)?;
        }
        Ok(())
    }

    /// `K` as whole 64-byte chunks and the bytes of a last partial one, whose byte mask
    /// goes to `k3` (where there is one).
    fn k_chunks(&mut self, kk: u64) -> R<(u64, u64)> {
        let chunks = kk / 64;
        let part = kk % 64;
        if part != 0 {
            self.a.mov(rax, ((1u64 << part) - 1) as i64)?;
            self.a.kmovq(k3, rax)?;
        }
        Ok((chunks, part))
    }

    /// `rsi` at `B`'s source, `r10` at its packed copy, and `r11` at the table of `B`'s
    /// row offsets where it has one (whose label returns).
    fn pack_pointers(&mut self) -> R<Option<CodeLabel>> {
        self.a.mov(rsi, qword_ptr(rsp + S_BSRC))?;
        self.a.mov(r10, qword_ptr(rsp + S_BBUF))?;
        let table = self.b_table.clone().map(|t| {
            let words: Vec<u32> = t.iter().map(|&x| x as u32).collect();
            self.t.words(&mut self.a, &words)
        });
        if let Some(l) = table {
            self.a.lea(r11, qword_ptr(l))?;
        }
        Ok(table)
    }

    /// The head of the loop over the workgroup's blocks of columns: the first block's
    /// copy and the count of blocks, then the loop's label.
    fn blocks_top(&mut self) -> R<CodeLabel> {
        self.a.mov(rax, qword_ptr(rsp + S_PBP))?;
        self.a.mov(qword_ptr(rsp + S_BBUF), rax)?;
        self.a.mov(rax, qword_ptr(rsp + S_BCNT))?;
        self.a.mov(qword_ptr(rsp + S_BLEFT), rax)?;
        let mut block = self.a.create_label();
        self.a.set_label(&mut block)?;
        Ok(block)
    }

    /// The tail of the loop of [`Self::blocks_top`]: the next block (of [`Self::nb`]
    /// columns), its copy and the output's and the epilogue's columns, back to `block`
    /// while blocks are left.
    fn blocks_next(&mut self, block: CodeLabel) -> R<()> {
        let nb = self.nb();
        self.a.add(qword_ptr(rsp + S_BBUF), self.block_bytes())?;
        for bi in 2..self.bases.len() {
            let b = &self.bases[bi];
            if b.per_n != 0 {
                let st = self.s_tile(bi);
                let step = i32::try_from(nb as i64 * b.per_n * b.elem).map_err(|_| NotHere("a column step".into()))?;
                self.a.add(qword_ptr(rsp + st), step)?;
            }
        }
        self.a.dec(qword_ptr(rsp + S_BLEFT))?;
        self.a.jnz(block)?;
        Ok(())
    }

    /// `acc -= za · Σb'` (the column sums of the block at `r11`, vector `j`); returns the
    /// zero point and its register, for the caller to release.
    fn sub_column_sums(
        &mut self,
        acc: AsmRegisterZmm,
        j: usize,
        ev: &mut Eval,
        pool: &mut Vec<usize>,
    ) -> R<(ExprId, usize)> {
        let za = self.za.ok_or_else(|| NotHere("column sums without a zero point".into()))?;
        let z = self.eval(za, ev, pool)?;
        let t = take(pool)?;
        let at = self.cb_off() + 64 * j as i32;
        self.a.vpmulld(ZMM[t], ZMM[z], zmmword_ptr(r11 + at))?;
        self.a.vpsubd(acc, acc, ZMM[t])?;
        pool.push(t);
        Ok((za, z))
    }

    /// The operands of a binary op in the order it is emitted: a float clamp takes the
    /// constant first, so that a NaN of the other passes.
    fn clamp_order(&self, op: BinaryOp, f: bool, x: ExprId, y: ExprId) -> (ExprId, ExprId) {
        match op {
            BinaryOp::Max | BinaryOp::Min if f && matches!(self.k.node(x).expr, Expr::Const(_)) => (y, x),
            _ => (x, y),
        }
    }

    /// `zb + δ` in a fresh register.
    fn zb_delta(&mut self, ev: &mut Eval, pool: &mut Vec<usize>) -> R<usize> {
        let t = take(pool)?;
        match self.zb {
            Some(zb) => {
                let z = self.eval(zb, ev, pool)?;
                self.a.vmovdqa32(ZMM[t], ZMM[z])?;
            }
            None => self.a.vpxord(ZMM[t], ZMM[t], ZMM[t])?,
        }
        if self.delta != 0 {
            let l = self.t.scalar(&mut self.a, self.delta as u32);
            let u = take(pool)?;
            self.a.vpbroadcastd(ZMM[u], dword_ptr(l))?;
            self.a.vpaddd(ZMM[t], ZMM[t], ZMM[u])?;
            pool.push(u);
        }
        Ok(t)
    }

    /// `acc −= z2 · (row sum of A's row i)`.
    fn ra_term(&mut self, i: usize, acc: AsmRegisterZmm, z2: usize, pool: &mut Vec<usize>) -> R<()> {
        let t = take(pool)?;
        let at = self.s_rs() + 4 * i as i32;
        self.a.vpbroadcastd(ZMM[t], dword_ptr(rsp + at))?;
        self.a.vpmulld(ZMM[t], ZMM[t], ZMM[z2])?;
        self.a.vpsubd(acc, acc, ZMM[t])?;
        pool.push(t);
        Ok(())
    }

    /// One use of `e` (held in `r`) done: its register returns when none is left.
    fn release(&self, e: ExprId, r: usize, ev: &mut Eval, pool: &mut Vec<usize>) {
        let left = ev.left.entry(e.0).or_insert(0);
        *left = left.saturating_sub(1);
        if *left == 0 {
            ev.memo.remove(&e.0);
            if !pool.contains(&r) {
                pool.push(r);
            }
        }
    }

    /// Evaluates `e` for the accumulator of `ev` (16 lanes), into a register of `pool`
    /// (or the one it already holds).
    fn eval(&mut self, e: ExprId, ev: &mut Eval, pool: &mut Vec<usize>) -> R<usize> {
        if let Some(&r) = ev.memo.get(&e.0) {
            return Ok(r);
        }
        if !ev.precompute {
            if let Some(&h) = self.hoist_at.get(&e.0) {
                let r = take(pool)?;
                let at = self.s_h() + 4 * (h as i32 * MR as i32 + ev.i as i32);
                self.a.vpbroadcastd(ZMM[r], dword_ptr(rsp + at))?;
                ev.memo.insert(e.0, r);
                return Ok(r);
            }
        }
        let node = self.k.node(e).clone();
        let r = match node.expr {
            Expr::Const(bits) => {
                let l = self.t.scalar(&mut self.a, const_word(node.ty, bits));
                let r = take(pool)?;
                self.a.vpbroadcastd(ZMM[r], dword_ptr(l))?;
                r
            }
            Expr::Load { .. } => {
                let (el, vector, disp) = self.load_address(e, ev, 16)?;
                let r = take(pool)?;
                let z = ZMM[r];
                match (el.dtype, vector) {
                    (DType::U8 | DType::I8, false) => {
                        self.byte_to_ecx(el.dtype, disp)?;
                        self.a.vpbroadcastd(z, ecx)?;
                    }
                    (_, false) => self.a.vpbroadcastd(z, dword_ptr(rax + disp))?,
                    (DType::U8 | DType::I8, true) => {
                        let at = xmmword_ptr(rax + disp);
                        match (el.dtype == DType::U8, ev.masked) {
                            (true, true) => self.a.vpmovzxbd(z.k1().z(), at)?,
                            (true, false) => self.a.vpmovzxbd(z, at)?,
                            (false, true) => self.a.vpmovsxbd(z.k1().z(), at)?,
                            (false, false) => self.a.vpmovsxbd(z, at)?,
                        }
                    }
                    (_, true) => {
                        let at = zmmword_ptr(rax + disp);
                        if ev.masked {
                            self.a.vmovdqu32(z.k1().z(), at)?;
                        } else {
                            self.a.vmovdqu32(z, at)?;
                        }
                    }
                }
                r
            }
            Expr::Cast { value, to, .. } => self.cast_at(true, value, to, ev, pool)?,
            Expr::Unary(UnaryOp::IsNan, x) => {
                let v = self.eval(x, ev, pool)?;
                self.release(x, v, ev, pool);
                let r = take(pool)?;
                self.a.vcmpps(k5, ZMM[v], ZMM[v], 3)?;
                self.a.vpmovm2d(ZMM[r], k5)?;
                r
            }
            Expr::Select(c, x, y) => {
                if let Some(r) = self.select_on_mask(c, x, y, ev, pool)? {
                    ev.memo.insert(e.0, r);
                    return Ok(r);
                }
                let vc = self.eval(c, ev, pool)?;
                let vx = self.eval(x, ev, pool)?;
                let vy = self.eval(y, ev, pool)?;
                self.a.vpmovd2m(k5, ZMM[vc])?;
                self.release(c, vc, ev, pool);
                self.release(x, vx, ev, pool);
                self.release(y, vy, ev, pool);
                let r = take(pool)?;
                // r = c ? x : y
                self.a.vpblendmd(ZMM[r].k5(), ZMM[vy], ZMM[vx])?;
                r
            }
            Expr::Unary(op, x) => self.unary_at(true, op, x, ev, pool)?,
            Expr::Binary(op, x, y) if node.ty == ScalarType::Bool => {
                // Integer lanes compared (signed: see `check`), the mask as all-ones lanes.
                let pred = int_cmp(op).ok_or_else(|| NotHere("an epilogue comparison".into()))?;
                let vx = self.eval(x, ev, pool)?;
                let vy = self.eval(y, ev, pool)?;
                self.a.vpcmpd(k5, ZMM[vx], ZMM[vy], pred)?;
                self.release(x, vx, ev, pool);
                self.release(y, vy, ev, pool);
                let r = take(pool)?;
                self.a.vpmovm2d(ZMM[r], k5)?;
                r
            }
            Expr::Binary(op, x, y) => {
                let f = node.ty == ScalarType::F32;
                let (x, y) = self.clamp_order(op, f, x, y);
                // A lane-uniform 4-byte operand not in a register is read as an embedded
                // broadcast (`{1to16}`), commuting where that brings it second (not an f32
                // clamp: its NaN rule needs the value second).
                let commutes = matches!(op, BinaryOp::Add | BinaryOp::Mul)
                    || (!f && matches!(op, BinaryOp::Max | BinaryOp::Min | BinaryOp::And));
                let (x, y) = if commutes && self.bcst_at(x, ev).is_some() && self.bcst_at(y, ev).is_none() {
                    (y, x)
                } else {
                    (x, y)
                };
                let fclamp = f && matches!(op, BinaryOp::Max | BinaryOp::Min);
                if let Some(at) = self.bcst_at(y, ev).filter(|_| !fclamp && x != y) {
                    let vx = self.eval(x, ev, pool)?;
                    self.release(x, vx, ev, pool);
                    let r = take(pool)?;
                    let m = self.bcst_operand(y, at, ev)?;
                    let (d, a) = (ZMM[r], ZMM[vx]);
                    match (f, op) {
                        (true, BinaryOp::Add) => self.a.vaddps(d, a, m)?,
                        (true, BinaryOp::Sub) => self.a.vsubps(d, a, m)?,
                        (true, BinaryOp::Mul) => self.a.vmulps(d, a, m)?,
                        (true, BinaryOp::Div) => self.a.vdivps(d, a, m)?,
                        (false, BinaryOp::Add) => self.a.vpaddd(d, a, m)?,
                        (false, BinaryOp::Sub) => self.a.vpsubd(d, a, m)?,
                        (false, BinaryOp::Mul) => self.a.vpmulld(d, a, m)?,
                        (false, BinaryOp::Max) => self.a.vpmaxsd(d, a, m)?,
                        (false, BinaryOp::Min) => self.a.vpminsd(d, a, m)?,
                        (false, BinaryOp::And) => self.a.vpandd(d, a, m)?,
                        _ => return no("an epilogue operation without a 16-lane form"),
                    }
                    ev.memo.insert(e.0, r);
                    return Ok(r);
                }
                let vx = self.eval(x, ev, pool)?;
                let vy = self.eval(y, ev, pool)?;
                self.release(x, vx, ev, pool);
                self.release(y, vy, ev, pool);
                let r = take(pool)?;
                binary_regs(&mut self.a, true, f, op, r, vx, vy)?;
                r
            }
            _ => return no("an epilogue node without a 16-lane form"),
        };
        ev.memo.insert(e.0, r);
        Ok(r)
    }

    /// An epilogue load `e` in the slot of `ev`: its base's pointer (tile or base slot)
    /// into `rax`, and the load, whether it varies along the lanes (else one element
    /// broadcast), and its byte displacement from `rax` (`lanes` columns a vector).
    fn load_address(&mut self, e: ExprId, ev: &Eval, lanes: i64) -> R<(ELoad, bool, i32)> {
        let el = self.eloads[&e.0];
        let b = &self.bases[el.base];
        let (per_m, per_n, elem) = (b.per_m, b.per_n, b.elem);
        let st = if ev.from_base { self.s_base(el.base) } else { self.s_tile(el.base) };
        self.a.mov(rax, qword_ptr(rsp + st))?;
        let disp = if ev.rows_lanes { 0 } else { (per_m * ev.i as i64 + lanes * per_n * ev.j as i64) * elem };
        let disp = i32::try_from(disp).map_err(|_| NotHere("an epilogue operand too far".into()))?;
        let vector = if ev.rows_lanes { per_m != 0 } else { per_n != 0 };
        Ok((el, vector, disp))
    }

    /// One 8-bit element at `rax + disp`, zero- (u8) or sign-extended into `ecx`.
    fn byte_to_ecx(&mut self, dtype: DType, disp: i32) -> R<()> {
        if dtype == DType::U8 {
            self.a.movzx(ecx, byte_ptr(rax + disp))?;
        } else {
            self.a.movsx(ecx, byte_ptr(rax + disp))?;
        }
        Ok(())
    }

    /// A conversion of `value` to `to` on 16 lanes (`wide`) or 8.
    fn cast_at(&mut self, wide: bool, value: ExprId, to: DType, ev: &mut Eval, pool: &mut Vec<usize>) -> R<usize> {
        let from = self.k.node(value).ty;
        let v = if wide { self.eval(value, ev, pool)? } else { self.eval_ymm(value, ev, pool)? };
        Ok(match (from == ScalarType::F32, to) {
            // No change of lanes: the value's register, copied where it is read again.
            (false, DType::I32) | (true, DType::F32) => self.reuse(wide, value, v, ev, pool)?,
            (false, _) => {
                // Integer → f32.
                self.release(value, v, ev, pool);
                let r = take(pool)?;
                if wide {
                    self.a.vcvtdq2ps(ZMM[r], ZMM[v])?;
                } else {
                    self.a.vcvtdq2ps(YMM[r], YMM[v])?;
                }
                r
            }
            (true, _) => {
                // f32 → u8/i8 as the interpreter converts: truncated (saturating to i64,
                // NaN to 0), then wrapped to eight bits (`super::vops`).
                let ty = if to == DType::U8 { ScalarType::U8 } else { ScalarType::I8 };
                if f32_below(self.k, value).is_some_and(|b| b < TWO_63) {
                    // Never 2⁶³ or more (a clamp with a constant bound: a saturated
                    // quantized result): `vcvttps2dq` and the wrap are the whole
                    // conversion (NaN and |x| ≥ 2³¹ give 0x8000_0000, which wraps to 0, as
                    // the interpreter's i64 does).
                    self.release(value, v, ev, pool);
                    let r = take(pool)?;
                    if wide {
                        self.a.vcvttps2dq(ZMM[r], ZMM[v])?;
                    } else {
                        self.a.vcvttps2dq(YMM[r], YMM[v])?;
                    }
                    let mut vx = Vx { a: &mut self.a, t: &mut self.t, wide, held: &[] };
                    vx.wrap8(ty, V(r as u8), V(r as u8))?;
                    return Ok(r);
                }
                let t = take(pool)?;
                self.release(value, v, ev, pool);
                let r = take(pool)?;
                // The lane mask: an opmask register (16 lanes) or the scratch register.
                let mask = if wide { Mask(4) } else { Mask(t as u8) };
                let mut vx = Vx { a: &mut self.a, t: &mut self.t, wide, held: &[] };
                vx.f32_to_8bit(ty, V(r as u8), V(v as u8), V(t as u8), mask)?;
                pool.push(t);
                r
            }
        })
    }

    /// A unary node of f32 `x` on 16 lanes (`wide`) or 8: exp, erf, tanh, log, sqrt,
    /// neg, abs as the general path's inline code (`super::math`), or a rounding
    /// (`vrndscaleps`/`vroundps`; the same immediates: the mode, exceptions suppressed).
    fn unary_at(&mut self, wide: bool, op: UnaryOp, x: ExprId, ev: &mut Eval, pool: &mut Vec<usize>) -> R<usize> {
        let v = if wide { self.eval(x, ev, pool)? } else { self.eval_ymm(x, ev, pool)? };
        if math::has_vector_form(op) {
            let n = math::vector_scratch(op);
            let mut t = Vec::with_capacity(n);
            for _ in 0..n {
                t.push(V(take(pool)? as u8));
            }
            self.release(x, v, ev, pool);
            let r = take(pool)?;
            let mut vx = Vx { a: &mut self.a, t: &mut self.t, wide, held: &[] };
            vx.unary(op, V(r as u8), V(v as u8), &t)?;
            pool.extend(t.iter().map(|v| v.0 as usize));
            return Ok(r);
        }
        self.release(x, v, ev, pool);
        let r = take(pool)?;
        let imm = match op {
            UnaryOp::Round => 8,
            UnaryOp::Floor => 9,
            UnaryOp::Ceil => 10,
            _ => 11,
        };
        if wide {
            self.a.vrndscaleps(ZMM[r], ZMM[v], imm)?;
        } else {
            self.a.vroundps(YMM[r], YMM[v], imm)?;
        }
        Ok(r)
    }

    /// `c ? x : y` with the comparison `c` (its only use) written straight into the
    /// blend's opmask, not into lanes of all ones first and back (two instructions fewer:
    /// the sign test of the fixed-point requantisation, a QuantizeLinear's NaN test).
    /// Only where `c` is `isnan(u)` or an integer comparison against an operand read as a
    /// broadcast, so that no more registers are live than for the lanes form; `None`
    /// (nothing emitted) otherwise.
    fn select_on_mask(
        &mut self,
        c: ExprId,
        x: ExprId,
        y: ExprId,
        ev: &mut Eval,
        pool: &mut Vec<usize>,
    ) -> R<Option<usize>> {
        let once = self.uses.get(&c.0) == Some(&1);
        if !once || ev.memo.contains_key(&c.0) || self.hoist_at.contains_key(&c.0) {
            return Ok(None);
        }
        let cmp = match self.k.node(c).expr {
            Expr::Unary(UnaryOp::IsNan, u) if self.k.node(u).ty == ScalarType::F32 => (u, None),
            Expr::Binary(op, p, q) if p != q && self.k.node(p).ty != ScalarType::F32 => {
                match int_cmp(op).filter(|_| self.bcst_at(q, ev).is_some()) {
                    Some(pred) => (p, Some((q, pred))),
                    None => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        // The values first, then the comparison (its broadcast may set `rax`), so that
        // nothing evaluated after it can touch `k5`.
        // (`x` read as a broadcast by the blend itself where it can be.)
        let vx = if x != y && self.bcst_at(x, ev).is_some() { None } else { Some(self.eval(x, ev, pool)?) };
        let vy = self.eval(y, ev, pool)?;
        let (p, q) = cmp;
        let vp = self.eval(p, ev, pool)?;
        match q {
            None => self.a.vcmpps(k5, ZMM[vp], ZMM[vp], 3)?,
            Some((q, pred)) => {
                let Some(at) = self.bcst_at(q, ev) else {
                    // Evaluated into a register meanwhile (an operand of `x` or `y` too).
                    let vq = self.eval(q, ev, pool)?;
                    self.a.vpcmpd(k5, ZMM[vp], ZMM[vq], pred)?;
                    self.release(q, vq, ev, pool);
                    return self.blend_on_k5((c, p, vp), (x, vx), (y, vy), ev, pool).map(Some);
                };
                let m = self.bcst_operand(q, at, ev)?;
                self.a.vpcmpd(k5, ZMM[vp], m, pred)?;
            }
        }
        self.blend_on_k5((c, p, vp), (x, vx), (y, vy), ev, pool).map(Some)
    }

    /// The end of [`Self::select_on_mask`]: `k5` holds the comparison `c` of `p` (in
    /// `vp`); `c ? x : y` blended into a register, `x` from its register or (`None`) as
    /// a broadcast.
    fn blend_on_k5(
        &mut self,
        (c, p, vp): (ExprId, ExprId, usize),
        (x, vx): (ExprId, Option<usize>),
        (y, vy): (ExprId, usize),
        ev: &mut Eval,
        pool: &mut Vec<usize>,
    ) -> R<usize> {
        self.release(p, vp, ev, pool);
        ev.left.insert(c.0, 0);
        // `x` as a broadcast (Ok), or in a register (Err; also where it was evaluated
        // meanwhile, as an operand of `y` or of the comparison).
        let src = match vx.map_or_else(|| self.bcst_at(x, ev).ok_or(None), |v| Err(Some(v))) {
            Ok(at) => Ok(self.bcst_operand(x, at, ev)?),
            Err(v) => {
                let vx = match v {
                    Some(v) => v,
                    None => self.eval(x, ev, pool)?,
                };
                self.release(x, vx, ev, pool);
                Err(vx)
            }
        };
        self.release(y, vy, ev, pool);
        let r = take(pool)?;
        // r = c ? x : y
        match src {
            Ok(m) => self.a.vpblendmd(ZMM[r].k5(), ZMM[vy], m)?,
            Err(vx) => self.a.vpblendmd(ZMM[r].k5(), ZMM[vy], ZMM[vx])?,
        }
        Ok(r)
    }

    /// The broadcast operand of `e` where [`Self::bcst_at`] found it, one of its uses
    /// counted off; a tile's row first loads its pointer from the stack into `rax`.
    fn bcst_operand(&mut self, e: ExprId, at: Bcst, ev: &mut Eval) -> R<AsmMemoryOperand> {
        let left = ev.left.entry(e.0).or_insert(0);
        *left = left.saturating_sub(1);
        Ok(match at {
            Bcst::Label(l) => dword_bcst(l),
            Bcst::Stack(off) => dword_bcst(rsp + off),
            Bcst::Tile(st, disp) => {
                self.a.mov(rax, qword_ptr(rsp + st))?;
                dword_bcst(rax + disp)
            }
        })
    }

    /// Where `e` can be read as a 4-byte broadcast instead of evaluated into a register:
    /// a 32-bit constant, a hoisted value on the stack, or a per-tensor or per-row load
    /// of f32 or i32 (not when it is in a register already).
    fn bcst_at(&mut self, e: ExprId, ev: &Eval) -> Option<Bcst> {
        if ev.memo.contains_key(&e.0) {
            return None;
        }
        if !ev.precompute {
            if let Some(&h) = self.hoist_at.get(&e.0) {
                return Some(Bcst::Stack(self.s_h() + 4 * (h as i32 * MR as i32 + ev.i as i32)));
            }
        }
        let node = self.k.node(e).clone();
        match node.expr {
            Expr::Const(bits) if matches!(node.ty, ScalarType::F32 | ScalarType::I32) => {
                Some(Bcst::Label(self.t.scalar(&mut self.a, bits as u32)))
            }
            Expr::Load { .. } => {
                let el = *self.eloads.get(&e.0)?;
                let b = &self.bases[el.base];
                let across = if ev.rows_lanes { b.per_m } else { b.per_n };
                if across != 0 || !matches!(el.dtype, DType::F32 | DType::I32) {
                    return None;
                }
                let st = if ev.from_base { self.s_base(el.base) } else { self.s_tile(el.base) };
                let disp = if ev.rows_lanes { 0 } else { i32::try_from(b.per_m * ev.i as i64 * b.elem).ok()? };
                Some(Bcst::Tile(st, disp))
            }
            _ => None,
        }
    }

    /// The register of `value` (held in `v`) for a node of the same lanes: `v` itself
    /// where this is its last use, else a copy.
    fn reuse(&mut self, wide: bool, value: ExprId, v: usize, ev: &mut Eval, pool: &mut Vec<usize>) -> R<usize> {
        let left = ev.left.get(&value.0).copied().unwrap_or(0);
        if left <= 1 {
            ev.left.insert(value.0, 0);
            ev.memo.remove(&value.0);
            Ok(v)
        } else {
            ev.left.insert(value.0, left - 1);
            let r = take(pool)?;
            if wide {
                self.a.vmovdqa32(ZMM[r], ZMM[v])?;
            } else {
                self.a.vmovdqa(YMM[r], YMM[v])?;
            }
            Ok(r)
        }
    }
}

/// A broadcast operand: a table word, a stack slot, or a tile pointer (its stack slot)
/// and a displacement.
#[derive(Clone, Copy)]
enum Bcst {
    Label(CodeLabel),
    Stack(i32),
    Tile(i32, i32),
}

/// Per accumulator: values computed, uses left, where it is.
struct Eval {
    memo: HashMap<u32, usize>,
    left: HashMap<u32, u32>,
    i: usize,
    j: usize,
    masked: bool,
    /// Computing the hoisted values (else they are read from the stack).
    precompute: bool,
    /// Loads from the workgroup's base pointers (before a tile's are set: per-tensor
    /// values only).
    from_base: bool,
    /// Lanes are 16 rows of one column ([`Emitter::function_gemv`]).
    rows_lanes: bool,
}

impl Eval {
    fn new(left: HashMap<u32, u32>, i: usize, j: usize, masked: bool) -> Eval {
        Eval { memo: HashMap::new(), left, i, j, masked, precompute: false, from_base: false, rows_lanes: false }
    }
}

fn take(pool: &mut Vec<usize>) -> R<usize> {
    pool.pop().ok_or_else(|| NotHere("epilogue needs more registers".into()))
}

/// `d = x op y`, the epilogue's two-operand arithmetic on registers, 16 lanes (`wide`,
/// `zmm`) or 8 (`ymm`), of f32 (`f`) or i32: the one table of both widths' instructions.
fn binary_regs(a: &mut CodeAssembler, wide: bool, f: bool, op: BinaryOp, d: usize, x: usize, y: usize) -> R<()> {
    /// `a.$ins(d, $p, $q)` in the width of the kernel.
    macro_rules! w {
        ($ins:ident, $p:expr, $q:expr) => {
            if wide {
                a.$ins(ZMM[d], ZMM[$p], ZMM[$q])?
            } else {
                a.$ins(YMM[d], YMM[$p], YMM[$q])?
            }
        };
    }
    match (f, op) {
        (true, BinaryOp::Add) => w!(vaddps, x, y),
        (true, BinaryOp::Sub) => w!(vsubps, x, y),
        (true, BinaryOp::Mul) => w!(vmulps, x, y),
        (true, BinaryOp::Div) => w!(vdivps, x, y),
        // vmaxps/vminps return the second operand where either is NaN.
        (true, BinaryOp::Max) => w!(vmaxps, y, x),
        (true, BinaryOp::Min) => w!(vminps, y, x),
        (false, BinaryOp::Add) => w!(vpaddd, x, y),
        (false, BinaryOp::Sub) => w!(vpsubd, x, y),
        (false, BinaryOp::Mul) => w!(vpmulld, x, y),
        (false, BinaryOp::Max) => w!(vpmaxsd, x, y),
        (false, BinaryOp::Min) => w!(vpminsd, x, y),
        // AVX-512 F has no `vpand` (only the element-sized forms).
        (false, BinaryOp::And) if wide => a.vpandd(ZMM[d], ZMM[x], ZMM[y])?,
        (false, BinaryOp::And) => a.vpand(YMM[d], YMM[x], YMM[y])?,
        _ if wide => return no("an epilogue operation without a 16-lane form"),
        _ => return no("an epilogue operation without an 8-lane form"),
    }
    Ok(())
}

const XMMS: [AsmRegisterXmm; 4] = [xmm0, xmm1, xmm2, xmm3];
const YMMS: [AsmRegisterYmm; 4] = [ymm0, ymm1, ymm2, ymm3];

/// The `vpcmpd` predicate of an integer comparison.
fn int_cmp(op: BinaryOp) -> Option<i32> {
    Some(match op {
        BinaryOp::Eq => 0,
        BinaryOp::Lt => 1,
        BinaryOp::Le => 2,
        BinaryOp::Ne => 4,
        BinaryOp::Ge => 5,
        BinaryOp::Gt => 6,
        _ => return None,
    })
}

/// 2⁶³ as an f32: the least value whose conversion to an 8-bit integer `vcvttps2dq` and
/// a wrap do not give (the interpreter saturates it to i64::MAX, low byte 0xFF).
const TWO_63: f32 = 9.223372e18;

/// A bound `b` with every non-NaN value of f32 node `e` at most `b` (NaN converts to 0
/// whichever way, so it needs none): a constant; `min` with a constant (a clamp), which
/// gives the constant, the other operand's NaN, or at most the constant; `max` or `min`
/// of two bounded operands, which gives one of them (whatever the NaN rule).
fn f32_below(k: &Kernel, e: ExprId) -> Option<f32> {
    let n = k.node(e);
    if n.ty != ScalarType::F32 {
        return None;
    }
    let konst = |x: ExprId| match k.node(x).expr {
        Expr::Const(bits) => Some(f32::from_bits(bits as u32)).filter(|c| !c.is_nan()),
        _ => None,
    };
    match n.expr {
        Expr::Const(_) => konst(e),
        Expr::Binary(BinaryOp::Min, x, y) if konst(x).or(konst(y)).is_some() => match (konst(x), konst(y)) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        },
        Expr::Binary(BinaryOp::Min | BinaryOp::Max, x, y) => Some(f32_below(k, x)?.max(f32_below(k, y)?)),
        _ => None,
    }
}

/// A constant's 32-bit lane: integers as i32 lanes (the narrow signed types'
/// bits sign-extended, the unsigned ones' zero-extended), f32 as its bits.
fn const_word(ty: ScalarType, bits: u64) -> u32 {
    match ty {
        ScalarType::I8 => bits as u8 as i8 as i32 as u32,
        ScalarType::I16 => bits as u16 as i16 as i32 as u32,
        ScalarType::U8 => bits as u8 as u32,
        ScalarType::U16 => bits as u16 as u32,
        _ => bits as u32,
    }
}

/// Integers held as i32 lanes.
fn is_int32(t: ScalarType) -> bool {
    matches!(t, ScalarType::I8 | ScalarType::U8 | ScalarType::I16 | ScalarType::U16 | ScalarType::I32)
}

/// Columns of a block: 32 (two `zmm` vectors), or 16 in the AVX2 form (two `ymm`).
fn nb_of(ymm: bool) -> u64 {
    if ymm {
        avx2::NB
    } else {
        NB
    }
}

/// Bytes of an output element this emitter stores.
fn out_elem(d: DType) -> Option<i64> {
    match d {
        DType::F32 | DType::I32 => Some(4),
        DType::U8 | DType::I8 => Some(1),
        _ => None,
    }
}
