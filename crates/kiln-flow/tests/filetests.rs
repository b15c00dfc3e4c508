//! Dispatch-formation filetests: each `tests/filetests/NAME.kir` is a tensor-level graph
//! in kiln-ir's text form; `kiln_flow::program::form` turns it into a flow program,
//! whose text must equal `NAME.flow`. `KILN_BLESS=1` rewrites the expectations
//! (review the diff: they pin the fusion decisions).
//!
//! Independently of the expectations, every program must
//! - print to a text that parses back to the same program;
//! - compute what the graph computes: the kernel interpreter against kiln-ref on
//!   seeded random inputs (floats within 1e-5 relative + 1e-6 absolute, integers and
//!   bools exactly);
//! - meet the counts its `.kir` file states in comment lines
//!   `// dispatches: N` (dispatches in the program) and `// reduces: N` (reduction
//!   nodes over all kernels: a contraction recomputed in two consumers shows here);
//! - have the kernel classes its `.kir` file states, when it states them:
//!   `// classes: C C …`, one class name per dispatch in order (`kiln_flow::class`),
//!   checked both on the program and against each kernel classified afresh.

use std::path::{Path, PathBuf};

use kiln_flow::class::KernelClass;
use kiln_flow::kernel::Expr;
use kiln_flow::program::{form, interpret, FlowProgram};
use kiln_flow::text::{parse_program, print_program};
use kiln_ir::{DType, Graph, Tensor};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/filetests")
}

/// Seeded inputs, uniform in [-1, 1) (bools: random bits, integers: -3..=3).
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
                    if ty.dtype == DType::Bool {
                        (x & 1) as f64
                    } else if ty.dtype.is_int() {
                        (x % 7) as f64 - 3.0
                    } else {
                        (x % 2000) as f64 / 1000.0 - 1.0
                    }
                })
                .collect();
            Tensor::from_f64(ty.dtype, ty.shape.clone(), &vals).expect("input")
        })
        .collect()
}

/// The value of `// KEY: N` in the file's comments.
fn directive(src: &str, key: &str) -> Option<usize> {
    src.lines()
        .filter_map(|l| l.trim().strip_prefix("//"))
        .filter_map(|l| l.trim().strip_prefix(key))
        .filter_map(|l| l.strip_prefix(':'))
        .find_map(|n| n.trim().parse().ok())
}

fn reduces(p: &FlowProgram) -> usize {
    p.dispatches.iter().flat_map(|d| &d.kernel.nodes).filter(|n| matches!(n.expr, Expr::Reduce { .. })).count()
}

fn compare(name: &str, got: &[Tensor], want: &[Tensor]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{name}: {} outputs, the reference gives {}", got.len(), want.len()));
    }
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        if g.ty() != w.ty() {
            return Err(format!("{name}: output {k} is {}, the reference gives {}", g.ty(), w.ty()));
        }
        if w.dtype().is_float() {
            for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                let ok = (a.is_nan() && b.is_nan()) || (a - b).abs() <= 1e-5 * b.abs() + 1e-6;
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

fn check(path: &Path, bless: bool) -> Result<(), String> {
    let name = path.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    let src = std::fs::read_to_string(path).map_err(|e| format!("{name}: {e}"))?;
    let g = kiln_ir::text::parse(&src).map_err(|e| format!("{name}:{e}"))?;
    kiln_ir::verify::verify(&g).map_err(|e| format!("{name}: invalid graph: {e}"))?;
    let p = form(&g).map_err(|e| format!("{name}: form: {e}"))?;
    let text = print_program(&p);
    match parse_program(&text) {
        Ok(back) if back == p => {}
        Ok(_) => return Err(format!("{name}: the printed program parses to a different program")),
        Err(e) => return Err(format!("{name}: the printed program does not parse: {e}\n{text}")),
    }
    let flow = path.with_extension("flow");
    if bless {
        std::fs::write(&flow, &text).map_err(|e| format!("{name}: {e}"))?;
    } else {
        let want = std::fs::read_to_string(&flow).unwrap_or_default();
        if want != text {
            return Err(format!(
                "{name}: the program differs from {}:\n--- expected\n{want}--- got\n{text}",
                flow.display()
            ));
        }
    }
    let feeds = inputs(&g);
    let want = kiln_ref::eval_graph(&g, &feeds).map_err(|e| format!("{name}: reference: {e}"))?;
    let got = interpret(&p, &feeds).map_err(|e| format!("{name}: interpret: {e}"))?;
    compare(&name, &got, &want)?;
    if let Some(n) = directive(&src, "dispatches") {
        if p.dispatches.len() != n {
            return Err(format!("{name}: {} dispatches, the file states {n}:\n{text}", p.dispatches.len()));
        }
    }
    if let Some(n) = directive(&src, "reduces") {
        if reduces(&p) != n {
            return Err(format!("{name}: {} reduction nodes, the file states {n}:\n{text}", reduces(&p)));
        }
    }
    if let Some(want) =
        src.lines().filter_map(|l| l.trim().strip_prefix("//")).find_map(|l| l.trim().strip_prefix("classes:"))
    {
        let want: Vec<&str> = want.split_whitespace().collect();
        let got: Vec<&str> = p.dispatches.iter().map(|d| d.class.name()).collect();
        if got != want {
            return Err(format!("{name}: classes {got:?}, the file states {want:?}:\n{text}"));
        }
        for d in &p.dispatches {
            let fresh = KernelClass::of(&d.kernel);
            if fresh != d.class {
                return Err(format!("{name}: {} carries class {} but is of class {fresh}", d.kernel.name, d.class));
            }
        }
    }
    Ok(())
}

#[test]
fn filetests() {
    let bless = std::env::var_os("KILN_BLESS").is_some();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("filetests dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "kir"))
        .collect();
    files.sort();
    assert!(!files.is_empty());
    // A panic in one filetest (a bug in a lowering or the interpreter) is reported
    // with the others.
    let failures: Vec<String> = files
        .iter()
        .filter_map(|f| match std::panic::catch_unwind(|| check(f, bless)) {
            Ok(r) => r.err(),
            Err(e) => {
                let what = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Some(format!("{}: panicked: {what}", f.file_name().map(|n| n.to_string_lossy()).unwrap_or_default()))
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
}

#[test]
fn directives_are_read() {
    assert_eq!(directive("// a\n// dispatches: 3\ngraph", "dispatches"), Some(3));
    assert_eq!(directive("//   reduces:1", "reduces"), Some(1));
    assert_eq!(directive("// dispatches 3", "dispatches"), None);
}
