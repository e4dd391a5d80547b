//! OpenAI completions requests: the body validated into [`SampleConfig`], and OpenAI-style errors.

use serde_json::{Value, json};

use crate::sampling::SampleConfig;

/// An error as OpenAI reports it: an HTTP status and `{"error": {message, type, param, code}}`.
#[derive(Debug, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub param: Option<&'static str>,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        Self { status: 400, message: message.into(), param: Some(param), code: None }
    }
    pub fn body(&self) -> Value {
        let kind = if self.status == 404 { "not_found_error" } else { "invalid_request_error" };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}})
    }
}

/// A validated completion request.
#[derive(Debug)]
pub struct Completion {
    pub settings: SampleConfig,
    pub stream: bool,
}

/// Parses and checks a `POST /v1/completions` body against the served model `model_id`.
pub fn parse_completion(body: &[u8], model_id: &str) -> Result<Completion, ApiError> {
    let json: Value = serde_json::from_slice(body).map_err(|e| ApiError {
        status: 400,
        message: format!("invalid JSON body: {e}"),
        param: None,
        code: None,
    })?;
    let Some(obj) = json.as_object() else {
        return Err(ApiError {
            status: 400,
            message: "the body must be a JSON object".into(),
            param: None,
            code: None,
        });
    };
    if let Some(model) = obj.get("model").and_then(Value::as_str).filter(|&m| m != model_id) {
        return Err(ApiError {
            status: 404,
            message: format!("the model `{model}` does not exist; this server serves `{model_id}`"),
            param: Some("model"),
            code: Some("model_not_found"),
        });
    }
    let prompt = match obj.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => a[0].as_str().unwrap_or_default().to_string(),
        _ => return Err(ApiError::invalid("prompt", "prompt must be a string (or a list of one string)")),
    };
    let number = |key: &'static str| -> Result<Option<f64>, ApiError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| ApiError::invalid(key, format!("{key} must be a number"))),
        }
    };
    let integer = |key: &'static str| -> Result<Option<u64>, ApiError> {
        match obj.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| ApiError::invalid(key, format!("{key} must be a non-negative integer"))),
        }
    };
    if integer("n")?.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("n", "only n = 1 is supported"));
    }
    let max_tokens = integer("max_tokens")?.unwrap_or(16);
    if !(1..=100_000).contains(&max_tokens) {
        return Err(ApiError::invalid("max_tokens", "max_tokens must be between 1 and 100000"));
    }
    let temperature = number("temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid("temperature", "temperature must be between 0 and 2"));
    }
    let top_p = number("top_p")?;
    if top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
    }
    let stop = match obj.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(Value::is_string) => {
            a.iter().filter_map(|v| v.as_str().map(String::from)).collect()
        }
        _ => return Err(ApiError::invalid("stop", "stop must be a string or a list of up to 4 strings")),
    };
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    let stream = match obj.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err(ApiError::invalid("stream", "stream must be a boolean")),
    };
    let settings = SampleConfig {
        prompt,
        max_new_tokens: max_tokens as usize,
        temperature,
        top_k: None,
        top_p,
        repetition_penalty: 1.0,
        stop,
        seed: integer("seed")?.unwrap_or(0),
    };
    Ok(Completion { settings, stream })
}
