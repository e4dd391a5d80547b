//! What the CPU kernels share: burn-flex tensors as contiguous f32 slices and back, whether a device is the CPU,
//! matrix products on slices, their loops compiled for AVX-512 or AVX2 by the CPU's level ([`level`]), and keeping
//! rayon's workers awake between kernels when the program asks for it.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Device, TensorData};
use rayon::prelude::*;

pub mod level;
mod workers;

pub(crate) use workers::{Chunks, RowChunks};
pub use workers::{KeepWorkersAwake, keep_workers_awake, on_every_core, stay_awake};

/// A CPU kernel's inputs as it reads them: the pool's workers woken ([`stay_awake`]) and each tensor contiguous.
pub fn operands<const N: usize>(tensors: [FlexTensor; N]) -> [FlexTensor; N] {
    stay_awake();
    tensors.map(contiguous)
}

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

/// Whether the kernels run at least at the AVX2 level (AVX2, FMA, F16C; see [`level::cpu_level`]).
#[cfg(target_arch = "x86_64")]
pub fn has_avx2_fma() -> bool {
    level::cpu_level() >= level::CpuLevel::Avx2
}

/// `fn name(args) -> R { body }` for the kernels' elementwise loops, defined three times from the one body: compiled
/// for AVX-512 (sixteen f32 lanes), for AVX2 and FMA (eight, where the x86-64 baseline has four), and as built; the
/// highest the run's level allows is called ([`level::cpu_level`]). The body is written out in each version, so its
/// loops get the features whatever the inliner decides; the `#[inline(always)]` helpers it calls are inlined into
/// each. Every version does the same operations in the same order (no multiply-add is fused, and the compiler does
/// not reorder a float sum), so their results are identical. Arguments are
/// `name: Type` (no patterns, no generics).
macro_rules! multiversion {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$attr])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                use $crate::cpu::level::{CpuLevel, cpu_level};
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                fn avx512($($arg: $ty),*) $(-> $ret)? $body
                #[target_feature(enable = "avx2,fma,f16c")]
                #[allow(clippy::too_many_arguments)]
                fn avx2($($arg: $ty),*) $(-> $ret)? $body
                match cpu_level() {
                    // SAFETY: the CPU has the features each version is compiled for (the level is never above the
                    // CPU's).
                    CpuLevel::Avx512 => return unsafe { avx512($($arg),*) },
                    CpuLevel::Avx2 => return unsafe { avx2($($arg),*) },
                    CpuLevel::Portable => {}
                }
            }
            #[allow(clippy::too_many_arguments)]
            fn baseline($($arg: $ty),*) $(-> $ret)? $body
            baseline($($arg),*)
        }
    };
}
pub(crate) use multiversion;

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
