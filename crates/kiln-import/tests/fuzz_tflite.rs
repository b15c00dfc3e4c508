//! Replays the TFLite importer's fuzz corpus (`fuzz/corpus/import_tflite`) and fuzzes
//! it further with a seeded mutation loop, so the property the `import_tflite`
//! cargo-fuzz target checks — import returns Ok or a typed error, never panics —
//! holds in every test run, on stable Rust. Flatbuffers are offsets into the buffer,
//! so the mutations favour what moves offsets: 32-bit words set to small, large and
//! negative values, truncation, and bytes inserted or removed.

use bytes::Bytes;
use kiln_filetest::fuzz::{edit, mutation_rounds, XorShift as Rng, EDGE_BYTES};
use kiln_import::{tflite::import_bytes, ImportError, ImportOptions};
use std::path::PathBuf;

fn corpus() -> Vec<(String, Vec<u8>)> {
    kiln_filetest::fuzz::corpus(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/import_tflite"))
}

/// Imports `data`; returns whether it imported, or the panic message.
fn import(data: &[u8]) -> Result<bool, String> {
    let data = Bytes::copy_from_slice(data);
    kiln_filetest::fuzz::catch(|| import_bytes(data, &ImportOptions::default()).is_ok())
}

#[test]
fn seeds_import() {
    let files = corpus();
    assert!(files.len() >= 3, "the corpus has {} files", files.len());
    for (name, data) in &files {
        let r = import_bytes(Bytes::from(data.clone()), &ImportOptions::default());
        assert!(r.is_ok(), "seed {name}: {}", r.err().map(|e| e.to_string()).unwrap_or_default());
    }
}

/// Regressions: truncated and corrupted files are typed decode errors.
#[test]
fn truncated_and_corrupt_files_are_decode_errors() {
    let files = corpus();
    let (_, seed) = files.iter().find(|(n, _)| n == "conv_net.tflite").expect("conv_net seed");
    let decode = |b: &[u8]| {
        matches!(import_bytes(Bytes::copy_from_slice(b), &ImportOptions::default()), Err(ImportError::TfliteDecode(_)))
    };
    assert!(decode(&seed[..seed.len() / 2]), "half a file");
    assert!(decode(&seed[..12]), "the header only");
    let mut wrong_magic = seed.clone();
    wrong_magic[4..8].copy_from_slice(b"TFL2");
    assert!(decode(&wrong_magic), "another file identifier");
    let mut root_past_end = seed.clone();
    root_past_end[..4].copy_from_slice(&(seed.len() as u32 + 8).to_le_bytes());
    assert!(decode(&root_past_end), "a root offset past the end");
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for _ in 0..1 + rng.below(3) {
        match rng.below(6) {
            0 if d.len() >= 4 => {
                let i = rng.below(d.len() - 3) & !3;
                let v: u32 = [0, 1, 4, 0x7fff_ffff, 0xffff_ffff, 0x8000_0000, d.len() as u32][rng.below(7)];
                d[i..i + 4].copy_from_slice(&v.to_le_bytes());
            }
            1 if !d.is_empty() => edit::flip_bit(rng, &mut d),
            2 => edit::truncate(rng, &mut d),
            3 => edit::insert_random(rng, &mut d, 8),
            4 if !d.is_empty() => edit::set_byte(rng, &mut d, &EDGE_BYTES),
            _ => edit::remove_byte(rng, &mut d),
        }
    }
    d
}

#[test]
fn mutations_never_panic() {
    let files = corpus();
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    let (imported, _) = mutation_rounds(&names, 2000, "the importer", |i, _| mutate(&mut rng, &files[i].1), import);
    // The loop must reach the importer itself, not only the decoder's rejections.
    assert!(imported > 0, "no mutation imported");
}
