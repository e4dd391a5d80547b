//! What a config costs before a model is built: parameters per part, and KV-cache bytes (2·L·T·g·d_h elements per
//! sequence, L·T·(d_c + d_R) for MLA, L·g·(r·d_h + r) at any length for linear attention's recurrent state).

use ember_formats::config::ModelConfig;
use ember_formats::config::{
    AttentionKernel, AttentionKind, DEFAULT_FAVOR_FEATURES, FfnKind, NormKind, NormPlacement, PositionKind,
};

/// Parameter counts by part: embeddings, attention, feed-forward, norms, output projection. Computed in 128 bits,
/// saturating, so a config of any size has an answer (and can be refused for it) before anything is allocated.
pub fn param_counts(c: &ModelConfig) -> Vec<(&'static str, u128)> {
    let n = |x: usize| x as u128;
    let (d, h, dh, l, v) = (n(c.d_model), n(c.n_heads), n(c.head_dim()), n(c.n_layers), n(c.vocab_size.unwrap_or(0)));
    let mul = |a: u128, b: u128| a.saturating_mul(b);
    let b = |x: u128, on: bool| if on { x } else { 0 };
    let linear = |i: u128, o: u128, bias: bool| mul(i, o).saturating_add(b(o, bias));
    let positions = b(mul(n(c.block_size), d), c.positions == PositionKind::Learned);
    let attention = match c.attention {
        AttentionKind::Mha => {
            let qkv = mul(h.saturating_add(mul(2, n(c.kv_heads()))), dh);
            linear(d, qkv, c.qkv_bias()).saturating_add(linear(mul(h, dh), d, c.bias))
        }
        AttentionKind::Mla => {
            let (dc, dr, qb) = (n(c.mla_latent_dim.unwrap_or(0)), n(c.mla_rope_dim.unwrap_or(0)), c.qkv_bias());
            // Queries from x, or through W_DQ and its RMSNorm (the bias then W_DQ's).
            let (dq, bottleneck) = match c.mla_q_rank.map(n) {
                Some(r) => (r, linear(d, r, qb).saturating_add(r)),
                None => (d, 0),
            };
            let q_bias = qb && c.mla_q_rank.is_none();
            [
                bottleneck,
                linear(dq, mul(h, dh), q_bias),
                linear(dq, mul(h, dr), q_bias),
                linear(d, dc, qb),
                b(dc, c.mla_latent_norm),
                linear(d, dr, qb),
                mul(2, linear(dc, mul(h, dh), false)),
                linear(mul(h, dh), d, c.bias),
            ]
            .into_iter()
            .fold(0, u128::saturating_add)
        }
    };
    let f = n(c.ffn_dim());
    let gates = if matches!(c.ffn, FfnKind::Swiglu | FfnKind::Geglu) { 2 } else { 1 };
    let ffn = mul(linear(d, f, c.bias), gates).saturating_add(linear(f, d, c.bias));
    let norm = d.saturating_add(b(d, c.bias && c.norm == NormKind::LayerNorm));
    let norms_per_layer = if c.norm_placement.has_output_norms() { 4 } else { 2 };
    let outer_norms = match c.norm_placement {
        NormPlacement::Post => 0,
        NormPlacement::Pre | NormPlacement::Sandwich => 1,
        NormPlacement::Peri => 2,
    };
    vec![
        ("token embedding", mul(v, d)),
        ("position embedding", positions),
        ("attention", mul(l, attention)),
        ("feed-forward", mul(l, ffn)),
        (
            "norms",
            mul(mul(l, norms_per_layer).saturating_add(outer_norms), norm)
                .saturating_add(mul(l, b(mul(2, dh), c.qk_norm))),
        ),
        ("output projection", b(mul(v, d), !c.tie_embeddings)),
    ]
}

/// All parameters of a config (saturating).
pub fn total_params(c: &ModelConfig) -> u128 {
    param_counts(c).iter().map(|(_, n)| *n).fold(0, u128::saturating_add)
}

/// Cached elements per token per layer: MHA 2·h·d_h, GQA 2·g·d_h, MLA d_c + d_R.
pub fn kv_elements_per_token_layer(c: &ModelConfig) -> usize {
    match c.attention {
        AttentionKind::Mha => 2 * c.kv_heads() * c.head_dim(),
        AttentionKind::Mla => c.mla_latent_dim.unwrap_or(0) + c.mla_rope_dim.unwrap_or(0),
    }
}

/// Elements of linear attention's recurrent state per sequence and layer, whatever its length: g·(r·d_v + r) for
/// S = Σ φ(k) vᵀ and z = Σ φ(k) per KV head, with r features (d_h for elu + 1 and relu; FAVOR+'s random features).
pub fn state_elements_per_layer(c: &ModelConfig, features: usize) -> usize {
    c.kv_heads() * (features * c.head_dim() + features)
}

/// The features φ maps a head to: d_h for elu + 1 and relu, r for FAVOR+; None for softmax, which keeps its keys.
pub fn state_features(c: &ModelConfig) -> Option<usize> {
    match c.attention_kernel {
        AttentionKernel::Softmax => None,
        AttentionKernel::Linear => Some(c.head_dim()),
        AttentionKernel::Favor => Some(c.favor_features.unwrap_or(DEFAULT_FAVOR_FEATURES)),
    }
}

/// KV-cache bytes for `batch` sequences of `length` tokens at `bytes_per_element`, over every layer; None past
/// 2^128 bytes (sizes given on the command line can be anything).
pub fn kv_cache_bytes(c: &ModelConfig, batch: usize, length: usize, bytes_per_element: usize) -> Option<u128> {
    [kv_elements_per_token_layer(c), c.n_layers, bytes_per_element, batch, length]
        .into_iter()
        .try_fold(1u128, |product, n| product.checked_mul(n as u128))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::init::Build;
    use crate::params::param_infos;
    use crate::{CausalLm, Rng};
    use burn::tensor::Device;

    #[test]
    fn llama2_7b_at_8k_tokens_mha_4gib_gqa_1gib_mqa_128mib() {
        // 32 layers, h = 32, d_h = 128, T = 8192, 2 bytes per element.
        let mha = ModelConfig::gpt(32_000, 32, 32, 4096, 8192);
        let gib = 1u128 << 30;
        assert_eq!(kv_cache_bytes(&mha, 1, 8192, 2), Some(4 * gib));
        assert_eq!(kv_cache_bytes(&ModelConfig { n_kv_heads: Some(8), ..mha.clone() }, 1, 8192, 2), Some(gib));
        assert_eq!(kv_cache_bytes(&ModelConfig { n_kv_heads: Some(1), ..mha.clone() }, 1, 8192, 2), Some(128 << 20));
        assert_eq!(kv_cache_bytes(&mha, usize::MAX, usize::MAX, 2), None);
    }

    #[test]
    fn a_linear_attention_state_is_r_by_d_plus_r_per_kv_head() {
        // 12 heads of 64: elu + 1 keeps 12·(64·64 + 64) elements per layer, at any length.
        let gpt2 =
            ModelConfig { attention_kernel: AttentionKernel::Linear, ..ModelConfig::gpt(50_257, 12, 12, 768, 1024) };
        assert_eq!(state_features(&gpt2), Some(64));
        assert_eq!(state_elements_per_layer(&gpt2, 64), 12 * (64 * 64 + 64));
        let favor = ModelConfig { attention_kernel: AttentionKernel::Favor, favor_features: Some(128), ..gpt2 };
        assert_eq!(state_features(&favor), Some(128));
    }

    #[test]
    fn counts_equal_the_parameters_of_built_models() {
        let gpt = ModelConfig::gpt(65, 2, 4, 32, 16);
        let llama = ModelConfig { tie_embeddings: false, ..gpt.clone().llama_style(2) };
        let mla = ModelConfig { norm_placement: NormPlacement::Peri, ..llama.clone().mla_style(16, 4) };
        let post =
            ModelConfig { norm_placement: NormPlacement::Post, positions: PositionKind::Sinusoidal, ..gpt.clone() };
        let gemma = ModelConfig {
            ffn: FfnKind::Geglu,
            norm_placement: NormPlacement::Sandwich,
            qk_norm: true,
            head_dim: Some(16),
            ..llama.clone()
        };
        for c in [gpt, llama, mla, post, gemma] {
            let model = CausalLm::new(&c, &mut Rng::new(0), &Device::flex());
            let built: usize = param_infos(&model).iter().map(|p| p.shape.iter().product::<usize>()).sum();
            assert_eq!(total_params(&c), built as u128, "{c:?}");
        }
    }
}
