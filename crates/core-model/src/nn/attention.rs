//! Causal multi-head self-attention with a fused QKV projection (GPT-2's `c_attn`).

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Linear};
use burn::tensor::Tensor;
use ember_kernels::{AttentionSpec, attention};

use crate::init;
use crate::{ModelConfig, Rng};

#[derive(Module, Debug)]
pub struct CausalSelfAttention {
    pub c_attn: Linear,
    pub c_proj: Linear,
    resid_drop: Dropout,
    n_heads: usize,
}

impl CausalSelfAttention {
    /// GPT-2 init: N(0, 0.02) weights, residual projection N(0, 0.02/√(2L)), zero biases.
    pub fn new(config: &ModelConfig, rng: &mut Rng, device: &burn::tensor::Device) -> Self {
        let d = config.d_model;
        let residual_std = 0.02 / (2.0 * config.n_layers as f64).sqrt();
        Self {
            c_attn: linear(rng, d, 3 * d, 0.02, config.bias, device),
            c_proj: linear(rng, d, d, residual_std, config.bias, device),
            resid_drop: DropoutConfig::new(config.dropout).init(),
            n_heads: config.n_heads,
        }
    }

    /// y = softmax(q kᵀ / √d_k + causal mask) v, heads concatenated, then W_O.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let [b, t, c] = x.dims();
        let (h, d) = (self.n_heads, c / self.n_heads);
        let heads = |z: Tensor<3>| z.reshape([b, t, h, d]).swap_dims(1, 2); // [b, h, t, d]
        let mut qkv = self.c_attn.forward(x).chunk(3, 2);
        let v = heads(qkv.pop().expect("v"));
        let k = heads(qkv.pop().expect("k"));
        let q = heads(qkv.pop().expect("q"));
        let y = attention(q, k, v, &AttentionSpec::causal(d));
        let y = y.swap_dims(1, 2).reshape([b, t, c]);
        self.resid_drop.forward(self.c_proj.forward(y))
    }
}

/// A linear layer x W + b with W ~ N(0, std²) of shape [d_in, d_out] and b = 0.
pub fn linear(rng: &mut Rng, d_in: usize, d_out: usize, std: f64, bias: bool, device: &burn::tensor::Device) -> Linear {
    Linear {
        weight: init::normal(rng, [d_in, d_out], std, device),
        bias: bias.then(|| init::constant([d_out], 0.0, device)),
    }
}
