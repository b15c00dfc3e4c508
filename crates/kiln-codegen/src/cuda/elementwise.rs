//! Elementwise and Movement kernels: 128-bit groups along the innermost axis.
//!
//! A thread of the grid-stride loop takes a group of `V` consecutive output elements
//! of one row (`V` = 16 bytes / element size: 4 for 32-bit outputs, 2 for 64-bit
//! ones), computes them lane by lane and stores them with one `st.global.v{V}`. The
//! group is 16-byte aligned: bindings are 64-byte aligned and rows hold a multiple of
//! `V` elements. Nodes that do not read the innermost output variable are evaluated
//! once per group. A load whose innermost index is the innermost output variable
//! itself, whose other indices do not read it, of an input with elements of the
//! output's size and rows of a multiple of `V` elements, reads all lanes with one
//! `ld.global.v{V}` (its group is aligned for the same reason as the store's).
//!
//! Declined (to the general mapping): rows of a length that is not a multiple of `V`,
//! outputs of 1 or 2 bytes an element, rank-0 outputs.

use std::collections::HashSet;

use kiln_flow::class::KernelClass;
use kiln_flow::{Bounds, Expr, ExprId, Kernel};

use super::expr::{class, storage, Eval};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::{decompose, internal, launch, Entry, Skeleton};
use crate::CodegenError;

/// The entry of `k`, or why this emitter declines it.
pub fn emit(k: &Kernel, kclass: KernelClass) -> Result<Result<Entry, String>, CodegenError> {
    let dims = k.output.shape.dims().to_vec();
    let Some(&row) = dims.last() else { return Ok(Err("rank-0 output".into())) };
    let size = k.output.dtype.storage_bytes(1);
    if !(size == 4 || size == 8) || storage(k.output.dtype).is_none() {
        return Ok(Err(format!("{} output", k.output.dtype.name())));
    }
    let lanes = 16 / size;
    if row % lanes != 0 {
        return Ok(Err(format!("rows of {row} elements, not a multiple of {lanes}")));
    }
    let inner = (dims.len() - 1) as u32;
    let free = k.free_vars();
    let reads_inner = |e: ExprId| free[e.index()].contains(&inner);
    // Loads that read all lanes at once.
    let mut vector: Vec<ExprId> = Vec::new();
    for (i, n) in k.nodes.iter().enumerate() {
        let Expr::Load { input, index, bounds: Bounds::InBounds } = &n.expr else { continue };
        let t = &k.inputs[*input as usize];
        let Some((&last, outer)) = index.split_last() else { continue };
        let idims = t.shape.dims();
        let aligned = t.dtype.storage_bytes(1) == size
            && storage(t.dtype).is_some_and(|(_, half)| half.is_none())
            && idims.last().is_some_and(|&d| d % lanes == 0);
        let at_inner = matches!(k.node(last).expr, Expr::Var(v) if v.0 == inner);
        if aligned && at_inner && !outer.iter().any(|&e| reads_inner(e)) {
            vector.push(ExprId(i as u32));
        }
    }
    let numel = k.output.shape.numel() as u64;
    let groups = numel / lanes as u64;
    let mut p = Ptx::new(&k.name, k.inputs.len() + 1);
    let sk = Skeleton::open(&mut p, k.inputs.len() + 1, groups);
    let first = p.reg(RegClass::B64);
    p.op("mul.lo.s64", &[first.into(), sk.group.into(), Imm::I(lanes as i64).into()]);
    let vars = decompose(&mut p, first, &dims);
    let out_base = sk.bases[k.inputs.len()];
    let mut ev = Eval::new(k, &mut p, sk.bases[..k.inputs.len()].to_vec());
    for (d, &r) in vars.iter().enumerate().take(dims.len() - 1) {
        ev.set_var(d, r);
    }
    // Everything that does not read the innermost variable, once per group.
    ev.hoist_where(k.root, &|_, e| !reads_inner(e), &mut HashSet::new())?;
    ev.set_var(inner as usize, vars[inner as usize]);
    let mut vector_lanes: Vec<(ExprId, Vec<Reg>)> = Vec::new();
    // The vector loads' addresses read the innermost variable at lane 0: their values
    // (the variable's node among them) live in a scope of their own, so that no lane
    // finds lane 0's value of a node reading the innermost variable.
    ev.push_scope();
    for &e in &vector {
        let Expr::Load { input, index, .. } = &k.node(e).expr else { continue };
        let t = &k.inputs[*input as usize];
        let idims = t.shape.dims().to_vec();
        let mut flat: Option<Reg> = None;
        for (&i, &n) in index.iter().zip(&idims) {
            let i = ev.value(i)?;
            flat = Some(match flat {
                None => i,
                Some(f) => {
                    let d = ev.p.reg(RegClass::B64);
                    ev.p.op("mad.lo.s64", &[d.into(), f.into(), Imm::I(n as i64).into(), i.into()]);
                    d
                }
            });
        }
        let Some(flat) = flat else { continue };
        let addr = ev.address(ev.input(*input as usize), flat, t.dtype)?;
        let ty = k.node(e).ty;
        let regs: Vec<Reg> = (0..lanes).map(|_| ev.p.reg(class(ty))).collect();
        let st = storage(t.dtype).map_or("b32", |(s, _)| s);
        ev.p.op(&format!("ld.global.v{lanes}.{st}"), &[Opd::Vec(regs.clone()), Opd::Addr(addr, 0)]);
        vector_lanes.push((e, regs));
    }
    ev.pop_scope();
    let mut values = Vec::with_capacity(lanes);
    for j in 0..lanes {
        let v = if j == 0 {
            vars[inner as usize]
        } else {
            let r = ev.p.reg(RegClass::B64);
            ev.p.op("add.s64", &[r.into(), vars[inner as usize].into(), Imm::I(j as i64).into()]);
            r
        };
        ev.set_var(inner as usize, v);
        ev.given = vector_lanes.iter().map(|(e, regs)| (*e, regs[j])).collect();
        ev.push_scope();
        values.push(ev.value(k.root)?);
        ev.pop_scope();
    }
    let addr = ev.address(out_base, first, k.output.dtype)?;
    let st = storage(k.output.dtype).map_or("b32", |(s, _)| s);
    ev.p.op(&format!("st.global.v{lanes}.{st}"), &[Opd::Addr(addr, 0), Opd::Vec(values)]);
    sk.close(&mut p);
    let text = p.finish().map_err(|e| internal(k, e))?;
    let note = format!("{} (v{lanes} store, {} vector loads)", kclass.name(), vector.len());
    Ok(Ok(Entry { text, launch: launch(k, groups), note }))
}
