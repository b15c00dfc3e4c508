//! The text form: print → parse → print is identical, parse(print(g)) is g (compared bit
//! for bit, NaNs included), errors carry line:column, and no input makes the parser panic.

use bytes::Bytes;
use half::{bf16, f16};
use kiln_filetest::fuzz::XorShiftStar as Rng;
use kiln_ir::attrs::EinsumAttrs;
use kiln_ir::entity::EntityId;
use kiln_ir::text::{parse, print, ParseError};
use kiln_ir::{Attr, Attrs, DType, Graph, Op, OpKind, Shape, Tensor, TensorType, ValueDef, ValueId};

fn shape(d: &[usize]) -> Shape {
    Shape::new(d.to_vec()).unwrap()
}

fn ty(dt: DType, d: &[usize]) -> TensorType {
    TensorType::new(dt, shape(d))
}

fn same_tensor(a: &Tensor, b: &Tensor, what: &str) {
    assert_eq!(a.ty(), b.ty(), "{what}: tensor type");
    assert_eq!(a.bytes(), b.bytes(), "{what}: tensor bytes");
}

fn same_attr(a: &Attr, b: &Attr, what: &str) {
    match (a, b) {
        (Attr::Float(x), Attr::Float(y)) => assert_eq!(x.to_bits(), y.to_bits(), "{what}"),
        (Attr::Floats(x), Attr::Floats(y)) => {
            let bx: Vec<u32> = x.iter().map(|v| v.to_bits()).collect();
            let by: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            assert_eq!(bx, by, "{what}");
        }
        (Attr::Tensor(x), Attr::Tensor(y)) => same_tensor(x, y, what),
        (x, y) => assert_eq!(x, y, "{what}"),
    }
}

/// Structural equality with floats compared by their bits.
fn assert_same(a: &Graph, b: &Graph) {
    assert_eq!(a.name, b.name, "graph name");
    assert_eq!(a.values.len(), b.values.len(), "value count");
    for ((id, va), vb) in a.values.iter().zip(b.values.values()) {
        let what = format!("value {id}");
        assert_eq!(va.ty, vb.ty, "{what}: type");
        assert_eq!(va.name, vb.name, "{what}: name");
        match (&va.def, &vb.def) {
            (ValueDef::Const(x), ValueDef::Const(y)) => same_tensor(x, y, &what),
            (x, y) => assert_eq!(x, y, "{what}: definition"),
        }
    }
    assert_eq!(a.nodes.len(), b.nodes.len(), "node count");
    for ((id, na), nb) in a.nodes.iter().zip(b.nodes.values()) {
        let what = format!("node {id}");
        assert_eq!(na.name, nb.name, "{what}: name");
        assert_eq!(na.op.kind, nb.op.kind, "{what}: op");
        assert_eq!(na.inputs, nb.inputs, "{what}: inputs");
        assert_eq!(na.outputs, nb.outputs, "{what}: outputs");
        let (attrs_a, attrs_b) = (na.op.to_attrs(), nb.op.to_attrs());
        assert_eq!(attrs_a.len(), attrs_b.len(), "{what}: attribute count");
        for ((ka, aa), (kb, ab)) in attrs_a.iter().zip(attrs_b.iter()) {
            assert_eq!(ka, kb, "{what}: attribute names");
            same_attr(aa, ab, &format!("{what}: attribute {ka}"));
        }
    }
    assert_eq!(a.inputs, b.inputs, "graph inputs");
    assert_eq!(a.outputs, b.outputs, "graph outputs");
}

/// print → parse → print: identical text, equal graph. Returns the text.
fn round_trip(g: &Graph) -> String {
    let text = print(g);
    let back = match parse(&text) {
        Ok(b) => b,
        Err(e) => panic!("printed text does not parse: {e}\n{text}"),
    };
    assert_same(g, &back);
    assert_eq!(print(&back), text, "second print differs");
    text
}

fn f32s(v: &[f32]) -> Tensor {
    Tensor::from_vec(shape(&[v.len()]), v.to_vec()).unwrap()
}

fn special_f32() -> Vec<f32> {
    [
        0x0000_0000u32, // 0
        0x8000_0000,    // -0
        0x3F80_0000,    // 1
        0xBFC0_0000,    // -1.5
        0x3DCC_CCCD,    // 0.1
        0x0000_0001,    // smallest subnormal
        0x7F7F_FFFF,    // max
        0x0080_0000,    // min positive normal
        0x7F80_0000,    // inf
        0xFF80_0000,    // -inf
        0x7FC0_0000,    // quiet NaN
        0x7FC0_0001,    // NaN with payload
        0xFFC0_0000,    // negative NaN
        0x7F80_0001,    // signalling NaN
        0x4B80_0001,    // 16777218: an integer-valued float above 2^24
        0x3EAA_AAAB,    // 1/3
    ]
    .iter()
    .map(|&b| f32::from_bits(b))
    .collect()
}

#[test]
fn golden_text() {
    // The exact text for a small graph, written out by hand.
    let mut g = Graph::new("tiny");
    let x = g.add_input("x", ty(DType::F32, &[2, 2]));
    let w = g.add_const("w", f32s(&[1.0, -0.5, 0.25, 2.0]).reshaped(shape(&[2, 2])).unwrap());
    let axes = g.add_const("", Tensor::from_vec(Shape::scalar(), vec![1i64]).unwrap());
    let (_, mm) =
        g.add_node("mm", Op::new(OpKind::MatMul), vec![Some(x), Some(w)], vec![("y".into(), ty(DType::F32, &[2, 2]))]);
    let attrs = Attrs::new().with("keepdims", Attr::Int(0)).with("noop_with_empty_axes", Attr::Int(0));
    let (_, r) = g.add_node(
        "",
        Op::parse(OpKind::ReduceSum, &attrs).unwrap(),
        vec![Some(mm[0]), Some(axes)],
        vec![(String::new(), ty(DType::F32, &[2]))],
    );
    let split = Attrs::new().with("axis", Attr::Int(0)).with("num_outputs", Attr::Int(2));
    let (_, parts) = g.add_node(
        "split",
        Op::parse(OpKind::Split, &split).unwrap(),
        vec![Some(r[0]), None],
        vec![("a".into(), ty(DType::F32, &[1])), (String::new(), ty(DType::F32, &[1]))],
    );
    g.outputs = vec![parts[0], parts[1]];
    let expected = "\
graph @tiny(%0: f32[2,2] \"x\") -> (%5, %6) {
  %1 = const f32[2,2] [1.0, -0.5, 0.25, 2.0] \"w\"
  %2 = const i64[] [1]
  %3 = MatMul(%0, %1) : f32[2,2] \"y\" node \"mm\"
  %4 = ReduceSum(%3, %2) {keepdims = 0, noop_with_empty_axes = 0} : f32[2]
  %5, %6 = Split(%4, _) {axis = 0, num_outputs = 2} : f32[1] \"a\", f32[1] node \"split\"
}
";
    assert_eq!(print(&g), expected);
    round_trip(&g);
}

#[test]
fn parses_hand_written_text() {
    let src = "// a comment line
graph @\"my graph\"(%0: f32[] \"in\") -> (%2, %0) {   // trailing comment
  %1 = const f32[3] [1, 2.5e0, -inf]
  %2 = Einsum(%0, _,
            _) { \"equation\" = \"a\\tb\", unknown = 6.0 } : f32[] node \"c\\\"lip\"
}
";
    let g = parse(src).unwrap();
    assert_eq!(g.name, "my graph");
    assert_eq!(g.values.len(), 3);
    assert_eq!(g.values[ValueId::new(0)].name, "in");
    assert_eq!(g.values[ValueId::new(0)].ty, ty(DType::F32, &[]));
    let c = g.constant(ValueId::new(1)).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.0, 2.5, f32::NEG_INFINITY]);
    let n = g.nodes.values().next().unwrap();
    assert_eq!(n.name, "c\"lip");
    assert_eq!(n.op.kind, OpKind::Einsum);
    assert_eq!(n.inputs, vec![Some(ValueId::new(0)), None, None]);
    // A quoted attribute name is an attribute name; attributes the op does not define are dropped.
    assert_eq!(n.op.attrs_of::<EinsumAttrs>().unwrap().equation, "a\tb");
    assert_eq!(g.outputs, vec![ValueId::new(2), ValueId::new(0)]);
    // The canonical form prints the graph name quoted and the attributes sorted.
    let text = round_trip(&g);
    assert!(text.starts_with("graph @\"my graph\"(%0: f32[] \"in\") -> (%2, %0) {\n"), "{text}");
    contains_all(&text, &["%1 = const f32[3] [1.0, 2.5, -inf]\n", "{equation = \"a\\tb\"}"]);
}

#[test]
fn every_dtype_inline_and_blob() {
    let mut g = Graph::new("dtypes");
    let s = shape(&[4]);
    let add = |g: &mut Graph, name: &str, t: Tensor| {
        g.add_const(name, t);
    };
    add(&mut g, "f32", f32s(&special_f32()));
    let f64s: Vec<f64> = [
        0u64,
        1 << 63,
        1,
        0x7FEF_FFFF_FFFF_FFFF,
        0x7FF0_0000_0000_0000,
        0x7FF8_0000_0000_0000,
        0x7FF8_0000_0000_0001,
        0xFFF0_0000_0000_0000,
        0x3FB9_9999_9999_999A,
    ]
    .iter()
    .map(|&b| f64::from_bits(b))
    .collect();
    add(&mut g, "f64", Tensor::from_vec(shape(&[9]), f64s).unwrap());
    let h: Vec<f16> = [0u16, 0x8000, 0x3C00, 0x0001, 0x7BFF, 0x7C00, 0xFC00, 0x7E00, 0x7E01, 0xFE00, 0x3555]
        .iter()
        .map(|&b| f16::from_bits(b))
        .collect();
    add(&mut g, "f16", Tensor::from_vec(shape(&[11]), h).unwrap());
    let bh: Vec<bf16> = [0u16, 0x8000, 0x3F80, 0x0001, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0x7FC1, 0xFF81]
        .iter()
        .map(|&b| bf16::from_bits(b))
        .collect();
    add(&mut g, "bf16", Tensor::from_vec(shape(&[10]), bh).unwrap());
    add(&mut g, "i8", Tensor::from_vec(s.clone(), vec![i8::MIN, -1, 0, i8::MAX]).unwrap());
    add(&mut g, "i16", Tensor::from_vec(s.clone(), vec![i16::MIN, -1, 0, i16::MAX]).unwrap());
    add(&mut g, "i32", Tensor::from_vec(s.clone(), vec![i32::MIN, -1, 0, i32::MAX]).unwrap());
    add(&mut g, "i64", Tensor::from_vec(s.clone(), vec![i64::MIN, -1, 0, i64::MAX]).unwrap());
    add(&mut g, "u8", Tensor::from_vec(s.clone(), vec![0u8, 1, 127, u8::MAX]).unwrap());
    add(&mut g, "u16", Tensor::from_vec(s.clone(), vec![0u16, 1, 0x8000, u16::MAX]).unwrap());
    add(&mut g, "u32", Tensor::from_vec(s.clone(), vec![0u32, 1, 0x8000_0000, u32::MAX]).unwrap());
    add(&mut g, "u64", Tensor::from_vec(s.clone(), vec![0u64, 1, 1 << 63, u64::MAX]).unwrap());
    add(&mut g, "bool", Tensor::from_vec(s.clone(), vec![true, false, false, true]).unwrap());
    add(&mut g, "i32 from f64", Tensor::from_f64(DType::I32, s.clone(), &[-3.0, 7.0, 0.0, 1e6]).unwrap());
    add(&mut g, "f32 from f64", Tensor::from_f64(DType::F32, s.clone(), &[0.1, -2.0, 1e-40, 3.0]).unwrap());
    // 4-bit types: odd and even element counts.
    for dt in [DType::I4, DType::U4, DType::F4E2M1FN] {
        add(&mut g, dt.name(), Tensor::from_codes(dt, shape(&[5]), &[0x0, 0x7, 0x8, 0xF, 0x1]).unwrap());
        add(&mut g, dt.name(), Tensor::from_codes(dt, shape(&[2, 2]), &[0xF, 0xE, 0x0, 0x9]).unwrap());
    }
    for dt in [DType::F8E4M3FN, DType::F8E4M3FNUZ, DType::F8E5M2, DType::F8E5M2FNUZ, DType::F8E8M0FNU, DType::F6E3M2FN]
    {
        add(&mut g, dt.name(), Tensor::from_codes(dt, s.clone(), &[0x00, 0x80, 0x7F, 0xFF]).unwrap());
    }
    // Every dtype again as a blob (more than 16 elements), with an element count that is
    // odd and not a multiple of 3 bytes for the packed types.
    for dt in DType::ALL {
        let n = 37;
        let bytes: Vec<u8> = (0..dt.storage_bytes(n)).map(|k| (k * 37 + 11) as u8).collect();
        let mut bytes = bytes;
        if dt == DType::Bool {
            bytes.iter_mut().for_each(|b| *b &= 1);
        }
        if dt.is_packed() {
            // Clear the padding nibble so the tensor is what `from_codes` would make.
            if let Some(last) = bytes.last_mut() {
                *last &= 0x0F;
            }
        }
        add(&mut g, &format!("{dt} blob"), Tensor::new(ty(dt, &[n]), Bytes::from(bytes)).unwrap());
    }
    // Scalars and empty tensors.
    add(&mut g, "scalar", Tensor::scalar(2.5f32));
    add(&mut g, "scalar bool", Tensor::scalar(true));
    add(&mut g, "scalar i4", Tensor::from_codes(DType::I4, Shape::scalar(), &[0x9]).unwrap());
    add(&mut g, "empty", Tensor::from_vec::<f32>(shape(&[0]), vec![]).unwrap());
    add(&mut g, "empty 2d", Tensor::from_vec::<i64>(shape(&[2, 0, 3]), vec![]).unwrap());
    add(&mut g, "empty u4", Tensor::from_codes(DType::U4, shape(&[0]), &[]).unwrap());
    g.outputs = g.values.keys().collect();
    let text = round_trip(&g);
    // Spot checks of the exact element forms.
    contains_all(
        &text,
        &[
            "f32[16] [0.0, -0.0, 1.0, -1.5, 0.1, 1e-45, 3.4028235e38, 1.1754944e-38, inf, -inf, nan, nan(0x7FC00001), nan(0xFFC00000), nan(0x7F800001), 16777218.0, 0.33333334] \"f32\"",
            "f16[11] [0.0, -0.0, 1.0, 5.9604645e-8, 65504.0, inf, -inf, nan, nan(0x7E01), nan(0xFE00), 0.33325195]",
            "i4[5] [0, 7, -8, -1, 1]",
            "u4[5] [0, 7, 8, 15, 1]",
            "f4E2M1FN[2,2] [0xF, 0xE, 0x0, 0x9]",
            "f8E5M2[4] [0x00, 0x80, 0x7F, 0xFF]",
            "i64[4] [-9223372036854775808, -1, 0, 9223372036854775807]",
            "u64[4] [0, 1, 9223372036854775808, 18446744073709551615]",
            "bool[4] [true, false, false, true]",
            "const f32[] [2.5] \"scalar\"",
            "const f32[0] [] \"empty\"",
            "const i4[] [-7] \"scalar i4\"",
            "const u8[37] blob(8) \"u8 blob\"",
            "\nblobs {\n  0:\n    \"",
        ],
    );
}

#[test]
fn odd_bytes_go_to_blobs() {
    // Bytes without an exact element form: a bool byte of 2, a set padding nibble.
    let mut g = Graph::new("odd");
    g.add_const("b", Tensor::new(ty(DType::Bool, &[3]), Bytes::from_static(&[1, 2, 0])).unwrap());
    g.add_const("p", Tensor::new(ty(DType::U4, &[3]), Bytes::from_static(&[0x21, 0xF3])).unwrap());
    g.add_const("q", Tensor::new(ty(DType::I4, &[]), Bytes::from_static(&[0x10])).unwrap());
    let text = round_trip(&g);
    assert!(
        text.contains("bool[3] blob(0)") && text.contains("u4[3] blob(1)") && text.contains("i4[] blob(2)"),
        "{text}"
    );
}

#[test]
fn exhaustive_16_and_8_bit_codes() {
    // Every f16 and bf16 bit pattern, and every code of every 8- and 4-bit type, inline.
    let mut g = Graph::new("codes");
    for chunk in (0..=u16::MAX).collect::<Vec<u16>>().chunks(16) {
        g.add_const("", Tensor::from_vec(shape(&[16]), chunk.iter().map(|&b| f16::from_bits(b)).collect()).unwrap());
        g.add_const("", Tensor::from_vec(shape(&[16]), chunk.iter().map(|&b| bf16::from_bits(b)).collect()).unwrap());
    }
    let all8: Vec<u8> = (0..=255).collect();
    for dt in DType::ALL.into_iter().filter(|d| d.bits() == 8 && *d != DType::Bool) {
        for chunk in all8.chunks(16) {
            g.add_const("", Tensor::from_codes(dt, shape(&[16]), chunk).unwrap());
        }
    }
    for dt in [DType::I4, DType::U4, DType::F4E2M1FN] {
        g.add_const("", Tensor::from_codes(dt, shape(&[16]), &all8[..16]).unwrap());
    }
    let text = round_trip(&g);
    assert!(!text.contains("blob("));
}

#[test]
fn random_f32_and_f64_bits() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut g = Graph::new("random");
    for _ in 0..2000 {
        let v: Vec<f32> = (0..16).map(|_| f32::from_bits(rng.next() as u32)).collect();
        g.add_const("", f32s(&v));
        let w: Vec<f64> = (0..16).map(|_| f64::from_bits(rng.next())).collect();
        g.add_const("", Tensor::from_vec(shape(&[16]), w).unwrap());
    }
    round_trip(&g);
}

/// Ops whose attributes between them hold every attribute kind, with awkward values.
fn every_attr_kind() -> Vec<(OpKind, Attrs)> {
    let big = Tensor::from_vec(shape(&[5, 5]), (0..25).map(|k| k as f32 * 0.5).collect()).unwrap();
    let a = Attrs::new;
    vec![
        (OpKind::Shape, a().with("start", Attr::Int(-7)).with("end", Attr::Int(i64::MAX))),
        (OpKind::Concat, a().with("axis", Attr::Int(i64::MIN))),
        (OpKind::Gemm, a().with("alpha", Attr::Float(0.1)).with("beta", Attr::Float(-0.0))),
        (OpKind::LeakyRelu, a().with("alpha", Attr::Float(3.0))),
        (OpKind::Selu, a().with("alpha", Attr::Float(1e30)).with("gamma", Attr::Float(f32::NEG_INFINITY))),
        (
            OpKind::HardSigmoid,
            a().with("alpha", Attr::Float(f32::from_bits(0x7FC0_0000)))
                .with("beta", Attr::Float(f32::from_bits(0xFF80_0123))),
        ),
        (OpKind::Shrink, a().with("bias", Attr::Float(f32::from_bits(3)))),
        (
            OpKind::Einsum,
            a().with("equation", Attr::String("quote \" backslash \\ newline \n tab \t bell \u{7} é 😀".into())),
        ),
        (OpKind::Einsum, a().with("equation", Attr::String(String::new()))),
        (OpKind::Transpose, a().with("perm", Attr::Ints(vec![1, -2, i64::MAX]))),
        (OpKind::Conv, a().with("strides", Attr::Ints(vec![]))),
        (
            OpKind::LSTM,
            a().with(
                "activation_alpha",
                Attr::Floats(vec![1.0, -0.0, f32::INFINITY, f32::from_bits(0x7FC0_0002), 1e-40]),
            )
            .with("activation_beta", Attr::Floats(vec![]))
            .with("activations", Attr::Strings(vec!["a".into(), String::new(), "\"q\"".into()])),
        ),
        (OpKind::GRU, a().with("activations", Attr::Strings(vec![]))),
        (OpKind::ConstantOfShape, a().with("value", Attr::Tensor(Tensor::scalar(1.5f32)))),
        (
            OpKind::ConstantOfShape,
            a().with("value", Attr::Tensor(Tensor::from_codes(DType::F8E4M3FN, shape(&[2]), &[0x38, 0xFE]).unwrap())),
        ),
        (OpKind::ConstantOfShape, a().with("value", Attr::Tensor(big))),
    ]
}

#[test]
fn every_attr_kind_round_trips() {
    let mut g = Graph::new("attrs");
    let x = g.add_input("x", ty(DType::F32, &[2]));
    let mut outs = Vec::new();
    for (k, (kind, attrs)) in every_attr_kind().into_iter().enumerate() {
        let (_, y) = g.add_node(
            format!("n{k}"),
            Op::parse(kind, &attrs).unwrap(),
            vec![Some(x)],
            vec![(String::new(), ty(DType::F32, &[2]))],
        );
        outs.push(y[0]);
    }
    g.outputs = outs;
    let text = round_trip(&g);
    contains_all(
        &text,
        &[
            "start = -7",
            "end = 9223372036854775807",
            "axis = -9223372036854775808",
            "alpha = 0.1",
            "beta = -0.0",
            "alpha = 3.0",
            "alpha = 1e30",
            "gamma = -inf",
            "alpha = nan",
            "beta = nan(0xFF800123)",
            "bias = 4e-45",
            "activation_alpha = [1.0, -0.0, inf, nan(0x7FC00002), 1e-40]",
            "activation_beta = floats []",
            "perm = [1, -2, 9223372036854775807]",
            "strides = ints []",
            "equation = \"quote \\\" backslash \\\\ newline \\n tab \\t bell \\u{7} é 😀\"",
            "equation = \"\"",
            "activations = [\"a\", \"\", \"\\\"q\\\"\"]",
            "activations = strings []",
            "value = f32[5,5] blob(0)",
            "value = f8E4M3FN[2] [0x38, 0xFE]",
            "value = f32[] [1.5]",
        ],
    );
}

#[test]
fn names_operands_and_ids() {
    let mut g = Graph::new("");
    let a = g.add_input("in \"a\"\n\\", ty(DType::F32, &[3]));
    let k = g.add_const("k", f32s(&[1.0, 2.0, 3.0]));
    // A node with every result named differently, one unnamed, and absent operands.
    let (_, outs) = g.add_node(
        "lstm/\u{1}\u{80}",
        Op::new(OpKind::LSTM),
        vec![Some(a), Some(k), None, None, Some(a), None],
        vec![
            ("Y".into(), ty(DType::F32, &[3])),
            (String::new(), ty(DType::F32, &[3])),
            ("Y_c".into(), ty(DType::F32, &[3])),
        ],
    );
    // A node with no operands, one with no results.
    let (_, r) = g.add_node("", Op::new(OpKind::Range), vec![], vec![("r".into(), ty(DType::I64, &[0]))]);
    g.add_node("sink", Op::new(OpKind::Identity), vec![Some(outs[1])], vec![]);
    // A graph input added after the nodes (its id is not in signature order), and a
    // constant with a large id used by a node printed before it in id order.
    let b = g.add_input("b", ty(DType::I64, &[]));
    let c_late_used_early = g.add_const("late", Tensor::scalar(4i64));
    g.nodes[kiln_ir::NodeId::new(1)].inputs = vec![Some(c_late_used_early), Some(b), None];
    // A constant nothing uses, a value whose type differs from its tensor's.
    g.add_const("unused", Tensor::scalar(0u8));
    let odd = g.add_const("reshaped", f32s(&[1.0, 2.0, 3.0, 4.0]));
    g.values[odd].ty = ty(DType::F32, &[2, 2]);
    g.outputs = vec![outs[2], a, k, r[0], outs[2], b];
    let text = round_trip(&g);
    assert!(
        text.starts_with(
            "graph @\"\"(%0: f32[3] \"in \\\"a\\\"\\n\\\\\", %6: i64[] \"b\") -> (%4, %0, %1, %5, %4, %6) {\n"
        ),
        "{text}"
    );
    contains_all(
        &text,
        &[
            "%2, %3, %4 = LSTM(%0, %1, _, _, %0, _) : f32[3] \"Y\", f32[3], f32[3] \"Y_c\" node \"lstm/\\u{1}\\u{80}\"\n",
            "  %7 = const i64[] [4] \"late\"\n  %5 = Range(%7, %6, _) : i64[0] \"r\"\n",
            "  Identity(%3) node \"sink\"\n",
            "%9 = const f32[4] [1.0, 2.0, 3.0, 4.0] : f32[2,2] \"reshaped\"\n",
        ],
    );
}

#[test]
fn empty_graph() {
    let g = Graph::new("e");
    assert_eq!(round_trip(&g), "graph @e() -> () {\n}\n");
}

/// The error of parsing `src`, as (line, col, message).
fn err(src: &str) -> (usize, usize, String) {
    match parse(src) {
        Ok(_) => panic!("parsed without error:\n{src}"),
        Err(ParseError { line, col, message }) => (line, col, message),
    }
}

/// Checks that `text` contains every piece.
fn contains_all(text: &str, pieces: &[&str]) {
    for piece in pieces {
        assert!(text.contains(piece), "missing `{piece}` in\n{text}");
    }
}

fn check_err(src: &str, line: usize, col: usize, msg: &str) {
    let (l, c, m) = err(src);
    assert!((l, c) == (line, col) && m.contains(msg), "expected {line}:{col}: …{msg}…, got {l}:{c}: {m}\nfor:\n{src}");
}

/// Errors in the one statement of a graph body, as (the statement, column, message): each
/// statement stands on line 2, indented by two, of a graph of one input `%0` (f32[2,2]) and
/// one output `%1`, and the error is on that line.
const STATEMENT_ERRORS: &[(&str, usize, &str)] = &[
    ("%1 = Foo(%0) : f32[2,2]", 8, "unknown op `Foo`"),
    ("%1 = Relu(%7) : f32[2,2]", 13, "value %7 used before definition"),
    // Attributes are checked as the op is built; the error names op, node and attribute.
    (
        "%1 = Softmax(%0) {axis = 1.5} : f32[2,2] node \"sm\"",
        8,
        "Softmax (node \"sm\"): attribute `axis` should be int, found float",
    ),
    ("%1 = Cast(%0) : f32[2,2]", 8, "Cast: required attribute `to` is missing"),
    (
        "%1 = Resize(%0) {mode = \"bicubic\"} : f32[2,2]",
        8,
        "attribute `mode` must be one of nearest, linear, cubic, got \"bicubic\"",
    ),
    ("%1 = Relu(%1) : f32[2,2]", 13, "value %1 used before definition"),
    ("%1 = const f32[2,2] blob(3)", 28, "blob 3 not defined"),
    ("%1 = const f32[2,2] [1.0, 2.0, 3.0, 4.0, 5.0]", 23, "constant has 5 elements, type f32[2,2] needs 4"),
    ("%1 = Relu(%0 : f32[2,2]", 16, "expected `,` or `)` after operand, found `:`"),
    ("%1 = Relu(%0) : f33[2,2]", 19, "unknown dtype `f33`"),
    ("%0 = Relu(%0) : f32[2,2]", 3, "value %0 defined twice"),
    ("%1 = Relu(%0) : f32[2,2] \"open", 28, "unterminated string"),
    ("%1 = const u8[2] [1, 300]", 24, "`300` is out of range for u8"),
    ("%1 = const i8[1] [1.5]", 21, "expected an integer for i8"),
    ("%1 = const i64[1] [9223372036854775808]", 22, "`9223372036854775808` is out of range for i64"),
    ("%1 = const u64[1] [99999999999999999999]", 22, "`99999999999999999999` is out of range for u64"),
    ("%1 = const u64[1] [12abc]", 22, "invalid integer `12abc`"),
    ("%1 = const f32[1] [1.2.3]", 22, "invalid number `1.2.3`"),
    ("%1 = const f16[1] [0x3C00]", 22, "hex literal `0x3C00` is not a f16 value"),
    ("%1 = const f32[1] [nan(0x3F800000)]", 26, "0x3F800000 is not a NaN of f32"),
    ("%1 = const bool[1] [1]", 23, "expected `true` or `false`"),
    ("%1 = const f8E4M3FN[1] [0x100]", 27, "code `0x100` is out of range"),
    ("%1 = Relu(%0) {axis = 1, axis = 2} : f32[2,2]", 28, "attribute `axis` given twice"),
    ("%1 = Relu(%0) {axis = [1, 2.0]} : f32[2,2]", 26, "in a list of floats"),
    ("%1 = Relu(%0) {axis = []} : f32[2,2]", 25, "an empty list must name its kind"),
    ("%1 = Relu(%0) : f32[2,2], f32[2,2]", 29, "more result types than results"),
    ("%1 = Relu(%0) : f32[1,1,1,1,1,1,1,1,1]", 19, "rank 9 exceeds"),
    ("%1 = Relu(%0) : f32[2,-2]", 25, "expected a dimension"),
];

/// Errors in whole texts, as (text, line, column, message).
const TEXT_ERRORS: &[(&str, usize, usize, &str)] = &[
    // A statement that ends too soon: the error is at the closing brace.
    ("graph @g(%0: f32[2,2] \"x\") -> (%1) {\n  %1 = Relu(%0)\n}\n", 3, 1, "expected `:` and the result types"),
    ("graph @g(%0: f32[2,2] \"x\") -> (%1) {\n  %1, %2 = Split(%0) : f32[2,2]\n}\n", 3, 1, "expected 2 result type(s)"),
    ("graph @g(%0: f32[2,2]) -> (%2) {\n  %2 = Relu(%0) : f32[2,2]\n}\n", 2, 3, "%1 is never defined (found %2)"),
    ("graph @g(%0: f32[2] \"x\") -> (%0, %3) {\n}\n", 1, 34, "value %3 is never defined"),
    (
        "graph @g(%0: f32[2,2] \"x\") -> (%1) {\n  %1 = Relu(%0) : f32[2,2]\n}\ntrailing\n",
        4,
        1,
        "expected `blobs` or end of input",
    ),
    ("", 1, 1, "expected `graph` at the start of the file, found end of input"),
    ("graph @g(%0: f32[1]) -> (%0)", 1, 29, "expected `{` before the graph body, found end of input"),
    ("graph @g(%0 f32[1]) -> () {}", 1, 13, "expected `:` after the input's value"),
    ("graph @g() -> () {\n  $\n}", 2, 3, "unexpected character '$'"),
    ("graph @g() -> () {\n  %1 = const f32[1] [1.0] \"a\\qb\"\n}", 2, 29, "unknown escape `\\q`"),
    // The first error in the text wins, whether found by the scanner or the parser.
    ("graph @g() -> () {\n  %0 = Foo()\n  $\n}", 2, 8, "unknown op `Foo`"),
    ("graph @g() -> (%0) {\n  %0 = const u8[4] blob(0)\n}\nblobs {\n  0: $\n}\n", 5, 6, "unexpected character '$'"),
    // Columns count characters, not bytes.
    ("graph @g(%0: f32[1] \"héé\", %0: f32[1]) -> () {\n}", 1, 28, "value %0 defined twice"),
];

#[test]
fn errors_name_line_and_column() {
    for &(statement, col, msg) in STATEMENT_ERRORS {
        check_err(&format!("graph @g(%0: f32[2,2] \"x\") -> (%1) {{\n  {statement}\n}}\n"), 2, col, msg);
    }
    for &(text, line, col, msg) in TEXT_ERRORS {
        check_err(text, line, col, msg);
    }
}

#[test]
fn blob_section() {
    // AAECAw== is bytes 0,1,2,3 (RFC 4648 alphabet: A=0, B=1, C=2, D=3 as 6-bit groups).
    let ok = "graph @g() -> (%0) {\n  %0 = const u8[4] blob(0)\n}\nblobs {\n  0:\n    \"AAECAw==\"\n}\n";
    let g = parse(ok).unwrap();
    assert_eq!(g.constant(ValueId::new(0)).unwrap().bytes().as_ref(), &[0, 1, 2, 3]);
    let head = "graph @g() -> (%0) {\n  %0 = const u8[4] blob(0)\n}\n";
    check_err(&format!("{head}blobs {{\n  0:\n    \"AAEC\"\n}}\n"), 2, 25, "blob 0 has 3 bytes, type u8[4] needs 4");
    check_err(&format!("{head}blobs {{\n  0:\n    \"AA!C\"\n}}\n"), 6, 8, "invalid base64 character '!'");
    check_err(
        &format!("{head}blobs {{\n  0:\n    \"AAE=\"\n    \"AA==\"\n}}\n"),
        7,
        5,
        "continues after its `=` padding",
    );
    check_err(
        &format!("{head}blobs {{\n  0:\n    \"AAECAw==\"\n  0:\n    \"AA==\"\n}}\n"),
        7,
        3,
        "blob 0 defined twice",
    );
    check_err(&format!("{head}blobs {{\n  0:\n}}\n"), 6, 1, "expected the blob's base64 text");
    check_err(&format!("{head}blobs {{\n  x:\n}}\n"), 5, 3, "expected a blob number");
    // Blob numbers need not be dense or ordered; unused blobs are allowed.
    let g = parse(&format!("{head}blobs {{\n  7:\n    \"AA==\"\n  0:\n    \"AAECAw==\"\n}}\n")).unwrap();
    assert_eq!(g.constant(ValueId::new(0)).unwrap().bytes().as_ref(), &[0, 1, 2, 3]);
}

/// A graph exercising most of the syntax, for the mutation test.
fn sample() -> Graph {
    let mut g = Graph::new("sample");
    let x = g.add_input("x", ty(DType::F32, &[1, 3]));
    let w = g.add_const("w", Tensor::from_vec(shape(&[3, 6]), (0..18).map(|k| k as f32 - 4.5).collect()).unwrap());
    let b = g.add_const("b", Tensor::from_codes(DType::F8E5M2, shape(&[6]), &[0, 1, 0x7C, 0x80, 0xFF, 3]).unwrap());
    let (_, y) =
        g.add_node("mm", Op::new(OpKind::MatMul), vec![Some(x), Some(w)], vec![("y".into(), ty(DType::F32, &[1, 6]))]);
    for (kind, attrs) in every_attr_kind() {
        g.add_node("", Op::parse(kind, &attrs).unwrap(), vec![Some(y[0])], vec![(String::new(), ty(DType::F32, &[1]))]);
    }
    let split = Attrs::new().with("axis", Attr::Int(-1)).with("num_outputs", Attr::Int(2));
    let (_, parts) = g.add_node(
        "split",
        Op::parse(OpKind::Split, &split).unwrap(),
        vec![Some(y[0]), None, Some(b)],
        vec![("p\u{0}q".into(), ty(DType::F32, &[1, 3])), (String::new(), ty(DType::F32, &[1, 3]))],
    );
    g.outputs = vec![parts[1], parts[0]];
    g
}

#[test]
fn mutations_never_panic() {
    let text = round_trip(&sample());
    let bytes = text.as_bytes();
    let alphabet = b"%@()[]{},:=-_\"\\/ \n0123456789xabefinstABCDEF.+";
    let mut rng = Rng(0xDEAD_BEEF_CAFE_F00D);
    let (mut ok, mut failed) = (0, 0);
    // KILN_TEXT_FUZZ_ROUNDS raises the count for a longer run.
    let rounds = std::env::var("KILN_TEXT_FUZZ_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4000);
    for round in 0..rounds {
        let mut m = bytes.to_vec();
        let edits = 1 + rng.below(4);
        for _ in 0..edits {
            let at = rng.below(m.len() + 1);
            match rng.below(5) {
                0 if at < m.len() => m[at] ^= 1 << rng.below(8),
                1 if at < m.len() => m[at] = alphabet[rng.below(alphabet.len())],
                2 => m.insert(at, alphabet[rng.below(alphabet.len())]),
                3 if at < m.len() => {
                    m.remove(at);
                }
                _ => m.truncate(at),
            }
        }
        // Byte flips can break UTF-8; the parser takes `&str`, so use the lossy text.
        let src = String::from_utf8_lossy(&m);
        match parse(&src) {
            Ok(g) => {
                ok += 1;
                // Whatever parses prints and parses back to the same text.
                let again = print(&g);
                assert_eq!(print(&parse(&again).unwrap_or_else(|e| panic!("round {round}: {e}\n{again}"))), again);
            }
            Err(e) => {
                failed += 1;
                let lines = src.split('\n').count();
                assert!(e.line >= 1 && e.line <= lines && e.col >= 1, "round {round}: bad position {e}");
            }
        }
    }
    eprintln!("{ok} mutations parsed, {failed} failed");
    assert!(failed > rounds / 4, "mutations should mostly fail ({ok} parsed, {failed} failed)");
}

#[test]
fn malformed_graphs_print_without_panic() {
    // Ids out of range, an input listed twice, a node result outside the arena: the printer
    // still writes something, and the parser says what is wrong.
    let mut g = Graph::new("bad");
    let x = g.add_input("x", ty(DType::F32, &[1]));
    g.add_node("", Op::new(OpKind::Relu), vec![Some(ValueId::new(40))], vec![("y".into(), ty(DType::F32, &[1]))]);
    g.nodes.push(kiln_ir::Node {
        name: String::new(),
        op: Op::new(OpKind::Relu),
        inputs: vec![Some(x)],
        outputs: vec![ValueId::new(9)],
    });
    g.outputs = vec![ValueId::new(99)];
    g.inputs.push(x);
    let text = print(&g);
    check_err(&text, 1, 28, "value %0 defined twice");
    g.inputs.pop();
    let text = print(&g);
    assert!(text.contains("%9 = Relu(%0) : <missing value>"), "{text}");
    check_err(&text, 2, 13, "value %40 used before definition");
}
