//! Data-dependent extents (format 1.5): after the plan runs, each extent is checked
//! against its bound (`RuntimeError::ExtentOutOfBound`, never a truncation), the
//! outputs it sizes are compacted in place and reported at their actual dims, on both
//! drivers; and the load-time verifier refuses every malformed extent (one field broken
//! per case).

mod common;

use common::*;
use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::{Instance, Module, RuntimeError, VerifyError};

fn run(p: &Program, threads: Option<usize>) -> Result<(Vec<u64>, Vec<f32>), RuntimeError> {
    let file = write_program(p);
    let m = load(&file, None).expect("load");
    let mut inst = match threads {
        None => Instance::new(&m).expect("instance"),
        Some(t) => Instance::with_threads(&m, t).expect("instance"),
    };
    let a = f32s(&[1.0, 2.0, 3.0, 4.0]);
    let b = f32s(&[10.0, 20.0, 30.0, 40.0]);
    let mut y = vec![0u8; 16];
    inst.invoke(&[&a, &b], &mut [&mut y])?;
    Ok((inst.output_dims(0).expect("dims").to_vec(), to_f32s(&y)))
}

#[test]
fn outputs_report_their_extent_on_both_drivers() {
    for threads in [None, Some(2)] {
        for n in 0..=4i64 {
            let (dims, y) = run(&extent_program(4, n), threads).expect("invoke");
            assert_eq!(dims, [n as u64], "{threads:?} threads");
            // Axis 0 of a 1-D output: the first n elements are the data.
            assert_eq!(&y[..n as usize], &[11.0, 22.0, 33.0, 44.0][..n as usize]);
        }
        // Without extents, the signature's dims.
        let file = write_program(&add_program(4));
        let m = load(&file, None).expect("load");
        let mut inst = Instance::new(&m).expect("instance");
        let (a, mut y) = (f32s(&[0.0; 4]), vec![0u8; 16]);
        inst.invoke(&[&a, &a], &mut [&mut y]).expect("invoke");
        assert_eq!(inst.output_dims(0), Some(&[4u64][..]));
        assert_eq!(inst.output_dims(1), None);
    }
}

#[test]
fn an_extent_above_its_bound_or_negative_is_a_typed_error() {
    for threads in [None, Some(2)] {
        for n in [5, 1 << 40, -1] {
            match run(&extent_program(4, n), threads) {
                Err(RuntimeError::ExtentOutOfBound { name, extent, bound }) => {
                    assert_eq!((name.as_str(), extent, bound), ("y", n, 4));
                }
                other => panic!("extent {n}: expected ExtentOutOfBound, got {other:?}"),
            }
        }
    }
    let e = run(&extent_program(4, 5), None).expect_err("over");
    assert!(e.to_string().contains("--max-dim"), "{e}");
}

/// A 2-D output sized along axis 1: rows move forward to the compact layout.
#[test]
fn compaction_of_an_inner_axis() {
    let mut p = add_program(6);
    let e = &mut p.entries[0];
    e.outputs[0].dims = vec![2, 3];
    e.commands.insert(
        0,
        Command::Fill { dst: Binding { slot: Slot::Arena, offset: 0, length: 8 }, pattern: 2, pattern_len: 8 },
    );
    e.extents = vec![ExtentDesc {
        name: "y".into(),
        binding: Binding { slot: Slot::Arena, offset: 0, length: 8 },
        bound: 3,
        outputs: vec![(0, 1)],
    }];
    let file = write_program(&p);
    let m = load(&file, None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    let a = f32s(&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    let z = f32s(&[0.0; 6]);
    let mut y = vec![0u8; 24];
    inst.invoke(&[&a, &z], &mut [&mut y]).expect("invoke");
    assert_eq!(inst.output_dims(0), Some(&[2u64, 2][..]));
    // [[0,1,2],[3,4,5]] at extent 2 along axis 1: [[0,1],[3,4]].
    assert_eq!(&to_f32s(&y)[..4], &[0.0, 1.0, 3.0, 4.0]);
}

fn x(p: &mut Program) -> &mut ExtentDesc {
    &mut p.entries[0].extents[0]
}

fn extent_problem(p: &Program) -> String {
    match Module::verify(&write_program(p), None, u64::MAX) {
        Err(RuntimeError::Invalid(VerifyError::Extent { entry, extent, problem })) => {
            assert_eq!((entry.as_str(), extent.as_str()), ("main", "y"));
            problem
        }
        other => panic!("expected an extent error, got {other:?}"),
    }
}

/// One change to a program.
type Edit = fn(&mut Program);

#[test]
fn the_verifier_refuses_malformed_extents() {
    Module::verify(&write_program(&extent_program(4, 2)), None, u64::MAX).expect("valid");
    let refused: [(&str, Edit); 7] = [
        ("not 8 bytes", |p| x(p).binding.length = 4),
        ("not 8 bytes of the arena", |p| x(p).binding.slot = Slot::Output(0)),
        ("run past its", |p| x(p).binding.offset = p.entries[0].arena_size - 4),
        ("output 1", |p| x(p).outputs = vec![(1, 0)]),
        ("not the bound", |p| x(p).outputs = vec![(0, 1)]),
        ("not the bound", |p| x(p).bound = 3),
        ("more than one extent", |p| x(p).outputs = vec![(0, 0), (0, 0)]),
    ];
    for (needle, edit) in refused {
        let mut p = extent_program(4, 2);
        edit(&mut p);
        let problem = extent_problem(&p);
        assert!(problem.contains(needle), "{problem:?} does not say {needle:?}");
    }
}

#[test]
fn extents_need_format_1_5() {
    // A 1.4 reader refuses a 1.5 file by its version (it would run bound-sized outputs).
    let reader = kiln_module::Version { major: 1, minor: 4 };
    assert!(!reader.can_read(kiln_module::FORMAT_VERSION));
    assert_eq!(kiln_module::format::EXTENTS_MINOR, 5);
}
