//! `[data]` and `[train]` of a run's TOML config.

use std::path::{Path, PathBuf};

use ember_core_model::ModelConfig;
use ember_core_model::config::{Invalid, require};
use ember_core_model::params::ParamInfo;

use crate::loss_scale::LossScaling;
use crate::optim::AdamWConfig;
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenizerKind {
    /// One token per character of the training text.
    Char,
    /// Byte-level BPE trained to `data.vocab_size` tokens.
    Bpe,
}

/// What a corpus holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DataFormat {
    /// Plain text: the model learns every token.
    #[default]
    Text,
    /// JSONL conversations (OpenAI `messages`), rendered with the model's chat template: the model learns the
    /// assistant's replies ([`crate::chats`]).
    Chat,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// UTF-8 text to train on (JSONL conversations with `format = "chat"`).
    pub corpus: PathBuf,
    #[serde(default, skip_serializing_if = "is_text")]
    pub format: DataFormat,
    /// A dataset `scripts/prepare-data.sh` can rebuild when `corpus` is missing.
    pub dataset: Option<String>,
    pub tokenizer: TokenizerKind,
    /// Vocabulary size of a BPE tokenizer.
    pub vocab_size: Option<usize>,
    /// The last fraction of the corpus (by position) is the validation split.
    #[serde(default = "default_val_fraction")]
    pub val_fraction: f64,
}

fn is_text(format: &DataFormat) -> bool {
    *format == DataFormat::Text
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

/// The task a `[train]` section drives: which batch and evaluation keys it reads, and its optimizer defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskKind {
    LanguageModel,
    Translation,
}

impl TaskKind {
    fn name(self) -> &'static str {
        match self {
            TaskKind::LanguageModel => "a language model's",
            TaskKind::Translation => "a translator's",
        }
    }

    /// nanoGPT's cosine decay for language models; Vaswani et al.'s schedule for translation.
    fn schedule(self) -> ScheduleKind {
        match self {
            TaskKind::LanguageModel => ScheduleKind::Cosine,
            TaskKind::Translation => ScheduleKind::Noam,
        }
    }

    /// Adam's (β₂, ε): PyTorch's (0.999, 1e-8) for language models, Vaswani et al.'s (0.98, 1e-9) for translation.
    fn adam(self) -> (f64, f64) {
        match self {
            TaskKind::LanguageModel => (0.999, 1e-8),
            TaskKind::Translation => (0.98, 1e-9),
        }
    }
}

/// `[train]`, one section for both tasks: the loop, AdamW and the schedule, and each task's batch and evaluation
/// keys (language model: `batch_size`, `seq_len`, `eval_iters`; translation: `max_tokens`, `label_smoothing`,
/// `bleu_sentences`, `keep_checkpoints`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    #[serde(default = "default_seed")]
    pub seed: u64,
    /// Language model: sequences per batch (12 when absent, as nanoGPT).
    pub batch_size: Option<usize>,
    /// Language model: tokens per training window; defaults to `model.block_size`.
    pub seq_len: Option<usize>,
    /// Translation: tokens per batch, padding included (rows × longest side; 4096 when absent, as fairseq's
    /// `--max-tokens` in its recipes).
    pub max_tokens: Option<usize>,
    pub max_steps: u64,
    /// Stop after this many minutes of training (evaluating and checkpointing first); unset: train to `max_steps`.
    pub max_minutes: Option<f64>,
    /// Batches whose gradients are summed into one optimizer step (fairseq's `--update-freq`).
    #[serde(default = "one")]
    pub grad_accum: usize,
    /// The peak learning rate (cosine, constant), or the factor of Vaswani et al.'s schedule (noam).
    pub lr: f64,
    #[serde(default)]
    pub min_lr: f64,
    #[serde(default)]
    pub warmup_steps: u64,
    /// Step at which cosine decay reaches `min_lr`; defaults to `max_steps`.
    pub decay_steps: Option<u64>,
    /// Cosine for language models, noam for translation when absent.
    pub schedule: Option<ScheduleKind>,
    #[serde(default = "default_beta1")]
    pub beta1: f64,
    /// 0.999 for language models, 0.98 for translation when absent.
    pub beta2: Option<f64>,
    /// 1e-8 for language models, 1e-9 for translation when absent.
    pub eps: Option<f64>,
    /// Decoupled weight decay on 2-D weight matrices (never on biases or norm gains).
    #[serde(default)]
    pub weight_decay: f64,
    /// Whether the embedding tables decay too (nanoGPT: yes).
    #[serde(default = "yes")]
    pub decay_embeddings: bool,
    /// Clip the global gradient norm to this value; 0 turns clipping off.
    #[serde(default)]
    pub grad_clip: f64,
    /// Translation: label smoothing ε of the loss (0.1 when absent).
    pub label_smoothing: Option<f64>,
    pub eval_interval: u64,
    /// Language model: batches averaged for each split's loss at an evaluation (200 when absent, as nanoGPT).
    pub eval_iters: Option<usize>,
    /// Translation: validation sentences translated (greedily) for BLEU at each evaluation (200 when absent).
    pub bleu_sentences: Option<usize>,
    /// Steps between checkpoints; defaults to `eval_interval`.
    pub checkpoint_interval: Option<u64>,
    /// Translation: checkpoints kept (the last ones), for `ember average` (5 when absent).
    pub keep_checkpoints: Option<usize>,
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

fn default_seed() -> u64 {
    1337
}
fn one() -> usize {
    1
}
pub(crate) fn yes() -> bool {
    true
}
fn default_beta1() -> f64 {
    0.9
}

impl TrainConfig {
    /// Checks the keys `task` reads and refuses the other task's.
    pub fn validate(&self, task: TaskKind, model: &ModelConfig) -> Result<(), Invalid> {
        require_out_dir(&self.out_dir)?;
        let keys = self.task_keys();
        let own: Vec<&str> = keys.iter().filter(|k| k.0 == task).map(|k| k.1).collect();
        for (owner, key, set) in keys {
            let why = || format!("{} key; {} [train] reads {} instead", owner.name(), task.name(), own.join(", "));
            require(owner == task || !set, &format!("train.{key}"), "(set)", why())?;
        }
        match task {
            TaskKind::LanguageModel => {
                let batch = self.batch_size();
                require(batch >= 1, "train.batch_size", batch, "at least 1")?;
                if let Some(t) = self.seq_len {
                    require(t >= 1, "train.seq_len", t, "at least 1")?;
                    let rows =
                        format!("at most model.block_size = {} (the rows of the position table)", model.block_size);
                    require(t <= model.block_size, "train.seq_len", t, rows)?;
                }
                require(self.eval_iters() >= 1, "train.eval_iters", self.eval_iters(), "at least 1")?;
            }
            TaskKind::Translation => {
                let smoothing = self.label_smoothing();
                require((0.0..1.0).contains(&smoothing), "train.label_smoothing", smoothing, "in [0, 1)")?;
                let keep = self.keep_checkpoints();
                require(keep >= 1, "train.keep_checkpoints", keep, "at least 1")?;
            }
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
        if self.schedule(task) == ScheduleKind::Noam {
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
        let adam = self.adamw(task);
        require((0.0..1.0).contains(&adam.beta1), "train.beta1", adam.beta1, "in [0, 1)")?;
        require((0.0..1.0).contains(&adam.beta2), "train.beta2", adam.beta2, "in [0, 1)")?;
        require(adam.eps > 0.0, "train.eps", adam.eps, "a number > 0")?;
        require(self.weight_decay >= 0.0, "train.weight_decay", self.weight_decay, "a number ≥ 0")?;
        require(self.grad_clip >= 0.0, "train.grad_clip", self.grad_clip, "a number ≥ 0 (0 turns clipping off)")?;
        require(self.eval_interval >= 1, "train.eval_interval", self.eval_interval, "at least 1")?;
        if let Some(c) = self.checkpoint_interval {
            require(c >= 1, "train.checkpoint_interval", c, "at least 1")?;
        }
        let scale = self.loss_scale;
        require(scale.is_finite() && scale >= 1.0, "train.loss_scale", scale, "a finite number ≥ 1")?;
        let growth = self.loss_scale_growth_interval;
        require(growth >= 1, "train.loss_scale_growth_interval", growth, "at least 1")?;
        Ok(())
    }

    /// Each task's own keys, and whether the section sets it.
    fn task_keys(&self) -> [(TaskKind, &'static str, bool); 7] {
        use TaskKind::{LanguageModel as Lm, Translation as Mt};
        [
            (Lm, "batch_size", self.batch_size.is_some()),
            (Lm, "seq_len", self.seq_len.is_some()),
            (Lm, "eval_iters", self.eval_iters.is_some()),
            (Mt, "max_tokens", self.max_tokens.is_some()),
            (Mt, "label_smoothing", self.label_smoothing.is_some()),
            (Mt, "bleu_sentences", self.bleu_sentences.is_some()),
            (Mt, "keep_checkpoints", self.keep_checkpoints.is_some()),
        ]
    }

    pub fn batch_size(&self) -> usize {
        self.batch_size.unwrap_or(12)
    }

    pub fn seq_len(&self, model: &ModelConfig) -> usize {
        self.seq_len.unwrap_or(model.block_size)
    }

    pub fn eval_iters(&self) -> usize {
        self.eval_iters.unwrap_or(200)
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens.unwrap_or(4096)
    }

    pub fn label_smoothing(&self) -> f64 {
        self.label_smoothing.unwrap_or(0.1)
    }

    pub fn bleu_sentences(&self) -> usize {
        self.bleu_sentences.unwrap_or(200)
    }

    pub fn keep_checkpoints(&self) -> usize {
        self.keep_checkpoints.unwrap_or(5)
    }

    pub fn schedule(&self, task: TaskKind) -> ScheduleKind {
        self.schedule.unwrap_or(task.schedule())
    }

    /// AdamW's settings, with `task`'s defaults for what is absent.
    pub fn adamw(&self, task: TaskKind) -> AdamWConfig {
        let (beta2, eps) = task.adam();
        let (beta2, eps) = (self.beta2.unwrap_or(beta2), self.eps.unwrap_or(eps));
        AdamWConfig { beta1: self.beta1, beta2, eps, weight_decay: self.weight_decay }
    }

    /// Decoupled decay on 2-D weight matrices; on the embedding tables (`is_embedding` of the path) only when
    /// `decay_embeddings`.
    pub fn decays(&self, param: &ParamInfo, is_embedding: fn(&str) -> bool) -> bool {
        param.shape.len() == 2 && (self.decay_embeddings || !is_embedding(&param.path))
    }

    pub fn decay_steps(&self) -> u64 {
        self.decay_steps.unwrap_or(self.max_steps)
    }

    pub fn checkpoint_interval(&self) -> u64 {
        self.checkpoint_interval.unwrap_or(self.eval_interval)
    }
}
