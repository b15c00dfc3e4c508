//! Running a loaded module: the arena, and the local-sync driver that replays an entry
//! point's commands on the calling thread (with the `local-task` feature,
//! `Instance::with_threads` hands them to the local-task driver in `task.rs` instead).

use crate::error::RuntimeError;
use crate::module::LoadedModule;
use alloc::format;
use alloc::string::ToString;
use alloc::vec::Vec;
use kiln_module::program::{Binding, BoundedDesc, BoundedRows, Command, Slot};
use kiln_module::sections::{EntryView, TensorView};

/// A typed input: dtype (ONNX code), dims and bytes are all checked against the
/// signature.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'d> {
    /// ONNX dtype code.
    pub dtype: u32,
    /// Dimensions.
    pub dims: &'d [u64],
    /// Dense row-major bytes.
    pub data: &'d [u8],
}

/// A typed output buffer.
#[derive(Debug)]
pub struct TensorMut<'d> {
    /// ONNX dtype code.
    pub dtype: u32,
    /// Dimensions.
    pub dims: &'d [u64],
    /// Dense row-major bytes, written by the run.
    pub data: &'d mut [u8],
}

/// An input argument: checked against its signature entry, then read through a pointer.
pub(crate) trait InputArg {
    fn checked_ptr(&self, t: &TensorView<'_>) -> Result<*const u8, RuntimeError>;
    /// The bytes, and the dtype and dims where the argument is typed (an input with a
    /// bounded dimension takes any extent within its range along it).
    fn parts(&self) -> (&[u8], Option<(u32, &[u64])>);
}

/// An output argument.
pub(crate) trait OutputArg {
    fn checked_ptr(&mut self, t: &TensorView<'_>) -> Result<*mut u8, RuntimeError>;
}

/// Which side of a call an argument is on, for the errors that name it.
#[derive(Clone, Copy)]
enum Side {
    Input,
    Output,
}

/// Checks an argument's byte length against the signature's tensor `t`.
fn check_size(side: Side, t: &TensorView<'_>, got: usize) -> Result<(), RuntimeError> {
    if got as u64 != t.bytes {
        let (name, expected, got) = (t.name.to_string(), t.bytes, got as u64);
        return Err(match side {
            Side::Input => RuntimeError::InputSize { name, expected, got },
            Side::Output => RuntimeError::OutputSize { name, expected, got },
        });
    }
    Ok(())
}

/// Checks a typed argument (dtype code, dims, `len` bytes) against the signature's
/// tensor `t`.
fn check_typed(side: Side, t: &TensorView<'_>, dtype: u32, dims: &[u64], len: usize) -> Result<(), RuntimeError> {
    if dtype != t.dtype {
        let (name, expected, got) = (t.name.to_string(), t.dtype, dtype);
        return Err(match side {
            Side::Input => RuntimeError::InputDtype { name, expected, got },
            Side::Output => RuntimeError::OutputDtype { name, expected, got },
        });
    }
    if dims != &t.dims[..] {
        let (name, expected, got) = (t.name.to_string(), t.dims.clone(), dims.to_vec());
        return Err(match side {
            Side::Input => RuntimeError::InputShape { name, expected, got },
            Side::Output => RuntimeError::OutputShape { name, expected, got },
        });
    }
    check_size(side, t, len)
}

impl InputArg for &[u8] {
    fn checked_ptr(&self, t: &TensorView<'_>) -> Result<*const u8, RuntimeError> {
        check_size(Side::Input, t, self.len())?;
        Ok(self.as_ptr())
    }
    fn parts(&self) -> (&[u8], Option<(u32, &[u64])>) {
        (self, None)
    }
}

impl InputArg for TensorRef<'_> {
    fn checked_ptr(&self, t: &TensorView<'_>) -> Result<*const u8, RuntimeError> {
        check_typed(Side::Input, t, self.dtype, self.dims, self.data.len())?;
        Ok(self.data.as_ptr())
    }
    fn parts(&self) -> (&[u8], Option<(u32, &[u64])>) {
        (self.data, Some((self.dtype, self.dims)))
    }
}

/// The extent along its bounded dimension `b` of input argument `arg` (signature `t`):
/// the typed argument's dims, or an untyped one's bytes over the bytes of one position
/// along the axis; within `b.min..=b.bound`.
fn bounded_extent<I: InputArg>(arg: &I, t: &TensorView<'_>, b: &BoundedDesc) -> Result<u64, RuntimeError> {
    let (data, typed) = arg.parts();
    let axis = b.axis as usize;
    let numel: u64 = t.dims.iter().product();
    // Verified: whole bytes per element, no empty axis.
    let slice = t.bytes / b.bound.max(1);
    let n = match typed {
        Some((dtype, dims)) => {
            let same_rank = dims.len() == t.dims.len();
            let others_match = same_rank && dims.iter().zip(&t.dims).enumerate().all(|(a, (x, y))| a == axis || x == y);
            if dtype != t.dtype {
                return Err(RuntimeError::InputDtype { name: t.name.to_string(), expected: t.dtype, got: dtype });
            }
            if !others_match {
                return Err(RuntimeError::InputShape {
                    name: t.name.to_string(),
                    expected: t.dims.clone(),
                    got: dims.to_vec(),
                });
            }
            dims[axis]
        }
        None => {
            if numel == 0 || data.len() as u64 % slice != 0 {
                return Err(RuntimeError::InputSize {
                    name: t.name.to_string(),
                    expected: t.bytes,
                    got: data.len() as u64,
                });
            }
            data.len() as u64 / slice
        }
    };
    if n < b.min || n > b.bound {
        return Err(RuntimeError::InputExtent {
            name: t.name.to_string(),
            axis: b.axis,
            min: b.min,
            bound: b.bound,
            got: n,
        });
    }
    if data.len() as u64 != n * slice {
        return Err(RuntimeError::InputSize { name: t.name.to_string(), expected: n * slice, got: data.len() as u64 });
    }
    Ok(n)
}

/// Copies `data` (an input of extent `n` along bounded dimension `b`, signature `t`)
/// into its place in the arena at the bound shape, the positions past `n` zeroed, and
/// writes `n` as the extent.
///
/// # Safety
///
/// `arena` is this instance's arena, exclusively ours, of at least the entry's arena
/// size; `b` was verified (staging and extent inside the arena) and `n` checked by
/// [`bounded_extent`] (`data` holds `n` positions along the axis).
unsafe fn stage_bounded(arena: *mut u8, t: &TensorView<'_>, b: &BoundedDesc, data: &[u8], n: u64) {
    let axis = b.axis as usize;
    let outer: u64 = t.dims[..axis].iter().product();
    let row = (t.bytes / outer.max(1) / b.bound.max(1)) as usize; // one position's bytes
    let (n, bound) = (n as usize, b.bound as usize);
    let dst = arena.wrapping_add(b.staging.offset as usize);
    for r in 0..outer as usize {
        // SAFETY: the source row lies in `data` (n positions per outer index), the
        // destination row in the staging range (bound positions per outer index).
        unsafe {
            core::ptr::copy_nonoverlapping(data.as_ptr().add(r * n * row), dst.add(r * bound * row), n * row);
            core::ptr::write_bytes(dst.add((r * bound + n) * row), 0, (bound - n) * row);
        }
    }
    let e = (n as i64).to_le_bytes();
    // SAFETY: 8 bytes inside the arena (verified).
    unsafe { core::ptr::copy_nonoverlapping(e.as_ptr(), arena.wrapping_add(b.extent.offset as usize), 8) };
}

impl OutputArg for &mut [u8] {
    fn checked_ptr(&mut self, t: &TensorView<'_>) -> Result<*mut u8, RuntimeError> {
        check_size(Side::Output, t, self.len())?;
        Ok(self.as_mut_ptr())
    }
}

impl OutputArg for TensorMut<'_> {
    fn checked_ptr(&mut self, t: &TensorView<'_>) -> Result<*mut u8, RuntimeError> {
        check_typed(Side::Output, t, self.dtype, self.dims, self.data.len())?;
        Ok(self.data.as_mut_ptr())
    }
}

/// Where each slot of one invocation starts in memory (for a heterogeneous plan, one per
/// device: the arena is the device's own).
#[derive(Clone, Copy)]
pub(crate) struct Bases<'a> {
    pub(crate) arena: *mut u8,
    constants: *mut u8,
    inputs: &'a [*const u8],
    outputs: &'a [*mut u8],
}

/// Runs commands `range` of `entry` (none a `SkipIf`, a collective or a `Segment`) one
/// by one on the calling thread, as device `device` of a heterogeneous plan: arena
/// bindings resolve against `bases[device]`, a transfer's against its devices' bases.
///
/// # Safety
///
/// `bases` are a checked invocation's, one per device of the program; the entry passed
/// the verifier (its segment checks included); nothing else touches the memory the
/// commands write meanwhile.
pub(crate) unsafe fn run_commands(
    m: &LoadedModule<'_>,
    entry: &EntryView<'_>,
    range: core::ops::Range<usize>,
    device: u32,
    bases: &[Bases<'_>],
    table: &mut [*mut u8],
) {
    let Some(own) = bases.get(device as usize) else { return };
    for i in range {
        let Some(c) = entry.commands.get(i) else { return };
        match c {
            Command::Dispatch { kernel, workgroups, bindings, .. } => {
                for (slot, b) in table.iter_mut().zip(bindings) {
                    *slot = own.at(b);
                }
                let f = m.kernels[*kernel as usize];
                let workgroups = m.workgroups(*kernel, *workgroups);
                if workgroups > 0 {
                    // SAFETY: as in `Instance::run`: the variant chosen for this host,
                    // every binding inside memory live for the call (the device's arena,
                    // the constants, the host's inputs and outputs), only the last written.
                    unsafe { run_range(f, table.as_ptr(), m.helpers.as_ptr(), 0, workgroups, None) };
                }
            }
            Command::Transfer { src_device, src, dst_device, dst } => {
                let (Some(from), Some(to)) = (bases.get(*src_device as usize), bases.get(*dst_device as usize)) else {
                    return;
                };
                // SAFETY: both ranges are `src.length` bytes (verified) inside their
                // devices' memories; distinct devices' arenas never overlap.
                unsafe { core::ptr::copy(from.at(src).cast_const(), to.at(dst), src.length as usize) };
            }
            // SAFETY: the caller's contract.
            Command::Copy { .. } | Command::Fill { .. } => unsafe { transfer(c, own) },
            _ => {}
        }
    }
}

/// Most devices a heterogeneous plan may name (checked by the verifier).
pub(crate) const MAX_HETERO_DEVICES: usize = 8;

/// The bounded rows (format 1.7) of command `i` of `entry`, with the extent the call
/// passed along their dimension: `None` for a dispatch that runs every workgroup, and
/// where the variant this host runs has its own workgroup count (`workgroups`, not the
/// plan's `recorded`), whose split the plan does not describe.
///
/// # Safety
///
/// `bases` are a checked invocation's whose bounded inputs are staged (their extents
/// written, within `min..=bound`).
pub(crate) unsafe fn rows_of(
    entry: &kiln_module::sections::EntryView<'_>,
    i: usize,
    workgroups: u64,
    recorded: u64,
    bases: &Bases<'_>,
) -> Option<(BoundedRows, u64)> {
    if entry.bounded_rows.is_empty() || workgroups != recorded {
        return None;
    }
    let r = command_rows(&entry.bounded_rows, i)?;
    let b = entry.bounded.get(r.dim as usize)?;
    // SAFETY: the caller's contract.
    Some((*r, unsafe { staged_extent(&b.extent, b.bound, bases) }))
}

/// The bounded rows of command `i` in an entry's list, which the verifier checked is in
/// ascending command order.
pub(crate) fn command_rows(list: &[BoundedRows], i: usize) -> Option<&BoundedRows> {
    let k = list.binary_search_by_key(&i, |r| r.command as usize).ok()?;
    list.get(k)
}

/// The extent a call passed along a bounded dimension, from its `extent` binding
/// (clamped into `0..=bound`, which the staging checked already).
///
/// # Safety
///
/// As [`rows_of`]: `extent` is a verified 8-byte arena binding, written by the staging.
pub(crate) unsafe fn staged_extent(extent: &Binding, bound: u64, bases: &Bases<'_>) -> u64 {
    // SAFETY: 8 bytes inside the arena (verified), written when the input was staged.
    let raw = unsafe { core::slice::from_raw_parts(bases.at(extent).cast_const(), 8) };
    let mut x = [0u8; 8];
    x.copy_from_slice(raw);
    (i64::from_le_bytes(x).max(0) as u64).min(bound)
}

/// The workgroups a dispatch of `workgroups` runs this call: with bounded rows at
/// extent `n`, those of the steps before `n` ([`BoundedRows::active`]).
pub(crate) fn active(workgroups: u64, rows: Option<(BoundedRows, u64)>) -> u64 {
    match rows {
        Some((r, n)) => r.active(n),
        None => workgroups,
    }
}

/// Runs workgroups `begin..end` of the numbering [`active`] counts: with bounded rows,
/// each piece that is contiguous in the kernel's own numbering in one call.
///
/// # Safety
///
/// As a kernel call over `begin..end` of its workgroups (see `Instance::run`).
pub(crate) unsafe fn run_range(
    f: crate::KernelFn,
    table: *const *mut u8,
    helpers: *const kiln_module::abi::HelperFn,
    mut begin: u64,
    end: u64,
    rows: Option<(BoundedRows, u64)>,
) {
    let Some((r, n)) = rows else {
        // SAFETY: the caller's contract.
        unsafe { f(table, helpers, begin, end) };
        return;
    };
    while begin < end {
        let (at, run) = r.map(begin, n);
        let len = run.min(end - begin);
        if len == 0 {
            return;
        }
        // SAFETY: the caller's contract; `at..at + len` lies inside the kernel's
        // workgroups (`outer × span × inner`, checked by the verifier).
        unsafe { f(table, helpers, at, at + len) };
        begin += len;
    }
}

impl Bases<'_> {
    /// The address of binding `b`'s first byte.
    pub(crate) fn at(&self, b: &Binding) -> *mut u8 {
        let base = match b.slot {
            Slot::Arena => self.arena,
            Slot::Constants => self.constants,
            // Inputs are only read (the verifier rejects writes to them).
            Slot::Input(i) => self.inputs[i as usize].cast_mut(),
            Slot::Output(i) => self.outputs[i as usize],
        };
        base.wrapping_add(b.offset as usize)
    }
}

/// `pat` repeated over `dst` from its start (the last copy cut short).
fn repeat(dst: &mut [u8], pat: &[u8]) {
    for chunk in dst.chunks_mut(pat.len()) {
        chunk.copy_from_slice(&pat[..chunk.len()]);
    }
}

/// Runs a copy, a fill or a collective on the calling thread (dispatches and barriers are the
/// driver's; they are ignored here).
///
/// # Safety
///
/// `bases` are those of a checked invocation of the entry point `c` belongs to (see
/// `Instance::run`), and nothing else reads or writes the destination meanwhile.
pub(crate) unsafe fn transfer(c: &Command, bases: &Bases<'_>) {
    match c {
        Command::Copy { src, dst } => {
            // SAFETY: both ranges are `src.length` bytes (verified equal) inside their
            // slots; the destination is the arena or an output, memory we may write and
            // to which no reference is live; `copy` allows overlap.
            unsafe { core::ptr::copy(bases.at(src).cast_const(), bases.at(dst), src.length as usize) };
        }
        Command::Fill { dst, pattern, pattern_len } => {
            // SAFETY: the range lies inside the arena or an output (verified), memory we
            // may write and to which no other reference is live.
            let out = unsafe { core::slice::from_raw_parts_mut(bases.at(dst), dst.length as usize) };
            let bytes = pattern.to_le_bytes();
            let pat = &bytes[..(*pattern_len as usize).min(8)];
            if let [b] = pat {
                out.fill(*b);
            } else {
                // The pattern repeated to 8 bytes, written a word at a time where the
                // range is word-aligned relative to its start (lengths are multiples of
                // the pattern, itself 2, 4 or 8 bytes, a divisor of 8).
                let mut word = [0u8; 8];
                repeat(&mut word, pat);
                // SAFETY: every bit pattern is a valid u64.
                let (head, words, tail) = unsafe { out.align_to_mut::<u64>() };
                if head.len() % pat.len() == 0 && 8 % pat.len() == 0 {
                    // (The words and the tail start at multiples of the pattern.)
                    repeat(head, pat);
                    words.fill(u64::from_ne_bytes(word));
                    repeat(tail, pat);
                } else {
                    repeat(out, pat);
                }
            }
        }
        Command::AllReduce { parts, .. } => {
            // SAFETY: verified: every range lies inside its slot, all have one length
            // (whole f32 elements), destinations are writable and overlap no source
            // and no other destination.
            unsafe { crate::collective::all_reduce_f32(parts, bases) };
        }
        Command::AllGather { outer, parts } => {
            // SAFETY: as for the all-reduce, with the all-gather's lengths verified.
            unsafe { crate::collective::all_gather(*outer, parts, bases) };
        }
        Command::Dispatch { .. }
        | Command::Barrier
        | Command::SkipIf { .. }
        | Command::Segment { .. }
        | Command::Transfer { .. } => {}
    }
}

/// Whether a `SkipIf` condition holds: any byte of `cond` nonzero.
///
/// # Safety
///
/// As [`transfer`]: `bases` are a checked invocation's, and `cond` (verified: 1 to 8
/// bytes inside its slot) was written by earlier commands that have completed.
pub(crate) unsafe fn condition(cond: &Binding, bases: &Bases<'_>) -> bool {
    // SAFETY: the range lies inside a live slot (verified) that no command writes while
    // the plan evaluates the condition (commands before it have completed).
    let bytes = unsafe { core::slice::from_raw_parts(bases.at(cond).cast_const(), cond.length as usize) };
    bytes.iter().any(|&b| b != 0)
}

enum Arena<'m> {
    Owned { buf: Vec<u8>, start: usize },
    Borrowed(&'m mut [u8]),
}

/// One execution context of a module: its arena and the driver's scratch tables,
/// allocated once. Invocations on one instance run one at a time.
///
/// [`Instance::new`] runs every command on the calling thread (the local-sync driver);
/// `Instance::with_threads` (feature `local-task`) starts a fixed pool of worker
/// threads that share every dispatch's workgroups with the calling thread (the
/// local-task driver, `task.rs`). Independent instances may also run on different
/// threads.
pub struct Instance<'m> {
    module: &'m LoadedModule<'m>,
    arena: Arena<'m>,
    /// The binding table a dispatch hands its kernel.
    table: Vec<*mut u8>,
    inputs: Vec<*const u8>,
    outputs: Vec<*mut u8>,
    /// Each output's actual dims after the last invocation (its signature's dims, with a
    /// data-dependent extent where format 1.5 says one sizes it); capacity reserved once.
    output_dims: Vec<Vec<u64>>,
    /// The local-task driver, when the instance runs on more than one thread.
    #[cfg(feature = "local-task")]
    task: Option<crate::task::LocalTask<'m>>,
    /// A heterogeneous plan's devices after the host: each one's arena (aligned as the
    /// entry asks) and queue; its segments, found again each call without allocating.
    devices: Vec<(Vec<u8>, usize)>,
    queues: Vec<crate::hetero::Queue<'m>>,
    segments: Vec<crate::hetero::SegmentAt>,
    /// The entry whose instantiation prologue (format 1.9) the arena holds the results
    /// of: its later calls start after the prologue. `None` until an entry with a
    /// prologue has run, and again after one without has used the arena.
    primed: Option<usize>,
}

impl core::fmt::Debug for Instance<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Instance")
            .field("module", self.module)
            .field("threads", &self.threads())
            .finish_non_exhaustive()
    }
}

impl<'m> Instance<'m> {
    fn with(module: &'m LoadedModule<'m>, arena: Arena<'m>) -> Result<Instance<'m>, RuntimeError> {
        let l = module.verified.limits;
        // A heterogeneous plan's other devices: an arena each (the largest over the
        // entries), and room for every segment.
        let entries = &module.verified.program.entries;
        let n = entries.iter().map(|e| e.device_arenas.len()).max().unwrap_or(0);
        let mut devices = Vec::with_capacity(n);
        for d in 0..n {
            // A device of another kind keeps its arena in its own memory (its queue's).
            let table = &module.verified.program.devices;
            let cpu = table.get(d + 1).is_some_and(|x| x.kind == kiln_module::program::DeviceKind::Cpu);
            let size = match cpu {
                true => entries.iter().filter_map(|e| e.device_arenas.get(d)).copied().max().unwrap_or(0),
                false => 0,
            };
            let align = l.arena_align.max(1);
            // Verified: the size and the alignment fit usize together.
            let total = size.checked_add(align).ok_or(RuntimeError::ArenaAlloc { bytes: size })? as usize;
            let mut buf = Vec::new();
            buf.try_reserve_exact(total).map_err(|_| RuntimeError::ArenaAlloc { bytes: size })?;
            buf.resize(total, 0u8);
            let start = buf.as_ptr().align_offset(align as usize);
            if start >= align as usize {
                return Err(RuntimeError::ArenaAlloc { bytes: size });
            }
            devices.push((buf, start));
        }
        let segs = entries
            .iter()
            .map(|e| e.commands.iter().filter(|c| matches!(c, Command::Segment { .. })).count())
            .max()
            .unwrap_or(0);
        Ok(Instance {
            devices,
            queues: crate::hetero::queues(module, segs)?,
            segments: Vec::with_capacity(segs),
            primed: None,
            module,
            arena,
            table: alloc::vec![core::ptr::null_mut(); l.max_bindings],
            inputs: alloc::vec![core::ptr::null(); l.max_inputs],
            outputs: alloc::vec![core::ptr::null_mut(); l.max_outputs],
            output_dims: (0..l.max_outputs).map(|_| Vec::with_capacity(l.max_rank)).collect(),
            #[cfg(feature = "local-task")]
            task: None,
        })
    }

    /// An instance with an arena from the global allocator (zeroed, aligned as the
    /// module asks), allocated here and never again.
    pub fn new(module: &'m LoadedModule<'m>) -> Result<Instance<'m>, RuntimeError> {
        let l = module.verified.limits;
        // Verified: the size fits usize and the alignment is a power of two ≤ 4096.
        let (size, align) = (l.arena_size as usize, l.arena_align as usize);
        let total = size.checked_add(align - 1).ok_or(RuntimeError::ArenaAlloc { bytes: l.arena_size })?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(total).map_err(|_| RuntimeError::ArenaAlloc { bytes: l.arena_size })?;
        // Before the first touch, which is what decides the page size.
        #[cfg(feature = "std")]
        crate::pages::prefer_huge_pages(buf.as_ptr(), buf.capacity());
        buf.resize(total, 0u8);
        let start = buf.as_ptr().align_offset(align);
        if start > align - 1 {
            return Err(RuntimeError::ArenaAlloc { bytes: l.arena_size });
        }
        Instance::with(module, Arena::Owned { buf, start })
    }

    /// An instance whose arena is `memory` (at least the module's arena size, aligned as
    /// it asks: see [`LoadedModule::limits`]).
    pub fn with_arena(module: &'m LoadedModule<'m>, memory: &'m mut [u8]) -> Result<Instance<'m>, RuntimeError> {
        let l = module.verified.limits;
        if (memory.len() as u64) < l.arena_size {
            return Err(RuntimeError::ArenaTooSmall { needed: l.arena_size, got: memory.len() as u64 });
        }
        if !(memory.as_ptr() as usize).is_multiple_of(l.arena_align as usize) {
            return Err(RuntimeError::ArenaMisaligned { align: l.arena_align, address: memory.as_ptr() as usize });
        }
        Instance::with(module, Arena::Borrowed(memory))
    }

    /// An instance whose invocations run on `threads` threads: the calling one and
    /// `threads − 1` workers started here, which live (asleep when idle) until the
    /// instance is dropped. One thread is [`Instance::new`]'s local-sync driver; zero, or
    /// more than [`crate::MAX_THREADS`], is an error.
    ///
    /// Workers are `std` threads with 8 MiB stacks (a main thread's usual size; generated
    /// kernels keep their scratch, such as packed blocks of a contraction, on the stack).
    #[cfg(feature = "local-task")]
    pub fn with_threads(module: &'m LoadedModule<'m>, threads: usize) -> Result<Instance<'m>, RuntimeError> {
        Instance::new(module)?.threaded(threads)
    }

    /// [`Instance::new`] with every allocation it makes (the arena, the binding table)
    /// from `allocator` ([`crate::memory`]).
    #[cfg(feature = "std")]
    pub fn new_in(
        module: &'m LoadedModule<'m>,
        allocator: &'static dyn crate::memory::Allocator,
    ) -> Result<Instance<'m>, RuntimeError> {
        crate::memory::within(allocator, || Instance::new(module))
    }

    /// [`Instance::with_threads`] with every allocation it makes (the arena, the tables,
    /// the schedules, the worker threads' bookkeeping, and whatever the workers
    /// allocate while they live) from `allocator` ([`crate::memory`]).
    #[cfg(feature = "local-task")]
    pub fn with_threads_in(
        module: &'m LoadedModule<'m>,
        threads: usize,
        allocator: &'static dyn crate::memory::Allocator,
    ) -> Result<Instance<'m>, RuntimeError> {
        crate::memory::within(allocator, || Instance::with_threads(module, threads))
    }

    /// [`Instance::with_arena`] on `threads` threads (see [`Instance::with_threads`]).
    #[cfg(feature = "local-task")]
    pub fn with_arena_and_threads(
        module: &'m LoadedModule<'m>,
        memory: &'m mut [u8],
        threads: usize,
    ) -> Result<Instance<'m>, RuntimeError> {
        Instance::with_arena(module, memory)?.threaded(threads)
    }

    #[cfg(feature = "local-task")]
    fn threaded(mut self, threads: usize) -> Result<Instance<'m>, RuntimeError> {
        if threads == 0 {
            return Err(RuntimeError::Threads { threads, why: "at least one thread is needed".to_string() });
        }
        if threads > crate::MAX_THREADS {
            return Err(RuntimeError::Threads {
                threads,
                why: format!("at most {} are supported", crate::MAX_THREADS),
            });
        }
        if threads > 1 {
            self.task = Some(crate::task::LocalTask::new(self.module, threads)?);
        }
        Ok(self)
    }

    /// Threads an invocation runs on, the calling one included.
    pub fn threads(&self) -> usize {
        #[cfg(feature = "local-task")]
        if let Some(t) = &self.task {
            return t.threads();
        }
        1
    }

    /// The module this instance runs.
    pub fn module(&self) -> &'m LoadedModule<'m> {
        self.module
    }

    /// Runs entry point `main`: `inputs` and `outputs` in signature order, each exactly
    /// its tensor's byte size. Allocates nothing, and on several threads starts none:
    /// the instance's workers run their shares and wait for the next call.
    pub fn invoke(&mut self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), RuntimeError> {
        let main = self.module.main.ok_or_else(|| RuntimeError::NoSuchEntry { entry: "main".to_string() })?;
        self.run(main, inputs, outputs, None, false)
    }

    /// Runs entry point `main` as [`Instance::invoke`] does, calling `after(i)` on the
    /// calling thread as soon as a step has completed; a profiler reads its clock there,
    /// and the time between two calls is one step's. Allocates nothing itself.
    /// - [`Observe::Commands`]: on the calling thread alone whatever the instance's
    ///   thread count; a step is command `i` of the entry's plan.
    /// - [`Observe::Waves`]: on the instance's threads; a step is a wave (with `i` the
    ///   plan index of its last dispatch), a copy or a fill, the wait for the slowest
    ///   thread included. With one thread every command is a step.
    pub fn invoke_observed(
        &mut self,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
        steps: Observe,
        after: &mut dyn FnMut(usize),
    ) -> Result<(), RuntimeError> {
        let main = self.module.main.ok_or_else(|| RuntimeError::NoSuchEntry { entry: "main".to_string() })?;
        self.run(main, inputs, outputs, Some(after), steps == Observe::Commands)
    }

    /// Runs entry point `entry` (an index into [`LoadedModule::signature`]).
    pub fn invoke_entry(
        &mut self,
        entry: usize,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), RuntimeError> {
        self.run(entry, inputs, outputs, None, false)
    }

    /// Runs entry point `entry` with typed tensors: dtypes and shapes are checked too.
    pub fn invoke_tensors(
        &mut self,
        entry: usize,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
    ) -> Result<(), RuntimeError> {
        self.run(entry, inputs, outputs, None, false)
    }

    /// `observe`: call it after each command (see [`Instance::invoke_observed`]), or,
    /// unless `on_this_thread`, after each step of the local-task driver where the
    /// instance has one ([`Instance::invoke_observed`] with [`Observe::Waves`]).
    fn run<I: InputArg, O: OutputArg>(
        &mut self,
        index: usize,
        inputs: &[I],
        outputs: &mut [O],
        observe: Option<&mut dyn FnMut(usize)>,
        on_this_thread: bool,
    ) -> Result<(), RuntimeError> {
        let m = self.module;
        let entries = &m.verified.program.entries;
        let entry = entries.get(index).ok_or_else(|| RuntimeError::NoSuchEntry { entry: format!("#{index}") })?;
        if inputs.len() != entry.inputs.len() {
            return Err(RuntimeError::InputCount {
                entry: entry.name.to_string(),
                expected: entry.inputs.len(),
                got: inputs.len(),
            });
        }
        if outputs.len() != entry.outputs.len() {
            return Err(RuntimeError::OutputCount {
                entry: entry.name.to_string(),
                expected: entry.outputs.len(),
                got: outputs.len(),
            });
        }
        for (i, (arg, t)) in inputs.iter().zip(&entry.inputs).enumerate() {
            match entry.bounded.iter().find(|b| b.input as usize == i) {
                // Checked here, staged below once the arena is at hand.
                Some(b) => _ = bounded_extent(arg, t, b)?,
                None => self.inputs[i] = arg.checked_ptr(t)?,
            }
        }
        for (i, (arg, t)) in outputs.iter_mut().zip(&entry.outputs).enumerate() {
            self.outputs[i] = arg.checked_ptr(t)?;
        }
        // From here on nothing is checked: the verifier proved at load that every
        // binding lies inside its slot (arena ≥ the entry's arena size, constants, and
        // inputs/outputs of exactly their signature's size, checked just above), every
        // kernel index is in range, copies have equal lengths and fills a valid width.
        let arena = self.arena_base();
        for b in &entry.bounded {
            let i = b.input as usize;
            let n = bounded_extent(&inputs[i], &entry.inputs[i], b)?;
            // SAFETY: the arena is exclusively ours and verified to hold `b`'s ranges;
            // `n` was checked against the argument just above.
            unsafe { stage_bounded(arena, &entry.inputs[i], b, inputs[i].parts().0, n) };
            // No binding names the input's slot, but should one, it reads the staging.
            self.inputs[i] = arena.wrapping_add(b.staging.offset as usize).cast_const();
        }
        // Kernels and commands never write the constants (the verifier rejects it).
        let constants = m.pool.bytes().as_ptr().cast_mut();
        let bases = Bases { arena, constants, inputs: &self.inputs, outputs: &self.outputs };
        // The instantiation prologue (format 1.9): its commands read no input, so what
        // they leave in the arena stays valid until another entry's commands use it.
        // Run once for this arena state, on the instance's threads, not observed; every
        // call after starts behind it.
        let mut local = Local {
            module: m,
            table: &mut self.table,
            #[cfg(feature = "local-task")]
            task: self.task.as_mut(),
        };
        // SAFETY: as the commands below: `bases` are this checked invocation's and the
        // verifier proved the prologue binds no input or output.
        let from = unsafe { local.prime(&mut self.primed, index, entry, &bases) }?;
        if matches!(entry.commands.first(), Some(Command::Segment { .. })) {
            // A heterogeneous plan (verified): every device's bases, then the segments.
            let mut all = [bases; MAX_HETERO_DEVICES];
            for (d, (buf, start)) in self.devices.iter_mut().enumerate() {
                let slot = all.get_mut(d + 1).ok_or(RuntimeError::Hetero { device: d as u32 + 1 })?;
                slot.arena = buf.as_mut_ptr().wrapping_add(*start);
            }
            let count = self.devices.len() + 1;
            crate::hetero::segments_of(entry, &mut self.segments);
            let mut exec = crate::hetero::Exec {
                index,
                module: m,
                entry,
                bases: &all[..count],
                table: &mut self.table,
                #[cfg(feature = "local-task")]
                task: if on_this_thread { None } else { self.task.as_mut() },
            };
            // SAFETY: `all` are this checked invocation's bases, each device's arena
            // exclusively ours; the entry passed the verifier's segment checks.
            unsafe { crate::hetero::run(&mut exec, &self.segments, &mut self.queues, observe) }?;
            // SAFETY: every command has completed; `bases` are this invocation's.
            return unsafe { finish_extents(entry, &bases, &mut self.output_dims) };
        }
        let n = entry.commands.len();
        let mut local = Local {
            module: m,
            table: &mut self.table,
            #[cfg(feature = "local-task")]
            task: if on_this_thread { None } else { self.task.as_mut() },
        };
        #[cfg(not(feature = "local-task"))]
        let _ = on_this_thread;
        // SAFETY: `bases` are this checked invocation's, the arena is exclusively ours,
        // and the caller's buffers stay borrowed until we return; the prologue, where
        // the plan has one, has run for this arena.
        unsafe { local.run(index, entry, &bases, from..n, observe) }?;
        // SAFETY: every command has completed; `bases` are this invocation's.
        unsafe { finish_extents(entry, &bases, &mut self.output_dims) }
    }

    /// Runs entry `entry`'s instantiation prologue (format 1.9) now, unless the arena
    /// holds its results already: what the entry computes from constants alone, which
    /// its first call would otherwise run before its own work. Call it once after making
    /// the instance for every call, the first included, to take the same time (the C
    /// API, the Python package and `kiln-run` do, for `main`). Nothing to do for an entry
    /// without a prologue; running another entry afterwards uses the arena, and the next
    /// call of this one runs the prologue again.
    pub fn prepare(&mut self, entry: usize) -> Result<(), RuntimeError> {
        let m = self.module;
        let e = m
            .verified
            .program
            .entries
            .get(entry)
            .ok_or_else(|| RuntimeError::NoSuchEntry { entry: format!("#{entry}") })?;
        let arena = self.arena_base();
        let constants = m.pool.bytes().as_ptr().cast_mut();
        // (The prologue binds no input or output: those tables are not read.)
        let bases = Bases { arena, constants, inputs: &self.inputs, outputs: &self.outputs };
        let mut local = Local {
            module: m,
            table: &mut self.table,
            #[cfg(feature = "local-task")]
            task: self.task.as_mut(),
        };
        // SAFETY: the arena is exclusively ours; the verifier proved that the prologue's
        // bindings lie in the arena and the constants.
        unsafe { local.prime(&mut self.primed, entry, e, &bases) }.map(|_| ())
    }

    /// The arena's first byte (aligned as the module asks: checked when it was made).
    fn arena_base(&mut self) -> *mut u8 {
        match &mut self.arena {
            Arena::Owned { buf, start } => buf.as_mut_ptr().wrapping_add(*start),
            Arena::Borrowed(b) => b.as_mut_ptr(),
        }
    }

    /// The dims of output `k` of the last invocation: its signature's, except along an
    /// axis a data-dependent extent sizes (format 1.5), where the extent the data needed
    /// (the output's elements are then compacted to these dims at the front of its
    /// buffer). Empty before the first invocation; `None` past the outputs.
    pub fn output_dims(&self, k: usize) -> Option<&[u64]> {
        self.output_dims.get(k).map(|d| d.as_slice())
    }
}

/// What runs a plan without segments: the module, the binding table a dispatch hands
/// its kernel, and the local-task driver where the commands run on several threads.
struct Local<'a, 'm> {
    module: &'m LoadedModule<'m>,
    table: &'a mut [*mut u8],
    #[cfg(feature = "local-task")]
    task: Option<&'a mut crate::task::LocalTask<'m>>,
}

impl<'m> Local<'_, 'm> {
    /// Runs the instantiation prologue of entry `index` (`entry`) unless `primed` says
    /// the arena holds its results, and returns the command each call starts at.
    ///
    /// # Safety
    ///
    /// As [`Local::run`] for the prologue's commands.
    unsafe fn prime(
        &mut self,
        primed: &mut Option<usize>,
        index: usize,
        entry: &kiln_module::sections::EntryView<'m>,
        bases: &Bases<'_>,
    ) -> Result<usize, RuntimeError> {
        let prologue = entry.prologue as usize;
        if *primed == Some(index) {
            return Ok(prologue);
        }
        *primed = None;
        if prologue > 0 {
            // SAFETY: the caller's contract.
            unsafe { self.run(index, entry, bases, 0..prologue, None) }?;
            *primed = Some(index);
        }
        Ok(prologue)
    }

    /// Runs commands `range` of entry `index` (`entry`, a plan without segments): on the
    /// local-task driver where there is one, else one by one on the calling thread;
    /// `observe` as in `Instance::run`.
    ///
    /// # Safety
    ///
    /// `bases` are those of a checked invocation of `entry` (as in `Instance::run`),
    /// the arena exclusively the instance's, the caller's buffers borrowed until this returns; the
    /// commands before `range` that it depends on have completed.
    unsafe fn run(
        &mut self,
        index: usize,
        entry: &kiln_module::sections::EntryView<'m>,
        bases: &Bases<'_>,
        range: core::ops::Range<usize>,
        mut observe: Option<&mut dyn FnMut(usize)>,
    ) -> Result<(), RuntimeError> {
        let m = self.module;
        #[cfg(not(feature = "local-task"))]
        let _ = index;
        #[cfg(feature = "local-task")]
        if let Some(task) = &mut self.task {
            // SAFETY: the caller's contract.
            return unsafe { task.run_range(index, range, bases, m.helpers.as_ptr(), observe) };
        }
        let mut i = range.start;
        while let Some(c) = entry.commands.get(i).filter(|_| i < range.end) {
            let mut next = i + 1;
            match c {
                Command::Dispatch { kernel, workgroups, bindings, .. } => {
                    for (slot, b) in self.table.iter_mut().zip(bindings) {
                        *slot = bases.at(b);
                    }
                    let f = m.kernels[*kernel as usize];
                    let recorded = *workgroups;
                    let workgroups = m.workgroups(*kernel, recorded);
                    // SAFETY: the bounded inputs are staged (above).
                    let rows = unsafe { rows_of(entry, i, workgroups, recorded, bases) };
                    let workgroups = active(workgroups, rows);
                    if workgroups > 0 {
                        // SAFETY: `f` is the entry point of the variant chosen for this
                        // host, in code the loader placed and keeps mapped while `m`
                        // lives. `table` holds one pointer per binding, each to a range
                        // the verifier proved lies inside memory that lives for this
                        // call: the arena (exclusively ours), the constants, or the
                        // caller's inputs and outputs. Per the kernel ABI the kernel
                        // touches only those ranges and writes only its last binding,
                        // which is never an input or the constants.
                        unsafe { run_range(f, self.table.as_ptr(), m.helpers.as_ptr(), 0, workgroups, rows) };
                    }
                }
                Command::Barrier => {}
                // SAFETY: `bases` are this checked invocation's; commands run one by one.
                Command::Copy { .. } | Command::Fill { .. } | Command::AllReduce { .. } | Command::AllGather { .. } => unsafe {
                    transfer(c, bases)
                },
                // (Only in heterogeneous plans, run above.)
                Command::Segment { .. } | Command::Transfer { .. } => {}
                Command::SkipIf { cond, value, count } => {
                    // SAFETY: as above; every earlier command has completed.
                    if unsafe { condition(cond, bases) } == *value {
                        // (Verified: the skip ends inside the plan.)
                        next += *count as usize;
                    }
                }
            }
            if let Some(after) = observe.as_mut() {
                after(i);
            }
            i = next;
        }
        Ok(())
    }
}

/// After the commands of `entry`: every data-dependent extent checked against its bound
/// ([`RuntimeError::ExtentOutOfBound`]), each output's actual dims into `dims`, and each
/// output an extent sizes compacted in place (row-major at the actual dims, at the front
/// of the caller's buffer). Allocates nothing.
///
/// # Safety
///
/// `bases` are a checked invocation's whose commands have all completed; the extents'
/// bindings were verified (8 bytes inside the arena) and every output they size has the
/// bound along its axis.
unsafe fn finish_extents(
    entry: &kiln_module::sections::EntryView<'_>,
    bases: &Bases<'_>,
    dims: &mut [Vec<u64>],
) -> Result<(), RuntimeError> {
    let read = |x: &kiln_module::sections::ExtentView<'_>| {
        // SAFETY: 8 bytes inside the arena (verified), written by completed commands.
        let raw = unsafe { core::slice::from_raw_parts(bases.at(&x.binding).cast_const(), 8) };
        let mut b = [0u8; 8];
        b.copy_from_slice(raw);
        i64::from_le_bytes(b)
    };
    // SAFETY: the caller's outputs, written by completed commands (see above).
    unsafe { apply_extents(entry, read, |o| Some(bases.outputs[o]), dims) }
}

/// The extents' checks and the outputs' compaction of [`finish_extents`], for any driver:
/// `read` gives each extent's value (the `i64` the plan wrote at its binding), `output`
/// the host address of output `k` to compact (`None`: report dims only, the output
/// stays at the bound layout). Allocates nothing.
///
/// # Safety
///
/// Each address `output` gives is writable for its tensor's bytes and not otherwise accessed
/// during the call; every output an extent sizes has the bound along its axis (verified).
pub(crate) unsafe fn apply_extents(
    entry: &kiln_module::sections::EntryView<'_>,
    mut read: impl FnMut(&kiln_module::sections::ExtentView<'_>) -> i64,
    output: impl Fn(usize) -> Option<*mut u8>,
    dims: &mut [Vec<u64>],
) -> Result<(), RuntimeError> {
    for (k, t) in entry.outputs.iter().enumerate() {
        if let Some(d) = dims.get_mut(k) {
            d.clear();
            d.extend_from_slice(&t.dims);
        }
    }
    for x in &entry.extents {
        let n = read(x);
        if x.bound == 0 && x.outputs.is_empty() && n != 0 {
            // A shape check (kiln_ir::dynamic): the count of axes that differ.
            return Err(RuntimeError::ShapeCheck { name: x.name.to_string(), axes: n });
        }
        if n < 0 || n as u64 > x.bound {
            return Err(RuntimeError::ExtentOutOfBound { name: x.name.to_string(), extent: n, bound: x.bound });
        }
        for &(o, axis) in &x.outputs {
            let (o, axis) = (o as usize, axis as usize);
            let t = &entry.outputs[o];
            if let Some(d) = dims.get_mut(o) {
                d[axis] = n as u64;
            }
            let numel: u64 = t.dims.iter().product();
            let Some(base) = output(o) else { continue };
            if numel == 0 || n as u64 == x.bound {
                continue;
            }
            let elem = (t.bytes / numel) as usize;
            let outer: u64 = t.dims[..axis].iter().product();
            let inner = t.dims[axis + 1..].iter().product::<u64>() as usize * elem;
            let (n, bound) = (n as usize, x.bound as usize);
            for r in 0..outer as usize {
                // SAFETY: both ranges lie inside output `o` (dims verified: `bound` along
                // `axis`, `n ≤ bound`); the destination never passes the source, so
                // rows copied earlier are not read again.
                unsafe { core::ptr::copy(base.add(r * bound * inner), base.add(r * n * inner), n * inner) };
            }
        }
    }
    Ok(())
}

/// The steps [`Instance::invoke_observed`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Observe {
    /// Every command of the plan, run one at a time on the calling thread.
    Commands,
    /// Every wave, copy and fill, run on the instance's threads.
    Waves,
}
