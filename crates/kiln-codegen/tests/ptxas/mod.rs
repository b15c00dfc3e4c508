//! NVIDIA's `ptxas` from tests (kiln-codegen's `cuda.rs`, kiln-cli's `cuda_ptxas.rs`,
//! which includes this file by path): `$KILN_PTXAS`, else
//! `$KILN_TEST_DATA/tools/ptxas` (default `<repo>/.cache`, extracted by
//! scripts/setup-test-data from the `nvidia-cuda-nvcc` wheel). A missing one fails the
//! test.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// The `ptxas` binary; panics when there is none.
pub fn ptxas() -> PathBuf {
    let data = std::env::var_os("KILN_TEST_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"));
    let p = std::env::var_os("KILN_PTXAS").map(PathBuf::from).unwrap_or_else(|| data.join("tools/ptxas"));
    assert!(
        p.is_file(),
        "{} does not exist: run scripts/setup-test-data (it extracts ptxas from the nvidia-cuda-nvcc wheel)",
        p.display()
    );
    p
}

/// Assembles `ptx` for sm_90a in a scratch folder named after `suite` and `tag`; the
/// error output when ptxas refuses it.
pub fn assemble_ptx(suite: &str, tag: &str, ptx: &str) -> Result<(), String> {
    assemble_ptx_for("sm_90a", suite, tag, ptx)
}

/// [`assemble_ptx`] for the architecture `arch` (`sm_80`, `sm_90a`).
pub fn assemble_ptx_for(arch: &str, suite: &str, tag: &str, ptx: &str) -> Result<(), String> {
    run_ptxas_for(arch, &format!("{suite}-{}-{tag}", std::process::id()), &[], ptx).map(|_| ())
}

/// Runs `ptxas -arch=sm_90a ARGS` on `ptx` in the scratch folder `kiln-SCRATCH` (removed
/// after): ptxas's error output, as the error when it refuses the PTX, else as the value.
fn run_ptxas(scratch: &str, args: &[&str], ptx: &str) -> Result<String, String> {
    run_ptxas_for("sm_90a", scratch, args, ptx)
}

/// [`run_ptxas`] for the architecture `arch`.
fn run_ptxas_for(arch: &str, scratch: &str, args: &[&str], ptx: &str) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("kiln-{scratch}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("m.ptx");
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas())
        .arg(format!("-arch={arch}"))
        .args(args)
        .arg(&src)
        .arg("-o")
        .arg(dir.join("m.cubin"))
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// What `ptxas -v` reports for one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of stack frame.
    pub stack: u32,
    /// Bytes of spill stores.
    pub spill_stores: u32,
    /// Bytes of spill loads.
    pub spill_loads: u32,
}

/// Assembles `ptx` like [`assemble_ptx`], with `-v`: each entry's [`Usage`], by name.
pub fn assemble_ptx_verbose(suite: &str, tag: &str, ptx: &str) -> Result<Vec<(String, Usage)>, String> {
    let text = run_ptxas(&format!("{suite}-{}-{tag}-v", std::process::id()), &["-v"], ptx)?;
    // "Function properties for NAME", then "N bytes stack frame, N bytes spill stores,
    // N bytes spill loads", then "Used N registers".
    let num = |s: &str, before: &str| -> u32 {
        s.split(before).next().and_then(|h| h.split_whitespace().last()).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    let mut found: Vec<(String, Usage)> = Vec::new();
    for line in text.lines() {
        if let Some(name) = line.split("Function properties for ").nth(1) {
            found.push((name.trim().to_string(), Usage::default()));
        } else if let Some((_, u)) = found.last_mut() {
            if line.contains("bytes stack frame") {
                u.stack = num(line, " bytes stack frame");
                u.spill_stores = num(line, " bytes spill stores");
                u.spill_loads = num(line, " bytes spill loads");
            } else if line.contains("Used ") && line.contains(" registers") {
                u.registers = num(line, " registers");
            }
        }
    }
    Ok(found)
}
