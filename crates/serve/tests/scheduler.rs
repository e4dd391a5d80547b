//! The continuous-batching scheduler on a tiny random model on the CPU, its events read in the order it sends them:
//! admission (at most `max_batch` sequences run, in arrival order), fairness (each running sequence steps once per
//! round), cancellation (a sequence whose client has gone leaves at once and a waiting one takes its place), errors
//! (a prompt too long for the context fails alone) and batch composition (greedy texts decoded in one batch equal
//! those decoded one sequence at a time, on every KV store the scheduler batches).

use std::sync::mpsc;

use burn::tensor::Device;
use ember_core_model::{Build, CausalLm, ModelConfig, Rng};
use ember_formats::tokenizer;
use ember_serve::generate::Finish;
use ember_serve::metrics::Metrics;
use ember_serve::scheduler::{self, Batching, Event, Job};
use ember_serve::{GenerationRequest, Sampling};
use ember_serve::{KvKind, KvSpec};
use tokenizers::Tokenizer;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

const ALPHABET: &str = "abcdefgh ";

fn model() -> (CausalLm, Tokenizer) {
    let tokenizer = tokenizer::train_char(ALPHABET).unwrap();
    let config = ModelConfig::gpt(tokenizer.get_vocab_size(true), 2, 2, 16, 64);
    (CausalLm::new(&config, &mut Rng::new(7), &Device::flex()), tokenizer)
}

/// A greedy job for choice `choice` that generates `tokens` tokens after `prompt`, each with its log-probability (so
/// that every step sends an event).
fn job(choice: usize, prompt: &str, tokens: usize, events: &UnboundedSender<(usize, Event)>) -> Job {
    let request = GenerationRequest {
        prompt: prompt.into(),
        max_new_tokens: tokens,
        sampling: Sampling::greedy(),
        ..GenerationRequest::default()
    };
    Job { request, tokens: None, choice, logprobs: Some(0), echo: false, constraint: None, events: events.clone() }
}

/// Runs `jobs` to the end with batches of `max_batch` on `kv`; every event sent, in order.
fn serve(
    jobs: Vec<Job>,
    max_batch: usize,
    kv: KvSpec,
    mut events: UnboundedReceiver<(usize, Event)>,
) -> Vec<(usize, Event)> {
    let (model, tokenizer) = model();
    let (send, received) = mpsc::channel();
    for job in jobs {
        send.send(job).unwrap();
    }
    drop(send);
    let metrics = Metrics::default();
    scheduler::run(
        &model,
        &tokenizer,
        &Device::flex(),
        Batching { max_batch, kv, prefix_pages: 0 },
        received,
        &metrics,
    );
    assert_eq!(metrics.running.load(std::sync::atomic::Ordering::SeqCst), 0, "sequences still counted running");
    let mut all = Vec::new();
    while let Ok(event) = events.try_recv() {
        all.push(event);
    }
    all
}

fn contiguous() -> KvSpec {
    KvKind::Contiguous.into()
}

/// Each choice's generated text and how it finished.
fn outcomes(events: &[(usize, Event)], choices: usize) -> Vec<(String, Option<(Finish, usize)>)> {
    let mut out = vec![(String::new(), None); choices];
    for (choice, event) in events {
        match event {
            Event::Token { text, .. } => out[*choice].0.push_str(text),
            Event::Done { finish, completion_tokens, .. } => out[*choice].1 = Some((*finish, *completion_tokens)),
            Event::Error(e) => panic!("choice {choice}: {e}"),
            Event::Prompt { .. } => panic!("choice {choice}: no job asked for its prompt back"),
        }
    }
    out
}

#[test]
fn at_most_max_batch_sequences_run_and_they_start_in_arrival_order() {
    let (events, received) = unbounded_channel();
    let jobs = (0..7).map(|c| job(c, "ab", 3 + c % 3, &events)).collect();
    drop(events);
    let all = serve(jobs, 3, contiguous(), received);
    let (mut running, mut started) = (Vec::<usize>::new(), Vec::new());
    for (choice, event) in &all {
        match event {
            Event::Token { .. } if !running.contains(choice) => {
                running.push(*choice);
                started.push(*choice);
            }
            Event::Done { .. } => running.retain(|c| c != choice),
            _ => {}
        }
        assert!(running.len() <= 3, "{running:?} run at once with max_batch 3");
    }
    assert_eq!(started, (0..7).collect::<Vec<_>>(), "jobs start in arrival order");
    for (choice, (_, done)) in outcomes(&all, 7).into_iter().enumerate() {
        assert_eq!(done, Some((Finish::Length, 3 + choice % 3)), "choice {choice}");
    }
}

#[test]
fn every_running_sequence_steps_once_per_round() {
    let (events, received) = unbounded_channel();
    let jobs = (0..4).map(|c| job(c, "a", 5, &events)).collect();
    drop(events);
    let all = serve(jobs, 2, contiguous(), received);
    let order: Vec<String> = all
        .iter()
        .map(|(choice, event)| match event {
            Event::Token { .. } => format!("{choice}"),
            _ => format!("{choice}done"),
        })
        .collect();
    // Rounds of two: 0 and 1 step in turn five times, finish together, then 2 and 3 do the same.
    let pair = |a: usize, b: usize| {
        let mut p: Vec<String> = (0..5).flat_map(|_| [a.to_string(), b.to_string()]).collect();
        p.extend([format!("{a}done"), format!("{b}done")]);
        p
    };
    assert_eq!(order, [pair(0, 1), pair(2, 3)].concat());
}

#[test]
fn a_sequence_whose_client_has_gone_leaves_at_once_and_a_waiting_one_takes_its_place() {
    let (events, received) = unbounded_channel();
    let (gone, closed) = unbounded_channel();
    drop(closed);
    // Choice 0's client is gone before it starts; 1 and 2 share the other channel.
    let jobs = vec![job(0, "ab", 40, &gone), job(1, "ab", 4, &events), job(2, "ba", 4, &events)];
    drop(events);
    let all = serve(jobs, 2, contiguous(), received);
    let order: Vec<usize> = all.iter().filter(|(_, e)| matches!(e, Event::Token { .. })).map(|(c, _)| *c).collect();
    // Round 1 runs 0 and 1; 0's send fails and it leaves, so 2 joins in round 2 beside 1's second token (had 0
    // stayed, 2 would wait for its 40 tokens).
    assert_eq!(order[..3], [1, 1, 2], "{order:?}");
    let done = outcomes(&all, 3);
    assert_eq!(done[1].1, Some((Finish::Length, 4)));
    assert_eq!(done[2].1, Some((Finish::Length, 4)));
}

#[test]
fn a_prompt_longer_than_the_context_fails_alone() {
    let (events, received) = unbounded_channel();
    let jobs = vec![job(0, "ab", 3, &events), job(1, &"a".repeat(65), 3, &events), job(2, "ba", 3, &events)];
    drop(events);
    let all = serve(jobs, 4, contiguous(), received);
    let errors: Vec<usize> = all.iter().filter(|(_, e)| matches!(e, Event::Error(_))).map(|(c, _)| *c).collect();
    assert_eq!(errors, [1]);
    for choice in [0, 2] {
        let done = all.iter().find(|(c, e)| *c == choice && matches!(e, Event::Done { .. }));
        assert!(matches!(done, Some((_, Event::Done { finish: Finish::Length, completion_tokens: 3, .. }))));
    }
}

#[test]
fn texts_decoded_in_one_batch_equal_those_decoded_alone() {
    let prompts = ["a", "hg fe", "abcabc", "h", "dd e"];
    for kind in [KvKind::Contiguous, KvKind::Paged, KvKind::Int8] {
        let kv = KvSpec { page_size: 4, ..kind.into() };
        let texts = |max_batch: usize| {
            let (events, received) = unbounded_channel();
            let jobs = prompts.iter().enumerate().map(|(c, p)| job(c, p, 12, &events)).collect();
            drop(events);
            outcomes(&serve(jobs, max_batch, kv, received), prompts.len())
        };
        let (batched, alone) = (texts(prompts.len()), texts(1));
        assert_eq!(batched, alone, "{kind:?}");
        assert!(batched.iter().all(|(text, _)| text.chars().count() == 12), "{batched:?}");
    }
}
