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
    let dir = std::env::temp_dir().join(format!("kiln-{suite}-{}-{tag}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("m.ptx");
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas())
        .arg("-arch=sm_90a")
        .arg(&src)
        .arg("-o")
        .arg(dir.join("m.cubin"))
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Assembles `ptx` for sm_90a with `-v`: ptxas's report (per entry, its registers and
/// "N bytes stack frame, N bytes spill stores, N bytes spill loads"), or its error
/// output when it refuses the module.
pub fn assemble_ptx_verbose(suite: &str, tag: &str, ptx: &str) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("kiln-{suite}-{}-{tag}-v", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("m.ptx");
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas())
        .arg("-arch=sm_90a")
        .arg("-v")
        .arg(&src)
        .arg("-o")
        .arg(dir.join("m.cubin"))
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

/// From `ptxas -v`'s report, entry `name`'s "N bytes stack frame, N bytes spill
/// stores, N bytes spill loads" line (trimmed), if the report has it.
pub fn frame_of(info: &str, name: &str) -> Option<String> {
    let head = format!("Function properties for {name}");
    let mut lines = info.lines();
    lines.find(|l| l.trim_end().ends_with(&head))?;
    lines.next().map(|l| l.trim().to_string())
}

/// From `ptxas -v`'s report, the registers entry `name` uses.
pub fn registers_of(info: &str, name: &str) -> Option<u32> {
    let head = format!("Function properties for {name}");
    let mut lines = info.lines();
    lines.find(|l| l.trim_end().ends_with(&head))?;
    let used = lines.find(|l| l.contains("Used "))?;
    used.split("Used ").nth(1)?.split_whitespace().next()?.parse().ok()
}
