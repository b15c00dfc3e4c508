//! Resampling kernels (`cpu::resample`): Resize as `kiln-lower` writes it, compiled at
//! the speed level and run against the kernel interpreter, over odd sizes (1, 3, 7, 17),
//! up- and downscales (integer and not), every mode, coordinate transformation and
//! nearest rounding, antialiasing, exclude_outside, tf_crop_and_resize extrapolation, and
//! several dtypes. Every case also states which path it must take: the resampling
//! emitter, or (a form it declines) the table gather or the general path, so a test
//! cannot pass by quietly falling back.
//!
//! Bounds. A table copy (nearest) moves bits: exact. An interpolation uses the kernel's
//! own f32 weights (tabulated from its nodes by the interpreter) but combines the rows
//! (`H`) before the columns (`W`) where the kernel sums `W` inside `H`: both orders round
//! each of at most `T_x + T_y` products and sums once in f32, so they differ by at most
//! `2 (T_x + T_y + 1) u · Σ |w_y| |w_x| |x|` (`u` = 2⁻²⁴, the sum over the taps of that
//! output), which the test bounds by `2 (T_x + T_y + 1) u · S_x S_y max|x|` with `S` an
//! axis's largest `Σ |w|` over its positions, read from the same tables.

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with};
use kiln_flow::class::KernelClass;
use kiln_flow::resample::{Axis, Resample};
use kiln_flow::{interp, Kernel};
use kiln_ir::infer::{infer, InferInput};
use kiln_ir::{Attr, Attrs, DType, Op, OpKind, Shape, Tensor};
use kiln_lower::{lower_op, OpCx, OpInput};

const CTMS: [&str; 6] =
    ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"];

fn op(attrs: &[(&str, Attr)]) -> Op {
    let mut a = Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    Op::parse(OpKind::Resize, &a).unwrap()
}

fn s(v: &str) -> Attr {
    Attr::String(v.into())
}

fn f32s(v: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F32, Shape::new(vec![v.len()]).unwrap(), v).unwrap()
}

fn i64s(v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I64, Shape::new(vec![v.len()]).unwrap(), v).unwrap()
}

/// `x` of `dtype` with values in [-2, 2) (floats) or small integers.
fn data(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let shape = Shape::new(dims.to_vec()).unwrap();
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let n = shape.numel();
    if dtype.is_float() {
        let v: Vec<f64> = (0..n).map(|_| r.unit() * 2.0).collect();
        Tensor::from_f64(dtype, shape, &v).unwrap()
    } else {
        let v: Vec<i64> =
            (0..n).map(|_| (r.next() % 100) as i64 + if dtype.is_unsigned_int() { 0 } else { -50 }).collect();
        Tensor::from_i64(dtype, shape, &v).unwrap()
    }
}

/// The one kernel of the Resize `o` of `x` with constant roi (tf_crop_and_resize) and
/// scales or sizes.
fn lower(o: &Op, x: &Tensor, ctm: &str, scales: Option<&[f64]>, sizes: Option<&[i64]>) -> Kernel {
    let n = scales.map(|v| v.len()).or(sizes.map(|v| v.len())).unwrap();
    // The whole of every axis but the last two; a crop of H and a region past both ends
    // of W (extrapolated).
    let roi = (ctm == "tf_crop_and_resize").then(|| {
        let (starts, ends) = ([0.1, -0.2], [0.8, 1.1]);
        let mut v: Vec<f64> = (0..n).map(|k| if k + 2 >= n { starts[k + 2 - n] } else { 0.0 }).collect();
        v.extend((0..n).map(|k| if k + 2 >= n { ends[k + 2 - n] } else { 1.0 }));
        f32s(&v)
    });
    let inputs = [Some(x.clone()), roi, scales.map(f32s), sizes.map(i64s)];
    let ninfer: Vec<Option<InferInput>> =
        inputs.iter().map(|t| t.as_ref().map(|t| InferInput { ty: t.ty(), value: Some(t) })).collect();
    let outs = infer(o, &ninfer, 1).expect("infer");
    let opin: Vec<Option<OpInput>> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| t.as_ref().map(|t| OpInput { ty: t.ty(), value: (i >= 1).then_some(t) }))
        .collect();
    let cx = OpCx { op: o, name: "resize", inputs: &opin, outputs: &outs };
    let mut l = lower_op(&cx).expect("lower");
    assert_eq!(l.steps.len(), 1);
    l.steps.remove(0).kernel
}

/// The speed-level configurations (x86-64-v3, and v4 where the CPU has AVX-512).
fn speed() -> Vec<Config> {
    microkernel_variants(false)
}

/// The path `k` took under `cfg`.
fn note(k: &Kernel, cfg: &Config) -> String {
    compile_with(&classify(&[k]), &cfg.target, &cfg.options).expect("compile").notes[0].clone()
}

/// The largest `Σ |w|` over the positions of a table, and its taps (1, 1 for an axis
/// read at the output index).
fn axis_bound(a: &Axis) -> (f64, usize) {
    match a {
        Axis::Same => (1.0, 1),
        Axis::Table(t) => {
            let s = t
                .weight
                .chunks(t.taps)
                .map(|c| c.iter().map(|&w| (f32::from_bits(w) as f64).abs()).sum::<f64>())
                .fold(0.0, f64::max);
            (s, t.taps)
        }
    }
}

/// The path a case must take.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Want {
    /// The resampling emitter (an interpolation or a table copy).
    Resampling,
    /// A table copy it declines, taken by the table gather (`cpu::gather`).
    Gather,
    /// An interpolation it declines: the general path.
    General,
}

/// Runs `k` on `x` under the speed configurations and checks it against the interpreter
/// (see the module docs for the bound) after checking that it took path `must`.
fn check_kernel(k: &Kernel, x: &Tensor, must: Want) {
    let fast = must == Want::Resampling;
    let want = interp::run(k, &[x]).unwrap_or_else(|e| panic!("interp: {e}"));
    let r = Resample::of(k);
    if fast {
        let r = r.as_ref().unwrap_or_else(|| panic!("not recognised as a resampling:\n{k}"));
        let class = kiln_flow::class::classify(k);
        assert_eq!(class, if r.weights { KernelClass::Window } else { KernelClass::Movement });
    }
    let tol = match &r {
        Some(r) if r.weights => {
            let rank = r.axes.len();
            let (sy, ty) = if rank >= 2 { axis_bound(&r.axes[rank - 2]) } else { (1.0, 1) };
            let (sx, tx) = axis_bound(&r.axes[rank - 1]);
            let max = x.to_f64_vec().iter().fold(0.0f64, |m, v| m.max(v.abs()));
            2.0 * (tx + ty + 1) as f64 * f64::powi(2.0, -24) * sx * sy * max
        }
        _ => 0.0,
    };
    for cfg in speed() {
        let path = note(k, &cfg);
        let took = match must {
            Want::Resampling => path.starts_with("resampling") || path.starts_with("table copy"),
            Want::Gather => path.starts_with("table gather"),
            Want::General => path.starts_with("general"),
        };
        assert!(took, "path {path}, want {must:?}\n{k}");
        for splits in [1, 3, 7] {
            let got = run_compiled(k, &[x], &cfg, splits);
            if tol == 0.0 {
                if let Err(e) = compare(&got, &want, EXACT) {
                    panic!("{:?} splits {splits}: {e}\n{k}", cfg.target);
                }
                continue;
            }
            let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
            for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                assert!(
                    (a - b).abs() <= tol,
                    "{:?} splits {splits}: element {i}: got {a}, want {b} (bound {tol})",
                    cfg.target
                );
            }
        }
    }
}

/// (input H, W) and scales for the last two axes: sizes 1, 3, 7, 17; integer and
/// fractional, up and down.
fn shapes() -> Vec<([usize; 2], [f64; 2])> {
    vec![
        ([3, 7], [2.0, 2.0]),
        ([7, 17], [1.5, 0.6]),
        ([17, 3], [0.6, 3.0]),
        ([1, 7], [1.0, 2.0]),
        ([7, 1], [3.0, 17.0]),
        ([17, 17], [0.5, 1.5]),
        ([3, 3], [2.0, 1.0]),
        ([7, 9], [1.0, 0.5]),
    ]
}

#[test]
fn nearest_every_mode_and_transform() {
    require_avx2_fma!();
    for ctm in CTMS {
        for nm in ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] {
            let o = op(&[
                ("coordinate_transformation_mode", s(ctm)),
                ("nearest_mode", s(nm)),
                ("extrapolation_value", Attr::Float(-3.5)),
            ]);
            for (i, (hw, sc)) in shapes().into_iter().enumerate() {
                let x = data(DType::F32, &[2, 3, hw[0], hw[1]], i as u64);
                let k = lower(&o, &x, ctm, Some(&[1.0, 1.0, sc[0], sc[1]]), None);
                // An affine index map (2× asymmetric floor, a plain copy) is an affine
                // copy or a general kernel, not a table.
                if Resample::of(&k).is_some() {
                    check_kernel(&k, &x, Want::Resampling);
                }
            }
            let x = data(DType::F32, &[1, 2, 5, 4], 9);
            for sz in [[1, 2, 7, 3], [1, 2, 2, 9], [1, 2, 1, 1], [1, 2, 17, 13]] {
                let k = lower(&o, &x, ctm, None, Some(&sz));
                if Resample::of(&k).is_some() {
                    check_kernel(&k, &x, Want::Resampling);
                }
            }
        }
    }
    // The common forms do take the table path.
    let x = data(DType::F32, &[1, 4, 7, 17], 3);
    let o = op(&[("coordinate_transformation_mode", s("half_pixel"))]);
    check_kernel(&lower(&o, &x, "half_pixel", Some(&[1.0, 1.0, 1.5, 0.6]), None), &x, Want::Resampling);
    let o = op(&[("coordinate_transformation_mode", s("asymmetric")), ("nearest_mode", s("floor"))]);
    check_kernel(&lower(&o, &x, "asymmetric", Some(&[1.0, 1.0, 2.0, 2.0]), None), &x, Want::Resampling);
}

#[test]
fn nearest_dtypes() {
    require_avx2_fma!();
    let o =
        op(&[("coordinate_transformation_mode", s("tf_crop_and_resize")), ("extrapolation_value", Attr::Float(7.0))]);
    let o2 = op(&[("coordinate_transformation_mode", s("half_pixel"))]);
    for dt in [DType::F32, DType::I32, DType::U32, DType::I64, DType::F16, DType::U8, DType::F64] {
        let x = data(dt, &[2, 3, 7, 5], 4);
        // (8-byte elements: a plain nearest copy is a table gather of 4-byte pairs
        // (`cpu::gather`); one that extrapolates selects a constant, which it has no
        // form for.)
        let (fast, copy) = match dt.storage_bytes(1) {
            4 => (Want::Resampling, Want::Resampling),
            8 => (Want::General, Want::Gather),
            _ => (Want::General, Want::General),
        };
        check_kernel(&lower(&o, &x, "tf_crop_and_resize", Some(&[1.0, 1.0, 1.5, 2.0]), None), &x, fast);
        check_kernel(&lower(&o2, &x, "half_pixel", Some(&[1.0, 1.0, 0.6, 3.0]), None), &x, copy);
    }
}

#[test]
fn linear_and_cubic_every_transform() {
    require_avx2_fma!();
    for mode in ["linear", "cubic"] {
        for ctm in CTMS {
            for exclude in [0, 1] {
                let o = op(&[
                    ("mode", s(mode)),
                    ("coordinate_transformation_mode", s(ctm)),
                    ("exclude_outside", Attr::Int(exclude)),
                    ("extrapolation_value", Attr::Float(0.25)),
                ]);
                for (i, (hw, sc)) in shapes().into_iter().enumerate() {
                    let x = data(DType::F32, &[1, 3, hw[0], hw[1]], 10 + i as u64);
                    let k = lower(&o, &x, ctm, Some(&[1.0, 1.0, sc[0], sc[1]]), None);
                    check_kernel(&k, &x, Want::Resampling);
                }
                let x = data(DType::F32, &[2, 2, 5, 6], 20);
                for sz in [[2, 2, 3, 11], [2, 2, 17, 1], [2, 2, 1, 7]] {
                    check_kernel(&lower(&o, &x, ctm, None, Some(&sz)), &x, Want::Resampling);
                }
            }
        }
        let o = op(&[("mode", s(mode)), ("cubic_coeff_a", Attr::Float(-0.5))]);
        let x = data(DType::F32, &[1, 2, 5, 6], 21);
        check_kernel(&lower(&o, &x, "half_pixel", Some(&[1.0, 1.0, 1.4, 0.8]), None), &x, Want::Resampling);
    }
}

#[test]
fn antialias() {
    require_avx2_fma!();
    let x = data(DType::F32, &[1, 2, 17, 33], 30);
    for mode in ["linear", "cubic"] {
        for ctm in ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"] {
            for exclude in [0, 1] {
                let o = op(&[
                    ("mode", s(mode)),
                    ("antialias", Attr::Int(1)),
                    ("coordinate_transformation_mode", s(ctm)),
                    ("exclude_outside", Attr::Int(exclude)),
                ]);
                for sc in [[0.5, 0.3], [0.75, 1.5], [2.0, 1.0], [0.2, 0.6]] {
                    check_kernel(&lower(&o, &x, ctm, Some(&[1.0, 1.0, sc[0], sc[1]]), None), &x, Want::Resampling);
                }
            }
        }
    }
}

#[test]
fn ranks_axes_and_declined_forms() {
    require_avx2_fma!();
    // Rank 1 and 2, and rank 3 with only the last axis resized: fast.
    for mode in ["nearest", "linear", "cubic"] {
        let o = op(&[("mode", s(mode))]);
        let x = data(DType::F32, &[17], 40);
        for sc in [0.6, 1.5, 3.0] {
            let k = lower(&o, &x, "half_pixel", Some(&[sc]), None);
            if Resample::of(&k).is_some() {
                check_kernel(&k, &x, Want::Resampling);
            }
        }
        let x = data(DType::F32, &[7, 3], 41);
        check_kernel(&lower(&o, &x, "half_pixel", Some(&[1.5, 2.0]), None), &x, Want::Resampling);
        let x = data(DType::F32, &[3, 7, 5], 42);
        check_kernel(&lower(&o, &x, "half_pixel", Some(&[1.0, 1.0, 1.7]), None), &x, Want::Resampling);
        // Only H resized: the vertical step writes the output rows itself.
        let x = data(DType::F32, &[2, 7, 13], 43);
        check_kernel(&lower(&o, &x, "half_pixel", Some(&[1.0, 2.5, 1.0]), None), &x, Want::Resampling);
        // An NHWC image (axes 1 and 2 resized, channels last): declined; the nearest
        // table copy is then a table gather, the interpolations take the general path.
        let x = data(DType::F32, &[1, 5, 4, 3], 44);
        let declined = if mode == "nearest" { Want::Gather } else { Want::General };
        check_kernel(&lower(&o, &x, "half_pixel", Some(&[1.0, 2.0, 1.5, 1.0]), None), &x, declined);
    }
    // Interpolated integers and narrow floats stay general.
    for dt in [DType::U8, DType::I32, DType::F16, DType::F64] {
        let x = data(dt, &[1, 2, 5, 7], 45);
        let o = op(&[("mode", s("linear"))]);
        check_kernel(&lower(&o, &x, "half_pixel", Some(&[1.0, 1.0, 2.0, 1.5]), None), &x, Want::General);
    }
}

#[test]
fn wide_rows_and_many_planes() {
    require_avx2_fma!();
    // Rows of several vectors with a tail, many planes split across workgroup ranges.
    let x = data(DType::F32, &[2, 16, 10, 41], 50);
    for mode in ["nearest", "linear", "cubic"] {
        let o = op(&[("mode", s(mode)), ("coordinate_transformation_mode", s("pytorch_half_pixel"))]);
        check_kernel(&lower(&o, &x, "pytorch_half_pixel", Some(&[1.0, 1.0, 2.0, 2.0]), None), &x, Want::Resampling);
        check_kernel(&lower(&o, &x, "pytorch_half_pixel", Some(&[1.0, 1.0, 0.5, 0.5]), None), &x, Want::Resampling);
    }
}
