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

mod common;
mod ptxas;
mod ptxsim;

use kiln_codegen::cuda;
use kiln_codegen::cuda::tune::Tune;
use kiln_flow::class::KernelClass;
use kiln_flow::program::Formation;
use ptxas::assemble_ptx_verbose;

/// The attention kernel the CUDA formation makes of the one-node graph `text`.
fn attention_kernel(text: &str) -> kiln_flow::Kernel {
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let p = kiln_lower::form_with(&g, Formation::ImplicitGemm, true).expect("formation");
    let found: Vec<_> = p.dispatches.iter().filter(|d| d.class == KernelClass::Attention).collect();
    assert_eq!(found.len(), 1, "attention dispatches in\n{p}");
    found[0].kernel.clone()
}

fn check(name: &str, text: &str) {
    let k = attention_kernel(text);
    let m = cuda::compile(&[(&k, KernelClass::Attention)]).unwrap_or_else(|e| panic!("{name}: {e}"));
    let note = &m.notes[0];
    assert!(note.starts_with("attention ("), "{name}: {note}");
    let usage = assemble_ptx_verbose("cuda-attention", name, m.ptx())
        .unwrap_or_else(|e| panic!("{name}: ptxas refused it:\n{e}\n{}", m.ptx()));
    let u = usage[0].1;
    assert!(u.stack == 0 && u.spill_stores == 0 && u.spill_loads == 0, "{name}: {note}: {u:?}");
    // No score matrix: the entry declares no shared or local array of any size.
    assert!(!m.ptx().contains(".shared") && !m.ptx().contains(".local"), "{name}: {}", m.ptx());
    let l = m.launches[0];
    let c = ptxsim::Check {
        tol: ptxsim::Tol::Rel { rel: 2f64.powi(-14), abs: 2f64.powi(-14) },
        specials: false,
        ..ptxsim::Check::exact(11)
    };
    let o = ptxsim::check_against_interpreter(&k, m.ptx(), 0, ptxsim::Grid::of(l.grid, l.block, l.shared), &c)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(o.compared, o.elements, "{name}: every element compared");
    eprintln!("{name}: {note}: {} elements", o.elements);
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

/// The tensor-core kernel of the one-node graph `text` (`attn=flash`): taken by it (its
/// note, with `loads` the K and V copies' kind), assembled by `ptxas -v` with no spill
/// and no stack, and run in the simulator over its whole grid against the interpreter
/// within the f16 tolerance of the module docs.
fn check_flash(name: &str, text: &str, loads: &str) {
    let k = attention_kernel(text);
    let tune = Tune { attention: true, flash_attention: true, ..Tune::default() };
    let m = cuda::compile_tuned(&[(&k, KernelClass::Attention)], &tune).unwrap_or_else(|e| panic!("{name}: {e}"));
    let note = &m.notes[0];
    assert!(note.starts_with("attention (tensor cores"), "{name}: {note}");
    assert!(note.contains(loads), "{name}: {note}");
    let usage = assemble_ptx_verbose("cuda-attention", name, m.ptx())
        .unwrap_or_else(|e| panic!("{name}: ptxas refused it:\n{e}\n{}", m.ptx()));
    let u = usage[0].1;
    assert!(u.stack == 0 && u.spill_stores == 0 && u.spill_loads == 0, "{name}: {note}: {u:?}");
    let l = m.launches[0];
    let c = ptxsim::Check {
        tol: ptxsim::Tol::Rel { rel: 2f64.powi(-10), abs: 2f64.powi(-9) },
        specials: false,
        ..ptxsim::Check::exact(13)
    };
    let o = ptxsim::check_against_interpreter(&k, m.ptx(), 0, ptxsim::Grid::of(l.grid, l.block, l.shared), &c)
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(o.compared, o.elements, "{name}: every element compared");
    eprintln!("{name}: {note}: {u:?}: {} elements, {} blocks", o.elements, l.grid);
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
    // [.., depth, keys] input: rows of depth along the keys in shared memory.
    check_flash(
        "flash_tails",
        r#"graph @a(%0: f32[1,2,70,32] "q", %1: f32[1,2,32,100] "kt", %2: f32[1,2,100,48] "v") -> (%4) {
  %3 = Transpose(%1) {perm = [0, 1, 3, 2]} : f32[1,2,100,32] "k" node "kt"
  %4 = Attention(%0, %3, %2) : f32[1,2,70,48] "y" node "att"
}"#,
        "K rows along the keys, v4 loads, V key rows, v4 loads",
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
    let tune = Tune { attention: true, flash_attention: true, ..Tune::default() };
    let m = cuda::compile_tuned(&[(&k, KernelClass::Attention)], &tune).unwrap();
    let note = &m.notes[0];
    assert!(note.starts_with("attention (a warp per query row") && note.contains("not on the tensor cores"), "{note}");
}
