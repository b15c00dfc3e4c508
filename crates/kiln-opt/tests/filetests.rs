//! Text filetests: each `tests/filetests/NAME.kir` starts with `// pass: P1 P2 ...`,
//! is parsed, verified, run through those passes, and printed; the print must equal
//! `NAME.expected.kir`. `KILN_BLESS=1` rewrites the expectations (review the diff).
//! Every registered pass has a filetest named after it, and every filetest's graph
//! computes the same outputs before and after (checked with the reference evaluator
//! on seeded inputs), so an expectation cannot bless a miscompile silently: exactly,
//! or within a tolerance a file states on a line `// rtol: X`, relative to each
//! output's largest magnitude (for passes that fold arithmetic into constants and so
//! round differently).

use kiln_filetest::Case;
use kiln_ir::{DType, Graph, Tensor};

/// Seeded inputs, uniform in [-1, 1) (bools: random bits).
fn inputs(g: &Graph) -> Vec<Tensor> {
    kiln_filetest::seeded_inputs(g, 0x9E37_79B9_7F4A_7C15, |dtype, x| {
        if dtype == DType::Bool {
            (x & 1) as f64
        } else {
            kiln_filetest::unit(x)
        }
    })
}

/// The passes a file names on its first line, `// pass: P1 P2 ...`.
fn passes(c: &Case) -> Result<Vec<&str>, String> {
    let first = c.src.lines().next().and_then(|l| l.strip_prefix("// pass:"));
    let first = first.ok_or_else(|| format!("{}: first line must be `// pass: NAME...`", c.name))?;
    Ok(first.split_whitespace().collect())
}

/// Runs the file's passes, checks the result computes what the input does, and prints it.
fn check(c: &Case) -> Result<String, String> {
    let f = &c.name;
    let passes = passes(c)?;
    let g = kiln_ir::text::parse(&c.src).map_err(|e| format!("{f}:{e}"))?;
    kiln_ir::verify::verify(&g).map_err(|e| format!("{f}: input invalid: {e}"))?;
    let mut h = g.clone();
    kiln_opt::run_passes(&mut h, &passes).map_err(|e| format!("{f}: {e}"))?;
    let feeds = inputs(&g);
    let before = kiln_ref::eval_graph(&g, &feeds).map_err(|e| format!("{f}: eval before: {e}"))?;
    let after = kiln_ref::eval_graph(&h, &feeds).map_err(|e| format!("{f}: eval after: {e}"))?;
    // Exact, unless the file states a relative tolerance (`// rtol: X`) for a pass
    // that rounds differently by design (folding arithmetic into constants).
    let rtol = c.directive("rtol").map(|t| t.parse::<f64>().map_err(|e| format!("{f}: rtol: {e}"))).transpose()?;
    match rtol {
        None if before != after => return Err(format!("{f}: the passes changed what the graph computes")),
        None => {}
        Some(rtol) => {
            if before.len() != after.len() {
                return Err(format!("{f}: {} outputs before, {} after", before.len(), after.len()));
            }
            for (b, a) in before.iter().zip(&after) {
                let (b, a) = (b.to_f64_vec(), a.to_f64_vec());
                if b.len() != a.len() {
                    return Err(format!("{f}: {} elements before, {} after", b.len(), a.len()));
                }
                // Relative to the output's largest magnitude (a sum that cancels
                // keeps the absolute error of its terms).
                let scale = b.iter().fold(0f64, |m, x| m.max(x.abs()));
                for (i, (x, y)) in b.iter().zip(&a).enumerate() {
                    if (x - y).abs() > rtol * scale + 1e-30 {
                        return Err(format!("{f}: element {i}: {x} before, {y} after (rtol {rtol})"));
                    }
                }
            }
        }
    }
    Ok(kiln_ir::text::print(&h))
}

#[test]
fn filetests() {
    let files = kiln_filetest::run(&kiln_filetest::dir(env!("CARGO_MANIFEST_DIR")), "kir", |c| {
        let got = check(c)?;
        c.expect(&got, "expected.kir")
    });
    let mut covered = Vec::new();
    for f in &files {
        let c = Case::read(f).expect("read");
        covered.extend(passes(&c).expect("checked above").into_iter().map(str::to_string));
    }
    for p in kiln_opt::registry() {
        assert!(covered.iter().any(|c| c == p.name()), "pass `{}` has no filetest", p.name());
        assert!(
            files.iter().any(|f| f.file_name().is_some_and(|n| n.to_string_lossy().starts_with(p.name()))),
            "no filetest is named after `{}`",
            p.name()
        );
    }
}

#[test]
fn unknown_pass_is_an_error() {
    let mut g = Graph::new("g");
    assert_eq!(
        kiln_opt::run_passes(&mut g, &["tensor-frobnicate"]).unwrap_err().to_string(),
        "unknown pass `tensor-frobnicate` (`kiln list-passes` lists them)"
    );
}
