//! `--device cpu|ndarray|flex|wgpu|auto`: which Burn device a command runs on.

use anyhow::{Result, bail};
use burn::tensor::{Device, DeviceKind};
use clap::ValueEnum;
use ember_core_model::config::Precision;
use ember_core_model::weights::WeightFormat;
use ember_kernels::adapters::{DeviceType, Features};
use ember_kernels::{Adapter, wgpu_adapters};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeviceChoice {
    /// The faster CPU backend for training on this machine (burn-flex; see README for the figures).
    Cpu,
    /// burn-ndarray.
    Ndarray,
    /// burn-flex.
    Flex,
    /// wgpu on the best adapter found (Vulkan / Metal / DX12; lavapipe counts).
    Wgpu,
    /// A real GPU through wgpu when there is one, else `cpu`.
    Auto,
}

/// The device for a choice, and a one-line description of it.
pub fn select(choice: DeviceChoice) -> Result<(Device, String)> {
    let (device, description, _) = pick(choice)?;
    Ok((device, description))
}

/// [`select`], the precision `dtype` runs in on that device ([`precision_on`]), and whether it runs in the
/// machine's memory (no wgpu adapter: the CPU backends).
pub fn select_in(choice: DeviceChoice, dtype: Precision) -> Result<(Device, String, Precision, bool)> {
    let (device, description, adapter) = pick(choice)?;
    Ok((device, description, precision_on(dtype, adapter.as_ref()), adapter.is_none()))
}

/// The device for a choice, its description, and the wgpu adapter it runs on (None on the CPU).
fn pick(choice: DeviceChoice) -> Result<(Device, String, Option<Adapter>)> {
    #[allow(deprecated)] // burn-ndarray is deprecated upstream; Ember keeps it selectable.
    let ndarray = || Device::ndarray();
    Ok(match choice {
        DeviceChoice::Cpu | DeviceChoice::Flex => {
            (Device::flex(), format!("cpu (burn-flex; {})", ember_kernels::level::describe()), None)
        }
        DeviceChoice::Ndarray => (ndarray(), "cpu (burn-ndarray)".into(), None),
        DeviceChoice::Wgpu => {
            let Some(best) = adapter(choice) else {
                bail!("no wgpu adapter found (install a Vulkan driver, e.g. mesa-vulkan-drivers for lavapipe)");
            };
            (Device::wgpu(DeviceKind::DefaultDevice), describe(&best), Some(best))
        }
        DeviceChoice::Auto => match adapter(choice) {
            Some(gpu) => (Device::wgpu(DeviceKind::DefaultDevice), describe(&gpu), Some(gpu)),
            None => pick(DeviceChoice::Cpu)?,
        },
    })
}

/// The device for a choice on the `local_rank`-th rank of a machine, its description, and the precision `dtype` runs
/// in there ([`precision_on`]): on wgpu, that rank's real GPU (ranks beyond the GPUs share them in turn; without a
/// real GPU every rank takes the default adapter); the CPU is the CPU.
pub fn select_local_in(
    choice: DeviceChoice,
    local_rank: usize,
    dtype: Precision,
) -> Result<(Device, String, Precision)> {
    let (device, description, adapter) = pick_local(choice, local_rank)?;
    Ok((device, description, precision_on(dtype, adapter.as_ref())))
}

fn pick_local(choice: DeviceChoice, local_rank: usize) -> Result<(Device, String, Option<Adapter>)> {
    if local_rank == 0 || !matches!(choice, DeviceChoice::Wgpu | DeviceChoice::Auto) {
        return pick(choice);
    }
    let gpus: Vec<Adapter> = wgpu_adapters().into_iter().filter(Adapter::is_real_gpu).collect();
    if gpus.is_empty() {
        return pick(choice);
    }
    let chosen = local_rank % gpus.len();
    // Burn numbers the adapters of each type apart: the GPU's index among those of its type.
    let kind = gpus[chosen].kind;
    let index = gpus[..chosen].iter().filter(|a| a.kind == kind).count();
    let gpu = gpus.into_iter().nth(chosen).expect("chosen < gpus.len()");
    let kind = match kind {
        DeviceType::IntegratedGpu => DeviceKind::IntegratedGpu(index),
        DeviceType::VirtualGpu => DeviceKind::VirtualGpu(index),
        _ => DeviceKind::DiscreteGpu(index),
    };
    Ok((Device::wgpu(kind), describe(&gpu), Some(gpu)))
}

/// Whether a choice runs in the machine's memory (the CPU backends), where memory admission applies.
pub fn on_host(choice: DeviceChoice) -> bool {
    match choice {
        DeviceChoice::Cpu | DeviceChoice::Ndarray | DeviceChoice::Flex => true,
        DeviceChoice::Auto => adapter(choice).is_none(),
        DeviceChoice::Wgpu => false,
    }
}

/// The wgpu adapter a choice runs on: `wgpu` the first real GPU, else the first adapter; `auto` a real GPU only;
/// None on the CPU.
pub fn adapter(choice: DeviceChoice) -> Option<Adapter> {
    let found = wgpu_adapters();
    match choice {
        DeviceChoice::Wgpu => {
            let best = found.iter().position(Adapter::is_real_gpu).unwrap_or(0);
            found.into_iter().nth(best)
        }
        DeviceChoice::Auto => found.into_iter().find(Adapter::is_real_gpu),
        DeviceChoice::Cpu | DeviceChoice::Ndarray | DeviceChoice::Flex => None,
    }
}

/// "wgpu (adapter, backend, driver …; cubecl's WGSL runtime)".
fn describe(adapter: &Adapter) -> String {
    let driver = if adapter.driver.is_empty() { String::new() } else { format!(", driver {}", adapter.driver) };
    format!("wgpu ({}, {:?}{driver}; cubecl-wgpu runtime, WGSL)", adapter.name, adapter.backend)
}

/// The weights to load for `--weights weights` in `precision`: f16 holds dense weights (from any stored format), so
/// packed formats are refused.
pub fn weights_in(precision: Precision, weights: WeightFormat) -> Result<WeightFormat> {
    match (precision, weights) {
        (Precision::F32, weights) => Ok(weights),
        (Precision::F16, WeightFormat::Native | WeightFormat::F32) => Ok(WeightFormat::F32),
        (Precision::F16, other) => bail!("--dtype f16 holds dense f16 weights: --weights {other} cannot go with it"),
    }
}

/// What `precision` runs as on `adapter`: f16 where it has `SHADER_F16`; elsewhere (the CPU, None) f32, with a note
/// on stderr when f16 was asked (the CPU kernels are f32).
pub fn precision_on(precision: Precision, adapter: Option<&Adapter>) -> Precision {
    if precision == Precision::F32 {
        return precision;
    }
    match adapter {
        Some(a) if a.features.contains(Features::SHADER_F16) => precision,
        Some(a) => {
            eprintln!("note: {} has no f16 shaders (wgpu SHADER_F16); running in f32", a.name);
            Precision::F32
        }
        None => {
            eprintln!("note: f16 runs on wgpu adapters with SHADER_F16; the CPU runs in f32");
            Precision::F32
        }
    }
}
