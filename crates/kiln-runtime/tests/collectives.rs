//! The collective commands of a plan over several devices (format 1.4): what the CPU
//! runtime computes for them on the local-sync and the local-task driver, every
//! malformed collective the verifier refuses, and the CUDA driver's refusal (NCCL is not
//! built).

mod common;

use common::*;
use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::error::{CommandProblem, RuntimeError, VerifyError};
use kiln_runtime::{Instance, Module};

fn run(p: &Program, threads: usize, inputs: [&[f32]; 3]) -> [Vec<f32>; 3] {
    let file = write_program(p);
    let m = load(&file, None).expect("load");
    let mut inst = Instance::with_threads(&m, threads).expect("instance");
    let n = inputs[0].len();
    let (mut s1, mut g2, mut s0) = (vec![0u8; 4 * n], vec![0u8; 12 * n], vec![0u8; 4 * n]);
    let ins: Vec<Vec<u8>> = inputs.iter().map(|x| f32s(x)).collect();
    let ins: Vec<&[u8]> = ins.iter().map(|x| &x[..]).collect();
    inst.invoke(&ins, &mut [&mut s1, &mut g2, &mut s0]).expect("invoke");
    [to_f32s(&s1), to_f32s(&g2), to_f32s(&s0)]
}

#[test]
fn all_reduce_and_all_gather_on_both_drivers() {
    let n = 10;
    let a: Vec<f32> = (0..n).map(|i| i as f32 * 0.1 + 1e-3).collect();
    let b: Vec<f32> = (0..n).map(|i| 1e7 - i as f32).collect();
    let c: Vec<f32> = (0..n).map(|i| -1e7 + (i * i) as f32 * 0.25).collect();
    // The sum in part order, rounded as f32 at each step: (a + b) + c.
    let sum: Vec<f32> = (0..n).map(|i| (a[i] + b[i]) + c[i]).collect();
    let half = n / 2;
    let gather: Vec<f32> = [&a[..half], &b[..half], &c[..half], &a[half..], &b[half..], &c[half..]].concat();
    for threads in [1, 3] {
        let [s1, g2, s0] = run(&collectives_program(n as u64), threads, [&a, &b, &c]);
        // Bit for bit: every device gets the same bits, added in part order.
        assert_eq!(
            s1.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            sum.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert_eq!(s0, s1, "every device receives the same sum");
        assert_eq!(g2, gather, "blocks in part order");
    }
}

fn problem(p: &Program) -> CommandProblem {
    match Module::verify(&write_program(p), None, u64::MAX) {
        Err(RuntimeError::Invalid(VerifyError::Command { command, problem, .. })) => {
            assert!(command == 4 || command == 5, "{command}");
            problem
        }
        other => panic!("expected a command error, got {other:?}"),
    }
}

fn parts(p: &mut Program, cmd: usize) -> &mut Vec<CollectivePart> {
    match &mut p.entries[0].commands[cmd] {
        Command::AllReduce { parts, .. } | Command::AllGather { parts, .. } => parts,
        _ => unreachable!(),
    }
}

fn is_collective(p: CommandProblem, needle: &str) {
    match p {
        CommandProblem::Collective { why } => assert!(why.contains(needle), "`{needle}` not in `{why}`"),
        other => panic!("expected a collective problem, got {other:?}"),
    }
}

/// The problem [`collectives_program`]`(4)` has once `edit` has changed it.
fn edited(edit: impl FnOnce(&mut Program)) -> CommandProblem {
    let mut p = collectives_program(4);
    edit(&mut p);
    problem(&p)
}

#[test]
fn malformed_collectives_are_refused_at_load() {
    Module::verify(&write_program(&collectives_program(4)), None, u64::MAX).expect("the base program verifies");
    let collective: [(&str, fn(&mut Program)); 7] = [
        ("1 parts", |p| parts(p, 4).truncate(1)),
        ("device 0 takes part twice", |p| parts(p, 4)[1].device = 0),
        ("different lengths", |p| parts(p, 4)[2].dst.length = 12),
        ("dtype 7", |p| {
            if let Command::AllReduce { dtype, .. } = &mut p.entries[0].commands[4] {
                *dtype = 7;
            }
        }),
        // A destination over a source.
        ("overlaps", |p| parts(p, 4)[0].dst = parts(p, 4)[1].src),
        // A gather's destination not N times its source.
        ("every destination 3 times", |p| parts(p, 5)[1].dst.length = 32),
        // A gather's source not a whole number of blocks.
        ("whole number of blocks", |p| {
            if let Command::AllGather { outer, .. } = &mut p.entries[0].commands[5] {
                *outer = 3;
            }
        }),
    ];
    for (needle, edit) in collective {
        is_collective(edited(edit), needle);
    }
    // A device not in the table.
    assert_eq!(edited(|p| parts(p, 5)[2].device = 3), CommandProblem::DeviceIndex { device: 3, count: 3 });
    // A destination outside the arena, or an input written.
    assert!(matches!(edited(|p| parts(p, 4)[0].dst.offset = 1 << 20), CommandProblem::Binding { .. }));
    let input = Binding { slot: Slot::Input(0), offset: 0, length: 16 };
    assert!(matches!(edited(|p| parts(p, 4)[0].dst = input), CommandProblem::Binding { .. }));
}

#[test]
fn the_cuda_driver_refuses_collectives() {
    let mut p = collectives_program(4);
    for d in &mut p.devices {
        d.kind = DeviceKind::Cuda;
    }
    let file = write_program(&p);
    let plan = Module::verify_plan(&file).expect("a plan over CUDA devices verifies for listings");
    let e = kiln_runtime::verify::require_device_kind(&plan.program, DeviceKind::Cuda).expect_err("collectives");
    assert!(
        matches!(e, VerifyError::Command { command: 4, problem: CommandProblem::CollectiveUnsupported, .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("NCCL"), "{e}");
}
