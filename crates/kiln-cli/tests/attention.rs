//! Attention kernels (`KernelClass::Attention`, `kiln_flow::attention`) compiled for the
//! CPU and run, against the reference evaluator (kiln-ref runs the graph op by op:
//! MatMul, scaling, the mask's Add, Softmax, MatMul; it shares no code with the
//! recogniser or the emitter).
//!
//! Over odd shapes: sequence lengths 1, 7 and 65 (a key block of 32 or 64 keys plus a
//! tail of one; a tile of four query rows plus a tail of three or one), 16, 32, 128 and
//! 2057 (past the tiled kernel's 2048 keys: the one-row kernel), head sizes 5, 17 and 64 (not multiples of the 8 or 16 lanes, and one
//! that is); masks of each broadcast form (none; per batch over the keys `[b,1,1,s]`;
//! per query and key `[1,1,s,s]`; per head `[1,h,1,s]`; full `[b,h,s,s]`; a 1-D `[s]`;
//! a boolean mask through `Where`, which becomes a mask dispatch of its own); the scale
//! on the scores (`Div`) or on Q (`Mul` before the product). Each case compiles for
//! x86-64-v3 (AVX2, 8 lanes) and for the host (16 lanes where it has AVX-512 F), must
//! form exactly one attention dispatch (so a recogniser that stops matching fails here
//! rather than passing on the unfused path), and must match the reference within
//! `1e-5·max|ref| + 1e-4·|ref|` per element (the f32 tolerance of `models.rs`; the
//! online softmax sums in another order and `exp` is a polynomial within 2 ulp).
//! `score_matrix_not_in_the_arena` compares the plans with and without the pass.

use kiln_ir::{Graph, Tensor, TensorType};

/// A mask form: its dims, given batch b, heads h and sequence s (`None`: no mask).
#[derive(Clone, Copy, Debug)]
enum Mask {
    None,
    Keys,
    QueryKey,
    Heads,
    Full,
    OneD,
    Boolean,
}

impl Mask {
    fn dims(self, b: usize, h: usize, s: usize) -> Option<Vec<usize>> {
        match self {
            Mask::None => None,
            Mask::Keys | Mask::Boolean => Some(vec![b, 1, 1, s]),
            Mask::QueryKey => Some(vec![1, 1, s, s]),
            Mask::Heads => Some(vec![1, h, 1, s]),
            Mask::Full => Some(vec![b, h, s, s]),
            Mask::OneD => Some(vec![s]),
        }
    }
}

fn dims(d: &[usize]) -> String {
    d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

/// The attention graph of one case, in kiln-ir's text form.
fn graph(b: usize, h: usize, s: usize, d: usize, mask: Mask, scale_q: bool) -> String {
    let q = dims(&[b, h, s, d]);
    let kt = dims(&[b, h, d, s]);
    let sc = dims(&[b, h, s, s]);
    let mut inputs = format!(r#"%q: f32[{q}] "q", %k: f32[{q}] "k", %v: f32[{q}] "v""#);
    let md = mask.dims(b, h, s);
    if let Some(m) = &md {
        let ty = if matches!(mask, Mask::Boolean) { "bool" } else { "f32" };
        inputs.push_str(&format!(r#", %mask: {ty}[{}] "mask""#, dims(m)));
    }
    let scale = 1.0 / (d as f32).sqrt();
    let mut body = format!("  %kt = Transpose(%k) {{perm = [0, 1, 3, 2]}} : f32[{kt}] \"kt\" node \"kt\"\n");
    body.push_str(&format!("  %scale = const f32[] [{scale:?}] \"scale\"\n"));
    if scale_q {
        body.push_str(&format!("  %p5 = Mul(%q, %scale) : f32[{q}] \"qs\" node \"qs\"\n"));
        body.push_str(&format!("  %scores = MatMul(%p5, %kt) : f32[{sc}] \"scores\" node \"scores\"\n"));
    } else {
        body.push_str(&format!("  %p5 = MatMul(%q, %kt) : f32[{sc}] \"raw\" node \"raw\"\n"));
        body.push_str(&format!("  %root = const f32[] [{:?}] \"root\"\n", (d as f32).sqrt()));
        body.push_str(&format!("  %scores = Div(%p5, %root) : f32[{sc}] \"scores\" node \"scores\"\n"));
    }
    let masked = match (mask, &md) {
        (Mask::None, _) | (_, None) => "%scores".to_string(),
        (Mask::Boolean, Some(m)) => {
            body.push_str("  %zero = const f32[] [0.0] \"zero\"\n  %big = const f32[] [-10000.0] \"big\"\n");
            body.push_str(&format!(
                "  %addmask = Where(%mask, %zero, %big) : f32[{}] \"addmask\" node \"addmask\"\n",
                dims(m)
            ));
            body.push_str(&format!("  %masked = Add(%scores, %addmask) : f32[{sc}] \"masked\" node \"masked\"\n"));
            "%masked".to_string()
        }
        _ => {
            body.push_str(&format!("  %masked = Add(%scores, %mask) : f32[{sc}] \"masked\" node \"masked\"\n"));
            "%masked".to_string()
        }
    };
    body.push_str(&format!("  %probs = Softmax({masked}) {{axis = -1}} : f32[{sc}] \"probs\" node \"probs\"\n"));
    body.push_str(&format!("  %ctx = MatMul(%probs, %v) : f32[{q}] \"context\" node \"context\"\n"));
    format!("graph @attention({inputs}) -> (%ctx) {{\n{body}}}\n")
}

/// [`graph`]'s text in the form the text parser takes ([`dense`]), with PyTorch's guard
/// `isnan(p) ? 0 : p` on the probabilities where `guard`.
fn graph_text(b: usize, h: usize, s: usize, d: usize, mask: Mask, scale_q: bool, guard: bool) -> String {
    let text = graph(b, h, s, d, mask, scale_q);
    if !guard {
        return dense(&text);
    }
    let sc = dims(&[b, h, s, s]);
    let lines = format!(
        "  %nan = IsNaN(%probs) : bool[{sc}] \"nan\" node \"nan\"\n  %pzero = const f32[] [0.0] \"pzero\"\n  %guarded = Where(%nan, %pzero, %probs) : f32[{sc}] \"guarded\" node \"guarded\"\n  %ctx = MatMul(%guarded,"
    );
    dense(&text.replace("  %ctx = MatMul(%probs,", &lines))
}

/// `text` with its symbolic value names (`%q`, `%scores`) renumbered densely in the
/// order they are defined (the inputs, then each line's result), as the text form wants.
fn dense(text: &str) -> String {
    let mut order: Vec<String> = Vec::new();
    let name =
        |t: &str| t.trim_start_matches('%').chars().take_while(|c| c.is_ascii_alphanumeric()).collect::<String>();
    for (n, line) in text.lines().enumerate() {
        if n == 0 {
            let header = line.split("->").next().unwrap_or("");
            order.extend(header.split('%').skip(1).map(name));
        } else if let Some(lhs) = line.trim_start().strip_prefix('%') {
            if lhs.contains(" = ") {
                order.push(name(lhs));
            }
        }
    }
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let n = name(&rest[at..]);
        let id = order.iter().position(|o| *o == n).unwrap_or_else(|| panic!("undefined %{n}"));
        out.push_str(&format!("%{id}"));
        rest = &rest[at + 1 + n.len()..];
    }
    out.push_str(rest);
    out
}

/// Seeded inputs: floats in [-2, 2) (masks: 0 or −3 per element, a third masked),
/// booleans two in three true.
fn inputs(g: &Graph) -> Vec<Tensor> {
    let mut state = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    g.inputs
        .iter()
        .map(|&v| {
            let ty: &TensorType = &g.values[v].ty;
            let n = ty.shape.numel();
            let mask = g.values[v].name == "mask";
            let bytes: Vec<u8> = match ty.dtype {
                kiln_ir::DType::Bool => (0..n).map(|_| u8::from(next() % 3 != 0)).collect(),
                _ => (0..n)
                    .flat_map(|_| {
                        let x = if mask {
                            if next() % 3 == 0 {
                                -3.0f32
                            } else {
                                0.0
                            }
                        } else {
                            (next() % 4000) as f32 / 1000.0 - 2.0
                        };
                        x.to_le_bytes()
                    })
                    .collect(),
            };
            Tensor::new(ty.clone(), bytes.into()).expect("input tensor")
        })
        .collect()
}

fn run(g: &Graph, target: kiln_compiler::CpuTarget, feeds: &[Tensor], name: &str) -> Vec<f32> {
    let opts = kiln_compiler::Options { target, fused_attention: true, ..Default::default() };
    let c = kiln_compiler::compile(g, &opts).unwrap_or_else(|e| panic!("{name}: compile: {e}"));
    let classes: Vec<&str> = c.flow.dispatches.iter().map(|d| d.class.name()).collect();
    assert_eq!(classes.iter().filter(|&&c| c == "attention").count(), 1, "{name}: one attention dispatch: {classes:?}");
    let at = c.flow.dispatches.iter().position(|d| d.class.name() == "attention").expect("attention");
    assert!(c.codegen_notes[at].starts_with("attention"), "{name}: emitted as `{}`", c.codegen_notes[at]);
    // A query axis of more than one row takes the tiled kernel, up to 2048 keys.
    let s = g.values[g.inputs[0]].ty.shape.dims()[2];
    let rows = if s == 1 || s > 2048 { " 1 query rows" } else { " 4 query rows" };
    assert!(c.codegen_notes[at].contains(rows), "{name}: emitted as `{}`", c.codegen_notes[at]);
    let module = kiln_runtime::Module::load(&c.artifact, c.weights.as_deref()).expect("load");
    let mut inst = kiln_runtime::Instance::new(&module).expect("instance");
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let bytes = g.values[g.outputs[0]].ty.storage_bytes();
    let mut out = vec![0xA5u8; bytes];
    inst.invoke(&ins, &mut [&mut out[..]]).unwrap_or_else(|e| panic!("{name}: invoke: {e}"));
    out.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

fn check(b: usize, h: usize, s: usize, d: usize, mask: Mask, scale_q: bool) {
    let text = graph_text(b, h, s, d, mask, scale_q, false);
    let g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let feeds = inputs(&g);
    let want = kiln_ref::eval_graph(&g, &feeds).expect("reference")[0].to_f64_vec();
    let max = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    for (target, tname) in [(kiln_compiler::CpuTarget::X86_64V3, "x86-64-v3"), (kiln_compiler::CpuTarget::Host, "host")]
    {
        let name = format!("b{b} h{h} s{s} d{d} {mask:?}{} on {tname}", if scale_q { " (scale on Q)" } else { "" });
        let got = run(&g, target, &feeds, &name);
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (&a, &w)) in got.iter().zip(&want).enumerate() {
            let tol = 1e-5 * max + 1e-4 * w.abs();
            assert!((a as f64 - w).abs() <= tol, "{name}: element {i}: {a} but the reference gives {w}");
        }
    }
}

#[test]
fn sequence_lengths_and_head_sizes() {
    for s in [1, 7, 65] {
        for d in [5, 17, 64] {
            check(1, 2, s, d, Mask::None, false);
        }
    }
    // Whole tiles of query rows and whole key groups (16 and 32 tokens, 32-wide heads;
    // 128 tokens, 64-wide heads: the shapes of the corpus transformers and bert_tiny).
    check(1, 2, 16, 32, Mask::Keys, false);
    check(1, 3, 32, 32, Mask::Keys, false);
    check(1, 2, 128, 64, Mask::Keys, false);
}

/// More keys than a tile's scores take on the stack (2048): the one-row kernel.
#[test]
fn long_sequence_one_row_kernel() {
    check(1, 1, 2057, 3, Mask::Keys, false);
}

#[test]
fn masks_of_each_broadcast_form() {
    for mask in [Mask::Keys, Mask::QueryKey, Mask::Heads, Mask::Full, Mask::OneD, Mask::Boolean] {
        for s in [7, 65] {
            check(2, 3, s, 17, mask, false);
        }
    }
    check(2, 2, 1, 5, Mask::Keys, false);
}

#[test]
fn scale_on_q() {
    check(1, 3, 33, 8, Mask::Keys, true);
    check(2, 2, 65, 16, Mask::None, true);
}

/// Every key of batch 0 masked with −∞ (batch 1 with 0): in the reference the softmax
/// of batch 0's rows is NaN (0/0), and with PyTorch's guard `isnan(p) ? 0 : p` its
/// output is 0; the fused kernel gives the same (no silent zeros without the guard, no
/// NaN with it), and batch 1 as usual.
#[test]
fn fully_masked_rows_as_in_the_reference() {
    // (7 keys of 5: tail masks; 8 of 8: none, AVX2's three-vector register blocks.)
    for (guard, seq, d) in [(false, 7, 5), (true, 7, 5), (false, 8, 8), (true, 8, 8)] {
        let text = graph_text(2, 1, seq, d, Mask::Keys, false, guard);
        let g = kiln_ir::text::parse(&text).expect("parse");
        let mut feeds = inputs(&g);
        let ty = feeds[3].ty().clone();
        let mask: Vec<u8> =
            (0..2 * seq).flat_map(|i| if i < seq { f32::NEG_INFINITY } else { 0.0 }.to_le_bytes()).collect();
        feeds[3] = Tensor::new(ty, mask.into()).expect("mask");
        let want = kiln_ref::eval_graph(&g, &feeds).expect("reference")[0].to_f64_vec();
        let (masked, open) = want.split_at(want.len() / 2);
        assert!(masked.iter().all(|x| if guard { *x == 0.0 } else { x.is_nan() }), "the reference: {masked:?}");
        assert!(open.iter().all(|x| x.is_finite()) && open.iter().any(|&x| x != 0.0), "the reference: {open:?}");
        for target in [kiln_compiler::CpuTarget::X86_64V3, kiln_compiler::CpuTarget::Host] {
            let got = run(&g, target, &feeds, &format!("fully masked (guard {guard})"));
            for (i, (&a, &w)) in got.iter().zip(&want).enumerate() {
                let same = (a.is_nan() && w.is_nan()) || (a as f64 - w).abs() <= 1e-5 + 1e-4 * w.abs();
                assert!(same, "{target:?}, guard {guard}: element {i}: {a} but the reference gives {w}");
            }
        }
    }
}

/// The score matrix never reaches the arena: 4 heads of 256 tokens, without the pass the
/// plan's arena holds at least one `heads × s × s` f32 score matrix (the product's
/// result, the softmax's input); with it the arena is smaller than one such matrix and
/// the chain is one attention dispatch.
#[test]
fn score_matrix_not_in_the_arena() {
    let (h, s, d) = (4, 256, 16);
    let text = graph_text(1, h, s, d, Mask::Keys, false, false);
    let g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let scores = (h * s * s * 4) as u64;
    let compile = |fused: bool| {
        let opts = kiln_compiler::Options { fused_attention: fused, ..Default::default() };
        kiln_compiler::compile(&g, &opts).unwrap_or_else(|e| panic!("compile (fused {fused}): {e}"))
    };
    let (off, on) = (compile(false), compile(true));
    let attention =
        |c: &kiln_compiler::Compiled| c.flow.dispatches.iter().filter(|d| d.class.name() == "attention").count();
    assert_eq!((attention(&off), attention(&on)), (0, 1));
    assert!(off.plan.arena_size >= scores, "unfused arena {} < the score matrix's {scores} bytes", off.plan.arena_size);
    assert!(on.plan.arena_size < scores, "fused arena {} holds a score matrix ({scores} bytes)", on.plan.arena_size);
}
