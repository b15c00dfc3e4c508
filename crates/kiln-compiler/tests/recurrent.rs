//! RNN, GRU and LSTM through the whole pipeline (tensor passes, dispatch formation with
//! the constant relayout and fusion, weight packing, CPU code generation, the runtime),
//! against the reference evaluator kiln-ref, over odd shapes: hidden 1, 5, 17, 64;
//! input 3, 40; 1 and 7 time steps; batch 1 and 3; every direction and both layouts;
//! sequence lengths shorter than the sequence (constant and run-time); initial states;
//! GRU's `linear_before_reset` 0 and 1; `clip`; LSTM peepholes.
//!
//! Every case also checks the form the lowering promises for f32 (`kiln_lower`'s
//! `recurrent` module): the input projection and every recurrent product are
//! contractions, and no dispatch of the layer is General unless `sequence_lens` is
//! run-time data (whose reverse time index is read from data).
//!
//! Tolerance: `|got − want| ≤ 1e-4·|want| + 2e-5`. Each pre-activation is an f32 sum of
//! `input + hidden ≤ 104` products of magnitude below 1 (inputs in [−1, 1), weights
//! scaled by 1/√(input + hidden), states in (−1, 1)), so its rounding error is a few
//! 1e-6 whatever the summation order; the target's exp and tanh are within a few ulp of
//! the reference's; the states are squashed every step, so errors do not grow over 7
//! steps. A wrong gate, bias, time index or state would be off by 1e-2 or more.

use kiln_compiler::{Compilation, CpuTarget, Input, Options, Stage};
use kiln_flow::class::KernelClass;
use kiln_ir::{Attr, Attrs, DType, Graph, Op, OpKind, Shape, Tensor, TensorType};

fn ty(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, Shape::new(dims.to_vec()).unwrap())
}

/// Seeded values in [−scale, scale).
fn data(dims: &[usize], seed: u64, scale: f64) -> Tensor {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let n: usize = dims.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x % 2000) as f64 / 1000.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_f64(DType::F32, Shape::new(dims.to_vec()).unwrap(), &v).unwrap()
}

#[derive(Clone, Copy, Debug)]
struct Case {
    kind: OpKind,
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    /// "forward", "reverse" or "bidirectional".
    dir: &'static str,
    layout: i64,
    init: bool,
    /// With `init`: the initial states are constants of this value rather than inputs.
    init_const: Option<f64>,
    /// Per batch row; `runtime`: a graph input instead of a constant.
    lens: Option<&'static [i64]>,
    runtime_lens: bool,
    lbr: bool,
    clip: Option<f32>,
    peep: bool,
    /// Y feeds a MatMul (whose result is the graph output instead of Y): Y is then no
    /// graph output, and where its blocks are contiguous the states are written in place.
    y_consumed: bool,
}

impl Case {
    fn new(kind: OpKind) -> Case {
        Case {
            kind,
            seq: 7,
            batch: 3,
            input: 3,
            hidden: 5,
            dir: "forward",
            layout: 0,
            init: false,
            init_const: None,
            lens: None,
            runtime_lens: false,
            lbr: false,
            clip: None,
            peep: false,
            y_consumed: false,
        }
    }

    fn nd(&self) -> usize {
        if self.dir == "bidirectional" {
            2
        } else {
            1
        }
    }

    fn gates(&self) -> usize {
        match self.kind {
            OpKind::LSTM => 4,
            OpKind::GRU => 3,
            _ => 1,
        }
    }

    /// The graph (one recurrent node, every result a graph output) and its inputs.
    fn graph(&self) -> (Graph, Vec<Tensor>) {
        let (nd, g, h, i, b, s) = (self.nd(), self.gates(), self.hidden, self.input, self.batch, self.seq);
        let scale = 1.0 / ((i + h) as f64).sqrt();
        let mut gr = Graph::new("rec");
        let mut feeds = Vec::new();
        let xd = if self.layout == 0 { vec![s, b, i] } else { vec![b, s, i] };
        let sd = if self.layout == 0 { vec![nd, b, h] } else { vec![b, nd, h] };
        let x = gr.add_input("x", ty(&xd));
        feeds.push(data(&xd, 1, 1.0));
        let w = gr.add_const("w", data(&[nd, g * h, i], 2, scale));
        let r = gr.add_const("r", data(&[nd, g * h, h], 3, scale));
        let bias = gr.add_const("b", data(&[nd, 2 * g * h], 4, 0.5));
        let lens = self.lens.map(|l| {
            let t = Tensor::from_i64(DType::I32, Shape::new(vec![b]).unwrap(), l).unwrap();
            if self.runtime_lens {
                feeds.push(t.clone());
                gr.add_input("lens", t.ty().clone())
            } else {
                gr.add_const("lens", t)
            }
        });
        let mut init = |gr: &mut Graph, name: &str, seed: u64| {
            self.init.then(|| match self.init_const {
                Some(v) => {
                    let n: usize = sd.iter().product();
                    gr.add_const(
                        name,
                        Tensor::from_f64(DType::F32, Shape::new(sd.clone()).unwrap(), &vec![v; n]).unwrap(),
                    )
                }
                None => {
                    feeds.push(data(&sd, seed, 0.9));
                    gr.add_input(name, ty(&sd))
                }
            })
        };
        let ih = init(&mut gr, "h0", 5);
        let mut inputs = vec![Some(x), Some(w), Some(r), Some(bias), lens, ih];
        if self.kind == OpKind::LSTM {
            let ic = init(&mut gr, "c0", 6);
            inputs.push(ic);
            inputs.push(self.peep.then(|| gr.add_const("p", data(&[nd, 3 * h], 7, 0.5))));
        }
        let mut attrs = Attrs::new();
        attrs.set("direction", Attr::String(self.dir.into()));
        attrs.set("layout", Attr::Int(self.layout));
        attrs.set("hidden_size", Attr::Int(h as i64));
        if self.kind == OpKind::GRU {
            attrs.set("linear_before_reset", Attr::Int(self.lbr as i64));
        }
        if let Some(c) = self.clip {
            attrs.set("clip", Attr::Float(c));
        }
        let op = Op::parse(self.kind, &attrs).unwrap();
        let yd = if self.layout == 0 { vec![s, nd, b, h] } else { vec![b, s, nd, h] };
        let mut outs = vec![("y".to_string(), ty(&yd)), ("yh".to_string(), ty(&sd))];
        if self.kind == OpKind::LSTM {
            outs.push(("yc".to_string(), ty(&sd)));
        }
        let (_, mut results) = gr.add_node("rec", op, inputs, outs);
        if self.y_consumed {
            let m = gr.add_const("m", data(&[h, 3], 8, 1.0));
            let mut zd = yd.clone();
            zd[3] = 3;
            let (_, z) =
                gr.add_node("z", Op::new(OpKind::MatMul), vec![Some(results[0]), Some(m)], vec![("z".into(), ty(&zd))]);
            results[0] = z[0];
        }
        gr.outputs = results;
        (gr, feeds)
    }
}

fn run_compiled(g: &Graph, artifact: &[u8], feeds: &[Tensor]) -> Vec<Tensor> {
    let module = kiln_runtime::Module::load(artifact, None).unwrap();
    let mut inst = kiln_runtime::Instance::new(&module).unwrap();
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.ty(v).storage_bytes()]).collect();
    {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(&ins, &mut refs).unwrap();
    }
    g.outputs.iter().zip(outs).map(|(&v, b)| Tensor::new(g.ty(v).clone(), b.into()).unwrap()).collect()
}

/// Compiles, runs and compares one case; checks the dispatches' classes.
/// Compiles and runs `c` against the reference; returns its count of contractions.
fn check(c: Case) -> usize {
    let (g, feeds) = c.graph();
    let want = kiln_ref::eval_graph(&g, &feeds).unwrap_or_else(|e| panic!("{c:?}: reference: {e}"));
    let opts = Options { target: CpuTarget::X86_64V3, ..Options::default() };
    let mut comp = Compilation::new(Input::Graph(g.clone()), opts);
    comp.run_to(Stage::PackWeights).unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let flow = comp.flow().expect("a flow program").clone();
    let general: Vec<String> =
        flow.dispatches.iter().filter(|d| d.class == KernelClass::General).map(|d| d.kernel.name.clone()).collect();
    // Lengths shorter than the sequence make the gate kernels select per row (and, in
    // reverse, read the time index from the lengths): those may be General.
    if c.lens.is_none() {
        assert!(general.is_empty(), "{c:?}: general dispatches {general:?}");
    }
    let products = flow.dispatches.iter().filter(|d| d.class == KernelClass::Contraction).count();
    // The projection, and a product per step but the first without an initial state
    // (GRU without linear_before_reset: two). A hidden size of 1 makes the recurrent
    // products one multiply each, not products the recogniser takes.
    let per_step = if c.kind == OpKind::GRU && !c.lbr { 2 } else { 1 };
    let zero_init = c.init_const.is_some_and(|v| v == 0.0 && v.is_sign_positive());
    let steps_with_state = if c.init && !zero_init { c.seq } else { c.seq - 1 };
    let least = if c.hidden > 1 { 1 + per_step * steps_with_state } else { 1 };
    assert!(products >= least, "{c:?}: {products} contractions, {least} expected");
    if c.y_consumed {
        // Y's blocks are contiguous (time-major, or batch 1) and every step writes its
        // own: no Y kernel runs.
        comp.run_to(Stage::Schedule).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        let elided = comp.plan().expect("a stream plan").elided.len();
        let in_place = c.lens.is_none() && (c.layout == 0 || c.batch == 1);
        assert_eq!(elided, in_place as usize, "{c:?}: {elided} concatenations elided");
    }
    let compiled = comp.finish().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    let got = run_compiled(&g, &compiled.artifact, &feeds);
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a.ty(), b.ty(), "{c:?}: result {k}");
        for (i, (x, y)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
            assert!(
                (x - y).abs() <= 1e-4 * y.abs() + 2e-5,
                "{c:?}: result {k} element {i}: {x}, the reference gives {y}"
            );
        }
    }
    products
}

const KINDS: [OpKind; 3] = [OpKind::RNN, OpKind::GRU, OpKind::LSTM];
const DIRS: [&str; 3] = ["forward", "reverse", "bidirectional"];

#[test]
fn shapes_directions_and_layouts() {
    for kind in KINDS {
        for dir in DIRS {
            for (hidden, input, seq, batch) in [(1, 3, 7, 3), (5, 40, 1, 1), (17, 3, 7, 1), (64, 40, 7, 3)] {
                for layout in [0, 1] {
                    let c = Case { hidden, input, seq, batch, dir, layout, ..Case::new(kind) };
                    check(c);
                }
            }
            check(Case { init: true, dir, ..Case::new(kind) });
            check(Case { init: true, dir, layout: 1, batch: 1, hidden: 17, ..Case::new(kind) });
        }
    }
}

/// Y read by another op: where its `(time, direction)` blocks are contiguous, the
/// states are placed inside Y and no Y kernel runs; the results do not change.
#[test]
fn y_written_in_place() {
    for kind in KINDS {
        for dir in DIRS {
            for (layout, batch) in [(0, 3), (1, 1), (1, 3)] {
                for init in [false, true] {
                    check(Case { dir, layout, batch, init, y_consumed: true, hidden: 17, ..Case::new(kind) });
                }
            }
            let lens: &'static [i64] = &[7, 3, 0];
            check(Case { dir, lens: Some(lens), y_consumed: true, ..Case::new(kind) });
        }
    }
}

#[test]
fn sequence_lengths_and_initial_states() {
    for kind in KINDS {
        for dir in DIRS {
            for runtime_lens in [false, true] {
                for init in [false, true] {
                    let lens: &'static [i64] = &[7, 3, 0];
                    check(Case { dir, init, lens: Some(lens), runtime_lens, ..Case::new(kind) });
                }
            }
            let lens: &'static [i64] = &[5, 1, 7];
            check(Case { dir, init: true, layout: 1, lens: Some(lens), ..Case::new(kind) });
        }
    }
}

#[test]
fn gru_linear_before_reset_clip_and_peepholes() {
    for lbr in [false, true] {
        for dir in DIRS {
            for init in [false, true] {
                check(Case { lbr, dir, init, hidden: 17, ..Case::new(OpKind::GRU) });
            }
            check(Case { lbr, dir, init: true, clip: Some(0.3), ..Case::new(OpKind::GRU) });
        }
    }
    for kind in [OpKind::RNN, OpKind::LSTM] {
        for dir in DIRS {
            check(Case { dir, init: true, clip: Some(0.3), ..Case::new(kind) });
        }
    }
    for dir in DIRS {
        check(Case { dir, init: true, peep: true, ..Case::new(OpKind::LSTM) });
        let lens: &'static [i64] = &[2, 7, 4];
        check(Case { dir, peep: true, lens: Some(lens), runtime_lens: true, ..Case::new(OpKind::LSTM) });
    }
}

/// Initial states that are constants: positive zeros are the absent state (the first
/// step's products are skipped: as many contractions as without initial states); any
/// other value, negative zeros included, is read.
#[test]
fn constant_initial_states() {
    for kind in KINDS {
        for dir in DIRS {
            let base = Case { dir, hidden: 17, ..Case::new(kind) };
            let absent = check(base);
            let zero = check(Case { init: true, init_const: Some(0.0), ..base });
            assert_eq!(zero, absent, "{kind:?} {dir}: constant zero states");
            for v in [-0.0, 0.25] {
                let read = check(Case { init: true, init_const: Some(v), ..base });
                assert!(read > absent, "{kind:?} {dir}: constant states of {v}: {read} contractions, {absent} without");
            }
        }
    }
}

/// Recurrent weights of 1 MiB or more a direction (hidden 256: `R` is 4 · 256 × 256
/// f32 for an LSTM, 3 · 256 × 256 for a GRU at 768 KiB, under it): the stream level
/// runs one direction's recurrent products after the other's instead of step by step
/// in turn (`stream::resident_constants`), so each direction's `R` stays in cache; the
/// results do not change.
#[test]
fn large_recurrent_weights_run_a_direction_at_a_time() {
    for (kind, apart) in [(OpKind::LSTM, true), (OpKind::GRU, false)] {
        // (GRU with linear_before_reset: one product a step, over all of `R`.)
        let c = Case { hidden: 256, input: 8, seq: 5, batch: 1, dir: "bidirectional", lbr: true, ..Case::new(kind) };
        let (g, _) = c.graph();
        let opts = Options { target: CpuTarget::X86_64V3, ..Options::default() };
        let mut comp = Compilation::new(Input::Graph(g), opts);
        comp.run_to(Stage::Schedule).unwrap_or_else(|e| panic!("{c:?}: {e}"));
        let flow = comp.flow().expect("a flow program");
        let plan = comp.plan().expect("a stream plan");
        // The recurrent products in execution order, by the constant (a direction's
        // `R`) each reads: the largest constant operand of a step's contraction.
        let mut order = Vec::new();
        for wave in &plan.waves {
            for &d in wave {
                let dispatch = &flow.dispatches[d];
                if dispatch.class != KernelClass::Contraction {
                    continue;
                }
                let r = dispatch
                    .operands
                    .iter()
                    .map(|&o| flow.storage(o))
                    .filter(|&o| matches!(flow.buffers[o.index()].kind, kiln_flow::program::BufferKind::Const(_)))
                    .max_by_key(|o| flow.buffers[o.index()].ty.storage_bytes());
                if let Some(r) = r {
                    if flow.buffers[r.index()].ty.storage_bytes() >= 256 * 256 * 4 * 3 {
                        order.push(r.index());
                    }
                }
            }
        }
        let mut runs = order.clone();
        runs.dedup();
        // Two directions, four steps each after the first (no initial state): the
        // projection reads W, not R.
        assert!(order.len() >= 8, "{kind:?}: recurrent products {order:?}");
        if apart {
            assert_eq!(runs.len(), 2, "{kind:?}: one direction after the other: {order:?}");
        } else {
            assert!(runs.len() > 2, "{kind:?}: directions in turn below 1 MiB: {order:?}");
        }
        check(c);
    }
}
