//! The closed set of tensor-level operators and their attributes.
//!
//! Semantics: every [`OpKind`] means what the ONNX operator of the same name means
//! at the **newest opset ONNX 1.17 defines (opset 22)**. Importers translate older
//! opset forms into that canonical form, so later stages see one meaning per op:
//! - operands that moved from attributes to inputs across opsets (`axes` of the
//!   Reduce ops, Squeeze/Unsqueeze; `split` of Split; `starts/ends/axes/steps` of
//!   Slice; `min/max` of Clip; `pads/value` of Pad; `scales` of Resize/Upsample) are
//!   always **inputs** here;
//! - optional inputs that are absent are `None` in the node's input list;
//! - attributes keep their ONNX names and types; an attribute that is absent takes
//!   its ONNX default. Front ends hand them over in string-keyed form ([`Attrs`]);
//!   [`Op::parse`] turns them into the op family's typed struct ([`crate::attrs`]),
//!   validated once, and every later stage reads the struct.

use crate::attrs::{OpAttrs, OpAttrsOf, WindowAttrs};
use crate::tensor::Tensor;
use core::fmt;
use core::str::FromStr;

macro_rules! op_kinds {
    ($($name:ident),* $(,)?) => {
        /// A tensor-level operator (ONNX semantics, see the module docs).
        #[allow(missing_docs)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum OpKind { $($name),* }

        impl OpKind {
            /// Every operator kind.
            pub const ALL: &'static [OpKind] = &[$(OpKind::$name),*];

            /// The operator's name (the ONNX op type).
            pub fn name(self) -> &'static str {
                match self { $(OpKind::$name => stringify!($name)),* }
            }
        }
    };
}

op_kinds! {
    Abs, Acos, Acosh, Add, And, ArgMax, ArgMin, Asin, Asinh, Atan, Atanh, Attention, AveragePool,
    BatchNormalization, BitShift, BitwiseAnd, BitwiseNot, BitwiseOr, BitwiseXor,
    Cast, CastLike, Ceil, Celu, Clip, Col2Im, Compress, Concat, ConstantOfShape, Conv, ConvInteger, ConvTranspose,
    Cos, Cosh, CumSum, DeformConv, DepthToSpace, DequantizeLinear, Det, Div, Dropout, DynamicQuantizeLinear,
    Einsum, Elu, Equal, Erf, Exp, Expand, EyeLike, Flatten, Floor, Gather, GatherElements,
    GatherND, Gelu, Gemm, GridSample, GlobalAveragePool, GlobalLpPool, GlobalMaxPool, Greater, GreaterOrEqual,
    GroupNormalization, GRU, HardSigmoid, HardSwish, Hardmax, Identity, If, InstanceNormalization,
    IsInf, IsNaN, LayerNormalization, LeakyRelu, Less, LessOrEqual, Log, LogSoftmax, LpNormalization,
    LpPool, LRN, LSTM, MatMul, MatMulInteger, Max, MaxPool, Mean, MeanVarianceNormalization, Min,
    Mish, Mod, Mul, Neg, NonMaxSuppression, NonZero, Not, OneHot, Or, Pad, Pow, PRelu, QLinearConv, QLinearMatMul,
    QuantizeLinear, Range, Reciprocal, ReduceL1, ReduceL2, ReduceLogSum, ReduceLogSumExp,
    ReduceMax, ReduceMean, ReduceMin, ReduceProd, ReduceSum, ReduceSumSquare, Relu, Reshape,
    Resize, ReverseSequence, RMSNormalization, RNN, RoiAlign, RotaryEmbedding, Round, ScatterElements, ScatterND, Selu, Shape, Shrink, Sigmoid,
    Sign, Sin, Sinh, Size, Slice, Softmax, Softplus, Softsign, SpaceToDepth, Split, Sqrt, Squeeze,
    Sub, Sum, Tan, Tanh, ThresholdedRelu, Tile, TopK, Transpose, Trilu, Unique, Unsqueeze, Where, Xor,
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error of [`OpKind::from_str`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown operator `{0}`")]
pub struct UnknownOp(pub String);

impl FromStr for OpKind {
    type Err = UnknownOp;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        OpKind::ALL.iter().copied().find(|k| k.name() == s).ok_or_else(|| UnknownOp(s.to_string()))
    }
}

/// One attribute value.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    /// An integer.
    Int(i64),
    /// A float.
    Float(f32),
    /// A string (ONNX strings are bytes; kiln keeps UTF-8, lossily converted).
    String(String),
    /// A list of integers.
    Ints(Vec<i64>),
    /// A list of floats.
    Floats(Vec<f32>),
    /// A list of strings.
    Strings(Vec<String>),
    /// A tensor.
    Tensor(Tensor),
    /// A subgraph (the branches of `If`): a closed graph whose inputs are the values the
    /// node passes it and whose outputs are the node's results.
    Graph(Box<crate::graph::Graph>),
}

impl Attr {
    /// A short name of the attribute's kind, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Attr::Int(_) => "int",
            Attr::Float(_) => "float",
            Attr::String(_) => "string",
            Attr::Ints(_) => "ints",
            Attr::Floats(_) => "floats",
            Attr::Strings(_) => "strings",
            Attr::Tensor(_) => "tensor",
            Attr::Graph(_) => "graph",
        }
    }
}

/// Error reading an attribute.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AttrError {
    /// A required attribute is absent.
    #[error("required attribute `{0}` is missing")]
    Missing(String),
    /// The attribute has another kind.
    #[error("attribute `{name}` should be {expected}, found {found}")]
    WrongKind {
        /// Attribute name.
        name: String,
        /// Kind expected.
        expected: &'static str,
        /// Kind found.
        found: &'static str,
    },
    /// The attribute has a value the op does not accept.
    #[error("attribute `{name}` {reason}")]
    Invalid {
        /// Attribute name.
        name: String,
        /// What is wrong with the value.
        reason: String,
    },
    /// The attribute has a valid value kiln does not support.
    #[error("attribute `{name}` = {reason}")]
    Unsupported {
        /// Attribute name.
        name: String,
        /// What kiln does not support.
        reason: String,
    },
    /// The op's attributes are not of the family asked for (a bug in the caller, or an
    /// op built by [`Op::new`] without its required attributes).
    #[error("{op} has no {family}")]
    NotOfOp {
        /// The op.
        op: OpKind,
        /// The attribute struct asked for.
        family: &'static str,
    },
}

impl AttrError {
    /// An [`AttrError::Invalid`].
    pub fn invalid(name: &str, reason: impl Into<String>) -> AttrError {
        AttrError::Invalid { name: name.to_string(), reason: reason.into() }
    }
}

/// Attributes of one op in string-keyed form, kept sorted by name (so printing is
/// deterministic). This is the interchange form of the front ends and the text format;
/// an [`Op`] holds them parsed ([`Op::parse`]), and later stages read the typed struct.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Attrs(Vec<(String, Attr)>);

impl Attrs {
    /// No attributes.
    pub fn new() -> Attrs {
        Attrs(Vec::new())
    }

    /// Sets (or replaces) an attribute.
    pub fn set(&mut self, name: impl Into<String>, value: Attr) {
        let name = name.into();
        match self.0.binary_search_by(|(n, _)| n.as_str().cmp(&name)) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (name, value)),
        }
    }

    /// Builder form of [`Attrs::set`].
    pub fn with(mut self, name: impl Into<String>, value: Attr) -> Attrs {
        self.set(name, value);
        self
    }

    /// Removes an attribute, returning it.
    pub fn remove(&mut self, name: &str) -> Option<Attr> {
        let i = self.0.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok()?;
        Some(self.0.remove(i).1)
    }

    /// The attribute, if present.
    pub fn get(&self, name: &str) -> Option<&Attr> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name)).ok().map(|i| &self.0[i].1)
    }

    /// All attributes, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Attr)> + '_ {
        self.0.iter().map(|(n, a)| (n.as_str(), a))
    }

    /// Number of attributes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// An operator with its typed attributes.
///
/// The attributes are parsed and validated when the op is built ([`Op::parse`]), so
/// readers take the typed struct ([`Op::attrs_of`]) and never look a name up.
/// `kind` is public to read; the attributes are private so that they always belong
/// to the family of `kind`.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// Which operator.
    pub kind: OpKind,
    attrs: OpAttrs,
}

impl Op {
    /// An op with default attributes. For a kind with required attributes (Cast,
    /// Concat, …) the op has none, and [`Op::attrs_of`] reports that; use
    /// [`Op::parse`] or [`Op::with_typed`] for those.
    pub fn new(kind: OpKind) -> Op {
        Op { kind, attrs: OpAttrs::parse(kind, &Attrs::new()).unwrap_or(OpAttrs::None) }
    }

    /// An op with attributes in string-keyed form, parsed and validated.
    pub fn parse(kind: OpKind, attrs: &Attrs) -> Result<Op, AttrError> {
        Ok(Op { kind, attrs: OpAttrs::parse(kind, attrs)? })
    }

    /// An op with typed attributes; they must be of the family of `kind`.
    pub fn with_typed(kind: OpKind, attrs: impl Into<OpAttrs>) -> Result<Op, AttrError> {
        let attrs = attrs.into();
        if !attrs.fits(kind) {
            return Err(AttrError::NotOfOp { op: kind, family: attrs.family() });
        }
        Ok(Op { kind, attrs })
    }

    /// The typed attributes.
    pub fn attrs(&self) -> &OpAttrs {
        &self.attrs
    }

    /// The attributes as struct `T`; an error when the op's family is another.
    pub fn attrs_of<T: OpAttrsOf>(&self) -> Result<&T, AttrError> {
        T::of(&self.attrs).ok_or(AttrError::NotOfOp { op: self.kind, family: T::FAMILY })
    }

    /// The sliding-window attributes of a convolution or pool.
    pub fn window_attrs(&self) -> Result<WindowAttrs<'_>, AttrError> {
        self.attrs.window().ok_or(AttrError::NotOfOp { op: self.kind, family: "WindowAttrs" })
    }

    /// The attributes in string-keyed form (for printing and writing out).
    pub fn to_attrs(&self) -> Attrs {
        self.attrs.to_attrs()
    }

    /// The subgraphs the op carries (an `If`'s branches, then before else); empty for
    /// every other op.
    pub fn subgraphs(&self) -> Vec<&crate::graph::Graph> {
        match &self.attrs {
            OpAttrs::If(a) => vec![&*a.then_branch, &*a.else_branch],
            _ => Vec::new(),
        }
    }

    /// [`Op::subgraphs`], to change in place (a pass run inside the branches). A pass
    /// must keep each subgraph's inputs and output types: they are the node's contract.
    pub fn subgraphs_mut(&mut self) -> Vec<&mut crate::graph::Graph> {
        match &mut self.attrs {
            OpAttrs::If(a) => vec![&mut *a.then_branch, &mut *a.else_branch],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for &k in OpKind::ALL {
            assert_eq!(k.name().parse::<OpKind>(), Ok(k));
        }
        assert!("Frobnicate".parse::<OpKind>().is_err());
    }

    #[test]
    fn attrs_sorted_and_typed() {
        let a = Attrs::new().with("b", Attr::Int(2)).with("a", Attr::Float(1.0));
        let names: Vec<_> = a.iter().map(|(n, _)| n).collect();
        assert_eq!(names, vec!["a", "b"]);
        assert_eq!(a.get("b"), Some(&Attr::Int(2)));
        assert_eq!(a.get("c"), None);
    }
}
