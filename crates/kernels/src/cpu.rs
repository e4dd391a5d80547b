//! What the CPU kernels share: burn-flex tensors as contiguous f32 slices and back, whether a device is the CPU,
//! matrix products on slices, their loops compiled for AVX2 where the CPU has it, and keeping rayon's workers awake
//! between kernels when the program asks for it.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Device, TensorData};
use rayon::prelude::*;
use std::cell::Cell;
use std::ops::Range;
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The tensor with a contiguous layout (copied only when it has none).
pub fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.is_contiguous() { t } else { t.to_contiguous() }
}

/// The values of a contiguous f32 tensor.
pub fn floats(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("the CPU kernels take contiguous f32 tensors")
}

/// A tensor of `shape` holding `values`.
pub fn tensor(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// Whether `device` is the CPU device (burn-flex), under autodiff or not.
pub fn on_cpu(device: &Device) -> bool {
    matches!(device.as_dispatch().clone().inner(), burn::backend::DispatchDevice::Flex(_))
}

/// Whether the CPU has AVX2 and FMA (checked once).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2_fma() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"))
}

/// `fn name(args) -> R { body }` for the kernels' elementwise loops, defined twice from the one body: compiled for
/// AVX2 and FMA (eight f32 lanes where the x86-64 baseline has four), called when the CPU has them
/// ([`has_avx2_fma`]), and as built otherwise. The body is written out in each version, so its loops get the features
/// whatever the inliner decides; the `#[inline(always)]` helpers it calls are inlined into either. Both versions do
/// the same operations in the same order (no multiply-add is fused), so their results are identical. Arguments are
/// `name: Type` (no patterns, no generics).
macro_rules! multiversion {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                #[allow(clippy::too_many_arguments)]
                fn avx2($($arg: $ty),*) $(-> $ret)? $body
                if $crate::cpu::has_avx2_fma() {
                    // SAFETY: the CPU has the features `avx2` is compiled for (checked just above).
                    return unsafe { avx2($($arg),*) };
                }
            }
            #[allow(clippy::too_many_arguments)]
            fn baseline($($arg: $ty),*) $(-> $ret)? $body
            baseline($($arg),*)
        }
    };
}
pub(crate) use multiversion;

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

/// A strided matrix view of a slice: element (i, j) is `data[i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    pub data: &'a [f32],
    pub rs: usize,
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// A row-major matrix with rows `rs` apart.
    pub fn rows(data: &'a [f32], rs: usize) -> Self {
        Self { data, rs, cs: 1 }
    }

    /// The transpose of a row-major matrix with rows `rs` apart.
    pub fn transposed(data: &'a [f32], rs: usize) -> Self {
        Self { data, rs: 1, cs: rs }
    }

    /// The transpose of this view (no copy).
    pub fn t(self) -> Self {
        Self { rs: self.cs, cs: self.rs, ..self }
    }

    /// A 2-D f32 tensor's values in place, whatever its (non-negative) strides: a transposed view is read as one.
    pub fn of(t: &'a FlexTensor) -> Self {
        let layout = t.layout();
        let &[rs, cs] = layout.strides() else { panic!("a matrix has two dimensions") };
        assert!(rs >= 0 && cs >= 0, "the CPU kernels read matrices with non-negative strides");
        Self { data: &t.storage::<f32>()[layout.start_offset()..], rs: rs as usize, cs: cs as usize }
    }

    fn covers(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// C = A·B, plus the row `bias` on every row when given, as a new contiguous m×n matrix, split over the cores in
/// [`Chunks`] along the longer of A's rows and the inner dimension: a chunk of rows re-reads all of B (k·n values), a
/// chunk of the inner dimension adds its m·n products into its core's own C — or, with fewer rows than 16 per core
/// and A's rows against B's contiguous columns (a tied output projection when decoding), by dot products.
pub fn matmul_in_blocks(m: usize, n: usize, k: usize, a: Mat, b: Mat, bias: Option<&[f32]>) -> Vec<f32> {
    let threads = rayon::current_num_threads();
    if m < 16 * threads && a.cs == 1 && b.rs == 1 {
        return matmul_by_dot_products(m, n, k, a, b, bias);
    }
    if k > m && k >= 64 * threads {
        return matmul_by_inner_chunks(m, n, k, a, b, bias);
    }
    // The core that claims a chunk of rows writes its first values (the bias, or zeros) and then the product into
    // it, so no core fills the whole output first (a recycled block of the allocator is not zeroed again).
    let mut c = Vec::with_capacity(m * n);
    let chunks = RowChunks::new(&mut c.spare_capacity_mut()[..m * n], n, Chunks::new(m, 64));
    (0..threads).into_par_iter().for_each(|_| {
        while let Some((rows, c)) = chunks.claim() {
            for row in c.chunks_mut(n.max(1)) {
                match bias {
                    Some(bias) => row.iter_mut().zip(bias).for_each(|(c, &b)| _ = c.write(b)),
                    None => row.iter_mut().for_each(|c| _ = c.write(0.0)),
                }
            }
            // SAFETY: every element of the chunk was written just above.
            let c = unsafe { c.assume_init_mut() };
            let a = Mat { data: &a.data[rows.start * a.rs..], ..a };
            matmul(rows.len(), n, k, c, n, a, b, 1.0, bias.is_some());
        }
    });
    // SAFETY: the chunks cover all m rows, each initialised above.
    unsafe { c.set_len(m * n) };
    c
}

/// [`matmul_in_blocks`] as Σ_l A[:, l] B[l, :] over chunks of inner indices, each core adding its chunks into its
/// own C, the cores' sums then added (with the bias).
fn matmul_by_inner_chunks(m: usize, n: usize, k: usize, a: Mat, b: Mat, bias: Option<&[f32]>) -> Vec<f32> {
    let chunks = Chunks::new(k, 64);
    let core_sum = |_| {
        let mut c = None;
        while let Some(inner) = chunks.claim() {
            let c = c.get_or_insert_with(|| vec![0.0f32; m * n]);
            let (a, b) =
                (Mat { data: &a.data[inner.start * a.cs..], ..a }, Mat { data: &b.data[inner.start * b.rs..], ..b });
            matmul(m, n, inner.len(), c, n, a, b, 1.0, true);
        }
        c
    };
    let mut c = (0..rayon::current_num_threads()).into_par_iter().filter_map(core_sum).reduce_with(sum).expect("k > 0");
    if let Some(bias) = bias {
        add_to_each_row(&mut c, bias);
    }
    c
}

/// y ← y + x, elementwise.
#[inline(always)]
fn add_to(y: &mut [f32], x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += x);
}

multiversion! {
    /// y ← y + x, elementwise.
    fn add_assign(y: &mut [f32], x: &[f32]) {
        add_to(y, x);
    }
}

multiversion! {
    /// Each row of `rows` (rows of x.len() values) ← row + x.
    fn add_to_each_row(rows: &mut [f32], x: &[f32]) {
        rows.chunks_mut(x.len().max(1)).for_each(|row| add_to(row, x));
    }
}

multiversion! {
    /// y ← y + Σ of the rows of `rows` (rows of y.len() values), added in order.
    fn add_each_row_to(y: &mut [f32], rows: &[f32]) {
        rows.chunks_exact(y.len().max(1)).for_each(|row| add_to(y, row));
    }
}

/// a + b, the sum of two cores' partial results.
fn sum(mut a: Vec<f32>, b: Vec<f32>) -> Vec<f32> {
    add_assign(&mut a, &b);
    a
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

    fn claim(&self) -> Option<Range<usize>> {
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

/// [`matmul_in_blocks`] for few rows of A against a B whose columns are contiguous (a transposed view, such as a
/// tied embedding read as the output projection): C[i, j] = b_j + A[i, :]·B[:, j], blocks of columns in parallel, so
/// each core streams its own contiguous part of B.
fn matmul_by_dot_products(m: usize, n: usize, k: usize, a: Mat, b: Mat, bias: Option<&[f32]>) -> Vec<f32> {
    const COLUMNS: usize = 256;
    // Cᵀ, column j of C at [j·m, (j + 1)·m).
    let mut c_t = vec![0.0f32; n * m];
    c_t.par_chunks_mut(COLUMNS * m.max(1))
        .enumerate()
        .for_each(|(block, c_t)| columns_by_dot_products(c_t, block * COLUMNS, m, k, a, b, bias));
    if m <= 1 {
        return c_t;
    }
    (0..m * n).map(|e| c_t[(e % n) * m + e / n]).collect()
}

multiversion! {
    /// Columns `first`, `first` + 1, … of C = A·B (+ bias) for [`matmul_by_dot_products`], into `c_t` (Cᵀ's rows).
    fn columns_by_dot_products(
        c_t: &mut [f32],
        first: usize,
        m: usize,
        k: usize,
        a: Mat<'_>,
        b: Mat<'_>,
        bias: Option<&[f32]>,
    ) {
        for (j, c) in (first..).zip(c_t.chunks_mut(m.max(1))) {
            let column = &b.data[j * b.cs..][..k];
            for (i, c) in c.iter_mut().enumerate() {
                *c = bias.map_or(0.0, |b| b[j]) + dot_lanes(&a.data[i * a.rs..][..k], column);
            }
        }
    }
}

/// Σ_e a_e b_e, eight partial sums so the compiler can vectorise it.
#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for e in 0..8 {
            acc[e] += x[e] * y[e];
        }
    }
    acc.iter().sum::<f32>() + tail
}

multiversion! {
    /// Σ_e a_e b_e, eight partial sums so the compiler can vectorise it.
    pub fn dot(a: &[f32], b: &[f32]) -> f32 {
        dot_lanes(a, b)
    }
}

/// Σ over the rows of a row-major matrix with rows of `n` values, row blocks summed on the cores in parallel.
pub fn column_sums(x: &[f32], n: usize) -> Vec<f32> {
    let rows = (x.len() / n.max(1)).div_ceil(rayon::current_num_threads()).max(64);
    let block_sum = |x: &[f32]| {
        let mut s = vec![0.0f32; n];
        add_each_row_to(&mut s, x);
        s
    };
    x.par_chunks(rows * n.max(1)).map(block_sum).reduce(|| vec![0.0f32; n], sum)
}

/// C ← β·A·B (or C + β·A·B with `accumulate`) for A m×k, B k×n and C m×n row-major with rows `c_rs` apart, on the
/// calling thread (the kernels parallelise over heads or rows around it).
#[allow(clippy::too_many_arguments)]
pub fn matmul(m: usize, n: usize, k: usize, c: &mut [f32], c_rs: usize, a: Mat, b: Mat, beta: f32, accumulate: bool) {
    assert!(a.covers(m, k) && b.covers(k, n) && (m == 0 || n == 0 || (m - 1) * c_rs + n <= c.len()));
    if m == 0 || n == 0 {
        return;
    }
    let (a_rs, a_cs, b_rs, b_cs) = (a.rs as isize, a.cs as isize, b.rs as isize, b.cs as isize);
    let alpha = if accumulate { 1.0 } else { 0.0 };
    // SAFETY: the asserts keep every element gemm reads or writes inside the slices.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            1,
            c_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            alpha,
            beta,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
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
