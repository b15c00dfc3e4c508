//! Arena planning: one offset per buffer in a single arena, so that buffers whose
//! lifetimes overlap never overlap in memory.
//!
//! Algorithm: buffers are placed largest first (ties: longer lifetime first, then
//! index); each goes to the lowest aligned offset where it fits between the
//! buffers already placed that are alive at the same time (best fit among the gaps
//! for equal offsets is implied by scanning gaps in address order). This is the
//! greedy-by-size heuristic; the result is reported beside the lower bound of any
//! plan, the largest total size of buffers alive at one step.

/// One buffer to place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffer {
    /// Size in bytes.
    pub size: u64,
    /// Required alignment of its offset (a power of two).
    pub align: u64,
    /// First step at which it is alive (written).
    pub first: usize,
    /// Last step at which it is alive (read), inclusive.
    pub last: usize,
}

impl Buffer {
    fn overlaps_in_time(&self, o: &Buffer) -> bool {
        self.first <= o.last && o.first <= self.last
    }
}

/// The plan: an offset per buffer and the arena's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaPlan {
    /// Offset of each buffer, in input order.
    pub offsets: Vec<u64>,
    /// Bytes the arena needs.
    pub size: u64,
    /// The largest total size of buffers alive at one step (no plan can be smaller
    /// than this, ignoring alignment).
    pub lower_bound: u64,
}

/// Why a plan cannot be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ArenaError {
    /// Alignment is not a power of two.
    BadAlignment {
        /// The buffer.
        buffer: usize,
        /// Its alignment.
        align: u64,
    },
    /// A lifetime ends before it starts.
    BadLifetime {
        /// The buffer.
        buffer: usize,
    },
    /// Offsets overflow 64 bits.
    Overflow,
}

impl core::fmt::Display for ArenaError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ArenaError::BadAlignment { buffer, align } => {
                write!(f, "buffer {buffer}: alignment {align} is not a power of two")
            }
            ArenaError::BadLifetime { buffer } => write!(f, "buffer {buffer}: lifetime ends before it starts"),
            ArenaError::Overflow => f.write_str("arena size overflows 64 bits"),
        }
    }
}

/// The largest total size of buffers alive at one step.
pub fn lower_bound(buffers: &[Buffer]) -> u64 {
    let mut events: Vec<(usize, bool, u64)> = Vec::with_capacity(buffers.len() * 2);
    for b in buffers {
        events.push((b.first, true, b.size));
        events.push((b.last + 1, false, b.size));
    }
    // At equal steps, ends (false) come before starts (true).
    events.sort_unstable_by_key(|&(t, start, _)| (t, start));
    let (mut live, mut best) = (0u64, 0u64);
    for (_, start, size) in events {
        if start {
            live = live.saturating_add(size);
            best = best.max(live);
        } else {
            live -= size;
        }
    }
    best
}

/// Places every buffer.
pub fn plan(buffers: &[Buffer]) -> Result<ArenaPlan, ArenaError> {
    for (i, b) in buffers.iter().enumerate() {
        if !b.align.is_power_of_two() {
            return Err(ArenaError::BadAlignment { buffer: i, align: b.align });
        }
        if b.last < b.first {
            return Err(ArenaError::BadLifetime { buffer: i });
        }
    }
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| {
        let b = &buffers[i];
        (std::cmp::Reverse(b.size), std::cmp::Reverse(b.last - b.first), i)
    });
    let mut offsets = vec![0u64; buffers.len()];
    let mut placed: Vec<usize> = Vec::with_capacity(buffers.len());
    let mut size = 0u64;
    for &i in &order {
        let b = &buffers[i];
        // Intervals [offset, offset+size) of placed buffers alive at the same time.
        let mut busy: Vec<(u64, u64)> = placed
            .iter()
            .filter(|&&j| buffers[j].overlaps_in_time(b) && buffers[j].size > 0)
            .map(|&j| (offsets[j], offsets[j] + buffers[j].size))
            .collect();
        busy.sort_unstable();
        let align_up = |x: u64| -> Result<u64, ArenaError> {
            x.checked_add(b.align - 1).map(|v| v & !(b.align - 1)).ok_or(ArenaError::Overflow)
        };
        let mut candidate = 0u64;
        for &(start, end) in &busy {
            if candidate.checked_add(b.size).ok_or(ArenaError::Overflow)? <= start {
                break;
            }
            candidate = candidate.max(align_up(end)?);
        }
        offsets[i] = candidate;
        size = size.max(candidate.checked_add(b.size).ok_or(ArenaError::Overflow)?);
        placed.push(i);
    }
    Ok(ArenaPlan { offsets, size, lower_bound: lower_bound(buffers) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buf(size: u64, first: usize, last: usize) -> Buffer {
        Buffer { size, align: 64, first, last }
    }

    /// No two buffers alive at the same time share a byte; offsets are aligned.
    fn check(buffers: &[Buffer], p: &ArenaPlan) {
        for (i, a) in buffers.iter().enumerate() {
            assert_eq!(p.offsets[i] % a.align, 0);
            assert!(p.offsets[i] + a.size <= p.size);
            for (j, b) in buffers.iter().enumerate().skip(i + 1) {
                if a.overlaps_in_time(b) && a.size > 0 && b.size > 0 {
                    let (x0, x1) = (p.offsets[i], p.offsets[i] + a.size);
                    let (y0, y1) = (p.offsets[j], p.offsets[j] + b.size);
                    assert!(x1 <= y0 || y1 <= x0, "buffers {i} and {j} collide");
                }
            }
        }
        assert!(p.size >= p.lower_bound);
    }

    #[test]
    fn chain_reuses_memory() {
        // A chain a → b → c → d: each buffer lives two steps; two at a time.
        let bufs = [buf(1024, 0, 1), buf(1024, 1, 2), buf(1024, 2, 3), buf(1024, 3, 4)];
        let p = plan(&bufs).unwrap();
        check(&bufs, &p);
        assert_eq!(p.lower_bound, 2048);
        assert_eq!(p.size, 2048);
    }

    #[test]
    fn disjoint_lifetimes_share_offset_zero() {
        let bufs = [buf(100, 0, 0), buf(200, 1, 1), buf(50, 2, 2)];
        let p = plan(&bufs).unwrap();
        check(&bufs, &p);
        assert_eq!(p.offsets, vec![0, 0, 0]);
        assert_eq!(p.size, 200);
    }

    #[test]
    fn alignment_and_errors() {
        let bufs = [Buffer { size: 3, align: 1, first: 0, last: 1 }, Buffer { size: 8, align: 64, first: 0, last: 1 }];
        let p = plan(&bufs).unwrap();
        check(&bufs, &p);
        // The larger (8-byte, 64-aligned) buffer goes first at 0, the 3-byte one after it.
        assert_eq!(p.offsets, vec![8, 0]);
        assert_eq!(p.size, 11);
        assert_eq!(
            plan(&[Buffer { size: 1, align: 3, first: 0, last: 0 }]),
            Err(ArenaError::BadAlignment { buffer: 0, align: 3 })
        );
        assert_eq!(
            plan(&[Buffer { size: 1, align: 1, first: 2, last: 1 }]),
            Err(ArenaError::BadLifetime { buffer: 0 })
        );
        assert_eq!(
            plan(&[
                Buffer { size: u64::MAX, align: 1, first: 0, last: 0 },
                Buffer { size: 2, align: 1, first: 0, last: 0 }
            ]),
            Err(ArenaError::Overflow)
        );
    }

    #[test]
    fn random_instances_are_valid_and_near_the_bound() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let (mut total, mut bound) = (0u64, 0u64);
        for _ in 0..200 {
            let n = 1 + next(40) as usize;
            let bufs: Vec<Buffer> = (0..n)
                .map(|_| {
                    let first = next(30) as usize;
                    Buffer { size: 1 + next(1 << 16), align: 1 << next(7), first, last: first + next(6) as usize }
                })
                .collect();
            let p = plan(&bufs).unwrap();
            check(&bufs, &p);
            total += p.size;
            bound += p.lower_bound;
        }
        // Greedy-by-size stays within a quarter of the bound on such instances.
        assert!(total as f64 <= bound as f64 * 1.25, "plans {total} vs bound {bound}");
    }
}
