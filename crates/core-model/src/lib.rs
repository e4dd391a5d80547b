//! Ember's models and what a model file needs to be loaded: config, layers, the GPT decoder, run-directory I/O
//! and tokenizers.

pub mod bundle;
pub mod cache;
pub mod causal_lm;
pub mod convert;
pub mod export;
pub mod import;
pub mod init;
pub mod inspect;
mod linalg;
pub mod nn;
pub mod params;
pub mod seq2seq;
pub mod weights;

pub use ember_formats::{config, files, rng, tokenizer};

pub use causal_lm::CausalLm;
pub use config::{Invalid, ModelConfig};
pub use init::Build;
pub use rng::Rng;
