//! LayerNorm and RMSNorm over the last dimension.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use ember_kernels::{NormParams, norm};

use crate::config::NormKind;
use crate::init::Init;

#[derive(Module, Debug)]
pub struct Norm {
    pub gamma: Param<Tensor<1>>,
    pub beta: Option<Param<Tensor<1>>>,
    #[module(skip)]
    kind: NormKind,
    eps: f64,
}

impl Norm {
    /// γ = 1, and β = 0 for LayerNorm with `bias` (RMSNorm has no β).
    pub fn new(kind: NormKind, d: usize, eps: f64, bias: bool, init: &mut Init) -> Self {
        let gamma = init.constant("gamma", [d], 1.0);
        let beta = (bias && kind == NormKind::LayerNorm).then(|| init.constant("beta", [d], 0.0));
        Self { gamma, beta, kind, eps }
    }

    /// γ ⊙ LN(x) + β with LN(x) = (x − μ) / sqrt(σ² + ε) (σ² biased), or γ ⊙ x / sqrt(mean(x²) + ε).
    pub fn forward<const D: usize>(&self, x: Tensor<D>) -> Tensor<D> {
        let params = NormParams { rms: self.kind == NormKind::RmsNorm, eps: self.eps };
        norm(x, self.gamma.val(), self.beta.as_ref().map(|b| b.val()), params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rng;
    use burn::tensor::{Device, TensorData};

    fn normed(kind: NormKind) -> Vec<f32> {
        let dev = Device::flex();
        let x = Tensor::<2>::from_data(TensorData::new(vec![2.0f32, 4.0, 6.0, 8.0], [1, 4]), &dev);
        let norm = Norm::new(kind, 4, 1e-12, true, &mut Init::draw(&mut Rng::new(0), &dev));
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
