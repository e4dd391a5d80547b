//! Keeping data-parallel replicas equal: every rank's gradients averaged into one flat buffer reduced in a few large
//! all-reduces (not one per parameter), and a fingerprint of the parameters that shows the replicas have not drifted.

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::GradientsParams;
use burn::tensor::{Tensor, TensorData};
use ember_core_model::params;

use crate::collective::{Collective, fingerprint};

/// What the ranks' steps add up to.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Global {
    /// Mean loss per token over the global batch.
    pub loss: f32,
    /// Training tokens of all ranks.
    pub tokens: usize,
    /// Whether some rank asked to stop after this step.
    pub stop: bool,
}

/// g ← Σ_r n_r g_r / Σ_r n_r with n_r the training tokens of rank r's step: the gradient of the global batch's mean
/// loss per token. The loss is averaged the same way and `stop` ORed, in the same reduction. A parameter without a
/// gradient on this rank counts as a zero gradient.
pub fn average_gradients<M: Module>(
    model: &M,
    grads: &mut GradientsParams,
    loss: f32,
    tokens: usize,
    stop: bool,
    collective: &dyn Collective,
) -> Global {
    let mut flatten = Flatten { grads, parts: Vec::new() };
    model.visit(&mut flatten);
    let parts = flatten.parts;
    let device = parts.first().expect("a model has parameters").device();
    let weight = tokens as f32;
    let mut buf = (Tensor::cat(parts, 0) * weight).into_data().try_into_vec::<f32>().expect("f32 gradients");
    let n = buf.len();
    buf.extend([loss * weight, weight, stop as u8 as f32]);
    collective.all_reduce_sum(&mut buf);
    let (loss_sum, total, stops) = (buf[n], buf[n + 1], buf[n + 2]);
    let scale = 1.0 / total;
    buf.truncate(n);
    buf.iter_mut().for_each(|g| *g *= scale);
    let flat = Tensor::<1>::from_data(TensorData::new(buf, [n]), &device);
    model.visit(&mut Unflatten { grads: flatten.grads, flat, offset: 0 });
    Global { loss: loss_sum / total, tokens: total.round() as usize, stop: stops > 0.0 }
}

/// Each parameter's gradient (zeros where it has none), flattened, in the model's order.
struct Flatten<'a> {
    grads: &'a mut GradientsParams,
    parts: Vec<Tensor<1>>,
}

impl ModuleVisitor for Flatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let n = param.shape().num_elements();
        let part = match self.grads.get::<D>(param.id) {
            Some(g) => g.reshape([n]),
            None => Tensor::zeros([n], &param.val().inner().device()),
        };
        self.parts.push(part);
    }
}

/// Registers the averaged gradients, slices of `flat` in the order [`Flatten`] wrote them.
struct Unflatten<'a> {
    grads: &'a mut GradientsParams,
    flat: Tensor<1>,
    offset: usize,
}

impl ModuleVisitor for Unflatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let shape = param.shape();
        let n = shape.num_elements();
        let grad = self.flat.clone().narrow(0, self.offset, n).reshape(shape);
        self.grads.register::<D>(param.id, grad);
        self.offset += n;
    }
}

/// A fingerprint of every parameter's bytes, in the model's order: equal on two ranks exactly when their replicas
/// hold the same values (up to hash collisions).
pub fn parameter_fingerprint<M: Module>(model: &M) -> u64 {
    let bytes: Vec<u8> = params::state_dict(model).iter().flat_map(|(_, data)| data.as_bytes().to_vec()).collect();
    fingerprint(&bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collective::Single;
    use burn::nn::{Linear, LinearConfig};
    use burn::tensor::Device;

    /// Alone, averaging leaves the gradients as they were and reports the rank's own loss and tokens.
    #[test]
    fn one_rank_averages_to_its_own_gradients() {
        let (layer, mut grads) = crate::optim::tests::linear_and_gradients();
        let before = grads.get::<2>(layer.weight.id).unwrap().into_data();
        let global = average_gradients(&layer, &mut grads, 1.5, 7, false, &Single);
        assert_eq!(global, Global { loss: 1.5, tokens: 7, stop: false });
        let after = grads.get::<2>(layer.weight.id).unwrap().into_data();
        assert_eq!(after.shape(), before.shape());
        // g·7·(1/7) rounds twice: within 2 ulp of g.
        let diff =
            ember_test_support::max_abs_diff(&before.try_to_vec::<f32>().unwrap(), &after.try_to_vec::<f32>().unwrap());
        assert!(diff < 1e-6, "{diff}");
    }

    #[test]
    fn the_fingerprint_changes_with_any_parameter() {
        let dev = Device::flex();
        let layer: Linear = LinearConfig::new(3, 2).init(&dev);
        let same = parameter_fingerprint(&layer);
        assert_eq!(same, parameter_fingerprint(&layer.clone()));
        let mut bias = layer.bias.clone().unwrap();
        bias = bias.map(|b| b.add_scalar(1e-6));
        let moved = Linear { bias: Some(bias), ..layer };
        assert_ne!(same, parameter_fingerprint(&moved));
    }
}
