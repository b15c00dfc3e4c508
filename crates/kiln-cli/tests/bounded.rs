//! Bounded input dimensions (`--input-shape ids=1x1..128`; `kiln_ir::bounded`,
//! docs/bounded-shapes.md): a model compiled once, run at several extents up to the
//! bound, compared with ONNX Runtime running the model with that dimension free.
//!
//! The models and ONNX Runtime's outputs come from `scripts/ref_bounded.py`
//! (`$KILN_TEST_DATA/bounded/manifest.json`; a missing manifest is a failure):
//! bert_tiny with its sequence 1..128 at lengths 1, 7, 64 and 128, and an MLP with its
//! batch 1..8 (a soft-max per row and a mean over the batch) at 1, 3 and 8. One
//! instance runs every length in turn, on one thread and on three. Also: the typed
//! errors of an extent outside the range, of a wrong rank, and of ops that would read
//! the dimension in ways a static plan cannot (Shape of it; a Reshape merging it with
//! another axis), and `kiln compile` / `kiln run` / `kiln bench` on the command line.

mod common;

use common::{compare, data_dir, read_npy, s, scratch};
use kiln_ir::Tensor;
use serde_json::Value;

fn manifest() -> Value {
    common::test_manifest("bounded", "ref_bounded.py")
}

fn model(name: &str) -> Value {
    manifest()["models"].as_array().expect("models").iter().find(|m| m["name"] == name).expect("model").clone()
}

/// The import options of `--input-shape SPEC`.
fn options(spec: &str) -> kiln_import::ImportOptions {
    let (name, dims, ranges) = kiln_import::parse_input_shape_bounded(spec).expect("spec");
    kiln_import::ImportOptions {
        bounded_dims: ranges.iter().map(|&(axis, min)| (name.clone(), axis, min)).collect(),
        input_shapes: vec![(name, dims)],
        ..Default::default()
    }
}

fn compile(m: &Value) -> (kiln_compiler::Compiled, kiln_ir::Graph) {
    let path = data_dir().join(m["file"].as_str().expect("file"));
    let opts = options(m["input_shape"].as_str().expect("input_shape"));
    let g = kiln_import::onnx::import_file(&path, &opts).unwrap_or_else(|e| panic!("import: {e}"));
    let c = kiln_compiler::compile(&g, &kiln_compiler::Options::default()).unwrap_or_else(|e| panic!("compile: {e}"));
    (c, g)
}

/// One invocation at the feeds' extents; the outputs at the dims the runtime reports.
fn invoke(
    inst: &mut kiln_runtime::Instance<'_>,
    feeds: &[Tensor],
    outputs: &[kiln_module::program::TensorDesc],
) -> Result<Vec<Tensor>, kiln_runtime::RuntimeError> {
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = outputs.iter().map(|t| vec![0xA5u8; t.bytes as usize]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs)?;
    }
    Ok(outs
        .into_iter()
        .enumerate()
        .map(|(k, mut b)| {
            let dims: Vec<usize> = inst.output_dims(k).expect("dims").iter().map(|&d| d as usize).collect();
            let dtype = kiln_ir::DType::from_onnx_code(outputs[k].dtype as i64).expect("dtype");
            let ty = kiln_ir::TensorType::new(dtype, kiln_ir::Shape::new(dims).expect("shape"));
            b.truncate(ty.storage_bytes());
            Tensor::new(ty, b.into()).expect("tensor")
        })
        .collect())
}

fn check(name: &str) {
    let m = model(name);
    let (c, _) = compile(&m);
    let program =
        kiln_module::sections::read_program(&kiln_module::Module::parse(&c.artifact).expect("parse")).expect("program");
    let entry = &program.entries[0];
    assert_eq!(entry.bounded.len(), 1, "{name}: the artifact lists one bounded dimension");
    let format = kiln_module::Module::parse(&c.artifact).expect("parse").format();
    assert_eq!(format, kiln_module::format::BOUNDED_FORMAT_VERSION, "{name}: written as format 1.7");
    // The extent shortens the work (format 1.7): every listed dispatch is one of the
    // plan's, and at least one lists its rows along the dimension.
    assert!(!entry.bounded_rows.is_empty(), "{name}: no dispatch's workgroups shrink with the extent");
    for r in &entry.bounded_rows {
        assert!(
            matches!(entry.commands.get(r.command as usize), Some(kiln_module::program::Command::Dispatch { .. })),
            "{name}: {r:?}"
        );
    }
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let outputs = program.to_program().entries[0].outputs.clone();
    let mut cases: Vec<Value> = m["cases"].as_array().expect("cases").clone();
    // The largest first, so that a smaller one after it would see stale positions.
    cases.sort_by_key(|c| std::cmp::Reverse(c["extent"].as_u64()));
    for threads in [None, Some(3)] {
        let mut inst = match threads {
            None => kiln_runtime::Instance::new(&module).expect("instance"),
            Some(t) => kiln_runtime::Instance::with_threads(&module, t).expect("threaded instance"),
        };
        for case in &cases {
            let cn = case["name"].as_str().expect("case");
            let what = format!("{name}/{cn} on {threads:?} threads");
            let n_in = case["inputs"].as_u64().expect("inputs") as usize;
            let feeds: Vec<Tensor> = (0..n_in).map(|k| read_npy(&format!("bounded/{name}/{cn}.in_{k}.npy"))).collect();
            let got = invoke(&mut inst, &feeds, &outputs).unwrap_or_else(|e| panic!("{what}: {e}"));
            for (k, g) in got.iter().enumerate() {
                let want = read_npy(&format!("bounded/{name}/{cn}.out_{k}.npy"));
                compare(&format!("{what} output {k}"), g, &want);
            }
        }
    }
}

#[test]
fn bert_tiny_sequence_1_to_128_matches_onnx_runtime() {
    check("bert_tiny");
}

#[test]
fn mlp_batch_1_to_8_matches_onnx_runtime() {
    check("mlp_batch");
}

#[test]
fn extents_outside_the_range_and_wrong_shapes_are_typed_errors() {
    let m = model("mlp_batch");
    let (c, _) = compile(&m);
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let mut inst = kiln_runtime::Instance::new(&module).expect("instance");
    let mut probs = vec![0u8; 8 * 4 * 4];
    let mut mean = vec![0u8; 4 * 4];
    let mut run = |x: &[u8]| inst.invoke(&[x], &mut [&mut probs[..], &mut mean[..]]);
    let row = 16 * 4;
    match run(&vec![0u8; 9 * row]) {
        Err(kiln_runtime::RuntimeError::InputExtent { name, axis: 0, min: 1, bound: 8, got: 9 }) => {
            assert_eq!(name, "x")
        }
        other => panic!("batch 9 of 1..8: {other:?}"),
    }
    match run(&[]) {
        Err(kiln_runtime::RuntimeError::InputExtent { got: 0, .. }) => {}
        other => panic!("batch 0 of 1..8: {other:?}"),
    }
    match run(&vec![0u8; 3 * row + 4]) {
        Err(kiln_runtime::RuntimeError::InputSize { .. }) => {}
        other => panic!("a partial row: {other:?}"),
    }
    // Typed: the dims other than the bounded one must match, as the dtype.
    let data = vec![0u8; 3 * row];
    let wrong_rank = kiln_runtime::TensorRef { dtype: 1, dims: &[3, 4, 4], data: &data };
    let right = kiln_runtime::TensorRef { dtype: 1, dims: &[3, 16], data: &data };
    let mut outs = [
        kiln_runtime::TensorMut { dtype: 1, dims: &[8, 4], data: &mut probs[..] },
        kiln_runtime::TensorMut { dtype: 1, dims: &[1, 4], data: &mut mean[..] },
    ];
    match inst.invoke_tensors(0, &[wrong_rank], &mut outs) {
        Err(kiln_runtime::RuntimeError::InputShape { .. }) => {}
        other => panic!("rank 3 for rank 2: {other:?}"),
    }
    inst.invoke_tensors(0, &[right], &mut outs).expect("batch 3, typed");
    assert_eq!(inst.output_dims(0), Some(&[3u64, 4][..]));
    assert_eq!(inst.output_dims(1), Some(&[1u64, 4][..]));
}

#[test]
fn shape_of_a_bounded_dimension_is_refused_naming_the_node() {
    // bert_tiny written with its length free: the position table is sliced to
    // Shape(input_ids), which a plan sized at compile time cannot give.
    let m = model("bert_tiny");
    let path = data_dir().join(m["dynamic"].as_str().expect("dynamic"));
    let e = kiln_import::onnx::import_file(&path, &options("input_ids=1x1..128")).expect_err("Shape of a bounded dim");
    let text = e.to_string();
    assert!(text.contains("bounded.shape") && text.contains("Shape") && text.contains("bounded"), "{text}");
}

#[test]
fn a_reshape_merging_the_bounded_axis_is_refused_naming_the_node() {
    use kiln_import::onnx::proto::{NodeProto, TensorProto};
    let shape = TensorProto {
        name: Some("shape".into()),
        dims: vec![2],
        data_type: Some(7),
        int64_data: vec![16, 4],
        ..Default::default()
    };
    let node = NodeProto {
        name: Some("merge".into()),
        op_type: Some("Reshape".into()),
        input: vec!["x".into(), "shape".into()],
        output: vec!["y".into()],
        ..Default::default()
    };
    let bytes = common::onnx_model(
        vec![node],
        vec![common::value_info("x", &[Some(2), Some(8), Some(4)])],
        vec![common::value_info("y", &[Some(16), Some(4)])],
        vec![shape],
    );
    let g = kiln_import::onnx::import_bytes(bytes.into(), None, &options("x=2x1..8x4")).expect("import");
    let e = kiln_compiler::compile(&g, &kiln_compiler::Options::default()).expect_err("merging the bounded axis");
    let text = e.to_string();
    assert!(text.contains("merge") && text.contains("Reshape") && text.contains("bounded axis 1"), "{text}");
}

#[test]
fn static_compiles_stay_format_1_5() {
    let m = model("mlp_batch");
    let path = data_dir().join(m["file"].as_str().expect("file"));
    let g = kiln_import::onnx::import_file(&path, &kiln_import::ImportOptions::default()).expect("import");
    let c = kiln_compiler::compile(&g, &kiln_compiler::Options::default()).expect("compile");
    let format = kiln_module::Module::parse(&c.artifact).expect("parse").format();
    assert_eq!(format, kiln_module::format::STATIC_FORMAT_VERSION);
}

#[test]
fn cli_compile_run_and_bench_at_an_extent() {
    let m = model("bert_tiny");
    let dir = scratch("bounded", "cli");
    let art = dir.join("bert.kiln");
    let model = data_dir().join(m["file"].as_str().expect("file"));
    common::ok(&["compile", s(&model), "--input-shape", "input_ids=1x1..128", "-o", s(&art)]);
    let input = data_dir().join("bounded/bert_tiny/n7.in_0.npy");
    let out = dir.join("out");
    common::ok(&["run", s(&art), "--input", &format!("input_ids={}", s(&input)), "--output-dir", s(&out)]);
    let b = std::fs::read(out.join("output.npy")).expect("output.npy");
    let got = kiln_ir::npy::read(&b).expect("npy");
    compare("kiln run at length 7", &got, &read_npy("bounded/bert_tiny/n7.out_0.npy"));
    common::ok(&["bench", s(&art), "--extent", "input_ids=7", "--iterations", "2", "--warmup", "1"]);
    common::fails_with(
        &["bench", s(&art), "--extent", "input_ids=129", "--iterations", "1", "--warmup", "1"],
        &["input_ids", "129", "1..=128"],
    );
}

#[test]
fn kiln_eval_runs_the_reference_evaluator_at_an_extent() {
    // The reference evaluator runs what the plan runs (the masked graph at the bound,
    // the input zero-padded, the outputs cut), against ONNX Runtime's outputs.
    for (name, case, outputs) in [("mlp_batch", "n3", &["probs", "mean"][..]), ("bert_tiny", "n7", &["output"][..])] {
        let m = model(name);
        let dir = scratch("bounded", &format!("eval-{name}"));
        let path = data_dir().join(m["file"].as_str().expect("file"));
        let spec = m["input_shape"].as_str().expect("input_shape");
        let input_name = spec.split('=').next().expect("name");
        let input = data_dir().join(format!("bounded/{name}/{case}.in_0.npy"));
        common::ok(&[
            "eval",
            s(&path),
            "--input-shape",
            spec,
            "--input",
            &format!("{input_name}={}", s(&input)),
            "--output-dir",
            s(&dir),
        ]);
        for (k, o) in outputs.iter().enumerate() {
            let b = std::fs::read(dir.join(format!("{o}.npy"))).expect("output npy");
            let got = kiln_ir::npy::read(&b).expect("npy");
            compare(
                &format!("kiln eval {name}/{case} {o}"),
                &got,
                &read_npy(&format!("bounded/{name}/{case}.out_{k}.npy")),
            );
        }
    }
}
