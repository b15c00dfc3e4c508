//! Every Rows kernel of every model in `ref/manifest.json`, compiled for the CUDA target:
//! each takes the Rows emitter (`kiln_codegen::cuda::rows`), or declines with one of the
//! reasons that emitter states (arg reductions, whose tie and NaN rules depend on the
//! order the positions are visited), and the module assembles for sm_90a with no
//! spills; General kernels it takes (a row per output element) have none either. The list of kernels and notes is printed (`--nocapture`) for the record.
//! A missing model or `ptxas` is a failure, not a skip.

use kiln_compiler::Precision;
use kiln_flow::class::KernelClass;

mod common;
#[path = "../../kiln-codegen/tests/ptxas/mod.rs"]
mod ptxas;

use common::{compile_for_cuda_or_record, listed_models};
use ptxas::assemble_ptx_verbose;

/// Why the Rows emitter may decline a kernel of a real model.
const DEFENSIBLE: [&str; 1] = ["general (an arg reduction"];

#[test]
fn every_rows_kernel_of_every_model_takes_the_rows_emitter() {
    let mut rows = 0;
    let mut failures = Vec::new();
    for e in listed_models("manifest.json") {
        let name = e["name"].as_str().expect("name").to_string();
        let Some(c) = compile_for_cuda_or_record(&e, Precision::F32, &name, &mut failures) else { continue };
        let cuda = c.cuda().expect("a CUDA module");
        let flow = c.flow().expect("flow");
        let usage = match assemble_ptx_verbose("rows-models", &name, cuda.ptx()) {
            Ok(u) => u,
            Err(err) => {
                failures.push(format!("{name}: ptxas: {}", err.lines().take(4).collect::<Vec<_>>().join("\n")));
                continue;
            }
        };
        for (i, d) in flow.dispatches.iter().enumerate() {
            let note = &cuda.notes[i];
            // General kernels the Rows emitter took (reductions of no Rows kernel).
            if d.class == KernelClass::General && note.starts_with("rows (") {
                let u = usage.iter().find(|(n, _)| *n == d.kernel.name).map(|(_, u)| *u).unwrap_or_default();
                println!("{name}: {} (general): {note}: {} registers", d.kernel.name, u.registers);
                if u.spill_stores > 0 || u.spill_loads > 0 || u.stack > 0 {
                    failures.push(format!("{name}: {}: {u:?}", d.kernel.name));
                }
            }
            if d.class != KernelClass::Rows {
                continue;
            }
            rows += 1;
            let u = usage.iter().find(|(n, _)| *n == d.kernel.name).map(|(_, u)| *u).unwrap_or_default();
            let shape = d.kernel.output.shape.dims().to_vec();
            println!(
                "{name}: {} {shape:?}: {note}: {} registers, {} spilled",
                d.kernel.name, u.registers, u.spill_stores
            );
            let taken = note.starts_with("rows (");
            if !taken && !DEFENSIBLE.iter().any(|r| note.starts_with(r)) {
                failures.push(format!("{name}: {}: {note}", d.kernel.name));
            }
            if taken && (u.spill_stores > 0 || u.spill_loads > 0 || u.stack > 0) {
                failures.push(format!("{name}: {}: {u:?}", d.kernel.name));
            }
        }
    }
    assert!(rows > 0, "no Rows kernels in the manifest's models");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}
