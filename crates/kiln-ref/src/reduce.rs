//! (Being written.)
use crate::{util::Cx, EvalError};
use kiln_ir::Tensor;

pub(crate) fn eval(cx: &Cx) -> Result<Vec<Tensor>, EvalError> {
    Err(cx.unsupported("not yet implemented"))
}
