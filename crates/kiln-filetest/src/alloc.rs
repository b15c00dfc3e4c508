//! A counting global allocator, for the tests that show a call allocates nothing.
//!
//! Install it as the test binary's global allocator and count what a closure allocates:
//!
//! ```text
//! #[global_allocator]
//! static ALLOC: kiln_filetest::alloc::Counting = kiln_filetest::alloc::Counting::new();
//!
//! let (_, n) = ALLOC.counted(|| instance.invoke(..));
//! assert_eq!(n, 0);
//! ```
//!
//! The count is process-wide, not per thread (worker threads allocate on threads of
//! their own), so such a test lives in a binary of its own with one test: the harness's
//! thread only waits for it meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

/// Forwards every call to the system allocator, counting allocations, reallocations and
/// deallocations while [`Counting::counted`] runs.
pub struct Counting {
    watching: AtomicBool,
    count: AtomicU64,
}

impl Counting {
    /// An allocator that counts nothing yet (a `const fn`, for a `static`).
    pub const fn new() -> Self {
        Counting { watching: AtomicBool::new(false), count: AtomicU64::new(0) }
    }

    /// Runs `f` and returns its result with the number of allocator calls made by every
    /// thread of the process meanwhile.
    pub fn counted<R>(&self, f: impl FnOnce() -> R) -> (R, u64) {
        self.count.store(0, SeqCst);
        self.watching.store(true, SeqCst);
        let r = f();
        self.watching.store(false, SeqCst);
        (r, self.count.load(SeqCst))
    }

    fn note(&self) {
        if self.watching.load(SeqCst) {
            self.count.fetch_add(1, SeqCst);
        }
    }
}

impl Default for Counting {
    fn default() -> Self {
        Self::new()
    }
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        self.note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        self.note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        self.note();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        self.note();
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}
