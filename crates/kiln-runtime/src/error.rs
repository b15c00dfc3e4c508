//! Everything that can go wrong between an artifact's bytes and an invocation's outputs.
//! Every message names what is wrong and where, in one line.

use crate::dtype::Show;
use crate::hal::LoadError;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use kiln_module::program::{DeviceKind, Slot};

/// A device kind as messages name it.
pub(crate) fn kind_name(kind: DeviceKind) -> &'static str {
    match kind {
        DeviceKind::Cpu => "CPU",
        DeviceKind::Cuda => "CUDA",
    }
}
use kiln_module::reader::ReadError;
use kiln_module::sections::SectionError;
use kiln_module::show::write_joined;
use kiln_module::Version;

/// Why a module does not load or an invocation does not run.
#[derive(Debug)]
pub enum RuntimeError {
    /// Not a `.kiln` file.
    BadMagic,
    /// The file's container format is not one this runtime reads.
    UnsupportedFormat {
        /// The file's format version.
        file: Version,
        /// The format this runtime reads.
        reader: Version,
    },
    /// The module needs a kernel ABI this runtime does not provide.
    UnsupportedVersion {
        /// The ABI the module needs.
        needed: Version,
        /// The ABI this runtime has.
        have: Version,
    },
    /// Stored and computed checksums differ: the file is corrupt.
    Checksum {
        /// `"header"`, `"section table"` or the section's name.
        section: String,
    },
    /// Another container-level problem (truncation, bounds, overlap, …).
    Container(ReadError),
    /// A section does not decode.
    Malformed(SectionError),
    /// The plan or the code tables are inconsistent (an index or a range out of bounds).
    Invalid(VerifyError),
    /// No variant of a kernel runs on this CPU.
    MissingCpuFeatures {
        /// The kernel.
        kernel: String,
        /// Features its most modest variant needs and the host lacks.
        names: Vec<String>,
    },
    /// Every variant of a kernel is code for another CPU architecture than this
    /// machine's (an artifact compiled with `--target-triple` for another CPU).
    WrongArchitecture {
        /// The kernel.
        kernel: String,
        /// The architecture of its code (`"aarch64"`, …).
        code: &'static str,
        /// This machine's architecture.
        host: &'static str,
    },
    /// No variant of a kernel is for a CPU.
    NoCpuVariant {
        /// The kernel.
        kernel: String,
    },
    /// An embedder's allocator was given (`Module::load_in`, `Instance::new_in`) but
    /// the process's global allocator is not `memory::Routed`, so the runtime's
    /// allocations could not reach it.
    AllocatorNotRouted,
    /// The module keeps its weights in a separate file and none was given.
    WeightsMissing {
        /// The file name the compiler recorded.
        file: String,
        /// Its expected size.
        size: u64,
    },
    /// The weights given are not the ones the module was compiled with.
    WeightsMismatch {
        /// The file name the compiler recorded.
        file: String,
        /// Expected size.
        expected_size: u64,
        /// Size given.
        got_size: u64,
        /// Expected hash.
        expected_hash: u64,
        /// Hash of the bytes given (not computed when the sizes differ).
        got_hash: Option<u64>,
    },
    /// Weights were given but the module embeds its constants.
    WeightsNotExpected,
    /// Code could not be placed in executable memory.
    Load {
        /// The executable's index.
        executable: usize,
        /// Why.
        error: LoadError,
    },
    /// The arena could not be allocated.
    ArenaAlloc {
        /// Bytes requested.
        bytes: u64,
    },
    /// A heterogeneous plan names a device this instance has no queue for (the CPU
    /// runtime drives CPU devices only; a CUDA device needs the `cuda` feature's
    /// executor).
    Hetero {
        /// The device index.
        device: u32,
    },
    /// A caller-supplied arena is too small.
    ArenaTooSmall {
        /// Bytes needed.
        needed: u64,
        /// Bytes given.
        got: u64,
    },
    /// A caller-supplied arena is not aligned.
    ArenaMisaligned {
        /// Alignment needed.
        align: u64,
        /// The arena's address.
        address: usize,
    },
    /// An instance cannot run on that many threads (zero, or the system refused to
    /// start a worker).
    Threads {
        /// Threads asked for.
        threads: usize,
        /// Why not.
        why: String,
    },
    /// A worker thread of the local-task driver ended unexpectedly; the instance runs
    /// no further invocation.
    WorkerLost,
    /// A data-dependent extent (format 1.5) came out negative or above the bound the
    /// plan was compiled for (`kiln compile --max-dim NAME=N` raises it); the outputs
    /// are not valid.
    ExtentOutOfBound {
        /// What it counts (a value name of the model).
        name: String,
        /// The extent the data needs.
        extent: i64,
        /// The bound.
        bound: u64,
    },
    /// A shape check of the plan failed: the run-time operands that decide a result's
    /// shape (a Resize's `scales`) give it dims other than the ones the module was
    /// compiled for (declared by the model or `kiln compile --output-shape`); the
    /// outputs are not valid.
    ShapeCheck {
        /// The result (a value name of the model).
        name: String,
        /// How many of its axes differ.
        axes: i64,
    },
    /// No entry point of that name or index.
    NoSuchEntry {
        /// The name or index asked for.
        entry: String,
    },
    /// No CUDA driver can be used: the library is missing, or lacks a function kiln
    /// calls (a driver older than CUDA 12).
    NoCudaDriver {
        /// What is missing (`libcuda.so.1 not found`).
        what: String,
    },
    /// A CUDA driver call failed.
    Cuda {
        /// The driver function (`cuGraphLaunch`).
        call: &'static str,
        /// The driver's error name (`CUDA_ERROR_INVALID_VALUE`).
        error: String,
    },
    /// The driver refused an executable's code (PTX it cannot compile, or a cubin for
    /// another device).
    CudaModuleLoad {
        /// The executable's index.
        executable: usize,
        /// The driver's error name.
        error: String,
        /// The JIT compiler's log (empty for a cubin, or when it said nothing).
        log: String,
    },
    /// No variant of a kernel runs on this CUDA device.
    NoCudaVariant {
        /// The kernel.
        kernel: String,
        /// Why not (the device's compute capability, the loads that failed).
        why: String,
    },
    /// A plan the CUDA graph cannot express.
    CudaPlan {
        /// Entry point name.
        entry: String,
        /// Command index.
        command: usize,
        /// What.
        problem: CudaPlanProblem,
    },
    /// No binding at that place of an entry point's plan.
    NoSuchBinding {
        /// Entry point.
        entry: String,
        /// Command index.
        command: usize,
        /// Binding index.
        binding: usize,
    },
    /// Wrong number of inputs.
    InputCount {
        /// Entry point.
        entry: String,
        /// Inputs it takes.
        expected: usize,
        /// Inputs given.
        got: usize,
    },
    /// Wrong number of outputs.
    OutputCount {
        /// Entry point.
        entry: String,
        /// Outputs it produces.
        expected: usize,
        /// Output buffers given.
        got: usize,
    },
    /// An input has the wrong byte length.
    InputSize {
        /// Input name.
        name: String,
        /// Bytes expected.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// An input with a bounded dimension (format 1.6) has an extent along it outside the
    /// range the module was compiled for.
    InputExtent {
        /// Input name.
        name: String,
        /// The bounded axis.
        axis: u32,
        /// The smallest extent allowed.
        min: u64,
        /// The largest (the bound).
        bound: u64,
        /// The extent given.
        got: u64,
    },
    /// An output buffer has the wrong byte length.
    OutputSize {
        /// Output name.
        name: String,
        /// Bytes expected.
        expected: u64,
        /// Bytes given.
        got: u64,
    },
    /// An input has the wrong dtype.
    InputDtype {
        /// Input name.
        name: String,
        /// ONNX code expected.
        expected: u32,
        /// ONNX code given.
        got: u32,
    },
    /// An output buffer has the wrong dtype.
    OutputDtype {
        /// Output name.
        name: String,
        /// ONNX code expected.
        expected: u32,
        /// ONNX code given.
        got: u32,
    },
    /// An input has the wrong shape.
    InputShape {
        /// Input name.
        name: String,
        /// Shape expected.
        expected: Vec<u64>,
        /// Shape given.
        got: Vec<u64>,
    },
    /// An output buffer has the wrong shape.
    OutputShape {
        /// Output name.
        name: String,
        /// Shape expected.
        expected: Vec<u64>,
        /// Shape given.
        got: Vec<u64>,
    },
}

impl From<ReadError> for RuntimeError {
    fn from(e: ReadError) -> RuntimeError {
        match e {
            ReadError::BadMagic => RuntimeError::BadMagic,
            ReadError::UnsupportedVersion { file, reader } => RuntimeError::UnsupportedFormat { file, reader },
            ReadError::HeaderChecksum => RuntimeError::Checksum { section: "header".into() },
            ReadError::TableChecksum => RuntimeError::Checksum { section: "section table".into() },
            ReadError::SectionChecksum { kind, .. } => {
                RuntimeError::Checksum { section: alloc::format!("{kind} section") }
            }
            e => RuntimeError::Container(e),
        }
    }
}

impl From<SectionError> for RuntimeError {
    fn from(e: SectionError) -> RuntimeError {
        RuntimeError::Malformed(e)
    }
}

impl From<VerifyError> for RuntimeError {
    fn from(e: VerifyError) -> RuntimeError {
        RuntimeError::Invalid(e)
    }
}

struct Dims<'a>(&'a [u64]);

impl fmt::Display for Dims<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        write_joined(f, self.0, ", ")?;
        f.write_str("]")
    }
}

/// A name read from a module (or given by a caller), written with control characters
/// escaped (`\n` as `\\n`), so that every message stays on one line whatever the
/// artifact holds.
pub(crate) struct Name<'a>(pub &'a str);

impl fmt::Display for Name<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write as _;
        for c in self.0.chars() {
            if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use RuntimeError as E;
        match self {
            E::BadMagic => f.write_str("not a .kiln module (bad magic bytes at offset 0)"),
            E::UnsupportedFormat { file, reader } => {
                write!(
                    f,
                    "module has container format {file}, runtime reads {reader}: recompile it with a matching kiln"
                )
            }
            E::UnsupportedVersion { needed, have } => {
                write!(f, "module needs ABI {needed}, runtime has {have}: recompile it or update the runtime")
            }
            E::Checksum { section } => write!(f, "{section} checksum mismatch: the file is corrupt"),
            E::Container(e) => write!(f, "bad container: {e}"),
            E::Malformed(e) => write!(f, "malformed module: {e}"),
            E::Invalid(e) => write!(f, "invalid module: {e}"),
            E::MissingCpuFeatures { kernel, names } => {
                write!(f, "kernel {kernel_} needs CPU features this machine lacks: ", kernel_ = Name(kernel))?;
                write_joined(f, names, ", ")?;
                f.write_str(" (compile for this CPU)")
            }
            E::AllocatorNotRouted => f.write_str(
                "an allocator was given but the global allocator is not kiln_runtime::memory::Routed \
                 (install it with #[global_allocator] to route the runtime's allocations)",
            ),
            E::WrongArchitecture { kernel, code, host } => write!(
                f,
                "kernel {kernel_} is {code} code and this machine is {host} (compile with --target-triple for this machine)",
                kernel_ = Name(kernel)
            ),
            E::NoCpuVariant { kernel } => {
                write!(f, "kernel {kernel_} has no variant for a CPU", kernel_ = Name(kernel))
            }
            E::WeightsMissing { file, size } => {
                write!(
                    f,
                    "the module's weights are in a separate file ({file_}, {size} bytes); pass it with the module",
                    file_ = Name(file)
                )
            }
            E::WeightsMismatch { file, expected_size, got_size, expected_hash, got_hash } => {
                if expected_size != got_size {
                    write!(f, "weights file has {got_size} bytes, the module was compiled with {file_} of {expected_size} bytes", file_ = Name(file))
                } else {
                    write!(f, "weights file hash {:016x} differs from {file_}'s {expected_hash:016x}: not the weights the module was compiled with", got_hash.unwrap_or(0), file_ = Name(file))
                }
            }
            E::WeightsNotExpected => f.write_str("a weights file was given but the module embeds its weights"),
            E::Load { executable, error } => write!(f, "cannot load executable {executable}: {error}"),
            E::ArenaAlloc { bytes } => write!(f, "cannot allocate an arena of {bytes} bytes"),
            E::Hetero { device } => write!(f, "heterogeneous plan: no executor for device {device} in this runtime"),
            E::ArenaTooSmall { needed, got } => write!(f, "arena of {got} bytes given, the module needs {needed}"),
            E::ArenaMisaligned { align, address } => {
                write!(f, "arena at {address:#x} is not aligned to {align} bytes as the module needs")
            }
            E::Threads { threads, why } => write!(f, "cannot run on {threads} threads: {why}"),
            E::WorkerLost => f.write_str("a worker thread of this instance stopped unexpectedly; make a new instance"),
            E::NoSuchEntry { entry } => write!(f, "the module has no entry point {entry_}", entry_ = Name(entry)),
            E::NoCudaDriver { what } => write!(f, "no CUDA driver: {what}"),
            E::Cuda { call, error } => write!(f, "CUDA call {call} failed: {error}"),
            E::CudaModuleLoad { executable, error, log } => {
                write!(f, "the CUDA driver refused executable {executable}: {error}")?;
                if !log.trim().is_empty() {
                    write!(f, " ({})", OneLine(log))?;
                }
                Ok(())
            }
            E::ExtentOutOfBound { name, extent, bound } => write!(
                f,
                "the data needs {extent} entries of {name_}, above the bound {bound} the module was compiled for (compile with --max-dim {name}=N for a larger bound)",
                name_ = Name(name)
            ),
            E::ShapeCheck { name, axes } => write!(
                f,
                "the run-time operands give {name_} other dims than the module was compiled for ({axes} axes differ; compile with --output-shape {name}=DIMS for the dims they give)",
                name_ = Name(name)
            ),
            E::NoCudaVariant { kernel, why } => {
                write!(f, "kernel {kernel_} has no variant for this CUDA device: {why}", kernel_ = Name(kernel))
            }
            E::CudaPlan { entry, command, problem } => {
                write!(f, "entry {entry_}, command {command}: {problem}", entry_ = Name(entry))
            }
            E::NoSuchBinding { entry, command, binding } => write!(
                f,
                "entry {entry_} has no binding {binding} at command {command}",
                entry_ = Name(entry)
            ),
            E::InputCount { entry, expected, got } => {
                write!(f, "{entry_} takes {expected} inputs, {got} given", entry_ = Name(entry))
            }
            E::OutputCount { entry, expected, got } => {
                write!(f, "{entry_} produces {expected} outputs, {got} buffers given", entry_ = Name(entry))
            }
            E::InputExtent { name, axis, min, bound, got } => write!(
                f,
                "input {name_} has extent {got} along its bounded axis {axis}; the module takes {min}..={bound} (compile with a larger bound in --input-shape)",
                name_ = Name(name)
            ),
            E::InputSize { name, expected, got } => {
                write!(f, "input {name_} must be {expected} bytes, got {got}", name_ = Name(name))
            }
            E::OutputSize { name, expected, got } => {
                write!(f, "output buffer {name_} must be {expected} bytes, got {got}", name_ = Name(name))
            }
            E::InputDtype { name, expected, got } => {
                write!(f, "input {name_} must be {}, got {}", Show(*expected), Show(*got), name_ = Name(name))
            }
            E::OutputDtype { name, expected, got } => {
                write!(f, "output {name_} is {}, buffer given as {}", Show(*expected), Show(*got), name_ = Name(name))
            }
            E::InputShape { name, expected, got } => {
                write!(f, "input {name_} must have shape {}, got {}", Dims(expected), Dims(got), name_ = Name(name))
            }
            E::OutputShape { name, expected, got } => {
                write!(
                    f,
                    "output {name_} has shape {}, buffer given as {}",
                    Dims(expected),
                    Dims(got),
                    name_ = Name(name)
                )
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for RuntimeError {}

/// What about a command the CUDA graph cannot express.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaPlanProblem {
    /// A dispatch's grid is larger than a kernel launch takes (2³¹ − 1 blocks).
    Grid {
        /// Workgroups recorded.
        workgroups: u64,
    },
    /// A dispatched kernel has no launch record.
    NoLaunch {
        /// Kernel index.
        kernel: u32,
    },
    /// A collective command: the CUDA driver has no collectives yet (NCCL over the GPUs
    /// of one host is the planned driver; `docs/scale-out.md`).
    Collective,
    /// Bounded input dimensions (format 1.6), which the CUDA driver does not run yet
    /// (the compiler refuses them for CUDA too).
    Bounded,
    /// A segment or transfer command: a heterogeneous plan (format 1.8) runs on the
    /// CPU runtime's heterogeneous executor, with its CUDA segments on a CUDA queue,
    /// not as one CUDA graph.
    Heterogeneous,
}

impl fmt::Display for CudaPlanProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaPlanProblem::Grid { workgroups } => {
                write!(f, "a grid of {workgroups} blocks (a CUDA grid has at most {} blocks)", (1u64 << 31) - 1)
            }
            CudaPlanProblem::NoLaunch { kernel } => write!(f, "kernel {kernel} has no CUDA launch record"),
            CudaPlanProblem::Collective => {
                f.write_str("a collective command (multi-GPU collectives through NCCL are not built yet)")
            }
            CudaPlanProblem::Bounded => {
                f.write_str("bounded input dimensions, which the CUDA runtime does not run yet; run the artifact on the CPU runtime")
            }
            CudaPlanProblem::Heterogeneous => f.write_str(
                "a heterogeneous plan (segments over CPU and GPU): run it with `kiln run` on the host, which drives its CUDA segments",
            ),
        }
    }
}

/// Text from outside (a JIT log) on one line: line breaks become `; `.
struct OneLine<'a>(&'a str);

impl fmt::Display for OneLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_joined(f, self.0.lines().map(str::trim).filter(|l| !l.is_empty()).map(Name), "; ")
    }
}

/// An inconsistency found by the load-time verifier. Entry, kernel and tensor names
/// come from the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VerifyError {
    /// A heterogeneous entry's device arenas (format 1.8): not one per device after
    /// the first, a size that does not fit this host's address space, or a host
    /// (device 0) that is not a CPU.
    DeviceArenas {
        /// Entry point name.
        entry: String,
        /// What is wrong.
        why: String,
    },
    /// A command of an entry point.
    Command {
        /// Entry point name.
        entry: String,
        /// Command index.
        command: usize,
        /// What is wrong.
        problem: CommandProblem,
    },
    /// A buffer of an entry point's memory map.
    Buffer {
        /// Entry point name.
        entry: String,
        /// Buffer name.
        buffer: String,
        /// What is wrong with its range.
        problem: BindingProblem,
    },
    /// A tensor's recorded byte size disagrees with its dtype and dims.
    TensorBytes {
        /// Entry point name.
        entry: String,
        /// Tensor name.
        tensor: String,
        /// Bytes recorded.
        recorded: u64,
        /// Bytes its dtype and dims give (`None`: overflows 64 bits).
        expected: Option<u64>,
    },
    /// A tensor's dtype is not one kiln runs.
    UnknownDtype {
        /// Entry point name.
        entry: String,
        /// Tensor name.
        tensor: String,
        /// The ONNX code.
        dtype: u32,
    },
    /// The arena alignment is not a power of two up to [`crate::MAX_ARENA_ALIGN`], or the
    /// arena does not fit the address space.
    Arena {
        /// Entry point name.
        entry: String,
        /// Size recorded.
        size: u64,
        /// Alignment recorded.
        align: u64,
    },
    /// A data-dependent extent of an entry (format 1.5) is malformed: its binding is
    /// not 8 bytes inside the arena, or an output it sizes does not exist or does not
    /// have the bound along the axis.
    Extent {
        /// Entry point name.
        entry: String,
        /// Extent name.
        extent: String,
        /// What is wrong.
        problem: String,
    },
    /// An entry's instantiation prologue (format 1.9) is malformed: longer than the
    /// plan, in a heterogeneous plan, or holding a command that is not a dispatch, copy,
    /// fill or barrier, or that binds an input or output.
    Prologue {
        /// Entry point name.
        entry: String,
        /// The prologue's length in commands.
        prologue: u32,
        /// The command at fault, where one is.
        command: Option<usize>,
        /// What is wrong.
        why: String,
    },
    /// A kernel has no variants.
    NoVariants {
        /// Kernel name.
        kernel: String,
    },
    /// A variant names an executable or an entry symbol that does not exist.
    Variant {
        /// Kernel name.
        kernel: String,
        /// Variant index.
        variant: usize,
        /// Executable index recorded.
        executable: u32,
        /// Entry index recorded.
        entry: u32,
    },
    /// A variant's condition is malformed: it names CPU features this format does not
    /// define or none at all, a kind of device its executable is not for, or a compute
    /// capability that does not exist; or it asks a CUDA executable for its own
    /// workgroup count (the CUDA driver launches the dispatch's grid).
    Condition {
        /// Kernel name.
        kernel: String,
        /// Variant index.
        variant: usize,
        /// What is wrong.
        problem: ConditionProblem,
    },
    /// An entry symbol lies outside its executable's code.
    Symbol {
        /// Executable index.
        executable: usize,
        /// Symbol name.
        name: String,
        /// Offset recorded.
        offset: u64,
        /// Code length.
        code_len: u64,
    },
    /// An executable has a different number of launch records than it should: one per
    /// entry for CUDA, none for a CPU.
    Launches {
        /// Executable index.
        executable: usize,
        /// Launch records present.
        launches: usize,
        /// Launch records expected.
        expected: usize,
    },
    /// A CUDA launch record is out of the device's limits.
    Launch {
        /// Executable index.
        executable: usize,
        /// Entry index.
        entry: usize,
        /// Threads per block recorded (must be a multiple of 32 from 32 to 1024).
        block: u32,
        /// Dynamic shared bytes recorded (at most [`crate::verify::MAX_CUDA_SHARED`]).
        shared: u32,
    },
    /// A relocation patches or targets bytes outside its executable's code.
    Reloc {
        /// Executable index.
        executable: usize,
        /// Relocation index.
        index: usize,
        /// Offset patched.
        offset: u64,
        /// Target offset.
        target: u64,
        /// Code length.
        code_len: u64,
    },
    /// A CPU executable's features name several architectures (see
    /// `kiln_module::program::CpuArch`).
    Architectures {
        /// Executable index.
        executable: usize,
    },
    /// A relocation of a kind another architecture's code uses.
    RelocKind {
        /// Executable index.
        executable: usize,
        /// Relocation index.
        index: usize,
        /// The kind's name.
        kind: &'static str,
        /// The executable's architecture.
        arch: &'static str,
    },
}

/// What is wrong with one command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommandProblem {
    /// Kernel index out of range.
    KernelIndex {
        /// Index recorded.
        kernel: u32,
        /// Kernels in the module.
        count: usize,
    },
    /// Device index out of range.
    DeviceIndex {
        /// Index recorded.
        device: u32,
        /// Devices in the module.
        count: usize,
    },
    /// The device is not one this runtime drives (the CPU runtime refuses a CUDA
    /// device, the CUDA runtime a CPU one).
    UnsupportedDevice {
        /// Device index.
        device: u32,
        /// Its name.
        name: String,
        /// The kind of device the runtime that refused it drives.
        driver: DeviceKind,
    },
    /// The dispatched kernel has no variant for the kind of device it is dispatched on.
    NoVariantForDevice {
        /// Kernel index.
        kernel: u32,
        /// The device's kind.
        kind: DeviceKind,
    },
    /// A CUDA variant's launch record takes a different number of parameters than the
    /// dispatch has bindings.
    LaunchParams {
        /// Kernel index.
        kernel: u32,
        /// Variant index.
        variant: usize,
        /// Parameters of the launch record.
        params: u32,
        /// Bindings of the dispatch.
        bindings: usize,
    },
    /// Push constants are reserved: kernel ABI 1.x has no way to pass them.
    PushConstants {
        /// How many were recorded.
        count: usize,
    },
    /// A binding is out of range or not writable.
    Binding {
        /// Which binding.
        role: BindingRole,
        /// What is wrong.
        problem: BindingProblem,
    },
    /// A copy's source and destination lengths differ.
    CopyLengths {
        /// Source length.
        src: u64,
        /// Destination length.
        dst: u64,
    },
    /// A fill pattern width other than 1, 2, 4 or 8.
    FillPatternLen {
        /// Width recorded.
        len: u8,
    },
    /// A collective command (all-reduce, all-gather) is malformed: fewer than two
    /// parts, a part's device repeated or not a device of the table, ranges of the
    /// wrong lengths, an element type the runtime cannot reduce, or a destination that
    /// overlaps another part's range.
    Collective {
        /// What is wrong.
        why: String,
    },
    /// The runtime cannot execute collectives (the CUDA driver: NCCL is not built).
    CollectiveUnsupported,
    /// A `SkipIf` condition of no bytes, or of more than
    /// [`kiln_module::program::MAX_CONDITION_BYTES`].
    ConditionBytes {
        /// Its length.
        length: u64,
    },
    /// A `SkipIf` skips past the end of the plan.
    SkipPastEnd {
        /// Commands it skips.
        count: u32,
        /// Commands after it.
        remaining: usize,
    },
    /// A heterogeneous plan (format 1.8) is malformed: a command outside every segment,
    /// a segment that is empty, runs past the plan's end or holds another, a wait on a
    /// segment that is not an earlier one, a command of a kind a segment may not hold,
    /// a dispatch or transfer not on its segment's device, or a transfer between one
    /// device and itself.
    Segment {
        /// What is wrong.
        why: String,
    },
    /// A command for a device other than the host (device 0) names an input, an
    /// output or memory of no device (inputs and outputs are the host's: a transfer
    /// moves them).
    HostSlot {
        /// The device the range was named for.
        device: u32,
        /// The slot.
        slot: Slot,
    },
}

/// Which binding of a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingRole {
    /// Binding `i` of a dispatch.
    Dispatch(usize),
    /// A copy's source.
    CopySource,
    /// A copy's destination.
    CopyDestination,
    /// A fill's destination.
    FillDestination,
    /// Part `i`'s source of a collective.
    CollectiveSource(usize),
    /// Part `i`'s destination of a collective.
    CollectiveDestination(usize),
    /// A `SkipIf`'s condition.
    Condition,
    /// A transfer's source.
    TransferSource,
    /// A transfer's destination.
    TransferDestination,
}

/// What is wrong with a binding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BindingProblem {
    /// The slot names an input or output that does not exist.
    NoSuchSlot {
        /// The slot.
        slot: Slot,
        /// Inputs or outputs the entry has.
        count: usize,
    },
    /// The range runs past the slot's end.
    OutOfRange {
        /// The slot.
        slot: Slot,
        /// Offset recorded.
        offset: u64,
        /// Length recorded.
        length: u64,
        /// The slot's size.
        size: u64,
    },
    /// The command writes a slot that is read-only (an input or the constants).
    ReadOnly {
        /// The slot.
        slot: Slot,
    },
}

pub(crate) struct ShowSlot(pub Slot);

impl fmt::Display for ShowSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Slot::Arena => f.write_str("arena"),
            Slot::Constants => f.write_str("constants"),
            Slot::Input(i) => write!(f, "input {i}"),
            Slot::Output(i) => write!(f, "output {i}"),
        }
    }
}

impl fmt::Display for BindingRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindingRole::Dispatch(i) => write!(f, "binding {i}"),
            BindingRole::CopySource => f.write_str("copy source"),
            BindingRole::CopyDestination => f.write_str("copy destination"),
            BindingRole::FillDestination => f.write_str("fill destination"),
            BindingRole::CollectiveSource(i) => write!(f, "collective part {i} source"),
            BindingRole::CollectiveDestination(i) => write!(f, "collective part {i} destination"),
            BindingRole::Condition => f.write_str("skip condition"),
            BindingRole::TransferSource => f.write_str("transfer source"),
            BindingRole::TransferDestination => f.write_str("transfer destination"),
        }
    }
}

impl fmt::Display for BindingProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BindingProblem::NoSuchSlot { slot, count } => {
                write!(f, "names {} but there are {count}", ShowSlot(*slot))
            }
            BindingProblem::OutOfRange { slot, offset, length, size } => {
                write!(f, "{} bytes {offset}..{offset}+{length} run past its {size} bytes", ShowSlot(*slot))
            }
            BindingProblem::ReadOnly { slot } => write!(f, "writes {}, which is read-only", ShowSlot(*slot)),
        }
    }
}

impl fmt::Display for CommandProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CommandProblem::KernelIndex { kernel, count } => {
                write!(f, "kernel {kernel} does not exist ({count} kernels)")
            }
            CommandProblem::DeviceIndex { device, count } => {
                write!(f, "device {device} does not exist ({count} devices)")
            }
            CommandProblem::UnsupportedDevice { device, name, driver } => match driver {
                DeviceKind::Cpu => write!(f, "device {device} ({name_}) is not a CPU; this runtime drives CPUs only", name_ = Name(name)),
                DeviceKind::Cuda => write!(f, "device {device} ({name_}) is not a CUDA device; the CUDA runtime drives CUDA devices only", name_ = Name(name)),
            },
            CommandProblem::NoVariantForDevice { kernel, kind } => {
                write!(f, "kernel {kernel} has no variant for a {} device", kind_name(*kind))
            }
            CommandProblem::LaunchParams { kernel, variant, params, bindings } => write!(
                f,
                "kernel {kernel}, variant {variant}: its launch takes {params} parameters, the dispatch has {bindings} bindings"
            ),
            CommandProblem::PushConstants { count } => {
                write!(f, "{count} push constants, which kernel ABI 1.x cannot pass")
            }
            CommandProblem::Binding { role, problem } => write!(f, "{role} {problem}"),
            CommandProblem::CopyLengths { src, dst } => write!(f, "copies {src} bytes into {dst}"),
            CommandProblem::FillPatternLen { len } => write!(f, "fill pattern of {len} bytes (1, 2, 4 or 8 allowed)"),
            CommandProblem::Collective { why } => write!(f, "collective: {why}"),
            CommandProblem::CollectiveUnsupported => {
                f.write_str("collective commands are not supported by this driver (multi-GPU NCCL is not built yet)")
            }
            CommandProblem::ConditionBytes { length } => write!(
                f,
                "skip condition of {length} bytes (1 to {} allowed)",
                kiln_module::program::MAX_CONDITION_BYTES
            ),
            CommandProblem::SkipPastEnd { count, remaining } => {
                write!(f, "skips {count} commands, {remaining} follow it")
            }
            CommandProblem::Segment { why } => write!(f, "heterogeneous plan: {why}"),
            CommandProblem::HostSlot { device, slot } => {
                write!(f, "names {slot:?} for device {device}: inputs and outputs are the host's (device 0)")
            }
        }
    }
}

/// What is wrong with a variant's condition ([`VerifyError::Condition`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConditionProblem {
    /// CPU feature bits that [`kiln_module::program::CpuFeature`] does not define.
    UnknownCpuFeatures {
        /// The unknown bits.
        bits: u64,
    },
    /// A CPU-features condition with no feature (write "always" instead).
    NoCpuFeatures,
    /// A condition for one kind of device on an executable for another.
    WrongDevice {
        /// The kind the condition is about.
        condition: DeviceKind,
        /// The kind the executable is for.
        executable: DeviceKind,
    },
    /// A compute capability of major version 0.
    CudaArch {
        /// The `sm` number recorded (major·10 + minor).
        sm: u32,
    },
    /// A CUDA variant with a grid of its own too large for a launch.
    CudaWorkgroups {
        /// The count recorded.
        workgroups: u64,
    },
}

impl fmt::Display for ConditionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConditionProblem::UnknownCpuFeatures { bits } => {
                write!(
                    f,
                    "CPU feature bits {bits:#x} are not defined by artifact format {}",
                    kiln_module::FORMAT_VERSION
                )
            }
            ConditionProblem::NoCpuFeatures => f.write_str("a CPU-features condition names no feature"),
            ConditionProblem::WrongDevice { condition, executable } => {
                write!(f, "a {} condition on a {} executable", kind_name(*condition), kind_name(*executable))
            }
            ConditionProblem::CudaArch { sm } => write!(f, "compute capability sm_{sm} does not exist"),
            ConditionProblem::CudaWorkgroups { workgroups } => {
                write!(f, "a CUDA variant with a grid of {workgroups} blocks, more than a launch takes")
            }
        }
    }
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VerifyError::Command { entry, command, problem } => write!(f, "entry {entry_}, command {command}: {problem}", entry_ = Name(entry)),
            VerifyError::Buffer { entry, buffer, problem } => write!(f, "entry {entry_}, buffer {buffer_}: {problem}", entry_ = Name(entry), buffer_ = Name(buffer)),
            VerifyError::TensorBytes { entry, tensor, recorded, expected } => match expected {
                Some(e) => write!(f, "entry {entry_}, tensor {tensor_}: recorded as {recorded} bytes, its dtype and shape give {e}", entry_ = Name(entry), tensor_ = Name(tensor)),
                None => write!(f, "entry {entry_}, tensor {tensor_}: its shape overflows 64-bit sizes", entry_ = Name(entry), tensor_ = Name(tensor)),
            },
            VerifyError::UnknownDtype { entry, tensor, dtype } => {
                write!(f, "entry {entry_}, tensor {tensor_}: dtype code {dtype} is not one kiln runs", entry_ = Name(entry), tensor_ = Name(tensor))
            }
            VerifyError::DeviceArenas { entry, why } => write!(f, "entry {}: device arenas: {why}", Name(entry)),
            VerifyError::Arena { entry, size, align } => write!(
                f,
                "entry {entry_}: arena of {size} bytes aligned to {align} (alignment must be a power of two up to {})",
                crate::MAX_ARENA_ALIGN
            , entry_ = Name(entry)),
            VerifyError::Extent { entry, extent, problem } => {
                write!(f, "entry {entry_}, extent {extent_}: {problem}", entry_ = Name(entry), extent_ = Name(extent))
            }
            VerifyError::Prologue { entry, prologue, command, why } => {
                write!(f, "entry {}: prologue of {prologue} commands: ", Name(entry))?;
                if let Some(i) = command {
                    write!(f, "command {i}: ")?;
                }
                f.write_str(why)
            }
            VerifyError::NoVariants { kernel } => write!(f, "kernel {kernel_} has no variants", kernel_ = Name(kernel)),
            VerifyError::Variant { kernel, variant, executable, entry } => {
                write!(f, "kernel {kernel_}, variant {variant}: executable {executable} entry {entry} does not exist", kernel_ = Name(kernel))
            }
            VerifyError::Condition { kernel, variant, problem } => {
                write!(f, "kernel {kernel_}, variant {variant}: {problem}", kernel_ = Name(kernel))
            }
            VerifyError::Symbol { executable, name, offset, code_len } => {
                write!(f, "executable {executable}: symbol {name_} at {offset} lies outside its {code_len} bytes of code", name_ = Name(name))
            }
            VerifyError::Launches { executable, launches, expected } => {
                write!(f, "executable {executable}: {launches} launch records, {expected} expected (one per entry of a CUDA executable, none for a CPU)")
            }
            VerifyError::Launch { executable, entry, block, shared } => write!(
                f,
                "executable {executable}, entry {entry}: launch of {block} threads per block and {shared} bytes of shared memory (blocks are a multiple of 32 from 32 to 1024, shared memory at most {} bytes)",
                crate::verify::MAX_CUDA_SHARED
            ),
            VerifyError::Reloc { executable, index, offset, target, code_len } => write!(
                f,
                "executable {executable}, relocation {index}: patch at {offset} or target {target} lies outside its {code_len} bytes of code"
            ),
            VerifyError::Architectures { executable } => {
                write!(f, "executable {executable}: its features name more than one CPU architecture")
            }
            VerifyError::RelocKind { executable, index, kind, arch } => {
                write!(f, "executable {executable}, relocation {index}: a {kind} relocation in {arch} code")
            }
        }
    }
}
