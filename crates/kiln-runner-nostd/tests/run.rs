//! `kiln-run-nostd` end to end on lenet and mlp: its `.npy` outputs match the runtime's
//! own Rust invoke bit for bit, and every error is one line on stderr with exit status 1.
//!
//! The binary under test is the real `no_std` one: `cargo test` builds binaries with
//! unwinding (where this crate links std for its panic runtime), so the test builds it
//! again through the `nostd-test` profile (panic=abort) in a target directory of its
//! own, and checks that it links nothing but the C library. `KILN_RUN_NOSTD=PATH` tests
//! that binary instead (the `runner` profile's, for one).

use kiln_npy::DType;
use kiln_runtime::fs::AlignedBytes;
use kiln_runtime::{Instance, Module};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The `no_std` binary, built once per test run; or the one `KILN_RUN_NOSTD` names (to
/// test another build, e.g. `target/runner/kiln-run-nostd`).
fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(bin) = std::env::var_os("KILN_RUN_NOSTD") {
            return PathBuf::from(bin);
        }
        let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nostd-build");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove("CARGO_TARGET_DIR")
            .args(["build", "--profile", "nostd-test", "-p", "kiln-runner-nostd", "--target-dir"])
            .arg(&target)
            .output()
            .expect("run cargo");
        assert!(out.status.success(), "building kiln-run-nostd failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let bin = target.join("nostd-test/kiln-run-nostd");
        assert!(bin.is_file(), "{} missing", bin.display());
        bin
    })
}

fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

fn compile(onnx: &Path, weights: Option<&str>) -> kiln_compiler::Compiled {
    let g = kiln_import::onnx::import_file(onnx, &kiln_import::ImportOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", onnx.display()));
    let opts = kiln_compiler::Options {
        external_weights: weights.map(str::to_string),
        source: onnx.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        ..kiln_compiler::Options::default()
    };
    kiln_compiler::compile(&g, &opts).unwrap_or_else(|e| panic!("compile {}: {e}", onnx.display()))
}

/// A fresh, empty directory for one test's files.
fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-run-nostd-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}

fn run(args: &[&str]) -> Output {
    Command::new(binary()).args(args).output().expect("run kiln-run-nostd")
}

/// An input's elements: k ↦ ((7k + 3·index) mod 17)/8 − 1 as f32 (exact).
fn pattern(index: usize, n: usize) -> Vec<u8> {
    (0..n).flat_map(|k| (((7 * k + 3 * index) % 17) as f32 / 8.0 - 1.0).to_le_bytes()).collect()
}

/// Compiles `onnx` (weights embedded or kept outside), writes fixed inputs, runs the
/// binary, and compares every output file with the runtime's Rust invoke.
fn matches_rust_invoke(onnx: &Path, external: bool) {
    let stem = onnx.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let dir = scratch(&format!("{stem}-{external}"));
    let c = compile(onnx, external.then_some("w.bin"));
    let artifact = dir.join("m.kiln");
    std::fs::write(&artifact, &c.artifact).expect("write artifact");
    let weights = dir.join("w.bin");
    if let Some(w) = &c.weights {
        std::fs::write(&weights, w).expect("write weights");
    }

    // The reference: the runtime's Rust API on the same inputs.
    let a = AlignedBytes::copy_from(&c.artifact);
    let w = c.weights.as_deref().map(AlignedBytes::copy_from);
    let m = Module::load(a.bytes(), w.as_ref().map(|w| w.bytes())).expect("load");
    let sig = m.signature();
    let entry = sig.default_entry().expect("an entry point");
    let mut args: Vec<String> = vec![artifact.display().to_string()];
    if external {
        args.extend(["--weights".to_string(), weights.display().to_string()]);
    }
    let mut inputs = Vec::new();
    for (i, t) in entry.inputs.iter().enumerate() {
        assert_eq!(t.dtype, 1, "{stem}: the test feeds f32 inputs");
        let data = pattern(i, t.bytes as usize / 4);
        let path = dir.join(format!("in{i}.npy"));
        std::fs::write(&path, kiln_npy::write(DType::F32, &t.dims, &data).expect("npy")).expect("write input");
        args.extend(["--input".to_string(), format!("{}={}", t.name, path.display())]);
        inputs.push(data);
    }
    let mut want: Vec<Vec<u8>> = entry.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    {
        let ins: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
        let mut outs: Vec<&mut [u8]> = want.iter_mut().map(|v| &mut v[..]).collect();
        Instance::new(&m).expect("instance").invoke_entry(entry.index, &ins, &mut outs).expect("invoke");
    }

    let out_dir = dir.join("out");
    args.extend(["--output-dir".to_string(), out_dir.display().to_string(), "--iterations".into(), "3".into()]);
    let out = Command::new(binary()).args(&args).output().expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stem}: {stderr}");
    assert_eq!(stderr, "", "{stem}: nothing on stderr");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), entry.outputs.len(), "{stem}: {stdout}");
    for ((t, want), line) in entry.outputs.iter().zip(&want).zip(lines) {
        let dims = t.dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
        let dtype = DType::from_code(t.dtype).expect("dtype");
        assert_eq!(line, format!("{} {} [{dims}]", t.name, dtype.name()));
        let file: String =
            t.name.chars().map(|c| if c.is_ascii_alphanumeric() || "._-".contains(c) { c } else { '_' }).collect();
        let path = out_dir.join(format!("{file}.npy"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let got = kiln_npy::read(&bytes).expect("output npy");
        assert_eq!((got.dtype, &got.dims[..], got.trailing), (dtype, &t.dims[..], 0), "{stem}: {}", t.name);
        assert!(got.data == &want[..], "{stem}: output {} differs from the Rust invoke", t.name);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn lenet_matches_rust_invoke() {
    let lenet = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet.onnx");
    matches_rust_invoke(&lenet, false);
    matches_rust_invoke(&lenet, true);
}

#[test]
fn mlp_matches_rust_invoke() {
    matches_rust_invoke(&data_dir().join("models/mlp.onnx"), false);
}

#[test]
fn links_the_c_library_alone() {
    // The dynamic symbols a std binary would add (pthread, the unwinder, getenv for
    // RUST_BACKTRACE, …) are absent: the binary imports C library functions only.
    let out = Command::new("nm").args(["-D", "--undefined-only"]).arg(binary()).output();
    let Ok(out) = out else { panic!("nm is needed to inspect the binary") };
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for banned in ["pthread_", "_Unwind_", "dl_iterate_phdr", "getenv"] {
        assert!(!text.contains(banned), "kiln-run-nostd imports {banned}*:\n{text}");
    }
    assert!(text.contains("mprotect"), "the code loader's mprotect is imported:\n{text}");
}

#[test]
fn help_exits_zero() {
    let out = run(&["--help"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("usage: kiln-run-nostd ARTIFACT"));
}

#[test]
fn errors_are_one_line_and_exit_one() {
    let dir = scratch("errors");
    let lenet = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet.onnx");
    let c = compile(&lenet, None);
    let artifact = dir.join("lenet.kiln");
    std::fs::write(&artifact, &c.artifact).expect("write");
    let a = artifact.display().to_string();
    let garbage = dir.join("garbage.kiln");
    std::fs::write(&garbage, b"not an artifact").expect("write");
    let g = garbage.display().to_string();
    // An input of the wrong shape, and a file that is no .npy.
    let small = dir.join("small.npy");
    std::fs::write(&small, kiln_npy::write(DType::F32, &[2], &[0u8; 8]).expect("npy")).expect("write");
    let bad_npy = dir.join("bad.npy");
    std::fs::write(&bad_npy, b"plain text").expect("write");
    let missing = dir.join("nope.kiln").display().to_string();
    let name = {
        let a = AlignedBytes::copy_from(&c.artifact);
        let m = Module::load(a.bytes(), None).expect("load");
        m.entry_signature(0).expect("entry").inputs[0].name.to_string()
    };
    let small_arg = format!("{name}={}", small.display());
    let bad_arg = format!("{name}={}", bad_npy.display());
    let not_given = format!("input {name} not given");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![], "usage: kiln-run-nostd"),
        (vec![&a, "--bogus"], "unknown option --bogus"),
        (vec![&a, "extra"], "unexpected argument extra"),
        (vec![&a, "--weights"], "--weights needs a value"),
        (vec![&a, "--iterations", "0"], "--iterations 0: need a positive integer"),
        (vec![&a, "--input", "x"], "--input x: expected NAME=FILE.npy"),
        (vec![&missing], "nope.kiln: No such file or directory (os error 2)"),
        (vec![&g], "garbage.kiln: "),
        (vec![&a], &not_given),
        (vec![&a, "--input", "zz=a.npy"], "--input zz: main has no such input"),
        (vec![&a, "--input", &small_arg], "shape"),
        (vec![&a, "--input", &bad_arg], "bad.npy: "),
    ];
    for (args, want) in cases {
        let out = run(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
        assert_eq!(out.stdout, b"", "{args:?}");
        assert!(stderr.starts_with("kiln-run-nostd: ") && stderr.ends_with('\n'), "{args:?}: {stderr:?}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr:?}");
        assert!(stderr.contains(want), "{args:?}: {stderr:?} lacks {want:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
