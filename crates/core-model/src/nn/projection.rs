//! A decoder's projections and token embedding with their weight either dense (trainable, any device) or kept in a
//! GGUF file's ggml blocks ([`PackedLinear`]: inference on the CPU reads the blocks as they are).

use burn::module::Module;
use burn::nn::{Embedding, Linear};
use burn::tensor::{Device, Int, Tensor};
use ember_kernels::{PackedLinear, linear};

/// x W + b with W dense [d_in, d_out], or packed [d_out, d_in].
#[derive(Module, Debug)]
pub enum Projection {
    Dense(Linear),
    Packed(PackedLinear),
}

impl Projection {
    /// y = x W + b over the last dimension of x.
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Projection::Dense(layer) => linear(layer, x),
            Projection::Packed(layer) => layer.forward(x),
        }
    }

    /// The output width.
    pub fn d_out(&self) -> usize {
        match self {
            Projection::Dense(layer) => layer.weight.dims()[1],
            Projection::Packed(layer) => layer.d_out(),
        }
    }
}

/// The token embedding E [V, d]: dense, or packed rows (one per token).
#[derive(Module, Debug)]
pub enum TokenEmbedding {
    Dense(Embedding),
    Packed(PackedLinear),
}

impl TokenEmbedding {
    /// E[ids]: [B, T, d] for ids [B, T].
    pub fn forward(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        match self {
            TokenEmbedding::Dense(e) => e.forward(ids),
            TokenEmbedding::Packed(e) => e.rows(ids),
        }
    }

    /// x Eᵀ: logits [B, T, V] through an output projection tied to E.
    pub fn logits(&self, x: Tensor<3>) -> Tensor<3> {
        match self {
            TokenEmbedding::Dense(e) => ember_kernels::tied_linear(e.weight.val(), x),
            TokenEmbedding::Packed(e) => e.forward(x),
        }
    }

    /// The device the table lives on.
    pub fn device(&self) -> Device {
        match self {
            TokenEmbedding::Dense(e) => e.weight.device(),
            TokenEmbedding::Packed(e) => e.blocks.device(),
        }
    }
}
