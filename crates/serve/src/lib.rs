//! Generation from a trained model: sampling settings, token sampling, and the decoding loop.

pub mod generate;
pub mod http;
pub mod kv;
pub mod sampling;
pub mod scheduler;

pub use generate::{Decoder, Finish, GenerateError, Generation, KvKind, KvSpec, Sequence, generate};
pub use sampling::SampleConfig;
