//! `invoke` allocates nothing: a counting global allocator watches the calling thread
//! while a loaded module runs repeatedly (dispatch, helper calls, copy, fill, typed and
//! raw fronts, several entry points). A test binary of its own, so the allocator
//! counts nothing else.

mod common;

use common::*;
use kiln_module::sections::write_program;
use kiln_runtime::{Instance, TensorMut, TensorRef};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    static WATCHING: Cell<bool> = const { Cell::new(false) };
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

fn note() {
    // `try_with`: the thread-locals may be gone while a thread shuts down.
    let _ = WATCHING.try_with(|w| {
        if w.get() {
            let _ = COUNT.try_with(|c| c.set(c.get() + 1));
        }
    });
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

fn counted<R>(f: impl FnOnce() -> R) -> (R, u64) {
    COUNT.with(|c| c.set(0));
    WATCHING.with(|w| w.set(true));
    let r = f();
    WATCHING.with(|w| w.set(false));
    (r, COUNT.with(|c| c.get()))
}

#[test]
fn invoke_allocates_nothing() {
    // The counter works: a Vec allocates.
    let (_, n) = counted(|| std::hint::black_box(vec![1u8; 100]));
    assert!(n >= 1, "the counting allocator sees allocations");

    let add = write_program(&add_program(64));
    let (misc, _) = misc_program(false);
    let misc = write_program(&misc);
    let m_add = load(&add, None).expect("load");
    let m_misc = load(&misc, None).expect("load");
    let mut i_add = Instance::new(&m_add).expect("instance");
    let mut i_misc = Instance::new(&m_misc).expect("instance");
    let a = f32s(&(0..64).map(|i| i as f32).collect::<Vec<_>>());
    let b = f32s(&[0.5; 64]);
    let mut y = vec![0u8; 256];
    let mut bytes16 = [0u8; 16];
    let x = 1.0f32.to_le_bytes();
    let mut e = [0u8; 4];
    let dims = [64u64];
    let ((), n) = counted(|| {
        for _ in 0..100 {
            i_add.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
            let ins = [TensorRef { dtype: 1, dims: &dims, data: &a }, TensorRef { dtype: 1, dims: &dims, data: &b }];
            let mut outs = [TensorMut { dtype: 1, dims: &dims, data: &mut y }];
            i_add.invoke_tensors(0, &ins, &mut outs).expect("typed invoke");
            i_misc.invoke(&[], &mut [&mut bytes16[..]]).expect("invoke");
            i_misc.invoke_entry(1, &[&x], &mut [&mut e[..]]).expect("exp");
        }
    });
    assert_eq!(n, 0, "invoke allocated {n} times in 400 calls");
    assert_eq!(to_f32s(&y)[63], 63.5);
    assert_eq!(bytes16, MISC_EXPECTED);
    assert!((f32::from_le_bytes(e) - std::f32::consts::E).abs() < 1e-6);
}
