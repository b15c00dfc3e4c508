//! Shared checks of lowerings: an op is lowered, its kernels are run by the kernel
//! interpreter, and every result is compared with the reference evaluator's.
#![allow(dead_code)]

use kiln_ir::infer::{infer, InferInput};
use kiln_ir::{Attr, Attrs, DType, Op, OpKind, Shape, Tensor, TensorType};
use kiln_lower::{interpret, lower_op, Lowered, OpCx, OpInput};

/// `kind` with the given attributes.
pub fn op(kind: OpKind, attrs: &[(&str, Attr)]) -> Op {
    let mut a = Attrs::new();
    for (n, v) in attrs {
        a.set(*n, v.clone());
    }
    Op::parse(kind, &a).unwrap()
}

/// An integer attribute.
pub fn int(v: i64) -> Attr {
    Attr::Int(v)
}

/// An integer-list attribute.
pub fn ia(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

/// A string attribute.
pub fn s(v: &str) -> Attr {
    Attr::String(v.to_string())
}

/// Tolerances of a comparison: `|got - want| <= atol + rtol * |want|`; NaN equals NaN;
/// integer and bool results must be exact.
#[derive(Clone, Copy, Debug)]
pub struct Tol {
    pub rtol: f64,
    pub atol: f64,
}

/// Exact arithmetic (or one rounding apart).
pub const EXACT: Tol = Tol { rtol: 1e-6, atol: 1e-7 };
/// Transcendentals and sums in f32.
pub const F32: Tol = Tol { rtol: 1e-5, atol: 1e-6 };

/// Which operands are compile-time constants.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// All operands are run-time data.
    Runtime,
    /// All operands are constants (as after folding shape operands).
    Const,
    /// Operands from this position on are constants.
    ConstFrom(usize),
}

/// Lowers `op` on `inputs`, interprets it, and compares every result with kiln-ref.
/// Panics (this is a test helper) with a description of the first mismatch.
pub fn check(op: &Op, inputs: &[Option<Tensor>], bind: Bind, tol: Tol) {
    let ninfer: Vec<Option<InferInput>> =
        inputs.iter().map(|t| t.as_ref().map(|t| InferInput { ty: t.ty(), value: Some(t) })).collect();
    let nout = count_outputs(op, inputs);
    let out_types = infer(op, &ninfer, nout).unwrap_or_else(|e| panic!("{}: infer: {e}", op.kind));
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let want = kiln_ref::eval_op(op, &refs, &out_types).unwrap_or_else(|e| panic!("{}: reference: {e}", op.kind));
    let opin: Vec<Option<OpInput>> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            t.as_ref().map(|t| {
                let is_const = match bind {
                    Bind::Runtime => false,
                    Bind::Const => true,
                    Bind::ConstFrom(k) => i >= k,
                };
                OpInput { ty: t.ty(), value: is_const.then_some(t) }
            })
        })
        .collect();
    let cx = OpCx { op, name: "t", inputs: &opin, outputs: &out_types };
    let lowered = lower_op(&cx).unwrap_or_else(|e| panic!("{}: lower: {e}", op.kind));
    let got = interpret(&lowered, &refs, &out_types).unwrap_or_else(|e| panic!("{}: interpret: {e}", op.kind));
    assert_eq!(got.len(), want.len(), "{}: result count", op.kind);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(&format!("{} result {k}", op.kind), g, w, tol);
    }
}

/// Number of results the reference produces for `op` (asks shape inference for up to 3,
/// in the static form).
fn count_outputs(op: &Op, inputs: &[Option<Tensor>]) -> usize {
    let ninfer: Vec<Option<InferInput>> =
        inputs.iter().map(|t| t.as_ref().map(|t| InferInput { ty: t.ty(), value: Some(t) })).collect();
    if let Some(n) = op.attrs_of::<kiln_ir::attrs::SplitAttrs>().ok().and_then(|a| a.num_outputs) {
        return n as usize;
    }
    // (Not TopK's three-result form: the run-time-K one, with bounded results.)
    (1..=3)
        .rev()
        .find(|&n| infer(op, &ninfer, n).is_ok() && kiln_ir::dynamic::source_results(op, n).is_empty())
        .unwrap_or(1)
}

/// Compares two tensors element by element (see [`Tol`]).
pub fn compare(what: &str, got: &Tensor, want: &Tensor, tol: Tol) {
    assert_eq!(got.ty(), want.ty(), "{what}: type");
    let d = want.dtype();
    if d.is_float() {
        let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
        for (i, (a, b)) in g.iter().zip(&w).enumerate() {
            let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol.atol + tol.rtol * b.abs();
            assert!(ok, "{what}: element {i}: got {a}, want {b} ({} elements)", w.len());
        }
    } else {
        let (g, w) = (got.to_i64_vec().expect("int"), want.to_i64_vec().expect("int"));
        assert_eq!(g, w, "{what}: {d:?} values");
    }
}

/// A deterministic pseudo-random tensor of `dtype` and `dims`: floats in [-2, 2)
/// (quarter steps mixed with irrational-looking values), integers in a small range,
/// bools alternating by a hash.
pub fn rand(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let shape = Shape::new(dims.to_vec()).expect("shape");
    let n = shape.numel();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    if dtype.is_float() {
        let v: Vec<f64> = (0..n).map(|_| (next() % 4096) as f64 / 1024.0 - 2.0).collect();
        Tensor::from_f64(dtype, shape, &v).expect("tensor")
    } else {
        let unsigned = dtype.is_unsigned_int() || dtype == DType::Bool;
        let v: Vec<i64> = (0..n)
            .map(|_| {
                let r = (next() % 19) as i64;
                if dtype == DType::Bool {
                    r & 1
                } else if unsigned {
                    r
                } else {
                    r - 9
                }
            })
            .collect();
        Tensor::from_i64(dtype, shape, &v).expect("tensor")
    }
}

/// An i64 tensor from values.
pub fn ints(dims: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I64, Shape::new(dims.to_vec()).expect("shape"), v).expect("tensor")
}

/// An f32 tensor from values.
pub fn floats(dims: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(DType::F32, Shape::new(dims.to_vec()).expect("shape"), v).expect("tensor")
}

/// A tensor of `dtype` from values (rounded to the dtype).
pub fn typed(dtype: DType, dims: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(dtype, Shape::new(dims.to_vec()).expect("shape"), v).expect("tensor")
}

/// A tensor of an integer (or bool) `dtype` from values.
pub fn typed_i(dtype: DType, dims: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_i64(dtype, Shape::new(dims.to_vec()).expect("shape"), v).expect("tensor")
}

/// A tensor of `d` from values: floats rounded to `d`, other dtypes through i64.
pub fn t(d: DType, dims: &[usize], v: &[f64]) -> Tensor {
    if d.is_float() {
        typed(d, dims, v)
    } else {
        let iv: Vec<i64> = v.iter().map(|&x| x as i64).collect();
        typed_i(d, dims, &iv)
    }
}

/// The operands as shape-inference inputs, every value known.
pub fn infer_inputs(inputs: &[Option<Tensor>]) -> Vec<Option<InferInput<'_>>> {
    inputs.iter().map(|t| t.as_ref().map(|t| InferInput { ty: t.ty(), value: Some(t) })).collect()
}

/// The `n` result types shape inference gives `op` on `inputs`.
pub fn infer_types(op: &Op, inputs: &[Option<Tensor>], n: usize) -> Vec<TensorType> {
    infer(op, &infer_inputs(inputs), n).unwrap_or_else(|e| panic!("{}: infer: {e}", op.kind))
}

/// Lowers `op` to results of types `out`; operand `i` is a constant where `konst(i)`.
pub fn try_lower(
    op: &Op,
    inputs: &[Option<Tensor>],
    konst: impl Fn(usize) -> bool,
    out: &[TensorType],
) -> Result<Lowered, String> {
    let opin: Vec<Option<OpInput>> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| t.as_ref().map(|t| OpInput { ty: t.ty(), value: konst(i).then_some(t) }))
        .collect();
    let cx = OpCx { op, name: "t", inputs: &opin, outputs: out };
    lower_op(&cx).map_err(|e| e.to_string())
}

/// [`try_lower`], which must succeed.
pub fn lower(op: &Op, inputs: &[Option<Tensor>], konst: impl Fn(usize) -> bool, out: &[TensorType]) -> Lowered {
    try_lower(op, inputs, konst, out).unwrap_or_else(|e| panic!("{}: lower: {e}", op.kind))
}

/// [`try_lower`], which must fail (as an unsupported form, not a panic): the message.
pub fn lower_fails(op: &Op, inputs: &[Option<Tensor>], konst: impl Fn(usize) -> bool, out: &[TensorType]) -> String {
    match try_lower(op, inputs, konst, out) {
        Ok(_) => panic!("{}: lowering should fail", op.kind),
        Err(e) => e,
    }
}
