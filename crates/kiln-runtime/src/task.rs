//! The local-task driver: an entry point's commands replayed by a fixed pool of threads,
//! every dispatch's workgroups split statically between them.
//!
//! ```text
//! Instance::with_threads(&m, N)   N−1 worker threads start; per entry point a schedule:
//!                                 commands grouped into waves (see `schedule`)
//! invoke                          per wave: fill its binding tables, publish it, release
//!                                 the workers, run thread 0's share, meet at the wave's end
//!                                 (copies and fills run on the calling thread alone)
//! drop                            the workers stop and are joined
//! ```
//!
//! Thread `t` of `N` runs, of the wave's `j`-th dispatch over `W` workgroups, the range
//! `(t − j) mod N` of `0..W` cut into `N` contiguous, balanced ranges: a static share,
//! rotated per dispatch so that a wave of small dispatches spreads over the threads.
//! `invoke` allocates nothing, spawns nothing and decides nothing: the schedule, the
//! tables and the job list were all made when the instance was.
//!
//! A wave the compiler estimates too small to pay for the hand-off (see
//! [`worth_splitting`]) runs on the calling thread alone, as a one-workgroup wave does,
//! unless it reads enough of what a split wave just before it wrote: alone, the calling
//! thread would read the other threads' part of that from their cores' caches.
//!
//! A worker's share is cut into [`PARTS`] contiguous parts (fewer where a part would
//! hold under [`PART_WORKGROUPS`] workgroups of a dispatch), each *claimed* before it
//! runs, in order, by the worker or by the calling thread: once its own share is done,
//! the calling thread claims and runs every part that no worker has claimed yet, and
//! then waits only for the parts workers did claim. A worker that the system has not
//! scheduled (another process holds its core, the host of a virtual machine took it,
//! or it is still waking from a sleep) so costs the call at most the part it holds, not
//! the time until the system runs it again: on a loaded machine that wait was
//! milliseconds per wave. A claim is a compare-and-swap of the worker's claim word,
//! which holds the epoch of its wave and the next part; a worker that wakes late finds
//! the parts of a finished wave claimed and goes back to waiting.
//!
//! Threads wait for each other by polling a flag a bounded number of times, then
//! sleeping on a condition variable (a wave of a small model lasts microseconds, a sleep
//! and wake-up tens of them). Polling spins when every thread has a core of its own and
//! yields the core when there are more threads than cores ([`Patience`]).

use crate::error::RuntimeError;
use crate::instance::Bases;
use crate::module::LoadedModule;
use crate::KernelFn;
use alloc::string::ToString;
use alloc::vec::Vec;
use core::cell::UnsafeCell;
use core::ops::Range;
use kiln_module::abi::HelperFn;
use kiln_module::program::{Binding, BoundedRows, Command};
use kiln_module::sections::EntryView;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

/// Stack bytes of a worker: what a main thread usually gets (Linux's default 8 MiB),
/// so that a kernel that runs on the calling thread runs on a worker too (contraction
/// kernels pack blocks of B on the stack). Reserved, not touched: pages cost memory
/// only once used.
const WORKER_STACK: usize = 8 << 20;

/// How long a waiting thread polls its flag before it sleeps.
#[derive(Clone, Copy)]
struct Patience {
    /// Polls one `PAUSE` apart (≈ 27 ns on this project's Zen 3 machines).
    spins: u32,
    /// Then polls each after yielding the core (≈ 0.5 µs when nobody else wants it).
    yields: u32,
}

impl Patience {
    /// At most one thread per core: spin about 0.2 ms, longer than the gap between two
    /// waves or two back-to-back calls, then sleep. Yielding early was measured to cost
    /// lenet 3× on two threads of two cores.
    const OWN_CORES: Patience = Patience { spins: 1 << 13, yields: 0 };
    /// More threads than cores: a spinning thread would hold a core from the very
    /// thread it waits for until the scheduler preempts it (lenet took 2 ms instead of
    /// 0.03 on 3 threads of 2 cores); yielding at once hands the core over.
    const SHARED_CORES: Patience = Patience { spins: 1 << 4, yields: 1 << 13 };

    /// Polls `ready` until it holds (true) or the patience is spent (false).
    fn poll(self, ready: impl Fn() -> bool) -> bool {
        for i in 0..self.spins + self.yields {
            if ready() {
                return true;
            }
            if i < self.spins {
                core::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        false
    }
}

/// A value on a cache line of its own: the flag every waiting worker polls is not
/// the counter every finishing worker writes.
#[repr(align(128))]
struct Line<T>(T);

impl<T> core::ops::Deref for Line<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Workgroups `begin..end` of range `i` when `n` workgroups are cut into `parts`
/// contiguous ranges whose sizes differ by at most one (the first `n % parts` are the
/// larger).
pub(crate) fn split(n: u64, parts: u64, i: u64) -> (u64, u64) {
    let (base, rem) = (n / parts, n % parts);
    let begin = i * base + i.min(rem);
    (begin, begin + base + u64::from(i < rem))
}

/// The range thread `me` of `threads` runs of the `j`-th dispatch of a wave.
fn share(workgroups: u64, threads: u64, me: u64, j: u64) -> (u64, u64) {
    split(workgroups, threads, (me + threads - j % threads) % threads)
}

/// [`share`], or where the wave runs its dispatches whole ([`whole_dispatches`]): all of
/// the `j`-th dispatch on thread `j mod threads`, none of it on the others.
fn share_in(workgroups: u64, threads: u64, me: u64, j: u64, whole: bool) -> (u64, u64) {
    match whole {
        true if j % threads == me => (0, workgroups),
        true => (workgroups, workgroups),
        false => share(workgroups, threads, me, j),
    }
}

/// Whether a wave's dispatches run whole, one thread each (dispatch `j` on thread
/// `j mod threads`), rather than each split over every thread: where there are at
/// least as many dispatches as threads and the compiler's estimates (`work_ns`, none
/// 0) give no thread more than an eighth above an even share. Independent dispatches of
/// like size are what a wave of the steps of parallel recurrences holds (the two
/// directions of a bidirectional LSTM or GRU, each step's product over its own `R`),
/// and parallel branches: run whole, each thread makes one kernel call per dispatch
/// instead of one per part of every dispatch, reads one operand's bytes in one stream
/// rather than a slice of each, and each dispatch's small operands (a recurrence's
/// state) are read by one thread rather than by all of them.
pub(crate) fn whole_dispatches(work_ns: &[u64], threads: u64) -> bool {
    let n = work_ns.len() as u64;
    if threads < 2 || n < threads || work_ns.contains(&0) {
        return false;
    }
    let mut load = alloc::vec![0u64; threads as usize];
    for (j, &w) in work_ns.iter().enumerate() {
        load[j % threads as usize] = load[j % threads as usize].saturating_add(w);
    }
    let total: u64 = load.iter().fold(0u64, |a, &b| a.saturating_add(b));
    let most = load.iter().copied().max().unwrap_or(0);
    // most ≤ 9/8 · total / threads
    (most as u128) * 8 * (threads as u128) <= (total as u128) * 9
}

/// One dispatch of an entry point, resolved when the instance is made.
struct Planned<'m> {
    kernel: KernelFn,
    workgroups: u64,
    /// Bounded rows (format 1.7): the split along a bounded dimension, and that
    /// dimension's extent binding and bound, read per call.
    rows: Option<(BoundedRows, Binding, u64)>,
    /// The compiler's estimate of its single-thread time (0: none).
    work_ns: u64,
    bindings: &'m [Binding],
    /// Where its binding table starts in [`LocalTask::tables`].
    table: usize,
}

/// What splitting a wave over threads costs the calling thread, in nanoseconds, on
/// top of its own share: releasing the workers and meeting them at the end while they
/// spin, the other threads' first reads of operands that the calling thread's cache
/// holds, and the wait for the slowest share. Measured on two threads of this project's
/// machines: lenet's second convolution (about 5 µs of work, over 60 KB of columns
/// written by the calling thread) took 5.5 µs longer split than alone, while mlp's
/// second layer (about 6.5 µs, streaming 0.5 MB of weights) took 3.3 µs less.
pub(crate) const HANDOFF_NS: u64 = 3_000;

/// What the calling thread pays, per byte, to read an operand another thread has just
/// written (the line comes from that core's cache, not its own), in thousandths of a
/// nanosecond. Measured on two threads of this project's machines
/// (`kiln bench --profile`, real-time priority): crnn's paddings after its convolutions
/// (122 KB read, half of it written by the worker) took 13 µs on one thread, 40–44 µs
/// on the calling thread alone after a split convolution, and 24–26 µs split; its LSTM
/// gate waves (16 KB of products, one direction's written by the worker) 5.4 µs alone
/// and 3.5 split. About 0.5 ns a byte (32 ns a line).
pub(crate) const REMOTE_PS_PER_BYTE: u64 = 500;

/// Whether splitting a wave over `threads` threads saves the calling thread more than
/// the hand-off costs, from the compiler's estimate of each dispatch's single-thread
/// time (0: no estimate): the other threads take all but `1/threads` of the work, and
/// of `remote` bytes that the wave reads and the wave before it wrote split over every
/// thread, the calling thread alone would read all but `1/threads` from other cores'
/// caches (split, each thread mostly reads what it wrote: the same workgroups go to the
/// same thread). Without an estimate (a plan of format 1.0) every wave is split.
pub(crate) fn worth_splitting(work_ns: impl IntoIterator<Item = u64>, remote: u64, threads: u64) -> bool {
    let mut total = 0u64;
    for w in work_ns {
        if w == 0 {
            return true;
        }
        total = total.saturating_add(w);
    }
    let remote_ns = remote.saturating_mul(REMOTE_PS_PER_BYTE) / 1000;
    let saved = total.saturating_add(remote_ns);
    saved - saved / threads.max(1) >= HANDOFF_NS
}

/// Bytes that `wave`'s dispatches read (every binding but the last) of what `before`'s
/// dispatches wrote (their last bindings): an upper bound, counted per pair.
fn bytes_written_before(before: &[Planned<'_>], wave: &[Planned<'_>]) -> u64 {
    let mut n = 0u64;
    for w in before.iter().filter_map(|p| p.bindings.last()) {
        for r in wave.iter().flat_map(|p| &p.bindings[..p.bindings.len().saturating_sub(1)]) {
            if w.slot == r.slot {
                let lo = w.offset.max(r.offset);
                let hi = w.offset.saturating_add(w.length).min(r.offset.saturating_add(r.length));
                n = n.saturating_add(hi.saturating_sub(lo));
            }
        }
    }
    n
}

/// A step of an entry point's schedule.
enum Step<'m> {
    /// Dispatches that may run at the same time: `jobs` indexes [`Schedule::jobs`].
    /// `parallel` is false when thread 0's share is all the work there is (one dispatch
    /// of one workgroup), or when the compiler's estimate of the wave's work says that
    /// splitting it would not pay for the hand-off ([`worth_splitting`]): then the
    /// calling thread runs it alone and wakes nobody.
    /// `last`: the index in the entry's plan of the wave's last dispatch. `whole`: its
    /// dispatches run whole, one thread each ([`whole_dispatches`]).
    Wave { jobs: Range<usize>, parallel: bool, whole: bool, last: usize },
    /// A copy or fill, run on the calling thread; `at`: its index in the plan.
    Serial(&'m Command, usize),
    /// A `SkipIf`, evaluated on the calling thread between waves: when the condition
    /// equals `value`, execution goes on at step `to` (a later step: the first of the
    /// commands after the skipped ones).
    Skip { cond: &'m Binding, value: bool, to: usize },
}

/// An entry point's commands as the local-task driver runs them.
struct Schedule<'m> {
    steps: Vec<Step<'m>>,
    jobs: Vec<Planned<'m>>,
}

/// Whether two ranges share a byte (ends saturate: the verifier proved they do not
/// overflow, and a range that did would still compare as reaching the end).
fn overlaps(a: &Binding, b: &Binding) -> bool {
    let end = |x: &Binding| x.offset.saturating_add(x.length);
    a.slot == b.slot && a.offset < end(b) && b.offset < end(a)
}

/// Whether two dispatches may not run at the same time: one writes (its last binding)
/// bytes the other reads or writes.
fn conflict(a: &[Binding], b: &[Binding]) -> bool {
    let writes = |x: &[Binding], y: &[Binding]| x.last().is_some_and(|w| y.iter().any(|r| overlaps(w, r)));
    writes(a, b) || writes(b, a)
}

/// Groups an entry's commands into waves. A wave ends at every `Barrier` of the plan
/// and before every copy and fill (those keep their place in the command order), and
/// also before a dispatch that touches bytes another dispatch of the open wave writes:
/// the compiler never puts such a pair between two barriers, but a plan that did would
/// still run as written, never as a data race. Dispatches of no workgroups are left out.
/// A `SkipIf` ends the open wave too, and so does the command it skips to, so that a
/// skip always lands at the start of a step; and so does the end of the instantiation
/// prologue (format 1.9).
fn schedule<'m>(m: &'m LoadedModule<'m>, e: &'m EntryView<'m>, threads: u64) -> Schedule<'m> {
    let mut s = Schedule { steps: Vec::new(), jobs: Vec::new() };
    let n = e.commands.len();
    // Commands a skip lands on, and per command the step at which it starts.
    let mut target = alloc::vec![false; n + 1];
    for (i, c) in e.commands.iter().enumerate() {
        if let Command::SkipIf { count, .. } = c {
            // (Verified: i + 1 + count <= n.)
            if let Some(t) = target.get_mut((i + 1).saturating_add(*count as usize)) {
                *t = true;
            }
        }
    }
    let mut step_at = alloc::vec![0usize; n + 1];
    let mut open = 0;
    let mut table = 0;
    // The plan index of the last dispatch seen: the open wave's last when it closes.
    let mut last = 0;
    let close = |s: &mut Schedule<'m>, open: &mut usize, last: usize| {
        let jobs = *open..s.jobs.len();
        if !jobs.is_empty() {
            let wave = &s.jobs[jobs.clone()];
            let work: Vec<u64> = wave.iter().map(|p| p.work_ns).collect();
            let whole = whole_dispatches(&work, threads);
            // What the wave reads of the bytes the step before it wrote over several
            // threads (a wave split; not a copy, a skip, or a wave run alone).
            let remote = match s.steps.last() {
                Some(Step::Wave { jobs: before, parallel: true, .. }) => {
                    bytes_written_before(&s.jobs[before.clone()], wave)
                }
                _ => 0,
            };
            let parallel = (1..threads).any(|t| {
                wave.iter().enumerate().any(|(j, p)| {
                    let (b, e) = share_in(p.workgroups, threads, t, j as u64, whole);
                    b < e
                })
            }) && worth_splitting(work.iter().copied(), remote, threads);
            s.steps.push(Step::Wave { jobs, parallel, whole, last });
        }
        *open = s.jobs.len();
    };
    for (i, c) in e.commands.iter().enumerate() {
        // (The instantiation prologue ends a wave too: later calls start behind it.)
        if target[i] || (i > 0 && i == e.prologue as usize) {
            close(&mut s, &mut open, last);
        }
        step_at[i] = s.steps.len();
        match c {
            Command::Dispatch { kernel, workgroups, bindings, work_ns, .. } => {
                let recorded = *workgroups;
                let workgroups = m.workgroups(*kernel, recorded);
                if workgroups == 0 {
                    continue;
                }
                // (Only where this host's variant splits its workgroups as the plan says.)
                let rows = crate::instance::command_rows(&e.bounded_rows, i)
                    .filter(|_| workgroups == recorded)
                    .and_then(|r| e.bounded.get(r.dim as usize).map(|b| (*r, b.extent, b.bound)));
                if s.jobs[open..].iter().any(|p| conflict(p.bindings, bindings)) {
                    close(&mut s, &mut open, last);
                }
                last = i;
                // Verified: the kernel index is in range.
                s.jobs.push(Planned {
                    kernel: m.kernels[*kernel as usize],
                    workgroups,
                    rows,
                    work_ns: *work_ns,
                    bindings,
                    table,
                });
                table += bindings.len();
            }
            Command::Barrier => close(&mut s, &mut open, last),
            // Collectives, like copies, run on the calling thread between waves: they
            // are the points where the simulated devices meet.
            // (Segments and transfers: heterogeneous plans, which `hetero.rs` runs.)
            Command::Copy { .. }
            | Command::Fill { .. }
            | Command::AllReduce { .. }
            | Command::AllGather { .. }
            | Command::Segment { .. }
            | Command::Transfer { .. } => {
                close(&mut s, &mut open, last);
                s.steps.push(Step::Serial(c, i));
            }
            Command::SkipIf { cond, value, count } => {
                close(&mut s, &mut open, last);
                // `to` is a command index here, a step index below.
                let to = (i + 1).saturating_add(*count as usize).min(n);
                s.steps.push(Step::Skip { cond, value: *value, to });
            }
        }
    }
    close(&mut s, &mut open, last);
    step_at[n] = s.steps.len();
    for step in &mut s.steps {
        if let Step::Skip { to, .. } = step {
            *to = step_at[*to];
        }
    }
    s
}

/// A dispatch of the wave being run, as the threads read it.
#[derive(Clone, Copy)]
struct Job {
    kernel: KernelFn,
    table: *const *mut u8,
    /// This call's workgroups ([`crate::instance::active`]).
    workgroups: u64,
    rows: Option<(BoundedRows, u64)>,
}

/// The wave being run.
#[derive(Clone, Copy)]
struct Wave {
    jobs: *const Job,
    len: usize,
    helpers: *const HelperFn,
    /// Its dispatches run whole, one thread each ([`share_in`]).
    whole: bool,
}

/// Parts of a worker's share that are claimed one at a time (the calling thread's own
/// share is never claimed by another thread and runs whole).
pub(crate) const PARTS: u64 = 4;

/// The fewest workgroups of a dispatch a part holds (a share of fewer holds one part,
/// of fewer than `PARTS ×` this as many parts as it has twos): each part is a kernel
/// call, and what a kernel does once a call it does again for every part. Parts of one
/// workgroup made mobilenet_v2's channel-vector projections over 7×7 maps (each call
/// copies B, 188 KB, to the stack) slower on two threads the more workgroups they had:
/// five of two panels took 157 µs, ten of one 186 µs (`kiln bench --profile`).
pub(crate) const PART_WORKGROUPS: u64 = 2;

/// Workgroups `begin..end` of part `part` (of [`PARTS`]) of a share of `n` workgroups:
/// the share cut into `PARTS` contiguous ranges, or fewer where that would leave a
/// range under [`PART_WORKGROUPS`]; the parts past those are empty.
pub(crate) fn part_range(n: u64, part: u64) -> (u64, u64) {
    let parts = PARTS.min(n / PART_WORKGROUPS).max(1);
    if part >= parts {
        return (n, n);
    }
    split(n, parts, part)
}

/// Runs part `which` ([`part_range`]) of thread `me`'s share of every dispatch of
/// `wave`, or all of it (`None`).
///
/// # Safety
///
/// `wave` describes live jobs whose tables and kernels are valid as in
/// [`crate::Instance`]'s dispatch, and every part of every thread `0..threads` of this
/// wave runs once (the parts are disjoint and together cover each dispatch).
unsafe fn run_share(wave: Wave, me: u64, threads: u64, which: Option<u64>) {
    // SAFETY: `jobs` points to `len` initialised jobs that stay untouched while the
    // wave runs (the caller's contract).
    let jobs = unsafe { core::slice::from_raw_parts(wave.jobs, wave.len) };
    for (j, job) in jobs.iter().enumerate() {
        let (b, e) = share_in(job.workgroups, threads, me, j as u64, wave.whole);
        let (pb, pe) = which.map_or((0, e - b), |p| part_range(e - b, p));
        let (begin, end) = (b + pb, b + pe);
        if begin < end {
            // SAFETY: as the local-sync dispatch in `Instance::run`: the table holds one
            // pointer per binding into memory that lives while the calling thread waits
            // for this wave; by the kernel ABI any split of `0..workgroups` into
            // disjoint ranges run on different threads is valid, and dispatches of one
            // wave touch no bytes another of them writes (`schedule`).
            unsafe { crate::instance::run_range(job.kernel, job.table, wave.helpers, begin, end, job.rows) };
        }
    }
}

/// What the calling thread and the workers share.
struct Shared {
    threads: u64,
    patience: Patience,
    /// Written by the calling thread only while no worker runs a wave (every share of
    /// the last wave is done, and a share of the next can be claimed only once `epoch`
    /// says it is out); read by a worker after it claimed its share of the wave of the
    /// epoch it saw, before it decrements `pending`.
    wave: UnsafeCell<Wave>,
    /// Bumped (release) to start a wave, or to stop when `stop` is set. 64 bits: it
    /// never wraps, so an epoch a late worker saw is never taken for a current one.
    epoch: Line<AtomicU64>,
    /// Per thread (index 0 unused), `epoch << 8 | part`: the epoch of the last wave a
    /// part of that thread's share was claimed in, by the worker itself or by the
    /// calling thread, and the next part to claim; only ever increases.
    claims: Box<[Line<AtomicU64>]>,
    /// Worker shares of the current wave not yet done (and, while the pool starts,
    /// workers not yet running).
    pending: Line<AtomicU32>,
    stop: AtomicBool,
    /// A worker ended unexpectedly (a panic): the pool runs no further wave.
    lost: AtomicBool,
    /// Workers asleep (or about to sleep) on `wake`.
    sleepers: AtomicU32,
    /// The calling thread is asleep (or about to sleep) on `done`.
    caller_asleep: AtomicBool,
    lock: Mutex<()>,
    /// Workers wait here for a new epoch.
    wake: Condvar,
    /// The calling thread waits here for the last worker.
    done: Condvar,
}

// SAFETY: the only non-thread-safe parts are `wave` and the pointers in it. `wave` is
// written and read under the protocol documented on the field (the epoch's
// release/acquire orders the write before every read, `pending`'s before the next
// write), and the memory its pointers reach is used by the kernels as described in
// `run_share`.
unsafe impl Sync for Shared {}
// SAFETY: as above; nothing in `Shared` is tied to the thread that made it.
unsafe impl Send for Shared {}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, ()> {
        // The mutex guards no data: a poisoned one is as good as any.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims the next part of thread `t`'s share of the wave of epoch `e`: each part
    /// is returned to exactly one caller; `None` once every part is claimed or when
    /// `e` is a past wave's.
    fn claim(&self, t: usize, e: u64) -> Option<u64> {
        let word = &self.claims[t];
        let mut c = word.load(SeqCst);
        loop {
            let (epoch, next) = (c >> 8, c & 0xff);
            let part = match epoch.cmp(&e) {
                core::cmp::Ordering::Greater => return None,
                core::cmp::Ordering::Less => 0,
                core::cmp::Ordering::Equal if next < PARTS => next,
                core::cmp::Ordering::Equal => return None,
            };
            match word.compare_exchange_weak(c, e << 8 | (part + 1), SeqCst, SeqCst) {
                Ok(_) => return Some(part),
                Err(now) => c = now,
            }
        }
    }

    /// Waits until `epoch` differs from `seen`; returns it.
    fn next_epoch(&self, seen: u64) -> u64 {
        if self.patience.poll(|| self.epoch.load(Acquire) != seen) {
            return self.epoch.load(Acquire);
        }
        let mut g = self.lock();
        // Announce the sleep, then look again: a release either bumped `epoch` before
        // this look (seen here) or reads `sleepers` after the announcement and wakes us
        // under the lock (both are SeqCst, so one of the two happens).
        self.sleepers.fetch_add(1, SeqCst);
        loop {
            let e = self.epoch.load(SeqCst);
            if e != seen {
                self.sleepers.fetch_sub(1, SeqCst);
                return e;
            }
            g = self.wake.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Starts a new epoch and wakes the workers that sleep; returns the epoch.
    fn release(&self) -> u64 {
        let e = self.epoch.fetch_add(1, SeqCst) + 1;
        if self.sleepers.load(SeqCst) != 0 {
            let _g = self.lock();
            self.wake.notify_all();
        }
        e
    }

    /// A worker is done with the current wave.
    fn finished(&self) {
        if self.pending.fetch_sub(1, SeqCst) == 1 && self.caller_asleep.load(SeqCst) {
            let _g = self.lock();
            self.done.notify_one();
        }
    }

    /// The calling thread waits until every worker finished the wave (or one was lost).
    fn wait_done(&self) {
        if self.patience.poll(|| self.pending.load(Acquire) == 0) {
            return;
        }
        let mut g = self.lock();
        // The mirror of `next_epoch`: the last worker either decremented `pending`
        // before this look or sees `caller_asleep` and notifies under the lock.
        self.caller_asleep.store(true, SeqCst);
        while self.pending.load(SeqCst) != 0 && !self.lost.load(SeqCst) {
            g = self.done.wait(g).unwrap_or_else(PoisonError::into_inner);
        }
        self.caller_asleep.store(false, SeqCst);
    }
}

/// Marks the pool lost and wakes the calling thread if a worker unwinds.
struct LostGuard<'a>(&'a Shared);

impl Drop for LostGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.lost.store(true, SeqCst);
            let _g = self.0.lock();
            self.0.done.notify_all();
        }
    }
}

fn worker(shared: &Shared, me: u64) {
    let _guard = LostGuard(shared);
    // Started: whatever a new thread sets up (and allocates) is done by now.
    shared.finished();
    let mut seen = 0;
    loop {
        seen = shared.next_epoch(seen);
        if shared.stop.load(Acquire) {
            return;
        }
        // The parts of a wave that ended without this worker (the calling thread ran
        // them) are claimed already: then it waits for the next epoch.
        while let Some(part) = shared.claim(me as usize, seen) {
            // SAFETY: this worker claimed a part of the wave of epoch `seen`, so that
            // wave has not ended (it ends when every part is done) and the calling
            // thread, which wrote the wave before releasing the epoch (seen with
            // acquire), writes it again only after this part's `finished`.
            let wave = unsafe { *shared.wave.get() };
            // SAFETY: the calling thread published a live wave and waits for every
            // claimed part before it touches the jobs, the tables or the memory they
            // point to; each part runs once (claimed once; `me` is unique, 1..threads).
            unsafe { run_share(wave, me, shared.threads, Some(part)) };
            shared.finished();
        }
    }
}

/// The worker threads.
struct Pool {
    shared: Arc<Shared>,
    handles: Vec<JoinHandle<()>>,
}

impl Pool {
    fn start(threads: usize) -> Result<Pool, RuntimeError> {
        // Decided once, from the cores the system offers this process now.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let patience = if threads <= cores { Patience::OWN_CORES } else { Patience::SHARED_CORES };
        let shared = Arc::new(Shared {
            threads: threads as u64,
            patience,
            wave: UnsafeCell::new(Wave { jobs: core::ptr::null(), len: 0, helpers: core::ptr::null(), whole: false }),
            epoch: Line(AtomicU64::new(0)),
            claims: (0..threads).map(|_| Line(AtomicU64::new(0))).collect(),
            pending: Line(AtomicU32::new(0)),
            stop: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            sleepers: AtomicU32::new(0),
            caller_asleep: AtomicBool::new(false),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            done: Condvar::new(),
        });
        // Each worker reports once it runs (as at the end of a wave), so that its start,
        // and what a new thread allocates, happens here and not in the first call.
        shared.pending.store(threads as u32 - 1, Relaxed);
        // Dropped on an error part way: the workers started so far are stopped and joined.
        let mut pool = Pool { shared, handles: Vec::with_capacity(threads - 1) };
        // Workers allocate through the embedder's allocator where the instance does
        // (`crate::memory`).
        let allocator = crate::memory::current();
        for me in 1..threads {
            let s = Arc::clone(&pool.shared);
            let h = std::thread::Builder::new()
                .name(alloc::format!("kiln-worker-{me}"))
                .stack_size(WORKER_STACK)
                .spawn(move || {
                    let _scope = crate::memory::enter(allocator);
                    worker(&s, me as u64)
                })
                .map_err(|e| RuntimeError::Threads { threads, why: e.to_string() })?;
            pool.handles.push(h);
        }
        pool.shared.wait_done();
        Ok(pool)
    }

    /// Runs `jobs` on every thread; returns once all are done.
    ///
    /// # Safety
    ///
    /// As [`run_share`]'s `wave`: the jobs are valid dispatches of a checked invocation
    /// that may run at the same time.
    unsafe fn run(&self, jobs: &[Job], helpers: *const HelperFn, whole: bool) -> Result<(), RuntimeError> {
        let s = &*self.shared;
        if s.lost.load(Acquire) {
            return Err(RuntimeError::WorkerLost);
        }
        let wave = Wave { jobs: jobs.as_ptr(), len: jobs.len(), helpers, whole };
        // SAFETY: no worker runs a wave: each finished the last one (the calling thread
        // saw `pending` at zero) and none can see a new epoch before `release` below.
        unsafe { *s.wave.get() = wave };
        s.pending.store(self.handles.len() as u32 * PARTS as u32, Relaxed);
        let e = s.release();
        // SAFETY: the caller's contract; thread 0 is the calling thread.
        unsafe { run_share(wave, 0, s.threads, None) };
        // The parts no worker has claimed yet: run here rather than wait for a worker
        // the system may not schedule for a while.
        for t in 1..s.threads {
            while let Some(part) = s.claim(t as usize, e) {
                // SAFETY: as above; this part of thread `t`'s share was claimed here, so
                // no worker runs it.
                unsafe { run_share(wave, t, s.threads, Some(part)) };
                s.pending.fetch_sub(1, SeqCst);
            }
        }
        s.wait_done();
        if s.lost.load(Acquire) {
            return Err(RuntimeError::WorkerLost);
        }
        Ok(())
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, SeqCst);
        self.shared.epoch.fetch_add(1, SeqCst);
        {
            let _g = self.shared.lock();
            self.shared.wake.notify_all();
        }
        for h in self.handles.drain(..) {
            // A worker that panicked has already said so on stderr; nothing to add.
            let _ = h.join();
        }
    }
}

/// The local-task driver of one instance: its pool, the schedule of every entry point,
/// a binding table for every dispatch, and room for the largest wave's job list.
pub(crate) struct LocalTask<'m> {
    pool: Pool,
    schedules: Vec<Schedule<'m>>,
    tables: Vec<*mut u8>,
    jobs: Vec<Job>,
}

impl<'m> LocalTask<'m> {
    /// Starts `threads − 1` workers (`threads` ≥ 2) and plans every entry point of `m`.
    pub(crate) fn new(m: &'m LoadedModule<'m>, threads: usize) -> Result<LocalTask<'m>, RuntimeError> {
        let n = threads as u64;
        let schedules: Vec<Schedule<'m>> = m.verified.program.entries.iter().map(|e| schedule(m, e, n)).collect();
        let tables = schedules.iter().map(|s| s.jobs.iter().map(|p| p.bindings.len()).sum()).max().unwrap_or(0);
        let widest = schedules
            .iter()
            .flat_map(|s| &s.steps)
            .map(|st| match st {
                Step::Wave { jobs, .. } => jobs.len(),
                Step::Serial(..) | Step::Skip { .. } => 0,
            })
            .max()
            .unwrap_or(0);
        Ok(LocalTask {
            pool: Pool::start(threads)?,
            schedules,
            tables: alloc::vec![core::ptr::null_mut(); tables],
            jobs: Vec::with_capacity(widest),
        })
    }

    /// Threads, the calling one included.
    pub(crate) fn threads(&self) -> usize {
        self.pool.handles.len() + 1
    }

    /// Runs the steps of entry `index` that lie in commands `range` (a plan, the part
    /// of it after its instantiation prologue or the prologue itself, or a heterogeneous
    /// plan's host segment, whose waves the schedule closed at their ends): its waves on
    /// the pool, its copies and fills; a heterogeneous plan's transfers are the caller's.
    ///
    /// `observe`, when given, is called on the calling thread after each wave (with
    /// the plan index of its last dispatch) and after each copy or fill: a profiler of
    /// several threads reads its clock there.
    ///
    /// # Safety
    ///
    /// `bases` are those of a checked invocation of entry `index` of the module this
    /// driver was made for (as in `Instance::run`), live and not otherwise referenced
    /// until this returns; the commands before `range` that it depends on have
    /// completed.
    pub(crate) unsafe fn run_range(
        &mut self,
        index: usize,
        range: Range<usize>,
        bases: &Bases<'_>,
        helpers: *const HelperFn,
        mut observe: Option<&mut dyn FnMut(usize)>,
    ) -> Result<(), RuntimeError> {
        let Some(s) = self.schedules.get(index) else {
            return Err(RuntimeError::NoSuchEntry { entry: alloc::format!("#{index}") });
        };
        // The plan index a step stands at (a skip: none; heterogeneous plans have none).
        let at = |step: &Step<'_>| match step {
            Step::Wave { last, .. } => *last,
            Step::Serial(_, at) => *at,
            Step::Skip { .. } => usize::MAX,
        };
        // Steps are in plan order: the range's are contiguous.
        let mut k = s.steps.partition_point(|st| at(st) < range.start);
        while let Some(step) = s.steps.get(k) {
            // (A skip, in a plan's part after its prologue, stands at no index.)
            if at(step) != usize::MAX && at(step) >= range.end {
                break;
            }
            k += 1;
            match step {
                Step::Skip { cond, value, to } => {
                    // SAFETY: the caller's contract; no wave is running, so every command
                    // before this one has completed.
                    if unsafe { crate::instance::condition(cond, bases) } == *value {
                        k = *to;
                    }
                }
                Step::Wave { jobs, parallel, whole, last } => {
                    let wave = &s.jobs[jobs.clone()];
                    for p in wave {
                        for (slot, b) in self.tables[p.table..p.table + p.bindings.len()].iter_mut().zip(p.bindings) {
                            *slot = bases.at(b);
                        }
                    }
                    // Taken after the last write: the jobs' table pointers stay valid
                    // until the next wave writes the tables again.
                    let tables = self.tables.as_ptr();
                    self.jobs.clear();
                    for p in wave {
                        // Within the capacity reserved for the widest wave: no allocation.
                        let table = tables.wrapping_add(p.table);
                        // SAFETY: the caller's contract: the bounded inputs are staged.
                        let rows = p
                            .rows
                            .map(|(r, x, bound)| (r, unsafe { crate::instance::staged_extent(&x, bound, bases) }));
                        let workgroups = crate::instance::active(p.workgroups, rows);
                        self.jobs.push(Job { kernel: p.kernel, table, workgroups, rows });
                    }
                    if *parallel {
                        // SAFETY: the jobs are this entry's dispatches of one wave, with
                        // tables filled from `bases` (the caller's contract), which stay
                        // untouched until `run` returns.
                        unsafe { self.pool.run(&self.jobs, helpers, *whole)? };
                    } else {
                        for job in &self.jobs {
                            // SAFETY: as the local-sync dispatch in `Instance::run`.
                            unsafe {
                                crate::instance::run_range(job.kernel, job.table, helpers, 0, job.workgroups, job.rows)
                            };
                        }
                    }
                    if let Some(after) = observe.as_mut() {
                        after(*last);
                    }
                }
                Step::Serial(c, at) => {
                    // SAFETY: the caller's contract; no wave is running.
                    unsafe { crate::instance::transfer(c, bases) };
                    if let Some(after) = observe.as_mut() {
                        after(*at);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_module::program::Slot;

    #[test]
    fn ranges_cover_once_and_balance() {
        for n in [0u64, 1, 2, 3, 5, 7, 64, 1001] {
            for parts in 1..=9u64 {
                let ranges: Vec<(u64, u64)> = (0..parts).map(|i| split(n, parts, i)).collect();
                assert_eq!(ranges[0].0, 0);
                assert_eq!(ranges[parts as usize - 1].1, n);
                for w in ranges.windows(2) {
                    assert_eq!(w[0].1, w[1].0, "contiguous: n {n}, parts {parts}");
                }
                let sizes: Vec<u64> = ranges.iter().map(|(b, e)| e - b).collect();
                let (lo, hi) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
                assert!(hi - lo <= 1, "balanced: n {n}, parts {parts}: {sizes:?}");
                // Every thread takes exactly one range of each dispatch, whatever its place.
                for j in 0..5 {
                    let mut taken: Vec<(u64, u64)> = (0..parts).map(|t| share(n, parts, t, j)).collect();
                    taken.sort();
                    let mut all = ranges.clone();
                    all.sort();
                    assert_eq!(taken, all);
                }
            }
        }
        // Thread 0 takes the first range of a wave's first dispatch; the next dispatch's
        // first range goes to thread 1.
        assert_eq!(share(10, 4, 0, 0), (0, 3));
        assert_eq!(share(10, 4, 1, 1), (0, 3));
        assert_eq!(share(1, 4, 2, 2), (0, 1));
        assert_eq!(share(1, 4, 0, 2), (1, 1));
    }

    #[test]
    fn whole_dispatches_go_one_thread_each_when_even() {
        // Two directions' like products on two threads: one each; on three threads, or
        // one dispatch, or without an estimate, split as before.
        assert!(whole_dispatches(&[53_000, 53_000], 2));
        assert!(!whole_dispatches(&[53_000, 53_000], 3));
        assert!(!whole_dispatches(&[53_000], 2));
        assert!(!whole_dispatches(&[53_000, 0], 2));
        assert!(!whole_dispatches(&[53_000, 53_000], 1));
        // Uneven: 3 : 1 is far from 2 : 2; 9 : 8 is within an eighth of 8.5 : 8.5.
        assert!(!whole_dispatches(&[30, 10], 2));
        assert!(whole_dispatches(&[9, 8], 2));
        assert!(!whole_dispatches(&[10, 10, 10], 2));
        assert!(whole_dispatches(&[10, 10, 10, 10], 2));
        // Every workgroup of each dispatch runs once, on thread `j mod threads`.
        for j in 0..4u64 {
            for me in 0..2u64 {
                let (b, e) = share_in(8, 2, me, j, true);
                assert_eq!(e - b, if j % 2 == me { 8 } else { 0 });
            }
        }
        assert_eq!(share_in(8, 2, 1, 0, false), share(8, 2, 1, 0));
    }

    #[test]
    fn each_part_is_claimed_once_and_late_claims_fail() {
        let pool = Pool::start(3).expect("pool");
        let s = &*pool.shared;
        // The parts of thread 2's share of epoch 7 go out once each, in order.
        let parts: Vec<u64> = core::iter::from_fn(|| s.claim(2, 7)).collect();
        assert_eq!(parts, (0..PARTS).collect::<Vec<_>>());
        assert_eq!(s.claim(2, 7), None);
        // A worker that saw epoch 5 and wakes after wave 7 finds nothing to run.
        assert_eq!(s.claim(2, 5), None);
        // The next wave starts at part 0 again; other threads' words are their own.
        assert_eq!(s.claim(2, 8), Some(0));
        assert_eq!(s.claim(1, 5), Some(0));
        assert_eq!(s.claim(1, 4), None);
        // Many threads racing for the parts of one share: each part goes to exactly one.
        let won = Mutex::new(Vec::new());
        std::thread::scope(|sc| {
            for _ in 0..8 {
                sc.spawn(|| {
                    while let Some(p) = s.claim(1, 100) {
                        won.lock().unwrap().push(p);
                    }
                });
            }
        });
        let mut won = won.into_inner().unwrap();
        won.sort();
        assert_eq!(won, (0..PARTS).collect::<Vec<_>>());
        drop(pool);
    }

    #[test]
    fn parts_cover_each_share_once() {
        // Parts of a share are contiguous and together exactly the share.
        for n in [0u64, 1, 3, 5, 17, 1001] {
            for threads in 1..=4u64 {
                for me in 0..threads {
                    let (b, e) = share(n, threads, me, 1);
                    let mut at = b;
                    for p in 0..PARTS {
                        let (pb, pe) = part_range(e - b, p);
                        assert_eq!(b + pb, at);
                        if pe > pb {
                            assert!(pe - pb >= PART_WORKGROUPS.min(e - b), "a part of {} of {}", pe - pb, e - b);
                        }
                        at = b + pe;
                    }
                    assert_eq!(at, e);
                }
            }
        }
    }

    #[test]
    fn waves_split_only_when_the_others_share_pays_for_the_handoff() {
        // Two threads: the other takes half; four: three quarters.
        assert!(!worth_splitting([5_000], 0, 2), "lenet's second convolution: 2.5 µs handed over");
        assert!(worth_splitting([6_000], 0, 2));
        assert!(!worth_splitting([5_998], 0, 2));
        assert!(worth_splitting([4_000], 0, 4));
        assert!(!worth_splitting([3_998], 0, 4));
        // A wave's dispatches count together.
        assert!(worth_splitting([2_000, 2_000, 2_000], 0, 2));
        // Bytes the split wave before wrote count at 0.5 ns each: crnn's paddings (3.4 µs
        // estimated, 122 KB of a split convolution's output) split; an LSTM gate wave
        // (1.6 µs, 16 KB of products) splits; 1 KB does not tip a 1 µs wave.
        assert!(!worth_splitting([3_400], 0, 2));
        assert!(worth_splitting([3_400], 122_880, 2));
        assert!(worth_splitting([800, 800], 16_384, 2));
        assert!(!worth_splitting([1_000], 1_024, 2));
        // No estimate (a format 1.0 plan) anywhere in the wave: split, as before estimates.
        assert!(worth_splitting([0], 0, 2));
        assert!(worth_splitting([10, 0], 0, 2));
        // No overflow.
        assert!(worth_splitting([u64::MAX, u64::MAX], u64::MAX, 2));
        assert!(!worth_splitting([], 0, 2));
    }

    #[test]
    fn bytes_written_before_are_the_overlaps_of_writes_and_reads() {
        unsafe extern "C" fn noop(_: *const *mut u8, _: *const HelperFn, _: u64, _: u64) {}
        let plan = |bindings: &'static [Binding]| Planned {
            kernel: noop,
            workgroups: 1,
            rows: None,
            work_ns: 1,
            bindings,
            table: 0,
        };
        static CONV: [Binding; 2] = [
            Binding { slot: Slot::Arena, offset: 0, length: 64 },
            Binding { slot: Slot::Arena, offset: 1000, length: 500 },
        ];
        static PAD: [Binding; 2] = [
            Binding { slot: Slot::Arena, offset: 1100, length: 1000 },
            Binding { slot: Slot::Arena, offset: 0, length: 900 },
        ];
        static OTHER: [Binding; 2] = [
            Binding { slot: Slot::Input(0), offset: 1000, length: 500 },
            Binding { slot: Slot::Arena, offset: 4000, length: 8 },
        ];
        // The pad reads 400 of the 500 bytes the convolution wrote; its own output, which
        // overlaps the convolution's input, is not a read; another slot is not the arena.
        assert_eq!(bytes_written_before(&[plan(&CONV)], &[plan(&PAD)]), 400);
        assert_eq!(bytes_written_before(&[plan(&CONV)], &[plan(&OTHER)]), 0);
        assert_eq!(bytes_written_before(&[plan(&CONV), plan(&CONV)], &[plan(&PAD), plan(&OTHER)]), 800);
        assert_eq!(bytes_written_before(&[], &[plan(&PAD)]), 0);
    }

    #[test]
    fn conflicts_are_writes_that_meet() {
        let b = |slot, offset, length| Binding { slot, offset, length };
        let x = [b(Slot::Input(0), 0, 16), b(Slot::Arena, 0, 16)];
        let reads_x = [b(Slot::Arena, 12, 4), b(Slot::Arena, 64, 16)];
        let beside = [b(Slot::Input(0), 0, 16), b(Slot::Arena, 16, 16)];
        let other_slot = [b(Slot::Arena, 0, 4), b(Slot::Output(0), 0, 16)];
        assert!(conflict(&x, &reads_x) && conflict(&reads_x, &x));
        assert!(!conflict(&x, &beside), "adjacent ranges and shared inputs do not conflict");
        assert!(conflict(&x, &other_slot), "other_slot reads what x writes");
        assert!(!conflict(&beside, &[b(Slot::Output(0), 16, 16)]));
        assert!(!conflict(&[], &x));
        // Ends that would overflow u64 saturate instead of panicking (a verified plan
        // has none; the comparison stays right for the ranges it does have).
        let top = [b(Slot::Arena, u64::MAX - 1, 4)];
        assert!(conflict(&top, &[b(Slot::Arena, u64::MAX - 2, 2)]));
        assert!(!conflict(&top, &[b(Slot::Arena, 0, u64::MAX - 1)]));
        assert!(conflict(&[b(Slot::Arena, u64::MAX - 1, u64::MAX)], &top));
    }
}
