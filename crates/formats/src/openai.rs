//! OpenAI completions and chat completions requests: the body validated into a [`GenerationRequest`] (and, for a chat, its
//! messages), and OpenAI-style errors.

use serde_json::{Map, Value, json};

use crate::chat::Json;
use crate::request::{GenerationRequest, Sampling};
use crate::tools::{self, Tools};

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
    /// A 4xx or 5xx that names no parameter.
    pub fn status(status: u16, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), param: None, code: None }
    }
    pub fn body(&self) -> Value {
        let kind = match self.status {
            401 => "authentication_error",
            404 => "not_found_error",
            429 => "rate_limit_error",
            500.. => "server_error",
            _ => "invalid_request_error",
        };
        json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}})
    }
}

/// The most choices one request may ask for (`n`).
pub const MAX_CHOICES: usize = 16;

/// The most alternatives a token's logprobs may list (`logprobs`, `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// What a response holds and how it is sent: `n` choices, whole or as server-sent events (then, with
/// `include_usage`, a last chunk carries the token counts), and with `logprobs` each token's log-probability and
/// that many alternatives.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Output {
    pub stream: bool,
    pub include_usage: bool,
    pub n: usize,
    pub logprobs: Option<usize>,
}

/// The most prompts one completion request may hold (a list of strings or of token lists).
pub const MAX_PROMPTS: usize = 64;

/// A completion prompt: text, or token ids as the model's tokenizer numbers them.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// What the generated text must be (`response_format`, or vLLM's `structured_outputs`).
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// Any JSON object.
    JsonObject,
    /// JSON valid against this schema (its keys in the request's order).
    JsonSchema(Json),
    /// Text the regular expression matches, whole.
    Regex(String),
    /// One of these strings.
    Choice(Vec<String>),
}

/// A validated completion request: its prompts (each answered by `n` choices, numbered prompt · n + choice), the
/// generation each asks for (whose `prompt` is left empty), and with `echo` the prompt given back before the
/// completion, its tokens' log-probabilities too when `logprobs` is set.
#[derive(Debug)]
pub struct Completion {
    pub prompts: Vec<Prompt>,
    pub request: GenerationRequest,
    pub output: Output,
    pub echo: bool,
    pub format: Option<Format>,
}

/// A validated chat completion request: its messages (keys in the request's order, for the chat template) and the
/// generation it asks for, whose prompt is the rendered template.
#[derive(Debug)]
pub struct Chat {
    pub messages: Json,
    pub request: GenerationRequest,
    pub output: Output,
    pub format: Option<Format>,
    /// The functions the reply may call (None without tools, or with `tool_choice: "none"`).
    pub tools: Option<Tools>,
}

/// The fields both endpoints implement: the model, the sampling settings and the shape of the response.
const SHARED_FIELDS: [&str; 16] = [
    "model",
    "response_format",
    "structured_outputs",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "stop",
    "stream",
    "stream_options",
    "seed",
    "n",
    "user",
];

/// A completion request's own fields; any field neither here nor shared (`best_of`, `suffix`, `logit_bias`, ...) is
/// refused by name rather than ignored.
const COMPLETION_FIELDS: [&str; 3] = ["prompt", "logprobs", "echo"];

/// A chat completion request's own fields; any other (`functions`, `audio`, ...) is refused by name.
const CHAT_FIELDS: [&str; 7] =
    ["messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"];

/// The roles a chat message may have.
const ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// The body as a JSON object of the endpoint's `own` and the shared fields, for the served model `model_id`.
fn object(body: &[u8], model_id: &str, own: &[&str]) -> Result<Map<String, Value>, ApiError> {
    let json: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::status(400, format!("invalid JSON body: {e}")))?;
    let Value::Object(obj) = json else { return Err(ApiError::status(400, "the body must be a JSON object")) };
    if let Some(field) = obj.keys().find(|k| !own.contains(&k.as_str()) && !SHARED_FIELDS.contains(&k.as_str())) {
        let known = [own, &SHARED_FIELDS[..]].concat().join(", ");
        return Err(ApiError {
            status: 400,
            message: format!("`{field}` is not supported by this server (it implements {known})"),
            param: None,
            code: Some("unsupported_parameter"),
        });
    }
    if let Some(model) = obj.get("model").and_then(Value::as_str).filter(|&m| m != model_id) {
        return Err(ApiError {
            status: 404,
            message: format!("the model `{model}` does not exist; this server serves `{model_id}`"),
            param: Some("model"),
            code: Some("model_not_found"),
        });
    }
    Ok(obj)
}

/// A seed for a request that names none, different every time.
fn fresh_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(0u8)
}

/// The generation both endpoints ask for, with `prompt`; `max_tokens` is read from the first of `length_keys`
/// present. The logprobs fields, which differ between the endpoints, are left to the caller.
/// A length of 0 is taken only when `score_only` (a completion that echoes its prompt).
fn generation_request(
    obj: &Map<String, Value>,
    prompt: String,
    length_keys: &[&'static str],
    score_only: bool,
) -> Result<(GenerationRequest, Output), ApiError> {
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
    let n = integer("n")?.unwrap_or(1);
    if !(1..=MAX_CHOICES as u64).contains(&n) {
        return Err(ApiError::invalid("n", format!("n must be between 1 and {MAX_CHOICES}")));
    }
    let mut max_tokens = (length_keys[0], 16);
    for &key in length_keys {
        if let Some(n) = integer(key)? {
            max_tokens = (key, n);
            break;
        }
    }
    let (key, max_tokens) = max_tokens;
    if max_tokens == 0 && !score_only {
        return Err(ApiError::invalid(key, format!("{key} must be at least 1 (0 only scores the prompt, with echo)")));
    }
    if max_tokens > 100_000 {
        return Err(ApiError::invalid(key, format!("{key} must be at most 100000")));
    }
    let temperature = number("temperature")?.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::invalid("temperature", "temperature must be between 0 and 2"));
    }
    let top_p = number("top_p")?;
    if top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
        return Err(ApiError::invalid("top_p", "top_p must be in (0, 1]"));
    }
    let top_k = integer("top_k")?.map(|k| usize::try_from(k).unwrap_or(usize::MAX));
    if top_k == Some(0) {
        return Err(ApiError::invalid("top_k", "top_k must be at least 1"));
    }
    let repetition_penalty = number("repetition_penalty")?.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty.is_finite()) {
        return Err(ApiError::invalid(
            "repetition_penalty",
            "repetition_penalty must be a finite number > 0 (1 is off)",
        ));
    }
    let penalty = |key: &'static str| -> Result<f64, ApiError> {
        let alpha = number(key)?.unwrap_or(0.0);
        match (-2.0..=2.0).contains(&alpha) {
            true => Ok(alpha),
            false => Err(ApiError::invalid(key, format!("{key} must be between -2 and 2"))),
        }
    };
    let (frequency_penalty, presence_penalty) = (penalty("frequency_penalty")?, penalty("presence_penalty")?);
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
    let include_usage = match obj.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) if !stream && !o.is_empty() => {
            return Err(ApiError::invalid("stream_options", "stream_options needs stream = true"));
        }
        Some(Value::Object(o)) => match (o.get("include_usage"), o.keys().find(|k| *k != "include_usage")) {
            (_, Some(other)) => {
                return Err(ApiError::invalid("stream_options", format!("stream_options.{other} is not supported")));
            }
            (None | Some(Value::Null), None) => false,
            (Some(Value::Bool(b)), None) => *b,
            _ => return Err(ApiError::invalid("stream_options", "stream_options.include_usage must be a boolean")),
        },
        _ => return Err(ApiError::invalid("stream_options", "stream_options must be an object")),
    };
    let sampling = Sampling { temperature, top_k, top_p, repetition_penalty, frequency_penalty, presence_penalty };
    let seed = integer("seed")?.unwrap_or_else(fresh_seed);
    let request = GenerationRequest { prompt, max_new_tokens: max_tokens as usize, stop, seed, sampling };
    Ok((request, Output { stream, include_usage, n: n as usize, logprobs: None }))
}

/// A number of alternatives per token, at most [`MAX_TOP_LOGPROBS`].
fn top_count(obj: &Map<String, Value>, key: &'static str) -> Result<Option<usize>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64().filter(|&k| k <= MAX_TOP_LOGPROBS as u64) {
            Some(k) => Ok(Some(k as usize)),
            None => Err(ApiError::invalid(key, format!("{key} must be an integer from 0 to {MAX_TOP_LOGPROBS}"))),
        },
    }
}

/// Parses and checks a `POST /v1/completions` body against the served model `model_id`.
pub fn parse_completion(body: &[u8], model_id: &str) -> Result<Completion, ApiError> {
    let obj = object(body, model_id, &COMPLETION_FIELDS)?;
    let prompts = prompts(obj.get("prompt"))?;
    let echo = match obj.get("echo") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        _ => return Err(ApiError::invalid("echo", "echo must be a boolean")),
    };
    let (request, mut output) = generation_request(&obj, String::new(), &["max_tokens"], echo)?;
    output.logprobs = top_count(&obj, "logprobs")?;
    if prompts.len() * output.n > MAX_PROMPTS {
        return Err(ApiError::invalid("prompt", format!("prompts × n must be at most {MAX_PROMPTS}")));
    }
    Ok(Completion { prompts, request, output, echo, format: format(&ordered(body)?)? })
}

/// The body again as JSON that keeps its keys' order (a schema's properties, a chat's messages).
fn ordered(body: &[u8]) -> Result<Vec<(String, Json)>, ApiError> {
    match serde_json::from_slice(body).map_err(|e| ApiError::status(400, e.to_string()))? {
        Json::Map(fields) => Ok(fields),
        _ => Err(ApiError::status(400, "the body must be a JSON object")),
    }
}

/// `response_format` (`{"type": "text" | "json_object" | "json_schema", "json_schema": {"schema": ...}}`) or vLLM's
/// `structured_outputs` (`{"json": SCHEMA}`, `{"regex": PATTERN}` or `{"choice": [STRINGS]}`).
fn format(fields: &[(String, Json)]) -> Result<Option<Format>, ApiError> {
    let field = |fields: &'_ [(String, Json)], key: &str| fields.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    let bad = |param: &'static str, what: &str| ApiError::invalid(param, format!("{param}: {what}"));
    match (field(fields, "response_format"), field(fields, "structured_outputs")) {
        (None | Some(Json::Null), None | Some(Json::Null)) => Ok(None),
        (Some(Json::Map(f)), None | Some(Json::Null)) => match field(&f, "type") {
            Some(Json::Str(t)) if t == "text" => Ok(None),
            Some(Json::Str(t)) if t == "json_object" => Ok(Some(Format::JsonObject)),
            Some(Json::Str(t)) if t == "json_schema" => match field(&f, "json_schema") {
                Some(Json::Map(spec)) => match field(&spec, "schema") {
                    Some(schema @ (Json::Map(_) | Json::Bool(_))) => Ok(Some(Format::JsonSchema(schema))),
                    _ => Err(bad("response_format", "json_schema.schema must be a JSON schema object")),
                },
                _ => Err(bad("response_format", "json_schema must be an object with a schema")),
            },
            _ => Err(bad("response_format", "type must be \"text\", \"json_object\" or \"json_schema\"")),
        },
        (None | Some(Json::Null), Some(Json::Map(f))) => match f.as_slice() {
            [(k, schema @ (Json::Map(_) | Json::Bool(_)))] if k == "json" => {
                Ok(Some(Format::JsonSchema(schema.clone())))
            }
            [(k, Json::Str(pattern))] if k == "regex" => Ok(Some(Format::Regex(pattern.clone()))),
            [(k, Json::List(choices))] if k == "choice" && !choices.is_empty() => {
                let strings = choices.iter().map(|c| match c {
                    Json::Str(s) if !s.is_empty() => Ok(s.clone()),
                    _ => Err(bad("structured_outputs", "choice must be a list of non-empty strings")),
                });
                Ok(Some(Format::Choice(strings.collect::<Result<_, _>>()?)))
            }
            [(k, _)] if k == "grammar" => {
                Err(bad("structured_outputs", "grammar (GBNF) is not supported; give json, regex or choice"))
            }
            _ => Err(bad("structured_outputs", "must hold one of json (a schema), regex (a string), choice (strings)")),
        },
        (Some(_), None | Some(Json::Null)) => Err(bad("response_format", "must be an object")),
        (None | Some(Json::Null), Some(_)) => Err(bad("structured_outputs", "must be an object")),
        (Some(_), Some(_)) => Err(bad("response_format", "give response_format or structured_outputs, not both")),
    }
}

/// A completion's `prompt`: a string, token ids, or a list of either (at most [`MAX_PROMPTS`]).
fn prompts(value: Option<&Value>) -> Result<Vec<Prompt>, ApiError> {
    let bad = || {
        ApiError::invalid(
            "prompt",
            format!("prompt must be a string, a list of token ids, or a list of up to {MAX_PROMPTS} of either"),
        )
    };
    let tokens = |ids: &[Value]| -> Option<Prompt> {
        let ids = ids.iter().map(|id| id.as_u64().and_then(|id| u32::try_from(id).ok()));
        ids.collect::<Option<Vec<u32>>>().map(Prompt::Tokens)
    };
    let one = |v: &Value| match v {
        Value::String(s) => Some(Prompt::Text(s.clone())),
        Value::Array(ids) => tokens(ids),
        _ => None,
    };
    match value {
        Some(Value::String(s)) => Ok(vec![Prompt::Text(s.clone())]),
        Some(Value::Array(a)) if a.first().is_some_and(Value::is_number) => Ok(vec![tokens(a).ok_or_else(bad)?]),
        Some(Value::Array(a)) if (1..=MAX_PROMPTS).contains(&a.len()) => {
            a.iter().map(|v| one(v).ok_or_else(bad)).collect()
        }
        _ => Err(bad()),
    }
}

/// Parses and checks a `POST /v1/chat/completions` body against the served model `model_id`: every field is one
/// Ember implements, and every message has a known role and text content (a string, or a list of text parts, which
/// are joined).
pub fn parse_chat(body: &[u8], model_id: &str) -> Result<Chat, ApiError> {
    let obj = object(body, model_id, &CHAT_FIELDS)?;
    let (request, mut output) =
        generation_request(&obj, String::new(), &["max_completion_tokens", "max_tokens"], false)?;
    output.logprobs = match (obj.get("logprobs"), top_count(&obj, "top_logprobs")?) {
        (None | Some(Value::Null | Value::Bool(false)), None) => None,
        (None | Some(Value::Null | Value::Bool(false)), Some(_)) => {
            return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs = true"));
        }
        (Some(Value::Bool(true)), top) => Some(top.unwrap_or(0)),
        _ => return Err(ApiError::invalid("logprobs", "logprobs must be a boolean")),
    };
    // The messages again with their keys in the request's order, as the template's tojson shows them.
    let fields = ordered(body)?;
    let format = format(&fields)?;
    let tools = tools::parse(&fields).map_err(|e| ApiError::invalid(e.param, e.message))?;
    if tools.is_some() && format.is_some() {
        return Err(ApiError::invalid("response_format", "response_format and tools cannot be combined"));
    }
    let Some((_, Json::List(messages))) = fields.into_iter().find(|(k, _)| k == "messages") else {
        return Err(ApiError::invalid("messages", "messages must be a list of {role, content} objects"));
    };
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let messages = messages.into_iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<_, _>>()?;
    Ok(Chat { messages: Json::List(messages), request, output, format, tools })
}

/// Message `i` with its role checked and its content as one string.
fn message(i: usize, message: Json) -> Result<Json, ApiError> {
    let bad = |what: String| ApiError::invalid("messages", format!("messages[{i}]: {what}"));
    let Json::Map(mut entries) = message else { return Err(bad("must be an object".into())) };
    match entries.iter().find(|(k, _)| k == "role").map(|(_, v)| v) {
        Some(Json::Str(role)) if ROLES.contains(&role.as_str()) => {}
        Some(Json::Str(role)) => return Err(bad(format!("role {role:?} is not one of {}", ROLES.join(", ")))),
        _ => return Err(bad("has no role".into())),
    }
    // An assistant turn that called tools: its calls' arguments as objects, its content possibly null.
    if let Some((_, calls)) = entries.iter_mut().find(|(k, _)| k == "tool_calls") {
        tools::calls_as_objects(calls).map_err(|e| bad(format!("tool_calls: {e}")))?;
        if !entries.iter().any(|(k, _)| k == "content") {
            entries.push(("content".into(), Json::Null));
        }
    }
    let calls = entries.iter().any(|(k, _)| k == "tool_calls");
    let Some(content) = entries.iter_mut().find(|(k, _)| k == "content").map(|(_, v)| v) else {
        return Err(bad("has no content".into()));
    };
    match content {
        Json::Str(_) => {}
        Json::Null if calls => {}
        Json::List(parts) => {
            let mut text = String::new();
            for part in parts.iter() {
                let field = |key: &str| match part {
                    Json::Map(p) => p.iter().find(|(k, _)| k == key).map(|(_, v)| v),
                    _ => None,
                };
                match (field("type"), field("text")) {
                    (Some(Json::Str(kind)), Some(Json::Str(t))) if kind == "text" => text.push_str(t),
                    _ => {
                        return Err(bad(
                            "content parts other than {\"type\": \"text\", \"text\": ...} are not supported".into(),
                        ));
                    }
                }
            }
            *content = Json::Str(text);
        }
        _ => return Err(bad("content must be a string or a list of text parts".into())),
    }
    Ok(Json::Map(entries))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_requests_are_validated_with_openai_style_errors() {
        let ok =
            parse_completion(br#"{"model":"m","prompt":"hi","max_tokens":5,"stop":["\n"],"seed":3}"#, "m").unwrap();
        assert_eq!((ok.request.max_new_tokens, ok.request.stop.len(), ok.output.stream), (5, 1, false));
        let usage = parse_completion(br#"{"prompt":"x","stream":true,"stream_options":{"include_usage":true}}"#, "m");
        assert_eq!(usage.unwrap().output, Output { stream: true, include_usage: true, n: 1, logprobs: None });
        let two = parse_completion(br#"{"prompt":"x","n":2,"logprobs":3}"#, "m").unwrap().output;
        assert_eq!((two.n, two.logprobs), (2, Some(3)));
        assert_ne!(
            parse_completion(br#"{"prompt":"x"}"#, "m").unwrap().request.seed,
            parse_completion(br#"{"prompt":"x"}"#, "m").unwrap().request.seed,
            "a request without a seed gets a fresh one"
        );
        let err = |body: &[u8]| parse_completion(body, "m").unwrap_err();
        assert_eq!(err(b"{not json").status, 400);
        assert_eq!(err(br#"{"prompt":"x","stream_options":{"include_usage":true}}"#).param, Some("stream_options"));
        assert_eq!(err(br#"{"prompt":"x","stream":true,"stream_options":{"x":1}}"#).param, Some("stream_options"));
        assert_eq!(err(br#"{"model":"other","prompt":"x"}"#).status, 404);
        assert_eq!(err(br#"{"prompt":"x","temperature":3}"#).param, Some("temperature"));
        assert_eq!(err(br#"{"prompt":"x","max_tokens":0}"#).param, Some("max_tokens"));
        assert_eq!(err(br#"{"prompt":"x","top_k":0}"#).param, Some("top_k"));
        assert_eq!(err(br#"{"prompt":"x","n":17}"#).param, Some("n"));
        let suffix = err(br#"{"prompt":"x","suffix":"y"}"#);
        assert_eq!(suffix.code, Some("unsupported_parameter"));
        assert!(suffix.message.starts_with("`suffix` is not supported"), "{}", suffix.message);
        assert_eq!(err(br#"{"prompt":"x","logprobs":21}"#).param, Some("logprobs"));
        assert_eq!(err(br#"{"prompt":"x","presence_penalty":2.5}"#).param, Some("presence_penalty"));
        assert_eq!(err(br#"{"prompt":"x","repetition_penalty":-1}"#).param, Some("repetition_penalty"));
        let tuned = parse_completion(br#"{"prompt":"x","top_k":5,"repetition_penalty":1.3}"#, "m").unwrap();
        assert_eq!((tuned.request.sampling.top_k, tuned.request.sampling.repetition_penalty), (Some(5), 1.3));
        assert_eq!(err(br#"{"prompt":5}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"prompt":[]}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"prompt":[1,-2]}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"prompt":["a",[1],3]}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"prompt":["a","b","c","d","e"],"n":16}"#).param, Some("prompt"));
        assert_eq!(err(br#"{"prompt":"x","echo":1}"#).param, Some("echo"));
        let body = err(br#"{"prompt":"x","top_p":0}"#).body();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "top_p");
    }

    /// A prompt is text or token ids, alone or in a list; `echo` gives the prompt back, and with it `max_tokens` 0
    /// scores the prompt without generating.
    #[test]
    fn completions_take_token_prompts_lists_and_echo() {
        let parse = |body: &str| parse_completion(body.as_bytes(), "m").unwrap();
        assert_eq!(parse(r#"{"prompt":[5,6]}"#).prompts, [Prompt::Tokens(vec![5, 6])]);
        let many = parse(r#"{"prompt":["a",[7]],"echo":true,"max_tokens":0,"logprobs":1}"#);
        assert_eq!(many.prompts, [Prompt::Text("a".into()), Prompt::Tokens(vec![7])]);
        assert_eq!((many.echo, many.request.max_new_tokens, many.output.logprobs), (true, 0, Some(1)));
        let zero = parse_completion(br#"{"prompt":"x","max_tokens":0}"#, "m").unwrap_err();
        assert!(zero.message.contains("0 only scores the prompt, with echo"), "{}", zero.message);
    }

    #[test]
    fn chat_requests_name_what_they_cannot_take() {
        let ok = parse_chat(
            br#"{"model":"m","messages":[{"content":[{"type":"text","text":"a"},{"type":"text","text":"b"}],"role":"user"}],
                "max_completion_tokens":7,"stream":true}"#,
            "m",
        )
        .unwrap();
        assert_eq!((ok.request.max_new_tokens, ok.output.stream, ok.output.logprobs), (7, true, None));
        let user = r#""messages":[{"role":"user","content":"x"}]"#;
        let chat = |rest: &str| parse_chat(format!("{{{user},{rest}}}").as_bytes(), "m");
        assert_eq!(chat(r#""logprobs":true,"top_logprobs":5"#).unwrap().output.logprobs, Some(5));
        assert_eq!(chat(r#""logprobs":true"#).unwrap().output.logprobs, Some(0));
        assert_eq!(chat(r#""top_logprobs":5"#).unwrap_err().param, Some("top_logprobs"));
        assert_eq!(chat(r#""logprobs":1"#).unwrap_err().param, Some("logprobs"));
        let Json::List(messages) = &ok.messages else { panic!("a list") };
        assert_eq!(
            messages[0],
            Json::Map(vec![("content".into(), Json::Str("ab".into())), ("role".into(), Json::Str("user".into()))])
        );
        let err = |body: &[u8]| parse_chat(body, "m").unwrap_err();
        let functions = err(br#"{"messages":[{"role":"user","content":"x"}],"functions":[]}"#);
        assert_eq!((functions.status, functions.code), (400, Some("unsupported_parameter")));
        assert!(functions.message.starts_with("`functions` is not supported"), "{}", functions.message);
        let both = err(br#"{"messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_object"},
            "tools":[{"type":"function","function":{"name":"f"}}]}"#);
        assert_eq!(both.param, Some("response_format"));
        let called = parse_chat(
            br#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","tool_calls":[{"id":"c","type":"function",
                "function":{"name":"f","arguments":"{\"a\": 1}"}}]},{"role":"tool","tool_call_id":"c","content":"2"}]}"#,
            "m",
        )
        .unwrap();
        let Json::List(turns) = &called.messages else { panic!("a list") };
        let Json::Map(assistant) = &turns[1] else { panic!("an object") };
        assert_eq!(assistant.iter().find(|(k, _)| k == "content").map(|(_, v)| v), Some(&Json::Null));
        assert_eq!(err(br#"{"messages":[]}"#).param, Some("messages"));
        assert!(err(br#"{"messages":[{"role":"wizard","content":"x"}]}"#).message.contains("role \"wizard\""));
        assert!(err(br#"{"messages":[{"role":"user"}]}"#).message.contains("has no content"));
        assert!(
            err(br#"{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}"#)
                .message
                .contains("content parts other than")
        );
        assert_eq!(
            err(br#"{"messages":[{"role":"user","content":"x"}],"max_completion_tokens":0}"#).param,
            Some("max_completion_tokens")
        );
    }
}
