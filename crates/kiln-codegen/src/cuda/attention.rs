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
//! layout), in f32: the storage-precision pass keeps an attention kernel's operands
//! and result f32 (`kiln_flow::precision`'s `Kept::Attention`), so under `--precision
//! f16|bf16` the products around it store half and this kernel still reads f32, and
//! accumulates in f32 either way.
//!
//! Masked keys (`S = −∞`) weigh 0; a row whose every key is masked gives NaN, as the
//! form's `exp(−∞ − −∞)` does, or 0 where the form guards its probabilities
//! (`nan_to_zero`). `exp` is `ex2.approx` of `x·log₂e`. Sums are reassociated, so the
//! result is within a small multiple of `(D + T)·2⁻²⁴` (relative to the row's
//! magnitudes) of the interpreter's. It declines heads wider than 256 (depth or
//! columns) and a mask or V that is not f32.
//!
//! This is the kernel `KILN_CUDA_TUNE=attn=on` runs, exact f32 throughout; `attn=flash`
//! runs the tensor-core kernel of [`super::flash`] instead (f16 operands, heads whose
//! depth and width are multiples of 16 up to 128) and this one on what that declines
//! (f32 heads of other sizes: odd depths, heads up to 256).

use kiln_flow::attention::{Attention, Operand};
use kiln_flow::Kernel;
use kiln_ir::DType;

use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::rows::shfl_bfly;
use super::{decompose, internal, Entry, Ids, Launch, BLOCK, MAX_GRID};
use crate::CodegenError;

/// Most 32-lane slices of the depth or of the columns a lane keeps in registers.
const MAX_SLICES: usize = 8;

fn f32imm(x: f32) -> Opd {
    Imm::F32(x.to_bits()).into()
}

/// The attention entry of `k`, or why it declines: the tensor-core kernel
/// ([`super::flash`]) where `flash` asks for it (`KILN_CUDA_TUNE=attn=flash`) and it
/// takes the head, else the warp-per-row kernel below (whose note then says why not
/// the other).
pub fn emit(k: &Kernel, flash: bool) -> Result<Result<Entry, String>, CodegenError> {
    let Some(a) = Attention::of(k) else { return Ok(Err("not of the attention form".into())) };
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
    if k.output.dtype != DType::F32 {
        return Ok(Err(format!("a {} result", k.output.dtype)));
    }
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
        p.op("mad.lo.s64", &[d.into(), e.into(), Imm::I(4).into(), bases[o.input as usize].into()]);
        d
    };
    let ld = |p: &mut Ptx, at: Reg| -> Reg {
        let r = p.reg(RegClass::F32);
        p.op("ld.global.f32", &[r.into(), Opd::Addr(at, 0)]);
        r
    };
    // Q's slices of the row, 0 past the depth.
    let qo = offset(&mut p, &a.q);
    let mut qv = Vec::with_capacity(ds);
    for &(e, inside) in &es {
        let at = addr(&mut p, &a.q, qo, &[(e, a.q.offset.of(a.depth))]);
        let x = ld(&mut p, at);
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
        let x = ld(&mut p, at);
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
        let x = ld(&mut p, at);
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
        let x = ld(&mut p, at);
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
        p.op("mad.lo.s64", &[at.into(), flat.into(), Imm::I(4).into(), bases[k.inputs.len()].into()]);
        p.op_if(inside, false, "st.global.f32", &[Opd::Addr(at, 0), y.into()]);
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
