//! The layers a Transformer block is made of.

pub mod attention;
pub mod mlp;
