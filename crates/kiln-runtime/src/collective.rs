//! The collectives of a plan sharded across devices (`Command::AllReduce`,
//! `Command::AllGather`), executed in host memory: the devices of a CPU plan are
//! simulated devices of one process whose buffers all live in the one arena, so a
//! collective is a loop over their ranges, run on the calling thread between waves.
//!
//! Why in turn rather than one thread per simulated device: the plan already orders
//! every device's dispatches between the collectives, the compiler puts the dispatches
//! of all devices that may run at once into one wave (so the local-task driver runs
//! them concurrently, each split over the pool as usual), and a collective is then a
//! synchronisation point that every device has reached by construction. A thread per
//! device would add a second pool and a rendezvous per collective to compute the same
//! bits. A driver for real devices (NCCL on GPUs) replaces these loops, not the plan.
//!
//! Both loops allocate nothing. The sum is taken in part order for every element, so
//! every device receives the same bits whatever the order the parts sit in memory.

use crate::instance::Bases;
use kiln_module::program::CollectivePart;

/// Every part's destination gets the elementwise f32 sum of every part's source, added
/// in part order.
///
/// # Safety
///
/// `bases` are those of a checked invocation; the parts passed the verifier's
/// collective checks (every range inside its slot, one length of whole f32 elements,
/// destinations writable and overlapping no source and no other destination), and
/// nothing else touches these ranges meanwhile.
pub(crate) unsafe fn all_reduce_f32(parts: &[CollectivePart], bases: &Bases<'_>) {
    let Some(first) = parts.first() else { return };
    let n = first.src.length as usize / 4;
    // Unaligned reads and writes: ranges start at 64-byte aligned arena offsets in a
    // compiled plan, but the verifier does not require it.
    for i in 0..n {
        let mut acc = 0.0f32;
        for (k, p) in parts.iter().enumerate() {
            // SAFETY: element `i` of the source lies inside its verified range.
            let x = unsafe { bases.at(&p.src).cast::<f32>().add(i).read_unaligned() };
            acc = if k == 0 { x } else { acc + x };
        }
        for p in parts {
            // SAFETY: element `i` of the destination lies inside its verified range,
            // which overlaps no source (already read for `i` anyway) and no other
            // destination.
            unsafe { bases.at(&p.dst).cast::<f32>().add(i).write_unaligned(acc) };
        }
    }
}

/// Every part's destination gets, per block `o` of `outer`, the parts' block `o` in
/// part order.
///
/// # Safety
///
/// As [`all_reduce_f32`], with the all-gather's verified lengths: each source is
/// `outer` blocks, each destination `parts.len()` times a source.
pub(crate) unsafe fn all_gather(outer: u64, parts: &[CollectivePart], bases: &Bases<'_>) {
    let Some(first) = parts.first() else { return };
    let outer = outer as usize;
    let block = first.src.length as usize / outer.max(1);
    let n = parts.len();
    for d in parts {
        let dst = bases.at(&d.dst);
        for (k, s) in parts.iter().enumerate() {
            let src = bases.at(&s.src);
            for o in 0..outer {
                // SAFETY: block `o` of the source and slot `(o, k)` of the destination
                // lie inside their verified ranges and do not overlap.
                unsafe { core::ptr::copy_nonoverlapping(src.add(o * block), dst.add((o * n + k) * block), block) };
            }
        }
    }
}
