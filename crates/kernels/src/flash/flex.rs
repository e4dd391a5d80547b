//! The kernels on the CPU (burn-flex): exact attention one query row at a time — the row's scores in a buffer of at
//! most Tk floats, never a T×T matrix — with one rayon task per (batch row, head); the FlashAttention-2 backward
//! recomputes p from the saved lse, one task per (batch row, KV head) so dk and dv need no atomics. Keys and values
//! are read in place: contiguous, through a page table, or as int8 codes dequantized first.

use burn::backend::Flex;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{FloatTensor, IntTensor};
use rayon::prelude::*;

use super::{FlashOps, FlashParams, KvLayout};
use crate::cpu::{contiguous, floats, tensor};

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

/// (o, lse): o_i = Σ_j p_ij v_j with p_ij = e^(s_ij − m_i) / ℓ_i, s_ij = scale · q_i·k_j over the keys row i sees,
/// lse_i = m_i + ln ℓ_i; a row with no key gives zeros (and lse −∞).
fn forward(q: &[f32], k: &[f32], v: &[f32], dims: Dims, p: &FlashParams, row: &RowOf) -> (Vec<f32>, Vec<f32>) {
    let Dims { hq, hkv, tq, tk, d, .. } = dims;
    let mut o = vec![0.0f32; q.len()];
    let mut lse = vec![f32::NEG_INFINITY; q.len() / d.max(1)];
    if o.is_empty() {
        return (o, lse);
    }
    o.par_chunks_mut(tq * d).zip(lse.par_chunks_mut(tq)).enumerate().for_each(|(bh, (o, lse))| {
        let (b, g) = (bh / hq, bh % hq / (hq / hkv));
        let mut s = vec![0.0f32; tk];
        for i in 0..tq {
            let (lo, hi) = dims.row_keys(p, b, i);
            if lo == hi {
                continue;
            }
            let qi = &q[(bh * tq + i) * d..][..d];
            let mut m = f32::NEG_INFINITY;
            for j in lo..hi {
                s[j] = p.scale * dot(qi, &k[row(b, g, j)..][..d]);
                m = m.max(s[j]);
            }
            let oi = &mut o[i * d..][..d];
            let mut l = 0.0f32;
            for j in lo..hi {
                let e = (s[j] - m).exp();
                l += e;
                axpy(oi, e, &v[row(b, g, j)..][..d]);
            }
            oi.iter_mut().for_each(|x| *x /= l);
            lse[i] = m + l.ln();
        }
    });
    (o, lse)
}

/// FlashAttention-2's backward for contiguous q, k, v: p_ij = e^(s_ij − lse_i), dv_j = Σ_i p_ij dO_i,
/// dS_ij = p_ij (dO_i·v_j − D_i), dq_i = scale Σ_j dS_ij k_j, dk_j = scale Σ_i dS_ij q_i over the GQA group's heads.
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
    let Dims { hq, hkv, tq, tk, d, .. } = dims;
    let group = hq / hkv;
    let (mut dq, mut dk, mut dv) = (vec![0.0f32; q.len()], vec![0.0f32; k.len()], vec![0.0f32; v.len()]);
    if q.is_empty() || k.is_empty() {
        return (dq, dk, dv);
    }
    let chunks = dq.par_chunks_mut(group * tq * d).zip(dk.par_chunks_mut(tk * d)).zip(dv.par_chunks_mut(tk * d));
    chunks.enumerate().for_each(|(bg, ((dq, dk), dv))| {
        let b = bg / hkv;
        let (k, v) = (&k[bg * tk * d..][..tk * d], &v[bg * tk * d..][..tk * d]);
        for r in 0..group {
            let h = bg * group + r;
            for i in 0..tq {
                let (lo, hi) = dims.row_keys(p, b, i);
                let at = (h * tq + i) * d;
                let (qi, doi) = (&q[at..][..d], &d_o[at..][..d]);
                let (l, di) = (lse[h * tq + i], delta[h * tq + i]);
                let dqi = &mut dq[(r * tq + i) * d..][..d];
                for j in lo..hi {
                    let (kj, vj) = (&k[j * d..][..d], &v[j * d..][..d]);
                    let pij = (p.scale * dot(qi, kj) - l).exp();
                    let ds = pij * (dot(doi, vj) - di) * p.scale;
                    axpy(&mut dv[j * d..][..d], pij, doi);
                    axpy(dqi, ds, kj);
                    axpy(&mut dk[j * d..][..d], ds, qi);
                }
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
                let row = |b: usize, g: usize, j: usize| ((b * hkv + g) * tk + j) * d;
                forward(floats(&q), floats(&k), floats(&v), dims, &params, &row)
            }
            KvLayout::Paged(paging) => {
                // Page pools [pages, Hkv, P, D]: key j of row b is slot j mod P of page table[b][⌊j / P⌋].
                let (hkv, size) = (ks[1], paging.page_size);
                let dims = Dims { hq, hkv, tq, tk: paging.keys, d };
                let row = |b: usize, g: usize, j: usize| ((paging.table[b][j / size] * hkv + g) * size + j % size) * d;
                forward(floats(&q), floats(&k), floats(&v), dims, &params, &row)
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
        let row = |b: usize, g: usize, j: usize| ((b * tk_stored + j) * hkv + g) * d;
        let (o, _) = forward(floats(&q), &k, &v, dims, &params, &row);
        tensor(o, &qs)
    }
}
