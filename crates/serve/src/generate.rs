//! Autoregressive generation. Cached: prefill runs the prompt once and fills a KV store, then each step runs one new
//! token through every layer. Recompute (the reference, and the baseline of `ember bench decode`): each step runs the
//! whole context again.

use burn::tensor::{Device, Int, Tensor, TensorData};
use ember_core_model::cache::KvCache;
use ember_core_model::tokenizer::{self, TokenizerError};
use ember_core_model::{CausalLm, Rng};
use tokenizers::Tokenizer;

use crate::constrain::{Constraint, allowed};
use crate::kv::spec::KvSpec;
use crate::sampling::{History, TokenLogprob, logprobs, probability, sample, sample_among};
use crate::speculate;
use ember_formats::request::GenerationRequest;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("prompt: {0}")]
    Prompt(TokenizerError),
    #[error("the prompt encodes to no tokens; give at least one character")]
    EmptyPrompt,
    #[error("the prompt is {tokens} tokens, longer than the model's context of {context}")]
    PromptTooLong { tokens: usize, context: usize },
    #[error(
        "the prompt encodes to token id {id}, past the model's vocabulary of {vocab}: the tokenizer does not belong \
         to this model"
    )]
    TokenPastVocabulary { id: u32, vocab: usize },
    #[error(transparent)]
    Decode(TokenizerError),
}

/// What one generation produced and how long it took.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationStats {
    pub text: String,
    pub prompt_tokens: usize,
    pub new_tokens: usize,
    /// Until the first new token: the prompt's forward pass and one sample.
    pub prompt_seconds: f64,
    /// Every later token.
    pub decode_seconds: f64,
    /// The KV store's bytes at the end.
    pub kv_bytes: usize,
    /// Speculative decoding: tokens drafted, and those the model kept.
    pub drafted: usize,
    pub accepted: usize,
}

/// The next-token logits of a sequence, computed with a KV store or by recomputation.
pub struct Decoder<'a> {
    model: &'a CausalLm,
    cache: Option<Box<dyn KvCache>>,
    device: Device,
}

impl<'a> Decoder<'a> {
    pub fn new(model: &'a CausalLm, kv: impl Into<KvSpec>, device: &Device) -> Self {
        Self::with_store(model, kv.into().build(), device)
    }

    /// A decoder over `cache` (None: recompute), which may already hold the first tokens of the sequence.
    pub fn with_store(model: &'a CausalLm, cache: Option<Box<dyn KvCache>>, device: &Device) -> Self {
        Self { model, cache, device: device.clone() }
    }

    /// Tokens the store holds.
    fn cached(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.len())
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

    /// Logits [T × V] after each of `ids`, the whole prompt run into an empty store (or recomputed).
    fn prompt_logits(&mut self, ids: &[u32]) -> Vec<f32> {
        let logits = match self.cache.as_mut() {
            None => self.model.forward(row(ids, &self.device)),
            Some(cache) => {
                cache.clear();
                self.model.forward_step_all(row(ids, &self.device), cache.as_mut())
            }
        };
        logits.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits")
    }

    /// Logits after each of `ids[seen..]` and then each of `drafts`, run through the store in one forward pass, and
    /// the store's length before; None without a store or when they would not fit the context.
    fn verify(&mut self, ids: &[u32], seen: usize, drafts: &[u32]) -> Option<(usize, Vec<Vec<f32>>)> {
        let block = self.model.block_size();
        let cache = self.cache.as_mut().filter(|c| c.len() + ids.len() - seen + drafts.len() <= block)?;
        let before = cache.len();
        // A store that rolls back keeps its own length; one that cannot says so.
        if !cache.truncate(before) {
            return None;
        }
        let input: Vec<u32> = ids[seen..].iter().chain(drafts).copied().collect();
        let logits = self.model.forward_step_all(row(&input, &self.device), cache.as_mut());
        let v = logits.dims()[2];
        let flat = logits.into_data().convert::<f32>().try_into_vec::<f32>().expect("f32 logits");
        Some((before, flat.chunks_exact(v).map(<[f32]>::to_vec).collect()))
    }

    /// Rolls the store back to its first `len` tokens; false when it cannot.
    fn truncate(&mut self, len: usize) -> bool {
        self.cache.as_mut().is_some_and(|c| c.truncate(len))
    }

    /// The store, when the next step is exactly one new token that fits the context (so it can join a batch).
    fn batchable(&mut self, ids: &[u32], seen: usize) -> Option<&mut dyn KvCache> {
        let block = self.model.block_size();
        match self.cache.as_mut() {
            Some(cache) if seen > 0 && ids.len() == seen + 1 && cache.len() < block => Some(cache.as_mut()),
            _ => None,
        }
    }

    /// Bytes of the KV store (0 when recomputing).
    pub fn kv_bytes(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.bytes())
    }
}

/// Token ids as a batch of one row [1, T].
fn row(ids: &[u32], device: &Device) -> Tensor<2, Int> {
    let data = TensorData::new(ids.iter().map(|&i| i as i64).collect::<Vec<_>>(), [1, ids.len()]);
    Tensor::from_data(data, device)
}

/// Why a sequence ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// `max_new_tokens` were generated.
    Length,
    /// An end-of-text token, or a stop string.
    Stop,
}

/// One generation in progress: its tokens, decoder and KV store, sampler state, and the text emitted so far.
pub struct Sequence<'a> {
    decoder: Decoder<'a>,
    tokenizer: &'a Tokenizer,
    request: GenerationRequest,
    ids: Vec<u32>,
    prompt_len: usize,
    seen: usize,
    reused: usize,
    rng: Rng,
    /// What the sampling penalties look at.
    history: History,
    ends: Vec<u32>,
    /// Bytes held back because they could still become a stop string.
    hold: usize,
    emitted: usize,
    text: String,
    /// Incremental detokenizing: `text` holds the decode of `ids[prompt_len..read]`; the tokens from `prefix` to
    /// `read` are decoded again with each new one, so a token's leading space comes out as in a decode of the whole.
    prefix: usize,
    read: usize,
    finished: Option<Finish>,
    /// With Some(k), each token's log-probability and k alternatives are kept for [`Self::take_logprob`].
    top_logprobs: Option<usize>,
    logprob: Option<TokenLogprob>,
    /// The next-token logits, when scoring the prompt has computed them.
    pending: Option<Vec<f32>>,
    /// The grammar the text must follow, if any.
    constraint: Option<Constraint>,
}

impl<'a> Sequence<'a> {
    /// Encodes and checks the prompt: not empty, not longer than the context.
    pub fn new(
        model: &'a CausalLm,
        tokenizer: &'a Tokenizer,
        request: &GenerationRequest,
        kv: KvSpec,
        device: &Device,
    ) -> Result<Self, GenerateError> {
        Self::with_store(model, tokenizer, request, device, |_| kv.build())
    }

    /// [`Self::new`] with the KV store `store` makes for the prompt's ids; the tokens it already holds (a cached
    /// prefix) are not computed again.
    pub fn with_store(
        model: &'a CausalLm,
        tokenizer: &'a Tokenizer,
        request: &GenerationRequest,
        device: &Device,
        store: impl FnOnce(&[u32]) -> Option<Box<dyn KvCache>>,
    ) -> Result<Self, GenerateError> {
        let ids = tokenizer::encode(tokenizer, &request.prompt).map_err(GenerateError::Prompt)?;
        Self::with_ids(model, tokenizer, request, ids, device, store)
    }

    /// [`Self::with_store`] for a prompt given as token ids (the request's text is not read).
    pub fn with_ids(
        model: &'a CausalLm,
        tokenizer: &'a Tokenizer,
        request: &GenerationRequest,
        ids: Vec<u32>,
        device: &Device,
        store: impl FnOnce(&[u32]) -> Option<Box<dyn KvCache>>,
    ) -> Result<Self, GenerateError> {
        check_prompt(&ids, model.block_size(), model.config().vocab())?;
        let decoder = Decoder::with_store(model, store(&ids), device);
        let reused = decoder.cached();
        Ok(Self {
            seen: reused,
            reused,
            decoder,
            tokenizer,
            request: request.clone(),
            prompt_len: ids.len(),
            prefix: ids.len(),
            read: ids.len(),
            history: History::new(&ids, ids.len()),
            ids,
            rng: Rng::new(request.seed),
            ends: tokenizer::end_tokens(tokenizer),
            hold: request.stop.iter().map(|s| s.len().saturating_sub(1)).max().unwrap_or(0),
            emitted: 0,
            text: String::new(),
            finished: if request.max_new_tokens == 0 { Some(Finish::Length) } else { None },
            top_logprobs: None,
            logprob: None,
            pending: None,
            constraint: None,
        })
    }

    /// Draws only tokens `constraint` allows, and ends when its text is complete.
    pub fn with_constraint(self, constraint: Option<Constraint>) -> Self {
        Self { constraint, ..self }
    }

    /// Runs the whole prompt (recomputing any cached prefix) and returns the log-probability of each prompt token
    /// after the first given those before it, with `top` alternatives; the first step then samples from the last
    /// row without running the model again.
    pub fn score_prompt(&mut self, top: usize) -> Vec<TokenLogprob> {
        let logits = self.decoder.prompt_logits(&self.ids[..self.prompt_len]);
        let v = logits.len() / self.prompt_len;
        let rows: Vec<&[f32]> = logits.chunks_exact(v).collect();
        let scored = (1..self.prompt_len).map(|t| logprobs(rows[t - 1], self.ids[t], top)).collect();
        (self.seen, self.reused) = (self.prompt_len, 0);
        self.pending = Some(rows[self.prompt_len - 1].to_vec());
        scored
    }

    /// The prompt's first token id.
    pub fn first_token(&self) -> u32 {
        self.ids[0]
    }

    /// Keeps each generated token's log-probability and `top` alternatives (None: keeps nothing).
    pub fn with_logprobs(self, top: Option<usize>) -> Self {
        Self { top_logprobs: top, ..self }
    }

    /// The logprobs of the token the last step generated (None for an end-of-text token, or without
    /// [`Self::with_logprobs`]).
    pub fn take_logprob(&mut self) -> Option<TokenLogprob> {
        self.logprob.take()
    }

    pub fn prompt_tokens(&self) -> usize {
        self.prompt_len
    }
    pub fn new_tokens(&self) -> usize {
        self.ids.len() - self.prompt_len
    }
    pub fn finished(&self) -> Option<Finish> {
        self.finished
    }
    pub fn kv_bytes(&self) -> usize {
        self.decoder.kv_bytes()
    }
    /// Prompt tokens whose keys and values came from the store (a cached prefix) rather than being computed.
    pub fn reused_tokens(&self) -> usize {
        self.reused
    }
    /// The text generated so far (up to a stop string).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Generates one token; returns the text that became final with it (empty while it is held back).
    pub fn step(&mut self) -> Result<String, GenerateError> {
        if self.finished.is_some() {
            return Ok(String::new());
        }
        let logits = match self.pending.take() {
            Some(logits) => logits,
            None => self.decoder.next_logits(&self.ids, self.seen),
        };
        self.step_with(logits)
    }

    /// Speculative decoding: the next token and the `drafts` after it checked in one forward pass, the store rolled
    /// back past the drafts not kept. Greedy keeps each draft the model would itself choose, then its own next token,
    /// so the text is plain greedy decoding's. Sampling keeps draft d with probability p(d) under the sampler's
    /// distribution p and otherwise draws from p without d (the drafts are deterministic, so this is speculative
    /// sampling's min(1, p/q) rule, and every token is distributed as plain sampling draws it); after all drafts are
    /// kept, one more token is drawn from p. Falls back to [`Self::step`] when it does not apply (a constraint, no
    /// drafts, a store that cannot roll back, the context full). Returns the text made final and the drafts kept.
    pub fn step_drafted(&mut self, drafts: &[u32]) -> Result<(String, usize), GenerateError> {
        let applies = self.constraint.is_none() && self.pending.is_none() && self.ids.len() == self.seen + 1;
        let verified = if applies && !drafts.is_empty() && self.finished.is_none() {
            self.decoder.verify(&self.ids, self.seen, drafts)
        } else {
            None
        };
        let Some((before, rows)) = verified else { return self.step().map(|text| (text, 0)) };
        let (mut text, mut used) = (String::new(), 0);
        for (i, row) in rows.into_iter().enumerate() {
            let settings = &self.request.sampling;
            let next = match drafts.get(i) {
                Some(&d) if settings.temperature > 0.0 => {
                    let p = probability(&row, settings, &self.history, d);
                    if self.rng.uniform() < p {
                        Some(d)
                    } else {
                        sample_among(&row, settings, &self.history, &mut self.rng, |t| t != d)
                    }
                }
                _ => self.draw(&row),
            };
            text.push_str(&self.take(next, &row)?);
            used += 1;
            let kept = drafts.get(i).is_some_and(|&d| self.ids.last() == Some(&d));
            if self.finished.is_some() || !kept {
                break;
            }
        }
        // The store keeps the inputs whose logits were used (verify ran only over a store that rolls back); the
        // last token chosen is not in it yet.
        self.decoder.truncate(before + used);
        Ok((text, used - 1))
    }

    /// The tokens so far, prompt included.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// For batched decoding: the token to run next and the store it goes into, when this sequence is past its
    /// prompt and its next step is one token.
    pub fn batchable(&mut self) -> Option<(u32, &mut dyn KvCache)> {
        if self.finished.is_some() {
            return None;
        }
        let last = *self.ids.last()?;
        self.decoder.batchable(&self.ids, self.seen).map(|cache| (last, cache))
    }

    /// Completes a step whose logits were computed elsewhere (a batched forward pass over [`Self::batchable`]).
    pub fn step_with(&mut self, logits: Vec<f32>) -> Result<String, GenerateError> {
        let next = self.draw(&logits);
        self.take(next, &logits)
    }

    /// Completes a step with the token `next` chosen from `logits` (None: the grammar allows nothing more).
    fn take(&mut self, next: Option<u32>, logits: &[f32]) -> Result<String, GenerateError> {
        self.seen = self.ids.len();
        let Some(next) = next else {
            // The grammar allows nothing more (a text it cannot end within the vocabulary).
            self.finished = Some(Finish::Stop);
            self.detokenize(true)?;
            return Ok(self.text.get(self.emitted..).unwrap_or_default().to_string());
        };
        if let Some(constraint) = &mut self.constraint {
            constraint.advance(next);
        }
        let complete = self.constraint.as_ref().is_some_and(Constraint::is_final);
        if self.ends.contains(&next) {
            self.finished = Some(Finish::Stop);
            self.detokenize(true)?;
        } else {
            self.logprob = self.top_logprobs.map(|top| logprobs(logits, next, top));
            self.ids.push(next);
            self.history.push(next, true);
            let checked = self.text.len();
            let last = complete || self.new_tokens() >= self.request.max_new_tokens;
            self.detokenize(last)?;
            // A stop string not in the text before must end in what was just added.
            let mut from = checked.saturating_sub(self.hold);
            while !self.text.is_char_boundary(from) {
                from -= 1;
            }
            if let Some(at) = self.request.stop.iter().filter_map(|s| self.text[from..].find(s.as_str())).min() {
                self.text.truncate(from + at);
                self.finished = Some(Finish::Stop);
            } else if complete {
                self.finished = Some(Finish::Stop);
            } else if last {
                self.finished = Some(Finish::Length);
            }
        }
        let mut ready =
            if self.finished.is_some() { self.text.len() } else { self.text.len().saturating_sub(self.hold) };
        while !self.text.is_char_boundary(ready) {
            ready -= 1;
        }
        let piece = self.text.get(self.emitted..ready).unwrap_or_default().to_string();
        self.emitted = self.emitted.max(ready);
        Ok(piece)
    }
}

impl Sequence<'_> {
    /// The next token as the sampling settings draw it from `logits`, among the tokens the constraint allows (None
    /// when it allows none): a draw from the sampler's distribution q, kept when allowed, else a draw from q
    /// conditioned on the allowed set A. That is exactly q restricted to A — P(y) = q(y) + (1 − q(A)) · q(y) / q(A)
    /// = q(y) / q(A) — and the mask is computed only when the first draw is refused. When top-k / top-p leave no
    /// allowed token (q(A) = 0), the draw is from the allowed tokens with top-k / top-p applied after the mask.
    fn draw(&mut self, logits: &[f32]) -> Option<u32> {
        let (settings, history) = (&self.request.sampling, &self.history);
        let first = sample(logits, settings, history, &mut self.rng);
        let Some(constraint) = &self.constraint else { return Some(first) };
        if constraint.allows(first) {
            return Some(first);
        }
        let mask = constraint.mask();
        let among = |id: u32| allowed(&mask, id as usize);
        if let Some(next) = sample_among(logits, settings, history, &mut self.rng, among) {
            return Some(next);
        }
        let masked: Vec<f32> =
            (logits.iter().enumerate()).map(|(id, &z)| if among(id as u32) { z } else { f32::NEG_INFINITY }).collect();
        sample_among(&masked, settings, history, &mut self.rng, among)
    }

    /// Appends the text the tokens after `read` complete, decoding only the window from `prefix`: the decode of
    /// `ids[prefix..]` less that of `ids[prefix..read]`, so each step costs the window, not the whole output. Text
    /// ending in a character still incomplete (decoded as U+FFFD) waits for the tokens that finish it, unless `last`
    /// (byte-level tokens may each end inside a character, as in a run of CJK text; stray bytes followed by any
    /// whole character end the wait).
    fn detokenize(&mut self, last: bool) -> Result<(), GenerateError> {
        let decode = |ids: &[u32]| tokenizer::decode(self.tokenizer, ids).map_err(GenerateError::Decode);
        let (before, all) = (decode(&self.ids[self.prefix..self.read])?, decode(&self.ids[self.prefix..])?);
        let Some(new) = all.get(before.len()..).filter(|new| last || !new.ends_with('\u{FFFD}')) else {
            return Ok(());
        };
        self.text.push_str(new);
        (self.prefix, self.read) = (self.read, self.ids.len());
        Ok(())
    }
}

/// The prompt's token ids, checked: encodable, not empty, not longer than a context of `context` tokens.
pub fn prompt_ids(
    tokenizer: &Tokenizer,
    prompt: &str,
    context: usize,
    vocab: usize,
) -> Result<Vec<u32>, GenerateError> {
    let ids = tokenizer::encode(tokenizer, prompt).map_err(GenerateError::Prompt)?;
    check_prompt(&ids, context, vocab)?;
    Ok(ids)
}

/// A prompt's ids are not empty, fit a context of `context` tokens and lie inside a vocabulary of `vocab`.
fn check_prompt(ids: &[u32], context: usize, vocab: usize) -> Result<(), GenerateError> {
    if ids.is_empty() {
        return Err(GenerateError::EmptyPrompt);
    }
    if ids.len() > context {
        return Err(GenerateError::PromptTooLong { tokens: ids.len(), context });
    }
    if let Some(&id) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(GenerateError::TokenPastVocabulary { id, vocab });
    }
    Ok(())
}

/// Generates up to `max_new_tokens` after the prompt, calling `on_text` with each newly final piece of text. With
/// `lookup` drafts of up to that many tokens (prompt lookup: what followed the latest earlier occurrence of the last
/// tokens) are checked in one forward pass per step, which leaves greedy text unchanged and sampling's distribution
/// too.
pub fn generate(
    model: &CausalLm,
    tokenizer: &Tokenizer,
    request: &GenerationRequest,
    kv: KvSpec,
    device: &Device,
    lookup: usize,
    mut on_text: impl FnMut(&str),
) -> Result<GenerationStats, GenerateError> {
    let mut sequence = Sequence::new(model, tokenizer, request, kv, device)?;
    let started = std::time::Instant::now();
    let mut prompt_seconds = None;
    let (mut drafted, mut accepted) = (0, 0);
    while sequence.finished().is_none() {
        let drafts = if prompt_seconds.is_some() { speculate::lookup(sequence.ids(), lookup) } else { Vec::new() };
        let (piece, kept) = sequence.step_drafted(&drafts)?;
        (drafted, accepted) = (drafted + drafts.len(), accepted + kept);
        prompt_seconds.get_or_insert_with(|| started.elapsed().as_secs_f64());
        if !piece.is_empty() {
            on_text(&piece);
        }
    }
    let prompt_seconds = prompt_seconds.unwrap_or(0.0);
    Ok(GenerationStats {
        text: sequence.text().to_string(),
        prompt_tokens: sequence.prompt_tokens(),
        new_tokens: sequence.new_tokens(),
        prompt_seconds,
        decode_seconds: started.elapsed().as_secs_f64() - prompt_seconds,
        kv_bytes: sequence.kv_bytes(),
        drafted,
        accepted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::spec::KvKind;
    use ember_core_model::{Build, ModelConfig};

    /// Text streamed from the incremental decode is exactly the decode of every generated token at once, through
    /// characters split over byte tokens (an emoji, a musical symbol, CJK) and across held-back stop-string bytes; a
    /// stop string ends the text where it first appears. Each step is handed logits that pick the next token of a
    /// known text.
    #[test]
    fn the_streamed_text_is_the_decode_of_the_whole_output() {
        let corpus = "Grüße aus Köln, 東京タワー — naïve café ☕ and plain words too.\n".repeat(20);
        let tokenizer = tokenizer::train_bpe(&corpus, 300).unwrap();
        let text = "Köln 東京 🚀 café — ünïcödé ☕☕ plain words, split over byte tokens: 𝄞 and 東京タワー.";
        let ids = tokenizer::encode(&tokenizer, text).unwrap();
        let piece = |id: u32| tokenizer::decode(&tokenizer, &[id]).unwrap();
        assert!(ids.iter().any(|&id| piece(id).contains('\u{FFFD}')), "some character spans several tokens");
        let (device, vocab) = (Device::flex(), tokenizer::vocab_size(&tokenizer));
        let model = CausalLm::new(&ModelConfig::gpt(vocab, 1, 2, 8, 16), &mut Rng::new(3), &device);
        let stream = |stop: &str| {
            let stop = vec![stop.to_string()].into_iter().filter(|s| !s.is_empty()).collect();
            let request =
                GenerationRequest { prompt: "G".into(), max_new_tokens: ids.len(), stop, ..Default::default() };
            let mut sequence = Sequence::new(&model, &tokenizer, &request, KvKind::None.into(), &device).unwrap();
            let mut streamed = String::new();
            for &id in &ids {
                if sequence.finished().is_some() {
                    break;
                }
                let mut logits = vec![0.0; vocab];
                logits[id as usize] = 1e4;
                streamed.push_str(&sequence.step_with(logits).unwrap());
            }
            (streamed, sequence.text().to_string())
        };
        assert_eq!(tokenizer::decode(&tokenizer, &ids).unwrap(), text);
        assert_eq!(stream(""), (text.to_string(), text.to_string()));
        let before = &text[..text.find("タワ").unwrap()];
        assert_eq!(stream("タワ"), (before.to_string(), before.to_string()));
    }

    /// A prompt is refused before it reaches the model when it encodes to nothing, to more tokens than the context,
    /// or to an id past the model's vocabulary (an imported model whose tokenizer holds more ids than its embedding):
    /// the server answers each with a 400.
    #[test]
    fn prompts_are_checked_against_the_context_and_the_vocabulary() {
        let tokenizer = tokenizer::train_char("abcdef").unwrap();
        assert_eq!(prompt_ids(&tokenizer, "cab", 8, 6).unwrap(), [2, 0, 1]);
        assert!(matches!(prompt_ids(&tokenizer, "", 8, 6), Err(GenerateError::EmptyPrompt)));
        let long = prompt_ids(&tokenizer, "abcabc", 4, 6);
        assert!(matches!(long, Err(GenerateError::PromptTooLong { tokens: 6, context: 4 })));
        let past = prompt_ids(&tokenizer, "af", 8, 5).unwrap_err().to_string();
        assert!(past.starts_with("the prompt encodes to token id 5, past the model's vocabulary of 5"), "{past}");
    }
}
