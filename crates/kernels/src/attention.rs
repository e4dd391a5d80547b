//! Scaled dot-product attention, o = softmax(q kᵀ · scale + mask) v, for q [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D]
//! with Hq a multiple of Hkv (GQA: query head r reads KV head ⌊r / (Hq/Hkv)⌋).

use burn::tensor::activation::softmax;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Distribution, FloatDType, Tensor};

use crate::cpu::on_cpu;
use crate::flash::{flash_attention, packed_flash_attention, supports_head_dim};
use crate::similarity::similarity_attention;
use crate::spec::{AttentionAlgorithm, AttentionSpec, PackedHeads, Similarity, mask, repeat_kv};
use crate::wgsl::on_wgpu;

/// o = softmax(q kᵀ · scale + mask) v, computed by `spec.algorithm`; with another similarity, o = Z⁻¹ A v
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
    let device = q.device();
    let kernels = (supports_head_dim(width) && on_wgpu(&device)) || on_cpu(&device);
    if spec.algorithm == AttentionAlgorithm::Ember && !dropping && spec.softcap.is_none() && kernels {
        // Values narrower than queries (MLA's q, k = [q_C; q_R]) are padded with zero columns, and the output cut
        // back; queries and keys narrower than values get zero columns too, which leave q kᵀ unchanged.
        let dv = v.dims()[3];
        let o = flash_attention(zero_pad(q, width), zero_pad(k, width), zero_pad(v, width), spec);
        return if dv < width { o.narrow(3, 0, dv) } else { o };
    }
    let (k, v) = (repeat_kv(k, hq), repeat_kv(v, hq));
    match spec.algorithm {
        AttentionAlgorithm::Burn
            if !dropping
                && spec.softcap.is_none()
                && spec.query_offset == 0
                && spec.window.is_none()
                && spec.key_lengths.is_none() =>
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
        _ => reference_attention(q, k, v, spec),
    }
}

/// Self-attention over a fused projection qkv [B, T, (hq + 2·hkv)·d] (query heads, then key heads, then value
/// heads), o's heads concatenated: [B, T, hq·d]. On the CPU Ember's kernels read q, k, v and write o in place;
/// elsewhere, with dropout, or with another algorithm chosen, the heads are split, attended and merged.
pub fn packed_attention(qkv: Tensor<3>, heads: PackedHeads, spec: &AttentionSpec) -> Tensor<3> {
    let dropping = spec.dropout > 0.0 && qkv.device().is_autodiff();
    let softmax = spec.similarity == Similarity::Softmax && spec.softcap.is_none();
    if spec.algorithm == AttentionAlgorithm::Ember && !dropping && softmax && on_cpu(&qkv.device()) {
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

/// The specification every attention kernel is tested against: s = q kᵀ · scale (soft-capped to c·tanh(s / c) when
/// the spec has a cap), masked ([`mask`]: causal,
/// window, padding), p = softmax(s), o = dropout(p) v, for k and v with as many heads as q; a row with every key
/// masked gives zeros.
pub fn reference_attention(q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let p = probabilities(q, k, spec);
    if spec.dropout > 0.0 && p.device().is_autodiff() {
        // Inverted dropout: kept probabilities scaled by 1/(1 − p_drop), so E[o] is unchanged.
        let keep = 1.0 - spec.dropout;
        let kept = p.random_like(Distribution::Bernoulli(keep));
        return (p * kept / keep).matmul(v);
    }
    p.matmul(v)
}

/// p = softmax(cap(q kᵀ · scale) + mask) [B, H, Tq, Tk].
fn probabilities(q: Tensor<4>, k: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
    let [b, h, tq, _] = q.dims();
    let tk = k.dims()[2];
    let device = q.device();
    let s = q.matmul(k.swap_dims(2, 3)) * spec.scale;
    let s = match spec.softcap {
        Some(c) => (s / c).tanh() * c,
        None => s,
    };
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

/// x [B, H, T, D] widened to [B, H, T, width] with zero columns.
fn zero_pad(x: Tensor<4>, width: usize) -> Tensor<4> {
    let [b, h, t, d] = x.dims();
    if d == width {
        return x;
    }
    let zeros = Tensor::zeros([b, h, t, width - d], (&x.device(), x.dtype()));
    Tensor::cat(vec![x, zeros], 3)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::Device;
    use ember_test_support::max_abs_diff_tensors as max_diff;

    #[test]
    fn causal_row_zero_attends_only_to_key_zero() {
        let [q, k, v] = qkv(1, 2, 5, 8);
        let o = reference_attention(q, k, v.clone(), &AttentionSpec::causal(8));
        let first: Tensor<4> = o.slice([0..1, 0..2, 0..1, 0..8]);
        assert!(max_diff(first, v.slice([0..1, 0..2, 0..1, 0..8])) < 1e-6);
    }

    #[test]
    fn query_offset_matches_the_last_rows_of_full_attention() {
        let [q, k, v] = qkv(2, 2, 6, 4);
        let full = reference_attention(q.clone(), k.clone(), v.clone(), &AttentionSpec::causal(4));
        let spec = AttentionSpec { query_offset: 4, ..AttentionSpec::causal(4) };
        let tail = reference_attention(q.slice([0..2, 0..2, 4..6, 0..4]), k, v, &spec);
        assert!(max_diff(tail, full.slice([0..2, 0..2, 4..6, 0..4])) < 1e-6);
    }

    #[test]
    fn burn_fused_equals_naive_and_gqa_repeats_kv_heads() {
        let ([q, _, _], [k, v, _]) = (qkv(2, 4, 7, 8), qkv(2, 2, 7, 8));
        let spec = AttentionSpec::causal(8);
        let reference = reference_attention(q.clone(), repeat_kv(k.clone(), 4), repeat_kv(v.clone(), 4), &spec);
        let fused = attention(q.clone(), k.clone(), v.clone(), &spec.clone().with_algorithm(AttentionAlgorithm::Burn));
        assert!(max_diff(fused, reference.clone()) < 1e-5);
        // Query head 3 reads KV head 1.
        let one = reference_attention(
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
        let full = reference_attention(q.clone(), k.clone(), v.clone(), &AttentionSpec::causal(8));
        let windowed = reference_attention(q, k, v, &AttentionSpec::causal(8).with_window(Some(9)));
        assert!(max_diff(full, windowed) < 1e-6);
    }

    #[test]
    fn a_window_of_w_sees_exactly_the_last_w_keys() {
        let [q, k, v] = qkv(1, 2, 8, 4);
        let (w, i) = (3, 6);
        let spec = AttentionSpec::causal(4).with_window(Some(w));
        let windowed = reference_attention(q.clone(), k.clone(), v.clone(), &spec).slice([0..1, 0..2, i..i + 1, 0..4]);
        // Row i alone against keys i − w + 1 ..= i, unmasked.
        let keys = (i + 1 - w)..(i + 1);
        let spec = AttentionSpec { causal: false, ..AttentionSpec::causal(4) };
        let row = reference_attention(
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
        let o = reference_attention(q.clone(), k.clone(), v.clone(), &spec);
        let empty = o.clone().slice([0..1, 0..2, 0..5, 0..4]).into_data().try_to_vec::<f32>().unwrap();
        assert!(empty.iter().all(|&x| x == 0.0), "{empty:?}");
        // The second row sees its first three keys only.
        let spec = AttentionSpec { causal: false, ..AttentionSpec::causal(4) };
        let three = reference_attention(
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
        let o = reference_attention(q.clone(), k.clone(), v.clone(), &spec);
        assert!(max_diff(o, v.clone()) < 1e-5);
        // Training: o = Σ_j m_j p_j / (1 − p_drop) with Bernoulli masks m: rows differ from 1, their mean does not.
        let device = Device::flex().autodiff();
        let on = |x: Tensor<4>| Tensor::<4>::from_data(x.into_data(), &device);
        let o = reference_attention(on(q), on(k), on(v.clone()), &spec).into_data().try_to_vec::<f32>().unwrap();
        let mean = o.iter().sum::<f32>() / o.len() as f32;
        let moved = o.iter().filter(|&&x| (x - 1.0).abs() > 1e-3).count();
        assert!((mean - 1.0).abs() < 0.05, "mean {mean}");
        assert!(moved > o.len() / 2, "{moved} of {} rows changed", o.len());
    }
}
