//! A translation run's config: `[model]`, `[seq2seq]`, `[data]` and `[train]`, and their checks.

use std::path::PathBuf;

use ember_core_model::ModelConfig;
use ember_core_model::config::{Invalid, require};
use ember_core_model::seq2seq::Seq2SeqConfig;
use serde::{Deserialize, Serialize};

use crate::parallel::Vocabularies;

/// `[seq2seq]`: the stacks and whether source, target and output share one embedding.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seq2SeqSection {
    pub encoder_layers: usize,
    pub decoder_layers: usize,
    #[serde(default = "crate::config::yes")]
    pub share_embeddings: bool,
}

/// `[data]`: parallel TSV files (`source<TAB>target`) or pairs of line-aligned files, the BPE vocabularies and the
/// longest pair kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParallelDataConfig {
    pub train: PathBuf,
    /// With it, `train` holds the source sentences and this file the targets, line by line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_target: Option<PathBuf>,
    pub valid: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_target: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub test: Option<PathBuf>,
    /// Tokens of the joint vocabulary, or of each side's.
    pub vocab_size: usize,
    /// One BPE over both sides (fairseq's joined dictionary); false: one BPE of `vocab_size` per side.
    #[serde(default = "crate::config::yes")]
    pub joint_vocab: bool,
    /// Pairs with more tokens than this on either side (</s> included) are left out of training.
    pub max_len: usize,
}

/// `[train]` for translation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranslationTrainConfig {
    #[serde(default = "crate::config::default_seed")]
    pub seed: u64,
    /// Tokens per batch, padding included (rows × longest side).
    pub max_tokens: usize,
    pub max_steps: u64,
    /// Batches whose gradients are summed into one optimizer step (fairseq's `--update-freq`).
    #[serde(default = "crate::config::one")]
    pub grad_accum: usize,
    /// Stop after this many minutes of training (evaluating and checkpointing first), like fairseq's
    /// `--stop-time-hours`; unset: train to `max_steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_minutes: Option<f64>,
    /// Multiplies the 2017 schedule d^−½ · min(s^−½, s · w^−1.5).
    pub lr: f64,
    pub warmup_steps: u64,
    #[serde(default = "crate::config::default_beta1")]
    pub beta1: f64,
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    #[serde(default = "default_eps")]
    pub eps: f64,
    #[serde(default = "default_smoothing")]
    pub label_smoothing: f64,
    #[serde(default)]
    pub grad_clip: f64,
    pub eval_interval: u64,
    /// Validation sentences translated (greedily) for BLEU at each evaluation.
    #[serde(default = "default_bleu_sentences")]
    pub bleu_sentences: usize,
    pub checkpoint_interval: u64,
    /// Checkpoints kept (the last ones), for `ember average`.
    #[serde(default = "default_keep")]
    pub keep_checkpoints: usize,
    pub out_dir: PathBuf,
}

fn default_beta2() -> f64 {
    0.98
}
fn default_eps() -> f64 {
    1e-9
}
fn default_smoothing() -> f64 {
    0.1
}
fn default_bleu_sentences() -> usize {
    200
}
fn default_keep() -> usize {
    5
}

/// A translation run config: `[model]` (layer shapes, as for decoder-only models), `[seq2seq]`, `[data]`, `[train]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TranslationConfig {
    pub model: ModelConfig,
    pub seq2seq: Seq2SeqSection,
    pub data: ParallelDataConfig,
    pub train: TranslationTrainConfig,
}

impl TranslationConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        self.model.validate()?;
        let (s, d, t) = (&self.seq2seq, &self.data, &self.train);
        require(s.encoder_layers >= 1, "seq2seq.encoder_layers", s.encoder_layers, "at least 1")?;
        require(s.decoder_layers >= 1, "seq2seq.decoder_layers", s.decoder_layers, "at least 1")?;
        require(d.vocab_size >= 300, "data.vocab_size", d.vocab_size, "at least 300 (256 bytes, specials, merges)")?;
        let most = crate::config::MAX_BPE_VOCAB;
        require(d.vocab_size <= most, "data.vocab_size", d.vocab_size, format!("at most {most}"))?;
        require(d.max_len >= 2, "data.max_len", d.max_len, "at least 2")?;
        require(
            d.joint_vocab || !s.share_embeddings,
            "seq2seq.share_embeddings",
            s.share_embeddings,
            "false when data.joint_vocab = false (separate vocabularies have separate embeddings)",
        )?;
        require(
            d.max_len <= self.model.block_size,
            "data.max_len",
            d.max_len,
            format!("at most model.block_size = {}", self.model.block_size),
        )?;
        crate::config::require_out_dir(&t.out_dir)?;
        require(t.max_tokens >= d.max_len, "train.max_tokens", t.max_tokens, "at least data.max_len")?;
        require(t.lr.is_finite() && t.lr > 0.0, "train.lr", t.lr, "a finite number > 0")?;
        require(t.warmup_steps >= 1, "train.warmup_steps", t.warmup_steps, "at least 1")?;
        require(t.max_steps >= 1, "train.max_steps", t.max_steps, "at least 1")?;
        require(t.grad_accum >= 1, "train.grad_accum", t.grad_accum, "at least 1")?;
        if let Some(m) = t.max_minutes {
            require(m.is_finite() && m > 0.0, "train.max_minutes", m, "a finite number > 0")?;
        }
        require(t.eval_interval >= 1, "train.eval_interval", t.eval_interval, "at least 1")?;
        require(t.checkpoint_interval >= 1, "train.checkpoint_interval", t.checkpoint_interval, "at least 1")?;
        require((0.0..1.0).contains(&t.label_smoothing), "train.label_smoothing", t.label_smoothing, "in [0, 1)")?;
        require(t.keep_checkpoints >= 1, "train.keep_checkpoints", t.keep_checkpoints, "at least 1")
    }

    /// The model's full configuration once the vocabularies are known.
    pub fn seq2seq_config(&self, vocab: &Vocabularies) -> Seq2SeqConfig {
        let (src_vocab, tgt_vocab) = vocab.sizes();
        Seq2SeqConfig {
            model: ModelConfig { vocab_size: Some(tgt_vocab), ..self.model.clone() },
            encoder_layers: self.seq2seq.encoder_layers,
            decoder_layers: self.seq2seq.decoder_layers,
            src_vocab,
            tgt_vocab,
            share_embeddings: self.seq2seq.share_embeddings,
        }
    }
}
