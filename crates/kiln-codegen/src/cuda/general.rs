//! The general thread mapping: one thread per output element (grid-stride), the
//! element's whole expression evaluated in that thread, reductions as loops
//! ([`super::expr`]). It takes every kernel the expression evaluator handles, whatever
//! its class: the correct fallback under every class emitter.
//!
//! A 4-bit output (`i4`, `u4`: two elements a byte, the lower index in the low nibble)
//! takes one thread per *byte* instead: it evaluates both elements (the second at a
//! clamped index past an odd count, whose nibble is then 0, as `Tensor` pads) and
//! writes the byte with one `st.global.u8`, so no two threads write the same byte.
//!
//! A scatter kernel (`kiln_flow::kernel`'s "Scatter kernels") runs in one block
//! ([`emit_scatter`]): its threads copy input 0 into the output unless the two are the
//! same bytes (the planner's in-place placement), `bar.sync`, then thread 0 stores every
//! point of the domain in row-major order. Duplicates therefore fold in the kernel's
//! order, exactly as the interpreter and the CPU do (no atomics, whose order would make
//! `none` and float sums nondeterministic); the points are few where scatters are used.

use kiln_flow::Kernel;

use super::expr::{is_nibble, Eval};
use super::ptx::{Imm, Opd, Ptx, RegClass};
use super::{decompose, internal, launch, Entry, Launch, Skeleton, BLOCK};
use crate::CodegenError;

/// The entry of `k` under the general mapping.
pub fn emit(k: &Kernel) -> Result<Entry, CodegenError> {
    if k.scatter.is_some() {
        return emit_scatter(k);
    }
    if is_nibble(k.output.dtype) {
        return emit_nibbles(k);
    }
    let numel = k.output.shape.numel() as u64;
    let dims = k.output.shape.dims().to_vec();
    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    let sk = Skeleton::open(&mut p, k.inputs.len() + 1, numel);
    let vars = decompose(&mut p, sk.group, &dims);
    let out_base = sk.bases[k.inputs.len()];
    let mut ev = Eval::new(k, &mut p, sk.bases[..k.inputs.len()].to_vec());
    for (d, &r) in vars.iter().enumerate() {
        ev.set_var(d, r);
    }
    let v = ev.value(k.root)?;
    let addr = ev.address(out_base, sk.group, k.output.dtype)?;
    ev.store_at(addr, k.output.dtype, k.node(k.root).ty, v)?;
    sk.close(&mut p);
    let text = p.finish().map_err(|e| internal(k, e))?;
    Ok(Entry { text, launch: launch(k, numel), note: "general".into() })
}

/// The general mapping of a kernel with a 4-bit output: a thread per output byte.
fn emit_nibbles(k: &Kernel) -> Result<Entry, CodegenError> {
    let numel = k.output.shape.numel() as u64;
    let bytes = numel.div_ceil(2);
    let dims = k.output.shape.dims().to_vec();
    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    let sk = Skeleton::open(&mut p, k.inputs.len() + 1, bytes);
    let out_base = sk.bases[k.inputs.len()];
    let first = p.reg(RegClass::B64);
    p.op("shl.b64", &[first.into(), sk.group.into(), Imm::I(1).into()]);
    // The second element, clamped to the last one (then stored as 0).
    let second = p.reg(RegClass::B64);
    p.op("add.s64", &[second.into(), first.into(), Imm::I(1).into()]);
    let has2 = p.reg(RegClass::Pred);
    p.op("setp.lt.u64", &[has2.into(), second.into(), Imm::U(numel).into()]);
    let clamped = p.reg(RegClass::B64);
    p.op("min.u64", &[clamped.into(), second.into(), Imm::U(numel.saturating_sub(1)).into()]);
    let mut nibbles = Vec::new();
    for flat in [first, clamped] {
        let vars = decompose(&mut p, flat, &dims);
        let mut ev = Eval::new(k, &mut p, sk.bases[..k.inputs.len()].to_vec());
        for (d, &r) in vars.iter().enumerate() {
            ev.set_var(d, r);
        }
        let v = ev.value(k.root)?;
        // The value's low four bits (the interpreter's store).
        let n = ev.p.reg(RegClass::B32);
        ev.p.op("and.b32", &[n.into(), v.into(), Imm::I(0xF).into()]);
        nibbles.push(n);
    }
    let hi = p.reg(RegClass::B32);
    p.op("selp.b32", &[hi.into(), nibbles[1].into(), Imm::I(0).into(), has2.into()]);
    let byte = p.reg(RegClass::B32);
    p.op("shl.b32", &[byte.into(), hi.into(), Imm::I(4).into()]);
    p.op("or.b32", &[byte.into(), byte.into(), nibbles[0].into()]);
    let addr = p.reg(RegClass::B64);
    p.op("add.s64", &[addr.into(), out_base.into(), sk.group.into()]);
    p.op("st.global.u8", &[Opd::Addr(addr, 0), byte.into()]);
    sk.close(&mut p);
    let text = p.finish().map_err(|e| internal(k, e))?;
    Ok(Entry { text, launch: launch(k, bytes), note: "general (4-bit output: a thread per byte)".into() })
}

/// A scatter kernel in one block (see the module docs).
pub fn emit_scatter(k: &Kernel) -> Result<Entry, CodegenError> {
    let Some(sc) = &k.scatter else {
        return Err(CodegenError::Internal { kernel: k.name.clone(), what: "not a scatter".into() });
    };
    let n = k.inputs.len();
    let mut p = Ptx::new(&k.name, n + 1);
    let bases = p.binding_bases(n + 1);
    let (src, dst) = (bases[0], bases[n]);
    let tid = p.special("%tid.x");
    let ntid = p.special("%ntid.x");
    // The copy of input 0, skipped when it is the output's bytes (every thread agrees).
    let same = p.reg(RegClass::Pred);
    p.op("setp.eq.u64", &[same.into(), src.into(), dst.into()]);
    let copied = p.label();
    p.bra(Some((same, false)), copied);
    let bytes = k.output.storage_bytes() as u64;
    let (unit, st) = if bytes % 4 == 0 { (4u64, "u32") } else { (1, "u8") };
    let i = p.reg(RegClass::B64);
    p.op("cvt.u64.u32", &[i.into(), tid.into()]);
    let step = p.reg(RegClass::B64);
    p.op("cvt.u64.u32", &[step.into(), ntid.into()]);
    let (head, end) = (p.label(), p.label());
    p.place(head);
    let done = p.reg(RegClass::Pred);
    p.op("setp.ge.u64", &[done.into(), i.into(), Imm::U(bytes / unit).into()]);
    p.branch(Some((done, false)), end);
    let off = p.reg(RegClass::B64);
    p.op("mul.lo.u64", &[off.into(), i.into(), Imm::U(unit).into()]);
    let from = p.reg(RegClass::B64);
    p.op("add.s64", &[from.into(), src.into(), off.into()]);
    let x = p.reg(RegClass::B32);
    p.op(&format!("ld.global.{st}"), &[x.into(), Opd::Addr(from, 0)]);
    let to = p.reg(RegClass::B64);
    p.op("add.s64", &[to.into(), dst.into(), off.into()]);
    p.op(&format!("st.global.{st}"), &[Opd::Addr(to, 0), x.into()]);
    p.op("add.s64", &[i.into(), i.into(), step.into()]);
    p.branch(None, head);
    p.place(end);
    p.place(copied);
    p.op("bar.sync", &[Imm::I(0).into()]);
    // Thread 0 stores the points in order.
    let others = p.reg(RegClass::Pred);
    p.op("setp.ne.u32", &[others.into(), tid.into(), Imm::U(0).into()]);
    let fin = p.label();
    p.branch(Some((others, false)), fin);
    let domain: Vec<usize> = k.vars[..sc.rank].iter().map(|&d| d as usize).collect();
    let points: u64 = k.vars[..sc.rank].iter().product();
    let q = p.reg(RegClass::B64);
    p.op("mov.u64", &[q.into(), Imm::U(0).into()]);
    let (head, end) = (p.label(), p.label());
    p.place(head);
    let done = p.reg(RegClass::Pred);
    p.op("setp.ge.u64", &[done.into(), q.into(), Imm::U(points).into()]);
    p.branch(Some((done, false)), end);
    let vars = decompose(&mut p, q, &domain);
    let skip = p.label();
    {
        let mut ev = Eval::new(k, &mut p, bases[..n].to_vec());
        for (d, &r) in vars.iter().enumerate() {
            ev.set_var(d, r);
        }
        let at = ev.value(sc.at)?;
        // (A negative position is a large unsigned one.)
        let outside = ev.p.reg(RegClass::Pred);
        ev.p.op("setp.ge.u64", &[outside.into(), at.into(), Imm::U(k.output.shape.numel() as u64).into()]);
        ev.p.branch(Some((outside, false)), skip);
        let t = k.node(k.root).ty;
        let mut v = ev.value(k.root)?;
        let addr = ev.address(dst, at, k.output.dtype)?;
        if let Some(op) = sc.combine {
            let old = ev.load_at(addr, k.output.dtype, t, None)?;
            v = ev.binary(op, t, old, v)?;
        }
        ev.store_at(addr, k.output.dtype, t, v)?;
    }
    p.place(skip);
    p.op("add.s64", &[q.into(), q.into(), Imm::U(1).into()]);
    p.branch(None, head);
    p.place(end);
    p.place(fin);
    let text = p.finish().map_err(|e| internal(k, e))?;
    let launch = Launch { grid: 1, block: BLOCK, shared: 0, params: (n + 1) as u32 };
    Ok(Entry { text, launch, note: "scatter (one block: a parallel copy, then the points in order)".into() })
}
