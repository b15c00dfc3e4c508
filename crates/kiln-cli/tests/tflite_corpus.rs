//! The real TFLite models of the corpus (corpus/models.json, `format: tflite`), and the
//! small models of `fuzz/corpus/import_tflite` that LiteRT runs (int8, TRANSPOSE_CONV,
//! resizes, RFFT2D with a signature), through the whole pipeline: import (picked by the file's magic), compile, write the
//! artifact's bytes, load them, run, and compare with LiteRT's outputs
//! (`scripts/tflite_corpus_reference.py`, one thread, under
//! `$KILN_TEST_DATA/ref/tflite-corpus`). A missing listing or model is a failure.
//!
//! Tolerance: |kiln − LiteRT| ≤ atol·max|LiteRT| + rtol·|LiteRT| per element (the rule
//! of `models.rs`), rtol 10⁻⁴ and atol 10⁻⁵ ([`tolerance`]).
//! Integer (int8) outputs may differ by one quantisation step: kiln requantises in
//! float (`acc · s_x·s_w / s_y`, rounded), LiteRT with its fixed-point multiplier.
//! Outputs are matched by position: the importer orders a signature's outputs as the
//! subgraph lists them, which is the interpreter's order.

mod common;

use common::{data_dir, read_npy};
use kiln_ir::Tensor;
use serde_json::Value;

fn listing() -> Vec<Value> {
    let path = data_dir().join("ref/tflite-corpus/manifest.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!("cannot read {}: {e}; run scripts/test (scripts/tflite_corpus_reference.py makes it)", path.display())
    });
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    v["models"].as_array().expect("models").clone()
}

/// (rtol, atol) per model. Every model holds the default today, the two whose
/// spectrogram front end runs RFFT2D as a product with a cosine/sine basis (where
/// LiteRT runs an FFT) included: measured 2.6·10⁻⁶ of max|LiteRT| (birdnet-v2.4-fp32).
fn tolerance(_name: &str) -> (f64, f64) {
    (1e-4, 1e-5)
}

fn check(name: &str) {
    let e =
        listing().into_iter().find(|e| e["name"] == name).unwrap_or_else(|| panic!("`{name}` is not in the listing"));
    assert!(e.get("error").is_none(), "{name}: LiteRT could not run it: {}", e["error"]);
    let model = match e["repo_model"].as_str() {
        Some(rel) => std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel),
        None => data_dir().join(e["model"].as_str().expect("model")),
    };
    assert_eq!(kiln_import::format_of(&model), kiln_import::Format::Tflite, "{name}: detected format");
    let g = kiln_import::import_file(&model, &Default::default()).unwrap_or_else(|err| panic!("{name}: import: {err}"));
    let feeds: Vec<Tensor> = e["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|i| read_npy(&format!("ref/{}", i["file"].as_str().expect("file"))))
        .collect();
    assert_eq!(feeds.len(), g.inputs.len(), "{name}: input count");
    for (f, &v) in feeds.iter().zip(&g.inputs) {
        assert_eq!(f.ty(), g.ty(v), "{name}: input `{}`", g.values[v].name);
    }
    let c = kiln_compiler::compile(&g, &kiln_compiler::Options { source: name.to_string(), ..Default::default() })
        .unwrap_or_else(|err| panic!("{name}: compile: {err}"));
    let bytes = common::through_file("kiln-tflite-corpus", name, &c.artifact);
    let module =
        kiln_runtime::Module::load(&bytes, c.weights.as_deref()).unwrap_or_else(|err| panic!("{name}: load: {err}"));
    let mut instance = kiln_runtime::Instance::new(&module).unwrap_or_else(|err| panic!("{name}: instantiate: {err}"));
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        instance.invoke(&ins, &mut refs).unwrap_or_else(|err| panic!("{name}: invoke: {err}"));
    }
    let expected = e["outputs"].as_array().expect("outputs");
    assert_eq!(expected.len(), g.outputs.len(), "{name}: output count");
    let (rtol, atol) = tolerance(name);
    for ((bytes, want), &v) in outs.into_iter().zip(expected).zip(&g.outputs) {
        let got = Tensor::new(g.values[v].ty.clone(), bytes.into()).expect("output tensor");
        let want_t = read_npy(&format!("ref/{}", want["file"].as_str().expect("file")));
        assert_eq!(got.ty(), want_t.ty(), "{name}: output `{}` type", g.values[v].name);
        if !want_t.dtype().is_float() {
            let (a, b) = (got.to_f64_vec(), want_t.to_f64_vec());
            let steps = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f64, f64::max);
            let off = a.iter().zip(&b).filter(|(x, y)| x != y).count();
            eprintln!(
                "TFLITE {name}/{}: {off} of {} elements one step off LiteRT",
                want["name"].as_str().unwrap_or("?"),
                a.len()
            );
            assert!(steps <= 1.0, "{name}: an integer output is {steps} steps off LiteRT");
            continue;
        }
        let common::Gap { excess, at, max_abs: abs, scale } =
            common::gap(&got.to_f64_vec(), &want_t.to_f64_vec(), rtol, atol, false);
        let rel = abs / scale.max(f64::MIN_POSITIVE);
        eprintln!(
            "TFLITE {name}/{}: max |diff| {abs:.3e}, relative to max|LiteRT| {rel:.3e}; {} dispatches",
            want["name"].as_str().unwrap_or("?"),
            c.flow.dispatches.len()
        );
        assert!(
            excess <= 1.0,
            "{name}/{}: element {at}: |diff| is {excess:.2}x the tolerance (rtol {rtol}, atol {atol})",
            want["name"].as_str().unwrap_or("?")
        );
    }
}

common::model_tests! { check, listing_holds_every_model, common::entry_names(&listing());
    basic_pitch => "basic-pitch-nmp-tflite",
    birdnet_metadata_fp16 => "birdnet-v2.4-metadata-fp16",
    birdnet_fp32 => "birdnet-v2.4-fp32",
    star_trek_kws => "star-trek-activation-kws",
    efficientword_base => "efficientword-siamese-base",
    seed_decoder => "seed-decoder",
    seed_int8_net => "seed-int8_net",
    seed_rfft_signature => "seed-rfft_signature",
}

/// `kiln compile` picks the TFLite front end by the file identifier, whatever the
/// file's name, and `kiln run` runs the model compiled in memory.
#[test]
fn cli_picks_the_front_end_by_magic() {
    let e = listing().into_iter().find(|e| e["name"] == "basic-pitch-nmp-tflite").expect("basic-pitch in the listing");
    let model = data_dir().join(e["model"].as_str().expect("model"));
    let dir = common::scratch("tflite-corpus", "magic");
    let renamed = dir.join("nmp.model");
    std::fs::copy(&model, &renamed).expect("copy the model");
    let out = dir.join("nmp.kiln");
    let (ok, _, err) = common::kiln(&["compile", common::s(&renamed), "-o", common::s(&out)]);
    assert!(ok, "kiln compile of a TFLite file without its extension: {err}");
    assert!(std::fs::metadata(&out).expect("artifact").len() > 0);
}
