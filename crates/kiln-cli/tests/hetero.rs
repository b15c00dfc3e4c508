//! Heterogeneous plans (`kiln compile --devices cpu,cuda`, format 1.8): a model placed
//! over two devices — per-device segments, transfers between the devices' arenas, and
//! cross-device waits — must compute what the single-device compile of the same model
//! computes.
//!
//! On this (CPU-only) machine the second device is a CPU device (`--devices cpu,cpu`)
//! with its own arena, driven by the runtime's deferred CPU queue: its segments run
//! only when the host waits for them or at the end of the call, as a GPU stream runs
//! behind the host's back. The plan's transfers and waits are therefore exercised as
//! they are on a GPU, and a plan missing a wait reads stale memory (tested below).
//! The same test on the CUDA device is `split_mlp_on_cuda_matches_the_cpu` (ignored
//! without a driver; `cargo test -p kiln-cli --test hetero -- --ignored` on a GPU host).
//!
//! **Tolerance.** Each segment is compiled by the same pipeline as the single-device
//! plan, so its kernels sum in the same order: the outputs are expected bit-equal on
//! the CPU, and compared within `1e-5·|x| + 1e-6` (the tests print the largest
//! difference) so that a kernel choice that differs per segment (a smaller graph may
//! tile a product differently) stays a pass while a wrong transfer (errors of order 1)
//! fails. On CUDA the GPU's kernels sum in another order than the CPU's: `1e-4`.

mod common;
#[cfg(feature = "cuda")]
#[path = "../../kiln-codegen/tests/ptxas/mod.rs"]
mod ptxas_bin;
use common::data_dir;
use kiln_compiler::placement::{self, Rule};
use kiln_compiler::{hetero, CompileError, Input, Options};
use kiln_ir::op::{Op, OpKind};
use kiln_ir::{DType, Graph, Shape, Tensor, TensorType};
use kiln_module::program::{Binding, Command, DeviceKind, Program, Slot};

fn run(artifact: &[u8], inputs: &[Vec<u8>], threads: usize) -> Vec<Vec<u8>> {
    let module = kiln_runtime::Module::load(artifact, None).expect("load");
    let mut inst = kiln_runtime::Instance::with_threads(&module, threads).expect("instance");
    let sig = module.signature();
    let e = sig.entry(0).expect("entry");
    let mut outs: Vec<Vec<u8>> = e.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    let ins: Vec<&[u8]> = inputs.iter().map(|t| &t[..]).collect();
    let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
    inst.invoke(&ins, &mut refs).expect("invoke");
    outs
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The largest `|a − b| / (|b| + 1)`, or `None` where an element is past the tolerance.
fn worst(got: &[Vec<u8>], want: &[Vec<u8>], rel: f64) -> Option<f64> {
    assert_eq!(got.len(), want.len(), "output count");
    let mut worst = 0f64;
    for (g, w) in got.iter().zip(want) {
        for (a, b) in f32s(g).iter().zip(f32s(w)) {
            let (a, b) = (*a as f64, b as f64);
            if !a.is_finite() || (a - b).abs() > rel * b.abs() + rel / 10.0 {
                return None;
            }
            worst = worst.max((a - b).abs() / (b.abs() + 1.0));
        }
    }
    Some(worst)
}

/// A deterministic input of `bytes` bytes of f32 in [-1, 1).
fn input(bytes: u64) -> Vec<u8> {
    (0..bytes / 4).flat_map(|i| (((i * 7919 % 2003) as f32 / 1001.5) - 1.0).to_le_bytes()).collect()
}

fn mlp() -> std::path::PathBuf {
    data_dir().join("models/mlp.onnx")
}

/// mlp.onnx (Gemm → Relu → Gemm → Relu → Gemm → Softmax) with its products on device 1
/// and the rest on the host: every Gemm's operand goes over and its result comes back.
fn split_mlp(kinds: &[DeviceKind]) -> hetero::HeteroCompiled {
    let rules = [
        Rule { op: OpKind::Gemm, device: 1 },
        Rule { op: OpKind::Relu, device: 0 },
        Rule { op: OpKind::Softmax, device: 0 },
    ];
    let opts = Options { source: "mlp".into(), ..Options::default() };
    hetero::compile(Input::File(mlp()), &opts, kinds, &rules).expect("heterogeneous compile")
}

fn single_mlp() -> (Vec<u8>, Vec<Vec<u8>>) {
    let opts = Options { source: "mlp".into(), ..Options::default() };
    let plain = kiln_compiler::Compilation::new(Input::File(mlp()), opts).finish().expect("single-device compile");
    let ins: Vec<Vec<u8>> = plain.program.entries[0].inputs.iter().map(|t| input(t.bytes)).collect();
    (plain.artifact, ins)
}

fn count(p: &Program, f: impl Fn(&Command) -> bool) -> usize {
    p.entries[0].commands.iter().filter(|c| f(c)).count()
}

#[test]
fn split_mlp_matches_the_single_device_plan() {
    let (plain, ins) = single_mlp();
    let want = run(&plain, &ins, 1);
    let c = split_mlp(&[DeviceKind::Cpu, DeviceKind::Cpu]);
    let p = &c.program;
    assert_eq!(p.devices.len(), 2);
    assert_eq!(p.entries[0].device_arenas.len(), 1);
    // Three products on device 1, two Relus and the Softmax on the host.
    let on = |d: u32| count(p, |x| matches!(x, Command::Dispatch { device, .. } if *device == d));
    assert_eq!((on(0), on(1)), (3, 3), "dispatches per device");
    // Every product pulls its operand from the host; every Relu and the Softmax pull
    // the product's result back: six transfers, each host segment waiting for the
    // device segment before it.
    assert_eq!(count(p, |x| matches!(x, Command::Transfer { .. })), 6);
    let waits = segment_waits(p);
    for (s, (d, w)) in waits.iter().enumerate() {
        if *d == 0 && s > 0 && s < 6 {
            assert_eq!(w, &vec![s as u32 - 1], "host segment {s} waits for the device segment before it");
        }
    }
    assert!(c.artifact.len() > 10, "artifact written");
    for threads in [1, 2] {
        let got = run(&c.artifact, &ins, threads);
        let w = worst(&got, &want, 1e-5).expect("the split plan's outputs match the single-device plan's");
        println!("mlp over cpu,cpu on {threads} threads: largest |Δ|/(|x|+1) = {w:.2e}");
    }
}

#[test]
fn a_plan_without_its_waits_reads_stale_memory() {
    // The deferred device runs a segment only when waited for: drop the waits and the
    // host reads device memory before anything was computed there. This is what makes
    // the test above a test of the waits.
    let (plain, ins) = single_mlp();
    let want = run(&plain, &ins, 1);
    let c = split_mlp(&[DeviceKind::Cpu, DeviceKind::Cpu]);
    let mut p = c.program.clone();
    for x in &mut p.entries[0].commands {
        if let Command::Segment { waits, .. } = x {
            waits.clear();
        }
    }
    let got = run(&kiln_module::sections::write_program(&p), &ins, 1);
    assert!(worst(&got, &want, 1e-5).is_none(), "without waits the outputs should be wrong");
}

/// A graph of two independent branches joined by an Add: `relu(x·A)` on the host and
/// `sigmoid(x·B)` on device 1 land in the same stage, with no wait between them.
fn branches() -> (Graph, Vec<u8>) {
    let mut g = Graph::new("branches");
    let f = |d: &[usize]| TensorType::new(DType::F32, Shape::new(d.to_vec()).expect("shape"));
    let x = g.add_input("x", f(&[4, 32]));
    let w = |g: &mut Graph, name: &str, k: usize| {
        let v: Vec<f32> = (0..32 * 16).map(|i| ((i * k % 89) as f32 - 44.0) / 60.0).collect();
        g.add_const(name, Tensor::from_vec(Shape::new(vec![32, 16]).expect("s"), v).expect("w"))
    };
    let a = w(&mut g, "a", 31);
    let b = w(&mut g, "b", 17);
    let (_, xa) = g.add_node("xa", Op::new(OpKind::MatMul), vec![Some(x), Some(a)], vec![("xa".into(), f(&[4, 16]))]);
    let (_, r) = g.add_node("relu", Op::new(OpKind::Relu), vec![Some(xa[0])], vec![("r".into(), f(&[4, 16]))]);
    let (_, xb) = g.add_node("xb", Op::new(OpKind::Tanh), vec![Some(x)], vec![("t".into(), f(&[4, 32]))]);
    let (_, xb) =
        g.add_node("xbb", Op::new(OpKind::MatMul), vec![Some(xb[0]), Some(b)], vec![("xb".into(), f(&[4, 16]))]);
    let (_, s) = g.add_node("sig", Op::new(OpKind::Sigmoid), vec![Some(xb[0])], vec![("s".into(), f(&[4, 16]))]);
    let (_, y) = g.add_node("add", Op::new(OpKind::Add), vec![Some(r[0]), Some(s[0])], vec![("y".into(), f(&[4, 16]))]);
    g.outputs.push(y[0]);
    let xs: Vec<f32> = (0..128).map(|i| ((i * 53 % 97) as f32 - 48.0) / 50.0).collect();
    (g, xs.iter().flat_map(|v| v.to_le_bytes()).collect())
}

#[test]
fn independent_branches_run_in_one_stage_on_both_devices() {
    let (g, x) = branches();
    let opts = Options { source: "branches".into(), ..Options::default() };
    let plain = kiln_compiler::compile(&g, &opts).expect("single-device compile");
    let want = run(&plain.artifact, std::slice::from_ref(&x), 1);
    let rules = [Rule { op: OpKind::Tanh, device: 1 }, Rule { op: OpKind::Sigmoid, device: 1 }];
    let c = hetero::compile(Input::Graph(g), &opts, &[DeviceKind::Cpu, DeviceKind::Cpu], &rules).expect("compile");
    // Stage 0: the host's branch and device 1's branch; stage 1: the Add on the host.
    let stages: Vec<(usize, u32)> = c.cut.segments.iter().map(|s| (s.stage, s.device)).collect();
    assert_eq!(stages, vec![(0, 0), (0, 1), (1, 0)], "segments (stage, device)");
    let segs = segment_waits(&c.program);
    // Device 1's branch first (the host submits it, then runs its own branch while
    // device 1 runs), neither waiting; the Add waits for device 1's segment.
    assert_eq!(segs[0], (1, vec![]));
    assert_eq!(segs[1], (0, vec![]));
    assert_eq!(segs[2], (0, vec![0]));
    let got = run(&c.artifact, std::slice::from_ref(&x), 1);
    let w = worst(&got, &want, 1e-5).expect("branches: outputs match");
    println!("branches over cpu,cpu: largest |Δ|/(|x|+1) = {w:.2e}");
}

#[test]
fn the_cost_model_keeps_small_work_on_the_host_and_large_products_on_the_gpu() {
    // No rules: mlp's products are small (1×784·784×512): the GPU's launch and the
    // transfers cost more than they save, so everything stays on the host.
    let opts = Options { source: "mlp".into(), ..Options::default() };
    let mut c = kiln_compiler::Compilation::new(Input::File(mlp()), opts.clone());
    c.run_to(kiln_compiler::Stage::TensorPasses).expect("tensor passes");
    let g = c.graph().expect("graph");
    let p = placement::place(g, &[DeviceKind::Cpu, DeviceKind::Cuda], &[]).expect("place");
    assert!(p.device.iter().all(|&d| d == 0), "{:?}", p.device);
    // A 1024×1024×1024 product is 1e9 multiply-adds: 10 ms on the CPU model, far less
    // on the GPU with its transfers: it goes to the GPU.
    let mut g = Graph::new("big");
    let f = |d: &[usize]| TensorType::new(DType::F32, Shape::new(d.to_vec()).expect("shape"));
    let x = g.add_input("x", f(&[1024, 1024]));
    let w = g.add_const("w", Tensor::zeros(f(&[1024, 1024])));
    let (_, y) =
        g.add_node("mm", Op::new(OpKind::MatMul), vec![Some(x), Some(w)], vec![("y".into(), f(&[1024, 1024]))]);
    g.outputs.push(y[0]);
    let p = placement::place(&g, &[DeviceKind::Cpu, DeviceKind::Cuda], &[]).expect("place");
    assert_eq!(p.device, vec![1]);
}

#[test]
fn device_lists_and_rules_are_checked() {
    use placement::{parse_devices, parse_rule};
    assert_eq!(parse_devices("cpu,cuda").expect("ok"), vec![DeviceKind::Cpu, DeviceKind::Cuda]);
    for bad in ["cuda,cpu", "cpu", "cpu,tpu", "cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu,cpu"] {
        let e = parse_devices(bad).expect_err(bad);
        assert!(matches!(e, CompileError::Placement(_)), "{bad}: {e:?}");
        assert_eq!(e.kind(), kiln_compiler::ErrorKind::InvalidInput);
    }
    let kinds = [DeviceKind::Cpu, DeviceKind::Cuda];
    assert_eq!(parse_rule("Softmax=cpu", &kinds).expect("ok"), Rule { op: OpKind::Softmax, device: 0 });
    assert_eq!(parse_rule("MatMul=cuda", &kinds).expect("ok"), Rule { op: OpKind::MatMul, device: 1 });
    assert_eq!(parse_rule("Gemm=1", &kinds).expect("ok"), Rule { op: OpKind::Gemm, device: 1 });
    for bad in ["Softmax", "Nope=cpu", "Gemm=2", "Gemm=tpu"] {
        assert!(matches!(parse_rule(bad, &kinds), Err(CompileError::Placement(_))), "{bad}");
    }
    let cpu_only = [DeviceKind::Cpu, DeviceKind::Cpu];
    assert!(parse_rule("Gemm=cuda", &cpu_only).is_err(), "no cuda device in the list");
}

/// The split mlp's program with `edit` applied, verified: the error's text.
fn verify_edited(edit: impl Fn(&mut Program)) -> String {
    let c = split_mlp(&[DeviceKind::Cpu, DeviceKind::Cpu]);
    let mut p = c.program;
    edit(&mut p);
    let bytes = kiln_module::sections::write_program(&p);
    match kiln_runtime::Module::verify_plan(&bytes) {
        Ok(_) => panic!("the edited plan verified"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_verifier_refuses_malformed_heterogeneous_plans() {
    // A wait on a later segment (a cycle a queue could never leave).
    let e = verify_edited(|p| {
        if let Some(Command::Segment { waits, .. }) = p.entries[0].commands.first_mut() {
            waits.push(3);
        }
    });
    assert!(e.contains("waits for segment 3, not an earlier one"), "{e}");
    // A command outside every segment.
    let e = verify_edited(|p| {
        p.entries[0].commands.remove(0);
    });
    assert!(e.contains("outside every segment"), "{e}");
    // A segment running past the end.
    let e = verify_edited(|p| {
        let n = p.entries[0].commands.len() as u32;
        if let Some(Command::Segment { count, .. }) = p.entries[0].commands.first_mut() {
            *count = n;
        }
    });
    assert!(e.contains("a segment of"), "{e}");
    // Device arenas not one per device after the host.
    let e = verify_edited(|p| p.entries[0].device_arenas.push(64));
    assert!(e.contains("device arenas"), "{e}");
    // A device binding past its own (small) arena.
    let e = verify_edited(|p| p.entries[0].device_arenas[0] = 64);
    assert!(e.contains("run past"), "{e}");
    // A transfer into an output named for device 1: outputs are the host's.
    let e = verify_edited(|p| {
        for x in &mut p.entries[0].commands {
            if let Command::Transfer { dst_device: 1, dst, .. } = x {
                *dst = Binding { slot: Slot::Output(0), offset: 0, length: dst.length };
                break;
            }
        }
    });
    assert!(e.contains("inputs and outputs are the host's"), "{e}");
    // A transfer into device 1 after the segment's work (a GPU queues transfers in
    // before the segment's graph).
    let e = verify_edited(|p| {
        let c = &mut p.entries[0].commands;
        if let Some(i) = c.iter().position(|x| matches!(x, Command::Transfer { dst_device: 1, .. })) {
            let t = c.remove(i);
            let end = i + c[i..].iter().position(|x| matches!(x, Command::Segment { .. })).unwrap_or(c.len() - i);
            c.insert(end, t);
        }
    });
    assert!(e.contains("a transfer into a segment's device after its work"), "{e}");
    // A dispatch of device 1 in a host segment.
    let e = verify_edited(|p| {
        for x in &mut p.entries[0].commands {
            if let Command::Dispatch { device, .. } = x {
                if *device == 0 {
                    *device = 1;
                    break;
                }
            }
        }
    });
    assert!(e.contains("a dispatch on device 1 in a segment of device 0"), "{e}");
}

#[test]
fn kiln_compile_devices_kinds_runs_and_inspect_shows_affinity() {
    let m = common::s(&mlp()).to_string();
    let dir = common::scratch("hetero", "cli");
    let out = dir.join("mlp_split.kiln");
    let (ok, _, err) = common::kiln(&[
        "compile",
        &m,
        "--devices",
        "cpu,cpu",
        "--place",
        "Gemm=1",
        "--place",
        "Relu=cpu",
        "--place",
        "Softmax=0",
        "-o",
        common::s(&out),
    ]);
    assert!(ok, "{err}");
    assert!(err.contains("6 transfers") && err.contains("cpu:1: 3 dispatches"), "{err}");
    let listing = common::ok(&["inspect", common::s(&out)]);
    assert!(listing.contains("segment on cpu:1") && listing.contains("transfer cpu:0:in0+0 -> cpu:1:"), "{listing}");
    let json = common::ok(&["inspect", common::s(&out), "--json"]);
    assert!(json.contains("\"affinity\":\"cpu:1\"") && json.contains("\"op\":\"segment\""), "{json}");
    let dot = common::ok(&["inspect", common::s(&out), "--dispatch-graph"]);
    assert!(dot.contains("fillcolor=palegreen") && dot.contains("style=dashed"), "{dot}");
    let run = common::ok(&["run", common::s(&out)]);
    assert!(run.contains("output: f32[1,10]"), "{run}");
    // A number keeps its meaning (tensor-parallel shards); --place needs a kind list.
    let (ok, _, err) = common::kiln(&["compile", &m, "--place", "Gemm=cpu", "-o", common::s(&out)]);
    assert!(!ok && err.contains("--place needs --devices"), "{err}");
    let (ok, _, err) = common::kiln(&["compile", &m, "--devices", "cuda,cpu", "-o", common::s(&out)]);
    assert!(!ok && err.contains("must be cpu"), "{err}");
}

/// mlp split over cpu,cuda (products on the GPU), every PTX kernel assembled by ptxas
/// for sm_90a (a refusal is a compile error): the GPU segments' kernels carry PTX and
/// a cubin, the host's CPU code only.
#[cfg(feature = "cuda")]
fn split_mlp_for_cuda() -> hetero::HeteroCompiled {
    let rules = [
        Rule { op: OpKind::Gemm, device: 1 },
        Rule { op: OpKind::Relu, device: 0 },
        Rule { op: OpKind::Softmax, device: 0 },
    ];
    let opts = Options { source: "mlp".into(), ptxas: Some(ptxas_bin::ptxas()), ..Options::default() };
    let kinds = [DeviceKind::Cpu, DeviceKind::Cuda];
    hetero::compile(Input::File(mlp()), &opts, &kinds, &rules).expect("cpu,cuda compile (every kernel through ptxas)")
}

#[cfg(feature = "cuda")]
#[test]
fn split_mlp_for_cuda_assembles_every_kernel_and_needs_a_driver_to_run() {
    let c = split_mlp_for_cuda();
    let p = &c.program;
    assert_eq!(p.devices[1].kind, DeviceKind::Cuda);
    assert_eq!(p.devices[1].name, "cuda:0");
    let mut gpu = 0;
    for x in &p.entries[0].commands {
        let Command::Dispatch { kernel, device, .. } = x else { continue };
        let kinds: Vec<(DeviceKind, u64)> = p.kernels[*kernel as usize]
            .variants
            .iter()
            .map(|v| (p.executables[v.executable as usize].device, p.executables[v.executable as usize].features))
            .collect();
        if *device == 1 {
            gpu += 1;
            // The cubin ptxas made, and the PTX it came from.
            assert!(kinds.iter().all(|k| k.0 == DeviceKind::Cuda), "{kinds:?}");
            assert!(kinds.iter().any(|k| k.1 & kiln_module::program::CUDA_CUBIN_SM90A != 0), "{kinds:?}: no cubin");
        } else {
            assert!(kinds.iter().all(|k| k.0 == DeviceKind::Cpu), "{kinds:?}");
        }
    }
    assert_eq!(gpu, 3, "the three products on the GPU");
    // The CPU runtime loads it (the GPU's kernels are not CPU code) and builds the CUDA
    // queue at instantiation: without a driver, the typed error.
    let module = kiln_runtime::Module::load(&c.artifact, None).expect("the CPU runtime loads a cpu,cuda plan");
    match kiln_runtime::cuda::driver_present() {
        Err(_) => {
            let e = kiln_runtime::Instance::new(&module).expect_err("no driver");
            assert!(e.to_string().contains("no CUDA driver"), "{e}");
        }
        Ok(()) => {
            kiln_runtime::Instance::new(&module).expect("an instance on the GPU machine");
        }
    }
    // The CUDA driver alone refuses it: its host is a CPU.
    assert!(kiln_runtime::cuda::CudaModule::load(&c.artifact, None).is_err());
}

/// Median and p99 of `f`'s time over `n` calls, in microseconds.
#[cfg(feature = "cuda")]
fn time_us(n: usize, mut f: impl FnMut()) -> (f64, f64) {
    let mut t: Vec<f64> = (0..n)
        .map(|_| {
            let s = std::time::Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[n / 2], t[(n * 99 / 100).min(n - 1)])
}

/// On a GPU host: the cpu,cuda split of mlp (products on the GPU, the rest on the CPU,
/// transfers and waits between) and matmul1024 (the cost model alone places its
/// product on the GPU) compute what the CPU's single-device plans compute, within the
/// f32 summation-order tolerance (the GPU's products sum in another order: 1e-4).
/// Prints per-plan timings (median, p99 of 50 calls, interleaved) for docs/targets.md.
/// `cargo test -p kiln-cli --test hetero -- --ignored --nocapture`
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA driver (scripts/gpu-test)"]
fn split_mlp_on_cuda_matches_the_cpu() {
    kiln_runtime::cuda::driver_present().expect("a CUDA driver");
    let (plain, ins) = single_mlp();
    let want = run(&plain, &ins, 1);
    let c = split_mlp_for_cuda();
    let got = run(&c.artifact, &ins, 2);
    let w = worst(&got, &want, 1e-4).expect("mlp over cpu,cuda matches the CPU plan");
    println!("mlp over cpu,cuda: largest |Δ|/(|x|+1) = {w:.2e}");
    // matmul1024, placed by the cost model alone.
    let path = data_dir().join("models/matmul1024.onnx");
    let opts = Options { source: "matmul1024".into(), ptxas: Some(ptxas_bin::ptxas()), ..Options::default() };
    let big = hetero::compile(Input::File(path.clone()), &opts, &[DeviceKind::Cpu, DeviceKind::Cuda], &[])
        .expect("matmul1024 over cpu,cuda");
    assert!(big.cut.placement.device.contains(&1), "the cost model keeps matmul1024 off the GPU");
    let single = kiln_compiler::Compilation::new(Input::File(path), Options::default()).finish().expect("cpu compile");
    let big_ins: Vec<Vec<u8>> = single.program.entries[0].inputs.iter().map(|t| input(t.bytes)).collect();
    let want = run(&single.artifact, &big_ins, 2);
    let got = run(&big.artifact, &big_ins, 2);
    let w = worst(&got, &want, 1e-4).expect("matmul1024 over cpu,cuda matches the CPU plan");
    println!("matmul1024 over cpu,cuda: largest |Δ|/(|x|+1) = {w:.2e}");
    // Timings, interleaved: each plan on 2 threads, one call of each in turn.
    let plans: [(&str, &[u8], &[Vec<u8>]); 4] = [
        ("mlp cpu", &plain, &ins),
        ("mlp cpu,cuda", &c.artifact, &ins),
        ("matmul1024 cpu", &single.artifact, &big_ins),
        ("matmul1024 cpu,cuda", &big.artifact, &big_ins),
    ];
    let modules: Vec<kiln_runtime::LoadedModule> =
        plans.iter().map(|(_, a, _)| kiln_runtime::Module::load(a, None).expect("load")).collect();
    let mut insts: Vec<kiln_runtime::Instance> =
        modules.iter().map(|m| kiln_runtime::Instance::with_threads(m, 2).expect("instance")).collect();
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); plans.len()];
    for _ in 0..50 {
        for (k, ((_, _, ins), inst)) in plans.iter().zip(&mut insts).enumerate() {
            let sig = modules[k].signature();
            let mut outs: Vec<Vec<u8>> =
                sig.entry(0).expect("entry").outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
            let refs: Vec<&[u8]> = ins.iter().map(|t| &t[..]).collect();
            let mut o: Vec<&mut [u8]> = outs.iter_mut().map(|x| &mut x[..]).collect();
            let (t, _) = time_us(1, || inst.invoke(&refs, &mut o).expect("invoke"));
            samples[k].push(t);
        }
    }
    for ((name, _, _), s) in plans.iter().zip(&mut samples) {
        s.sort_by(f64::total_cmp);
        println!("{name:<22} median {:>9.1} us  p99 {:>9.1} us", s[s.len() / 2], s[s.len() * 99 / 100]);
    }
}

/// Each `segment` command of `p`'s plan: its device and the segments it waits for.
fn segment_waits(p: &Program) -> Vec<(u32, Vec<u32>)> {
    p.entries[0]
        .commands
        .iter()
        .filter_map(|x| match x {
            Command::Segment { device, waits, .. } => Some((*device, waits.clone())),
            _ => None,
        })
        .collect()
}
