//! y = x Wᵀ on the CPU: a decoded token dots each row of W with x's codes, the cores claiming chunks of rows; from
//! [`TILED_ROWS`] rows of x on, each chunk of W is unpacked once, into VNNI tiles or f32 for f32 matrix products.

use burn::backend::Flex;
use burn::backend::tensor::{FloatTensor, IntTensor};
use ember_formats::ggml::Format;
use rayon::prelude::*;

use super::codes::{Codes, dot_codes, unpack_row};
use super::dense::{dot_dense, extend_dense};
use super::quantize::Activations;
use super::{Layout, PackedOps, gather_rows};
#[cfg(target_arch = "x86_64")]
use super::{tiles, x86};
use crate::cpu::level::has_vnni;
use crate::cpu::{Chunks, Mat, RowChunks, floats, on_every_core, operands, tensor};

impl PackedOps for Flex {
    fn packed_matmul(x: FloatTensor<Self>, blocks: IntTensor<Self>, layout: Layout) -> FloatTensor<Self> {
        let [x] = operands([x]);
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

/// From this many rows of x on, each chunk of W's rows is unpacked once and multiplied with every row of x: into
/// integer tiles with AVX-512 VNNI ([`tiles`]), else dequantized to f32 for f32 matrix products (every unpacked
/// value serves `n` rows); below it, integer dot products row by row (a decoded token).
pub(super) const TILED_ROWS: usize = 4;

/// How a product walks W: row by row with integer dots, chunks of rows dequantized for f32 products, or chunks
/// unpacked into VNNI tiles (halves of a block with their own scales when `split`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Walk {
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
    pub(super) fn tiles(layout: &Layout) -> Option<Self> {
        (has_vnni() && layout.parts.iter().all(|p| p.format.block > 1))
            .then(|| Self::Tiles { split: layout.parts.iter().any(|p| p.format.id == 14) })
    }
}

/// y = x Wᵀ for x [n, k] row-major and W's rows in `bytes` as `layout` lays them out: [n, rows].
pub(super) fn matmul(x: &[f32], n: usize, bytes: &[u8], layout: &Layout) -> Vec<f32> {
    product(x, n, bytes, layout, Walk::of(n, layout))
}

/// [`matmul`] walking W as `walk` says.
pub(super) fn product(x: &[f32], n: usize, bytes: &[u8], layout: &Layout, walk: Walk) -> Vec<f32> {
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
                    // SAFETY: `Walk::of` chose tiles only at the AVX-512 level on a CPU with VNNI (`has_vnni`).
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
        // Scratch for the block formats unpacked a row at a time, allocated on first use.
        let mut codes = Vec::new();
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
                    // F32, F16 and BF16 rows, read as they are.
                    _ => {
                        for (out, w) in run.chunks_mut(n).zip(w_rows) {
                            for (r, y) in out.iter_mut().enumerate() {
                                *y = dot_dense(format.id, w, &x[r * k..(r + 1) * k]);
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
    pub(super) fn dequantize_row(format: Format, row: &[u8], codes: &mut [Codes], values: &mut Vec<f32>) {
        if format.block == 1 {
            extend_dense(format.id, row, values);
            return;
        }
        unpack_row(format, row, codes);
        for c in codes.iter() {
            values.extend(c.q.iter().enumerate().map(|(i, &q)| c.a[i / 16] * q as f32 + c.m[i / 16]));
        }
    }
}
