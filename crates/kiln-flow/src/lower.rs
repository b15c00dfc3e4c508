//! The interface between op lowering and the flow program.
//!
//! A lowering (crate `kiln-lower`) turns one op, with the types of its operands (and the
//! contents of the constant ones) in an [`OpCx`], into [`Lowered`]: a small DAG of
//! [`Step`]s, each one kernel whose inputs are the op's operands or earlier steps'
//! results, plus where each of the op's results comes from. Most ops are one step; ops
//! whose results are a view of an operand's bytes (Reshape, Squeeze, Flatten, Identity,
//! …) are [`Output::Alias`] and cost nothing. [`crate::program::form`] takes a lowering
//! as a parameter ([`Lowering`]) and builds the flow program from what it produces.
//!
//! The index helpers here ([`broadcast_index`], [`flat_index`], [`unflatten`]) serve both
//! the lowerings and fusion; [`interpret`] runs a lowered op with the kernel interpreter.

use kiln_ir::{Op, Tensor, TensorType};

use crate::kernel::{ExprId, Kernel, KernelBuilder, KernelError};

/// A lowering: one op into kernels (`kiln_lower::lower_op` is kiln's).
pub type Lowering<'l> = dyn Fn(&OpCx<'_>) -> Result<Lowered, LowerError> + 'l;

/// One operand of the op being lowered.
#[derive(Debug, Clone, Copy)]
pub struct OpInput<'a> {
    /// Its type.
    pub ty: &'a TensorType,
    /// Its contents, when it is a compile-time constant.
    pub value: Option<&'a Tensor>,
}

/// What a lowering works from.
#[derive(Debug, Clone)]
pub struct OpCx<'a> {
    /// The op.
    pub op: &'a Op,
    /// A name for the kernels (`[A-Za-z0-9_]`, unique in the model).
    pub name: &'a str,
    /// The operands, `None` for absent optional ones.
    pub inputs: &'a [Option<OpInput<'a>>],
    /// The result types (from shape inference).
    pub outputs: &'a [TensorType],
}

/// A kernel input: an operand of the op or the result of an earlier step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operand {
    /// Operand `i` of the op.
    Input(usize),
    /// The result of step `i`.
    Step(usize),
}

/// One kernel of a lowered op.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The kernel.
    pub kernel: Kernel,
    /// What each kernel input is bound to.
    pub operands: Vec<Operand>,
}

/// Where a result of the op comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The result of a step, viewed with the result's type (same dtype and element
    /// count; the same shape but for a grouped convolution's `[N, group, M/group, …]`).
    Step(usize),
    /// The bytes of operand `i`, viewed with the result's type (same dtype and element count).
    Alias(usize),
}

/// An op as kernels.
#[derive(Debug, Clone, PartialEq)]
pub struct Lowered {
    /// The kernels, in dependency order.
    pub steps: Vec<Step>,
    /// One entry per result of the op.
    pub outputs: Vec<Output>,
}

impl Lowered {
    /// One kernel computing the op's only result.
    pub fn single(kernel: Kernel, operands: Vec<Operand>) -> Lowered {
        Lowered { steps: vec![Step { kernel, operands }], outputs: vec![Output::Step(0)] }
    }

    /// One kernel per result, each reading the given operands.
    pub fn per_output(kernels: Vec<(Kernel, Vec<Operand>)>) -> Lowered {
        let outputs = (0..kernels.len()).map(Output::Step).collect();
        Lowered { steps: kernels.into_iter().map(|(kernel, operands)| Step { kernel, operands }).collect(), outputs }
    }
}

/// Why an op cannot be lowered.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LowerError {
    /// The op, or this form of it, has no lowering.
    #[error("{op}: {reason}")]
    Unsupported {
        /// The op kind.
        op: String,
        /// What is missing.
        reason: String,
    },
    /// An operand the lowering needs at compile time (axes, a shape, a count) is
    /// computed at run time; binding the graph input behind it to a value resolves it.
    #[error("{op}: {what} (operand {operand}) must be a compile-time constant (bind the input behind it with --input-value)")]
    NotConstant {
        /// The op kind.
        op: String,
        /// What the operand is.
        what: String,
        /// The operand's position.
        operand: usize,
    },
    /// A lowering built a malformed kernel (a compiler bug).
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl<'a> OpCx<'a> {
    /// An unsupported-form error for this op.
    pub fn unsupported(&self, reason: impl Into<String>) -> LowerError {
        LowerError::Unsupported { op: self.op.kind.name().to_string(), reason: reason.into() }
    }

    /// Type of operand `i` (an error if absent).
    pub fn input_ty(&self, i: usize) -> Result<&'a TensorType, LowerError> {
        match self.inputs.get(i).copied().flatten() {
            Some(x) => Ok(x.ty),
            None => Err(self.unsupported(format!("operand {i} is absent"))),
        }
    }

    /// Operand `i`, if present.
    pub fn input(&self, i: usize) -> Option<OpInput<'a>> {
        self.inputs.get(i).copied().flatten()
    }

    /// Contents of constant operand `i`: `Ok(None)` if absent, an error if present but
    /// computed at run time (for operands a lowering needs at compile time).
    pub fn const_input(&self, i: usize, what: &str) -> Result<Option<&'a Tensor>, LowerError> {
        match self.input(i) {
            None => Ok(None),
            Some(OpInput { value: Some(t), .. }) => Ok(Some(t)),
            Some(_) => {
                Err(LowerError::NotConstant { op: self.op.kind.name().to_string(), what: what.to_string(), operand: i })
            }
        }
    }

    /// Constant integer operand `i` as a list (`None` if absent).
    pub fn const_ints(&self, i: usize, what: &str) -> Result<Option<Vec<i64>>, LowerError> {
        match self.const_input(i, what)? {
            None => Ok(None),
            Some(t) => t.to_i64_vec().map(Some).map_err(|e| self.unsupported(format!("{what}: {e}"))),
        }
    }

    /// Result type `i`.
    pub fn output_ty(&self, i: usize) -> &'a TensorType {
        &self.outputs[i]
    }

    /// A kernel builder for result `i` over the given operand types; the kernel is named
    /// after the op (and the result when there are several).
    pub fn builder(&self, result: usize, inputs: Vec<TensorType>) -> KernelBuilder {
        let name = if self.outputs.len() > 1 { format!("{}_{result}", self.name) } else { self.name.to_string() };
        KernelBuilder::new(name, inputs, self.outputs[result].clone())
    }

    /// An attribute error as an unsupported form.
    pub fn attr<T>(&self, r: Result<T, kiln_ir::op::AttrError>) -> Result<T, LowerError> {
        r.map_err(|e| self.unsupported(e.to_string()))
    }

    /// The op's attributes as struct `T` (parsed and checked when the op was built).
    pub fn attrs<T: kiln_ir::attrs::OpAttrsOf>(&self) -> Result<&'a T, LowerError> {
        self.attr(self.op.attrs_of::<T>())
    }

    /// The sliding-window attributes of a convolution or pool.
    pub fn window(&self) -> Result<kiln_ir::attrs::WindowAttrs<'a>, LowerError> {
        self.attr(self.op.window_attrs())
    }
}

/// The index of an operand of shape `in_dims` broadcast (numpy rules) to `out_index`:
/// leading output dimensions the operand lacks are dropped, its dimensions of extent 1
/// read index 0.
pub fn broadcast_index(b: &mut KernelBuilder, in_dims: &[usize], out_index: &[ExprId]) -> Vec<ExprId> {
    let skip = out_index.len().saturating_sub(in_dims.len());
    in_dims.iter().zip(&out_index[skip..]).map(|(&d, &e)| if d == 1 { b.index(0) } else { e }).collect()
}

/// The row-major flat position of `index` in a tensor of `dims`.
pub fn flat_index(b: &mut KernelBuilder, dims: &[usize], index: &[ExprId]) -> ExprId {
    let mut acc = b.index(0);
    for (&d, &i) in dims.iter().zip(index) {
        let dd = b.index(d as i64);
        let scaled = b.mul(acc, dd);
        acc = b.add(scaled, i);
    }
    acc
}

/// The index in a tensor of `dims` of row-major flat position `flat`.
pub fn unflatten(b: &mut KernelBuilder, dims: &[usize], flat: ExprId) -> Vec<ExprId> {
    let mut out = vec![flat; dims.len()];
    let mut stride: i64 = 1;
    for d in (0..dims.len()).rev() {
        let s = b.index(stride);
        let q = b.div(flat, s);
        out[d] = if d == 0 {
            q
        } else {
            let n = b.index(dims[d] as i64);
            b.binary(crate::kernel::BinaryOp::Rem, q, n)
        };
        stride = stride.saturating_mul(dims[d].max(1) as i64);
    }
    out
}

/// Evaluates a lowered op with the kernel interpreter (tests and debugging).
pub fn interpret(
    lowered: &Lowered,
    inputs: &[Option<&Tensor>],
    out_types: &[TensorType],
) -> Result<Vec<Tensor>, crate::interp::InterpError> {
    let mut results: Vec<Tensor> = Vec::with_capacity(lowered.steps.len());
    for step in &lowered.steps {
        let mut args: Vec<&Tensor> = Vec::with_capacity(step.operands.len());
        for &o in &step.operands {
            let t = match o {
                Operand::Input(i) => inputs.get(i).copied().flatten(),
                Operand::Step(s) => results.get(s),
            };
            match t {
                Some(t) => args.push(t),
                None => {
                    return Err(crate::interp::InterpError::Input {
                        kernel: step.kernel.name.clone(),
                        input: args.len(),
                        got: "nothing".into(),
                        want: format!("{o:?}"),
                    })
                }
            }
        }
        let r = crate::interp::run(&step.kernel, &args)?;
        results.push(r);
    }
    Ok(lowered
        .outputs
        .iter()
        .zip(out_types)
        .filter_map(|(o, ty)| match *o {
            Output::Step(s) => results.get(s).and_then(|t| t.reshaped(ty.shape.clone()).ok()),
            Output::Alias(i) => inputs.get(i).copied().flatten().and_then(|t| t.reshaped(ty.shape.clone()).ok()),
        })
        .collect())
}
