//! Bounded input dimensions (format 1.6): the runtime takes an input at any extent in
//! its range, places it at the bound shape in the arena with the padding zeroed,
//! writes the extent, and the outputs it sizes come back at the actual extent, on both
//! drivers; extents outside the range and malformed shapes are typed errors; and the
//! verifier refuses every malformed `BoundedDesc` (one field broken per case). Format
//! 1.7: a dispatch's workgroups past the extent (`BoundedRows`) do not run, and the
//! verifier refuses malformed rows.

mod common;

use common::*;
use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::{Instance, Module, RuntimeError, TensorRef, VerifyError};

/// `add_program(n)` with input `a` bounded along axis 0 (`min..=n`): the plan reads `a`
/// from its staging place, and output `y` is sized by its extent.
fn bounded_program(n: u64, min: u64) -> Program {
    let mut p = add_program(n);
    let e = &mut p.entries[0];
    let bytes = 4 * n;
    let staging = (64 + bytes).div_ceil(64) * 64;
    let extent = (staging + bytes).div_ceil(64) * 64;
    e.arena_size = extent + 8;
    for c in &mut e.commands {
        if let Command::Dispatch { bindings, .. } = c {
            for x in bindings.iter_mut().filter(|x| x.slot == Slot::Input(0)) {
                *x = b(Slot::Arena, staging, bytes);
            }
        }
    }
    e.bounded = vec![BoundedDesc {
        input: 0,
        axis: 0,
        min,
        bound: n,
        staging: b(Slot::Arena, staging, bytes),
        extent: b(Slot::Arena, extent, 8),
    }];
    e.extents =
        vec![ExtentDesc { name: "a".into(), binding: b(Slot::Arena, extent, 8), bound: n, outputs: vec![(0, 0)] }];
    p
}

#[test]
fn any_extent_in_the_range_runs_with_the_padding_zeroed_on_both_drivers() {
    let file = write_program(&bounded_program(5, 1));
    let m = load(&file, None).expect("load");
    let b = f32s(&[10.0, 20.0, 30.0, 40.0, 50.0]);
    for threads in [None, Some(2)] {
        let mut inst = match threads {
            None => Instance::new(&m).expect("instance"),
            Some(t) => Instance::with_threads(&m, t).expect("instance"),
        };
        // The longest first: a shorter call must not see its positions.
        for a in [&[1.0f32, 2.0, 3.0, 4.0, 5.0][..], &[1.0, 2.0, 3.0], &[7.0]] {
            let n = a.len();
            let mut y = vec![0u8; 20];
            inst.invoke(&[&f32s(a), &b], &mut [&mut y]).expect("invoke");
            assert_eq!(inst.output_dims(0), Some(&[n as u64][..]));
            let y = to_f32s(&y);
            let want: Vec<f32> = (0..5).map(|i| a.get(i).copied().unwrap_or(0.0) + 10.0 * (i + 1) as f32).collect();
            // The first n are a + b; past them (the padding, left in place by a 1-D
            // compaction) a's zeros + b: the staging was zeroed, not left from before.
            assert_eq!(y, want, "extent {n} on {threads:?} threads");
        }
        // Typed: dims other than the bounded one, and the dtype, are checked.
        let a = f32s(&[1.0, 2.0]);
        let mut y = vec![0u8; 20];
        let ins = [TensorRef { dtype: 1, dims: &[2], data: &a }, TensorRef { dtype: 1, dims: &[5], data: &b }];
        let mut outs = [kiln_runtime::TensorMut { dtype: 1, dims: &[5], data: &mut y }];
        inst.invoke_tensors(0, &ins, &mut outs).expect("typed, extent 2");
        assert_eq!(inst.output_dims(0), Some(&[2u64][..]));
    }
}

#[test]
fn extents_outside_the_range_are_typed_errors() {
    let file = write_program(&bounded_program(5, 2));
    let m = load(&file, None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    let b = f32s(&[0.0; 5]);
    let mut y = vec![0u8; 20];
    for n in [0usize, 1, 6] {
        match inst.invoke(&[&f32s(&vec![1.0; n]), &b], &mut [&mut y]) {
            Err(RuntimeError::InputExtent { name, axis: 0, min: 2, bound: 5, got }) => {
                assert_eq!((name.as_str(), got), ("a", n as u64));
            }
            other => panic!("extent {n} of 2..=5: {other:?}"),
        }
    }
    let e = inst.invoke(&[&f32s(&[1.0; 6]), &b], &mut [&mut y]).expect_err("over");
    assert_eq!(
        e.to_string(),
        "input a has extent 6 along its bounded axis 0; the module takes 2..=5 (compile with a larger bound in --input-shape)"
    );
    // Not a whole number of positions.
    match inst.invoke(&[&[0u8; 10][..], &b], &mut [&mut y]) {
        Err(RuntimeError::InputSize { .. }) => {}
        other => panic!("10 bytes of f32: {other:?}"),
    }
    // The other inputs keep their exact sizes.
    match inst.invoke(&[&f32s(&[1.0; 3]), &f32s(&[1.0; 3])], &mut [&mut y]) {
        Err(RuntimeError::InputSize { name, .. }) => assert_eq!(name, "b"),
        other => panic!("b of 3: {other:?}"),
    }
    let a = f32s(&[1.0; 3]);
    let ins = [TensorRef { dtype: 1, dims: &[3, 1], data: &a }, TensorRef { dtype: 1, dims: &[5], data: &b }];
    let mut outs = [kiln_runtime::TensorMut { dtype: 1, dims: &[5], data: &mut y }];
    match inst.invoke_tensors(0, &ins, &mut outs) {
        Err(RuntimeError::InputShape { name, .. }) => assert_eq!(name, "a"),
        other => panic!("rank 2 for rank 1: {other:?}"),
    }
}

fn bounded_problem(p: &Program) -> String {
    match Module::verify(&write_program(p), None, u64::MAX) {
        Err(RuntimeError::Invalid(VerifyError::Extent { entry, problem, .. })) => {
            assert_eq!(entry, "main");
            problem
        }
        other => panic!("expected a bounded-dimension error, got {other:?}"),
    }
}

fn d(p: &mut Program) -> &mut BoundedDesc {
    &mut p.entries[0].bounded[0]
}

/// One change to a program.
type Edit = fn(&mut Program);

/// The problem `base` has once `edit` has changed it.
fn edited(base: Program, edit: impl FnOnce(&mut Program)) -> String {
    let mut p = base;
    edit(&mut p);
    bounded_problem(&p)
}

#[test]
fn the_verifier_refuses_malformed_bounded_dimensions() {
    Module::verify(&write_program(&bounded_program(5, 1)), None, u64::MAX).expect("valid");
    let refused: [(&str, Edit); 10] = [
        ("names input 2", |p| d(p).input = 2),
        ("do not have the bound", |p| d(p).axis = 1),
        ("do not have the bound", |p| d(p).bound = 4),
        ("smallest extent 6", |p| d(p).min = 6),
        ("staging", |p| d(p).staging.length = 16),
        ("staging", |p| d(p).staging.slot = Slot::Input(0)),
        ("extent binding", |p| d(p).extent.length = 4),
        ("run past its", |p| d(p).extent.offset = p.entries[0].arena_size - 4),
        ("overlap", |p| d(p).extent.offset = d(p).staging.offset + 8),
        ("more than one bounded dimension", |p| {
            let again = d(p).clone();
            p.entries[0].bounded.push(again);
        }),
    ];
    for (needle, edit) in refused {
        let problem = edited(bounded_program(5, 1), edit);
        assert!(problem.contains(needle), "{problem:?} does not say {needle:?}");
    }
}

/// `bounded_program(6, 1)` whose add (command 1, six one-element workgroups) lists its
/// workgroups along the bounded dimension (format 1.7): `unit` positions a step, the
/// steps `inner` workgroups each.
fn rows_program(unit: u64, inner: u64) -> Program {
    let mut p = bounded_program(6, 1);
    p.entries[0].bounded_rows = vec![BoundedRows { command: 1, dim: 0, outer: 1, span: 6 / unit, unit, inner }];
    p
}

#[test]
fn workgroups_past_the_extent_do_not_run_on_both_drivers() {
    let b = f32s(&[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
    // One position a step: the first n workgroups run. Two positions a step of two
    // workgroups: ⌈n / 2⌉ steps, 2 · ⌈n / 2⌉ workgroups.
    for (unit, inner, runs) in [(1u64, 1u64, [6usize, 3, 1]), (2, 2, [6, 4, 2])] {
        let file = write_program(&rows_program(unit, inner));
        let m = load(&file, None).expect("load");
        for threads in [None, Some(2), Some(4)] {
            let mut inst = match threads {
                None => Instance::new(&m).expect("instance"),
                Some(t) => Instance::with_threads(&m, t).expect("instance"),
            };
            for (a, ran) in [&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0][..], &[1.0, 2.0, 3.0], &[7.0]].into_iter().zip(runs) {
                let n = a.len();
                let mut y = vec![0u8; 24];
                inst.invoke(&[&f32s(a), &b], &mut [&mut y]).expect("invoke");
                assert_eq!(inst.output_dims(0), Some(&[n as u64][..]));
                let y = to_f32s(&y);
                for (i, v) in y.iter().enumerate() {
                    let what = format!("unit {unit}, extent {n}, position {i} on {threads:?} threads: {y:?}");
                    if i < ran {
                        // Run: a + b (the staging's zeros past the extent).
                        assert_eq!(*v, a.get(i).copied().unwrap_or(0.0) + 10.0 * (i + 1) as f32, "{what}");
                    } else {
                        // Not run: the plan's fill (NaN) before the add is still there.
                        assert!(v.is_nan(), "{what}");
                    }
                }
            }
        }
    }
}

#[test]
fn the_verifier_refuses_malformed_bounded_rows() {
    Module::verify(&write_program(&rows_program(2, 2)), None, u64::MAX).expect("valid");
    fn r(p: &mut Program) -> &mut BoundedRows {
        &mut p.entries[0].bounded_rows[0]
    }
    // Each edit of `rows_program(unit, inner)`.
    let refused: [((u64, u64), &str, Edit); 8] = [
        ((1, 1), "not a dispatch", |p| r(p).command = 0),
        ((1, 1), "not a dispatch", |p| r(p).command = 99),
        ((1, 1), "bounded dimension 1", |p| r(p).dim = 1),
        ((1, 1), "do not split 6 workgroups", |p| r(p).inner = 2),
        ((2, 2), "do not split", |p| r(p).span = 6),
        ((1, 1), "do not split", |p| r(p).unit = 0),
        ((1, 1), "listed twice", |p| {
            let again = *r(p);
            p.entries[0].bounded_rows.push(again);
        }),
        // A second dispatch, listed first: the list must ascend by command.
        ((1, 1), "not in ascending command order", |p| {
            let e = &mut p.entries[0];
            e.commands.push(e.commands[1].clone());
            let later = BoundedRows { command: e.commands.len() as u32 - 1, ..e.bounded_rows[0] };
            e.bounded_rows.insert(0, later);
        }),
    ];
    for ((unit, inner), needle, edit) in refused {
        let problem = edited(rows_program(unit, inner), edit);
        assert!(problem.contains(needle), "{problem:?} does not say {needle:?}");
    }
}
