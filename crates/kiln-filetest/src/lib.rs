//! The text-filetest harness of kiln's crates (a dev-dependency, never shipped).
//!
//! A crate's `tests/filetests.rs` names a folder of input files and a closure that checks
//! one file; this crate finds the files, runs the closure on each (a panic in one is
//! reported with the others), compares printed text with the blessed expectation and,
//! under `KILN_BLESS=1`, rewrites the expectation instead (review the diff).
//!
//! ```text
//! #[test]
//! fn filetests() {
//!     kiln_filetest::run(&kiln_filetest::dir(env!("CARGO_MANIFEST_DIR")), "kir", |case| {
//!         let text = compute(&case.src)?;
//!         case.expect(&text, "flow")
//!     });
//! }
//! ```
//!
//! [`fuzz`] holds what the fuzz-corpus replays share, [`alloc`] the counting allocator of
//! the no-allocation tests; the graph helpers ([`seeded_inputs`],
//! [`compare`]) come with the default `graphs` feature.
#![deny(missing_docs)]

pub mod alloc;
pub mod fuzz;

#[cfg(feature = "graphs")]
use kiln_ir::{DType, Graph, Tensor};
use std::path::{Path, PathBuf};

/// The environment variable that turns comparison into rewriting the expectations.
pub const BLESS_VAR: &str = "KILN_BLESS";

/// True when `KILN_BLESS` is set: expectations are written, not compared.
pub fn blessing() -> bool {
    std::env::var_os(BLESS_VAR).is_some()
}

/// The conventional folder `tests/filetests` of a crate (pass `env!("CARGO_MANIFEST_DIR")`).
pub fn dir(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).join("tests/filetests")
}

/// The input files of a folder: names ending in `.{ext}`, except blessed expectations
/// (`NAME.expected.{ext}`), sorted.
pub fn discover(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let expected = format!(".expected.{ext}");
    let suffix = format!(".{ext}");
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let n = p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            n.ends_with(&suffix) && !n.ends_with(&expected)
        })
        .collect();
    files.sort();
    files
}

/// One input file being checked.
#[derive(Debug)]
pub struct Case {
    /// Its path.
    pub path: PathBuf,
    /// Its file name, for messages.
    pub name: String,
    /// Its text.
    pub src: String,
}

impl Case {
    /// Reads a file.
    pub fn read(path: &Path) -> Result<Case, String> {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let src = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"))?;
        Ok(Case { path: path.to_path_buf(), name, src })
    }

    /// The path of the expectation with extension `ext` (`"flow"`, `"expected.kir"`).
    pub fn expected_path(&self, ext: &str) -> PathBuf {
        self.path.with_extension(ext)
    }

    /// Compares `got` with the expectation file of extension `ext`, or writes it there
    /// when blessing.
    pub fn expect(&self, got: &str, ext: &str) -> Result<(), String> {
        expect_file(&self.name, got, &self.expected_path(ext))
    }

    /// The text after `// KEY:` on a comment line of the file, trimmed.
    pub fn directive(&self, key: &str) -> Option<&str> {
        directive(&self.src, key)
    }

    /// The number after `// KEY:` on a comment line of the file.
    pub fn count(&self, key: &str) -> Option<usize> {
        count(&self.src, key)
    }
}

/// Compares `got` with the file at `expected` (under `KILN_BLESS`, writes it instead);
/// the error shows the first differing line and both texts.
pub fn expect_file(name: &str, got: &str, expected: &Path) -> Result<(), String> {
    if blessing() {
        return std::fs::write(expected, got).map_err(|e| format!("{name}: {}: {e}", expected.display()));
    }
    let want = std::fs::read_to_string(expected)
        .map_err(|e| format!("{name}: cannot read {}: {e} ({BLESS_VAR}=1 writes it)", expected.display()))?;
    if want == got {
        return Ok(());
    }
    Err(format!("{name}: differs from {}{}", expected.display(), diff(&want, got)))
}

/// Where two texts first differ, then both in full.
pub fn diff(want: &str, got: &str) -> String {
    let (mut w, mut g) = (want.lines(), got.lines());
    let mut line = 1;
    let first = loop {
        match (w.next(), g.next()) {
            (Some(a), Some(b)) if a == b => line += 1,
            (None, None) => break String::from(" (line endings)"),
            (a, b) => {
                break format!(
                    " at line {line}:\n  expected: {}\n  got:      {}",
                    a.unwrap_or("<end of text>"),
                    b.unwrap_or("<end of text>")
                )
            }
        }
    };
    let nl = |s: &str| if s.is_empty() || s.ends_with('\n') { "" } else { "\n" };
    format!("{first}\n--- expected\n{want}{}--- got\n{got}{}", nl(want), nl(got))
}

/// The text after `// KEY:` on a comment line of `src`, trimmed.
pub fn directive<'s>(src: &'s str, key: &str) -> Option<&'s str> {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("//"))
        .filter_map(|l| l.trim().strip_prefix(key))
        .find_map(|l| l.strip_prefix(':'))
        .map(str::trim)
}

/// The number after `// KEY:` on a comment line of `src` (the first such line that
/// holds a number).
pub fn count(src: &str, key: &str) -> Option<usize> {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("//"))
        .filter_map(|l| l.trim().strip_prefix(key))
        .filter_map(|l| l.strip_prefix(':'))
        .find_map(|n| n.trim().parse().ok())
}

/// Runs `check` on every input file of `dir` with extension `ext` and fails with all
/// failures together (a panic in one check is one failure); returns the files. Fails
/// when the folder has no input file.
pub fn run(dir: &Path, ext: &str, check: impl Fn(&Case) -> Result<(), String>) -> Vec<PathBuf> {
    let files = discover(dir, ext);
    assert!(!files.is_empty(), "{}: no .{ext} filetests", dir.display());
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            match fuzz::catch(|| Case::read(f).and_then(|c| check(&c))) {
                Ok(r) => r.err(),
                Err(what) => Some(format!("{name}: panicked: {what}")),
            }
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} filetests failed:\n\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
    files
}

/// Seeded inputs for a graph's inputs: a [`fuzz::XorShift`] stream from `seed`, each draw
/// turned into an element by `value(dtype, draw)`.
#[cfg(feature = "graphs")]
pub fn seeded_inputs(g: &Graph, seed: u64, value: impl Fn(DType, u64) -> f64) -> Vec<Tensor> {
    let mut rng = fuzz::XorShift(seed);
    g.inputs
        .iter()
        .map(|&v| {
            let ty = g.ty(v);
            let vals: Vec<f64> = (0..ty.shape.numel()).map(|_| value(ty.dtype, rng.next())).collect();
            Tensor::from_f64(ty.dtype, ty.shape.clone(), &vals).expect("a seeded input of the graph's own type")
        })
        .collect()
}

/// A draw as a float uniform in [-1, 1) in steps of 1/1000.
pub fn unit(draw: u64) -> f64 {
    (draw % 2000) as f64 / 1000.0 - 1.0
}

#[cfg(feature = "graphs")]
/// Compares outputs with the reference's: the same types, floats within
/// `rtol · |want| + atol` (NaN matches NaN), other dtypes bit for bit.
pub fn compare(name: &str, got: &[Tensor], want: &[Tensor], rtol: f64, atol: f64) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{name}: {} outputs, the reference gives {}", got.len(), want.len()));
    }
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        if g.ty() != w.ty() {
            return Err(format!("{name}: output {k} is {}, the reference gives {}", g.ty(), w.ty()));
        }
        if w.dtype().is_float() {
            for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= rtol * b.abs() + atol;
                if !ok {
                    return Err(format!("{name}: output {k} element {i}: {a} but the reference gives {b}"));
                }
            }
        } else if g.bytes() != w.bytes() {
            return Err(format!("{name}: output {k} differs from the reference"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directives_are_read() {
        assert_eq!(count("// a\n// dispatches: 3\ngraph", "dispatches"), Some(3));
        assert_eq!(count("//   reduces:1", "reduces"), Some(1));
        assert_eq!(count("// dispatches 3", "dispatches"), None);
        assert_eq!(directive("// pass: a b \n", "pass"), Some("a b"));
        assert_eq!(directive("x\n  // rtol: 1e-6", "rtol"), Some("1e-6"));
    }

    #[test]
    fn diff_names_the_first_differing_line() {
        assert_eq!(
            diff("a\nb\n", "a\nc\n"),
            " at line 2:\n  expected: b\n  got:      c\n--- expected\na\nb\n--- got\na\nc\n"
        );
        assert!(diff("a\n", "a\nb").starts_with(" at line 2:\n  expected: <end of text>\n  got:      b\n"));
    }

    #[test]
    fn discovery_skips_expectations_and_sorts() {
        let d = std::env::temp_dir().join(format!("kiln-filetest-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("mkdir");
        for f in ["b.kir", "a.kir", "a.expected.kir", "a.flow", "notes.txt"] {
            std::fs::write(d.join(f), "").expect("write");
        }
        let names: Vec<String> =
            discover(&d, "kir").iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        assert_eq!(names, ["a.kir", "b.kir"]);
        let _ = std::fs::remove_dir_all(&d);
    }
}
