//! `ember serve`: an OpenAI-compatible completions server. Each connection gets a thread that parses the request and
//! hands a [`Job`] to the scheduler, which owns the model; streamed responses are server-sent events.

use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Sender};
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;

use crate::http::{self, Request};
use crate::openai::{self, ApiError};
use crate::scheduler::{Event, Job};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Accepts connections on `listener` until `stop` is set, then lets every open request finish. Dropping the last
/// job sender (when this returns) lets the scheduler drain and return too.
pub fn accept(
    listener: TcpListener,
    model_id: String,
    jobs: Sender<Job>,
    active: Arc<AtomicUsize>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    let mut handlers = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                let (model_id, jobs, active) = (model_id.clone(), jobs.clone(), active.clone());
                handlers.push(thread::spawn(move || handle(stream, &model_id, &jobs, &active)));
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

fn handle(stream: TcpStream, model_id: &str, jobs: &Sender<Job>, active: &AtomicUsize) {
    let request = match http::read_request(&stream) {
        Ok(r) => r,
        Err(e) => {
            let _ = http::respond_json(
                &stream,
                400,
                &ApiError { status: 400, message: e.to_string(), param: None, code: None }.body(),
            );
            return;
        }
    };
    let _ = route(&stream, request, model_id, jobs, active);
}

fn route(
    stream: &TcpStream,
    request: Request,
    model_id: &str,
    jobs: &Sender<Job>,
    active: &AtomicUsize,
) -> std::io::Result<()> {
    match (request.method.as_str(), request.path.as_str()) {
        ("GET", "/health") => {
            http::respond_json(stream, 200, &json!({"status": "ok", "active_sequences": active.load(Ordering::SeqCst)}))
        }
        ("GET", "/v1/models") => http::respond_json(
            stream,
            200,
            &json!({"object": "list", "data": [{"id": model_id, "object": "model", "created": 0, "owned_by": "ember"}]}),
        ),
        ("POST", "/v1/completions") => complete(stream, &request.body, model_id, jobs),
        (_, "/health" | "/v1/models" | "/v1/completions") => {
            let e = ApiError {
                status: 405,
                message: format!("{} is not allowed here", request.method),
                param: None,
                code: None,
            };
            http::respond_json(stream, 405, &e.body())
        }
        (_, path) => {
            let e = ApiError { status: 404, message: format!("no route {path}"), param: None, code: None };
            http::respond_json(stream, 404, &e.body())
        }
    }
}

fn complete(stream: &TcpStream, body: &[u8], model_id: &str, jobs: &Sender<Job>) -> std::io::Result<()> {
    let completion = match openai::parse_completion(body, model_id) {
        Ok(c) => c,
        Err(e) => return http::respond_json(stream, e.status, &e.body()),
    };
    let (events, received) = mpsc::channel();
    if jobs.send(Job { settings: completion.settings, events }).is_err() {
        let e = ApiError { status: 503, message: "the server is shutting down".into(), param: None, code: None };
        return http::respond_json(stream, 503, &e.body());
    }
    let id = format!("cmpl-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed));
    let created = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut text = String::new();
    let mut started = false;
    // The first event decides the status: an error before any text is a 4xx.
    for event in received {
        match event {
            Event::Error(e) => {
                let e = ApiError::from(e);
                return if started { Ok(()) } else { http::respond_json(stream, e.status, &e.body()) };
            }
            Event::Text(piece) if completion.stream => {
                if !started {
                    http::start_events(stream)?;
                    started = true;
                }
                // A write error means the client left: returning drops the receiver, and the scheduler frees the sequence.
                http::send_event(stream, &openai::completion_body(&id, model_id, created, &piece, None).to_string())?;
            }
            Event::Text(piece) => text.push_str(&piece),
            Event::Done { finish, prompt_tokens, completion_tokens } => {
                let mut body = openai::completion_body(&id, model_id, created, &text, Some(finish));
                body["usage"] = openai::usage(prompt_tokens, completion_tokens);
                if !completion.stream {
                    return http::respond_json(stream, 200, &body);
                }
                if !started {
                    http::start_events(stream)?;
                }
                body["choices"][0]["text"] = json!("");
                http::send_event(stream, &body.to_string())?;
                return http::send_event(stream, "[DONE]");
            }
        }
    }
    let e = ApiError { status: 500, message: "generation ended without a result".into(), param: None, code: None };
    if started { Ok(()) } else { http::respond_json(stream, 500, &e.body()) }
}
