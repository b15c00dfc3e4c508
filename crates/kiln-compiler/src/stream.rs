//! The stream level: execution order, waves, buffer lifetimes, the arena plan and the
//! constant pool of a flow program.
//!
//! Dispatches are partitioned into waves (as-soon-as-possible levels of the dependency
//! DAG, [`kiln_schedule::waves`], except that the readers of different large constants
//! that several dispatches read run one constant at a time: [`resident_constants`]);
//! a barrier separates consecutive waves, and the
//! dispatches of one wave may run concurrently. Lifetimes are counted in waves, so two
//! buffers that are live in the same wave never share memory even when a driver runs
//! that wave's dispatches at once. Every intermediate buffer gets an offset in one
//! arena ([`kiln_schedule::arena`], 64-byte aligned); aliases (reshape-like results)
//! share their source's bytes; graph inputs and outputs are the caller's memory, so a
//! dispatch producing a graph output writes it in place; constants are laid out in one
//! pool, each at a 64-byte aligned offset.
//!
//! **In-place concatenation.** A concatenation (`kiln_flow::concat::Concat`) along an
//! axis with only extent-1 axes before it places each of its inputs in one contiguous
//! range of its result. Where every input is an intermediate result of its own dispatch
//! (not a graph input, constant or output, not a piece of another concatenation, each
//! once), each input is placed inside the result's bytes ([`Placement::Within`]), its
//! producer writes its range directly, and the concatenation runs no code
//! ([`StreamPlan::elided`]): readers of the result wait for the pieces' producers
//! instead, and the result lives from the first piece written to its last reader (or
//! the last reader of a piece).
//!
//! **In-place scatters.** A scatter kernel (`kiln_flow::kernel`'s "Scatter kernels")
//! starts its output as a copy of its input 0 and updates a few elements. Where that
//! input is an intermediate result of its own unguarded dispatch, read by nothing else
//! (not a graph input, constant or output, no other reader, not a piece or the result of
//! an in-place concatenation), it is placed at the scatter's result's bytes
//! ([`Placement::Within`] at offset 0): its producer writes the result's buffer, the
//! scatter's code finds input 0 and its output at the same address and skips the copy,
//! and the work is the updates' alone. Otherwise the scatter copies input 0 first.
//!
//! **The instantiation prologue.** With [`Prologue::Hoist`], the dispatches that depend
//! on no graph input (every operand a constant or the result of such a dispatch; not
//! guarded, not writing a graph output: weights a model computes from constants, such
//! as `ConstantOfShape` fills or dequantised integer weights, and position tables) go
//! first, in waves of their own ([`StreamPlan::prologue`] of them), and the rest follow
//! in theirs. A prologue result that a later wave reads (or that lives inside a buffer
//! a later wave writes, a piece of an in-place concatenation) lives to the last wave,
//! so no later buffer shares its bytes, and a scatter updates a prologue result in place
//! only from inside the prologue. The runtime runs the prologue once per instance and
//! every later call starts behind it (`EntryPoint::prologue`); running all of it every
//! call computes the same.
//!
//! **Guarded dispatches** (a run-time `If`, see `kiln_flow::program`) are scheduled like
//! any other: a guard's condition counts as one more operand (the dispatch waits for
//! its producer, and the condition lives until the dispatch's wave), and an `If`
//! result, written by one dispatch per branch, lives from the first write to its last
//! reader, who waits for both writers. Lifetimes are therefore those of the plan with
//! every branch run, so whichever branch runs, no buffer it touches shares bytes with
//! one live at the same time; the two branches' buffers share the arena like any
//! buffers whose waves do not overlap.

use kiln_flow::concat::Concat;
use kiln_flow::program::{BufferId, BufferKind, FlowProgram};
use kiln_schedule::arena;

/// Alignment of arena buffers and constants.
pub const ALIGN: u64 = 64;

/// Where a storage buffer lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Not stored anywhere (an alias, or unused).
    None,
    /// The caller's input.
    Input(u32),
    /// The caller's output.
    Output(u32),
    /// The constant pool, at an offset.
    Constant(u64),
    /// The arena, at an offset.
    Arena(u64),
    /// Inside another storage buffer, at a byte offset (a piece of an in-place
    /// concatenation).
    Within(BufferId, u64),
}

/// The stream-level plan of a flow program.
#[derive(Debug, Clone)]
pub struct StreamPlan {
    /// Dispatch indices per wave, in execution order.
    pub waves: Vec<Vec<usize>>,
    /// Placement of every buffer (storage buffers; aliases are `None`).
    pub placement: Vec<Placement>,
    /// Live range of every buffer in waves (first written, last read), when it has one.
    pub lifetimes: Vec<Option<(usize, usize)>>,
    /// Bytes of the arena.
    pub arena_size: u64,
    /// The largest total size of arena buffers live in one wave (no plan is smaller).
    pub arena_lower_bound: u64,
    /// The constant pool.
    pub constants: Vec<u8>,
    /// Outputs that need a copy at the end: (storage buffer, output index).
    pub output_copies: Vec<(BufferId, u32)>,
    /// Dispatches in no wave: concatenations whose pieces their producers write in place.
    pub elided: Vec<usize>,
    /// The first `prologue` waves are the instantiation prologue (see the module docs;
    /// 0 without [`Prologue::Hoist`] or when every dispatch reads an input).
    pub prologue: usize,
}

/// Whether [`schedule`] puts the dispatches that depend on no input first, in an
/// instantiation prologue the runtime runs once per instance (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prologue {
    /// Every dispatch in one schedule by its dependencies alone: each runs every call.
    Inline,
    /// Dispatches that depend on no input in a prologue of their own.
    Hoist,
}

/// Why a program cannot be scheduled (a compiler bug when it happens).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// The dispatch DAG has a cycle or a dangling edge.
    #[error("dispatch graph: {0}")]
    Waves(String),
    /// The arena plan failed.
    #[error("arena plan: {0:?}")]
    Arena(arena::ArenaError),
}

fn round_up(x: u64, a: u64) -> u64 {
    x.div_ceil(a) * a
}

/// Bytes of a buffer's type.
pub fn bytes(p: &FlowProgram, b: BufferId) -> u64 {
    p.buffer(b).ty.storage_bytes() as u64
}

/// The concatenations of `p` done in place (see the module docs): per buffer, the
/// storage buffer and byte offset it is placed at; and the dispatches elided.
fn in_place_concats(p: &FlowProgram, producers: &[Option<usize>]) -> (Vec<Option<(BufferId, u64)>>, Vec<usize>) {
    let nb = p.buffers.len();
    let mut within: Vec<Option<(BufferId, u64)>> = vec![None; nb];
    let mut elided: Vec<usize> = Vec::new();
    let outputs: Vec<BufferId> = p.outputs.iter().map(|&o| p.storage(o)).collect();
    for (d, disp) in p.dispatches.iter().enumerate() {
        // (Not under a guard: a piece written in place must be written whenever the
        // concatenation would run.)
        if !disp.guard.is_empty() {
            continue;
        }
        let Some(c) = Concat::of(&disp.kernel) else { continue };
        let cs = p.storage(disp.result);
        let ty = &p.buffer(cs).ty;
        if ty.dtype.is_packed() || outputs.contains(&cs) || within[cs.index()].is_some() {
            continue;
        }
        let dims = ty.shape.dims();
        if dims[..c.axis].iter().any(|&x| x != 1) {
            continue;
        }
        let inner = dims[c.axis + 1..].iter().product::<usize>() as u64 * ty.dtype.storage_bytes(1) as u64;
        let mut pieces: Vec<(BufferId, u64)> = Vec::with_capacity(c.pieces.len());
        let fits = c.pieces.iter().all(|&(j, start)| {
            let Some(&o) = disp.operands.get(j as usize) else { return false };
            let s = p.storage(o);
            let ok = matches!(p.buffer(s).kind, BufferKind::Result)
                && producers[s.index()]
                    .is_some_and(|pi| pi < d && !elided.contains(&pi) && p.dispatches[pi].guard.is_empty())
                && !outputs.contains(&s)
                && within[s.index()].is_none()
                && !pieces.iter().any(|&(x, _)| x == s);
            pieces.push((s, start * inner));
            ok
        });
        if !fits {
            continue;
        }
        for (s, off) in pieces {
            within[s.index()] = Some((cs, off));
        }
        elided.push(d);
    }
    (within, elided)
}

/// Places the input 0 of every scatter that may update it in place (see the module
/// docs) inside its result: `within` gains those placements.
fn in_place_scatters(
    p: &FlowProgram,
    producers: &[Option<usize>],
    within: &mut [Option<(BufferId, u64)>],
    elided: &[usize],
    hoisted: &[bool],
) {
    let outputs: Vec<BufferId> = p.outputs.iter().map(|&o| p.storage(o)).collect();
    // Reads of each storage buffer (operand slots and guard conditions), and whether an
    // in-place concatenation's pieces live in it.
    let mut reads = vec![0usize; p.buffers.len()];
    for d in &p.dispatches {
        for &o in d.operands.iter().chain(d.guard.iter().map(|(c, _)| c)) {
            reads[p.storage(o).index()] += 1;
        }
    }
    let mut hosts = vec![false; p.buffers.len()];
    for &(c, _) in within.iter().flatten() {
        hosts[c.index()] = true;
    }
    for (d, disp) in p.dispatches.iter().enumerate() {
        if disp.kernel.scatter.is_none() || !disp.guard.is_empty() || elided.contains(&d) {
            continue;
        }
        let r = p.storage(disp.result);
        let Some(&o) = disp.operands.first() else { continue };
        let s = p.storage(o);
        let ok = s != r
            && matches!(p.buffer(s).kind, BufferKind::Result)
            && matches!(p.buffer(r).kind, BufferKind::Result)
            && p.buffer(s).ty.storage_bytes() == p.buffer(r).ty.storage_bytes()
            && producers[s.index()].is_some_and(|pi| {
                pi < d && !elided.contains(&pi) && p.dispatches[pi].guard.is_empty() && hoisted[pi] == hoisted[d]
            })
            && producers[r.index()] == Some(d)
            && reads[s.index()] == 1
            && !outputs.contains(&s)
            && within[s.index()].is_none()
            && within[r.index()].is_none()
            && !hosts[s.index()]
            && !hosts[r.index()];
        if ok {
            within[s.index()] = Some((r, 0));
            hosts[r.index()] = true;
        }
    }
}

/// The dispatches of `p` that depend on no graph input (see the module docs), given
/// each storage buffer's writers (`writers`, the elided concatenations' pieces' producers
/// standing for them) and the elided dispatches.
fn input_independent(p: &FlowProgram, writers: &[Vec<usize>], elided: &[usize]) -> Vec<bool> {
    let outputs: Vec<BufferId> = p.outputs.iter().map(|&o| p.storage(o)).collect();
    let mut hoisted = vec![false; p.dispatches.len()];
    // (Dispatches come in dependency order; the loop repeats only should one not.)
    loop {
        let mut changed = false;
        for (d, disp) in p.dispatches.iter().enumerate() {
            if hoisted[d] || !disp.guard.is_empty() || elided.contains(&d) || outputs.contains(&p.storage(disp.result))
            {
                continue;
            }
            let constant = disp.operands.iter().all(|&o| {
                let s = p.storage(o);
                match p.buffer(s).kind {
                    BufferKind::Const(_) => true,
                    BufferKind::Result => {
                        let w = &writers[s.index()];
                        !w.is_empty() && w.iter().all(|&x| hoisted[x])
                    }
                    BufferKind::Input(_) | BufferKind::Alias(_) => false,
                }
            });
            if constant {
                hoisted[d] = true;
                changed = true;
            }
        }
        if !changed {
            return hoisted;
        }
    }
}

/// A constant at least this large, read by several dispatches, is kept in cache by
/// running its readers one key at a time ([`resident_constants`]): over half the L2 of
/// most cores, so that two such constants read in turn would not both stay there, and
/// the size at which a smaller last-level cache starts to be shared between them.
const RESIDENT_CONSTANT_BYTES: usize = 1 << 20;

/// Per dispatch, the constant of at least [`RESIDENT_CONSTANT_BYTES`] that it and
/// other dispatches read (its largest, where several), as the key that
/// [`kiln_schedule::waves::waves_apart`] runs one at a time: the recurrent weights of
/// an unrolled recurrence, read by every step. A bidirectional LSTM's two directions
/// (crnn's 4 MB of weights each) then run one after the other instead of step by step
/// in turn: on an 8 MiB last-level cache the turns evicted each other's weights at
/// every step (ddddocr-common-crnn's 40 steps 220 µs each from memory; one such
/// product alone, its weights in cache, 100 µs).
fn resident_constants(p: &FlowProgram) -> Vec<Option<usize>> {
    let large = |b: BufferId| {
        let s = p.storage(b);
        let buf = &p.buffers[s.index()];
        (matches!(buf.kind, BufferKind::Const(_)) && buf.ty.storage_bytes() >= RESIDENT_CONSTANT_BYTES).then_some(s)
    };
    // Each dispatch's large constants, once each.
    let reads: Vec<Vec<BufferId>> = p
        .dispatches
        .iter()
        .map(|d| {
            let mut v: Vec<BufferId> = d.operands.iter().filter_map(|&o| large(o)).collect();
            v.sort_unstable_by_key(|b| b.index());
            v.dedup();
            v
        })
        .collect();
    let mut readers = vec![0usize; p.buffers.len()];
    for b in reads.iter().flatten() {
        readers[b.index()] += 1;
    }
    reads
        .into_iter()
        .map(|read| {
            read.into_iter()
                .filter(|b| readers[b.index()] >= 2)
                .max_by_key(|b| (p.buffers[b.index()].ty.storage_bytes(), std::cmp::Reverse(b.index())))
                .map(|b| b.index())
        })
        .collect()
}

/// The waves of the dispatches `subset` (a set closed under the dependencies that
/// matter: a dependency outside it has run before), as plan indices; `keys` as
/// [`resident_constants`] gives them.
fn waves_of(deps: &[Vec<usize>], keys: &[Option<usize>], subset: &[usize]) -> Result<Vec<Vec<usize>>, StreamError> {
    let mut at = vec![usize::MAX; deps.len()];
    for (k, &d) in subset.iter().enumerate() {
        at[d] = k;
    }
    let local: Vec<Vec<usize>> = subset
        .iter()
        .map(|&d| deps[d].iter().filter_map(|&x| (at[x] != usize::MAX).then_some(at[x])).collect())
        .collect();
    let local_keys: Vec<Option<usize>> = subset.iter().map(|&d| keys[d]).collect();
    let w = kiln_schedule::waves::waves_apart(&local, &local_keys).map_err(|e| StreamError::Waves(e.to_string()))?;
    Ok(w.waves.into_iter().map(|wave| wave.into_iter().map(|k| subset[k]).collect()).collect())
}

/// Per buffer, the dispatches that write its bytes: its writers (every branch's, for an
/// `If` result) less the elided concatenations, and for the host of pieces placed
/// within it, the pieces' producers.
fn writers_of(
    p: &FlowProgram,
    within: &[Option<(BufferId, u64)>],
    producers: &[Option<usize>],
    elided: &[usize],
) -> Vec<Vec<usize>> {
    let mut writers: Vec<Vec<usize>> =
        p.writers().iter().map(|w| w.iter().copied().filter(|d| !elided.contains(d)).collect()).collect();
    for (i, w) in within.iter().enumerate() {
        if let (Some((c, _)), Some(d)) = (w, producers[i]) {
            writers[c.index()].push(d);
        }
    }
    writers
}

/// Plans `p` (see the module docs).
pub fn schedule(p: &FlowProgram, prologue: Prologue) -> Result<StreamPlan, StreamError> {
    let producers = p.producers();
    let (mut within, elided) = in_place_concats(p, &producers);
    let hoisted = match prologue {
        Prologue::Inline => vec![false; p.dispatches.len()],
        Prologue::Hoist => input_independent(p, &writers_of(p, &within, &producers, &elided), &elided),
    };
    in_place_scatters(p, &producers, &mut within, &elided, &hoisted);
    // The storage whose bytes a buffer's live range keeps (a piece: its concatenation's).
    let home = |b: BufferId| {
        let s = p.storage(b);
        within[s.index()].map_or(s, |(c, _)| c)
    };
    // The dispatches a reader of buffer `b` waits for: its producer, or the producers
    // of an elided concatenation's pieces.
    // (Every writer: an `If` result has one per branch.)
    let all_writers = p.writers();
    let writers = writers_of(p, &within, &producers, &elided);
    // What a dispatch reads: its operands and its guard's conditions.
    let reads = |d: &kiln_flow::program::Dispatch| -> Vec<BufferId> {
        d.operands.iter().copied().chain(d.guard.iter().map(|&(c, _)| c)).collect()
    };
    let n = p.dispatches.len();
    let deps: Vec<Vec<usize>> = p
        .dispatches
        .iter()
        .map(|d| {
            let mut v: Vec<usize> =
                reads(d).iter().flat_map(|&o| writers[p.storage(o).index()].iter().copied()).collect();
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let keys = resident_constants(p);
    // With a prologue, its waves first, then the others' (a dependency of a later
    // dispatch on a prologue one is met before its waves start).
    let (mut w, prologue_waves) = if hoisted.iter().any(|&h| h) {
        let (first, rest): (Vec<usize>, Vec<usize>) = (0..n).partition(|&d| hoisted[d]);
        let mut waves = waves_of(&deps, &keys, &first)?;
        let prologue_waves = waves.len();
        waves.extend(waves_of(&deps, &keys, &rest)?);
        let mut wave_of = vec![0; n];
        for (wi, wave) in waves.iter().enumerate() {
            for &d in wave {
                wave_of[d] = wi;
            }
        }
        (kiln_schedule::waves::Waves { waves, wave_of }, prologue_waves)
    } else {
        (kiln_schedule::waves::waves_apart(&deps, &keys).map_err(|e| StreamError::Waves(e.to_string()))?, 0)
    };
    // Elided dispatches leave the waves (a wave left empty goes too).
    if !elided.is_empty() {
        let waves: Vec<Vec<usize>> = std::mem::take(&mut w.waves)
            .into_iter()
            .map(|wave| wave.into_iter().filter(|d| !elided.contains(d)).collect::<Vec<usize>>())
            .filter(|wave| !wave.is_empty())
            .collect();
        for (wi, wave) in waves.iter().enumerate() {
            for &d in wave {
                w.wave_of[d] = wi;
            }
        }
        w.waves = waves;
    }
    let nb = p.buffers.len();
    let mut lifetimes: Vec<Option<(usize, usize)>> = vec![None; nb];
    for (di, d) in p.dispatches.iter().enumerate() {
        if elided.contains(&di) {
            continue;
        }
        let wave = w.wave_of[di];
        let s = home(d.result).index();
        lifetimes[s] = Some(match lifetimes[s] {
            None => (wave, wave),
            Some((a, b)) => (a.min(wave), b.max(wave)),
        });
        for o in reads(d) {
            let s = home(o).index();
            if let Some((a, b)) = lifetimes[s] {
                lifetimes[s] = Some((a, b.max(wave)));
            }
        }
    }
    let mut placement = vec![Placement::None; nb];
    for (i, w) in within.iter().enumerate() {
        if let Some((c, off)) = *w {
            placement[i] = Placement::Within(c, off);
        }
    }
    // Graph inputs.
    for (i, b) in p.buffers.iter().enumerate() {
        if let BufferKind::Input(k) = b.kind {
            placement[i] = Placement::Input(k as u32);
        }
    }
    // Graph outputs computed by a dispatch are written in place.
    let mut output_copies = Vec::new();
    for (k, &o) in p.outputs.iter().enumerate() {
        let s = p.storage(o);
        let is_result = matches!(p.buffer(s).kind, BufferKind::Result) && !all_writers[s.index()].is_empty();
        if is_result && placement[s.index()] == Placement::None {
            placement[s.index()] = Placement::Output(k as u32);
        } else {
            output_copies.push((s, k as u32));
        }
    }
    // Constants read by a dispatch or copied to an output.
    let mut constants: Vec<u8> = Vec::new();
    let mut needed = vec![false; nb];
    for d in &p.dispatches {
        for o in reads(d) {
            needed[p.storage(o).index()] = true;
        }
    }
    for &(s, _) in &output_copies {
        needed[s.index()] = true;
    }
    for (i, b) in p.buffers.iter().enumerate() {
        if let (BufferKind::Const(t), true) = (&b.kind, needed[i]) {
            let off = round_up(constants.len() as u64, ALIGN);
            constants.resize(off as usize, 0);
            constants.extend_from_slice(t.bytes());
            placement[i] = Placement::Constant(off);
        }
    }
    // Intermediate results in the arena; an output copied from an intermediate keeps
    // its buffer alive to the end.
    let last_wave = w.waves.len().saturating_sub(1);
    for &(s, _) in &output_copies {
        if let Some((a, _)) = lifetimes[s.index()] {
            lifetimes[s.index()] = Some((a, last_wave));
        }
    }
    // So does a data-dependent extent: the runtime reads it after the last command.
    for x in &p.extents {
        let s = p.storage(x.buffer).index();
        if let Some((a, _)) = lifetimes[s] {
            lifetimes[s] = Some((a, last_wave));
        }
    }
    // And a prologue result that a later wave reads, or that lies inside a buffer a later
    // wave writes: calls after the first find it where the prologue left it.
    if prologue_waves > 0 {
        let mut kept = vec![false; nb];
        for (di, d) in p.dispatches.iter().enumerate() {
            if elided.contains(&di) {
                continue;
            }
            if hoisted[di] {
                kept[home(d.result).index()] |= home(d.result) != p.storage(d.result);
                continue;
            }
            for o in reads(d) {
                let h = home(o);
                kept[h.index()] |= writers[h.index()].iter().any(|&x| hoisted[x]);
            }
        }
        for (s, _) in kept.iter().enumerate().filter(|&(_, &k)| k) {
            if let Some((a, _)) = lifetimes[s] {
                lifetimes[s] = Some((a, last_wave));
            }
        }
    }
    let mut arena_ids = Vec::new();
    let mut bufs = Vec::new();
    for (i, b) in p.buffers.iter().enumerate() {
        if matches!(b.kind, BufferKind::Result) && placement[i] == Placement::None {
            if let Some((first, last)) = lifetimes[i] {
                arena_ids.push(i);
                bufs.push(arena::Buffer { size: bytes(p, BufferId(i as u32)), align: ALIGN, first, last });
            }
        }
    }
    let plan = arena::plan(&bufs).map_err(StreamError::Arena)?;
    for (j, &i) in arena_ids.iter().enumerate() {
        placement[i] = Placement::Arena(plan.offsets[j]);
    }
    Ok(StreamPlan {
        waves: w.waves,
        placement,
        lifetimes,
        arena_size: round_up(plan.size, ALIGN),
        arena_lower_bound: plan.lower_bound,
        constants,
        output_copies,
        elided,
        prologue: prologue_waves,
    })
}

/// The text form of the stream level: waves with their dispatches, barriers between
/// them, every buffer with its placement and live range, the arena's size against its
/// lower bound, the output copies and the prologue's waves. Used by `kiln compile --to stream` and the
/// filetests.
///
/// ```text
/// stream @mlp {
///   wave 0 {
///     %3 = dispatch @k0_0(%0, %1) ["MatMul mm", "Relu relu"]
///   }
///   barrier
///   wave 1 { ... }
///   buffers {
///     %0 "x" f32[1,4]: input 0
///     %3 "h" f32[1,8]: arena [0, 32) live waves 0..1
///   }
///   arena 64 bytes (lower bound 32), constants 128 bytes
/// }
/// ```
pub fn print(p: &FlowProgram, plan: &StreamPlan) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "stream @{} {{", p.name);
    for (wi, wave) in plan.waves.iter().enumerate() {
        if wi > 0 {
            let _ = writeln!(s, "  barrier");
        }
        let _ = writeln!(s, "  wave {wi} {{");
        for &d in wave {
            let disp = &p.dispatches[d];
            let ops: Vec<String> = disp.operands.iter().map(|o| format!("%{}", o.0)).collect();
            let src: Vec<String> = disp.sources.iter().map(|x| format!("{x:?}")).collect();
            let guard: String =
                disp.guard.iter().map(|&(c, t)| format!(" {} %{}", if t { "when" } else { "unless" }, c.0)).collect();
            let _ = writeln!(
                s,
                "    %{} = dispatch @{}({}){guard} [{}]",
                disp.result.0,
                disp.kernel.name,
                ops.join(", "),
                src.join(", ")
            );
        }
        let _ = writeln!(s, "  }}");
    }
    let _ = writeln!(s, "  buffers {{");
    for (i, b) in p.buffers.iter().enumerate() {
        let id = BufferId(i as u32);
        let place = match (&b.kind, plan.placement[i]) {
            (BufferKind::Alias(src), _) => format!("alias of %{}", p.storage(*src).0),
            (_, Placement::None) => continue,
            (_, Placement::Input(k)) => format!("input {k}"),
            (_, Placement::Output(k)) => format!("output {k}"),
            (_, Placement::Constant(o)) => format!("constants [{o}, {})", o + bytes(p, id)),
            (_, Placement::Arena(o)) => format!("arena [{o}, {})", o + bytes(p, id)),
            (_, Placement::Within(c, o)) => format!("in %{} [{o}, {})", c.0, o + bytes(p, id)),
        };
        let live = match plan.lifetimes[i] {
            Some((a, z)) if !matches!(b.kind, BufferKind::Alias(_) | BufferKind::Const(_)) => {
                format!(" live waves {a}..{z}")
            }
            _ => String::new(),
        };
        let _ = writeln!(s, "    %{i} {:?} {}: {place}{live}", b.name, b.ty);
    }
    let _ = writeln!(s, "  }}");
    for &(src, k) in &plan.output_copies {
        let _ = writeln!(s, "  copy %{} -> output {k}", src.0);
    }
    for &d in &plan.elided {
        let _ = writeln!(s, "  in place %{} = dispatch @{}", p.dispatches[d].result.0, p.dispatches[d].kernel.name);
    }
    let _ = writeln!(
        s,
        "  arena {} bytes (lower bound {}), constants {} bytes",
        plan.arena_size,
        plan.arena_lower_bound,
        plan.constants.len()
    );
    if plan.prologue > 0 {
        let _ = writeln!(s, "  prologue: waves 0..{} run once per instance", plan.prologue - 1);
    }
    s.push_str("}\n");
    s
}
