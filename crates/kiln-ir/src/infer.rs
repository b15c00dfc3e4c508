//! Result types of every operator (shape inference).
//!
//! [`infer`] returns the types of a node's first `num_outputs` results from its
//! operands' types and, where the op needs them (Reshape's `shape`, Slice's
//! `starts`, …), the operands' constant contents. Semantics are those of the ONNX
//! operator of the same name at opset 22 (see [`crate::op`]).
//!
//! Errors separate a wrong model ([`InferError::Invalid`]: mismatched extents,
//! axes out of range, wrong dtypes, wrong operand counts) from a valid model kiln
//! cannot give static types to ([`InferError::Unsupported`]: for example a
//! Reshape whose `shape` is computed at run time). Every message starts with the
//! op name. No input, however malformed, makes [`infer`] panic: constant operands
//! are read with checked arithmetic and result shapes go through [`Shape::new`].
//!
//! The rules live in one submodule per family:
//! - `elementwise`: unary, binary and variadic maps, comparisons, Where, Clip,
//!   Cast, the Softmax family and other shape-preserving ops;
//! - `movement`: reshapes, slicing, padding, gathers and scatters, concatenation,
//!   Shape/Size, ConstantOfShape, Range, OneHot, Resize, …;
//! - `reduce`: reductions, ArgMax/ArgMin, CumSum, TopK;
//! - `dynamic`: results whose extent depends on the data (NonZero, Compress, Unique,
//!   NonMaxSuppression, TopK with a run-time K): typed by their bound;
//! - `nn`: convolutions, pools, normalizations and the recurrent ops;
//! - `linalg`: Gemm, MatMul, Einsum, Det;
//! - `quant`: the quantization ops.
//!
//! [`Shape::new`]: crate::shape::Shape::new

mod ctx;
mod dynamic;
mod elementwise;
mod linalg;
mod movement;
pub use movement::{col2im_geometry, deform_conv_geometry, Col2ImGeometry, DeformConvGeometry};
mod nn;
mod quant;
mod reduce;

use crate::op::{Op, OpKind};
use crate::shape::TensorType;
use crate::tensor::Tensor;
use ctx::{Class, Ctx};

/// One operand as shape inference sees it.
#[derive(Clone, Copy, Debug)]
pub struct InferInput<'a> {
    /// The operand's type.
    pub ty: &'a TensorType,
    /// Its contents, when it is a constant.
    pub value: Option<&'a Tensor>,
}

/// Why result types could not be inferred.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InferError {
    /// The operands or attributes are invalid for the op (the model is wrong).
    #[error("{0}")]
    Invalid(String),
    /// Valid ONNX, but a form kiln does not support (for example a shape that depends
    /// on run-time data); the message says what would be needed.
    #[error("unsupported: {0}")]
    Unsupported(String),
}

impl InferError {
    /// The error of an op of kind `kind` whose attributes did not parse, in the form
    /// inference gives its own errors (prefixed with the op name).
    pub fn attr(kind: crate::op::OpKind, e: crate::op::AttrError) -> InferError {
        match e {
            crate::op::AttrError::Unsupported { .. } => InferError::Unsupported(format!("{kind}: {e}")),
            e => InferError::Invalid(format!("{kind}: {e}")),
        }
    }
}

/// Result types of `op` applied to `inputs` (`None` = absent optional input).
///
/// Returns exactly `num_outputs` types: the node's first `num_outputs` results.
/// Asking for more results than the op has is an error.
pub fn infer(op: &Op, inputs: &[Option<InferInput<'_>>], num_outputs: usize) -> Result<Vec<TensorType>, InferError> {
    let cx = Ctx::new(op, inputs, num_outputs);
    let outs = results(&cx)?;
    cx.outputs(outs)
}

/// Every result type of the op (the caller keeps the first `num_outputs`).
fn results(cx: &Ctx<'_, '_>) -> Result<Vec<TensorType>, InferError> {
    use elementwise as ew;
    use OpKind::*;
    match cx.op.kind {
        // Shape-preserving maps of one operand.
        Identity => ew::unary(cx, Class::Any),
        Abs | Sign | Erf | Shrink => ew::unary(cx, Class::Numeric),
        Neg | Relu => ew::unary(cx, Class::SignedOrFloat),
        Acos | Acosh | Asin | Asinh | Atan | Atanh | Cos | Cosh | Sin | Sinh | Tan | Tanh | Ceil | Floor | Round
        | Celu | Elu | Exp | Log | HardSigmoid | HardSwish | LeakyRelu | Mish | Reciprocal | Selu | Sigmoid
        | Softplus | Softsign | Sqrt | ThresholdedRelu => ew::unary(cx, Class::Float),
        BitwiseNot => ew::unary(cx, Class::Int),
        Not => ew::unary(cx, Class::Bool),
        Gelu => ew::gelu(cx),
        IsNaN | IsInf => ew::is_class(cx),
        Softmax | LogSoftmax | Hardmax => ew::softmax(cx),
        LRN => ew::lrn(cx),
        LpNormalization => ew::lp_normalization(cx),
        MeanVarianceNormalization => ew::mean_variance_normalization(cx),
        Dropout => ew::dropout(cx),
        Clip => ew::clip(cx),
        Cast => ew::cast(cx),
        CastLike => ew::cast_like(cx),

        // Broadcasting maps of two or more operands.
        Add | Sub | Mul | Div => ew::binary(cx, Class::Numeric, None),
        BitwiseAnd | BitwiseOr | BitwiseXor => ew::binary(cx, Class::Int, None),
        And | Or | Xor => ew::binary(cx, Class::Bool, None),
        Equal => ew::binary(cx, Class::NumericOrBool, Some(crate::DType::Bool)),
        Greater | GreaterOrEqual | Less | LessOrEqual => ew::binary(cx, Class::Numeric, Some(crate::DType::Bool)),
        Mod => ew::modulo(cx),
        BitShift => ew::bit_shift(cx),
        Pow => ew::pow(cx),
        PRelu => ew::prelu(cx),
        Max | Min => ew::variadic(cx, Class::Numeric),
        Mean | Sum => ew::variadic(cx, Class::Float),
        Where => ew::where_(cx),

        // Data movement and shape computations.
        Reshape => movement::reshape(cx),
        Expand => movement::expand(cx),
        Tile => movement::tile(cx),
        Slice => movement::slice(cx),
        Pad => movement::pad(cx),
        Squeeze => movement::squeeze(cx),
        Unsqueeze => movement::unsqueeze(cx),
        Split => movement::split(cx),
        Concat => movement::concat(cx),
        Gather => movement::gather(cx),
        GatherElements => movement::gather_elements(cx),
        GatherND => movement::gather_nd(cx),
        ScatterElements => movement::scatter_elements(cx),
        ScatterND => movement::scatter_nd(cx),
        Transpose => movement::transpose(cx),
        Flatten => movement::flatten(cx),
        DepthToSpace => movement::depth_to_space(cx),
        SpaceToDepth => movement::space_to_depth(cx),
        Shape => movement::shape(cx),
        Size => movement::size(cx),
        ConstantOfShape => movement::constant_of_shape(cx),
        EyeLike => movement::eye_like(cx),
        OneHot => movement::one_hot(cx),
        Range => movement::range(cx),
        Trilu => movement::trilu(cx),
        ReverseSequence => movement::reverse_sequence(cx),
        Resize => movement::resize(cx),
        GridSample => movement::grid_sample(cx),
        Col2Im => movement::col2im(cx),
        RoiAlign => movement::roi_align(cx),
        DeformConv => movement::deform_conv(cx),

        // Reductions and friends.
        ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMean | ReduceProd | ReduceSum
        | ReduceSumSquare => reduce::reduce(cx, Class::Numeric),
        ReduceMax | ReduceMin => reduce::reduce(cx, Class::NumericOrBool),
        ArgMax | ArgMin => reduce::arg_reduce(cx),
        CumSum => reduce::cum_sum(cx),
        TopK if cx.num_outputs == 3 => dynamic::top_k_dynamic(cx),
        TopK => reduce::top_k(cx),

        // Data-dependent result extents (a bound and an extent result).
        NonZero => dynamic::non_zero(cx),
        Compress => dynamic::compress(cx),
        Unique => dynamic::unique(cx),
        NonMaxSuppression => dynamic::non_max_suppression(cx),

        // Neural-network layers.
        Conv => nn::conv(cx),
        ConvInteger => nn::conv_integer(cx),
        QLinearConv => nn::qlinear_conv(cx),
        ConvTranspose => nn::conv_transpose(cx),
        AveragePool | MaxPool | LpPool => nn::pool(cx),
        GlobalAveragePool | GlobalMaxPool | GlobalLpPool => nn::global_pool(cx),
        BatchNormalization => nn::batch_normalization(cx),
        InstanceNormalization => nn::instance_normalization(cx),
        GroupNormalization => nn::group_normalization(cx),
        LayerNormalization => nn::layer_normalization(cx),
        RMSNormalization => nn::rms_normalization(cx),
        Attention => nn::attention(cx),
        RotaryEmbedding => nn::rotary_embedding(cx),
        RNN => nn::recurrent(cx, 1),
        GRU => nn::recurrent(cx, 3),
        LSTM => nn::recurrent(cx, 4),

        // Linear algebra.
        Gemm => linalg::gemm(cx),
        MatMul => linalg::matmul(cx),
        MatMulInteger => linalg::matmul_integer(cx),
        QLinearMatMul => linalg::qlinear_matmul(cx),
        Einsum => linalg::einsum(cx),
        Det => linalg::det(cx),

        // Quantization.
        QuantizeLinear => quant::quantize_linear(cx),
        DequantizeLinear => quant::dequantize_linear(cx),
        DynamicQuantizeLinear => quant::dynamic_quantize_linear(cx),

        // Control flow.
        If => if_(cx),
    }
}

/// `If`: a one-element bool condition, then the values both branches read; the results
/// are the branches' outputs, which must have the same types in both (the plan is
/// static: a result's slot has one size whichever branch runs).
fn if_(cx: &Ctx<'_, '_>) -> Result<Vec<TensorType>, InferError> {
    let a = cx.op.attrs_of::<crate::attrs::IfAttrs>().map_err(|e| InferError::attr(cx.op.kind, e))?;
    let c = cx.req(0, "cond")?;
    if c.dtype != crate::DType::Bool || c.shape.numel() != 1 {
        return Err(cx.invalid(format_args!("the condition must be one bool, it is {c}")));
    }
    let captured = cx.num_inputs() - 1;
    for (name, g) in [("then_branch", &a.then_branch), ("else_branch", &a.else_branch)] {
        if g.inputs.len() != captured {
            return Err(cx.invalid(format_args!("{name} takes {} values, the node passes {captured}", g.inputs.len())));
        }
        for (i, &v) in g.inputs.iter().enumerate() {
            let t = cx.req(i + 1, "captured value")?;
            let want = g.values.get(v).map(|x| &x.ty);
            if want != Some(t) {
                return Err(cx.invalid(format_args!("{name} input {i} does not have the type {t} the node passes")));
            }
        }
        if g.outputs.iter().any(|&o| g.values.get(o).is_none()) {
            return Err(cx.invalid(format_args!("{name} has a dangling output")));
        }
    }
    let (t, e) = (&a.then_branch, &a.else_branch);
    if t.outputs.len() != e.outputs.len() {
        return Err(cx.invalid(format_args!(
            "then_branch has {} outputs, else_branch {}",
            t.outputs.len(),
            e.outputs.len()
        )));
    }
    let mut out = Vec::with_capacity(t.outputs.len());
    for (k, (&x, &y)) in t.outputs.iter().zip(&e.outputs).enumerate() {
        let (tx, ty) = (&t.values[x].ty, &e.values[y].ty);
        if tx != ty {
            return Err(cx.unsupported(format_args!(
                "output {k} is {tx} in then_branch and {ty} in else_branch; kiln needs both branches to give the same type"
            )));
        }
        out.push(tx.clone());
    }
    Ok(out)
}
