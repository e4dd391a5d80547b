//! The encoder–decoder Transformer (Vaswani et al., 2017). Encoder layers: self-attention over the source with
//! padding masks, then FFN; decoder layers: causal self-attention, cross-attention to the final encoder output, then
//! FFN; each sub-layer wrapped Post-LN (the paper), Pre-LN or Peri-LN. Embeddings are scaled by √d and summed with
//! sinusoidal positions (or RoPE rotates self-attention's q and k); the output projection may share the embedding.

use burn::module::{Module, Param};
use burn::nn::{Dropout, DropoutConfig, Embedding, Linear};
use burn::tensor::{FloatDType, Int, Tensor};
use ember_kernels::{AttentionAlgorithm, AttentionSpec, GpuTuning, linear};

use crate::cache::{Context, KvCache};
use crate::init::{Build, Init};
use crate::nn::attention::{CausalSelfAttention, SelfAttentionConfig};
use crate::nn::cross_attention::{CrossAttention, CrossAttentionConfig, Memory};
use crate::nn::ffn::{Ffn, FfnConfig};
use crate::nn::norm::{Norm, NormConfig};
use crate::nn::position::Positions;
use crate::nn::residual::sublayer;
use crate::nn::{embedding, linear_layer, tied_logits};
use ember_formats::config::ModelConfig;
use ember_formats::config::{NormPlacement, PositionKind};

/// An encoder–decoder model: layer shapes, norms, FFN and positions from `model` (its `n_layers` and `vocab_size`
/// are not used), stack depths and vocabularies here.
#[derive(Clone, Debug, PartialEq)]
pub struct Seq2SeqConfig {
    pub model: ModelConfig,
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    pub src_vocab: usize,
    pub tgt_vocab: usize,
    /// One embedding for source, target and output projection (a joint vocabulary: fairseq's
    /// `--share-all-embeddings`); requires src_vocab = tgt_vocab.
    pub share_embeddings: bool,
    /// A learned bias added to the output logits (Marian's `final_logits_bias`).
    pub logits_bias: bool,
}

impl Seq2SeqConfig {
    /// `encoder_layers` + `decoder_layers` layers shaped by `model` over one joint vocabulary of `vocab` tokens with
    /// one shared embedding (source, target and output projection).
    pub fn joint(model: ModelConfig, encoder_layers: usize, decoder_layers: usize, vocab: usize) -> Self {
        Self {
            model,
            encoder_layers,
            decoder_layers,
            src_vocab: vocab,
            tgt_vocab: vocab,
            share_embeddings: true,
            logits_bias: false,
        }
    }
}

/// The norm of `config` named `name`: γ = 1, β = 0.
fn norm(config: &ModelConfig, init: &mut Init, name: &str) -> Norm {
    init.scope(name, |init| NormConfig::of(config).init(init))
}

#[derive(Module, Debug)]
pub struct EncoderLayer {
    pub ln_1: Norm,
    pub self_attn: CausalSelfAttention,
    pub ln_2: Norm,
    pub mlp: Ffn,
    pub ln_1_out: Option<Norm>,
    pub ln_2_out: Option<Norm>,
    #[module(skip)]
    placement: NormPlacement,
}

impl EncoderLayer {
    fn new(config: &ModelConfig, init: &mut Init) -> Self {
        let peri = config.norm_placement.has_output_norms();
        Self {
            ln_1: norm(config, init, "ln_1"),
            self_attn: init.scope("self_attn", |init| SelfAttentionConfig::of(config).init(init)),
            ln_2: norm(config, init, "ln_2"),
            mlp: init.scope("mlp", |init| FfnConfig::of(config).init(init)),
            ln_1_out: peri.then(|| norm(config, init, "ln_1_out")),
            ln_2_out: peri.then(|| norm(config, init, "ln_2_out")),
            placement: config.norm_placement,
        }
    }

    /// x ← sublayer(x, SelfAttn(x) over the source's real tokens), then sublayer(x, FFN(x)).
    fn forward(&self, x: Tensor<3>, lengths: &[usize], positions: &Positions) -> Tensor<3> {
        let x = sublayer(self.placement, x, &self.ln_1, self.ln_1_out.as_ref(), |h| {
            let (q, k, v) = self.self_attn.qkv(h, positions);
            let spec = AttentionSpec {
                causal: false,
                key_lengths: Some(lengths.to_vec()),
                ..self.self_attn.spec(q.dims()[3], 0)
            };
            self.self_attn.attend(q, k, v, &spec)
        });
        sublayer(self.placement, x, &self.ln_2, self.ln_2_out.as_ref(), |h| self.mlp.forward(h))
    }
}

#[derive(Module, Debug)]
pub struct DecoderLayer {
    pub ln_1: Norm,
    pub self_attn: CausalSelfAttention,
    pub ln_2: Norm,
    pub cross: CrossAttention,
    pub ln_3: Norm,
    pub mlp: Ffn,
    pub ln_1_out: Option<Norm>,
    pub ln_2_out: Option<Norm>,
    pub ln_3_out: Option<Norm>,
    #[module(skip)]
    placement: NormPlacement,
}

impl DecoderLayer {
    /// Its self-attention splits heads in every pass, so translation trains with the split heads' gradients.
    fn new(config: &ModelConfig, init: &mut Init) -> Self {
        let peri = config.norm_placement.has_output_norms();
        Self {
            ln_1: norm(config, init, "ln_1"),
            self_attn: init.scope("self_attn", |init| SelfAttentionConfig::of(config).init(init).with_split_heads()),
            ln_2: norm(config, init, "ln_2"),
            cross: init.scope("cross", |init| CrossAttentionConfig::of(config).init(init)),
            ln_3: norm(config, init, "ln_3"),
            mlp: init.scope("mlp", |init| FfnConfig::of(config).init(init)),
            ln_1_out: peri.then(|| norm(config, init, "ln_1_out")),
            ln_2_out: peri.then(|| norm(config, init, "ln_2_out")),
            ln_3_out: peri.then(|| norm(config, init, "ln_3_out")),
            placement: config.norm_placement,
        }
    }

    /// Causal self-attention at `positions` against what `context` holds for `layer`, cross-attention to `memory`,
    /// then FFN.
    fn forward(
        &self,
        x: Tensor<3>,
        memory: &Memory,
        positions: &Positions,
        layer: usize,
        context: &mut Context,
    ) -> Tensor<3> {
        let x = sublayer(self.placement, x, &self.ln_1, self.ln_1_out.as_ref(), |h| {
            self.self_attn.forward(h, positions, layer, context)
        });
        let x = sublayer(self.placement, x, &self.ln_2, self.ln_2_out.as_ref(), |h| self.cross.forward(h, memory));
        sublayer(self.placement, x, &self.ln_3, self.ln_3_out.as_ref(), |h| self.mlp.forward(h))
    }
}

#[derive(Module, Debug)]
pub struct Seq2Seq {
    pub src_emb: Embedding,
    /// The target embedding when not shared with the source.
    pub tgt_emb: Option<Embedding>,
    drop: Dropout,
    pub encoder: Vec<EncoderLayer>,
    pub decoder: Vec<DecoderLayer>,
    /// Pre-LN and Peri-LN's final norms.
    pub enc_norm: Option<Norm>,
    pub dec_norm: Option<Norm>,
    /// The output projection [d, V_tgt] when not tied to the target embedding.
    pub out: Option<Linear>,
    /// b [V_tgt] added to the logits, when the config has it.
    pub logits_bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    config: Seq2SeqConfig,
}

impl Build for Seq2Seq {
    type Config = Seq2SeqConfig;

    /// Embeddings N(0, d^−½) (they are scaled by √d), other weights as in the decoder-only model.
    fn build(config: &Seq2SeqConfig, init: &mut Init) -> Self {
        let m = &config.model;
        let d = m.d_model;
        let std = 1.0 / (d as f64).sqrt();
        let src_emb = embedding(init, "src_emb", config.src_vocab, d, std);
        let tgt_emb = (!config.share_embeddings).then(|| embedding(init, "tgt_emb", config.tgt_vocab, d, std));
        let encoder = (0..config.encoder_layers)
            .map(|i| init.scope(format!("encoder.{i}"), |init| EncoderLayer::new(m, init)))
            .collect();
        let decoder = (0..config.decoder_layers)
            .map(|i| init.scope(format!("decoder.{i}"), |init| DecoderLayer::new(m, init)))
            .collect();
        let final_norm = m.norm_placement != NormPlacement::Post;
        Self {
            src_emb,
            tgt_emb,
            drop: DropoutConfig::new(m.dropout).init(),
            encoder,
            decoder,
            enc_norm: final_norm.then(|| norm(m, init, "enc_norm")),
            dec_norm: final_norm.then(|| norm(m, init, "dec_norm")),
            out: (!m.tie_embeddings).then(|| linear_layer(init, "out", d, config.tgt_vocab, std, false)),
            logits_bias: config.logits_bias.then(|| init.constant("logits_bias", [config.tgt_vocab], 0.0)),
            config: config.clone(),
        }
    }
}

impl Seq2Seq {
    /// Whether the parameter at `path` is an embedding table (weight decay on these is configurable).
    pub fn is_embedding(path: &str) -> bool {
        path.starts_with("src_emb.") || path.starts_with("tgt_emb.")
    }

    /// The same model with every attention layer computed by `algorithm`, tuned by `tuning` on a GPU.
    pub fn with_attention(mut self, algorithm: AttentionAlgorithm, tuning: GpuTuning) -> Self {
        for layer in &mut self.encoder {
            layer.self_attn.set_attention(algorithm, tuning);
        }
        for layer in &mut self.decoder {
            layer.self_attn.set_attention(algorithm, tuning);
            layer.cross.set_attention(algorithm, tuning);
        }
        self
    }

    pub fn config(&self) -> &Seq2SeqConfig {
        &self.config
    }

    fn tgt_embedding(&self) -> &Embedding {
        self.tgt_emb.as_ref().unwrap_or(&self.src_emb)
    }

    /// E[tokens]·√d + PE(positions), dropped out.
    fn embed(&self, embedding: &Embedding, tokens: Tensor<2, Int>, positions: &Positions) -> Tensor<3> {
        let d = self.config.model.d_model;
        let x = embedding.forward(tokens) * (d as f64).sqrt();
        let x = match self.config.model.positions {
            PositionKind::Sinusoidal => {
                let dtype = FloatDType::from(x.dtype());
                x + positions.sinusoidal(d, dtype)
            }
            _ => x,
        };
        self.drop.forward(x)
    }

    /// The encoder over source tokens [B, S] whose rows hold `lengths` real tokens (padding after them), then each
    /// decoder layer's cross-attention keys and values of it: computed once per sentence.
    pub fn encode(&self, src: Tensor<2, Int>, lengths: &[usize]) -> Vec<Memory> {
        let positions = Positions::span(0, src.dims()[1], &src.device());
        let mut x = self.embed(&self.src_emb, src, &positions);
        for layer in &self.encoder {
            x = layer.forward(x, lengths, &positions);
        }
        if let Some(ln) = &self.enc_norm {
            x = ln.forward(x);
        }
        self.decoder.iter().map(|layer| layer.cross.memory(x.clone(), lengths.to_vec())).collect()
    }

    /// Logits [B, T, V_tgt] for target inputs [B, T] (teacher forcing) against the encoded source.
    pub fn decode(&self, memories: &[Memory], tgt: Tensor<2, Int>) -> Tensor<3> {
        self.logits(self.decoded(memories, tgt, Context::Full))
    }

    /// Logits [B, T, V_tgt] of target inputs [B, T] given source tokens [B, S] with `src_lengths` real tokens.
    pub fn forward(&self, src: Tensor<2, Int>, src_lengths: &[usize], tgt: Tensor<2, Int>) -> Tensor<3> {
        self.decode(&self.encode(src, src_lengths), tgt)
    }

    /// Logits [B, V_tgt] of the last of new target tokens [B, T_new] at positions `cache.len()..`: the decoder's
    /// self-attention keys and values are appended to `cache`, cross-attention reads the encoded `memories`.
    pub fn decode_step(&self, memories: &[Memory], tgt: Tensor<2, Int>, cache: &mut dyn KvCache) -> Tensor<2> {
        let [b, t] = tgt.dims();
        let x = self.decoded(memories, tgt, Context::Cached(cache));
        let d = x.dims()[2];
        let logits = self.logits(x.slice([0..b, t - 1..t, 0..d]));
        let v = logits.dims()[2];
        logits.reshape([b, v])
    }

    /// The last decoder layer's output [B, T, d] for target tokens [B, T] against `context`: their positions are
    /// fixed once, then every layer runs with them.
    fn decoded(&self, memories: &[Memory], tgt: Tensor<2, Int>, mut context: Context) -> Tensor<3> {
        let positions = context.positions(tgt.dims()[1], &tgt.device());
        let mut x = self.embed(self.tgt_embedding(), tgt, &positions);
        for (index, (layer, memory)) in self.decoder.iter().zip(memories).enumerate() {
            x = layer.forward(x, memory, &positions, index, &mut context);
        }
        x
    }

    /// Final norm, then the output projection (x Eᵀ when tied), plus the logits' bias when there is one.
    fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        let x = match &self.dec_norm {
            Some(ln) => ln.forward(x),
            None => x,
        };
        let z = match &self.out {
            Some(out) => linear(out, x),
            None => tied_logits(self.tgt_embedding(), x),
        };
        match &self.logits_bias {
            Some(b) => z + b.val().unsqueeze::<3>(),
            None => z,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::state_dict;
    use burn::tensor::Device;
    use ember_formats::Rng;

    #[test]
    fn load_reads_back_every_parameter_with_shared_or_separate_embeddings() {
        let device = Device::flex();
        let model = ModelConfig { positions: PositionKind::Sinusoidal, ..ModelConfig::gpt(30, 1, 2, 16, 32) };
        let shared = Seq2SeqConfig {
            model,
            encoder_layers: 2,
            decoder_layers: 1,
            src_vocab: 30,
            tgt_vocab: 30,
            share_embeddings: true,
            logits_bias: false,
        };
        let separate = Seq2SeqConfig {
            model: ModelConfig { tie_embeddings: false, ..shared.model.clone().llama_style(1) },
            tgt_vocab: 20,
            share_embeddings: false,
            logits_bias: true,
            ..shared.clone()
        };
        for config in [shared, separate] {
            let saved = state_dict(&Seq2Seq::new(&config, &mut Rng::new(3), &device));
            let loaded = Seq2Seq::load(&config, &saved.iter().cloned().collect(), &device).unwrap();
            assert_eq!(state_dict(&loaded), saved, "{config:?}");
        }
    }
}
