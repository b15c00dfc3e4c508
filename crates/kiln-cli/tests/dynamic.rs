//! Data-dependent output sizes (NonZero, Compress, NonMaxSuppression, TopK with a
//! run-time K; `kiln_ir::dynamic`) through the whole pipeline, compared with ONNX
//! Runtime and the reference evaluator.
//!
//! The models and ONNX Runtime's outputs come from `scripts/ref_dynamic.py`
//! (`$KILN_TEST_DATA/dynamic/manifest.json`; a missing manifest is a failure): an
//! SSD-style detector ending in NonMaxSuppression and a Gather of the selected boxes,
//! compiled with `--max-dim selected=12`, on inputs selecting 0, 1, several and exactly
//! 12 boxes, and one needing 14 (a typed run-time error, not a truncation); NonZero,
//! Compress, TopK and Unique (all four results, with and without an axis, sorted and
//! not) on odd shapes with ops after them, at empty, partial and full extents. Each case runs on the local-sync driver and on the local-task driver with
//! 3 threads; the runtime reports the actual shape and compacts the outputs.

mod common;

use common::{compare, data_dir, read_npy};
use kiln_ir::Tensor;
use serde_json::Value;

fn manifest() -> Value {
    common::test_manifest("dynamic", "ref_dynamic.py")
}

/// Runs the module; the outputs at the shapes the runtime reports.
fn run(
    module: &kiln_runtime::LoadedModule<'_>,
    threads: Option<usize>,
    feeds: &[Tensor],
    g: &kiln_ir::Graph,
) -> Result<Vec<Tensor>, kiln_runtime::RuntimeError> {
    let mut inst = common::instance(module, threads);
    let outs = common::invoke(&mut inst, g, feeds)?;
    Ok(outs
        .into_iter()
        .enumerate()
        .map(|(k, mut b)| {
            let dims: Vec<usize> = inst.output_dims(k).expect("dims").iter().map(|&d| d as usize).collect();
            let ty =
                kiln_ir::TensorType::new(g.values[g.outputs[k]].ty.dtype, kiln_ir::Shape::new(dims).expect("shape"));
            b.truncate(ty.storage_bytes());
            Tensor::new(ty, b.into()).expect("tensor")
        })
        .collect())
}

fn check(name: &str) {
    let man = manifest();
    let m = man["models"].as_array().expect("models").iter().find(|m| m["name"] == name).expect("model").clone();
    let mut opts = kiln_import::ImportOptions::default();
    for (k, v) in m["max_dims"].as_object().expect("max_dims") {
        opts.max_dims.push((k.clone(), v.as_u64().expect("bound") as usize));
    }
    let path = data_dir().join(m["file"].as_str().expect("file"));
    let g = kiln_import::onnx::import_file(&path, &opts).unwrap_or_else(|e| panic!("{name}: import: {e}"));
    let c = kiln_compiler::compile(&g, &kiln_compiler::Options::default())
        .unwrap_or_else(|e| panic!("{name}: compile: {e}"));
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    // The plan carries the extents: the artifact lists them, and the arena is planned once.
    let program =
        kiln_module::sections::read_program(&kiln_module::Module::parse(&c.artifact).expect("parse")).expect("program");
    assert!(!program.entries[0].extents.is_empty(), "{name}: the artifact lists no extent");
    for case in m["cases"].as_array().expect("cases") {
        let cn = case["name"].as_str().expect("case name");
        let what = format!("{name}/{cn}");
        let n_in = case["inputs"].as_u64().expect("inputs") as usize;
        let feeds: Vec<Tensor> = (0..n_in).map(|k| read_npy(&format!("dynamic/{name}/{cn}.in_{k}.npy"))).collect();
        for threads in [None, Some(3)] {
            let got = run(&module, threads, &feeds, &g);
            if case["error"] == "bound" {
                match got {
                    Err(kiln_runtime::RuntimeError::ExtentOutOfBound { extent, bound, .. }) => {
                        assert!(extent > bound as i64, "{what}: extent {extent} within its bound {bound}")
                    }
                    other => {
                        panic!("{what}: the data needs more than the bound: expected a typed error, got {other:?}")
                    }
                }
                continue;
            }
            let got = got.unwrap_or_else(|e| panic!("{what}: invoke: {e}"));
            let n_out = case["outputs"].as_u64().expect("outputs") as usize;
            assert_eq!(got.len(), n_out, "{what}: output count");
            for (k, t) in got.iter().enumerate() {
                let want = read_npy(&format!("dynamic/{name}/{cn}.out_{k}.npy"));
                compare(&format!("{what} output {k} ({threads:?} threads)"), t, &want);
            }
        }
        // The reference evaluator agrees (an independent implementation).
        if case["error"] != "bound" {
            let r = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
            for (k, t) in r.iter().enumerate() {
                let want = read_npy(&format!("dynamic/{name}/{cn}.out_{k}.npy"));
                compare(&format!("{what} reference output {k}"), t, &want);
            }
        } else {
            assert!(
                kiln_ref::eval_graph(&g, &feeds).is_err(),
                "{what}: the reference accepts an extent above its bound"
            );
        }
    }
}

#[test]
fn nms_detector_matches_onnx_runtime_at_0_1_several_and_the_bound() {
    check("detector");
}

#[test]
fn nonzero_on_an_odd_shape() {
    check("nonzero_odd");
}

#[test]
fn compress_along_a_middle_axis() {
    check("compress_odd");
}

#[test]
fn topk_with_a_run_time_k() {
    check("topk_runtime_k");
}

#[test]
fn unique_with_and_without_axis_sorted_and_not() {
    check("unique_axis");
}

#[test]
fn reductions_along_the_data_dependent_axis_read_the_extent() {
    check("reduce_along");
}

#[test]
fn an_op_mixing_along_the_data_dependent_axis_is_refused_naming_it() {
    use kiln_ir::infer::{infer, InferInput};
    use kiln_ir::{DType, Graph, Op, OpKind, Shape, TensorType};
    let mut g = Graph::new("g");
    let x = g.add_input("x", TensorType::new(DType::F32, Shape::new(vec![4, 3]).expect("shape")));
    let op = Op::new(OpKind::NonZero);
    let tys = infer(&op, &[Some(InferInput { ty: g.ty(x), value: None })], 2).expect("infer NonZero");
    let (_, nz) =
        g.add_node("nz", op, vec![Some(x)], vec![("nz".into(), tys[0].clone()), ("nz.extent".into(), tys[1].clone())]);
    let op = Op::new(OpKind::Flatten);
    let tys = infer(&op, &[Some(InferInput { ty: g.ty(nz[0]), value: None })], 1).expect("infer Flatten");
    let (_, f) = g.add_node("flat", op, vec![Some(nz[0])], vec![("f".into(), tys[0].clone())]);
    g.outputs.push(f[0]);
    let e = kiln_compiler::compile(&g, &kiln_compiler::Options::default()).expect_err("must be refused");
    let msg = e.to_string();
    assert!(msg.contains("flat") && msg.contains("Flatten") && msg.contains("data-dependent"), "{msg}");
}

#[test]
fn an_unknown_max_dim_name_is_an_error() {
    let path = data_dir().join("dynamic/nonzero_odd.onnx");
    let opts = kiln_import::ImportOptions { max_dims: vec![("nope".into(), 3)], ..Default::default() };
    let e = kiln_import::onnx::import_file(&path, &opts).expect_err("unknown name");
    assert!(e.to_string().contains("--max-dim nope"), "{e}");
}

#[test]
fn cuda_compiles_extents_and_sharding_refuses_them() {
    let path = data_dir().join("dynamic/nonzero_odd.onnx");
    let g = kiln_import::onnx::import_file(&path, &Default::default()).expect("import");
    // The CUDA runtime reads, checks and applies extents as the CPU's does: the CUDA
    // target compiles them (run on a GPU by `kiln conformance --engine cuda`).
    let cuda = kiln_compiler::Options { device: kiln_compiler::TargetDevice::Cuda, ..Default::default() };
    let c = kiln_compiler::compile(&g, &cuda).expect("a CUDA plan with extents");
    let module = kiln_module::Module::parse(&c.artifact).expect("parse");
    let program = kiln_module::sections::read_program(&module).expect("program");
    assert!(program.entries.iter().any(|e| !e.extents.is_empty()));
    // Nor does a plan sharded over several devices.
    let sharded = kiln_compiler::shard::compile(kiln_compiler::Input::Graph(g), &Default::default(), 2);
    assert!(
        matches!(sharded, Err(kiln_compiler::CompileError::DynamicSharded { devices: 2 })),
        "{:?}",
        sharded.err().map(|e| e.to_string())
    );
}

/// `kiln compile --max-dim` and `kiln run`: the `.npy` written has the actual shape;
/// data needing more than the bound fails with a message naming it and the option.
#[test]
fn kiln_run_writes_the_actual_shape_and_refuses_more_than_the_bound() {
    let kiln = env!("CARGO_BIN_EXE_kiln");
    let dir = std::env::temp_dir().join(format!("kiln-dynamic-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch");
    let art = dir.join("det.kiln");
    let model = data_dir().join("dynamic/detector.onnx");
    let st = std::process::Command::new(kiln)
        .args(["compile", model.to_str().expect("path"), "--max-dim", "selected=12", "-o", art.to_str().expect("path")])
        .output()
        .expect("kiln compile");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let case = |c: &str| -> Vec<String> {
        ["image", "max_out", "iou", "score_min"]
            .iter()
            .enumerate()
            .flat_map(|(k, n)| {
                let f = data_dir().join(format!("dynamic/detector/{c}.in_{k}.npy"));
                ["--input".to_string(), format!("{n}={}", f.display())]
            })
            .collect()
    };
    let out = dir.join("out");
    let st = std::process::Command::new(kiln)
        .arg("run")
        .arg(&art)
        .args(case("several"))
        .args(["--output-dir", out.to_str().expect("path")])
        .output()
        .expect("kiln run");
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    for (k, name) in ["selected", "selected_boxes"].iter().enumerate() {
        let got = kiln_ir::npy::read(&std::fs::read(out.join(format!("{name}.npy"))).expect("npy")).expect("decode");
        let want = read_npy(&format!("dynamic/detector/several.out_{k}.npy"));
        compare(&format!("kiln run {name}"), &got, &want);
    }
    let st = std::process::Command::new(kiln).arg("run").arg(&art).args(case("over")).output().expect("kiln run");
    let err = String::from_utf8_lossy(&st.stderr);
    assert!(!st.status.success() && err.contains("above the bound 12") && err.contains("--max-dim selected="), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
