//! Fuzz target: arbitrary bytes as an ONNX model, through the whole compiler to an
//! artifact, then through the runtime. Import and compile must return Ok or a typed
//! error, never panic; what the compiler ships must verify and load (a refusal is a
//! compiler bug), and, for a small model, run on zero inputs. The input's bytes also
//! choose `--opt size` or speed and embedded or external weights.
//!
//! Models over [`MAX_VALUES`] values or [`MAX_BYTES`] bytes of tensors are skipped after
//! import, so that no fuzz case takes seconds; only models under [`MAX_RUN_BYTES`] run.
//! `crates/kiln-cli/tests/fuzz_compile.rs` replays the corpus (`fuzz/corpus/compile_onnx`)
//! with the same limits and property on stable.
#![no_main]

use libfuzzer_sys::fuzz_target;

/// Most values (tensors) a model may have to be compiled.
const MAX_VALUES: usize = 256;
/// Most bytes all its tensors together may take to be compiled.
const MAX_BYTES: usize = 4 << 20;
/// Most bytes all its tensors together may take to be run.
const MAX_RUN_BYTES: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let opts = kiln_import::ImportOptions::default();
    let Ok(graph) = kiln_import::onnx::import_bytes(bytes::Bytes::copy_from_slice(data), None, &opts) else {
        return;
    };
    if graph.values.len() > MAX_VALUES {
        return;
    }
    let total = graph.values.values().fold(0usize, |n, v| n.saturating_add(v.ty.storage_bytes()));
    if total > MAX_BYTES {
        return;
    }
    // Both code-generation modes and both homes of the weights, chosen by the input's
    // bytes so that a case replays as it ran.
    let pick = data.iter().fold(0u8, |h, &b| h.rotate_left(1) ^ b);
    let opts = kiln_compiler::Options {
        size: pick & 1 == 1,
        external_weights: (pick & 2 == 2).then(|| "fuzz.weights".to_string()),
        ..kiln_compiler::Options::default()
    };
    let Ok(c) = kiln_compiler::compile(&graph, &opts) else { return };
    let module = match kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()) {
        Ok(m) => m,
        Err(e) => panic!("the compiler shipped an artifact the runtime refuses: {e}"),
    };
    if total > MAX_RUN_BYTES {
        return;
    }
    let Ok(sig) = module.entry_signature(0) else { return };
    let inputs: Vec<Vec<u8>> = sig.inputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    let mut outputs: Vec<Vec<u8>> = sig.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    let ins: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let mut outs: Vec<&mut [u8]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
    let mut instance = match kiln_runtime::Instance::new(&module) {
        Ok(i) => i,
        Err(e) => panic!("no instance of a compiled artifact: {e}"),
    };
    if let Err(e) = instance.invoke(&ins, &mut outs) {
        panic!("a compiled artifact does not run on zero inputs of its signature: {e}");
    }
});
