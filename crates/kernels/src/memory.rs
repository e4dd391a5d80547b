//! What a wgpu device's memory pools hold, from cubecl's memory report.

use burn::backend::DispatchDevice;
use burn::cubecl::MemoryScope;
use burn::tensor::Device;

/// A device's memory, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Reserved from the driver by the pools now.
    pub reserved: u64,
    /// The largest single allocation the pools ever served: an O(T²) score matrix shows here.
    pub largest_allocation: u64,
}

/// The memory of a wgpu device (None for other devices).
pub fn device_memory(device: &Device) -> Option<DeviceMemory> {
    let DispatchDevice::Cube(cube) = device.as_dispatch().clone().inner() else { return None };
    let report = cube.client().memory_report(MemoryScope::Device);
    let pools = report.streams.iter().flat_map(|s| {
        let own = s.pools.dynamic.iter().chain([&s.pools.persistent, &s.pools.dedicated]);
        own.chain(s.auxiliary.iter().flat_map(|a| a.pools.dynamic.iter()))
    });
    let largest_allocation = pools.map(|p| p.largest_alloc).max().unwrap_or(0);
    Some(DeviceMemory { reserved: report.usage().bytes_reserved, largest_allocation })
}
