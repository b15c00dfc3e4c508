//! `kiln bench --floor`: the machine's own spread for a call like the model's.
//!
//! On a shared machine a call's tail comes mostly from outside the program (timer
//! ticks, other tenants on the core, the shared caches and memory). To tell kiln's part
//! from the machine's, `--floor` follows every timed `invoke` with a piece of fixed work
//! shaped like it and times that too: the same number of calls, interleaved call by
//! call, so both see the same moments of the machine. The work reads a buffer as large
//! as the bytes one call walks (the constants, the arena, the inputs and outputs) and
//! then runs twelve independent multiply-add chains on 16 KiB that stay in L1 (a core's
//! arithmetic at full throughput, as a contraction kernel's) for the rest of the call's
//! median time. Its p99/median is what this machine gives any call of that length and
//! footprint.
//!
//! The number of arithmetic passes is tuned against the calls themselves, interleaved
//! as they will be timed (the read then follows an `invoke` that evicted its buffer), or
//! given (`--floor-passes`), so that several runs time the same work. Where the read
//! alone outlasts the call (a model bound by memory bandwidth), the work is the read.

use std::time::Instant;

use crate::artifact::Stats;

/// Lanes of one accumulator: a 256-bit vector of f32.
const LANES: usize = 8;
/// Independent chains: enough to keep two FMA pipes busy through their latency.
const CHAINS: usize = 12;
/// Floats of the block the arithmetic reads (16 KiB, in L1).
const BLOCK: usize = 4096;
/// The most passes tuning may ask for (about a minute of arithmetic).
const MOST_PASSES: usize = 1 << 24;

/// Fixed work: a read of `mem` and `passes` passes of arithmetic over an L1 block.
pub struct FixedWork {
    mem: Vec<f32>,
    block: Vec<f32>,
    passes: usize,
}

impl FixedWork {
    /// Work that reads `footprint` bytes and runs `passes` passes of arithmetic.
    pub fn new(footprint: usize, passes: usize) -> FixedWork {
        FixedWork {
            mem: (0..footprint / 4).map(|i| (i % 1024) as f32 * 1e-3).collect(),
            block: (0..BLOCK).map(|i| (i % 97) as f32 * 1e-2).collect(),
            passes: passes.min(MOST_PASSES),
        }
    }

    /// Passes of arithmetic per call.
    pub fn passes(&self) -> usize {
        self.passes
    }

    /// Sets the passes so that the work, timed right after `call` as it will be, takes
    /// as long as `call` (medians of `rounds` interleaved pairs, three corrections).
    pub fn tune(&mut self, rounds: usize, mut call: impl FnMut() -> Result<f64, String>) -> Result<(), String> {
        // The cost of a pass, from the read alone and passes doubled until they take
        // well over the read's own noise.
        self.passes = 0;
        let read = self.best_of(3);
        self.passes = 16;
        let mut t = self.best_of(3);
        while t - read < (0.25 * read).max(0.05) && self.passes < MOST_PASSES {
            self.passes *= 2;
            t = self.best_of(3);
        }
        let pass = (t - read).max(1e-9) / self.passes as f64;
        for _ in 0..3 {
            let (mut kiln, mut fixed) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
            for _ in 0..rounds.max(1) {
                kiln.push(call()?);
                fixed.push(self.time());
            }
            let (k, f) = (Stats::of(&mut kiln).median, Stats::of(&mut fixed).median);
            let passes = self.passes as f64 + (k - f) / pass;
            self.passes = if passes.is_finite() { passes.clamp(0.0, MOST_PASSES as f64).round() as usize } else { 0 };
        }
        Ok(())
    }

    /// One call's time, in milliseconds.
    pub fn time(&mut self) -> f64 {
        let t = Instant::now();
        self.run();
        t.elapsed().as_secs_f64() * 1e3
    }

    fn best_of(&mut self, n: usize) -> f64 {
        (0..n).map(|_| self.time()).fold(f64::INFINITY, f64::min)
    }

    fn run(&mut self) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            std::hint::black_box(unsafe { work_avx2(&self.mem, &self.block, self.passes) });
            return;
        }
        std::hint::black_box(work_plain(&self.mem, &self.block, self.passes));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn work_avx2(mem: &[f32], block: &[f32], passes: usize) -> f32 {
    work(mem, block, passes, |a, v| a.mul_add(0.999_999_9, v))
}

/// Without FMA instructions `mul_add` would be a library call per lane: a multiply and
/// an add instead.
fn work_plain(mem: &[f32], block: &[f32], passes: usize) -> f32 {
    work(mem, block, passes, |a, v| a * 0.999_999_9 + v)
}

/// Eight running sums over `mem` (the loads stream as a kernel's do), then `passes`
/// passes of `CHAINS` multiply-add chains (`step`) over `block`.
#[inline(always)]
fn work(mem: &[f32], block: &[f32], passes: usize, step: impl Fn(f32, f32) -> f32) -> f32 {
    let mut sums = [[0f32; LANES]; 8];
    for chunk in mem.chunks_exact(8 * LANES) {
        for (s, v) in sums.iter_mut().zip(chunk.chunks_exact(LANES)) {
            for l in 0..LANES {
                s[l] += v[l];
            }
        }
    }
    let mut acc = [[1f32; LANES]; CHAINS];
    for _ in 0..passes {
        for v in block.chunks_exact(LANES) {
            for a in acc.iter_mut() {
                for l in 0..LANES {
                    a[l] = step(a[l], v[l]);
                }
            }
        }
    }
    sums.iter().chain(acc.iter()).flatten().sum()
}
