//! Generation from a trained model: sampling, the decoding loop with its KV stores, the continuous-batching
//! scheduler and the OpenAI-compatible HTTP server.

pub mod beam;
pub mod generate;
pub mod http;
pub mod kv;
pub mod metrics;
pub mod openai;
pub mod scheduler;
pub mod server;

pub use ember_formats::sampling;
pub use generate::{Decoder, Finish, GenerateError, Generation, KvKind, KvSpec, Sequence, generate, prompt_ids};
pub use sampling::SampleConfig;
