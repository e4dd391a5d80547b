//! Causal multi-head self-attention with a fused QKV projection (GPT-2's `c_attn`): MHA, GQA and MQA by the number
//! of key/value heads, optional RoPE on q and k, optional sliding window.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::Tensor;
use ember_kernels::{AttentionSpec, PackedHeads, attention, linear, merge_heads, packed_attention, split_heads};

use crate::nn::linear_layer;
use crate::nn::position::Rope;
use crate::{ModelConfig, Rng};

#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    /// [W_Q | W_K | W_V]: d → (h + 2g)·d_h.
    pub c_attn: Linear,
    /// W_O: h·d_h → d.
    pub c_proj: Linear,
    resid_drop: Dropout,
    n_heads: usize,
    n_kv_heads: usize,
    #[module(skip)]
    window: Option<usize>,
    #[module(skip)]
    attention_dropout: f64,
}

impl CausalSelfAttention {
    /// GPT-2 init: N(0, 0.02) weights, residual projection N(0, 0.02/√(2L)), zero biases.
    pub fn new(config: &ModelConfig, rng: &mut Rng, device: &burn::tensor::Device) -> Self {
        let (d, h, g, dh) = (config.d_model, config.n_heads, config.kv_heads(), config.head_dim());
        let residual_std = 0.02 / (2.0 * config.n_layers as f64).sqrt();
        Self {
            c_attn: linear_layer(rng, d, (h + 2 * g) * dh, 0.02, config.qkv_bias(), device),
            c_proj: linear_layer(rng, h * dh, d, residual_std, config.bias, device),
            resid_drop: DropoutConfig::new(config.dropout).init(),
            n_heads: h,
            n_kv_heads: g,
            window: config.window,
            attention_dropout: config.attention_dropout,
        }
    }

    /// q [B, h, T, d_h] and k, v [B, g, T, d_h] of x [B, T, d]; q and k rotated when `rope` is given.
    pub fn qkv(&self, x: Tensor<3>, rope: Option<&Rope>) -> (Tensor<4>, Tensor<4>, Tensor<4>) {
        let (q, k, v) = split_heads(linear(&self.c_attn, x), self.heads());
        match rope {
            Some(rope) => (rope.apply(q), rope.apply(k), v),
            None => (q, k, v),
        }
    }

    /// y = softmax(q kᵀ / √d_k + mask) v, heads concatenated, then W_O; queries start at `query_offset` of k, v.
    pub fn attend(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, query_offset: usize) -> Tensor<3> {
        let spec = self.spec(q.dims()[3], query_offset);
        self.attend_with(q, k, v, &spec)
    }

    /// The same with a given mask specification (batched decoding masks padded keys by length).
    pub fn attend_with(&self, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<3> {
        self.project(attention(q, k, v, spec))
    }

    /// Causal attention (in this layer's window, with its dropout) for heads of width `head_dim`, queries from
    /// `query_offset`.
    pub fn spec(&self, head_dim: usize, query_offset: usize) -> AttentionSpec {
        AttentionSpec {
            query_offset,
            dropout: self.attention_dropout,
            ..AttentionSpec::causal(head_dim).with_window(self.window)
        }
    }

    /// Heads [B, h, T, d_h] concatenated to [B, T, h·d_h], then W_O.
    pub fn project(&self, y: Tensor<4>) -> Tensor<3> {
        self.output(merge_heads(y))
    }

    /// W_O of the concatenated heads [B, T, h·d_h].
    fn output(&self, y: Tensor<3>) -> Tensor<3> {
        self.resid_drop.forward(linear(&self.c_proj, y))
    }

    fn heads(&self) -> PackedHeads {
        PackedHeads { q: self.n_heads, kv: self.n_kv_heads }
    }

    pub fn window(&self) -> Option<usize> {
        self.window
    }

    pub fn forward(&self, x: Tensor<3>, rope: Option<&Rope>) -> Tensor<3> {
        if rope.is_some() {
            let (q, k, v) = self.qkv(x, rope);
            return self.attend(q, k, v, 0);
        }
        // Unrotated q, k, v are read where the fused projection put them.
        let dh = self.c_attn.weight.dims()[1] / (self.n_heads + 2 * self.n_kv_heads);
        self.output(packed_attention(linear(&self.c_attn, x), self.heads(), &self.spec(dh, 0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{load_state_dict, state_dict};
    use burn::tensor::{Device, Distribution, TensorData};
    use std::collections::HashMap;

    fn max_diff(a: Tensor<3>, b: Tensor<3>) -> f32 {
        (a - b).abs().max().into_scalar()
    }

    /// Weights of `mha` (h heads of width dh) with K/V head r taken from head `source(r)`, for `n` K/V heads.
    fn kv_heads_from(
        mha: &CausalSelfAttention,
        h: usize,
        dh: usize,
        n: usize,
        source: impl Fn(usize) -> usize,
    ) -> HashMap<String, TensorData> {
        let mut sd: HashMap<String, TensorData> = state_dict(mha).into_iter().collect();
        let w = Tensor::<2>::from_data(sd["c_attn.weight"].clone(), &Device::flex());
        let d = w.dims()[0];
        let head = |part: usize, r: usize| w.clone().slice([0..d, (part * h + r) * dh..(part * h + r + 1) * dh]);
        let q = w.clone().slice([0..d, 0..h * dh]);
        let k = (0..n).map(|r| head(1, source(r)));
        let v = (0..n).map(|r| head(2, source(r)));
        let fused = Tensor::cat(std::iter::once(q).chain(k).chain(v).collect(), 1);
        sd.insert("c_attn.weight".into(), fused.into_data());
        sd
    }

    #[test]
    fn gqa_with_g_equal_h_is_mha_and_query_head_r_reads_kv_head_r_over_h_by_g() {
        let dev = Device::flex();
        let (h, dh) = (4, 8);
        let base = ModelConfig { bias: false, ..ModelConfig::gpt(10, 1, h, h * dh, 16) };
        let mha = CausalSelfAttention::new(&base, &mut Rng::new(1), &dev);
        let x = Tensor::<3>::random([2, 6, h * dh], Distribution::Normal(0.0, 1.0), &dev);

        // g = h: the same weights give the same output.
        let g4 = CausalSelfAttention::new(&ModelConfig { n_kv_heads: Some(h), ..base.clone() }, &mut Rng::new(1), &dev);
        assert!(max_diff(g4.forward(x.clone(), None), mha.forward(x.clone(), None)) < 1e-6);

        // g = 2 (GQA) and g = 1 (MQA): K/V head j is MHA head j·(h/g); MHA with every K/V head r replaced by
        // head ⌊r / (h/g)⌋·(h/g) computes the same.
        for g in [2, 1] {
            let group = h / g;
            let cfg = ModelConfig { n_kv_heads: Some(g), ..base.clone() };
            let gqa = CausalSelfAttention::new(&cfg, &mut Rng::new(2), &dev);
            let gqa = load_state_dict(gqa, &kv_heads_from(&mha, h, dh, g, |j| j * group)).unwrap();
            let shared = CausalSelfAttention::new(&base, &mut Rng::new(3), &dev);
            let shared = load_state_dict(shared, &kv_heads_from(&mha, h, dh, h, |r| r / group * group)).unwrap();
            let (_, k, _) = gqa.qkv(x.clone(), None);
            assert_eq!(k.dims(), [2, g, 6, dh]);
            assert!(max_diff(gqa.forward(x.clone(), None), shared.forward(x.clone(), None)) < 1e-5, "g = {g}");
        }
    }
}
