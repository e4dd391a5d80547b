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
use burn::backend::{Backend, Dispatch, backend_extension, tensor::FloatTensor, tensor::IntTensor};
use burn::module::{Module, Param, ParamId};
use burn::tensor::{DType, Device, Int, Shape, Tensor, TensorData};
use ember_formats::ggml::{self, Format};
use ember_formats::packed::{Packed, Part};
use std::ops::Range;

use crate::cpu::on_cpu;
use crate::wgsl::on_wgpu;

mod codes;
mod dense;
mod product;
mod quantize;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod tiles;
mod wgpu;
#[cfg(target_arch = "x86_64")]
mod x86;

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
    pub(super) fn runs(&self, first: usize, count: usize) -> impl Iterator<Item = (Format, Range<usize>, usize)> + '_ {
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
    pub(super) fn rows_from(&self, first: usize) -> impl Iterator<Item = (Format, Range<usize>)> + '_ {
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
    on_cpu(device) || on_wgpu(device)
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

/// Rows `ids` of the packed matrix `bytes`, dequantized one after another.
pub(super) fn gather_rows(bytes: &[u8], layout: &Layout, ids: TensorData) -> Vec<f32> {
    let row = |id: i64| layout.rows_from(id as usize).next().expect("a row of the matrix");
    ids.iter::<i64>().map(row).flat_map(|(format, range)| ggml::dequantize(format, &bytes[range])).collect()
}
