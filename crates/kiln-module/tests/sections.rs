//! Round trips of `sections::write_program` / `read_program`, and decoding errors for
//! hand-made malformed sections. Expected bytes and values are worked out by hand.

use kiln_module::abi::ABI_VERSION;
use kiln_module::program::*;
use kiln_module::sections::{read_program, section_bytes, weights_hash, write_program, ConstantsView, SectionProblem};
use kiln_module::{Module, ModuleWriter, SectionKind};

#[path = "../../kiln-runtime/tests/common/pieces.rs"]
#[allow(dead_code)]
mod pieces;
use pieces::{b, entry, tensor as t};

/// [`mlp`]'s entry alone: embedded (empty) constants, no debug section, and no devices,
/// kernels or executables.
fn bare_mlp() -> Program {
    let mut p = mlp(Constants::Embedded(vec![]), false);
    p.devices.clear();
    p.kernels.clear();
    p.executables.clear();
    p
}

/// A two-layer MLP shape: x[1,4] → matmul+bias+relu → h[1,8] (arena) → matmul → y[1,2].
fn mlp(constants: Constants, debug: bool) -> Program {
    let code: Vec<u8> = (0..300u32).map(|i| (i * 7 % 251) as u8).collect();
    Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![entry(
            "main",
            vec![t("x", 1, &[1, 4], 16)],
            vec![t("y", 1, &[1, 2], 8)],
            (64, 64),
            vec![
                Command::Fill { dst: b(Slot::Arena, 32, 32), pattern: 0x3f80_0000, pattern_len: 4 },
                Command::Dispatch {
                    kernel: 0,
                    device: 0,
                    workgroups: 8,
                    bindings: vec![
                        b(Slot::Input(0), 0, 16),
                        b(Slot::Constants, 0, 128),
                        b(Slot::Constants, 128, 32),
                        b(Slot::Arena, 0, 32),
                    ],
                    push_constants: vec![],
                    work_ns: 0,
                },
                Command::Barrier,
                Command::Dispatch {
                    kernel: 1,
                    device: 0,
                    workgroups: 2,
                    bindings: vec![b(Slot::Arena, 0, 32), b(Slot::Constants, 192, 64), b(Slot::Output(0), 0, 8)],
                    push_constants: vec![7, u32::MAX],
                    work_ns: 1234,
                },
                Command::Copy { src: b(Slot::Output(0), 0, 8), dst: b(Slot::Arena, 32, 8) },
            ],
            vec![BufferDesc { name: "/fc1/Relu_output_0".into(), binding: b(Slot::Arena, 0, 32), first: 1, last: 3 }],
        )],
        kernels: vec![
            Kernel {
                name: "fc1".into(),
                variants: vec![
                    Variant::cpu(0, 0, CpuFeature::Avx2.bit() | CpuFeature::Fma.bit()),
                    Variant::cpu(0, 1, 0),
                ],
                class: Some(KernelClass::Contraction),
            },
            Kernel { name: "fc2".into(), variants: vec![Variant::cpu(0, 2, 0)], class: Some(KernelClass::Elementwise) },
        ],
        executables: vec![Executable {
            device: DeviceKind::Cpu,
            features: CpuFeature::Sse41.bit(),
            code,
            entries: vec![("fc1_avx2".into(), 0), ("fc1".into(), 100), ("fc2".into(), 200)],
            relocs: vec![
                Reloc { offset: 10, kind: RelocKind::Pc32, target: 280, addend: -4 },
                Reloc { offset: 120, kind: RelocKind::Abs64, target: 288, addend: 0 },
            ],
            launches: vec![],
        }],
        constants,
        debug: debug.then(|| DebugInfo {
            kernel_sources: vec!["MatMul /fc1/MatMul + Add /fc1/Add + Relu".into(), "MatMul /fc2/MatMul".into()],
            source: "mlp.onnx".into(),
        }),
    }
}

fn embedded() -> Constants {
    Constants::Embedded((0..256u32).map(|i| i as u8).collect())
}

#[test]
fn round_trip_embedded_with_debug() {
    let p = mlp(embedded(), true);
    let file = write_program(&p);
    let m = Module::parse(&file).expect("parse");
    assert_eq!(m.abi(), ABI_VERSION);
    let v = read_program(&m).expect("decode");
    assert_eq!(v.to_program(), p);
    let kinds: Vec<_> = m.sections().map(|s| s.kind).collect();
    assert_eq!(
        kinds,
        [
            SectionKind::Signature,
            SectionKind::Plan,
            SectionKind::Executables,
            SectionKind::Constants,
            SectionKind::Debug
        ]
    );
}

#[test]
fn round_trip_external_without_debug() {
    let p =
        mlp(Constants::External { file: "mlp.weights".into(), size: 70_000_000, hash: 0xDEAD_BEEF_0123_4567 }, false);
    let file = write_program(&p);
    let m = Module::parse(&file).expect("parse");
    let v = read_program(&m).expect("decode");
    assert_eq!(v.to_program(), p);
    assert!(v.debug.is_none());
    assert_eq!(m.section(SectionKind::Debug), None);
    assert_eq!(m.section(SectionKind::Constants), None);
    assert_eq!(
        v.constants,
        ConstantsView::External { file: "mlp.weights", size: 70_000_000, hash: 0xDEAD_BEEF_0123_4567 }
    );
}

#[test]
fn round_trip_extremes_and_empty() {
    let mut p = mlp(Constants::Embedded(vec![]), true);
    p.entries[0].arena_size = u64::MAX;
    p.entries[0].arena_align = 1 << 63;
    p.entries[0].commands = vec![
        Command::Dispatch {
            kernel: u32::MAX,
            device: u32::MAX,
            workgroups: u64::MAX,
            bindings: vec![b(Slot::Input(u32::MAX), u64::MAX, u64::MAX), b(Slot::Output(u32::MAX), 0, 0)],
            push_constants: vec![0, u32::MAX],
            work_ns: u64::MAX,
        },
        Command::Fill { dst: b(Slot::Constants, 1, 2), pattern: u64::MAX, pattern_len: 255 },
    ];
    p.executables[0].relocs.push(Reloc {
        offset: u64::MAX,
        kind: RelocKind::Abs64,
        target: u64::MAX,
        addend: i64::MIN,
    });
    p.executables[0].relocs.push(Reloc { offset: 0, kind: RelocKind::Pc32, target: 0, addend: i64::MAX });
    p.executables[0].features = u64::MAX;
    p.executables[0].launches = vec![Launch { block: u32::MAX, shared: 0, params: u32::MAX }, Launch::default()];
    p.entries[0].inputs[0].dtype = u32::MAX;
    p.entries[0].buffers[0].first = u32::MAX;
    p.debug = Some(DebugInfo::default());
    let file = write_program(&p);
    let v = read_program(&Module::parse(&file).expect("parse")).expect("decode");
    assert_eq!(v.to_program(), p);

    let empty = Program {
        devices: vec![],
        entries: vec![],
        kernels: vec![],
        executables: vec![],
        constants: Constants::Embedded(vec![]),
        debug: None,
    };
    let file = write_program(&empty);
    let v = read_program(&Module::parse(&file).expect("parse")).expect("decode");
    assert_eq!(v.to_program(), empty);
}

#[test]
fn code_and_constants_are_borrowed_and_aligned() {
    let p = mlp(embedded(), true);
    let file = write_program(&p);
    let m = Module::parse(&file).expect("parse");
    let v = read_program(&m).expect("decode");
    let range = file.as_ptr_range();
    let code = v.executables[0].code;
    assert!(range.contains(&code.as_ptr()), "code is a slice of the file");
    let ConstantsView::Embedded(c) = v.constants else { panic!("embedded") };
    assert!(range.contains(&c.as_ptr()));
    assert_eq!((c.as_ptr() as usize - file.as_ptr() as usize) % 64, 0, "constants 64-byte aligned in the file");
    assert_eq!(c, &(0..256u32).map(|i| i as u8).collect::<Vec<_>>()[..]);
    assert!(range.contains(&v.entries[0].name.as_ptr()), "names are slices of the file");
}

#[test]
fn small_mlp_is_a_few_kb() {
    let p = mlp(Constants::External { file: "w.bin".into(), size: 1 << 20, hash: 1 }, true);
    let file = write_program(&p);
    let code = 300;
    // Header 64 + 5 table entries of 32 = 224; the rest (signature, plan, symbols,
    // kernel table, debug names, padding) stays well under half a kilobyte.
    assert!(file.len() < 224 + code + 450, "artifact is {} bytes", file.len());
    let without_debug =
        write_program(&mlp(Constants::External { file: "w.bin".into(), size: 1 << 20, hash: 1 }, false));
    assert!(without_debug.len() < file.len());
}

#[test]
fn signature_bytes_by_hand() {
    let p = Program {
        devices: vec![],
        entries: vec![entry("m", vec![t("x", 1, &[300], 1200)], vec![], (0, 1), vec![], vec![])],
        kernels: vec![],
        executables: vec![],
        constants: Constants::Embedded(vec![]),
        debug: None,
    };
    // 1 entry; "m"; 1 input: "x", dtype 1, 1 dim: 300 = 0b10_0101100 → ac 02,
    // bytes 1200 = 0b1001_0110000 → b0 09; 0 outputs.
    assert_eq!(
        section_bytes(&p, SectionKind::Signature).expect("signature"),
        [1, 1, b'm', 1, 1, b'x', 1, 1, 0xac, 0x02, 0xb0, 0x09, 0]
    );
    // 0 devices; 1 entry: arena 0, align 1, 0 commands, 0 buffers, 0 extents.
    assert_eq!(section_bytes(&p, SectionKind::Plan).expect("plan"), [0, 1, 0, 1, 0, 0, 0]);
}

#[test]
fn slot_and_signed_encodings_by_hand() {
    let mut p = mlp(Constants::Embedded(vec![]), false);
    p.devices.clear();
    p.entries[0].commands = vec![Command::Copy { src: b(Slot::Input(1), 5, 6), dst: b(Slot::Output(2), 0, 1) }];
    p.entries[0].buffers.clear();
    let plan = section_bytes(&p, SectionKind::Plan).expect("plan");
    // devices 0; entries 1; arena 64 (0x40), align 64; 1 command: tag 2,
    // src slot 2+4·1 = 6, offset 5, length 6; dst slot 3+4·2 = 11, 0, 1; 0 buffers;
    // 0 extents.
    assert_eq!(plan, [0, 1, 0x40, 0x40, 1, 2, 6, 5, 6, 11, 0, 1, 0, 0]);
    p.executables[0].code = vec![0xc3];
    p.executables[0].entries = vec![("k".into(), 0)];
    p.executables[0].features = 0;
    p.executables[0].relocs = vec![Reloc { offset: 0, kind: RelocKind::Pc32, target: 0, addend: -4 }];
    p.kernels.clear();
    // 1 executable: device 0, features 0, 1 entry "k" at 0, 1 reloc: 0, pc32, 0,
    // zig-zag(-4) = 7; 0 launches; code length 1, c3; 0 kernels.
    assert_eq!(
        section_bytes(&p, SectionKind::Executables).expect("executables"),
        [1, 0, 0, 1, 1, b'k', 0, 1, 0, 0, 0, 7, 0, 1, 0xc3, 0]
    );
}

/// A file of `p`'s signature, plan and executables (no constants) with one of them
/// replaced by hand-edited bytes, under a header that says format 1.`minor` (and whose
/// checksum is fixed up to match): how the tests below read older formats.
fn file_of_format(p: &Program, (kind, bytes): (SectionKind, Vec<u8>), minor: u16) -> Vec<u8> {
    let section = |k: SectionKind| {
        if k == kind {
            return bytes.clone();
        }
        let mut s = section_bytes(p, k).expect("section");
        // Before 1.5 a plan entry does not end with its list of extents: drop the one
        // entry's (empty) list.
        if k == SectionKind::Plan && minor < kiln_module::format::EXTENTS_MINOR {
            assert!(p.entries.len() == 1 && p.entries[0].extents.is_empty());
            assert_eq!(s.pop(), Some(0));
        }
        s
    };
    let mut f = file_with(&[
        (SectionKind::Signature, section(SectionKind::Signature)),
        (SectionKind::Plan, section(SectionKind::Plan)),
        (SectionKind::Executables, section(SectionKind::Executables)),
        (SectionKind::Constants, vec![]),
    ]);
    f[10..12].copy_from_slice(&minor.to_le_bytes());
    let crc = kiln_module::format::crc32(&f[..36]);
    f[36..40].copy_from_slice(&crc.to_le_bytes());
    f
}

#[test]
fn dispatch_work_estimates_by_hand_and_from_format_1_0() {
    // No kernels and no executables: those tables (whose records grew in 1.2 and 1.3)
    // are the same in every format.
    let mut p = bare_mlp();
    p.entries[0].commands = vec![Command::Dispatch {
        kernel: 1,
        device: 0,
        workgroups: 3,
        bindings: vec![b(Slot::Arena, 0, 4)],
        push_constants: vec![],
        work_ns: 300,
    }];
    p.entries[0].buffers.clear();
    let plan = section_bytes(&p, SectionKind::Plan).expect("plan");
    // devices 0; entries 1; arena 64, align 64; 1 command: tag 0, kernel 1, device 0,
    // 3 workgroups, 1 binding (slot 0, offset 0, length 4), 0 push constants, work
    // 300 = 0b10_0101100 → ac 02; 0 buffers; 0 extents.
    assert_eq!(plan, [0, 1, 0x40, 0x40, 1, 0, 1, 0, 3, 1, 0, 0, 4, 0, 0xac, 0x02, 0, 0]);
    // The same plan as a 1.1 to 1.4 file wrote it: no list of extents.
    let plan = plan[..plan.len() - 1].to_vec();
    let file_of = |plan: Vec<u8>, minor: u16| file_of_format(&p, (SectionKind::Plan, plan), minor);
    // A format 1.0 file has no estimate: the same plan without it reads as 0.
    let mut old_plan = plan.clone();
    old_plan.drain(14..16);
    let old = file_of(old_plan, 0);
    let m = Module::parse(&old).expect("a 1.0 file parses");
    assert_eq!(m.format(), kiln_module::Version { major: 1, minor: 0 });
    let commands = read_program(&m).expect("a 1.0 plan decodes").to_program().entries[0].commands.clone();
    assert_eq!(
        commands,
        [Command::Dispatch {
            kernel: 1,
            device: 0,
            workgroups: 3,
            bindings: vec![b(Slot::Arena, 0, 4)],
            push_constants: vec![],
            work_ns: 0
        }]
    );
    // The 1.1 plan under a 1.0 header leaves bytes over; under its own, it reads back.
    let mislabelled = file_of(plan.clone(), 0);
    let m = Module::parse(&mislabelled).expect("parses");
    // (a 1.0 reader takes the estimate for the buffer count, byte 14).
    let e = read_program(&m).expect_err("the estimate is not part of a 1.0 plan");
    assert_eq!(e.section_offset, 14, "{e}");
    assert!(e.to_string().contains("buffers: count 300"), "{e}");
    let current = file_of(plan, 1);
    let m = Module::parse(&current).expect("parses");
    assert_eq!(read_program(&m).expect("decodes").to_program().entries[0].commands, p.entries[0].commands);
}

#[test]
fn kernel_classes_by_hand_and_from_format_1_1() {
    let mut p = mlp(Constants::Embedded(vec![]), false);
    p.executables.clear();
    p.kernels =
        vec![Kernel { name: "k".into(), variants: vec![Variant::cpu(0, 0, 0)], class: Some(KernelClass::Rows) }];
    let exe = section_bytes(&p, SectionKind::Executables).expect("exe");
    // 0 executables; 1 kernel: name "k", 1 variant (executable 0, entry 0, condition
    // tag 0, workgroups 0), class 3 (rows).
    assert_eq!(exe, [0, 1, 1, b'k', 1, 0, 0, 0, 0, 3]);
    let file_of = |exe: Vec<u8>, minor: u16| file_of_format(&p, (SectionKind::Executables, exe), minor);
    let kernels = |f: &[u8]| read_program(&Module::parse(f).expect("parses")).map(|v| v.to_program().kernels);
    assert_eq!(kernels(&file_of(exe.clone(), 5)).expect("a 1.5 table"), p.kernels);
    // The same table as format 1.2 to 1.4 wrote it: a variant's features (0) in place of
    // its condition and workgroups.
    let exe = vec![0, 1, 1, b'k', 1, 0, 0, 0, 3];
    assert_eq!(kernels(&file_of(exe.clone(), 2)).expect("a 1.2 table"), p.kernels);
    // Every class has its own code, and reads back; code 0 is "not recorded".
    for c in KernelClass::ALL.map(Some).into_iter().chain([None]) {
        let mut e = exe.clone();
        e[8] = c.map_or(0, KernelClass::code);
        assert_eq!(kernels(&file_of(e, 2)).expect("decodes")[0].class, c);
    }
    // A 1.1 file has no class: the same table without it reads as not recorded.
    let old = kernels(&file_of(exe[..8].to_vec(), 1)).expect("a 1.1 table");
    assert_eq!(old[0].class, None);
    assert_eq!(old[0].variants, p.kernels[0].variants);
    // A 1.2 table under a 1.1 header leaves the class over; a code past the last is refused.
    let e = kernels(&file_of(exe.clone(), 1)).expect_err("trailing class byte");
    assert_eq!(e.section_offset, 8, "{e}");
    let past = KernelClass::ALL.len() as u8 + 1;
    let mut bad = exe.clone();
    bad[8] = past;
    let e = kernels(&file_of(bad, 2)).expect_err("a class past the last");
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "kernel class", tag: past.into() });
}

#[test]
fn variant_conditions_by_hand_and_from_format_1_4() {
    let mut p = mlp(Constants::Embedded(vec![]), false);
    p.executables.clear();
    let v = |condition, workgroups| Variant { executable: 0, entry: 1, condition, workgroups };
    p.kernels = vec![Kernel {
        name: "k".into(),
        variants: vec![
            v(Condition::CpuFeatures(CpuFeature::Avx512f.bit() | CpuFeature::Avx2.bit()), 300),
            v(Condition::Cuda(CudaArch::SM90A), 0),
            v(Condition::Cuda(CudaArch::SM80), 0),
            v(Condition::Always, 0),
        ],
        class: None,
    }];
    let exe = section_bytes(&p, SectionKind::Executables).expect("exe");
    // 0 executables; 1 kernel "k", 4 variants, each (executable 0, entry 1):
    //   tag 1, bits 2^13 + 2^7 = 0x2080 → 80 41, workgroups 300 → ac 02;
    //   tag 2, sm 90 (0x5a), specific 1, workgroups 0;
    //   tag 2, sm 80 (0x50), specific 0, workgroups 0;
    //   tag 0, workgroups 0; class 0.
    assert_eq!(
        exe,
        [0, 1, 1, b'k', 4, 0, 1, 1, 0x80, 0x41, 0xac, 0x02, 0, 1, 2, 0x5a, 1, 0, 0, 1, 2, 0x50, 0, 0, 0, 1, 0, 0, 0]
    );
    let file_of = |exe: Vec<u8>, minor: u16| file_of_format(&p, (SectionKind::Executables, exe), minor);
    let kernels = |f: &[u8]| read_program(&Module::parse(f).expect("parses")).map(|v| v.to_program().kernels);
    assert_eq!(kernels(&file_of(exe.clone(), 5)).expect("a 1.5 table"), p.kernels);
    // A 1.4 variant's features read as a CPU-features condition (none: always), with the
    // dispatch's workgroups.
    let old = vec![0, 1, 1, b'k', 2, 0, 1, 0x80, 0x41, 0, 1, 0, 0];
    let read = kernels(&file_of(old, 4)).expect("a 1.4 table");
    assert_eq!(
        read[0].variants,
        [v(Condition::CpuFeatures(CpuFeature::Avx512f.bit() | CpuFeature::Avx2.bit()), 0), v(Condition::Always, 0)]
    );
    // Unknown condition tags, a compute capability past sm_999, and an arch-specific
    // flag other than 0 or 1 are refused by the decoder.
    let mut bad = exe.clone();
    bad[7] = 3;
    let e = kernels(&file_of(bad, 5)).expect_err("tag 3");
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "variant condition", tag: 3 });
    assert_eq!(e.section_offset, 7);
    let mut bad = exe.clone();
    bad.splice(15..16, [0xe8, 0x07]); // sm 1000
    let e = kernels(&file_of(bad, 5)).expect_err("sm 1000");
    assert_eq!(e.problem, SectionProblem::TooLarge { field: "variant cuda sm", value: 1000, max: 999 });
    let mut bad = exe.clone();
    bad[16] = 2;
    let e = kernels(&file_of(bad, 5)).expect_err("specific 2");
    assert_eq!(e.problem, SectionProblem::TooLarge { field: "variant cuda arch-specific", value: 2, max: 1 });
    // The 1.5 table under a 1.4 header does not decode (its condition tag reads as
    // features, and the rest is left over or misread).
    assert!(kernels(&file_of(exe, 4)).is_err());
    // Conditions print as listings name them.
    assert_eq!(CudaArch::SM90A.to_string(), "sm_90a");
    assert_eq!(CudaArch::SM80.to_string(), "sm_80");
    assert!(CudaArch::SM80.admits(9, 0) && CudaArch::SM80.admits(8, 6) && !CudaArch::SM80.admits(7, 5));
    assert!(CudaArch::SM90A.admits(9, 0) && !CudaArch::SM90A.admits(10, 0) && !CudaArch::SM90A.admits(8, 9));
    assert_eq!(
        CpuFeature::level_of(CpuFeature::LEVELS[3] | CpuFeature::Avx512bw.bit()),
        (Some("x86-64-v4"), CpuFeature::Avx512bw.bit())
    );
    assert_eq!(CpuFeature::level_of(CpuFeature::LEVELS[2]), (Some("x86-64-v3"), 0));
}

#[test]
fn kernel_class_names_round_trip() {
    for c in KernelClass::ALL {
        assert_eq!(KernelClass::from_name(c.name()), Some(c));
    }
    assert_eq!(KernelClass::from_name("gemm"), None);
}

#[test]
fn weights_hash_matches_published_xxh64_vectors() {
    assert_eq!(weights_hash(b""), 0xEF46_DB37_51D8_E999);
    assert_eq!(weights_hash(b"a"), 0xD24E_C4F1_A98C_6E5B);
    assert_eq!(weights_hash(b"abc"), 0x44BC_2CF5_AD77_0999);
    assert_eq!(weights_hash(b"Nobody inspects the spammish repetition"), 0xFBCE_A83C_8A37_8BF1);
    // Every byte matters.
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
    let h = weights_hash(&data);
    for i in [0, 31, 32, 500, 999] {
        let mut d = data.clone();
        d[i] ^= 1;
        assert_ne!(weights_hash(&d), h, "flip at {i}");
    }
    assert_ne!(weights_hash(&data[..999]), h);
}

// ---- malformed sections -------------------------------------------------------------

fn file_with(sections: &[(SectionKind, Vec<u8>)]) -> Vec<u8> {
    let mut w = ModuleWriter::new(ABI_VERSION);
    for (k, bytes) in sections {
        w.add(*k, 8, bytes.clone()).expect("add");
    }
    w.finish()
}

fn valid_sections() -> Vec<(SectionKind, Vec<u8>)> {
    let p = mlp(embedded(), true);
    vec![
        (SectionKind::Signature, section_bytes(&p, SectionKind::Signature).expect("sig")),
        (SectionKind::Plan, section_bytes(&p, SectionKind::Plan).expect("plan")),
        (SectionKind::Executables, section_bytes(&p, SectionKind::Executables).expect("exe")),
        (SectionKind::Constants, vec![0; 256]),
        (SectionKind::Debug, section_bytes(&p, SectionKind::Debug).expect("debug")),
    ]
}

/// Replaces section `kind` with `bytes` and decodes; returns the error, the section's
/// file offset.
fn decode_with(kind: SectionKind, bytes: Vec<u8>) -> (kiln_module::sections::SectionError, u64) {
    let mut s = valid_sections();
    for e in &mut s {
        if e.0 == kind {
            e.1 = bytes.clone();
        }
    }
    let file = file_with(&s);
    let m = Module::parse(&file).expect("container is fine");
    let base = m.sections().find(|x| x.kind == kind).map_or(0, |x| x.offset);
    (read_program(&m).expect_err("must not decode"), base)
}

#[test]
fn the_valid_sections_decode() {
    let file = file_with(&valid_sections());
    read_program(&Module::parse(&file).expect("parse")).expect("decode");
}

#[test]
fn missing_and_conflicting_sections() {
    for kind in [SectionKind::Signature, SectionKind::Plan, SectionKind::Executables, SectionKind::Constants] {
        let s: Vec<_> = valid_sections().into_iter().filter(|e| e.0 != kind).collect();
        let file = file_with(&s);
        let e = read_program(&Module::parse(&file).expect("parse")).expect_err("missing");
        assert_eq!((e.section, e.problem), (kind, SectionProblem::Missing), "{kind}");
    }
    let mut s = valid_sections();
    s.push((SectionKind::ExternalWeights, vec![1, b'w', 0, 0, 0, 0, 0, 0, 0, 0, 0]));
    let file = file_with(&s);
    let e = read_program(&Module::parse(&file).expect("parse")).expect_err("conflict");
    assert_eq!(e.section, SectionKind::ExternalWeights);
    assert_eq!(e.problem, SectionProblem::ConflictsWith(SectionKind::Constants));
    // Unknown kinds are ignored.
    let mut s = valid_sections();
    s.push((SectionKind::Other(99), vec![1, 2, 3]));
    read_program(&Module::parse(&file_with(&s)).expect("parse")).expect("unknown kinds are skipped");
}

#[test]
fn truncation_is_reported_at_its_offset() {
    let sig = valid_sections()[0].1.clone();
    for cut in 0..sig.len() {
        let (e, base) = decode_with(SectionKind::Signature, sig[..cut].to_vec());
        assert_eq!(e.section, SectionKind::Signature);
        assert!(
            matches!(e.problem, SectionProblem::Truncated { .. } | SectionProblem::CountTooLarge { .. }),
            "cut {cut}: {e}"
        );
        assert!(e.section_offset <= cut as u64);
        assert_eq!(e.offset, base + e.section_offset);
    }
    let exe = valid_sections()[2].1.clone();
    for cut in 0..exe.len() {
        let (e, _) = decode_with(SectionKind::Executables, exe[..cut].to_vec());
        assert_eq!(e.section, SectionKind::Executables, "cut {cut}");
    }
}

#[test]
fn bad_varints() {
    // Eleven continuation bytes: longer than 64 bits.
    let (e, base) = decode_with(SectionKind::Signature, vec![0xff; 11]);
    assert_eq!(e.problem, SectionProblem::BadVarint { field: "signature entries" });
    assert_eq!((e.section_offset, e.offset), (0, base));
    // Tenth byte 2: bit 64 set.
    let mut v = vec![0x80; 9];
    v.push(2);
    let (e, _) = decode_with(SectionKind::Signature, v);
    assert_eq!(e.problem, SectionProblem::BadVarint { field: "signature entries" });
    // u64::MAX itself is fine as a varint but far too many entries.
    let mut v = vec![0xff; 9];
    v.push(1);
    let (e, _) = decode_with(SectionKind::Signature, v);
    assert_eq!(e.problem, SectionProblem::CountTooLarge { field: "signature entries", count: u64::MAX, remaining: 0 });
    // Non-minimal: 0x80 0x00 is a padded zero.
    let (e, _) = decode_with(SectionKind::Signature, vec![0x80, 0x00]);
    assert_eq!(e.problem, SectionProblem::BadVarint { field: "signature entries" });
}

#[test]
fn hostile_counts_do_not_allocate() {
    // 2^62 dims in a 20-byte section: rejected before any allocation.
    let v = vec![1, 1, b'm', 1, 1, b'x', 1, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40];
    let (e, base) = decode_with(SectionKind::Signature, v);
    assert!(matches!(e.problem, SectionProblem::CountTooLarge { field: "tensor dims", count, .. } if count == 1 << 62));
    assert_eq!(e.offset, base + 7);
    // Code length past the end (one executable: cpu, no features, entries, relocations
    // or launches).
    let mut v = vec![1, 0, 0, 0, 0, 0];
    v.extend([0xff, 0xff, 0xff, 0xff, 0x0f]);
    v.extend([0xc3; 4]);
    let (e, _) = decode_with(SectionKind::Executables, v);
    assert_eq!(e.problem, SectionProblem::Truncated { field: "code" });
    assert_eq!(e.section_offset, 11);
    // 2^32 launches in a few bytes: rejected before any allocation.
    let mut v = vec![1, 1, 0, 0, 0];
    v.extend([0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0]);
    let (e, _) = decode_with(SectionKind::Executables, v);
    assert!(matches!(e.problem, SectionProblem::CountTooLarge { field: "launches", count, .. } if count == 1 << 32));
    assert_eq!(e.section_offset, 5);
}

#[test]
fn launches_by_hand_and_from_format_1_2() {
    let mut p = mlp(Constants::Embedded(vec![]), false);
    p.kernels.clear();
    p.executables[0] = Executable {
        device: DeviceKind::Cuda,
        features: CUDA_CUBIN_SM90A,
        code: vec![0xab, 0xcd],
        entries: vec![("k".into(), 1)],
        relocs: vec![],
        launches: vec![Launch { block: 256, shared: 65536, params: 3 }],
    };
    let exe = section_bytes(&p, SectionKind::Executables).expect("exe");
    // 1 executable: kind 1, features 1, 1 entry ("k", 1), 0 relocations, 1 launch
    // (256 = 0x80 0x02, 65536 = 0x80 0x80 0x04, 3), code length 2 and the code; 0 kernels.
    assert_eq!(exe, [1, 1, 1, 1, 1, b'k', 1, 0, 1, 0x80, 0x02, 0x80, 0x80, 0x04, 3, 2, 0xab, 0xcd, 0]);
    let file_of = |exe: Vec<u8>, minor: u16| file_of_format(&p, (SectionKind::Executables, exe), minor);
    let exes = |f: &[u8]| read_program(&Module::parse(f).expect("parses")).map(|v| v.to_program().executables);
    assert_eq!(exes(&file_of(exe.clone(), 3)).expect("a 1.3 table"), p.executables);
    // A 1.2 file has no launch records: the same table without them reads with none.
    let mut old = exe.clone();
    old.drain(8..15);
    let read = exes(&file_of(old, 2)).expect("a 1.2 table");
    assert_eq!(read[0].launches, []);
    assert_eq!(read[0].code, p.executables[0].code);
    // A 1.3 table under a 1.2 header takes the launch count (1) for the code length, the
    // block's high byte (2) for the kernel count, and the shared size's first bytes for
    // a kernel name of 65536 bytes, past the section's end.
    let e = exes(&file_of(exe.clone(), 2)).expect_err("launches are not part of a 1.2 table");
    assert_eq!(e.problem, SectionProblem::Truncated { field: "kernel name" }, "{e}");
    assert_eq!(e.section_offset, 14, "{e}");
    // Each field must fit 32 bits.
    let mut bad = exe.clone();
    bad.splice(9..11, [0x80, 0x80, 0x80, 0x80, 0x10]);
    let e = exes(&file_of(bad, 3)).expect_err("block 2^32");
    assert_eq!(e.problem, SectionProblem::TooLarge { field: "launch block", value: 1 << 32, max: u32::MAX.into() });
    // Truncated inside a launch.
    let e = exes(&file_of(exe[..12].to_vec(), 3)).expect_err("truncated");
    assert_eq!(e.problem, SectionProblem::Truncated { field: "launch shared" });
}

#[test]
fn bad_values_tags_and_strings() {
    // dtype 2^32 does not fit u32.
    let (e, _) =
        decode_with(SectionKind::Signature, vec![1, 1, b'm', 1, 1, b'x', 0x80, 0x80, 0x80, 0x80, 0x10, 0, 0, 0]);
    assert_eq!(e.problem, SectionProblem::TooLarge { field: "tensor dtype", value: 1 << 32, max: u32::MAX.into() });
    assert_eq!(e.section_offset, 6);
    // Name is not UTF-8.
    let (e, _) = decode_with(SectionKind::Signature, vec![1, 2, 0xc3, 0x28, 0, 0]);
    assert_eq!(e.problem, SectionProblem::BadUtf8 { field: "entry name" });
    assert_eq!(e.section_offset, 2);
    // Plan: one cpu device, one entry, arena 0/1, one command with tag 7 (the last
    // known tag is 6, `SkipIf`, after the collectives 4 and 5, from format 1.4 on).
    let plan = vec![1, 0, 3, b'c', b'p', b'u', 1, 0, 1, 1, 7, 0];
    let (e, _) = decode_with(SectionKind::Plan, plan);
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "command tag", tag: 7 });
    assert_eq!(e.section_offset, 10);
    // Device kind 2.
    let (e, _) = decode_with(SectionKind::Plan, vec![1, 2, 0, 1, 0, 1, 0, 0]);
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "device kind", tag: 2 });
    // Slot code 4 (tag 0 with an index) is not a slot.
    let plan = vec![0, 1, 0, 1, 1, 2, 4, 0, 0, 0, 0, 0, 0];
    let (e, _) = decode_with(SectionKind::Plan, plan);
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "binding slot", tag: 4 });
    assert_eq!(e.section_offset, 6);
    // Fill pattern length 256.
    let plan = vec![0, 1, 0, 1, 1, 3, 0, 0, 0, 0x80, 0x02, 0, 0];
    let (e, _) = decode_with(SectionKind::Plan, plan);
    assert_eq!(e.problem, SectionProblem::TooLarge { field: "fill pattern length", value: 256, max: 255 });
    // Relocation kind 8 (0 to 7: x86-64's, aarch64's and riscv's).
    let exe = vec![1, 0, 0, 0, 1, 0, 8, 0, 0, 0, 0];
    let (e, _) = decode_with(SectionKind::Executables, exe);
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "relocation kind", tag: 8 });
    assert_eq!(e.section_offset, 6);
}

#[test]
fn entry_counts_and_trailing_bytes() {
    // The signature has one entry; a plan with zero entries disagrees.
    let (e, _) = decode_with(SectionKind::Plan, vec![0, 0]);
    assert_eq!(e.problem, SectionProblem::EntryCountMismatch { signature: 1, plan: 0 });
    assert_eq!(e.section_offset, 1);
    for (i, kind) in [SectionKind::Signature, SectionKind::Plan, SectionKind::Executables, SectionKind::Debug]
        .into_iter()
        .enumerate()
    {
        let mut bytes = valid_sections()[if i == 3 { 4 } else { i }].1.clone();
        let len = bytes.len() as u64;
        bytes.push(0);
        let (e, _) = decode_with(kind, bytes);
        assert_eq!((e.section, e.problem, e.section_offset), (kind, SectionProblem::TrailingBytes { count: 1 }, len));
    }
    // External weights: hash cut short.
    let mut s: Vec<_> = valid_sections().into_iter().filter(|e| e.0 != SectionKind::Constants).collect();
    s.push((SectionKind::ExternalWeights, vec![1, b'w', 5, 1, 2, 3]));
    let e = read_program(&Module::parse(&file_with(&s)).expect("parse")).expect_err("short hash");
    assert_eq!(e.problem, SectionProblem::Truncated { field: "weights hash" });
    assert_eq!(e.section_offset, 3);
}

#[test]
fn errors_are_one_readable_line() {
    let (e, base) = decode_with(SectionKind::Signature, vec![0x80, 0x00]);
    assert_eq!(
        e.to_string(),
        format!("signature section, file offset {base} (byte 0 of the section): signature entries: varint longer than 64 bits or not minimal")
    );
}

#[test]
fn reseal_lets_deliberate_edits_through() {
    let file = write_program(&mlp(embedded(), true));
    let m = Module::parse(&file).expect("parse");
    let sig = m.sections().find(|s| s.kind == SectionKind::Signature).expect("signature");
    let mut d = file.clone();
    // The entry count (first byte of the signature) 1 → 0x7f: caught by the CRC...
    d[sig.offset as usize] = 0x7f;
    assert!(matches!(Module::parse(&d), Err(kiln_module::ReadError::SectionChecksum { .. })));
    // ...resealed, the container is fine again and the decoder sees the edit.
    kiln_module::reseal::reseal(&mut d);
    let m = Module::parse(&d).expect("resealed");
    let e = read_program(&m).expect_err("127 entries cannot fit");
    assert!(matches!(e.problem, SectionProblem::CountTooLarge { count: 127, .. }));
    // Truncating and resealing fixes the recorded length; the table then points past
    // the end, which the container reader names.
    let mut t = file[..file.len() - 10].to_vec();
    kiln_module::reseal::reseal(&mut t);
    assert!(matches!(Module::parse(&t), Err(kiln_module::ReadError::SectionOutOfBounds { .. })));
    // Too short to have a header: left alone.
    let mut s = file[..20].to_vec();
    kiln_module::reseal::reseal(&mut s);
    assert_eq!(s, file[..20]);
}

#[test]
fn collectives_by_hand_and_refused_under_format_1_3() {
    let mut p = bare_mlp();
    p.entries[0].buffers.clear();
    let part = |device: u32, s: u64, d: u64, len: u64| CollectivePart {
        device,
        src: b(Slot::Arena, s, len),
        dst: b(Slot::Arena, d, len * 2),
    };
    p.entries[0].commands = vec![
        Command::AllReduce {
            dtype: 1,
            parts: vec![
                CollectivePart { device: 0, src: b(Slot::Arena, 0, 4), dst: b(Slot::Arena, 8, 4) },
                CollectivePart { device: 1, src: b(Slot::Arena, 4, 4), dst: b(Slot::Arena, 12, 4) },
            ],
        },
        Command::AllGather { outer: 2, parts: vec![part(0, 0, 16, 4), part(1, 4, 24, 4)] },
    ];
    let plan = section_bytes(&p, SectionKind::Plan).expect("plan");
    // devices 0; entries 1; arena 64, align 64; 2 commands:
    //   tag 4, dtype 1, 2 parts: (device 0, arena 0+4, arena 8+4), (1, arena 4+4, arena 12+4);
    //   tag 5, outer 2, 2 parts: (0, arena 0+4, arena 16+8), (1, arena 4+4, arena 24+8);
    // 0 buffers; 0 extents.
    assert_eq!(
        plan,
        [
            0, 1, 0x40, 0x40, 2, //
            4, 1, 2, 0, 0, 0, 4, 0, 8, 4, 1, 0, 4, 4, 0, 12, 4, //
            5, 2, 2, 0, 0, 0, 4, 0, 16, 8, 1, 0, 4, 4, 0, 24, 8, //
            0, 0
        ]
    );
    let file_of = |minor: u16| file_of_format(&p, (SectionKind::Plan, plan.clone()), minor);
    // (A plan without bounded input dimensions is written as 1.5: no list of them.)
    let current = file_of(kiln_module::format::STATIC_FORMAT_VERSION.minor);
    let m = Module::parse(&current).expect("parses");
    assert_eq!(read_program(&m).expect("decodes").to_program().entries[0].commands, p.entries[0].commands);
    // A 1.3 file has no collectives: tag 4 is unknown there.
    let old = file_of(3);
    let m = Module::parse(&old).expect("a 1.3 file parses");
    let e = read_program(&m).expect_err("no collectives before 1.4");
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "command tag", tag: 4 }, "{e}");
    // And a reader of an older minor refuses a newer file by its version alone, naming
    // both (how a 1.3 runtime meets a 1.4 artifact).
    let reader = kiln_module::Version { major: 1, minor: 3 };
    assert!(!reader.can_read(kiln_module::FORMAT_VERSION));
    let newer = file_of(kiln_module::FORMAT_VERSION.minor + 1);
    match Module::parse(&newer) {
        Err(kiln_module::ReadError::UnsupportedVersion { file, reader }) => {
            assert_eq!((file.minor, reader), (kiln_module::FORMAT_VERSION.minor + 1, kiln_module::FORMAT_VERSION));
        }
        other => panic!("expected an unsupported version, got {other:?}"),
    }
}

#[test]
fn bounded_dims_round_trip_as_format_1_7_and_static_programs_stay_1_5() {
    let mut p = mlp(embedded(), false);
    p.entries[0].bounded = vec![BoundedDesc {
        input: 0,
        axis: 1,
        min: 1,
        bound: 4,
        staging: b(Slot::Arena, 64, 16),
        extent: b(Slot::Arena, 128, 8),
    }];
    let file = write_program(&p);
    let m = Module::parse(&file).expect("parse");
    assert_eq!(m.format(), kiln_module::format::BOUNDED_FORMAT_VERSION);
    assert_eq!(read_program(&m).expect("decode").to_program(), p);
    // The entry ends with its list: 1 entry; input 0, axis 1, min 1, bound 4; staging
    // arena (0), 64 (0x40), 16; extent arena, 128 (80 01), 8; then no bounded rows.
    let plan = section_bytes(&p, SectionKind::Plan).expect("plan");
    assert!(plan.ends_with(&[1, 0, 1, 1, 4, 0, 0x40, 16, 0, 0x80, 0x01, 8, 0]), "{plan:?}");
    // Format 1.7's bounded rows: command 0, dimension 0, 1 × 2 steps of 2 × 3.
    let mut r = p.clone();
    r.entries[0].bounded_rows =
        vec![kiln_module::program::BoundedRows { command: 0, dim: 0, outer: 1, span: 2, unit: 2, inner: 3 }];
    assert_eq!(read_program(&Module::parse(&write_program(&r)).expect("parse")).expect("decode").to_program(), r);
    let with_rows = section_bytes(&r, SectionKind::Plan).expect("plan");
    assert!(with_rows.ends_with(&[8, 1, 0, 0, 1, 2, 2, 3]), "{with_rows:?}");
    // Without bounded dimensions: format 1.5, and the plan has no list at all.
    let mut q = p.clone();
    q.entries[0].bounded.clear();
    let f = write_program(&q);
    assert_eq!(Module::parse(&f).expect("parse").format(), kiln_module::format::STATIC_FORMAT_VERSION);
    assert_eq!(section_bytes(&q, SectionKind::Plan).expect("plan").len() + 13, plan.len());
}

#[test]
fn heterogeneous_plans_round_trip_as_format_1_8_and_older_readers_refuse_their_commands() {
    let mut p = mlp(embedded(), false);
    p.devices.push(kiln_module::program::Device { kind: DeviceKind::Cuda, name: "cuda:0".into() });
    let n = p.entries[0].commands.len() as u32;
    let mut commands = vec![
        Command::Segment { device: 1, count: 1, waits: vec![] },
        Command::Transfer { src_device: 0, src: b(Slot::Input(0), 0, 8), dst_device: 1, dst: b(Slot::Arena, 64, 8) },
        Command::Segment { device: 0, count: n, waits: vec![0] },
    ];
    commands.extend(p.entries[0].commands.iter().cloned());
    p.entries[0].commands = commands;
    p.entries[0].device_arenas = vec![4096];
    let file = write_program(&p);
    let m = Module::parse(&file).expect("parse");
    assert_eq!(m.format(), kiln_module::format::HETERO_FORMAT_VERSION);
    assert_eq!(kiln_module::format::HETERO_FORMAT_VERSION.minor, kiln_module::format::HETERO_MINOR);
    assert_eq!(read_program(&m).expect("decode").to_program(), p);
    let plan = section_bytes(&p, SectionKind::Plan).expect("plan");
    // segment: tag 7, device 1, count 1, one wait... (the first command after the
    // entry's arena size and alignment and the command count).
    let at = plan.windows(4).position(|w| w == [7, 1, 1, 0]).expect("the first segment's bytes");
    // transfer: tag 8, device 0, input 0 (slot 2), offset 0, 8 bytes; device 1, arena, 64, 8.
    assert_eq!(&plan[at + 4..at + 13], &[8, 0, 2, 0, 8, 1, 0, 0x40, 8]);
    // The entry ends with its device arenas: one, 4096 (80 20).
    assert!(plan.ends_with(&[1, 0x80, 0x20]), "{plan:?}");
    // A 1.7 file has no segments: tag 7 is unknown there.
    let old = file_of_format(&p, (SectionKind::Plan, plan.clone()), 7);
    let e = read_program(&Module::parse(&old).expect("a 1.7 file parses")).expect_err("no segments before 1.8");
    assert_eq!(e.problem, SectionProblem::UnknownTag { field: "command tag", tag: 7 }, "{e}");
}

#[test]
fn prologues_round_trip_as_format_1_9_and_older_readers_refuse_them() {
    let mut p = mlp(embedded(), false);
    p.entries[0].prologue = 1;
    let file = write_program(&p);
    let m = Module::parse(&file).expect("parse");
    assert_eq!(m.format(), kiln_module::FORMAT_VERSION);
    assert_eq!(kiln_module::FORMAT_VERSION.minor, kiln_module::format::PROLOGUE_MINOR);
    assert_eq!(read_program(&m).expect("decode").to_program(), p);
    // The entry ends with no bounded dimensions, no bounded rows, no device arenas and
    // the prologue's length.
    let plan = section_bytes(&p, SectionKind::Plan).expect("plan");
    assert!(plan.ends_with(&[0, 0, 0, 1]), "{plan:?}");
    // Without one: written as before (format 1.5), four bytes shorter.
    let mut q = p.clone();
    q.entries[0].prologue = 0;
    assert_eq!(Module::parse(&write_program(&q)).expect("parse").format(), kiln_module::format::STATIC_FORMAT_VERSION);
    assert_eq!(section_bytes(&q, SectionKind::Plan).expect("plan").len() + 4, plan.len());
    // A 1.8 reader's view of the same plan bytes: the prologue is trailing data.
    let old = file_of_format(&p, (SectionKind::Plan, plan.clone()), 8);
    assert!(read_program(&Module::parse(&old).expect("a 1.8 file parses")).is_err());
}
