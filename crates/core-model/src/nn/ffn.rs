//! The position-wise feed-forward network: GELU / ReLU MLPs of GPT-2 and the 2017 Transformer, and SwiGLU of Llama.

use burn::module::Module;
use burn::nn::{Dropout, DropoutConfig};
use burn::tensor::Tensor;
use burn::tensor::activation::{relu, silu};
use ember_kernels::{geglu, gelu, gelu_tanh, swiglu};

use crate::init::Init;
use crate::nn::projection;
use crate::nn::projection::Projection;
use ember_formats::config::FfnKind;
use ember_formats::config::ModelConfig;

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

/// An FFN d → f → d: its activation, biases, dropout on its output, and the init scale of its down-projection.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FfnConfig {
    pub d_model: usize,
    pub hidden: usize,
    pub kind: FfnKind,
    pub bias: bool,
    pub dropout: f64,
    /// σ of W_proj's initial weights (GPT-2: 0.02/√(2L), the residual scaling).
    pub residual_std: f64,
}

impl FfnConfig {
    /// The FFN of each block of `model`.
    pub fn of(model: &ModelConfig) -> Self {
        Self {
            d_model: model.d_model,
            hidden: model.ffn_dim(),
            kind: model.ffn,
            bias: model.bias,
            dropout: model.dropout,
            residual_std: model.residual_std(),
        }
    }

    /// GPT-2 init: N(0, 0.02), the down-projection N(0, `residual_std`).
    pub fn init(&self, init: &mut Init) -> Ffn {
        let (d, f, bias) = (self.d_model, self.hidden, self.bias);
        let gated = matches!(self.kind, FfnKind::Swiglu | FfnKind::Geglu);
        Ffn {
            c_fc: projection(init, "c_fc", d, f, 0.02, bias),
            c_gate: gated.then(|| projection(init, "c_gate", d, f, 0.02, bias)),
            c_proj: projection(init, "c_proj", f, d, self.residual_std, bias),
            kind: self.kind,
            drop: DropoutConfig::new(self.dropout).init(),
        }
    }
}

impl Ffn {
    /// FFN(x) = act(x W_fc + b) W_proj + b (act ReLU, GELU, its tanh form or SiLU), or SwiGLU: [SiLU(x W_g) ⊙ (x W_u)] W_d, or GeGLU:
    /// [GELU-tanh(x W_g) ⊙ (x W_u)] W_d.
    ///
    /// # Shapes
    /// x [B, T, d] → [B, T, d].
    pub fn forward(&self, x: Tensor<3>) -> Tensor<3> {
        let h = match (&self.c_gate, self.kind) {
            (Some(gate), FfnKind::Geglu) => geglu(gate.forward(x.clone()), self.c_fc.forward(x)),
            (Some(gate), _) => swiglu(gate.forward(x.clone()), self.c_fc.forward(x)),
            (None, FfnKind::Relu) => relu(self.c_fc.forward(x)),
            (None, FfnKind::GeluTanh) => gelu_tanh(self.c_fc.forward(x)),
            (None, FfnKind::Silu) => silu(self.c_fc.forward(x)),
            (None, _) => gelu(self.c_fc.forward(x)),
        };
        self.drop.forward(self.c_proj.forward(h))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::param_infos;
    use burn::tensor::Device;
    use ember_formats::Rng;

    fn count(config: &ModelConfig) -> usize {
        let ffn = FfnConfig::of(config).init(&mut Init::draw(&mut Rng::new(0), &Device::flex()));
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
