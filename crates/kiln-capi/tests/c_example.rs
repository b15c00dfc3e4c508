//! `examples/c/run_model.c`, compiled with the system C compiler (`$CC`, else `cc`)
//! against the static and the shared library, runs lenet and prints what the runtime's
//! Rust API computes on the same input; its errors name the failing call, the status
//! and kiln's message.
//!
//! The libraries are the ones cargo built for this test: when a test links the rlib,
//! cargo builds the library's every crate type (staticlib, cdylib, rlib) in one rustc
//! run, into `deps/`, the folder of this test's executable. (It copies them up to
//! `target/<profile>/` only in `cargo build`: the copies there may be stale.)

mod common;

use common::{compile_lenet, f32_bytes, f32_values, pattern_f32, rust_invoke, scratch};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The folder cargo built this crate's libraries in for this test
/// (`target/<profile>/deps`, this test's own folder).
fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().expect("target/<profile>/deps").to_path_buf();
    let time = |lib: &str| {
        let path = dir.join(lib);
        path.metadata().and_then(|m| m.modified()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    // The rlib this test links and the C libraries come from one rustc run.
    let rlib = time("libkiln_capi.rlib");
    for lib in ["libkiln_capi.a", "libkiln_capi.so"] {
        let apart = match time(lib).duration_since(rlib) {
            Ok(d) => d,
            Err(e) => e.duration(),
        };
        assert!(apart.as_secs() < 60, "{lib} and libkiln_capi.rlib were not built together: a stale library?");
    }
    dir
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[derive(Clone, Copy, Debug)]
enum Link {
    Static,
    Shared,
}

/// Compiles run_model.c into `dir`, linked against the static or the shared library.
fn build_example(dir: &Path, link: Link) -> PathBuf {
    build_c(&repo().join("examples/c/run_model.c"), dir, link, Lang::C11)
}

/// The language a source is compiled as.
#[derive(Clone, Copy, Debug)]
enum Lang {
    C99,
    C11,
    /// C++17, with `$CXX` (else `c++`).
    Cxx,
}

/// Compiles the C program `source` as `lang` into `dir`, linked against the static or
/// the shared library.
fn build_c(source: &Path, dir: &Path, link: Link, lang: Lang) -> PathBuf {
    let (var, default, std, x) = match lang {
        Lang::C99 => ("CC", "cc", "-std=c99", "c"),
        Lang::C11 => ("CC", "cc", "-std=c11", "c"),
        Lang::Cxx => ("CXX", "c++", "-std=c++17", "c++"),
    };
    let cc = std::env::var(var).unwrap_or_else(|_| default.to_string());
    let libs = lib_dir();
    let stem = source.file_stem().and_then(|s| s.to_str()).expect("a C file's name");
    let exe = dir.join(format!("{stem}_{link:?}_{lang:?}").to_lowercase());
    let mut cmd = Command::new(&cc);
    cmd.args([std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1", "-x", x])
        .arg("-I")
        .arg(repo().join("crates/kiln-capi/include"))
        .arg(source)
        .args(["-x", "none"])
        .arg("-o")
        .arg(&exe);
    match link {
        Link::Static => {
            cmd.arg(libs.join("libkiln_capi.a")).args(["-lpthread", "-ldl", "-lm"]);
        }
        Link::Shared => {
            // -L finds libkiln_capi.so (preferred over the .a beside it); the rpath lets
            // the executable find it at run time.
            cmd.arg("-L").arg(&libs).arg("-lkiln_capi").arg(format!("-Wl,-rpath,{}", libs.display()));
        }
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run the C compiler {cc}: {e}"));
    assert!(out.status.success(), "{cc} failed on run_model.c ({link:?}):\n{}", String::from_utf8_lossy(&out.stderr));
    exe
}

fn run(exe: &Path, args: &[&str]) -> Output {
    Command::new(exe).args(args).output().unwrap_or_else(|e| panic!("{}: {e}", exe.display()))
}

fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "run_model failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("UTF-8 output")
}

/// The values printed for output `name`, as `name[k] = v` lines, in order of `k`.
fn printed_values(stdout: &str, name: &str) -> Vec<f64> {
    let prefix = format!("{name}[");
    let mut values = Vec::new();
    for line in stdout.lines().filter(|l| l.starts_with(&prefix)) {
        let (index, value) = line[prefix.len()..].split_once("] = ").unwrap_or_else(|| panic!("line {line:?}"));
        assert_eq!(index.parse::<usize>().ok(), Some(values.len()), "line {line:?}");
        values.push(value.parse::<f64>().unwrap_or_else(|e| panic!("line {line:?}: {e}")));
    }
    values
}

/// `got` equals `want` within 1e-6 (absolute, or relative for large values).
fn assert_close(got: &[f64], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: {} values printed, {} expected", got.len(), want.len());
    assert!(!want.is_empty(), "{what}: nothing to compare");
    for (k, (&g, &w)) in got.iter().zip(want).enumerate() {
        let w = f64::from(w);
        assert!((g - w).abs() <= 1e-6 * w.abs().max(1.0), "{what}: value {k} is {g}, the Rust invoke gives {w}");
    }
}

/// lenet's input and output as the module describes them: (input name, its element
/// count, output name).
fn lenet_signature(artifact: &[u8]) -> (String, usize, String) {
    let a = kiln_runtime::fs::AlignedBytes::copy_from(artifact);
    let m = kiln_runtime::Module::load(a.bytes(), None).expect("load");
    let sig = m.entry_signature(0).expect("entry");
    assert_eq!((sig.inputs.len(), sig.outputs.len()), (1, 1), "lenet has one input and one output");
    let (i, o) = (&sig.inputs[0], &sig.outputs[0]);
    assert_eq!((i.dtype, o.dtype), (1, 1), "lenet is f32");
    (i.name.to_string(), (i.bytes / 4) as usize, o.name.to_string())
}

fn example_matches_the_rust_runtime(link: Link) {
    let dir = scratch(&format!("example-{link:?}"));
    let c = compile_lenet(None);
    let model = dir.join("lenet.kiln");
    std::fs::write(&model, &c.artifact).expect("write artifact");
    let (input, n, output) = lenet_signature(&c.artifact);
    let want = f32_values(&rust_invoke(&c.artifact, None, &[f32_bytes(&pattern_f32(0, n))])[0]);
    let exe = build_example(&dir, link);
    let model = model.to_str().expect("UTF-8 path");

    let out = stdout_of(&run(&exe, &[model, "--all"]));
    assert!(out.starts_with("kiln "), "the version line comes first:\n{out}");
    assert!(out.contains(&format!("input 0: {input} f32 [1, 1, 28, 28] {} bytes", n * 4)), "{out}");
    assert!(out.contains(&format!("output 0: {output} f32 [1, 10] 40 bytes")), "{out}");
    assert_close(&printed_values(&out, &output), &want, &format!("{link:?}, pattern"));

    // The same values with the arena in the caller's memory, from the caller's
    // allocator, and on two threads.
    let out = stdout_of(&run(&exe, &[model, "--all", "--arena", "caller"]));
    assert!(out.contains("arena: ") && out.contains("the caller's"), "{out}");
    assert_close(&printed_values(&out, &output), &want, &format!("{link:?}, caller's arena"));
    let out = stdout_of(&run(&exe, &[model, "--all", "--arena", "allocator", "--threads", "2"]));
    // Arena + one input buffer + one output buffer, all given back.
    assert!(out.contains("allocator: 3 blocks"), "{out}");
    assert!(out.contains("allocator: 0 blocks, 0 bytes live after free"), "{out}");
    assert_close(&printed_values(&out, &output), &want, &format!("{link:?}, allocator, 2 threads"));

    // An input from a file, bound in place, by index and by name.
    let other: Vec<f32> = (0..n).map(|k| ((k * 13) % 29) as f32 / 29.0).collect();
    let file = dir.join("input.bin");
    std::fs::write(&file, f32_bytes(&other)).expect("write input");
    let want = f32_values(&rust_invoke(&c.artifact, None, &[f32_bytes(&other)])[0]);
    for spec in [format!("0={}", file.display()), format!("{input}={}", file.display())] {
        let out = stdout_of(&run(&exe, &[model, "--all", "--input", &spec]));
        assert_close(&printed_values(&out, &output), &want, &format!("{link:?}, --input {spec}"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn static_library_example_matches_the_rust_runtime() {
    example_matches_the_rust_runtime(Link::Static);
}

#[test]
fn shared_library_example_matches_the_rust_runtime() {
    example_matches_the_rust_runtime(Link::Shared);
}

#[test]
fn example_finds_weights_beside_the_artifact() {
    let dir = scratch("weights");
    let c = compile_lenet(Some("lenet.weights"));
    let weights = c.weights.as_deref().expect("weights kept outside");
    let model = dir.join("lenet.kiln");
    std::fs::write(&model, &c.artifact).expect("write artifact");
    let (_, n, output) = lenet_signature_with(&c.artifact, weights);
    let want = f32_values(&rust_invoke(&c.artifact, Some(weights), &[f32_bytes(&pattern_f32(0, n))])[0]);
    let exe = build_example(&dir, Link::Static);
    let model = model.to_str().expect("UTF-8 path");

    // Not there yet: the error names the file looked for.
    let out = run(&exe, &[model]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("KILN_STATUS_WEIGHTS"), "{err}");
    assert!(err.contains("lenet.weights"), "{err}");

    std::fs::write(dir.join("lenet.weights"), weights).expect("write weights");
    let out = stdout_of(&run(&exe, &[model, "--all"]));
    assert_close(&printed_values(&out, &output), &want, "weights beside the artifact");

    // Or named explicitly, from elsewhere.
    let elsewhere = dir.join("w.bin");
    std::fs::rename(dir.join("lenet.weights"), &elsewhere).expect("move weights");
    let out = stdout_of(&run(&exe, &[model, "--all", "--weights", elsewhere.to_str().expect("UTF-8")]));
    assert_close(&printed_values(&out, &output), &want, "--weights");
    let _ = std::fs::remove_dir_all(&dir);
}

fn lenet_signature_with(artifact: &[u8], weights: &[u8]) -> (String, usize, String) {
    let a = kiln_runtime::fs::AlignedBytes::copy_from(artifact);
    let m = kiln_runtime::Module::load(a.bytes(), Some(weights)).expect("load");
    let sig = m.entry_signature(0).expect("entry");
    (sig.inputs[0].name.to_string(), (sig.inputs[0].bytes / 4) as usize, sig.outputs[0].name.to_string())
}

#[test]
fn example_reports_errors_with_status_and_message() {
    let dir = scratch("errors");
    let c = compile_lenet(None);
    let exe = build_example(&dir, Link::Static);

    // A truncated artifact.
    let truncated = dir.join("truncated.kiln");
    std::fs::write(&truncated, &c.artifact[..c.artifact.len() / 2]).expect("write");
    let out = run(&exe, &[truncated.to_str().expect("UTF-8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("kiln_module_load_file(") && err.contains("KILN_STATUS_INVALID_ARTIFACT"), "{err}");
    assert!(err.contains(&format!("kiln_module_load_file: {}: ", truncated.display())), "{err}");

    // An input file of the wrong size.
    let model = dir.join("lenet.kiln");
    std::fs::write(&model, &c.artifact).expect("write artifact");
    let small = dir.join("small.bin");
    std::fs::write(&small, [0u8; 12]).expect("write input");
    let (input, n, _) = lenet_signature(&c.artifact);
    let out = run(&exe, &[model.to_str().expect("UTF-8"), "--input", &format!("0={}", small.display())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("KILN_STATUS_INVALID_ARGUMENT"), "{err}");
    assert!(err.contains(&format!("kiln_instance_bind_input: input {input} must be {} bytes, got 12", n * 4)), "{err}");

    // A name that is not an input.
    let out = run(&exe, &[model.to_str().expect("UTF-8"), "--input", &format!("nosuch={}", small.display())]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KILN_STATUS_NOT_FOUND") && err.contains("no input nosuch"), "{err}");

    // A file that does not exist.
    let out = run(&exe, &[dir.join("absent.kiln").to_str().expect("UTF-8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("KILN_STATUS_IO") && err.contains("absent.kiln"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Also the header's check in C99 and in C++ (its `extern "C"` block and typed enums).
#[test]
fn error_paths_called_from_c() {
    let dir = scratch("errors-c");
    let model = dir.join("lenet.kiln");
    std::fs::write(&model, &compile_lenet(None).artifact).expect("write artifact");
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/errors.c");
    for (link, lang) in [(Link::Static, Lang::C99), (Link::Shared, Lang::C99), (Link::Shared, Lang::Cxx)] {
        let exe = build_c(&source, &dir, link, lang);
        let out = stdout_of(&run(&exe, &[model.to_str().expect("UTF-8")]));
        let checks = out.lines().filter(|l| l.starts_with("ok ")).count();
        assert!(out.ends_with("0 failed\n") && checks == 20, "{link:?}, {lang:?}: {checks} checks passed:\n{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
