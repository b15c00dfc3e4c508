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
#[path = "../../kiln-codegen/tests/ptxas/mod.rs"]
mod ptxas;

use common::{compile_for_cuda_or_record, import_options, listed_models, model_path, read_npy};
use kiln_compiler::{Compilation, Input, Options, Precision, Stage};
use kiln_flow::class::KernelClass;
use kiln_flow::precision::{narrow_storage, Kept};
use kiln_flow::program::FlowProgram;
use kiln_ir::{DType, Graph, Tensor};
use kiln_module::program::Constants;
use ptxas::{assemble_ptx_verbose, ptxas};
use serde_json::Value;

/// The error bounds of a precision: relative L2 error and largest error over the
/// largest reference magnitude, per output.
struct Bounds {
    rel_l2: f64,
    max_rel: f64,
}

/// f16 (unit roundoff u = 2⁻¹¹ ≈ 4.9e-4). Measured (docs/precision.md), the worst of
/// the four models on either measure: 3.6e-3 (mobilenet_v2, 7u); the bound is 20u,
/// about 3× that.
const F16: Bounds = Bounds { rel_l2: 1e-2, max_rel: 1e-2 };

/// bf16 (u = 2⁻⁸ ≈ 3.9e-3): the worst measured is 2.3e-2 (mobilenet_v2, 6u); the
/// bound is 15u, about 3× that.
const BF16: Bounds = Bounds { rel_l2: 6e-2, max_rel: 6e-2 };

fn entry(name: &str) -> Value {
    listed_models("manifest.json")
        .into_iter()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("model `{name}` is not in ref/manifest.json"))
}

/// Compiles `g` at `precision` (CPU), loads the artifact and runs it on `feeds`.
fn compile_and_run(g: &Graph, precision: Precision, feeds: &[Tensor]) -> (kiln_compiler::Compiled, Vec<Tensor>) {
    let opts = Options { precision, fused_attention: true, ..Default::default() };
    let c = kiln_compiler::compile(g, &opts).unwrap_or_else(|e| panic!("compile at {precision}: {e}"));
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let outs = common::run_module(&module, None, g, feeds);
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

/// At f32 the stage leaves the flow program as dispatch formation made it, so the
/// artifact is the one a pipeline without the stage writes; an explicit f32 and the
/// default write the same bytes.
fn check_f32_is_a_no_op(name: &str, g: &Graph) {
    // Attention chains fused (the default, named here), so both forms of the masked step are checked.
    let mut c = Compilation::new(Input::Graph(g.clone()), Options { fused_attention: true, ..Options::default() });
    c.run_to(Stage::FormDispatches).expect("form dispatches");
    let formed = c.flow().expect("flow").clone();
    c.run_to(Stage::NarrowStorage).expect("narrow storage");
    assert!(c.flow() == Some(&formed), "{name}: flow-narrow-storage changed the program at f32");
    let a = kiln_compiler::compile(g, &Options::default()).expect("compile");
    let b = kiln_compiler::compile(g, &Options { precision: Precision::F32, ..Default::default() }).expect("compile");
    assert!(a.artifact == b.artifact, "{name}: --precision f32 is not the default's artifact");
}

/// At half precision every contraction and window of the f32 program keeps its class
/// (a code generator keys on the class, and on half operands within it) and reads a
/// half weight.
fn check_classes(name: &str, g: &Graph, precision: Precision) {
    let flow = |precision| {
        let mut c = Compilation::new(Input::Graph(g.clone()), Options { precision, ..Default::default() });
        c.run_to(Stage::NarrowStorage).expect("narrow storage");
        c.flow().expect("flow").clone()
    };
    let (f32_flow, half) = (flow(Precision::F32), flow(precision));
    let classes = |f: &kiln_flow::program::FlowProgram| f.dispatches.iter().map(|d| d.class).collect::<Vec<_>>();
    assert_eq!(classes(&f32_flow), classes(&half), "{name} at {precision}: classes changed");
    let storage = precision.storage().expect("a half precision");
    for d in half.dispatches.iter().filter(|d| d.class == KernelClass::Contraction) {
        let c = kiln_flow::contraction::Contraction::of(&d.kernel).expect("a contraction");
        assert!(
            c.a.dtype == storage || c.b.dtype == storage,
            "{name} at {precision}: {} reads no half operand ({} × {})",
            d.kernel.name,
            c.a.dtype,
            c.b.dtype
        );
    }
}

/// One model at f32, f16 and bf16 against ONNX Runtime.
fn check_model(name: &str) {
    let e = entry(name);
    let g = kiln_import::onnx::import_file(&model_path(&e), &import_options(&e))
        .unwrap_or_else(|err| panic!("{name}: import failed: {err}"));
    check_f32_is_a_no_op(name, &g);
    // The entry's reference inputs or outputs ("inputs", "outputs"), in order.
    let tensors = |list: &str| -> Vec<Tensor> {
        let files = e[list].as_array().unwrap_or_else(|| panic!("{name}: no {list} listed"));
        files.iter().map(|t| read_npy(t["file"].as_str().expect("file"))).collect()
    };
    let (feeds, want) = (tensors("inputs"), tensors("outputs"));
    let (c32, outs32) = compile_and_run(&g, Precision::F32, &feeds);
    for (got, want) in outs32.iter().zip(&want) {
        let (l2, mx) = errors(got, want);
        eprintln!("PRECISION {name} f32: rel L2 {l2:.2e}, max/max|ref| {mx:.2e}");
        assert!(l2 <= 1e-4 && mx <= 1e-4, "{name} at f32: {l2:.2e} / {mx:.2e}");
    }
    for (precision, bounds) in [(Precision::F16, F16), (Precision::BF16, BF16)] {
        check_classes(name, &g, precision);
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

/// A masked attention step: `softmax(x·Wq + mask)·V`, the mask a constant whose
/// masked entries are `masked` (row 0 unmasked, row 1 half masked, row 2 all but one
/// column, row 3 every column).
fn masked_attention(masked: f32, relu: bool) -> String {
    let weights = |seed: usize| -> String {
        (0..64)
            .map(|i| format!("{:.4}", (((i * 37 + seed * 11) % 17) as f32 - 8.0) / 16.0))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mask: Vec<String> = (0..32)
        .map(|i| {
            let (r, c) = (i / 8, i % 8);
            let m = match r {
                0 => false,
                1 => c >= 4,
                2 => c != 0,
                _ => true,
            };
            if m {
                format!("{masked:e}")
            } else {
                "0.0".into()
            }
        })
        .collect();
    let text = format!(
        "graph @masked(%0: f32[4,8] \"x\") -> (%7) {{\n\
         %1 = const f32[8,8] [{}] \"wq\"\n\
         %2 = MatMul(%0, %1) : f32[4,8] \"scores\"\n\
         %3 = const f32[4,8] [{}] \"mask\"\n\
         %4 = Add(%2, %3) : f32[4,8] \"masked\"\n\
         %5 = Softmax(%4) {{axis = 1}} : f32[4,8] \"p\"\n\
         %6 = const f32[8,8] [{}] \"v\"\n\
         %7 = MatMul(%5, %6) : f32[4,8] \"y\"\n}}\n",
        weights(1),
        mask.join(", "),
        weights(2)
    );
    // A Relu of the probabilities (the identity on them) keeps the chain from being
    // one attention kernel: the Softmax is a row kernel whose result is stored.
    if relu {
        text.replace("%7 = MatMul(%5, %6)", "%7 = Relu(%5) : f32[4,8] \"r\"\n%8 = MatMul(%7, %6)")
            .replace("-> (%7)", "-> (%8)")
    } else {
        text
    }
}

/// The flow program of `src` as dispatch formation leaves it (f32).
fn formed(src: &str) -> (Graph, FlowProgram) {
    let g = kiln_ir::text::parse(src).expect("parse");
    kiln_ir::verify::verify(&g).expect("verify");
    // Attention chains fused (the default, named here), so both forms of the masked step are checked.
    let mut c = Compilation::new(Input::Graph(g.clone()), Options { fused_attention: true, ..Options::default() });
    c.run_to(Stage::FormDispatches).expect("form dispatches");
    (g, c.flow().expect("flow").clone())
}

/// A mask constant whose entries overflow the half type keeps f32 storage, and so does
/// every value that carries it (the masked scores); the Softmax after it narrows. A
/// fully masked row is then uniform, as in f32, where an infinite mask would make it
/// NaN. A mask that fits (−1e4 in f16) narrows. Each case twice: with the Softmax a
/// row kernel of its own (a Relu after it), and as the one attention kernel the chain
/// becomes on the CPU, which reads and writes f32 (`Kept::Attention`).
#[test]
fn an_overflowing_mask_keeps_f32_storage() {
    for (precision, masked, kept) in [
        (Precision::F16, -1e9f32, true),
        (Precision::BF16, f32::MIN, true),
        (Precision::F16, -1e4, false),
        (Precision::BF16, -1e9, false),
    ] {
        let what = format!("{precision}, mask {masked:e}");
        for relu in [true, false] {
            let what = format!("{what}{}", if relu { ", softmax apart" } else { ", one attention kernel" });
            let (g, mut flow) = formed(&masked_attention(masked, relu));
            let report = narrow_storage(&mut flow, precision);
            let mask = flow.buffers.iter().position(|b| b.name == "mask").expect("the mask constant");
            let storage = precision.storage().expect("half");
            if kept {
                assert_eq!(flow.buffers[mask].ty.dtype, DType::F32, "{what}: the mask narrowed");
                assert!(report.kept.contains(&(kiln_flow::program::BufferId(mask as u32), Kept::Range)), "{what}");
                if relu {
                    // The value the Softmax reads carries the mask: f32 too.
                    let softmax = flow.dispatches.iter().find(|d| d.class == KernelClass::Rows).expect("the softmax");
                    for &o in &softmax.operands {
                        assert_eq!(flow.buffer(o).ty.dtype, DType::F32, "{what}: the softmax reads a narrowed value");
                    }
                    assert_eq!(
                        flow.buffer(softmax.result).ty.dtype,
                        storage,
                        "{what}: the softmax's result did not narrow"
                    );
                } else {
                    // No score matrix is stored; the attention kernel reads and writes f32.
                    let at = flow.dispatches.iter().find(|d| d.class == KernelClass::Attention).expect("attention");
                    for &o in at.operands.iter().chain([&at.result]) {
                        assert_eq!(flow.buffer(o).ty.dtype, DType::F32, "{what}: the attention kernel reads half");
                    }
                }
            } else if relu {
                assert_eq!(flow.buffers[mask].ty.dtype, storage, "{what}: the mask did not narrow");
            }
            let vals: Vec<f64> = (0..32).map(|i| (((i * 29) % 23) as f64 - 11.0) / 8.0).collect();
            let x =
                vec![Tensor::from_f64(DType::F32, kiln_ir::Shape::new(vec![4, 8]).expect("shape"), &vals).expect("x")];
            let want = kiln_ref::eval_graph(&g, &x).expect("reference");
            let (_, got) = compile_and_run(&g, precision, &x);
            assert!(got[0].to_f64_vec().iter().all(|v| v.is_finite()), "{what}: {:?}", got[0].to_f64_vec());
            // A fully masked row under a mask that fits the half type is the softmax of
            // `s + mask` stored half: the scores are gone in its rounding (f16's step at
            // 1e4 is 8), so that row is compared only where the mask is kept f32.
            let rows = if kept { 4 } else { 3 };
            let part = |t: &Tensor| {
                let v: Vec<f64> = t.to_f64_vec()[..rows * 8].to_vec();
                Tensor::from_f64(DType::F32, kiln_ir::Shape::new(vec![rows, 8]).expect("shape"), &v).expect("rows")
            };
            let (l2, mx) = errors(&part(&got[0]), &part(&want[0]));
            let bounds = if precision == Precision::F16 { F16 } else { BF16 };
            assert!(l2 <= bounds.rel_l2 && mx <= bounds.max_rel, "{what}: errors {l2:.2e} / {mx:.2e}");
        }
    }
}

/// With `--target cuda`, every kernel of the four models at f16 and bf16 assembles for
/// sm_90a (`ptxas`, as `cuda_ptxas.rs` checks at f32); every contraction of two half
/// operands takes the tensor cores (`mma.sync` or `wgmma`, without spills), and one of
/// mixed operands says why it does not.
#[test]
fn half_precision_kernels_assemble_for_sm_90a() {
    let _ = ptxas();
    let mut failures = Vec::new();
    for name in ["mlp", "lenet", "mobilenet_v2", "bert_tiny"] {
        let e = entry(name);
        for precision in [Precision::F16, Precision::BF16] {
            let label = format!("{name} {precision}");
            let Some(c) = compile_for_cuda_or_record(&e, precision, &label, &mut failures) else { continue };
            let cuda = c.cuda().expect("a CUDA module");
            let flow = c.flow().expect("flow");
            let halves = flow.dispatches.iter().filter(|d| d.kernel.output.dtype != DType::F32).count();
            assert!(halves > 0, "{name} {precision}: no kernel writes half storage");
            // Every contraction of two half operands takes the tensor cores
            // (`cuda::mma`), every other contraction the f32 kernel, saying why not;
            // products of at most 8 rows (16 where the tiled grid is small) take the
            // few-row kernel (`cuda::skinny`).
            let (mut mma, mut few) = (0, 0);
            for (d, note) in flow.dispatches.iter().zip(&cuda.notes) {
                if d.class != KernelClass::Contraction {
                    continue;
                }
                eprintln!("CONTRACTION {name} {precision} {}: {note}", d.kernel.name);
                let Some(op) = kiln_flow::contraction::Contraction::of(&d.kernel) else { continue };
                let both_half = op.a.dtype == op.b.dtype && op.a.dtype != DType::F32;
                // Products of at most 8 rows take the lane-per-column kernel whatever
                // their operand types (`cuda::skinny`).
                // (M: the extents of the output variables only A reads.)
                let rows: u64 = (0..d.kernel.out_rank() as u32)
                    .filter(|&v| op.a.offset.of(v) != 0 && op.b.offset.of(v) == 0)
                    .map(|v| d.kernel.vars[v as usize])
                    .product();
                let ok = if rows <= 8 || (rows <= 16 && note.starts_with("contraction (few rows")) {
                    few += 1;
                    note.starts_with("contraction (few rows")
                } else if both_half {
                    mma += 1;
                    // Hopper's wgmma where both operands stream in 16-byte chunks.
                    note.starts_with("contraction mma.sync m16n8k16") || note.starts_with("contraction wgmma m64n")
                } else {
                    !note.starts_with("contraction (")
                        || note.contains("tensor cores declined: ")
                        || op.a.dtype == op.b.dtype
                };
                if !ok {
                    failures.push(format!("{name} {precision} {}: {note}", d.kernel.name));
                }
            }
            assert!(mma + few > 0, "{name} {precision}: no contraction on the tensor cores or the few-row kernel");
            match assemble_ptx_verbose("ptxas", &format!("{name}-{precision}"), cuda.ptx()) {
                Err(err) => failures
                    .push(format!("{name} {precision}: ptxas: {}", err.lines().take(8).collect::<Vec<_>>().join("\n"))),
                // The tensor-core kernels keep their accumulators in registers.
                Ok(usage) => {
                    for (d, note) in flow.dispatches.iter().zip(&cuda.notes) {
                        if !note.starts_with("contraction mma.sync") && !note.starts_with("contraction wgmma") {
                            continue;
                        }
                        let Some((_, u)) = usage.iter().find(|(n, _)| *n == d.kernel.name) else {
                            failures.push(format!("{name} {precision} {}: no ptxas report", d.kernel.name));
                            continue;
                        };
                        eprintln!("PTXAS {name} {precision} {}: {u:?}", d.kernel.name);
                        if (u.stack, u.spill_stores, u.spill_loads) != (0, 0, 0) {
                            failures.push(format!("{name} {precision} {}: stack or spills {u:?}", d.kernel.name));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `--precision` on the command line: `compile` (and `run`, `inspect`, `bench`, which
/// share the model options) take f32, f16 and bf16; anything else is one error line.
#[test]
fn the_precision_flag() {
    use common::{fails_with, ok, LENET};
    let f32_flow = ok(&["compile", LENET, "--to", "flow"]);
    assert_eq!(ok(&["compile", LENET, "--to", "flow", "--precision", "f32"]), f32_flow);
    assert!(!f32_flow.contains("f16") && !f32_flow.contains("bf16"), "{f32_flow}");
    for p in ["f16", "bf16"] {
        let flow = ok(&["compile", LENET, "--to", "flow", "--precision", p]);
        assert!(flow.contains(&format!(": {p}[")), "{flow}");
        // The API stays f32: the input and the output.
        assert!(flow.contains("%0: f32[1,1,28,28] = input 0"), "{flow}");
        let out = ok(&["run", LENET, "--precision", p]);
        assert!(out.contains("f32[1,10]"), "{out}");
    }
    fails_with(&["compile", LENET, "--precision", "fp16", "--to", "flow"], &["--precision `fp16`", "f32, f16 or bf16"]);
}
