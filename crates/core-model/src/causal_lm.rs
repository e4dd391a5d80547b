//! The decoder-only causal language model. GPT-2 (learned positions, Pre-LN LayerNorm, GELU, tied output), Llama
//! (RoPE, RMSNorm, GQA, SwiGLU, untied output), Gemma 3 and MLA models are configs of this one model; see
//! [`ModelConfig`].

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Embedding};
use burn::tensor::{FloatDType, Int, Tensor, TensorData};
use ember_kernels::{AttentionAlgorithm, GpuTuning, Similarity};

use crate::cache::{Context, KvCache};
use crate::init::{Build, Init};
use crate::nn::attention::{CausalSelfAttention, SelfAttentionConfig};
use crate::nn::ffn::{Ffn, FfnConfig};
use crate::nn::mla::{MlaAttention, MlaConfig};
use crate::nn::norm::{Norm, NormConfig};
use crate::nn::position::Positions;
use crate::nn::projection::{Projection, TokenEmbedding};
use crate::nn::residual::sublayer;
use crate::nn::{embedding, projection, token_embedding};
use ember_formats::config::ModelConfig;
use ember_formats::config::{AttentionKind, NormPlacement, PositionKind};

/// Self-attention of one block: MHA / GQA / MQA, or multi-head latent attention.
#[allow(clippy::large_enum_variant)] // one per block; boxing would buy nothing
#[derive(Module, Debug)]
pub enum Attention {
    Mha(CausalSelfAttention),
    Mla(MlaAttention),
}

impl Attention {
    /// The attention sub-layer for x [B, T, d] at `positions`, against what `context` holds for `layer`.
    fn forward(&self, x: Tensor<3>, positions: &Positions, layer: usize, context: &mut Context) -> Tensor<3> {
        match self {
            Attention::Mha(attn) => attn.forward(x, positions, layer, context),
            Attention::Mla(mla) => mla.forward(x, positions, layer, context),
        }
    }

    /// Computes attention with `algorithm`, tuned by `tuning` on a GPU, from now on.
    fn set_attention(&mut self, algorithm: AttentionAlgorithm, tuning: GpuTuning) {
        match self {
            Attention::Mha(attn) => attn.set_attention(algorithm, tuning),
            Attention::Mla(mla) => mla.set_attention(algorithm, tuning),
        }
    }
}

#[derive(Module, Debug)]
pub struct Block {
    pub ln_1: Norm,
    pub attn: Attention,
    pub ln_2: Norm,
    pub mlp: Ffn,
    /// Peri-LN's norms on the sub-layer outputs.
    pub ln_1_out: Option<Norm>,
    pub ln_2_out: Option<Norm>,
    #[module(skip)]
    placement: NormPlacement,
}

impl Block {
    fn new(config: &ModelConfig, layer: usize, init: &mut Init) -> Self {
        let norm = |init: &mut Init, name: &str| init.scope(name, |init| NormConfig::of(config).init(init));
        let peri = config.norm_placement.has_output_norms();
        let attn = match config.attention {
            AttentionKind::Mha => {
                Attention::Mha(init.scope("attn", |init| SelfAttentionConfig::of_layer(config, layer).init(init)))
            }
            AttentionKind::Mla => Attention::Mla(init.scope("attn", |init| MlaConfig::of(config).init(init))),
        };
        Self {
            ln_1: norm(init, "ln_1"),
            attn,
            ln_2: norm(init, "ln_2"),
            mlp: init.scope("mlp", |init| FfnConfig::of(config).init(init)),
            ln_1_out: peri.then(|| norm(init, "ln_1_out")),
            ln_2_out: peri.then(|| norm(init, "ln_2_out")),
            placement: config.norm_placement,
        }
    }

    /// x ← sublayer(x, Attn(x)), then sublayer(x, FFN(x)), at `positions` against what `context` holds for `layer`.
    fn forward(&self, x: Tensor<3>, positions: &Positions, layer: usize, context: &mut Context) -> Tensor<3> {
        let x = sublayer(self.placement, x, &self.ln_1, self.ln_1_out.as_ref(), |h| {
            self.attn.forward(h, positions, layer, context)
        });
        sublayer(self.placement, x, &self.ln_2, self.ln_2_out.as_ref(), |h| self.mlp.forward(h))
    }
}

#[derive(Module, Debug)]
pub struct CausalLm {
    pub wte: TokenEmbedding,
    /// Learned positions.
    pub wpe: Option<Embedding>,
    /// Peri-LN's norm of the input embeddings.
    pub ln_emb: Option<Norm>,
    drop: Dropout,
    pub blocks: Vec<Block>,
    /// The final norm of Pre-LN and Peri-LN.
    pub ln_f: Option<Norm>,
    /// The output projection [d, V] when not tied to `wte`.
    pub lm_head: Option<Projection>,
    #[module(skip)]
    config: ModelConfig,
}

impl Build for CausalLm {
    type Config = ModelConfig;

    /// GPT-2 initialisation: embeddings N(0, 0.02), norms γ = 1, β = 0.
    fn build(config: &ModelConfig, init: &mut Init) -> Self {
        let (d, v) = (config.d_model, config.vocab());
        let norm = |init: &mut Init, name: &str| init.scope(name, |init| NormConfig::of(config).init(init));
        let wte = token_embedding(init, "wte", v, d, 0.02);
        let wpe =
            (config.positions == PositionKind::Learned).then(|| embedding(init, "wpe", config.block_size, d, 0.02));
        let blocks = (0..config.n_layers)
            .map(|i| init.scope(format!("blocks.{i}"), |init| Block::new(config, i, init)))
            .collect();
        let placement = config.norm_placement;
        Self {
            wte,
            wpe,
            ln_emb: (placement == NormPlacement::Peri).then(|| norm(init, "ln_emb")),
            drop: DropoutConfig::new(config.dropout).init(),
            blocks,
            ln_f: (placement != NormPlacement::Post).then(|| norm(init, "ln_f")),
            lm_head: (!config.tie_embeddings).then(|| projection(init, "lm_head", d, v, 0.02, false)),
            config: config.clone(),
        }
    }
}

impl CausalLm {
    /// The same model with every attention layer computed by `algorithm`, tuned by `tuning` on a GPU.
    pub fn with_attention(mut self, algorithm: AttentionAlgorithm, tuning: GpuTuning) -> Self {
        for block in &mut self.blocks {
            block.attn.set_attention(algorithm, tuning);
        }
        self
    }

    /// The same weights with layer i's attention weighing values by `similarity(i)`; None when the model has MLA
    /// layers, whose attention is softmax only.
    pub fn with_similarity(mut self, similarity: impl Fn(usize) -> Similarity) -> Option<Self> {
        for (i, block) in self.blocks.iter_mut().enumerate() {
            match &mut block.attn {
                Attention::Mha(attn) => attn.set_similarity(similarity(i)),
                Attention::Mla(_) => return None,
            }
        }
        Some(self)
    }

    /// Draw `draw` of FAVOR+'s random features in every layer from now on (a no-op for other attention).
    pub fn set_feature_draw(&mut self, draw: u64) {
        for block in &mut self.blocks {
            if let Attention::Mha(attn) = &mut block.attn {
                attn.redraw_features(draw);
            }
        }
    }

    /// The draw of FAVOR+'s features in force for optimizer step `step` (from 0): a fresh one every
    /// `favor_redraw` steps, else always the first.
    pub fn feature_draw(&self, step: u64) -> u64 {
        self.config.favor_redraw.map_or(0, |n| step / n)
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Logits [B, T, V] for token ids [B, T] (T ≤ block_size).
    pub fn forward(&self, idx: Tensor<2, Int>) -> Tensor<3> {
        self.logits(self.hidden(idx, Context::Full))
    }

    /// Logits [B, V] of the last of the new tokens [B, T_new] at positions `cache.len()..`: every layer appends its
    /// keys and values (or MLA latents) to `cache` and attends with the new queries only,
    /// o_t = softmax(q_t K_{1:t}ᵀ / √d_k) V_{1:t}. Prefill is the first call with the whole prompt.
    pub fn forward_step(&self, idx: Tensor<2, Int>, cache: &mut dyn KvCache) -> Tensor<2> {
        let [b, t] = idx.dims();
        let x = self.hidden(idx, Context::Cached(cache));
        let d = x.dims()[2];
        self.logits(x.slice([0..b, t - 1..t, 0..d])).reshape([b, self.config.vocab()])
    }

    /// Logits [B, T_new, V] of every new token, through the cache (teacher forcing against a KV store).
    pub fn forward_step_all(&self, idx: Tensor<2, Int>, cache: &mut dyn KvCache) -> Tensor<3> {
        self.logits(self.hidden(idx, Context::Cached(cache)))
    }

    /// Logits [B, V] of one new token per sequence, each sequence with its own cache and length (batched decoding):
    /// row b is embedded and rotated at position `caches[b].len()`, appended to cache b, and attends to its own keys.
    pub fn forward_batch(&self, tokens: &[u32], caches: &mut [&mut dyn KvCache]) -> Tensor<2> {
        let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
        let idx = Tensor::<2, Int>::from_data(TensorData::new(ids, [tokens.len(), 1]), &self.wte.device());
        self.logits(self.hidden(idx, Context::Batched(caches))).reshape([tokens.len(), self.config.vocab()])
    }

    /// The last block's output [B, T, d] for new tokens [B, T] against `context`: their positions are fixed once,
    /// then every block runs with them.
    fn hidden(&self, idx: Tensor<2, Int>, mut context: Context) -> Tensor<3> {
        let positions = context.positions(idx.dims()[1], &idx.device());
        let mut x = self.embed(idx, &positions);
        for (layer, block) in self.blocks.iter().enumerate() {
            x = block.forward(x, &positions, layer, &mut context);
        }
        x
    }

    /// h₀ = E[x] + P[positions] (learned), E[x]·√d + PE(positions) (sinusoidal) or E[x] (E[x]·√d when the config
    /// scales embeddings), normalised for Peri-LN.
    fn embed(&self, idx: Tensor<2, Int>, positions: &Positions) -> Tensor<3> {
        let e = self.wte.forward(idx);
        let e = if self.config.embedding_scale { e * (self.config.d_model as f32).sqrt() } else { e };
        let x = match (&self.wpe, self.config.positions) {
            (Some(wpe), _) => e + wpe.forward(positions.ids()),
            (None, PositionKind::Sinusoidal) => {
                let d = self.config.d_model;
                let dtype = FloatDType::from(e.dtype());
                e * (d as f64).sqrt() + positions.sinusoidal(d, dtype)
            }
            _ => e,
        };
        let x = match &self.ln_emb {
            Some(ln) => ln.forward(x),
            None => x,
        };
        self.drop.forward(x)
    }

    /// Logits z = norm_f(h) Wᵀ_out, W_out = E when tied; soft-capped to c·tanh(z / c) when the config caps them.
    pub fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        let x = match &self.ln_f {
            Some(ln) => ln.forward(x),
            None => x,
        };
        let z = match &self.lm_head {
            Some(head) => head.forward(x),
            None => self.wte.logits(x),
        };
        match self.config.logit_softcap {
            Some(c) => (z / c).tanh() * c,
            None => z,
        }
    }

    /// The context length the model allows.
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// Whether the parameter at `path` is an embedding table (weight decay on these is configurable).
    pub fn is_embedding(path: &str) -> bool {
        path.starts_with("wte.") || path.starts_with("wpe.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::Mismatch;
    use crate::params::state_dict;
    use burn::tensor::Device;
    use ember_formats::Rng;
    use ember_formats::config::{FfnKind, NormKind};
    use std::collections::HashMap;

    fn layouts() -> Vec<ModelConfig> {
        let gpt = ModelConfig::gpt(50, 2, 4, 32, 16);
        let llama = ModelConfig { tie_embeddings: false, ..gpt.clone().llama_style(2) };
        let mla = llama.clone().mla_style(16, 4);
        let peri =
            ModelConfig { norm_placement: NormPlacement::Peri, positions: PositionKind::Sinusoidal, ..gpt.clone() };
        let post = ModelConfig { norm_placement: NormPlacement::Post, norm: NormKind::RmsNorm, ..gpt.clone() };
        let relu = ModelConfig { ffn: FfnKind::Relu, positions: PositionKind::None, bias: false, ..gpt.clone() };
        let gemma = ModelConfig {
            ffn: FfnKind::Geglu,
            norm_placement: NormPlacement::Sandwich,
            qk_norm: true,
            embedding_scale: true,
            head_dim: Some(16),
            window: Some(4),
            global_every: Some(2),
            rope_local_theta: Some(100.0),
            ..llama.clone()
        };
        vec![gpt, llama, mla, peri, post, relu, gemma]
    }

    #[test]
    fn load_reads_back_every_parameter_of_every_layout() {
        let device = Device::flex();
        for config in layouts() {
            let model = CausalLm::new(&config, &mut Rng::new(1), &device);
            let saved = state_dict(&model);
            let loaded = CausalLm::load(&config, &saved.iter().cloned().collect(), &device).unwrap();
            assert_eq!(state_dict(&loaded), saved, "{config:?}");
        }
    }

    #[test]
    fn load_reports_a_missing_or_misshapen_parameter() {
        let device = Device::flex();
        let config = ModelConfig::gpt(50, 2, 4, 32, 16);
        let saved: HashMap<String, TensorData> =
            state_dict(&CausalLm::new(&config, &mut Rng::new(1), &device)).into_iter().collect();
        let mut missing = saved.clone();
        missing.remove("blocks.1.mlp.c_fc.bias");
        let err = CausalLm::load(&config, &missing, &device).unwrap_err();
        assert_eq!(err, Mismatch::Missing("blocks.1.mlp.c_fc.bias".into()));
        let mut misshapen = saved;
        misshapen.insert("ln_f.gamma".into(), TensorData::new(vec![1.0f32; 31], [31]));
        let err = CausalLm::load(&config, &misshapen, &device).unwrap_err();
        assert_eq!(err, Mismatch::Shape { path: "ln_f.gamma".into(), expected: vec![32], found: vec![31] });
    }

    #[test]
    fn every_attention_implementation_gives_the_same_logits() {
        let device = Device::flex();
        let ids: Vec<i64> = (0..24).map(|i| i * 7 % 50).collect();
        let idx = Tensor::<2, Int>::from_data(TensorData::new(ids, [2, 12]), &device);
        for config in layouts() {
            let model = CausalLm::new(&config, &mut Rng::new(2), &device);
            let auto = model.forward(idx.clone());
            for algorithm in [AttentionAlgorithm::Naive, AttentionAlgorithm::Burn] {
                let model =
                    CausalLm::new(&config, &mut Rng::new(2), &device).with_attention(algorithm, GpuTuning::default());
                let diff: f32 = (model.forward(idx.clone()) - auto.clone()).abs().max().into_scalar();
                assert!(diff <= 1e-5, "{algorithm:?}, {config:?}: {diff}");
            }
        }
    }
}
