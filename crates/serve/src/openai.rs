//! The OpenAI completions and chat completions APIs: response and stream-chunk bodies (requests are validated by
//! `ember_formats::openai`).

use serde_json::{Value, json};

pub use ember_formats::openai::{ApiError, Chat, Completion, Streaming, parse_chat, parse_completion};

use crate::generate::{Finish, GenerateError};

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

/// The API a response speaks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Api {
    /// `/v1/completions`: `text_completion` objects.
    Completions,
    /// `/v1/chat/completions`: `chat.completion` objects, streamed as `chat.completion.chunk` deltas.
    Chat,
}

impl Api {
    /// The response id of the `n`th request.
    pub fn id(self, n: u64) -> String {
        match self {
            Api::Completions => format!("cmpl-{n}"),
            Api::Chat => format!("chatcmpl-{n}"),
        }
    }

    /// A response (`chunk` false) or one stream chunk carrying `text`; `finish` is None for chunks before the last.
    pub fn body(self, id: &str, model: &str, created: u64, text: &str, finish: Option<Finish>, chunk: bool) -> Value {
        let finish = finish.map(finish_reason);
        let (object, choice) = match (self, chunk) {
            (Api::Completions, _) => {
                ("text_completion", json!({"text": text, "index": 0, "logprobs": null, "finish_reason": finish}))
            }
            (Api::Chat, false) => (
                "chat.completion",
                json!({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null,
                       "finish_reason": finish}),
            ),
            (Api::Chat, true) => {
                let delta = if text.is_empty() && finish.is_some() { json!({}) } else { json!({"content": text}) };
                (
                    "chat.completion.chunk",
                    json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}),
                )
            }
        };
        json!({"id": id, "object": object, "created": created, "model": model, "choices": [choice]})
    }

    /// The chunk that opens a chat stream, naming the role before any text.
    pub fn first_chunk(self, id: &str, model: &str, created: u64) -> Option<Value> {
        (self == Api::Chat).then(|| {
            json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null,
                                "finish_reason": null}]})
        })
    }
}

/// Token counts as OpenAI's `usage`.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens})
}
