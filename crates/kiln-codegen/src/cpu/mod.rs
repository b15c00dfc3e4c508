//! x86-64 code for kernels, through Cranelift.
//!
//! [`compile`] turns kernels into one relocatable [`Executable`]: one function per
//! kernel (symbol = kernel name) following the kernel ABI of `kiln_module::abi`, built
//! into one ELF object by `cranelift-object` (not position-independent, no unwind
//! info) and read back into a single image of code and read-only data with its
//! relocations translated to image offsets. The runtime's loader maps that image; no
//! system linker or `dlopen` is involved.
//!
//! Each function runs the workgroups `begin..end` of its kernel. A workgroup is one
//! position of every output dimension but the innermost (a rank-0 or rank-1 kernel
//! has one workgroup), so a driver can split rows across threads. Loop structure,
//! scheduling and vectorisation are described in [`analysis`] and [`emit`].
//!
//! Each kernel comes with its class (`kiln_flow::class::KernelClass`), and the class
//! alone picks its emitter: a contraction goes to [`gemm`], a window to [`depthwise`] (or,
//! an interpolation, to [`resample`]), a movement to [`pad`], [`copy`], [`gather`] or [`resample`]
//! (by the bounds and index of the load it is, and whether its index comes from tables), and rows,
//! elementwise and general kernels to the vector kernels of [`rows`] (8 or 16 lanes,
//! every operation from the one table of [`vops`], which contraction epilogues share).
//! An emitter that declines a kernel of its class (an epilogue it has no form for, an
//! operation without a vector form) leaves it to Cranelift, whose x86-64 backend has
//! 128-bit vectors only, and the kernel's note says `general (why)`; [`CodePath`] says
//! for each kernel whether its code runs 512-, 256- or 128-bit vectors or is scalar (or
//! evaluates one point, [`CodePath::OnePoint`]: no lanes to fill, so no scalar cliff).
//!
//! At the speed level (`Options::contraction_kernels`, on a target with AVX2 and FMA)
//! four kinds of kernel are written directly as machine code with `iced-x86` and
//! appended to the image (position-independent, no relocations): contractions
//! ([`gemm`], with 512-bit tiles where the target has AVX-512 F), depthwise convolutions and max pools
//! ([`depthwise`]), padding copies ([`pad`]), affine copies such as im2col ([`copy`]), separable gathers such as
//! ConvTranspose's phase interleave ([`gather`]) and row kernels such as Softmax, LayerNorm
//! and elementwise exp/erf/tanh/log ([`rows`], 16 lanes where the target has AVX-512 F, written
//! through [`vector`]); each keeps the same kernel ABI and the executable records the
//! CPU features they use.

mod analysis;
mod asm;
mod attention;
mod copy;
mod cost;
mod depthwise;
mod emit;
mod gather;
mod gemm;
mod image;
mod math;
mod pad;
mod qgemm;
mod resample;
mod rows;
mod transpose;
mod vector;
mod vops;

use cranelift_codegen::ir::UserFuncName;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::FunctionBuilderContext;
use cranelift_module::{default_libcall_names, Linkage, Module};
use cranelift_object::{ObjectBuilder, ObjectModule};
use kiln_flow::class::KernelClass;
use kiln_flow::resample::Resample;
use kiln_flow::{Bounds, Expr, Kernel, UnaryOp};
use kiln_ir::DType;
use kiln_module::program::{CpuArch, CpuFeature, Executable};

use crate::CodegenError;

/// Which CPUs the code must run on: a level of x86-64, or another architecture
/// (`kiln compile --target-triple`), whose code is all Cranelift's (the microkernels
/// are x86-64 machine code).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuTarget {
    /// The CPU this compiler runs on (every feature it has that the code generator
    /// can use).
    Host,
    /// x86-64 baseline (SSE2 only): floor/ceil/round/trunc use scalar fallbacks.
    X86_64,
    /// x86-64-v2: SSE3, SSSE3, SSE4.1, SSE4.2, POPCNT.
    X86_64V2,
    /// x86-64-v3: v2 plus AVX, AVX2, FMA, BMI1, BMI2, LZCNT (VEX encodings).
    X86_64V3,
    /// x86-64-v4: v3 plus AVX-512 F, DQ and VL (512-bit contraction tiles).
    X86_64V4,
    /// AArch64 (ARMv8-A) with NEON: Cranelift's aarch64 backend, vectorised loops on
    /// its 128-bit vectors.
    Aarch64,
    /// RV64GC: Cranelift's riscv64 backend, scalar code (the vector extension is
    /// optional on RISC-V and not assumed).
    Riscv64,
}

impl CpuTarget {
    /// The architecture its code is written in.
    pub fn arch(self) -> CpuArch {
        match self {
            CpuTarget::Aarch64 => CpuArch::Aarch64,
            CpuTarget::Riscv64 => CpuArch::Riscv64,
            _ => CpuArch::X86_64,
        }
    }

    /// The target for a Rust-style target triple: `x86_64-…` is `cpu` (an x86-64
    /// level, or the host), `aarch64-…` and `riscv64…` (`riscv64gc-unknown-linux-gnu`)
    /// the other architectures (Linux or any other operating system: the code makes no
    /// system calls). `None` for an architecture without a backend here.
    pub fn from_triple(triple: &str, cpu: CpuTarget) -> Option<CpuTarget> {
        let arch = triple.split('-').next().unwrap_or("");
        match arch {
            "x86_64" => Some(cpu),
            "aarch64" | "arm64" => Some(CpuTarget::Aarch64),
            "riscv64" | "riscv64gc" => Some(CpuTarget::Riscv64),
            _ => None,
        }
    }
}

/// Knobs of the code generator; the defaults are what the compiler uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Run loops four f32/i32 lanes at a time where possible.
    pub vectorize: bool,
    /// Let float sums and products of a vectorised reduction be reassociated (four
    /// partial results combined at the end, eight in row kernels), and let a row kernel
    /// divide by a row's value as a multiplication by its reciprocal; off, vectorised
    /// code is bit-identical to scalar code.
    pub reassociate: bool,
    /// Emit recognised contractions as AVX2+FMA (and, where the target has AVX-512 F,
    /// 512-bit) microkernels ([`gemm`]), depthwise convolutions ([`depthwise`]) and
    /// padding kernels ([`pad`]) as machine code when the target has AVX2 and FMA; off,
    /// every kernel goes through Cranelift.
    pub contraction_kernels: bool,
    /// f32 `exp`, `erf`, `tanh` and `log` as inline code ([`math`]); off, they call the runtime's
    /// helper table (libm) like every other transcendental.
    pub inline_math: bool,
    /// Unroll reduction loops of at most 4 iterations whose body holds no other
    /// reduction (pooling windows).
    pub unroll: bool,
}

impl Options {
    /// The smallest code: no microkernels, no inline transcendentals (the `size`
    /// optimisation level of `kiln compile`).
    pub fn size() -> Options {
        Options { vectorize: true, reassociate: true, contraction_kernels: false, inline_math: false, unroll: false }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options { vectorize: true, reassociate: true, contraction_kernels: true, inline_math: true, unroll: true }
    }
}

/// Compiled kernels: the executable and, per kernel (in input order), the number of
/// workgroups a dispatch runs. Entry `i` of the executable is kernel `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuModule {
    /// The relocatable image.
    pub executable: Executable,
    /// Workgroup count per kernel.
    pub workgroups: Vec<u64>,
    /// How each kernel was compiled: the microkernel that took it (`contraction
    /// microkernel (avx2+fma)`, `max pool window (avx2)`, …), or `general` — with, in
    /// parentheses, why the emitter of its class declined it when its class has one.
    pub notes: Vec<String>,
    /// Each kernel's estimated single-thread time in nanoseconds (see [`cost`]).
    pub work_ns: Vec<u64>,
    /// How each kernel's code runs along its contiguous axis ([`CodePath`]).
    pub paths: Vec<CodePath>,
    /// Each kernel's workgroup index as digits, outermost first (empty where its
    /// emitter does not describe it): what lets a bounded dimension's extent shorten
    /// the workgroups a dispatch runs.
    pub digits: Vec<Vec<WorkDigit>>,
}

/// One digit of a kernel's workgroup index read as a mixed-radix number (outermost
/// digit first, the product of the counts being the workgroup count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkDigit {
    /// Its count.
    pub count: u64,
    /// The output axis it steps along and how many positions of that axis one step
    /// covers (a row panel: several rows); `None` where it does not step along one
    /// output axis alone (a column chunk).
    pub axis: Option<(usize, u64)>,
}

/// The digits of a kernel whose workgroups are the rows of its first `axes` output
/// axes, row-major (one position each).
pub fn row_digits(k: &Kernel, axes: usize) -> Vec<WorkDigit> {
    let dims = k.output.shape.dims();
    dims[..axes.min(dims.len())]
        .iter()
        .enumerate()
        .map(|(a, &d)| WorkDigit { count: d as u64, axis: Some((a, 1)) })
        .collect()
}

/// How a kernel's code runs along its contiguous axis: the classification `kiln
/// compile --timings` counts (and the test that no dispatch of a known model is scalar
/// reads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CodePath {
    /// Machine code written by its class's emitter ([`gemm`], [`depthwise`], [`pad`],
    /// [`copy`], or [`rows`] for elementwise, row and general kernels), on vectors of
    /// `bits` (256: AVX2, 512: AVX-512 F).
    Vector {
        /// Vector width in bits.
        bits: u16,
    },
    /// Cranelift code that runs the innermost output loop or a reduction four lanes at
    /// a time (128-bit vectors: Cranelift's x86-64 backend has no wider ones).
    Vector128,
    /// Cranelift code, one element at a time.
    Scalar,
    /// Cranelift code for a kernel whose whole iteration space is one point (one output
    /// element, every reduction over one position: [`one_point`]): it evaluates its
    /// expression once, so a vector would fill one lane and run the same operations —
    /// there is no scalar cliff to report. (A one-element output that reduces over more
    /// than one position is still [`CodePath::Scalar`].)
    OnePoint,
}

impl CodePath {
    /// The listing's name: `512-bit`, `256-bit`, `128-bit` or `scalar`.
    pub fn name(self) -> &'static str {
        match self {
            CodePath::Vector { bits: 512 } => "512-bit",
            CodePath::Vector { .. } => "256-bit",
            CodePath::Vector128 => "128-bit",
            CodePath::Scalar => "scalar",
            CodePath::OnePoint => "one-point",
        }
    }
}

/// Whether `k`'s iteration space is one point: one output element, and every reduction
/// over variables of one position each ([`CodePath::OnePoint`]).
pub fn one_point(k: &Kernel) -> bool {
    k.output.shape.numel() == 1
        && k.nodes.iter().all(|n| match &n.expr {
            kiln_flow::Expr::Reduce { vars, .. } => vars.iter().all(|v| k.vars[v.0 as usize] == 1),
            _ => true,
        })
}

/// The workgroups of a kernel: the product of every output dimension but the
/// innermost (1 for rank 0 and 1).
pub fn workgroups(k: &Kernel) -> u64 {
    // A scatter's points store in order: one workgroup.
    if k.scatter.is_some() {
        return 1;
    }
    let dims = k.output.shape.dims();
    dims[..dims.len().saturating_sub(1)].iter().map(|&d| d as u64).product()
}

/// The x86-64 features the code generator can use, one table for the named targets
/// and the host: `FEATURES`, each with the x86-64 level that brings it (2, 3 or 4), its
/// Cranelift flag and the feature the code then uses; and `host_flags`, those this CPU
/// has (`is_x86_feature_detected!` wants each feature's name as a literal).
macro_rules! features {
    ($($level:literal $feat:tt => $flag:literal, $f:ident;)*) => {
        const FEATURES: &[(u8, &str, CpuFeature)] = &[$(($level, $flag, CpuFeature::$f)),*];

        #[cfg(target_arch = "x86_64")]
        fn host_flags() -> Result<Vec<(&'static str, CpuFeature)>, CodegenError> {
            let mut v = Vec::new();
            $(
                if std::is_x86_feature_detected!($feat) {
                    v.push(($flag, CpuFeature::$f));
                }
            )*
            Ok(v)
        }
    };
}
features! {
    2 "sse3" => "has_sse3", Sse3;
    2 "ssse3" => "has_ssse3", Ssse3;
    2 "sse4.1" => "has_sse41", Sse41;
    2 "sse4.2" => "has_sse42", Sse42;
    2 "popcnt" => "has_popcnt", Popcnt;
    3 "avx" => "has_avx", Avx;
    3 "avx2" => "has_avx2", Avx2;
    3 "fma" => "has_fma", Fma;
    3 "bmi1" => "has_bmi1", Bmi1;
    3 "bmi2" => "has_bmi2", Bmi2;
    3 "lzcnt" => "has_lzcnt", Lzcnt;
    4 "avx512f" => "has_avx512f", Avx512f;
    4 "avx512dq" => "has_avx512dq", Avx512dq;
    4 "avx512vl" => "has_avx512vl", Avx512vl;
}

/// The ISA flags to enable for `target`.
fn target_flags(target: CpuTarget) -> Result<Vec<(&'static str, CpuFeature)>, CodegenError> {
    let level = match target {
        CpuTarget::X86_64 => 1,
        CpuTarget::X86_64V2 => 2,
        CpuTarget::X86_64V3 => 3,
        CpuTarget::X86_64V4 => 4,
        CpuTarget::Host => return host_flags(),
        CpuTarget::Aarch64 | CpuTarget::Riscv64 => return Ok(Vec::new()),
    };
    Ok(FEATURES.iter().filter(|f| f.0 <= level).map(|&(_, flag, f)| (flag, f)).collect())
}

#[cfg(not(target_arch = "x86_64"))]
fn host_flags() -> Result<Vec<(&'static str, CpuFeature)>, CodegenError> {
    Err(CodegenError::Unsupported { kernel: String::new(), what: "a host that is not x86-64".into() })
}

fn internal(kernel: &str, what: impl std::fmt::Display) -> CodegenError {
    CodegenError::Internal { kernel: kernel.to_string(), what: what.to_string() }
}

/// Rejects what the CPU backend does not handle (a dtype without a storage size, in
/// storage or as a cast target; `not` of a float) and names that are not symbols.
fn check_supported(k: &Kernel) -> Result<(), CodegenError> {
    let unsupported = |what: String| CodegenError::Unsupported { kernel: k.name.clone(), what };
    if k.name.is_empty() || !k.name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_') {
        return Err(unsupported(format!("kernel name {:?} (names are [A-Za-z0-9_]+)", k.name)));
    }
    let ok = |d: DType| analysis::elem_bytes(d).is_some();
    for (i, t) in k.inputs.iter().enumerate() {
        if !ok(t.dtype) {
            return Err(unsupported(format!("input {i} of dtype {}", t.dtype.name())));
        }
    }
    if !ok(k.output.dtype) {
        return Err(unsupported(format!("an output of dtype {}", k.output.dtype.name())));
    }
    for (i, n) in k.nodes.iter().enumerate() {
        match &n.expr {
            Expr::Cast { to, .. } if !ok(*to) => {
                return Err(unsupported(format!("node e{i}: a cast to {}", to.name())));
            }
            // The kernel docs define `not` on bool and integers only.
            Expr::Unary(UnaryOp::Not, a) if k.node(*a).ty.is_float() => {
                return Err(unsupported(format!("node e{i}: not of {}", k.node(*a).ty)));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Compiles `kernels` for `target` with the default [`Options`], each of the class
/// `kiln_flow::class::classify` gives it.
pub fn compile(kernels: &[&Kernel], target: &CpuTarget) -> Result<CpuModule, CodegenError> {
    compile_with(&classify(kernels), target, &Options::default())
}

/// `kernels`, each with its class ([`kiln_flow::class::classify`]): what [`compile_with`] takes,
/// for callers that hold kernels without their dispatches.
pub fn classify<'k>(kernels: &[&'k Kernel]) -> Vec<(&'k Kernel, KernelClass)> {
    kernels.iter().map(|&k| (k, kiln_flow::class::classify(k))).collect()
}

/// A configured ISA and the features its code may use.
struct Isa {
    isa: cranelift_codegen::isa::OwnedTargetIsa,
    features: u64,
    caps: emit::Caps,
    /// The target has 128-bit vectors (`Options::vectorize` applies).
    vectors: bool,
}

fn make_isa(target: CpuTarget) -> Result<Isa, CodegenError> {
    let flags = target_flags(target)?;
    let mut shared = settings::builder();
    let setting = |b: &mut settings::Builder, name: &str, value: &str| {
        b.set(name, value).map_err(|e| internal("", format!("setting {name}={value}: {e}")))
    };
    setting(&mut shared, "opt_level", "none")?;
    setting(&mut shared, "is_pic", "false")?;
    setting(&mut shared, "unwind_info", "false")?;
    setting(&mut shared, "enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" })?;
    let arch = target.arch();
    let triple = match arch {
        CpuArch::X86_64 => "x86_64-unknown-linux-gnu",
        CpuArch::Aarch64 => "aarch64-unknown-linux-gnu",
        CpuArch::Riscv64 => "riscv64gc-unknown-linux-gnu",
    };
    let triple: target_lexicon::Triple = triple.parse().map_err(|e| internal("", format!("target triple: {e}")))?;
    let mut isa_builder = cranelift_codegen::isa::lookup(triple).map_err(|e| internal("", e))?;
    // The architecture's marker bit (SSE2 is part of every x86-64 CPU).
    let mut features = arch.feature().bit();
    for &(flag, f) in &flags {
        isa_builder.enable(flag).map_err(|e| internal("", format!("flag {flag}: {e}")))?;
        features |= f.bit();
    }
    // AArch64 and RV64GC round and fuse multiply-adds natively (`frint*`, `fmadd`;
    // `fcvt` with a rounding mode, `fmadd.s`), as x86-64 does from SSE4.1 and FMA on.
    let native = arch != CpuArch::X86_64;
    let sse41 = native || flags.iter().any(|&(_, f)| f == CpuFeature::Sse41);
    let fma = native || flags.iter().any(|&(_, f)| f == CpuFeature::Fma);
    let isa = isa_builder.finish(settings::Flags::new(shared)).map_err(|e| internal("", e))?;
    // RV64GC has no vectors: its loops stay scalar.
    let vectors = arch != CpuArch::Riscv64;
    Ok(Isa { isa, features, caps: emit::Caps { sse41, inline_math: true, fma, unroll: true }, vectors })
}

/// Checks `k` and builds its Cranelift function into `func`; returns notes on what
/// was vectorised.
fn build_kernel(
    k: &Kernel,
    idx: usize,
    isa: &Isa,
    options: &Options,
    func: &mut cranelift_codegen::ir::Function,
    fctx: &mut FunctionBuilderContext,
) -> Result<Vec<String>, CodegenError> {
    k.verify().map_err(|e| CodegenError::Invalid { kernel: k.name.clone(), error: e })?;
    check_supported(k)?;
    let an = analysis::Analysis::new(k).map_err(|e| internal(&k.name, e))?;
    func.signature = emit::kernel_signature();
    func.name = UserFuncName::user(0, idx as u32);
    let caps = emit::Caps { inline_math: options.inline_math, unroll: options.unroll, ..isa.caps };
    let scalar;
    let options = if isa.vectors {
        options
    } else {
        scalar = Options { vectorize: false, ..options.clone() };
        &scalar
    };
    emit::build(k, &an, func, fctx, caps, options, isa.isa.frontend_config()).map_err(|e| internal(&k.name, e))
}

/// The Cranelift IR of one kernel as text, as built or (`optimized`) after
/// Cranelift's mid-end, headed by notes on which loops run four lanes at a time.
pub fn clif_text(k: &Kernel, target: &CpuTarget, options: &Options, optimized: bool) -> Result<String, CodegenError> {
    let isa = make_isa(*target)?;
    let mut ctx = cranelift_codegen::Context::new();
    let mut fctx = FunctionBuilderContext::new();
    let notes = build_kernel(k, 0, &isa, options, &mut ctx.func, &mut fctx)?;
    if optimized {
        ctx.optimize(&*isa.isa, &mut Default::default()).map_err(|e| internal(&k.name, format!("{e:?}")))?;
    }
    let func = &ctx.func;
    let mut out = String::new();
    for n in notes {
        out.push_str("; ");
        out.push_str(&n);
        out.push('\n');
    }
    out.push_str(&func.display().to_string());
    Ok(out)
}

/// The layout the microkernels read constant operands in, for one target and set of
/// options: the compiler packs constants with [`Packing::widths`]
/// (`kiln_flow::layout::pack_constants`) before it compiles the kernels with the same
/// target and options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packing {
    /// Contraction microkernels are emitted at all.
    micro: bool,
    /// With 512-bit tiles.
    avx512: bool,
}

impl Packing {
    /// What [`compile_with`] will emit for `target` and `options`.
    pub fn new(target: &CpuTarget, options: &Options) -> Result<Packing, CodegenError> {
        let features = make_isa(*target)?.features;
        let avx2_fma = [CpuFeature::Avx, CpuFeature::Avx2, CpuFeature::Fma].iter().all(|f| features & f.bit() != 0);
        Ok(Packing {
            micro: avx2_fma && options.contraction_kernels,
            avx512: avx2_fma && features & CpuFeature::Avx512f.bit() != 0,
        })
    }

    /// The panel widths kernel `k`, of class `class`, has its operands packed at: those
    /// its contraction microkernel reads (none for another class, or when it does not
    /// take a microkernel).
    pub fn widths(&self, k: &Kernel, class: KernelClass) -> kiln_flow::layout::PanelWidths {
        if self.micro && class == KernelClass::Contraction {
            gemm::panel_widths(k, self.avx512)
        } else {
            Default::default()
        }
    }
}

/// A kernel written as machine code by the emitter of its class.
struct Micro {
    code: Vec<u8>,
    workgroups: u64,
    note: String,
    /// It uses AVX-512 F.
    avx512: bool,
    path: cost::Path,
    /// Its vectors' width in bits.
    bits: u16,
    /// CPU features it needs beyond AVX2, FMA and (where `avx512`) AVX-512 F.
    needs: u64,
    /// Its workgroup index's digits (empty: not described).
    digits: Vec<WorkDigit>,
}

/// Emits `k` with the microkernel emitter of `class` (`Ok(None)` would be a class
/// without one; every class has one now), `Err` with the reason when it declines.
fn emit_class(
    k: &Kernel,
    class: KernelClass,
    options: &Options,
    avx512: bool,
    avx512vl: bool,
    int8: Int8,
) -> Result<Option<Micro>, gemm::NotHere> {
    // A scatter stores its points in order at computed positions: the general path.
    if k.scatter.is_some() {
        return gemm::no("a scatter (its points store in order at computed positions)".to_string());
    }
    // An integer contraction (whatever its class: its epilogue may make it general)
    // takes the integer microkernel where the target has one and it takes the kernel.
    let mut declined = None;
    if kiln_flow::contraction::Contraction::of_int(k).is_some() {
        if !int8.bw_vl && int8.avx2 {
            match qgemm::emit_avx2(k) {
                Ok(q) => {
                    return Ok(Some(Micro {
                        code: q.code,
                        workgroups: q.workgroups,
                        note: "integer contraction microkernel (avx2)".to_string(),
                        avx512: false,
                        path: cost::Path::Contraction,
                        bits: 256,
                        needs: 0,
                        digits: Vec::new(),
                    }));
                }
                Err(gemm::NotHere(why)) => declined = Some(format!("integer contraction: {why}")),
            }
        } else if !int8.bw_vl {
            declined = Some("an integer contraction (microkernel needs AVX2 or AVX-512 BW and VL)".to_string());
        } else {
            match qgemm::emit(k, int8.vnni) {
                Ok(q) => {
                    let note = if q.vnni {
                        "integer contraction microkernel (avx-512 vnni)"
                    } else {
                        "integer contraction microkernel (avx-512 bw)"
                    };
                    let mut needs = CpuFeature::Avx512bw.bit() | CpuFeature::Avx512vl.bit();
                    if q.vnni {
                        needs |= CpuFeature::Avx512vnni.bit();
                    }
                    return Ok(Some(Micro {
                        code: q.code,
                        workgroups: q.workgroups,
                        note: note.to_string(),
                        avx512: true,
                        path: cost::Path::Contraction,
                        bits: 512,
                        needs,
                        digits: Vec::new(),
                    }));
                }
                Err(gemm::NotHere(why)) => declined = Some(format!("integer contraction: {why}")),
            }
        }
    }
    match emit_by_class(k, class, options, avx512, avx512vl) {
        Err(gemm::NotHere(why)) if declined.is_some() => {
            Err(gemm::NotHere(format!("{}; {why}", declined.unwrap_or_default())))
        }
        other => other,
    }
}

/// Whether `target` runs integer contractions (QLinearConv, QLinearMatMul,
/// MatMulInteger, ConvInteger) as microkernels (`qgemm`: AVX-512 BW and VL, with or
/// without VNNI, or its AVX2 form on an AVX2 + FMA target: x86-64-v3 or such a host) at
/// the speed level `options`. Where it does not they run on the general path, far
/// slower than a float product's microkernel: the compiler then keeps a QDQ graph's
/// contractions in float (`kiln_opt`'s `tensor-fold-quantized-contractions` is left
/// out) and runs `tensor-float-integer-contractions`.
pub fn int8_kernels(target: &CpuTarget, options: &Options) -> Result<bool, CodegenError> {
    let features = make_isa(*target)?.features;
    let avx2_fma = [CpuFeature::Avx, CpuFeature::Avx2, CpuFeature::Fma].iter().all(|f| features & f.bit() != 0);
    let avx512 = avx2_fma && features & CpuFeature::Avx512f.bit() != 0;
    let int8 = Int8::of(*target, avx512);
    Ok(options.contraction_kernels && avx2_fma && (int8.bw_vl || int8.avx2))
}

/// What the target offers the integer contraction microkernel ([`qgemm`]).
#[derive(Debug, Clone, Copy, Default)]
struct Int8 {
    /// AVX-512 BW and VL (the 512-bit microkernel).
    bw_vl: bool,
    /// AVX2 and FMA (the 256-bit microkernel, where the 512-bit one is not).
    avx2: bool,
    /// AVX-512 VNNI (`vpdpbusd`).
    vnni: bool,
}

impl Int8 {
    fn of(target: CpuTarget, avx512: bool) -> Int8 {
        match target {
            CpuTarget::X86_64V4 => Int8 { bw_vl: avx512, avx2: true, vnni: false },
            CpuTarget::X86_64V3 => Int8 { bw_vl: false, avx2: true, vnni: false },
            #[cfg(target_arch = "x86_64")]
            CpuTarget::Host => {
                let bw_vl =
                    avx512 && std::is_x86_feature_detected!("avx512bw") && std::is_x86_feature_detected!("avx512vl");
                let avx2 = std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma");
                Int8 { bw_vl, avx2, vnni: bw_vl && std::is_x86_feature_detected!("avx512vnni") }
            }
            _ => Int8::default(),
        }
    }
}

/// Emits `k` with the microkernel emitter of `class`.
fn emit_by_class(
    k: &Kernel,
    class: KernelClass,
    options: &Options,
    avx512: bool,
    avx512vl: bool,
) -> Result<Option<Micro>, gemm::NotHere> {
    let vector = |(code, workgroups): (Vec<u8>, u64), note: &str| Micro {
        code,
        workgroups,
        note: note.to_string(),
        avx512: false,
        path: cost::Path::Vector,
        bits: 256,
        needs: 0,
        digits: Vec::new(),
    };
    Ok(Some(match class {
        KernelClass::Window if Resample::is_interpolation(k) => vector(resample::emit(k)?, "resampling (avx2)"),
        KernelClass::Window => {
            let w = depthwise::emit(k, avx512vl)?;
            Micro {
                code: w.code,
                workgroups: w.workgroups,
                note: w.note.to_string(),
                avx512: w.avx512,
                path: cost::Path::Window,
                bits: if w.avx512 { 512 } else { 256 },
                needs: 0,
                digits: Vec::new(),
            }
        }
        KernelClass::Contraction => {
            let g = gemm::emit(k, avx512)?;
            let note = match (g.avx512, g.channel_vectors) {
                (true, true) if g.wide_epilogue => {
                    "contraction microkernel (avx-512, channel vectors; epilogue on 16 lanes)"
                }
                (true, true) => "contraction microkernel (avx-512, channel vectors)",
                (true, _) if g.wide_epilogue => "contraction microkernel (avx-512; epilogue on 16 lanes)",
                (true, _) => "contraction microkernel (avx-512)",
                (false, true) => "contraction microkernel (avx2+fma, channel vectors)",
                (false, false) => "contraction microkernel (avx2+fma)",
            };
            let note =
                if g.converts_b { format!("{note}; integer B converted on the stack") } else { note.to_string() };
            Micro {
                code: g.code,
                workgroups: g.workgroups,
                note,
                avx512: g.avx512,
                path: cost::Path::Contraction,
                bits: if g.avx512 { 512 } else { 256 },
                needs: 0,
                digits: g.digits,
            }
        }
        // A movement is one load at its root: a padding reads with `Pad` bounds, an affine
        // copy in bounds.
        KernelClass::Movement => {
            // A table copy (nearest Resize; a Slice is one too) where the resampling
            // emitter takes it; else, like every in-bounds load, an affine copy where
            // it is one (a Slice along an outer axis: the resampling emitter takes the
            // last two axes only), or a table gather where the index is separable (one
            // term per output dimension).
            let table_copy = if Resample::is_table_copy(k) { Some(resample::emit(k)) } else { None };
            match (table_copy, &k.node(k.root).expr) {
                (Some(Ok(c)), _) => vector(c, "table copy (avx2)"),
                (None, Expr::Load { bounds: Bounds::Pad(_), .. }) => vector(pad::emit(k)?, "padding copy (avx)"),
                (declined, Expr::Load { bounds: Bounds::InBounds, .. }) => match copy::emit(k) {
                    Ok(c) => vector(c, "affine copy (avx)"),
                    // A declined table copy with rows too short for a copy (a strided
                    // Slice of a `[.., n, 1]` tensor): a row kernel along the innermost
                    // axis longer than one, rather than a gather per short row (4.5×
                    // slower on magika's slices).
                    Err(gemm::NotHere(_)) if declined.is_some() && row_kernel(k, options, avx512).is_ok() => {
                        row_kernel(k, options, avx512)?
                    }
                    // A transpose of the last two axes: 8 × 8 blocks in registers.
                    Err(gemm::NotHere(_)) if transpose::emit(k).is_ok() => {
                        vector(transpose::emit(k)?, "transpose (avx)")
                    }
                    Err(gemm::NotHere(why)) => match gather::emit(k) {
                        Ok(g) => vector(g, "table gather (avx2)"),
                        Err(gemm::NotHere(also)) => {
                            // The table copy's reason first where it declined.
                            let first = match declined {
                                Some(Err(gemm::NotHere(t))) => format!("{t}; "),
                                _ => String::new(),
                            };
                            return gemm::no(format!("{first}{why}; {also}"));
                        }
                    },
                },
                (Some(Err(e)), _) => return Err(e),
                // A select of pieces (a concatenation along the row): a row kernel,
                // its positions as index lanes.
                _ => row_kernel(k, options, avx512)?,
            }
        }
        // An elementwise kernel over one gathered load (an activation fused into
        // ConvTranspose's phase interleave), which the general loops would run a
        // scalar at a time with divisions, is a table gather with an epilogue.
        // (An epilogue the gather has no form for: a row kernel, where it is one.)
        KernelClass::Elementwise if gather::takes_elementwise(k) => match gather::emit(k) {
            Ok(g) => vector(g, "table gather with epilogue (avx2)"),
            Err(why) => row_kernel(k, options, avx512).map_err(|_| why)?,
        },
        KernelClass::Attention => {
            let c = attention::emit(k, avx512)?;
            let isa = if c.wide { "avx-512" } else { "avx2+fma" };
            let note = format!("attention, online softmax ({isa}), {} query rows a workgroup", c.rows);
            Micro {
                code: c.code,
                workgroups: c.workgroups,
                note,
                avx512: c.wide,
                path: cost::Path::Attention,
                bits: if c.wide { 512 } else { 256 },
                needs: 0,
                digits: c.digits,
            }
        }
        // Every other kernel with a vector form of each of its operations is a vector
        // kernel; what has none is left to Cranelift (the reason in its note).
        KernelClass::Rows | KernelClass::Elementwise | KernelClass::General => row_kernel(k, options, avx512)?,
    }))
}

/// `k` as a vector kernel of [`rows`]; a kernel with a form that has eight lanes only (an
/// i64 conversion) takes eight lanes on an AVX-512 target too.
fn row_kernel(k: &Kernel, options: &Options, avx512: bool) -> Result<Micro, gemm::NotHere> {
    let r = match rows::emit(k, options.reassociate, avx512) {
        Err(wide) if avx512 => rows::emit(k, options.reassociate, false).map_err(|_| wide)?,
        r => r?,
    };
    let note = r.note();
    let bits = if r.wide { 512 } else { 256 };
    let digits = row_digits(k, r.row_axes);
    Ok(Micro {
        code: r.code,
        workgroups: r.workgroups,
        note,
        avx512: r.wide,
        path: cost::Path::Vector,
        bits,
        needs: 0,
        digits,
    })
}

/// Compiles `kernels`, each with its class (`kiln_flow::program::Dispatch::class`), for
/// `target`.
pub fn compile_with(
    kernels: &[(&Kernel, KernelClass)],
    target: &CpuTarget,
    options: &Options,
) -> Result<CpuModule, CodegenError> {
    let isa = make_isa(*target)?;
    let mut features = isa.features;
    let avx2_fma = [CpuFeature::Avx, CpuFeature::Avx2, CpuFeature::Fma].iter().all(|f| features & f.bit() != 0);
    let avx512 = avx2_fma && features & CpuFeature::Avx512f.bit() != 0;
    let avx512vl = avx512 && features & CpuFeature::Avx512vl.bit() != 0;
    let int8 = Int8::of(*target, avx512);
    let mut needs = 0u64;
    let mut used_avx512 = false;
    let builder = ObjectBuilder::new(isa.isa.clone(), "kiln", default_libcall_names()).map_err(|e| internal("", e))?;
    let mut module = ObjectModule::new(builder);
    let mut ctx = module.make_context();
    let mut fctx = FunctionBuilderContext::new();
    let mut workgroup_counts = Vec::with_capacity(kernels.len());
    let mut names: Vec<&str> = Vec::with_capacity(kernels.len());
    // Kernels emitted as microkernels: (kernel index, code).
    let mut micro: Vec<(usize, Vec<u8>)> = Vec::new();
    let mut notes = Vec::with_capacity(kernels.len());
    let mut work_ns = Vec::with_capacity(kernels.len());
    let mut paths = Vec::with_capacity(kernels.len());
    let mut digits = Vec::with_capacity(kernels.len());
    for (idx, &(k, class)) in kernels.iter().enumerate() {
        if names.contains(&k.name.as_str()) || micro.iter().any(|(i, _)| kernels[*i].0.name == k.name) {
            return Err(CodegenError::Unsupported {
                kernel: k.name.clone(),
                what: "a second kernel of the same name".into(),
            });
        }
        if avx2_fma && options.contraction_kernels {
            k.verify().map_err(|e| CodegenError::Invalid { kernel: k.name.clone(), error: e })?;
            match emit_class(k, class, options, avx512, avx512vl, int8) {
                Ok(Some(m)) => {
                    needs |= m.needs;
                    workgroup_counts.push(m.workgroups);
                    // (Digits that do not multiply to the count describe nothing.)
                    let described = m.digits.iter().map(|d| d.count).product::<u64>() == m.workgroups;
                    digits.push(if described { m.digits } else { Vec::new() });
                    work_ns.push(cost::estimate_ns(k, m.path));
                    micro.push((idx, m.code));
                    notes.push(m.note);
                    paths.push(CodePath::Vector { bits: m.bits });
                    used_avx512 |= m.avx512;
                    continue;
                }
                Ok(None) => notes.push("general".to_string()),
                Err(gemm::NotHere(why)) => notes.push(format!("general ({why})")),
            }
        } else {
            notes.push("general".to_string());
        }
        names.push(&k.name);
        module.clear_context(&mut ctx);
        let vectorised = build_kernel(k, idx, &isa, options, &mut ctx.func, &mut fctx)?;
        paths.push(match (vectorised.is_empty(), one_point(k)) {
            (false, _) => CodePath::Vector128,
            (true, true) => CodePath::OnePoint,
            (true, false) => CodePath::Scalar,
        });
        let id =
            module.declare_function(&k.name, Linkage::Export, &ctx.func.signature).map_err(|e| internal(&k.name, e))?;
        module.define_function(id, &mut ctx).map_err(|e| internal(&k.name, format!("{e:?}")))?;
        workgroup_counts.push(workgroups(k));
        digits.push(if k.scatter.is_some() { Vec::new() } else { row_digits(k, k.out_rank().saturating_sub(1)) });
        work_ns.push(cost::estimate_ns(k, cost::Path::General));
    }
    let product = module.finish();
    let bytes = product.emit().map_err(|e| internal("", e))?;
    let mut executable = image::from_object(&bytes, &names, features, target.arch())?;
    if !micro.is_empty() {
        features |= CpuFeature::Avx.bit() | CpuFeature::Avx2.bit() | CpuFeature::Fma.bit();
        if used_avx512 {
            features |= CpuFeature::Avx512f.bit();
        }
        features |= needs;
        executable.features = features;
        // Microkernels go after the object's sections (position-independent, no
        // relocations); entries are put back in kernel order.
        let mut entries = std::mem::take(&mut executable.entries).into_iter();
        let mut micro = micro.into_iter().peekable();
        for idx in 0..kernels.len() {
            if micro.peek().is_some_and(|(i, _)| *i == idx) {
                let (_, code) = micro.next().expect("peeked");
                let at = executable.code.len().div_ceil(32) * 32;
                executable.code.resize(at, 0xCC);
                executable.code.extend_from_slice(&code);
                executable.entries.push((kernels[idx].0.name.clone(), at as u64));
            } else {
                let e = entries.next().ok_or_else(|| internal("", "an entry point went missing"))?;
                executable.entries.push(e);
            }
        }
    }
    Ok(CpuModule { executable, workgroups: workgroup_counts, notes, work_ns, paths, digits })
}
