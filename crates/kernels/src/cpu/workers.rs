//! Keeping rayon's workers looking for work between kernels while the program asks for it, one parallel loop shared
//! by every core through a published pointer, and chunks of a range (or of an output's rows) claimed by the cores
//! as they come free.

use rayon::prelude::*;
use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Live [`KeepWorkersAwake`] guards: the kernels keep idle workers looking for work only while there is one.
static GUARDS: AtomicUsize = AtomicUsize::new(0);

/// Looking loops spawned so far (read by the tests).
static LOOPS_SPAWNED: AtomicUsize = AtomicUsize::new(0);

/// While one lives, the CPU kernels keep rayon's other workers looking for work between kernels, yielding their
/// core between looks, until none has come for [`AWAKE`], instead of falling asleep a few microseconds after their
/// last job: the next kernel's parallel loop then starts on every core without a thread wake-up (~0.1 ms, against
/// kernels of 0.2–1 ms when training a small model or decoding one token). The price is cores spinning between
/// kernels, so it is the program's choice: the `ember` binary holds one for its whole command; without one (a
/// library's caller, the tests) the kernels leave rayon's workers to sleep as usual.
#[must_use = "the workers are kept awake only while the guard lives"]
pub struct KeepWorkersAwake {
    _private: (),
}

impl KeepWorkersAwake {
    pub fn new() -> Self {
        GUARDS.fetch_add(1, Ordering::Relaxed);
        Self { _private: () }
    }
}

impl Default for KeepWorkersAwake {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for KeepWorkersAwake {
    fn drop(&mut self) {
        GUARDS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A [`KeepWorkersAwake`] guard: rayon's workers are kept looking for work between CPU kernels until it is dropped.
pub fn keep_workers_awake() -> KeepWorkersAwake {
    KeepWorkersAwake::new()
}

/// How long a worker kept awake by [`stay_awake`] goes on looking for work after the last job it ran.
const AWAKE: Duration = Duration::from_millis(2);

/// Each CPU kernel calls it first: while a [`KeepWorkersAwake`] guard lives, sets rayon's other workers looking for
/// work ([`look_for_work`], one looking loop per worker); without one, nothing.
pub fn stay_awake() {
    if GUARDS.load(Ordering::Relaxed) == 0 {
        return;
    }
    static AWAKE_WORKERS: AtomicUsize = AtomicUsize::new(0);
    let wanted = rayon::current_num_threads().saturating_sub(1);
    let mut awake = AWAKE_WORKERS.load(Ordering::Relaxed);
    while awake < wanted {
        match AWAKE_WORKERS.compare_exchange_weak(awake, awake + 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                let origin = rayon::current_thread_index();
                LOOPS_SPAWNED.fetch_add(1, Ordering::Relaxed);
                rayon::spawn(move || {
                    look_for_work(origin);
                    AWAKE_WORKERS.fetch_sub(1, Ordering::Relaxed);
                });
                awake += 1;
            }
            Err(now) => awake = now,
        }
    }
}

/// Runs the pool's pending jobs until none has come for [`AWAKE`] — unless this is the worker that asked (it has work
/// of its own waiting below) or already a looking worker (one looking loop per thread).
fn look_for_work(origin: Option<usize>) {
    thread_local!(static LOOKING: Cell<bool> = const { Cell::new(false) });
    if rayon::current_thread_index() == origin || LOOKING.get() {
        return;
    }
    LOOKING.set(true);
    let mut last_job = Instant::now();
    loop {
        if join_shared_loop() {
            last_job = Instant::now();
            continue;
        }
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => last_job = Instant::now(),
            _ if last_job.elapsed() < AWAKE => std::thread::yield_now(),
            _ => break,
        }
    }
    LOOKING.set(false);
}

/// The loop [`on_every_core`] is running, for the looking workers to join: a pointer to its `&dyn Fn()`, or null.
static SHARED_LOOP: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Looking workers inside [`SHARED_LOOP`]'s loop.
static IN_SHARED_LOOP: AtomicUsize = AtomicUsize::new(0);

/// Runs `claim_all` on this thread and on every worker kept looking for work ([`KeepWorkersAwake`]) at once, returning
/// once all of them have returned; `claim_all` claims chunks of a shared range until none is left (a [`Chunks`]
/// loop), so it is right however many threads run it. The workers join by reading a pointer they check between
/// their looks: no job is queued, stolen or waited on through rayon, so a loop of a few tens of microseconds (a
/// decoded token's matrix–vector products) pays no thread wake-up or sleeping join. Without awake workers, or while
/// another such loop runs, every rayon worker runs it as a parallel iterator.
pub fn on_every_core(claim_all: &(dyn Fn() + Sync)) {
    let everywhere = || (0..rayon::current_num_threads()).into_par_iter().for_each(|_| claim_all());
    if GUARDS.load(Ordering::Relaxed) == 0 {
        return everywhere();
    }
    stay_awake();
    let published = (&raw const claim_all).cast::<()>().cast_mut();
    if SHARED_LOOP.compare_exchange(std::ptr::null_mut(), published, Ordering::SeqCst, Ordering::Relaxed).is_err() {
        return everywhere();
    }
    /// Takes the loop down when this thread is done with it (or unwinds): no worker enters it after the store, and
    /// those inside are waited for, so `claim_all` outlives every call.
    struct Withdraw;
    impl Drop for Withdraw {
        fn drop(&mut self) {
            SHARED_LOOP.store(std::ptr::null_mut(), Ordering::SeqCst);
            while IN_SHARED_LOOP.load(Ordering::SeqCst) != 0 {
                std::hint::spin_loop();
            }
        }
    }
    let _withdraw = Withdraw;
    claim_all();
}

/// Runs the loop [`on_every_core`] has published, if any; whether there was one.
fn join_shared_loop() -> bool {
    if SHARED_LOOP.load(Ordering::Relaxed).is_null() {
        return false;
    }
    IN_SHARED_LOOP.fetch_add(1, Ordering::SeqCst);
    let published = SHARED_LOOP.load(Ordering::SeqCst);
    if !published.is_null() {
        // SAFETY: `on_every_core` published a pointer to its `&dyn Fn()` and, before returning, withdraws it and
        // waits until IN_SHARED_LOOP is 0; this worker counted itself in before reading the pointer (both SeqCst), so
        // either it read null or the caller waits for it below.
        let claim_all = unsafe { *published.cast::<&(dyn Fn() + Sync)>() };
        claim_all();
    }
    IN_SHARED_LOOP.fetch_sub(1, Ordering::SeqCst);
    !published.is_null()
}

/// Hands out [0, len) to the cores as they ask (guided self-scheduling): each chunk is what is left divided by the
/// number of cores, at least `least` long (or half of `len` when that is shorter), so a core slowed down by another
/// process ends on small chunks that the others take over, rather than leaving them waiting on its half.
pub(crate) struct Chunks {
    next: AtomicUsize,
    len: usize,
    least: usize,
    threads: usize,
}

impl Chunks {
    pub(crate) fn new(len: usize, least: usize) -> Self {
        let threads = rayon::current_num_threads();
        Self { next: AtomicUsize::new(0), len, least: least.min(len.div_ceil(threads)).max(1), threads }
    }

    /// The chunk that starts at `start`, none past the end.
    fn starting_at(&self, start: usize) -> Option<Range<usize>> {
        if start >= self.len {
            return None;
        }
        let left = self.len - start;
        let size = (left / self.threads).max(self.least);
        let size = if left - size.min(left) < self.least { left } else { size };
        Some(start..start + size)
    }

    pub(crate) fn claim(&self) -> Option<Range<usize>> {
        let mut start = self.next.load(Ordering::Relaxed);
        loop {
            let chunk = self.starting_at(start)?;
            match self.next.compare_exchange_weak(start, chunk.end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Some(chunk),
                Err(now) => start = now,
            }
        }
    }
}

/// [`Chunks`] of the rows of an output, each claim handing out its rows' part of the output: the part not yet
/// claimed waits behind a lock, and each claim splits its rows off the front (the chunks follow one another, so each
/// is one contiguous slice, and the slices are disjoint by construction).
pub(crate) struct RowChunks<'a, T> {
    chunks: Chunks,
    /// The first unclaimed row and the output from it on.
    rest: Mutex<(usize, &'a mut [T])>,
    row_len: usize,
}

impl<'a, T> RowChunks<'a, T> {
    /// `out`, rows of `row_len` values, in `chunks` of rows.
    pub(crate) fn new(out: &'a mut [T], row_len: usize, chunks: Chunks) -> Self {
        assert_eq!(out.len(), chunks.len * row_len, "the output holds the rows");
        Self { chunks, rest: Mutex::new((0, out)), row_len }
    }

    /// The next chunk of rows and its part of the output; none once all are claimed.
    pub(crate) fn claim(&self) -> Option<(Range<usize>, &'a mut [T])> {
        let mut rest = self.rest.lock().unwrap_or_else(PoisonError::into_inner);
        let (next, out) = &mut *rest;
        let rows = self.chunks.starting_at(*next)?;
        let (part, after) = std::mem::take(out).split_at_mut(rows.len() * self.row_len);
        (*next, *out) = (rows.end, after);
        Some((rows, part))
    }
}

#[cfg(test)]
mod tests {
    use super::{Chunks, LOOPS_SPAWNED, RowChunks, keep_workers_awake, look_for_work, on_every_core, stay_awake};
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// The chunks follow one another over the whole range, shrinking with what is left down to the least size (the
    /// last one takes a remainder shorter than that); a range shorter than two least chunks is split in halves.
    #[test]
    fn chunks_cover_the_range_once_shrinking_to_the_least() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (len, least, sizes) in [
            (1000, 64, vec![500, 250, 125, 125]),
            (16384, 1024, vec![8192, 4096, 2048, 1024, 1024]),
            (100, 64, vec![50, 50]),
            (1, 64, vec![1]),
        ] {
            let chunks = pool.install(|| Chunks::new(len, least));
            let claimed: Vec<_> = std::iter::from_fn(|| chunks.claim()).collect();
            assert_eq!(claimed.iter().map(|c| c.len()).collect::<Vec<_>>(), sizes, "{len} by at least {least}");
            assert!(claimed.windows(2).all(|w| w[0].end == w[1].start) && claimed[0].start == 0);
            // The same chunks by row, each with its rows' part of the output.
            let mut out: Vec<f32> = (0..len * 3).map(|e| e as f32).collect();
            let rows = RowChunks::new(&mut out, 3, pool.install(|| Chunks::new(len, least)));
            for (chunk, (range, part)) in claimed.iter().zip(std::iter::from_fn(|| rows.claim())) {
                assert_eq!(*chunk, range);
                assert_eq!(part.len(), range.len() * 3);
                assert_eq!(part[0], (range.start * 3) as f32);
            }
            assert!(rows.claim().is_none());
        }
    }

    /// A looking worker runs the jobs waiting in the pool and stops once none comes; the worker that asked for help
    /// never loops (its own work waits below it).
    #[test]
    fn a_looking_worker_runs_pending_jobs_and_stops_when_idle() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        for (origin_is_self, expect_ran) in [(false, true), (true, false)] {
            let ran = AtomicBool::new(false);
            let ran_before_scope_end = pool.install(|| {
                rayon::scope(|s| {
                    s.spawn(|_| ran.store(true, Ordering::Relaxed));
                    let origin = if origin_is_self { rayon::current_thread_index() } else { None };
                    look_for_work(origin);
                    ran.load(Ordering::Relaxed)
                })
            });
            assert_eq!(ran_before_scope_end, expect_ran, "origin is the calling worker: {origin_is_self}");
            assert!(ran.load(Ordering::Relaxed));
        }
    }

    /// Without a guard the kernels spawn no looking loops; while one lives they do, and once it is dropped they stop.
    /// (This is the only test that makes a guard; the spawn count is read just before it is dropped.)
    #[test]
    fn workers_are_kept_awake_only_while_a_guard_lives() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let spawned = || LOOPS_SPAWNED.load(Ordering::Relaxed);
        let before = spawned();
        pool.install(stay_awake);
        stay_awake();
        assert_eq!(spawned(), before, "no guard, no looking loop");
        let guard = keep_workers_awake();
        pool.install(stay_awake);
        assert!(spawned() > before, "a guard lives: the other worker is set looking");
        // A loop on every core: the looking worker joins it through the published pointer, and every index is run
        // once whichever threads claim it.
        let helped = AtomicBool::new(false);
        for _ in 0..200 {
            let chunks = pool.install(|| Chunks::new(64, 1));
            let runs: Vec<AtomicUsize> = (0..64).map(|_| AtomicUsize::new(0)).collect();
            pool.install(|| {
                let caller = std::thread::current().id();
                on_every_core(&|| {
                    while let Some(range) = chunks.claim() {
                        helped.fetch_or(std::thread::current().id() != caller, Ordering::Relaxed);
                        range.for_each(|i| _ = runs[i].fetch_add(1, Ordering::Relaxed));
                        std::thread::sleep(std::time::Duration::from_micros(20));
                    }
                })
            });
            assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1), "every index once");
        }
        assert!(helped.load(Ordering::Relaxed), "the looking worker took part");
        let during = spawned();
        drop(guard);
        pool.install(stay_awake);
        stay_awake();
        assert_eq!(spawned(), during, "the guard is dropped: no more looking loops");
    }
}
