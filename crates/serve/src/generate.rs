//! Autoregressive generation by full recomputation: each new token runs the whole (cropped) context again.

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::tokenizer::{self, TokenizerError};
use ember_core_model::{Gpt, Rng};
use tokenizers::Tokenizer;

use crate::sampling::{SampleConfig, sample};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("prompt: {0}")]
    Prompt(TokenizerError),
    #[error("the prompt encodes to no tokens; give at least one character")]
    EmptyPrompt,
    #[error(transparent)]
    Decode(TokenizerError),
}

/// What one generation produced and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub text: String,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// Until the first new token: the prompt's forward pass and one sample.
    pub prompt_seconds: f64,
    /// Every later token.
    pub decode_seconds: f64,
}

/// Generates `max_new_tokens` after the prompt, calling `on_text` with each newly decoded piece of text.
/// The context is cropped to the model's last `block_size` tokens.
pub fn generate(
    model: &Gpt,
    tokenizer: &Tokenizer,
    settings: &SampleConfig,
    device: &Device,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, GenerateError> {
    let mut ids = tokenizer::encode(tokenizer, &settings.prompt).map_err(GenerateError::Prompt)?;
    if ids.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let prompt_len = ids.len();
    let mut rng = Rng::new(settings.seed);
    let mut text = String::new();
    let started = std::time::Instant::now();
    let mut prompt_seconds = 0.0;
    for step in 0..settings.max_new_tokens {
        let context = &ids[ids.len().saturating_sub(model.block_size())..];
        let t = context.len();
        let x = Tensor::<2, Int>::from_data(
            TensorData::new(context.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, t]),
            device,
        );
        let logits = model
            .forward(x)
            .slice([0..1, t - 1..t])
            .into_data()
            .convert::<f32>()
            .try_to_vec::<f32>()
            .expect("f32 logits");
        ids.push(sample(&logits, settings.temperature, settings.top_k, &mut rng));
        if step == 0 {
            prompt_seconds = started.elapsed().as_secs_f64();
        }
        // Decode everything generated so far and emit only what is new, so multi-token characters stay whole.
        let all = tokenizer::decode(tokenizer, &ids[prompt_len..]).map_err(GenerateError::Decode)?;
        if all.len() > text.len() && all.starts_with(&text) {
            on_text(&all[text.len()..]);
            text = all;
        }
    }
    Ok(Generation {
        text: tokenizer::decode(tokenizer, &ids[prompt_len..]).map_err(GenerateError::Decode)?,
        prompt_tokens: prompt_len,
        new_tokens: ids.len() - prompt_len,
        prompt_seconds,
        decode_seconds: started.elapsed().as_secs_f64() - prompt_seconds,
    })
}
