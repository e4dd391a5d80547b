//! What the CPU kernels share: burn-flex tensors as contiguous f32 slices and back, and whether a device is the CPU.

use burn::backend::flex::FlexTensor;
use burn::tensor::{Device, TensorData};

/// The tensor with a contiguous layout (copied only when it has none).
pub fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.is_contiguous() { t } else { t.to_contiguous() }
}

/// The values of a contiguous f32 tensor.
pub fn floats(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("the CPU kernels take contiguous f32 tensors")
}

/// A tensor of `shape` holding `values`.
pub fn tensor(values: Vec<f32>, shape: &[usize]) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape.to_vec()))
}

/// Whether `device` is the CPU device (burn-flex), under autodiff or not.
pub fn on_cpu(device: &Device) -> bool {
    matches!(device.as_dispatch().clone().inner(), burn::backend::DispatchDevice::Flex(_))
}
