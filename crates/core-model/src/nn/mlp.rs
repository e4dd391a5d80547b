//! The position-wise feed-forward network of GPT-2: GELU(x W_fc + b) W_proj + b, width 4d.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig, Gelu, Linear};
use burn::tensor::{Device, Tensor};

use crate::nn::attention::linear;
use crate::{ModelConfig, Rng};

#[derive(Module, Debug)]
pub struct Mlp {
    pub c_fc: Linear,
    pub c_proj: Linear,
    gelu: Gelu,
    drop: Dropout,
}

impl Mlp {
    pub fn new(config: &ModelConfig, rng: &mut Rng, device: &Device) -> Self {
        let d = config.d_model;
        let residual_std = 0.02 / (2.0 * config.n_layers as f64).sqrt();
        Self {
            c_fc: linear(rng, d, 4 * d, 0.02, config.bias, device),
            c_proj: linear(rng, 4 * d, d, residual_std, config.bias, device),
            gelu: Gelu::new(),
            drop: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// FFN(x) = GELU(x W_fc + b_fc) W_proj + b_proj (exact erf GELU, as torch.nn.GELU).
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        self.drop.forward(self.c_proj.forward(self.gelu.forward(self.c_fc.forward(x))))
    }
}
