//! Replays the `load_artifact` fuzz corpus (`fuzz/corpus/load_artifact`) and fuzzes
//! further with seeded mutations on stable: section decoding and load-time verification
//! return Ok or a typed error for any bytes, never panic. Mutations work at three
//! levels: bytes of one section (the container rebuilt around it, so checksums pass),
//! the container's header and table (resealed), and fields of a `Program` (re-encoded),
//! where an independent check confirms that whatever verifies has every binding inside
//! its slot. `KILN_BLESS=1` rewrites the seed files.

mod common;

use common::*;
use kiln_filetest::fuzz::{mutation_rounds, XorShift as Rng};
use kiln_module::abi::ABI_VERSION;
use kiln_module::program::*;
use kiln_module::sections::{read_program, write_program, ConstantsView, ProgramView};
use kiln_module::{ModuleWriter, SectionKind};
use kiln_runtime::{Module, RuntimeError};
use std::path::PathBuf;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/load_artifact")
}

fn seed_programs() -> Vec<(&'static str, Program)> {
    let mut variants = add_program(4);
    // Format 1.5's conditions: a CPU level with its own workgroup count, and on CUDA
    // an sm_90a cubin before an sm_80 PTX.
    variants.kernels[1].variants.insert(
        0,
        Variant { executable: 0, entry: 1, condition: Condition::CpuFeatures(CpuFeature::LEVELS[3]), workgroups: 2 },
    );
    let mut cuda_variants = cuda_add_program();
    let mut cubin = cuda_executable(3);
    cubin.features = CUDA_CUBIN_SM90A;
    cuda_variants.executables.push(cubin);
    for k in &mut cuda_variants.kernels {
        let entry = k.variants[0].entry;
        k.variants = vec![
            Variant { executable: 1, entry, condition: Condition::Cuda(CudaArch::SM90A), workgroups: 0 },
            Variant { executable: 0, entry, condition: Condition::Cuda(CudaArch::SM80), workgroups: 0 },
        ];
    }
    // Format 1.9: the leading fill is an instantiation prologue.
    let mut prologue = add_program(4);
    prologue.entries[0].prologue = 1;
    vec![
        ("add.kiln", add_program(4)),
        ("misc_embedded.kiln", misc_program(false).0),
        ("misc_external.kiln", misc_program(true).0),
        ("relocs.kiln", reloc_program()),
        ("variants.kiln", variants),
        ("cuda.kiln", cuda_add_program()),
        ("cuda_variants.kiln", cuda_variants),
        ("collectives.kiln", collectives_program(4)),
        ("skip.kiln", skip_program(4)),
        ("extents.kiln", extent_program(4, 3)),
        ("prologue.kiln", prologue),
    ]
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    seed_programs().into_iter().map(|(n, p)| (n, write_program(&p))).collect()
}

/// The property: decode and verify without panicking; messages are one line. A plan
/// for CUDA verifies with `verify_plan` (the CPU runtime refuses it at bind); one for
/// the CPU binds too.
fn check(data: &[u8]) -> Result<bool, String> {
    kiln_filetest::fuzz::catch(|| {
        if let Ok(m) = kiln_module::Module::parse(data) {
            if let Err(e) = read_program(&m) {
                assert!(!e.to_string().contains('\n'));
            }
        }
        let plan = match Module::verify_plan(data) {
            Ok(plan) => plan,
            Err(e) => {
                assert!(!e.to_string().contains('\n'));
                return false;
            }
        };
        assert_bindings_inside(&plan.program);
        assert_launches_sound(&plan.program);
        assert_prologue_sound(&plan.program);
        if kiln_runtime::verify::require_device_kind(&plan.program, DeviceKind::Cuda).is_ok()
            && plan.program.entries.iter().any(|e| e.commands.iter().any(|c| matches!(c, Command::Dispatch { .. })))
        {
            return true;
        }
        // And for an x86-64-v3 host: every variant taken needs no more than it has.
        let v3 = CpuFeature::LEVELS[2];
        if let Ok(v) = Module::verify(data, None, v3) {
            for (k, &i) in v.program().kernels.iter().zip(v.variants()) {
                let needs = kiln_runtime::verify::cpu_needs(v.program(), &k.variants[i]).expect("a CPU variant");
                assert_eq!(needs & !v3, 0, "a variant that needs more than the host has was taken");
            }
        }
        match Module::verify(data, None, u64::MAX) {
            Ok(v) => {
                assert_bindings_inside(v.program());
                true
            }
            Err(e) => {
                assert!(!e.to_string().contains('\n'));
                // A module that only lacks its weights file verified everything else.
                matches!(e, RuntimeError::WeightsMissing { .. })
            }
        }
    })
}

/// Independent of the verifier: every CUDA executable has one launch per entry within
/// the device's limits, a CPU one none, and every CUDA dispatch's variants take as many
/// parameters as it has bindings.
fn assert_launches_sound(p: &ProgramView<'_>) {
    for x in &p.executables {
        match x.device {
            DeviceKind::Cpu => assert!(x.launches.is_empty()),
            DeviceKind::Cuda => {
                assert_eq!(x.launches.len(), x.entries.len());
                for l in &x.launches {
                    assert!(l.block >= 32 && l.block <= 1024 && l.block % 32 == 0 && l.shared <= 227 * 1024, "{l:?}");
                }
            }
        }
    }
    for e in &p.entries {
        for c in &e.commands {
            let Command::Dispatch { kernel, device, bindings, .. } = c else { continue };
            if p.devices[*device as usize].kind != DeviceKind::Cuda {
                continue;
            }
            for v in &p.kernels[*kernel as usize].variants {
                let x = &p.executables[v.executable as usize];
                if x.device == DeviceKind::Cuda {
                    assert_eq!(x.launches[v.entry as usize].params as usize, bindings.len());
                }
            }
        }
    }
}

/// Independent of the verifier: an entry's prologue lies within its plan, and its
/// commands (dispatches, copies, fills, barriers) bind no input or output.
fn assert_prologue_sound(p: &ProgramView<'_>) {
    for e in &p.entries {
        let n = e.prologue as usize;
        assert!(n <= e.commands.len());
        for c in &e.commands[..n] {
            let bindings: Vec<&Binding> = match c {
                Command::Dispatch { bindings, .. } => bindings.iter().collect(),
                Command::Copy { src, dst } => vec![src, dst],
                Command::Fill { dst, .. } => vec![dst],
                Command::Barrier => vec![],
                other => panic!("a {other:?} in a prologue verified"),
            };
            assert!(bindings.iter().all(|b| matches!(b.slot, Slot::Arena | Slot::Constants)), "{c:?}");
        }
    }
}

/// Independent of the verifier: every binding of every command lies inside its slot and
/// writes go to the arena or an output (u128 arithmetic, no shortcuts).
fn assert_bindings_inside(p: &ProgramView<'_>) {
    let pool = match p.constants {
        ConstantsView::Embedded(b) => b.len() as u128,
        ConstantsView::External { size, .. } => size as u128,
    };
    for e in &p.entries {
        let size = |s: Slot| -> u128 {
            match s {
                Slot::Arena => e.arena_size as u128,
                Slot::Constants => pool,
                Slot::Input(i) => e.inputs[i as usize].bytes as u128,
                Slot::Output(i) => e.outputs[i as usize].bytes as u128,
            }
        };
        let inside =
            |b: &Binding| assert!(b.offset as u128 + b.length as u128 <= size(b.slot), "{b:?} escapes its slot");
        let writable =
            |b: &Binding| assert!(matches!(b.slot, Slot::Arena | Slot::Output(_)), "{b:?} writes a read-only slot");
        // Extents: 8 arena bytes each; every output they size has the bound there.
        for x in &e.extents {
            inside(&x.binding);
            assert!(x.binding.slot == Slot::Arena && x.binding.length == 8, "{x:?}");
            for &(o, axis) in &x.outputs {
                assert_eq!(e.outputs[o as usize].dims[axis as usize], x.bound, "{x:?}");
            }
        }
        for (i, c) in e.commands.iter().enumerate() {
            match c {
                Command::SkipIf { cond, count, .. } => {
                    inside(cond);
                    assert!((1..=MAX_CONDITION_BYTES).contains(&cond.length), "{cond:?}: condition bytes");
                    assert!(i + 1 + *count as usize <= e.commands.len(), "skip {count} past the end");
                }
                Command::Dispatch { kernel, bindings, .. } => {
                    assert!((*kernel as usize) < p.kernels.len());
                    bindings.iter().for_each(inside);
                    if let Some(last) = bindings.last() {
                        writable(last);
                    }
                }
                Command::Barrier | Command::Segment { .. } => {}
                // (A transfer's ranges are in its devices' arenas: checked by the verifier.)
                Command::Transfer { src, dst, .. } => assert_eq!(src.length, dst.length),
                Command::Copy { src, dst } => {
                    inside(src);
                    inside(dst);
                    writable(dst);
                    assert_eq!(src.length, dst.length);
                }
                Command::Fill { dst, pattern_len, .. } => {
                    inside(dst);
                    writable(dst);
                    assert!([1, 2, 4, 8].contains(pattern_len));
                }
                Command::AllReduce { parts, .. } | Command::AllGather { parts, .. } => {
                    assert!(parts.len() >= 2);
                    for x in parts {
                        assert!((x.device as usize) < p.devices.len());
                        inside(&x.src);
                        inside(&x.dst);
                        writable(&x.dst);
                    }
                }
            }
        }
    }
}

#[test]
fn corpus_replays() {
    kiln_filetest::fuzz::replay_corpus(&dir(), &seeds(), "the loader", check);
}

fn sections_of(file: &[u8]) -> Vec<(SectionKind, u32, Vec<u8>)> {
    let m = kiln_module::Module::parse(file).expect("seed parses");
    m.sections().map(|s| (s.kind, s.align, s.bytes.to_vec())).collect()
}

fn rebuild(sections: &[(SectionKind, u32, Vec<u8>)]) -> Vec<u8> {
    let mut w = ModuleWriter::new(ABI_VERSION);
    for (k, a, b) in sections {
        w.add(*k, *a, b.clone()).expect("add");
    }
    w.finish()
}

const HUGE_VARINTS: [&[u8]; 4] = [
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], // u64::MAX
    &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], // 71 bits
    &[0x80, 0x80, 0x80, 0x80, 0x10],                               // 2^32
    &[0x80, 0x00],                                                 // not minimal
];

fn mutate_bytes(r: &mut Rng, d: &mut Vec<u8>) {
    match r.next() % 7 {
        0 if !d.is_empty() => {
            let i = r.below(d.len());
            d[i] ^= 1 << (r.next() % 8);
        }
        1 if !d.is_empty() => {
            let i = r.below(d.len());
            d[i] = [0, 0xff, 0x80, 0x7f, 1, 2, 3][r.below(7)];
        }
        2 => d.truncate(r.below(d.len() + 1)),
        3 => {
            let i = r.below(d.len() + 1);
            let v = HUGE_VARINTS[r.below(HUGE_VARINTS.len())];
            if r.next().is_multiple_of(2) {
                d.splice(i..i, v.iter().copied());
            } else {
                let end = (i + v.len()).min(d.len());
                d.splice(i..end, v.iter().copied());
            }
        }
        4 if !d.is_empty() => {
            // Repeat a range in place (overlapping copies of lists and strings).
            let i = r.below(d.len());
            let j = i + r.below(d.len() - i) + 1;
            let piece = d[i..j].to_vec();
            d.splice(i..i, piece);
        }
        5 if !d.is_empty() => {
            let i = r.below(d.len());
            let j = i + r.below((d.len() - i).min(16)) + 1;
            d.drain(i..j);
        }
        _ => d.push(r.next() as u8),
    }
}

/// The names of `seeds`.
fn names<T>(seeds: &[(&'static str, T)]) -> Vec<&'static str> {
    seeds.iter().map(|(n, _)| *n).collect()
}

#[test]
fn section_mutations_never_panic() {
    let mut r = Rng(0x9E37_79B9_7F4A_7C15);
    let seeds = seeds();
    let bases: Vec<_> = seeds.iter().map(|(_, seed)| sections_of(seed)).collect();
    let mutant = |i: usize, _| {
        let mut s = bases[i].clone();
        for _ in 0..1 + r.below(3) {
            let k = r.below(s.len());
            mutate_bytes(&mut r, &mut s[k].2);
        }
        if r.next().is_multiple_of(16) {
            // Drop a section, or add a constants section next to external weights.
            if r.next().is_multiple_of(2) {
                let k = r.below(s.len());
                s.remove(k);
            } else if !s.iter().any(|x| x.0 == SectionKind::Constants) {
                s.push((SectionKind::Constants, 64, vec![0; 64]));
            }
        }
        rebuild(&s)
    };
    let (accepted, total) = mutation_rounds(&names(&seeds), 1200, "the loader (section mutation)", mutant, check);
    let rejected = total - accepted;
    assert!(rejected > total / 2, "most mutations should be rejected ({rejected} of {total})");
}

#[test]
fn container_mutations_never_panic() {
    let mut r = Rng(0x2545_F491_4F6C_DD1D);
    let seeds = seeds();
    let mutant = |i: usize, _| {
        let seed = &seeds[i].1;
        let n = sections_of(seed).len();
        let mut d = seed.clone();
        let e = 64 + 32 * r.below(n);
        match r.next() % 5 {
            0 => {
                // Point one section at another's offset: overlapping ranges.
                let other = 64 + 32 * r.below(n);
                let off: [u8; 8] = d[other + 8..other + 16].try_into().expect("8 bytes");
                d[e + 8..e + 16].copy_from_slice(&off);
            }
            1 => {
                let v = [u64::MAX, u64::MAX / 2, 1 << 32, 0, d.len() as u64][r.below(5)];
                let f = [8, 16][r.below(2)];
                d[e + f..e + f + 8].copy_from_slice(&v.to_le_bytes());
            }
            2 => {
                // Change a section's kind (duplicates, unknown kinds, swapped roles).
                d[e..e + 4].copy_from_slice(&(r.below(8) as u32).to_le_bytes());
            }
            3 => d.truncate(r.below(d.len() + 1)),
            _ => {
                let i = r.below(d.len());
                d[i] ^= 1 << (r.next() % 8);
            }
        }
        kiln_module::reseal::reseal(&mut d);
        d
    };
    mutation_rounds(&names(&seeds), 400, "the loader (container mutation)", mutant, check);
}

fn edge(r: &mut Rng, size: u64) -> u64 {
    [0, 1, size.saturating_sub(1), size, size.saturating_add(1), u64::MAX, u64::MAX - 3, r.next() % 256][r.below(8)]
}

fn mutate_program(r: &mut Rng, p: &mut Program) {
    let ne = p.entries.len();
    let e = &mut p.entries[r.below(ne)];
    let arena = e.arena_size;
    let (ni, no) = (e.inputs.len() as u32, e.outputs.len() as u32);
    let nc = e.commands.len();
    match r.next() % 14 {
        0..=4 if nc > 0 => {
            let slot = |r: &mut Rng| match r.next() % 4 {
                0 => Slot::Arena,
                1 => Slot::Constants,
                2 => Slot::Input(r.below(ni as usize + 2) as u32),
                _ => Slot::Output(r.below(no as usize + 2) as u32),
            };
            let c = &mut e.commands[r.below(nc)];
            let bs: Vec<&mut Binding> = match c {
                Command::Dispatch { bindings, .. } => bindings.iter_mut().collect(),
                Command::Copy { src, dst } => vec![src, dst],
                Command::Fill { dst, .. } => vec![dst],
                Command::AllReduce { parts, .. } | Command::AllGather { parts, .. } => {
                    parts.iter_mut().flat_map(|x| [&mut x.src, &mut x.dst]).collect()
                }
                Command::SkipIf { cond, .. } => vec![cond],
                Command::Transfer { src, dst, .. } => vec![src, dst],
                Command::Barrier | Command::Segment { .. } => vec![],
            };
            let n = bs.len();
            if let Some(b) = bs.into_iter().nth(r.below(n)) {
                match r.next() % 3 {
                    0 => b.offset = edge(r, arena),
                    1 => b.length = edge(r, arena),
                    _ => b.slot = slot(r),
                }
            }
        }
        5 if nc > 0 => match &mut e.commands[r.below(nc)] {
            Command::Dispatch { kernel, device, workgroups, push_constants, .. } => match r.next() % 4 {
                0 => *kernel = r.below(5) as u32,
                1 => *device = r.below(3) as u32,
                2 => *workgroups = u64::MAX,
                _ => push_constants.push(0),
            },
            Command::Fill { pattern_len, .. } => *pattern_len = r.next() as u8,
            Command::Copy { dst, .. } => dst.length = dst.length.wrapping_add(1),
            Command::AllReduce { dtype, parts } => match r.next() % 3 {
                0 => *dtype = r.below(20) as u32,
                1 => parts.truncate(r.below(parts.len() + 1)),
                _ => {
                    if let Some(x) = parts.last_mut() {
                        x.device = r.below(5) as u32;
                    }
                }
            },
            Command::AllGather { outer, parts } => match r.next() % 3 {
                0 => *outer = edge(r, *outer),
                1 => parts.truncate(r.below(parts.len() + 1)),
                _ => {
                    if let Some(x) = parts.first_mut() {
                        x.device = r.below(5) as u32;
                    }
                }
            },
            Command::SkipIf { count, value, .. } => match r.next() % 3 {
                0 => *count = count.wrapping_add(1),
                1 => *count = u32::MAX,
                _ => *value = !*value,
            },
            Command::Segment { count, waits, .. } => match r.next() % 3 {
                0 => *count = count.wrapping_add(1),
                1 => waits.push(u32::MAX),
                _ => *count = 0,
            },
            Command::Transfer { src_device, dst_device, .. } => match r.next() % 2 {
                0 => *src_device = src_device.wrapping_add(1),
                _ => *dst_device = *src_device,
            },
            Command::Barrier => {}
        },
        6 => e.arena_size = edge(r, arena),
        7 => e.arena_align = [0, 1, 3, 64, 4096, 8192, 1 << 63][r.below(7)],
        8 if ni > 0 => {
            let t = &mut e.inputs[r.below(ni as usize)];
            match r.next() % 3 {
                0 => t.bytes = edge(r, t.bytes),
                1 => t.dims.push(r.below(3) as u64),
                _ => t.dtype = r.below(26) as u32,
            }
        }
        9 => {
            let nk = p.kernels.len();
            if nk > 0 {
                let k = &mut p.kernels[r.below(nk)];
                match k.variants.first_mut() {
                    Some(v) if r.next().is_multiple_of(2) => v.entry = r.below(5) as u32,
                    Some(v) => v.executable = r.below(3) as u32,
                    None => {}
                }
            }
        }
        10 => {
            let x = &mut p.executables[0];
            let len = x.code.len() as u64;
            match r.next() % 3 {
                0 => x.entries[0].1 = edge(r, len),
                1 => x.relocs.push(Reloc {
                    offset: edge(r, len),
                    kind: RelocKind::Abs64,
                    target: edge(r, len),
                    addend: 0,
                }),
                _ => x.code.truncate(r.below(x.code.len() + 1)),
            }
        }
        11 => match e.extents.first_mut() {
            Some(x) => match r.next() % 5 {
                0 => x.binding.offset = edge(r, arena),
                1 => x.binding.length = [0, 4, 8, 9, u64::MAX][r.below(5)],
                2 => x.bound = edge(r, x.bound),
                3 => x.outputs.push((r.below(no as usize + 2) as u32, r.below(3) as u32)),
                _ => x.binding.slot = Slot::Output(0),
            },
            None => e.extents.push(ExtentDesc {
                name: "e".into(),
                binding: Binding { slot: Slot::Arena, offset: edge(r, arena), length: 8 },
                bound: r.below(6) as u64,
                outputs: vec![(r.below(no as usize + 1) as u32, r.below(2) as u32)],
            }),
        },
        13 => e.prologue = [0, 1, nc as u32 / 2, nc as u32, nc as u32 + 1, u32::MAX][r.below(6)],
        12 => {
            let nx = p.executables.len();
            let x = &mut p.executables[r.below(nx)];
            let nl = x.launches.len();
            match r.next() % 5 {
                0 if nl > 0 => x.launches[r.below(nl)].block = [0, 16, 32, 48, 1024, 1056, u32::MAX][r.below(7)],
                1 if nl > 0 => {
                    x.launches[r.below(nl)].shared = [0, 48 << 10, 227 << 10, (227 << 10) + 1, u32::MAX][r.below(5)]
                }
                2 if nl > 0 => x.launches[r.below(nl)].params = r.below(5) as u32,
                3 => {
                    x.launches.pop();
                }
                _ => x.launches.push(Launch { block: 32, shared: 0, params: 3 }),
            }
        }
        _ => {
            if let Constants::Embedded(c) = &mut p.constants {
                c.truncate(r.below(c.len() + 1));
            }
        }
    }
}

#[test]
fn program_mutations_never_panic_and_what_verifies_is_in_bounds() {
    let mut r = Rng(0xD1B5_4A32_D192_ED03);
    let seeds = seed_programs();
    let mutant = |i: usize, _| {
        let mut p = seeds[i].1.clone();
        for _ in 0..1 + r.below(2) {
            mutate_program(&mut r, &mut p);
        }
        write_program(&p)
    };
    let (accepted, total) = mutation_rounds(&names(&seeds), 600, "the loader (program mutation)", mutant, check);
    // Both outcomes occur: the mutations probe the boundary.
    assert!(accepted > 0 && accepted < total, "{accepted} of {total} accepted");
}
