//! Text filetests: each `tests/filetests/NAME.kir` starts with `// pass: P1 P2 ...`,
//! is parsed, verified, run through those passes, and printed; the print must equal
//! `NAME.expected.kir`. `KILN_BLESS=1` rewrites the expectations (review the diff).
//! Every registered pass has a filetest named after it, and every filetest's graph
//! computes the same outputs before and after (checked with the reference evaluator
//! on seeded inputs), so an expectation cannot bless a miscompile silently: exactly,
//! or within a tolerance a file states on a line `// rtol: X`, relative to each
//! output's largest magnitude (for passes that fold arithmetic into constants and so
//! round differently).

use kiln_ir::{DType, Graph, Tensor};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/filetests")
}

fn inputs(g: &Graph) -> Vec<Tensor> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    g.inputs
        .iter()
        .map(|&v| {
            let ty = g.ty(v);
            let vals: Vec<f64> = (0..ty.shape.numel())
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    if ty.dtype == DType::Bool { (x & 1) as f64 } else { (x % 2000) as f64 / 1000.0 - 1.0 }
                })
                .collect();
            Tensor::from_f64(ty.dtype, ty.shape.clone(), &vals).expect("input")
        })
        .collect()
}

#[test]
fn filetests() {
    let bless = std::env::var_os("KILN_BLESS").is_some();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("filetests dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with(".kir") && !p.to_string_lossy().ends_with(".expected.kir"))
        .collect();
    files.sort();
    let mut covered = Vec::new();
    let mut failures = Vec::new();
    for f in &files {
        let src = std::fs::read_to_string(f).expect("read");
        let passes: Vec<&str> = src
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("// pass:"))
            .unwrap_or_else(|| panic!("{}: first line must be `// pass: NAME...`", f.display()))
            .split_whitespace()
            .collect();
        covered.extend(passes.iter().map(|p| p.to_string()));
        let g = kiln_ir::text::parse(&src).unwrap_or_else(|e| panic!("{}:{e}", f.display()));
        kiln_ir::verify::verify(&g).unwrap_or_else(|e| panic!("{}: input invalid: {e}", f.display()));
        let mut h = g.clone();
        kiln_opt::run_passes(&mut h, &passes).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let feeds = inputs(&g);
        let before = kiln_ref::eval_graph(&g, &feeds).expect("eval before");
        let after = kiln_ref::eval_graph(&h, &feeds).expect("eval after");
        // Exact, unless the file states a relative tolerance (`// rtol: X`) for a pass
        // that rounds differently by design (folding arithmetic into constants).
        let rtol: Option<f64> =
            src.lines().find_map(|l| l.strip_prefix("// rtol:")).map(|t| t.trim().parse().expect("rtol"));
        match rtol {
            None => assert_eq!(before, after, "{}: the passes changed what the graph computes", f.display()),
            Some(rtol) => {
                assert_eq!(before.len(), after.len(), "{}", f.display());
                for (b, a) in before.iter().zip(&after) {
                    let (b, a) = (b.to_f64_vec(), a.to_f64_vec());
                    assert_eq!(b.len(), a.len(), "{}", f.display());
                    // Relative to the output's largest magnitude (a sum that cancels
                    // keeps the absolute error of its terms).
                    let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
                    for (i, (x, y)) in b.iter().zip(&a).enumerate() {
                        let ok = (x - y).abs() <= rtol * scale + 1e-30;
                        assert!(ok, "{}: element {i}: {x} before, {y} after (rtol {rtol})", f.display());
                    }
                }
            }
        }
        let got = kiln_ir::text::print(&h);
        let exp_path = f.with_extension("expected.kir");
        if bless {
            std::fs::write(&exp_path, &got).expect("bless");
            continue;
        }
        let want = std::fs::read_to_string(&exp_path).unwrap_or_default();
        if got != want {
            failures.push(format!("{}:\n--- expected\n{want}--- got\n{got}", f.display()));
        }
    }
    for p in kiln_opt::registry() {
        assert!(covered.iter().any(|c| c == p.name()), "pass `{}` has no filetest", p.name());
        assert!(
            files.iter().any(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with(p.name()))),
            "no filetest is named after `{}`",
            p.name()
        );
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn unknown_pass_is_an_error() {
    let mut g = Graph::new("g");
    assert_eq!(
        kiln_opt::run_passes(&mut g, &["tensor-frobnicate"]).unwrap_err().to_string(),
        "unknown pass `tensor-frobnicate` (`kiln list-passes` lists them)"
    );
}
