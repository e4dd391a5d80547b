//! Generation from a trained model: sampling settings, token sampling, and the decoding loop.

pub mod generate;
pub mod kv;
pub mod sampling;

pub use generate::{Decoder, GenerateError, Generation, KvKind, KvSpec, generate};
pub use sampling::SampleConfig;
