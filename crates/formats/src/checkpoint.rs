//! The training state a checkpoint carries in its safetensors metadata.

use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The metadata key of the training state's JSON.
pub const STATE_KEY: &str = "ember.train_state";

/// The metadata key of the optimizer steps a run directory's `model.safetensors` was trained for (decimal).
pub const STEPS_KEY: &str = "ember.steps";

/// Everything besides tensors that resuming needs: the loop's counters and the task's own state `S` (its fields sit
/// beside `step` and `tokens` in the JSON, so a language model's state reads `{"step", "tokens", "sampler"}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainState<S> {
    /// Optimizer steps completed.
    pub step: u64,
    /// Training tokens consumed so far.
    pub tokens: u64,
    /// Data-parallel ranks that trained the run (1 alone).
    #[serde(default = "one_rank")]
    pub ranks: usize,
    /// f16 training's loss scale (absent in f32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<LossScale>,
    #[serde(flatten)]
    pub task: S,
}

/// A dynamic loss scale and the clean steps it has seen since it last changed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScale {
    pub scale: f64,
    pub clean_steps: u64,
}

fn one_rank() -> usize {
    1
}

/// The training state in a checkpoint's metadata.
pub fn state<S: DeserializeOwned>(metadata: &HashMap<String, String>) -> Result<TrainState<S>, String> {
    let json = metadata.get(STATE_KEY).ok_or_else(|| format!("no {STATE_KEY} entry"))?;
    serde_json::from_str(json).map_err(|e| e.to_string())
}
