//! An entry point's plan as the nodes of a CUDA graph: a pure translation, no driver.
//!
//! ```text
//! Layout::new      one device allocation: arena | constants | per entry: inputs, outputs
//!                  (every region aligned to max(256, arena_align) bytes)
//! nodes(...)       commands → nodes with their dependencies:
//!                    Dispatch → one kernel node (grid = workgroups, block and shared
//!                               memory from the launch record, one parameter per
//!                               binding: its device address)
//!                    Copy     → one device-to-device memcpy node
//!                    Fill     → one to eight memset nodes (see `fill_memsets`)
//!                    Barrier  → no node: every node after it depends on every node of
//!                               the wave before it that nothing later in that wave
//!                               depends on (its sinks; the rest follow by transitivity)
//!                    SkipIf   → no node; ends the wave as a barrier does
//! steps(...)       the plan cut into graphs at its conditional commands: one graph per
//!                  run of commands between a `SkipIf`, the command after it and the
//!                  command it skips to, each `SkipIf` read on the host between them
//!                  (a plan without one is one graph)
//! ```
//!
//! Inside a wave the compiler puts no two commands that touch the same bytes with one
//! of them writing; a plan that did would still run as written, never as a race: a node
//! also depends on every earlier node of its wave whose command conflicts with its own
//! (one writes a byte range the other reads or writes), as the CPU's local-task driver
//! splits such a wave. Commands that do nothing (a dispatch of no workgroups, a copy
//! or fill of no bytes) get no node, as on the CPU.
//!
//! Addresses are byte offsets from the allocation's base; the driver adds the base.

use crate::error::{CudaPlanProblem as GraphProblem, RuntimeError};
use alloc::string::ToString;
use alloc::vec::Vec;
use kiln_module::program::{Binding, Command, Launch, Slot};
use kiln_module::sections::EntryView;

/// Alignment of every region of the device allocation: `cuMemAlloc`'s own (256 bytes),
/// or the arena's when it asks for more.
pub const REGION_ALIGN: u64 = 256;

/// Largest grid a kernel node may have (`gridDimX` is at most 2³¹ − 1; the verifier's
/// bound too).
pub const MAX_GRID: u64 = crate::verify::CUDA_MAX_GRID;

/// Where each slot lives in the one device allocation, as offsets from its base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Alignment of the base and of every region.
    pub align: u64,
    /// The arena (shared by the entry points, as on the CPU).
    pub arena: u64,
    /// The constant pool.
    pub constants: u64,
    /// Per entry point: the offset of each input.
    pub inputs: Vec<Vec<u64>>,
    /// Per entry point: the offset of each output.
    pub outputs: Vec<Vec<u64>>,
    /// Bytes of the whole allocation (from the aligned base).
    pub size: u64,
}

impl Layout {
    /// Regions in order: arena (`arena_size` bytes), constants (`pool_len`), then each
    /// entry's inputs and outputs (`entries`: their byte sizes). `None` when the sizes
    /// overflow 64 bits.
    pub fn new(arena_size: u64, arena_align: u64, pool_len: u64, entries: &[(Vec<u64>, Vec<u64>)]) -> Option<Layout> {
        let align = arena_align.max(REGION_ALIGN);
        let mut end = 0u64;
        let mut region = |bytes: u64| -> Option<u64> {
            let at = end.checked_add(align - 1)? / align * align;
            end = at.checked_add(bytes)?;
            Some(at)
        };
        let arena = region(arena_size)?;
        let constants = region(pool_len)?;
        let mut inputs = Vec::with_capacity(entries.len());
        let mut outputs = Vec::with_capacity(entries.len());
        for (ins, outs) in entries {
            inputs.push(ins.iter().map(|&b| region(b)).collect::<Option<Vec<u64>>>()?);
            outputs.push(outs.iter().map(|&b| region(b)).collect::<Option<Vec<u64>>>()?);
        }
        // At least one byte, so that an empty model still gets a valid allocation.
        Some(Layout { align, arena, constants, inputs, outputs, size: end.max(1) })
    }

    /// The offset of `b` for entry point `entry`. The verifier proved that the slot
    /// exists and the range lies inside it; a slot that does not exist maps to the
    /// allocation's end (never reached for a verified plan).
    pub fn offset(&self, entry: usize, b: &Binding) -> u64 {
        let slot = match b.slot {
            Slot::Arena => Some(self.arena),
            Slot::Constants => Some(self.constants),
            Slot::Input(i) => self.inputs.get(entry).and_then(|v| v.get(i as usize)).copied(),
            Slot::Output(i) => self.outputs.get(entry).and_then(|v| v.get(i as usize)).copied(),
        };
        slot.map_or(self.size, |s| s + b.offset)
    }
}

/// One step of an entry point's replay on the GPU ([`steps`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Commands `range` as one graph: the nodes whose command lies in it.
    Graph(core::ops::Range<usize>),
    /// Command `at`, a `SkipIf`: its condition copied to the host once everything
    /// before it has run, then the replay goes on after it or where it skips to.
    Skip(usize),
}

impl Step {
    /// The first command of the step.
    pub fn start(&self) -> usize {
        match self {
            Step::Graph(r) => r.start,
            Step::Skip(at) => *at,
        }
    }
}

/// `commands` as the steps of a replay: every `SkipIf` a step of its own, and graphs over
/// the runs of commands between the cuts, which fall before and after each `SkipIf` and
/// at the command it skips to, so that every place the replay can reach starts a step.
/// A plan without conditional commands is one graph.
pub fn steps(commands: &[Command]) -> Vec<Step> {
    let n = commands.len();
    let mut cut = alloc::vec![false; n + 1];
    for (i, c) in commands.iter().enumerate() {
        if let Command::SkipIf { count, .. } = c {
            cut[i] = true;
            cut[i + 1] = true;
            // (Verified: the skip ends inside the plan.)
            if let Some(t) = (i + 1).checked_add(*count as usize).filter(|&t| t <= n) {
                cut[t] = true;
            }
        }
    }
    let mut out = Vec::new();
    let mut start = 0;
    for (i, c) in commands.iter().enumerate() {
        if matches!(c, Command::SkipIf { .. }) {
            if start < i {
                out.push(Step::Graph(start..i));
            }
            out.push(Step::Skip(i));
            start = i + 1;
        } else if cut[i] && start < i {
            out.push(Step::Graph(start..i));
            start = i;
        }
    }
    if start < n {
        out.push(Step::Graph(start..n));
    }
    out
}

/// The nodes of `nodes` whose command lies in `range`, their dependencies renumbered
/// within the step; dependencies on earlier steps are dropped (a step's graph is
/// launched on the stream after theirs have completed).
pub fn step_nodes(nodes: &[Node], range: &core::ops::Range<usize>) -> Vec<Node> {
    let first = nodes.iter().position(|n| n.command >= range.start).unwrap_or(nodes.len());
    let end = nodes.iter().position(|n| n.command >= range.end).unwrap_or(nodes.len());
    nodes[first..end]
        .iter()
        .map(|n| Node {
            command: n.command,
            kind: n.kind.clone(),
            deps: n.deps.iter().filter(|&&d| d >= first).map(|&d| d - first).collect(),
        })
        .collect()
}

/// One memset: `height` rows of `width` elements of `element` bytes each set to the low
/// `8·element` bits of `value`, rows `pitch` bytes apart, from `dst`
/// (`CUDA_MEMSET_NODE_PARAMS`, `cuMemsetD2D{8,16,32}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memset {
    /// Offset of the first element.
    pub dst: u64,
    /// The value (its low `8·element` bits).
    pub value: u32,
    /// Element width: 1, 2 or 4 bytes.
    pub element: u32,
    /// Elements per row.
    pub width: u64,
    /// Rows.
    pub height: u64,
    /// Bytes from one row's start to the next's (at least `element · width`).
    pub pitch: u64,
}

/// What a node does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// A kernel launch.
    Kernel {
        /// Index into the kernel table.
        kernel: u32,
        /// Blocks.
        grid: u32,
        /// Threads per block.
        block: u32,
        /// Dynamic shared bytes.
        shared: u32,
        /// One offset per binding, in binding order (the kernel's `.u64` parameters).
        params: Vec<u64>,
    },
    /// A device-to-device copy.
    Copy {
        /// Source offset.
        src: u64,
        /// Destination offset.
        dst: u64,
        /// Bytes.
        bytes: u64,
    },
    /// A memset.
    Memset(Memset),
}

/// A node of the graph: what it does, the command it comes from, and the nodes (by
/// index in the list, always earlier ones) it depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Index of the command in the entry's plan.
    pub command: usize,
    /// What it does.
    pub kind: NodeKind,
    /// Earlier nodes it waits for.
    pub deps: Vec<usize>,
}

/// Whether two ranges share a byte (ends saturate; verified ranges do not overflow).
fn overlaps(a: &Binding, b: &Binding) -> bool {
    let end = |x: &Binding| x.offset.saturating_add(x.length);
    a.slot == b.slot && a.offset < end(b) && b.offset < end(a)
}

/// The ranges a command reads and the one it writes.
fn access(c: &Command) -> (&[Binding], Option<&Binding>) {
    match c {
        Command::Dispatch { bindings, .. } => match bindings.split_last() {
            Some((w, r)) => (r, Some(w)),
            None => (&[], None),
        },
        Command::Copy { src, dst } => (core::slice::from_ref(src), Some(dst)),
        Command::Fill { dst, .. } => (&[], Some(dst)),
        Command::SkipIf { cond, .. } => (core::slice::from_ref(cond), None),
        // Refused before a graph is built (`build` below); no access to order.
        Command::Barrier
        | Command::AllReduce { .. }
        | Command::AllGather { .. }
        | Command::Segment { .. }
        | Command::Transfer { .. } => (&[], None),
    }
}

/// Whether `a` and `b` may not run at the same time: one writes bytes the other reads
/// or writes.
fn conflict(a: &Command, b: &Command) -> bool {
    let (ra, wa) = access(a);
    let (rb, wb) = access(b);
    let hits = |w: Option<&Binding>, r: &[Binding], w2: Option<&Binding>| {
        w.is_some_and(|w| r.iter().chain(w2).any(|x| overlaps(w, x)))
    };
    hits(wa, rb, wb) || hits(wb, ra, wa)
}

/// The memsets that fill `length` bytes at offset `dst` (of an allocation aligned to at
/// least 8) with the little-endian `pattern` of `pattern_len` bytes repeated from `dst`
/// on (a last, partial repetition keeps the pattern's first bytes), as the CPU's fill:
///
/// - the pattern is first cut to its shortest period (1, 2, 4 or 8 bytes: `0x0000_0000`
///   of 4 bytes is a 1-byte pattern);
/// - a period of 1, 2 or 4 whose range is aligned to and a multiple of it: one memset
///   of that element width (`cuMemsetD8/16/32`);
/// - a period of 8 on a 4-aligned range of whole repetitions: two memsets of 4-byte
///   elements, one row per repetition, 8 bytes apart (the low words, then at `dst + 4`
///   the high words);
/// - anything else (unaligned, or a partial last repetition): one memset of bytes per
///   byte of the period, each one byte per row, `period` bytes apart.
pub fn fill_memsets(dst: u64, length: u64, pattern: u64, pattern_len: u8) -> Vec<Memset> {
    let mut out = Vec::new();
    if length == 0 {
        return out;
    }
    let bytes = pattern.to_le_bytes();
    let len = usize::from(pattern_len).clamp(1, 8);
    let pat = &bytes[..len];
    let period = [1usize, 2, 4, 8]
        .into_iter()
        .find(|&p| len.is_multiple_of(p) && pat.iter().enumerate().all(|(i, b)| *b == pat[i % p]))
        .unwrap_or(len);
    let p = period as u64;
    let word = |from: usize, n: usize| -> u32 {
        let mut w = [0u8; 4];
        w[..n].copy_from_slice(&pat[from..from + n]);
        u32::from_le_bytes(w)
    };
    let whole = length.is_multiple_of(p);
    if period <= 4 && whole && dst.is_multiple_of(p) {
        out.push(Memset {
            dst,
            value: word(0, period),
            element: period as u32,
            width: length / p,
            height: 1,
            pitch: length,
        });
    } else if period == 8 && whole && dst.is_multiple_of(4) {
        let rows = length / 8;
        out.push(Memset { dst, value: word(0, 4), element: 4, width: 1, height: rows, pitch: 8 });
        out.push(Memset { dst: dst + 4, value: word(4, 4), element: 4, width: 1, height: rows, pitch: 8 });
    } else {
        for k in 0..p.min(length) {
            let rows = (length - k).div_ceil(p);
            out.push(Memset {
                dst: dst + k,
                value: u32::from(pat[k as usize]),
                element: 1,
                width: 1,
                height: rows,
                pitch: p,
            });
        }
    }
    out
}

/// The nodes of entry point `entry` (index `index` in the layout) whose kernels launch
/// as `launches` (per kernel of the kernel table: the launch of the variant that runs,
/// `None` for a kernel with no CUDA variant), on `grids` blocks where the variant that
/// runs has a grid of its own (per kernel; 0, or a kernel past the slice's end: the
/// dispatch's workgroups).
pub fn nodes(
    entry: &EntryView<'_>,
    index: usize,
    layout: &Layout,
    launches: &[Option<Launch>],
    grids: &[u64],
) -> Result<Vec<Node>, RuntimeError> {
    let fail = |command: usize, problem: GraphProblem| RuntimeError::CudaPlan {
        entry: entry.name.to_string(),
        command,
        problem,
    };
    let mut out: Vec<Node> = Vec::new();
    // The sinks of the last closed wave that had nodes.
    let mut before: Vec<usize> = Vec::new();
    // The open wave: each command with nodes, and the range of its nodes.
    let mut open: Vec<(&Command, core::ops::Range<usize>)> = Vec::new();
    for (ci, c) in entry.commands.iter().enumerate() {
        let kinds: Vec<NodeKind> = match c {
            // A `SkipIf` is evaluated on the host between graphs (`steps`): it ends the
            // open wave as a barrier does.
            Command::Barrier | Command::SkipIf { .. } => {
                if !open.is_empty() {
                    let first = open[0].1.start;
                    let depended: Vec<bool> = {
                        let mut d = alloc::vec![false; out.len() - first];
                        for n in &out[first..] {
                            for &x in &n.deps {
                                if x >= first {
                                    d[x - first] = true;
                                }
                            }
                        }
                        d
                    };
                    before = (first..out.len()).filter(|&i| !depended[i - first]).collect();
                    open.clear();
                }
                continue;
            }
            Command::Dispatch { kernel, workgroups, bindings, .. } => {
                if *workgroups == 0 {
                    continue;
                }
                let workgroups = match grids.get(*kernel as usize) {
                    Some(&g) if g != 0 => g,
                    _ => *workgroups,
                };
                if workgroups > MAX_GRID {
                    return Err(fail(ci, GraphProblem::Grid { workgroups }));
                }
                let l = launches
                    .get(*kernel as usize)
                    .copied()
                    .flatten()
                    .ok_or_else(|| fail(ci, GraphProblem::NoLaunch { kernel: *kernel }))?;
                alloc::vec![NodeKind::Kernel {
                    kernel: *kernel,
                    grid: workgroups as u32,
                    block: l.block,
                    shared: l.shared,
                    params: bindings.iter().map(|b| layout.offset(index, b)).collect(),
                }]
            }
            Command::Copy { src, dst } => {
                if src.length == 0 {
                    continue;
                }
                alloc::vec![NodeKind::Copy {
                    src: layout.offset(index, src),
                    dst: layout.offset(index, dst),
                    bytes: src.length,
                }]
            }
            Command::AllReduce { .. } | Command::AllGather { .. } => {
                return Err(fail(ci, GraphProblem::Collective));
            }
            // A heterogeneous plan is the hetero executor's (its host runs on the CPU).
            Command::Segment { .. } | Command::Transfer { .. } => {
                return Err(fail(ci, GraphProblem::Heterogeneous));
            }
            Command::Fill { dst, pattern, pattern_len } => {
                fill_memsets(layout.offset(index, dst), dst.length, *pattern, *pattern_len)
                    .into_iter()
                    .map(NodeKind::Memset)
                    .collect()
            }
        };
        if kinds.is_empty() {
            continue;
        }
        let mut deps = before.clone();
        for (other, range) in &open {
            if conflict(other, c) {
                deps.extend(range.clone());
            }
        }
        let start = out.len();
        for kind in kinds {
            out.push(Node { command: ci, kind, deps: deps.clone() });
        }
        open.push((c, start..out.len()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    fn b(slot: Slot, offset: u64, length: u64) -> Binding {
        Binding { slot, offset, length }
    }

    fn dispatch(kernel: u32, bindings: Vec<Binding>) -> Command {
        Command::Dispatch { kernel, device: 0, workgroups: 4, bindings, push_constants: vec![], work_ns: 0 }
    }

    fn entry(commands: Vec<Command>) -> EntryView<'static> {
        EntryView {
            bounded: Vec::new(),
            bounded_rows: Vec::new(),
            device_arenas: Vec::new(),
            prologue: 0,
            extents: Vec::new(),
            name: "main",
            inputs: vec![],
            outputs: vec![],
            arena_size: 1 << 20,
            arena_align: 64,
            commands,
            buffers: vec![],
        }
    }

    fn layout() -> Layout {
        Layout::new(1 << 20, 64, 1000, &[(vec![16, 300], vec![8])]).expect("layout")
    }

    const L: Launch = Launch { block: 128, shared: 0, params: 2 };

    fn deps(commands: Vec<Command>) -> Vec<(usize, Vec<usize>)> {
        let e = entry(commands);
        nodes(&e, 0, &layout(), &[Some(L); 8], &[]).expect("nodes").into_iter().map(|n| (n.command, n.deps)).collect()
    }

    #[test]
    fn layout_aligns_every_region_and_keeps_them_apart() {
        let l = layout();
        assert_eq!((l.align, l.arena, l.constants), (256, 0, 1 << 20));
        assert_eq!(l.inputs, [vec![(1 << 20) + 1024, (1 << 20) + 1280]]);
        assert_eq!(l.outputs, [vec![(1 << 20) + 1792]]);
        assert_eq!(l.size, (1 << 20) + 1800);
        // A larger arena alignment aligns every region to it.
        let l = Layout::new(10, 4096, 0, &[(vec![1], vec![])]).expect("layout");
        assert_eq!((l.arena, l.constants, l.inputs[0][0], l.size), (0, 4096, 4096, 4097));
        assert_eq!(Layout::new(u64::MAX, 64, 1, &[]), None);
        assert_eq!(Layout::new(0, 1, 0, &[]).map(|l| l.size), Some(1));
        assert_eq!(layout().offset(0, &b(Slot::Input(1), 8, 4)), (1 << 20) + 1288);
        assert_eq!(layout().offset(0, &b(Slot::Constants, 12, 4)), (1 << 20) + 12);
    }

    #[test]
    fn waves_become_dependencies_on_the_sinks_of_the_wave_before() {
        let a = |o| b(Slot::Arena, o, 64);
        let d = deps(vec![
            dispatch(0, vec![b(Slot::Input(0), 0, 16), a(0)]),
            dispatch(1, vec![b(Slot::Input(1), 0, 64), a(64)]),
            Command::Barrier,
            dispatch(2, vec![a(0), a(128)]),
            dispatch(3, vec![a(64), a(192)]),
            dispatch(4, vec![a(64), a(256)]),
            Command::Barrier,
            Command::Barrier,
            dispatch(5, vec![a(128), a(192), b(Slot::Output(0), 0, 8)]),
        ]);
        assert_eq!(
            d,
            [
                (0, vec![]),
                (1, vec![]),
                // The second wave waits for both nodes of the first, and runs concurrently.
                (3, vec![0, 1]),
                (4, vec![0, 1]),
                (5, vec![0, 1]),
                // An empty wave between two barriers changes nothing.
                (8, vec![2, 3, 4]),
            ]
        );
    }

    #[test]
    fn conflicts_inside_a_wave_are_ordered_and_only_sinks_carry_over() {
        let a = |o, n| b(Slot::Arena, o, n);
        let d = deps(vec![
            Command::Fill { dst: a(0, 64), pattern: 0, pattern_len: 4 },
            // Reads what the fill writes: after it.
            dispatch(0, vec![a(32, 8), a(128, 64)]),
            // Writes what the dispatch reads (write after read) and bytes the fill wrote
            // (write after write): after both.
            Command::Copy { src: b(Slot::Constants, 0, 8), dst: a(36, 8) },
            // Independent of all three.
            dispatch(1, vec![a(512, 4), a(600, 4)]),
            Command::Barrier,
            dispatch(2, vec![a(600, 4), a(700, 4)]),
        ]);
        // Only the copy and the independent dispatch are sinks of the first wave.
        assert_eq!(d, [(0, vec![]), (1, vec![0]), (2, vec![0, 1]), (3, vec![]), (5, vec![2, 3])]);
    }

    #[test]
    fn empty_commands_get_no_node_and_grids_are_bounded() {
        let e = entry(vec![
            Command::Dispatch {
                kernel: 0,
                device: 0,
                workgroups: 0,
                bindings: vec![b(Slot::Arena, 0, 4)],
                push_constants: vec![],
                work_ns: 0,
            },
            Command::Copy { src: b(Slot::Arena, 0, 0), dst: b(Slot::Arena, 8, 0) },
            Command::Fill { dst: b(Slot::Arena, 0, 0), pattern: 1, pattern_len: 1 },
            Command::Barrier,
        ]);
        assert_eq!(nodes(&e, 0, &layout(), &[Some(L)], &[]).expect("nodes"), []);
        let mut e = entry(vec![dispatch(0, vec![b(Slot::Arena, 0, 4)])]);
        if let Command::Dispatch { workgroups, .. } = &mut e.commands[0] {
            *workgroups = MAX_GRID + 1;
        }
        let err = nodes(&e, 0, &layout(), &[Some(L)], &[]).expect_err("grid");
        assert!(
            matches!(&err, RuntimeError::CudaPlan { command: 0, problem: GraphProblem::Grid { workgroups }, .. } if *workgroups == MAX_GRID + 1),
            "{err:?}"
        );
        let e = entry(vec![dispatch(3, vec![b(Slot::Arena, 0, 4)])]);
        let err = nodes(&e, 0, &layout(), &[Some(L)], &[]).expect_err("no launch");
        assert!(matches!(err, RuntimeError::CudaPlan { problem: GraphProblem::NoLaunch { kernel: 3 }, .. }));
    }

    #[test]
    fn a_conditional_command_cuts_the_plan_into_graph_steps() {
        // A run-time If: `SkipIf` at 2 skips the then-branch (3) when the condition is
        // false; the else-branch (5) sits behind a second `SkipIf` at 4.
        let cond = b(Slot::Arena, 0, 1);
        let e = entry(vec![
            dispatch(0, vec![b(Slot::Arena, 0, 4)]),
            Command::Barrier,
            Command::SkipIf { cond, value: false, count: 1 },
            dispatch(0, vec![b(Slot::Arena, 8, 4)]),
            Command::SkipIf { cond, value: true, count: 1 },
            dispatch(0, vec![b(Slot::Arena, 8, 4)]),
            Command::Barrier,
            dispatch(0, vec![b(Slot::Arena, 8, 4), b(Slot::Arena, 16, 4)]),
        ]);
        let s = steps(&e.commands);
        assert_eq!(
            s,
            [Step::Graph(0..2), Step::Skip(2), Step::Graph(3..4), Step::Skip(4), Step::Graph(5..6), Step::Graph(6..8)]
        );
        // Every place a skip can land starts a step: after each SkipIf and at its target.
        let starts: Vec<usize> = s.iter().map(Step::start).collect();
        for (i, c) in e.commands.iter().enumerate() {
            if let Command::SkipIf { count, .. } = c {
                assert!(starts.contains(&(i + 1)) && starts.contains(&(i + 1 + *count as usize)), "{starts:?}");
            }
        }
        // The nodes of a step keep only the dependencies inside it.
        let n = nodes(&e, 0, &layout(), &[Some(L)], &[]).expect("nodes");
        assert_eq!(n.iter().map(|x| x.command).collect::<Vec<_>>(), [0, 3, 5, 7]);
        let last = step_nodes(&n, &(6..8));
        assert_eq!(last.len(), 1);
        assert_eq!(last[0].deps, Vec::<usize>::new());
        let whole = step_nodes(&n, &(0..8));
        assert_eq!(whole, n);
        // A plan without conditional commands is one graph.
        assert_eq!(steps(&e.commands[..2]), [Step::Graph(0..2)]);
        assert_eq!(steps(&[]), Vec::<Step>::new());
    }

    #[test]
    fn kernel_copy_and_fill_nodes_carry_their_parameters() {
        let l = layout();
        let e = entry(vec![
            dispatch(1, vec![b(Slot::Input(1), 4, 4), b(Slot::Constants, 64, 8), b(Slot::Output(0), 0, 8)]),
            Command::Copy { src: b(Slot::Output(0), 0, 8), dst: b(Slot::Arena, 8, 8) },
            Command::Fill { dst: b(Slot::Arena, 1024, 16), pattern: 0x0102_0304, pattern_len: 4 },
        ]);
        let launches = [Some(L), Some(Launch { block: 64, shared: 1 << 16, params: 3 })];
        let n = nodes(&e, 0, &l, &launches, &[]).expect("nodes");
        assert_eq!(
            n[0].kind,
            NodeKind::Kernel {
                kernel: 1,
                grid: 4,
                block: 64,
                shared: 1 << 16,
                params: vec![l.inputs[0][1] + 4, l.constants + 64, l.outputs[0][0]],
            }
        );
        assert_eq!(n[1].kind, NodeKind::Copy { src: l.outputs[0][0], dst: 8, bytes: 8 });
        assert_eq!(n[1].deps, [0]);
        // A variant with a grid of its own (an sm_80 variant that splits no K over a
        // cluster) launches on that grid; 0 leaves the dispatch's.
        let own = nodes(&e, 0, &l, &launches, &[0, 9]).expect("nodes");
        assert!(matches!(own[0].kind, NodeKind::Kernel { grid: 9, .. }), "{:?}", own[0].kind);
        let same = nodes(&e, 0, &l, &launches, &[5, 0]).expect("nodes");
        assert!(matches!(same[0].kind, NodeKind::Kernel { grid: 4, .. }), "{:?}", same[0].kind);
        assert_eq!(
            n[2].kind,
            NodeKind::Memset(Memset { dst: 1024, value: 0x0102_0304, element: 4, width: 4, height: 1, pitch: 16 })
        );
    }

    /// Applies memsets to `mem` as the driver does.
    fn apply(mem: &mut [u8], sets: &[Memset]) {
        for s in sets {
            assert!(s.dst.is_multiple_of(u64::from(s.element)), "{s:?}: misaligned");
            assert!(s.height == 1 || s.pitch >= s.width * u64::from(s.element), "{s:?}: rows overlap");
            let v = s.value.to_le_bytes();
            for r in 0..s.height {
                for w in 0..s.width {
                    let at = (s.dst + r * s.pitch + w * u64::from(s.element)) as usize;
                    let n = s.element as usize;
                    mem[at..at + n].copy_from_slice(&v[..n]);
                }
            }
        }
    }

    #[test]
    fn fills_match_the_cpu_for_every_width_alignment_and_length() {
        let patterns = [
            0u64,
            0xab,
            0xabab,
            0x1234,
            0xdead_beef,
            0x7fc0_0000,
            0x0102_0304_0506_0708,
            0x1111_1111_1111_1111,
            0xdead_beef_dead_beef,
        ];
        for pattern in patterns {
            for pattern_len in [1u8, 2, 4, 8] {
                for dst in [0u64, 1, 2, 3, 4, 6, 8, 12, 16] {
                    for length in [0u64, 1, 2, 3, 4, 7, 8, 9, 16, 24, 33, 64] {
                        let mut mem = vec![0x5au8; 128];
                        let sets = fill_memsets(dst, length, pattern, pattern_len);
                        apply(&mut mem, &sets);
                        // The CPU's fill: the pattern's first `pattern_len` bytes repeated
                        // from `dst` on.
                        let mut want = vec![0x5au8; 128];
                        let pat = &pattern.to_le_bytes()[..pattern_len as usize];
                        for i in 0..length as usize {
                            want[dst as usize + i] = pat[i % pat.len()];
                        }
                        assert_eq!(mem, want, "pattern {pattern:#x}/{pattern_len} at {dst}, {length} bytes: {sets:?}");
                        assert!(sets.len() <= 8);
                    }
                }
            }
        }
        // The common cases take one memset (two for an 8-byte period).
        assert_eq!(fill_memsets(64, 256, 0, 4).len(), 1);
        assert_eq!(fill_memsets(64, 256, 0, 4)[0].element, 1);
        assert_eq!(fill_memsets(64, 256, 0x7fc0_0000, 4)[0].element, 4);
        assert_eq!(fill_memsets(64, 256, 0x3c00, 2)[0].element, 2);
        assert_eq!(fill_memsets(64, 256, 0x0102_0304_0506_0708, 8).len(), 2);
        assert_eq!(fill_memsets(64, 256, u64::MAX, 8).len(), 1);
    }
}
