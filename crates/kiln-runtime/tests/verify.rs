//! Load-time checks: container, ABI, features, and every plan inconsistency the
//! verifier must catch so that `invoke` needs no checks. Each case breaks one field of
//! a valid program.

mod common;

use common::*;
use kiln_module::abi::ABI_VERSION;
use kiln_module::program::*;
use kiln_module::sections::write_program;
use kiln_runtime::error::{BindingProblem, BindingRole, CommandProblem};
use kiln_runtime::{ConditionProblem, Module, RuntimeError, VerifyError};

fn verify(p: &Program) -> Result<(), RuntimeError> {
    let file = write_program(p);
    Module::verify(&file, None, u64::MAX).map(|_| ())
}

fn invalid(p: &Program) -> VerifyError {
    match verify(p) {
        Err(RuntimeError::Invalid(e)) => e,
        other => panic!("expected a verifier error, got {other:?}"),
    }
}

fn command_problem(p: &Program) -> (usize, CommandProblem) {
    match invalid(p) {
        VerifyError::Command { entry, command, problem } => {
            assert_eq!(entry, p.entries[0].name);
            (command, problem)
        }
        e => panic!("expected a command error, got {e:?}"),
    }
}

fn dispatch_bindings(p: &mut Program) -> &mut Vec<Binding> {
    match &mut p.entries[0].commands[1] {
        Command::Dispatch { bindings, .. } => bindings,
        _ => unreachable!(),
    }
}

/// The command problem of `add_program(4)` with binding `i` of its dispatch replaced by
/// `with`.
fn dispatch_binding_problem(i: usize, with: Binding) -> CommandProblem {
    let mut p = add_program(4);
    dispatch_bindings(&mut p)[i] = with;
    command_problem(&p).1
}

#[test]
fn the_base_program_verifies() {
    verify(&add_program(4)).expect("valid");
    verify(&misc_program(false).0).expect("valid");
}

#[test]
fn bindings_out_of_range() {
    // Arena is 4·4 + 64 = 80 bytes: 64 + 17 runs past it.
    let mut p = add_program(4);
    dispatch_bindings(&mut p)[2] = b(Slot::Arena, 64, 17);
    let (cmd, problem) = command_problem(&p);
    assert_eq!(cmd, 1);
    assert_eq!(
        problem,
        CommandProblem::Binding {
            role: BindingRole::Dispatch(2),
            problem: BindingProblem::OutOfRange { slot: Slot::Arena, offset: 64, length: 17, size: 80 }
        }
    );
    // Input 1 is 16 bytes.
    assert!(matches!(
        dispatch_binding_problem(1, b(Slot::Input(1), 4, 13)),
        CommandProblem::Binding { problem: BindingProblem::OutOfRange { size: 16, .. }, .. }
    ));
    // Offset + length overflows u64.
    assert!(matches!(
        dispatch_binding_problem(0, b(Slot::Input(0), u64::MAX, 2)),
        CommandProblem::Binding { problem: BindingProblem::OutOfRange { .. }, .. }
    ));
    // No input 2.
    assert_eq!(
        dispatch_binding_problem(0, b(Slot::Input(2), 0, 4)),
        CommandProblem::Binding {
            role: BindingRole::Dispatch(0),
            problem: BindingProblem::NoSuchSlot { slot: Slot::Input(2), count: 2 }
        }
    );
    // No output 1.
    let mut p = add_program(4);
    p.entries[0].commands[3] = Command::Copy { src: b(Slot::Arena, 0, 4), dst: b(Slot::Output(1), 0, 4) };
    assert_eq!(
        command_problem(&p),
        (
            3,
            CommandProblem::Binding {
                role: BindingRole::CopyDestination,
                problem: BindingProblem::NoSuchSlot { slot: Slot::Output(1), count: 1 }
            }
        )
    );
    // Constants: the pool is empty.
    assert!(matches!(
        dispatch_binding_problem(0, b(Slot::Constants, 0, 1)),
        CommandProblem::Binding { problem: BindingProblem::OutOfRange { slot: Slot::Constants, size: 0, .. }, .. }
    ));
    // A buffer of the memory map outside the arena.
    let mut p = add_program(4);
    p.entries[0].buffers[0].binding = b(Slot::Arena, 80, 1);
    assert!(matches!(invalid(&p), VerifyError::Buffer { ref buffer, .. } if buffer == "sum"));
}

#[test]
fn writes_to_read_only_slots() {
    assert_eq!(
        dispatch_binding_problem(2, b(Slot::Input(0), 0, 16)),
        CommandProblem::Binding {
            role: BindingRole::Dispatch(2),
            problem: BindingProblem::ReadOnly { slot: Slot::Input(0) }
        }
    );
    let (mut p, _) = misc_program(false);
    p.entries[0].commands[1] = Command::Fill { dst: b(Slot::Constants, 0, 4), pattern: 0, pattern_len: 1 };
    assert_eq!(
        command_problem(&p).1,
        CommandProblem::Binding {
            role: BindingRole::FillDestination,
            problem: BindingProblem::ReadOnly { slot: Slot::Constants }
        }
    );
    let mut p = add_program(4);
    p.entries[0].commands[3] = Command::Copy { src: b(Slot::Arena, 0, 4), dst: b(Slot::Input(1), 0, 4) };
    assert!(matches!(command_problem(&p).1, CommandProblem::Binding { problem: BindingProblem::ReadOnly { .. }, .. }));
}

#[test]
fn copy_fill_kernel_device_and_push_constants() {
    let mut p = add_program(4);
    p.entries[0].commands[3] = Command::Copy { src: b(Slot::Arena, 64, 16), dst: b(Slot::Output(0), 0, 12) };
    assert_eq!(command_problem(&p), (3, CommandProblem::CopyLengths { src: 16, dst: 12 }));
    for len in [0u8, 3, 5, 16] {
        let mut p = add_program(4);
        p.entries[0].commands[0] = Command::Fill { dst: b(Slot::Arena, 0, 8), pattern: 0, pattern_len: len };
        assert_eq!(command_problem(&p), (0, CommandProblem::FillPatternLen { len }));
    }
    let mut p = add_program(4);
    if let Command::Dispatch { kernel, .. } = &mut p.entries[0].commands[1] {
        *kernel = 3;
    }
    assert_eq!(command_problem(&p).1, CommandProblem::KernelIndex { kernel: 3, count: 3 });
    let mut p = add_program(4);
    if let Command::Dispatch { device, .. } = &mut p.entries[0].commands[1] {
        *device = 1;
    }
    assert_eq!(command_problem(&p).1, CommandProblem::DeviceIndex { device: 1, count: 1 });
    // A CUDA device whose kernels have only CPU code.
    let mut p = add_program(4);
    p.devices[0] = Device { kind: DeviceKind::Cuda, name: "gpu0".into() };
    assert_eq!(command_problem(&p), (1, CommandProblem::NoVariantForDevice { kernel: 1, kind: DeviceKind::Cuda }));
    let mut p = add_program(4);
    if let Command::Dispatch { push_constants, .. } = &mut p.entries[0].commands[1] {
        push_constants.push(1);
    }
    assert_eq!(command_problem(&p).1, CommandProblem::PushConstants { count: 1 });
}

#[test]
fn skip_commands() {
    verify(&skip_program(4)).expect("valid");
    fn skip(p: &mut Program) -> &mut Command {
        &mut p.entries[0].commands[1]
    }
    for length in [0u64, 9] {
        let mut p = skip_program(4);
        *skip(&mut p) = Command::SkipIf { cond: b(Slot::Input(0), 0, length), value: true, count: 1 };
        assert_eq!(command_problem(&p), (1, CommandProblem::ConditionBytes { length }));
    }
    // Input 0 is 16 bytes.
    let mut p = skip_program(4);
    *skip(&mut p) = Command::SkipIf { cond: b(Slot::Input(0), 14, 4), value: false, count: 1 };
    assert_eq!(
        command_problem(&p),
        (
            1,
            CommandProblem::Binding {
                role: BindingRole::Condition,
                problem: BindingProblem::OutOfRange { slot: Slot::Input(0), offset: 14, length: 4, size: 16 }
            }
        )
    );
    // Three commands follow it: skipping them all is fine, one more is not.
    let mut p = skip_program(4);
    *skip(&mut p) = Command::SkipIf { cond: b(Slot::Input(0), 0, 4), value: true, count: 3 };
    verify(&p).expect("a skip to the end");
    *skip(&mut p) = Command::SkipIf { cond: b(Slot::Input(0), 0, 4), value: true, count: 4 };
    assert_eq!(command_problem(&p), (1, CommandProblem::SkipPastEnd { count: 4, remaining: 3 }));
}

#[test]
fn a_skip_in_an_older_format_is_an_unknown_command() {
    // Format 1.4 added `SkipIf` (tag 6): a file that says 1.3 may not hold one.
    let mut file = write_program(&skip_program(4));
    file[10..12].copy_from_slice(&3u16.to_le_bytes());
    kiln_module::reseal::reseal(&mut file);
    match Module::verify(&file, None, u64::MAX) {
        Err(e) => assert!(e.to_string().contains("command tag"), "{e}"),
        Ok(_) => panic!("a 1.3 file with a SkipIf verified"),
    }
}

#[test]
fn tensors_and_arena() {
    let mut p = add_program(4);
    p.entries[0].inputs[1].bytes = 15;
    assert_eq!(
        invalid(&p),
        VerifyError::TensorBytes { entry: "main".into(), tensor: "b".into(), recorded: 15, expected: Some(16) }
    );
    let mut p = add_program(4);
    p.entries[0].outputs[0].dtype = 8;
    assert!(matches!(invalid(&p), VerifyError::UnknownDtype { dtype: 8, .. }));
    let mut p = add_program(4);
    p.entries[0].outputs[0].dims = vec![u64::MAX, 4];
    assert!(matches!(invalid(&p), VerifyError::TensorBytes { expected: None, .. }));
    for align in [0, 3, 8192] {
        let mut p = add_program(4);
        p.entries[0].arena_align = align;
        assert!(matches!(invalid(&p), VerifyError::Arena { align: a, .. } if a == align));
    }
}

#[test]
fn kernels_and_executables() {
    let mut p = add_program(4);
    p.kernels[1].variants.clear();
    assert_eq!(invalid(&p), VerifyError::NoVariants { kernel: "add".into() });
    let mut p = add_program(4);
    p.kernels[2].variants[0].entry = 3;
    assert_eq!(invalid(&p), VerifyError::Variant { kernel: "exp".into(), variant: 0, executable: 0, entry: 3 });
    let mut p = add_program(4);
    p.kernels[2].variants[0].executable = 1;
    assert!(matches!(invalid(&p), VerifyError::Variant { executable: 1, .. }));
    let mut p = add_program(4);
    p.executables[0].entries[1].1 = 96;
    assert_eq!(invalid(&p), VerifyError::Symbol { executable: 0, name: "add".into(), offset: 96, code_len: 96 });
    let mut p = add_program(4);
    p.executables[0].relocs.push(Reloc { offset: 93, kind: RelocKind::Pc32, target: 0, addend: -4 });
    assert!(matches!(invalid(&p), VerifyError::Reloc { index: 0, offset: 93, .. }));
    let mut p = add_program(4);
    p.executables[0].relocs.push(Reloc { offset: 0, kind: RelocKind::Abs64, target: 97, addend: 0 });
    assert!(matches!(invalid(&p), VerifyError::Reloc { target: 97, .. }));
    let mut p = add_program(4);
    p.executables[0].relocs.push(Reloc { offset: 88, kind: RelocKind::Abs64, target: 96, addend: 0 });
    verify(&p).expect("a patch ending at the code's end and a target at its end are fine");
}

#[test]
fn variant_choice_and_missing_features() {
    let mut p = add_program(4);
    let avx512 = CpuFeature::Avx512f.bit() | CpuFeature::Avx512bw.bit();
    p.kernels[1].variants.insert(0, Variant::cpu(0, 1, avx512));
    let file = write_program(&p);
    // A host with only SSE2 skips the AVX-512 variant.
    let v = Module::verify(&file, None, CpuFeature::Sse2.bit()).expect("verify");
    assert_eq!(v.variants(), [0, 1, 0]);
    let v = Module::verify(&file, None, CpuFeature::Sse2.bit() | avx512).expect("verify");
    assert_eq!(v.variants(), [0, 0, 0]);
    // Only variants that need more than the host has.
    p.kernels[1].variants[1].condition =
        Condition::CpuFeatures(CpuFeature::Avx2.bit() | CpuFeature::Fma.bit() | CpuFeature::Avx512vnni.bit());
    let file = write_program(&p);
    let e = Module::verify(&file, None, CpuFeature::Sse2.bit() | CpuFeature::Avx2.bit()).expect_err("missing");
    // Both variants miss two features (avx512f+avx512bw; fma+avx512vnni): on a tie the first
    // is named.
    match &e {
        RuntimeError::MissingCpuFeatures { kernel, names } => {
            assert_eq!(kernel, "add");
            assert_eq!(names, &["avx512f", "avx512bw"]);
        }
        e => panic!("{e:?}"),
    }
    assert_eq!(
        e.to_string(),
        "kernel add needs CPU features this machine lacks: avx512f, avx512bw (compile for this CPU)"
    );
    // The executable's own features count too.
    let mut p = add_program(4);
    p.executables[0].features = CpuFeature::Avx2.bit();
    let e = Module::verify(&write_program(&p), None, CpuFeature::Sse2.bit()).expect_err("exe features");
    assert!(matches!(e, RuntimeError::MissingCpuFeatures { ref names, .. } if names == &["avx2"]));
    // A kernel that no command dispatches, whose only executable is for a GPU.
    let mut p = add_program(4);
    p.executables.push(cuda_executable(1));
    p.kernels[0].variants[0] = Variant::cpu(1, 0, 0);
    let e = Module::verify(&write_program(&p), None, u64::MAX).expect_err("no cpu variant");
    assert!(matches!(e, RuntimeError::NoCpuVariant { ref kernel } if kernel == "copy4"), "{e:?}");
}

#[test]
fn cuda_plans_verify_and_the_cpu_runtime_refuses_them() {
    let p = cuda_add_program();
    let file = write_program(&p);
    let plan = Module::verify_plan(&file).expect("a CUDA plan verifies");
    assert_eq!(plan.program.executables[0].launches.len(), 3);
    let e = Module::verify(&file, None, u64::MAX).expect_err("the CPU runtime refuses it");
    assert!(
        matches!(
            &e,
            RuntimeError::Invalid(VerifyError::Command {
                command: 1,
                problem: CommandProblem::UnsupportedDevice { device: 0, driver: DeviceKind::Cpu, .. },
                ..
            })
        ),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "invalid module: entry main, command 1: device 0 (cuda) is not a CPU; this runtime drives CPUs only"
    );
    // The CUDA runtime's check refuses a CPU plan the same way.
    let cpu = write_program(&add_program(4));
    let plan = Module::verify_plan(&cpu).expect("verifies");
    let e = kiln_runtime::verify::require_device_kind(&plan.program, DeviceKind::Cuda).expect_err("a CPU plan");
    assert!(e.to_string().contains("device 0 (cpu) is not a CUDA device"), "{e}");
}

fn plan_error(p: &Program) -> VerifyError {
    match Module::verify_plan(&write_program(p)) {
        Err(RuntimeError::Invalid(e)) => e,
        other => panic!("expected a verifier error, got {other:?}"),
    }
}

#[test]
fn cuda_launch_records() {
    // One launch per entry of a CUDA executable, none for a CPU one.
    let mut p = cuda_add_program();
    p.executables[0].launches.pop();
    assert_eq!(plan_error(&p), VerifyError::Launches { executable: 0, launches: 2, expected: 3 });
    let mut p = add_program(4);
    p.executables[0].launches.push(Launch { block: 32, shared: 0, params: 1 });
    assert_eq!(plan_error(&p), VerifyError::Launches { executable: 0, launches: 1, expected: 0 });
    // Blocks: multiples of 32 from 32 to 1024; shared memory up to 227 KiB.
    for (block, shared, ok) in [
        (32, 0, true),
        (1024, 227 * 1024, true),
        (0, 0, false),
        (16, 0, false),
        (48, 0, false),
        (1056, 0, false),
        (256, 227 * 1024 + 1, false),
        (u32::MAX, u32::MAX, false),
    ] {
        let mut p = cuda_add_program();
        p.executables[0].launches[2] = Launch { block, shared, params: 3 };
        match Module::verify_plan(&write_program(&p)) {
            Ok(_) => assert!(ok, "block {block}, shared {shared} verified"),
            Err(RuntimeError::Invalid(e)) => {
                assert!(!ok, "block {block}, shared {shared}: {e}");
                assert_eq!(e, VerifyError::Launch { executable: 0, entry: 2, block, shared });
            }
            Err(e) => panic!("{e:?}"),
        }
    }
    // Parameters: the bindings of the dispatch (3 for `add`, kernel 1).
    let mut p = cuda_add_program();
    p.executables[0].launches[1].params = 2;
    assert_eq!(
        plan_error(&p),
        VerifyError::Command {
            entry: "main".into(),
            command: 1,
            problem: CommandProblem::LaunchParams { kernel: 1, variant: 0, params: 2, bindings: 3 }
        }
    );
    // A launch of a kernel nobody dispatches is not held to any binding count.
    let mut p = cuda_add_program();
    p.executables[0].launches[0].params = 9;
    Module::verify_plan(&write_program(&p)).expect("kernel 0 is not dispatched");
    // A cubin variant is checked like the PTX one.
    let mut p = cuda_add_program();
    let mut cubin = cuda_executable(3);
    cubin.features = CUDA_CUBIN_SM90A;
    cubin.launches[1].params = 4;
    p.executables.push(cubin);
    p.kernels[1].variants.insert(0, Variant::cpu(1, 1, 0));
    assert!(matches!(
        plan_error(&p),
        VerifyError::Command { problem: CommandProblem::LaunchParams { variant: 0, params: 4, .. }, .. }
    ));
}

fn set_abi(file: &mut [u8], major: u16, minor: u16) {
    file[12..14].copy_from_slice(&major.to_le_bytes());
    file[14..16].copy_from_slice(&minor.to_le_bytes());
    kiln_module::reseal::reseal(file);
}

#[test]
fn abi_versions_are_named() {
    let mut file = write_program(&add_program(2));
    set_abi(&mut file, 2, 1);
    let e = Module::verify(&file, None, u64::MAX).expect_err("abi");
    assert!(matches!(e, RuntimeError::UnsupportedVersion { .. }));
    assert_eq!(
        e.to_string(),
        format!("module needs ABI 2.1, runtime has {ABI_VERSION}: recompile it or update the runtime")
    );
    assert!(e.to_string().starts_with("module needs ABI 2.1, runtime has 1.0"));
    // A newer minor of the same major is also refused (the runtime lacks its additions).
    set_abi(&mut file, ABI_VERSION.major, ABI_VERSION.minor + 1);
    assert!(matches!(Module::verify(&file, None, u64::MAX), Err(RuntimeError::UnsupportedVersion { .. })));
    set_abi(&mut file, ABI_VERSION.major, ABI_VERSION.minor);
    Module::verify(&file, None, u64::MAX).expect("same ABI");
}

#[test]
fn container_errors_map_to_runtime_errors() {
    let file = write_program(&add_program(2));
    let mut d = file.clone();
    d[0] = b'X';
    let e = Module::verify(&d, None, u64::MAX).expect_err("magic");
    assert!(matches!(e, RuntimeError::BadMagic));
    // A byte of the plan flipped, not resealed: the plan's checksum catches it.
    let m = kiln_module::Module::parse(&file).expect("parse");
    let plan = m.sections().find(|s| s.kind == kiln_module::SectionKind::Plan).expect("plan");
    let mut d = file.clone();
    d[plan.offset as usize + 2] ^= 0x40;
    let e = Module::verify(&d, None, u64::MAX).expect_err("checksum");
    assert_eq!(e.to_string(), "plan section checksum mismatch: the file is corrupt");
    // Resealed, the decoder or verifier sees the change instead.
    kiln_module::reseal::reseal(&mut d);
    assert!(matches!(
        Module::verify(&d, None, u64::MAX),
        Err(RuntimeError::Malformed(_) | RuntimeError::Invalid(_)) | Ok(_)
    ));
    let e = Module::verify(&file[..40], None, u64::MAX).expect_err("short");
    assert!(matches!(e, RuntimeError::Container(_)));
    let mut d = file.clone();
    d[8] = 9;
    let e = Module::verify(&d, None, u64::MAX).expect_err("format");
    assert!(matches!(e, RuntimeError::UnsupportedFormat { .. }));
}

#[test]
fn verifier_messages_read_well() {
    let mut p = add_program(4);
    dispatch_bindings(&mut p)[2] = b(Slot::Arena, 64, 17);
    assert_eq!(
        verify(&p).expect_err("range").to_string(),
        "invalid module: entry main, command 1: binding 2 arena bytes 64..64+17 run past its 80 bytes"
    );
    let mut p = add_program(4);
    p.entries[0].commands[3] = Command::Copy { src: b(Slot::Arena, 0, 4), dst: b(Slot::Input(1), 0, 4) };
    assert_eq!(
        verify(&p).expect_err("ro").to_string(),
        "invalid module: entry main, command 3: copy destination writes input 1, which is read-only"
    );
}

/// Names come from the module: control characters in them are escaped, so a message
/// stays one line whatever the artifact holds.
#[test]
fn names_are_escaped_in_messages() {
    let mut p = add_program(4);
    p.entries[0].name = "main\nrm -rf /\r\u{1b}[2J".into();
    dispatch_bindings(&mut p)[2] = b(Slot::Arena, 64, 17);
    assert_eq!(
        verify(&p).expect_err("range").to_string(),
        "invalid module: entry main\\nrm -rf /\\r\\u{1b}[2J, command 1: binding 2 arena bytes 64..64+17 run past its 80 bytes"
    );
    let mut p = add_program(4);
    p.kernels[1].variants.clear();
    p.kernels[1].name = "add\u{2028}next".into();
    assert_eq!(
        verify(&p).expect_err("no variants").to_string(),
        "invalid module: kernel add\\u{2028}next has no variants"
    );
    // Non-ASCII text that is not a control character is kept as it is.
    let mut p = add_program(4);
    p.entries[0].inputs[0].name = "ä/x:0".into();
    p.entries[0].inputs[0].bytes = 15;
    assert_eq!(
        verify(&p).expect_err("bytes").to_string(),
        "invalid module: entry main, tensor ä/x:0: recorded as 15 bytes, its dtype and shape give 16"
    );
}

/// `verify_plan` checks what needs neither the weights nor the host: a module whose
/// weights are outside verifies without them, and every plan error is still found.
#[test]
fn verify_plan_needs_no_weights_or_host() {
    let (p, pool) = misc_program(true);
    let file = write_program(&p);
    assert!(matches!(Module::verify(&file, None, u64::MAX), Err(RuntimeError::WeightsMissing { .. })));
    let plan = Module::verify_plan(&file).expect("the plan verifies without the weights");
    assert_eq!(plan.program.entries.len(), 2);
    assert_eq!(plan.limits, Module::verify(&file, Some(&pool), u64::MAX).expect("with weights").limits());
    assert_eq!(plan.container.abi(), ABI_VERSION);
    // A kernel whose only variant needs a feature no host has: the plan is still valid.
    let mut p = add_program(4);
    p.kernels[1].variants[0].condition = Condition::CpuFeatures(CpuFeature::Avx512vnni.bit());
    let file = write_program(&p);
    assert!(matches!(Module::verify(&file, None, 0), Err(RuntimeError::MissingCpuFeatures { .. })));
    Module::verify_plan(&file).expect("features are the host's business");
    // Plan errors are found as `verify` finds them.
    let mut p = add_program(4);
    dispatch_bindings(&mut p)[0] = b(Slot::Input(0), u64::MAX, 2);
    let file = write_program(&p);
    assert!(matches!(
        Module::verify_plan(&file),
        Err(RuntimeError::Invalid(VerifyError::Command {
            command: 1,
            problem: CommandProblem::Binding {
                role: BindingRole::Dispatch(0),
                problem: BindingProblem::OutOfRange { .. }
            },
            ..
        }))
    ));
    let mut d = write_program(&add_program(4));
    d[100] ^= 1;
    assert!(matches!(Module::verify_plan(&d), Err(RuntimeError::Checksum { .. } | RuntimeError::Container(_))));
}

/// Format 1.5's variant conditions: each malformed form is refused by the verifier,
/// with the kernel, the variant and what is wrong; the plan-only check refuses them
/// too (a condition is part of the code tables, not of the host).
#[test]
fn malformed_conditions_are_refused() {
    let cases: [(Condition, u64, ConditionProblem); 4] = [
        (Condition::CpuFeatures(1 << 40), 0, ConditionProblem::UnknownCpuFeatures { bits: 1 << 40 }),
        (Condition::CpuFeatures(0), 0, ConditionProblem::NoCpuFeatures),
        (
            Condition::Cuda(CudaArch::SM90A),
            0,
            ConditionProblem::WrongDevice { condition: DeviceKind::Cuda, executable: DeviceKind::Cpu },
        ),
        (
            Condition::Cuda(CudaArch { major: 0, minor: 7, specific: false }),
            0,
            ConditionProblem::WrongDevice { condition: DeviceKind::Cuda, executable: DeviceKind::Cpu },
        ),
    ];
    for (condition, workgroups, problem) in cases {
        let mut p = add_program(4);
        p.kernels[1].variants.insert(0, Variant { executable: 0, entry: 1, condition, workgroups });
        let want = VerifyError::Condition { kernel: "add".into(), variant: 0, problem };
        assert_eq!(invalid(&p), want, "{condition:?}");
        assert_eq!(plan_error(&p), want, "{condition:?}");
    }
    // On a CUDA executable: a CPU condition, a compute capability 0.x, a grid past 2³¹ − 1.
    let cuda_cases: [(Condition, u64, ConditionProblem); 3] = [
        (
            Condition::CpuFeatures(CpuFeature::Avx2.bit()),
            0,
            ConditionProblem::WrongDevice { condition: DeviceKind::Cpu, executable: DeviceKind::Cuda },
        ),
        (Condition::Cuda(CudaArch { major: 0, minor: 7, specific: false }), 0, ConditionProblem::CudaArch { sm: 7 }),
        (Condition::Cuda(CudaArch::SM80), 1 << 31, ConditionProblem::CudaWorkgroups { workgroups: 1 << 31 }),
    ];
    for (condition, workgroups, problem) in cuda_cases {
        let mut p = cuda_add_program();
        p.kernels[1].variants.insert(0, Variant { executable: 0, entry: 1, condition, workgroups });
        let e = plan_error(&p);
        assert_eq!(e, VerifyError::Condition { kernel: "add".into(), variant: 0, problem }, "{condition:?}");
        assert!(!e.to_string().contains('\n'));
    }
    // The well-formed ones verify.
    let mut p = cuda_add_program();
    p.kernels[1]
        .variants
        .insert(0, Variant { executable: 0, entry: 1, condition: Condition::Cuda(CudaArch::SM80), workgroups: 0 });
    Module::verify_plan(&write_program(&p)).expect("an sm_80 condition on PTX");
    // A variant with a grid of its own (sm_80 code that splits no K over a cluster).
    p.kernels[1].variants[0].workgroups = 7;
    Module::verify_plan(&write_program(&p)).expect("an sm_80 variant with its own grid");
    let e = VerifyError::Condition {
        kernel: "add".into(),
        variant: 0,
        problem: ConditionProblem::UnknownCpuFeatures { bits: 1 << 40 },
    };
    assert_eq!(
        e.to_string(),
        "kernel add, variant 0: CPU feature bits 0x10000000000 are not defined by artifact format 1.9"
    );
}

/// A variant with its own workgroup count runs that many, whichever driver runs it;
/// the dispatch's count is used where the chosen variant has none.
#[test]
fn a_variant_runs_its_own_workgroups() {
    // add_program's `add` kernel runs one element per workgroup: with 2 of 4 workgroups
    // only the first two sums are written.
    let mut p = add_program(4);
    // (The code is SSE2's: it runs on any x86-64, whatever features the test says the
    // host has.)
    let vnni = CpuFeature::Avx512vnni.bit();
    p.kernels[1]
        .variants
        .insert(0, Variant { executable: 0, entry: 1, condition: Condition::CpuFeatures(vnni), workgroups: 2 });
    let file = write_program(&p);
    // (What the kernel does not write keeps the fill before it: NaN.)
    let nan = f32::NAN;
    let sse2 = CpuFeature::Sse2.bit();
    for (features, want) in [(sse2 | vnni, [2.0f32, 4.0, nan, nan]), (sse2, [2.0, 4.0, 6.0, 8.0])] {
        // Without VNNI the first variant is passed over for the unconditioned one.
        let Ok(v) = Module::verify(&file, None, features) else { panic!("verify") };
        let m = v.load(&kiln_runtime::cpu::CpuLoader).expect("load");
        for threads in [1, 3] {
            let mut inst = kiln_runtime::Instance::with_threads(&m, threads).expect("instance");
            let a: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0].iter().flat_map(|x| x.to_le_bytes()).collect();
            let mut y = vec![0u8; 16];
            inst.invoke(&[&a, &a], &mut [&mut y]).expect("invoke");
            let got = to_f32s(&y);
            let same = got.iter().zip(&want).all(|(g, w)| g == w || (g.is_nan() && w.is_nan()));
            assert!(same, "host {features:#x}, {threads} threads: {got:?}, want {want:?}");
        }
    }
}
