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

mod common;
mod ptxas;
mod ptxsim;

use kiln_codegen::cuda;
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
