//! Memory admission: what a command is about to allocate, estimated from the config before anything is built, against
//! the memory the machine has available, so a model, batch or KV store too large for it is a clear error naming what
//! it would need, instead of an allocation failure (an abort) seconds or minutes later.

use anyhow::{Result, bail};
use ember_core_model::ModelConfig;
use ember_core_model::inspect::{kv_cache_bytes, total_params};

/// Bytes per f32.
const F32: u128 = 4;

/// The memory available to a new allocation (Linux's MemAvailable), when the system says.
fn available() -> Option<u128> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u128 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// `n` bytes in GiB.
fn gib(n: u128) -> String {
    format!("{:.1} GiB", n as f64 / (1u128 << 30) as f64)
}

/// Fails when `bytes` exceed the memory available.
pub fn admit(what: &str, bytes: u128) -> Result<()> {
    if let Some(available) = available()
        && bytes > available
    {
        bail!("{what} needs at least {}, more than the {} this machine has available", gib(bytes), gib(available));
    }
    Ok(())
}

/// Training on the CPU: weights, gradients and AdamW's two moments (4 × the parameters), and the activations of a
/// batch of `batch` × `seq` tokens kept for the backward pass (at least 8·d per layer and the logits per token).
pub fn admit_training(config: &ModelConfig, batch: usize, seq: usize) -> Result<()> {
    let state = total_params(config).saturating_mul(4 * F32);
    let per_token =
        (8 * config.d_model as u128).saturating_mul(config.n_layers as u128).saturating_add(config.vocab() as u128);
    let activations = (batch as u128).saturating_mul(seq as u128).saturating_mul(per_token).saturating_mul(F32);
    admit(
        &format!("training this model ({} parameters) at {batch} × {seq} tokens per batch", total_params(config)),
        state.saturating_add(activations),
    )
}

/// Inference, once the weights are loaded (they are already resident, so not counted again): f32 KV stores for
/// `sequences` sequences of the whole context.
pub fn admit_kv_stores(config: &ModelConfig, sequences: usize) -> Result<()> {
    let kv = kv_cache_bytes(config, sequences, config.block_size, F32 as usize).unwrap_or(u128::MAX);
    admit(&format!("{sequences} KV store(s) of this model's {}-token context", config.block_size), kv)
}

/// A model built in f32 from its config (random weights), with f32 KV stores for `sequences` sequences of its whole
/// context.
pub fn admit_built_model(config: &ModelConfig, sequences: usize) -> Result<()> {
    let weights = total_params(config).saturating_mul(F32);
    let kv = kv_cache_bytes(config, sequences, config.block_size, F32 as usize).unwrap_or(u128::MAX);
    let what = format!(
        "this model ({} parameters) with {sequences} KV store(s) of its {}-token context",
        total_params(config),
        config.block_size
    );
    admit(&what, weights.saturating_add(kv))
}

/// Loading the model at `path`: at least its weight files' bytes (a GGUF file, or a directory's `model*.safetensors`;
/// a run directory's checkpoint is not loaded), which the weights take once in memory in their stored form.
pub fn admit_model_files(path: &std::path::Path) -> Result<()> {
    let size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len() as u128);
    let bytes = match std::fs::read_dir(path) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("model") && n.ends_with(".safetensors")))
            .map(|e| size(&e.path()))
            .sum(),
        Err(_) => size(path),
    };
    admit(&format!("loading {}", path.display()), bytes)
}
