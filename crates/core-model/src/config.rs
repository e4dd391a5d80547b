//! `[model]` of a run's TOML config, and the validation error every config section shares.

use std::fmt::Display;

use serde::{Deserialize, Serialize};

/// A config value outside what is allowed: names the key, the value and the rule.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{key} = {value}: {allowed}")]
pub struct Invalid {
    pub key: String,
    pub value: String,
    pub allowed: String,
}

/// `Ok` when `ok`, else an [`Invalid`] for `key = value` that says what is `allowed`.
pub fn require(ok: bool, key: &str, value: impl Display, allowed: impl Into<String>) -> Result<(), Invalid> {
    if ok { Ok(()) } else { Err(Invalid { key: key.into(), value: value.to_string(), allowed: allowed.into() }) }
}

/// The decoder-only GPT of nanoGPT / GPT-2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Token vocabulary; taken from the tokenizer when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    pub n_layers: usize,
    pub n_heads: usize,
    pub d_model: usize,
    /// Context length: rows of the learned position table.
    pub block_size: usize,
    #[serde(default)]
    pub dropout: f64,
    /// Biases in the linear layers and LayerNorms.
    #[serde(default = "yes")]
    pub bias: bool,
}

fn yes() -> bool {
    true
}

impl ModelConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Some(v) = self.vocab_size {
            require(v >= 1, "model.vocab_size", v, "at least 1")?;
        }
        require(self.n_layers >= 1, "model.n_layers", self.n_layers, "at least 1")?;
        require(self.n_heads >= 1, "model.n_heads", self.n_heads, "at least 1")?;
        require(self.d_model >= 1, "model.d_model", self.d_model, "at least 1")?;
        require(
            self.d_model % self.n_heads == 0,
            "model.d_model",
            self.d_model,
            format!("must be a multiple of model.n_heads = {}", self.n_heads),
        )?;
        require(self.block_size >= 1, "model.block_size", self.block_size, "at least 1")?;
        require((0.0..1.0).contains(&self.dropout), "model.dropout", self.dropout, "in [0, 1)")
    }

    /// The vocabulary, which training fills in from the tokenizer before a model is built.
    pub fn vocab(&self) -> usize {
        self.vocab_size.expect("vocab_size is set from the tokenizer before a model is built")
    }

    pub fn head_dim(&self) -> usize {
        self.d_model / self.n_heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn baby() -> ModelConfig {
        ModelConfig {
            vocab_size: Some(65),
            n_layers: 4,
            n_heads: 4,
            d_model: 128,
            block_size: 64,
            dropout: 0.0,
            bias: true,
        }
    }

    #[test]
    fn width_must_split_into_heads() {
        let bad = ModelConfig { d_model: 130, ..baby() };
        let err = bad.validate().unwrap_err();
        assert_eq!(err.to_string(), "model.d_model = 130: must be a multiple of model.n_heads = 4");
        assert!(baby().validate().is_ok());
    }

    #[test]
    fn dropout_must_be_a_probability() {
        let err = ModelConfig { dropout: 1.0, ..baby() }.validate().unwrap_err();
        assert_eq!(err.key, "model.dropout");
    }
}
