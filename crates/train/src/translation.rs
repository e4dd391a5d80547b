//! Training the encoder–decoder translator: BPE vocabularies of the parallel training data, token-count batches,
//! label-smoothed cross-entropy, Adam with the inverse-square-root warmup schedule, validation loss and BLEU, and
//! checkpoints kept for averaging. The run directory holds `config.toml`, `tokenizer.json` (the joint or target
//! vocabulary), `source_tokenizer.json` (separate vocabularies only), `model.safetensors`,
//! `checkpoints/step-N.safetensors` and `metrics.jsonl`.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, TensorData};
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::config::{Invalid, require};
use ember_core_model::seq2seq::{Seq2Seq, Seq2SeqConfig};
use ember_core_model::{ModelConfig, Rng, params, tokenizer};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::loss::smoothed_loss;
use crate::optim::{AdamW, AdamWConfig, clip_scale, global_grad_norm};
use crate::parallel::{
    Pair, PairBatch, ParallelError, Vocabularies, encode_pairs, read_aligned, read_tsv, token_batches,
};

/// The source vocabulary of a run with separate vocabularies (`tokenizer.json` holds the target's).
pub const SOURCE_TOKENIZER: &str = "source_tokenizer.json";
use crate::schedule::noam;

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
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("{0}: not a translation run directory (no [seq2seq] in its config.toml)")]
    NotTranslation(PathBuf),
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("{dir} holds {have} checkpoints; averaging the last {want} needs that many")]
    TooFewCheckpoints { dir: PathBuf, have: usize, want: usize },
    #[error("training diverged: the loss is {loss} at step {step}")]
    Diverged { step: u64, loss: f32 },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> TranslationError + '_ {
    move |cause| TranslationError::Io { path: path.to_path_buf(), cause }
}

/// What one step or evaluation reports to the caller (progress bar, logs).
pub enum Progress {
    Step { step: u64, loss: f32, lr: f64, tokens_per_s: f64 },
    Eval { step: u64, val_loss: f32, bleu: f64 },
    Checkpoint { step: u64 },
}

/// Scores a model on untokenised (source, reference) pairs: corpus BLEU of its translations.
pub type BleuOf<'a> = dyn FnMut(&Seq2Seq, &[(String, String)]) -> f64 + 'a;

/// The translation trainer: data, model, optimizer, step counter.
pub struct TranslationTrainer {
    pub config: TranslationConfig,
    pub model: Seq2Seq,
    pub vocab: Vocabularies,
    pub train: Vec<Pair>,
    pub valid: Vec<Pair>,
    /// Untokenised validation pairs, for BLEU.
    pub valid_text: Vec<(String, String)>,
    /// Training pairs left out for exceeding `data.max_len`.
    pub dropped: usize,
    optim: AdamW,
    device: Device,
    rng: Rng,
    pub step: u64,
    pub run_dir: PathBuf,
}

impl TranslationTrainer {
    /// Reads the data, trains the vocabularies (saved in the run directory) and builds the model on `device`.
    pub fn new(config: TranslationConfig, device: &Device) -> Result<Self, TranslationError> {
        let run_dir = config.train.out_dir.clone();
        let read = |path: &Path, target: &Option<PathBuf>| match target {
            Some(target) => read_aligned(path, target),
            None => read_tsv(path),
        };
        let train_text = read(&config.data.train, &config.data.train_target)?;
        let valid_text = read(&config.data.valid, &config.data.valid_target)?;
        let vocab = Vocabularies::train(&train_text, config.data.vocab_size, config.data.joint_vocab)?;
        fs::create_dir_all(run_dir.join("checkpoints")).map_err(io(&run_dir))?;
        save_vocabularies(&vocab, &run_dir)?;
        let (train, dropped) = encode_pairs(&vocab, &train_text, config.data.max_len)?;
        let (valid, _) = encode_pairs(&vocab, &valid_text, config.model.block_size)?;
        let device = device.clone().autodiff();
        let mut rng = Rng::new(config.train.seed);
        let seq2seq = config.seq2seq_config(&vocab);
        let model = Seq2Seq::new(&seq2seq, &mut rng, &device);
        let adam = AdamWConfig {
            beta1: config.train.beta1,
            beta2: config.train.beta2,
            eps: config.train.eps,
            weight_decay: 0.0,
        };
        let saved = TranslationConfig { model: seq2seq.model, ..config.clone() };
        let text = toml::to_string(&saved).expect("a translation config is TOML");
        bundle::write_atomic(&run_dir.join(bundle::CONFIG), text.as_bytes())?;
        fs::write(run_dir.join(bundle::METRICS), "").map_err(io(&run_dir))?;
        Ok(Self {
            config: saved,
            model,
            vocab,
            train,
            valid,
            valid_text,
            dropped,
            optim: AdamW::new(adam, HashSet::new()),
            device,
            rng,
            step: 0,
            run_dir,
        })
    }

    /// Mean label-smoothed loss per target token over the validation set (teacher-forced, no dropout).
    pub fn validation_loss(&self) -> f32 {
        let model = self.model.valid();
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

    /// Trains to `train.max_steps`, epoch after epoch of shuffled token batches; `bleu` scores the model on the
    /// validation sentences it is given at every evaluation; `progress` hears of steps, evaluations, checkpoints.
    pub fn run(&mut self, bleu: &mut BleuOf, progress: &mut dyn FnMut(Progress)) -> Result<(), TranslationError> {
        let t = self.config.train.clone();
        let d = self.config.model.d_model;
        let started = Instant::now();
        let mut tokens_seen = 0usize;
        let out_of_time = || t.max_minutes.is_some_and(|m| started.elapsed().as_secs_f64() >= m * 60.0);
        let mut stopped = false;
        while !stopped {
            for rows in token_batches(&self.train, t.max_tokens, &mut self.rng) {
                let b = PairBatch::new(&self.train, &rows, &self.device);
                let logits = self.model.forward(b.src, &b.src_lengths, b.tgt_in);
                let loss = smoothed_loss(logits, b.tgt_out, b.mask, t.label_smoothing);
                let value = loss.clone().into_scalar::<f32>();
                if !value.is_finite() {
                    return Err(TranslationError::Diverged { step: self.step, loss: value });
                }
                let grads = GradientsParams::from_grads(loss.backward(), &self.model);
                let scale = clip_scale(global_grad_norm(&self.model, &grads), t.grad_clip);
                // Vaswani et al. (2017) eq. 3, scaled by train.lr.
                let lr = t.lr * noam(d, t.warmup_steps, self.step + 1);
                self.model = self.optim.step(self.model.clone(), &grads, lr, scale);
                self.step += 1;
                tokens_seen += b.tokens;
                let tokens_per_s = tokens_seen as f64 / started.elapsed().as_secs_f64();
                progress(Progress::Step { step: self.step, loss: value, lr, tokens_per_s });
                self.metrics(
                    serde_json::json!({"step": self.step, "loss": value, "lr": lr, "tokens_per_s": tokens_per_s}),
                )?;
                let last = self.step == t.max_steps || out_of_time();
                if self.step.is_multiple_of(t.eval_interval) || last {
                    let val_loss = self.validation_loss();
                    let sentences = &self.valid_text[..t.bleu_sentences.min(self.valid_text.len())];
                    let score = bleu(&self.model.valid(), sentences);
                    progress(Progress::Eval { step: self.step, val_loss, bleu: score });
                    self.metrics(serde_json::json!({"step": self.step, "val_loss": val_loss, "val_bleu": score}))?;
                }
                if self.step.is_multiple_of(t.checkpoint_interval) || last {
                    self.save_checkpoint()?;
                    progress(Progress::Checkpoint { step: self.step });
                }
                if last {
                    stopped = true;
                    break;
                }
            }
        }
        Ok(())
    }

    fn metrics(&self, line: serde_json::Value) -> Result<(), TranslationError> {
        let path = self.run_dir.join(bundle::METRICS);
        let mut file = fs::OpenOptions::new().append(true).create(true).open(&path).map_err(io(&path))?;
        writeln!(file, "{line}").map_err(io(&path))
    }

    /// Writes `checkpoints/step-N.safetensors` and `model.safetensors`, keeping the last `keep_checkpoints`.
    fn save_checkpoint(&self) -> Result<(), TranslationError> {
        let weights = params::state_dict(&self.model.valid());
        let dir = self.run_dir.join("checkpoints");
        bundle::save_tensors(&dir.join(format!("step-{}.safetensors", self.step)), &weights, HashMap::new())?;
        bundle::save_tensors(&self.run_dir.join(bundle::MODEL), &weights, HashMap::new())?;
        let all = checkpoints(&self.run_dir)?;
        for (_, old) in all.iter().rev().skip(self.config.train.keep_checkpoints) {
            fs::remove_file(old).map_err(io(old))?;
        }
        Ok(())
    }
}

/// The checkpoints of a run directory, by step.
pub fn checkpoints(run_dir: &Path) -> Result<Vec<(u64, PathBuf)>, TranslationError> {
    let dir = run_dir.join("checkpoints");
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(&dir)
        .map_err(io(&dir))?
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
    let text = fs::read_to_string(&path).map_err(io(&path))?;
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
    let model = Seq2Seq::new(&config.seq2seq_config(&vocab), &mut Rng::placeholder(), device);
    let model = params::load_state_dict(model, &tensors)
        .map_err(|cause| BundleError::Mismatch { path: weights.clone(), cause })?;
    Ok(Translator { config, model, vocab })
}

/// θ̄ = (1/n) Σ θ_i over the last `n` checkpoints (Vaswani et al. 2017: the last 5, written 10 minutes apart),
/// written as `model.safetensors` of a new run directory `out` with the same config and vocabularies.
pub fn average(run_dir: &Path, n: usize, out: &Path) -> Result<Vec<u64>, TranslationError> {
    let all = checkpoints(run_dir)?;
    if all.len() < n || n == 0 {
        return Err(TranslationError::TooFewCheckpoints { dir: run_dir.join("checkpoints"), have: all.len(), want: n });
    }
    let chosen = &all[all.len() - n..];
    let mut sum: HashMap<String, (Vec<f32>, Vec<usize>)> = HashMap::new();
    for (_, path) in chosen {
        let (tensors, _) = bundle::load_tensors(path)?;
        for (name, data) in tensors {
            let values = data.try_to_vec::<f32>().unwrap_or_default();
            let entry = sum.entry(name).or_insert_with(|| (vec![0.0; values.len()], data.shape().to_vec()));
            entry.0.iter_mut().zip(&values).for_each(|(s, v)| *s += v / n as f32);
        }
    }
    fs::create_dir_all(out).map_err(io(out))?;
    let mut tensors: Vec<(String, TensorData)> =
        sum.into_iter().map(|(name, (values, shape))| (name, TensorData::new(values, shape))).collect();
    tensors.sort_by(|a, b| a.0.cmp(&b.0));
    bundle::save_tensors(&out.join(bundle::MODEL), &tensors, HashMap::new())?;
    let config = run_dir.join(bundle::CONFIG);
    fs::copy(&config, out.join(bundle::CONFIG)).map_err(io(&config))?;
    save_vocabularies(&load_vocabularies(run_dir)?, out)?;
    Ok(chosen.iter().map(|(step, _)| *step).collect())
}
