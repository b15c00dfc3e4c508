//! What the C API's tests share: lenet compiled by the compiler crates (dev-dependencies
//! only), the example's fixed input pattern, and the runtime's own Rust invoke as the
//! independent reference.
#![allow(dead_code)]

use kiln_runtime::fs::AlignedBytes;
use kiln_runtime::{Instance, Module};
use std::path::{Path, PathBuf};

/// `models/lenet.onnx` in the repository.
pub fn lenet_onnx() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet.onnx")
}

/// lenet compiled for this host: the artifact, and its weights when kept outside
/// (under the file name `weights`).
pub fn compile_lenet(weights: Option<&str>) -> kiln_compiler::Compiled {
    let path = lenet_onnx();
    let g = kiln_import::onnx::import_file(&path, &kiln_import::ImportOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let opts = kiln_compiler::Options {
        external_weights: weights.map(str::to_string),
        source: "lenet.onnx".to_string(),
        ..kiln_compiler::Options::default()
    };
    kiln_compiler::compile(&g, &opts).unwrap_or_else(|e| panic!("compile lenet: {e}"))
}

/// A fresh, empty directory for one test's files.
pub fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("kiln-capi-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    d
}

/// The example's pattern for an f32 input `index` of `n` elements: element k is
/// ((7k + 3·index) mod 17) / 8 − 1 (written here independently of run_model.c).
pub fn pattern_f32(index: usize, n: usize) -> Vec<f32> {
    (0..n).map(|k| ((7 * k + 3 * index) % 17) as f32 / 8.0 - 1.0).collect()
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Runs `artifact` (with `weights`) through the runtime's Rust API on `inputs`; the
/// outputs' bytes, in signature order.
pub fn rust_invoke(artifact: &[u8], weights: Option<&[u8]>, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let a = AlignedBytes::copy_from(artifact);
    let w = weights.map(AlignedBytes::copy_from);
    let m = Module::load(a.bytes(), w.as_ref().map(|w| w.bytes())).expect("load");
    let sig = m.entry_signature(0).expect("entry");
    let mut outs: Vec<Vec<u8>> = sig.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    let ins: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
    let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
    Instance::new(&m).expect("instance").invoke(&ins, &mut refs).expect("invoke");
    outs
}

/// f32 values of little-endian bytes.
pub fn f32_values(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
