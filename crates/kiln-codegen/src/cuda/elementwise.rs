//! Elementwise and Movement kernels: 128-bit groups along the innermost axis.
//!
//! A thread of the grid-stride loop takes a group of `V` consecutive output elements
//! of one row, computes them lane by lane and stores them with one vector store. The
//! group is `V · size` bytes and aligned to that: bindings are 64-byte aligned and rows
//! hold a multiple of `V` elements. Nodes that do not read the innermost output
//! variable are evaluated once per group.
//!
//! **Lanes.** Outputs of 4 or 8 bytes an element take `V = 16 / size` (4 or 2 lanes)
//! and `st.global.v{V}` of their own type. Outputs of 1 or 2 bytes (i8, u8, bool; f16,
//! bf16, i16, u16) take the widest group of 16, 8 or 4 bytes whose lanes divide the row
//! (`V` = 16, 8 or 4 one-byte lanes; 8, 4 or 2 two-byte lanes) and store it as 32-bit
//! words with one `st.global.v4.b32`, `.v2.b32` or `.b32`. Each lane's value is
//! converted exactly as the scalar store converts it ([`Eval::narrow`]: an f32 rounded
//! to nearest even by `cvt.rn.f16.f32`/`cvt.rn.bf16.f32`, a bool as 1 or 0, an integer
//! as its low bits), then packed: two 16-bit lanes into a word by `mov.b32 w, {lo, hi}`
//! (lower element in the low half, as memory is little-endian), four 1-byte lanes by
//! two levels of `prmt.b32` (bytes `{a.0, b.0}` of each pair, then the two low halves).
//! The per-lane `cvt.rn` is kept rather than `cvt.rn.f16x2.f32`: it is the store's own
//! instruction, so the rounding (NaN included) is the general mapping's by
//! construction; ptxas packs the pair either way.
//!
//! **Vector loads.** A load whose innermost index is the innermost output variable
//! itself, whose other indices do not read it, of an input whose rows hold a multiple
//! of `V` elements, reads the group's `V` elements at once (aligned to their `V ·
//! size_in` bytes for the same reason as the store): an input of the output's element
//! size (4 or 8 bytes), as before, with one `ld.global.v{V}` of its type; with a 1- or
//! 2-byte output, an input of 4 or 8 bytes too, in 16-byte pieces (`ld.global.v4.f32`
//! twice for 8 lanes of f32); and an input of 1 or 2 bytes an element whose group is
//! 4 bytes or more, as 32-bit words (`ld.global.b32`, `.v2.b32`, `.v4.b32`, 16-byte
//! pieces), unpacked lane by lane into exactly what the element's scalar `ld` gives
//! ([`Eval::widen`] then converts it as for a scalar load: f16/bf16 widened exactly by
//! `cvt.f32.f16`/`cvt.f32.bf16`): `mov.b32 {lo, hi}, w` for 16-bit lanes (then
//! `cvt.s32.s16`/`cvt.u32.u16` for integers), `shr.u32` and `cvt.s32.s8`/`cvt.u32.u8`
//! for bytes. A half → half kernel thus reads and writes 128 bits a thread. (1- and
//! 2-byte inputs of a kernel with a 4-byte output are read so too: a bool mask of an
//! f32 select is one `ld.global.b32` a group.)
//!
//! Declined (to the general mapping): rows of a length that is not a multiple of the
//! narrowest group (4 lanes of 4 bytes, 2 of 8, 2 of 2 bytes, 4 of 1 byte), storage
//! types outside [`storage`] (8-bit floats and 4-bit integers, which the general
//! mapping stores; 6/4-bit floats), rank-0 outputs.

use std::collections::HashSet;

use kiln_flow::class::KernelClass;
use kiln_flow::{Bounds, Expr, ExprId, Kernel, ScalarType};
use kiln_ir::DType;

use super::expr::{class, storage, Eval};
use super::ptx::{Imm, Opd, Ptx, Reg, RegClass};
use super::tune::Elt;
use super::{decompose, internal, launch, Entry, Skeleton};
use crate::CodegenError;

/// The entry of `k`, or why this emitter declines it.
pub fn emit(k: &Kernel, kclass: KernelClass, elt: &Elt) -> Result<Result<Entry, String>, CodegenError> {
    let dims = k.output.shape.dims().to_vec();
    let Some(&row) = dims.last() else { return Ok(Err("rank-0 output".into())) };
    let size = k.output.dtype.storage_bytes(1);
    if !matches!(size, 1 | 2 | 4 | 8) || storage(k.output.dtype).is_none() {
        return Ok(Err(format!("{} output", k.output.dtype.name())));
    }
    let narrow = size <= 2;
    let lanes = if narrow {
        // The widest group of whole 32-bit words that tiles the row.
        match [16, 8, 4].into_iter().map(|g| g / size).find(|&l| row % l == 0) {
            Some(l) => l,
            None => return Ok(Err(format!("rows of {row} elements, not a multiple of {}", 4 / size))),
        }
    } else {
        16 / size
    };
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
        let s = t.dtype.storage_bytes(1);
        let Some((_, half)) = storage(t.dtype) else { continue };
        let kind = match s {
            4 | 8 => (s == size && half.is_none()) || narrow,
            1 | 2 => s * lanes >= 4,
            _ => false,
        };
        let aligned = kind && idims.last().is_some_and(|&d| d % lanes == 0);
        let at_inner = matches!(k.node(last).expr, Expr::Var(v) if v.0 == inner);
        if aligned && at_inner && !outer.iter().any(|&e| reads_inner(e)) {
            vector.push(ExprId(i as u32));
        }
    }
    let numel = k.output.shape.numel() as u64;
    let groups = numel / lanes as u64;
    // The cache hint of the vector loads and stores: streaming (`.cs`, evicted first)
    // where the kernel moves more bytes than the L2 cache holds (nothing it touches
    // could stay there for the next kernel; a 4M-element a·b + c measured 3–5% faster
    // on an H100), else the default; `elt=cs`/`elt=ca` force either.
    let moved: u64 = k.inputs.iter().chain([&k.output]).map(|t| t.storage_bytes() as u64).sum();
    let hint = if elt.streaming.unwrap_or(moved > super::L2_BYTES) { ".cs" } else { "" };
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
        let regs = load_group(&mut ev, addr, t.dtype, k.node(e).ty, lanes, hint)?;
        vector_lanes.push((e, regs));
    }
    ev.pop_scope();
    let root_ty = k.node(k.root).ty;
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
        let v = ev.value(k.root)?;
        values.push(if narrow { ev.narrow(v, k.output.dtype, root_ty)? } else { v });
        ev.pop_scope();
    }
    let addr = ev.address(out_base, first, k.output.dtype)?;
    let store = if narrow {
        let words = pack(&mut ev, &values, size, k.output.dtype);
        let op = vec_op(&format!("st.global{hint}"), words.len(), "b32");
        let data = if words.len() == 1 { words[0].into() } else { Opd::Vec(words) };
        ev.p.op(&op, &[Opd::Addr(addr, 0), data]);
        op.trim_start_matches("st.global.").to_string()
    } else {
        let st = storage(k.output.dtype).map_or("b32", |(s, _)| s);
        ev.p.op(&format!("st.global{hint}.v{lanes}.{st}"), &[Opd::Addr(addr, 0), Opd::Vec(values)]);
        format!("{}v{lanes}", hint.trim_start_matches('.'))
    };
    sk.close(&mut p);
    let text = p.finish().map_err(|e| internal(k, e))?;
    let note = if narrow {
        format!("{} ({lanes} lanes, {store} store, {} vector loads)", kclass.name(), vector.len())
    } else {
        format!("{} ({store} store, {} vector loads)", kclass.name(), vector.len())
    };
    let mut launch = launch(k, groups);
    if let Some(g) = elt.max_grid {
        launch.grid = launch.grid.min(g);
    }
    Ok(Ok(Entry { text, launch, note }))
}

/// `ld`/`st` opcode `base` of `n` elements of type `ty`: `base.ty` for one,
/// `base.v{n}.ty` for 2 or 4.
fn vec_op(base: &str, n: usize, ty: &str) -> String {
    if n == 1 {
        format!("{base}.{ty}")
    } else {
        format!("{base}.v{n}.{ty}")
    }
}

/// Loads the `lanes` consecutive elements of storage `dtype` at `addr` (aligned to
/// their total size) and returns each lane's value of compute type `t`: in 16-byte
/// pieces (or one piece of the group's 4 or 8 bytes), elements of 4 or 8 bytes as
/// themselves, narrower ones as 32-bit words unpacked to what their scalar `ld` gives.
fn load_group(
    ev: &mut Eval<'_, '_>,
    addr: Reg,
    dtype: DType,
    t: ScalarType,
    lanes: usize,
    hint: &str,
) -> Result<Vec<Reg>, CodegenError> {
    let s = dtype.storage_bytes(1);
    let st = storage(dtype).map_or("b32", |(st, _)| st);
    let bytes = s * lanes;
    let piece = bytes.min(16);
    let mut out = Vec::with_capacity(lanes);
    for c in 0..bytes / piece {
        let at = Opd::Addr(addr, (c * piece) as i64);
        if s >= 4 {
            let n = piece / s;
            let regs: Vec<Reg> = (0..n).map(|_| ev.p.reg(class(t))).collect();
            let data = if n == 1 { regs[0].into() } else { Opd::Vec(regs.clone()) };
            ev.p.op(&vec_op(&format!("ld.global{hint}"), n, st), &[data, at]);
            out.extend(regs);
            continue;
        }
        let n = piece / 4;
        let words: Vec<Reg> = (0..n).map(|_| ev.p.reg(RegClass::B32)).collect();
        let data = if n == 1 { words[0].into() } else { Opd::Vec(words.clone()) };
        ev.p.op(&vec_op(&format!("ld.global{hint}"), n, "b32"), &[data, at]);
        for w in words {
            for raw in unpack(ev, w, s, st) {
                out.push(ev.widen(raw, dtype, t)?);
            }
        }
    }
    Ok(out)
}

/// The elements of word `w` (of `s`-byte elements, `ld` type `st`), lowest address
/// first, each as its scalar `ld.global.{st}` leaves it: a `.b16` register for 16-bit
/// floats, 32 bits sign- or zero-extended for integers and bools.
fn unpack(ev: &mut Eval<'_, '_>, w: Reg, s: usize, st: &str) -> Vec<Reg> {
    let p = &mut *ev.p;
    if s == 2 {
        let halves = vec![p.reg(RegClass::B16), p.reg(RegClass::B16)];
        p.op("mov.b32", &[Opd::Vec(halves.clone()), w.into()]);
        return match st {
            "s16" | "u16" => {
                let (to, u) = if st == "s16" { ("s32", "s16") } else { ("u32", "u16") };
                halves
                    .into_iter()
                    .map(|h| {
                        let r = p.reg(RegClass::B32);
                        p.op(&format!("cvt.{to}.{u}"), &[r.into(), h.into()]);
                        r
                    })
                    .collect()
            }
            _ => halves,
        };
    }
    let to = if st == "s8" { "s32" } else { "u32" };
    (0..4)
        .map(|b| {
            let x = if b == 0 {
                w
            } else {
                let x = p.reg(RegClass::B32);
                p.op("shr.u32", &[x.into(), w.into(), Imm::I(8 * b).into()]);
                x
            };
            let r = p.reg(RegClass::B32);
            p.op(&format!("cvt.{to}.{st}"), &[r.into(), x.into()]);
            r
        })
        .collect()
}

/// The 32-bit words of the stored lanes `v` (each as [`Eval::narrow`] gives it) of
/// `size`-byte elements of `dtype`, lowest address in the lowest bits.
fn pack(ev: &mut Eval<'_, '_>, v: &[Reg], size: usize, dtype: DType) -> Vec<Reg> {
    let p = &mut *ev.p;
    if size == 2 {
        let half = storage(dtype).is_some_and(|(_, h)| h.is_some());
        let h: Vec<Reg> = v
            .iter()
            .map(|&r| {
                if half {
                    return r;
                }
                let h = p.reg(RegClass::B16);
                p.op("cvt.u16.u32", &[h.into(), r.into()]);
                h
            })
            .collect();
        return h
            .chunks(2)
            .map(|pair| {
                let w = p.reg(RegClass::B32);
                p.op("mov.b32", &[w.into(), Opd::Vec(pair.to_vec())]);
                w
            })
            .collect();
    }
    let prmt = |p: &mut Ptx, a: Reg, b: Reg, sel: u64| {
        let d = p.reg(RegClass::B32);
        p.op("prmt.b32", &[d.into(), a.into(), b.into(), Imm::U(sel).into()]);
        d
    };
    v.chunks(4)
        .map(|q| {
            // Byte 0 of a, byte 0 of b (selector 4) in the low half of each pair …
            let lo = prmt(p, q[0], q[1], 0x0040);
            let hi = prmt(p, q[2], q[3], 0x0040);
            // … then the pairs' low halves: bytes 0, 1 of lo and 0, 1 of hi (4, 5).
            prmt(p, lo, hi, 0x5410)
        })
        .collect()
}
