//! What a `.kiln` artifact says, as owned data: the compiler builds a [`Program`], the
//! section encoders ([`crate::sections`]) write it into the container, and the runtime
//! reads the same sections back zero-copy.
//!
//! Dtypes are ONNX `TensorProto.DataType` codes (1 = f32, 7 = i64, …) so the artifact is
//! meaningful without kiln's IR crate.

use alloc::string::String;
use alloc::vec::Vec;

/// The devices an artifact runs on; every command and buffer names one by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// What kind of device.
    pub kind: DeviceKind,
    /// A name for listings (`"cpu"`).
    pub name: String,
}

/// Kinds of devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// The host CPU (x86-64).
    Cpu,
    /// An NVIDIA GPU through CUDA: executables hold PTX text (or a cubin, see
    /// [`CUDA_CUBIN_SM90A`]) with one [`Launch`] per entry.
    Cuda,
}

/// One tensor of an entry point's signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorDesc {
    /// Name in the source model.
    pub name: String,
    /// ONNX dtype code.
    pub dtype: u32,
    /// Dimensions.
    pub dims: Vec<u64>,
    /// Bytes the tensor occupies (dense, row-major; 4-bit types packed).
    pub bytes: u64,
}

/// Where a binding's bytes live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The instance's arena.
    Arena,
    /// The constant pool (embedded, or the external weights file).
    Constants,
    /// The caller's input `i`.
    Input(u32),
    /// The caller's output `i`.
    Output(u32),
}

/// A byte range of a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Binding {
    /// The slot.
    pub slot: Slot,
    /// Offset within it.
    pub offset: u64,
    /// Length in bytes.
    pub length: u64,
}

/// One step of an entry point's command list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Runs a kernel over `0..workgroups`.
    Dispatch {
        /// Index into [`Program::kernels`].
        kernel: u32,
        /// Device index.
        device: u32,
        /// Number of workgroups.
        workgroups: u64,
        /// The kernel's bindings: its inputs in order, then its output.
        bindings: Vec<Binding>,
        /// Small constants passed to the kernel (unused by the first kernels; reserved).
        push_constants: Vec<u32>,
        /// The compiler's estimate of the time all workgroups take on one thread, in
        /// nanoseconds (0: no estimate). A driver compares it with what handing work to
        /// other threads costs; it never changes what the dispatch computes.
        work_ns: u64,
    },
    /// Everything before it completes before anything after it starts.
    Barrier,
    /// Copies `src` to `dst` (equal lengths).
    Copy {
        /// Source range.
        src: Binding,
        /// Destination range.
        dst: Binding,
    },
    /// Fills `dst` with a repeated little-endian pattern of `pattern_len` bytes (1, 2, 4 or 8).
    Fill {
        /// Destination range.
        dst: Binding,
        /// The pattern's bits.
        pattern: u64,
        /// Its width in bytes.
        pattern_len: u8,
    },
    /// A collective over several devices of the device table (format 1.4 on): every
    /// part's `dst` receives the elementwise sum of every part's `src`, added in part
    /// order (`((src₀ + src₁) + src₂) + …`, so that every device gets the same bits).
    /// All ranges have one length, a multiple of the element size; no destination
    /// overlaps any source or another destination.
    AllReduce {
        /// The element type (ONNX dtype code; the CPU runtime sums f32).
        dtype: u32,
        /// One per participating device.
        parts: Vec<CollectivePart>,
    },
    /// A collective over several devices (format 1.4 on): every part's `dst` receives
    /// the concatenation of every part's `src` along one axis. Each `src` is `outer`
    /// blocks of `src.length / outer` bytes; `dst` is `outer` blocks each holding the
    /// parts' blocks in part order (a gather along the axis after the first `outer`
    /// elements' worth of leading axes). No destination overlaps any source or another
    /// destination.
    AllGather {
        /// Number of blocks (the product of the extents before the gathered axis).
        outer: u64,
        /// One per participating device.
        parts: Vec<CollectivePart>,
    },
    /// Skips the next `count` commands when the condition equals `value`: the
    /// condition is the bytes of `cond` (a one-element bool written by an earlier
    /// command, or an input), true when any of them is nonzero. Forward only, so a plan
    /// always ends; a run-time `If` puts its branches' commands behind one each
    /// (format 1.4, command tag 6).
    SkipIf {
        /// The condition's bytes (1 to [`MAX_CONDITION_BYTES`]).
        cond: Binding,
        /// The truth value that skips.
        value: bool,
        /// How many of the following commands to skip.
        count: u32,
    },
    /// Heterogeneous plans (format 1.8 on): the next `count` commands are one
    /// *segment* that runs on `device`. Every command of a heterogeneous plan belongs
    /// to exactly one segment. Segments are numbered in plan order; the segments of one
    /// device run in that order (a device is an in-order queue: a CUDA stream, a CPU
    /// thread pool), and a segment starts only once every segment in `waits` (earlier
    /// ones, of other devices) has completed: the cross-device waits (CUDA events). A
    /// segment's `Barrier`s order its own commands only, so segments of different
    /// devices with no wait between them run at once. Inside a segment an `Arena`
    /// binding names the arena of the segment's device; inputs, outputs and the
    /// constants are device 0's (the host CPU) except as a [`Command::Transfer`] names
    /// them.
    Segment {
        /// The device (an index into [`Program::devices`]).
        device: u32,
        /// How many of the following commands the segment holds (at least one).
        count: u32,
        /// Earlier segments (plan-order indices) that must complete first.
        waits: Vec<u32>,
    },
    /// Heterogeneous plans (format 1.8 on): copies `src` in the memory of `src_device`
    /// to `dst` in the memory of `dst_device` (equal lengths). Only inside a segment of
    /// one of the two devices; an `Arena` binding names its device's arena, any other
    /// slot is the host's (device 0) and may only be named for device 0.
    Transfer {
        /// The device whose memory `src` is.
        src_device: u32,
        /// Source range.
        src: Binding,
        /// The device whose memory `dst` is.
        dst_device: u32,
        /// Destination range.
        dst: Binding,
    },
}

/// One device's share of a collective command: what it contributes and where it
/// receives the result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectivePart {
    /// Device index (into [`Program::devices`]).
    pub device: u32,
    /// What this device contributes (memory that device owns).
    pub src: Binding,
    /// Where this device receives the result.
    pub dst: Binding,
}

/// Most bytes a [`Command::SkipIf`] condition may span.
pub const MAX_CONDITION_BYTES: u64 = 8;

/// A buffer of the memory plan, for inspection (the commands carry the real ranges).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferDesc {
    /// Value name in the source model.
    pub name: String,
    /// Where it lives.
    pub binding: Binding,
    /// First command index at which it is live (written).
    pub first: u32,
    /// Last command index at which it is live (read), inclusive.
    pub last: u32,
}

/// An entry point: signature, commands and memory plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPoint {
    /// Name (`"main"`).
    pub name: String,
    /// Inputs, in call order.
    pub inputs: Vec<TensorDesc>,
    /// Outputs, in call order.
    pub outputs: Vec<TensorDesc>,
    /// Arena bytes an instance needs.
    pub arena_size: u64,
    /// Alignment of the arena's base address.
    pub arena_align: u64,
    /// The commands, in order.
    pub commands: Vec<Command>,
    /// The memory map (for `kiln inspect`).
    pub buffers: Vec<BufferDesc>,
    /// Data-dependent extents (format 1.5 on; empty before): each an `i64` the plan
    /// writes, checked against its bound after the commands run and read for the actual
    /// shape of the outputs it sizes.
    pub extents: Vec<ExtentDesc>,
    /// Bounded input dimensions (format 1.6 on; empty before): inputs whose extent along
    /// one axis the caller chooses per call, up to the bound the plan is sized for.
    pub bounded: Vec<BoundedDesc>,
    /// Dispatches whose work shrinks with a bounded dimension's extent (format 1.7 on;
    /// empty before, and for a program without bounded dimensions).
    pub bounded_rows: Vec<BoundedRows>,
    /// Heterogeneous plans (format 1.8 on; empty before and for a plan without
    /// segments): the arena bytes of device `d` at index `d − 1` (device 0's is
    /// `arena_size`). Every device's arena has the alignment `arena_align`.
    pub device_arenas: Vec<u64>,
    /// The instantiation prologue (format 1.9 on; 0 before, and for a plan without one):
    /// the first `prologue` commands read no input and write no output, and what they
    /// write that a later command reads, no later command writes. Their results depend
    /// on nothing a caller passes, so a runtime may run them once per instance (again
    /// only after another entry's commands have used the arena) and start each later
    /// call at command `prologue`; running every command on every call computes the
    /// same. The compiler puts there the dispatches whose operands are all constants or
    /// results of such dispatches (weights a model computes from constants, such as
    /// `ConstantOfShape` fills, dequantised weights, position tables).
    pub prologue: u32,
}

/// A dispatch whose workgroups along a bounded dimension shrink with its extent
/// (format 1.7 on). The dispatch's workgroup index, read as `(o, j, i)` in
/// `outer × span × inner` (row-major), covers positions `j·unit .. (j+1)·unit` along
/// the dimension for step `j`: at extent `n` the runtime runs, for every `o`, only the
/// steps `j < ⌈n / unit⌉`. What the skipped workgroups would have written (positions
/// at or past the extent) is left as it was: the plan never reads it as data (masks
/// select past it, and outputs are compacted to the extent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BoundedRows {
    /// The dispatch (an index into [`EntryPoint::commands`], a `Dispatch`).
    pub command: u32,
    /// The bounded dimension (an index into [`EntryPoint::bounded`]).
    pub dim: u32,
    /// Workgroup blocks before the dimension's steps.
    pub outer: u64,
    /// Steps along the dimension: `⌈bound / unit⌉`.
    pub span: u64,
    /// Positions along the dimension one step covers.
    pub unit: u64,
    /// Workgroups per step.
    pub inner: u64,
}

impl BoundedRows {
    /// The workgroups that run at extent `n`: `outer × ⌈n / unit⌉ × inner`.
    pub fn active(&self, n: u64) -> u64 {
        self.outer * self.steps(n) * self.inner
    }

    /// Steps that run at extent `n` (at most `span`).
    pub fn steps(&self, n: u64) -> u64 {
        n.div_ceil(self.unit.max(1)).min(self.span)
    }

    /// The workgroup a running index `v` (of `0..active(n)`, the steps `≥ ⌈n / unit⌉`
    /// left out) stands for, and how many workgroups from there on are contiguous in
    /// both numberings.
    pub fn map(&self, v: u64, n: u64) -> (u64, u64) {
        let block = self.steps(n) * self.inner;
        if block == 0 {
            return (v, 0);
        }
        let (o, r) = (v / block, v % block);
        (o * self.span * self.inner + r, block - r)
    }
}

/// A bounded input dimension (format 1.6 on). The signature types input `input` at its
/// bound; the caller passes any extent `min..=bound` along `axis` (the other dims as
/// signed). Before the commands the runtime copies the caller's tensor into `staging`
/// (row-major at the bound shape, the positions past the extent zeroed), writes the
/// extent, a little-endian `i64`, at `extent`, and the plan reads the input from there
/// (no binding names the input's slot). An [`ExtentDesc`] with the same `extent`
/// binding sizes the outputs that carry the dimension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundedDesc {
    /// The input (signature index).
    pub input: u32,
    /// Its bounded axis.
    pub axis: u32,
    /// The smallest extent the caller may pass.
    pub min: u64,
    /// The largest: the signature's extent along `axis`.
    pub bound: u64,
    /// Where the input lives at its bound shape (arena, the input's signature bytes).
    pub staging: Binding,
    /// Where the extent lives (arena, 8 bytes).
    pub extent: Binding,
}

/// A data-dependent extent (format 1.5 on): a result whose size along one axis depends
/// on the data (NonZero, NonMaxSuppression, …) is computed at its bound, and the plan
/// writes the actual extent, a little-endian `i64`, at `binding`. After the commands,
/// the runtime refuses an extent outside `0..=bound` (a typed error, never a silent
/// truncation), reports each output it sizes with the extent along its axis, and
/// compacts that output's elements in place to the actual shape (row-major, at the
/// front of the caller's bound-sized buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentDesc {
    /// What it counts, for errors (a value name of the source model).
    pub name: String,
    /// Where the plan writes it (8 bytes).
    pub binding: Binding,
    /// The largest extent the plan is sized for.
    pub bound: u64,
    /// The outputs it sizes: (output index, axis), the axis's static extent being `bound`.
    pub outputs: Vec<(u32, u32)>,
}

/// A kernel the plan dispatches: one or more variants, the runtime picks the first
/// whose condition the device meets, once at load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// Name, for listings.
    pub name: String,
    /// The variants, in order of preference.
    pub variants: Vec<Variant>,
    /// The shape of computation the compiler classified it as, for listings (the runtime
    /// ignores it); `None` in files older than format 1.2, which do not record it.
    pub class: Option<KernelClass>,
}

/// The class of a kernel: the shape of computation it has, decided once at the flow
/// level (`kiln_flow::class::classify`, which defines each class precisely) so that every
/// code generator matches on it, and recorded in the artifact for listings. The one
/// enum of both sides: the compiler's flow level uses it, and the artifact stores its
/// [`KernelClass::code`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KernelClass {
    /// An epilogue over a sum of products (matrix product, convolution).
    Contraction,
    /// A depthwise convolution or a pool over an image's planes.
    Window,
    /// Reductions along the output's rows (Softmax, LayerNorm).
    Rows,
    /// Data moved, not computed (copies, padding, concatenation).
    Movement,
    /// A pointwise computation without reductions.
    Elementwise,
    /// Anything else.
    General,
    /// Scaled dot-product attention, `softmax(Q·Kᵀ·s + mask)·V`, as one kernel (an
    /// online softmax over blocks of keys; the score matrix is never stored).
    /// Last, so the codes of the classes before it are those of format 1.2.
    Attention,
}

impl KernelClass {
    /// Every class, in listing order (the order of the enum and of the codes).
    pub const ALL: [KernelClass; 7] = [
        KernelClass::Contraction,
        KernelClass::Window,
        KernelClass::Rows,
        KernelClass::Movement,
        KernelClass::Elementwise,
        KernelClass::General,
        KernelClass::Attention,
    ];

    /// The on-disk code: 1 + its position in [`KernelClass::ALL`] (0 is "not recorded").
    pub fn code(self) -> u8 {
        self as u8 + 1
    }

    /// The class of an on-disk code; `None` for 0 ("not recorded") and unknown codes.
    pub fn from_code(code: u64) -> Option<KernelClass> {
        KernelClass::ALL.into_iter().find(|c| u64::from(c.code()) == code)
    }

    /// Its name in the flow text form and in listings (`contraction`, …, `general`).
    pub fn name(self) -> &'static str {
        match self {
            KernelClass::Contraction => "contraction",
            KernelClass::Window => "window",
            KernelClass::Rows => "rows",
            KernelClass::Movement => "movement",
            KernelClass::Elementwise => "elementwise",
            KernelClass::General => "general",
            KernelClass::Attention => "attention",
        }
    }

    /// The class named `name` ([`KernelClass::name`]).
    pub fn from_name(name: &str) -> Option<KernelClass> {
        KernelClass::ALL.into_iter().find(|c| c.name() == name)
    }
}

impl core::fmt::Display for KernelClass {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// One implementation of a kernel: code, and the condition under which it may run.
///
/// A kernel lists its variants in order of preference; the runtime evaluates each
/// variant's [`Condition`] once, at load, against the device (a CPU's features from
/// `cpuid`, a GPU's compute capability) and takes the first that holds. A variant whose
/// condition does not hold is never run; where none holds, loading fails with an error
/// that names what is missing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variant {
    /// Index into [`Program::executables`].
    pub executable: u32,
    /// Index into that executable's [`Executable::entries`].
    pub entry: u32,
    /// When it may run (format 1.5 on; an older file's variant reads as
    /// [`Condition::CpuFeatures`] of its feature bits, or [`Condition::Always`] for none).
    pub condition: Condition,
    /// How many workgroups every dispatch of the kernel runs when this variant is
    /// taken; 0: the dispatch's own count. Variants of one kernel may split its work
    /// differently (a 512-bit contraction tile covers twice the rows of a 256-bit one);
    /// each variant's code takes `0..workgroups` of its own split (format 1.5 on; 0 in
    /// older files).
    pub workgroups: u64,
}

impl Variant {
    /// A variant that always runs on its executable's device, with the dispatch's
    /// workgroups.
    pub fn always(executable: u32, entry: u32) -> Variant {
        Variant { executable, entry, condition: Condition::Always, workgroups: 0 }
    }

    /// A CPU variant that needs the features `bits` (bits of [`CpuFeature`]; none:
    /// [`Condition::Always`]), with the dispatch's workgroups.
    pub fn cpu(executable: u32, entry: u32, bits: u64) -> Variant {
        let condition = if bits == 0 { Condition::Always } else { Condition::CpuFeatures(bits) };
        Variant { executable, entry, condition, workgroups: 0 }
    }
}

/// When a [`Variant`] may run, evaluated once at load. On disk (format 1.5 on): a tag,
/// then its fields (see [`crate::sections`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// On every device of its executable's kind (tag 0).
    Always,
    /// On a CPU that has every feature of the set, bits of [`CpuFeature`] (tag 1: `uv`
    /// bits; nonzero, and only bits of [`CpuFeature::ALL`]). Its executable is a CPU's.
    CpuFeatures(u64),
    /// On an NVIDIA GPU of at least a compute capability, or of exactly it where the
    /// code uses architecture-specific features (tag 2). Its executable is a CUDA one.
    Cuda(CudaArch),
}

/// The compute capability a CUDA variant needs: `sm_80` is `{ major: 8, minor: 0,
/// specific: false }` (PTX for 8.0 runs on 8.0 and every later device, compiled by the
/// driver); `sm_90a` is `{ 9, 0, specific: true }` (`wgmma`, `setmaxnreg`: only on 9.0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CudaArch {
    /// Major version (1 to [`CudaArch::MAX_MAJOR`]).
    pub major: u8,
    /// Minor version (0 to 9).
    pub minor: u8,
    /// Architecture-specific features (the `a` of `sm_90a`): the device must be exactly
    /// `major.minor`, not merely at least it.
    pub specific: bool,
}

impl CudaArch {
    /// The largest major version a condition may name.
    pub const MAX_MAJOR: u8 = 99;
    /// `sm_80`: Ampere's `mma.sync`, and every later device.
    pub const SM80: CudaArch = CudaArch { major: 8, minor: 0, specific: false };
    /// `sm_90a`: Hopper's `wgmma` and its other architecture-specific instructions.
    pub const SM90A: CudaArch = CudaArch { major: 9, minor: 0, specific: true };

    /// Whether a device of compute capability `major.minor` meets it.
    pub fn admits(self, major: u32, minor: u32) -> bool {
        let (m, n) = (u32::from(self.major), u32::from(self.minor));
        if self.specific {
            (major, minor) == (m, n)
        } else {
            (major, minor) >= (m, n)
        }
    }

    /// Its encoding: `major·10 + minor`, then whether it is architecture-specific.
    pub fn sm(self) -> u32 {
        u32::from(self.major) * 10 + u32::from(self.minor)
    }
}

impl core::fmt::Display for CudaArch {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "sm_{}{}{}", self.major, self.minor, if self.specific { "a" } else { "" })
    }
}

/// CPU features a module may need, as bits of a `u64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum CpuFeature {
    /// SSE2 (baseline x86-64).
    Sse2 = 0,
    /// SSE3.
    Sse3 = 1,
    /// SSSE3.
    Ssse3 = 2,
    /// SSE4.1 (roundps, blendv, pmulld).
    Sse41 = 3,
    /// SSE4.2.
    Sse42 = 4,
    /// POPCNT.
    Popcnt = 5,
    /// AVX.
    Avx = 6,
    /// AVX2.
    Avx2 = 7,
    /// FMA3.
    Fma = 8,
    /// BMI1.
    Bmi1 = 9,
    /// BMI2.
    Bmi2 = 10,
    /// LZCNT.
    Lzcnt = 11,
    /// F16C.
    F16c = 12,
    /// AVX-512 F.
    Avx512f = 13,
    /// AVX-512 BW.
    Avx512bw = 14,
    /// AVX-512 DQ.
    Avx512dq = 15,
    /// AVX-512 VL.
    Avx512vl = 16,
    /// AVX-512 VNNI (`vpdpbusd`: byte products summed into i32 lanes).
    Avx512vnni = 17,
    /// The AArch64 architecture with Advanced SIMD (NEON, part of every ARMv8-A core):
    /// code for it runs on a 64-bit Arm CPU and nowhere else. It is the architecture
    /// of its executable (see [`CpuArch`]), not an extension.
    Aarch64 = 18,
    /// The RV64GC architecture (64-bit RISC-V with the integer multiply, atomic, single
    /// and double float and compressed extensions): like [`CpuFeature::Aarch64`], an
    /// architecture, not an extension.
    Riscv64 = 19,
}

/// The instruction set a CPU executable is written in. It is recorded as a feature bit
/// of the executable (and of its variants' conditions): [`CpuFeature::Sse2`], part of
/// every x86-64 CPU, stands for x86-64; [`CpuFeature::Aarch64`] and
/// [`CpuFeature::Riscv64`] for the others. A CPU's features include exactly one of the
/// three, so an executable for another architecture never satisfies its condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CpuArch {
    /// x86-64 (AMD64).
    X86_64,
    /// AArch64 (64-bit Arm) with NEON.
    Aarch64,
    /// RV64GC (64-bit RISC-V).
    Riscv64,
}

impl CpuArch {
    /// Every architecture.
    pub const ALL: [CpuArch; 3] = [CpuArch::X86_64, CpuArch::Aarch64, CpuArch::Riscv64];

    /// The feature bit that marks code of this architecture.
    pub fn feature(self) -> CpuFeature {
        match self {
            CpuArch::X86_64 => CpuFeature::Sse2,
            CpuArch::Aarch64 => CpuFeature::Aarch64,
            CpuArch::Riscv64 => CpuFeature::Riscv64,
        }
    }

    /// The architecture of code needing `bits` (bits of [`CpuFeature`]): the one whose
    /// marker bit it has; `None` for none or several.
    pub fn of_features(bits: u64) -> Option<CpuArch> {
        let mut found = None;
        for a in CpuArch::ALL {
            if bits & a.feature().bit() != 0 {
                if found.is_some() {
                    return None;
                }
                found = Some(a);
            }
        }
        found
    }

    /// The name of its Rust target triple's first part (`x86_64`, `aarch64`, `riscv64`).
    pub fn name(self) -> &'static str {
        match self {
            CpuArch::X86_64 => "x86_64",
            CpuArch::Aarch64 => "aarch64",
            CpuArch::Riscv64 => "riscv64",
        }
    }

    /// The relocation kinds its code may carry.
    pub fn admits(self, kind: RelocKind) -> bool {
        match kind {
            RelocKind::Abs64 => true,
            RelocKind::Pc32 => self == CpuArch::X86_64,
            RelocKind::Aarch64Call26 | RelocKind::Aarch64AdrPrelPgHi21 | RelocKind::Aarch64AddAbsLo12Nc => {
                self == CpuArch::Aarch64
            }
            RelocKind::RiscvCallPlt | RelocKind::RiscvPcrelHi20 | RelocKind::RiscvPcrelLo12I => {
                self == CpuArch::Riscv64
            }
        }
    }
}

impl CpuFeature {
    /// Every feature, by bit.
    pub const ALL: [CpuFeature; 20] = [
        CpuFeature::Sse2,
        CpuFeature::Sse3,
        CpuFeature::Ssse3,
        CpuFeature::Sse41,
        CpuFeature::Sse42,
        CpuFeature::Popcnt,
        CpuFeature::Avx,
        CpuFeature::Avx2,
        CpuFeature::Fma,
        CpuFeature::Bmi1,
        CpuFeature::Bmi2,
        CpuFeature::Lzcnt,
        CpuFeature::F16c,
        CpuFeature::Avx512f,
        CpuFeature::Avx512bw,
        CpuFeature::Avx512dq,
        CpuFeature::Avx512vl,
        CpuFeature::Avx512vnni,
        CpuFeature::Aarch64,
        CpuFeature::Riscv64,
    ];

    /// Every feature's bit: a condition naming any other bit is malformed.
    pub const KNOWN: u64 = (1 << CpuFeature::ALL.len() as u32) - 1;

    /// The x86-64 micro-architecture levels as feature sets (of the features this table
    /// has): index 0 is x86-64 (SSE2), 1 is v2, 2 is v3, 3 is v4.
    pub const LEVELS: [u64; 4] = {
        let v1 = 1 << CpuFeature::Sse2 as u8;
        let v2 = v1
            | 1 << CpuFeature::Sse3 as u8
            | 1 << CpuFeature::Ssse3 as u8
            | 1 << CpuFeature::Sse41 as u8
            | 1 << CpuFeature::Sse42 as u8
            | 1 << CpuFeature::Popcnt as u8;
        let v3 = v2
            | 1 << CpuFeature::Avx as u8
            | 1 << CpuFeature::Avx2 as u8
            | 1 << CpuFeature::Fma as u8
            | 1 << CpuFeature::Bmi1 as u8
            | 1 << CpuFeature::Bmi2 as u8
            | 1 << CpuFeature::Lzcnt as u8;
        let v4 =
            v3 | 1 << CpuFeature::Avx512f as u8 | 1 << CpuFeature::Avx512dq as u8 | 1 << CpuFeature::Avx512vl as u8;
        [v1, v2, v3, v4]
    };

    /// The highest x86-64 level whose every feature `bits` has (`"x86-64"`,
    /// `"x86-64-v2"`, …; `None` without SSE2) and the features of `bits` beyond it.
    pub fn level_of(bits: u64) -> (Option<&'static str>, u64) {
        const NAMES: [&str; 4] = ["x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"];
        match (0..4).rev().find(|&l| bits & CpuFeature::LEVELS[l] == CpuFeature::LEVELS[l]) {
            Some(l) => (Some(NAMES[l]), bits & !CpuFeature::LEVELS[l]),
            None => (None, bits),
        }
    }

    /// Its bit in a feature set.
    pub fn bit(self) -> u64 {
        1 << self as u8
    }

    /// Lower-case name (`"avx2"`).
    pub fn name(self) -> &'static str {
        match self {
            CpuFeature::Sse2 => "sse2",
            CpuFeature::Sse3 => "sse3",
            CpuFeature::Ssse3 => "ssse3",
            CpuFeature::Sse41 => "sse4.1",
            CpuFeature::Sse42 => "sse4.2",
            CpuFeature::Popcnt => "popcnt",
            CpuFeature::Avx => "avx",
            CpuFeature::Avx2 => "avx2",
            CpuFeature::Fma => "fma",
            CpuFeature::Bmi1 => "bmi1",
            CpuFeature::Bmi2 => "bmi2",
            CpuFeature::Lzcnt => "lzcnt",
            CpuFeature::F16c => "f16c",
            CpuFeature::Avx512f => "avx512f",
            CpuFeature::Avx512bw => "avx512bw",
            CpuFeature::Avx512dq => "avx512dq",
            CpuFeature::Avx512vl => "avx512vl",
            CpuFeature::Avx512vnni => "avx512vnni",
            CpuFeature::Aarch64 => "aarch64",
            CpuFeature::Riscv64 => "riscv64",
        }
    }
}

/// Kinds of relocations in generated code (`S` the target's address, `A` the addend,
/// `P` the patched place's address). Which kinds an executable may carry depends on its
/// architecture ([`CpuArch::admits`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelocKind {
    /// 32-bit PC-relative: `S + A - P` (x86-64 `R_X86_64_PC32` / `PLT32`).
    Pc32,
    /// 64-bit absolute: `S + A` (`R_X86_64_64`, `R_AARCH64_ABS64`, `R_RISCV_64`).
    Abs64,
    /// AArch64 `b`/`bl`: `(S + A - P) >> 2` in the instruction's low 26 bits, within
    /// ±128 MiB (`R_AARCH64_CALL26`, `JUMP26`).
    Aarch64Call26,
    /// AArch64 `adrp`: the 4 KiB page difference `Page(S + A) - Page(P)` >> 12 in the
    /// instruction's 21-bit immediate, within ±4 GiB (`R_AARCH64_ADR_PREL_PG_HI21`).
    Aarch64AdrPrelPgHi21,
    /// AArch64 `add` (immediate): the low 12 bits of `S + A` (`R_AARCH64_ADD_ABS_LO12_NC`).
    Aarch64AddAbsLo12Nc,
    /// RISC-V `auipc` + `jalr` pair: `S + A - P` split into a high 20 and a low 12 bits,
    /// within ±2 GiB (`R_RISCV_CALL_PLT`, `R_RISCV_CALL`).
    RiscvCallPlt,
    /// RISC-V `auipc`: the high 20 bits of `S + A - P` (rounded for the sign of the low
    /// part) (`R_RISCV_PCREL_HI20`).
    RiscvPcrelHi20,
    /// RISC-V I-type low part of a PC-relative pair: here `target` is the `auipc` it
    /// pairs with (its offset) and the value is the low 12 bits of that pair's `S + A - P`
    /// (`R_RISCV_PCREL_LO12_I`, translated from its label form by the compiler).
    RiscvPcrelLo12I,
}

impl RelocKind {
    /// Bytes it patches.
    pub fn width(self) -> u64 {
        match self {
            RelocKind::Abs64 | RelocKind::RiscvCallPlt => 8,
            _ => 4,
        }
    }
}

/// One relocation: patch `offset` in the code with the address of `target` (a code
/// offset in the same executable) plus `addend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reloc {
    /// Where in the code.
    pub offset: u64,
    /// How.
    pub kind: RelocKind,
    /// Code offset of the referenced symbol.
    pub target: u64,
    /// Addend.
    pub addend: i64,
}

/// Bit of a CUDA [`Executable::features`]: the code is a cubin (an ELF image from
/// `ptxas -arch=sm_90a`) for compute capability 9.0 with the `a` features, loaded as it
/// is; without the bit the code is PTX text, compiled by the driver at load. A runtime
/// prefers a variant with the bit on a 9.0 device and falls back to PTX elsewhere or
/// when the cubin does not load.
pub const CUDA_CUBIN_SM90A: u64 = 1 << 0;

/// How a CUDA entry is launched (the grid is each dispatch's `workgroups`): a
/// one-dimensional block, its dynamic shared memory and its parameter count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Launch {
    /// Threads per block (a multiple of 32, 32 to 1024).
    pub block: u32,
    /// Bytes of dynamic shared memory per block (at most 227 KiB on Hopper).
    pub shared: u32,
    /// Number of `.u64` parameters: one device address per binding of the dispatch.
    pub params: u32,
}

/// Generated machine code for one target: a relocatable image loaded by the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Executable {
    /// The device kind it runs on.
    pub device: DeviceKind,
    /// Features the code needs: for a CPU, a bit set of [`CpuFeature`]; for CUDA, bits
    /// such as [`CUDA_CUBIN_SM90A`].
    pub features: u64,
    /// Code and read-only data, position-independent apart from `relocs`.
    pub code: Vec<u8>,
    /// Entry points: name and code offset.
    pub entries: Vec<(String, u64)>,
    /// Relocations to apply after the code is placed.
    pub relocs: Vec<Reloc>,
    /// For a CUDA executable, one launch per entry, in entry order; empty for a CPU
    /// (and in files older than format 1.3, which do not record them).
    pub launches: Vec<Launch>,
}

/// Where the constant pool lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Constants {
    /// In the artifact (64-byte aligned section).
    Embedded(Vec<u8>),
    /// In a separate file, bound by its size and hash.
    External {
        /// File name, as given to the compiler (the runtime is handed the bytes).
        file: String,
        /// Its size in bytes.
        size: u64,
        /// Its 64-bit hash ([`crate::sections::weights_hash`]).
        hash: u64,
    },
}

/// Names for listings and errors; strippable.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DebugInfo {
    /// Per kernel: the source ops it was formed from (`"Conv /layer1/conv + Relu …"`).
    pub kernel_sources: Vec<String>,
    /// The source model's file name.
    pub source: String,
}

/// A whole artifact.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// Device table.
    pub devices: Vec<Device>,
    /// Entry points.
    pub entries: Vec<EntryPoint>,
    /// Kernel table.
    pub kernels: Vec<Kernel>,
    /// Executables.
    pub executables: Vec<Executable>,
    /// The constant pool.
    pub constants: Constants,
    /// Debug names (absent when stripped).
    pub debug: Option<DebugInfo>,
}

#[cfg(test)]
mod bounded_rows_tests {
    use super::BoundedRows;
    use alloc::vec::Vec;

    #[test]
    fn the_running_workgroups_map_to_the_steps_before_the_extent() {
        // 3 blocks × 4 steps of 2 positions × 5 workgroups: at extent 3, steps 0 and 1.
        let r = BoundedRows { command: 0, dim: 0, outer: 3, span: 4, unit: 2, inner: 5 };
        assert_eq!((r.steps(3), r.active(3)), (2, 30));
        assert_eq!((r.steps(8), r.active(8)), (4, 60));
        assert_eq!((r.steps(99), r.active(0)), (4, 0));
        // Running index 0..10 is block 0's workgroups 0..10; 10..20 block 1's 20..30.
        assert_eq!(r.map(0, 3), (0, 10));
        assert_eq!(r.map(7, 3), (7, 3));
        assert_eq!(r.map(10, 3), (20, 10));
        assert_eq!(r.map(25, 3), (45, 5));
        let all: Vec<u64> = (0..r.active(3)).map(|v| r.map(v, 3).0).collect();
        let want: Vec<u64> = (0..3).flat_map(|o| o * 20..o * 20 + 10).collect();
        assert_eq!(all, want);
    }
}
