//! A response being generated: the events of its choices folded into a whole OpenAI response or a stream of
//! server-sent events.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Instant;

use axum::body::{Bytes, HttpBody};
use ember_formats::tokenizer;
use http_body::Frame;
use serde_json::Value;
use tokenizers::Tokenizer;
use tokio::sync::mpsc::{self as channel, UnboundedReceiver};

use super::{Admission, App};
use crate::generate::Finish;
use crate::openai::{self, Api, ApiError, ChoiceBody, Output, TokenText};
use crate::sampling::TokenLogprob;
use crate::scheduler::Event;
use crate::tools::{Call, Plan};

/// What one choice has produced so far.
#[derive(Default)]
pub(super) struct Choice {
    /// The prompt's text, until it is given back (`echo`).
    echo: Option<String>,
    /// The first choice of its prompt, whose prompt tokens the usage counts.
    first_of_prompt: bool,
    text: String,
    logprobs: Vec<TokenText>,
    finish: Option<Finish>,
    first_token: Option<Instant>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

impl Choice {
    /// A choice yet to start, giving back `echo` first.
    pub(super) fn new(echo: Option<String>, first_of_prompt: bool) -> Self {
        Self { echo, first_of_prompt, ..Self::default() }
    }
}

/// A response being generated: the events of its choices, folded into a whole response or stream chunks.
pub(super) struct Reply {
    pub(super) app: Arc<App>,
    pub(super) api: Api,
    pub(super) id: String,
    pub(super) created: u64,
    pub(super) output: Output,
    /// Released before `events` closes, so that a freed sequence is never still counted.
    pub(super) _admission: Admission,
    pub(super) events: UnboundedReceiver<(usize, Event)>,
    pub(super) deadline: tokio::time::Instant,
    pub(super) arrived: Instant,
    pub(super) first_token: Option<Instant>,
    pub(super) choices: Vec<Choice>,
    /// A chat's tools: replies are parsed for calls, and streamed whole once they end.
    pub(super) tools: Option<Arc<Plan>>,
}

impl Reply {
    /// The next event: an error as an [`ApiError`], and the deadline as a 504.
    pub(super) async fn next(&mut self) -> Result<(usize, Event), ApiError> {
        match tokio::time::timeout_at(self.deadline, self.events.recv()).await {
            Err(_) => Err(ApiError::status(
                504,
                format!("generation passed the request deadline of {:?}", self.app.options.deadline),
            )),
            Ok(None) => Err(ApiError::status(500, "generation ended without a result")),
            Ok(Some((_, Event::Error(e)))) => Err(e.into()),
            Ok(Some(event)) => Ok(event),
        }
    }

    fn finished(&self) -> bool {
        self.choices.iter().all(|c| c.finish.is_some())
    }

    /// Records `event` of choice `index` (text, logprobs, metrics) and returns the new text and logprobs.
    fn record(&mut self, index: usize, event: Event) -> (String, Vec<TokenText>) {
        let metrics = &self.app.metrics;
        let choice = &mut self.choices[index];
        let served = self.app.served.get().expect("a generation runs on a loaded model");
        match event {
            Event::Prompt { first, logprobs } => {
                let text = choice.echo.take().unwrap_or_default();
                choice.text.push_str(&text);
                let token = tokenizer::decode(&served.tokenizer, &[first]).unwrap_or_default();
                let logprobs: Vec<TokenText> = logprobs
                    .map(|rest| {
                        let first = TokenText { token, logprob: None, top: None };
                        let rest = rest.into_iter().map(|lp| token_text(&served.tokenizer, lp));
                        std::iter::once(first).chain(rest).collect()
                    })
                    .unwrap_or_default();
                choice.logprobs.extend(logprobs.iter().cloned());
                (text, logprobs)
            }
            Event::Token { text, logprob } => {
                let now = Instant::now();
                if self.first_token.is_none() {
                    self.first_token = Some(now);
                    metrics.first_token(now.duration_since(self.arrived).as_secs_f64());
                }
                choice.first_token.get_or_insert(now);
                choice.text.push_str(&text);
                let logprobs: Vec<TokenText> =
                    logprob.map(|lp| token_text(&served.tokenizer, lp)).into_iter().collect();
                choice.logprobs.extend(logprobs.iter().cloned());
                (text, logprobs)
            }
            Event::Done { finish, prompt_tokens, completion_tokens } => {
                metrics.tokens(prompt_tokens, completion_tokens);
                if let Some(first) = choice.first_token.filter(|_| completion_tokens > 1) {
                    metrics.per_token(first.elapsed().as_secs_f64() / (completion_tokens - 1) as f64);
                }
                choice.finish = Some(finish);
                (choice.prompt_tokens, choice.completion_tokens) = (prompt_tokens, completion_tokens);
                (String::new(), Vec::new())
            }
            Event::Error(_) => unreachable!("next() turns errors into ApiError"),
        }
    }

    /// A reply's text and tool calls: with tools, the text around the calls parsed out of it.
    fn calls(&self, reply: &str) -> (String, Vec<Call>) {
        match &self.tools {
            Some(plan) => {
                let (text, calls) = plan.parse(reply);
                (text.unwrap_or_default(), calls)
            }
            None => (reply.to_string(), Vec::new()),
        }
    }

    fn usage(&self) -> Value {
        let prompt_tokens = self.choices.iter().filter(|c| c.first_of_prompt).map(|c| c.prompt_tokens).sum();
        openai::usage(prompt_tokens, self.choices.iter().map(|c| c.completion_tokens).sum())
    }

    /// Waits for every choice and answers with the whole response.
    pub(super) async fn whole(mut self, first: (usize, Event)) -> Result<Value, ApiError> {
        let (index, event) = first;
        self.record(index, event);
        while !self.finished() {
            let (index, event) = self.next().await?;
            self.record(index, event);
        }
        let logprobs = self.output.logprobs.is_some();
        let parsed: Vec<(String, Vec<Call>)> = self.choices.iter().map(|c| self.calls(&c.text)).collect();
        let choices: Vec<ChoiceBody> = (self.choices.iter().zip(&parsed).enumerate())
            .map(|(index, (c, (text, calls)))| ChoiceBody {
                index,
                text,
                calls,
                logprobs: logprobs.then_some(c.logprobs.as_slice()),
                offset: 0,
                finish: c.finish,
            })
            .collect();
        let mut body = self.api.body(&self.id, &self.app.id, self.created, &choices, false);
        body["usage"] = self.usage();
        Ok(body)
    }

    /// Sends the response as server-sent events into `frames`: a chat's role chunks, a chunk per token (or per
    /// piece of text), each choice's finish, the usage when asked for, and `[DONE]`. It stops when the client
    /// leaves (`frames` closes), which drops the event receiver and so frees the sequences.
    pub(super) async fn stream(mut self, first: (usize, Event), frames: channel::Sender<Bytes>) {
        let send = |data: String| {
            let frames = frames.clone();
            async move { frames.send(Bytes::from(format!("data: {data}\n\n"))).await.is_ok() }
        };
        for index in 0..self.choices.len() {
            if let Some(chunk) = self.api.first_chunk(&self.id, &self.app.id, self.created, index)
                && !send(chunk.to_string()).await
            {
                return;
            }
        }
        let mut event: Result<(usize, Event), ApiError> = Ok(first);
        loop {
            let (index, event_now) = match event {
                Ok(e) => e,
                Err(e) => {
                    // OpenAI's way of failing a stream already under way.
                    send(e.body().to_string()).await;
                    return;
                }
            };
            let offset = self.choices[index].text.len();
            let (mut text, mut logprobs) = self.record(index, event_now);
            let finish = self.choices[index].finish;
            // With tools, a reply goes out whole when it ends: its text and calls in one delta.
            let mut calls = Vec::new();
            if self.tools.is_some() {
                if finish.is_none() {
                    (text, logprobs) = (String::new(), Vec::new());
                } else {
                    (text, calls) = self.calls(&self.choices[index].text);
                    logprobs = self.choices[index].logprobs.clone();
                }
            }
            if !text.is_empty() || !logprobs.is_empty() || finish.is_some() {
                let choice = ChoiceBody {
                    index,
                    text: &text,
                    calls: &calls,
                    logprobs: self.output.logprobs.map(|_| logprobs.as_slice()),
                    offset,
                    finish,
                };
                if !send(self.api.body(&self.id, &self.app.id, self.created, &[choice], true).to_string()).await {
                    return;
                }
            }
            if self.finished() {
                break;
            }
            event = self.next().await;
        }
        if self.output.include_usage {
            let mut last = self.api.body(&self.id, &self.app.id, self.created, &[], true);
            last["usage"] = self.usage();
            if !send(last.to_string()).await {
                return;
            }
        }
        send("[DONE]".into()).await;
    }
}

/// A token's logprobs with its text and its alternatives' as the tokenizer decodes each alone.
fn token_text(tokenizer: &Tokenizer, lp: TokenLogprob) -> TokenText {
    let text = |id: u32| tokenizer::decode(tokenizer, &[id]).unwrap_or_default();
    TokenText {
        token: text(lp.id),
        logprob: Some(lp.logprob),
        top: Some(lp.top.into_iter().map(|(id, p)| (text(id), p)).collect()),
    }
}

/// A streamed response body: the frames [`Reply::stream`] sends.
pub(super) struct EventStream(pub(super) channel::Receiver<Bytes>);

impl HttpBody for EventStream {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|data| data.map(|bytes| Ok(Frame::data(bytes))))
    }
}
