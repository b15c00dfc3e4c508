//! The flow-level program: buffers and the dispatches that compute them.
//!
//! [`form`] lowers every node of a tensor-level graph into dispatches with a given
//! lowering ([`crate::lower::Lowering`]; kiln's are crate `kiln-lower`'s), then fuses producers into their consumers ([`crate::fuse`]) and drops
//! dispatches nobody reads. A buffer is a graph input, a constant, a dispatch result,
//! or an alias (the same bytes under another shape, for reshape-like ops).
//!
//! **Guards: run-time `If` in a flat program.** A dispatch may carry a [`Guard`]: it
//! runs only when each listed buffer (a one-element bool) holds the listed truth
//! value. Lowering an `If` node lowers both branches into the same program, each
//! branch's dispatches guarded by the condition (true for `then`, false for `else`;
//! a nested `If` appends its own condition), and ends each branch with a guarded copy
//! of its outputs into the node's result buffers: a result buffer is written by one
//! dispatch per branch, and only one of them runs, whichever branch the condition
//! picks, so the result's bytes are the same slots either way. Everything downstream
//! keeps working on one program: fusion takes a producer into a consumer only when
//! the producer runs whenever the consumer does (its guard is a prefix of the
//! consumer's), scheduling orders a guarded dispatch after its condition's producer,
//! and the HAL level turns each run of equally guarded dispatches into a conditional
//! skip over their commands. A buffer with several writers has no single producer
//! ([`FlowProgram::producers`] says `None`), so no pass fuses it away or folds it.

use kiln_ir::entity::EntityId;
use kiln_ir::{Graph, OpKind, Tensor, TensorType, ValueDef, ValueId};

use crate::class::{classify, KernelClass};
use crate::kernel::Kernel;
use crate::lower::{LowerError, Lowering, OpCx, OpInput, Operand, Output};

/// A buffer of the flow program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u32);

impl BufferId {
    /// Position in [`FlowProgram::buffers`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Where a buffer's contents come from.
#[derive(Debug, Clone, PartialEq)]
pub enum BufferKind {
    /// Graph input `i`.
    Input(usize),
    /// A constant.
    Const(Tensor),
    /// The result of a dispatch.
    Result,
    /// The bytes of another buffer under this buffer's type.
    Alias(BufferId),
}

/// One tensor of the program.
#[derive(Debug, Clone, PartialEq)]
pub struct Buffer {
    /// Its type.
    pub ty: TensorType,
    /// Name of the value in the source model.
    pub name: String,
    /// Where its contents come from.
    pub kind: BufferKind,
}

/// One kernel run: reads `operands` (bound to the kernel's inputs in order), writes `result`.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// The kernel.
    pub kernel: Kernel,
    /// Buffers bound to the kernel's inputs.
    pub operands: Vec<BufferId>,
    /// The buffer it writes.
    pub result: BufferId,
    /// The source ops fused into it (`"Conv conv1"`), for listings and debug info.
    pub sources: Vec<String>,
    /// The kernel's class ([`crate::class::classify`]), which code generators match on. Every
    /// pass of this crate that changes kernels sets it again ([`FlowProgram::classify`]).
    pub class: KernelClass,
    /// When it runs (see the module docs); empty: always.
    pub guard: Guard,
}

/// The conditions a dispatch runs under: every `(buffer, truth)` must hold, the buffer
/// being a one-element bool (any nonzero byte is true). Outermost condition first.
pub type Guard = Vec<(BufferId, bool)>;

impl Dispatch {
    /// A dispatch of `kernel`, of the kernel's class, unguarded.
    pub fn new(kernel: Kernel, operands: Vec<BufferId>, result: BufferId, sources: Vec<String>) -> Dispatch {
        let class = classify(&kernel);
        Dispatch { kernel, operands, result, sources, class, guard: Guard::new() }
    }

    /// The same dispatch under `guard`.
    pub fn guarded(mut self, guard: Guard) -> Dispatch {
        self.guard = guard;
        self
    }
}

/// Whether a dispatch guarded by `inner` runs only when one guarded by `outer` does
/// (`outer` is a prefix of `inner`): then `outer`'s work may move into `inner`'s kernel.
pub fn guard_within(outer: &[(BufferId, bool)], inner: &[(BufferId, bool)]) -> bool {
    inner.starts_with(outer)
}

/// A program at the flow level.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowProgram {
    /// Name of the source graph.
    pub name: String,
    /// Every buffer.
    pub buffers: Vec<Buffer>,
    /// Dispatches in a valid execution order.
    pub dispatches: Vec<Dispatch>,
    /// Graph inputs, in signature order.
    pub inputs: Vec<BufferId>,
    /// Graph outputs, in signature order.
    pub outputs: Vec<BufferId>,
    /// The data-dependent extents the plan carries (`kiln_ir::dynamic`): buffers that
    /// stay live to the end of the plan, checked against their bounds and read for the
    /// outputs' actual shapes.
    pub extents: Vec<Extent>,
}

/// A data-dependent extent: an `i64` scalar buffer written by the op that computes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Extent {
    /// The buffer holding the extent.
    pub buffer: BufferId,
    /// Its bound (a larger extent is a run-time error).
    pub bound: u64,
    /// What it counts, for errors (`"nms_out"`).
    pub name: String,
    /// The graph outputs it sizes: (output index, axis).
    pub outputs: Vec<(u32, u32)>,
    /// For a bounded input dimension (`kiln_ir::bounded`): the extent is not computed
    /// by the plan but given by the caller's tensor, and `buffer` is an input.
    pub input: Option<InputExtent>,
}

/// A bounded input dimension: the runtime writes its extent, from the caller's tensor,
/// into the extent input, and the caller's tensor into the input's bound-sized place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputExtent {
    /// The input (an index into [`FlowProgram::inputs`]).
    pub input: usize,
    /// Its bounded axis.
    pub axis: usize,
    /// The smallest extent.
    pub min: u64,
    /// The `i64` scalar input holding the extent (an index into [`FlowProgram::inputs`];
    /// the caller does not pass it).
    pub extent_input: usize,
    /// The buffers that carry the dimension, each with its axis there (a value may carry
    /// it along two axes: one entry each): where [`FlowProgram::bounded_rows`] looks
    /// for dispatches whose work the extent may shorten.
    pub carried: Vec<(BufferId, usize)>,
}

/// Why a graph cannot become a flow program.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlowError {
    /// An op could not be lowered.
    #[error("node `{node}`: {source}")]
    Lower {
        /// Name of the node (or its op kind when unnamed).
        node: String,
        /// Why.
        source: LowerError,
    },
    /// The graph refers to something that does not exist (a bug upstream).
    #[error("malformed graph: {0}")]
    Graph(String),
    /// An op cannot run on an operand of data-dependent extent (see `kiln_ir::dynamic`).
    #[error("{0}")]
    Dynamic(Box<kiln_ir::dynamic::DynamicError>),
}

impl FlowError {
    /// Whether lowering failed only because an operand it needs at compile time is
    /// computed at run time (see [`LowerError::NotConstant`]).
    pub fn needs_constant_operand(&self) -> bool {
        matches!(self, FlowError::Lower { source: LowerError::NotConstant { .. }, .. })
    }
}

impl FlowProgram {
    /// The buffer behind `id`.
    pub fn buffer(&self, id: BufferId) -> &Buffer {
        &self.buffers[id.index()]
    }

    /// The buffer whose bytes `id` uses (itself unless it is an alias).
    pub fn storage(&self, mut id: BufferId) -> BufferId {
        while let BufferKind::Alias(b) = self.buffers[id.index()].kind {
            id = b;
        }
        id
    }

    /// Sets every dispatch's class from its kernel (after a pass that changed kernels).
    pub fn classify(&mut self) {
        for d in &mut self.dispatches {
            d.class = classify(&d.kernel);
        }
    }

    /// Which dispatch writes each buffer: `None` for a buffer no dispatch writes, and
    /// for the result of a run-time `If`, which one dispatch per branch writes (see the
    /// module docs; [`FlowProgram::writers`] lists them).
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.buffers.len()];
        let mut many = vec![false; self.buffers.len()];
        for (i, d) in self.dispatches.iter().enumerate() {
            let r = d.result.index();
            many[r] |= p[r].is_some();
            p[r] = Some(i);
        }
        for (x, m) in p.iter_mut().zip(many) {
            if m {
                *x = None;
            }
        }
        p
    }

    /// Every dispatch that writes each buffer, in program order.
    pub fn writers(&self) -> Vec<Vec<usize>> {
        let mut w = vec![Vec::new(); self.buffers.len()];
        for (i, d) in self.dispatches.iter().enumerate() {
            w[d.result.index()].push(i);
        }
        w
    }

    /// Whether any dispatch is guarded (the program has run-time control flow).
    pub fn has_guards(&self) -> bool {
        self.dispatches.iter().any(|d| !d.guard.is_empty())
    }

    pub(crate) fn add(&mut self, ty: TensorType, name: String, kind: BufferKind) -> BufferId {
        self.buffers.push(Buffer { ty, name, kind });
        BufferId(self.buffers.len() as u32 - 1)
    }

    /// Removes dispatches whose results nobody reads, and buffers nobody refers to
    /// (renumbering buffers).
    pub fn remove_dead(&mut self) {
        let mut live = vec![false; self.buffers.len()];
        let mark = |live: &mut Vec<bool>, p: &FlowProgram, mut b: BufferId| loop {
            live[b.index()] = true;
            match p.buffers[b.index()].kind {
                BufferKind::Alias(x) => b = x,
                _ => break,
            }
        };
        for &o in &self.outputs {
            mark(&mut live, self, o);
        }
        for e in &self.extents {
            mark(&mut live, self, e.buffer);
        }
        for &i in &self.inputs {
            live[i.index()] = true;
        }
        for d in self.dispatches.iter().rev() {
            if live[d.result.index()] {
                for &o in d.operands.iter().chain(d.guard.iter().map(|(c, _)| c)) {
                    mark(&mut live, self, o);
                }
            }
        }
        self.dispatches.retain(|d| live[d.result.index()]);
        let mut map = vec![None; self.buffers.len()];
        let mut buffers = Vec::new();
        for (i, b) in self.buffers.iter().enumerate() {
            if live[i] {
                map[i] = Some(BufferId(buffers.len() as u32));
                buffers.push(b.clone());
            }
        }
        let m = |b: BufferId| map[b.index()].unwrap_or(b);
        for b in &mut buffers {
            if let BufferKind::Alias(x) = b.kind {
                b.kind = BufferKind::Alias(m(x));
            }
        }
        for d in &mut self.dispatches {
            d.result = m(d.result);
            d.operands.iter_mut().for_each(|o| *o = m(*o));
            d.guard.iter_mut().for_each(|(c, _)| *c = m(*c));
        }
        self.inputs.iter_mut().for_each(|o| *o = m(*o));
        self.outputs.iter_mut().for_each(|o| *o = m(*o));
        for e in &mut self.extents {
            e.buffer = m(e.buffer);
            if let Some(ie) = &mut e.input {
                // (A dead buffer has no writer left: it is dropped from the list.)
                ie.carried.retain(|&(b, _)| map[b.index()].is_some());
                ie.carried.iter_mut().for_each(|(b, _)| *b = m(*b));
            }
        }
        self.buffers = buffers;
    }
}

/// What dispatch formation shapes a program for: the kernel forms of its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Formation {
    /// Every kernel compiled the general way (`--opt size`): no contraction layout
    /// transforms, and fusion free to fold anything into a product (a target that
    /// compiles every kernel the general way gains nothing from them and pays a
    /// dispatch each).
    General,
    /// Contraction microkernels that read their operands in place, in panels along
    /// unit-stride columns (the CPU): padding written once in front of a convolution,
    /// constant right operands laid out `[K, N]`, dequantisation in the load, and the
    /// image of a narrow convolution gathered into columns
    /// ([`crate::layout::materialize_columns`]).
    Microkernels,
    /// Contraction kernels that read any affine operand map (the CUDA target's implicit
    /// GEMM, whose tiles take a convolution's window positions as columns as they
    /// are): the same, but no column gathering, which would cost such a target a
    /// dispatch and a pass over the image for nothing.
    ImplicitGemm,
}

impl Formation {
    /// Whether the contraction layout transforms and fusion's
    /// keep-contractions-addressable rule apply.
    pub fn contractions(self) -> bool {
        self != Formation::General
    }
}

/// Lowers every node of `graph` with `lower` and fuses the result (see the module docs),
/// shaping the program for `formation`'s kernel forms; with `fused_attention` (and
/// [`Formation::Microkernels`] or [`Formation::ImplicitGemm`], the targets with an
/// attention emitter: the CPU and CUDA) each attention chain the CPU emitter reads in place
/// and the target's rule accepts becomes one
/// [`KernelClass::Attention`](crate::class::KernelClass::Attention) kernel
/// ([`crate::attention::form_attention`]).
pub fn form(
    graph: &Graph,
    formation: Formation,
    fused_attention: Option<crate::attention::Accept<'_>>,
    lower: &Lowering<'_>,
) -> Result<FlowProgram, FlowError> {
    let contractions = formation.contractions();
    let mut p = lower_graph(graph, lower)?;
    // Rearranged constants (ConvTranspose's phase filters) become constants before
    // anything reads their layout.
    crate::fold::fold_constants(&mut p);
    if contractions {
        crate::layout::materialize_padding(&mut p);
        // Before fusion, so that fusion sees these products as contractions and keeps
        // their operands plain loads (an embedding Gather in front of a recurrent
        // layer's input projection stays its own dispatch); again after it, for
        // products that fusion forms.
        crate::layout::relayout_constants(&mut p);
    }
    crate::fuse::fuse_with(&mut p, contractions);
    // After fusion, which keeps a product apart from the softmax before and after it:
    // the whole attention chain becomes one kernel where the target has its emitter.
    if let (true, Some(accept)) = (formation != Formation::General, fused_attention) {
        crate::attention::form_attention(&mut p, accept);
    }
    if contractions {
        crate::dequant::dequantize_in_load(&mut p);
        crate::mx::block_scaled_in_load(&mut p);
        crate::layout::relayout_constants(&mut p);
        crate::dequant::fold_int_constant_sums(&mut p);
    }
    if formation == Formation::Microkernels {
        crate::layout::materialize_columns(&mut p);
    }
    p.remove_dead();
    Ok(p)
}

/// Lowers every node of `graph` with `lower`, one dispatch per kernel, without fusing.
pub fn lower_graph(graph: &Graph, lower: &Lowering<'_>) -> Result<FlowProgram, FlowError> {
    // Reductions along a data-dependent axis read its extent (kiln_ir::dynamic).
    let masked;
    let mut bounded_axes = Vec::new();
    let graph = if !graph.bounded.is_empty() {
        // Bounded input dimensions (kiln_ir::bounded): refused where an op cannot run
        // on one, naming it; ops mixing along one read its extent.
        let err = |e| FlowError::Dynamic(Box::new(e));
        if kiln_ir::dynamic::has_sources(graph) {
            let n = graph.nodes.values().find(|n| kiln_ir::dynamic::source(n, graph).is_some());
            return Err(err(kiln_ir::dynamic::DynamicError {
                node: n.map(|n| n.name.clone()).unwrap_or_default(),
                op: n.map_or(kiln_ir::OpKind::NonZero, |n| n.op.kind),
                reason: "a data-dependent op in a graph with a bounded input dimension is not supported".into(),
            }));
        }
        kiln_ir::bounded::analyse(graph).map_err(err)?;
        masked = kiln_ir::bounded::mask(graph);
        bounded_axes = kiln_ir::bounded::analyse_with(&masked, false).map_err(err)?;
        &masked
    } else if kiln_ir::dynamic::has_sources(graph) {
        masked = kiln_ir::dynamic::mask_reductions(graph);
        &masked
    } else {
        graph
    };
    let mut p = FlowProgram {
        extents: Vec::new(),
        name: graph.name.clone(),
        buffers: Vec::new(),
        dispatches: Vec::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
    };
    let mut of_value: Vec<Option<BufferId>> = vec![None; graph.values.len()];
    for &i in &graph.inputs {
        let b = value_buffer(&mut p, graph, &mut of_value, i);
        p.inputs.push(b);
    }
    lower_nodes(&mut p, graph, &mut of_value, &Guard::new(), "k", lower)?;
    for &o in &graph.outputs {
        let b = value_buffer(&mut p, graph, &mut of_value, o);
        p.outputs.push(b);
    }
    for (k, b) in graph.bounded.iter().enumerate() {
        let (Some(&x), Some(&e)) = (graph.inputs.get(b.input), graph.inputs.get(b.extent)) else {
            return Err(FlowError::Graph(format!("bounded dimension {k} names a missing input")));
        };
        let buffer = value_buffer(&mut p, graph, &mut of_value, e);
        let outputs = graph
            .outputs
            .iter()
            .enumerate()
            .flat_map(|(o, &v)| {
                bounded_axes[v.index()].iter().filter(|&&(_, d)| d == k).map(move |&(axis, _)| (o as u32, axis as u32))
            })
            .collect();
        p.extents.push(Extent {
            buffer,
            bound: b.bound as u64,
            name: graph.values[x].name.clone(),
            outputs,
            input: Some(InputExtent {
                input: b.input,
                axis: b.axis,
                min: b.min as u64,
                extent_input: b.extent,
                carried: carried(graph, &of_value, &bounded_axes, k),
            }),
        });
    }
    if kiln_ir::dynamic::has_sources(graph) {
        // Data-dependent extents (kiln_ir::dynamic): every op's extent, checked at run
        // time, and the outputs each sizes; an op that cannot run on a bounded operand
        // is refused here, naming it.
        let dynamic = kiln_ir::dynamic::analyse(graph).map_err(|e| FlowError::Dynamic(Box::new(e)))?;
        for node in graph.nodes.values() {
            let Some((results, extent)) = kiln_ir::dynamic::source(node, graph) else { continue };
            if let (Some(&e), true) = (node.outputs.get(extent), results.is_empty()) {
                // A shape check: bound 0, no output to size (the runtime fails a call
                // where the count is not 0).
                let buffer = value_buffer(&mut p, graph, &mut of_value, e);
                let name = graph.values[node.outputs[0]].name.clone();
                p.extents.push(Extent { buffer, bound: 0, name, outputs: Vec::new(), input: None });
                continue;
            }
            let (Some(&e), Some(&(r, axis))) = (node.outputs.get(extent), results.first()) else { continue };
            let bound = graph.ty(node.outputs[r]).shape.dims()[axis] as u64;
            let buffer = value_buffer(&mut p, graph, &mut of_value, e);
            let name = graph.values[node.outputs[r]].name.clone();
            let outputs = graph
                .outputs
                .iter()
                .enumerate()
                .filter_map(|(k, &o)| dynamic[o.index()].filter(|d| d.extent == e).map(|d| (k as u32, d.axis as u32)))
                .collect();
            p.extents.push(Extent { buffer, bound, name, outputs, input: None });
        }
    }
    Ok(p)
}

/// The result buffers of `graph`'s node values that carry bounded dimension `k`, with
/// the axis (from `kiln_ir::bounded::analyse_with` on the masked graph).
fn carried(
    graph: &Graph,
    of_value: &[Option<BufferId>],
    axes: &[kiln_ir::bounded::Axes],
    k: usize,
) -> Vec<(BufferId, usize)> {
    let mut out = Vec::new();
    for (v, val) in graph.values.iter() {
        let (ValueDef::Node { .. }, Some(b)) = (&val.def, of_value.get(v.index()).copied().flatten()) else { continue };
        for &(axis, d) in axes.get(v.index()).map_or(&[][..], |a| a.as_slice()) {
            if d == k {
                out.push((b, axis));
            }
        }
    }
    out
}

/// A dispatch whose work a bounded dimension's extent may shorten along an output
/// axis ([`FlowProgram::bounded_rows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundedRows {
    /// The dispatch (an index into [`FlowProgram::dispatches`]).
    pub dispatch: usize,
    /// The extent (an index into [`FlowProgram::extents`], one of a bounded input).
    pub extent: usize,
    /// The axis of its kernel's output.
    pub axis: usize,
}

impl FlowProgram {
    /// The dispatches whose positions at or past a bounded dimension's extent along an
    /// output axis nothing reads as data, so that a call may leave them unwritten: each
    /// dispatch writing a buffer that carries the dimension along that axis (unguarded,
    /// its kernel's output that buffer's shape), unless its kernel *masks* along the
    /// axis — a boolean that reads the extent (or a boolean computed from it) and the
    /// axis's index, as a `Where(iota < extent, x, identity)` fused into it does: then
    /// its padding holds the identity that a later reduction or product reads. Every
    /// other reader of the padding is a mask (a select, which never reads the padding
    /// as data), an op that computes padding from padding, or an output the runtime
    /// compacts. A dispatch may be listed once per axis.
    pub fn bounded_rows(&self) -> Vec<BoundedRows> {
        let mut out = Vec::new();
        for (xi, x) in self.extents.iter().enumerate() {
            let Some(ie) = &x.input else { continue };
            let ext = self.storage(x.buffer);
            let tainted = self.extent_booleans(ext);
            for (di, d) in self.dispatches.iter().enumerate() {
                let result = self.storage(d.result);
                if !d.guard.is_empty() {
                    continue;
                }
                let dims = self.buffer(d.result).ty.shape.dims();
                for &(b, axis) in &ie.carried {
                    if self.storage(b) != result
                        || b != d.result
                        || d.kernel.output.shape.dims() != dims
                        || dims.get(axis).map(|&n| n as u64) != Some(x.bound)
                        || out.contains(&BoundedRows { dispatch: di, extent: xi, axis })
                    {
                        continue;
                    }
                    let sources: Vec<u32> = (0..d.operands.len() as u32)
                        .filter(|&i| tainted.contains(&self.storage(d.operands[i as usize])))
                        .collect();
                    if !masks_along(&d.kernel, &sources, axis) {
                        out.push(BoundedRows { dispatch: di, extent: xi, axis });
                    }
                }
            }
        }
        out
    }
}

impl FlowProgram {
    /// The storage of extent buffer `ext` and of the booleans computed from it (the
    /// masks' `iota < extent`), in dispatch order: a dispatch of a boolean result
    /// reading the extent or one of them.
    fn extent_booleans(&self, ext: BufferId) -> Vec<BufferId> {
        let mut tainted = vec![ext];
        for d in &self.dispatches {
            if self.buffer(d.result).ty.dtype == kiln_ir::DType::Bool
                && d.operands.iter().any(|&o| tainted.contains(&self.storage(o)))
            {
                tainted.push(self.storage(d.result));
            }
        }
        tainted
    }

    /// Whether `fused` (dispatch `d`'s kernel with its producer, whose result carries a
    /// bounded dimension, fused in; reading `operands`) would mask along every axis
    /// along which `d`'s result carries the dimension: a mask fused into a product
    /// writes the identity into the padding, so the product would run at the bound
    /// whatever the extent ([`FlowProgram::bounded_rows`]), where the mask alone, a
    /// select, is a cheap kernel of its own. (Fusion keeps them apart then.)
    pub fn fusion_masks_bounded_rows(&self, d: usize, producer: usize, fused: &Kernel, operands: &[BufferId]) -> bool {
        let (Some(dd), Some(pd)) = (self.dispatches.get(d), self.dispatches.get(producer)) else { return false };
        for x in &self.extents {
            let Some(ie) = &x.input else { continue };
            let axes: Vec<usize> = ie.carried.iter().filter(|&&(b, _)| b == dd.result).map(|&(_, a)| a).collect();
            if axes.is_empty() || !ie.carried.iter().any(|&(b, _)| b == pd.result) {
                continue;
            }
            let tainted = self.extent_booleans(self.storage(x.buffer));
            let sources: Vec<u32> =
                (0..operands.len() as u32).filter(|&i| tainted.contains(&self.storage(operands[i as usize]))).collect();
            if axes.iter().all(|&a| masks_along(fused, &sources, a)) {
                return true;
            }
        }
        false
    }
}

/// Whether a boolean node of `k` reads one of the inputs `sources` and the index of
/// output axis `axis` (a mask along it).
fn masks_along(k: &Kernel, sources: &[u32], axis: usize) -> bool {
    use crate::kernel::Expr;
    if sources.is_empty() {
        return false;
    }
    // Per node: (reads a source, reads the axis's index). Operands precede users.
    let mut of: Vec<(bool, bool)> = Vec::with_capacity(k.nodes.len());
    for n in &k.nodes {
        let mut here = match &n.expr {
            Expr::Var(v) => (false, v.0 as usize == axis),
            Expr::Load { input, .. } => (sources.contains(input), false),
            _ => (false, false),
        };
        n.expr.for_each_operand(|o| {
            if let Some(&(s, a)) = of.get(o.index()) {
                here = (here.0 || s, here.1 || a);
            }
        });
        if n.ty == crate::kernel::ScalarType::Bool && here.0 && here.1 {
            return true;
        }
        of.push(here);
    }
    false
}

/// The buffer of value `v` of `graph`, made on first use.
fn value_buffer(p: &mut FlowProgram, graph: &Graph, of_value: &mut [Option<BufferId>], v: ValueId) -> BufferId {
    if let Some(b) = of_value[v.index()] {
        return b;
    }
    let val = &graph.values[v];
    let kind = match &val.def {
        ValueDef::Const(t) => BufferKind::Const(t.clone()),
        ValueDef::Input => BufferKind::Input(graph.inputs.iter().position(|&i| i == v).unwrap_or(0)),
        ValueDef::Node { .. } => BufferKind::Result,
    };
    let b = p.add(val.ty.clone(), val.name.clone(), kind);
    of_value[v.index()] = Some(b);
    b
}

/// A kernel copying a tensor of type `ty` (the end of an `If` branch).
fn copy_kernel(name: String, ty: &TensorType) -> Result<Kernel, FlowError> {
    let mut b = crate::kernel::KernelBuilder::new(name, vec![ty.clone()], ty.clone());
    let idx = b.out_index();
    let x = b.load(0, idx);
    b.finish(x).map_err(|e| FlowError::Graph(format!("copy kernel: {e}")))
}

/// Lowers the nodes of `graph` (the whole graph, or an `If` branch whose inputs
/// `of_value` already maps) into `p`, every dispatch under `guard`; kernels are named
/// `{prefix}{node}_{step}`.
fn lower_nodes(
    p: &mut FlowProgram,
    graph: &Graph,
    of_value: &mut [Option<BufferId>],
    guard: &Guard,
    prefix: &str,
    lower: &Lowering<'_>,
) -> Result<(), FlowError> {
    let mut used = vec![false; graph.values.len()];
    for n in graph.nodes.values() {
        n.inputs.iter().flatten().for_each(|v| used[v.index()] = true);
    }
    graph.outputs.iter().for_each(|v| used[v.index()] = true);
    for (nid, node) in graph.nodes.iter() {
        if !node.outputs.iter().any(|v| used[v.index()]) {
            continue;
        }
        let label = if node.name.is_empty() { node.op.kind.name().to_string() } else { node.name.clone() };
        let name = format!("{prefix}{}", nid.index());
        if node.op.kind == OpKind::If {
            lower_if(p, graph, of_value, guard, &name, &label, node, lower)?;
            continue;
        }
        let inputs: Vec<Option<OpInput>> = node
            .inputs
            .iter()
            .map(|v| v.map(|v| OpInput { ty: &graph.values[v].ty, value: graph.values[v].constant() }))
            .collect();
        let outputs: Vec<TensorType> = node.outputs.iter().map(|&v| graph.values[v].ty.clone()).collect();
        let cx = OpCx { op: &node.op, name: &name, inputs: &inputs, outputs: &outputs };
        let lowered = lower(&cx).map_err(|source| FlowError::Lower { node: label.clone(), source })?;
        let source = format!("{} {}", node.op.kind.name(), label);
        let mut step_buffers: Vec<BufferId> = Vec::with_capacity(lowered.steps.len());
        // Results of the op that come straight from a step take the value's buffer.
        let mut step_value: Vec<Option<ValueId>> = vec![None; lowered.steps.len()];
        for (k, o) in lowered.outputs.iter().enumerate() {
            if let (Output::Step(s), Some(&v)) = (o, node.outputs.get(k)) {
                // (A step whose result has another shape is viewed through an alias.)
                let same = lowered.steps.get(*s).is_some_and(|st| st.kernel.output == graph.values[v].ty);
                if same && step_value[*s].is_none() && of_value[v.index()].is_none() {
                    step_value[*s] = Some(v);
                }
            }
        }
        for (s, step) in lowered.steps.iter().enumerate() {
            let mut operands = Vec::with_capacity(step.operands.len());
            for &o in &step.operands {
                let b = match o {
                    Operand::Input(i) => match node.inputs.get(i).copied().flatten() {
                        Some(v) => value_buffer(p, graph, of_value, v),
                        None => return Err(FlowError::Graph(format!("{label}: kernel reads absent operand {i}"))),
                    },
                    Operand::Step(k) if k < s => step_buffers[k],
                    Operand::Step(k) => {
                        return Err(FlowError::Graph(format!("{label}: step {s} reads step {k}, not yet computed")))
                    }
                };
                operands.push(b);
            }
            let result = match step_value[s] {
                Some(v) => value_buffer(p, graph, of_value, v),
                None => p.add(step.kernel.output.clone(), format!("{label}.{s}"), BufferKind::Result),
            };
            let mut kernel = step.kernel.clone();
            kernel.name = format!("{name}_{s}");
            p.dispatches.push(Dispatch::new(kernel, operands, result, vec![source.clone()]).guarded(guard.clone()));
            step_buffers.push(result);
        }
        for (k, o) in lowered.outputs.iter().enumerate() {
            let Some(&v) = node.outputs.get(k) else { continue };
            match *o {
                Output::Step(s) => {
                    let b = step_buffers[s];
                    let same = p.buffer(b).ty == graph.values[v].ty;
                    if of_value[v.index()].is_none() && same {
                        of_value[v.index()] = Some(b);
                    } else if of_value[v.index()] != Some(b) {
                        // Two results computed by one step, or a step's result of another
                        // shape: an alias.
                        let a = p.add(graph.values[v].ty.clone(), graph.values[v].name.clone(), BufferKind::Alias(b));
                        of_value[v.index()] = Some(a);
                    }
                }
                Output::Alias(i) => {
                    let Some(src) = node.inputs.get(i).copied().flatten() else {
                        return Err(FlowError::Graph(format!("{label}: result aliases absent operand {i}")));
                    };
                    let sb = value_buffer(p, graph, of_value, src);
                    let a = p.add(graph.values[v].ty.clone(), graph.values[v].name.clone(), BufferKind::Alias(sb));
                    of_value[v.index()] = Some(a);
                }
            }
        }
    }
    Ok(())
}

/// Lowers a run-time `If` (see the module docs): each branch's nodes under the guard
/// plus its condition, then a guarded copy of each branch output into the node's
/// result buffer. Kernels are named `{name}t…` (then) and `{name}e…` (else).
#[allow(clippy::too_many_arguments)]
fn lower_if(
    p: &mut FlowProgram,
    graph: &Graph,
    of_value: &mut [Option<BufferId>],
    guard: &Guard,
    name: &str,
    label: &str,
    node: &kiln_ir::Node,
    lower: &Lowering<'_>,
) -> Result<(), FlowError> {
    let bad = |m: &str| FlowError::Graph(format!("{label}: {m}"));
    let a = node.op.attrs_of::<kiln_ir::attrs::IfAttrs>().map_err(|e| bad(&e.to_string()))?;
    let cond = node.inputs.first().copied().flatten().ok_or_else(|| bad("If without a condition"))?;
    let cond = value_buffer(p, graph, of_value, cond);
    let mut captured = Vec::with_capacity(node.inputs.len().saturating_sub(1));
    for v in node.inputs.iter().skip(1) {
        let v = v.ok_or_else(|| bad("an absent captured value"))?;
        captured.push(value_buffer(p, graph, of_value, v));
    }
    let results: Vec<BufferId> = node.outputs.iter().map(|&v| value_buffer(p, graph, of_value, v)).collect();
    for (branch, truth, tag) in [(&a.then_branch, true, "t"), (&a.else_branch, false, "e")] {
        let mut inner = guard.clone();
        inner.push((cond, truth));
        if branch.inputs.len() != captured.len() || branch.outputs.len() < results.len() {
            return Err(bad("a branch's signature does not fit the node"));
        }
        let mut sub: Vec<Option<BufferId>> = vec![None; branch.values.len()];
        for (&i, &b) in branch.inputs.iter().zip(&captured) {
            sub[i.index()] = Some(b);
        }
        let prefix = format!("{name}{tag}");
        lower_nodes(p, branch, &mut sub, &inner, &prefix, lower)?;
        let which = if truth { "then" } else { "else" };
        for (k, (&o, &r)) in branch.outputs.iter().zip(&results).enumerate() {
            let src = value_buffer(p, branch, &mut sub, o);
            let kernel = copy_kernel(format!("{prefix}_out{k}"), &p.buffer(r).ty.clone())?;
            let sources = vec![format!("If {label} ({which} result {k})")];
            p.dispatches.push(Dispatch::new(kernel, vec![src], r, sources).guarded(inner.clone()));
        }
    }
    Ok(())
}

/// Runs a flow program with the kernel interpreter (tests and debugging): `inputs` in
/// signature order; returns the outputs in signature order.
pub fn interpret(p: &FlowProgram, inputs: &[Tensor]) -> Result<Vec<Tensor>, crate::interp::InterpError> {
    let mut values: Vec<Option<Tensor>> = vec![None; p.buffers.len()];
    for (i, b) in p.buffers.iter().enumerate() {
        match &b.kind {
            BufferKind::Input(k) => values[i] = inputs.get(*k).cloned(),
            BufferKind::Const(t) => values[i] = Some(t.clone()),
            _ => {}
        }
    }
    let read = |values: &Vec<Option<Tensor>>, b: BufferId| -> Option<Tensor> {
        let s = p.storage(b);
        let t = values[s.index()].as_ref()?;
        t.reshaped(p.buffer(b).ty.shape.clone()).ok()
    };
    for d in &p.dispatches {
        let runs = d
            .guard
            .iter()
            .all(|&(c, truth)| read(&values, c).is_some_and(|t| t.to_f64_vec().iter().any(|&x| x != 0.0) == truth));
        if !runs {
            continue;
        }
        let mut args = Vec::with_capacity(d.operands.len());
        for (j, &o) in d.operands.iter().enumerate() {
            match read(&values, o) {
                Some(t) => args.push(t),
                None => {
                    return Err(crate::interp::InterpError::Input {
                        kernel: d.kernel.name.clone(),
                        input: j,
                        got: "nothing".into(),
                        want: format!("buffer %{}", o.0),
                    })
                }
            }
        }
        let refs: Vec<&Tensor> = args.iter().collect();
        let r = crate::interp::run(&d.kernel, &refs)?;
        values[d.result.index()] = Some(r);
    }
    p.outputs
        .iter()
        .map(|&o| {
            read(&values, o).ok_or_else(|| crate::interp::InterpError::Input {
                kernel: "outputs".into(),
                input: o.index(),
                got: "nothing".into(),
                want: "a computed buffer".into(),
            })
        })
        .collect()
}
