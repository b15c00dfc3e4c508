//! Encoding and zero-copy decoding of the signature, plan, executables, constants and
//! debug sections (see [`crate::program`]).
//!
//! [`write_program`] turns a [`Program`] into a complete `.kiln` file; [`read_program`]
//! decodes the sections of a parsed [`Module`] into a [`ProgramView`] that borrows names,
//! code and constants from the file (nothing large is copied). Decoding checks every
//! count, length and tag and reports a [`SectionError`] naming the section and the byte
//! offset in the file; counts are capped by the bytes that remain, so a hostile count
//! cannot make the decoder allocate more than a small multiple of the section's size.
//!
//! # Encoding
//!
//! Integers are unsigned LEB128 varints (`uv`: 7 bits a byte, low group first, at most
//! 10 bytes, no redundant trailing zero groups); `sv` is a zig-zag signed varint
//! (`(n << 1) ^ (n >> 63)` as `uv`); `str` is `uv` byte length + UTF-8; `list<T>` is
//! `uv` count + the elements. Fields marked `u32` are `uv` values that must fit 32 bits.
//! Every section must be consumed exactly: trailing bytes are an error.
//!
//! ```text
//! signature (kind 1, align 8):
//!   list<entry>        entry  = str name, list<tensor> inputs, list<tensor> outputs
//!                      tensor = str name, u32 dtype (ONNX code), list<uv> dims, uv bytes
//! plan (kind 2, align 8):
//!   list<device>       device = uv kind (0 cpu, 1 cuda), str name
//!   list<entry>        (as many as the signature has, same order)
//!                      entry  = uv arena_size, uv arena_align, list<command>, list<buffer>
//!   command = uv tag, then
//!     0 dispatch: u32 kernel, u32 device, uv workgroups, list<binding>, list<u32> push_constants,
//!                 uv work_ns (format 1.1 on; absent from 1.0 files, read as 0)
//!     1 barrier
//!     2 copy:     binding src, binding dst
//!     3 fill:     binding dst, uv pattern_len (≤ 255), uv pattern
//!     4 all-reduce (format 1.4 on): u32 dtype, list<part>
//!     5 all-gather (format 1.4 on): uv outer, list<part>
//!     7 segment  (format 1.8 on): u32 device, u32 count, list<u32> waits
//!     8 transfer (format 1.8 on): u32 src_device, binding src, u32 dst_device, binding dst
//!   part    = u32 device, binding src, binding dst
//!   binding = uv slot, uv offset, uv length
//!     slot: 0 arena, 1 constants, 2 + 4·i input i, 3 + 4·i output i  (i ≤ u32::MAX)
//!   buffer  = str name, binding, u32 first, u32 last
//!   entry (format 1.5 on) ends with list<extent>
//!   extent  = str name, binding, uv bound, list<(u32 output, u32 axis)>
//!   entry (format 1.6 on) then ends with list<bounded>
//!   bounded = u32 input, u32 axis, uv min, uv bound, binding staging, binding extent
//!   entry (format 1.7 on) then ends with list<rows>
//!   rows    = u32 command, u32 dim, uv outer, uv span, uv unit, uv inner
//!   entry (format 1.8 on) then ends with list<uv> device_arenas (devices 1.. in order)
//!   entry (format 1.9 on) then ends with uv prologue (leading commands that read no input)
//! executables (kind 3, align 8):
//!   list<executable>   executable = uv device kind, uv features, list<(str name, uv offset)> entries,
//!                                   list<reloc>, list<launch> (format 1.3 on; absent from
//!                                   older files, read as empty), uv code_len, code bytes
//!                      reloc = uv offset, uv kind (0 pc32, 1 abs64, 2 aarch64 call26,
//!                              3 aarch64 adr_prel_pg_hi21, 4 aarch64 add_abs_lo12_nc,
//!                              5 riscv call_plt, 6 riscv pcrel_hi20, 7 riscv pcrel_lo12_i:
//!                              kinds 2 to 7 in aarch64 and riscv64 executables only, which a
//!                              1.5 reader older than them refuses as an unknown tag),
//!                              uv target, sv addend
//!                      launch = u32 block, u32 shared, u32 params (CUDA: one per entry,
//!                               in entry order; a CPU executable has none)
//!   list<kernel>       kernel = str name, list<variant>,
//!                               uv class (format 1.2 on: 0 unknown, 1 contraction, 2 window,
//!                               3 rows, 4 movement, 5 elementwise, 6 general, 7 attention; absent from
//!                               1.0 and 1.1 files; 0 and absent read as `None`; the runtime ignores it)
//!                      variant = u32 executable, u32 entry, condition, uv workgroups
//!                                (format 1.5 on; before it: u32 executable, u32 entry,
//!                                uv features, read as a CPU-features condition, or
//!                                always where 0, and workgroups 0)
//!                      condition = uv tag, then
//!                        0 always
//!                        1 cpu features: uv bits (of `CpuFeature`)
//!                        2 cuda: uv sm (major·10 + minor), uv specific (0 or 1: the `a`
//!                          of sm_90a, exactly this compute capability)
//!                      workgroups: 0 for the dispatch's own count, else the count every
//!                                  dispatch of the kernel runs with this variant
//! constants (kind 4, align 64): the constant pool's bytes, nothing else
//! external-weights (kind 5, align 8): str file, uv size, hash as 8 bytes little-endian
//! debug (kind 6, align 8, optional): list<str> kernel_sources, str source
//! ```
//!
//! Exactly one of `constants` and `external-weights` is present. Sections of kinds this
//! reader does not know are ignored. Semantic checks (indices in range, bindings inside
//! their slots, …) are the runtime's load-time verifier's job; this module checks the
//! encoding.

use crate::abi::ABI_VERSION;
use crate::format::{SectionKind, Version};
use crate::program::{
    Binding, BoundedDesc, BoundedRows, BufferDesc, CollectivePart, Command, Condition, Constants, CudaArch, DebugInfo,
    Device, DeviceKind, EntryPoint, Executable, ExtentDesc, Kernel, KernelClass, Launch, Program, Reloc, RelocKind,
    Slot, TensorDesc, Variant,
};
use crate::reader::Module;
use crate::writer::ModuleWriter;
use alloc::string::ToString;
use alloc::vec::Vec;
use core::fmt;

/// Alignment of the constants section (and so of the constant pool in the file).
pub const CONSTANTS_ALIGN: u32 = 64;
const ALIGN: u32 = 8;

// ---------------------------------------------------------------------------------------
// Hash
// ---------------------------------------------------------------------------------------

const P1: u64 = 0x9E37_79B1_85EB_CA87;
const P2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const P3: u64 = 0x1656_67B1_9E37_79F9;
const P4: u64 = 0x85EB_CA77_C2B2_AE63;
const P5: u64 = 0x27D4_EB2F_1656_67C5;

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

fn le32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

fn xxh_round(acc: u64, input: u64) -> u64 {
    acc.wrapping_add(input.wrapping_mul(P2)).rotate_left(31).wrapping_mul(P1)
}

fn xxh_merge(acc: u64, v: u64) -> u64 {
    (acc ^ xxh_round(0, v)).wrapping_mul(P1).wrapping_add(P4)
}

/// The hash that binds an external weights file to its artifact: XXH64 with seed 0
/// (the published xxHash 64-bit algorithm; four independent lanes over 32-byte stripes,
/// several GB/s). Not cryptographic: it detects a wrong or corrupted file, not an attack.
pub fn weights_hash(bytes: &[u8]) -> u64 {
    let len = bytes.len() as u64;
    let mut rest = bytes;
    let mut h = if bytes.len() >= 32 {
        let mut v = [P1.wrapping_add(P2), P2, 0, 0u64.wrapping_sub(P1)];
        let mut stripes = bytes.chunks_exact(32);
        for s in &mut stripes {
            v[0] = xxh_round(v[0], le64(&s[0..]));
            v[1] = xxh_round(v[1], le64(&s[8..]));
            v[2] = xxh_round(v[2], le64(&s[16..]));
            v[3] = xxh_round(v[3], le64(&s[24..]));
        }
        rest = stripes.remainder();
        let mut h = v[0]
            .rotate_left(1)
            .wrapping_add(v[1].rotate_left(7))
            .wrapping_add(v[2].rotate_left(12))
            .wrapping_add(v[3].rotate_left(18));
        for lane in v {
            h = xxh_merge(h, lane);
        }
        h
    } else {
        P5
    };
    h = h.wrapping_add(len);
    let mut words = rest.chunks_exact(8);
    for w in &mut words {
        h ^= xxh_round(0, le64(w));
        h = h.rotate_left(27).wrapping_mul(P1).wrapping_add(P4);
    }
    let mut rest = words.remainder();
    if rest.len() >= 4 {
        h ^= u64::from(le32(rest)).wrapping_mul(P1);
        h = h.rotate_left(23).wrapping_mul(P2).wrapping_add(P3);
        rest = &rest[4..];
    }
    for &b in rest {
        h ^= u64::from(b).wrapping_mul(P5);
        h = h.rotate_left(11).wrapping_mul(P1);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(P2);
    h ^= h >> 29;
    h = h.wrapping_mul(P3);
    h ^ (h >> 32)
}

// ---------------------------------------------------------------------------------------
// Views
// ---------------------------------------------------------------------------------------

/// A decoded artifact borrowing the file: names, code and constants are slices of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramView<'a> {
    /// Device table.
    pub devices: Vec<DeviceView<'a>>,
    /// Entry points (signature and plan merged).
    pub entries: Vec<EntryView<'a>>,
    /// Kernel table.
    pub kernels: Vec<KernelView<'a>>,
    /// Executables.
    pub executables: Vec<ExecutableView<'a>>,
    /// The constant pool.
    pub constants: ConstantsView<'a>,
    /// Debug names, when the section is present.
    pub debug: Option<DebugView<'a>>,
}

/// A device of the device table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceView<'a> {
    /// What kind of device.
    pub kind: DeviceKind,
    /// Its name.
    pub name: &'a str,
}

/// One tensor of a signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorView<'a> {
    /// Name in the source model.
    pub name: &'a str,
    /// ONNX dtype code.
    pub dtype: u32,
    /// Dimensions.
    pub dims: Vec<u64>,
    /// Bytes the tensor occupies.
    pub bytes: u64,
}

/// A buffer of an entry's memory map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferView<'a> {
    /// Value name.
    pub name: &'a str,
    /// Where it lives.
    pub binding: Binding,
    /// First command index at which it is live.
    pub first: u32,
    /// Last command index at which it is live.
    pub last: u32,
}

/// An entry point: its signature and plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryView<'a> {
    /// Name.
    pub name: &'a str,
    /// Inputs in call order.
    pub inputs: Vec<TensorView<'a>>,
    /// Outputs in call order.
    pub outputs: Vec<TensorView<'a>>,
    /// Arena bytes.
    pub arena_size: u64,
    /// Arena base alignment.
    pub arena_align: u64,
    /// Commands in order.
    pub commands: Vec<Command>,
    /// Memory map.
    pub buffers: Vec<BufferView<'a>>,
    /// Data-dependent extents (format 1.5 on).
    pub extents: Vec<ExtentView<'a>>,
    /// Bounded input dimensions (format 1.6 on).
    pub bounded: Vec<BoundedDesc>,
    /// Dispatches whose workgroups shrink with a bounded dimension's extent (format 1.7 on).
    pub bounded_rows: Vec<BoundedRows>,
    /// Arena bytes of devices 1.. (format 1.8 on; see [`EntryPoint::device_arenas`]).
    pub device_arenas: Vec<u64>,
    /// Leading commands that read no input (format 1.9 on; see [`EntryPoint::prologue`]).
    pub prologue: u32,
}

/// A data-dependent extent of an entry (see [`ExtentDesc`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtentView<'a> {
    /// What it counts.
    pub name: &'a str,
    /// Where the plan writes it.
    pub binding: Binding,
    /// Its bound.
    pub bound: u64,
    /// The outputs it sizes: (output index, axis).
    pub outputs: Vec<(u32, u32)>,
}

/// A kernel and its variants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelView<'a> {
    /// Name.
    pub name: &'a str,
    /// Variants in order of preference.
    pub variants: Vec<Variant>,
    /// The compiler's class of the kernel (`None` before format 1.2, or recorded as unknown).
    pub class: Option<KernelClass>,
}

/// An executable; `code` borrows the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecutableView<'a> {
    /// Device kind.
    pub device: DeviceKind,
    /// Required CPU features.
    pub features: u64,
    /// Code bytes (a slice of the file).
    pub code: &'a [u8],
    /// Entry symbols: name and code offset.
    pub entries: Vec<(&'a str, u64)>,
    /// Relocations.
    pub relocs: Vec<Reloc>,
    /// Launch records, one per entry of a CUDA executable (empty for a CPU, and before
    /// format 1.3).
    pub launches: Vec<Launch>,
}

/// Where the constant pool lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstantsView<'a> {
    /// In the file (a slice of it, 64-byte aligned relative to the file's start).
    Embedded(&'a [u8]),
    /// In a separate file.
    External {
        /// File name recorded by the compiler.
        file: &'a str,
        /// Its size in bytes.
        size: u64,
        /// Its [`weights_hash`].
        hash: u64,
    },
}

/// Debug names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugView<'a> {
    /// Per kernel: the source ops it was formed from.
    pub kernel_sources: Vec<&'a str>,
    /// Source model file name.
    pub source: &'a str,
}

fn tensor_owned(t: &TensorView<'_>) -> TensorDesc {
    TensorDesc { name: t.name.to_string(), dtype: t.dtype, dims: t.dims.clone(), bytes: t.bytes }
}

impl ProgramView<'_> {
    /// An owned copy (copies code and embedded constants).
    pub fn to_program(&self) -> Program {
        Program {
            devices: self.devices.iter().map(|d| Device { kind: d.kind, name: d.name.to_string() }).collect(),
            entries: self
                .entries
                .iter()
                .map(|e| EntryPoint {
                    bounded: e.bounded.clone(),
                    bounded_rows: e.bounded_rows.clone(),
                    device_arenas: e.device_arenas.clone(),
                    prologue: e.prologue,
                    extents: e
                        .extents
                        .iter()
                        .map(|x| ExtentDesc {
                            name: x.name.to_string(),
                            binding: x.binding,
                            bound: x.bound,
                            outputs: x.outputs.clone(),
                        })
                        .collect(),
                    name: e.name.to_string(),
                    inputs: e.inputs.iter().map(tensor_owned).collect(),
                    outputs: e.outputs.iter().map(tensor_owned).collect(),
                    arena_size: e.arena_size,
                    arena_align: e.arena_align,
                    commands: e.commands.clone(),
                    buffers: e
                        .buffers
                        .iter()
                        .map(|b| BufferDesc {
                            name: b.name.to_string(),
                            binding: b.binding,
                            first: b.first,
                            last: b.last,
                        })
                        .collect(),
                })
                .collect(),
            kernels: self
                .kernels
                .iter()
                .map(|k| Kernel { name: k.name.to_string(), variants: k.variants.clone(), class: k.class })
                .collect(),
            executables: self
                .executables
                .iter()
                .map(|x| Executable {
                    device: x.device,
                    features: x.features,
                    code: x.code.to_vec(),
                    entries: x.entries.iter().map(|(n, o)| (n.to_string(), *o)).collect(),
                    relocs: x.relocs.clone(),
                    launches: x.launches.clone(),
                })
                .collect(),
            constants: match self.constants {
                ConstantsView::Embedded(b) => Constants::Embedded(b.to_vec()),
                ConstantsView::External { file, size, hash } => {
                    Constants::External { file: file.to_string(), size, hash }
                }
            },
            debug: self.debug.as_ref().map(|d| DebugInfo {
                kernel_sources: d.kernel_sources.iter().map(|s| s.to_string()).collect(),
                source: d.source.to_string(),
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// Why a section does not decode. `offset` is a byte offset in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SectionError {
    /// The section.
    pub section: SectionKind,
    /// Byte offset in the file where the problem was found.
    pub offset: u64,
    /// Byte offset of the problem within the section.
    pub section_offset: u64,
    /// What is wrong.
    pub problem: SectionProblem,
}

/// What is wrong with a section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SectionProblem {
    /// A required section is absent.
    Missing,
    /// Both a constants and an external-weights section are present.
    ConflictsWith(SectionKind),
    /// The section ends inside a field.
    Truncated {
        /// The field being read.
        field: &'static str,
    },
    /// A varint runs past 64 bits or has a redundant trailing zero group.
    BadVarint {
        /// The field being read.
        field: &'static str,
    },
    /// A value does not fit its field.
    TooLarge {
        /// The field.
        field: &'static str,
        /// The value read.
        value: u64,
        /// The largest allowed.
        max: u64,
    },
    /// A count exceeds what the remaining bytes could hold.
    CountTooLarge {
        /// The list.
        field: &'static str,
        /// The count read.
        count: u64,
        /// Bytes left in the section.
        remaining: u64,
    },
    /// A string is not UTF-8.
    BadUtf8 {
        /// The field.
        field: &'static str,
    },
    /// An enum tag this reader does not know.
    UnknownTag {
        /// The field.
        field: &'static str,
        /// The tag read.
        tag: u64,
    },
    /// The plan has a different number of entry points than the signature.
    EntryCountMismatch {
        /// Entries in the signature.
        signature: u64,
        /// Entries in the plan.
        plan: u64,
    },
    /// Bytes left over after the section's last field.
    TrailingBytes {
        /// How many.
        count: u64,
    },
}

impl fmt::Display for SectionProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SectionProblem::Missing => f.write_str("the section is missing"),
            SectionProblem::ConflictsWith(k) => write!(f, "a {k} section is present too (exactly one is allowed)"),
            SectionProblem::Truncated { field } => write!(f, "the section ends inside {field}"),
            SectionProblem::BadVarint { field } => write!(f, "{field}: varint longer than 64 bits or not minimal"),
            SectionProblem::TooLarge { field, value, max } => write!(f, "{field} is {value}, at most {max} allowed"),
            SectionProblem::CountTooLarge { field, count, remaining } => {
                write!(f, "{field}: count {count} cannot fit in the {remaining} bytes left")
            }
            SectionProblem::BadUtf8 { field } => write!(f, "{field} is not valid UTF-8"),
            SectionProblem::UnknownTag { field, tag } => write!(f, "unknown {field} {tag}"),
            SectionProblem::EntryCountMismatch { signature, plan } => {
                write!(f, "the signature has {signature} entry points, the plan {plan}")
            }
            SectionProblem::TrailingBytes { count } => write!(f, "{count} unexpected bytes after the last field"),
        }
    }
}

impl fmt::Display for SectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} section, file offset {} (byte {} of the section): {}",
            self.section, self.offset, self.section_offset, self.problem
        )
    }
}

impl core::error::Error for SectionError {}

// ---------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Enc(Vec<u8>);

impl Enc {
    fn uv(&mut self, mut v: u64) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.0.push(b);
                return;
            }
            self.0.push(b | 0x80);
        }
    }
    fn sv(&mut self, v: i64) {
        self.uv(((v << 1) ^ (v >> 63)) as u64);
    }
    fn len(&mut self, n: usize) {
        self.uv(n as u64);
    }
    /// The count of `items`, then each written by `item`.
    fn list<T>(&mut self, items: &[T], mut item: impl FnMut(&mut Self, &T)) {
        self.len(items.len());
        for x in items {
            item(self, x);
        }
    }
    fn str(&mut self, s: &str) {
        self.len(s.len());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn tensor(&mut self, t: &TensorDesc) {
        self.str(&t.name);
        self.uv(t.dtype.into());
        self.list(&t.dims, |e, &d| e.uv(d));
        self.uv(t.bytes);
    }
    fn binding(&mut self, b: &Binding) {
        self.uv(match b.slot {
            Slot::Arena => 0,
            Slot::Constants => 1,
            Slot::Input(i) => 2 + 4 * u64::from(i),
            Slot::Output(i) => 3 + 4 * u64::from(i),
        });
        self.uv(b.offset);
        self.uv(b.length);
    }
    fn part(&mut self, p: &CollectivePart) {
        self.uv(p.device.into());
        self.binding(&p.src);
        self.binding(&p.dst);
    }
    fn device_kind(&mut self, k: DeviceKind) {
        self.uv(match k {
            DeviceKind::Cpu => 0,
            DeviceKind::Cuda => 1,
        });
    }
}

fn signature_bytes(p: &Program) -> Vec<u8> {
    let mut e = Enc::default();
    e.list(&p.entries, |e, ep| {
        e.str(&ep.name);
        for list in [&ep.inputs, &ep.outputs] {
            e.list(list, |e, t| e.tensor(t));
        }
    });
    e.0
}

fn plan_bytes(p: &Program) -> Vec<u8> {
    let bounded = has_bounded(p);
    let hetero = has_segments(p);
    let prologue = has_prologue(p);
    let mut e = Enc::default();
    e.list(&p.devices, |e, d| {
        e.device_kind(d.kind);
        e.str(&d.name);
    });
    e.list(&p.entries, |e, ep| {
        e.uv(ep.arena_size);
        e.uv(ep.arena_align);
        e.list(&ep.commands, |e, c| match c {
            Command::Dispatch { kernel, device, workgroups, bindings, push_constants, work_ns } => {
                e.uv(0);
                e.uv((*kernel).into());
                e.uv((*device).into());
                e.uv(*workgroups);
                e.list(bindings, |e, b| e.binding(b));
                e.list(push_constants, |e, &c| e.uv(c.into()));
                e.uv(*work_ns);
            }
            Command::Barrier => e.uv(1),
            Command::Copy { src, dst } => {
                e.uv(2);
                e.binding(src);
                e.binding(dst);
            }
            Command::Fill { dst, pattern, pattern_len } => {
                e.uv(3);
                e.binding(dst);
                e.uv((*pattern_len).into());
                e.uv(*pattern);
            }
            Command::AllReduce { dtype, parts } => {
                e.uv(4);
                e.uv((*dtype).into());
                e.list(parts, Enc::part);
            }
            Command::AllGather { outer, parts } => {
                e.uv(5);
                e.uv(*outer);
                e.list(parts, Enc::part);
            }
            Command::SkipIf { cond, value, count } => {
                e.uv(6);
                e.binding(cond);
                e.uv(u64::from(*value));
                e.uv((*count).into());
            }
            Command::Segment { device, count, waits } => {
                e.uv(7);
                e.uv((*device).into());
                e.uv((*count).into());
                e.list(waits, |e, &w| e.uv(w.into()));
            }
            Command::Transfer { src_device, src, dst_device, dst } => {
                e.uv(8);
                e.uv((*src_device).into());
                e.binding(src);
                e.uv((*dst_device).into());
                e.binding(dst);
            }
        });
        e.list(&ep.buffers, |e, b| {
            e.str(&b.name);
            e.binding(&b.binding);
            e.uv(b.first.into());
            e.uv(b.last.into());
        });
        e.list(&ep.extents, |e, x| {
            e.str(&x.name);
            e.binding(&x.binding);
            e.uv(x.bound);
            e.list(&x.outputs, |e, &(o, a)| {
                e.uv(o.into());
                e.uv(a.into());
            });
        });
        if bounded || hetero || prologue {
            e.list(&ep.bounded, |e, b| {
                e.uv(b.input.into());
                e.uv(b.axis.into());
                e.uv(b.min);
                e.uv(b.bound);
                e.binding(&b.staging);
                e.binding(&b.extent);
            });
            e.list(&ep.bounded_rows, |e, r| {
                e.uv(r.command.into());
                e.uv(r.dim.into());
                e.uv(r.outer);
                e.uv(r.span);
                e.uv(r.unit);
                e.uv(r.inner);
            });
        }
        if hetero || prologue {
            e.list(&ep.device_arenas, |e, &a| e.uv(a));
        }
        if prologue {
            e.uv(ep.prologue.into());
        }
    });
    e.0
}

/// Relocation kinds by their tag on disk.
const RELOC_KINDS: [RelocKind; 8] = [
    RelocKind::Pc32,
    RelocKind::Abs64,
    RelocKind::Aarch64Call26,
    RelocKind::Aarch64AdrPrelPgHi21,
    RelocKind::Aarch64AddAbsLo12Nc,
    RelocKind::RiscvCallPlt,
    RelocKind::RiscvPcrelHi20,
    RelocKind::RiscvPcrelLo12I,
];

fn reloc_tag(kind: RelocKind) -> u64 {
    match kind {
        RelocKind::Pc32 => 0,
        RelocKind::Abs64 => 1,
        RelocKind::Aarch64Call26 => 2,
        RelocKind::Aarch64AdrPrelPgHi21 => 3,
        RelocKind::Aarch64AddAbsLo12Nc => 4,
        RelocKind::RiscvCallPlt => 5,
        RelocKind::RiscvPcrelHi20 => 6,
        RelocKind::RiscvPcrelLo12I => 7,
    }
}

fn executables_bytes(p: &Program) -> Vec<u8> {
    let mut e = Enc::default();
    e.list(&p.executables, |e, x| {
        e.device_kind(x.device);
        e.uv(x.features);
        e.list(&x.entries, |e, (name, off)| {
            e.str(name);
            e.uv(*off);
        });
        e.list(&x.relocs, |e, r| {
            e.uv(r.offset);
            e.uv(reloc_tag(r.kind));
            e.uv(r.target);
            e.sv(r.addend);
        });
        e.list(&x.launches, |e, l| {
            e.uv(l.block.into());
            e.uv(l.shared.into());
            e.uv(l.params.into());
        });
        e.len(x.code.len());
        e.0.extend_from_slice(&x.code);
    });
    e.list(&p.kernels, |e, k| {
        e.str(&k.name);
        e.list(&k.variants, |e, v| {
            e.uv(v.executable.into());
            e.uv(v.entry.into());
            match v.condition {
                Condition::Always => e.uv(0),
                Condition::CpuFeatures(bits) => {
                    e.uv(1);
                    e.uv(bits);
                }
                Condition::Cuda(arch) => {
                    e.uv(2);
                    e.uv(arch.sm().into());
                    e.uv(arch.specific.into());
                }
            }
            e.uv(v.workgroups);
        });
        e.uv(k.class.map_or(0, KernelClass::code).into());
    });
    e.0
}

fn debug_bytes(d: &DebugInfo) -> Vec<u8> {
    let mut e = Enc::default();
    e.list(&d.kernel_sources, |e, s| e.str(s));
    e.str(&d.source);
    e.0
}

/// Whether an entry of `p` has bounded input dimensions (written as format 1.7; other
/// programs as 1.5).
fn has_bounded(p: &Program) -> bool {
    p.entries.iter().any(|e| !e.bounded.is_empty())
}

/// Whether `p` is a heterogeneous plan (segments: written as format 1.8).
fn has_segments(p: &Program) -> bool {
    p.entries.iter().any(|e| {
        !e.device_arenas.is_empty()
            || e.commands.iter().any(|c| matches!(c, Command::Segment { .. } | Command::Transfer { .. }))
    })
}

/// Whether an entry of `p` has an instantiation prologue (written as format 1.9).
fn has_prologue(p: &Program) -> bool {
    p.entries.iter().any(|e| e.prologue > 0)
}

/// Encodes `p` as a complete `.kiln` file needing runtime ABI [`ABI_VERSION`].
pub fn write_program(p: &Program) -> Vec<u8> {
    let format = if has_prologue(p) {
        crate::format::FORMAT_VERSION
    } else if has_segments(p) {
        crate::format::HETERO_FORMAT_VERSION
    } else if has_bounded(p) {
        crate::format::BOUNDED_FORMAT_VERSION
    } else {
        crate::format::STATIC_FORMAT_VERSION
    };
    let mut w = ModuleWriter::new(ABI_VERSION).with_format(format);
    let mut sections = Vec::new();
    sections.push((SectionKind::Signature, ALIGN, signature_bytes(p)));
    sections.push((SectionKind::Plan, ALIGN, plan_bytes(p)));
    sections.push((SectionKind::Executables, ALIGN, executables_bytes(p)));
    match &p.constants {
        Constants::Embedded(bytes) => sections.push((SectionKind::Constants, CONSTANTS_ALIGN, bytes.clone())),
        Constants::External { file, size, hash } => {
            let mut e = Enc::default();
            e.str(file);
            e.uv(*size);
            e.0.extend_from_slice(&hash.to_le_bytes());
            sections.push((SectionKind::ExternalWeights, ALIGN, e.0));
        }
    }
    if let Some(d) = &p.debug {
        sections.push((SectionKind::Debug, ALIGN, debug_bytes(d)));
    }
    for (kind, align, bytes) in sections {
        if let Err(e) = w.add(kind, align, bytes) {
            // Distinct fixed kinds and power-of-two alignments: the writer cannot refuse.
            unreachable!("section writer refused a fixed section: {e}");
        }
    }
    w.finish()
}

// ---------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------

struct Dec<'a> {
    data: &'a [u8],
    pos: usize,
    kind: SectionKind,
    base: u64,
    /// The file's format version (what a section holds may depend on it).
    format: Version,
}

type R<T> = Result<T, SectionError>;

impl<'a> Dec<'a> {
    fn new(kind: SectionKind, base: u64, data: &'a [u8], format: Version) -> Dec<'a> {
        Dec { data, pos: 0, kind, base, format }
    }

    fn err_at(&self, pos: usize, problem: SectionProblem) -> SectionError {
        SectionError { section: self.kind, offset: self.base + pos as u64, section_offset: pos as u64, problem }
    }

    fn err(&self, problem: SectionProblem) -> SectionError {
        self.err_at(self.pos, problem)
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn bytes(&mut self, n: u64, field: &'static str) -> R<&'a [u8]> {
        if n > self.remaining() as u64 {
            return Err(self.err(SectionProblem::Truncated { field }));
        }
        let s = &self.data[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(s)
    }

    fn uv(&mut self, field: &'static str) -> R<u64> {
        let start = self.pos;
        let mut v = 0u64;
        let mut shift = 0u32;
        loop {
            let Some(&b) = self.data.get(self.pos) else {
                return Err(self.err_at(start, SectionProblem::Truncated { field }));
            };
            self.pos += 1;
            if shift == 63 && b > 1 {
                return Err(self.err_at(start, SectionProblem::BadVarint { field }));
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                if b == 0 && shift > 0 {
                    return Err(self.err_at(start, SectionProblem::BadVarint { field }));
                }
                return Ok(v);
            }
            shift += 7;
        }
    }

    fn sv(&mut self, field: &'static str) -> R<i64> {
        let u = self.uv(field)?;
        Ok(((u >> 1) as i64) ^ -((u & 1) as i64))
    }

    fn bounded(&mut self, field: &'static str, max: u64) -> R<u64> {
        let start = self.pos;
        let v = self.uv(field)?;
        if v > max {
            return Err(self.err_at(start, SectionProblem::TooLarge { field, value: v, max }));
        }
        Ok(v)
    }

    fn u32(&mut self, field: &'static str) -> R<u32> {
        Ok(self.bounded(field, u32::MAX.into())? as u32)
    }

    /// A counted list (see [`Dec::count`]) of elements each read by `item`.
    fn list<T>(&mut self, field: &'static str, min_bytes: usize, mut item: impl FnMut(&mut Self) -> R<T>) -> R<Vec<T>> {
        let n = self.count(field, min_bytes)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push(item(self)?);
        }
        Ok(v)
    }

    /// A list the format has from minor version `since` of major 1 on (see [`Dec::list`]);
    /// empty, and nothing read, in an older file.
    fn list_since<T>(
        &mut self,
        since: u16,
        field: &'static str,
        min_bytes: usize,
        item: impl FnMut(&mut Self) -> R<T>,
    ) -> R<Vec<T>> {
        if self.format.minor >= since {
            self.list(field, min_bytes, item)
        } else {
            Ok(Vec::new())
        }
    }

    /// A list count; each element takes at least `min_bytes` bytes, so the count is capped
    /// by what remains (this bounds every allocation by the section's size).
    fn count(&mut self, field: &'static str, min_bytes: usize) -> R<usize> {
        let start = self.pos;
        let n = self.uv(field)?;
        let remaining = self.remaining() as u64;
        if n > remaining / min_bytes as u64 {
            return Err(self.err_at(start, SectionProblem::CountTooLarge { field, count: n, remaining }));
        }
        Ok(n as usize)
    }

    fn str(&mut self, field: &'static str) -> R<&'a str> {
        let n = self.uv(field)?;
        let start = self.pos;
        let b = self.bytes(n, field)?;
        core::str::from_utf8(b).map_err(|_| self.err_at(start, SectionProblem::BadUtf8 { field }))
    }

    fn tag(&mut self, field: &'static str, max: u64) -> R<u64> {
        let start = self.pos;
        let t = self.uv(field)?;
        if t > max {
            return Err(self.err_at(start, SectionProblem::UnknownTag { field, tag: t }));
        }
        Ok(t)
    }

    fn device_kind(&mut self) -> R<DeviceKind> {
        Ok(match self.tag("device kind", 1)? {
            0 => DeviceKind::Cpu,
            _ => DeviceKind::Cuda,
        })
    }

    fn tensor(&mut self) -> R<TensorView<'a>> {
        let name = self.str("tensor name")?;
        let dtype = self.u32("tensor dtype")?;
        let dims = self.list("tensor dims", 1, |d| d.uv("tensor dim"))?;
        let bytes = self.uv("tensor bytes")?;
        Ok(TensorView { name, dtype, dims, bytes })
    }

    fn tensors(&mut self, field: &'static str) -> R<Vec<TensorView<'a>>> {
        // name length, dtype, dim count, bytes: at least 4 bytes each.
        self.list(field, 4, Dec::tensor)
    }

    fn binding(&mut self) -> R<Binding> {
        let start = self.pos;
        let code = self.uv("binding slot")?;
        let slot = match code {
            0 => Slot::Arena,
            1 => Slot::Constants,
            c if c & 3 < 2 => {
                return Err(self.err_at(start, SectionProblem::UnknownTag { field: "binding slot", tag: c }))
            }
            c => {
                let index = c >> 2;
                if index > u32::MAX.into() {
                    let max = u32::MAX.into();
                    return Err(
                        self.err_at(start, SectionProblem::TooLarge { field: "binding slot index", value: index, max })
                    );
                }
                if c & 3 == 2 {
                    Slot::Input(index as u32)
                } else {
                    Slot::Output(index as u32)
                }
            }
        };
        let offset = self.uv("binding offset")?;
        let length = self.uv("binding length")?;
        Ok(Binding { slot, offset, length })
    }

    fn part(&mut self) -> R<CollectivePart> {
        let device = self.u32("collective device")?;
        let src = self.binding()?;
        let dst = self.binding()?;
        Ok(CollectivePart { device, src, dst })
    }

    fn command(&mut self) -> R<Command> {
        // Collectives (tags 4 and 5) and `SkipIf` (tag 6) exist from format 1.4 on.
        // Segments and transfers (tags 7 and 8) from format 1.8 on.
        let last = if self.format.minor >= crate::format::HETERO_MINOR {
            8
        } else if self.format.minor >= crate::format::SKIP_IF_MINOR {
            6
        } else {
            3
        };
        Ok(match self.tag("command tag", last)? {
            0 => {
                let kernel = self.u32("dispatch kernel")?;
                let device = self.u32("dispatch device")?;
                let workgroups = self.uv("dispatch workgroups")?;
                let bindings = self.list("dispatch bindings", 3, Dec::binding)?;
                let push_constants = self.list("dispatch push constants", 1, |d| d.u32("push constant"))?;
                let work_ns = if self.format.minor >= 1 { self.uv("dispatch work estimate")? } else { 0 };
                Command::Dispatch { kernel, device, workgroups, bindings, push_constants, work_ns }
            }
            1 => Command::Barrier,
            2 => {
                let src = self.binding()?;
                let dst = self.binding()?;
                Command::Copy { src, dst }
            }
            3 => {
                let dst = self.binding()?;
                let pattern_len = self.bounded("fill pattern length", u8::MAX.into())? as u8;
                let pattern = self.uv("fill pattern")?;
                Command::Fill { dst, pattern, pattern_len }
            }
            4 => {
                let dtype = self.u32("all-reduce dtype")?;
                // device, two bindings of three varints: at least 7 bytes each.
                let parts = self.list("collective parts", 7, Dec::part)?;
                Command::AllReduce { dtype, parts }
            }
            5 => {
                let outer = self.uv("all-gather outer")?;
                let parts = self.list("collective parts", 7, Dec::part)?;
                Command::AllGather { outer, parts }
            }
            6 => {
                let cond = self.binding()?;
                let value = self.bounded("skip value", 1)? == 1;
                let count = self.u32("skip count")?;
                Command::SkipIf { cond, value, count }
            }
            7 => {
                let device = self.u32("segment device")?;
                let count = self.u32("segment count")?;
                let waits = self.list("segment waits", 1, |d| d.u32("segment wait"))?;
                Command::Segment { device, count, waits }
            }
            _ => {
                let src_device = self.u32("transfer source device")?;
                let src = self.binding()?;
                let dst_device = self.u32("transfer destination device")?;
                let dst = self.binding()?;
                Command::Transfer { src_device, src, dst_device, dst }
            }
        })
    }

    /// A variant's condition (format 1.5 on). The encoding is checked here (tag, field
    /// widths); what a condition may say (known feature bits, the device kind of its
    /// executable) is the verifier's.
    fn condition(&mut self) -> R<Condition> {
        Ok(match self.tag("variant condition", 2)? {
            0 => Condition::Always,
            1 => Condition::CpuFeatures(self.uv("variant cpu features")?),
            _ => {
                let sm = self.bounded("variant cuda sm", u64::from(CudaArch::MAX_MAJOR) * 10 + 9)?;
                let specific = self.bounded("variant cuda arch-specific", 1)? == 1;
                Condition::Cuda(CudaArch { major: (sm / 10) as u8, minor: (sm % 10) as u8, specific })
            }
        })
    }

    fn finish(&self) -> R<()> {
        if self.remaining() > 0 {
            return Err(self.err(SectionProblem::TrailingBytes { count: self.remaining() as u64 }));
        }
        Ok(())
    }
}

struct Sig<'a> {
    name: &'a str,
    inputs: Vec<TensorView<'a>>,
    outputs: Vec<TensorView<'a>>,
}

fn section<'a>(m: &Module<'a>, kind: SectionKind) -> Option<Dec<'a>> {
    m.sections().find(|s| s.kind == kind).map(|s| Dec::new(kind, s.offset, s.bytes, m.format()))
}

fn required<'a>(m: &Module<'a>, kind: SectionKind) -> R<Dec<'a>> {
    section(m, kind).ok_or(SectionError {
        section: kind,
        offset: 0,
        section_offset: 0,
        problem: SectionProblem::Missing,
    })
}

fn read_signature<'a>(d: &mut Dec<'a>) -> R<Vec<Sig<'a>>> {
    // name, input count, output count: at least 3 bytes each.
    let v = d.list("signature entries", 3, |d| {
        let name = d.str("entry name")?;
        let inputs = d.tensors("entry inputs")?;
        let outputs = d.tensors("entry outputs")?;
        Ok(Sig { name, inputs, outputs })
    })?;
    d.finish()?;
    Ok(v)
}

fn read_plan<'a>(d: &mut Dec<'a>, sigs: Vec<Sig<'a>>) -> R<(Vec<DeviceView<'a>>, Vec<EntryView<'a>>)> {
    let devices = d.list("devices", 2, |d| {
        let kind = d.device_kind()?;
        let name = d.str("device name")?;
        Ok(DeviceView { kind, name })
    })?;
    let start = d.pos;
    let n = d.count("plan entries", 4)?;
    if n != sigs.len() {
        return Err(
            d.err_at(start, SectionProblem::EntryCountMismatch { signature: sigs.len() as u64, plan: n as u64 })
        );
    }
    let mut entries = Vec::with_capacity(n);
    for sig in sigs {
        let arena_size = d.uv("arena size")?;
        let arena_align = d.uv("arena alignment")?;
        let commands = d.list("commands", 1, Dec::command)?;
        // name, binding (3), first, last.
        let buffers = d.list("buffers", 6, |d| {
            let name = d.str("buffer name")?;
            let binding = d.binding()?;
            let first = d.u32("buffer first")?;
            let last = d.u32("buffer last")?;
            Ok(BufferView { name, binding, first, last })
        })?;
        // name, binding (3), bound, outputs.
        let extents = d.list_since(crate::format::EXTENTS_MINOR, "extents", 6, |d| {
            let name = d.str("extent name")?;
            let binding = d.binding()?;
            let bound = d.uv("extent bound")?;
            let outputs = d.list("extent outputs", 2, |d| Ok((d.u32("extent output")?, d.u32("extent axis")?)))?;
            Ok(ExtentView { name, binding, bound, outputs })
        })?;
        // input, axis, min, bound, two bindings (3 each).
        let bounded = d.list_since(crate::format::BOUNDED_MINOR, "bounded dimensions", 10, |d| {
            let input = d.u32("bounded input")?;
            let axis = d.u32("bounded axis")?;
            let min = d.uv("bounded min")?;
            let bound = d.uv("bounded bound")?;
            let staging = d.binding()?;
            let extent = d.binding()?;
            Ok(BoundedDesc { input, axis, min, bound, staging, extent })
        })?;
        // command, dim, outer, span, unit, inner.
        let bounded_rows = d.list_since(crate::format::BOUNDED_ROWS_MINOR, "bounded rows", 6, |d| {
            let command = d.u32("bounded rows command")?;
            let dim = d.u32("bounded rows dimension")?;
            let outer = d.uv("bounded rows outer")?;
            let span = d.uv("bounded rows span")?;
            let unit = d.uv("bounded rows unit")?;
            let inner = d.uv("bounded rows inner")?;
            Ok(BoundedRows { command, dim, outer, span, unit, inner })
        })?;
        let device_arenas =
            d.list_since(crate::format::HETERO_MINOR, "device arenas", 1, |d| d.uv("device arena size"))?;
        let prologue = match d.format.minor >= crate::format::PROLOGUE_MINOR {
            true => d.u32("prologue")?,
            false => 0,
        };
        entries.push(EntryView {
            prologue,
            device_arenas,
            bounded,
            bounded_rows,
            extents,
            name: sig.name,
            inputs: sig.inputs,
            outputs: sig.outputs,
            arena_size,
            arena_align,
            commands,
            buffers,
        });
    }
    d.finish()?;
    Ok((devices, entries))
}

fn read_executables<'a>(d: &mut Dec<'a>) -> R<(Vec<ExecutableView<'a>>, Vec<KernelView<'a>>)> {
    // device, features, entry count, reloc count, code length.
    let executables = d.list("executables", 5, |d| {
        let device = d.device_kind()?;
        let features = d.uv("executable features")?;
        let entries = d.list("executable entries", 2, |d| {
            let name = d.str("entry symbol name")?;
            let off = d.uv("entry symbol offset")?;
            Ok((name, off))
        })?;
        let relocs = d.list("relocations", 4, |d| {
            let offset = d.uv("relocation offset")?;
            let kind = RELOC_KINDS[d.tag("relocation kind", RELOC_KINDS.len() as u64 - 1)? as usize];
            let target = d.uv("relocation target")?;
            let addend = d.sv("relocation addend")?;
            Ok(Reloc { offset, kind, target, addend })
        })?;
        // block, shared, params: at least 3 bytes each.
        let launches = d.list_since(3, "launches", 3, |d| {
            let block = d.u32("launch block")?;
            let shared = d.u32("launch shared")?;
            let params = d.u32("launch params")?;
            Ok(Launch { block, shared, params })
        })?;
        let len = d.uv("code length")?;
        let code = d.bytes(len, "code")?;
        Ok(ExecutableView { device, features, code, entries, relocs, launches })
    })?;
    let kernels = d.list("kernels", 2, |d| {
        let name = d.str("kernel name")?;
        let variants = d.list("kernel variants", 3, |d| {
            let executable = d.u32("variant executable")?;
            let entry = d.u32("variant entry")?;
            if d.format.minor < crate::format::VARIANT_CONDITION_MINOR {
                let features = d.uv("variant features")?;
                return Ok(Variant::cpu(executable, entry, features));
            }
            let condition = d.condition()?;
            let workgroups = d.uv("variant workgroups")?;
            Ok(Variant { executable, entry, condition, workgroups })
        })?;
        let class = if d.format.minor >= 2 {
            // Codes run from 0 (not recorded) to the last class's.
            KernelClass::from_code(d.tag("kernel class", KernelClass::ALL.len() as u64)?)
        } else {
            None
        };
        Ok(KernelView { name, variants, class })
    })?;
    d.finish()?;
    Ok((executables, kernels))
}

fn read_external<'a>(d: &mut Dec<'a>) -> R<ConstantsView<'a>> {
    let file = d.str("weights file name")?;
    let size = d.uv("weights size")?;
    let hash = le64(d.bytes(8, "weights hash")?);
    d.finish()?;
    Ok(ConstantsView::External { file, size, hash })
}

fn read_debug<'a>(d: &mut Dec<'a>) -> R<DebugView<'a>> {
    let kernel_sources = d.list("kernel sources", 1, |d| d.str("kernel source"))?;
    let source = d.str("source name")?;
    d.finish()?;
    Ok(DebugView { kernel_sources, source })
}

/// Decodes the sections of `m`. Borrowed from the file: names, code, embedded constants.
pub fn read_program<'a>(m: &Module<'a>) -> Result<ProgramView<'a>, SectionError> {
    let sigs = read_signature(&mut required(m, SectionKind::Signature)?)?;
    let (devices, entries) = read_plan(&mut required(m, SectionKind::Plan)?, sigs)?;
    let (executables, kernels) = read_executables(&mut required(m, SectionKind::Executables)?)?;
    let embedded = m.sections().find(|s| s.kind == SectionKind::Constants);
    let constants = match (embedded, section(m, SectionKind::ExternalWeights)) {
        (Some(_), Some(d)) => return Err(d.err(SectionProblem::ConflictsWith(SectionKind::Constants))),
        (Some(s), None) => ConstantsView::Embedded(s.bytes),
        (None, Some(mut d)) => read_external(&mut d)?,
        (None, None) => {
            return Err(SectionError {
                section: SectionKind::Constants,
                offset: 0,
                section_offset: 0,
                problem: SectionProblem::Missing,
            })
        }
    };
    let debug = match section(m, SectionKind::Debug) {
        Some(mut d) => Some(read_debug(&mut d)?),
        None => None,
    };
    Ok(ProgramView { devices, entries, kernels, executables, constants, debug })
}

/// Encodes `p` and returns only the bytes of its `kind` section (for tests and tools that
/// inspect one section).
pub fn section_bytes(p: &Program, kind: SectionKind) -> Option<Vec<u8>> {
    match kind {
        SectionKind::Signature => Some(signature_bytes(p)),
        SectionKind::Plan => Some(plan_bytes(p)),
        SectionKind::Executables => Some(executables_bytes(p)),
        SectionKind::Debug => p.debug.as_ref().map(debug_bytes),
        _ => None,
    }
}
