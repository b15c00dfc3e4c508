//! The general thread mapping: one thread per output element (grid-stride), the
//! element's whole expression evaluated in that thread, reductions as loops
//! ([`super::expr`]). It takes every kernel the expression evaluator handles, whatever
//! its class: the correct fallback under every class emitter.

use kiln_flow::Kernel;

use super::expr::Eval;
use super::ptx::Ptx;
use super::{decompose, internal, launch, Entry, Skeleton};
use crate::CodegenError;

/// The entry of `k` under the general mapping.
pub fn emit(k: &Kernel) -> Result<Entry, CodegenError> {
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
