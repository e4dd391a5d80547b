//! `metrics.jsonl`, one JSON object a line (a step or an evaluation), and the loss curve `loss.svg` drawn from it.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use ember_core_model::bundle::{self, BundleError};
use serde::{Deserialize, Serialize};

use crate::plot::{Series, loss_svg};
use crate::trainer::{EvalReport, StepReport};

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Record {
    Step(StepReport),
    Eval(EvalReport),
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
        metrics.append(&EvalReport { step: 5, train_loss: None, val_loss: 2.0, val_bleu: Some(3.5) }).unwrap();
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
        metrics.append(&EvalReport { step: 1, train_loss: Some(1.5), val_loss: 2.0, val_bleu: None }).unwrap();
        let text = fs::read_to_string(metrics.path()).unwrap();
        assert_eq!(text.lines().nth(1), Some(r#"{"step":1,"train_loss":1.5,"val_loss":2.0}"#));
        let records = read(metrics.path()).unwrap();
        assert!(matches!(records[0], Record::Step(StepReport { step: 1, .. })));
        assert!(matches!(records[1], Record::Eval(EvalReport { train_loss: Some(_), val_bleu: None, .. })));
    }
}
