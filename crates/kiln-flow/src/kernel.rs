//! Kernels: one output tensor computed as a scalar expression over its index space.
//!
//! A [`Kernel`] reads `inputs.len()` tensors and writes one `output` tensor, all with
//! static shapes, dense and row-major. Its meaning is
//!
//! ```text
//! for every index (v0, .., v{r-1}) of the output (r = output rank):
//!     output[v0, .., v{r-1}] = store(output dtype, value of `root`)
//! ```
//!
//! Expressions are nodes in an arena ([`ExprId`]); a node may be used by several
//! others (a DAG), and its value depends only on the index variables it reads, so any
//! evaluation order and any amount of sharing or recomputation is valid. Variables
//! `0..r` are the output's index; every [`Expr::Reduce`] introduces its own variables,
//! which only its body may read.
//!
//! ## Types
//! Values have a [`ScalarType`], the *compute type*. A load from a tensor of storage
//! dtype `d` yields [`ScalarType::of_storage`]`(d)`: the exact value widened where the
//! storage type has no arithmetic of its own (f16, bf16 and the 8/6/4-bit floats load
//! as f32, i4/u4 as i8/u8). The root's type must be the output's compute type; the
//! store narrows it back, exactly when the root is a [`Expr::Cast`] to the output
//! dtype (lowerings always end that way for narrow outputs), rounding to nearest even
//! otherwise. Index arithmetic is i64.
//!
//! ## Semantics of the operations
//! - Integer `Add`, `Sub`, `Mul`, `Neg` wrap. Integer `Div` truncates toward zero,
//!   `Rem` has the sign of the dividend; a zero divisor gives 0 and `MIN / -1` gives
//!   `MIN` (`MIN % -1` gives 0): no input traps.
//! - Float `Rem` is C's `fmod`. `Pow` is float only. `Min`/`Max` of floats return NaN
//!   if either operand is NaN.
//! - Comparisons give `Bool`; with a NaN operand they are false, except `Ne` (true).
//! - `And`, `Or`, `Xor`, `Not` are logical on `Bool` and bitwise on integers.
//!   `Shl`/`Shr` shift by the second operand; amounts outside `0..bits` give 0.
//!   `Shr` is arithmetic on signed types and logical on unsigned ones.
//! - Transcendentals (`Exp`, `Log`, `Tanh`, `Erf`, trigonometric and hyperbolic
//!   functions, `Pow`, float `Rem`) are float only; a target evaluates them with its own
//!   approximations and states their error.
//! - [`Expr::Cast`] converts as ONNX `Cast` does: float to integer truncates toward zero
//!   to 64 bits (saturating, NaN gives 0; u64 for non-negative values bound for u64),
//!   then wraps to the target width; integer to integer wraps; to float rounds to nearest
//!   even (saturating to the largest finite value for the 8-bit floats when `saturate`
//!   is set, as ONNX specifies); anything to `Bool` is `x != 0`.
//! - [`Expr::Reduce`] folds its body over every combination of its variables
//!   (row-major), starting from the identity of the operation; the order of a float
//!   sum is not specified. `ArgMax`/`ArgMin` reduce over exactly one variable and give
//!   the i64 position of the first (or, with `last`, the last) extreme value.
//! - [`Expr::Load`] reads input `input` at one index expression per dimension. With
//!   [`Bounds::InBounds`] the verifier must prove every index in range from the ranges
//!   of the variables ([`Kernel::verify`]); with [`Bounds::Pad`] an index outside the
//!   tensor reads the pad value; with [`Bounds::Clamp`] each index is clamped into
//!   range (an empty tensor reads 0). Indices computed from loaded data therefore never
//!   reach memory unchecked.
//!
//! ## Scatter kernels
//! A kernel with a [`Scatter`] store iterates the points of its own domain instead of
//! the output's index and stores each point's value at a position it computes:
//!
//! ```text
//! output = input 0                       (input 0 has the output's type)
//! for every point (v0, .., v{d-1}) of the domain, in row-major order (d = scatter.rank):
//!     p = value of `scatter.at`          (a flat, row-major element number of the output)
//!     if 0 <= p < numel(output):
//!         output[p] = combine(output[p], value of `root`)   (or just the root's value)
//! ```
//!
//! Variables `0..d` are the domain's index (their extents are the domain's), every
//! other variable is a reduction's, as usual. The order of the points is part of the
//! meaning: with no combining operation the last point that hits an element wins,
//! and duplicates fold in order. A position outside the output writes nothing: an
//! index read from data can never reach memory outside the buffer. A code generator
//! may leave out the copy of input 0 when input 0 and the output are the same bytes
//! (the planner places them so when input 0 has no other reader, see
//! `kiln_compiler::stream`). The output's dtype must be the storage of its compute
//! type (f32, f64, the integers, bool: no rounding between updates).

use std::collections::HashMap;
use std::fmt;

use kiln_ir::{DType, TensorType};

/// The type of a value inside a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ScalarType {
    /// Boolean (stored as one byte, 0 or 1).
    Bool,
    /// Signed 8-bit integer.
    I8,
    /// Signed 16-bit integer.
    I16,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 8-bit integer.
    U8,
    /// Unsigned 16-bit integer.
    U16,
    /// Unsigned 32-bit integer.
    U32,
    /// Unsigned 64-bit integer.
    U64,
    /// IEEE binary32.
    F32,
    /// IEEE binary64.
    F64,
}

impl ScalarType {
    /// Every scalar type, in declaration order.
    pub const ALL: [ScalarType; 11] = [
        ScalarType::Bool,
        ScalarType::I8,
        ScalarType::I16,
        ScalarType::I32,
        ScalarType::I64,
        ScalarType::U8,
        ScalarType::U16,
        ScalarType::U32,
        ScalarType::U64,
        ScalarType::F32,
        ScalarType::F64,
    ];

    /// The compute type of values stored as `d`.
    pub fn of_storage(d: DType) -> ScalarType {
        match d {
            DType::F64 => ScalarType::F64,
            DType::I8 | DType::I4 => ScalarType::I8,
            DType::I16 => ScalarType::I16,
            DType::I32 => ScalarType::I32,
            DType::I64 => ScalarType::I64,
            DType::U8 | DType::U4 => ScalarType::U8,
            DType::U16 => ScalarType::U16,
            DType::U32 => ScalarType::U32,
            DType::U64 => ScalarType::U64,
            DType::Bool => ScalarType::Bool,
            // f32 and every narrower float compute in f32.
            _ => ScalarType::F32,
        }
    }

    /// The storage dtype with exactly this type's values.
    pub fn dtype(self) -> DType {
        match self {
            ScalarType::Bool => DType::Bool,
            ScalarType::I8 => DType::I8,
            ScalarType::I16 => DType::I16,
            ScalarType::I32 => DType::I32,
            ScalarType::I64 => DType::I64,
            ScalarType::U8 => DType::U8,
            ScalarType::U16 => DType::U16,
            ScalarType::U32 => DType::U32,
            ScalarType::U64 => DType::U64,
            ScalarType::F32 => DType::F32,
            ScalarType::F64 => DType::F64,
        }
    }

    /// Width in bits (`Bool` counts 8).
    pub fn bits(self) -> u32 {
        match self {
            ScalarType::Bool | ScalarType::I8 | ScalarType::U8 => 8,
            ScalarType::I16 | ScalarType::U16 => 16,
            ScalarType::I32 | ScalarType::U32 | ScalarType::F32 => 32,
            ScalarType::I64 | ScalarType::U64 | ScalarType::F64 => 64,
        }
    }

    /// f32 or f64.
    pub fn is_float(self) -> bool {
        matches!(self, ScalarType::F32 | ScalarType::F64)
    }

    /// A signed or unsigned integer type (not `Bool`).
    pub fn is_int(self) -> bool {
        !self.is_float() && self != ScalarType::Bool
    }

    /// A signed integer type.
    pub fn is_signed(self) -> bool {
        matches!(self, ScalarType::I8 | ScalarType::I16 | ScalarType::I32 | ScalarType::I64)
    }

    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        self.dtype().name()
    }

    /// Bits of the constant `x` in this type (rounded for floats, wrapped for integers,
    /// `x != 0` for `Bool`).
    pub fn bits_of_f64(self, x: f64) -> u64 {
        match self {
            ScalarType::F32 => (x as f32).to_bits() as u64,
            ScalarType::F64 => x.to_bits(),
            ScalarType::Bool => (x != 0.0) as u64,
            t if t.is_signed() => self.wrap(x as i64 as u64),
            _ => self.wrap(x as u64),
        }
    }

    /// Bits of the integer constant `x` in this type.
    pub fn bits_of_i64(self, x: i64) -> u64 {
        match self {
            ScalarType::F32 => (x as f32).to_bits() as u64,
            ScalarType::F64 => (x as f64).to_bits(),
            ScalarType::Bool => (x != 0) as u64,
            _ => self.wrap(x as u64),
        }
    }

    /// Truncates `bits` to this type's width (zero-extended canonical form).
    pub fn wrap(self, bits: u64) -> u64 {
        match self.bits() {
            64 => bits,
            b => bits & ((1u64 << b) - 1),
        }
    }

    /// The signed value of canonical integer `bits` (zero-extended) of this type.
    pub fn to_i128(self, bits: u64) -> i128 {
        if self.is_signed() {
            let sh = 64 - self.bits();
            (((bits << sh) as i64) >> sh) as i128
        } else {
            bits as i128
        }
    }

    /// The smallest and largest values of an integer type.
    pub fn int_range(self) -> (i128, i128) {
        let b = self.bits();
        match self {
            ScalarType::Bool => (0, 1),
            t if t.is_signed() => (-(1i128 << (b - 1)), (1i128 << (b - 1)) - 1),
            _ => (0, (1i128 << b) - 1),
        }
    }
}

impl fmt::Display for ScalarType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An index variable of a kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub u32);

/// A node of a kernel's expression arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExprId(pub u32);

impl ExprId {
    /// Position in [`Kernel::nodes`].
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// What a load does with an index outside its tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bounds {
    /// Never happens: the verifier proves it from the variables' ranges.
    InBounds,
    /// Reads this value (bits in the load's compute type).
    Pad(u64),
    /// Each index is clamped into `0..dim`.
    Clamp,
}

/// One-operand operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum UnaryOp {
    Neg,
    Abs,
    Not,
    Sqrt,
    Exp,
    Log,
    Tanh,
    Erf,
    Sin,
    Cos,
    Tan,
    Asin,
    Acos,
    Atan,
    Sinh,
    Cosh,
    Asinh,
    Acosh,
    Atanh,
    Floor,
    Ceil,
    /// Round half to even.
    Round,
    Trunc,
    /// `Bool` result.
    IsNan,
}

impl UnaryOp {
    /// All unary operations.
    pub const ALL: [UnaryOp; 24] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Not,
        UnaryOp::Sqrt,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Tan,
        UnaryOp::Asin,
        UnaryOp::Acos,
        UnaryOp::Atan,
        UnaryOp::Sinh,
        UnaryOp::Cosh,
        UnaryOp::Asinh,
        UnaryOp::Acosh,
        UnaryOp::Atanh,
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Trunc,
        UnaryOp::IsNan,
    ];

    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Not => "not",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Tan => "tan",
            UnaryOp::Asin => "asin",
            UnaryOp::Acos => "acos",
            UnaryOp::Atan => "atan",
            UnaryOp::Sinh => "sinh",
            UnaryOp::Cosh => "cosh",
            UnaryOp::Asinh => "asinh",
            UnaryOp::Acosh => "acosh",
            UnaryOp::Atanh => "atanh",
            UnaryOp::Floor => "floor",
            UnaryOp::Ceil => "ceil",
            UnaryOp::Round => "round",
            UnaryOp::Trunc => "trunc",
            UnaryOp::IsNan => "isnan",
        }
    }

    /// Only defined on floats.
    pub fn float_only(self) -> bool {
        !matches!(self, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Not)
    }
}

/// Two-operand operations (operands of one type).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Pow,
    Min,
    Max,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    Xor,
    Shl,
    Shr,
}

impl BinaryOp {
    /// All binary operations.
    pub const ALL: [BinaryOp; 19] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Rem,
        BinaryOp::Pow,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::Eq,
        BinaryOp::Ne,
        BinaryOp::Lt,
        BinaryOp::Le,
        BinaryOp::Gt,
        BinaryOp::Ge,
        BinaryOp::And,
        BinaryOp::Or,
        BinaryOp::Xor,
        BinaryOp::Shl,
        BinaryOp::Shr,
    ];

    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Pow => "pow",
            BinaryOp::Min => "min",
            BinaryOp::Max => "max",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::Xor => "xor",
            BinaryOp::Shl => "shl",
            BinaryOp::Shr => "shr",
        }
    }

    /// Gives `Bool`.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }

    /// Whether the operation takes operands of type `t` (the verifier's rule: `pow` on
    /// floats, the bitwise ones on integers and bool, shifts on integers, arithmetic on
    /// anything but bool, comparisons, `max` and `min` on every type).
    pub fn accepts(self, t: ScalarType) -> bool {
        match self {
            BinaryOp::Pow => t.is_float(),
            BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => !t.is_float(),
            BinaryOp::Shl | BinaryOp::Shr => t.is_int(),
            BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Rem => t != ScalarType::Bool,
            _ => true,
        }
    }
}

/// Folding operations of [`Expr::Reduce`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (identity 0).
    Sum,
    /// Product (identity 1).
    Prod,
    /// Maximum (identity: the type's lowest value, -inf for floats).
    Max,
    /// Minimum (identity: the type's highest value, +inf for floats).
    Min,
    /// Position of the maximum over one variable (i64).
    ArgMax {
        /// The last position among equal maxima instead of the first.
        last: bool,
    },
    /// Position of the minimum over one variable (i64).
    ArgMin {
        /// The last position among equal minima instead of the first.
        last: bool,
    },
}

impl ReduceOp {
    /// Every reduction, each arg-reduction with both tie rules.
    pub const ALL: [ReduceOp; 8] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::ArgMax { last: false },
        ReduceOp::ArgMax { last: true },
        ReduceOp::ArgMin { last: false },
        ReduceOp::ArgMin { last: true },
    ];

    /// Lower-case name, as printed.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::ArgMax { last: false } => "argmax",
            ReduceOp::ArgMax { last: true } => "argmax.last",
            ReduceOp::ArgMin { last: false } => "argmin",
            ReduceOp::ArgMin { last: true } => "argmin.last",
        }
    }

    /// ArgMax or ArgMin.
    pub fn is_arg(self) -> bool {
        matches!(self, ReduceOp::ArgMax { .. } | ReduceOp::ArgMin { .. })
    }
}

/// One expression node; its type is kept beside it in [`Node`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// The value of an index variable (i64).
    Var(VarId),
    /// A constant, as bits of the node's type (zero-extended integers, IEEE floats).
    Const(u64),
    /// An element of an input.
    Load {
        /// Input number.
        input: u32,
        /// One i64 expression per dimension of the input.
        index: Vec<ExprId>,
        /// What an index outside the tensor does.
        bounds: Bounds,
    },
    /// `op(a)`.
    Unary(UnaryOp, ExprId),
    /// `op(a, b)`.
    Binary(BinaryOp, ExprId, ExprId),
    /// `cond ? then : otherwise` (cond is `Bool`).
    Select(ExprId, ExprId, ExprId),
    /// Conversion of a value to the values of storage dtype `to` (see the module docs);
    /// the node's type is `ScalarType::of_storage(to)`.
    Cast {
        /// The value.
        value: ExprId,
        /// The dtype whose values it is converted to.
        to: DType,
        /// Saturate out-of-range values for the 8-bit float types.
        saturate: bool,
    },
    /// A fold of `body` over every combination of `vars`.
    Reduce {
        /// The folding operation.
        op: ReduceOp,
        /// The variables introduced, outermost first.
        vars: Vec<VarId>,
        /// The folded value.
        body: ExprId,
    },
}

/// An expression and its type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Node {
    /// Type of the value.
    pub ty: ScalarType,
    /// The operation.
    pub expr: Expr,
}

/// The store of a scatter kernel (see the module docs' "Scatter kernels").
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scatter {
    /// Rank of the iteration domain: variables `0..rank` are its index.
    pub rank: usize,
    /// The flat output element each point stores at (i64; outside the output: none).
    pub at: ExprId,
    /// How the value combines with the element already there (`add`, `mul`, `min`,
    /// `max`, and `or`/`and` for bool); `None`: it replaces the element.
    pub combine: Option<BinaryOp>,
}

impl Scatter {
    /// Whether `op` may combine values of type `t` in a scatter.
    pub fn combines(op: BinaryOp, t: ScalarType) -> bool {
        match op {
            BinaryOp::Add | BinaryOp::Mul | BinaryOp::Min | BinaryOp::Max => t != ScalarType::Bool,
            BinaryOp::And | BinaryOp::Or => t == ScalarType::Bool,
            _ => false,
        }
    }
}

/// A kernel (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// A name for listings and symbols (`[A-Za-z0-9_]`).
    pub name: String,
    /// Types of the inputs, in binding order.
    pub inputs: Vec<TensorType>,
    /// Type of the output (bound after the inputs).
    pub output: TensorType,
    /// Extent of every variable; `0..output rank` are the output's index.
    pub vars: Vec<u64>,
    /// The expression arena; operands precede their users.
    pub nodes: Vec<Node>,
    /// The value stored at each output index (at each point of a scatter's domain).
    pub root: ExprId,
    /// A scatter store instead of one value per output element.
    pub scatter: Option<Scatter>,
}

impl Expr {
    /// Calls `f` on each operand node, in order.
    pub fn for_each_operand(&self, mut f: impl FnMut(ExprId)) {
        match self {
            Expr::Var(_) | Expr::Const(_) => {}
            Expr::Load { index, .. } => index.iter().for_each(|&e| f(e)),
            Expr::Unary(_, a) | Expr::Cast { value: a, .. } | Expr::Reduce { body: a, .. } => f(*a),
            Expr::Binary(_, a, b) => {
                f(*a);
                f(*b);
            }
            Expr::Select(c, a, b) => {
                f(*c);
                f(*a);
                f(*b);
            }
        }
    }

    /// The same expression with each operand node `e` replaced by `f(e)` (for passes
    /// that copy a kernel node by node into a builder).
    pub fn map_operands(&self, mut f: impl FnMut(ExprId) -> ExprId) -> Expr {
        match self {
            Expr::Var(_) | Expr::Const(_) => self.clone(),
            Expr::Load { input, index, bounds } => {
                Expr::Load { input: *input, index: index.iter().map(|&e| f(e)).collect(), bounds: *bounds }
            }
            Expr::Unary(op, a) => Expr::Unary(*op, f(*a)),
            Expr::Cast { value, to, saturate } => Expr::Cast { value: f(*value), to: *to, saturate: *saturate },
            Expr::Reduce { op, vars, body } => Expr::Reduce { op: *op, vars: vars.clone(), body: f(*body) },
            Expr::Binary(op, a, b) => Expr::Binary(*op, f(*a), f(*b)),
            Expr::Select(c, a, b) => Expr::Select(f(*c), f(*a), f(*b)),
        }
    }

    /// [`Expr::map_operands`] with a mapping that may fail: `None` as soon as `f` has no
    /// node for an operand.
    pub fn try_map_operands(&self, mut f: impl FnMut(ExprId) -> Option<ExprId>) -> Option<Expr> {
        let mut ok = true;
        let e = self.map_operands(|o| {
            f(o).unwrap_or_else(|| {
                ok = false;
                o
            })
        });
        ok.then_some(e)
    }
}

impl Kernel {
    /// The variables each node depends on (sorted, without duplicates): its own `Var`s
    /// and its operands', less the variables a `Reduce` binds.
    pub fn free_vars(&self) -> Vec<Vec<u32>> {
        let mut free: Vec<Vec<u32>> = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            let mut fv: Vec<u32> = Vec::new();
            node.expr.for_each_operand(|e| fv.extend_from_slice(&free[e.index()]));
            match &node.expr {
                Expr::Var(v) => fv.push(v.0),
                Expr::Reduce { vars, .. } => fv.retain(|v| !vars.iter().any(|w| w.0 == *v)),
                _ => {}
            }
            fv.sort_unstable();
            fv.dedup();
            free.push(fv);
        }
        free
    }

    /// Drops the nodes the root does not depend on (left behind by simplification and
    /// by rebuilding), keeping the operands-first order.
    fn prune(&mut self) {
        let n = self.nodes.len();
        if self.root.index() >= n {
            return;
        }
        let mut live = vec![false; n];
        live[self.root.index()] = true;
        if let Some(sc) = &self.scatter {
            if let Some(l) = live.get_mut(sc.at.index()) {
                *l = true;
            }
        }
        for i in (0..n).rev() {
            if !live[i] {
                continue;
            }
            self.nodes[i].expr.for_each_operand(|e| {
                if let Some(l) = live.get_mut(e.index()) {
                    *l = true;
                }
            });
        }
        if live.iter().all(|&l| l) {
            return;
        }
        let mut new_id = vec![ExprId(0); n];
        let mut nodes = Vec::with_capacity(n);
        for (i, node) in std::mem::take(&mut self.nodes).into_iter().enumerate() {
            if !live[i] {
                continue;
            }
            let m = |e: ExprId| new_id.get(e.index()).copied().unwrap_or(e);
            let expr = match node.expr {
                Expr::Load { input, index, bounds } => {
                    Expr::Load { input, index: index.into_iter().map(m).collect(), bounds }
                }
                Expr::Unary(op, a) => Expr::Unary(op, m(a)),
                Expr::Cast { value, to, saturate } => Expr::Cast { value: m(value), to, saturate },
                Expr::Reduce { op, vars, body } => Expr::Reduce { op, vars, body: m(body) },
                Expr::Binary(op, a, b) => Expr::Binary(op, m(a), m(b)),
                Expr::Select(c, a, b) => Expr::Select(m(c), m(a), m(b)),
                e @ (Expr::Var(_) | Expr::Const(_)) => e,
            };
            new_id[i] = ExprId(nodes.len() as u32);
            nodes.push(Node { ty: node.ty, expr });
        }
        self.root = new_id[self.root.index()];
        if let Some(sc) = &mut self.scatter {
            sc.at = new_id.get(sc.at.index()).copied().unwrap_or(sc.at);
        }
        self.nodes = nodes;
    }
}

/// A malformed kernel (a bug in a lowering or a pass, reported instead of run).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// Operand types do not fit the operation.
    #[error("kernel {kernel}: node e{node}: {what}")]
    Type {
        /// Kernel name.
        kernel: String,
        /// Node index.
        node: u32,
        /// Description.
        what: String,
    },
    /// A node refers to something that does not exist or is out of scope.
    #[error("kernel {kernel}: node e{node}: {what}")]
    Structure {
        /// Kernel name.
        kernel: String,
        /// Node index.
        node: u32,
        /// Description.
        what: String,
    },
    /// An `InBounds` load whose index cannot be proved in range.
    #[error("kernel {kernel}: node e{node}: index {dim} of input {input} spans {lo}..={hi}, outside 0..{extent}")]
    OutOfBounds {
        /// Kernel name.
        kernel: String,
        /// Node index.
        node: u32,
        /// Input number.
        input: u32,
        /// Dimension.
        dim: usize,
        /// Lowest possible index.
        lo: i128,
        /// Highest possible index.
        hi: i128,
        /// The dimension's extent.
        extent: usize,
    },
}

impl Kernel {
    /// The node behind `id`.
    pub fn node(&self, id: ExprId) -> &Node {
        &self.nodes[id.index()]
    }

    /// Whether node `e` reads a kernel input (a `Load` in its expression).
    pub fn reads_an_input(&self, e: ExprId) -> bool {
        let mut stack = vec![e];
        let mut seen = vec![false; self.nodes.len()];
        while let Some(n) = stack.pop() {
            if std::mem::replace(&mut seen[n.index()], true) {
                continue;
            }
            if matches!(self.node(n).expr, Expr::Load { .. }) {
                return true;
            }
            self.node(n).expr.for_each_operand(|o| stack.push(o));
        }
        false
    }

    /// Number of output index variables.
    pub fn out_rank(&self) -> usize {
        self.output.shape.rank()
    }

    /// Number of variables the store iterates: the output's rank, or a scatter's domain
    /// rank.
    pub fn index_rank(&self) -> usize {
        self.scatter.as_ref().map_or(self.out_rank(), |s| s.rank)
    }

    /// The iteration's extents: the output's dimensions, or a scatter's domain.
    pub fn index_dims(&self) -> &[u64] {
        &self.vars[..self.index_rank().min(self.vars.len())]
    }

    /// Checks types, references, variable scopes and the bounds of every `InBounds` load.
    pub fn verify(&self) -> Result<(), KernelError> {
        let name = &self.name;
        let ty_err = |node: usize, what: String| KernelError::Type { kernel: name.clone(), node: node as u32, what };
        let st_err =
            |node: usize, what: String| KernelError::Structure { kernel: name.clone(), node: node as u32, what };
        let rank = self.index_rank();
        if self.vars.len() < rank {
            return Err(st_err(0, "the domain has more dimensions than there are variables".into()));
        }
        if self.scatter.is_none()
            && self.vars[..rank] != *self.output.shape.dims().iter().map(|&d| d as u64).collect::<Vec<_>>()
        {
            return Err(st_err(0, "the first variables must be the output's dimensions".into()));
        }
        if self.scatter.is_some() {
            let ct = ScalarType::of_storage(self.output.dtype);
            if ct.dtype() != self.output.dtype || self.inputs.first() != Some(&self.output) {
                return Err(st_err(
                    0,
                    format!("a scatter's output ({}) must be a plain type and input 0's type", self.output),
                ));
            }
        }
        // Which reduce owns each variable (None: output variable).
        let mut owner: Vec<Option<usize>> = vec![None; self.vars.len()];
        // Free variables of each node: a sorted small set.
        let mut free: Vec<Vec<u32>> = Vec::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            let operand = |e: ExprId| -> Result<&Node, KernelError> {
                if e.index() >= i {
                    return Err(st_err(i, format!("operand e{} does not precede its user", e.0)));
                }
                Ok(&self.nodes[e.index()])
            };
            let mut fv: Vec<u32> = Vec::new();
            let take = |e: ExprId, fv: &mut Vec<u32>| {
                for &v in &free[e.index()] {
                    if !fv.contains(&v) {
                        fv.push(v);
                    }
                }
            };
            match &n.expr {
                Expr::Var(v) => {
                    if v.0 as usize >= self.vars.len() {
                        return Err(st_err(i, format!("variable v{} does not exist", v.0)));
                    }
                    if n.ty != ScalarType::I64 {
                        return Err(ty_err(i, "variables are i64".into()));
                    }
                    fv.push(v.0);
                }
                Expr::Const(bits) => {
                    if n.ty.wrap(*bits) != *bits {
                        return Err(ty_err(i, format!("constant bits {bits:#x} do not fit {}", n.ty)));
                    }
                }
                Expr::Load { input, index, bounds } => {
                    let Some(t) = self.inputs.get(*input as usize) else {
                        return Err(st_err(i, format!("input {input} does not exist")));
                    };
                    if index.len() != t.shape.rank() {
                        return Err(st_err(
                            i,
                            format!("{} indices for input {input} of rank {}", index.len(), t.shape.rank()),
                        ));
                    }
                    if n.ty != ScalarType::of_storage(t.dtype) {
                        return Err(ty_err(
                            i,
                            format!("a load of {} gives {}", t.dtype.name(), ScalarType::of_storage(t.dtype)),
                        ));
                    }
                    for &e in index {
                        if operand(e)?.ty != ScalarType::I64 {
                            return Err(ty_err(i, "indices are i64".into()));
                        }
                        take(e, &mut fv);
                    }
                    if let Bounds::Pad(bits) = bounds {
                        if n.ty.wrap(*bits) != *bits {
                            return Err(ty_err(i, "pad value does not fit the load's type".into()));
                        }
                    }
                }
                Expr::Unary(op, a) => {
                    let at = operand(*a)?.ty;
                    let want = if *op == UnaryOp::IsNan { ScalarType::Bool } else { at };
                    if (op.float_only() && !at.is_float())
                        || (*op == UnaryOp::Neg && at == ScalarType::Bool)
                        || n.ty != want
                    {
                        return Err(ty_err(i, format!("{} of {at} cannot give {}", op.name(), n.ty)));
                    }
                    take(*a, &mut fv);
                }
                Expr::Binary(op, a, b) => {
                    let (at, bt) = (operand(*a)?.ty, operand(*b)?.ty);
                    let want = if op.is_comparison() { ScalarType::Bool } else { at };
                    if at != bt || !op.accepts(at) || n.ty != want {
                        return Err(ty_err(i, format!("{} of {at} and {bt} cannot give {}", op.name(), n.ty)));
                    }
                    take(*a, &mut fv);
                    take(*b, &mut fv);
                }
                Expr::Select(c, a, b) => {
                    let (ct, at, bt) = (operand(*c)?.ty, operand(*a)?.ty, operand(*b)?.ty);
                    if ct != ScalarType::Bool || at != bt || n.ty != at {
                        return Err(ty_err(i, format!("select({ct}, {at}, {bt}) cannot give {}", n.ty)));
                    }
                    take(*c, &mut fv);
                    take(*a, &mut fv);
                    take(*b, &mut fv);
                }
                Expr::Cast { value, to, .. } => {
                    operand(*value)?;
                    if n.ty != ScalarType::of_storage(*to) {
                        return Err(ty_err(
                            i,
                            format!("a cast to {} gives {}", to.name(), ScalarType::of_storage(*to)),
                        ));
                    }
                    take(*value, &mut fv);
                }
                Expr::Reduce { op, vars, body } => {
                    let bt = operand(*body)?.ty;
                    let want = if op.is_arg() { ScalarType::I64 } else { bt };
                    if n.ty != want || (matches!(op, ReduceOp::Sum | ReduceOp::Prod) && bt == ScalarType::Bool) {
                        return Err(ty_err(i, format!("reduce.{} of {bt} cannot give {}", op.name(), n.ty)));
                    }
                    if vars.is_empty() || (op.is_arg() && vars.len() != 1) {
                        return Err(st_err(i, format!("reduce.{} over {} variables", op.name(), vars.len())));
                    }
                    take(*body, &mut fv);
                    for v in vars {
                        let k = v.0 as usize;
                        if k < rank || k >= self.vars.len() {
                            return Err(st_err(i, format!("v{} is not a reduction variable", v.0)));
                        }
                        if owner[k].replace(i).is_some() {
                            return Err(st_err(i, format!("v{} is introduced twice", v.0)));
                        }
                        fv.retain(|&x| x != v.0);
                    }
                }
            }
            fv.sort_unstable();
            free.push(fv);
        }
        if self.root.index() >= self.nodes.len() {
            return Err(st_err(self.root.index(), "root does not exist".into()));
        }
        if self.node(self.root).ty != ScalarType::of_storage(self.output.dtype) {
            return Err(ty_err(
                self.root.index(),
                format!("root is {} but the output stores {}", self.node(self.root).ty, self.output.dtype.name()),
            ));
        }
        // A reduce variable read by a node outside its reduce propagates, through the
        // users of that node, up to the root (only its own reduce removes it), so
        // checking the root's free variables checks every scope.
        if let Some(&v) = free[self.root.index()].iter().find(|&&v| v as usize >= rank) {
            return Err(st_err(self.root.index(), format!("v{v} is used outside the reduce that introduces it")));
        }
        if let Some(sc) = &self.scatter {
            let at = sc.at.index();
            let Some(n) = self.nodes.get(at) else {
                return Err(st_err(at, "the scatter position does not exist".into()));
            };
            if n.ty != ScalarType::I64 {
                return Err(ty_err(at, "the scatter position is i64".into()));
            }
            if let Some(&v) = free[at].iter().find(|&&v| v as usize >= rank) {
                return Err(st_err(at, format!("v{v} is used outside the reduce that introduces it")));
            }
            if let Some(op) = sc.combine {
                if !Scatter::combines(op, self.node(self.root).ty) {
                    return Err(ty_err(
                        self.root.index(),
                        format!("a scatter cannot combine {} values with {}", self.node(self.root).ty, op.name()),
                    ));
                }
            }
        }
        self.check_bounds()
    }

    /// Ranges of the integer nodes, for the bounds check.
    fn check_bounds(&self) -> Result<(), KernelError> {
        let ranges = self.int_ranges();
        for (i, n) in self.nodes.iter().enumerate() {
            if let Expr::Load { input, index, bounds: Bounds::InBounds } = &n.expr {
                let t = &self.inputs[*input as usize];
                for (d, (&e, &extent)) in index.iter().zip(t.shape.dims()).enumerate() {
                    let (lo, hi) = ranges[e.index()];
                    if lo < 0 || hi >= extent as i128 {
                        return Err(KernelError::OutOfBounds {
                            kernel: self.name.clone(),
                            node: i as u32,
                            input: *input,
                            dim: d,
                            lo,
                            hi,
                            extent,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// A sound interval for the value of every node (integer types; floats and unknown
    /// values get the type's full range).
    pub fn int_ranges(&self) -> Vec<(i128, i128)> {
        let mut r: Vec<(i128, i128)> = Vec::with_capacity(self.nodes.len());
        for n in &self.nodes {
            let v = self.node_range(n, &r);
            r.push(v);
        }
        r
    }

    /// The interval of node `n` from `r`, the intervals of the nodes before it.
    fn node_range(&self, n: &Node, r: &[(i128, i128)]) -> (i128, i128) {
        let full = if n.ty.is_float() { (i128::MIN / 4, i128::MAX / 4) } else { n.ty.int_range() };
        let clamp = |(lo, hi): (i128, i128)| -> (i128, i128) {
            if lo < full.0 || hi > full.1 {
                full
            } else {
                (lo, hi)
            }
        };
        match &n.expr {
            Expr::Var(v) => (0, (self.vars[v.0 as usize] as i128 - 1).max(0)),
            Expr::Const(bits) if !n.ty.is_float() => {
                let x = n.ty.to_i128(*bits);
                (x, x)
            }
            Expr::Binary(op, a, b) if n.ty.is_int() => {
                let (a, b) = (r[a.index()], r[b.index()]);
                match op {
                    // Wide operands (u64) can overflow i128: then the range is the type's.
                    BinaryOp::Add => match (a.0.checked_add(b.0), a.1.checked_add(b.1)) {
                        (Some(lo), Some(hi)) => clamp((lo, hi)),
                        _ => full,
                    },
                    BinaryOp::Sub => match (a.0.checked_sub(b.1), a.1.checked_sub(b.0)) {
                        (Some(lo), Some(hi)) => clamp((lo, hi)),
                        _ => full,
                    },
                    BinaryOp::Mul => {
                        let c =
                            [a.0.checked_mul(b.0), a.0.checked_mul(b.1), a.1.checked_mul(b.0), a.1.checked_mul(b.1)];
                        if c.iter().all(Option::is_some) {
                            let c = c.map(|x| x.unwrap_or(0));
                            clamp((*c.iter().min().unwrap_or(&0), *c.iter().max().unwrap_or(&0)))
                        } else {
                            full
                        }
                    }
                    BinaryOp::Div if b.0 > 0 => {
                        let c = [a.0 / b.0, a.0 / b.1, a.1 / b.0, a.1 / b.1];
                        (*c.iter().min().unwrap_or(&0), *c.iter().max().unwrap_or(&0))
                    }
                    BinaryOp::Rem if b.0 > 0 => {
                        if a.0 >= 0 {
                            (0, a.1.min(b.1 - 1))
                        } else {
                            (-(b.1 - 1), b.1 - 1)
                        }
                    }
                    BinaryOp::Min => (a.0.min(b.0), a.1.min(b.1)),
                    BinaryOp::Max => (a.0.max(b.0), a.1.max(b.1)),
                    _ => full,
                }
            }
            Expr::Select(_, a, b) => {
                let (a, b) = (r[a.index()], r[b.index()]);
                (a.0.min(b.0), a.1.max(b.1))
            }
            Expr::Cast { value, .. } if n.ty.is_int() && !self.node(*value).ty.is_float() => clamp(r[value.index()]),
            _ => full,
        }
    }
}

/// Builds a [`Kernel`]; type errors are recorded and returned by [`KernelBuilder::finish`],
/// so lowering code reads as straight-line expressions. Identical nodes are shared.
#[derive(Debug)]
pub struct KernelBuilder {
    k: Kernel,
    memo: HashMap<Node, ExprId>,
    /// [`Kernel::int_ranges`] of the nodes built so far.
    ranges: Vec<(i128, i128)>,
    error: Option<String>,
    /// Whether [`KernelBuilder::split_multiples`] folds quotients (off unless asked:
    /// [`KernelBuilder::take_apart_multiples`]).
    split: bool,
}

impl KernelBuilder {
    /// A kernel named `name` over these inputs and output; the output's index variables
    /// exist already ([`KernelBuilder::out_index`]).
    pub fn new(name: impl Into<String>, inputs: Vec<TensorType>, output: TensorType) -> KernelBuilder {
        let vars = output.shape.dims().iter().map(|&d| d as u64).collect();
        KernelBuilder {
            k: Kernel { name: name.into(), inputs, output, vars, nodes: Vec::new(), root: ExprId(0), scatter: None },
            memo: HashMap::new(),
            ranges: Vec::new(),
            error: None,
            split: false,
        }
    }

    /// A builder for a rewrite of `k` over `inputs`: `k`'s name and output, and its
    /// reduction variables already made in `k`'s order (so `k`'s `VarId`s stay valid).
    pub fn rewriting(k: &Kernel, inputs: Vec<TensorType>) -> KernelBuilder {
        let mut b = KernelBuilder::new(k.name.clone(), inputs, k.output.clone());
        for &e in &k.vars[k.out_rank()..] {
            b.new_var(e);
        }
        b
    }

    /// Also take apart quotients and remainders of sums with multiples of the divisor
    /// in them ([`KernelBuilder::split_multiples`]), for a pass that rebuilds a kernel
    /// no fast path takes. (Not while forming dispatches: simpler indices change what
    /// fusion takes, and a fused layout change can then leave the row kernels.)
    pub fn take_apart_multiples(&mut self) {
        self.split = true;
    }

    /// The kernel's inputs.
    pub fn inputs(&self) -> &[TensorType] {
        &self.k.inputs
    }

    /// The kernel's output type.
    pub fn output(&self) -> &TensorType {
        &self.k.output
    }

    /// Type of a node built so far.
    pub fn ty(&self, e: ExprId) -> ScalarType {
        self.k.nodes.get(e.index()).map_or(ScalarType::I64, |n| n.ty)
    }

    /// The node behind `e`.
    pub fn node(&self, e: ExprId) -> Option<&Node> {
        self.k.nodes.get(e.index())
    }

    /// Records a lowering error (the first one wins); `finish` returns it.
    pub fn fail(&mut self, what: impl Into<String>) {
        if self.error.is_none() {
            self.error = Some(what.into());
        }
    }

    fn push(&mut self, ty: ScalarType, expr: Expr) -> ExprId {
        match expr {
            Expr::Binary(op, a, b) => {
                if let Some(e) = self.simplify(ty, op, a, b) {
                    return e;
                }
            }
            Expr::Select(c, a, b) => {
                if let Some(e) = self.choose(c, a, b) {
                    return e;
                }
            }
            _ => {}
        }
        let node = Node { ty, expr };
        if let Some(&id) = self.memo.get(&node) {
            return id;
        }
        let id = ExprId(self.k.nodes.len() as u32);
        let range = self.k.node_range(&node, &self.ranges);
        self.ranges.push(range);
        self.k.nodes.push(node.clone());
        self.memo.insert(node, id);
        id
    }

    /// Integer identities and constant arithmetic, so index maps built from shapes
    /// (`0 * 6 + i`, `x / 1`, `x % 1`) and maps composed by fusion carry no dead
    /// arithmetic into the generated code. Wrapping semantics, as the kernel defines
    /// them; floats are left alone (`x + 0` is not `x` for `x = -0`).
    ///
    /// Also comparisons, `min` and `max` of integer constants, and a quotient by a
    /// constant that every value of the dividend shares, with its remainder: a fused chain
    /// of loop trips selects its pieces by comparing constants (chars2vec's LSTM scan
    /// output, a `Concat` of 20 trips' states then a `Slice` of the last: every piece's
    /// gate products were computed and 19 of them discarded, and the clamped,
    /// wrapped indices of the discarded ones kept the kernel off the vector paths).
    fn simplify(&mut self, ty: ScalarType, op: BinaryOp, a: ExprId, b: ExprId) -> Option<ExprId> {
        let n = |e: ExprId| self.k.nodes.get(e.index());
        let (na, nb) = (n(a)?, n(b)?);
        if op.is_comparison() && ty == ScalarType::Bool && na.ty.is_int() && nb.ty == na.ty {
            let t = na.ty;
            let (Expr::Const(x), Expr::Const(y)) = (&na.expr, &nb.expr) else { return None };
            let (x, y) = (t.to_i128(*x), t.to_i128(*y));
            let holds = match op {
                BinaryOp::Eq => x == y,
                BinaryOp::Ne => x != y,
                BinaryOp::Lt => x < y,
                BinaryOp::Le => x <= y,
                BinaryOp::Gt => x > y,
                _ => x >= y,
            };
            return Some(self.push(ScalarType::Bool, Expr::Const(u64::from(holds))));
        }
        if !ty.is_int() || na.ty != ty || nb.ty != ty {
            return None;
        }
        // Where `a` is never negative and `c` > 0, the quotient `q` when every value of
        // `a` has the same one (then `a % c` is `a − q·c`).
        let quotient = |c: i128| -> Option<i128> {
            let &(lo, hi) = self.ranges.get(a.index())?;
            // (`then`, not `then_some`: a divisor of 0 must not be divided by.)
            (c > 0 && lo >= 0 && lo / c == hi / c).then(|| lo / c)
        };
        let c = |node: &Node| match node.expr {
            Expr::Const(bits) => Some(ty.to_i128(bits)),
            _ => None,
        };
        let (ca, cb) = (c(na), c(nb));
        let folded = |x: i128| ty.wrap(x as u64);
        match (op, ca, cb) {
            (BinaryOp::Add, Some(x), Some(y)) => Some(self.push(ty, Expr::Const(folded(x.wrapping_add(y))))),
            (BinaryOp::Sub, Some(x), Some(y)) => Some(self.push(ty, Expr::Const(folded(x.wrapping_sub(y))))),
            (BinaryOp::Mul, Some(x), Some(y)) => Some(self.push(ty, Expr::Const(folded(x.wrapping_mul(y))))),
            (BinaryOp::Add, Some(0), _) => Some(b),
            (BinaryOp::Add | BinaryOp::Sub, _, Some(0)) => Some(a),
            (BinaryOp::Mul, Some(1), _) => Some(b),
            (BinaryOp::Mul | BinaryOp::Div, _, Some(1)) => Some(a),
            (BinaryOp::Mul, Some(0), _) | (BinaryOp::Mul, _, Some(0)) => Some(self.push(ty, Expr::Const(0))),
            (BinaryOp::Rem, _, Some(1)) => Some(self.push(ty, Expr::Const(0))),
            (BinaryOp::Min, Some(x), Some(y)) => Some(self.push(ty, Expr::Const(folded(x.min(y))))),
            (BinaryOp::Max, Some(x), Some(y)) => Some(self.push(ty, Expr::Const(folded(x.max(y))))),
            (BinaryOp::Min | BinaryOp::Max, _, _) if a == b => Some(a),
            // A quotient that is the same for every value of `a` (`(79 + v) · 768 + i`
            // over `v < 1`, `i < 768`, divided by 768): the constant, and the remainder
            // `a` less its multiple (`a` itself where the quotient is 0).
            (BinaryOp::Div, _, Some(c)) => match quotient(c) {
                Some(q) => Some(self.push(ty, Expr::Const(folded(q)))),
                None => self.split_multiples(ty, op, a, c),
            },
            (BinaryOp::Rem, _, Some(c)) => {
                let Some(q) = quotient(c) else { return self.split_multiples(ty, op, a, c) };
                if q == 0 {
                    return Some(a);
                }
                let m = self.push(ty, Expr::Const(folded(q * c)));
                Some(self.push(ty, Expr::Binary(BinaryOp::Sub, a, m)))
            }
            _ => None,
        }
    }

    /// `a div c` or `a rem c` (`c > 0`, i64) where `a` is a sum whose terms are never
    /// negative and some of them multiples of `c` (`t·m`, `m` a multiple of `c`): the
    /// rest's quotient plus each `t·(m / c)`, or the rest's remainder. A flat index taken
    /// apart again (`(36·v + x) rem 36` and `div 36`, a Transpose fused behind a Concat)
    /// then reads `v` directly, and `x rem 36` folds further where `x`'s range allows.
    fn split_multiples(&mut self, ty: ScalarType, op: BinaryOp, a: ExprId, c: i128) -> Option<ExprId> {
        let nonneg = |s: &Self, e: ExprId| s.ranges.get(e.index()).is_some_and(|r| r.0 >= 0);
        if !self.split || ty != ScalarType::I64 || c <= 0 || !nonneg(self, a) {
            return None;
        }
        let mut terms = Vec::new();
        let mut stack = vec![a];
        while let Some(e) = stack.pop() {
            match self.k.nodes.get(e.index())?.expr {
                Expr::Binary(BinaryOp::Add, x, y) if terms.len() + stack.len() < 16 => {
                    stack.push(y);
                    stack.push(x);
                }
                _ => terms.push(e),
            }
        }
        let constant = |s: &Self, e: ExprId| match s.k.nodes.get(e.index())?.expr {
            Expr::Const(bits) => Some(ty.to_i128(bits)),
            _ => None,
        };
        let (mut multiples, mut rest) = (Vec::new(), Vec::new());
        for t in terms {
            if !nonneg(self, t) {
                return None;
            }
            let multiple = match self.k.nodes.get(t.index())?.expr {
                Expr::Binary(BinaryOp::Mul, x, y) => match (constant(self, x), constant(self, y)) {
                    (_, Some(m)) if m > 0 && m % c == 0 && nonneg(self, x) => Some((x, m / c)),
                    (Some(m), _) if m > 0 && m % c == 0 && nonneg(self, y) => Some((y, m / c)),
                    _ => None,
                },
                _ => None,
            };
            match multiple {
                Some(f) => multiples.push(f),
                None => rest.push(t),
            }
        }
        if multiples.is_empty() {
            return None;
        }
        let mut r = None;
        for t in rest {
            r = Some(match r {
                None => t,
                Some(s) => self.push(ty, Expr::Binary(BinaryOp::Add, s, t)),
            });
        }
        let r = r.unwrap_or_else(|| self.push(ty, Expr::Const(0)));
        if !nonneg(self, r) {
            return None;
        }
        let cn = self.push(ty, Expr::Const(ty.wrap(c as u64)));
        let part = self.push(ty, Expr::Binary(op, r, cn));
        if op == BinaryOp::Rem {
            return Some(part);
        }
        let mut q = part;
        for (t, f) in multiples {
            let fc = self.push(ty, Expr::Const(ty.wrap(f as u64)));
            let tf = self.push(ty, Expr::Binary(BinaryOp::Mul, t, fc));
            q = self.push(ty, Expr::Binary(BinaryOp::Add, q, tf));
        }
        Some(q)
    }

    /// A select whose condition is a constant, or whose two values are one node, is
    /// that value.
    fn choose(&mut self, c: ExprId, a: ExprId, b: ExprId) -> Option<ExprId> {
        if a == b {
            return Some(a);
        }
        let nc = self.k.nodes.get(c.index())?;
        match nc.expr {
            Expr::Const(bits) if nc.ty == ScalarType::Bool => Some(if bits != 0 { a } else { b }),
            _ => None,
        }
    }

    /// A node from its parts, type-checked only when the kernel is finished (for passes
    /// that rebuild kernels node by node).
    pub fn raw(&mut self, ty: ScalarType, expr: Expr) -> ExprId {
        self.push(ty, expr)
    }

    /// Extent of variable `v`.
    pub fn var_extent(&self, v: VarId) -> u64 {
        self.k.vars.get(v.0 as usize).copied().unwrap_or(0)
    }

    /// The output's index: one i64 variable node per output dimension.
    pub fn out_index(&mut self) -> Vec<ExprId> {
        (0..self.k.output.shape.rank()).map(|d| self.var(VarId(d as u32))).collect()
    }

    /// The value of variable `v`.
    pub fn var(&mut self, v: VarId) -> ExprId {
        self.push(ScalarType::I64, Expr::Var(v))
    }

    /// A new reduction variable ranging over `0..extent`.
    pub fn new_var(&mut self, extent: u64) -> VarId {
        self.k.vars.push(extent);
        VarId(self.k.vars.len() as u32 - 1)
    }

    /// A constant from its bits in type `ty`.
    pub fn constant(&mut self, ty: ScalarType, bits: u64) -> ExprId {
        let bits = ty.wrap(bits);
        self.push(ty, Expr::Const(bits))
    }

    /// The constant `x` in type `ty` (rounded, wrapped or `!= 0`).
    pub fn float(&mut self, ty: ScalarType, x: f64) -> ExprId {
        self.constant(ty, ty.bits_of_f64(x))
    }

    /// The integer constant `x` in type `ty`.
    pub fn int(&mut self, ty: ScalarType, x: i64) -> ExprId {
        self.constant(ty, ty.bits_of_i64(x))
    }

    /// An i64 index constant.
    pub fn index(&mut self, x: i64) -> ExprId {
        self.int(ScalarType::I64, x)
    }

    /// Element of input `input` at `index`, which the verifier must prove in bounds.
    pub fn load(&mut self, input: usize, index: Vec<ExprId>) -> ExprId {
        self.load_with(input, index, Bounds::InBounds)
    }

    /// Element of input `input` at `index`, with explicit out-of-bounds behaviour.
    pub fn load_with(&mut self, input: usize, index: Vec<ExprId>, bounds: Bounds) -> ExprId {
        let Some(t) = self.k.inputs.get(input) else {
            self.fail(format!("load from input {input}, which does not exist"));
            return ExprId(0);
        };
        let ty = ScalarType::of_storage(t.dtype);
        self.push(ty, Expr::Load { input: input as u32, index, bounds })
    }

    /// `op(a)`.
    pub fn unary(&mut self, op: UnaryOp, a: ExprId) -> ExprId {
        let at = self.ty(a);
        if (op.float_only() && !at.is_float()) || (op == UnaryOp::Neg && at == ScalarType::Bool) {
            self.fail(format!("{} of {at}", op.name()));
        }
        let ty = if op == UnaryOp::IsNan { ScalarType::Bool } else { at };
        self.push(ty, Expr::Unary(op, a))
    }

    /// `op(a, b)`.
    pub fn binary(&mut self, op: BinaryOp, a: ExprId, b: ExprId) -> ExprId {
        let (at, bt) = (self.ty(a), self.ty(b));
        if at != bt || !op.accepts(at) {
            self.fail(format!("{} of {at} and {bt}", op.name()));
        }
        let ty = if op.is_comparison() { ScalarType::Bool } else { at };
        self.push(ty, Expr::Binary(op, a, b))
    }

    /// `cond ? a : b`.
    pub fn select(&mut self, cond: ExprId, a: ExprId, b: ExprId) -> ExprId {
        let (ct, at, bt) = (self.ty(cond), self.ty(a), self.ty(b));
        if ct != ScalarType::Bool || at != bt {
            self.fail(format!("select({ct}, {at}, {bt})"));
        }
        self.push(at, Expr::Select(cond, a, b))
    }

    /// Conversion to the values of dtype `to` (ONNX `Cast`; `saturate` matters for the
    /// 8-bit floats only). A cast to the value's own compute type is the value itself.
    pub fn cast(&mut self, a: ExprId, to: DType, saturate: bool) -> ExprId {
        let ty = ScalarType::of_storage(to);
        if ty.dtype() == to && self.ty(a) == ty {
            return a;
        }
        self.push(ty, Expr::Cast { value: a, to, saturate })
    }

    /// Conversion to compute type `ty` (no narrowing storage rounding involved).
    pub fn convert(&mut self, a: ExprId, ty: ScalarType) -> ExprId {
        self.cast(a, ty.dtype(), true)
    }

    /// A fold of `body` over `vars`.
    pub fn reduce(&mut self, op: ReduceOp, vars: Vec<VarId>, body: ExprId) -> ExprId {
        let bt = self.ty(body);
        let ty = if op.is_arg() { ScalarType::I64 } else { bt };
        self.push(ty, Expr::Reduce { op, vars, body })
    }

    /// The sum of a matrix product of the kernel's first two inputs, `Σ_k in0[o0, k] ·
    /// in1[k, o1]` over `k` terms, with the output index `[o0, o1]` it reads (the
    /// shape of every matmul and linear layer; the caller adds its epilogue).
    pub fn matmul_sum(&mut self, k: usize) -> (Vec<ExprId>, ExprId) {
        let o = self.out_index();
        let kv = self.new_var(k as u64);
        let kk = self.var(kv);
        let x = self.load(0, vec![o[0], kk]);
        let y = self.load(1, vec![kk, o[1]]);
        let p = self.mul(x, y);
        let s = self.reduce(ReduceOp::Sum, vec![kv], p);
        (o, s)
    }

    /// `a + b`.
    pub fn add(&mut self, a: ExprId, b: ExprId) -> ExprId {
        self.binary(BinaryOp::Add, a, b)
    }

    /// `a - b`.
    pub fn sub(&mut self, a: ExprId, b: ExprId) -> ExprId {
        self.binary(BinaryOp::Sub, a, b)
    }

    /// `a * b`.
    pub fn mul(&mut self, a: ExprId, b: ExprId) -> ExprId {
        self.binary(BinaryOp::Mul, a, b)
    }

    /// `a / b`.
    pub fn div(&mut self, a: ExprId, b: ExprId) -> ExprId {
        self.binary(BinaryOp::Div, a, b)
    }

    /// A scatter kernel (see the module docs): the first `domain.len()` variables
    /// iterate `domain` (the output's index variables made by [`KernelBuilder::new`]
    /// are replaced, so call this before building any node). Input 0 must have the
    /// output's type: it is what the output holds before the first point stores.
    pub fn scatter_domain(&mut self, domain: &[u64]) -> Vec<ExprId> {
        if !self.k.nodes.is_empty() {
            self.fail("scatter_domain after nodes were built");
        }
        self.k.vars = domain.to_vec();
        self.k.scatter = Some(Scatter { rank: domain.len(), at: ExprId(0), combine: None });
        (0..domain.len()).map(|v| self.var(VarId(v as u32))).collect()
    }

    /// Ends a scatter kernel: each point stores `root` at flat output position `at`,
    /// combined by `combine`; verifies it.
    pub fn finish_scatter(
        mut self,
        root: ExprId,
        at: ExprId,
        combine: Option<BinaryOp>,
    ) -> Result<Kernel, KernelError> {
        match &mut self.k.scatter {
            Some(s) => {
                s.at = at;
                s.combine = combine;
            }
            None => self.fail("finish_scatter without scatter_domain"),
        }
        self.finish(root)
    }

    /// Ends the kernel with `root` as the stored value; verifies it.
    pub fn finish(mut self, root: ExprId) -> Result<Kernel, KernelError> {
        if let Some(what) = self.error.take() {
            return Err(KernelError::Type { kernel: self.k.name, node: root.0, what });
        }
        self.k.root = root;
        self.k.prune();
        self.k.verify()?;
        Ok(self.k)
    }
}
