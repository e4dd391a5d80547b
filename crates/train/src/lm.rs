//! Language-model training as a [`Task`] of the shared loop: random windows of the token corpus (or random
//! conversations, learning the assistant's tokens), the causal-LM loss, the configured schedule, and evaluation by
//! mean train / val loss over fixed batches.

use std::path::Path;

use burn::module::Module;
use burn::tensor::{Device, Tensor};
use ember_core_model::params::ParamInfo;
use ember_core_model::{Build, CausalLm, ModelConfig, Rng};
use serde::{Deserialize, Serialize};

use crate::chats::Chats;
use crate::collective::{Collective, Shard};
use crate::config::{TaskKind, TrainConfig};
use crate::corpus::{Corpus, Sampler};
use crate::loss::lm_loss;
use crate::metrics::{EvalLosses, Evaluation};
use crate::schedule::learning_rate;
use crate::trainer::{BatchLoss, LoopConfig, Task, TrainError, TrainLoop};

/// What a language model learns from.
pub enum Data {
    /// Token splits: every token is a target.
    Text(Corpus),
    /// Conversations: the assistant's tokens are the targets.
    Chat(Chats),
}

impl From<Corpus> for Data {
    fn from(corpus: Corpus) -> Self {
        Data::Text(corpus)
    }
}

/// Which split a batch comes from.
#[derive(Clone, Copy)]
enum Split {
    Train,
    Val,
}

impl Data {
    /// A batch of `shard`'s rows drawn by `sampler` from `split`, and its mean loss under `model`.
    fn loss(
        &self,
        model: &CausalLm,
        sampler: &mut Sampler,
        split: Split,
        bt: (usize, usize),
        shard: Shard,
        device: &Device,
    ) -> Tensor<1> {
        let (b, t) = bt;
        match self {
            Data::Text(corpus) => {
                let tokens = match split {
                    Split::Train => &corpus.train,
                    Split::Val => &corpus.val,
                };
                let batch = sampler.shard(tokens, b, t, shard, device);
                lm_loss(model.forward(batch.x), batch.y, None)
            }
            Data::Chat(chats) => {
                let examples = match split {
                    Split::Train => &chats.train,
                    Split::Val => &chats.val,
                };
                let (batch, mask) = sampler.chats(examples, b, t, shard, device);
                lm_loss(model.forward(batch.x), batch.y, Some(mask))
            }
        }
    }
}

/// A decoder-only model learning to continue its corpus.
pub struct LanguageModel {
    pub model_config: ModelConfig,
    pub config: TrainConfig,
    pub data: Data,
    pub sampler: Sampler,
    /// This rank's part of each batch.
    shard: Shard,
    /// The autodiff device batches are made on.
    device: Device,
}

/// A language model's data position: the window sampler.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LmState {
    pub sampler: Sampler,
}

impl LanguageModel {
    fn seq_len(&self) -> usize {
        self.config.seq_len(&self.model_config)
    }
}

/// A language model's evaluation: mean losses over the same `eval_iters` batches of each split every time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LmReport {
    pub step: u64,
    pub train_loss: f32,
    pub val_loss: f32,
}

impl Evaluation for LmReport {
    fn losses(&self) -> EvalLosses {
        EvalLosses { step: self.step, train_loss: Some(self.train_loss), val_loss: self.val_loss }
    }
    fn summary(&self) -> String {
        format!("train loss {:.4}, val loss {:.4}", self.train_loss, self.val_loss)
    }
}

impl Task for LanguageModel {
    type Model = CausalLm;
    type State = LmState;
    type Report = LmReport;

    fn before_step(&self, model: &mut CausalLm, step: u64) {
        model.set_feature_draw(model.feature_draw(step));
    }

    fn learning_rate(&self, step: u64) -> f64 {
        learning_rate(&self.config, TaskKind::LanguageModel, self.model_config.d_model, step)
    }

    fn decays(&self, param: &ParamInfo) -> bool {
        self.config.decays(param, CausalLm::is_embedding)
    }

    fn next_loss(&mut self, model: &CausalLm) -> BatchLoss {
        let (b, t) = (self.config.batch_size(), self.seq_len());
        let loss = self.data.loss(model, &mut self.sampler, Split::Train, (b, t), self.shard, &self.device);
        BatchLoss { loss, tokens: b * t }
    }

    fn set_shard(&mut self, shard: Shard) {
        self.shard = shard;
    }

    /// Mean loss over `eval_iters` batches of the train and val splits, from a fixed generator so every evaluation
    /// sees the same windows and training's sampler is untouched. Each rank scores its shard of every batch.
    fn evaluate(&mut self, model: &CausalLm, step: u64, collective: &dyn Collective) -> Result<LmReport, TrainError> {
        let model = model.valid();
        let inner = self.device.clone().inner();
        let (b, t) = (self.config.batch_size(), self.seq_len());
        // Σ over this rank's batches of its mean loss: every shard has b windows, so the ranks' sums add up to
        // ranks × Σ of the batch means.
        let loss_sum = |split: Split, seed: u64| {
            let mut sampler = Sampler::new(seed);
            (0..self.config.eval_iters())
                .map(|_| self.data.loss(&model, &mut sampler, split, (b, t), self.shard, &inner).into_scalar::<f32>())
                .sum::<f32>()
        };
        let seed = self.config.seed.wrapping_add(2);
        let mut sums = [loss_sum(Split::Train, seed), loss_sum(Split::Val, seed)];
        collective.all_reduce_sum(&mut sums);
        let mean = |sum: f32| sum / (self.config.eval_iters() * self.shard.ranks) as f32;
        Ok(LmReport { step, train_loss: mean(sums[0]), val_loss: mean(sums[1]) })
    }

    fn state(&self) -> LmState {
        LmState { sampler: self.sampler.clone() }
    }

    fn restore(&mut self, state: LmState, _run_dir: &Path) -> Result<(), TrainError> {
        self.sampler = state.sampler;
        Ok(())
    }
}

/// Language-model training.
pub type Trainer = TrainLoop<LanguageModel>;

impl TrainLoop<LanguageModel> {
    /// A fresh run on `device` (made an autodiff device here), initialised from `config.seed`.
    pub fn new(
        model_config: ModelConfig,
        config: TrainConfig,
        data: impl Into<Data>,
        run_dir: &Path,
        device: &Device,
    ) -> Self {
        let device = device.clone().autodiff();
        let model = CausalLm::new(&model_config, &mut Rng::new(config.seed), &device);
        let sampler = Sampler::new(config.seed.wrapping_add(1));
        let loop_config = LoopConfig::of(&config, TaskKind::LanguageModel);
        let task = LanguageModel { model_config, config, data: data.into(), sampler, shard: Shard::WHOLE, device };
        TrainLoop::fresh(task, model, loop_config, run_dir)
    }

    /// Continues the run whose checkpoint is in `run_dir`.
    pub fn resume(
        model_config: ModelConfig,
        config: TrainConfig,
        data: impl Into<Data>,
        run_dir: &Path,
        device: &Device,
    ) -> Result<Self, TrainError> {
        let Self { task, model, config: loop_config, .. } = Self::new(model_config, config, data, run_dir, device);
        let inner = task.device.clone().inner();
        TrainLoop::from_checkpoint(task, model, loop_config, run_dir, &inner)
    }

    /// Tokens per optimizer step, all ranks'.
    pub fn tokens_per_step(&self) -> usize {
        self.task.config.batch_size() * self.task.seq_len() * self.task.config.grad_accum * self.shard().ranks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_core_model::params;

    fn trainer(batch_size: usize, grad_accum: usize, dir: &Path) -> Trainer {
        let model = ModelConfig::gpt(13, 1, 2, 8, 8);
        let config: TrainConfig = serde_json::from_value(serde_json::json!({
            "batch_size": batch_size, "grad_accum": grad_accum, "max_steps": 4, "lr": 1e-2, "weight_decay": 0.1,
            "grad_clip": 1.0, "eval_interval": 1, "eval_iters": 1, "out_dir": dir
        }))
        .unwrap();
        let tokens: Vec<u32> = (0..500u32).map(|i| (i * 7 + i / 3) % 13).collect();
        let corpus = Corpus { train: tokens.clone().into(), val: tokens.into() };
        Trainer::new(model, config, corpus, dir, &Device::flex())
    }

    /// Conversations train only the assistant's replies: a tiny model learns them (the held-out loss, on replies
    /// alone, falls well below its start), and a batch's loss is the mean over its reply tokens alone.
    #[test]
    fn a_chat_run_learns_the_assistants_replies() {
        use crate::chats::tests::line;
        use crate::chats::{self, Example};
        use ember_core_model::tokenizer;
        use ember_formats::chat::ChatFormat;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("chats.jsonl");
        let lines: Vec<String> = (0..40).map(|i| line(&format!("say {}", i % 4), &"ab".repeat(1 + i % 4))).collect();
        std::fs::write(&path, lines.join("\n")).unwrap();
        let template = "{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}{% if add_generation_prompt %}a:{% endif %}";
        let tok = tokenizer::train_char("ua:;say 0123ab").unwrap();
        let chat = ChatFormat { template: Some(template.into()), ..ChatFormat::default() };
        let data = chats::read(&path, &tok, &chat, 0.25, 24).unwrap();
        assert_eq!(data.train[0].learned.iter().filter(|&&l| l).count(), "ab;".len());
        let model = ModelConfig { vocab_size: Some(tokenizer::vocab_size(&tok)), ..ModelConfig::gpt(0, 1, 2, 16, 24) };
        let config: TrainConfig = serde_json::from_value(serde_json::json!({
            "batch_size": 8, "max_steps": 60, "lr": 1e-2, "warmup_steps": 0, "decay_steps": 60, "min_lr": 1e-3,
            "weight_decay": 0.0, "grad_clip": 1.0, "eval_interval": 60, "eval_iters": 2, "out_dir": dir.path()
        }))
        .unwrap();
        let mut run = Trainer::new(model, config, Data::Chat(data.clone()), dir.path(), &Device::flex());
        let before = run.task.evaluate(&run.model, 0, &crate::collective::Single).unwrap().val_loss;
        let mut reports = Losses::default();
        run.run(&mut reports).unwrap();
        let after = run.task.evaluate(&run.model, 60, &crate::collective::Single).unwrap().val_loss;
        assert!(after < 0.5 * before, "held-out reply loss {before} → {after}");
        // One conversation whose reply is one token: the batch loss is that token's loss alone.
        let one = Example { ids: data.train[0].ids.clone(), learned: data.train[0].learned.clone() };
        let (batch, mask) = Sampler::new(0).chats(&[one], 1, 23, Shard::WHOLE, &Device::flex());
        assert_eq!(mask.clone().sum().into_scalar::<f32>(), 3.0);
        let masked = lm_loss(run.model.valid().forward(batch.x.clone()), batch.y.clone(), Some(mask));
        assert!(
            masked.into_scalar::<f32>()
                < lm_loss(run.model.valid().forward(batch.x), batch.y, None).into_scalar::<f32>()
        );
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
            let diff = ember_test_support::max_abs_diff(&x, &y);
            // The first Adam step is ≈ lr·g/(|g| + ε), which magnifies rounding where |g| is near ε: 1e-5 = lr·1e-3.
            assert!(diff < 1e-5, "{name} differs by {diff}");
        }
    }

    /// A loss that is not finite stops the run with an error naming the step, and leaves the model untouched.
    #[test]
    fn a_non_finite_loss_is_an_error_and_updates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut run = trainer(2, 1, dir.path());
        run.task.config.lr = f64::NAN;
        run.step();
        run.task.config.lr = 1e-2;
        let before = params::state_dict(&run.model);
        let err = run.run(&mut ()).unwrap_err();
        assert!(matches!(err, TrainError::NonFinite { step: 2, .. }), "{err}");
        assert!(err.to_string().starts_with("the loss became NaN at step 2"), "{err}");
        let after = params::state_dict(&run.model);
        assert_eq!(run.step, 1);
        for ((name, x), (_, y)) in before.iter().zip(&after) {
            assert_eq!(x.as_bytes(), y.as_bytes(), "{name} changed");
        }
    }

    /// A last step whose update overflows the weights (lr 10³⁹, past f32, without clipping) ends the run with an
    /// error naming what diverged, and the checkpoint and model of the step before stay as they were; a checkpoint
    /// holding NaN, or a negative second moment, is refused on resume.
    #[test]
    fn a_diverged_step_never_replaces_the_checkpoint_and_a_diverged_checkpoint_is_not_resumed() {
        use burn::tensor::TensorData;
        use ember_core_model::bundle;
        let dir = tempfile::tempdir().unwrap();
        let mut run = trainer(2, 1, dir.path());
        run.config.max_steps = 1;
        run.run(&mut ()).unwrap();
        let saved = [bundle::CHECKPOINT, bundle::MODEL];
        let files = saved.map(|f| std::fs::read(dir.path().join(f)).unwrap());
        (run.config.max_steps, run.config.grad_clip, run.task.config.lr) = (2, 0.0, 1e39);
        let err = run.run(&mut ()).unwrap_err();
        assert!(matches!(err, TrainError::NonFinite { step: 2, .. }), "{err}");
        assert!(err.to_string().ends_with("is intact"), "{err}");
        for (name, before) in saved.iter().zip(&files) {
            assert!(std::fs::read(dir.path().join(name)).unwrap() == *before, "{name} was replaced");
        }

        let path = dir.path().join(bundle::CHECKPOINT);
        let (tensors, metadata) = bundle::load_tensors(&path).unwrap();
        for (prefix, value, expected) in [("model.", f32::NAN, "holds NaN"), ("optim.v.", -1.0, "negative values")] {
            let mut edited: Vec<(String, TensorData)> = tensors.clone().into_iter().collect();
            let (_, data) = edited.iter_mut().find(|(name, _)| name.starts_with(prefix)).unwrap();
            let mut values = data.try_to_vec::<f32>().unwrap();
            values[0] = value;
            *data = TensorData::new(values, data.shape().to_vec());
            bundle::save_tensors(&path, &edited, metadata.clone()).unwrap();
            let Trainer { task, .. } = trainer(2, 1, dir.path());
            let resumed = Trainer::resume(task.model_config, task.config, task.data, dir.path(), &Device::flex());
            let err = resumed.err().expect("a diverged checkpoint is refused");
            assert!(err.to_string().contains(expected), "{err}");
        }
    }

    /// 4 straight steps and 2 steps, a checkpoint, a resume and 2 more give the same losses, and metrics.jsonl
    /// holds each step once.
    #[test]
    fn resuming_repeats_the_uninterrupted_steps() {
        let (straight_dir, split_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut straight = trainer(2, 2, straight_dir.path());
        let mut losses = Losses::default();
        straight.run(&mut losses).unwrap();

        let mut first = trainer(2, 2, split_dir.path());
        first.config.max_steps = 2;
        let mut resumed_losses = Losses::default();
        first.run(&mut resumed_losses).unwrap();
        let first = trainer(2, 2, split_dir.path());
        let Trainer { task, .. } = first;
        let mut second =
            Trainer::resume(task.model_config, task.config, task.data, split_dir.path(), &Device::flex()).unwrap();
        assert_eq!(second.step, 2);
        second.run(&mut resumed_losses).unwrap();
        assert_eq!(losses.0, resumed_losses.0);
        let logged: Vec<u64> = crate::metrics::read(&split_dir.path().join("metrics.jsonl"))
            .unwrap()
            .into_iter()
            .filter_map(|r| match r {
                crate::metrics::Record::Step(s) => Some(s.step),
                crate::metrics::Record::Eval(_) => None,
            })
            .collect();
        assert_eq!(logged, [1, 2, 3, 4]);
    }

    /// FAVOR+ with `favor_redraw = 3` trains steps 0–2 on the first draw of its features and step 3 on the second;
    /// the run directory loads with the second, the one its weights last trained with.
    #[test]
    fn favor_features_are_redrawn_on_schedule_and_kept_for_inference() {
        use ember_core_model::config::AttentionKernel;
        use ember_core_model::{CausalLm, bundle};
        let dir = tempfile::tempdir().unwrap();
        let mut run = trainer(2, 1, dir.path());
        let favor = ModelConfig {
            attention_kernel: AttentionKernel::Favor,
            favor_features: Some(8),
            favor_redraw: Some(3),
            ..run.task.model_config.clone()
        };
        run.model = CausalLm::new(&favor, &mut ember_core_model::Rng::new(1), &Device::flex().autodiff());
        run.task.model_config = favor.clone();
        run.run(&mut ()).unwrap();
        let table = toml::Table::from_iter([("model".to_string(), toml::Value::try_from(&favor).unwrap())]);
        std::fs::write(dir.path().join(bundle::CONFIG), table.to_string()).unwrap();
        ember_core_model::tokenizer::save(
            &ember_core_model::tokenizer::train_char("abcdefghijklm").unwrap(),
            &dir.path().join(bundle::TOKENIZER),
        )
        .unwrap();
        let loaded = bundle::load(dir.path(), &Device::flex()).unwrap().model;
        let ids = burn::tensor::Tensor::<2, burn::tensor::Int>::from_data([[1, 5, 2, 7, 3]], &Device::flex());
        let logits = |model: &CausalLm| model.forward(ids.clone()).into_data().try_to_vec::<f32>().unwrap();
        let mut trained = run.model.valid();
        let last = logits(&trained);
        assert_eq!(logits(&loaded), last, "inference keeps the last draw");
        // A run stopped before its first model.safetensors loads from the checkpoint, with its step count.
        std::fs::remove_file(dir.path().join(bundle::MODEL)).unwrap();
        let from_checkpoint = bundle::load(dir.path(), &Device::flex()).unwrap().model;
        assert_eq!(logits(&from_checkpoint), last, "the checkpoint's step count gives the same draw");
        trained.set_feature_draw(0);
        assert!(ember_test_support::max_abs_diff(&logits(&trained), &last) > 1e-4, "draw 0 differs from draw 1");
    }

    #[derive(Default)]
    struct Losses(Vec<(u64, f32)>);

    impl crate::trainer::Observer<LmReport> for Losses {
        fn on_step(&mut self, r: &crate::metrics::StepReport) {
            self.0.push((r.step, r.loss));
        }
    }
}
