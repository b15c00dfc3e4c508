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

use common::{data_dir, read_npy, compare};
use kiln_flow::class::KernelClass;
use kiln_ir::Tensor;
use serde_json::Value;


fn run_compiled(c: &kiln_compiler::Compiled, g: &kiln_ir::Graph, feeds: &[Tensor]) -> Vec<Tensor> {
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let mut inst = kiln_runtime::Instance::new(&module).expect("instance");
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs).expect("invoke");
    }
    outs.into_iter().zip(&g.outputs).map(|(b, &v)| Tensor::new(g.values[v].ty.clone(), b.into()).expect("tensor")).collect()
}

#[test]
fn decomposed_ops_match_onnx_runtime() {
    let p = data_dir().join("decomposed/manifest.json");
    let text = std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e} (run scripts/ref_decomposed_ops.py --cache $KILN_TEST_DATA)", p.display()));
    let manifest: Value = serde_json::from_str(&text).expect("manifest json");
    let models = manifest["models"].as_array().expect("models");
    assert!(models.len() >= 23, "{} models in the manifest", models.len());
    for m in models {
        let name = m["name"].as_str().expect("name");
        let path = data_dir().join(m["file"].as_str().expect("file"));
        let g = kiln_import::onnx::import_file(&path, &Default::default()).unwrap_or_else(|e| panic!("{name}: import: {e}"));
        let feeds: Vec<Tensor> =
            m["inputs"].as_array().expect("inputs").iter().map(|f| read_npy(f.as_str().expect("file"))).collect();
        let want: Vec<Tensor> =
            m["outputs"].as_array().expect("outputs").iter().map(|f| read_npy(f.as_str().expect("file"))).collect();
        assert_eq!(want.len(), g.outputs.len(), "{name}: output count");
        let refs = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        for (k, (r, w)) in refs.iter().zip(&want).enumerate() {
            compare(&format!("{name} output {k} (reference)"), r, w);
        }
        let c = kiln_compiler::compile(&g, &Default::default()).unwrap_or_else(|e| panic!("{name}: compile: {e}"));
        // A transform of run-time data is a product with the constant basis.
        if name.starts_with("dft") || name.starts_with("stft") {
            assert!(
                c.flow.dispatches.iter().any(|d| d.class == KernelClass::Contraction),
                "{name}: no contraction in the plan:\n{}",
                c.flow
            );
        }
        let got = run_compiled(&c, &g, &feeds);
        for (k, (r, w)) in got.iter().zip(&want).enumerate() {
            compare(&format!("{name} output {k} (compiled, expected from {})", m["source"]), r, w);
        }
    }
}
