//! The training progress bar: step, loss, learning rate, tokens/s and ETA; evaluations and checkpoints as lines.

use ember_train::{EvalReport, Observer, StepReport};
use indicatif::{ProgressBar, ProgressStyle};

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

impl Observer for Progress {
    fn on_step(&mut self, r: &StepReport) {
        self.bar.set_position(r.step);
        self.bar.set_message(format!("loss {:.4} lr {:.2e} {:.0} tok/s", r.loss, r.lr, r.tokens_per_s));
    }

    fn on_eval(&mut self, r: &EvalReport) {
        // suspend, not println: the line must reach a log file too, where the bar itself is hidden.
        self.bar.suspend(|| println!("step {}: train loss {:.4}, val loss {:.4}", r.step, r.train_loss, r.val_loss));
    }
}
