//! The encoder–decoder Transformer (Vaswani et al., 2017). Encoder layers: self-attention over the source with
//! padding masks, then FFN; decoder layers: causal self-attention, cross-attention to the final encoder output, then
//! FFN; each sub-layer wrapped Post-LN (the paper), Pre-LN or Peri-LN. Embeddings are scaled by √d and summed with
//! sinusoidal positions (or RoPE rotates self-attention's q and k); the output projection may share the embedding.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Embedding, Linear};
use burn::tensor::{Device, Int, Tensor};
use ember_kernels::{AttentionSpec, linear};

use crate::cache::KvCache;
use crate::config::{NormPlacement, PositionKind};
use crate::nn::attention::CausalSelfAttention;
use crate::nn::cross_attention::{CrossAttention, Memory};
use crate::nn::ffn::Ffn;
use crate::nn::norm::Norm;
use crate::nn::position::{Rope, sinusoidal};
use crate::nn::residual::sublayer;
use crate::nn::{linear_layer, tied_logits};
use crate::{ModelConfig, Rng, init};

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
}

fn norm(config: &ModelConfig, device: &Device) -> Norm {
    Norm::new(config.norm, config.d_model, config.norm_eps, config.bias, device)
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
    fn new(config: &ModelConfig, rng: &mut Rng, device: &Device) -> Self {
        let peri = config.norm_placement == NormPlacement::Peri;
        Self {
            ln_1: norm(config, device),
            self_attn: CausalSelfAttention::new(config, rng, device),
            ln_2: norm(config, device),
            mlp: Ffn::new(config, rng, device),
            ln_1_out: peri.then(|| norm(config, device)),
            ln_2_out: peri.then(|| norm(config, device)),
            placement: config.norm_placement,
        }
    }

    /// x ← sublayer(x, SelfAttn(x) over the source's real tokens), then sublayer(x, FFN(x)).
    fn forward(&self, x: Tensor<3>, lengths: &[usize], rope: Option<&Rope>) -> Tensor<3> {
        let x = sublayer(self.placement, x, &self.ln_1, self.ln_1_out.as_ref(), |h| {
            let (q, k, v) = self.self_attn.qkv(h, rope);
            let spec = AttentionSpec {
                causal: false,
                key_lengths: Some(lengths.to_vec()),
                ..self.self_attn.spec(q.dims()[3], 0)
            };
            self.self_attn.attend_with(q, k, v, &spec)
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
    fn new(config: &ModelConfig, rng: &mut Rng, device: &Device) -> Self {
        let peri = config.norm_placement == NormPlacement::Peri;
        Self {
            ln_1: norm(config, device),
            self_attn: CausalSelfAttention::new(config, rng, device),
            ln_2: norm(config, device),
            cross: CrossAttention::new(config, rng, device),
            ln_3: norm(config, device),
            mlp: Ffn::new(config, rng, device),
            ln_1_out: peri.then(|| norm(config, device)),
            ln_2_out: peri.then(|| norm(config, device)),
            ln_3_out: peri.then(|| norm(config, device)),
            placement: config.norm_placement,
        }
    }

    /// Causal self-attention (`self_attn` given the normed input), cross-attention to `memory`, then FFN.
    fn apply(&self, x: Tensor<3>, memory: &Memory, self_attn: impl FnOnce(Tensor<3>) -> Tensor<3>) -> Tensor<3> {
        let x = sublayer(self.placement, x, &self.ln_1, self.ln_1_out.as_ref(), self_attn);
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
    #[module(skip)]
    config: Seq2SeqConfig,
}

impl Seq2Seq {
    /// Embeddings N(0, d^−½) (they are scaled by √d), other weights as in the decoder-only model.
    pub fn new(config: &Seq2SeqConfig, rng: &mut Rng, device: &Device) -> Self {
        let m = &config.model;
        let d = m.d_model;
        let std = 1.0 / (d as f64).sqrt();
        let embedding = |rng: &mut Rng, v: usize| Embedding { weight: init::normal(rng, [v, d], std, device) };
        let src_emb = embedding(rng, config.src_vocab);
        let tgt_emb = (!config.share_embeddings).then(|| embedding(rng, config.tgt_vocab));
        let encoder = (0..config.encoder_layers).map(|_| EncoderLayer::new(m, rng, device)).collect();
        let decoder = (0..config.decoder_layers).map(|_| DecoderLayer::new(m, rng, device)).collect();
        let final_norm = m.norm_placement != NormPlacement::Post;
        Self {
            src_emb,
            tgt_emb,
            drop: DropoutConfig::new(m.dropout).init(),
            encoder,
            decoder,
            enc_norm: final_norm.then(|| norm(m, device)),
            dec_norm: final_norm.then(|| norm(m, device)),
            out: (!m.tie_embeddings).then(|| linear_layer(rng, d, config.tgt_vocab, std, false, device)),
            config: config.clone(),
        }
    }

    pub fn config(&self) -> &Seq2SeqConfig {
        &self.config
    }

    fn tgt_embedding(&self) -> &Embedding {
        self.tgt_emb.as_ref().unwrap_or(&self.src_emb)
    }

    /// E[tokens]·√d + PE(offset..), dropped out.
    fn embed(&self, embedding: &Embedding, tokens: Tensor<2, Int>, offset: usize) -> Tensor<3> {
        let [_, t] = tokens.dims();
        let d = self.config.model.d_model;
        let device = tokens.device();
        let x = embedding.forward(tokens) * (d as f64).sqrt();
        let x = match self.config.model.positions {
            PositionKind::Sinusoidal => x + sinusoidal(offset, t, d, &device).unsqueeze(),
            _ => x,
        };
        self.drop.forward(x)
    }

    fn rope(&self, offset: usize, t: usize, device: &Device) -> Option<Rope> {
        let m = &self.config.model;
        (m.positions == PositionKind::Rope).then(|| Rope::new(m.rope_theta, m.head_dim(), offset, t, device))
    }

    /// The encoder over source tokens [B, S] whose rows hold `lengths` real tokens (padding after them), then each
    /// decoder layer's cross-attention keys and values of it: computed once per sentence.
    pub fn encode(&self, src: Tensor<2, Int>, lengths: &[usize]) -> Vec<Memory> {
        let s = src.dims()[1];
        let rope = self.rope(0, s, &src.device());
        let mut x = self.embed(&self.src_emb, src, 0);
        for layer in &self.encoder {
            x = layer.forward(x, lengths, rope.as_ref());
        }
        if let Some(ln) = &self.enc_norm {
            x = ln.forward(x);
        }
        self.decoder.iter().map(|layer| layer.cross.memory(x.clone(), lengths.to_vec())).collect()
    }

    /// Logits [B, T, V_tgt] for target inputs [B, T] (teacher forcing) against the encoded source.
    pub fn decode(&self, memories: &[Memory], tgt: Tensor<2, Int>) -> Tensor<3> {
        let t = tgt.dims()[1];
        let rope = self.rope(0, t, &tgt.device());
        let mut x = self.embed(self.tgt_embedding(), tgt, 0);
        for (layer, memory) in self.decoder.iter().zip(memories) {
            x = layer.apply(x, memory, |h| {
                let (q, k, v) = layer.self_attn.qkv(h, rope.as_ref());
                layer.self_attn.attend(q, k, v, 0)
            });
        }
        self.logits(x)
    }

    /// Logits [B, T, V_tgt] of target inputs [B, T] given source tokens [B, S] with `src_lengths` real tokens.
    pub fn forward(&self, src: Tensor<2, Int>, src_lengths: &[usize], tgt: Tensor<2, Int>) -> Tensor<3> {
        self.decode(&self.encode(src, src_lengths), tgt)
    }

    /// Logits [B, V_tgt] of the last of new target tokens [B, T_new] at positions `cache.len()..`: the decoder's
    /// self-attention keys and values are appended to `cache`, cross-attention reads the encoded `memories`.
    pub fn decode_step(&self, memories: &[Memory], tgt: Tensor<2, Int>, cache: &mut dyn KvCache) -> Tensor<2> {
        let [b, t] = tgt.dims();
        let offset = cache.len();
        let rope = self.rope(offset, t, &tgt.device());
        let mut x = self.embed(self.tgt_embedding(), tgt, offset);
        for (layer_index, (layer, memory)) in self.decoder.iter().zip(memories).enumerate() {
            x = layer.apply(x, memory, |h| {
                let (q, k, v) = layer.self_attn.qkv(h, rope.as_ref());
                let spec = layer.self_attn.spec(q.dims()[3], offset);
                layer.self_attn.project(cache.attend(layer_index, q, k, v, &spec))
            });
        }
        let d = x.dims()[2];
        let last = x.slice([0..b, t - 1..t, 0..d]);
        let logits = self.logits(last);
        let v = logits.dims()[2];
        logits.reshape([b, v])
    }

    /// Final norm, then the output projection (x Eᵀ when tied).
    fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        let x = match &self.dec_norm {
            Some(ln) => ln.forward(x),
            None => x,
        };
        match &self.out {
            Some(out) => linear(out, x),
            None => tied_logits(self.tgt_embedding(), x),
        }
    }
}
