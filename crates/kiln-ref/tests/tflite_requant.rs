//! TFLite's fixed-point requantisation (`kiln_ref::tflite_quant`) against LiteRT, on single
//! int8 FULLY_CONNECTED and CONV_2D ops, and how far the ONNX-style float requantisation
//! lands from LiteRT.
//!
//! The data comes from `scripts/tflite_requant_cases.py` (run by `scripts/setup-test-data`):
//! per op, under `$KILN_TEST_DATA/ref/tflite-requant/MODEL/OUTPUT/`, the int8 input, the
//! per-channel int8 weights and their scales, the int32 bias, the scales and zero points,
//! and LiteRT's int8 output from its reference kernels (`reference.npy`) and from its
//! builtin, optimised kernels (`builtin.npy`, what `.cache/ref/tflite` holds). A missing
//! case fails the test.
//!
//! Asserted: LiteRT's reference CONV_2D equals double rounding (TFLite's default
//! `MultiplyByQuantizedMultiplier`) on every element; its reference FULLY_CONNECTED equals
//! single rounding (`TFLITE_SINGLE_ROUNDING`'s form) on every element; every form is
//! within one step of both LiteRT outputs. Printed (`REQUANT` lines): the count of elements
//! where each form — double, single, float — differs from each LiteRT output.

use kiln_ir::tensor::Element;
use kiln_ir::{npy, Tensor};
use kiln_ref::tflite_quant::{channel_scales, conv2d, fully_connected, ConvShape, Requant, Rounding};
use std::path::PathBuf;

fn data_dir() -> PathBuf {
    match std::env::var_os("KILN_TEST_DATA") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache"),
    }
}

fn load(case: &str, file: &str) -> Tensor {
    let p = data_dir().join("ref/tflite-requant").join(case).join(format!("{file}.npy"));
    let b = std::fs::read(&p).unwrap_or_else(|e| {
        panic!("{}: {e}; run scripts/setup-test-data (scripts/tflite_requant_cases.py writes it)", p.display())
    });
    npy::read(&b).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn vec<T: Element>(case: &str, file: &str) -> Vec<T> {
    load(case, file).to_vec::<T>().unwrap_or_else(|e| panic!("{case}/{file}: {e}"))
}

/// Runs the case with each rounding; returns, per rounding, (differing from LiteRT's
/// builtin kernels, differing from its reference kernels), after checking one step.
fn run(case: &str) -> Vec<(Rounding, usize, usize)> {
    let p = vec::<f64>(case, "params");
    let (kind, in_scale, in_zp, out_scale, out_zp, stride, same) =
        (p[0], p[1] as f32, p[2] as i32, p[3] as f32, p[4] as i32, p[5] as usize, p[6] != 0.0);
    let input = load(case, "input");
    let weights = load(case, "weights");
    let (x, w) = (input.to_vec::<i8>().expect("int8 input"), weights.to_vec::<i8>().expect("int8 weights"));
    let bias = vec::<i32>(case, "bias");
    let scales = channel_scales(in_scale, &vec::<f32>(case, "wscale"), out_scale);
    let builtin = vec::<i8>(case, "builtin");
    let reference = vec::<i8>(case, "reference");
    let mut counts = Vec::new();
    for rounding in [Rounding::Double, Rounding::Single, Rounding::Float] {
        let q = Requant {
            input_zero_point: in_zp,
            output_zero_point: out_zp,
            scales: scales.clone(),
            range: (-128, 127),
            rounding,
        };
        let got = if kind == 0.0 {
            let depth = *weights.shape().dims().last().expect("weights rank");
            fully_connected(&x, depth, &w, &bias, &q)
        } else {
            let d = |t: &Tensor| -> [usize; 4] { t.shape().dims().try_into().expect("rank 4") };
            conv2d(&x, &w, &bias, &ConvShape { input: d(&input), weights: d(&weights), stride, same }, &q)
        };
        assert_eq!(got.len(), builtin.len(), "{case}: output size");
        let mut differ = [0usize; 2];
        for (k, want) in [&builtin, &reference].into_iter().enumerate() {
            for (i, (&a, &b)) in got.iter().zip(want.iter()).enumerate() {
                let steps = (a as i32 - b as i32).abs();
                assert!(steps <= 1, "{case}: {rounding:?} gives {a} at {i}, LiteRT {b} ({steps} steps)");
                differ[k] += usize::from(steps != 0);
            }
        }
        eprintln!(
            "REQUANT {case} {rounding:?}: {} of {} elements differ from LiteRT's builtin kernels, {} from its reference kernels",
            differ[0],
            got.len(),
            differ[1]
        );
        counts.push((rounding, differ[0], differ[1]));
    }
    counts
}

fn reference_differences(counts: &[(Rounding, usize, usize)], r: Rounding) -> usize {
    counts.iter().find(|c| c.0 == r).map(|c| c.2).expect("rounding run")
}

#[test]
fn conv2d_same_matches_litert_reference_kernel() {
    let c = run("conv1_int8io/output");
    assert_eq!(reference_differences(&c, Rounding::Double), 0, "double rounding against LiteRT's reference CONV_2D");
}

#[test]
fn conv2d_valid_stride2_matches_litert_reference_kernel() {
    let c = run("conv1_int8io/output_s2");
    assert_eq!(reference_differences(&c, Rounding::Double), 0, "double rounding against LiteRT's reference CONV_2D");
}

#[test]
fn fully_connected_matches_litert_reference_kernel() {
    let c = run("fc_int8io/output");
    assert_eq!(
        reference_differences(&c, Rounding::Single),
        0,
        "single rounding against LiteRT's reference FULLY_CONNECTED"
    );
}
