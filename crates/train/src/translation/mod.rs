//! Training the encoder–decoder translator: BPE vocabularies of the parallel training data, token-count batches,
//! label-smoothed cross-entropy, Adam with the inverse-square-root warmup schedule, validation loss and BLEU, and
//! checkpoints kept for averaging. The run directory holds `config.toml`, `tokenizer.json` (the joint or target
//! vocabulary), `source_tokenizer.json` (separate vocabularies only), `model.safetensors`, `checkpoint.safetensors`
//! (weights, Adam moments and the batch order, for `ember train --resume`), `checkpoints/step-N.safetensors` (the
//! weights of the last few checkpoints, for `ember average`), `metrics.jsonl` and `loss.svg`. The loop itself is
//! the one every task shares ([`crate::trainer`]).

mod config;
mod stored;

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::{Device, TensorData};
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::params::ParamInfo;
use ember_core_model::seq2seq::Seq2Seq;
use ember_core_model::{Build, Rng};
use serde::{Deserialize, Serialize};

use crate::collective::{Collective, Shard};
use crate::config::TaskKind;
use crate::loss::smoothed_loss;
use crate::metrics::{EvalLosses, Evaluation};
use crate::parallel::{
    Pair, PairBatch, ParallelError, Vocabularies, encode_pairs, read_aligned, read_tsv, token_batches,
};
use crate::schedule::learning_rate;
use crate::trainer::{BatchLoss, LoopConfig, Task, TaskError, TrainError, TrainLoop};

pub use config::{ParallelDataConfig, Seq2SeqSection, TranslationConfig};
pub use stored::{CHECKPOINTS, Translator, average, checkpoints, load, seq2seq_config};
use stored::{load_vocabularies, save_vocabularies, step_files};

/// The source vocabulary of a run with separate vocabularies (`tokenizer.json` holds the target's).
pub const SOURCE_TOKENIZER: &str = "source_tokenizer.json";

#[derive(Debug, thiserror::Error)]
pub enum TranslationError {
    #[error(transparent)]
    Data(#[from] ParallelError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Import(#[from] ember_core_model::import::ImportError),
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
pub type BleuOf = dyn FnMut(&Seq2Seq, &Vocabularies, &[(String, String)]) -> Result<f64, TaskError>;

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
        for rows in token_batches(&self.valid, self.config.train.max_tokens(), &mut order) {
            let b = PairBatch::new(&self.valid, &rows, &inner);
            let logits = model.forward(b.src, &b.src_lengths, b.tgt_in);
            let loss = smoothed_loss(logits, b.tgt_out, b.mask, self.config.train.label_smoothing());
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
        token_batches(&self.train, self.config.train.max_tokens() * self.shard.ranks, &mut self.rng)
    }
}

/// A translator's evaluation: the validation loss and the corpus BLEU of greedy translations of the first
/// `bleu_sentences` validation pairs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TranslationReport {
    pub step: u64,
    pub val_loss: f32,
    pub val_bleu: f64,
}

impl Evaluation for TranslationReport {
    fn losses(&self) -> EvalLosses {
        EvalLosses { step: self.step, train_loss: None, val_loss: self.val_loss }
    }
    fn summary(&self) -> String {
        format!("val loss {:.4}, val BLEU (greedy) {:.2}", self.val_loss, self.val_bleu)
    }
}

impl Task for Translation {
    type Model = Seq2Seq;
    type State = TranslationState;
    type Report = TranslationReport;

    /// Vaswani et al. (2017) eq. 3 scaled by train.lr, unless `train.schedule` names another.
    fn learning_rate(&self, step: u64) -> f64 {
        learning_rate(&self.config.train, TaskKind::Translation, self.config.model.d_model, step)
    }

    fn decays(&self, param: &ParamInfo) -> bool {
        self.config.train.decays(param, Seq2Seq::is_embedding)
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
        BatchLoss { loss: smoothed_loss(logits, b.tgt_out, b.mask, self.config.train.label_smoothing()), tokens }
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
    fn evaluate(&mut self, model: &Seq2Seq, step: u64, _: &dyn Collective) -> Result<TranslationReport, TrainError> {
        let val_loss = self.validation_loss(model);
        let sentences = &self.valid_text[..self.config.train.bleu_sentences().min(self.valid_text.len())];
        let bleu = (self.bleu)(&model.valid(), &self.vocab, sentences).map_err(|cause| TrainError::Evaluation {
            step,
            cause: format!("scoring validation BLEU: {cause}").into(),
        })?;
        Ok(TranslationReport { step, val_loss, val_bleu: bleu })
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
        for (_, old) in all.iter().rev().skip(self.config.train.keep_checkpoints()) {
            fs::remove_file(old).map_err(|cause| TrainError::Io { path: old.clone(), cause })?;
        }
        Ok(())
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
        let loop_config = LoopConfig::of(&saved.train, TaskKind::Translation);
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
        let loop_config = LoopConfig::of(&config.train, TaskKind::Translation);
        let task = Translation::build(config, vocab, &train_text, valid_text, rng, device, bleu)?;
        Ok((task, model, loop_config))
    }
}
