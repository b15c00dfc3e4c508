//! Lowering of the data-movement and index-generating ops, checked against the
//! reference evaluator (kernels run by the kernel interpreter).

mod common;

use common::{
    check, compare, floats, infer_inputs, infer_types, int, ints, lower, op, rand, s, typed, Bind, Tol, EXACT, F32,
};
use kiln_flow::{Bounds, Expr};
use kiln_ir::infer::{infer, InferInput};
use kiln_ir::{Attr, DType, Op, OpKind, Shape, Tensor};
use kiln_lower::{interpret, lower_op, Lowered, OpCx, OpInput, Output};

// ---------------------------------------------------------------------------
// Helpers.
// ---------------------------------------------------------------------------

fn ints_attr(v: &[i64]) -> Attr {
    Attr::Ints(v.to_vec())
}

fn i64s(v: &[i64]) -> Tensor {
    ints(&[v.len()], v)
}

fn i32s(dims: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_i64(DType::I32, Shape::new(dims.to_vec()).unwrap(), v).unwrap()
}

fn scalar_i64(v: i64) -> Tensor {
    ints(&[], &[v])
}

fn f32s(v: &[f64]) -> Tensor {
    floats(&[v.len()], v)
}

/// The dtypes every pure movement op is checked with.
const MOVE_TYPES: [DType; 7] = [DType::F32, DType::F64, DType::F16, DType::I8, DType::I64, DType::U16, DType::Bool];

/// Like `common::check`, with each operand marked constant or run-time by `consts`.
fn check_mixed(op: &Op, inputs: &[Option<Tensor>], consts: &[bool], tol: Tol) {
    let lowered = lower_mixed(op, inputs, consts);
    let (out_types, want) = reference(op, inputs);
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let got = interpret(&lowered, &refs, &out_types).unwrap_or_else(|e| panic!("{}: interpret: {e}", op.kind));
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        compare(&format!("{} result {k}", op.kind), g, w, tol);
    }
}

fn out_count(op: &Op, inputs: &[Option<Tensor>]) -> usize {
    let ninfer = infer_inputs(inputs);
    if let Some(n) = op.attrs_of::<kiln_ir::attrs::SplitAttrs>().ok().and_then(|a| a.num_outputs) {
        return n as usize;
    }
    (1..=3).rev().find(|&n| infer(op, &ninfer, n).is_ok()).unwrap_or(1)
}

fn reference(op: &Op, inputs: &[Option<Tensor>]) -> (Vec<kiln_ir::TensorType>, Vec<Tensor>) {
    let out_types = infer_types(op, inputs, out_count(op, inputs));
    let refs: Vec<Option<&Tensor>> = inputs.iter().map(|t| t.as_ref()).collect();
    let want = kiln_ref::eval_op(op, &refs, &out_types).unwrap_or_else(|e| panic!("{}: reference: {e}", op.kind));
    (out_types, want)
}

/// Lowers with the operands marked by `consts` constant.
fn lower_mixed(op: &Op, inputs: &[Option<Tensor>], consts: &[bool]) -> Lowered {
    lower(op, inputs, |i| consts.get(i).copied().unwrap_or(false), &infer_types(op, inputs, out_count(op, inputs)))
}

/// Lowers with operands from `from` on constant.
fn lower_from(op: &Op, inputs: &[Option<Tensor>], from: usize) -> Lowered {
    let consts: Vec<bool> = (0..inputs.len()).map(|i| i >= from).collect();
    lower_mixed(op, inputs, &consts)
}

/// True when no load of any kernel clamps (every index was proved in bounds or pads).
fn no_clamp(l: &Lowered) -> bool {
    l.steps.iter().all(|s| s.kernel.nodes.iter().all(|n| !matches!(n.expr, Expr::Load { bounds: Bounds::Clamp, .. })))
}

/// Lowering fails (as an unsupported form, not a panic).
fn lower_fails(op: &Op, inputs: &[Option<Tensor>], consts: &[bool]) -> String {
    common::lower_fails(op, inputs, |i| consts[i], &infer_types(op, inputs, out_count(op, inputs)))
}

// ---------------------------------------------------------------------------
// Views.
// ---------------------------------------------------------------------------

fn assert_alias(l: &Lowered) {
    assert!(l.steps.is_empty(), "a view needs no kernel");
    assert_eq!(l.outputs, vec![Output::Alias(0)]);
}

#[test]
fn views_alias_their_operand() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[2, 3, 4], k as u64);
        let cases: Vec<(Op, Vec<Option<Tensor>>)> = vec![
            (Op::new(OpKind::Identity), vec![Some(x.clone())]),
            (Op::new(OpKind::Reshape), vec![Some(x.clone()), Some(i64s(&[0, -1, 2]))]),
            (Op::new(OpKind::Reshape), vec![Some(x.clone()), Some(i64s(&[24]))]),
            (op(OpKind::Flatten, &[("axis", int(0))]), vec![Some(x.clone())]),
            (op(OpKind::Flatten, &[("axis", int(2))]), vec![Some(x.clone())]),
            (op(OpKind::Flatten, &[("axis", int(-1))]), vec![Some(x.clone())]),
            (Op::new(OpKind::Flatten), vec![Some(x.clone())]),
            (Op::new(OpKind::Unsqueeze), vec![Some(x.clone()), Some(i64s(&[0, -1]))]),
        ];
        for (o, ins) in cases {
            check(&o, &ins, Bind::ConstFrom(1), EXACT);
            // The shape operands need not be constants: the result type says it all.
            assert_alias(&lower_from(&o, &ins, ins.len()));
        }
    }
    let y = rand(DType::F32, &[1, 3, 1, 2], 9);
    check(&Op::new(OpKind::Squeeze), &[Some(y.clone())], Bind::Runtime, EXACT);
    check(&Op::new(OpKind::Squeeze), &[Some(y.clone()), Some(i64s(&[-2]))], Bind::ConstFrom(1), EXACT);
    assert_alias(&lower_from(&Op::new(OpKind::Squeeze), &[Some(y.clone()), Some(i64s(&[0, 2]))], 1));
    // Empty tensors are views too.
    let e = rand(DType::F32, &[0, 3], 1);
    check(&Op::new(OpKind::Reshape), &[Some(e), Some(i64s(&[0, 1, 3]))], Bind::ConstFrom(1), EXACT);
}

#[test]
fn dropout_is_an_alias_with_an_all_true_mask() {
    let x = rand(DType::F32, &[3, 5], 1);
    let ratio = Tensor::scalar(0.25f32);
    let off = Tensor::scalar(false);
    let on = Tensor::scalar(true);
    let zero = Tensor::scalar(0.0f32);
    let o = Op::new(OpKind::Dropout);
    check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
    check(&o, &[Some(x.clone()), Some(ratio.clone()), Some(off)], Bind::ConstFrom(1), EXACT);
    check(&o, &[Some(x.clone()), Some(zero), Some(on.clone())], Bind::ConstFrom(1), EXACT);
    let l = lower_from(&o, &[Some(x.clone())], 1);
    assert_eq!(l.outputs[0], Output::Alias(0));
    // Training with a non-zero ratio is random: refused.
    lower_fails(&o, &[Some(x.clone()), Some(ratio), Some(on.clone())], &[false, true, true]);
    // A run-time training flag cannot be decided.
    lower_fails(&o, &[Some(x), None, Some(on)], &[false, false, false]);
}

// ---------------------------------------------------------------------------
// Re-indexing.
// ---------------------------------------------------------------------------

#[test]
fn transpose() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[2, 3, 5], k as u64 + 10);
        check(&Op::new(OpKind::Transpose), &[Some(x.clone())], Bind::Runtime, EXACT);
        for p in [[0, 2, 1], [1, 0, 2], [2, 0, 1], [0, 1, 2]] {
            check(&op(OpKind::Transpose, &[("perm", ints_attr(&p))]), &[Some(x.clone())], Bind::Runtime, EXACT);
        }
    }
    let x = rand(DType::F32, &[2, 1, 3, 4], 3);
    let o = op(OpKind::Transpose, &[("perm", ints_attr(&[0, 3, 2, 1]))]);
    check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
    assert!(no_clamp(&lower_from(&o, &[Some(x)], 1)));
}

/// A Transpose that moves only axes of extent 1 (the others keep their order) is a view
/// of its operand: no kernel, the same values; any other permutation is a kernel.
#[test]
fn transpose_of_unit_axes_is_a_view() {
    let x = rand(DType::F32, &[3, 1, 4, 1], 5);
    for p in [[1, 0, 2, 3], [0, 2, 1, 3], [3, 0, 1, 2], [1, 3, 0, 2], [2, 1, 0, 3], [0, 3, 2, 1], [2, 3, 1, 0]] {
        let o = op(OpKind::Transpose, &[("perm", ints_attr(&p))]);
        check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
        let kept: Vec<i64> = p.iter().copied().filter(|&a| a == 0 || a == 2).collect();
        let view = kept == [0, 2];
        let l = lower_from(&o, &[Some(x.clone())], 1);
        assert_eq!(l.outputs == [Output::Alias(0)], view, "perm {p:?}");
        assert_eq!(l.steps.is_empty(), view, "perm {p:?}");
    }
    check(&Op::new(OpKind::Transpose), &[Some(rand(DType::I32, &[7], 1))], Bind::Runtime, EXACT);
    check(&Op::new(OpKind::Transpose), &[Some(rand(DType::I32, &[], 1))], Bind::Runtime, EXACT);
    check(&Op::new(OpKind::Transpose), &[Some(rand(DType::F32, &[0, 3], 1))], Bind::Runtime, EXACT);
}

#[test]
fn slice() {
    let x = rand(DType::F32, &[5, 7, 4], 1);
    // (starts, ends, axes, steps)
    type Case = (Vec<i64>, Vec<i64>, Option<Vec<i64>>, Option<Vec<i64>>);
    let cases: Vec<Case> = vec![
        (vec![1], vec![3], None, None),
        (vec![1, 2], vec![4, 6], None, None),
        (vec![0, 0, 0], vec![5, 7, 4], None, None),
        (vec![-3], vec![-1], Some(vec![1]), None),
        (vec![-100], vec![100], Some(vec![2]), None),
        (vec![2], vec![i64::MAX], Some(vec![-1]), None),
        (vec![6], vec![0], Some(vec![1]), Some(vec![-1])),
        (vec![-1], vec![i64::MIN], Some(vec![1]), Some(vec![-1])),
        (vec![100], vec![-100], Some(vec![1]), Some(vec![-2])),
        (vec![5], vec![1], Some(vec![-2]), Some(vec![-3])),
        (vec![0, 1], vec![5, 7], Some(vec![0, 1]), Some(vec![2, 3])),
        (vec![3, 0], vec![0, 4], Some(vec![-1, 0]), Some(vec![-1, 2])),
        (vec![1], vec![2], Some(vec![1]), Some(vec![i64::MAX])),
        (vec![6], vec![-9], Some(vec![1]), Some(vec![i64::MIN])),
        // Empty results.
        (vec![3], vec![3], None, None),
        (vec![4], vec![1], Some(vec![2]), None),
        (vec![0], vec![5], Some(vec![0]), Some(vec![-1])),
    ];
    for (st, en, ax, sp) in cases {
        let mut ins = vec![Some(x.clone()), Some(i64s(&st)), Some(i64s(&en))];
        ins.push(ax.as_deref().map(i64s));
        ins.push(sp.as_deref().map(i64s));
        let o = Op::new(OpKind::Slice);
        check(&o, &ins, Bind::ConstFrom(1), EXACT);
        assert!(no_clamp(&lower_from(&o, &ins, 1)));
    }
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[6, 3], k as u64);
        let ins = vec![Some(x), Some(i64s(&[-1, 0])), Some(i64s(&[0, 3])), None, Some(i64s(&[-2, 2]))];
        check(&Op::new(OpKind::Slice), &ins, Bind::ConstFrom(1), EXACT);
    }
    // Run-time starts are refused.
    let ins = vec![Some(x), Some(i64s(&[1])), Some(i64s(&[3]))];
    lower_fails(&Op::new(OpKind::Slice), &ins, &[false, false, true]);
}

#[test]
fn pad_constant_edge_reflect_wrap() {
    let x = rand(DType::F32, &[3, 4], 2);
    let pads: Vec<Vec<i64>> = vec![
        vec![1, 2, 3, 1],
        vec![0, 0, 0, 0],
        vec![2, 0, 0, 3],
        vec![-1, 1, 0, -2],
        vec![-1, -1, -1, -1],
        vec![0, 5, 0, 9],
        vec![7, 0, 6, 1],
        vec![-2, 3, 2, -3],
    ];
    for mode in ["constant", "edge", "reflect", "wrap"] {
        let o = op(OpKind::Pad, &[("mode", s(mode))]);
        for p in &pads {
            let ins = vec![Some(x.clone()), Some(i64s(p))];
            check(&o, &ins, Bind::ConstFrom(1), EXACT);
            let l = lower_from(&o, &ins, 1);
            assert!(no_clamp(&l), "{mode} {p:?}");
        }
        // With axes (one negative), and an axis of one element.
        let ins = vec![Some(x.clone()), Some(i64s(&[2, -1, 3, 4])), None, Some(i64s(&[-1, 0]))];
        check(&o, &ins, Bind::ConstFrom(1), EXACT);
        let y = rand(DType::F32, &[1, 5], 3);
        check(&o, &[Some(y), Some(i64s(&[2, 1, 3, 0]))], Bind::ConstFrom(1), EXACT);
        for (k, dt) in MOVE_TYPES.iter().enumerate() {
            let x = rand(*dt, &[2, 3, 2], k as u64 + 4);
            let ins = vec![Some(x), Some(i64s(&[1, 0, 2, 0, 4, -1]))];
            check(&o, &ins, Bind::ConstFrom(1), EXACT);
        }
    }
}

#[test]
fn pad_constant_value() {
    let o = Op::new(OpKind::Pad);
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[2, 3], k as u64);
        let v = typed(*dt, &[], &[-1.5]);
        let ins = vec![Some(x.clone()), Some(i64s(&[1, 2, 2, 0])), Some(v)];
        // As a constant (baked into the load) and read at run time.
        check(&o, &ins, Bind::ConstFrom(1), EXACT);
        check_mixed(&o, &ins, &[false, true, false], EXACT);
        // A one-element (rank 1) value.
        let v1 = typed(*dt, &[1], &[1.0]);
        let ins = vec![Some(x), Some(i64s(&[0, 1, 1, 1])), Some(v1)];
        check(&o, &ins, Bind::ConstFrom(1), EXACT);
        check_mixed(&o, &ins, &[false, true, false], EXACT);
    }
    // Padding an empty tensor: everything is the pad value.
    let e = rand(DType::F32, &[0, 3], 1);
    let ins = vec![Some(e), Some(i64s(&[1, 0, 2, 1])), Some(Tensor::scalar(4.5f32))];
    check(&o, &ins, Bind::ConstFrom(1), EXACT);
    check_mixed(&o, &ins, &[false, true, false], EXACT);
}

#[test]
fn concat() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let a = rand(*dt, &[2, 3, 4], k as u64);
        let b = rand(*dt, &[2, 1, 4], k as u64 + 1);
        let c = rand(*dt, &[2, 5, 4], k as u64 + 2);
        let e = rand(*dt, &[2, 0, 4], 0);
        for axis in [1, -2] {
            let o = op(OpKind::Concat, &[("axis", int(axis))]);
            check(&o, &[Some(a.clone()), Some(b.clone()), Some(c.clone())], Bind::Runtime, EXACT);
            check(&o, &[Some(e.clone()), Some(a.clone()), Some(e.clone()), Some(b.clone())], Bind::Runtime, EXACT);
        }
        let o = op(OpKind::Concat, &[("axis", int(0))]);
        check(&o, &[Some(a.clone()), Some(a.clone())], Bind::Runtime, EXACT);
        check(&o, &[Some(a.clone())], Bind::Runtime, EXACT);
        let o = op(OpKind::Concat, &[("axis", int(-1))]);
        check(&o, &[Some(a.clone()), Some(rand(*dt, &[2, 3, 1], 7))], Bind::Runtime, EXACT);
    }
    // An empty operand is not bound.
    let a = rand(DType::F32, &[3], 1);
    let e = rand(DType::F32, &[0], 1);
    let o = op(OpKind::Concat, &[("axis", int(0))]);
    let ins = vec![Some(e.clone()), Some(a.clone()), Some(e)];
    check(&o, &ins, Bind::Runtime, EXACT);
    assert_eq!(lower_from(&o, &ins, 3).steps[0].operands.len(), 1);
}

#[test]
fn split() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[4, 7], k as u64);
        check(
            &op(OpKind::Split, &[("axis", int(1))]),
            &[Some(x.clone()), Some(i64s(&[2, 0, 5]))],
            Bind::ConstFrom(1),
            EXACT,
        );
        check(
            &op(OpKind::Split, &[("axis", int(-1)), ("num_outputs", int(3))]),
            &[Some(x.clone())],
            Bind::Runtime,
            EXACT,
        );
        check(&op(OpKind::Split, &[("num_outputs", int(2))]), &[Some(x.clone())], Bind::Runtime, EXACT);
        check(&op(OpKind::Split, &[("num_outputs", int(4))]), &[Some(x.clone())], Bind::Runtime, EXACT);
    }
    // One kernel per result.
    let x = rand(DType::F32, &[4, 7], 1);
    let ins = vec![Some(x), Some(i64s(&[1, 3, 3]))];
    let l = lower_from(&op(OpKind::Split, &[("axis", int(1))]), &ins, 1);
    assert_eq!(l.steps.len(), 3);
    assert_eq!(l.outputs, vec![Output::Step(0), Output::Step(1), Output::Step(2)]);
}

#[test]
fn expand_and_tile() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[3, 1], k as u64);
        for shape in [vec![2, 3, 4], vec![3, 1], vec![1], vec![1, 1, 5], vec![3, 0]] {
            check(&Op::new(OpKind::Expand), &[Some(x.clone()), Some(i64s(&shape))], Bind::ConstFrom(1), EXACT);
        }
        let y = rand(*dt, &[2, 3], k as u64 + 5);
        for reps in [vec![1, 1], vec![2, 3], vec![3, 1], vec![1, 4], vec![0, 2]] {
            check(&Op::new(OpKind::Tile), &[Some(y.clone()), Some(i64s(&reps))], Bind::ConstFrom(1), EXACT);
        }
    }
    let s = rand(DType::F32, &[], 1);
    check(&Op::new(OpKind::Expand), &[Some(s), Some(i64s(&[2, 2]))], Bind::ConstFrom(1), EXACT);
}

#[test]
fn depth_to_space_and_space_to_depth() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[2, 8, 3, 2], k as u64);
        for mode in ["DCR", "CRD"] {
            let o = op(OpKind::DepthToSpace, &[("blocksize", int(2)), ("mode", s(mode))]);
            check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
        }
        let y = rand(*dt, &[1, 18, 2, 1], k as u64);
        check(&op(OpKind::DepthToSpace, &[("blocksize", int(3))]), &[Some(y)], Bind::Runtime, EXACT);
        let z = rand(*dt, &[2, 3, 4, 6], k as u64);
        for bs in [1, 2] {
            check(&op(OpKind::SpaceToDepth, &[("blocksize", int(bs))]), &[Some(z.clone())], Bind::Runtime, EXACT);
        }
        let w = rand(*dt, &[1, 2, 3, 6], k as u64);
        check(&op(OpKind::SpaceToDepth, &[("blocksize", int(3))]), &[Some(w)], Bind::Runtime, EXACT);
    }
}

#[test]
fn reverse_sequence() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        // time axis 0, batch axis 1.
        let x = rand(*dt, &[5, 4, 2], k as u64);
        let lens = i64s(&[5, 0, 3, 1]);
        check(&Op::new(OpKind::ReverseSequence), &[Some(x), Some(lens.clone())], Bind::Runtime, EXACT);
        let y = rand(*dt, &[4, 5], k as u64);
        let o = op(OpKind::ReverseSequence, &[("batch_axis", int(0)), ("time_axis", int(1))]);
        check(&o, &[Some(y), Some(lens)], Bind::Runtime, EXACT);
    }
}

#[test]
fn trilu() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[2, 4, 5], k as u64);
        for upper in [0, 1] {
            let o = op(OpKind::Trilu, &[("upper", int(upper))]);
            check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
            for kk in [-7, -2, -1, 0, 1, 3, 9] {
                check(&o, &[Some(x.clone()), Some(scalar_i64(kk))], Bind::ConstFrom(1), EXACT);
            }
        }
    }
    check(&Op::new(OpKind::Trilu), &[Some(rand(DType::F32, &[1, 1], 1))], Bind::Runtime, EXACT);
    check(&Op::new(OpKind::Trilu), &[Some(rand(DType::F32, &[3, 0], 1))], Bind::Runtime, EXACT);
}

// ---------------------------------------------------------------------------
// Data-dependent indexing.
// ---------------------------------------------------------------------------

#[test]
fn gather() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[5, 4, 3], k as u64);
        let idx = [ints(&[2, 3], &[0, -1, 4, -5, 2, 2]), i32s(&[4], &[3, -2, 0, 1]), scalar_i64(-2), ints(&[0], &[])];
        for axis in [0, 1, -1] {
            let o = op(OpKind::Gather, &[("axis", int(axis))]);
            for i in &idx {
                // Indices that fit every axis (the smallest is 3).
                let ok = i.to_i64_vec().unwrap().iter().all(|&v| (-3..3).contains(&v));
                if axis == 0 || ok {
                    check(&o, &[Some(x.clone()), Some(i.clone())], Bind::Runtime, EXACT);
                    check(&o, &[Some(x.clone()), Some(i.clone())], Bind::ConstFrom(1), EXACT);
                }
            }
        }
    }
    // Constant progressions become affine indices; other constants are still data.
    let x = rand(DType::F32, &[6, 2], 1);
    let o = Op::new(OpKind::Gather);
    for i in [scalar_i64(-1), i64s(&[1, 3, 5]), i64s(&[-1, -3, -5]), i64s(&[2]), i64s(&[4, 4, 4]), i64s(&[0, 2, 1])] {
        let ins = vec![Some(x.clone()), Some(i.clone())];
        check(&o, &ins, Bind::ConstFrom(1), EXACT);
        let l = lower_from(&o, &ins, 1);
        let progression = i.to_i64_vec().unwrap() != [0, 2, 1];
        assert_eq!(no_clamp(&l), progression, "{i:?}");
        assert_eq!(l.steps[0].operands.len(), if progression { 1 } else { 2 });
    }
}

#[test]
fn gather_elements() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[3, 4], k as u64);
        let i0 = ints(&[2, 4], &[0, -1, 2, 1, -3, 2, 0, 0]);
        check(&op(OpKind::GatherElements, &[("axis", int(0))]), &[Some(x.clone()), Some(i0)], Bind::Runtime, EXACT);
        let i1 = i32s(&[3, 2], &[3, -4, 0, 1, -1, 2]);
        check(&op(OpKind::GatherElements, &[("axis", int(-1))]), &[Some(x.clone()), Some(i1)], Bind::Runtime, EXACT);
        let i2 = ints(&[2, 5], &[0, 1, 2, 3, 3, -1, -2, -3, -4, 0]);
        check(&op(OpKind::GatherElements, &[("axis", int(1))]), &[Some(x.clone()), Some(i2)], Bind::Runtime, EXACT);
    }
    let x = rand(DType::F32, &[2, 3, 2], 5);
    let i = ints(&[2, 2, 2], &[1, 0, 2, -1, 0, 0, -3, 2]);
    check(&op(OpKind::GatherElements, &[("axis", int(1))]), &[Some(x), Some(i)], Bind::Runtime, EXACT);
}

#[test]
fn gather_nd() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[3, 4, 2], k as u64);
        let cases = [
            ints(&[2, 1], &[2, -3]),
            ints(&[2, 2], &[0, 3, -1, -4]),
            ints(&[3, 3], &[0, 0, 1, 2, 3, 0, -1, -1, -1]),
            ints(&[2, 2, 2], &[0, 1, 2, 2, 1, 0, 0, -2]),
            ints(&[1], &[1]),
        ];
        for i in cases {
            check(&Op::new(OpKind::GatherND), &[Some(x.clone()), Some(i)], Bind::Runtime, EXACT);
        }
        let o = op(OpKind::GatherND, &[("batch_dims", int(1))]);
        check(&o, &[Some(x.clone()), Some(ints(&[3, 1], &[1, -1, 0]))], Bind::Runtime, EXACT);
        check(
            &o,
            &[Some(x.clone()), Some(ints(&[3, 2, 2], &[0, 1, 3, 0, 2, 1, 1, 1, -1, -1, 0, 0]))],
            Bind::Runtime,
            EXACT,
        );
        check(&o, &[Some(x.clone()), Some(i32s(&[3, 2, 1], &[0, 1, 3, 0, -2, 1]))], Bind::Runtime, EXACT);
        let o = op(OpKind::GatherND, &[("batch_dims", int(2))]);
        check(
            &o,
            &[Some(x.clone()), Some(ints(&[3, 4, 1], &[0, 1, 1, 0, 1, 1, 0, 0, -1, -2, 1, 0]))],
            Bind::Runtime,
            EXACT,
        );
    }
}

/// Out-of-range data indices read some element of the tensor (clamped), never outside it.
#[test]
fn invalid_indices_stay_in_bounds() {
    let x = rand(DType::F32, &[4, 3], 1);
    let bad = ints(&[3], &[100, -100, i64::MIN]);
    let cases: Vec<(Op, Vec<Option<Tensor>>)> = vec![
        (Op::new(OpKind::Gather), vec![Some(x.clone()), Some(bad.clone())]),
        (Op::new(OpKind::GatherElements), vec![Some(x.clone()), Some(ints(&[1, 3], &[100, -100, 7]))]),
        (Op::new(OpKind::GatherND), vec![Some(x.clone()), Some(ints(&[3, 1], &[100, -100, 9]))]),
        (Op::new(OpKind::ReverseSequence), vec![Some(x.clone()), Some(i64s(&[9, -4, 100]))]),
    ];
    for (o, ins) in cases {
        let refs: Vec<Option<&Tensor>> = ins.iter().map(|t| t.as_ref()).collect();
        // Shape inference only needs the types here.
        let ninfer: Vec<Option<InferInput>> =
            ins.iter().map(|t| t.as_ref().map(|t| InferInput { ty: t.ty(), value: None })).collect();
        let out_types = infer(&o, &ninfer, 1).unwrap();
        let opin: Vec<Option<OpInput>> =
            ins.iter().map(|t| t.as_ref().map(|t| OpInput { ty: t.ty(), value: None })).collect();
        let cx = OpCx { op: &o, name: "t", inputs: &opin, outputs: &out_types };
        let l = lower_op(&cx).unwrap();
        let got = interpret(&l, &refs, &out_types).unwrap();
        // Every element read is an element of x.
        let xs = x.to_f64_vec();
        assert!(got[0].to_f64_vec().iter().all(|v| xs.contains(v)), "{}", o.kind);
    }
}

#[test]
fn one_hot() {
    let idx = [
        ints(&[2, 3], &[0, 4, -1, -5, 5, 2]),
        i32s(&[4], &[1, 7, -6, 3]),
        typed(DType::F32, &[5], &[1.7, -2.3, f64::NAN, 4.99, -0.5]),
        typed(DType::F64, &[2], &[1e30, -1e30]),
        Tensor::from_i64(DType::U8, Shape::new(vec![3]).unwrap(), &[0, 4, 200]).unwrap(),
        ints(&[], &[3]),
    ];
    let values = [
        f32s(&[-1.0, 2.5]),
        i32s(&[2], &[0, 9]),
        typed(DType::F16, &[2], &[0.5, 1.0]),
        Tensor::from_i64(DType::Bool, Shape::new(vec![2]).unwrap(), &[0, 1]).unwrap(),
    ];
    for i in &idx {
        let r = i.shape().rank() as i64;
        for v in &values {
            for axis in (-r - 1..=r).step_by(1) {
                let o = op(OpKind::OneHot, &[("axis", int(axis))]);
                let ins = vec![Some(i.clone()), Some(scalar_i64(5)), Some(v.clone())];
                check(&o, &ins, Bind::ConstFrom(1), EXACT);
                check(&o, &ins, Bind::Runtime, EXACT);
            }
        }
    }
    // Float depth, default axis.
    let ins = vec![Some(idx[0].clone()), Some(Tensor::scalar(3.9f32)), Some(values[0].clone())];
    check(&Op::new(OpKind::OneHot), &ins, Bind::ConstFrom(1), EXACT);
}

fn scatter_op(kind: OpKind, reduction: &str, axis: Option<i64>) -> Op {
    let mut attrs = vec![("reduction", s(reduction))];
    if let Some(a) = axis {
        attrs.push(("axis", int(a)));
    }
    op(kind, &attrs)
}

#[test]
fn scatter_elements() {
    let dts = [DType::F32, DType::F64, DType::I32, DType::U8, DType::I64, DType::Bool, DType::F16];
    for (k, dt) in dts.iter().enumerate() {
        let x = rand(*dt, &[4, 3], k as u64);
        // Duplicates (0 and -4 are the same row), smaller index dims.
        let i0 = ints(&[3, 3], &[0, 1, 2, -4, 3, 2, 1, 1, -1]);
        let u0 = rand(*dt, &[3, 3], k as u64 + 20);
        let i1 = i32s(&[2, 2], &[2, -1, 0, 2]);
        let u1 = rand(*dt, &[2, 2], k as u64 + 30);
        for red in ["none", "add", "mul", "max", "min"] {
            // Products of several updates round differently in sequence and at once.
            let tol = if red == "mul" || *dt == DType::F16 { Tol { rtol: 1e-3, atol: 1e-3 } } else { EXACT };
            let o = scatter_op(OpKind::ScatterElements, red, None);
            check(&o, &[Some(x.clone()), Some(i0.clone()), Some(u0.clone())], Bind::Runtime, tol);
            let o = scatter_op(OpKind::ScatterElements, red, Some(-1));
            check(&o, &[Some(x.clone()), Some(i1.clone()), Some(u1.clone())], Bind::Runtime, tol);
            check(&o, &[Some(x.clone()), Some(ints(&[4, 0], &[])), Some(rand(*dt, &[4, 0], 1))], Bind::Runtime, tol);
        }
    }
    // Rank 3 with every index hitting one element.
    let x = rand(DType::F32, &[2, 3, 2], 1);
    let i = ints(&[2, 2, 2], &[1, 1, 1, 1, -2, 1, 1, 1]);
    let u = rand(DType::F32, &[2, 2, 2], 2);
    for red in ["none", "add", "max", "min"] {
        check(
            &scatter_op(OpKind::ScatterElements, red, Some(1)),
            &[Some(x.clone()), Some(i.clone()), Some(u.clone())],
            Bind::Runtime,
            EXACT,
        );
    }
}

#[test]
fn scatter_nd() {
    let dts = [DType::F32, DType::F64, DType::I32, DType::U16, DType::Bool, DType::F16];
    for (k, dt) in dts.iter().enumerate() {
        let x = rand(*dt, &[4, 3, 2], k as u64);
        let cases = [
            // Rows (m = 1) with a duplicate (1 and -3).
            (ints(&[3, 1], &[1, -1, -3]), vec![3, 3, 2]),
            // Pairs (m = 2).
            (ints(&[2, 2, 2], &[0, 0, 3, 2, 0, 0, -1, -1]), vec![2, 2, 2]),
            // Elements (m = 3).
            (i32s(&[4, 3], &[0, 0, 0, 3, 2, 1, 0, 0, 0, 2, 1, 0]), vec![4]),
            // A single tuple (indices of rank 1).
            (ints(&[2], &[2, 1]), vec![2]),
        ];
        for red in ["none", "add", "mul", "max", "min"] {
            let tol = if red == "mul" || *dt == DType::F16 { Tol { rtol: 1e-3, atol: 1e-3 } } else { EXACT };
            for (c, (i, ud)) in cases.iter().enumerate() {
                let u = rand(*dt, ud, (k * 10 + c) as u64 + 40);
                let o = scatter_op(OpKind::ScatterND, red, None);
                check(&o, &[Some(x.clone()), Some(i.clone()), Some(u)], Bind::Runtime, tol);
            }
        }
    }
}

/// Scatters of plain types are scatter kernels (one step per update, not per output
/// element); narrow floats keep the gather form.
#[test]
fn scatters_store_per_update() {
    for (kind, dt, scatter) in [
        (OpKind::ScatterElements, DType::F32, true),
        (OpKind::ScatterND, DType::I64, true),
        (OpKind::ScatterND, DType::Bool, true),
        (OpKind::ScatterElements, DType::F16, false),
    ] {
        let x = rand(dt, &[6, 5], 1);
        let (i, u) = match kind {
            OpKind::ScatterND => (ints(&[2, 1], &[4, -1]), rand(dt, &[2, 5], 2)),
            _ => (ints(&[1, 5], &[4, -1, 0, 3, 2]), rand(dt, &[1, 5], 2)),
        };
        for red in ["none", "add"] {
            let o = scatter_op(kind, red, None);
            let ins = [Some(x.clone()), Some(i.clone()), Some(u.clone())];
            let l = lower_mixed(&o, &ins, &[false, false, false]);
            let k = &l.steps[0].kernel;
            assert_eq!(k.scatter.is_some(), scatter, "{kind} {dt:?} {red}");
            if scatter {
                // The domain is the updates' index space.
                assert_eq!(k.index_dims(), u.shape().dims().iter().map(|&d| d as u64).collect::<Vec<_>>());
            }
        }
    }
}

/// An index still outside its axis after wrapping drops its update: the result is the
/// reference's for the same scatter without that update (ONNX calls such an index
/// invalid; kiln never writes outside the output).
#[test]
fn scatter_drops_an_out_of_range_update() {
    let x = rand(DType::F32, &[4, 3], 5);
    let u = rand(DType::F32, &[2, 3], 6);
    for red in ["none", "add", "mul", "max", "min"] {
        // ScatterND: row 9 and row -5 are outside 0..4; only row 2 lands.
        let o = scatter_op(OpKind::ScatterND, red, None);
        for bad in [9, -5] {
            let ins = [Some(x.clone()), Some(ints(&[2, 1], &[bad, 2])), Some(u.clone())];
            let l = lower_mixed(&o, &ins, &[false, false, false]);
            let refs: Vec<Option<&Tensor>> = ins.iter().map(|t| t.as_ref()).collect();
            let second = Tensor::from_f64(DType::F32, Shape::new(vec![1, 3]).unwrap(), &u.to_f64_vec()[3..]).unwrap();
            let (types, want) = reference(&o, &[Some(x.clone()), Some(ints(&[1, 1], &[2])), Some(second)]);
            let got = interpret(&l, &refs, &types).unwrap();
            compare(&format!("ScatterND {red} index {bad}"), &got[0], &want[0], EXACT);
        }
        // ScatterElements along axis 1: index 7 in the middle of the updates.
        let o = scatter_op(OpKind::ScatterElements, red, Some(1));
        let ins = [Some(x.clone()), Some(ints(&[1, 3], &[2, 7, 0])), Some(floats(&[1, 3], &[1.5, 2.5, 3.5]))];
        let l = lower_mixed(&o, &ins, &[false, false, false]);
        let refs: Vec<Option<&Tensor>> = ins.iter().map(|t| t.as_ref()).collect();
        let (types, _) = reference(&o, &[Some(x.clone()), Some(ints(&[1, 1], &[2])), Some(floats(&[1, 1], &[1.5]))]);
        let got = interpret(&l, &refs, &types).unwrap();
        // Without the bad update: indices [2, 0] for updates [1.5, 3.5] (columns of row 0).
        let o2 = scatter_op(OpKind::ScatterElements, red, Some(1));
        let (_, a) = reference(&o2, &[Some(x.clone()), Some(ints(&[1, 1], &[2])), Some(floats(&[1, 1], &[1.5]))]);
        let (_, want) = reference(&o2, &[Some(a[0].clone()), Some(ints(&[1, 1], &[0])), Some(floats(&[1, 1], &[3.5]))]);
        compare(&format!("ScatterElements {red}"), &got[0], &want[0], EXACT);
    }
}

// ---------------------------------------------------------------------------
// Generators.
// ---------------------------------------------------------------------------

#[test]
fn eye_like() {
    for dt in MOVE_TYPES {
        let x = rand(dt, &[3, 5], 1);
        for k in [-4, -1, 0, 2, 6] {
            check(&op(OpKind::EyeLike, &[("k", int(k))]), &[Some(x.clone())], Bind::Runtime, EXACT);
        }
    }
    let x = rand(DType::F32, &[4, 2], 1);
    for code in [7, 10, 9, 11] {
        check(&op(OpKind::EyeLike, &[("dtype", int(code))]), &[Some(x.clone())], Bind::Runtime, EXACT);
    }
    // No inputs are read.
    let l = lower_from(&Op::new(OpKind::EyeLike), &[Some(x)], 1);
    assert!(l.steps[0].operands.is_empty());
}

#[test]
fn range() {
    let cases: Vec<(DType, f64, f64, f64)> = vec![
        (DType::I64, 0.0, 10.0, 3.0),
        (DType::I64, 5.0, -7.0, -2.0),
        (DType::I32, -3.0, 4.0, 1.0),
        (DType::I16, 10.0, 10.0, 1.0),
        (DType::F32, 0.5, 3.2, 0.3),
        (DType::F32, 1.0, -1.0, -0.25),
        (DType::F64, -2.0, 5.0, 0.7),
        (DType::F16, 0.0, 2.0, 0.125),
    ];
    for (dt, a, l, d) in cases {
        let ins = vec![Some(typed(dt, &[], &[a])), Some(typed(dt, &[], &[l])), Some(typed(dt, &[], &[d]))];
        check(&Op::new(OpKind::Range), &ins, Bind::Const, EXACT);
        check(&Op::new(OpKind::Range), &ins, Bind::Runtime, EXACT);
    }
}

#[test]
fn constant_of_shape() {
    let values = [
        None,
        Some(Tensor::from_i64(DType::I64, Shape::new(vec![1]).unwrap(), &[-7]).unwrap()),
        Some(typed(DType::F16, &[1], &[2.5])),
        Some(typed(DType::F64, &[1], &[-0.1])),
        Some(Tensor::from_i64(DType::Bool, Shape::new(vec![1]).unwrap(), &[1]).unwrap()),
        Some(Tensor::from_i64(DType::U32, Shape::new(vec![1]).unwrap(), &[4_000_000_000]).unwrap()),
    ];
    for v in values {
        let o = match v {
            Some(t) => op(OpKind::ConstantOfShape, &[("value", Attr::Tensor(t))]),
            None => Op::new(OpKind::ConstantOfShape),
        };
        for shape in [vec![2, 3], vec![], vec![4, 0], vec![7]] {
            check(&o, &[Some(i64s(&shape))], Bind::Const, EXACT);
        }
    }
}

#[test]
fn shape_and_size() {
    let x = rand(DType::F16, &[2, 3, 5, 7], 1);
    let ranges: [(Option<i64>, Option<i64>); 7] = [
        (None, None),
        (Some(1), None),
        (Some(-2), None),
        (None, Some(-1)),
        (Some(1), Some(3)),
        (Some(3), Some(1)),
        (Some(-100), Some(100)),
    ];
    for (st, en) in ranges {
        let mut attrs = Vec::new();
        if let Some(v) = st {
            attrs.push(("start", int(v)));
        }
        if let Some(v) = en {
            attrs.push(("end", int(v)));
        }
        let o = op(OpKind::Shape, &attrs);
        check(&o, &[Some(x.clone())], Bind::Runtime, EXACT);
        assert!(lower_from(&o, &[Some(x.clone())], 1).steps[0].operands.is_empty());
    }
    check(&Op::new(OpKind::Shape), &[Some(rand(DType::F32, &[], 1))], Bind::Runtime, EXACT);
    for d in [vec![2, 3, 5], vec![], vec![4, 0]] {
        check(&Op::new(OpKind::Size), &[Some(rand(DType::I8, &d, 1))], Bind::Runtime, EXACT);
    }
}

#[test]
fn cumsum() {
    let dts = [DType::F32, DType::F64, DType::F16, DType::I32, DType::I8, DType::U8, DType::I64];
    for (k, dt) in dts.iter().enumerate() {
        let x = rand(*dt, &[3, 5, 2], k as u64);
        for axis in [0, 1, -1, -2] {
            for exclusive in [0, 1] {
                for reverse in [0, 1] {
                    let o = op(OpKind::CumSum, &[("exclusive", int(exclusive)), ("reverse", int(reverse))]);
                    // Quarter-step sums are exact in f32; f16 rounds each result once.
                    let tol = if *dt == DType::F16 { Tol { rtol: 1e-3, atol: 1e-3 } } else { F32 };
                    check(&o, &[Some(x.clone()), Some(scalar_i64(axis))], Bind::ConstFrom(1), tol);
                }
            }
        }
    }
    let x = rand(DType::I32, &[17], 3);
    check(&Op::new(OpKind::CumSum), &[Some(x), Some(i64s(&[0]))], Bind::ConstFrom(1), EXACT);
    check(
        &Op::new(OpKind::CumSum),
        &[Some(rand(DType::F32, &[0, 3], 3)), Some(scalar_i64(1))],
        Bind::ConstFrom(1),
        EXACT,
    );
}

// ---------------------------------------------------------------------------
// Resize.
// ---------------------------------------------------------------------------

const CTMS: [&str; 6] =
    ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_crop_and_resize"];

/// Interpolation in f32 against the reference's f64.
const RESIZE_TOL: Tol = Tol { rtol: 1e-5, atol: 1e-5 };

fn resize_op(attrs: &[(&str, Attr)]) -> Op {
    op(OpKind::Resize, attrs)
}

/// Resize inputs: X, roi (for tf_crop_and_resize), and scales or sizes.
fn resize_inputs(
    x: &Tensor,
    ctm: &str,
    scales: Option<&[f64]>,
    sizes: Option<&[i64]>,
    axes: usize,
) -> Vec<Option<Tensor>> {
    let roi = (ctm == "tf_crop_and_resize").then(|| {
        let mut v = Vec::new();
        for k in 0..axes {
            v.push([0.1, -0.2, 0.0, 0.3][k % 4]);
        }
        for k in 0..axes {
            v.push([0.8, 1.1, 1.0, 0.6][k % 4]);
        }
        f32s(&v)
    });
    vec![Some(x.clone()), roi, scales.map(f32s), sizes.map(i64s)]
}

/// Checks the Resize `o` on `x` with constant scales or sizes (see `resize_inputs`).
fn check_resize(o: &Op, x: &Tensor, ctm: &str, scales: Option<&[f64]>, sizes: Option<&[i64]>, axes: usize, tol: Tol) {
    check(o, &resize_inputs(x, ctm, scales, sizes, axes), Bind::ConstFrom(1), tol);
}

#[test]
fn resize_nearest_every_mode() {
    let x = rand(DType::F32, &[1, 2, 5, 4], 1);
    let scales: [&[f64]; 5] = [
        &[1.0, 1.0, 2.0, 2.0],
        &[1.0, 1.0, 0.5, 1.5],
        &[1.0, 1.0, 1.7, 0.6],
        &[1.0, 1.0, 3.0, 0.75],
        &[1.0, 1.0, 1.0, 1.0],
    ];
    let sizes: [&[i64]; 3] = [&[1, 2, 7, 3], &[1, 2, 2, 9], &[1, 2, 1, 1]];
    for ctm in CTMS {
        for nm in ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"] {
            let o = resize_op(&[
                ("coordinate_transformation_mode", s(ctm)),
                ("nearest_mode", s(nm)),
                ("extrapolation_value", Attr::Float(-3.5)),
            ]);
            for sc in scales {
                check_resize(&o, &x, ctm, Some(sc), None, 4, EXACT);
            }
            for sz in sizes {
                check_resize(&o, &x, ctm, None, Some(sz), 4, EXACT);
            }
        }
    }
}

#[test]
fn resize_nearest_integer_forms() {
    // Common scales map to integer index arithmetic, checked against the reference.
    let x = rand(DType::F32, &[1, 1, 6, 8], 2);
    for ctm in ["half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"] {
        for nm in ["round_prefer_floor", "floor", "ceil", "round_prefer_ceil"] {
            let o = resize_op(&[("coordinate_transformation_mode", s(ctm)), ("nearest_mode", s(nm))]);
            for sc in [[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 0.5, 0.25], [1.0, 1.0, 3.0, 1.5]] {
                let ins = resize_inputs(&x, ctm, Some(&sc), None, 4);
                check(&o, &ins, Bind::ConstFrom(1), EXACT);
            }
        }
    }
    // Upsampling by 2 (asymmetric, floor) needs no floats at all.
    let o = resize_op(&[("coordinate_transformation_mode", s("asymmetric")), ("nearest_mode", s("floor"))]);
    let l = lower_from(&o, &resize_inputs(&x, "asymmetric", Some(&[1.0, 1.0, 2.0, 2.0]), None, 4), 1);
    let k = &l.steps[0].kernel;
    assert!(k.nodes.iter().all(|n| !n.ty.is_float() || matches!(n.expr, Expr::Load { .. })), "{k}");
}

#[test]
fn resize_nearest_dtypes_axes_and_policies() {
    for (k, dt) in MOVE_TYPES.iter().enumerate() {
        let x = rand(*dt, &[2, 3, 5], k as u64);
        let o = resize_op(&[("axes", ints_attr(&[-1, 1]))]);
        check_resize(&o, &x, "half_pixel", Some(&[2.5, 0.7]), None, 2, EXACT);
        let o = resize_op(&[
            ("coordinate_transformation_mode", s("tf_crop_and_resize")),
            ("axes", ints_attr(&[2])),
            ("extrapolation_value", Attr::Float(300.7)),
        ]);
        check_resize(&o, &x, "tf_crop_and_resize", Some(&[1.6]), None, 1, EXACT);
    }
    let x = rand(DType::F32, &[1, 1, 4, 6], 3);
    for policy in ["stretch", "not_larger", "not_smaller"] {
        let o = resize_op(&[("keep_aspect_ratio_policy", s(policy)), ("axes", ints_attr(&[2, 3]))]);
        for sz in [[7, 7], [2, 9], [1, 3]] {
            check_resize(&o, &x, "half_pixel", None, Some(&sz), 2, EXACT);
        }
    }
    // Empty scales next to sizes count as absent.
    let ins = vec![Some(x.clone()), None, Some(f32s(&[])), Some(i64s(&[1, 1, 3, 3]))];
    check(&Op::new(OpKind::Resize), &ins, Bind::ConstFrom(1), EXACT);
}

#[test]
fn resize_linear_and_cubic() {
    let x = rand(DType::F32, &[1, 2, 5, 6], 4);
    let scales: [&[f64]; 4] =
        [&[1.0, 1.0, 2.0, 1.5], &[1.0, 1.0, 0.6, 0.5], &[1.0, 1.0, 1.0, 1.0], &[1.0, 1.0, 1.0, 2.7]];
    for mode in ["linear", "cubic"] {
        for ctm in CTMS {
            for exclude in [0, 1] {
                let o = resize_op(&[
                    ("mode", s(mode)),
                    ("coordinate_transformation_mode", s(ctm)),
                    ("exclude_outside", int(exclude)),
                    ("extrapolation_value", Attr::Float(0.25)),
                ]);
                for sc in scales {
                    check_resize(&o, &x, ctm, Some(sc), None, 4, RESIZE_TOL);
                }
                check_resize(&o, &x, ctm, None, Some(&[1, 2, 3, 11]), 4, RESIZE_TOL);
            }
        }
        let o = resize_op(&[("mode", s(mode)), ("cubic_coeff_a", Attr::Float(-0.5))]);
        check_resize(&o, &x, "half_pixel", Some(&[1.0, 1.0, 1.4, 0.8]), None, 4, RESIZE_TOL);
    }
}

#[test]
fn resize_antialias() {
    let x = rand(DType::F32, &[1, 1, 9, 8], 5);
    for mode in ["linear", "cubic"] {
        for ctm in ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric"] {
            for exclude in [0, 1] {
                let o = resize_op(&[
                    ("mode", s(mode)),
                    ("antialias", int(1)),
                    ("coordinate_transformation_mode", s(ctm)),
                    ("exclude_outside", int(exclude)),
                ]);
                for sc in [[1.0, 1.0, 0.5, 0.3], [1.0, 1.0, 0.75, 1.5], [1.0, 1.0, 2.0, 1.0]] {
                    check_resize(&o, &x, ctm, Some(&sc), None, 4, RESIZE_TOL);
                }
                check_resize(&o, &x, ctm, None, Some(&[1, 1, 4, 3]), 4, RESIZE_TOL);
            }
        }
    }
}

#[test]
fn resize_interp_dtypes() {
    let f16_tol = Tol { rtol: 2e-3, atol: 2e-3 };
    for dt in [DType::F64, DType::F16, DType::U8, DType::I32, DType::I8] {
        let base = rand(DType::F32, &[1, 3, 4, 5], 6);
        // Integer images with a wide range, so rounding matters.
        let x = if dt.is_int() {
            let v: Vec<f64> = base
                .to_f64_vec()
                .iter()
                .map(|v| (v * 40.0).round() + if dt == DType::U8 { 100.0 } else { 0.0 })
                .collect();
            typed(dt, &[1, 3, 4, 5], &v)
        } else {
            typed(dt, &[1, 3, 4, 5], &base.to_f64_vec())
        };
        let tol = if dt == DType::F16 { f16_tol } else { RESIZE_TOL };
        for mode in ["linear", "cubic"] {
            for aa in [0, 1] {
                let o = resize_op(&[("mode", s(mode)), ("antialias", int(aa)), ("axes", ints_attr(&[2, 3]))]);
                for sc in [[1.5, 0.6], [2.0, 3.0], [0.5, 1.0]] {
                    check_resize(&o, &x, "half_pixel", Some(&sc), None, 2, tol);
                }
            }
        }
        let o = resize_op(&[
            ("mode", s("linear")),
            ("coordinate_transformation_mode", s("tf_crop_and_resize")),
            ("extrapolation_value", Attr::Float(-1000.0)),
        ]);
        check_resize(&o, &x, "tf_crop_and_resize", Some(&[1.0, 1.0, 1.5, 2.0]), None, 4, tol);
    }
}

#[test]
fn resize_rank1_and_rank3() {
    let x = rand(DType::F32, &[7], 8);
    for mode in ["nearest", "linear", "cubic"] {
        let o = resize_op(&[("mode", s(mode))]);
        for sc in [0.5, 1.0, 2.2, 3.0] {
            check_resize(&o, &x, "half_pixel", Some(&[sc]), None, 1, RESIZE_TOL);
        }
    }
    let x = rand(DType::F32, &[2, 3, 4], 9);
    for mode in ["nearest", "linear", "cubic"] {
        let o = resize_op(&[("mode", s(mode)), ("coordinate_transformation_mode", s("align_corners"))]);
        check_resize(&o, &x, "align_corners", Some(&[1.5, 2.0, 0.75]), None, 3, RESIZE_TOL);
    }
}

#[test]
fn resize_needs_constant_scales() {
    let x = rand(DType::F32, &[1, 1, 4, 4], 1);
    let ins = resize_inputs(&x, "half_pixel", Some(&[1.0, 1.0, 2.0, 2.0]), None, 4);
    lower_fails(&Op::new(OpKind::Resize), &ins, &[false, false, false, false]);
}
