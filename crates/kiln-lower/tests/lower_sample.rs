//! Lowering of the sampling and folding ops (GridSample, Col2Im, RoiAlign,
//! DeformConv), checked against the reference evaluator on odd shapes: every mode,
//! padding rule and coordinate convention, grids and offsets that reach outside the
//! input, every operand run-time data except Col2Im's shapes.

mod common;

use common::{check, floats, ia, infer_types, int, ints, lower_fails, op, rand, s, Bind, F32};
use kiln_ir::{Attr, DType, OpKind, Tensor};

fn f(x: f32) -> Attr {
    Attr::Float(x)
}

#[test]
fn grid_sample_every_mode_padding_and_alignment() {
    // X [2, 3, 5, 7], a grid [2, 4, 3, 2] of coordinates in [-2, 2): many points
    // outside the input, so every padding rule is exercised.
    let cases_2d = [(vec![2, 3, 5, 7], vec![2, 4, 3, 2]), (vec![1, 2, 1, 6], vec![1, 3, 5, 2])];
    // 3-D: X [1, 2, 3, 4, 5], grid [1, 2, 3, 2, 3].
    let cases_3d = [(vec![1, 2, 3, 4, 5], vec![1, 2, 3, 2, 3])];
    let mut n = 0;
    for (xd, gd) in cases_2d.iter().chain(&cases_3d) {
        for mode in ["linear", "nearest", "cubic"] {
            for pad in ["zeros", "border", "reflection"] {
                for align in [0, 1] {
                    let o = op(
                        OpKind::GridSample,
                        &[("mode", s(mode)), ("padding_mode", s(pad)), ("align_corners", int(align))],
                    );
                    let seed = 7 + n;
                    let ins = vec![Some(rand(DType::F32, xd, seed)), Some(rand(DType::F32, gd, seed + 100))];
                    check(&o, &ins, Bind::Runtime, F32);
                    n += 1;
                }
            }
        }
    }
    assert_eq!(n, 54);
}

#[test]
fn grid_sample_f64_and_mixed_grid_dtype() {
    let o = op(OpKind::GridSample, &[("mode", s("cubic")), ("padding_mode", s("reflection"))]);
    let ins = vec![Some(rand(DType::F64, &[1, 2, 4, 3], 3)), Some(rand(DType::F32, &[1, 5, 2, 2], 4))];
    check(&o, &ins, Bind::Runtime, F32);
}

#[test]
fn col2im_strides_dilations_pads() {
    // (image, block, dilations, pads, strides)
    type Case<'a> = (&'a [i64], &'a [i64], &'a [i64], &'a [i64], &'a [i64]);
    let cases: [Case; 5] = [
        (&[5, 5], &[1, 5], &[1, 1], &[0, 0, 0, 0], &[1, 1]),
        (&[6, 7], &[2, 3], &[1, 2], &[1, 0, 2, 1], &[2, 1]),
        (&[4, 9], &[3, 2], &[2, 3], &[2, 1, 1, 2], &[3, 2]),
        (&[3, 4, 5], &[1, 2, 2], &[1, 1, 2], &[0, 1, 0, 0, 0, 1], &[1, 2, 1]),
        (&[7], &[3], &[2], &[1, 2], &[3]),
    ];
    for (k, (image, block, dil, pads, strides)) in cases.iter().enumerate() {
        let o = op(OpKind::Col2Im, &[("dilations", ia(dil)), ("pads", ia(pads)), ("strides", ia(strides))]);
        let mut l = 1usize;
        for d in 0..image.len() {
            let span = dil[d] * (block[d] - 1) + 1;
            l *= ((image[d] + pads[d] + pads[d + image.len()] - span) / strides[d] + 1) as usize;
        }
        let kprod: i64 = block.iter().product();
        let c = 2;
        let x = rand(DType::F32, &[3, c * kprod as usize, l], 11 + k as u64);
        let ins = vec![Some(x), Some(ints(&[image.len()], image)), Some(ints(&[block.len()], block))];
        check(&o, &ins, Bind::ConstFrom(1), F32);
    }
}

#[test]
fn roi_align_modes_and_coordinates() {
    // Boxes inside, reaching outside, degenerate, and in both batches.
    let rois = floats(
        &[5, 4],
        &[0.3, 1.7, 6.2, 4.9, -2.5, -1.0, 3.0, 12.0, 5.0, 5.0, 5.0, 5.0, 1.25, 0.5, 9.75, 7.5, 7.0, 2.0, 8.9, 6.6],
    );
    let bi = ints(&[5], &[1, 0, 1, 0, 1]);
    let mut n = 0;
    for mode in ["avg", "max"] {
        for coords in ["half_pixel", "output_half_pixel"] {
            for (oh, ow, ratio, scale) in [(3, 4, 2, 1.0), (2, 5, 3, 0.5), (1, 1, 1, 1.0)] {
                let o = op(
                    OpKind::RoiAlign,
                    &[
                        ("mode", s(mode)),
                        ("coordinate_transformation_mode", s(coords)),
                        ("output_height", int(oh)),
                        ("output_width", int(ow)),
                        ("sampling_ratio", int(ratio)),
                        ("spatial_scale", f(scale)),
                    ],
                );
                let x = rand(DType::F32, &[2, 3, 7, 9], 20 + n);
                check(&o, &[Some(x), Some(rois.clone()), Some(bi.clone())], Bind::Runtime, F32);
                n += 1;
            }
        }
    }
}

#[test]
fn roi_align_adaptive_grid_is_refused() {
    let o = op(OpKind::RoiAlign, &[("sampling_ratio", int(0))]);
    let ins = vec![
        Some(rand(DType::F32, &[1, 1, 4, 4], 1)),
        Some(floats(&[1, 4], &[0.0, 0.0, 3.0, 3.0])),
        Some(ints(&[1], &[0])),
    ];
    let out = infer_types(&o, &ins, 1);
    let e = lower_fails(&o, &ins, |_| false, &out);
    assert!(e.contains("sampling_ratio 0"), "{e}");
}

#[test]
fn deform_conv_groups_offsets_mask_bias() {
    // (X dims, W dims, group, offset_group, strides, dilations, pads, mask, bias)
    let cases = [
        ([1, 1, 3, 3], [1, 1, 2, 2], 1, 1, [1, 1], [1, 1], [1, 1, 1, 1], false, false),
        ([2, 4, 5, 6], [6, 2, 3, 2], 2, 2, [2, 1], [1, 2], [1, 0, 2, 1], true, true),
        ([1, 6, 4, 7], [3, 6, 2, 3], 1, 3, [1, 2], [2, 1], [0, 1, 1, 0], true, false),
        ([1, 3, 6, 5], [6, 1, 3, 3], 3, 1, [1, 1], [1, 1], [0, 0, 0, 0], false, true),
    ];
    for (k, &(x, w, group, offset_group, strides, dil, pads, mask, bias)) in cases.iter().enumerate() {
        let (kh, kw) = (w[2], w[3]);
        let out: Vec<usize> = (0..2)
            .map(|d| {
                let span = (w[2 + d] as i64 - 1) * dil[d] + 1;
                ((x[2 + d] as i64 + pads[d] + pads[d + 2] - span) / strides[d] + 1) as usize
            })
            .collect();
        let og = offset_group as usize;
        let o = op(
            OpKind::DeformConv,
            &[
                ("group", int(group)),
                ("offset_group", int(offset_group)),
                ("kernel_shape", ia(&[kh as i64, kw as i64])),
                ("strides", ia(&strides)),
                ("dilations", ia(&dil)),
                ("pads", ia(&pads)),
            ],
        );
        let seed = 40 + 10 * k as u64;
        let offset = rand(DType::F32, &[x[0], og * 2 * kh * kw, out[0], out[1]], seed + 2);
        let ins: Vec<Option<Tensor>> = vec![
            Some(rand(DType::F32, &x, seed)),
            Some(rand(DType::F32, &w, seed + 1)),
            Some(offset),
            bias.then(|| rand(DType::F32, &[w[0]], seed + 3)),
            mask.then(|| rand(DType::F32, &[x[0], og * kh * kw, out[0], out[1]], seed + 4)),
        ];
        check(&o, &ins, Bind::Runtime, F32);
    }
}
