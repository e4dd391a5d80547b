//! The wgpu adapters this machine offers (Vulkan / Metal / DX12; Mesa's lavapipe counts as a CPU adapter).

use burn::backend::wgpu::wgpu;

pub use wgpu::{Backend, CooperativeMatrixProperties, CooperativeScalarType, DeviceType, Features, Limits};

use crate::spec::KernelTier;

/// A wgpu adapter: name, kind, graphics API, features and limits.
pub struct Adapter {
    pub name: String,
    pub kind: DeviceType,
    pub backend: Backend,
    /// The driver's name and version, as the driver reports them.
    pub driver: String,
    pub features: Features,
    /// Smallest and largest subgroup size (0, 0 where the adapter does not say).
    pub subgroup_sizes: (u32, u32),
    pub limits: Limits,
    /// The cooperative-matrix shapes and types wgpu runs on it (with `EXPERIMENTAL_COOPERATIVE_MATRIX`).
    pub cooperative: Vec<CooperativeMatrixProperties>,
}

impl Adapter {
    /// A discrete, integrated or virtual GPU, not a software rasteriser.
    pub fn is_real_gpu(&self) -> bool {
        matches!(self.kind, DeviceType::DiscreteGpu | DeviceType::IntegratedGpu | DeviceType::VirtualGpu)
    }

    /// The attention tiers the adapter runs: portable everywhere, subgroup with wgpu's `SUBGROUP` and subgroups of at
    /// least 8 lanes (lavapipe has them: 8 lanes).
    pub fn tiers(&self) -> Vec<KernelTier> {
        let subgroups = self.features.contains(Features::SUBGROUP) && self.subgroup_sizes.0 >= 8;
        [KernelTier::Portable].into_iter().chain(subgroups.then_some(KernelTier::Subgroup)).collect()
    }

    /// The sides N the cooperative-matrix kernels run here with, largest first: `EXPERIMENTAL_COOPERATIVE_MATRIX`
    /// with N×N×N products of f16 matrices into f32, N 16 (NVIDIA, AMD and Intel GPUs under Vulkan) or 8 (Mesa 26's
    /// lavapipe).
    pub fn cooperative_sides(&self) -> Vec<u32> {
        let offered = |n: u32| {
            self.cooperative.iter().any(|p| {
                (p.m_size, p.n_size, p.k_size) == (n, n, n)
                    && p.ab_type == CooperativeScalarType::F16
                    && p.cr_type == CooperativeScalarType::F32
            })
        };
        let on = self.features.contains(Features::EXPERIMENTAL_COOPERATIVE_MATRIX);
        [16, 8].into_iter().filter(|&n| on && offered(n)).collect()
    }

    /// The tier the kernels pick by default: subgroup where CubeCL enables subgroup operations (a GPU, not a CPU
    /// adapter, with `SUBGROUP`), else portable.
    pub fn default_tier(&self) -> KernelTier {
        let tiers = self.tiers();
        if self.kind != DeviceType::Cpu && tiers.contains(&KernelTier::Subgroup) {
            KernelTier::Subgroup
        } else {
            KernelTier::Portable
        }
    }
}

pub fn wgpu_adapters() -> Vec<Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .into_iter()
        .map(|a| {
            let info = a.get_info();
            let driver = format!("{} {}", info.driver, info.driver_info).trim().to_string();
            Adapter {
                name: info.name,
                kind: info.device_type,
                backend: info.backend,
                driver,
                features: a.features(),
                subgroup_sizes: (info.subgroup_min_size, info.subgroup_max_size),
                limits: a.limits(),
                cooperative: a.cooperative_matrix_properties(),
            }
        })
        .collect()
}
