//! `kiln bench --floor`: the machine's own spread for a call like the model's.
//!
//! On a shared machine a call's tail comes mostly from outside the program (timer
//! ticks, other tenants on the core, the shared caches and memory). To tell kiln's part
//! from the machine's, `--floor` follows every timed `invoke` with a piece of fixed work
//! shaped like it and times that too: the same number of calls, interleaved call by
//! call, so both see the same moments of the machine. The work reads a buffer as large as
//! the bytes one call walks (the constants, the arena, the inputs and outputs) and then
//! runs twelve independent multiply-add chains on 16 KiB that stay in L1 (a core's
//! arithmetic at full throughput, as a contraction kernel's) for the rest of the model's
//! median time. Its p99/median is what this machine gives any call of that length and
//! footprint.

use std::time::Instant;

/// Lanes of one accumulator: a 256-bit vector of f32.
const LANES: usize = 8;
/// Independent chains: enough to keep two FMA pipes busy through their latency.
const CHAINS: usize = 12;
/// Floats of the block the arithmetic reads (16 KiB, in L1).
const BLOCK: usize = 4096;

/// Fixed work: a read of `mem` and `passes` passes of arithmetic over an L1 block.
pub struct FixedWork {
    mem: Vec<f32>,
    block: Vec<f32>,
    passes: usize,
    /// Sums of every call, so that no call's work can be optimised away.
    sink: f32,
}

impl FixedWork {
    /// Work that reads `footprint` bytes and lasts about `ms` milliseconds.
    pub fn calibrated(footprint: usize, ms: f64) -> FixedWork {
        let mut w = FixedWork {
            mem: (0..footprint / 4).map(|i| (i % 1024) as f32 * 1e-3).collect(),
            block: (0..BLOCK).map(|i| (i % 97) as f32 * 1e-2).collect(),
            passes: 0,
            sink: 0.0,
        };
        // The read alone, then passes doubled until they take a quarter of `ms` more than
        // the read (so the read's own noise is small beside them): the cost of a pass.
        let read = w.best_of(5);
        if read >= ms {
            return w;
        }
        w.passes = 16;
        let mut t = w.best_of(3);
        while t - read < ms / 4.0 && w.passes < 1 << 30 {
            w.passes *= 2;
            t = w.best_of(3);
        }
        let pass = (t - read).max(f64::MIN_POSITIVE) / w.passes as f64;
        w.passes = ((ms - read) / pass).round().min((1u64 << 40) as f64) as usize;
        w
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
            self.sink += unsafe { work_avx2(&self.mem, &self.block, self.passes) };
            return;
        }
        self.sink += work(&self.mem, &self.block, self.passes);
    }

    /// The sum of every call's result (keeps the work observable).
    pub fn sink(&self) -> f32 {
        self.sink
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn work_avx2(mem: &[f32], block: &[f32], passes: usize) -> f32 {
    work(mem, block, passes)
}

/// Eight running sums over `mem` (the loads stream as a kernel's do), then `passes`
/// passes of `CHAINS` multiply-add chains over `block`.
#[inline(always)]
fn work(mem: &[f32], block: &[f32], passes: usize) -> f32 {
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
                    a[l] = a[l].mul_add(0.999_999_9, v[l]);
                }
            }
        }
    }
    sums.iter().chain(acc.iter()).flatten().sum()
}
