//! Attention kernels (`KernelClass::Attention`, the form of `kiln_flow::attention`) as
//! machine code, in two forms.
//!
//! **A tile of query rows** ([`emit_tiled`], where the kernel has a query axis and at
//! most [`TILE_KEYS`] keys): a workgroup is [`TILE_ROWS`] consecutive query rows of
//! one (batch, head), so every load of K and V serves all of them, as a contraction
//! microkernel's loads serve a tile of rows. Per tile:
//!
//! ```text
//! S[r, j] = scale·Σ_e Q[r, e]·K[e, j] (+ mask_scale·mask[r, j])   a register tile of
//!           rows × (4 vectors of keys on AVX-512, 3 or 2 on AVX2), K's vectors loaded
//!           once per depth for every row; scaled, masked, stored to the stack
//! per row: m = max_j S[r, j];  P[r, j] = exp(S[r, j] − m) (in place);  l[r] = Σ_j P
//! out[r, ..] = Σ_j P[r, j]·V[j, ..] / l[r]   a register tile of rows × (4, 3 or 2
//!           vectors of columns), V's row loaded once per key for every row
//! ```
//!
//! The scores of one tile are `TILE_ROWS × keys` floats of stack, never the arena's
//! `queries × keys` matrix; with the whole row of scores at hand the softmax needs no
//! running rescale. The workgroups split (batch, heads, query blocks) across threads.
//!
//! **One query row per workgroup** ([`emit_rows`]: a single query, or more keys than a
//! tile's stack takes), flash-attention style:
//!
//! ```text
//! m = −∞, l = 0, acc[0..dv] = 0                         (acc on the stack)
//! for each block of up to 4 vectors of keys (32 keys on AVX2, 64 on AVX-512):
//!     s[j] = scale·Σ_e Q[e]·K[e, j] (+ mask_scale·mask[j])   keys in lanes, e a loop
//!     m' = max(m, max_j s[j]);  c = exp(m − m')
//!     p[j] = exp(s[j] − m');  l = l·c + Σ_j p[j];  acc *= c;  m = m'
//!     acc += Σ_j p[j]·V[j, ..]                            (p[j] broadcast, V's row)
//! out[..] = acc / l
//! ```
//!
//! The scores of one block live in four vector registers and the probabilities in one
//! block-sized stack slot.
//!
//! Both read K along its keys at unit stride and V along its columns (what
//! `Attention::in_place` promises); Q at any stride of its depth. Vectors of 8 lanes
//! (AVX2 + FMA) or 16 (AVX-512 F), through [`super::vector`]; `exp` is
//! [`super::math`]'s inline polynomial, the one the row kernels use. The sums over keys
//! run in a different order from the unfused softmax and product, so results differ
//! from them by rounding only.

use iced_x86::code_asm::*;
use kiln_flow::attention::{Attention, Operand};
use kiln_flow::Kernel;

use super::asm::{add_imm, enter, leave, Tables};
use super::gemm::{no, R};
use super::vector::{Mask, Op, Src, Vx, V};

/// Vectors of keys per block (held in registers `V(0..4)`).
const BLOCK_VECTORS: u64 = 4;
/// Vectors of the accumulator loaded into registers at once in the `P·V` step (two
/// sets of them: `V(0..4)` and `V(4..8)`).
const CHUNK: u64 = 4;
/// Largest row of V (columns) the stack accumulator holds.
const MAX_WIDTH: u64 = 4096;

/// The code of an attention kernel and its workgroup count.
pub(crate) struct AttentionCode {
    pub code: Vec<u8>,
    pub workgroups: u64,
    /// 16 lanes (AVX-512 F) rather than 8.
    pub wide: bool,
    /// The workgroup index's digits (outermost first).
    pub digits: Vec<super::WorkDigit>,
    /// Query rows per workgroup (1: the one-row kernel).
    pub rows: u64,
}

/// What both kernels read of an attention's operands.
#[derive(Clone, Copy)]
struct Strides {
    /// Strides, in elements: Q and K along the depth, V along the keys.
    qe: i64,
    ke: i64,
    vj: i64,
    /// The mask's stride along the keys (0 or 1) and the factor it is added with, if
    /// there is a mask.
    mask: Option<(i64, f32)>,
    /// The scale of the scores.
    scale: f32,
}

impl Strides {
    fn of(at: &Attention) -> Strides {
        Strides {
            qe: at.q.offset.of(at.depth),
            ke: at.k.offset.of(at.depth),
            vj: at.v.offset.of(at.key),
            mask: at.mask.as_ref().map(|(m, s)| (m.offset.of(at.key), *s)),
            scale: at.scale,
        }
    }
}

/// An attention kernel's operands ([`Attention::of`], in place), the output's dims, and
/// the keys, the depth and the width (the output's last dim).
fn operands(k: &Kernel) -> R<(Attention, Vec<u64>, [u64; 3])> {
    let Some(at) = Attention::of(k) else { return no("not an attention kernel") };
    if !at.in_place() {
        return no("attention operands not at unit stride (K along keys, V along columns)");
    }
    let dims: Vec<u64> = k.output.shape.dims().iter().map(|&d| d as u64).collect();
    let var = |v: u32| k.vars.get(v as usize).copied().unwrap_or(0);
    let sizes = [var(at.key), var(at.depth), dims[dims.len() - 1]];
    Ok((at, dims, sizes))
}

/// The fixed geometry of one kernel.
struct Geometry {
    /// Lanes per vector.
    w: u64,
    depth: u64,
    width: u64,
    st: Strides,
    /// Vectors of the accumulator (the row of V rounded up).
    acc_vectors: u64,
    /// Stack offset of the accumulator (the probabilities are at 0).
    acc_at: i32,
}

/// Masks: the keys of the last vector of the tail block, the columns of the last
/// vector of the row.
const KEY_TAIL: Mask = Mask(14);
const COL_TAIL: Mask = Mask(15);
const KEY_TAIL_K: Mask = Mask(1);
const COL_TAIL_K: Mask = Mask(2);

/// The opening both attention kernels share: the stack frame, the workgroup range
/// `rdx..rcx` clamped to `count` into `r10..r11` (straight to the returned `done` label
/// when empty), and the tail masks of the keys and of the output columns (`[keys,
/// width, lanes]`), which it returns.
fn open(
    a: &mut CodeAssembler,
    t: &mut Tables,
    frame: i32,
    count: u64,
    wide: bool,
    [keys, width, w]: [u64; 3],
) -> R<(CodeLabel, Mask, Mask)> {
    enter(a)?;
    a.sub(rsp, frame)?;
    a.mov(rax, count as i64)?;
    a.cmp(rcx, rax)?;
    a.cmova(rcx, rax)?;
    a.mov(r10, rdx)?;
    a.mov(r11, rcx)?;
    let done = a.create_label();
    a.cmp(r10, r11)?;
    a.jae(done)?;
    let (key_tail, col_tail) = if wide { (KEY_TAIL_K, COL_TAIL_K) } else { (KEY_TAIL, COL_TAIL) };
    let mut vx = Vx { a, t, wide, held: &[] };
    if !keys.is_multiple_of(w) {
        vx.first_lanes(key_tail, keys % w, eax)?;
    }
    if !width.is_multiple_of(w) {
        vx.first_lanes(col_tail, width % w, eax)?;
    }
    Ok((done, key_tail, col_tail))
}

/// The base registers of the operands (`rbx` Q, `r12` K, `r13` V, `r14` the mask where
/// there is one, then `extra`), each loaded with its input's address (bindings at
/// `rdi`) plus its offset's constant; returns them.
fn load_bases<'o>(
    a: &mut CodeAssembler,
    at: &'o Attention,
    extra: Option<(AsmRegister64, &'o Operand)>,
) -> R<Vec<(AsmRegister64, &'o Operand)>> {
    let bases: Vec<(AsmRegister64, &Operand)> =
        [Some((rbx, &at.q)), Some((r12, &at.k)), Some((r13, &at.v)), at.mask.as_ref().map(|(m, _)| (r14, m)), extra]
            .into_iter()
            .flatten()
            .collect();
    for &(r, op) in &bases {
        a.mov(r, qword_ptr(rdi + 8 * op.input as i32))?;
        add_imm(a, r, op.offset.c.wrapping_mul(4), rax)?;
    }
    Ok(bases)
}

/// Register roles (vector numbers).
const Q_BCAST: V = V(4);
const EXP_T: [V; 4] = [V(5), V(6), V(7), V(8)];
const RUN_MAX: V = V(9);
const RUN_SUM: V = V(10);
const NEW_MAX: V = V(11);
const T0: V = V(12);
const T1: V = V(13);
const P_BCAST: V = V(8);

/// Emits attention kernel `k` (8 lanes, or 16 where `wide`): a tile of query rows per
/// workgroup where the kernel has a query axis and at most [`TILE_KEYS`] keys, else one
/// row per workgroup.
pub(crate) fn emit(k: &Kernel, wide: bool) -> R<AttentionCode> {
    match emit_tiled(k, wide)? {
        Some(c) => Ok(c),
        None => emit_rows(k, wide),
    }
}

/// Emits attention kernel `k` one query row per workgroup (the flash-style loop of the
/// module docs).
fn emit_rows(k: &Kernel, wide: bool) -> R<AttentionCode> {
    let (at, dims, [keys, depth, width]) = operands(k)?;
    let rank = dims.len();
    if keys == 0 || depth == 0 || width == 0 || width > MAX_WIDTH {
        return no(format!("attention of {keys} keys, depth {depth}, {width} columns"));
    }
    let w = if wide { 16 } else { 8 };
    let acc_vectors = width.div_ceil(w);
    let block = BLOCK_VECTORS * w;
    let g = Geometry { w, depth, width, st: Strides::of(&at), acc_vectors, acc_at: (block * 4) as i32 };
    let frame = ((block + acc_vectors * w) * 4).next_multiple_of(16) as i32 + 8;
    // Every byte offset the code adds must fit an immediate.
    let fits = |x: i64| x.checked_mul(4).is_some_and(|b| i32::try_from(b).is_ok());
    // (Two depths and two keys a step; a block's vectors lie within 256 bytes past them.)
    if ![2 * g.st.qe + 64, 2 * g.st.ke + 64, 2 * g.st.vj + 64, (width * 4) as i64].iter().all(|&x| fits(x.abs() + 64)) {
        return no("attention strides beyond 32-bit offsets");
    }
    let rows: u64 = dims[..rank - 1].iter().product();
    let ninputs = k.inputs.len() as i32;

    let mut a = CodeAssembler::new(64)?;
    let mut t = Tables::default();
    // rdi bindings, rdx begin, rcx end (clamped to the row count).
    let (mut done, key_tail, col_tail) = open(&mut a, &mut t, frame, rows, wide, [keys, width, w])?;

    let mut row_top = a.create_label();
    a.set_label(&mut row_top)?;
    // Base addresses: rbx Q, r12 K, r13 V, r14 the mask, r15 the output row.
    let bases = load_bases(&mut a, &at, None)?;
    a.imul_3(r15, r10, (width * 4) as i32)?;
    a.add(r15, qword_ptr(rdi + 8 * ninputs))?;
    // The row's coordinates, innermost first: each moves the bases by its coefficients.
    a.mov(rax, r10)?;
    for v in (0..rank - 1).rev() {
        a.xor(edx, edx)?;
        a.mov(rcx, dims[v] as i64)?;
        a.div(rcx)?;
        for &(r, op) in &bases {
            let coef = op.offset.of(v as u32);
            if coef == 0 {
                continue;
            }
            if !fits(coef) {
                return no("attention strides beyond 32-bit offsets");
            }
            a.imul_3(r8, rdx, (coef * 4) as i32)?;
            a.add(r, r8)?;
        }
    }
    {
        let mut vx = Vx { a: &mut a, t: &mut t, wide, held: &[] };
        vx.op(Op::Xor, V(0), V(0), Src::R(V(0)))?;
        for c in 0..acc_vectors {
            vx.store(ptr(rsp + g.acc_at + (c * w * 4) as i32), V(0), None)?;
        }
        vx.mov(RUN_MAX, Src::C(f32::NEG_INFINITY.to_bits()))?;
        vx.op(Op::Xor, RUN_SUM, RUN_SUM, Src::R(RUN_SUM))?;
    }
    // Full blocks in a loop over rbp (the first key), then the tail block.
    a.xor(ebp, ebp)?;
    let full = keys / block;
    if full > 0 {
        let mut top = a.create_label();
        a.set_label(&mut top)?;
        key_block(&mut a, &mut t, wide, &g, block, key_tail, col_tail)?;
        a.add(rbp, block as i32)?;
        a.cmp(rbp, (full * block) as i32)?;
        a.jb(top)?;
    }
    if !keys.is_multiple_of(block) {
        key_block(&mut a, &mut t, wide, &g, keys % block, key_tail, col_tail)?;
    }
    // out = acc / l; with `nan_to_zero`, 0 where l is NaN (the row's probabilities
    // are NaN exactly then: every score −∞, or a NaN or +∞ among them).
    {
        let mut vx = Vx { a: &mut a, t: &mut t, wide, held: &[] };
        let nan = if wide { Mask(3) } else { Mask(T1.0) };
        if at.nan_to_zero {
            vx.cmp(nan, RUN_SUM, Src::R(RUN_SUM), 3)?;
            vx.op(Op::Xor, V(1), V(1), Src::R(V(1)))?;
        }
        for c in 0..acc_vectors {
            let off = (c * w * 4) as i32;
            vx.load(V(0), ptr(rsp + g.acc_at + off), None)?;
            vx.op(Op::Div, V(0), V(0), Src::R(RUN_SUM))?;
            if at.nan_to_zero {
                vx.blend(V(0), nan, V(0), V(1))?;
            }
            let mask = (c + 1 == acc_vectors && !width.is_multiple_of(w)).then_some(col_tail);
            vx.store(ptr(r15 + off), V(0), mask)?;
        }
    }
    a.inc(r10)?;
    a.cmp(r10, r11)?;
    a.jb(row_top)?;
    a.set_label(&mut done)?;
    leave(&mut a, frame)?;
    t.emit(&mut a)?;
    let digits = super::row_digits(k, rank - 1);
    Ok(AttentionCode { code: a.assemble(0)?, workgroups: rows, wide, digits, rows: 1 })
}

/// One block of `nk` keys starting at key `rbp`: scores, the online softmax's update
/// and the accumulation of `P·V` (see the module docs). Keeps `RUN_MAX`, `RUN_SUM` and
/// the masks; clobbers every other vector register, rax, rcx, rsi, r8 and r9.
fn key_block(
    a: &mut CodeAssembler,
    t: &mut Tables,
    wide: bool,
    g: &Geometry,
    nk: u64,
    key_tail: Mask,
    col_tail: Mask,
) -> R<()> {
    let w = g.w;
    let nv = nk.div_ceil(w);
    let tail = !nk.is_multiple_of(w);
    let s: Vec<V> = (0..nv as u8).map(V).collect();
    let key_mask = |u: u64| (tail && u + 1 == nv).then_some(key_tail);
    {
        let mut vx = Vx { a: &mut *a, t: &mut *t, wide, held: &[] };
        for &r in &s {
            vx.op(Op::Xor, r, r, Src::R(r))?;
        }
    }
    // Scores: Σ_e Q[e]·K[e, j0 + lanes], two depths a step into two sets of sums (the
    // second in the exp scratch, free here) so that twice as many FMA chains overlap.
    let s2: Vec<V> = (0..nv as u8).map(|u| V(EXP_T[0].0 + u)).collect();
    {
        let mut vx = Vx { a: &mut *a, t: &mut *t, wide, held: &[] };
        for &r in &s2 {
            vx.op(Op::Xor, r, r, Src::R(r))?;
        }
    }
    a.mov(rsi, rbx)?;
    a.lea(r9, ptr(r12 + rbp * 4))?;
    // One depth per set: (sums, broadcast register, Q's and K's offsets in elements).
    let step = |a: &mut CodeAssembler, t: &mut Tables, sets: &[(&[V], V, i64, i64)]| -> R<()> {
        let mut vx = Vx { a, t, wide, held: &[] };
        for &(_, b, q_off, _) in sets {
            vx.broadcast(b, dword_ptr(rsi + (q_off * 4) as i32))?;
        }
        for &(acc, b, _, k_off) in sets {
            for (u, &r) in acc.iter().enumerate() {
                let at = ptr(r9 + (k_off * 4 + (u as u64 * w * 4) as i64) as i32);
                match key_mask(u as u64) {
                    Some(m) => {
                        vx.load(T0, at, Some(m))?;
                        vx.op(Op::Fma231, r, b, Src::R(T0))?;
                    }
                    None => vx.op(Op::Fma231, r, b, Src::M(at))?,
                }
            }
        }
        Ok(())
    };
    let pairs = g.depth / 2;
    if pairs > 0 {
        a.mov(rcx, pairs as i64)?;
        let mut top = a.create_label();
        a.set_label(&mut top)?;
        step(a, t, &[(&s, Q_BCAST, 0, 0), (&s2, T1, g.st.qe, g.st.ke)])?;
        add_imm(a, rsi, 2 * g.st.qe * 4, rax)?;
        add_imm(a, r9, 2 * g.st.ke * 4, rax)?;
        a.dec(rcx)?;
        a.jnz(top)?;
    }
    if g.depth % 2 == 1 {
        step(a, t, &[(&s, Q_BCAST, 0, 0)])?;
    }
    {
        let mut vx = Vx { a: &mut *a, t: &mut *t, wide, held: &[] };
        for (&r, &r2) in s.iter().zip(&s2) {
            vx.op(Op::Add, r, r, Src::R(r2))?;
        }
    }
    // Scale and mask.
    mask_pointer(a, g.st.mask)?;
    let mut vx = Vx { a: &mut *a, t: &mut *t, wide, held: &[] };
    for (u, &r) in s.iter().enumerate() {
        if g.st.scale != 1.0 {
            vx.op(Op::Mul, r, r, Src::C(g.st.scale.to_bits()))?;
        }
        if let Some((mj, ms)) = g.st.mask {
            if mj == 0 {
                vx.broadcast(T0, dword_ptr(r8))?;
            } else {
                vx.load(T0, ptr(r8 + (u as u64 * w * 4) as i32), key_mask(u as u64))?;
            }
            if ms == 1.0 {
                vx.op(Op::Add, r, r, Src::R(T0))?;
            } else {
                vx.op(Op::Fma231, r, T0, Src::C(ms.to_bits()))?;
            }
        }
    }
    // Lanes past the last key: −∞, so they neither raise the maximum nor add to the sum.
    if let Some(m) = key_mask(nv - 1) {
        let last = s[nv as usize - 1];
        vx.mov(T0, Src::C(f32::NEG_INFINITY.to_bits()))?;
        vx.blend(last, m, T0, last)?;
    }
    // The block's maximum in every lane, the new running maximum and the factor c.
    vx.mov(T0, Src::R(s[0]))?;
    for &r in &s[1..] {
        vx.op(Op::Max, T0, T0, Src::R(r))?;
    }
    fold(&mut vx, Op::Max, T0, T1)?;
    vx.op(Op::Max, NEW_MAX, T0, Src::R(RUN_MAX))?;
    vx.op(Op::Sub, T0, RUN_MAX, Src::R(NEW_MAX))?;
    vx.exp(T0, T0, EXP_T)?;
    vx.op(Op::Mul, RUN_SUM, RUN_SUM, Src::R(T0))?;
    for c in 0..g.acc_vectors {
        let at = ptr(rsp + g.acc_at + (c * w * 4) as i32);
        vx.op(Op::Mul, T1, T0, Src::M(at))?;
        vx.store(at, T1, None)?;
    }
    vx.mov(RUN_MAX, Src::R(NEW_MAX))?;
    // p = exp(s − m), summed and stored for the product.
    for (u, &r) in s.iter().enumerate() {
        vx.op(Op::Sub, r, r, Src::R(RUN_MAX))?;
        vx.exp(r, r, EXP_T)?;
        if let Some(m) = key_mask(u as u64) {
            vx.zero_unmasked(r, m)?;
        }
        vx.store(ptr(rsp + (u as u64 * w * 4) as i32), r, None)?;
    }
    vx.mov(T0, Src::R(s[0]))?;
    for &r in &s[1..] {
        vx.op(Op::Add, T0, T0, Src::R(r))?;
    }
    fold(&mut vx, Op::Add, T0, T1)?;
    vx.op(Op::Add, RUN_SUM, RUN_SUM, Src::R(T0))?;
    // acc += Σ_j p[j]·V[j0 + j, ..], CHUNK vectors of the accumulator at a time, two
    // keys a step into two sets of sums (V(0..4) and V(4..8)).
    let mut c0 = 0;
    while c0 < g.acc_vectors {
        let nc = CHUNK.min(g.acc_vectors - c0);
        let acc: Vec<V> = (0..nc as u8).map(V).collect();
        let acc2: Vec<V> = (0..nc as u8).map(|c| V(CHUNK as u8 + c)).collect();
        {
            let mut vx = Vx { a: &mut *a, t: &mut *t, wide, held: &[] };
            for (c, (&r, &r2)) in acc.iter().zip(&acc2).enumerate() {
                vx.load(r, ptr(rsp + g.acc_at + ((c0 + c as u64) * w * 4) as i32), None)?;
                vx.op(Op::Xor, r2, r2, Src::R(r2))?;
            }
        }
        a.imul_3(r8, rbp, (g.st.vj * 4) as i32)?;
        a.add(r8, r13)?;
        a.mov(rsi, rsp)?;
        let step = |a: &mut CodeAssembler, t: &mut Tables, sets: &[(&[V], V, i64)]| -> R<()> {
            let mut vx = Vx { a, t, wide, held: &[] };
            for &(_, b, key) in sets {
                vx.broadcast(b, dword_ptr(rsi + (key * 4) as i32))?;
            }
            for &(regs, b, key) in sets {
                for (c, &r) in regs.iter().enumerate() {
                    let col = c0 + c as u64;
                    let at = ptr(r8 + (key * g.st.vj * 4 + (col * w * 4) as i64) as i32);
                    if col + 1 == g.acc_vectors && !g.width.is_multiple_of(w) {
                        vx.load(T0, at, Some(col_tail))?;
                        vx.op(Op::Fma231, r, b, Src::R(T0))?;
                    } else {
                        vx.op(Op::Fma231, r, b, Src::M(at))?;
                    }
                }
            }
            Ok(())
        };
        if nk / 2 > 0 {
            a.mov(rcx, (nk / 2) as i64)?;
            let mut top = a.create_label();
            a.set_label(&mut top)?;
            step(a, t, &[(&acc, P_BCAST, 0), (&acc2, T1, 1)])?;
            a.add(rsi, 8)?;
            add_imm(a, r8, 2 * g.st.vj * 4, rax)?;
            a.dec(rcx)?;
            a.jnz(top)?;
        }
        if nk % 2 == 1 {
            step(a, t, &[(&acc, P_BCAST, 0)])?;
        }
        {
            let mut vx = Vx { a: &mut *a, t: &mut *t, wide, held: &[] };
            for (c, (&r, &r2)) in acc.iter().zip(&acc2).enumerate() {
                vx.op(Op::Add, r, r, Src::R(r2))?;
                vx.store(ptr(rsp + g.acc_at + ((c0 + c as u64) * w * 4) as i32), r, None)?;
            }
        }
        c0 += nc;
    }
    Ok(())
}

/// `r8` at the mask's row at key `rbp` (`r14` the row), where there is a mask (`mask`:
/// its stride along the keys, 0 or 1).
fn mask_pointer(a: &mut CodeAssembler, mask: Option<(i64, f32)>) -> R<()> {
    if let Some((mj, _)) = mask {
        if mj == 0 {
            a.mov(r8, r14)?;
        } else {
            a.lea(r8, ptr(r14 + rbp * 4))?;
        }
    }
    Ok(())
}

/// Query rows per workgroup of the tiled kernel (six on AVX-512, with 24 sums, measured
/// no faster than four).
const TILE_ROWS: u64 = 4;
/// Most keys the tiled kernel takes: a tile's scores, `TILE_ROWS × keys` floats, live
/// on the stack (32 KiB at this bound); longer sequences take the one-row kernel.
pub(crate) const TILE_KEYS: u64 = 2048;
/// Stack offset of the tile's row sums (a vector per row) and of the query block number.
const SUMS_AT: i32 = 0;
const BLOCK_AT: i32 = 64 * TILE_ROWS as i32;
/// Stack offset of the tile's scores (then probabilities), `TILE_ROWS` rows of `pitch`.
const SCORES_AT: i32 = BLOCK_AT + 64;

/// Vectors of keys (and of columns) in a tile's register block: 4 on AVX-512 (rows × 4
/// = 16 of its 32 registers); on AVX2's 16, 3 where neither the keys nor the columns
/// need a tail mask (12 sums, 3 loads and a broadcast: every register), else 2 (the
/// tail masks, set once per call, keep registers 14 and 15).
fn tile_vectors(wide: bool, keys: u64, width: u64, w: u64) -> u64 {
    if wide {
        4
    } else if keys.is_multiple_of(w) && width.is_multiple_of(w) {
        3
    } else {
        2
    }
}

/// The fixed geometry of a tiled kernel (strides in elements).
struct TileGeometry {
    w: u64,
    wide: bool,
    keys: u64,
    depth: u64,
    width: u64,
    st: Strides,
    nan_to_zero: bool,
    /// Strides along the query axis: Q, the mask, the output.
    q_row: i64,
    m_row: i64,
    o_row: i64,
    /// Floats per row of the scores on the stack (the keys rounded up to a vector).
    pitch: u64,
    /// Key vectors of a score group and column vectors of a `P·V` chunk.
    kv: u64,
    cv: u64,
}

/// Emits `k` with a tile of [`TILE_ROWS`] query rows of one (batch, head) per workgroup,
/// or `None` where it has no query axis or more than [`TILE_KEYS`] keys.
///
/// The rows of a tile share every load of K and V: their scores are a small matrix
/// product (keys in lanes, a group of key vectors by the tile's rows held in registers,
/// K's vectors loaded once per depth for all rows), written scaled and masked to the
/// stack; each row's softmax then runs over its stored scores (maximum, `exp`, sum:
/// one vector of keys at a time, the probabilities written back in place); and `P·V`
/// is a second small product (V's columns in lanes, a chunk of column vectors by the
/// rows in registers, a row of V loaded once per key for all rows) divided by the row
/// sums on the way out. The score matrix never reaches the arena: one tile's scores are
/// `TILE_ROWS × keys` floats of stack.
fn emit_tiled(k: &Kernel, wide: bool) -> R<Option<AttentionCode>> {
    let (at, dims, [keys, depth, width]) = operands(k)?;
    let rank = dims.len();
    if keys == 0 || depth == 0 || width == 0 || keys > TILE_KEYS || width > MAX_WIDTH {
        return Ok(None);
    }
    // The query axis: an outer output axis Q reads and K and V do not (the innermost).
    let Some(qa) = (0..rank - 1).rev().find(|&a| {
        let a = a as u32;
        dims[a as usize] > 1 && at.q.offset.of(a) != 0 && at.k.offset.of(a) == 0 && at.v.offset.of(a) == 0
    }) else {
        return Ok(None);
    };
    let w = if wide { 16 } else { 8 };
    let r = TILE_ROWS;
    // Output strides (row-major, elements).
    let out_coef: Vec<i64> = (0..rank).map(|a| dims[a + 1..].iter().product::<u64>() as i64).collect();
    let g = TileGeometry {
        w,
        wide,
        keys,
        depth,
        width,
        st: Strides::of(&at),
        nan_to_zero: at.nan_to_zero,
        q_row: at.q.offset.of(qa as u32),
        m_row: at.mask.as_ref().map_or(0, |(m, _)| m.offset.of(qa as u32)),
        o_row: out_coef[qa],
        pitch: keys.next_multiple_of(w),
        kv: tile_vectors(wide, keys, width, w),
        cv: tile_vectors(wide, keys, width, w),
    };
    let fits = |x: i64| x.checked_mul(4).is_some_and(|b| i32::try_from(b).is_ok_and(|b| b.abs() < i32::MAX / 2));
    let row_span = |s: i64| s.checked_mul(r as i64);
    let strides = [g.st.qe, g.st.ke, g.st.vj, g.q_row, g.m_row, g.o_row, (width + w) as i64];
    if !strides.iter().all(|&s| row_span(s).is_some_and(fits)) {
        return Ok(None);
    }
    let frame = (SCORES_AT as u64 + r * g.pitch * 4).next_multiple_of(16) as i32 + 8;
    // Workgroups: every outer output position, the query axis in blocks of `r` rows.
    let blocks = dims[qa].div_ceil(r);
    let counts: Vec<u64> = (0..rank - 1).map(|a| if a == qa { blocks } else { dims[a] }).collect();
    let workgroups: u64 = counts.iter().product();
    let ninputs = k.inputs.len() as u32;

    let mut a = CodeAssembler::new(64)?;
    let mut t = Tables::default();
    let (mut done, key_tail, col_tail) = open(&mut a, &mut t, frame, workgroups, wide, [keys, width, w])?;
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    // Base addresses: rbx Q, r12 K, r13 V, r14 the mask, r15 the output (the tile's
    // first row), each an input's address plus its offsets' coefficients times the
    // workgroup's coordinates.
    let out = Operand {
        input: ninputs,
        offset: kiln_flow::affine::AffineIndex { c: 0, coef: out_coef[..rank - 1].to_vec() },
    };
    let bases = load_bases(&mut a, &at, Some((r15, &out)))?;
    a.mov(rax, r10)?;
    for v in (0..rank - 1).rev() {
        if counts[v] == 1 {
            continue;
        }
        a.xor(edx, edx)?;
        a.mov(rcx, counts[v] as i64)?;
        a.div(rcx)?;
        if v == qa {
            a.mov(qword_ptr(rsp + BLOCK_AT), rdx)?;
        }
        for &(reg, op) in &bases {
            let coef = op.offset.of(v as u32) * if v == qa { r as i64 } else { 1 };
            if coef == 0 {
                continue;
            }
            if !fits(coef) {
                return Ok(None);
            }
            a.imul_3(r8, rdx, (coef * 4) as i32)?;
            a.add(reg, r8)?;
        }
    }
    let last_rows = dims[qa] % r;
    if last_rows == 0 || blocks == 1 {
        tile(&mut a, &mut t, &g, if last_rows == 0 { r } else { last_rows }, key_tail, col_tail)?;
    } else {
        let mut short = a.create_label();
        let mut next = a.create_label();
        a.cmp(qword_ptr(rsp + BLOCK_AT), (blocks - 1) as i32)?;
        a.je(short)?;
        tile(&mut a, &mut t, &g, r, key_tail, col_tail)?;
        a.jmp(next)?;
        a.set_label(&mut short)?;
        tile(&mut a, &mut t, &g, last_rows, key_tail, col_tail)?;
        a.set_label(&mut next)?;
    }
    a.inc(r10)?;
    a.cmp(r10, r11)?;
    a.jb(top)?;
    a.set_label(&mut done)?;
    leave(&mut a, frame)?;
    t.emit(&mut a)?;
    let digits = counts
        .iter()
        .enumerate()
        .map(|(i, &count)| super::WorkDigit { count, axis: Some((i, if i == qa { r } else { 1 })) })
        .collect();
    Ok(Some(AttentionCode { code: a.assemble(0)?, workgroups, wide, digits, rows: r }))
}

/// One tile of `rows` query rows (the bases in rbx, r12, r13, r14, r15): scores, each
/// row's softmax, `P·V` (see [`emit_tiled`]). Clobbers every vector register but the
/// masks, rax, rcx, rsi, rbp, r8 and r9.
fn tile(a: &mut CodeAssembler, t: &mut Tables, g: &TileGeometry, rows: u64, key_tail: Mask, col_tail: Mask) -> R<()> {
    let w = g.w;
    // Scores, a group of `kv` key vectors at a time (rbp the group's first key).
    let group = g.kv * w;
    let full = g.keys / group;
    a.xor(ebp, ebp)?;
    if full > 0 {
        let mut top = a.create_label();
        a.set_label(&mut top)?;
        score_group(a, t, g, rows, g.kv, None)?;
        a.add(rbp, group as i32)?;
        a.cmp(rbp, (full * group) as i32)?;
        a.jb(top)?;
    }
    let rest = g.keys % group;
    if rest > 0 {
        score_group(a, t, g, rows, rest.div_ceil(w), (!rest.is_multiple_of(w)).then_some(key_tail))?;
    }
    // Each row's softmax over its stored scores.
    let nvk = g.keys.div_ceil(w) as i64;
    let wb = (w * 4) as i32;
    for row in 0..rows {
        let base = SCORES_AT + (row * g.pitch * 4) as i32;
        let (m, s, x) = (V(0), V(1), V(2));
        let e = [V(3), V(4), V(5), V(6)];
        {
            let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
            vx.mov(m, Src::C(f32::NEG_INFINITY.to_bits()))?;
            vx.op(Op::Xor, s, s, Src::R(s))?;
        }
        vector_loop(a, nvk, wb, base, |a, at| {
            let mut vx = Vx { a, t: &mut *t, wide: g.wide, held: &[] };
            vx.op(Op::Max, m, m, Src::M(at))
        })?;
        {
            let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
            fold(&mut vx, Op::Max, m, x)?;
        }
        vector_loop(a, nvk, wb, base, |a, at| {
            let mut vx = Vx { a, t: &mut *t, wide: g.wide, held: &[] };
            vx.load(x, at, None)?;
            vx.op(Op::Sub, x, x, Src::R(m))?;
            vx.exp(x, x, e)?;
            vx.store(at, x, None)?;
            vx.op(Op::Add, s, s, Src::R(x))
        })?;
        let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
        fold(&mut vx, Op::Add, s, x)?;
        vx.store(ptr(rsp + SUMS_AT + (row * 64) as i32), s, None)?;
    }
    // P·V, a chunk of `cv` column vectors at a time, divided by the sums into the output.
    let ncol = g.width.div_ceil(w);
    let r = TILE_ROWS as u8;
    let cv = g.cv as u8;
    let mut c0 = 0;
    while c0 < ncol {
        let nc = g.cv.min(ncol - c0) as u8;
        let acc = |row: u64, c: u8| V(row as u8 * cv + c);
        let vr = |c: u8| V(r * cv + c);
        let (b0, b1) = broadcasts(g.wide, r * cv + cv);
        let col_mask = |c: u8| (c0 + c as u64 + 1 == ncol && !g.width.is_multiple_of(w)).then_some(col_tail);
        {
            let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
            for row in 0..rows {
                for c in 0..nc {
                    vx.op(Op::Xor, acc(row, c), acc(row, c), Src::R(acc(row, c)))?;
                }
            }
        }
        a.mov(r8, r13)?;
        a.lea(rsi, ptr(rsp + SCORES_AT))?;
        a.mov(rcx, g.keys as i64)?;
        let mut top = a.create_label();
        a.set_label(&mut top)?;
        {
            let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
            for c in 0..nc {
                vx.load(vr(c), ptr(r8 + ((c0 + c as u64) * w * 4) as i32), col_mask(c))?;
            }
            for row in 0..rows {
                let b = if row % 2 == 0 { b0 } else { b1 };
                vx.broadcast(b, dword_ptr(rsi + (row * g.pitch * 4) as i32))?;
                for c in 0..nc {
                    vx.op(Op::Fma231, acc(row, c), b, Src::R(vr(c)))?;
                }
            }
        }
        a.add(rsi, 4)?;
        add_imm(a, r8, g.st.vj * 4, rax)?;
        a.dec(rcx)?;
        a.jnz(top)?;
        let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
        // (On AVX2 a mask is a vector register: the second of V's, free here.)
        let nan = if g.wide { Mask(3) } else { Mask(vr(1).0) };
        let zero = vr(0);
        if g.nan_to_zero {
            vx.op(Op::Xor, zero, zero, Src::R(zero))?;
        }
        for row in 0..rows {
            vx.load(b0, ptr(rsp + SUMS_AT + (row * 64) as i32), None)?;
            if g.nan_to_zero {
                vx.cmp(nan, b0, Src::R(b0), 3)?;
            }
            for c in 0..nc {
                let x = acc(row, c);
                vx.op(Op::Div, x, x, Src::R(b0))?;
                if g.nan_to_zero {
                    vx.blend(x, nan, x, zero)?;
                }
                let at = ptr(r15 + (row as i64 * g.o_row * 4 + ((c0 + c as u64) * w * 4) as i64) as i32);
                vx.store(at, x, col_mask(c))?;
            }
        }
        c0 += nc as u64;
    }
    Ok(())
}

/// The scores of `rows` rows for a group of `nv` key vectors from key rbp, scaled,
/// masked and stored to the tile's score rows (lanes past the last key −∞, under
/// `last`, the key tail).
fn score_group(
    a: &mut CodeAssembler,
    t: &mut Tables,
    g: &TileGeometry,
    rows: u64,
    nv: u64,
    last: Option<Mask>,
) -> R<()> {
    let w = g.w;
    let kv = g.kv as u8;
    let r = TILE_ROWS as u8;
    let s = |row: u64, u: u64| V(row as u8 * kv + u as u8);
    let kr = |u: u64| V(r * kv + u as u8);
    let (b0, b1) = broadcasts(g.wide, r * kv + kv);
    let key_mask = |u: u64| if u + 1 == nv { last } else { None };
    {
        let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
        for row in 0..rows {
            for u in 0..nv {
                vx.op(Op::Xor, s(row, u), s(row, u), Src::R(s(row, u)))?;
            }
        }
    }
    a.mov(rsi, rbx)?;
    a.lea(r9, ptr(r12 + rbp * 4))?;
    a.mov(rcx, g.depth as i64)?;
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    {
        let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
        for u in 0..nv {
            vx.load(kr(u), ptr(r9 + (u * w * 4) as i32), key_mask(u))?;
        }
        for row in 0..rows {
            let b = if row % 2 == 0 { b0 } else { b1 };
            vx.broadcast(b, dword_ptr(rsi + (row as i64 * g.q_row * 4) as i32))?;
            for u in 0..nv {
                vx.op(Op::Fma231, s(row, u), b, Src::R(kr(u)))?;
            }
        }
    }
    add_imm(a, rsi, g.st.qe * 4, rax)?;
    add_imm(a, r9, g.st.ke * 4, rax)?;
    a.dec(rcx)?;
    a.jnz(top)?;
    mask_pointer(a, g.st.mask)?;
    let mut vx = Vx { a: &mut *a, t: &mut *t, wide: g.wide, held: &[] };
    let tmp = kr(0);
    for row in 0..rows {
        for u in 0..nv {
            let x = s(row, u);
            if g.st.scale != 1.0 {
                vx.op(Op::Mul, x, x, Src::C(g.st.scale.to_bits()))?;
            }
            if let Some((mj, ms)) = g.st.mask {
                let m_at = (row as i64 * g.m_row * 4) as i32;
                if mj == 0 {
                    vx.broadcast(tmp, dword_ptr(r8 + m_at))?;
                } else {
                    vx.load(tmp, ptr(r8 + m_at + (u * w * 4) as i32), key_mask(u))?;
                }
                if ms == 1.0 {
                    vx.op(Op::Add, x, x, Src::R(tmp))?;
                } else {
                    vx.op(Op::Fma231, x, tmp, Src::C(ms.to_bits()))?;
                }
            }
            if let Some(m) = key_mask(u) {
                vx.mov(tmp, Src::C(f32::NEG_INFINITY.to_bits()))?;
                vx.blend(x, m, tmp, x)?;
            }
            let at = ptr(rsp + rbp * 4 + SCORES_AT + ((row * g.pitch + u * w) * 4) as i32);
            vx.store(at, x, None)?;
        }
    }
    Ok(())
}

/// The registers the rows' broadcasts alternate between, from register `first`: two on
/// AVX-512, one on AVX2 (where a block of three vectors leaves one register free).
fn broadcasts(wide: bool, first: u8) -> (V, V) {
    if wide || first + 1 < 14 {
        (V(first), V(first + 1))
    } else {
        (V(first), V(first))
    }
}

/// `n` steps of `body` over consecutive vectors of the stack from `base` (a loop over
/// rax; unrolled where short).
fn vector_loop(
    a: &mut CodeAssembler,
    n: i64,
    step: i32,
    base: i32,
    mut body: impl FnMut(&mut CodeAssembler, AsmMemoryOperand) -> R<()>,
) -> R<()> {
    if n <= 4 {
        for i in 0..n {
            body(a, ptr(rsp + base + i as i32 * step))?;
        }
        return Ok(());
    }
    a.lea(rax, ptr(rsp + base))?;
    a.mov(rcx, n)?;
    let mut top = a.create_label();
    a.set_label(&mut top)?;
    body(a, ptr(rax))?;
    a.add(rax, step)?;
    a.dec(rcx)?;
    a.jnz(top)?;
    Ok(())
}

/// `x` folded across its lanes with `op` (the result in every lane), `tmp` scratch.
fn fold(vx: &mut Vx<'_>, op: Op, x: V, tmp: V) -> R<()> {
    let mut step = vx.lanes() / 2;
    while step >= 1 {
        vx.swap_lanes(tmp, x, step)?;
        vx.op(op, x, x, Src::R(tmp))?;
        step /= 2;
    }
    Ok(())
}
