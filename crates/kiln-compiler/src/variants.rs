//! CPU variants: one artifact for several x86-64 levels (`kiln compile --target-cpu
//! x86-64-v3,x86-64-v4`).
//!
//! The plan, the arena and the constant pool are one; only the kernels' code differs
//! per level. Every decision made above code generation is therefore made once, for
//! every level at the same time:
//!
//! - integer contractions become integer ops (`tensor-fold-quantized-contractions`)
//!   only where every level has integer microkernels;
//! - a contraction's constant operand is packed into panels only where every level's
//!   tiles read the same panel width (`kiln_flow::layout::pack_constants` with the
//!   widths the levels agree on; where they disagree the operand stays as it is and
//!   each level's microkernel reads it in place).
//!
//! Code generation then runs once per level over the same flow program. The lowest
//! level (the compilation's [`crate::Options::target`]) is the baseline: executable 0,
//! every kernel, so the artifact runs on any CPU that has it. Each higher level
//! ([`crate::Options::cpu_variants`]) keeps only the kernels whose code differs from the
//! next lower level's kept code (same bytes and workgroup count: the lower variant runs
//! as well on the better CPU, so the copy would be dead weight), and is compiled again
//! over just those kernels into its own executable. A kernel's variants are listed best
//! first, each with the CPU-features condition of its executable and, where its
//! workgroup split differs from the dispatch's (a 512-bit tile covers more rows), its
//! own workgroup count; the runtime takes, once at load, the first whose features the
//! host has (format 1.5, [`kiln_module::program::Condition`]).

use kiln_codegen::cpu::{compile_with, CpuTarget, Options};
use kiln_codegen::{CodegenError, CpuModule};
use kiln_flow::class::KernelClass;
use kiln_flow::layout::PanelWidths;
use kiln_flow::Kernel;
use kiln_module::program::{Condition, Executable, Variant};

/// The code of one higher level: the kernels (flow dispatch indices, in entry order)
/// whose code differs from the level below, compiled for `target`.
#[derive(Debug, Clone)]
pub struct Tier {
    /// The level.
    pub target: CpuTarget,
    /// Dispatch indices whose code this level carries; entry `j` of `module` is
    /// dispatch `kernels[j]`.
    pub kernels: Vec<usize>,
    /// The code.
    pub module: CpuModule,
}

/// The order of the named levels (Host is not one: it cannot be combined).
pub fn level(t: CpuTarget) -> u8 {
    match t {
        CpuTarget::X86_64 => 1,
        CpuTarget::X86_64V2 => 2,
        CpuTarget::X86_64V3 => 3,
        CpuTarget::X86_64V4 => 4,
        // Not levels: the host, and other architectures (one target each).
        CpuTarget::Host | CpuTarget::Aarch64 | CpuTarget::Riscv64 => 0,
    }
}

/// The panel widths every one of `packings` agrees on, operand by operand (none where
/// any two differ).
pub fn agreed_widths(packings: &[kiln_codegen::Packing], k: &Kernel, class: KernelClass) -> PanelWidths {
    let mut ws = packings.iter().map(|p| p.widths(k, class));
    let Some(first) = ws.next() else { return PanelWidths::default() };
    ws.fold(first, |acc, w| PanelWidths {
        a: if acc.a == w.a { acc.a } else { None },
        b: if acc.b == w.b { acc.b } else { None },
    })
}

/// The bytes of entry `i`'s code in `x` (from its offset to the next entry's, or the
/// end), `None` where a relocation patches that range: such code may read data outside
/// it, so equal bytes would not prove equal behaviour.
fn kernel_code(x: &Executable, i: usize) -> Option<&[u8]> {
    let start = x.entries.get(i)?.1;
    let end = x.entries.iter().map(|e| e.1).filter(|&o| o > start).min().unwrap_or(x.code.len() as u64);
    if x.relocs.iter().any(|r| r.offset >= start && r.offset < end) {
        return None;
    }
    x.code.get(start as usize..end as usize)
}

/// Whether kernel `i` compiles to the same thing in `a` and `b`: equal code bytes with
/// no relocation, and the same workgroups.
fn same(a: &CpuModule, ai: usize, b: &CpuModule, bi: usize) -> bool {
    let (ca, cb) = (kernel_code(&a.executable, ai), kernel_code(&b.executable, bi));
    a.workgroups.get(ai) == b.workgroups.get(bi) && ca.is_some() && ca == cb
}

/// Compiles `kernels` for each of `targets` (ascending, above the baseline `base`) and
/// keeps, per level, the kernels whose code differs from the level below's.
pub fn compile_tiers(
    kernels: &[(&Kernel, KernelClass)],
    base: &CpuModule,
    targets: &[CpuTarget],
    options: &Options,
) -> Result<Vec<Tier>, CodegenError> {
    // Per kernel, the module (None: the baseline; Some(t): full[t]) of the last level
    // that keeps it.
    let full: Vec<CpuModule> = targets.iter().map(|t| compile_with(kernels, t, options)).collect::<Result<_, _>>()?;
    let mut last: Vec<Option<usize>> = vec![None; kernels.len()];
    let mut tiers = Vec::new();
    for (ti, m) in full.iter().enumerate() {
        let keep: Vec<usize> = (0..kernels.len())
            .filter(|&i| {
                let below = last[i].map_or(base, |t| &full[t]);
                !same(below, i, m, i)
            })
            .collect();
        for &i in &keep {
            last[i] = Some(ti);
        }
        tiers.push((targets[ti], keep));
    }
    let mut out = Vec::new();
    for (ti, (target, keep)) in tiers.into_iter().enumerate() {
        if keep.is_empty() {
            continue;
        }
        let module = if keep.len() == kernels.len() {
            full[ti].clone()
        } else {
            let subset: Vec<(&Kernel, KernelClass)> = keep.iter().map(|&i| kernels[i]).collect();
            compile_with(&subset, &target, options)?
        };
        out.push(Tier { target, kernels: keep, module });
    }
    Ok(out)
}

/// Kernel `i`'s variants, best first: one per tier that carries it (executable `1 + t`
/// for tier `t`), then the baseline's (executable 0, entry `i`). With no tiers the
/// baseline's variant has no condition beyond its executable's features (what a
/// single-level artifact has always written).
pub fn variants_of(i: usize, base: &CpuModule, tiers: &[Tier]) -> Vec<Variant> {
    let mut v = Vec::with_capacity(tiers.len() + 1);
    for (t, tier) in tiers.iter().enumerate().rev() {
        let Some(entry) = tier.kernels.iter().position(|&k| k == i) else { continue };
        let wg = tier.module.workgroups[entry];
        v.push(Variant {
            executable: 1 + t as u32,
            entry: entry as u32,
            condition: Condition::CpuFeatures(tier.module.executable.features),
            workgroups: if Some(&wg) == base.workgroups.get(i) { 0 } else { wg },
        });
    }
    let condition = if tiers.is_empty() { Condition::Always } else { Condition::CpuFeatures(base.executable.features) };
    v.push(Variant { executable: 0, entry: i as u32, condition, workgroups: 0 });
    v
}
