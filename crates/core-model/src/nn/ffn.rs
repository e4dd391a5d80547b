//! The position-wise feed-forward network: GELU / ReLU MLPs of GPT-2 and the 2017 Transformer, and SwiGLU of Llama.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::{gelu_approximate, relu};
use ember_kernels::{gelu, swiglu};

use crate::ModelConfig;
use crate::config::FfnKind;
use crate::init::Init;
use crate::nn::projection;
use crate::nn::projection::Projection;

#[derive(Module, Debug)]
pub struct Ffn {
    /// W_fc, the up-projection (W_u for SwiGLU).
    pub c_fc: Projection,
    /// W_g, SwiGLU's gate.
    pub c_gate: Option<Projection>,
    /// W_proj, the down-projection (W_d).
    pub c_proj: Projection,
    #[module(skip)]
    kind: FfnKind,
    drop: Dropout,
}

impl Ffn {
    /// GPT-2 init: N(0, 0.02), the residual projection N(0, 0.02/√(2L)).
    pub fn new(config: &ModelConfig, init: &mut Init) -> Self {
        let (d, f) = (config.d_model, config.ffn_dim());
        let residual_std = 0.02 / (2.0 * config.n_layers as f64).sqrt();
        let c_fc = projection(init, "c_fc", d, f, 0.02, config.bias);
        let gated = matches!(config.ffn, FfnKind::Swiglu | FfnKind::Geglu);
        let c_gate = gated.then(|| projection(init, "c_gate", d, f, 0.02, config.bias));
        Self {
            c_fc,
            c_gate,
            c_proj: projection(init, "c_proj", f, d, residual_std, config.bias),
            kind: config.ffn,
            drop: DropoutConfig::new(config.dropout).init(),
        }
    }

    /// FFN(x) = act(x W_fc + b) W_proj + b, or SwiGLU: [SiLU(x W_g) ⊙ (x W_u)] W_d, or GeGLU:
    /// [GELU-tanh(x W_g) ⊙ (x W_u)] W_d.
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = match (&self.c_gate, self.kind) {
            (Some(gate), FfnKind::Geglu) => gelu_approximate(gate.forward(x.clone())) * self.c_fc.forward(x),
            (Some(gate), _) => swiglu(gate.forward(x.clone()), self.c_fc.forward(x)),
            (None, FfnKind::Relu) => relu(self.c_fc.forward(x)),
            (None, FfnKind::GeluTanh) => gelu_approximate(self.c_fc.forward(x)),
            (None, _) => gelu(self.c_fc.forward(x)),
        };
        self.drop.forward(self.c_proj.forward(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use crate::params::param_infos;
    use burn::tensor::Device;

    fn count(config: &ModelConfig) -> usize {
        let ffn = Ffn::new(config, &mut Init::draw(&mut Rng::new(0), &Device::flex()));
        param_infos(&ffn).iter().map(|p| p.shape.iter().product::<usize>()).sum()
    }

    #[test]
    fn swiglu_at_eight_thirds_d_has_the_parameters_of_a_4d_mlp() {
        let gelu = ModelConfig { bias: false, ..ModelConfig::gpt(10, 2, 4, 96, 16) };
        let swiglu = ModelConfig { ffn: FfnKind::Swiglu, d_ff: Some(8 * 96 / 3), ..gelu.clone() };
        assert_eq!(count(&gelu), 2 * 96 * 384);
        assert_eq!(count(&swiglu), count(&gelu));
    }
}
