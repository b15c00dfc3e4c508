//! How long a kernel's dispatch takes on one thread: the estimate a driver weighs
//! against the cost of handing work to other threads.
//!
//! A roofline per code path: the larger of the arithmetic at that path's rate and the
//! bytes the kernel's operands and result occupy at a memory rate, plus a fixed cost
//! per dispatch. The rates were fitted to per-kernel profiles of mlp, lenet,
//! mobilenet_v2 and bert_tiny on this project's machines (`KILN_PERF_MAP=1 perf
//! record … kiln bench`, one thread): the estimates of a whole model came within 15% of
//! its measured time (mobilenet_v2 7.35 ms against 7.24, bert_tiny 5.0 against 4.3, lenet
//! 15.6 µs against 12.0, mlp 27 against 26), and single kernels within a factor of 3 but
//! for a few (a Gather over-estimated 4×, a general-path mean under-estimated 3×). An
//! estimate only has to tell a few microseconds of work from a few hundred.

use kiln_flow::contraction::Contraction;
use kiln_flow::{Expr, Kernel};

/// Which code a kernel was compiled to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    /// A contraction microkernel (`gemm`).
    Contraction,
    /// A depthwise convolution or max pool (`depthwise`).
    Window,
    /// A padding or affine copy, or a row kernel (`pad`, `copy`, `rows`).
    Vector,
    /// Cranelift's loops (`emit`).
    General,
    /// An attention kernel (`attention`): its two products at a contraction
    /// microkernel's rate, plus [`ATTENTION_ROW_NS`] per query row.
    Attention,
}

/// Multiply-adds a contraction microkernel does per nanosecond (two 256-bit FMA pipes
/// at about 3.5 GHz do 56; tiles at the edges and packing take some of it).
const MACS_PER_NS: f64 = 48.0;
/// Kernel node evaluations per nanosecond ([`kiln_flow::fuse::work`]) on the other paths.
const EVALS_PER_NS: [f64; 3] = [
    100.0, // window: 8 or 16 lanes, a tap's load and FMA
    40.0,  // vector: 8 or 16 lanes, more nodes per element than they execute
    1.5,   // general: scalar or 4–8 lanes, index arithmetic in the loops
];
/// An attention kernel's time per query row besides its products: the row's online
/// softmax (maximum, rescaling, the final division) and its tile's set-up. Fitted with
/// the products at [`MACS_PER_NS`] to the profiles (`kiln bench --profile`, one thread)
/// of bert_tiny (4 heads of 64, 128 keys: 195 µs measured, 185 estimated), minilm_l3 at
/// 128 tokens (12 heads of 32: 266 µs, 293) and bert_large_layer (16 heads of 64, 16
/// keys: 22 µs, 16); the products alone at half that rate, the estimate before, came to
/// 350, 524 and 22 µs.
const ATTENTION_ROW_NS: f64 = 20.0;
/// Bytes per nanosecond one core moves to and from the second- and third-level caches.
const BYTES_PER_NS: f64 = 80.0;
/// Entering a kernel, its loops' set-up and the first touch of its operands.
const FIXED_NS: f64 = 50.0;

/// The estimated single-thread time of all of `k`'s workgroups, in nanoseconds.
pub(crate) fn estimate_ns(k: &Kernel, path: Path) -> u64 {
    let bytes: usize = (0..k.inputs.len()).map(|i| input_bytes(k, i)).sum::<usize>() + k.output.storage_bytes();
    let memory = bytes as f64 / BYTES_PER_NS;
    let arithmetic = match path {
        Path::Contraction => match Contraction::of(k) {
            Some(c) => {
                let batch: f64 = c.batch.iter().map(|&v| k.vars[v as usize] as f64).product();
                batch * c.dims.iter().map(|&d| d as f64).product::<f64>() / MACS_PER_NS
            }
            None => kiln_flow::fuse::work(k) / EVALS_PER_NS[1],
        },
        Path::Window => kiln_flow::fuse::work(k) / EVALS_PER_NS[0],
        Path::Vector => kiln_flow::fuse::work(k) / EVALS_PER_NS[1],
        Path::General => kiln_flow::fuse::work(k) / EVALS_PER_NS[2],
        Path::Attention => match kiln_flow::attention::Attention::of(k) {
            Some(a) => {
                let var = |v: u32| k.vars.get(v as usize).map_or(0.0, |&e| e as f64);
                // Query rows, each `keys × depth` multiply-adds for its scores and
                // `keys × width` for P·V.
                let width = var(a.column).max(1.0);
                let rows = k.output.shape.numel() as f64 / width;
                let macs = rows * var(a.key) * (var(a.depth) + width);
                macs / MACS_PER_NS + rows * ATTENTION_ROW_NS
            }
            None => kiln_flow::fuse::work(k) / EVALS_PER_NS[1],
        },
    };
    (FIXED_NS + arithmetic.max(memory)).min(u64::MAX as f64) as u64
}

/// Bytes of input `i` that `k` reads: all of it, but where `k` reduces nothing each
/// output element reads each of its loads of `i` once, so no more than that many
/// elements. A recurrence step reads one step's slice of a sequence's projections
/// (crnn's LSTM cell updates: 8 KB of a 320 KB input, estimated at 4.3 µs for about 1,
/// and so split over two threads at a hand-off's cost); a gather, a few rows of a table.
fn input_bytes(k: &Kernel, i: usize) -> usize {
    let t = &k.inputs[i];
    let mut loads = 0;
    for node in &k.nodes {
        match node.expr {
            Expr::Reduce { .. } => return t.storage_bytes(),
            Expr::Load { input, .. } if input as usize == i => loads += 1,
            _ => {}
        }
    }
    t.storage_bytes().min(t.dtype.storage_bytes(k.output.shape.numel().saturating_mul(loads)))
}
