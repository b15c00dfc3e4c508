//! `kiln-run` end to end on a hand-built artifact whose one kernel is hand-assembled
//! x86-64: y = a + b (f32), computed into the arena and copied out. The kernel and the
//! plan's pieces are kiln-runtime's test ones.

use kiln_module::program::*;
use kiln_module::sections::write_program;
use std::path::{Path, PathBuf};
use std::process::Command as Cmd;

#[path = "../../kiln-runtime/tests/common/pieces.rs"]
mod pieces;
use pieces::{add_kernel, b, dispatch, tensor, ADD_F32};

fn program(external: Option<&[u8]>) -> Program {
    let t = |name: &str| tensor(name, 1, &[3], 12);
    let (kernels, executables) = add_kernel(DeviceKind::Cpu, ADD_F32.to_vec(), vec![]);
    Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![EntryPoint {
            bounded: Vec::new(),
            bounded_rows: Vec::new(),
            extents: Vec::new(),
            name: "main".into(),
            inputs: vec![t("a"), t("b")],
            outputs: vec![t("out/y:0")],
            arena_size: 12,
            arena_align: 16,
            commands: vec![
                dispatch(0, 3, vec![b(Slot::Input(0), 0, 12), b(Slot::Input(1), 0, 12), b(Slot::Arena, 0, 12)]),
                Command::Copy { src: b(Slot::Arena, 0, 12), dst: b(Slot::Output(0), 0, 12) },
            ],
            buffers: vec![],
        }],
        kernels,
        executables,
        constants: match external {
            Some(w) => Constants::External {
                file: "w.bin".into(),
                size: w.len() as u64,
                hash: kiln_module::sections::weights_hash(w),
            },
            None => Constants::Embedded(vec![]),
        },
        debug: None,
    }
}

fn npy_f32(dims: &[u64], v: &[f32]) -> Vec<u8> {
    npy("<f4", dims, &v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>())
}

/// An `.npy` image as NumPy writes it (header padded to 64 bytes; `shape` with a trailing
/// comma for one dimension, comma-separated otherwise).
fn npy(descr: &str, dims: &[u64], body: &[u8]) -> Vec<u8> {
    let shape = match dims {
        [one] => format!("{one},"),
        _ => dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "),
    };
    let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({shape}), }}");
    while (10 + h.len() + 1) % 64 != 0 {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend((h.len() as u16).to_le_bytes());
    out.extend(h.as_bytes());
    out.extend(body);
    out
}

fn tmp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-run-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("tmp dir");
    d
}

fn kiln_run(args: &[&Path]) -> (bool, String, String) {
    let out = Cmd::new(env!("CARGO_BIN_EXE_kiln-run")).args(args).output().expect("run kiln-run");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn runs_on_npy_inputs_and_writes_outputs() {
    let d = tmp("inputs");
    std::fs::write(d.join("m.kiln"), write_program(&program(None))).expect("write");
    std::fs::write(d.join("a.npy"), npy_f32(&[3], &[1.0, 2.0, 3.0])).expect("write");
    std::fs::write(d.join("b.npy"), npy_f32(&[3], &[0.5, -4.0, 10.0])).expect("write");
    let p = |s: &str| d.join(s);
    let (ok, stdout, stderr) = kiln_run(&[
        &p("m.kiln"),
        Path::new("--input"),
        Path::new(&format!("a={}", p("a.npy").display())),
        Path::new("--input"),
        Path::new(&format!("b={}", p("b.npy").display())),
        Path::new("--iterations"),
        Path::new("3"),
        Path::new("--output-dir"),
        &p("out"),
        Path::new("--threads"),
        Path::new("3"),
    ]);
    assert!(ok, "{stderr}");
    // y = [1.5, -2, 13]: min -2, max 13, mean 12.5 / 3; printed as `kiln run` prints it.
    assert_eq!(stdout, "out/y:0: f32[3] min -2.000000 max 13.000000 mean 4.166667 [1.500000, -2.000000, 13.000000]\n");
    assert!(stderr.starts_with("3 iteration(s) on 3 thread(s): median"), "{stderr}");
    let y = std::fs::read(p("out").join("out_y_0.npy")).expect("output file");
    assert_eq!(y, npy_f32(&[3], &[1.5, -2.0, 13.0]));
}

#[test]
fn random_inputs_when_none_are_given() {
    let d = tmp("random");
    std::fs::write(d.join("m.kiln"), write_program(&program(None))).expect("write");
    let (ok, out1, err) = kiln_run(&[&d.join("m.kiln")]);
    assert!(ok, "{err}");
    assert!(out1.starts_with("out/y:0: f32[3] min "), "{out1}");
    let (_, out2, _) = kiln_run(&[&d.join("m.kiln")]);
    assert_eq!(out1, out2, "the seed is fixed");
    let (ok, out3, err) = kiln_run(&[&d.join("m.kiln"), Path::new("--threads"), Path::new("2")]);
    assert!(ok && err.contains("on 2 thread(s)"), "{err}");
    assert_eq!(out1, out3, "two threads compute what one does");
}

#[test]
fn errors_are_one_line() {
    let d = tmp("errors");
    std::fs::write(d.join("m.kiln"), write_program(&program(None))).expect("write");
    std::fs::write(d.join("a.npy"), npy_f32(&[4], &[1.0; 4])).expect("write");
    let arg = format!("a={}", d.join("a.npy").display());
    let (ok, _, err) = kiln_run(&[&d.join("m.kiln"), Path::new("--input"), Path::new(&arg)]);
    assert!(!ok);
    assert_eq!(err, "kiln-run: input a must have shape [3], got [4]\n");
    let (ok, _, err) = kiln_run(&[&d.join("m.kiln"), Path::new("--input"), Path::new("zz=x.npy")]);
    assert!(!ok);
    assert_eq!(err, "kiln-run: --input zz: main has no such input (inputs: a, b)\n");
    let w = [7u8; 32];
    std::fs::write(d.join("ext.kiln"), write_program(&program(Some(&w)))).expect("write");
    let (ok, _, err) = kiln_run(&[&d.join("ext.kiln")]);
    assert!(!ok);
    assert!(err.contains("weights are in a separate file (w.bin, 32 bytes)") && err.lines().count() == 1, "{err}");
    std::fs::write(d.join("w.bin"), w).expect("write");
    let (ok, _, err) = kiln_run(&[&d.join("ext.kiln"), Path::new("--weights"), &d.join("w.bin")]);
    assert!(ok, "{err}");
    let (ok, _, err) = kiln_run(&[&d.join("nope.kiln")]);
    assert!(!ok && err.starts_with("kiln-run: ") && err.lines().count() == 1, "{err}");
    std::fs::write(d.join("junk.kiln"), b"not a module at all, just text").expect("write");
    let (ok, _, err) = kiln_run(&[&d.join("junk.kiln")]);
    assert!(!ok);
    assert!(err.contains("not a .kiln module"), "{err}");
}

/// Artifacts a verifier must stop, or whose sizes no allocator gives: one line, no
/// panic, no abort.
#[test]
fn crafted_artifacts_are_refused_in_one_line() {
    let d = tmp("crafted");
    let refused = |name: &str, p: &Program, needles: &[&str]| {
        std::fs::write(d.join(name), write_program(p)).expect("write");
        let (ok, _, err) = kiln_run(&[&d.join(name)]);
        assert!(!ok, "{name} ran");
        assert!(!err.contains("panicked") && !err.contains("memory allocation"), "{name}: {err}");
        assert_eq!(err.lines().count(), 1, "{name}: {err}");
        assert!(err.starts_with("kiln-run: "), "{name}: {err}");
        for n in needles {
            assert!(err.contains(n), "{name}: `{n}` not in {err}");
        }
    };
    // A binding whose end overflows u64.
    let mut p = program(None);
    if let Command::Dispatch { bindings, .. } = &mut p.entries[0].commands[0] {
        bindings[0].offset = u64::MAX;
    }
    refused(
        "overflow.kiln",
        &p,
        &["invalid module: entry main, command 0: binding 0 input 0 bytes 18446744073709551615.."],
    );
    // A name with a line break in the message.
    let mut p = program(None);
    p.entries[0].name = "main\nx".into();
    p.entries[0].arena_align = 3;
    refused("name.kiln", &p, &["entry main\\nx: arena of 12 bytes aligned to 3"]);
    // An output of 2^62 bytes (its dims agree, so it verifies).
    let mut p = program(None);
    p.entries[0].outputs[0].dims = vec![1 << 60];
    p.entries[0].outputs[0].bytes = 1 << 62;
    refused("huge-output.kiln", &p, &["cannot allocate the 4611686018427387904 bytes of output out/y:0"]);
    // An input of 2^62 bytes, fed random data.
    let mut p = program(None);
    p.entries[0].inputs[1].dims = vec![1 << 60];
    p.entries[0].inputs[1].bytes = 1 << 62;
    refused("huge-input.kiln", &p, &["cannot allocate the 4611686018427387904 bytes of input b"]);
    // More iterations than timings fit in memory.
    std::fs::write(d.join("m.kiln"), write_program(&program(None))).expect("write");
    let (ok, _, err) = kiln_run(&[&d.join("m.kiln"), Path::new("--iterations"), Path::new("18446744073709551615")]);
    assert!(!ok && err.lines().count() == 1 && err.contains("cannot hold that many timings"), "{err}");
}

/// bf16 and int4 through `.npy` files as numpy + `ml_dtypes` save them (untyped `'<V2'` and
/// `'<V1'`, int4 one element a byte): read as the signature's dtypes, copied to the
/// outputs, written back as the same files.
#[test]
fn ml_dtypes_files_in_and_out() {
    let d = tmp("ml-dtypes");
    let program = Program {
        devices: vec![Device { kind: DeviceKind::Cpu, name: "cpu".into() }],
        entries: vec![EntryPoint {
            bounded: Vec::new(),
            bounded_rows: Vec::new(),
            extents: Vec::new(),
            name: "main".into(),
            // bf16 (ONNX code 16) [2, 3]; int4 (code 22) [5], packed in 3 bytes.
            inputs: vec![tensor("x", 16, &[2, 3], 12), tensor("q", 22, &[5], 3)],
            outputs: vec![tensor("y", 16, &[2, 3], 12), tensor("r", 22, &[5], 3)],
            arena_size: 0,
            arena_align: 16,
            commands: vec![
                Command::Copy { src: b(Slot::Input(0), 0, 12), dst: b(Slot::Output(0), 0, 12) },
                Command::Copy { src: b(Slot::Input(1), 0, 3), dst: b(Slot::Output(1), 0, 3) },
            ],
            buffers: vec![],
        }],
        kernels: vec![],
        executables: vec![],
        constants: Constants::Embedded(vec![]),
        debug: None,
    };
    std::fs::write(d.join("m.kiln"), write_program(&program)).expect("write");
    // np.save(f, np.array([[1, -2, 0.5], [3, 0, -0.25]], ml_dtypes.bfloat16)) and
    // np.save(g, np.array([-8, 7, -1, 0, 3], ml_dtypes.int4)).
    let bf16: Vec<u8> = [0x3f80u16, 0xc000, 0x3f00, 0x4040, 0, 0xbe80].iter().flat_map(|v| v.to_le_bytes()).collect();
    let x = npy("<V2", &[2, 3], &bf16);
    let q = npy("<V1", &[5], &[0x08, 0x07, 0x0f, 0x00, 0x03]);
    std::fs::write(d.join("x.npy"), &x).expect("write");
    std::fs::write(d.join("q.npy"), &q).expect("write");
    let arg = |n: &str| format!("{n}={}", d.join(format!("{n}.npy")).display());
    let (ok, stdout, stderr) = kiln_run(&[
        &d.join("m.kiln"),
        Path::new("--input"),
        Path::new(&arg("x")),
        Path::new("--input"),
        Path::new(&arg("q")),
        Path::new("--output-dir"),
        &d.join("out"),
    ]);
    assert!(ok, "{stderr}");
    assert!(stdout.contains("y: bf16[2,3]") && stdout.contains("r: i4[5]"), "{stdout}");
    assert_eq!(std::fs::read(d.join("out/y.npy")).expect("y"), x);
    assert_eq!(std::fs::read(d.join("out/r.npy")).expect("r"), q);
    // The int4 file for the bf16 input: one line naming both.
    let (ok, _, err) =
        kiln_run(&[&d.join("m.kiln"), Path::new("--input"), Path::new(&format!("x={}", d.join("q.npy").display()))]);
    assert!(!ok);
    assert_eq!(
        err,
        format!(
            "kiln-run: {}: dtype '<V1' cannot hold bf16: ml_dtypes.bfloat16 is saved as '<V2'\n",
            d.join("q.npy").display()
        )
    );
}
