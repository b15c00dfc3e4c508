//! The runtime core as firmware uses it, for measuring its size (see Cargo.toml). The
//! artifact's address and length, and the buffers, come from statics read volatile so
//! that nothing is folded away; the embedder's loader refuses (its own code placement
//! is the firmware's, not the runtime's), but every path that reaches it is linked in.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::boxed::Box;
use core::alloc::{GlobalAlloc, Layout};
use core::cell::UnsafeCell;
use core::fmt::Write;
use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};
use kiln_module::abi::{HelperFn, HELPER_COUNT};
use kiln_module::program::Reloc;
use kiln_runtime::cpu::helpers::HELPERS;
use kiln_runtime::{CodeLoader, Instance, LoadError, LoadedImage, Module};

/// A bump allocator over a static heap (never frees), as small firmware has.
struct Bump {
    heap: UnsafeCell<[u8; 1 << 20]>,
    next: UnsafeCell<usize>,
}

// SAFETY: single-threaded program.
unsafe impl Sync for Bump {}

// SAFETY: blocks are disjoint parts of `heap`, aligned as asked; null when full.
unsafe impl GlobalAlloc for Bump {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: single-threaded; `next` is only touched here.
        unsafe {
            let base = self.heap.get() as usize;
            let start = (base + *self.next.get()).next_multiple_of(l.align());
            let end = start + l.size();
            if end > base + (1 << 20) {
                return core::ptr::null_mut();
            }
            *self.next.get() = end - base;
            start as *mut u8
        }
    }
    unsafe fn dealloc(&self, _: *mut u8, _: Layout) {}
}

#[global_allocator]
static ALLOC: Bump = Bump { heap: UnsafeCell::new([0; 1 << 20]), next: UnsafeCell::new(0) };

static mut ARTIFACT: (usize, usize) = (0, 0);
static mut SINK: u8 = 0;

struct Sink;
impl Write for Sink {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        for b in s.bytes() {
            // SAFETY: single-threaded; a volatile store keeps the text alive.
            unsafe { write_volatile(addr_of_mut!(SINK), b) }
        }
        Ok(())
    }
}

struct FirmwareLoader;
impl CodeLoader for FirmwareLoader {
    fn helpers(&self) -> &'static [HelperFn; HELPER_COUNT] {
        &HELPERS
    }
    fn load(&self, _: &[u8], _: &[Reloc]) -> Result<Box<dyn LoadedImage>, LoadError> {
        Err(LoadError::Embedder("firmware places code itself".into()))
    }
}

fn run() -> Result<(), kiln_runtime::RuntimeError> {
    // SAFETY: read volatile so the compiler cannot know the artifact.
    let (ptr, len) = unsafe { read_volatile(addr_of!(ARTIFACT)) };
    // SAFETY: measurement only: the firmware would put a real artifact there.
    let artifact = unsafe { core::slice::from_raw_parts(ptr as *const u8, len) };
    let m = Module::verify(artifact, None, 0)?.load(&FirmwareLoader)?;
    let mut inst = Instance::new(&m)?;
    let mut input = [0u8; 64];
    let mut output = [0u8; 64];
    // SAFETY: volatile accesses of local buffers.
    unsafe { write_volatile(&mut input[0], 1) };
    inst.invoke(&[&input], &mut [&mut output])?;
    // SAFETY: as above.
    unsafe { read_volatile(&output[0]) };
    Ok(())
}

#[no_mangle]
pub extern "C" fn _start() -> ! {
    if let Err(e) = run() {
        let _ = write!(Sink, "{e}");
    }
    loop {}
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}
