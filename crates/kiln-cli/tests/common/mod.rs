//! Running the `kiln` binary from tests: its exit status and output, and the shape of
//! a clean failure (one `error:` line, no panic).
#![allow(dead_code)]

use std::process::Command;

/// Runs kiln; returns (success, stdout, stderr).
pub fn kiln(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kiln")).args(args).output().expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs kiln, asserts success, returns stdout.
pub fn ok(args: &[&str]) -> String {
    let (ok, out, err) = kiln(args);
    assert!(ok, "kiln {args:?} failed: {err}");
    out
}

/// Asserts a clean failure: non-zero exit, one line starting `error:`, containing `needles`.
pub fn fails_with(args: &[&str], needles: &[&str]) {
    let (ok, _, err) = kiln(args);
    assert!(!ok, "kiln {args:?} should fail");
    assert!(!err.contains("panicked"), "kiln {args:?} panicked: {err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "kiln {args:?}: expected one line on stderr, got: {err}");
    assert!(lines[0].starts_with("error: "), "kiln {args:?}: {err}");
    for n in needles {
        assert!(lines[0].contains(n), "kiln {args:?}: `{n}` not in: {}", lines[0]);
    }
}
