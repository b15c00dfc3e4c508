//! Attention kernels ([`KernelClass::Attention`](kiln_flow::class::KernelClass)) on the
//! CUDA target: a warp per query row, an online softmax, no score matrix in memory.
//!
//! The kernel's form is `kiln_flow::attention`'s: for each query row (every output
//! variable but the last), `out[c] = Σ_j softmax_j(S(j))·V[j, c]` with `S(j) =
//! s·Σ_e Q[e]·K[e, j] + s_m·mask[j]`. A warp walks the rows grid-stride; its lanes
//! split the depth `e` (lane `l` holds `Q[l + 32u]` in registers) and the columns `c`
//! (lane `l` accumulates `c = l + 32r`). For each key `j` in turn the lanes' partial
//! products are summed by a butterfly of shuffles, so every lane holds `S(j)`, and the
//! running maximum `m`, the running sum `l = Σ exp(S − m)` and the accumulators are
//! rescaled when the maximum grows (`exp(m_old − m_new)`), flash-attention style; the
//! row's result is `acc / l`. Every operand is read through its affine offset (any
//! layout) as it is stored: f32, or f16/bf16 widened exactly (`cvt.f32.f16/bf16`,
//! where the storage-precision pass narrowed it: on CUDA it narrows an attention
//! kernel's operands and result like any other buffer); the arithmetic is f32, and a
//! half result is rounded once to nearest even, as the interpreter's store does.

//! Masked keys (`S = −∞`) weigh 0; a row whose every key is masked gives NaN, as the
//! form's `exp(−∞ − −∞)` does, or 0 where the form guards its probabilities
//! (`nan_to_zero`). `exp` is `ex2.approx` of `x·log₂e`. Sums are reassociated, so the
//! result is within a small multiple of `(D + T)·2⁻²⁴` (relative to the row's
//! magnitudes) of the interpreter's. It declines heads wider than 256 (depth or
//! columns).
//!
//! This is the kernel `KILN_CUDA_TUNE=attn=on` runs, and the one f32 attention
//! kernels take; the tensor-core kernel of [`super::flash`] runs where Q, K or V is
//! stored half (the default at `--precision f16|bf16`) or `attn=flash` asks for it,
//! and this one on the heads that declines (other than multiples of 16 up to 128).

use kiln_flow::attention::{Attention, Operand};
use kiln_flow::Kernel;
use kiln_ir::DType;

use super::expr::storage;
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::rows::shfl_bfly;
use super::tune::Attn;
use super::{decompose, internal, Entry, Ids, Launch, BLOCK, MAX_GRID};
use crate::CodegenError;

/// Most 32-lane slices of the depth or of the columns a lane keeps in registers.
const MAX_SLICES: usize = 8;

fn f32imm(x: f32) -> Opd {
    Imm::F32(x.to_bits()).into()
}

/// The attention entry of `k`, or why it declines: the tensor-core kernel
/// ([`super::flash`]) where `mode` asks for it (`KILN_CUDA_TUNE=attn=flash`) or, by
/// default, where Q, K or V is stored half, and it takes the head; else the
/// warp-per-row kernel below (whose note then says why not the other).
pub fn emit(k: &Kernel, mode: Option<Attn>) -> Result<Result<Entry, String>, CodegenError> {
    let Some(a) = Attention::of(k) else { return Ok(Err("not of the attention form".into())) };
    let half = [&a.q, &a.k, &a.v].iter().any(|o| Attention::dtype(k, o) != DType::F32);
    let flash = match mode {
        Some(m) => m == Attn::Flash,
        None => half,
    };
    let mut declined = None;
    if flash {
        match super::flash::emit(k, &a)? {
            Ok(e) => return Ok(Ok(e)),
            Err(why) => declined = Some(why),
        }
    }
    let var = |v: u32| k.vars.get(v as usize).copied().unwrap_or(0);
    let (depth, keys, width) = (var(a.depth), var(a.key), var(a.column));
    let (ds, cs) = ((depth as usize).div_ceil(32), (width as usize).div_ceil(32));
    if ds > MAX_SLICES || cs > MAX_SLICES || depth == 0 || width == 0 {
        return Ok(Err(format!("a head of depth {depth} and width {width} (at most {} each)", 32 * MAX_SLICES)));
    }
    let Some((out_st, out_cvt)) = storage(k.output.dtype) else {
        return Ok(Err(format!("a {} result", k.output.dtype)));
    };
    let esize = |d: DType| d.storage_bytes(1) as i64;
    let dims = k.output.shape.dims().to_vec();
    let rank = dims.len();
    let rows: u64 = dims[..rank - 1].iter().map(|&d| d as u64).product();
    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    let bases = p.binding_bases(k.inputs.len() + 1);
    let ids = Ids::read(&mut p);
    let g = ids.global_thread(&mut p);
    let threads = ids.grid_threads(&mut p);
    // The warp's first row and the rows' stride; the lane.
    let row = p.reg(RegClass::B64);
    p.op("shr.u64", &[row.into(), g.into(), Imm::I(5).into()]);
    let stride = p.reg(RegClass::B64);
    p.op("shr.u64", &[stride.into(), threads.into(), Imm::I(5).into()]);
    let lane32 = p.reg(RegClass::B32);
    p.op("and.b32", &[lane32.into(), ids.tid.into(), Imm::I(31).into()]);
    let lane = p.reg(RegClass::B64);
    p.op("cvt.u64.u32", &[lane.into(), lane32.into()]);
    // The lane's depth and column slices: index (clamped into range) and whether it
    // is in range.
    let slices = |p: &mut Ptx, n: u64, count: usize| -> Vec<(Reg, Reg)> {
        (0..count)
            .map(|u| {
                let i = p.reg(RegClass::B64);
                p.op("add.s64", &[i.into(), lane.into(), Imm::I(32 * u as i64).into()]);
                let inside = p.reg(RegClass::Pred);
                p.op("setp.lt.u64", &[inside.into(), i.into(), Imm::U(n).into()]);
                let c = p.reg(RegClass::B64);
                p.op("min.u64", &[c.into(), i.into(), Imm::U(n - 1).into()]);
                (c, inside)
            })
            .collect()
    };
    let es = slices(&mut p, depth, ds);
    let cols = slices(&mut p, width, cs);

    let (head, end) = (p.label(), p.label());
    p.place(head);
    let done = p.reg(RegClass::Pred);
    p.op("setp.ge.u64", &[done.into(), row.into(), Imm::U(rows).into()]);
    p.branch(Some((done, false)), end);
    let outer = decompose(&mut p, row, &dims[..rank - 1]);
    // An operand's element offset at the row's outer variables.
    let offset = |p: &mut Ptx, o: &Operand| -> Reg {
        let r = p.reg(RegClass::B64);
        p.op("mov.b64", &[r.into(), Imm::I(o.offset.c).into()]);
        for (v, &reg) in outer.iter().enumerate() {
            let c = o.offset.of(v as u32);
            if c != 0 {
                p.op("mad.lo.s64", &[r.into(), reg.into(), Imm::I(c).into(), r.into()]);
            }
        }
        r
    };
    // The address of element `off + Σ idx·coef` of input `o`.
    let addr = |p: &mut Ptx, o: &Operand, off: Reg, terms: &[(Reg, i64)]| -> Reg {
        let e = p.reg(RegClass::B64);
        p.op("mov.b64", &[e.into(), off.into()]);
        for &(r, c) in terms {
            if c != 0 {
                p.op("mad.lo.s64", &[e.into(), r.into(), Imm::I(c).into(), e.into()]);
            }
        }
        let d = p.reg(RegClass::B64);
        let size = esize(k.inputs[o.input as usize].dtype);
        p.op("mad.lo.s64", &[d.into(), e.into(), Imm::I(size).into(), bases[o.input as usize].into()]);
        d
    };
    // A load of operand `o` widened to f32.
    let ld = |p: &mut Ptx, o: &Operand, at: Reg| -> Reg {
        let r = p.reg(RegClass::F32);
        match storage(Attention::dtype(k, o)) {
            Some((_, Some(half))) => {
                let h = p.reg(RegClass::B16);
                p.op("ld.global.b16", &[h.into(), Opd::Addr(at, 0)]);
                p.op(&format!("cvt.f32.{half}"), &[r.into(), h.into()]);
            }
            _ => p.op("ld.global.f32", &[r.into(), Opd::Addr(at, 0)]),
        }
        r
    };
    // Q's slices of the row, 0 past the depth.
    let qo = offset(&mut p, &a.q);
    let mut qv = Vec::with_capacity(ds);
    for &(e, inside) in &es {
        let at = addr(&mut p, &a.q, qo, &[(e, a.q.offset.of(a.depth))]);
        let x = ld(&mut p, &a.q, at);
        let q = p.reg(RegClass::F32);
        p.op("selp.f32", &[q.into(), x.into(), f32imm(0.0), inside.into()]);
        qv.push(q);
    }
    let ko = offset(&mut p, &a.k);
    let vo = offset(&mut p, &a.v);
    let mo = a.mask.as_ref().map(|(m, _)| offset(&mut p, m));
    let m = p.mov(RegClass::F32, "f32", f32imm(f32::NEG_INFINITY));
    let l = p.mov(RegClass::F32, "f32", f32imm(0.0));
    let acc: Vec<Reg> = (0..cs).map(|_| p.mov(RegClass::F32, "f32", f32imm(0.0))).collect();
    let j = p.mov(RegClass::B64, "u64", Imm::I(0).into());
    let (kl, kend) = (p.label(), p.label());
    p.place(kl);
    let kdone = p.reg(RegClass::Pred);
    p.op("setp.ge.u64", &[kdone.into(), j.into(), Imm::U(keys).into()]);
    p.bra(Some((kdone, false)), kend);
    // The lane's share of Σ_e Q·K, then the warp's sum in every lane.
    let s = p.mov(RegClass::F32, "f32", f32imm(0.0));
    for (u, &(e, inside)) in es.iter().enumerate() {
        let at = addr(&mut p, &a.k, ko, &[(e, a.k.offset.of(a.depth)), (j, a.k.offset.of(a.key))]);
        let x = ld(&mut p, &a.k, at);
        let kx = p.reg(RegClass::F32);
        p.op("selp.f32", &[kx.into(), x.into(), f32imm(0.0), inside.into()]);
        p.op("fma.rn.f32", &[s.into(), qv[u].into(), kx.into(), s.into()]);
    }
    for off in [16, 8, 4, 2, 1] {
        let o = shfl_bfly(&mut p, s, off);
        p.op("add.rn.f32", &[s.into(), s.into(), o.into()]);
    }
    p.op("mul.rn.f32", &[s.into(), s.into(), f32imm(a.scale)]);
    if let (Some((mop, ms)), Some(mo)) = (&a.mask, mo) {
        let at = addr(&mut p, mop, mo, &[(j, mop.offset.of(a.key))]);
        let x = ld(&mut p, mop, at);
        p.op("fma.rn.f32", &[s.into(), x.into(), f32imm(*ms), s.into()]);
    }
    // The online softmax: the new maximum, the old terms' factor and this key's weight
    // (0 and 1 while every score so far is −∞).
    let exp = |p: &mut Ptx, x: Reg| -> Reg {
        let t = p.reg(RegClass::F32);
        p.op("mul.rn.f32", &[t.into(), x.into(), f32imm(std::f32::consts::LOG2_E)]);
        let e = p.reg(RegClass::F32);
        p.op("ex2.approx.f32", &[e.into(), t.into()]);
        e
    };
    let mn = p.reg(RegClass::F32);
    p.op("max.f32", &[mn.into(), m.into(), s.into()]);
    let none = p.reg(RegClass::Pred);
    p.op("setp.eq.f32", &[none.into(), mn.into(), f32imm(f32::NEG_INFINITY)]);
    let dm = p.reg(RegClass::F32);
    p.op("sub.rn.f32", &[dm.into(), m.into(), mn.into()]);
    let corr = exp(&mut p, dm);
    p.op("selp.f32", &[corr.into(), f32imm(1.0), corr.into(), none.into()]);
    let ds_ = p.reg(RegClass::F32);
    p.op("sub.rn.f32", &[ds_.into(), s.into(), mn.into()]);
    let w = exp(&mut p, ds_);
    p.op("selp.f32", &[w.into(), f32imm(0.0), w.into(), none.into()]);
    p.op("fma.rn.f32", &[l.into(), l.into(), corr.into(), w.into()]);
    for (r, &(c, _)) in cols.iter().enumerate() {
        let at = addr(&mut p, &a.v, vo, &[(j, a.v.offset.of(a.key)), (c, a.v.offset.of(a.column))]);
        let x = ld(&mut p, &a.v, at);
        p.op("mul.rn.f32", &[acc[r].into(), acc[r].into(), corr.into()]);
        p.op("fma.rn.f32", &[acc[r].into(), w.into(), x.into(), acc[r].into()]);
    }
    p.op("mov.f32", &[m.into(), mn.into()]);
    p.op("add.s64", &[j.into(), j.into(), Imm::I(1).into()]);
    p.bra(None, kl);
    p.place(kend);
    // The row's results: acc / l, stored by the lanes whose column exists.
    for (r, &(c, inside)) in cols.iter().enumerate() {
        let y = p.reg(RegClass::F32);
        p.op("div.rn.f32", &[y.into(), acc[r].into(), l.into()]);
        if a.nan_to_zero {
            let nan = p.reg(RegClass::Pred);
            p.op("setp.nan.f32", &[nan.into(), y.into(), y.into()]);
            p.op("selp.f32", &[y.into(), f32imm(0.0), y.into(), nan.into()]);
        }
        let flat = p.reg(RegClass::B64);
        p.op("mad.lo.s64", &[flat.into(), row.into(), Imm::I(width as i64).into(), c.into()]);
        let at = p.reg(RegClass::B64);
        p.op(
            "mad.lo.s64",
            &[at.into(), flat.into(), Imm::I(esize(k.output.dtype)).into(), bases[k.inputs.len()].into()],
        );
        match out_cvt {
            Some(half) => {
                let h = p.reg(RegClass::B16);
                p.op(&format!("cvt.rn.{half}.f32"), &[h.into(), y.into()]);
                p.op_if(inside, false, "st.global.b16", &[Opd::Addr(at, 0), h.into()]);
            }
            None => p.op_if(inside, false, &format!("st.global.{out_st}"), &[Opd::Addr(at, 0), y.into()]),
        }
    }
    p.op("add.s64", &[row.into(), row.into(), stride.into()]);
    p.bra(None, head);
    p.place(end);
    let text = p.finish().map_err(|e| internal(k, e))?;
    let warps = u64::from(BLOCK / 32);
    let launch = Launch {
        grid: rows.div_ceil(warps).clamp(1, MAX_GRID),
        block: BLOCK,
        shared: 0,
        params: (k.inputs.len() + 1) as u32,
    };
    let not_flash = declined.map(|why| format!("; not on the tensor cores: {why}")).unwrap_or_default();
    let note = format!("attention (a warp per query row: {keys} keys, depth {depth}, {width} columns{not_flash})");
    Ok(Ok(Entry { text, launch, note }))
}
