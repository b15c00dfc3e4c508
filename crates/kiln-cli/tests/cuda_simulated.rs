//! Every CUDA kernel of every test model (`ref/manifest.json`), run by the host PTX
//! simulator (`ptxsim`) against the kernel interpreter: no GPU needed.
//!
//! Each model is compiled for the CUDA target; each dispatch's PTX entry runs on random
//! inputs (floats in [−2, 2), integers in −9..=9) over its launch's block and a grid of
//! at most [`MAX_BLOCKS`] blocks (whole clusters; a grid-stride kernel walks its tail),
//! stopping after about [`BUDGET`] simulated instructions (at a cluster's end). Every
//! element the reduced run wrote is compared with the interpreter's: integers and
//! non-float outputs exactly; floats within `2⁻¹⁶·|want| + (1 + L)·2⁻¹⁸`, where `L` is
//! the kernel's longest reduction (the emitters reassociate sums and use FMA and
//! `ex2/lg2/sin/cos.approx`; an index or predicate bug is off by far more). A kernel
//! whose interpretation costs more than [`INTERPRETED_WORK`] (output elements ×
//! reduction terms) is run without the comparison: every global and shared
//! access, barrier and shuffle is still checked. The counts are printed.
//!
//! The models of [`HALF_MODELS`] are also compiled at `--precision f16` and `bf16`
//! (named `model@f16`, `model@bf16`): their contractions of two half operands run the
//! tensor-core kernels (`mma.sync`, `ldmatrix`, `cp.async`, and Hopper's `wgmma`
//! through shared-memory descriptors, which the simulator models from the PTX ISA). A kernel writing half storage is compared within one more
//! unit in the last place of its type (`2⁻¹⁰` relative for f16, `2⁻⁷` for bf16, plus
//! the smallest subnormal): the emitter and the interpreter both compute in f32 and
//! round once to the storage type, so an f32 difference within the bound above can
//! move the rounded value by at most that unit more.
//!
//! Kernels the simulator finds wrong and whose fix is not landed are pinned in
//! [`KNOWN`] with their exact failure text, so a fix flips the test.

use kiln_compiler::Precision;
use kiln_ir::DType;

mod common;
use kiln_ptxsim as ptxsim;

use common::{compile_for_cuda, listed_models};

/// Most blocks a kernel runs in the simulator.
const MAX_BLOCKS: u32 = 4;
/// About the most instructions a kernel's simulation takes.
const BUDGET: u64 = 1 << 20;
/// Most interpreter work (output elements × reduction terms) a compared kernel may take.
const INTERPRETED_WORK: u64 = 1 << 22;

/// Models also checked at f16 and bf16 storage.
const HALF_MODELS: &[&str] = &["mlp", "lenet", "mobilenet_v2", "bert_tiny"];

/// `(model, kernel, failure text)`: failures the simulator finds that are not fixed yet.
///
/// The Window emitter (`cuda/window.rs`) takes kernels of f16/bf16 storage (lenet's
/// max pools at half precision) and reads and writes them as f32 (`ld.global.f32`,
/// `st.global.f32`, 4-byte strides), so the loads run past the input: it should
/// decline storage other than f32 (the general kernel converts) or convert in its
/// loads and stores.
const KNOWN: &[(&str, &str, &str)] = &[];

struct Job {
    model: String,
    index: usize,
    kernel: kiln_flow::Kernel,
    launch: ptxsim::Grid,
    /// A tensor-core kernel (`cuda::mma`).
    mma: bool,
}

#[test]
fn every_cuda_kernel_of_every_model_matches_the_interpreter_in_the_simulator() {
    let started = std::time::Instant::now();
    let mut jobs = Vec::new();
    let mut modules = Vec::new();
    let mut builds = Vec::new();
    for e in listed_models("manifest.json") {
        let model = e["name"].as_str().expect("name").to_string();
        if HALF_MODELS.contains(&model.as_str()) {
            builds.push((format!("{model}@f16"), Precision::F16, e.clone()));
            builds.push((format!("{model}@bf16"), Precision::BF16, e.clone()));
        }
        builds.push((model, Precision::F32, e));
    }
    let halves = builds.iter().filter(|b| b.1 != Precision::F32).count();
    assert_eq!(halves, 2 * HALF_MODELS.len(), "a model of {HALF_MODELS:?} is missing from the listing");
    for (name, precision, e) in builds {
        let c = compile_for_cuda(&e, precision).unwrap_or_else(|err| panic!("{name}: compile for cuda: {err}"));
        let cuda = c.cuda().expect("a CUDA module");
        let flow = c.flow().expect("flow");
        assert_eq!(cuda.launches.len(), flow.dispatches.len(), "{name}");
        for (index, (d, l)) in flow.dispatches.iter().zip(&cuda.launches).enumerate() {
            let grid = u32::try_from(l.grid).expect("a grid of u32 blocks");
            jobs.push((
                modules.len(),
                Job {
                    model: name.clone(),
                    index,
                    kernel: d.kernel.clone(),
                    launch: ptxsim::Grid { grid, block: l.block, shared: l.shared },
                    mma: ["contraction mma.sync", "contraction wgmma"].iter().any(|t| cuda.notes[index].starts_with(t)),
                },
            ));
        }
        modules.push(cuda.ptx().to_string());
    }
    let compiled = started.elapsed();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<(usize, Result<ptxsim::Outcome, String>)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some((m, job)) = jobs.get(j) else { break };
                        out.push((j, check(job, &modules[*m])));
                    }
                    out
                })
            })
            .collect();
        workers.into_iter().flat_map(|w| w.join().expect("a worker")).collect()
    });
    let mut failures = Vec::new();
    let mut known_seen = Vec::new();
    let (mut compared, mut run_only, mut partial, mut elements) = (0, 0, 0, 0usize);
    let (mut mma_compared, mut mma_run) = (0, 0);
    for (j, r) in results {
        let job = &jobs[j].1;
        match r {
            Ok(o) => {
                if o.compared > 0 {
                    compared += 1;
                    mma_compared += usize::from(job.mma);
                    elements += o.compared;
                } else {
                    run_only += 1;
                    mma_run += usize::from(job.mma);
                }
                partial += usize::from(o.partial);
            }
            Err(e) => {
                let known = KNOWN.iter().find(|(m, k, why)| *m == job.model && *k == job.kernel.name && e == *why);
                match known {
                    Some(k) => known_seen.push(*k),
                    None => failures.push(format!("{}: {e}", job.model)),
                }
            }
        }
    }
    eprintln!(
        "{} kernels: {compared} compared ({elements} elements), {run_only} run without the interpreter, {partial} \
         stopped at the budget, {} known failures; tensor-core kernels: {mma_compared} compared, {mma_run} run \
         without the interpreter; compile {:.1} s, all {:.1} s",
        jobs.len(),
        known_seen.len(),
        compiled.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    assert!(mma_compared > 0, "no tensor-core kernel of {HALF_MODELS:?} at half precision was compared");
    for k in KNOWN {
        assert!(known_seen.contains(k), "a KNOWN failure no longer fails (fixed? remove it): {k:?}");
    }
    failures.sort();
    assert!(failures.is_empty(), "{} kernels fail in the simulator:\n{}", failures.len(), failures.join("\n"));
}

fn check(job: &Job, ptx: &str) -> Result<ptxsim::Outcome, String> {
    let k = &job.kernel;
    let l = ptxsim::reduction_length(k);
    let work = ptxsim::interpretation_cost(k);
    // One more unit in the last place of half storage (see the module doc).
    let (ulp, tiny) = match k.output.dtype {
        DType::F16 => (2f64.powi(-10), 2f64.powi(-24)),
        DType::BF16 => (2f64.powi(-7), 2f64.powi(-133)),
        _ => (0.0, 0.0),
    };
    let c = ptxsim::Check {
        tol: ptxsim::Tol::Rel { rel: 2f64.powi(-16) + ulp, abs: (1 + l) as f64 * 2f64.powi(-18) + tiny },
        max_blocks: Some(MAX_BLOCKS),
        budget: Some(BUDGET),
        oracle: work <= INTERPRETED_WORK,
        ..ptxsim::Check::exact(job.index as u64 + 1)
    };
    ptxsim::check_against_interpreter(k, ptx, job.index, job.launch, &c)
}
