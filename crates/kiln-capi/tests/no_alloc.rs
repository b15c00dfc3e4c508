//! `kiln_instance_invoke` allocates nothing, as its documentation says: a counting
//! global allocator watches every thread of the process while lenet runs repeatedly
//! through the C API (inputs copied and bound, outputs in place and bound, one thread
//! and two). A test binary of its own without the test harness (`harness = false`:
//! the harness's main thread allocates while a test runs), so that the allocator counts
//! nothing else; the counter is first shown to count.

mod common;

use kiln_capi::*;
use kiln_filetest::alloc::Counting;
use std::ptr::{null, null_mut};

#[global_allocator]
static ALLOC: Counting = Counting::new();

fn main() {
    invoke_allocates_nothing();
    eprintln!("test invoke_allocates_nothing ... ok");
}

fn invoke_allocates_nothing() {
    // The counter counts.
    assert!(ALLOC.counted(|| drop(std::hint::black_box(vec![1u8; 16]))).1 >= 2);

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
        let ((), n) = ALLOC.counted(|| {
            for _ in 0..10 {
                assert_eq!(unsafe { kiln_instance_invoke(inst) }, kiln_status::Ok);
            }
        });
        assert_eq!(n, 0, "{n} allocations in 10 invokes on {threads} thread(s), input copied, output in place");
        assert_eq!(unsafe { kiln_instance_bind_input(inst, 0, x.as_ptr().cast(), x.len()) }, kiln_status::Ok);
        assert_eq!(unsafe { kiln_instance_bind_output(inst, 0, y.as_mut_ptr().cast(), y.len()) }, kiln_status::Ok);
        let ((), n) = ALLOC.counted(|| {
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
