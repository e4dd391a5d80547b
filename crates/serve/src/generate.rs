//! Autoregressive generation. Cached: prefill runs the prompt once and fills a KV store, then each step runs one new
//! token through every layer. Recompute (the reference, and the baseline of `ember bench decode`): each step runs the
//! whole context again.

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::cache::KvCache;
use ember_core_model::tokenizer::{self, TokenizerError};
use ember_core_model::{Gpt, Rng};
use serde::{Deserialize, Serialize};
use tokenizers::Tokenizer;

use crate::kv::{Bits, ContiguousCache, PagePool, PagedCache, QuantizedCache};
use crate::sampling::{SampleConfig, sample};

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("prompt: {0}")]
    Prompt(TokenizerError),
    #[error("the prompt encodes to no tokens; give at least one character")]
    EmptyPrompt,
    #[error("the prompt is {tokens} tokens, longer than the model's context of {context}")]
    PromptTooLong { tokens: usize, context: usize },
    #[error(transparent)]
    Decode(TokenizerError),
}

/// Where keys and values live between steps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvKind {
    /// No cache: every step recomputes the whole context.
    None,
    /// One growing buffer per layer.
    #[default]
    Contiguous,
    /// Fixed pages through a page table.
    Paged,
    /// int8 with a scale per group.
    Int8,
    /// int4 with a scale per group.
    Int4,
}

/// A KV store and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvSpec {
    pub kind: KvKind,
    /// Tokens per page (paged).
    pub page_size: usize,
    /// Values per scale (int8, int4).
    pub group: usize,
}

impl From<KvKind> for KvSpec {
    fn from(kind: KvKind) -> Self {
        Self { kind, page_size: 16, group: 32 }
    }
}

/// Tokens a contiguous store grows by.
const CHUNK: usize = 256;

impl std::str::FromStr for KvKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(KvKind::None),
            "contiguous" => Ok(KvKind::Contiguous),
            "paged" => Ok(KvKind::Paged),
            "int8" => Ok(KvKind::Int8),
            "int4" => Ok(KvKind::Int4),
            other => Err(format!("{other:?} is not a KV store (none, contiguous, paged, int8, int4)")),
        }
    }
}

impl KvSpec {
    pub fn build(self) -> Option<Box<dyn KvCache>> {
        match self.kind {
            KvKind::None => None,
            KvKind::Contiguous => Some(Box::new(ContiguousCache::new(CHUNK))),
            KvKind::Paged => Some(Box::new(PagedCache::new(PagePool::new(self.page_size)))),
            KvKind::Int8 => Some(Box::new(QuantizedCache::new(Bits::Int8, self.group))),
            KvKind::Int4 => Some(Box::new(QuantizedCache::new(Bits::Int4, self.group))),
        }
    }
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

/// The next-token logits of a sequence, computed with a KV store or by recomputation.
pub struct Decoder<'a> {
    model: &'a Gpt,
    cache: Option<Box<dyn KvCache>>,
    device: Device,
}

impl<'a> Decoder<'a> {
    pub fn new(model: &'a Gpt, kv: impl Into<KvSpec>, device: &Device) -> Self {
        Self { model, cache: kv.into().build(), device: device.clone() }
    }

    /// Logits after `ids`, of which the first `seen` were given before. Cached: only the new tokens run, unless the
    /// context is full, when the store is refilled with the last half context (a context shift). Recompute: the last
    /// `block_size` tokens run again.
    pub fn next_logits(&mut self, ids: &[u32], seen: usize) -> Vec<f32> {
        let block = self.model.block_size();
        let logits = match self.cache.as_mut() {
            None => {
                let context = &ids[ids.len().saturating_sub(block)..];
                let t = context.len();
                let logits = self.model.forward(row(context, &self.device));
                let v = logits.dims()[2];
                logits.slice([0..1, t - 1..t, 0..v]).reshape([1, v])
            }
            Some(cache) => {
                let new = if cache.len() + (ids.len() - seen) > block {
                    cache.clear();
                    &ids[ids.len() - (block / 2).max(1)..]
                } else {
                    &ids[seen..]
                };
                self.model.forward_step(row(new, &self.device), cache.as_mut())
            }
        };
        logits.into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 logits")
    }
}

/// Special tokens that end a text: end-of-text / end-of-turn markers of GPT-2, Llama, ChatML and Gemma.
pub fn end_tokens(tokenizer: &Tokenizer) -> Vec<u32> {
    const ENDS: [&str; 6] = ["<|endoftext|>", "</s>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<eos>"];
    tokenizer
        .get_added_tokens_decoder()
        .into_iter()
        .filter(|(_, t)| t.special && ENDS.contains(&t.content.as_str()))
        .map(|(id, _)| id)
        .collect()
}

/// Token ids as a batch of one row [1, T].
fn row(ids: &[u32], device: &Device) -> Tensor<2, Int> {
    let data = TensorData::new(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, ids.len()]);
    Tensor::from_data(data, device)
}

/// Generates `max_new_tokens` after the prompt, calling `on_text` with each newly decoded piece of text.
pub fn generate(
    model: &Gpt,
    tokenizer: &Tokenizer,
    settings: &SampleConfig,
    kv: KvSpec,
    device: &Device,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, GenerateError> {
    let mut ids = tokenizer::encode(tokenizer, &settings.prompt).map_err(GenerateError::Prompt)?;
    if ids.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    let prompt_len = ids.len();
    if prompt_len > model.block_size() {
        return Err(GenerateError::PromptTooLong { tokens: prompt_len, context: model.block_size() });
    }
    let mut decoder = Decoder::new(model, kv, device);
    let mut rng = Rng::new(settings.seed);
    let ends = end_tokens(tokenizer);
    // Text that could still turn into a stop string is held back until it cannot.
    let hold = settings.stop.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0);
    let mut emitted = 0;
    let mut text = String::new();
    let started = std::time::Instant::now();
    let mut prompt_seconds = 0.0;
    let mut seen = 0;
    for step in 0..settings.max_new_tokens {
        let logits = decoder.next_logits(&ids, seen);
        seen = ids.len();
        let next = sample(&logits, settings, &ids, &mut rng);
        if step == 0 {
            prompt_seconds = started.elapsed().as_secs_f64();
        }
        if ends.contains(&next) {
            break;
        }
        ids.push(next);
        // Decode everything generated so far, so multi-token characters stay whole.
        text = tokenizer::decode(tokenizer, &ids[prompt_len..]).map_err(GenerateError::Decode)?;
        let stop_at = settings.stop.iter().filter_map(|s| text.find(s.as_str())).min();
        if let Some(at) = stop_at {
            text.truncate(at);
        }
        let mut ready = if stop_at.is_some() { text.len() } else { text.len().saturating_sub(hold) };
        while !text.is_char_boundary(ready) {
            ready -= 1;
        }
        if ready > emitted {
            on_text(&text[emitted..ready]);
            emitted = ready;
        }
        if stop_at.is_some() {
            break;
        }
    }
    if text.len() > emitted {
        on_text(&text[emitted..]);
    }
    Ok(Generation {
        text,
        prompt_tokens: prompt_len,
        new_tokens: ids.len() - prompt_len,
        prompt_seconds,
        decode_seconds: started.elapsed().as_secs_f64() - prompt_seconds,
    })
}
