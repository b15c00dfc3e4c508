//! The runtime side links no compiler code: kiln-module, kiln-npy, kiln-runtime,
//! kiln-runner, kiln-runner-nostd and kiln-capi depend (outside their dev-dependencies) on no kiln crate but each other, and
//! on no crate beyond a short, deliberate list. The manifests are read as text: a dependency
//! is a `name = ...` or `name.workspace = true` line inside `[dependencies]`.

use std::path::Path;

/// The `[dependencies]` of the manifest of the crate in `crates/<dir>`.
fn dependencies(dir: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir).join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut in_deps = false;
    let mut deps = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.']).next().unwrap_or("").trim();
        assert!(!name.is_empty(), "{}: cannot read the dependency line {line:?}", path.display());
        deps.push(name.to_string());
    }
    deps
}

#[test]
fn the_reader_of_manifests_sees_dependencies() {
    // The check below means something only if the reader finds what is there.
    let cli = dependencies("kiln-cli");
    assert!(cli.iter().any(|d| d == "kiln-compiler"), "kiln-cli's dependencies read as {cli:?}");
    assert!(cli.iter().any(|d| d == "anyhow"), "kiln-cli's dependencies read as {cli:?}");
}

#[test]
fn runtime_side_links_no_compiler_crate() {
    let allowed: &[(&str, &[&str])] = &[
        ("kiln-module", &["crc32fast"]),
        // cudarc: the CUDA driver's bindings, optional behind the `cuda` feature (libcuda is
        // opened at run time; nothing of CUDA is linked).
        ("kiln-runtime", &["kiln-module", "libm", "libc", "cudarc"]),
        ("kiln-npy", &["kiln-module"]),
        // mimalloc: an optional global allocator of the runner binary (the `mimalloc`
        // feature, off by default; docs/runtime.md), never of the runtime library.
        ("kiln-runner", &["kiln-module", "kiln-npy", "kiln-runtime", "mimalloc"]),
        ("kiln-runner-nostd", &["kiln-module", "kiln-npy", "kiln-runtime", "libc"]),
        ("kiln-capi", &["kiln-module", "kiln-runtime"]),
    ];
    for (krate, ok) in allowed {
        for d in dependencies(krate) {
            assert!(ok.contains(&d.as_str()), "{krate} depends on {d}; the runtime side may depend only on {ok:?}");
        }
    }
}
