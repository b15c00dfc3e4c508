//! Reference evaluator: shape and data movement, indexing, generators and Resize.
//! Expected values are hand-computed, or come from an independent loop over the
//! op's definition written out here.

use kiln_ir::{Attr, DType, OpKind, Tensor, TensorType};
mod common;
use common::{run, sh, t, ti, ty};
use kiln_ir::tensor::Element;
use kiln_ref::EvalError;

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn i64s(v: &[i64]) -> Tensor {
    t(&[v.len()], v)
}

/// One result from optional operands, which must succeed.
fn run_o(kind: OpKind, attrs: &[(&str, Attr)], ins: &[Option<&Tensor>], out: TensorType) -> Tensor {
    let mut r = run(kind, attrs, ins, &[out]).unwrap_or_else(|e| panic!("{kind}: {e}"));
    r.remove(0)
}

/// One result, which must succeed.
fn run1(kind: OpKind, attrs: &[(&str, Attr)], ins: &[&Tensor], out: TensorType) -> Tensor {
    let ins: Vec<Option<&Tensor>> = ins.iter().map(|&t| Some(t)).collect();
    run_o(kind, attrs, &ins, out)
}

/// The op fails (an `Invalid` error, not a panic).
fn fails(kind: OpKind, attrs: &[(&str, Attr)], ins: &[Option<&Tensor>], outs: &[TensorType]) {
    match run(kind, attrs, ins, outs) {
        Err(EvalError::Invalid { .. }) => {}
        r => panic!("{kind}: expected an Invalid error, got {r:?}"),
    }
}

/// The op, without attributes, on `x` and the i64 operand `v` (a shape, axes or
/// repeats) fails.
fn fails_ints(kind: OpKind, x: &Tensor, v: &[i64], outs: &[TensorType]) {
    fails(kind, &[], &[Some(x), Some(&i64s(v))], outs);
}

fn int(v: i64) -> Attr {
    Attr::Int(v)
}

fn ints(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn s(v: &str) -> Attr {
    Attr::String(v.to_string())
}

fn f32v(r: &Tensor) -> Vec<f32> {
    r.to_vec::<f32>().unwrap()
}

fn iv(r: &Tensor) -> Vec<i64> {
    r.to_i64_vec().unwrap()
}

fn close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "got {got:?}, want {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= tol * w.abs().max(1.0), "got {got:?}, want {want:?}");
    }
}

fn seq(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

// ---------------------------------------------------------------------------
// Reshape, Flatten, Squeeze, Unsqueeze, Shape, Size.
// ---------------------------------------------------------------------------

#[test]
fn reshape_forms() {
    let x = t(&[2, 3, 4], &seq(24));
    let r = run1(OpKind::Reshape, &[], &[&x, &i64s(&[0, -1])], ty(DType::F32, &[2, 12]));
    assert_eq!(f32v(&r), seq(24));
    let r = run1(OpKind::Reshape, &[], &[&x, &i64s(&[-1, 2, 0])], ty(DType::F32, &[3, 2, 4]));
    assert_eq!(r.shape().dims(), &[3, 2, 4]);
    // allowzero keeps a literal 0.
    let e = t::<f32>(&[0, 3], &[]);
    let r = run1(OpKind::Reshape, &[("allowzero", int(1))], &[&e, &i64s(&[3, 0])], ty(DType::F32, &[3, 0]));
    assert_eq!(r.numel(), 0);
    // Without allowzero, 0 copies the input's dimension.
    let r = run1(OpKind::Reshape, &[], &[&e, &i64s(&[0, 3])], ty(DType::F32, &[0, 3]));
    assert_eq!(r.shape().dims(), &[0, 3]);
    let rt = [ty(DType::F32, &[2, 12])];
    fails_ints(OpKind::Reshape, &x, &[-1, -1], &rt);
    fails_ints(OpKind::Reshape, &x, &[5, -1], &rt);
    fails_ints(OpKind::Reshape, &x, &[2, 13], &rt);
    fails_ints(OpKind::Reshape, &x, &[-2, 12], &rt);
    fails_ints(OpKind::Reshape, &x, &[0, 0, 0, 0], &rt);
    // -1 with a 0 under allowzero cannot be inferred.
    fails(OpKind::Reshape, &[("allowzero", int(1))], &[Some(&e), Some(&i64s(&[0, -1]))], &[ty(DType::F32, &[0, 3])]);
    // A result type that disagrees is an error.
    fails_ints(OpKind::Reshape, &x, &[4, 6], &rt);
}

#[test]
fn flatten_squeeze_unsqueeze() {
    let x = t(&[2, 3, 4], &seq(24));
    for (axis, dims) in [(0, [1, 24]), (1, [2, 12]), (2, [6, 4]), (3, [24, 1]), (-1, [6, 4]), (-3, [1, 24])] {
        let r = run1(OpKind::Flatten, &[("axis", int(axis))], &[&x], ty(DType::F32, &dims));
        assert_eq!(f32v(&r), seq(24));
    }
    fails(OpKind::Flatten, &[("axis", int(4))], &[Some(&x)], &[ty(DType::F32, &[24, 1])]);

    let y = t(&[1, 3, 1], &[1f32, 2., 3.]);
    let r = run_o(OpKind::Squeeze, &[], &[Some(&y), None], ty(DType::F32, &[3]));
    assert_eq!(f32v(&r), vec![1., 2., 3.]);
    let r = run1(OpKind::Squeeze, &[], &[&y, &i64s(&[-1])], ty(DType::F32, &[1, 3]));
    assert_eq!(r.shape().dims(), &[1, 3]);
    fails_ints(OpKind::Squeeze, &y, &[1], &[ty(DType::F32, &[1, 1])]);
    fails_ints(OpKind::Squeeze, &y, &[0, -3], &[ty(DType::F32, &[3, 1])]);

    let z = t(&[3, 4], &seq(12));
    let r = run1(OpKind::Unsqueeze, &[], &[&z, &i64s(&[-1, 0])], ty(DType::F32, &[1, 3, 4, 1]));
    assert_eq!(f32v(&r), seq(12));
    let r = run1(OpKind::Unsqueeze, &[], &[&z, &i64s(&[3, 1])], ty(DType::F32, &[3, 1, 4, 1]));
    assert_eq!(r.shape().dims(), &[3, 1, 4, 1]);
    let sc = Tensor::scalar(5i32);
    let r = run1(OpKind::Unsqueeze, &[], &[&sc, &i64s(&[0])], ty(DType::I32, &[1]));
    assert_eq!(iv(&r), vec![5]);
    fails_ints(OpKind::Unsqueeze, &z, &[1, 1], &[ty(DType::F32, &[3, 1, 1, 4])]);
    fails_ints(OpKind::Unsqueeze, &z, &[4], &[ty(DType::F32, &[3, 4, 1])]);
}

#[test]
fn shape_and_size() {
    let x = t(&[2, 3, 4], &seq(24));
    let r = run1(OpKind::Shape, &[], &[&x], ty(DType::I64, &[3]));
    assert_eq!(iv(&r), vec![2, 3, 4]);
    let r = run1(OpKind::Shape, &[("start", int(-2))], &[&x], ty(DType::I64, &[2]));
    assert_eq!(iv(&r), vec![3, 4]);
    let r = run1(OpKind::Shape, &[("start", int(1)), ("end", int(-1))], &[&x], ty(DType::I64, &[1]));
    assert_eq!(iv(&r), vec![3]);
    // Clamped: start past the end and end before the start give nothing.
    let r = run1(OpKind::Shape, &[("start", int(7))], &[&x], ty(DType::I64, &[0]));
    assert_eq!(r.numel(), 0);
    let r = run1(OpKind::Shape, &[("end", int(-10))], &[&x], ty(DType::I64, &[0]));
    assert_eq!(r.numel(), 0);
    let r = run1(OpKind::Shape, &[("start", int(-10)), ("end", int(10))], &[&x], ty(DType::I64, &[3]));
    assert_eq!(iv(&r), vec![2, 3, 4]);
    let r = run1(OpKind::Size, &[], &[&x], ty(DType::I64, &[]));
    assert_eq!(iv(&r), vec![24]);
    let e = t::<u8>(&[3, 0], &[]);
    assert_eq!(iv(&run1(OpKind::Size, &[], &[&e], ty(DType::I64, &[]))), vec![0]);
}

// ---------------------------------------------------------------------------
// Expand, Tile, Transpose.
// ---------------------------------------------------------------------------

#[test]
fn expand_both_ways() {
    let x = t(&[3, 1], &[1f32, 2., 3.]);
    let r = run1(OpKind::Expand, &[], &[&x, &i64s(&[2, 1, 4])], ty(DType::F32, &[2, 3, 4]));
    let want: Vec<f32> = (0..24).map(|i| ((i / 4) % 3 + 1) as f32).collect();
    assert_eq!(f32v(&r), want);
    // A target shape smaller than the input keeps the input's extents.
    let y = t(&[2, 3], &seq(6));
    let r = run1(OpKind::Expand, &[], &[&y, &i64s(&[1, 1])], ty(DType::F32, &[2, 3]));
    assert_eq!(f32v(&r), seq(6));
    let r = run1(OpKind::Expand, &[], &[&y, &i64s(&[2, 1, 1])], ty(DType::F32, &[2, 2, 3]));
    assert_eq!(f32v(&r), [seq(6), seq(6)].concat());
    fails_ints(OpKind::Expand, &y, &[4], &[ty(DType::F32, &[2, 4])]);
    // Packed dtype.
    let f = Tensor::from_codes(DType::F4E2M1FN, sh(&[2, 1]), &[0x3, 0xC]).unwrap();
    let r = run1(OpKind::Expand, &[], &[&f, &i64s(&[3])], ty(DType::F4E2M1FN, &[2, 3]));
    assert_eq!(r.codes(), vec![0x3, 0x3, 0x3, 0xC, 0xC, 0xC]);
    // Expanding to an empty shape.
    let r = run1(OpKind::Expand, &[], &[&x, &i64s(&[0, 3, 2])], ty(DType::F32, &[0, 3, 2]));
    assert_eq!(r.numel(), 0);
}

#[test]
fn tile_repeats() {
    let x = ti(DType::I32, &[2, 2], &[1, 2, 3, 4]);
    let cases: [([i64; 2], [usize; 2], Vec<i64>); 4] = [
        ([1, 2], [2, 4], vec![1, 2, 1, 2, 3, 4, 3, 4]),
        ([2, 1], [4, 2], vec![1, 2, 3, 4, 1, 2, 3, 4]),
        ([2, 2], [4, 4], vec![1, 2, 1, 2, 3, 4, 3, 4, 1, 2, 1, 2, 3, 4, 3, 4]),
        ([0, 3], [0, 6], vec![]),
    ];
    for (reps, dims, want) in cases {
        let r = run1(OpKind::Tile, &[], &[&x, &i64s(&reps)], ty(DType::I32, &dims));
        assert_eq!(iv(&r), want, "repeats {reps:?}");
    }
    fails_ints(OpKind::Tile, &x, &[2], &[ty(DType::I32, &[4, 2])]);
    fails_ints(OpKind::Tile, &x, &[-1, 1], &[ty(DType::I32, &[2, 2])]);
    // Packed dtype: u4 codes tile bit-exactly.
    let u = ti(DType::U4, &[3], &[1, 15, 7]);
    let r = run1(OpKind::Tile, &[], &[&u, &i64s(&[3])], ty(DType::U4, &[9]));
    assert_eq!(iv(&r), vec![1, 15, 7, 1, 15, 7, 1, 15, 7]);
}

/// `out[i] = in[j]` with `j[perm[d]] = i[d]`, by explicit index arithmetic.
fn transpose_by_definition(dims: &[usize], perm: &[usize], v: &[i64]) -> Vec<i64> {
    let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n);
    for flat in 0..n {
        let mut rem = flat;
        let mut oi = vec![0; od.len()];
        for d in (0..od.len()).rev() {
            oi[d] = rem % od[d];
            rem /= od[d];
        }
        let mut ii = vec![0; dims.len()];
        for d in 0..od.len() {
            ii[perm[d]] = oi[d];
        }
        let src = ii.iter().zip(dims).fold(0, |acc, (&i, &n)| acc * n + i);
        out.push(v[src]);
    }
    out
}

#[test]
fn transpose_perms() {
    let x = t(&[2, 3], &seq(6));
    let r = run1(OpKind::Transpose, &[], &[&x], ty(DType::F32, &[3, 2]));
    assert_eq!(f32v(&r), vec![0., 3., 1., 4., 2., 5.]);
    let dims = [2, 3, 4, 5];
    let v: Vec<i64> = (0..120).collect();
    let x = ti(DType::I64, &dims, &v);
    for perm in [[1, 2, 0, 3], [3, 2, 1, 0], [0, 1, 3, 2], [2, 0, 3, 1], [0, 1, 2, 3]] {
        let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        let p: Vec<i64> = perm.iter().map(|&p| p as i64).collect();
        let r = run1(OpKind::Transpose, &[("perm", ints(&p))], &[&x], ty(DType::I64, &od));
        assert_eq!(iv(&r), transpose_by_definition(&dims, &perm, &v), "{perm:?}");
    }
    fails(OpKind::Transpose, &[("perm", ints(&[0, 0, 1, 2]))], &[Some(&x)], &[ty(DType::I64, &[2, 2, 3, 4])]);
    fails(OpKind::Transpose, &[("perm", ints(&[0, 1, 2]))], &[Some(&x)], &[ty(DType::I64, &[2, 3, 4])]);
    // Empty.
    let e = t::<f32>(&[0, 3], &[]);
    assert_eq!(run1(OpKind::Transpose, &[], &[&e], ty(DType::F32, &[3, 0])).numel(), 0);
}

#[test]
fn transpose_packed_and_exotic_dtypes() {
    // i4 with an odd element count: codes move, padding nibble stays zero.
    let v = [-8, -1, 0, 7, 3, -5];
    let x = ti(DType::I4, &[2, 3], &v);
    let r = run1(OpKind::Transpose, &[], &[&x], ty(DType::I4, &[3, 2]));
    assert_eq!(iv(&r), vec![-8, 7, -1, 3, 0, -5]);
    let x = ti(DType::I4, &[3, 1], &[1, 2, 3]);
    let r = run1(OpKind::Transpose, &[], &[&x], ty(DType::I4, &[1, 3]));
    assert_eq!(r.bytes().as_ref(), &[0x21, 0x03]);
    // f4E2M1FN codes, including the negative-zero code 0x8.
    let codes = [0x1u8, 0x8, 0xF, 0x7, 0x0, 0x9];
    let x = Tensor::from_codes(DType::F4E2M1FN, sh(&[3, 2]), &codes).unwrap();
    let r = run1(OpKind::Transpose, &[], &[&x], ty(DType::F4E2M1FN, &[2, 3]));
    assert_eq!(r.codes(), vec![0x1, 0xF, 0x0, 0x8, 0x7, 0x9]);
    // f32 NaN payloads survive.
    let nan = f32::from_bits(0x7fc0_1234);
    let x = t(&[1, 2], &[nan, -0.0f32]);
    let r = run1(OpKind::Transpose, &[], &[&x], ty(DType::F32, &[2, 1]));
    let bits: Vec<u32> = f32v(&r).iter().map(|v| v.to_bits()).collect();
    assert_eq!(bits, vec![0x7fc0_1234, 0x8000_0000]);
    // f8 and f6 (one byte per element).
    let x = Tensor::from_codes(DType::F6E3M2FN, sh(&[2, 2]), &[1, 2, 3, 0x3F]).unwrap();
    let r = run1(OpKind::Transpose, &[], &[&x], ty(DType::F6E3M2FN, &[2, 2]));
    assert_eq!(r.codes(), vec![1, 3, 2, 0x3F]);
}

// ---------------------------------------------------------------------------
// Slice, Pad.
// ---------------------------------------------------------------------------

fn slice1(
    x: &Tensor,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
    out: &[usize],
) -> Vec<f32> {
    let (st, en) = (i64s(starts), i64s(ends));
    let ax = axes.map(i64s);
    let sp = steps.map(i64s);
    f32v(&run_o(OpKind::Slice, &[], &[Some(x), Some(&st), Some(&en), ax.as_ref(), sp.as_ref()], ty(DType::F32, out)))
}

#[test]
fn slice_clamping_and_steps() {
    let x = t(&[10], &seq(10));
    assert_eq!(slice1(&x, &[-3], &[i64::MAX], None, None, &[3]), vec![7., 8., 9.]);
    assert_eq!(slice1(&x, &[2], &[5], Some(&[0]), Some(&[1]), &[3]), vec![2., 3., 4.]);
    // Reverse everything with the INT_MAX/INT_MIN sentinels.
    assert_eq!(
        slice1(&x, &[i64::MAX], &[i64::MIN], None, Some(&[-1]), &[10]),
        seq(10).into_iter().rev().collect::<Vec<_>>()
    );
    assert_eq!(slice1(&x, &[-1], &[-11], None, Some(&[-1]), &[10]).len(), 10);
    assert_eq!(slice1(&x, &[8], &[2], None, Some(&[-3]), &[2]), vec![8., 5.]);
    assert_eq!(slice1(&x, &[1], &[10], None, Some(&[4]), &[3]), vec![1., 5., 9.]);
    // Start past the end, end before the start.
    assert!(slice1(&x, &[20], &[30], None, None, &[0]).is_empty());
    assert!(slice1(&x, &[5], &[2], None, None, &[0]).is_empty());
    assert!(slice1(&x, &[2], &[5], None, Some(&[-1]), &[0]).is_empty());
    // i64::MIN as a start clamps to 0; a -1 end with a negative step stops before index 0... of the wrapped value.
    assert_eq!(slice1(&x, &[i64::MIN], &[2], None, None, &[2]), vec![0., 1.]);
    assert_eq!(slice1(&x, &[3], &[-1], None, Some(&[-1]), &[0]), Vec::<f32>::new());

    let m = t(&[3, 4], &seq(12));
    // Axes omitted: starts/ends apply to the leading axes.
    assert_eq!(slice1(&m, &[1, 0], &[2, 3], None, None, &[1, 3]), vec![4., 5., 6.]);
    assert_eq!(slice1(&m, &[1], &[3], Some(&[-1]), None, &[3, 2]), vec![1., 2., 5., 6., 9., 10.]);
    assert_eq!(
        slice1(&m, &[-1, -1], &[i64::MIN, i64::MIN], Some(&[1, 0]), Some(&[-2, -2]), &[2, 2]),
        vec![11., 9., 3., 1.]
    );
    let (st, en, ax) = (i64s(&[0, 0]), i64s(&[1, 1]), i64s(&[1, -1]));
    fails(OpKind::Slice, &[], &[Some(&m), Some(&st), Some(&en), Some(&ax)], &[ty(DType::F32, &[3, 1])]);
    let (st, en, ax, sp) = (i64s(&[0]), i64s(&[1]), i64s(&[0]), i64s(&[0]));
    fails(OpKind::Slice, &[], &[Some(&m), Some(&st), Some(&en), Some(&ax), Some(&sp)], &[ty(DType::F32, &[1, 4])]);
    let ax = i64s(&[2]);
    fails(OpKind::Slice, &[], &[Some(&m), Some(&st), Some(&en), Some(&ax)], &[ty(DType::F32, &[3, 4])]);
    // Packed: u4 slice with a negative step.
    let u = ti(DType::U4, &[5], &[1, 2, 3, 4, 5]);
    let (st, en, ax, sp) = (i64s(&[4]), i64s(&[0]), i64s(&[0]), i64s(&[-2]));
    let r = run1(OpKind::Slice, &[], &[&u, &st, &en, &ax, &sp], ty(DType::U4, &[2]));
    assert_eq!(iv(&r), vec![5, 3]);
}

fn pad1(x: &Tensor, pads: &[i64], mode: &str, value: Option<&Tensor>, axes: Option<&[i64]>, out: &[usize]) -> Vec<f32> {
    let p = i64s(pads);
    let ax = axes.map(i64s);
    f32v(&run_o(OpKind::Pad, &[("mode", s(mode))], &[Some(x), Some(&p), value, ax.as_ref()], ty(DType::F32, out)))
}

#[test]
fn pad_modes() {
    let x = t(&[3], &[1f32, 2., 3.]);
    let nine = Tensor::scalar(9f32);
    assert_eq!(pad1(&x, &[2, 1], "constant", Some(&nine), None, &[6]), vec![9., 9., 1., 2., 3., 9.]);
    assert_eq!(pad1(&x, &[1, 1], "constant", None, None, &[5]), vec![0., 1., 2., 3., 0.]);
    assert_eq!(pad1(&x, &[2, 2], "reflect", None, None, &[7]), vec![3., 2., 1., 2., 3., 2., 1.]);
    assert_eq!(pad1(&x, &[2, 2], "edge", None, None, &[7]), vec![1., 1., 1., 2., 3., 3., 3.]);
    assert_eq!(pad1(&x, &[2, 2], "wrap", None, None, &[7]), vec![2., 3., 1., 2., 3., 1., 2.]);
    // Pads larger than the axis repeat periodically.
    assert_eq!(pad1(&x, &[5, 0], "reflect", None, None, &[8]), vec![2., 1., 2., 3., 2., 1., 2., 3.]);
    assert_eq!(pad1(&x, &[4, 0], "wrap", None, None, &[7]), vec![3., 1., 2., 3., 1., 2., 3.]);
    // Negative pads crop; edge then reads the cropped border.
    assert_eq!(pad1(&x, &[-1, 1], "constant", None, None, &[3]), vec![2., 3., 0.]);
    let y = t(&[4], &[1f32, 2., 3., 4.]);
    assert_eq!(pad1(&y, &[-1, 2], "edge", None, None, &[5]), vec![2., 3., 4., 4., 4.]);
    assert_eq!(pad1(&y, &[-2, -2], "constant", None, None, &[0]), Vec::<f32>::new());
    fails_ints(OpKind::Pad, &y, &[-3, -2], &[ty(DType::F32, &[0])]);

    let m = t(&[2, 2], &[1f32, 2., 3., 4.]);
    // axes operand: pad only the last axis (negative axis).
    assert_eq!(pad1(&m, &[1, 0], "constant", None, Some(&[-1]), &[2, 3]), vec![0., 1., 2., 0., 3., 4.]);
    // Both axes, reflect.
    assert_eq!(pad1(&m, &[1, 0, 0, 1], "reflect", None, None, &[3, 3]), vec![3., 4., 3., 1., 2., 1., 3., 4., 3.]);
    // Empty axis: constant fills, edge is an error.
    let e = t::<f32>(&[0], &[]);
    assert_eq!(pad1(&e, &[1, 1], "constant", Some(&nine), None, &[2]), vec![9., 9.]);
    fails(OpKind::Pad, &[("mode", s("edge"))], &[Some(&e), Some(&i64s(&[1, 1]))], &[ty(DType::F32, &[2])]);
    fails_ints(OpKind::Pad, &x, &[1], &[ty(DType::F32, &[4])]);
    // Integer and packed dtypes.
    let i = ti(DType::I4, &[2], &[-3, 5]);
    let v = ti(DType::I4, &[], &[-8]);
    let r = run1(OpKind::Pad, &[], &[&i, &i64s(&[1, 2]), &v], ty(DType::I4, &[5]));
    assert_eq!(iv(&r), vec![-8, -3, 5, -8, -8]);
}

// ---------------------------------------------------------------------------
// Concat, Split.
// ---------------------------------------------------------------------------

#[test]
fn concat_axes() {
    let a = t(&[2, 1], &[1f32, 2.]);
    let b = t(&[2, 2], &[3f32, 4., 5., 6.]);
    let e = t::<f32>(&[2, 0], &[]);
    let r = run1(OpKind::Concat, &[("axis", int(-1))], &[&a, &e, &b], ty(DType::F32, &[2, 3]));
    assert_eq!(f32v(&r), vec![1., 3., 4., 2., 5., 6.]);
    let c = t(&[1, 2], &[7f32, 8.]);
    let r = run1(OpKind::Concat, &[("axis", int(0))], &[&b, &c], ty(DType::F32, &[3, 2]));
    assert_eq!(f32v(&r), vec![3., 4., 5., 6., 7., 8.]);
    fails(OpKind::Concat, &[("axis", int(0))], &[Some(&a), Some(&b)], &[ty(DType::F32, &[4, 1])]);
    fails(OpKind::Concat, &[("axis", int(2))], &[Some(&a), Some(&a)], &[ty(DType::F32, &[2, 2])]);
    // Packed with odd counts: 3 + 2 i4 elements.
    let p = ti(DType::I4, &[3], &[1, -2, 3]);
    let q = ti(DType::I4, &[2], &[-8, 7]);
    let r = run1(OpKind::Concat, &[("axis", int(0))], &[&p, &q], ty(DType::I4, &[5]));
    assert_eq!(iv(&r), vec![1, -2, 3, -8, 7]);
    let f = Tensor::from_codes(DType::F4E2M1FN, sh(&[1, 1]), &[0xA]).unwrap();
    let g = Tensor::from_codes(DType::F4E2M1FN, sh(&[1, 2]), &[0x3, 0xF]).unwrap();
    let r = run1(OpKind::Concat, &[("axis", int(1))], &[&f, &g], ty(DType::F4E2M1FN, &[1, 3]));
    assert_eq!(r.codes(), vec![0xA, 0x3, 0xF]);
}

#[test]
fn split_forms() {
    let x = t(&[6], &seq(6));
    let outs3 = [ty(DType::F32, &[1]), ty(DType::F32, &[2]), ty(DType::F32, &[3])];
    let r = run(OpKind::Split, &[], &[Some(&x), Some(&i64s(&[1, 2, 3]))], &outs3).unwrap();
    assert_eq!(r.iter().map(f32v).collect::<Vec<_>>(), vec![vec![0.], vec![1., 2.], vec![3., 4., 5.]]);
    // Equal split into the number of results.
    let outs = [ty(DType::F32, &[2]), ty(DType::F32, &[2]), ty(DType::F32, &[2])];
    let r = run(OpKind::Split, &[], &[Some(&x), None], &outs).unwrap();
    assert_eq!(f32v(&r[2]), vec![4., 5.]);
    fails(OpKind::Split, &[], &[Some(&x), None], &vec![ty(DType::F32, &[2]); 4]);
    // num_outputs: ceil chunks, the last smaller.
    let y = t(&[7], &seq(7));
    let outs = [ty(DType::F32, &[2]), ty(DType::F32, &[2]), ty(DType::F32, &[2]), ty(DType::F32, &[1])];
    let r = run(OpKind::Split, &[("num_outputs", int(4))], &[Some(&y)], &outs).unwrap();
    assert_eq!(f32v(&r[3]), vec![6.]);
    assert_eq!(f32v(&r[1]), vec![2., 3.]);
    // Only the leading results listed.
    let r = run(OpKind::Split, &[("num_outputs", int(4))], &[Some(&y)], &outs[..2]).unwrap();
    assert_eq!(r.len(), 2);
    // 5 into 4 chunks of 2 leaves a negative last chunk.
    let z = t(&[5], &seq(5));
    fails(OpKind::Split, &[("num_outputs", int(4))], &[Some(&z)], &vec![ty(DType::F32, &[2]); 4]);
    // Negative axis on a matrix, with a zero-sized chunk.
    let m = t(&[2, 3], &seq(6));
    let outs = [ty(DType::F32, &[2, 2]), ty(DType::F32, &[2, 0]), ty(DType::F32, &[2, 1])];
    let r = run(OpKind::Split, &[("axis", int(-1))], &[Some(&m), Some(&i64s(&[2, 0, 1]))], &outs).unwrap();
    assert_eq!(f32v(&r[0]), vec![0., 1., 3., 4.]);
    assert_eq!(r[1].numel(), 0);
    assert_eq!(f32v(&r[2]), vec![2., 5.]);
    fails(OpKind::Split, &[], &[Some(&x), Some(&i64s(&[1, 2, 2]))], &outs3);
}

// ---------------------------------------------------------------------------
// DepthToSpace, SpaceToDepth, ReverseSequence, Trilu.
// ---------------------------------------------------------------------------

#[test]
fn depth_to_space_modes() {
    let x = t(&[1, 8, 1, 1], &seq(8));
    let r = run1(OpKind::DepthToSpace, &[("blocksize", int(2))], &[&x], ty(DType::F32, &[1, 2, 2, 2]));
    // DCR: output channel c, block (i, j) reads channel (i*2 + j)*2 + c.
    assert_eq!(f32v(&r), vec![0., 2., 4., 6., 1., 3., 5., 7.]);
    let r =
        run1(OpKind::DepthToSpace, &[("blocksize", int(2)), ("mode", s("CRD"))], &[&x], ty(DType::F32, &[1, 2, 2, 2]));
    // CRD: reads channel c*4 + i*2 + j.
    assert_eq!(f32v(&r), seq(8));
    // Larger case against the definition (reshape/transpose written as index arithmetic).
    let (n, c, h, w, b) = (2, 8, 2, 3, 2);
    let v: Vec<i64> = (0..(n * c * h * w) as i64).collect();
    let x = ti(DType::I64, &[n, c, h, w], &v);
    let co = c / (b * b);
    for mode in ["DCR", "CRD"] {
        let r = run1(
            OpKind::DepthToSpace,
            &[("blocksize", int(b as i64)), ("mode", s(mode))],
            &[&x],
            ty(DType::I64, &[n, co, h * b, w * b]),
        );
        let mut want = Vec::new();
        for ni in 0..n {
            for ci in 0..co {
                for y in 0..h * b {
                    for xx in 0..w * b {
                        let (i, j) = (y % b, xx % b);
                        let ch = if mode == "DCR" { (i * b + j) * co + ci } else { ci * b * b + i * b + j };
                        want.push(v[((ni * c + ch) * h + y / b) * w + xx / b]);
                    }
                }
            }
        }
        assert_eq!(iv(&r), want, "{mode}");
        // SpaceToDepth inverts DCR.
        if mode == "DCR" {
            let back = run1(OpKind::SpaceToDepth, &[("blocksize", int(2))], &[&r], ty(DType::I64, &[n, c, h, w]));
            assert_eq!(iv(&back), v);
        }
    }
    let y = t(&[1, 1, 2, 2], &[0f32, 1., 2., 3.]);
    let r = run1(OpKind::SpaceToDepth, &[("blocksize", int(2))], &[&y], ty(DType::F32, &[1, 4, 1, 1]));
    assert_eq!(f32v(&r), vec![0., 1., 2., 3.]);
    fails(OpKind::DepthToSpace, &[("blocksize", int(3))], &[Some(&x)], &[ty(DType::I64, &[2, 0, 6, 9])]);
    fails(OpKind::SpaceToDepth, &[("blocksize", int(2))], &[Some(&x)], &[ty(DType::I64, &[2, 32, 1, 1])]);
}

#[test]
fn reverse_sequence_axes() {
    // time_axis 0, batch_axis 1: each column reversed over its first len entries.
    let x = ti(DType::I32, &[4, 4], &[0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15]);
    let r = run1(OpKind::ReverseSequence, &[], &[&x, &i64s(&[4, 3, 2, 1])], ty(DType::I32, &[4, 4]));
    assert_eq!(iv(&r), vec![3, 6, 9, 12, 2, 5, 8, 13, 1, 4, 10, 14, 0, 7, 11, 15]);
    let x = ti(DType::I32, &[4, 4], &(0..16).collect::<Vec<_>>());
    let r = run1(
        OpKind::ReverseSequence,
        &[("batch_axis", int(0)), ("time_axis", int(1))],
        &[&x, &i64s(&[1, 2, 3, 4])],
        ty(DType::I32, &[4, 4]),
    );
    assert_eq!(iv(&r), vec![0, 1, 2, 3, 5, 4, 6, 7, 10, 9, 8, 11, 15, 14, 13, 12]);
    // Inner dims move as blocks.
    let y = ti(DType::I32, &[3, 1, 2], &[1, 2, 3, 4, 5, 6]);
    let r = run1(OpKind::ReverseSequence, &[], &[&y, &i64s(&[3])], ty(DType::I32, &[3, 1, 2]));
    assert_eq!(iv(&r), vec![5, 6, 3, 4, 1, 2]);
    fails_ints(OpKind::ReverseSequence, &x, &[5, 1, 1, 1], &[ty(DType::I32, &[4, 4])]);
    fails_ints(OpKind::ReverseSequence, &x, &[1, 1], &[ty(DType::I32, &[4, 4])]);
}

#[test]
fn trilu_k() {
    let x = ti(DType::I32, &[3, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let k = |v: i64| t(&[], &[v]);
    let out = || ty(DType::I32, &[3, 3]);
    let r = run_o(OpKind::Trilu, &[], &[Some(&x), None], out());
    assert_eq!(iv(&r), vec![1, 2, 3, 0, 5, 6, 0, 0, 9]);
    let r = run_o(OpKind::Trilu, &[("upper", int(0))], &[Some(&x), None], out());
    assert_eq!(iv(&r), vec![1, 0, 0, 4, 5, 0, 7, 8, 9]);
    let r = run1(OpKind::Trilu, &[], &[&x, &k(1)], out());
    assert_eq!(iv(&r), vec![0, 2, 3, 0, 0, 6, 0, 0, 0]);
    let r = run1(OpKind::Trilu, &[("upper", int(0))], &[&x, &k(-1)], out());
    assert_eq!(iv(&r), vec![0, 0, 0, 4, 0, 0, 7, 8, 0]);
    let r = run1(OpKind::Trilu, &[], &[&x, &k(i64::MIN)], out());
    assert_eq!(iv(&r), (1..10).collect::<Vec<_>>());
    let r = run1(OpKind::Trilu, &[], &[&x, &k(i64::MAX)], out());
    assert_eq!(iv(&r), vec![0; 9]);
    // A batch of 2x3 matrices.
    let y = ti(DType::I32, &[2, 2, 3], &(1..13).collect::<Vec<_>>());
    let r = run1(OpKind::Trilu, &[("upper", int(0))], &[&y, &k(1)], ty(DType::I32, &[2, 2, 3]));
    assert_eq!(iv(&r), vec![1, 2, 0, 4, 5, 6, 7, 8, 0, 10, 11, 12]);
    let v = t::<f32>(&[3], &[1., 2., 3.]);
    fails(OpKind::Trilu, &[], &[Some(&v)], &[ty(DType::F32, &[3])]);
}

// ---------------------------------------------------------------------------
// Generators.
// ---------------------------------------------------------------------------

/// Range over the scalars `[start, limit, delta]`, its result typed `dtype[n]`.
fn range<T: Element>(v: [T; 3], dtype: DType, n: usize) -> Tensor {
    let [s, l, d] = v.map(|x| t(&[], &[x]));
    run1(OpKind::Range, &[], &[&s, &l, &d], ty(dtype, &[n]))
}

#[test]
fn eye_like_constant_of_shape_range() {
    let x = t::<f32>(&[2, 3], &[0.; 6]);
    let r = run1(OpKind::EyeLike, &[("k", int(1))], &[&x], ty(DType::F32, &[2, 3]));
    assert_eq!(f32v(&r), vec![0., 1., 0., 0., 0., 1.]);
    let r = run1(OpKind::EyeLike, &[("k", int(-1))], &[&x], ty(DType::I32, &[2, 3]));
    assert_eq!(iv(&r), vec![0, 0, 0, 1, 0, 0]);
    let r = run1(OpKind::EyeLike, &[], &[&x], ty(DType::Bool, &[2, 3]));
    assert_eq!(iv(&r), vec![1, 0, 0, 0, 1, 0]);
    let r = run1(OpKind::EyeLike, &[("k", int(5))], &[&x], ty(DType::F32, &[2, 3]));
    assert_eq!(f32v(&r), vec![0.; 6]);

    let r = run1(OpKind::ConstantOfShape, &[], &[&i64s(&[2, 3])], ty(DType::F32, &[2, 3]));
    assert_eq!(f32v(&r), vec![0.; 6]);
    let v = t(&[1], &[7i64]);
    let r = run1(OpKind::ConstantOfShape, &[("value", Attr::Tensor(v.clone()))], &[&i64s(&[3])], ty(DType::I64, &[3]));
    assert_eq!(iv(&r), vec![7, 7, 7]);
    let r = run1(OpKind::ConstantOfShape, &[("value", Attr::Tensor(v.clone()))], &[&i64s(&[])], ty(DType::I64, &[]));
    assert_eq!(iv(&r), vec![7]);
    let u = ti(DType::U4, &[1], &[9]);
    let r = run1(OpKind::ConstantOfShape, &[("value", Attr::Tensor(u))], &[&i64s(&[3])], ty(DType::U4, &[3]));
    assert_eq!(iv(&r), vec![9, 9, 9]);
    fails(OpKind::ConstantOfShape, &[("value", Attr::Tensor(v))], &[Some(&i64s(&[3]))], &[ty(DType::F32, &[3])]);
    fails(OpKind::ConstantOfShape, &[], &[Some(&i64s(&[-1]))], &[ty(DType::F32, &[0])]);

    assert_eq!(iv(&range([1, 10, 3], DType::I32, 3)), vec![1, 4, 7]);
    assert_eq!(iv(&range([10, 1, -3], DType::I32, 3)), vec![10, 7, 4]);
    assert_eq!(range([5, 1, 1], DType::I32, 0).numel(), 0);
    // A result of the wrong length, and a zero delta.
    for delta in [3, 0] {
        let [s, l, d] = [1, 10, delta].map(|v: i32| t(&[], &[v]));
        fails(OpKind::Range, &[], &[Some(&s), Some(&l), Some(&d)], &[ty(DType::I32, &[4])]);
    }
    assert_eq!(f32v(&range([0f32, 1., 0.25], DType::F32, 4)), vec![0., 0.25, 0.5, 0.75]);
    // start + i*delta, rounded once: 0.1 + 2*0.1 in f64 then to f32.
    let r = range([0.1f32, 0.35, 0.1], DType::F32, 3);
    let (a, d) = (0.1f32 as f64, 0.1f32 as f64);
    assert_eq!(f32v(&r), vec![a as f32, (a + d) as f32, (a + 2.0 * d) as f32]);
}

// ---------------------------------------------------------------------------
// Gather family.
// ---------------------------------------------------------------------------

#[test]
fn gather_axes_and_indices() {
    let x = t(&[3, 2], &[1f32, 1.2, 2.3, 3.4, 4.5, 5.7]);
    let idx = ti(DType::I64, &[2, 2], &[0, 1, 1, 2]);
    let r = run1(OpKind::Gather, &[], &[&x, &idx], ty(DType::F32, &[2, 2, 2]));
    assert_eq!(f32v(&r), vec![1., 1.2, 2.3, 3.4, 2.3, 3.4, 4.5, 5.7]);
    // Axis 1 with negative i32 indices.
    let idx = ti(DType::I32, &[1, 2], &[-1, 0]);
    let r = run1(OpKind::Gather, &[("axis", int(-1))], &[&x, &idx], ty(DType::F32, &[3, 1, 2]));
    assert_eq!(f32v(&r), vec![1.2, 1., 3.4, 2.3, 5.7, 4.5]);
    // Scalar index drops the axis.
    let idx = ti(DType::I64, &[], &[-2]);
    let r = run1(OpKind::Gather, &[], &[&x, &idx], ty(DType::F32, &[2]));
    assert_eq!(f32v(&r), vec![2.3, 3.4]);
    // Empty indices.
    let idx = ti(DType::I64, &[0], &[]);
    assert_eq!(run1(OpKind::Gather, &[], &[&x, &idx], ty(DType::F32, &[0, 2])).numel(), 0);
    for bad in [3, -4] {
        let idx = ti(DType::I64, &[1], &[bad]);
        fails(OpKind::Gather, &[], &[Some(&x), Some(&idx)], &[ty(DType::F32, &[1, 2])]);
    }
    // Packed data.
    let p = ti(DType::I4, &[5], &[1, 2, 3, 4, 5]);
    let idx = ti(DType::I64, &[3], &[4, 0, -2]);
    assert_eq!(iv(&run1(OpKind::Gather, &[], &[&p, &idx], ty(DType::I4, &[3]))), vec![5, 1, 4]);
}

#[test]
fn gather_elements_axes() {
    let x = ti(DType::I32, &[2, 2], &[1, 2, 3, 4]);
    let idx = ti(DType::I64, &[2, 2], &[0, 0, 1, 0]);
    let r = run1(OpKind::GatherElements, &[("axis", int(1))], &[&x, &idx], ty(DType::I32, &[2, 2]));
    assert_eq!(iv(&r), vec![1, 1, 4, 3]);
    let x = ti(DType::I32, &[3, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let idx = ti(DType::I32, &[2, 3], &[1, 2, 0, 2, 0, -3]);
    let r = run1(OpKind::GatherElements, &[], &[&x, &idx], ty(DType::I32, &[2, 3]));
    assert_eq!(iv(&r), vec![4, 8, 3, 7, 2, 3]);
    let idx = ti(DType::I32, &[1, 1], &[3]);
    fails(OpKind::GatherElements, &[], &[Some(&x), Some(&idx)], &[ty(DType::I32, &[1, 1])]);
    let idx = ti(DType::I32, &[4, 1], &[0, 0, 0, 0]);
    fails(OpKind::GatherElements, &[("axis", int(1))], &[Some(&x), Some(&idx)], &[ty(DType::I32, &[4, 1])]);
}

/// GatherND of `x` at `idx`, its i32 result of `dims`.
fn gather_nd(attrs: &[(&str, Attr)], x: &Tensor, idx: &Tensor, dims: &[usize]) -> Vec<i64> {
    iv(&run1(OpKind::GatherND, attrs, &[x, idx], ty(DType::I32, dims)))
}

#[test]
fn gather_nd_batch_dims() {
    let x = ti(DType::I32, &[2, 2], &[0, 1, 2, 3]);
    let idx = ti(DType::I64, &[2, 2], &[0, 0, 1, 1]);
    assert_eq!(gather_nd(&[], &x, &idx, &[2]), vec![0, 3]);
    let idx = ti(DType::I64, &[2, 1], &[1, 0]);
    assert_eq!(gather_nd(&[], &x, &idx, &[2, 2]), vec![2, 3, 0, 1]);
    let y = ti(DType::I32, &[2, 2, 2], &[0, 1, 2, 3, 4, 5, 6, 7]);
    let idx = ti(DType::I64, &[2, 2], &[0, 1, 1, 0]);
    assert_eq!(gather_nd(&[], &y, &idx, &[2, 2]), vec![2, 3, 4, 5]);
    let idx = ti(DType::I64, &[2, 1, 2], &[0, 1, 1, 0]);
    assert_eq!(gather_nd(&[], &y, &idx, &[2, 1, 2]), vec![2, 3, 4, 5]);
    // batch_dims = 1: each batch indexes its own slab.
    let idx = ti(DType::I64, &[2, 1], &[1, 0]);
    assert_eq!(gather_nd(&[("batch_dims", int(1))], &y, &idx, &[2, 2]), vec![2, 3, 4, 5]);
    let idx = ti(DType::I64, &[2, 2], &[-1, 0, 0, -1]);
    assert_eq!(gather_nd(&[("batch_dims", int(1))], &y, &idx, &[2]), vec![2, 5]);
    // Full-rank tuples select scalars.
    let idx = ti(DType::I64, &[1, 3], &[1, 1, 0]);
    assert_eq!(gather_nd(&[], &y, &idx, &[1]), vec![6]);
    let idx = ti(DType::I64, &[1, 1], &[2]);
    fails(OpKind::GatherND, &[], &[Some(&y), Some(&idx)], &[ty(DType::I32, &[1, 2, 2])]);
    let idx = ti(DType::I64, &[1, 4], &[0, 0, 0, 0]);
    fails(OpKind::GatherND, &[], &[Some(&y), Some(&idx)], &[ty(DType::I32, &[1])]);
}

// ---------------------------------------------------------------------------
// Scatter family.
// ---------------------------------------------------------------------------

#[test]
fn scatter_elements_reductions() {
    let x = t(&[3, 3], &[0f32; 9]);
    let idx = ti(DType::I64, &[2, 3], &[1, 0, 2, 0, 2, 1]);
    let upd = t(&[2, 3], &[1f32, 1.1, 1.2, 2., 2.1, 2.2]);
    let r = run1(OpKind::ScatterElements, &[], &[&x, &idx, &upd], ty(DType::F32, &[3, 3]));
    assert_eq!(f32v(&r), vec![2., 1.1, 0., 1., 0., 2.2, 0., 2.1, 1.2]);
    let x = t(&[1, 5], &[1f32, 2., 3., 4., 5.]);
    let idx = ti(DType::I64, &[1, 2], &[1, -2]);
    let upd = t(&[1, 2], &[1.1f32, 2.1]);
    let r = run1(OpKind::ScatterElements, &[("axis", int(1))], &[&x, &idx, &upd], ty(DType::F32, &[1, 5]));
    assert_eq!(f32v(&r), vec![1., 1.1, 3., 2.1, 5.]);
    // Repeated index: reductions combine one update at a time in f32.
    let idx = ti(DType::I64, &[1, 2], &[1, 1]);
    let run_red = |red: &str| {
        f32v(&run1(
            OpKind::ScatterElements,
            &[("axis", int(1)), ("reduction", s(red))],
            &[&x, &idx, &upd],
            ty(DType::F32, &[1, 5]),
        ))
    };
    assert_eq!(run_red("add"), vec![1., (2f32 + 1.1f32) + 2.1f32, 3., 4., 5.]);
    assert_eq!(run_red("mul"), vec![1., (2f32 * 1.1f32) * 2.1f32, 3., 4., 5.]);
    assert_eq!(run_red("max"), vec![1., 2.1, 3., 4., 5.]);
    assert_eq!(run_red("min"), vec![1., 1.1, 3., 4., 5.]);
    assert_eq!(run_red("none"), vec![1., 2.1, 3., 4., 5.]);
    // Integer reductions: i8 wraps, u8 compares unsigned; bool add is or, mul is and.
    let ii = ti(DType::I64, &[3], &[0, 0, 1]);
    let int_cases: [(DType, [i64; 2], [i64; 3], &str, [i64; 2]); 6] = [
        (DType::I8, [100, -5], [20, 10, 3], "add", [-126, -2]),
        (DType::I8, [100, -5], [20, 10, 3], "mul", [(100i32 * 20 * 10) as i8 as i64, -15]),
        (DType::U8, [100, 7], [200, 50, 3], "max", [200, 7]),
        (DType::U8, [100, 7], [200, 50, 3], "min", [50, 3]),
        (DType::Bool, [0, 1], [1, 1, 0], "add", [1, 1]),
        (DType::Bool, [0, 1], [1, 1, 0], "mul", [0, 0]),
    ];
    for (d, x, upd, red, want) in int_cases {
        let r = run1(
            OpKind::ScatterElements,
            &[("reduction", s(red))],
            &[&ti(d, &[2], &x), &ii, &ti(d, &[3], &upd)],
            ty(d, &[2]),
        );
        assert_eq!(iv(&r), want, "{d:?} {red}");
    }
    // f16 adds round after each step: 2048 + 1 + 1 stays 2048 (ties to even), not 2050.
    let xh = t(&[1], &[half::f16::from_f32(2048.0)]);
    let uh = t(&[2], &[half::f16::from_f32(1.0), half::f16::from_f32(1.0)]);
    let i2 = ti(DType::I64, &[2], &[0, 0]);
    let r = run1(OpKind::ScatterElements, &[("reduction", s("add"))], &[&xh, &i2, &uh], ty(DType::F16, &[1]));
    assert_eq!(r.to_f64_vec(), vec![2048.0]);
    // NaN propagates through max.
    let xn = t(&[1], &[f32::NAN]);
    let un = t(&[2], &[1f32, 2.]);
    let r = run1(OpKind::ScatterElements, &[("reduction", s("max"))], &[&xn, &i2, &un], ty(DType::F32, &[1]));
    assert!(f32v(&r)[0].is_nan());
    let bad = ti(DType::I64, &[1, 2], &[1, 5]);
    fails(
        OpKind::ScatterElements,
        &[("axis", int(1))],
        &[Some(&x), Some(&bad), Some(&upd)],
        &[ty(DType::F32, &[1, 5])],
    );
}

#[test]
fn scatter_nd_reductions() {
    let x = t(&[8], &[1f32, 2., 3., 4., 5., 6., 7., 8.]);
    let idx = ti(DType::I64, &[4, 1], &[4, 3, 1, 7]);
    let upd = t(&[4], &[9f32, 10., 11., 12.]);
    let r = run1(OpKind::ScatterND, &[], &[&x, &idx, &upd], ty(DType::F32, &[8]));
    assert_eq!(f32v(&r), vec![1., 11., 3., 10., 9., 6., 7., 12.]);
    let idx = ti(DType::I64, &[2, 1], &[0, -8]);
    let upd = t(&[2], &[5f32, 6.]);
    for (red, want) in [("add", 12.), ("mul", 30.), ("min", 1.)] {
        let r = run1(OpKind::ScatterND, &[("reduction", s(red))], &[&x, &idx, &upd], ty(DType::F32, &[8]));
        assert_eq!(f32v(&r)[0], want, "{red}");
    }
    // Slices: replace the second matrix of a 2x2x2.
    let y = ti(DType::I32, &[2, 2, 2], &[0; 8]);
    let idx = ti(DType::I64, &[1, 1], &[1]);
    let upd = ti(DType::I32, &[1, 2, 2], &[1, 2, 3, 4]);
    let r = run1(OpKind::ScatterND, &[], &[&y, &idx, &upd], ty(DType::I32, &[2, 2, 2]));
    assert_eq!(iv(&r), vec![0, 0, 0, 0, 1, 2, 3, 4]);
    let idx = ti(DType::I64, &[2, 2], &[0, 1, 1, 0]);
    let upd = ti(DType::I32, &[2, 2], &[5, 6, 7, 8]);
    let r = run1(OpKind::ScatterND, &[("reduction", s("max"))], &[&y, &idx, &upd], ty(DType::I32, &[2, 2, 2]));
    assert_eq!(iv(&r), vec![0, 0, 5, 6, 7, 8, 0, 0]);
    let bad = ti(DType::I64, &[1, 1], &[2]);
    let upd = ti(DType::I32, &[1, 2, 2], &[1, 2, 3, 4]);
    fails(OpKind::ScatterND, &[], &[Some(&y), Some(&bad), Some(&upd)], &[ty(DType::I32, &[2, 2, 2])]);
    let idx = ti(DType::I64, &[1, 1], &[1]);
    let short = ti(DType::I32, &[1, 2], &[1, 2]);
    fails(OpKind::ScatterND, &[], &[Some(&y), Some(&idx), Some(&short)], &[ty(DType::I32, &[2, 2, 2])]);
}

#[test]
fn one_hot_axes_and_wrap() {
    let idx = ti(DType::I64, &[4], &[0, -1, 3, 5]);
    let depth = t(&[], &[4i64]);
    let vals = t(&[2], &[0f32, 1.]);
    let r = run1(OpKind::OneHot, &[], &[&idx, &depth, &vals], ty(DType::F32, &[4, 4]));
    #[rustfmt::skip]
    let want = vec![1., 0., 0., 0.,  0., 0., 0., 1.,  0., 0., 0., 1.,  0., 0., 0., 0.];
    assert_eq!(f32v(&r), want);
    let r = run1(OpKind::OneHot, &[("axis", int(0))], &[&idx, &depth, &vals], ty(DType::F32, &[4, 4]));
    #[rustfmt::skip]
    let want_t = vec![1., 0., 0., 0.,  0., 0., 0., 0.,  0., 0., 0., 0.,  0., 1., 1., 0.];
    assert_eq!(f32v(&r), want_t);
    // Float indices and depth truncate; values set off/on and the result dtype.
    let fidx = t(&[1, 2], &[1.7f32, -0.5]);
    let fdepth = t(&[1], &[3.9f32]);
    let ivals = t(&[2], &[2i64, 7]);
    let r = run1(OpKind::OneHot, &[("axis", int(1))], &[&fidx, &fdepth, &ivals], ty(DType::I64, &[1, 3, 2]));
    assert_eq!(iv(&r), vec![2, 7, 7, 2, 2, 2]);
    let zero = t(&[], &[0i64]);
    fails(OpKind::OneHot, &[], &[Some(&idx), Some(&zero), Some(&vals)], &[ty(DType::F32, &[4, 0])]);
}

// ---------------------------------------------------------------------------
// Resize.
// ---------------------------------------------------------------------------

fn resize(
    x: &Tensor,
    attrs: &[(&str, Attr)],
    roi: Option<&[f32]>,
    scales: Option<&[f32]>,
    sizes: Option<&[i64]>,
    out: &[usize],
) -> Tensor {
    let roi = roi.map(|v| t(&[v.len()], v));
    let scales = scales.map(|v| t(&[v.len()], v));
    let sizes = sizes.map(i64s);
    run_o(OpKind::Resize, attrs, &[Some(x), roi.as_ref(), scales.as_ref(), sizes.as_ref()], ty(x.dtype(), out))
}

fn rf(x: &Tensor, attrs: &[(&str, Attr)], scales: Option<&[f32]>, sizes: Option<&[i64]>, out: &[usize]) -> Vec<f64> {
    resize(x, attrs, None, scales, sizes, out).to_f64_vec()
}

#[test]
fn resize_nearest() {
    let x = t(&[3], &[1f32, 2., 3.]);
    let asymmetric =
        |nearest: &str| [("coordinate_transformation_mode", s("asymmetric")), ("nearest_mode", s(nearest))];
    let asym = asymmetric("floor");
    // x_original = j / 2, floored.
    assert_eq!(rf(&x, &asym, Some(&[2.]), None, &[6]), vec![1., 1., 2., 2., 3., 3.]);
    // round_prefer_ceil: 0.5 → 1, 1.5 → 2, 2.5 → 3 clamps to 2.
    let ceil = asymmetric("round_prefer_ceil");
    assert_eq!(rf(&x, &ceil, Some(&[2.]), None, &[6]), vec![1., 2., 2., 3., 3., 3.]);
    // half_pixel, round_prefer_floor: x_original = 2j + 0.5 for a half-size output.
    let y = t(&[4], &[1f32, 2., 3., 4.]);
    assert_eq!(rf(&y, &[], None, Some(&[2]), &[2]), vec![1., 3.]);
    assert_eq!(rf(&y, &[("nearest_mode", s("ceil"))], None, Some(&[2]), &[2]), vec![2., 4.]);
    // Upsample x2 half_pixel: x_original = j/2 - 0.25 → 0, 0, 1, 1, 2, 2 (ties never occur).
    assert_eq!(rf(&x, &[], Some(&[2.]), None, &[6]), vec![1., 1., 2., 2., 3., 3.]);
    // 2-D with axes: only the last axis.
    let m = ti(DType::I32, &[1, 2, 2], &[1, 2, 3, 4]);
    let r = resize(&m, &[("axes", ints(&[-1]))], None, Some(&[2.]), None, &[1, 2, 4]);
    assert_eq!(iv(&r), vec![1, 1, 2, 2, 3, 3, 4, 4]);
    // Packed dtypes move codes bit-exactly.
    let p = ti(DType::I4, &[3], &[-8, 7, -1]);
    let r = resize(&p, &asym, None, Some(&[2.]), None, &[6]);
    assert_eq!(iv(&r), vec![-8, -8, 7, 7, -1, -1]);
    // Sizes with keep_aspect_ratio_policy.
    let z = t(&[2, 4], &seq(8));
    let sized =
        |policy: &str, out: &[usize]| rf(&z, &[("keep_aspect_ratio_policy", s(policy))], None, Some(&[4, 4]), out);
    let r = sized("not_larger", &[2, 4]);
    assert_eq!(r, seq(8).iter().map(|&v| v as f64).collect::<Vec<_>>());
    let r = sized("not_smaller", &[4, 8]);
    let want: Vec<f64> = (0..32).map(|i| ((i / 8 / 2) * 4 + (i % 8) / 2) as f64).collect();
    assert_eq!(r, want);
    // tf_crop_and_resize extrapolates outside [0, in-1].
    let ex = [("coordinate_transformation_mode", s("tf_crop_and_resize")), ("extrapolation_value", Attr::Float(-1.0))];
    let r = resize(&y, &ex, Some(&[0.5, 1.5]), None, Some(&[3]), &[3]).to_f64_vec();
    // x_original = 1.5 + j*1.5*... = 0.5*3 + j*(1.0)*3/2 = 1.5, 3.0, 4.5.
    assert_eq!(r, vec![2., 4., -1.]);
    fails(OpKind::Resize, &[], &[Some(&y), None, None, None], &[ty(DType::F32, &[2])]);
}

#[test]
fn resize_linear() {
    // half_pixel, 2x upsample of [1, 2]: x_original = j/2 - 0.25.
    let x = t(&[2], &[1f32, 2.]);
    let lin = [("mode", s("linear"))];
    assert_eq!(rf(&x, &lin, Some(&[2.]), None, &[4]), vec![1., 1.25, 1.75, 2.]);
    // 2-D bilinear, separable.
    let m = t(&[2, 2], &[1f32, 2., 3., 4.]);
    let r = rf(&m, &lin, Some(&[2., 2.]), None, &[4, 4]);
    #[rustfmt::skip]
    let want = [1., 1.25, 1.75, 2., 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5, 3., 3.25, 3.75, 4.];
    assert_eq!(r, want);
    // align_corners: x_original = j * (in-1)/(out-1).
    let ac = [("mode", s("linear")), ("coordinate_transformation_mode", s("align_corners"))];
    let y = t(&[3], &[1f32, 2., 3.]);
    assert_eq!(rf(&y, &ac, None, Some(&[5]), &[5]), vec![1., 1.5, 2., 2.5, 3.]);
    let r = rf(&m, &ac, None, Some(&[3, 3]), &[3, 3]);
    assert_eq!(r, vec![1., 1.5, 2., 2., 2.5, 3., 3., 3.5, 4.]);
    // With `scales`, align_corners divides by the fractional length scale*in - 1:
    // 4 * 0.6 = 2.4, so x_original = j * 3 / 1.4 (2.142857… for j = 1).
    let q = t(&[4], &[1f32, 2., 3., 4.]);
    let sc = 0.6f32 as f64;
    let r = rf(&q, &ac, Some(&[0.6]), None, &[2]);
    close(&r, &[1.0, 1.0 + 3.0 / (4.0 * sc - 1.0)], 1e-6);
    // asymmetric: x_original = j / 2.
    let asym = [("mode", s("linear")), ("coordinate_transformation_mode", s("asymmetric"))];
    assert_eq!(rf(&x, &asym, Some(&[2.]), None, &[4]), vec![1., 1.5, 2., 2.]);
    // pytorch_half_pixel maps a single output to 0; half_pixel maps it to the centre.
    let z = t(&[4], &[1f32, 2., 3., 4.]);
    let pt = [("mode", s("linear")), ("coordinate_transformation_mode", s("pytorch_half_pixel"))];
    assert_eq!(rf(&z, &pt, None, Some(&[1]), &[1]), vec![1.]);
    assert_eq!(rf(&z, &lin, None, Some(&[1]), &[1]), vec![2.5]);
    // half_pixel_symmetric with scale 0.6 (output 2): offset = 2 * (1 - 2 / (0.6 * 4)).
    let sym = [("mode", s("linear")), ("coordinate_transformation_mode", s("half_pixel_symmetric"))];
    let sc = 0.6f32 as f64;
    let off = 2.0 * (1.0 - 2.0 / (sc * 4.0));
    let want: Vec<f64> = (0..2).map(|j| 1.0 + off + (j as f64 + 0.5) / sc - 0.5).collect();
    close(&rf(&z, &sym, Some(&[0.6]), None, &[2]), &want, 1e-6);
    // tf_crop_and_resize: x_original = 0.25*4 + j*1.25*4/2 = 1, 3.5, 6 (outside → 10).
    let tf = [
        ("mode", s("linear")),
        ("coordinate_transformation_mode", s("tf_crop_and_resize")),
        ("extrapolation_value", Attr::Float(10.0)),
    ];
    let w = t(&[5], &[1f32, 2., 3., 4., 5.]);
    let r = resize(&w, &tf, Some(&[0.25, 1.5]), None, Some(&[3]), &[3]).to_f64_vec();
    assert_eq!(r, vec![2., 4.5, 10.]);
    // Integers round to nearest: 255*0.25 = 63.75 → 64, 255*0.75 = 191.25 → 191.
    let u = ti(DType::U8, &[2], &[0, 255]);
    let r = resize(&u, &lin, None, Some(&[2.]), None, &[4]);
    assert_eq!(iv(&r), vec![0, 64, 191, 255]);
    // Antialias, half-size: the kernel spans 4 taps, weights (1 - |(i - 0.5)/2|)/2 around x0.
    // j=0: x_original 0.5, taps at -1..2 (edge-clamped) → 0.125*1 + 0.375*1 + 0.375*2 + 0.125*3.
    // j=1: x_original 2.5, taps at 1..4 → 0.125*2 + 0.375*3 + 0.375*4 + 0.125*4.
    let aa = [("mode", s("linear")), ("antialias", int(1))];
    assert_eq!(rf(&z, &aa, Some(&[0.5]), None, &[2]), vec![1.625, 3.375]);
}

/// The cubic convolution kernel with parameter `a`.
fn cubic_w(d: f64, a: f64) -> f64 {
    let d = d.abs();
    if d <= 1.0 {
        (a + 2.0) * d * d * d - (a + 3.0) * d * d + 1.0
    } else if d < 2.0 {
        a * d * d * d - 5.0 * a * d * d + 8.0 * a * d - 4.0 * a
    } else {
        0.0
    }
}

/// Cubic interpolation of `v` at `x` from the four taps around it; taps outside
/// read the edge, or are dropped (weights renormalised) when `exclude`.
fn cubic_at(v: &[f64], x: f64, a: f64, exclude: bool) -> f64 {
    let base = x.floor() as i64;
    let n = v.len() as i64;
    let (mut acc, mut wsum) = (0.0, 0.0);
    for k in base - 1..=base + 2 {
        let mut w = cubic_w(x - k as f64, a);
        if exclude && !(0..n).contains(&k) {
            w = 0.0;
        }
        acc += w * v[k.clamp(0, n - 1) as usize];
        wsum += w;
    }
    if exclude {
        acc / wsum
    } else {
        acc
    }
}

#[test]
fn resize_cubic() {
    let v = [1.0, 2.0, 4.0, 8.0];
    let x = t(&[4], &v.map(|x| x as f32));
    for (a, exclude, ctm) in [
        (-0.75, false, "half_pixel"),
        (-0.5, false, "half_pixel"),
        (-0.75, true, "half_pixel"),
        (-0.75, false, "align_corners"),
        (-0.5, true, "asymmetric"),
    ] {
        let attrs = [
            ("mode", s("cubic")),
            ("cubic_coeff_a", Attr::Float(a as f32)),
            ("exclude_outside", int(exclude as i64)),
            ("coordinate_transformation_mode", s(ctm)),
        ];
        let got = rf(&x, &attrs, Some(&[2.]), None, &[8]);
        let want: Vec<f64> = (0..8)
            .map(|j| {
                let j = j as f64;
                let xo = match ctm {
                    "half_pixel" => (j + 0.5) / 2.0 - 0.5,
                    "align_corners" => j * 3.0 / 7.0,
                    _ => j / 2.0,
                };
                cubic_at(&v, xo, a, exclude) as f32 as f64
            })
            .collect();
        close(&got, &want, 1e-6);
    }
    // Worked by hand for one point: half_pixel j=3 → x_original 1.25, a = -0.75:
    // weights W(2.25)=0 for... taps 0..3 at distances 1.25, 0.25, 0.75, 1.75.
    let a = -0.75f64;
    let w = [
        a * 1.25f64.powi(3) - 5.0 * a * 1.25f64.powi(2) + 8.0 * a * 1.25 - 4.0 * a,
        (a + 2.0) * 0.25f64.powi(3) - (a + 3.0) * 0.25f64.powi(2) + 1.0,
        (a + 2.0) * 0.75f64.powi(3) - (a + 3.0) * 0.75f64.powi(2) + 1.0,
        a * 1.75f64.powi(3) - 5.0 * a * 1.75f64.powi(2) + 8.0 * a * 1.75 - 4.0 * a,
    ];
    let want = w[0] * 1.0 + w[1] * 2.0 + w[2] * 4.0 + w[3] * 8.0;
    let got = rf(&x, &[("mode", s("cubic"))], Some(&[2.]), None, &[8]);
    close(&got[3..4], &[want], 1e-6);
    // Identity scale leaves values alone.
    assert_eq!(rf(&x, &[("mode", s("cubic"))], Some(&[1.]), None, &[4]), v.to_vec());
}

// ---------------------------------------------------------------------------
// Performance: multi-MB tensors move in milliseconds.
// ---------------------------------------------------------------------------

#[test]
fn large_tensors_move_fast() {
    let n = 1024;
    let v: Vec<f32> = (0..n * n).map(|i| i as f32).collect();
    let x = t(&[n, n], &v);
    let start = std::time::Instant::now();
    let r = run1(OpKind::Transpose, &[], &[&x], ty(DType::F32, &[n, n]));
    let tr = start.elapsed();
    let rv = f32v(&r);
    assert_eq!(rv[1], n as f32);
    assert_eq!(rv[n * n - 2], ((n - 2) * n + n - 1) as f32);
    let idx: Vec<i64> = (0..n as i64).rev().collect();
    let idx = i64s(&idx);
    let start = std::time::Instant::now();
    let g = run1(OpKind::Gather, &[("axis", int(1))], &[&x, &idx], ty(DType::F32, &[n, n]));
    let gt = start.elapsed();
    assert_eq!(f32v(&g)[0], (n - 1) as f32);
    let x4 = t(&[8, 64, 64, 32], &v);
    let start = std::time::Instant::now();
    let r = run1(OpKind::Transpose, &[("perm", ints(&[0, 3, 1, 2]))], &[&x4], ty(DType::F32, &[8, 32, 64, 64]));
    let t4 = start.elapsed();
    assert_eq!(f32v(&r)[1], 32.);
    // Generous bounds (unoptimised builds are slower); a per-element allocation would miss them.
    for (what, d) in [("transpose", tr), ("gather", gt), ("transpose 4-d", t4)] {
        eprintln!("{what} of 4 MiB: {d:?}");
        assert!(d.as_millis() < 2000, "{what} took {d:?}");
    }
}
