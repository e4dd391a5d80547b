//! Scaled dot-product attention, o = softmax(q kᵀ · scale + mask) v, for q [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D]
//! with Hq a multiple of Hkv (GQA: query head r reads KV head ⌊r / (Hq/Hkv)⌋).

use burn::tensor::activation::softmax;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Distribution, FloatDType, Int, Tensor, TensorData};

use crate::flash::{
    KernelTier, PackedHeads, flash_attention, on_flex, on_wgpu, packed_flash_attention, supports_head_dim,
};
use crate::similarity::{Similarity, similarity_attention};

/// What one attention call computes.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionSpec {
    /// Multiplies q kᵀ; 1/√d_k in the Transformer.
    pub scale: f64,
    /// Query i (at absolute position `query_offset + i`) sees keys j ≤ query_offset + i only.
    pub causal: bool,
    /// Absolute position of the first query row: keys before it come from a cache.
    pub query_offset: usize,
    /// Sliding causal window w: query at position i sees keys i − w < j ≤ i only.
    pub window: Option<usize>,
    /// Valid keys per batch row (padding masks); rows with none give zeros.
    pub key_lengths: Option<Vec<usize>>,
    /// Dropout on the probabilities p while training (on autodiff devices), as in Vaswani et al. (2017) and
    /// nanoGPT; it runs the reference path.
    pub dropout: f64,
    /// Which implementation computes it (softmax attention; another similarity has one implementation).
    pub implementation: AttentionImpl,
    /// κ(q, k): softmax's exp(scale·⟨q, k⟩), or a feature map's φ(q)·φ(k).
    pub similarity: Similarity,
}

impl AttentionSpec {
    /// Causal self-attention over heads of width `head_dim`, scale 1/√head_dim.
    pub fn causal(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f64).sqrt(),
            causal: true,
            query_offset: 0,
            window: None,
            key_lengths: None,
            dropout: 0.0,
            implementation: AttentionImpl::Auto,
            similarity: Similarity::Softmax,
        }
    }

    /// The same attention restricted to a sliding window of `window` keys (none: unrestricted).
    pub fn with_window(self, window: Option<usize>) -> Self {
        Self { window, ..self }
    }

    /// The same attention computed by `implementation`.
    pub fn with_implementation(self, implementation: AttentionImpl) -> Self {
        Self { implementation, ..self }
    }
}

/// Which implementation [`attention`] runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttentionImpl {
    /// Ember's FlashAttention kernels: WGSL on wgpu (the adapter's best tier), Rust on the CPU (the default).
    #[default]
    Auto,
    /// Ember's kernels with the WGSL tier forced (on the CPU: the Rust kernels, as `Auto`).
    Tier(KernelTier),
    /// As `Tier`, with the WGSL backward's dq folded into the dk/dv pass with f32 atomic adds (true: the adapter must
    /// have wgpu `SHADER_FLOAT32_ATOMIC`) or run as a pass of its own (false); `Tier` folds where the adapter has them.
    FoldDq(KernelTier, bool),
    /// As `Tier`, with f16 tiles in workgroup memory and f32 arithmetic (the adapter must have wgpu `SHADER_F16`);
    /// `Tier` and `Auto` use them where q, k and v are f16.
    Half(KernelTier),
    /// The forward's products on 16×16 f16 cooperative matrices with f32 accumulators (tensor cores where wgpu exposes
    /// EXPERIMENTAL_COOPERATIVE_MATRIX), the backward in the adapter's tier with f16 tiles; head widths multiples of
    /// 16. Never picked by `Auto`.
    Cooperative,
    /// The T×T score matrix, masked and soft-maxed with ordinary tensor ops.
    Naive,
    /// Burn's `attention` module op (fused kernels where the backend has them).
    Burn,
}

impl AttentionImpl {
    /// Ember's own kernels, whichever tier.
    pub fn is_ember(self) -> bool {
        matches!(self, Self::Auto | Self::Tier(_) | Self::FoldDq(..) | Self::Half(_) | Self::Cooperative)
    }
}

impl std::str::FromStr for AttentionImpl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "naive" => Ok(Self::Naive),
            "burn" => Ok(Self::Burn),
            "portable" => Ok(Self::Tier(KernelTier::Portable)),
            "subgroup" => Ok(Self::Tier(KernelTier::Subgroup)),
            "portable-f16" => Ok(Self::Half(KernelTier::Portable)),
            "subgroup-f16" => Ok(Self::Half(KernelTier::Subgroup)),
            "cooperative" => Ok(Self::Cooperative),
            _ => Err(format!(
                "unknown attention {s:?}: expected auto, portable, subgroup, portable-f16, subgroup-f16, cooperative, \
                 naive or burn"
            )),
        }
    }
}

/// o = softmax(q kᵀ · scale + mask) v, computed by `spec.implementation`; with another similarity, o = Z⁻¹ A v
/// ([`similarity_attention`]).
pub fn attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    if spec.similarity != Similarity::Softmax {
        // Feature maps (e^(w·x − |x|²/2), elu + 1) and their running sums overflow or lose f16: f32 whatever q's dtype.
        let dtype = FloatDType::from(q.dtype());
        let f32 = |x: Tensor<4>| x.cast(FloatDType::F32);
        return similarity_attention(f32(q), f32(k), f32(v), spec).cast(dtype);
    }
    let [_, hq, _, d] = q.dims();
    let width = d.max(v.dims()[3]);
    let dropping = spec.dropout > 0.0 && q.device().is_autodiff();
    let kernels = (supports_head_dim(width) && on_wgpu(&q)) || on_flex(&q);
    if spec.implementation.is_ember() && !dropping && kernels {
        // Values narrower than queries (MLA's q, k = [q_C; q_R]) are padded with zero columns, and the output cut
        // back; queries and keys narrower than values get zero columns too, which leave q kᵀ unchanged.
        let dv = v.dims()[3];
        let o = flash_attention(zero_pad(q, width), zero_pad(k, width), zero_pad(v, width), spec);
        return if dv < width { o.narrow(3, 0, dv) } else { o };
    }
    let (k, v) = (repeat_kv(k, hq), repeat_kv(v, hq));
    match spec.implementation {
        AttentionImpl::Burn
            if !dropping && spec.query_offset == 0 && spec.window.is_none() && spec.key_lengths.is_none() =>
        {
            // Burn runs its fused kernel only for its default scale 1/√d, which it takes as None.
            let scale = (spec.scale != 1.0 / (d as f64).sqrt()).then_some(spec.scale);
            burn::tensor::module::attention(
                q,
                k,
                v,
                None,
                None,
                AttentionModuleOptions { scale, softcap: None, is_causal: spec.causal },
            )
        }
        _ => naive(q, k, v, spec),
    }
}

/// Self-attention over a fused projection qkv [B, T, (hq + 2·hkv)·d] (query heads, then key heads, then value
/// heads), o's heads concatenated: [B, T, hq·d]. On the CPU Ember's kernels read q, k, v and write o in place;
/// elsewhere, with dropout, or with another implementation chosen, the heads are split, attended and merged.
pub fn packed_attention(qkv: Tensor<3>, heads: PackedHeads, spec: &AttentionSpec) -> Tensor<3> {
    let dropping = spec.dropout > 0.0 && qkv.device().is_autodiff();
    let softmax = spec.similarity == Similarity::Softmax;
    if spec.implementation.is_ember() && !dropping && softmax && crate::cpu::on_cpu(&qkv.device()) {
        return packed_flash_attention(qkv, heads, spec);
    }
    let (q, k, v) = split_heads(qkv, heads);
    merge_heads(attention(q, k, v, spec))
}

/// q [B, hq, T, d] and k, v [B, hkv, T, d] of a fused projection [B, T, (hq + 2·hkv)·d].
pub fn split_heads(qkv: Tensor<3>, heads: PackedHeads) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
    let [b, t, width] = qkv.dims();
    let (hq, hkv) = (heads.q, heads.kv);
    let d = width / (hq + 2 * hkv);
    let part = |from: usize, n: usize| qkv.clone().slice([0..b, 0..t, from * d..(from + n) * d]);
    let split = |z: Tensor<3>, n: usize| z.reshape([b, t, n, d]).swap_dims(1, 2);
    (split(part(0, hq), hq), split(part(hq, hkv), hkv), split(part(hq + hkv, hkv), hkv))
}

/// Heads [B, h, T, d] side by side: [B, T, h·d].
pub fn merge_heads(y: Tensor<4>) -> Tensor<3> {
    let [b, h, t, d] = y.dims();
    y.swap_dims(1, 2).reshape([b, t, h * d])
}

/// The reference: s = q kᵀ · scale, masked (causal: j > query_offset + i; window: j ≤ query_offset + i − w;
/// padding: j ≥ key_length), p = softmax(s), o = dropout(p) v; a row with every key masked gives zeros.
fn naive(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let p = probabilities(q, k, spec);
    if spec.dropout > 0.0 && p.device().is_autodiff() {
        // Inverted dropout: kept probabilities scaled by 1/(1 − p_drop), so E[o] is unchanged.
        let keep = 1.0 - spec.dropout;
        let kept = p.random_like(Distribution::Bernoulli(keep));
        return (p * kept / keep).matmul(v);
    }
    p.matmul(v)
}

/// p = softmax(q kᵀ · scale + mask) [B, H, Tq, Tk].
fn probabilities(q: Tensor<4>, k: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let [b, h, tq, _] = q.dims();
    let tk = k.dims()[2];
    let device = q.device();
    let s = q.matmul(k.swap_dims(2, 3)) * spec.scale;
    let Some(mask) = mask(b, tq, tk, spec, &device) else {
        return softmax(s, 3);
    };
    let s = s.mask_fill(mask.unsqueeze_dim::<4>(1).expand([b, h, tq, tk]), f32::NEG_INFINITY);
    if spec.key_lengths.is_none() {
        return softmax(s, 3);
    }
    // Padding can mask a whole row: p = e^(s − m) / max(ℓ, 1) with m = 0 where the row max is −∞ (ℓ ≥ 1 wherever a
    // key is seen, e^0 at the maximum; 1 keeps the masked row at 0 in f16 too, where f32::MIN_POSITIVE is 0).
    let m = s.clone().max_dim(3);
    let m = m.clone().mask_fill(m.equal_elem(f32::NEG_INFINITY), 0.0);
    let e = (s - m).exp();
    let l = e.clone().sum_dim(3).clamp_min(1.0);
    e / l
}

/// True where query i may not see key j, as [B, Tq, Tk]; None when nothing is masked.
pub(crate) fn mask(b: usize, tq: usize, tk: usize, spec: &AttentionSpec, device: &Device) -> Option<Tensor<3, Bool>> {
    let o = spec.query_offset as i64;
    let mut masked: Option<Tensor<2, Bool>> = None;
    let mut or = |m: Tensor<2, Bool>| masked = Some(masked.take().map_or(m.clone(), |a| a.bool_or(m)));
    if spec.causal {
        or(Tensor::<2, Bool>::tril_mask([tq, tk], o, device)); // j > o + i
    }
    if let Some(w) = spec.window {
        or(Tensor::<2, Bool>::triu_mask([tq, tk], o - w as i64 + 1, device)); // j ≤ o + i − w
    }
    let masked = masked.map(|m| m.unsqueeze::<3>().expand([b, tq, tk]));
    let Some(lengths) = &spec.key_lengths else { return masked };
    let lengths: Vec<i64> = lengths.iter().map(|&l| l as i64).collect();
    let lengths = Tensor::<1, Int>::from_data(TensorData::new(lengths, [b]), device).reshape([b, 1, 1]);
    let j = Tensor::<1, Int>::arange(0..tk as i64, device).reshape([1, 1, tk]);
    let padding = j.greater_equal(lengths).expand([b, tq, tk]);
    Some(masked.map_or(padding.clone(), |m| m.bool_or(padding)))
}

/// x [B, H, T, D] widened to [B, H, T, width] with zero columns.
fn zero_pad(x: Tensor<4>, width: usize) -> Tensor<4> {
    let [b, h, t, d] = x.dims();
    if d == width {
        return x;
    }
    let zeros = Tensor::zeros([b, h, t, width - d], (&x.device(), x.dtype()));
    Tensor::cat(vec![x, zeros], 3)
}

/// K or V of [B, Hkv, T, D] seen as [B, Hq, T, D]: each KV head serves Hq/Hkv consecutive query heads.
pub(crate) fn repeat_kv(x: Tensor<4>, hq: usize) -> Tensor<4> {
    let [b, hkv, t, d] = x.dims();
    if hkv == hq {
        return x;
    }
    x.unsqueeze_dim::<5>(2).expand([b, hkv, hq / hkv, t, d]).reshape([b, hq, t, d])
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_test_support::max_abs_diff_tensors as max_diff;

    #[test]
    fn causal_row_zero_attends_only_to_key_zero() {
        let dev = Device::flex();
        let q = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let k = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::<4>::random([1, 2, 5, 8], Distribution::Normal(0.0, 1.0), &dev);
        let o = naive(q, k, v.clone(), &AttentionSpec::causal(8));
        let first: Tensor<4> = o.slice([0..1, 0..2, 0..1, 0..8]);
        assert!(max_diff(first, v.slice([0..1, 0..2, 0..1, 0..8])) < 1e-6);
    }

    #[test]
    fn query_offset_matches_the_last_rows_of_full_attention() {
        let dev = Device::flex();
        let q = Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &dev);
        let k = Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::<4>::random([2, 2, 6, 4], Distribution::Normal(0.0, 1.0), &dev);
        let full = naive(q.clone(), k.clone(), v.clone(), &AttentionSpec::causal(4));
        let spec = AttentionSpec { query_offset: 4, ..AttentionSpec::causal(4) };
        let tail = naive(q.slice([0..2, 0..2, 4..6, 0..4]), k, v, &spec);
        assert!(max_diff(tail, full.slice([0..2, 0..2, 4..6, 0..4])) < 1e-6);
    }

    #[test]
    fn burn_fused_equals_naive_and_gqa_repeats_kv_heads() {
        let dev = Device::flex();
        let q = Tensor::<4>::random([2, 4, 7, 8], Distribution::Normal(0.0, 1.0), &dev);
        let k = Tensor::<4>::random([2, 2, 7, 8], Distribution::Normal(0.0, 1.0), &dev);
        let v = Tensor::<4>::random([2, 2, 7, 8], Distribution::Normal(0.0, 1.0), &dev);
        let spec = AttentionSpec::causal(8);
        let reference = naive(q.clone(), repeat_kv(k.clone(), 4), repeat_kv(v.clone(), 4), &spec);
        let fused = attention(q.clone(), k.clone(), v.clone(), &spec.clone().with_implementation(AttentionImpl::Burn));
        assert!(max_diff(fused, reference.clone()) < 1e-5);
        // Query head 3 reads KV head 1.
        let one = naive(
            q.slice([0..2, 3..4, 0..7, 0..8]),
            k.slice([0..2, 1..2, 0..7, 0..8]),
            v.slice([0..2, 1..2, 0..7, 0..8]),
            &spec,
        );
        assert!(max_diff(one, reference.slice([0..2, 3..4, 0..7, 0..8])) < 1e-6);
    }

    fn qkv(b: usize, h: usize, t: usize, d: usize) -> [Tensor<4>; 3] {
        let dev = Device::flex();
        [(); 3].map(|_| Tensor::<4>::random([b, h, t, d], Distribution::Normal(0.0, 1.0), &dev))
    }

    #[test]
    fn a_window_of_t_is_full_causal_attention() {
        let [q, k, v] = qkv(2, 3, 9, 8);
        let full = naive(q.clone(), k.clone(), v.clone(), &AttentionSpec::causal(8));
        let windowed = naive(q, k, v, &AttentionSpec::causal(8).with_window(Some(9)));
        assert!(max_diff(full, windowed) < 1e-6);
    }

    #[test]
    fn a_window_of_w_sees_exactly_the_last_w_keys() {
        let [q, k, v] = qkv(1, 2, 8, 4);
        let (w, i) = (3, 6);
        let spec = AttentionSpec::causal(4).with_window(Some(w));
        let windowed = naive(q.clone(), k.clone(), v.clone(), &spec).slice([0..1, 0..2, i..i + 1, 0..4]);
        // Row i alone against keys i − w + 1 ..= i, unmasked.
        let keys = (i + 1 - w)..(i + 1);
        let spec = AttentionSpec { causal: false, ..AttentionSpec::causal(4) };
        let row = naive(
            q.slice([0..1, 0..2, i..i + 1, 0..4]),
            k.slice([0..1, 0..2, keys.clone(), 0..4]),
            v.slice([0..1, 0..2, keys, 0..4]),
            &spec,
        );
        assert!(max_diff(windowed, row) < 1e-6);
    }

    #[test]
    fn a_fully_masked_row_gives_zeros_not_nan() {
        let [q, k, v] = qkv(2, 2, 5, 4);
        let spec = AttentionSpec { causal: false, key_lengths: Some(vec![0, 3]), ..AttentionSpec::causal(4) };
        let o = naive(q.clone(), k.clone(), v.clone(), &spec);
        let empty = o.clone().slice([0..1, 0..2, 0..5, 0..4]).into_data().try_to_vec::<f32>().unwrap();
        assert!(empty.iter().all(|&x| x == 0.0), "{empty:?}");
        // The second row sees its first three keys only.
        let spec = AttentionSpec { causal: false, ..AttentionSpec::causal(4) };
        let three = naive(
            q.slice([1..2, 0..2, 0..5, 0..4]),
            k.slice([1..2, 0..2, 0..3, 0..4]),
            v.slice([1..2, 0..2, 0..3, 0..4]),
            &spec,
        );
        assert!(max_diff(o.slice([1..2, 0..2, 0..5, 0..4]), three) < 1e-6);
    }

    #[test]
    fn attention_dropout_acts_while_training_only_and_keeps_the_expectation() {
        // 2,048 rows of 32 keys: the mean of o has a standard deviation near 0.01.
        let [q, k, _] = qkv(16, 4, 32, 8);
        let v = Tensor::<4>::ones([16, 4, 32, 8], &Device::flex());
        let spec = AttentionSpec { causal: false, dropout: 0.5, ..AttentionSpec::causal(8) };
        // Inference: no dropout, and each row of p sums to 1, so o = 1 everywhere.
        let o = naive(q.clone(), k.clone(), v.clone(), &spec);
        assert!(max_diff(o, v.clone()) < 1e-5);
        // Training: o = Σ_j m_j p_j / (1 − p_drop) with Bernoulli masks m: rows differ from 1, their mean does not.
        let device = Device::flex().autodiff();
        let on = |x: Tensor<4>| Tensor::<4>::from_data(x.into_data(), &device);
        let o = naive(on(q), on(k), on(v.clone()), &spec).into_data().try_to_vec::<f32>().unwrap();
        let mean = o.iter().sum::<f32>() / o.len() as f32;
        let moved = o.iter().filter(|&&x| (x - 1.0).abs() > 1e-3).count();
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!(moved > o.len() / 2, "{moved} of {} rows changed", o.len());
    }
}
