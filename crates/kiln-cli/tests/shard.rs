//! Tensor parallelism simulated on the CPU (`kiln compile --devices N`): a model sharded
//! over N CPU "devices" of one process — per-device dispatches, all-reduces (and
//! all-gathers) as plan commands — must compute what the unsharded compile computes.
//!
//! **Tolerance.** Sharding changes only the order of f32 additions: a row-parallel
//! product sums each device's K/N terms, then the all-reduce adds the N partial sums
//! (the unsharded kernel sums its K terms in its own blocked order). Both orders are
//! within γ_K·Σ|aᵢbᵢ| of the exact sum (γ_K ≈ K·2⁻²⁴), so one product differs by at most
//! 2·K·2⁻²⁴·Σ|aᵢbᵢ|: for bert_tiny's K ≤ 1024 with O(1) activations and weights that is
//! a few 1e-4 of Σ|aᵢbᵢ| in the worst case and ~√K·2⁻²⁴ (about 1e-6 relative) in the
//! usual case of errors that do not all have one sign. Every layer ends in a
//! LayerNormalization that keeps the values O(1) and does not amplify relative errors,
//! so outputs are compared within `1e-4·|x| + 1e-4`: well above the rounding noise
//! measured (the tests print the largest difference seen: 3.4e-6 relative for bert_tiny,
//! 7e-7 for bert_large_layer, on 2026-12-05), far below what a wrong
//! slice, a missing bias or a double-counted partial sum gives (errors of order 1).
//! Head-split attention changes no order: each head's scores, softmax and context are
//! computed whole on one device.

mod common;

use common::data_dir;
use kiln_compiler::{shard, CompileError, Input, Options};
use kiln_ir::op::{Op, OpKind};
use kiln_ir::{DType, Graph, Shape, Tensor, TensorType};
use kiln_module::program::Command;

/// Runs `artifact` on `threads` threads with `inputs`; the outputs.
fn run(artifact: &[u8], weights: Option<&[u8]>, inputs: &[Tensor], threads: usize) -> Vec<Vec<u8>> {
    let module = kiln_runtime::Module::load(artifact, weights).expect("load");
    let mut inst = kiln_runtime::Instance::with_threads(&module, threads).expect("instance");
    let sig = module.signature();
    let e = sig.entry(0).expect("entry");
    let mut outs: Vec<Vec<u8>> = e.outputs.iter().map(|t| vec![0u8; t.bytes as usize]).collect();
    let ins: Vec<&[u8]> = inputs.iter().map(|t| &t.bytes()[..]).collect();
    let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|o| &mut o[..]).collect();
    inst.invoke(&ins, &mut refs).expect("invoke");
    outs
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// The largest `|a − b| / (|b| + 1)` over the outputs; panics past the tolerance.
fn compare(what: &str, got: &[Vec<u8>], want: &[Vec<u8>]) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: output count");
    let mut worst = 0f64;
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        for (i, (a, b)) in f32s(g).iter().zip(f32s(w)).enumerate() {
            let (a, b) = (*a as f64, b as f64);
            assert!(a.is_finite(), "{what}: output {k} element {i} is {a}");
            assert!((a - b).abs() <= 1e-4 * b.abs() + 1e-4, "{what}: output {k} element {i}: {a}, unsharded {b}");
            worst = worst.max((a - b).abs() / (b.abs() + 1.0));
        }
    }
    worst
}

/// Compiles `g` unsharded and over each of `devices`, runs all of them on `inputs`
/// (the sharded plans on one thread and on two), checks the plans' structure with
/// `structure` and compares the outputs.
fn check_sharding(
    name: &str,
    g: &Graph,
    inputs: &[Tensor],
    devices: &[u32],
    structure: &dyn Fn(&shard::ShardedCompiled, u32),
) {
    let opts = Options { source: name.into(), ..Options::default() };
    let plain = kiln_compiler::compile(g, &opts).expect("unsharded compile");
    let want = run(&plain.artifact, plain.weights.as_deref(), inputs, 1);
    for &n in devices {
        let c = shard::compile(Input::Graph(g.clone()), &opts, n).unwrap_or_else(|e| panic!("{name} over {n}: {e}"));
        assert_eq!(c.program.devices.len(), n as usize, "{name}: device table");
        structure(&c, n);
        for threads in [1, 2] {
            let got = run(&c.artifact, c.weights.as_deref(), inputs, threads);
            let worst = compare(&format!("{name} over {n} devices, {threads} threads"), &got, &want);
            println!("{name}: {n} devices, {threads} threads: largest |Δ|/(|x|+1) = {worst:.2e}");
        }
    }
}

fn count(c: &shard::ShardedCompiled, f: fn(&Command) -> bool) -> usize {
    c.program.entries[0].commands.iter().filter(|x| f(x)).count()
}

/// An encoder's structure: every device dispatches, Q, K, V and the first product of
/// each MLP are split by columns, the attention output and the second MLP product by
/// rows, and every row-parallel product's partial sums meet in one all-reduce.
fn encoder_structure(c: &shard::ShardedCompiled, n: u32) {
    let e = &c.program.entries[0];
    for d in 0..n {
        assert!(
            e.commands.iter().any(|x| matches!(x, Command::Dispatch { device, .. } if *device == d)),
            "device {d} of {n} runs nothing"
        );
    }
    let reduces = count(c, |x| matches!(x, Command::AllReduce { .. }));
    assert!(reduces >= 2, "over {n}: {reduces} all-reduces");
    assert_eq!(reduces, c.cut.row_split.len(), "one all-reduce per row-parallel product");
    assert_eq!(c.cut.column_split.len(), 2 * c.cut.row_split.len(), "column splits");
    assert_eq!(count(c, |x| matches!(x, Command::AllGather { .. })), 0);
}

/// Seeded token ids below `g`'s vocabulary (its embedding table's rows).
/// The repository's test model `name` (`scripts/gen_models.py` makes it under the
/// test data; `scripts/test` runs it), imported.
fn test_model(name: &str) -> Graph {
    let path = data_dir().join(format!("models/{name}.onnx"));
    assert!(
        path.exists(),
        "{} is missing: run scripts/gen_models.py --out .cache/models --only {name} (scripts/test does)",
        path.display()
    );
    kiln_compiler::import(Input::File(path), &Default::default()).expect("import")
}

fn token_ids(g: &Graph) -> Tensor {
    let ty = g.ty(g.inputs[0]).clone();
    let vocab = g
        .nodes
        .iter()
        .find_map(|(_, n)| (n.op.kind == kiln_ir::OpKind::Gather).then(|| n.inputs[0]).flatten())
        .map(|v| g.ty(v).shape.dims()[0])
        .expect("an embedding table");
    let ids: Vec<i64> = (0..ty.shape.numel()).map(|i| ((i * 7919 + 13) % vocab) as i64).collect();
    Tensor::from_i64(DType::I64, ty.shape.clone(), &ids).expect("ids")
}

#[test]
fn bert_tiny_sharded_over_2_and_4_cpu_devices_matches_the_unsharded_compile() {
    let g = test_model("bert_tiny");
    let input = token_ids(&g);
    check_sharding("bert_tiny", &g, &[input], &[2, 4], &encoder_structure);
}

#[test]
fn a_hidden_1024_encoder_layer_sharded_over_2_and_4_cpu_devices_matches_the_unsharded_compile() {
    // scripts/gen_models.py --only bert_large_layer (scripts/test builds it): hidden
    // 1024, 16 heads, FFN 4096, 16 positions, one layer. K is at most 4096 here, so the
    // worst-case bound of the module docs is four times bert_tiny's; the differences
    // measured (under 1e-6 relative) sit two orders below the tolerance.
    let g = test_model("bert_large_layer");
    let input = token_ids(&g);
    check_sharding("bert_large_layer", &g, &[input], &[2, 4], &encoder_structure);
}

#[test]
fn malformed_sharding_requests_are_typed_errors() {
    let g = test_model("bert_tiny");
    let opts = Options::default();
    let err = shard::compile(Input::Graph(g.clone()), &opts, 0).expect_err("zero devices");
    assert!(matches!(err, CompileError::Shard(shard::ShardError::NoDevices)), "{err:?}");
    assert_eq!(err.kind(), kiln_compiler::ErrorKind::InvalidInput);
    // 256 columns (and 4 heads) over 3 devices.
    let err = shard::compile(Input::Graph(g.clone()), &opts, 3).expect_err("three devices");
    match &err {
        CompileError::Shard(shard::ShardError::Indivisible { extent, devices: 3, node, .. }) => {
            assert!(*extent == 256 || *extent == 1024 || *extent == 4, "{err}");
            assert!(!node.is_empty(), "{err}");
        }
        _ => panic!("{err:?}"),
    }
    assert_eq!(err.kind(), kiln_compiler::ErrorKind::InvalidInput);
    // 4 heads over 8 devices: the columns divide (256 / 8) but the heads do not.
    let err = shard::compile(Input::Graph(g.clone()), &opts, 8).expect_err("eight devices");
    assert!(
        matches!(
            &err,
            CompileError::Shard(shard::ShardError::Indivisible { what: "heads", extent: 4, devices: 8, .. })
        ),
        "{err:?}"
    );
    // The CUDA target refuses several devices: NCCL is not built.
    let cuda = Options { device: kiln_compiler::TargetDevice::Cuda, ..Options::default() };
    let err = shard::compile(Input::Graph(g), &cuda, 2).expect_err("cuda");
    assert!(matches!(err, CompileError::MultiGpu { devices: 2 }), "{err:?}");
    assert_eq!(err.kind(), kiln_compiler::ErrorKind::Unsupported);
}

#[test]
fn an_all_gathered_output_runs_on_the_cpu_runtime() {
    // A vocabulary-parallel output layer: MatMul(x, W) split by columns, Tanh on each
    // device's columns, the columns all-gathered into the output.
    let mut g = Graph::new("logits");
    let f = |d: &[usize]| TensorType::new(DType::F32, Shape::new(d.to_vec()).expect("shape"));
    let x = g.add_input("x", f(&[3, 40]));
    let w: Vec<f32> = (0..40 * 24).map(|i| ((i * 37 % 101) as f32 - 50.0) / 100.0).collect();
    let w = g.add_const("w", Tensor::from_vec(Shape::new(vec![40, 24]).expect("s"), w).expect("w"));
    let (_, y) = g.add_node("logits", Op::new(OpKind::MatMul), vec![Some(x), Some(w)], vec![("y".into(), f(&[3, 24]))]);
    let (_, t) = g.add_node("tanh", Op::new(OpKind::Tanh), vec![Some(y[0])], vec![("t".into(), f(&[3, 24]))]);
    g.outputs.push(t[0]);
    let xs: Vec<f32> = (0..120).map(|i| ((i * 53 % 97) as f32 - 48.0) / 50.0).collect();
    let input = Tensor::from_vec(Shape::new(vec![3, 40]).expect("s"), xs).expect("x");
    check_sharding("logits", &g, &[input], &[2, 3, 4], &|c, n| {
        assert_eq!(count(c, |x| matches!(x, Command::AllGather { .. })), 1, "over {n}");
        assert_eq!(count(c, |x| matches!(x, Command::AllReduce { .. })), 0, "over {n}");
    });
}

#[test]
fn kiln_compile_devices_and_inspect_show_per_device_commands_and_collectives() {
    let model = data_dir().join("models/bert_tiny.onnx");
    let m = common::s(&model);
    let dir = common::scratch("shard", "cli");
    let out = dir.join("bert_tiny_x2.kiln");
    let (ok, _, err) = common::kiln(&["compile", m, "--devices", "2", "-o", common::s(&out)]);
    assert!(ok, "{err}");
    assert!(err.contains("2 devices") && err.contains("4 all-reduces"), "{err}");
    let listing = common::ok(&["inspect", common::s(&out)]);
    // (Collectives came with format 1.4; a newer writer writes its own version, the
    // newest but the one only programs with bounded input dimensions need.)
    let format = format!("format {}", kiln_module::format::STATIC_FORMAT_VERSION);
    assert!(listing.contains(&format), "{listing}");
    assert!(listing.contains("devices: 2 (cpu:0, cpu:1)"), "{listing}");
    for d in ["cpu:0", "cpu:1"] {
        assert!(listing.contains(&format!(") on {d} x")), "no dispatch on {d}:\n{listing}");
    }
    assert_eq!(listing.matches("all-reduce sum f32 over 2 devices").count(), 4, "{listing}");
    assert!(listing.contains("              cpu:1: arena"), "{listing}");
    let json = common::ok(&["inspect", common::s(&out), "--json"]);
    assert_eq!(json.matches("\"op\":\"all-reduce\"").count(), 4, "{json}");
    // The per-device graphs.
    let text = common::ok(&["compile", m, "--devices", "2", "--to", "tensor"]);
    assert!(text.starts_with("sharded over 2 devices, 5 stages"), "{}", &text[..text.len().min(200)]);
    assert!(text.contains("stage 0 device 1:") && text.contains("collective all-reduce sum of"), "{text:.2000}");
    // Bad requests: one line, a typed error.
    common::fails_with(&["compile", m, "--devices", "0", "-o", common::s(&out)], &["cannot shard over 0 devices"]);
    common::fails_with(&["compile", m, "--devices", "3", "-o", common::s(&out)], &["do not divide over 3 devices"]);
    common::fails_with(
        &["compile", m, "--devices", "2", "--target", "cuda", "-o", common::s(&out)],
        &["NCCL", "not built yet"],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
