//! Launching Ember's WGSL kernels on CubeCL's wgpu tensors: a shader file with its `{{ name }}` placeholders filled,
//! its buffers bound in order with the info words, and the device checks that route an op to them.

use burn::backend::wgpu::{CubeDim, CubeTensor, KernelSource, SourceKernel, SourceTemplate, into_contiguous};
use burn::cubecl::{CubeCount, prelude::KernelId, server::KernelArguments};
use burn::tensor::{DType, Device, Shape};

/// Whether `device` is a wgpu device (with or without autodiff), where the WGSL kernels run.
pub fn on_wgpu(device: &Device) -> bool {
    matches!(device.as_dispatch().clone().inner(), burn::backend::DispatchDevice::Cube(_))
}

/// A WGSL file with its `{{ name }}` placeholders filled; `{{ common }}` is the attention kernels' shared prologue
/// (`shaders/flash_common.wgsl`).
#[derive(Debug)]
pub(crate) struct Wgsl {
    pub name: &'static str,
    pub text: &'static str,
    pub values: Vec<(&'static str, String)>,
}

impl KernelSource for Wgsl {
    fn source(&self) -> SourceTemplate {
        let common =
            SourceTemplate::new(self.text).register("common", include_str!("../../../shaders/flash_common.wgsl"));
        self.values.iter().fold(common, |t, (k, v)| t.register(*k, v.as_str()))
    }
    fn id(&self) -> KernelId {
        KernelId::new::<Self>().info((self.name, self.values.clone()))
    }
    fn lang(&self) -> &'static str {
        "wgsl"
    }
}

/// Launches `kernel` with the tensors bound in order and the info words bound last.
pub(crate) fn launch(
    like: &CubeTensor,
    kernel: Wgsl,
    threads: u32,
    count: (u32, u32),
    tensors: &[&CubeTensor],
    info: &[u32],
) {
    launch_with_info_at(like, kernel, threads, [count.0, count.1, 1], tensors, tensors.len(), info);
}

/// The same over a grid of `count` workgroups with the info words bound at binding `at` and the tensors around it,
/// in order.
pub(crate) fn launch_with_info_at(
    like: &CubeTensor,
    kernel: Wgsl,
    threads: u32,
    count: [u32; 3],
    tensors: &[&CubeTensor],
    at: usize,
    info: &[u32],
) {
    let bytes: Vec<u8> = info.iter().flat_map(|w| w.to_le_bytes()).collect();
    let info = like.client.create_from_slice(&bytes);
    let mut buffers: Vec<_> = tensors.iter().map(|t| t.handle.clone().binding()).collect();
    buffers.insert(at, info.binding());
    like.client.launch(
        Box::new(SourceKernel::new(kernel, CubeDim::new_1d(threads))),
        CubeCount::Static(count[0], count[1], count[2]),
        KernelArguments::new().with_buffers(buffers),
    );
}

/// An uninitialised contiguous tensor of `dims` on `like`'s device.
pub(crate) fn empty(like: &CubeTensor, dims: &[usize], dtype: DType) -> CubeTensor {
    let shape = Shape::from(dims.to_vec());
    let handle = like.client.empty(shape.num_elements().max(1) * dtype.size());
    CubeTensor::new_contiguous(like.client.clone(), like.device.clone(), shape, handle, dtype)
}

/// `t`, which must be f32, contiguous in memory.
pub(crate) fn f32_contiguous(t: CubeTensor) -> CubeTensor {
    assert_eq!(t.dtype, DType::F32, "the WGSL kernels take f32 tensors here");
    into_contiguous(t)
}
