//! The CUDA attention emitter (`cuda::attention`): attention kernels as the flow
//! formation makes them for the CUDA target (`Formation::ImplicitGemm`, attention
//! fused) from ONNX `Attention` ops — 4-D heads with tails of keys and columns, causal
//! grouped-query attention on 3-D operands, a boolean mask (a mask dispatch of its own
//! that the kernel loads), heads deeper and wider than a warp, hundreds of keys — each
//! taken by the emitter (not the general mapping), assembled by `ptxas -arch=sm_90a -v`
//! with no spill and no stack, and run in the host PTX simulator against the kernel
//! interpreter over its whole grid. The simulator reassociates nothing the GPU would
//! not: the sums of products over the depth are a butterfly of shuffles and the
//! softmax is online, so results are within `2⁻¹⁴·|want| + 2⁻¹⁴` of the interpreter's
//! (`ex2.approx` a few ulp, `(D + T)` reassociated terms of f32 rounding). No GPU runs
//! these tests (docs/cuda.md).
//!
//! The tensor-core kernel (`KILN_CUDA_TUNE=attn=flash`, `cuda::flash`) is checked the
//! same way on heads of depths and widths that are multiples of 16: bert_tiny's
//! attention (4 heads of 64, 128 positions, as the model's graph spells it), tails of
//! keys and queries, K staged as rows along the keys (vector and scalar copies), a
//! boolean and an additive mask, causal grouped-query attention with batch 2,
//! heads of 128 and of 80 × 112. It rounds Q, K, V and the probabilities to f16; the
//! simulator's random inputs are multiples of 2⁻¹⁰ in [−2, 2), exact in f16, so only
//! the probabilities' rounding (relative 2⁻¹¹ each, so at most `2⁻¹¹·max|V|` = 2⁻¹⁰
//! in the result) and f32 reassociation part it from the interpreter: the tolerance is
//! `2⁻⁹ + 2⁻¹⁰·|want|`.
//!
//! Half storage (the default kernel at `--precision f16|bf16`, where the
//! storage-precision pass narrows an attention kernel's operands and result on CUDA):
//! the same kernels with Q, K, V (and the mask) stored f16 or bf16 and a half result,
//! taken by the tensor-core kernel without any knob, which reads the halves as they
//! are (`mma` of the operands' own type) and rounds its result once; the interpreter
//! widens the same halves and rounds its store the same way, so the f16 tolerance is
//! the one above and bf16's `2⁻⁷ + 2⁻⁶·|want|` (probabilities rounded to 8 bits,
//! `2⁻⁹` each, and one bf16 ulp of rounding the result, `2⁻⁷` relative). The warp
//! kernel (`attn=on`, and heads the tensor cores decline) reads and writes halves too.
//! A graph with projections around the attention (bert_tiny's shape, smaller) checks
//! the flow side: narrowed with CUDA's rule, the attention kernel reads half Q, K, V
//! and writes half, and the output projection after it reads that half result and
//! takes the tensor cores; with the CPU's rule all of them stay f32.

mod common;
mod ptxas;
use kiln_ptxsim as ptxsim;

use kiln_codegen::cuda;
use kiln_codegen::cuda::tune::{Attn, Tune};
use kiln_flow::attention::Attention;
use kiln_flow::class::KernelClass;
use kiln_flow::precision::{narrow_storage, narrow_storage_for, Precision};
use kiln_flow::program::Formation;
use kiln_flow::Kernel;
use kiln_ir::DType;
use ptxas::assemble_ptx_verbose;

/// The attention kernel the CUDA formation makes of the one-node graph `text`.
fn attention_kernel(text: &str) -> kiln_flow::Kernel {
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let p =
        kiln_lower::form_with(&g, Formation::ImplicitGemm, Some(&kiln_flow::attention::accept_all)).expect("formation");
    let found: Vec<_> = p.dispatches.iter().filter(|d| d.class == KernelClass::Attention).collect();
    assert_eq!(found.len(), 1, "attention dispatches in\n{p}");
    found[0].kernel.clone()
}

/// Compiles attention kernel `k` under `tune`, requires the note to start with
/// `form`, assembles it with `ptxas -v` (no spill, no stack) and runs its whole grid in
/// the simulator against the interpreter within `rel·|want| + abs` (inputs from
/// `seed`). The module, for what the caller checks further.
fn assemble_and_simulate(
    name: &str,
    k: &Kernel,
    tune: &Tune,
    form: &str,
    (rel, abs): (f64, f64),
    seed: u64,
) -> cuda::CudaModule {
    let m = cuda::compile_tuned(&[(k, KernelClass::Attention)], tune).unwrap_or_else(|e| panic!("{name}: {e}"));
    let note = &m.notes[0];
    assert!(note.starts_with(form), "{name}: {note}");
    let usage = assemble_ptx_verbose("cuda-attention", name, m.ptx())
        .unwrap_or_else(|e| panic!("{name}: ptxas refused it:\n{e}\n{}", m.ptx()));
    let u = usage[0].1;
    assert!(u.stack == 0 && u.spill_stores == 0 && u.spill_loads == 0, "{name}: {note}: {u:?}");
    let l = m.launches[0];
    let c = ptxsim::Check { tol: ptxsim::Tol::Rel { rel, abs }, specials: false, ..ptxsim::Check::exact(seed) };
    let o = ptxsim::check_against_interpreter(k, m.ptx(), 0, ptxsim::Grid::of(l.grid, l.block, l.shared), &c)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(o.compared, o.elements, "{name}: every element compared");
    eprintln!("{name}: {note}: {u:?}: {} elements, {} blocks", o.elements, l.grid);
    m
}

/// The warp kernel's tolerance (module docs).
const WARP_TOL: (f64, f64) = (1.0 / 16384.0, 1.0 / 16384.0);

fn check(name: &str, text: &str) {
    let k = attention_kernel(text);
    let m = assemble_and_simulate(name, &k, &Tune::default(), "attention (a warp per query row", WARP_TOL, 11);
    // No score matrix: the entry declares no shared or local array of any size.
    assert!(!m.ptx().contains(".shared") && !m.ptx().contains(".local"), "{name}: {}", m.ptx());
}

#[test]
fn four_d_heads_with_tails() {
    check(
        "4d",
        r#"graph @a(%0: f32[2,3,7,5] "q", %1: f32[2,3,9,5] "k", %2: f32[2,3,9,6] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) : f32[2,3,7,6] "y" node "att"
}"#,
    );
}

#[test]
fn causal_grouped_query_attention_on_3d_operands() {
    check(
        "gqa_causal",
        r#"graph @a(%0: f32[2,5,72] "q", %1: f32[2,5,24] "k", %2: f32[2,5,24] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) {is_causal = 1, q_num_heads = 9, kv_num_heads = 3} : f32[2,5,72] "y" node "att"
}"#,
    );
}

#[test]
fn boolean_mask_and_heads_wider_than_a_warp() {
    check(
        "bool_mask_wide",
        r#"graph @a(%0: f32[1,2,4,40] "q", %1: f32[1,2,40,40] "k", %2: f32[1,2,40,70] "v", %3: bool[1,1,4,40] "m") -> (%4) {
  %4 = Attention(%0, %1, %2, %3) {scale = 0.2} : f32[1,2,4,70] "y" node "att"
}"#,
    );
}

#[test]
fn hundreds_of_keys() {
    check(
        "long",
        r#"graph @a(%0: f32[1,1,3,64] "q", %1: f32[1,1,300,64] "k", %2: f32[1,1,300,64] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) : f32[1,1,3,64] "y" node "att"
}"#,
    );
}

/// The tensor-core kernel's tolerance with f16 operands and probabilities (module docs).
const F16_TOL: (f64, f64) = (1.0 / 1024.0, 1.0 / 512.0);

/// With bf16 operands and probabilities (module docs).
const BF16_TOL: (f64, f64) = (1.0 / 64.0, 1.0 / 128.0);

/// `k` as the storage-precision pass leaves it on CUDA where everything it reads and
/// writes narrowed: Q, K, V, the mask and the result stored as `half`.
fn stored_as(k: &Kernel, half: DType) -> Kernel {
    let a = Attention::of(k).expect("the attention form");
    let mut h = k.clone();
    for o in a.operands() {
        h.inputs[o.input as usize].dtype = half;
    }
    h.output.dtype = half;
    h.verify().unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let b = Attention::of(&h).expect("the attention form with half storage");
    assert!(!b.all_f32(&h) && b.q == a.q && b.k == a.k && b.v == a.v);
    h
}

/// The tensor-core kernel of the one-node graph `text`: with f32 operands under
/// `attn=flash`, then with f16 and bf16 storage ([`stored_as`]) under the default
/// tune, each taken by it (its note, with `loads` the K and V copies' kind, `mma` of
/// the right type), assembled by `ptxas -v` with no spill and no stack, and run in the
/// simulator over its whole grid against the interpreter within the tolerances of the
/// module docs.
fn check_flash(name: &str, text: &str, loads: &str) {
    check_flash_loads(name, text, loads, loads);
}

/// [`check_flash`], the half kernels' K and V copies of kind `half_loads`.
fn check_flash_loads(name: &str, text: &str, loads: &str, half_loads: &str) {
    let k = attention_kernel(text);
    let flash = Tune { attention: Some(Attn::Flash), ..Tune::default() };
    let m = assemble_and_simulate(name, &k, &flash, "attention (tensor cores: mma.sync f16, f32 result", F16_TOL, 13);
    assert!(m.notes[0].contains(loads) && m.notes[0].contains("(f32 rounded)"), "{name}: {}", m.notes[0]);
    for (half, tol) in [(DType::F16, F16_TOL), (DType::BF16, BF16_TOL)] {
        let h = stored_as(&k, half);
        let tag = format!("{name}_{half}");
        let form = format!("attention (tensor cores: mma.sync {half}, {half} result");
        let m = assemble_and_simulate(&tag, &h, &Tune::default(), &form, tol, 13);
        assert!(m.notes[0].contains(half_loads) && m.notes[0].contains("(halves as stored)"), "{tag}: {}", m.notes[0]);
        assert!(!m.ptx().contains("ld.global.f32") && !m.ptx().contains(".f32.f16.f16") == (half == DType::BF16));
    }
}

#[test]
fn flash_bert_tiny_heads() {
    // bert_tiny's attention as scripts/gen_models.py writes it: the [1, 128, 256]
    // projections split into 4 heads of 64 (K transposed to [.., 64, 128]), scores / 8.
    check_flash(
        "flash_bert_tiny",
        r#"graph @a(%0: f32[1,128,256] "q", %1: f32[1,128,256] "k", %2: f32[1,128,256] "v") -> (%14) {
  %3 = const i64[4] [1, 128, 4, 64] "split"
  %4 = Reshape(%0, %3) : f32[1,128,4,64] "qs" node "qs"
  %5 = Transpose(%4) {perm = [0, 2, 1, 3]} : f32[1,4,128,64] "qh" node "qh"
  %6 = Reshape(%1, %3) : f32[1,128,4,64] "ks" node "ks"
  %7 = Transpose(%6) {perm = [0, 2, 3, 1]} : f32[1,4,64,128] "kt" node "kt"
  %8 = Reshape(%2, %3) : f32[1,128,4,64] "vs" node "vs"
  %9 = Transpose(%8) {perm = [0, 2, 1, 3]} : f32[1,4,128,64] "vh" node "vh"
  %10 = MatMul(%5, %7) : f32[1,4,128,128] "scores" node "scores"
  %11 = const f32[] [8.0] "root"
  %12 = Div(%10, %11) : f32[1,4,128,128] "scaled" node "scaled"
  %13 = Softmax(%12) {axis = -1} : f32[1,4,128,128] "probs" node "probs"
  %14 = MatMul(%13, %9) : f32[1,4,128,64] "ctx" node "ctx"
}"#,
        "K rows along the keys, v4 loads, V key rows, v4 loads",
    );
}

#[test]
fn flash_contiguous_heads() {
    // ONNX Attention's [batch, heads, positions, depth] operands, 2 heads.
    check_flash(
        "flash_heads",
        r#"graph @a(%0: f32[1,2,128,64] "q", %1: f32[1,2,128,64] "k", %2: f32[1,2,128,64] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) {scale = 0.125} : f32[1,2,128,64] "y" node "att"
}"#,
        "V key rows, v4 loads",
    );
}

#[test]
fn flash_tails_of_keys_and_queries_with_a_transposed_k() {
    // 100 keys (a tile and 36), 70 queries (a tile and 6), depth 32, 48 columns; K a
    // [.., depth, keys] input: rows of depth along the keys in shared memory (halves:
    // 8-byte copies, 100 keys not being a multiple of 8).
    check_flash_loads(
        "flash_tails",
        r#"graph @a(%0: f32[1,2,70,32] "q", %1: f32[1,2,32,100] "kt", %2: f32[1,2,100,48] "v") -> (%4) {
  %3 = Transpose(%1) {perm = [0, 1, 3, 2]} : f32[1,2,100,32] "k" node "kt"
  %4 = Attention(%0, %3, %2) : f32[1,2,70,48] "y" node "att"
}"#,
        "K rows along the keys, v4 loads, V key rows, v4 loads",
        "K rows along the keys, v2 loads, V key rows, v4 loads",
    );
}

#[test]
fn flash_boolean_mask() {
    // 90 keys: K's rows along the keys take scalar loads (a vector would straddle the
    // last key).
    check_flash(
        "flash_bool_mask",
        r#"graph @a(%0: f32[1,2,40,32] "q", %1: f32[1,2,90,32] "k", %2: f32[1,2,90,32] "v", %3: bool[1,1,40,90] "m") -> (%4) {
  %4 = Attention(%0, %1, %2, %3) {scale = 0.2} : f32[1,2,40,32] "y" node "att"
}"#,
        "K rows along the keys, scalar loads",
    );
}

#[test]
fn flash_additive_mask_batch_2() {
    check_flash(
        "flash_add_mask",
        r#"graph @a(%0: f32[2,2,24,64] "q", %1: f32[2,2,72,64] "k", %2: f32[2,2,72,16] "v", %3: f32[2,1,24,72] "m") -> (%4) {
  %4 = Attention(%0, %1, %2, %3) : f32[2,2,24,16] "y" node "att"
}"#,
        "tensor cores",
    );
}

#[test]
fn flash_causal_grouped_query_attention_on_3d_operands() {
    // 6 query heads over 2 key-value heads of 16, batch 2, 70 positions.
    check_flash(
        "flash_gqa_causal",
        r#"graph @a(%0: f32[2,70,96] "q", %1: f32[2,70,32] "k", %2: f32[2,70,32] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) {is_causal = 1, q_num_heads = 6, kv_num_heads = 2} : f32[2,70,96] "y" node "att"
}"#,
        "tensor cores",
    );
}

#[test]
fn flash_heads_of_128_and_of_80_by_112() {
    // The widest head (no prefetch: its registers), and depths and widths that are
    // multiples of 16 but not powers of two.
    check_flash(
        "flash_128",
        r#"graph @a(%0: f32[1,1,20,128] "q", %1: f32[1,1,64,128] "k", %2: f32[1,1,64,128] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) : f32[1,1,20,128] "y" node "att"
}"#,
        "in shared memory, K rows along the keys, v4 loads",
    );
    check_flash(
        "flash_80x112",
        r#"graph @a(%0: f32[1,1,16,80] "q", %1: f32[1,1,40,80] "k", %2: f32[1,1,40,112] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) : f32[1,1,16,112] "y" node "att"
}"#,
        "V key rows, v4 loads",
    );
}

#[test]
fn flash_declines_heads_not_multiples_of_16_to_the_warp_kernel() {
    let k = attention_kernel(
        r#"graph @a(%0: f32[1,2,4,40] "q", %1: f32[1,2,40,40] "k", %2: f32[1,2,40,70] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) : f32[1,2,4,70] "y" node "att"
}"#,
    );
    let tune = Tune { attention: Some(Attn::Flash), ..Tune::default() };
    let m = cuda::compile_tuned(&[(&k, KernelClass::Attention)], &tune).unwrap();
    let note = &m.notes[0];
    assert!(note.starts_with("attention (a warp per query row") && note.contains("not on the tensor cores"), "{note}");
    // With half storage too, by default; the warp kernel reads and writes the halves.
    for half in [DType::F16, DType::BF16] {
        let h = stored_as(&k, half);
        let name = format!("declined_{half}");
        let m =
            assemble_and_simulate(&name, &h, &Tune::default(), "attention (a warp per query row", HALF_WARP_TOL, 17);
        assert!(m.notes[0].contains("not on the tensor cores"), "{name}: {}", m.notes[0]);
    }
}

/// The warp kernel with a half result: its f32 result is within [`WARP_TOL`] of the
/// interpreter's before both round it once to the half type, so they differ by at
/// most one ulp of it (bf16: 2⁻⁷ relative) beside that.
const HALF_WARP_TOL: (f64, f64) = (1.0 / 128.0, 1.0 / 16384.0);

#[test]
fn warp_kernel_reads_and_writes_halves() {
    // `attn=on` at half storage: the 4-D heads with tails and a boolean mask.
    let on = Tune { attention: Some(Attn::Warp), ..Tune::default() };
    for (name, text) in [
        (
            "warp_half_4d",
            r#"graph @a(%0: f32[2,3,7,5] "q", %1: f32[2,3,9,5] "k", %2: f32[2,3,9,6] "v") -> (%3) {
  %3 = Attention(%0, %1, %2) : f32[2,3,7,6] "y" node "att"
}"#,
        ),
        (
            "warp_half_mask",
            r#"graph @a(%0: f32[1,2,4,40] "q", %1: f32[1,2,40,40] "k", %2: f32[1,2,40,70] "v", %3: bool[1,1,4,40] "m") -> (%4) {
  %4 = Attention(%0, %1, %2, %3) {scale = 0.2} : f32[1,2,4,70] "y" node "att"
}"#,
        ),
    ] {
        let k = attention_kernel(text);
        for half in [DType::F16, DType::BF16] {
            let h = stored_as(&k, half);
            let m = assemble_and_simulate(
                &format!("{name}_{half}"),
                &h,
                &on,
                "attention (a warp per query row",
                HALF_WARP_TOL,
                19,
            );
            assert!(m.ptx().contains(&format!("cvt.rn.{half}.f32")) && !m.ptx().contains("ld.global.f32"));
        }
    }
}

/// A bert-like layer of `heads` heads of 32 over `n` positions (hidden `32·heads`):
/// projections of `x` by constant weights, attention, the heads merged and the output
/// projection, whose result is the graph's output.
fn layer(n: usize, heads: usize) -> String {
    let h = 32 * heads;
    let weight = |seed: usize| -> String {
        let v: Vec<String> =
            (0..h * h).map(|i| format!("{:.4}", (((i * 7 + seed * 13) % 17) as f64 - 8.0) / 64.0)).collect();
        v.join(", ")
    };
    format!(
        r#"graph @a(%0: f32[1,{n},{h}] "x") -> (%19) {{
  %1 = const f32[{h},{h}] [{wq}] "wq"
  %2 = const f32[{h},{h}] [{wk}] "wk"
  %3 = const f32[{h},{h}] [{wv}] "wv"
  %4 = const f32[{h},{h}] [{wo}] "wo"
  %5 = const i64[4] [1, {n}, {heads}, 32] "split"
  %6 = const i64[3] [1, {n}, {h}] "merge"
  %7 = MatMul(%0, %1) : f32[1,{n},{h}] "q" node "q"
  %8 = MatMul(%0, %2) : f32[1,{n},{h}] "k" node "k"
  %9 = MatMul(%0, %3) : f32[1,{n},{h}] "v" node "v"
  %10 = Reshape(%7, %5) : f32[1,{n},{heads},32] "qs" node "qs"
  %11 = Transpose(%10) {{perm = [0, 2, 1, 3]}} : f32[1,{heads},{n},32] "qh" node "qh"
  %12 = Reshape(%8, %5) : f32[1,{n},{heads},32] "ks" node "ks"
  %13 = Transpose(%12) {{perm = [0, 2, 1, 3]}} : f32[1,{heads},{n},32] "kh" node "kh"
  %14 = Reshape(%9, %5) : f32[1,{n},{heads},32] "vs" node "vs"
  %15 = Transpose(%14) {{perm = [0, 2, 1, 3]}} : f32[1,{heads},{n},32] "vh" node "vh"
  %16 = Attention(%11, %13, %15) : f32[1,{heads},{n},32] "ctx" node "att"
  %17 = Transpose(%16) {{perm = [0, 2, 1, 3]}} : f32[1,{n},{heads},32] "ct" node "ct"
  %18 = Reshape(%17, %6) : f32[1,{n},{h}] "cm" node "cm"
  %19 = MatMul(%18, %4) : f32[1,{n},{h}] "y" node "out"
}}"#,
        wq = weight(1),
        wk = weight(2),
        wv = weight(3),
        wo = weight(4),
    )
}

#[test]
fn half_storage_reaches_the_attention_kernel_and_the_projection_after_it() {
    let text = layer(40, 2);
    let g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let formed =
        kiln_lower::form_with(&g, Formation::ImplicitGemm, Some(&kiln_flow::attention::accept_all)).expect("formation");
    for precision in [Precision::F16, Precision::BF16] {
        let half = precision.storage().unwrap();
        for cuda_rule in [true, false] {
            let mut p = formed.clone();
            if cuda_rule {
                narrow_storage_for(&mut p, precision, true);
            } else {
                narrow_storage(&mut p, precision);
            }
            let at =
                p.dispatches.iter().position(|d| d.class == KernelClass::Attention).expect("an attention dispatch");
            let d = &p.dispatches[at];
            let a = Attention::of(&d.kernel).expect("the attention form");
            let want = if cuda_rule { half } else { DType::F32 };
            for o in [&a.q, &a.k, &a.v] {
                assert_eq!(
                    Attention::dtype(&d.kernel, o),
                    want,
                    "{precision}, CUDA's rule {cuda_rule}:
{p}"
                );
            }
            assert_eq!(
                d.kernel.output.dtype, want,
                "{precision}:
{p}"
            );
            // The output projection reads the attention's result as it is stored: a
            // half operand, which takes the tensor cores on CUDA.
            let result = p.storage(d.result);
            let proj = p.dispatches[at + 1..]
                .iter()
                .find(|x| x.operands.iter().any(|&o| p.storage(o) == result))
                .expect("the output projection");
            assert_eq!(proj.class, KernelClass::Contraction, "{p}");
            let slot = proj.operands.iter().position(|&o| p.storage(o) == result).unwrap();
            assert_eq!(
                proj.kernel.inputs[slot].dtype, want,
                "{precision}:
{p}"
            );
            if cuda_rule {
                let m = cuda::compile(&[(&proj.kernel, proj.class)]).unwrap();
                assert!(m.notes[0].contains("mma"), "{precision}: {}", m.notes[0]);
                let name = format!("layer_{precision}");
                let tol = if half == DType::F16 { F16_TOL } else { BF16_TOL };
                let form = format!("attention (tensor cores: mma.sync {half}, {half} result");
                assemble_and_simulate(&name, &d.kernel, &Tune::default(), &form, tol, 23);
            }
        }
    }
}

/// The CUDA target's default rule (kiln-compiler's formation at half precision) forms
/// only heads the tensor-core kernel takes (`flash::declines` says none): a head it
/// declines keeps its three kernels instead of running on the slower warp-per-row
/// kernel; the forced rule (`attn=on|flash`) forms every chain.
#[test]
fn the_default_rule_forms_only_heads_the_tensor_cores_take() {
    let tensor_cores = |k: &Kernel, a: &Attention| cuda::flash::declines(k, a).is_none();
    for (depth, width, takes) in [(32, 32, true), (64, 48, true), (40, 70, false), (144, 32, false)] {
        let text = format!(
            r#"graph @a(%0: f32[1,2,16,{depth}] "q", %1: f32[1,2,24,{depth}] "k", %2: f32[1,2,24,{width}] "v") -> (%3) {{
  %3 = Attention(%0, %1, %2) : f32[1,2,16,{width}] "y" node "att"
}}"#
        );
        let g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let formed = |accept: kiln_flow::attention::Accept<'_>| {
            let p = kiln_lower::form_with(&g, Formation::ImplicitGemm, Some(accept)).expect("formation");
            p.dispatches.iter().filter(|d| d.class == KernelClass::Attention).count()
        };
        assert_eq!(formed(&kiln_flow::attention::accept_all), 1, "{text}");
        assert_eq!(formed(&tensor_cores), usize::from(takes), "{text}");
    }
}
