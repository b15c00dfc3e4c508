//! Scaled dot-product attention as one kernel: its form, its recogniser and the flow
//! pass that forms it.
//!
//! ## The form
//! An attention kernel ([`KernelClass::Attention`]) computes, for every output position
//! `(o.., d)` (the innermost output variable `d` a column of V),
//!
//! ```text
//! S(j)  = s·Σ_e Q[.., e]·K[.., e, j] + s_m·mask[.., j]     (the mask optional)
//! out   = Σ_j exp(S(j) − M) / L · V[.., j, d]
//! M     = max_j' S(j'),   L = Σ_j'' exp(S(j'') − M)
//! ```
//!
//! written in the kernel IR as it is after fusion substitutes the score product into
//! the softmax and the softmax into the second product: one `reduce.sum` over the keys
//! `j` at the root, whose body multiplies a load of V by `exp(S(j) − M) / L`, with `M`
//! a `reduce.max` and `L` a `reduce.sum` over keys of their own, and the three copies of
//! `S` the same expression up to the name of the key variable. `S` is a `reduce.sum`
//! over `e` of a product of two loads (the one that reads the key variable is K), scaled
//! by constants (`Mul`/`Div` by a constant, before or after the mask), plus at most one
//! loaded additive mask that does not read `e`. Every load is an in-bounds f32 load at an
//! affine offset (of a tensor stored f32, or f16/bf16 where the storage-precision pass
//! narrowed it on CUDA, `crate::precision`); Q, K and the mask do not read `d`. That covers however an exporter
//! spells the pattern (the scale on the product or on the scores, a transposed K read
//! through its index, a mask broadcast over batch, heads or queries), because lowering
//! and fusion have already turned layout ops into index maps.
//!
//! The kernel IR gives the form its meaning, so the flow interpreter and every code
//! generator's general path run it as written (recomputing `S` per use). The CUDA
//! emitters run a block of 64 query rows on the tensor cores (`cuda::flash`: where Q, K
//! or V is stored half, the default at `--precision f16|bf16`) or a warp per query row
//! (`cuda::attention`), both with an online softmax. The CPU
//! emitter (`kiln-codegen`'s `cpu::attention`) runs a tile of query rows of one
//! (batch, head) per workgroup, sharing K's and V's loads: the tile's scores as a
//! small register-blocked product onto the stack, each row's softmax there, then `P·V`
//! as a second small product (one query row flash-attention style where there is no
//! query axis or the keys pass the tile's stack); the score matrix exists only as one
//! tile's rows of stack.
//!
//! ## Where it is formed
//! [`form_attention`] runs after fusion, for targets with an attention emitter
//! (`Formation::Microkernels`: the CPU; `Formation::ImplicitGemm`: CUDA, whose
//! emitters read any affine layout, but the same layouts are formed for both; the
//! compiler forms it on CUDA at half precision or as `KILN_CUDA_TUNE=attn=` says). It
//! forms kernels of f32 operands only; the storage-precision pass, after it, may
//! narrow them on CUDA (`crate::precision::narrow_storage_for`). Fusion on its own keeps the three kernels
//! apart (a contraction never takes in a reduction's work: it would no longer be a
//! matrix microkernel's); this pass fuses them exactly when the result is of the form
//! above and its layout is one the emitter reads in place ([`Attention::in_place`]),
//! and leaves them alone otherwise.

use kiln_ir::DType;

use crate::affine::{load_offset, AffineIndex};
use crate::class::KernelClass;
use crate::fuse::{fused_kernel, reader_counts};
use crate::kernel::{BinaryOp, Bounds, Expr, ExprId, Kernel, ReduceOp, ScalarType, UnaryOp};
use crate::precision::loads_as_f32;
use crate::program::{BufferId, FlowProgram};

/// A load of an attention kernel: the input it reads and its flat element offset, an
/// affine form over the kernel's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operand {
    /// The input.
    pub input: u32,
    /// Its offset (row-major, in elements).
    pub offset: AffineIndex,
}

/// A recognised attention kernel (see the module docs). Offsets are over the kernel's
/// variables: the output's, [`Attention::key`] (the keys of the root's sum) and
/// [`Attention::depth`] (the product's reduction inside the root's copy of `S`).
#[derive(Debug, Clone, PartialEq)]
pub struct Attention {
    /// Q, read at the output's outer variables and `depth`.
    pub q: Operand,
    /// K, read at the output's outer variables, `depth` and `key`.
    pub k: Operand,
    /// V, read at the output's outer variables, `key` and the innermost output variable.
    pub v: Operand,
    /// The additive mask, read at the output's outer variables and `key`, and the
    /// constant it is multiplied by (a scale applied after the mask was added).
    pub mask: Option<(Operand, f32)>,
    /// The constant the product `Σ_e Q·K` is multiplied by.
    pub scale: f32,
    /// The key variable of the root's sum.
    pub key: u32,
    /// The reduction variable of the score product.
    pub depth: u32,
    /// The innermost output variable (V's column).
    pub column: u32,
    /// The number of keys.
    pub keys: u64,
    /// The probabilities pass through `isnan(p) ? 0 : p` (PyTorch's exporters guard a
    /// fully masked row so): a row whose probabilities are NaN gives zeros.
    pub nan_to_zero: bool,
}

impl Attention {
    /// The attention form of `k`, if it has it (see the module docs).
    pub fn of(k: &Kernel) -> Option<Attention> {
        if !loads_as_f32(k.output.dtype) || k.out_rank() < 2 {
            return None;
        }
        let Expr::Reduce { op: ReduceOp::Sum, vars, body } = &k.node(k.root).expr else { return None };
        let [j] = vars[..] else { return None };
        let Expr::Binary(BinaryOp::Mul, a, b) = k.node(*body).expr else { return None };
        let (v, p) = match (load(k, a), load(k, b)) {
            (Some(v), None) => (v, b),
            (None, Some(v)) => (v, a),
            _ => return None,
        };
        let (p, nan_to_zero) = match k.node(p).expr {
            Expr::Select(c, zero, x) if is_nan_of(k, c, x) && constant(k, zero) == Some(0.0) => (x, true),
            _ => (p, false),
        };
        let Expr::Binary(BinaryOp::Div, num, den) = k.node(p).expr else { return None };
        let (s, m) = exp_minus(k, num)?;
        let Expr::Reduce { op: ReduceOp::Max, vars: mv, body: mb } = &k.node(m).expr else { return None };
        let [j1] = mv[..] else { return None };
        let Expr::Reduce { op: ReduceOp::Sum, vars: lv, body: lb } = &k.node(den).expr else { return None };
        let [j2] = lv[..] else { return None };
        let (s2, m2) = exp_minus(k, *lb)?;
        if m2 != m {
            return None;
        }
        let main = score(k, s, j.0)?;
        let s1 = score(k, *mb, j1.0)?;
        let s2 = score(k, s2, j2.0)?;
        let extent = |v: u32| k.vars.get(v as usize).copied();
        for (other, oj) in [(&s1, j1.0), (&s2, j2.0)] {
            if !main.same_as(j.0, other, oj) || extent(oj) != extent(j.0) || extent(other.dot) != extent(main.dot) {
                return None;
            }
        }
        // What each operand may read: the output's outer variables and its own axes.
        let rank = k.out_rank() as u32;
        let outer = |off: &AffineIndex, own: &[u32]| {
            off.coef.iter().enumerate().all(|(var, &c)| c == 0 || var as u32 + 1 < rank || own.contains(&(var as u32)))
        };
        let d = rank - 1;
        let ok = outer(&main.q.offset, &[main.dot])
            && outer(&main.k.offset, &[main.dot, j.0])
            && outer(&v.offset, &[j.0, d])
            && main.mask.as_ref().is_none_or(|(m, _)| outer(&m.offset, &[j.0]))
            && (v.offset.of(j.0) != 0 || extent(j.0) == Some(1));
        ok.then_some(Attention {
            q: main.q,
            k: main.k,
            v,
            mask: main.mask,
            scale: main.scale,
            key: j.0,
            depth: main.dot,
            column: d,
            keys: extent(j.0)?,
            nan_to_zero,
        })
    }

    /// The operands Q, K, V and the mask (where there is one).
    pub fn operands(&self) -> impl Iterator<Item = &Operand> {
        [&self.q, &self.k, &self.v].into_iter().chain(self.mask.as_ref().map(|(m, _)| m))
    }

    /// The storage type of operand `o`'s input in `k` (f32, f16 or bf16).
    pub fn dtype(k: &Kernel, o: &Operand) -> DType {
        k.inputs.get(o.input as usize).map_or(DType::F32, |t| t.dtype)
    }

    /// Whether every operand and the result of `k` are stored f32: what
    /// [`form_attention`] forms (the half storage of `--precision f16|bf16` comes
    /// after it, on the CUDA target only: `crate::precision`).
    pub fn all_f32(&self, k: &Kernel) -> bool {
        k.output.dtype == DType::F32 && self.operands().all(|o| Attention::dtype(k, o) == DType::F32)
    }

    /// Whether the CPU emitter reads every operand in place: K's keys, V's columns
    /// and the mask's keys (if it varies along them) at unit stride.
    pub fn in_place(&self) -> bool {
        // With one key nothing steps along the keys.
        let one = self.keys == 1;
        (self.k.offset.of(self.key) == 1 || one)
            && self.v.offset.of(self.column) == 1
            && self.mask.as_ref().is_none_or(|(m, _)| matches!(m.offset.of(self.key), 0 | 1) || one)
    }
}

/// The evaluations an attention kernel's emitter does ([`crate::fuse::work`]'s measure):
/// per output element, its share of the scores (the depth per key) and of `P·V` (one
/// per key), with the exponentials counted once per score.
pub(crate) fn work(k: &Kernel, a: &Attention) -> f64 {
    let var = |v: u32| k.vars.get(v as usize).map_or(0.0, |&e| e as f64);
    let out = k.output.shape.numel() as f64;
    let width = var(a.column).max(1.0);
    out * var(a.key) * (1.0 + (var(a.depth) + 8.0) / width) + out
}

/// One copy of the scores `S(key)`.
#[derive(Debug, Clone)]
struct Score {
    q: Operand,
    k: Operand,
    dot: u32,
    scale: f32,
    mask: Option<(Operand, f32)>,
}

impl Score {
    /// Whether `self` (with key variable `j`) and `o` (with `oj`) are the same
    /// expression up to the names of their key and product variables.
    fn same_as(&self, j: u32, o: &Score, oj: u32) -> bool {
        let pairs = [(j, oj), (self.dot, o.dot)];
        let same = |a: &Operand, b: &Operand| a.input == b.input && renamed(&a.offset, &b.offset, &pairs);
        same(&self.q, &o.q)
            && same(&self.k, &o.k)
            && self.scale.to_bits() == o.scale.to_bits()
            && match (&self.mask, &o.mask) {
                (None, None) => true,
                (Some((a, sa)), Some((b, sb))) => same(a, b) && sa.to_bits() == sb.to_bits(),
                _ => false,
            }
    }
}

/// Whether `a` and `b` are equal once each pair's first variable in `a` is read as its
/// second in `b`.
fn renamed(a: &AffineIndex, b: &AffineIndex, pairs: &[(u32, u32)]) -> bool {
    if a.c != b.c {
        return false;
    }
    let n = a.coef.len().max(b.coef.len()) as u32;
    (0..n).all(|v| {
        if let Some(&(_, vb)) = pairs.iter().find(|p| p.0 == v) {
            a.of(v) == b.of(vb)
        } else if pairs.iter().any(|p| p.1 == v) {
            // A renamed variable of `b`: compared through its pair.
            true
        } else {
            a.of(v) == b.of(v)
        }
    })
}

/// An in-bounds f32 load at an affine offset (of an f32 tensor, or of an f16 or bf16
/// one widened exactly, as the storage-precision pass leaves it on CUDA).
fn load(k: &Kernel, e: ExprId) -> Option<Operand> {
    let n = k.node(e);
    let Expr::Load { input, index, bounds: Bounds::InBounds } = &n.expr else { return None };
    if n.ty != ScalarType::F32 || !loads_as_f32(k.inputs.get(*input as usize)?.dtype) {
        return None;
    }
    Some(Operand { input: *input, offset: load_offset(k, *input, index)? })
}

/// Whether `c` is `isnan(x)`.
fn is_nan_of(k: &Kernel, c: ExprId, x: ExprId) -> bool {
    matches!(k.node(c).expr, Expr::Unary(UnaryOp::IsNan, y) if y == x)
}

/// `exp(s − m)`: `(s, m)`.
fn exp_minus(k: &Kernel, e: ExprId) -> Option<(ExprId, ExprId)> {
    let Expr::Unary(UnaryOp::Exp, x) = k.node(e).expr else { return None };
    let Expr::Binary(BinaryOp::Sub, s, m) = k.node(x).expr else { return None };
    Some((s, m))
}

/// A finite f32 constant.
fn constant(k: &Kernel, e: ExprId) -> Option<f32> {
    let n = k.node(e);
    match n.expr {
        Expr::Const(bits) if n.ty == ScalarType::F32 => Some(f32::from_bits(bits as u32)).filter(|c| c.is_finite()),
        _ => None,
    }
}

/// `e` as scores with key variable `key` (see the module docs).
fn score(k: &Kernel, e: ExprId, key: u32) -> Option<Score> {
    let n = k.node(e);
    if n.ty != ScalarType::F32 {
        return None;
    }
    match n.expr {
        Expr::Reduce { op: ReduceOp::Sum, ref vars, body } => {
            let [dot] = vars[..] else { return None };
            let Expr::Binary(BinaryOp::Mul, a, b) = k.node(body).expr else { return None };
            let (a, b) = (load(k, a)?, load(k, b)?);
            // With one key neither need read it: the product is symmetric in Q and K
            // then (K's index has no key to step), so either is K.
            let one_key = k.vars.get(key as usize) == Some(&1);
            let (q, kk) = match (a.offset.of(key) != 0, b.offset.of(key) != 0) {
                (false, true) => (a, b),
                (true, false) => (b, a),
                (false, false) if one_key => (a, b),
                _ => return None,
            };
            Some(Score { q, k: kk, dot: dot.0, scale: 1.0, mask: None })
        }
        Expr::Binary(op @ (BinaryOp::Mul | BinaryOp::Div), x, y) => {
            let (x, f) = match (constant(k, x), constant(k, y)) {
                (_, Some(c)) if op == BinaryOp::Div && c != 0.0 => (x, 1.0 / c),
                (_, Some(c)) if op == BinaryOp::Mul => (x, c),
                (Some(c), None) if op == BinaryOp::Mul => (y, c),
                _ => return None,
            };
            let mut s = score(k, x, key)?;
            s.scale *= f;
            if let Some(m) = &mut s.mask {
                m.1 *= f;
            }
            Some(s)
        }
        Expr::Binary(BinaryOp::Add, x, y) => [(x, y), (y, x)].into_iter().find_map(|(sx, mx)| {
            let m = load(k, mx)?;
            let mut s = score(k, sx, key)?;
            (s.mask.is_none() && m.offset.of(s.dot) == 0).then(|| {
                s.mask = Some((m, 1.0));
                s
            })
        }),
        _ => None,
    }
}

/// The additive mask term of score kernel `k` (the product's epilogue, through
/// scalings by constants) where it is computed rather than loaded: a float expression
/// of the output's index and loads, with no reduction (`(1 − mask)·−10⁴`, a `Where` of a
/// boolean mask). The attention form reads its mask as a load, so such a term becomes a
/// kernel of its own, which writes it once at its broadcast shape (every output
/// dimension it does not read 1): `(score kernel reading it as its last input, mask
/// kernel, the inputs of `k` the mask kernel reads)`.
fn split_mask(k: &Kernel) -> Option<(Kernel, Kernel, Vec<u32>)> {
    let rank = k.out_rank();
    let reduces = |e: ExprId| -> bool {
        let mut seen = vec![false; k.nodes.len()];
        let mut stack = vec![e];
        while let Some(x) = stack.pop() {
            if std::mem::replace(&mut seen[x.index()], true) {
                continue;
            }
            if matches!(k.node(x).expr, Expr::Reduce { .. }) {
                return true;
            }
            k.node(x).expr.for_each_operand(|o| stack.push(o));
        }
        false
    };
    // Down from the root through scalings to the Add of the mask.
    let mut e = k.root;
    let m = loop {
        match k.node(e).expr {
            Expr::Binary(BinaryOp::Mul | BinaryOp::Div, x, y) if constant(k, y).is_some() => e = x,
            Expr::Binary(BinaryOp::Mul, x, y) if constant(k, x).is_some() => e = y,
            Expr::Binary(BinaryOp::Add, x, y) => match (reduces(x), reduces(y)) {
                (true, false) => break y,
                (false, true) => break x,
                _ => return None,
            },
            _ => return None,
        }
    };
    let free = k.free_vars();
    if k.node(m).ty != ScalarType::F32 || load(k, m).is_some() || free[m.index()].iter().any(|&v| v as usize >= rank) {
        return None;
    }
    let reads: Vec<bool> = (0..rank as u32).map(|v| free[m.index()].contains(&v)).collect();
    let odims: Vec<usize> = k.output.shape.dims().iter().zip(&reads).map(|(&d, &r)| if r { d } else { 1 }).collect();
    let mask_ty = kiln_ir::TensorType::new(DType::F32, kiln_ir::Shape::new(odims).ok()?);
    // The nodes each kernel needs: the mask's, and the scores' without the mask's.
    let needed = |root: ExprId, stop: Option<ExprId>| {
        let mut need = vec![false; k.nodes.len()];
        need[root.index()] = true;
        for i in (0..=root.index()).rev() {
            if need[i] && Some(ExprId(i as u32)) != stop {
                k.nodes[i].expr.for_each_operand(|o| need[o.index()] = true);
            }
        }
        need
    };
    // The mask kernel, reading the inputs its loads read.
    let need = needed(m, None);
    let mut inputs: Vec<u32> = Vec::new();
    for (i, n) in k.nodes.iter().enumerate() {
        if let (true, Expr::Load { input, .. }) = (need[i], &n.expr) {
            if !inputs.contains(input) {
                inputs.push(*input);
            }
        }
    }
    let types = inputs.iter().map(|&i| k.inputs[i as usize].clone()).collect();
    let mut b = crate::kernel::KernelBuilder::new(format!("{}_mask", k.name), types, mask_ty.clone());
    let root = copy(k, &need, &mut b, |input| inputs.iter().position(|&i| i == input).map(|p| p as u32), None, m)?;
    let mask = b.finish(root).ok()?;
    // The scores, the mask a load of a new last input.
    let need = needed(k.root, Some(m));
    let mut types = k.inputs.clone();
    types.push(mask_ty);
    let mut b = crate::kernel::KernelBuilder::new(k.name.clone(), types, k.output.clone());
    let last = k.inputs.len() as u32;
    let index: Vec<ExprId> =
        (0..rank).map(|v| if reads[v] { b.var(crate::kernel::VarId(v as u32)) } else { b.index(0) }).collect();
    let load = b.load(last as usize, index);
    let root = copy(k, &need, &mut b, Some, Some((m, load)), k.root)?;
    let scores = b.finish(root).ok()?;
    Some((scores, mask, inputs))
}

/// Copies the nodes `need` marks of `k` into `b` (fresh reduction variables, inputs
/// renumbered by `input`, node `replace.0` replaced by `replace.1`); `root`'s copy.
fn copy(
    k: &Kernel,
    need: &[bool],
    b: &mut crate::kernel::KernelBuilder,
    input: impl Fn(u32) -> Option<u32>,
    replace: Option<(ExprId, ExprId)>,
    root: ExprId,
) -> Option<ExprId> {
    use crate::kernel::VarId;
    let rank = k.out_rank() as u32;
    let mut vars: std::collections::HashMap<u32, VarId> = std::collections::HashMap::new();
    let mut map: Vec<Option<ExprId>> = vec![None; k.nodes.len()];
    for (i, n) in k.nodes.iter().enumerate() {
        if !need[i] {
            continue;
        }
        let id = ExprId(i as u32);
        if let Some((_, with)) = replace.filter(|r| r.0 == id) {
            map[i] = Some(with);
            continue;
        }
        let m = |e: &ExprId| map[e.index()];
        let mut var = |b: &mut crate::kernel::KernelBuilder, v: VarId| {
            if v.0 < rank {
                v
            } else {
                *vars.entry(v.0).or_insert_with(|| b.new_var(k.vars[v.0 as usize]))
            }
        };
        let e = match &n.expr {
            Expr::Var(v) => {
                let v = var(b, *v);
                b.var(v)
            }
            Expr::Load { input: j, index, bounds } => {
                let index = index.iter().map(m).collect::<Option<Vec<_>>>()?;
                b.raw(n.ty, Expr::Load { input: input(*j)?, index, bounds: *bounds })
            }
            Expr::Reduce { op, vars: rv, body } => {
                let rv = rv.iter().map(|&v| var(b, v)).collect();
                b.raw(n.ty, Expr::Reduce { op: *op, vars: rv, body: m(body)? })
            }
            Expr::Const(c) => b.raw(n.ty, Expr::Const(*c)),
            Expr::Unary(op, a) => b.raw(n.ty, Expr::Unary(*op, m(a)?)),
            Expr::Binary(op, x, y) => b.raw(n.ty, Expr::Binary(*op, m(x)?, m(y)?)),
            Expr::Select(c, x, y) => b.raw(n.ty, Expr::Select(m(c)?, m(x)?, m(y)?)),
            Expr::Cast { value, to, saturate } => {
                b.raw(n.ty, Expr::Cast { value: m(value)?, to: *to, saturate: *saturate })
            }
        };
        map[i] = Some(e);
    }
    map.get(root.index()).copied().flatten()
}

/// A target's rule on which attention kernels to form ([`form_attention`]).
pub type Accept<'a> = &'a dyn Fn(&Kernel, &Attention) -> bool;

/// Forms every attention kernel the CPU emitter reads ([`form_attention`]'s rule on the CPU).
pub fn accept_all(_: &Kernel, _: &Attention) -> bool {
    true
}

/// Fuses each `contraction → softmax rows → contraction` chain whose result is an
/// [`Attention`] kernel the CPU emitter reads in place into that one kernel (see the
/// module docs). The score and probability buffers must have no other reader and not be
/// outputs; the chain's dispatches are then dead (`FlowProgram::remove_dead` drops
/// them).
///
/// On by default (`kiln_compiler::Options::fused_attention`; `kiln compile
/// --no-fuse-attention` keeps the three kernels): the emitter's tiled form is faster
/// than the separate product, softmax and product kernels at the lengths measured
/// (docs/benchmarks.md), and the score matrix leaves the arena.
///
/// `accept` is the target's say on each candidate kernel (with its form): a chain it
/// refuses keeps its three kernels (CUDA by default forms only what its tensor-core
/// kernel takes, `kiln_codegen::cuda::flash::declines`).
pub fn form_attention(p: &mut FlowProgram, accept: Accept<'_>) {
    let outputs: Vec<BufferId> = p.outputs.iter().map(|&o| p.storage(o)).collect();
    let mut d = 0;
    while d < p.dispatches.len() {
        // A product (a one-key product may be classed a window: the recogniser of
        // the fused kernel decides).
        if matches!(p.dispatches[d].class, KernelClass::Contraction | KernelClass::Window) {
            for slot in 0..p.dispatches[d].operands.len() {
                if let Some(inserted) = try_form(p, d, slot, &outputs, accept) {
                    // A mask dispatch went in before the chain: `d` moved one on.
                    d += usize::from(inserted);
                    break;
                }
            }
        }
        d += 1;
    }
    p.classify();
}

/// [`form_attention`] for operand `slot` of dispatch `d`: `None` if nothing was formed,
/// else whether a mask dispatch was inserted (before the chain).
fn try_form(p: &mut FlowProgram, d: usize, slot: usize, outputs: &[BufferId], accept: Accept<'_>) -> Option<bool> {
    let producers = p.producers();
    let readers = reader_counts(p);
    let private = |b: BufferId| readers[b.index()] == 1 && !outputs.contains(&b);
    let probs = p.storage(p.dispatches[d].operands[slot]);
    let r = producers[probs.index()]?;
    if p.dispatches[r].class != KernelClass::Rows || !private(probs) {
        return None;
    }
    let within = crate::program::guard_within;
    for rs in 0..p.dispatches[r].operands.len() {
        let scores = p.storage(p.dispatches[r].operands[rs]);
        let Some(c) = producers[scores.index()] else { continue };
        if !matches!(p.dispatches[c].class, KernelClass::Contraction | KernelClass::Window)
            || !private(scores)
            || !within(&p.dispatches[c].guard, &p.dispatches[r].guard)
            || !within(&p.dispatches[r].guard, &p.dispatches[d].guard)
        {
            continue;
        }
        // A computed mask is read from a buffer of its own (`split_mask`), tried on a
        // copy of the score dispatch.
        // Every layer of a model computes the same mask: one written before an earlier
        // chain (the same kernel on the same operands under the same guard) is read
        // again rather than written once more.
        let original = p.dispatches[c].clone();
        let split = split_mask(&original.kernel);
        let mut mask = None;
        if let Some((scores_kernel, mask_kernel, inputs)) = split {
            let operands: Vec<BufferId> = inputs.iter().map(|&i| original.operands[i as usize]).collect();
            let same = |x: &crate::program::Dispatch| {
                x.operands == operands
                    && x.guard == original.guard
                    && x.kernel.name.ends_with("_mask")
                    && Kernel { name: mask_kernel.name.clone(), ..x.kernel.clone() } == mask_kernel
            };
            let buffer = match p.dispatches[..c].iter().find(|x| same(x)) {
                Some(x) => x.result,
                None => {
                    let buffer = BufferId(p.buffers.len() as u32);
                    p.buffers.push(crate::program::Buffer {
                        ty: mask_kernel.output.clone(),
                        name: format!("{}.mask", p.buffers[scores.index()].name),
                        kind: crate::program::BufferKind::Result,
                    });
                    let dispatch =
                        crate::program::Dispatch::new(mask_kernel, operands, buffer, original.sources.clone())
                            .guarded(original.guard.clone());
                    mask = Some(dispatch);
                    buffer
                }
            };
            p.dispatches[c].kernel = scores_kernel;
            p.dispatches[c].operands.push(buffer);
        }
        let formed = fused_kernel(p, r, rs, c).and_then(|(softmax, operands)| {
            let saved = std::mem::replace(&mut p.dispatches[r].kernel, softmax);
            let saved_ops = std::mem::replace(&mut p.dispatches[r].operands, operands);
            let fused = fused_kernel(p, d, slot, r)
                .filter(|(k, _)| Attention::of(k).is_some_and(|a| a.in_place() && a.all_f32(k) && accept(k, &a)));
            // The chain's first two dispatches are dead once `d` takes their work; they
            // keep their own kernels until `remove_dead` drops them.
            p.dispatches[r].kernel = saved;
            p.dispatches[r].operands = saved_ops;
            fused
        });
        let Some((k, operands)) = formed else {
            p.dispatches[c] = original;
            if mask.is_some() {
                p.buffers.pop();
            }
            continue;
        };
        let mut sources = p.dispatches[c].sources.clone();
        sources.extend(p.dispatches[r].sources.iter().cloned());
        sources.extend(p.dispatches[d].sources.iter().cloned());
        let disp = &mut p.dispatches[d];
        disp.kernel = k;
        disp.operands = operands;
        disp.sources = sources;
        disp.class = KernelClass::Attention;
        // The score dispatch is dead but still reads the mask: it keeps the original
        // kernel and operands, so nothing dead reads the new buffer.
        p.dispatches[c] = original;
        let inserted = mask.is_some();
        if let Some(m) = mask {
            p.dispatches.insert(c, m);
        }
        return Some(inserted);
    }
    None
}
