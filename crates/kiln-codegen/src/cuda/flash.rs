//! Attention on the tensor cores ([`KernelClass::Attention`](kiln_flow::class::KernelClass);
//! the default where Q, K or V is stored half, `KILN_CUDA_TUNE=attn=flash` otherwise):
//! a block per (head, tile of 64 query rows), K and V staged in shared memory 64 keys
//! at a time, both products on `mma.sync.aligned.m16n8k16` with f16 or bf16 operands
//! and f32 accumulators, an online softmax in registers; the score matrix never
//! leaves registers.
//!
//! # The rows
//!
//! The kernel's form is [`kiln_flow::attention`]'s (see [`super::attention`]). Its
//! outer output variables are split into the *queries* (those that neither K nor V
//! reads, wherever they are: a grouped-query head's group is a query variable too) and
//! the *head* (the others): every query of one head reads the same keys and values. A
//! block of 4 warps takes 64 consecutive queries of one head (the grid is `heads ×
//! ⌈queries / 64⌉`), warp `w` its rows `16w ..16w + 16`, lane `l` (`g = l / 4`, `t = l
//! % 4`) the rows `g` and `g + 8` of its warp's 16 as the `mma` fragments place them
//! ([`super::mma::a_elem`], [`super::mma::c_elem`]; the `ldmatrix` lanes as
//! [`super::mma::ldm_lane`] addresses them). Queries past the head's last are computed
//! on its last row and not stored.
//!
//! # The loop over keys
//!
//! Each lane holds its warp's Q rows as `mma` A fragments (`D/16` of them, loaded once,
//! before the loop). For each tile of 64 keys:
//! 1. `bar.sync`; the block copies the tile's K (64 keys × `D`) and V (64 keys × `W`)
//!    into shared memory as the `mma` type, and `bar.sync`. Each operand's tile is
//!    stored as rows along its contiguous variable (the formation gives K unit stride
//!    along the keys and V along the columns, `Attention::in_place`: K as `D` rows of
//!    64 keys, V as 64 rows of `W` columns; the other orientations are written for any
//!    other layout), rows padded by 16 bytes so that the 8 rows of an `ldmatrix`
//!    matrix fall in 8 distinct 16-byte bank groups; 16 bytes per thread and load
//!    (`ld.global.v4.f32`, 4 f32; `ld.global.v4.b32`, 8 halves) where the run is
//!    aligned to them and, along the keys, the keys a multiple of them (halves: 8
//!    bytes, `.v2.b32`, where only those are), one at a time otherwise; keys past the
//!    last are zeros. Where the registers allow (`D + W ≤ 128`: 64 f32 or 32 words of
//!    halves a thread), the next tile's
//!    loads are issued right after this tile's stores, before its products, so that
//!    global memory's latency hides behind the tensor cores' work.
//! 2. `S = Q·Kᵀ`: per `k16` of the depth and 16 keys one `ldmatrix.x4` of K (the
//!    B fragments of two 8-key blocks; `.trans` from rows of the depth) and two `mma`:
//!    32 f32 scores a lane (its two rows × 16 keys).
//! 3. `S = s·S + s_m·mask` (the mask loaded per score, at its affine offset: any
//!    broadcast, causal masks included), keys past the last `−∞`.
//! 4. The online softmax per row: the tile's maximum (the lane's 16, then
//!    `shfl.sync.bfly` 1 and 2 over the row's quad), `m' = max(m, max)`, the factor
//!    `c = exp(m − m')` of the running sum `l` and the output accumulators, `p =
//!    exp(S − m')` (`ex2.approx` of `x·log₂e`; `m'` taken as 0 while every score so far
//!    is `−∞`, so that `p = 0`, `c = 0`). `l` is the lane's partial sum (its 16 keys),
//!    the quad's sum taken once at the end.
//! 5. `O = c·O + P·V`: the `p` rounded to the `mma` type and packed in registers are the A
//!    fragments of the second product as they stand (the accumulator layout of 8 keys
//!    × 2 blocks is the A layout of 16 keys); V's B fragments by `ldmatrix.x4.trans`.
//!
//! The result `O / l` (quad-summed `l`; NaN where every key of a row is masked, 0
//! under the form's `nan_to_zero`) is stored as pairs of columns (`st.global.v2.f32`;
//! a half result rounded once, to nearest even, and the pair stored as one word).
//!
//! # Precision
//!
//! The code generator knows the precision from the kernel's types. On CUDA the
//! storage-precision pass narrows an attention kernel's operands and result like any
//! other buffer (`kiln_flow::precision::narrow_storage_for`), so under `--precision
//! f16|bf16` Q, K, V (and the mask, where it fits the type) are stored half and the
//! result is half, as the three kernels the form replaces store theirs. The `mma`
//! operand type is bf16 where Q, K or V is stored bf16, else f16. A half operand of
//! that type is copied as it is (no conversion: the product reads what the producer
//! stored); an f32 operand (a buffer the pass kept f32, or any operand at f32
//! precision under `attn=flash`) is rounded to it once, a half of the other type
//! widened and rounded. The probabilities `p` are rounded to the `mma` type, the mask
//! widened to f32; products are exact and accumulate in f32, and a half result is
//! rounded once. Where Q, K, V are exact in the `mma` type, the result is within
//! `u·max|V|` (`u` = 2⁻¹¹ for f16, 2⁻⁹ for bf16: the rounding of `p`) plus f32
//! reassociation of the interpreter's, before the result's own rounding. At f32
//! precision the default keeps three kernels (the compiler does not form the kernel).

//! # Declined (to the warp-per-row kernel, [`super::attention`])
//!
//! A depth or width (V's columns) not a multiple of 16 or above [`MAX_HEAD`]; a
//! negative coefficient of an operand's key, depth or column (the tile's addresses are
//! immediates).

use kiln_flow::attention::{Attention, Operand};
use kiln_flow::Kernel;
use kiln_ir::DType;

use super::contraction::u32_op;
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::rows::shfl_bfly;
use super::{declare_shared, decompose, dynamic_bytes, internal, Entry, Launch};
use crate::CodegenError;

/// Query rows of a block (4 warps of 16).
pub const ROWS: u32 = 64;

/// Keys of a tile.
pub const KEYS: u32 = 64;

/// Threads of a block.
pub const THREADS: u32 = 128;

/// The widest head (depth or columns) the kernel takes.
pub const MAX_HEAD: u64 = 128;

fn f32imm(x: f32) -> Opd {
    Imm::F32(x.to_bits()).into()
}

fn gcd(a: u32, b: u32) -> u32 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The `cvt` name of a half type (`None`: f32).
fn half_name(d: DType) -> Option<&'static str> {
    match d {
        DType::F16 => Some("f16"),
        DType::BF16 => Some("bf16"),
        _ => None,
    }
}

/// How an operand is stored, against the `mma` operand type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Elt {
    /// f32: loaded and rounded to the `mma` type.
    F32,
    /// The `mma` type itself (f16 or bf16): loaded as it is.
    Raw,
    /// The other half type (its `cvt` name): widened exactly, then rounded.
    Other(&'static str),
}

impl Elt {
    fn of(d: DType, mt: &'static str) -> Elt {
        match d {
            DType::F16 if mt == "f16" => Elt::Raw,
            DType::BF16 if mt == "bf16" => Elt::Raw,
            DType::F16 => Elt::Other("f16"),
            DType::BF16 => Elt::Other("bf16"),
            _ => Elt::F32,
        }
    }

    /// Bytes an element.
    fn size(self) -> i64 {
        if self == Elt::F32 {
            4
        } else {
            2
        }
    }
}

/// How the block copies one operand's tile (64 keys × `n` of its other variable, the
/// depth of K or the columns of V) into shared memory: rows of keys (each holding its
/// `n` elements) where the operand is contiguous along the other variable or along
/// neither, rows of the other variable (each holding the tile's 64 keys) where it is
/// contiguous along the keys. Rows are padded by 16 bytes.
struct Stage {
    /// Rows are keys (else the other variable).
    key_rows: bool,
    /// Rows of the tile.
    rows: u32,
    /// How the operand is stored.
    elt: Elt,
    /// Elements per load along a row: 4 f32 (`ld.global.v4.f32`), 8 or 4 halves
    /// (`ld.global.v4.b32`, `.v2.b32`), or 1.
    vw: u32,
    /// Threads along a row (`C`, dividing both the row's vectors and 16).
    c: u32,
    /// Passes over the rows (each `THREADS / C` rows).
    passes: u32,
    /// Runs of `C` vectors a row.
    runs: u32,
    /// Global coefficients (elements) of a row and of an element along it.
    coef: (i64, i64),
    /// Global coefficient of the key.
    key_coef: i64,
    /// Shared bytes a row.
    stride: u32,
}

impl Stage {
    fn of(a: &Attention, o: &Operand, elt: Elt, other: u32, n: u32) -> Stage {
        let (kc, oc) = (o.offset.of(a.key), o.offset.of(other));
        // 16 bytes a load: 4 f32 or 8 halves of the `mma` type (a half of the other
        // type is converted one at a time).
        // (8 bytes, 4 halves, where 16 are not aligned.)
        let widths: &[u32] = match elt {
            Elt::F32 => &[4],
            Elt::Raw => &[8, 4],
            Elt::Other(_) => &[],
        };
        let aligned = |run: u32, v: u32| {
            let v = i64::from(v);
            o.offset.c % v == 0 && o.offset.coef.iter().enumerate().all(|(x, &c)| x as u32 == run || c % v == 0)
        };
        let widest = |run: u32, len: u64| {
            widths.iter().copied().find(|&v| aligned(run, v) && len % u64::from(v) == 0).unwrap_or(1)
        };
        let (key_rows, vw) = if oc == 1 {
            (true, widest(other, u64::from(n)))
        } else if kc == 1 {
            (false, widest(a.key, a.keys))
        } else {
            (true, 1)
        };
        let (rows, len, coef) = if key_rows { (KEYS, n, (kc, oc)) } else { (n, KEYS, (oc, kc)) };
        let c = gcd(len / vw, 16);
        let per_pass = THREADS / c;
        Stage {
            key_rows,
            rows,
            elt,
            vw,
            c,
            passes: rows / per_pass,
            runs: len / vw / c,
            coef,
            key_coef: kc,
            stride: 2 * len + 16,
        }
    }

    /// Shared bytes of the tile.
    fn bytes(&self) -> u32 {
        self.rows * self.stride
    }

    /// The thread's first row of the tile and its first element along the row.
    fn start(&self, p: &mut Ptx, tid: Reg) -> (Reg, Reg) {
        let r0 = u32_op(p, "shr.u32", tid, Imm::U(u64::from(self.c.trailing_zeros())).into());
        let cv = u32_op(p, "and.b32", tid, Imm::U(u64::from(self.c - 1)).into());
        let e0 = u32_op(p, "mul.lo.u32", cv, Imm::U(u64::from(self.vw)).into());
        (r0, e0)
    }

    /// Whether `ldmatrix` reads it transposed: its rows are the `k` of the `mma` it
    /// feeds (K's depth, V's keys).
    fn trans(&self, is_v: bool) -> bool {
        self.key_rows == is_v
    }

    fn note(&self) -> String {
        let rows = if self.key_rows { "key rows" } else { "rows along the keys" };
        let loads = match self.vw as i64 * self.elt.size() {
            16 => "v4 loads",
            8 => "v2 loads",
            _ => "scalar loads",
        };
        format!("{rows}, {loads}")
    }

    /// What the copy does to an element.
    fn conversion(&self) -> &'static str {
        match self.elt {
            Elt::F32 => "f32 rounded",
            Elt::Raw => "halves as stored",
            Elt::Other(_) => "halves converted",
        }
    }
}

/// Why the tensor-core kernel declines `k` (form `a`), or `None` where it takes it:
/// what [`emit`] checks before it writes anything, asked also by the compiler when it
/// forms attention by default (a chain this kernel declines keeps its three kernels
/// rather than run on the slower warp-per-row kernel).
pub fn declines(k: &Kernel, a: &Attention) -> Option<String> {
    let (depth, keys, width) = head(k, a);
    let fits = |n: u64| n > 0 && n % 16 == 0 && n <= MAX_HEAD;
    if !fits(depth) || !fits(width) {
        return Some(format!("a head of depth {depth} and width {width} (multiples of 16 up to {MAX_HEAD})"));
    }
    if keys == 0 || keys > u64::from(u32::MAX / 2) {
        return Some(format!("{keys} keys"));
    }
    let nonneg = [
        a.q.offset.of(a.depth),
        a.k.offset.of(a.depth),
        a.k.offset.of(a.key),
        a.v.offset.of(a.key),
        a.v.offset.of(a.column),
        a.mask.as_ref().map_or(0, |(m, _)| m.offset.of(a.key)),
    ];
    if nonneg.iter().any(|&c| c < 0) {
        return Some("a negative stride along the keys, depth or columns".into());
    }
    let (_, _, queries, heads) = grid_axes(k, a);
    let grid = heads * queries.div_ceil(u64::from(ROWS));
    if grid == 0 || grid > u64::from(i32::MAX as u32) || queries > u64::from(u32::MAX / 2) {
        return Some(format!("{heads} heads of {queries} queries"));
    }
    None
}

/// A head's depth, keys and width (V's columns).
fn head(k: &Kernel, a: &Attention) -> (u64, u64, u64) {
    let var = |v: u32| k.vars.get(v as usize).copied().unwrap_or(0);
    (var(a.depth), var(a.key), var(a.column))
}

/// The query variables (the outer ones that neither K nor V reads), the head variables
/// (the other outer ones), and their extents' products.
fn grid_axes(k: &Kernel, a: &Attention) -> (Vec<usize>, Vec<usize>, u64, u64) {
    let dims = k.output.shape.dims();
    let (qv, hv): (Vec<usize>, Vec<usize>) =
        (0..dims.len().saturating_sub(1)).partition(|&v| a.k.offset.of(v as u32) == 0 && a.v.offset.of(v as u32) == 0);
    let queries: u64 = qv.iter().map(|&v| dims[v] as u64).product();
    let heads: u64 = hv.iter().map(|&v| dims[v] as u64).product();
    (qv, hv, queries, heads)
}

/// The tensor-core attention entry of `k` (form `a`), or why it declines.
pub fn emit(k: &Kernel, a: &Attention) -> Result<Result<Entry, String>, CodegenError> {
    if let Some(why) = declines(k, a) {
        return Ok(Err(why));
    }
    let (depth, keys, width) = head(k, a);
    let dims = k.output.shape.dims().to_vec();
    let rank = dims.len();
    let (qv, hv, queries, heads) = grid_axes(k, a);
    let extent = |vs: &[usize]| -> Vec<usize> { vs.iter().map(|&v| dims[v]).collect() };
    let tiles = queries.div_ceil(u64::from(ROWS));
    let grid = heads * tiles;
    let (d, w) = (depth as u32, width as u32);
    // The `mma` operand type: bf16 where Q, K or V is stored bf16 (`--precision bf16`),
    // else f16 (f16 storage, or f32 operands rounded).
    let dt = |o: &Operand| Attention::dtype(k, o);
    let mt: &'static str = if [&a.q, &a.k, &a.v].into_iter().any(|o| dt(o) == DType::BF16) { "bf16" } else { "f16" };
    let out_half = half_name(k.output.dtype);
    let size = |input: u32| k.inputs.get(input as usize).map_or(4, |t| t.dtype.storage_bytes(1) as i64);

    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    p.directive(&format!(".maxntid {THREADS}, 1, 1"));
    // Three blocks a multiprocessor (registers up to 168): without it ptxas holds the
    // half-operand kernel of bert_tiny's heads to 128 registers and spills.
    p.directive(".minnctapersm 3");
    let bases = p.binding_bases(k.inputs.len() + 1);
    let tid = p.special("%tid.x");
    let bid = p.special("%ctaid.x");
    let lane = u32_op(&mut p, "and.b32", tid, Imm::U(31).into());
    let warp = u32_op(&mut p, "shr.u32", tid, Imm::U(5).into());
    let g = u32_op(&mut p, "shr.u32", lane, Imm::U(2).into());
    let t4 = u32_op(&mut p, "and.b32", lane, Imm::U(3).into());
    let tiles32 = Imm::U(tiles);
    let head = u32_op(&mut p, "div.u32", bid, tiles32.into());
    let tile = u32_op(&mut p, "rem.u32", bid, tiles32.into());
    // The lane's two queries (h = 0, 1: rows g and g + 8 of its warp's 16), whether
    // each exists, and each query's row of the output (clamped into the head).
    let q0 = u32_op(&mut p, "shl.b32", tile, Imm::U(6).into());
    let wq = u32_op(&mut p, "shl.b32", warp, Imm::U(4).into());
    let q0 = u32_op(&mut p, "add.u32", q0, wq.into());
    let q0 = u32_op(&mut p, "add.u32", q0, g.into());
    // The head's variables, then each query's (clamped into the head), its output row
    // (row-major over the outer variables) and whether it exists.
    let head64 = p.reg(RegClass::B64);
    p.op("cvt.u64.u32", &[head64.into(), head.into()]);
    let head_vars = decompose(&mut p, head64, &extent(&hv));
    let mut rows = Vec::new();
    let mut stores = Vec::new();
    let mut outs = Vec::new();
    for h in 0..2u64 {
        let q = u32_op(&mut p, "add.u32", q0, Imm::U(8 * h).into());
        let inside = p.reg(RegClass::Pred);
        p.op("setp.lt.u32", &[inside.into(), q.into(), Imm::U(queries).into()]);
        let qc = u32_op(&mut p, "min.u32", q, Imm::U(queries - 1).into());
        let qw = p.reg(RegClass::B64);
        p.op("cvt.u64.u32", &[qw.into(), qc.into()]);
        let query_vars = decompose(&mut p, qw, &extent(&qv));
        let mut vars = vec![qw; rank - 1];
        for (&v, &r) in hv.iter().zip(&head_vars).chain(qv.iter().zip(&query_vars)) {
            vars[v] = r;
        }
        let row = p.mov(RegClass::B64, "b64", Imm::I(0).into());
        for (v, &r) in vars.iter().enumerate() {
            p.op("mad.lo.s64", &[row.into(), row.into(), Imm::I(dims[v] as i64).into(), r.into()]);
        }
        rows.push(vars);
        stores.push(inside);
        outs.push(row);
    }
    // An operand's element offset at query h's outer variables.
    let offset = |p: &mut Ptx, o: &Operand, h: usize| -> Reg {
        let r = p.reg(RegClass::B64);
        p.op("mov.b64", &[r.into(), Imm::I(o.offset.c).into()]);
        for (v, &reg) in rows[h].iter().enumerate() {
            let c = o.offset.of(v as u32);
            if c != 0 {
                p.op("mad.lo.s64", &[r.into(), reg.into(), Imm::I(c).into(), r.into()]);
            }
        }
        r
    };
    // The byte address of element `off + x·coef` (x a u32 register) of input `input`.
    let address = |p: &mut Ptx, input: u32, off: Reg, terms: &[(Reg, i64)]| -> Reg {
        let e = p.reg(RegClass::B64);
        p.op("mov.b64", &[e.into(), off.into()]);
        for &(x, c) in terms {
            if c != 0 {
                let x64 = p.reg(RegClass::B64);
                p.op("cvt.u64.u32", &[x64.into(), x.into()]);
                p.op("mad.lo.s64", &[e.into(), x64.into(), Imm::I(c).into(), e.into()]);
            }
        }
        let at = p.reg(RegClass::B64);
        p.op("mad.lo.s64", &[at.into(), e.into(), Imm::I(size(input)).into(), bases[input as usize].into()]);
        at
    };
    // An f32 rounded to the `mma` type.
    let cvt_mt = format!("cvt.rn.{mt}.f32");
    let half = |p: &mut Ptx, x: Reg| -> Reg {
        let h = p.reg(RegClass::B16);
        p.op(&cvt_mt, &[h.into(), x.into()]);
        h
    };
    // A half of type `src` (bits) as the `mma` type: widened exactly, then rounded.
    let convert = |p: &mut Ptx, src: &str, h: Reg| -> Reg {
        let x = p.reg(RegClass::F32);
        p.op(&format!("cvt.f32.{src}"), &[x.into(), h.into()]);
        half(p, x)
    };
    // One element of operand `o` at `at`, as the `mma` type.
    let elem = |p: &mut Ptx, o: &Operand, at: Opd| -> Reg {
        match Elt::of(dt(o), mt) {
            Elt::F32 => {
                let x = p.reg(RegClass::F32);
                p.op("ld.global.f32", &[x.into(), at]);
                half(p, x)
            }
            e => {
                let h = p.reg(RegClass::B16);
                p.op("ld.global.b16", &[h.into(), at]);
                match e {
                    Elt::Other(src) => convert(p, src, h),
                    _ => h,
                }
            }
        }
    };
    let pack = |p: &mut Ptx, lo: Reg, hi: Reg| -> Reg {
        let r = p.reg(RegClass::B32);
        p.op("mov.b32", &[r.into(), Opd::Vec(vec![lo, hi])]);
        r
    };

    // Q's A fragments: qa[kk][i] holds (row g + 8(i % 2), depth 16kk + 2t + h + 8(i / 2)).
    let qd = a.q.offset.of(a.depth);
    let t2 = u32_op(&mut p, "shl.b32", t4, Imm::U(1).into());
    let qptr: Vec<Reg> = (0..2)
        .map(|h| {
            let o = offset(&mut p, &a.q, h);
            address(&mut p, a.q.input, o, &[(t2, qd)])
        })
        .collect();
    let mut qa = Vec::new();
    for kk in 0..d / 16 {
        let mut frag = Vec::new();
        for i in 0..4u32 {
            let mut hs = Vec::new();
            for hh in 0..2u32 {
                let e = i64::from(16 * kk + hh + 8 * (i / 2));
                hs.push(elem(&mut p, &a.q, Opd::Addr(qptr[(i % 2) as usize], size(a.q.input) * e * qd)));
            }
            frag.push(pack(&mut p, hs[0], hs[1]));
        }
        qa.push(frag);
    }

    // Shared memory: K's tile then V's.
    let (ks, vs) =
        (Stage::of(a, &a.k, Elt::of(dt(&a.k), mt), a.depth, d), Stage::of(a, &a.v, Elt::of(dt(&a.v), mt), a.column, w));
    let smem = declare_shared(&mut p, "kv", ks.bytes() + vs.bytes(), 16);
    let shared = dynamic_bytes(ks.bytes() + vs.bytes());
    let kbase = p.reg(RegClass::B32);
    p.op("mov.u32", &[kbase.into(), Opd::Sym(smem)]);
    let vbase = u32_op(&mut p, "add.u32", kbase, Imm::U(u64::from(ks.bytes())).into());
    let copies = [(&ks, &a.k, kbase), (&vs, &a.v, vbase)];
    // Each copy's global pointer (advanced a tile each turn), shared address, first
    // row and first element.
    let mut cps = Vec::new();
    for &(c, o, sbase) in &copies {
        let (r0, e0) = c.start(&mut p, tid);
        let off = offset(&mut p, o, 0);
        let g = address(&mut p, o.input, off, &[(r0, c.coef.0), (e0, c.coef.1)]);
        let so = u32_op(&mut p, "mul.lo.u32", r0, Imm::U(u64::from(c.stride)).into());
        let e2 = u32_op(&mut p, "shl.b32", e0, Imm::U(1).into());
        let so = u32_op(&mut p, "add.u32", so, e2.into());
        let so = u32_op(&mut p, "add.u32", so, sbase.into());
        cps.push((g, so, r0, e0));
    }
    // ldmatrix lane addresses: matrix i = lane / 8, its row j = lane % 8. A tile whose
    // rows are the B fragment's n (not transposed): row 8(i / 2) + j, element 8(i % 2);
    // whose rows are its k (transposed): row 8(i % 2) + j, element 8(i / 2).
    let mi = u32_op(&mut p, "shr.u32", lane, Imm::U(3).into());
    let mj = u32_op(&mut p, "and.b32", lane, Imm::U(7).into());
    let i0 = u32_op(&mut p, "and.b32", mi, Imm::U(1).into());
    let i1 = u32_op(&mut p, "shr.u32", mi, Imm::U(1).into());
    let ldm_addr = |p: &mut Ptx, base: Reg, st: &Stage, trans: bool| -> Reg {
        let (row_sel, col_sel) = if trans { (i0, i1) } else { (i1, i0) };
        let r = u32_op(p, "shl.b32", row_sel, Imm::U(3).into());
        let r = u32_op(p, "add.u32", r, mj.into());
        let at = p.reg(RegClass::B32);
        p.op("mad.lo.u32", &[at.into(), r.into(), Imm::U(u64::from(st.stride)).into(), base.into()]);
        let c = u32_op(p, "shl.b32", col_sel, Imm::U(4).into());
        u32_op(p, "add.u32", at, c.into())
    };
    let (ktrans, vtrans) = (ks.trans(false), vs.trans(true));
    let kl = ldm_addr(&mut p, kbase, &ks, ktrans);
    let vl = ldm_addr(&mut p, vbase, &vs, vtrans);
    // The byte offset of the fragment pair of n-blocks `2nb, 2nb + 1` at `k` step `kk`.
    let frag = |st: &Stage, trans: bool, nb: u32, kk: u32| -> u32 {
        if trans {
            kk * 16 * st.stride + nb * 32
        } else {
            nb * 16 * st.stride + kk * 32
        }
    };
    // The mask's address of key 0 for each query.
    let mptr: Vec<Reg> = match &a.mask {
        Some((m, _)) => (0..2)
            .map(|h| {
                let o = offset(&mut p, m, h);
                address(&mut p, m.input, o, &[])
            })
            .collect(),
        None => Vec::new(),
    };

    let ninf = f32imm(f32::NEG_INFINITY);
    let zero = f32imm(0.0);
    let m: Vec<Reg> = (0..2).map(|_| p.mov(RegClass::F32, "f32", ninf.clone())).collect();
    let l: Vec<Reg> = (0..2).map(|_| p.mov(RegClass::F32, "f32", zero.clone())).collect();
    let nob = (w / 8) as usize;
    let o: Vec<Reg> = (0..4 * nob).map(|_| p.mov(RegClass::F32, "f32", zero.clone())).collect();
    let j0 = p.mov(RegClass::B32, "u32", Imm::U(0).into());
    let fz = p.mov(RegClass::F32, "f32", zero.clone());
    // The copies' items: (copy, row offset, element offset) of the thread's vectors.
    let items: Vec<(usize, u32, u32)> = copies
        .iter()
        .enumerate()
        .flat_map(|(ci, (c, _, _))| {
            let per_pass = THREADS / c.c;
            (0..c.passes).flat_map(move |pass| (0..c.runs).map(move |run| (ci, pass * per_pass, run * c.c * c.vw)))
        })
        .collect();
    // Each item's registers: `vw` f32, 4 words of 8 halves, or one half.
    let xs: Vec<Vec<Reg>> = items
        .iter()
        .map(|&(ci, _, _)| {
            let c = copies[ci].0;
            match (c.elt, c.vw) {
                (Elt::F32, vw) => (0..vw).map(|_| p.reg(RegClass::F32)).collect(),
                (_, vw) if vw > 1 => (0..vw / 2).map(|_| p.reg(RegClass::B32)).collect(),
                _ => vec![p.reg(RegClass::B16)],
            }
        })
        .collect();
    // Loads of the tile from key `jt` into `xs` (the pointers at that tile), zeros past
    // the last key.
    let issue = |p: &mut Ptx, jt: Reg| {
        let key0: Vec<Reg> = copies
            .iter()
            .zip(&cps)
            .map(|(&(c, _, _), &(_, _, r0, e0))| u32_op(p, "add.u32", jt, if c.key_rows { r0 } else { e0 }.into()))
            .collect();
        for (&(ci, r, e), x) in items.iter().zip(&xs) {
            let (c, gp) = (copies[ci].0, cps[ci].0);
            let key = u32_op(p, "add.u32", key0[ci], Imm::U(u64::from(if c.key_rows { r } else { e })).into());
            let inside = p.reg(RegClass::Pred);
            p.op("setp.lt.u32", &[inside.into(), key.into(), Imm::U(keys).into()]);
            let goff = c.elt.size() * (i64::from(r) * c.coef.0 + i64::from(e) * c.coef.1);
            let (mov, op) = match (c.elt, c.vw) {
                (Elt::F32, 4) => ("mov.f32", "ld.global.v4.f32"),
                (Elt::F32, _) => ("mov.f32", "ld.global.f32"),
                (_, 8) => ("mov.b32", "ld.global.v4.b32"),
                (_, 4) => ("mov.b32", "ld.global.v2.b32"),
                _ => ("mov.b16", "ld.global.b16"),
            };
            let z = if c.elt == Elt::F32 { zero.clone() } else { Imm::U(0).into() };
            for &xi in x {
                p.op(mov, &[xi.into(), z.clone()]);
            }
            let dst = if x.len() > 1 { Opd::Vec(x.clone()) } else { x[0].into() };
            p.op_if(inside, false, op, &[dst, Opd::Addr(gp, goff)]);
        }
    };
    // `xs` as the `mma` type into shared memory (f32 rounded, halves of that type as
    // they are).
    let store = |p: &mut Ptx| {
        for (&(ci, r, e), x) in items.iter().zip(&xs) {
            let (c, so) = (copies[ci].0, cps[ci].1);
            let at = Opd::Addr(so, i64::from(r * c.stride + 2 * e));
            match (c.elt, c.vw) {
                (Elt::F32, 4) => {
                    let hs: Vec<Reg> = x.iter().map(|&x| half(p, x)).collect();
                    let lo = pack(p, hs[0], hs[1]);
                    let hi = pack(p, hs[2], hs[3]);
                    p.op("st.shared.v2.b32", &[at, Opd::Vec(vec![lo, hi])]);
                }
                (Elt::F32, _) => {
                    let h = half(p, x[0]);
                    p.op("st.shared.b16", &[at, h.into()]);
                }
                (_, 8) => p.op("st.shared.v4.b32", &[at, Opd::Vec(x.clone())]),
                (_, 4) => p.op("st.shared.v2.b32", &[at, Opd::Vec(x.clone())]),
                (Elt::Other(src), _) => {
                    let h = convert(p, src, x[0]);
                    p.op("st.shared.b16", &[at, h.into()]);
                }
                _ => p.op("st.shared.b16", &[at, x[0].into()]),
            }
        }
    };
    // Where the registers allow (the tile's vectors of K and V, `(D + W)/2` f32 or
    // `(D + W)/4` words of halves a thread), the next tile's loads are issued
    // before this tile's products, so that they land while the tensor cores work.
    // (Halves would allow `D + W = 256`, but ptxas then takes 246 registers at 128 ×
    // 128: two blocks a multiprocessor instead of three.)
    let prefetch = d + w <= 128;
    if prefetch {
        issue(&mut p, j0);
    }
    let next = p.label();
    p.place(next);
    p.op("bar.sync", &[Imm::I(0).into()]);
    // 1. The tile's K and V into shared memory.
    if !prefetch {
        issue(&mut p, j0);
    }
    store(&mut p);
    p.op("bar.sync", &[Imm::I(0).into()]);
    for (&(c, _, _), &(gp, _, _, _)) in copies.iter().zip(&cps) {
        p.op("add.s64", &[gp.into(), gp.into(), Imm::I(c.elt.size() * i64::from(KEYS) * c.key_coef).into()]);
    }
    if prefetch {
        let jn = u32_op(&mut p, "add.u32", j0, Imm::U(u64::from(KEYS)).into());
        issue(&mut p, jn);
    }

    // 2. S = Q·Kᵀ: s[nb][c] is (row g + 8(c / 2), key j0 + 8nb + 2t + c % 2).
    let s: Vec<Vec<Reg>> =
        (0..8).map(|_| (0..4).map(|_| p.mov(RegClass::F32, "f32", zero.clone())).collect()).collect();
    let mma = &format!("mma.sync.aligned.m16n8k16.row.col.f32.{mt}.{mt}.f32");
    let ldm = |p: &mut Ptx, trans: bool, at: Reg, off: u32| -> Vec<Reg> {
        let r: Vec<Reg> = (0..4).map(|_| p.reg(RegClass::B32)).collect();
        let op = if trans {
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"
        } else {
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
        };
        p.op(op, &[Opd::Vec(r.clone()), Opd::Addr(at, i64::from(off))]);
        r
    };
    for (kk, qf) in qa.iter().enumerate() {
        for nbp in 0..4usize {
            let b = ldm(&mut p, ktrans, kl, frag(&ks, ktrans, nbp as u32, kk as u32));
            for (x, pair) in [(0, [b[0], b[1]]), (1, [b[2], b[3]])] {
                let c = s[2 * nbp + x].clone();
                p.op(mma, &[Opd::Vec(c.clone()), Opd::Vec(qf.clone()), Opd::Vec(pair.to_vec()), Opd::Vec(c)]);
            }
        }
    }
    // 3. Scale, mask, keys past the last.
    let tk = u32_op(&mut p, "add.u32", j0, t2.into());
    for (nb, sn) in s.iter().enumerate() {
        for c in 0..2usize {
            let key = u32_op(&mut p, "add.u32", tk, Imm::U((8 * nb + c) as u64).into());
            let inside = p.reg(RegClass::Pred);
            p.op("setp.lt.u32", &[inside.into(), key.into(), Imm::U(keys).into()]);
            let kc =
                if a.mask.is_some() { Some(u32_op(&mut p, "min.u32", key, Imm::U(keys - 1).into())) } else { None };
            for h in 0..2usize {
                let x = sn[2 * h + c];
                p.op("mul.rn.f32", &[x.into(), x.into(), f32imm(a.scale)]);
                if let (Some((mo, ms)), Some(kc)) = (&a.mask, kc) {
                    let at = p.reg(RegClass::B64);
                    let mk = mo.offset.of(a.key);
                    let msize = size(mo.input);
                    p.op("mad.wide.u32", &[at.into(), kc.into(), Imm::U((msize * mk) as u64).into(), mptr[h].into()]);
                    let y = p.reg(RegClass::F32);
                    match half_name(dt(mo)) {
                        Some(src) => {
                            let hm = p.reg(RegClass::B16);
                            p.op("ld.global.b16", &[hm.into(), Opd::Addr(at, 0)]);
                            p.op(&format!("cvt.f32.{src}"), &[y.into(), hm.into()]);
                        }
                        _ => p.op("ld.global.f32", &[y.into(), Opd::Addr(at, 0)]),
                    }
                    p.op("fma.rn.f32", &[x.into(), y.into(), f32imm(*ms), x.into()]);
                }
                p.op("selp.f32", &[x.into(), x.into(), ninf.clone(), inside.into()]);
            }
        }
    }
    // 4. The online softmax of each row.
    let log2e = f32imm(std::f32::consts::LOG2_E);
    let exp = |p: &mut Ptx, x: Reg, m: Reg| -> Reg {
        let dx = p.reg(RegClass::F32);
        p.op("sub.rn.f32", &[dx.into(), x.into(), m.into()]);
        p.op("mul.rn.f32", &[dx.into(), dx.into(), log2e.clone()]);
        let e = p.reg(RegClass::F32);
        p.op("ex2.approx.f32", &[e.into(), dx.into()]);
        e
    };
    let mut probs = vec![vec![fz; 4]; 8];
    for h in 0..2usize {
        let mx = p.mov(RegClass::F32, "f32", ninf.clone());
        for sn in &s {
            for c in 0..2 {
                p.op("max.f32", &[mx.into(), mx.into(), sn[2 * h + c].into()]);
            }
        }
        for off in [1, 2] {
            let other = shfl_bfly(&mut p, mx, off);
            p.op("max.f32", &[mx.into(), mx.into(), other.into()]);
        }
        p.op("max.f32", &[mx.into(), mx.into(), m[h].into()]);
        let none = p.reg(RegClass::Pred);
        p.op("setp.eq.f32", &[none.into(), mx.into(), ninf.clone()]);
        let mu = p.reg(RegClass::F32);
        p.op("selp.f32", &[mu.into(), zero.clone(), mx.into(), none.into()]);
        let corr = exp(&mut p, m[h], mu);
        p.op("mov.f32", &[m[h].into(), mx.into()]);
        p.op("mul.rn.f32", &[l[h].into(), l[h].into(), corr.into()]);
        for (nb, sn) in s.iter().enumerate() {
            for c in 0..2 {
                let e = exp(&mut p, sn[2 * h + c], mu);
                p.op("add.rn.f32", &[l[h].into(), l[h].into(), e.into()]);
                probs[nb][2 * h + c] = e;
            }
        }
        for nb in 0..nob {
            for c in 0..2 {
                let x = o[4 * nb + 2 * h + c];
                p.op("mul.rn.f32", &[x.into(), x.into(), corr.into()]);
            }
        }
    }
    // 5. O += P·V: A register i of keys 16kk.. is probs[2kk + i / 2][2(i % 2) ..+ 2].
    for kk in 0..4usize {
        let pa: Vec<Reg> = (0..4usize)
            .map(|i| {
                let pr = &probs[2 * kk + i / 2];
                let lo = half(&mut p, pr[2 * (i % 2)]);
                let hi = half(&mut p, pr[2 * (i % 2) + 1]);
                pack(&mut p, lo, hi)
            })
            .collect();
        for cb in 0..nob / 2 {
            let b = ldm(&mut p, vtrans, vl, frag(&vs, vtrans, cb as u32, kk as u32));
            for (x, pair) in [(0, [b[0], b[1]]), (1, [b[2], b[3]])] {
                let c: Vec<Reg> = o[4 * (2 * cb + x)..4 * (2 * cb + x) + 4].to_vec();
                p.op(mma, &[Opd::Vec(c.clone()), Opd::Vec(pa.clone()), Opd::Vec(pair.to_vec()), Opd::Vec(c)]);
            }
        }
    }
    p.op("add.u32", &[j0.into(), j0.into(), Imm::U(u64::from(KEYS)).into()]);
    let more = p.reg(RegClass::Pred);
    p.op("setp.lt.u32", &[more.into(), j0.into(), Imm::U(keys).into()]);
    p.bra(Some((more, false)), next);

    // The rows' sums over their quads, and O / l stored by column pairs.
    for (h, &lh) in l.iter().enumerate() {
        for off in [1, 2] {
            let other = shfl_bfly(&mut p, lh, off);
            p.op("add.rn.f32", &[lh.into(), lh.into(), other.into()]);
        }
        // The row's first column of the lane: row·W + 2t.
        let e = p.reg(RegClass::B64);
        let t2w = p.reg(RegClass::B64);
        p.op("cvt.u64.u32", &[t2w.into(), t2.into()]);
        p.op("mad.lo.s64", &[e.into(), outs[h].into(), Imm::I(i64::from(w)).into(), t2w.into()]);
        let at = p.reg(RegClass::B64);
        let osize = if out_half.is_some() { 2 } else { 4 };
        p.op("mad.lo.s64", &[at.into(), e.into(), Imm::I(osize).into(), bases[k.inputs.len()].into()]);
        for nb in 0..nob {
            let ys: Vec<Reg> = (0..2)
                .map(|c| {
                    let y = p.reg(RegClass::F32);
                    p.op("div.rn.f32", &[y.into(), o[4 * nb + 2 * h + c].into(), lh.into()]);
                    if a.nan_to_zero {
                        let nan = p.reg(RegClass::Pred);
                        p.op("setp.nan.f32", &[nan.into(), y.into(), y.into()]);
                        p.op("selp.f32", &[y.into(), zero.clone(), y.into(), nan.into()]);
                    }
                    y
                })
                .collect();
            // f32 pairs as they are; halves rounded once and packed in a word.
            let at = Opd::Addr(at, 8 * osize * nb as i64);
            match out_half {
                Some(oh) => {
                    let hs: Vec<Reg> = ys
                        .iter()
                        .map(|&y| {
                            let h = p.reg(RegClass::B16);
                            p.op(&format!("cvt.rn.{oh}.f32"), &[h.into(), y.into()]);
                            h
                        })
                        .collect();
                    let pr = pack(&mut p, hs[0], hs[1]);
                    p.op_if(stores[h], false, "st.global.b32", &[at, pr.into()]);
                }
                None => p.op_if(stores[h], false, "st.global.v2.f32", &[at, Opd::Vec(ys)]),
            }
        }
    }
    let text = p.finish().map_err(|e| internal(k, e))?;
    let launch = Launch { grid, block: THREADS, shared, params: (k.inputs.len() + 1) as u32 };
    let note = format!(
        "attention (tensor cores: mma.sync {mt}, {} result, blocks of {ROWS} queries × {heads} heads × {tiles} tiles, \
         tiles of {KEYS} keys in shared memory{}, K {}, V {} ({}); {keys} keys, depth {depth}, {width} columns)",
        k.output.dtype,
        if prefetch { " (the next one's loads issued before the products)" } else { "" },
        ks.note(),
        vs.note(),
        if ks.elt == vs.elt {
            ks.conversion().to_string()
        } else {
            format!("K {}, V {}", ks.conversion(), vs.conversion())
        }
    );
    Ok(Ok(Entry { text, launch, note }))
}
