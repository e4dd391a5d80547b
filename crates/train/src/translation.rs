//! Training the encoder–decoder translator: BPE vocabularies of the parallel training data, token-count batches,
//! label-smoothed cross-entropy, Adam with the inverse-square-root warmup schedule, validation loss and BLEU, and
//! checkpoints kept for averaging. The run directory holds `config.toml`, `tokenizer.json` (the joint or target
//! vocabulary), `source_tokenizer.json` (separate vocabularies only), `model.safetensors`, `checkpoint.safetensors`
//! (weights, Adam moments and the batch order, for `ember train --resume`), `checkpoints/step-N.safetensors` (the
//! weights of the last few checkpoints, for `ember average`), `metrics.jsonl` and `loss.svg`. The loop itself is
//! the one every task shares ([`crate::trainer`]).

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::{DType, Device, TensorData};
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::config::{Invalid, require};
use ember_core_model::params::ParamInfo;
use ember_core_model::seq2seq::{Seq2Seq, Seq2SeqConfig};
use ember_core_model::{ModelConfig, Rng, tokenizer};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::collective::{Collective, Shard};
use crate::loss::smoothed_loss;
use crate::loss_scale::LossScaling;
use crate::optim::AdamWConfig;
use crate::parallel::{
    Pair, PairBatch, ParallelError, Vocabularies, encode_pairs, read_aligned, read_tsv, token_batches,
};
use crate::schedule::noam;
use crate::trainer::{BatchLoss, BleuError, EvalReport, LoopConfig, Task, TrainError, TrainLoop};

/// The source vocabulary of a run with separate vocabularies (`tokenizer.json` holds the target's).
pub const SOURCE_TOKENIZER: &str = "source_tokenizer.json";

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

#[derive(Debug, thiserror::Error)]
pub enum TranslationError {
    #[error(transparent)]
    Data(#[from] ParallelError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("{0}: not a translation run directory (no [seq2seq] in its config.toml)")]
    NotTranslation(PathBuf),
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("{path}: no training pair has fewer than data.max_len = {max_len} tokens on both sides")]
    NoTrainingPairs { path: PathBuf, max_len: usize },
    #[error("{dir} holds {have} checkpoints; averaging the last {want} needs that many")]
    TooFewCheckpoints { dir: PathBuf, have: usize, want: usize },
    #[error("{path}: cannot average tensor {tensor}: {reason}")]
    Average { path: PathBuf, tensor: String, reason: String },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TranslationError + '_ {
    move |cause| TranslationError::Io { path: path.to_path_buf(), cause }
}

/// Scores a model on untokenised (source, reference) pairs: corpus BLEU of its translations (target vocabulary
/// `vocab.target`); a translation that fails is an error, never a score.
pub type BleuOf = dyn FnMut(&Seq2Seq, &Vocabularies, &[(String, String)]) -> Result<f64, BleuError>;

/// Translation as a [`Task`] of the shared loop: epochs of shuffled token batches, label-smoothed cross-entropy,
/// the inverse-square-root schedule, and evaluation by validation loss and BLEU.
pub struct Translation {
    pub config: TranslationConfig,
    pub vocab: Vocabularies,
    pub train: Vec<Pair>,
    pub valid: Vec<Pair>,
    /// Untokenised validation pairs, for BLEU.
    pub valid_text: Vec<(String, String)>,
    /// Training pairs left out for exceeding `data.max_len`.
    pub dropped: usize,
    /// This rank's part of each batch.
    shard: Shard,
    /// The autodiff device batches are made on.
    device: Device,
    bleu: Box<BleuOf>,
    /// The batch-order generator (after shuffling the current epoch).
    rng: Rng,
    /// The generator as it was before it shuffled the current epoch.
    epoch_rng: Rng,
    /// The current epoch's batches (pair indices) and how many of them were trained on.
    batches: Vec<Vec<usize>>,
    position: usize,
    epoch: u64,
}

/// A translation run's data position: enough to redraw the current epoch's batch order and continue after the
/// batches already trained on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TranslationState {
    /// The batch-order generator before it shuffled the current epoch.
    pub epoch_rng: Rng,
    /// Epochs begun.
    pub epoch: u64,
    /// Batches of the current epoch trained on.
    pub position: usize,
    /// Training pairs kept, which the batches index: a resumed run must read the same data.
    pub train_pairs: usize,
}

/// Untokenised (source, target) sentence pairs.
type TextPairs = Vec<(String, String)>;

/// The training and validation pairs of `[data]`.
fn read_data(data: &ParallelDataConfig) -> Result<(TextPairs, TextPairs), ParallelError> {
    let read = |path: &Path, target: &Option<PathBuf>| match target {
        Some(target) => read_aligned(path, target),
        None => read_tsv(path),
    };
    Ok((read(&data.train, &data.train_target)?, read(&data.valid, &data.valid_target)?))
}

impl Translation {
    /// The task over `train_text` and `valid_text` encoded with `vocab`; `rng` orders the batches.
    fn build(
        config: TranslationConfig,
        vocab: Vocabularies,
        train_text: &[(String, String)],
        valid_text: Vec<(String, String)>,
        rng: Rng,
        device: Device,
        bleu: Box<BleuOf>,
    ) -> Result<Self, TranslationError> {
        let (train, dropped) = encode_pairs(&vocab, train_text, config.data.max_len)?;
        if train.is_empty() {
            return Err(TranslationError::NoTrainingPairs {
                path: config.data.train.clone(),
                max_len: config.data.max_len,
            });
        }
        let (valid, _) = encode_pairs(&vocab, &valid_text, config.model.block_size)?;
        Ok(Self {
            config,
            vocab,
            train,
            valid,
            valid_text,
            dropped,
            shard: Shard::WHOLE,
            device,
            bleu,
            epoch_rng: rng.clone(),
            rng,
            batches: Vec::new(),
            position: 0,
            epoch: 0,
        })
    }

    /// Mean label-smoothed loss per target token over the validation set (teacher-forced, no dropout).
    pub fn validation_loss(&self, model: &Seq2Seq) -> f32 {
        let model = model.valid();
        let inner = self.device.clone().inner();
        let mut order = Rng::new(0);
        let (mut total, mut tokens) = (0.0f64, 0usize);
        for rows in token_batches(&self.valid, self.config.train.max_tokens, &mut order) {
            let b = PairBatch::new(&self.valid, &rows, &inner);
            let logits = model.forward(b.src, &b.src_lengths, b.tgt_in);
            let loss = smoothed_loss(logits, b.tgt_out, b.mask, self.config.train.label_smoothing);
            total += loss.into_scalar::<f32>() as f64 * b.tokens as f64;
            tokens += b.tokens;
        }
        (total / tokens.max(1) as f64) as f32
    }

    /// Epochs begun so far.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The epoch's batches, of `max_tokens` per rank: each global batch holds about `max_tokens` for every rank.
    fn epoch_batches(&mut self) -> Vec<Vec<usize>> {
        token_batches(&self.train, self.config.train.max_tokens * self.shard.ranks, &mut self.rng)
    }
}

impl Task for Translation {
    type Model = Seq2Seq;
    type State = TranslationState;

    /// Vaswani et al. (2017) eq. 3, scaled by train.lr.
    fn learning_rate(&self, step: u64) -> f64 {
        let t = &self.config.train;
        t.lr * noam(self.config.model.d_model, t.warmup_steps, step + 1)
    }

    fn decays(&self, _param: &ParamInfo) -> bool {
        false
    }

    /// This rank's rows of the next batch of the epoch, starting a newly shuffled epoch when this one is done. A
    /// batch of fewer rows than ranks leaves some rank none: it computes on the first row and counts no tokens, so
    /// its gradient weighs nothing in the average.
    fn next_loss(&mut self, model: &Seq2Seq) -> BatchLoss {
        if self.position == self.batches.len() {
            self.epoch_rng = self.rng.clone();
            self.batches = self.epoch_batches();
            self.position = 0;
            self.epoch += 1;
        }
        let rows = &self.batches[self.position];
        let mine = &rows[self.shard.rows(rows.len())];
        let b = PairBatch::new(&self.train, if mine.is_empty() { &rows[..1] } else { mine }, &self.device);
        self.position += 1;
        let tokens = if mine.is_empty() { 0 } else { b.tokens };
        let logits = model.forward(b.src, &b.src_lengths, b.tgt_in);
        BatchLoss { loss: smoothed_loss(logits, b.tgt_out, b.mask, self.config.train.label_smoothing), tokens }
    }

    /// Also redraws the current epoch's batches (a resumed run's) for the new number of ranks.
    fn set_shard(&mut self, shard: Shard) {
        self.shard = shard;
        if self.epoch > 0 {
            self.rng = self.epoch_rng.clone();
            self.batches = self.epoch_batches();
        }
    }

    /// Validation loss, and the BLEU of the first `bleu_sentences` validation pairs (each rank computes both).
    fn evaluate(&mut self, model: &Seq2Seq, step: u64, _: &dyn Collective) -> Result<EvalReport, TrainError> {
        let val_loss = self.validation_loss(model);
        let sentences = &self.valid_text[..self.config.train.bleu_sentences.min(self.valid_text.len())];
        let bleu =
            (self.bleu)(&model.valid(), &self.vocab, sentences).map_err(|cause| TrainError::Bleu { step, cause })?;
        Ok(EvalReport { step, train_loss: None, val_loss, val_bleu: Some(bleu) })
    }

    fn state(&self) -> TranslationState {
        TranslationState {
            epoch_rng: self.epoch_rng.clone(),
            epoch: self.epoch,
            position: self.position,
            train_pairs: self.train.len(),
        }
    }

    fn restore(&mut self, state: TranslationState, run_dir: &Path) -> Result<(), TrainError> {
        let refuse = |reason: String| TrainError::Resume { run_dir: run_dir.to_path_buf(), reason };
        if state.train_pairs != self.train.len() {
            return Err(refuse(format!(
                "its checkpoint was trained on {} pairs, but {} now gives {}",
                state.train_pairs,
                self.config.data.train.display(),
                self.train.len()
            )));
        }
        self.rng = state.epoch_rng.clone();
        self.batches = match state.epoch {
            0 => Vec::new(),
            _ => self.epoch_batches(),
        };
        if state.position > self.batches.len() {
            return Err(refuse(format!(
                "its checkpoint is at batch {} of an epoch of {} (was train.max_tokens changed?)",
                state.position,
                self.batches.len()
            )));
        }
        (self.epoch_rng, self.epoch, self.position) = (state.epoch_rng, state.epoch, state.position);
        Ok(())
    }

    /// Writes `checkpoints/step-N.safetensors`, keeping the last `keep_checkpoints`, for `ember average`.
    fn on_checkpoint(&mut self, run_dir: &Path, step: u64, weights: &[(String, TensorData)]) -> Result<(), TrainError> {
        let dir = run_dir.join(CHECKPOINTS);
        fs::create_dir_all(&dir).map_err(|cause| TrainError::Io { path: dir.clone(), cause })?;
        bundle::save_tensors(&dir.join(format!("step-{step}.safetensors")), weights, HashMap::new())?;
        let all = step_files(&dir).map_err(|cause| TrainError::Io { path: dir.clone(), cause })?;
        for (_, old) in all.iter().rev().skip(self.config.train.keep_checkpoints) {
            fs::remove_file(old).map_err(|cause| TrainError::Io { path: old.clone(), cause })?;
        }
        Ok(())
    }
}

impl From<&TranslationTrainConfig> for LoopConfig {
    fn from(t: &TranslationTrainConfig) -> Self {
        LoopConfig {
            max_steps: t.max_steps,
            max_minutes: t.max_minutes,
            grad_accum: t.grad_accum,
            grad_clip: t.grad_clip,
            eval_interval: t.eval_interval,
            eval_at_start: false,
            checkpoint_interval: t.checkpoint_interval,
            adamw: AdamWConfig { beta1: t.beta1, beta2: t.beta2, eps: t.eps, weight_decay: 0.0 },
            loss_scaling: LossScaling::default(),
        }
    }
}

/// Training the translator.
pub type TranslationTrainer = TrainLoop<Translation>;

impl TrainLoop<Translation> {
    /// Reads the data, trains the vocabularies, writes them and `config.toml` (with the model's vocabulary size) to
    /// `train.out_dir`, and builds the model on `device`; `bleu` scores it at every evaluation.
    pub fn new(config: TranslationConfig, device: &Device, bleu: Box<BleuOf>) -> Result<Self, TranslationError> {
        let run_dir = config.train.out_dir.clone();
        let (train_text, valid_text) = read_data(&config.data)?;
        let vocab = Vocabularies::train(&train_text, config.data.vocab_size, config.data.joint_vocab)?;
        fs::create_dir_all(run_dir.join(CHECKPOINTS)).map_err(io(&run_dir))?;
        save_vocabularies(&vocab, &run_dir)?;
        let device = device.clone().autodiff();
        // The generator that initialises the model goes on to order the batches.
        let mut rng = Rng::new(config.train.seed);
        let seq2seq = config.seq2seq_config(&vocab);
        let model = Seq2Seq::new(&seq2seq, &mut rng, &device);
        let saved = TranslationConfig { model: seq2seq.model, ..config };
        let text = toml::to_string(&saved).expect("a translation config is TOML");
        bundle::write_atomic(&run_dir.join(bundle::CONFIG), text.as_bytes())?;
        let loop_config = LoopConfig::from(&saved.train);
        let task = Translation::build(saved, vocab, &train_text, valid_text, rng, device, bleu)?;
        Ok(TrainLoop::fresh(task, model, loop_config, &run_dir))
    }

    /// Continues the translation run in `run_dir` from its `checkpoint.safetensors`, with its vocabularies and
    /// `config` (its `config.toml`, perhaps with a new `train.max_steps`); the data files must be the ones it
    /// was trained on.
    pub fn resume(
        config: TranslationConfig,
        run_dir: &Path,
        device: &Device,
        bleu: Box<BleuOf>,
    ) -> Result<Self, TranslationError> {
        let (task, model, loop_config) = Self::from_run_dir(config, run_dir, device, bleu)?;
        let inner = task.device.clone().inner();
        Ok(TrainLoop::from_checkpoint(task, model, loop_config, run_dir, &inner)?)
    }

    /// The fresh run another rank started with [`TranslationTrainer::new`] in `config`'s `train.out_dir`, for the
    /// ranks that do not write: the same data, the vocabularies it wrote, the same seeded model.
    pub fn replica(config: TranslationConfig, device: &Device, bleu: Box<BleuOf>) -> Result<Self, TranslationError> {
        let run_dir = config.train.out_dir.clone();
        let (task, model, loop_config) = Self::from_run_dir(config, &run_dir, device, bleu)?;
        Ok(TrainLoop::fresh(task, model, loop_config, &run_dir))
    }

    /// The task, the freshly initialised model and the loop settings of a run directory that holds vocabularies.
    fn from_run_dir(
        config: TranslationConfig,
        run_dir: &Path,
        device: &Device,
        bleu: Box<BleuOf>,
    ) -> Result<(Translation, Seq2Seq, LoopConfig), TranslationError> {
        let (train_text, valid_text) = read_data(&config.data)?;
        let vocab = load_vocabularies(run_dir)?;
        let device = device.clone().autodiff();
        let mut rng = Rng::new(config.train.seed);
        let model = Seq2Seq::new(&config.seq2seq_config(&vocab), &mut rng, &device);
        let loop_config = LoopConfig::from(&config.train);
        let task = Translation::build(config, vocab, &train_text, valid_text, rng, device, bleu)?;
        Ok((task, model, loop_config))
    }
}

/// The directory of a run's `step-N.safetensors` weights.
pub const CHECKPOINTS: &str = "checkpoints";

/// The checkpoints of a run directory, by step.
pub fn checkpoints(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>, TranslationError> {
    let dir = run_dir.join(CHECKPOINTS);
    step_files(&dir).map_err(io(&dir))
}

/// The `step-N.safetensors` files of `dir`, by step.
fn step_files(dir: &Path) -> std::io::Result<Vec<(u64, PathBuf)>> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let step = name.strip_prefix("step-")?.strip_suffix(".safetensors")?.parse().ok()?;
            Some((step, p))
        })
        .collect();
    found.sort();
    Ok(found)
}

/// A trained translator: its config, model and vocabularies.
pub struct Translator {
    pub config: TranslationConfig,
    pub model: Seq2Seq,
    pub vocab: Vocabularies,
}

/// Writes `tokenizer.json` (the joint or target vocabulary) and, for separate vocabularies, `source_tokenizer.json`.
fn save_vocabularies(vocab: &Vocabularies, run_dir: &Path) -> Result<(), BundleError> {
    let save = |tok: &Tokenizer, name: &str| {
        let path = run_dir.join(name);
        tokenizer::save(tok, &path).map_err(|cause| BundleError::Tokenizer { path, cause })
    };
    save(&vocab.target, bundle::TOKENIZER)?;
    if !vocab.joint {
        save(&vocab.source, SOURCE_TOKENIZER)?;
    }
    Ok(())
}

/// The vocabularies [`save_vocabularies`] wrote: separate when `source_tokenizer.json` is present.
fn load_vocabularies(run_dir: &Path) -> Result<Vocabularies, BundleError> {
    let load = |name: &str| {
        let path = run_dir.join(name);
        tokenizer::load(&path).map_err(|cause| BundleError::Tokenizer { path, cause })
    };
    let target = load(bundle::TOKENIZER)?;
    if !run_dir.join(SOURCE_TOKENIZER).exists() {
        return Ok(Vocabularies { source: target.clone(), target, joint: true });
    }
    Ok(Vocabularies { source: load(SOURCE_TOKENIZER)?, target, joint: false })
}

/// Loads a translation run directory, with the weights of `weights` (default `model.safetensors`).
pub fn load(run_dir: &Path, weights: Option<&Path>, device: &Device) -> Result<Translator, TranslationError> {
    let path = run_dir.join(bundle::CONFIG);
    let text = ember_core_model::files::read_to_string(&path).map_err(io(&path))?;
    let table: toml::Table = toml::from_str(&text)
        .map_err(|e| TranslationError::Config { path: path.clone(), reason: e.message().into() })?;
    if !table.contains_key("seq2seq") {
        return Err(TranslationError::NotTranslation(run_dir.to_path_buf()));
    }
    let config: TranslationConfig = toml::Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| TranslationError::Config { path: path.clone(), reason: e.message().into() })?;
    let vocab = load_vocabularies(run_dir)?;
    let weights = weights.map_or_else(|| run_dir.join(bundle::MODEL), Path::to_path_buf);
    let (tensors, _) = bundle::load_tensors(&weights)?;
    let model = Seq2Seq::load(&config.seq2seq_config(&vocab), &tensors, device)
        .map_err(|cause| BundleError::Mismatch { path: weights.clone(), cause })?;
    Ok(Translator { config, model, vocab })
}

/// θ̄ = (1/n) Σ θ_i over the last `n` checkpoints (Vaswani et al. 2017: the last 5, written 10 minutes apart),
/// written as `model.safetensors` of a new run directory `out` with the same config and vocabularies. Every
/// checkpoint must hold the same f32 tensors with the same shapes.
pub fn average(run_dir: &Path, n: usize, out: &Path) -> Result<Vec<u64>, TranslationError> {
    let all = checkpoints(run_dir)?;
    if all.len() < n || n == 0 {
        return Err(TranslationError::TooFewCheckpoints { dir: run_dir.join(CHECKPOINTS), have: all.len(), want: n });
    }
    let chosen = &all[all.len() - n..];
    let first = &chosen[0].1;
    let mut sum: BTreeMap<String, (Vec<f32>, Vec<usize>)> = BTreeMap::new();
    for (i, (_, path)) in chosen.iter().enumerate() {
        let bad = |tensor: &str, reason: String| TranslationError::Average {
            path: path.clone(),
            tensor: tensor.to_string(),
            reason,
        };
        let (tensors, _) = bundle::load_tensors(path)?;
        if let Some(missing) = sum.keys().find(|name| !tensors.contains_key(*name)) {
            return Err(bad(missing, format!("missing here but present in {}", first.display())));
        }
        for (name, data) in tensors {
            if data.dtype() != DType::F32 {
                return Err(bad(&name, format!("it is {:?}, not F32", data.dtype())));
            }
            let values = data.as_slice::<f32>().map_err(|e| bad(&name, format!("{e:?}")))?;
            let shape = data.shape().to_vec();
            if i == 0 {
                sum.insert(name.clone(), (vec![0.0; values.len()], shape.clone()));
            }
            let Some((acc, acc_shape)) = sum.get_mut(&name) else {
                return Err(bad(&name, format!("not in {}", first.display())));
            };
            if *acc_shape != shape {
                return Err(bad(&name, format!("shape {shape:?}, but {acc_shape:?} in {}", first.display())));
            }
            acc.iter_mut().zip(values).for_each(|(s, v)| *s += v / n as f32);
        }
    }
    fs::create_dir_all(out).map_err(io(out))?;
    let tensors: Vec<(String, TensorData)> =
        sum.into_iter().map(|(name, (values, shape))| (name, TensorData::new(values, shape))).collect();
    bundle::save_tensors(&out.join(bundle::MODEL), &tensors, HashMap::new())?;
    let config = run_dir.join(bundle::CONFIG);
    fs::copy(&config, out.join(bundle::CONFIG)).map_err(io(&config))?;
    save_vocabularies(&load_vocabularies(run_dir)?, out)?;
    Ok(chosen.iter().map(|(step, _)| *step).collect())
}
