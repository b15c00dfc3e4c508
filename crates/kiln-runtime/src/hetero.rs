//! The heterogeneous executor: a plan whose commands are grouped into per-device
//! segments (format 1.8, `kiln compile --devices cpu,cuda`) replayed with every device
//! behind a [`SegmentQueue`].
//!
//! ```text
//! host (device 0)   runs its segments on the calling thread, in plan order; before one
//!                   it waits for the other devices' segments the plan says it waits for
//! device d ≥ 1      a queue: segments are submitted in plan order and run behind the
//!                   host's back (a CUDA stream; here a deferred CPU device), each after
//!                   the segments of other devices it waits for
//! end of invoke     the host waits for every queue to drain
//! ```
//!
//! Segments of one device run in plan order (a queue is in-order); the plan's waits
//! are the only order between devices. Since the host submits in plan order and runs its
//! own segments at once, a device segment waiting for a host segment finds it complete
//! when it is submitted; a host segment waiting for a device segment blocks on that
//! device's queue; a device segment waiting for another device's segment is submitted
//! once that one has completed (the host waits for it first; a CUDA queue could chain
//! the two streams with an event instead).
//!
//! [`DeferredCpu`] is the queue of a CPU device other than the host: a device with its
//! own arena whose segments run only when someone waits for them (or at the end of the
//! call). A plan missing a wait therefore reads stale memory on it, as it would on a
//! GPU, which makes the CPU-only split test a test of the plan's waits and transfers.

use crate::error::RuntimeError;
use crate::instance::{run_commands, Bases};
use crate::module::LoadedModule;
use alloc::vec::Vec;
use kiln_module::program::{Binding, Command};
use kiln_module::sections::EntryView;

/// One segment of a heterogeneous plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentAt {
    /// The device it runs on.
    pub device: u32,
    /// Index of its first command (after the `Segment` command).
    pub first: usize,
    /// Its command count.
    pub count: usize,
}

/// What a queue needs to run a segment: the module, the entry, every device's bases.
pub(crate) struct Exec<'a, 'm> {
    /// The entry's index in the program.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub index: usize,
    pub module: &'m LoadedModule<'m>,
    pub entry: &'m EntryView<'m>,
    /// Per device, the bases its commands resolve against.
    pub bases: &'a [Bases<'a>],
    /// The binding table a dispatch fills.
    pub table: &'a mut [*mut u8],
    /// The instance's local-task driver, which runs the host's segments' waves on its
    /// threads (`None`: on the calling thread alone).
    #[cfg(feature = "local-task")]
    pub task: Option<&'a mut crate::task::LocalTask<'m>>,
}

/// A device other than the host: an in-order queue of segments.
pub(crate) trait SegmentQueue {
    /// Queues segment `seg` (plan-order index) behind those queued before. The segments
    /// of other devices it waits for have completed.
    ///
    /// # Safety
    ///
    /// `exec` is a checked invocation's, valid until [`SegmentQueue::wait`] returns for
    /// this segment.
    unsafe fn submit(&mut self, seg: u32, at: SegmentAt, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError>;
    /// Returns once segment `seg` (and every segment queued before it) has completed;
    /// `u32::MAX`: every segment queued.
    ///
    /// # Safety
    ///
    /// As [`SegmentQueue::submit`], with the `exec` of the same invocation.
    unsafe fn wait(&mut self, seg: u32, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError>;
    /// Copies `src` of this device's memory to host memory at `dst` (a host segment's
    /// transfer from this device; the plan waited for the segment that wrote it).
    ///
    /// # Safety
    ///
    /// `dst` is writable for `src.length` bytes; `src` a verified binding of this
    /// device; `exec` as above.
    unsafe fn read(&mut self, src: &Binding, dst: *mut u8, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError>;
    /// Copies `src.length` host bytes at `src` into `dst` of this device's memory, once
    /// everything queued has completed (a host segment's transfer to this device).
    ///
    /// # Safety
    ///
    /// `src` is readable for `dst.length` bytes; `dst` a verified binding of this
    /// device; `exec` as above.
    unsafe fn write(&mut self, dst: &Binding, src: *const u8, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError>;
}

/// A CPU device beside the host, with its own arena: segments are held until waited
/// for, then run on the calling thread (see the module documentation). A read from its
/// memory does not run held segments: a plan that reads without waiting reads stale
/// bytes, as it would from a GPU.
#[derive(Debug)]
pub(crate) struct DeferredCpu {
    device: u32,
    pending: Vec<(u32, SegmentAt)>,
}

impl DeferredCpu {
    /// Device `device`'s queue, holding up to `segments` segments without allocating.
    pub(crate) fn new(device: u32, segments: usize) -> DeferredCpu {
        DeferredCpu { device, pending: Vec::with_capacity(segments) }
    }
}

impl SegmentQueue for DeferredCpu {
    unsafe fn submit(&mut self, seg: u32, at: SegmentAt, _exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        self.pending.push((seg, at));
        Ok(())
    }

    unsafe fn wait(&mut self, seg: u32, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        let n = self.pending.iter().take_while(|(s, _)| *s <= seg).count();
        for &(_, at) in &self.pending[..n] {
            // SAFETY: the caller's contract; segments run in plan order.
            unsafe {
                run_commands(exec.module, exec.entry, at.first..at.first + at.count, at.device, exec.bases, exec.table)
            };
        }
        self.pending.drain(..n);
        Ok(())
    }

    unsafe fn read(&mut self, src: &Binding, dst: *mut u8, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        let own = exec.bases.get(self.device as usize).ok_or(RuntimeError::Hetero { device: self.device })?;
        // SAFETY: the caller's contract; distinct devices' memories never overlap.
        unsafe { core::ptr::copy(own.at(src).cast_const(), dst, src.length as usize) };
        Ok(())
    }

    unsafe fn write(&mut self, dst: &Binding, src: *const u8, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        // SAFETY: the caller's contract.
        unsafe { self.wait(u32::MAX, exec) }?;
        let own = exec.bases.get(self.device as usize).ok_or(RuntimeError::Hetero { device: self.device })?;
        // SAFETY: as for `read`.
        unsafe { core::ptr::copy(src, own.at(dst), dst.length as usize) };
        Ok(())
    }
}

/// The queue of one device after the host.
pub(crate) enum Queue<'m> {
    /// A CPU device with its own arena.
    Cpu(DeferredCpu),
    /// A CUDA device: a stream, a graph per segment, an event per segment.
    #[cfg(feature = "cuda")]
    Cuda(alloc::boxed::Box<crate::cuda::hetero::CudaQueue<'m>>),
    #[doc(hidden)]
    #[allow(dead_code)]
    Never(core::marker::PhantomData<&'m ()>),
}

impl Queue<'_> {
    fn get(&mut self) -> Result<&mut dyn SegmentQueue, RuntimeError> {
        match self {
            Queue::Cpu(q) => Ok(q),
            #[cfg(feature = "cuda")]
            Queue::Cuda(q) => Ok(&mut **q),
            Queue::Never(_) => Err(RuntimeError::Hetero { device: u32::MAX }),
        }
    }
}

/// The queues of `module`'s devices after the host, for an instance: a deferred CPU
/// queue per CPU device, a CUDA queue per CUDA device (feature `cuda`; without it, or
/// without a driver, a typed error).
pub(crate) fn queues<'m>(module: &'m LoadedModule<'m>, segments: usize) -> Result<Vec<Queue<'m>>, RuntimeError> {
    let p = &module.verified.program;
    if !p.entries.iter().any(|e| !e.device_arenas.is_empty()) {
        return Ok(Vec::new());
    }
    let mut out = Vec::with_capacity(p.devices.len().saturating_sub(1));
    for (d, dev) in p.devices.iter().enumerate().skip(1) {
        out.push(match dev.kind {
            kiln_module::program::DeviceKind::Cpu => Queue::Cpu(DeferredCpu::new(d as u32, segments)),
            #[cfg(feature = "cuda")]
            kiln_module::program::DeviceKind::Cuda => {
                // The n-th CUDA device of the table is GPU n.
                let gpu = p.devices[1..d].iter().filter(|x| x.kind == kiln_module::program::DeviceKind::Cuda).count();
                let q = crate::cuda::hetero::CudaQueue::new(module, d as u32, gpu)?;
                Queue::Cuda(alloc::boxed::Box::new(q))
            }
            #[cfg(not(feature = "cuda"))]
            kiln_module::program::DeviceKind::Cuda => return Err(RuntimeError::Hetero { device: d as u32 }),
        });
    }
    Ok(out)
}

/// The segments of `entry` (verified heterogeneous) into `out` (cleared first).
pub(crate) fn segments_of(entry: &EntryView<'_>, out: &mut Vec<SegmentAt>) {
    out.clear();
    let mut i = 0;
    while let Some(Command::Segment { device, count, .. }) = entry.commands.get(i) {
        out.push(SegmentAt { device: *device, first: i + 1, count: *count as usize });
        i += *count as usize + 1;
    }
}

/// A host segment's commands `range` but its transfers, on the calling thread.
///
/// # Safety
///
/// As [`run`].
unsafe fn host_work(exec: &mut Exec<'_, '_>, range: core::ops::Range<usize>) {
    for i in range {
        if !matches!(exec.entry.commands.get(i), Some(Command::Transfer { .. })) {
            // SAFETY: the caller's contract.
            unsafe { run_commands(exec.module, exec.entry, i..i + 1, 0, exec.bases, exec.table) };
        }
    }
}

/// A host segment's transfers in `range` into the host (`inbound`) or out of it, each
/// through the other device's queue.
///
/// # Safety
///
/// As [`run`].
unsafe fn host_transfers(
    exec: &mut Exec<'_, '_>,
    range: core::ops::Range<usize>,
    queues: &mut [Queue<'_>],
    inbound: bool,
) -> Result<(), RuntimeError> {
    for i in range {
        let Some(Command::Transfer { src_device, src, dst_device, dst }) = exec.entry.commands.get(i) else { continue };
        if (*dst_device == 0) != inbound {
            continue;
        }
        let host = exec.bases[0];
        let other = if inbound { *src_device } else { *dst_device };
        let q = queues.get_mut((other as usize).wrapping_sub(1)).ok_or(RuntimeError::Hetero { device: other })?;
        if inbound {
            // SAFETY: the caller's contract: `dst` a verified host binding.
            unsafe { q.get()?.read(src, host.at(dst), exec) }?;
        } else {
            // SAFETY: as above, `src` a verified host binding.
            unsafe { q.get()?.write(dst, host.at(src).cast_const(), exec) }?;
        }
    }
    Ok(())
}

/// Runs a heterogeneous entry: host segments here, the others on `queues` (device
/// `d`'s at `d − 1`).
///
/// # Safety
///
/// `exec` is a checked invocation's (every device's bases valid for the call); the
/// entry passed the verifier's segment checks; `segs` are its segments.
pub(crate) unsafe fn run(
    exec: &mut Exec<'_, '_>,
    segs: &[SegmentAt],
    queues: &mut [Queue<'_>],
    mut observe: Option<&mut dyn FnMut(usize)>,
) -> Result<(), RuntimeError> {
    for (s, at) in segs.iter().enumerate() {
        let Some(Command::Segment { waits, .. }) = exec.entry.commands.get(at.first - 1) else { continue };
        // Waits on other devices' segments: block on their queues (host segments are
        // complete: they ran in plan order on this thread).
        for &w in waits {
            let Some(on) = segs.get(w as usize) else { continue };
            if on.device != 0 && on.device != at.device {
                let q = queues.get_mut(on.device as usize - 1).ok_or(RuntimeError::Hetero { device: on.device })?;
                // SAFETY: the caller's contract.
                unsafe { q.get()?.wait(w, exec) }?;
            }
        }
        if at.device == 0 {
            let range = at.first..at.first + at.count;
            // The transfers into the host first, then the segment's work (on the
            // instance's threads where it has them), then the transfers out (the
            // verifier checked that they stand so), each through the other device's queue.
            // SAFETY: the caller's contract.
            unsafe { host_transfers(exec, range.clone(), queues, true) }?;
            #[cfg(feature = "local-task")]
            if let Some(task) = exec.task.as_deref_mut() {
                let helpers = exec.module.helpers.as_ptr();
                // SAFETY: the caller's contract; the segments this one waits for have
                // completed (above), and the host's earlier ones ran in order.
                unsafe { task.run_range(exec.index, range.clone(), &exec.bases[0], helpers, None) }?;
            } else {
                // SAFETY: the caller's contract.
                unsafe { host_work(exec, range.clone()) };
            }
            #[cfg(not(feature = "local-task"))]
            // SAFETY: the caller's contract.
            unsafe {
                host_work(exec, range.clone())
            };
            // SAFETY: the caller's contract.
            unsafe { host_transfers(exec, range, queues, false) }?;
            if let Some(after) = observe.as_mut() {
                after(at.first + at.count - 1);
            }
        } else {
            let q = queues.get_mut(at.device as usize - 1).ok_or(RuntimeError::Hetero { device: at.device })?;
            // SAFETY: the caller's contract.
            unsafe { q.get()?.submit(s as u32, *at, exec) }?;
        }
    }
    for q in queues.iter_mut() {
        // SAFETY: the caller's contract.
        unsafe { q.get()?.wait(u32::MAX, exec) }?;
    }
    Ok(())
}
