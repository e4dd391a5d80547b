//! Continuous batching: one worker owns the model and steps every active sequence once per round — every sequence
//! past its prompt in one batched forward pass over ragged lengths; requests join between rounds as others finish,
//! and a sequence whose client has gone is dropped at once, freeing its KV store.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use burn::tensor::Device;
use ember_core_model::Gpt;
use ember_core_model::cache::KvCache;
use tokenizers::Tokenizer;

use crate::generate::{Finish, GenerateError, KvSpec, Sequence};
use crate::metrics::Metrics;
use crate::sampling::SampleConfig;

/// A request for one completion; its events go back on `events`.
pub struct Job {
    pub settings: SampleConfig,
    pub events: Sender<Event>,
}

/// What a job's client hears.
#[derive(Debug)]
pub enum Event {
    /// Newly generated text.
    Text(String),
    /// The end: why, and the token counts.
    Done { finish: Finish, prompt_tokens: usize, completion_tokens: usize },
    /// The request could not run (e.g. its prompt is longer than the context).
    Error(GenerateError),
}

struct Active<'a> {
    sequence: Sequence<'a>,
    events: Sender<Event>,
}

/// Serves `jobs` until every sender is dropped and every admitted job has finished, at most `max_batch` at a time;
/// `metrics` hears the queue, the running sequences and their KV bytes after every round.
pub fn run(
    model: &Gpt,
    tokenizer: &Tokenizer,
    kv: KvSpec,
    device: &Device,
    max_batch: usize,
    jobs: Receiver<Job>,
    metrics: &Metrics,
) {
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
            match Sequence::new(model, tokenizer, &job.settings, kv, device) {
                Ok(sequence) => active.push(Active { sequence, events: job.events }),
                Err(e) => {
                    let _ = job.events.send(Event::Error(e));
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
        active.retain_mut(|a| {
            let outcome = outcomes.next().flatten().unwrap_or_else(|| a.sequence.step());
            let event = match outcome {
                Ok(piece) if piece.is_empty() => None,
                Ok(piece) => Some(Event::Text(piece)),
                Err(e) => {
                    let _ = a.events.send(Event::Error(e));
                    return false;
                }
            };
            if event.is_some_and(|e| a.events.send(e).is_err()) {
                return false;
            }
            match a.sequence.finished() {
                None => true,
                Some(finish) => {
                    let (prompt_tokens, completion_tokens) = (a.sequence.prompt_tokens(), a.sequence.new_tokens());
                    let _ = a.events.send(Event::Done { finish, prompt_tokens, completion_tokens });
                    false
                }
            }
        });
        metrics.running.store(active.len(), Ordering::SeqCst);
        metrics.queued.store(waiting.len(), Ordering::SeqCst);
        let kv_bytes: usize = active.iter().map(|a| a.sequence.kv_bytes()).sum();
        metrics.kv_bytes.store(kv_bytes as u64, Ordering::SeqCst);
        if !open && active.is_empty() && waiting.is_empty() {
            return;
        }
    }
}
