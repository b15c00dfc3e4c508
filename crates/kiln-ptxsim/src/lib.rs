//! `kiln-ptxsim`, the host PTX simulator of the CUDA test suites (a dev-dependency of
//! kiln-codegen and kiln-cli, never of a library; a crate of its own so that it is
//! compiled once, optimised, rather than into every suite): runs one entry of a module kiln
//! wrote, on the host, over bindings in host memory, so that every CUDA emitter's
//! output (elementwise, general, rows, window, contraction) is checked against the
//! kernel interpreter without a GPU. One simulator for all suites: parsing and decoding
//! ([`parse`]), execution ([`run`]), and the comparison with the interpreter
//! ([`check_against_interpreter`]).
//!
//! **Execution model.** A cluster of blocks (`.reqnctapercluster`, 1 without) runs at a
//! time. Every thread runs on its own up to its next *synchronising* instruction
//! (`shfl.sync`, `bar.sync`, `barrier.cluster.wait`) or its exit; then the scheduler
//! completes what can complete: a shuffle whose member lanes (its mask) are all stopped
//! at that same instruction runs for them together (the PTX ISA's `shfl.sync`
//! semantics: `.up/.down/.bfly/.idx`, the `c` operand's clamp and segment mask, the
//! optional predicate destination); a block whose threads all wait at `bar.sync` goes
//! on; a cluster whose live threads all wait at `barrier.cluster.wait` goes on. Anything
//! else is an error, never a hang: a shuffle lane that exited or waits elsewhere, a
//! source lane that does not take part, `bar.sync` with some threads of the block
//! exited (barrier divergence), threads at different barriers. Every thread and every
//! run has an instruction budget ([`Limits`]).
//!
//! **Memory.** Registers hold raw bits, masked to their declared width on write.
//! Global memory is the bindings, each at its own base far from the others; every
//! access (scalar or `.v2/.v4`) must lie inside one binding and be naturally aligned,
//! else the run fails (so predicated-off accesses are proven not made). Shared memory
//! is one byte array per block holding the entry's `.shared` variables (its own and
//! the module-scope ones, not other entries'): the static ones, then the dynamic region
//! (the launch's `shared` bytes) where every `.extern .shared` array of the module
//! starts, as PTX aliases them; an access must lie inside one variable, aligned, and a read of a byte never written in this block is an error
//! (uninitialised shared read). `mapa.shared::cluster` tags a shared address with a
//! rank; `ld.shared::cluster` reads that block's shared memory (an untagged address is
//! the own block's).
//!
//! **Arithmetic** follows the PTX ISA: integer ops wrap at their type's width
//! (`mul.lo/.hi/.wide`, `mad.lo/.wide`, `div/rem` signed and unsigned, division by zero
//! is an error: PTX leaves its result unspecified), shifts clamp their amount; float
//! `add/sub/mul/div/fma/sqrt/rcp` must say `.rn` (without it ptxas may contract, so the
//! result would not be defined by the text) and round once (Rust's IEEE operations;
//! `fma` fused). `min/max.f32/f64` return the non-NaN operand (both NaN: NaN) and
//! order −0 below +0; `.NaN` returns NaN if either is. `setp` has all ordered and
//! unordered comparisons; `selp`; predicate logic; `prmt.b32` (default mode: byte
//! selection with sign replication). `cvt`: integer widths with sign or zero extension
//! and `.sat`; float → integer with `.rni/.rzi/.rmi/.rpi`, saturating to
//! the destination's range, NaN → 0; integer → float and f64 → f32 with `.rn`;
//! f32/f64 → f16/bf16 with `.rn`, rounded once (NaN → canonical NaN); f16/bf16 → f32 exactly; float →
//! same float with `.rni/.rzi/.rmi/.rpi`.
//!
//! **Tensor cores and asynchronous copies** (PTX ISA, written from its tables, not
//! from the emitter's index functions, so the simulator checks `cuda::mma`
//! independently): `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32`
//! and `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16` are warp-collective
//! like `shfl.sync` with every lane of the warp in the mask (`.aligned`); `mma` takes
//! exact products, sums them with `c` in f64 and rounds once to f32 (the hardware's
//! accumulation order and internal precision are unspecified: a tolerance's business).
//! `cp.async.{ca,cg}.shared.global` (cp-size 16, optional src-size: the rest
//! zero-filled, src-size 0 reads nothing) is a pending copy of the issuing thread,
//! grouped by `cp.async.commit_group` and landed by its `cp.async.wait_group N` /
//! `wait_all`; reading or writing a shared byte with a copy outstanding is an error (a
//! race), and so is another thread reading a landed byte before a barrier follows the
//! wait that landed it, or a `cp.async` into bytes another thread read with no barrier
//! since (the copy may land before that read).
//! `wgmma.mma_async.sync.aligned.m64nNk16.f32.{f16,bf16}` (both operands from shared
//! memory through matrix descriptors: start address, leading and stride byte offsets,
//! no swizzle or the 128-byte one) is warpgroup-collective (128 consecutive threads of
//! the block, every operand the same); its result is computed at issue, its shared
//! reads stay outstanding (a write to those bytes is a race) and its accumulators hold
//! a NaN poison until the thread's `wgmma.wait_group` retires its group
//! (`wgmma.commit_group`); it needs a `wgmma.fence` after any other write of its
//! accumulators, and shared bytes written through the generic proxy (stores, landed
//! `cp.async`) need their writer's `fence.proxy.async.shared::cta` since (and, like
//! any read of another thread's bytes, a barrier).
//!
//! **Not modelled.** Approximate instructions (`ex2/lg2/sin/cos/tanh/rcp/sqrt.approx`)
//! return the correctly rounded exact value (f64 libm, rounded to f32): the hardware's
//! documented error (`ex2.approx.f32`: 2 ulp; `lg2.approx.f32`: 2⁻²²·⁶ absolute near 1;
//! `sin/cos.approx.f32`: 2⁻²⁰·⁵ absolute in [−π, π]; `tanh.approx.f32`: 2⁻¹¹ relative)
//! is for the caller's tolerance to absorb, so a kernel using them is checked within a
//! tolerance, never bit for bit on a GPU. `.ftz` is refused, as are rounding modes
//! other than the ones listed. Scheduling, caches, memory ordering across blocks
//! (blocks of different clusters run one after another) and timing are not
//! modelled; `bra.uni`'s promise is checked (the n-th execution of it by every lane of
//! a warp must go the same way): a GPU run stays the final
//! word (docs/cuda.md). Any instruction, modifier, operand or directive outside this
//! list fails [`parse`] naming it: nothing is ever skipped.

pub mod isa;

use std::collections::HashMap;
use std::fmt;

use kiln_flow::{interp, Kernel};
use kiln_ir::{DType, Tensor, TensorType};

// ------------------------------------------------------------------------------------
// Errors

/// Why a simulation failed.
#[derive(Debug, Clone, PartialEq)]
pub enum SimError {
    /// The text is not PTX the simulator reads (with the line).
    Parse(String),
    /// An instruction, modifier or operand the simulator does not model (named).
    Unsupported(String),
    /// A global or shared access outside every binding / variable, or misaligned.
    OutOfBounds(String),
    /// A shared-memory read of bytes no thread of the block wrote.
    Uninitialised(String),
    /// A barrier or shuffle not reached by every thread it needs.
    Divergence(String),
    /// A thread or the run went past its instruction budget.
    Budget(String),
    /// Integer division by zero and other undefined operations.
    Undefined(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Parse(s) => write!(f, "parse: {s}"),
            SimError::Unsupported(s) => write!(f, "unsupported by the simulator: {s}"),
            SimError::OutOfBounds(s) => write!(f, "out of bounds: {s}"),
            SimError::Uninitialised(s) => write!(f, "uninitialised shared read: {s}"),
            SimError::Divergence(s) => write!(f, "divergence: {s}"),
            SimError::Budget(s) => write!(f, "budget: {s}"),
            SimError::Undefined(s) => write!(f, "undefined: {s}"),
        }
    }
}

type R<T> = Result<T, SimError>;

fn parse_err<T>(s: impl Into<String>) -> R<T> {
    Err(SimError::Parse(s.into()))
}

fn unsupported<T>(s: impl Into<String>) -> R<T> {
    Err(SimError::Unsupported(s.into()))
}

// ------------------------------------------------------------------------------------
// Decoded instructions

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Pred,
    B(u32),
    U(u32),
    S(u32),
    F16,
    Bf16,
    F32,
    F64,
}

impl Ty {
    fn of(s: &str) -> Option<Ty> {
        Some(match s {
            "pred" => Ty::Pred,
            "b8" => Ty::B(8),
            "b16" => Ty::B(16),
            "b32" => Ty::B(32),
            "b64" => Ty::B(64),
            "u8" => Ty::U(8),
            "u16" => Ty::U(16),
            "u32" => Ty::U(32),
            "u64" => Ty::U(64),
            "s8" => Ty::S(8),
            "s16" => Ty::S(16),
            "s32" => Ty::S(32),
            "s64" => Ty::S(64),
            "f16" => Ty::F16,
            "bf16" => Ty::Bf16,
            "f32" => Ty::F32,
            "f64" => Ty::F64,
            _ => return None,
        })
    }

    fn bits(self) -> u32 {
        match self {
            Ty::Pred => 1,
            Ty::B(n) | Ty::U(n) | Ty::S(n) => n,
            Ty::F16 | Ty::Bf16 => 16,
            Ty::F32 => 32,
            Ty::F64 => 64,
        }
    }

    fn bytes(self) -> usize {
        (self.bits() as usize).div_ceil(8)
    }

    fn is_float(self) -> bool {
        matches!(self, Ty::F16 | Ty::Bf16 | Ty::F32 | Ty::F64)
    }

    fn is_signed(self) -> bool {
        matches!(self, Ty::S(_))
    }

    fn is_int(self) -> bool {
        matches!(self, Ty::B(_) | Ty::U(_) | Ty::S(_))
    }
}

fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// `v`'s low `bits` as a signed or unsigned integer.
fn ext(v: u64, bits: u32, signed: bool) -> i128 {
    let m = v & mask(bits);
    if signed && bits < 64 && m >> (bits - 1) & 1 == 1 {
        m as i128 - (1i128 << bits)
    } else if signed && bits == 64 {
        m as i64 as i128
    } else {
        m as i128
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Add,
    Sub,
    Mul,
    Mad,
    Fma,
    Div,
    Rem,
    Min,
    Max,
    Neg,
    Abs,
    Not,
    And,
    Or,
    Xor,
    Shl,
    Shr,
    Setp,
    Selp,
    Mov,
    Cvt,
    Cvta,
    Ld,
    St,
    Bra,
    Ret,
    BarSync,
    ClusterArrive,
    ClusterWait,
    Shfl,
    Mapa,
    Sqrt,
    Rcp,
    Rsqrt,
    Ex2,
    Lg2,
    Sin,
    Cos,
    Tanh,
    Copysign,
    /// `prmt.b32 d, a, b, c` (default mode): byte `i` of `d` is byte `c[4i+2:4i]` of
    /// `{b, a}`, or that byte's sign replicated where `c[4i+3]` is set.
    Prmt,
    /// `mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32` (warp-collective).
    Mma,
    /// `ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16` (warp-collective).
    Ldmatrix,
    /// `cp.async.{ca,cg}.shared.global [d], [s], 16[, src-size]`.
    CpAsync,
    /// `cp.async.commit_group`.
    CpCommit,
    /// `cp.async.wait_group N`.
    CpWait,
    /// `cp.async.wait_all`.
    CpWaitAll,
    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T d, a-desc, b-desc, scale-d,
    /// imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b` (warpgroup-collective).
    Wgmma,
    /// `wgmma.fence.sync.aligned`.
    WgFence,
    /// `wgmma.commit_group.sync.aligned`.
    WgCommit,
    /// `wgmma.wait_group.sync.aligned N`.
    WgWait,
    /// `fence.proxy.async.shared::cta`.
    ProxyFence,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rnd {
    Rn,
    Rz,
    Rm,
    Rp,
    Rni,
    Rzi,
    Rmi,
    Rpi,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Space {
    Global,
    Shared,
    Cluster,
    Param,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Width {
    Lo,
    Hi,
    Wide,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shfl {
    Up,
    Down,
    Bfly,
    Idx,
}

#[derive(Debug, Clone, Default)]
struct Mods {
    rnd: Option<Rnd>,
    width: Option<Width>,
    approx: bool,
    nan: bool,
    sat: bool,
    cmp: Option<String>,
    space: Option<Space>,
    vec: u8,
    shfl: Option<Shfl>,
    uni: bool,
    /// `ldmatrix … .trans`.
    trans: bool,
    /// `wgmma`'s N (of m64nNk16).
    n: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sp {
    Tid,
    Ntid,
    Ctaid,
    Nctaid,
    Zero,
    One,
    Lane,
    Rank,
    Nrank,
}

#[derive(Debug, Clone)]
enum Opnd {
    Reg(usize),
    /// `d|p`: a value and a predicate destination.
    Pair(usize, usize),
    Imm(u64),
    /// `[base+off]`: a register or a shared variable's address, plus an offset.
    Addr(Box<Opnd>, i64),
    Vec(Vec<usize>),
    Label(usize),
    Param(usize),
    Special(Sp),
    /// A shared variable's address.
    Sym(usize),
}

#[derive(Debug, Clone)]
struct Inst {
    guard: Option<(usize, bool)>,
    op: Op,
    tys: Vec<Ty>,
    m: Mods,
    a: Vec<Opnd>,
    text: String,
}

/// A `.shared` variable: name, alignment, bytes (`None`: `.extern`, the launch's size).
#[derive(Debug, Clone)]
struct SharedVar {
    name: String,
    align: u64,
    bytes: Option<u64>,
}

/// A parsed entry, ready to run.
pub struct Entry {
    pub name: String,
    insts: Vec<Inst>,
    widths: Vec<u32>,
    reg_names: Vec<String>,
    shared: Vec<SharedVar>,
    params: usize,
    /// Blocks per cluster (`.reqnctapercluster`; 1 without).
    pub cluster: u32,
}

fn decode(opcode: &str) -> R<(Op, Vec<Ty>, Mods)> {
    if let Some(d) = decode_matrix(opcode)? {
        return Ok(d);
    }
    let mut parts = opcode.split('.');
    let head = parts.next().unwrap_or_default();
    let op = match head {
        "add" => Op::Add,
        "sub" => Op::Sub,
        "mul" => Op::Mul,
        "mad" => Op::Mad,
        "fma" => Op::Fma,
        "div" => Op::Div,
        "rem" => Op::Rem,
        "min" => Op::Min,
        "max" => Op::Max,
        "neg" => Op::Neg,
        "abs" => Op::Abs,
        "not" => Op::Not,
        "and" => Op::And,
        "or" => Op::Or,
        "xor" => Op::Xor,
        "shl" => Op::Shl,
        "shr" => Op::Shr,
        "setp" => Op::Setp,
        "selp" => Op::Selp,
        "mov" => Op::Mov,
        "cvt" => Op::Cvt,
        "cvta" => Op::Cvta,
        "ld" => Op::Ld,
        "st" => Op::St,
        "bra" => Op::Bra,
        "ret" => Op::Ret,
        "bar" => Op::BarSync,
        "barrier" => Op::ClusterWait,
        "shfl" => Op::Shfl,
        "mapa" => Op::Mapa,
        "sqrt" => Op::Sqrt,
        "rcp" => Op::Rcp,
        "rsqrt" => Op::Rsqrt,
        "ex2" => Op::Ex2,
        "lg2" => Op::Lg2,
        "sin" => Op::Sin,
        "cos" => Op::Cos,
        "tanh" => Op::Tanh,
        "copysign" => Op::Copysign,
        "prmt" => Op::Prmt,
        _ => return unsupported(format!("instruction `{opcode}`")),
    };
    let mut op = op;
    let mut tys = Vec::new();
    let mut m = Mods::default();
    let cmps = [
        "eq", "ne", "lt", "le", "gt", "ge", "lo", "ls", "hi", "hs", "equ", "neu", "ltu", "leu", "gtu", "geu", "num",
        "nan",
    ];
    for p in parts {
        if let Some(t) = Ty::of(p) {
            tys.push(t);
            continue;
        }
        match (op, p) {
            (_, "rn") => m.rnd = Some(Rnd::Rn),
            (_, "rz") => m.rnd = Some(Rnd::Rz),
            (_, "rm") => m.rnd = Some(Rnd::Rm),
            (_, "rp") => m.rnd = Some(Rnd::Rp),
            (Op::Cvt, "rni") => m.rnd = Some(Rnd::Rni),
            (Op::Cvt, "rzi") => m.rnd = Some(Rnd::Rzi),
            (Op::Cvt, "rmi") => m.rnd = Some(Rnd::Rmi),
            (Op::Cvt, "rpi") => m.rnd = Some(Rnd::Rpi),
            (Op::Mul | Op::Mad, "lo") => m.width = Some(Width::Lo),
            (Op::Mul | Op::Mad, "hi") => m.width = Some(Width::Hi),
            (Op::Mul | Op::Mad, "wide") => m.width = Some(Width::Wide),
            (Op::Ex2 | Op::Lg2 | Op::Sin | Op::Cos | Op::Tanh | Op::Rcp | Op::Sqrt | Op::Rsqrt | Op::Div, "approx") => {
                m.approx = true
            }
            (Op::Min | Op::Max, "NaN") => m.nan = true,
            (Op::Cvt, "sat") => m.sat = true,
            (Op::Setp, c) if cmps.contains(&c) && m.cmp.is_none() => m.cmp = Some(c.to_string()),
            (Op::Ld | Op::St, "global") => m.space = Some(Space::Global),
            (Op::Ld | Op::St, "shared") => m.space = Some(Space::Shared),
            (Op::Ld, "shared::cluster") => m.space = Some(Space::Cluster),
            (Op::Mapa, "shared::cluster") => m.space = Some(Space::Cluster),
            (Op::Ld, "param") => m.space = Some(Space::Param),
            // Cache operators (`.cs` streaming, evict first; `.ca`/`.cg`/`.lu`/`.cv` on
            // loads, `.wb`/`.wt` on stores) change where a line is kept, never a value.
            (Op::Ld, "ca" | "cg" | "cs" | "lu" | "cv") | (Op::St, "wb" | "cg" | "cs" | "wt") => {}
            (Op::Ld | Op::St, "v2") => m.vec = 2,
            (Op::Ld | Op::St, "v4") => m.vec = 4,
            (Op::Cvta, "to") => {}
            (Op::Cvta, "global") => m.space = Some(Space::Global),
            (Op::Bra, "uni") => m.uni = true,
            (Op::BarSync, "sync") => {}
            (Op::ClusterWait, "cluster") => {}
            (Op::ClusterWait, "arrive") => op = Op::ClusterArrive,
            (Op::ClusterWait, "wait") => {}
            (Op::Shfl, "sync") => {}
            (Op::Shfl, "up") => m.shfl = Some(Shfl::Up),
            (Op::Shfl, "down") => m.shfl = Some(Shfl::Down),
            (Op::Shfl, "bfly") => m.shfl = Some(Shfl::Bfly),
            (Op::Shfl, "idx") => m.shfl = Some(Shfl::Idx),
            _ => return unsupported(format!("modifier `.{p}` in `{opcode}`")),
        }
    }
    if m.vec == 0 {
        m.vec = 1;
    }
    let float = tys.first().is_some_and(|t| t.is_float());
    // Shapes the simulator models; anything else is refused here, by name.
    let ok = match op {
        Op::Add | Op::Sub | Op::Mul | Op::Div if float => {
            tys.len() == 1 && (m.rnd == Some(Rnd::Rn) || (op == Op::Div && m.approx)) && tys[0] != Ty::F16
        }
        Op::Fma | Op::Sqrt | Op::Rcp => tys.len() == 1 && float && (m.rnd == Some(Rnd::Rn) || m.approx),
        Op::Mad if float => false,
        Op::Add | Op::Sub | Op::Div | Op::Rem => tys.len() == 1 && m.rnd.is_none() && tys[0].is_int(),
        Op::Mul | Op::Mad => tys.len() == 1 && m.width.is_some() && tys[0].is_int(),
        Op::Min | Op::Max | Op::Neg | Op::Abs => {
            tys.len() == 1 && m.rnd.is_none() && (!m.nan || float) && tys[0] != Ty::Pred
        }
        Op::Not | Op::And | Op::Or | Op::Xor => tys.len() == 1 && matches!(tys[0], Ty::B(_) | Ty::Pred),
        Op::Shl => tys.len() == 1 && matches!(tys[0], Ty::B(_)),
        Op::Shr => tys.len() == 1 && tys[0].is_int(),
        Op::Setp => tys.len() == 1 && m.cmp.is_some(),
        Op::Selp | Op::Mov => tys.len() == 1,
        Op::Cvt => tys.len() == 2 && !m.approx,
        Op::Cvta => tys == [Ty::U(64)] && m.space == Some(Space::Global),
        Op::Ld => tys.len() == 1 && m.space.is_some() && !(m.space == Some(Space::Param) && m.vec > 1),
        Op::St => tys.len() == 1 && m.space.is_some(),
        Op::Bra | Op::Ret | Op::BarSync | Op::ClusterArrive | Op::ClusterWait => tys.is_empty(),
        Op::Shfl => tys == [Ty::B(32)] && m.shfl.is_some(),
        Op::Mapa => tys == [Ty::U(32)] && m.space == Some(Space::Cluster),
        Op::Rsqrt | Op::Ex2 | Op::Lg2 | Op::Sin | Op::Cos | Op::Tanh => tys == [Ty::F32] && m.approx,
        Op::Copysign => tys.len() == 1 && matches!(tys[0], Ty::F32 | Ty::F64),
        Op::Prmt => tys == [Ty::B(32)] && m.rnd.is_none(),
        // Decoded by `decode_matrix` only.
        Op::Mma | Op::Ldmatrix | Op::CpAsync | Op::CpCommit | Op::CpWait | Op::CpWaitAll => false,
        Op::Wgmma | Op::WgFence | Op::WgCommit | Op::WgWait | Op::ProxyFence => false,
    };
    if !ok {
        return unsupported(format!("instruction `{opcode}` (this form)"));
    }
    Ok((op, tys, m))
}

/// The tensor-core and asynchronous-copy instructions, each in exactly the forms the
/// simulator models (`None`: not one of them).
fn decode_matrix(opcode: &str) -> R<Option<(Op, Vec<Ty>, Mods)>> {
    let parts: Vec<&str> = opcode.split('.').collect();
    let mut m = Mods { vec: 1, ..Mods::default() };
    let refuse = || unsupported(format!("instruction `{opcode}` (this form)"));
    match parts[0] {
        "mma" => {
            let (ab, ok) = match parts[..] {
                ["mma", "sync", "aligned", "m16n8k16", "row", "col", "f32", a, b, "f32"] if a == b => {
                    (Ty::of(a), matches!(a, "f16" | "bf16"))
                }
                _ => (None, false),
            };
            match (ab, ok) {
                (Some(t), true) => Ok(Some((Op::Mma, vec![Ty::F32, t, t, Ty::F32], m))),
                _ => refuse(),
            }
        }
        "ldmatrix" => {
            let (num, trans) = match parts[..] {
                ["ldmatrix", "sync", "aligned", "m8n8", x, "shared", "b16"] => (x, false),
                ["ldmatrix", "sync", "aligned", "m8n8", x, "trans", "shared", "b16"] => (x, true),
                _ => return refuse(),
            };
            m.vec = match num {
                "x1" => 1,
                "x2" => 2,
                "x4" => 4,
                _ => return refuse(),
            };
            m.trans = trans;
            m.space = Some(Space::Shared);
            Ok(Some((Op::Ldmatrix, vec![Ty::B(16)], m)))
        }
        "wgmma" => match parts[..] {
            ["wgmma", "mma_async", "sync", "aligned", shape, "f32", a, b] if a == b && matches!(a, "f16" | "bf16") => {
                let n = shape
                    .strip_prefix("m64n")
                    .and_then(|x| x.strip_suffix("k16"))
                    .and_then(|x| x.parse::<u32>().ok())
                    .filter(|&n| (8..=256).contains(&n) && n % 8 == 0);
                let (Some(n), Some(t)) = (n, Ty::of(a)) else { return refuse() };
                m.n = n;
                Ok(Some((Op::Wgmma, vec![Ty::F32, t, t], m)))
            }
            ["wgmma", "fence", "sync", "aligned"] => Ok(Some((Op::WgFence, vec![], m))),
            ["wgmma", "commit_group", "sync", "aligned"] => Ok(Some((Op::WgCommit, vec![], m))),
            ["wgmma", "wait_group", "sync", "aligned"] => Ok(Some((Op::WgWait, vec![], m))),
            _ => refuse(),
        },
        "fence" => match parts[..] {
            ["fence", "proxy", "async", "shared::cta"] => Ok(Some((Op::ProxyFence, vec![], m))),
            _ => refuse(),
        },
        "cp" => match parts[..] {
            ["cp", "async", "ca" | "cg", "shared", "global"] => {
                m.space = Some(Space::Shared);
                Ok(Some((Op::CpAsync, vec![], m)))
            }
            ["cp", "async", "commit_group"] => Ok(Some((Op::CpCommit, vec![], m))),
            ["cp", "async", "wait_group"] => Ok(Some((Op::CpWait, vec![], m))),
            ["cp", "async", "wait_all"] => Ok(Some((Op::CpWaitAll, vec![], m))),
            _ => refuse(),
        },
        _ => Ok(None),
    }
}

fn parse_imm(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0f") {
        return u32::from_str_radix(h, 16).ok().map(u64::from);
    }
    if let Some(h) = s.strip_prefix("0d") {
        return u64::from_str_radix(h, 16).ok();
    }
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        return u64::from_str_radix(h, 16).ok();
    }
    s.parse::<i64>().ok().map(|x| x as u64)
}

/// `.shared .align A .b8 NAME[N]` (or `.extern .shared … NAME[]`), from after `.shared`.
fn shared_var(rest: &str) -> R<SharedVar> {
    let words: Vec<&str> = rest.split_whitespace().collect();
    let mut align = 1;
    let mut i = 0;
    while i < words.len() {
        match words[i] {
            ".align" => {
                align = words.get(i + 1).and_then(|a| a.parse().ok()).ok_or(SimError::Parse(rest.into()))?;
                i += 2;
            }
            ".b8" => i += 1,
            w => {
                let (name, n) = w.split_once('[').ok_or(SimError::Parse(format!(".shared {rest}")))?;
                let n = n.trim_end_matches(';').trim_end_matches(']');
                let bytes =
                    if n.is_empty() { None } else { Some(n.parse().map_err(|_| SimError::Parse(rest.into()))?) };
                return Ok(SharedVar { name: name.to_string(), align, bytes });
            }
        }
    }
    parse_err(format!(".shared {rest}"))
}

/// The names of the `.entry`s of `ptx`, in order.
pub fn entries(ptx: &str) -> Vec<String> {
    ptx.lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or_default().trim().to_string())
        .collect()
}

/// Parses entry number `index` of `ptx` (module-scope `.shared` variables before it
/// are visible to it).
pub fn parse(ptx: &str, index: usize) -> R<Entry> {
    let names = entries(ptx);
    let name =
        names.get(index).ok_or_else(|| SimError::Parse(format!("no entry {index} ({} entries)", names.len())))?;
    parse_named(ptx, name)
}

/// Parses entry `name` of `ptx`.
pub fn parse_named(ptx: &str, name: &str) -> R<Entry> {
    let head = format!(".entry {name}(");
    let start = ptx.find(&head).ok_or_else(|| SimError::Parse(format!("no entry {name}")))?;
    // Module-scope declarations only: another entry's body declares its own.
    let mut shared = Vec::new();
    let mut depth = 0i64;
    for l in ptx[..start].lines() {
        let l = l.trim();
        if depth == 0 {
            if let Some(rest) = l.strip_prefix(".shared").or_else(|| l.strip_prefix(".extern .shared")) {
                shared.push(shared_var(rest)?);
            }
        }
        depth += l.matches('{').count() as i64 - l.matches('}').count() as i64;
    }
    let text = &ptx[start..];
    let close = text.find(')').ok_or(SimError::Parse("no `)`".into()))?;
    let open = text.find('{').ok_or(SimError::Parse("no body".into()))?;
    let end = text[open..].find("\n}").ok_or(SimError::Parse("no end of entry".into()))? + open;
    let mut params = Vec::new();
    for l in text[head.len()..close].lines() {
        let l = l.trim().trim_end_matches(',');
        if l.is_empty() {
            continue;
        }
        match l.strip_prefix(".param .u64 ") {
            Some(p) => params.push(p.trim().to_string()),
            None => return unsupported(format!("parameter `{l}`")),
        }
    }
    let mut cluster = 1;
    for d in text[close + 1..open].lines().map(str::trim).filter(|d| !d.is_empty()) {
        if let Some(n) = d.strip_prefix(".reqnctapercluster") {
            let dims: Vec<u32> = n.split(',').map(|x| x.trim().parse().unwrap_or(0)).collect();
            if dims.is_empty() || dims[0] == 0 || dims[1..].iter().any(|&x| x != 1) {
                return unsupported(format!("directive `{d}`"));
            }
            cluster = dims[0];
        } else if d.starts_with(".maxntid") || d.starts_with(".minnctapersm") || d.starts_with(".reqntid") {
            // Launch hints: no effect on what the code computes.
        } else {
            return unsupported(format!("directive `{d}`"));
        }
    }
    let body = &text[open + 1..end];
    // Register classes: prefix → width.
    let mut classes: HashMap<String, u32> = HashMap::new();
    for l in body.lines().map(str::trim) {
        if let Some(r) = l.strip_prefix(".reg ") {
            let (t, rest) = r.split_once(' ').ok_or(SimError::Parse(l.into()))?;
            let ty = Ty::of(t.trim_start_matches('.')).ok_or(SimError::Parse(l.into()))?;
            let prefix = rest.trim().trim_start_matches('%').split('<').next().unwrap_or_default();
            classes.insert(prefix.to_string(), ty.bits());
        }
    }
    let mut regs: HashMap<String, usize> = HashMap::new();
    let mut widths = Vec::new();
    let mut reg_names = Vec::new();
    let mut reg = |s: &str| -> R<usize> {
        if let Some(&i) = regs.get(s) {
            return Ok(i);
        }
        let prefix: String = s.trim_start_matches('%').chars().take_while(|c| !c.is_ascii_digit()).collect();
        let w = *classes.get(&prefix).ok_or_else(|| SimError::Parse(format!("undeclared register {s}")))?;
        regs.insert(s.to_string(), widths.len());
        widths.push(w);
        reg_names.push(s.to_string());
        Ok(widths.len() - 1)
    };
    let mut lines = Vec::new();
    let mut labels: HashMap<String, usize> = HashMap::new();
    for l in body.lines().map(str::trim) {
        if l.is_empty() || l.starts_with(".reg ") || l.starts_with("//") {
            continue;
        }
        if let Some(rest) = l.strip_prefix(".shared").or_else(|| l.strip_prefix(".extern .shared")) {
            shared.push(shared_var(rest)?);
            continue;
        }
        if let Some(lab) = l.strip_suffix(':') {
            labels.insert(lab.to_string(), lines.len());
            continue;
        }
        lines.push(l);
    }
    let mut insts = Vec::new();
    for l in lines {
        let l0 = l.strip_suffix(';').ok_or_else(|| SimError::Parse(format!("no `;`: {l}")))?;
        let (guard, rest) = match l0.strip_prefix('@') {
            Some(g) => {
                let (p, rest) = g.split_once(' ').ok_or(SimError::Parse(l.into()))?;
                let (neg, p) = match p.strip_prefix('!') {
                    Some(p) => (true, p),
                    None => (false, p),
                };
                (Some((reg(p)?, neg)), rest.trim())
            }
            None => (None, l0),
        };
        let (opcode, ops) = rest.split_once(' ').unwrap_or((rest, ""));
        let (op, tys, m) = decode(opcode)?;
        let mut parts = Vec::new();
        let (mut cur, mut depth) = (String::new(), 0);
        for ch in ops.chars() {
            match ch {
                '{' | '[' => {
                    depth += 1;
                    cur.push(ch)
                }
                '}' | ']' => {
                    depth -= 1;
                    cur.push(ch)
                }
                ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
                _ => cur.push(ch),
            }
        }
        if !cur.trim().is_empty() {
            parts.push(cur);
        }
        let sym = |s: &str| shared.iter().position(|v| v.name == s);
        let mut a = Vec::new();
        for p in parts {
            let p = p.trim();
            let special = |p: &str| {
                Some(match p {
                    "%tid.x" => Sp::Tid,
                    "%ntid.x" => Sp::Ntid,
                    "%ctaid.x" => Sp::Ctaid,
                    "%nctaid.x" => Sp::Nctaid,
                    "%tid.y" | "%tid.z" | "%ctaid.y" | "%ctaid.z" => Sp::Zero,
                    "%ntid.y" | "%ntid.z" | "%nctaid.y" | "%nctaid.z" => Sp::One,
                    "%laneid" => Sp::Lane,
                    "%cluster_ctarank" => Sp::Rank,
                    "%cluster_nctarank" => Sp::Nrank,
                    _ => return None,
                })
            };
            let o = if let Some(v) = p.strip_prefix('{') {
                let rs: R<Vec<usize>> = v.trim_end_matches('}').split(',').map(|r| reg(r.trim())).collect();
                Opnd::Vec(rs?)
            } else if let Some(x) = p.strip_prefix('[') {
                let x = x.trim_end_matches(']').trim();
                if let Some(i) = params.iter().position(|q| q == x) {
                    Opnd::Param(i)
                } else {
                    let (b, off) = match x.split_once('+') {
                        Some((b, off)) => (
                            b.trim(),
                            off.trim().parse::<i64>().map_err(|_| SimError::Parse(format!("offset in {l}")))?,
                        ),
                        None => (x, 0),
                    };
                    let base = match sym(b) {
                        Some(s) => Opnd::Sym(s),
                        None if b.starts_with('%') => Opnd::Reg(reg(b)?),
                        None => return unsupported(format!("address `{p}` in `{l}`")),
                    };
                    Opnd::Addr(Box::new(base), off)
                }
            } else if let Some(s) = special(p) {
                Opnd::Special(s)
            } else if let Some((d, q)) = p.split_once('|') {
                Opnd::Pair(reg(d.trim())?, reg(q.trim())?)
            } else if p.starts_with('%') {
                Opnd::Reg(reg(p)?)
            } else if op == Op::Bra {
                Opnd::Label(*labels.get(p).ok_or_else(|| SimError::Parse(format!("label {p} never placed")))?)
            } else if let Some(s) = sym(p) {
                Opnd::Sym(s)
            } else {
                Opnd::Imm(parse_imm(p).ok_or_else(|| SimError::Parse(format!("operand `{p}` in `{l}`")))?)
            };
            a.push(o);
        }
        let want = match op {
            Op::Mma => 4,
            Op::Ldmatrix => 2,
            Op::CpAsync if a.len() == 3 => 3,
            Op::CpAsync => 4,
            Op::CpCommit | Op::CpWaitAll => 0,
            Op::Wgmma => 8,
            Op::WgFence | Op::WgCommit | Op::ProxyFence => 0,
            Op::WgWait => 1,
            Op::CpWait => 1,
            Op::Ret | Op::ClusterArrive | Op::ClusterWait => 0,
            Op::Bra | Op::BarSync => 1,
            Op::Neg | Op::Abs | Op::Not | Op::Mov | Op::Cvt | Op::Cvta | Op::Ld | Op::St => 2,
            Op::Sqrt | Op::Rcp | Op::Rsqrt | Op::Ex2 | Op::Lg2 | Op::Sin | Op::Cos | Op::Tanh => 2,
            Op::Mad | Op::Fma | Op::Selp | Op::Prmt | Op::Mapa => {
                if op == Op::Mapa {
                    3
                } else {
                    4
                }
            }
            Op::Shfl => 5,
            _ => 3,
        };
        if a.len() != want {
            return unsupported(format!("`{l}`: {} operands", a.len()));
        }
        if op == Op::BarSync && !matches!(a[0], Opnd::Imm(0)) {
            return unsupported(format!("`{l}`: barriers other than 0"));
        }
        insts.push(Inst { guard, op, tys, m, a, text: l.to_string() });
    }
    Ok(Entry { name: name.to_string(), insts, widths, reg_names, shared, params: params.len(), cluster })
}

// ------------------------------------------------------------------------------------
// Memory

/// Base address of binding `i` (far apart: an access past one never lands in another).
fn base(i: usize) -> u64 {
    (i as u64 + 1) << 40
}

/// Global memory: the bindings (inputs, then the output), and which bytes were stored.
pub struct Global {
    pub bufs: Vec<Vec<u8>>,
    pub written: Vec<Vec<bool>>,
}

impl Global {
    pub fn new(bufs: Vec<Vec<u8>>) -> Global {
        let written = bufs.iter().map(|b| vec![false; b.len()]).collect();
        Global { bufs, written }
    }

    fn locate(&self, addr: u64, n: usize, what: &dyn Fn() -> String) -> R<(usize, usize)> {
        let b = (addr >> 40) as usize;
        let off = (addr & ((1 << 40) - 1)) as usize;
        if b == 0 || b > self.bufs.len() || off + n > self.bufs[b - 1].len() {
            let detail = if b >= 1 && b <= self.bufs.len() {
                format!("bytes {off}..{} of binding {} ({} bytes)", off + n, b - 1, self.bufs[b - 1].len())
            } else {
                format!("address {addr:#x}, in no binding")
            };
            return Err(SimError::OutOfBounds(format!("{}: {detail}", what())));
        }
        if !(addr as usize).is_multiple_of(n) {
            return Err(SimError::OutOfBounds(format!("{}: {n}-byte access at {addr:#x} misaligned", what())));
        }
        Ok((b - 1, off))
    }
}

/// Shared addresses: each variable at its offset; `mapa` tags a rank above bit 24.
const RANK_SHIFT: u32 = 24;

struct Shared {
    /// `(start, end)` of each variable.
    vars: Vec<(u64, u64)>,
    /// Each `bra.uni` execution's direction per warp: `(rank, warp, pc, n)` →
    /// `(taken, first thread)`.
    uni: HashMap<(u32, u32, usize, u32), (bool, u32)>,
    bytes: Vec<Vec<u8>>,
    init: Vec<Vec<bool>>,
    /// Per rank and byte: an issued `cp.async` not yet completed writes it.
    pending: Vec<Vec<bool>>,
    /// Per rank and byte: the thread (+1; 0: none) whose `cp.async` wrote it, and the
    /// block's barrier epoch when that copy completed (at the thread's wait).
    landed_by: Vec<Vec<u16>>,
    landed_epoch: Vec<Vec<u32>>,
    /// Per rank and byte: the block's barrier epoch of its last read, and the reader
    /// (+1; `u16::MAX`: several threads), so that a `cp.async` into bytes another thread
    /// read since the last barrier is caught (the copy may land before that read).
    read_epoch: Vec<Vec<u32>>,
    read_by: Vec<Vec<u16>>,
    /// Per rank: how many block barriers (`bar.sync`, cluster barriers) completed.
    epoch: Vec<u32>,
    /// Per rank and byte: outstanding `wgmma` reads of it (a write is a race).
    wg_reads: Vec<Vec<u16>>,
    /// Every `wgmma` issued: the `(rank, offset)` of each 2-byte element it read, and
    /// how many of its warpgroup's threads have not yet waited for it.
    wg_ops: Vec<(Vec<(usize, usize)>, u32)>,
    /// Per rank and byte: the thread (+1; 0: none) whose store or `cp.async` (generic
    /// proxy) last wrote it, and that thread's count of `fence.proxy.async` then.
    gen_writer: Vec<Vec<u16>>,
    gen_fence: Vec<Vec<u32>>,
    /// `fence.proxy.async` executed, per `(rank, thread)`.
    proxy_fences: HashMap<(usize, u32), u32>,
}

impl Shared {
    fn new(e: &Entry, dynamic: u32) -> R<Shared> {
        // Start at 16 (so a null shared pointer is no variable's): the static variables,
        // then the dynamic region (the launch's bytes) where every `.extern` array of the
        // module starts (they alias, as in PTX).
        let mut at = 16u64;
        let mut vars = vec![(0, 0); e.shared.len()];
        for (v, slot) in e.shared.iter().zip(vars.iter_mut()) {
            if let Some(n) = v.bytes {
                at = at.next_multiple_of(v.align.max(1));
                *slot = (at, at + n);
                at += n;
            }
        }
        let align = e.shared.iter().filter(|v| v.bytes.is_none()).map(|v| v.align.max(1)).max().unwrap_or(1);
        at = at.next_multiple_of(align);
        for (v, slot) in e.shared.iter().zip(vars.iter_mut()) {
            if v.bytes.is_none() {
                *slot = (at, at + u64::from(dynamic));
            }
        }
        if e.shared.iter().any(|v| v.bytes.is_none()) {
            at += u64::from(dynamic);
        }
        if at > 1 << RANK_SHIFT {
            return unsupported(format!("{} bytes of shared memory", at));
        }
        let n = at as usize;
        Ok(Shared {
            vars,
            uni: HashMap::new(),
            bytes: (0..e.cluster).map(|_| vec![0xA5; n]).collect(),
            init: (0..e.cluster).map(|_| vec![false; n]).collect(),
            pending: (0..e.cluster).map(|_| vec![false; n]).collect(),
            landed_by: (0..e.cluster).map(|_| vec![0; n]).collect(),
            landed_epoch: (0..e.cluster).map(|_| vec![0; n]).collect(),
            epoch: vec![0; e.cluster as usize],
            read_epoch: (0..e.cluster).map(|_| vec![u32::MAX; n]).collect(),
            read_by: (0..e.cluster).map(|_| vec![0; n]).collect(),
            wg_reads: (0..e.cluster).map(|_| vec![0; n]).collect(),
            wg_ops: Vec::new(),
            gen_writer: (0..e.cluster).map(|_| vec![0; n]).collect(),
            gen_fence: (0..e.cluster).map(|_| vec![0; n]).collect(),
            proxy_fences: HashMap::new(),
        })
    }

    /// The rank and offset of a shared access of `n` bytes at `addr` (from block `own`).
    fn locate(&self, addr: u64, n: usize, own: usize, cluster: bool, what: &dyn Fn() -> String) -> R<(usize, usize)> {
        let tag = addr >> RANK_SHIFT;
        let off = addr & mask(RANK_SHIFT);
        let rank = match (tag, cluster) {
            (0, _) => own,
            (t, true) if (t as usize) <= self.bytes.len() => t as usize - 1,
            _ => return Err(SimError::OutOfBounds(format!("{}: shared address {addr:#x} (rank tag {tag})", what()))),
        };
        if !self.vars.iter().any(|&(s, e)| off >= s && off + n as u64 <= e) {
            return Err(SimError::OutOfBounds(format!("{}: {n} bytes at shared offset {off}, in no variable", what())));
        }
        if !off.is_multiple_of(n as u64) {
            return Err(SimError::OutOfBounds(format!("{}: {n}-byte shared access at {off} misaligned", what())));
        }
        Ok((rank, off as usize))
    }

    /// Checks that thread `tid` may read bytes `o..o + n` of rank `r`'s shared memory:
    /// written, no `cp.async` outstanding on them, and where another thread's
    /// `cp.async` put them there, a barrier since that thread's wait completed it.
    fn readable(&mut self, r: usize, o: usize, n: usize, tid: u32, what: &dyn Fn() -> String) -> R<()> {
        if let Some(k) = self.pending[r][o..o + n].iter().position(|&x| x) {
            return Err(SimError::Divergence(format!(
                "{}: reads byte {} of rank {r} while a cp.async to it is outstanding (a race)",
                what(),
                o + k
            )));
        }
        if let Some(k) = self.init[r][o..o + n].iter().position(|&x| !x) {
            return Err(SimError::Uninitialised(format!("{}: byte {} of rank {r}", what(), o + k)));
        }
        for k in o..o + n {
            let by = self.landed_by[r][k];
            if by != 0 && u32::from(by - 1) != tid && self.landed_epoch[r][k] == self.epoch[r] {
                return Err(SimError::Divergence(format!(
                    "{}: reads byte {k} of rank {r}, which thread {}'s cp.async completed with no barrier since \
                     (a race)",
                    what(),
                    by - 1
                )));
            }
        }
        let e = self.epoch[r];
        for k in o..o + n {
            let by = &mut self.read_by[r][k];
            if self.read_epoch[r][k] != e {
                self.read_epoch[r][k] = e;
                *by = tid as u16 + 1;
            } else if *by != tid as u16 + 1 {
                *by = u16::MAX;
            }
        }
        Ok(())
    }

    /// A plain store to bytes `o..o + n` of rank `r` (refused while a `cp.async` to them
    /// is outstanding: the two writes race).
    fn store(&mut self, r: usize, o: usize, data: &[u8], tid: u32, what: &dyn Fn() -> String) -> R<()> {
        let n = data.len();
        if let Some(k) = self.pending[r][o..o + n].iter().position(|&x| x) {
            return Err(SimError::Divergence(format!(
                "{}: writes byte {} of rank {r} while a cp.async to it is outstanding (a race)",
                what(),
                o + k
            )));
        }
        self.no_wgmma_reads(r, o, n, what)?;
        self.generic_write(r, o, n, tid);
        self.bytes[r][o..o + n].copy_from_slice(data);
        self.init[r][o..o + n].iter_mut().for_each(|w| *w = true);
        self.landed_by[r][o..o + n].iter_mut().for_each(|w| *w = 0);
        Ok(())
    }
}

impl Shared {
    /// Refuses a write to bytes `o..o + n` of rank `r` that an outstanding `wgmma`
    /// reads (the asynchronous read may see either value: a race).
    fn no_wgmma_reads(&self, r: usize, o: usize, n: usize, what: &dyn Fn() -> String) -> R<()> {
        match self.wg_reads[r][o..o + n].iter().position(|&x| x > 0) {
            Some(k) => Err(SimError::Divergence(format!(
                "{}: writes byte {} of rank {r}, which a wgmma not yet waited for reads (a race)",
                what(),
                o + k
            ))),
            None => Ok(()),
        }
    }

    /// Records a generic-proxy write of bytes `o..o + n` of rank `r` by thread `tid`.
    fn generic_write(&mut self, r: usize, o: usize, n: usize, tid: u32) {
        let f = self.proxy_fences.get(&(r, tid)).copied().unwrap_or(0);
        self.gen_writer[r][o..o + n].iter_mut().for_each(|w| *w = tid as u16 + 1);
        self.gen_fence[r][o..o + n].iter_mut().for_each(|w| *w = f);
    }
}

/// Completes the copies of `group` (issued by thread `tid`) into shared memory.
fn land(sh: &mut Shared, group: &[AsyncCopy], tid: u32) {
    for c in group {
        let (r, o) = (c.rank, c.off);
        sh.generic_write(r, o, 16, tid);
        sh.bytes[r][o..o + 16].copy_from_slice(&c.data);
        sh.init[r][o..o + 16].iter_mut().for_each(|x| *x = true);
        sh.pending[r][o..o + 16].iter_mut().for_each(|x| *x = false);
        sh.landed_by[r][o..o + 16].iter_mut().for_each(|x| *x = tid as u16 + 1);
        let e = sh.epoch[r];
        sh.landed_epoch[r][o..o + 16].iter_mut().for_each(|x| *x = e);
    }
}

/// The reader a `wgmma`'s shared-memory reads are checked as: no thread of the block,
/// so that bytes a `cp.async` landed need a barrier since (whoever issued it).
const WG_READER: u32 = 0xFFFE;

/// The bit pattern of accumulator registers while a `wgmma` writing them is not yet
/// waited for (a quiet NaN: a read shows in the output).
const WG_POISON: u64 = 0x7FC0_0BAD;

/// Thread `t` waited for `wgmma` `op`: its accumulators that no newer pending `wgmma`
/// writes get their values; the shared bytes it read are released once every thread of
/// its warpgroup waited for it.
fn retire(t: &mut Thread, sh: &mut Shared, op: usize) {
    let done: Vec<usize> = t.wg_pending.iter().filter(|(_, &(o, _))| o == op).map(|(&r, _)| r).collect();
    for r in done {
        if let Some((_, v)) = t.wg_pending.remove(&r) {
            t.regs[r] = v;
            t.written[r] = 0;
        }
    }
    let entry = &mut sh.wg_ops[op];
    entry.1 -= 1;
    if entry.1 == 0 {
        for &(r, o) in &entry.0 {
            sh.wg_reads[r][o] -= 1;
            sh.wg_reads[r][o + 1] -= 1;
        }
    }
}

/// The 128-byte swizzle (PTX ISA, "Shared Memory Matrix Layout", 128B swizzling mode):
/// within each 1024-byte block of 8 rows of 128 bytes, 16-byte chunk `c` of row `r`
/// is stored at chunk `c ⊕ r`: address bits 4–6 XOR bits 7–9.
fn swizzle128(addr: u64) -> u64 {
    addr ^ (((addr >> 7) & 7) << 4)
}

/// The shared address of element `(mn, k)` of a `wgmma` operand described by `desc`
/// (PTX ISA, "Matrix Descriptor Format" and the canonical layouts of "Shared Memory
/// Matrix Layout", 16-bit elements: a core matrix is 8 rows of 16 bytes): bits 0–13 the
/// start address >> 4, 16–29 the leading dimension byte offset >> 4, 32–45 the stride
/// dimension byte offset >> 4, 49–51 the base offset, 62–63 the swizzle mode (0 none,
/// 1 128-byte; 64- and 32-byte refused), every other bit 0. `mn` is A's row or B's
/// column, `k` in 0..16; `trans` the operand's imm-trans (0: K-major).
/// - K-major, no swizzle: core matrices of 8 `mn` × 8 `k` (16 bytes a row); the next
///   8 `mn` at the stride byte offset, the next 8 `k` at the leading byte offset.
/// - K-major, 128-byte swizzle: rows of 128 bytes (`k` along the row), 8 `mn` rows
///   consecutive, the next 8 at the stride byte offset (the leading byte offset unused);
///   then the swizzle.
/// - MN-major, no swizzle: core matrices of 8 `k` rows × 8 `mn` (16 bytes); the next 8
///   `mn` at the stride byte offset, the next 8 `k` at the leading byte offset.
/// - MN-major, 128-byte swizzle: rows of 128 bytes (64 `mn` along the row), 8 `k` rows
///   consecutive, the next 8 `k` at the stride byte offset, the next 64 `mn` at the
///   leading byte offset; then the swizzle.
fn wgmma_addr(desc: u64, trans: bool, mn: u64, k: u64) -> R<u64> {
    let used = 0x3FFF | (0x3FFF << 16) | (0x3FFF << 32) | (7 << 49) | (3 << 62);
    if desc & !used != 0 {
        return Err(SimError::Undefined(format!("descriptor {desc:#x}: reserved bits set")));
    }
    let start = (desc & 0x3FFF) << 4;
    let lbo = ((desc >> 16) & 0x3FFF) << 4;
    let sbo = ((desc >> 32) & 0x3FFF) << 4;
    if (desc >> 49) & 7 != 0 {
        return unsupported(format!("descriptor {desc:#x}: a base offset"));
    }
    Ok(match (desc >> 62, trans) {
        (0, false) => start + (mn / 8) * sbo + (mn % 8) * 16 + (k / 8) * lbo + (k % 8) * 2,
        (0, true) => start + (mn / 8) * sbo + (mn % 8) * 2 + (k / 8) * lbo + (k % 8) * 16,
        (1, false) => swizzle128(start + (mn / 8) * sbo + (mn % 8) * 128 + k * 2),
        (1, true) => swizzle128(start + (mn / 64) * lbo + (mn % 64) * 2 + (k / 8) * sbo + (k % 8) * 128),
        (m, _) => return unsupported(format!("descriptor {desc:#x}: swizzle mode {m}")),
    })
}

/// An issued `cp.async`: its 16 bytes (source bytes then zeros, read at issue: the
/// sources are kernel inputs, which no thread writes) land at `off` of rank `rank`
/// when the issuing thread's wait completes its group.
#[derive(Debug, Clone)]
struct AsyncCopy {
    rank: usize,
    off: usize,
    data: [u8; 16],
}

// ------------------------------------------------------------------------------------
// Execution

/// Instruction budgets.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most instructions one thread may run (a hang guard).
    pub per_thread: u64,
    /// Most instructions the whole run may take; past it the run stops after the
    /// current cluster's threads reach a stop, `partial` in the [`Stats`] (when
    /// `stop_early`) or fails.
    pub total: u64,
    pub stop_early: bool,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { per_thread: 1 << 26, total: 1 << 31, stop_early: false }
    }
}

/// What a run did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stats {
    pub steps: u64,
    pub clusters_run: u32,
    /// Stopped at the total budget before every cluster ran.
    pub partial: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Run,
    Shfl,
    Bar,
    Cluster,
    /// At a warpgroup-collective `wgmma.mma_async`.
    Wg,
    Exit,
}

struct Thread {
    regs: Vec<u64>,
    pc: usize,
    st: St,
    steps: u64,
    /// How often it executed each `bra.uni` (by instruction).
    uni: HashMap<usize, u32>,
    /// `cp.async`s issued since the last `commit_group`.
    open: Vec<AsyncCopy>,
    /// Its thread index in the block.
    tid: u32,
    /// Committed `cp.async` groups not yet waited for, oldest first.
    groups: std::collections::VecDeque<Vec<AsyncCopy>>,
    /// Per register: the step of its last write by an instruction other than `wgmma`.
    written: Vec<u64>,
    /// The step of its last `wgmma.fence`.
    wg_fence: Option<u64>,
    /// `wgmma`s (by id) issued since the last `wgmma.commit_group`.
    wg_open: Vec<usize>,
    /// Committed `wgmma` groups not yet waited for, oldest first.
    wg_groups: std::collections::VecDeque<Vec<usize>>,
    /// Accumulator registers of `wgmma`s not yet waited for: the newest such `wgmma`
    /// writing each, and the value it writes.
    wg_pending: HashMap<usize, (usize, u64)>,
}

struct Cx {
    tid: u32,
    block: u32,
    ctaid: u32,
    grid: u32,
    rank: u32,
    cluster: u32,
}

/// The geometry of a launch.
#[derive(Debug, Clone, Copy)]
pub struct Grid {
    pub grid: u32,
    pub block: u32,
    /// Dynamic shared memory bytes (`.extern .shared`).
    pub shared: u32,
}

impl Grid {
    /// The geometry of a kernel's launch (`grid` blocks of `block` threads, `shared`
    /// dynamic bytes), as the CUDA module records it.
    pub fn of(grid: u64, block: u32, shared: u32) -> Grid {
        Grid { grid: grid as u32, block, shared }
    }
}

/// `x op y` for `add`, `sub`, `mul` and (any other op) `div`, rounded to nearest as the
/// `.rn` forms are.
fn arith<T>(op: Op, x: T, y: T) -> T
where
    T: std::ops::Add<Output = T> + std::ops::Sub<Output = T> + std::ops::Mul<Output = T> + std::ops::Div<Output = T>,
{
    match op {
        Op::Add => x + y,
        Op::Sub => x - y,
        Op::Mul => x * y,
        _ => x / y,
    }
}

fn f32v(x: u64) -> f32 {
    f32::from_bits(x as u32)
}

fn f64v(x: u64) -> f64 {
    f64::from_bits(x)
}

fn fb(x: f32) -> u64 {
    u64::from(x.to_bits())
}

fn db(x: f64) -> u64 {
    x.to_bits()
}

/// `a ≥ 0` rounded to nearest even with `p` significand bits and exponents down to
/// `emin` (subnormals below).
fn round_to(a: f64, p: i32, emin: i32) -> f64 {
    if a == 0.0 || !a.is_finite() {
        return a;
    }
    let mut e = a.log2().floor() as i32;
    if 2f64.powi(e) > a {
        e -= 1;
    } else if 2f64.powi(e + 1) <= a {
        e += 1;
    }
    let ulp = 2f64.powi(e.max(emin) - p + 1);
    (a / ulp).round_ties_even() * ulp
}

/// A float (f32 or f64 value) → f16 bits, rounded once to nearest even; NaN → the
/// canonical 0x7FFF.
pub fn to_f16(x: f64) -> u16 {
    if x.is_nan() {
        return 0x7FFF;
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let r = round_to(x.abs(), 11, -14);
    if r >= 65536.0 {
        return sign | 0x7C00;
    }
    if r < 2f64.powi(-14) {
        return sign | (r * 2f64.powi(24)) as u16;
    }
    let e = r.log2().floor() as i32;
    let e = if 2f64.powi(e) > r { e - 1 } else { e };
    sign | ((((e + 15) as u32) << 10) + ((r / 2f64.powi(e) * 1024.0) as u32 - 1024)) as u16
}

/// A float → bf16 bits, rounded once to nearest even; NaN → the canonical 0x7FFF.
pub fn to_bf16(x: f64) -> u16 {
    if x.is_nan() {
        return 0x7FFF;
    }
    let r = round_to(x.abs(), 8, -126);
    let r = if x.is_sign_negative() { -r } else { r };
    ((r as f32).to_bits() >> 16) as u16
}

pub fn f16_to_f32(h: u16) -> f32 {
    let s = if h & 0x8000 != 0 { -1.0 } else { 1.0 };
    let e = (h >> 10) & 0x1F;
    let m = f64::from(h & 0x3FF);
    let v = match e {
        0 => m * 2f64.powi(-24),
        31 if m == 0.0 => f64::INFINITY,
        31 => return f32::NAN,
        _ => (1.0 + m / 1024.0) * 2f64.powi(i32::from(e) - 15),
    };
    (s * v) as f32
}

fn round_int(x: f64, r: Rnd) -> R<f64> {
    Ok(match r {
        Rnd::Rni => x.round_ties_even(),
        Rnd::Rzi => x.trunc(),
        Rnd::Rmi => x.floor(),
        Rnd::Rpi => x.ceil(),
        _ => return unsupported(format!("rounding {r:?} to an integer")),
    })
}

/// PTX `min`/`max` on floats.
fn fminmax(a: f64, b: f64, max: bool, nan: bool) -> f64 {
    if a.is_nan() || b.is_nan() {
        if nan || (a.is_nan() && b.is_nan()) {
            return f64::NAN;
        }
        return if a.is_nan() { b } else { a };
    }
    if a == b {
        return if max == a.is_sign_positive() { a } else { b };
    }
    if (a > b) == max {
        a
    } else {
        b
    }
}

fn cmp_f(c: &str, a: f64, b: f64) -> bool {
    let un = a.is_nan() || b.is_nan();
    match c {
        "eq" => !un && a == b,
        "ne" => !un && a != b,
        "lt" => !un && a < b,
        "le" => !un && a <= b,
        "gt" => !un && a > b,
        "ge" => !un && a >= b,
        "equ" => un || a == b,
        "neu" => un || a != b,
        "ltu" => un || a < b,
        "leu" => un || a <= b,
        "gtu" => un || a > b,
        "geu" => un || a >= b,
        "nan" => un,
        _ => !un,
    }
}

fn cmp_i(c: &str, a: i128, b: i128) -> R<bool> {
    Ok(match c {
        "eq" => a == b,
        "ne" => a != b,
        "lt" | "lo" => a < b,
        "le" | "ls" => a <= b,
        "gt" | "hi" => a > b,
        "ge" | "hs" => a >= b,
        _ => return unsupported(format!("integer comparison .{c}")),
    })
}

/// A float operand of type `t` as f64 (f32 and f16 exactly).
fn fget(t: Ty, v: u64) -> f64 {
    match t {
        Ty::F64 => f64v(v),
        Ty::F32 => f64::from(f32v(v)),
        Ty::F16 => f64::from(f16_to_f32(v as u16)),
        _ => f64::from(f32::from_bits((v as u32) << 16)),
    }
}

/// `x` (exact, or already rounded for f32 where the caller did so) as bits of `t`.
fn fput(t: Ty, x: f64) -> u64 {
    match t {
        Ty::F64 => db(x),
        Ty::F32 => fb(x as f32),
        Ty::F16 => u64::from(to_f16(x)),
        _ => u64::from(to_bf16(x)),
    }
}

impl Entry {
    fn val(&self, t: &Thread, o: &Opnd, cx: &Cx, sh: &Shared, inst: &Inst) -> R<u64> {
        Ok(match o {
            Opnd::Reg(r) => t.regs[*r],
            Opnd::Imm(v) => *v,
            Opnd::Special(s) => u64::from(match s {
                Sp::Tid => cx.tid,
                Sp::Ntid => cx.block,
                Sp::Ctaid => cx.ctaid,
                Sp::Nctaid => cx.grid,
                Sp::Zero => 0,
                Sp::One => 1,
                Sp::Lane => cx.tid % 32,
                Sp::Rank => cx.rank,
                Sp::Nrank => cx.cluster,
            }),
            Opnd::Sym(s) => sh.vars[*s].0,
            o => return unsupported(format!("operand {o:?} as a value in `{}`", inst.text)),
        })
    }

    fn set(&self, t: &mut Thread, r: usize, v: u64) {
        t.written[r] = t.steps;
        let w = self.widths[r];
        t.regs[r] = if w == 1 { u64::from(v & 1 != 0) } else { v & mask(w) };
    }

    fn dst(&self, o: &Opnd, inst: &Inst) -> R<usize> {
        match o {
            Opnd::Reg(r) => Ok(*r),
            o => unsupported(format!("destination {o:?} in `{}`", inst.text)),
        }
    }

    fn addr(&self, t: &Thread, o: &Opnd, cx: &Cx, sh: &Shared, inst: &Inst) -> R<u64> {
        match o {
            Opnd::Addr(b, off) => Ok(self.val(t, b, cx, sh, inst)?.wrapping_add(*off as u64)),
            o => unsupported(format!("address {o:?} in `{}`", inst.text)),
        }
    }

    /// Runs thread `t` up to its next stop.
    fn advance(&self, t: &mut Thread, cx: &Cx, g: &mut Global, sh: &mut Shared, lim: &Limits) -> R<()> {
        loop {
            let Some(i) = self.insts.get(t.pc) else {
                t.st = St::Exit;
                self.exit_copies(t, sh);
                return Ok(());
            };
            t.steps += 1;
            if t.steps > lim.per_thread {
                return Err(SimError::Budget(format!(
                    "thread {} of block {}: past {} instructions (at `{}`)",
                    cx.tid, cx.ctaid, lim.per_thread, i.text
                )));
            }
            if i.m.uni {
                self.uniform(t, cx, sh, i)?;
            }
            if let Some((p, neg)) = i.guard {
                if (t.regs[p] != 0) == neg {
                    t.pc += 1;
                    continue;
                }
            }
            match i.op {
                Op::Ret => {
                    t.st = St::Exit;
                    self.exit_copies(t, sh);
                    return Ok(());
                }
                Op::Bra => {
                    let Opnd::Label(l) = i.a[0] else { return unsupported(i.text.clone()) };
                    t.pc = l;
                    continue;
                }
                Op::BarSync => {
                    t.st = St::Bar;
                    t.pc += 1;
                    return Ok(());
                }
                Op::ClusterWait => {
                    t.st = St::Cluster;
                    t.pc += 1;
                    return Ok(());
                }
                Op::Shfl | Op::Mma | Op::Ldmatrix => {
                    // Stays at the warp-collective instruction; the scheduler runs it
                    // for the warp.
                    t.st = St::Shfl;
                    return Ok(());
                }
                Op::CpAsync | Op::CpCommit | Op::CpWait | Op::CpWaitAll => {
                    self.async_copy(i, t, cx, g, sh)?;
                    t.pc += 1;
                    continue;
                }
                Op::Wgmma => {
                    t.st = St::Wg;
                    return Ok(());
                }
                Op::WgFence | Op::WgCommit | Op::WgWait | Op::ProxyFence => {
                    self.wg_local(i, t, cx, sh)?;
                    t.pc += 1;
                    continue;
                }
                _ => {}
            }
            self.exec(i, t, cx, g, sh)?;
            t.pc += 1;
        }
    }

    /// `cp.async` and its groups (PTX ISA, "Data Movement and Conversion Instructions:
    /// cp.async"): `cp.async` issues a copy of `cp-size` = 16 bytes, the first
    /// `src-size` (≤ 16; 16 without the operand) from global `[s]`, the rest zeros
    /// (src-size 0 reads nothing, so `[s]` need not lie in a binding); both addresses
    /// aligned to 16. The copy is pending (its shared bytes unreadable and unwritable by
    /// any thread: a race) until the issuing thread's `cp.async.wait_group N` completes
    /// every committed group but the newest `N` (`wait_all`: commit, then wait 0).
    /// Copies not yet committed are not waited for. A thread that exits lets its
    /// outstanding copies land.
    fn async_copy(&self, i: &Inst, t: &mut Thread, cx: &Cx, g: &Global, sh: &mut Shared) -> R<()> {
        let what = || format!("block {} thread {}: `{}`", cx.ctaid, cx.tid, i.text);
        match i.op {
            Op::CpAsync => {
                let size = match i.a.get(2) {
                    Some(Opnd::Imm(16)) => 16,
                    _ => return unsupported(format!("`{}`: cp-size other than 16", i.text)),
                };
                let src_size = match i.a.get(3) {
                    None => size,
                    Some(o) => self.val(t, o, cx, sh, i)?,
                };
                if src_size > size {
                    return Err(SimError::Undefined(format!("{}: src-size {src_size} above cp-size {size}", what())));
                }
                let dst = self.addr(t, &i.a[0], cx, sh, i)?;
                let (r, o) = sh.locate(dst, 16, cx.rank as usize, false, &what)?;
                if let Some(k) = sh.pending[r][o..o + 16].iter().position(|&x| x) {
                    return Err(SimError::Divergence(format!(
                        "{}: byte {} of rank {r} already has a cp.async outstanding (a race)",
                        what(),
                        o + k
                    )));
                }
                sh.no_wgmma_reads(r, o, 16, &what)?;
                for k in o..o + 16 {
                    let by = sh.read_by[r][k];
                    if sh.read_epoch[r][k] == sh.epoch[r] && by != cx.tid as u16 + 1 {
                        return Err(SimError::Divergence(format!(
                            "{}: overwrites byte {k} of rank {r}, which {} read with no barrier since (a race)",
                            what(),
                            if by == u16::MAX { "several threads".to_string() } else { format!("thread {}", by - 1) }
                        )));
                    }
                }
                let mut data = [0u8; 16];
                if src_size > 0 {
                    let src = self.addr(t, &i.a[1], cx, sh, i)?;
                    if !src.is_multiple_of(16) {
                        return Err(SimError::OutOfBounds(format!("{}: source {src:#x} not 16-byte aligned", what())));
                    }
                    let n = src_size as usize;
                    let (b, off) = g.locate(src, 1, &what)?;
                    if off + n > g.bufs[b].len() {
                        return Err(SimError::OutOfBounds(format!(
                            "{}: bytes {off}..{} of binding {b} ({} bytes)",
                            what(),
                            off + n,
                            g.bufs[b].len()
                        )));
                    }
                    data[..n].copy_from_slice(&g.bufs[b][off..off + n]);
                }
                sh.pending[r][o..o + 16].iter_mut().for_each(|x| *x = true);
                t.open.push(AsyncCopy { rank: r, off: o, data });
            }
            Op::CpCommit => t.groups.push_back(std::mem::take(&mut t.open)),
            Op::CpWait | Op::CpWaitAll => {
                let keep = if i.op == Op::CpWaitAll {
                    t.groups.push_back(std::mem::take(&mut t.open));
                    0
                } else {
                    self.val(t, &i.a[0], cx, sh, i)? as usize
                };
                while t.groups.len() > keep {
                    let group = t.groups.pop_front().unwrap_or_default();
                    land(sh, &group, cx.tid);
                }
            }
            _ => return unsupported(i.text.clone()),
        }
        Ok(())
    }

    /// A thread's outstanding copies land when it exits (and its `wgmma`s complete).
    fn exit_copies(&self, t: &mut Thread, sh: &mut Shared) {
        t.wg_groups.push_back(std::mem::take(&mut t.wg_open));
        while let Some(group) = t.wg_groups.pop_front() {
            for op in group {
                retire(t, sh, op);
            }
        }
        let tid = t.tid;
        t.groups.push_back(std::mem::take(&mut t.open));
        while let Some(group) = t.groups.pop_front() {
            land(sh, &group, tid);
        }
    }

    /// The per-thread `wgmma` bookkeeping (PTX ISA, "Asynchronous Warpgroup Level Matrix
    /// Multiply-Accumulate"): `wgmma.fence` marks the point after which the thread's
    /// register writes are ordered before its next `wgmma`s; `commit_group` closes the
    /// `wgmma`s issued since the last into a group; `wait_group N` waits until at most
    /// the newest `N` groups are pending (their accumulators land then); a
    /// `fence.proxy.async` orders the thread's earlier generic-proxy shared writes
    /// (stores, landed `cp.async`) before later async-proxy reads (`wgmma`).
    fn wg_local(&self, i: &Inst, t: &mut Thread, cx: &Cx, sh: &mut Shared) -> R<()> {
        match i.op {
            Op::WgFence => t.wg_fence = Some(t.steps),
            Op::WgCommit => t.wg_groups.push_back(std::mem::take(&mut t.wg_open)),
            Op::WgWait => {
                let keep = self.val(t, &i.a[0], cx, sh, i)? as usize;
                while t.wg_groups.len() > keep {
                    for op in t.wg_groups.pop_front().unwrap_or_default() {
                        retire(t, sh, op);
                    }
                }
            }
            Op::ProxyFence => *sh.proxy_fences.entry((cx.rank as usize, cx.tid)).or_insert(0) += 1,
            _ => return unsupported(i.text.clone()),
        }
        Ok(())
    }

    /// `wgmma.mma_async.sync.aligned.m64nNk16.f32.T.T d, a-desc, b-desc, scale-d,
    /// imm-scale-a, imm-scale-b, imm-trans-a, imm-trans-b` for the 128 threads of a
    /// warpgroup (`members`, in thread order; every operand the same in all of them):
    /// `D = A·B + (scale-d ? D : 0)`, A 64×16 and B 16×N from shared memory through
    /// their descriptors ([`wgmma_addr`]; B's `mn` is its column `n`), each negated
    /// where its imm-scale is -1. D's fragment (PTX ISA, "Register Fragments", D of
    /// m64nNk16, f32): thread `x`'s register `i` holds row `16·(x / 32) + (x % 32) / 4
    /// + 8·((i / 2) % 2)`, column `8·(i / 4) + 2·(x % 4) + i % 2`.
    ///
    /// Asynchrony: the result is computed here from the shared bytes as they are now,
    /// which must be readable (written, no `cp.async` pending, landed copies followed by
    /// a barrier) and, where a thread wrote them through the generic proxy, fenced by
    /// that thread's `fence.proxy.async` since; the bytes stay marked as read until
    /// every member waited for this `wgmma` (a write before is a race). Each member's
    /// accumulators hold a NaN poison until its `wait_group` lands them; a `wgmma`
    /// chained on pending accumulators (the same registers) reads their pending values,
    /// which the ISA allows; any other register write to them since the thread's last
    /// `wgmma.fence`, or no fence at all, is an error. Arithmetic as `mma`: exact
    /// products summed with `c` in f64, one rounding to f32.
    fn wgmma(&self, threads: &mut [Thread], members: &[usize], rank: usize, sh: &mut Shared) -> R<()> {
        let i = &self.insts[threads[members[0]].pc];
        let n = i.m.n as usize;
        let rd = self.regs_of(i, 0, n / 2)?;
        let what = || format!("rank {rank} thread {}: `{}`", threads[members[0]].tid, i.text);
        let scalar = |t: &Thread, k: usize| -> R<u64> {
            match &i.a[k] {
                Opnd::Reg(r) => Ok(t.regs[*r]),
                Opnd::Imm(v) if k >= 4 => Ok(*v),
                o => unsupported(format!("`{}`: operand {k} {o:?}", i.text)),
            }
        };
        let ops: Vec<u64> = (1..8).map(|k| scalar(&threads[members[0]], k)).collect::<R<_>>()?;
        for &l in members {
            let o: Vec<u64> = (1..8).map(|k| scalar(&threads[l], k)).collect::<R<_>>()?;
            if o != ops {
                return Err(SimError::Divergence(format!("{}: operands differ across the warpgroup", what())));
            }
        }
        let (da, db, scale_d) = (ops[0], ops[1], ops[2] != 0);
        let sign = |v: u64| -> R<f64> {
            match v as i64 {
                1 => Ok(1.0),
                -1 => Ok(-1.0),
                _ => unsupported(format!("`{}`: imm-scale {v}", i.text)),
            }
        };
        let (sa, sb) = (sign(ops[3])?, sign(ops[4])?);
        let trans = |v: u64| -> R<bool> {
            match v {
                0 => Ok(false),
                1 => Ok(true),
                _ => unsupported(format!("`{}`: imm-trans {v}", i.text)),
            }
        };
        let (ta, tb) = (trans(ops[5])?, trans(ops[6])?);
        let half = |h: u16| -> f64 {
            if i.tys[1] == Ty::Bf16 {
                f64::from(f32::from_bits(u32::from(h) << 16))
            } else {
                f64::from(f16_to_f32(h))
            }
        };
        let mut reads = Vec::new();
        let mut read = |sh: &mut Shared, desc: u64, tr: bool, mn: usize, k: usize| -> R<f64> {
            let addr = wgmma_addr(desc, tr, mn as u64, k as u64)?;
            let (r, o) = sh.locate(addr, 2, rank, false, &what)?;
            sh.readable(r, o, 2, WG_READER, &what)?;
            for b in o..o + 2 {
                let w = sh.gen_writer[r][b];
                if w != 0 {
                    let f = sh.proxy_fences.get(&(r, u32::from(w - 1))).copied().unwrap_or(0);
                    if f <= sh.gen_fence[r][b] {
                        return Err(SimError::Divergence(format!(
                            "{}: reads byte {b} of rank {r}, which thread {} wrote with no fence.proxy.async since",
                            what(),
                            w - 1
                        )));
                    }
                }
            }
            reads.push((r, o));
            Ok(half(u16::from_le_bytes([sh.bytes[r][o], sh.bytes[r][o + 1]])))
        };
        let mut a = vec![[0f64; 16]; 64];
        let mut b = vec![[0f64; 16]; n];
        for (m, row) in a.iter_mut().enumerate() {
            for (k, x) in row.iter_mut().enumerate() {
                *x = sa * read(sh, da, ta, m, k)?;
            }
        }
        for (col, row) in b.iter_mut().enumerate() {
            for (k, x) in row.iter_mut().enumerate() {
                *x = sb * read(sh, db, tb, col, k)?;
            }
        }
        let op = sh.wg_ops.len();
        for &(r, o) in &reads {
            sh.wg_reads[r][o] += 1;
            sh.wg_reads[r][o + 1] += 1;
        }
        sh.wg_ops.push((reads, members.len() as u32));
        // C, gathered from the members' fragments.
        let mut c = vec![vec![0f64; n]; 64];
        for (x, &l) in members.iter().enumerate() {
            let t = &threads[l];
            let Some(fence) = t.wg_fence else {
                return Err(SimError::Divergence(format!("{}: no wgmma.fence before it", what())));
            };
            for (idx, &r) in rd.iter().enumerate() {
                let v = match t.wg_pending.get(&r) {
                    Some(&(_, v)) => v,
                    None if t.written[r] < fence => t.regs[r],
                    None => {
                        return Err(SimError::Divergence(format!(
                            "{}: accumulator {} written since the thread's last wgmma.fence",
                            what(),
                            self.reg_names[r]
                        )))
                    }
                };
                let (row, col) =
                    (16 * (x / 32) + (x % 32) / 4 + 8 * ((idx / 2) % 2), 8 * (idx / 4) + 2 * (x % 4) + idx % 2);
                c[row][col] = f64::from(f32v(v));
            }
        }
        for (x, &l) in members.iter().enumerate() {
            let t = &mut threads[l];
            for (idx, &r) in rd.iter().enumerate() {
                let (row, col) =
                    (16 * (x / 32) + (x % 32) / 4 + 8 * ((idx / 2) % 2), 8 * (idx / 4) + 2 * (x % 4) + idx % 2);
                let acc = if scale_d { c[row][col] } else { 0.0 };
                let d: f64 = acc + (0..16).map(|k| a[row][k] * b[col][k]).sum::<f64>();
                t.wg_pending.insert(r, (op, fb(d as f32)));
                t.regs[r] = WG_POISON;
            }
            t.wg_open.push(op);
            t.pc += 1;
            t.st = St::Run;
        }
        Ok(())
    }

    /// `bra.uni` promises that every active lane of the warp branches the same way: the
    /// n-th execution of it by each lane of a warp must agree with the first lane's.
    fn uniform(&self, t: &mut Thread, cx: &Cx, sh: &mut Shared, i: &Inst) -> R<()> {
        let taken = i.guard.is_none_or(|(p, neg)| (t.regs[p] != 0) != neg);
        let n = t.uni.entry(t.pc).or_insert(0);
        *n += 1;
        let key = (cx.rank, cx.tid / 32, t.pc, *n);
        match sh.uni.get(&key) {
            Some(&(first, tid)) if first != taken => Err(SimError::Divergence(format!(
                "block {}: `{}` (execution {}) is taken by thread {} and not by thread {}",
                cx.ctaid,
                i.text,
                key.3,
                if first { tid } else { cx.tid },
                if first { cx.tid } else { tid }
            ))),
            Some(_) => Ok(()),
            None => {
                sh.uni.insert(key, (taken, cx.tid));
                Ok(())
            }
        }
    }

    fn exec(&self, i: &Inst, t: &mut Thread, cx: &Cx, g: &mut Global, sh: &mut Shared) -> R<()> {
        let ty = i.tys.first().copied().unwrap_or(Ty::B(32));
        let v = |k: usize, t: &Thread| self.val(t, &i.a[k], cx, sh, i);
        let bits = ty.bits();
        let out: u64 = match i.op {
            Op::ClusterArrive => return Ok(()),
            Op::Add | Op::Sub | Op::Mul | Op::Div if ty.is_float() => {
                let (a, b) = (v(1, t)?, v(2, t)?);
                match ty {
                    Ty::F32 => fb(arith(i.op, f32v(a), f32v(b))),
                    Ty::F64 => db(arith(i.op, f64v(a), f64v(b))),
                    _ => return unsupported(i.text.clone()),
                }
            }
            Op::Fma => {
                let (a, b, c) = (v(1, t)?, v(2, t)?, v(3, t)?);
                match ty {
                    Ty::F32 => fb(f32v(a).mul_add(f32v(b), f32v(c))),
                    Ty::F64 => db(f64v(a).mul_add(f64v(b), f64v(c))),
                    _ => return unsupported(i.text.clone()),
                }
            }
            Op::Sqrt | Op::Rcp | Op::Rsqrt | Op::Ex2 | Op::Lg2 | Op::Sin | Op::Cos | Op::Tanh => {
                let a = v(1, t)?;
                match ty {
                    Ty::F32 if matches!(i.op, Op::Sqrt | Op::Rcp) && !i.m.approx => {
                        let x = f32v(a);
                        fb(if i.op == Op::Sqrt { x.sqrt() } else { 1.0 / x })
                    }
                    Ty::F64 if matches!(i.op, Op::Sqrt | Op::Rcp) && !i.m.approx => {
                        let x = f64v(a);
                        db(if i.op == Op::Sqrt { x.sqrt() } else { 1.0 / x })
                    }
                    Ty::F32 => {
                        // Approximations: the exact value, rounded once (module docs).
                        let x = f64::from(f32v(a));
                        fb((match i.op {
                            Op::Sqrt => x.sqrt(),
                            Op::Rcp => 1.0 / x,
                            Op::Rsqrt => 1.0 / x.sqrt(),
                            Op::Ex2 => x.exp2(),
                            Op::Lg2 => x.log2(),
                            Op::Sin => x.sin(),
                            Op::Cos => x.cos(),
                            _ => x.tanh(),
                        }) as f32)
                    }
                    _ => return unsupported(i.text.clone()),
                }
            }
            Op::Copysign => {
                let (a, b) = (v(1, t)?, v(2, t)?);
                let sbit = 1u64 << (bits - 1);
                (b & !sbit) | (a & sbit)
            }
            Op::Min | Op::Max if ty.is_float() => {
                let (a, b) = (fget(ty, v(1, t)?), fget(ty, v(2, t)?));
                let r = fminmax(a, b, i.op == Op::Max, i.m.nan);
                if r.is_nan() {
                    match ty {
                        Ty::F64 => 0x7FF8_0000_0000_0000,
                        Ty::F32 => 0x7FFF_FFFF,
                        _ => 0x7FFF,
                    }
                } else {
                    fput(ty, r)
                }
            }
            Op::Neg | Op::Abs if ty.is_float() => {
                let sbit = 1u64 << (bits - 1);
                let a = v(1, t)?;
                if i.op == Op::Neg {
                    a ^ sbit
                } else {
                    a & !sbit
                }
            }
            Op::Add | Op::Sub | Op::Min | Op::Max => {
                let s = ty.is_signed();
                let (a, b) = (ext(v(1, t)?, bits, s), ext(v(2, t)?, bits, s));
                (match i.op {
                    Op::Add => a + b,
                    Op::Sub => a - b,
                    Op::Min => a.min(b),
                    _ => a.max(b),
                }) as u64
                    & mask(bits)
            }
            Op::Mul | Op::Mad => {
                let s = ty.is_signed();
                let p = ext(v(1, t)?, bits, s) * ext(v(2, t)?, bits, s);
                let (r, w) = match i.m.width {
                    Some(Width::Lo) => (p, bits),
                    Some(Width::Hi) => (p >> bits, bits),
                    _ => (p, bits * 2),
                };
                let r = if i.op == Op::Mad { r + ext(v(3, t)?, w, s) } else { r };
                (r as u64) & mask(w)
            }
            Op::Div | Op::Rem => {
                let s = ty.is_signed();
                let (a, b) = (ext(v(1, t)?, bits, s), ext(v(2, t)?, bits, s));
                if b == 0 {
                    return Err(SimError::Undefined(format!("integer division by zero: `{}`", i.text)));
                }
                (if i.op == Op::Div { a / b } else { a % b }) as u64 & mask(bits)
            }
            Op::Neg | Op::Abs => {
                let a = ext(v(1, t)?, bits, true);
                (if i.op == Op::Neg { -a } else { a.abs() }) as u64 & mask(bits)
            }
            Op::Not => !v(1, t)? & mask(bits),
            Op::And | Op::Or | Op::Xor => {
                let (a, b) = (v(1, t)?, v(2, t)?);
                (match i.op {
                    Op::And => a & b,
                    Op::Or => a | b,
                    _ => a ^ b,
                }) & mask(bits)
            }
            Op::Shl | Op::Shr => {
                let (a, n) = (v(1, t)?, v(2, t)? as u32);
                if i.op == Op::Shl {
                    if n >= bits {
                        0
                    } else {
                        (a << n) & mask(bits)
                    }
                } else {
                    let x = ext(a, bits, ty.is_signed());
                    (x >> n.min(bits - 1 + u32::from(!ty.is_signed())).min(127)) as u64 & mask(bits)
                }
            }
            Op::Setp => {
                let c = i.m.cmp.as_deref().unwrap_or_default();
                let (a, b) = (v(1, t)?, v(2, t)?);
                u64::from(if ty.is_float() {
                    cmp_f(c, fget(ty, a), fget(ty, b))
                } else {
                    let s = ty.is_signed();
                    if !s && !matches!(c, "eq" | "ne") && matches!(ty, Ty::B(_)) {
                        return unsupported(i.text.clone());
                    }
                    cmp_i(c, ext(a, bits, s), ext(b, bits, s))?
                })
            }
            Op::Selp => {
                if v(3, t)? != 0 {
                    v(1, t)?
                } else {
                    v(2, t)?
                }
            }
            Op::Mov => match (&i.a[0], &i.a[1]) {
                (Opnd::Vec(ds), src) => {
                    let x = self.val(t, src, cx, sh, i)?;
                    let w = bits / ds.len() as u32;
                    for (k, &d) in ds.iter().enumerate() {
                        self.set(t, d, (x >> (w * k as u32)) & mask(w));
                    }
                    return Ok(());
                }
                (_, Opnd::Vec(rs)) => {
                    let w = bits / rs.len() as u32;
                    let mut x = 0u64;
                    for (k, &r) in rs.iter().enumerate() {
                        x |= (t.regs[r] & mask(w)) << (w * k as u32);
                    }
                    x
                }
                _ => v(1, t)?,
            },
            Op::Cvta => v(1, t)?,
            Op::Prmt => {
                // PTX ISA, `prmt`: the eight bytes {b, a} (a's bytes 0..3, b's 4..7);
                // each result byte picks one by a selector nibble, whose msb replicates
                // the picked byte's sign instead; only c's low 16 bits select.
                let x = (v(1, t)? & 0xFFFF_FFFF) | (v(2, t)? & 0xFFFF_FFFF) << 32;
                let c = v(3, t)?;
                (0..4).fold(0u64, |d, k| {
                    let sel = (c >> (4 * k)) & 0xF;
                    let byte = (x >> (8 * (sel & 7))) & 0xFF;
                    let byte = if sel & 8 == 0 {
                        byte
                    } else if byte & 0x80 != 0 {
                        0xFF
                    } else {
                        0
                    };
                    d | byte << (8 * k)
                })
            }
            Op::Cvt => return self.cvt(i, t, cx, sh),
            Op::Mapa => {
                let (a, r) = (v(1, t)?, v(2, t)?);
                if a >> RANK_SHIFT != 0 || r >= u64::from(cx.cluster) {
                    return Err(SimError::OutOfBounds(format!("`{}`: address {a:#x}, rank {r}", i.text)));
                }
                a | (r + 1) << RANK_SHIFT
            }
            Op::Ld | Op::St => return self.mem(i, t, cx, g, sh),
            _ => return unsupported(i.text.clone()),
        };
        let d = self.dst(&i.a[0], i)?;
        self.set(t, d, out);
        Ok(())
    }

    fn cvt(&self, i: &Inst, t: &mut Thread, cx: &Cx, sh: &Shared) -> R<()> {
        let (to, from) = (i.tys[0], i.tys[1]);
        let a = self.val(t, &i.a[1], cx, sh, i)?;
        let r = i.m.rnd;
        let bad = || unsupported(format!("`{}`", i.text));
        let out = match (to.is_float(), from.is_float()) {
            (false, false) => {
                if r.is_some() {
                    return bad();
                }
                let x = ext(a, from.bits(), from.is_signed());
                let x = if i.m.sat {
                    let (lo, hi) = if to.is_signed() {
                        (-(1i128 << (to.bits() - 1)), (1i128 << (to.bits() - 1)) - 1)
                    } else {
                        (0, (1i128 << to.bits()) - 1)
                    };
                    x.clamp(lo, hi)
                } else {
                    x
                };
                // Into a wider register a narrow signed result is sign-extended.
                let w = self.widths.get(match i.a[0] {
                    Opnd::Reg(d) => d,
                    _ => return bad(),
                });
                let x = ext(x as u64, to.bits(), to.is_signed());
                x as u64 & mask(*w.unwrap_or(&64))
            }
            (false, true) => {
                let Some(r) = r else { return bad() };
                let x = fget(from, a);
                if x.is_nan() {
                    0
                } else {
                    let y = round_int(x, r)?;
                    let (lo, hi) = if to.is_signed() {
                        (-(2f64.powi(to.bits() as i32 - 1)), 2f64.powi(to.bits() as i32 - 1) - 1.0)
                    } else {
                        (0.0, 2f64.powi(to.bits() as i32) - 1.0)
                    };
                    let y = y.clamp(lo, hi);
                    (if to.is_signed() { y as i64 as u64 } else { y as u64 }) & mask(to.bits())
                }
            }
            (true, false) => {
                if r != Some(Rnd::Rn) || i.m.sat {
                    return bad();
                }
                let x = ext(a, from.bits(), from.is_signed());
                match to {
                    Ty::F64 => db(x as f64),
                    // i128 → f32 rounds once, to nearest even.
                    Ty::F32 => fb(x as f32),
                    _ => return bad(),
                }
            }
            (true, true) => {
                let x = fget(from, a);
                match (r, to == from) {
                    (Some(r @ (Rnd::Rni | Rnd::Rzi | Rnd::Rmi | Rnd::Rpi)), true) => fput(to, round_int(x, r)?),
                    (None, false) if to.bits() > from.bits() => fput(to, x),
                    (Some(Rnd::Rn), false) if to.bits() < from.bits() => match (to, from) {
                        (Ty::F32, Ty::F64) => fb(x as f32),
                        (Ty::F16 | Ty::Bf16, Ty::F32 | Ty::F64) => fput(to, x),
                        _ => return bad(),
                    },
                    _ => return bad(),
                }
            }
        };
        let d = self.dst(&i.a[0], i)?;
        self.set(t, d, out);
        Ok(())
    }

    fn mem(&self, i: &Inst, t: &mut Thread, cx: &Cx, g: &mut Global, sh: &mut Shared) -> R<()> {
        let ty = i.tys[0];
        let sz = ty.bytes();
        let n = i.m.vec as usize;
        let space = i.m.space.unwrap_or(Space::Global);
        let what = || format!("block {} thread {}: `{}`", cx.ctaid, cx.tid, i.text);
        let regs: &[usize] = match &i.a[usize::from(i.op == Op::St)] {
            Opnd::Reg(r) if n == 1 => std::slice::from_ref(r),
            Opnd::Vec(rs) if rs.len() == n => rs,
            _ if i.op == Op::St && n == 1 => &[],
            _ => return unsupported(format!("`{}`: operands", i.text)),
        };
        if i.op == Op::Ld {
            if space == Space::Param {
                let Opnd::Param(p) = i.a[1] else { return unsupported(i.text.clone()) };
                if ty.bits() != 64 {
                    return unsupported(i.text.clone());
                }
                self.set(t, regs[0], base(p));
                return Ok(());
            }
            let addr = self.addr(t, &i.a[1], cx, sh, i)?;
            let total = sz * n;
            let mut bytes = [0u8; 32];
            match space {
                Space::Global => {
                    let (b, o) = g.locate(addr, total, &what)?;
                    bytes[..total].copy_from_slice(&g.bufs[b][o..o + total]);
                }
                _ => {
                    let (r, o) = sh.locate(addr, total, cx.rank as usize, space == Space::Cluster, &what)?;
                    // A remote rank's bytes are ordered by the cluster barrier, not tracked here.
                    if r == cx.rank as usize {
                        sh.readable(r, o, total, cx.tid, &what)?;
                    } else if let Some(k) = sh.init[r][o..o + total].iter().position(|&x| !x) {
                        return Err(SimError::Uninitialised(format!("{}: byte {} of rank {r}", what(), o + k)));
                    }
                    bytes[..total].copy_from_slice(&sh.bytes[r][o..o + total]);
                }
            }
            for (k, &d) in regs.iter().enumerate() {
                let mut w = [0u8; 8];
                w[..sz].copy_from_slice(&bytes[k * sz..(k + 1) * sz]);
                let x = u64::from_le_bytes(w);
                // Sub-word signed loads sign-extend into the register.
                let x = if ty.is_signed() { ext(x, ty.bits(), true) as u64 } else { x };
                self.set(t, d, x);
            }
            return Ok(());
        }
        let total = sz * n;
        let mut bytes = [0u8; 32];
        if regs.is_empty() {
            let x = self.val(t, &i.a[1], cx, sh, i)?;
            bytes[..sz].copy_from_slice(&x.to_le_bytes()[..sz]);
        }
        for (k, &r) in regs.iter().enumerate() {
            bytes[k * sz..(k + 1) * sz].copy_from_slice(&t.regs[r].to_le_bytes()[..sz]);
        }
        let addr = self.addr(t, &i.a[0], cx, sh, i)?;
        match space {
            Space::Global => {
                let (b, o) = g.locate(addr, total, &what)?;
                g.bufs[b][o..o + total].copy_from_slice(&bytes[..total]);
                g.written[b][o..o + total].iter_mut().for_each(|w| *w = true);
            }
            Space::Shared => {
                let (r, o) = sh.locate(addr, total, cx.rank as usize, false, &what)?;
                sh.store(r, o, &bytes[..total], cx.tid, &what)?;
            }
            _ => return unsupported(i.text.clone()),
        }
        Ok(())
    }

    /// The 32-bit registers of operand `k` of `i` (a `{…}` vector of `n`).
    fn regs_of<'a>(&self, i: &'a Inst, k: usize, n: usize) -> R<&'a [usize]> {
        match &i.a[k] {
            Opnd::Vec(rs) if rs.len() == n && rs.iter().all(|&r| self.widths[r] == 32) => Ok(rs),
            _ => unsupported(format!("`{}`: operand {k} is not {n} 32-bit registers", i.text)),
        }
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.T.T.f32 d, a, b, c` for the whole warp
    /// (`lanes`, all 32, in lane order), T = f16 or bf16: `D = A·B + C`, A 16×16, B
    /// 16×8, C and D 16×8 f32. Fragments per the PTX ISA ("Matrix Fragments for
    /// mma.m16n8k16 with floating point type"), with `group = lane >> 2`, `tig = lane
    /// % 4`: A's four `.b32` registers hold `a0..a7` two to a register (the lower index
    /// in the low half); `a_i` is at row `group` (i ∈ {0,1,4,5}) or `group + 8`, column
    /// `2·tig + (i & 1)` (i < 4) or that `+ 8`. B's two registers hold `b0..b3`: `b_i` at
    /// row (k) `2·tig + (i & 1)` (i < 2) or that `+ 8`, column (n) `group`. C and D's four
    /// f32 registers: `c_i` at row `group` (i < 2) or `group + 8`, column `2·tig + (i & 1)`.
    ///
    /// Arithmetic: the ISA leaves the order and internal precision of the accumulation
    /// unspecified. Modelled as the 16 products taken exactly (a half times a half is
    /// exact in f64), summed with `c` in f64 and rounded once to f32; a GPU may differ
    /// by f32 roundings of the partial sums, which callers' tolerances absorb.
    fn mma(&self, threads: &mut [Thread], lanes: &[usize]) -> R<()> {
        let i = &self.insts[threads[lanes[0]].pc];
        if lanes.len() != 32 {
            return Err(SimError::Divergence(format!("`{}` run by {} lanes, not 32", i.text, lanes.len())));
        }
        let half = |x: u64| -> f64 {
            let h = (x & 0xFFFF) as u16;
            if i.tys[1] == Ty::Bf16 {
                f64::from(f32::from_bits(u32::from(h) << 16))
            } else {
                f64::from(f16_to_f32(h))
            }
        };
        let (ra, rb, rc, rd) =
            (self.regs_of(i, 1, 4)?, self.regs_of(i, 2, 2)?, self.regs_of(i, 3, 4)?, self.regs_of(i, 0, 4)?);
        let mut a = [[0f64; 16]; 16];
        let mut b = [[0f64; 8]; 16];
        let mut c = [[0f64; 8]; 16];
        for (lane, &l) in lanes.iter().enumerate() {
            let t = &threads[l];
            let (group, tig) = (lane / 4, lane % 4);
            for idx in 0..8 {
                let row = if matches!(idx, 0 | 1 | 4 | 5) { group } else { group + 8 };
                let col = 2 * tig + (idx & 1) + if idx < 4 { 0 } else { 8 };
                a[row][col] = half(t.regs[ra[idx / 2]] >> (16 * (idx % 2)));
            }
            for idx in 0..4 {
                let k = 2 * tig + (idx & 1) + if idx < 2 { 0 } else { 8 };
                b[k][group] = half(t.regs[rb[idx / 2]] >> (16 * (idx % 2)));
            }
            for (idx, &r) in rc.iter().enumerate() {
                let row = if idx < 2 { group } else { group + 8 };
                c[row][2 * tig + (idx & 1)] = f64::from(f32v(t.regs[r]));
            }
        }
        for (lane, &l) in lanes.iter().enumerate() {
            let (group, tig) = (lane / 4, lane % 4);
            let mut out = [0u64; 4];
            for (idx, o) in out.iter_mut().enumerate() {
                let row = if idx < 2 { group } else { group + 8 };
                let col = 2 * tig + (idx & 1);
                let d: f64 = c[row][col] + (0..16).map(|k| a[row][k] * b[k][col]).sum::<f64>();
                *o = fb(d as f32);
            }
            let t = &mut threads[l];
            for (idx, &r) in rd.iter().enumerate() {
                self.set(t, r, out[idx]);
            }
            t.pc += 1;
            t.st = St::Run;
        }
        Ok(())
    }

    /// `ldmatrix.sync.aligned.m8n8.xN[.trans].shared.b16 {r0..}, [p]` for the whole warp
    /// (PTX ISA, "ldmatrix"): N 8×8 matrices of 16-bit elements; lane `8·i + j` gives the
    /// address of row `j` of matrix `i` (16 contiguous bytes, 16-byte aligned; the other
    /// lanes' addresses are unused). Lane `l` receives in `r_i` the elements of matrix
    /// `i` at row `l / 4`, columns `2·(l % 4)` and `2·(l % 4) + 1` (the first in the low
    /// half); with `.trans`, the elements of the transposed matrix: rows `2·(l % 4)` and
    /// `2·(l % 4) + 1` of column `l / 4`.
    fn ldmatrix(
        &self,
        threads: &mut [Thread],
        lanes: &[usize],
        warp0: usize,
        cx_of: &dyn Fn(usize) -> Cx,
        sh: &mut Shared,
    ) -> R<()> {
        let i = &self.insts[threads[lanes[0]].pc];
        if lanes.len() != 32 {
            return Err(SimError::Divergence(format!("`{}` run by {} lanes, not 32", i.text, lanes.len())));
        }
        let n = i.m.vec as usize;
        let rd = self.regs_of(i, 0, n)?;
        // m[i][j][c]: element (j, c) of matrix i.
        let mut m = vec![[[0u16; 8]; 8]; n];
        for (mi, mat) in m.iter_mut().enumerate() {
            for (j, row) in mat.iter_mut().enumerate() {
                let l = warp0 + 8 * mi + j;
                let cx = cx_of(l);
                let what = || format!("block {} thread {}: `{}`", cx.ctaid, cx.tid, i.text);
                let addr = self.addr(&threads[l], &i.a[1], &cx, sh, i)?;
                let (r, o) = sh.locate(addr, 16, cx.rank as usize, false, &what)?;
                sh.readable(r, o, 16, cx.tid, &what)?;
                for (c, x) in row.iter_mut().enumerate() {
                    *x = u16::from_le_bytes([sh.bytes[r][o + 2 * c], sh.bytes[r][o + 2 * c + 1]]);
                }
            }
        }
        for (lane, &l) in lanes.iter().enumerate() {
            let t = &mut threads[l];
            for (mi, &r) in rd.iter().enumerate() {
                let (p, q) = (lane / 4, 2 * (lane % 4));
                let (lo, hi) = if i.m.trans { (m[mi][q][p], m[mi][q + 1][p]) } else { (m[mi][p][q], m[mi][p][q + 1]) };
                self.set(t, r, u64::from(lo) | u64::from(hi) << 16);
            }
            t.pc += 1;
            t.st = St::Run;
        }
        Ok(())
    }

    /// Runs the shuffle every lane of `lanes` (threads of one warp, all stopped at
    /// instruction `pc`) executes together.
    fn shuffle(&self, threads: &mut [Thread], lanes: &[usize], warp0: usize, cx: &Cx, sh: &Shared) -> R<()> {
        let i = &self.insts[threads[lanes[0]].pc];
        let mode = i.m.shfl.unwrap_or(Shfl::Idx);
        let mut src = vec![0u64; 32];
        let mut active = [false; 32];
        for &l in lanes {
            let lane = l - warp0;
            src[lane] = self.val(&threads[l], &i.a[1], cx, sh, i)?;
            active[lane] = true;
        }
        let mut results = Vec::new();
        for &l in lanes {
            let lane = (l - warp0) as i64;
            let th = &threads[l];
            let (b, c) = (self.val(th, &i.a[2], cx, sh, i)? as i64, self.val(th, &i.a[3], cx, sh, i)? as i64);
            let (bval, cval, seg) = (b & 31, c & 31, (c >> 8) & 31);
            let max_lane = (lane & seg) | (cval & !seg);
            let min_lane = lane & seg;
            let (j, p) = match mode {
                Shfl::Up => (lane - bval, lane - bval >= max_lane),
                Shfl::Down => (lane + bval, lane + bval <= max_lane),
                Shfl::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
                Shfl::Idx => {
                    let j = min_lane | (bval & !seg);
                    (j, j <= max_lane)
                }
            };
            let j = if p { j } else { lane };
            if !(0..32).contains(&j) || !active[j as usize] {
                return Err(SimError::Divergence(format!(
                    "block {}: lane {lane} of warp {} reads lane {j}, which does not execute `{}`",
                    cx.ctaid,
                    warp0 / 32,
                    i.text
                )));
            }
            results.push((l, src[j as usize], p));
        }
        for (l, x, p) in results {
            let th = &mut threads[l];
            match &i.a[0] {
                Opnd::Reg(d) => self.set(th, *d, x),
                Opnd::Pair(d, q) => {
                    self.set(th, *d, x);
                    self.set(th, *q, u64::from(p));
                }
                o => return unsupported(format!("destination {o:?} of `{}`", i.text)),
            }
            th.pc += 1;
            th.st = St::Run;
        }
        Ok(())
    }
}

/// Runs entry `e` over `launch` with `g` bound to its parameters in order.
pub fn run(e: &Entry, launch: Grid, g: &mut Global, lim: Limits) -> R<Stats> {
    if g.bufs.len() != e.params {
        return Err(SimError::Parse(format!("{} bindings for {} parameters", g.bufs.len(), e.params)));
    }
    let cs = e.cluster;
    if launch.grid == 0 || !launch.grid.is_multiple_of(cs) || launch.block == 0 || launch.block > 1024 {
        return Err(SimError::Parse(format!("launch {launch:?} with clusters of {cs}")));
    }
    let mut stats = Stats::default();
    let block = launch.block as usize;
    for cluster in 0..launch.grid / cs {
        if stats.steps > lim.total {
            if lim.stop_early {
                stats.partial = true;
                return Ok(stats);
            }
            return Err(SimError::Budget(format!("past {} instructions in all", lim.total)));
        }
        let mut sh = Shared::new(e, launch.shared)?;
        let n = cs as usize * block;
        let mut th: Vec<Thread> = (0..n)
            .map(|k| Thread {
                regs: vec![0; e.widths.len()],
                pc: 0,
                st: St::Run,
                steps: 0,
                uni: HashMap::new(),
                open: Vec::new(),
                tid: (k % block) as u32,
                groups: Default::default(),
                written: vec![0; e.widths.len()],
                wg_fence: None,
                wg_open: Vec::new(),
                wg_groups: Default::default(),
                wg_pending: HashMap::new(),
            })
            .collect();
        let cx_of = |k: usize| {
            let rank = (k / block) as u32;
            Cx {
                tid: (k % block) as u32,
                block: launch.block,
                ctaid: cluster * cs + rank,
                grid: launch.grid,
                rank,
                cluster: cs,
            }
        };
        loop {
            for (k, t) in th.iter_mut().enumerate() {
                if t.st == St::Run {
                    e.advance(t, &cx_of(k), g, &mut sh, &lim)?;
                }
            }
            if th.iter().all(|t| t.st == St::Exit) {
                break;
            }
            let mut moved = false;
            // Shuffles: per warp, per instruction.
            for w0 in (0..n).step_by(32) {
                let w1 = (w0 + 32).min((w0 / block + 1) * block).min(n);
                let warp0 = w0;
                let mut pcs: Vec<usize> = (w0..w1).filter(|&k| th[k].st == St::Shfl).map(|k| th[k].pc).collect();
                pcs.sort_unstable();
                pcs.dedup();
                for pc in pcs {
                    let lanes: Vec<usize> = (w0..w1).filter(|&k| th[k].st == St::Shfl && th[k].pc == pc).collect();
                    let i = &e.insts[pc];
                    let cx = cx_of(lanes[0]);
                    // `.aligned` matrix instructions: every lane of the warp.
                    let mask_of = |t: &Thread, cx: &Cx| -> R<u32> {
                        if i.op == Op::Shfl {
                            Ok(e.val(t, &i.a[4], cx, &sh, i)? as u32)
                        } else {
                            Ok(u32::MAX)
                        }
                    };
                    let m0 = mask_of(&th[lanes[0]], &cx)?;
                    let mut complete = true;
                    for l in 0..32usize {
                        let k = warp0 + l;
                        let member = m0 >> l & 1 == 1;
                        let here = lanes.contains(&k);
                        if here {
                            let m = mask_of(&th[k], &cx_of(k))?;
                            if m != m0 || !member {
                                return Err(SimError::Divergence(format!(
                                    "block {}: lanes of warp {} execute `{}` with masks {m0:#x} and {m:#x}",
                                    cx.ctaid,
                                    (w0 % block) / 32,
                                    i.text
                                )));
                            }
                        } else if member {
                            if k >= w1 || th[k].st == St::Exit {
                                return Err(SimError::Divergence(format!(
                                    "block {}: lane {l} of warp {} is in the mask of `{}` but has exited",
                                    cx.ctaid,
                                    (w0 % block) / 32,
                                    i.text
                                )));
                            }
                            complete = false;
                        }
                    }
                    if complete {
                        match i.op {
                            Op::Mma => e.mma(&mut th, &lanes)?,
                            Op::Ldmatrix => e.ldmatrix(&mut th, &lanes, warp0, &cx_of, &mut sh)?,
                            _ => e.shuffle(&mut th, &lanes, warp0, &cx, &sh)?,
                        }
                        moved = true;
                    }
                }
            }
            // Warpgroups (128 consecutive threads of a block) at `wgmma.mma_async`.
            for r in 0..cs as usize {
                for g0 in (r * block..(r + 1) * block).step_by(128) {
                    let g1 = (g0 + 128).min((r + 1) * block);
                    let at: Vec<usize> = (g0..g1).filter(|&k| th[k].st == St::Wg).collect();
                    if at.is_empty() {
                        continue;
                    }
                    let i = &e.insts[th[at[0]].pc];
                    if g1 - g0 != 128 {
                        return Err(SimError::Divergence(format!("`{}` in a block of {block} threads", i.text)));
                    }
                    if let Some(x) = (g0..g1).find(|&k| th[k].st == St::Exit) {
                        return Err(SimError::Divergence(format!(
                            "block {}: `{}` while thread {} of its warpgroup has exited",
                            cluster * cs + r as u32,
                            i.text,
                            x - r * block
                        )));
                    }
                    if at.len() == 128 {
                        if at.iter().any(|&k| th[k].pc != th[at[0]].pc) {
                            return Err(SimError::Divergence(format!(
                                "block {}: a warpgroup at different wgmma instructions",
                                cluster * cs + r as u32
                            )));
                        }
                        e.wgmma(&mut th, &at, r, &mut sh)?;
                        moved = true;
                    }
                }
            }
            if moved {
                continue;
            }
            // Block barriers.
            for r in 0..cs as usize {
                let b = &mut th[r * block..(r + 1) * block];
                if b.iter().any(|t| t.st == St::Bar) && b.iter().all(|t| matches!(t.st, St::Bar | St::Exit)) {
                    if let Some(x) = b.iter().position(|t| t.st == St::Exit) {
                        return Err(SimError::Divergence(format!(
                            "block {}: bar.sync reached by {} threads while thread {x} has exited",
                            cluster * cs + r as u32,
                            b.iter().filter(|t| t.st == St::Bar).count()
                        )));
                    }
                    b.iter_mut().for_each(|t| t.st = St::Run);
                    sh.epoch[r] += 1;
                    moved = true;
                }
            }
            if moved {
                continue;
            }
            // The cluster barrier.
            if th.iter().all(|t| matches!(t.st, St::Cluster | St::Exit)) {
                th.iter_mut().filter(|t| t.st == St::Cluster).for_each(|t| t.st = St::Run);
                sh.epoch.iter_mut().for_each(|e| *e += 1);
                continue;
            }
            let mut counts: HashMap<String, usize> = HashMap::new();
            for t in &th {
                let at = e.insts.get(t.pc.saturating_sub(usize::from(matches!(t.st, St::Bar | St::Cluster))));
                let key = format!("{:?} at `{}`", t.st, at.map_or("end", |i| i.text.as_str()));
                *counts.entry(key).or_default() += 1;
            }
            let mut c: Vec<String> = counts.into_iter().map(|(k, n)| format!("{n} threads {k}")).collect();
            c.sort();
            return Err(SimError::Divergence(format!("cluster {cluster}: threads wait apart: {}", c.join("; "))));
        }
        stats.steps += th.iter().map(|t| t.steps).sum::<u64>();
        stats.clusters_run += 1;
    }
    Ok(stats)
}

// ------------------------------------------------------------------------------------
// Against the kernel interpreter

/// How close the simulated output must be to the interpreter's.
#[derive(Debug, Clone, Copy)]
pub enum Tol {
    /// Bit for bit (any NaN matches any NaN; −0 and +0 differ).
    Exact,
    /// Within this many units in the last place of the output type (f32 only; other
    /// types exact).
    Ulps(u32),
    /// `|got − want| ≤ abs + rel·|want|` (NaN and infinities must match exactly).
    Rel { rel: f64, abs: f64 },
}

/// A check's inputs and bounds.
#[derive(Debug, Clone, Copy)]
pub struct Check {
    pub seed: u64,
    /// Put NaN and ±∞ among the float inputs.
    pub specials: bool,
    /// Put −0 among the float inputs too (with `specials`). PTX `max/min.f32` order
    /// −0 below +0 (IEEE 754-2019, as modelled here) where the interpreter's Max/Min
    /// may keep either zero: a sign-of-zero divergence to check on a GPU.
    pub neg_zero: bool,
    pub tol: Tol,
    /// Run at most this many blocks (rounded to whole clusters; at least 2 clusters
    /// where the launch has them): a grid-stride kernel then walks its tail.
    pub max_blocks: Option<u32>,
    /// Stop after about this many simulated instructions (whole clusters), comparing
    /// the elements written so far.
    pub budget: Option<u64>,
    /// Integer inputs are drawn from `lo..=hi`.
    pub ints: (i64, i64),
    /// Compare with the interpreter (else only run: memory, barrier and shuffle
    /// checks, for kernels too large to interpret).
    pub oracle: bool,
}

impl Check {
    /// [`check_against_interpreter`] of entry `index` twice: on plain random inputs,
    /// then with NaN and ±∞ (and −0 where `neg_zero`) among them; as `self` says
    /// otherwise. The plain run's outcome.
    pub fn plain_and_specials(&self, k: &Kernel, ptx: &str, index: usize, launch: Grid) -> Result<Outcome, String> {
        let plain = check_against_interpreter(k, ptx, index, launch, &Check { specials: false, ..*self })?;
        check_against_interpreter(k, ptx, index, launch, &Check { specials: true, ..*self })?;
        Ok(plain)
    }

    pub fn exact(seed: u64) -> Check {
        Check {
            seed,
            specials: false,
            neg_zero: true,
            tol: Tol::Exact,
            max_blocks: None,
            budget: None,
            ints: (-9, 9),
            oracle: true,
        }
    }
}

/// The longest reduction of `k`: the largest count of terms one `Reduce` folds (1
/// without reductions). Tolerances of reassociated sums scale with it.
pub fn reduction_length(k: &Kernel) -> u64 {
    reductions(k).into_iter().max().unwrap_or(1)
}

/// About how many terms the interpreter evaluates for `k`: each output element
/// recomputes every reduction.
pub fn interpretation_cost(k: &Kernel) -> u64 {
    let per: u64 = reductions(k).iter().sum::<u64>().max(1);
    (k.output.shape.numel() as u64).saturating_mul(per)
}

fn reductions(k: &Kernel) -> Vec<u64> {
    k.nodes
        .iter()
        .filter_map(|n| match &n.expr {
            kiln_flow::Expr::Reduce { vars, .. } => Some(vars.iter().map(|v| k.vars[v.0 as usize]).product()),
            _ => None,
        })
        .collect()
}

/// What a check compared.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    pub compared: usize,
    pub elements: usize,
    pub grid: u32,
    pub steps: u64,
    pub partial: bool,
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

/// Random inputs of the types `tys`: floats in [−2, 2) on a 2⁻¹⁰ grid (exact in every
/// float type), with NaN, +∞, −∞ and −0 sprinkled where `specials`; integers in
/// `ints`; bools 0/1. (−0 only where `neg_zero` too.)
pub fn random_inputs(tys: &[TensorType], seed: u64, specials: bool, neg_zero: bool, ints: (i64, i64)) -> Vec<Tensor> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    tys.iter()
        .map(|t| {
            let n = t.shape.numel();
            if t.dtype.is_float() {
                let v: Vec<f64> = (0..n)
                    .map(|i| {
                        let x = xorshift(&mut s);
                        match i {
                            _ if specials && i % 13 == 5 => f64::NAN,
                            _ if specials && i % 29 == 3 => f64::INFINITY,
                            _ if specials && i % 31 == 7 => f64::NEG_INFINITY,
                            _ if specials && neg_zero && i % 37 == 11 => -0.0,
                            _ => (x % 4096) as f64 / 1024.0 - 2.0,
                        }
                    })
                    .collect();
                Tensor::from_f64(t.dtype, t.shape.clone(), &v).expect("a float tensor")
            } else {
                let (lo, hi) = if t.dtype == DType::Bool {
                    (0, 1)
                } else if t.dtype.is_unsigned_int() {
                    (ints.0.max(0), ints.1.max(0))
                } else {
                    ints
                };
                let span = (hi - lo + 1).max(1) as u64;
                let v: Vec<i64> = (0..n).map(|_| lo + (xorshift(&mut s) % span) as i64).collect();
                Tensor::from_i64(t.dtype, t.shape.clone(), &v).expect("an integer tensor")
            }
        })
        .collect()
}

fn ulps32(a: f32, b: f32) -> u64 {
    let ord = |x: f32| {
        let b = x.to_bits() as i32;
        i64::from(if b < 0 { i32::MIN - b } else { b })
    };
    (ord(a) - ord(b)).unsigned_abs()
}

/// Runs entry `index` of `ptx` (kernel `k`) over its whole `launch` on `inputs`, the
/// output buffer filled with `0xA5` first, and returns its output beside the kernel
/// interpreter's run of `oracle` (`k` itself, or a twin defined to store the same
/// values) on the same inputs. Panics, naming the kernel, where either fails or an
/// output byte is never written.
pub fn run_beside_interpreter(
    k: &Kernel,
    oracle: &Kernel,
    ptx: &str,
    index: usize,
    launch: Grid,
    inputs: &[Tensor],
) -> (Tensor, Tensor) {
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let want = interp::run(oracle, &refs).unwrap_or_else(|e| panic!("{}: interpreter: {e}", k.name));
    let e = parse(ptx, index).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let mut bufs: Vec<Vec<u8>> = inputs.iter().map(|t| t.bytes().to_vec()).collect();
    bufs.push(vec![0xA5; k.output.storage_bytes()]);
    let mut g = Global::new(bufs);
    run(&e, launch, &mut g, Limits::default()).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    assert!(g.written.pop().expect("the output").iter().all(|&w| w), "{}: a byte never written", k.name);
    let got = Tensor::new(k.output.clone(), g.bufs.pop().expect("the output").into()).expect("output tensor");
    (got, want)
}

/// Runs entry `index` of `ptx` (kernel `k`'s code) over `launch` on random inputs
/// (`c`) and compares every output element it wrote with the kernel interpreter's,
/// within `c.tol`. The full launch must write every element; a reduced one (`c`'s
/// `max_blocks` or `budget`) is checked on the elements it wrote (at least one).
pub fn check_against_interpreter(
    k: &Kernel,
    ptx: &str,
    index: usize,
    launch: Grid,
    c: &Check,
) -> Result<Outcome, String> {
    let e = parse(ptx, index).map_err(|e| format!("{}: {e}", k.name))?;
    if e.name != k.name {
        return Err(format!("entry {index} is {}, not {}", e.name, k.name));
    }
    let ins = random_inputs(&k.inputs, c.seed, c.specials, c.neg_zero, c.ints);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want =
        if c.oracle { Some(interp::run(k, &refs).map_err(|e| format!("{}: interpreter: {e}", k.name))?) } else { None };
    let mut bufs: Vec<Vec<u8>> = ins.iter().map(|t| t.bytes().to_vec()).collect();
    let out_bytes = k.output.storage_bytes();
    bufs.push(vec![0xFF; out_bytes]);
    let mut g = Global::new(bufs);
    let mut grid = launch.grid;
    if let Some(m) = c.max_blocks {
        let cs = e.cluster;
        grid = grid.min(m.div_ceil(cs).max(2) * cs).min(launch.grid);
    }
    let lim = Limits {
        total: c.budget.unwrap_or(Limits::default().total),
        stop_early: c.budget.is_some(),
        ..Limits::default()
    };
    let stats = run(&e, Grid { grid, ..launch }, &mut g, lim).map_err(|err| format!("{}: {err}", k.name))?;
    let reduced = grid < launch.grid || stats.partial;
    let dt = k.output.dtype;
    let esz = dt.storage_bytes(1).max(1);
    let got_t = Tensor::new(k.output.clone(), g.bufs.pop().unwrap_or_default().into())
        .map_err(|e| format!("{}: output: {e}", k.name))?;
    let written = g.written.pop().unwrap_or_default();
    let Some(want) = want else {
        let wrote = written.iter().filter(|&&w| w).count() / esz;
        if wrote == 0 {
            return Err(format!("{}: no element written by {grid} blocks in {} instructions", k.name, stats.steps));
        }
        return Ok(Outcome {
            compared: 0,
            elements: k.output.shape.numel(),
            grid,
            steps: stats.steps,
            partial: stats.partial,
        });
    };
    let (gv, wv) = (got_t.to_f64_vec(), want.to_f64_vec());
    let n = wv.len();
    let mut compared = 0;
    for i in 0..n {
        let wrote = if dt.is_packed() {
            written.iter().all(|&w| w)
        } else {
            written[i * esz..(i + 1) * esz].iter().all(|&w| w)
        };
        if !wrote {
            if reduced {
                continue;
            }
            return Err(format!("{}: element {i} of {:?} never written", k.name, k.output.shape.dims()));
        }
        compared += 1;
        let (g1, w1) = (gv[i], wv[i]);
        let ok = if g1.is_nan() || w1.is_nan() {
            g1.is_nan() && w1.is_nan()
        } else if !dt.is_float() {
            g1 == w1
        } else {
            match c.tol {
                Tol::Exact => g1.to_bits() == w1.to_bits(),
                Tol::Ulps(u) if dt == DType::F32 => ulps32(g1 as f32, w1 as f32) <= u64::from(u),
                Tol::Ulps(_) => g1.to_bits() == w1.to_bits(),
                Tol::Rel { rel, abs } => {
                    if g1.is_infinite() || w1.is_infinite() {
                        g1 == w1
                    } else {
                        (g1 - w1).abs() <= abs + rel * w1.abs()
                    }
                }
            }
        };
        if !ok {
            return Err(format!(
                "{} (specials {}): element {i} of {:?}: simulated {g1:e}, interpreter {w1:e} (tolerance {:?})",
                k.name,
                c.specials,
                k.output.shape.dims(),
                c.tol
            ));
        }
    }
    if compared == 0 {
        return Err(format!("{}: no element written by {grid} blocks in {} instructions", k.name, stats.steps));
    }
    Ok(Outcome { compared, elements: n, grid, steps: stats.steps, partial: stats.partial })
}

/// Special-valued inputs of f32.
pub fn f32_specials() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::from_bits(0x007F_FFFF),
        f32::MAX,
        f32::MIN,
        1.0,
        -1.0,
        0.5,
        -0.5,
        2.0,
        -2.0,
        1.0 + f32::EPSILON,
        1.0 - f32::EPSILON / 2.0,
        3.0,
        -3.0,
    ];
    v.extend((-3..=3).map(|k| k as f32 * 0.25));
    v
}
