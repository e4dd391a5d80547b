//! Training: corpora and batching, the causal-LM loss, AdamW with parameter groups and global-norm clipping,
//! learning-rate schedules, checkpoints, and the loop that ties them together.

pub mod bleu;
pub mod checkpoint;
pub mod config;
pub mod corpus;
pub mod loss;
pub mod optim;
pub mod parallel;
pub mod plot;
pub mod schedule;
pub mod trainer;
pub mod translation;

pub use config::{DataConfig, TrainConfig};
pub use trainer::{EvalReport, Observer, StepPhases, StepReport, TrainError, Trainer};
