//! Padding kernels (`cpu::pad`): `out[q] = x[q + c]` with `Pad` bounds, against the
//! interpreter, bit for bit: pads on every side, crops (positive shifts), rows wholly
//! outside the input, widths below, at and above the vector width, a non-zero pad
//! value, ranks 1 to 4, workgroup splits, nothing written outside the output.

mod common;

use common::*;
use kiln_codegen::cpu::{compile_with, CpuTarget, Options};
use kiln_flow::{Bounds, Kernel, KernelBuilder};
use kiln_ir::{DType, Shape, TensorType};

fn tt(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

/// `out[q] = x[q + shift]`, pad value `value` outside `x`.
fn padding(in_dims: &[usize], out_dims: &[usize], shift: &[i64], value: f32) -> Kernel {
    let mut b = KernelBuilder::new("pad", vec![tt(in_dims)], tt(out_dims));
    let q = b.out_index();
    let idx = q
        .iter()
        .zip(shift)
        .map(|(&qd, &s)| {
            let c = b.index(s);
            b.add(qd, c)
        })
        .collect();
    let v = b.load_with(0, idx, Bounds::Pad(value.to_bits() as u64));
    b.finish(v).unwrap()
}

#[test]
fn paddings_match_the_interpreter() {
    if !(std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")) {
        eprintln!("skipped: this CPU lacks AVX2+FMA, so the padding kernel is not used");
        return;
    }
    let cases: Vec<(Vec<usize>, Vec<usize>, Vec<i64>, f32)> = vec![
        (vec![1, 3, 5, 6], vec![1, 3, 7, 8], vec![0, 0, -1, -1], 0.0),
        (vec![2, 4, 9, 70], vec![2, 4, 13, 74], vec![0, 0, -2, -2], 0.0),
        (vec![1, 2, 4, 4], vec![1, 2, 6, 5], vec![0, 0, -1, -1], 1.5),
        (vec![3, 20], vec![5, 30], vec![-1, -3], -2.0),
        (vec![37], vec![41], vec![-2], 0.25),
        (vec![2, 3, 16], vec![2, 3, 8], vec![0, 0, 4], 0.0),
        (vec![2, 9, 9], vec![4, 5, 12], vec![1, 2, -1], 0.0),
        (vec![1, 1, 3, 3], vec![1, 1, 11, 11], vec![0, 0, -4, -4], 0.0),
        (vec![1, 2, 7, 100], vec![1, 2, 9, 230], vec![0, 0, -1, -100], 0.0),
    ];
    for (i, (inp, out, shift, value)) in cases.into_iter().enumerate() {
        let k = padding(&inp, &out, &shift, value);
        let m = compile_with(&[&k], &CpuTarget::Host, &Options::default()).unwrap();
        assert!(m.notes[0].starts_with("padding copy"), "case {i}: {}", m.notes[0]);
        let x = random_f32(&inp, 3.0, i as u64);
        check_with(&k, &[&x], EXACT, &[Config { target: CpuTarget::Host, options: Options::default() }]);
    }
}
