//! The CUDA driver (feature `cuda`) on a hand-made artifact: a hand-written PTX kernel
//! (`y = a + b`, assembled here by `ptxas -arch=sm_90a`), fills of every path
//! (`graph::fill_memsets`) and copies.
//!
//! Without a driver (this machine, CI) the load is a typed error naming what is missing;
//! the tests marked `#[ignore = "needs a CUDA driver …"]` run the artifact on a GPU
//! (`cargo test -p kiln-runtime --features cuda --test cuda -- --ignored` there), with
//! expected values computed here on the host.
#![cfg(feature = "cuda")]

mod common;

use common::{cuda_graph_expected as expected, cuda_graph_program as program, f32s, ADD_PTX};
use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::cuda::{driver_present, CudaInstance, CudaModule, LoadedForm};
use kiln_runtime::RuntimeError;

#[path = "../../kiln-codegen/tests/ptxas/mod.rs"]
mod ptxas;

#[test]
fn the_hand_written_kernel_assembles_for_sm_90a() {
    ptxas::assemble_ptx("runtime-cuda", "add", ADD_PTX).expect("ptxas accepts the test kernel");
}

#[test]
fn without_a_driver_loading_is_a_typed_error() {
    let file = write_program(&program());
    match driver_present() {
        Err(e) => {
            assert_eq!(e.to_string(), "no CUDA driver: libcuda.so.1 not found");
            let err = CudaModule::load(&file, None).expect_err("no driver");
            assert!(matches!(&err, RuntimeError::NoCudaDriver { .. }), "{err:?}");
            assert_eq!(err.to_string(), "no CUDA driver: libcuda.so.1 not found");
        }
        // On a machine with a GPU the same artifact loads.
        Ok(()) => {
            CudaModule::load(&file, None).expect("loads where a driver is present");
        }
    }
}

#[test]
#[ignore = "needs a CUDA driver (scripts/gpu-test)"]
fn the_plan_runs_as_one_graph_and_step_by_step() {
    let file = write_program(&program());
    let m = CudaModule::load(&file, None).expect("load");
    assert_eq!(m.form(), LoadedForm::Ptx);
    let mut inst = CudaInstance::new(&m).expect("instance");
    for round in 0..3 {
        let a: Vec<f32> = (0..4).map(|i| (i + round) as f32 * 1.25).collect();
        let bv: Vec<f32> = (0..4).map(|i| 10.0 - (i * round) as f32).collect();
        let (want_y, want_z) = expected(&a, &bv);
        let (mut y, mut z) = (vec![0u8; 16], vec![0u8; 24]);
        inst.invoke(&[&f32s(&a), &f32s(&bv)], &mut [&mut y, &mut z]).expect("invoke");
        assert_eq!((&y, &z), (&want_y, &want_z), "round {round}");
    }
    // Command by command on the stream: the same bytes.
    let (a, bv) = ([1.0f32, 2.0, 3.0, 4.0], [0.25f32; 4]);
    inst.write_inputs(0, &[&f32s(&a), &f32s(&bv)]).expect("inputs");
    for c in 0..m.program().entries[0].commands.len() {
        inst.run_command(0, c).expect("command");
    }
    let (want_y, want_z) = expected(&a, &bv);
    assert_eq!(inst.read_binding(0, 7, 1).expect("y"), want_y);
    assert_eq!(inst.read_binding(0, 0, 0).expect("z"), want_z);
    // Device-resident: the inputs stay where `write_inputs` put them.
    inst.invoke_resident(0).expect("resident");
    assert_eq!(inst.read_binding(0, 7, 1).expect("y"), want_y);
    assert!(inst.input_ptr(0, 1).is_some() && inst.output_ptr(0, 2).is_none());
    // Arguments are checked as on the CPU.
    let err = inst.invoke(&[&f32s(&a)], &mut []).expect_err("one input");
    assert!(matches!(err, RuntimeError::InputCount { expected: 2, got: 1, .. }), "{err:?}");
    let (mut y, mut z) = (vec![0u8; 12], vec![0u8; 24]);
    let err = inst.invoke(&[&f32s(&a), &f32s(&bv)], &mut [&mut y, &mut z]).expect_err("short output");
    assert!(matches!(err, RuntimeError::OutputSize { expected: 16, got: 12, .. }), "{err:?}");
}

#[test]
#[ignore = "needs a CUDA driver (scripts/gpu-test)"]
fn a_cubin_that_does_not_load_falls_back_to_ptx() {
    let mut p = program();
    let mut cubin = p.executables[0].clone();
    cubin.features = CUDA_CUBIN_SM90A;
    cubin.code = b"\x7fELF not really a cubin".to_vec();
    p.executables.push(cubin);
    p.kernels[0].variants.insert(0, Variant::cpu(1, 0, 0));
    let file = write_program(&p);
    let m = CudaModule::load(&file, None).expect("load");
    assert_eq!(m.form(), LoadedForm::Ptx);
    assert!(m.cubin_fallback().is_some());
    assert_eq!(m.variants(), [Some(1)]);
    let mut inst = CudaInstance::new(&m).expect("instance");
    let (want_y, want_z) = expected(&[0.0; 4], &[1.0; 4]);
    let (mut y, mut z) = (vec![0u8; 16], vec![0u8; 24]);
    inst.invoke(&[&f32s(&[0.0; 4]), &f32s(&[1.0; 4])], &mut [&mut y, &mut z]).expect("invoke");
    assert_eq!((y, z), (want_y, want_z));
}

#[test]
#[ignore = "needs a CUDA driver (scripts/gpu-test)"]
fn ptx_the_driver_refuses_names_the_executable_and_the_log() {
    let mut p = program();
    p.executables[0].code = ADD_PTX.replace("add.f32", "add.f99").into_bytes();
    let file = write_program(&p);
    let err = CudaModule::load(&file, None).expect_err("bad PTX");
    assert!(matches!(&err, RuntimeError::CudaModuleLoad { executable: 0, .. }), "{err:?}");
    assert!(!err.to_string().contains('\n'), "{err}");
}
