//! Dispatch-formation filetests: each `tests/filetests/NAME.kir` is a tensor-level graph
//! in kiln-ir's text form; `kiln_lower::form` turns it into a flow program,
//! whose text must equal `NAME.flow`. `KILN_BLESS=1` rewrites the expectations
//! (review the diff: they pin the fusion decisions).
//!
//! Independently of the expectations, every program must
//! - print to a text that parses back to the same program (the flow text form's round
//!   trip for programs formed from graphs);
//! - compute what the graph computes: the kernel interpreter against kiln-ref on
//!   seeded random inputs (floats within 1e-5 relative + 1e-6 absolute, integers and
//!   bools exactly);
//! - meet the counts its `.kir` file states in comment lines
//!   `// dispatches: N` (dispatches in the program) and `// reduces: N` (reduction
//!   nodes over all kernels: a contraction recomputed in two consumers shows here);
//! - have the kernel classes its `.kir` file states, when it states them:
//!   `// classes: C C …`, one class name per dispatch in order (`kiln_flow::class`),
//!   checked both on the program and against each kernel classified afresh.

use kiln_filetest::Case;
use kiln_flow::class::classify;
use kiln_flow::kernel::Expr;
use kiln_flow::program::{interpret, FlowProgram};
use kiln_flow::text::{parse_program, print_program};
use kiln_ir::{DType, Graph, Tensor};
use kiln_lower::form;

/// Seeded inputs, uniform in [-1, 1) (bools: random bits, integers: -3..=3).
fn inputs(g: &Graph) -> Vec<Tensor> {
    kiln_filetest::seeded_inputs(g, 0x9E37_79B9_7F4A_7C15, |dtype, x| {
        if dtype == DType::Bool {
            (x & 1) as f64
        } else if dtype.is_int() {
            (x % 7) as f64 - 3.0
        } else {
            kiln_filetest::unit(x)
        }
    })
}

fn reduces(p: &FlowProgram) -> usize {
    p.dispatches.iter().flat_map(|d| &d.kernel.nodes).filter(|n| matches!(n.expr, Expr::Reduce { .. })).count()
}

fn check(c: &Case) -> Result<(), String> {
    let name = &c.name;
    let g = kiln_ir::text::parse(&c.src).map_err(|e| format!("{name}:{e}"))?;
    kiln_ir::verify::verify(&g).map_err(|e| format!("{name}: invalid graph: {e}"))?;
    let p = form(&g).map_err(|e| format!("{name}: form: {e}"))?;
    let text = print_program(&p);
    match parse_program(&text) {
        Ok(back) if back == p => {}
        Ok(_) => return Err(format!("{name}: the printed program parses to a different program")),
        Err(e) => return Err(format!("{name}: the printed program does not parse: {e}\n{text}")),
    }
    c.expect(&text, "flow")?;
    let feeds = inputs(&g);
    let want = kiln_ref::eval_graph(&g, &feeds).map_err(|e| format!("{name}: reference: {e}"))?;
    let got = interpret(&p, &feeds).map_err(|e| format!("{name}: interpret: {e}"))?;
    kiln_filetest::compare(name, &got, &want, 1e-5, 1e-6)?;
    if let Some(n) = c.count("dispatches") {
        if p.dispatches.len() != n {
            return Err(format!("{name}: {} dispatches, the file states {n}:\n{text}", p.dispatches.len()));
        }
    }
    if let Some(n) = c.count("reduces") {
        if reduces(&p) != n {
            return Err(format!("{name}: {} reduction nodes, the file states {n}:\n{text}", reduces(&p)));
        }
    }
    if let Some(want) =
        c.src.lines().filter_map(|l| l.trim().strip_prefix("//")).find_map(|l| l.trim().strip_prefix("classes:"))
    {
        let want: Vec<&str> = want.split_whitespace().collect();
        let got: Vec<&str> = p.dispatches.iter().map(|d| d.class.name()).collect();
        if got != want {
            return Err(format!("{name}: classes {got:?}, the file states {want:?}:\n{text}"));
        }
        for d in &p.dispatches {
            let fresh = classify(&d.kernel);
            if fresh != d.class {
                return Err(format!("{name}: {} carries class {} but is of class {fresh}", d.kernel.name, d.class));
            }
        }
    }
    Ok(())
}

#[test]
fn filetests() {
    kiln_filetest::run(&kiln_filetest::dir(env!("CARGO_MANIFEST_DIR")), "kir", check);
}
