//! The embedder's allocator (`kiln_runtime::memory`): with `Routed` as the global
//! allocator, a load and an instance made through the `_in` forms take every block they
//! allocate from the embedder's allocator — counted here by a counting allocator, while
//! `Routed` counts what reaches the allocator it wraps — `invoke` takes none from
//! either, and dropping them gives every block back to the embedder's allocator. A test
//! binary of its own without the test harness (`harness = false` in Cargo.toml): the
//! harness's main thread does its own bookkeeping (allocations) after it starts a test
//! thread, and on a loaded machine that lands inside the counted windows. Here `main`
//! is the only thread besides the instance's workers.

mod common;

use common::*;
use kiln_module::sections::write_program;
use kiln_runtime::memory::{Allocator, Routed};
use kiln_runtime::{Instance, Module};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};

/// What the wrapped allocator (the process's default) is asked for.
struct Default(AtomicUsize);

unsafe impl GlobalAlloc for Default {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.0.fetch_add(1, SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Routed<Default> = Routed(Default(AtomicUsize::new(0)));

/// The embedder's allocator: the system's, counting blocks, bytes and blocks still out.
struct Counting {
    blocks: AtomicUsize,
    bytes: AtomicUsize,
    live: AtomicUsize,
}

unsafe impl Allocator for Counting {
    fn allocate(&self, layout: Layout) -> *mut u8 {
        self.blocks.fetch_add(1, SeqCst);
        self.bytes.fetch_add(layout.size(), SeqCst);
        self.live.fetch_add(1, SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn deallocate(&self, ptr: *mut u8, layout: Layout) {
        self.live.fetch_sub(1, SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

static EMBEDDER: Counting =
    Counting { blocks: AtomicUsize::new(0), bytes: AtomicUsize::new(0), live: AtomicUsize::new(0) };

fn counts() -> (usize, usize, usize, usize) {
    (EMBEDDER.blocks.load(SeqCst), EMBEDDER.bytes.load(SeqCst), EMBEDDER.live.load(SeqCst), GLOBAL.0 .0.load(SeqCst))
}

fn main() {
    the_embedders_allocator_sees_every_allocation_and_invoke_makes_none();
    eprintln!("test the_embedders_allocator_sees_every_allocation_and_invoke_makes_none ... ok");
}

fn the_embedders_allocator_sees_every_allocation_and_invoke_makes_none() {
    // The counters work: outside a `_in` call a Vec goes to the default allocator.
    let before = counts();
    drop(std::hint::black_box(vec![1u8; 100]));
    let after = counts();
    assert_eq!((after.0, after.3 - before.3), (before.0, 1), "a Vec outside: the default allocator");
    assert!(kiln_runtime::memory::routed());

    let (misc, _) = misc_program(false);
    let file = write_program(&misc);
    let add = write_program(&add_program(64));
    let before = counts();
    let m = Module::load_in(&file, None, &EMBEDDER).expect("load");
    let m_add = Module::load_in(&add, None, &EMBEDDER).expect("load");
    let loaded = counts();
    assert!(loaded.0 > before.0 && loaded.1 > before.1, "the load allocates through the embedder: {loaded:?}");
    assert_eq!(loaded.3, before.3, "nothing of the load reaches the default allocator");
    eprintln!("two loads: {} blocks, {} bytes from the embedder's allocator", loaded.0 - before.0, loaded.1 - before.1);

    // (Counted right around each call: what the test prints goes to the harness's
    // capture buffer, through the default allocator.)
    let loaded = counts();
    let mut one = Instance::new_in(&m, &EMBEDDER).expect("instance");
    let single = counts();
    assert!(single.0 > loaded.0, "an instance allocates through the embedder");
    assert_eq!(single.3, loaded.3, "nothing of the instance reaches the default allocator");
    let mut four = Instance::with_threads_in(&m_add, 4, &EMBEDDER).expect("instance on 4 threads");
    let made = counts();
    assert!(made.0 > single.0, "a threaded instance allocates through the embedder");
    // The standard library starts each of the three workers with an allocation of its
    // own (its thread-local bookkeeping) before any kiln code runs on that thread: that
    // one reaches the default allocator, and nothing else does.
    assert!(
        made.3 - single.3 <= 3,
        "{} allocations of the threaded instance reached the default allocator",
        made.3 - single.3
    );
    eprintln!(
        "two instances: {} blocks, {} bytes; {} allocations of std's thread start outside",
        made.0 - loaded.0,
        made.1 - loaded.1,
        made.3 - single.3
    );

    // `invoke` takes nothing from either.
    let mut bytes16 = [0u8; 16];
    let x = 1.0f32.to_le_bytes();
    let mut e = [0u8; 4];
    let a = f32s(&(0..64).map(|i| i as f32).collect::<Vec<_>>());
    let b = f32s(&[0.5; 64]);
    let mut y = vec![0u8; 256];
    let start = counts();
    for _ in 0..50 {
        one.invoke(&[], &mut [&mut bytes16[..]]).expect("invoke");
        one.invoke_entry(1, &[&x], &mut [&mut e[..]]).expect("exp");
        four.invoke(&[&a, &b], &mut [&mut y]).expect("invoke on 4 threads");
    }
    assert_eq!(counts(), start, "invoke allocated");
    assert!((f32::from_le_bytes(e) - 1.0f32.exp()).abs() < 1e-6, "the module ran");
    assert_eq!(to_f32s(&y)[3], 3.5);

    // Dropped, every block goes back to the allocator that gave it.
    drop(four);
    drop(one);
    drop(m_add);
    drop(m);
    let end = counts();
    assert_eq!(end.2, 0, "every block of the embedder's allocator returned to it");
}
