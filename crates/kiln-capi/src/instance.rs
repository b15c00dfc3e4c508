//! `kiln_instance`: an execution context of a module (its arena, worker threads and
//! input/output buffers), the ways to hand it inputs and take its outputs, and invoke.

use crate::error::{guard, guard_void, non_null, Error};
use crate::module::{kiln_module, module_ref};
use crate::{kiln_allocator, kiln_status};
use kiln_runtime::{Instance, LoadedModule};
use std::alloc::Layout;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

/// Alignment of the instance's own input and output buffers.
const BUFFER_ALIGN: usize = 64;

/// An execution context of a module: its arena, its worker threads, and a buffer per
/// input and output. Opaque; created by `kiln_instance_create*`, released by
/// `kiln_instance_free`. Used by one thread at a time (any thread: it may move between
/// threads between calls); instances of one module run independently.
pub struct kiln_instance {
    // Fields drop in declaration order: `inst` borrows the arena (`arena`) and the
    // module (`module`), so it comes first and they come last.
    /// The runtime's instance, its lifetime erased to `'static`.
    ///
    /// SAFETY (of the erasure): it borrows `module.owned`'s module, which lives in the `Arc` this
    /// instance holds (`module`, dropped after `inst`; the module is never modified),
    /// and the arena memory `arena` owns (or the caller's, which `kiln_instance_create_in`
    /// requires to outlive the instance), never used by anything else and released only
    /// when `arena` drops, after `inst`. No reference with the erased lifetime leaves
    /// this struct.
    inst: Instance<'static>,
    inputs: Vec<Input>,
    outputs: Vec<Output>,
    /// Argument lists for the runtime, filled and emptied within each invoke (their
    /// capacity reserved at creation, so that invoke allocates nothing). Empty between
    /// calls: the `'static` is never observed.
    in_args: Vec<&'static [u8]>,
    out_args: Vec<&'static mut [u8]>,
    /// Whether the last invoke succeeded (its output shapes are then reported).
    invoked: bool,
    /// The arena's memory when the instance allocated it or the caller lent it (kept
    /// for its drop, which releases it after `inst`).
    _arena: Mem,
    module: Arc<kiln_module>,
}

struct Input {
    /// The instance's own buffer (`set_input` copies here, `input_buffer` hands it out).
    own: Mem,
    /// The caller's buffer, read in place at invoke (`bind_input`).
    bound: Option<NonNull<u8>>,
    /// Whether the input has a value (set, handed out or bound).
    ready: bool,
    /// Its byte length: the signature's, or a bounded input's at the extent set.
    len: usize,
}

struct Output {
    own: Mem,
    /// The caller's buffer, written in place at invoke (`bind_output`).
    bound: Option<NonNull<u8>>,
}

/// A block of memory and who releases it.
struct Mem {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
    from: Source,
}

enum Source {
    /// Zero bytes: a dangling, aligned pointer; nothing to release.
    Empty,
    /// The global allocator, with layout `(len, align)`.
    Global,
    /// The caller's allocator.
    Hook(kiln_allocator),
    /// The caller's memory (`kiln_instance_create_in`): theirs to release.
    Caller,
}

impl Mem {
    /// `len` zeroed bytes aligned to `align` (a power of two), from `hook` or the global
    /// allocator.
    fn alloc(len: usize, align: usize, hook: Option<&kiln_allocator>) -> Result<Mem, Error> {
        let layout = Layout::from_size_align(len, align)
            .map_err(|_| Error::arg(format!("a block of {len} bytes aligned to {align} cannot be allocated")))?;
        if len == 0 {
            // An address that is a multiple of `align` and never dereferenced.
            let ptr = NonNull::new(std::ptr::without_provenance_mut(align)).unwrap_or(NonNull::dangling());
            return Ok(Mem { ptr, len, align, from: Source::Empty });
        }
        let oom = || Error::new(kiln_status::OutOfMemory, format!("cannot allocate {len} bytes"));
        let Some(hook) = hook else {
            // SAFETY: `layout` has a non-zero size.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            return Ok(Mem { ptr: NonNull::new(p).ok_or_else(oom)?, len, align, from: Source::Global });
        };
        let (Some(alloc), Some(_)) = (hook.alloc, hook.free) else {
            return Err(Error::arg("the allocator's `alloc` or `free` is NULL"));
        };
        // SAFETY: the caller's allocator, called as `kiln_allocator` documents.
        let p = unsafe { alloc(hook.ctx, len, align) }.cast::<u8>();
        let ptr = NonNull::new(p).ok_or_else(|| oom().context("the allocator returned NULL"))?;
        let m = Mem { ptr, len, align, from: Source::Hook(*hook) };
        if !(p as usize).is_multiple_of(align) {
            // (Dropping `m` gives the block back.)
            return Err(Error::arg(format!("the allocator returned {p:p} for {len} bytes, not aligned to {align}")));
        }
        // SAFETY: `len` bytes the allocator just gave us.
        unsafe { std::ptr::write_bytes(p, 0, len) };
        Ok(m)
    }

    /// The bytes, as a slice whose lifetime the caller chooses.
    ///
    /// # Safety
    ///
    /// The slice is not used after `self` drops, nor while a `&mut` from `bytes_mut` is.
    unsafe fn bytes<'a>(&self) -> &'a [u8] {
        // SAFETY: `len` initialised bytes (zeroed at allocation, or the caller's) or an
        // empty slice at an aligned, non-null address; the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes to write, as a slice whose lifetime the caller chooses.
    ///
    /// # Safety
    ///
    /// As `Mem::bytes`, and no other slice of these bytes is used meanwhile.
    unsafe fn bytes_mut<'a>(&self) -> &'a mut [u8] {
        // SAFETY: as in `bytes`; exclusive by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        match &self.from {
            Source::Empty | Source::Caller => {}
            Source::Global => {
                // SAFETY: allocated by `alloc_zeroed` with this layout (checked valid then).
                unsafe {
                    std::alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, self.align))
                };
            }
            Source::Hook(h) => {
                if let Some(free) = h.free {
                    // SAFETY: a block the same allocator returned for this size and
                    // alignment, released once.
                    unsafe { free(h.ctx, self.ptr.as_ptr().cast(), self.len, self.align) };
                }
            }
        }
    }
}

/// Where an instance's arena comes from.
enum ArenaFrom<'a> {
    /// The runtime allocates it (global allocator, huge pages where available).
    Runtime,
    /// The caller's memory.
    Caller(*mut u8, usize),
    /// The caller's allocator.
    Hook(&'a kiln_allocator),
}

/// Thread count for `threads` (0: one per core).
fn thread_count(threads: usize) -> Result<usize, Error> {
    let n = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    if n > kiln_runtime::MAX_THREADS {
        return Err(Error::arg(format!("{n} threads asked for, at most {} are supported", kiln_runtime::MAX_THREADS)));
    }
    Ok(n)
}

impl kiln_instance {
    /// # Safety
    ///
    /// For `ArenaFrom::Caller(p, len)`: `p` is null or points to `len` writable bytes
    /// that nothing else uses until the instance is dropped.
    unsafe fn create(module: Arc<kiln_module>, threads: usize, arena: ArenaFrom<'_>) -> Result<kiln_instance, Error> {
        let threads = thread_count(threads)?;
        // SAFETY: see `kiln_instance::inst`: the module stays in the `Arc` this instance
        // holds until after the runtime instance is dropped.
        let loaded: &'static LoadedModule<'static> = unsafe { &*std::ptr::from_ref(module.owned.module()).cast() };
        let limits = loaded.verified().limits();
        // Verified at load: fits usize, alignment a power of two ≤ 4096.
        let (size, align) = (limits.arena_size as usize, limits.arena_align as usize);
        let (mut inst, arena) = match arena {
            ArenaFrom::Runtime => {
                let empty = Mem::alloc(0, 1, None)?;
                (Instance::with_threads(loaded, threads)?, empty)
            }
            ArenaFrom::Caller(p, len) => {
                let p = NonNull::new(p).ok_or_else(|| Error::arg("`arena` is NULL"))?;
                if len < size {
                    return Err(Error::arg(format!("arena of {len} bytes given, the module needs {size}")));
                }
                if !(p.as_ptr() as usize).is_multiple_of(align) {
                    return Err(Error::arg(format!(
                        "arena at {p:p} is not aligned to {align} bytes as the module needs"
                    )));
                }
                // SAFETY: the caller's `len` writable bytes; zeroed so that the bytes are
                // initialised whatever the caller left there (the arena is scratch).
                unsafe { std::ptr::write_bytes(p.as_ptr(), 0, len) };
                Mem { ptr: p, len, align, from: Source::Caller }.into_instance(loaded, threads)?
            }
            ArenaFrom::Hook(h) => Mem::alloc(size, align, Some(h))?.into_instance(loaded, threads)?,
        };
        // What the plan computes from constants alone (its instantiation prologue) runs
        // here, so that the first call takes as long as every other.
        if let Some(main) = loaded.signature().find("main") {
            inst.prepare(main.index)?;
        }
        let hook = match &arena.from {
            Source::Hook(h) => Some(*h),
            _ => None,
        };
        let mut inputs = Vec::with_capacity(module.inputs.len());
        for t in &module.inputs {
            let own = Mem::alloc(t.bytes, BUFFER_ALIGN, hook.as_ref())?;
            inputs.push(Input { own, bound: None, ready: false, len: t.bytes });
        }
        let mut outputs = Vec::with_capacity(module.outputs.len());
        for t in &module.outputs {
            outputs.push(Output { own: Mem::alloc(t.bytes, BUFFER_ALIGN, hook.as_ref())?, bound: None });
        }
        Ok(kiln_instance {
            inst,
            in_args: Vec::with_capacity(inputs.len()),
            out_args: Vec::with_capacity(outputs.len()),
            invoked: false,
            inputs,
            outputs,
            _arena: arena,
            module,
        })
    }

    fn input(&mut self, index: usize) -> Result<(&mut Input, &crate::module::Tensor), Error> {
        let n = self.inputs.len();
        match (self.inputs.get_mut(index), self.module.inputs.get(index)) {
            (Some(i), Some(t)) => Ok((i, t)),
            _ => Err(Error::arg(format!("input index {index} is out of range (the module has {n} inputs)"))),
        }
    }

    fn output(&mut self, index: usize) -> Result<(&mut Output, &crate::module::Tensor), Error> {
        let n = self.outputs.len();
        match (self.outputs.get_mut(index), self.module.outputs.get(index)) {
            (Some(o), Some(t)) => Ok((o, t)),
            _ => Err(Error::arg(format!("output index {index} is out of range (the module has {n} outputs)"))),
        }
    }

    /// Runs the module's entry point on the inputs as set or bound, into the outputs'
    /// buffers. Allocates nothing.
    fn invoke(&mut self) -> Result<(), Error> {
        for (i, (input, t)) in self.inputs.iter().zip(&self.module.inputs).enumerate() {
            if !input.ready {
                return Err(Error::arg(format!(
                    "input {} (#{i}) has no value: set it with kiln_instance_set_input, kiln_instance_bind_input or kiln_instance_input_buffer",
                    t.name()
                )));
            }
        }
        self.check_overlaps()?;
        self.in_args.clear();
        self.out_args.clear();
        for input in &self.inputs {
            let bytes = match input.bound {
                // SAFETY: the caller's buffer of the input's byte size (checked at bind),
                // valid and unwritten during invoke per `kiln_instance_bind_input`.
                Some(p) => unsafe { std::slice::from_raw_parts(p.as_ptr().cast_const(), input.len) },
                // SAFETY: our buffer; used only within this call, no `&mut` to it exists
                // (outputs do not overlap it, checked above).
                None => unsafe { &input.own.bytes()[..input.len] },
            };
            self.in_args.push(bytes);
        }
        for (output, t) in self.outputs.iter().zip(&self.module.outputs) {
            let bytes = match output.bound {
                // SAFETY: the caller's buffer of the output's byte size (checked at bind),
                // not used by anything else during invoke per `kiln_instance_bind_output`,
                // and overlapping no other argument (checked above).
                Some(p) => unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), t.bytes) },
                // SAFETY: our buffer, this call's only slice of it (checked above).
                None => unsafe { output.own.bytes_mut() },
            };
            self.out_args.push(bytes);
        }
        let r = self.inst.invoke_entry(self.module.entry, &self.in_args, &mut self.out_args);
        self.in_args.clear();
        self.out_args.clear();
        self.invoked = r.is_ok();
        r.map_err(Error::from)
    }

    /// Each output's buffer overlaps no other input's or output's.
    fn check_overlaps(&self) -> Result<(), Error> {
        let range = |own: &Mem, bound: Option<NonNull<u8>>, len: usize| {
            let start = bound.map_or(own.ptr.as_ptr() as usize, |p| p.as_ptr() as usize);
            (start, start.saturating_add(len))
        };
        let ins = self.inputs.iter().zip(&self.module.inputs).map(|(i, t)| (range(&i.own, i.bound, i.len), t));
        let outs = self.outputs.iter().zip(&self.module.outputs).map(|(o, t)| (range(&o.own, o.bound, t.bytes), t));
        for (oi, ((a0, a1), ot)) in outs.clone().enumerate() {
            for (j, ((b0, b1), t)) in ins.clone().chain(outs.clone()).enumerate() {
                let same = j == self.inputs.len() + oi;
                if !same && a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1 {
                    return Err(Error::arg(format!(
                        "the buffer bound to output {} overlaps the buffer of {} {}",
                        ot.name(),
                        if j < self.inputs.len() { "input" } else { "output" },
                        t.name()
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Mem {
    /// The runtime instance whose arena is this block, and the block.
    fn into_instance(
        self,
        loaded: &'static LoadedModule<'static>,
        threads: usize,
    ) -> Result<(Instance<'static>, Mem), Error> {
        // SAFETY: the block outlives the runtime instance (see `kiln_instance::inst`),
        // and nothing else touches it meanwhile.
        let memory: &'static mut [u8] = unsafe { self.bytes_mut() };
        let inst = Instance::with_arena_and_threads(loaded, memory, threads)?;
        Ok((inst, self))
    }
}

/// The instance behind a handle, borrowed for the call.
///
/// # Safety
///
/// `inst` is null or a live handle, not used by another thread during the call.
unsafe fn instance_mut<'a>(inst: *mut kiln_instance) -> Result<&'a mut kiln_instance, Error> {
    non_null(inst, "instance")?;
    // SAFETY: a live handle is `Box::into_raw` of a `kiln_instance`, used by one thread
    // at a time.
    Ok(unsafe { &mut *inst })
}

/// Input `index` of `inst`, about to take the caller's `len` bytes at `data`: what
/// `kiln_instance_set_input` and `kiln_instance_bind_input` check first (`data` not
/// null, a live instance, the index in range, `len` the input's byte size).
///
/// # Safety
///
/// `inst` is a live instance handle (or null).
unsafe fn caller_input<'a>(
    inst: *mut kiln_instance,
    index: usize,
    data: *const c_void,
    len: usize,
) -> Result<&'a mut Input, Error> {
    non_null(data, "data")?;
    // SAFETY: the caller's contract.
    let inst = unsafe { instance_mut(inst)? };
    let (input, t) = inst.input(index)?;
    match t.bounded {
        Some(b) => bounded_size_check(t, b, len)?,
        None => size_check("input", t, len)?,
    }
    input.len = len;
    Ok(input)
}

/// `len` bytes as input `t` with bounded dimension `(axis, min, bound)`: a whole number
/// of positions along the axis, `min..=bound` of them.
fn bounded_size_check(
    t: &crate::module::Tensor,
    (axis, min, bound): (usize, u64, u64),
    len: usize,
) -> Result<(), Error> {
    let per = t.bytes as u64 / bound.max(1);
    let n = (len as u64).checked_div(per).unwrap_or(0);
    if per == 0 || !(len as u64).is_multiple_of(per) || n < min || n > bound {
        return Err(Error::arg(format!(
            "input {} takes {min}..={bound} positions of {per} bytes along its bounded axis {axis} ({} to {} bytes), got {len} bytes",
            t.name(),
            min * per,
            bound * per
        )));
    }
    Ok(())
}

/// What `kiln_instance_input_buffer` and `kiln_instance_output` share: checks that
/// `data` and `len` are not null, then writes to them the buffer `pick` chooses (a
/// pointer and its byte size) in the instance.
///
/// # Safety
///
/// `inst` is a live instance handle (or null); `data` and `len` are writable (or null).
unsafe fn hand_out<P>(
    inst: *mut kiln_instance,
    data: *mut P,
    len: *mut usize,
    pick: impl FnOnce(&mut kiln_instance) -> Result<(P, usize), Error>,
) -> Result<(), Error> {
    non_null(data, "data")?;
    non_null(len, "len")?;
    // SAFETY: the caller's contract.
    let inst = unsafe { instance_mut(inst)? };
    let (p, bytes) = pick(inst)?;
    // SAFETY: both checked not null; writable per the contract.
    unsafe {
        *data = p;
        *len = bytes;
    }
    Ok(())
}

/// The common body of the `kiln_instance_create*` functions.
///
/// # Safety
///
/// `m` is a live module handle, `out` writable; for `ArenaFrom::Caller`, see
/// `kiln_instance::create`.
unsafe fn create(
    m: *const kiln_module,
    threads: usize,
    arena: ArenaFrom<'_>,
    out: *mut *mut kiln_instance,
) -> Result<(), Error> {
    non_null(out, "out")?;
    // SAFETY: the caller's contract.
    unsafe { module_ref(m)? };
    // SAFETY: a live handle is `Arc::into_raw` of an `Arc<kiln_module>`: take one more
    // reference for the instance.
    let module = unsafe {
        Arc::increment_strong_count(m);
        Arc::from_raw(m)
    };
    // SAFETY: the caller's contract.
    let inst = unsafe { kiln_instance::create(module, threads, arena)? };
    // SAFETY: `out` checked above.
    unsafe { *out = Box::into_raw(Box::new(inst)) };
    Ok(())
}

/// Creates an instance of `m` running on `threads` threads (the calling one and
/// `threads − 1` workers started here, asleep between invocations; 0 means one per
/// core), with its arena allocated by the runtime. The instance keeps the module alive.
/// What the plan computes from constants alone (its instantiation prologue: weights
/// written as constant fills, say) runs here, once, so that every call takes its own
/// time only; the other constructors do the same.
/// On success `*out` is the instance, to release with `kiln_instance_free`.
///
/// # Safety
///
/// `m` is a live module handle, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_create(
    m: *const kiln_module,
    threads: usize,
    out: *mut *mut kiln_instance,
) -> kiln_status {
    // SAFETY: the caller's contract.
    guard("kiln_instance_create", || unsafe { create(m, threads, ArenaFrom::Runtime, out) })
}

/// `kiln_instance_create` with the arena in caller-provided memory: `arena_len` ≥
/// `kiln_module_arena_size`, `arena` aligned to `kiln_module_arena_align`. The memory is
/// zeroed here and then belongs to the instance until `kiln_instance_free`; the caller
/// releases it after that. The instance's input and output buffers, its tables and its
/// workers still come from the system allocator (see
/// `kiln_instance_create_with_allocator` to route the buffers elsewhere).
///
/// # Safety
///
/// `m` is a live module handle, `out` writable; `arena` points to `arena_len` writable
/// bytes that nothing else reads or writes until the instance is freed.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_create_in(
    m: *const kiln_module,
    arena: *mut c_void,
    arena_len: usize,
    threads: usize,
    out: *mut *mut kiln_instance,
) -> kiln_status {
    guard("kiln_instance_create_in", || {
        // SAFETY: the caller's contract.
        unsafe { create(m, threads, ArenaFrom::Caller(arena.cast(), arena_len), out) }
    })
}

/// `kiln_instance_create` with the instance's large blocks from `allocator`: the arena
/// (`kiln_module_arena_size` bytes aligned to `kiln_module_arena_align`) and one buffer
/// per input and per output (their byte sizes, aligned to 64), allocated here and
/// released by `kiln_instance_free`. Not through it: the instance's small tables (a few
/// pointers per input, output and kernel binding) and, with `threads` > 1, the worker
/// threads and their stacks, which the runtime takes from the system allocator; and the
/// module's own memory (its copy of the artifact, decoded tables and executable code
/// pages), allocated at load. `allocator` is copied: it need not outlive the call, but
/// its `ctx` must stay valid until the instance is freed.
///
/// # Safety
///
/// `m` is a live module handle, `allocator` points to a `kiln_allocator` whose functions
/// behave as documented there, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_create_with_allocator(
    m: *const kiln_module,
    allocator: *const kiln_allocator,
    threads: usize,
    out: *mut *mut kiln_instance,
) -> kiln_status {
    guard("kiln_instance_create_with_allocator", || {
        non_null(allocator, "allocator")?;
        // SAFETY: checked not null; readable per the contract.
        let a = unsafe { *allocator };
        // SAFETY: the caller's contract.
        unsafe { create(m, threads, ArenaFrom::Hook(&a), out) }
    })
}

/// Releases an instance (stopping its workers) and the memory it allocated; the
/// module is released too if its handle was freed and this was its last instance.
/// NULL is ignored.
///
/// # Safety
///
/// `inst` is NULL or a live instance handle, not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_free(inst: *mut kiln_instance) {
    guard_void("kiln_instance_free", || {
        if !inst.is_null() {
            // SAFETY: a live handle is `Box::into_raw` of a `kiln_instance`, released once.
            drop(unsafe { Box::from_raw(inst) });
        }
    })
}

/// Sets `*threads` to the number of threads the instance's invocations run on.
///
/// # Safety
///
/// `inst` is a live instance handle, `threads` writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_threads(inst: *mut kiln_instance, threads: *mut usize) -> kiln_status {
    guard("kiln_instance_threads", || {
        non_null(threads, "threads")?;
        // SAFETY: the caller's contract.
        let inst = unsafe { instance_mut(inst)? };
        // SAFETY: checked not null; writable per the contract.
        unsafe { *threads = inst.inst.threads() };
        Ok(())
    })
}

fn size_check(what: &str, t: &crate::module::Tensor, len: usize) -> Result<(), Error> {
    if len != t.bytes {
        return Err(Error::arg(format!("{what} {} must be {} bytes, got {len}", t.name(), t.bytes)));
    }
    Ok(())
}

/// Copies `len` bytes (exactly the input's byte size, dense row-major in its dtype)
/// into the instance's buffer for input `index`; the caller's buffer may be reused on
/// return. Replaces a binding. An input with a bounded dimension (compiled with
/// `--input-shape NAME=..MIN..MAX..`) takes any whole number of positions along that
/// axis within its range: `len` is then the bytes of the tensor at that extent, and
/// the outputs that carry the dimension come back at it (`kiln_instance_output_shape`).
///
/// # Safety
///
/// `inst` is a live instance handle; `data` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_set_input(
    inst: *mut kiln_instance,
    index: usize,
    data: *const c_void,
    len: usize,
) -> kiln_status {
    guard("kiln_instance_set_input", || {
        // SAFETY: the caller's contract.
        let input = unsafe { caller_input(inst, index, data, len)? };
        // SAFETY: `len` readable bytes (the contract) into our buffer of `len` bytes;
        // `copy` allows the caller to pass our own buffer back.
        unsafe { std::ptr::copy(data.cast::<u8>(), input.own.ptr.as_ptr(), len) };
        input.bound = None;
        input.ready = true;
        Ok(())
    })
}

/// Binds input `index` to the caller's buffer without copying: every later invoke reads
/// `data` in place. `len` must be the input's byte size (a bounded input's at any
/// extent in its range, as for `kiln_instance_set_input`). Any alignment works; 64-byte
/// alignment is fastest. Replaces an earlier value or binding.
///
/// # Safety
///
/// `inst` is a live instance handle; `data` points to `len` readable bytes that stay
/// valid, and are not written during `kiln_instance_invoke`, for as long as the binding
/// is in place (until the input is set or bound again, or the instance freed).
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_bind_input(
    inst: *mut kiln_instance,
    index: usize,
    data: *const c_void,
    len: usize,
) -> kiln_status {
    guard("kiln_instance_bind_input", || {
        // SAFETY: the caller's contract.
        let input = unsafe { caller_input(inst, index, data, len)? };
        input.bound = NonNull::new(data.cast::<u8>().cast_mut());
        input.ready = true;
        Ok(())
    })
}

/// Hands out the instance's own buffer for input `index` (64-byte aligned, its byte
/// size in `*len`) to fill in place: the zero-copy way to feed an input without keeping
/// a buffer of one's own. Replaces a binding; the input counts as set from now on.
/// The pointer stays valid until the instance is freed.
///
/// # Safety
///
/// `inst` is a live instance handle; `data` and `len` are writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_input_buffer(
    inst: *mut kiln_instance,
    index: usize,
    data: *mut *mut c_void,
    len: *mut usize,
) -> kiln_status {
    guard("kiln_instance_input_buffer", || {
        // SAFETY: the caller's contract.
        unsafe {
            hand_out(inst, data, len, |inst| {
                let (input, t) = inst.input(index)?;
                input.bound = None;
                input.ready = true;
                // (A bounded input filled in place is at its bound.)
                input.len = t.bytes;
                Ok((input.own.ptr.as_ptr().cast(), t.bytes))
            })
        }
    })
}

/// Binds output `index` to the caller's buffer: every later invoke writes the output
/// there directly. `len` must be the output's byte size; the buffer must not overlap
/// any other input's or output's (checked at invoke). `data` NULL with `len` 0 removes
/// the binding (the instance's own buffer is written again).
///
/// # Safety
///
/// `inst` is a live instance handle; `data` points to `len` writable bytes that stay
/// valid, and are not otherwise read or written during `kiln_instance_invoke`, for as
/// long as the binding is in place.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_bind_output(
    inst: *mut kiln_instance,
    index: usize,
    data: *mut c_void,
    len: usize,
) -> kiln_status {
    guard("kiln_instance_bind_output", || {
        if data.is_null() && len != 0 {
            return Err(Error::arg(format!("`data` is NULL but `len` is {len}")));
        }
        // SAFETY: the caller's contract.
        let inst = unsafe { instance_mut(inst)? };
        let (output, t) = inst.output(index)?;
        if !data.is_null() {
            size_check("output buffer", t, len)?;
        }
        output.bound = NonNull::new(data.cast::<u8>());
        Ok(())
    })
}

/// Sets `*data` and `*len` to output `index`'s bytes as the last successful invoke
/// wrote them (zeros before the first): the caller's buffer if the output is bound,
/// else the instance's own (64-byte aligned), read in place without a copy. The pointer
/// stays valid, and its bytes change at each invoke, until the output is bound again or
/// the instance freed.
///
/// # Safety
///
/// `inst` is a live instance handle; `data` and `len` are writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_output(
    inst: *mut kiln_instance,
    index: usize,
    data: *mut *const c_void,
    len: *mut usize,
) -> kiln_status {
    guard("kiln_instance_output", || {
        // SAFETY: the caller's contract.
        unsafe {
            hand_out(inst, data, len, |inst| {
                let (output, t) = inst.output(index)?;
                let p = output.bound.unwrap_or(output.own.ptr);
                Ok((p.as_ptr().cast_const().cast(), t.bytes))
            })
        }
    })
}

/// Sets `*rank` and `*dims` to output `index`'s shape as the last successful invoke
/// left it: its signature's dims, except along an axis whose extent depends on the data
/// (a result of NonZero, Compress, Unique, NonMaxSuppression, TopK with a run-time K,
/// or derived from one), where the actual extent; the output's bytes are then that
/// shape, row-major, at the front of its buffer (whose size is the bound's). Before the
/// first invoke, the signature's dims. `*dims` stays valid until the next invoke or the
/// instance is freed.
///
/// # Safety
///
/// `inst` is a live instance handle; `rank` and `dims` are writable.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_output_shape(
    inst: *mut kiln_instance,
    index: usize,
    rank: *mut usize,
    dims: *mut *const u64,
) -> kiln_status {
    guard("kiln_instance_output_shape", || {
        non_null(rank, "rank")?;
        non_null(dims, "dims")?;
        // SAFETY: the caller's contract.
        let inst = unsafe { instance_mut(inst)? };
        let inst: &kiln_instance = inst;
        let n = inst.module.outputs.len();
        let sig = inst
            .module
            .outputs
            .get(index)
            .ok_or_else(|| Error::arg(format!("output index {index} is out of range (the module has {n} outputs)")))?
            .dims();
        let got = inst.inst.output_dims(index).filter(|d| d.len() == sig.len() && inst.invoked).unwrap_or(sig);
        // SAFETY: both checked not null; writable per the contract.
        unsafe {
            *rank = got.len();
            *dims = got.as_ptr();
        }
        Ok(())
    })
}

/// Runs the module's entry point (`main`, else its first) on the inputs as set or
/// bound, writing every output to its buffer. Every input must have a value. Allocates
/// nothing; with several threads, the instance's workers share the work and the call
/// returns when all is done.
///
/// # Safety
///
/// `inst` is a live instance handle; bound buffers are as their binding functions
/// require.
#[no_mangle]
pub unsafe extern "C" fn kiln_instance_invoke(inst: *mut kiln_instance) -> kiln_status {
    guard("kiln_instance_invoke", || {
        // SAFETY: the caller's contract.
        let inst = unsafe { instance_mut(inst)? };
        inst.invoke()
    })
}
