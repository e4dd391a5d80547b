//! The wgpu adapters this machine offers (Vulkan / Metal / DX12; Mesa's lavapipe counts as a CPU adapter).

use burn::backend::wgpu::wgpu;

pub use wgpu::{Backend, DeviceType, Limits};

/// A wgpu adapter: name, kind, graphics API and limits.
pub struct Adapter {
    pub name: String,
    pub kind: DeviceType,
    pub backend: Backend,
    /// The driver's name and version, as the driver reports them.
    pub driver: String,
    pub limits: Limits,
}

impl Adapter {
    /// A discrete, integrated or virtual GPU, not a software rasteriser.
    pub fn is_real_gpu(&self) -> bool {
        matches!(self.kind, DeviceType::DiscreteGpu | DeviceType::IntegratedGpu | DeviceType::VirtualGpu)
    }
}

pub fn wgpu_adapters() -> Vec<Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .map(|a| {
            let info = a.get_info();
            let driver = format!("{} {}", info.driver, info.driver_info).trim().to_string();
            Adapter { name: info.name, kind: info.device_type, backend: info.backend, driver, limits: a.limits() }
        })
        .collect()
}
