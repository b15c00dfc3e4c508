//! A CUDA device of a heterogeneous plan (format 1.8): the queue behind which the CPU
//! runtime's heterogeneous executor (`crate::hetero`) runs the device's segments.
//!
//! ```text
//! CudaQueue::new          the device's primary context; the CUDA code of the kernels
//!                         the plan dispatches on CUDA devices (as `CudaModule` loads
//!                         it); ONE allocation: the device's arena and the constants
//!                         (uploaded once); per segment of this device its commands but
//!                         the transfers as one CUDA graph (instantiated, uploaded) and
//!                         an event
//! submit(segment)         on the stream: the transfers into the device (host → device
//!                         copies), the segment's graph, the transfers out of it
//!                         (device → host), then the segment's event: nothing waits
//! wait(segment)           the host blocks on the segment's event
//! read / write            a host segment's transfer: a copy on the stream, then the
//!                         stream is synchronised (it follows everything queued before)
//! ```
//!
//! The host's memory the copies read or write is the host arena's (whose exchange
//! ranges are never reused within a call), the caller's inputs and outputs: all live
//! until the executor has waited for every queue at the end of the call.

use super::driver::{self, CUdeviceptr};
use super::graph::{self, Layout};
use super::CudaModule;
use crate::error::RuntimeError;
use crate::hetero::{Exec, SegmentAt, SegmentQueue};
use crate::module::LoadedModule;
use alloc::vec::Vec;
use kiln_module::program::{Binding, Command};
use kiln_module::sections::EntryView;

/// One CUDA device of a heterogeneous plan.
pub(crate) struct CudaQueue<'m> {
    // Dropped first (after `Drop::drop` synchronised the stream): graphs, events, the
    // stream, the memory, then the module (its code, then its context).
    /// Per entry, per plan segment: this device's segment's graph (`None`: another
    /// device's segment, or one of transfers only).
    graphs: Vec<Vec<Option<driver::GraphExec>>>,
    /// Per entry, per plan segment: this device's segment's event.
    events: Vec<Vec<Option<driver::Event>>>,
    stream: driver::Stream,
    _memory: driver::DeviceMemory,
    base: CUdeviceptr,
    layout: Layout,
    device: u32,
    module: CudaModule<'m>,
}

impl Drop for CudaQueue<'_> {
    fn drop(&mut self) {
        // Nothing to do about a failure while dropping.
        if self.module.ctx.bind().is_ok() {
            let _ = self.stream.synchronize();
        }
    }
}

/// The segments of `entry` (verified heterogeneous).
fn segments(entry: &EntryView<'_>) -> Vec<SegmentAt> {
    let mut out = Vec::new();
    crate::hetero::segments_of(entry, &mut out);
    out
}

impl<'m> CudaQueue<'m> {
    /// The queue of device `device` of `loaded`'s plan, on GPU `ordinal`.
    pub(crate) fn new(
        loaded: &'m LoadedModule<'m>,
        device: u32,
        ordinal: usize,
    ) -> Result<CudaQueue<'m>, RuntimeError> {
        driver::init()?;
        let program = loaded.verified.program.clone();
        let limits = loaded.verified.limits;
        let pool = loaded.pool.bytes();
        let module = CudaModule::load_program(program, pool, limits, ordinal, None)?;
        module.ctx.bind()?;
        let p = &module.program;
        let d = device as usize;
        let arena = p.entries.iter().filter_map(|e| e.device_arenas.get(d - 1)).copied().max().unwrap_or(0);
        let layout = Layout::new(arena, limits.arena_align, pool.len() as u64, &[])
            .ok_or(RuntimeError::ArenaAlloc { bytes: arena })?;
        let slack = layout.align - graph::REGION_ALIGN;
        let total = layout.size.checked_add(slack).ok_or(RuntimeError::ArenaAlloc { bytes: u64::MAX })?;
        let memory = driver::DeviceMemory::zeroed(total)?;
        let base = memory.ptr().div_ceil(layout.align) * layout.align;
        // SAFETY: the constants region lies inside the allocation (the layout counts it,
        // the base is at most `slack` bytes into the allocation).
        unsafe { driver::copy_to_device(base + layout.constants, pool)? };
        let stream = driver::Stream::new()?;
        let mut graphs = Vec::with_capacity(p.entries.len());
        let mut events = Vec::with_capacity(p.entries.len());
        for e in &p.entries {
            let segs = segments(e);
            let mut g = Vec::with_capacity(segs.len());
            let mut ev = Vec::with_capacity(segs.len());
            for at in &segs {
                if at.device != device {
                    g.push(None);
                    ev.push(None);
                    continue;
                }
                // The segment's commands but its transfers (which `submit` queues on the
                // stream around the graph), as a plan of their own over this device's
                // arena and the constants.
                let commands: Vec<Command> = e.commands[at.first..at.first + at.count]
                    .iter()
                    .map(|c| if matches!(c, Command::Transfer { .. }) { Command::Barrier } else { c.clone() })
                    .collect();
                let sub = EntryView {
                    commands,
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    buffers: Vec::new(),
                    extents: Vec::new(),
                    bounded: Vec::new(),
                    bounded_rows: Vec::new(),
                    device_arenas: Vec::new(),
                    arena_size: arena,
                    ..e.clone()
                };
                let nodes = graph::nodes(&sub, 0, &layout, &module.launches, &module.grids)?;
                g.push(if nodes.is_empty() {
                    None
                } else {
                    Some(super::build_graph(&module, &nodes, base)?.instantiate(&stream)?)
                });
                ev.push(Some(driver::Event::new()?));
            }
            graphs.push(g);
            events.push(ev);
        }
        Ok(CudaQueue { graphs, events, stream, _memory: memory, base, layout, device, module })
    }

    /// The device address of `b` in this device's memory.
    fn at(&self, b: &Binding) -> CUdeviceptr {
        self.base + self.layout.offset(0, b)
    }
}

impl SegmentQueue for CudaQueue<'_> {
    unsafe fn submit(&mut self, seg: u32, at: SegmentAt, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        self.module.ctx.bind()?;
        let host = exec.bases.first().copied().ok_or(RuntimeError::Hetero { device: 0 })?;
        let commands = &exec.entry.commands[at.first..at.first + at.count];
        // Transfers into the device first, then the graph, then those out of it.
        for c in commands {
            if let Command::Transfer { src_device, src, dst_device, dst } = c {
                if *dst_device == self.device {
                    if *src_device != 0 {
                        return Err(RuntimeError::Hetero { device: *src_device });
                    }
                    // SAFETY: `src` is a verified host binding, live until the executor
                    // has waited for this queue; `dst` lies in this device's arena.
                    unsafe { self.stream.upload(self.at(dst), host.at(src).cast_const(), src.length as usize) }?;
                }
            }
        }
        let e = exec.index;
        if let Some(Some(g)) = self.graphs.get(e).and_then(|g| g.get(seg as usize)) {
            g.launch(&self.stream)?;
        }
        for c in commands {
            if let Command::Transfer { src_device, src, dst_device, dst } = c {
                if *src_device == self.device {
                    if *dst_device != 0 {
                        return Err(RuntimeError::Hetero { device: *dst_device });
                    }
                    // SAFETY: as above, the other way.
                    unsafe { self.stream.download(host.at(dst), self.at(src), src.length as usize) }?;
                }
            }
        }
        if let Some(Some(ev)) = self.events.get(e).and_then(|v| v.get(seg as usize)) {
            ev.record(&self.stream)?;
        }
        Ok(())
    }

    unsafe fn wait(&mut self, seg: u32, exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        self.module.ctx.bind()?;
        let e = exec.index;
        match self.events.get(e).and_then(|v| v.get(seg as usize)) {
            Some(Some(ev)) => ev.synchronize(),
            _ => self.stream.synchronize(),
        }
    }

    unsafe fn read(&mut self, src: &Binding, dst: *mut u8, _exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        self.module.ctx.bind()?;
        // SAFETY: the caller's contract: `dst` writable for the length, `src` in this
        // device's arena; synchronised before returning.
        unsafe { self.stream.download(dst, self.at(src), src.length as usize) }?;
        self.stream.synchronize()
    }

    unsafe fn write(&mut self, dst: &Binding, src: *const u8, _exec: &mut Exec<'_, '_>) -> Result<(), RuntimeError> {
        self.module.ctx.bind()?;
        // SAFETY: as for `read`, the other way.
        unsafe { self.stream.upload(self.at(dst), src, dst.length as usize) }?;
        self.stream.synchronize()
    }
}
