//! The local-sync driver end to end with hand-assembled kernels: dispatch (with
//! workgroup ranges and the helper table), barrier, copy and fill; argument checks;
//! arenas; constants and external weights.

mod common;

use common::*;
use kiln_module::sections::write_program;
use kiln_runtime::{Instance, RuntimeError, TensorMut, TensorRef};

#[test]
fn add_kernel_runs_over_all_workgroups() {
    let file = Aligned::new(&write_program(&add_program(5)), 0);
    let m = load(file.bytes(), None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    let a = f32s(&[1.0, 2.0, 3.0, 4.0, 0.5]);
    let b = f32s(&[10.0, 20.0, 30.0, 40.0, -0.25]);
    let mut y = vec![0u8; 20];
    inst.invoke(&[&a, &b], &mut [&mut y]).expect("invoke");
    assert_eq!(to_f32s(&y), [11.0, 22.0, 33.0, 44.0, 0.25]);
    // Again, with other values: the same instance, the same path.
    let a2 = f32s(&[-1.0; 5]);
    inst.invoke(&[&a2, &b], &mut [&mut y]).expect("invoke");
    assert_eq!(to_f32s(&y), [9.0, 19.0, 29.0, 39.0, -1.25]);
}

#[test]
fn copy_fill_and_constants() {
    let file = Aligned::new(&misc_file(), 0);
    let m = load(file.bytes(), None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    let mut y = [0u8; 16];
    inst.invoke(&[], &mut [&mut y[..]]).expect("invoke");
    assert_eq!(y, MISC_EXPECTED);
    // Aligned in memory: the constants are used in place.
    assert!(file.bytes().as_ptr_range().contains(&m.constants().as_ptr()));
}

#[test]
fn misaligned_constants_are_copied_once_aligned() {
    let (p, pool) = misc_program(false);
    let file = Aligned::new(&write_program(&p), 8);
    let m = load(file.bytes(), None).expect("load");
    assert_eq!(m.constants(), &pool[..]);
    assert_eq!(m.constants().as_ptr() as usize % 64, 0);
    let mut y = [0u8; 16];
    Instance::new(&m).expect("instance").invoke(&[], &mut [&mut y[..]]).expect("invoke");
    assert_eq!(y, MISC_EXPECTED);
}

#[test]
fn helper_table_reaches_kernels() {
    let file = misc_file();
    let m = load(&file, None).expect("load");
    let sig = m.signature();
    let exp = sig.find("exp").expect("exp entry");
    assert_eq!(exp.index, 1);
    let mut inst = Instance::new(&m).expect("instance");
    let x = 1.0f32.to_le_bytes();
    let mut y = [0u8; 4];
    inst.invoke_entry(exp.index, &[&x], &mut [&mut y[..]]).expect("invoke");
    let e = f32::from_le_bytes(y);
    assert!((e - std::f32::consts::E).abs() < 1e-6, "exp(1) = {e}");
    let x = (-2.0f32).to_le_bytes();
    inst.invoke_entry(exp.index, &[&x], &mut [&mut y[..]]).expect("invoke");
    assert!((f32::from_le_bytes(y) - 0.135_335_28).abs() < 1e-7);
}

#[test]
fn typed_front_checks_dtype_and_shape() {
    let file = write_program(&add_program(2));
    let m = load(&file, None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    let (a, b) = (f32s(&[1.0, 2.0]), f32s(&[3.0, 4.0]));
    let mut y = vec![0u8; 8];
    {
        let mut outs = [TensorMut { dtype: 1, dims: &[2], data: &mut y }];
        let ins = [TensorRef { dtype: 1, dims: &[2], data: &a }, TensorRef { dtype: 1, dims: &[2], data: &b }];
        inst.invoke_tensors(0, &ins, &mut outs).expect("typed invoke");
    }
    assert_eq!(to_f32s(&y), [4.0, 6.0]);
    let mut outs = [TensorMut { dtype: 1, dims: &[2], data: &mut y }];
    let e = inst
        .invoke_tensors(
            0,
            &[TensorRef { dtype: 1, dims: &[2], data: &a }, TensorRef { dtype: 7, dims: &[1], data: &b }],
            &mut outs,
        )
        .expect_err("dtype");
    assert!(matches!(&e, RuntimeError::InputDtype { name, expected: 1, got: 7 } if name == "b"));
    assert_eq!(e.to_string(), "input b must be f32, got i64");
    let e = inst
        .invoke_tensors(
            0,
            &[TensorRef { dtype: 1, dims: &[1, 2], data: &a }, TensorRef { dtype: 1, dims: &[2], data: &b }],
            &mut outs,
        )
        .expect_err("shape");
    assert_eq!(e.to_string(), "input a must have shape [2], got [1, 2]");
    let mut short = [0u8; 8];
    let mut outs = [TensorMut { dtype: 1, dims: &[2, 1], data: &mut short }];
    let ins = [TensorRef { dtype: 1, dims: &[2], data: &a }, TensorRef { dtype: 1, dims: &[2], data: &b }];
    let e = inst.invoke_tensors(0, &ins, &mut outs).expect_err("output shape");
    assert_eq!(e.to_string(), "output y has shape [2], buffer given as [2, 1]");
}

#[test]
fn raw_front_checks_counts_and_sizes() {
    let file = write_program(&add_program(3));
    let m = load(&file, None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    let a = f32s(&[1.0; 3]);
    let mut y = vec![0u8; 12];
    let e = inst.invoke(&[&a], &mut [&mut y]).expect_err("count");
    assert_eq!(e.to_string(), "main takes 2 inputs, 1 given");
    let e = inst.invoke(&[&a, &a[..8]], &mut [&mut y]).expect_err("size");
    assert!(matches!(&e, RuntimeError::InputSize { name, expected: 12, got: 8 } if name == "b"));
    assert_eq!(e.to_string(), "input b must be 12 bytes, got 8");
    let e = inst.invoke(&[&a, &a], &mut []).expect_err("outputs");
    assert!(matches!(e, RuntimeError::OutputCount { expected: 1, got: 0, .. }));
    let mut big = vec![0u8; 16];
    let e = inst.invoke(&[&a, &a], &mut [&mut big]).expect_err("output size");
    assert_eq!(e.to_string(), "output buffer y must be 12 bytes, got 16");
    let e = inst.invoke_entry(4, &[&a, &a], &mut [&mut y]).expect_err("entry");
    assert!(matches!(e, RuntimeError::NoSuchEntry { .. }));
}

#[test]
fn caller_arena() {
    let file = write_program(&add_program(4));
    let m = load(&file, None).expect("load");
    assert_eq!((m.verified().limits().arena_size, m.verified().limits().arena_align), (80, 64));
    let mut mem = vec![0u8; 80 + 128];
    let off = mem.as_ptr().align_offset(64);
    {
        let e = Instance::with_arena(&m, &mut mem[off..off + 79]).expect_err("small");
        assert_eq!(e.to_string(), "arena of 79 bytes given, the module needs 80");
    }
    {
        let e = Instance::with_arena(&m, &mut mem[off + 8..off + 96]).expect_err("misaligned");
        assert!(matches!(e, RuntimeError::ArenaMisaligned { align: 64, .. }));
    }
    let mut inst = Instance::with_arena(&m, &mut mem[off..off + 80]).expect("arena");
    let a = f32s(&[1.0, 2.0, 3.0, 4.0]);
    let mut y = vec![0u8; 16];
    inst.invoke(&[&a, &a], &mut [&mut y]).expect("invoke");
    assert_eq!(to_f32s(&y), [2.0, 4.0, 6.0, 8.0]);
    drop(inst);
    // The sum was computed in the caller's arena at offset 64.
    assert_eq!(to_f32s(&mem[off + 64..off + 80]), [2.0, 4.0, 6.0, 8.0]);
}

#[test]
fn external_weights() {
    let (p, pool) = misc_program(true);
    let file = write_program(&p);
    let e = load(&file, None).expect_err("missing");
    assert!(matches!(&e, RuntimeError::WeightsMissing { file, size: 64 } if file == "misc.weights"));
    let e = load(&file, Some(&pool[..63])).expect_err("size");
    assert!(matches!(e, RuntimeError::WeightsMismatch { expected_size: 64, got_size: 63, got_hash: None, .. }));
    assert_eq!(e.to_string(), "weights file has 63 bytes, the module was compiled with misc.weights of 64 bytes");
    let mut wrong = pool.clone();
    wrong[63] ^= 1;
    let e = load(&file, Some(&wrong)).expect_err("hash");
    assert!(matches!(e, RuntimeError::WeightsMismatch { got_hash: Some(_), .. }));
    let w = Aligned::new(&pool, 0);
    let m = load(&file, Some(w.bytes())).expect("load");
    let mut y = [0u8; 16];
    Instance::new(&m).expect("instance").invoke(&[], &mut [&mut y[..]]).expect("invoke");
    assert_eq!(y, MISC_EXPECTED);
    // Embedded module, weights given anyway.
    let (p, pool) = misc_program(false);
    let e = load(&write_program(&p), Some(&pool)).expect_err("not expected");
    assert!(matches!(e, RuntimeError::WeightsNotExpected));
}

#[test]
fn signature_accessors() {
    let file = misc_file();
    let m = load(&file, None).expect("load");
    let sig = m.signature();
    assert_eq!(sig.len(), 2);
    let names: Vec<_> = sig.entries().map(|e| e.name).collect();
    assert_eq!(names, ["main", "exp"]);
    let main = sig.entry(0).expect("main");
    assert!(main.inputs.is_empty());
    assert_eq!(
        (main.outputs[0].name, main.outputs[0].dtype, &main.outputs[0].dims[..], main.outputs[0].bytes),
        ("y", 2, &[16u64][..], 16)
    );
    assert!(sig.find("nope").is_none());
    assert_eq!(m.verified().variants(), [0, 0, 0]);
}

#[test]
fn module_without_main() {
    let (mut p, _) = misc_program(false);
    p.entries[0].name = "first".into();
    let file = write_program(&p);
    let m = load(&file, None).expect("load");
    let mut y = [0u8; 16];
    let e = Instance::new(&m).expect("instance").invoke(&[], &mut [&mut y[..]]).expect_err("no main");
    assert_eq!(e.to_string(), "the module has no entry point main");
}
