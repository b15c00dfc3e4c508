//! Firmware linking (issue 22, item 2): `kiln compile --emit object` gives an object
//! that `examples/firmware/embed.c` links with the C API's static library into a static
//! binary; it runs lenet from the linked-in bytes, opening no file, and prints what the
//! Rust runtime computes on the same input. The `--emit c-array` source links the same.
//!
//! The static library is the one cargo built for this test: kiln-capi is a
//! dev-dependency, and cargo builds a dependency's every crate type (staticlib too)
//! into `deps/`, this test's own folder, as `libkiln_capi-HASH.a`.

mod common;

use common::{lenet_artifact, ok, s, LENET};
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The newest `libkiln_capi*.a` in this test's folder (cargo built it with this test;
/// it names a staticlib without the hash, `libkiln_capi.a`).
fn static_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().expect("target/<profile>/deps");
    let mut libs: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(dir)
        .expect("deps folder")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            name.starts_with("libkiln_capi") && name.ends_with(".a")
        })
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    libs.sort();
    libs.pop().unwrap_or_else(|| panic!("no libkiln_capi*.a in {}", dir.display())).1
}

/// Links embed.c with `model` (an object or C source) into a static binary.
fn link(dir: &Path, model: &Path, name: &str) -> PathBuf {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let exe = dir.join(name);
    let out = Command::new(&cc)
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-O1", "-static", "-I"])
        .arg(repo().join("crates/kiln-capi/include"))
        .arg(repo().join("examples/firmware/embed.c"))
        .arg(model)
        .arg(static_library())
        .args(["-lpthread", "-ldl", "-lm", "-o"])
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(out.status.success(), "{cc} failed linking embed.c:\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

/// What the Rust runtime computes for lenet on embed.c's input pattern.
fn rust_values(artifact: &[u8]) -> (String, Vec<f32>) {
    let a = kiln_runtime::fs::AlignedBytes::copy_from(artifact);
    let m = kiln_runtime::Module::load(a.bytes(), None).expect("load");
    let sig = m.entry_signature(0).expect("entry");
    let inputs: Vec<Vec<u8>> = sig
        .inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            (0..t.bytes as usize / 4).flat_map(|k| (((7 * k + 3 * i) % 17) as f32 / 8.0 - 1.0).to_le_bytes()).collect()
        })
        .collect();
    let mut outs: Vec<Vec<u8>> = sig.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    let mut inst = kiln_runtime::Instance::with_threads(&m, 1).expect("instance");
    let ins: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
    inst.invoke(&ins, &mut out_refs).expect("invoke");
    let values = outs[0].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    (sig.outputs[0].name.to_string(), values)
}

/// Runs the binary in an empty folder under strace (when there is one) and returns its
/// output, checking that it opened no file.
fn run_without_files(exe: &Path, dir: &Path) -> String {
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).expect("empty dir");
    let strace = Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success());
    let trace = dir.join("trace.txt");
    let out = if strace {
        Command::new("strace")
            .args(["-f", "-e", "trace=open,openat,openat2,creat", "-o"])
            .arg(&trace)
            .arg(exe)
            .current_dir(&empty)
            .output()
    } else {
        Command::new(exe).current_dir(&empty).output()
    }
    .expect("run embed");
    assert!(out.status.success(), "embed failed:\n{}", String::from_utf8_lossy(&out.stderr));
    if strace {
        let t = std::fs::read_to_string(&trace).expect("trace");
        let opens: Vec<&str> = t.lines().filter(|l| l.contains("open") && !l.contains("= -1 ENOENT")).collect();
        assert!(opens.is_empty(), "embed opened files:\n{}", opens.join("\n"));
    }
    String::from_utf8(out.stdout).expect("utf-8")
}

fn printed(stdout: &str, name: &str) -> Vec<f64> {
    let prefix = format!("{name}[");
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .enumerate()
        .map(|(k, rest)| {
            let (i, v) = rest.split_once("] = ").unwrap_or_else(|| panic!("line {rest:?}"));
            assert_eq!(i.parse::<usize>().ok(), Some(k));
            v.parse::<f64>().expect("value")
        })
        .collect()
}

fn assert_same(got: &[f64], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {got:?} vs {want:?}");
    assert!(!want.is_empty());
    for (g, &w) in got.iter().zip(want) {
        // Printed with 9 significant digits: an f32 reads back exactly.
        assert_eq!(*g as f32, w, "{what}: {got:?} vs {want:?}");
    }
}

/// Compiles LeNet with `--emit emit` into `file`, links that into the binary `exe` and
/// checks that it prints what the Rust runtime computes from the artifact; with
/// `artifact_gone` the artifact file is removed first, so that the binary has nothing
/// to read it from.
fn linked_binary_runs_the_model(emit: &str, file: &str, exe: &str, artifact_gone: bool) {
    let (dir, art) = lenet_artifact("firmware", emit);
    let (output, want) = rust_values(&std::fs::read(&art).expect("artifact"));
    let linked = dir.join(file);
    ok(&["compile", LENET, "-o", s(&linked), "--emit", emit, "--symbol", "kiln_model"]);
    if artifact_gone {
        std::fs::remove_file(&art).expect("remove artifact");
    }
    let exe = link(&dir, &linked, exe);
    let out = run_without_files(&exe, &dir);
    assert_same(&printed(&out, &output), &want, &format!("--emit {emit}"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn object_links_into_a_static_binary_that_runs_the_model() {
    linked_binary_runs_the_model("object", "model.o", "embed_object", true);
}

#[test]
fn c_array_links_the_same() {
    linked_binary_runs_the_model("c-array", "model.c", "embed_c_array", false);
}
