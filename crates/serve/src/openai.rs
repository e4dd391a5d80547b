//! The OpenAI completions and chat completions APIs: response and stream-chunk bodies (requests are validated by
//! `ember_formats::openai`).

use serde_json::{Value, json};

pub use ember_formats::openai::{ApiError, Chat, Completion, Format, Output, Prompt, parse_chat, parse_completion};

use crate::generate::{Finish, GenerateError};
use crate::tools::Call;

impl From<GenerateError> for ApiError {
    fn from(e: GenerateError) -> Self {
        let code = matches!(e, GenerateError::PromptTooLong { .. }).then_some("context_length_exceeded");
        Self { status: 400, message: e.to_string(), param: Some("prompt"), code }
    }
}

pub fn finish_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Length => "length",
        Finish::Stop => "stop",
    }
}

/// A token's logprobs with the tokens as text; an echoed prompt's first token has none (null in the response).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenText {
    pub token: String,
    pub logprob: Option<f32>,
    pub top: Option<Vec<(String, f32)>>,
}

/// The API a response speaks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Api {
    /// `/v1/completions`: `text_completion` objects.
    Completions,
    /// `/v1/chat/completions`: `chat.completion` objects, streamed as `chat.completion.chunk` deltas.
    Chat,
}

/// One choice of a response, or its part in a stream chunk: text, the logprobs of its tokens (None when not asked
/// for), and the finish reason once it has ended.
pub struct ChoiceBody<'a> {
    pub index: usize,
    pub text: &'a str,
    /// The tool calls parsed from the reply (chat only; empty: none).
    pub calls: &'a [Call],
    pub logprobs: Option<&'a [TokenText]>,
    /// Where the tokens' text starts in the choice's whole text (completions' `text_offset`).
    pub offset: usize,
    pub finish: Option<Finish>,
}

impl Api {
    /// The response id of the `n`th request.
    pub fn id(self, n: u64) -> String {
        match self {
            Api::Completions => format!("cmpl-{n}"),
            Api::Chat => format!("chatcmpl-{n}"),
        }
    }

    /// A response (`chunk` false) holding `choices`, or one stream chunk.
    pub fn body(self, id: &str, model: &str, created: u64, choices: &[ChoiceBody], chunk: bool) -> Value {
        let choices: Vec<Value> = choices.iter().map(|c| self.choice(id, c, chunk)).collect();
        let object = match (self, chunk) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": choices})
    }

    fn choice(self, id: &str, c: &ChoiceBody, chunk: bool) -> Value {
        let calls = !c.calls.is_empty();
        let finish = c.finish.map(|f| if calls && f == Finish::Stop { "tool_calls" } else { finish_reason(f) });
        let logprobs = c.logprobs.map_or(Value::Null, |tokens| self.logprobs(tokens, c.offset));
        let tool_calls: Vec<Value> = (c.calls.iter().enumerate())
            .map(|(i, call)| {
                json!({"index": i, "id": format!("call_{id}_{}_{i}", c.index), "type": "function",
                       "function": {"name": call.name, "arguments": call.arguments}})
            })
            .collect();
        match (self, chunk) {
            (Api::Completions, _) => {
                json!({"text": c.text, "index": c.index, "logprobs": logprobs, "finish_reason": finish})
            }
            (Api::Chat, false) => {
                let mut message = json!({"role": "assistant", "content": c.text});
                if calls {
                    message["tool_calls"] = tool_calls.into();
                    if c.text.is_empty() {
                        message["content"] = Value::Null;
                    }
                }
                json!({"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": finish})
            }
            (Api::Chat, true) => {
                let mut delta = if c.text.is_empty() && (finish.is_some() || calls) {
                    json!({})
                } else {
                    json!({"content": c.text})
                };
                if calls {
                    delta["tool_calls"] = tool_calls.into();
                }
                json!({"index": c.index, "delta": delta, "logprobs": logprobs, "finish_reason": finish})
            }
        }
    }

    /// Logprobs in the API's shape: completions' parallel lists, or chat's `content` entries with UTF-8 bytes.
    fn logprobs(self, tokens: &[TokenText], offset: usize) -> Value {
        match self {
            Api::Completions => {
                let offsets = tokens.iter().scan(offset, |at, t| {
                    let here = *at;
                    *at += t.token.len();
                    Some(here)
                });
                json!({
                    "tokens": tokens.iter().map(|t| &t.token).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    "top_logprobs": tokens.iter()
                        .map(|t| t.top.as_ref().map(|top| {
                            top.iter().map(|(s, lp)| (s.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()
                        }))
                        .collect::<Vec<_>>(),
                    "text_offset": offsets.collect::<Vec<_>>(),
                })
            }
            Api::Chat => {
                let entry = |token: &str, logprob: Option<f32>| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()});
                let content: Vec<Value> = tokens
                    .iter()
                    .map(|t| {
                        let mut e = entry(&t.token, t.logprob);
                        e["top_logprobs"] = t.top.iter().flatten().map(|(s, lp)| entry(s, Some(*lp))).collect();
                        e
                    })
                    .collect();
                json!({"content": content, "refusal": null})
            }
        }
    }

    /// The chunk that opens choice `index` of a chat stream, naming the role before any text.
    pub fn first_chunk(self, id: &str, model: &str, created: u64, index: usize) -> Option<Value> {
        (self == Api::Chat).then(|| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
                                "finish_reason": null}]})
        })
    }
}

/// Token counts as OpenAI's `usage`.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens})
}
