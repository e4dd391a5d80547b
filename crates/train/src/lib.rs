//! Training: corpora and batching, the causal-LM loss, AdamW with parameter groups and global-norm clipping,
//! learning-rate schedules, checkpoints, metrics, data parallelism ([`collective`], [`replicas`]), and the one loop
//! ([`trainer`]) that trains both the language model ([`lm`]) and the translator ([`translation`]).

pub mod bleu;
pub mod chats;
pub mod checkpoint;
pub mod collective;
pub mod config;
pub mod corpus;
pub mod lm;
pub mod loss;
pub mod loss_scale;
pub mod metrics;
pub mod optim;
pub mod parallel;
pub mod plot;
pub mod replicas;
pub mod schedule;
pub mod token_cache;
pub mod trainer;
pub mod translation;

pub use config::{DataConfig, TrainConfig};
pub use lm::{LanguageModel, LmReport, Trainer};
pub use metrics::{Evaluation, MetricsWriter, StepReport};
pub use trainer::{BatchLoss, LoopConfig, Observer, StepPhases, Task, TaskError, TrainError, TrainLoop};
pub use translation::{Translation, TranslationReport, TranslationTrainer};
