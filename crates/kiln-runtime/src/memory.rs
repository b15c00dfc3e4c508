//! The embedder's allocator: every allocation the runtime makes for a module or an
//! instance, through an allocator the embedder supplies ([`Allocator`]).
//!
//! Rust's collections allocate through the process's one global allocator, and stable
//! Rust has no per-collection allocator parameter; the runtime's tables (the decoded
//! plan of kiln-module, the kernel table, the arena, the driver's schedules and worker
//! threads) are such collections. So the route is the global allocator: an embedder
//! that wants kiln's memory elsewhere installs [`Routed`] as its `#[global_allocator]`
//! (around the allocator it would use anyway, [`std::alloc::System`] by default) and
//! calls the `_in` forms of the entry points ([`crate::Module::load_in`],
//! [`crate::Instance::new_in`], [`crate::Instance::with_threads_in`]). While one runs,
//! every allocation on its thread (and on the worker threads it starts, for their whole
//! life, from their first instruction of kiln code; the standard library's own start of
//! a thread allocates once before that) goes to the embedder's allocator;
//! each block records which allocator gave it
//! (a 16-byte header), so it goes back to that allocator whenever and wherever it is
//! freed: dropping the module later, on any thread, returns its tables to the
//! embedder's allocator. Outside them nothing changes: allocations go to the wrapped
//! allocator. Without [`Routed`] installed the `_in` forms refuse with
//! [`crate::RuntimeError::AllocatorNotRouted`] rather than allocate elsewhere unnoticed.
//!
//! `invoke` allocates nothing on either path (`tests/allocator.rs` counts it).
//! The C API's `kiln_instance_create_with_allocator` routes an instance's large blocks
//! through function pointers; see `crates/kiln-capi` for what it covers.

use core::alloc::{GlobalAlloc, Layout};
use core::cell::Cell;
use core::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// An allocator an embedder supplies for the runtime's memory.
///
/// # Safety
///
/// `allocate` returns null or a block of at least `layout.size()` bytes aligned to
/// `layout.align()`, not in use elsewhere, until `deallocate` is called with it and the
/// same layout. It may be called from any thread at any time (the allocator is `Sync`)
/// and must not itself allocate through the runtime's `_in` forms.
pub unsafe trait Allocator: Sync {
    /// A block for `layout`, or null.
    fn allocate(&self, layout: Layout) -> *mut u8;
    /// Releases a block `allocate` returned for `layout`.
    ///
    /// # Safety
    ///
    /// `ptr` came from this allocator's `allocate` with `layout` and is not used again.
    unsafe fn deallocate(&self, ptr: *mut u8, layout: Layout);
}

std::thread_local! {
    /// The allocator of the `_in` call running on this thread, if any.
    static CURRENT: Cell<Option<&'static dyn Allocator>> = const { Cell::new(None) };
}

/// Set by [`Routed`] on its first allocation: the route is installed.
static ROUTED: AtomicBool = AtomicBool::new(false);

/// Bytes in front of every block [`Routed`] hands out: the allocator that gave it (a
/// `&'static dyn Allocator`, or none for the wrapped allocator), at least 16 bytes and
/// at least the block's alignment, so that the block stays aligned.
fn header(layout: Layout) -> usize {
    layout.align().max(16)
}

/// The layout of the block underneath, header included; `None` where it overflows.
fn outer(layout: Layout) -> Option<Layout> {
    Layout::from_size_align(layout.size().checked_add(header(layout))?, layout.align().max(8)).ok()
}

/// The global allocator that routes the runtime's allocations (see the module's
/// documentation): the embedder's [`Allocator`] inside a `_in` call, `G` elsewhere.
#[derive(Debug, Default)]
pub struct Routed<G>(pub G);

// SAFETY: every block is `outer(layout)` from the allocator recorded in its header,
// offset by `header(layout)` (a multiple of the block's alignment, so the pointer
// handed out keeps it), and is returned to that same allocator with the same outer
// layout.
unsafe impl<G: GlobalAlloc> GlobalAlloc for Routed<G> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !ROUTED.load(Relaxed) {
            ROUTED.store(true, Relaxed);
        }
        let Some(out) = outer(layout) else { return core::ptr::null_mut() };
        let current = CURRENT.try_with(Cell::get).ok().flatten();
        let base = match current {
            Some(a) => a.allocate(out),
            // SAFETY: `out` has a nonzero size (the header).
            None => unsafe { self.0.alloc(out) },
        };
        if base.is_null() {
            return base;
        }
        // SAFETY: the block has `header(layout)` ≥ 16 bytes in front of the returned
        // pointer; the slot is 8-aligned (the header is a multiple of 16 and the base
        // at least 8-aligned).
        unsafe {
            let user = base.add(header(layout));
            user.cast::<Option<&'static dyn Allocator>>().sub(1).write(current);
            user
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` with `layout` (GlobalAlloc's contract), so the
        // header in front of it holds the allocator, and `outer(layout)` did not overflow.
        unsafe {
            let owner = ptr.cast::<Option<&'static dyn Allocator>>().sub(1).read();
            let base = ptr.sub(header(layout));
            let Some(out) = outer(layout) else { return };
            match owner {
                Some(a) => a.deallocate(base, out),
                None => self.0.dealloc(base, out),
            }
        }
    }
}

/// Whether [`Routed`] is the process's global allocator: an allocation made now goes
/// through it.
pub fn routed() -> bool {
    // An allocation through whatever the global allocator is: `Routed` notes it.
    drop(std::hint::black_box(alloc::boxed::Box::new(0u8)));
    ROUTED.load(Relaxed)
}

/// The allocator of the `_in` call running on this thread, if any.
pub(crate) fn current() -> Option<&'static dyn Allocator> {
    CURRENT.try_with(Cell::get).ok().flatten()
}

/// Restores the thread's previous allocator when dropped.
pub(crate) struct Scope(Option<&'static dyn Allocator>);

impl Drop for Scope {
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|c| c.set(self.0));
    }
}

/// Routes this thread's allocations to `a` until the returned scope is dropped.
pub(crate) fn enter(a: Option<&'static dyn Allocator>) -> Scope {
    Scope(CURRENT.try_with(|c| c.replace(a)).ok().flatten())
}

/// Runs `f` with this thread's allocations going to `a`; refuses when [`Routed`] is not
/// installed (the allocations would go elsewhere unnoticed).
pub(crate) fn within<R>(
    a: &'static dyn Allocator,
    f: impl FnOnce() -> Result<R, crate::RuntimeError>,
) -> Result<R, crate::RuntimeError> {
    // (The probe allocates inside the scope: with the route installed, from `a` too.)
    let _scope = enter(Some(a));
    if !routed() {
        return Err(crate::RuntimeError::AllocatorNotRouted);
    }
    f()
}
