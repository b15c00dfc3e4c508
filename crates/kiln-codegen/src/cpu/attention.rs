//! Attention kernels (`KernelClass::Attention`, the form of `kiln_flow::attention`) as
//! machine code: flash-attention style, one query row per workgroup.
//!
//! A workgroup is one position of every output dimension but the innermost (the
//! columns of V), so the rows of every (batch, head, query) are split across the
//! plan's threads like any dispatch's. Per row, with the row's base addresses decoded
//! from the workgroup number through the operands' affine offsets:
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
//! block-sized stack slot; nothing of the `queries × keys` score matrix reaches memory.
//! K is read along its keys at unit stride and V along its columns (what
//! `Attention::in_place` promises); Q at any stride of its depth. Vectors of 8 lanes
//! (AVX2 + FMA) or 16 (AVX-512 F), through [`super::vector`]; `exp` is
//! [`super::math`]'s inline polynomial, the one the row kernels use. The sum over keys
//! runs in a different order from the unfused softmax and product (blocks rescaled as
//! the maximum grows), so results differ from them by rounding only.

use iced_x86::code_asm::*;
use kiln_flow::attention::Attention;
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
}

/// The fixed geometry of one kernel.
struct Geometry {
    /// Lanes per vector.
    w: u64,
    depth: u64,
    width: u64,
    /// Strides, in elements: Q and K along the depth, V along the keys.
    qe: i64,
    ke: i64,
    vj: i64,
    /// The mask's stride along the keys (0 or 1), if there is a mask.
    mask: Option<(i64, f32)>,
    scale: f32,
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

/// Register roles (vector numbers).
const Q_BCAST: V = V(4);
const EXP_T: [V; 4] = [V(5), V(6), V(7), V(8)];
const RUN_MAX: V = V(9);
const RUN_SUM: V = V(10);
const NEW_MAX: V = V(11);
const T0: V = V(12);
const T1: V = V(13);
const P_BCAST: V = V(8);

/// Emits attention kernel `k` (8 lanes, or 16 where `wide`).
pub(crate) fn emit(k: &Kernel, wide: bool) -> R<AttentionCode> {
    let Some(at) = Attention::of(k) else { return no("not an attention kernel") };
    if !at.in_place() {
        return no("attention operands not at unit stride (K along keys, V along columns)");
    }
    let rank = k.out_rank();
    let dims: Vec<u64> = k.output.shape.dims().iter().map(|&d| d as u64).collect();
    let var = |v: u32| k.vars.get(v as usize).copied().unwrap_or(0);
    let (keys, depth, width) = (var(at.key), var(at.depth), dims[rank - 1]);
    if keys == 0 || depth == 0 || width == 0 || width > MAX_WIDTH {
        return no(format!("attention of {keys} keys, depth {depth}, {width} columns"));
    }
    let w = if wide { 16 } else { 8 };
    let acc_vectors = width.div_ceil(w);
    let block = BLOCK_VECTORS * w;
    let g = Geometry {
        w,
        depth,
        width,
        qe: at.q.offset.of(at.depth),
        ke: at.k.offset.of(at.depth),
        vj: at.v.offset.of(at.key),
        mask: at.mask.as_ref().map(|(m, s)| (m.offset.of(at.key), *s)),
        scale: at.scale,
        acc_vectors,
        acc_at: (block * 4) as i32,
    };
    let frame = ((block + acc_vectors * w) * 4).next_multiple_of(16) as i32 + 8;
    // Every byte offset the code adds must fit an immediate.
    let fits = |x: i64| x.checked_mul(4).is_some_and(|b| i32::try_from(b).is_ok());
    // (Two depths and two keys a step; a block's vectors lie within 256 bytes past them.)
    if ![2 * g.qe + 64, 2 * g.ke + 64, 2 * g.vj + 64, (width * 4) as i64].iter().all(|&x| fits(x.abs() + 64)) {
        return no("attention strides beyond 32-bit offsets");
    }
    let rows: u64 = dims[..rank - 1].iter().product();
    let ninputs = k.inputs.len() as i32;

    let mut a = CodeAssembler::new(64)?;
    let mut t = Tables::default();
    enter(&mut a)?;
    a.sub(rsp, frame)?;
    // rdi bindings, rdx begin, rcx end (clamped to the row count).
    a.mov(rax, rows as i64)?;
    a.cmp(rcx, rax)?;
    a.cmova(rcx, rax)?;
    a.mov(r10, rdx)?;
    a.mov(r11, rcx)?;
    let mut done = a.create_label();
    a.cmp(r10, r11)?;
    a.jae(done)?;
    let (key_tail, col_tail) = if wide { (KEY_TAIL_K, COL_TAIL_K) } else { (KEY_TAIL, COL_TAIL) };
    {
        let mut vx = Vx { a: &mut a, t: &mut t, wide, held: &[] };
        if !keys.is_multiple_of(w) {
            vx.first_lanes(key_tail, keys % w, eax)?;
        }
        if !width.is_multiple_of(w) {
            vx.first_lanes(col_tail, width % w, eax)?;
        }
    }

    let mut row_top = a.create_label();
    a.set_label(&mut row_top)?;
    // Base addresses: rbx Q, r12 K, r13 V, r14 the mask, r15 the output row.
    let bases: Vec<(AsmRegister64, &kiln_flow::attention::Operand)> =
        [Some((rbx, &at.q)), Some((r12, &at.k)), Some((r13, &at.v)), at.mask.as_ref().map(|(m, _)| (r14, m))]
            .into_iter()
            .flatten()
            .collect();
    for &(r, op) in &bases {
        a.mov(r, qword_ptr(rdi + 8 * op.input as i32))?;
        add_imm(&mut a, r, op.offset.c.wrapping_mul(4), rax)?;
    }
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
    Ok(AttentionCode { code: a.assemble(0)?, workgroups: rows, wide })
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
        step(a, t, &[(&s, Q_BCAST, 0, 0), (&s2, T1, g.qe, g.ke)])?;
        add_imm(a, rsi, 2 * g.qe * 4, rax)?;
        add_imm(a, r9, 2 * g.ke * 4, rax)?;
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
    if let Some((mj, _)) = g.mask {
        if mj == 0 {
            a.mov(r8, r14)?;
        } else {
            a.lea(r8, ptr(r14 + rbp * 4))?;
        }
    }
    let mut vx = Vx { a: &mut *a, t: &mut *t, wide, held: &[] };
    for (u, &r) in s.iter().enumerate() {
        if g.scale != 1.0 {
            vx.op(Op::Mul, r, r, Src::C(g.scale.to_bits()))?;
        }
        if let Some((mj, ms)) = g.mask {
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
    horizontal(&mut vx, Op::Max, T0)?;
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
    horizontal(&mut vx, Op::Add, T0)?;
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
        a.imul_3(r8, rbp, (g.vj * 4) as i32)?;
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
                    let at = ptr(r8 + (key * g.vj * 4 + (col * w * 4) as i64) as i32);
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
            add_imm(a, r8, 2 * g.vj * 4, rax)?;
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

/// `x` folded across its lanes with `op`, the result in every lane (through `T1`).
fn horizontal(vx: &mut Vx<'_>, op: Op, x: V) -> R<()> {
    let mut step = vx.lanes() / 2;
    while step >= 1 {
        vx.swap_lanes(T1, x, step)?;
        vx.op(op, x, x, Src::R(T1))?;
        step /= 2;
    }
    Ok(())
}
