//! AdamW (Loshchilov & Hutter) with decoupled weight decay on chosen parameters, and clipping by the global
//! gradient norm over all parameters (as PyTorch's `clip_grad_norm_`).

use std::collections::{HashMap, HashSet};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use ember_core_model::params::ParamInfo;
use ember_kernels::{AdamWStep, adamw};

#[derive(Clone, Debug, PartialEq)]
pub struct AdamWConfig {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// First and second moments of one parameter, flattened.
struct Moments {
    m: Tensor<1>,
    v: Tensor<1>,
}

pub struct AdamW {
    config: AdamWConfig,
    decay: HashSet<ParamId>,
    moments: HashMap<ParamId, Moments>,
    /// Updates taken so far (t in the bias corrections).
    pub t: u64,
}

impl AdamW {
    /// An optimizer that decays exactly the parameters in `decay`.
    pub fn new(config: AdamWConfig, decay: HashSet<ParamId>) -> Self {
        Self { config, decay, moments: HashMap::new(), t: 0 }
    }

    /// One update of every parameter with a gradient: g ← c·g; m ← β₁m + (1−β₁)g; v ← β₂v + (1−β₂)g²;
    /// θ ← θ − η·λ·θ (decayed parameters only) − η·(m/(1−β₁ᵗ)) / (√(v/(1−β₂ᵗ)) + ε).
    pub fn step<M: Module>(&mut self, model: M, grads: &GradientsParams, lr: f64, grad_scale: f64) -> M {
        self.t += 1;
        let mut update = Update { optim: self, grads, lr, grad_scale };
        model.map(&mut update)
    }

    /// The moments by parameter path, as "m.<path>" and "v.<path>" tensors.
    pub fn state(&self, params: &[ParamInfo]) -> Vec<(String, TensorData)> {
        let mut out = Vec::new();
        for p in params {
            if let Some(mv) = self.moments.get(&p.id) {
                out.push((format!("m.{}", p.path), mv.m.clone().into_data()));
                out.push((format!("v.{}", p.path), mv.v.clone().into_data()));
            }
        }
        out
    }

    /// Restores moments written by [`AdamW::state`] onto the parameters of the model being trained, after `t`
    /// updates. Every parameter must have both moments, of its size, unless no update was taken yet: a checkpoint
    /// without them would not resume exactly.
    pub fn load_state(
        &mut self,
        params: &[ParamInfo],
        tensors: &HashMap<String, TensorData>,
        t: u64,
        device: &burn::tensor::Device,
    ) -> Result<(), String> {
        self.t = t;
        self.moments.clear();
        for p in params {
            let n: usize = p.shape.iter().product();
            let [m, v] = ["m", "v"].map(|k| tensors.get(&format!("{k}.{}", p.path)));
            let (Some(m), Some(v)) = (m, v) else {
                if t == 0 {
                    continue;
                }
                return Err(format!("it has no AdamW moments for {} after {t} updates", p.path));
            };
            for (k, data) in [("m", m), ("v", v)] {
                if data.rank() != 1 || data.num_elements() != n || data.dtype() != burn::tensor::DType::F32 {
                    return Err(format!(
                        "its AdamW moment {k}.{} is {:?} {:?}; the parameter needs [{n}] F32",
                        p.path,
                        data.shape().as_slice(),
                        data.dtype()
                    ));
                }
            }
            if v.iter::<f32>().any(|x| x < 0.0) {
                return Err(format!("its AdamW moment v.{} holds negative values (a mean of squares cannot)", p.path));
            }
            let moments = Moments { m: Tensor::from_data(m.clone(), device), v: Tensor::from_data(v.clone(), device) };
            self.moments.insert(p.id, moments);
        }
        Ok(())
    }
}

struct Update<'a> {
    optim: &'a mut AdamW,
    grads: &'a GradientsParams,
    lr: f64,
    grad_scale: f64,
}

impl ModuleMapper for Update<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some(grad) = self.grads.get::<D>(id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let c = &self.optim.config;
        let shape = tensor.dims();
        let n: usize = shape.iter().product();
        let require_grad = tensor.is_require_grad();
        let theta = tensor.inner().reshape([n]);
        let (m, v) = match self.optim.moments.remove(&id) {
            Some(Moments { m, v }) => (m, v),
            None => (Tensor::zeros([n], &theta.device()), Tensor::zeros([n], &theta.device())),
        };
        let t = self.optim.t as i32;
        let step = AdamWStep {
            lr: self.lr,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            decay: if self.optim.decay.contains(&id) { 1.0 - self.lr * c.weight_decay } else { 1.0 },
            bc1: 1.0 - c.beta1.powi(t),
            bc2: 1.0 - c.beta2.powi(t),
            grad_scale: self.grad_scale,
        };
        let (theta, m, v) = adamw(theta, grad.reshape([n]), m, v, step);
        self.optim.moments.insert(id, Moments { m, v });
        let updated = Tensor::from_inner(theta.reshape(shape));
        let updated = if require_grad { updated.require_grad() } else { updated };
        Param::from_mapped_value(id, updated, mapper)
    }
}

/// ‖g‖ = √(Σ_params Σ g²) over every gradient of `model`, read back as one number.
pub fn global_grad_norm<M: Module>(model: &M, grads: &GradientsParams) -> f64 {
    struct SumSquares<'a> {
        grads: &'a GradientsParams,
        total: Option<Tensor<1>>,
    }
    impl ModuleVisitor for SumSquares<'_> {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if let Some(g) = self.grads.get::<D>(param.id) {
                let s = g.square().sum();
                self.total = Some(match self.total.take() {
                    Some(t) => t + s,
                    None => s,
                });
            }
        }
    }
    let mut visitor = SumSquares { grads, total: None };
    model.visit(&mut visitor);
    visitor.total.map_or(0.0, |t| (t.into_scalar::<f32>() as f64).sqrt())
}

/// PyTorch's clip coefficient: min(1, max_norm / (‖g‖ + 1e-6)); clipping is off when `max_norm` is 0.
pub fn clip_scale(norm: f64, max_norm: f64) -> f64 {
    if max_norm > 0.0 { (max_norm / (norm + 1e-6)).min(1.0) } else { 1.0 }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Device;

    /// A 3 → 2 linear layer and the gradients of f = Σ (x W + b) at x = [1, −2, 0.5]: dL/dW[i][j] = x[i], dL/db = 1.
    pub(crate) fn linear_and_gradients() -> (Linear, GradientsParams) {
        let dev = Device::flex().autodiff();
        let layer: Linear = LinearConfig::new(3, 2).init(&dev);
        let x = Tensor::<2>::from_data(TensorData::new(vec![1f32, -2.0, 0.5], [1, 3]), &dev);
        let grads = GradientsParams::from_grads(layer.forward(x).sum().backward(), &layer);
        (layer, grads)
    }

    /// One AdamW step on f(W) = Σ W x (gradient x broadcast) checked against the closed form of the first step:
    /// m̂ = g, v̂ = g², so θ₁ = θ₀(1 − ηλ) − η·g/(|g| + ε).
    #[test]
    fn first_step_matches_closed_form_and_decay_only_where_asked() {
        let (layer, grads) = linear_and_gradients();
        let before_w = layer.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let before_b = layer.bias.as_ref().unwrap().val().into_data().try_to_vec::<f32>().unwrap();
        let config = AdamWConfig { beta1: 0.9, beta2: 0.99, eps: 1e-8, weight_decay: 0.1 };
        let mut optim = AdamW::new(config, HashSet::from([layer.weight.id]));
        let (lr, scale) = (0.01, 0.5);
        let layer = optim.step(layer, &grads, lr, scale);
        let after_w = layer.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let after_b = layer.bias.as_ref().unwrap().val().into_data().try_to_vec::<f32>().unwrap();
        // dL/dW[i][j] = x[i]; dL/db = 1. Scaled gradients keep their sign, so each step is −η·sign(g).
        let gx = [1f32, -2.0, 0.5];
        for i in 0..3 {
            for j in 0..2 {
                let expect = before_w[i * 2 + j] * (1.0 - 0.01 * 0.1) - 0.01 * gx[i].signum();
                assert!((after_w[i * 2 + j] - expect).abs() < 1e-6);
            }
        }
        for j in 0..2 {
            assert!((after_b[j] - (before_b[j] - 0.01)).abs() < 1e-6, "biases are not decayed");
        }
        assert!(layer.weight.val().is_require_grad());
    }

    #[test]
    fn global_norm_spans_all_parameters() {
        let dev = Device::flex().autodiff();
        let layer: Linear = LinearConfig::new(3, 2).init(&dev);
        let x = Tensor::<2>::from_data(TensorData::new(vec![1f32, -2.0, 0.5], [1, 3]), &dev);
        let grads = GradientsParams::from_grads(layer.forward(x).sum().backward(), &layer);
        // ‖g‖² = 2·(1 + 4 + 0.25) for W plus 2·1 for b.
        let norm = global_grad_norm(&layer, &grads);
        assert!((norm - (2.0 * 5.25f64 + 2.0).sqrt()).abs() < 1e-5);
        assert!((clip_scale(norm, 1.0) - 1.0 / (norm + 1e-6)).abs() < 1e-9);
        assert_eq!(clip_scale(0.5, 1.0), 1.0);
        assert_eq!(clip_scale(10.0, 0.0), 1.0);
    }
}
