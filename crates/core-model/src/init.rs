//! Parameter initialisation from Ember's own generator, so the same seed gives the same weights on every device.

use burn::module::Param;
use burn::tensor::{Device, Tensor, TensorData};

use crate::Rng;

/// A parameter drawn from N(0, std²) (zeros from a placeholder generator).
pub fn normal<const D: usize>(rng: &mut Rng, shape: [usize; D], std: f64, device: &Device) -> Param<Tensor<D>> {
    if rng.is_placeholder() {
        return constant(shape, 0.0, device);
    }
    let n = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|_| (rng.normal() * std) as f32).collect();
    Param::from_data(TensorData::new(values, shape), device)
}

/// A parameter filled with one value (zeros for biases, ones for norm gains).
pub fn constant<const D: usize>(shape: [usize; D], value: f32, device: &Device) -> Param<Tensor<D>> {
    let n = shape.iter().product();
    Param::from_data(TensorData::new(vec![value; n], shape), device)
}
