//! One artifact, several CPU levels (`kiln compile --target-cpu x86-64-v3,x86-64-v4`,
//! `kiln_compiler::variants`): the artifact carries the x86-64-v3 code of every kernel
//! and the x86-64-v4 code of the kernels where it differs, and the runtime takes, once
//! at load, the best variant whose CPU features the host has.
//!
//! Each model is compiled once with both levels and run twice, compared with ONNX
//! Runtime's outputs (the manifest's tolerance) both times: as loaded on this machine
//! (every kernel with two variants takes the v4 one where the machine has AVX-512 F,
//! DQ and VL), and loaded for a host whose AVX-512 features are masked off
//! (`kiln_runtime::Module::verify` with chosen host features: the API a test uses to
//! stand for a lesser CPU), which must take the v3 variant of every kernel and still
//! match. A host below v3 gets the typed error naming what it lacks.

mod common;

use common::{import_options, listed_models, model_path, ok, read_npy, s, scratch, LENET};
use kiln_compiler::{CpuTarget, Options};
use kiln_ir::Tensor;
use kiln_module::program::{Condition, CpuFeature, Program};
use kiln_runtime::{Instance, LoadedModule, RuntimeError};
use serde_json::Value;

const AVX512: [CpuFeature; 5] =
    [CpuFeature::Avx512f, CpuFeature::Avx512bw, CpuFeature::Avx512dq, CpuFeature::Avx512vl, CpuFeature::Avx512vnni];

fn entry(name: &str) -> Value {
    listed_models("manifest.json")
        .into_iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("{name} not listed"))
}

fn both_levels() -> Options {
    Options { target: CpuTarget::X86_64V3, cpu_variants: vec![CpuTarget::X86_64V4], ..Options::default() }
}

/// Runs `m` on the entry's inputs and compares with ONNX Runtime's outputs.
fn run_and_compare(name: &str, what: &str, m: &LoadedModule<'_>, e: &Value, g: &kiln_ir::Graph) {
    let feeds: Vec<Tensor> = e["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .filter(|i| e["input_values"].get(i["name"].as_str().expect("name")).is_none())
        .map(|i| read_npy(i["file"].as_str().expect("file")))
        .collect();
    let mut inst = Instance::new(m).expect("instance");
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs).unwrap_or_else(|err| panic!("{name} ({what}): invoke: {err}"));
    }
    let rtol = e["rtol"].as_f64().unwrap_or(1e-4);
    let atol = e["atol"].as_f64().unwrap_or(1e-5);
    for ((bytes, want), &v) in outs.into_iter().zip(e["outputs"].as_array().expect("outputs")).zip(&g.outputs) {
        let got = Tensor::new(g.values[v].ty.clone(), bytes.into()).expect("output");
        let want = read_npy(want["file"].as_str().expect("file"));
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        assert_eq!(g.len(), w.len(), "{name} ({what}): length");
        let scale = w.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            assert!(
                (a - b).abs() <= atol * scale + rtol * b.abs(),
                "{name} ({what}): element {i}: kiln {a}, ONNX Runtime {b}"
            );
        }
    }
}

/// The kernels with more than one variant.
fn multi(p: &Program) -> Vec<usize> {
    (0..p.kernels.len()).filter(|&k| p.kernels[k].variants.len() > 1).collect()
}

fn check_model(name: &str) {
    let e = entry(name);
    let g = kiln_import::onnx::import_file(&model_path(&e), &import_options(&e)).expect("import");
    let c = kiln_compiler::compile(&g, &both_levels()).unwrap_or_else(|err| panic!("{name}: compile: {err}"));
    let p = &c.program;
    // Executable 0 is the v3 baseline, executable 1 the v4 code; every kernel has a v3
    // variant, listed last, and a v4 variant only where the code differs.
    assert_eq!(p.executables.len(), 2, "{name}: executables");
    let level = |x: usize| CpuFeature::level_of(p.executables[x].features).0;
    assert_eq!((level(0), level(1)), (Some("x86-64-v3"), Some("x86-64-v4")), "{name}");
    let two = multi(p);
    assert!(!two.is_empty(), "{name}: no kernel has a v4 variant");
    for k in &p.kernels {
        let last = k.variants.last().expect("a variant");
        assert_eq!((last.executable, last.condition), (0, Condition::CpuFeatures(p.executables[0].features)));
        assert!(k.variants.len() <= 2, "{name}: kernel {}", k.name);
        if k.variants.len() == 2 {
            assert_eq!(k.variants[0].condition, Condition::CpuFeatures(p.executables[1].features));
        }
    }
    let host = kiln_runtime::cpu::host_features();
    let v4 = CpuFeature::LEVELS[3];
    // On this machine: the v4 variant where the host has v4.
    let m = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let taken = m.verified().variants().to_vec();
    let want_v4 = host & v4 == v4;
    for &k in &two {
        assert_eq!(taken[k], if want_v4 { 0 } else { 1 }, "{name}: kernel {} on this host", p.kernels[k].name);
    }
    eprintln!(
        "{name}: {} kernels, {} with a v4 variant; this host ({}) takes {}",
        p.kernels.len(),
        two.len(),
        kiln_runtime::verify::feature_names(host).join(" "),
        if want_v4 { "v4" } else { "v3" }
    );
    run_and_compare(name, "this host's variants", &m, &e, &g);
    // A host without AVX-512: the v3 variant of every kernel, still matching.
    let masked = AVX512.iter().fold(host, |h, f| h & !f.bit());
    let m = kiln_runtime::Module::verify(&c.artifact, c.weights.as_deref(), masked)
        .expect("verify for a host without AVX-512")
        .load(&kiln_runtime::cpu::CpuLoader)
        .expect("load");
    assert!(
        m.verified().variants().iter().zip(&p.kernels).all(|(&v, k)| v == k.variants.len() - 1),
        "{name}: a host without AVX-512 takes the v3 variant of every kernel"
    );
    run_and_compare(name, "AVX-512 masked off: v3 variants", &m, &e, &g);
    // Below v3: no variant fits; the error names what the host lacks.
    let v2 = CpuFeature::LEVELS[1];
    match kiln_runtime::Module::verify(&c.artifact, c.weights.as_deref(), v2) {
        Err(RuntimeError::MissingCpuFeatures { names, .. }) => {
            for f in ["avx", "avx2", "fma"] {
                assert!(names.iter().any(|n| n == f), "{name}: {names:?} lacks {f}");
            }
        }
        other => panic!("{name}: an x86-64-v2 host: {other:?}"),
    }
}

#[test]
fn lenet_runs_with_either_variant() {
    check_model("lenet");
}

#[test]
fn mobilenet_v2_runs_with_either_variant() {
    check_model("mobilenet_v2");
}

#[test]
fn bert_tiny_runs_with_either_variant() {
    check_model("bert_tiny");
}

/// Identical code is stored once: naming one level twice gives one executable, and a
/// v4 variant is kept only where its code or its workgroups differ from the v3 one.
#[test]
fn identical_variants_are_stored_once() {
    let e = entry("lenet");
    let g = kiln_import::onnx::import_file(&model_path(&e), &import_options(&e)).expect("import");
    let same = Options { target: CpuTarget::X86_64V3, cpu_variants: vec![CpuTarget::X86_64V3], ..Options::default() };
    let c = kiln_compiler::compile(&g, &same).expect("compile");
    assert_eq!(c.program.executables.len(), 1, "v3 twice: one executable");
    assert!(multi(&c.program).is_empty());
    let c = kiln_compiler::compile(&g, &both_levels()).expect("compile");
    let tier = &c.program.executables[1];
    // Every kept v4 kernel differs from its v3 code (or splits its work differently).
    let code = |x: &kiln_module::program::Executable, i: usize| {
        let start = x.entries[i].1;
        let end = x.entries.iter().map(|e| e.1).filter(|&o| o > start).min().unwrap_or(x.code.len() as u64);
        x.code[start as usize..end as usize].to_vec()
    };
    for k in multi(&c.program) {
        let (v4, v3) = (&c.program.kernels[k].variants[0], &c.program.kernels[k].variants[1]);
        assert!(
            v4.workgroups != 0 || code(tier, v4.entry as usize) != code(&c.program.executables[0], v3.entry as usize),
            "kernel {} stored twice",
            c.program.kernels[k].name
        );
    }
    // And the v4 executable holds only those kernels.
    assert_eq!(tier.entries.len(), multi(&c.program).len());
}

/// The command line: `--target-cpu` takes a list; `kiln inspect` lists each
/// dispatch's variants and says which this host takes; `kiln run` runs it.
#[test]
fn compile_inspect_and_run_from_the_command_line() {
    let dir = scratch("variants", "cli");
    let art = dir.join("lenet.kiln");
    ok(&["compile", LENET, "-o", s(&art), "--target-cpu", "x86-64-v4,x86-64-v3"]);
    let text = ok(&["inspect", s(&art)]);
    let host = kiln_runtime::cpu::host_features();
    let v4 = CpuFeature::LEVELS[3];
    assert!(text.contains("variants: this host has x86-64-v"), "{text}");
    assert!(text.contains("executable 0: x86-64-v3"), "{text}");
    assert!(text.contains("executable 1: x86-64-v4"), "{text}");
    if host & v4 == v4 {
        assert!(text.contains("variants: x86-64-v4* | x86-64-v3"), "{text}");
    } else {
        assert!(text.contains("variants: x86-64-v4 | x86-64-v3*"), "{text}");
        assert!(text.contains("passed over: this host lacks"), "{text}");
    }
    let json = ok(&["inspect", s(&art), "--json"]);
    let v: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["host"]["loads"], true, "{json}");
    let dispatches: Vec<&Value> = v["entries"][0]["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .filter(|c| c["op"] == "dispatch" && c["variants"].as_array().is_some_and(|v| v.len() == 2))
        .collect();
    assert!(!dispatches.is_empty(), "{json}");
    for d in dispatches {
        let taken: Vec<bool> = d["variants"].as_array().expect("variants").iter().map(|v| v["taken"] == true).collect();
        assert_eq!(taken, [host & v4 == v4, host & v4 != v4], "{d}");
        assert_eq!(d["variants"][0]["condition"], "x86-64-v4", "{d}");
    }
    ok(&["run", s(&art)]);
    // `host` is no level to combine.
    common::fails_with(&["compile", LENET, "-o", s(&art), "--target-cpu", "host,x86-64-v4"], &["host", "--target-cpu"]);
}
