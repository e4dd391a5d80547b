//! The layers a Transformer block is made of.

pub mod attention;
pub mod cross_attention;
pub mod ffn;
pub mod mla;
pub mod norm;
pub mod position;
pub mod residual;

use burn::nn::{Embedding, Linear};
use burn::tensor::Tensor;

use crate::init::Init;

/// A linear layer `name`: x W + b with W ~ N(0, std²) of shape [d_in, d_out] and b = 0.
pub fn linear_layer(init: &mut Init, name: &str, d_in: usize, d_out: usize, std: f64, bias: bool) -> Linear {
    Linear {
        weight: init.normal(&format!("{name}.weight"), [d_in, d_out], std),
        bias: bias.then(|| init.constant(&format!("{name}.bias"), [d_out], 0.0)),
    }
}

/// An embedding table `name`: E [n, d] with E ~ N(0, std²).
pub fn embedding(init: &mut Init, name: &str, n: usize, d: usize, std: f64) -> Embedding {
    Embedding { weight: init.normal(&format!("{name}.weight"), [n, d], std) }
}

/// Logits x Eᵀ [B, T, V] of hidden states x [B, T, d] through an output projection tied to the embedding E [V, d].
pub fn tied_logits(embedding: &Embedding, x: Tensor<3>) -> Tensor<3> {
    ember_kernels::tied_linear(embedding.weight.val(), x)
}
