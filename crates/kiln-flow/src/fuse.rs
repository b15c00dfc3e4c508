//! Dispatch formation: fusing producers into consumers.
//!
//! A kernel reads its operands through loads; fusing the dispatch `P` that produces
//! operand `X` into its consumer `D` replaces each load of `X` in `D` by `P`'s
//! expression evaluated at the load's index (through the flat position when `D` reads
//! `X` under an alias's shape). `X` then never touches memory for that consumer; once
//! no dispatch reads it and it is not a graph output, `P` is dead.
//!
//! Whether to fuse is decided by one cost model for every op, not by op patterns:
//! [`work`] counts how often each node of a kernel is evaluated when every node runs
//! at the loop depth of its innermost free variable (how the code generators place
//! them). Fusion is taken when the fused kernel does no more than about the work of
//! the two kernels plus the memory traffic of `X` it saves. So elementwise chains,
//! bias and activation epilogues of contractions, residual adds, layout ops (Transpose,
//! Slice, Pad, broadcasts) and row statistics read at a row's index (a mean, a max, a
//! sum of exponentials) fuse; a contraction whose every result would be recomputed per
//! consumer element does not. Producers with several readers are duplicated only when
//! they are small, read at most three operands and contain no reduction; a producer
//! refused because its result was shared is tried again after each fusion into the same
//! consumer (SiLU's `x·sigmoid(x)` reads the convolution twice until the sigmoid is
//! fused into the product).
//!
//! No fusion demotes a fast kernel (`demotes`): where either kernel's class has a
//! dedicated fast path (a contraction or window microkernel, a row kernel), the fused
//! kernel's class must be at least as fast ([`KernelClass::rank`]), and a contraction
//! counts as fast only where a matrix microkernel reads it in place, or will once its
//! columns are gathered ([`crate::layout::contraction_in_place`]), and an elementwise
//! kernel computing a transcendental counts as a row kernel only where it reads along
//! its rows (a DepthToSpace stays apart from the Softplus after it). So a contraction
//! takes no gather, no operand's computation and no layout change that breaks its
//! column layout, a depthwise window ([`crate::window`]) only what keeps its epilogue a
//! chain of supported steps; such a layout op stays a Movement dispatch. A resampling
//! ([`crate::resample`]: Resize's interpolation or table copy, run from tables of its
//! taps only in the lowering's form) takes nothing and fuses into nothing. Scalar
//! constants become literals.

use std::collections::HashMap;

use crate::class::{classify, KernelClass, Rank};
use crate::contraction::Contraction;
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, KernelBuilder, ReduceOp, ScalarType, VarId};
use crate::layout::contraction_in_place;
use crate::lower::{flat_index, unflatten};
use crate::program::{BufferId, BufferKind, FlowProgram};
use crate::resample::Resample;

/// Largest fused kernel, in nodes (bounds code size and compile time).
const MAX_NODES: usize = 768;
/// Largest producer duplicated into several consumers, in nodes.
const MAX_DUPLICATED_NODES: usize = 24;
/// Most loads of a producer duplicated into several consumers. Each consumer then reads
/// the producer's operands where it read its result: with two readers and three loads
/// the reads match the unfused program's write and reads; past that a duplicated
/// producer moves more memory than it saves, and duplicated producers that took in
/// duplicated producers grow without end (a residual stream: layer `k`'s normalisation
/// recomputed the sum of every earlier layer's output, smart-turn's 13 such kernels
/// 2.7 ms of a 230 ms call).
const MAX_DUPLICATED_LOADS: usize = 3;

/// Fuses the program's dispatches in place (see the module docs).
pub fn fuse(p: &mut FlowProgram) {
    fuse_with(p, true)
}

/// [`fuse`]; `contractions`: keep contractions addressable (see the module docs).
pub fn fuse_with(p: &mut FlowProgram, contractions: bool) {
    for d in 0..p.dispatches.len() {
        inline_scalar_constants(p, d);
    }
    let outputs: Vec<BufferId> = p.outputs.iter().map(|&o| p.storage(o)).collect();
    for d in 0..p.dispatches.len() {
        // Keep fusing into `d` until nothing more is taken: a fused producer brings its
        // own operands, which may be fusable in turn.
        // Producers refused, and whether their result was shared then: a fusion that
        // takes another reader's place (SiLU's `x · sigmoid(x)`: once the sigmoid is in
        // the product, the product is the convolution's only reader) makes a shared
        // result unshared, so those refused as shared are tried again after each fusion.
        let mut tried: Vec<(usize, bool)> = Vec::new();
        loop {
            let producers = p.producers();
            let readers = reader_counts(p);
            let mut changed = false;
            for k in 0..p.dispatches[d].operands.len() {
                let x = p.dispatches[d].operands[k];
                let s = p.storage(x);
                let Some(pi) = producers[s.index()] else { continue };
                if pi >= d || tried.iter().any(|t| t.0 == pi) {
                    continue;
                }
                let shared = readers[s.index()] > 1 || outputs.contains(&s);
                if try_fuse(p, d, k, pi, shared, contractions) {
                    changed = true;
                    break;
                }
                tried.push((pi, shared));
            }
            if !changed {
                break;
            }
            tried.retain(|t| !t.1);
        }
    }
    for d in &mut p.dispatches {
        if classify(&d.kernel) == KernelClass::General {
            if let Some(k) = unroll_short_sums(&d.kernel) {
                d.kernel = k;
            }
        }
    }
    p.classify();
}

/// The most terms of a sum [`unroll_short_sums`] writes out.
const SHORT_SUM: u64 = 4;

/// `k` with each sum over one variable of at most [`SHORT_SUM`] positions written out
/// as additions of its terms, each term built with the variable a constant; `None`
/// where `k` has no such sum. Applied to kernels no fast path takes: a short sum (the
/// two parts of a complex value, `√(re² + im²)` after a Concat of the parts) leaves a
/// reduction variable that selects between pieces and clamps their indices, which no
/// vector kernel evaluates per reduction step; written out, the builder folds the
/// constant comparisons, selects and clamps of each term, and takes apart the quotients
/// of flat indices ([`KernelBuilder::take_apart_multiples`]: `(36·v + x) rem 36` is `x`
/// for `0 ≤ x < 36`), and what is left reads along the output's axes alone.
/// (`(t₀ + t₁) + t₂` against the reduction's `0 + t₀ + t₁ + t₂`: the same sum but for
/// the sign of an all-zero one.)
pub fn unroll_short_sums(k: &Kernel) -> Option<Kernel> {
    let short = |v: &[VarId]| v.len() == 1 && k.vars[v[0].0 as usize] <= SHORT_SUM;
    if !k.nodes.iter().any(|n| matches!(&n.expr, Expr::Reduce { op: ReduceOp::Sum, vars, .. } if short(vars))) {
        return None;
    }
    let rank = k.out_rank();
    let mut b = KernelBuilder::new(k.name.clone(), k.inputs.clone(), k.output.clone());
    b.take_apart_multiples();
    let mut u = Unroll { k, unrolled: Vec::new(), vars: HashMap::new(), memo: HashMap::new() };
    for n in &k.nodes {
        match &n.expr {
            Expr::Reduce { op: ReduceOp::Sum, vars, .. } if short(vars) => u.unrolled.push(vars[0].0),
            Expr::Reduce { vars, .. } => {
                for v in vars {
                    if v.0 as usize >= rank && !u.vars.contains_key(&v.0) {
                        u.vars.insert(v.0, b.new_var(k.vars[v.0 as usize]));
                    }
                }
            }
            _ => {}
        }
    }
    let root = u.node(&mut b, k.root, &[]);
    b.finish(root).ok()
}

/// [`unroll_short_sums`]' copy of a kernel into a builder.
struct Unroll<'a> {
    k: &'a Kernel,
    /// The variables of the sums written out.
    unrolled: Vec<u32>,
    /// Reduction variables kept: their new ids.
    vars: HashMap<u32, VarId>,
    /// Nodes copied, by node and the values of the written-out variables in scope.
    memo: HashMap<(u32, Vec<(u32, i64)>), ExprId>,
}

impl Unroll<'_> {
    fn node(&mut self, b: &mut KernelBuilder, e: ExprId, env: &[(u32, i64)]) -> ExprId {
        let key = (e.0, env.to_vec());
        if let Some(&id) = self.memo.get(&key) {
            return id;
        }
        let n = self.k.node(e);
        let id = match &n.expr {
            Expr::Var(v) => match env.iter().find(|x| x.0 == v.0) {
                Some(&(_, at)) => b.index(at),
                None => b.var(self.vars.get(&v.0).copied().unwrap_or(*v)),
            },
            Expr::Reduce { op: ReduceOp::Sum, vars, body } if vars.len() == 1 && self.unrolled.contains(&vars[0].0) => {
                let v = vars[0].0;
                let mut sum = None;
                for at in 0..self.k.vars[v as usize] as i64 {
                    let mut inner = env.to_vec();
                    inner.push((v, at));
                    let t = self.node(b, *body, &inner);
                    sum = Some(match sum {
                        None => t,
                        Some(s) => b.add(s, t),
                    });
                }
                match sum {
                    Some(s) => s,
                    // (A sum over no positions.)
                    None => b.constant(n.ty, 0),
                }
            }
            expr => {
                let mut ops = Vec::new();
                expr.for_each_operand(|o| ops.push(o));
                let mapped: Vec<ExprId> = ops.iter().map(|&o| self.node(b, o, env)).collect();
                let mut it = mapped.into_iter();
                let mut x = expr.map_operands(|o| it.next().unwrap_or(o));
                if let Expr::Reduce { vars, .. } = &mut x {
                    for v in vars.iter_mut() {
                        *v = self.vars.get(&v.0).copied().unwrap_or(*v);
                    }
                }
                b.raw(n.ty, x)
            }
        };
        self.memo.insert(key, id);
        id
    }
}

/// How many (live dispatch, operand) pairs read each storage buffer. A dispatch is
/// live when a graph output or a live dispatch reads its result: a producer already
/// fused into every consumer no longer counts as a reader of its own operands (so
/// `x` in `0.5·x·(1 + erf(x/√2))`, read by two ops that fused into one, has one
/// reader, and its producer can fuse).
pub(crate) fn reader_counts(p: &FlowProgram) -> Vec<usize> {
    let mut n = vec![0; p.buffers.len()];
    let mut live = vec![false; p.buffers.len()];
    for &o in &p.outputs {
        live[p.storage(o).index()] = true;
    }
    // Dispatches are in execution order: every reader of a result comes after it.
    for d in p.dispatches.iter().rev() {
        if !live[p.storage(d.result).index()] {
            continue;
        }
        // A guard's condition is read too (by the plan, not the kernel).
        for &o in d.operands.iter().chain(d.guard.iter().map(|(c, _)| c)) {
            let s = p.storage(o).index();
            n[s] += 1;
            live[s] = true;
        }
    }
    n
}

/// Replaces loads of one-element constants by literals and drops those operands.
fn inline_scalar_constants(p: &mut FlowProgram, d: usize) {
    let disp = &p.dispatches[d];
    // (A scatter's store is no expression of the output index: it is left as it is.)
    if disp.kernel.scatter.is_some() {
        return;
    }
    let mut lits: HashMap<u32, u64> = HashMap::new();
    for (k, &o) in disp.operands.iter().enumerate() {
        if let BufferKind::Const(t) = &p.buffers[p.storage(o).index()].kind {
            if t.numel() == 1 && !t.dtype().is_packed() {
                let ty = ScalarType::of_storage(t.dtype());
                let bits = match ty {
                    ScalarType::F32 => (t.to_f64_vec()[0] as f32).to_bits() as u64,
                    ScalarType::F64 => t.to_f64_vec()[0].to_bits(),
                    _ => ty.wrap(t.to_i64_vec().map(|v| v[0] as u64).unwrap_or(0)),
                };
                lits.insert(k as u32, bits);
            }
        }
    }
    if lits.is_empty() {
        return;
    }
    let keep: Vec<usize> = (0..disp.operands.len()).filter(|k| !lits.contains_key(&(*k as u32))).collect();
    let mut new_index: HashMap<u32, u32> = HashMap::new();
    for (j, &k) in keep.iter().enumerate() {
        new_index.insert(k as u32, j as u32);
    }
    let inputs = keep.iter().map(|&k| disp.kernel.inputs[k].clone()).collect();
    let mut b = KernelBuilder::new(disp.kernel.name.clone(), inputs, disp.kernel.output.clone());
    let mut t = Translate::new(&disp.kernel);
    let root = t.run(
        &mut b,
        &disp.kernel,
        &mut |b, input, _index, ty| match lits.get(&input) {
            Some(&bits) => LoadAction::Value(b.constant(ty, bits)),
            None => LoadAction::Input(new_index[&input]),
        },
        &disp.kernel,
        &[],
    );
    if let Ok(k) = b.finish(root) {
        let operands = keep.iter().map(|&k| p.dispatches[d].operands[k]).collect();
        let disp = &mut p.dispatches[d];
        disp.kernel = k;
        disp.operands = operands;
    }
}

/// Tries to fuse dispatch `pi` (producer of operand `k` of dispatch `d`) into `d`.
fn try_fuse(p: &mut FlowProgram, d: usize, k: usize, pi: usize, shared: bool, contractions: bool) -> bool {
    // The producer's work moves into the consumer: only where the producer runs
    // whenever the consumer does (an `If` branch may take in work from outside it,
    // never the other way).
    if !crate::program::guard_within(&p.dispatches[pi].guard, &p.dispatches[d].guard) {
        return false;
    }
    let (dk, pk) = (&p.dispatches[d].kernel, &p.dispatches[pi].kernel);
    let has_reduce = pk.nodes.iter().any(|n| matches!(n.expr, Expr::Reduce { .. }));
    let loads = pk.nodes.iter().filter(|n| matches!(n.expr, Expr::Load { .. })).count();
    if shared && (has_reduce || pk.nodes.len() > MAX_DUPLICATED_NODES || loads > MAX_DUPLICATED_LOADS) {
        return false;
    }
    if pk.output.shape.numel() == 0 || dk.nodes.len() + pk.nodes.len() > MAX_NODES {
        return false;
    }
    let Some((fused, operands)) = fused_kernel(p, d, k, pi) else { return false };
    // A bounded dimension's mask stays out of a product it would keep at the bound.
    if has_reduce && p.fusion_masks_bounded_rows(d, pi, &fused, &operands) {
        return false;
    }
    let (dk, pk) = (&p.dispatches[d].kernel, &p.dispatches[pi].kernel);
    let resamples = |k: &Kernel| Resample::is_interpolation(k) || Resample::is_table_copy(k);
    if contractions && (demotes(dk, pk, &fused) || resamples(dk) || resamples(pk)) {
        return false;
    }
    let unfused = work(dk) + work(pk) + 2.0 * pk.output.shape.numel() as f64;
    let w = work(&fused);
    let own = if shared { work(dk) + work(pk) } else { unfused };
    if w > 1.1 * own + 64.0 {
        return false;
    }
    let mut sources = p.dispatches[pi].sources.clone();
    sources.extend(p.dispatches[d].sources.iter().cloned());
    let disp = &mut p.dispatches[d];
    disp.kernel = fused;
    disp.operands = operands;
    disp.sources = sources;
    true
}

/// The kernel of dispatch `d` with dispatch `pi`, the producer of its operand `k`,
/// substituted for every load of that operand's storage, and the fused kernel's
/// operands: `d`'s other operands, then `pi`'s not already present. `None` where the
/// fused kernel is not a valid kernel. Decides nothing: the callers weigh it
/// (`try_fuse`; `crate::attention`).
pub(crate) fn fused_kernel(p: &FlowProgram, d: usize, k: usize, pi: usize) -> Option<(Kernel, Vec<BufferId>)> {
    let (dk, pk) = (&p.dispatches[d].kernel, &p.dispatches[pi].kernel);
    // A scatter neither takes a producer in nor goes into a consumer: its points are not
    // the output's elements.
    if dk.scatter.is_some() || pk.scatter.is_some() {
        return None;
    }
    let x = p.dispatches[d].operands[k];
    // The operand list of the fused kernel: d's without `x` (every operand slot
    // reading x's storage), then p's operands not already present.
    let xs = p.storage(x);
    let d_ops = p.dispatches[d].operands.clone();
    let p_ops = p.dispatches[pi].operands.clone();
    let mut operands: Vec<BufferId> = Vec::new();
    let mut inputs = Vec::new();
    let mut d_map: HashMap<u32, u32> = HashMap::new();
    let mut fused_slots: Vec<(u32, BufferId)> = Vec::new();
    for (j, &o) in d_ops.iter().enumerate() {
        if p.storage(o) == xs {
            fused_slots.push((j as u32, o));
            continue;
        }
        d_map.insert(j as u32, slot_of(&mut operands, &mut inputs, o, &dk.inputs[j]));
    }
    let mut p_map: Vec<u32> = Vec::new();
    for (j, &o) in p_ops.iter().enumerate() {
        p_map.push(slot_of(&mut operands, &mut inputs, o, &pk.inputs[j]));
    }
    let mut b = KernelBuilder::new(dk.name.clone(), inputs, dk.output.clone());
    let mut t = Translate::new(dk);
    let root = t.run(
        &mut b,
        dk,
        &mut |b, input, _index: &[ExprId], _ty| {
            if let Some(&j) = d_map.get(&input) {
                return LoadAction::Input(j);
            }
            let Some(&(_, via)) = fused_slots.iter().find(|(j, _)| *j == input) else {
                b.fail("load from an unknown operand");
                return LoadAction::Input(0);
            };
            let _ = via;
            LoadAction::Substitute(dk.inputs[input as usize].shape.dims().to_vec())
        },
        pk,
        &p_map,
    );
    let fused = b.finish(root).ok()?;
    Some((fused, operands))
}

/// How fast `k` runs, as its class's [`KernelClass::rank`], except that a contraction a
/// matrix microkernel cannot read in place, even after its columns are gathered
/// ([`crate::layout::contraction_in_place`]), runs on the general path: rank 3.
///
/// An elementwise kernel that computes a transcendental (exp, log, tanh, erf, …: SiLU,
/// Softplus, GELU) and reads every input along its rows is compute-bound and vectorised
/// like a row kernel (`kiln-codegen`'s `cpu::rows` takes it): Rows' rank. Fused with a
/// layout op that makes it read across its rows (a DepthToSpace before a Softplus), it
/// would compute every exp and log one lane at a time.
fn rank(k: &Kernel) -> u8 {
    // An integer contraction an integer microkernel reads in place runs as fast as a
    // float one (whatever class its epilogue gives it), as long as its epilogue computes
    // in the microkernel's i32/f32 lanes: an f64 step (TFLite's fixed-point
    // requantisation, written in exact f64 by the importer) sends the whole contraction
    // to the general path, so it stays a dispatch of its own.
    if Contraction::of_int(k).is_some_and(|c| c.in_place(k)) {
        if k.nodes.iter().any(|n| n.ty == ScalarType::F64) {
            return KernelClass::General.rank();
        }
        return KernelClass::Contraction.rank();
    }
    match classify(k) {
        KernelClass::Contraction if !contraction_in_place(k) => KernelClass::General.rank(),
        // A float contraction's epilogue computes f32 and bool lanes: one that computes
        // i32 (the exact float form of an integer product before its fixed-point
        // requantisation) runs on the general path, so the integer arithmetic stays a
        // vector kernel of its own.
        KernelClass::Contraction if k.nodes.iter().any(|n| matches!(n.ty, ScalarType::I32 | ScalarType::U32)) => {
            KernelClass::General.rank()
        }
        KernelClass::Elementwise if transcendental(k) && reads_along_rows(k) => KernelClass::Rows.rank(),
        class => class.rank(),
    }
}

/// Whether `k` computes a transcendental.
fn transcendental(k: &Kernel) -> bool {
    use crate::kernel::UnaryOp as U;
    k.nodes.iter().any(|n| {
        matches!(n.expr, Expr::Unary(op, _)
            if !matches!(op, U::Neg | U::Abs | U::Not | U::Sqrt | U::Floor | U::Ceil | U::Round | U::Trunc | U::IsNan))
    })
}

/// Output rows sampled by [`reads_along_rows`], and steps along each.
const SAMPLE_ROWS: usize = 3;
const SAMPLE_STEPS: u64 = 64;

/// Whether every load of `k` reads along the output's rows: at the first, middle and
/// last output row, each of the first [`SAMPLE_STEPS`] steps of the innermost output
/// variable moves each load's flat offset by 0 or 1 element. Evaluated, not derived:
/// an index built through a reshape (`flat div 12`, `(flat div 4) rem 3`, `flat rem 4`)
/// is contiguous although no affine form says so; a load whose index reads an input
/// (a gather) does not read along the rows.
fn reads_along_rows(k: &Kernel) -> bool {
    let rank = k.out_rank();
    if rank == 0 || k.output.shape.numel() == 0 {
        return false;
    }
    let dims: Vec<i64> = k.vars[..rank].iter().map(|&d| d as i64).collect();
    let steps = (dims[rank - 1] as u64).min(SAMPLE_STEPS) as i64;
    for n in &k.nodes {
        let Expr::Load { input, index, .. } = &n.expr else { continue };
        let Some(ty) = k.inputs.get(*input as usize) else { return false };
        let mut evals = Vec::with_capacity(index.len());
        for &e in index {
            match crate::interp::NodeEval::new(k, e) {
                Some(ev) => evals.push(ev),
                None => return false,
            }
        }
        let mut strides = vec![1i64; index.len()];
        for d in (0..index.len().saturating_sub(1)).rev() {
            strides[d] = strides[d + 1].wrapping_mul(ty.shape.dims().get(d + 1).copied().unwrap_or(1) as i64);
        }
        for r in 0..SAMPLE_ROWS {
            // Row r of the samples: every outer variable at 0, its middle or its last value.
            let mut env: Vec<i64> = dims.iter().map(|&d| (d - 1) * r as i64 / (SAMPLE_ROWS as i64 - 1)).collect();
            let mut last = None;
            for j in 0..steps {
                env[rank - 1] = j;
                let flat = evals
                    .iter_mut()
                    .zip(&strides)
                    .fold(0i64, |f, (ev, &s)| f.wrapping_add((ev.at(&env) as i64).wrapping_mul(s)));
                if last.is_some_and(|l: i64| !matches!(flat.wrapping_sub(l), 0 | 1)) {
                    return false;
                }
                last = Some(flat);
            }
        }
    }
    true
}

/// Whether fusing producer `pk` into consumer `dk` as `fused` would move the work of a
/// kernel with a dedicated fast path (a contraction or window microkernel, a row
/// kernel: rank 0 or 1) into a kernel of a slower rank. The cost model cannot see
/// that: a convolution that takes in a Transpose of its input reads its columns 256
/// elements apart, which no microkernel does, and its whole product runs scalar (a
/// 36× slower model); a max pool that takes in a Concat reads two inputs by position,
/// which no window kernel does. Such a layout op stays a dispatch of its own (a
/// Movement kernel: one vectorised copy). Kernels of the other classes fuse as the cost
/// model says: a gather may take in the elementwise op before it.
fn demotes(dk: &Kernel, pk: &Kernel, fused: &Kernel) -> bool {
    let fast = rank(dk).min(rank(pk));
    fast <= KernelClass::Rows.rank() && rank(fused) > fast
}

fn slot_of(
    operands: &mut Vec<BufferId>,
    inputs: &mut Vec<kiln_ir::TensorType>,
    o: BufferId,
    ty: &kiln_ir::TensorType,
) -> u32 {
    if let Some(j) = operands.iter().zip(inputs.iter()).position(|(&b, t)| b == o && t == ty) {
        return j as u32;
    }
    operands.push(o);
    inputs.push(ty.clone());
    operands.len() as u32 - 1
}

/// What to do with a load while translating a kernel.
enum LoadAction {
    /// Keep it, reading this input of the new kernel.
    Input(u32),
    /// Replace it by this value.
    Value(ExprId),
    /// Replace it by the producer's expression; the load reads the producer's result
    /// under these dimensions (an alias view, or its own shape).
    Substitute(Vec<usize>),
}

/// Copies a kernel's nodes into a builder, remapping variables and loads.
struct Translate {
    map: Vec<ExprId>,
    vars: HashMap<u32, VarId>,
    rank: usize,
}

impl Translate {
    fn new(k: &Kernel) -> Translate {
        Translate { map: Vec::with_capacity(k.nodes.len()), vars: HashMap::new(), rank: k.out_rank() }
    }

    fn var(&mut self, b: &mut KernelBuilder, k: &Kernel, v: VarId) -> VarId {
        if (v.0 as usize) < self.rank {
            return v;
        }
        *self.vars.entry(v.0).or_insert_with(|| b.new_var(k.vars[v.0 as usize]))
    }

    /// Translates `k` into `b` and returns the new root. `on_load(b, input, index, ty)`
    /// decides each load's fate; substitutions splice in `producer` (with its inputs
    /// mapped through `producer_inputs`).
    fn run(
        &mut self,
        b: &mut KernelBuilder,
        k: &Kernel,
        on_load: &mut dyn FnMut(&mut KernelBuilder, u32, &[ExprId], ScalarType) -> LoadAction,
        producer: &Kernel,
        producer_inputs: &[u32],
    ) -> ExprId {
        for n in &k.nodes {
            let m = |e: &ExprId| self.map[e.index()];
            let id = match &n.expr {
                Expr::Var(v) => {
                    let nv = self.var(b, k, *v);
                    b.var(nv)
                }
                Expr::Load { input, index, bounds } => {
                    let index: Vec<ExprId> = index.iter().map(m).collect();
                    match on_load(b, *input, &index, n.ty) {
                        LoadAction::Input(j) => b.raw(n.ty, Expr::Load { input: j, index, bounds: *bounds }),
                        LoadAction::Value(v) => v,
                        LoadAction::Substitute(view) => {
                            substitute(b, &view, &index, *bounds, n.ty, producer, producer_inputs)
                        }
                    }
                }
                Expr::Reduce { op, vars, body } => {
                    let body = m(body);
                    let vars = vars.iter().map(|&v| self.var(b, k, v)).collect();
                    b.raw(n.ty, Expr::Reduce { op: *op, vars, body })
                }
                // Constants and arithmetic: the same node over the translated operands.
                e => b.raw(n.ty, e.map_operands(|o| m(&o))),
            };
            self.map.push(id);
        }
        self.map[k.root.index()]
    }
}

/// The producer's value at `index` of its result viewed with dimensions `view`.
fn substitute(
    b: &mut KernelBuilder,
    view: &[usize],
    index: &[ExprId],
    bounds: Bounds,
    ty: ScalarType,
    producer: &Kernel,
    producer_inputs: &[u32],
) -> ExprId {
    // Bring the index into range first where the load tolerated indices outside.
    let mut inside: Option<ExprId> = None;
    let mut idx: Vec<ExprId> = index.to_vec();
    if bounds != Bounds::InBounds {
        for (i, &dim) in idx.iter_mut().zip(view) {
            let zero = b.index(0);
            let hi = b.index(dim as i64 - 1);
            if let Bounds::Pad(_) = bounds {
                let ge = b.binary(BinaryOp::Ge, *i, zero);
                let le = b.binary(BinaryOp::Le, *i, hi);
                let ok = b.binary(BinaryOp::And, ge, le);
                inside = Some(match inside {
                    None => ok,
                    Some(c) => b.binary(BinaryOp::And, c, ok),
                });
            }
            let lo = b.binary(BinaryOp::Max, *i, zero);
            *i = b.binary(BinaryOp::Min, lo, hi);
        }
    }
    let pdims = producer.output.shape.dims();
    if view != pdims {
        let flat = flat_index(b, view, &idx);
        idx = unflatten(b, pdims, flat);
    }
    let mut t = Translate::new(producer);
    // Producer output variables read as the load's index.
    let mut map: Vec<ExprId> = Vec::with_capacity(producer.nodes.len());
    for n in &producer.nodes {
        let m = |e: &ExprId| map[e.index()];
        let id = match &n.expr {
            Expr::Var(v) if (v.0 as usize) < producer.out_rank() => idx[v.0 as usize],
            Expr::Var(v) => {
                let nv = *t.vars.entry(v.0).or_insert_with(|| b.new_var(producer.vars[v.0 as usize]));
                b.var(nv)
            }
            Expr::Load { input, index, bounds } => {
                let j = producer_inputs.get(*input as usize).copied().unwrap_or(u32::MAX);
                b.raw(n.ty, Expr::Load { input: j, index: index.iter().map(m).collect(), bounds: *bounds })
            }
            Expr::Reduce { op, vars, body } => {
                let vars = vars
                    .iter()
                    .map(|&v| *t.vars.entry(v.0).or_insert_with(|| b.new_var(producer.vars[v.0 as usize])))
                    .collect();
                b.raw(n.ty, Expr::Reduce { op: *op, vars, body: m(body) })
            }
            e => b.raw(n.ty, e.map_operands(|o| m(&o))),
        };
        map.push(id);
    }
    let value = map[producer.root.index()];
    match (bounds, inside) {
        (Bounds::Pad(bits), Some(ok)) => {
            let pad = b.constant(ty, bits);
            b.select(ok, value, pad)
        }
        _ => value,
    }
}

/// Estimated evaluations of a kernel: every node counted as often as it runs when it
/// is placed at the loop depth of its innermost free variable (transcendentals and
/// divisions weigh more, except integer division by a constant). An attention kernel
/// ([`crate::attention`]) counts what its emitter does instead.
pub fn work(k: &Kernel) -> f64 {
    // An attention kernel runs flash-style, not as its nested reductions read.
    if let Some(a) = crate::attention::Attention::of(k) {
        return crate::attention::work(k, &a);
    }
    // (A scatter's loops are its domain's.)
    let rank = k.index_rank();
    // Owner reduce of each reduction variable.
    let mut owner: HashMap<u32, usize> = HashMap::new();
    for (i, node) in k.nodes.iter().enumerate() {
        if let Expr::Reduce { vars, .. } = &node.expr {
            for v in vars {
                owner.insert(v.0, i);
            }
        }
    }
    let free = k.free_vars();
    // Loop trip product enclosing a node with free variables `fv`.
    fn trips(k: &Kernel, rank: usize, fv: &[u32], owner: &HashMap<u32, usize>, free: &[Vec<u32>], depth: u32) -> f64 {
        let mut t = 1.0;
        let deepest_out = fv.iter().filter(|&&v| (v as usize) < rank).max();
        if let Some(&m) = deepest_out {
            t *= k.vars[..=m as usize].iter().map(|&e| e as f64).product::<f64>();
        }
        let mut seen: Vec<usize> = Vec::new();
        for &v in fv.iter().filter(|&&v| (v as usize) >= rank) {
            let Some(&r) = owner.get(&v) else { continue };
            if seen.contains(&r) || depth > 16 {
                continue;
            }
            seen.push(r);
            if let Expr::Reduce { vars, .. } = &k.nodes[r].expr {
                let inner: f64 = vars.iter().map(|w| k.vars[w.0 as usize] as f64).product();
                let outer = trips(k, rank, &free[r], owner, free, depth + 1);
                t = f64::max(t, inner * outer);
            }
        }
        t
    }
    let mut total = 0.0;
    for (i, node) in k.nodes.iter().enumerate() {
        let weight = match &node.expr {
            Expr::Var(_) | Expr::Const(_) => 0.0,
            Expr::Unary(op, _) if op.float_only() => 8.0,
            // Index arithmetic divides by constant extents: a multiply and a shift.
            Expr::Binary(BinaryOp::Div | BinaryOp::Rem, _, c)
                if !node.ty.is_float() && matches!(k.nodes[c.index()].expr, Expr::Const(_)) =>
            {
                1.0
            }
            Expr::Binary(BinaryOp::Div | BinaryOp::Rem | BinaryOp::Pow, _, _) => 4.0,
            Expr::Reduce { op: ReduceOp::Sum, .. } => 0.0,
            _ => 1.0,
        };
        if weight > 0.0 {
            total += weight * trips(k, rank, &free[i], &owner, &free, 0);
        }
    }
    // Every output element is stored once.
    total + k.output.shape.numel() as f64
}
