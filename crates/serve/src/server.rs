//! `ember serve`'s routes: OpenAI completions and chat completions (whole or streamed as server-sent events), the
//! model list, health, tokenize/detokenize, Prometheus metrics and the playground page. A request is parsed here
//! (a chat rendered through the model's template), admitted or turned away (429) by the number of sequences running
//! and queued, and handed as one [`Job`] per choice to the scheduler, which owns the model on its own thread.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ember_formats::chat::{ChatError, ChatTemplate, RenderContext};
use ember_formats::grammar::Grammar;
use ember_formats::tokenizer;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde_json::{Value, json};
use tokenizers::Tokenizer;
use tokio::sync::mpsc as channel;
use tower_http::cors::{AllowOrigin, CorsLayer};

use crate::constrain::{self, Compiled};
use crate::tools::{Family, Plan};

mod reply;
use crate::metrics::Metrics;
use crate::openai::{self, Api, ApiError, Format, Output, Prompt};
use crate::scheduler::Job;
use ember_formats::request::GenerationRequest;
use reply::{Choice, EventStream, Reply};

/// What `/v1/chat/completions` needs of the model: its chat template and the special tokens the template names.
pub struct ChatPrompt {
    pub template: ChatTemplate,
    pub bos_token: String,
    pub eos_token: String,
}

/// The loaded model as the request handlers see it.
pub struct Served {
    /// None when the model has no chat template: chat requests get a 400 saying so.
    pub chat: Option<ChatPrompt>,
    /// For `/tokenize`, `/detokenize` and logprobs.
    pub tokenizer: Tokenizer,
    /// The model's context, in tokens.
    pub context: usize,
}

/// How the server treats requests.
#[derive(Clone, Debug)]
pub struct Options {
    /// With a key, every route but `/` and `/health` needs it, as `Authorization: Bearer KEY` or `X-Api-Key: KEY`.
    pub api_key: Option<String>,
    /// Origins a browser page may call the API from (`*`: any); none turns CORS off.
    pub cors_origins: Vec<String>,
    /// Sequences generated together (the scheduler's batch).
    pub max_batch: usize,
    /// Sequences that may wait for a place in the batch; a request beyond that is answered 429 at once.
    pub max_queue: usize,
    /// Bytes of a request body (413 beyond).
    pub body_limit: usize,
    /// Time for a request body to arrive (408 after).
    pub body_timeout: Duration,
    /// Time for a whole generation, from the request's arrival: a request still running then ends with a 504, or
    /// an error event when streaming, and its sequences are freed.
    pub deadline: Duration,
}

impl Options {
    /// Defaults for a batch of `max_batch`: a queue of four batches, 1 MiB bodies arriving within 30 s, and 10
    /// minutes per generation.
    pub fn new(max_batch: usize) -> Self {
        Self {
            api_key: None,
            cors_origins: Vec::new(),
            max_batch,
            max_queue: 4 * max_batch,
            body_limit: 1 << 20,
            body_timeout: Duration::from_secs(30),
            deadline: Duration::from_secs(600),
        }
    }
}

/// The server's state: the model once it has loaded, the scheduler's job queue, metrics, and the admission count.
pub struct App {
    id: String,
    served: OnceLock<Served>,
    jobs: Sender<Job>,
    metrics: Arc<Metrics>,
    options: Options,
    /// Sequences admitted and not yet finished (running or queued).
    admitted: AtomicUsize,
    next_id: AtomicU64,
    /// Grammars compiled for earlier requests, with their masks, by what they were compiled from.
    grammars: Mutex<HashMap<String, Arc<Compiled>>>,
}

/// The most compiled grammars the server keeps; past it the cache starts again.
const MAX_GRAMMARS: usize = 64;

impl App {
    /// A server for the model `id` that sends its jobs to `jobs`; it answers 503 until [`App::ready`].
    pub fn new(id: String, jobs: Sender<Job>, metrics: Arc<Metrics>, options: Options) -> Arc<Self> {
        Arc::new(Self {
            id,
            served: OnceLock::new(),
            jobs,
            metrics,
            options,
            admitted: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            grammars: Mutex::new(HashMap::new()),
        })
    }

    /// The compiled grammar of `format`, from the cache when an earlier request asked for the same; a format that
    /// cannot be compiled is a 400 naming its part.
    fn grammar(&self, format: &Format) -> Result<Arc<Compiled>, ApiError> {
        let param = match format {
            Format::JsonObject | Format::JsonSchema(_) => "response_format",
            _ => "structured_outputs",
        };
        self.cached(format!("{format:?}"), param, || constrain::compile(format))
    }

    /// The grammar a reply must follow for `plan`'s tools: None unless a call is required or named.
    fn tool_grammar(&self, plan: &Plan) -> Result<Option<Arc<Compiled>>, ApiError> {
        let Some(grammar) = plan.grammar() else { return Ok(None) };
        self.cached(format!("{plan:?}"), "tools", || grammar).map(Some)
    }

    /// The grammar cached under `key`, else compiled (an error is a 400 naming `param`) and cached.
    fn cached(
        &self,
        key: String,
        param: &'static str,
        compile: impl FnOnce() -> Result<Grammar, String>,
    ) -> Result<Arc<Compiled>, ApiError> {
        if let Some(compiled) = self.grammars.lock().expect("the grammar cache").get(&key) {
            return Ok(compiled.clone());
        }
        let started = Instant::now();
        let compiled = Compiled::new(compile().map_err(|e| ApiError::invalid(param, e))?);
        self.metrics.grammar(started.elapsed().as_secs_f64());
        let mut grammars = self.grammars.lock().expect("the grammar cache");
        if grammars.len() >= MAX_GRAMMARS {
            grammars.clear();
        }
        grammars.insert(key, compiled.clone());
        Ok(compiled)
    }

    /// The model has loaded: requests are served from now on.
    pub fn ready(&self, served: Served) {
        let _ = self.served.set(served);
    }

    fn loaded(&self) -> Result<&Served, ApiError> {
        self.served.get().ok_or_else(|| ApiError::status(503, "the model is still loading"))
    }

    /// Admits `n` sequences when they fit in the batch and the queue.
    fn admit(self: &Arc<Self>, n: usize) -> Result<Admission, ApiError> {
        let capacity = self.options.max_batch + self.options.max_queue;
        if n > capacity {
            return Err(ApiError::invalid("n", format!("n is more than the {capacity} sequences this server takes")));
        }
        self.admitted
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| (a + n <= capacity).then_some(a + n))
            .map_err(|_| ApiError {
                status: 429,
                message: format!("the server is busy ({capacity} sequences running or queued); retry shortly"),
                param: None,
                code: Some("rate_limit_exceeded"),
            })?;
        Ok(Admission { app: self.clone(), n })
    }
}

/// Admitted sequences, released when the response ends (or its client leaves).
struct Admission {
    app: Arc<App>,
    n: usize,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.app.admitted.fetch_sub(self.n, Ordering::SeqCst);
    }
}

type Shared = State<Arc<App>>;

/// Every route, with the API key check, response counting and (when origins are given) CORS.
pub fn router(app: Arc<App>) -> Result<Router, String> {
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/tokenizer_info", get(tokenizer_info))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize));
    let router = Router::new()
        .route("/", get(playground))
        .route("/health", get(health))
        .merge(api)
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .layer(middleware::from_fn_with_state(app.clone(), count))
        .with_state(app.clone());
    Ok(match cors(&app.options.cors_origins)? {
        Some(layer) => router.layer(layer),
        None => router,
    })
}

/// CORS for `origins`: browsers may call the API (with the key's headers) from those pages.
fn cors(origins: &[String]) -> Result<Option<CorsLayer>, String> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values = origins.iter().map(|o| HeaderValue::from_str(o).map_err(|_| format!("--cors-origin {o:?}")));
        AllowOrigin::list(values.collect::<Result<Vec<_>, _>>()?)
    };
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST])
            .allow_headers([header::AUTHORIZATION, header::CONTENT_TYPE, HeaderName::from_static("x-api-key")])
            .max_age(Duration::from_secs(3600)),
    ))
}

fn json_response(status: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

/// An OpenAI-style error; a 429 or 503 says when to retry.
fn error_response(e: ApiError) -> Response {
    let mut response = json_response(e.status, &e.body());
    if matches!(e.status, 429 | 503) {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    response
}

fn reply(result: Result<Value, ApiError>) -> Response {
    result.map_or_else(error_response, |body| json_response(200, &body))
}

/// Counts every response by status for `/metrics`.
async fn count(State(app): Shared, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    app.metrics.response(response.status().as_u16());
    response
}

/// Whether `given` equals `key`, in time that depends on their lengths only, not on where they differ.
fn same_key(given: &[u8], key: &[u8]) -> bool {
    let byte = |s: &[u8], i: usize| s.get(i).copied().unwrap_or(0);
    let differ = (0..given.len().max(key.len()))
        .fold(given.len() ^ key.len(), |acc, i| acc | usize::from(byte(given, i) ^ byte(key, i)));
    differ == 0
}

/// Whether the headers carry the server's key (always, without one).
fn authorized(headers: &HeaderMap, key: Option<&str>) -> bool {
    let Some(key) = key else { return true };
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let bearer = header("authorization").and_then(|v| v.strip_prefix("Bearer "));
    let given = bearer.or_else(|| header("x-api-key")).unwrap_or_default();
    same_key(given.as_bytes(), key.as_bytes())
}

async fn authorize(State(app): Shared, request: Request, next: Next) -> Response {
    if authorized(request.headers(), app.options.api_key.as_deref()) {
        return next.run(request).await;
    }
    error_response(ApiError {
        status: 401,
        message: "a valid API key is needed (Authorization: Bearer KEY, or X-Api-Key: KEY)".into(),
        param: None,
        code: Some("invalid_api_key"),
    })
}

async fn not_found(request: Request) -> Response {
    error_response(ApiError::status(404, format!("no route {}", request.uri().path())))
}

async fn not_allowed(request: Request) -> Response {
    error_response(ApiError::status(405, format!("{} is not allowed on {}", request.method(), request.uri().path())))
}

/// The playground at `/`: a chat box streaming from `/v1/chat/completions`, plain HTML and JavaScript.
const PLAYGROUND: &str = include_str!("playground.html");

async fn playground() -> Response {
    ([(header::CONTENT_TYPE, "text/html; charset=utf-8")], PLAYGROUND).into_response()
}

/// 200 with the running and queued sequences once the model has loaded, 503 before.
async fn health(State(app): Shared) -> Response {
    if app.served.get().is_none() {
        let mut response = json_response(503, &json!({"status": "loading"}));
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return response;
    }
    let (running, queued) = (app.metrics.running.load(Ordering::SeqCst), app.metrics.queued.load(Ordering::SeqCst));
    json_response(200, &json!({"status": "ok", "active_sequences": running, "queued_sequences": queued}))
}

async fn metrics(State(app): Shared) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], app.metrics.render()).into_response()
}

async fn models(State(app): Shared) -> Response {
    reply(app.loaded().map(|served| {
        json!({"object": "list", "data": [{"id": app.id, "object": "model", "created": 0, "owned_by": "ember",
                                           "max_model_len": served.context}]})
    }))
}

/// The body, at most `body_limit` bytes (413) arriving within `body_timeout` (408).
async fn read_body(body: Body, options: &Options) -> Result<Bytes, ApiError> {
    let limited = Limited::new(body, options.body_limit);
    match tokio::time::timeout(options.body_timeout, limited.collect()).await {
        Err(_) => Err(ApiError::status(408, format!("the body did not arrive within {:?}", options.body_timeout))),
        Ok(Err(e)) if e.is::<LengthLimitError>() => {
            Err(ApiError::status(413, format!("the body is larger than {} bytes", options.body_limit)))
        }
        Ok(Err(e)) => Err(ApiError::status(400, format!("the body could not be read: {e}"))),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
    }
}

/// `POST /tokenize` `{"prompt": TEXT, "add_special_tokens": BOOL}` → the token ids, as generation encodes the prompt
/// (without the tokenizer's BOS when `add_special_tokens` is false).
async fn tokenize(State(app): Shared, body: Body) -> Response {
    let result = async {
        let served = app.loaded()?;
        let json = parse_json(&read_body(body, &app.options).await?)?;
        let prompt = json["prompt"].as_str().ok_or_else(|| ApiError::invalid("prompt", "prompt must be a string"))?;
        let special = match &json["add_special_tokens"] {
            Value::Null => true,
            Value::Bool(b) => *b,
            _ => return Err(ApiError::invalid("add_special_tokens", "add_special_tokens must be a boolean")),
        };
        let ids = tokenizer::encode_with(&served.tokenizer, prompt, special)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
        Ok(json!({"tokens": ids, "count": ids.len(), "max_model_len": served.context}))
    };
    reply(result.await)
}

/// `GET /tokenizer_info`: the special tokens, chat template and context, as vLLM describes its tokenizer (what
/// lm-evaluation-harness's remote tokenizer reads).
async fn tokenizer_info(State(app): Shared) -> Response {
    reply(app.loaded().map(|served| {
        let ends = tokenizer::end_tokens(&served.tokenizer);
        let end = ends.first().and_then(|&id| tokenizer::decode(&served.tokenizer, &[id]).ok());
        let chat = served.chat.as_ref();
        json!({
            "eos_token": chat.map(|c| c.eos_token.clone()).or(end),
            "bos_token": chat.map(|c| c.bos_token.clone()),
            "chat_template": chat.map(|c| c.template.source()),
            "model_max_length": served.context,
        })
    }))
}

/// `POST /detokenize` `{"tokens": [ids]}` → the text.
async fn detokenize(State(app): Shared, body: Body) -> Response {
    let result = async {
        let served = app.loaded()?;
        let json = parse_json(&read_body(body, &app.options).await?)?;
        let vocab = tokenizer::vocab_size(&served.tokenizer) as u64;
        let ids: Vec<u32> = json["tokens"]
            .as_array()
            .and_then(|ids| ids.iter().map(|id| id.as_u64().filter(|&id| id < vocab).map(|id| id as u32)).collect())
            .ok_or_else(|| ApiError::invalid("tokens", format!("tokens must be a list of ids below {vocab}")))?;
        let text =
            tokenizer::decode(&served.tokenizer, &ids).map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
        Ok(json!({"prompt": text}))
    };
    reply(result.await)
}

fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::status(400, format!("invalid JSON body: {e}")))
}

async fn completions(State(app): Shared, body: Body) -> Response {
    run_request(app, body, Api::Completions).await.unwrap_or_else(error_response)
}

async fn chat_completions(State(app): Shared, body: Body) -> Response {
    run_request(app, body, Api::Chat).await.unwrap_or_else(error_response)
}

/// A chat request's generation, its prompt the model's template rendered over the messages (with the assistant's
/// turn opened). The template's own refusal (`raise_exception`) is a 400.
fn chat_request(body: &[u8], id: &str, served: &Served) -> Result<Parsed, ApiError> {
    let chat = openai::parse_chat(body, id)?;
    let Some(prompt) = &served.chat else {
        return Err(ApiError::status(
            400,
            "this model has no chat template (ember serve --chat-template FILE gives it one); use /v1/completions",
        ));
    };
    // Tools: listed by a template that renders them, else described in the system message.
    let plan = chat.tools.map(|tools| Arc::new(Plan { family: Family::of(prompt.template.source()), tools }));
    let messages = match &plan {
        Some(plan) if !plan.family.renders_tools() => plan.with_description(&chat.messages),
        _ => chat.messages,
    };
    let context = RenderContext {
        bos_token: &prompt.bos_token,
        eos_token: &prompt.eos_token,
        add_generation_prompt: true,
        now: chrono::Local::now().naive_local(),
        tools: plan.as_ref().filter(|p| p.family.renders_tools()).map(|p| &p.tools.list),
    };
    let rendered = prompt.template.render(&messages, &context).map_err(|e| match e {
        ChatError::Refused(message) => ApiError::invalid("messages", message),
        other => ApiError::invalid("messages", other.to_string()),
    })?;
    let request = GenerationRequest { prompt: rendered, ..chat.request };
    Ok((vec![Prompted { request, tokens: None, echo: None }], chat.output, chat.format, plan))
}

/// One prompt of a request: the generation, the prompt as token ids when given so, and with `echo` its text to give
/// back.
struct Prompted {
    request: GenerationRequest,
    tokens: Option<Vec<u32>>,
    echo: Option<String>,
}

/// A request's prompts, the shape of its response, the format its text must follow, and its tools.
type Parsed = (Vec<Prompted>, Output, Option<Format>, Option<Arc<Plan>>);

/// A completion request's prompts, each with the request's settings.
fn completion_prompts(body: &[u8], id: &str, served: &Served) -> Result<Parsed, ApiError> {
    let completion = openai::parse_completion(body, id)?;
    let prompts = completion.prompts.into_iter().map(|prompt| {
        let (text, tokens) = match prompt {
            Prompt::Text(text) => (text, None),
            Prompt::Tokens(ids) => (String::new(), Some(ids)),
        };
        let echo = completion.echo.then(|| match &tokens {
            Some(ids) => tokenizer::decode(&served.tokenizer, ids).unwrap_or_default(),
            None => text.clone(),
        });
        Prompted { request: GenerationRequest { prompt: text, ..completion.request.clone() }, tokens, echo }
    });
    Ok((prompts.collect(), completion.output, completion.format, None))
}

/// Parses, admits and runs a request: `n` jobs per prompt (choice prompt · n + i seeded with seed + i), answered
/// whole or streamed. The first event decides the status, so that a prompt the model cannot take is still a 4xx when
/// streaming.
async fn run_request(app: Arc<App>, body: Body, api: Api) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let served = app.loaded()?;
    let body = read_body(body, &app.options).await?;
    let (prompts, output, format, tools) = match api {
        Api::Completions => completion_prompts(&body, &app.id, served)?,
        Api::Chat => chat_request(&body, &app.id, served)?,
    };
    let constraint = match (&format, &tools) {
        (Some(format), _) => Some(app.grammar(format)?),
        (None, Some(plan)) => app.tool_grammar(plan)?,
        (None, None) => None,
    };
    let admission = app.admit(prompts.len() * output.n)?;
    let (events, received) = channel::unbounded_channel();
    let mut choices = Vec::new();
    for prompt in prompts {
        for i in 0..output.n {
            let request =
                GenerationRequest { seed: prompt.request.seed.wrapping_add(i as u64), ..prompt.request.clone() };
            let job = Job {
                request,
                tokens: prompt.tokens.clone(),
                choice: choices.len(),
                logprobs: output.logprobs,
                echo: prompt.echo.is_some(),
                constraint: constraint.clone(),
                events: events.clone(),
            };
            app.jobs.send(job).map_err(|_| ApiError::status(503, "the server is shutting down"))?;
            choices.push(Choice::new(prompt.echo.clone(), i == 0));
        }
    }
    let mut response = Reply {
        id: api.id(app.next_id.fetch_add(1, Ordering::Relaxed)),
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        api,
        output,
        events: received,
        deadline: tokio::time::Instant::from_std(arrived + app.options.deadline),
        arrived,
        first_token: None,
        choices,
        tools,
        _admission: admission,
        app: app.clone(),
    };
    let first = response.next().await?;
    if !output.stream {
        return response.whole(first).await.map(|body| json_response(200, &body));
    }
    let (frames, body) = channel::channel(16);
    tokio::spawn(response.stream(first, frames));
    let headers = [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")];
    Ok((headers, Body::new(EventStream(body))).into_response())
}
