//! `invoke` allocates nothing: a counting global allocator watches every thread of the
//! process while a loaded module runs repeatedly (dispatch, helper calls, copy, fill,
//! typed and raw fronts, several entry points), on one thread and on the local-task
//! driver's pools, whose workers must neither allocate nor be started during a call. A
//! test binary of its own without the test harness (`harness = false`: the harness's
//! main thread does its own bookkeeping while a test runs), so the allocator counts
//! nothing else.

mod common;

use common::*;
use kiln_filetest::alloc::Counting;
use kiln_module::sections::write_program;
use kiln_runtime::{Instance, TensorMut, TensorRef};

#[global_allocator]
static ALLOC: Counting = Counting::new();

/// Threads of this process now (Linux: entries of /proc/self/task).
fn threads_now() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

fn main() {
    invoke_allocates_nothing();
    eprintln!("test invoke_allocates_nothing ... ok");
}

fn invoke_allocates_nothing() {
    // The counter works: a Vec allocates.
    let (_, n) = ALLOC.counted(|| std::hint::black_box(vec![1u8; 100]));
    assert!(n >= 1, "the counting allocator sees allocations");

    let add = write_program(&add_program(64));
    let skip = write_program(&skip_program(64));
    let m_skip = load(&skip, None).expect("load");
    let mut i_skip = Instance::new(&m_skip).expect("instance");
    let mut i_skip_task = Instance::with_threads(&m_skip, 2).expect("instance");
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
    let ((), n) = ALLOC.counted(|| {
        for _ in 0..100 {
            i_add.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
            // A conditional plan, the skip taken and not taken, on both drivers.
            i_skip.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
            i_skip.invoke(&[&b, &a], &mut [&mut y]).expect("invoke");
            i_skip_task.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
            i_skip_task.invoke(&[&b, &a], &mut [&mut y]).expect("invoke");
            let ins = [TensorRef { dtype: 1, dims: &dims, data: &a }, TensorRef { dtype: 1, dims: &dims, data: &b }];
            let mut outs = [TensorMut { dtype: 1, dims: &dims, data: &mut y }];
            i_add.invoke_tensors(0, &ins, &mut outs).expect("typed invoke");
            i_misc.invoke(&[], &mut [&mut bytes16[..]]).expect("invoke");
            i_misc.invoke_entry(1, &[&x], &mut [&mut e[..]]).expect("exp");
        }
    });
    assert_eq!(n, 0, "invoke allocated {n} times in 400 calls");
    // Data-dependent extents: checked, compacted and reported without allocating.
    let ext = write_program(&extent_program(64, 40));
    let m_ext = load(&ext, None).expect("load");
    let mut i_ext = Instance::new(&m_ext).expect("instance");
    let mut i_ext_task = Instance::with_threads(&m_ext, 2).expect("instance");
    let ((), n) = ALLOC.counted(|| {
        for _ in 0..100 {
            i_ext.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
            i_ext_task.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
        }
    });
    assert_eq!(n, 0, "invoke with extents allocated {n} times in 200 calls");
    assert_eq!(i_ext.output_dims(0), Some(&[40u64][..]));
    // Collectives (all-reduce, all-gather over three devices) allocate nothing either.
    let coll = write_program(&collectives_program(16));
    let m_coll = load(&coll, None).expect("load");
    let mut i_coll = Instance::new(&m_coll).expect("instance");
    let (ca, mut s1, mut g2, mut s0) = (f32s(&[1.5; 16]), vec![0u8; 64], vec![0u8; 192], vec![0u8; 64]);
    let ((), n) = ALLOC.counted(|| {
        for _ in 0..100 {
            i_coll.invoke(&[&ca, &ca, &ca], &mut [&mut s1, &mut g2, &mut s0]).expect("collectives");
        }
    });
    assert_eq!(n, 0, "collectives allocated {n} times in 100 calls");
    assert_eq!(to_f32s(&s0)[15], 4.5);
    assert_eq!(to_f32s(&y)[63], 63.5);
    assert_eq!(bytes16, MISC_EXPECTED);
    assert!((f32::from_le_bytes(e) - std::f32::consts::E).abs() < 1e-6);

    // The local-task driver: the pools start here, not during the calls.
    let before = threads_now();
    let wave = write_program(&waves_program(64, true));
    let m_wave = load(&wave, None).expect("load");
    let mut pools = Vec::new();
    for threads in [2, 3] {
        pools.push((
            Instance::with_threads(&m_add, threads).expect("instance"),
            Instance::with_threads(&m_misc, threads).expect("instance"),
            Instance::with_threads(&m_wave, threads).expect("instance"),
        ));
    }
    let started = threads_now();
    assert_eq!(started, before + 3 * (1 + 2), "each instance starts threads − 1 workers");
    let mut z = [0u8; 4];
    let ((), n) = ALLOC.counted(|| {
        for _ in 0..100 {
            for (i_add, i_misc, i_wave) in &mut pools {
                i_add.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
                let ins =
                    [TensorRef { dtype: 1, dims: &dims, data: &a }, TensorRef { dtype: 1, dims: &dims, data: &b }];
                let mut outs = [TensorMut { dtype: 1, dims: &dims, data: &mut y }];
                i_add.invoke_tensors(0, &ins, &mut outs).expect("typed invoke");
                i_misc.invoke(&[], &mut [&mut bytes16[..]]).expect("invoke");
                i_misc.invoke_entry(1, &[&x], &mut [&mut e[..]]).expect("exp");
                i_wave.invoke(&[&a, &b], &mut [&mut y, &mut z[..]]).expect("invoke");
            }
        }
    });
    assert_eq!(n, 0, "invoke on the local-task driver allocated {n} times in 3000 calls");
    assert_eq!(threads_now(), started, "no thread started or ended during the calls");
    assert_eq!(to_f32s(&y)[63], 63.0 * 2.0 + 63.5);
    assert_eq!(bytes16, MISC_EXPECTED);
    assert_eq!(z, a[..4]);
    // Dropping an instance stops and joins its workers.
    drop(pools);
    assert_eq!(threads_now(), before, "the workers are joined on drop");
}
