//! Huge pages for the runtime's large buffers (std only).
//!
//! A model's constants (megabytes of weights, read from the artifact or its weights
//! file) and its arena are walked once per inference; on 4 KiB pages that walk misses
//! the TLB every page (a 14 MB model: 3,400 pages, more than the second-level TLB holds).
//! Linux's transparent huge pages back memory with 2 MiB pages, but in its usual
//! `madvise` mode only where a program asks. [`prefer_huge_pages`] asks, for the
//! 2 MiB-aligned part of a buffer, before the buffer is first written (a page's size is
//! chosen when it is first touched). It is advice: where the system has no huge pages,
//! or another OS, nothing changes.
//!
//! Measured on mobilenet_v2 (one thread, `kiln bench`, the same artifact, a build with
//! and one without this advice alternated for 8 rounds, twice): median of the round
//! medians 9.87 → 9.46 ms and 9.92 → 8.89 ms; bert_tiny and mlp within noise.

/// Buffers smaller than this stay as they are.
const HUGE: usize = 2 << 20;

/// Asks for huge pages under `[ptr, ptr + len)` (its 2 MiB-aligned interior). Call it
/// before the buffer is first written.
pub(crate) fn prefer_huge_pages(ptr: *const u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        let addr = ptr as usize;
        let start = addr.next_multiple_of(HUGE);
        let end = (addr + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: the range lies inside one live allocation of the caller's; madvise
            // with MADV_HUGEPAGE changes no contents and only advises the kernel (an
            // error, such as a kernel without transparent huge pages, is ignored).
            unsafe {
                libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}
