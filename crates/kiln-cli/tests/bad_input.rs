//! Bad input to `kiln`: each case ends with one line on stderr that names what and
//! where, and a non-zero exit status — never a panic.

mod common;

use common::{fails_with, kiln, onnx_model, value_info};

use kiln_import::onnx::proto::{
    attribute_proto::AttributeType, AttributeProto, NodeProto, TensorProto, ValueInfoProto,
};
use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kiln-bad-input-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn node(name: &str, op: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto { name: Some(name.into()), ..common::node(op, inputs, outputs) }
}

fn model(nodes: Vec<NodeProto>, input: ValueInfoProto, output: &str, init: Vec<TensorProto>) -> Vec<u8> {
    onnx_model(nodes, vec![input], vec![value_info(output, &[])], init)
}

/// A valid model: y = Relu(x · w) with x [1,4] (both dims free when `free`).
fn good_model(free: bool) -> Vec<u8> {
    let w = TensorProto {
        dims: vec![4, 3],
        data_type: Some(1),
        name: Some("w".into()),
        float_data: (0..12).map(|i| i as f32 * 0.1).collect(),
        ..Default::default()
    };
    let mut gemm = node("mm", "Gemm", &["x", "w"], &["h"]);
    gemm.attribute.push(AttributeProto {
        name: Some("alpha".into()),
        f: Some(1.0),
        r#type: Some(AttributeType::Float as i32),
        ..Default::default()
    });
    model(
        vec![gemm, node("act", "Relu", &["h"], &["y"])],
        value_info("x", &[if free { None } else { Some(1) }, if free { None } else { Some(4) }]),
        "y",
        vec![w],
    )
}

#[test]
fn good_model_imports() {
    let p = scratch("good.onnx");
    std::fs::write(&p, good_model(false)).expect("write");
    let (ok, out, err) = kiln(&["import", p.to_str().expect("utf-8 path")]);
    assert!(ok, "{err}");
    assert!(out.contains("Gemm") && out.contains("Relu"), "{out}");
}

#[test]
fn truncated_file() {
    let p = scratch("truncated.onnx");
    let m = good_model(false);
    std::fs::write(&p, &m[..m.len() / 2]).expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["truncated.onnx", "not a valid ONNX model"]);
}

#[test]
fn random_bytes() {
    let p = scratch("random.onnx");
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let bytes: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(&p, bytes).expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["random.onnx", "not a valid ONNX model"]);
}

#[test]
fn empty_and_missing_files() {
    let p = scratch("empty.onnx");
    std::fs::write(&p, b"").expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["empty"]);
    fails_with(&["import", "/nonexistent/model.onnx"], &["cannot read", "/nonexistent/model.onnx"]);
}

#[test]
fn unknown_ops_are_all_listed() {
    let p = scratch("unknown.onnx");
    let m = model(
        vec![
            node("first", "FrobnicateA", &["x"], &["a"]),
            node("second", "Relu", &["a"], &["b"]),
            node("third", "FrobnicateB", &["b"], &["c"]),
            node("fourth", "FrobnicateA", &["c"], &["y"]),
        ],
        value_info("x", &[Some(1), Some(4)]),
        "y",
        vec![],
    );
    std::fs::write(&p, m).expect("write");
    fails_with(
        &["import", p.to_str().expect("path")],
        &[
            "unsupported operators",
            "FrobnicateA (ai.onnx opset 17, node `first` and 1 more)",
            "FrobnicateB (ai.onnx opset 17, node `third`)",
        ],
    );
}

#[test]
fn cycle() {
    let p = scratch("cycle.onnx");
    let m = model(
        vec![node("a", "Add", &["x", "y"], &["s"]), node("b", "Relu", &["s"], &["y"])],
        value_info("x", &[Some(1), Some(4)]),
        "y",
        vec![],
    );
    std::fs::write(&p, m).expect("write");
    fails_with(&["import", p.to_str().expect("path")], &["cycle", "`a`", "`b`"]);
}

#[test]
fn wrong_input_shapes() {
    let p = scratch("shapes.onnx");
    std::fs::write(&p, good_model(false)).expect("write");
    let path = p.to_str().expect("path");
    fails_with(&["import", path, "--input-shape", "x=1x5"], &["input `x`", "dimension 1 is fixed at 4", "gives 5"]);
    fails_with(&["import", path, "--input-shape", "x=1x4x1"], &["input `x`", "rank 3", "rank 2"]);
    fails_with(&["import", path, "--input-shape", "nope=1x4"], &["input `nope`", "no such input", "`x`"]);
    fails_with(&["import", path, "--input-shape", "x=1xfour"], &["`four` is not a dimension"]);
    let q = scratch("free.onnx");
    std::fs::write(&q, good_model(true)).expect("write");
    let free = q.to_str().expect("path");
    fails_with(&["import", free], &["input `x`", "free dimensions", "--input-shape"]);
    // Binding the free dimension makes it import; binding it wrongly fails in Gemm.
    let (ok, _, err) = kiln(&["import", free, "--input-shape", "x=3x4"]);
    assert!(ok, "{err}");
    fails_with(&["import", free, "--input-shape", "x=3x5"], &["node `mm`", "Gemm"]);
}

#[test]
fn eval_with_wrong_input_file() {
    let p = scratch("evalbad.onnx");
    std::fs::write(&p, good_model(false)).expect("write");
    let npy = scratch("wrong.npy");
    let t = kiln_ir::Tensor::from_vec(kiln_ir::Shape::new([2, 4]).expect("shape"), vec![0f32; 8]).expect("tensor");
    std::fs::write(&npy, kiln_ir::npy::write(&t).expect("npy")).expect("write");
    let arg = format!("x={}", npy.display());
    fails_with(&["eval", p.to_str().expect("path"), "--input", &arg], &["input `x`", "f32[2,4]", "f32[1,4]"]);
    let (ok, out, err) = kiln(&["eval", p.to_str().expect("path")]);
    assert!(ok, "{err}");
    assert!(out.starts_with("y: f32[1,3]"), "{out}");
}

// ---------------------------------------------------------------------------------------
// Crafted artifacts: a real artifact (lenet, compiled by `kiln compile`) with one field
// broken. Each is written with its checksums computed afresh (re-encoded, or resealed
// after a byte edit), so that only the decoders and the verifier can object. Every
// command that reads an artifact must refuse it with one line naming what and where.
// ---------------------------------------------------------------------------------------

use kiln_module::program::{Binding, Command, Constants, Program, Slot};
use kiln_module::sections::{read_program, write_program};
use kiln_module::SectionKind;

const LENET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/lenet.onnx");

fn s(p: &std::path::Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// lenet compiled once for every test of this file: the artifact's bytes.
fn lenet_artifact() -> &'static [u8] {
    static BYTES: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BYTES.get_or_init(|| {
        let out = scratch("lenet.kiln");
        let (ok, _, err) = kiln(&["compile", LENET, "-o", s(&out)]);
        assert!(ok, "{err}");
        std::fs::read(&out).expect("read the artifact")
    })
}

fn lenet_program() -> Program {
    let m = kiln_module::Module::parse(lenet_artifact()).expect("a valid container");
    read_program(&m).expect("valid sections").to_program()
}

/// Writes `p` as `NAME.kiln` in the scratch directory; returns its path.
fn crafted(name: &str, p: &Program) -> String {
    let path = scratch(&format!("{name}.kiln"));
    std::fs::write(&path, write_program(p)).expect("write");
    s(&path).to_string()
}

/// Indices of the dispatches of the main entry point.
fn dispatches(p: &Program) -> Vec<usize> {
    p.entries[0]
        .commands
        .iter()
        .enumerate()
        .filter(|(_, c)| matches!(c, Command::Dispatch { .. }))
        .map(|(i, _)| i)
        .collect()
}

fn bindings(p: &mut Program, command: usize) -> &mut Vec<Binding> {
    match &mut p.entries[0].commands[command] {
        Command::Dispatch { bindings, .. } => bindings,
        c => panic!("command {command} is not a dispatch: {c:?}"),
    }
}

/// Every command that reads an artifact: the listings, the dispatch graph, run, bench.
fn readers(file: &str) -> Vec<Vec<&str>> {
    vec![
        vec!["inspect", file],
        vec!["inspect", file, "--json"],
        vec!["inspect", file, "--dispatch-graph"],
        vec!["run", file],
        vec!["bench", file, "--warmup", "0", "--iterations", "1"],
    ]
}

fn every_reader_fails(file: &str, needles: &[&str]) {
    for args in readers(file) {
        fails_with(&args, needles);
    }
}

#[test]
fn the_lenet_artifact_reads_cleanly() {
    let file = crafted("lenet-as-is", &lenet_program());
    for args in readers(&file) {
        let (ok, _, err) = kiln(&args);
        assert!(ok, "kiln {args:?}: {err}");
    }
    assert!(dispatches(&lenet_program()).len() >= 2, "the cases below need a dispatch reading another's output");
}

/// The crash the review found: `inspect --dispatch-graph` compared an unverified binding
/// whose end overflows u64 with an earlier dispatch's output (a debug build panicked).
#[test]
fn binding_end_past_u64() {
    let mut p = lenet_program();
    let (first, second) = (dispatches(&p)[0], dispatches(&p)[1]);
    let slot = bindings(&mut p, first).last().expect("an output").slot;
    assert_eq!(slot, Slot::Arena, "lenet's first dispatch writes the arena");
    bindings(&mut p, second)[0] = Binding { slot, offset: u64::MAX, length: 2 };
    let file = crafted("end-past-u64", &p);
    every_reader_fails(
        &file,
        &[
            "invalid module",
            &format!("command {second}"),
            "binding 0",
            "arena bytes 18446744073709551615..18446744073709551615+2",
        ],
    );
}

#[test]
fn binding_past_its_slot() {
    let mut p = lenet_program();
    let first = dispatches(&p)[0];
    let arena = p.entries[0].arena_size;
    let b = bindings(&mut p, first);
    let last = b.len() - 1;
    b[last] = Binding { slot: Slot::Arena, offset: arena - 4, length: 8 };
    let file = crafted("past-slot", &p);
    every_reader_fails(
        &file,
        &[&format!("command {first}"), &format!("binding {last}"), &format!("run past its {arena} bytes")],
    );
}

#[test]
fn dispatch_of_a_kernel_that_does_not_exist() {
    let mut p = lenet_program();
    let first = dispatches(&p)[0];
    let kernels = p.kernels.len();
    if let Command::Dispatch { kernel, .. } = &mut p.entries[0].commands[first] {
        *kernel = 1000;
    }
    let file = crafted("no-kernel", &p);
    every_reader_fails(
        &file,
        &[&format!("command {first}"), &format!("kernel 1000 does not exist ({kernels} kernels)")],
    );
}

#[test]
fn copy_into_an_input() {
    let mut p = lenet_program();
    let len = p.entries[0].inputs[0].bytes;
    p.entries[0].commands.push(Command::Copy {
        src: Binding { slot: Slot::Arena, offset: 0, length: len },
        dst: Binding { slot: Slot::Input(0), offset: 0, length: len },
    });
    let n = p.entries[0].commands.len() - 1;
    let file = crafted("copy-into-input", &p);
    every_reader_fails(&file, &[&format!("command {n}"), "copy destination writes input 0, which is read-only"]);
}

/// A name holding a line break still gives a one-line error.
#[test]
fn names_cannot_break_the_error_line() {
    let mut p = lenet_program();
    p.entries[0].name = "main\nsecond line".into();
    let first = dispatches(&p)[0];
    bindings(&mut p, first)[0].length = u64::MAX;
    let file = crafted("newline-name", &p);
    every_reader_fails(&file, &["entry main\\nsecond line", &format!("command {first}")]);
}

/// Byte-level damage inside the plan section: the last varint made to run off the end.
#[test]
fn plan_section_truncated_inside_a_varint() {
    let mut bytes = lenet_artifact().to_vec();
    let m = kiln_module::Module::parse(&bytes).expect("valid");
    let plan = m.sections().find(|s| s.kind == SectionKind::Plan).expect("a plan section");
    let (offset, len) = (plan.offset as usize, plan.bytes.len());
    assert!(plan.bytes[len - 1] < 0x80, "the plan's last varint is one byte");
    bytes[offset + len - 1] = 0x80;
    let unsealed = scratch("plan-unsealed.kiln");
    std::fs::write(&unsealed, &bytes).expect("write");
    // Without fresh checksums the container check names the section.
    every_reader_fails(s(&unsealed), &["plan section checksum mismatch"]);
    kiln_module::reseal::reseal(&mut bytes);
    let sealed = scratch("plan-truncated.kiln");
    std::fs::write(&sealed, &bytes).expect("write");
    every_reader_fails(
        s(&sealed),
        &["malformed module: plan section", &format!("file offset {}", offset + len - 1), "the section ends inside"],
    );
}

/// A section table entry pointing outside the file, resealed.
#[test]
fn section_outside_the_file() {
    let mut bytes = lenet_artifact().to_vec();
    // Entry 1's offset field: header (64) + one entry (32) + kind and flags (8).
    let at = 64 + 32 + 8;
    bytes[at..at + 8].copy_from_slice(&(u64::MAX - 7).to_le_bytes());
    kiln_module::reseal::reseal(&mut bytes);
    let file = scratch("section-outside.kiln");
    std::fs::write(&file, &bytes).expect("write");
    every_reader_fails(s(&file), &["bad container", "section 1 (18446744073709551608+"]);
}

/// The artifact may not choose which file kiln opens as its weights.
#[test]
fn weights_file_name_with_a_path() {
    let mut p = lenet_program();
    let Constants::Embedded(pool) = &p.constants else { panic!("lenet embeds its weights") };
    let (size, hash) = (pool.len() as u64, kiln_module::sections::weights_hash(pool));
    for name in ["../lenet.weights", "/etc/passwd", "sub/w.bin", ".."] {
        p.constants = Constants::External { file: name.into(), size, hash };
        let file = crafted("weights-path", &p);
        for cmd in ["run", "bench"] {
            fails_with(&[cmd, &file], &["weights file", "not a plain file name", "--weights"]);
        }
        // Listing needs no weights.
        let (ok, out, err) = kiln(&["inspect", &file]);
        assert!(ok, "{err}");
        assert!(out.contains("constants: external"), "{out}");
    }
}

/// An output whose recorded size no allocator gives (the dims agree with it, so the
/// verifier accepts it): an error, not an abort.
#[test]
fn output_too_large_to_allocate() {
    let mut p = lenet_program();
    let out = &mut p.entries[0].outputs[0];
    out.dims = vec![1 << 60];
    out.bytes = 1 << 62;
    let file = crafted("huge-output", &p);
    let (ok, _, err) = kiln(&["inspect", &file]);
    assert!(ok, "{err}");
    for args in [vec!["run", &file[..]], vec!["bench", &file, "--warmup", "0", "--iterations", "1"]] {
        fails_with(&args, &["cannot allocate the 4611686018427387904 bytes of output"]);
    }
}

#[test]
fn bench_iterations_beyond_memory() {
    let file = crafted("lenet-iterations", &lenet_program());
    fails_with(
        &["bench", &file, "--warmup", "0", "--iterations", "18446744073709551615"],
        &["cannot hold that many timings"],
    );
    fails_with(
        &["bench", &file, "--warmup", "0", "--iterations", "18446744073709551615", "--profile"],
        &["--iterations"],
    );
}
