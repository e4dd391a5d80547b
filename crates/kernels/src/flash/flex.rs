//! The kernels on the CPU (burn-flex): exact attention by blocks of 64 query rows — the block's scores in a buffer of
//! 64 × Tk floats, never a T×T matrix, the products as matrix kernels — with one rayon task per (batch row, head,
//! block); the FlashAttention-2 backward recomputes p from the saved lse, one task per (batch row, KV head) so dk and
//! dv need no atomics. Operands are read in place through their row layout (`Rows`): contiguous [B, H, T, D], int8
//! codes dequantized first, the q, k, v parts of a fused projection [B, T, (hq + 2·hkv)·D] (whose gradient is written
//! back in that layout), or through a page table one query row at a time. Outputs are cut into one slice per row
//! first ([`rows_of`], [`token_major_rows`]) and each task is handed its own rows, so the tasks write disjoint
//! slices whatever the layout (heads interleave within a fused projection's rows).

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use rayon::prelude::*;

use super::{FlashGradOps, FlashOps, FlashParams, Int8AttentionOps, KvLayout, PackedAttentionOps};
use crate::cpu::{Mat, contiguous, dot, floats, matmul, multiversion, operands, stay_awake, tensor};
use crate::math;
use crate::spec::PackedHeads;

/// One call's shapes: q [b, hq, tq, d], keys and values [b, hkv, tk, d] (logically).
#[derive(Clone, Copy)]
struct Dims {
    b: usize,
    hq: usize,
    hkv: usize,
    tq: usize,
    tk: usize,
    d: usize,
}

impl Dims {
    /// Keys [lo, hi) that query row i of batch row b sees: j < key_length[b]; causal: j ≤ offset + i;
    /// window w: j > offset + i − w (flash_common.wgsl's `row_keys`).
    fn row_keys(&self, p: &FlashParams, b: usize, i: usize) -> (usize, usize) {
        let pos = p.query_offset + i;
        let mut hi = p.key_lengths.get(b).map_or(self.tk, |&l| l.min(self.tk));
        if p.causal {
            hi = hi.min(pos + 1);
        }
        let lo = if p.window > 0 && pos + 1 > p.window { pos + 1 - p.window } else { 0 };
        (lo, hi.max(lo))
    }

    /// The keys [lo, hi) any of query rows [i0, i0 + rows) of batch row b sees; None when they see none.
    fn block_keys(&self, p: &FlashParams, b: usize, i0: usize, rows: usize) -> Option<(usize, usize)> {
        let ranges = (i0..i0 + rows).map(|i| self.row_keys(p, b, i)).filter(|(lo, hi)| lo < hi);
        let (lo, hi) = ranges.fold((usize::MAX, 0), |(lo, hi), (a, z)| (lo.min(a), hi.max(z)));
        (lo < hi).then_some((lo, hi))
    }
}

/// Where key/value row j of KV head g, batch row b starts in its buffer.
type RowOf<'a> = dyn Fn(usize, usize, usize) -> usize + Sync + 'a;

fn shape(t: &FlexTensor) -> Vec<usize> {
    t.layout().shape().to_vec()
}

/// Where the rows of a logical [B, H, T, D] operand lie in its buffer: row i of head h, batch row b starts at
/// base + b·batch + h·head + i·row (a contiguous tensor, token-major caches, or one part of a fused projection).
#[derive(Clone, Copy)]
struct Rows {
    base: usize,
    batch: usize,
    head: usize,
    row: usize,
}

impl Rows {
    /// A contiguous [B, H, T, D] tensor.
    fn contiguous(h: usize, t: usize, d: usize) -> Self {
        Self { base: 0, batch: h * t * d, head: t * d, row: d }
    }

    /// Heads side by side in rows of `width` values from column `base`: [B, T, width] holding h·d-wide head blocks.
    fn interleaved(base: usize, t: usize, d: usize, width: usize) -> Self {
        Self { base, batch: t * width, head: d, row: width }
    }

    /// A [B, H, T, D] tensor's rows where its strides put them, when its values are unit-strided within rows: a
    /// cache's keys read in place through a view of the first T rows of a longer buffer.
    fn strided(t: &FlexTensor) -> Option<Self> {
        let (layout, base) = (t.layout(), t.layout().start_offset());
        match *layout.strides() {
            [batch, head, row, 1] if batch >= 0 && head >= 0 && row >= 0 => {
                Some(Self { base, batch: batch as usize, head: head as usize, row: row as usize })
            }
            _ => None,
        }
    }

    fn at(&self, b: usize, h: usize, i: usize) -> usize {
        self.base + b * self.batch + h * self.head + i * self.row
    }
}

/// An operand's values and where its rows are.
#[derive(Clone, Copy)]
struct Operand<'a> {
    data: &'a [f32],
    rows: Rows,
}

impl<'a> Operand<'a> {
    /// A contiguous f32 tensor's values with its rows where `rows` puts them.
    fn of(t: &'a FlexTensor, rows: Rows) -> Self {
        Self { data: floats(t), rows }
    }

    /// A [B, H, T, D] tensor read in place (see [`Rows::strided`]), or else copied to a contiguous one in `copy`.
    fn in_place(t: &'a FlexTensor, copy: &'a mut Option<FlexTensor>) -> Self {
        let [_, h, rows, d] = shape(t)[..] else { panic!("attention operands are [B, H, T, D]") };
        match Rows::strided(t) {
            Some(rows) => Self { data: t.storage::<f32>(), rows },
            None => Self::of(copy.insert(t.to_contiguous()), Rows::contiguous(h, rows, d)),
        }
    }

    /// Rows i, i + 1, … of head h, batch row b as a matrix.
    fn rows_from(&self, b: usize, h: usize, i: usize) -> Mat<'a> {
        Mat::rows(&self.data[self.rows.at(b, h, i)..], self.rows.row)
    }

    /// Their transpose.
    fn transposed_from(&self, b: usize, h: usize, i: usize) -> Mat<'a> {
        Mat::transposed(&self.data[self.rows.at(b, h, i)..], self.rows.row)
    }

    /// Row i of head h, batch row b: `d` values.
    fn row(&self, b: usize, h: usize, i: usize, d: usize) -> &'a [f32] {
        &self.data[self.rows.at(b, h, i)..][..d]
    }
}

/// y ← y + α x.
fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += alpha * x);
}

/// Query rows per block of the matrix-product kernels: a block's scores take BLOCK × Tk floats.
const BLOCK: usize = 64;

/// max_j x_j, eight lanes at a time (NaNs ignored, as by f32::max).
#[inline(always)]
fn row_max(x: &[f32]) -> f32 {
    let mut m = [f32::NEG_INFINITY; 8];
    let lanes = x.chunks_exact(8);
    let tail = lanes.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    for x in lanes {
        for e in 0..8 {
            m[e] = if x[e] > m[e] { x[e] } else { m[e] };
        }
    }
    m.iter().fold(tail, |a, &b| a.max(b))
}

/// p_ij = e^(s_ij − c_i) over the keys [a, z) row i sees (keys [lo, lo + n) in `s`), 0 elsewhere; returns Σ_j p_ij.
#[inline(always)]
fn exp_row(s: &mut [f32], lo: usize, (a, z): (usize, usize), c: f32) -> f32 {
    let (a, z) = (a - lo, z - lo);
    s[..a].fill(0.0);
    s[z..].fill(0.0);
    let seen = &mut s[a..z];
    seen.iter_mut().for_each(|x| *x = math::exp(*x - c));
    let mut l = [0.0f32; 8];
    let lanes = seen.chunks_exact(8);
    let tail: f32 = lanes.remainder().iter().sum();
    lanes.for_each(|x| (0..8).for_each(|e| l[e] += x[e]));
    l.iter().sum::<f32>() + tail
}

/// (o, lse) for q of `len` values, `head(bh, b, g, o, lse)` filling query head bh's rows (batch row b, KV head g), the
/// heads in parallel; rows it leaves are zeros with lse −∞.
fn per_head(
    len: usize,
    dims: Dims,
    head: impl Fn(usize, usize, usize, &mut [f32], &mut [f32]) + Sync,
) -> (Vec<f32>, Vec<f32>) {
    let Dims { hq, hkv, tq, d, .. } = dims;
    let mut o = vec![0.0f32; len];
    let mut lse = vec![f32::NEG_INFINITY; len / d.max(1)];
    if len > 0 {
        let heads = o.par_chunks_mut(tq * d).zip(lse.par_chunks_mut(tq)).enumerate();
        heads.for_each(|(bh, (o, lse))| head(bh, bh / hq, bh % hq / (hq / hkv), o, lse));
    }
    (o, lse)
}

/// A block of query rows of one (batch row, head): rows [i0, i0 + rows) of batch row b, scored against keys
/// [lo, lo + n).
#[derive(Clone, Copy)]
struct Block {
    b: usize,
    i0: usize,
    rows: usize,
    lo: usize,
    n: usize,
}

multiversion! {
    /// The block's scores `s` (rows of n) → p_ij = e^(s_ij − m_i) over the keys row i sees (zeros elsewhere), with
    /// lse_i = m_i + ln ℓ_i and 1/ℓ_i; a row that sees no key is all zeros (its lse and 1/ℓ are left).
    fn softmax_rows(s: &mut [f32], blk: Block, dims: &Dims, p: &FlashParams, lse: &mut [f32], inv_l: &mut [f32]) {
        let Block { b, i0, rows, lo, n } = blk;
        for r in 0..rows {
            let keys = dims.row_keys(p, b, i0 + r);
            let row = &mut s[r * n..][..n];
            if keys.0 == keys.1 {
                row.fill(0.0);
                continue;
            }
            let m = row_max(&row[keys.0 - lo..keys.1 - lo]);
            let l = exp_row(row, lo, keys, m);
            lse[r] = m + l.ln();
            inv_l[r] = 1.0 / l;
        }
    }
}

/// `buf` cut into `count` rows of `d` values, in order (empty rows when d is 0).
fn rows_of(buf: &mut [f32], d: usize, count: usize) -> Vec<&mut [f32]> {
    if d == 0 {
        return std::iter::repeat_with(Default::default).take(count).collect();
    }
    assert_eq!(buf.len(), count * d, "{count} rows of {d}");
    buf.chunks_mut(d).collect()
}

/// The rows of a token-major buffer [B, T, Σ_p heads[p]·d], whose part p holds heads[p] heads side by side: one
/// list per part, its rows in (batch row, head, token) order, as [`rows_of`] cuts a contiguous [B, H, T, D].
fn token_major_rows<const P: usize>(buf: &mut [f32], [b, t, d]: [usize; 3], heads: [usize; P]) -> [Vec<&mut [f32]>; P] {
    let width: usize = heads.iter().sum();
    // In memory order: (batch row, token, head of any part).
    let mut rows = rows_of(buf, d, b * t * width);
    let mut first = 0;
    heads.map(|h| {
        let part = first;
        first += h;
        (0..b * h * t)
            .map(|e| std::mem::take(&mut rows[(e / (h * t) * t + e % t) * width + part + e / t % h]))
            .collect()
    })
}

/// lse [B, hq, tq] by query blocks, and o into `o` (one row of d values per (batch row, head, query row), in that
/// order, zeros): S = scale · Q_blk Kᵀ, p_ij = e^(s_ij − m_i) / ℓ_i over the keys row i sees, O_blk = P V (matrix
/// products), lse_i = m_i + ln ℓ_i; a row with no key gives zeros (and lse −∞). One task per (batch row, head,
/// block), each writing its own rows of o and its part of lse.
fn forward(q: Operand, k: Operand, v: Operand, dims: Dims, p: &FlashParams, mut o: Vec<&mut [f32]>) -> Vec<f32> {
    let Dims { b: batch, hq, hkv, tq, tk, d } = dims;
    let mut lse = vec![f32::NEG_INFINITY; batch * hq * tq];
    assert_eq!(o.len(), lse.len(), "a row of o per row of lse");
    let per_head = tq.div_ceil(BLOCK);
    let tasks: Vec<_> = o
        .chunks_mut(tq.max(1))
        .zip(lse.chunks_mut(tq.max(1)))
        .flat_map(|(o, lse)| o.chunks_mut(BLOCK).zip(lse.chunks_mut(BLOCK)))
        .enumerate()
        .collect();
    let scratch = || (vec![0.0f32; BLOCK.min(tq) * tk], vec![0.0f32; BLOCK.min(tq) * d]);
    tasks.into_par_iter().for_each_init(scratch, |(s, o_blk), (task, (o, lse))| {
        let (bh, i0) = (task / per_head, task % per_head * BLOCK);
        let (b, h, rows) = (bh / hq, bh % hq, BLOCK.min(tq - i0));
        let g = h / (hq / hkv);
        let Some((lo, hi)) = dims.block_keys(p, b, i0, rows) else { return };
        let n = hi - lo;
        matmul(rows, n, d, s, n, q.rows_from(b, h, i0), k.transposed_from(b, g, lo), p.scale, false);
        let (mut lse_blk, mut inv_l) = ([f32::NEG_INFINITY; BLOCK], [0.0f32; BLOCK]);
        softmax_rows(s, Block { b, i0, rows, lo, n }, &dims, p, &mut lse_blk, &mut inv_l);
        matmul(rows, d, n, o_blk, d, Mat::rows(s, n), v.rows_from(b, g, lo), 1.0, false);
        for (r, (row, out)) in o_blk.chunks_mut(d).zip(o.iter_mut()).enumerate() {
            row.iter_mut().for_each(|x| *x *= inv_l[r]);
            out.copy_from_slice(row);
        }
        lse.copy_from_slice(&lse_blk[..rows]);
    });
    lse
}

/// The forward one query row at a time through a page table (keys not evenly spaced): o_i = Σ_j p_ij v_j, the
/// row's scores in a buffer of at most Tk floats.
fn forward_paged(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: &FlashParams, row: &RowOf) -> (Vec<f32>, Vec<f32>) {
    let Dims { tq, tk, d, .. } = dims;
    per_head(q.len(), dims, |bh, b, g, o, lse| {
        let mut s = vec![0.0f32; tk];
        for i in 0..tq {
            let keys @ (lo, hi) = dims.row_keys(p, b, i);
            if lo == hi {
                continue;
            }
            let qi = &q[(bh * tq + i) * d..][..d];
            for j in lo..hi {
                s[j - lo] = p.scale * dot(qi, &k[row(b, g, j)..][..d]);
            }
            let m = row_max(&s[..hi - lo]);
            let l = exp_row(&mut s[..hi - lo], lo, keys, m);
            let oi = &mut o[i * d..][..d];
            (lo..hi).for_each(|j| axpy(oi, s[j - lo] / l, &v[row(b, g, j)..][..d]));
            lse[i] = m + l.ln();
        }
    })
}

multiversion! {
    /// The block's P = e^(S − lse) over the keys each row sees (zeros elsewhere) in `s`, and dS = P ∘ (dP − D) in
    /// `ds` (rows of n); lse and D are the block's rows'.
    fn softmax_backward_rows(
        s: &mut [f32],
        ds: &mut [f32],
        blk: Block,
        dims: &Dims,
        p: &FlashParams,
        lse: &[f32],
        delta: &[f32],
    ) {
        let Block { b, i0, rows, lo, n } = blk;
        for i in 0..rows {
            let keys = dims.row_keys(p, b, i0 + i);
            let (s, ds) = (&mut s[i * n..][..n], &mut ds[i * n..][..n]);
            if keys.0 == keys.1 {
                s.fill(0.0);
            } else {
                exp_row(s, lo, keys, lse[i]);
            }
            let di = delta[i];
            ds.iter_mut().zip(s.iter()).for_each(|(ds, p)| *ds = p * (*ds - di));
        }
    }
}

/// FlashAttention-2's backward by query blocks, with matrix products: P = e^(S − lse), dV += Pᵀ dO,
/// dS = P ∘ (dO Vᵀ − D), dQ = scale · dS K, dK += scale · dSᵀ Q over the GQA group's heads. One task per (batch
/// row, KV head), writing the rows of dq of its group's query heads and its rows of dk and dv; lse and D are
/// [B, hq, tq]; dq, dk, dv are one row of d values per (batch row, head, row), in that order, zeros to start (rows no
/// key sees stay so).
fn backward(
    (q, k, v, d_o): (Operand, Operand, Operand, Operand),
    lse: &[f32],
    delta: &[f32],
    dims: Dims,
    p: &FlashParams,
    [mut dq, mut dk, mut dv]: [Vec<&mut [f32]>; 3],
) {
    let Dims { b: batch, hq, hkv, tq, tk, d } = dims;
    let group = hq / hkv;
    assert!(dq.len() == batch * hq * tq && dk.len() == batch * hkv * tk && dv.len() == dk.len());
    let tasks: Vec<_> = dq
        .chunks_mut((group * tq).max(1))
        .zip(dk.chunks_mut(tk.max(1)))
        .zip(dv.chunks_mut(tk.max(1)))
        .enumerate()
        .collect();
    tasks.into_par_iter().for_each(|(bg, ((dq, dk), dv))| {
        let (b, g) = (bg / hkv, bg % hkv);
        let (mut s, mut ds) = (vec![0.0f32; BLOCK.min(tq) * tk], vec![0.0f32; BLOCK.min(tq) * tk]);
        let (mut dk_sum, mut dv_sum, mut dq_blk) =
            (vec![0.0f32; tk * d], vec![0.0f32; tk * d], vec![0.0f32; BLOCK * d]);
        for h in g * group..(g + 1) * group {
            let bh = b * hq + h;
            for i0 in (0..tq).step_by(BLOCK) {
                let rows = BLOCK.min(tq - i0);
                let Some((lo, hi)) = dims.block_keys(p, b, i0, rows) else { continue };
                let n = hi - lo;
                let (q_blk, do_blk) = (q.rows_from(b, h, i0), d_o.rows_from(b, h, i0));
                matmul(rows, n, d, &mut s, n, q_blk, k.transposed_from(b, g, lo), p.scale, false);
                matmul(rows, n, d, &mut ds, n, do_blk, v.transposed_from(b, g, lo), 1.0, false);
                let (lse, delta) = (&lse[bh * tq + i0..], &delta[bh * tq + i0..]);
                softmax_backward_rows(&mut s, &mut ds, Block { b, i0, rows, lo, n }, &dims, p, lse, delta);
                let (p_t, ds_t) = (Mat::transposed(&s, n), Mat::transposed(&ds, n));
                matmul(n, d, rows, &mut dv_sum[lo * d..hi * d], d, p_t, do_blk, 1.0, true);
                matmul(n, d, rows, &mut dk_sum[lo * d..hi * d], d, ds_t, q_blk, p.scale, true);
                matmul(rows, d, n, &mut dq_blk, d, Mat::rows(&ds, n), k.rows_from(b, g, lo), p.scale, false);
                let dq = &mut dq[(h - g * group) * tq + i0..];
                dq.iter_mut().zip(dq_blk.chunks(d).take(rows)).for_each(|(out, row)| out.copy_from_slice(row));
            }
        }
        dk.iter_mut().zip(dk_sum.chunks(d)).for_each(|(out, row)| out.copy_from_slice(row));
        dv.iter_mut().zip(dv_sum.chunks(d)).for_each(|(out, row)| out.copy_from_slice(row));
    });
}

/// x̂ = s · c for int8 codes packed four to a little-endian 32-bit word, one scale per `group` values.
fn dequantize(words: FlexTensor, scales: FlexTensor, group: usize) -> Vec<f32> {
    let scales = contiguous(scales);
    let scales = floats(&scales);
    let words: Vec<i64> = words.into_data().iter::<i64>().collect();
    let codes = words.iter().flat_map(|&w| (w as u32).to_le_bytes().map(|c| c as i8));
    codes.take(scales.len() * group).enumerate().map(|(i, c)| c as f32 * scales[i / group]).collect()
}

impl FlashOps for Flex {
    fn flash_forward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [q] = operands([q]);
        let (qs, ks) = (shape(&q), shape(&k));
        let (batch, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        let (o, lse) = match &params.layout {
            KvLayout::Contiguous => {
                let (hkv, tk) = (ks[1], ks[2]);
                let dims = Dims { b: batch, hq, hkv, tq, tk, d };
                let q_rows = Rows::contiguous(hq, tq, d);
                let (mut k_copy, mut v_copy) = (None, None);
                let (k, v) = (Operand::in_place(&k, &mut k_copy), Operand::in_place(&v, &mut v_copy));
                let mut o = vec![0.0f32; batch * hq * tq * d];
                let lse = forward(Operand::of(&q, q_rows), k, v, dims, &params, rows_of(&mut o, d, batch * hq * tq));
                (o, lse)
            }
            KvLayout::Paged(paging) => {
                let (k, v) = (contiguous(k), contiguous(v));
                // Page pools [pages, Hkv, P, D]: key j of row b is slot j mod P of page table[b][⌊j / P⌋].
                let (hkv, size) = (ks[1], paging.page_size);
                let dims = Dims { b: batch, hq, hkv, tq, tk: paging.keys, d };
                let row = |b: usize, g: usize, j: usize| ((paging.table[b][j / size] * hkv + g) * size + j % size) * d;
                forward_paged(floats(&q), floats(&k), floats(&v), dims, &params, &row)
            }
            KvLayout::Int8 { .. } => panic!("int8 keys and values come through flash_decode_int8"),
        };
        (tensor(o, &qs), tensor(lse, &qs[..3]))
    }
}

impl Int8AttentionOps for Flex {
    fn flash_decode_int8(
        q: FloatTensor<Self>,
        k_codes: IntTensor<Self>,
        k_scales: FloatTensor<Self>,
        v_codes: IntTensor<Self>,
        v_scales: FloatTensor<Self>,
        params: FlashParams,
    ) -> FloatTensor<Self> {
        stay_awake();
        let KvLayout::Int8 { group, keys } = params.layout else { panic!("int8 decoding takes an int8 layout") };
        let q = contiguous(q);
        let qs = shape(&q);
        let (batch, hq, tq, d) = (qs[0], qs[1], qs[2], qs[3]);
        // Token-major [B, Tk, Hkv·D]: four codes per word.
        let hkv = shape(&k_codes)[2] * 4 / d;
        let tk_stored = shape(&k_codes)[1];
        let (k, v) = (dequantize(k_codes, k_scales, group), dequantize(v_codes, v_scales, group));
        let dims = Dims { b: batch, hq, hkv, tq, tk: keys, d };
        let (q_rows, kv_rows) = (Rows::contiguous(hq, tq, d), Rows::interleaved(0, tk_stored, d, hkv * d));
        let q = Operand::of(&q, q_rows);
        let (k, v) = (Operand { data: &k, rows: kv_rows }, Operand { data: &v, rows: kv_rows });
        let mut o = vec![0.0f32; batch * hq * tq * d];
        forward(q, k, v, dims, &params, rows_of(&mut o, d, batch * hq * tq));
        tensor(o, &qs)
    }
}

impl FlashGradOps for Flex {
    fn flash_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        delta: FloatTensor<Self>,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let [q, k, v, d_o, lse, delta] = operands([q, k, v, d_o, lse, delta]);
        let (qs, ks) = (shape(&q), shape(&k));
        let dims = Dims { b: qs[0], hq: qs[1], hkv: ks[1], tq: qs[2], tk: ks[2], d: qs[3] };
        let (q_rows, kv_rows) =
            (Rows::contiguous(dims.hq, dims.tq, dims.d), Rows::contiguous(dims.hkv, dims.tk, dims.d));
        let inputs =
            (Operand::of(&q, q_rows), Operand::of(&k, kv_rows), Operand::of(&v, kv_rows), Operand::of(&d_o, q_rows));
        let (mut dq, mut dk, mut dv) =
            (vec![0.0f32; floats(&q).len()], vec![0.0f32; floats(&k).len()], vec![0.0f32; floats(&v).len()]);
        let Dims { b, hq, hkv, tq, tk, d } = dims;
        let outputs =
            [rows_of(&mut dq, d, b * hq * tq), rows_of(&mut dk, d, b * hkv * tk), rows_of(&mut dv, d, b * hkv * tk)];
        backward(inputs, floats(&lse), floats(&delta), dims, &params, outputs);
        (tensor(dq, &qs), tensor(dk, &ks), tensor(dv, &ks))
    }
}

/// Dims and the rows of q, k, v in a fused projection [B, T, (hq + 2·hkv)·d], and of o [B, T, hq·d].
fn packed(qkv: &FlexTensor, heads: PackedHeads) -> (Dims, [Rows; 4]) {
    let [b, t, width] = <[usize; 3]>::try_from(shape(qkv)).expect("qkv is [B, T, (hq + 2·hkv)·d]");
    let (hq, hkv) = (heads.q, heads.kv);
    let d = width / (hq + 2 * hkv);
    let at = |base| Rows::interleaved(base, t, d, width);
    let rows = [at(0), at(hq * d), at((hq + hkv) * d), Rows::interleaved(0, t, d, hq * d)];
    (Dims { b, hq, hkv, tq: t, tk: t, d }, rows)
}

impl PackedAttentionOps for Flex {
    fn packed_attention_forward(
        qkv: FloatTensor<Self>,
        heads: PackedHeads,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>) {
        let [qkv] = operands([qkv]);
        let (dims, [q, k, v, _]) = packed(&qkv, heads);
        let operand = |rows| Operand::of(&qkv, rows);
        let Dims { b, hq, tq, d, .. } = dims;
        // o [B, T, hq·d]: each row holds every head's.
        let mut out = vec![0.0f32; b * tq * hq * d];
        let [o] = token_major_rows(&mut out, [b, tq, d], [hq]);
        let lse = forward(operand(q), operand(k), operand(v), dims, &params, o);
        (tensor(out, &[b, tq, hq * d]), tensor(lse, &[b, hq, tq]))
    }
}

/// d(qkv) [B, T, (hq + 2·hkv)·d] from dO and the forward's o and lse.
pub(super) fn packed_attention_backward(
    qkv: FloatTensor<Flex>,
    o: FloatTensor<Flex>,
    lse: FloatTensor<Flex>,
    d_o: FloatTensor<Flex>,
    heads: PackedHeads,
    params: FlashParams,
) -> FloatTensor<Flex> {
    let [qkv, o, lse, d_o] = operands([qkv, o, lse, d_o]);
    let (dims, [q, k, v, o_rows]) = packed(&qkv, heads);
    let Dims { hq, tq, d, .. } = dims;
    let (o, d_o) = (Operand::of(&o, o_rows), Operand::of(&d_o, o_rows));
    // D_i = Σ_e dO_ie o_ie, [B, hq, T].
    let mut delta = vec![0.0f32; floats(&lse).len()];
    delta.par_chunks_mut(tq.max(1)).enumerate().for_each(|(bh, delta)| {
        let (b, h) = (bh / hq, bh % hq);
        delta.iter_mut().enumerate().for_each(|(i, di)| *di = dot(d_o.row(b, h, i, d), o.row(b, h, i, d)));
    });
    let mut d_qkv = vec![0.0f32; floats(&qkv).len()];
    // d(qkv) in qkv's layout: each row holds dq's heads, then dk's, then dv's.
    let outputs = token_major_rows(&mut d_qkv, [dims.b, tq, d], [hq, dims.hkv, dims.hkv]);
    let inputs = (Operand::of(&qkv, q), Operand::of(&qkv, k), Operand::of(&qkv, v), d_o);
    backward(inputs, floats(&lse), &delta, dims, &params, outputs);
    tensor(d_qkv, &shape(&qkv))
}
