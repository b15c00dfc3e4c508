//! The HAL level: one static command list per entry point, device-neutral.
//!
//! Each wave's dispatches become `Dispatch` commands (kernel, workgroup count, one
//! `(slot, offset, length)` binding per kernel input and one for its output; a kernel
//! whose every element is one float constant becomes a `Fill` instead), a
//! `Barrier` separates waves, and outputs that are not written in place (a graph
//! input or constant returned as an output, or one buffer returned twice) are `Copy`
//! commands at the end. Only the executables differ per target.
//!
//! **The instantiation prologue.** The commands of the stream plan's prologue waves come
//! first and their count is the entry's `prologue` (format 1.9): the runtime runs them
//! once per instance.
//!
//! **Conditional commands.** Within a wave, dispatches of one guard (a run-time `If`
//! branch, `kiln_flow::program`) are emitted together, after one `SkipIf` per
//! condition of the guard: "skip the next N commands when this one-byte condition in
//! the arena (or an input) is `value`". The runtime still executes only plan commands:
//! a skip moves its command index forward, never backward, so every plan terminates.

use kiln_flow::program::{BufferId, FlowProgram};
use kiln_module::program::{Binding, BufferDesc, Command, EntryPoint, Slot, TensorDesc};

use crate::stream::{bytes, Placement, StreamPlan, ALIGN};

/// Why a command list could not be built. Every case is a compiler bug: the stream
/// plan or the code generator's output does not fit the flow program.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HalError {
    /// A dispatch binds a buffer the stream plan gave no storage.
    #[error("dispatch {dispatch} (kernel {kernel}) binds buffer %{buffer}, which has no storage")]
    NoStorage {
        /// The dispatch's index.
        dispatch: usize,
        /// Its kernel's name.
        kernel: String,
        /// The buffer.
        buffer: u32,
    },
    /// A graph output that needs a copy has no storage to copy from.
    #[error("output {output} has no storage to copy from")]
    OutputNoStorage {
        /// The output's index.
        output: u32,
    },
    /// A data-dependent extent was not placed in the arena.
    #[error("extent of `{name}` has no arena storage")]
    ExtentNoStorage {
        /// What it counts.
        name: String,
    },
    /// The extent inputs of bounded dimensions are not the last inputs.
    #[error("the extent inputs of bounded input dimensions must be the last inputs")]
    BoundedExtentOrder,
    /// The code generator reported no workgroup count for a dispatch.
    #[error("dispatch {dispatch} (kernel {kernel}) has no workgroup count ({count} kernels compiled)")]
    MissingWorkgroups {
        /// The dispatch's index.
        dispatch: usize,
        /// Its kernel's name.
        kernel: String,
        /// How many counts there are.
        count: usize,
    },
    /// A wave names a dispatch the program does not have.
    #[error("a wave names dispatch {dispatch}, the program has {count}")]
    NoSuchDispatch {
        /// The dispatch's index.
        dispatch: usize,
        /// How many dispatches there are.
        count: usize,
    },
}

/// The binding of buffer `b` (through its alias chain).
pub fn binding(p: &FlowProgram, plan: &StreamPlan, b: BufferId) -> Option<Binding> {
    let mut s = p.storage(b);
    let length = bytes(p, b);
    // A piece of an in-place concatenation: inside its result's storage.
    let mut within = 0;
    let (slot, offset) = loop {
        break match plan.placement.get(s.index()).copied()? {
            Placement::Input(i) => (Slot::Input(i), 0),
            Placement::Output(i) => (Slot::Output(i), 0),
            Placement::Constant(o) => (Slot::Constants, o),
            Placement::Arena(o) => (Slot::Arena, o),
            Placement::Within(c, o) if p.storage(c) != s => {
                within += o;
                s = p.storage(c);
                continue;
            }
            Placement::Within(..) | Placement::None => return None,
        };
    };
    Some(Binding { slot, offset: offset + within, length })
}

/// The fill pattern of a kernel whose every element is one float constant, with
/// storage of the constant's own width: `(bits, bytes)`.
fn constant_fill(k: &kiln_flow::Kernel) -> Option<(u64, u8)> {
    let node = k.node(k.root);
    let kiln_flow::Expr::Const(bits) = node.expr else { return None };
    match (node.ty, k.output.dtype) {
        (kiln_flow::ScalarType::F32, kiln_ir::DType::F32) => Some((bits & 0xFFFF_FFFF, 4)),
        (kiln_flow::ScalarType::F64, kiln_ir::DType::F64) => Some((bits, 8)),
        // Half storage (`--precision`): the constant rounded as the store would.
        (kiln_flow::ScalarType::F32, d @ (kiln_ir::DType::F16 | kiln_ir::DType::BF16)) => {
            let x = f32::from_bits(bits as u32) as f64;
            let t = kiln_ir::Tensor::from_f64(d, kiln_ir::Shape::new(Vec::new()).ok()?, &[x]).ok()?;
            let b = t.bytes();
            Some((u64::from(u16::from_le_bytes([*b.first()?, *b.get(1)?])), 2))
        }
        _ => None,
    }
}

/// A tensor of the signature.
pub fn tensor_desc(p: &FlowProgram, b: BufferId) -> TensorDesc {
    let buf = p.buffer(b);
    TensorDesc {
        name: buf.name.clone(),
        dtype: buf.ty.dtype.onnx_code().unwrap_or(0) as u32,
        dims: buf.ty.shape.dims().iter().map(|&d| d as u64).collect(),
        bytes: bytes(p, b),
    }
}

/// The "main" entry point of `p` under `plan`; `workgroups[d]` is dispatch `d`'s count,
/// `work_ns[d]` its estimated single-thread time (0: none), and dispatch `d` runs kernel
/// `d` of the kernel table.
pub fn entry_point(
    p: &FlowProgram,
    plan: &StreamPlan,
    workgroups: &[u64],
    work_ns: &[u64],
) -> Result<EntryPoint, HalError> {
    let mut commands = Vec::new();
    let mut first_cmd = vec![u32::MAX; p.buffers.len()];
    let mut last_cmd = vec![0u32; p.buffers.len()];
    // The commands of the prologue's waves (the stream plan's instantiation prologue).
    let mut prologue = 0;
    for (wi, wave) in plan.waves.iter().enumerate() {
        if wi == plan.prologue {
            prologue = commands.len();
        }
        if wi > 0 {
            commands.push(Command::Barrier);
        }
        for &d in wave {
            if d >= p.dispatches.len() {
                return Err(HalError::NoSuchDispatch { dispatch: d, count: p.dispatches.len() });
            }
        }
        // The wave's dispatches grouped by guard (unguarded first): each group is one
        // run of commands behind its conditions.
        let mut order = wave.clone();
        order.sort_by(|&a, &b| p.dispatches[a].guard.cmp(&p.dispatches[b].guard));
        let mut i = 0;
        while i < order.len() {
            let guard = &p.dispatches[order[i]].guard;
            let mut j = i;
            while j < order.len() && p.dispatches[order[j]].guard == *guard {
                j += 1;
            }
            let base = commands.len() + guard.len();
            let mut group: Vec<Command> = Vec::new();
            for &d in &order[i..j] {
                let disp = &p.dispatches[d];
                let at = (base + group.len()) as u32;
                let mut bindings = Vec::with_capacity(disp.operands.len() + 1);
                for &o in disp.operands.iter().chain(std::iter::once(&disp.result)) {
                    let b = binding(p, plan, o).ok_or_else(|| HalError::NoStorage {
                        dispatch: d,
                        kernel: disp.kernel.name.clone(),
                        buffer: o.0,
                    })?;
                    let s = p.storage(o).index();
                    first_cmd[s] = first_cmd[s].min(at);
                    last_cmd[s] = last_cmd[s].max(at);
                    bindings.push(b);
                }
                let wg = workgroups.get(d).copied().ok_or_else(|| HalError::MissingWorkgroups {
                    dispatch: d,
                    kernel: disp.kernel.name.clone(),
                    count: workgroups.len(),
                })?;
                if p.buffer(disp.result).ty.shape.numel() == 0 {
                    continue;
                }
                if let (Some((pattern, pattern_len)), Some(&dst)) = (constant_fill(&disp.kernel), bindings.last()) {
                    // Every element the same constant (a ConstantOfShape too large to fold):
                    // a fill, not a kernel. (Its output binding is the dispatch's last,
                    // always present: the loop above pushed it.)
                    group.push(Command::Fill { dst, pattern, pattern_len });
                    continue;
                }
                group.push(Command::Dispatch {
                    kernel: d as u32,
                    device: 0,
                    workgroups: wg,
                    bindings,
                    push_constants: Vec::new(),
                    work_ns: work_ns.get(d).copied().unwrap_or(0),
                });
            }
            if !group.is_empty() {
                for (k, &(c, truth)) in guard.iter().enumerate() {
                    let cond = binding(p, plan, c).ok_or(HalError::NoStorage {
                        dispatch: order[i],
                        kernel: p.dispatches[order[i]].kernel.name.clone(),
                        buffer: c.0,
                    })?;
                    let at = commands.len() as u32;
                    let s = p.storage(c).index();
                    first_cmd[s] = first_cmd[s].min(at);
                    last_cmd[s] = last_cmd[s].max(at);
                    let count = (guard.len() - k - 1 + group.len()) as u32;
                    commands.push(Command::SkipIf { cond, value: !truth, count });
                }
                commands.extend(group);
            }
            i = j;
        }
    }
    if plan.prologue > 0 && plan.prologue == plan.waves.len() {
        prologue = commands.len();
    }
    if !plan.output_copies.is_empty() && !commands.is_empty() {
        commands.push(Command::Barrier);
    }
    for &(s, k) in &plan.output_copies {
        let src = binding(p, plan, s).ok_or(HalError::OutputNoStorage { output: k })?;
        let len = bytes(p, p.outputs[k as usize]);
        if len == 0 {
            continue;
        }
        let at = commands.len() as u32;
        first_cmd[s.index()] = first_cmd[s.index()].min(at);
        last_cmd[s.index()] = at;
        commands.push(Command::Copy {
            src: Binding { length: len, ..src },
            dst: Binding { slot: Slot::Output(k), offset: 0, length: len },
        });
    }
    let mut buffers = Vec::new();
    for (i, b) in p.buffers.iter().enumerate() {
        let id = BufferId(i as u32);
        if p.storage(id) != id || first_cmd[i] == u32::MAX {
            continue;
        }
        if let Some(binding) = binding(p, plan, id) {
            buffers.push(BufferDesc { name: b.name.clone(), binding, first: first_cmd[i], last: last_cmd[i] });
        }
    }
    // Bounded input dimensions (kiln_ir::bounded): each input and its extent input get
    // a place after the planned arena, which the runtime fills before the commands run;
    // every binding of those inputs moves there.
    let mut arena_size = plan.arena_size;
    let mut bounded = Vec::new();
    let mut moved: Vec<(u32, u64)> = Vec::new();
    let mut hidden = Vec::new();
    for x in &p.extents {
        let Some(ie) = &x.input else { continue };
        let (Some(&ib), Some(_)) = (p.inputs.get(ie.input), p.inputs.get(ie.extent_input)) else {
            return Err(HalError::ExtentNoStorage { name: x.name.clone() });
        };
        let len = bytes(p, ib);
        let staging = arena_size.div_ceil(ALIGN) * ALIGN;
        let at = (staging + len).div_ceil(ALIGN) * ALIGN;
        arena_size = at + 8;
        moved.push((ie.input as u32, staging));
        moved.push((ie.extent_input as u32, at));
        hidden.push(ie.extent_input);
        bounded.push(kiln_module::program::BoundedDesc {
            input: ie.input as u32,
            axis: ie.axis as u32,
            min: ie.min,
            bound: x.bound,
            staging: Binding { slot: Slot::Arena, offset: staging, length: len },
            extent: Binding { slot: Slot::Arena, offset: at, length: 8 },
        });
    }
    // The extent inputs are the last inputs; the caller never passes them.
    hidden.sort_unstable();
    if hidden.iter().enumerate().any(|(k, &i)| i != p.inputs.len() - hidden.len() + k) {
        return Err(HalError::BoundedExtentOrder);
    }
    if !moved.is_empty() {
        let mv = |b: &mut Binding| {
            if let Slot::Input(i) = b.slot {
                if let Some(&(_, off)) = moved.iter().find(|&&(j, _)| j == i) {
                    *b = Binding { slot: Slot::Arena, offset: off + b.offset, length: b.length };
                }
            }
        };
        for c in &mut commands {
            match c {
                Command::Dispatch { bindings, .. } => bindings.iter_mut().for_each(mv),
                Command::Copy { src, dst } => {
                    mv(src);
                    mv(dst);
                }
                Command::Fill { dst, .. } => mv(dst),
                Command::SkipIf { cond, .. } => mv(cond),
                Command::AllReduce { parts, .. } | Command::AllGather { parts, .. } => {
                    for part in parts {
                        mv(&mut part.src);
                        mv(&mut part.dst);
                    }
                }
                Command::Transfer { src, dst, .. } => {
                    mv(src);
                    mv(dst);
                }
                Command::Barrier | Command::Segment { .. } => {}
            }
        }
        buffers.iter_mut().for_each(|b: &mut BufferDesc| mv(&mut b.binding));
    }
    let mut extents = Vec::with_capacity(p.extents.len());
    for x in &p.extents {
        if let Some(ie) = &x.input {
            let Some(b) = bounded.iter().find(|b| b.input == ie.input as u32) else { continue };
            extents.push(kiln_module::program::ExtentDesc {
                name: x.name.clone(),
                binding: b.extent,
                bound: x.bound,
                outputs: x.outputs.clone(),
            });
            continue;
        }
        let b = binding(p, plan, x.buffer)
            .filter(|b| b.slot == Slot::Arena && b.length == 8)
            .ok_or_else(|| HalError::ExtentNoStorage { name: x.name.clone() })?;
        extents.push(kiln_module::program::ExtentDesc {
            name: x.name.clone(),
            binding: b,
            bound: x.bound,
            outputs: x.outputs.clone(),
        });
    }
    Ok(EntryPoint {
        extents,
        bounded,
        bounded_rows: Vec::new(),
        device_arenas: Vec::new(),
        prologue: prologue as u32,
        name: "main".into(),
        inputs: p.inputs[..p.inputs.len() - hidden.len()].iter().map(|&b| tensor_desc(p, b)).collect(),
        outputs: p.outputs.iter().map(|&b| tensor_desc(p, b)).collect(),
        arena_size,
        arena_align: ALIGN,
        commands,
        buffers,
    })
}

/// The dispatches of `entry` (made from `p`) whose workgroups a bounded dimension's
/// extent shortens (format 1.7): each of [`FlowProgram::bounded_rows`] whose kernel's
/// workgroup index has a digit along that axis (`digits`, per dispatch, from the code
/// generator), split around that digit. A dispatch listed along two axes (attention
/// scores: query rows and key columns) takes the first that has a digit. The list is
/// in ascending command order.
pub fn bounded_rows(
    p: &FlowProgram,
    entry: &EntryPoint,
    digits: &[Vec<kiln_codegen::cpu::WorkDigit>],
) -> Vec<kiln_module::program::BoundedRows> {
    let mut out: Vec<kiln_module::program::BoundedRows> = Vec::new();
    for r in p.bounded_rows() {
        let Some(x) = p.extents.get(r.extent) else { continue };
        // The entry lists the bounded inputs' extents in the program's order.
        let dim = p.extents[..r.extent].iter().filter(|x| x.input.is_some()).count() as u32;
        let Some(command) = entry
            .commands
            .iter()
            .position(|c| matches!(c, Command::Dispatch { kernel, .. } if *kernel as usize == r.dispatch))
        else {
            continue;
        };
        let Some(Command::Dispatch { workgroups, .. }) = entry.commands.get(command) else { continue };
        let Some(ds) = digits.get(r.dispatch) else { continue };
        let Some(j) = ds.iter().position(|d| d.axis.is_some_and(|(a, _)| a == r.axis)) else { continue };
        let unit = ds[j].axis.map_or(1, |(_, u)| u.max(1));
        let outer: u64 = ds[..j].iter().map(|d| d.count).product();
        let inner: u64 = ds[j + 1..].iter().map(|d| d.count).product();
        let span = ds[j].count;
        if span != x.bound.div_ceil(unit)
            || outer * span * inner != *workgroups
            || out.iter().any(|o| o.command as usize == command)
        {
            continue;
        }
        out.push(kiln_module::program::BoundedRows { command: command as u32, dim, outer, span, unit, inner });
    }
    // In command order, as the format asks (the runtime finds a command's entry by
    // binary search).
    out.sort_by_key(|r| r.command);
    out
}
