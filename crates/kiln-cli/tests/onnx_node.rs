//! The ONNX 1.17 node test suite (`$KILN_TEST_DATA/onnx-node`, fetched by
//! `scripts/test`) with the ONNX backend tolerances (see `kiln conformance`), through
//! both engines: the compiled path (import → compile → artifact file → load → run)
//! and the reference evaluator.
//!
//! `tests/data/onnx-node.expected` (compiled), `tests/data/onnx-node-ref.expected`
//! (reference) and `tests/data/onnx-node-cuda.expected` (compiled for CUDA, run on
//! GPU 0) list every case that does not pass, with its category and the harness's
//! reason (and, after ` — `, a note: why ONNX's data is wrong, or that a change is
//! expected to make the case pass, to be confirmed on a GPU and then removed). A test fails when an unlisted case fails, when a listed case
//! passes (so the list only shrinks), or when a case changes category; a panic or a
//! crash always fails. Cases that pass with small inputs bound to their test values
//! count as passing. Regenerate a list with
//! `scripts/bless-onnx-node [compiled|reference|cuda]` after checking every change by
//! hand.
//!
//! The same harness runs `$KILN_TEST_DATA/onnx-node-lowp`: the cases of a newer ONNX
//! (1.19, opset 24) for the low-precision element types kiln's 1.17 suite lacks
//! (f4E2M1FN and f8E8M0FNU Cast/CastLike, f4E2M1FN and blocked Quantize/DequantizeLinear),
//! with `tests/data/onnx-node-lowp.expected` and `onnx-node-lowp-ref.expected`, and
//! `$KILN_TEST_DATA/onnx-node-opset23`: that ONNX's cases of the opset-23 Attention,
//! RotaryEmbedding and RMSNormalization, each with its `_expanded` twin (the op written
//! out in older ops: MatMul, Softmax, …, which the CPU compiles to its attention kernel
//! where the chain has that form), with `onnx-node-opset23.expected` and
//! `onnx-node-opset23-ref.expected`.
//!
//! The CUDA run needs a CUDA driver: like the GPU tests of `tests/cuda_device.rs` it is
//! `#[ignore = "needs a CUDA driver (scripts/gpu-test)"]`, so cargo reports it as
//! ignored (never as passed) where there is none, and
//! `cargo test -p kiln-cli --test onnx_node -- --ignored` runs it on the GPU machine;
//! run without a driver it fails, saying it did not run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

/// One test a case set and engine: `name => (set, cases, engine, expected list)`
/// (the list's path relative to this file), run by `suite_in`.
macro_rules! suites {
    ($($name:ident => ($set:literal, $cases:literal, $engine:literal, $expected:literal);)*) => {
        $(
            #[test]
            fn $name() {
                suite_in($set, $cases, $engine, include_str!($expected));
            }
        )*
    };
}

suites! {
    onnx_node_suite_compiled => ("onnx-node", 1288, "compiled", "data/onnx-node.expected");
    onnx_node_suite_through_the_reference_evaluator => ("onnx-node", 1288, "reference", "data/onnx-node-ref.expected");
    onnx_node_lowp_cases_compiled => ("onnx-node-lowp", 21, "compiled", "data/onnx-node-lowp.expected");
    onnx_node_lowp_cases_through_the_reference_evaluator =>
        ("onnx-node-lowp", 21, "reference", "data/onnx-node-lowp-ref.expected");
    onnx_node_opset23_cases_compiled => ("onnx-node-opset23", 178, "compiled", "data/onnx-node-opset23.expected");
    onnx_node_opset23_cases_through_the_reference_evaluator =>
        ("onnx-node-opset23", 178, "reference", "data/onnx-node-opset23-ref.expected");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA driver (scripts/gpu-test)"]
fn onnx_node_suite_on_the_gpu() {
    if let Err(e) = kiln_runtime::cuda::driver_present() {
        panic!("ONNX node suite (cuda engine) NOT RUN: {e}: it needs a CUDA driver");
    }
    suite_in("onnx-node", 1288, "cuda", include_str!("data/onnx-node-cuda.expected"));
}

/// Runs the cases under `$KILN_TEST_DATA/<set>` (`cases` of them) on `engine`.
fn suite_in(set: &str, cases: usize, engine: &str, expected_text: &str) {
    let dir = data_dir().join(set);
    assert!(dir.is_dir(), "{} is missing; run scripts/setup-test-data", dir.display());
    let out = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["conformance", dir.to_str().expect("utf-8 path"), "--engine", engine, "--verbose"])
        .output()
        .expect("run kiln conformance");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "kiln conformance failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut got: BTreeMap<String, String> = BTreeMap::new();
    let mut total = 0;
    for line in stdout.lines() {
        if let Some((name, rest)) = line.split_once(": ") {
            if name.starts_with("test_") {
                total += 1;
                let cat = rest.split(':').next().unwrap_or("").trim().to_string();
                got.insert(name.to_string(), cat);
            }
        }
    }
    assert_eq!(total, cases, "{set} has {cases} cases");
    let expected: BTreeMap<&str, &str> = expected_text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let mut it = l.split_whitespace();
            (it.next().unwrap_or(""), it.next().unwrap_or(""))
        })
        .collect();
    let mut problems = Vec::new();
    for (name, cat) in &got {
        let passing = cat == "pass" || cat == "pass-specialised";
        match expected.get(name.as_str()) {
            None if !passing => problems.push(format!("{name}: {cat} (not in the expected list)")),
            Some(e) if passing => problems.push(format!("{name}: now passes, listed as {e}: remove it from the list")),
            Some(e) if *e != cat => problems.push(format!("{name}: {cat}, listed as {e}")),
            _ => {}
        }
        assert!(cat != "panic" && cat != "crash", "{name}: {cat}: a defect");
    }
    for name in expected.keys() {
        if !got.contains_key(*name) {
            problems.push(format!("{name}: listed but not in the suite"));
        }
    }
    let passed = got.values().filter(|c| *c == "pass" || *c == "pass-specialised").count();
    eprintln!("ONNX node cases in {set} ({engine} engine): {passed} of {total} pass");
    assert!(problems.is_empty(), "{} differences:\n{}", problems.len(), problems.join("\n"));
}
