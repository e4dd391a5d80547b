//! What a config costs before a model is built: parameters per part, and KV-cache bytes (2·L·T·g·d_h elements per
//! sequence, L·T·(d_c + d_R) for MLA).

use crate::ModelConfig;
use crate::config::{AttentionKind, FfnKind, NormKind, NormPlacement, PositionKind};

/// Parameter counts by part: embeddings, attention, feed-forward, norms, output projection.
pub fn param_counts(c: &ModelConfig) -> Vec<(&'static str, usize)> {
    let (d, h, dh, l, v) = (c.d_model, c.n_heads, c.head_dim(), c.n_layers, c.vocab_size.unwrap_or(0));
    let b = |n: usize, on: bool| if on { n } else { 0 };
    let linear = |i: usize, o: usize, bias: bool| i * o + b(o, bias);
    let positions = b(c.block_size * d, c.positions == PositionKind::Learned);
    let attention = match c.attention {
        AttentionKind::Mha => linear(d, (h + 2 * c.kv_heads()) * dh, c.qkv_bias()) + linear(h * dh, d, c.bias),
        AttentionKind::Mla => {
            let (dc, dr, qb) = (c.mla_latent_dim.unwrap_or(0), c.mla_rope_dim.unwrap_or(0), c.qkv_bias());
            linear(d, h * dh, qb)
                + linear(d, h * dr, qb)
                + linear(d, dc, qb)
                + linear(d, dr, qb)
                + 2 * linear(dc, h * dh, false)
                + linear(h * dh, d, c.bias)
        }
    };
    let f = c.ffn_dim();
    let ffn = linear(d, f, c.bias) * if c.ffn == FfnKind::Swiglu { 2 } else { 1 } + linear(f, d, c.bias);
    let norm = d + b(d, c.bias && c.norm == NormKind::LayerNorm);
    let norms_per_layer = if c.norm_placement == NormPlacement::Peri { 4 } else { 2 };
    let outer_norms = match c.norm_placement {
        NormPlacement::Post => 0,
        NormPlacement::Pre => 1,
        NormPlacement::Peri => 2,
    };
    vec![
        ("token embedding", v * d),
        ("position embedding", positions),
        ("attention", l * attention),
        ("feed-forward", l * ffn),
        ("norms", (l * norms_per_layer + outer_norms) * norm),
        ("output projection", b(v * d, !c.tie_embeddings)),
    ]
}

/// Cached elements per token per layer: MHA 2·h·d_h, GQA 2·g·d_h, MLA d_c + d_R.
pub fn kv_elements_per_token_layer(c: &ModelConfig) -> usize {
    match c.attention {
        AttentionKind::Mha => 2 * c.kv_heads() * c.head_dim(),
        AttentionKind::Mla => c.mla_latent_dim.unwrap_or(0) + c.mla_rope_dim.unwrap_or(0),
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
    use crate::params::param_infos;
    use crate::{Gpt, Rng};
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
    fn counts_equal_the_parameters_of_built_models() {
        let gpt = ModelConfig::gpt(65, 2, 4, 32, 16);
        let llama = ModelConfig { tie_embeddings: false, ..gpt.clone().llama_style(2) };
        let mla = ModelConfig { norm_placement: NormPlacement::Peri, ..llama.clone().mla_style(16, 4) };
        let post =
            ModelConfig { norm_placement: NormPlacement::Post, positions: PositionKind::Sinusoidal, ..gpt.clone() };
        for c in [gpt, llama, mla, post] {
            let model = Gpt::new(&c, &mut Rng::new(0), &Device::flex());
            let built: usize = param_infos(&model).iter().map(|p| p.shape.iter().product::<usize>()).sum();
            let counted: usize = param_counts(&c).iter().map(|(_, n)| n).sum();
            assert_eq!(counted, built, "{c:?}");
        }
    }
}
