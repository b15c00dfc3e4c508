//! The instantiation prologue (format 1.9): an entry's leading commands that depend on
//! no input run once per arena state, on one thread and on several, again after another
//! entry has used the arena, at the first call or ahead of it (`Instance::prepare`); and
//! the verifier's checks of it.
//!
//! The test plans break the compiler's promise on purpose: their calls overwrite what
//! the prologue left (a fill of 9.0 after the copy out), so a second call shows whether
//! the prologue ran again (the prologue's value) or not (9.0).

mod common;

use common::*;
use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::{Instance, RuntimeError, VerifyError};

const ONE: u64 = 0x3f80_0000;
const HALF: u64 = 0x3f00_0000;
const TWO: u64 = 0x4000_0000;
const NINE: u64 = 0x4110_0000;

fn fill(offset: u64, pattern: u64) -> Command {
    Command::Fill { dst: b(Slot::Arena, offset, 16), pattern, pattern_len: 4 }
}

/// `name() -> y: f32[4]`: the prologue fills arena 16..32 with `x` and 32..48 with
/// `y`, then adds them into arena 0..16 (the `add` kernel); each call copies arena
/// 0..16 out and fills it with 9.0.
fn entry_of(name: &str, x: u64, y: u64) -> EntryPoint {
    let mut e = entry(
        name,
        vec![],
        vec![tensor("y", 1, &[4], 16)],
        (64, 64),
        vec![
            fill(16, x),
            fill(32, y),
            Command::Barrier,
            dispatch(1, 4, vec![b(Slot::Arena, 16, 16), b(Slot::Arena, 32, 16), b(Slot::Arena, 0, 16)]),
            Command::Barrier,
            Command::Copy { src: b(Slot::Arena, 0, 16), dst: b(Slot::Output(0), 0, 16) },
            Command::Barrier,
            fill(0, NINE),
        ],
        vec![],
    );
    e.prologue = 4;
    e
}

fn program() -> Program {
    let (x, kernels) = executable();
    Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![entry_of("main", ONE, HALF), entry_of("b", TWO, TWO)],
        kernels,
        executables: vec![x],
        constants: Constants::Embedded(vec![]),
        debug: None,
    }
}

fn call(inst: &mut Instance<'_>, entry: usize) -> f32 {
    let mut y = [0u8; 16];
    inst.invoke_entry(entry, &[], &mut [&mut y[..]]).expect("invoke");
    let v = to_f32s(&y);
    assert!(v.iter().all(|&x| x == v[0]), "{v:?}");
    v[0]
}

#[test]
fn the_prologue_runs_once_per_arena_state() {
    let file = write_program(&program());
    // Written as format 1.9 (major 1, minor 9 at bytes 8..12 of the header).
    assert_eq!(&file[8..12], &[1, 0, 9, 0]);
    let m = load(&file, None).expect("load");
    for threads in [1, 2, 3] {
        let mut inst = match threads {
            1 => Instance::new(&m),
            t => Instance::with_threads(&m, t),
        }
        .expect("instance");
        assert_eq!(call(&mut inst, 0), 1.5, "{threads} threads: first call of main");
        assert_eq!(call(&mut inst, 0), 9.0, "{threads} threads: main again, behind its prologue");
        assert_eq!(call(&mut inst, 1), 4.0, "{threads} threads: b runs its prologue");
        assert_eq!(call(&mut inst, 1), 9.0, "{threads} threads: b again");
        assert_eq!(call(&mut inst, 0), 1.5, "{threads} threads: main after b used the arena");
        // After `b`, an observed call of `main` runs its prologue unobserved and reports
        // only the commands of the call itself.
        assert_eq!(call(&mut inst, 1), 4.0);
        let mut seen = Vec::new();
        let mut y = [0u8; 16];
        let mut after = |i: usize| seen.push(i);
        inst.invoke_observed(&[], &mut [&mut y[..]], kiln_runtime::Observe::Commands, &mut after).expect("observed");
        assert_eq!(to_f32s(&y), [1.5; 4]);
        assert_eq!(seen, [4, 5, 6, 7]);
    }
}

#[test]
fn prepare_runs_the_prologue_before_the_first_call() {
    let file = write_program(&program());
    let m = load(&file, None).expect("load");
    for threads in [1, 2] {
        let mut inst = match threads {
            1 => Instance::new(&m),
            t => Instance::with_threads(&m, t),
        }
        .expect("instance");
        inst.prepare(0).expect("prepare main");
        // The first call starts behind the prologue: it reports only its own commands.
        let mut seen = Vec::new();
        let mut y = [0u8; 16];
        let mut after = |i: usize| seen.push(i);
        inst.invoke_observed(&[], &mut [&mut y[..]], kiln_runtime::Observe::Commands, &mut after).expect("observed");
        assert_eq!(to_f32s(&y), [1.5; 4], "{threads} threads");
        assert_eq!(seen, [4, 5, 6, 7]);
        // Prepared again: nothing to do, the arena holds its results (the call's fill of
        // 9.0 shows through).
        inst.prepare(0).expect("prepare main again");
        assert_eq!(call(&mut inst, 0), 9.0);
        // Another entry's prologue uses the arena: main's runs again at its next call.
        inst.prepare(1).expect("prepare b");
        assert_eq!(call(&mut inst, 0), 1.5);
        assert!(matches!(inst.prepare(2), Err(RuntimeError::NoSuchEntry { .. })));
    }
}

#[test]
fn a_program_without_a_prologue_is_written_as_before() {
    let mut p = program();
    for e in &mut p.entries {
        e.prologue = 0;
    }
    let file = write_program(&p);
    assert_eq!(&file[8..12], &[1, 0, 5, 0]);
    let m = load(&file, None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    // Every command every call: the fill of 9.0 is undone by the next call's prologue.
    assert_eq!(call(&mut inst, 0), 1.5);
    assert_eq!(call(&mut inst, 0), 1.5);
}

fn prologue_error(p: &Program) -> (u32, Option<usize>, String) {
    let file = write_program(p);
    match kiln_runtime::Module::verify(&file, None, u64::MAX) {
        Err(RuntimeError::Invalid(VerifyError::Prologue { entry, prologue, command, why })) => {
            assert_eq!(entry, "main");
            (prologue, command, why)
        }
        other => panic!("expected a prologue error, got {other:?}"),
    }
}

#[test]
fn the_verifier_checks_the_prologue() {
    kiln_runtime::Module::verify(&write_program(&program()), None, u64::MAX).expect("valid");
    // Longer than the plan.
    let mut p = program();
    p.entries[0].prologue = 9;
    let (n, cmd, why) = prologue_error(&p);
    assert_eq!((n, cmd), (9, None));
    assert!(why.contains("8 commands"), "{why}");
    // A command that binds an output.
    let mut p = program();
    p.entries[0].prologue = 6;
    let (_, cmd, why) = prologue_error(&p);
    assert_eq!(cmd, Some(5));
    assert!(why.contains("input or an output"), "{why}");
    // A skip.
    let mut p = program();
    p.entries[0].commands.insert(0, Command::SkipIf { cond: b(Slot::Arena, 0, 1), value: true, count: 0 });
    p.entries[0].prologue = 5;
    let (_, cmd, why) = prologue_error(&p);
    assert_eq!(cmd, Some(0));
    assert!(why.contains("only dispatches"), "{why}");
    // The message names the entry, the prologue and the command.
    let e = RuntimeError::Invalid(VerifyError::Prologue {
        entry: "main".into(),
        prologue: 6,
        command: Some(5),
        why: "a prologue command binds an input or an output".into(),
    });
    assert_eq!(
        e.to_string().lines().next().map(|l| l.contains("prologue of 6 commands: command 5")),
        Some(true),
        "{e}"
    );
}
