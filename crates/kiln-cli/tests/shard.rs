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
use kiln_ir::{DType, Graph, Tensor};

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
/// (the sharded plans on one thread and on two), checks the plans' structure and
/// compares the outputs.
fn check_sharding(name: &str, g: &Graph, inputs: &[Tensor], devices: &[u32], expect_heads: bool) {
    let opts = Options { source: name.into(), ..Options::default() };
    let plain = kiln_compiler::compile(g, &opts).expect("unsharded compile");
    let want = run(&plain.artifact, plain.weights.as_deref(), inputs, 1);
    for &n in devices {
        let c = shard::compile(Input::Graph(g.clone()), &opts, n).unwrap_or_else(|e| panic!("{name} over {n}: {e}"));
        let p = &c.program;
        assert_eq!(p.devices.len(), n as usize, "{name}: device table");
        let e = &p.entries[0];
        // Every device dispatches, and partial sums meet in all-reduces.
        for d in 0..n {
            assert!(
                e.commands.iter().any(|c| matches!(c, kiln_module::program::Command::Dispatch { device, .. } if *device == d)),
                "{name}: device {d} of {n} runs nothing"
            );
        }
        let reduces =
            e.commands.iter().filter(|c| matches!(c, kiln_module::program::Command::AllReduce { .. })).count();
        assert!(reduces >= 2, "{name} over {n}: {reduces} all-reduces");
        assert_eq!(reduces, c.sharded.row_split.len(), "{name}: one all-reduce per row-parallel product");
        if expect_heads {
            // Q, K, V and the first product of each MLP are split by columns.
            assert_eq!(c.sharded.column_split.len(), 4 * c.sharded.row_split.len() / 2, "{name}: column splits");
        }
        for threads in [1, 2] {
            let got = run(&c.artifact, c.weights.as_deref(), inputs, threads);
            let worst = compare(&format!("{name} over {n} devices, {threads} threads"), &got, &want);
            println!("{name}: {n} devices, {threads} threads: largest |Δ|/(|x|+1) = {worst:.2e}");
        }
    }
}

#[test]
fn bert_tiny_sharded_over_2_and_4_cpu_devices_matches_the_unsharded_compile() {
    let path = data_dir().join("models/bert_tiny.onnx");
    assert!(path.exists(), "{} is missing: run scripts/gen_models.py (scripts/test does)", path.display());
    let g = kiln_compiler::import(Input::File(path), &Default::default()).expect("import");
    let input = token_ids(&g);
    check_sharding("bert_tiny", &g, &[input], &[2, 4], true);
}

/// Seeded token ids below `g`'s vocabulary (its embedding table's rows).
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
fn a_hidden_1024_encoder_layer_sharded_over_2_and_4_cpu_devices_matches_the_unsharded_compile() {
    // scripts/gen_models.py --only bert_large_layer (scripts/test builds it): hidden
    // 1024, 16 heads, FFN 4096, 16 positions, one layer. K is at most 4096 here, so the
    // worst-case bound of the module docs is four times bert_tiny's; the differences
    // measured (under 1e-6 relative) sit two orders below the tolerance.
    let path = data_dir().join("models/bert_large_layer.onnx");
    assert!(
        path.exists(),
        "{} is missing: run scripts/gen_models.py --out .cache/models --only bert_large_layer (scripts/test does)",
        path.display()
    );
    let g = kiln_compiler::import(Input::File(path), &Default::default()).expect("import");
    let input = token_ids(&g);
    check_sharding("bert_large_layer", &g, &[input], &[2, 4], true);
}

#[test]
fn malformed_sharding_requests_are_typed_errors() {
    let path = data_dir().join("models/bert_tiny.onnx");
    assert!(path.exists(), "{} is missing: run scripts/gen_models.py (scripts/test does)", path.display());
    let g = kiln_compiler::import(Input::File(path), &Default::default()).expect("import");
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
        matches!(&err, CompileError::Shard(shard::ShardError::Indivisible { what: "heads", extent: 4, devices: 8, .. })),
        "{err:?}"
    );
    // The CUDA target refuses several devices: NCCL is not built.
    let cuda = Options { device: kiln_compiler::TargetDevice::Cuda, ..Options::default() };
    let err = shard::compile(Input::Graph(g), &cuda, 2).expect_err("cuda");
    assert!(matches!(err, CompileError::MultiGpu { devices: 2 }), "{err:?}");
    assert_eq!(err.kind(), kiln_compiler::ErrorKind::Unsupported);
}
