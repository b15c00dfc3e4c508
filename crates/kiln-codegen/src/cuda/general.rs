//! The general thread mapping: one thread per output element (grid-stride), the
//! element's whole expression evaluated in that thread, reductions as loops
//! ([`super::expr`]). It takes every kernel the expression evaluator handles, whatever
//! its class: the correct fallback under every class emitter.
//!
//! A 4-bit output (`i4`, `u4`: two elements a byte, the lower index in the low nibble)
//! takes one thread per *byte* instead: it evaluates both elements (the second at a
//! clamped index past an odd count, whose nibble is then 0, as `Tensor` pads) and
//! writes the byte with one `st.global.u8`, so no two threads write the same byte.

use kiln_flow::Kernel;

use super::expr::{is_nibble, Eval};
use super::ptx::{Imm, Opd, Ptx, RegClass};
use super::{decompose, internal, launch, Entry, Skeleton};
use crate::CodegenError;

/// The entry of `k` under the general mapping.
pub fn emit(k: &Kernel) -> Result<Entry, CodegenError> {
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
