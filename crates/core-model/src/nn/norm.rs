//! LayerNorm and RMSNorm over the last dimension.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use ember_kernels::{NormParams, norm};

use crate::init::Init;
use ember_formats::config::{ModelConfig, NormKind};

#[derive(Module, Debug)]
pub struct Norm {
    pub gamma: Param<Tensor<1>>,
    pub beta: Option<Param<Tensor<1>>>,
    #[module(skip)]
    kind: NormKind,
    eps: f64,
}

/// A norm over vectors of width `d`: LayerNorm (with β when `bias`) or RMSNorm, ε = `eps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NormConfig {
    pub kind: NormKind,
    pub d: usize,
    pub eps: f64,
    pub bias: bool,
}

impl NormConfig {
    /// The norms of `model`'s blocks, over its width.
    pub fn of(model: &ModelConfig) -> Self {
        Self { kind: model.norm, d: model.d_model, eps: model.norm_eps, bias: model.bias }
    }

    /// γ = 1, and β = 0 for LayerNorm with `bias` (RMSNorm has no β).
    pub fn init(&self, init: &mut Init) -> Norm {
        let gamma = init.constant("gamma", [self.d], 1.0);
        let beta = (self.bias && self.kind == NormKind::LayerNorm).then(|| init.constant("beta", [self.d], 0.0));
        Norm { gamma, beta, kind: self.kind, eps: self.eps }
    }
}

impl Norm {
    /// γ ⊙ LN(x) + β with LN(x) = (x − μ) / sqrt(σ² + ε) (σ² biased), or γ ⊙ x / sqrt(mean(x²) + ε).
    ///
    /// # Shapes
    /// x [..., d] → [..., d].
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let params = NormParams { rms: self.kind == NormKind::RmsNorm, eps: self.eps };
        norm(x, self.gamma.val(), self.beta.as_ref().map(|b| b.val()), params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};
    use ember_formats::Rng;

    fn normed(kind: NormKind) -> Vec<f32> {
        let dev = Device::flex();
        let x = Tensor::<2>::from_data(TensorData::new(vec![2.0f32, 4.0, 6.0, 8.0], [1, 4]), &dev);
        let norm = NormConfig { kind, d: 4, eps: 1e-12, bias: true }.init(&mut Init::draw(&mut Rng::new(0), &dev));
        norm.forward(x).into_data().try_to_vec().unwrap()
    }

    fn close(a: &[f32], b: &[f64]) -> bool {
        a.iter().zip(b).all(|(x, y)| (*x as f64 - y).abs() < 1e-5)
    }

    #[test]
    fn layernorm_of_2_4_6_8_is_minus3_minus1_1_3_over_sqrt5() {
        let s = 5f64.sqrt();
        assert!(close(&normed(NormKind::LayerNorm), &[-3.0 / s, -1.0 / s, 1.0 / s, 3.0 / s]));
    }

    #[test]
    fn rmsnorm_of_2_4_6_8_is_itself_over_sqrt30() {
        let s = 30f64.sqrt();
        assert!(close(&normed(NormKind::RmsNorm), &[2.0 / s, 4.0 / s, 6.0 / s, 8.0 / s]));
    }
}
