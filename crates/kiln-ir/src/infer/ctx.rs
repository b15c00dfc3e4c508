//! The per-call context of shape inference: operand access, attribute access,
//! constant operands, broadcasting and axis helpers, all returning errors that
//! start with the op name.

use super::{InferError, InferInput};
use crate::attrs::OpAttrsOf;
use crate::dtype::DType;
use crate::op::{AttrError, Op};
use crate::shape::{Shape, ShapeError, TensorType};
use crate::tensor::Tensor;
use core::fmt::{self, Display};
use kiln_module::show::write_joined;

/// Result of an inference step.
pub(super) type R<T> = Result<T, InferError>;

/// What to tell a user whose model computes a shape operand at run time.
pub(super) const SHAPE_HINT: &str = "bind input shapes with --input-shape";

/// A set of dtypes an operand may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Class {
    /// Every dtype.
    Any,
    /// Floating-point types (including the low-precision ones).
    Float,
    /// Floats and integers (not bool).
    Numeric,
    /// Floats and signed integers.
    SignedOrFloat,
    /// Integers, signed or unsigned.
    Int,
    /// Unsigned integers.
    Unsigned,
    /// `bool`.
    Bool,
    /// Floats, integers and bool.
    NumericOrBool,
    /// `i32` or `i64` (index operands).
    Index,
    /// `i8` or `u8` (8-bit quantized data).
    Quant8,
}

impl Class {
    /// Whether `d` belongs to the class.
    pub fn allows(self, d: DType) -> bool {
        match self {
            Class::Any => true,
            Class::Float => d.is_float(),
            Class::Numeric => d.is_float() || d.is_int(),
            Class::SignedOrFloat => d.is_float() || d.is_signed_int(),
            Class::Int => d.is_int(),
            Class::Unsigned => d.is_unsigned_int(),
            Class::Bool => d == DType::Bool,
            Class::NumericOrBool => d.is_float() || d.is_int() || d == DType::Bool,
            Class::Index => matches!(d, DType::I32 | DType::I64),
            Class::Quant8 => matches!(d, DType::I8 | DType::U8),
        }
    }

    /// "a float tensor" and so on.
    pub fn describe(self) -> &'static str {
        match self {
            Class::Any => "a tensor",
            Class::Float => "a float tensor",
            Class::Numeric => "a numeric tensor",
            Class::SignedOrFloat => "a float or signed integer tensor",
            Class::Int => "an integer tensor",
            Class::Unsigned => "an unsigned integer tensor",
            Class::Bool => "a bool tensor",
            Class::NumericOrBool => "a numeric or bool tensor",
            Class::Index => "an int32 or int64 tensor",
            Class::Quant8 => "an int8 or uint8 tensor",
        }
    }
}

/// `[2,3]`.
pub(super) struct Dims<'a>(pub &'a [usize]);

impl Display for Dims<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        write_joined(f, self.0, ",")?;
        f.write_str("]")
    }
}

/// `[2,-1]`; long lists are cut after 16 entries.
pub(super) struct Ints<'a>(pub &'a [i64]);

impl Display for Ints<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 16;
        f.write_str("[")?;
        write_joined(f, self.0.iter().take(SHOWN), ",")?;
        if self.0.len() > SHOWN {
            write!(f, ",… ({} entries)", self.0.len())?;
        }
        f.write_str("]")
    }
}

/// Numpy broadcasting of two dimension lists; `None` when they do not broadcast.
pub(super) fn broadcast_dims(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        // Right-aligned: position i of the result is position i - (n - len) of each operand.
        let da = (i + a.len()).checked_sub(n).map_or(1, |j| a[j]);
        let db = (i + b.len()).checked_sub(n).map_or(1, |j| b[j]);
        *o = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return None;
        };
    }
    Some(out)
}

/// The inference context of one call.
pub(super) struct Ctx<'a, 'b> {
    /// The op.
    pub op: &'a Op,
    inputs: &'a [Option<InferInput<'b>>],
    /// How many results the node lists.
    pub num_outputs: usize,
}

impl<'a, 'b> Ctx<'a, 'b> {
    /// A context.
    pub fn new(op: &'a Op, inputs: &'a [Option<InferInput<'b>>], num_outputs: usize) -> Self {
        Ctx { op, inputs, num_outputs }
    }

    /// The op's name.
    pub fn name(&self) -> &'static str {
        self.op.kind.name()
    }

    /// An [`InferError::Invalid`] prefixed with the op name.
    pub fn invalid(&self, msg: impl Display) -> InferError {
        InferError::Invalid(format!("{}: {msg}", self.name()))
    }

    /// An [`InferError::Unsupported`] prefixed with the op name.
    pub fn unsupported(&self, msg: impl Display) -> InferError {
        InferError::Unsupported(format!("{}: {msg}", self.name()))
    }

    fn attr_err(&self, e: AttrError) -> InferError {
        match e {
            AttrError::Unsupported { .. } => self.unsupported(e),
            e => self.invalid(e),
        }
    }

    // ---- operands ----

    /// Number of operand slots the node lists.
    pub fn num_inputs(&self) -> usize {
        self.inputs.len()
    }

    /// Rejects more than `max` operand slots.
    pub fn max_inputs(&self, max: usize) -> R<()> {
        if self.inputs.len() > max {
            let s = if max == 1 { "" } else { "s" };
            return Err(self.invalid(format_args!("takes at most {max} operand{s}, got {}", self.inputs.len())));
        }
        Ok(())
    }

    /// Operand `i`, if present.
    pub fn opt(&self, i: usize) -> Option<InferInput<'b>> {
        self.inputs.get(i).copied().flatten()
    }

    /// The type of operand `i`, if present.
    pub fn opt_ty(&self, i: usize) -> Option<&'b TensorType> {
        self.opt(i).map(|x| x.ty)
    }

    /// The type of required operand `i` (`what` is its ONNX name).
    pub fn req(&self, i: usize, what: &str) -> R<&'b TensorType> {
        self.opt_ty(i).ok_or_else(|| self.invalid(format_args!("operand `{what}` (input {i}) is required")))
    }

    /// The type of required operand `i`, checked against a dtype class.
    pub fn req_class(&self, i: usize, what: &str, class: Class) -> R<&'b TensorType> {
        let t = self.req(i, what)?;
        self.check_class(t, i, what, class)?;
        Ok(t)
    }

    /// The type of optional operand `i`, checked against a dtype class when present.
    pub fn opt_class(&self, i: usize, what: &str, class: Class) -> R<Option<&'b TensorType>> {
        match self.opt_ty(i) {
            Some(t) => {
                self.check_class(t, i, what, class)?;
                Ok(Some(t))
            }
            None => Ok(None),
        }
    }

    /// Checks operand `i`'s dtype class.
    pub fn check_class(&self, t: &TensorType, i: usize, what: &str, class: Class) -> R<()> {
        if class.allows(t.dtype) {
            Ok(())
        } else {
            Err(self.invalid(format_args!("`{what}` (input {i}) must be {}, got {t}", class.describe())))
        }
    }

    /// Required operand `i`, of the dtype of operand `of`.
    pub fn req_same(&self, i: usize, what: &str, of: &TensorType) -> R<&'b TensorType> {
        let t = self.req(i, what)?;
        self.same_dtype(t, i, what, of)?;
        Ok(t)
    }

    /// Checks that operand `i` has `dtype` (the dtype of operand `of`).
    pub fn same_dtype(&self, t: &TensorType, i: usize, what: &str, of: &TensorType) -> R<()> {
        if t.dtype == of.dtype {
            Ok(())
        } else {
            Err(self.invalid(format_args!("`{what}` (input {i}) must have dtype {}, got {t}", of.dtype)))
        }
    }

    /// Checks that operand `i` has exactly the dimensions `dims`.
    pub fn expect_dims(&self, t: &TensorType, i: usize, what: &str, dims: &[usize]) -> R<()> {
        if t.shape.dims() == dims {
            Ok(())
        } else {
            Err(self.invalid(format_args!("`{what}` (input {i}) must have shape {}, got {t}", Dims(dims))))
        }
    }

    /// Checks that operand `i` holds one element (rank 0, or rank 1 of extent 1).
    pub fn expect_scalar(&self, t: &TensorType, i: usize, what: &str) -> R<()> {
        let d = t.shape.dims();
        if d.is_empty() || d == [1] {
            Ok(())
        } else {
            Err(self.invalid(format_args!("`{what}` (input {i}) must be a scalar, got {t}")))
        }
    }

    /// Checks a rank bound.
    pub fn min_rank(&self, t: &TensorType, i: usize, what: &str, min: usize) -> R<()> {
        if t.shape.rank() >= min {
            Ok(())
        } else {
            Err(self.invalid(format_args!("`{what}` (input {i}) must have rank ≥ {min}, got {t}")))
        }
    }

    /// Checks an exact rank.
    pub fn rank(&self, t: &TensorType, i: usize, what: &str, rank: usize) -> R<()> {
        if t.shape.rank() == rank {
            Ok(())
        } else {
            Err(self.invalid(format_args!("`{what}` (input {i}) must have rank {rank}, got {t}")))
        }
    }

    // ---- constant operands ----

    /// The contents of operand `i`: `None` when absent, [`InferError::Unsupported`]
    /// when present but not a constant.
    pub fn constant(&self, i: usize, what: &str) -> R<Option<&'b Tensor>> {
        match self.opt(i) {
            None => Ok(None),
            Some(InferInput { value: Some(v), .. }) => Ok(Some(v)),
            Some(_) => Err(self.unsupported(format_args!("`{what}` (input {i}) must be a constant; {SHAPE_HINT}"))),
        }
    }

    /// The contents of a 1-D int32/int64 operand `i` (`None` when absent). An
    /// operand with no elements needs no contents.
    pub fn int_list(&self, i: usize, what: &str) -> R<Option<Vec<i64>>> {
        self.int_list_ranked(i, what, false)
    }

    /// Like [`Ctx::int_list`], also accepting a scalar as a list of one (axes
    /// operands, where ONNX Runtime accepts a scalar too).
    pub fn axes_list(&self, i: usize, what: &str) -> R<Option<Vec<i64>>> {
        self.int_list_ranked(i, what, true)
    }

    fn int_list_ranked(&self, i: usize, what: &str, scalar_ok: bool) -> R<Option<Vec<i64>>> {
        let Some(t) = self.opt_ty(i) else { return Ok(None) };
        self.check_class(t, i, what, Class::Index)?;
        if !(scalar_ok && t.shape.rank() == 0) {
            self.rank(t, i, what, 1)?;
        }
        if t.shape.numel() == 0 {
            return Ok(Some(Vec::new()));
        }
        let Some(v) = self.constant(i, what)? else { return Ok(None) };
        self.tensor_ints(v, i, what).map(Some)
    }

    /// The contents of a one-element int32/int64 operand `i` (`None` when absent).
    pub fn int_scalar(&self, i: usize, what: &str) -> R<Option<i64>> {
        let Some(t) = self.opt_ty(i) else { return Ok(None) };
        self.check_class(t, i, what, Class::Index)?;
        self.expect_scalar(t, i, what)?;
        let Some(v) = self.constant(i, what)? else { return Ok(None) };
        let v = self.tensor_ints(v, i, what)?;
        match v.as_slice() {
            [x] => Ok(Some(*x)),
            _ => Err(self.invalid(format_args!("`{what}` (input {i}) must hold one element"))),
        }
    }

    /// The value of one-element int64 operand `i` when it is a constant; `None` when
    /// it is computed at run time or absent.
    pub fn int_if_constant(&self, i: usize, what: &str) -> R<Option<i64>> {
        let Some(inp) = self.opt(i) else { return Ok(None) };
        if inp.ty.dtype != DType::I64 || inp.ty.shape.numel() != 1 {
            return Err(self.invalid(format_args!("`{what}` (input {i}) must be one int64, got {}", inp.ty)));
        }
        match inp.value {
            Some(v) => Ok(self.tensor_ints(v, i, what)?.first().copied()),
            None => Ok(None),
        }
    }

    fn tensor_ints(&self, v: &Tensor, i: usize, what: &str) -> R<Vec<i64>> {
        v.to_i64_vec()
            .map_err(|_| self.invalid(format_args!("`{what}` (input {i}) must be an integer tensor, got {}", v.ty())))
    }

    // ---- attributes ----

    /// The op's attributes as struct `T` (parsed and validated when the op was built).
    pub fn attrs<T: OpAttrsOf>(&self) -> R<&'a T> {
        self.op.attrs_of::<T>().map_err(|e| self.attr_err(e))
    }

    // ---- shapes, axes ----

    /// A shape from dimensions; too many elements is invalid, too high a rank unsupported.
    pub fn shape(&self, dims: Vec<usize>) -> R<Shape> {
        Shape::new(dims).map_err(|e| match e {
            ShapeError::RankTooHigh(_) => self.unsupported(format_args!("result {e}")),
            ShapeError::TooLarge(d) => self.invalid(format_args!("result shape {} has too many elements", Dims(&d))),
        })
    }

    /// A tensor type from a dtype and dimensions.
    pub fn tt(&self, dtype: DType, dims: Vec<usize>) -> R<TensorType> {
        Ok(TensorType::new(dtype, self.shape(dims)?))
    }

    /// Keeps the first `num_outputs` of `outs`; asking for more is invalid.
    pub fn outputs(&self, mut outs: Vec<TensorType>) -> R<Vec<TensorType>> {
        if self.num_outputs > outs.len() {
            let s = if outs.len() == 1 { "" } else { "s" };
            return Err(self.invalid(format_args!(
                "the node lists {} results, but the op has {} result{s} here",
                self.num_outputs,
                outs.len()
            )));
        }
        outs.truncate(self.num_outputs);
        Ok(outs)
    }

    /// An axis in `[-rank, rank-1]`, normalized to `[0, rank-1]`.
    pub fn axis(&self, a: i64, rank: usize, what: &str) -> R<usize> {
        let r = rank as i64;
        if a < -r || a >= r {
            return Err(self.invalid(format_args!(
                "{what} {a} is out of range for rank {rank} (valid: {} to {})",
                -r,
                r - 1
            )));
        }
        Ok(if a < 0 { (a + r) as usize } else { a as usize })
    }

    /// A list of distinct axes, each in `[-rank, rank-1]`, normalized.
    pub fn axes(&self, v: &[i64], rank: usize, what: &str) -> R<Vec<usize>> {
        let mut out = Vec::with_capacity(v.len());
        for &a in v {
            let n = self.axis(a, rank, what)?;
            if out.contains(&n) {
                return Err(self.invalid(format_args!("{what} {n} appears more than once in {}", Ints(v))));
            }
            out.push(n);
        }
        Ok(out)
    }

    /// A non-negative extent from an i64.
    pub fn extent(&self, v: i64, what: &str) -> R<usize> {
        usize::try_from(v).map_err(|_| self.invalid(format_args!("{what} must be ≥ 0, got {v}")))
    }

    /// The attribute `what` as a count that must be at least 1 (a group, a block size, a number of outputs).
    pub fn count_attr(&self, v: i64, what: &str) -> R<usize> {
        usize::try_from(v)
            .ok()
            .filter(|&n| n >= 1)
            .ok_or_else(|| self.invalid(format_args!("attribute `{what}` must be ≥ 1, got {v}")))
    }

    /// Numpy broadcasting of all `tys`' shapes.
    pub fn broadcast(&self, tys: &[&TensorType]) -> R<Vec<usize>> {
        let Some((first, rest)) = tys.split_first() else { return Ok(Vec::new()) };
        let mut acc = first.shape.dims().to_vec();
        for &t in rest {
            acc = broadcast_dims(&acc, t.shape.dims()).ok_or_else(|| {
                // The left side is the broadcast of the operands so far (the first
                // operand when there are two), shown with the first operand's dtype.
                let left = Shape::new(acc.clone())
                    .map(|s| TensorType::new(first.dtype, s).to_string())
                    .unwrap_or_else(|_| format!("{}{}", first.dtype, Dims(&acc)));
                self.invalid(format_args!("cannot broadcast {left} with {t}"))
            })?;
        }
        Ok(acc)
    }
}
