//! The training loop: sample windows, causal-LM loss, backward, global-norm clipping, AdamW, schedule,
//! evaluation, metrics and checkpoints.

use std::collections::HashSet;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::Device;
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::params::{self, Mismatch, ParamInfo};
use ember_core_model::{Gpt, ModelConfig, Rng};
use serde::{Deserialize, Serialize};

use crate::checkpoint::{self, CheckpointError, TrainState};
use crate::config::TrainConfig;
use crate::corpus::{Corpus, Sampler};
use crate::loss::lm_loss;
use crate::optim::{AdamW, AdamWConfig, clip_scale, global_grad_norm};
use crate::plot::{Series, loss_svg};
use crate::schedule::learning_rate;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("checkpoint does not fit the configured model: {0}")]
    Mismatch(#[from] Mismatch),
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    #[error("the loss became {loss} at step {step}; the last checkpoint in {run_dir} is intact")]
    NonFinite { loss: f32, step: u64, run_dir: PathBuf },
}

/// One optimizer step, as the progress bar and `metrics.jsonl` see it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepReport {
    pub step: u64,
    pub loss: f32,
    pub lr: f64,
    pub grad_norm: f64,
    pub tokens_per_s: f64,
}

/// Mean losses over `eval_iters` batches of each split.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EvalReport {
    pub step: u64,
    pub train_loss: f32,
    pub val_loss: f32,
}

/// What the loop tells its caller; the library itself never prints.
pub trait Observer {
    fn on_step(&mut self, _report: &StepReport) {}
    fn on_eval(&mut self, _report: &EvalReport) {}
    fn on_checkpoint(&mut self, _step: u64) {}
}

pub struct Trainer {
    pub model_config: ModelConfig,
    pub config: TrainConfig,
    pub run_dir: PathBuf,
    device: Device,
    pub model: Gpt,
    optim: AdamW,
    params: Vec<ParamInfo>,
    corpus: Corpus,
    pub state: TrainState,
    /// Where the steps' time went so far.
    pub phases: StepPhases,
}

/// Time spent in each phase of the training steps (the CPU backends run eagerly, so the clock sees each phase).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepPhases {
    /// Batch, forward pass and loss (read back).
    pub forward: Duration,
    pub backward: Duration,
    /// Gradient norm, clipping and the optimizer update.
    pub optimizer: Duration,
}

impl Trainer {
    /// A fresh run on `device` (made an autodiff device here), initialised from `config.seed`.
    pub fn new(
        model_config: ModelConfig,
        config: TrainConfig,
        corpus: Corpus,
        run_dir: &Path,
        device: &Device,
    ) -> Self {
        let device = device.clone().autodiff();
        let model = Gpt::new(&model_config, &mut Rng::new(config.seed), &device);
        let params = params::param_infos(&model);
        // Decoupled decay on 2-D weight matrices; embeddings only when configured.
        let decay: HashSet<_> = params
            .iter()
            .filter(|p| p.shape.len() == 2 && (config.decay_embeddings || !Gpt::is_embedding(&p.path)))
            .map(|p| p.id)
            .collect();
        let adamw = AdamWConfig {
            beta1: config.beta1,
            beta2: config.beta2,
            eps: config.eps,
            weight_decay: config.weight_decay,
        };
        let state = TrainState { step: 0, sampler: Sampler::new(config.seed.wrapping_add(1)), tokens: 0 };
        Self {
            model_config,
            optim: AdamW::new(adamw, decay),
            params,
            corpus,
            run_dir: run_dir.to_path_buf(),
            device,
            model,
            config,
            state,
            phases: StepPhases::default(),
        }
    }

    /// Continues the run whose checkpoint is in `run_dir`.
    pub fn resume(
        model_config: ModelConfig,
        config: TrainConfig,
        corpus: Corpus,
        run_dir: &Path,
        device: &Device,
    ) -> Result<Self, TrainError> {
        let ckpt = checkpoint::load(run_dir)?;
        let mut trainer = Self::new(model_config, config, corpus, run_dir, device);
        trainer.model = params::load_state_dict(trainer.model, &ckpt.model)?;
        trainer.params = params::param_infos(&trainer.model);
        let inner = trainer.device.clone().inner();
        trainer.optim.load_state(&trainer.params, &ckpt.optim, ckpt.state.step, &inner);
        trainer.state = ckpt.state;
        trainer.truncate_metrics()?;
        Ok(trainer)
    }

    fn seq_len(&self) -> usize {
        self.config.seq_len(&self.model_config)
    }

    /// Tokens per optimizer step.
    pub fn tokens_per_step(&self) -> usize {
        self.config.batch_size * self.seq_len() * self.config.grad_accum
    }

    /// One optimizer step over `grad_accum` micro-batches; returns the mean loss and the gradient norm.
    pub fn step(&mut self) -> (f32, f64) {
        let (b, t, accum) = (self.config.batch_size, self.seq_len(), self.config.grad_accum);
        let lr = learning_rate(&self.config, self.model_config.d_model, self.state.step);
        let mut accumulator = GradientsAccumulator::<Gpt>::new();
        let mut loss_sum = 0.0;
        for _ in 0..accum {
            let started = Instant::now();
            let batch = self.state.sampler.batch(&self.corpus.train, b, t, &self.device);
            let loss = lm_loss(self.model.forward(batch.x), batch.y, None) / accum as f64;
            loss_sum += loss.clone().into_scalar::<f32>();
            let forward_done = Instant::now();
            let grads = GradientsParams::from_grads(loss.backward(), &self.model);
            accumulator.accumulate(&self.model, grads);
            self.phases.forward += forward_done - started;
            self.phases.backward += forward_done.elapsed();
        }
        let started = Instant::now();
        let grads = accumulator.grads();
        let norm = global_grad_norm(&self.model, &grads);
        let scale = clip_scale(norm, self.config.grad_clip);
        self.model = self.optim.step(self.model.clone(), &grads, lr, scale);
        self.phases.optimizer += started.elapsed();
        self.state.step += 1;
        self.state.tokens += (b * t * accum) as u64;
        (loss_sum, norm)
    }

    /// Mean loss over `eval_iters` batches of the train and val splits, from a fixed generator so every
    /// evaluation sees the same windows and training's sampler is untouched.
    pub fn evaluate(&self) -> EvalReport {
        let model = self.model.valid();
        let inner = self.device.clone().inner();
        let (b, t) = (self.config.batch_size, self.seq_len());
        let mean_loss = |tokens: &[u32], seed: u64| {
            let mut sampler = Sampler::new(seed);
            let total: f32 = (0..self.config.eval_iters)
                .map(|_| {
                    let batch = sampler.batch(tokens, b, t, &inner);
                    lm_loss(model.forward(batch.x), batch.y, None).into_scalar::<f32>()
                })
                .sum();
            total / self.config.eval_iters as f32
        };
        let seed = self.config.seed.wrapping_add(2);
        EvalReport {
            step: self.state.step,
            train_loss: mean_loss(&self.corpus.train, seed),
            val_loss: mean_loss(&self.corpus.val, seed),
        }
    }

    /// Writes the checkpoint (and `model.safetensors`) for the current step.
    pub fn save_checkpoint(&self) -> Result<(), TrainError> {
        let model = params::state_dict(&self.model);
        Ok(checkpoint::save(&self.run_dir, model, self.optim.state(&self.params), &self.state)?)
    }

    /// Trains to `max_steps`: evaluates every `eval_interval` steps and at the end, checkpoints every
    /// `checkpoint_interval` steps and at the end, appends to `metrics.jsonl`, and draws the loss curve.
    pub fn run(&mut self, observer: &mut dyn Observer) -> Result<Option<EvalReport>, TrainError> {
        let max = self.config.max_steps;
        let mut last_eval = None;
        while self.state.step < max {
            if self.state.step.is_multiple_of(self.config.eval_interval) {
                last_eval = Some(self.eval_and_log(observer)?);
            }
            let started = Instant::now();
            let (loss, grad_norm) = self.step();
            let lr = learning_rate(&self.config, self.model_config.d_model, self.state.step - 1);
            if !loss.is_finite() {
                return Err(TrainError::NonFinite { loss, step: self.state.step, run_dir: self.run_dir.clone() });
            }
            let tokens_per_s = self.tokens_per_step() as f64 / started.elapsed().as_secs_f64();
            let report = StepReport { step: self.state.step, loss, lr, grad_norm, tokens_per_s };
            self.log(&report)?;
            observer.on_step(&report);
            if self.state.step.is_multiple_of(self.config.checkpoint_interval()) || self.state.step == max {
                self.save_checkpoint()?;
                observer.on_checkpoint(self.state.step);
            }
        }
        if last_eval.as_ref().is_none_or(|e| e.step != max) {
            last_eval = Some(self.eval_and_log(observer)?);
        }
        self.draw_loss_curve()?;
        Ok(last_eval)
    }

    fn eval_and_log(&self, observer: &mut dyn Observer) -> Result<EvalReport, TrainError> {
        let report = self.evaluate();
        self.log(&report)?;
        observer.on_eval(&report);
        Ok(report)
    }

    fn metrics_path(&self) -> PathBuf {
        self.run_dir.join(bundle::METRICS)
    }

    fn io(&self, path: PathBuf) -> impl FnOnce(std::io::Error) -> TrainError {
        move |cause| TrainError::Io { path, cause }
    }

    fn log<T: Serialize>(&self, record: &T) -> Result<(), TrainError> {
        let path = self.metrics_path();
        let line = serde_json::to_string(record).expect("metrics serialise");
        let mut file = fs::OpenOptions::new().create(true).append(true).open(&path).map_err(self.io(path.clone()))?;
        writeln!(file, "{line}").map_err(self.io(path))
    }

    /// Drops metrics past the checkpoint a resumed run restarts from.
    fn truncate_metrics(&self) -> Result<(), TrainError> {
        let path = self.metrics_path();
        let Ok(text) = fs::read_to_string(&path) else { return Ok(()) };
        let step = self.state.step;
        let kept: String = text
            .lines()
            .filter(|l| {
                serde_json::from_str::<serde_json::Value>(l)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_some_and(|s| s <= step)
            })
            .map(|l| format!("{l}\n"))
            .collect();
        bundle::write_atomic(&path, kept.as_bytes()).map_err(TrainError::from)
    }

    /// `loss.svg` from `metrics.jsonl`: the per-step training loss and the evaluated train / val losses.
    pub fn draw_loss_curve(&self) -> Result<(), TrainError> {
        let path = self.metrics_path();
        let text = fs::read_to_string(&path).map_err(self.io(path))?;
        let (mut steps, mut evals_train, mut evals_val) = (Vec::new(), Vec::new(), Vec::new());
        for line in text.lines() {
            if let Ok(s) = serde_json::from_str::<StepReport>(line) {
                steps.push((s.step as f64, s.loss as f64));
            } else if let Ok(e) = serde_json::from_str::<EvalReport>(line) {
                evals_train.push((e.step as f64, e.train_loss as f64));
                evals_val.push((e.step as f64, e.val_loss as f64));
            }
        }
        let svg = loss_svg(
            "Ember training loss",
            &[
                Series { name: "train (step)", color: "#9ecae1", points: &steps },
                Series { name: "train (eval)", color: "#08519c", points: &evals_train },
                Series { name: "val (eval)", color: "#e6550d", points: &evals_val },
            ],
        );
        Ok(bundle::write_atomic(&self.run_dir.join(bundle::LOSS_PLOT), svg.as_bytes())?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trainer(batch_size: usize, grad_accum: usize, dir: &Path) -> Trainer {
        let model = ModelConfig::gpt(13, 1, 2, 8, 8);
        let config: TrainConfig = serde_json::from_value(serde_json::json!({
            "batch_size": batch_size, "grad_accum": grad_accum, "max_steps": 1, "lr": 1e-2, "weight_decay": 0.1,
            "grad_clip": 1.0, "eval_interval": 1, "eval_iters": 1, "out_dir": dir
        }))
        .unwrap();
        let tokens: Vec<u32> = (0..500u32).map(|i| (i * 7 + i / 3) % 13).collect();
        let corpus = Corpus { train: tokens.clone(), val: tokens };
        Trainer::new(model, config, corpus, dir, &Device::flex())
    }

    /// Two micro-batches of 2 windows accumulate to the gradient of one batch of the same 4 windows.
    #[test]
    fn gradient_accumulation_equals_the_larger_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (mut whole, mut split) = (trainer(4, 1, dir.path()), trainer(2, 2, dir.path()));
        let (loss_whole, norm_whole) = whole.step();
        let (loss_split, norm_split) = split.step();
        assert!((loss_whole - loss_split).abs() < 1e-5, "{loss_whole} vs {loss_split}");
        assert!((norm_whole - norm_split).abs() < 1e-5, "{norm_whole} vs {norm_split}");
        let (a, b) = (params::state_dict(&whole.model), params::state_dict(&split.model));
        for ((name, x), (_, y)) in a.iter().zip(&b) {
            let (x, y) = (x.try_to_vec::<f32>().unwrap(), y.try_to_vec::<f32>().unwrap());
            let diff = x.iter().zip(&y).map(|(p, q)| (p - q).abs()).fold(0.0, f32::max);
            // The first Adam step is ≈ lr·g/(|g| + ε), which magnifies rounding where |g| is near ε: 1e-5 = lr·1e-3.
            assert!(diff < 1e-5, "{name} differs by {diff}");
        }
    }
}
