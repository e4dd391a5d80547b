//! Encoder–decoder attention: queries from the decoder, keys and values from the final encoder output (the memory),
//! computed once per sentence and reused at every decoding step.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::Tensor;
use ember_kernels::{AttentionAlgorithm, AttentionSpec, GpuTuning, attention, linear};

use crate::init::Init;
use crate::nn::attention::HeadsConfig;
use crate::nn::linear_layer;
use ember_formats::config::ModelConfig;

#[derive(Module, Debug)]
pub struct CrossAttention {
    /// W_Q: d → h·d_h.
    pub q_proj: Linear,
    /// [W_K | W_V]: d → 2g·d_h.
    pub kv_proj: Linear,
    /// W_O: h·d_h → d.
    pub c_proj: Linear,
    resid_drop: Dropout,
    n_heads: usize,
    n_kv_heads: usize,
    #[module(skip)]
    attention_dropout: f64,
    #[module(skip)]
    algorithm: AttentionAlgorithm,
    #[module(skip)]
    tuning: GpuTuning,
}

/// The memory's keys and values for one layer, [B, g, S, d_h] each, and the valid source length of each row.
#[derive(Clone, Debug)]
pub struct Memory {
    pub k: Tensor<4>,
    pub v: Tensor<4>,
    pub lengths: Vec<usize>,
}

/// Attention of a decoder over an encoder's output, over its heads, with its dropout.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossAttentionConfig {
    pub heads: HeadsConfig,
    pub dropout: f64,
    pub attention_dropout: f64,
}

impl CrossAttentionConfig {
    /// The cross-attention of every decoder layer of `model`.
    pub fn of(model: &ModelConfig) -> Self {
        Self { heads: HeadsConfig::of(model), dropout: model.dropout, attention_dropout: model.attention_dropout }
    }

    /// N(0, 0.02) weights, zero biases.
    pub fn init(&self, init: &mut Init) -> CrossAttention {
        let HeadsConfig { d_model: d, n_heads: h, n_kv_heads: g, head_dim: dh, qkv_bias, bias } = self.heads;
        CrossAttention {
            q_proj: linear_layer(init, "q_proj", d, h * dh, 0.02, qkv_bias),
            kv_proj: linear_layer(init, "kv_proj", d, 2 * g * dh, 0.02, qkv_bias),
            c_proj: linear_layer(init, "c_proj", h * dh, d, 0.02, bias),
            resid_drop: DropoutConfig::new(self.dropout).init(),
            n_heads: h,
            n_kv_heads: g,
            attention_dropout: self.attention_dropout,
            algorithm: AttentionAlgorithm::Ember,
            tuning: GpuTuning::default(),
        }
    }
}

impl CrossAttention {
    /// Computes attention with `algorithm`, tuned by `tuning` on a GPU, from now on.
    pub fn set_attention(&mut self, algorithm: AttentionAlgorithm, tuning: GpuTuning) {
        (self.algorithm, self.tuning) = (algorithm, tuning);
    }

    /// k = memory W_K, v = memory W_V for an encoder output whose rows hold `lengths` real tokens.
    ///
    /// # Shapes
    /// encoded [B, S, d] → k, v [B, g, S, d_h].
    pub fn memory(&self, encoded: Tensor<3>, lengths: Vec<usize>) -> Memory {
        let [b, s, _] = encoded.dims();
        let g = self.n_kv_heads;
        let dh = self.kv_proj.weight.dims()[1] / (2 * g);
        let kv = linear(&self.kv_proj, encoded);
        let heads = |z: Tensor<3>| z.reshape([b, s, g, dh]).swap_dims(1, 2);
        let k = heads(kv.clone().slice([0..b, 0..s, 0..g * dh]));
        let v = heads(kv.slice([0..b, 0..s, g * dh..2 * g * dh]));
        Memory { k, v, lengths }
    }

    /// softmax(q kᵀ / √d_k + padding mask) v with q = x W_Q, heads concatenated, then W_O.
    ///
    /// # Shapes
    /// x [B, T, d] → [B, T, d].
    pub fn forward(&self, x: Tensor<3>, memory: &Memory) -> Tensor<3> {
        let [b, t, _] = x.dims();
        let h = self.n_heads;
        let dh = self.q_proj.weight.dims()[1] / h;
        let q = linear(&self.q_proj, x).reshape([b, t, h, dh]).swap_dims(1, 2);
        let spec = AttentionSpec {
            causal: false,
            key_lengths: Some(memory.lengths.clone()),
            dropout: self.attention_dropout,
            ..AttentionSpec::causal(dh).computed_by(self.algorithm, self.tuning)
        };
        let y = attention(q, memory.k.clone(), memory.v.clone(), &spec).swap_dims(1, 2).reshape([b, t, h * dh]);
        self.resid_drop.forward(linear(&self.c_proj, y))
    }
}
