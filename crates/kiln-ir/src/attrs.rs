//! Typed operator attributes, parsed and validated once.
//!
//! A front end (the ONNX importer, the IR text parser, later TFLite) turns the
//! attributes of every op into one of the structs here — [`ConvAttrs`],
//! [`ResizeAttrs`], … — held by [`Op`](crate::op::Op) as an [`OpAttrs`]. Shape
//! inference, the reference evaluator, flow lowering and the tensor passes read
//! the fields; none of them looks an attribute up by name.
//!
//! Each struct field carries its ONNX name and default in one place (the
//! `attr_structs!` table below): an absent attribute takes its default, a
//! required one that is absent is an [`AttrError::Missing`], one of the wrong kind
//! is an [`AttrError::WrongKind`], and a value out of range (a flag other than
//! 0/1, a string outside its enum, an unknown dtype code, `group < 1`, …) is an
//! [`AttrError::Invalid`] naming the attribute and the reason. Attributes an op
//! does not define are ignored, as ONNX runtimes do.
//!
//! The string form ([`Attrs`]) stays the interchange format of the front ends and
//! of the text printer: [`OpAttrs::to_attrs`] gives back every attribute the source
//! spelled out (even when it equals the default) plus every field that differs from
//! its default, so print → parse → print is the identity.

use crate::dtype::DType;
use crate::op::{Attr, AttrError, Attrs, OpKind};
use crate::tensor::Tensor;

/// A value an attribute can hold, with its conversion from and to [`Attr`].
pub trait AttrValue: Sized {
    /// Reads attribute `name` from its string-keyed form.
    fn from_attr(name: &str, a: &Attr) -> Result<Self, AttrError>;
    /// The string-keyed form; `None` for an absent optional value.
    fn to_attr(&self) -> Option<Attr>;
}

fn wrong_kind(name: &str, expected: &'static str, a: &Attr) -> AttrError {
    AttrError::WrongKind { name: name.to_string(), expected, found: a.kind_name() }
}

macro_rules! plain_values {
    ($($t:ty, $variant:ident, $kind:literal);* $(;)?) => {$(
        impl AttrValue for $t {
            fn from_attr(name: &str, a: &Attr) -> Result<Self, AttrError> {
                match a {
                    Attr::$variant(v) => Ok(v.clone()),
                    a => Err(wrong_kind(name, $kind, a)),
                }
            }
            fn to_attr(&self) -> Option<Attr> {
                Some(Attr::$variant(self.clone()))
            }
        }
    )*};
}

plain_values! {
    i64, Int, "int";
    f32, Float, "float";
    String, String, "string";
    Vec<i64>, Ints, "ints";
    Vec<f32>, Floats, "floats";
    Vec<String>, Strings, "strings";
    Tensor, Tensor, "tensor";
}

/// A subgraph attribute (the branches of `If`).
impl AttrValue for Box<crate::graph::Graph> {
    fn from_attr(name: &str, a: &Attr) -> Result<Self, AttrError> {
        match a {
            Attr::Graph(g) => Ok(g.clone()),
            a => Err(wrong_kind(name, "graph", a)),
        }
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::Graph(self.clone()))
    }
}

/// A flag: an int attribute that must be 0 or 1.
impl AttrValue for bool {
    fn from_attr(name: &str, a: &Attr) -> Result<Self, AttrError> {
        match i64::from_attr(name, a)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(AttrError::invalid(name, format!("must be 0 or 1, got {v}"))),
        }
    }
    fn to_attr(&self) -> Option<Attr> {
        Some(Attr::Int(*self as i64))
    }
}

/// A dtype: an int attribute holding an ONNX `TensorProto.DataType` code.
impl AttrValue for DType {
    fn from_attr(name: &str, a: &Attr) -> Result<Self, AttrError> {
        let code = i64::from_attr(name, a)?;
        match DType::from_onnx_code(code) {
            Some(d) => Ok(d),
            None if matches!(code, 8 | 14 | 15) => Err(AttrError::Unsupported {
                name: name.to_string(),
                reason: format!("{code} names a string or complex dtype, which kiln does not support"),
            }),
            None => Err(AttrError::invalid(name, format!("{code} is not a dtype code"))),
        }
    }
    fn to_attr(&self) -> Option<Attr> {
        self.onnx_code().map(|c| Attr::Int(i64::from(c)))
    }
}

/// An optional value without a default: absent is `None`.
impl<T: AttrValue> AttrValue for Option<T> {
    fn from_attr(name: &str, a: &Attr) -> Result<Self, AttrError> {
        T::from_attr(name, a).map(Some)
    }
    fn to_attr(&self) -> Option<Attr> {
        self.as_ref().and_then(T::to_attr)
    }
}

/// Defines an enum for a string-valued attribute, with each value's ONNX spelling.
macro_rules! attr_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $spelling:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vdoc])* #[doc = concat!("`", $spelling, "`")] $variant),* }

        impl $name {
            /// Every value.
            pub const ALL: &'static [$name] = &[$($name::$variant),*];

            /// The ONNX spelling.
            pub fn onnx_name(self) -> &'static str {
                match self { $($name::$variant => $spelling),* }
            }

            /// The value of an ONNX spelling.
            pub fn from_onnx_name(s: &str) -> Option<$name> {
                match s { $($spelling => Some($name::$variant),)* _ => None }
            }
        }

        impl AttrValue for $name {
            fn from_attr(name: &str, a: &Attr) -> Result<Self, AttrError> {
                let s = String::from_attr(name, a)?;
                $name::from_onnx_name(&s).ok_or_else(|| {
                    let allowed: Vec<&str> = $name::ALL.iter().map(|v| v.onnx_name()).collect();
                    AttrError::invalid(name, format!("must be one of {}, got \"{s}\"", allowed.join(", ")))
                })
            }
            fn to_attr(&self) -> Option<Attr> {
                Some(Attr::String(self.onnx_name().to_string()))
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.onnx_name())
            }
        }
    };
}

attr_enum! {
    /// `auto_pad` of convolutions and pools.
    AutoPad { NotSet = "NOTSET", SameUpper = "SAME_UPPER", SameLower = "SAME_LOWER", Valid = "VALID" }
}
attr_enum! {
    /// `mode` of Pad.
    PadMode { Constant = "constant", Reflect = "reflect", Edge = "edge", Wrap = "wrap" }
}
attr_enum! {
    /// `mode` of Resize.
    ResizeMode { Nearest = "nearest", Linear = "linear", Cubic = "cubic" }
}
attr_enum! {
    /// `coordinate_transformation_mode` of Resize.
    CoordinateTransformationMode {
        HalfPixel = "half_pixel",
        HalfPixelSymmetric = "half_pixel_symmetric",
        PytorchHalfPixel = "pytorch_half_pixel",
        AlignCorners = "align_corners",
        Asymmetric = "asymmetric",
        TfCropAndResize = "tf_crop_and_resize",
    }
}
attr_enum! {
    /// `nearest_mode` of Resize.
    NearestMode { RoundPreferFloor = "round_prefer_floor", RoundPreferCeil = "round_prefer_ceil", Floor = "floor", Ceil = "ceil" }
}
attr_enum! {
    /// `keep_aspect_ratio_policy` of Resize.
    KeepAspectRatioPolicy { Stretch = "stretch", NotLarger = "not_larger", NotSmaller = "not_smaller" }
}
attr_enum! {
    /// `mode` of DepthToSpace.
    DepthToSpaceMode { Dcr = "DCR", Crd = "CRD" }
}
attr_enum! {
    /// `approximate` of Gelu.
    GeluApproximate { None = "none", Tanh = "tanh" }
}
attr_enum! {
    /// `round_mode` of Cast and CastLike (opset 24): how a value between two powers of two
    /// becomes an `f8E8M0FNU` (see `kiln_ir::lowp::E8M0Rounding`); other targets ignore it.
    E8M0RoundMode { Up = "up", Down = "down", Nearest = "nearest" }
}
attr_enum! {
    /// `direction` of BitShift.
    ShiftDirection { Left = "LEFT", Right = "RIGHT" }
}
attr_enum! {
    /// `direction` of the recurrent ops.
    RnnDirection { Forward = "forward", Reverse = "reverse", Bidirectional = "bidirectional" }
}
attr_enum! {
    /// `mode` of GridSample (opset 16's `bilinear`/`bicubic` are canonicalised at import).
    GridSampleMode { Linear = "linear", Nearest = "nearest", Cubic = "cubic" }
}
attr_enum! {
    /// `padding_mode` of GridSample.
    GridSamplePadding { Zeros = "zeros", Border = "border", Reflection = "reflection" }
}
attr_enum! {
    /// `coordinate_transformation_mode` of RoiAlign.
    RoiAlignCoordinates { HalfPixel = "half_pixel", OutputHalfPixel = "output_half_pixel" }
}
attr_enum! {
    /// `mode` of RoiAlign.
    RoiAlignMode { Avg = "avg", Max = "max" }
}
attr_enum! {
    /// `reduction` of ScatterElements and ScatterND.
    ScatterReduction { None = "none", Add = "add", Mul = "mul", Max = "max", Min = "min" }
}

/// Which attributes of a struct the source spelled out (one bit per field, in
/// declaration order). Printing keeps those even when they equal the default, and
/// equality compares them, so a typed op prints and compares as its source did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Explicit(u32);

impl Explicit {
    fn set(&mut self, bit: u32) {
        self.0 |= 1 << bit;
    }
    fn has(self, bit: u32) -> bool {
        self.0 & (1 << bit) != 0
    }
}

macro_rules! onnx_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $onnx:literal) => {
        $onnx
    };
}

macro_rules! or_default {
    ($name:expr) => {
        return Err(AttrError::Missing($name.to_string()))
    };
    ($name:expr, $default:expr) => {
        $default
    };
}

macro_rules! is_default {
    ($v:expr) => {
        false
    };
    ($v:expr, $default:expr) => {
        $v == $default
    };
}

/// Defines attribute structs. Each field is `rust_name ["onnx_name"]?: Type = default`
/// (no `= default`: required). `defaults` structs (no required field) implement
/// `Default`. An optional `check` names a function run after parsing.
macro_rules! attr_structs {
    ($(
        $(#[$doc:meta])*
        $mode:ident $name:ident $([check $check:path])? {
            $(
                $(#[$fdoc:meta])*
                $field:ident $([$onnx:literal])? : $ty:ty $(= $default:expr)?
            ),* $(,)?
        }
    )*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name {
            $( $(#[$fdoc])* pub $field: $ty, )*
            /// Which attributes the source spelled out (see [`Explicit`]).
            pub explicit: Explicit,
        }

        impl $name {
            /// Reads and validates the attributes (see the module docs).
            pub fn parse(attrs: &Attrs) -> Result<Self, AttrError> {
                let mut explicit = Explicit::default();
                let mut _bit = 0u32;
                $(
                    let name = onnx_name!($field $(, $onnx)?);
                    let $field: $ty = match attrs.get(name) {
                        Some(a) => {
                            explicit.set(_bit);
                            <$ty as AttrValue>::from_attr(name, a)?
                        }
                        None => or_default!(name $(, $default)?),
                    };
                    _bit += 1;
                )*
                let s = $name { $($field,)* explicit };
                $($check(&s)?;)?
                Ok(s)
            }

            /// Writes the attributes the source gave and those that differ from their default.
            pub fn write(&self, out: &mut Attrs) {
                let mut _bit = 0u32;
                $(
                    let name = onnx_name!($field $(, $onnx)?);
                    if self.explicit.has(_bit) || !is_default!(self.$field $(, $default)?) {
                        if let Some(a) = AttrValue::to_attr(&self.$field) {
                            out.set(name, a);
                        }
                    }
                    _bit += 1;
                )*
            }
        }

        attr_structs!(@default $mode $name { $($field $(= $default)?),* });
    )*};
    (@default defaults $name:ident { $($field:ident $(= $default:expr)?),* }) => {
        impl Default for $name {
            fn default() -> Self {
                $name { $($field: or_default!("" $(, $default)?),)* explicit: Explicit::default() }
            }
        }
    };
    (@default required $name:ident { $($field:ident $(= $default:expr)?),* }) => {};
}

fn positive(name: &str, v: i64) -> Result<(), AttrError> {
    if v < 1 {
        return Err(AttrError::invalid(name, format!("must be ≥ 1, got {v}")));
    }
    Ok(())
}

fn all_positive(name: &str, v: &Option<Vec<i64>>) -> Result<(), AttrError> {
    if let Some(v) = v {
        if let Some(x) = v.iter().find(|&&x| x < 1) {
            return Err(AttrError::invalid(name, format!("values must be ≥ 1, got {x}")));
        }
    }
    Ok(())
}

fn check_conv(a: &ConvAttrs) -> Result<(), AttrError> {
    positive("group", a.group)
}

fn check_conv_transpose(a: &ConvTransposeAttrs) -> Result<(), AttrError> {
    positive("group", a.group)
}

fn check_pool(a: &PoolAttrs) -> Result<(), AttrError> {
    all_positive("kernel_shape", &a.kernel_shape)
}

fn check_group_norm(a: &GroupNormAttrs) -> Result<(), AttrError> {
    positive("num_groups", a.num_groups)
}

fn check_nms(a: &NmsAttrs) -> Result<(), AttrError> {
    if !matches!(a.center_point_box, 0 | 1) {
        return Err(AttrError::invalid("center_point_box", format!("must be 0 or 1, got {}", a.center_point_box)));
    }
    Ok(())
}

fn check_lrn(a: &LrnAttrs) -> Result<(), AttrError> {
    positive("size", a.size)
}

fn check_blocksize(name: &str, b: i64) -> Result<(), AttrError> {
    positive(name, b)
}

fn check_depth_to_space(a: &DepthToSpaceAttrs) -> Result<(), AttrError> {
    check_blocksize("blocksize", a.blocksize)
}

fn check_space_to_depth(a: &SpaceToDepthAttrs) -> Result<(), AttrError> {
    check_blocksize("blocksize", a.blocksize)
}

fn check_attention(a: &AttentionAttrs) -> Result<(), AttrError> {
    for (name, v) in [("q_num_heads", a.q_num_heads), ("kv_num_heads", a.kv_num_heads)] {
        if let Some(v) = v {
            positive(name, v)?;
        }
    }
    if !(0..=3).contains(&a.qk_matmul_output_mode) {
        return Err(AttrError::invalid(
            "qk_matmul_output_mode",
            format!("must be 0, 1, 2 or 3, got {}", a.qk_matmul_output_mode),
        ));
    }
    if a.softcap < 0.0 || a.softcap.is_nan() {
        return Err(AttrError::invalid("softcap", format!("must be ≥ 0, got {}", a.softcap)));
    }
    if let Some(s) = a.scale.filter(|s| !s.is_finite()) {
        return Err(AttrError::invalid("scale", format!("must be finite, got {s}")));
    }
    Ok(())
}

fn check_rotary(a: &RotaryEmbeddingAttrs) -> Result<(), AttrError> {
    for (name, v) in [("num_heads", a.num_heads), ("rotary_embedding_dim", a.rotary_embedding_dim)] {
        if v < 0 {
            return Err(AttrError::invalid(name, format!("must be ≥ 0, got {v}")));
        }
    }
    Ok(())
}

fn check_dtype_code(name: &str, code: i64) -> Result<(), AttrError> {
    if code != 0 {
        DType::from_attr(name, &Attr::Int(code))?;
    }
    Ok(())
}

fn check_dequantize(a: &DequantizeAttrs) -> Result<(), AttrError> {
    check_dtype_code("output_dtype", a.output_dtype)
}

fn check_quantize(a: &QuantizeAttrs) -> Result<(), AttrError> {
    check_dtype_code("output_dtype", a.output_dtype)?;
    check_dtype_code("precision", a.precision)
}

attr_structs! {
    /// Conv, ConvInteger, QLinearConv. Per-axis lists are `None` when absent
    /// (their defaults depend on the rank).
    defaults ConvAttrs [check check_conv] {
        /// Implicit padding.
        auto_pad: AutoPad = AutoPad::NotSet,
        /// Dilation per spatial axis.
        dilations: Option<Vec<i64>> = None,
        /// Number of channel groups (≥ 1).
        group: i64 = 1,
        /// Kernel extent per spatial axis (must match the weights).
        kernel_shape: Option<Vec<i64>> = None,
        /// Begin pads for each spatial axis, then end pads.
        pads: Option<Vec<i64>> = None,
        /// Stride per spatial axis.
        strides: Option<Vec<i64>> = None,
    }

    /// ConvTranspose.
    defaults ConvTransposeAttrs [check check_conv_transpose] {
        /// Implicit padding.
        auto_pad: AutoPad = AutoPad::NotSet,
        /// Dilation per spatial axis.
        dilations: Option<Vec<i64>> = None,
        /// Number of channel groups (≥ 1).
        group: i64 = 1,
        /// Kernel extent per spatial axis (must match the weights).
        kernel_shape: Option<Vec<i64>> = None,
        /// Extra extent added at the end of each spatial axis.
        output_padding: Option<Vec<i64>> = None,
        /// Explicit spatial output extents.
        output_shape: Option<Vec<i64>> = None,
        /// Begin pads for each spatial axis, then end pads.
        pads: Option<Vec<i64>> = None,
        /// Stride per spatial axis.
        strides: Option<Vec<i64>> = None,
    }

    /// AveragePool, MaxPool, LpPool and GlobalLpPool.
    defaults PoolAttrs [check check_pool] {
        /// Implicit padding.
        auto_pad: AutoPad = AutoPad::NotSet,
        /// Round output extents up instead of down.
        ceil_mode: bool = false,
        /// AveragePool: count padding in the divisor.
        count_include_pad: bool = false,
        /// Dilation per spatial axis.
        dilations: Option<Vec<i64>> = None,
        /// Window extent per spatial axis (required by the windowed pools).
        kernel_shape: Option<Vec<i64>> = None,
        /// LpPool, GlobalLpPool: the norm's exponent.
        p: i64 = 2,
        /// Begin pads for each spatial axis, then end pads.
        pads: Option<Vec<i64>> = None,
        /// MaxPool: indices in column-major order.
        storage_order: bool = false,
        /// Stride per spatial axis.
        strides: Option<Vec<i64>> = None,
    }

    /// Gemm.
    defaults GemmAttrs {
        /// Scale of `A·B`.
        alpha: f32 = 1.0,
        /// Scale of `C`.
        beta: f32 = 1.0,
        /// Transpose `A`.
        trans_a ["transA"]: bool = false,
        /// Transpose `B`.
        trans_b ["transB"]: bool = false,
    }

    /// Einsum.
    required EinsumAttrs {
        /// The contraction, in Einstein notation.
        equation: String,
    }

    /// ReduceL1 … ReduceSumSquare.
    defaults ReduceAttrs {
        /// Keep reduced axes as extent 1.
        keepdims: bool = true,
        /// With no `axes`, pass the data through instead of reducing every axis.
        noop_with_empty_axes: bool = false,
    }

    /// ArgMax, ArgMin.
    defaults ArgReduceAttrs {
        /// The axis.
        axis: i64 = 0,
        /// Keep the reduced axis as extent 1.
        keepdims: bool = true,
        /// Of equal values, pick the last.
        select_last_index: bool = false,
    }

    /// CumSum.
    defaults CumSumAttrs {
        /// Leave each element out of its own sum.
        exclusive: bool = false,
        /// Sum from the end.
        reverse: bool = false,
    }

    /// If: the two branches. Each is a closed graph: its inputs are the node's operands
    /// after the condition (the values the branches read from outside, in order), its
    /// outputs the node's results; both branches have the same signature.
    required IfAttrs {
        /// The branch run when the condition is true.
        then_branch: Box<crate::graph::Graph>,
        /// The branch run when it is false.
        else_branch: Box<crate::graph::Graph>,
    }

    /// TopK. With a run-time `K` the node has a third result, the extent (see
    /// [`crate::dynamic`]), and `kiln_bound` bounds K.
    defaults TopKAttrs {
        /// The axis.
        axis: i64 = -1,
        /// Largest (else smallest) values.
        largest: bool = true,
        /// Results in sorted order.
        sorted: bool = true,
        /// kiln's declared bound on the data-dependent extent (`--max-dim`); -1: the
        /// bound the operand shapes give (see [`crate::dynamic`]).
        bound ["kiln_bound"]: i64 = -1,
    }

    /// NonZero (see [`crate::dynamic`]).
    defaults NonZeroAttrs {
        /// kiln's declared bound on the number of nonzero elements; -1: the element count.
        bound ["kiln_bound"]: i64 = -1,
    }

    /// Compress (see [`crate::dynamic`]).
    defaults CompressAttrs {
        /// The axis; absent: the flattened input.
        axis: Option<i64> = None,
        /// kiln's declared bound on the number of selected slices; -1: the condition's
        /// length (at most the axis's extent).
        bound ["kiln_bound"]: i64 = -1,
    }

    /// Unique (see [`crate::dynamic`]).
    defaults UniqueAttrs {
        /// The axis; absent: the flattened input.
        axis: Option<i64> = None,
        /// Unique values in ascending order (else in order of first occurrence).
        sorted: bool = true,
        /// kiln's declared bound on the number of unique values; -1: the element
        /// count (the axis's extent with `axis`).
        bound ["kiln_bound"]: i64 = -1,
    }

    /// NonMaxSuppression (see [`crate::dynamic`]).
    defaults NmsAttrs [check check_nms] {
        /// 0: boxes are `[y1, x1, y2, x2]` (any two opposite corners); 1: `[x_center,
        /// y_center, width, height]`.
        center_point_box: i64 = 0,
        /// kiln's declared bound on the number of selected boxes; -1: batches × classes
        /// × boxes (capped by a constant `max_output_boxes_per_class`).
        bound ["kiln_bound"]: i64 = -1,
    }

    /// Softmax, LogSoftmax, Hardmax.
    defaults SoftmaxAttrs {
        /// The axis.
        axis: i64 = -1,
    }

    /// Elu, Celu, ThresholdedRelu.
    defaults AlphaOneAttrs {
        /// The op's `alpha`.
        alpha: f32 = 1.0,
    }

    /// LeakyRelu.
    defaults LeakyReluAttrs {
        /// Slope for negative inputs.
        alpha: f32 = 0.01,
    }

    /// Selu.
    defaults SeluAttrs {
        /// Scale of the negative branch.
        alpha: f32 = 1.673_263_2,
        /// Overall scale.
        gamma: f32 = 1.050_701,
    }

    /// HardSigmoid.
    defaults HardSigmoidAttrs {
        /// Slope.
        alpha: f32 = 0.2,
        /// Offset.
        beta: f32 = 0.5,
    }

    /// Gelu.
    defaults GeluAttrs {
        /// Exact or tanh approximation.
        approximate: GeluApproximate = GeluApproximate::None,
    }

    /// Shrink.
    defaults ShrinkAttrs {
        /// Amount added to/subtracted from values outside the band.
        bias: f32 = 0.0,
        /// Half-width of the band mapped to 0.
        lambd: f32 = 0.5,
    }

    /// IsInf.
    defaults IsInfAttrs {
        /// Report -inf.
        detect_negative: bool = true,
        /// Report +inf.
        detect_positive: bool = true,
    }

    /// Mod.
    defaults ModAttrs {
        /// C `fmod` semantics (sign of the dividend) instead of Python's.
        fmod: bool = false,
    }

    /// BitShift.
    required BitShiftAttrs {
        /// Shift direction.
        direction: ShiftDirection,
    }

    /// Cast.
    required CastAttrs {
        /// Rounding to `f8E8M0FNU` (ONNX's default: up).
        round_mode: E8M0RoundMode = E8M0RoundMode::Up,
        /// Saturate out-of-range values when casting to 8-bit floats.
        saturate: bool = true,
        /// The result dtype.
        to: DType,
    }

    /// CastLike.
    defaults CastLikeAttrs {
        /// Rounding to `f8E8M0FNU` (ONNX's default: up).
        round_mode: E8M0RoundMode = E8M0RoundMode::Up,
        /// Saturate out-of-range values when casting to 8-bit floats.
        saturate: bool = true,
    }

    /// QuantizeLinear.
    defaults QuantizeAttrs [check check_quantize] {
        /// The quantisation axis (per-axis and blocked forms).
        axis: i64 = 1,
        /// Block size along `axis` (0: not blocked).
        block_size: i64 = 0,
        /// ONNX dtype code of the result (0: from the zero point).
        output_dtype: i64 = 0,
        /// ONNX dtype code of the arithmetic (0: the scale's dtype).
        precision: i64 = 0,
        /// Saturate out-of-range values for 8-bit floats.
        saturate: bool = true,
    }

    /// DequantizeLinear.
    defaults DequantizeAttrs [check check_dequantize] {
        /// The quantisation axis (per-axis and blocked forms).
        axis: i64 = 1,
        /// Block size along `axis` (0: not blocked).
        block_size: i64 = 0,
        /// ONNX dtype code of the result (opset 23; 0: the scale's dtype). An `f8E8M0FNU`
        /// scale (MX) needs it: the result is a wider float.
        output_dtype: i64 = 0,
    }

    /// BatchNormalization.
    defaults BatchNormAttrs {
        /// Added to the variance.
        epsilon: f32 = 1e-5,
        /// Running-statistics momentum (training only).
        momentum: f32 = 0.9,
        /// Training mode (not supported past import).
        training_mode: bool = false,
    }

    /// InstanceNormalization.
    defaults InstanceNormAttrs {
        /// Added to the variance.
        epsilon: f32 = 1e-5,
    }

    /// LayerNormalization.
    defaults LayerNormAttrs {
        /// First normalised axis.
        axis: i64 = -1,
        /// Added to the variance.
        epsilon: f32 = 1e-5,
        /// Dtype of the statistics.
        stash_type: DType = DType::F32,
    }

    /// RMSNormalization (opset 23).
    defaults RmsNormAttrs {
        /// First normalised axis.
        axis: i64 = -1,
        /// Added to the mean of the squares.
        epsilon: f32 = 1e-5,
        /// Dtype of the statistic.
        stash_type: DType = DType::F32,
    }

    /// Attention (opset 23; opset 24 adds the `nonpad_kv_seqlen` operand).
    defaults AttentionAttrs [check check_attention] {
        /// Whether query `i` sees only the keys up to `i` past the cached ones.
        is_causal: bool = false,
        /// Heads of K and V (3-D inputs).
        kv_num_heads: Option<i64> = None,
        /// Heads of Q (3-D inputs).
        q_num_heads: Option<i64> = None,
        /// Which scores the fourth result holds: 0 the product, 1 with the mask added,
        /// 2 after the softcap, 3 after the softmax.
        qk_matmul_output_mode: i64 = 0,
        /// The product's factor; absent: `1/sqrt(head size)`.
        scale: Option<f32> = None,
        /// `c·tanh(x/c)` on the scores where positive.
        softcap: f32 = 0.0,
        /// Dtype the softmax is computed in; absent: the scores'.
        softmax_precision: Option<DType> = None,
    }

    /// RotaryEmbedding (opset 23).
    defaults RotaryEmbeddingAttrs [check check_rotary] {
        /// Rotate pairs `(x[2i], x[2i+1])` rather than `(x[i], x[i + d/2])`.
        interleaved: bool = false,
        /// Heads of a 3-D input.
        num_heads: i64 = 0,
        /// How many leading elements of each head rotate; 0: all.
        rotary_embedding_dim: i64 = 0,
    }

    /// GroupNormalization.
    required GroupNormAttrs [check check_group_norm] {
        /// Added to the variance.
        epsilon: f32 = 1e-5,
        /// Number of groups (≥ 1).
        num_groups: i64,
        /// Dtype of the statistics.
        stash_type: DType = DType::F32,
    }

    /// LRN.
    required LrnAttrs [check check_lrn] {
        /// Scale.
        alpha: f32 = 1e-4,
        /// Exponent.
        beta: f32 = 0.75,
        /// Offset.
        bias: f32 = 1.0,
        /// Number of channels summed (≥ 1).
        size: i64,
    }

    /// LpNormalization.
    defaults LpNormAttrs {
        /// The axis.
        axis: i64 = -1,
        /// The norm (1 or 2).
        p: i64 = 2,
    }

    /// MeanVarianceNormalization.
    defaults MvnAttrs {
        /// Axes the statistics run over.
        axes: Vec<i64> = vec![0, 2, 3],
    }

    /// RNN, GRU, LSTM.
    defaults RnnAttrs {
        /// `alpha` of each activation that takes one.
        activation_alpha: Vec<f32> = Vec::new(),
        /// `beta` of each activation that takes one.
        activation_beta: Vec<f32> = Vec::new(),
        /// Activation names (ONNX spelling), per direction.
        activations: Option<Vec<String>> = None,
        /// Cell clip threshold.
        clip: Option<f32> = None,
        /// Direction.
        direction: RnnDirection = RnnDirection::Forward,
        /// Hidden size (else from the weights).
        hidden_size: Option<i64> = None,
        /// LSTM: couple the input and forget gates.
        input_forget: bool = false,
        /// Batch-major operands and results.
        layout: bool = false,
        /// GRU: apply the reset gate after the hidden linear map.
        linear_before_reset: bool = false,
    }

    /// Reshape.
    defaults ReshapeAttrs {
        /// A 0 in the shape means extent 0 (else: copy the input's extent).
        allowzero: bool = false,
    }

    /// Flatten.
    defaults FlattenAttrs {
        /// Axes before it form the first result axis.
        axis: i64 = 1,
    }

    /// Concat.
    required ConcatAttrs {
        /// The axis.
        axis: i64,
    }

    /// Gather, GatherElements.
    defaults GatherAttrs {
        /// The axis.
        axis: i64 = 0,
    }

    /// GatherND.
    defaults GatherNdAttrs {
        /// Number of leading batch axes.
        batch_dims: i64 = 0,
    }

    /// ScatterElements.
    defaults ScatterElementsAttrs {
        /// The axis.
        axis: i64 = 0,
        /// How updates combine with the data.
        reduction: ScatterReduction = ScatterReduction::None,
    }

    /// ScatterND.
    defaults ScatterNdAttrs {
        /// How updates combine with the data.
        reduction: ScatterReduction = ScatterReduction::None,
    }

    /// Split.
    defaults SplitAttrs {
        /// The axis.
        axis: i64 = 0,
        /// Number of equal parts (when `split` is absent).
        num_outputs: Option<i64> = None,
    }

    /// Transpose.
    defaults TransposeAttrs {
        /// The permutation (default: reverse the axes).
        perm: Option<Vec<i64>> = None,
    }

    /// DepthToSpace.
    required DepthToSpaceAttrs [check check_depth_to_space] {
        /// Block extent (≥ 1).
        blocksize: i64,
        /// Channel order.
        mode: DepthToSpaceMode = DepthToSpaceMode::Dcr,
    }

    /// SpaceToDepth.
    required SpaceToDepthAttrs [check check_space_to_depth] {
        /// Block extent (≥ 1).
        blocksize: i64,
    }

    /// Pad.
    defaults PadAttrs {
        /// How padding is filled.
        mode: PadMode = PadMode::Constant,
    }

    /// Shape.
    defaults ShapeAttrs {
        /// First axis reported (may be negative).
        start: i64 = 0,
        /// One past the last axis reported (may be negative; default: the rank).
        end: Option<i64> = None,
    }

    /// ConstantOfShape.
    defaults ConstantOfShapeAttrs {
        /// The one-element fill value (default: f32 zero).
        value: Option<Tensor> = None,
    }

    /// EyeLike.
    defaults EyeLikeAttrs {
        /// Result dtype (default: the input's).
        dtype: Option<DType> = None,
        /// Diagonal offset.
        k: i64 = 0,
    }

    /// OneHot.
    defaults OneHotAttrs {
        /// Where the new axis goes.
        axis: i64 = -1,
        /// The result dims kiln compiles for when `depth` is run-time data; the node
        /// then has a second result, the run-time shape check (see [`crate::dynamic`]).
        dims ["kiln_dims"]: Option<Vec<i64>> = None,
    }

    /// Range.
    defaults RangeAttrs {
        /// The result dims kiln compiles for when `start`, `limit` or `delta` is
        /// run-time data; the node then has a second result, the run-time shape check
        /// (see [`crate::dynamic`]).
        dims ["kiln_dims"]: Option<Vec<i64>> = None,
    }

    /// Trilu.
    defaults TriluAttrs {
        /// Keep the upper (else lower) triangle.
        upper: bool = true,
    }

    /// ReverseSequence.
    defaults ReverseSequenceAttrs {
        /// The batch axis.
        batch_axis: i64 = 1,
        /// The time axis.
        time_axis: i64 = 0,
    }

    /// Dropout (an identity at inference).
    defaults DropoutAttrs {
        /// Random seed (unused at inference).
        seed: Option<i64> = None,
    }

    /// GridSample.
    defaults GridSampleAttrs {
        /// Whether −1 and 1 name the centres of the corner pixels (else their outer edges).
        align_corners: bool = false,
        /// Interpolation.
        mode: GridSampleMode = GridSampleMode::Linear,
        /// What a sample outside the input reads.
        padding_mode: GridSamplePadding = GridSamplePadding::Zeros,
    }

    /// Col2Im.
    defaults Col2ImAttrs {
        /// Dilation per spatial axis (default 1).
        dilations: Option<Vec<i64>> = None,
        /// Begin pads for each spatial axis, then end pads (default 0).
        pads: Option<Vec<i64>> = None,
        /// Stride per spatial axis (default 1).
        strides: Option<Vec<i64>> = None,
    }

    /// RoiAlign.
    defaults RoiAlignAttrs {
        /// Whether the box corners are shifted by half a pixel (`half_pixel`) or not.
        coordinate_transformation_mode: RoiAlignCoordinates = RoiAlignCoordinates::HalfPixel,
        /// How the samples of a bin combine.
        mode: RoiAlignMode = RoiAlignMode::Avg,
        /// Output rows per box.
        output_height: i64 = 1,
        /// Output columns per box.
        output_width: i64 = 1,
        /// Samples per bin and axis (0: adaptive, `ceil(box extent / output extent)`).
        sampling_ratio: i64 = 0,
        /// Factor from box coordinates to input pixels.
        spatial_scale: f32 = 1.0,
    }

    /// DeformConv.
    defaults DeformConvAttrs {
        /// Dilation per spatial axis (default 1).
        dilations: Option<Vec<i64>> = None,
        /// Channel groups of the convolution.
        group: i64 = 1,
        /// Kernel extent per spatial axis (default: from W).
        kernel_shape: Option<Vec<i64>> = None,
        /// Channel groups sharing one set of offsets.
        offset_group: i64 = 1,
        /// Begin pads for each spatial axis, then end pads (default 0).
        pads: Option<Vec<i64>> = None,
        /// Stride per spatial axis (default 1).
        strides: Option<Vec<i64>> = None,
    }

    /// Resize.
    defaults ResizeAttrs {
        /// Antialiasing filter when downscaling.
        antialias: bool = false,
        /// Axes `scales`/`sizes` refer to (default: all).
        axes: Option<Vec<i64>> = None,
        /// Mapping from output to input coordinates.
        coordinate_transformation_mode: CoordinateTransformationMode = CoordinateTransformationMode::HalfPixel,
        /// Cubic interpolation coefficient.
        cubic_coeff_a: f32 = -0.75,
        /// Cubic: drop weights of out-of-range samples.
        exclude_outside: bool = false,
        /// `tf_crop_and_resize`: value outside the input.
        extrapolation_value: f32 = 0.0,
        /// How `sizes` keeps the aspect ratio.
        keep_aspect_ratio_policy: KeepAspectRatioPolicy = KeepAspectRatioPolicy::Stretch,
        /// Interpolation.
        mode: ResizeMode = ResizeMode::Nearest,
        /// Nearest mode: rounding.
        nearest_mode: NearestMode = NearestMode::RoundPreferFloor,
        /// The result dims kiln compiles for when `scales` or `roi` is run-time data
        /// (declared by the model or `--output-shape`); the node then has a second
        /// result, the run-time shape check (see [`crate::dynamic`]).
        dims ["kiln_dims"]: Option<Vec<i64>> = None,
    }
}

/// The typed attributes of one op: one variant per attribute family.
///
/// Built by [`OpAttrs::parse`] from the string-keyed form; [`OpAttrs::to_attrs`]
/// gives it back. Ops without attributes use [`OpAttrs::None`].
macro_rules! op_attrs {
    ($($variant:ident($t:ident): $($kind:ident)|+;)*) => {
        /// Typed attributes (see the module docs).
        #[derive(Clone, Debug, PartialEq)]
        pub enum OpAttrs {
            /// An op without attributes (or one built by [`Op::new`](crate::op::Op::new)
            /// whose required attributes were not given).
            None,
            $(
                #[doc = concat!("Attributes of ", $(stringify!($kind), " ",)+ ".")]
                $variant($t),
            )*
        }

        impl OpAttrs {
            /// Reads and validates the attributes of an op of kind `kind`.
            pub fn parse(kind: OpKind, attrs: &Attrs) -> Result<OpAttrs, AttrError> {
                Ok(match kind {
                    $($(OpKind::$kind)|+ => OpAttrs::$variant($t::parse(attrs)?),)*
                    _ => OpAttrs::None,
                })
            }

            /// Whether this is the family of `kind` (always true for `None`).
            pub fn fits(&self, kind: OpKind) -> bool {
                match self {
                    OpAttrs::None => true,
                    $(OpAttrs::$variant(_) => matches!(kind, $(OpKind::$kind)|+),)*
                }
            }

            /// The name of the attribute struct (`"None"` for none).
            pub fn family(&self) -> &'static str {
                match self {
                    OpAttrs::None => "None",
                    $(OpAttrs::$variant(_) => stringify!($t),)*
                }
            }

            /// The string-keyed form (see the module docs).
            pub fn to_attrs(&self) -> Attrs {
                let mut out = Attrs::new();
                match self {
                    OpAttrs::None => {}
                    $(OpAttrs::$variant(a) => a.write(&mut out),)*
                }
                out
            }
        }

        $(
            impl OpAttrsOf for $t {
                const FAMILY: &'static str = stringify!($t);
                fn of(a: &OpAttrs) -> Option<&$t> {
                    match a {
                        OpAttrs::$variant(v) => Some(v),
                        _ => None,
                    }
                }
            }

            impl From<$t> for OpAttrs {
                fn from(a: $t) -> OpAttrs {
                    OpAttrs::$variant(a)
                }
            }
        )*
    };
}

/// An attribute struct that is one family of [`OpAttrs`].
pub trait OpAttrsOf: Sized {
    /// The struct's name, for errors.
    const FAMILY: &'static str;
    /// The struct, when `a` is of this family.
    fn of(a: &OpAttrs) -> Option<&Self>;
}

op_attrs! {
    Conv(ConvAttrs): Conv | ConvInteger | QLinearConv;
    ConvTranspose(ConvTransposeAttrs): ConvTranspose;
    Pool(PoolAttrs): AveragePool | MaxPool | LpPool | GlobalLpPool;
    Gemm(GemmAttrs): Gemm;
    Einsum(EinsumAttrs): Einsum;
    Reduce(ReduceAttrs): ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMax | ReduceMean
        | ReduceMin | ReduceProd | ReduceSum | ReduceSumSquare;
    ArgReduce(ArgReduceAttrs): ArgMax | ArgMin;
    CumSum(CumSumAttrs): CumSum;
    TopK(TopKAttrs): TopK;
    NonZero(NonZeroAttrs): NonZero;
    Compress(CompressAttrs): Compress;
    Unique(UniqueAttrs): Unique;
    Nms(NmsAttrs): NonMaxSuppression;
    If(IfAttrs): If;
    Softmax(SoftmaxAttrs): Softmax | LogSoftmax | Hardmax;
    AlphaOne(AlphaOneAttrs): Elu | Celu | ThresholdedRelu;
    LeakyRelu(LeakyReluAttrs): LeakyRelu;
    Selu(SeluAttrs): Selu;
    HardSigmoid(HardSigmoidAttrs): HardSigmoid;
    Gelu(GeluAttrs): Gelu;
    Shrink(ShrinkAttrs): Shrink;
    IsInf(IsInfAttrs): IsInf;
    Mod(ModAttrs): Mod;
    BitShift(BitShiftAttrs): BitShift;
    Cast(CastAttrs): Cast;
    CastLike(CastLikeAttrs): CastLike;
    Quantize(QuantizeAttrs): QuantizeLinear;
    Dequantize(DequantizeAttrs): DequantizeLinear;
    BatchNorm(BatchNormAttrs): BatchNormalization;
    InstanceNorm(InstanceNormAttrs): InstanceNormalization;
    LayerNorm(LayerNormAttrs): LayerNormalization;
    RmsNorm(RmsNormAttrs): RMSNormalization;
    Attention(AttentionAttrs): Attention;
    RotaryEmbedding(RotaryEmbeddingAttrs): RotaryEmbedding;
    GroupNorm(GroupNormAttrs): GroupNormalization;
    Lrn(LrnAttrs): LRN;
    LpNorm(LpNormAttrs): LpNormalization;
    Mvn(MvnAttrs): MeanVarianceNormalization;
    Rnn(RnnAttrs): RNN | GRU | LSTM;
    Reshape(ReshapeAttrs): Reshape;
    Flatten(FlattenAttrs): Flatten;
    Concat(ConcatAttrs): Concat;
    Gather(GatherAttrs): Gather | GatherElements;
    GatherNd(GatherNdAttrs): GatherND;
    ScatterElements(ScatterElementsAttrs): ScatterElements;
    ScatterNd(ScatterNdAttrs): ScatterND;
    Split(SplitAttrs): Split;
    Transpose(TransposeAttrs): Transpose;
    DepthToSpace(DepthToSpaceAttrs): DepthToSpace;
    SpaceToDepth(SpaceToDepthAttrs): SpaceToDepth;
    Pad(PadAttrs): Pad;
    Shape(ShapeAttrs): Shape;
    ConstantOfShape(ConstantOfShapeAttrs): ConstantOfShape;
    EyeLike(EyeLikeAttrs): EyeLike;
    OneHot(OneHotAttrs): OneHot;
    Range(RangeAttrs): Range;
    Trilu(TriluAttrs): Trilu;
    ReverseSequence(ReverseSequenceAttrs): ReverseSequence;
    Dropout(DropoutAttrs): Dropout;
    Resize(ResizeAttrs): Resize;
    GridSample(GridSampleAttrs): GridSample;
    Col2Im(Col2ImAttrs): Col2Im;
    RoiAlign(RoiAlignAttrs): RoiAlign;
    DeformConv(DeformConvAttrs): DeformConv;
}

/// The geometry of an Attention node, from its operands' dims and attributes (shape
/// inference, the reference evaluator and the lowering read the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionDims {
    /// Whether Q, K and V are 3-D (`[B, S, heads·head]`) rather than 4-D
    /// (`[B, heads, S, head]`).
    pub packed: bool,
    /// Batch.
    pub batch: usize,
    /// Heads of Q.
    pub q_heads: usize,
    /// Heads of K and V (dividing `q_heads`: query head `h` reads K/V head
    /// `h / (q_heads / kv_heads)`).
    pub kv_heads: usize,
    /// Queries.
    pub queries: usize,
    /// New keys (K's and V's sequence).
    pub new_keys: usize,
    /// Cached keys (past_key's sequence; 0 without one).
    pub past: usize,
    /// Head size of Q and K.
    pub head: usize,
    /// Head size of V.
    pub v_head: usize,
}

impl AttentionDims {
    /// Keys in all: cached and new.
    pub fn keys(&self) -> usize {
        self.past + self.new_keys
    }

    /// The scores' dims `[B, q_heads, queries, keys]`.
    pub fn scores(&self) -> Vec<usize> {
        vec![self.batch, self.q_heads, self.queries, self.keys()]
    }

    /// Y's dims.
    pub fn y(&self) -> Vec<usize> {
        if self.packed {
            vec![self.batch, self.queries, self.q_heads * self.v_head]
        } else {
            vec![self.batch, self.q_heads, self.queries, self.v_head]
        }
    }
}

impl AttentionAttrs {
    /// The geometry of Q, K, V (and past_key's sequence length) under these
    /// attributes; a message saying what does not fit otherwise.
    pub fn dims(&self, q: &[usize], k: &[usize], v: &[usize], past: Option<usize>) -> Result<AttentionDims, String> {
        let show = |d: &[usize]| format!("{d:?}");
        if q.len() != k.len() || q.len() != v.len() || !matches!(q.len(), 3 | 4) {
            return Err(format!("Q, K and V must all be 3-D or all 4-D, got {}, {} and {}", show(q), show(k), show(v)));
        }
        let (packed, batch) = (q.len() == 3, q[0]);
        let (q_heads, kv_heads, queries, new_keys, head, kh, v_head) = if packed {
            let (Some(qh), Some(kvh)) = (self.q_num_heads, self.kv_num_heads) else {
                return Err("3-D inputs need the attributes `q_num_heads` and `kv_num_heads`".into());
            };
            let (qh, kvh) = (qh as usize, kvh as usize);
            if !q[2].is_multiple_of(qh) || !k[2].is_multiple_of(kvh) || !v[2].is_multiple_of(kvh) {
                return Err(format!(
                    "the hidden sizes of Q {}, K {} and V {} must divide by the heads ({qh}, {kvh}, {kvh})",
                    show(q),
                    show(k),
                    show(v)
                ));
            }
            (qh, kvh, q[1], k[1], q[2] / qh, k[2] / kvh, v[2] / kvh)
        } else {
            if k[1] != v[1] {
                return Err(format!("K {} and V {} must have the same heads", show(k), show(v)));
            }
            (q[1], k[1], q[2], k[2], q[3], k[3], v[3])
        };
        if k[0] != batch || v[0] != batch {
            return Err(format!("Q {}, K {} and V {} must have the same batch", show(q), show(k), show(v)));
        }
        if kh != head {
            return Err(format!("Q {} and K {} must have the same head size", show(q), show(k)));
        }
        let vs = if packed { v[1] } else { v[2] };
        if vs != new_keys {
            return Err(format!("K {} and V {} must have the same sequence length", show(k), show(v)));
        }
        if kv_heads == 0 || q_heads % kv_heads != 0 {
            return Err(format!("the heads of Q ({q_heads}) must be a multiple of those of K and V ({kv_heads})"));
        }
        Ok(AttentionDims { packed, batch, q_heads, kv_heads, queries, new_keys, past: past.unwrap_or(0), head, v_head })
    }

    /// The product's factor: `scale`, else `1/sqrt(head)`.
    pub fn scale_for(&self, head: usize) -> f64 {
        match self.scale {
            Some(s) => s as f64,
            None => 1.0 / (head as f64).sqrt(),
        }
    }
}

/// The sliding-window attributes that convolutions and pools share, borrowed from
/// their [`ConvAttrs`], [`ConvTransposeAttrs`] or [`PoolAttrs`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WindowAttrs<'a> {
    /// Implicit padding.
    pub auto_pad: AutoPad,
    /// Dilation per spatial axis.
    pub dilations: Option<&'a [i64]>,
    /// Window extent per spatial axis.
    pub kernel_shape: Option<&'a [i64]>,
    /// Begin pads for each spatial axis, then end pads.
    pub pads: Option<&'a [i64]>,
    /// Stride per spatial axis.
    pub strides: Option<&'a [i64]>,
}

impl OpAttrs {
    /// The window attributes of a convolution or pool.
    pub fn window(&self) -> Option<WindowAttrs<'_>> {
        macro_rules! w {
            ($a:expr) => {
                WindowAttrs {
                    auto_pad: $a.auto_pad,
                    dilations: $a.dilations.as_deref(),
                    kernel_shape: $a.kernel_shape.as_deref(),
                    pads: $a.pads.as_deref(),
                    strides: $a.strides.as_deref(),
                }
            };
        }
        Some(match self {
            OpAttrs::Conv(a) => w!(a),
            OpAttrs::ConvTranspose(a) => w!(a),
            OpAttrs::Pool(a) => w!(a),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_explicit_round_trip() {
        let a = Attrs::new().with("group", Attr::Int(1)).with("auto_pad", Attr::String("VALID".into()));
        let c = ConvAttrs::parse(&a).unwrap();
        assert_eq!(c.group, 1);
        assert_eq!(c.auto_pad, AutoPad::Valid);
        assert_eq!(c.strides, None);
        // The explicit default survives printing.
        assert_eq!(OpAttrs::from(c.clone()).to_attrs(), a);
        // A field changed from its default prints even when the source left it out.
        let mut d = ConvAttrs::default();
        d.group = 4;
        assert_eq!(OpAttrs::from(d).to_attrs(), Attrs::new().with("group", Attr::Int(4)));
        assert_eq!(OpAttrs::from(ConvAttrs::default()).to_attrs(), Attrs::new());
    }

    #[test]
    fn errors_name_the_attribute() {
        let bad = |k: OpKind, n: &str, v: Attr| OpAttrs::parse(k, &Attrs::new().with(n, v)).unwrap_err().to_string();
        assert!(bad(OpKind::Conv, "group", Attr::Int(0)).contains("`group`"));
        assert!(bad(OpKind::Conv, "group", Attr::Float(1.0)).contains("should be int"));
        assert!(
            bad(OpKind::Resize, "mode", Attr::String("bogus".into())).contains("must be one of nearest, linear, cubic")
        );
        assert!(bad(OpKind::ReduceSum, "keepdims", Attr::Int(2)).contains("must be 0 or 1"));
        assert!(bad(OpKind::Cast, "to", Attr::Int(99)).contains("not a dtype code"));
        assert!(OpAttrs::parse(OpKind::Cast, &Attrs::new()).unwrap_err().to_string().contains("`to`"));
        assert!(OpAttrs::parse(OpKind::Concat, &Attrs::new()).is_err());
    }

    #[test]
    fn typed_ops_keep_their_family() {
        let mut g = GemmAttrs::default();
        g.trans_b = true;
        let op = crate::op::Op::with_typed(OpKind::Gemm, g.clone()).unwrap();
        assert_eq!(op.attrs_of::<GemmAttrs>().unwrap(), &g);
        assert!(op.attrs_of::<ConvAttrs>().is_err());
        assert_eq!(op.to_attrs(), Attrs::new().with("transB", Attr::Int(1)));
        let e = crate::op::Op::with_typed(OpKind::Conv, g).unwrap_err();
        assert_eq!(e.to_string(), "Conv has no GemmAttrs");
        // Kinds with required attributes get none from Op::new, and say so when asked.
        let cast = crate::op::Op::new(OpKind::Cast);
        assert_eq!(cast.attrs_of::<CastAttrs>().unwrap_err().to_string(), "Cast has no CastAttrs");
    }

    #[test]
    fn unknown_attributes_are_ignored() {
        let a = Attrs::new().with("frobnicate", Attr::Int(3));
        assert_eq!(OpAttrs::parse(OpKind::Relu, &a).unwrap(), OpAttrs::None);
        assert_eq!(OpAttrs::parse(OpKind::Gemm, &a).unwrap().to_attrs(), Attrs::new());
    }

    #[test]
    fn enums_spell_onnx() {
        for &m in CoordinateTransformationMode::ALL {
            assert_eq!(CoordinateTransformationMode::from_onnx_name(m.onnx_name()), Some(m));
        }
        assert_eq!(GemmAttrs::parse(&Attrs::new().with("transB", Attr::Int(1))).unwrap().trans_b, true);
    }
}
