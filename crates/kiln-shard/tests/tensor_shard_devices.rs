//! The sharding pass (`kiln_shard::shard`) checked without the compiler: every
//! per-device segment is evaluated by the reference evaluator, the collectives are
//! done here in plain loops, and device 0's outputs must equal the reference's outputs
//! of the unsharded graph. The layouts, the products split by columns and rows and the
//! collectives placed are checked too, and malformed requests give typed errors.
//!
//! Tolerance: splitting a product by rows changes only where its f32 sum is cut (each
//! device's K/N terms, then the all-reduce's N partial sums, added here in f64 and
//! rounded once); with K ≤ 64 and O(1) values the difference is a few ulps, checked
//! within `1e-5·|x| + 1e-5`. A wrong slice or a missing or doubled bias is off by O(1).

use kiln_ir::op::{Attr, Attrs, Op, OpKind};
use kiln_ir::{DType, Graph, Shape, Tensor, TensorType, ValueId};
use kiln_shard::{shard, CollectiveKind, Layout, Port, ShardError, Sharded};

fn ty(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).expect("shape"))
}

/// Seeded values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = kiln_filetest::fuzz::XorShift::spread(seed);
    (0..n).map(|_| (r.next() % 2000) as f32 / 1000.0 - 1.0).collect()
}

fn constant(g: &mut Graph, name: &str, dims: &[usize], seed: u64) -> ValueId {
    let n = dims.iter().product();
    let t = Tensor::from_vec(Shape::new(dims.to_vec()).expect("shape"), values(n, seed)).expect("tensor");
    g.add_const(name, t)
}

fn node(g: &mut Graph, op: Op, inputs: &[ValueId], name: &str, out: &[usize]) -> ValueId {
    let (_, outs) = g.add_node(name, op, inputs.iter().map(|&v| Some(v)).collect(), vec![(name.into(), ty(out))]);
    outs[0]
}

/// x[4, 8] → MatMul W1[8, h] + b1 → Relu → MatMul W2[h, 8] + b2 → (+ x) → output.
fn mlp(h: usize) -> Graph {
    let mut g = Graph::new("mlp");
    let x = g.add_input("x", ty(&[4, 8]));
    let w1 = constant(&mut g, "w1", &[8, h], 1);
    let b1 = constant(&mut g, "b1", &[h], 2);
    let w2 = constant(&mut g, "w2", &[h, 8], 3);
    let b2 = constant(&mut g, "b2", &[8], 4);
    let y = node(&mut g, Op::new(OpKind::MatMul), &[x, w1], "fc1", &[4, h]);
    let y = node(&mut g, Op::new(OpKind::Add), &[y, b1], "fc1.bias", &[4, h]);
    let y = node(&mut g, Op::new(OpKind::Relu), &[y], "relu", &[4, h]);
    let y = node(&mut g, Op::new(OpKind::MatMul), &[y, w2], "fc2", &[4, 8]);
    let y = node(&mut g, Op::new(OpKind::Add), &[y, b2], "fc2.bias", &[4, 8]);
    let y = node(&mut g, Op::new(OpKind::Add), &[y, x], "residual", &[4, 8]);
    g.outputs.push(y);
    g
}

fn inputs(g: &Graph) -> Vec<Tensor> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let t = g.ty(v);
            Tensor::from_vec(t.shape.clone(), values(t.shape.numel(), 100 + i as u64)).expect("input")
        })
        .collect()
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.to_vec::<f32>().expect("f32")
}

/// Runs the sharded graph: segments by the reference evaluator, collectives here.
fn simulate(sh: &Sharded, inputs: &[Tensor]) -> Vec<Tensor> {
    let mut ex: Vec<Option<Tensor>> = vec![None; sh.exchanges.len()];
    for stage in 0..sh.stages() {
        for seg in sh.segments.iter().filter(|s| s.stage == stage) {
            let feeds: Vec<Tensor> = seg
                .inputs
                .iter()
                .map(|p| match p {
                    Port::Input(i) => inputs[*i].clone(),
                    Port::Exchange(e) => ex[*e].clone().expect("an exchange read before it is written"),
                })
                .collect();
            let outs = kiln_ref::eval_graph(&seg.graph, &feeds).expect("segment");
            for (o, &e) in outs.into_iter().zip(&seg.outputs) {
                assert_eq!(o.ty(), &sh.exchanges[e].ty, "exchange {} type", sh.exchanges[e].name);
                ex[e] = Some(o);
            }
        }
        for c in sh.collectives.iter().filter(|c| c.after_stage == stage) {
            let parts: Vec<Tensor> = c.src.iter().map(|&e| ex[e].clone().expect("a collective's source")).collect();
            let full = &sh.exchanges[c.dst[0]].ty;
            let result = match c.kind {
                CollectiveKind::AllReduce => {
                    let mut acc = vec![0f64; full.shape.numel()];
                    for p in &parts {
                        for (a, x) in acc.iter_mut().zip(f32s(p)) {
                            *a += x as f64;
                        }
                    }
                    Tensor::from_f64(DType::F32, full.shape.clone(), &acc).expect("sum")
                }
                CollectiveKind::AllGather { axis } => {
                    let dims = full.shape.dims();
                    let outer: usize = dims[..axis].iter().product();
                    let n = parts.len();
                    let block = full.shape.numel() / outer / n;
                    let mut out = Vec::with_capacity(full.shape.numel());
                    for o in 0..outer {
                        for p in &parts {
                            out.extend_from_slice(&f32s(p)[o * block..(o + 1) * block]);
                        }
                    }
                    Tensor::from_vec(full.shape.clone(), out).expect("gather")
                }
            };
            for &e in &c.dst {
                ex[e] = Some(result.clone());
            }
        }
    }
    sh.outputs.iter().map(|&e| ex[e].clone().expect("an output")).collect()
}

fn assert_close(what: &str, got: &[Tensor], want: &[Tensor]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert_eq!(g.ty(), w.ty(), "{what}");
        for (i, (a, b)) in f32s(g).iter().zip(f32s(w)).enumerate() {
            assert!((a - b).abs() <= 1e-5 * b.abs() + 1e-5, "{what}: element {i}: {a}, unsharded {b}");
        }
    }
}

fn check(g: &Graph, n: u32) -> Sharded {
    let sh = shard(g, n).unwrap_or_else(|e| panic!("{} over {n}: {e}", g.name));
    let ins = inputs(g);
    let want = kiln_ref::eval_graph(g, &ins).expect("reference");
    assert_close(&format!("{} over {n}", g.name), &simulate(&sh, &ins), &want);
    sh
}

#[test]
fn an_mlp_block_splits_columns_then_rows_with_one_all_reduce_before_the_second_bias() {
    for n in [2, 4, 8] {
        let g = mlp(16);
        let sh = check(&g, n);
        assert_eq!(sh.column_split.len(), 1, "fc1 by columns");
        assert_eq!(sh.row_split.len(), 1, "fc2 by rows");
        assert_eq!(sh.collectives.len(), 1);
        assert_eq!(sh.collectives[0].kind, CollectiveKind::AllReduce);
        assert_eq!(sh.collectives[0].name, "fc2", "the partial product is reduced, before its bias");
        // Two stages; every device works in the first, only device 0 (the outputs) after.
        assert_eq!(sh.stages(), 2);
        assert_eq!(sh.segments.iter().filter(|s| s.stage == 0).count(), n as usize);
        assert_eq!(sh.segments.iter().filter(|s| s.stage == 1).count(), 1);
        // Each device holds its columns of W1 and rows of W2: 16/n of each.
        let seg = &sh.segments[0];
        let w: Vec<Vec<usize>> =
            seg.graph.values.iter().filter_map(|(_, v)| v.constant().map(|t| t.shape().dims().to_vec())).collect();
        let k = 16 / n as usize;
        assert!(w.contains(&vec![8, k]) && w.contains(&vec![k, 8]) && w.contains(&vec![k]), "{w:?}");
        let relu = g.nodes.iter().find(|(_, x)| x.name == "relu").map(|(_, x)| x.outputs[0]).expect("relu");
        assert_eq!(sh.layouts[relu.index_of()], Layout::Split(1));
    }
}

trait IndexOf {
    fn index_of(self) -> usize;
}
impl IndexOf for ValueId {
    fn index_of(self) -> usize {
        kiln_ir::entity::EntityId::index(self)
    }
}

#[test]
fn one_device_replicates_everything() {
    let sh = check(&mlp(16), 1);
    assert!(sh.collectives.is_empty() && sh.column_split.is_empty() && sh.row_split.is_empty());
    assert_eq!(sh.segments.len(), 1);
}

/// A graph `name` of an input `x [m, k]` by a constant `w [k, n]` (MatMul), and the product.
fn product_graph(name: &str, (m, k, n): (usize, usize, usize)) -> (Graph, ValueId) {
    let mut g = Graph::new(name);
    let x = g.add_input("x", ty(&[m, k]));
    let w = constant(&mut g, "w", &[k, n], 1);
    let y = node(&mut g, Op::new(OpKind::MatMul), &[x, w], "mm", &[m, n]);
    (g, y)
}

#[test]
fn a_split_that_reaches_an_op_without_a_rule_is_dropped_and_replicated() {
    // MatMul(x, W) then a reduction over the split axis: no rule, so no split.
    let (mut g, y) = product_graph("reduce", (4, 8, 16));
    let axes = g.add_const("axes", Tensor::from_vec(Shape::new(vec![1]).expect("s"), vec![1i64]).expect("axes"));
    let r = node(&mut g, Op::new(OpKind::ReduceSum), &[y, axes], "sum", &[4, 1]);
    g.outputs.push(r);
    let sh = check(&g, 2);
    assert!(sh.column_split.is_empty() && sh.collectives.is_empty(), "{sh:?}");
    assert!(sh.layouts.iter().all(|l| *l == Layout::Replicated));
}

#[test]
fn a_split_graph_output_is_all_gathered() {
    // A vocabulary-parallel output layer: MatMul(x, W) by columns, gathered.
    let (mut g, y) = product_graph("logits", (3, 8, 12));
    let t = node(&mut g, Op::new(OpKind::Tanh), &[y], "tanh", &[3, 12]);
    g.outputs.push(t);
    for n in [2, 3, 4] {
        let sh = check(&g, n);
        assert_eq!(sh.collectives.len(), 1);
        assert_eq!(sh.collectives[0].kind, CollectiveKind::AllGather { axis: 1 });
    }
}

#[test]
fn heads_split_through_reshape_transpose_softmax_and_batched_products() {
    // A self-attention block of 4 heads of 2: Q, K, V by columns (heads), the output
    // projection by rows.
    let (s, hid, heads) = (5usize, 8usize, 4usize);
    let dh = hid / heads;
    let mut g = Graph::new("attention");
    let x = g.add_input("x", ty(&[1, s, hid]));
    let i64s = |v: Vec<i64>| Tensor::from_vec(Shape::new(vec![v.len()]).expect("s"), v).expect("t");
    let split = g.add_const("split", i64s(vec![1, s as i64, heads as i64, dh as i64]));
    let merge = g.add_const("merge", i64s(vec![1, s as i64, hid as i64]));
    let scale = g.add_const("scale", Tensor::scalar(2.0f32));
    let perm =
        |p: &[i64]| Op::parse(OpKind::Transpose, &Attrs::new().with("perm", Attr::Ints(p.to_vec()))).expect("perm");
    let proj = |g: &mut Graph, name: &str, seed: u64| {
        let w = constant(g, &format!("{name}.w"), &[hid, hid], seed);
        let b = constant(g, &format!("{name}.b"), &[hid], seed + 10);
        let y = node(g, Op::new(OpKind::MatMul), &[x, w], &format!("{name}.mm"), &[1, s, hid]);
        let y = node(g, Op::new(OpKind::Add), &[y, b], &format!("{name}.add"), &[1, s, hid]);
        node(g, Op::new(OpKind::Reshape), &[y, split], &format!("{name}.split"), &[1, s, heads, dh])
    };
    let q = proj(&mut g, "q", 1);
    let k = proj(&mut g, "k", 2);
    let v = proj(&mut g, "v", 3);
    let q = node(&mut g, perm(&[0, 2, 1, 3]), &[q], "q.t", &[1, heads, s, dh]);
    let k = node(&mut g, perm(&[0, 2, 3, 1]), &[k], "k.t", &[1, heads, dh, s]);
    let v = node(&mut g, perm(&[0, 2, 1, 3]), &[v], "v.t", &[1, heads, s, dh]);
    let sc = node(&mut g, Op::new(OpKind::MatMul), &[q, k], "scores", &[1, heads, s, s]);
    let sc = node(&mut g, Op::new(OpKind::Div), &[sc, scale], "scaled", &[1, heads, s, s]);
    let softmax = Op::parse(OpKind::Softmax, &Attrs::new().with("axis", Attr::Int(-1))).expect("softmax");
    let p = node(&mut g, softmax, &[sc], "probs", &[1, heads, s, s]);
    let c = node(&mut g, Op::new(OpKind::MatMul), &[p, v], "context", &[1, heads, s, dh]);
    let c = node(&mut g, perm(&[0, 2, 1, 3]), &[c], "context.t", &[1, s, heads, dh]);
    let c = node(&mut g, Op::new(OpKind::Reshape), &[c, merge], "merge", &[1, s, hid]);
    let wo = constant(&mut g, "o.w", &[hid, hid], 4);
    let bo = constant(&mut g, "o.b", &[hid], 14);
    let o = node(&mut g, Op::new(OpKind::MatMul), &[c, wo], "o.mm", &[1, s, hid]);
    let o = node(&mut g, Op::new(OpKind::Add), &[o, bo], "o.add", &[1, s, hid]);
    g.outputs.push(o);
    for n in [2, 4] {
        let sh = check(&g, n);
        assert_eq!((sh.column_split.len(), sh.row_split.len()), (3, 1), "over {n}");
        assert_eq!(sh.collectives.len(), 1);
        let probs = g.nodes.iter().find(|(_, x)| x.name == "probs").map(|(_, x)| x.outputs[0]).expect("probs");
        assert_eq!(sh.layouts[probs.index_of()], Layout::Split(1), "heads are axis 1 of the scores");
    }
    // 4 heads over 8 devices: the columns (8) divide, the heads do not.
    let e = shard(&g, 8).expect_err("8 devices");
    assert!(matches!(&e, ShardError::Indivisible { what: "heads", extent: 4, devices: 8, .. }), "{e:?}");
    assert!(e.to_string().contains("q.split"), "{e}");
}

#[test]
fn malformed_requests_are_typed_errors() {
    let g = mlp(6);
    assert_eq!(shard(&g, 0).expect_err("0"), ShardError::NoDevices);
    assert_eq!(shard(&g, 65).expect_err("65"), ShardError::TooManyDevices { devices: 65 });
    let e = shard(&g, 4).expect_err("6 columns over 4");
    assert!(
        matches!(&e, ShardError::Indivisible { what: "columns", extent: 6, devices: 4, node, .. } if node == "fc1"),
        "{e:?}"
    );
    // 6 columns do divide over 2 and 3.
    check(&g, 2);
    check(&g, 3);
    // An output that no op computes.
    let mut g = Graph::new("passthrough");
    let x = g.add_input("x", ty(&[2]));
    g.outputs.push(x);
    assert!(matches!(shard(&g, 2), Err(ShardError::OutputNotComputed { .. })));
}
