//! The artifact commands as a user drives them: `kiln compile` → `kiln run` through files
//! on disk, `kiln inspect --json`, `kiln bench --json`, and the errors a user meets on the
//! way (weights missing or replaced, a wrong input shape, an unsupported thread count).
//!
//! Expected outputs come from `kiln eval`, the plain reference evaluator (itself checked
//! against ONNX Runtime in `models.rs`), never from the compiled path under test.

mod common;

use common::{bench_json, fails_with, kiln, lenet_artifact, ok, s, scratch, LENET};

use kiln_ir::npy;
use std::path::Path;

fn read_f32(path: &Path) -> Vec<f32> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    npy::read(&bytes).expect("npy").to_vec::<f32>().expect("f32 output")
}

/// Element-wise |a − b| ≤ 1e-4·|b| + 1e-5·max|b| (the models test's f32 tolerance).
fn assert_close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * w.abs() + 1e-5 * scale, "element {i}: compiled {g}, reference {w}");
    }
}

#[test]
fn compile_then_run_matches_the_reference_evaluator() {
    let (dir, art) = lenet_artifact("cli", "roundtrip");
    // The same input for both, written once and fed by file.
    let input = dir.join("input.npy");
    let t = kiln_ir::Tensor::from_f64(
        kiln_ir::DType::F32,
        kiln_ir::Shape::new(&[1, 1, 28, 28]).unwrap(),
        &(0..784).map(|i| ((i * 37 % 101) as f64 - 50.0) / 25.0).collect::<Vec<_>>(),
    )
    .unwrap();
    std::fs::write(&input, npy::write(&t).unwrap()).unwrap();
    let want = dir.join("want");
    let got = dir.join("got");
    ok(&["eval", LENET, "--input", &format!("input={}", s(&input)), "--output-dir", s(&want)]);
    let out = ok(&["run", s(&art), "--input", &format!("input={}", s(&input)), "--output-dir", s(&got)]);
    assert!(out.contains("output: f32[1,10]"), "summary line missing: {out}");
    assert_close(&read_f32(&got.join("output.npy")), &read_f32(&want.join("output.npy")));
}

/// A ConstantOfShape too large to fold is filled by the plan (a Fill command, no
/// kernel), and the product reading it still matches the reference evaluator.
#[test]
fn large_constant_fills_are_fill_commands() {
    const KIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../kiln-compiler/tests/filetests/constant-fill.kir");
    let dir = scratch("cli", "fill");
    let art = dir.join("fill.kiln");
    ok(&["compile", KIR, "-o", s(&art)]);
    let plan = ok(&["inspect", s(&art)]);
    assert!(plan.contains("fill arena+0 (131072 bytes) with 0x3f000000/4"), "no fill in the plan: {plan}");
    assert!(plan.contains("1 dispatches"), "the constant still dispatched: {plan}");
    let (want, got) = (dir.join("want"), dir.join("got"));
    ok(&["eval", KIR, "--output-dir", s(&want)]);
    ok(&["run", s(&art), "--output-dir", s(&got)]);
    assert_close(&read_f32(&got.join("y.npy")), &read_f32(&want.join("y.npy")));
}

#[test]
fn external_weights_and_strip() {
    let dir = scratch("cli", "weights");
    let full = dir.join("full.kiln");
    let art = dir.join("lenet.kiln");
    let w = dir.join("lenet.weights");
    ok(&["compile", LENET, "-o", s(&full)]);
    ok(&["compile", LENET, "-o", s(&art), "--external-weights", s(&w), "--strip"]);
    let (full_len, art_len, w_len) = (
        std::fs::metadata(&full).unwrap().len(),
        std::fs::metadata(&art).unwrap().len(),
        std::fs::metadata(&w).unwrap().len(),
    );
    // lenet's weights are ~247 KB; the stripped artifact without them is a few KB:
    // about 12 KB at the default speed level (512-bit and 256-bit tiles, gathers),
    // about 5 KB at `--opt size`.
    assert!(w_len > 200_000, "weights file is {w_len} bytes");
    assert!(art_len < 16_000, "stripped artifact is {art_len} bytes");
    let small = dir.join("small.kiln");
    let w2 = dir.join("small.weights");
    ok(&["compile", LENET, "-o", s(&small), "--external-weights", s(&w2), "--strip", "--opt", "size"]);
    let small_len = std::fs::metadata(&small).unwrap().len();
    assert!(small_len < 6_000, "stripped artifact at --opt size is {small_len} bytes");
    assert!(full_len > w_len, "embedded artifact {full_len} ≤ weights {w_len}");
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("inspect --json");
    let kinds: Vec<&str> = json["sections"].as_array().unwrap().iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert!(kinds.contains(&"external-weights"), "sections: {kinds:?}");
    assert!(!kinds.contains(&"debug"), "--strip kept the debug section: {kinds:?}");
    assert!(!kinds.contains(&"constants"), "weights were embedded: {kinds:?}");

    // Same outputs with embedded and external weights.
    let (a, b) = (dir.join("a"), dir.join("b"));
    ok(&["run", s(&full), "--seed", "3", "--output-dir", s(&a)]);
    ok(&["run", s(&art), "--weights", s(&w), "--seed", "3", "--output-dir", s(&b)]);
    assert_eq!(read_f32(&a.join("output.npy")), read_f32(&b.join("output.npy")));

    // A weights file of the right size but other contents is refused by its hash.
    let mut bytes = std::fs::read(&w).unwrap();
    bytes[1000] ^= 0x40;
    let other = dir.join("other.weights");
    std::fs::write(&other, &bytes).unwrap();
    fails_with(&["run", s(&art), "--weights", s(&other)], &["weights"]);
    // Truncated, and missing.
    std::fs::write(&other, &bytes[..bytes.len() / 2]).unwrap();
    fails_with(&["run", s(&art), "--weights", s(&other)], &["weights"]);
    fails_with(&["run", s(&art), "--weights", s(&dir.join("nowhere.weights"))], &["nowhere.weights"]);
}

#[test]
fn inspect_json_describes_plan_and_memory() {
    let (_, art) = lenet_artifact("cli", "inspect");
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("inspect --json");
    assert_eq!(json["bytes"].as_u64(), Some(std::fs::metadata(&art).unwrap().len()));
    let sections: u64 = json["sections"].as_array().unwrap().iter().map(|s| s["bytes"].as_u64().unwrap()).sum();
    assert!(sections < json["bytes"].as_u64().unwrap(), "sections {sections} exceed the file");
    assert!(json["cpu_features"].as_array().is_some_and(|f| !f.is_empty()));
    let entry = &json["entries"][0];
    assert_eq!(entry["name"], "main");
    assert_eq!(entry["inputs"][0]["name"], "input");
    assert_eq!(entry["inputs"][0]["dims"], serde_json::json!([1, 1, 28, 28]));
    assert_eq!(entry["outputs"][0]["dims"], serde_json::json!([1, 10]));
    assert!(entry["arena_bytes"].as_u64().unwrap() > 0);
    let dot = ok(&["inspect", s(&art), "--dispatch-graph"]);
    assert!(dot.trim_start().starts_with("digraph"), "not DOT: {dot}");
}

#[test]
fn bench_json_and_refusals() {
    let (_, art) = lenet_artifact("cli", "bench");
    let out = ok(&["bench", s(&art), "--warmup", "2", "--iterations", "20", "--json", "--threads", "1"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("bench --json");
    for key in ["median_ms", "p99_ms", "stddev_ms"] {
        assert!(json[key].as_f64().is_some_and(|v| v >= 0.0 && v.is_finite()), "{key}: {json}");
    }
    assert!(json["median_ms"].as_f64().unwrap() > 0.0);
    assert!(json["p99_ms"].as_f64().unwrap() >= json["median_ms"].as_f64().unwrap());
    assert_eq!(json["iterations"].as_u64(), Some(20));
    assert_eq!(json["threads"].as_u64(), Some(1));
    // lenet depends on its input throughout: no prologue to time.
    assert!(json.get("prologue_ms").is_none(), "{json}");
    let out = ok(&["bench", s(&art), "--warmup", "1", "--iterations", "5", "--json", "--threads", "2"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("bench --json");
    assert_eq!(json["threads"].as_u64(), Some(2));
    assert!(json["median_ms"].as_f64().is_some_and(|v| v > 0.0), "{json}");
    // The default is one thread per core, and says so.
    let out = ok(&["bench", s(&art), "--warmup", "0", "--iterations", "2", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("bench --json");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(json["threads"].as_u64(), Some(cores));
    // A plan with an instantiation prologue (a weight computed from constants): its time
    // on its own.
    let kir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kiln-compiler/tests/filetests/prologue.kir");
    let out = ok(&["bench", s(&kir), "--warmup", "1", "--iterations", "3", "--json", "--threads", "1"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("bench --json");
    assert!(json["prologue_ms"].as_f64().is_some_and(|v| v > 0.0 && v.is_finite()), "{json}");
    let out = ok(&["bench", s(&art), "--warmup", "0", "--iterations", "2", "--threads", "3"]);
    assert!(out.contains(", 3 threads: median"), "{out}");
    fails_with(&["bench", s(&art), "--iterations", "0"], &["--iterations"]);
    fails_with(&["bench", s(&art), "--threads", "0"], &["--threads 0", "at least one thread"]);
    fails_with(&["run", s(&art), "--threads", "0"], &["--threads 0"]);
    fails_with(&["bench", s(&art), "--threads", "two"], &["--threads", "two"]);
}

/// The lines of a `kiln bench --samples` file, each split into its numbers.
fn sample_rows(file: &Path) -> Vec<Vec<f64>> {
    std::fs::read_to_string(file)
        .expect("samples file")
        .lines()
        .map(|l| l.split(' ').map(|x| x.parse::<f64>().unwrap_or_else(|_| panic!("not a number: {l:?}"))).collect())
        .collect()
}

/// `json[key]` is `v` (serde_json's float parsing may differ from Rust's in the last bit).
fn same_number(json: &serde_json::Value, key: &str, v: f64) {
    let j = json[key].as_f64().unwrap_or_else(|| panic!("{key}: {json}"));
    assert!((j - v).abs() <= 1e-12 * v, "{key} {j} vs the samples' {v}");
}

#[test]
fn bench_samples_are_the_timed_calls() {
    let (dir, art) = lenet_artifact("cli", "samples");
    let file = dir.join("samples.txt");
    let json = bench_json(&art, 1, 41, &["--threads", "1", "--samples", s(&file)]);
    let rows = sample_rows(&file);
    assert!(rows.iter().all(|r| r.len() == 1), "one number a line: {rows:?}");
    let mut ms: Vec<f64> = rows.iter().map(|r| r[0]).collect();
    assert_eq!(ms.len(), 41);
    assert!(ms.iter().all(|&t| t > 0.0 && t.is_finite()), "{ms:?}");
    // The summary is of exactly these calls.
    ms.sort_by(f64::total_cmp);
    same_number(&json, "median_ms", ms[20]);
    same_number(&json, "min_ms", ms[0]);
    same_number(&json, "p99_ms", ms[40]);
    fails_with(&["bench", s(&art), "--profile", "--samples", s(&file)], &["--samples", "--profile"]);
    fails_with(
        &["bench", s(&art), "--iterations", "2", "--samples", s(&dir.join("no/such/dir/x.txt"))],
        &["--samples"],
    );
}

#[test]
fn bench_floor_times_fixed_work_after_every_call() {
    let (dir, art) = lenet_artifact("cli", "floor");
    let file = dir.join("samples.txt");
    let plan: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("inspect --json");
    let e = &plan["entries"][0];
    let sum = |v: &serde_json::Value| v.as_array().unwrap().iter().map(|t| t["bytes"].as_u64().unwrap()).sum::<u64>();
    let consts: u64 = plan["sections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == "constants")
        .map(|s| s["bytes"].as_u64().unwrap())
        .sum();
    let json = bench_json(&art, 5, 31, &["--threads", "1", "--floor", "--samples", s(&file)]);
    // The fixed work reads the bytes one call walks.
    assert_eq!(
        json["footprint_bytes"].as_u64(),
        Some(consts + e["arena_bytes"].as_u64().unwrap() + sum(&e["inputs"]) + sum(&e["outputs"])),
        "{json}"
    );
    // Each line: the call's time, then the fixed work's after it; the summaries are of
    // those columns.
    let rows = sample_rows(&file);
    assert_eq!(rows.len(), 31);
    assert!(rows.iter().all(|r| r.len() == 2 && r.iter().all(|&t| t > 0.0 && t.is_finite())), "{rows:?}");
    for (col, key) in [(0, "median_ms"), (1, "floor_median_ms")] {
        let mut v: Vec<f64> = rows.iter().map(|r| r[col]).collect();
        v.sort_by(f64::total_cmp);
        same_number(&json, key, v[15]);
    }
    // Tuned to a call's length: with arithmetic, of the call's order; without, because
    // the read alone outlasts the call (as in an unoptimised build of this binary).
    let passes = json["floor_passes"].as_u64().expect("floor_passes");
    let (call, work) = (json["median_ms"].as_f64().unwrap(), json["floor_median_ms"].as_f64().unwrap());
    if passes > 0 {
        assert!(work > call / 3.0 && work < call * 3.0, "fixed work {work} ms against calls of {call} ms");
    } else {
        assert!(work > call * 0.7, "no arithmetic, yet the read ({work} ms) is shorter than a call ({call} ms)");
    }
    // Given passes are kept, and the arithmetic is done: more passes take longer than
    // the read alone.
    let passes = 8 * passes.max(16);
    let timed = |passes: u64| -> serde_json::Value {
        let json = bench_json(&art, 2, 31, &["--floor-passes", &passes.to_string()]);
        assert_eq!(json["floor_passes"].as_u64(), Some(passes), "{json}");
        json
    };
    let (read, more) = (timed(0), timed(passes));
    let median = |j: &serde_json::Value| j["floor_median_ms"].as_f64().unwrap();
    assert!(median(&more) > median(&read) * 2.0, "{read} against {more}");
    let text = ok(&["bench", s(&art), "--threads", "1", "--warmup", "0", "--iterations", "5", "--floor"]);
    let footprint = json["footprint_bytes"].as_u64().unwrap();
    assert!(text.contains(&format!("fixed work of its footprint ({footprint} bytes read")), "{text}");
    fails_with(&["bench", s(&art), "--floor-passes", "many"], &["--floor-passes", "many"]);
    fails_with(&["bench", s(&art), "--floor", "--profile"], &["--floor", "--profile"]);
    fails_with(&["bench", s(&art), "--floor", "--threads", "2"], &["--floor", "one thread"]);
    // Without --threads, --floor runs on one thread (the default is one per core).
    let json: serde_json::Value =
        serde_json::from_str(&ok(&["bench", s(&art), "--warmup", "1", "--iterations", "3", "--floor", "--json"]))
            .unwrap();
    assert_eq!(json["threads"].as_u64(), Some(1), "{json}");
}

#[test]
fn bench_profile_times_every_command_of_the_plan() {
    let (_, art) = lenet_artifact("cli", "profile");
    let plan: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("inspect --json");
    let commands = plan["entries"][0]["commands"].as_array().expect("commands").clone();
    let out = ok(&["bench", s(&art), "--profile", "--warmup", "2", "--iterations", "30", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("bench --profile --json");
    assert_eq!(json["threads"].as_u64(), Some(1));
    let rows = json["profile"].as_array().expect("profile rows");
    // One row per command but the barriers, slowest first.
    let mut seen: Vec<u64> = rows.iter().map(|r| r["command"].as_u64().expect("command")).collect();
    seen.sort();
    let expected: Vec<u64> = (0..commands.len() as u64).filter(|&i| commands[i as usize]["op"] != "barrier").collect();
    assert_eq!(seen, expected);
    let medians: Vec<f64> = rows.iter().map(|r| r["median_us"].as_f64().expect("median")).collect();
    assert!(medians.iter().all(|&m| m >= 0.0 && m.is_finite()), "{json}");
    assert!(medians.windows(2).all(|w| w[0] >= w[1]), "slowest first: {medians:?}");
    for r in rows {
        let c = &commands[r["command"].as_u64().unwrap() as usize];
        // Each dispatch row names its kernel and carries the plan's estimate.
        assert!(r["what"].as_str().unwrap().starts_with(c["kernel"].as_str().unwrap()), "{r} for {c}");
        assert_eq!(r["estimate_us"].as_f64().map(|e| (e * 1e3).round() as u64), c["work_ns"].as_u64(), "{r}");
        assert!(!r["source"].as_str().unwrap().is_empty(), "{r}");
    }
    // The commands' sum is at most the calls' median plus the clock's own reads.
    let sum: f64 = medians.iter().sum();
    assert!(sum > 0.0 && sum <= json["median_ms"].as_f64().unwrap() * 1e3 * 1.5, "{sum} µs: {json}");
    let text = ok(&["bench", s(&art), "--profile", "--warmup", "0", "--iterations", "3"]);
    assert!(text.contains("profile of 3 calls on one thread") && text.contains("// Conv conv1"), "{text}");
    // On two threads: per wave of the local-task driver, on its last dispatch's row (the
    // other dispatches of a wave read 0); the same rows, the waves' sum within the call.
    let out = ok(&["bench", s(&art), "--profile", "--threads", "2", "--warmup", "2", "--iterations", "30", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&out).expect("bench --profile --threads 2 --json");
    assert_eq!(json["threads"].as_u64(), Some(2), "{json}");
    let rows = json["profile"].as_array().expect("profile rows");
    let mut seen: Vec<u64> = rows.iter().map(|r| r["command"].as_u64().expect("command")).collect();
    seen.sort();
    assert_eq!(seen, expected);
    let medians: Vec<f64> = rows.iter().map(|r| r["median_us"].as_f64().expect("median")).collect();
    assert!(medians.iter().all(|&m| m >= 0.0 && m.is_finite()), "{json}");
    let sum: f64 = medians.iter().sum();
    assert!(sum > 0.0 && sum <= json["median_ms"].as_f64().unwrap() * 1e3 * 1.5, "{sum} µs: {json}");
    let text = ok(&["bench", s(&art), "--profile", "--threads", "2", "--warmup", "0", "--iterations", "3"]);
    assert!(text.contains("profile of 3 calls on 2 threads, per wave"), "{text}");
}

#[test]
fn wrong_inputs_are_refused_with_names() {
    let (dir, art) = lenet_artifact("cli", "inputs");
    let bad = dir.join("bad.npy");
    let t = kiln_ir::Tensor::from_f64(kiln_ir::DType::F32, kiln_ir::Shape::new(&[1, 1, 28, 27]).unwrap(), &[0.0; 756])
        .unwrap();
    std::fs::write(&bad, npy::write(&t).unwrap()).unwrap();
    fails_with(&["run", s(&art), "--input", &format!("input={}", s(&bad))], &["input", "28"]);
    let t = kiln_ir::Tensor::from_f64(kiln_ir::DType::F64, kiln_ir::Shape::new(&[1, 1, 28, 28]).unwrap(), &[0.0; 784])
        .unwrap();
    std::fs::write(&bad, npy::write(&t).unwrap()).unwrap();
    fails_with(&["run", s(&art), "--input", &format!("input={}", s(&bad))], &["input", "f32"]);
    fails_with(&["run", s(&art), "--input", &format!("image={}", s(&bad))], &["image"]);
    // An artifact with one byte flipped is refused by its checksum.
    let mut bytes = std::fs::read(&art).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    let broken = dir.join("broken.kiln");
    std::fs::write(&broken, &bytes).unwrap();
    let (ok, _, err) = kiln(&["run", s(&broken)]);
    assert!(!ok && !err.contains("panicked") && err.starts_with("error: "), "{err}");
}

/// An attention chain (`crates/kiln-lower/tests/filetests/class-attention.kir`) compiles
/// to one dispatch of class `attention`: `--timings` lists it with its emitter's note and
/// counts it in the summary, and `inspect` (text and JSON) reads the class back from the
/// artifact.
#[test]
fn attention_class_in_timings_and_inspect() {
    let dir = scratch("cli", "attention");
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/../kiln-lower/tests/filetests/class-attention.kir");
    let art = dir.join("attention.kiln");
    let (done, _, err) = kiln(&["compile", model, "-o", s(&art), "--target-cpu", "x86-64-v3", "--timings"]);
    assert!(done, "compile failed: {err}");
    let line =
        err.lines().find(|l| l.split_whitespace().nth(2) == Some("attention")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("256-bit attention, online softmax (avx2+fma)"), "{line}");
    assert!(err.contains("1 attention (1 microkernel), 0 general; 0 fell back"), "{err}");
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("inspect --json");
    let classes: Vec<&str> = json["entries"][0]["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .filter(|c| c["op"] == "dispatch")
        .map(|c| c["class"].as_str().unwrap())
        .collect();
    assert_eq!(classes, ["movement", "attention"]);
    assert!(ok(&["inspect", s(&art)]).contains("(attention) x"));
}

/// `compile --timings` names each dispatch's kernel class with its codegen note and sums
/// them up by class and path; `inspect` (text and JSON) reads the same class back from
/// the artifact's kernel table.
#[test]
fn kernel_classes_in_timings_and_inspect() {
    const CLASSES: [&str; 7] = ["contraction", "window", "rows", "movement", "elementwise", "general", "attention"];
    let dir = scratch("cli", "classes");
    let art = dir.join("lenet.kiln");
    let (done, _, err) = kiln(&["compile", LENET, "-o", s(&art), "--target-cpu", "x86-64-v4", "--timings"]);
    assert!(done, "compile failed: {err}");
    // One line per dispatch: kernel, work, class, code path, note.
    const PATHS: [&str; 4] = ["512-bit", "256-bit", "128-bit", "scalar"];
    let mut timed: Vec<(String, String, String)> = Vec::new();
    for line in err.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() > 4 && w[0] != "classes:" && w[1].parse::<f64>().is_ok() && CLASSES.contains(&w[2]) {
            assert!(PATHS.contains(&w[3]), "{line}");
            timed.push((w[0].to_string(), w[2].to_string(), w[4..].join(" ")));
        }
    }
    // The scalar count is said even when it is zero (LeNet has none at v4).
    assert!(err.lines().any(|l| l.trim() == format!("0 of {} dispatches run scalar", timed.len())), "{err}");
    let json: serde_json::Value = serde_json::from_str(&ok(&["inspect", s(&art), "--json"])).expect("inspect --json");
    let dispatched: Vec<(String, String)> = json["entries"][0]["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .filter(|c| c["op"] == "dispatch")
        .map(|c| (c["kernel"].as_str().unwrap().to_string(), c["class"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(timed.len(), dispatched.len(), "{err}");
    for (kernel, class) in &dispatched {
        let t = timed.iter().find(|t| &t.0 == kernel).unwrap_or_else(|| panic!("{kernel} not in --timings: {err}"));
        assert_eq!(&t.1, class, "{kernel}: --timings and the artifact disagree");
    }
    // LeNet's convolutions and fully connected layers are contractions, and at v4 they
    // take the microkernel.
    let contractions: Vec<_> = timed.iter().filter(|t| t.1 == "contraction").collect();
    assert!(contractions.len() >= 3, "{err}");
    assert!(contractions.iter().all(|t| t.2.starts_with("contraction microkernel")), "{err}");
    // The summary counts them all, by class and by path.
    let summary = err.lines().find_map(|l| l.trim().strip_prefix("classes: ")).unwrap_or_else(|| panic!("{err}"));
    let count = |c: &str| timed.iter().filter(|t| t.1 == c).count();
    let micro = |c: &str| timed.iter().filter(|t| t.1 == c && !t.2.starts_with("general")).count();
    assert!(
        summary.contains(&format!("{} contraction ({} microkernel)", count("contraction"), micro("contraction"))),
        "{summary}"
    );
    assert!(summary.contains(&format!("{} window ({} microkernel)", count("window"), micro("window"))), "{summary}");
    assert!(summary.contains(&format!(", {} general;", count("general"))), "{summary}");
    // The text listing carries the class after the kernel's name.
    let text = ok(&["inspect", s(&art)]);
    for (kernel, class) in &dispatched {
        assert!(text.contains(&format!("dispatch {kernel} ({class}) x")), "{kernel} ({class}) not in: {text}");
    }
}

/// bf16 and int4 inputs and outputs through `.npy` files in the `ml_dtypes` convention
/// (untyped `'<V2'`/`'<V1'`, int4 one element a byte; checked against numpy + ml_dtypes
/// in kiln-ir's `npy_ml_dtypes` test): `kiln eval` and `kiln run` read them as the inputs'
/// dtypes, write them as numpy saves them, and refuse a file of the wrong element size.
#[test]
fn ml_dtypes_inputs_and_outputs() {
    use kiln_ir::{DType, Shape, Tensor};
    let dir = scratch("cli", "ml-dtypes");
    let kir = dir.join("g.kir");
    std::fs::write(
        &kir,
        "graph @g(%0: bf16[2,3] \"x\", %1: i4[5] \"q\") -> (%2, %3, %4, %5) {\n\
         \x20 %2 = Cast(%0) {to = 1} : f32[2,3] \"xf\"\n\
         \x20 %3 = Cast(%1) {to = 1} : f32[5] \"qf\"\n\
         \x20 %4 = Cast(%2) {to = 16} : bf16[2,3] \"xb\"\n\
         \x20 %5 = Cast(%3) {to = 22} : i4[5] \"qb\"\n\
         }\n",
    )
    .unwrap();
    let xv = [1.5, -2.0, 0.0078125, 3.0e38, -0.0, 96.0];
    let x = Tensor::from_f64(DType::BF16, Shape::new(&[2, 3]).unwrap(), &xv).unwrap();
    let qv = [-8, 7, -1, 0, 3];
    let q = Tensor::from_i64(DType::I4, Shape::new(&[5]).unwrap(), &qv).unwrap();
    let (xf, qf) = (dir.join("x.npy"), dir.join("q.npy"));
    std::fs::write(&xf, npy::write(&x).unwrap()).unwrap();
    std::fs::write(&qf, npy::write(&q).unwrap()).unwrap();
    let q_file = std::fs::read(&qf).unwrap();
    assert!(String::from_utf8_lossy(&q_file).contains("'<V1'") && q_file.ends_with(&[8, 7, 15, 0, 3]));
    let art = dir.join("g.kiln");
    ok(&["compile", s(&kir), "-o", s(&art)]);
    let inputs = [format!("x={}", s(&xf)), format!("q={}", s(&qf))];
    let read = |p: &Path, dtype| npy::read_typed(&std::fs::read(p).unwrap(), Some(dtype)).expect("output npy");
    for (cmd, model, out) in [("eval", &kir, dir.join("eval")), ("run", &art, dir.join("run"))] {
        ok(&[cmd, s(model), "--input", &inputs[0], "--input", &inputs[1], "--output-dir", s(&out)]);
        assert_eq!(read(&out.join("xf.npy"), DType::F32).to_f64_vec(), x.to_f64_vec(), "{cmd}");
        assert_eq!(read(&out.join("qf.npy"), DType::F32).to_f64_vec(), q.to_f64_vec(), "{cmd}");
        assert_eq!(read(&out.join("xb.npy"), DType::BF16), x, "{cmd}");
        assert_eq!(read(&out.join("qb.npy"), DType::I4), q, "{cmd}");
    }
    // A one-byte untyped file for the bf16 input, an f32 file for it.
    for (cmd, model) in [("eval", &kir), ("run", &art)] {
        let wrong = format!("x={}", s(&qf));
        fails_with(&[cmd, s(model), "--input", &wrong, "--input", &inputs[1]], &["'<V1'", "bf16", "'<V2'"]);
        let f32_file = dir.join("x32.npy");
        std::fs::write(&f32_file, npy::write(&Tensor::from_f64(DType::F32, x.shape().clone(), &xv).unwrap()).unwrap())
            .unwrap();
        fails_with(
            &[cmd, s(model), "--input", &format!("x={}", s(&f32_file)), "--input", &inputs[1]],
            &["f32", "bf16"],
        );
    }
}
