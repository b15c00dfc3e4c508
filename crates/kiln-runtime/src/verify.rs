//! The load-time verifier: every index, range and length the driver will use is checked
//! here once, so that `invoke` can walk the plan without checks.
//!
//! [`verify_program`] checks what holds for every device: a dispatch's kernel has a
//! variant for its device's kind, and a CUDA executable has one launch record per entry
//! within the device's limits whose parameter count equals the bindings of every
//! dispatch that runs it; and every variant's condition (format 1.5) is well formed for
//! its executable (`condition`: known CPU feature bits on CPU code, a real compute
//! capability on CUDA code). Which devices a runtime drives is checked by that runtime
//! ([`require_device_kind`]): the CPU runtime refuses a CUDA artifact at bind, the
//! CUDA runtime a CPU one, while [`crate::Module::verify_plan`] accepts both.

use crate::error::{BindingProblem, BindingRole, CommandProblem, ConditionProblem, RuntimeError, VerifyError};
use crate::MAX_ARENA_ALIGN;

/// The most bounded input dimensions an entry may have (format 1.6).
pub(crate) const MAX_BOUNDED: usize = 8;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use kiln_module::program::{Binding, Command, Condition, CpuArch, CpuFeature, DeviceKind, RelocKind, Slot, Variant};

/// Most dynamic shared memory a CUDA block may ask for: 227 KiB, Hopper's per-block
/// opt-in limit (`cudaDevAttrMaxSharedMemoryPerBlockOptin` on sm_90).
pub const MAX_CUDA_SHARED: u32 = 227 * 1024;
use kiln_module::sections::{EntryView, ProgramView};

/// Sizes an instance needs, the largest over all entry points.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Arena bytes.
    pub arena_size: u64,
    /// Arena alignment.
    pub arena_align: u64,
    /// Most bindings of one dispatch.
    pub max_bindings: usize,
    /// Most inputs of one entry point.
    pub max_inputs: usize,
    /// Most outputs of one entry point.
    pub max_outputs: usize,
    /// Largest output rank.
    pub max_rank: usize,
}

/// The arena bytes of device `device` in entry `e` (device 0's is the entry's arena;
/// another's from the device arenas of a heterogeneous plan, 0 where it has none).
fn arena_of(e: &EntryView<'_>, device: u32) -> u64 {
    match device {
        0 => e.arena_size,
        d => e.device_arenas.get(d as usize - 1).copied().unwrap_or(0),
    }
}

fn binding(e: &EntryView<'_>, pool_len: u64, b: &Binding, writes: bool) -> Result<(), BindingProblem> {
    binding_on(e, 0, pool_len, b, writes)
}

/// [`binding`] in the memory of `device`: its arena for an arena binding.
fn binding_on(e: &EntryView<'_>, device: u32, pool_len: u64, b: &Binding, writes: bool) -> Result<(), BindingProblem> {
    let size = match b.slot {
        Slot::Arena => arena_of(e, device),
        Slot::Constants => pool_len,
        Slot::Input(i) => {
            let t =
                e.inputs.get(i as usize).ok_or(BindingProblem::NoSuchSlot { slot: b.slot, count: e.inputs.len() })?;
            t.bytes
        }
        Slot::Output(i) => {
            let t =
                e.outputs.get(i as usize).ok_or(BindingProblem::NoSuchSlot { slot: b.slot, count: e.outputs.len() })?;
            t.bytes
        }
    };
    if b.offset.checked_add(b.length).is_none_or(|end| end > size) {
        return Err(BindingProblem::OutOfRange { slot: b.slot, offset: b.offset, length: b.length, size });
    }
    if writes && matches!(b.slot, Slot::Input(_) | Slot::Constants) {
        return Err(BindingProblem::ReadOnly { slot: b.slot });
    }
    Ok(())
}

/// Checks command `c` of `e`, run by `device` (0 outside a heterogeneous plan): its
/// arena bindings name that device's arena, and a device other than the host names no
/// input or output.
fn command(
    p: &ProgramView<'_>,
    e: &EntryView<'_>,
    pool_len: u64,
    c: &Command,
    device: u32,
) -> Result<(), CommandProblem> {
    let bind_on = |on: u32, role: BindingRole, b: &Binding, writes: bool| -> Result<(), CommandProblem> {
        if on != 0 && matches!(b.slot, Slot::Input(_) | Slot::Output(_)) {
            return Err(CommandProblem::HostSlot { device: on, slot: b.slot });
        }
        binding_on(e, on, pool_len, b, writes).map_err(|problem| CommandProblem::Binding { role, problem })
    };
    let bind = |role: BindingRole, b: &Binding, writes: bool| bind_on(device, role, b, writes);
    match c {
        Command::Dispatch { kernel, device, workgroups: _, bindings, push_constants, work_ns: _ } => {
            if *kernel as usize >= p.kernels.len() {
                return Err(CommandProblem::KernelIndex { kernel: *kernel, count: p.kernels.len() });
            }
            let d = p
                .devices
                .get(*device as usize)
                .ok_or(CommandProblem::DeviceIndex { device: *device, count: p.devices.len() })?;
            // The kernel exists (checked above); its variants' indices are checked with
            // the kernel table, so look them up without trusting them.
            let k = &p.kernels[*kernel as usize];
            // A kernel without variants, or with one naming no executable, is reported by
            // the kernel table's checks.
            let mut any = k.variants.is_empty();
            for (vi, v) in k.variants.iter().enumerate() {
                let Some(x) = p.executables.get(v.executable as usize) else {
                    any = true;
                    continue;
                };
                if x.device != d.kind {
                    continue;
                }
                any = true;
                if let Some(l) = x.launches.get(v.entry as usize) {
                    if x.device == DeviceKind::Cuda && l.params as usize != bindings.len() {
                        return Err(CommandProblem::LaunchParams {
                            kernel: *kernel,
                            variant: vi,
                            params: l.params,
                            bindings: bindings.len(),
                        });
                    }
                }
            }
            if !any {
                return Err(CommandProblem::NoVariantForDevice { kernel: *kernel, kind: d.kind });
            }
            if !push_constants.is_empty() {
                return Err(CommandProblem::PushConstants { count: push_constants.len() });
            }
            // Bindings are the kernel's inputs, then its output: only the last is written.
            for (i, b) in bindings.iter().enumerate() {
                bind(BindingRole::Dispatch(i), b, i + 1 == bindings.len())?;
            }
        }
        Command::Barrier => {}
        Command::Copy { src, dst } => {
            bind(BindingRole::CopySource, src, false)?;
            bind(BindingRole::CopyDestination, dst, true)?;
            if src.length != dst.length {
                return Err(CommandProblem::CopyLengths { src: src.length, dst: dst.length });
            }
        }
        Command::Fill { dst, pattern: _, pattern_len } => {
            if !matches!(pattern_len, 1 | 2 | 4 | 8) {
                return Err(CommandProblem::FillPatternLen { len: *pattern_len });
            }
            bind(BindingRole::FillDestination, dst, true)?;
        }
        Command::AllReduce { dtype, parts } => {
            if *dtype != F32 {
                return Err(collective(alloc::format!("all-reduce of dtype {dtype} (only f32, 1, is reduced)")));
            }
            collective_parts(p, parts, &bind)?;
            let len = parts[0].src.length;
            if !len.is_multiple_of(4) || parts.iter().any(|x| x.src.length != len || x.dst.length != len) {
                return Err(collective("all-reduce ranges of different lengths or not whole f32 elements".into()));
            }
        }
        Command::AllGather { outer, parts } => {
            collective_parts(p, parts, &bind)?;
            let src = parts[0].src.length;
            let n = parts.len() as u64;
            let ok = *outer > 0
                && src.is_multiple_of(*outer)
                && parts.iter().all(|x| x.src.length == src && Some(x.dst.length) == src.checked_mul(n));
            if !ok {
                return Err(collective(alloc::format!(
                    "all-gather of {n} parts in {outer} blocks: every source must be {src} bytes, a whole number \
                     of blocks, and every destination {n} times that"
                )));
            }
        }
        Command::SkipIf { cond, value: _, count: _ } => {
            if cond.length == 0 || cond.length > kiln_module::program::MAX_CONDITION_BYTES {
                return Err(CommandProblem::ConditionBytes { length: cond.length });
            }
            bind(BindingRole::Condition, cond, false)?;
        }
        // Where they may stand is `segments`'s to check.
        Command::Segment { .. } => {}
        Command::Transfer { src_device, src, dst_device, dst } => {
            for d in [src_device, dst_device] {
                if *d as usize >= p.devices.len() {
                    return Err(CommandProblem::DeviceIndex { device: *d, count: p.devices.len() });
                }
            }
            if src_device == dst_device || (*src_device != device && *dst_device != device) {
                return Err(CommandProblem::Segment {
                    why: format!(
                        "a transfer from device {src_device} to device {dst_device} in a segment of device {device} \
                         (a transfer joins two devices, one of them the segment's)"
                    ),
                });
            }
            bind_on(*src_device, BindingRole::TransferSource, src, false)?;
            bind_on(*dst_device, BindingRole::TransferDestination, dst, true)?;
            if src.length != dst.length {
                return Err(CommandProblem::CopyLengths { src: src.length, dst: dst.length });
            }
        }
    }
    Ok(())
}

/// Whether `e` is a heterogeneous plan (format 1.8): segments, transfers or device arenas.
pub fn is_heterogeneous(e: &EntryView<'_>) -> bool {
    !e.device_arenas.is_empty()
        || e.commands.iter().any(|c| matches!(c, Command::Segment { .. } | Command::Transfer { .. }))
}

/// The device each command of `e` runs on: for a heterogeneous plan its segment's
/// (the `Segment` command itself included), after checking the segment structure;
/// otherwise device 0 for every command. Checked arithmetic throughout: the plan is
/// untrusted.
fn segments(p: &ProgramView<'_>, e: &EntryView<'_>) -> Result<Vec<u32>, VerifyError> {
    if !is_heterogeneous(e) {
        return Ok(alloc::vec![0; e.commands.len()]);
    }
    let arenas = |why: String| VerifyError::DeviceArenas { entry: e.name.to_string(), why };
    if p.devices.first().map(|d| d.kind) != Some(DeviceKind::Cpu) {
        return Err(arenas("device 0 (the host, which holds inputs and outputs) is not a CPU".into()));
    }
    if p.devices.len() > crate::instance::MAX_HETERO_DEVICES {
        return Err(arenas(format!(
            "{} devices (a heterogeneous plan has at most {})",
            p.devices.len(),
            crate::instance::MAX_HETERO_DEVICES
        )));
    }
    if e.device_arenas.len() + 1 != p.devices.len() {
        return Err(arenas(format!(
            "{} sizes for {} devices after the first",
            e.device_arenas.len(),
            p.devices.len() - 1
        )));
    }
    if let Some(a) =
        e.device_arenas.iter().find(|&&a| usize::try_from(a).is_err() || a.checked_add(e.arena_align).is_none())
    {
        return Err(arenas(format!("an arena of {a} bytes")));
    }
    let bad = |command: usize, why: String| VerifyError::Command {
        entry: e.name.to_string(),
        command,
        problem: CommandProblem::Segment { why },
    };
    let mut device_of = Vec::with_capacity(e.commands.len());
    // Per segment (plan order), its device.
    let mut seg_device: Vec<u32> = Vec::new();
    let mut i = 0usize;
    while let Some(c) = e.commands.get(i) {
        let Command::Segment { device, count, waits } = c else {
            return Err(bad(i, "a command outside every segment".into()));
        };
        if *device as usize >= p.devices.len() {
            return Err(VerifyError::Command {
                entry: e.name.to_string(),
                command: i,
                problem: CommandProblem::DeviceIndex { device: *device, count: p.devices.len() },
            });
        }
        let remaining = e.commands.len() - i - 1;
        if *count == 0 || *count as usize > remaining {
            return Err(bad(i, format!("a segment of {count} commands, {remaining} follow it")));
        }
        let me = seg_device.len();
        for &w in waits {
            if w as usize >= me {
                return Err(bad(i, format!("segment {me} waits for segment {w}, not an earlier one")));
            }
        }
        seg_device.push(*device);
        device_of.push(*device);
        // Where the segment's own work starts and ends (its first and last command that
        // is neither a transfer nor a barrier): transfers into the device come before
        // it, transfers out of it after (a GPU queues them around the segment's graph).
        let body = |c: &Command| !matches!(c, Command::Transfer { .. } | Command::Barrier);
        let cmds = &e.commands[i + 1..=i + *count as usize];
        let first_work = cmds.iter().position(body).unwrap_or(cmds.len());
        let last_work = cmds.iter().rposition(body);
        for (k, c) in cmds.iter().enumerate() {
            if let Command::Transfer { src_device, dst_device, .. } = c {
                let inbound = *dst_device == *device && *src_device != *device;
                let misplaced = if inbound { k > first_work } else { last_work.is_some_and(|l| k < l) };
                if misplaced {
                    return Err(bad(
                        i + 1 + k,
                        "a transfer into a segment's device after its work, or out of it before its work ends".into(),
                    ));
                }
            }
        }
        for j in i + 1..=i + *count as usize {
            match &e.commands[j] {
                Command::Segment { .. } => return Err(bad(j, "a segment inside a segment".into())),
                Command::AllReduce { .. } | Command::AllGather { .. } | Command::SkipIf { .. } => {
                    return Err(bad(j, "a collective or a skip in a segment".into()))
                }
                Command::Dispatch { device: d, .. } if d != device => {
                    return Err(bad(j, format!("a dispatch on device {d} in a segment of device {device}")))
                }
                _ => {}
            }
            device_of.push(*device);
        }
        i += *count as usize + 1;
    }
    Ok(device_of)
}

/// The instantiation prologue of `e` (format 1.9): at most the plan's length, none in a
/// heterogeneous plan, and only dispatches, copies, fills and barriers that bind no
/// input or output (the bindings themselves are checked with every command). That what
/// the prologue leaves behind is not overwritten later is the compiler's promise, not a
/// safety property: a plan that broke it would compute wrong values from its own
/// verified ranges, never touch memory outside them.
fn prologue(e: &EntryView<'_>) -> Result<(), VerifyError> {
    let n = e.prologue as usize;
    let bad = |command: Option<usize>, why: String| VerifyError::Prologue {
        entry: e.name.to_string(),
        prologue: e.prologue,
        command,
        why,
    };
    if n > e.commands.len() {
        return Err(bad(None, format!("longer than the plan's {} commands", e.commands.len())));
    }
    if n > 0 && is_heterogeneous(e) {
        return Err(bad(None, "a heterogeneous plan (segments) has no prologue".into()));
    }
    let caller = |b: &Binding| matches!(b.slot, Slot::Input(_) | Slot::Output(_));
    for (i, c) in e.commands[..n].iter().enumerate() {
        let binds_caller = match c {
            Command::Dispatch { bindings, .. } => bindings.iter().any(caller),
            Command::Copy { src, dst } => caller(src) || caller(dst),
            Command::Fill { dst, .. } => caller(dst),
            Command::Barrier => false,
            _ => return Err(bad(Some(i), "only dispatches, copies, fills and barriers run in a prologue".into())),
        };
        if binds_caller {
            return Err(bad(Some(i), "a prologue command binds an input or an output".into()));
        }
    }
    Ok(())
}

/// ONNX's code of f32, the one element type an all-reduce sums.
const F32: u32 = 1;

fn collective(why: String) -> CommandProblem {
    CommandProblem::Collective { why }
}

/// Whether two ranges of one slot share a byte.
fn overlap(a: &Binding, b: &Binding) -> bool {
    a.slot == b.slot && a.length > 0 && b.length > 0 && a.offset < b.offset + b.length && b.offset < a.offset + a.length
}

/// The checks every collective shares: at least two parts, each on a distinct device of
/// the table, every range inside its slot (destinations writable), and no destination
/// overlapping any source or another destination (so a driver may write results while
/// it still reads sources, in any order).
fn collective_parts(
    p: &ProgramView<'_>,
    parts: &[kiln_module::program::CollectivePart],
    bind: &dyn Fn(BindingRole, &Binding, bool) -> Result<(), CommandProblem>,
) -> Result<(), CommandProblem> {
    if parts.len() < 2 {
        return Err(collective(alloc::format!("{} parts (at least two devices take part)", parts.len())));
    }
    for (i, x) in parts.iter().enumerate() {
        if x.device as usize >= p.devices.len() {
            return Err(CommandProblem::DeviceIndex { device: x.device, count: p.devices.len() });
        }
        if parts[..i].iter().any(|y| y.device == x.device) {
            return Err(collective(alloc::format!("device {} takes part twice", x.device)));
        }
        bind(BindingRole::CollectiveSource(i), &x.src, false)?;
        bind(BindingRole::CollectiveDestination(i), &x.dst, true)?;
    }
    for (i, x) in parts.iter().enumerate() {
        for (j, y) in parts.iter().enumerate() {
            if overlap(&x.dst, &y.src) || (i != j && overlap(&x.dst, &y.dst)) {
                return Err(collective(alloc::format!("part {i}'s destination overlaps part {j}'s ranges")));
            }
        }
    }
    Ok(())
}

/// Largest grid a CUDA launch may name (`gridDimX` is at most 2³¹ − 1): the verifier's
/// bound on a variant's own grid and the graph builder's on every kernel node.
pub const CUDA_MAX_GRID: u64 = (1 << 31) - 1;

/// Checks what a variant's condition says against what its executable is: a CPU
/// condition names known features and at least one, on a CPU executable; a CUDA one
/// names a compute capability of major 1 or more, on a CUDA executable, whose variant
/// takes the dispatch's grid (workgroups 0) or a grid of its own that a launch can
/// name (at most [`CUDA_MAX_GRID`] blocks).
fn condition(v: &Variant, device: DeviceKind) -> Result<(), ConditionProblem> {
    let wrong = |condition| Err(ConditionProblem::WrongDevice { condition, executable: device });
    match v.condition {
        Condition::Always => {}
        Condition::CpuFeatures(_) if device != DeviceKind::Cpu => return wrong(DeviceKind::Cpu),
        Condition::CpuFeatures(0) => return Err(ConditionProblem::NoCpuFeatures),
        Condition::CpuFeatures(bits) if bits & !CpuFeature::KNOWN != 0 => {
            return Err(ConditionProblem::UnknownCpuFeatures { bits: bits & !CpuFeature::KNOWN })
        }
        Condition::CpuFeatures(_) => {}
        Condition::Cuda(_) if device != DeviceKind::Cuda => return wrong(DeviceKind::Cuda),
        Condition::Cuda(a) if a.major == 0 => return Err(ConditionProblem::CudaArch { sm: a.sm() }),
        Condition::Cuda(_) => {}
    }
    if device == DeviceKind::Cuda && v.workgroups > CUDA_MAX_GRID {
        return Err(ConditionProblem::CudaWorkgroups { workgroups: v.workgroups });
    }
    Ok(())
}

/// Checks the plan and code tables of `p` whose constant pool holds `pool_len` bytes.
pub fn verify_program(p: &ProgramView<'_>, pool_len: u64) -> Result<Limits, VerifyError> {
    let mut limits = Limits { arena_align: 1, ..Limits::default() };
    for e in &p.entries {
        let entry = || e.name.to_string();
        if !e.arena_align.is_power_of_two() || e.arena_align > MAX_ARENA_ALIGN || usize::try_from(e.arena_size).is_err()
        {
            return Err(VerifyError::Arena { entry: entry(), size: e.arena_size, align: e.arena_align });
        }
        for t in e.inputs.iter().chain(&e.outputs) {
            if crate::dtype::DType::from_code(t.dtype).is_none() {
                return Err(VerifyError::UnknownDtype { entry: entry(), tensor: t.name.to_string(), dtype: t.dtype });
            }
            let expected = crate::dtype::storage_bytes(t.dtype, &t.dims);
            if expected != Some(t.bytes) || usize::try_from(t.bytes).is_err() {
                return Err(VerifyError::TensorBytes {
                    entry: entry(),
                    tensor: t.name.to_string(),
                    recorded: t.bytes,
                    expected,
                });
            }
        }
        let device_of = segments(p, e)?;
        prologue(e)?;
        for (i, c) in e.commands.iter().enumerate() {
            command(p, e, pool_len, c, device_of[i]).map_err(|problem| VerifyError::Command {
                entry: entry(),
                command: i,
                problem,
            })?;
            if let Command::SkipIf { count, .. } = c {
                let remaining = e.commands.len() - i - 1;
                if *count as usize > remaining {
                    return Err(VerifyError::Command {
                        entry: entry(),
                        command: i,
                        problem: CommandProblem::SkipPastEnd { count: *count, remaining },
                    });
                }
            }
            if let Command::Dispatch { bindings, .. } = c {
                limits.max_bindings = limits.max_bindings.max(bindings.len());
            }
        }
        for x in &e.extents {
            let bad = |problem: String| VerifyError::Extent { entry: entry(), extent: x.name.to_string(), problem };
            if x.binding.slot != Slot::Arena || x.binding.length != 8 {
                return Err(bad(format!("its binding {:?} is not 8 bytes of the arena", x.binding)));
            }
            binding(e, pool_len, &x.binding, false).map_err(|p| bad(p.to_string()))?;
            for &(o, axis) in &x.outputs {
                let Some(t) = e.outputs.get(o as usize) else {
                    return Err(bad(format!("it sizes output {o}, of {}", e.outputs.len())));
                };
                if t.dims.get(axis as usize) != Some(&x.bound) {
                    return Err(bad(format!(
                        "output {o} has dims {:?}, not the bound {} along axis {axis}",
                        t.dims, x.bound
                    )));
                }
                if x.outputs.iter().filter(|&&(p, _)| p == o).count() > 1
                    || e.extents.iter().filter(|y| y.outputs.iter().any(|&(p, _)| p == o)).count() > 1
                {
                    return Err(bad(format!("output {o} is sized by more than one extent")));
                }
            }
        }
        if e.bounded.len() > MAX_BOUNDED {
            return Err(VerifyError::Extent {
                entry: entry(),
                extent: String::new(),
                problem: format!("{} bounded input dimensions, more than {MAX_BOUNDED}", e.bounded.len()),
            });
        }
        for (k, b) in e.bounded.iter().enumerate() {
            let name =
                e.inputs.get(b.input as usize).map_or_else(|| format!("input {}", b.input), |t| t.name.to_string());
            let bad = |problem: String| VerifyError::Extent { entry: entry(), extent: name.clone(), problem };
            let Some(t) = e.inputs.get(b.input as usize) else {
                return Err(bad(format!("a bounded dimension names input {}, of {}", b.input, e.inputs.len())));
            };
            if e.bounded[..k].iter().any(|o| o.input == b.input) {
                return Err(bad("the input has more than one bounded dimension".into()));
            }
            if t.dims.get(b.axis as usize) != Some(&b.bound) || b.min > b.bound {
                return Err(bad(format!(
                    "dims {:?} do not have the bound {} along axis {} (smallest extent {})",
                    t.dims, b.bound, b.axis, b.min
                )));
            }
            let numel: u64 = t.dims.iter().product();
            if numel == 0 || t.bytes % numel != 0 {
                return Err(bad("a bounded input needs whole bytes per element and no empty axis".into()));
            }
            if b.staging.slot != Slot::Arena || b.staging.length != t.bytes {
                return Err(bad(format!("its staging binding {:?} is not {} bytes of the arena", b.staging, t.bytes)));
            }
            if b.extent.slot != Slot::Arena || b.extent.length != 8 {
                return Err(bad(format!("its extent binding {:?} is not 8 bytes of the arena", b.extent)));
            }
            binding(e, pool_len, &b.staging, false).map_err(|p| bad(p.to_string()))?;
            binding(e, pool_len, &b.extent, false).map_err(|p| bad(p.to_string()))?;
            let overlaps = |x: &Binding, y: &Binding| x.offset < y.offset + y.length && y.offset < x.offset + x.length;
            if overlaps(&b.staging, &b.extent)
                || e.bounded[..k].iter().any(|o| {
                    overlaps(&o.staging, &b.staging)
                        || overlaps(&o.extent, &b.staging)
                        || overlaps(&o.staging, &b.extent)
                        || overlaps(&o.extent, &b.extent)
                })
            {
                return Err(bad("its staging and extent bindings overlap another's".into()));
            }
        }
        for (k, r) in e.bounded_rows.iter().enumerate() {
            let bad = |problem: String| VerifyError::Extent {
                entry: entry(),
                extent: alloc::format!("rows of command {}", r.command),
                problem,
            };
            let Some(b) = e.bounded.get(r.dim as usize) else {
                return Err(bad(format!("names bounded dimension {}, of {}", r.dim, e.bounded.len())));
            };
            let Some(Command::Dispatch { workgroups, .. }) = e.commands.get(r.command as usize) else {
                return Err(bad("the command is not a dispatch".into()));
            };
            // Ascending command order, each dispatch once (the runtime binary-searches).
            if k > 0 && e.bounded_rows[k - 1].command >= r.command {
                let prev = e.bounded_rows[k - 1].command;
                return Err(bad(if prev == r.command {
                    "the dispatch is listed twice".into()
                } else {
                    format!("listed after command {prev}: the list is not in ascending command order")
                }));
            }
            let total = r.outer.checked_mul(r.span).and_then(|x| x.checked_mul(r.inner));
            if r.unit == 0 || r.span != b.bound.div_ceil(r.unit) || total != Some(*workgroups) {
                return Err(bad(format!(
                    "{} × {} × {} workgroups of {} positions do not split {workgroups} workgroups over the bound {}",
                    r.outer, r.span, r.inner, r.unit, b.bound
                )));
            }
        }
        let devices = if is_heterogeneous(e) { p.devices.len() as u32 } else { 1 };
        for b in &e.buffers {
            // (A heterogeneous plan's memory map lists every device's buffers: each must
            // lie in some device's memory; the commands carry the ranges that count.)
            if (1..devices).any(|d| binding_on(e, d, pool_len, &b.binding, false).is_ok()) {
                continue;
            }
            binding(e, pool_len, &b.binding, false).map_err(|problem| VerifyError::Buffer {
                entry: entry(),
                buffer: b.name.to_string(),
                problem,
            })?;
        }
        limits.arena_size = limits.arena_size.max(e.arena_size);
        limits.arena_align = limits.arena_align.max(e.arena_align);
        limits.max_inputs = limits.max_inputs.max(e.inputs.len());
        limits.max_outputs = limits.max_outputs.max(e.outputs.len());
        limits.max_rank = limits.max_rank.max(e.outputs.iter().map(|t| t.dims.len()).max().unwrap_or(0));
    }
    for k in &p.kernels {
        if k.variants.is_empty() {
            return Err(VerifyError::NoVariants { kernel: k.name.to_string() });
        }
        for (i, v) in k.variants.iter().enumerate() {
            let x = p.executables.get(v.executable as usize).filter(|x| (v.entry as usize) < x.entries.len());
            let Some(x) = x else {
                return Err(VerifyError::Variant {
                    kernel: k.name.to_string(),
                    variant: i,
                    executable: v.executable,
                    entry: v.entry,
                });
            };
            condition(v, x.device).map_err(|problem| VerifyError::Condition {
                kernel: k.name.to_string(),
                variant: i,
                problem,
            })?;
        }
    }
    for (xi, x) in p.executables.iter().enumerate() {
        let expected = match x.device {
            DeviceKind::Cpu => 0,
            DeviceKind::Cuda => x.entries.len(),
        };
        if x.launches.len() != expected {
            return Err(VerifyError::Launches { executable: xi, launches: x.launches.len(), expected });
        }
        for (entry, l) in x.launches.iter().enumerate() {
            if !(32..=1024).contains(&l.block) || !l.block.is_multiple_of(32) || l.shared > MAX_CUDA_SHARED {
                return Err(VerifyError::Launch { executable: xi, entry, block: l.block, shared: l.shared });
            }
        }
        let code_len = x.code.len() as u64;
        for (name, offset) in &x.entries {
            if *offset >= code_len {
                return Err(VerifyError::Symbol { executable: xi, name: name.to_string(), offset: *offset, code_len });
            }
        }
        // A CPU executable's architecture is the one its features mark (none: x86-64, as
        // in files written before the other architectures).
        // (A CUDA executable's features are not CPU features.)
        let arch = match (x.device, CpuArch::of_features(x.features)) {
            (DeviceKind::Cpu, Some(a)) => Some(a),
            (DeviceKind::Cpu, None) if arch_bits(x.features) == 0 => Some(CpuArch::X86_64),
            (DeviceKind::Cpu, None) => return Err(VerifyError::Architectures { executable: xi }),
            (DeviceKind::Cuda, _) => None,
        };
        for (i, r) in x.relocs.iter().enumerate() {
            if let Some(arch) = arch.filter(|a| !a.admits(r.kind)) {
                return Err(VerifyError::RelocKind {
                    executable: xi,
                    index: i,
                    kind: reloc_name(r.kind),
                    arch: arch.name(),
                });
            }
            let width = r.kind.width();
            if r.offset.checked_add(width).is_none_or(|end| end > code_len) || r.target > code_len {
                return Err(VerifyError::Reloc {
                    executable: xi,
                    index: i,
                    offset: r.offset,
                    target: r.target,
                    code_len,
                });
            }
        }
    }
    Ok(limits)
}

/// Checks that every dispatch of every entry point runs on a device of `kind`: a
/// runtime drives one kind of device, and refuses a plan that names another with
/// [`CommandProblem::UnsupportedDevice`] (before any code is loaded). `p` passed
/// [`verify_program`].
pub fn require_device_kind(p: &ProgramView<'_>, kind: DeviceKind) -> Result<(), VerifyError> {
    for e in &p.entries {
        for (i, c) in e.commands.iter().enumerate() {
            if kind == DeviceKind::Cuda && matches!(c, Command::AllReduce { .. } | Command::AllGather { .. }) {
                // The CPU driver runs collectives in host memory; a GPU driver needs
                // NCCL, which is not built yet.
                return Err(VerifyError::Command {
                    entry: e.name.to_string(),
                    command: i,
                    problem: CommandProblem::CollectiveUnsupported,
                });
            }
            let Command::Dispatch { device, .. } = c else { continue };
            // A heterogeneous plan's host is a CPU (verified); its other devices are
            // driven by the CPU runtime's queues, which refuse at instantiation a kind
            // they cannot drive (`RuntimeError::Hetero`).
            if kind == DeviceKind::Cpu && *device != 0 && is_heterogeneous(e) {
                continue;
            }
            // Verified: the device index is in range.
            let Some(d) = p.devices.get(*device as usize) else { continue };
            if d.kind != kind {
                return Err(VerifyError::Command {
                    entry: e.name.to_string(),
                    command: i,
                    problem: CommandProblem::UnsupportedDevice {
                        device: *device,
                        name: d.name.to_string(),
                        driver: kind,
                    },
                });
            }
        }
    }
    Ok(())
}

/// [`select_variants`]'s choice for a kernel with no CPU variant that a heterogeneous
/// plan dispatches only on another kind of device: no CPU code is loaded for it.
pub const NOT_ON_CPU: usize = usize::MAX;

/// The architecture marker bits of a feature set.
fn arch_bits(bits: u64) -> u64 {
    CpuArch::ALL.iter().fold(0, |m, a| m | a.feature().bit()) & bits
}

/// A relocation kind's name for errors.
fn reloc_name(kind: RelocKind) -> &'static str {
    match kind {
        RelocKind::Pc32 => "pc32",
        RelocKind::Abs64 => "abs64",
        RelocKind::Aarch64Call26 => "aarch64 call26",
        RelocKind::Aarch64AdrPrelPgHi21 => "aarch64 adr_prel_pg_hi21",
        RelocKind::Aarch64AddAbsLo12Nc => "aarch64 add_abs_lo12_nc",
        RelocKind::RiscvCallPlt => "riscv call_plt",
        RelocKind::RiscvPcrelHi20 => "riscv pcrel_hi20",
        RelocKind::RiscvPcrelLo12I => "riscv pcrel_lo12_i",
    }
}

/// Names of the features in a bit set (`"avx2"`, or `"feature bit 40"` for bits this
/// runtime does not know).
pub fn feature_names(bits: u64) -> Vec<String> {
    (0..64)
        .filter(|b| bits >> b & 1 == 1)
        .map(|b| match CpuFeature::ALL.iter().find(|f| **f as u8 == b) {
            Some(f) => f.name().to_string(),
            None => alloc::format!("feature bit {b}"),
        })
        .collect()
}

/// The CPU features variant `v` of `p` needs: its condition's and its executable's
/// (an executable's features are what all of its code uses; a variant may not run code
/// that needs more than the host has). `None` for a variant that is not for a CPU.
pub fn cpu_needs(p: &ProgramView<'_>, v: &Variant) -> Option<u64> {
    let x = p.executables.get(v.executable as usize)?;
    if x.device != DeviceKind::Cpu {
        return None;
    }
    let own = match v.condition {
        Condition::CpuFeatures(bits) => bits,
        Condition::Always | Condition::Cuda(_) => 0,
    };
    Some(own | x.features)
}

/// Picks, per kernel, the first CPU variant whose condition the host meets: every
/// feature it needs ([`cpu_needs`]) is in `host`. A variant that needs a feature the
/// host lacks is never taken; where no variant fits, the error names what the most
/// modest one lacks.
pub fn select_variants(p: &ProgramView<'_>, host: u64) -> Result<Vec<usize>, RuntimeError> {
    // Kernels a heterogeneous plan dispatches only on devices of another kind (its
    // CUDA segments' kernels) need no CPU variant: they are [`NOT_ON_CPU`].
    let mut on_cpu = alloc::vec![false; p.kernels.len()];
    let mut elsewhere = alloc::vec![false; p.kernels.len()];
    for e in &p.entries {
        for c in &e.commands {
            if let Command::Dispatch { kernel, device, .. } = c {
                let cpu = p.devices.get(*device as usize).is_none_or(|d| d.kind == DeviceKind::Cpu);
                let seen = if cpu { &mut on_cpu } else { &mut elsewhere };
                if let Some(x) = seen.get_mut(*kernel as usize) {
                    *x = true;
                }
            }
        }
    }
    let mut out = Vec::with_capacity(p.kernels.len());
    for (ki, k) in p.kernels.iter().enumerate() {
        if elsewhere[ki] && !on_cpu[ki] && k.variants.iter().all(|v| cpu_needs(p, v).is_none()) {
            out.push(NOT_ON_CPU);
            continue;
        }
        let mut fewest: Option<u64> = None;
        let mut pick = None;
        for (i, v) in k.variants.iter().enumerate() {
            // Indices were verified.
            let Some(needs) = cpu_needs(p, v) else { continue };
            let missing = needs & !host;
            if missing == 0 {
                pick = Some(i);
                break;
            }
            if fewest.is_none_or(|m| missing.count_ones() < m.count_ones()) {
                fewest = Some(missing);
            }
        }
        match (pick, fewest) {
            (Some(i), _) => out.push(i),
            // Code for another architecture than the host's: say so rather than list its
            // marker. (A host stated without an architecture gets the missing features.)
            (None, Some(missing)) if arch_bits(missing) != 0 && CpuArch::of_features(host).is_some() => {
                let code = CpuArch::of_features(missing).map_or("another architecture's", CpuArch::name);
                let host = CpuArch::of_features(host).map_or("another architecture", CpuArch::name);
                return Err(RuntimeError::WrongArchitecture { kernel: k.name.to_string(), code, host });
            }
            (None, Some(missing)) => {
                return Err(RuntimeError::MissingCpuFeatures {
                    kernel: k.name.to_string(),
                    names: feature_names(missing),
                })
            }
            (None, None) => return Err(RuntimeError::NoCpuVariant { kernel: k.name.to_string() }),
        }
    }
    Ok(out)
}
