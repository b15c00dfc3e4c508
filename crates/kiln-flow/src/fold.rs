//! Folding data movement over constants at compile time.
//!
//! A lowering may rearrange a constant operand with a kernel of its own (ConvTranspose's
//! phase filters, a copy of its weights in another order with zeros between:
//! `kiln-lower`'s linalg module). Such a dispatch reads nothing but constants and only
//! moves data (class [`KernelClass::Movement`]), so [`fold_constants`] runs it once here
//! with the kernel interpreter: its result becomes a constant buffer and the dispatch is
//! gone. A movement copies values without arithmetic, so the interpreter's result is the
//! compiled kernel's bit for bit; nothing that computes is folded (its rounding would be
//! the interpreter's, not the target's). Results that are graph outputs stay dispatches,
//! and so do results above [`FOLD_MOST`] elements or more than [`FOLD_GROWTH`] times
//! their operands (a broadcast of a small constant would make the artifact carry the
//! large tensor a dispatch writes cheaply: the rearrangements folded here keep about
//! the size of what they read).

use kiln_ir::Tensor;

use crate::class::KernelClass;
use crate::program::{BufferKind, FlowProgram};

/// Largest result folded, in elements.
pub const FOLD_MOST: usize = 1 << 24;
/// Most elements a folded result may have per element its operands have (plus 4096).
pub const FOLD_GROWTH: usize = 16;

/// Replaces every movement dispatch whose operands are all constants by its result, a
/// constant (see the module docs), in program order so that chains fold too. Returns how
/// many were folded.
pub fn fold_constants(p: &mut FlowProgram) -> usize {
    let outputs: Vec<_> = p.outputs.iter().map(|&o| p.storage(o)).collect();
    let mut folded = 0;
    let mut kept = Vec::with_capacity(p.dispatches.len());
    for d in std::mem::take(&mut p.dispatches) {
        match fold_one(p, &d, &outputs) {
            Some(t) => {
                p.buffers[d.result.index()].kind = BufferKind::Const(t);
                folded += 1;
            }
            None => kept.push(d),
        }
    }
    p.dispatches = kept;
    folded
}

/// The result of `d`, when it is a movement over constants that may be folded.
fn fold_one(p: &FlowProgram, d: &crate::program::Dispatch, outputs: &[crate::program::BufferId]) -> Option<Tensor> {
    // A guarded dispatch stays: its result may be an `If` result another branch writes.
    if d.class != KernelClass::Movement
        || !d.guard.is_empty()
        || d.kernel.output.shape.numel() > FOLD_MOST
        || outputs.contains(&d.result)
        || p.buffer(d.result).kind != BufferKind::Result
    {
        return None;
    }
    let mut args = Vec::with_capacity(d.operands.len());
    for &o in &d.operands {
        let BufferKind::Const(t) = &p.buffer(p.storage(o)).kind else { return None };
        args.push(t.reshaped(p.buffer(o).ty.shape.clone()).ok()?);
    }
    let read: usize = args.iter().map(|t| t.shape().numel()).sum();
    if d.kernel.output.shape.numel() > read.saturating_mul(FOLD_GROWTH).saturating_add(4096) {
        return None;
    }
    let refs: Vec<&Tensor> = args.iter().collect();
    let t = crate::interp::run(&d.kernel, &refs).ok()?;
    (t.ty() == &p.buffer(d.result).ty).then_some(t)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::{BinaryOp, Bounds, KernelBuilder, ScalarType};
    use crate::program::{BufferId, Dispatch};
    use crate::test_types::{buf, t};
    use kiln_ir::Shape;

    /// A reversed copy of a constant with zeros between (`y[2i] = w[3 − i]`, `y[2i+1] =
    /// 0`) folds into a constant equal to what the interpreter computes at run time; the
    /// same kernel over a graph input, an arithmetic kernel over the constant, a
    /// movement whose result is a graph output, and a broadcast of a scalar to far more
    /// elements stay dispatches.
    #[test]
    fn movement_over_constants_folds() {
        let w = Tensor::from_vec(Shape::new(vec![4]).unwrap(), vec![1.0f32, 2.0, 3.0, 4.0]).unwrap();
        let spread = || {
            let mut b = KernelBuilder::new("spread", vec![t(&[4])], t(&[8]));
            let o = b.out_index();
            let two = b.index(2);
            let i = b.div(o[0], two);
            let three = b.index(3);
            let j = b.sub(three, i);
            let r = b.binary(BinaryOp::Rem, o[0], two);
            let zero = b.index(0);
            let even = b.binary(BinaryOp::Eq, r, zero);
            let x = b.load_with(0, vec![j], Bounds::Clamp);
            let z = b.float(ScalarType::F32, 0.0);
            let v = b.select(even, x, z);
            b.finish(v).unwrap()
        };
        // (An elementwise reader of the fill: arithmetic, never folded.)
        let spread_n = |n: usize| {
            let mut b = KernelBuilder::new("neg", vec![t(&[n])], t(&[n]));
            let o = b.out_index();
            let x = b.load(0, vec![o[0]]);
            let v = b.unary(crate::kernel::UnaryOp::Neg, x);
            b.finish(v).unwrap()
        };
        let double = {
            let mut b = KernelBuilder::new("double", vec![t(&[4])], t(&[4]));
            let o = b.out_index();
            let x = b.load(0, vec![o[0]]);
            let v = b.add(x, x);
            b.finish(v).unwrap()
        };
        let want = crate::interp::run(&spread(), &[&w]).unwrap();
        let mut prog = FlowProgram {
            extents: Vec::new(),
            name: "g".into(),
            buffers: vec![
                buf(t(&[4]), BufferKind::Const(w.clone())),
                buf(t(&[8]), BufferKind::Result),
                buf(t(&[4]), BufferKind::Input(0)),
                buf(t(&[8]), BufferKind::Result),
                buf(t(&[4]), BufferKind::Result),
                buf(t(&[8]), BufferKind::Result),
            ],
            dispatches: vec![
                Dispatch::new(spread(), vec![BufferId(0)], BufferId(1), vec![]),
                Dispatch::new(spread(), vec![BufferId(2)], BufferId(3), vec![]),
                Dispatch::new(double, vec![BufferId(0)], BufferId(4), vec![]),
                Dispatch::new(spread(), vec![BufferId(0)], BufferId(5), vec![]),
            ],
            inputs: vec![BufferId(2)],
            outputs: vec![BufferId(3), BufferId(4), BufferId(5)],
        };
        assert_eq!(prog.dispatches[0].class, KernelClass::Movement);
        let mut first = prog.clone();
        first.dispatches.truncate(3);
        assert_eq!(fold_constants(&mut first), 1);
        assert_eq!(first.buffer(BufferId(1)).kind, BufferKind::Const(want.clone()));
        let names: Vec<BufferId> = first.dispatches.iter().map(|d| d.result).collect();
        assert_eq!(names, vec![BufferId(3), BufferId(4)]);
        // The last one writes a graph output: it stays.
        assert_eq!(fold_constants(&mut prog), 1);
        assert_eq!(
            prog.dispatches.iter().map(|d| d.result).collect::<Vec<_>>(),
            vec![BufferId(3), BufferId(4), BufferId(5)]
        );
        // A scalar broadcast to 10 000 elements: kept; to 4 000: folded.
        for (n, folds) in [(10_000usize, 0usize), (4_000, 1)] {
            let mut b = KernelBuilder::new("fill", vec![t(&[1])], t(&[n]));
            let z = b.index(0);
            let v = b.load(0, vec![z]);
            let fill = b.finish(v).unwrap();
            let one = Tensor::from_vec(Shape::new(vec![1]).unwrap(), vec![2.5f32]).unwrap();
            let mut p = FlowProgram {
                extents: Vec::new(),
                name: "f".into(),
                buffers: vec![
                    buf(t(&[1]), BufferKind::Const(one)),
                    buf(t(&[n]), BufferKind::Result),
                    buf(t(&[n]), BufferKind::Result),
                ],
                dispatches: vec![
                    Dispatch::new(fill, vec![BufferId(0)], BufferId(1), vec![]),
                    Dispatch::new(spread_n(n), vec![BufferId(1)], BufferId(2), vec![]),
                ],
                inputs: vec![],
                outputs: vec![BufferId(2)],
            };
            assert_eq!(fold_constants(&mut p), folds, "{n} elements");
        }
    }
}
