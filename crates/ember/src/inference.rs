//! What every command that runs a model for inference shares (`generate`, `serve`, `bench decode`, `bench serve`):
//! the flags that say how a model is held and where its keys and values live, the placement decided once (device,
//! precision, whether it runs in the machine's memory), and one loader that loads, casts, returns the loading buffers
//! and admits the KV stores; the one place a model is loaded, for every command that scores or converts one too.

use std::path::Path;

use anyhow::Result;
use burn::tensor::Device;
use clap::Args;
use ember_core_model::bundle::Bundle;
use ember_core_model::config::{ModelConfig, Precision};
use ember_core_model::weights::WeightFormat;
use ember_core_model::{import, params};
use ember_serve::{KvKind, KvSpec};

use crate::devices::{self, DeviceChoice};
use crate::{admission, allocator};

/// How a model's weights are held.
#[derive(Args, Clone, Copy)]
pub struct HoldFlags {
    /// How projections and the token embedding are held on the CPU and wgpu: native (a GGUF file's blocks, used as
    /// they are; a run directory as stored), f32, or converted to f16, bf16, q8_0, q4_0, q4_1, q5_0 or q5_1.
    #[arg(long, default_value = "native")]
    pub weights: WeightFormat,
    /// f16: weights (dense, from any stored format), activations and the KV stores in f16, on wgpu adapters with
    /// `SHADER_F16` (elsewhere f32, with a note).
    #[arg(long, default_value = "f32")]
    pub dtype: Precision,
}

/// Where keys and values live between decoding steps.
#[derive(Args, Clone, Copy)]
pub struct KvFlags {
    /// contiguous, paged, int8, int4, state (linear attention's fixed recurrent state) or none (recompute); by
    /// default state for linear-attention models, else contiguous.
    #[arg(long)]
    pub kv_cache: Option<KvKind>,
    /// Tokens per page of the paged store.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Values per scale of the int8 / int4 stores.
    #[arg(long, default_value_t = 32)]
    pub kv_group: usize,
}

impl KvFlags {
    /// The store for `config`, checked against it.
    pub fn spec(&self, config: &ModelConfig) -> Result<KvSpec> {
        let kind = self.kv_cache.unwrap_or(KvKind::for_model(config));
        let kv = KvSpec { kind, page_size: self.page_size, group: self.kv_group };
        kv.check(config).map_err(anyhow::Error::msg)?;
        Ok(kv)
    }
}

/// Where a model runs, decided once per command.
pub struct Placement {
    pub device: Device,
    /// One line naming the device.
    pub description: String,
    /// What the asked precision runs as there ([`devices::precision_on`]).
    pub precision: Precision,
    /// Whether it runs in the machine's memory (the CPU backends), where memory admission applies.
    pub host: bool,
}

impl Placement {
    pub fn new(choice: DeviceChoice, dtype: Precision) -> Result<Self> {
        let (device, description, precision, host) = devices::select_in(choice, dtype)?;
        Ok(Self { device, description, precision, host })
    }
}

/// The model at `path` (a run directory, a Hugging Face directory or a GGUF file) with its weights held as `weights`
/// says, on `placement`'s device; in the machine's memory its weight files are admitted first, so a file larger than
/// the memory available is refused by its size before a byte is read. Every command that loads a model goes through
/// here.
pub fn load(path: &Path, placement: &Placement, weights: WeightFormat) -> Result<Bundle> {
    if placement.host {
        admission::admit_model_files(path)?;
    }
    Ok(import::load_as(path, &placement.device, weights)?)
}

/// The model at `path` held as `hold` says, on `placement`'s device in its precision, with the memory freed while
/// loading returned to the system and, in the machine's memory, KV stores for `sequences` sequences admitted.
pub fn load_for_inference(path: &Path, hold: HoldFlags, placement: &Placement, sequences: usize) -> Result<Bundle> {
    let weights = devices::weights_in(placement.precision, hold.weights)?;
    let mut run = load(path, placement, weights)?;
    run.model = params::in_precision(run.model, placement.precision);
    allocator::release_load_buffers();
    if placement.host {
        admission::admit_kv_stores(&run.config, sequences)?;
    }
    Ok(run)
}
