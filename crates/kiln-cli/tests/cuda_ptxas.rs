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
        // The artifact records each entry's launch, and the runtime's verifier accepts
        // the plan (blocks, shared memory and one parameter per binding).
        let program = c.program().expect("program");
        let recorded: Vec<(u32, u32, u32)> =
            program.executables[0].launches.iter().map(|l| (l.block, l.shared, l.params)).collect();
        let made: Vec<(u32, u32, u32)> = cuda.launches.iter().map(|l| (l.block, l.shared, l.params)).collect();
        assert_eq!(recorded, made, "{name}: launch records");
        let artifact = kiln_runtime::fs::AlignedBytes::copy_from(c.artifact().expect("artifact"));
        match kiln_runtime::Module::verify_plan(artifact.bytes()) {
            Err(e) => failures.push(format!("{name}: the runtime's verifier refuses the CUDA plan: {e}")),
            #[cfg(feature = "cuda")]
            Ok(plan) => {
                if let Err(e) = graph_is_sound(&plan.program) {
                    failures.push(format!("{name}: CUDA graph: {e}"));
                }
            }
            #[cfg(not(feature = "cuda"))]
            Ok(_) => {}
        }
        kernels += cuda.launches.len();
        if let Err(e) = assemble_ptx("ptxas", &name, cuda.ptx()) {
            failures.push(format!("{name}: ptxas: {}", e.lines().take(8).collect::<Vec<_>>().join("\n")));
        }
    }
    assert!(kernels > 0, "no kernels compiled");
    assert!(failures.is_empty(), "{} models failed:\n{}", failures.len(), failures.join("\n"));
}

/// The CUDA runtime's graph of a verified plan (`kiln_runtime::cuda::graph`, no driver
/// needed): one kernel node per dispatch of any workgroups, with the launch's block and
/// one parameter per binding, every address range inside the device allocation, every
/// dependency on an earlier node, and every node after a barrier ordered after the
/// nodes before it (reachability through the dependencies).
#[cfg(feature = "cuda")]
fn graph_is_sound(p: &kiln_module::sections::ProgramView<'_>) -> Result<(), String> {
    use kiln_module::program::Command;
    use kiln_runtime::cuda::graph::{nodes, Layout, NodeKind};
    let e = &p.entries[0];
    let launches: Vec<_> = p
        .kernels
        .iter()
        .map(|k| {
            k.variants
                .first()
                .and_then(|v| p.executables[v.executable as usize].launches.get(v.entry as usize).copied())
        })
        .collect();
    let pool = match p.constants {
        kiln_module::sections::ConstantsView::Embedded(b) => b.len() as u64,
        kiln_module::sections::ConstantsView::External { size, .. } => size,
    };
    let sizes = vec![(e.inputs.iter().map(|t| t.bytes).collect(), e.outputs.iter().map(|t| t.bytes).collect())];
    let layout = Layout::new(e.arena_size, e.arena_align, pool, &sizes).ok_or("layout overflows")?;
    let n = nodes(e, 0, &layout, &launches).map_err(|err| err.to_string())?;
    let dispatches: Vec<(usize, &Vec<kiln_module::program::Binding>)> = e
        .commands
        .iter()
        .enumerate()
        .filter_map(|(i, c)| match c {
            Command::Dispatch { workgroups, bindings, .. } if *workgroups > 0 => Some((i, bindings)),
            _ => None,
        })
        .collect();
    let kernels: Vec<_> = n.iter().filter(|x| matches!(x.kind, NodeKind::Kernel { .. })).collect();
    if kernels.len() != dispatches.len() {
        return Err(format!("{} kernel nodes for {} dispatches", kernels.len(), dispatches.len()));
    }
    for (node, (ci, bindings)) in kernels.iter().zip(&dispatches) {
        let NodeKind::Kernel { params, block, .. } = &node.kind else { unreachable!() };
        if node.command != *ci || params.len() != bindings.len() || *block == 0 {
            return Err(format!("command {ci}: node {node:?}"));
        }
        for (p, b) in params.iter().zip(bindings.iter()) {
            if p + b.length > layout.size {
                return Err(format!("command {ci}: a parameter's range ends past the allocation"));
            }
        }
    }
    // Reachability: before[i] = every node `i` waits for, directly or not.
    let mut before: Vec<std::collections::BTreeSet<usize>> = Vec::new();
    for (i, x) in n.iter().enumerate() {
        let mut set = std::collections::BTreeSet::new();
        for &d in &x.deps {
            if d >= i {
                return Err(format!("node {i} depends on a later node {d}"));
            }
            set.insert(d);
            set.extend(before[d].iter().copied());
        }
        before.push(set);
    }
    let barriers: Vec<usize> =
        e.commands.iter().enumerate().filter(|(_, c)| matches!(c, Command::Barrier)).map(|(i, _)| i).collect();
    for (i, x) in n.iter().enumerate() {
        for (j, y) in n.iter().enumerate().take(i) {
            let barrier_between = barriers.iter().any(|&b| y.command < b && b < x.command);
            if barrier_between && !before[i].contains(&j) {
                return Err(format!(
                    "node {i} (command {}) does not wait for node {j} (command {})",
                    x.command, y.command
                ));
            }
        }
    }
    Ok(())
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
