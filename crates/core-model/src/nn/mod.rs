//! The layers a Transformer block is made of.

pub mod attention;
pub mod ffn;
pub mod mla;
pub mod norm;
pub mod position;

use burn::nn::Linear;
use burn::tensor::Device;

use crate::{Rng, init};

/// A linear layer x W + b with W ~ N(0, std²) of shape [d_in, d_out] and b = 0.
pub fn linear(rng: &mut Rng, d_in: usize, d_out: usize, std: f64, bias: bool, device: &Device) -> Linear {
    Linear {
        weight: init::normal(rng, [d_in, d_out], std, device),
        bias: bias.then(|| init::constant([d_out], 0.0, device)),
    }
}
