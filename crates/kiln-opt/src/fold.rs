//! The constant-folding policy: when a node whose operands are known becomes
//! constants. Shared by the importer (which folds while it reads a model) and the
//! `tensor-fold-constants` pass.

use kiln_ir::{Graph, Op, Tensor, TensorType, ValueId};

/// Results larger than this many bytes are not folded when they are also more than
/// twice the size of their operands: folding must not inflate the program (a
/// ConstantOfShape fill, an Expand or a Tile stays a node for later stages to
/// materialise as cheaply as they can).
pub const INFLATE_LIMIT: usize = 64 * 1024;

/// Whether results of types `outs` computed from operands of `in_bytes` bytes in
/// all may become constants.
pub fn worth_folding(in_bytes: usize, outs: &[TensorType]) -> bool {
    let out_bytes: usize = outs.iter().map(|t| t.storage_bytes()).fold(0, usize::saturating_add);
    !(out_bytes > INFLATE_LIMIT && out_bytes > in_bytes.saturating_mul(2))
}

/// The contents of operands that are all constants (absent optional operands stay
/// `None`); `None` when any present operand is not a constant.
pub fn constant_operands<'a>(g: &'a Graph, inputs: &[Option<ValueId>]) -> Option<Vec<Option<&'a Tensor>>> {
    inputs
        .iter()
        .map(|i| match i {
            None => Some(None),
            Some(v) => g.constant(*v).map(Some),
        })
        .collect()
}

/// Most element operations one fold may cost (about a second of the reference
/// evaluator): a model must not make compilation run for hours.
pub const WORK_LIMIT: u128 = 1 << 28;

/// An upper bound of the element operations evaluating `op` costs: for ops whose
/// every result element may read many operand elements (contractions, windows,
/// recurrences, Resize), results × operand elements; for the others, results plus
/// operands.
pub fn work_estimate(op: &Op, inputs: &[Option<&Tensor>], outs: &[TensorType]) -> u128 {
    use kiln_ir::OpKind::*;
    let out: u128 = outs.iter().map(|t| t.shape.numel() as u128).sum();
    let ins: u128 = inputs.iter().flatten().map(|t| t.numel() as u128).sum();
    match op.kind {
        Conv | ConvInteger | ConvTranspose | QLinearConv | MatMul | MatMulInteger | QLinearMatMul | Gemm | Einsum
        | Det | LSTM | GRU | RNN | AveragePool | MaxPool | LpPool | Resize | LRN | CumSum | TopK => {
            out.saturating_mul(ins.max(1))
        }
        _ => out + ins,
    }
}

/// Whether the importer folds `op` when its operands are constants: everything but a
/// DequantizeLinear of integers (a quantised weight or bias), which the tensor passes
/// see first (`tensor-fold-quantized-contractions` reads its integers and scale) and
/// `tensor-fold-constants` then folds where it is left, as the importer would have.
pub fn folds_at_import(op: &Op, inputs: &[Option<&Tensor>]) -> bool {
    let int = inputs.first().copied().flatten().is_some_and(|t| t.dtype().is_int());
    !(op.kind == kiln_ir::OpKind::DequantizeLinear && int)
}

/// Evaluates `op` on constant operands if the policy allows; `Ok(None)` when it
/// does not, an error when the op is invalid on these operands.
pub fn try_fold(op: &Op, inputs: &[Option<&Tensor>], outs: &[TensorType]) -> Result<Option<Vec<Tensor>>, String> {
    // A data-dependent op's results are typed by their bound (kiln_ir::dynamic): its
    // actual results would not fit those types.
    if !kiln_ir::dynamic::source_results(op, outs.len()).is_empty() {
        return Ok(None);
    }
    let in_bytes: usize = inputs.iter().flatten().map(|t| t.ty().storage_bytes()).sum();
    if !worth_folding(in_bytes, outs) || work_estimate(op, inputs, outs) > WORK_LIMIT {
        return Ok(None);
    }
    kiln_ref::eval_op(op, inputs, outs).map(Some).map_err(|e| e.to_string())
}

/// Results of ops that depend only on their operand's type (`Shape`, `Size`), for
/// any operand, constant or not: shapes are static. `None` for other ops.
pub fn fold_from_type(op: &Op, operand: &TensorType, out: &TensorType) -> Option<Result<Tensor, String>> {
    use kiln_ir::OpKind;
    let dims: Vec<i64> = operand.shape.dims().iter().map(|&d| d as i64).collect();
    let v = match op.kind {
        OpKind::Size => vec![operand.shape.numel() as i64],
        OpKind::Shape => {
            let r = dims.len() as i64;
            let clamp = |x: i64| if x < 0 { (x + r).max(0) } else { x.min(r) } as usize;
            let a = match op.attrs_of::<kiln_ir::attrs::ShapeAttrs>() {
                Ok(a) => a,
                Err(e) => return Some(Err(e.to_string())),
            };
            let (start, end) = (clamp(a.start), clamp(a.end.unwrap_or(r)));
            dims[start..end.max(start)].to_vec()
        }
        _ => return None,
    };
    Some(Tensor::from_i64(out.dtype, out.shape.clone(), &v).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::{DType, OpKind, Shape};

    fn zeros(dims: &[usize]) -> Tensor {
        Tensor::zeros(TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap()))
    }

    #[test]
    fn expensive_folds_are_left_as_nodes() {
        // A 512x512 image convolved with a 512x512 kernel, padded by 256 on each side:
        // a 513x513 result, each element ~2^18 multiply-adds.
        let x = zeros(&[1, 1, 512, 512]);
        let w = zeros(&[1, 1, 512, 512]);
        let op = Op::new(OpKind::Conv);
        let out = TensorType::new(DType::F32, Shape::new(vec![1, 1, 513, 513]).unwrap());
        assert!(work_estimate(&op, &[Some(&x), Some(&w)], std::slice::from_ref(&out)) > WORK_LIMIT);
        assert_eq!(try_fold(&op, &[Some(&x), Some(&w)], &[out]), Ok(None));
        // Cheap elementwise work folds.
        let a = zeros(&[4]);
        let ty = a.ty().clone();
        let r = try_fold(&Op::new(OpKind::Relu), &[Some(&a)], &[ty]).unwrap();
        assert_eq!(r, Some(vec![a.clone()]));
    }

    #[test]
    fn inflating_folds_are_left_as_nodes() {
        let big = TensorType::new(DType::F32, Shape::new(vec![1 << 20]).unwrap());
        assert!(!worth_folding(8, std::slice::from_ref(&big)));
        assert!(worth_folding(4 << 20, &[big]));
    }
}
