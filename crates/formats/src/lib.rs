//! The formats Ember reads from bytes it did not write: run-directory configs, GGUF files, safetensors, Hugging Face
//! directories, tokenizers, TSV corpora and OpenAI request bodies. Each reader returns an error for
//! any input and allocates no more than its input justifies; none needs Burn, so `fuzz/` builds this crate alone and
//! [`fuzz`] holds the entry points its targets (and the corpus replay tests) call.

pub mod chat;
pub mod checkpoint;
pub mod config;
pub mod files;
pub mod fuzz;
pub mod generation;
pub mod ggml;
pub mod gguf;
pub mod grammar;
pub mod hf;
pub mod invalid;
pub mod openai;
pub mod packed;
pub mod request;
pub mod rng;
pub mod rope;
pub mod safetensors;
pub mod schema;
pub mod spm;
pub mod tokenizer;
pub mod tools;
pub mod tsv;

pub use config::{Invalid, ModelConfig};
pub use rng::Rng;
