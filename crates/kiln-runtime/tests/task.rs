//! The local-task driver end to end with hand-assembled kernels: workgroups split over
//! 2..8 threads (more threads than workgroups included), waves of several dispatches,
//! a plan whose dispatches depend on each other without a barrier, copies, fills,
//! helper calls, caller arenas; every result equal to the local-sync driver's.

mod common;

use common::*;
use kiln_module::sections::write_program;
use kiln_runtime::{Instance, Observe, RuntimeError};

fn ramp(n: u64, scale: f32) -> Vec<u8> {
    f32s(&(0..n).map(|i| i as f32 * scale - 3.0).collect::<Vec<_>>())
}

#[test]
fn workgroups_split_over_threads() {
    for n in [1u64, 2, 3, 5, 7, 64, 1000] {
        let file = write_program(&add_program(n));
        let m = load(&file, None).expect("load");
        let (a, b) = (ramp(n, 0.5), ramp(n, -0.25));
        let want: Vec<f32> = to_f32s(&a).iter().zip(to_f32s(&b)).map(|(x, y)| x + y).collect();
        for threads in [1, 2, 3, 4, 8] {
            let mut inst = Instance::with_threads(&m, threads).expect("instance");
            assert_eq!(inst.threads(), threads);
            let mut y = vec![0u8; 4 * n as usize];
            // Several calls: the workers wait between them and run again.
            for _ in 0..3 {
                y.fill(0);
                inst.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
                assert_eq!(to_f32s(&y), want, "n = {n}, {threads} threads");
            }
        }
    }
}

#[test]
fn skips_on_every_driver() {
    for n in [1u64, 3, 64] {
        let file = write_program(&skip_program(n));
        let m = load(&file, None).expect("load");
        let b = ramp(n, 0.5);
        for threads in [1, 2, 3] {
            let mut inst = Instance::with_threads(&m, threads).expect("instance");
            let mut y = vec![0u8; 4 * n as usize];
            // `a` starting with 0.0: the add runs.
            let a = f32s(&(0..n).map(|i| i as f32).collect::<Vec<_>>());
            inst.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
            let want: Vec<f32> = to_f32s(&a).iter().zip(to_f32s(&b)).map(|(x, y)| x + y).collect();
            assert_eq!(to_f32s(&y), want, "n = {n}, {threads} threads, not skipped");
            // `a` starting with 1.0: the add is skipped, `y` is the fill.
            let a = f32s(&(0..n).map(|i| i as f32 + 1.0).collect::<Vec<_>>());
            inst.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
            assert!(to_f32s(&y).iter().all(|v| v.is_nan()), "n = {n}, {threads} threads, skipped: {:?}", to_f32s(&y));
        }
    }
}

#[test]
fn waves_of_several_dispatches() {
    for barrier in [true, false] {
        for n in [1u64, 2, 3, 17, 256] {
            let file = write_program(&waves_program(n, barrier));
            let m = load(&file, None).expect("load");
            let (a, b) = (ramp(n, 1.5), ramp(n, 0.125));
            let run = |threads| {
                let mut inst = Instance::with_threads(&m, threads).expect("instance");
                let (mut y, mut z) = (vec![0u8; 4 * n as usize], vec![0u8; 4]);
                inst.invoke(&[&a, &b], &mut [&mut y, &mut z]).expect("invoke");
                (y, z)
            };
            let (y1, z1) = run(1);
            let want: Vec<f32> = to_f32s(&a).iter().zip(to_f32s(&b)).map(|(x, y)| (x + y) + (x + x)).collect();
            assert_eq!(to_f32s(&y1), want);
            assert_eq!(z1, a[..4]);
            for threads in [2, 3, 5] {
                assert_eq!(run(threads), (y1.clone(), z1.clone()), "n = {n}, barrier {barrier}, {threads} threads");
            }
        }
    }
}

#[test]
fn copies_fills_helpers_and_entries() {
    let file = Aligned::new(&misc_file(), 0);
    let m = load(file.bytes(), None).expect("load");
    for threads in [2, 3] {
        let mut inst = Instance::with_threads(&m, threads).expect("instance");
        check_misc_entries(&mut inst, 1.0);
        // Argument checks come first, as on one thread.
        let (x, mut y) = (1.0f32.to_le_bytes(), [0u8; 16]);
        let e = inst.invoke(&[&x], &mut [&mut y[..]]).expect_err("count");
        assert!(matches!(e, RuntimeError::InputCount { .. }));
    }
}

#[test]
fn caller_arena_on_threads() {
    let n = 40u64;
    let file = write_program(&add_program(n));
    let m = load(&file, None).expect("load");
    let size = m.verified().limits().arena_size as usize;
    let mut mem = vec![0u8; size + 128];
    let off = mem.as_ptr().align_offset(64);
    let (a, b) = (ramp(n, 1.0), ramp(n, 2.0));
    let mut y = vec![0u8; 4 * n as usize];
    {
        let mut inst = Instance::with_arena_and_threads(&m, &mut mem[off..off + size], 3).expect("instance");
        inst.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
    }
    assert_eq!(y, mem[off + 64..off + size]);
    assert_eq!(to_f32s(&y)[39], 39.0 * 3.0 - 6.0);
}

#[test]
fn thread_counts() {
    let file = write_program(&add_program(4));
    let m = load(&file, None).expect("load");
    let e = Instance::with_threads(&m, 0).expect_err("zero threads");
    assert!(matches!(e, RuntimeError::Threads { threads: 0, .. }));
    assert_eq!(e.to_string(), "cannot run on 0 threads: at least one thread is needed");
    let e = Instance::with_threads(&m, kiln_runtime::MAX_THREADS + 1).expect_err("too many");
    assert!(e.to_string().contains("at most 4096"), "{e}");
    assert_eq!(Instance::new(&m).expect("instance").threads(), 1);
    assert_eq!(Instance::with_threads(&m, 1).expect("instance").threads(), 1);
    let inst = Instance::with_threads(&m, 4).expect("instance");
    assert!(format!("{inst:?}").contains("threads: 4"));
}

/// `invoke_observed` runs every command on the calling thread, in order, whatever the
/// instance's threads, calling back once after each (barriers included), and computes
/// what `invoke` does.
#[test]
fn observed_invocations_call_back_after_every_command() {
    for n in [3u64, 256] {
        let prog = waves_program(n, true);
        let commands = prog.entries[0].commands.len();
        let file = write_program(&prog);
        let m = load(&file, None).expect("load");
        let (a, b) = (ramp(n, 1.5), ramp(n, 0.125));
        for threads in [1, 2, 3] {
            let mut inst = Instance::with_threads(&m, threads).expect("instance");
            let (mut y, mut z) = (vec![0u8; 4 * n as usize], vec![0u8; 4]);
            inst.invoke(&[&a, &b], &mut [&mut y, &mut z]).expect("invoke");
            let (mut y2, mut z2) = (vec![0u8; 4 * n as usize], vec![0u8; 4]);
            let mut seen = Vec::new();
            let caller = std::thread::current().id();
            inst.invoke_observed(&[&a, &b], &mut [&mut y2, &mut z2], Observe::Commands, &mut |c| {
                assert_eq!(std::thread::current().id(), caller);
                seen.push(c)
            })
            .expect("invoke_observed");
            assert_eq!(seen, (0..commands).collect::<Vec<_>>(), "{threads} threads");
            assert_eq!((y2, z2), (y, z), "n = {n}, {threads} threads");
        }
    }
}
