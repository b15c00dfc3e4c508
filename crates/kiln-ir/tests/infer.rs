//! Shape inference (`kiln_ir::infer`) per op family.
//!
//! Every expected type here was worked out by hand from the ONNX operator
//! specification (opset 22); several are the shapes of the examples in that
//! specification. The exhaustive checks compare against the definitions written
//! out again here as plain iteration, never against the code under test.

use kiln_filetest::fuzz::XorShift;
use kiln_ir::infer::{infer, InferError, InferInput};
use kiln_ir::{Attr, Attrs, Op, OpKind, Shape, Tensor, TensorType};

// ---------------------------------------------------------------- helpers

/// `"f32[2,3]"` → a tensor type (`"i64[]"` is a scalar).
fn ty(s: &str) -> TensorType {
    let (d, rest) = s.split_once('[').expect("dtype[dims]");
    let dims: Vec<usize> =
        rest.trim_end_matches(']').split(',').filter(|x| !x.is_empty()).map(|x| x.parse().expect("extent")).collect();
    TensorType::new(d.parse().expect("dtype"), Shape::new(dims).expect("shape"))
}

fn tys(v: &[&str]) -> Vec<TensorType> {
    v.iter().map(|s| ty(s)).collect()
}

/// 1-D i64 constant.
fn ci64(v: &[i64]) -> Tensor {
    Tensor::from_vec(Shape::new([v.len()]).unwrap(), v.to_vec()).unwrap()
}

/// 1-D i32 constant.
fn ci32(v: &[i32]) -> Tensor {
    Tensor::from_vec(Shape::new([v.len()]).unwrap(), v.to_vec()).unwrap()
}

/// 1-D f32 constant.
fn cf32(v: &[f32]) -> Tensor {
    Tensor::from_vec(Shape::new([v.len()]).unwrap(), v.to_vec()).unwrap()
}

/// A node under test: an op, its operands (type and maybe contents).
struct Case {
    kind: OpKind,
    /// Attributes in string-keyed form, parsed (and checked) when the case runs, as
    /// an importer would.
    attrs: Attrs,
    inputs: Vec<Option<(TensorType, Option<Tensor>)>>,
}

fn case(kind: OpKind) -> Case {
    Case { kind, attrs: Attrs::new(), inputs: Vec::new() }
}

impl Case {
    fn attr(mut self, name: &str, a: Attr) -> Self {
        self.attrs.set(name, a);
        self
    }
    fn i(self, name: &str, v: i64) -> Self {
        self.attr(name, Attr::Int(v))
    }
    fn is(self, name: &str, v: &[i64]) -> Self {
        self.attr(name, Attr::Ints(v.to_vec()))
    }
    fn s(self, name: &str, v: &str) -> Self {
        self.attr(name, Attr::String(v.to_string()))
    }
    /// A run-time operand of type `t`.
    fn x(mut self, t: &str) -> Self {
        self.inputs.push(Some((ty(t), None)));
        self
    }
    /// A constant operand.
    fn c(mut self, t: Tensor) -> Self {
        self.inputs.push(Some((t.ty().clone(), Some(t))));
        self
    }
    /// An absent optional operand.
    fn none(mut self) -> Self {
        self.inputs.push(None);
        self
    }
    fn run(&self, n: usize) -> Result<Vec<TensorType>, InferError> {
        let ins: Vec<Option<InferInput>> =
            self.inputs.iter().map(|o| o.as_ref().map(|(t, v)| InferInput { ty: t, value: v.as_ref() })).collect();
        let op = Op::parse(self.kind, &self.attrs).map_err(|e| InferError::attr(self.kind, e))?;
        infer(&op, &ins, n)
    }
    /// The single result.
    #[track_caller]
    fn ok(&self) -> TensorType {
        match self.run(1) {
            Ok(v) => {
                assert_eq!(v.len(), 1);
                v.into_iter().next().unwrap()
            }
            Err(e) => panic!("{} failed: {e}", self.kind),
        }
    }
    /// `n` results.
    #[track_caller]
    fn oks(&self, n: usize) -> Vec<TensorType> {
        match self.run(n) {
            Ok(v) => {
                assert_eq!(v.len(), n);
                v
            }
            Err(e) => panic!("{} failed: {e}", self.kind),
        }
    }
    /// The message of an `Invalid` error (with one result asked for).
    #[track_caller]
    fn invalid(&self) -> String {
        self.invalid_n(1)
    }
    #[track_caller]
    fn invalid_n(&self, n: usize) -> String {
        match self.run(n) {
            Err(InferError::Invalid(m)) => {
                assert!(m.starts_with(&format!("{}: ", self.kind)), "message `{m}` lacks the op name");
                m
            }
            other => panic!("{}: expected Invalid, got {other:?}", self.kind),
        }
    }
    /// The message of an `Unsupported` error.
    #[track_caller]
    fn unsupported(&self) -> String {
        match self.run(1) {
            Err(InferError::Unsupported(m)) => {
                assert!(m.starts_with(&format!("{}: ", self.kind)), "message `{m}` lacks the op name");
                m
            }
            other => panic!("{}: expected Unsupported, got {other:?}", self.kind),
        }
    }
}

use OpKind::*;

// ---------------------------------------------------------------- elementwise

#[test]
fn unary_keeps_type() {
    assert_eq!(case(Relu).x("f32[2,3]").ok(), ty("f32[2,3]"));
    assert_eq!(case(Relu).x("i32[4]").ok(), ty("i32[4]"));
    assert_eq!(case(Sin).x("f16[]").ok(), ty("f16[]"));
    assert_eq!(case(Identity).x("bool[0,2]").ok(), ty("bool[0,2]"));
    assert_eq!(case(Not).x("bool[3]").ok(), ty("bool[3]"));
    assert_eq!(case(Abs).x("u8[3]").ok(), ty("u8[3]"));
    assert_eq!(case(BitwiseNot).x("i16[3]").ok(), ty("i16[3]"));
    assert_eq!(case(Exp).x("f8E4M3FN[2]").ok(), ty("f8E4M3FN[2]"));
    assert_eq!(case(Gelu).s("approximate", "tanh").x("f32[2]").ok(), ty("f32[2]"));
    assert_eq!(case(Shrink).x("i8[5]").ok(), ty("i8[5]"));
}

#[test]
fn unary_rejects_wrong_dtypes_and_counts() {
    let m = case(Sin).x("i32[2]").invalid();
    assert_eq!(m, "Sin: `X` (input 0) must be a float tensor, got i32[2]");
    case(Relu).x("u8[2]").invalid();
    case(Relu).x("bool[2]").invalid();
    case(Not).x("f32[2]").invalid();
    case(BitwiseNot).x("f32[2]").invalid();
    case(Gelu).s("approximate", "fast").x("f32[2]").invalid();
    let m = case(Relu).x("f32[2]").x("f32[2]").invalid();
    assert!(m.contains("at most 1 operand"), "{m}");
    let m = case(Relu).invalid();
    assert!(m.contains("`X` (input 0) is required"), "{m}");
    let m = case(Relu).x("f32[2]").invalid_n(2);
    assert!(m.contains("lists 2 results"), "{m}");
    assert_eq!(case(Relu).x("f32[2]").run(0), Ok(vec![]));
}

#[test]
fn predicates_give_bool() {
    assert_eq!(case(IsNaN).x("f16[3]").ok(), ty("bool[3]"));
    assert_eq!(case(IsInf).x("f32[2,2]").ok(), ty("bool[2,2]"));
    case(IsNaN).x("i32[3]").invalid();
}

#[test]
fn binary_broadcasting() {
    let add = |a: &str, b: &str| case(Add).x(a).x(b).ok();
    assert_eq!(add("f32[2,3]", "f32[3]"), ty("f32[2,3]"));
    assert_eq!(add("f32[4,1]", "f32[1,5]"), ty("f32[4,5]"));
    assert_eq!(add("f32[]", "f32[2]"), ty("f32[2]"));
    assert_eq!(add("f32[2,1,3]", "f32[4,1]"), ty("f32[2,4,3]"));
    assert_eq!(add("f32[0,3]", "f32[1,3]"), ty("f32[0,3]"));
    assert_eq!(add("f32[0]", "f32[1]"), ty("f32[0]"));
    assert_eq!(add("i64[1]", "i64[]"), ty("i64[1]"));
    assert_eq!(case(Mul).x("f64[5,1,1]").x("f64[1,6,1]").ok(), ty("f64[5,6,1]"));
    assert_eq!(case(Add).x("f32[2,3]").x("f32[4]").invalid(), "Add: cannot broadcast f32[2,3] with f32[4]");
    case(Add).x("f32[0]").x("f32[2]").invalid();
    case(Sub).x("f32[2]").x("i32[2]").invalid();
    case(Div).x("bool[2]").x("bool[2]").invalid();
    case(Add).x("f32[2]").none().invalid();
    case(Add).x("f32[2]").invalid();
}

#[test]
fn comparisons_and_logic() {
    assert_eq!(case(Equal).x("i64[2]").x("i64[3,1]").ok(), ty("bool[3,2]"));
    assert_eq!(case(Equal).x("bool[2]").x("bool[2]").ok(), ty("bool[2]"));
    assert_eq!(case(Greater).x("f32[2,3]").x("f32[]").ok(), ty("bool[2,3]"));
    assert_eq!(case(LessOrEqual).x("u16[4]").x("u16[4]").ok(), ty("bool[4]"));
    case(Greater).x("bool[2]").x("bool[2]").invalid();
    case(Less).x("f32[2]").x("f16[2]").invalid();
    assert_eq!(case(And).x("bool[2,1]").x("bool[3]").ok(), ty("bool[2,3]"));
    assert_eq!(case(Xor).x("bool[]").x("bool[]").ok(), ty("bool[]"));
    case(Or).x("f32[2]").x("f32[2]").invalid();
    assert_eq!(case(BitwiseAnd).x("u32[2]").x("u32[1]").ok(), ty("u32[2]"));
    case(BitwiseOr).x("f32[2]").x("f32[2]").invalid();
}

#[test]
fn pow_mod_bitshift_prelu() {
    assert_eq!(case(Pow).x("f32[2,3]").x("i64[3]").ok(), ty("f32[2,3]"));
    assert_eq!(case(Pow).x("i32[2]").x("f32[]").ok(), ty("i32[2]"));
    case(Pow).x("f32[2]").x("f32[3]").invalid();
    assert_eq!(case(Mod).x("i32[2]").x("i32[2]").ok(), ty("i32[2]"));
    assert!(case(Mod).x("f32[2]").x("f32[2]").invalid().contains("fmod"));
    assert_eq!(case(Mod).i("fmod", 1).x("f32[2]").x("f32[2]").ok(), ty("f32[2]"));
    assert_eq!(case(BitShift).s("direction", "LEFT").x("u8[3]").x("u8[1]").ok(), ty("u8[3]"));
    case(BitShift).x("u8[3]").x("u8[1]").invalid();
    case(BitShift).s("direction", "UP").x("u8[3]").x("u8[1]").invalid();
    case(BitShift).s("direction", "RIGHT").x("i8[3]").x("i8[1]").invalid();
    assert_eq!(case(PRelu).x("f32[1,3,4,4]").x("f32[3,1,1]").ok(), ty("f32[1,3,4,4]"));
    assert_eq!(case(PRelu).x("f32[2,5]").x("f32[]").ok(), ty("f32[2,5]"));
    // The slope may not widen X.
    case(PRelu).x("f32[3]").x("f32[2,3]").invalid();
    case(PRelu).x("f32[2,4]").x("f32[5]").invalid();
}

#[test]
fn variadic_and_where() {
    assert_eq!(case(Max).x("f32[2,1]").x("f32[3]").x("f32[]").ok(), ty("f32[2,3]"));
    assert_eq!(case(Mean).x("f32[2]").ok(), ty("f32[2]"));
    assert_eq!(case(Min).x("i64[4]").x("i64[4]").ok(), ty("i64[4]"));
    case(Max).invalid();
    case(Max).x("f32[2]").x("f16[2]").invalid();
    case(Max).x("f32[2]").none().invalid();
    case(Sum).x("i32[2]").x("i32[2]").invalid();
    case(Sum).x("f32[2]").x("f32[3]").x("f32[2]").invalid();
    assert_eq!(case(Where).x("bool[2,1]").x("f32[3]").x("f32[2,3]").ok(), ty("f32[2,3]"));
    assert_eq!(case(Where).x("bool[]").x("i8[4]").x("i8[]").ok(), ty("i8[4]"));
    case(Where).x("f32[2]").x("f32[2]").x("f32[2]").invalid();
    case(Where).x("bool[2]").x("f32[2]").x("f16[2]").invalid();
    assert_eq!(
        case(Where).x("bool[3,1]").x("f32[2]").x("f32[4]").invalid(),
        "Where: cannot broadcast bool[3,2] with f32[4]"
    );
}

#[test]
fn clip_cast_castlike() {
    assert_eq!(case(Clip).x("f32[2,3]").x("f32[]").x("f32[1]").ok(), ty("f32[2,3]"));
    assert_eq!(case(Clip).x("i32[2]").none().x("i32[]").ok(), ty("i32[2]"));
    case(Clip).x("f32[2]").x("f32[2]").invalid();
    case(Clip).x("f32[2]").x("i32[]").invalid();
    assert_eq!(case(Cast).i("to", 10).x("f32[2,3]").ok(), ty("f16[2,3]"));
    assert_eq!(case(Cast).i("to", 9).x("f32[]").ok(), ty("bool[]"));
    assert_eq!(case(Cast).i("to", 17).x("f32[4]").ok(), ty("f8E4M3FN[4]"));
    case(Cast).i("to", 8).x("f32[2]").unsupported();
    case(Cast).i("to", 0).x("f32[2]").invalid();
    case(Cast).i("to", 99).x("f32[2]").invalid();
    case(Cast).x("f32[2]").invalid();
    case(Cast).s("to", "float").x("f32[2]").invalid();
    assert_eq!(case(CastLike).x("f32[2,3]").x("i8[5]").ok(), ty("i8[2,3]"));
}

#[test]
fn softmax_family_and_friends() {
    assert_eq!(case(Softmax).x("f32[2,3]").ok(), ty("f32[2,3]"));
    assert_eq!(case(LogSoftmax).i("axis", -2).x("f32[2,3]").ok(), ty("f32[2,3]"));
    assert_eq!(case(Hardmax).i("axis", 0).x("f32[2,3]").ok(), ty("f32[2,3]"));
    let m = case(Softmax).i("axis", 2).x("f32[2,3]").invalid();
    assert!(m.contains("axis 2 is out of range for rank 2"), "{m}");
    case(Softmax).i("axis", -3).x("f32[2,3]").invalid();
    assert_eq!(case(LRN).i("size", 3).x("f32[1,4,5,5]").ok(), ty("f32[1,4,5,5]"));
    case(LRN).x("f32[1,4,5,5]").invalid();
    case(LRN).i("size", 0).x("f32[1,4,5,5]").invalid();
    assert_eq!(case(LpNormalization).i("p", 1).x("f32[2,3]").ok(), ty("f32[2,3]"));
    case(LpNormalization).i("p", 3).x("f32[2,3]").invalid();
    assert_eq!(case(MeanVarianceNormalization).x("f32[1,2,3,4]").ok(), ty("f32[1,2,3,4]"));
    // The default axes [0, 2, 3] need rank 4.
    case(MeanVarianceNormalization).x("f32[1,2,3]").invalid();
    assert_eq!(case(MeanVarianceNormalization).is("axes", &[1]).x("f32[2,3]").ok(), ty("f32[2,3]"));
}

#[test]
fn dropout_has_a_mask() {
    assert_eq!(case(Dropout).x("f32[2,3]").oks(2), tys(&["f32[2,3]", "bool[2,3]"]));
    assert_eq!(case(Dropout).x("f16[4]").x("f32[]").x("bool[]").oks(1), tys(&["f16[4]"]));
    case(Dropout).x("f32[2]").invalid_n(3);
    case(Dropout).x("f32[2]").x("f32[2]").invalid();
    case(Dropout).x("f32[2]").none().x("i64[]").invalid();
}

// ---------------------------------------------------------------- reshaping

#[test]
fn reshape() {
    let r = |x: &str, s: &[i64]| case(Reshape).x(x).c(ci64(s)).ok();
    assert_eq!(r("f32[2,3,4]", &[4, -1]), ty("f32[4,6]"));
    assert_eq!(r("f32[2,3,4]", &[0, -1]), ty("f32[2,12]"));
    assert_eq!(r("f32[2,3,4]", &[0, 0, -1]), ty("f32[2,3,4]"));
    assert_eq!(r("f32[2,3,4]", &[-1]), ty("f32[24]"));
    assert_eq!(r("f32[2,3,4]", &[2, -1, 2]), ty("f32[2,6,2]"));
    assert_eq!(r("i8[1]", &[]), ty("i8[]"));
    assert_eq!(r("f32[]", &[1, 1]), ty("f32[1,1]"));
    // With allowzero=0 a 0 copies the input extent, so -1 can be inferred next to it.
    assert_eq!(r("f32[0,4]", &[-1, 0]), ty("f32[0,4]"));
    assert_eq!(case(Reshape).i("allowzero", 1).x("f32[0,3]").c(ci64(&[3, 0])).ok(), ty("f32[3,0]"));
    assert_eq!(case(Reshape).x("f32[2,3]").c(ci32(&[3, 2])).ok(), ty("f32[3,2]"));

    let bad = |x: &str, s: &[i64]| case(Reshape).x(x).c(ci64(s)).invalid();
    assert_eq!(bad("f32[2,3]", &[4, 2]), "Reshape: cannot reshape f32[2,3] (6 elements) to shape [4,2]");
    bad("f32[2,3]", &[4, -1]);
    bad("f32[2,3]", &[-1, -1]);
    bad("f32[2,3]", &[-2, -3]);
    bad("f32[6]", &[2, 0]);
    bad("f32[0,4]", &[0, -1]);
    bad("f32[2,3]", &[1 << 40, 1 << 40]);
    bad("f32[2,3]", &[i64::MAX, i64::MAX, -1]);
    bad("f32[2,3]", &[1 << 62, 4, -1]);
    case(Reshape).i("allowzero", 1).x("f32[0,3]").c(ci64(&[0, -1])).invalid();
    case(Reshape).x("f32[2,3]").c(cf32(&[3.0, 2.0])).invalid();
    let two_d = Tensor::from_vec(Shape::new([1, 2]).unwrap(), vec![3i64, 2]).unwrap();
    case(Reshape).x("f32[2,3]").c(two_d).invalid();
    assert_eq!(
        case(Reshape).x("f32[2,3]").x("i64[2]").unsupported(),
        "Reshape: `shape` (input 1) must be a constant; bind input shapes with --input-shape"
    );
    case(Reshape).x("f32[2,3]").invalid();
}

#[test]
fn expand_and_tile() {
    let e = |x: &str, s: &[i64]| case(Expand).x(x).c(ci64(s)).ok();
    assert_eq!(e("f32[3,1]", &[2, 1, 4]), ty("f32[2,3,4]"));
    assert_eq!(e("f32[3]", &[1]), ty("f32[3]"));
    assert_eq!(e("f32[]", &[2, 2]), ty("f32[2,2]"));
    assert_eq!(e("f32[1,4]", &[0, 1]), ty("f32[0,4]"));
    case(Expand).x("f32[2,3]").c(ci64(&[4])).invalid();
    case(Expand).x("f32[2]").c(ci64(&[-1])).invalid();
    case(Expand).x("f32[2]").x("i64[1]").unsupported();

    let t = |x: &str, s: &[i64]| case(Tile).x(x).c(ci64(s)).ok();
    assert_eq!(t("f32[2,3]", &[2, 1]), ty("f32[4,3]"));
    assert_eq!(t("f32[2,3]", &[3, 0]), ty("f32[6,0]"));
    assert_eq!(t("i64[]", &[]), ty("i64[]"));
    case(Tile).x("f32[2,3]").c(ci64(&[2])).invalid();
    case(Tile).x("f32[2]").c(ci64(&[-1])).invalid();
    case(Tile).x("f32[2]").c(ci64(&[i64::MAX])).invalid();
    case(Tile).x("f32[1]").c(ci64(&[1 << 50])).invalid();
}

/// ONNX Slice on one axis, written as the specification's iteration: adjust and
/// clamp start and end, then step from start while short of end.
fn slice_by_iteration(dim: i64, start: i64, end: i64, step: i64) -> usize {
    let adjust = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let (mut s, mut e) = (adjust(start), adjust(end));
    if step > 0 {
        s = s.max(0).min(dim);
        e = e.max(0).min(dim);
    } else {
        s = s.max(0).min(dim - 1);
        e = e.max(-1).min(dim - 1);
    }
    let mut n = 0;
    let mut i = s;
    while (step > 0 && i < e) || (step < 0 && i > e) {
        if i >= 0 && i < dim {
            n += 1;
        }
        i += step;
    }
    n
}

#[test]
fn slice_matches_the_definition_exhaustively() {
    let mut vals: Vec<i64> = (-9..=9).collect();
    vals.extend([i64::MIN, i64::MIN + 1, i64::MAX, i64::MAX - 1, -1000, 1000]);
    for dim in 0..6usize {
        for &s in &vals {
            for &e in &vals {
                for step in [-4i64, -3, -2, -1, 1, 2, 3, 4] {
                    let x = format!("f32[{dim}]");
                    let got = case(Slice).x(&x).c(ci64(&[s])).c(ci64(&[e])).none().c(ci64(&[step])).ok();
                    let want = slice_by_iteration(dim as i64, s, e, step);
                    assert_eq!(got.shape.dims(), &[want], "dim {dim} start {s} end {e} step {step}");
                }
            }
        }
    }
}

#[test]
fn slice() {
    let s1 = |start: i64, end: i64| case(Slice).x("f32[10]").c(ci64(&[start])).c(ci64(&[end])).ok();
    assert_eq!(s1(2, 7), ty("f32[5]"));
    assert_eq!(s1(-3, i64::MAX), ty("f32[3]"));
    assert_eq!(s1(5, 2), ty("f32[0]"));
    assert_eq!(s1(-100, 100), ty("f32[10]"));
    let st = |start: i64, end: i64, step: i64| {
        case(Slice).x("f32[10]").c(ci64(&[start])).c(ci64(&[end])).c(ci64(&[0])).c(ci64(&[step])).ok()
    };
    assert_eq!(st(0, 10, 3), ty("f32[4]")); // 0 3 6 9
    assert_eq!(st(i64::MAX, i64::MIN, -1), ty("f32[10]")); // reversed
    assert_eq!(st(8, 1, -2), ty("f32[4]")); // 8 6 4 2
    assert_eq!(st(9, 0, i64::MIN), ty("f32[1]"));
    assert_eq!(st(-1, -11, -1), ty("f32[10]"));
    // Several axes, negative axes, partial axes.
    let m = case(Slice).x("f32[4,6]").c(ci64(&[1, -4])).c(ci64(&[3, 100])).c(ci64(&[0, -1])).ok();
    assert_eq!(m, ty("f32[2,4]"));
    assert_eq!(case(Slice).x("f32[4,6]").c(ci64(&[1])).c(ci64(&[3])).c(ci64(&[1])).ok(), ty("f32[4,2]"));
    assert_eq!(case(Slice).x("f32[4,6]").c(ci32(&[1])).c(ci32(&[3])).ok(), ty("f32[2,6]"));
    // Errors.
    case(Slice).x("f32[10]").c(ci64(&[0])).c(ci64(&[5])).none().c(ci64(&[0])).invalid();
    case(Slice).x("f32[4,6]").c(ci64(&[0, 0])).c(ci64(&[1, 1])).c(ci64(&[1, -1])).invalid();
    case(Slice).x("f32[4,6]").c(ci64(&[0, 0])).c(ci64(&[1])).invalid();
    case(Slice).x("f32[4,6]").c(ci64(&[0])).c(ci64(&[1])).c(ci64(&[2])).invalid();
    case(Slice).x("f32[4]").c(ci64(&[0, 0])).c(ci64(&[1, 1])).invalid();
    case(Slice).x("f32[4]").c(ci64(&[0])).c(ci64(&[1])).c(ci64(&[0, 0])).invalid();
    case(Slice).x("f32[4]").c(cf32(&[0.0])).c(ci64(&[1])).invalid();
    case(Slice).x("f32[4]").x("i64[1]").c(ci64(&[1])).unsupported();
    case(Slice).x("f32[4]").c(ci64(&[0])).c(ci64(&[1])).none().x("i64[1]").unsupported();
}

#[test]
fn pad() {
    let p = |x: &str, pads: &[i64]| case(Pad).x(x).c(ci64(pads)).ok();
    assert_eq!(p("f32[2,3]", &[1, 2, 3, 4]), ty("f32[6,9]"));
    assert_eq!(p("f32[2,3]", &[0, -1, 0, -1]), ty("f32[2,1]"));
    assert_eq!(p("f32[2,3]", &[-2, 0, 0, 0]), ty("f32[0,3]"));
    assert_eq!(case(Pad).x("f32[2,3]").c(ci64(&[2, 2])).none().c(ci64(&[1])).ok(), ty("f32[2,7]"));
    assert_eq!(case(Pad).x("f32[2,3]").c(ci64(&[0, 1])).x("f32[]").c(ci64(&[-1])).ok(), ty("f32[2,4]"));
    assert_eq!(case(Pad).s("mode", "reflect").x("f32[3]").c(ci64(&[1, 1])).ok(), ty("f32[5]"));
    assert_eq!(case(Pad).s("mode", "wrap").x("f32[3]").c(ci64(&[2, 0])).ok(), ty("f32[5]"));
    case(Pad).x("f32[2,3]").c(ci64(&[-3, 0, 0, 0])).invalid();
    case(Pad).x("f32[2,3]").c(ci64(&[1, 1])).invalid();
    case(Pad).s("mode", "mirror").x("f32[2]").c(ci64(&[1, 1])).invalid();
    case(Pad).s("mode", "edge").x("f32[0]").c(ci64(&[1, 1])).invalid();
    case(Pad).x("f32[2]").c(ci64(&[1, 1])).x("i32[]").invalid();
    case(Pad).x("f32[2,3]").c(ci64(&[1, 1, 1, 1])).none().c(ci64(&[0, 0])).invalid();
    case(Pad).x("f32[2]").x("i64[2]").unsupported();
}

#[test]
fn squeeze_unsqueeze() {
    assert_eq!(case(Squeeze).x("f32[1,3,1,2]").ok(), ty("f32[3,2]"));
    assert_eq!(case(Squeeze).x("f32[1,3,1,2]").c(ci64(&[0])).ok(), ty("f32[3,1,2]"));
    assert_eq!(case(Squeeze).x("f32[1,3,1,2]").c(ci64(&[-2])).ok(), ty("f32[1,3,2]"));
    assert_eq!(case(Squeeze).x("f32[1,1]").ok(), ty("f32[]"));
    assert_eq!(case(Squeeze).x("f32[1,3,1,2]").c(ci64(&[])).ok(), ty("f32[3,2]"));
    assert_eq!(
        case(Squeeze).x("f32[1,3,1,2]").c(ci64(&[1])).invalid(),
        "Squeeze: cannot squeeze axis 1 of f32[1,3,1,2]: its extent is 3, not 1"
    );
    case(Squeeze).x("f32[1,3]").c(ci64(&[2])).invalid();
    case(Squeeze).x("f32[1,1]").c(ci64(&[0, -2])).invalid();
    case(Squeeze).x("f32[1,3]").x("i64[1]").unsupported();
    // A scalar axes operand is a list of one; an empty one needs no contents.
    assert_eq!(case(Squeeze).x("f32[1,3]").c(Tensor::scalar(0i64)).ok(), ty("f32[3]"));
    assert_eq!(case(Squeeze).x("f32[1,3,1]").x("i64[0]").ok(), ty("f32[3]"));

    assert_eq!(case(Unsqueeze).x("f32[3,4]").c(ci64(&[0])).ok(), ty("f32[1,3,4]"));
    assert_eq!(case(Unsqueeze).x("f32[3,4]").c(ci64(&[1, -1])).ok(), ty("f32[3,1,4,1]"));
    assert_eq!(case(Unsqueeze).x("f32[3,4]").c(ci64(&[3, 0])).ok(), ty("f32[1,3,4,1]"));
    assert_eq!(case(Unsqueeze).x("f32[]").c(ci64(&[0])).ok(), ty("f32[1]"));
    assert_eq!(case(Unsqueeze).x("f32[3]").c(Tensor::scalar(-1i64)).ok(), ty("f32[3,1]"));
    case(Unsqueeze).x("f32[3,4]").c(ci64(&[0, 4])).invalid();
    case(Unsqueeze).x("f32[3,4]").c(ci64(&[1, 1])).invalid();
    case(Unsqueeze).x("f32[3,4]").invalid();
    case(Unsqueeze).x("f32[3,4]").c(ci64(&(0..9).collect::<Vec<_>>())).unsupported();
}

#[test]
fn split() {
    assert_eq!(case(Split).x("f32[6,2]").c(ci64(&[2, 4])).oks(2), tys(&["f32[2,2]", "f32[4,2]"]));
    assert_eq!(case(Split).x("f32[6]").oks(3), tys(&["f32[2]", "f32[2]", "f32[2]"]));
    assert_eq!(case(Split).i("num_outputs", 4).x("f32[7]").oks(4), tys(&["f32[2]", "f32[2]", "f32[2]", "f32[1]"]));
    assert_eq!(
        case(Split).i("axis", 1).i("num_outputs", 3).x("f32[2,6]").oks(3),
        tys(&["f32[2,2]", "f32[2,2]", "f32[2,2]"])
    );
    assert_eq!(case(Split).i("axis", -1).x("f32[2,5]").c(ci64(&[0, 5])).oks(2), tys(&["f32[2,0]", "f32[2,5]"]));
    // Only the results the node lists.
    assert_eq!(case(Split).i("num_outputs", 4).x("f32[7]").oks(2), tys(&["f32[2]", "f32[2]"]));
    case(Split).x("f32[7]").invalid_n(2);
    case(Split).x("f32[6]").c(ci64(&[2, 3])).invalid_n(2);
    case(Split).x("f32[6]").c(ci64(&[7, -1])).invalid_n(2);
    case(Split).i("num_outputs", 2).x("f32[6]").c(ci64(&[3, 3])).invalid_n(2);
    case(Split).i("num_outputs", 4).x("f32[7]").invalid_n(5);
    case(Split).i("num_outputs", 4).x("f32[5]").invalid_n(4);
    case(Split).i("num_outputs", 0).x("f32[5]").invalid_n(1);
    case(Split).i("axis", 1).x("f32[6]").invalid_n(2);
    case(Split).x("f32[6]").x("i64[2]").unsupported();
}

#[test]
fn concat() {
    assert_eq!(case(Concat).i("axis", 0).x("f32[2,3]").x("f32[4,3]").ok(), ty("f32[6,3]"));
    assert_eq!(case(Concat).i("axis", -1).x("f32[2,3]").x("f32[2,5]").x("f32[2,0]").ok(), ty("f32[2,8]"));
    assert_eq!(case(Concat).i("axis", 0).x("i64[1]").ok(), ty("i64[1]"));
    let m = case(Concat).i("axis", 0).x("f32[2,3]").x("f32[2,4]").invalid();
    assert_eq!(m, "Concat: cannot concatenate f32[2,3] and f32[2,4] along axis 0");
    case(Concat).i("axis", 0).x("f32[2,3]").x("f32[2]").invalid();
    case(Concat).i("axis", 0).x("f32[2]").x("f16[2]").invalid();
    case(Concat).x("f32[2]").x("f32[2]").invalid();
    case(Concat).i("axis", 1).x("f32[2]").invalid();
    case(Concat).i("axis", 0).x("f32[]").invalid();
    case(Concat).i("axis", 0).invalid();
}

// ---------------------------------------------------------------- gather / scatter

#[test]
fn gathers() {
    assert_eq!(case(Gather).i("axis", 1).x("f32[5,4,3]").x("i64[2,6]").ok(), ty("f32[5,2,6,3]"));
    assert_eq!(case(Gather).x("f32[5,4,3]").x("i32[]").ok(), ty("f32[4,3]"));
    assert_eq!(case(Gather).i("axis", -1).x("f32[5,4,3]").x("i64[7]").ok(), ty("f32[5,4,7]"));
    assert_eq!(case(Gather).x("f32[5]").c(ci64(&[-5, 4])).ok(), ty("f32[2]"));
    assert_eq!(
        case(Gather).x("f32[5,2]").x("f32[2]").invalid(),
        "Gather: `indices` (input 1) must be an int32 or int64 tensor, got f32[2]"
    );
    case(Gather).i("axis", 3).x("f32[5,4,3]").x("i64[2]").invalid();
    case(Gather).x("f32[]").x("i64[2]").invalid();
    case(Gather).x("f32[5]").c(ci64(&[5])).invalid();
    case(Gather).x("f32[5]").c(ci64(&[-6])).invalid();

    assert_eq!(case(GatherElements).i("axis", 1).x("f32[3,4]").x("i64[3,2]").ok(), ty("f32[3,2]"));
    case(GatherElements).x("f32[3,4]").x("i64[3]").invalid();
    case(GatherElements).i("axis", 2).x("f32[3,4]").x("i64[3,4]").invalid();

    // Examples of the ONNX GatherND specification.
    assert_eq!(case(GatherND).x("i32[2,2]").x("i64[2,2]").ok(), ty("i32[2]"));
    assert_eq!(case(GatherND).x("i32[2,2]").x("i64[2,1]").ok(), ty("i32[2,2]"));
    assert_eq!(case(GatherND).x("i32[2,2,2]").x("i64[2,2]").ok(), ty("i32[2,2]"));
    assert_eq!(case(GatherND).x("i32[2,2,2]").x("i64[2,1,2]").ok(), ty("i32[2,1,2]"));
    assert_eq!(case(GatherND).i("batch_dims", 1).x("i32[2,2,2]").x("i64[2,1]").ok(), ty("i32[2,2]"));
    assert_eq!(case(GatherND).x("f32[4,5,6]").x("i64[3,3]").ok(), ty("f32[3]"));
    case(GatherND).x("f32[2,2]").x("i64[2,3]").invalid();
    case(GatherND).i("batch_dims", 1).x("f32[2,2,2]").x("i64[3,1]").invalid();
    case(GatherND).i("batch_dims", 2).x("f32[2,2]").x("i64[2,2]").invalid();
    case(GatherND).x("f32[2,2]").x("i64[]").invalid();
}

#[test]
fn scatters() {
    assert_eq!(case(ScatterElements).i("axis", 1).x("f32[3,3]").x("i64[1,2]").x("f32[1,2]").ok(), ty("f32[3,3]"));
    case(ScatterElements).x("f32[3,3]").x("i64[1,2]").x("f32[2,1]").invalid();
    case(ScatterElements).x("f32[3,3]").x("i64[1,2]").x("f16[1,2]").invalid();
    case(ScatterElements).s("reduction", "sub").x("f32[3]").x("i64[1]").x("f32[1]").invalid();
    assert_eq!(case(ScatterND).x("f32[8]").x("i64[4,1]").x("f32[4]").ok(), ty("f32[8]"));
    assert_eq!(case(ScatterND).x("f32[4,4,4]").x("i64[2,1]").x("f32[2,4,4]").ok(), ty("f32[4,4,4]"));
    assert_eq!(case(ScatterND).x("f32[4,4,4]").x("i64[2,3]").x("f32[2]").ok(), ty("f32[4,4,4]"));
    case(ScatterND).x("f32[4,4,4]").x("i64[2,1]").x("f32[2,4]").invalid();
    case(ScatterND).x("f32[4]").x("i64[2,2]").x("f32[2]").invalid();
    case(ScatterND).x("f32[4]").x("f32[2,1]").x("f32[2]").invalid();
}

// ---------------------------------------------------------------- layout ops

#[test]
fn transpose_flatten() {
    assert_eq!(case(Transpose).x("f32[2,3,4]").ok(), ty("f32[4,3,2]"));
    assert_eq!(case(Transpose).is("perm", &[1, 0, 2]).x("f32[2,3,4]").ok(), ty("f32[3,2,4]"));
    assert_eq!(case(Transpose).x("f32[]").ok(), ty("f32[]"));
    case(Transpose).is("perm", &[0, 0, 1]).x("f32[2,3,4]").invalid();
    case(Transpose).is("perm", &[1, 0]).x("f32[2,3,4]").invalid();
    case(Transpose).is("perm", &[0, 1, 3]).x("f32[2,3,4]").invalid();
    case(Transpose).is("perm", &[0, -1, 1]).x("f32[2,3,4]").invalid();

    assert_eq!(case(Flatten).x("f32[2,3,4]").ok(), ty("f32[2,12]"));
    assert_eq!(case(Flatten).i("axis", 0).x("f32[2,3,4]").ok(), ty("f32[1,24]"));
    assert_eq!(case(Flatten).i("axis", 3).x("f32[2,3,4]").ok(), ty("f32[24,1]"));
    assert_eq!(case(Flatten).i("axis", -1).x("f32[2,3,4]").ok(), ty("f32[6,4]"));
    assert_eq!(case(Flatten).i("axis", 0).x("f32[]").ok(), ty("f32[1,1]"));
    case(Flatten).i("axis", 4).x("f32[2,3,4]").invalid();
    case(Flatten).i("axis", -4).x("f32[2,3,4]").invalid();
}

#[test]
fn depth_space() {
    assert_eq!(case(DepthToSpace).i("blocksize", 2).x("f32[1,8,2,3]").ok(), ty("f32[1,2,4,6]"));
    assert_eq!(case(DepthToSpace).i("blocksize", 2).s("mode", "CRD").x("f32[1,8,2,3]").ok(), ty("f32[1,2,4,6]"));
    case(DepthToSpace).i("blocksize", 2).x("f32[1,6,2,3]").invalid();
    case(DepthToSpace).i("blocksize", 2).x("f32[8,2,3]").invalid();
    case(DepthToSpace).x("f32[1,8,2,3]").invalid();
    case(DepthToSpace).i("blocksize", 0).x("f32[1,8,2,3]").invalid();
    assert_eq!(case(SpaceToDepth).i("blocksize", 2).x("f32[1,2,4,6]").ok(), ty("f32[1,8,2,3]"));
    case(SpaceToDepth).i("blocksize", 2).x("f32[1,2,3,6]").invalid();
}

#[test]
fn shape_and_size() {
    let sh = |start: Option<i64>, end: Option<i64>| {
        let mut c = case(OpKind::Shape).x("f32[2,3,4]");
        if let Some(s) = start {
            c = c.i("start", s);
        }
        if let Some(e) = end {
            c = c.i("end", e);
        }
        c.ok()
    };
    assert_eq!(sh(None, None), ty("i64[3]"));
    assert_eq!(sh(Some(1), None), ty("i64[2]"));
    assert_eq!(sh(Some(-1), None), ty("i64[1]"));
    assert_eq!(sh(None, Some(-1)), ty("i64[2]"));
    assert_eq!(sh(Some(5), None), ty("i64[0]"));
    assert_eq!(sh(Some(2), Some(1)), ty("i64[0]"));
    assert_eq!(sh(Some(-10), Some(10)), ty("i64[3]"));
    assert_eq!(sh(Some(i64::MIN), Some(i64::MAX)), ty("i64[3]"));
    assert_eq!(case(OpKind::Shape).x("bool[]").ok(), ty("i64[0]"));
    assert_eq!(case(Size).x("f32[2,3]").ok(), ty("i64[]"));
}

#[test]
fn constant_of_shape_eye_like() {
    assert_eq!(case(ConstantOfShape).c(ci64(&[2, 3])).ok(), ty("f32[2,3]"));
    assert_eq!(case(ConstantOfShape).c(ci64(&[])).ok(), ty("f32[]"));
    let v = Tensor::from_vec(Shape::new([1]).unwrap(), vec![7i32]).unwrap();
    assert_eq!(case(ConstantOfShape).attr("value", Attr::Tensor(v)).c(ci64(&[4])).ok(), ty("i32[4]"));
    let two = Tensor::from_vec(Shape::new([2]).unwrap(), vec![7i32, 8]).unwrap();
    case(ConstantOfShape).attr("value", Attr::Tensor(two)).c(ci64(&[4])).invalid();
    case(ConstantOfShape).c(ci64(&[2, -1])).invalid();
    case(ConstantOfShape).c(ci32(&[2])).invalid();
    case(ConstantOfShape).c(ci64(&[1 << 30, 1 << 30])).invalid();
    case(ConstantOfShape).x("i64[2]").unsupported();

    assert_eq!(case(EyeLike).x("f32[3,4]").ok(), ty("f32[3,4]"));
    assert_eq!(case(EyeLike).i("dtype", 7).i("k", -1).x("f32[3,4]").ok(), ty("i64[3,4]"));
    case(EyeLike).x("f32[3,4,5]").invalid();
}

#[test]
fn one_hot() {
    let depth = |d: i64| Tensor::scalar(d);
    let oh = |axis: i64| case(OneHot).i("axis", axis).x("i64[2,3]").c(depth(5)).x("f32[2]").ok();
    assert_eq!(oh(-1), ty("f32[2,3,5]"));
    assert_eq!(oh(0), ty("f32[5,2,3]"));
    assert_eq!(oh(1), ty("f32[2,5,3]"));
    assert_eq!(oh(-3), ty("f32[5,2,3]"));
    assert_eq!(case(OneHot).x("i32[4]").c(Tensor::scalar(3.7f32)).x("i8[2]").ok(), ty("i8[4,3]"));
    assert_eq!(case(OneHot).x("i64[]").c(ci64(&[2])).x("f32[2]").ok(), ty("f32[2]"));
    case(OneHot).i("axis", 3).x("i64[2,3]").c(depth(5)).x("f32[2]").invalid();
    case(OneHot).x("i64[2]").c(depth(0)).x("f32[2]").invalid();
    case(OneHot).x("i64[2]").c(depth(-4)).x("f32[2]").invalid();
    case(OneHot).x("i64[2]").c(Tensor::scalar(f32::NAN)).x("f32[2]").invalid();
    case(OneHot).x("i64[2]").c(depth(5)).x("f32[3]").invalid();
    case(OneHot).x("i64[2]").x("i64[]").x("f32[2]").unsupported();
}

#[test]
fn range() {
    let ri = |s: i32, l: i32, d: i32| case(Range).c(Tensor::scalar(s)).c(Tensor::scalar(l)).c(Tensor::scalar(d)).ok();
    assert_eq!(ri(1, 10, 3), ty("i32[3]")); // 1 4 7
    assert_eq!(ri(10, 4, -2), ty("i32[3]")); // 10 8 6
    assert_eq!(ri(0, 10, -1), ty("i32[0]"));
    assert_eq!(ri(0, -7, -2), ty("i32[4]")); // 0 -2 -4 -6
    assert_eq!(ri(0, -7, 2), ty("i32[0]"));
    assert_eq!(ri(3, 3, 1), ty("i32[0]"));
    let rf = |s: f32, l: f32, d: f32| case(Range).c(Tensor::scalar(s)).c(Tensor::scalar(l)).c(Tensor::scalar(d)).run(1);
    assert_eq!(rf(0.0, 1.0, 0.3), Ok(tys(&["f32[4]"]))); // 0 .3 .6 .9
    assert_eq!(rf(1.0, 1.0, 1.0), Ok(tys(&["f32[0]"])));
    assert_eq!(rf(2.5, -1.0, -0.5), Ok(tys(&["f32[7]"])));
    assert!(matches!(rf(0.0, 1.0, 0.0), Err(InferError::Invalid(_))));
    assert!(matches!(rf(0.0, 1.0, f32::NAN), Err(InferError::Invalid(_))));
    assert!(matches!(rf(0.0, f32::INFINITY, 1.0), Err(InferError::Invalid(_))));
    assert_eq!(rf(0.0, f32::NEG_INFINITY, 1.0), Ok(tys(&["f32[0]"])));
    let rl = |s: i64, l: i64, d: i64| case(Range).c(Tensor::scalar(s)).c(Tensor::scalar(l)).c(Tensor::scalar(d)).run(1);
    assert_eq!(rl(0, 7, 2), Ok(tys(&["i64[4]"])));
    assert!(matches!(rl(i64::MIN, i64::MAX, 1), Err(InferError::Invalid(_))));
    // MAX, then MAX + MIN = -1; the next, -1 + MIN, is not beyond MIN.
    assert_eq!(rl(i64::MAX, i64::MIN, i64::MIN), Ok(tys(&["i64[2]"])));
    assert!(matches!(rl(0, 5, 0), Err(InferError::Invalid(_))));
    case(Range).c(Tensor::scalar(0i64)).c(Tensor::scalar(5i32)).c(Tensor::scalar(1i64)).invalid();
    case(Range).c(ci64(&[0, 1])).c(Tensor::scalar(5i64)).c(Tensor::scalar(1i64)).invalid();
    case(Range).c(Tensor::scalar(0i64)).x("i64[]").c(Tensor::scalar(1i64)).unsupported();
}

#[test]
fn range_matches_the_definition_exhaustively() {
    // Number of k ≥ 0 with start + k·delta strictly before limit, in the direction of delta.
    for s in -6i64..=6 {
        for l in -6i64..=6 {
            for d in [-4i64, -3, -2, -1, 1, 2, 3, 4] {
                let mut n = 0;
                let mut v = s;
                while (d > 0 && v < l) || (d < 0 && v > l) {
                    n += 1;
                    v += d;
                }
                let got = case(Range).c(Tensor::scalar(s)).c(Tensor::scalar(l)).c(Tensor::scalar(d)).ok();
                assert_eq!(got.shape.dims(), &[n], "Range({s}, {l}, {d})");
            }
        }
    }
}

#[test]
fn trilu_reverse_sequence() {
    assert_eq!(case(Trilu).x("f32[3,4]").ok(), ty("f32[3,4]"));
    assert_eq!(case(Trilu).i("upper", 0).x("f32[2,3,4]").c(Tensor::scalar(1i64)).ok(), ty("f32[2,3,4]"));
    case(Trilu).x("f32[3]").invalid();
    assert_eq!(case(ReverseSequence).x("f32[4,3,5]").x("i64[3]").ok(), ty("f32[4,3,5]"));
    assert_eq!(
        case(ReverseSequence).i("batch_axis", 0).i("time_axis", 1).x("f32[4,3]").x("i64[4]").ok(),
        ty("f32[4,3]")
    );
    case(ReverseSequence).x("f32[4,3,5]").x("i64[4]").invalid();
    case(ReverseSequence).i("batch_axis", 0).x("f32[4,3]").x("i64[4]").invalid();
}

#[test]
fn sampling_ops() {
    // GridSample: [N, C, out..] from X [N, C, in..] and grid [N, out.., r].
    assert_eq!(case(GridSample).x("f32[2,3,5,7]").x("f32[2,4,6,2]").ok(), ty("f32[2,3,4,6]"));
    assert_eq!(case(GridSample).x("f32[1,2,3,4,5]").x("f32[1,2,3,2,3]").ok(), ty("f32[1,2,2,3,2]"));
    case(GridSample).x("f32[2,3,5,7]").x("f32[1,4,6,2]").invalid();
    case(GridSample).x("f32[2,3,5,7]").x("f32[2,4,6,3]").invalid();
    case(GridSample).x("f32[2,3,5]").x("f32[2,4,1]").unsupported();
    // Col2Im: blocks of 2x3 with strides (2, 1), dilations (1, 2), pads (1, 0, 2, 1) on 6x7.
    let c2 = |x: &str| {
        case(Col2Im)
            .is("strides", &[2, 1])
            .is("dilations", &[1, 2])
            .is("pads", &[1, 0, 2, 1])
            .x(x)
            .c(ci64(&[6, 7]))
            .c(ci64(&[2, 3]))
    };
    assert_eq!(c2("f32[2,12,16]").ok(), ty("f32[2,2,6,7]"));
    c2("f32[2,12,15]").invalid();
    c2("f32[2,11,16]").invalid();
    case(Col2Im).x("f32[1,4,9]").c(ci64(&[4, 4])).c(ci64(&[5, 2])).invalid();
    // RoiAlign: [R, C, oh, ow].
    assert_eq!(
        case(RoiAlign).i("output_height", 3).i("output_width", 2).x("f32[2,5,7,9]").x("f32[4,4]").x("i64[4]").ok(),
        ty("f32[4,5,3,2]")
    );
    case(RoiAlign).x("f32[2,5,7,9]").x("f32[4,5]").x("i64[4]").invalid();
    case(RoiAlign).x("f32[2,5,7,9]").x("f32[4,4]").x("i64[3]").invalid();
    case(RoiAlign).i("output_height", 0).x("f32[2,5,7,9]").x("f32[4,4]").x("i64[4]").invalid();
    // DeformConv: offsets must be [N, og·2·kh·kw, oh, ow].
    assert_eq!(case(DeformConv).x("f32[1,2,4,4]").x("f32[3,2,2,2]").x("f32[1,8,3,3]").ok(), ty("f32[1,3,3,3]"));
    assert_eq!(
        case(DeformConv)
            .i("group", 2)
            .i("offset_group", 2)
            .is("strides", &[2, 1])
            .is("pads", &[1, 0, 2, 1])
            .x("f32[1,4,5,6]")
            .x("f32[6,2,3,2]")
            .x("f32[1,24,3,6]")
            .ok(),
        ty("f32[1,6,3,6]")
    );
    case(DeformConv).x("f32[1,2,4,4]").x("f32[3,2,2,2]").x("f32[1,8,3,2]").invalid();
    case(DeformConv).i("group", 2).x("f32[1,2,4,4]").x("f32[3,1,2,2]").x("f32[1,8,3,3]").invalid();
    case(DeformConv).x("f32[1,2,4,4]").x("f32[3,2,2,2]").x("f32[1,8,3,3]").x("f32[2]").invalid();
}

#[test]
fn resize() {
    let sc = |x: &str, s: &[f32]| case(Resize).x(x).none().c(cf32(s)).ok();
    assert_eq!(sc("f32[1,1,2,4]", &[1.0, 1.0, 0.6, 0.6]), ty("f32[1,1,1,2]"));
    assert_eq!(sc("f32[1,1,2,2]", &[1.0, 1.0, 2.0, 3.0]), ty("f32[1,1,4,6]"));
    assert_eq!(sc("f32[1,1,5,5]", &[1.0, 1.0, 0.5, 0.5]), ty("f32[1,1,2,2]"));
    assert_eq!(
        case(Resize).is("axes", &[2, 3]).x("f32[1,3,4,5]").none().c(cf32(&[2.0, 2.0])).ok(),
        ty("f32[1,3,8,10]")
    );
    let sz = |x: &str, s: &[i64]| case(Resize).x(x).none().none().c(ci64(s)).ok();
    assert_eq!(sz("f32[1,1,2,2]", &[1, 1, 3, 5]), ty("f32[1,1,3,5]"));
    // An empty `scales` next to `sizes` counts as absent.
    assert_eq!(case(Resize).x("u8[1,1,2,2]").x("f32[0]").c(cf32(&[])).c(ci64(&[1, 1, 1, 1])).ok(), ty("u8[1,1,1,1]"));
    // keep_aspect_ratio_policy on axes [2, 3] of a 4x4 image with sizes [3, 2]:
    // not_larger: scale min(3/4, 2/4) = 0.5 → 2x2; not_smaller: 0.75 → 3x3.
    let kar = |p: &str| {
        case(Resize)
            .s("keep_aspect_ratio_policy", p)
            .is("axes", &[2, 3])
            .x("f32[1,1,4,4]")
            .none()
            .none()
            .c(ci64(&[3, 2]))
            .ok()
    };
    assert_eq!(kar("not_larger"), ty("f32[1,1,2,2]"));
    assert_eq!(kar("not_smaller"), ty("f32[1,1,3,3]"));
    assert_eq!(kar("stretch"), ty("f32[1,1,3,2]"));
    // 5x3 image, sizes [4, 4]: not_larger scale min(0.8, 1.333) = 0.8 → round(4.0)=4, round(2.4)=2.
    assert_eq!(
        case(Resize)
            .s("keep_aspect_ratio_policy", "not_larger")
            .is("axes", &[0, 1])
            .x("f32[5,3]")
            .none()
            .none()
            .c(ci64(&[4, 4]))
            .ok(),
        ty("f32[4,2]")
    );
    case(Resize).x("f32[1,1,2,2]").none().c(cf32(&[1.0, 1.0, 2.0, 2.0])).c(ci64(&[1, 1, 4, 4])).invalid();
    case(Resize).x("f32[1,1,2,2]").invalid();
    case(Resize).x("f32[1,1,2,2]").none().c(cf32(&[1.0, 2.0])).invalid();
    case(Resize).x("f32[1,1,2,2]").none().c(cf32(&[1.0, 1.0, -2.0, 2.0])).invalid();
    case(Resize).x("f32[1,1,2,2]").none().c(cf32(&[1.0, 1.0, f32::NAN, 2.0])).invalid();
    case(Resize).x("f32[1,1,2,2]").none().c(cf32(&[1.0, 1.0, 1e30, 1e30])).invalid();
    case(Resize).x("f32[1,1,2,2]").none().none().c(ci64(&[1, 1, -1, 2])).invalid();
    case(Resize).s("mode", "area").x("f32[2]").none().c(cf32(&[2.0])).invalid();
    case(Resize).x("f32[1,1,2,2]").none().x("f32[4]").unsupported();
    case(Resize).x("f32[1,1,2,2]").none().none().x("i64[4]").unsupported();
}

// ---------------------------------------------------------------- reductions

#[test]
fn reductions() {
    let x = "f32[2,3,4]";
    assert_eq!(case(ReduceSum).x(x).c(ci64(&[1])).ok(), ty("f32[2,1,4]"));
    assert_eq!(case(ReduceSum).i("keepdims", 0).x(x).c(ci64(&[1])).ok(), ty("f32[2,4]"));
    assert_eq!(case(ReduceMean).x(x).ok(), ty("f32[1,1,1]"));
    assert_eq!(case(ReduceMean).i("keepdims", 0).x(x).ok(), ty("f32[]"));
    assert_eq!(case(ReduceMean).i("keepdims", 0).x(x).c(ci64(&[])).ok(), ty("f32[]"));
    assert_eq!(case(ReduceProd).i("noop_with_empty_axes", 1).x(x).ok(), ty("f32[2,3,4]"));
    assert_eq!(case(ReduceL2).i("keepdims", 0).x(x).c(ci64(&[-1, 0])).ok(), ty("f32[3]"));
    assert_eq!(case(ReduceMax).x("bool[2,2]").c(ci64(&[0])).ok(), ty("bool[1,2]"));
    assert_eq!(case(ReduceSumSquare).x("i32[5]").ok(), ty("i32[1]"));
    assert_eq!(case(ReduceLogSumExp).x("f32[]").ok(), ty("f32[]"));
    case(ReduceSum).x("bool[2]").invalid();
    case(ReduceSum).x(x).c(ci64(&[1, -2])).invalid();
    case(ReduceSum).x(x).c(ci64(&[3])).invalid();
    case(ReduceSum).i("keepdims", 2).x(x).invalid();
    case(ReduceSum).x(x).x("i64[1]").unsupported();
    assert_eq!(case(ReduceSum).x(x).x("i64[0]").ok(), ty("f32[1,1,1]"));
    assert_eq!(case(ReduceMin).i("keepdims", 0).x(x).c(Tensor::scalar(2i64)).ok(), ty("f32[2,3]"));
    case(ReduceSum).x(x).c(cf32(&[1.0])).invalid();

    assert_eq!(case(ArgMax).i("axis", 1).x(x).ok(), ty("i64[2,1,4]"));
    assert_eq!(case(ArgMin).i("axis", 1).i("keepdims", 0).x(x).ok(), ty("i64[2,4]"));
    assert_eq!(case(ArgMax).x(x).ok(), ty("i64[1,3,4]"));
    assert_eq!(case(ArgMax).i("axis", -1).i("keepdims", 0).x("u8[7]").ok(), ty("i64[]"));
    case(ArgMax).x("f32[]").invalid();
    case(ArgMax).i("axis", 3).x(x).invalid();
}

#[test]
fn cum_sum_top_k() {
    assert_eq!(case(CumSum).x("f32[2,3]").c(Tensor::scalar(1i64)).ok(), ty("f32[2,3]"));
    assert_eq!(case(CumSum).x("i32[2,3]").c(ci32(&[-2])).ok(), ty("i32[2,3]"));
    assert_eq!(case(CumSum).x("f32[2,3]").x("i64[]").ok(), ty("f32[2,3]"));
    case(CumSum).x("f32[2,3]").c(Tensor::scalar(2i64)).invalid();
    case(CumSum).x("f32[2,3]").c(Tensor::scalar(1.0f32)).invalid();
    case(CumSum).x("f32[2,3]").c(ci64(&[0, 1])).invalid();

    let k = |v: i64| ci64(&[v]);
    assert_eq!(case(TopK).x("f32[3,4]").c(k(2)).oks(2), tys(&["f32[3,2]", "i64[3,2]"]));
    assert_eq!(case(TopK).i("axis", 0).x("f32[3,4]").c(k(3)).oks(2), tys(&["f32[3,4]", "i64[3,4]"]));
    assert_eq!(case(TopK).x("f32[3,4]").c(k(0)).oks(1), tys(&["f32[3,0]"]));
    assert_eq!(case(TopK).x("i32[5]").c(Tensor::scalar(1i64)).oks(2), tys(&["i32[1]", "i64[1]"]));
    case(TopK).x("f32[3,4]").c(k(5)).invalid_n(2);
    case(TopK).x("f32[3,4]").c(k(-1)).invalid_n(2);
    case(TopK).x("f32[3,4]").c(ci32(&[1])).invalid_n(2);
    // Three results: the run-time-K form (kiln_ir::dynamic), bound by the axis or by
    // kiln_bound, the extent last.
    assert_eq!(case(TopK).x("f32[3,4]").x("i64[1]").oks(3), tys(&["f32[3,4]", "i64[3,4]", "i64[]"]));
    assert_eq!(case(TopK).x("f32[3,4]").c(k(1)).oks(3), tys(&["f32[3,4]", "i64[3,4]", "i64[]"]));
    assert_eq!(
        case(TopK).i("axis", 0).i("kiln_bound", 2).x("f32[3,4]").x("i64[1]").oks(3),
        tys(&["f32[2,4]", "i64[2,4]", "i64[]"])
    );
    case(TopK).x("f32[3,4]").c(k(1)).invalid_n(4);
    case(TopK).x("f32[3,4]").x("i64[2]").invalid_n(3);
    case(TopK).x("f32[3,4]").x("i64[1]").unsupported();
}

#[test]
fn data_dependent_extents() {
    assert_eq!(case(NonZero).x("f32[3,1,5]").oks(2), tys(&["i64[3,15]", "i64[]"]));
    assert_eq!(case(NonZero).i("kiln_bound", 4).x("bool[6]").oks(2), tys(&["i64[1,4]", "i64[]"]));
    // A declared bound above the derived one is capped; a negative one is invalid.
    assert_eq!(case(NonZero).i("kiln_bound", 99).x("bool[6]").oks(2), tys(&["i64[1,6]", "i64[]"]));
    case(NonZero).i("kiln_bound", -2).x("bool[6]").invalid_n(2);
    assert_eq!(case(Compress).i("axis", 1).x("f32[2,7,3]").x("bool[5]").oks(2), tys(&["f32[2,5,3]", "i64[]"]));
    assert_eq!(case(Compress).x("f32[2,7,3]").x("bool[40]").oks(2), tys(&["f32[40]", "i64[]"]));
    case(Compress).i("axis", 1).x("f32[2,7,3]").x("bool[8]").invalid_n(2);
    case(Compress).x("f32[2,7]").x("f32[3]").invalid_n(2);
    assert_eq!(case(Unique).x("f32[2,3]").oks(5), tys(&["f32[6]", "i64[6]", "i64[6]", "i64[6]", "i64[]"]));
    assert_eq!(
        case(Unique).i("axis", -1).x("i32[2,3,4]").oks(5),
        tys(&["i32[2,3,4]", "i64[4]", "i64[4]", "i64[4]", "i64[]"])
    );
    let (b, sc) = ("f32[2,5,4]", "f32[2,3,5]");
    // No max_output_boxes_per_class: ONNX's default 0 selects nothing.
    assert_eq!(case(NonMaxSuppression).x(b).x(sc).oks(2), tys(&["i64[0,3]", "i64[]"]));
    assert_eq!(case(NonMaxSuppression).x(b).x(sc).x("i64[1]").oks(2), tys(&["i64[30,3]", "i64[]"]));
    assert_eq!(case(NonMaxSuppression).x(b).x(sc).c(ci64(&[2])).oks(2), tys(&["i64[12,3]", "i64[]"]));
    assert_eq!(
        case(NonMaxSuppression).i("kiln_bound", 7).x(b).x(sc).x("i64[1]").x("f32[1]").x("f32[1]").oks(2),
        tys(&["i64[7,3]", "i64[]"])
    );
    case(NonMaxSuppression).x(b).x("f32[2,3,4]").invalid_n(2);
    case(NonMaxSuppression).i("center_point_box", 2).x(b).x(sc).invalid_n(2);
}

// ---------------------------------------------------------------- convolutions and pools

#[test]
fn conv() {
    let c = |x: &str, w: &str| case(Conv).x(x).x(w);
    assert_eq!(c("f32[1,1,5,5]", "f32[1,1,3,3]").ok(), ty("f32[1,1,3,3]"));
    assert_eq!(c("f32[1,1,5,5]", "f32[1,1,3,3]").is("pads", &[1, 1, 1, 1]).ok(), ty("f32[1,1,5,5]"));
    assert_eq!(
        c("f32[1,1,5,5]", "f32[1,1,3,3]").is("pads", &[1, 1, 1, 1]).is("strides", &[2, 2]).ok(),
        ty("f32[1,1,3,3]")
    );
    // The ONNX example "conv_with_strides_and_asymmetric_padding".
    assert_eq!(
        c("f32[1,1,7,5]", "f32[1,1,3,3]").is("pads", &[1, 0, 1, 0]).is("strides", &[2, 2]).ok(),
        ty("f32[1,1,4,2]")
    );
    assert_eq!(c("f32[1,1,7,7]", "f32[1,1,3,3]").is("dilations", &[2, 2]).ok(), ty("f32[1,1,3,3]"));
    assert_eq!(
        c("f32[1,1,5,6]", "f32[1,1,3,3]").s("auto_pad", "SAME_UPPER").is("strides", &[2, 2]).ok(),
        ty("f32[1,1,3,3]")
    );
    assert_eq!(c("f32[1,1,5,6]", "f32[1,1,3,3]").s("auto_pad", "SAME_LOWER").ok(), ty("f32[1,1,5,6]"));
    assert_eq!(
        c("f32[1,1,5,6]", "f32[1,1,3,3]").s("auto_pad", "VALID").is("strides", &[2, 2]).ok(),
        ty("f32[1,1,2,2]")
    );
    assert_eq!(c("f32[1,4,5,5]", "f32[8,2,3,3]").i("group", 2).ok(), ty("f32[1,8,3,3]"));
    assert_eq!(c("f32[1,4,5,5]", "f32[4,1,3,3]").i("group", 4).ok(), ty("f32[1,4,3,3]"));
    assert_eq!(c("f32[2,3,10]", "f32[4,3,3]").ok(), ty("f32[2,4,8]"));
    assert_eq!(c("f32[1,1,4,4,4]", "f32[2,1,2,2,2]").is("strides", &[2, 2, 2]).ok(), ty("f32[1,2,2,2,2]"));
    assert_eq!(c("f16[1,2,3,3]", "f16[5,2,1,1]").x("f16[5]").ok(), ty("f16[1,5,3,3]"));
    assert_eq!(c("f32[1,1,5,5]", "f32[1,1,3,3]").is("kernel_shape", &[3, 3]).ok(), ty("f32[1,1,3,3]"));

    let m = c("f32[1,4,5,5]", "f32[8,4,3,3]").i("group", 2).invalid();
    assert!(m.contains("input channels"), "{m}");
    c("f32[1,4,5,5]", "f32[3,2,3,3]").i("group", 2).invalid();
    c("f32[1,3,5,5]", "f32[2,2,3,3]").invalid();
    c("f32[1,1,2,2]", "f32[1,1,3,3]").invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").s("auto_pad", "VALID").is("dilations", &[3, 3]).invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").is("kernel_shape", &[2, 2]).invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").is("strides", &[1]).invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").is("strides", &[0, 1]).invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").is("pads", &[-1, 0, 0, 0]).invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").s("auto_pad", "SAME").invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").i("group", 0).invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").x("f32[2]").invalid();
    c("f32[1,5]", "f32[1,1]").invalid();
    c("f32[1,1,5,5]", "f32[1,1,3]").invalid();
    c("f32[1,1,5,5]", "f16[1,1,3,3]").invalid();
    c("i32[1,1,5,5]", "i32[1,1,3,3]").invalid();
    c("f32[1,1,5,5]", "f32[1,1,0,3]").invalid();
    c("f32[1,1,5,5]", "f32[1,1,3,3]").is("dilations", &[i64::MAX, 1]).invalid();
}

#[test]
fn quantized_convs() {
    assert_eq!(case(ConvInteger).x("u8[1,1,3,3]").x("u8[1,1,2,2]").ok(), ty("i32[1,1,2,2]"));
    assert_eq!(case(ConvInteger).x("i8[1,1,3,3]").x("u8[2,1,2,2]").x("i8[]").x("u8[2]").ok(), ty("i32[1,2,2,2]"));
    case(ConvInteger).x("f32[1,1,3,3]").x("u8[1,1,2,2]").invalid();
    case(ConvInteger).x("u8[1,1,3,3]").x("u8[1,1,2,2]").x("i8[]").invalid();
    let q =
        || case(QLinearConv).x("u8[1,1,3,3]").x("f32[]").x("u8[]").x("i8[2,1,2,2]").x("f32[2]").x("i8[2]").x("f32[]");
    assert_eq!(q().x("i8[]").ok(), ty("i8[1,2,2,2]"));
    assert_eq!(q().x("u8[]").x("i32[2]").ok(), ty("u8[1,2,2,2]"));
    q().invalid();
    q().x("u8[]").x("f32[2]").invalid();
    q().x("f32[]").invalid();
}

#[test]
fn conv_transpose() {
    let ct = |x: &str, w: &str| case(ConvTranspose).x(x).x(w);
    // Shapes of the examples in the ONNX ConvTranspose specification.
    assert_eq!(ct("f32[1,1,3,3]", "f32[1,2,3,3]").ok(), ty("f32[1,2,5,5]"));
    assert_eq!(ct("f32[1,1,3,3]", "f32[1,2,3,3]").is("strides", &[3, 2]).ok(), ty("f32[1,2,9,7]"));
    assert_eq!(
        ct("f32[1,1,3,3]", "f32[1,2,3,3]").is("strides", &[3, 2]).is("pads", &[1, 2, 1, 2]).ok(),
        ty("f32[1,2,7,3]")
    );
    assert_eq!(
        ct("f32[1,1,3,3]", "f32[1,2,3,3]").is("strides", &[3, 2]).is("output_padding", &[1, 1]).ok(),
        ty("f32[1,2,10,8]")
    );
    assert_eq!(
        ct("f32[1,1,3,3]", "f32[1,2,3,3]").is("strides", &[3, 2]).is("output_shape", &[10, 8]).ok(),
        ty("f32[1,2,10,8]")
    );
    assert_eq!(
        ct("f32[1,1,3,3]", "f32[1,2,3,3]").is("strides", &[3, 2]).is("output_shape", &[1, 2, 10, 8]).ok(),
        ty("f32[1,2,10,8]")
    );
    assert_eq!(
        ct("f32[1,1,3,3]", "f32[1,2,3,3]").s("auto_pad", "SAME_UPPER").is("strides", &[2, 2]).ok(),
        ty("f32[1,2,6,6]")
    );
    assert_eq!(ct("f32[1,1,3,3]", "f32[1,1,2,2]").is("dilations", &[2, 2]).ok(), ty("f32[1,1,5,5]"));
    assert_eq!(ct("f32[1,4,3,3]", "f32[4,3,3,3]").i("group", 2).x("f32[6]").ok(), ty("f32[1,6,5,5]"));
    assert_eq!(ct("f32[2,3,4]", "f32[3,5,2]").is("strides", &[2]).ok(), ty("f32[2,5,8]"));
    ct("f32[1,2,3,3]", "f32[1,2,3,3]").invalid();
    ct("f32[1,3,3,3]", "f32[3,1,3,3]").i("group", 2).invalid();
    ct("f32[1,1,1,1]", "f32[1,1,1,1]").is("pads", &[1, 1, 1, 1]).invalid();
    ct("f32[1,1,3,3]", "f32[1,2,3,3]").is("output_shape", &[10]).invalid();
    ct("f32[1,1,3,3]", "f32[1,2,3,3]").x("f32[1]").invalid();
}

#[test]
fn pools() {
    let mp = |x: &str, k: &[i64]| case(MaxPool).is("kernel_shape", k).x(x);
    // Shapes of the examples in the ONNX MaxPool specification.
    assert_eq!(mp("f32[1,3,32,32]", &[2, 2]).ok(), ty("f32[1,3,31,31]"));
    assert_eq!(mp("f32[1,3,32,32]", &[2, 2]).is("strides", &[2, 2]).ok(), ty("f32[1,3,16,16]"));
    assert_eq!(mp("f32[1,3,28,28]", &[5, 5]).is("pads", &[2, 2, 2, 2]).ok(), ty("f32[1,3,28,28]"));
    assert_eq!(mp("f32[1,1,4,4]", &[3, 3]).is("strides", &[2, 2]).i("ceil_mode", 1).ok(), ty("f32[1,1,2,2]"));
    assert_eq!(mp("f32[1,1,4,4]", &[3, 3]).is("strides", &[2, 2]).ok(), ty("f32[1,1,1,1]"));
    assert_eq!(mp("f32[1,1,2,2]", &[1, 1]).is("strides", &[2, 2]).i("ceil_mode", 1).ok(), ty("f32[1,1,1,1]"));
    assert_eq!(mp("f32[1,1,4,4]", &[2, 2]).is("dilations", &[2, 2]).ok(), ty("f32[1,1,2,2]"));
    assert_eq!(mp("f32[1,3,32,32]", &[2, 2]).s("auto_pad", "SAME_UPPER").ok(), ty("f32[1,3,32,32]"));
    assert_eq!(mp("f32[1,3,32]", &[2]).ok(), ty("f32[1,3,31]"));
    assert_eq!(mp("u8[1,1,5,5]", &[2, 2]).s("auto_pad", "VALID").is("strides", &[2, 2]).ok(), ty("u8[1,1,2,2]"));
    // ceil_mode with padding: extent 5, kernel 2, stride 2, pads 1+1: ceil(5/2)+1 = 4 windows,
    // but the 4th would start at 6 ≥ 5 + 1 (inside the end padding), so 3.
    assert_eq!(mp("f32[1,1,5]", &[2]).is("strides", &[2]).is("pads", &[1, 1]).i("ceil_mode", 1).ok(), ty("f32[1,1,3]"));
    assert_eq!(mp("f32[1,1,5]", &[2]).is("strides", &[2]).is("pads", &[1, 1]).ok(), ty("f32[1,1,3]"));
    // extent 6, kernel 3, stride 2, ceil: ceil(3/2)+1 = 3, the 3rd window starts at 4 < 6: kept.
    assert_eq!(mp("f32[1,1,6]", &[3]).is("strides", &[2]).i("ceil_mode", 1).ok(), ty("f32[1,1,3]"));
    assert_eq!(mp("f32[1,1,6]", &[3]).is("strides", &[2]).ok(), ty("f32[1,1,2]"));
    assert_eq!(mp("f32[1,3,4,4]", &[2, 2]).oks(2), tys(&["f32[1,3,3,3]", "i64[1,3,3,3]"]));
    mp("f32[1,3,4,4]", &[2, 2]).invalid_n(3);
    mp("f32[1,3,4,4]", &[2]).invalid();
    mp("f32[1,3,4,4]", &[0, 2]).invalid();
    mp("f32[3,4]", &[2]).invalid();
    mp("i32[1,1,4,4]", &[2, 2]).invalid();
    mp("f32[1,1,2,2]", &[3, 3]).invalid();
    case(MaxPool).x("f32[1,1,4,4]").invalid();

    let ap = |x: &str, k: &[i64]| case(AveragePool).is("kernel_shape", k).x(x);
    assert_eq!(ap("f32[1,3,32,32]", &[2, 2]).ok(), ty("f32[1,3,31,31]"));
    assert_eq!(
        ap("f32[1,3,32,32]", &[3, 3]).s("auto_pad", "SAME_LOWER").is("strides", &[2, 2]).ok(),
        ty("f32[1,3,16,16]")
    );
    assert_eq!(ap("f32[1,1,4,4]", &[3, 3]).is("strides", &[2, 2]).i("ceil_mode", 1).ok(), ty("f32[1,1,2,2]"));
    ap("f32[1,3,4,4]", &[2, 2]).invalid_n(2);
    ap("u8[1,3,4,4]", &[2, 2]).invalid();
    assert_eq!(case(LpPool).i("p", 3).is("kernel_shape", &[2, 2]).x("f32[1,3,4,4]").ok(), ty("f32[1,3,3,3]"));

    assert_eq!(case(GlobalAveragePool).x("f32[2,3,5,7]").ok(), ty("f32[2,3,1,1]"));
    assert_eq!(case(GlobalMaxPool).x("f32[2,3,5]").ok(), ty("f32[2,3,1]"));
    assert_eq!(case(GlobalLpPool).x("f16[1,2,3,4,5]").ok(), ty("f16[1,2,1,1,1]"));
    case(GlobalAveragePool).x("f32[2,3]").invalid();
}

// ---------------------------------------------------------------- normalizations

#[test]
fn normalizations() {
    let bn = || case(BatchNormalization).x("f32[2,3,4,5]").x("f32[3]").x("f32[3]");
    assert_eq!(bn().x("f32[3]").x("f32[3]").ok(), ty("f32[2,3,4,5]"));
    assert_eq!(
        case(BatchNormalization).x("f16[2,3]").x("f32[3]").x("f32[3]").x("f32[3]").x("f32[3]").ok(),
        ty("f16[2,3]")
    );
    bn().x("f32[3]").x("f32[4]").invalid();
    bn().x("f32[3]").invalid();
    bn().x("f32[3]").x("f32[3]").i("training_mode", 1).unsupported();
    assert!(matches!(bn().x("f32[3]").x("f32[3]").run(3), Err(InferError::Unsupported(_))));

    assert_eq!(case(InstanceNormalization).x("f32[2,3,4]").x("f32[3]").x("f32[3]").ok(), ty("f32[2,3,4]"));
    case(InstanceNormalization).x("f32[2,3,4]").x("f32[2]").x("f32[3]").invalid();

    let gn = |g: i64, s: &str| case(GroupNormalization).i("num_groups", g).x("f32[2,6,4]").x(s).x(s);
    assert_eq!(gn(3, "f32[6]").ok(), ty("f32[2,6,4]"));
    gn(4, "f32[6]").invalid();
    gn(3, "f32[3]").invalid();
    case(GroupNormalization).x("f32[2,6,4]").x("f32[6]").x("f32[6]").invalid();

    let ln = |axis: i64, x: &str, s: &str| case(LayerNormalization).i("axis", axis).x(x).x(s);
    assert_eq!(ln(-1, "f32[2,3,4]", "f32[4]").oks(3), tys(&["f32[2,3,4]", "f32[2,3,1]", "f32[2,3,1]"]));
    assert_eq!(ln(1, "f32[2,3,4]", "f32[3,4]").x("f32[4]").oks(3), tys(&["f32[2,3,4]", "f32[2,1,1]", "f32[2,1,1]"]));
    assert_eq!(ln(0, "f32[2,3,4]", "f32[2,3,4]").oks(2), tys(&["f32[2,3,4]", "f32[1,1,1]"]));
    assert_eq!(ln(-1, "f16[5,8]", "f16[8]").oks(3), tys(&["f16[5,8]", "f32[5,1]", "f32[5,1]"]));
    assert_eq!(ln(-1, "f16[5,8]", "f16[8]").i("stash_type", 11).oks(2), tys(&["f16[5,8]", "f64[5,1]"]));
    ln(-1, "f32[2,3,4]", "f32[3]").invalid();
    ln(3, "f32[2,3,4]", "f32[4]").invalid();
    ln(-1, "f32[2,3,4]", "f16[4]").invalid();
    ln(-1, "f32[2,3,4]", "f32[4]").invalid_n(4);
    case(LayerNormalization).x("f32[2,3,4]").invalid();

    let rms = |axis: i64, x: &str, s: &str| case(RMSNormalization).i("axis", axis).x(x).x(s);
    assert_eq!(rms(-1, "f32[2,3,4]", "f32[4]").ok(), ty("f32[2,3,4]"));
    assert_eq!(rms(1, "f32[2,3,4]", "f32[3,1]").ok(), ty("f32[2,3,4]"));
    assert_eq!(rms(-2, "f16[2,3,4]", "f16[3,4]").ok(), ty("f16[2,3,4]"));
    rms(-1, "f32[2,3,4]", "f32[3]").invalid();
    rms(3, "f32[2,3,4]", "f32[4]").invalid();
    rms(-1, "f32[2,3,4]", "f16[4]").invalid();
    rms(-1, "f32[2,3,4]", "f32[4]").i("stash_type", 7).invalid();
    rms(-1, "i32[2,3,4]", "i32[4]").invalid();
    case(RMSNormalization).x("f32[2,3,4]").invalid();
}

// ---------------------------------------------------------------- transformer

#[test]
fn attention() {
    let att = |q: &str, k: &str, v: &str| case(Attention).x(q).x(k).x(v);
    // 4-D: [B, H, S, D]; results Y, present_key, present_value, the scores.
    assert_eq!(
        att("f32[2,3,4,8]", "f32[2,3,6,8]", "f32[2,3,6,10]").oks(4),
        tys(&["f32[2,3,4,10]", "f32[2,3,6,8]", "f32[2,3,6,10]", "f32[2,3,4,6]"])
    );
    // Grouped heads, a cache of 12 keys, a mask shorter than the keys.
    let cached =
        |m: &str| att("f16[2,9,4,8]", "f16[2,3,6,8]", "f16[2,3,6,8]").x(m).x("f16[2,3,12,8]").x("f16[2,3,12,8]");
    assert_eq!(cached("f16[4,18]").oks(4), tys(&["f16[2,9,4,8]", "f16[2,3,18,8]", "f16[2,3,18,8]", "f16[2,9,4,18]"]));
    assert_eq!(cached("bool[2,1,4,10]").ok(), ty("f16[2,9,4,8]"));
    cached("f16[4,19]").invalid();
    cached("f16[3,18]").invalid();
    cached("f32[4,18]").invalid();
    att("f16[2,9,4,8]", "f16[2,3,6,8]", "f16[2,3,6,8]").none().x("f16[2,3,12,8]").invalid();
    att("f16[2,9,4,8]", "f16[2,3,6,8]", "f16[2,3,6,8]").none().x("f16[2,3,12,4]").x("f16[2,3,12,8]").invalid();
    // 3-D: [B, S, heads·D], the heads from the attributes.
    let packed = |q: &str, k: &str, v: &str| att(q, k, v).i("q_num_heads", 9).i("kv_num_heads", 3);
    assert_eq!(
        packed("f32[2,4,72]", "f32[2,6,24]", "f32[2,6,30]").oks(4),
        tys(&["f32[2,4,90]", "f32[2,3,6,8]", "f32[2,3,6,10]", "f32[2,9,4,6]"])
    );
    att("f32[2,4,72]", "f32[2,6,24]", "f32[2,6,24]").invalid();
    packed("f32[2,4,70]", "f32[2,6,24]", "f32[2,6,24]").invalid();
    packed("f32[2,4,72]", "f32[2,5,24]", "f32[2,6,24]").invalid();
    att("f32[2,4,4,8]", "f32[2,3,6,8]", "f32[2,3,6,8]").invalid();
    att("f32[2,3,4,8]", "f32[2,3,6,4]", "f32[2,3,6,8]").invalid();
    att("f32[2,3,4,8]", "f32[2,3,6,8]", "f16[2,3,6,8]").invalid();
    att("i32[2,3,4,8]", "i32[2,3,6,8]", "i32[2,3,6,8]").invalid();
    att("f32[2,3,4,8]", "f32[2,3,6,8]", "f32[2,3,6,8]").i("qk_matmul_output_mode", 4).invalid();
    att("f32[2,3,4,8]", "f32[2,3,6,8]", "f32[2,3,6,8]").i("q_num_heads", 0).invalid();
    // The padded keys' lengths: int64 [B].
    let padded = |n: &str| att("f32[2,3,4,8]", "f32[2,3,6,8]", "f32[2,3,6,8]").none().none().none().x(n);
    assert_eq!(padded("i64[2]").ok(), ty("f32[2,3,4,8]"));
    padded("i32[2]").invalid();
    padded("i64[3]").invalid();
}

#[test]
fn rotary_embedding() {
    let rot = |x: &str, c: &str| case(RotaryEmbedding).x(x).x(c).x(c);
    assert_eq!(rot("f32[2,4,3,8]", "f32[50,4]").x("i64[2,3]").ok(), ty("f32[2,4,3,8]"));
    assert_eq!(rot("f32[2,4,3,8]", "f32[2,3,4]").ok(), ty("f32[2,4,3,8]"));
    assert_eq!(rot("f32[2,4,3,8]", "f32[2,3,2]").i("rotary_embedding_dim", 4).ok(), ty("f32[2,4,3,8]"));
    assert_eq!(rot("f16[2,3,32]", "f16[50,4]").i("num_heads", 4).x("i64[2,3]").ok(), ty("f16[2,3,32]"));
    rot("f32[2,3,32]", "f32[50,4]").x("i64[2,3]").invalid();
    rot("f32[2,3,30]", "f32[50,4]").i("num_heads", 4).x("i64[2,3]").invalid();
    rot("f32[2,4,3,8]", "f32[50,3]").x("i64[2,3]").invalid();
    rot("f32[2,4,3,8]", "f32[50,4]").x("i64[3,2]").invalid();
    rot("f32[2,4,3,8]", "f32[50,4]").x("i32[2,3]").invalid();
    rot("f32[2,4,3,8]", "f32[2,3,4]").i("rotary_embedding_dim", 5).invalid();
    rot("f32[2,4,3,8]", "f32[2,3,8]").i("rotary_embedding_dim", 16).invalid();
    assert_eq!(rot("f32[2,4,3,8]", "f32[50,4]").i("rotary_embedding_dim", 4).x("i64[2,3]").ok(), ty("f32[2,4,3,8]"));
    rot("f32[2,4,3,8]", "f32[50,3]").i("rotary_embedding_dim", 4).x("i64[2,3]").invalid();
    rot("f32[2,4,3,8]", "f32[2,4,4]").invalid();
    rot("f32[2,4,3,8]", "f16[2,3,4]").invalid();
    rot("f32[4,3,8]", "f32[4,4]").invalid();
}

// ---------------------------------------------------------------- recurrent

#[test]
fn recurrent() {
    // seq 5, batch 2, input 3, hidden 4.
    let lstm =
        |dirs: &str, w: &str, r: &str| case(LSTM).i("hidden_size", 4).s("direction", dirs).x("f32[5,2,3]").x(w).x(r);
    assert_eq!(
        lstm("forward", "f32[1,16,3]", "f32[1,16,4]").x("f32[1,32]").oks(3),
        tys(&["f32[5,1,2,4]", "f32[1,2,4]", "f32[1,2,4]"])
    );
    assert_eq!(
        lstm("bidirectional", "f32[2,16,3]", "f32[2,16,4]").oks(3),
        tys(&["f32[5,2,2,4]", "f32[2,2,4]", "f32[2,2,4]"])
    );
    assert_eq!(
        lstm("reverse", "f32[1,16,3]", "f32[1,16,4]")
            .none()
            .x("i32[2]")
            .x("f32[1,2,4]")
            .x("f32[1,2,4]")
            .x("f32[1,12]")
            .oks(2),
        tys(&["f32[5,1,2,4]", "f32[1,2,4]"])
    );
    // layout = 1: X is [batch, seq, input].
    assert_eq!(
        case(LSTM).i("layout", 1).x("f32[2,5,3]").x("f32[1,16,3]").x("f32[1,16,4]").oks(3),
        tys(&["f32[2,5,1,4]", "f32[2,1,4]", "f32[2,1,4]"])
    );
    assert_eq!(
        case(GRU).x("f32[5,2,3]").x("f32[1,12,3]").x("f32[1,12,4]").x("f32[1,24]").oks(2),
        tys(&["f32[5,1,2,4]", "f32[1,2,4]"])
    );
    assert_eq!(case(RNN).x("f32[5,2,3]").x("f32[1,4,3]").x("f32[1,4,4]").oks(2), tys(&["f32[5,1,2,4]", "f32[1,2,4]"]));
    assert_eq!(
        case(RNN).i("layout", 1).x("f32[2,5,3]").x("f32[1,4,3]").x("f32[1,4,4]").none().none().x("f32[2,1,4]").oks(2),
        tys(&["f32[2,5,1,4]", "f32[2,1,4]"])
    );
    case(RNN).x("f32[5,2,3]").x("f32[1,4,3]").x("f32[1,4,4]").invalid_n(3);
    lstm("forward", "f32[1,12,3]", "f32[1,16,4]").invalid();
    lstm("forward", "f32[1,16,3]", "f32[1,16,5]").invalid();
    lstm("bidirectional", "f32[1,16,3]", "f32[1,16,4]").invalid();
    lstm("sideways", "f32[1,16,3]", "f32[1,16,4]").invalid();
    lstm("forward", "f32[1,16,3]", "f32[1,16,4]").none().none().x("f32[2,1,4]").invalid();
    lstm("forward", "f32[1,16,3]", "f32[1,16,4]").x("f32[1,16]").invalid();
    lstm("forward", "f32[1,16,3]", "f32[1,16,4]").none().x("i32[5]").invalid();
    case(GRU).x("f32[5,2]").x("f32[1,12,3]").x("f32[1,12,4]").invalid();
}

// ---------------------------------------------------------------- linear algebra

#[test]
fn gemm() {
    assert_eq!(case(Gemm).x("f32[3,5]").x("f32[5,4]").ok(), ty("f32[3,4]"));
    assert_eq!(case(Gemm).i("transA", 1).x("f32[5,3]").x("f32[5,4]").ok(), ty("f32[3,4]"));
    assert_eq!(case(Gemm).i("transB", 1).x("f32[3,5]").x("f32[4,5]").x("f32[4]").ok(), ty("f32[3,4]"));
    assert_eq!(case(Gemm).x("f32[3,5]").x("f32[5,4]").x("f32[3,1]").ok(), ty("f32[3,4]"));
    assert_eq!(case(Gemm).x("f32[3,5]").x("f32[5,4]").x("f32[]").ok(), ty("f32[3,4]"));
    case(Gemm).x("f32[3,5]").x("f32[5,4]").x("f32[3,5]").invalid();
    case(Gemm).x("f32[3,5]").x("f32[4,5]").invalid();
    case(Gemm).x("f32[2,3,5]").x("f32[5,4]").invalid();
    case(Gemm).x("f32[3,5]").x("f64[5,4]").invalid();
}

#[test]
fn matmul() {
    let mm = |a: &str, b: &str| case(MatMul).x(a).x(b).ok();
    assert_eq!(mm("f32[2,3]", "f32[3,4]"), ty("f32[2,4]"));
    assert_eq!(mm("f32[3]", "f32[3]"), ty("f32[]"));
    assert_eq!(mm("f32[3]", "f32[3,4]"), ty("f32[4]"));
    assert_eq!(mm("f32[2,3]", "f32[3]"), ty("f32[2]"));
    assert_eq!(mm("f32[5,2,3]", "f32[3,4]"), ty("f32[5,2,4]"));
    assert_eq!(mm("f32[2,1,2,3]", "f32[4,3,5]"), ty("f32[2,4,2,5]"));
    assert_eq!(mm("f32[3]", "f32[2,3,4]"), ty("f32[2,4]"));
    assert_eq!(mm("f32[2,3,4]", "f32[4]"), ty("f32[2,3]"));
    assert_eq!(mm("i32[0,3]", "i32[3,0]"), ty("i32[0,0]"));
    assert_eq!(
        case(MatMul).x("f32[2,3]").x("f32[4,5]").invalid(),
        "MatMul: inner dimensions differ: f32[2,3] x f32[4,5]"
    );
    case(MatMul).x("f32[2,2,3]").x("f32[3,3,4]").invalid();
    case(MatMul).x("f32[]").x("f32[3]").invalid();
    case(MatMul).x("f32[2,3]").x("f16[3,4]").invalid();
    case(MatMul).x("bool[2,3]").x("bool[3,4]").invalid();
    assert_eq!(case(MatMulInteger).x("u8[2,3]").x("i8[3,4]").ok(), ty("i32[2,4]"));
    assert_eq!(case(MatMulInteger).x("u8[2,3]").x("u8[3,4]").x("u8[]").x("u8[4]").ok(), ty("i32[2,4]"));
    case(MatMulInteger).x("f32[2,3]").x("f32[3,4]").invalid();
    case(MatMulInteger).x("u8[2,3]").x("u8[3,4]").x("i8[]").invalid();
    let q = |yz: &str| {
        case(QLinearMatMul).x("u8[2,3]").x("f32[]").x("u8[]").x("u8[3,4]").x("f32[]").x("u8[]").x("f32[]").x(yz)
    };
    assert_eq!(q("i8[]").ok(), ty("i8[2,4]"));
    assert_eq!(q("u8[]").ok(), ty("u8[2,4]"));
    q("f32[]").invalid();
}

#[test]
fn einsum() {
    let e = |eq: &str, ins: &[&str]| {
        let mut c = case(Einsum).s("equation", eq);
        for i in ins {
            c = c.x(i);
        }
        c
    };
    assert_eq!(e("ij,jk->ik", &["f32[2,3]", "f32[3,4]"]).ok(), ty("f32[2,4]"));
    assert_eq!(e("ij,jk", &["f32[2,3]", "f32[3,4]"]).ok(), ty("f32[2,4]"));
    assert_eq!(e("ii->i", &["f32[3,3]"]).ok(), ty("f32[3]"));
    assert_eq!(e("ii", &["f32[3,3]"]).ok(), ty("f32[]"));
    assert_eq!(e("ij->ji", &["f32[2,3]"]).ok(), ty("f32[3,2]"));
    // Implicit output sorts the labels: "ji" on [2, 3] is the transpose.
    assert_eq!(e("ji", &["f32[2,3]"]).ok(), ty("f32[3,2]"));
    assert_eq!(e("bij,bjk->bik", &["f32[5,2,3]", "f32[5,3,4]"]).ok(), ty("f32[5,2,4]"));
    assert_eq!(e("...ij,...jk->...ik", &["f32[7,2,3]", "f32[3,4]"]).ok(), ty("f32[7,2,4]"));
    assert_eq!(e("...ij,...jk", &["f32[7,1,2,3]", "f32[6,3,4]"]).ok(), ty("f32[7,6,2,4]"));
    assert_eq!(e("i...->...", &["f32[2,3,4]"]).ok(), ty("f32[3,4]"));
    assert_eq!(e("i,i", &["f32[3]", "f32[3]"]).ok(), ty("f32[]"));
    assert_eq!(e("i,j", &["f32[3]", "f32[4]"]).ok(), ty("f32[3,4]"));
    assert_eq!(e("bA", &["f32[2,3]"]).ok(), ty("f32[3,2]"));
    assert_eq!(e(" i j , j k -> i k ", &["f32[2,3]", "f32[3,4]"]).ok(), ty("f32[2,4]"));
    assert_eq!(e("ij->", &["f32[2,3]"]).ok(), ty("f32[]"));
    assert_eq!(e(",->", &["f32[]", "f32[]"]).ok(), ty("f32[]"));
    e("ij,jk", &["f32[2,3]", "f32[4,5]"]).invalid();
    e("ij,jk", &["f32[2,3]"]).invalid();
    e("ij->ik", &["f32[2,3]"]).invalid();
    e("ij->ii", &["f32[2,2]"]).invalid();
    e("ijk", &["f32[2,3]"]).invalid();
    e("i-j", &["f32[2,3]"]).invalid();
    e("..i", &["f32[2,3]"]).invalid();
    e("...i...", &["f32[2,3]"]).invalid();
    e("ij,jk", &["f32[2,3]", "i32[3,4]"]).invalid();
    case(Einsum).x("f32[2]").invalid();
}

#[test]
fn det() {
    assert_eq!(case(Det).x("f32[3,3]").ok(), ty("f32[]"));
    assert_eq!(case(Det).x("f64[2,4,4]").ok(), ty("f64[2]"));
    case(Det).x("f32[2,3]").invalid();
    case(Det).x("f32[3]").invalid();
}

// ---------------------------------------------------------------- quantization

#[test]
fn quantization() {
    let q = || case(QuantizeLinear).x("f32[2,3]").x("f32[]");
    assert_eq!(q().x("i8[]").ok(), ty("i8[2,3]"));
    assert_eq!(q().ok(), ty("u8[2,3]"));
    assert_eq!(q().i("output_dtype", 3).ok(), ty("i8[2,3]"));
    assert_eq!(q().i("output_dtype", 17).ok(), ty("f8E4M3FN[2,3]"));
    assert_eq!(q().i("output_dtype", 2).x("u8[]").ok(), ty("u8[2,3]"));
    q().i("output_dtype", 3).x("u8[]").invalid();
    q().i("output_dtype", 1).invalid();
    q().x("f32[]").invalid();
    assert_eq!(case(QuantizeLinear).x("f32[2,3]").x("f32[3]").x("i8[3]").ok(), ty("i8[2,3]"));
    assert_eq!(case(QuantizeLinear).i("axis", 0).x("f32[2,3]").x("f32[2]").ok(), ty("u8[2,3]"));
    case(QuantizeLinear).x("f32[2,3]").x("f32[2]").invalid();
    case(QuantizeLinear).x("f32[2,3]").x("f32[3]").x("i8[]").invalid();
    // Blocked: x [4, 6], axis 1, block 4 → scale [4, ceil(6/4)] = [4, 2].
    assert_eq!(case(QuantizeLinear).i("block_size", 4).x("f32[4,6]").x("f32[4,2]").x("i4[4,2]").ok(), ty("i4[4,6]"));
    case(QuantizeLinear).i("block_size", 4).x("f32[4,6]").x("f32[4,3]").invalid();
    case(QuantizeLinear).x("i8[2]").x("f32[]").invalid();
    // A one-element scale may come with a zero point of shape [1].
    assert_eq!(case(QuantizeLinear).x("f32[2]").x("f32[]").x("f8E5M2[1]").ok(), ty("f8E5M2[2]"));
    assert_eq!(case(DequantizeLinear).x("u4[2]").x("f32[]").x("u4[1]").ok(), ty("f32[2]"));

    assert_eq!(case(DequantizeLinear).x("i8[2,3]").x("f16[]").ok(), ty("f16[2,3]"));
    assert_eq!(case(DequantizeLinear).x("u8[2,3]").x("f32[3]").x("u8[3]").ok(), ty("f32[2,3]"));
    assert_eq!(case(DequantizeLinear).x("i32[4]").x("f32[]").ok(), ty("f32[4]"));
    assert_eq!(case(DequantizeLinear).x("f8E5M2[4]").x("f32[]").ok(), ty("f32[4]"));
    case(DequantizeLinear).x("i8[2,3]").x("f32[]").x("u8[]").invalid();
    case(DequantizeLinear).x("f32[2,3]").x("f32[]").invalid();
    case(DequantizeLinear).x("i8[2,3]").x("i32[]").invalid();

    assert_eq!(case(DynamicQuantizeLinear).x("f32[2,3]").oks(3), tys(&["u8[2,3]", "f32[]", "u8[]"]));
    case(DynamicQuantizeLinear).x("f32[2,3]").invalid_n(4);
}

// ---------------------------------------------------------------- robustness

#[test]
fn never_panics() {
    let extremes = [i64::MIN, -9, -1, 0, 1, 2, 3, i64::MAX, 1 << 40];
    let mut operands: Vec<Option<(TensorType, Option<Tensor>)>> = vec![None];
    for s in ["f32[]", "f32[2,3]", "f32[1,1,3,3]", "u8[1,2,4,4]", "i64[3]", "bool[2]", "f32[0]", "i32[2,1,3]"] {
        operands.push(Some((ty(s), None)));
    }
    for v in [&extremes[..], &[0, 0][..], &[-1][..], &[][..], &[2, 2, 2, 2][..]] {
        let t = ci64(v);
        operands.push(Some((t.ty().clone(), Some(t))));
    }
    for t in [
        Tensor::scalar(i64::MAX),
        Tensor::scalar(-1i64),
        Tensor::scalar(f32::NAN),
        Tensor::scalar(1e30f32),
        cf32(&[0.0, -1.0, f32::INFINITY, 2.0]),
    ] {
        operands.push(Some((t.ty().clone(), Some(t))));
    }
    let attr_sets: Vec<Attrs> = {
        let mut v = vec![Attrs::new()];
        for &x in &extremes {
            v.push(
                Attrs::new()
                    .with("axis", Attr::Int(x))
                    .with("num_outputs", Attr::Int(x))
                    .with("to", Attr::Int(x))
                    .with("blocksize", Attr::Int(x))
                    .with("group", Attr::Int(x))
                    .with("hidden_size", Attr::Int(x))
                    .with("batch_dims", Attr::Int(x))
                    .with("block_size", Attr::Int(x))
                    .with("size", Attr::Int(x))
                    .with("num_groups", Attr::Int(x))
                    .with("start", Attr::Int(x))
                    .with("end", Attr::Int(x)),
            );
            v.push(
                Attrs::new()
                    .with("kernel_shape", Attr::Ints(vec![x, x]))
                    .with("strides", Attr::Ints(vec![x, 1]))
                    .with("pads", Attr::Ints(vec![x, x, 0, x]))
                    .with("dilations", Attr::Ints(vec![1, x]))
                    .with("perm", Attr::Ints(vec![x, 0, 1]))
                    .with("axes", Attr::Ints(vec![x]))
                    .with("output_shape", Attr::Ints(vec![x, x]))
                    .with("output_padding", Attr::Ints(vec![x, x]))
                    .with("equation", Attr::String("i...j,jk->...".into())),
            );
        }
        v.push(Attrs::new().with("axis", Attr::Float(1.0)).with("equation", Attr::Int(3)));
        v
    };
    let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
    for &kind in OpKind::ALL {
        for _ in 0..1000 {
            let n_in = (rng.next() % 10) as usize;
            let inputs: Vec<Option<(TensorType, Option<Tensor>)>> =
                (0..n_in).map(|_| rng.pick(&operands).clone()).collect();
            let Ok(op) = Op::parse(kind, rng.pick(&attr_sets)) else { continue };
            let n_out = (rng.next() % 5) as usize;
            let ins: Vec<Option<InferInput>> =
                inputs.iter().map(|o| o.as_ref().map(|(t, v)| InferInput { ty: t, value: v.as_ref() })).collect();
            if let Ok(v) = infer(&op, &ins, n_out) {
                assert_eq!(v.len(), n_out, "{kind}");
            }
        }
    }
}

#[test]
fn never_panics_near_valid_nodes() {
    // Start from a valid node of each op and replace one operand, or set one attribute,
    // to something hostile: extreme constants, empty and odd shapes, wrong dtypes.
    let ext = [i64::MIN, i64::MIN + 1, -(1 << 40), -2, -1, 0, 1, 2, 1 << 40, i64::MAX - 1, i64::MAX];
    let mut pool: Vec<Option<(TensorType, Option<Tensor>)>> = vec![None];
    for s in ["f32[]", "f32[0]", "f32[1,0,3]", "f32[2,3]", "i64[4]", "bool[1]", "u8[1,2,4,4]", "f16[1,2,4,4]"] {
        pool.push(Some((ty(s), None)));
    }
    let mut consts = vec![Tensor::scalar(f32::NAN), Tensor::scalar(f32::NEG_INFINITY), Tensor::scalar(-0.0f32)];
    for &a in &ext {
        consts.push(Tensor::scalar(a));
        consts.push(ci64(&[a]));
        consts.push(ci64(&[a, 1]));
        consts.push(ci64(&[1, a, 2, 2]));
        consts.push(ci64(&[a, a, a, a, a, a, a, a]));
        consts.push(ci32(&[a as i32, 1]));
        consts.push(cf32(&[a as f32, 1.0, 2.0, 2.0]));
    }
    consts.push(ci64(&[]));
    consts.push(ci64(&[1; 9]));
    for t in consts {
        pool.push(Some((t.ty().clone(), Some(t))));
    }
    let int_attrs = [
        "axis",
        "keepdims",
        "num_outputs",
        "to",
        "group",
        "blocksize",
        "batch_dims",
        "hidden_size",
        "block_size",
        "output_dtype",
        "stash_type",
        "dtype",
        "num_groups",
        "size",
        "layout",
        "transA",
        "start",
        "end",
        "allowzero",
        "ceil_mode",
        "noop_with_empty_axes",
        "fmod",
        "p",
        "k",
    ];
    let ints_attrs = ["kernel_shape", "strides", "pads", "dilations", "perm", "axes", "output_shape", "output_padding"];
    for &kind in OpKind::ALL {
        let base = sample(kind);
        let check = |c: &Case| {
            for n in 0..4 {
                if let Ok(v) = c.run(n) {
                    assert_eq!(v.len(), n, "{kind}");
                }
            }
        };
        for j in 0..=base.inputs.len() {
            for o in &pool {
                let mut c = Case { kind: base.kind, attrs: base.attrs.clone(), inputs: base.inputs.clone() };
                if j < c.inputs.len() {
                    c.inputs[j] = o.clone();
                } else {
                    c.inputs.push(o.clone());
                }
                check(&c);
            }
        }
        for name in int_attrs {
            for &a in &ext {
                check(&Case { kind: base.kind, attrs: base.attrs.clone(), inputs: base.inputs.clone() }.i(name, a));
            }
        }
        for name in ints_attrs {
            for &a in &ext {
                for v in [vec![a], vec![a, a], vec![1, a], vec![a, 1, 1, a], vec![a; 9]] {
                    check(
                        &Case { kind: base.kind, attrs: base.attrs.clone(), inputs: base.inputs.clone() }.is(name, &v),
                    );
                }
            }
        }
    }
}

#[test]
fn every_op_infers_something() {
    // One valid application of every op, so that adding an OpKind without a rule shows up.
    for &kind in OpKind::ALL {
        let c = sample(kind);
        assert!(c.run(1).is_ok(), "{kind}: {:?}", c.run(1));
    }
}

/// One valid node of each op.
fn sample(kind: OpKind) -> Case {
    let c = case(kind);
    let f = "f32[1,2,4,4]";
    match kind {
        If => {
            // Branches that return the one captured value.
            let mut g = kiln_ir::Graph::new("branch");
            let x = g.add_input("x", ty("f32[2]"));
            g.outputs.push(x);
            c.attr("then_branch", Attr::Graph(Box::new(g.clone())))
                .attr("else_branch", Attr::Graph(Box::new(g)))
                .x("bool[]")
                .x("f32[2]")
        }
        Not => c.x("bool[2]"),
        And | Or | Xor => c.x("bool[2]").x("bool[2]"),
        BitwiseNot => c.x("i32[2]"),
        BitwiseAnd | BitwiseOr | BitwiseXor => c.x("i32[2]").x("i32[2]"),
        BitShift => c.s("direction", "LEFT").x("u8[2]").x("u8[2]"),
        Add | Sub | Mul | Div | Pow | Equal | Greater | GreaterOrEqual | Less | LessOrEqual | PRelu | Max | Min
        | Mean | Sum => c.x("f32[2]").x("f32[2]"),
        Mod => c.x("i32[2]").x("i32[2]"),
        Where => c.x("bool[2]").x("f32[2]").x("f32[2]"),
        Cast => c.i("to", 1).x(f),
        CastLike => c.x(f).x("f16[]"),
        LRN => c.i("size", 3).x(f),
        Concat => c.i("axis", 0).x(f).x(f),
        ArgMax | ArgMin | ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMax | ReduceMean | ReduceMin
        | ReduceProd | ReduceSum | ReduceSumSquare => c.x(f),
        Reshape | Expand => c.x(f).c(ci64(&[1, 2, 4, 4])),
        Tile => c.x(f).c(ci64(&[1, 1, 1, 1])),
        Slice => c.x(f).c(ci64(&[0])).c(ci64(&[1])),
        Pad => c.x(f).c(ci64(&[0, 0, 1, 1, 0, 0, 1, 1])),
        Squeeze => c.x(f),
        Unsqueeze => c.x(f).c(ci64(&[0])),
        Split => c.x(f),
        Gather | GatherElements => c.x("f32[3]").c(ci64(&[0])),
        GatherND => c.x("f32[3]").x("i64[2,1]"),
        ScatterElements => c.x("f32[3]").x("i64[1]").x("f32[1]"),
        ScatterND => c.x("f32[3]").x("i64[1,1]").x("f32[1]"),
        DepthToSpace => c.i("blocksize", 1).x(f),
        SpaceToDepth => c.i("blocksize", 2).x(f),
        ConstantOfShape => c.c(ci64(&[2])),
        EyeLike => c.x("f32[2,2]"),
        OneHot => c.x("i64[2]").c(Tensor::scalar(3i64)).x("f32[2]"),
        Range => c.c(Tensor::scalar(0i64)).c(Tensor::scalar(3i64)).c(Tensor::scalar(1i64)),
        Trilu => c.x("f32[2,2]"),
        ReverseSequence => c.x("f32[2,3]").x("i64[3]"),
        Resize => c.x(f).none().c(cf32(&[1.0, 1.0, 2.0, 2.0])),
        CumSum => c.x(f).c(Tensor::scalar(0i64)),
        TopK => c.x(f).c(ci64(&[1])),
        NonZero | Unique => c.x(f),
        Compress => c.x(f).x("bool[2]"),
        NonMaxSuppression => c.x("f32[1,3,4]").x("f32[1,2,3]").x("i64[1]"),
        Conv => c.x(f).x("f32[3,2,3,3]"),
        ConvTranspose => c.x(f).x("f32[2,3,3,3]"),
        ConvInteger => c.x("u8[1,2,4,4]").x("u8[3,2,3,3]"),
        QLinearConv => {
            c.x("u8[1,2,4,4]").x("f32[]").x("u8[]").x("u8[3,2,3,3]").x("f32[]").x("u8[]").x("f32[]").x("u8[]")
        }
        AveragePool | MaxPool | LpPool => c.is("kernel_shape", &[2, 2]).x(f),
        BatchNormalization => c.x(f).x("f32[2]").x("f32[2]").x("f32[2]").x("f32[2]"),
        InstanceNormalization => c.x(f).x("f32[2]").x("f32[2]"),
        GroupNormalization => c.i("num_groups", 2).x(f).x("f32[2]").x("f32[2]"),
        LayerNormalization => c.x(f).x("f32[4]"),
        RMSNormalization => c.x(f).x("f32[4]"),
        Attention => c.x("f32[1,2,3,4]").x("f32[1,2,5,4]").x("f32[1,2,5,4]"),
        RotaryEmbedding => c.x("f32[1,2,3,4]").x("f32[1,3,2]").x("f32[1,3,2]"),
        RNN => c.x("f32[5,2,3]").x("f32[1,4,3]").x("f32[1,4,4]"),
        GRU => c.x("f32[5,2,3]").x("f32[1,12,3]").x("f32[1,12,4]"),
        LSTM => c.x("f32[5,2,3]").x("f32[1,16,3]").x("f32[1,16,4]"),
        Gemm => c.x("f32[2,3]").x("f32[3,4]"),
        MatMul => c.x("f32[2,3]").x("f32[3,4]"),
        MatMulInteger => c.x("u8[2,3]").x("u8[3,4]"),
        QLinearMatMul => c.x("u8[2,3]").x("f32[]").x("u8[]").x("u8[3,4]").x("f32[]").x("u8[]").x("f32[]").x("u8[]"),
        Einsum => c.s("equation", "ij,jk").x("f32[2,3]").x("f32[3,4]"),
        Det => c.x("f32[2,2]"),
        QuantizeLinear => c.x(f).x("f32[]"),
        DequantizeLinear => c.x("u8[2]").x("f32[]"),
        GridSample => c.x(f).x("f32[1,3,5,2]"),
        Col2Im => c.x("f32[1,4,9]").c(ci64(&[4, 4])).c(ci64(&[2, 2])),
        RoiAlign => c.x(f).x("f32[3,4]").x("i64[3]"),
        DeformConv => c.x(f).x("f32[3,2,2,2]").x("f32[1,8,3,3]"),
        _ => c.x(f),
    }
}
