//! Checkpoints: model weights, AdamW moments, step and the task's data position (sampler or batch-order RNG state)
//! in one safetensors file written atomically, so a process killed mid-write leaves the previous checkpoint loadable.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::tensor::TensorData;
use ember_core_model::bundle::{self, BundleError};
pub use ember_formats::checkpoint::TrainState;
use ember_formats::checkpoint::{self as state, STATE_KEY, STEPS_KEY};
use serde::Serialize;
use serde::de::DeserializeOwned;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{0} has no checkpoint to resume from (expected {1})")]
    Missing(PathBuf, &'static str),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("{path}: checkpoint has no readable training state ({reason})")]
    State { path: PathBuf, reason: String },
    #[error("{path}: tensor {tensor} holds {value}: the checkpoint is of a run that diverged and cannot be resumed")]
    NonFinite { path: PathBuf, tensor: String, value: f32 },
}

/// A loaded checkpoint: model tensors by parameter path, optimizer tensors, and the training state.
pub struct Checkpoint<S> {
    pub model: HashMap<String, TensorData>,
    pub optim: HashMap<String, TensorData>,
    pub state: TrainState<S>,
}

/// Writes `checkpoint.safetensors` (model under "model.", optimizer under "optim."), then the weights alone as
/// `model.safetensors`, each atomically: a run killed at any moment has both files loadable, and one killed between
/// the two writes of its first checkpoint can still be resumed.
pub fn save<S: Serialize>(
    run_dir: &Path,
    model: &[(String, TensorData)],
    optim: Vec<(String, TensorData)>,
    state: &TrainState<S>,
) -> Result<(), BundleError> {
    let state_json = serde_json::to_string(state).expect("training state serialises");
    let mut all: Vec<(String, TensorData)> = model.iter().map(|(k, v)| (format!("model.{k}"), v.clone())).collect();
    all.extend(optim.into_iter().map(|(k, v)| (format!("optim.{k}"), v)));
    bundle::save_tensors(
        &run_dir.join(bundle::CHECKPOINT),
        &all,
        HashMap::from([(STATE_KEY.to_string(), state_json)]),
    )?;
    bundle::save_tensors(
        &run_dir.join(bundle::MODEL),
        model,
        HashMap::from([(STEPS_KEY.to_string(), state.step.to_string())]),
    )
}

pub fn load<S: DeserializeOwned>(run_dir: &Path) -> Result<Checkpoint<S>, CheckpointError> {
    let path = run_dir.join(bundle::CHECKPOINT);
    if !path.exists() {
        return Err(CheckpointError::Missing(run_dir.to_path_buf(), bundle::CHECKPOINT));
    }
    let (tensors, metadata) = bundle::load_tensors(&path)?;
    let bad = |reason: String| CheckpointError::State { path: path.clone(), reason };
    let state: TrainState<S> = state::state(&metadata).map_err(bad)?;
    let (mut model, mut optim) = (HashMap::new(), HashMap::new());
    for (name, data) in tensors {
        if let Some(value) = bundle::non_finite(&data) {
            return Err(CheckpointError::NonFinite { path, tensor: name, value });
        }
        if let Some(rest) = name.strip_prefix("model.") {
            model.insert(rest.to_string(), data);
        } else if let Some(rest) = name.strip_prefix("optim.") {
            optim.insert(rest.to_string(), data);
        }
    }
    Ok(Checkpoint { model, optim, state })
}
