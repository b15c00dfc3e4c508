//! Stream-level filetests: each `tests/filetests/NAME.kir` is a tensor-level graph in
//! kiln-ir's text form; one [`Compilation`] runs it through every stage up to
//! [`Stage::Schedule`] (tensor passes, dispatch formation, weight packing), and the
//! plan's text ([`kiln_compiler::stream::print`]) must equal `NAME.stream`; the same
//! compilation then runs on to the artifact, so the plan pinned is the plan shipped.
//! The target is fixed (x86-64-v3) so that weight packing, and with it the plan, does
//! not depend on the machine. `KILN_BLESS=1` rewrites the expectations (review the
//! diff: they pin waves, barriers and the memory plan).
//!
//! Independently of the expectations, every plan must
//! - put each dispatch in a later wave than every dispatch it reads from;
//! - give buffers whose live ranges share a wave disjoint arena bytes, every offset
//!   64-byte aligned and inside the arena, and an arena no smaller than the lower
//!   bound (the largest set of arena buffers live in one wave);
//! - place constants at 64-byte aligned offsets of the pool;
//! - place a buffer inside another only within its bytes, in the arena or a graph
//!   output (an in-place scatter's input);
//! - run no code for an in-place concatenation (in no wave), whose pieces tile its
//!   result exactly, with readers after every piece's producer and every buffer a
//!   dispatch touches live (its own range, or its concatenation's) in that dispatch's
//!   wave;
//! - hold in its instantiation prologue (the first waves, run once per instance) only
//!   unguarded dispatches that write no graph output and read only constants and
//!   results of the prologue, and keep every prologue result a later wave reads live
//!   to the last wave (no later buffer shares its bytes);
//! - meet the `// waves: N` its `.kir` file states;
//! - and, compiled to an artifact, loaded and run, compute what kiln-ref computes on
//!   seeded inputs (within 1e-5 relative + 1e-6 absolute) on a second call, after one
//!   on inputs of zeros (the second starts behind the prologue).

use kiln_compiler::stream::{self, Placement, StreamPlan, ALIGN};
use kiln_compiler::{Compilation, CpuTarget, Input, Options, Stage};
use kiln_flow::program::{BufferId, BufferKind, FlowProgram};
use kiln_ir::{DType, Graph, Tensor};

fn inputs(g: &Graph) -> Vec<Tensor> {
    kiln_filetest::seeded_inputs(g, 0x2545_F491_4F6C_DD1D, |_, x| kiln_filetest::unit(x))
}

/// The plan's invariants (see the module docs).
fn check_plan(p: &FlowProgram, plan: &StreamPlan) -> Result<(), String> {
    let producers = p.producers();
    let mut wave_of = vec![usize::MAX; p.dispatches.len()];
    for (w, wave) in plan.waves.iter().enumerate() {
        for &d in wave {
            wave_of[d] = w;
        }
    }
    // The pieces of each in-place concatenation's result, and where each buffer's bytes
    // are kept alive (a piece: by its concatenation's result).
    let mut pieces: Vec<Vec<usize>> = vec![Vec::new(); p.buffers.len()];
    let mut home: Vec<usize> = (0..p.buffers.len()).collect();
    for (i, pl) in plan.placement.iter().enumerate() {
        if let Placement::Within(c, o) = *pl {
            let (size, csize) = (stream::bytes(p, BufferId(i as u32)), stream::bytes(p, c));
            // (An in-place scatter's input may live in a graph output's bytes.)
            if o + size > csize || !matches!(plan.placement[c.index()], Placement::Arena(_) | Placement::Output(_)) {
                return Err(format!("%{i}: in %{} at [{o}, {}), outside it or not in the arena", c.0, o + size));
            }
            pieces[c.index()].push(i);
            home[i] = c.index();
        }
    }
    for (d, disp) in p.dispatches.iter().enumerate() {
        let elided = plan.elided.contains(&d);
        if elided != (wave_of[d] == usize::MAX) {
            return Err(format!("dispatch {d}: elided {elided}, but in wave {}", wave_of[d]));
        }
        if elided {
            // Its pieces cover its result exactly, each written by its own producer.
            let c = p.storage(disp.result).index();
            let mut ranges: Vec<(u64, u64)> = pieces[c]
                .iter()
                .map(|&i| match plan.placement[i] {
                    Placement::Within(_, o) => (o, o + stream::bytes(p, BufferId(i as u32))),
                    _ => (0, 0),
                })
                .collect();
            ranges.sort_unstable();
            let mut at = 0;
            for (lo, hi) in ranges {
                if lo != at {
                    return Err(format!("dispatch {d}: its pieces leave a gap or overlap at byte {at}"));
                }
                at = hi;
            }
            if at != stream::bytes(p, disp.result) || pieces[c].iter().any(|&i| producers[i].is_none()) {
                return Err(format!("dispatch {d}: its pieces do not cover its result"));
            }
            continue;
        }
        for &o in &disp.operands {
            let s = p.storage(o).index();
            let writers: Vec<usize> = match producers[s] {
                Some(pd) if plan.elided.contains(&pd) => pieces[s].iter().filter_map(|&i| producers[i]).collect(),
                Some(pd) => vec![pd],
                None => Vec::new(),
            };
            for pd in writers {
                if wave_of[pd] >= wave_of[d] {
                    return Err(format!(
                        "dispatch {d} (wave {}) reads dispatch {pd} (wave {})",
                        wave_of[d], wave_of[pd]
                    ));
                }
            }
        }
        // Every buffer it touches is live (in its home's range) in its wave.
        for &b in disp.operands.iter().chain([&disp.result]) {
            let h = home[p.storage(b).index()];
            if let (Placement::Arena(_), Some((a, z))) = (plan.placement[h], plan.lifetimes[h]) {
                if wave_of[d] < a || wave_of[d] > z {
                    return Err(format!("dispatch {d} (wave {}) touches %{h}, live waves {a}..{z}", wave_of[d]));
                }
            }
        }
    }
    let mut arena = Vec::new();
    for (i, pl) in plan.placement.iter().enumerate() {
        let size = stream::bytes(p, BufferId(i as u32));
        match *pl {
            Placement::Arena(o) => {
                if o % ALIGN != 0 || o + size > plan.arena_size {
                    return Err(format!(
                        "%{i}: arena [{o}, {}) misaligned or past the arena ({})",
                        o + size,
                        plan.arena_size
                    ));
                }
                let (a, z) = plan.lifetimes[i].ok_or(format!("%{i}: in the arena without a lifetime"))?;
                arena.push((i, o, o + size, a, z));
            }
            Placement::Constant(o) => {
                if o % ALIGN != 0 || (o + size) as usize > plan.constants.len() {
                    return Err(format!("%{i}: constant at {o} misaligned or past the pool"));
                }
                if let BufferKind::Const(t) = &p.buffers[i].kind {
                    if plan.constants[o as usize..(o + size) as usize] != t.bytes()[..] {
                        return Err(format!("%{i}: the pool does not hold the constant's bytes"));
                    }
                }
            }
            _ => {}
        }
    }
    for (x, &(i, lo, hi, a, z)) in arena.iter().enumerate() {
        for &(j, lo2, hi2, a2, z2) in &arena[x + 1..] {
            if a <= z2 && a2 <= z && lo < hi2 && lo2 < hi && hi > lo && hi2 > lo2 {
                return Err(format!("%{i} and %{j} are live together and overlap in the arena"));
            }
        }
    }
    // The instantiation prologue.
    let last = plan.waves.len().saturating_sub(1);
    let outputs: Vec<usize> = p.outputs.iter().map(|&o| p.storage(o).index()).collect();
    // The dispatches that write a buffer's bytes (an elided concatenation's: its pieces').
    let writers_of = |s: usize| -> Vec<usize> {
        match producers[s] {
            Some(pd) if plan.elided.contains(&pd) => pieces[s].iter().filter_map(|&i| producers[i]).collect(),
            Some(pd) => vec![pd],
            None => p
                .dispatches
                .iter()
                .enumerate()
                .filter(|(_, d)| p.storage(d.result).index() == s)
                .map(|(i, _)| i)
                .collect(),
        }
    };
    for (d, disp) in p.dispatches.iter().enumerate() {
        if wave_of[d] == usize::MAX {
            continue;
        }
        let early = wave_of[d] < plan.prologue;
        if early && (!disp.guard.is_empty() || outputs.contains(&p.storage(disp.result).index())) {
            return Err(format!("dispatch {d} in the prologue is guarded or writes an output"));
        }
        for &o in &disp.operands {
            let s = p.storage(o).index();
            let from_prologue = writers_of(s).iter().any(|&w| wave_of[w] < plan.prologue);
            match (&p.buffers[s].kind, early) {
                (BufferKind::Const(_), _) => {}
                (BufferKind::Input(_), true) => return Err(format!("dispatch {d} in the prologue reads input %{s}")),
                (_, true) if !writers_of(s).iter().all(|&w| wave_of[w] < plan.prologue) => {
                    return Err(format!("dispatch {d} in the prologue reads %{s}, written after it"))
                }
                (_, false) if from_prologue => {
                    let h = home[s];
                    if plan.lifetimes[h].is_some_and(|(_, z)| z != last) {
                        return Err(format!(
                            "%{s}, from the prologue and read in wave {}, dies before the last wave",
                            wave_of[d]
                        ));
                    }
                }
                _ => {}
            }
        }
    }
    if plan.arena_size < plan.arena_lower_bound {
        return Err(format!("arena {} below the lower bound {}", plan.arena_size, plan.arena_lower_bound));
    }
    Ok(())
}

fn run_compiled(g: &Graph, artifact: &[u8], feeds: &[Tensor]) -> Result<Vec<Tensor>, String> {
    let module = kiln_runtime::Module::load(artifact, None).map_err(|e| e.to_string())?;
    let mut inst = kiln_runtime::Instance::new(&module).map_err(|e| e.to_string())?;
    let ins: Vec<&[u8]> = feeds.iter().map(|t| &t.bytes()[..]).collect();
    let zeros: Vec<Vec<u8>> = feeds.iter().map(|t| vec![0u8; t.bytes().len()]).collect();
    let zs: Vec<&[u8]> = zeros.iter().map(|z| &z[..]).collect();
    let mut outs: Vec<Vec<u8>> = g.outputs.iter().map(|&v| vec![0u8; g.ty(v).storage_bytes()]).collect();
    for call in [&zs, &ins] {
        let mut refs: Vec<&mut [u8]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        inst.invoke(call, &mut refs).map_err(|e| e.to_string())?;
    }
    g.outputs
        .iter()
        .zip(outs)
        .map(|(&v, b)| Tensor::new(g.ty(v).clone(), b.into()).map_err(|e| e.to_string()))
        .collect()
}

/// Plans one file, checks the plan and the compiled artifact's outputs, and returns the
/// plan's text.
fn one(case: &kiln_filetest::Case) -> Result<String, String> {
    let (name, src) = (&case.name, &case.src);
    let g = kiln_ir::text::parse(src).map_err(|e| format!("{name}: {e}"))?;
    let opts = Options { target: CpuTarget::X86_64V3, ..Options::default() };
    let mut c = Compilation::new(Input::Graph(g.clone()), opts);
    c.run_to(Stage::Schedule).map_err(|e| format!("{name}: {e}"))?;
    let (Some(flow), Some(plan)) = (c.flow().cloned(), c.plan().cloned()) else {
        return Err(format!("{name}: no flow program or plan after {}", Stage::Schedule));
    };
    if c.text().as_deref() != Some(&stream::print(&flow, &plan)[..]) {
        return Err(format!("{name}: the compilation's text after {} is not the plan's", Stage::Schedule));
    }
    check_plan(&flow, &plan).map_err(|e| format!("{name}: {e}"))?;
    if let Some(n) = case.count("waves") {
        if plan.waves.len() != n {
            return Err(format!("{name}: {} waves, the file states {n}", plan.waves.len()));
        }
    }
    let feeds = inputs(&g);
    let want = kiln_ref::eval_graph(&g, &feeds).map_err(|e| format!("{name}: reference: {e}"))?;
    let compiled = c.finish().map_err(|e| format!("{name}: {e}"))?;
    if compiled.plan.waves != plan.waves || compiled.plan.constants != plan.constants {
        return Err(format!("{name}: the artifact's plan is not the plan checked"));
    }
    let got = run_compiled(&g, &compiled.artifact, &feeds).map_err(|e| format!("{name}: compiled: {e}"))?;
    for (k, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(b.dtype(), DType::F32);
        for (i, (x, y)) in a.to_f64_vec().iter().zip(b.to_f64_vec()).enumerate() {
            if (x - y).abs() > 1e-5 * y.abs() + 1e-6 {
                return Err(format!("{name}: output {k} element {i}: {x}, the reference gives {y}"));
            }
        }
    }
    Ok(stream::print(&flow, &plan))
}

#[test]
fn filetests() {
    let files = kiln_filetest::run(&kiln_filetest::dir(env!("CARGO_MANIFEST_DIR")), "kir", |c| {
        let text = one(c)?;
        c.expect(&text, "stream")
    });
    assert!(files.len() >= 4, "the stream filetests are missing");
}
