//! The training progress bar of every `ember train` run (language model or translator): step, loss, learning rate,
//! tokens/s and ETA; evaluations as lines.

use ember_train::loss_scale::{ScaleChange, ScaleStep};
use ember_train::{Evaluation, Observer, StepReport};
use indicatif::{ProgressBar, ProgressStyle};

/// "steps 30..40", or where a resumed run is already past train.max_steps, that nothing is left to train.
pub fn step_range(step: u64, max_steps: u64) -> String {
    match step < max_steps {
        true => format!("steps {step}..{max_steps}"),
        false => format!("at step {step} of train.max_steps = {max_steps}: nothing to train (raise train.max_steps)"),
    }
}

/// The bar of a corpus being tokenized, bytes done of its size; hidden below 16 MiB, which takes a second or two.
pub fn tokenizing(corpus: &std::path::Path) -> ProgressBar {
    let size = std::fs::metadata(corpus).map_or(0, |m| m.len());
    if size < 16 << 20 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(size);
    let template = "tokenizing {bar:30} {binary_bytes}/{binary_total_bytes} ETA {eta}";
    bar.set_style(ProgressStyle::with_template(template).expect("a valid progress template"));
    bar
}

pub struct Progress {
    bar: ProgressBar,
}

impl Progress {
    pub fn new(start: u64, max_steps: u64) -> Self {
        let bar = ProgressBar::new(max_steps);
        bar.set_style(
            ProgressStyle::with_template("{bar:30} step {pos}/{len} {msg} ETA {eta}")
                .expect("a valid progress template"),
        );
        bar.set_position(start);
        Self { bar }
    }

    pub fn finish(&self) {
        self.bar.finish();
    }
}

/// "step 200: train loss 2.4426, val loss 2.4912" or, for a translator, "step 6: val loss 5.1234, val BLEU (greedy)
/// 0.42" (its BLEU is scored on greedy translations).
fn eval_line(r: &impl Evaluation) -> String {
    format!("step {}: {}", r.losses().step, r.summary())
}

impl<R: Evaluation> Observer<R> for Progress {
    fn on_step(&mut self, r: &StepReport) {
        self.bar.set_position(r.step);
        self.bar.set_message(format!("loss {:.4} lr {:.2e} {:.0} tok/s", r.loss, r.lr, r.tokens_per_s));
        if let Some(line) = r.scale.and_then(|scale| scale_line(r.step, scale)) {
            self.bar.suspend(|| println!("{line}"));
        }
    }

    fn on_eval(&mut self, r: &R) {
        // suspend, not println: the line must reach a log file too, where the bar itself is hidden.
        self.bar.suspend(|| println!("{}", eval_line(r)));
    }
}

/// The line f16 training prints when a step changed the loss scale.
fn scale_line(step: u64, scale: ScaleStep) -> Option<String> {
    let s = scale.loss_scale;
    match scale.change {
        ScaleChange::Kept => None,
        ScaleChange::Halved => Some(format!(
            "step {step}: gradients overflowed f16 at loss scale {s}; step skipped, scale halved to {}",
            s / 2.0
        )),
        ScaleChange::Grown => Some(format!("step {step}: loss scale grown from {s} to {}", s * 2.0)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ember_train::{LmReport, TranslationReport};

    #[test]
    fn an_evaluation_line_shows_what_the_task_measured() {
        let lm = LmReport { step: 200, train_loss: 2.44258, val_loss: 2.5 };
        assert_eq!(eval_line(&lm), "step 200: train loss 2.4426, val loss 2.5000");
        let mt = TranslationReport { step: 6, val_loss: 5.0, val_bleu: 0.4242 };
        assert_eq!(eval_line(&mt), "step 6: val loss 5.0000, val BLEU (greedy) 0.42");
    }
}
