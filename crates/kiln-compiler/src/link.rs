//! What the two linkers of per-segment programs share: [`crate::shard`] (one plan
//! sharded over devices of one target) and [`crate::hetero`] (one plan over a CPU and a
//! GPU). Each compiles its segments through the ordinary pipeline, then lays them out
//! in one program; the layout of arenas and the commands between segments differ, the
//! pieces here do not: the segments' kernels and executables gathered into one table,
//! a segment's own commands moved to their linked bindings, the signature's tensor
//! descriptions, and the constant pool written to a weights file when asked.

use kiln_ir::{Graph, ValueId};
use kiln_module::program::{Binding, BufferDesc, Command, Constants, Executable, Kernel, Program, Slot, TensorDesc};
use kiln_shard::{Exchange, Port, Segment};

use crate::{CompileError, Compiled, Options};

/// Alignment of every region the linkers lay out.
pub(crate) const ALIGN: u64 = 64;

/// `x` rounded up to [`ALIGN`].
pub(crate) fn round_up(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// The signature's description of graph value `v`.
pub(crate) fn tensor_desc(g: &Graph, v: ValueId) -> TensorDesc {
    let val = &g.values[v];
    TensorDesc {
        name: val.name.clone(),
        dtype: val.ty.dtype.onnx_code().unwrap_or(0) as u32,
        dims: val.ty.shape.dims().iter().map(|&d| d as u64).collect(),
        bytes: val.ty.storage_bytes() as u64,
    }
}

/// Every segment's kernels and executables in one table.
pub(crate) struct Kernels {
    pub kernels: Vec<Kernel>,
    pub executables: Vec<Executable>,
    /// Per segment, the index of its first kernel.
    pub base: Vec<u32>,
    /// Per kernel, its source (debug info; empty where the segment kept none).
    pub sources: Vec<String>,
}

/// The kernels of `segs` (each with its device and stage, which prefix the kernel's
/// name: `d1.s0.k0_0`), their variants pointing into the joined executables.
pub(crate) fn gather_kernels<'a>(segs: impl IntoIterator<Item = ((u32, usize), &'a Compiled)>) -> Kernels {
    let mut out = Kernels { kernels: Vec::new(), executables: Vec::new(), base: Vec::new(), sources: Vec::new() };
    for ((device, stage), c) in segs {
        out.base.push(out.kernels.len() as u32);
        let xb = out.executables.len() as u32;
        out.executables.extend(c.program.executables.iter().cloned());
        for (i, k) in c.program.kernels.iter().enumerate() {
            let mut k = k.clone();
            k.name = format!("d{device}.s{stage}.{}", k.name);
            k.variants.iter_mut().for_each(|v| v.executable += xb);
            out.kernels.push(k);
            out.sources
                .push(c.program.debug.as_ref().and_then(|d| d.kernel_sources.get(i)).cloned().unwrap_or_default());
        }
    }
    out
}

/// Segment command `c` in the linked plan: a dispatch of the joined kernel table (its
/// first kernel at `kernel_base`) on `device`, every binding through `remap`; a copy,
/// fill or barrier as it is but for the bindings. Anything else a segment's plan cannot
/// hold.
pub(crate) fn relocate(
    c: &Command,
    kernel_base: u32,
    device: u32,
    remap: impl Fn(&Binding) -> Binding,
) -> Result<Command, CompileError> {
    Ok(match c {
        Command::Dispatch { kernel, workgroups, bindings, push_constants, work_ns, .. } => Command::Dispatch {
            kernel: kernel + kernel_base,
            device,
            workgroups: *workgroups,
            bindings: bindings.iter().map(&remap).collect(),
            push_constants: push_constants.clone(),
            work_ns: *work_ns,
        },
        Command::Barrier => Command::Barrier,
        Command::Copy { src, dst } => Command::Copy { src: remap(src), dst: remap(dst) },
        Command::Fill { dst, pattern, pattern_len } => {
            Command::Fill { dst: remap(dst), pattern: *pattern, pattern_len: *pattern_len }
        }
        other => return Err(CompileError::Link(format!("a segment's plan has {other:?}"))),
    })
}

/// Where a segment's binding `b` lands in the linked program: its arena and its
/// constants at the `(arena, constants)` bases, its inputs where `input` places each
/// port, its outputs in their exchanges (at `ex_off`). A slot the segment does not
/// declare lands in the arena at `u64::MAX`.
pub(crate) fn linked_binding(
    s: &Segment,
    b: &Binding,
    (arena, constants): (u64, u64),
    ex_off: &[u64],
    input: impl Fn(Port) -> (Slot, u64),
) -> Binding {
    let (slot, base) = match b.slot {
        Slot::Arena => (Slot::Arena, arena),
        Slot::Constants => (Slot::Constants, constants),
        Slot::Input(i) => s.inputs.get(i as usize).map_or((Slot::Arena, u64::MAX), |&port| input(port)),
        Slot::Output(i) => s.outputs.get(i as usize).map_or((Slot::Arena, u64::MAX), |&e| (Slot::Arena, ex_off[e])),
    };
    Binding { slot, offset: base.saturating_add(b.offset), length: b.length }
}

/// Where a segment reads input port `port` from: the model's input, or its exchange
/// buffer (at `ex_off`).
pub(crate) fn port_place(port: Port, ex_off: &[u64]) -> (Slot, u64) {
    match port {
        Port::Input(j) => (Slot::Input(j as u32), 0),
        Port::Exchange(e) => (Slot::Arena, ex_off[e]),
    }
}

/// A plan linked from per-segment compiles: what [`crate::shard::compile`] and
/// [`crate::hetero::compile`] return, with `C` the cut of the graph into segments
/// ([`kiln_shard::Sharded`], [`crate::hetero::Split`]).
#[derive(Debug)]
pub struct Linked<C> {
    /// The `.kiln` bytes.
    pub artifact: Vec<u8>,
    /// The constant pool, when kept outside the artifact.
    pub weights: Option<Vec<u8>>,
    /// The program written.
    pub program: Program,
    /// How the graph was cut into segments.
    pub cut: C,
    /// Every segment's own compile, in the order of the cut's segments.
    pub segments: Vec<Compiled>,
}

impl<C> Linked<C> {
    /// The linked `program` written out, its constants in a weights file where
    /// `options` asks for one.
    pub(crate) fn write(program: Program, options: &Options, cut: C, segments: Vec<Compiled>) -> Linked<C> {
        let (program, weights) = externalise(program, options);
        let artifact = kiln_module::sections::write_program(&program);
        Linked { artifact, weights, program, cut, segments }
    }
}

/// `program` with its constants in the weights file `options.external_weights` names
/// (the pool returned for the caller to write), or as it is.
fn externalise(program: Program, options: &Options) -> (Program, Option<Vec<u8>>) {
    let Some(file) = &options.external_weights else { return (program, None) };
    let mut p = program;
    let pool = match std::mem::replace(&mut p.constants, Constants::Embedded(Vec::new())) {
        Constants::Embedded(b) => b,
        Constants::External { .. } => Vec::new(),
    };
    p.constants = Constants::External {
        file: file.clone(),
        size: pool.len() as u64,
        hash: kiln_module::sections::weights_hash(&pool),
    };
    (p, Some(pool))
}

/// The linked plan's memory map: every segment's buffers (named `d{device}/{name}`, at
/// their linked bindings, their first and last commands moved by `cmd_map`, `last`
/// where a command has no place), then each exchange (at `ex_off`, named by
/// `exchange_name`), live over the whole plan. Names are left out with `strip`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn memory_map(
    segments: &[Segment],
    segs: &[Compiled],
    cmd_map: &[Vec<u32>],
    last: u32,
    remap: impl Fn(usize, &Binding) -> Binding,
    (exchanges, ex_off): (&[Exchange], &[u64]),
    exchange_name: impl Fn(&Exchange) -> String,
    strip: bool,
) -> Vec<BufferDesc> {
    let mut buffers = Vec::new();
    for (si, (s, c)) in segments.iter().zip(segs).enumerate() {
        for b in &c.program.entries[0].buffers {
            let map = |i: u32| cmd_map[si].get(i as usize).copied().unwrap_or(last);
            buffers.push(BufferDesc {
                name: if strip { String::new() } else { format!("d{}/{}", s.device, b.name) },
                binding: remap(si, &b.binding),
                first: map(b.first),
                last: map(b.last),
            });
        }
    }
    for (x, &offset) in exchanges.iter().zip(ex_off) {
        buffers.push(BufferDesc {
            name: if strip { String::new() } else { exchange_name(x) },
            binding: Binding { slot: Slot::Arena, offset, length: x.ty.storage_bytes() as u64 },
            first: 0,
            last,
        });
    }
    buffers
}
