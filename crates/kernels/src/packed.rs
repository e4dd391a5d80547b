//! Projections whose weight W [d_out, d_in] stays in ggml's block formats (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
//! Q6_K, and F16 / BF16 / F32 rows), multiplied without a dequantized copy: a GGUF file's weights as llama.cpp uses
//! them, so a decoded token reads 4–8× fewer bytes than from f32.
//!
//! On the CPU each row of x is quantized to 8 bits per block of 32 (d_x = max|x| / 127, q_x = round(x / d_x)), each
//! block of W is unpacked to 32 signed 8-bit codes with a scale per 16 values and an offset, w_i = a_h q_i + m_h,
//! and the dot product is summed in integers:
//! x·w = Σ_blocks d_x (a_0 Σ_{i<16} q_i q_x,i + a_1 Σ_{i≥16} q_i q_x,i) + m_0 d_x Σ_{i<16} q_x,i + m_1 d_x Σ_{i≥16} q_x,i.
//! Every format fits that form (Q6_K's 16-value sub-blocks are the halves; Q4_K's and Q5_K's mins are the
//! offsets), so one integer dot serves them all: AVX-512 VNNI's `vpdpbusd` where the CPU has it, AVX2's
//! `vpmaddubsw` otherwise, and plain Rust elsewhere. Rows of W are split over the cores. A decoded token dots each
//! row of W with x; from [`TILED_ROWS`] rows of x on, each chunk of W is unpacked once, into integer tiles with VNNI
//! ([`tiles`]) or into f32 for f32 matrix products.
//!
//! On wgpu the blocks live in a u32 buffer and `shaders/packed_matmul.wgsl` dequantizes each value in the shader, an
//! invocation per output value; x stays f32.

use burn::backend::fusion::custom::TensorSpec;
use burn::backend::wgpu::{CubeBackend, CubeTensor, into_contiguous};
use burn::backend::{Backend, Dispatch, Flex, backend_extension, tensor::FloatTensor, tensor::IntTensor};
use burn::module::{Module, Param, ParamId};
use burn::tensor::{DType, Device, Int, Shape, Tensor, TensorData};
use ember_formats::ggml::{self, Format};
use ember_formats::packed::{Packed, Part};
use rayon::prelude::*;
use std::ops::Range;

use crate::cpu::{Chunks, Mat, RowChunks, contiguous, dot, floats, on_cpu, on_every_core, stay_awake, tensor};
use crate::flash::cube::{Wgsl, empty, f32_contiguous, launch};

#[cfg(target_arch = "x86_64")]
mod tiles;

/// x Wᵀ + b with W kept in ggml blocks (inference only: the blocks take no gradient).
#[derive(Module, Debug)]
pub struct PackedLinear {
    /// W's blocks, output row after output row, as bytes.
    pub blocks: Param<Tensor<1, Int>>,
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub layout: Layout,
}

/// The formats of W's rows and their length.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    pub parts: Vec<Part>,
    pub cols: usize,
}

impl Layout {
    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }

    /// The bytes of all rows.
    pub fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.rows * p.format.row_bytes(self.cols).expect("whole blocks")).sum()
    }

    /// Rows `first..first + count` as runs of consecutive rows in one format: each run's format, its rows' bytes'
    /// range in the blocks, and its count of rows, walking the parts once.
    fn runs(&self, first: usize, count: usize) -> impl Iterator<Item = (Format, Range<usize>, usize)> + '_ {
        let end = first + count;
        let (mut at, mut start) = (0, 0);
        self.parts.iter().filter_map(move |part| {
            let len = part.format.row_bytes(self.cols).expect("whole blocks");
            let rows = at..at + part.rows;
            let begin = start;
            (at, start) = (rows.end, start + part.rows * len);
            let (from, to) = (rows.start.max(first), rows.end.min(end));
            let bytes = begin + (from - rows.start) * len..begin + (to - rows.start) * len;
            (from < to).then_some((part.format, bytes, to - from))
        })
    }

    /// Rows `first..` in order, each as its format and its bytes' range in the blocks.
    fn rows_from(&self, first: usize) -> impl Iterator<Item = (Format, Range<usize>)> + '_ {
        self.runs(first, self.rows().saturating_sub(first)).flat_map(|(format, bytes, rows)| {
            let len = bytes.len() / rows;
            (0..rows).map(move |r| (format, bytes.start + r * len..bytes.start + (r + 1) * len))
        })
    }
}

impl PackedLinear {
    /// The layer of weight `w` (rows are outputs) and bias `bias` on `device`: its bytes on the CPU, little-endian
    /// u32 words (the last one zero-padded) elsewhere.
    pub fn new(w: &Packed, bias: Option<Param<Tensor<1>>>, device: &Device) -> Self {
        let blocks = if on_cpu(device) {
            Tensor::<1, Int>::from_data(TensorData::new(w.bytes.clone(), [w.bytes.len()]), (device, DType::U8))
        } else {
            let words: Vec<u32> = w
                .bytes
                .chunks(4)
                .map(|b| u32::from_le_bytes(std::array::from_fn(|i| b.get(i).copied().unwrap_or(0))))
                .collect();
            let len = words.len();
            Tensor::<1, Int>::from_data(TensorData::new(words, [len]), (device, DType::U32))
        };
        Self { blocks: Param::initialized(ParamId::new(), blocks), bias, layout: layout(w) }
    }

    pub fn d_in(&self) -> usize {
        self.layout.cols
    }

    pub fn d_out(&self) -> usize {
        self.layout.rows()
    }

    /// The weight as a host matrix of blocks.
    pub fn weight(&self) -> Packed {
        let data = self.blocks.val().into_data();
        let mut bytes = match data.dtype() {
            DType::U8 => data.try_to_vec::<u8>().expect("packed blocks are bytes"),
            _ => data
                .try_to_vec::<u32>()
                .expect("packed blocks are words")
                .into_iter()
                .flat_map(u32::to_le_bytes)
                .collect(),
        };
        bytes.truncate(self.layout.bytes());
        Packed { parts: self.layout.parts.clone(), cols: self.layout.cols, bytes }
    }

    /// y = x Wᵀ + b over the last dimension of x.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let mut dims = x.dims();
        let (k, m) = (self.d_in(), self.d_out());
        let rows: Tensor<2> = x.reshape([dims.iter().product::<usize>() / k.max(1), k]);
        let y = if has_kernel(&rows.device()) {
            let y = <Dispatch as PackedOps>::packed_matmul(
                rows.into_dispatch(),
                self.blocks.val().into_dispatch(),
                self.layout.clone(),
            );
            Tensor::<2>::from_dispatch(y)
        } else {
            // Devices without a packed kernel multiply by the dequantized weight.
            let device = rows.device();
            let w = Tensor::<2>::from_data(TensorData::new(self.weight().dequantize(), [m, k]), &device);
            rows.matmul(w.transpose())
        };
        let y = match &self.bias {
            Some(b) => y + b.val().unsqueeze(),
            None => y,
        };
        dims[D - 1] = m;
        y.reshape(dims)
    }

    /// Rows `ids` [B, T] of W, dequantized: [B, T, d_in] (an embedding table kept in blocks).
    pub fn rows(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        let [b, t] = ids.dims();
        let device = ids.device();
        let rows = if has_kernel(&device) {
            let y = <Dispatch as PackedOps>::packed_rows(
                self.blocks.val().into_dispatch(),
                ids.reshape([b * t]).into_dispatch(),
                self.layout.clone(),
            );
            Tensor::<2>::from_dispatch(y)
        } else {
            let values = gather_rows(&self.weight().bytes, &self.layout, ids.into_data());
            Tensor::from_data(TensorData::new(values, [b * t, self.d_in()]), &device)
        };
        rows.reshape([b, t, self.d_in()])
    }
}

/// The layout of a packed matrix.
pub fn layout(w: &Packed) -> Layout {
    Layout { parts: w.parts.clone(), cols: w.cols }
}

/// Whether `device` multiplies by packed blocks itself: the CPU and wgpu; other devices take the dequantized weight.
pub fn has_kernel(device: &Device) -> bool {
    on_cpu(device) || matches!(device.as_dispatch().clone().inner(), burn::backend::DispatchDevice::Cube(_))
}

fn matmul_meta(x: &TensorSpec, _blocks: &TensorSpec, layout: &Layout) -> TensorSpec {
    TensorSpec::new(Shape::from(vec![x.shape[0], layout.rows()]), x.dtype)
}

fn rows_meta(_blocks: &TensorSpec, ids: &TensorSpec, layout: &Layout) -> TensorSpec {
    TensorSpec::new(Shape::from(vec![ids.shape[0], layout.cols]), DType::F32)
}

/// Products with packed weights as backend operations (the CPU and wgpu; other devices multiply by the dequantized
/// weight).
#[backend_extension(Cube, Flex, Fusion)]
pub trait PackedOps: Backend {
    /// x Wᵀ for x [N, d_in] and W's bytes `blocks` laid out as `layout`.
    #[fusion(meta = matmul_meta)]
    fn packed_matmul(x: FloatTensor<Self>, blocks: IntTensor<Self>, layout: Layout) -> FloatTensor<Self>;

    /// Rows `ids` [N] of W, dequantized: [N, d_in].
    #[fusion(meta = rows_meta)]
    fn packed_rows(blocks: IntTensor<Self>, ids: IntTensor<Self>, layout: Layout) -> FloatTensor<Self>;
}

/// The shader of `shaders/packed_matmul.wgsl`: products, or the rows lookup.
fn shader(rows: bool) -> Wgsl {
    Wgsl {
        name: "packed_matmul",
        text: include_str!("../../../shaders/packed_matmul.wgsl"),
        values: vec![("rows", rows.to_string())],
    }
}

/// The info words of the shader: n, k, m, parts, then (ggml type, rows, bytes per row) per part.
fn shader_info(n: usize, layout: &Layout) -> Vec<u32> {
    let mut info = vec![n as u32, layout.cols as u32, layout.rows() as u32, layout.parts.len() as u32];
    for part in &layout.parts {
        let row_bytes = part.format.row_bytes(layout.cols).expect("whole blocks");
        info.extend([part.format.id, part.rows as u32, row_bytes as u32]);
    }
    info
}

/// A grid of workgroups of 64 invocations covering `items` (at most 65,535 workgroups along x).
fn grid(items: usize) -> (u32, u32) {
    let groups = items.div_ceil(64).max(1);
    let across = groups.min(65535);
    (across as u32, groups.div_ceil(across) as u32)
}

impl PackedOps for CubeBackend {
    fn packed_matmul(x: CubeTensor, blocks: CubeTensor, layout: Layout) -> CubeTensor {
        let x = f32_contiguous(x);
        let n = x.meta.shape()[0];
        let y = empty(&x, &[n, layout.rows()], DType::F32);
        if n * layout.rows() > 0 {
            launch(&x, shader(false), 64, grid(n * layout.rows()), &[&x, &blocks, &y], &shader_info(n, &layout));
        }
        y
    }

    fn packed_rows(blocks: CubeTensor, ids: CubeTensor, layout: Layout) -> CubeTensor {
        assert_eq!(ids.dtype.size(), 4, "token ids on wgpu are 32-bit");
        let ids = into_contiguous(ids);
        let n = ids.meta.shape()[0];
        let y = empty(&blocks, &[n, layout.cols], DType::F32);
        if n > 0 {
            launch(&blocks, shader(true), 64, grid(n), &[&ids, &blocks, &y], &shader_info(n, &layout));
        }
        y
    }
}

impl PackedOps for Flex {
    fn packed_matmul(x: FloatTensor<Self>, blocks: IntTensor<Self>, layout: Layout) -> FloatTensor<Self> {
        stay_awake();
        let x = contiguous(x);
        let n = x.layout().shape()[0];
        let bytes = blocks.as_slice::<u8>().expect("packed blocks are bytes");
        tensor(matmul(floats(&x), n, bytes, &layout), &[n, layout.rows()])
    }

    fn packed_rows(blocks: IntTensor<Self>, ids: IntTensor<Self>, layout: Layout) -> FloatTensor<Self> {
        let bytes = blocks.as_slice::<u8>().expect("packed blocks are bytes");
        let n = ids.layout().shape()[0];
        tensor(gather_rows(bytes, &layout, ids.into_data()), &[n, layout.cols])
    }
}

/// Rows `ids` of the packed matrix `bytes`, dequantized one after another.
fn gather_rows(bytes: &[u8], layout: &Layout, ids: TensorData) -> Vec<f32> {
    let row = |id: i64| layout.rows_from(id as usize).next().expect("a row of the matrix");
    ids.iter::<i64>().map(row).flat_map(|(format, range)| ggml::dequantize(format, &bytes[range])).collect()
}

/// 32 weights w_i = a_h q_i + m_h, h = i / 16.
#[derive(Clone, Copy, Default)]
struct Codes {
    q: [i8; 32],
    a: [f32; 2],
    m: [f32; 2],
}

/// A row of x quantized: its codes and its blocks' [`Scales`].
type XRow<'a> = (&'a [i8], &'a [Scales]);

/// A block of x's scale and sums: [d_x, d_x Σ q_x, d_x Σ_{i<16} q_x,i, d_x Σ_{i≥16} q_x,i] (the first two side by
/// side, as the legacy-format dot loads them together).
type Scales = [f32; 4];

/// Rows of x quantized per block of 32: codes q_x and each block's [`Scales`].
struct Activations {
    blocks: usize,
    q: Vec<i8>,
    scales: Vec<Scales>,
}

impl Activations {
    fn quantize(x: &[f32], k: usize) -> Self {
        let blocks = x.len() / 32;
        let mut out = Self { blocks: k / 32, q: vec![0; blocks * 32], scales: vec![[0.0; 4]; blocks] };
        quantize_blocks(x, &mut out.q, &mut out.scales);
        out
    }

    /// Row r's codes and scales.
    fn row(&self, r: usize) -> XRow<'_> {
        let b = r * self.blocks..(r + 1) * self.blocks;
        (&self.q[b.start * 32..b.end * 32], &self.scales[b])
    }
}

crate::cpu::multiversion! {
    /// q = round(x / d) with d = max|x| / 127 per block of 32, and d Σ q over the block and over each half.
    fn quantize_blocks(x: &[f32], q: &mut [i8], scales: &mut [Scales]) {
        for ((x, q), scales) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).zip(scales) {
            let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            for (q, v) in q.iter_mut().zip(x) {
                *q = (v * inverse).round() as i8;
            }
            let sum = |h: &[i8]| h.iter().map(|&v| v as i32).sum::<i32>();
            let (first, second) = (sum(&q[..16]), sum(&q[16..]));
            *scales = [d, (first + second) as f32 * d, first as f32 * d, second as f32 * d];
        }
    }
}

/// From this many rows of x on, each chunk of W's rows is unpacked once and multiplied with every row of x: into
/// integer tiles with AVX-512 VNNI ([`tiles`]), else dequantized to f32 for f32 matrix products (every unpacked
/// value serves `n` rows); below it, integer dot products row by row (a decoded token).
const TILED_ROWS: usize = 4;

/// How a product walks W: row by row with integer dots, chunks of rows dequantized for f32 products, or chunks
/// unpacked into VNNI tiles (halves of a block with their own scales when `split`).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Walk {
    Dots,
    Dequantized,
    #[cfg(target_arch = "x86_64")]
    Tiles {
        split: bool,
    },
}

impl Walk {
    fn of(n: usize, layout: &Layout) -> Self {
        if n < TILED_ROWS {
            return Self::Dots;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(tiles) = Self::tiles(layout) {
            return tiles;
        }
        Self::Dequantized
    }

    /// VNNI tiles, where the CPU has AVX-512 VNNI and every part of W has blocks; split where any part is Q6_K.
    #[cfg(target_arch = "x86_64")]
    fn tiles(layout: &Layout) -> Option<Self> {
        (has_vnni() && layout.parts.iter().all(|p| p.format.block > 1))
            .then(|| Self::Tiles { split: layout.parts.iter().any(|p| p.format.id == 14) })
    }
}

/// y = x Wᵀ for x [n, k] row-major and W's rows in `bytes` as `layout` lays them out: [n, rows].
pub(crate) fn matmul(x: &[f32], n: usize, bytes: &[u8], layout: &Layout) -> Vec<f32> {
    product(x, n, bytes, layout, Walk::of(n, layout))
}

/// [`matmul`] walking W as `walk` says.
fn product(x: &[f32], n: usize, bytes: &[u8], layout: &Layout, walk: Walk) -> Vec<f32> {
    let (k, m) = (layout.cols, layout.rows());
    if n == 0 {
        return Vec::new();
    }
    let quantized = walk != Walk::Dequantized && layout.parts.iter().any(|p| p.format.block > 1);
    let acts = quantized.then(|| Activations::quantize(x, k));
    if walk == Walk::Dots {
        return dots(x, n, bytes, layout, acts.as_ref());
    }
    #[cfg(target_arch = "x86_64")]
    let xu = acts.as_ref().filter(|_| matches!(walk, Walk::Tiles { .. })).map(tiles::unsigned);
    // Eight chunks of W's rows per core; an unpacked chunk at most 128 rows (~300 KiB at k = 576, in L2), whole
    // tiles when it is tiled.
    let chunk = m.div_ceil(8 * rayon::current_num_threads()).clamp(4, 128);
    #[cfg(target_arch = "x86_64")]
    let chunk = if matches!(walk, Walk::Tiles { .. }) { chunk.next_multiple_of(tiles::ROWS) } else { chunk };
    let firsts: Vec<usize> = (0..m).step_by(chunk).collect();
    // Each chunk's [n, rows] block of y.
    let mut blocks: Vec<Vec<f32>> = firsts
        .par_iter()
        .map(|&first| {
            let rows = chunk.min(m - first);
            let mut out = vec![0.0f32; n * rows];
            let w = layout.rows_from(first).take(rows).map(|(format, range)| (format, &bytes[range]));
            match walk {
                #[cfg(target_arch = "x86_64")]
                Walk::Tiles { split } => {
                    let (acts, xu) = (acts.as_ref().expect("x quantized"), xu.as_deref().expect("x's codes"));
                    let mut packed = Vec::new();
                    tiles::pack(w, k / 32, &mut packed);
                    // SAFETY: `Walk::of` chose tiles only where the CPU has AVX-512 VNNI/VL, AVX2 and FMA.
                    match split {
                        true => unsafe { tiles::multiply::<true>(&packed, xu, acts, rows, &mut out) },
                        false => unsafe { tiles::multiply::<false>(&packed, xu, acts, rows, &mut out) },
                    }
                }
                _ => {
                    let (mut values, mut codes) = (Vec::new(), vec![Codes::default(); k / 32]);
                    for (format, w) in w {
                        dequantize_row(format, w, &mut codes, &mut values);
                    }
                    crate::cpu::matmul(
                        n,
                        rows,
                        k,
                        &mut out,
                        rows,
                        Mat::rows(x, k),
                        Mat::transposed(&values, k),
                        1.0,
                        false,
                    );
                }
            }
            out
        })
        .collect();
    if blocks.len() == 1 {
        return blocks.pop().expect("one block");
    }
    // y's columns first..first + rows from each chunk's block.
    let mut y = vec![0.0f32; n * m];
    for (&first, block) in firsts.iter().zip(&blocks) {
        let rows = block.len() / n;
        for (y, block) in y.chunks_exact_mut(m).zip(block.chunks_exact(rows)) {
            y[first..first + rows].copy_from_slice(block);
        }
    }
    y
}

/// y = x Wᵀ row of W by row of W with integer dots against x's codes `acts` (where W's format has blocks): yᵀ [m, n],
/// every core claiming chunks of W's rows ([`on_every_core`]), transposed at the end.
fn dots(x: &[f32], n: usize, bytes: &[u8], layout: &Layout, acts: Option<&Activations>) -> Vec<f32> {
    let (k, m) = (layout.cols, layout.rows());
    let mut y_t = vec![0.0f32; m * n];
    // Chunks of W's rows, claimed by the cores as they come free.
    let chunks = RowChunks::new(&mut y_t, n, Chunks::new(m, 16));
    on_every_core(&|| {
        // Scratch for the formats unpacked a row at a time, allocated on first use.
        let (mut values, mut codes) = (Vec::new(), Vec::new());
        while let Some((rows, mut out)) = chunks.claim() {
            for (format, range, rows) in layout.runs(rows.start, rows.len()) {
                let (run, rest) = std::mem::take(&mut out).split_at_mut(rows * n);
                out = rest;
                let w = &bytes[range];
                let w_rows = w.chunks_exact(w.len() / rows);
                match acts {
                    #[cfg(target_arch = "x86_64")]
                    Some(acts) if x86::in_registers(format.id) => {
                        for r in 0..n {
                            x86::dot_rows(format, w, acts.row(r), &mut run[r..], n);
                        }
                    }
                    Some(acts) if format.block > 1 => {
                        codes.resize(k / 32, Codes::default());
                        for (out, w) in run.chunks_mut(n).zip(w_rows) {
                            unpack_row(format, w, &mut codes);
                            for (r, y) in out.iter_mut().enumerate() {
                                let (q, scales) = acts.row(r);
                                *y = dot_codes(&codes, q, scales);
                            }
                        }
                    }
                    _ => {
                        for (out, w) in run.chunks_mut(n).zip(w_rows) {
                            values.clear();
                            values.extend(ggml::dequantize(format, w));
                            for (r, y) in out.iter_mut().enumerate() {
                                *y = dot(&values, &x[r * k..(r + 1) * k]);
                            }
                        }
                    }
                }
            }
        }
    });
    if n == 1 {
        return y_t;
    }
    (0..m * n).map(|e| y_t[(e % m) * n + e / m]).collect()
}

crate::cpu::multiversion! {
    /// A row of `format` appended to `values` as f32: block formats through their codes, F32 / F16 / BF16 as ggml
    /// reads them.
    fn dequantize_row(format: Format, row: &[u8], codes: &mut [Codes], values: &mut Vec<f32>) {
        if format.block == 1 {
            values.extend(ggml::dequantize(format, row));
            return;
        }
        unpack_row(format, row, codes);
        for c in codes.iter() {
            values.extend(c.q.iter().enumerate().map(|(i, &q)| c.a[i / 16] * q as f32 + c.m[i / 16]));
        }
    }
}

crate::cpu::multiversion! {
    /// A row of blocks of `format` as codes, 32 values each.
    fn unpack_row(format: Format, row: &[u8], codes: &mut [Codes]) {
        let per_block = format.block / 32;
        for (block, codes) in row.chunks_exact(format.bytes).zip(codes.chunks_exact_mut(per_block)) {
            unpack(format.id, block, codes);
        }
    }
}

/// Every f16 as f32, by bit pattern (256 KiB, built once): a block's scales are read through it.
static HALVES: std::sync::LazyLock<Box<[f32]>> = std::sync::LazyLock::new(|| (0..=u16::MAX).map(ggml::f16).collect());

/// The f16 at byte `at` of `b`.
#[inline(always)]
fn half(b: &[u8], at: usize) -> f32 {
    HALVES[u16::from_le_bytes([b[at], b[at + 1]]) as usize]
}

/// Codes of 32 values from 4-bit `qs` (value i < 16 in the low nibble of byte i, 16 + i in the high one), the
/// fifth bit of value i at bit i of `qh` when given, minus `zero`.
#[inline(always)]
fn nibbles(qs: &[u8], qh: Option<u32>, zero: i8, q: &mut [i8; 32]) {
    for i in 0..16 {
        q[i] = (qs[i] & 0x0f) as i8;
        q[i + 16] = (qs[i] >> 4) as i8;
    }
    if let Some(qh) = qh {
        for (i, q) in q.iter_mut().enumerate() {
            *q |= (((qh >> i) & 1) << 4) as i8;
        }
    }
    q.iter_mut().for_each(|q| *q -= zero);
}

/// One block of ggml type `id` as codes (one per 32 values), the same values `ggml::dequantize` gives.
#[inline(always)]
fn unpack(id: u32, b: &[u8], out: &mut [Codes]) {
    let word = |at: usize| u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
    let c = &mut out[0];
    match id {
        // Q8_0: d · q.
        8 => {
            c.q.iter_mut().zip(&b[2..34]).for_each(|(q, &v)| *q = v as i8);
            (c.a, c.m) = ([half(b, 0); 2], [0.0; 2]);
        }
        // Q4_0: d · (q − 8); Q4_1: d · q + m; Q5_0: d · (q − 16); Q5_1: d · q + m.
        2 => {
            nibbles(&b[2..18], None, 8, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [0.0; 2]);
        }
        3 => {
            nibbles(&b[4..20], None, 0, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [half(b, 2); 2]);
        }
        6 => {
            nibbles(&b[6..22], Some(word(2)), 16, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [0.0; 2]);
        }
        7 => {
            nibbles(&b[8..24], Some(word(4)), 0, &mut c.q);
            (c.a, c.m) = ([half(b, 0); 2], [half(b, 2); 2]);
        }
        // Q4_K / Q5_K: sub-block j is d · sc_j · q − dmin · m_j; chunk c of 64 values holds sub-blocks 2c (low
        // nibbles) and 2c + 1 (high nibbles), Q5_K's fifth bits at bits 2c and 2c + 1 of qh.
        12 | 13 => {
            let (d, dmin, scales) = (half(b, 0), half(b, 2), &b[4..16]);
            let (qh, qs) = if id == 13 { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
            for (j, c) in out.iter_mut().enumerate() {
                let (sc, m) = ggml::scale_min_k4(j, scales);
                let (chunk, high) = (j / 2, j % 2 == 1);
                let q = &qs[32 * chunk..32 * chunk + 32];
                for (l, v) in c.q.iter_mut().enumerate() {
                    let nibble = if high { q[l] >> 4 } else { q[l] & 0x0f };
                    let fifth = qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
                    *v = (nibble | fifth) as i8;
                }
                (c.a, c.m) = ([d * sc; 2], [-dmin * m; 2]);
            }
        }
        // Q6_K: 16 sub-blocks of 16, d · sc · (q − 32); block t (of 4) of half h holds values 128h + 32t + l.
        14 => {
            let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], half(b, 208));
            for (i, c) in out.iter_mut().enumerate() {
                let (h, t) = (i / 4, i % 4);
                let (ql, qh) = (&ql[64 * h + 32 * (t % 2)..], &qh[32 * h..]);
                for (l, v) in c.q.iter_mut().enumerate() {
                    let low = if t < 2 { ql[l] & 0x0f } else { ql[l] >> 4 };
                    *v = (low | ((qh[l] >> (2 * t)) & 3) << 4) as i8 - 32;
                }
                let s = &sc[8 * h + 2 * t..];
                c.a = [d * s[0] as i8 as f32, d * s[1] as i8 as f32];
                c.m = [0.0; 2];
            }
        }
        _ => unreachable!("ggml type {id} is not a block format"),
    }
}

/// Σ over blocks of x·w in the integer form of the module comment.
fn dot_codes(w: &[Codes], q: &[i8], scales: &[Scales]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if has_vnni() {
            // SAFETY: the CPU has the features the function is compiled for (checked just above).
            return unsafe { x86::dot_vnni(w, q, scales) };
        }
        if crate::cpu::has_avx2_fma() {
            // SAFETY: as above.
            return unsafe { x86::dot_avx2(w, q, scales) };
        }
    }
    dot_portable(w, q, scales)
}

fn dot_portable(w: &[Codes], q: &[i8], scales: &[Scales]) -> f32 {
    let mut acc = 0.0;
    for ((c, q), &[d, _, s0, s1]) in w.iter().zip(q.chunks_exact(32)).zip(scales) {
        let half = |h: usize| (16 * h..16 * h + 16).map(|i| c.q[i] as i32 * q[i] as i32).sum::<i32>() as f32;
        acc += d * (c.a[0] * half(0) + c.a[1] * half(1)) + c.m[0] * s0 + c.m[1] * s1;
    }
    acc
}

/// Whether the CPU has AVX-512 VNNI on 256-bit vectors (checked once).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        std::is_x86_feature_detected!("avx512vnni")
            && std::is_x86_feature_detected!("avx512vl")
            && crate::cpu::has_avx2_fma()
    })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Codes, ggml};
    use std::arch::x86_64::*;

    /// Σ_blocks (a_h d_x)·(integer lanes) accumulated in eight f32 lanes, plus the offsets; `products` gives the
    /// eight i32 lanes of Σ |w| · (x · sign w) over 4 bytes each: lanes 0–3 sum the block's first 16 values, lanes
    /// 4–7 its last 16.
    #[inline(always)]
    fn dot_with(
        w: &[Codes],
        q: &[i8],
        scales: &[super::Scales],
        products: impl Fn(__m256i, __m256i) -> __m256i,
    ) -> f32 {
        // SAFETY (all intrinsics below): the callers are compiled with AVX2 and FMA, which the CPU has.
        unsafe {
            let mut acc = _mm256_setzero_ps();
            let mut offsets = 0.0;
            for ((c, q), &[d, _, s0, s1]) in w.iter().zip(q.chunks_exact(32)).zip(scales) {
                // Both are 32 bytes: the codes by type, q by `chunks_exact`.
                let wq = _mm256_loadu_si256(c.q.as_ptr().cast());
                let xq = _mm256_loadu_si256(q.as_ptr().cast());
                // |w| (unsigned) times x with w's sign: the products of w and x, as u8 · i8 takes them.
                let lanes = products(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq));
                let scale = _mm256_set_m128(_mm_set1_ps(c.a[1] * d), _mm_set1_ps(c.a[0] * d));
                acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc);
                offsets += c.m[0] * s0 + c.m[1] * s1;
            }
            horizontal_sum(acc) + offsets
        }
    }

    /// Whether ggml type `id` is a format whose codes [`dot_rows`] builds straight from its bytes (Q8_0, Q4_0,
    /// Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K), and the CPU has what it is compiled for (AVX2, FMA, F16C).
    pub(super) fn in_registers(id: u32) -> bool {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let has = *HAS.get_or_init(|| crate::cpu::has_avx2_fma() && std::is_x86_feature_detected!("f16c"));
        has && matches!(id, 2 | 3 | 6 | 7 | 8 | 12 | 13 | 14)
    }

    /// x·w for each row of `w`, consecutive rows of W in one [`in_registers`] format, into `y[0]`, `y[stride]`, …:
    /// each row's codes are built in registers from its blocks' bytes (no unpacked copy), 4-bit values as the
    /// block's low nibbles then its high nibbles, the bits above them (Q5's fifth, Q6_K's fifth and sixth) from qh.
    pub(super) fn dot_rows(format: super::Format, w: &[u8], x: super::XRow, y: &mut [f32], stride: usize) {
        let vnni = super::has_vnni();
        // One instance per format, so the per-block layout is known when it is compiled.
        macro_rules! run {
            ($id:literal) => {
                if vnni {
                    // SAFETY: the CPU has the features the function is compiled for (`has_vnni` and the callers'
                    // `in_registers`).
                    unsafe { rows_vnni::<$id>(w, x, y, stride) }
                } else {
                    // SAFETY: the callers check AVX2, FMA and F16C ([`in_registers`]).
                    unsafe { rows_avx2::<$id>(w, x, y, stride) }
                }
            };
        }
        match format.id {
            8 => run!(8),
            2 => run!(2),
            3 => run!(3),
            6 => run!(6),
            7 => run!(7),
            12 => run!(12),
            13 => run!(13),
            _ => run!(14),
        }
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_avx2<const ID: u32>(w: &[u8], x: super::XRow, y: &mut [f32], stride: usize) {
        let products = |u: __m256i, s: __m256i| _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
        match ID {
            12..=14 => k_quant_rows::<ID>(w, x, y, stride, products),
            _ => legacy_rows::<ID>(w, x, y, stride, products),
        }
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
    fn rows_vnni<const ID: u32>(w: &[u8], x: super::XRow, y: &mut [f32], stride: usize) {
        let products = |u: __m256i, s: __m256i| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
        match ID {
            12..=14 => k_quant_rows::<ID>(w, x, y, stride, products),
            _ => legacy_rows::<ID>(w, x, y, stride, products),
        }
    }

    /// How far ahead of the block being dotted its row's bytes are asked for (`prefetcht0`): with the hardware
    /// prefetcher alone two cores read a Q8_0 matrix from memory at ~25 GB/s, ~30 with this.
    const PREFETCH: usize = 1024;

    /// Block bytes, where the codes start, where qh is (Q5), whether a min follows d, and the zero point of the
    /// legacy ggml type `id`.
    const fn block_layout(id: u32) -> (usize, usize, Option<usize>, bool, f32) {
        match id {
            8 => (34, 2, None, false, 0.0),
            2 => (18, 2, None, false, 8.0),
            3 => (20, 4, None, true, 0.0),
            6 => (22, 6, Some(2), false, 16.0),
            _ => (24, 8, Some(4), true, 0.0),
        }
    }

    /// x·w over the blocks of ggml type `ID` for each row of `w`, two blocks a step into two sets of accumulators
    /// (a block's sums do not wait for the previous block's).
    #[inline(always)]
    fn legacy_rows<const ID: u32>(
        w: &[u8],
        (q, scales): super::XRow,
        y: &mut [f32],
        stride: usize,
        products: impl Fn(__m256i, __m256i) -> __m256i + Copy,
    ) {
        let bytes = block_layout(ID).0;
        let count = scales.len();
        // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has.
        unsafe {
            for (row, y) in w.chunks_exact(bytes * count).zip(y.iter_mut().step_by(stride)) {
                let (mut acc, mut offsets) = ([_mm256_setzero_ps(); 2], [_mm_setzero_ps(); 2]);
                let pairs = row.chunks_exact(2 * bytes).zip(q.chunks_exact(64)).zip(scales.chunks_exact(2));
                for ((b, q), s) in pairs {
                    // A hint only: an address past the matrix is not read, and no fault is raised for it.
                    _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH).cast());
                    legacy_block::<ID>(&b[..bytes], &q[..32], &s[0], (&mut acc[0], &mut offsets[0]), products);
                    legacy_block::<ID>(&b[bytes..], &q[32..], &s[1], (&mut acc[1], &mut offsets[1]), products);
                }
                if count % 2 == 1 {
                    let (b, x) = (&row[(count - 1) * bytes..], &q[(count - 1) * 32..]);
                    legacy_block::<ID>(b, x, &scales[count - 1], (&mut acc[0], &mut offsets[0]), products);
                }
                let offsets = _mm_add_ps(offsets[0], offsets[1]);
                *y = horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + _mm_cvtss_f32(_mm_movehdup_ps(offsets));
            }
        }
    }

    /// One block `b` of ggml type `ID` against x's codes `q` and scales `s`: acc += (integer lanes) · d_w d_x, and
    /// lane 1 of `offsets` += o_w · d_x Σ q_x, where w = d_w (q − zero) + m_w makes the offset o_w = m_w or
    /// −zero · d_w (none for Q8_0's signed codes).
    #[inline(always)]
    fn legacy_block<const ID: u32>(
        b: &[u8],
        q: &[i8],
        s: &super::Scales,
        (acc, offsets): (&mut __m256, &mut __m128),
        products: impl Fn(__m256i, __m256i) -> __m256i,
    ) {
        let (_, codes_at, high_at, has_min, zero) = block_layout(ID);
        // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has; every
        // load reads from a slice of at least the bytes it loads.
        unsafe {
            // [d_w, o_w] from the f16 pair at the block's start, times [d_x, d_x Σ q_x].
            let w_scales = if has_min {
                _mm_cvtph_ps(_mm_cvtsi32_si128(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            } else {
                let d = _mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([b[0], b[1]]) as i32));
                if zero == 0.0 { d } else { _mm_mul_ps(_mm_moveldup_ps(d), _mm_setr_ps(1.0, -zero, 0.0, 0.0)) }
            };
            let scaled = match ID {
                8 => _mm_mul_ss(w_scales, _mm_load_ss(&s[0])),
                _ => _mm_mul_ps(w_scales, _mm_castsi128_ps(_mm_loadl_epi64(s.as_ptr().cast()))),
            };
            let xq = _mm256_loadu_si256(q[..32].as_ptr().cast());
            let lanes = if ID == 8 {
                // Signed codes: |w| (unsigned) times x with w's sign, as u8 · i8 takes them.
                let wq = _mm256_loadu_si256(b[2..34].as_ptr().cast());
                products(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xq, wq))
            } else {
                // Unsigned codes q ≥ 0 straight into u8 · i8: 16 bytes in both halves, the upper moved down a
                // nibble, so the low nibbles come first and the high ones after.
                let raw = _mm256_broadcastsi128_si256(_mm_loadu_si128(b[codes_at..codes_at + 16].as_ptr().cast()));
                let nibbles =
                    _mm256_and_si256(_mm256_srlv_epi64(raw, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0f));
                let codes = match high_at {
                    Some(at) => {
                        // Byte i of the spread qh takes byte i / 8 of qh; bit i % 8 of it is tested.
                        let spread = _mm256_setr_epi8(
                            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
                            3, 3,
                        );
                        let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                        let qh = i32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
                        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(qh), spread);
                        let set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bits), bits);
                        _mm256_or_si256(nibbles, _mm256_and_si256(set, _mm256_set1_epi8(0x10)))
                    }
                    None => nibbles,
                };
                *offsets = _mm_add_ps(*offsets, scaled);
                products(codes, xq)
            };
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_broadcastss_ps(scaled), *acc);
        }
    }

    /// x·w over the 256-value super-blocks of K-quant type `ID` (Q4_K, Q5_K, Q6_K) for each row of `w`, the
    /// sub-blocks alternating between two sets of accumulators.
    #[inline(always)]
    fn k_quant_rows<const ID: u32>(
        w: &[u8],
        (q, scales): super::XRow,
        y: &mut [f32],
        stride: usize,
        products: impl Fn(__m256i, __m256i) -> __m256i + Copy,
    ) {
        let bytes = match ID {
            12 => 144,
            13 => 176,
            _ => 210,
        };
        let supers = scales.len() / 8;
        // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has.
        unsafe {
            for (row, y) in w.chunks_exact(bytes * supers).zip(y.iter_mut().step_by(stride)) {
                let (mut acc, mut offsets) = ([_mm256_setzero_ps(); 2], [0.0f32; 2]);
                for ((b, q), s) in row.chunks_exact(bytes).zip(q.chunks_exact(256)).zip(scales.chunks_exact(8)) {
                    // A hint only, as in `legacy_rows`.
                    _mm_prefetch::<_MM_HINT_T0>(b.as_ptr().wrapping_add(PREFETCH).cast());
                    match ID {
                        14 => q6_k_block(b, q, s, (&mut acc, &mut offsets), products),
                        _ => q45_k_block::<ID>(b, q, s, (&mut acc, &mut offsets), products),
                    }
                }
                *y = horizontal_sum(_mm256_add_ps(acc[0], acc[1])) + (offsets[0] + offsets[1]);
            }
        }
    }

    /// The f16 at byte `at` of `b` (F16C).
    #[inline(always)]
    fn f16_at(b: &[u8], at: usize) -> f32 {
        // SAFETY: the callers are compiled with F16C, which the CPU has.
        unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(u16::from_le_bytes([b[at], b[at + 1]]) as i32))) }
    }

    /// One Q4_K / Q5_K super-block `b` against x's 8 blocks: sub-block j is d · sc_j · q − dmin · m_j; chunk c of
    /// 64 values holds sub-blocks 2c (low nibbles) and 2c + 1 (high nibbles), Q5_K's fifth bits at bit j of qh.
    #[inline(always)]
    fn q45_k_block<const ID: u32>(
        b: &[u8],
        q: &[i8],
        s: &[super::Scales],
        (acc, offsets): (&mut [__m256; 2], &mut [f32; 2]),
        products: impl Fn(__m256i, __m256i) -> __m256i,
    ) {
        let (d, dmin, sc) = (f16_at(b, 0), f16_at(b, 2), &b[4..16]);
        let (qh, qs) = if ID == 13 { (Some(&b[16..48]), &b[48..176]) } else { (None, &b[16..144]) };
        // SAFETY (all intrinsics below): the callers are compiled with AVX2, FMA and F16C, which the CPU has; every
        // load reads from a slice of at least the 32 bytes it loads.
        unsafe {
            let low = _mm256_set1_epi8(0x0f);
            let qh = qh.map(|qh| _mm256_loadu_si256(qh.as_ptr().cast()));
            for c in 0..4 {
                let raw = _mm256_loadu_si256(qs[32 * c..32 * c + 32].as_ptr().cast());
                let nibbles = [_mm256_and_si256(raw, low), _mm256_and_si256(_mm256_srli_epi16(raw, 4), low)];
                for (part, mut codes) in nibbles.into_iter().enumerate() {
                    let j = 2 * c + part;
                    if let Some(qh) = qh {
                        let fifth =
                            _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), _mm256_set1_epi8(1));
                        codes = _mm256_or_si256(codes, _mm256_slli_epi16(fifth, 4));
                    }
                    let (scale, min) = ggml::scale_min_k4(j, sc);
                    let [dx, sum, _, _] = s[j];
                    let lanes = products(codes, _mm256_loadu_si256(q[32 * j..32 * j + 32].as_ptr().cast()));
                    acc[part] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d * scale * dx), acc[part]);
                    offsets[part] -= dmin * min * sum;
                }
            }
        }
    }

    /// One Q6_K super-block `b` against x's 8 blocks: 16 sub-blocks of 16, d · sc · (q − 32); x's block 4h + t
    /// takes the low or high nibbles (t < 2 or not) of ql[64h + 32(t mod 2)..] and bits 2t, 2t + 1 of qh[32h..].
    #[inline(always)]
    fn q6_k_block(
        b: &[u8],
        q: &[i8],
        s: &[super::Scales],
        (acc, offsets): (&mut [__m256; 2], &mut [f32; 2]),
        products: impl Fn(__m256i, __m256i) -> __m256i,
    ) {
        let (ql, qh, sc, d) = (&b[..128], &b[128..192], &b[192..208], f16_at(b, 208));
        // SAFETY: as in `q45_k_block`.
        unsafe {
            let (low, two) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
            for h in 0..2 {
                let high = _mm256_loadu_si256(qh[32 * h..32 * h + 32].as_ptr().cast());
                for t in 0..4 {
                    let at = 64 * h + 32 * (t % 2);
                    let raw = _mm256_loadu_si256(ql[at..at + 32].as_ptr().cast());
                    let nibbles = if t < 2 { raw } else { _mm256_srli_epi16(raw, 4) };
                    let top = _mm256_and_si256(_mm256_srl_epi16(high, _mm_cvtsi32_si128(2 * t as i32)), two);
                    // Unsigned codes q + 32 in 0..64; the 32 comes off through x's half sums.
                    let codes = _mm256_or_si256(_mm256_and_si256(nibbles, low), _mm256_slli_epi16(top, 4));
                    let i = 4 * h + t;
                    let [dx, _, s0, s1] = s[i];
                    let (a0, a1) = (d * sc[8 * h + 2 * t] as i8 as f32, d * sc[8 * h + 2 * t + 1] as i8 as f32);
                    let lanes = products(codes, _mm256_loadu_si256(q[32 * i..32 * i + 32].as_ptr().cast()));
                    // Lanes 0–3 sum the block's first 16 values, 4–7 its last 16.
                    let scale = _mm256_set_m128(_mm_set1_ps(a1 * dx), _mm_set1_ps(a0 * dx));
                    acc[t % 2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), scale, acc[t % 2]);
                    offsets[t % 2] -= 32.0 * (a0 * s0 + a1 * s1);
                }
            }
        }
    }

    /// The sum of the eight lanes.
    #[inline(always)]
    unsafe fn horizontal_sum(acc: __m256) -> f32 {
        // SAFETY: the callers are compiled with AVX2.
        unsafe {
            let quad = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
            let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
            _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)))
        }
    }

    #[target_feature(enable = "avx2,fma")]
    pub(super) fn dot_avx2(w: &[Codes], q: &[i8], scales: &[super::Scales]) -> f32 {
        dot_with(w, q, scales, |u, s| _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)))
    }

    #[target_feature(enable = "avx2,fma,avx512vnni,avx512vl")]
    pub(super) fn dot_vnni(w: &[Codes], q: &[i8], scales: &[super::Scales]) -> f32 {
        dot_with(w, q, scales, |u, s| _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_formats::ggml::by_name;

    /// Values of a few magnitudes, negative and positive, the same for every run.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut rng = ember_formats::Rng::new(seed);
        (0..n).map(|i| (rng.normal() * (1.0 + (i % 7) as f64)) as f32).collect()
    }

    /// x Wᵀ by f32 products with W dequantized.
    fn reference(x: &[f32], n: usize, w: &Packed) -> Vec<f32> {
        let (k, dense) = (w.cols, w.dequantize());
        let m = w.rows();
        (0..n * m)
            .map(|e| dense[(e % m) * k..][..k].iter().zip(&x[(e / m) * k..][..k]).map(|(a, b)| a * b).sum())
            .collect()
    }

    /// Every written format, packed and multiplied, against dequantize-then-f32: the only difference is x's 8-bit
    /// quantization, within 1% of Σ|x_i w_i| (x's step is 1/254 of its block's range; the sums cancel most of it).
    #[test]
    fn packed_products_equal_dequantized_ones_within_the_activation_rounding() {
        // 28 rows: the last chunk of W ends inside a tile; 21 rows of x: groups of 4 and one left over; rows of 8
        // and of 9 blocks (the dots take blocks two at a time).
        let m = 28;
        for (k, name) in [256, 288]
            .into_iter()
            .flat_map(|k| ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16", "F32"].map(|name| (k, name)))
        {
            let w = Packed::quantize(by_name(name).unwrap(), m, k, &values(m * k, 1)).unwrap();
            for n in [1, 3, TILED_ROWS, 21] {
                check(&values(n * k, 2), n, &w, name);
            }
        }
    }

    /// `blocks` random blocks of ggml type `id`, their f16 scales set small and positive.
    fn random_blocks(id: u32, blocks: usize, rng: &mut ember_formats::Rng) -> Vec<u8> {
        let format = ggml::format(id).unwrap();
        let mut bytes: Vec<u8> = (0..format.bytes * blocks).map(|_| (rng.next_u64() >> 24) as u8).collect();
        let scales = match id {
            12 | 13 | 3 | 7 => vec![0, 2],
            14 => vec![208],
            _ => vec![0],
        };
        for block in bytes.chunks_exact_mut(format.bytes) {
            for &at in &scales {
                block[at..at + 2].copy_from_slice(&ggml::to_f16(0.01 + (at as f32) * 1e-3).to_le_bytes());
            }
        }
        bytes
    }

    /// The K-quants (which Ember reads but does not write), from random blocks, against dequantize-then-f32, alone
    /// and as a Q4_K + Q6_K stack (a chunk of W whose halves of a block have their own scales in some rows only).
    #[test]
    fn k_quant_products_equal_dequantized_ones_within_the_activation_rounding() {
        let (k, m, mut rng) = (512, 12, ember_formats::Rng::new(6));
        let mut random =
            |id| Packed::new(ggml::format(id).unwrap(), m, k, random_blocks(id, m * k / 256, &mut rng)).unwrap();
        let stack = Packed::stack(vec![random(12), random(14)]).unwrap();
        for (w, name) in [(random(12), "Q4_K"), (random(13), "Q5_K"), (random(14), "Q6_K"), (stack, "Q4_K+Q6_K")] {
            for n in [2, 5] {
                check(&values(n * k, 7), n, &w, name);
            }
        }
    }

    /// Every walk this CPU can take through W.
    fn walks(layout: &Layout) -> Vec<Walk> {
        let mut walks = vec![Walk::Dots, Walk::Dequantized];
        #[cfg(target_arch = "x86_64")]
        if let Some(tiles) = Walk::tiles(layout) {
            // Split tiles serve every format; the unsplit ones where the walk would choose them.
            walks.push(Walk::Tiles { split: true });
            walks.push(tiles);
        }
        walks
    }

    /// y = x Wᵀ by the packed kernel, on every walk, within 1% of Σ|x_i w_i| of the dequantized product.
    fn check(x: &[f32], n: usize, w: &Packed, name: &str) {
        let (k, m, layout) = (w.cols, w.rows(), layout(w));
        let (r, dense) = (reference(x, n, w), w.dequantize());
        for walk in walks(&layout) {
            let y = product(x, n, &w.bytes, &layout, walk);
            assert_eq!(y.len(), r.len());
            for (e, (a, b)) in y.iter().zip(&r).enumerate() {
                let (i, j) = (e / m, e % m);
                let scale: f32 = dense[j * k..][..k].iter().zip(&x[i * k..][..k]).map(|(a, b)| (a * b).abs()).sum();
                assert!((a - b).abs() <= 1e-2 * scale, "{name} n={n} {walk:?} y[{i},{j}]: {a} vs {b} (Σ|xw| {scale})");
            }
        }
    }

    /// The unpacked codes of every format give back the dequantized values exactly.
    #[test]
    fn codes_equal_the_dequantized_values() {
        let mut rng = ember_formats::Rng::new(3);
        for id in [8u32, 2, 3, 6, 7, 12, 13, 14] {
            let format = ggml::format(id).unwrap();
            let block = random_blocks(id, 1, &mut rng);
            let expected = ggml::dequantize(format, &block);
            let mut codes = vec![Codes::default(); format.block / 32];
            unpack(id, &block, &mut codes);
            for (i, want) in expected.iter().enumerate() {
                let c = &codes[i / 32];
                let h = (i % 32) / 16;
                let got = c.a[h] * c.q[i % 32] as f32 + c.m[h];
                assert!((got - want).abs() <= 1e-6 * want.abs().max(1.0), "{} value {i}: {got} vs {want}", format.name);
            }
        }
    }

    /// The three integer dots (VNNI, AVX2, portable) agree on random codes, the extremes (−128 weights) included.
    #[test]
    fn integer_dots_agree() {
        let mut rng = ember_formats::Rng::new(4);
        let w: Vec<Codes> = (0..9)
            .map(|b| {
                let mut c = Codes { a: [0.5, -0.25], m: [0.1, 0.2], ..Codes::default() };
                c.q.iter_mut().for_each(|q| *q = if b == 0 { -128 } else { (rng.next_u64() >> 56) as u8 as i8 });
                c
            })
            .collect();
        let x = values(9 * 32, 5);
        let acts = Activations::quantize(&x, 9 * 32);
        let (q, s) = acts.row(0);
        let portable = dot_portable(&w, q, s);
        let fast = dot_codes(&w, q, s);
        assert!((portable - fast).abs() <= 1e-4 * portable.abs().max(1.0), "{portable} vs {fast}");
        #[cfg(target_arch = "x86_64")]
        if crate::cpu::has_avx2_fma() {
            // SAFETY: the CPU has AVX2 and FMA.
            let avx2 = unsafe { x86::dot_avx2(&w, q, s) };
            assert!((portable - avx2).abs() <= 1e-4 * portable.abs().max(1.0), "{portable} vs {avx2}");
        }
    }
}
