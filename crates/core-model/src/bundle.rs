//! The run directory, the only thing `train` hands to `serve`: config, weights, tokenizer, checkpoint, metrics.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use burn::tensor::{Device, TensorData};
use safetensors::tensor::{Dtype, TensorView};
use tokenizers::Tokenizer;

use crate::causal_lm::CausalLm;
use crate::init::Build;
use crate::params::{self, Mismatch};
use crate::weights::{Tensors, WeightFormat, Weights};
use ember_formats::chat::ChatFormat;
use ember_formats::checkpoint::{STEPS_KEY, state};
use ember_formats::config::RunConfigError;
use ember_formats::config::{Invalid, ModelConfig};
use ember_formats::files;
use ember_formats::ggml;
use ember_formats::packed::{Packed, Part};
use ember_formats::tokenizer;

pub const CONFIG: &str = "config.toml";
pub const MODEL: &str = "model.safetensors";
pub const TOKENIZER: &str = "tokenizer.json";
pub const CHECKPOINT: &str = "checkpoint.safetensors";
pub const METRICS: &str = "metrics.jsonl";
pub const LOSS_PLOT: &str = "loss.svg";
/// The tokenizer's settings and chat template, as transformers' `AutoTokenizer` reads them.
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("{path}: not a valid safetensors file ({reason})")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{path}: {cause}")]
    Mismatch { path: PathBuf, cause: Mismatch },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("{path}: {cause}")]
    Invalid { path: PathBuf, cause: Invalid },
    #[error("{path}: {cause}")]
    Tokenizer { path: PathBuf, cause: tokenizer::TokenizerError },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |cause| BundleError::Io { path: path.to_path_buf(), cause }
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, flushed to disk, then renamed over it, so a
/// process killed mid-write leaves the previous file whole.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), BundleError> {
    files::replace(path, |out| out.write_all(bytes)).map_err(io(path))
}

/// The first value of `data` that is NaN or ±∞, if any: a diverged run's weights or moments.
pub fn non_finite(data: &TensorData) -> Option<f32> {
    data.iter::<f32>().find(|v| !v.is_finite())
}

/// Saves f32 tensors by name, with string metadata, as one safetensors file written atomically.
pub fn save_tensors(
    path: &Path,
    tensors: &[(String, TensorData)],
    metadata: HashMap<String, String>,
) -> Result<(), BundleError> {
    save_with_packed(path, tensors, &[], metadata)
}

/// The metadata key that lays out the packed matrix stored as bytes under `name`.
fn packed_key(name: &str) -> String {
    format!("ember.packed.{name}")
}

/// [`save_tensors`] with packed matrices beside the f32 tensors: each as its bytes (U8) under its name, its layout
/// in the metadata at [`packed_key`] as JSON, `{"cols": 576, "parts": [["Q8_0", 1728]]}`.
fn save_with_packed(
    path: &Path,
    tensors: &[(String, TensorData)],
    packed: &[(String, Packed)],
    mut metadata: HashMap<String, String>,
) -> Result<(), BundleError> {
    let corrupt = |reason: String| BundleError::Corrupt { path: path.to_path_buf(), reason };
    let mut views = tensors
        .iter()
        .map(|(name, data)| {
            let view = TensorView::new(Dtype::F32, data.shape().to_vec(), data.as_bytes())
                .map_err(|e| corrupt(e.to_string()))?;
            Ok((name.clone(), view))
        })
        .collect::<Result<Vec<_>, BundleError>>()?;
    for (name, w) in packed {
        let parts: Vec<(&str, usize)> = w.parts.iter().map(|p| (p.format.name, p.rows)).collect();
        metadata.insert(packed_key(name), serde_json::json!({"cols": w.cols, "parts": parts}).to_string());
        let view = TensorView::new(Dtype::U8, vec![w.bytes.len()], &w.bytes).map_err(|e| corrupt(e.to_string()))?;
        views.push((name.clone(), view));
    }
    let bytes = safetensors::serialize(views, Some(metadata)).map_err(|e| corrupt(e.to_string()))?;
    write_atomic(path, &bytes)
}

/// The f32 tensors and packed matrices of a safetensors file Ember wrote, with its metadata.
fn load_with_packed(path: &Path) -> Result<(Weights, HashMap<String, String>), BundleError> {
    let bytes = ember_formats::files::map(path).map_err(io(path))?;
    let corrupt = |reason: String| BundleError::Corrupt { path: path.to_path_buf(), reason };
    let (_, header) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let metadata = header.metadata().clone().unwrap_or_default();
    let is_packed = |name: &str| metadata.contains_key(&packed_key(name));
    let (read, metadata) = ember_formats::safetensors::read(&bytes, is_packed).map_err(corrupt)?;
    let mut weights = Weights::default();
    for t in read {
        if t.dtype != Dtype::F32 {
            return Err(corrupt(format!("tensor {} is {:?}, expected F32", t.name, t.dtype)));
        }
        weights.dense.insert(t.name, TensorData::new(t.values, t.shape));
    }
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| corrupt(e.to_string()))?;
    for (key, layout) in &metadata {
        let Some(name) = key.strip_prefix("ember.packed.") else { continue };
        let bad = |reason: &str| corrupt(format!("packed matrix {name}: {reason}"));
        let layout: serde_json::Value = serde_json::from_str(layout).map_err(|e| bad(&e.to_string()))?;
        let cols = layout["cols"].as_u64().ok_or_else(|| bad("no column count"))? as usize;
        let mut parts = Vec::new();
        for part in layout["parts"].as_array().ok_or_else(|| bad("no parts"))? {
            let format = part[0].as_str().and_then(ggml::by_name).ok_or_else(|| bad("unknown format"))?;
            let rows = part[1].as_u64().ok_or_else(|| bad("no row count"))? as usize;
            if format.row_bytes(cols).is_none() {
                return Err(bad(&format!("rows of {cols} values are not whole {} blocks", format.name)));
            }
            parts.push(Part { format, rows });
        }
        let view = file.tensor(name).map_err(|e| bad(&e.to_string()))?;
        let expected: usize = parts.iter().map(|p| p.rows * p.format.row_bytes(cols).unwrap_or(0)).sum();
        if view.dtype() != Dtype::U8 || view.data().len() != expected {
            return Err(bad(&format!(
                "{} bytes of {:?}; its layout takes {expected}",
                view.data().len(),
                view.dtype()
            )));
        }
        weights.packed.insert(name.to_string(), Packed { parts, cols, bytes: view.data().to_vec() });
    }
    Ok((weights, metadata))
}

/// Loads every tensor (as f32) and the metadata of a safetensors file Ember wrote (all F32).
pub fn load_tensors(path: &Path) -> Result<(Tensors, HashMap<String, String>), BundleError> {
    let bytes = ember_formats::files::map(path).map_err(io(path))?;
    let corrupt = |reason: String| BundleError::Corrupt { path: path.to_path_buf(), reason };
    let (read, metadata) = ember_formats::safetensors::read(&bytes, |_| false).map_err(corrupt)?;
    let mut tensors = HashMap::new();
    for t in read {
        if t.dtype != Dtype::F32 {
            return Err(corrupt(format!("tensor {} is {:?}, expected F32", t.name, t.dtype)));
        }
        tensors.insert(t.name, TensorData::new(t.values, t.shape));
    }
    Ok((tensors, metadata))
}

/// The `[model]` table of a run directory's `config.toml`.
pub fn load_model_config(run_dir: &Path) -> Result<ModelConfig, BundleError> {
    let path = run_dir.join(CONFIG);
    let text = ember_formats::files::read_to_string(&path).map_err(io(&path))?;
    ember_formats::config::model_from_run_toml(&text).map_err(|e| match e {
        RunConfigError::Syntax(reason) => BundleError::Config { path: path.clone(), reason },
        RunConfigError::Invalid(cause) => BundleError::Invalid { path: path.clone(), cause },
    })
}

/// Writes a model as a run directory: `config.toml` (its `[model]` table), `model.safetensors`, `tokenizer.json`.
pub fn save(run_dir: &Path, config: &ModelConfig, model: &CausalLm, tokenizer: &Tokenizer) -> Result<(), BundleError> {
    fs::create_dir_all(run_dir).map_err(io(run_dir))?;
    let table =
        toml::Table::from_iter([("model".to_string(), toml::Value::try_from(config).expect("a model config is TOML"))]);
    save_tensors(&run_dir.join(MODEL), &params::state_dict(model), HashMap::new())?;
    let tok_path = run_dir.join(TOKENIZER);
    tokenizer::save(tokenizer, &tok_path).map_err(|cause| BundleError::Tokenizer { path: tok_path, cause })?;
    write_atomic(&run_dir.join(CONFIG), table.to_string().as_bytes())
}

/// `tokenizer_config.json` in `dir`: the chat template and its BOS and EOS tokens, for transformers (and for
/// [`ChatFormat::from_hf_dir`] and [`load_as`], which reads the same file).
pub fn write_chat(dir: &Path, chat: &ChatFormat, context: usize) -> Result<(), BundleError> {
    let mut config = serde_json::json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": context,
        "clean_up_tokenization_spaces": false,
    });
    for (key, token) in [("bos_token", &chat.bos_token), ("eos_token", &chat.eos_token)] {
        if !token.is_empty() {
            config[key] = serde_json::json!(token);
        }
    }
    if let Some(template) = &chat.template {
        config["chat_template"] = serde_json::json!(template);
    }
    let text = serde_json::to_string_pretty(&config).expect("JSON values serialize");
    write_atomic(&dir.join(TOKENIZER_CONFIG), text.as_bytes())
}

/// A trained model ready to sample from: its config, weights and tokenizer.
pub struct Bundle {
    pub config: ModelConfig,
    pub model: CausalLm,
    pub tokenizer: Tokenizer,
    /// The chat template and special tokens the file carries (a run directory's `tokenizer_config.json`, where it
    /// has one).
    pub chat: ChatFormat,
}

/// Writes stored weights as a run directory (`ember import`, quantized or not), as [`save`] writes a model.
pub fn save_weights(
    run_dir: &Path,
    config: &ModelConfig,
    weights: &Weights,
    tokenizer: &Tokenizer,
) -> Result<(), BundleError> {
    fs::create_dir_all(run_dir).map_err(io(run_dir))?;
    let table =
        toml::Table::from_iter([("model".to_string(), toml::Value::try_from(config).expect("a model config is TOML"))]);
    fn sorted<T: Clone>(map: &HashMap<String, T>) -> Vec<(String, T)> {
        let mut entries: Vec<(String, T)> = map.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries
    }
    let (dense, packed) = (sorted(&weights.dense), sorted(&weights.packed));
    save_with_packed(&run_dir.join(MODEL), &dense, &packed, HashMap::new())?;
    let tok_path = run_dir.join(TOKENIZER);
    tokenizer::save(tokenizer, &tok_path).map_err(|cause| BundleError::Tokenizer { path: tok_path, cause })?;
    write_atomic(&run_dir.join(CONFIG), table.to_string().as_bytes())
}

/// A run directory's config, stored weights and the optimizer steps they were trained for. Its weights are
/// `model.safetensors`, or, in a run stopped between the two files of its first checkpoint, the weights of
/// `checkpoint.safetensors` (stored under "model.").
pub fn read(run_dir: &Path) -> Result<(ModelConfig, Weights, Option<u64>, PathBuf), BundleError> {
    let config = load_model_config(run_dir)?;
    let (model, checkpoint) = (run_dir.join(MODEL), run_dir.join(CHECKPOINT));
    Ok(match model.exists() || !checkpoint.exists() {
        true => {
            let (weights, metadata) = load_with_packed(&model)?;
            (config, weights, metadata.get(STEPS_KEY).and_then(|s| s.parse::<u64>().ok()), model)
        }
        false => {
            let (all, metadata) = load_tensors(&checkpoint)?;
            let steps = state::<HashMap<String, serde_json::Value>>(&metadata).ok().map(|state| state.step);
            let dense = all.into_iter().filter_map(|(k, v)| Some((k.strip_prefix("model.")?.to_string(), v)));
            (config, Weights { dense: dense.collect(), ..Weights::default() }, steps, checkpoint)
        }
    })
}

/// Loads a run directory written by `ember train` or `ember import` (see [`read`]), its weights as stored.
pub fn load(run_dir: &Path, device: &Device) -> Result<Bundle, BundleError> {
    load_as(run_dir, device, WeightFormat::Native)
}

/// [`load`] with the projections and token embedding held as `format` asks.
pub fn load_as(run_dir: &Path, device: &Device, format: WeightFormat) -> Result<Bundle, BundleError> {
    let (config, weights, steps, path) = read(run_dir)?;
    let weights =
        weights.convert(format).map_err(|e| BundleError::Corrupt { path: path.clone(), reason: e.to_string() })?;
    let mut model = CausalLm::load_packed(&config, &weights.dense, &weights.packed, device)
        .map_err(|cause| BundleError::Mismatch { path, cause })?;
    // FAVOR+ keeps the features its weights were last trained with.
    if let Some(steps) = steps {
        model.set_feature_draw(model.feature_draw(steps.saturating_sub(1)));
    }
    let tok_path = run_dir.join(TOKENIZER);
    let tokenizer = tokenizer::load(&tok_path)
        .and_then(|t| tokenizer::check_fits(&t, config.vocab()).map(|_| t))
        .map_err(|cause| BundleError::Tokenizer { path: tok_path, cause })?;
    let chat = ChatFormat::from_hf_dir(run_dir)
        .map_err(|reason| BundleError::Config { path: run_dir.join(TOKENIZER_CONFIG), reason })?;
    Ok(Bundle { config, model, tokenizer, chat })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write that fails (here the rename, over a directory; on a full disk the write) leaves no `.tmp` behind.
    #[test]
    fn a_failed_atomic_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("model.safetensors");
        fs::create_dir(&target).unwrap();
        fs::write(target.join("inside"), b"someone's file").unwrap();
        assert!(write_atomic(&target, b"bytes").is_err());
        assert!(!dir.path().join("model.tmp").exists());
    }
}
