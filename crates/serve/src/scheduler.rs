//! Continuous batching: one worker owns the model and steps every active sequence once per round — every sequence
//! past its prompt in one batched forward pass over ragged lengths; requests join between rounds as others finish,
//! and a sequence whose client has gone is dropped at once, freeing its KV store. With a paged store and a prefix
//! cache, every sequence draws its pages from one pool that keeps the full pages of earlier prompts, so a prompt
//! that starts as an earlier one did computes only the rest.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, TryRecvError};

use burn::tensor::Device;
use ember_core_model::CausalLm;
use ember_core_model::cache::KvCache;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::UnboundedSender;

use crate::constrain::{Compiled, Constraint, Vocabulary};
use crate::generate::{Finish, GenerateError, Sequence};
use crate::kv::spec::{KvKind, KvSpec};
use crate::kv::{PagePool, PagedCache};
use crate::metrics::Metrics;
use crate::sampling::TokenLogprob;
use ember_formats::request::GenerationRequest;

/// A request for one completion, choice `choice` of its response; its events go back on `events`, tagged with the
/// choice. The prompt is the request's text, or `tokens` when given. With `logprobs`, every token comes with its
/// log-probability and that many alternatives; with `echo`, the prompt's tokens first.
pub struct Job {
    pub request: GenerationRequest,
    pub tokens: Option<Vec<u32>>,
    pub choice: usize,
    pub logprobs: Option<usize>,
    pub echo: bool,
    /// The grammar the text must follow (`response_format`), if any.
    pub constraint: Option<Arc<Compiled>>,
    pub events: UnboundedSender<(usize, Event)>,
}

/// What a job's client hears.
#[derive(Debug)]
pub enum Event {
    /// The prompt, given back before any token (`echo`): its first token, and with logprobs those of the others.
    Prompt { first: u32, logprobs: Option<Vec<TokenLogprob>> },
    /// A generated token: the text that became final with it (possibly none) and, when asked for, its logprobs.
    Token { text: String, logprob: Option<TokenLogprob> },
    /// The end: why, and the token counts.
    Done { finish: Finish, prompt_tokens: usize, completion_tokens: usize },
    /// The request could not run (e.g. its prompt is longer than the context).
    Error(GenerateError),
}

struct Active<'a> {
    sequence: Sequence<'a>,
    choice: usize,
    events: UnboundedSender<(usize, Event)>,
}

/// How sequences are batched and stored.
#[derive(Clone, Copy, Debug)]
pub struct Batching {
    /// Sequences stepped together.
    pub max_batch: usize,
    pub kv: KvSpec,
    /// Full prompt pages a paged store keeps for later prompts (0: none, and with other stores always none).
    pub prefix_pages: usize,
}

/// Serves `jobs` until every sender is dropped and every admitted job has finished, as `batching` says; `metrics`
/// hears the queue, the running sequences, their KV bytes and the prefix cache's hits after every round.
pub fn run(
    model: &CausalLm,
    tokenizer: &Tokenizer,
    device: &Device,
    batching: Batching,
    jobs: Receiver<Job>,
    metrics: &Metrics,
) {
    let Batching { max_batch, kv, prefix_pages } = batching;
    let shared =
        (kv.kind == KvKind::Paged && prefix_pages > 0).then(|| PagePool::with_prefix_cache(kv.page_size, prefix_pages));
    let store = |ids: &[u32]| -> Option<Box<dyn KvCache>> {
        match &shared {
            Some(pool) => Some(Box::new(PagedCache::for_prompt(pool.clone(), ids))),
            None => kv.build(),
        }
    };
    // The vocabulary as a trie, built for the first constrained request.
    let mut vocabulary: Option<Arc<Vocabulary>> = None;
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut active: Vec<Active> = Vec::new();
    let mut open = true;
    loop {
        // Block only when there is nothing to do.
        if active.is_empty() && waiting.is_empty() {
            match jobs.recv() {
                Ok(job) => waiting.push_back(job),
                Err(_) => return,
            }
        }
        while open {
            match jobs.try_recv() {
                Ok(job) => waiting.push_back(job),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        while active.len() < max_batch.max(1) {
            let Some(job) = waiting.pop_front() else { break };
            let sequence = match job.tokens {
                Some(ids) => Sequence::with_ids(model, tokenizer, &job.request, ids, device, store),
                None => Sequence::with_store(model, tokenizer, &job.request, device, store),
            };
            match sequence {
                Ok(mut sequence) => {
                    if job.echo {
                        let logprobs = job.logprobs.map(|top| sequence.score_prompt(top));
                        let prompt = Event::Prompt { first: sequence.first_token(), logprobs };
                        if job.events.send((job.choice, prompt)).is_err() {
                            continue;
                        }
                    }
                    metrics.prompt_reuse(sequence.prompt_tokens(), sequence.reused_tokens());
                    let constraint = job.constraint.map(|compiled| {
                        let size = model.config().vocab();
                        let vocabulary = vocabulary.get_or_insert_with(|| Arc::new(Vocabulary::new(tokenizer, size)));
                        Constraint::new(compiled, vocabulary.clone())
                    });
                    active.push(Active {
                        sequence: sequence.with_logprobs(job.logprobs).with_constraint(constraint),
                        choice: job.choice,
                        events: job.events,
                    })
                }
                Err(e) => {
                    let _ = job.events.send((job.choice, Event::Error(e)));
                }
            }
        }
        // One step of every active sequence: those past their prompt in one batched forward pass, the others (a
        // prompt, a context shift) alone; then those finished or abandoned leave.
        let mut outcomes: Vec<Option<Result<String, GenerateError>>> = (0..active.len()).map(|_| None).collect();
        let mut tokens = Vec::new();
        let mut members = Vec::new();
        let mut caches: Vec<&mut dyn KvCache> = Vec::new();
        for (i, a) in active.iter_mut().enumerate() {
            if let Some((token, cache)) = a.sequence.batchable() {
                tokens.push(token);
                members.push(i);
                caches.push(cache);
            }
        }
        if members.len() >= 2 {
            let logits = model.forward_batch(&tokens, &mut caches).into_data().convert::<f32>();
            let logits = logits.as_slice::<f32>().expect("f32 logits");
            let v = logits.len() / members.len();
            drop(caches);
            for (row, &i) in members.iter().enumerate() {
                outcomes[i] = Some(active[i].sequence.step_with(logits[row * v..(row + 1) * v].to_vec()));
            }
        } else {
            drop(caches);
        }
        let mut outcomes = outcomes.into_iter();
        // A sequence's last event goes out once the gauges below count it gone, so a client that has its whole
        // response never reads it as still running.
        let mut last_events = Vec::new();
        active.retain_mut(|a| {
            let outcome = outcomes.next().flatten().unwrap_or_else(|| a.sequence.step());
            let send = |event| a.events.send((a.choice, event)).is_ok();
            let event = match outcome {
                Ok(text) => match a.sequence.take_logprob() {
                    None if text.is_empty() => None,
                    logprob => Some(Event::Token { text, logprob }),
                },
                Err(e) => {
                    last_events.push((a.events.clone(), a.choice, Event::Error(e)));
                    return false;
                }
            };
            // A send fails when the client has gone: the sequence leaves, freeing its KV store.
            if event.is_some_and(|e| !send(e)) {
                return false;
            }
            match a.sequence.finished() {
                None => true,
                Some(finish) => {
                    let (prompt_tokens, completion_tokens) = (a.sequence.prompt_tokens(), a.sequence.new_tokens());
                    last_events.push((
                        a.events.clone(),
                        a.choice,
                        Event::Done { finish, prompt_tokens, completion_tokens },
                    ));
                    false
                }
            }
        });
        metrics.running.store(active.len(), Ordering::SeqCst);
        metrics.queued.store(waiting.len(), Ordering::SeqCst);
        let kv_bytes: usize = active.iter().map(|a| a.sequence.kv_bytes()).sum();
        metrics.kv_bytes.store(kv_bytes as u64, Ordering::SeqCst);
        if let Some(pool) = &shared {
            metrics.cached_pages.store(pool.borrow().cached_pages(), Ordering::SeqCst);
        }
        if let Some(vocabulary) = &vocabulary {
            let (masks, micros) = vocabulary.masks();
            metrics.masks.store(masks, Ordering::SeqCst);
            metrics.mask_micros.store(micros, Ordering::SeqCst);
        }
        for (events, choice, event) in last_events {
            // A client that has gone needs no last event.
            let _ = events.send((choice, event));
        }
        if !open && active.is_empty() && waiting.is_empty() {
            return;
        }
    }
}
