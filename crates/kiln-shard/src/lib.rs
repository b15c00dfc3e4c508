//! Tensor parallelism at the tensor level: one graph split across the devices of one
//! host, Megatron style, with the collectives placed by the compiler.
//!
//! [`shard`] decides a [`Layout`] for every value of a (tensor-passed) graph, then
//! writes per-device graphs cut at the collectives:
//!
//! ```text
//! x ─ MatMul(x, W₁) + b₁ ─ act ─ MatMul(·, W₂) ─ all-reduce ─ + b₂ ─ …
//!     W₁, b₁ split by columns    W₂ split by rows  (sum of the N partial products)
//! x ─ MatMul(x, Wq|Wk|Wv) + b ─ Reshape to heads ─ Transpose ─ MatMul(Q, Kᵀ) ─ Softmax
//!     ─ MatMul(P, V) ─ Transpose ─ Reshape ─ MatMul(·, Wo) ─ all-reduce ─ + bo
//!     (heads split across devices: each device computes its heads' attention)
//! ```
//!
//! **Layouts.** A value is [`Layout::Replicated`] (every device holds all of it),
//! [`Layout::Split`] along an axis (device `d` holds the `d`-th of `N` equal chunks) or
//! [`Layout::Partial`] (every device holds a full-shape partial sum; the value is their
//! sum). A product `MatMul(x, W)` of a replicated `x` and a constant 2-D `W` is a
//! *candidate* column split (`W` cut by columns: the result splits along its last axis).
//! Splits then flow forward through the ops that keep them local — elementwise ops
//! (other operands sliced when they are constants of full extent, left alone when they
//! broadcast along the split axis), Softmax and LayerNormalization along another axis,
//! Transpose, a Reshape that maps the split axis onto an output axis with the same
//! leading extent (columns to heads and back), a batched product of two operands split
//! along the same batch axis (heads) — until a product `MatMul(x, W)` whose `x` is split
//! along its reduction axis takes `W` cut by rows and yields a `Partial` result, which
//! an **all-reduce** turns back into a replicated value before anything reads it
//! (before the second bias: each device adds it once to the sum). A split that reaches
//! an op with no rule would need an all-gather in the middle of the model; the
//! candidates it came from are then dropped (replicated) and the layouts recomputed,
//! until no such op remains, so only blocks that end in a row-parallel product stay
//! split. A split graph output is **all-gathered**. Everything else is replicated:
//! every device computes it (correct, if not fast).
//!
//! **Errors.** A block that stays split must divide: a candidate whose columns, or a
//! Reshape whose head axis, the device count does not divide is a
//! [`ShardError::Indivisible`] naming the op; zero devices is [`ShardError::NoDevices`].
//!
//! **Stages and segments.** The collectives cut each device's work into stages: stage
//! `k` of device `d` is a [`Segment`], an ordinary tensor graph (compiled by the usual
//! pipeline) whose inputs are model inputs or [`Exchange`] buffers written by earlier
//! segments or collectives, and whose outputs are exchanges. A device computes only
//! what a collective or (device 0) a model output needs. The compiler
//! (`kiln_compiler::shard`) compiles every segment and links them into one plan whose
//! dispatches name their device, with the collectives as plan commands between stages.
#![deny(missing_docs)]

use kiln_ir::entity::EntityId;
use kiln_ir::graph::{Graph, NodeId, ValueDef, ValueId};
use kiln_ir::op::{Op, OpKind};
use kiln_ir::shape::{Shape, TensorType};
use kiln_ir::tensor::Tensor;
use kiln_ir::DType;
use std::collections::{BTreeSet, HashMap};

/// Most devices one plan is sharded over.
pub const MAX_DEVICES: u32 = 64;

/// How a value is distributed over the devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Every device holds all of it.
    Replicated,
    /// Device `d` holds chunk `d` of `N` equal chunks along this axis.
    Split(usize),
    /// Every device holds a partial sum of the full shape; the value is their sum.
    Partial,
}

/// Why a graph cannot be sharded as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardError {
    /// Zero devices.
    #[error("cannot shard over 0 devices (--devices takes 1 or more)")]
    NoDevices,
    /// More devices than supported.
    #[error("{devices} devices: at most {max} are supported", max = MAX_DEVICES)]
    TooManyDevices {
        /// The count asked for.
        devices: u32,
    },
    /// A block that would be split has an extent the device count does not divide.
    #[error(
        "{op} {node:?}: its {extent} {what} do not divide over {devices} devices \
         (choose a device count that divides {extent})"
    )]
    Indivisible {
        /// The op type.
        op: String,
        /// The node's name.
        node: String,
        /// What is split (`columns`, `heads`).
        what: &'static str,
        /// Its extent.
        extent: usize,
        /// Devices asked for.
        devices: u32,
    },
    /// A graph output is a graph input or a constant (no op computes it).
    #[error("graph output {name:?} is not computed by an op; sharding needs every output computed")]
    OutputNotComputed {
        /// The output's name.
        name: String,
    },
    /// A per-device graph failed verification: a kiln bug.
    #[error("internal error: per-device graph {graph}: {why}")]
    Internal {
        /// The segment's graph name.
        graph: String,
        /// The verifier's message.
        why: String,
    },
}

/// Where a segment's input comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Port {
    /// The model's input `i`.
    Input(usize),
    /// Exchange buffer `i` ([`Sharded::exchanges`]).
    Exchange(usize),
}

/// A buffer that crosses a stage boundary: a segment's output, or a collective's
/// source or destination.
#[derive(Debug, Clone, PartialEq)]
pub struct Exchange {
    /// The device that owns it.
    pub device: u32,
    /// Its type.
    pub ty: TensorType,
    /// A name for listings.
    pub name: String,
}

/// One device's work in one stage: a tensor graph.
#[derive(Debug, Clone)]
pub struct Segment {
    /// The stage.
    pub stage: usize,
    /// The device.
    pub device: u32,
    /// The graph (constants sliced for the device, shapes local).
    pub graph: Graph,
    /// Per graph input, where it comes from.
    pub inputs: Vec<Port>,
    /// Per graph output, the exchange buffer it writes.
    pub outputs: Vec<usize>,
}

/// Puts `segments` in plan order (by stage, then device) and verifies each one's graph;
/// an error names the first graph that fails. Both linkers' segments go through it.
pub fn order_segments(segments: &mut [Segment]) -> Result<(), (String, kiln_ir::verify::VerifyError)> {
    segments.sort_by_key(|s| (s.stage, s.device));
    for s in segments.iter() {
        kiln_ir::verify::verify(&s.graph).map_err(|e| (s.graph.name.clone(), e))?;
    }
    Ok(())
}

/// What a collective does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectiveKind {
    /// Elementwise sum of the parts (f32).
    AllReduce,
    /// Concatenation of the parts along an axis of the full value.
    AllGather {
        /// The axis.
        axis: usize,
    },
}

/// A collective between stages: device `d` contributes `src[d]` and receives `dst[d]`
/// (exchange indices).
#[derive(Debug, Clone, PartialEq)]
pub struct Collective {
    /// The stage after whose segments it runs.
    pub after_stage: usize,
    /// What it does.
    pub kind: CollectiveKind,
    /// Per device, the exchange it contributes.
    pub src: Vec<usize>,
    /// Per device, the exchange it receives.
    pub dst: Vec<usize>,
    /// The name of the value it reduces or gathers.
    pub name: String,
}

/// A graph sharded over devices.
#[derive(Debug, Clone)]
pub struct Sharded {
    /// Number of devices.
    pub devices: u32,
    /// The segments, by stage then device.
    pub segments: Vec<Segment>,
    /// Collectives, by stage (each after the segments of its stage).
    pub collectives: Vec<Collective>,
    /// Exchange buffers.
    pub exchanges: Vec<Exchange>,
    /// Per model output, the exchange (of device 0) holding it.
    pub outputs: Vec<usize>,
    /// Every value's layout in the source graph.
    pub layouts: Vec<Layout>,
    /// The products split by columns.
    pub column_split: Vec<NodeId>,
    /// The products split by rows.
    pub row_split: Vec<NodeId>,
}

impl Sharded {
    /// Number of stages.
    pub fn stages(&self) -> usize {
        self.segments.iter().map(|s| s.stage + 1).max().unwrap_or(0)
    }
}

/// How a node reads one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Use {
    /// As the device holds it (a constant: whole).
    Plain,
    /// The all-reduced value of a `Partial` operand.
    Reduced,
    /// A constant cut along its axis: device `d` reads chunk `d`.
    Slice(usize),
    /// A Reshape's shape, rewritten to the local output shape.
    LocalShape,
}

/// What one pass of layout propagation decided.
struct Pass {
    layout: Vec<Layout>,
    origins: Vec<BTreeSet<NodeId>>,
    uses: Vec<Vec<Use>>,
    /// Candidates whose split reached an op with no rule.
    revert: BTreeSet<NodeId>,
    /// Divisibility violations of what is split.
    violations: Vec<ShardError>,
}

const UNARY: &[OpKind] = &[
    OpKind::Relu,
    OpKind::Gelu,
    OpKind::Erf,
    OpKind::Tanh,
    OpKind::Sigmoid,
    OpKind::Exp,
    OpKind::Log,
    OpKind::Neg,
    OpKind::Abs,
    OpKind::Sqrt,
    OpKind::Reciprocal,
    OpKind::Identity,
    OpKind::Cast,
    OpKind::Softplus,
    OpKind::Elu,
    OpKind::LeakyRelu,
    OpKind::HardSigmoid,
    OpKind::HardSwish,
    OpKind::Sin,
    OpKind::Cos,
    OpKind::Floor,
    OpKind::Ceil,
    OpKind::Round,
    OpKind::Sign,
    OpKind::Mish,
    OpKind::Celu,
    OpKind::Selu,
    OpKind::Clip,
];

const BROADCAST: &[OpKind] = &[
    OpKind::Add,
    OpKind::Sub,
    OpKind::Mul,
    OpKind::Div,
    OpKind::Pow,
    OpKind::Max,
    OpKind::Min,
    OpKind::Sum,
    OpKind::Mean,
    OpKind::Where,
];

fn norm_axis(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

fn node_label(g: &Graph, n: NodeId) -> (String, String) {
    let node = &g.nodes[n];
    (node.op.kind.name().to_string(), node.name.clone())
}

/// The products that may be split by columns: `MatMul(x, W)` with `x` computed (rank
/// ≥ 2) and `W` a 2-D f32 constant (so that the partial sums an all-reduce adds are
/// f32, the type every driver reduces).
fn candidates(g: &Graph) -> BTreeSet<NodeId> {
    g.nodes
        .iter()
        .filter(|(_, n)| {
            n.op.kind == OpKind::MatMul
                && n.outputs.len() == 1
                && matches!(n.inputs.as_slice(), [Some(a), Some(b)]
                    if g.constant(*a).is_none() && g.ty(*a).shape.rank() >= 2
                        && g.constant(*b).is_some_and(|w| w.shape().rank() == 2 && w.dtype() == DType::F32))
        })
        .map(|(id, _)| id)
        .collect()
}

/// One propagation of layouts with `active` candidates split by columns.
fn propagate(g: &Graph, n: u32, active: &BTreeSet<NodeId>) -> Pass {
    let nv = g.values.len();
    let mut p = Pass {
        layout: vec![Layout::Replicated; nv],
        origins: vec![BTreeSet::new(); nv],
        uses: vec![Vec::new(); g.nodes.len()],
        revert: BTreeSet::new(),
        violations: Vec::new(),
    };
    let nn = n as usize;
    for (id, node) in g.nodes.iter() {
        let lay = |v: &Option<ValueId>| v.map_or(Layout::Replicated, |v| p.layout[v.index()]);
        let ins: Vec<Layout> = node.inputs.iter().map(lay).collect();
        let is_const = |i: usize| node.inputs[i].is_some_and(|v| g.constant(v).is_some());
        let dims = |i: usize| node.inputs[i].map(|v| g.ty(v).shape.dims().to_vec()).unwrap_or_default();
        let mut origins: BTreeSet<NodeId> = BTreeSet::new();
        for v in node.inputs.iter().flatten() {
            origins.extend(p.origins[v.index()].iter().copied());
        }
        // The default: every operand replicated (partial sums reduced first); an
        // operand still split has no rule here, so its candidates are dropped.
        let default = |p: &mut Pass| -> (Layout, Vec<Use>) {
            let mut uses = Vec::with_capacity(ins.len());
            for (i, l) in ins.iter().enumerate() {
                uses.push(match l {
                    Layout::Partial => Use::Reduced,
                    Layout::Split(_) => {
                        if let Some(v) = node.inputs[i] {
                            p.revert.extend(p.origins[v.index()].iter().copied());
                        }
                        Use::Plain
                    }
                    Layout::Replicated => Use::Plain,
                });
            }
            (Layout::Replicated, uses)
        };
        let single = node.outputs.len() == 1;
        let out_rank = node.outputs.first().map_or(0, |&o| g.ty(o).shape.rank());
        let kind = node.op.kind;
        let rule: Option<(Layout, Vec<Use>)> = if !single {
            None
        } else if kind == OpKind::MatMul && ins.len() == 2 {
            let (ra, rb) = (dims(0).len(), dims(1).len());
            match (ins[0], ins[1]) {
                (Layout::Replicated, Layout::Replicated) if active.contains(&id) => {
                    let cols = dims(1)[1];
                    if !cols.is_multiple_of(nn) {
                        let (op, name) = node_label(g, id);
                        p.violations.push(ShardError::Indivisible {
                            op,
                            node: name,
                            what: "columns",
                            extent: cols,
                            devices: n,
                        });
                    }
                    origins.insert(id);
                    Some((Layout::Split(out_rank - 1), vec![Use::Plain, Use::Slice(1)]))
                }
                (Layout::Split(a), Layout::Replicated) if ra >= 2 && a == ra - 1 && is_const(1) && rb == 2 => {
                    Some((Layout::Partial, vec![Use::Plain, Use::Slice(0)]))
                }
                (Layout::Split(a), Layout::Split(b))
                    if ra == rb && ra == out_rank && ra >= 3 && a == b && a < ra - 2 && dims(0)[a] == dims(1)[a] =>
                {
                    Some((Layout::Split(a), vec![Use::Plain, Use::Plain]))
                }
                _ => None,
            }
        } else if UNARY.contains(&kind) && !ins.is_empty() {
            match ins[0] {
                Layout::Split(a)
                    if (1..ins.len()).all(|i| node.inputs[i].is_none() || (is_const(i) && dims(i).is_empty())) =>
                {
                    Some((Layout::Split(a), vec![Use::Plain; ins.len()]))
                }
                _ => None,
            }
        } else if BROADCAST.contains(&kind) {
            broadcast_rule(g, node, &ins, out_rank)
        } else if matches!(kind, OpKind::Softmax | OpKind::LogSoftmax) && ins.len() == 1 {
            let axis =
                node.op.attrs_of::<kiln_ir::attrs::SoftmaxAttrs>().ok().and_then(|a| norm_axis(a.axis, out_rank));
            match ins[0] {
                Layout::Split(a) if axis.is_some_and(|x| x != a) => Some((Layout::Split(a), vec![Use::Plain])),
                _ => None,
            }
        } else if kind == OpKind::LayerNormalization && !ins.is_empty() {
            let axis =
                node.op.attrs_of::<kiln_ir::attrs::LayerNormAttrs>().ok().and_then(|a| norm_axis(a.axis, out_rank));
            let rest_plain = ins[1..].iter().all(|l| *l == Layout::Replicated);
            match ins[0] {
                Layout::Split(a) if rest_plain && axis.is_some_and(|x| a < x) => {
                    Some((Layout::Split(a), vec![Use::Plain; ins.len()]))
                }
                _ => None,
            }
        } else if kind == OpKind::Transpose && ins.len() == 1 {
            let perm: Vec<i64> = match node.op.attrs_of::<kiln_ir::attrs::TransposeAttrs>() {
                Ok(a) => a.perm.clone().unwrap_or_else(|| (0..out_rank as i64).rev().collect()),
                Err(_) => Vec::new(),
            };
            match ins[0] {
                Layout::Split(a) => {
                    perm.iter().position(|&x| x == a as i64).map(|j| (Layout::Split(j), vec![Use::Plain]))
                }
                _ => None,
            }
        } else if kind == OpKind::Reshape && ins.len() == 2 && is_const(1) {
            match ins[0] {
                Layout::Split(a) => {
                    let din = dims(0);
                    let dout = g.ty(node.outputs[0]).shape.dims().to_vec();
                    let prefix: usize = din[..a].iter().product();
                    // The first output axis with the same leading extent that is not 1:
                    // chunk `d` of the input axis is chunk `d` of it (module docs).
                    let b = (0..dout.len()).find(|&b| dout[..b].iter().product::<usize>() == prefix && dout[b] > 1);
                    b.map(|b| {
                        if !dout[b].is_multiple_of(nn) {
                            let (op, name) = node_label(g, id);
                            let what = if dout.len() > din.len() { "heads" } else { "elements of the reshaped axis" };
                            p.violations.push(ShardError::Indivisible {
                                op,
                                node: name,
                                what,
                                extent: dout[b],
                                devices: n,
                            });
                        }
                        (Layout::Split(b), vec![Use::Plain, Use::LocalShape])
                    })
                }
                _ => None,
            }
        } else {
            None
        };
        let any_split_or_partial = ins.iter().any(|l| *l != Layout::Replicated);
        let (out, uses) = match rule {
            Some(r) => r,
            None => {
                if !any_split_or_partial {
                    origins.clear();
                }
                default(&mut p)
            }
        };
        if out == Layout::Replicated {
            origins.clear();
        }
        for &o in &node.outputs {
            p.layout[o.index()] = out;
            p.origins[o.index()] = origins.clone();
        }
        p.uses[id.index()] = uses;
    }
    p
}

/// Elementwise ops with broadcasting: every split operand split along the same output
/// axis at full extent; other operands broadcast along it (left alone) or, constants of
/// full extent, sliced.
fn broadcast_rule(g: &Graph, node: &kiln_ir::Node, ins: &[Layout], out_rank: usize) -> Option<(Layout, Vec<Use>)> {
    let out_dims = g.ty(node.outputs[0]).shape.dims().to_vec();
    let mut axis: Option<usize> = None;
    for (i, l) in ins.iter().enumerate() {
        match l {
            Layout::Split(a) => {
                let v = node.inputs[i]?;
                let r = g.ty(v).shape.rank();
                let s = a + (out_rank - r);
                if axis.is_some_and(|x| x != s) || g.ty(v).shape.dims()[*a] != out_dims[s] {
                    return None;
                }
                axis = Some(s);
            }
            Layout::Partial => {}
            Layout::Replicated => {}
        }
    }
    let s = axis?;
    let mut uses = Vec::with_capacity(ins.len());
    for (i, l) in ins.iter().enumerate() {
        uses.push(match l {
            Layout::Split(_) => Use::Plain,
            // A partial sum read with a split operand: the sum of the slices is the
            // slice of the sum, but summing first keeps the rule simple.
            Layout::Partial => return None,
            Layout::Replicated => {
                let Some(v) = node.inputs[i] else { continue };
                let d = g.ty(v).shape.dims();
                let off = out_rank - d.len();
                if s < off || d[s - off] == 1 {
                    Use::Plain
                } else if g.constant(v).is_some() {
                    Use::Slice(s - off)
                } else {
                    return None;
                }
            }
        });
    }
    Some((Layout::Split(s), uses))
}

/// `t` cut into `n` chunks along `axis`: chunk `d`.
fn slice(t: &Tensor, axis: usize, n: usize, d: usize) -> Option<Tensor> {
    let dims = t.shape().dims();
    let es = t.dtype().storage_bytes(1);
    if t.dtype().is_packed() || !dims.get(axis)?.is_multiple_of(n) {
        return None;
    }
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product::<usize>() * es;
    let ext = dims[axis];
    let chunk = ext / n;
    let b = t.bytes();
    let mut out = Vec::with_capacity(outer * chunk * inner);
    for o in 0..outer {
        let start = (o * ext + d * chunk) * inner;
        out.extend_from_slice(&b[start..start + chunk * inner]);
    }
    let mut nd = dims.to_vec();
    nd[axis] = chunk;
    let ty = TensorType::new(t.dtype(), Shape::new(nd).ok()?);
    Tensor::new(ty, bytes::Bytes::from(out)).ok()
}

/// The type device-local values of `ty` have under `layout` over `n` devices.
fn local_ty(ty: &TensorType, layout: Layout, n: usize) -> TensorType {
    match layout {
        Layout::Split(a) => {
            let mut d = ty.shape.dims().to_vec();
            if let Some(x) = d.get_mut(a) {
                *x /= n;
            }
            TensorType::new(ty.dtype, Shape::new(d).unwrap_or_else(|_| ty.shape.clone()))
        }
        _ => ty.clone(),
    }
}

/// Decides every value's layout (module docs): the candidates' fixpoint.
fn decide(g: &Graph, n: u32) -> Result<Pass, ShardError> {
    // One device: nothing to split (every value replicated, no collectives).
    let mut active = if n > 1 { candidates(g) } else { BTreeSet::new() };
    loop {
        let mut p = propagate(g, n, &active);
        // A split graph output is gathered, not a reason to drop its block.
        if p.revert.is_empty() {
            if let Some(e) = p.violations.drain(..).next() {
                return Err(e);
            }
            return Ok(p);
        }
        let before = active.len();
        active.retain(|c| !p.revert.contains(c));
        if active.len() == before {
            // Cannot happen (a revert names splits' origins, all active); stop anyway.
            return Ok(p);
        }
    }
}

/// Which form of a value a reader wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Form {
    /// As each device computes it.
    Local,
    /// All-reduced (of a `Partial` value).
    Reduced,
    /// All-gathered (of a `Split` graph output).
    Gathered,
}

struct SegBuilder {
    graph: Graph,
    inputs: Vec<Port>,
    outputs: Vec<usize>,
    map: HashMap<(ValueId, Form), ValueId>,
    consts: HashMap<(ValueId, Use), ValueId>,
}

struct Builder<'g> {
    g: &'g Graph,
    n: u32,
    pass: &'g Pass,
    segs: HashMap<(usize, u32), SegBuilder>,
    /// Where a device-local value is defined: (stage, device) → its id there.
    defined: HashMap<(ValueId, u32), (usize, ValueId)>,
    stage: Vec<usize>,
    exchanges: Vec<Exchange>,
    exported: HashMap<(ValueId, u32), usize>,
    collectives: Vec<Collective>,
    collected: HashMap<(ValueId, Form), Vec<usize>>,
}

/// Value `v`'s name in the segment graphs: its name in `g`, or `v{index}` where it has
/// none. The heterogeneous linker names the values it cuts the same way.
pub fn value_name(g: &Graph, v: ValueId) -> String {
    let n = &g.values[v].name;
    if n.is_empty() {
        format!("v{}", v.index())
    } else {
        n.clone()
    }
}

impl Builder<'_> {
    fn seg(&mut self, stage: usize, d: u32) -> &mut SegBuilder {
        let name = format!("{}.s{stage}.d{d}", self.g.name);
        self.segs.entry((stage, d)).or_insert_with(|| SegBuilder {
            graph: Graph::new(name),
            inputs: Vec::new(),
            outputs: Vec::new(),
            map: HashMap::new(),
            consts: HashMap::new(),
        })
    }

    fn local_ty(&self, v: ValueId) -> TensorType {
        local_ty(self.g.ty(v), self.pass.layout[v.index()], self.n as usize)
    }

    /// Stage at which form `f` of `v` is available.
    fn stage_of(&self, v: ValueId, f: Form) -> usize {
        let s = match self.g.values[v].def {
            ValueDef::Node { node, .. } => self.stage[node.index()],
            _ => 0,
        };
        if f == Form::Local {
            s
        } else {
            s + 1
        }
    }

    /// The exchange holding device `d`'s local `v` (exported from its segment).
    fn export(&mut self, v: ValueId, d: u32) -> usize {
        if let Some(&e) = self.exported.get(&(v, d)) {
            return e;
        }
        let e = self.exchanges.len();
        let name = format!("{}@{d}", value_name(self.g, v));
        self.exchanges.push(Exchange { device: d, ty: self.local_ty(v), name });
        self.exported.insert((v, d), e);
        // Only values computed by a node are exported (graph outputs are checked, and
        // collectives read node results: a Split or Partial value is one).
        if let Some(&(s, local)) = self.defined.get(&(v, d)) {
            let seg = self.seg(s, d);
            seg.graph.outputs.push(local);
            seg.outputs.push(e);
        }
        e
    }

    /// The exchanges (one per device) of the collective giving form `f` of `v`.
    fn collective(&mut self, v: ValueId, f: Form) -> Vec<usize> {
        if let Some(x) = self.collected.get(&(v, f)) {
            return x.clone();
        }
        let src: Vec<usize> = (0..self.n).map(|d| self.export(v, d)).collect();
        let (kind, suffix) = match (f, self.pass.layout[v.index()]) {
            (Form::Gathered, Layout::Split(axis)) => (CollectiveKind::AllGather { axis }, "allgather"),
            _ => (CollectiveKind::AllReduce, "allreduce"),
        };
        let name = value_name(self.g, v);
        let dst: Vec<usize> = (0..self.n)
            .map(|d| {
                self.exchanges.push(Exchange {
                    device: d,
                    ty: self.g.ty(v).clone(),
                    name: format!("{name}.{suffix}@{d}"),
                });
                self.exchanges.len() - 1
            })
            .collect();
        let after_stage = self.stage_of(v, Form::Local);
        self.collectives.push(Collective { after_stage, kind, src, dst: dst.clone(), name });
        self.collected.insert((v, f), dst.clone());
        dst
    }

    /// Form `f` of `v` as a value of segment (`stage`, `d`).
    fn get(&mut self, stage: usize, d: u32, v: ValueId, f: Form) -> ValueId {
        if let Some(&x) = self.seg(stage, d).map.get(&(v, f)) {
            return x;
        }
        let (port, ty, name) = match (&self.g.values[v].def, f) {
            (ValueDef::Input, _) => {
                let i = self.g.inputs.iter().position(|&x| x == v).unwrap_or(0);
                (Port::Input(i), self.g.ty(v).clone(), value_name(self.g, v))
            }
            (_, Form::Local) => {
                let e = self.export(v, d);
                (Port::Exchange(e), self.local_ty(v), value_name(self.g, v))
            }
            (_, _) => {
                let e = self.collective(v, f)[d as usize];
                (Port::Exchange(e), self.g.ty(v).clone(), self.exchanges[e].name.clone())
            }
        };
        let seg = self.seg(stage, d);
        let id = seg.graph.add_input(name, ty);
        seg.inputs.push(port);
        seg.map.insert((v, f), id);
        id
    }

    /// Constant `v` as segment (`stage`, `d`) reads it under `u`.
    fn constant(&mut self, stage: usize, d: u32, v: ValueId, u: Use, local_shape: Option<&TensorType>) -> ValueId {
        // A local shape is the reading Reshape's own (two Reshapes may share a shape
        // constant and still split different axes): never shared.
        let key = (v, u);
        if u != Use::LocalShape {
            if let Some(&x) = self.seg(stage, d).consts.get(&key) {
                return x;
            }
        }
        let t = self.g.constant(v).cloned().unwrap_or_else(|| Tensor::zeros(self.g.ty(v).clone()));
        let t = match (u, local_shape) {
            (Use::Slice(axis), _) => slice(&t, axis, self.n as usize, d as usize).unwrap_or(t),
            (Use::LocalShape, Some(ty)) => {
                let dims: Vec<i64> = ty.shape.dims().iter().map(|&x| x as i64).collect();
                let shape = Shape::new(vec![dims.len()]).unwrap_or_else(|_| Shape::scalar());
                Tensor::from_i64(DType::I64, shape, &dims).unwrap_or(t)
            }
            _ => t,
        };
        let name = match u {
            Use::Slice(_) => format!("{}.shard{d}", value_name(self.g, v)),
            // One per reading Reshape (see above): numbered to stay unique.
            Use::LocalShape => format!("{}.local{}", value_name(self.g, v), self.seg(stage, d).graph.values.len()),
            _ => value_name(self.g, v),
        };
        let seg = self.seg(stage, d);
        let id = seg.graph.add_const(name, t);
        seg.consts.insert(key, id);
        id
    }
}

/// Shards `g` (after the tensor passes) over `devices` devices (module docs).
pub fn shard(g: &Graph, devices: u32) -> Result<Sharded, ShardError> {
    if devices == 0 {
        return Err(ShardError::NoDevices);
    }
    if devices > MAX_DEVICES {
        return Err(ShardError::TooManyDevices { devices });
    }
    for &o in &g.outputs {
        if !matches!(g.values[o].def, ValueDef::Node { .. }) {
            return Err(ShardError::OutputNotComputed { name: value_name(g, o) });
        }
    }
    let pass = decide(g, devices)?;
    let all: u64 = if devices == 64 { u64::MAX } else { (1u64 << devices) - 1 };
    // Which devices need which form of each value (backwards from the outputs).
    let mut need: HashMap<(ValueId, Form), u64> = HashMap::new();
    let output_form = |v: ValueId| match pass.layout[v.index()] {
        Layout::Replicated => Form::Local,
        Layout::Partial => Form::Reduced,
        Layout::Split(_) => Form::Gathered,
    };
    for &o in &g.outputs {
        *need.entry((o, output_form(o))).or_default() |= 1;
    }
    for (id, node) in g.nodes.iter().collect::<Vec<_>>().into_iter().rev() {
        let mut mask = 0u64;
        for &o in &node.outputs {
            let collected = need.get(&(o, Form::Reduced)).copied().unwrap_or(0)
                | need.get(&(o, Form::Gathered)).copied().unwrap_or(0);
            let local = need.entry((o, Form::Local)).or_default();
            if collected != 0 {
                *local = all;
            }
            mask |= *local;
        }
        if mask == 0 {
            continue;
        }
        for (i, v) in node.inputs.iter().enumerate() {
            let Some(v) = *v else { continue };
            if g.constant(v).is_some() {
                continue;
            }
            let f = if pass.uses[id.index()].get(i) == Some(&Use::Reduced) { Form::Reduced } else { Form::Local };
            *need.entry((v, f)).or_default() |= mask;
        }
    }
    let mut b = Builder {
        g,
        n: devices,
        pass: &pass,
        segs: HashMap::new(),
        defined: HashMap::new(),
        stage: vec![0; g.nodes.len()],
        exchanges: Vec::new(),
        exported: HashMap::new(),
        collectives: Vec::new(),
        collected: HashMap::new(),
    };
    let mut column_split = Vec::new();
    let mut row_split = Vec::new();
    for (id, node) in g.nodes.iter() {
        let uses = &pass.uses[id.index()];
        if node.op.kind == OpKind::MatMul {
            match uses.get(1) {
                Some(Use::Slice(1)) => column_split.push(id),
                Some(Use::Slice(0)) => row_split.push(id),
                _ => {}
            }
        }
        let mask = node.outputs.iter().fold(0u64, |m, &o| m | need.get(&(o, Form::Local)).copied().unwrap_or(0));
        if mask == 0 {
            continue;
        }
        let form = |i: usize| if uses.get(i) == Some(&Use::Reduced) { Form::Reduced } else { Form::Local };
        let stage = node
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.filter(|v| g.constant(*v).is_none()).map(|v| b.stage_of(v, form(i))))
            .max()
            .unwrap_or(0);
        b.stage[id.index()] = stage;
        let local_out: Vec<TensorType> = node.outputs.iter().map(|&o| b.local_ty(o)).collect();
        for d in 0..devices {
            if mask >> d & 1 == 0 {
                continue;
            }
            let mut inputs = Vec::with_capacity(node.inputs.len());
            for (i, v) in node.inputs.iter().enumerate() {
                let Some(v) = *v else {
                    inputs.push(None);
                    continue;
                };
                let u = uses.get(i).copied().unwrap_or(Use::Plain);
                inputs.push(Some(if g.constant(v).is_some() {
                    b.constant(stage, d, v, u, local_out.first())
                } else {
                    b.get(stage, d, v, form(i))
                }));
            }
            let outs: Vec<(String, TensorType)> =
                node.outputs.iter().zip(&local_out).map(|(&o, t)| (value_name(g, o), t.clone())).collect();
            let op: Op = node.op.clone();
            let seg = b.seg(stage, d);
            let (_, ids) = seg.graph.add_node(node.name.clone(), op, inputs, outs);
            for (&o, &l) in node.outputs.iter().zip(&ids) {
                seg.map.insert((o, Form::Local), l);
            }
            for (&o, &l) in node.outputs.iter().zip(&ids) {
                b.defined.insert((o, d), (stage, l));
            }
        }
    }
    // Model outputs on device 0.
    let mut outputs = Vec::with_capacity(g.outputs.len());
    for &o in &g.outputs {
        outputs.push(match output_form(o) {
            Form::Local => b.export(o, 0),
            f => b.collective(o, f)[0],
        });
    }
    let mut segments: Vec<Segment> = b
        .segs
        .into_iter()
        .map(|((stage, device), s)| Segment { stage, device, graph: s.graph, inputs: s.inputs, outputs: s.outputs })
        .collect();
    order_segments(&mut segments).map_err(|(graph, e)| ShardError::Internal { graph, why: e.to_string() })?;
    // Every exchange has a writer: a segment's output or a collective's destination.
    let mut written = vec![false; b.exchanges.len()];
    for e in segments.iter().flat_map(|s| &s.outputs).chain(b.collectives.iter().flat_map(|c| &c.dst)) {
        written[*e] = true;
    }
    if let Some(e) = written.iter().position(|w| !w) {
        return Err(ShardError::Internal {
            graph: g.name.clone(),
            why: format!("exchange {:?} has no writer", b.exchanges[e].name),
        });
    }
    let mut collectives = b.collectives;
    collectives.sort_by_key(|c| c.after_stage);
    Ok(Sharded {
        devices,
        segments,
        collectives,
        exchanges: b.exchanges,
        outputs,
        layouts: pass.layout,
        column_split,
        row_split,
    })
}

/// The text form of a sharded graph: per stage, each device's segment (kiln-ir text
/// without the constants' bytes), then the collectives after it (`kiln compile
/// --devices N --to tensor`).
pub fn print(s: &Sharded) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "sharded over {} devices, {} stages", s.devices, s.stages());
    for stage in 0..s.stages() {
        for seg in s.segments.iter().filter(|x| x.stage == stage) {
            let _ = writeln!(out, "stage {stage} device {}:", seg.device);
            // The graph without its constants' bytes (the `blobs` section: the sliced
            // weights, megabytes of text for a real model).
            let text = kiln_ir::text::print(&seg.graph);
            let body = text.find("\nblobs {").map_or(&text[..], |i| &text[..=i]);
            out.push_str(body);
        }
        for c in s.collectives.iter().filter(|c| c.after_stage == stage) {
            let what = match c.kind {
                CollectiveKind::AllReduce => "all-reduce sum".to_string(),
                CollectiveKind::AllGather { axis } => format!("all-gather axis {axis}"),
            };
            let _ = writeln!(out, "collective {what} of {:?} over {} devices", c.name, c.src.len());
        }
    }
    out
}
