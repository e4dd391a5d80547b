//! The OpenAI completions API: request validation (in `ember_formats::openai`), response and stream-chunk bodies.

use serde_json::{Value, json};

pub use ember_formats::openai::{ApiError, Completion, parse_completion};

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

/// A `text_completion` object; `finish` is None for stream chunks before the last.
pub fn completion_body(id: &str, model: &str, created: u64, text: &str, finish: Option<Finish>) -> Value {
    json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": [{"text": text, "index": 0, "logprobs": null, "finish_reason": finish.map(finish_reason)}],
    })
}

/// Token counts as OpenAI's `usage`.
pub fn usage(prompt_tokens: usize, completion_tokens: usize) -> Value {
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
           "total_tokens": prompt_tokens + completion_tokens})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_validated_with_openai_style_errors() {
        let ok =
            parse_completion(br#"{"model":"m","prompt":"hi","max_tokens":5,"stop":["\n"],"seed":3}"#, "m").unwrap();
        assert_eq!((ok.settings.max_new_tokens, ok.settings.stop.len(), ok.stream), (5, 1, false));
        let err = |body: &[u8]| parse_completion(body, "m").unwrap_err();
        assert_eq!(err(b"{not json").status, 400);
        assert_eq!(err(br#"{"model":"other","prompt":"x"}"#).status, 404);
        assert_eq!(err(br#"{"prompt":"x","temperature":3}"#).param, Some("temperature"));
        assert_eq!(err(br#"{"prompt":"x","max_tokens":0}"#).param, Some("max_tokens"));
        assert_eq!(err(br#"{"prompt":5}"#).param, Some("prompt"));
        let body = err(br#"{"prompt":"x","top_p":0}"#).body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "top_p");
    }
}
