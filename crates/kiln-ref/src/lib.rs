//! kiln's reference evaluator.
//!
//! Plain, obviously correct loops for every operator of [`kiln_ir::OpKind`], with
//! ONNX semantics (see `kiln_ir::op`). It is the oracle of differential tests and
//! the engine of compile-time constant folding; the runtime never depends on it.
//!
//! Floating-point operators compute in `f64` and round once to the result dtype
//! (contractions accumulate in `f64` too), so results are at least as accurate as
//! any f32 implementation they are compared with. Integer operators compute in
//! `i64`/`u64` with the wrapping behaviour of the result dtype.
//!
//! Layout: [`eval_op`] dispatches on the op kind to one module per family;
//! [`eval_graph`] runs a whole graph in program order.
#![deny(missing_docs)]

mod conv;
mod dynamic;
mod elementwise;
mod linalg;
mod movement;
mod norm;
mod pool;
mod quant;
mod recurrent;
mod reduce;
pub mod tflite_quant;
mod transformer;
mod util;

use kiln_ir::entity::EntityId;
use kiln_ir::{Graph, Op, OpKind, Tensor, TensorType, ValueDef, ValueId};

/// Why an operator could not be evaluated.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    /// The operands or attributes are invalid for the op.
    #[error("{op}: {reason}")]
    Invalid {
        /// The op type.
        op: OpKind,
        /// What is wrong.
        reason: String,
    },
    /// A valid form the evaluator does not implement.
    #[error("{op}: unsupported: {reason}")]
    Unsupported {
        /// The op type.
        op: OpKind,
        /// What is not supported.
        reason: String,
    },
    /// A graph-level problem (inputs of the wrong type, a node failing).
    #[error("{0}")]
    Graph(String),
}

/// Evaluates one operator. `inputs` are the operands in ONNX order (`None` = an
/// absent optional input); `out_types` are the result types shape inference gave
/// (the result dtype of Cast, ConstantOfShape, … is read from there).
pub fn eval_op(op: &Op, inputs: &[Option<&Tensor>], out_types: &[TensorType]) -> Result<Vec<Tensor>, EvalError> {
    let cx = util::Cx { op, inputs, out_types };
    use OpKind::*;
    let r = match op.kind {
        // elementwise.rs: unary, binary (broadcasting), variadic, comparison,
        // logical, bitwise, activation functions, Cast, Clip, Where.
        Abs | Acos | Acosh | Add | And | Asin | Asinh | Atan | Atanh | BitShift | BitwiseAnd | BitwiseNot
        | BitwiseOr | BitwiseXor | Cast | CastLike | Ceil | Celu | Clip | Cos | Cosh | Div | Elu | Equal | Erf
        | Exp | Floor | Gelu | Greater | GreaterOrEqual | HardSigmoid | HardSwish | Identity | IsInf | IsNaN
        | LeakyRelu | Less | LessOrEqual | Log | Max | Mean | Min | Mish | Mod | Mul | Neg | Not | Or | Pow | PRelu
        | Reciprocal | Relu | Round | Selu | Shrink | Sigmoid | Sign | Sin | Sinh | Softplus | Softsign | Sqrt
        | Sub | Sum | Tan | Tanh | ThresholdedRelu | Where | Xor | Dropout => elementwise::eval(&cx),
        // dynamic.rs: results whose extent depends on the data (TopK with a run-time K:
        // the node's three-result form).
        NonZero | Compress | Unique | NonMaxSuppression => dynamic::eval(&cx),
        TopK if out_types.len() == 3 => dynamic::eval(&cx),
        // reduce.rs: reductions, arg-reductions, scans, softmax family, TopK.
        ArgMax | ArgMin | ReduceL1 | ReduceL2 | ReduceLogSum | ReduceLogSumExp | ReduceMax | ReduceMean | ReduceMin
        | ReduceProd | ReduceSum | ReduceSumSquare | CumSum | Softmax | LogSoftmax | Hardmax | TopK => {
            reduce::eval(&cx)
        }
        // norm.rs: normalisations.
        BatchNormalization
        | InstanceNormalization
        | LayerNormalization
        | GroupNormalization
        | LpNormalization
        | LRN
        | MeanVarianceNormalization
        | RMSNormalization => norm::eval(&cx),
        // quant.rs: quantisation.
        QuantizeLinear | DequantizeLinear | DynamicQuantizeLinear => quant::eval(&cx),
        // linalg.rs: contractions.
        MatMul | MatMulInteger | QLinearMatMul | Gemm | Einsum | Det => linalg::eval(&cx),
        // conv.rs: convolutions.
        Conv | ConvInteger | ConvTranspose | QLinearConv => conv::eval(&cx),
        // pool.rs: pooling.
        AveragePool | MaxPool | LpPool | GlobalAveragePool | GlobalMaxPool | GlobalLpPool => pool::eval(&cx),
        // movement.rs: shape and data movement, generators, indexing.
        Concat | ConstantOfShape | DepthToSpace | Expand | EyeLike | Flatten | Gather | GatherElements | GatherND
        | OneHot | Pad | Range | Reshape | Resize | ReverseSequence | ScatterElements | ScatterND | Shape | Size
        | Slice | SpaceToDepth | Split | Squeeze | Tile | Transpose | Trilu | Unsqueeze | GridSample | Col2Im
        | RoiAlign | DeformConv => movement::eval(&cx),
        // recurrent.rs: recurrent layers.
        LSTM | GRU | RNN => recurrent::eval(&cx),
        // transformer.rs: opset 23's attention and rotary embedding.
        Attention | RotaryEmbedding => transformer::eval(&cx),
        // Control flow: the branch the condition selects, run as a graph of its own.
        If => eval_if(&cx),
    }?;
    if r.len() < out_types.len() {
        return Err(cx.invalid(format!("produced {} results, {} expected", r.len(), out_types.len())));
    }
    // (A data-dependent op's bounded results have their actual extent, which the op
    // checked against the bound.)
    let bounded: Vec<usize> = kiln_ir::dynamic::source_results(op, out_types.len());
    for (i, (t, ty)) in r.iter().zip(out_types).enumerate() {
        if t.ty() != ty && !bounded.contains(&i) {
            return Err(cx.invalid(format!("result {i} has type {}, expected {ty}", t.ty())));
        }
    }
    Ok(r)
}

/// `If`: evaluates the branch its condition selects on the captured operands.
fn eval_if(cx: &util::Cx<'_>) -> Result<Vec<Tensor>, EvalError> {
    let a = cx.op.attrs_of::<kiln_ir::attrs::IfAttrs>().map_err(|e| cx.invalid(e.to_string()))?;
    let cond = cx.inputs.first().copied().flatten().ok_or_else(|| cx.invalid("the condition is missing"))?;
    let taken = match cond.to_f64_vec().as_slice() {
        [x] => *x != 0.0,
        _ => return Err(cx.invalid(format!("the condition must hold one element, it is {}", cond.ty()))),
    };
    let branch = if taken { &a.then_branch } else { &a.else_branch };
    let captured: Vec<Tensor> = cx.inputs[1..]
        .iter()
        .map(|t| t.cloned().ok_or_else(|| cx.invalid("a captured operand is absent")))
        .collect::<Result<_, _>>()?;
    let mut outs = eval_graph(branch, &captured)?;
    outs.truncate(cx.out_types.len());
    Ok(outs)
}

/// Largest total size of one node's results [`eval_graph`] computes (4 GiB): larger
/// ones are refused with an error instead of exhausting memory.
pub const MAX_RESULT_BYTES: usize = 1 << 32;

/// Runs `graph` on `inputs` (one per graph input, in order) and returns its outputs.
pub fn eval_graph(graph: &Graph, inputs: &[Tensor]) -> Result<Vec<Tensor>, EvalError> {
    if inputs.len() != graph.inputs.len() {
        return Err(EvalError::Graph(format!(
            "graph `{}` takes {} inputs, {} given",
            graph.name,
            graph.inputs.len(),
            inputs.len()
        )));
    }
    let mut env: Vec<Option<Tensor>> = vec![None; graph.values.len()];
    for (&v, t) in graph.inputs.iter().zip(inputs) {
        let val = &graph.values[v];
        if t.ty() != &val.ty {
            return Err(EvalError::Graph(format!("input `{}` expects {}, got {}", val.name, val.ty, t.ty())));
        }
        env[v.index()] = Some(t.clone());
    }
    for (v, val) in graph.values.iter() {
        if let ValueDef::Const(t) = &val.def {
            env[v.index()] = Some(t.clone());
        }
    }
    // Last use of each value, so intermediate tensors are freed as soon as possible.
    let mut last_use = vec![usize::MAX; graph.values.len()];
    for (i, (_, n)) in graph.nodes.iter().enumerate() {
        for v in n.inputs.iter().flatten() {
            last_use[v.index()] = i;
        }
    }
    for &o in &graph.outputs {
        last_use[o.index()] = usize::MAX;
    }
    let get = |env: &Vec<Option<Tensor>>, v: ValueId| env[v.index()].clone();
    // Values of data-dependent extent (`kiln_ir::dynamic`): a node computing one from
    // such operands is given its result type at the actual extent, read from the extent
    // value (ONNX semantics; the compiled plan computes at the bound).
    let dynamic = kiln_ir::dynamic::analyse_with(graph, false).unwrap_or_default();
    for d in dynamic.iter().flatten() {
        last_use[d.extent.index()] = usize::MAX;
    }
    for (i, (_, n)) in graph.nodes.iter().enumerate() {
        let args: Vec<Option<Tensor>> = n
            .inputs
            .iter()
            .map(|o| match o {
                None => Ok(None),
                Some(v) => get(&env, *v)
                    .map(Some)
                    .ok_or_else(|| EvalError::Graph(format!("node `{}` uses {v} before it is defined", n.name))),
            })
            .collect::<Result<_, _>>()?;
        let refs: Vec<Option<&Tensor>> = args.iter().map(|a| a.as_ref()).collect();
        let is_source = !kiln_ir::dynamic::source_results(&n.op, n.outputs.len()).is_empty();
        let tys: Vec<TensorType> = n
            .outputs
            .iter()
            .map(|&o| match dynamic.get(o.index()).copied().flatten() {
                Some(d) if !is_source => {
                    let e = env[d.extent.index()]
                        .as_ref()
                        .and_then(|t| t.to_i64_vec().ok())
                        .and_then(|v| v.first().copied())
                        .ok_or_else(|| {
                            EvalError::Graph(format!("node `{}`: the extent {} is not known", n.name, d.extent))
                        })?;
                    let mut dims = graph.ty(o).shape.dims().to_vec();
                    dims[d.axis] = e.max(0) as usize;
                    let shape = kiln_ir::Shape::new(dims).map_err(|e| EvalError::Graph(e.to_string()))?;
                    Ok(TensorType::new(graph.ty(o).dtype, shape))
                }
                _ => Ok(graph.ty(o).clone()),
            })
            .collect::<Result<_, EvalError>>()?;
        let bytes: usize = tys.iter().map(|t| t.storage_bytes()).fold(0, usize::saturating_add);
        if bytes > MAX_RESULT_BYTES {
            return Err(EvalError::Graph(format!(
                "node `{}` ({}): results of {bytes} bytes exceed the reference evaluator's limit of {MAX_RESULT_BYTES}",
                n.name, n.op.kind
            )));
        }
        let outs = eval_op(&n.op, &refs, &tys)
            .map_err(|e| EvalError::Graph(format!("node `{}` ({}): {e}", n.name, n.op.kind)))?;
        for (&o, t) in n.outputs.iter().zip(outs) {
            env[o.index()] = Some(t);
        }
        for v in n.inputs.iter().flatten() {
            if last_use[v.index()] == i && !matches!(graph.values[*v].def, ValueDef::Const(_)) {
                env[v.index()] = None;
            }
        }
    }
    graph
        .outputs
        .iter()
        .map(|&o| {
            env[o.index()]
                .clone()
                .ok_or_else(|| EvalError::Graph(format!("output {o} (`{}`) is never defined", graph.values[o].name)))
        })
        .collect()
}
