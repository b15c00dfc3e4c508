//! kiln's TFLite front end on the synthetic TFLite models, against LiteRT.
//!
//! The models (`$KILN_TEST_DATA/tflite/synthetic/NAME.tflite`) come from
//! `scripts/gen_tflite.py`: nine architectures (an MLP, LeNet, a MobileNet-style block, a
//! transpose-conv decoder, a transformer encoder, a data-movement graph, every activation,
//! a single FULLY_CONNECTED, single CONV_2Ds) each as float32, float16 weights (FLOAT16
//! constants + DEQUANTIZE) and int8 (per-channel int8 weights, int32 biases, int8
//! activations; float interface), four of them also with an int8 interface. LiteRT's outputs for deterministic inputs come from
//! `scripts/tflite_reference.py` (builtin kernels, no delegate, one thread), listed in
//! `ref/tflite/manifest.json`; `scripts/setup-test-data` makes both. A missing manifest is
//! a failure, not a skip. `docs/tflite-testing.md` says how the models and references are made.
//!
//! Each model goes through the `kiln` binary (`kiln compile NAME.tflite -o NAME.kiln`, the
//! front end picked by the file's magic), then the artifact's bytes are loaded and run, and
//! every output is compared with LiteRT's:
//!
//! - float outputs of float models: |kiln − LiteRT| ≤ atol·max|LiteRT| + rtol·|LiteRT| per
//!   element, rtol 10⁻⁴ and atol 10⁻⁵ (the manifest's; `models.rs` uses the same for the
//!   ONNX models). LiteRT computes in f32; a float16-weight model's weights are exact f16
//!   values widened to f32, so the same bound holds.
//! - outputs of int8 models, int8 or float made by a DEQUANTIZE: in quantisation steps of
//!   the output (the manifest's `quant.scale`). No element may be more than one step from
//!   LiteRT's; the count one step away is printed per output (`TFLITE ...` lines). One step
//!   is what separates two correct implementations whose requantisation rounds a product
//!   that lies on a half step differently (float vs TFLite's fixed-point multiplier).
//!   Where one-step differences compound through a chain of requantising ops past one
//!   step, the output is listed in `data/tflite-int8.expected` with its worst distance in
//!   steps and why; the test then holds that output to exactly that distance (fewer steps
//!   is a change to record, more a regression), so the gap stays visible and cannot grow.
//!
//! `op_coverage` checks that the models, together, hold every op of the TFLite issue's op
//! list (`EXPECTED_OPS`) and the fused activations (`EXPECTED_FUSED`), and prints which
//! model exercises which op; a model's failure message names its ops too.

mod common;

use common::{data_dir, kiln, read_npy, s, scratch};
use kiln_ir::{DType, Shape, Tensor, TensorType};
use serde_json::Value;
use std::collections::BTreeSet;

/// The ops of the TFLite issue's list, each of which some synthetic model must hold.
const EXPECTED_OPS: &[&str] = &[
    "CONV_2D",
    "DEPTHWISE_CONV_2D",
    "TRANSPOSE_CONV",
    "FULLY_CONNECTED",
    "BATCH_MATMUL",
    "ADD",
    "SUB",
    "MUL",
    "DIV",
    "MAX_POOL_2D",
    "AVERAGE_POOL_2D",
    "MEAN",
    "SUM",
    "REDUCE_MAX",
    "RESHAPE",
    "SQUEEZE",
    "EXPAND_DIMS",
    "TRANSPOSE",
    "CONCATENATION",
    "SPLIT",
    "SPLIT_V",
    "PACK",
    "UNPACK",
    "PAD",
    "PADV2",
    "STRIDED_SLICE",
    "SLICE",
    "GATHER",
    "RESIZE_BILINEAR",
    "RESIZE_NEAREST_NEIGHBOR",
    "SOFTMAX",
    "LOGISTIC",
    "TANH",
    "RELU",
    "RELU6",
    "RELU_N1_TO_1",
    "LEAKY_RELU",
    "PRELU",
    "HARD_SWISH",
    "QUANTIZE",
    "DEQUANTIZE",
];

/// The fused activation functions some model's ops carry.
const EXPECTED_FUSED: &[&str] = &["RELU", "RELU6", "RELU_N1_TO_1"];

/// The entries of `ref/tflite/manifest.json`; a missing listing fails the test.
fn manifest() -> Vec<Value> {
    let path = data_dir().join("ref/tflite/manifest.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "cannot read {}: {e}; run scripts/setup-test-data (it writes the synthetic TFLite models with \
             scripts/gen_tflite.py and LiteRT's outputs with scripts/tflite_reference.py)",
            path.display()
        )
    });
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    v["models"].as_array().expect("a listing has a models list").clone()
}

fn entry(name: &str) -> Value {
    manifest()
        .into_iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("model `{name}` is not in ref/tflite/manifest.json"))
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|x| x.as_str().map(String::from)).collect()).unwrap_or_default()
}

/// The manifest's description of the input or output kiln calls `name` (its tensor name
/// or its SignatureDef name).
fn find<'a>(list: &'a [Value], name: &str) -> Option<&'a Value> {
    list.iter().find(|x| x["name"] == name || x["signature_name"] == name)
}

fn check_model(name: &str) {
    let e = entry(name);
    let ops = strs(&e["ops"]).join(" ");
    let model = data_dir().join(e["model"].as_str().expect("model path"));
    assert!(model.is_file(), "{name}: {} is missing; run scripts/setup-test-data", model.display());
    let dir = scratch("tflite", name);
    let art = dir.join(format!("{name}.kiln"));
    let (ok, _, err) = kiln(&["compile", s(&model), "-o", s(&art)]);
    // Read as ONNX: this kiln has no TFLite front end (picked by the `TFL3` file magic).
    let hint = if err.contains("ONNX") { " (kiln took the file for ONNX: no TFLite front end)" } else { "" };
    assert!(ok, "{name}: `kiln compile {}` failed{hint} (the model holds {ops}): {}", model.display(), err.trim());
    let bytes = std::fs::read(&art).expect("read the artifact back");
    let _ = std::fs::remove_dir_all(&dir);
    let module = kiln_runtime::Module::load(&bytes, None)
        .unwrap_or_else(|err| panic!("{name}: loading the artifact failed: {err}"));
    let sig = module.signature();
    let main = sig.default_entry().unwrap_or_else(|| panic!("{name}: the artifact has no entry point"));
    let inputs = e["inputs"].as_array().expect("inputs").clone();
    let expected = e["outputs"].as_array().expect("outputs").clone();
    assert_eq!(main.inputs.len(), inputs.len(), "{name}: kiln's input count against the model's");
    assert_eq!(main.outputs.len(), expected.len(), "{name}: kiln's output count against the model's");

    // Inputs in kiln's order, matched by name.
    let mut feeds = Vec::new();
    for t in main.inputs {
        let want = find(&inputs, t.name).unwrap_or_else(|| {
            panic!("{name}: kiln's input `{}` is none of the model's inputs {:?}", t.name, names(&inputs))
        });
        let x = read_npy(want["file"].as_str().expect("file"));
        let dtype = DType::from_onnx_code(t.dtype.into());
        assert_eq!(dtype, Some(x.dtype()), "{name}: input `{}`: kiln's element type against LiteRT's", t.name);
        let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        assert_eq!(dims, x.shape().dims(), "{name}: input `{}`: kiln's shape against LiteRT's", t.name);
        feeds.push(x);
    }
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = main.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    let mut instance = kiln_runtime::Instance::new(&module).unwrap_or_else(|err| panic!("{name}: instantiate: {err}"));
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        instance.invoke(&ins, &mut refs).unwrap_or_else(|err| panic!("{name}: invoke failed: {err}"));
    }

    for (t, bytes) in main.outputs.iter().zip(outs) {
        let want_e = find(&expected, t.name).unwrap_or_else(|| {
            panic!("{name}: kiln's output `{}` is none of the model's outputs {:?}", t.name, names(&expected))
        });
        let want = read_npy(want_e["file"].as_str().expect("file"));
        let dtype = DType::from_onnx_code(t.dtype.into())
            .unwrap_or_else(|| panic!("{name}: output `{}` has an unknown element type code {}", t.name, t.dtype));
        assert_eq!(dtype, want.dtype(), "{name}: output `{}`: kiln's element type against LiteRT's", t.name);
        let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
        assert_eq!(dims, want.shape().dims(), "{name}: output `{}`: kiln's shape against LiteRT's", t.name);
        let shape = Shape::new(dims).expect("shape");
        let got = Tensor::new(TensorType::new(dtype, shape), bytes.into()).expect("output tensor");
        let what = format!("{name}/{}", t.name);
        match want_e["quant"]["scale"].as_f64() {
            Some(scale) => {
                let spread = &want_e["litert_spread"];
                let spread = format!(
                    "LiteRT's XNNPACK is {} steps from this reference at most, its reference kernels {}",
                    spread["xnnpack"], spread["reference_kernels"]
                );
                compare_steps(&what, &got, &want, scale, &spread, recorded_gap(&what))
            }
            None => {
                compare_float(&what, &got, &want, e["rtol"].as_f64().expect("rtol"), e["atol"].as_f64().expect("atol"))
            }
        }
    }
}

fn names(list: &[Value]) -> Vec<String> {
    list.iter().map(|x| x["name"].as_str().unwrap_or("?").to_string()).collect()
}

/// Float outputs: models.rs's bound, |got − want| ≤ atol·max|want| + rtol·|want|.
fn compare_float(what: &str, got: &Tensor, want: &Tensor, rtol: f64, atol: f64) {
    let excess = common::assert_close(what, got, want, rtol, atol, "LiteRT");
    eprintln!("TFLITE {what}: float, worst element {excess:.3}x the tolerance");
}

/// The worst distance in steps recorded for output `what` (`model/output`) in
/// `data/tflite-int8.expected` (lines `model/output steps — why`), if listed.
fn recorded_gap(what: &str) -> Option<u32> {
    include_str!("data/tflite-int8.expected").lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some(what)).then(|| w.next().and_then(|n| n.parse().ok()).expect("a step count after the name"))
    })
}

/// Quantised outputs, in steps of `scale` (an int8 output's values are steps already;
/// a dequantised float output's differ by multiples of its scale): none more than one
/// step from LiteRT, or, for an output with a `recorded` gap, the worst exactly that many
/// steps; the counts one step and more away printed, with `spread` (how far LiteRT's own
/// kernel sets are from each other on the output).
fn compare_steps(what: &str, got: &Tensor, want: &Tensor, scale: f64, spread: &str, recorded: Option<u32>) {
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let unit = if want.dtype().is_float() { scale } else { 1.0 };
    let (mut off_by_one, mut more) = (0usize, 0usize);
    let mut worst = (0usize, 0.0f64);
    for i in 0..a.len() {
        // A dequantised value is (q − zero point)·scale in f32: a few ulps off a multiple.
        let steps = ((a[i] - b[i]) / unit).abs();
        let steps = if steps.is_nan() { f64::INFINITY } else { steps };
        if steps > 1.5 {
            more += 1;
        } else if steps > 0.5 {
            off_by_one += 1;
        }
        if steps > worst.1 {
            worst = (i, steps);
        }
    }
    let (i, steps) = worst;
    eprintln!(
        "TFLITE {what}: int8, {off_by_one} of {} elements one step from LiteRT, {more} more (step {scale:.4e}), worst {steps:.2} steps; {spread}",
        a.len()
    );
    if let Some(n) = recorded {
        assert!(
            n > 1 && (steps - f64::from(n)).abs() <= 1e-3,
            "{what}: the worst element is {steps:.2} steps from LiteRT, data/tflite-int8.expected records {n}: \
             update the list (and its reason) if kiln moved closer, find the regression if it moved away ({spread})"
        );
        return;
    }
    assert!(
        steps <= 1.0 + 1e-3,
        "{what}: element {i} is {}, LiteRT gives {} ({steps:.2} steps of {scale:.4e} apart; the bound is one step; \
         {more} of {} elements more than one step away; {spread})",
        a[i],
        b[i],
        a.len()
    );
}

common::model_tests! { check_model, manifest_lists_every_model, common::entry_names(&manifest());
    mlp_f32 => "mlp_f32",
    mlp_f16 => "mlp_f16",
    mlp_int8 => "mlp_int8",
    lenet_f32 => "lenet_f32",
    lenet_f16 => "lenet_f16",
    lenet_int8 => "lenet_int8",
    lenet_int8io => "lenet_int8io",
    mobilenet_block_f32 => "mobilenet_block_f32",
    mobilenet_block_f16 => "mobilenet_block_f16",
    mobilenet_block_int8 => "mobilenet_block_int8",
    mobilenet_block_int8io => "mobilenet_block_int8io",
    decoder_f32 => "decoder_f32",
    decoder_f16 => "decoder_f16",
    decoder_int8 => "decoder_int8",
    encoder_f32 => "encoder_f32",
    encoder_f16 => "encoder_f16",
    encoder_int8 => "encoder_int8",
    shapes_f32 => "shapes_f32",
    shapes_f16 => "shapes_f16",
    shapes_int8 => "shapes_int8",
    activations_f32 => "activations_f32",
    activations_f16 => "activations_f16",
    activations_int8 => "activations_int8",
    fc_f32 => "fc_f32",
    fc_f16 => "fc_f16",
    fc_int8 => "fc_int8",
    fc_int8io => "fc_int8io",
    conv1_f32 => "conv1_f32",
    conv1_f16 => "conv1_f16",
    conv1_int8 => "conv1_int8",
    conv1_int8io => "conv1_int8io",
}

/// The int8 models through the reference evaluator instead of the compiled artifact:
/// imported, the tensor passes run (so the contractions are the integer ops the compiled
/// path runs), evaluated by kiln-ref, each output held to the same bound as the compiled
/// one (one step, or its recorded gap). The LiteRT forms of MEAN, RESIZE_BILINEAR and
/// BATCH_MATMUL are graph operations the importer writes, so the reference evaluator
/// computes them independently of code generation; the counts are printed as
/// `TFLITE NAME/OUT (reference evaluator): ...`.
#[test]
fn int8_models_through_the_reference_evaluator() {
    let models: Vec<Value> = manifest().into_iter().filter(|e| e["kind"] == "int8").collect();
    assert!(!models.is_empty(), "the manifest lists no int8 model");
    for e in models {
        let name = e["name"].as_str().expect("name");
        let model = data_dir().join(e["model"].as_str().expect("model path"));
        let mut g = kiln_import::import_file(&model, &kiln_import::ImportOptions::default())
            .unwrap_or_else(|err| panic!("{name}: import: {err}"));
        kiln_opt::run_tensor_pipeline(&mut g).unwrap_or_else(|err| panic!("{name}: tensor passes: {err}"));
        let inputs = e["inputs"].as_array().expect("inputs").clone();
        let expected = e["outputs"].as_array().expect("outputs").clone();
        let feeds: Vec<Tensor> = g
            .inputs
            .iter()
            .map(|&v| {
                let n = &g.values[v].name;
                let want = find(&inputs, n).unwrap_or_else(|| panic!("{name}: input `{n}` is none of the model's"));
                read_npy(want["file"].as_str().expect("file"))
            })
            .collect();
        let outs = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|err| panic!("{name}: evaluation: {err}"));
        for (&v, got) in g.outputs.iter().zip(&outs) {
            let n = &g.values[v].name;
            let want_e = find(&expected, n).unwrap_or_else(|| panic!("{name}: output `{n}` is none of the model's"));
            let want = read_npy(want_e["file"].as_str().expect("file"));
            let what = format!("{name}/{n}");
            let scale = want_e["quant"]["scale"].as_f64().unwrap_or_else(|| panic!("{what}: no quantisation"));
            compare_steps(&format!("{what} (reference evaluator)"), got, &want, scale, "", recorded_gap(&what));
        }
    }
}

/// Together the models hold every op of the list and every fused activation;
/// prints which model exercises which op.
#[test]
fn op_coverage() {
    let models = manifest();
    let mut ops = BTreeSet::new();
    let mut fused = BTreeSet::new();
    for e in &models {
        let (o, f) = (strs(&e["ops"]), strs(&e["fused"]));
        eprintln!("TFLITE {}: {} (fused: {})", e["name"].as_str().unwrap_or("?"), o.join(" "), f.join(" "));
        ops.extend(o);
        fused.extend(f);
    }
    for op in EXPECTED_OPS {
        let by: Vec<&str> = models
            .iter()
            .filter(|e| strs(&e["ops"]).iter().any(|o| o == op))
            .filter_map(|e| e["name"].as_str())
            .collect();
        eprintln!("TFLITE coverage {op}: {}", by.join(" "));
    }
    let missing: Vec<&&str> = EXPECTED_OPS.iter().filter(|op| !ops.contains(**op)).collect();
    assert!(missing.is_empty(), "no synthetic TFLite model holds {missing:?}");
    let missing: Vec<&&str> = EXPECTED_FUSED.iter().filter(|f| !fused.contains(**f)).collect();
    assert!(missing.is_empty(), "no synthetic TFLite model fuses {missing:?}");
    // Every variant of every architecture: float32, float16 weights, int8.
    for v in ["f32", "f16", "int8", "int8io"] {
        assert!(models.iter().any(|e| e["variant"] == v), "no model of variant {v}");
    }
}

/// The comparisons themselves: one step passes and is counted, two steps fail, for int8
/// and for dequantised float outputs; the float bound fails just past its tolerance.
#[test]
fn comparisons_catch_errors() {
    let t = |dtype: DType, v: Vec<u8>, n: usize| {
        Tensor::new(TensorType::new(dtype, Shape::new(vec![n]).expect("shape")), v.into()).expect("tensor")
    };
    let i8s = |v: &[i8]| t(DType::I8, v.iter().map(|&x| x as u8).collect(), v.len());
    let f32s = |v: &[f32]| t(DType::F32, v.iter().flat_map(|x| x.to_le_bytes()).collect(), v.len());
    let fails = |f: &dyn Fn()| std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err();
    compare_steps("self/int8", &i8s(&[3, -4, 7]), &i8s(&[3, -5, 7]), 0.1, "self-test", None);
    assert!(fails(&|| compare_steps("self/int8", &i8s(&[3, -3, 7]), &i8s(&[3, -5, 7]), 0.1, "self-test", None)));
    // A recorded gap holds exactly: two steps pass where two are recorded, one and three fail.
    compare_steps("self/int8", &i8s(&[3, -3, 7]), &i8s(&[3, -5, 7]), 0.1, "self-test", Some(2));
    assert!(fails(&|| compare_steps("self/int8", &i8s(&[3, -4, 7]), &i8s(&[3, -5, 7]), 0.1, "self-test", Some(2))));
    assert!(fails(&|| compare_steps("self/int8", &i8s(&[3, -2, 7]), &i8s(&[3, -5, 7]), 0.1, "self-test", Some(2))));
    let s = 0.0375f32;
    compare_steps(
        "self/dequantised",
        &f32s(&[4.0 * s, -2.0 * s]),
        &f32s(&[5.0 * s, -2.0 * s]),
        s as f64,
        "self-test",
        None,
    );
    assert!(fails(&|| compare_steps(
        "self/dequantised",
        &f32s(&[3.0 * s]),
        &f32s(&[5.0 * s]),
        s as f64,
        "self-test",
        None
    )));
    compare_float("self/float", &f32s(&[1.0, 2.0]), &f32s(&[1.0001, 2.0]), 1e-4, 1e-5);
    assert!(fails(&|| compare_float("self/float", &f32s(&[1.0, 2.0]), &f32s(&[1.0004, 2.0]), 1e-4, 1e-5)));
}
