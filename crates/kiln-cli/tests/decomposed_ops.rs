//! The ops kiln imports as compositions of canonical ops (`kiln_import::onnx`'s
//! `decompose`: DFT, STFT, MelWeightMatrix, MaxUnpool, training-mode
//! BatchNormalization, Adagrad/Adam/Momentum, Binarizer, ArrayFeatureExtractor,
//! TreeEnsemble, TfIdfVectorizer, com.microsoft's DynamicQuantizeLSTM) on
//! odd shapes the ONNX node suite does not cover (odd signal lengths, padded and
//! truncated `dft_length`, complex and inverse transforms, a run-time window, 3-D
//! unpooling into a larger `output_shape`, several tensors per optimiser node, a
//! positive step count, tree ensembles with every comparison mode, NaN tracking and
//! the AVERAGE/MIN/MAX aggregates, n-grams up to 3 with skips under each weighting), through the reference evaluator and the compiled artifact,
//! against ONNX Runtime (or ONNX's reference evaluator where ONNX Runtime lacks the op;
//! the manifest names the source).
//!
//! The models and outputs come from `scripts/ref_decomposed_ops.py`
//! (`$KILN_TEST_DATA/decomposed/manifest.json`; a missing manifest is a failure).
//! Float operands are run-time inputs; integer operands are constants in the model.

mod common;

use common::{case_tensors, compare_outputs, data_dir, run_module};
use kiln_flow::class::KernelClass;

#[test]
fn decomposed_ops_match_onnx_runtime() {
    let manifest = common::test_manifest("decomposed", "ref_decomposed_ops.py");
    let models = manifest["models"].as_array().expect("models");
    assert!(models.len() >= 23, "{} models in the manifest", models.len());
    for m in models {
        let name = m["name"].as_str().expect("name");
        let path = data_dir().join(m["file"].as_str().expect("file"));
        let g = kiln_import::onnx::import_file(&path, &Default::default())
            .unwrap_or_else(|e| panic!("{name}: import: {e}"));
        let (feeds, want) = (case_tensors(m, "inputs"), case_tensors(m, "outputs"));
        assert_eq!(want.len(), g.outputs.len(), "{name}: output count");
        let refs = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        compare_outputs(name, "reference", &refs, &want);
        let c = kiln_compiler::compile(&g, &Default::default()).unwrap_or_else(|e| panic!("{name}: compile: {e}"));
        // A transform of run-time data is a product with the constant basis.
        if name.starts_with("dft") || name.starts_with("stft") {
            assert!(
                c.flow.dispatches.iter().any(|d| d.class == KernelClass::Contraction),
                "{name}: no contraction in the plan:\n{}",
                c.flow
            );
        }
        let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
        let got = run_module(&module, None, &g, &feeds);
        compare_outputs(name, &format!("compiled, expected from {}", m["source"]), &got, &want);
    }
}
