//! ConvTranspose through the whole pipeline (import of kiln IR text → tensor passes →
//! lowering as sub-pixel phases → constant folding of the phase filters → padding →
//! fusion → weight packing → code generation → artifact → runtime) against kiln-ref,
//! over odd shapes: strides 1, 2 and 3, asymmetric strides and pads, output padding,
//! dilation, groups (a batch of contractions, depthwise, a channel multiplier), 1-D,
//! 2-D and 3-D, `auto_pad`, with a bias and with a Relu after it.
//!
//! Besides the values: the phase filters of a constant weight are folded (no dispatch
//! computes them at run time), and no dispatch of a ConvTranspose is of the general
//! class; where this CPU has AVX2+FMA, none compiles the general way either.

use kiln_compiler::{compile, Options};
use kiln_flow::class::KernelClass;
use kiln_ir::Tensor;

/// One case: input dims, weight dims, attribute text, bias, Relu after.
struct Case {
    x: Vec<usize>,
    w: Vec<usize>,
    attrs: &'static str,
    group: usize,
    bias: bool,
    relu: bool,
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f64> {
    let mut r = kiln_filetest::fuzz::XorShift::spread(seed);
    (0..n).map(|_| (r.next() % 2000) as f64 / 1024.0 - 1.0).collect()
}

fn dims_text(d: &[usize]) -> String {
    d.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(",")
}

fn list(v: &[f64]) -> String {
    v.iter().map(|x| format!("{x:?}")).collect::<Vec<_>>().join(", ")
}

/// The output dims ONNX gives (explicit pads, or `auto_pad` SAME: input · stride).
fn out_dims(c: &Case, strides: &[i64], pads: &[i64], dil: &[i64], opad: &[i64], same: bool) -> Vec<usize> {
    let r = c.x.len() - 2;
    let mut d = vec![c.x[0], c.w[1] * c.group];
    for i in 0..r {
        let o = if same {
            c.x[2 + i] as i64 * strides[i]
        } else {
            strides[i] * (c.x[2 + i] as i64 - 1) + opad[i] + (c.w[2 + i] as i64 - 1) * dil[i] + 1
                - pads[i]
                - pads[i + r]
        };
        d.push(o as usize);
    }
    d
}

fn run(c: &Case, n: usize) {
    let r = c.x.len() - 2;
    let get = |name: &str, len: usize, default: i64| -> Vec<i64> {
        let key = format!("{name} = [");
        match c.attrs.find(&key) {
            Some(at) => {
                let rest = &c.attrs[at + key.len()..];
                rest[..rest.find(']').unwrap()].split(',').map(|x| x.trim().parse().unwrap()).collect()
            }
            None => vec![default; len],
        }
    };
    let (strides, pads, dil, opad) =
        (get("strides", r, 1), get("pads", 2 * r, 0), get("dilations", r, 1), get("output_padding", r, 0));
    let od = out_dims(c, &strides, &pads, &dil, &opad, c.attrs.contains("SAME"));
    let m = od[1];
    let wn: usize = c.w.iter().product();
    // Value ids are dense: x, w, (b), the ConvTranspose, (the Relu).
    let next = 2 + usize::from(c.bias);
    let last = next + usize::from(c.relu);
    let mut text = format!("graph @ct(%0: f32[{}] \"x\") -> (%{last}) {{\n", dims_text(&c.x));
    text += &format!("  %1 = const f32[{}] [{}] \"w\"\n", dims_text(&c.w), list(&values(wn, 7 + n as u64)));
    let mut attrs = c.attrs.to_string();
    if c.group > 1 {
        attrs = format!("{attrs}, group = {}", c.group);
    }
    let operands = if c.bias {
        text += &format!("  %2 = const f32[{m}] [{}] \"b\"\n", list(&values(m, 11 + n as u64)));
        "%0, %1, %2"
    } else {
        "%0, %1"
    };
    text += &format!("  %{next} = ConvTranspose({operands}) {{{attrs}}} : f32[{}] \"y\" node \"ct\"\n", dims_text(&od));
    if c.relu {
        text += &format!("  %{last} = Relu(%{next}) : f32[{}] \"z\" node \"relu\"\n", dims_text(&od));
    }
    text += "}\n";
    let g = kiln_ir::text::parse(&text).unwrap_or_else(|e| panic!("case {n}: {e}\n{text}"));
    let x = kiln_ir::Tensor::from_f64(
        kiln_ir::DType::F32,
        kiln_ir::Shape::new(c.x.clone()).unwrap(),
        &values(c.x.iter().product(), 3 + n as u64),
    )
    .unwrap();
    let want =
        kiln_ref::eval_graph(&g, std::slice::from_ref(&x)).unwrap_or_else(|e| panic!("case {n}: reference: {e}"));
    let compiled = compile(&g, &Options::default()).unwrap_or_else(|e| panic!("case {n}: compile: {e}"));
    // The phase filters are folded; no ConvTranspose dispatch is general.
    let ours: Vec<usize> = (0..compiled.flow.dispatches.len())
        .filter(|&i| compiled.flow.dispatches[i].sources.iter().any(|s| s.contains("ConvTranspose")))
        .collect();
    for &i in &ours {
        let d = &compiled.flow.dispatches[i];
        assert_ne!(d.class, KernelClass::General, "case {n}: {} is general", d.kernel.name);
        let reads_w_only = d.operands.len() == 1
            && matches!(
                compiled.flow.buffer(compiled.flow.storage(d.operands[0])).kind,
                kiln_flow::program::BufferKind::Const(_)
            );
        assert!(!reads_w_only, "case {n}: {} computes from constants alone at run time", d.kernel.name);
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            let note = &compiled.codegen_notes[i];
            assert!(!note.starts_with("general"), "case {n}: {} compiled the general way: {note}", d.kernel.name);
        }
    }
    assert!(!ours.is_empty(), "case {n}: no ConvTranspose dispatch");
    let module = kiln_runtime::Module::load(&compiled.artifact, None).unwrap();
    let mut inst = kiln_runtime::Instance::new(&module).unwrap();
    let mut out = vec![0u8; want[0].ty().storage_bytes()];
    inst.invoke(&[&x.bytes()[..]], &mut [&mut out[..]]).unwrap_or_else(|e| panic!("case {n}: invoke: {e}"));
    let got = Tensor::new(want[0].ty().clone(), out.into()).unwrap();
    // Sums of at most a few hundred products of values in [-1, 1): 1e-5 relative and
    // absolute covers the reordering of the f32 sum.
    for (i, (a, b)) in got.to_f64_vec().iter().zip(want[0].to_f64_vec()).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * b.abs() + 1e-5,
            "case {n} ({}): element {i}: {a}, the reference gives {b}",
            c.attrs
        );
    }
}

#[test]
fn conv_transpose_compiled_matches_the_reference() {
    let case = |x: &[usize], w: &[usize], attrs: &'static str, group: usize, bias: bool, relu: bool| Case {
        x: x.to_vec(),
        w: w.to_vec(),
        attrs,
        group,
        bias,
        relu,
    };
    let cases = [
        // Stride 2, kernel 3, pads 1, output padding 1 (the decoder's upsampling).
        case(
            &[1, 5, 7, 9],
            &[5, 6, 3, 3],
            "strides = [2, 2], pads = [1, 1, 1, 1], output_padding = [1, 1]",
            1,
            true,
            true,
        ),
        // Kernel 4 at stride 2 (two taps per phase), 16 output channels, wide rows.
        case(&[2, 8, 6, 37], &[8, 16, 4, 4], "strides = [2, 2], pads = [1, 1, 1, 1]", 1, true, false),
        // Kernel 2 at stride 2 (one tap per phase: U-Net).
        case(&[1, 12, 5, 6], &[12, 7, 2, 2], "strides = [2, 2]", 1, false, true),
        // Asymmetric strides and pads, kernel 3×4.
        case(&[1, 3, 5, 6], &[3, 4, 3, 4], "strides = [2, 3], pads = [1, 0, 0, 2]", 1, true, false),
        // Stride 3, kernel 3, output padding 2.
        case(&[1, 4, 4, 5], &[4, 5, 3, 3], "strides = [3, 3], output_padding = [2, 1]", 1, false, false),
        // Stride 1: a flipped convolution.
        case(&[1, 6, 8, 9], &[6, 10, 3, 3], "pads = [1, 1, 1, 1]", 1, true, true),
        // Dilation 2 at stride 2, and at stride 1.
        case(&[1, 3, 5, 5], &[3, 4, 3, 3], "strides = [2, 2], dilations = [2, 2], pads = [1, 2, 0, 1]", 1, true, false),
        case(&[1, 3, 6, 7], &[3, 4, 2, 3], "dilations = [2, 3]", 1, false, false),
        // Groups: two groups of 3 input and 2 output channels (the group an axis).
        case(&[1, 6, 5, 7], &[6, 2, 3, 3], "strides = [2, 2], pads = [1, 1, 1, 1]", 2, true, true),
        // Depthwise (deepfilternet3's decoder: 1×3, strides (1, 2), one side padded).
        case(
            &[1, 16, 9, 8],
            &[16, 1, 1, 3],
            "strides = [1, 2], pads = [0, 1, 0, 1], output_padding = [0, 1]",
            16,
            true,
            false,
        ),
        // A channel multiplier: each of 4 channels to 3.
        case(&[1, 4, 5, 6], &[4, 3, 3, 3], "strides = [2, 2]", 4, true, false),
        // 1-D, stride 2, kernel 4.
        case(&[2, 5, 11], &[5, 3, 4], "strides = [2], pads = [1, 2]", 1, true, true),
        // 3-D.
        case(&[1, 3, 3, 4, 5], &[3, 2, 2, 3, 2], "strides = [2, 2, 3], pads = [0, 1, 1, 0, 1, 0]", 1, true, false),
        // auto_pad: SAME_UPPER and SAME_LOWER at stride 2, kernel 3.
        case(&[1, 4, 5, 7], &[4, 3, 3, 3], "strides = [2, 2], auto_pad = \"SAME_UPPER\"", 1, false, false),
        case(&[1, 4, 5, 7], &[4, 3, 3, 3], "strides = [2, 2], auto_pad = \"SAME_LOWER\"", 1, true, false),
    ];
    for (n, c) in cases.iter().enumerate() {
        run(c, n);
    }
}
