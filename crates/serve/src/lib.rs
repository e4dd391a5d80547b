//! Generation from a trained model: sampling settings, token sampling, and the decoding loop.

pub mod generate;
pub mod sampling;

pub use generate::{GenerateError, Generation, generate};
pub use sampling::SampleConfig;
