//! Other CPU architectures (`kiln compile --target-triple`, docs/targets.md): what the
//! artifact records and how the runtime on this (x86-64) machine treats it. Running the
//! code needs the architecture: scripts/cross-test does that under qemu-user and
//! compares every synthetic model's outputs with the x86-64 run and ONNX Runtime.
//!
//! Here, for lenet compiled for aarch64 and riscv64: every executable carries the
//! architecture's feature bit and no other architecture's (a variant's needs include its
//! executable's features); every relocation is of a
//! kind that architecture's code uses; this machine's runtime refuses the artifact with
//! `RuntimeError::WrongArchitecture` while a host of that architecture (its features
//! stated through `Module::verify`) takes a variant of every kernel; an x86-64 artifact
//! is refused on such a host; and the verifier refuses an executable naming two
//! architectures or carrying another architecture's relocation kind.

mod common;

use common::{fails_with, kiln, s, scratch, LENET};
use kiln_compiler::{CpuTarget, Options};
use kiln_module::program::{Condition, CpuArch, CpuFeature, Program, Reloc, RelocKind};
use kiln_runtime::{Module, RuntimeError, VerifyError};

fn lenet() -> kiln_ir::Graph {
    kiln_import::onnx::import_file(std::path::Path::new(LENET), &Default::default()).expect("import lenet")
}

fn compile(target: CpuTarget) -> kiln_compiler::Compiled {
    kiln_compiler::compile(&lenet(), &Options { target, ..Options::default() })
        .unwrap_or_else(|e| panic!("compile for {target:?}: {e}"))
}

fn invalid(p: &Program) -> VerifyError {
    let bytes = kiln_module::sections::write_program(p);
    match Module::verify(&bytes, None, CpuArch::Aarch64.feature().bit()) {
        Err(RuntimeError::Invalid(e)) => e,
        other => panic!("expected a verifier error, got {other:?}"),
    }
}

fn check(arch: CpuArch, target: CpuTarget) {
    let c = compile(target);
    let p = &c.program;
    let bit = arch.feature().bit();
    assert!(!p.executables.is_empty());
    for (i, x) in p.executables.iter().enumerate() {
        assert_eq!(x.features, bit, "{arch:?}: executable {i} features");
        assert_eq!(CpuArch::of_features(x.features), Some(arch));
        for r in &x.relocs {
            assert!(arch.admits(r.kind), "{arch:?}: executable {i} has a {:?} relocation", r.kind);
        }
        eprintln!("{}: {} bytes of code, {} relocations", arch.name(), x.code.len(), x.relocs.len());
    }
    for k in &p.kernels {
        assert_eq!(k.variants.len(), 1, "{arch:?}: kernel {}", k.name);
        // The executable's features are the variant's needs (a condition may add more).
        assert!(
            matches!(k.variants[0].condition, Condition::Always)
                || k.variants[0].condition == Condition::CpuFeatures(bit),
            "{arch:?}: kernel {}: {:?}",
            k.name,
            k.variants[0].condition
        );
    }

    // This x86-64 machine refuses it, naming both architectures.
    match Module::verify(&c.artifact, c.weights.as_deref(), kiln_runtime::cpu::host_features()) {
        Err(e @ RuntimeError::WrongArchitecture { code, host, .. }) => {
            assert_eq!((code, host), (arch.name(), "x86_64"));
            let msg = e.to_string();
            assert!(msg.contains(&format!("is {} code and this machine is x86_64", arch.name())), "{msg}");
        }
        other => panic!("{arch:?} artifact on x86-64: {other:?}"),
    }
    match Module::load(&c.artifact, c.weights.as_deref()) {
        Err(RuntimeError::WrongArchitecture { .. }) => {}
        other => panic!("{arch:?} artifact loaded on x86-64: {:?}", other.map(|_| ())),
    }
    // A host of that architecture takes the one variant of every kernel.
    let v = Module::verify(&c.artifact, c.weights.as_deref(), bit).expect("verify for its own architecture");
    assert!(v.variants().iter().all(|&i| i == 0));

    // Another architecture's relocation kind in this code.
    let mut bad = p.clone();
    let other = if arch == CpuArch::Aarch64 { RelocKind::RiscvPcrelHi20 } else { RelocKind::Aarch64Call26 };
    bad.executables[0].relocs.push(Reloc { offset: 0, kind: RelocKind::Pc32, target: 0, addend: 0 });
    match invalid(&bad) {
        VerifyError::RelocKind { kind: "pc32", arch: a, .. } => assert_eq!(a, arch.name()),
        e => panic!("{arch:?}: {e}"),
    }
    bad.executables[0].relocs.last_mut().expect("pushed").kind = other;
    assert!(matches!(invalid(&bad), VerifyError::RelocKind { .. }), "{arch:?}");
    // Two architectures in one executable.
    let mut bad = p.clone();
    bad.executables[0].features |= CpuFeature::Sse2.bit();
    assert!(matches!(invalid(&bad), VerifyError::Architectures { executable: 0 }), "{arch:?}");
}

#[test]
fn aarch64_artifact_records_its_architecture() {
    check(CpuArch::Aarch64, CpuTarget::Aarch64);
}

#[test]
fn riscv64_artifact_records_its_architecture() {
    check(CpuArch::Riscv64, CpuTarget::Riscv64);
}

#[test]
fn x86_64_artifact_is_refused_on_aarch64() {
    let c = compile(CpuTarget::X86_64);
    match Module::verify(&c.artifact, c.weights.as_deref(), CpuFeature::Aarch64.bit()) {
        Err(RuntimeError::WrongArchitecture { code: "x86_64", host: "aarch64", .. }) => {}
        other => panic!("{:?}", other.map(|_| ())),
    }
}

#[test]
fn target_triple_on_the_command_line() {
    let out = scratch("cross_arch", "cli").join("lenet-aarch64.kiln");
    let (ok, _, err) = kiln(&["compile", LENET, "-o", s(&out), "--target-triple", "aarch64-unknown-linux-gnu"]);
    assert!(ok, "{err}");
    fails_with(&["run", s(&out)], &["is aarch64 code and this machine is x86_64"]);
    fails_with(
        &["compile", LENET, "-o", s(&out), "--target-triple", "aarch64-unknown-linux-gnu", "--target-cpu", "x86-64-v3"],
        &["--target-cpu `x86-64-v3` names x86-64 levels"],
    );
    fails_with(
        &["compile", LENET, "-o", s(&out), "--target-triple", "mips64-unknown-linux-gnu"],
        &["--target-triple `mips64"],
    );
}
