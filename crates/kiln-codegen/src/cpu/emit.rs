//! Cranelift IR for one kernel: the loop nest of [`super::analysis`], each node
//! evaluated once per iteration of its scope, in one of two modes.
//!
//! - **Scalar**: one element per iteration; values have the node's own type (`Bool`
//!   is an `i8` holding 0 or 1).
//! - **Vector** along a variable `u`: four consecutive values of `u` per iteration.
//!   Nodes that read `u` are `f32x4`/`i32x4` values (a `Bool` is an `i32x4` mask of
//!   all-ones or zero lanes); nodes that do not read `u` stay scalar and are splatted
//!   where a vector operand needs them. Addresses stay scalar: the address of lane 0,
//!   the other lanes being the next elements (the analysis only allows contiguous
//!   loads). A scalar tail loop finishes the last `extent % 4` iterations.
//!
//! The innermost output loop runs in vector mode when everything it evaluates allows
//! (per-lane results are bit-identical to scalar ones). A reduce evaluated in scalar
//! mode whose innermost variable allows it may run that variable's loop in vector mode
//! with a vector accumulator (exact for integer sums and for max/min; float sums and
//! products are then reassociated, which only [`Options::reassociate`] permits).

use std::collections::HashMap;

use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::immediates::{Ieee32, Ieee64};
use cranelift_codegen::ir::{
    types, AbiParam, Block, Endianness, Function, InstBuilder, MemFlagsData, SigRef, Signature, Type, Value,
};
use cranelift_codegen::isa::{CallConv, TargetFrontendConfig};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use kiln_flow::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType as S, UnaryOp, VarId};
use kiln_ir::DType;
use kiln_module::abi::Helper;

use super::analysis::{strides, Access, AddrBase, Analysis, Atom, Item};
use super::Options;

/// What the emitter may assume about the target.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    /// `roundss`/`roundps` exist (SSE4.1): native floor/ceil/round/trunc.
    pub sse41: bool,
    /// f32 exp, erf, tanh and log as inline code (`cpu::math`) rather than helper calls.
    pub inline_math: bool,
    /// Fused multiply-add exists (the inline polynomials use it).
    pub fma: bool,
    /// Unroll small reduction loops (`Options::unroll`).
    pub unroll: bool,
}

/// Reduction loops of at most this many iterations are unrolled.
const UNROLL_REDUCE: i64 = 4;

/// The C signature of every kernel entry point (see `kiln_module::abi`).
pub(crate) fn kernel_signature() -> Signature {
    let mut sig = Signature::new(CallConv::SystemV);
    for _ in 0..4 {
        sig.params.push(AbiParam::new(types::I64));
    }
    sig
}

type R<T> = Result<T, String>;

fn clif(t: S) -> Type {
    match t {
        S::Bool | S::I8 | S::U8 => types::I8,
        S::I16 | S::U16 => types::I16,
        S::I32 | S::U32 => types::I32,
        S::I64 | S::U64 => types::I64,
        S::F32 => types::F32,
        S::F64 => types::F64,
    }
}

fn vclif(t: S) -> Type {
    if t == S::F32 {
        types::F32X4
    } else {
        types::I32X4
    }
}

/// Plain loads and stores: kernels never trap, and bindings carry no alignment promise.
fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Lane order for vector bitcasts.
fn lanes() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

fn unary_helper(op: UnaryOp, double: bool) -> Option<Helper> {
    use Helper as H;
    let (s, d) = match op {
        UnaryOp::Exp => (H::ExpF32, H::ExpF64),
        UnaryOp::Log => (H::LogF32, H::LogF64),
        UnaryOp::Tanh => (H::TanhF32, H::TanhF64),
        UnaryOp::Erf => (H::ErfF32, H::ErfF64),
        UnaryOp::Sin => (H::SinF32, H::SinF64),
        UnaryOp::Cos => (H::CosF32, H::CosF64),
        UnaryOp::Tan => (H::TanF32, H::TanF64),
        UnaryOp::Asin => (H::AsinF32, H::AsinF64),
        UnaryOp::Acos => (H::AcosF32, H::AcosF64),
        UnaryOp::Atan => (H::AtanF32, H::AtanF64),
        UnaryOp::Sinh => (H::SinhF32, H::SinhF64),
        UnaryOp::Cosh => (H::CoshF32, H::CoshF64),
        UnaryOp::Asinh => (H::AsinhF32, H::AsinhF64),
        UnaryOp::Acosh => (H::AcoshF32, H::AcoshF64),
        UnaryOp::Atanh => (H::AtanhF32, H::AtanhF64),
        _ => return None,
    };
    Some(if double { d } else { s })
}

fn identity(op: ReduceOp, t: S) -> u64 {
    let (lo, hi) = t.int_range();
    match (op, t) {
        (ReduceOp::Sum, _) => t.bits_of_i64(0),
        (ReduceOp::Prod, _) => t.bits_of_i64(1),
        (ReduceOp::Max, S::F32) => f32::NEG_INFINITY.to_bits() as u64,
        (ReduceOp::Max, S::F64) => f64::NEG_INFINITY.to_bits(),
        (ReduceOp::Max, _) => t.wrap(lo as u64),
        (ReduceOp::Min, S::F32) => f32::INFINITY.to_bits() as u64,
        (ReduceOp::Min, S::F64) => f64::INFINITY.to_bits(),
        (ReduceOp::Min, _) => t.wrap(hi as u64),
        _ => 0,
    }
}

/// Builds the body of `func` (whose signature is [`kernel_signature`]) for kernel `k`.
pub(crate) fn build(
    k: &Kernel,
    an: &Analysis,
    func: &mut Function,
    fctx: &mut FunctionBuilderContext,
    caps: Caps,
    opts: &Options,
    frontend: TargetFrontendConfig,
) -> R<Vec<String>> {
    let n = k.nodes.len();
    let rank = k.index_rank();
    // Which loops run four lanes at a time (a scatter's points store one at a time).
    let vec_x = opts.vectorize
        && k.scatter.is_none()
        && rank > 0
        && k.vars[rank - 1] >= 4
        && an.vectorizable(k, rank as u32 - 1, true, caps.sse41);
    let mut vec_red = vec![false; n];
    if opts.vectorize {
        for (i, node) in k.nodes.iter().enumerate() {
            let Expr::Reduce { op, vars, body } = &node.expr else { continue };
            let bt = k.node(*body).ty;
            let Some(w) = vars.last() else { continue };
            let exact = bt != S::F32 || matches!(op, ReduceOp::Max | ReduceOp::Min);
            vec_red[i] = an.needed[i]
                && matches!(op, ReduceOp::Sum | ReduceOp::Prod | ReduceOp::Max | ReduceOp::Min)
                && matches!(bt, S::F32 | S::I32 | S::U32)
                && (exact || opts.reassociate)
                && k.vars[w.0 as usize] >= 8
                && an.varies(body.0, w.0)
                && an.vectorizable(k, w.0, false, caps.sse41);
        }
    }
    let mut b = FunctionBuilder::new(func, fctx);
    let entry = b.create_block();
    b.append_block_params_for_function_params(entry);
    b.switch_to_block(entry);
    let params = b.block_params(entry).to_vec();
    let [bindings, helpers, begin, end] = params[..] else {
        return Err("the kernel signature has four parameters".into());
    };
    let mut em = Em {
        k,
        an,
        caps,
        b,
        bind: Vec::new(),
        helpers,
        sigs: HashMap::new(),
        ctr: vec![None; k.vars.len()],
        vals: vec![None; n],
        avals: vec![None; an.addrs.len()],
        scaled: HashMap::new(),
        splats: HashMap::new(),
        ranges: k.int_ranges(),
        vmode: None,
        vec_x,
        vec_red,
        exit: None,
    };
    em.function(bindings, begin, end)?;
    em.b.seal_all_blocks();
    em.b.finalize(frontend);
    // What was vectorised, for listings and tests.
    let mut notes = Vec::new();
    if em.vec_x {
        notes.push(format!("v{} (innermost output loop) runs 4 lanes at a time", rank - 1));
    }
    for (i, &v) in em.vec_red.iter().enumerate() {
        if let (true, Expr::Reduce { vars, .. }) = (v, &k.nodes[i].expr) {
            if let Some(w) = vars.last() {
                notes.push(format!("reduce e{i} runs v{} 4 lanes at a time", w.0));
            }
        }
    }
    Ok(notes)
}

struct Em<'a, 'f> {
    k: &'a Kernel,
    an: &'a Analysis,
    caps: Caps,
    b: FunctionBuilder<'f>,
    /// Base address of every binding (inputs, then the output).
    bind: Vec<Value>,
    /// The helper table.
    helpers: Value,
    sigs: HashMap<(Vec<Type>, Type), SigRef>,
    /// Loop counter of every variable, once its loop exists.
    ctr: Vec<Option<Variable>>,
    /// Values of the nodes evaluated in the scopes now open.
    vals: Vec<Option<Value>>,
    /// Values of the address links evaluated in the scopes now open.
    avals: Vec<Option<Value>>,
    /// `v · bytes` for the counters of the loops now open, keyed `(v, bytes)`.
    scaled: HashMap<(u32, i64), Value>,
    /// Splats, made before a vector loop, of the scalars its body uses.
    splats: HashMap<u32, Value>,
    /// Value ranges of the integer nodes (for division by constants).
    ranges: Vec<(i128, i128)>,
    /// The variable whose loop runs four lanes at a time, if any.
    vmode: Option<u32>,
    vec_x: bool,
    vec_red: Vec<bool>,
    exit: Option<Block>,
}

impl Em<'_, '_> {
    /// The function body, from the entry block (current) on.
    fn function(&mut self, bindings: Value, begin: Value, end: Value) -> R<()> {
        let k = self.k;
        for i in 0..=k.inputs.len() {
            let v = self.b.ins().load(types::I64, MemFlagsData::trusted().with_readonly(), bindings, (8 * i) as i32);
            self.bind.push(v);
        }
        let exit = self.b.create_block();
        self.exit = Some(exit);
        if k.scatter.is_some() {
            // One workgroup runs every point, in order.
            let one = self.b.ins().iconst(types::I64, 1);
            let end = self.b.ins().umin(end, one);
            let go = self.b.ins().icmp(IntCC::UnsignedLessThan, begin, end);
            let body = self.b.create_block();
            self.b.ins().brif(go, body, &[], exit, &[]);
            self.b.switch_to_block(body);
            self.scatter()?;
            self.b.ins().jump(exit, &[]);
            self.b.switch_to_block(exit);
            self.b.ins().return_(&[]);
            return Ok(());
        }
        let rank = k.out_rank();
        let dims: Vec<u64> = k.output.shape.dims().iter().map(|&d| d as u64).collect();
        let wg_dims = rank.saturating_sub(1);
        let wg: u64 = dims[..wg_dims].iter().product();
        let total = self.b.ins().iconst(types::I64, wg.max(1) as i64);
        let end = self.b.ins().umin(end, total);
        let go = self.b.ins().icmp(IntCC::UnsignedLessThan, begin, end);
        let body = self.b.create_block();
        self.b.ins().brif(go, body, &[], exit, &[]);
        self.b.switch_to_block(body);
        if wg > 0 || wg_dims == 0 {
            self.items(0)?;
            if rank == 0 {
                self.store()?;
            } else {
                // The first workgroup's position in the workgroup dimensions; each
                // level starts there the first time and at 0 afterwards.
                let mut starts = vec![None; wg_dims];
                let mut rem = begin;
                for l in (0..wg_dims).rev() {
                    let d = self.b.ins().iconst(types::I64, dims[l] as i64);
                    let s = self.b.ins().urem(rem, d);
                    rem = self.b.ins().udiv(rem, d);
                    let var = self.b.declare_var(types::I64);
                    self.b.def_var(var, s);
                    starts[l] = Some(var);
                }
                let starts: Vec<Variable> = starts.into_iter().flatten().collect();
                let remaining = self.b.declare_var(types::I64);
                let count = self.b.ins().isub(end, begin);
                self.b.def_var(remaining, count);
                self.out_level(0, &starts, remaining)?;
            }
        }
        self.b.ins().jump(exit, &[]);
        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
        Ok(())
    }

    fn counter(&mut self, v: u32) -> Variable {
        match self.ctr[v as usize] {
            Some(c) => c,
            None => {
                let c = self.b.declare_var(types::I64);
                self.ctr[v as usize] = Some(c);
                c
            }
        }
    }

    /// `for v in init.. (step) while v + step <= limit { body }`; afterwards the
    /// counter holds the first value not run. Rotated: one test before the first
    /// iteration, then one compare-and-branch per iteration at the bottom.
    fn counted_loop(
        &mut self,
        v: u32,
        init: Value,
        limit: i64,
        step: i64,
        body: impl FnOnce(&mut Self) -> R<()>,
    ) -> R<()> {
        let ctr = self.counter(v);
        self.b.def_var(ctr, init);
        let body_b = self.b.create_block();
        let exit = self.b.create_block();
        let last = limit - step + 1;
        let cond = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, init, last);
        self.b.ins().brif(cond, body_b, &[], exit, &[]);
        self.b.switch_to_block(body_b);
        body(self)?;
        let c = self.b.use_var(ctr);
        let c2 = self.b.ins().iadd_imm_s(c, step);
        self.b.def_var(ctr, c2);
        let cond = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, c2, last);
        self.b.ins().brif(cond, body_b, &[], exit, &[]);
        self.b.switch_to_block(exit);
        Ok(())
    }

    /// Output loop `l` and everything inside it.
    fn out_level(&mut self, l: usize, starts: &[Variable], remaining: Variable) -> R<()> {
        let rank = self.k.out_rank();
        let v = l as u32;
        let n = self.k.vars[l] as i64;
        if l + 1 < rank {
            let init = self.b.use_var(starts[l]);
            self.counted_loop(v, init, n, 1, |em| {
                em.items(v + 1)?;
                em.out_level(l + 1, starts, remaining)?;
                if l + 2 == rank {
                    // One workgroup done; stop after the last one asked for.
                    let r = em.b.use_var(remaining);
                    let r1 = em.b.ins().iadd_imm_s(r, -1);
                    em.b.def_var(remaining, r1);
                    let cont = em.b.create_block();
                    let exit = em.exit.ok_or("no exit block")?;
                    em.b.ins().brif(r1, cont, &[], exit, &[]);
                    em.b.switch_to_block(cont);
                }
                em.clear(v + 1);
                Ok(())
            })?;
            let zero = self.b.ins().iconst(types::I64, 0);
            self.b.def_var(starts[l], zero);
            return Ok(());
        }
        let element = |em: &mut Self| -> R<()> {
            em.items(v + 1)?;
            em.store()?;
            em.clear(v + 1);
            Ok(())
        };
        let zero = self.b.ins().iconst(types::I64, 0);
        if self.vec_x {
            self.presplat(v)?;
            self.counted_loop(v, zero, n, 4, |em| {
                em.vmode = Some(v);
                let r = element(em);
                em.vmode = None;
                r
            })?;
            self.splats.clear();
            let ctr = self.counter(v);
            let c = self.b.use_var(ctr);
            self.counted_loop(v, c, n, 1, element)
        } else {
            self.counted_loop(v, zero, n, 1, element)
        }
    }

    /// Evaluates what scope `s` holds.
    fn items(&mut self, s: u32) -> R<()> {
        let an = self.an;
        for it in &an.items[s as usize] {
            match *it {
                Item::Node(i) => {
                    let v = self.node(i)?;
                    self.vals[i as usize] = Some(v);
                }
                Item::Addr(j) => {
                    let v = self.addr(j)?;
                    self.avals[j] = Some(v);
                }
            }
        }
        Ok(())
    }

    /// Forgets scope `s`'s values (they do not dominate the code after its loop).
    fn clear(&mut self, s: u32) {
        self.scaled.retain(|&(v, _), _| v + 1 != s);
        for it in &self.an.items[s as usize] {
            match *it {
                Item::Node(i) => self.vals[i as usize] = None,
                Item::Addr(j) => self.avals[j] = None,
            }
        }
    }

    fn varying(&self, i: u32) -> bool {
        self.vmode.is_some_and(|u| self.an.varies(i, u))
    }

    fn ty(&self, e: ExprId) -> S {
        self.k.node(e).ty
    }

    /// The value of node `e` as evaluated (a vector if it varies in vector mode).
    fn get(&mut self, e: ExprId) -> R<Value> {
        if let Expr::Const(bits) = self.k.node(e).expr {
            return Ok(self.constant(self.ty(e), bits));
        }
        self.vals[e.index()].ok_or_else(|| format!("e{} is used before it is evaluated", e.0))
    }

    /// The value of node `e` as a vector (splatting a scalar).
    fn vget(&mut self, e: ExprId) -> R<Value> {
        if let Some(&v) = self.splats.get(&e.0) {
            return Ok(v);
        }
        let v = self.get(e)?;
        if self.varying(e.0) {
            return Ok(v);
        }
        Ok(self.splat(self.ty(e), v))
    }

    /// The value of node `e` as a vector (`vector`) or a scalar.
    fn operand(&mut self, e: ExprId, vector: bool) -> R<Value> {
        if vector {
            self.vget(e)
        } else {
            self.get(e)
        }
    }

    /// Before a loop over `u` runs four lanes at a time: splats of the scalar operands
    /// its vector nodes use that are already evaluated (or constant), so the loop body
    /// does not splat them again every iteration.
    fn presplat(&mut self, u: u32) -> R<()> {
        let k = self.k;
        let an = self.an;
        for s in an.subtree(u + 1) {
            for it in &an.items[s as usize] {
                let Item::Node(i) = *it else { continue };
                if !an.varies(i, u) {
                    continue;
                }
                let ops: Vec<ExprId> = match &k.nodes[i as usize].expr {
                    Expr::Unary(_, a) | Expr::Cast { value: a, .. } => vec![*a],
                    Expr::Binary(_, a, b) => vec![*a, *b],
                    Expr::Select(c, a, b) => vec![*c, *a, *b],
                    Expr::Reduce { body, .. } => vec![*body],
                    _ => Vec::new(),
                };
                for e in ops {
                    let ready = matches!(k.node(e).expr, Expr::Const(_)) || self.vals[e.index()].is_some();
                    if !an.varies(e.0, u) && ready && !self.splats.contains_key(&e.0) {
                        let v = self.get(e)?;
                        let sv = self.splat(self.ty(e), v);
                        self.splats.insert(e.0, sv);
                    }
                }
            }
        }
        // The stored root, when it does not vary along the innermost output loop.
        let root = k.root;
        if u as usize + 1 == k.out_rank() && !an.varies(root.0, u) && self.vals[root.index()].is_some() {
            let v = self.get(root)?;
            let sv = self.splat(self.ty(root), v);
            self.splats.insert(root.0, sv);
        }
        Ok(())
    }

    fn splat(&mut self, t: S, v: Value) -> Value {
        match t {
            S::Bool => {
                let w = self.b.ins().uextend(types::I32, v);
                let m = self.b.ins().ineg(w);
                self.b.ins().splat(types::I32X4, m)
            }
            _ => self.b.ins().splat(vclif(t), v),
        }
    }

    fn constant(&mut self, t: S, bits: u64) -> Value {
        match t {
            S::F32 => self.b.ins().f32const(Ieee32::with_bits(bits as u32)),
            S::F64 => self.b.ins().f64const(Ieee64::with_bits(bits)),
            _ => self.b.ins().iconst(clif(t), t.wrap(bits) as i64),
        }
    }

    fn iconst(&mut self, t: Type, x: i64) -> Value {
        let bits = if t.bits() >= 64 { x } else { x & ((1i64 << t.bits()) - 1) };
        self.b.ins().iconst(t, bits)
    }

    /// `x · k` for an i64 `x`.
    fn scale(&mut self, x: Value, k: i64) -> Value {
        if k == 1 {
            x
        } else if k > 0 && (k as u64).is_power_of_two() {
            self.b.ins().ishl_imm_u(x, k.trailing_zeros() as i64)
        } else {
            self.b.ins().imul_imm_s(x, k)
        }
    }

    fn addr(&mut self, j: usize) -> R<Value> {
        let an = self.an;
        let a = &an.addrs[j];
        let mut acc = self.base(a.base)?;
        for &(atom, bytes) in &a.terms {
            let t = match atom {
                Atom::Var(v) => match self.scaled.get(&(v, bytes)) {
                    Some(&t) => t,
                    None => {
                        let c = self.counter(v);
                        let x = self.b.use_var(c);
                        let t = self.scale(x, bytes);
                        self.scaled.insert((v, bytes), t);
                        t
                    }
                },
                Atom::Node(m) => {
                    let x = self.get(ExprId(m))?;
                    self.scale(x, bytes)
                }
            };
            acc = self.b.ins().iadd(acc, t);
        }
        Ok(acc)
    }

    fn base(&self, b: AddrBase) -> R<Value> {
        match b {
            AddrBase::Binding(i) => self.bind.get(i as usize).copied().ok_or_else(|| format!("binding {i}")),
            AddrBase::Item(j) => self.avals[j].ok_or_else(|| format!("address link {j} is not evaluated")),
        }
    }

    /// Base value and displacement of an access.
    fn place(&mut self, a: Access) -> R<(Value, i32)> {
        let base = self.base(a.base)?;
        match i32::try_from(a.offset) {
            Ok(off) => Ok((base, off)),
            Err(_) => Ok((self.b.ins().iadd_imm_s(base, a.offset), 0)),
        }
    }

    fn node(&mut self, i: u32) -> R<Value> {
        let k = self.k;
        let node = &k.nodes[i as usize];
        if let Expr::Reduce { op, vars, body } = &node.expr {
            return self.reduce(i, *op, vars, *body);
        }
        // A varying node is evaluated four lanes at a time. Unary and binary nodes read
        // the same in both modes: only the operands' form and the instructions differ.
        let vector = self.varying(i);
        let ty = node.ty;
        match &node.expr {
            Expr::Unary(op, a) => {
                let at = self.ty(*a);
                let x = self.operand(*a, vector)?;
                if vector {
                    self.vunary(*op, at, x)
                } else {
                    self.unary(*op, at, x)
                }
            }
            Expr::Binary(op, a, b) => {
                let at = self.ty(*a);
                let (x, y) = (self.operand(*a, vector)?, self.operand(*b, vector)?);
                if vector {
                    self.vbinary(*op, at, x, y)
                } else {
                    self.binary(*op, at, x, y, Some((*a, *b)))
                }
            }
            _ if vector => self.vector_node(i),
            Expr::Var(v) => {
                let c = self.counter(v.0);
                Ok(self.b.use_var(c))
            }
            Expr::Const(bits) => Ok(self.constant(ty, *bits)),
            Expr::Load { input, index, bounds } => self.load(i, *input, index, *bounds, ty),
            Expr::Select(c, a, b) => {
                let (c, x, y) = (self.get(*c)?, self.get(*a)?, self.get(*b)?);
                Ok(self.b.ins().select(c, x, y))
            }
            Expr::Cast { value, to, .. } if matches!(to, DType::I4 | DType::U4) => {
                let from = self.ty(*value);
                let x = self.get(*value)?;
                Ok(self.clamp_int4(*to, from, x))
            }
            Expr::Cast { value, to, saturate } if F8::of(*to).is_some() => {
                let from = self.ty(*value);
                let x = self.get(*value)?;
                let y = self.to_f32_once(from, x);
                Ok(self.f8_round(*to, y, *saturate))
            }
            Expr::Cast { value, to: DType::F8E8M0FNU, saturate } => {
                let from = self.ty(*value);
                let x = self.get(*value)?;
                let y = self.to_f32_once(from, x);
                let code = self.e8m0_encode(y, *saturate);
                Ok(self.e8m0_decode(code))
            }
            Expr::Cast { value, to, .. } => {
                let from = self.ty(*value);
                let x = self.get(*value)?;
                self.cast(from, x, *to)
            }
            Expr::Reduce { .. } => Err("unreachable".into()),
        }
    }

    // ---- memory -------------------------------------------------------------------

    fn load(&mut self, i: u32, input: u32, index: &[ExprId], bounds: Bounds, ty: S) -> R<Value> {
        let k = self.k;
        let t = &k.inputs[input as usize];
        let d = t.dtype;
        if t.shape.numel() == 0 {
            let bits = if let Bounds::Pad(p) = bounds { p } else { 0 };
            return Ok(self.constant(ty, bits));
        }
        if bounds == Bounds::InBounds {
            let a = self.an.access[i as usize].ok_or("InBounds load without an address")?;
            let (base, off) = self.place(a)?;
            let binding = self.bind[input as usize];
            return self.load_elem(d, base, off, binding);
        }
        let dims = t.shape.dims();
        let st = strides(dims);
        let mut flat: Option<Value> = None;
        let mut inside: Option<Value> = None;
        for (dd, &e) in index.iter().enumerate() {
            let x = self.get(e)?;
            let n = dims[dd] as i64;
            let xi = match bounds {
                Bounds::Clamp => {
                    let lo = self.b.ins().iconst(types::I64, 0);
                    let hi = self.b.ins().iconst(types::I64, n - 1);
                    let m = self.b.ins().smax(x, lo);
                    self.b.ins().smin(m, hi)
                }
                _ => {
                    let nn = self.b.ins().iconst(types::I64, n);
                    let ok = self.b.ins().icmp(IntCC::UnsignedLessThan, x, nn);
                    inside = Some(match inside {
                        Some(b) => self.b.ins().band(b, ok),
                        None => ok,
                    });
                    x
                }
            };
            let term = self.scale(xi, st[dd]);
            flat = Some(match flat {
                Some(f) => self.b.ins().iadd(f, term),
                None => term,
            });
        }
        let mut flat = match flat {
            Some(f) => f,
            None => self.b.ins().iconst(types::I64, 0),
        };
        if let Some(ok) = inside {
            let zero = self.b.ins().iconst(types::I64, 0);
            flat = self.b.ins().select(ok, flat, zero);
        }
        let size = super::analysis::elem_bytes(d).ok_or("unsupported input dtype")?;
        let off = self.scale(flat, size);
        let binding = self.bind[input as usize];
        let addr = self.b.ins().iadd(binding, off);
        let v = self.load_elem(d, addr, 0, binding)?;
        match (bounds, inside) {
            (Bounds::Pad(p), Some(ok)) => {
                let pad = self.constant(ty, p);
                Ok(self.b.ins().select(ok, v, pad))
            }
            _ => Ok(v),
        }
    }

    /// The byte address and the nibble shift (0 or 4) of a packed 4-bit element whose
    /// element address is `addr + off` = `binding + index`.
    fn packed_addr(&mut self, addr: Value, off: i32, binding: Value) -> (Value, Value) {
        let at = self.b.ins().iadd_imm_s(addr, off as i64);
        let index = self.b.ins().isub(at, binding);
        let byte = self.b.ins().ushr_imm_u(index, 1);
        let byte = self.b.ins().iadd(binding, byte);
        let odd = self.b.ins().band_imm_u(index, 1);
        let shift = self.b.ins().ishl_imm_u(odd, 2);
        (byte, shift)
    }

    /// Loads one element of dtype `d` at `addr + off`; `binding` is the start of its
    /// buffer (for the packed 4-bit types).
    fn load_elem(&mut self, d: DType, addr: Value, off: i32, binding: Value) -> R<Value> {
        if d == DType::F4E2M1FN {
            let (byte, shift) = self.packed_addr(addr, off, binding);
            let b = self.b.ins().uload8(types::I32, mem(), byte, 0);
            let shift = self.b.ins().ireduce(types::I32, shift);
            let n = self.b.ins().ushr(b, shift);
            return Ok(self.f8_decode(d, n));
        }
        if matches!(d, DType::I4 | DType::U4) {
            let (byte, shift) = self.packed_addr(addr, off, binding);
            let b = self.b.ins().uload8(types::I64, mem(), byte, 0);
            let n = self.b.ins().ushr(b, shift);
            let n = self.b.ins().band_imm_u(n, 0xf);
            let n = self.b.ins().ireduce(types::I8, n);
            return Ok(if d == DType::I4 {
                // Sign-extend the nibble.
                let up = self.b.ins().ishl_imm_u(n, 4);
                self.b.ins().sshr_imm_u(up, 4)
            } else {
                n
            });
        }
        let t = match d {
            DType::F32 => types::F32,
            DType::F64 => types::F64,
            DType::Bool | DType::I8 | DType::U8 => types::I8,
            DType::I16 | DType::U16 => types::I16,
            DType::I32 | DType::U32 => types::I32,
            DType::I64 | DType::U64 => types::I64,
            DType::F16 => {
                let h = self.b.ins().uload16(types::I32, mem(), addr, off);
                return Ok(self.call(Helper::F16ToF32, &[h], types::F32));
            }
            DType::BF16 => {
                let h = self.b.ins().uload16(types::I32, mem(), addr, off);
                let s = self.b.ins().ishl_imm_u(h, 16);
                return Ok(self.b.ins().bitcast(types::F32, MemFlagsData::new(), s));
            }
            d if F8::of(d).is_some() => {
                let code = self.b.ins().uload8(types::I32, mem(), addr, off);
                return Ok(self.f8_decode(d, code));
            }
            DType::F8E8M0FNU => {
                let code = self.b.ins().uload8(types::I32, mem(), addr, off);
                return Ok(self.e8m0_decode(code));
            }
            _ => return Err(format!("loads of {}", d.name())),
        };
        Ok(self.b.ins().load(t, mem(), addr, off))
    }

    /// A scatter kernel's body (`kiln_flow::kernel`'s "Scatter kernels"): input 0
    /// copied into the output unless they are the same bytes (the planner's in-place
    /// placement), then the points of the domain in row-major order, each storing at its
    /// position when that lies inside the output.
    fn scatter(&mut self) -> R<()> {
        let k = self.k;
        let src = self.bind[0];
        let dst = self.bind[k.inputs.len()];
        let same = self.b.ins().icmp(IntCC::Equal, src, dst);
        let copy = self.b.create_block();
        let points = self.b.create_block();
        self.b.ins().brif(same, points, &[], copy, &[]);
        self.b.switch_to_block(copy);
        let bytes = k.output.storage_bytes() as i64;
        // Eight bytes at a time, then the rest a byte at a time.
        let words = self.b.declare_var(types::I64);
        for (step, t) in [(8i64, types::I64), (1, types::I8)] {
            let (from, to) = if step == 8 { (0, bytes / 8 * 8) } else { (bytes / 8 * 8, bytes) };
            if from >= to {
                continue;
            }
            let init = self.b.ins().iconst(types::I64, from);
            self.b.def_var(words, init);
            let body = self.b.create_block();
            let done = self.b.create_block();
            self.b.ins().jump(body, &[]);
            self.b.switch_to_block(body);
            let i = self.b.use_var(words);
            let a = self.b.ins().iadd(src, i);
            let x = self.b.ins().load(t, mem(), a, 0);
            let a = self.b.ins().iadd(dst, i);
            self.b.ins().store(mem(), x, a, 0);
            let i2 = self.b.ins().iadd_imm_s(i, step);
            self.b.def_var(words, i2);
            let more = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, i2, to);
            self.b.ins().brif(more, body, &[], done, &[]);
            self.b.switch_to_block(done);
        }
        self.b.ins().jump(points, &[]);
        self.b.switch_to_block(points);
        self.items(0)?;
        self.scatter_level(0)
    }

    /// Domain loop `l` of a scatter and everything inside it.
    fn scatter_level(&mut self, l: usize) -> R<()> {
        let k = self.k;
        if l == k.index_rank() {
            return self.scatter_store();
        }
        let v = l as u32;
        let n = k.vars[l] as i64;
        let zero = self.b.ins().iconst(types::I64, 0);
        self.counted_loop(v, zero, n, 1, |em| {
            em.items(v + 1)?;
            em.scatter_level(l + 1)?;
            em.clear(v + 1);
            Ok(())
        })
    }

    /// One point of a scatter: `output[at] = combine(output[at], root)` (or `root`)
    /// where `0 <= at < numel`, nothing otherwise.
    fn scatter_store(&mut self) -> R<()> {
        let k = self.k;
        let sc = k.scatter.as_ref().ok_or("not a scatter")?;
        let at = self.get(sc.at)?;
        let numel = self.b.ins().iconst(types::I64, k.output.shape.numel() as i64);
        // (A negative position is a large unsigned one.)
        let inside = self.b.ins().icmp(IntCC::UnsignedLessThan, at, numel);
        let st = self.b.create_block();
        let next = self.b.create_block();
        self.b.ins().brif(inside, st, &[], next, &[]);
        self.b.switch_to_block(st);
        let size = super::analysis::elem_bytes(k.output.dtype).ok_or("unsupported output dtype")?;
        let off = self.scale(at, size);
        let out = self.bind[k.inputs.len()];
        let addr = self.b.ins().iadd(out, off);
        let mut v = self.get(k.root)?;
        if let Some(op) = sc.combine {
            let old = self.load_elem(k.output.dtype, addr, 0, out)?;
            v = self.binary(op, self.ty(k.root), old, v, None)?;
        }
        self.b.ins().store(mem(), v, addr, 0);
        self.b.ins().jump(next, &[]);
        self.b.switch_to_block(next);
        Ok(())
    }

    fn store(&mut self) -> R<()> {
        let k = self.k;
        let (base, off) = self.place(self.an.store)?;
        if self.vmode.is_some() {
            let v = self.vget(k.root)?;
            self.b.ins().store(mem(), v, base, off);
            return Ok(());
        }
        let v = self.get(k.root)?;
        match k.output.dtype {
            DType::F16 => {
                let h = self.call(Helper::F32ToF16, &[v], types::I32);
                self.b.ins().istore16(mem(), h, base, off);
            }
            DType::BF16 => {
                let r = self.bf16_bits(v);
                let h = self.b.ins().ushr_imm_u(r, 16);
                self.b.ins().istore16(mem(), h, base, off);
            }
            d @ (DType::I4 | DType::U4 | DType::F4E2M1FN) => {
                // Elements are stored in ascending order (workgroups run one after
                // another, each over ascending indices): an even element writes its
                // byte with a zero high nibble (the padding of an odd count stays 0),
                // the odd element after it keeps the low nibble and sets the high one.
                let out = self.bind[k.inputs.len()];
                let v = if d == DType::F4E2M1FN {
                    let r = self.f8_round(d, v, false);
                    self.f8_encode(d, r)
                } else {
                    self.clamp_int4(d, S::of_storage(d), v)
                };
                let (byte, shift) = self.packed_addr(base, off, out);
                let old = self.b.ins().uload8(types::I64, mem(), byte, 0);
                let low = self.b.ins().band_imm_u(old, 0xf);
                let zero = self.iconst(types::I64, 0);
                let keep = self.b.ins().select(shift, low, zero);
                let nib = self.b.ins().uextend(types::I64, v);
                let nib = self.b.ins().band_imm_u(nib, 0xf);
                let nib = self.b.ins().ishl(nib, shift);
                let new = self.b.ins().bor(keep, nib);
                self.b.ins().istore8(mem(), new, byte, 0);
            }
            d if F8::of(d).is_some() => {
                // Rounded first (a no-op for a value a cast produced), without saturating.
                let r = self.f8_round(d, v, false);
                let code = self.f8_encode(d, r);
                self.b.ins().istore8(mem(), code, base, off);
            }
            DType::F8E8M0FNU => {
                let code = self.e8m0_encode(v, false);
                self.b.ins().istore8(mem(), code, base, off);
            }
            _ => {
                self.b.ins().store(mem(), v, base, off);
            }
        }
        Ok(())
    }

    // ---- helpers ------------------------------------------------------------------

    fn call(&mut self, h: Helper, args: &[Value], ret: Type) -> Value {
        let params: Vec<Type> = args.iter().map(|&a| self.b.func.dfg.value_type(a)).collect();
        let key = (params.clone(), ret);
        let sig = match self.sigs.get(&key) {
            Some(&s) => s,
            None => {
                let mut sig = Signature::new(CallConv::SystemV);
                sig.params.extend(params.iter().map(|&t| AbiParam::new(t)));
                sig.returns.push(AbiParam::new(ret));
                let s = self.b.import_signature(sig);
                self.sigs.insert(key, s);
                s
            }
        };
        let table = self.helpers;
        let flags = MemFlagsData::trusted().with_readonly().with_can_move();
        let f = self.b.ins().load(types::I64, flags, table, (h as u32 * 8) as i32);
        let inst = self.b.ins().call_indirect(sig, f, args);
        self.b.inst_results(inst)[0]
    }

    /// A helper applied to each lane of f32x4 operands.
    fn call_lanes(&mut self, h: Helper, args: &[Value]) -> Value {
        let mut out = args[0];
        for lane in 0..4u8 {
            let xs: Vec<Value> = args.iter().map(|&a| self.b.ins().extractlane(a, lane)).collect();
            let r = self.call(h, &xs, types::F32);
            out = self.b.ins().insertlane(out, r, lane);
        }
        out
    }

    // ---- scalar arithmetic ----------------------------------------------------------

    fn unary(&mut self, op: UnaryOp, t: S, x: Value) -> R<Value> {
        Ok(match (op, t) {
            (UnaryOp::IsNan, S::F32 | S::F64) => self.b.ins().fcmp(FloatCC::Unordered, x, x),
            (UnaryOp::IsNan, _) => self.b.ins().iconst(types::I8, 0),
            (UnaryOp::Neg, S::F32 | S::F64) => self.b.ins().fneg(x),
            (UnaryOp::Neg, _) => self.b.ins().ineg(x),
            (UnaryOp::Abs, S::F32 | S::F64) => self.b.ins().fabs(x),
            (UnaryOp::Abs, t) if t.is_signed() => self.b.ins().iabs(x),
            (UnaryOp::Abs, _) => x,
            (UnaryOp::Not, S::Bool) => self.b.ins().bxor_imm_u(x, 1),
            (UnaryOp::Not, t) if t.is_int() => self.b.ins().bnot(x),
            (UnaryOp::Sqrt, S::F32 | S::F64) => self.b.ins().sqrt(x),
            (UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Trunc, S::F32 | S::F64) => {
                if self.caps.sse41 {
                    match op {
                        UnaryOp::Floor => self.b.ins().floor(x),
                        UnaryOp::Ceil => self.b.ins().ceil(x),
                        UnaryOp::Round => self.b.ins().nearest(x),
                        _ => self.b.ins().trunc(x),
                    }
                } else {
                    self.round_fallback(op, t, x)
                }
            }
            (UnaryOp::Exp | UnaryOp::Erf | UnaryOp::Tanh | UnaryOp::Log, S::F32) if self.caps.inline_math => {
                self.inline_math(op, x)
            }
            (op, S::F32 | S::F64) => {
                let h = unary_helper(op, t == S::F64).ok_or_else(|| format!("{} of {t}", op.name()))?;
                self.call(h, &[x], clif(t))
            }
            _ => return Err(format!("{} of {t}", op.name())),
        })
    }

    /// exp, erf, tanh or log (`op`) of f32 `x`, a scalar or a vector, as inline code.
    fn inline_math(&mut self, op: UnaryOp, x: Value) -> Value {
        let fma = self.caps.fma;
        match op {
            UnaryOp::Exp => super::math::exp(&mut self.b, x, fma),
            UnaryOp::Erf => super::math::erf(&mut self.b, x, fma),
            UnaryOp::Tanh => super::math::tanh(&mut self.b, x, fma),
            _ => super::math::log(&mut self.b, x, fma),
        }
    }

    /// floor/ceil/round-half-even/trunc without SSE4.1: values of magnitude 2^mantissa
    /// or more (and NaN, ±inf) are integral already; below that, integer conversion
    /// truncates exactly, and adding then subtracting 2^mantissa rounds half to even.
    fn round_fallback(&mut self, op: UnaryOp, t: S, x: Value) -> Value {
        let (ft, it, big) = if t == S::F32 {
            (types::F32, types::I32, self.b.ins().f32const(8_388_608.0))
        } else {
            (types::F64, types::I64, self.b.ins().f64const(4_503_599_627_370_496.0))
        };
        let ax = self.b.ins().fabs(x);
        let small = self.b.ins().fcmp(FloatCC::LessThan, ax, big);
        let one = if t == S::F32 { self.b.ins().f32const(1.0) } else { self.b.ins().f64const(1.0) };
        let r = if op == UnaryOp::Round {
            let s = self.b.ins().fadd(ax, big);
            let r = self.b.ins().fsub(s, big);
            self.b.ins().fcopysign(r, x)
        } else {
            let i = self.b.ins().fcvt_to_sint_sat(it, x);
            let f = self.b.ins().fcvt_from_sint(ft, i);
            let tr = self.b.ins().fcopysign(f, x);
            match op {
                UnaryOp::Floor => {
                    let gt = self.b.ins().fcmp(FloatCC::GreaterThan, tr, x);
                    let m = self.b.ins().fsub(tr, one);
                    self.b.ins().select(gt, m, tr)
                }
                UnaryOp::Ceil => {
                    let lt = self.b.ins().fcmp(FloatCC::LessThan, tr, x);
                    let p = self.b.ins().fadd(tr, one);
                    self.b.ins().select(lt, p, tr)
                }
                _ => tr,
            }
        };
        self.b.ins().select(small, r, x)
    }

    fn int_cc(op: BinaryOp, signed: bool) -> IntCC {
        match (op, signed) {
            (BinaryOp::Eq, _) => IntCC::Equal,
            (BinaryOp::Ne, _) => IntCC::NotEqual,
            (BinaryOp::Lt, true) => IntCC::SignedLessThan,
            (BinaryOp::Le, true) => IntCC::SignedLessThanOrEqual,
            (BinaryOp::Gt, true) => IntCC::SignedGreaterThan,
            (BinaryOp::Ge, true) => IntCC::SignedGreaterThanOrEqual,
            (BinaryOp::Lt, false) => IntCC::UnsignedLessThan,
            (BinaryOp::Le, false) => IntCC::UnsignedLessThanOrEqual,
            (BinaryOp::Gt, false) => IntCC::UnsignedGreaterThan,
            _ => IntCC::UnsignedGreaterThanOrEqual,
        }
    }

    fn float_cc(op: BinaryOp) -> FloatCC {
        match op {
            BinaryOp::Eq => FloatCC::Equal,
            // True when unordered, as `Ne` is on NaN.
            BinaryOp::Ne => FloatCC::NotEqual,
            BinaryOp::Lt => FloatCC::LessThan,
            BinaryOp::Le => FloatCC::LessThanOrEqual,
            BinaryOp::Gt => FloatCC::GreaterThan,
            _ => FloatCC::GreaterThanOrEqual,
        }
    }

    /// `op(x, y)` where it is one instruction, the same on scalars and on vectors (each
    /// lane): float (`float`) or integer arithmetic, min and max and comparisons (of
    /// signed integers where `signed`), and integer bitwise operations; `None` for any
    /// other operation.
    fn lane_binary(&mut self, op: BinaryOp, float: bool, signed: bool, x: Value, y: Value) -> Option<Value> {
        use BinaryOp as B;
        let ins = self.b.ins();
        Some(match (op, float) {
            (B::Add, true) => ins.fadd(x, y),
            (B::Sub, true) => ins.fsub(x, y),
            (B::Mul, true) => ins.fmul(x, y),
            (B::Div, true) => ins.fdiv(x, y),
            (B::Min, true) => ins.fmin(x, y),
            (B::Max, true) => ins.fmax(x, y),
            (op, true) if op.is_comparison() => ins.fcmp(Self::float_cc(op), x, y),
            (B::Add, false) => ins.iadd(x, y),
            (B::Sub, false) => ins.isub(x, y),
            (B::Mul, false) => ins.imul(x, y),
            (B::Min, false) if signed => ins.smin(x, y),
            (B::Max, false) if signed => ins.smax(x, y),
            (B::Min, false) => ins.umin(x, y),
            (B::Max, false) => ins.umax(x, y),
            (op, false) if op.is_comparison() => ins.icmp(Self::int_cc(op, signed), x, y),
            (B::And, false) => ins.band(x, y),
            (B::Or, false) => ins.bor(x, y),
            (B::Xor, false) => ins.bxor(x, y),
            _ => return None,
        })
    }

    /// `op(x, y)` on scalars of type `t`; `nodes` names the operands' nodes, so a
    /// constant divisor or shift amount skips its guards.
    fn binary(&mut self, op: BinaryOp, t: S, x: Value, y: Value, nodes: Option<(ExprId, ExprId)>) -> R<Value> {
        let rhs = nodes.map(|n| n.1);
        use BinaryOp as B;
        let signed = t.is_signed();
        if let Some(v) = self.lane_binary(op, t.is_float(), signed, x, y) {
            return Ok(v);
        }
        if t.is_float() {
            let double = t == S::F64;
            return Ok(match op {
                B::Rem => self.call(if double { Helper::FmodF64 } else { Helper::FmodF32 }, &[x, y], clif(t)),
                B::Pow => self.call(if double { Helper::PowF64 } else { Helper::PowF32 }, &[x, y], clif(t)),
                _ => return Err(format!("{} of {t}", op.name())),
            });
        }
        let ct = clif(t);
        let const_rhs = rhs.and_then(|e| match self.k.node(e).expr {
            Expr::Const(b) => Some(t.to_i128(b)),
            _ => None,
        });
        Ok(match op {
            B::Div | B::Rem => {
                let nonneg = !signed || nodes.is_some_and(|(a, _)| self.ranges[a.index()].0 >= 0);
                match const_rhs {
                    Some(c) if c > 0 && nonneg && t.bits() >= 32 => self.div_by_const(op, t, x, c as u64),
                    _ => self.int_div(op, t, x, y, const_rhs),
                }
            }
            B::Shl | B::Shr => {
                let bits = t.bits() as i128;
                if let Some(c) = const_rhs {
                    if (0..bits).contains(&c) {
                        let c = c as i64;
                        return Ok(match (op, signed) {
                            (B::Shl, _) => self.b.ins().ishl_imm_u(x, c),
                            (_, true) => self.b.ins().sshr_imm_u(x, c),
                            _ => self.b.ins().ushr_imm_u(x, c),
                        });
                    }
                }
                // The amount as an unsigned number of its width: negative amounts are
                // huge, so one unsigned compare tests `0..bits`.
                let nbits = self.iconst(ct, bits as i64);
                let inside = self.b.ins().icmp(IntCC::UnsignedLessThan, y, nbits);
                match (op, signed) {
                    (B::Shl, _) | (B::Shr, false) => {
                        let s = if op == B::Shl { self.b.ins().ishl(x, y) } else { self.b.ins().ushr(x, y) };
                        let zero = self.iconst(ct, 0);
                        self.b.ins().select(inside, s, zero)
                    }
                    _ => {
                        // Shifting by bits-1 fills with the sign: -1 or 0, as wanted.
                        let top = self.iconst(ct, bits as i64 - 1);
                        let amt = self.b.ins().select(inside, y, top);
                        self.b.ins().sshr(x, amt)
                    }
                }
            }
            B::Pow => return Err(format!("pow of {t}")),
            _ => return Err(format!("{} of {t}", op.name())),
        })
    }

    /// Integer division and remainder that never trap: a zero divisor gives 0, and
    /// `MIN / -1` gives `MIN` (`MIN % -1` gives 0).
    fn int_div(&mut self, op: BinaryOp, t: S, x: Value, y: Value, c: Option<i128>) -> Value {
        let ct = clif(t);
        let signed = t.is_signed();
        let div = op == BinaryOp::Div;
        match c {
            Some(0) => return self.iconst(ct, 0),
            Some(-1) if signed => {
                return if div { self.b.ins().ineg(x) } else { self.iconst(ct, 0) };
            }
            Some(_) => {
                return match (div, signed) {
                    (true, true) => self.b.ins().sdiv(x, y),
                    (true, false) => self.b.ins().udiv(x, y),
                    (false, true) => self.b.ins().srem(x, y),
                    (false, false) => self.b.ins().urem(x, y),
                };
            }
            None => {}
        }
        let zero = self.iconst(ct, 0);
        let one = self.iconst(ct, 1);
        let is_zero = self.b.ins().icmp(IntCC::Equal, y, zero);
        if !signed {
            let safe = self.b.ins().select(is_zero, one, y);
            let q = if div { self.b.ins().udiv(x, safe) } else { self.b.ins().urem(x, safe) };
            return self.b.ins().select(is_zero, zero, q);
        }
        let m1 = self.iconst(ct, -1);
        let is_m1 = self.b.ins().icmp(IntCC::Equal, y, m1);
        let bad = self.b.ins().bor(is_zero, is_m1);
        let safe = self.b.ins().select(bad, one, y);
        if div {
            let q = self.b.ins().sdiv(x, safe);
            let neg = self.b.ins().ineg(x);
            let q = self.b.ins().select(is_m1, neg, q);
            self.b.ins().select(is_zero, zero, q)
        } else {
            let r = self.b.ins().srem(x, safe);
            self.b.ins().select(bad, zero, r)
        }
    }

    /// `x / c` or `x % c` for a non-negative 32- or 64-bit `x` (below 2^63) and a
    /// constant `c > 0`, without a divide instruction: with `l = ceil(log2 c)` and
    /// `m = ceil(2^(63+l) / c)` (which fits 64 bits), `floor(x·m / 2^(63+l))` is
    /// `floor(x / c)` for every `x < 2^63`, because `m·c - 2^(63+l) < c <= 2^l`.
    fn div_by_const(&mut self, op: BinaryOp, t: S, x: Value, c: u64) -> Value {
        let ct = clif(t);
        let wide = ct != types::I64;
        // A u64 dividend of 2^63 or more does not meet the bound: divide.
        if t == S::U64 && c > 1 && !c.is_power_of_two() {
            let cv = self.iconst(ct, c as i64);
            return if op == BinaryOp::Div { self.b.ins().udiv(x, cv) } else { self.b.ins().urem(x, cv) };
        }
        let x64 = if wide { self.b.ins().uextend(types::I64, x) } else { x };
        let q = if c == 1 {
            x64
        } else if c.is_power_of_two() {
            self.b.ins().ushr_imm_u(x64, c.trailing_zeros() as i64)
        } else {
            let l = 64 - (c - 1).leading_zeros();
            let m = (1u128 << (63 + l)).div_ceil(c as u128) as u64;
            let mv = self.b.ins().iconst(types::I64, m as i64);
            let hi = self.b.ins().umulhi(x64, mv);
            self.b.ins().ushr_imm_u(hi, (l - 1) as i64)
        };
        let r = if op == BinaryOp::Div {
            q
        } else {
            let qc = self.b.ins().imul_imm_s(q, c as i64);
            self.b.ins().isub(x64, qc)
        };
        if wide {
            self.b.ins().ireduce(ct, r)
        } else {
            r
        }
    }

    /// `x` (of type `from`) widened to i64: sign-extended if signed, else zero-extended.
    fn ext64(&mut self, from: S, x: Value) -> Value {
        if clif(from) == types::I64 {
            x
        } else if from.is_signed() {
            self.b.ins().sextend(types::I64, x)
        } else {
            self.b.ins().uextend(types::I64, x)
        }
    }

    /// An integer or bool value as f64 (exact below 2^53; rounded to nearest even above).
    fn int_to_f64(&mut self, from: S, x: Value) -> Value {
        if from == S::U64 {
            self.b.ins().fcvt_from_uint(types::F64, x)
        } else {
            let w = self.ext64(from, x);
            self.b.ins().fcvt_from_sint(types::F64, w)
        }
    }

    fn cast(&mut self, from: S, x: Value, to: DType) -> R<Value> {
        Ok(match to {
            DType::F32 => match from {
                S::F32 => x,
                S::F64 => self.b.ins().fdemote(types::F32, x),
                S::U64 => self.b.ins().fcvt_from_uint(types::F32, x),
                _ => {
                    let w = self.ext64(from, x);
                    self.b.ins().fcvt_from_sint(types::F32, w)
                }
            },
            DType::F64 => match from {
                S::F32 => self.b.ins().fpromote(types::F64, x),
                S::F64 => x,
                _ => self.int_to_f64(from, x),
            },
            DType::Bool => match from {
                S::F32 => {
                    let z = self.b.ins().f32const(0.0);
                    self.b.ins().fcmp(FloatCC::NotEqual, x, z)
                }
                S::F64 => {
                    let z = self.b.ins().f64const(0.0);
                    self.b.ins().fcmp(FloatCC::NotEqual, x, z)
                }
                _ => {
                    let z = self.iconst(clif(from), 0);
                    self.b.ins().icmp(IntCC::NotEqual, x, z)
                }
            },
            DType::F16 | DType::BF16 => {
                // To f32 first: exactly for f32, with one rounding to odd for f64 (so
                // the second rounding is correct), and through f64 for integers.
                let y = match from {
                    S::F32 => x,
                    S::F64 => self.f64_to_f32_odd(x),
                    _ => {
                        let d = self.int_to_f64(from, x);
                        self.b.ins().fdemote(types::F32, d)
                    }
                };
                if to == DType::F16 {
                    let h = self.call(Helper::F32ToF16, &[y], types::I32);
                    self.call(Helper::F16ToF32, &[h], types::F32)
                } else {
                    let r = self.bf16_bits(y);
                    self.b.ins().bitcast(types::F32, MemFlagsData::new(), r)
                }
            }
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::U8 | DType::U16 | DType::U32 | DType::U64 => {
                let tt = clif(S::of_storage(to));
                let w = match from {
                    S::F32 | S::F64 => {
                        let s = self.b.ins().fcvt_to_sint_sat(types::I64, x);
                        if to == DType::U64 {
                            let u = self.b.ins().fcvt_to_uint_sat(types::I64, x);
                            let z =
                                if from == S::F32 { self.b.ins().f32const(0.0) } else { self.b.ins().f64const(0.0) };
                            let nonneg = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, x, z);
                            self.b.ins().select(nonneg, u, s)
                        } else {
                            s
                        }
                    }
                    _ => {
                        let ct = clif(from);
                        if ct == tt {
                            return Ok(x);
                        }
                        if ct.bits() > tt.bits() {
                            return Ok(self.b.ins().ireduce(tt, x));
                        }
                        return Ok(if from.is_signed() {
                            self.b.ins().sextend(tt, x)
                        } else {
                            self.b.ins().uextend(tt, x)
                        });
                    }
                };
                if tt == types::I64 {
                    w
                } else {
                    self.b.ins().ireduce(tt, w)
                }
            }
            d => return Err(format!("casts to {}", d.name())),
        })
    }

    /// `x` as f32 such that one later rounding to a format of at most 22 significand
    /// bits is correct: exact from f32, round-to-odd from f64 and from integers.
    fn to_f32_once(&mut self, from: S, x: Value) -> Value {
        match from {
            S::F32 => x,
            S::F64 => self.f64_to_f32_odd(x),
            _ => {
                let d = self.int_to_f64(from, x);
                self.f64_to_f32_odd(d)
            }
        }
    }

    /// `x` (of type `from`) converted to 4-bit integer dtype `d`, in its compute type
    /// (i8 or u8): rounded to nearest even and clamped to the dtype's range, NaN to 0,
    /// as `kiln_ir::lowp::encode` does.
    fn clamp_int4(&mut self, d: DType, from: S, x: Value) -> Value {
        let (lo, hi) = if d == DType::I4 { (-8.0f32, 7.0f32) } else { (0.0, 15.0) };
        let y = if from.is_float() {
            self.to_f32_once(from, x)
        } else {
            // Clamp in the integer domain first: wide integers do not fit f32 exactly.
            let w = self.ext64(from, x);
            let l = self.iconst(types::I64, lo as i64);
            let h = self.iconst(types::I64, hi as i64);
            let w = if from == S::U64 {
                // Non-negative: only the upper bound applies (both lower bounds are ≤ 0).
                self.b.ins().umin(w, h)
            } else {
                let m = self.b.ins().smin(w, h);
                self.b.ins().smax(m, l)
            };
            self.b.ins().fcvt_from_sint(types::F32, w)
        };
        let l = self.b.ins().f32const(lo);
        let h = self.b.ins().f32const(hi);
        let c = self.b.ins().fmax(y, l);
        let c = self.b.ins().fmin(c, h);
        // fmin/fmax propagate NaN: NaN gives 0.
        let zero = self.b.ins().f32const(0.0);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, y, y);
        let c = self.b.ins().select(nan, zero, c);
        // Ties to even: adding and subtracting 1.5 · 2^23 rounds a value this small (of
        // either sign: the sum stays in [2^23, 2^24), where the f32 step is 1).
        let magic = self.b.ins().f32const(12_582_912.0);
        let r = self.b.ins().fadd(c, magic);
        let r = self.b.ins().fsub(r, magic);
        let i = self.b.ins().fcvt_to_sint_sat(types::I32, r);
        self.b.ins().ireduce(types::I8, i)
    }

    /// `2^k` as an f32 constant (normal range).
    fn pow2_f32(&mut self, k: i64) -> Value {
        self.b.ins().f32const(Ieee32::with_bits(((k + 127) as u32) << 23))
    }

    /// An f32 value rounded to 8-bit float `d` (nearest even, once), as the f32 of the
    /// rounded value; out of range: ±max with `saturate`, else ±inf (E5M2) or NaN. The
    /// rules are those of `kiln_ir::lowp::encode`.
    fn f8_round(&mut self, d: DType, x: Value, saturate: bool) -> Value {
        let Some(f) = F8::of(d) else { return x };
        let a = self.b.ins().fabs(x);
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), a);
        // Exponent of |x|, at least the format's minimum normal exponent.
        let e = self.b.ins().ushr_imm_u(bits, 23);
        let e = self.b.ins().iadd_imm_s(e, -127);
        let emin = self.iconst(types::I32, 1 - f.bias);
        let e = self.b.ins().smax(e, emin);
        // At most 126 (|x| that large, and ±inf, overflow every format anyway), so that the
        // scale stays a normal f32 for one mantissa bit too (f4E2M1FN).
        let emax = self.iconst(types::I32, 126);
        let e = self.b.ins().smin(e, emax);
        // scale = 2^(m - e), unscale = 2^(e - m), built from exponent bits; both normal.
        let top = self.iconst(types::I32, f.man + 127);
        let sc = self.b.ins().isub(top, e);
        let sc = self.b.ins().ishl_imm_u(sc, 23);
        let scale = self.b.ins().bitcast(types::F32, MemFlagsData::new(), sc);
        let un = self.b.ins().iadd_imm_s(e, 127 - f.man);
        let un = self.b.ins().ishl_imm_u(un, 23);
        let unscale = self.b.ins().bitcast(types::F32, MemFlagsData::new(), un);
        // |x| · 2^(m−e) is below 2^(m+1) (or huge for |x| past the f32 range of the
        // scale, which the overflow test below catches); adding and subtracting 2^23
        // rounds it to an integer, ties to even.
        let y = self.b.ins().fmul(a, scale);
        let magic = self.pow2_f32(23);
        let big = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, y, magic);
        let r = self.b.ins().fadd(y, magic);
        let r = self.b.ins().fsub(r, magic);
        let r = self.b.ins().select(big, y, r);
        let r = self.b.ins().fmul(r, unscale);
        let max = self.b.ins().f32const(f.max);
        let over = self.b.ins().fcmp(FloatCC::GreaterThan, r, max);
        let nan = self.b.ins().f32const(Ieee32::with_bits(0x7fc0_0000));
        let out = if saturate || f.ocp {
            max
        } else if f.ieee {
            self.b.ins().f32const(Ieee32::with_bits(0x7f80_0000))
        } else {
            nan
        };
        let r = self.b.ins().select(over, out, r);
        // The sign back on (unsigned-zero formats have no -0), NaN in, NaN out.
        let r = if f.uz {
            let zero = self.b.ins().f32const(0.0);
            let nz = self.b.ins().fcmp(FloatCC::NotEqual, r, zero);
            let neg = self.b.ins().fneg(r);
            let xneg = self.b.ins().fcmp(FloatCC::LessThan, x, zero);
            let flip = self.b.ins().band(nz, xneg);
            self.b.ins().select(flip, neg, r)
        } else {
            self.b.ins().fcopysign(r, x)
        };
        // A NaN keeps its sign: the sign-carrying NaN codes take it. The OCP types have no
        // NaN: it gives the zero of the other sign (`kiln_ir::lowp`).
        let isnan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        let nan_value = if f.ocp {
            let zero = self.b.ins().f32const(0.0);
            let z = self.b.ins().fcopysign(zero, x);
            self.b.ins().fneg(z)
        } else {
            x
        };
        self.b.ins().select(isnan, nan_value, r)
    }

    /// The code (in an i32) of f32 `v`, a value of 8-bit float `d` or a NaN or infinity.
    fn f8_encode(&mut self, d: DType, v: Value) -> Value {
        let Some(f) = F8::of(d) else { return self.iconst(types::I32, 0) };
        let a = self.b.ins().fabs(v);
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), v);
        let abits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), a);
        // Normal: rebias the exponent, keep the top mantissa bits.
        let e = self.b.ins().ushr_imm_u(abits, 23);
        let e = self.b.ins().iadd_imm_s(e, f.bias - 127);
        let e = self.b.ins().ishl_imm_u(e, f.man);
        let mbits = self.b.ins().ushr_imm_u(abits, 23 - f.man);
        let mbits = self.b.ins().band_imm_u(mbits, (1 << f.man) - 1);
        let normal = self.b.ins().bor(e, mbits);
        // Subnormal (or zero): the integer multiple of the smallest step.
        let step = self.pow2_f32(f.man - 1 + f.bias);
        let q = self.b.ins().fmul(a, step);
        let sub = self.b.ins().fcvt_to_uint_sat(types::I32, q);
        let min_normal = self.pow2_f32(1 - f.bias);
        let is_sub = self.b.ins().fcmp(FloatCC::LessThan, a, min_normal);
        let mag = self.b.ins().select(is_sub, sub, normal);
        let sign = self.b.ins().ushr_imm_u(bits, 31 - f.sign.trailing_zeros() as i64);
        let sign = self.b.ins().band_imm_u(sign, f.sign);
        let code = self.b.ins().bor(mag, sign);
        if f.ocp {
            // A value of the type (rounded first): no NaN or infinity to encode.
            return code;
        }
        let code = if f.uz {
            let zero = self.iconst(types::I32, 0);
            let z = self.b.ins().icmp_imm_s(IntCC::Equal, mag, 0);
            self.b.ins().select(z, zero, code)
        } else {
            code
        };
        let inf = self.b.ins().f32const(Ieee32::with_bits(0x7f80_0000));
        let is_inf = self.b.ins().fcmp(FloatCC::Equal, a, inf);
        let is_nan = self.b.ins().fcmp(FloatCC::Unordered, v, v);
        let (nan_code, inf_code) = if f.uz {
            (self.iconst(types::I32, 0x80), self.iconst(types::I32, 0x80))
        } else if f.ieee {
            let n = self.b.ins().bor_imm_u(sign, 0x7f);
            let i = self.b.ins().bor_imm_u(sign, 0x7c);
            (n, i)
        } else {
            let n = self.b.ins().bor_imm_u(sign, 0x7f);
            (n, n)
        };
        let code = self.b.ins().select(is_inf, inf_code, code);
        self.b.ins().select(is_nan, nan_code, code)
    }

    /// The `f8E8M0FNU` code (in an i32) nearest f32 `x`, as `kiln_ir::lowp::encode_e8m0`
    /// with `E8M0Rounding::Nearest` gives it: on the bits, a normal `x = 2^e·(1 + r)` is
    /// `e + 127` plus one when `r ≥ ½` (adding bit 22 carries into the exponent field);
    /// a subnormal is code 1 from `1.5·2^-127` up, else 0 (there is no zero). Above
    /// `2^127`: 0xFE with `saturate`, else 0xFF; negative values: 0 with `saturate`, else
    /// 0xFF; ±0 → 0; NaN → 0xFF.
    fn e8m0_encode(&mut self, x: Value, saturate: bool) -> Value {
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), x);
        let abs = self.b.ins().band_imm_u(bits, 0x7fff_ffff);
        let up = self.b.ins().iadd_imm_s(abs, 0x40_0000);
        let normal = self.b.ins().ushr_imm_u(up, 23);
        let sub_code = self.b.ins().icmp_imm_u(IntCC::UnsignedGreaterThanOrEqual, abs, 0x60_0000);
        let sub_code = self.b.ins().uextend(types::I32, sub_code);
        let is_sub = self.b.ins().icmp_imm_u(IntCC::UnsignedLessThan, abs, 0x80_0000);
        let code = self.b.ins().select(is_sub, sub_code, normal);
        let over = self.b.ins().icmp_imm_u(IntCC::UnsignedGreaterThan, code, 0xfe);
        let top = self.iconst(types::I32, if saturate { 0xfe } else { 0xff });
        let code = self.b.ins().select(over, top, code);
        let neg = self.b.ins().icmp_imm_s(IntCC::SignedLessThan, bits, 0);
        let nonzero = self.b.ins().icmp_imm_u(IntCC::NotEqual, abs, 0);
        let neg = self.b.ins().band(neg, nonzero);
        let low = self.iconst(types::I32, if saturate { 0 } else { 0xff });
        let code = self.b.ins().select(neg, low, code);
        let nan = self.b.ins().icmp_imm_u(IntCC::UnsignedGreaterThan, abs, 0x7f80_0000);
        let ff = self.iconst(types::I32, 0xff);
        self.b.ins().select(nan, ff, code)
    }

    /// The f32 value `2^(code − 127)` of an `f8E8M0FNU` code (in an i32): the code is the
    /// f32 exponent field, except code 0 (`2^-127`, the subnormal 0x0040_0000) and
    /// 0xFF (NaN).
    fn e8m0_decode(&mut self, code: Value) -> Value {
        let code = self.b.ins().band_imm_u(code, 0xff);
        let bits = self.b.ins().ishl_imm_u(code, 23);
        let zero = self.b.ins().icmp_imm_u(IntCC::Equal, code, 0);
        let smallest = self.iconst(types::I32, 0x40_0000);
        let bits = self.b.ins().select(zero, smallest, bits);
        let nan = self.b.ins().icmp_imm_u(IntCC::Equal, code, 0xff);
        let qnan = self.iconst(types::I32, 0x7fc0_0000);
        let bits = self.b.ins().select(nan, qnan, bits);
        self.b.ins().bitcast(types::F32, MemFlagsData::new(), bits)
    }

    /// The f32 value of the code (in an i32) of 8-bit float `d`.
    fn f8_decode(&mut self, d: DType, code: Value) -> Value {
        let Some(f) = F8::of(d) else { return self.b.ins().f32const(0.0) };
        let ebits = f.ebits();
        // Only the code's own bits count (a 6-bit code in a byte).
        let code = self.b.ins().band_imm_u(code, 2 * f.sign - 1);
        let e = self.b.ins().ushr_imm_u(code, f.man);
        let e = self.b.ins().band_imm_u(e, (1 << ebits) - 1);
        let m = self.b.ins().band_imm_u(code, (1 << f.man) - 1);
        // Normal: rebias the exponent, move the mantissa to the top.
        let ne = self.b.ins().iadd_imm_s(e, 127 - f.bias);
        let ne = self.b.ins().ishl_imm_u(ne, 23);
        let nm = self.b.ins().ishl_imm_u(m, 23 - f.man);
        let normal = self.b.ins().bor(ne, nm);
        let normal = self.b.ins().bitcast(types::F32, MemFlagsData::new(), normal);
        // Subnormal: mantissa · 2^(1 − bias − m).
        let mf = self.b.ins().fcvt_from_uint(types::F32, m);
        let step = self.pow2_f32(1 - f.bias - f.man);
        let sub = self.b.ins().fmul(mf, step);
        let is_sub = self.b.ins().icmp_imm_s(IntCC::Equal, e, 0);
        let mag = self.b.ins().select(is_sub, sub, normal);
        let neg = self.b.ins().band_imm_u(code, f.sign);
        let negv = self.b.ins().fneg(mag);
        let v = self.b.ins().select(neg, negv, mag);
        let nan = self.b.ins().f32const(Ieee32::with_bits(0x7fc0_0000));
        if f.ocp {
            v
        } else if f.uz {
            let is_nan = self.b.ins().icmp_imm_s(IntCC::Equal, code, 0x80);
            self.b.ins().select(is_nan, nan, v)
        } else if f.ieee {
            let top = self.b.ins().icmp_imm_s(IntCC::Equal, e, (1 << ebits) - 1);
            let m0 = self.b.ins().icmp_imm_s(IntCC::Equal, m, 0);
            let inf = self.b.ins().f32const(Ieee32::with_bits(0x7f80_0000));
            let ninf = self.b.ins().fneg(inf);
            let sinf = self.b.ins().select(neg, ninf, inf);
            let special = self.b.ins().select(m0, sinf, nan);
            self.b.ins().select(top, special, v)
        } else {
            let low = self.b.ins().band_imm_u(code, 0x7f);
            let is_nan = self.b.ins().icmp_imm_s(IntCC::Equal, low, 0x7f);
            self.b.ins().select(is_nan, nan, v)
        }
    }

    /// f32 bits of `x` rounded to bf16 (nearest even; the low 16 bits zero; a NaN
    /// stays a NaN by setting its quiet bit).
    fn bf16_bits(&mut self, x: Value) -> Value {
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), x);
        let hi = self.b.ins().ushr_imm_u(bits, 16);
        let lsb = self.b.ins().band_imm_u(hi, 1);
        let r = self.b.ins().iadd_imm_s(bits, 0x7fff);
        let r = self.b.ins().iadd(r, lsb);
        let mask = self.iconst(types::I32, 0xffff_0000u32 as i64);
        let r = self.b.ins().band(r, mask);
        let q = self.b.ins().bor_imm_u(bits, 0x0040_0000);
        let q = self.b.ins().band(q, mask);
        let nan = self.b.ins().fcmp(FloatCC::Unordered, x, x);
        self.b.ins().select(nan, q, r)
    }

    /// f64 to f32 rounding to odd: truncate toward zero, then set the last bit if
    /// anything was lost. A later rounding to a format with at most 22 bits of
    /// precision is then the correct rounding of the f64.
    fn f64_to_f32_odd(&mut self, x: Value) -> Value {
        let y = self.b.ins().fdemote(types::F32, x);
        let back = self.b.ins().fpromote(types::F64, y);
        let bits = self.b.ins().bitcast(types::I32, MemFlagsData::new(), y);
        let ab = self.b.ins().fabs(back);
        let ax = self.b.ins().fabs(x);
        let away = self.b.ins().fcmp(FloatCC::GreaterThan, ab, ax);
        let dec = self.b.ins().iadd_imm_s(bits, -1);
        let bits = self.b.ins().select(away, dec, bits);
        let inexact = self.b.ins().fcmp(FloatCC::OrderedNotEqual, back, x);
        let odd = self.b.ins().bor_imm_u(bits, 1);
        let bits = self.b.ins().select(inexact, odd, bits);
        self.b.ins().bitcast(types::F32, MemFlagsData::new(), bits)
    }

    // ---- vector mode ----------------------------------------------------------------

    /// Varying node `i` four lanes at a time: a load, select or cast (`node` evaluates
    /// the unary and binary ones in either mode).
    fn vector_node(&mut self, i: u32) -> R<Value> {
        let k = self.k;
        let node = &k.nodes[i as usize];
        let ty = node.ty;
        match &node.expr {
            Expr::Load { bounds: Bounds::InBounds, .. } => {
                let a = self.an.access[i as usize].ok_or("vector load without an address")?;
                let (base, off) = self.place(a)?;
                Ok(self.b.ins().load(vclif(ty), mem(), base, off))
            }
            Expr::Select(c, a, b) => {
                let mut m = self.vget(*c)?;
                let (x, y) = (self.vget(*a)?, self.vget(*b)?);
                if ty == S::F32 {
                    m = self.b.ins().bitcast(types::F32X4, lanes(), m);
                }
                Ok(self.b.ins().bitselect(m, x, y))
            }
            Expr::Cast { value, .. } => {
                let from = self.ty(*value);
                let x = self.vget(*value)?;
                Ok(match (from, ty) {
                    (S::I32, S::F32) => self.b.ins().fcvt_from_sint(types::F32X4, x),
                    (S::U32, S::F32) => self.b.ins().fcvt_from_uint(types::F32X4, x),
                    (S::Bool, S::F32) => {
                        let m = self.b.ins().bitcast(types::F32X4, lanes(), x);
                        let one = self.b.ins().f32const(1.0);
                        let one = self.b.ins().splat(types::F32X4, one);
                        let zero = self.b.ins().f32const(0.0);
                        let zero = self.b.ins().splat(types::F32X4, zero);
                        self.b.ins().bitselect(m, one, zero)
                    }
                    (S::Bool, _) => self.b.ins().ushr_imm_u(x, 31),
                    (S::F32, S::Bool) => {
                        let z = self.b.ins().f32const(0.0);
                        let z = self.b.ins().splat(types::F32X4, z);
                        self.b.ins().fcmp(FloatCC::NotEqual, x, z)
                    }
                    (_, S::Bool) => {
                        let z = self.b.ins().iconst(types::I32, 0);
                        let z = self.b.ins().splat(types::I32X4, z);
                        self.b.ins().icmp(IntCC::NotEqual, x, z)
                    }
                    _ => x,
                })
            }
            _ => Err(format!("e{i} cannot be evaluated four lanes at a time")),
        }
    }

    fn vunary(&mut self, op: UnaryOp, t: S, x: Value) -> R<Value> {
        Ok(match (op, t) {
            (UnaryOp::Not, _) if t != S::F32 => self.b.ins().bnot(x),
            (UnaryOp::Neg, S::F32) => self.b.ins().fneg(x),
            (UnaryOp::Neg, _) => self.b.ins().ineg(x),
            (UnaryOp::Abs, S::F32) => self.b.ins().fabs(x),
            (UnaryOp::Abs, S::I32) => self.b.ins().iabs(x),
            (UnaryOp::Abs, _) => x,
            (UnaryOp::Sqrt, _) => self.b.ins().sqrt(x),
            (UnaryOp::Floor, _) => self.b.ins().floor(x),
            (UnaryOp::Ceil, _) => self.b.ins().ceil(x),
            (UnaryOp::Round, _) => self.b.ins().nearest(x),
            (UnaryOp::Trunc, _) => self.b.ins().trunc(x),
            (UnaryOp::IsNan, _) => self.b.ins().fcmp(FloatCC::Unordered, x, x),
            (UnaryOp::Exp | UnaryOp::Erf | UnaryOp::Tanh | UnaryOp::Log, S::F32) if self.caps.inline_math => {
                self.inline_math(op, x)
            }
            (op, S::F32) => {
                let h = unary_helper(op, false).ok_or_else(|| format!("vector {}", op.name()))?;
                self.call_lanes(h, &[x])
            }
            _ => return Err(format!("vector {} of {t}", op.name())),
        })
    }

    fn vbinary(&mut self, op: BinaryOp, t: S, x: Value, y: Value) -> R<Value> {
        use BinaryOp as B;
        // Bool lanes are masks (all ones or zero): their comparisons are bitwise.
        if t != S::Bool {
            if let Some(v) = self.lane_binary(op, t == S::F32, t == S::I32, x, y) {
                return Ok(v);
            }
        }
        Ok(match (t, op) {
            (S::F32, B::Rem) => self.call_lanes(Helper::FmodF32, &[x, y]),
            (S::F32, B::Pow) => self.call_lanes(Helper::PowF32, &[x, y]),
            (S::Bool, B::And) => self.b.ins().band(x, y),
            (S::Bool, B::Or) => self.b.ins().bor(x, y),
            (S::Bool, B::Xor | B::Ne) => self.b.ins().bxor(x, y),
            (S::Bool, B::Eq) => {
                let d = self.b.ins().bxor(x, y);
                self.b.ins().bnot(d)
            }
            _ => return Err(format!("vector {} of {t}", op.name())),
        })
    }

    // ---- reductions -----------------------------------------------------------------

    /// `acc ∘ x` for reduce `op` on values of type `t` (scalars or vectors alike).
    fn combine(&mut self, op: ReduceOp, t: S, acc: Value, x: Value) -> Value {
        let ins = self.b.ins();
        match (op, t) {
            (ReduceOp::Sum, S::F32 | S::F64) => ins.fadd(acc, x),
            (ReduceOp::Sum, _) => ins.iadd(acc, x),
            (ReduceOp::Prod, S::F32 | S::F64) => ins.fmul(acc, x),
            (ReduceOp::Prod, _) => ins.imul(acc, x),
            (ReduceOp::Max, S::F32 | S::F64) => ins.fmax(acc, x),
            (ReduceOp::Min, S::F32 | S::F64) => ins.fmin(acc, x),
            (ReduceOp::Max, t) if t.is_signed() => ins.smax(acc, x),
            (ReduceOp::Min, t) if t.is_signed() => ins.smin(acc, x),
            (ReduceOp::Max, _) => ins.umax(acc, x),
            _ => ins.umin(acc, x),
        }
    }

    /// Loops over `vars` (outermost first), evaluating each loop's scope, and calls
    /// `f` in the innermost body. With `unroll`, a loop of at most [`UNROLL_REDUCE`]
    /// iterations (a pooling window's axis) is unrolled: its body once per value of
    /// the variable.
    fn reduce_loops(&mut self, vars: &[VarId], unroll: bool, f: &mut dyn FnMut(&mut Self) -> R<()>) -> R<()> {
        let Some((first, rest)) = vars.split_first() else { return f(self) };
        let v = first.0;
        let n = self.k.vars[v as usize] as i64;
        if unroll && n <= UNROLL_REDUCE {
            let ctr = self.counter(v);
            for i in 0..n {
                let c = self.b.ins().iconst(types::I64, i);
                self.b.def_var(ctr, c);
                self.items(v + 1)?;
                self.reduce_loops(rest, unroll, f)?;
                self.clear(v + 1);
            }
            let end = self.b.ins().iconst(types::I64, n);
            self.b.def_var(ctr, end);
            return Ok(());
        }
        let zero = self.b.ins().iconst(types::I64, 0);
        self.counted_loop(v, zero, n, 1, |em| {
            em.items(v + 1)?;
            em.reduce_loops(rest, unroll, f)?;
            em.clear(v + 1);
            Ok(())
        })
    }

    /// Whether the expression under `e` holds a reduction.
    fn has_reduce(&self, e: ExprId) -> bool {
        let mut stack = vec![e];
        let mut seen = std::collections::HashSet::new();
        while let Some(x) = stack.pop() {
            if !seen.insert(x.0) {
                continue;
            }
            let n = &self.k.node(x).expr;
            if matches!(n, Expr::Reduce { .. }) {
                return true;
            }
            n.for_each_operand(|o| stack.push(o));
        }
        false
    }

    fn reduce(&mut self, i: u32, op: ReduceOp, vars: &[VarId], body: ExprId) -> R<Value> {
        let bt = self.ty(body);
        let varying = self.varying(i);
        if op.is_arg() {
            return self.arg_reduce(op, vars, body, bt);
        }
        if self.vmode.is_none() && self.vec_red[i as usize] {
            return self.reduce_vec_inner(op, vars, body, bt);
        }
        let init_bits = identity(op, bt);
        let init = self.constant(bt, init_bits);
        let (vt, init) = if varying { (vclif(bt), self.splat(bt, init)) } else { (clif(bt), init) };
        let acc = self.b.declare_var(vt);
        self.b.def_var(acc, init);
        // Unrolled only where the body holds no other reduction (whose loops would be
        // copied with it).
        let unroll = self.caps.unroll && !self.has_reduce(body);
        self.reduce_loops(vars, unroll, &mut |em| {
            let x = if varying { em.vget(body)? } else { em.get(body)? };
            let a = em.b.use_var(acc);
            let r = em.combine(op, bt, a, x);
            em.b.def_var(acc, r);
            Ok(())
        })?;
        Ok(self.b.use_var(acc))
    }

    /// ArgMax/ArgMin over one variable: the first position wins ties unless `last`;
    /// the first element is always taken, so a NaN there stays the answer.
    fn arg_reduce(&mut self, op: ReduceOp, vars: &[VarId], body: ExprId, bt: S) -> R<Value> {
        let (max, last) = match op {
            ReduceOp::ArgMax { last } => (true, last),
            ReduceOp::ArgMin { last } => (false, last),
            _ => return Err("not an arg reduce".into()),
        };
        let w = vars.first().ok_or("arg reduce without a variable")?.0;
        let pos = self.b.declare_var(types::I64);
        let zero = self.b.ins().iconst(types::I64, 0);
        self.b.def_var(pos, zero);
        let best = self.b.declare_var(clif(bt));
        let b0 = self.constant(bt, 0);
        self.b.def_var(best, b0);
        self.reduce_loops(vars, false, &mut |em| {
            let x = em.get(body)?;
            let b = em.b.use_var(best);
            let c = em.counter(w);
            let wv = em.b.use_var(c);
            let first = em.b.ins().icmp_imm_s(IntCC::Equal, wv, 0);
            let cmp = if max { BinaryOp::Gt } else { BinaryOp::Lt };
            let mut take = em.binary(cmp, bt, x, b, None)?;
            if last {
                let eq = em.binary(BinaryOp::Eq, bt, x, b, None)?;
                take = em.b.ins().bor(take, eq);
            }
            let take = em.b.ins().bor(take, first);
            let nb = em.b.ins().select(take, x, b);
            em.b.def_var(best, nb);
            let p = em.b.use_var(pos);
            let np = em.b.ins().select(take, wv, p);
            em.b.def_var(pos, np);
            Ok(())
        })?;
        Ok(self.b.use_var(pos))
    }

    /// A reduce whose innermost variable runs four lanes at a time into vector
    /// accumulators, with a scalar tail; the accumulators, their lanes and the tail
    /// combine at the end. Rows of 32 or more run an unrolled loop of four vector
    /// steps into four accumulators (independent chains hide the add latency), then
    /// single vector steps, then the scalar tail.
    fn reduce_vec_inner(&mut self, op: ReduceOp, vars: &[VarId], body: ExprId, bt: S) -> R<Value> {
        let (w, outer) = vars.split_last().ok_or("reduce without variables")?;
        let w = w.0;
        let n = self.k.vars[w as usize] as i64;
        let unroll = if n >= 32 { 4 } else { 1 };
        let init = self.constant(bt, identity(op, bt));
        let acc_s = self.b.declare_var(clif(bt));
        self.b.def_var(acc_s, init);
        let vinit = self.splat(bt, init);
        let accs: Vec<Variable> = (0..unroll)
            .map(|_| {
                let a = self.b.declare_var(vclif(bt));
                self.b.def_var(a, vinit);
                a
            })
            .collect();
        // One vector step at counter `c + 4j` into accumulator `j`.
        let step = |em: &mut Self, j: usize| -> R<()> {
            em.items(w + 1)?;
            let x = em.vget(body)?;
            let a = em.b.use_var(accs[j]);
            let r = em.combine(op, bt, a, x);
            em.b.def_var(accs[j], r);
            em.clear(w + 1);
            Ok(())
        };
        self.reduce_loops(outer, false, &mut |em| {
            let zero = em.b.ins().iconst(types::I64, 0);
            em.presplat(w)?;
            em.vmode = Some(w);
            let mut r = Ok(());
            if unroll > 1 {
                r = em.counted_loop(w, zero, n, 4 * unroll as i64, |em| {
                    let ctr = em.counter(w);
                    let c = em.b.use_var(ctr);
                    for j in 0..unroll {
                        if j > 0 {
                            let cj = em.b.ins().iadd_imm_s(c, 4 * j as i64);
                            em.b.def_var(ctr, cj);
                        }
                        step(em, j)?;
                    }
                    // The loop's own increment starts from the first step's counter.
                    em.b.def_var(ctr, c);
                    Ok(())
                });
            }
            if r.is_ok() {
                let ctr = em.counter(w);
                let start = if unroll > 1 { em.b.use_var(ctr) } else { zero };
                r = em.counted_loop(w, start, n, 4, |em| step(em, 0));
            }
            em.vmode = None;
            em.splats.clear();
            r?;
            let c = em.counter(w);
            let c = em.b.use_var(c);
            em.counted_loop(w, c, n, 1, |em| {
                em.items(w + 1)?;
                let x = em.get(body)?;
                let a = em.b.use_var(acc_s);
                let r = em.combine(op, bt, a, x);
                em.b.def_var(acc_s, r);
                em.clear(w + 1);
                Ok(())
            })
        })?;
        let mut v = self.b.use_var(accs[0]);
        if unroll > 1 {
            let vs: Vec<Value> = accs.iter().map(|&a| self.b.use_var(a)).collect();
            let a = self.combine(op, bt, vs[0], vs[1]);
            let b = self.combine(op, bt, vs[2], vs[3]);
            v = self.combine(op, bt, a, b);
        }
        let l: Vec<Value> = (0..4u8).map(|j| self.b.ins().extractlane(v, j)).collect();
        let a = self.combine(op, bt, l[0], l[1]);
        let b = self.combine(op, bt, l[2], l[3]);
        let h = self.combine(op, bt, a, b);
        let s = self.b.use_var(acc_s);
        Ok(self.combine(op, bt, h, s))
    }
}

/// The sign–exponent–mantissa minifloats (the 8-bit floats and the OCP MX element types
/// `f6E3M2FN`, `f4E2M1FN`): mantissa bits, exponent bias, largest finite value, the sign
/// bit, and which special-value scheme they use (see `kiln_ir::lowp`).
struct F8 {
    man: i64,
    bias: i64,
    max: f32,
    /// The sign bit of a code (0x80, 0x20 or 0x08): the code is `log2(sign) + 1` bits wide.
    sign: i64,
    /// All-ones exponent is ±inf (mantissa 0) or NaN (E5M2).
    ieee: bool,
    /// No negative zero; code 0x80 is the only NaN (the FNUZ formats).
    uz: bool,
    /// No infinity and no NaN (the OCP types): overflow and ±inf always clamp to ±max,
    /// NaN gives the zero of the other sign.
    ocp: bool,
}

impl F8 {
    fn of(d: DType) -> Option<F8> {
        let f8 = |man, bias, max, ieee, uz| F8 { man, bias, max, sign: 0x80, ieee, uz, ocp: false };
        let ocp = |man, bias, max, sign| F8 { man, bias, max, sign, ieee: false, uz: false, ocp: true };
        Some(match d {
            DType::F8E4M3FN => f8(3, 7, 448.0, false, false),
            DType::F8E4M3FNUZ => f8(3, 8, 240.0, false, true),
            DType::F8E5M2 => f8(2, 15, 57344.0, true, false),
            DType::F8E5M2FNUZ => f8(2, 16, 57344.0, false, true),
            DType::F6E3M2FN => ocp(2, 3, 28.0, 0x20),
            DType::F4E2M1FN => ocp(1, 1, 6.0, 0x08),
            _ => return None,
        })
    }

    /// Exponent bits.
    fn ebits(&self) -> i64 {
        self.sign.trailing_zeros() as i64 - self.man
    }
}
