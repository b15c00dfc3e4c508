//! An ELF object, as written by `cranelift-object`, read back into one relocatable
//! image: its code and read-only data sections laid out in one byte vector (each at
//! its alignment), entry points and relocations as offsets into that vector.

use kiln_module::program::{CpuArch, DeviceKind, Executable, Reloc, RelocKind};
use object::elf;
use object::{Object, ObjectSection, ObjectSymbol, RelocationFlags, RelocationTarget, SectionIndex, SectionKind};

use crate::CodegenError;

fn internal(what: impl Into<String>) -> CodegenError {
    CodegenError::Internal { kernel: String::new(), what: what.into() }
}

/// The relocation kind of an ELF relocation type of `arch`'s objects; `Ok(None)` for a
/// marker that patches nothing (RISC-V's `R_RISCV_RELAX`).
fn reloc_kind(arch: CpuArch, r_type: u32) -> Result<Option<RelocKind>, CodegenError> {
    Ok(Some(match (arch, r_type) {
        (CpuArch::X86_64, elf::R_X86_64_PC32 | elf::R_X86_64_PLT32) => RelocKind::Pc32,
        (CpuArch::X86_64, elf::R_X86_64_64) => RelocKind::Abs64,
        (CpuArch::Aarch64, elf::R_AARCH64_ABS64) => RelocKind::Abs64,
        (CpuArch::Aarch64, elf::R_AARCH64_CALL26 | elf::R_AARCH64_JUMP26) => RelocKind::Aarch64Call26,
        (CpuArch::Aarch64, elf::R_AARCH64_ADR_PREL_PG_HI21) => RelocKind::Aarch64AdrPrelPgHi21,
        (CpuArch::Aarch64, elf::R_AARCH64_ADD_ABS_LO12_NC) => RelocKind::Aarch64AddAbsLo12Nc,
        (CpuArch::Riscv64, elf::R_RISCV_64) => RelocKind::Abs64,
        (CpuArch::Riscv64, elf::R_RISCV_CALL_PLT | elf::R_RISCV_CALL) => RelocKind::RiscvCallPlt,
        (CpuArch::Riscv64, elf::R_RISCV_PCREL_HI20) => RelocKind::RiscvPcrelHi20,
        (CpuArch::Riscv64, elf::R_RISCV_PCREL_LO12_I) => RelocKind::RiscvPcrelLo12I,
        (CpuArch::Riscv64, elf::R_RISCV_RELAX) => return Ok(None),
        (arch, t) => return Err(internal(format!("unsupported {} relocation type {t}", arch.name()))),
    }))
}

/// Builds the [`Executable`] of an object for `arch` whose functions are `names`, in
/// order.
pub(crate) fn from_object(
    bytes: &[u8],
    names: &[&str],
    features: u64,
    arch: CpuArch,
) -> Result<Executable, CodegenError> {
    let file = object::File::parse(bytes).map_err(|e| internal(format!("reading the object: {e}")))?;
    let machine = match arch {
        CpuArch::X86_64 => object::Architecture::X86_64,
        CpuArch::Aarch64 => object::Architecture::Aarch64,
        CpuArch::Riscv64 => object::Architecture::Riscv64,
    };
    if file.architecture() != machine {
        return Err(internal(format!("the object is for {:?}, not {}", file.architecture(), arch.name())));
    }
    let mut code: Vec<u8> = Vec::new();
    let mut bases: Vec<(SectionIndex, u64)> = Vec::new();
    for s in file.sections() {
        match s.kind() {
            SectionKind::Text
            | SectionKind::ReadOnlyData
            | SectionKind::ReadOnlyString
            | SectionKind::ReadOnlyDataWithRel => {}
            SectionKind::Data | SectionKind::UninitializedData | SectionKind::Tls | SectionKind::UninitializedTls => {
                if s.size() > 0 {
                    return Err(internal(format!("the object has writable data ({})", s.name().unwrap_or("?"))));
                }
                continue;
            }
            _ => continue,
        }
        let data = s.data().map_err(|e| internal(format!("section data: {e}")))?;
        let align = s.align().max(1) as usize;
        let at = code.len().div_ceil(align) * align;
        code.resize(at, 0);
        code.extend_from_slice(data);
        bases.push((s.index(), at as u64));
    }
    let base_of = |i: SectionIndex| bases.iter().find(|b| b.0 == i).map(|b| b.1);
    let symbol_offset = |sym: &object::Symbol<'_, '_>| -> Result<u64, CodegenError> {
        let name = sym.name().unwrap_or("?");
        let sec =
            sym.section_index().ok_or_else(|| internal(format!("the code refers to the undefined symbol {name:?}")))?;
        let base = base_of(sec).ok_or_else(|| internal(format!("symbol {name:?} lies in a section not loaded")))?;
        Ok(base + sym.address())
    };
    let mut entries = Vec::with_capacity(names.len());
    for &name in names {
        let sym = file
            .symbols()
            .find(|s| s.name() == Ok(name))
            .ok_or_else(|| internal(format!("no symbol for kernel {name}")))?;
        entries.push((name.to_string(), symbol_offset(&sym)?));
    }
    let mut relocs = Vec::new();
    for s in file.sections() {
        let Some(base) = base_of(s.index()) else { continue };
        for (offset, r) in s.relocations() {
            let kind = match r.flags() {
                RelocationFlags::Elf { r_type } => match reloc_kind(arch, r_type)? {
                    Some(kind) => kind,
                    None => continue,
                },
                f => return Err(internal(format!("unsupported relocation {f:?}"))),
            };
            let target = match r.target() {
                RelocationTarget::Symbol(i) => {
                    let sym = file.symbol_by_index(i).map_err(|e| internal(format!("relocation symbol: {e}")))?;
                    symbol_offset(&sym)?
                }
                RelocationTarget::Section(i) => {
                    base_of(i).ok_or_else(|| internal("relocation against a section not loaded"))?
                }
                t => return Err(internal(format!("unsupported relocation target {t:?}"))),
            };
            relocs.push(Reloc { offset: base + offset, kind, target, addend: r.addend() });
        }
    }
    Ok(Executable { device: DeviceKind::Cpu, features, code, entries, relocs, launches: Vec::new() })
}
