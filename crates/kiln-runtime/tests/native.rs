//! `Module::load` with the runtime's own CPU loader and helper table: relocations are
//! applied, helpers are reached, host features are detected.

mod common;

use common::*;
use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::{ConditionProblem, Instance, Module, RuntimeError, VerifyError};

#[test]
fn relocations_are_applied() {
    let file = write_program(&reloc_program());
    let m = Module::load(&file, None).expect("load");
    let mut inst = Instance::new(&m).expect("instance");
    let mut y = [0u8; 4];
    inst.invoke(&[], &mut [&mut y[..]]).expect("pcrel");
    assert_eq!(f32::from_le_bytes(y), 42.5);
    inst.invoke_entry(1, &[], &mut [&mut y[..]]).expect("abs");
    assert_eq!(f32::from_le_bytes(y), -7.25);
}

#[test]
fn native_loader_runs_the_driver_programs() {
    let file = write_program(&add_program(3));
    let m = Module::load(&file, None).expect("load");
    let a = f32s(&[1.0, 2.0, 3.0]);
    let mut y = vec![0u8; 12];
    Instance::new(&m).expect("instance").invoke(&[&a, &a], &mut [&mut y]).expect("invoke");
    assert_eq!(to_f32s(&y), [2.0, 4.0, 6.0]);
    let file = misc_file();
    let m = Module::load(&file, None).expect("load");
    check_misc_entries(&mut Instance::new(&m).expect("instance"), 0.5);
}

#[test]
fn host_features_are_detected_and_checked() {
    let host = kiln_runtime::cpu::host_features();
    #[cfg(target_arch = "x86_64")]
    assert!(host & CpuFeature::Sse2.bit() != 0, "every x86-64 has SSE2");
    let mut p = reloc_program();
    // A feature bit the format does not define is a malformed condition, not a lack.
    p.kernels[0].variants[0].condition = Condition::CpuFeatures(1 << 50);
    let e = Module::load(&write_program(&p), None).expect_err("unknown feature");
    assert!(
        matches!(
            &e,
            RuntimeError::Invalid(VerifyError::Condition {
                problem: ConditionProblem::UnknownCpuFeatures { bits: 0x4_0000_0000_0000 },
                ..
            })
        ),
        "{e:?}"
    );
    // A feature the host lacks, if it lacks one kiln knows.
    if let Some(f) = CpuFeature::ALL.iter().find(|f| host & f.bit() == 0) {
        p.kernels[0].variants[0].condition = Condition::CpuFeatures(f.bit());
        let e = Module::load(&write_program(&p), None).expect_err("missing feature");
        assert!(e.to_string().contains(f.name()), "{e}");
    }
}

#[test]
fn loaded_modules_are_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    let file = write_program(&add_program(2));
    let m = Module::load(&file, None).expect("load");
    assert_send_sync(&m);
    std::thread::scope(|s| {
        for t in 0..4 {
            let m = &m;
            s.spawn(move || {
                let mut inst = Instance::new(m).expect("instance");
                let a = f32s(&[t as f32, 1.0]);
                let mut y = vec![0u8; 8];
                for _ in 0..100 {
                    inst.invoke(&[&a, &a], &mut [&mut y]).expect("invoke");
                }
                assert_eq!(to_f32s(&y), [2.0 * t as f32, 2.0]);
            });
        }
    });
}

/// Without `memory::Routed` as the global allocator (this binary keeps the default), an
/// embedder's allocator cannot be reached: the `_in` forms refuse instead of allocating
/// elsewhere unnoticed.
#[test]
fn an_allocator_without_the_route_is_refused() {
    struct Never;
    unsafe impl kiln_runtime::memory::Allocator for Never {
        fn allocate(&self, _: std::alloc::Layout) -> *mut u8 {
            std::ptr::null_mut()
        }
        unsafe fn deallocate(&self, _: *mut u8, _: std::alloc::Layout) {}
    }
    static NEVER: Never = Never;
    assert!(!kiln_runtime::memory::routed());
    let file = write_program(&add_program(4));
    let e = Module::load_in(&file, None, &NEVER).expect_err("not routed");
    assert!(matches!(e, RuntimeError::AllocatorNotRouted), "{e:?}");
    assert!(e.to_string().contains("#[global_allocator]"), "{e}");
    let m = Module::load(&file, None).expect("load");
    assert!(matches!(Instance::new_in(&m, &NEVER), Err(RuntimeError::AllocatorNotRouted)));
}
