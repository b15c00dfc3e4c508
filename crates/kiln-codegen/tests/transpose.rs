//! Transposing copies (`cpu::transpose`): `out[o.., i, j] = x[.. + i + S·j]` in blocks of
//! 8 × 8 — rows and columns that are and are not multiples of 8 (every column tail from
//! 1 to 7, last blocks of 1 to 7 rows), input rows longer than the output's columns
//! (`S` above the rows: a transpose of a slice), an outer axis with its own stride, axes
//! of extent 1 among the others (an `[N, L, C, 1]` image to `[C, N, L, 1]`), 4-byte
//! integers — against the interpreter bit for bit, with workgroup ranges run in order
//! and last first and nothing written outside the output. A transpose with fewer than 8
//! rows stays a table gather.

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget, Options};
use kiln_flow::{Kernel, KernelBuilder};
use kiln_ir::{DType, Shape, TensorType};

fn tt(d: DType, dims: &[usize]) -> TensorType {
    TensorType::new(d, Shape::new(dims.to_vec()).unwrap())
}

/// Compiles `k`, checks the note, and compares it with the interpreter over several
/// workgroup splits, in order and reversed.
fn check(k: &Kernel, note: &str) {
    let cfg = Config { target: CpuTarget::X86_64V3, options: Options::default() };
    let m = compile_with(&classify(&[k]), &cfg.target, &cfg.options).unwrap();
    assert_eq!(m.notes[0], note, "{k}");
    let x = random_f32(k.inputs[0].shape.dims(), 2.0, k.inputs[0].shape.numel() as u64);
    let x = if k.inputs[0].dtype == DType::F32 {
        x
    } else {
        kiln_ir::Tensor::new(k.inputs[0].clone(), x.bytes().clone()).unwrap()
    };
    let want = kiln_flow::interp::run(k, &[&x]).unwrap();
    for splits in [1, 3, 7] {
        for reversed in [false, true] {
            let got = run_compiled_in(k, &[&x], &cfg, splits, reversed);
            assert_eq!(got.bytes(), want.bytes(), "{}: splits {splits} reversed {reversed}", k.name);
        }
    }
}

/// `out[o, i, j] = x[o, j, i + shift]` of an `[outer, cols, rows + pad]` input.
fn transposed(d: DType, outer: usize, rows: usize, cols: usize, pad: usize, shift: i64) -> Kernel {
    let mut b = KernelBuilder::new(
        format!("t{outer}x{rows}x{cols}p{pad}"),
        vec![tt(d, &[outer, cols, rows + pad])],
        tt(d, &[outer, rows, cols]),
    );
    let o = b.out_index();
    let sh = b.index(shift);
    let i = b.add(o[1], sh);
    let v = b.load(0, vec![o[0], o[2], i]);
    b.finish(v).unwrap()
}

#[test]
fn transposes_match_the_interpreter() {
    require_avx2_fma!(", so the transpose kernel is not used");
    for (rows, cols) in [(8, 8), (16, 24), (9, 8), (8, 9), (11, 13), (15, 31), (23, 17), (64, 40)] {
        check(&transposed(DType::F32, 1, rows, cols, 0, 0), "transpose (avx)");
    }
    // Input rows longer than the output's columns, read from an offset; an outer axis.
    check(&transposed(DType::F32, 3, 10, 12, 5, 2), "transpose (avx)");
    check(&transposed(DType::I32, 2, 17, 9, 1, 1), "transpose (avx)");
    // magika's image: [1, L, C, 1] to [C, 1, L, 1].
    let (l, c) = (45usize, 12usize);
    let mut b = KernelBuilder::new("image", vec![tt(DType::F32, &[1, l, c, 1])], tt(DType::F32, &[c, 1, l, 1]));
    let o = b.out_index();
    let v = b.load(0, vec![o[1], o[2], o[0], o[3]]);
    check(&b.finish(v).unwrap(), "transpose (avx)");
    // Fewer than 8 rows: a table gather.
    check(&transposed(DType::F32, 1, 5, 16, 0, 0), "table gather (avx2)");
}
