//! Operand tiles copied into a ring of shared-memory stages: the copy machinery the
//! tensor-core kernels share ([`super::mma`]'s `mma.sync` pipeline and
//! [`super::wgmma`]'s warpgroup pipeline).
//!
//! Each thread copies [`items`] items of an operand's `rows × bk` tile per `k` step,
//! item `e` at [`item`] (16-byte `cp.async` chunks of 8 elements, or single elements
//! staged through registers: [`Feed`]). [`src`] fixes, once before the loop, each
//! item's row predicate, element offset, global pointer (where the operand is linear
//! in `k`) and shared slot in the first stage; [`issue`] issues one step's copies into
//! a stage (`cp.async.cg.shared.global`, zero-filled out of range, or predicated
//! `ld.global.b16` into registers that [`store`] writes after the step's math) and
//! steps the pointers. The caller commits the group (`cp.async.commit_group`) and
//! waits for it as its pipeline needs.
//!
//! What differs between the kernels is a [`Ring`]: the `k` step, the block's threads,
//! the shared layout of a tile (its offset function in PTX) and which items may be
//! addressed compactly from the thread's first (see `mma`'s module docs, "Variants").

use super::contraction::{linear, operand_element, operand_row, pred, u32_op, Map, Var};
use super::mma::{Feed, Layout};
use super::ptx::{Imm, Label, Opd, Ptx, Reg, RegClass};

/// Items (chunks or elements) of a `rows × bk` tile each of `threads` copies.
pub fn items(f: Feed, rows: u32, (bk, threads): (u32, u32)) -> u32 {
    if f.cp {
        rows * bk / 8 / threads
    } else {
        rows * bk / threads
    }
}

/// Item `e` of thread `tid` of `threads`: `(r, k)` within a tile of `rows` rows and
/// `bk` `k`, its first element (a chunk holds 8 elements along `k` (KMajor) or `r`
/// (RMajor)). Consecutive threads take consecutive chunks or elements along the stored
/// rows. (Register-staged items need `threads` ≥ `bk` and ≥ `rows`: 256 threads.)
pub fn item(f: Feed, rows: u32, (bk, threads): (u32, u32), tid: u32, e: u32) -> (u32, u32) {
    match (f.cp, f.layout) {
        (true, Layout::KMajor) => {
            let (q, per) = (tid + threads * e, bk / 8);
            (q / per, 8 * (q % per))
        }
        (true, Layout::RMajor) => {
            let (q, per) = (tid + threads * e, rows / 8);
            (8 * (q % per), q / per)
        }
        (false, Layout::KMajor) => (tid / bk + (threads / bk) * e, tid % bk),
        (false, Layout::RMajor) => (tid % rows, tid / rows + (threads / rows) * e),
    }
}

/// What a kernel's pipeline fixes for its copies.
pub(super) struct Ring<'a> {
    /// The plan's reduction variables.
    pub ks: &'a [Var],
    /// `k` per step.
    pub bk: u32,
    /// Threads of the block (all copy).
    pub threads: u32,
    /// The byte offset of element `(r, k)` (u32 registers) of a tile of `rows` rows
    /// in `layout` within a stage, in PTX: the kernel's shared layout.
    pub smem: &'a dyn Fn(&mut Ptx, Layout, u32, Reg, Reg) -> Reg,
    /// Where item `e` of an operand fed by `f` in a tile of `rows` rows may be
    /// addressed from item 0 (`(dr, dk, shared bytes)` the same for every thread), or
    /// `None` for an item of its own.
    pub compact: &'a dyn Fn(Feed, u32, u32) -> Option<(u32, u32, i64)>,
}

/// One item a thread copies per step.
pub(super) struct Item {
    /// The tile row of item 0 of its thread (what [`item`] gives).
    r_in: Reg,
    /// `k` within the step: a register plus a constant.
    k_in: (Reg, u32),
    /// The tile row (chunk) is in range.
    in_range: Reg,
    /// Element offset of `(row, k = 0)`, batch included.
    off: Reg,
    /// Byte offset of its shared slot within a stage: a register plus a constant.
    sts: (Reg, i64),
    /// Where `k` is linear: the global address at the next step to issue, a register
    /// plus a constant, and whether this item steps the register (its owner).
    ptr: Option<(Reg, i64, bool)>,
}

/// One operand's copies.
pub(super) struct Src {
    feed: Feed,
    map: Map,
    items: Vec<Item>,
    /// Element offset per unit of `k` where linear.
    linear: Option<i64>,
    base: Reg,
}

/// The copies of `map` (tile of `rows` rows from row `first` of `total`), into
/// stages from shared address `first_stage`.
#[allow(clippy::too_many_arguments)]
pub(super) fn src(
    ring: &Ring,
    p: &mut Ptx,
    f: Feed,
    map: &Map,
    (rows, first, total): (u32, Reg, u64),
    vars: &[Var],
    (bat, base): (Reg, Reg),
    (tid, k_start): (Reg, Option<Reg>),
    first_stage: Reg,
) -> Src {
    let (bk, nt) = (ring.bk, ring.threads);
    let lin = linear(ring.ks, map, bk);
    let mut out: Vec<Item> = Vec::new();
    for e in 0..items(f, rows, (bk, nt)) {
        // Compact addressing (where `ring.compact` allows: mma's `cp.async` operands
        // under the knob's pipelines; its default keeps a pointer and a shared offset
        // per item, as wgmma does): item e at a
        // constant distance from item 0 in rows, k and shared bytes, its global
        // address item 0's plus a constant where k is linear and the rows one
        // variable (or the same rows). 40 fewer registers live through the loop at
        // a step of 64 (168 → 128: two blocks a multiprocessor). Register-staged
        // operands keep theirs (a 3×3 window's weights would spill).
        let compact = (ring.compact)(f, rows, e);
        if let (Some((dr, dk, ds)), Some(step), Some(i0)) = (compact, lin, out.first()) {
            let row_coef = match vars {
                _ if dr == 0 => Some(0),
                [(v, _)] => Some(map.at(*v)),
                _ => None,
            };
            let bytes = row_coef
                .and_then(|c| c.checked_mul(i64::from(dr)))
                .and_then(|x| x.checked_add(step.checked_mul(i64::from(dk))?))
                .and_then(|x| x.checked_mul(2))
                .filter(|&x| i32::try_from(x).is_ok());
            if let (Some(bytes), Some((a, _, _))) = (bytes, i0.ptr) {
                let in_range = if dr == 0 {
                    i0.in_range
                } else {
                    // first + r_in0 + dr < total.
                    let r = u32_op(p, "add.u32", first, i0.r_in.into());
                    pred(p, "setp.lt.u32", r, Imm::U(total.saturating_sub(u64::from(dr))).into())
                };
                out.push(Item {
                    r_in: i0.r_in,
                    k_in: (i0.k_in.0, dk),
                    in_range,
                    off: i0.off,
                    sts: (i0.sts.0, ds),
                    ptr: Some((a, bytes, false)),
                });
                continue;
            }
        }
        // `item` in PTX.
        let (r_in, k_in) = match (f.cp, f.layout) {
            (true, Layout::KMajor) => {
                let per = bk / 8;
                let q = u32_op(p, "add.u32", tid, Imm::U(u64::from(nt * e)).into());
                let r = u32_op(p, "shr.u32", q, Imm::U(u64::from(per.trailing_zeros())).into());
                let c = u32_op(p, "and.b32", q, Imm::U(u64::from(per - 1)).into());
                (r, u32_op(p, "shl.b32", c, Imm::U(3).into()))
            }
            (true, Layout::RMajor) => {
                let q = u32_op(p, "add.u32", tid, Imm::U(u64::from(nt * e)).into());
                let per = rows / 8;
                let c = u32_op(p, "rem.u32", q, Imm::U(per.into()).into());
                let r = u32_op(p, "shl.b32", c, Imm::U(3).into());
                (r, u32_op(p, "div.u32", q, Imm::U(per.into()).into()))
            }
            (false, Layout::KMajor) => {
                let r = u32_op(p, "shr.u32", tid, Imm::U(u64::from(bk.trailing_zeros())).into());
                let r = u32_op(p, "add.u32", r, Imm::U(u64::from((nt / bk) * e)).into());
                (r, u32_op(p, "and.b32", tid, Imm::U(u64::from(bk - 1)).into()))
            }
            (false, Layout::RMajor) => {
                let r = u32_op(p, "rem.u32", tid, Imm::U(rows.into()).into());
                let k = u32_op(p, "div.u32", tid, Imm::U(rows.into()).into());
                (r, u32_op(p, "add.u32", k, Imm::U(u64::from((nt / rows) * e)).into()))
            }
        };
        let (in_range, off, ptr) =
            operand_row(p, (map, vars, bat), (first, r_in, total), lin, (k_in, k_start), (base, 2));
        let sts = (ring.smem)(p, f.layout, rows, r_in, k_in);
        let sts = u32_op(p, "add.u32", sts, first_stage.into());
        out.push(Item { r_in, k_in: (k_in, 0), in_range, off, sts: (sts, 0), ptr: ptr.map(|a| (a, 0, true)) });
    }
    Src { feed: f, map: map.clone(), items: out, linear: lin, base }
}

/// Issues step `k0` of `s` into the stage `stage` bytes past the first: `cp.async` chunks, or loads
/// into fresh b16 registers (returned; the caller stores them). Steps the pointers.
pub(super) fn issue(ring: &Ring, p: &mut Ptx, s: &Src, (k0, k_end): (Reg, &Opd), stage: u32) -> Vec<Reg> {
    let mut vals = Vec::new();
    for it in &s.items {
        let k_in = match it.k_in {
            (r, 0) => r,
            (r, dk) => u32_op(p, "add.u32", r, Imm::U(dk.into()).into()),
        };
        let (ok, (addr, imm)) = operand_element(
            p,
            (ring.ks, &s.map),
            (k0, k_in, k_end),
            (it.in_range, it.off, it.ptr.map(|(a, off, _)| (a, off))),
            (s.base, 2),
        );
        let addr = if imm == 0 {
            addr
        } else {
            let a = p.reg(RegClass::B64);
            p.op("add.s64", &[a.into(), addr.into(), Imm::I(imm).into()]);
            a
        };
        if s.feed.cp {
            // Out of range: nothing read (src-size 0, from the base), 16 zero bytes.
            let src = p.reg(RegClass::B64);
            p.op("selp.b64", &[src.into(), addr.into(), s.base.into(), ok.into()]);
            let n = p.reg(RegClass::B32);
            p.op("selp.u32", &[n.into(), Imm::U(16).into(), Imm::U(0).into(), ok.into()]);
            let dst = Opd::Addr(it.sts.0, it.sts.1 + i64::from(stage));
            p.op("cp.async.cg.shared.global", &[dst, Opd::Addr(src, 0), Imm::U(16).into(), n.into()]);
        } else {
            let v = p.reg(RegClass::B16);
            p.op("mov.b16", &[v.into(), Imm::I(0).into()]);
            p.op_if(ok, false, "ld.global.b16", &[v.into(), Opd::Addr(addr, 0)]);
            vals.push(v);
        }
    }
    if let Some(step) = s.linear {
        for it in &s.items {
            if let Some((a, _, true)) = it.ptr {
                p.op("add.s64", &[a.into(), a.into(), Imm::I(step * i64::from(ring.bk) * 2).into()]);
            }
        }
    }
    vals
}

/// The pipeline's prologue: steps `0 .. ahead` of both operands (`a`, `b`, their stages
/// `a_stage` and `b_stage` bytes apart) copied into stages `0 .. ahead`, register-staged
/// elements stored as soon as read, each step its own `cp.async` group; `kq`, the step's
/// first `k`, advances by [`Ring::bk`] a step.
pub(super) fn prologue(
    ring: &Ring,
    p: &mut Ptx,
    (a, b): (&Src, &Src),
    (a_stage, b_stage): (u32, u32),
    (kq, k_end): (Reg, &Opd),
    ahead: u32,
) {
    for st in 0..ahead {
        let va = issue(ring, p, a, (kq, k_end), st * a_stage);
        let vb = issue(ring, p, b, (kq, k_end), st * b_stage);
        store(p, a, &va, st * a_stage);
        store(p, b, &vb, st * b_stage);
        p.op("cp.async.commit_group", &[]);
        p.op("add.u32", &[kq.into(), kq.into(), Imm::U(ring.bk.into()).into()]);
    }
}

/// The main loop's control, unrolled over the stages: copy `u` of the body runs the steps
/// `t ≡ u (mod stages)`, and the loop leaves after the last step.
pub(super) struct Steps {
    /// How many: `k_chunk / bk`.
    count: u64,
    /// The step counter (u32).
    step: Reg,
    /// Where the first copy of the body starts.
    head: Label,
    /// Past the loop (the caller places it after the last copy).
    pub exit: Label,
    /// Copies of the body.
    stages: u32,
}

impl Steps {
    /// Starts the loop over `k_chunk` in steps of [`Ring::bk`] here: the counter at 0, the
    /// first copy of the body next.
    pub(super) fn open(ring: &Ring, p: &mut Ptx, k_chunk: u64, stages: u32) -> Steps {
        let step = p.mov(RegClass::B32, "u32", Imm::U(0).into());
        let (head, exit) = (p.label(), p.label());
        p.place(head);
        Steps { count: k_chunk / u64::from(ring.bk), step, head, exit, stages }
    }

    /// Ends copy `u` of the body: `kq` (the step's first `k`) advanced by [`Ring::bk`] and
    /// the counter by 1, then out after the last step, or (the last copy) back to the first
    /// while steps remain.
    pub(super) fn end_copy(&self, ring: &Ring, p: &mut Ptx, kq: Reg, u: u32) {
        p.op("add.u32", &[kq.into(), kq.into(), Imm::U(ring.bk.into()).into()]);
        p.op("add.u32", &[self.step.into(), self.step.into(), Imm::U(1).into()]);
        let more = pred(p, "setp.lt.u32", self.step, Imm::U(self.count).into());
        if u + 1 < self.stages {
            p.bra(Some((more, true)), self.exit);
        } else {
            p.bra(Some((more, false)), self.head);
        }
    }
}

/// Stores register-staged `vals` of `s` into the stage `stage` bytes past the first.
pub(super) fn store(p: &mut Ptx, s: &Src, vals: &[Reg], stage: u32) {
    for (it, &v) in s.items.iter().zip(vals) {
        p.op("st.shared.b16", &[Opd::Addr(it.sts.0, it.sts.1 + i64::from(stage)), v.into()]);
    }
}
