//! The layers a Transformer block is made of.

pub mod attention;
pub mod cross_attention;
pub mod ffn;
pub mod mla;
pub mod norm;
pub mod position;
pub mod projection;
pub mod residual;

use burn::nn::{Embedding, Linear};
use burn::tensor::Tensor;

use crate::init::Init;
use crate::nn::projection::{Projection, TokenEmbedding};
use ember_kernels::PackedLinear;

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

/// A decoder projection `name` [d_in → d_out]: the stored packed matrix at its path when the model is loaded from
/// one onto the CPU, else a [`linear_layer`] (drawn, or read dense; a packed matrix loaded onto another device is
/// dequantized).
pub fn projection(init: &mut Init, name: &str, d_in: usize, d_out: usize, std: f64, bias: bool) -> Projection {
    match init.packed(&format!("{name}.weight"), [d_out, d_in]) {
        Some(w) => {
            let bias = bias.then(|| init.constant(&format!("{name}.bias"), [d_out], 0.0));
            Projection::Packed(PackedLinear::new(&w, bias, init.device()))
        }
        None => Projection::Dense(linear_layer(init, name, d_in, d_out, std, bias)),
    }
}

/// A token embedding `name` [n, d]: packed or dense as [`projection`] decides.
pub fn token_embedding(init: &mut Init, name: &str, n: usize, d: usize, std: f64) -> TokenEmbedding {
    match init.packed(&format!("{name}.weight"), [n, d]) {
        Some(w) => TokenEmbedding::Packed(PackedLinear::new(&w, None, init.device())),
        None => TokenEmbedding::Dense(embedding(init, name, n, d, std)),
    }
}
