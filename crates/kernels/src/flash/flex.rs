//! The kernels on the CPU (burn-flex): exact attention by blocks of 64 query rows — the block's scores in a buffer of
//! 64 × Tk floats, never a T×T matrix, the products as matrix kernels — with one rayon task per (batch row, head);
//! the FlashAttention-2 backward recomputes p from the saved lse, one task per (batch row, KV head) so dk and dv need
//! no atomics. Keys and values are read in place: contiguous or as int8 codes dequantized first, and through a page
//! table one query row at a time.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use rayon::prelude::*;

use super::{FlashOps, FlashParams, KvLayout};
use crate::cpu::{Mat, contiguous, floats, matmul, tensor};
use crate::math;

/// One call's shapes: q [b, hq, tq, d], keys and values [b, hkv, tk, d] (logically).
#[derive(Clone, Copy)]
struct Dims {
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
}

/// Where key/value row j of KV head g, batch row b starts in its buffer.
type RowOf<'a> = dyn Fn(usize, usize, usize) -> usize + Sync + 'a;

fn shape(t: &FlexTensor) -> Vec<usize> {
    t.layout().shape().to_vec()
}

/// Σ_e a_e b_e, eight partial sums so the compiler can vectorise it.
fn dot(a: &[f32], b: &[f32]) -> f32 {
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

/// y ← y + α x.
fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    y.iter_mut().zip(x).for_each(|(y, x)| *y += alpha * x);
}

/// Query rows per block of the matrix-product kernels: a block's scores take BLOCK × Tk floats.
const BLOCK: usize = 64;

/// The blocks of query rows of batch row b that see any key: (first row, rows, keys [lo, hi) any of them sees).
fn blocks<'a>(dims: &'a Dims, p: &'a FlashParams, b: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> + 'a {
    (0..dims.tq).step_by(BLOCK).filter_map(move |i0| {
        let rows = BLOCK.min(dims.tq - i0);
        let ranges = (i0..i0 + rows).map(|i| dims.row_keys(p, b, i)).filter(|(lo, hi)| lo < hi);
        let (lo, hi) = ranges.fold((usize::MAX, 0), |(lo, hi), (a, z)| (lo.min(a), hi.max(z)));
        (lo < hi).then_some((i0, rows, lo, hi))
    })
}

/// p_ij = e^(s_ij − c_i) over the keys [a, z) row i sees (keys [lo, lo + n) in `s`), 0 elsewhere; returns Σ_j p_ij.
fn exp_row(s: &mut [f32], lo: usize, (a, z): (usize, usize), c: f32) -> f32 {
    let mut l = 0.0;
    for (j, x) in s.iter_mut().enumerate() {
        *x = if (a..z).contains(&(lo + j)) { math::exp(*x - c) } else { 0.0 };
        l += *x;
    }
    l
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

/// Where the keys and values of (batch row, KV head) start, and how far apart consecutive keys are.
struct KvRows<'a> {
    start: &'a (dyn Fn(usize, usize) -> usize + Sync),
    stride: usize,
}

/// (o, lse) by query blocks: S = scale · Q_blk Kᵀ, p_ij = e^(s_ij − m_i) / ℓ_i over the keys row i sees, O_blk = P V
/// (matrix products), lse_i = m_i + ln ℓ_i; a row with no key gives zeros (and lse −∞).
fn forward(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: &FlashParams, kv: &KvRows) -> (Vec<f32>, Vec<f32>) {
    let Dims { tq, tk, d, .. } = dims;
    per_head(q.len(), dims, |bh, b, g, o, lse| {
        let at = (kv.start)(b, g);
        let mut s = vec![0.0f32; BLOCK.min(tq) * tk];
        for (i0, rows, lo, hi) in blocks(&dims, p, b) {
            let n = hi - lo;
            let q_blk = Mat::rows(&q[(bh * tq + i0) * d..], d);
            let k_t = Mat::transposed(&k[at + lo * kv.stride..], kv.stride);
            matmul(rows, n, d, &mut s, n, q_blk, k_t, p.scale, false);
            let mut inv_l = [0.0f32; BLOCK];
            for r in 0..rows {
                let keys = dims.row_keys(p, b, i0 + r);
                let row = &mut s[r * n..][..n];
                if keys.0 == keys.1 {
                    row.fill(0.0);
                    continue;
                }
                let m = row[keys.0 - lo..keys.1 - lo].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
                let l = exp_row(row, lo, keys, m);
                lse[i0 + r] = m + l.ln();
                inv_l[r] = 1.0 / l;
            }
            let o_blk = &mut o[i0 * d..(i0 + rows) * d];
            matmul(rows, d, n, o_blk, d, Mat::rows(&s, n), Mat::rows(&v[at + lo * kv.stride..], kv.stride), 1.0, false);
            o_blk.chunks_mut(d).zip(inv_l).for_each(|(o, f)| o.iter_mut().for_each(|x| *x *= f));
        }
    })
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
            let m = s[..hi - lo].iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
            let l = exp_row(&mut s[..hi - lo], lo, keys, m);
            let oi = &mut o[i * d..][..d];
            (lo..hi).for_each(|j| axpy(oi, s[j - lo] / l, &v[row(b, g, j)..][..d]));
            lse[i] = m + l.ln();
        }
    })
}

/// FlashAttention-2's backward for contiguous q, k, v by query blocks, with matrix products: P = e^(S − lse),
/// dV += Pᵀ dO, dS = P ∘ (dO Vᵀ − D), dQ = scale · dS K, dK += scale · dSᵀ Q over the GQA group's heads.
#[allow(clippy::too_many_arguments)]
fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_o: &[f32],
    lse: &[f32],
    delta: &[f32],
    dims: Dims,
    p: &FlashParams,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let Dims { hq, hkv, tq, tk, d } = dims;
    let group = hq / hkv;
    let (mut dq, mut dk, mut dv) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()], vec![0.0f32; v.len()]);
    if q.is_empty() || k.is_empty() {
        return (dq, dk, dv);
    }
    let chunks = dq.par_chunks_mut(group * tq * d).zip(dk.par_chunks_mut(tk * d)).zip(dv.par_chunks_mut(tk * d));
    chunks.enumerate().for_each(|(bg, ((dq, dk), dv))| {
        let b = bg / hkv;
        let (k, v) = (&k[bg * tk * d..][..tk * d], &v[bg * tk * d..][..tk * d]);
        let (mut s, mut ds) = (vec![0.0f32; BLOCK.min(tq) * tk], vec![0.0f32; BLOCK.min(tq) * tk]);
        for r in 0..group {
            let h = bg * group + r;
            for (i0, rows, lo, hi) in blocks(&dims, p, b) {
                let n = hi - lo;
                let at = (h * tq + i0) * d;
                let (q_blk, do_blk) = (Mat::rows(&q[at..], d), Mat::rows(&d_o[at..], d));
                let (k_rng, v_rng) = (&k[lo * d..hi * d], &v[lo * d..hi * d]);
                matmul(rows, n, d, &mut s, n, q_blk, Mat::transposed(k_rng, d), p.scale, false);
                matmul(rows, n, d, &mut ds, n, do_blk, Mat::transposed(v_rng, d), 1.0, false);
                for i in 0..rows {
                    let keys = dims.row_keys(p, b, i0 + i);
                    let (s, ds) = (&mut s[i * n..][..n], &mut ds[i * n..][..n]);
                    if keys.0 == keys.1 {
                        s.fill(0.0);
                    } else {
                        exp_row(s, lo, keys, lse[h * tq + i0 + i]);
                    }
                    let di = delta[h * tq + i0 + i];
                    ds.iter_mut().zip(s.iter()).for_each(|(ds, p)| *ds = p * (*ds - di));
                }
                let (p_t, ds_t) = (Mat::transposed(&s, n), Mat::transposed(&ds, n));
                matmul(n, d, rows, &mut dv[lo * d..hi * d], d, p_t, do_blk, 1.0, true);
                matmul(n, d, rows, &mut dk[lo * d..hi * d], d, ds_t, q_blk, p.scale, true);
                let dq_blk = &mut dq[(r * tq + i0) * d..(r * tq + i0 + rows) * d];
                matmul(rows, d, n, dq_blk, d, Mat::rows(&ds, n), Mat::rows(k_rng, d), p.scale, false);
            }
        }
    });
    (dq, dk, dv)
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
        let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
        let (qs, ks) = (shape(&q), shape(&k));
        let (hq, tq, d) = (qs[1], qs[2], qs[3]);
        let (o, lse) = match &params.layout {
            KvLayout::Contiguous => {
                let (hkv, tk) = (ks[1], ks[2]);
                let dims = Dims { hq, hkv, tq, tk, d };
                let kv = KvRows { start: &|b, g| (b * hkv + g) * tk * d, stride: d };
                forward(floats(&q), floats(&k), floats(&v), dims, &params, &kv)
            }
            KvLayout::Paged(paging) => {
                // Page pools [pages, Hkv, P, D]: key j of row b is slot j mod P of page table[b][⌊j / P⌋].
                let (hkv, size) = (ks[1], paging.page_size);
                let dims = Dims { hq, hkv, tq, tk: paging.keys, d };
                let row = |b: usize, g: usize, j: usize| ((paging.table[b][j / size] * hkv + g) * size + j % size) * d;
                forward_paged(floats(&q), floats(&k), floats(&v), dims, &params, &row)
            }
            KvLayout::Int8 { .. } => panic!("int8 keys and values come through flash_decode_int8"),
        };
        (tensor(o, &qs), tensor(lse, &qs[..3]))
    }

    fn flash_backward(
        q: FloatTensor<Self>,
        k: FloatTensor<Self>,
        v: FloatTensor<Self>,
        d_o: FloatTensor<Self>,
        lse: FloatTensor<Self>,
        delta: FloatTensor<Self>,
        params: FlashParams,
    ) -> (FloatTensor<Self>, FloatTensor<Self>, FloatTensor<Self>) {
        let (q, k, v) = (contiguous(q), contiguous(k), contiguous(v));
        let (d_o, lse, delta) = (contiguous(d_o), contiguous(lse), contiguous(delta));
        let (qs, ks) = (shape(&q), shape(&k));
        let dims = Dims { hq: qs[1], hkv: ks[1], tq: qs[2], tk: ks[2], d: qs[3] };
        let (q_, k_, v_) = (floats(&q), floats(&k), floats(&v));
        let (dq, dk, dv) = backward(q_, k_, v_, floats(&d_o), floats(&lse), floats(&delta), dims, &params);
        (tensor(dq, &qs), tensor(dk, &ks), tensor(dv, &ks))
    }

    fn flash_decode_int8(
        q: FloatTensor<Self>,
        k_codes: IntTensor<Self>,
        k_scales: FloatTensor<Self>,
        v_codes: IntTensor<Self>,
        v_scales: FloatTensor<Self>,
        params: FlashParams,
    ) -> FloatTensor<Self> {
        let KvLayout::Int8 { group, keys } = params.layout else { panic!("int8 decoding takes an int8 layout") };
        let q = contiguous(q);
        let qs = shape(&q);
        let (hq, tq, d) = (qs[1], qs[2], qs[3]);
        // Token-major [B, Tk, Hkv·D]: four codes per word.
        let hkv = shape(&k_codes)[2] * 4 / d;
        let tk_stored = shape(&k_codes)[1];
        let (k, v) = (dequantize(k_codes, k_scales, group), dequantize(v_codes, v_scales, group));
        let dims = Dims { hq, hkv, tq, tk: keys, d };
        let kv = KvRows { start: &|b, g| (b * tk_stored * hkv + g) * d, stride: hkv * d };
        let (o, _) = forward(floats(&q), &k, &v, dims, &params, &kv);
        tensor(o, &qs)
    }
}
