//! What a config costs before a model is built: parameters per part, and KV-cache bytes (2·L·T·g·d_h elements per
//! sequence, L·T·(d_c + d_R) for MLA, L·g·(r·d_h + r) at any length for linear attention's recurrent state).

use ember_formats::config::ModelConfig;
use ember_formats::config::{
    AttentionKernel, AttentionKind, DEFAULT_FAVOR_FEATURES, FfnKind, NormKind, NormPlacement, PositionKind,
};

use crate::seq2seq::Seq2SeqConfig;

/// One layer's parameters by part.
struct Layer {
    attention: u128,
    ffn: u128,
    /// One norm: γ, and β for LayerNorm with biases.
    norm: u128,
    /// Per-head q/k norms of a self-attention (Gemma 3, Qwen3).
    qk_norm: u128,
    /// Multi-head attention over another sequence (an encoder–decoder's cross-attention): q, k, v and o projections
    /// as MHA's self-attention has them, whatever `attention` is.
    cross_attention: u128,
}

fn layer(c: &ModelConfig) -> Layer {
    let n = |x: usize| x as u128;
    let (d, h, dh) = (n(c.d_model), n(c.n_heads), n(c.head_dim()));
    let mul = |a: u128, b: u128| a.saturating_mul(b);
    let b = |x: u128, on: bool| if on { x } else { 0 };
    let linear = |i: u128, o: u128, bias: bool| mul(i, o).saturating_add(b(o, bias));
    let qkv = mul(h.saturating_add(mul(2, n(c.kv_heads()))), dh);
    let mha = linear(d, qkv, c.qkv_bias()).saturating_add(linear(mul(h, dh), d, c.bias));
    let attention = match c.attention {
        AttentionKind::Mha => mha,
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
    Layer {
        attention,
        ffn: mul(linear(d, f, c.bias), gates).saturating_add(linear(f, d, c.bias)),
        norm: d.saturating_add(b(d, c.bias && c.norm == NormKind::LayerNorm)),
        qk_norm: b(mul(2, dh), c.qk_norm),
        cross_attention: mha,
    }
}

/// Norms around each sublayer: the input's, and the output's too for Peri-LN and sandwich norms.
fn norms_per_sublayer(c: &ModelConfig) -> u128 {
    if c.norm_placement.has_output_norms() { 2 } else { 1 }
}

/// Parameter counts by part: embeddings, attention, feed-forward, norms, output projection. Computed in 128 bits,
/// saturating, so a config of any size has an answer (and can be refused for it) before anything is allocated.
pub fn param_counts(c: &ModelConfig) -> Vec<(&'static str, u128)> {
    let n = |x: usize| x as u128;
    let (d, l, v) = (n(c.d_model), n(c.n_layers), n(c.vocab_size.unwrap_or(0)));
    let mul = |a: u128, b: u128| a.saturating_mul(b);
    let x = layer(c);
    let positions = if c.positions == PositionKind::Learned { mul(n(c.block_size), d) } else { 0 };
    let outer_norms = match c.norm_placement {
        NormPlacement::Post => 0,
        NormPlacement::Pre | NormPlacement::Sandwich => 1,
        NormPlacement::Peri => 2,
    };
    let norms = mul(l, 2 * norms_per_sublayer(c)).saturating_add(outer_norms);
    vec![
        ("token embedding", mul(v, d)),
        ("position embedding", positions),
        ("attention", mul(l, x.attention)),
        ("feed-forward", mul(l, x.ffn)),
        ("norms", mul(norms, x.norm).saturating_add(mul(l, x.qk_norm))),
        ("output projection", if c.tie_embeddings { 0 } else { mul(v, d) }),
    ]
}

/// An encoder–decoder's parameter counts by part: each side's embedding (one when shared), the encoder's layers
/// (self-attention, FFN, 2 norms), the decoder's (self-attention, cross-attention, FFN, 3 norms), the final norms of
/// Pre- and Peri-LN, the output projection when untied and the logits bias when present.
pub fn seq2seq_param_counts(s: &Seq2SeqConfig) -> Vec<(&'static str, u128)> {
    let c = &s.model;
    let n = |x: usize| x as u128;
    let d = n(c.d_model);
    let mul = |a: u128, b: u128| a.saturating_mul(b);
    let x = layer(c);
    let sublayers = |count: u128, extra: u128| {
        [x.attention, x.qk_norm, x.ffn, extra, mul(mul(count, norms_per_sublayer(c)), x.norm)]
            .into_iter()
            .fold(0, u128::saturating_add)
    };
    let (v_src, v_tgt) = (n(s.src_vocab), n(s.tgt_vocab));
    vec![
        ("source embedding", mul(v_src, d)),
        ("target embedding", if s.share_embeddings { 0 } else { mul(v_tgt, d) }),
        ("encoder", mul(n(s.encoder_layers), sublayers(2, 0))),
        ("decoder", mul(n(s.decoder_layers), sublayers(3, x.cross_attention))),
        ("final norms", if c.norm_placement == NormPlacement::Post { 0 } else { mul(2, x.norm) }),
        ("output projection", if c.tie_embeddings { 0 } else { mul(v_tgt, d) }),
        ("logits bias", if s.logits_bias { v_tgt } else { 0 }),
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
    use crate::seq2seq::Seq2Seq;
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

    #[test]
    fn seq2seq_counts_equal_the_parameters_of_built_models() {
        let base = ModelConfig::gpt(40, 2, 4, 32, 16);
        let post = ModelConfig { norm_placement: NormPlacement::Post, positions: PositionKind::Sinusoidal, ..base };
        let peri = ModelConfig { norm_placement: NormPlacement::Peri, ffn: FfnKind::Swiglu, ..post.clone() };
        let untied = ModelConfig { tie_embeddings: false, ..post.clone() };
        let configs = [
            Seq2SeqConfig::joint(post.clone(), 2, 3, 40),
            Seq2SeqConfig::joint(peri, 1, 2, 40),
            Seq2SeqConfig {
                share_embeddings: false,
                src_vocab: 30,
                logits_bias: true,
                ..Seq2SeqConfig::joint(post, 2, 1, 40)
            },
            Seq2SeqConfig { share_embeddings: false, src_vocab: 50, ..Seq2SeqConfig::joint(untied, 1, 1, 40) },
        ];
        for c in configs {
            let model = Seq2Seq::new(&c, &mut Rng::new(0), &Device::flex());
            let built: usize = param_infos(&model).iter().map(|p| p.shape.iter().product::<usize>()).sum();
            let total = seq2seq_param_counts(&c).iter().map(|(_, n)| n).sum::<u128>();
            assert_eq!(total, built as u128, "{c:?}");
        }
    }
}
