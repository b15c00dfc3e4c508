//! `kiln_instance_invoke` allocates nothing, as its documentation says: a counting
//! global allocator watches every thread of the process while lenet runs repeatedly
//! through the C API (inputs copied and bound, outputs in place and bound, one thread
//! and two). A test binary of its own with one test, so that the allocator counts
//! nothing else; the counter is first shown to count.

mod common;

use kiln_capi::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::ptr::{null, null_mut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};

struct Counting;

static WATCHING: AtomicBool = AtomicBool::new(false);
static COUNT: AtomicU64 = AtomicU64::new(0);

fn note() {
    if WATCHING.load(SeqCst) {
        COUNT.fetch_add(1, SeqCst);
    }
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        note();
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn counted(f: impl FnOnce()) -> u64 {
    COUNT.store(0, SeqCst);
    WATCHING.store(true, SeqCst);
    f();
    WATCHING.store(false, SeqCst);
    COUNT.load(SeqCst)
}

#[test]
fn invoke_allocates_nothing() {
    // The counter counts.
    assert!(counted(|| drop(std::hint::black_box(vec![1u8; 16]))) >= 2);

    let c = common::compile_lenet(None);
    let x = common::f32_bytes(&common::pattern_f32(0, 28 * 28));
    let mut m = null_mut();
    // SAFETY (whole test): valid buffers that outlive the handles, live handles.
    assert_eq!(
        unsafe { kiln_module_load_bytes(c.artifact.as_ptr(), c.artifact.len(), null(), 0, &mut m) },
        kiln_status::Ok
    );
    let mut y = vec![0u8; 40];
    for threads in [1, 2] {
        let mut inst = null_mut();
        assert_eq!(unsafe { kiln_instance_create(m, threads, &mut inst) }, kiln_status::Ok);
        assert_eq!(unsafe { kiln_instance_set_input(inst, 0, x.as_ptr().cast(), x.len()) }, kiln_status::Ok);
        // The first call outside the count (lazy one-time set-up in the system, if any).
        assert_eq!(unsafe { kiln_instance_invoke(inst) }, kiln_status::Ok);
        let n = counted(|| {
            for _ in 0..10 {
                assert_eq!(unsafe { kiln_instance_invoke(inst) }, kiln_status::Ok);
            }
        });
        assert_eq!(n, 0, "{n} allocations in 10 invokes on {threads} thread(s), input copied, output in place");
        assert_eq!(unsafe { kiln_instance_bind_input(inst, 0, x.as_ptr().cast(), x.len()) }, kiln_status::Ok);
        assert_eq!(unsafe { kiln_instance_bind_output(inst, 0, y.as_mut_ptr().cast(), y.len()) }, kiln_status::Ok);
        let n = counted(|| {
            for _ in 0..10 {
                assert_eq!(unsafe { kiln_instance_invoke(inst) }, kiln_status::Ok);
            }
        });
        assert_eq!(n, 0, "{n} allocations in 10 invokes on {threads} thread(s), input and output bound");
        unsafe { kiln_instance_free(inst) };
    }
    assert_eq!(common::f32_values(&y), common::f32_values(&common::rust_invoke(&c.artifact, None, &[x])[0]));
    unsafe { kiln_module_free(m) };
}
