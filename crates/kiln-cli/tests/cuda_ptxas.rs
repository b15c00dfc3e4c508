//! Every test model compiled for the CUDA target, and every kernel of it assembled by
//! NVIDIA's `ptxas -arch=sm_90a`: the PTX kiln writes is valid for Hopper, for every
//! dispatch of every model (no GPU needed).
//!
//! `ptxas` comes from the `nvidia-cuda-nvcc` wheel, extracted by scripts/setup-test-data
//! into `$KILN_TEST_DATA/tools/ptxas` (`$KILN_PTXAS` names another). A missing `ptxas`
//! or manifest is a failure, not a skip. What the kernels compute is the kernel
//! interpreter's semantics; that they compute it on a GPU has not been run yet (see
//! docs/cuda.md).

use std::path::PathBuf;
use std::process::Command;

use kiln_compiler::{Compilation, Input, Options, Stage, TargetDevice};
use kiln_import::ImportOptions;
use serde_json::Value;

fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

/// The `ptxas` binary; panics when there is none.
fn ptxas() -> PathBuf {
    let p = std::env::var_os("KILN_PTXAS").map(PathBuf::from).unwrap_or_else(|| data_dir().join("tools/ptxas"));
    assert!(
        p.is_file(),
        "{} does not exist: run scripts/setup-test-data (it extracts ptxas from the nvidia-cuda-nvcc wheel)",
        p.display()
    );
    p
}

/// Assembles `ptx` for sm_90a; the error output when ptxas refuses it.
fn assemble(name: &str, ptx: &str) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("kiln-ptxas-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let src = dir.join("m.ptx");
    std::fs::write(&src, ptx).map_err(|e| e.to_string())?;
    let out = Command::new(ptxas())
        .arg("-arch=sm_90a")
        .arg(&src)
        .arg("-o")
        .arg(dir.join("m.cubin"))
        .output()
        .map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&dir);
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn models() -> Vec<(String, PathBuf, ImportOptions)> {
    let path = data_dir().join("ref/manifest.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}; run scripts/test (it fetches the models)", path.display()));
    let v: Value = serde_json::from_str(&text).expect("manifest.json is valid JSON");
    let mut out = Vec::new();
    for e in v["models"].as_array().expect("models") {
        let name = e["name"].as_str().expect("name").to_string();
        let mut opts = ImportOptions::default();
        if let Some(shapes) = e["input_shapes"].as_object() {
            for (k, v) in shapes {
                let dims = v.as_array().expect("dims").iter().map(|d| d.as_u64().expect("dim") as usize).collect();
                opts.input_shapes.push((k.clone(), dims));
            }
        }
        if let Some(vals) = e["input_values"].as_object() {
            for (k, v) in vals {
                let vals = v.as_array().expect("values").iter().map(|d| d.as_f64().expect("number")).collect();
                opts.input_values.push((k.clone(), vals));
            }
            opts.input_shapes.retain(|(n, _)| !vals.contains_key(n));
        }
        out.push((name, data_dir().join(e["model"].as_str().expect("model")), opts));
    }
    out
}

#[test]
fn every_kernel_of_every_model_assembles_for_sm_90a() {
    let _ = ptxas();
    let mut failures = Vec::new();
    let mut kernels = 0;
    for (name, path, import) in models() {
        let opts = Options { device: TargetDevice::Cuda, import, ..Options::default() };
        let mut c = Compilation::new(Input::File(path), opts);
        if let Err(e) = c.run_to(Stage::Artifact) {
            failures.push(format!("{name}: compile for cuda: {e}"));
            continue;
        }
        let cuda = c.cuda().expect("a CUDA compilation has a CUDA module");
        let flow = c.flow().expect("flow");
        assert_eq!(cuda.launches.len(), flow.dispatches.len(), "{name}: one launch per dispatch");
        for (l, d) in cuda.launches.iter().zip(&flow.dispatches) {
            assert_eq!(
                l.params as usize,
                d.kernel.inputs.len() + 1,
                "{name}: {}: one parameter per binding",
                d.kernel.name
            );
            assert!(l.grid >= 1 && l.block >= 32, "{name}: {}: launch {l:?}", d.kernel.name);
        }
        kernels += cuda.launches.len();
        if let Err(e) = assemble(&name, cuda.ptx()) {
            failures.push(format!("{name}: ptxas: {}", e.lines().take(8).collect::<Vec<_>>().join("\n")));
        }
    }
    assert!(kernels > 0, "no kernels compiled");
    assert!(failures.is_empty(), "{} models failed:\n{}", failures.len(), failures.join("\n"));
}

/// The CPU runtime refuses a CUDA artifact with a typed error naming the device, at
/// load, before any code is mapped (never a panic).
#[test]
fn the_cpu_runtime_refuses_a_cuda_artifact() {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet.onnx");
    let opts = Options { device: TargetDevice::Cuda, ..Options::default() };
    let c = Compilation::new(Input::File(model), opts).finish().expect("lenet compiles for cuda");
    assert!(c.program.devices.iter().all(|d| d.kind == kiln_module::program::DeviceKind::Cuda));
    let bytes = kiln_runtime::fs::AlignedBytes::copy_from(&c.artifact);
    let err = kiln_runtime::Module::load(bytes.bytes(), None)
        .map(|_| ())
        .expect_err("a CUDA artifact does not load on the CPU runtime");
    let text = err.to_string();
    assert!(text.contains("(cuda) is not a CPU"), "{text}");
}
