//! Dynamic loss scaling for f16 training (Micikevicius et al., "Mixed Precision Training", 2018; PyTorch's
//! `GradScaler`): the loss is multiplied by S before the backward pass, so that gradients too small for f16
//! (below 6·10⁻⁸) survive it, and the f32 gradients are divided by S before the update. A step whose gradients
//! overflowed (inf or NaN) is skipped and S halved; after `growth_interval` clean steps in a row S doubles.

pub use ember_formats::checkpoint::LossScale;
use serde::{Deserialize, Serialize};

/// The scaling's settings: PyTorch's defaults are S₀ = 2¹⁶ and 2000 steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaling {
    pub init: f64,
    pub growth_interval: u64,
}

impl Default for LossScaling {
    fn default() -> Self {
        Self { init: 65_536.0, growth_interval: 2000 }
    }
}

/// What one step did to the scale.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleChange {
    Kept,
    /// The gradients overflowed: the step was skipped and the scale halved.
    Halved,
    /// `growth_interval` clean steps in a row: the scale doubled.
    Grown,
}

/// The scale a step used and what the step did to it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScaleStep {
    pub loss_scale: f64,
    pub change: ScaleChange,
}

/// The scaler of one run.
#[derive(Clone, Debug, PartialEq)]
pub struct LossScaler {
    pub state: LossScale,
    growth_interval: u64,
}

impl LossScaler {
    pub fn new(settings: LossScaling) -> Self {
        Self { state: LossScale { scale: settings.init, clean_steps: 0 }, growth_interval: settings.growth_interval }
    }

    /// A scaler that continues from `state` (a resumed run).
    pub fn resume(settings: LossScaling, state: LossScale) -> Self {
        Self { state, ..Self::new(settings) }
    }

    pub fn scale(&self) -> f64 {
        self.state.scale
    }

    /// Records a step whose scaled gradients were `finite` (or not): halves S on overflow, doubles it after
    /// `growth_interval` clean steps.
    pub fn update(&mut self, finite: bool) -> ScaleStep {
        let used = self.state.scale;
        let change = if !finite {
            self.state = LossScale { scale: used / 2.0, clean_steps: 0 };
            ScaleChange::Halved
        } else if self.state.clean_steps + 1 >= self.growth_interval {
            self.state = LossScale { scale: used * 2.0, clean_steps: 0 };
            ScaleChange::Grown
        } else {
            self.state.clean_steps += 1;
            ScaleChange::Kept
        };
        ScaleStep { loss_scale: used, change }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overflow_halves_and_a_clean_run_of_growth_interval_steps_doubles() {
        let mut scaler = LossScaler::new(LossScaling { init: 1024.0, growth_interval: 3 });
        assert_eq!(scaler.update(false), ScaleStep { loss_scale: 1024.0, change: ScaleChange::Halved });
        assert_eq!(scaler.update(true).change, ScaleChange::Kept);
        assert_eq!(scaler.update(true).change, ScaleChange::Kept);
        assert_eq!(scaler.update(true), ScaleStep { loss_scale: 512.0, change: ScaleChange::Grown });
        assert_eq!(scaler.scale(), 1024.0);
        // An overflow resets the clean count: two clean steps after it do not grow the scale.
        scaler.update(true);
        scaler.update(false);
        scaler.update(true);
        assert_eq!(scaler.update(true).change, ScaleChange::Kept);
        assert_eq!(scaler.state, LossScale { scale: 512.0, clean_steps: 2 });
        let resumed = LossScaler::resume(LossScaling { init: 1024.0, growth_interval: 3 }, scaler.state);
        assert_eq!(resumed, scaler);
    }
}
