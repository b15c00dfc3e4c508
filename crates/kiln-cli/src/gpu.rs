//! `--device cuda` (`kiln run`, `kiln bench`, `kiln conformance`) and `kiln gpu-check`:
//! the CUDA runtime ([`kiln_runtime::cuda`]) behind the command line.
//!
//! Every command checks first that a CUDA driver is there: without one it fails with
//! the runtime's typed error (`--device cuda: no CUDA driver: libcuda.so.1 not found`,
//! exit status 1), never a panic. A kiln built without the `cuda` feature says so.
//!
//! `kiln gpu-check MODEL` compiles the model for CUDA keeping its flow kernels, loads
//! it, and runs the plan one command at a time on a stream (not the graph). Around each
//! dispatch it downloads the kernel's input bindings (before) and its output (after),
//! runs the kernel interpreter (`kiln_flow::interp`, the oracle) on the downloaded
//! inputs, and compares; one line per dispatch, failures again at the end. The
//! interpreter, far slower than the GPU (one element at a time: minutes for a ResNet-50
//! on one core), runs on every core meanwhile.
//!
//! Tolerance ([`within`]): integer, bool and every Movement kernel's outputs must be
//! bit-identical (NaN matches NaN of any payload only for floats); a float element
//! passes when it is within `--ulps N` (default 8) units in the last place of the
//! oracle's value at the oracle's magnitude (`ulp(w) = 2^(⌊log2 max(|w|, min normal)⌋ −
//! mantissa bits)`), or within `N · ε · max|oracle|` absolutely (cancellation near zero
//! in a sum over a tensor of large values). Infinities must match exactly. Where the
//! kernel sums `K` terms (its longest `Sum` reduction), the GPU may add them in another
//! order (tiles, tensor cores, split-K), and such a sum's rounding error grows like
//! `√K · ε` of its magnitude (random-walk growth of reassociated rounding errors): the
//! absolute floor is then `N · ε · √K · max|oracle|`. The relative criterion stays.
//! Where the kernel casts a value to a float type narrower than its output (a product
//! rounded to bf16, then widened to f32 by a fused Cast), ulps and `ε` are that type's:
//! a sum that lands next to one of its rounding boundaries may round either way.

use crate::artifact::Args;

#[cfg(not(feature = "cuda"))]
const NO_CUDA: &str = "this kiln was built without CUDA support (cargo feature `cuda` of kiln-cli)";

/// `kiln run --device cuda`.
#[cfg(not(feature = "cuda"))]
pub(crate) fn run_cmd(_: &Args) -> Result<(), String> {
    Err(NO_CUDA.into())
}

/// `kiln bench --device cuda`.
#[cfg(not(feature = "cuda"))]
pub(crate) fn bench_cmd(_: &Args) -> Result<(), String> {
    Err(NO_CUDA.into())
}

/// `kiln gpu-check`.
#[cfg(not(feature = "cuda"))]
pub(crate) fn check_cmd(_: &Args, _: Option<usize>, _: u32) -> Result<(), String> {
    Err(NO_CUDA.into())
}

/// Whether `--device cuda` can run here.
#[cfg(not(feature = "cuda"))]
pub(crate) fn require_driver() -> Result<(), String> {
    Err(NO_CUDA.into())
}

/// A graph compiled for CUDA and run on the GPU (the conformance engine `cuda`).
#[cfg(not(feature = "cuda"))]
pub(crate) fn execute_graph(
    _: &kiln_ir::Graph,
    _: &[kiln_ir::Tensor],
) -> Result<Vec<kiln_ir::Tensor>, crate::conformance::Outcome> {
    Err(crate::conformance::Outcome::RuntimeError(NO_CUDA.into()))
}

#[cfg(feature = "cuda")]
pub(crate) use imp::*;

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use crate::artifact::{
        feeds, invoke_and_write, json_ms, json_str, output_buffers, profile_rows, read_artifact, timings, verify_plan,
        weights_file, ProfileRow, Stats,
    };
    use crate::conformance::Outcome;
    use crate::write_stdout;
    use kiln_compiler::{Compilation, Input, Stage, TargetDevice};
    use kiln_ir::{DType, Graph, Tensor};
    use kiln_module::program::{Command, KernelClass};
    use kiln_runtime::cuda::{CudaInstance, CudaModule};
    use kiln_runtime::fs::AlignedBytes;
    use std::time::{Duration, Instant};

    /// `Ok` when a CUDA driver is there, else the typed error as the CLI prints it.
    pub(crate) fn require_driver() -> Result<(), String> {
        kiln_runtime::cuda::driver_present().map_err(|e| format!("--device cuda: {e}"))
    }

    /// Flags that mean something on the CPU only.
    fn cpu_only(a: &Args) -> Result<(), String> {
        let given = [(a.threads.is_some(), "--threads"), (a.floor, "--floor"), (a.target.is_some(), "--target-cpu")];
        match given.iter().find(|(set, _)| *set) {
            Some((_, flag)) => Err(format!("{flag} applies to the CPU; leave it out with --device cuda")),
            None => Ok(()),
        }
    }

    /// Reads the artifact of `a` (or compiles its model for CUDA), loads it on GPU 0 and
    /// calls `then` with the module, its label and the wall time of verifying and
    /// loading.
    fn with_module<T>(
        a: &Args,
        then: impl FnOnce(&CudaModule<'_>, &str, Duration) -> Result<T, String>,
    ) -> Result<T, String> {
        require_driver()?;
        cpu_only(a)?;
        let loaded = read_artifact(a)?;
        let t0 = Instant::now();
        // The plan first, as on the CPU: the weights file it names is opened only then.
        let plan = verify_plan(&loaded)?;
        let weights = weights_file(a, &loaded, &plan)?;
        drop(plan);
        let w = weights.as_ref().or(loaded.compiled_weights.as_ref()).map(AlignedBytes::bytes);
        let as_cc = load_as()?;
        let module =
            CudaModule::load_as(loaded.bytes.bytes(), w, 0, as_cc).map_err(|e| format!("{}: {e}", loaded.label))?;
        then(&module, &loaded.label, t0.elapsed())
    }

    /// `KILN_CUDA_LOAD_AS=8.0` (or `sm_80`): `run` and `bench` choose each kernel's
    /// variant as if the GPU had that compute capability where it is below the GPU's
    /// own, to run an artifact's `sm_80` code on a Hopper GPU
    /// ([`CudaModule::load_as`]). Unset: the GPU's own.
    fn load_as() -> Result<Option<(u32, u32)>, String> {
        const VAR: &str = "KILN_CUDA_LOAD_AS";
        let Some(v) = std::env::var_os(VAR) else { return Ok(None) };
        let v = v.to_string_lossy();
        let t = v.trim();
        // `8.0`, or `sm_80` (the last digit is the minor version).
        let (major, minor) = match t.strip_prefix("sm_") {
            Some(d) if d.len() >= 2 && d.is_char_boundary(d.len() - 1) => d.split_at(d.len() - 1),
            Some(_) => ("", ""),
            None => t.split_once('.').unwrap_or(("", "")),
        };
        match (major.parse::<u32>(), minor.parse::<u32>()) {
            (Ok(a), Ok(b)) if a >= 1 && b <= 9 => Ok(Some((a, b))),
            _ => Err(format!("{VAR}={t}: expected a compute capability such as 8.0 or sm_80")),
        }
    }

    /// The index of entry point `main` (what `invoke` runs).
    fn main_entry(module: &CudaModule<'_>, label: &str) -> Result<usize, String> {
        module
            .signature()
            .find("main")
            .map(|e| e.index)
            .ok_or_else(|| format!("{label}: the module has no entry point main"))
    }

    /// How the module's code was loaded, for messages.
    fn loaded_how(module: &CudaModule<'_>, instance: &CudaInstance<'_>) -> String {
        let fallback = module.cubin_fallback().map(|w| format!(" (cubin not used: {w})")).unwrap_or_default();
        format!(
            "{} code loaded in {:.2} ms{fallback}, graph built in {:.2} ms",
            module.form().name(),
            module.load_time().as_secs_f64() * 1e3,
            instance.graph_time().as_secs_f64() * 1e3
        )
    }

    /// `kiln run ART --device cuda`: the same outputs as on the CPU.
    pub(crate) fn run_cmd(a: &Args) -> Result<(), String> {
        with_module(a, |module, label, t_load| {
            let main = main_entry(module, label)?;
            let sig = module.signature().entry(main).ok_or_else(|| format!("{label}: no entry point"))?;
            let feeds = feeds(a, sig.inputs)?;
            let t1 = Instant::now();
            let mut instance = CudaInstance::new(module).map_err(|e| format!("{label}: {e}"))?;
            let t_instance = t1.elapsed();
            let t_run = invoke_and_write(
                a,
                &feeds,
                sig.outputs,
                label,
                &mut instance,
                CudaInstance::invoke,
                CudaInstance::output_dims,
            )?;
            eprintln!(
                "{label}: loaded in {:.2} ms and instantiated in {:.2} ms ({}), ran in {:.3} ms on {} (compute capability {}.{})",
                t_load.as_secs_f64() * 1e3,
                t_instance.as_secs_f64() * 1e3,
                loaded_how(module, &instance),
                t_run.as_secs_f64() * 1e3,
                module.device_name(),
                module.capability().0,
                module.capability().1
            );
            Ok(())
        })
    }

    /// `kiln bench ART --device cuda [--resident]`: times `invoke` (copies in, one graph
    /// launch, copies out, one synchronisation), or with `--resident` the graph alone on
    /// inputs kept on the device (one launch, one synchronisation).
    pub(crate) fn bench_cmd(a: &Args) -> Result<(), String> {
        with_module(a, |module, label, _| {
            let main = main_entry(module, label)?;
            let sig = module.signature().entry(main).ok_or_else(|| format!("{label}: no entry point"))?;
            let feeds = feeds(a, sig.inputs)?;
            let mut instance = CudaInstance::new(module).map_err(|e| format!("{label}: {e}"))?;
            let in_bufs: Vec<AlignedBytes> = feeds.iter().map(|t| AlignedBytes::copy_from(t.bytes())).collect();
            let ins: Vec<&[u8]> = in_bufs.iter().map(AlignedBytes::bytes).collect();
            let mut outs = output_buffers(sig.outputs, label)?;
            let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(AlignedBytes::bytes_mut).collect();
            if a.resident || a.profile {
                instance.write_inputs(main, &ins).map_err(|e| format!("{label}: {e}"))?;
            }
            if a.profile {
                return profile(a, label, module, &mut instance, main);
            }
            let (warmup, iterations) = (a.warmup.unwrap_or(10), a.iterations.unwrap_or(100));
            let mut call = || -> Result<f64, String> {
                let t = Instant::now();
                let r = if a.resident { instance.invoke_resident(main) } else { instance.invoke(&ins, &mut out_refs) };
                r.map_err(|e| format!("{label}: {e}"))?;
                Ok(t.elapsed().as_secs_f64() * 1e3)
            };
            for _ in 0..warmup {
                call()?;
            }
            let mut ms = timings(iterations)?;
            for _ in 0..iterations {
                ms.push(call()?);
            }
            if let Some(path) = &a.samples {
                let text: String = ms.iter().map(|t| format!("{}\n", json_ms(*t))).collect();
                std::fs::write(path, text).map_err(|e| format!("--samples {}: {e}", path.display()))?;
            }
            let st = Stats::of(&mut ms);
            let load_ms = module.load_time().as_secs_f64() * 1e3;
            let graph_ms = instance.graph_time().as_secs_f64() * 1e3;
            if a.json {
                write_stdout(&format!(
                    "{{\"model\":{},\"device\":\"cuda\",\"gpu\":{},\"median_ms\":{},\"p99_ms\":{},\"stddev_ms\":{},\"min_ms\":{},\"iterations\":{iterations},\"warmup\":{warmup},\"resident\":{},\"code\":\"{}\",\"cubin_fallback\":{},\"module_load_ms\":{},\"graph_build_ms\":{}}}\n",
                    json_str(label),
                    json_str(module.device_name()),
                    json_ms(st.median),
                    json_ms(st.p99),
                    json_ms(st.stddev),
                    json_ms(st.min),
                    a.resident,
                    module.form().name(),
                    module.cubin_fallback().map_or("null".to_string(), json_str),
                    json_ms(load_ms),
                    json_ms(graph_ms)
                ))
            } else {
                write_stdout(&format!(
                    "{label}: {iterations} iterations after {warmup} warm-up on {}{}: median {:.4} ms, p99 {:.4} ms, stddev {:.4} ms, min {:.4} ms, p99/median {:.2}; {}\n",
                    module.device_name(),
                    if a.resident { ", graph alone (inputs on the device)" } else { "" },
                    st.median,
                    st.p99,
                    st.stddev,
                    st.min,
                    st.p99 / st.median,
                    loaded_how(module, &instance)
                ))
            }
        })
    }

    /// `kiln bench --device cuda --profile`: every command of the plan run on its own on
    /// the stream (not the graph) and waited for, `--iterations` times after
    /// `--warmup` rounds; per command the median host time of launch and wait, its share
    /// of the sum of medians, slowest first. Each time includes a launch and a
    /// synchronisation (some µs), so small kernels read slower than in the graph; the
    /// large ones, which this is for, read as they run.
    fn profile(
        a: &Args,
        label: &str,
        module: &CudaModule<'_>,
        inst: &mut CudaInstance<'_>,
        main: usize,
    ) -> Result<(), String> {
        let p = module.program();
        let commands = &p.entries[main].commands;
        let (warmup, iterations) = (a.warmup.unwrap_or(10), a.iterations.unwrap_or(100));
        let n = commands.len();
        let mut times = timings(n.checked_mul(iterations).ok_or("--iterations: too many to time")?)?;
        times.resize(n * iterations, 0.0);
        for round in 0..warmup + iterations {
            for c in 0..n {
                let t = Instant::now();
                inst.run_command(main, c).map_err(|e| format!("{label}: command {c}: {e}"))?;
                if round >= warmup {
                    times[c * iterations + round - warmup] = t.elapsed().as_secs_f64() * 1e6;
                }
            }
        }
        let (rows, total) = profile_rows(p, commands, &mut times, iterations, |name, kernel, workgroups| {
            let block = module.launches().get(kernel as usize).copied().flatten().map_or(0, |l| l.block);
            format!("{name} <<<{workgroups}, {block}>>>")
        });
        if a.json {
            let items: Vec<String> = rows
                .iter()
                .map(|ProfileRow { command: c, what, median_us: us, source: src, .. }| {
                    format!(
                        "{{\"command\":{c},\"what\":{},\"median_us\":{},\"source\":{}}}",
                        json_str(what),
                        json_ms(*us),
                        json_str(src)
                    )
                })
                .collect();
            return write_stdout(&format!(
                "{{\"model\":{},\"device\":\"cuda\",\"gpu\":{},\"iterations\":{iterations},\"profile\":[{}]}}\n",
                json_str(label),
                json_str(module.device_name()),
                items.join(",")
            ));
        }
        let mut s = format!(
            "{label}: profile of {iterations} rounds on {}, each command launched and waited for alone: sum of medians {:.4} ms\n  command  median us   share  what  // source\n",
            module.device_name(),
            total / 1e3
        );
        for ProfileRow { command: c, what, median_us: us, source: src, .. } in &rows {
            let src = if src.is_empty() { String::new() } else { format!("  // {src}") };
            s.push_str(&format!(
                "  {c:>7}  {us:>9.2}  {:>5.1}%  {what}{src}\n",
                us / total.max(f64::MIN_POSITIVE) * 100.0
            ));
        }
        write_stdout(&s)
    }

    /// A graph compiled for CUDA, written to a file and read back (as a user's artifact
    /// travels), loaded and run on GPU 0: the conformance engine `cuda`.
    pub(crate) fn execute_graph(g: &Graph, feeds: &[Tensor]) -> Result<Vec<Tensor>, Outcome> {
        require_driver().map_err(Outcome::RuntimeError)?;
        let opts = kiln_compiler::Options { device: TargetDevice::Cuda, ..kiln_compiler::Options::default() };
        crate::conformance::compile_and_run(g, feeds, &opts, "conformance-cuda", |artifact, weights, ins, outs| {
            let module = CudaModule::load(artifact, weights).map_err(|e| format!("load: {e}"))?;
            let mut inst = CudaInstance::new(&module).map_err(|e| format!("instantiate: {e}"))?;
            inst.invoke(ins, outs).map_err(|e| e.to_string())?;
            Ok(Some((0..outs.len()).map(|k| inst.output_dims(k).unwrap_or(&[]).to_vec()).collect()))
        })
    }

    /// What the GPU computed for dispatch `k`: its inputs as it read them, its output.
    struct Job {
        k: usize,
        inputs: Vec<Vec<u8>>,
        got: Vec<u8>,
    }

    /// One dispatch's result in `kiln gpu-check`.
    struct Row {
        line: String,
        pass: bool,
    }

    /// `kiln gpu-check MODEL [--input-shape …] [--input-value …] [--input NAME=FILE.npy]
    /// [--seed N] [--dispatch N] [--ulps N] [--precision f16|bf16]` (see the module docs).
    pub(crate) fn check_cmd(a: &Args, only: Option<usize>, ulps: u32) -> Result<(), String> {
        require_driver()?;
        let model = a.model.clone().ok_or("no model given (kiln gpu-check --help shows the usage)")?;
        if model.extension().is_some_and(|e| e == "kiln") {
            return Err(format!(
                "{}: gpu-check needs the model (it keeps the flow kernels, the oracle's input); give the .onnx or .kir",
                model.display()
            ));
        }
        let label = model.display().to_string();
        let mut opts = crate::artifact::options(a, &model)?;
        opts.device = TargetDevice::Cuda;
        let mut c = Compilation::new(Input::File(model.clone()), opts);
        c.run_to(Stage::Artifact).map_err(|e| format!("{label}: {e}"))?;
        let (Some(flow), Some(cuda), Some(artifact)) = (c.flow(), c.cuda(), c.artifact()) else {
            return Err(format!("{label}: the compilation kept no flow program, CUDA module or artifact"));
        };
        if only.is_some_and(|d| d >= flow.dispatches.len()) {
            return Err(format!(
                "--dispatch {}: the model has {} dispatches",
                only.unwrap_or(0),
                flow.dispatches.len()
            ));
        }
        let bytes = AlignedBytes::copy_from(artifact);
        let module = CudaModule::load(bytes.bytes(), None).map_err(|e| format!("{label}: {e}"))?;
        let main = main_entry(&module, &label)?;
        let sig = module.signature().entry(main).ok_or_else(|| format!("{label}: no entry point"))?;
        let feeds = feeds(a, sig.inputs)?;
        let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
        let mut inst = CudaInstance::new(&module).map_err(|e| format!("{label}: {e}"))?;
        inst.write_inputs(main, &ins).map_err(|e| format!("{label}: {e}"))?;
        let commands = &module.program().entries[main].commands;
        // The GPU runs the plan in order on this thread; the interpreter's checks, which
        // take far longer (one element at a time), run meanwhile on the other cores,
        // fed through a short queue (so that few dispatches' bytes are held at once).
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(2 * workers);
        let rx = std::sync::Mutex::new(rx);
        let done = std::sync::Mutex::new(Vec::new());
        let gpu = std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let job = rx.lock().unwrap_or_else(std::sync::PoisonError::into_inner).recv();
                    let Ok(j) = job else { break };
                    let note = cuda.notes.get(j.k).map_or("", String::as_str);
                    let row = check_dispatch(flow, j.k, &j.inputs, &j.got, note, ulps);
                    done.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push((j.k, row));
                });
            }
            // `tx` moves in and is dropped at the end: the workers stop when the queue empties.
            let tx = tx;
            for (ci, cmd) in commands.iter().enumerate() {
                let Command::Dispatch { kernel, bindings, .. } = cmd else {
                    inst.run_command(main, ci).map_err(|e| format!("{label}: command {ci}: {e}"))?;
                    continue;
                };
                let k = *kernel as usize;
                let checked = only.is_none_or(|d| d == k);
                let mut inputs = Vec::new();
                if checked {
                    for j in 0..bindings.len().saturating_sub(1) {
                        inputs.push(inst.read_binding(main, ci, j).map_err(|e| format!("{label}: {e}"))?);
                    }
                }
                inst.run_command(main, ci).map_err(|e| format!("{label}: dispatch {k}: {e}"))?;
                if !checked {
                    continue;
                }
                let got = inst.read_binding(main, ci, bindings.len() - 1).map_err(|e| format!("{label}: {e}"))?;
                if tx.send(Job { k, inputs, got }).is_err() {
                    return Err(format!("{label}: the checking threads stopped"));
                }
                if only.is_some() {
                    break;
                }
            }
            Ok(())
        });
        gpu?;
        let mut rows = done.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner);
        rows.sort_by_key(|(k, _)| *k);
        let rows: Vec<Row> = rows.into_iter().map(|(_, r)| r).collect();
        let failed: Vec<&Row> = rows.iter().filter(|r| !r.pass).collect();
        let mut out: String = rows.iter().map(|r| format!("{}\n", r.line)).collect();
        out.push_str(&format!(
            "{label}: {} dispatches checked on {} ({} code), {} pass, {} fail (tolerance: exact for integer, bool and movement kernels; {ulps} ulps for floats)\n",
            rows.len(),
            module.device_name(),
            module.form().name(),
            rows.len() - failed.len(),
            failed.len()
        ));
        for r in &failed {
            out.push_str(&format!("  {}\n", r.line));
        }
        write_stdout(&out)?;
        if failed.is_empty() {
            Ok(())
        } else {
            Err(format!("{label}: {} of {} kernels differ from the kernel interpreter", failed.len(), rows.len()))
        }
    }

    /// Compares dispatch `k`'s output `got`, computed on the GPU from `inputs`, with the
    /// kernel interpreter's on the same inputs.
    fn check_dispatch(
        flow: &kiln_flow::program::FlowProgram,
        k: usize,
        inputs: &[Vec<u8>],
        got: &[u8],
        note: &str,
        ulps: u32,
    ) -> Row {
        let Some(d) = flow.dispatches.get(k) else {
            return Row { line: format!("FAIL d{k}: no flow dispatch {k}"), pass: false };
        };
        let head = format!("d{k:<4} {:<11} {}", d.class.name(), d.kernel.name);
        let fail = |why: String| Row { line: format!("FAIL {head}  {why}  [{note}]"), pass: false };
        let mut tensors = Vec::with_capacity(inputs.len());
        for (i, (ty, b)) in d.kernel.inputs.iter().zip(inputs).enumerate() {
            match Tensor::new(ty.clone(), bytes::Bytes::from(b.clone())) {
                Ok(t) => tensors.push(t),
                Err(e) => return fail(format!("input {i}: {e}")),
            }
        }
        let refs: Vec<&Tensor> = tensors.iter().collect();
        let want = match kiln_flow::interp::run(&d.kernel, &refs) {
            Ok(t) => t,
            Err(e) => return fail(format!("interpreter: {e}")),
        };
        let got = match Tensor::new(d.kernel.output.clone(), bytes::Bytes::from(got.to_vec())) {
            Ok(t) => t,
            Err(e) => return fail(format!("output: {e}")),
        };
        let exact = !want.dtype().is_float() || d.class == KernelClass::Movement;
        let e = within(&got, &want, exact, ulps, longest_sum(&d.kernel), narrowest_cast(&d.kernel));
        let line = format!(
            "{} {head}  max_abs {:.3e} max_rel {:.3e} bad {}/{}{}  [{note}]",
            if e.bad == 0 { "pass" } else { "FAIL" },
            e.max_abs,
            e.max_rel,
            e.bad,
            e.count,
            e.first.map(|(i, g, w)| format!(" first at {i}: {g} vs {w}")).unwrap_or_default()
        );
        Row { line, pass: e.bad == 0 }
    }

    /// How far an output is from the oracle's.
    pub(crate) struct Error {
        pub max_abs: f64,
        pub max_rel: f64,
        /// Elements out of tolerance.
        pub bad: usize,
        pub count: usize,
        /// The first element out of tolerance: index, got, expected.
        pub first: Option<(usize, f64, f64)>,
    }

    /// Mantissa bits and the smallest normal exponent of a float type.
    fn float_format(d: DType) -> (i32, i32) {
        match d {
            DType::F64 => (52, -1022),
            DType::F16 => (10, -14),
            DType::BF16 => (7, -126),
            DType::F8E4M3FN | DType::F8E4M3FNUZ => (3, -6),
            DType::F8E5M2 | DType::F8E5M2FNUZ => (2, -14),
            DType::F8E8M0FNU => (0, -127),
            DType::F6E3M2FN => (2, -2),
            DType::F4E2M1FN => (1, 0),
            _ => (23, -126),
        }
    }

    /// The number of terms of the kernel's longest `Sum` reduction (1 without one).
    fn longest_sum(k: &kiln_flow::kernel::Kernel) -> u64 {
        k.nodes
            .iter()
            .filter_map(|n| match &n.expr {
                kiln_flow::kernel::Expr::Reduce { op: kiln_flow::kernel::ReduceOp::Sum, vars, .. } => {
                    Some(vars.iter().map(|v| k.vars.get(v.0 as usize).copied().unwrap_or(1)).product::<u64>())
                }
                _ => None,
            })
            .max()
            .unwrap_or(1)
            .max(1)
    }

    /// The float type with the fewest mantissa bits the kernel casts a value to, if any.
    fn narrowest_cast(k: &kiln_flow::kernel::Kernel) -> Option<DType> {
        k.nodes
            .iter()
            .filter_map(|n| match &n.expr {
                kiln_flow::kernel::Expr::Cast { to, .. } if to.is_float() => Some(*to),
                _ => None,
            })
            .min_by_key(|&d| float_format(d).0)
    }

    /// Compares `got` with `want` element by element (see the module docs); `terms` is
    /// the length of the longest sum behind each element (1: none), `narrow` a float
    /// type the values went through on the way (its precision counts where coarser).
    pub(crate) fn within(
        got: &Tensor,
        want: &Tensor,
        exact: bool,
        ulps: u32,
        terms: u64,
        narrow: Option<DType>,
    ) -> Error {
        let mut e = Error { max_abs: 0.0, max_rel: 0.0, bad: 0, count: 0, first: None };
        if got.ty() != want.ty() {
            e.bad = 1;
            return e;
        }
        if exact && got.bytes() == want.bytes() {
            e.count = want.bytes().len();
            return e;
        }
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        e.count = w.len();
        let float = want.dtype().is_float();
        let (mantissa, min_exp) = match narrow.map(float_format) {
            Some(n) if n.0 < float_format(want.dtype()).0 => n,
            _ => float_format(want.dtype()),
        };
        let eps = (2f64).powi(-mantissa);
        let floor = f64::from(ulps) * eps * (terms as f64).sqrt();
        let scale = w.iter().filter(|x| x.is_finite()).fold(0f64, |m, x| m.max(x.abs()));
        for (i, (&x, &y)) in g.iter().zip(&w).enumerate() {
            let same = x == y || (float && x.is_nan() && y.is_nan());
            let diff = (x - y).abs();
            if diff.is_finite() {
                e.max_abs = e.max_abs.max(diff);
                if y != 0.0 {
                    e.max_rel = e.max_rel.max(diff / y.abs());
                }
            }
            let ok = same
                || (!exact && {
                    let mag = y.abs().max((2f64).powi(min_exp));
                    let ulp = (2f64).powi(mag.log2().floor() as i32 - mantissa);
                    diff.is_finite() && (diff <= f64::from(ulps) * ulp || diff <= floor * scale)
                });
            if !ok {
                e.bad += 1;
                e.first.get_or_insert((i, x, y));
            }
        }
        // A movement kernel's floats compared as bytes: a different NaN payload is a
        // difference, which the values above cannot see.
        if exact && e.bad == 0 && got.bytes() != want.bytes() {
            e.bad = 1;
        }
        e
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use kiln_ir::Shape;

        fn t(dtype: DType, v: &[f64]) -> Tensor {
            Tensor::from_f64(dtype, Shape::new(vec![v.len()]).expect("shape"), v).expect("tensor")
        }

        fn bad(got: &[f64], want: &[f64], dtype: DType, exact: bool, ulps: u32) -> usize {
            within(&t(dtype, got), &t(dtype, want), exact, ulps, 1, None).bad
        }

        #[test]
        fn the_absolute_floor_grows_with_the_square_root_of_the_sum_length() {
            // 8 · 2⁻²³ · 100 ≈ 9.5e-5 for one term; 16 times that for a sum of 256.
            let (got, want) = (t(DType::F32, &[1e-3, 100.0]), t(DType::F32, &[0.0, 100.0]));
            assert_eq!(within(&got, &want, false, 8, 1, None).bad, 1);
            assert_eq!(within(&got, &want, false, 8, 64, None).bad, 1);
            assert_eq!(within(&got, &want, false, 8, 256, None).bad, 0);
            // Exact kernels ignore it.
            assert_eq!(within(&got, &want, true, 8, 256, None).bad, 1);
        }

        #[test]
        fn a_narrow_cast_on_the_way_sets_the_ulps() {
            // f32 values that went through bf16: one bf16 step at 3.5 (2⁻⁶) is 2¹⁷ f32 ulps.
            let (got, want) = (t(DType::F32, &[3.53125, 1.0]), t(DType::F32, &[3.546875, 1.0]));
            assert_eq!(within(&got, &want, false, 8, 1, None).bad, 1);
            assert_eq!(within(&got, &want, false, 8, 1, Some(DType::BF16)).bad, 0);
            // Past both bounds in bf16 (8 steps; the floor 8 · 2⁻⁷ · 3.55 ≈ 14 steps) it
            // fails; a type wider than the output changes nothing.
            let far = t(DType::F32, &[3.546875 + 16.0 / 64.0, 1.0]);
            assert_eq!(within(&far, &want, false, 8, 1, Some(DType::BF16)).bad, 1);
            assert_eq!(within(&got, &want, false, 8, 1, Some(DType::F64)).bad, 1);
        }

        #[test]
        fn floats_pass_within_the_ulps_and_fail_past_them() {
            let one_ulp = f64::from(f32::EPSILON); // at 1.0
            assert_eq!(bad(&[1.0 + 8.0 * one_ulp], &[1.0], DType::F32, false, 8), 0);
            assert_eq!(bad(&[1.0 + 9.0 * one_ulp], &[1.0], DType::F32, false, 8), 1);
            // Scaled to the value's magnitude: 1024 has ulps 1024 times wider.
            assert_eq!(bad(&[1024.0 + 8.0 * 1024.0 * one_ulp], &[1024.0], DType::F32, false, 8), 0);
            // Near zero in a tensor of large values: the absolute floor N·ε·max|oracle|.
            // (8 · 2⁻²³ · 100 ≈ 9.5e-5)
            assert_eq!(bad(&[9e-5, 100.0], &[0.0, 100.0], DType::F32, false, 8), 0);
            assert_eq!(bad(&[1e-4, 100.0], &[0.0, 100.0], DType::F32, false, 8), 1);
            // f16 ulps are its own.
            assert_eq!(bad(&[1.0 + 2.0 / 1024.0], &[1.0], DType::F16, false, 2), 0);
            assert_eq!(bad(&[1.0 + 4.0 / 1024.0], &[1.0], DType::F16, false, 2), 1);
            // NaN matches NaN; an infinity only itself.
            assert_eq!(bad(&[f64::NAN, f64::INFINITY], &[f64::NAN, f64::INFINITY], DType::F32, false, 8), 0);
            assert_eq!(bad(&[f64::NAN], &[1.0], DType::F32, false, 8), 1);
            assert_eq!(bad(&[f64::INFINITY], &[f64::MAX], DType::F64, false, 8), 1);
        }

        #[test]
        fn exact_means_the_same_bits() {
            assert_eq!(bad(&[3.0, -7.0], &[3.0, -7.0], DType::I32, true, 8), 0);
            assert_eq!(bad(&[3.0, -6.0], &[3.0, -7.0], DType::I32, true, 8), 1);
            // A movement kernel's floats: -0 is not +0, one ulp is a difference.
            assert_eq!(bad(&[-0.0], &[0.0], DType::F32, true, 8), 1);
            assert_eq!(bad(&[1.0 + f64::from(f32::EPSILON)], &[1.0], DType::F32, true, 8), 1);
            // Large integers that f64 cannot tell apart still differ.
            let (a, b) = ((1i64 << 60) + 1, 1i64 << 60);
            let ty = kiln_ir::TensorType::new(DType::I64, Shape::new(vec![1]).expect("shape"));
            let x = Tensor::new(ty.clone(), a.to_le_bytes().to_vec().into()).expect("tensor");
            let y = Tensor::new(ty, b.to_le_bytes().to_vec().into()).expect("tensor");
            assert_eq!(within(&x, &y, true, 8, 1, None).bad, 1);
            assert_eq!(within(&x, &x, true, 8, 1, None).bad, 0);
        }
    }
}
