//! One plan over several devices (`kiln compile --devices N`): the graph after the
//! tensor passes is sharded by [`kiln_shard`] into per-device segments cut at the
//! collectives; every segment runs through the usual pipeline ([`crate::compile`],
//! tensor passes already done) and the segments' programs are linked here into one
//! [`Program`]:
//!
//! ```text
//! device table   N devices ("cpu:0" … "cpu:N-1"); every dispatch names its device
//! kernels        every segment's kernels and executables, renamed d<d>.s<stage>.<name>
//! constants      every segment's pool, one after the other (64-byte aligned)
//! arena          [exchange buffers][stage region]: exchanges are the buffers that cross a
//!                stage (segment outputs, collective sources and destinations); the
//!                stage region holds, side by side, each device's arena of the stage
//!                running now (stages run one after the other, so they share it)
//! commands       per stage: wave w of every device's segment together (their buffers
//!                are disjoint, so the local-task driver runs them at once), a barrier
//!                between waves; then the stage's collectives between barriers; at the
//!                end, copies of device 0's results into the outputs
//! ```
//!
//! A segment's inputs and outputs (the caller's memory when it is compiled alone)
//! become the model's inputs or exchange buffers in the arena.

use kiln_module::program::{
    Binding, CollectivePart, Command, Constants, DebugInfo, Device, DeviceKind, EntryPoint, Program, Slot,
};
use kiln_shard::CollectiveKind;
pub use kiln_shard::{
    print as print_sharded, Collective, CollectiveKind as Kind, Layout, Segment, ShardError, Sharded, MAX_DEVICES,
};

use crate::{Compilation, CompileError, Compiled, Input, Options, Stage, TargetDevice};

/// Alignment of every region the linker lays out.
use crate::link::{gather_kernels, linked_binding, port_place, relocate, round_up, tensor_desc, Linked, ALIGN};

/// A compile over several devices: its `cut` is how the graph was sharded.
pub type ShardedCompiled = Linked<Sharded>;

/// Compiles `input` into one plan over `devices` devices of `options.device`'s kind.
/// One device is the usual compile (the plan has one device and no collectives).
pub fn compile(input: Input, options: &Options, devices: u32) -> Result<ShardedCompiled, CompileError> {
    if options.device == TargetDevice::Cuda && devices > 1 {
        return Err(CompileError::MultiGpu { devices });
    }
    let mut c = Compilation::new(input, options.clone());
    c.run_to(Stage::TensorPasses)?;
    let graph = c.graph().ok_or(CompileError::Pipeline { stage: Stage::TensorPasses, missing: "tensor graph" })?;
    // Data-dependent extents (kiln_ir::dynamic) are not carried across devices.
    if devices > 1 && (kiln_ir::dynamic::has_sources(graph) || !graph.bounded.is_empty()) {
        return Err(CompileError::DynamicSharded { devices });
    }
    let sharded = kiln_shard::shard(graph, devices)?;
    // The segments are graphs after the tensor passes already: run none again.
    let seg_opts = Options { passes: Some(Vec::new()), external_weights: None, strip: false, ..options.clone() };
    let mut segments = Vec::with_capacity(sharded.segments.len());
    for s in &sharded.segments {
        segments.push(crate::compile(&s.graph, &seg_opts)?);
    }
    let program = link(graph, &sharded, &segments, options)?;
    Ok(Linked::write(program, options, sharded, segments))
}

/// Where each segment's arena, constants and kernels land in the linked program.
struct Placed {
    arena: u64,
    constants: u64,
}

fn link(graph: &kiln_ir::Graph, sh: &Sharded, segs: &[Compiled], options: &Options) -> Result<Program, CompileError> {
    let bad = |why: String| CompileError::Link(why);
    // Exchange buffers first.
    let mut ex_off = Vec::with_capacity(sh.exchanges.len());
    let mut at = 0u64;
    for e in &sh.exchanges {
        ex_off.push(at);
        at = round_up(at + e.ty.storage_bytes() as u64);
    }
    let stage_base = at;
    // Per stage, the devices' arenas side by side.
    let mut placed = Vec::with_capacity(segs.len());
    let mut stage_size = vec![0u64; sh.stages()];
    let mut pool: Vec<u8> = Vec::new();
    for (s, c) in sh.segments.iter().zip(segs) {
        let entry = c.program.entries.first().ok_or_else(|| bad(format!("segment {} has no entry", s.graph.name)))?;
        if entry.inputs.len() != s.inputs.len() || entry.outputs.len() != s.outputs.len() {
            return Err(bad(format!(
                "segment {} has {} inputs and {} outputs, its program {} and {}",
                s.graph.name,
                s.inputs.len(),
                s.outputs.len(),
                entry.inputs.len(),
                entry.outputs.len()
            )));
        }
        let arena = stage_base + stage_size[s.stage];
        stage_size[s.stage] += round_up(entry.arena_size);
        let constants = round_up(pool.len() as u64);
        pool.resize(constants as usize, 0);
        match &c.program.constants {
            Constants::Embedded(b) => pool.extend_from_slice(b),
            Constants::External { .. } => return Err(bad("a segment kept its constants outside".into())),
        }
        placed.push(Placed { arena, constants });
    }
    let arena_size = stage_base + stage_size.iter().copied().max().unwrap_or(0);
    // Kernels and executables.
    let crate::link::Kernels { kernels, executables, base: kernel_base, sources } =
        gather_kernels(sh.segments.iter().map(|s| (s.device, s.stage)).zip(segs));
    let remap = |si: usize, b: &Binding| -> Binding {
        let p = &placed[si];
        linked_binding(&sh.segments[si], b, (p.arena, p.constants), &ex_off, |port| port_place(port, &ex_off))
    };
    let mut commands: Vec<Command> = Vec::new();
    let barrier = |cmds: &mut Vec<Command>| {
        if cmds.last().is_some_and(|c| !matches!(c, Command::Barrier)) {
            cmds.push(Command::Barrier);
        }
    };
    let mut cmd_map: Vec<Vec<u32>> = segs.iter().map(|c| vec![0; c.program.entries[0].commands.len()]).collect();
    for stage in 0..sh.stages() {
        // Each segment of the stage, cut into waves at its barriers.
        let mut waves: Vec<(usize, Vec<Vec<usize>>)> = Vec::new();
        for (si, s) in sh.segments.iter().enumerate().filter(|(_, s)| s.stage == stage) {
            let mut w: Vec<Vec<usize>> = vec![Vec::new()];
            for (ci, c) in segs[si].program.entries[0].commands.iter().enumerate() {
                if matches!(c, Command::Barrier) {
                    w.push(Vec::new());
                } else if let Some(last) = w.last_mut() {
                    last.push(ci);
                }
            }
            let _ = s;
            waves.push((si, w));
        }
        let depth = waves.iter().map(|(_, w)| w.len()).max().unwrap_or(0);
        for wi in 0..depth {
            barrier(&mut commands);
            for (si, w) in &waves {
                let device = sh.segments[*si].device;
                for &ci in w.get(wi).map(Vec::as_slice).unwrap_or(&[]) {
                    let c = &segs[*si].program.entries[0].commands[ci];
                    cmd_map[*si][ci] = commands.len() as u32;
                    commands.push(match c {
                        Command::Barrier => return Err(bad("a segment's wave holds a barrier".into())),
                        c => relocate(c, kernel_base[*si], device, |b| remap(*si, b))?,
                    });
                }
            }
        }
        for col in sh.collectives.iter().filter(|c| c.after_stage == stage) {
            barrier(&mut commands);
            let parts: Vec<CollectivePart> = col
                .src
                .iter()
                .zip(&col.dst)
                .map(|(&s, &d)| {
                    let ex = |e: usize| Binding {
                        slot: Slot::Arena,
                        offset: ex_off[e],
                        length: sh.exchanges[e].ty.storage_bytes() as u64,
                    };
                    CollectivePart { device: sh.exchanges[s].device, src: ex(s), dst: ex(d) }
                })
                .collect();
            commands.push(match col.kind {
                CollectiveKind::AllReduce => Command::AllReduce { dtype: 1, parts },
                CollectiveKind::AllGather { axis } => {
                    let full = &sh.exchanges[col.dst[0]].ty;
                    let outer = full.shape.dims()[..axis].iter().product::<usize>() as u64;
                    Command::AllGather { outer, parts }
                }
            });
        }
    }
    // Device 0's results into the outputs.
    barrier(&mut commands);
    for (k, &e) in sh.outputs.iter().enumerate() {
        let len = sh.exchanges[e].ty.storage_bytes() as u64;
        if len == 0 {
            continue;
        }
        commands.push(Command::Copy {
            src: Binding { slot: Slot::Arena, offset: ex_off[e], length: len },
            dst: Binding { slot: Slot::Output(k as u32), offset: 0, length: len },
        });
    }
    if matches!(commands.last(), Some(Command::Barrier)) {
        commands.pop();
    }
    // The memory map: every segment's buffers (named by device), then the exchanges.
    let last = commands.len().saturating_sub(1) as u32;
    let buffers = crate::link::memory_map(
        &sh.segments,
        segs,
        &cmd_map,
        last,
        remap,
        (&sh.exchanges, &ex_off),
        |x| x.name.clone(),
        options.strip,
    );
    let kind = match options.device {
        TargetDevice::Cpu => DeviceKind::Cpu,
        TargetDevice::Cuda => DeviceKind::Cuda,
    };
    let prefix = if kind == DeviceKind::Cuda { "cuda" } else { "cpu" };
    let entry = EntryPoint {
        bounded: Vec::new(),
        bounded_rows: Vec::new(),
        device_arenas: Vec::new(),
        extents: Vec::new(),
        // (Each part's commands run every call, its prologue's included.)
        prologue: 0,
        name: "main".into(),
        inputs: graph.inputs.iter().map(|&v| tensor_desc(graph, v)).collect(),
        outputs: graph.outputs.iter().map(|&v| tensor_desc(graph, v)).collect(),
        arena_size: round_up(arena_size),
        arena_align: ALIGN,
        commands,
        buffers,
    };
    Ok(Program {
        devices: (0..sh.devices).map(|d| Device { kind, name: format!("{prefix}:{d}") }).collect(),
        entries: vec![entry],
        kernels,
        executables,
        constants: Constants::Embedded(pool),
        debug: (!options.strip).then(|| DebugInfo { kernel_sources: sources, source: options.source.clone() }),
    })
}
