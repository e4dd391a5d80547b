//! The training loop every task shares: the learning-rate schedule, backward, gradient accumulation, global-norm
//! clipping, AdamW, the non-finite-loss stop, evaluation and checkpoint cadence, the time budget, `metrics.jsonl`,
//! the observer and the loss curve, alone or as one rank of a data-parallel group ([`crate::collective`]), in f32 or
//! in f16 with f32 master weights and dynamic loss scaling ([`crate::loss_scale`]). A
//! [`Task`] (the language model in [`crate::lm`], the translator in [`crate::translation`]) supplies the model, the
//! loss of each next batch, its evaluation and its data position.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use burn::module::Module;
use burn::optim::{GradientsAccumulator, GradientsParams};
use burn::tensor::{Device, Tensor, TensorData};
use ember_core_model::bundle::{self, BundleError};
use ember_core_model::config::Precision;
use ember_core_model::params::{self, Mismatch, ParamInfo};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::checkpoint::{self, CheckpointError, TrainState};
use crate::collective::{Collective, Shard, Single};
use crate::config::{TaskKind, TrainConfig};
use crate::loss_scale::{LossScaler, LossScaling, ScaleChange, ScaleStep};
use crate::metrics::{self, Evaluation, MetricsWriter, StepReport};
use crate::optim::{AdamW, AdamWConfig, clip_scale, global_grad_norm};
use crate::replicas::{self, Global};

/// How a task's own measurement failed (a translator's BLEU: decoding, detokenising).
pub type TaskError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("checkpoint does not fit the configured model: {0}")]
    Mismatch(Mismatch),
    #[error("{path}: {cause}")]
    Io { path: PathBuf, cause: std::io::Error },
    /// The run diverged: nothing of it was saved after the last checkpoint.
    #[error("{what} became {value} at step {step}; the last checkpoint in {run_dir} is intact")]
    NonFinite { what: String, value: f64, step: u64, run_dir: PathBuf },
    #[error("evaluating at step {step} failed: {cause}")]
    Evaluation { step: u64, cause: TaskError },
    #[error("{run_dir}: cannot resume: {reason}")]
    Resume { run_dir: PathBuf, reason: String },
    #[error(
        "the replicas differ at step {step}: rank {rank}'s parameters are not every rank's (fingerprint {fingerprint:016x})"
    )]
    Diverged { step: u64, rank: usize, fingerprint: u64 },
}

/// Not `#[from]`: the message holds the mismatch, which a chained report (`{:#}`) would print a second time as the
/// error's source.
impl From<Mismatch> for TrainError {
    fn from(mismatch: Mismatch) -> Self {
        Self::Mismatch(mismatch)
    }
}

/// What the loop tells its caller, evaluations being reports `R`; the library itself never prints.
pub trait Observer<R> {
    fn on_step(&mut self, _report: &StepReport) {}
    fn on_eval(&mut self, _report: &R) {}
    fn on_checkpoint(&mut self, _step: u64) {}
}

/// An observer that hears nothing.
impl<R> Observer<R> for () {}

/// The loss of one training batch, and the training tokens it covers.
pub struct BatchLoss {
    /// A scalar on the autodiff device, the mean loss per token of the batch.
    pub loss: Tensor<1>,
    pub tokens: usize,
}

/// What a kind of training brings to the loop.
pub trait Task {
    /// The model being trained.
    type Model: Module;
    /// The data position a checkpoint records (sampler or batch-order generator), so that a resumed run draws
    /// exactly the batches an uninterrupted one would. Serialised as a JSON object beside the step count.
    type State: Serialize + DeserializeOwned;
    /// What an evaluation measures, one line of `metrics.jsonl`.
    type Report: Evaluation + Serialize;

    /// Prepares `model` for optimizer step `step` (counted from 0): the language model draws FAVOR+'s random
    /// features afresh on its schedule.
    fn before_step(&self, _model: &mut Self::Model, _step: u64) {}
    /// The learning rate of optimizer step `step` (counted from 0).
    fn learning_rate(&self, step: u64) -> f64;
    /// Whether AdamW applies decoupled weight decay to `param`.
    fn decays(&self, param: &ParamInfo) -> bool;
    /// The loss of this rank's shard of the next training batch.
    fn next_loss(&mut self, model: &Self::Model) -> BatchLoss;
    /// Which part of each batch [`Task::next_loss`] trains on (the whole batch until told otherwise).
    fn set_shard(&mut self, shard: Shard);
    /// Measures `model` after `step` optimizer steps; every rank calls it, and gets the same report (a task may
    /// split the work between the ranks of `collective`).
    fn evaluate(
        &mut self,
        model: &Self::Model,
        step: u64,
        collective: &dyn Collective,
    ) -> Result<Self::Report, TrainError>;
    fn state(&self) -> Self::State;
    /// Puts the data position back where [`Task::state`] found it.
    fn restore(&mut self, state: Self::State, run_dir: &Path) -> Result<(), TrainError>;
    /// Called after the loop wrote `checkpoint.safetensors` and `model.safetensors` holding `weights`.
    fn on_checkpoint(
        &mut self,
        _run_dir: &Path,
        _step: u64,
        _weights: &[(String, TensorData)],
    ) -> Result<(), TrainError> {
        Ok(())
    }
}

/// The loop's settings, the same for every task.
#[derive(Clone, Debug, PartialEq)]
pub struct LoopConfig {
    pub max_steps: u64,
    /// Stop after this many minutes of this process's training (evaluating and checkpointing first).
    pub max_minutes: Option<f64>,
    /// Batches whose gradients are summed (each loss divided by this) into one optimizer step.
    pub grad_accum: usize,
    /// Clip the global gradient norm to this value; 0 turns clipping off.
    pub grad_clip: f64,
    pub eval_interval: u64,
    /// Also evaluate the untrained model (at step 0).
    pub eval_at_start: bool,
    pub checkpoint_interval: u64,
    pub adamw: AdamWConfig,
    /// The loss scale of f16 training.
    pub loss_scaling: LossScaling,
}

impl LoopConfig {
    /// The loop of a `task` run configured by `train` (a language model also evaluates the untrained model).
    pub fn of(train: &TrainConfig, task: TaskKind) -> Self {
        LoopConfig {
            max_steps: train.max_steps,
            max_minutes: train.max_minutes,
            grad_accum: train.grad_accum,
            grad_clip: train.grad_clip,
            eval_interval: train.eval_interval,
            eval_at_start: task == TaskKind::LanguageModel,
            checkpoint_interval: train.checkpoint_interval(),
            adamw: train.adamw(task),
            loss_scaling: LossScaling { init: train.loss_scale, growth_interval: train.loss_scale_growth_interval },
        }
    }
}

/// Time spent in each phase of the training steps (the CPU backends run eagerly, so the clock sees each phase).
#[derive(Clone, Copy, Debug, Default)]
pub struct StepPhases {
    /// Batch, forward pass and loss (read back).
    pub forward: Duration,
    pub backward: Duration,
    /// Gradient norm, clipping and the optimizer update.
    pub optimizer: Duration,
    /// Averaging gradients with the other ranks (zero alone).
    pub all_reduce: Duration,
}

/// A training run of task `T`: its model, the optimizer and the counters.
pub struct TrainLoop<T: Task> {
    pub task: T,
    pub model: T::Model,
    pub config: LoopConfig,
    pub run_dir: PathBuf,
    /// Optimizer steps completed.
    pub step: u64,
    /// Training tokens consumed.
    pub tokens: u64,
    optim: AdamW,
    params: Vec<ParamInfo>,
    /// Where the steps' time went so far.
    pub phases: StepPhases,
    collective: Rc<dyn Collective>,
    /// Ranks the run was trained on so far (a resumed run must keep them).
    trained_ranks: usize,
    /// The float type of the forward and backward passes; the parameters and AdamW's moments stay f32.
    precision: Precision,
    /// f16 training's loss scale.
    scaler: Option<LossScaler>,
}

/// One step's outcome, before it is reported.
struct Stepped {
    loss: f32,
    grad_norm: f64,
    lr: f64,
    tokens: usize,
    /// Some rank asked to stop after this step.
    stop: bool,
    scale: Option<ScaleStep>,
}

impl<T: Task> TrainLoop<T> {
    /// A fresh run of `task` from `model` (built on an autodiff device), writing to `run_dir`.
    pub fn fresh(task: T, model: T::Model, config: LoopConfig, run_dir: &Path) -> Self {
        let params = params::param_infos(&model);
        let decay: HashSet<_> = params.iter().filter(|p| task.decays(p)).map(|p| p.id).collect();
        Self {
            optim: AdamW::new(config.adamw.clone(), decay),
            task,
            model,
            config,
            run_dir: run_dir.to_path_buf(),
            step: 0,
            tokens: 0,
            params,
            phases: StepPhases::default(),
            collective: Rc::new(Single),
            trained_ranks: 1,
            precision: Precision::F32,
            scaler: None,
        }
    }

    /// This loop computing its forward and backward passes in `precision` (f16 on wgpu adapters with `SHADER_F16`):
    /// each step casts the f32 parameters to it inside the autodiff graph, so the gradients arrive in f32, and f16
    /// scales the loss dynamically (continuing a resumed run's scale).
    pub fn with_precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self.scaler = match precision {
            Precision::F32 => None,
            Precision::F16 => Some(self.scaler.take().unwrap_or_else(|| LossScaler::new(self.config.loss_scaling))),
        };
        self
    }

    /// This loop as one rank of `collective`: the task trains on the rank's shard of each batch, gradients are
    /// averaged over the ranks, and only rank 0 writes the run directory.
    pub fn with_collective(mut self, collective: Rc<dyn Collective>) -> Self {
        self.task.set_shard(Shard::from(&*collective));
        self.collective = collective;
        self
    }

    /// The same loop at step 0 with the model's parameters taken from `weights` (by path), the optimizer fresh.
    pub fn with_weights(mut self, weights: &HashMap<String, TensorData>) -> Result<Self, TrainError> {
        self.model = params::load_state_dict(self.model, weights)?;
        self.params = params::param_infos(&self.model);
        Ok(self)
    }

    /// This process's rank and the number of ranks.
    pub fn shard(&self) -> Shard {
        Shard::from(&*self.collective)
    }

    /// Continues the run whose `checkpoint.safetensors` is in `run_dir`: weights, AdamW moments, step count and the
    /// task's data position. `model` is a model of the right shape (its weights are replaced); `device` is the
    /// device (not autodiff) the optimizer state lives on.
    pub fn from_checkpoint(
        task: T,
        model: T::Model,
        config: LoopConfig,
        run_dir: &Path,
        device: &Device,
    ) -> Result<Self, TrainError> {
        let ckpt = checkpoint::load::<T::State>(run_dir)?;
        let mut run = Self::fresh(task, model, config, run_dir);
        run.model = params::load_state_dict(run.model, &ckpt.model)?;
        run.params = params::param_infos(&run.model);
        run.optim
            .load_state(&run.params, &ckpt.optim, ckpt.state.step, device)
            .map_err(|reason| TrainError::Resume { run_dir: run_dir.to_path_buf(), reason })?;
        run.step = ckpt.state.step;
        run.tokens = ckpt.state.tokens;
        run.trained_ranks = ckpt.state.ranks;
        run.scaler = ckpt.state.loss_scale.map(|state| LossScaler::resume(run.config.loss_scaling, state));
        run.task.restore(ckpt.state.task, run_dir)?;
        Ok(run)
    }

    /// One optimizer step over `grad_accum` batches; returns the mean loss and the gradient norm. A non-finite loss
    /// leaves the model, the optimizer and the step count as they were.
    pub fn step(&mut self) -> (f32, f64) {
        let stepped = self.train_step(false);
        (stepped.loss, stepped.grad_norm)
    }

    /// One optimizer step; `wants_stop` is this rank's wish to stop after it, which every rank learns. In f16 a step
    /// whose scaled gradients overflow updates nothing but the loss scale; it still counts as a step.
    fn train_step(&mut self, wants_stop: bool) -> Stepped {
        let accum = self.config.grad_accum;
        self.task.before_step(&mut self.model, self.step);
        let lr = self.task.learning_rate(self.step);
        let loss_scale = self.scaler.as_ref().map_or(1.0, LossScaler::scale);
        let compute = params::in_precision(self.model.clone(), self.precision);
        let mut accumulator = GradientsAccumulator::<T::Model>::new();
        let (mut loss_sum, mut tokens) = (0.0, 0);
        for _ in 0..accum {
            let started = Instant::now();
            let batch = self.task.next_loss(&compute);
            let loss = if accum > 1 { batch.loss / accum as f64 } else { batch.loss };
            loss_sum += loss.clone().into_scalar::<f32>();
            tokens += batch.tokens;
            let forward_done = Instant::now();
            let scaled = if self.scaler.is_some() { loss * loss_scale } else { loss };
            // The gradients of the f32 parameters, through the casts in `compute`.
            let grads = GradientsParams::from_grads(scaled.backward(), &self.model);
            accumulator.accumulate(&self.model, grads);
            self.phases.forward += forward_done - started;
            self.phases.backward += forward_done.elapsed();
        }
        let mut grads = accumulator.grads();
        let mut stop = wants_stop;
        if self.collective.ranks() > 1 {
            let started = Instant::now();
            let global =
                replicas::average_gradients(&self.model, &mut grads, loss_sum, tokens, stop, &*self.collective);
            Global { loss: loss_sum, tokens, stop } = global;
            self.phases.all_reduce += started.elapsed();
        }
        if !loss_sum.is_finite() {
            return Stepped { loss: loss_sum, grad_norm: f64::NAN, lr, tokens, stop, scale: None };
        }
        let started = Instant::now();
        let grad_norm = global_grad_norm(&self.model, &grads) / loss_scale;
        // In f32 a non-finite gradient would make every parameter NaN: the step is not taken (f16 lowers its scale).
        if self.scaler.is_none() && !grad_norm.is_finite() {
            return Stepped { loss: loss_sum, grad_norm, lr, tokens, stop, scale: None };
        }
        let scale = self.scaler.as_mut().map(|scaler| scaler.update(grad_norm.is_finite()));
        if scale.is_none_or(|s| s.change != ScaleChange::Halved) {
            let clip = clip_scale(grad_norm, self.config.grad_clip);
            self.model = self.optim.step(self.model.clone(), &grads, lr, clip / loss_scale);
        }
        self.phases.optimizer += started.elapsed();
        self.step += 1;
        self.tokens += tokens as u64;
        Stepped { loss: loss_sum, grad_norm, lr, tokens, stop, scale }
    }

    /// The task's evaluation of the current model, in the precision it trains in.
    pub fn evaluate(&mut self) -> Result<T::Report, TrainError> {
        let model = params::in_precision(self.model.clone(), self.precision);
        self.task.evaluate(&model, self.step, &*self.collective)
    }

    /// Writes `checkpoint.safetensors` and `model.safetensors` for the current step, then the task's own files
    /// (rank 0 only).
    pub fn save_checkpoint(&mut self) -> Result<(), TrainError> {
        if self.collective.rank() != 0 {
            return Ok(());
        }
        let weights = params::state_dict(&self.model);
        // Weights that overflowed never replace a good checkpoint.
        if let Some((name, value)) = weights.iter().find_map(|(name, data)| Some((name, bundle::non_finite(data)?))) {
            return Err(self.non_finite(format!("parameter {name}"), value.into(), self.step));
        }
        let ranks = self.collective.ranks();
        let loss_scale = self.scaler.as_ref().map(|scaler| scaler.state);
        let state = TrainState { step: self.step, tokens: self.tokens, ranks, loss_scale, task: self.task.state() };
        checkpoint::save(&self.run_dir, &weights, self.optim.state(&self.params), &state)?;
        self.task.on_checkpoint(&self.run_dir, self.step, &weights)
    }

    /// Trains to `max_steps` or until `max_minutes` have passed: evaluates every `eval_interval` steps and at the
    /// end, checkpoints every `checkpoint_interval` steps and at the end, appends every step and evaluation to
    /// `metrics.jsonl` (started afresh at step 0, cut back to the checkpoint's step when resumed) and draws
    /// `loss.svg`. Returns the last evaluation.
    pub fn run(&mut self, observer: &mut dyn Observer<T::Report>) -> Result<T::Report, TrainError> {
        let ranks = self.collective.ranks();
        if self.step > 0 && self.trained_ranks != ranks {
            let reason = format!(
                "its checkpoint was trained on {} rank(s) and this run has {ranks}; resume with the same number \
                 (mpiexec -n {}) so that every step sees the batch it would have",
                self.trained_ranks, self.trained_ranks
            );
            return Err(TrainError::Resume { run_dir: self.run_dir.clone(), reason });
        }
        self.check_replicas()?;
        let writes = self.collective.rank() == 0;
        let mut metrics = match (writes, self.step) {
            (false, _) => None,
            (true, 0) => Some(MetricsWriter::create(&self.run_dir)?),
            (true, step) => Some(MetricsWriter::resume(&self.run_dir, step)?),
        };
        let (started, budget, max) = (Instant::now(), self.config.max_minutes, self.config.max_steps);
        let out_of_time = || budget.is_some_and(|m| started.elapsed().as_secs_f64() >= m * 60.0);
        let mut last_eval = None;
        if self.step == 0 && self.config.eval_at_start {
            last_eval = Some(self.eval_and_log(&mut metrics, observer)?);
        }
        while self.step < max {
            let step_started = Instant::now();
            let Stepped { loss, grad_norm, lr, tokens, stop, scale } = self.train_step(out_of_time());
            if !loss.is_finite() {
                return Err(self.non_finite("the loss", loss.into(), self.step + 1));
            }
            if self.scaler.is_none() && !grad_norm.is_finite() {
                return Err(self.non_finite("the gradient norm", grad_norm, self.step + 1));
            }
            let tokens_per_s = tokens as f64 / step_started.elapsed().as_secs_f64();
            let report = StepReport { step: self.step, loss, lr, grad_norm, tokens_per_s, scale };
            if let Some(metrics) = &mut metrics {
                metrics.append(&report)?;
            }
            observer.on_step(&report);
            let last = self.step == max || stop;
            if self.step.is_multiple_of(self.config.eval_interval) || last {
                last_eval = Some(self.eval_and_log(&mut metrics, observer)?);
            }
            if self.step.is_multiple_of(self.config.checkpoint_interval) || last {
                self.check_replicas()?;
                self.save_checkpoint()?;
                observer.on_checkpoint(self.step);
            }
            if last {
                break;
            }
        }
        let last_eval = match last_eval {
            Some(e) if e.losses().step == self.step => e,
            // Resumed at or past max_steps: nothing to train, but the caller still hears how the model does.
            _ => self.eval_and_log(&mut metrics, observer)?,
        };
        if writes {
            metrics::draw_loss_curve(&self.run_dir)?;
        }
        Ok(last_eval)
    }

    /// Every rank evaluates; rank 0 logs. A non-finite validation loss ends the run before anything is saved.
    fn eval_and_log(
        &mut self,
        metrics: &mut Option<MetricsWriter>,
        observer: &mut dyn Observer<T::Report>,
    ) -> Result<T::Report, TrainError> {
        let report = self.evaluate()?;
        if let Some(metrics) = metrics {
            metrics.append(&report)?;
        }
        observer.on_eval(&report);
        match report.losses().val_loss {
            loss if loss.is_finite() => Ok(report),
            loss => Err(self.non_finite("the validation loss", loss.into(), self.step)),
        }
    }

    /// The error of a run that diverged at `step`: `what` became `value`.
    fn non_finite(&self, what: impl Into<String>, value: f64, step: u64) -> TrainError {
        TrainError::NonFinite { what: what.into(), value, step, run_dir: self.run_dir.clone() }
    }

    /// The fingerprint of this replica's parameters.
    pub fn fingerprint(&self) -> u64 {
        replicas::parameter_fingerprint(&self.model)
    }

    /// Fails unless every rank holds the same parameters (always true alone).
    fn check_replicas(&self) -> Result<(), TrainError> {
        if self.collective.ranks() == 1 {
            return Ok(());
        }
        let fingerprint = self.fingerprint();
        match self.collective.agree(fingerprint) {
            true => Ok(()),
            false => Err(TrainError::Diverged { step: self.step, rank: self.collective.rank(), fingerprint }),
        }
    }
}
