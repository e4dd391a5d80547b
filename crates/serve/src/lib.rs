//! Generation from a trained model: sampling, the decoding loop with its KV stores, the continuous-batching
//! scheduler and the OpenAI-compatible HTTP server. What a generation asks for is ember-formats' `request`, which
//! the readers of configs and request bodies produce.

pub mod beam;
pub mod constrain;
pub mod generate;
pub mod http;
pub mod kv;
pub mod metrics;
pub mod openai;
pub mod sampling;
pub mod scheduler;
pub mod server;
pub mod speculate;
pub mod tools;

pub use ember_formats::request::{GenerationRequest, Sampling};
pub use generate::{Decoder, Finish, GenerateError, GenerationStats, Sequence, generate, prompt_ids};
pub use kv::spec::{KvKind, KvSpec};
