//! Activation epilogues of contractions, in every form exporters write them: a MatMul
//! plus bias, or a 1×1 convolution with bias, followed by the activation as an ONNX op
//! (HardSwish, Mish, Gelu, …) or spelt out op by op (SiLU as Sigmoid·x, HardSwish as
//! Add/Clip/Mul/Div, Mish as Softplus/Tanh/Mul, the tanh GELU with a Tanh op). Each
//! graph goes through the real dispatch formation (`kiln_lower::form`): the activation
//! must be fused into the contraction (one contraction dispatch holding every op) and
//! that dispatch must take the contraction microkernel, whose result is compared with
//! the kernel interpreter on odd shapes, on x86-64-v3 and (where the CPU has it) v4.
//!
//! Data: pre-activation values spread over about ±20 (both branches of every
//! piecewise form, exp's and tanh's saturation), and rows of `A` with +inf, −inf and
//! NaN (every output of those rows ±inf or NaN): non-finite results must be exactly
//! the interpreter's (NaN for NaN, the same infinity).
//!
//! Bound for finite results: `(L·(K + 2)/2 + 16)·2⁻²³·S + 16·2⁻²³·|want|`, where
//! `S = Σ|a·w| + |bias|` bounds the pre-activation value and its rounding error
//! (`(K + 2)/2` ulp of `S` for a sum in any order), `L` is the activation's Lipschitz
//! constant (at most 1.5: HardSwish's slope at 3), and the two 16-ulp terms cover the
//! inline transcendentals (exp ≤ 1, erf ≤ 2.9, tanh ≤ 1.3, log ≤ 0.8 ulp, `tests/math.rs`)
//! carried through at most a few operations each, absolute in `S` where the form
//! cancels (the tanh GELU's `1 + tanh u` at negative `u`) and relative elsewhere.

mod common;

use common::*;
use kiln_codegen::cpu::{classify, compile_with, CpuTarget};
use kiln_flow::class::KernelClass;
use kiln_flow::program::{interpret, BufferKind, FlowProgram};
use kiln_ir::{DType, Shape, Tensor};

/// An activation as graph text lines over `%x` (the pre-activation value, `TY` its
/// type), ending in a value named `%y`; `%s` is a per-channel slope input where used.
struct Act {
    name: &'static str,
    lines: &'static str,
    /// Lipschitz constant of the activation.
    lip: f32,
}

const ACTS: &[Act] = &[
    Act { name: "silu", lines: "%a1 = Sigmoid(%x) : TY\n%y = Mul(%x, %a1) : TY", lip: 1.1 },
    Act { name: "silu_swapped", lines: "%a1 = Sigmoid(%x) : TY\n%y = Mul(%a1, %x) : TY", lip: 1.1 },
    Act { name: "hardswish", lines: "%y = HardSwish(%x) : TY", lip: 1.5 },
    Act {
        name: "hardswish_decomposed",
        lines: "%c3 = const f32[] [3.0]\n%c0 = const f32[] [0.0]\n%c6 = const f32[] [6.0]\n\
                %a1 = Add(%x, %c3) : TY\n%a2 = Clip(%a1, %c0, %c6) : TY\n%a3 = Mul(%x, %a2) : TY\n\
                %y = Div(%a3, %c6) : TY",
        lip: 1.5,
    },
    Act { name: "hardsigmoid", lines: "%y = HardSigmoid(%x) {alpha = 0.2, beta = 0.5} : TY", lip: 0.2 },
    Act { name: "mish", lines: "%y = Mish(%x) : TY", lip: 1.1 },
    Act {
        name: "mish_decomposed",
        lines: "%a1 = Softplus(%x) : TY\n%a2 = Tanh(%a1) : TY\n%y = Mul(%x, %a2) : TY",
        lip: 1.1,
    },
    Act { name: "gelu_erf", lines: "%y = Gelu(%x) : TY", lip: 1.13 },
    Act { name: "gelu_tanh", lines: "%y = Gelu(%x) {approximate = \"tanh\"} : TY", lip: 1.13 },
    Act {
        name: "gelu_tanh_decomposed",
        lines: "%k = const f32[] [0.044715]\n%c = const f32[] [0.7978846]\n%one = const f32[] [1.0]\n\
                %half = const f32[] [0.5]\n%a1 = Mul(%x, %x) : TY\n%a2 = Mul(%a1, %x) : TY\n\
                %a3 = Mul(%a2, %k) : TY\n%a4 = Add(%x, %a3) : TY\n%a5 = Mul(%a4, %c) : TY\n\
                %a6 = Tanh(%a5) : TY\n%a7 = Add(%a6, %one) : TY\n%a8 = Mul(%x, %half) : TY\n\
                %y = Mul(%a8, %a7) : TY",
        lip: 1.13,
    },
    Act { name: "leakyrelu", lines: "%y = LeakyRelu(%x) {alpha = 0.1} : TY", lip: 1.0 },
    Act { name: "prelu", lines: "%y = PRelu(%x, %s) : TY", lip: 1.0 },
    Act { name: "softplus", lines: "%y = Softplus(%x) : TY", lip: 1.0 },
    Act { name: "elu", lines: "%y = Elu(%x) {alpha = 0.7} : TY", lip: 1.0 },
    Act { name: "tanh", lines: "%y = Tanh(%x) : TY", lip: 1.0 },
    Act { name: "sigmoid", lines: "%y = Sigmoid(%x) : TY", lip: 0.25 },
    Act {
        name: "relu6_clip",
        lines: "%c0 = const f32[] [0.0]\n%c6 = const f32[] [6.0]\n%y = Clip(%x, %c0, %c6) : TY",
        lip: 1.0,
    },
    Act {
        name: "clamp_max_min",
        lines: "%lo = const f32[] [-1.5]\n%hi = const f32[] [4.0]\n%a1 = Max(%x, %lo) : TY\n%y = Min(%a1, %hi) : TY",
        lip: 1.0,
    },
    Act {
        name: "relu_then_clip",
        lines: "%a1 = Relu(%x) : TY\n%c6 = const f32[] [6.0]\n%y = Min(%a1, %c6) : TY",
        lip: 1.0,
    },
];

/// A product shape: MatMul `[m, k] × [k, n]` plus bias `[n]`, or a 1×1 convolution of
/// `[1, k, h, w]` to `m` channels plus bias `[m]`.
#[derive(Clone, Copy, Debug)]
enum Product {
    MatMul { m: usize, k: usize, n: usize },
    Conv { m: usize, k: usize, h: usize, w: usize },
}

impl Product {
    fn k(self) -> usize {
        match self {
            Product::MatMul { k, .. } | Product::Conv { k, .. } => k,
        }
    }

    /// The graph inputs' dims: A (the data), W, bias, slope.
    fn dims(self) -> [Vec<usize>; 4] {
        match self {
            Product::MatMul { m, k, n } => [vec![m, k], vec![k, n], vec![n], vec![n]],
            Product::Conv { m, k, h, w } => [vec![1, k, h, w], vec![m, k, 1, 1], vec![m], vec![m, 1, 1]],
        }
    }

    fn out(self) -> Vec<usize> {
        match self {
            Product::MatMul { m, n, .. } => vec![m, n],
            Product::Conv { m, h, w, .. } => vec![1, m, h, w],
        }
    }

    /// The graph: the product, the bias, then `act` (or nothing), its values renamed to
    /// the text form's `%N` in order of definition.
    fn graph(self, act: Option<&Act>) -> String {
        let ty = |d: &[usize]| format!("f32[{}]", d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","));
        let [a, w, b, s] = self.dims();
        let out = ty(&self.out());
        let mut lines = match self {
            Product::MatMul { .. } => vec![format!("%p = MatMul(%a, %w) : {out}"), format!("%x = Add(%p, %b) : {out}")],
            Product::Conv { .. } => vec![format!("%x = Conv(%a, %w, %b) {{kernel_shape = [1, 1]}} : {out}")],
        };
        match act {
            Some(act) => lines.extend(act.lines.lines().map(|l| l.trim().replace("TY", &out))),
            None => lines.push(format!("%y = Identity(%x) : {out}")),
        }
        let mut ids: Vec<String> = ["a", "w", "b", "s"].iter().map(|n| n.to_string()).collect();
        let mut body = String::new();
        for line in &lines {
            let (def, rest) = line.split_once(" = ").expect("a definition");
            let rest = rename(rest, &ids);
            ids.push(def.trim_start_matches('%').to_string());
            body.push_str(&format!("  %{} = {rest}\n", ids.len() - 1));
        }
        let y = ids.iter().position(|n| n == "y").expect("a result %y");
        format!(
            "graph @g(%0: {} \"a\", %1: {} \"w\", %2: {} \"b\", %3: {} \"s\") -> (%{y}) {{\n{body}}}\n",
            ty(&a),
            ty(&w),
            ty(&b),
            ty(&s)
        )
    }
}

/// `text` with every `%name` replaced by `%N`, `N` the name's position in `ids`.
fn rename(text: &str, ids: &[String]) -> String {
    let mut out = String::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut name = String::new();
        while let Some(&d) = chars.peek() {
            if !d.is_ascii_alphanumeric() {
                break;
            }
            name.push(d);
            chars.next();
        }
        let n = ids.iter().position(|i| *i == name).unwrap_or_else(|| panic!("%{name} used before it is defined"));
        out.push_str(&format!("%{n}"));
    }
    out
}

/// Pre-activation data spread over about ±20, with +inf, −inf and NaN in rows of A.
fn inputs(p: Product, seed: u64) -> Vec<Tensor> {
    let [a, w, b, s] = p.dims();
    let mut av = random_f32(&a, 4.0, seed).to_vec::<f32>().unwrap();
    // MatMul: the first element of rows 1, 2, 3 (those there are, NaN first; row 0 stays
    // finite); convolution: positions 0, 1, 2 of channel 0 (every output channel at
    // those positions).
    let (count, step, first) = special_rows(p);
    for (r, &v) in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][..count].iter().enumerate() {
        av[(first + r) * step] = v;
    }
    let mut slope = random_f32(&s, 0.5, seed + 3).to_vec::<f32>().unwrap();
    slope[0] = 0.0;
    vec![
        Tensor::from_vec(Shape::new(a).unwrap(), av).unwrap(),
        random_f32(&w, 1.0, seed + 1),
        random_f32(&b, 3.0, seed + 2),
        Tensor::from_vec(Shape::new(s).unwrap(), slope).unwrap(),
    ]
}

/// How many rows (positions) of A get a special value, A's elements per row, and the
/// first such row.
fn special_rows(p: Product) -> (usize, usize, usize) {
    match p {
        Product::MatMul { m, k, .. } => ((m - 1).min(3), k, 1),
        Product::Conv { .. } => (3, 1, 0),
    }
}

fn form(text: &str) -> (kiln_ir::Graph, FlowProgram) {
    let g = kiln_ir::text::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let p = kiln_lower::form(&g).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (g, p)
}

/// Runs the program's dispatches compiled with `cfg`, in order; returns the outputs
/// and each dispatch's compile note.
fn run_program(p: &FlowProgram, feeds: &[Tensor], cfg: &Config) -> (Vec<Tensor>, Vec<String>) {
    let mut values: Vec<Option<Tensor>> = vec![None; p.buffers.len()];
    for (i, b) in p.buffers.iter().enumerate() {
        match &b.kind {
            BufferKind::Input(k) => values[i] = Some(feeds[*k].clone()),
            BufferKind::Const(t) => values[i] = Some(t.clone()),
            _ => {}
        }
    }
    let read = |values: &Vec<Option<Tensor>>, b| {
        let t: &Tensor = values[p.storage(b).index()].as_ref().expect("operand computed");
        t.reshaped(p.buffer(b).ty.shape.clone()).unwrap()
    };
    let mut notes = Vec::new();
    for d in &p.dispatches {
        let args: Vec<Tensor> = d.operands.iter().map(|&o| read(&values, o)).collect();
        let refs: Vec<&Tensor> = args.iter().collect();
        let m = compile_with(&classify(&[&d.kernel]), &cfg.target, &cfg.options).unwrap();
        notes.push(m.notes[0].clone());
        values[p.storage(d.result).index()] = Some(run_compiled(&d.kernel, &refs, cfg, 3));
    }
    (p.outputs.iter().map(|&o| read(&values, o)).collect(), notes)
}

fn check(act: &Act, prod: Product, seed: u64) {
    let text = prod.graph(Some(act));
    let (g, p) = form(&text);
    let what = format!("{} over {prod:?}", act.name);
    // Fused: one contraction dispatch takes the product and every op of the activation.
    let contractions: Vec<_> = p.dispatches.iter().filter(|d| d.class == KernelClass::Contraction).collect();
    assert_eq!(contractions.len(), 1, "{what}: {} contraction dispatches", contractions.len());
    assert_eq!(p.dispatches.len(), 1, "{what}: not fused:\n{}", kiln_flow::text::print_program(&p));
    let feeds = inputs(prod, seed);
    let want = interpret(&p, &feeds).unwrap();
    assert_eq!(want.len(), 1);
    // The same product and bias on |inputs|, no activation: S per output.
    let (_, plain) = form(&prod.graph(None));
    let abs: Vec<Tensor> = feeds
        .iter()
        .map(|t| {
            let v: Vec<f32> =
                t.to_vec::<f32>().unwrap().iter().map(|x| if x.is_finite() { x.abs() } else { 0.0 }).collect();
            Tensor::from_vec(t.shape().clone(), v).unwrap()
        })
        .collect();
    let s = interpret(&plain, &abs).unwrap()[0].to_vec::<f32>().unwrap();
    let w = want[0].to_vec::<f32>().unwrap();
    let eps = f32::EPSILON;
    let lip_k = act.lip * (prod.k() as f32 + 2.0) / 2.0;
    let mut specials = [0usize; 3];
    for cfg in microkernel_variants(false) {
        let (got, notes) = run_program(&p, &feeds, &cfg);
        assert!(notes[0].starts_with("contraction"), "{what} {:?}: {}", cfg.target, notes[0]);
        // Full 512-bit tiles (more than one row, 64 columns or more) run every one of
        // these epilogues sixteen lanes at a time (comparisons into opmask registers).
        if let (CpuTarget::X86_64V4, Product::MatMul { m, n, .. }) = (cfg.target, prod) {
            if m > 1 && n >= 64 {
                assert!(notes[0].ends_with("epilogue on 16 lanes)"), "{what}: {}", notes[0]);
            }
        }
        let got = got[0].to_vec::<f32>().unwrap();
        for (i, (&gv, &wv)) in got.iter().zip(&w).enumerate() {
            if !wv.is_finite() {
                specials[if wv.is_nan() {
                    2
                } else if wv > 0.0 {
                    0
                } else {
                    1
                }] += 1;
                let same = (gv.is_nan() && wv.is_nan()) || gv == wv;
                assert!(same, "{what} {:?}: element {i}: got {gv}, want {wv}", cfg.target);
                continue;
            }
            let tol = (lip_k + 16.0) * eps * s[i] + 16.0 * eps * wv.abs() + 1e-30;
            assert!(
                (gv - wv).abs() <= tol,
                "{what} {:?}: element {i}: got {gv}, want {wv} (tol {tol}, S {})",
                cfg.target,
                s[i]
            );
        }
    }
    // The data reached what it was made for: non-finite results (every form gives NaN
    // for a NaN input), and values on both sides of 0.
    if special_rows(prod).0 > 0 {
        assert!(specials[2] > 0, "{what}: no NaN result");
    }
    assert!(w.iter().any(|&v| v.is_finite() && v != 0.0), "{what}: no finite non-zero result");
    let _ = g;
}

/// Every activation form over products of odd shapes: single-row, odd and tile-sized
/// MatMuls, and 1×1 convolutions over odd images.
#[test]
fn activations_fuse_into_the_microkernel() {
    require_avx2_fma!();
    let products = [
        Product::MatMul { m: 1, k: 5, n: 9 },
        Product::MatMul { m: 7, k: 33, n: 61 },
        Product::MatMul { m: 12, k: 8, n: 70 },
        Product::Conv { m: 6, k: 5, h: 7, w: 9 },
        Product::Conv { m: 16, k: 3, h: 5, w: 13 },
    ];
    for (i, act) in ACTS.iter().enumerate() {
        for (j, &prod) in products.iter().enumerate() {
            check(act, prod, (i * 16 + j) as u64 + 1);
        }
    }
}

/// A dtype check that keeps the data helper honest: the slope input is f32 and its first
/// element 0 (PRelu's zero slope gives 0·x = ±0 or NaN for infinite x).
#[test]
fn slope_data() {
    let feeds = inputs(Product::MatMul { m: 2, k: 3, n: 4 }, 1);
    assert_eq!(feeds[3].dtype(), DType::F32);
    assert_eq!(feeds[3].to_vec::<f32>().unwrap()[0], 0.0);
}
