//! The translator on the shared training loop, on synthetic parallel text and a tiny model: a run resumed from its
//! checkpoint takes exactly the steps of an uninterrupted one; a failed BLEU evaluation stops training; `average`
//! refuses checkpoints whose tensors are not f32 or do not match.

use std::path::Path;

use burn::tensor::Device;
use ember_core_model::{Rng, bundle};
use ember_test_support::step_losses;
use ember_train::metrics::StepReport;
use ember_train::parallel::token_batches;
use ember_train::trainer::{Observer, Task, TaskError, TrainError};
use ember_train::translation::TranslationReport;
use ember_train::translation::{self, BleuOf, TranslationConfig, TranslationTrainer};

/// Writes `pairs` pairs of made-up sentences: the target spells each source word in another "language", in reverse.
fn write_data(dir: &Path, name: &str, pairs: usize, seed: u64) {
    const WORDS: [(&str, &str); 12] = [
        ("the", "el"),
        ("red", "rojo"),
        ("green", "verde"),
        ("cat", "gato"),
        ("dog", "perro"),
        ("bird", "pajaro"),
        ("sees", "ve"),
        ("eats", "come"),
        ("small", "chico"),
        ("big", "grande"),
        ("house", "casa"),
        ("water", "agua"),
    ];
    let mut state = seed;
    let mut next = |n: u64| {
        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((state >> 33) % n) as usize
    };
    let mut text = String::new();
    for _ in 0..pairs {
        let words: Vec<(&str, &str)> = (0..3 + next(5)).map(|_| WORDS[next(WORDS.len() as u64)]).collect();
        let source: Vec<&str> = words.iter().map(|w| w.0).collect();
        let target: Vec<&str> = words.iter().rev().map(|w| w.1).collect();
        text += &format!("{}\t{}\n", source.join(" "), target.join(" "));
    }
    std::fs::write(dir.join(name), text).unwrap();
}

fn config(data: &Path, out: &Path, max_steps: u64) -> TranslationConfig {
    let train = format!(
        "seed = 5\nmax_tokens = 96\nmax_steps = {max_steps}\nlr = 2.0\nwarmup_steps = 3\ngrad_clip = 1.0\n\
         eval_interval = 4\nbleu_sentences = 4\ncheckpoint_interval = 2\nkeep_checkpoints = 2\n"
    );
    let text = ember_test_support::translation_toml(1, 16, 32, 300, data, out, &train);
    let config: TranslationConfig = toml::from_str(&text).unwrap();
    config.validate().unwrap();
    config
}

/// A stand-in scorer (BLEU needs a decoder, which lives in ember-serve): the number of sentences it was given.
fn scorer() -> Box<BleuOf> {
    Box::new(|_: &_, _: &_, pairs: &[(String, String)]| -> Result<f64, TaskError> { Ok(pairs.len() as f64) })
}

#[derive(Default)]
struct Record {
    steps: Vec<(u64, f32)>,
    evals: Vec<TranslationReport>,
    checkpoints: Vec<u64>,
}

impl Observer<TranslationReport> for Record {
    fn on_step(&mut self, r: &StepReport) {
        self.steps.push((r.step, r.loss));
    }
    fn on_eval(&mut self, r: &TranslationReport) {
        self.evals.push(r.clone());
    }
    fn on_checkpoint(&mut self, step: u64) {
        self.checkpoints.push(step);
    }
}

fn data_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_data(dir.path(), "train.tsv", 26, 1);
    write_data(dir.path(), "valid.tsv", 6, 2);
    dir
}

#[test]
fn a_resumed_run_takes_the_steps_of_an_uninterrupted_one() {
    let data = data_dir();
    let device = Device::flex();

    let straight_dir = data.path().join("straight");
    let mut straight = TranslationTrainer::new(config(data.path(), &straight_dir, 9), &device, scorer()).unwrap();
    let mut uninterrupted = Record::default();
    straight.run(&mut uninterrupted).unwrap();
    let epoch_batches = token_batches(&straight.task.train, 96, &mut Rng::new(0)).len();
    assert!(
        straight.task.epoch() >= 2 && epoch_batches > 3 && epoch_batches < 9,
        "the run crosses an epoch boundary after the resume point ({epoch_batches} batches an epoch)"
    );
    assert_eq!(uninterrupted.checkpoints, [2, 4, 6, 8, 9]);
    assert_eq!(uninterrupted.evals.iter().map(|e| e.step).collect::<Vec<_>>(), [4, 8, 9]);
    assert_eq!(uninterrupted.evals[0].val_bleu, 4.0, "BLEU of bleu_sentences validation pairs");

    let split_dir = data.path().join("split");
    let mut first = TranslationTrainer::new(config(data.path(), &split_dir, 3), &device, scorer()).unwrap();
    let mut interrupted = Record::default();
    first.run(&mut interrupted).unwrap();
    assert_eq!(first.task.state().position, 3, "stopped in the middle of the first epoch");
    drop(first);
    let mut resumed =
        TranslationTrainer::resume(config(data.path(), &split_dir, 9), &split_dir, &device, scorer()).unwrap();
    assert_eq!(resumed.step, 3);
    resumed.run(&mut interrupted).unwrap();

    // Equal up to rounding: the CPU kernels split some products' inner dimension over the cores as they come free,
    // which rounds differently from run to run (by about 1e-6 here, in straight runs too). A resume that loses the
    // Adam moments or the place in the epoch moves the next losses by more than 0.1.
    let steps = |losses: &[(u64, f64)]| losses.iter().map(|l| l.0).collect::<Vec<_>>();
    let (straight_log, split_log) = (step_losses(&straight_dir), step_losses(&split_dir));
    assert_eq!(steps(&straight_log), (1..=9).collect::<Vec<_>>());
    assert_eq!(steps(&split_log), steps(&straight_log), "metrics.jsonl holds each step once");
    for (((step, a), (_, b)), (_, logged)) in straight_log.iter().zip(&split_log).zip(&interrupted.steps) {
        assert!((a - b).abs() <= 1e-5, "step {step}: uninterrupted {a} vs resumed {b}");
        assert_eq!(*b as f32, *logged, "step {step}: metrics.jsonl holds what the observer heard");
    }
    assert_eq!(straight.task.state(), resumed.task.state(), "the same batch position after the last step");

    // The averaging checkpoints are kept as configured, beside the resumable checkpoint.
    let kept: Vec<u64> = translation::checkpoints(&split_dir).unwrap().iter().map(|c| c.0).collect();
    assert_eq!(kept, [8, 9]);
    assert!(split_dir.join(bundle::CHECKPOINT).exists() && split_dir.join(bundle::LOSS_PLOT).exists());
    let averaged = data.path().join("averaged");
    assert_eq!(translation::average(&split_dir, 2, &averaged).unwrap(), [8, 9]);
    translation::load(&averaged, None, &device).unwrap();
}

#[test]
fn a_failed_bleu_evaluation_stops_training() {
    let data = data_dir();
    let out = data.path().join("run");
    let failing: Box<BleuOf> = Box::new(|_: &_, _: &_, _: &[(String, String)]| -> Result<f64, TaskError> {
        Err("decoding failed: token 999 is not in the vocabulary".into())
    });
    let mut run = TranslationTrainer::new(config(data.path(), &out, 9), &Device::flex(), failing).unwrap();
    let err = run.run(&mut ()).unwrap_err();
    assert!(matches!(err, TrainError::Evaluation { step: 4, .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "evaluating at step 4 failed: scoring validation BLEU: decoding failed: token 999 is not in the vocabulary"
    );
}

#[test]
fn resuming_on_other_data_is_refused() {
    let data = data_dir();
    let out = data.path().join("run");
    let mut run = TranslationTrainer::new(config(data.path(), &out, 2), &Device::flex(), scorer()).unwrap();
    run.run(&mut ()).unwrap();
    write_data(data.path(), "train.tsv", 20, 1);
    let err = TranslationTrainer::resume(config(data.path(), &out, 4), &out, &Device::flex(), scorer())
        .err()
        .expect("a resume on other data fails");
    assert!(err.to_string().contains("trained on 26 pairs"), "{err}");
}

/// A safetensors file holding `tensors` of any dtype, written byte by byte (the bundle writer only writes f32).
fn write_safetensors(path: &Path, tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) {
    let (mut header, mut data) = (serde_json::Map::new(), Vec::new());
    for (name, dtype, shape, bytes) in tensors {
        let offsets = [data.len(), data.len() + bytes.len()];
        header.insert(name.to_string(), serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": offsets}));
        data.extend_from_slice(bytes);
    }
    let header = serde_json::to_vec(&header).unwrap();
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.extend(data);
    std::fs::write(path, file).unwrap();
}

fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A run directory with two checkpoints of weights `w` [2] and whatever `second` holds.
fn two_checkpoints(second: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("checkpoints")).unwrap();
    let w = [("w", "F32", vec![2], f32_bytes(&[1.0, 2.0]))];
    write_safetensors(&dir.path().join("checkpoints/step-1.safetensors"), &w);
    write_safetensors(&dir.path().join("checkpoints/step-2.safetensors"), second);
    dir
}

fn average_error(dir: &Path) -> String {
    let err = translation::average(dir, 2, &dir.join("averaged")).expect_err("averaging fails");
    assert!(!dir.join("averaged").exists(), "nothing is written");
    err.to_string()
}

#[test]
fn averaging_refuses_a_tensor_that_is_not_f32() {
    let dir = two_checkpoints(&[
        ("w", "F32", vec![2], f32_bytes(&[3.0, 4.0])),
        ("step", "I32", vec![1], 7i32.to_le_bytes().to_vec()),
    ]);
    let err = average_error(dir.path());
    assert!(err.contains("step-2.safetensors") && err.contains("step") && err.contains("I32"), "{err}");
}

#[test]
fn averaging_refuses_missing_and_reshaped_tensors() {
    let missing = two_checkpoints(&[("v", "F32", vec![2], f32_bytes(&[3.0, 4.0]))]);
    let err = average_error(missing.path());
    assert!(err.contains("step-2.safetensors: cannot average tensor w: missing here"), "{err}");

    let extra = two_checkpoints(&[
        ("w", "F32", vec![2], f32_bytes(&[3.0, 4.0])),
        ("v", "F32", vec![2], f32_bytes(&[3.0, 4.0])),
    ]);
    let err = average_error(extra.path());
    assert!(err.contains("cannot average tensor v: not in"), "{err}");

    let reshaped = two_checkpoints(&[("w", "F32", vec![1, 2], f32_bytes(&[3.0, 4.0]))]);
    let err = average_error(reshaped.path());
    assert!(err.contains("cannot average tensor w: shape [1, 2], but [2] in"), "{err}");
}

/// A checkpoint of a run that diverged would make every averaged weight NaN.
#[test]
fn averaging_refuses_a_non_finite_checkpoint() {
    let dir = two_checkpoints(&[("w", "F32", vec![2], f32_bytes(&[3.0, f32::NAN]))]);
    let err = average_error(dir.path());
    assert!(err.contains("step-2.safetensors: cannot average tensor w: it holds NaN"), "{err}");
}

#[test]
fn averaging_takes_the_mean_of_each_tensor() {
    let dir = two_checkpoints(&[("w", "F32", vec![2], f32_bytes(&[3.0, 5.0]))]);
    std::fs::write(dir.path().join(bundle::CONFIG), "[model]\n").unwrap();
    let tokenizer = ember_core_model::tokenizer::train_char("ab").unwrap();
    ember_core_model::tokenizer::save(&tokenizer, &dir.path().join(bundle::TOKENIZER)).unwrap();
    let out = dir.path().join("averaged");
    assert_eq!(translation::average(dir.path(), 2, &out).unwrap(), [1, 2]);
    let (tensors, _) = bundle::load_tensors(&out.join(bundle::MODEL)).unwrap();
    assert_eq!(tensors["w"].as_slice::<f32>().unwrap(), [2.0, 3.5]);
    assert_eq!(tensors["w"].shape().to_vec(), [2]);
}
