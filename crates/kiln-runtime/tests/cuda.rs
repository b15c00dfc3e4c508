//! The CUDA driver (feature `cuda`) on a hand-made artifact: a hand-written PTX kernel
//! (`y = a + b`, assembled here by `ptxas -arch=sm_90a`), fills of every path
//! (`graph::fill_memsets`) and copies.
//!
//! Without a driver (this machine, CI) the load is a typed error naming what is missing;
//! the tests marked `#[ignore = "needs a CUDA driver …"]` run the artifact on a GPU
//! (`cargo test -p kiln-runtime --features cuda --test cuda -- --ignored` there), with
//! expected values computed here on the host.
#![cfg(feature = "cuda")]

use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::cuda::{driver_present, CudaInstance, CudaModule, LoadedForm};
use kiln_runtime::RuntimeError;

#[path = "../../kiln-codegen/tests/ptxas/mod.rs"]
mod ptxas;

const ADD_PTX: &str = "\
.version 8.0
.target sm_90a
.address_size 64

.visible .entry add(.param .u64 a, .param .u64 b, .param .u64 y)
{
	.reg .pred %p<2>;
	.reg .b32 %r<5>;
	.reg .b64 %rd<8>;
	.reg .f32 %f<4>;
	ld.param.u64 %rd1, [a];
	ld.param.u64 %rd2, [b];
	ld.param.u64 %rd3, [y];
	mov.u32 %r1, %tid.x;
	mov.u32 %r2, %ctaid.x;
	mov.u32 %r3, %ntid.x;
	mad.lo.u32 %r4, %r2, %r3, %r1;
	setp.ge.u32 %p1, %r4, 4;
	@%p1 bra DONE;
	mul.wide.u32 %rd4, %r4, 4;
	add.s64 %rd5, %rd1, %rd4;
	ld.global.f32 %f1, [%rd5];
	add.s64 %rd6, %rd2, %rd4;
	ld.global.f32 %f2, [%rd6];
	add.f32 %f3, %f1, %f2;
	add.s64 %rd7, %rd3, %rd4;
	st.global.f32 [%rd7], %f3;
DONE:
	ret;
}
";

fn b(slot: Slot, offset: u64, length: u64) -> Binding {
    Binding { slot, offset, length }
}

fn t(name: &str, dtype: u32, dims: &[u64], bytes: u64) -> TensorDesc {
    TensorDesc { name: name.into(), dtype, dims: dims.to_vec(), bytes }
}

/// `main(a: f32[4], b: f32[4]) -> (y: f32[4], z: u8[24])`: y = a + b + c (c a constant
/// vector, added by a second dispatch of the same kernel), computed in the arena and
/// copied out; z filled with an 8-byte pattern (bytes 0..16), a 2-byte pattern at an odd
/// offset with a partial last repetition (17..24), and byte 16 left as the fill of a
/// 4-byte zero pattern before them.
fn program() -> Program {
    let ptx = ADD_PTX.as_bytes().to_vec();
    let c: Vec<u8> = [0.5f32, -1.0, 2.0, 8.0].iter().flat_map(|x| x.to_le_bytes()).collect();
    Program {
        devices: vec![Device { kind: DeviceKind::Cuda, name: "cuda".into() }],
        entries: vec![EntryPoint {
            name: "main".into(),
            inputs: vec![t("a", 1, &[4], 16), t("b", 1, &[4], 16)],
            outputs: vec![t("y", 1, &[4], 16), t("z", 2, &[24], 24)],
            arena_size: 128,
            arena_align: 64,
            commands: vec![
                Command::Fill { dst: b(Slot::Output(1), 0, 24), pattern: 0, pattern_len: 4 },
                Command::Dispatch {
                    kernel: 0,
                    device: 0,
                    workgroups: 1,
                    bindings: vec![b(Slot::Input(0), 0, 16), b(Slot::Input(1), 0, 16), b(Slot::Arena, 0, 16)],
                    push_constants: vec![],
                    work_ns: 0,
                },
                Command::Barrier,
                Command::Fill { dst: b(Slot::Output(1), 0, 16), pattern: 0x0102_0304_0506_0708, pattern_len: 8 },
                Command::Fill { dst: b(Slot::Output(1), 17, 7), pattern: 0xabcd, pattern_len: 2 },
                Command::Dispatch {
                    kernel: 0,
                    device: 0,
                    workgroups: 1,
                    bindings: vec![b(Slot::Arena, 0, 16), b(Slot::Constants, 0, 16), b(Slot::Arena, 64, 16)],
                    push_constants: vec![],
                    work_ns: 0,
                },
                Command::Barrier,
                Command::Copy { src: b(Slot::Arena, 64, 16), dst: b(Slot::Output(0), 0, 16) },
            ],
            buffers: vec![],
        }],
        kernels: vec![Kernel {
            name: "add".into(),
            variants: vec![Variant { executable: 0, entry: 0, features: 0 }],
            class: Some(KernelClass::Elementwise),
        }],
        executables: vec![Executable {
            device: DeviceKind::Cuda,
            features: 0,
            code: ptx,
            entries: vec![("add".into(), 0)],
            relocs: vec![],
            launches: vec![Launch { block: 32, shared: 0, params: 3 }],
        }],
        constants: Constants::Embedded(c),
        debug: None,
    }
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// What `program()` computes, on the host.
fn expected(a: &[f32], bv: &[f32]) -> (Vec<u8>, Vec<u8>) {
    let c = [0.5f32, -1.0, 2.0, 8.0];
    let y: Vec<f32> = (0..4).map(|i| a[i] + bv[i] + c[i]).collect();
    let mut z = vec![0u8; 24];
    for (i, x) in z[..16].iter_mut().enumerate() {
        *x = 0x0102_0304_0506_0708u64.to_le_bytes()[i % 8];
    }
    for (i, x) in z[17..].iter_mut().enumerate() {
        *x = 0xabcdu16.to_le_bytes()[i % 2];
    }
    (f32s(&y), z)
}

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
    p.kernels[0].variants.insert(0, Variant { executable: 1, entry: 0, features: 0 });
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
