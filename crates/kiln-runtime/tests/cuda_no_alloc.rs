//! The CUDA instance's `invoke` allocates nothing (on a GPU): a counting global
//! allocator watches every thread of the process while an instance runs repeatedly
//! through the graph, the typed front and the device-resident path. A test binary of
//! its own with one test, so the allocator counts nothing else. The driver's own memory
//! (its `malloc`) is not Rust's and not counted: the claim is about kiln's code.
#![cfg(feature = "cuda")]

mod common;

use common::{cuda_graph_expected, cuda_graph_program, f32s};
use kiln_filetest::alloc::Counting;
use kiln_module::sections::write_program;
use kiln_runtime::cuda::{CudaInstance, CudaModule};
use kiln_runtime::{TensorMut, TensorRef};

#[global_allocator]
static ALLOC: Counting = Counting::new();

#[test]
#[ignore = "needs a CUDA driver (scripts/gpu-test)"]
fn cuda_invoke_allocates_nothing() {
    // The counter works: a Vec allocates.
    let (_, n) = ALLOC.counted(|| std::hint::black_box(vec![1u8; 100]));
    assert!(n >= 1, "the counting allocator sees allocations");
    let file = write_program(&cuda_graph_program());
    let m = CudaModule::load(&file, None).expect("load");
    let mut inst = CudaInstance::new(&m).expect("instance");
    let (a, b) = (f32s(&[1.0, 2.0, 3.0, 4.0]), f32s(&[0.5; 4]));
    let (mut y, mut z) = (vec![0u8; 16], vec![0u8; 24]);
    let (dy, dz) = ([4u64], [24u64]);
    // One call first: the driver's lazy set-up (if any) is not the claim.
    inst.invoke(&[&a, &b], &mut [&mut y, &mut z]).expect("invoke");
    let ((), n) = ALLOC.counted(|| {
        for _ in 0..100 {
            inst.invoke(&[&a, &b], &mut [&mut y, &mut z]).expect("invoke");
            let ins = [TensorRef { dtype: 1, dims: &dy, data: &a }, TensorRef { dtype: 1, dims: &dy, data: &b }];
            let mut outs =
                [TensorMut { dtype: 1, dims: &dy, data: &mut y }, TensorMut { dtype: 2, dims: &dz, data: &mut z }];
            inst.invoke_tensors(0, &ins, &mut outs).expect("typed invoke");
            inst.invoke_resident(0).expect("resident");
        }
    });
    assert_eq!(n, 0, "invoke allocated {n} times in 300 calls");
    let (want_y, want_z) = cuda_graph_expected(&[1.0, 2.0, 3.0, 4.0], &[0.5; 4]);
    assert_eq!((y, z), (want_y, want_z));
}
