//! Opset 23's Attention and RotaryEmbedding in small models, through the reference
//! evaluator and the compiled artifact, against ONNX Runtime: a decoder layer
//! (RMSNormalization, rotary Q and K through run-time `position_ids`, causal
//! grouped-query attention on 3-D operands), a cached decoding step (4-D, interleaved
//! partial rotation, past keys and values, a float mask, the present keys and values as
//! outputs) and a masked, scaled, softcapped attention that also returns its
//! probabilities. Tolerance: `common::compare`'s |got − want| ≤ 1e-5·max|want| +
//! 1e-4·|want| per element.
//!
//! The models and outputs come from `scripts/ref_transformer_ops.py`
//! (`$KILN_TEST_DATA/transformer/manifest.json`; a missing manifest is a failure). The
//! layer's attention must compile to one attention dispatch (the score matrix never in
//! memory); the softcapped one cannot (its `tanh` is not of the form) and must not.

mod common;

use common::{case_tensors, compare_outputs, data_dir, run_module};
use kiln_flow::class::KernelClass;

#[test]
fn transformer_ops_match_onnx_runtime() {
    let manifest = common::test_manifest("transformer", "ref_transformer_ops.py");
    let models = manifest["models"].as_array().expect("models");
    assert_eq!(models.len(), 3, "models in the manifest");
    for m in models {
        let name = m["name"].as_str().expect("name");
        let path = data_dir().join(m["file"].as_str().expect("file"));
        let g = kiln_import::onnx::import_file(&path, &Default::default())
            .unwrap_or_else(|e| panic!("{name}: import: {e}"));
        assert!(
            g.nodes.iter().any(|(_, n)| n.op.kind == kiln_ir::OpKind::Attention),
            "{name}: Attention should be imported as itself"
        );
        let (feeds, want) = (case_tensors(m, "inputs"), case_tensors(m, "outputs"));
        assert_eq!(want.len(), g.outputs.len(), "{name}: output count");
        let refs = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{name}: reference: {e}"));
        compare_outputs(name, "reference", &refs, &want);
        let c = kiln_compiler::compile(&g, &Default::default()).unwrap_or_else(|e| panic!("{name}: compile: {e}"));
        let fused = c.flow.dispatches.iter().filter(|d| d.class == KernelClass::Attention).count();
        let expect = usize::from(name != "masked_softcap");
        assert_eq!(fused, expect, "{name}: attention dispatches in\n{}", c.flow);
        let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
        let got = run_module(&module, None, &g, &feeds);
        compare_outputs(name, "compiled", &got, &want);
    }
}
