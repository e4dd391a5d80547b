//! `ember serve`: an OpenAI-compatible completions and chat completions server. Each connection gets a thread that
//! parses the request (rendering a chat through the model's template) and hands a [`Job`] to the scheduler, which
//! owns the model; streamed responses are server-sent events.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ember_formats::chat::{ChatError, ChatTemplate, Context};
use ember_formats::tokenizer;
use serde_json::json;
use tokenizers::Tokenizer;

use crate::http::{self, Request};
use crate::metrics::Metrics;
use crate::openai::{self, Api, ApiError, Streaming};
use crate::sampling::SampleConfig;
use crate::scheduler::{Event, Job};

/// What `/v1/chat/completions` needs of the model: its chat template and the special tokens the template names.
pub struct ChatPrompt {
    pub template: ChatTemplate,
    pub bos_token: String,
    pub eos_token: String,
}

/// The served model as the request handlers see it.
pub struct Served {
    pub id: String,
    /// None when the model has no chat template: chat requests get a 400 saying so.
    pub chat: Option<ChatPrompt>,
    /// For `/tokenize` and `/detokenize`.
    pub tokenizer: Tokenizer,
    /// The model's context, in tokens.
    pub context: usize,
    /// With a key, every route but `/health` needs it, as `Authorization: Bearer KEY` or `X-Api-Key: KEY`.
    pub api_key: Option<String>,
}

/// A whole response of `content_type`, counted in `metrics`.
fn reply_text(
    stream: &TcpStream,
    metrics: &Metrics,
    status: u16,
    content_type: &str,
    body: &str,
) -> std::io::Result<()> {
    metrics.response(status);
    http::respond_text(stream, status, content_type, body)
}

/// A whole JSON response, counted in `metrics`.
fn reply(stream: &TcpStream, metrics: &Metrics, status: u16, body: &serde_json::Value) -> std::io::Result<()> {
    reply_text(stream, metrics, status, "application/json", &body.to_string())
}

/// Whether `given` equals `key`, in time that depends on their lengths only, not on where they differ.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    let byte = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let differ = (0..given.len().max(key.len()))
        .fold(given.len() ^ key.len(), |acc, i| acc | usize::from(byte(given, i) ^ byte(key, i)));
    differ == 0
}

/// Whether the request carries the server's key (always, without one).
fn authorized(request: &Request, key: Option<&str>) -> bool {
    let Some(key) = key else { return true };
    let bearer = request.header("authorization").and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer.or_else(|| request.header("x-api-key")).unwrap_or_default();
    same_key(given.as_bytes(), key.as_bytes())
}

/// `POST /tokenize` `{"prompt": TEXT}` → the token ids, as generation encodes the prompt; `POST /detokenize`
/// `{"tokens": [ids]}` → the text.
fn tokens(path: &str, body: &[u8], served: &Served) -> Result<serde_json::Value, ApiError> {
    let json: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| ApiError::status(400, format!("invalid JSON body: {e}")))?;
    if path == "/tokenize" {
        let prompt = json["prompt"].as_str().ok_or_else(|| ApiError::invalid("prompt", "prompt must be a string"))?;
        let ids =
            tokenizer::encode(&served.tokenizer, prompt).map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
        return Ok(json!({"tokens": ids, "count": ids.len(), "max_model_len": served.context}));
    }
    let vocab = tokenizer::vocab_size(&served.tokenizer) as u64;
    let ids: Vec<u32> = json["tokens"]
        .as_array()
        .and_then(|ids| ids.iter().map(|id| id.as_u64().filter(|&id| id < vocab).map(|id| id as u32)).collect())
        .ok_or_else(|| ApiError::invalid("tokens", format!("tokens must be a list of ids below {vocab}")))?;
    let text = tokenizer::decode(&served.tokenizer, &ids).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
    Ok(json!({"prompt": text}))
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The playground at `/`: a chat box streaming from `/v1/chat/completions`, plain HTML and JavaScript.
const PLAYGROUND: &str = include_str!("playground.html");

/// Accepts connections on `listener` until `stop` is set, then lets every open request finish. Dropping the last
/// job sender (when this returns) lets the scheduler drain and return too.
pub fn accept(
    listener: TcpListener,
    served: Arc<Served>,
    jobs: Sender<Job>,
    metrics: Arc<Metrics>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut handlers = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                let (served, jobs, metrics) = (served.clone(), jobs.clone(), metrics.clone());
                handlers.push(thread::spawn(move || handle(stream, &served, &jobs, &metrics)));
                handlers.retain(|h| !h.is_finished());
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(10)),
            Err(e) => return Err(e),
        }
    }
    drop(jobs);
    for h in handlers {
        let _ = h.join();
    }
    Ok(())
}

fn handle(stream: TcpStream, served: &Served, jobs: &Sender<Job>, metrics: &Metrics) {
    let request = match http::read_request(&stream) {
        Ok(r) => r,
        Err(e) => {
            let _ = reply(&stream, metrics, 400, &ApiError::status(400, e.to_string()).body());
            return;
        }
    };
    let _ = route(&stream, request, served, jobs, metrics);
}

fn route(
    stream: &TcpStream,
    request: Request,
    served: &Served,
    jobs: &Sender<Job>,
    metrics: &Metrics,
) -> std::io::Result<()> {
    let model_id = served.id.as_str();
    // The page and the health check are public; the page asks for the key and sends it with its API calls.
    let public = matches!(request.path.as_str(), "/health" | "/");
    if !public && !authorized(&request, served.api_key.as_deref()) {
        let e = ApiError {
            status: 401,
            message: "a valid API key is needed (Authorization: Bearer KEY, or X-Api-Key: KEY)".into(),
            param: None,
            code: Some("invalid_api_key"),
        };
        return reply(stream, metrics, 401, &e.body());
    }
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/health") => {
            let running = metrics.running.load(Ordering::SeqCst);
            reply(stream, metrics, 200, &json!({"status": "ok", "active_sequences": running}))
        }
        ("GET", "/") => reply_text(stream, metrics, 200, "text/html; charset=utf-8", PLAYGROUND),
        ("GET", "/metrics") => {
            // Counted before rendering, so that a scrape includes itself.
            metrics.response(200);
            http::respond_text(stream, 200, "text/plain; version=0.0.4; charset=utf-8", &metrics.render())
        }
        ("GET", "/v1/models") => reply(
            stream,
            metrics,
            200,
            &json!({"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "ember"}]}),
        ),
        ("POST", "/v1/completions") => match openai::parse_completion(&request.body, model_id) {
            Ok(c) => respond(stream, metrics, Api::Completions, c.settings, c.streaming, model_id, jobs),
            Err(e) => reply(stream, metrics, e.status, &e.body()),
        },
        ("POST", "/v1/chat/completions") => match chat_settings(&request.body, served) {
            Ok((settings, streaming)) => respond(stream, metrics, Api::Chat, settings, streaming, model_id, jobs),
            Err(e) => reply(stream, metrics, e.status, &e.body()),
        },
        ("POST", path @ ("/tokenize" | "/detokenize")) => match tokens(path, &request.body, served) {
            Ok(body) => reply(stream, metrics, 200, &body),
            Err(e) => reply(stream, metrics, e.status, &e.body()),
        },
        (
            _,
            "/health"
            | "/metrics"
            | "/v1/models"
            | "/v1/completions"
            | "/v1/chat/completions"
            | "/tokenize"
            | "/detokenize",
        ) => {
            let e = ApiError::status(405, format!("{} is not allowed here", request.method));
            reply(stream, metrics, 405, &e.body())
        }
        (_, path) => reply(stream, metrics, 404, &ApiError::status(404, format!("no route {path}")).body()),
    }
}

/// A chat request's sampling settings, its prompt the model's template rendered over the messages (with the
/// assistant's turn opened). The template's own refusal (`raise_exception`) is a 400.
fn chat_settings(body: &[u8], served: &Served) -> Result<(SampleConfig, Streaming), ApiError> {
    let chat = openai::parse_chat(body, &served.id)?;
    let Some(prompt) = &served.chat else {
        return Err(ApiError::status(
            400,
            "this model has no chat template (ember serve --chat-template FILE gives it one); use /v1/completions",
        ));
    };
    let context = Context {
        bos_token: &prompt.bos_token,
        eos_token: &prompt.eos_token,
        add_generation_prompt: true,
        now: chrono::Local::now().naive_local(),
    };
    let rendered = prompt.template.render(&chat.messages, &context).map_err(|e| match e {
        ChatError::Refused(message) => ApiError::invalid("messages", message),
        other => ApiError::invalid("messages", other.to_string()),
    })?;
    Ok((SampleConfig { prompt: rendered, ..chat.settings }, chat.streaming))
}

/// Runs `settings` on the scheduler and answers in `api`'s format, whole or as server-sent events.
fn respond(
    stream: &TcpStream,
    metrics: &Metrics,
    api: Api,
    settings: SampleConfig,
    streaming: Streaming,
    model_id: &str,
    jobs: &Sender<Job>,
) -> std::io::Result<()> {
    let (events, received) = mpsc::channel();
    if jobs.send(Job { settings, events }).is_err() {
        return reply(stream, metrics, 503, &ApiError::status(503, "the server is shutting down").body());
    }
    let queued = Instant::now();
    let mut first_text: Option<Instant> = None;
    let id = api.id(NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut text = String::new();
    let mut started = false;
    // The stream's head (and a chat's role chunk) goes out with the first text, so that an error before any text
    // can still be a 4xx.
    let start = |started: &mut bool| -> std::io::Result<()> {
        if !*started {
            metrics.response(200);
            http::start_events(stream)?;
            if let Some(first) = api.first_chunk(&id, model_id, created) {
                http::send_event(stream, &first.to_string())?;
            }
            *started = true;
        }
        Ok(())
    };
    for event in received {
        if matches!(event, Event::Text(_)) && first_text.is_none() {
            first_text = Some(Instant::now());
            metrics.first_token(queued.elapsed().as_secs_f64());
        }
        match event {
            Event::Error(e) => {
                let e = ApiError::from(e);
                return if started { Ok(()) } else { reply(stream, metrics, e.status, &e.body()) };
            }
            Event::Text(piece) if streaming.stream => {
                start(&mut started)?;
                // A write error means the client left: returning drops the receiver, and the scheduler frees the sequence.
                http::send_event(stream, &api.body(&id, model_id, created, &piece, None, true).to_string())?;
            }
            Event::Text(piece) => text.push_str(&piece),
            Event::Done { finish, prompt_tokens, completion_tokens } => {
                metrics.tokens(prompt_tokens, completion_tokens);
                if let Some(first) = first_text.filter(|_| completion_tokens > 1) {
                    metrics.per_token(first.elapsed().as_secs_f64() / (completion_tokens - 1) as f64);
                }
                let usage = openai::usage(prompt_tokens, completion_tokens);
                if !streaming.stream {
                    let mut body = api.body(&id, model_id, created, &text, Some(finish), false);
                    body["usage"] = usage;
                    return reply(stream, metrics, 200, &body);
                }
                start(&mut started)?;
                http::send_event(stream, &api.body(&id, model_id, created, "", Some(finish), true).to_string())?;
                if streaming.include_usage {
                    let mut last = api.body(&id, model_id, created, "", None, true);
                    last["choices"] = json!([]);
                    last["usage"] = usage;
                    http::send_event(stream, &last.to_string())?;
                }
                return http::send_event(stream, "[DONE]");
            }
        }
    }
    let e = ApiError::status(500, "generation ended without a result");
    if started { Ok(()) } else { reply(stream, metrics, 500, &e.body()) }
}
