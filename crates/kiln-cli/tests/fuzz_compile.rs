//! Replays the `compile_onnx` fuzz corpus (`fuzz/corpus/compile_onnx`, and lenet) and
//! fuzzes further with a seeded mutation loop, so that the property the cargo-fuzz
//! target checks holds in every test run, on stable Rust: ONNX bytes → import → compile
//! → artifact, where import and compile return Ok or a typed error (never panic), what
//! the compiler ships verifies and loads, and a small model runs on zero inputs. The
//! bytes also choose speed or size code and embedded or external weights.
//!
//! Mutations work at two levels: bytes of the encoded model (as the importer's own
//! corpus test does), and fields of the decoded `ModelProto` (dimensions, attribute
//! values, op types, node inputs), which keep the model decodable so that mutants reach
//! shape inference, the tensor passes, dispatch formation and code generation. A
//! mutant that fails is written to `fuzz/corpus-tmp/` for the cargo-fuzz target to
//! replay.

use bytes::Bytes;
use kiln_filetest::fuzz::XorShift;
use kiln_import::onnx::proto::{tensor_shape_proto::dimension, type_proto, ModelProto};
use kiln_import::{onnx::import_bytes, ImportOptions};
use prost::Message;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

// The fuzz target's limits (`fuzz/fuzz_targets/compile_onnx.rs`).
/// Most values (tensors) a model may have to be compiled.
const MAX_VALUES: usize = 256;
/// Most bytes all its tensors together may take to be compiled.
const MAX_BYTES: usize = 4 << 20;
/// Most bytes all its tensors together may take to be run.
const MAX_RUN_BYTES: usize = 1 << 20;

fn corpus() -> Vec<(String, Vec<u8>)> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = root.join("fuzz/corpus/compile_onnx");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.expect("dir entry").path();
            let name = p.file_name().expect("file name").to_string_lossy().into_owned();
            (name, std::fs::read(&p).expect("read corpus file"))
        })
        .collect();
    files.sort();
    let lenet = root.join("models/lenet.onnx");
    files.push(("lenet.onnx".into(), std::fs::read(&lenet).unwrap_or_else(|e| panic!("{}: {e}", lenet.display()))));
    files
}

/// How far a model got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Reached {
    /// Import refused it (a typed error).
    Refused,
    /// Imported, but over the limits.
    TooLarge,
    /// Imported; the compiler refused it (a typed error).
    NotCompiled,
    /// Compiled and loaded, too large to run here.
    Loaded,
    /// Compiled, loaded and ran on zero inputs.
    Ran,
}

/// The fuzz target's property for `data`: how far it got, or why it failed (a panic's
/// message, or an artifact the runtime refuses).
fn check(data: &[u8]) -> Result<Reached, String> {
    let r = catch_unwind(AssertUnwindSafe(|| -> Result<Reached, String> {
        let bytes = Bytes::copy_from_slice(data);
        let Ok(graph) = import_bytes(bytes, None, &ImportOptions::default()) else { return Ok(Reached::Refused) };
        let total = graph.values.values().fold(0usize, |n, v| n.saturating_add(v.ty.storage_bytes()));
        if graph.values.len() > MAX_VALUES || total > MAX_BYTES {
            return Ok(Reached::TooLarge);
        }
        // As the fuzz target: the bytes choose speed or size, embedded or external weights.
        let pick = data.iter().fold(0u8, |h, &b| h.rotate_left(1) ^ b);
        let opts = kiln_compiler::Options {
            size: pick & 1 == 1,
            external_weights: (pick & 2 == 2).then(|| "fuzz.weights".to_string()),
            ..kiln_compiler::Options::default()
        };
        let Ok(c) = kiln_compiler::compile(&graph, &opts) else {
            return Ok(Reached::NotCompiled);
        };
        let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref())
            .map_err(|e| format!("the compiler shipped an artifact the runtime refuses: {e}"))?;
        if total > MAX_RUN_BYTES {
            return Ok(Reached::Loaded);
        }
        let Ok(sig) = module.entry_signature(0) else { return Ok(Reached::Loaded) };
        let inputs: Vec<Vec<u8>> = sig.inputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
        let mut outputs: Vec<Vec<u8>> = sig.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
        let ins: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let mut outs: Vec<&mut [u8]> = outputs.iter_mut().map(Vec::as_mut_slice).collect();
        let mut instance =
            kiln_runtime::Instance::new(&module).map_err(|e| format!("no instance of a compiled artifact: {e}"))?;
        instance.invoke(&ins, &mut outs).map_err(|e| format!("a compiled artifact does not run: {e}"))?;
        Ok(Reached::Ran)
    }));
    match r {
        Ok(r) => r,
        Err(p) => Err(p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default()),
    }
}

/// Keeps a failing input where the cargo-fuzz target can replay it, and fails.
fn fail(name: &str, data: &[u8], msg: &str) -> ! {
    let out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus-tmp");
    let _ = std::fs::create_dir_all(&out);
    let f = out.join(format!("compile-{name}"));
    let _ = std::fs::write(&f, data);
    panic!("{name} (saved to {}): {msg}", f.display());
}

#[test]
fn corpus_compiles_or_is_refused() {
    let mut ran = Vec::new();
    for (name, data) in corpus() {
        match check(&data) {
            Ok(Reached::Ran) => ran.push(name),
            Ok(_) => {}
            Err(msg) => fail(&name, &data, &msg),
        }
    }
    // The seeds that must go all the way (independent of the mutation loop below).
    for s in ["conv_pool.onnx", "gemm_relu.onnx", "generators.onnx", "lenet.onnx"] {
        assert!(ran.iter().any(|n| n == s), "seed {s} did not compile and run; these did: {ran:?}");
    }
}

/// Values that find edges: empty, one, small odd, negative (axes), large.
const INTERESTING: [i64; 10] = [0, 1, 2, 3, 5, -1, -2, 7, 64, 1 << 20];

/// Ops a node may be turned into (unary, binary and shape-changing ones).
const OPS: [&str; 16] = [
    "Relu",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Abs",
    "Neg",
    "Identity",
    "Softmax",
    "Add",
    "Mul",
    "Sub",
    "MatMul",
    "Transpose",
    "Flatten",
    "ReduceSum",
    "Concat",
];

/// One structural mutation of a decoded model; `false` when it had nothing to change.
fn mutate_model(rng: &mut XorShift, m: &mut ModelProto) -> bool {
    let Some(g) = m.graph.as_mut() else { return false };
    match rng.below(6) {
        0 => {
            // A graph input's dimension.
            let Some(input) = (!g.input.is_empty()).then(|| rng.below(g.input.len())) else { return false };
            let Some(type_proto::Value::TensorType(t)) = g.input[input].r#type.as_mut().and_then(|t| t.value.as_mut())
            else {
                return false;
            };
            let Some(shape) = t.shape.as_mut().filter(|s| !s.dim.is_empty()) else { return false };
            let d = rng.below(shape.dim.len());
            shape.dim[d].value = Some(dimension::Value::DimValue(*rng.pick(&INTERESTING[..5])));
        }
        1 => {
            // An integer attribute, or one element of an integer-list attribute.
            let Some(n) = (!g.node.is_empty()).then(|| rng.below(g.node.len())) else { return false };
            let node = &mut g.node[n];
            let Some(a) = (!node.attribute.is_empty()).then(|| rng.below(node.attribute.len())) else { return false };
            let attr = &mut node.attribute[a];
            let v = *rng.pick(&INTERESTING);
            if !attr.ints.is_empty() {
                let i = rng.below(attr.ints.len());
                attr.ints[i] = v;
            } else if attr.i.is_some() {
                attr.i = Some(v);
            } else {
                return false;
            }
        }
        2 => {
            // A node's op.
            let Some(n) = (!g.node.is_empty()).then(|| rng.below(g.node.len())) else { return false };
            g.node[n].op_type = Some(rng.pick(&OPS).to_string());
        }
        3 => {
            // A node input taken from elsewhere in the graph (another node's output or
            // a graph input): shapes that disagree, fan-out, reuse.
            let mut names: Vec<String> = g.input.iter().filter_map(|v| v.name.clone()).collect();
            names.extend(g.node.iter().flat_map(|n| n.output.iter().cloned()));
            let Some(n) = (!g.node.is_empty()).then(|| rng.below(g.node.len())) else { return false };
            let node = &mut g.node[n];
            if node.input.is_empty() || names.is_empty() {
                return false;
            }
            let i = rng.below(node.input.len());
            node.input[i] = names[rng.below(names.len())].clone();
        }
        4 => {
            // An initializer's dimension (its data no longer matches: import must say so).
            let Some(t) = (!g.initializer.is_empty()).then(|| rng.below(g.initializer.len())) else { return false };
            let init = &mut g.initializer[t];
            if init.dims.is_empty() {
                return false;
            }
            let d = rng.below(init.dims.len());
            init.dims[d] = *rng.pick(&INTERESTING[..8]);
        }
        _ => {
            // A node removed (its consumers lose their producer) or duplicated.
            if g.node.is_empty() {
                return false;
            }
            let n = rng.below(g.node.len());
            if rng.below(2) == 0 {
                g.node.remove(n);
            } else {
                let copy = g.node[n].clone();
                g.node.insert(n, copy);
            }
        }
    }
    true
}

/// One byte-level mutation (bit flips, interesting bytes, truncation, insertion).
fn mutate_bytes(rng: &mut XorShift, d: &mut Vec<u8>) {
    if d.is_empty() {
        return;
    }
    let i = rng.below(d.len());
    match rng.below(4) {
        0 => d[i] ^= 1 << rng.below(8),
        1 => d[i] = *rng.pick(&[0x00, 0x01, 0x7f, 0x80, 0xff]),
        2 => d.truncate(i.max(1)),
        _ => {
            let b = rng.next() as u8;
            d.insert(i, b);
        }
    }
}

#[test]
fn mutations_compile_or_are_refused() {
    let files = corpus();
    let mut rng = XorShift(0x2545_F491_4F6C_DD1D);
    let mut reached = [0usize; 5];
    // Rounds per seed; lenet (the largest, slowest to compile) gets fewer.
    for (name, seed) in &files {
        let rounds = if seed.len() > 16 << 10 { 10 } else { 100 };
        let Ok(model) = ModelProto::decode(&seed[..]) else { continue };
        for round in 0..rounds {
            let mut m = model.clone();
            let mut changed = false;
            for _ in 0..1 + rng.below(2) {
                changed |= mutate_model(&mut rng, &mut m);
            }
            let mut data = m.encode_to_vec();
            if !changed || rng.below(8) == 0 {
                mutate_bytes(&mut rng, &mut data);
            }
            match check(&data) {
                Ok(r) => reached[r as usize] += 1,
                Err(msg) => fail(&format!("{name}-{round}"), &data, &format!("mutation {round} of {name}: {msg}")),
            }
        }
    }
    // The loop must exercise the compiler and the runtime, not only the importer's
    // refusals.
    let [refused, too_large, not_compiled, loaded, ran] = reached;
    eprintln!("mutants: {refused} refused at import, {too_large} over the limits, {not_compiled} refused by the compiler, {loaded} loaded, {ran} ran");
    assert!(ran >= 200, "only {ran} mutants compiled and ran: {reached:?}");
    assert!(not_compiled + refused >= 50, "the mutations hardly ever break a model: {reached:?}");
}
