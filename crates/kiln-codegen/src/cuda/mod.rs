//! PTX for kernels: the CUDA target (NVIDIA Hopper, `sm_90a`; and `sm_80`, see below).
//!
//! [`compile`] turns kernels into one PTX module ([`ptx::HEADER`]: ISA 8.0, `sm_90a`,
//! 64-bit addresses) with one `.visible .entry` per kernel, named after the kernel.
//! Every entry takes one `.u64` parameter per binding, the kernel's inputs in order
//! and then its output: global addresses of the bound ranges ([`Launch::params`]).
//! Each entry comes with its launch configuration ([`Launch`]): a one-dimensional grid
//! of one-dimensional blocks, whose threads walk the kernel's elements in a
//! grid-stride loop, so any grid size is correct and the grid is sized for occupancy,
//! not for the tensor.
//!
//! The kernel's class picks its emitter, as on the CPU:
//! - Elementwise and Movement ([`elementwise`]): each thread computes a group of
//!   consecutive elements along the innermost axis and stores them with one 128-bit
//!   `st.global.v4`/`.v2` (1- and 2-byte outputs: lanes packed into 32-bit words, a
//!   group of 16, 8 or 4 bytes); every load read at the output's innermost index of an
//!   input whose rows keep the group aligned is one vector load too. It declines rows
//!   that no group tiles.
//! - Contraction ([`contraction`]): register-tiled SIMT kernels in exact f32 FMA, a
//!   block tile of up to 128×128 staged through double-buffered shared memory, an
//!   8×8 (or 4×8, 4×4) accumulator tile per thread, convolutions as implicit GEMM
//!   through the operands' affine maps, the epilogue evaluated per element in
//!   registers. The grid is exactly one block per output tile. Products of at most 8
//!   rows (16 where the tiles would leave the GPU idle) take [`skinny`] instead: a lane per output column, the warps of a block (and
//!   the blocks of a cluster) splitting the reduction.
//! - Window ([`window`]): depthwise convolutions and pools over channel planes, a few
//!   adjacent outputs of a row per thread, taps unrolled at compile-time offsets,
//!   interior items without bounds checks, the epilogue fused. It declines the Window
//!   kernels that are not such planes (interpolating resamples).
//! - Rows ([`rows`]): each reduction once per row, a group of threads per row (a
//!   warp, part of one, or a block for long rows; a thread per row where the reduced
//!   axis strides and rows are many), combined with warp shuffles and shared memory;
//!   the walks unrolled, and a value several walks compute kept in registers, where a
//!   thread walks few positions. It declines arg reductions. General kernels with
//!   reductions take it too, each output element a row of one element.
//! - Attention (formed by default at half precision, [`tune::Tune::forms_attention`]):
//!   where Q, K or V is stored half, or under `KILN_CUDA_TUNE=attn=flash`, [`flash`]:
//!   a block per (head, 64 query rows), K and V tiles of 64 keys in shared memory,
//!   both products on `mma.sync` with f16 or bf16 operands (the operands' own type),
//!   the online softmax in registers (heads of 16..128 in steps of 16). Otherwise, and
//!   for what that declines, [`attention`]: a warp per query row, the scores one key at
//!   a time (the lanes split the depth and sum by shuffles), an online softmax
//!   rescaling the lanes' column accumulators; the score matrix never stored.
//! - Every other class, and what the class emitters decline ([`general`]): one
//!   thread per output element, reductions as loops in that thread. Correct for every
//!   kernel the expression evaluator ([`expr`]) handles; the class
//!   emitters above are the fast paths.
//!
//! An artifact may carry a second module for `sm_80` ([`compile_for`] with
//! [`tune::Arch::Sm80`], `kiln compile --cuda-arch sm_90a,sm_80`): the same kernels
//! without Hopper's instructions (no `wgmma`: `mma.sync` takes half products; no
//! thread-block clusters: no contraction splits `K` over blocks), so that the artifact
//! also runs on Ampere and Ada GPUs, each kernel's variant chosen at load.
//!
//! Each kernel's note says which emitter wrote it, and why a class emitter declined it
//! (`general (why)`), as on the CPU. Nothing here has run on a GPU yet: generated
//! kernels are validated with `ptxas -arch=sm_90a` in the tests, and their lowering is
//! the kernel interpreter's semantics (see `docs/cuda.md`).

pub mod attention;
pub mod contraction;
pub mod cubin;
mod elementwise;
pub mod expr;
pub mod feed;
pub mod flash;
mod general;
pub mod mma;
pub mod ptx;
pub mod rows;
pub mod skinny;
pub mod tune;
pub mod wgmma;
pub mod window;

use kiln_flow::class::KernelClass;
use kiln_flow::Kernel;
use kiln_module::program::{DeviceKind, Executable};

use self::ptx::{Imm, Ptx, Reg, RegClass};
use crate::CodegenError;

/// Threads per block of every kernel.
pub const BLOCK: u32 = 256;

/// The L2 cache of the H100 and H200 (50 MiB): an elementwise kernel that moves more
/// than this streams its groups past it ([`elementwise`]), since none of them could stay
/// for the next kernel anyway.
pub const L2_BYTES: u64 = 50 << 20;

/// Most blocks a grid gets: enough to fill an H200 (132 multiprocessors, 8 resident
/// blocks of 256 threads each) four times over; the grid-stride loop does the rest.
pub const MAX_GRID: u64 = 132 * 8 * 4;

/// How a kernel is launched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Blocks in the (one-dimensional) grid.
    pub grid: u64,
    /// Threads per block (a multiple of 32, at most 1024).
    pub block: u32,
    /// Bytes of dynamic shared memory per block (`.extern .shared`; 0: none). Over
    /// 48 KiB the runtime raises the entry's dynamic shared-memory limit before launch.
    pub shared: u32,
    /// Number of `.u64` parameters: one global address per binding (inputs, then the
    /// output).
    pub params: u32,
}

/// Compiled kernels: one PTX module (the executable's code) and, per kernel in input
/// order, its launch and a note on how it was generated. Entry `i` of the executable is
/// kernel `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaModule {
    /// The PTX module, as an executable of device kind CUDA (code = PTX text; entries at
    /// the byte offset of their `.entry`).
    pub executable: Executable,
    /// Each kernel's launch.
    pub launches: Vec<Launch>,
    /// How each kernel was compiled (`elementwise (v4 store, 2 vector loads)`,
    /// `general (why)`).
    pub notes: Vec<String>,
}

impl CudaModule {
    /// The PTX text.
    pub fn ptx(&self) -> &str {
        std::str::from_utf8(&self.executable.code).unwrap_or("")
    }
}

/// One kernel's entry text, launch and note.
pub struct Entry {
    /// The `.entry` text.
    pub text: String,
    /// Its launch.
    pub launch: Launch,
    /// How it was generated.
    pub note: String,
}

/// Compiles `kernels` (each with its class) into one PTX module, with the kernel
/// variants the measurement knob [`tune::VAR`] asks for (the defaults where it is unset;
/// a malformed value is a [`CodegenError::Setting`]).
pub fn compile(kernels: &[(&Kernel, KernelClass)]) -> Result<CudaModule, CodegenError> {
    compile_for(kernels, tune::Arch::Sm90a)
}

/// [`compile`] for the GPU architecture `arch` (the same kernels, each written with
/// the instructions `arch` has: see [`tune::Arch`]).
pub fn compile_for(kernels: &[(&Kernel, KernelClass)], arch: tune::Arch) -> Result<CudaModule, CodegenError> {
    let tune = tune::Tune { arch, ..tune::Tune::from_env().map_err(CodegenError::Setting)? };
    compile_tuned(kernels, &tune)
}

/// [`compile`] with the variants `tune` (see [`tune`]).
pub fn compile_tuned(kernels: &[(&Kernel, KernelClass)], tune: &tune::Tune) -> Result<CudaModule, CodegenError> {
    let mut code = String::from(tune.arch.header());
    let mut entries = Vec::new();
    let mut launches = Vec::new();
    let mut notes = Vec::new();
    for &(k, class) in kernels {
        k.verify().map_err(|error| CodegenError::Invalid { kernel: k.name.clone(), error })?;
        let e = compile_kernel_tuned(k, class, tune)?;
        code.push('\n');
        // The `.entry` itself (a dynamic shared-memory declaration may precede it).
        let at = e.text.find(".visible .entry").unwrap_or(0);
        entries.push((k.name.clone(), (code.len() + at) as u64));
        code.push_str(&e.text);
        launches.push(e.launch);
        notes.push(e.note);
    }
    Ok(CudaModule {
        executable: Executable {
            device: DeviceKind::Cuda,
            features: 0,
            code: code.into_bytes(),
            entries,
            relocs: Vec::new(),
            // The launches are recorded by the compiler from `CudaModule::launches`.
            launches: Vec::new(),
        },
        launches,
        notes,
    })
}

/// One kernel: its class's emitter, or the general mapping where there is none yet or
/// it declines.
pub fn compile_kernel(k: &Kernel, class: KernelClass) -> Result<Entry, CodegenError> {
    compile_kernel_tuned(k, class, &tune::Tune::default())
}

/// [`compile_kernel`] with the variants `tune`.
pub fn compile_kernel_tuned(k: &Kernel, class: KernelClass, tune: &tune::Tune) -> Result<Entry, CodegenError> {
    // Two 4-bit elements share a byte: only the general mapping writes whole bytes; a
    // scatter's points store in order at computed positions: its own mapping there.
    if expr::is_nibble(k.output.dtype) || k.scatter.is_some() {
        return general::emit(k);
    }
    let tried = match class {
        KernelClass::Elementwise | KernelClass::Movement => elementwise::emit(k, class, &tune.elt)?,
        KernelClass::Window => window::emit(k)?,
        KernelClass::Contraction => contraction::emit(k, tune)?,
        KernelClass::Rows => rows::emit(k)?,
        // Reductions of no Rows kernel: a group of threads per output element; the
        // general mapping keeps its plain note where that declines.
        KernelClass::General => rows::emit_general(k)?,
        KernelClass::Attention => attention::emit(k, tune.attention)?,
    };
    let why = match tried {
        Ok(e) => return Ok(e),
        Err(why) => why,
    };
    let mut e = general::emit(k)?;
    if class != KernelClass::General {
        e.note = format!("general ({why})");
    }
    Ok(e)
}

/// Most bytes of static shared memory a block may declare (ptxas refuses more).
pub const STATIC_SHARED: u32 = 48 * 1024;

/// The dynamic shared memory a block of `bytes` asks at launch ([`Launch::shared`]):
/// none up to [`STATIC_SHARED`] (a static array), else all of it.
pub fn dynamic_bytes(bytes: u32) -> u32 {
    if bytes > STATIC_SHARED {
        bytes
    } else {
        0
    }
}

/// Declares a block's `bytes` of shared memory aligned to `align` and returns its name:
/// a static array up to [`STATIC_SHARED`], else the entry's dynamic shared memory
/// (sized by the launch, [`dynamic_bytes`]).
fn declare_shared(p: &mut Ptx, tag: &str, bytes: u32, align: u32) -> String {
    if dynamic_bytes(bytes) > 0 {
        p.dynamic_shared(tag, align)
    } else {
        p.shared(tag, bytes, align)
    }
}

fn internal(k: &Kernel, e: ptx::PtxError) -> CodegenError {
    CodegenError::Internal { kernel: k.name.clone(), what: e.0 }
}

/// The thread's place in the grid, as PTX's special registers give it (u32 each).
struct Ids {
    /// `%tid.x`: the thread within its block.
    tid: Reg,
    /// `%ntid.x`: threads per block.
    ntid: Reg,
    /// `%ctaid.x`: the block within the grid.
    ctaid: Reg,
    /// `%nctaid.x`: blocks in the grid.
    nctaid: Reg,
}

impl Ids {
    fn read(p: &mut Ptx) -> Ids {
        let tid = p.special("%tid.x");
        let ntid = p.special("%ntid.x");
        let ctaid = p.special("%ctaid.x");
        let nctaid = p.special("%nctaid.x");
        Ids { tid, ntid, ctaid, nctaid }
    }

    /// The thread's index in the grid, `ctaid · ntid + tid` (u64).
    fn global_thread(&self, p: &mut Ptx) -> Reg {
        let tid64 = p.reg(RegClass::B64);
        p.op("cvt.u64.u32", &[tid64.into(), self.tid.into()]);
        let g = p.reg(RegClass::B64);
        p.op("mad.wide.u32", &[g.into(), self.ctaid.into(), self.ntid.into(), tid64.into()]);
        g
    }

    /// Threads in the grid, `nctaid · ntid` (u64).
    fn grid_threads(&self, p: &mut Ptx) -> Reg {
        let n = p.reg(RegClass::B64);
        p.op("mul.wide.u32", &[n.into(), self.nctaid.into(), self.ntid.into()]);
        n
    }
}

/// The prologue every entry shares: global base addresses of the bindings, the
/// thread's first group index and the grid's stride, and the loop head; returns
/// `(bases, group, loop end label, loop head label, stride)`.
struct Skeleton {
    bases: Vec<Reg>,
    group: Reg,
    stride: Reg,
    head: ptx::Label,
    end: ptx::Label,
}

impl Skeleton {
    /// Opens the grid-stride loop over `0..groups`.
    fn open(p: &mut Ptx, bindings: usize, groups: u64) -> Skeleton {
        let bases = p.binding_bases(bindings);
        let ids = Ids::read(p);
        let group = ids.global_thread(p);
        let stride = ids.grid_threads(p);
        let (head, end) = (p.label(), p.label());
        p.place(head);
        let done = p.reg(RegClass::Pred);
        p.op("setp.ge.u64", &[done.into(), group.into(), Imm::U(groups).into()]);
        // Threads leave the loop after different numbers of turns: a divergent branch.
        p.branch(Some((done, false)), end);
        Skeleton { bases, group, stride, head, end }
    }

    /// Closes the loop.
    fn close(self, p: &mut Ptx) {
        p.op("add.s64", &[self.group.into(), self.group.into(), self.stride.into()]);
        p.bra(None, self.head);
        p.place(self.end);
    }
}

/// The output index (one i64 register per dimension) of flat element `flat`.
fn decompose(p: &mut Ptx, flat: Reg, dims: &[usize]) -> Vec<Reg> {
    let extents: Vec<u64> = dims.iter().map(|&d| d as u64).collect();
    digits(p, flat, &extents, (RegClass::B64, "u64"))
}

/// `x` taken apart row-major into `extents` (outermost first), in registers of class
/// `class` and arithmetic of type `ty`: the innermost is `x mod extent`, and so on
/// outwards; the outermost takes what is left.
fn digits(p: &mut Ptx, x: Reg, extents: &[u64], (class, ty): (RegClass, &str)) -> Vec<Reg> {
    let mut out = vec![x; extents.len()];
    let mut rest = x;
    for d in (1..extents.len()).rev() {
        let e = Imm::U(extents[d]);
        let r = p.reg(class);
        p.op(&format!("rem.{ty}"), &[r.into(), rest.into(), e.into()]);
        let q = p.reg(class);
        p.op(&format!("div.{ty}"), &[q.into(), rest.into(), e.into()]);
        out[d] = r;
        rest = q;
    }
    if let Some(o) = out.first_mut() {
        *o = rest;
    }
    out
}

/// The launch of a kernel walking `groups` groups of elements.
fn launch(k: &Kernel, groups: u64) -> Launch {
    Launch {
        grid: groups.div_ceil(u64::from(BLOCK)).clamp(1, MAX_GRID),
        block: BLOCK,
        shared: 0,
        params: (k.inputs.len() + 1) as u32,
    }
}
