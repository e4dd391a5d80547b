//! `[data]` and `[train]` of a run's TOML config.

use std::path::{Path, PathBuf};

use ember_core_model::ModelConfig;
use ember_core_model::config::{Invalid, require};

use crate::loss_scale::LossScaling;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// One token per character of the training text.
    Char,
    /// Byte-level BPE trained to `data.vocab_size` tokens.
    Bpe,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// UTF-8 text to train on.
    pub corpus: PathBuf,
    /// A dataset `scripts/prepare-data.sh` can rebuild when `corpus` is missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dataset: Option<String>,
    pub tokenizer: TokenizerKind,
    /// Vocabulary size of a BPE tokenizer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    /// The last fraction of the corpus (by position) is the validation split.
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
}

fn default_val_fraction() -> f64 {
    0.1
}

/// `train.out_dir` names a directory: empty, a run would be written into the current directory, over whatever
/// `config.toml` and `tokenizer.json` are there.
pub(crate) fn require_out_dir(out_dir: &Path) -> Result<(), Invalid> {
    require(!out_dir.as_os_str().is_empty(), "train.out_dir", "\"\"", "a directory for the run (not empty)")
}

/// The largest BPE vocabulary trained (the largest in use, Gemma's, has 262,144 tokens): the trainer's tables grow
/// with it before the corpus is read.
pub const MAX_BPE_VOCAB: usize = 1 << 20;

pub const KNOWN_DATASETS: &[&str] = &["shakespeare"];

impl DataConfig {
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Some(name) = &self.dataset {
            require(
                KNOWN_DATASETS.contains(&name.as_str()),
                "data.dataset",
                name,
                format!("one of {KNOWN_DATASETS:?}"),
            )?;
        }
        match (self.tokenizer, self.vocab_size) {
            (TokenizerKind::Bpe, None) => {
                require(false, "data.vocab_size", "(missing)", "required when data.tokenizer = \"bpe\"")?
            }
            (TokenizerKind::Bpe, Some(v)) => {
                require(v > 256, "data.vocab_size", v, "more than 256 (the byte alphabet)")?;
                require(v <= MAX_BPE_VOCAB, "data.vocab_size", v, format!("at most {MAX_BPE_VOCAB}"))?
            }
            (TokenizerKind::Char, Some(v)) => require(
                false,
                "data.vocab_size",
                v,
                "only for data.tokenizer = \"bpe\"; char-level takes its vocabulary from the text",
            )?,
            (TokenizerKind::Char, None) => {}
        }
        require(self.val_fraction > 0.0 && self.val_fraction < 1.0, "data.val_fraction", self.val_fraction, "in (0, 1)")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScheduleKind {
    /// Linear warmup to `lr`, then cosine decay to `min_lr` at `decay_steps` (nanoGPT).
    Cosine,
    /// lr · d^-0.5 · min(s^-0.5, s · w^-1.5) (Vaswani et al. 2017).
    Noam,
    /// Linear warmup, then constant `lr`.
    Constant,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    #[serde(default = "default_seed")]
    pub seed: u64,
    pub batch_size: usize,
    /// Tokens per training window; defaults to `model.block_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
    pub max_steps: u64,
    /// Stop after this many minutes of training (evaluating and checkpointing first); unset: train to `max_steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_minutes: Option<f64>,
    /// Micro-batches whose gradients are summed into one optimizer step.
    #[serde(default = "one")]
    pub grad_accum: usize,
    pub lr: f64,
    #[serde(default)]
    pub min_lr: f64,
    #[serde(default)]
    pub warmup_steps: u64,
    /// Step at which cosine decay reaches `min_lr`; defaults to `max_steps`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<u64>,
    #[serde(default = "default_schedule")]
    pub schedule: ScheduleKind,
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    #[serde(default = "default_beta2")]
    pub beta2: f64,
    #[serde(default = "default_eps")]
    pub eps: f64,
    /// Decoupled weight decay on 2-D weight matrices (never on biases or norm gains).
    #[serde(default)]
    pub weight_decay: f64,
    /// Whether the embedding tables decay too (nanoGPT: yes).
    #[serde(default = "yes")]
    pub decay_embeddings: bool,
    /// Clip the global gradient norm to this value; 0 turns clipping off.
    #[serde(default)]
    pub grad_clip: f64,
    pub eval_interval: u64,
    pub eval_iters: usize,
    /// Steps between checkpoints; defaults to `eval_interval`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_interval: Option<u64>,
    /// The run directory.
    pub out_dir: PathBuf,
    /// `model.dtype = "f16"`: the first loss scale (2¹⁶, as PyTorch's `GradScaler`).
    #[serde(default = "default_loss_scale")]
    pub loss_scale: f64,
    /// `model.dtype = "f16"`: clean steps in a row after which the loss scale doubles.
    #[serde(default = "default_growth_interval")]
    pub loss_scale_growth_interval: u64,
}

fn default_loss_scale() -> f64 {
    LossScaling::default().init
}

fn default_growth_interval() -> u64 {
    LossScaling::default().growth_interval
}

pub(crate) fn default_seed() -> u64 {
    1337
}
pub(crate) fn one() -> usize {
    1
}
pub(crate) fn yes() -> bool {
    true
}
fn default_schedule() -> ScheduleKind {
    ScheduleKind::Cosine
}
pub(crate) fn default_beta1() -> f64 {
    0.9
}
fn default_beta2() -> f64 {
    0.999
}
fn default_eps() -> f64 {
    1e-8
}

impl TrainConfig {
    pub fn validate(&self, model: &ModelConfig) -> Result<(), Invalid> {
        require_out_dir(&self.out_dir)?;
        require(self.batch_size >= 1, "train.batch_size", self.batch_size, "at least 1")?;
        if let Some(t) = self.seq_len {
            require(t >= 1, "train.seq_len", t, "at least 1")?;
            require(
                t <= model.block_size,
                "train.seq_len",
                t,
                format!("at most model.block_size = {} (the rows of the position table)", model.block_size),
            )?;
        }
        require(self.max_steps >= 1, "train.max_steps", self.max_steps, "at least 1")?;
        if let Some(m) = self.max_minutes {
            require(m.is_finite() && m > 0.0, "train.max_minutes", m, "a finite number > 0")?;
        }
        require(self.grad_accum >= 1, "train.grad_accum", self.grad_accum, "at least 1")?;
        require(self.lr > 0.0 && self.lr.is_finite(), "train.lr", self.lr, "a finite number > 0")?;
        require(
            self.min_lr >= 0.0 && self.min_lr <= self.lr,
            "train.min_lr",
            self.min_lr,
            format!("in [0, train.lr = {}]", self.lr),
        )?;
        if self.schedule == ScheduleKind::Noam {
            require(
                self.warmup_steps >= 1,
                "train.warmup_steps",
                self.warmup_steps,
                "at least 1 for schedule = \"noam\"",
            )?;
        }
        if let Some(d) = self.decay_steps {
            require(
                d >= self.warmup_steps,
                "train.decay_steps",
                d,
                format!("at least train.warmup_steps = {}", self.warmup_steps),
            )?;
        }
        require((0.0..1.0).contains(&self.beta1), "train.beta1", self.beta1, "in [0, 1)")?;
        require((0.0..1.0).contains(&self.beta2), "train.beta2", self.beta2, "in [0, 1)")?;
        require(self.eps > 0.0, "train.eps", self.eps, "a number > 0")?;
        require(self.weight_decay >= 0.0, "train.weight_decay", self.weight_decay, "a number ≥ 0")?;
        require(self.grad_clip >= 0.0, "train.grad_clip", self.grad_clip, "a number ≥ 0 (0 turns clipping off)")?;
        require(self.eval_interval >= 1, "train.eval_interval", self.eval_interval, "at least 1")?;
        require(self.eval_iters >= 1, "train.eval_iters", self.eval_iters, "at least 1")?;
        if let Some(c) = self.checkpoint_interval {
            require(c >= 1, "train.checkpoint_interval", c, "at least 1")?;
        }
        let scale = self.loss_scale;
        require(scale.is_finite() && scale >= 1.0, "train.loss_scale", scale, "a finite number ≥ 1")?;
        let growth = self.loss_scale_growth_interval;
        require(growth >= 1, "train.loss_scale_growth_interval", growth, "at least 1")?;
        Ok(())
    }

    pub fn seq_len(&self, model: &ModelConfig) -> usize {
        self.seq_len.unwrap_or(model.block_size)
    }

    pub fn decay_steps(&self) -> u64 {
        self.decay_steps.unwrap_or(self.max_steps)
    }

    pub fn checkpoint_interval(&self) -> u64 {
        self.checkpoint_interval.unwrap_or(self.eval_interval)
    }
}
