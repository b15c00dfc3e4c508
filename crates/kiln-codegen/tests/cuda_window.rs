//! The CUDA Window emitter (`cuda::window`): depthwise convolutions, max pools and
//! average pools as `kiln_lower` writes them (and hand-built depthwise kernels with
//! fused epilogues), over odd widths (W = 1, 7, 33, 113), windows 1..7 and 13, strides
//! 1..3, dilation 2, asymmetric padding, ceil mode, `count_include_pad` both ways, 1-D
//! windows and `[K, 1]` windows over one-column planes. Every kernel must be classed
//! Window and taken by the window emitter (its note says so); each module is assembled
//! by `ptxas -arch=sm_90a -v` and every entry must have no stack frame and no spills.
//! The Window kernels that are not planes (interpolating resamples) are declined to
//! the general mapping with the reason in their note.
//!
//! No GPU runs here. Every kernel is also run by the host PTX simulator (`ptxsim`:
//! PTX's IEEE f32 arithmetic and NaN rules for `max`/`min`, every global access checked
//! to lie inside its binding) over its launch's block and a grid of at most 3 blocks,
//! much smaller than its items (so the grid-stride loop turns many times), on
//! random inputs with NaN and infinities sprinkled in, and its output must be the
//! kernel interpreter's bit for bit (NaN for NaN): the window's taps are the
//! interpreter's operations in its order, and these epilogues have no transcendental.
//! The lead runs the same kernels on the H200 (docs/cuda.md).

mod common;
mod ptxas;
use kiln_ptxsim as ptxsim;

use common::{depthwise, f32_type, lower_one, Geo, Win};
use kiln_codegen::cuda;
use kiln_flow::class::{classify, KernelClass};
use kiln_flow::Kernel;
use kiln_ir::infer::{infer, InferInput};
use kiln_ir::{Attr, Attrs, DType, Op, OpKind, Shape};
use kiln_lower::{lower_op, OpCx, OpInput};

/// `k`, lowered, renamed `name`.
fn named(name: &str, k: Result<Kernel, String>) -> Kernel {
    let mut k = k.unwrap_or_else(|e| panic!("{name}: {e}"));
    k.name = name.to_string();
    k
}

/// A depthwise `Conv` (group = C, with bias) over `x`.
fn conv(name: &str, x: &[usize], w: &Win) -> Kernel {
    named(name, w.conv(x))
}

fn max_pool(name: &str, x: &[usize], w: &Win) -> Kernel {
    named(name, w.max_pool(x))
}

fn average_pool(name: &str, x: &[usize], w: &Win, include_pad: bool) -> Kernel {
    named(name, w.average_pool(x, include_pad))
}

/// A global pool (`kind`) over `x`.
fn global(name: &str, kind: OpKind, x: [usize; 4]) -> Kernel {
    named(name, lower_one(kind, &Attrs::new(), &[f32_type(&x)]))
}

/// A hand-built depthwise convolution with a fused epilogue ([`common::epilogue_of`]:
/// "bias_relu6", "relu", "bias_hardswish", "scale_clip", "none"), padded by `pad` on
/// both sides of each axis.
fn fused(name: &str, dims: [usize; 4], win: [usize; 2], stride: [usize; 2], pad: [usize; 2], epilogue: &str) -> Kernel {
    let [n, c, h, w] = dims;
    let pad = [pad[0], pad[0], pad[1], pad[1]];
    depthwise(name, Geo { n, c, h, w, win, stride, dil: [1, 1], pad }, epilogue)
}

/// Compiles `kernels` into one module; each must be classed Window and taken by the
/// window emitter; ptxas must accept the module with no stack frame or spill in any
/// entry. Returns the module and ptxas's report.
fn assemble_windows(tag: &str, kernels: &[Kernel]) -> (cuda::CudaModule, Vec<(String, ptxas::Usage)>) {
    for k in kernels {
        assert_eq!(classify(k), KernelClass::Window, "{}: not a Window kernel", k.name);
    }
    let with_class: Vec<(&Kernel, KernelClass)> = kernels.iter().map(|k| (k, KernelClass::Window)).collect();
    let m = cuda::compile(&with_class).unwrap_or_else(|e| panic!("{tag}: {e}"));
    for (k, n) in kernels.iter().zip(&m.notes) {
        assert!(n.starts_with("window ("), "{}: {n}", k.name);
    }
    let info = ptxas::assemble_ptx_verbose("cuda-window", tag, m.ptx())
        .unwrap_or_else(|e| panic!("{tag}: ptxas refused the module:\n{e}"));
    check_no_spills(tag, &info, kernels.len());
    for (i, k) in kernels.iter().enumerate() {
        let l = m.launches[i];
        let launch = ptxsim::Grid { grid: l.grid as u32, block: l.block, shared: l.shared };
        for specials in [false, true] {
            let c = ptxsim::Check { specials, max_blocks: Some(3), ..ptxsim::Check::exact(i as u64) };
            if matches!(k.output.dtype, DType::F16 | DType::BF16) {
                check_half_output(k, m.ptx(), i, launch, &c);
            } else {
                ptxsim::check_against_interpreter(k, m.ptx(), i, launch, &c).unwrap_or_else(|e| panic!("{e}"));
            }
        }
    }
    (m, info)
}

/// ptxas reported every entry, and none uses local memory (no stack frame, no spills).
fn check_no_spills(tag: &str, usage: &[(String, ptxas::Usage)], entries: usize) {
    assert_eq!(usage.len(), entries, "{tag}: ptxas -v reported {} entries: {usage:?}", usage.len());
    for (name, u) in usage {
        assert_eq!((u.stack, u.spill_stores, u.spill_loads), (0, 0, 0), "{tag}: {name} uses local memory: {u:?}");
    }
}

/// The plane widths of the geometry tests: one column, odd widths below and above a
/// group of four outputs, and a wide one.
const WIDTHS: [usize; 4] = [1, 7, 33, 113];

/// Calls `f(width, window)` for each width of [`WIDTHS`] and each square window `(k, s,
/// p, ceil)` of `forms` (k×k taps, stride s, padding p on every side, no dilation) that
/// the padded width holds.
fn square_windows(forms: &[(i64, i64, i64, bool)], mut f: impl FnMut(usize, Win)) {
    for width in WIDTHS {
        for &(k, s, p, ceil) in forms {
            if (width as i64) + 2 * p < k {
                continue;
            }
            f(width, Win { kernel: &[k, k], strides: &[s, s], dil: &[1, 1], pads: &[p, p, p, p], ceil });
        }
    }
}

#[test]
fn depthwise_convolutions_of_every_geometry_assemble_without_spills() {
    let mut ks = Vec::new();
    let mut push = |x: &[usize], w: &Win| ks.push(conv(&format!("dw{}", ks.len()), x, w));
    // Windows 1..7, strides 1..3, half-window pads; then dilation 2, asymmetric pads
    // and a 1×1 window over each width.
    let forms: Vec<(i64, i64, i64, bool)> = (1..=7).flat_map(|k| (1..=3).map(move |s| (k, s, k / 2, false))).collect();
    square_windows(&forms, |width, w| push(&[1, 3, 9, width], &w));
    let per_width = [
        ([2, 2, 11], Win { kernel: &[3, 3], strides: &[1, 1], dil: &[2, 2], pads: &[2, 2, 2, 2], ceil: false }),
        ([1, 2, 10], Win { kernel: &[3, 3], strides: &[2, 1], dil: &[1, 1], pads: &[0, 1, 2, 1], ceil: false }),
        ([1, 2, 10], Win { kernel: &[1, 1], strides: &[1, 1], dil: &[1, 1], pads: &[0, 0, 0, 0], ceil: false }),
    ];
    for width in WIDTHS {
        for ([n, c, h], w) in &per_width {
            push(&[*n, *c, *h, width], w);
        }
    }
    // Unpadded (in-bounds loads), 13×13, 1-D rows of 31 and 169 taps, a [K, 1] column.
    push(&[1, 2, 12, 40], &Win { kernel: &[5, 5], strides: &[1, 1], dil: &[1, 1], pads: &[0, 0, 0, 0], ceil: false });
    push(&[1, 2, 20, 33], &Win { kernel: &[13, 13], strides: &[1, 1], dil: &[1, 1], pads: &[6, 6, 6, 6], ceil: false });
    push(&[1, 2, 200], &Win { kernel: &[31], strides: &[1], dil: &[1], pads: &[15, 15], ceil: false });
    push(&[1, 2, 77], &Win { kernel: &[7], strides: &[3], dil: &[2], pads: &[6, 6], ceil: false });
    push(&[1, 2, 400], &Win { kernel: &[169], strides: &[1], dil: &[1], pads: &[84, 84], ceil: false });
    push(&[1, 3, 40, 1], &Win { kernel: &[9, 1], strides: &[1, 1], dil: &[1, 1], pads: &[4, 0, 4, 0], ceil: false });
    let (m, _) = assemble_windows("depthwise", &ks);
    // The row loop where the window is large (13×13; 1×169, one output a thread);
    // unrolled rows elsewhere (1×31: four outputs a thread).
    let n = m.notes.len();
    assert!(m.notes[n - 5].contains("13x13, 4 per thread, row loop"), "{}", m.notes[n - 5]);
    assert!(m.notes[n - 2].contains("1x169, 1 per thread, row loop"), "{}", m.notes[n - 2]);
    assert!(m.notes[n - 4].contains("1x31, 4 per thread, unrolled"), "{}", m.notes[n - 4]);
    assert!(m.notes[0].contains("unrolled"), "{}", m.notes[0]);
    // Products and sums are rounded one by one, as the interpreter does: no FMA.
    assert!(!m.ptx().contains("fma."), "an FMA in a window without transcendentals");
}

#[test]
fn fused_epilogues_assemble_without_spills() {
    let mut ks = Vec::new();
    for (i, epilogue) in ["bias_relu6", "relu", "bias_hardswish", "scale_clip", "none"].into_iter().enumerate() {
        ks.push(fused(&format!("f{i}a"), [1, 4, 14, 14], [3, 3], [1, 1], [1, 1], epilogue));
        ks.push(fused(&format!("f{i}b"), [2, 3, 15, 33], [3, 3], [2, 2], [1, 1], epilogue));
        ks.push(fused(&format!("f{i}c"), [1, 2, 9, 113], [5, 5], [1, 1], [2, 2], epilogue));
        ks.push(fused(&format!("f{i}d"), [1, 2, 8, 7], [3, 3], [1, 1], [0, 0], epilogue));
    }
    let (m, _) = assemble_windows("fused", &ks);
    // Four outputs a thread (OW = 7 and 14 leave a partial group: border code).
    assert!(m.notes.iter().all(|n| n.contains("4 per thread")), "{:?}", m.notes);
}

#[test]
fn max_pools_of_every_form_assemble_without_spills() {
    let mut ks = Vec::new();
    let mut push = |x: &[usize], w: &Win| ks.push(max_pool(&format!("mp{}", ks.len()), x, w));
    let forms =
        [(2, 2, 0, false), (2, 2, 0, true), (3, 2, 1, true), (3, 1, 1, false), (3, 3, 0, true), (5, 1, 2, false)];
    square_windows(&forms, |width, w| push(&[1, 3, 13, width], &w));
    // SPPF's 5×5, 9×9 and 13×13 at stride 1; dilation 2; asymmetric; 1-D.
    push(&[1, 4, 20, 20], &Win { kernel: &[9, 9], strides: &[1, 1], dil: &[1, 1], pads: &[4, 4, 4, 4], ceil: false });
    push(&[1, 4, 20, 20], &Win { kernel: &[13, 13], strides: &[1, 1], dil: &[1, 1], pads: &[6, 6, 6, 6], ceil: false });
    push(&[1, 2, 15, 30], &Win { kernel: &[3, 5], strides: &[2, 1], dil: &[2, 1], pads: &[2, 1, 2, 3], ceil: false });
    push(&[1, 2, 15, 31], &Win { kernel: &[3, 3], strides: &[1, 2], dil: &[2, 2], pads: &[0, 3, 1, 0], ceil: true });
    push(&[1, 3, 50], &Win { kernel: &[7], strides: &[2], dil: &[1], pads: &[3, 3], ceil: true });
    for (i, dims) in [[1usize, 4, 7, 7], [2, 3, 6, 5]].into_iter().enumerate() {
        ks.push(global(&format!("gmp{i}"), OpKind::GlobalMaxPool, dims));
    }
    let (m, _) = assemble_windows("maxpool", &ks);
    assert!(m.notes.iter().all(|n| n.contains("max pool")), "{:?}", m.notes);
}

#[test]
fn average_pools_both_ways_assemble_without_spills() {
    let mut ks = Vec::new();
    let forms = [(3, 1, 1, false), (3, 2, 1, true), (2, 2, 0, true), (5, 3, 2, false), (7, 1, 3, false)];
    square_windows(&forms, |width, w| {
        for include_pad in [false, true] {
            ks.push(average_pool(&format!("ap{}", ks.len()), &[1, 2, 11, width], &w, include_pad));
        }
    });
    let w = Win { kernel: &[3, 3], strides: &[1, 1], dil: &[1, 1], pads: &[0, 1, 2, 0], ceil: false };
    ks.push(average_pool("ap_asym", &[1, 2, 11, 35], &w, false));
    // Global pools over planes of at most 8 columns are windows too (wider ones are row
    // reductions: kiln_flow::window).
    for (i, dims) in [[1usize, 4, 7, 7], [2, 3, 5, 8], [1, 2, 1, 3]].into_iter().enumerate() {
        ks.push(global(&format!("gap{i}"), OpKind::GlobalAveragePool, dims));
    }
    let (m, _) = assemble_windows("avgpool", &ks);
    assert!(m.notes.iter().all(|n| n.contains("sum pool")), "{:?}", m.notes);
}

/// An average pool without `count_include_pad` divides by the taps inside the plane,
/// an index-only reduction: in the interior it is one constant (computed by the kernel
/// interpreter at compile time), so the interior code has no loop; the border code
/// keeps the count's loop.
#[test]
fn the_interior_divides_by_a_constant() {
    let w = Win { kernel: &[3, 3], strides: &[1, 1], dil: &[1, 1], pads: &[1, 1, 1, 1], ceil: false };
    let k = average_pool("ap_count", &[1, 2, 20, 40], &w, false);
    let (m, _) = assemble_windows("count", std::slice::from_ref(&k));
    assert!(m.notes[0].contains("interior/border"), "{}", m.notes[0]);
    let ptx = m.ptx();
    // Split at the interior label (the branch target after the border code): the
    // divisor 9.0 appears as an immediate there.
    assert!(ptx.contains("0f41100000"), "no constant 9.0 divisor:\n{ptx}");
}

/// The Window kernels that are not planes (an interpolating Resize) go to the general
/// mapping, and the note says why.
#[test]
fn resamples_are_declined_with_the_reason() {
    let mut a = Attrs::new();
    a.set("mode", Attr::String("linear".into()));
    let op = Op::parse(OpKind::Resize, &a).unwrap();
    let x = f32_type(&[1, 2, 5, 7]);
    let scales = kiln_ir::Tensor::from_f64(DType::F32, Shape::new(vec![4]).unwrap(), &[1.0, 1.0, 2.0, 2.0]).unwrap();
    let ins = [Some(x.clone()), None, Some(scales.ty().clone())];
    let inf: Vec<Option<InferInput>> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| t.as_ref().map(|t| InferInput { ty: t, value: (i == 2).then_some(&scales) }))
        .collect();
    let out = infer(&op, &inf, 1).unwrap();
    let cins: Vec<Option<OpInput>> = ins
        .iter()
        .enumerate()
        .map(|(i, t)| t.as_ref().map(|t| OpInput { ty: t, value: (i == 2).then_some(&scales) }))
        .collect();
    let cx = OpCx { op: &op, name: "resize", inputs: &cins, outputs: &out };
    let k = lower_op(&cx).unwrap().steps.remove(0).kernel;
    assert_eq!(classify(&k), KernelClass::Window);
    let m = cuda::compile(&[(&k, KernelClass::Window)]).unwrap();
    assert!(m.notes[0].starts_with("general (not a depthwise window or pool"), "{}", m.notes[0]);
    ptxas::assemble_ptx("cuda-window", "resize", m.ptx()).unwrap();
}

/// A max pool with `isnan` in its body as lowered: the window's maximum is `max.f32`
/// (a NaN operand ignored), never the NaN-propagating form.
#[test]
fn max_pool_taps_ignore_nan() {
    let w = Win { kernel: &[3, 3], strides: &[2, 2], dil: &[1, 1], pads: &[1, 1, 1, 1], ceil: false };
    let k = max_pool("mp_nan", &[1, 2, 9, 9], &w);
    let (m, _) = assemble_windows("nan", std::slice::from_ref(&k));
    assert!(m.ptx().contains("max.f32"));
    assert!(!m.ptx().contains("max.NaN"), "the window's taps must not propagate NaN");
}

/// Branches that threads of a warp may take differently are plain `bra`, never
/// `bra.uni` (a promise to ptxas that the warp agrees): the grid-stride loop's exit, the
/// interior/border choice and the skips of missing outputs (3 of a group of 4 here,
/// OW = 38). Loops with the same trip count in every thread (the count of taps inside
/// the plane, in the border code) keep `.uni`.
#[test]
fn divergent_branches_are_not_uniform() {
    let w = Win { kernel: &[3, 3], strides: &[1, 1], dil: &[1, 1], pads: &[1, 1, 1, 1], ceil: false };
    let k = average_pool("ap_div", &[1, 2, 9, 38], &w, false);
    let (m, _) = assemble_windows("divergent", std::slice::from_ref(&k));
    let plain = m.ptx().lines().filter(|l| l.trim_start().starts_with('@') && l.contains(" bra L")).count();
    assert_eq!(plain, 5, "{}", m.ptx());
    // The count's loops (border code) keep their uniform exits.
    assert!(m.ptx().lines().filter(|l| l.contains("bra.uni") && l.trim_start().starts_with('@')).count() > 0);
}

/// Random geometries (seeded): depthwise convolutions, max pools and average pools
/// (`count_include_pad` either way) of 1-D and 2-D windows of 1 to 7 taps a side,
/// strides 1 to 3, dilations 1 and 2 (convolutions and max pools), any asymmetric
/// padding below the window, ceil mode, extents 1 to 40, batches and channels 1 to 3;
/// each assembled without spills and emulated against the interpreter (through
/// [`assemble_windows`]), with every form and both kinds of code among them.
#[test]
fn random_geometries_match_the_interpreter() {
    let ks = random_windows(0x5EED, 150);
    let (m, _) = assemble_windows("random", &ks);
    for what in ["depthwise", "max pool", "sum pool", "border", "interior"] {
        let n = m.notes.iter().filter(|n| n.contains(what)).count();
        assert!(n >= 20, "{n} random kernels are `{what}`: {:?}", m.notes);
    }
}

/// Random geometries as [`random_geometries_match_the_interpreter`]'s (other seeds),
/// stored as f16 and as bf16: taken by the window emitter, assembled without spills,
/// exact against the interpreter (its f32 root rounded once).
#[test]
fn random_geometries_in_half_storage_match_the_interpreter() {
    for (seed, dt, tag) in [(0xF16_u64, DType::F16, "f16"), (0xBF16, DType::BF16, "bf16")] {
        let ks: Vec<Kernel> = random_windows(seed, 60).into_iter().map(|k| stored(k, dt, dt, tag)).collect();
        // Tags name ptxas's scratch folders: unique among the tests that run at once.
        let (m, _) = assemble_windows(&format!("random_{tag}"), &ks);
        for what in ["depthwise", "max pool", "sum pool"] {
            assert!(m.notes.iter().any(|n| n.contains(what)), "{tag}: no random `{what}`: {:?}", m.notes);
        }
    }
}

/// `count` random Window kernels (seeded) of the forms above.
fn random_windows(seed: u64, count: usize) -> Vec<Kernel> {
    let mut s = seed;
    let mut next = |n: u64| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s % n
    };
    let mut ks = Vec::new();
    let mut tries = 0;
    while ks.len() < count && tries < 5000 {
        tries += 1;
        let two_d = next(4) != 0;
        let axes = if two_d { 2 } else { 1 };
        let kernel: Vec<i64> = (0..axes).map(|_| 1 + next(7) as i64).collect();
        let strides: Vec<i64> = (0..axes).map(|_| 1 + next(3) as i64).collect();
        let dil: Vec<i64> = (0..axes).map(|_| 1 + next(2) as i64).collect();
        // Each pad below its axis's window (ONNX's rule).
        let pads: Vec<i64> = (0..2 * axes).map(|i| next(kernel[i % axes] as u64) as i64).collect();
        let kind = next(3);
        let ceil = next(2) == 1;
        let mut x = vec![1 + next(3) as usize, 1 + next(3) as usize];
        x.extend((0..axes).map(|_| 1 + next(40) as usize));
        let w = Win { kernel: &kernel, strides: &strides, dil: &dil, pads: &pads, ceil };
        let k = match kind {
            0 => w.conv(&x),
            1 => w.max_pool(&x),
            _ => w.average_pool(&x, next(2) == 1),
        };
        // Geometries the attributes refuse (inference or lowering), and kernels that
        // are not Window kernels, are drawn again.
        if let Ok(mut k) = k {
            if classify(&k) == KernelClass::Window {
                k.name = format!("rnd{}", ks.len());
                ks.push(k);
            }
        }
    }
    assert_eq!(ks.len(), count, "only {} of {tries} random geometries lowered to Window kernels", ks.len());
    ks
}

/// `k` with its f32 image (input 0), filter (input 1, where `filter`) and other f32
/// inputs stored as `inputs`, and its output as `output`: what `flow-narrow-storage`
/// does to a kernel (types only; loads widen to f32, the store rounds once).
fn stored(mut k: Kernel, inputs: DType, output: DType, tag: &str) -> Kernel {
    for t in &mut k.inputs {
        if t.dtype == DType::F32 {
            t.dtype = inputs;
        }
    }
    k.output.dtype = output;
    k.name = format!("{}_{tag}", k.name);
    k
}

/// Window kernels over odd and even shapes, each in f16 and bf16 storage: depthwise
/// 3×3 and 5×5 at strides 1 and 2 with padding (lowered from `Conv`, and with fused
/// epilogues: bias + Relu6, HardSwish, scale + clip), max and average pools with
/// padding (`count_include_pad` both ways, ceil mode), a global pool, 1-D windows,
/// windows large enough for the row loop, a `[K, 1]` window.
/// Widths: odd (7, 33: halves loaded one at a time) and even (14, 40, 112: two halves
/// a word where `pw + s` is even; vector stores where 4 | OW).
fn half_windows(dt: DType, tag: &str) -> Vec<Kernel> {
    let mut ks = Vec::new();
    let mut n = 0;
    let mut name = |what: &str| {
        n += 1;
        format!("{what}{n}")
    };
    for width in [7usize, 14, 33, 40, 112] {
        for (k, s) in [(3i64, 1i64), (3, 2), (5, 1), (5, 2)] {
            let p = k / 2;
            let w = Win { kernel: &[k, k], strides: &[s, s], dil: &[1, 1], pads: &[p, p, p, p], ceil: false };
            ks.push(conv(&name("dw"), &[2, 3, 9, width], &w));
        }
        for (k, s, p, ceil) in [(3i64, 2i64, 1i64, true), (3, 1, 1, false), (2, 2, 0, false), (5, 1, 2, false)] {
            let w = Win { kernel: &[k, k], strides: &[s, s], dil: &[1, 1], pads: &[p, p, p, p], ceil };
            ks.push(max_pool(&name("mp"), &[1, 3, 11, width], &w));
            for include_pad in [false, true] {
                ks.push(average_pool(&name("ap"), &[1, 2, 11, width], &w, include_pad));
            }
        }
    }
    // Asymmetric padding and dilation; 1-D windows of odd and even length.
    let w = Win { kernel: &[3, 5], strides: &[2, 1], dil: &[2, 1], pads: &[2, 1, 2, 3], ceil: false };
    ks.push(max_pool(&name("mp"), &[1, 2, 15, 30], &w));
    let w = Win { kernel: &[3, 3], strides: &[1, 1], dil: &[2, 2], pads: &[2, 2, 2, 2], ceil: false };
    ks.push(conv(&name("dw"), &[2, 2, 11, 18], &w));
    ks.push(conv(
        &name("dw"),
        &[1, 2, 77],
        &Win { kernel: &[7], strides: &[3], dil: &[2], pads: &[6, 6], ceil: false },
    ));
    ks.push(conv(
        &name("dw"),
        &[1, 2, 64],
        &Win { kernel: &[4], strides: &[2], dil: &[1], pads: &[1, 1], ceil: false },
    ));
    ks.push(global(&name("gap"), OpKind::GlobalAveragePool, [2, 3, 5, 8]));
    // The row loop (13×13, 1×169: pairs advance with the row address), and a [K, 1]
    // window over a one-column plane.
    let w = Win { kernel: &[13, 13], strides: &[1, 1], dil: &[1, 1], pads: &[6, 6, 6, 6], ceil: false };
    ks.push(max_pool(&name("mp"), &[1, 2, 20, 20], &w));
    ks.push(average_pool(&name("ap"), &[1, 2, 17, 34], &w, false));
    let w = Win { kernel: &[169], strides: &[1], dil: &[1], pads: &[84, 84], ceil: false };
    ks.push(conv(&name("dw"), &[1, 2, 400], &w));
    let w = Win { kernel: &[9, 1], strides: &[1, 1], dil: &[1, 1], pads: &[4, 0, 4, 0], ceil: false };
    ks.push(conv(&name("dw"), &[1, 3, 40, 1], &w));
    for (i, epilogue) in ["bias_relu6", "bias_hardswish", "scale_clip"].into_iter().enumerate() {
        ks.push(fused(&format!("f{i}a"), [2, 4, 14, 14], [3, 3], [1, 1], [1, 1], epilogue));
        ks.push(fused(&format!("f{i}b"), [1, 3, 15, 33], [3, 3], [2, 2], [1, 1], epilogue));
        ks.push(fused(&format!("f{i}c"), [1, 2, 9, 28], [5, 5], [2, 2], [2, 2], epilogue));
    }
    ks.into_iter().map(|k| stored(k, dt, dt, tag)).collect()
}

/// Half storage (`--precision f16|bf16`): every window kernel is taken by the window
/// emitter (not the general mapping), assembles without spills and matches the kernel
/// interpreter bit for bit (its loads widen exactly, the taps are the same f32
/// operations, the store rounds once to nearest even), NaN and infinities included.
/// Its global accesses are all 16-bit or 32-bit words of halves: no f32 load or store.
#[test]
fn half_storage_matches_the_interpreter_exactly() {
    for (dt, tag) in [(DType::F16, "f16"), (DType::BF16, "bf16")] {
        let ks = half_windows(dt, tag);
        let (m, _) = assemble_windows(tag, &ks);
        assert!(m.notes.iter().filter(|n| n.contains("row loop")).count() >= 3, "{tag}: {:?}", m.notes);
        let ptx = m.ptx();
        for op in ["ld.global.f32", "st.global.f32", "st.global.v4.f32"] {
            assert!(!ptx.contains(op), "{tag}: `{op}` in a kernel of {tag} storage");
        }
        // Each access form is taken somewhere (and so checked by the simulator above):
        // single halves, pairs in one word, vector stores of four and scalar stores,
        // and the conversions of the storage type.
        for op in [
            "ld.global.b16".to_string(),
            "ld.global.b32".into(),
            "st.global.v4.b16".into(),
            "st.global.b16".into(),
            format!("cvt.f32.{tag}"),
            format!("cvt.rn.{tag}.f32"),
        ] {
            assert!(ptx.contains(&op), "{tag}: no `{op}`");
        }
    }
}

/// Storage mixed as the narrowing pass leaves it: a half image with an f32 output (a
/// graph output stays f32), an f32 image (a graph input) with a half output, and a
/// half image with an f32 filter (a filter kept f32). Each is a window kernel and
/// matches the interpreter exactly.
#[test]
fn mixed_storage_matches_the_interpreter_exactly() {
    let mut ks = Vec::new();
    for (dt, tag) in [(DType::F16, "f16"), (DType::BF16, "bf16")] {
        let w = Win { kernel: &[3, 3], strides: &[2, 2], dil: &[1, 1], pads: &[1, 1, 1, 1], ceil: false };
        let dw = conv("dw_mix", &[1, 3, 13, 20], &w);
        let mp = max_pool("mp_mix", &[1, 3, 13, 20], &w);
        ks.push(stored(dw.clone(), dt, DType::F32, &format!("{tag}_in")));
        ks.push(stored(mp.clone(), DType::F32, dt, &format!("{tag}_out")));
        ks.push(stored(mp, dt, DType::F32, &format!("{tag}_in")));
        let mut k = stored(dw, dt, dt, &format!("{tag}_filter32"));
        k.inputs[1].dtype = DType::F32;
        ks.push(k);
    }
    assemble_windows("mixed", &ks);
}

/// Runs entry `index` of `ptx` (kernel `k`, whose output is f16 or bf16) on the
/// random inputs of `c` over the reduced grid of `c`, and compares every element it
/// wrote with the kernel interpreter's f32 root (the same kernel with an f32 output)
/// rounded once to nearest even by the simulator's own conversion (`ptxsim::to_f16`,
/// `to_bf16`): the interpreter's definition of a half store (kiln-flow's kernel
/// module, *Types*). `interp::run` of the half kernel itself is not the oracle here:
/// its store goes through `Tensor::from_f64`, whose f64 → f16/bf16 conversion (the
/// `half` crate's) drops the low 32 bits of the f64 significand before rounding, so an
/// f32 value just past a tie (within its last 3 bits) rounds the wrong way.
fn check_half_output(k: &Kernel, ptx: &str, index: usize, launch: ptxsim::Grid, c: &ptxsim::Check) {
    let e = ptxsim::parse(ptx, index).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    assert_eq!(e.name, k.name);
    let ins = ptxsim::random_inputs(&k.inputs, c.seed, c.specials, c.neg_zero, c.ints);
    let refs: Vec<&kiln_ir::Tensor> = ins.iter().collect();
    let mut k32 = k.clone();
    k32.output.dtype = DType::F32;
    let want = kiln_flow::interp::run(&k32, &refs).unwrap_or_else(|e| panic!("{}: {e}", k.name)).to_f64_vec();
    let mut bufs: Vec<Vec<u8>> = ins.iter().map(|t| t.bytes().to_vec()).collect();
    bufs.push(vec![0xFF; k.output.storage_bytes()]);
    let mut g = ptxsim::Global::new(bufs);
    let grid = launch.grid.min(c.max_blocks.unwrap_or(u32::MAX).max(2));
    ptxsim::run(&e, ptxsim::Grid { grid, ..launch }, &mut g, ptxsim::Limits::default())
        .unwrap_or_else(|err| panic!("{}: {err}", k.name));
    let (out, written) = (&g.bufs[k.inputs.len()], &g.written[k.inputs.len()]);
    let mut compared = 0;
    for (i, w) in want.iter().enumerate() {
        if !(written[2 * i] && written[2 * i + 1]) {
            assert!(grid < launch.grid, "{}: element {i} never written", k.name);
            continue;
        }
        let got = u16::from_le_bytes([out[2 * i], out[2 * i + 1]]);
        let want = if k.output.dtype == DType::F16 { ptxsim::to_f16(*w) } else { ptxsim::to_bf16(*w) };
        let nan = |h: u16| {
            if k.output.dtype == DType::F16 {
                h & 0x7C00 == 0x7C00 && h & 0x3FF != 0
            } else {
                h & 0x7F80 == 0x7F80 && h & 0x7F != 0
            }
        };
        assert!(
            got == want || (nan(got) && nan(want)),
            "{} (specials {}): element {i} of {:?}: simulated {got:#06x}, interpreter {want:#06x} (f32 {w:e})",
            k.name,
            c.specials,
            k.output.shape.dims()
        );
        compared += 1;
    }
    assert!(compared > 0, "{}: nothing written", k.name);
}
