//! Heterogeneous plans (`kiln compile --devices cpu,cuda`): the graph after the tensor
//! passes is placed ([`crate::placement`]) and cut into per-device segments; every
//! segment runs through the usual pipeline for its device's target, and the segments'
//! programs are linked here into one [`Program`] (format 1.8):
//!
//! ```text
//! device table   the list given: device 0 the host CPU ("cpu:0"), then "cuda:0", "cpu:1" …
//! kernels        every segment's kernels and executables (CPU code and PTX side by side),
//!                renamed d<d>.s<stage>.<name>
//! constants      every segment's pool, one after the other (each device reads its own
//!                copy: a GPU uploads the pool at load)
//! arenas         one per device: [values it exports][copies of values it imports]
//!                [segment region]; a device's segments run one after another, so they
//!                share its segment region
//! commands       per stage, per device with work there: one `segment` command (its
//!                device, its length, the segments of other devices it waits for), then
//!                the transfers that bring its operands from other devices' memories
//!                (the consumer pulls), a barrier, the segment's own waves; a last host
//!                segment moves the results into the outputs; within a stage the other
//!                devices' segments come before the host's, which the host submits
//!                before running its own
//! ```
//!
//! Every value crossing devices is exported into its producer's arena region of its
//! own (never reused within the call), so a transfer can read it whenever it runs.

use std::collections::HashMap;

use kiln_ir::entity::EntityId;
use kiln_ir::{Graph, TensorType, ValueDef, ValueId};
use kiln_module::program::{Binding, Command, Constants, DebugInfo, Device, DeviceKind, EntryPoint, Program, Slot};
use kiln_shard::{order_segments, value_name};

use crate::placement::{Placement, Rule};
use crate::{Compilation, CompileError, Compiled, Input, Options, Stage, TargetDevice};

use crate::link::{gather_kernels, linked_binding, port_place, relocate, round_up, tensor_desc, Linked, ALIGN};

// A segment, where its inputs come from and the values that cross segments are those of
// the sharded plans (`kiln_shard`): a heterogeneous split is the same shape of graph.
pub use kiln_shard::{Exchange, Port, Segment};

/// A placed graph cut into segments.
#[derive(Debug, Clone)]
pub struct Split {
    /// The placement.
    pub placement: Placement,
    /// Segments, by stage then device.
    pub segments: Vec<Segment>,
    /// Exchanges.
    pub exchanges: Vec<Exchange>,
    /// Per model output, its exchange.
    pub outputs: Vec<usize>,
}

/// A heterogeneous compile: its `cut` is the placement and segments.
pub type HeteroCompiled = Linked<Split>;

/// Cuts `g` into segments by `p`.
pub fn split(g: &Graph, p: Placement) -> Result<Split, CompileError> {
    struct Seg {
        graph: Graph,
        inputs: Vec<Port>,
        outputs: Vec<usize>,
        map: HashMap<ValueId, ValueId>,
    }
    for &o in &g.outputs {
        if !matches!(g.values[o].def, ValueDef::Node { .. }) {
            return Err(CompileError::Placement(format!(
                "graph output {:?} is not computed by an op; a heterogeneous plan needs every output computed",
                value_name(g, o)
            )));
        }
    }
    let mut segs: Vec<((usize, u32), Seg)> = Vec::new();
    let mut seg_index: HashMap<(usize, u32), usize> = HashMap::new();
    // Where a node's outputs were defined: (segment, local id).
    let mut defined: HashMap<ValueId, (usize, ValueId)> = HashMap::new();
    let mut exported: HashMap<ValueId, usize> = HashMap::new();
    let mut exchanges: Vec<Exchange> = Vec::new();
    let mut export = |segs: &mut Vec<((usize, u32), Seg)>,
                      defined: &HashMap<ValueId, (usize, ValueId)>,
                      exchanges: &mut Vec<Exchange>,
                      v: ValueId|
     -> Result<usize, CompileError> {
        if let Some(&e) = exported.get(&v) {
            return Ok(e);
        }
        let &(s, local) = defined
            .get(&v)
            .ok_or_else(|| CompileError::Link(format!("value {} read before it is computed", value_name(g, v))))?;
        let e = exchanges.len();
        exchanges.push(Exchange { device: segs[s].0 .1, ty: g.ty(v).clone(), name: value_name(g, v) });
        segs[s].1.graph.outputs.push(local);
        segs[s].1.outputs.push(e);
        exported.insert(v, e);
        Ok(e)
    };
    for (id, node) in g.nodes.iter() {
        let key = (p.stage[id.index()], p.device[id.index()]);
        let si = *seg_index.entry(key).or_insert_with(|| {
            segs.push((
                key,
                Seg {
                    graph: Graph::new(format!("{}.s{}.d{}", g.name, key.0, key.1)),
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    map: HashMap::new(),
                },
            ));
            segs.len() - 1
        });
        let mut inputs = Vec::with_capacity(node.inputs.len());
        for v in &node.inputs {
            let Some(v) = *v else {
                inputs.push(None);
                continue;
            };
            if let Some(&x) = segs[si].1.map.get(&v) {
                inputs.push(Some(x));
                continue;
            }
            let local = if let Some(t) = g.constant(v) {
                segs[si].1.graph.add_const(value_name(g, v), t.clone())
            } else {
                let port = match g.values[v].def {
                    ValueDef::Node { .. } => match defined.get(&v) {
                        Some(&(s, x)) if s == si => {
                            inputs.push(Some(x));
                            continue;
                        }
                        _ => Port::Exchange(export(&mut segs, &defined, &mut exchanges, v)?),
                    },
                    _ => {
                        let i = g.inputs.iter().position(|&x| x == v).ok_or_else(|| {
                            CompileError::Link(format!(
                                "value {} is neither computed, a constant nor an input",
                                value_name(g, v)
                            ))
                        })?;
                        Port::Input(i)
                    }
                };
                let s = &mut segs[si].1;
                let x = s.graph.add_input(value_name(g, v), g.ty(v).clone());
                s.inputs.push(port);
                x
            };
            segs[si].1.map.insert(v, local);
            inputs.push(Some(local));
        }
        let outs: Vec<(String, TensorType)> =
            node.outputs.iter().map(|&o| (value_name(g, o), g.ty(o).clone())).collect();
        let s = &mut segs[si].1;
        let (_, ids) = s.graph.add_node(node.name.clone(), node.op.clone(), inputs, outs);
        for (&o, &l) in node.outputs.iter().zip(&ids) {
            s.map.insert(o, l);
            defined.insert(o, (si, l));
        }
    }
    let mut outputs = Vec::with_capacity(g.outputs.len());
    for &o in &g.outputs {
        outputs.push(export(&mut segs, &defined, &mut exchanges, o)?);
    }
    let mut segments: Vec<Segment> = segs
        .into_iter()
        .map(|((stage, device), s)| Segment { stage, device, graph: s.graph, inputs: s.inputs, outputs: s.outputs })
        .collect();
    order_segments(&mut segments).map_err(|(graph, e)| CompileError::Link(format!("segment graph {graph}: {e}")))?;
    Ok(Split { placement: p, segments, exchanges, outputs })
}

/// Compiles `input` into one plan over the devices `kinds` (the first the host CPU),
/// each node placed by `rules` or the cost model.
pub fn compile(
    input: Input,
    options: &Options,
    kinds: &[DeviceKind],
    rules: &[Rule],
) -> Result<HeteroCompiled, CompileError> {
    let mut c = Compilation::new(input, options.clone());
    c.run_to(Stage::TensorPasses)?;
    let graph = c.graph().ok_or(CompileError::Pipeline { stage: Stage::TensorPasses, missing: "tensor graph" })?;
    if kiln_ir::dynamic::has_sources(graph) || !graph.bounded.is_empty() {
        return Err(CompileError::Placement(
            "the model has data-dependent output sizes or bounded input dimensions, which a heterogeneous plan \
             does not carry yet"
                .into(),
        ));
    }
    let placement = crate::placement::place(graph, kinds, rules)?;
    let split = split(graph, placement)?;
    let mut segments = Vec::with_capacity(split.segments.len());
    for s in &split.segments {
        let device = match kinds[s.device as usize] {
            DeviceKind::Cpu => TargetDevice::Cpu,
            DeviceKind::Cuda => TargetDevice::Cuda,
        };
        let seg_opts =
            Options { passes: Some(Vec::new()), external_weights: None, strip: false, device, ..options.clone() };
        segments.push(crate::compile(&s.graph, &seg_opts)?);
    }
    let program = link(graph, &split, &segments, options)?;
    Ok(Linked::write(program, options, split, segments))
}

fn link(graph: &Graph, sp: &Split, segs: &[Compiled], options: &Options) -> Result<Program, CompileError> {
    let bad = |why: String| CompileError::Link(why);
    let kinds = &sp.placement.kinds;
    let nd = kinds.len();
    // Per device, its arena: exports, imports, then the segment region.
    let mut size = vec![0u64; nd];
    let mut ex_off = Vec::with_capacity(sp.exchanges.len());
    for e in &sp.exchanges {
        let d = e.device as usize;
        ex_off.push(size[d]);
        size[d] = round_up(size[d] + e.ty.storage_bytes() as u64);
    }
    // Imports: (port, device) → offset in that device's arena (inputs on the host are
    // read where they are).
    let mut import: HashMap<(Port, u32), u64> = HashMap::new();
    for s in &sp.segments {
        for (k, &port) in s.inputs.iter().enumerate() {
            let home = match port {
                Port::Input(_) => 0,
                Port::Exchange(e) => sp.exchanges[e].device,
            };
            if home == s.device || import.contains_key(&(port, s.device)) {
                continue;
            }
            let bytes = s.graph.ty(s.graph.inputs[k]).storage_bytes() as u64;
            let d = s.device as usize;
            import.insert((port, s.device), size[d]);
            size[d] = round_up(size[d] + bytes);
        }
    }
    let region = size.clone();
    let mut seg_arena = Vec::with_capacity(segs.len());
    let mut pool: Vec<u8> = Vec::new();
    let mut const_base = Vec::with_capacity(segs.len());
    for (s, c) in sp.segments.iter().zip(segs) {
        let entry = c.program.entries.first().ok_or_else(|| bad(format!("segment {} has no entry", s.graph.name)))?;
        if entry.inputs.len() != s.inputs.len() || entry.outputs.len() != s.outputs.len() {
            return Err(bad(format!("segment {}: its program's signature differs from its graph's", s.graph.name)));
        }
        let d = s.device as usize;
        seg_arena.push(region[d]);
        size[d] = size[d].max(region[d] + round_up(entry.arena_size));
        let at = round_up(pool.len() as u64);
        pool.resize(at as usize, 0);
        match &c.program.constants {
            Constants::Embedded(b) => pool.extend_from_slice(b),
            Constants::External { .. } => return Err(bad("a segment kept its constants outside".into())),
        }
        const_base.push(at);
    }
    // Kernels and executables.
    let crate::link::Kernels { kernels, executables, base: kernel_base, sources } =
        gather_kernels(sp.segments.iter().map(|s| (s.device, s.stage)).zip(segs));
    // Where segment si's binding lives, in its own device's memory.
    let remap = |si: usize, b: &Binding| -> Binding {
        let s = &sp.segments[si];
        // An input this device imported is read from its copy.
        let input = |port: Port| match import.get(&(port, s.device)) {
            Some(&off) => (Slot::Arena, off),
            None => port_place(port, &ex_off),
        };
        linked_binding(s, b, (seg_arena[si], const_base[si]), &ex_off, input)
    };
    let mut commands: Vec<Command> = Vec::new();
    let mut cmd_map: Vec<Vec<u32>> = segs.iter().map(|c| vec![0; c.program.entries[0].commands.len()]).collect();
    // Which plan segment wrote each exchange.
    let mut writer: Vec<u32> = vec![u32::MAX; sp.exchanges.len()];
    let mut nseg = 0u32;
    // Within a stage, the other devices' segments first: the host submits them (they
    // run behind its back) before it runs its own, so that both run at once.
    let mut order: Vec<usize> = (0..sp.segments.len()).collect();
    order.sort_by_key(|&i| (sp.segments[i].stage, sp.segments[i].device == 0, sp.segments[i].device));
    for si in order {
        let s = &sp.segments[si];
        let mut body: Vec<Command> = Vec::new();
        let mut waits: Vec<u32> = Vec::new();
        for (k, &port) in s.inputs.iter().enumerate() {
            let Some(&off) = import.get(&(port, s.device)) else {
                if let Port::Exchange(e) = port {
                    // Same device: in-order, no wait needed.
                    let _ = e;
                }
                continue;
            };
            // Transfer each import once per segment that first needs it (later
            // segments of the device find it in place: the import region is never reused).
            let bytes = s.graph.ty(s.graph.inputs[k]).storage_bytes() as u64;
            let (src_device, src) = match port {
                Port::Input(j) => (0u32, Binding { slot: Slot::Input(j as u32), offset: 0, length: bytes }),
                Port::Exchange(e) => {
                    let w = writer[e];
                    if w != u32::MAX && !waits.contains(&w) {
                        waits.push(w);
                    }
                    (sp.exchanges[e].device, Binding { slot: Slot::Arena, offset: ex_off[e], length: bytes })
                }
            };
            if bytes > 0 {
                body.push(Command::Transfer {
                    src_device,
                    src,
                    dst_device: s.device,
                    dst: Binding { slot: Slot::Arena, offset: off, length: bytes },
                });
            }
        }
        if !body.is_empty() {
            body.push(Command::Barrier);
        }
        let base = commands.len() + 1;
        for (ci, c) in segs[si].program.entries[0].commands.iter().enumerate() {
            cmd_map[si][ci] = (base + body.len()) as u32;
            body.push(relocate(c, kernel_base[si], s.device, |b| remap(si, b))?);
        }
        while matches!(body.last(), Some(Command::Barrier)) {
            body.pop();
        }
        if body.is_empty() {
            // (A segment of no commands: its exports are of no bytes.)
            body.push(Command::Barrier);
        }
        waits.sort_unstable();
        commands.push(Command::Segment { device: s.device, count: body.len() as u32, waits });
        commands.extend(body);
        for &e in &s.outputs {
            writer[e] = nseg;
        }
        nseg += 1;
    }
    // The results into the outputs, on the host.
    let mut body = Vec::new();
    let mut waits = Vec::new();
    for (k, &e) in sp.outputs.iter().enumerate() {
        let len = sp.exchanges[e].ty.storage_bytes() as u64;
        if len == 0 {
            continue;
        }
        let src = Binding { slot: Slot::Arena, offset: ex_off[e], length: len };
        let dst = Binding { slot: Slot::Output(k as u32), offset: 0, length: len };
        let d = sp.exchanges[e].device;
        if d == 0 {
            body.push(Command::Copy { src, dst });
        } else {
            if writer[e] != u32::MAX && !waits.contains(&writer[e]) {
                waits.push(writer[e]);
            }
            body.push(Command::Transfer { src_device: d, src, dst_device: 0, dst });
        }
    }
    if !body.is_empty() {
        waits.sort_unstable();
        commands.push(Command::Segment { device: 0, count: body.len() as u32, waits });
        commands.extend(body);
    }
    let last = commands.len().saturating_sub(1) as u32;
    let buffers = crate::link::memory_map(
        &sp.segments,
        segs,
        &cmd_map,
        last,
        remap,
        (&sp.exchanges, &ex_off),
        |x| format!("d{}/{}", x.device, x.name),
        options.strip,
    );
    let mut counts = [0usize; 2];
    let devices = kinds
        .iter()
        .map(|&k| {
            let (i, prefix) = if k == DeviceKind::Cpu { (0, "cpu") } else { (1, "cuda") };
            counts[i] += 1;
            Device { kind: k, name: format!("{prefix}:{}", counts[i] - 1) }
        })
        .collect();
    let entry = EntryPoint {
        bounded: Vec::new(),
        bounded_rows: Vec::new(),
        extents: Vec::new(),
        device_arenas: size[1..].iter().map(|&s| round_up(s).max(ALIGN)).collect(),
        // (Each part's commands run every call, its prologue's included.)
        prologue: 0,
        name: "main".into(),
        inputs: graph.inputs.iter().map(|&v| tensor_desc(graph, v)).collect(),
        outputs: graph.outputs.iter().map(|&v| tensor_desc(graph, v)).collect(),
        arena_size: round_up(size[0]).max(ALIGN),
        arena_align: ALIGN,
        commands,
        buffers,
    };
    Ok(Program {
        devices,
        entries: vec![entry],
        kernels,
        executables,
        constants: Constants::Embedded(pool),
        debug: (!options.strip).then(|| DebugInfo { kernel_sources: sources, source: options.source.clone() }),
    })
}
