//! Models from elsewhere, loaded into Ember's own model: Hugging Face directories (GPT-2, the Llama layout's families,
//! Gemma 2, DeepSeek-V2; MarianMT translation models) and GGUF files (the llama, qwen2, qwen3, phi3, gemma2, gemma3 and deepseek2 architectures). [`load`] also opens Ember run directories, so every command takes any of the three.

pub mod gguf_model;
pub use ember_formats::gguf;
pub mod hf;
pub mod marian;
pub(crate) mod mla;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, TensorData};

use ember_formats::chat::ChatFormat;

use crate::bundle::{self, Bundle, BundleError};
use crate::causal_lm::CausalLm;
use crate::init::Build;
use crate::weights::{WeightFormat, Weights};
use ember_formats::config::ModelConfig;
use ember_formats::tokenizer;
use tokenizers::Tokenizer;

pub use crate::weights::Tensors;

/// What is wrong with a file being imported.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    /// An Ember run directory that does not load.
    #[error(transparent)]
    Run(#[from] BundleError),
}

impl ImportError {
    pub fn new(path: &Path, reason: impl Into<String>) -> Self {
        Self::File { path: path.to_path_buf(), reason: reason.into() }
    }
}

/// Where a model comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A directory written by `ember train` or `ember import` (`config.toml`).
    Run,
    /// A Hugging Face directory (`config.json`).
    HuggingFace,
    /// A `.gguf` file.
    Gguf,
}

impl Source {
    pub fn of(path: &Path) -> Result<Self, ImportError> {
        if path.is_file() {
            return Ok(Source::Gguf);
        }
        if path.join(bundle::CONFIG).is_file() {
            Ok(Source::Run)
        } else if path.join("config.json").is_file() {
            Ok(Source::HuggingFace)
        } else if path.exists() {
            Err(ImportError::new(
                path,
                "neither an Ember run directory (config.toml), a Hugging Face directory (config.json) nor a GGUF file",
            ))
        } else {
            Err(ImportError::new(path, "no such file or directory"))
        }
    }
}

/// Loads a run directory, a Hugging Face directory or a GGUF file onto `device`, every weight dense f32.
pub fn load(path: &Path, device: &Device) -> Result<Bundle, ImportError> {
    load_as(path, device, WeightFormat::F32)
}

/// Loads a run directory, a Hugging Face directory or a GGUF file onto `device` with its projections and token
/// embedding held as `format` asks (on the CPU and wgpu; other devices take them dequantized to f32).
pub fn load_as(path: &Path, device: &Device, format: WeightFormat) -> Result<Bundle, ImportError> {
    let format = if ember_kernels::packed::has_kernel(device) { format } else { WeightFormat::F32 };
    if Source::of(path)? == Source::Run {
        return Ok(bundle::load_as(path, device, format)?);
    }
    let (config, weights, tokenizer, chat) = read(path)?;
    let weights = weights.convert(format).map_err(|e| ImportError::new(path, e.to_string()))?;
    let model = CausalLm::load_packed(&config, &weights.dense, &weights.packed, device)
        .map_err(|cause| BundleError::Mismatch { path: path.to_path_buf(), cause })?;
    Ok(Bundle { config, model, tokenizer, chat })
}

/// The config, stored weights, tokenizer and chat format of a run directory, a Hugging Face directory or a GGUF file.
pub fn read(path: &Path) -> Result<(ModelConfig, Weights, Tokenizer, ChatFormat), ImportError> {
    Ok(match Source::of(path)? {
        Source::Run => {
            let (config, weights, _, _) = bundle::read(path)?;
            let tok_path = path.join(bundle::TOKENIZER);
            let tok = tokenizer::load(&tok_path).map_err(|e| ImportError::new(&tok_path, e.to_string()))?;
            (config, weights, tok, ChatFormat::from_hf_dir(path).map_err(|e| ImportError::new(path, e))?)
        }
        Source::HuggingFace => {
            let (config, tensors) = hf::load(path)?;
            let weights = Weights { dense: tensors, ..Weights::default() };
            let tok_path = path.join(bundle::TOKENIZER);
            if !tok_path.is_file() {
                return Err(ImportError::new(path, "has no tokenizer.json, which generation needs"));
            }
            let tok = tokenizer::load(&tok_path).map_err(|e| ImportError::new(&tok_path, e.to_string()))?;
            (config, weights, tok, ChatFormat::from_hf_dir(path).map_err(|e| ImportError::new(path, e))?)
        }
        Source::Gguf => gguf_model::load(path)?,
    })
}

/// A [rows, cols] matrix as [cols, rows] (PyTorch's nn.Linear [out, in] to Burn's [in, out]).
pub fn transpose(m: &TensorData) -> TensorData {
    let (rows, cols) = (m.shape()[0], m.shape()[1]);
    let v = m.as_slice::<f32>().expect("imported tensors are f32");
    TensorData::new(crate::weights::transpose(v, rows, cols), [cols, rows])
}

/// The rows of `m` [rows, cols] listed in `rows`, in that order.
fn select_rows(m: &TensorData, rows: &[usize]) -> TensorData {
    let cols = m.shape()[1];
    let v = m.as_slice::<f32>().expect("imported tensors are f32");
    let values: Vec<f32> = rows.iter().flat_map(|&r| v[r * cols..(r + 1) * cols].iter().copied()).collect();
    TensorData::new(values, [rows.len(), cols])
}

/// Matrices (or vectors) stacked along their first dimension.
pub fn concat_rows(parts: &[TensorData]) -> TensorData {
    let mut shape = parts[0].shape().to_vec();
    shape[0] = parts.iter().map(|p| p.shape()[0]).sum();
    let values: Vec<f32> =
        parts.iter().flat_map(|p| p.as_slice::<f32>().expect("imported tensors are f32").iter().copied()).collect();
    TensorData::new(values, shape)
}
