//! Models written for other tools, the inverse of [`crate::import`]: a GGUF file for llama.cpp ([`gguf`]) and a
//! Hugging Face directory for transformers ([`hf`]), from a run directory, a Hugging Face directory or a GGUF file.
//! Each writer reads back what it wrote and refuses a model the format would describe differently.

pub mod gguf;
pub mod hf;

use std::path::{Path, PathBuf};

use ember_formats::ggml;
use ember_formats::packed::Packed;

use crate::weights::{Weights, transpose};

/// Why a model cannot be exported.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct ExportError {
    pub path: PathBuf,
    pub reason: String,
}

impl ExportError {
    pub fn new(path: &Path, reason: impl Into<String>) -> Self {
        Self { path: path.to_path_buf(), reason: reason.into() }
    }
}

/// The matrix at `path` with its rows as outputs ([out, in], GGUF's and PyTorch's layout): a packed matrix as it is
/// stored, a dense projection ([in, out] in Burn's layout) transposed, the token embedding [V, d] as it is, as F32
/// blocks.
pub(crate) fn matrix(weights: &Weights, path: &str) -> Result<Packed, String> {
    if let Some(packed) = weights.packed.get(path) {
        return Ok(packed.clone());
    }
    let data = weights.dense.get(path).ok_or_else(|| format!("the model has no tensor {path}"))?;
    let values = data.as_slice::<f32>().map_err(|e| format!("{path}: {e:?}"))?;
    let [a, b] = data.shape()[..] else { return Err(format!("{path} is not a matrix")) };
    let (rows, cols, values) = match path == "wte.weight" {
        true => (a, b, values.to_vec()),
        false => (b, a, transpose(values, a, b)),
    };
    let f32 = ggml::by_name("f32").expect("F32 is a ggml format");
    Packed::new(f32, rows, cols, values.iter().flat_map(|v| v.to_le_bytes()).collect()).map_err(|e| e.to_string())
}

/// The vector at `path` (a norm's gain, a bias).
pub(crate) fn vector<'a>(weights: &'a Weights, path: &str) -> Result<&'a [f32], String> {
    let data = weights.dense.get(path).ok_or_else(|| format!("the model has no tensor {path}"))?;
    data.as_slice::<f32>().map_err(|e| format!("{path}: {e:?}"))
}

/// The inverse of a permutation: `order[i]` is where row i came from, the result where each row goes.
pub(crate) fn inverse(order: &[usize]) -> Vec<usize> {
    let mut inverse = vec![0; order.len()];
    for (i, &from) in order.iter().enumerate() {
        inverse[from] = i;
    }
    inverse
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_inverse_permutation_undoes_the_permutation() {
        let order = crate::import::mla::rotate_half_order(2, 4);
        let back = inverse(&order);
        assert_eq!(order.iter().map(|&i| back[i]).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
    }
}
