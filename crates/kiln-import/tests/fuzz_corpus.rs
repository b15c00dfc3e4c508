//! Replays the importer's fuzz corpus (`fuzz/corpus/import_onnx`) and fuzzes it
//! further with a seeded mutation loop, so the property the cargo-fuzz target
//! checks — import returns Ok or a typed error, never panics — holds in every
//! test run, on stable Rust.

use bytes::Bytes;
use kiln_filetest::fuzz::{edit, mutation_rounds, XorShift as Rng, EDGE_BYTES};
use kiln_import::{onnx::import_bytes, ImportOptions};
use std::path::PathBuf;

fn corpus() -> Vec<(String, Vec<u8>)> {
    kiln_filetest::fuzz::corpus(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/import_onnx"))
}

/// Imports `data`; returns whether it imported, or the panic message.
fn import(data: &[u8]) -> Result<bool, String> {
    let data = Bytes::copy_from_slice(data);
    kiln_filetest::fuzz::catch(|| import_bytes(data, None, &ImportOptions::default()).is_ok())
}

#[test]
fn seeds_import() {
    let files = corpus();
    let seeds =
        ["conv_pool.onnx", "gemm_relu.onnx", "generators.onnx", "if_const.onnx", "opset9.onnx", "shape_fold.onnx"];
    for s in seeds {
        let (_, data) = files.iter().find(|(n, _)| n == s).unwrap_or_else(|| panic!("seed {s} missing"));
        let r = import_bytes(Bytes::from(data.clone()), None, &ImportOptions::default());
        assert!(r.is_ok(), "seed {s}: {}", r.err().map(|e| e.to_string()).unwrap_or_default());
    }
}

#[test]
fn corpus_never_panics() {
    for (name, data) in corpus() {
        if let Err(msg) = import(&data) {
            panic!("corpus file {name} panics the importer: {msg}");
        }
    }
}

fn mutate(rng: &mut Rng, seed: &[u8], other: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(7) {
            0 if !d.is_empty() => edit::flip_bit(rng, &mut d),
            1 if !d.is_empty() => {
                let i = rng.below(d.len());
                d[i] = rng.next() as u8;
            }
            2 => edit::truncate(rng, &mut d),
            3 => edit::insert_random(rng, &mut d, 8),
            4 if !d.is_empty() => edit::set_byte(rng, &mut d, &EDGE_BYTES),
            5 if !other.is_empty() => {
                // Splice a chunk of another seed.
                let a = rng.below(other.len());
                let b = (a + 1 + rng.below(64)).min(other.len());
                let i = rng.below(d.len() + 1);
                d.splice(i..i, other[a..b].iter().copied());
            }
            _ => edit::remove_byte(rng, &mut d),
        }
    }
    d
}

#[test]
fn mutations_never_panic() {
    let files = corpus();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let mutant = |i: usize, _| mutate(&mut rng, &files[i].1, &files[(i + 1) % files.len()].1);
    let (imported, _) = mutation_rounds(&names, 400, "the importer", mutant, import);
    // The loop must exercise real import paths, not only the decoder's rejections.
    assert!(imported > 0, "no mutation imported successfully");
}
