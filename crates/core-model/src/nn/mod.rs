//! The layers a Transformer block is made of.

pub mod attention;
pub mod cross_attention;
pub mod ffn;
pub mod mla;
pub mod norm;
pub mod position;
pub mod residual;

use burn::nn::{Embedding, Linear};
use burn::tensor::{Device, Tensor};

use crate::{Rng, init};

/// A linear layer x W + b with W ~ N(0, std²) of shape [d_in, d_out] and b = 0.
pub fn linear_layer(rng: &mut Rng, d_in: usize, d_out: usize, std: f64, bias: bool, device: &Device) -> Linear {
    Linear {
        weight: init::normal(rng, [d_in, d_out], std, device),
        bias: bias.then(|| init::constant([d_out], 0.0, device)),
    }
}

/// Logits x Eᵀ [B, T, V] of hidden states x [B, T, d] through an output projection tied to the embedding E [V, d].
pub fn tied_logits(embedding: &Embedding, x: Tensor<3>) -> Tensor<3> {
    ember_kernels::tied_linear(embedding.weight.val(), x)
}
