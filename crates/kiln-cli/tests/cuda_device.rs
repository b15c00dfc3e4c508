//! `--device cuda` and `kiln gpu-check` from the command line.
//!
//! On a machine without a CUDA driver (this one, CI) every such command fails with the
//! runtime's typed error, one line, exit status 1, never a panic. Where a driver is
//! present the same commands run instead. The test marked
//! `#[ignore = "needs a CUDA driver (scripts/gpu-test)"]` runs every model of
//! `ref/manifest.json` on the GPU against ONNX Runtime's recorded outputs
//! (`cargo test -p kiln-cli --test cuda_device -- --ignored` on the device machine).
#![cfg(feature = "cuda")]

mod common;

use common::{data_dir, import_options, kiln, listed_models, model_path, ok, s, scratch, LENET};
use kiln_ir::{npy, Tensor};
use kiln_runtime::cuda::{CudaInstance, CudaModule};

const NO_DRIVER: &str = "error: --device cuda: no CUDA driver: libcuda.so.1 not found\n";

#[test]
fn device_cuda_without_a_driver_is_a_typed_error() {
    let dir = scratch("cuda-device", "no-driver");
    let art = dir.join("lenet.kiln");
    ok(&["compile", LENET, "--target", "cuda", "-o", s(&art)]);
    let empty = dir.join("cases");
    std::fs::create_dir_all(&empty).expect("dir");
    let commands: [&[&str]; 9] = [
        &["run", s(&art), "--device", "cuda"],
        &["run", LENET, "--device", "cuda"],
        &["bench", s(&art), "--device", "cuda", "--iterations", "3"],
        &["bench", s(&art), "--device", "cuda", "--json", "--resident"],
        &["bench", s(&art), "--device", "cuda", "--profile", "--iterations", "2", "--warmup", "1"],
        &["conformance", s(&empty), "--device", "cuda"],
        &["gpu-check", LENET],
        &["gpu-check", LENET, "--dispatch", "2"],
        &["gpu-check", LENET, "--precision", "bf16"],
    ];
    match kiln_runtime::cuda::driver_present() {
        Err(_) => {
            for args in commands {
                let (success, out, err) = kiln(args);
                assert!(!success, "kiln {args:?} succeeded without a driver");
                assert_eq!(err, NO_DRIVER, "kiln {args:?}");
                assert_eq!(out, "", "kiln {args:?}");
            }
        }
        // A driver: the commands run (a conformance run of no cases, lenet's kernels
        // checked against the interpreter).
        Ok(()) => {
            for args in commands {
                ok(args);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn device_flags_are_checked() {
    let (success, _, err) = kiln(&["run", LENET, "--device", "gpu"]);
    assert!(!success);
    assert_eq!(err, "error: --device `gpu`: expected cpu or cuda\n");
    let (success, _, err) = kiln(&["bench", LENET, "--resident"]);
    assert!(!success);
    assert_eq!(err, "error: --resident times the CUDA graph alone: it needs --device cuda\n");
    let (success, _, err) = kiln(&["run", LENET, "--device", "cuda", "--target", "cpu"]);
    assert!(!success);
    assert_eq!(err, "error: --target cpu compiles for another device than --device cuda runs on\n");
    let (success, _, err) = kiln(&["conformance", ".", "--device", "cuda", "--engine", "reference"]);
    assert!(!success);
    assert_eq!(err, "error: --device cuda runs the compiled engine; the reference evaluator runs on the CPU\n");
}

fn read_npy(rel: &str) -> Tensor {
    let p = data_dir().join(rel);
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    npy::read(&b).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The tolerance of `tests/models.rs`: |got − ORT| ≤ atol·max|ORT| + rtol·|ORT| per
/// element; integer and bool outputs exact. The first element out of it, if any.
fn mismatch(got: &Tensor, want: &Tensor, rtol: f64, atol: f64) -> Option<String> {
    if got.ty() != want.ty() {
        return Some(format!("type {}, expected {}", got.ty(), want.ty()));
    }
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    let exact = !want.dtype().is_float();
    let scale = b.iter().fold(0.0f64, |m, x| if x.is_finite() { m.max(x.abs()) } else { m });
    let abs_tol = atol * scale.max(f64::MIN_POSITIVE);
    for (i, (&x, &y)) in a.iter().zip(&b).enumerate() {
        if x == y || (x.is_nan() && y.is_nan()) {
            continue;
        }
        let err = (x - y).abs();
        if exact || err.is_nan() || err > abs_tol + rtol * y.abs() {
            return Some(format!("element {i} is {x}, ORT gives {y} (|diff| {err:.3e})"));
        }
    }
    None
}

/// One model of the manifest compiled for CUDA (weights kept outside for half of them,
/// as in `tests/models.rs`), loaded on GPU 0 and run; `Err` says what differs.
fn run_model(e: &serde_json::Value) -> Result<String, String> {
    let name = e["name"].as_str().expect("name");
    let g =
        kiln_import::onnx::import_file(&model_path(e), &import_options(e)).map_err(|err| format!("import: {err}"))?;
    let external = name.len().is_multiple_of(2);
    let opts = kiln_compiler::Options {
        device: kiln_compiler::TargetDevice::Cuda,
        external_weights: external.then(|| format!("{name}.weights")),
        source: name.to_string(),
        ..Default::default()
    };
    let c = kiln_compiler::compile(&g, &opts).map_err(|err| format!("compile: {err}"))?;
    let bytes = kiln_runtime::fs::AlignedBytes::copy_from(&c.artifact);
    let module = CudaModule::load(bytes.bytes(), c.weights.as_deref()).map_err(|err| format!("load: {err}"))?;
    let mut inst = CudaInstance::new(&module).map_err(|err| format!("instantiate: {err}"))?;
    let mut feeds = Vec::new();
    for inp in e["inputs"].as_array().expect("inputs") {
        let n = inp["name"].as_str().expect("input name");
        if e["input_values"].get(n).is_none() {
            feeds.push(read_npy(inp["file"].as_str().expect("file")));
        }
    }
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs).map_err(|err| format!("invoke: {err}"))?;
    }
    let (rtol, atol) = (e["rtol"].as_f64().unwrap_or(1e-4), e["atol"].as_f64().unwrap_or(1e-5));
    for ((b, want), &v) in outs.into_iter().zip(e["outputs"].as_array().expect("outputs")).zip(&g.outputs) {
        let oname = want["name"].as_str().expect("output name");
        let got = Tensor::new(g.values[v].ty.clone(), b.into()).map_err(|err| format!("{oname}: {err}"))?;
        if let Some(m) = mismatch(&got, &read_npy(want["file"].as_str().expect("file")), rtol, atol) {
            return Err(format!("{oname}: {m}"));
        }
    }
    Ok(format!(
        "{} dispatches, {} code loaded in {:.1} ms, graph built in {:.1} ms",
        c.flow.dispatches.len(),
        module.form().name(),
        module.load_time().as_secs_f64() * 1e3,
        inst.graph_time().as_secs_f64() * 1e3
    ))
}

#[test]
#[ignore = "needs a CUDA driver (scripts/gpu-test)"]
fn every_model_on_the_gpu_matches_onnx_runtime() {
    let models = listed_models("manifest.json");
    assert!(!models.is_empty());
    let mut failures = Vec::new();
    for e in &models {
        let name = e["name"].as_str().expect("name");
        match run_model(e) {
            Ok(what) => eprintln!("GPU {name}: matches ONNX Runtime ({what})"),
            Err(why) => {
                eprintln!("GPU {name}: FAILS: {why}");
                failures.push(format!("{name}: {why}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} models differ on the GPU:\n{}",
        failures.len(),
        models.len(),
        failures.join("\n")
    );
}
