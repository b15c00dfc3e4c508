//! The local-task driver on compiled code: every model and graph here is compiled once,
//! run on 1 thread (the local-sync driver) and on 2 and 3 threads, and the outputs must
//! be bit-identical: a kernel computes each workgroup the same way whichever thread runs
//! it, so splitting the workgroups may change nothing. The graphs cover contraction
//! microkernels over odd shapes, a wave of two dispatches (and one of two like products,
//! run whole, one thread each), a batched product cut into column chunks, reductions, helper calls, and
//! dispatches of fewer workgroups than threads; each also with its work estimates cleared,
//! so that the driver splits every wave (with them, it runs waves too small to pay for
//! the hand-off on the calling thread alone); the models are lenet (in the repository)
//! and, from the test data (`$KILN_TEST_DATA`, default `<repo>/.cache`, fetched by
//! `scripts/test`), mlp, mobilenet_v2, bert_tiny and matmul1024 (whose contraction
//! packs blocks of B on each thread's stack).

use kiln_import::ImportOptions;
use kiln_ir::Graph;
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

/// Seeded inputs: floats k/64 for k in -64..64, integers 0..4 (valid token ids), bools.
fn inputs(sig: &kiln_runtime::EntrySignature<'_, '_>) -> Vec<Vec<u8>> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move || {
        state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        state >> 33
    };
    sig.inputs
        .iter()
        .map(|t| {
            let n = t.dims.iter().product::<u64>() as usize;
            let mut out = Vec::with_capacity(t.bytes as usize);
            for _ in 0..n {
                match t.dtype {
                    1 => out.extend((((next() % 128) as f32 - 64.0) / 64.0).to_le_bytes()),
                    7 => out.extend((next() % 4).to_le_bytes()),
                    6 => out.extend(((next() % 4) as u32).to_le_bytes()),
                    9 => out.push((next() % 2) as u8),
                    d => panic!("{}: no seeded inputs of dtype {d} in this test", t.name),
                }
            }
            out
        })
        .collect()
}

fn run(module: &kiln_runtime::LoadedModule<'_>, threads: usize, ins: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let sig = module.entry_signature(0).expect("entry 0");
    let mut inst = kiln_runtime::Instance::with_threads(module, threads).expect("instance");
    assert_eq!(inst.threads(), threads);
    let ins: Vec<&[u8]> = ins.iter().map(|v| &v[..]).collect();
    // Outputs start as garbage, so that bytes no thread wrote would show.
    let mut outs: Vec<Vec<u8>> = sig.outputs.iter().map(|t| vec![0xA5; t.bytes as usize]).collect();
    // Twice: the second call reuses the pool and the arena.
    for _ in 0..2 {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs).expect("invoke");
    }
    outs
}

/// `artifact` with every dispatch's work estimate cleared: the driver then splits every
/// wave, as it does a format 1.0 plan's (the graphs here are too small for the
/// estimates to let it split any).
fn without_estimates(artifact: &[u8]) -> Vec<u8> {
    let m = kiln_module::Module::parse(artifact).expect("parse");
    let mut p = kiln_module::sections::read_program(&m).expect("decode").to_program();
    let mut cleared = 0;
    for e in &mut p.entries {
        for c in &mut e.commands {
            if let kiln_module::program::Command::Dispatch { work_ns, .. } = c {
                assert!(*work_ns > 0, "the compiler estimates every dispatch");
                *work_ns = 0;
                cleared += 1;
            }
        }
    }
    assert!(cleared > 0);
    kiln_module::sections::write_program(&p)
}

fn same_on_threads(name: &str, g: &Graph) {
    let c = kiln_compiler::compile(g, &kiln_compiler::Options::default())
        .unwrap_or_else(|e| panic!("{name}: compile: {e}"));
    same_on_threads_of(name, &c.artifact, c.weights.as_deref());
    let split = without_estimates(&c.artifact);
    same_on_threads_of(&format!("{name} (every wave split)"), &split, c.weights.as_deref());
}

fn same_on_threads_of(name: &str, artifact: &[u8], weights: Option<&[u8]>) {
    let module = kiln_runtime::Module::load(artifact, weights).unwrap_or_else(|e| panic!("{name}: load: {e}"));
    let ins = inputs(&module.entry_signature(0).expect("entry 0"));
    let one = run(&module, 1, &ins);
    for threads in [2, 3] {
        let got = run(&module, threads, &ins);
        for (k, (a, b)) in got.iter().zip(&one).enumerate() {
            let first = a.iter().zip(b).position(|(x, y)| x != y);
            assert!(first.is_none(), "{name}: output {k} on {threads} threads differs from 1 thread at byte {first:?}");
        }
    }
}

fn graph(text: &str) -> Graph {
    kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

#[test]
fn graphs_are_bit_identical_on_threads() {
    // A contraction over odd shapes with a bias, read by two dispatches of one wave.
    same_on_threads(
        "branches",
        &graph(
            r#"graph @branches(%0: f32[37,53] "x", %1: f32[53,29] "w", %2: f32[29] "bias") -> (%5, %6) {
  %3 = MatMul(%0, %1) : f32[37,29] "mm" node "mm"
  %4 = Add(%3, %2) : f32[37,29] "biased" node "add"
  %5 = Relu(%4) : f32[37,29] "a" node "a"
  %6 = Neg(%4) : f32[37,29] "b" node "b"
}"#,
        ),
    );
    // Two like products of one wave, each worth more than a hand-off: run whole, one
    // thread each (the two directions of a bidirectional recurrence's step).
    same_on_threads(
        "twins",
        &graph(
            r#"graph @twins(%0: f32[33,200] "x", %1: f32[200,300] "w1", %2: f32[200,300] "w2") -> (%3, %4) {
  %3 = MatMul(%0, %1) : f32[33,300] "p1" node "p1"
  %4 = MatMul(%0, %2) : f32[33,300] "p2" node "p2"
}"#,
        ),
    );
    // A batched product whose B differs by batch position, each position's over one L2
    // block (a bidirectional LSTM's input projection, one `W` per direction): column
    // chunks, the chunk outermost, so a thread's range reads its chunk of each B.
    same_on_threads(
        "directions",
        &graph(
            r#"graph @directions(%0: f32[2,20,300] "x", %1: f32[2,300,301] "w") -> (%2) {
  %2 = MatMul(%0, %1) : f32[2,20,301] "proj" node "proj"
}"#,
        ),
    );
    // A batched contraction, a softmax (reductions and exp through the helper table),
    // and one-element results: dispatches with fewer workgroups than threads.
    same_on_threads(
        "small",
        &graph(
            r#"graph @small(%0: f32[3,5,7] "x", %1: f32[3,7,2] "w", %2: f32[1] "s") -> (%4, %5, %6) {
  %3 = MatMul(%0, %1) : f32[3,5,2] "bmm" node "bmm"
  %4 = Softmax(%3) {axis = 2} : f32[3,5,2] "sm" node "sm"
  %5 = Tanh(%2) : f32[1] "t" node "t"
  %6 = Mul(%2, %2) : f32[1] "sq" node "sq"
}"#,
        ),
    );
}

#[test]
fn models_are_bit_identical_on_threads() {
    let lenet = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/lenet.onnx");
    let models = [
        (lenet, vec![]),
        (data_dir().join("models/mlp.onnx"), vec![]),
        (data_dir().join("models/mobilenet_v2.onnx"), vec![]),
        (data_dir().join("models/bert_tiny.onnx"), vec![("input_ids".to_string(), vec![1, 128])]),
        (
            data_dir().join("models/matmul1024.onnx"),
            vec![("a".to_string(), vec![1024, 1024]), ("b".to_string(), vec![1024, 1024])],
        ),
    ];
    for (path, input_shapes) in models {
        assert!(path.exists(), "{} is missing: run scripts/test (it fetches the test models)", path.display());
        let opts = ImportOptions { input_shapes, ..ImportOptions::default() };
        let g = kiln_import::onnx::import_file(&path, &opts).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        same_on_threads(&path.display().to_string(), &g);
    }
}

#[test]
fn work_estimates_are_on_a_physical_scale() {
    // A 256×256×256 product (16.8 M multiply-adds) and an 8-element add.
    let g = graph(
        r#"graph @est(%0: f32[256,256] "x", %1: f32[256,256] "w", %2: f32[8] "a") -> (%4, %5) {
  %3 = MatMul(%0, %1) : f32[256,256] "mm" node "mm"
  %4 = Relu(%3) : f32[256,256] "r" node "r"
  %5 = Add(%2, %2) : f32[8] "s" node "s"
}"#,
    );
    let c = kiln_compiler::compile(&g, &kiln_compiler::Options::default()).expect("compile");
    let m = kiln_module::Module::parse(&c.artifact).expect("parse");
    let p = kiln_module::sections::read_program(&m).expect("decode").to_program();
    let mut est: Vec<(u64, u64)> = p.entries[0]
        .commands
        .iter()
        .filter_map(|c| match c {
            kiln_module::program::Command::Dispatch { work_ns, bindings, .. } => {
                Some((*work_ns, bindings.last().expect("output").length))
            }
            _ => None,
        })
        .collect();
    est.sort_by_key(|e| e.1);
    assert_eq!(est.len(), 2, "{est:?}");
    let (small, product) = (est[0].0, est[1].0);
    // No core does more than 200 or fewer than 4 multiply-adds a nanosecond on a
    // microkernel; an 8-element add is well under 10 µs and is estimated.
    let macs = 256u64 * 256 * 256;
    assert!((macs / 200..=macs / 4).contains(&product), "product estimated at {product} ns");
    assert!((1..10_000).contains(&small), "add estimated at {small} ns");
    // So on two threads the product is worth splitting and the add is not.
    assert!(product / 2 >= 3_000 && small / 2 < 3_000);
}
