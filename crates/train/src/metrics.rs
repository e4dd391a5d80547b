//! `metrics.jsonl`, one JSON object a line (a step or an evaluation), and the loss curve `loss.svg` drawn from it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use ember_core_model::bundle::{self, BundleError};
use serde::{Deserialize, Serialize};

use crate::loss_scale::ScaleStep;
use crate::plot::{Series, loss_svg};

/// One optimizer step, as the progress bar and `metrics.jsonl` see it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StepReport {
    pub step: u64,
    /// Mean training loss of the step's batches.
    pub loss: f32,
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Training tokens of this step (all ranks') over its wall time.
    pub tokens_per_s: f64,
    /// f16 training: the loss scale the step used, and whether it overflowed (the step skipped) or grew the scale.
    #[serde(default, flatten, skip_serializing_if = "Option::is_none")]
    pub scale: Option<ScaleStep>,
}

/// An evaluation after some optimizer steps, whatever the task measured (each task has its report type, a line of
/// `metrics.jsonl` with `step` and `val_loss` at least).
pub trait Evaluation {
    /// The step and the losses measured, as the loss curve reads them back.
    fn losses(&self) -> EvalLosses;
    /// What was measured, as a person reads it: "train loss 2.4426, val loss 2.4912".
    fn summary(&self) -> String;
}

/// The losses every evaluation line of `metrics.jsonl` holds (the task's other figures are skipped), which the loss
/// curve is drawn from.
#[derive(Clone, Debug, Deserialize)]
pub struct EvalLosses {
    pub step: u64,
    #[serde(default)]
    pub train_loss: Option<f32>,
    pub val_loss: f32,
}

/// One line of `metrics.jsonl`, as read back.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Record {
    Step(StepReport),
    Eval(EvalLosses),
}

/// Appends records to a run directory's `metrics.jsonl`, a whole line per write.
pub struct MetricsWriter {
    path: PathBuf,
    file: fs::File,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError + '_ {
    move |cause| BundleError::Io { path: path.to_path_buf(), cause }
}

impl MetricsWriter {
    /// An empty `metrics.jsonl` in `run_dir` (replacing any left there).
    pub fn create(run_dir: &Path) -> Result<Self, BundleError> {
        let path = run_dir.join(bundle::METRICS);
        bundle::write_atomic(&path, b"")?;
        Self::open(path)
    }

    /// Continues the `metrics.jsonl` of a run resumed after `step`: the lines of later steps (written after the
    /// checkpoint by the interrupted process) are dropped, so every step appears once.
    pub fn resume(run_dir: &Path, step: u64) -> Result<Self, BundleError> {
        let path = run_dir.join(bundle::METRICS);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(cause) => return Err(BundleError::Io { path, cause }),
        };
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
        bundle::write_atomic(&path, kept.as_bytes())?;
        Self::open(path)
    }

    fn open(path: PathBuf) -> Result<Self, BundleError> {
        let file = fs::OpenOptions::new().append(true).open(&path).map_err(io(&path))?;
        Ok(Self { path, file })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `record` as one line.
    pub fn append<T: Serialize>(&mut self, record: &T) -> Result<(), BundleError> {
        let mut line = serde_json::to_string(record).expect("metrics serialise");
        line.push('\n');
        self.file.write_all(line.as_bytes()).map_err(io(&self.path))
    }
}

/// The step and evaluation records of a `metrics.jsonl` (other lines are skipped).
pub fn read(path: &Path) -> Result<Vec<Record>, BundleError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// `loss.svg` from the run's `metrics.jsonl`: the per-step training loss, and the evaluated train (when the task
/// reports it) and validation losses.
pub fn draw_loss_curve(run_dir: &Path) -> Result<(), BundleError> {
    let (mut steps, mut evals_train, mut evals_val) = (Vec::new(), Vec::new(), Vec::new());
    for record in read(&run_dir.join(bundle::METRICS))? {
        match record {
            Record::Step(s) => steps.push((s.step as f64, s.loss as f64)),
            Record::Eval(e) => {
                if let Some(train) = e.train_loss {
                    evals_train.push((e.step as f64, train as f64));
                }
                evals_val.push((e.step as f64, e.val_loss as f64));
            }
        }
    }
    let mut series = vec![Series { name: "train (step)", color: "#9ecae1", points: &steps }];
    if !evals_train.is_empty() {
        series.push(Series { name: "train (eval)", color: "#08519c", points: &evals_train });
    }
    series.push(Series { name: "val (eval)", color: "#e6550d", points: &evals_val });
    let svg = loss_svg("Ember training loss", &series);
    bundle::write_atomic(&run_dir.join(bundle::LOSS_PLOT), svg.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(step: u64) -> StepReport {
        StepReport { step, loss: 1.0 / step as f32, lr: 1e-3, grad_norm: 0.5, tokens_per_s: 100.0, scale: None }
    }

    #[test]
    fn resuming_drops_the_lines_past_the_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        let mut metrics = MetricsWriter::create(dir.path()).unwrap();
        for s in 1..=5 {
            metrics.append(&step(s)).unwrap();
        }
        metrics.append(&serde_json::json!({"step": 5, "val_loss": 2.0, "val_bleu": 3.5})).unwrap();
        drop(metrics);
        let mut metrics = MetricsWriter::resume(dir.path(), 3).unwrap();
        metrics.append(&step(4)).unwrap();
        let steps: Vec<u64> = read(metrics.path())
            .unwrap()
            .iter()
            .map(|r| match r {
                Record::Step(s) => s.step,
                Record::Eval(e) => e.step,
            })
            .collect();
        assert_eq!(steps, [1, 2, 3, 4]);
        draw_loss_curve(dir.path()).unwrap();
        let svg = fs::read_to_string(dir.path().join(bundle::LOSS_PLOT)).unwrap();
        assert_eq!(svg.matches("<polyline").count(), 2, "no train-eval series without train losses");
    }

    #[test]
    fn evaluations_and_steps_read_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let mut metrics = MetricsWriter::create(dir.path()).unwrap();
        metrics.append(&step(1)).unwrap();
        metrics.append(&serde_json::json!({"step": 1, "train_loss": 1.5, "val_loss": 2.0})).unwrap();
        let text = fs::read_to_string(metrics.path()).unwrap();
        assert_eq!(text.lines().nth(1), Some(r#"{"step":1,"train_loss":1.5,"val_loss":2.0}"#));
        let records = read(metrics.path()).unwrap();
        assert!(matches!(records[0], Record::Step(StepReport { step: 1, .. })));
        assert!(matches!(records[1], Record::Eval(EvalLosses { train_loss: Some(_), .. })));
    }
}
