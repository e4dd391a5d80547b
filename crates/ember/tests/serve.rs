//! `ember serve` driven over HTTP on a loopback port: health and models, completions and chat completions (plain and
//! streamed, n choices, logprobs) equal to `ember generate` on the same prompt, OpenAI-style 4xx errors, 16 concurrent
//! requests, admission (429) and the request deadline (504), a client leaving mid-stream, SIGINT/SIGTERM draining,
//! and the official `openai` Python client. The HTTP layer alone is tested in `crates/serve/tests/http.rs`.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use common::{generate_on_cpu, small_corpus, tiny_config, train_ok};
use serde_json::{Value, json};

struct Server {
    child: Child,
    address: String,
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    fn start(model: &Path) -> Self {
        Self::start_with(model, &[])
    }

    fn start_with(model: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ember"))
            .args(["serve", "--device", "cpu", "--model", model.to_str().unwrap(), "--port", "0", "--name", "tiny"])
            .args(extra)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let address = line.split("http://").nth(1).and_then(|s| s.split(';').next()).expect(&line).to_string();
        let server = Self { child, address, _stdout: stdout };
        // It listens at once and answers 503 until the model has loaded.
        for _ in 0..6000 {
            if raw(&server.address, "GET", "/health", None).0 == 200 {
                return server;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        panic!("the server never became ready");
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        raw(&self.address, method, path, body.map(Value::to_string).as_deref())
    }

    fn complete(&self, body: Value) -> Value {
        let (status, text) = self.request("POST", "/v1/completions", Some(&body));
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn raw(address: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    raw_with(address, method, path, "", body)
}

/// [`raw`] with extra header lines (each ending in `\r\n`).
fn raw_with(address: &str, method: &str, path: &str, headers: &str, body: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    let body = body.unwrap_or_default();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = response.split_once("\r\n\r\n").map_or("", |(_, b)| b).to_string();
    (status, body)
}

/// A tiny model trained for a few steps on Shakespeare (context 32 characters), and prompts cut from its corpus
/// (so every character is in its vocabulary).
fn tiny_model(dir: &Path) -> (PathBuf, Vec<String>) {
    let corpus = small_corpus(dir, 20_000);
    let run = dir.join("run");
    let config = tiny_config(dir, &corpus, &run, "");
    train_ok(&["--device", "cpu", "--config", config.to_str().unwrap(), "--set", "train.max_steps=20"]);
    let text = std::fs::read_to_string(&corpus).unwrap();
    let prompts = (0..17).map(|i| text.chars().skip(i * 997).take(if i == 16 { 100 } else { 8 }).collect()).collect();
    (run, prompts)
}

fn generate_cli(run: &Path, prompt: &str, tokens: usize) -> String {
    let n = tokens.to_string();
    let out = generate_on_cpu(run, &["--prompt", prompt, "--temperature", "0", "--max-new-tokens", &n]);
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_prefix(prompt).unwrap().trim_end_matches('\n').to_string()
}

fn wait_for_active(server: &Server, want: u64) {
    // Polls /health until the scheduler reports `want` active sequences (it gets there within a few steps).
    for _ in 0..3000 {
        let (_, body) = server.request("GET", "/health", None);
        if serde_json::from_str::<Value>(&body).unwrap()["active_sequences"] == want {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the server never reported {want} active sequences");
}

#[test]
fn completions_health_errors_concurrency_and_disconnects() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let p0 = prompts[0].as_str();
    let server = Server::start(&run);

    let (status, body) = server.request("GET", "/health", None);
    assert_eq!((status, serde_json::from_str::<Value>(&body).unwrap()["status"].clone()), (200, json!("ok")));
    let (status, body) = server.request("GET", "/v1/models", None);
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["data"][0]["id"], "tiny");

    // Greedy completion = `ember generate`, with usage and finish reason.
    let r = server.complete(json!({"model": "tiny", "prompt": p0, "max_tokens": 12, "temperature": 0}));
    assert_eq!(r["choices"][0]["text"], generate_cli(&run, p0, 12));
    assert_eq!(
        (r["choices"][0]["finish_reason"].clone(), r["usage"]["completion_tokens"].clone()),
        (json!("length"), json!(12))
    );
    // Same seed, same text.
    let sampled = json!({"prompt": p0, "max_tokens": 12, "temperature": 1.0, "top_p": 0.9, "seed": 5});
    assert_eq!(server.complete(sampled.clone())["choices"][0]["text"], server.complete(sampled)["choices"][0]["text"]);

    // Streaming: the chunks add up to the same text, then a finish chunk and [DONE].
    let (status, body) = server.request(
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": p0, "max_tokens": 12, "temperature": 0, "stream": true})),
    );
    assert_eq!(status, 200);
    let events: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let streamed: String = chunks.iter().map(|c| c["choices"][0]["text"].as_str().unwrap()).collect();
    assert_eq!(streamed, r["choices"][0]["text"].as_str().unwrap());
    assert!(chunks.len() > 2, "tokens arrive one by one: {chunks:?}");
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");

    // Errors: OpenAI-style bodies with 4xx statuses.
    let (status, body) = raw(&server.address, "POST", "/v1/completions", Some("{not json"));
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()["error"]["type"].clone()),
        (400, json!("invalid_request_error"))
    );
    let (status, body) = server.request("POST", "/v1/completions", Some(&json!({"model": "gpt-4", "prompt": "x"})));
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()["error"]["code"].clone()),
        (404, json!("model_not_found"))
    );
    let (status, body) = server.request("POST", "/v1/completions", Some(&json!({"prompt": "x", "temperature": -1})));
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()["error"]["param"].clone()),
        (400, json!("temperature"))
    );
    let (status, body) = server.request("POST", "/v1/completions", Some(&json!({"prompt": prompts[16]})));
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).unwrap()["error"]["code"].clone()),
        (400, json!("context_length_exceeded"))
    );
    assert_eq!(server.request("GET", "/v2/nothing", None).0, 404);

    // 16 concurrent streaming requests, batched together: each stream adds up to its own sequential answer.
    let prompts = &prompts[..16];
    let sequential: Vec<Value> = prompts
        .iter()
        .map(|p| server.complete(json!({"prompt": p, "max_tokens": 8, "temperature": 0}))["choices"][0]["text"].clone())
        .collect();
    let address = server.address.clone();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            let body = json!({"prompt": p, "max_tokens": 8, "temperature": 0, "stream": true}).to_string();
            let address = address.clone();
            std::thread::spawn(move || raw(&address, "POST", "/v1/completions", Some(&body)))
        })
        .collect();
    for (handle, want) in handles.into_iter().zip(&sequential) {
        let (status, body) = handle.join().unwrap();
        assert_eq!(status, 200, "{body}");
        let events: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
        assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
        let text: String = events[..events.len() - 1]
            .iter()
            .map(|e| serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(&json!(text), want);
    }

    // A streaming client that leaves: its sequence is dropped (and its KV store freed) long before 100000 tokens.
    {
        let mut stream = TcpStream::connect(&server.address).unwrap();
        let body = json!({"prompt": p0, "max_tokens": 100000, "stream": true}).to_string();
        write!(stream, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let mut first = [0u8; 64];
        stream.read_exact(&mut first).unwrap();
        wait_for_active(&server, 1);
    }
    wait_for_active(&server, 0);
    assert_eq!(server.request("GET", "/health", None).0, 200);
}

/// SIGINT and SIGTERM stop the server gracefully: with a whole and a streamed request in flight and a connection
/// open that has sent nothing, both responses finish, the idle connection is closed, and the server exits 0.
#[test]
fn sigint_and_sigterm_let_requests_in_flight_finish() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    for signal in ["-INT", "-TERM"] {
        let mut server = Server::start(&run);
        let mut idle = TcpStream::connect(&server.address).unwrap();
        let in_flight: Vec<_> = [false, true]
            .into_iter()
            .map(|stream| {
                let address = server.address.clone();
                let body = json!({"prompt": prompts[0], "max_tokens": 300, "temperature": 0, "stream": stream,
                                  "stream_options": if stream { json!({"include_usage": true}) } else { json!(null) }});
                std::thread::spawn(move || raw(&address, "POST", "/v1/completions", Some(&body.to_string())))
            })
            .collect();
        wait_for_active(&server, 2);
        let pid = server.child.id().to_string();
        assert!(Command::new("kill").args([signal, &pid]).status().unwrap().success());
        let results: Vec<(u16, String)> = in_flight.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(results[0].0, 200, "{}", results[0].1);
        assert_eq!(serde_json::from_str::<Value>(&results[0].1).unwrap()["usage"]["completion_tokens"], 300);
        let (chunks, done) = events(&results[1].1);
        assert!(done, "{signal}: the stream ends with [DONE]");
        assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 300);
        let mut byte = [0u8; 1];
        assert_eq!(idle.read(&mut byte).unwrap(), 0, "{signal}: the idle connection is closed");
        assert!(server.child.wait().unwrap().success(), "{signal}: the server exits cleanly after draining");
    }
}

/// With one place in the batch and none in the queue, a second request is turned away at once with 429 and
/// Retry-After; when the first client leaves mid-stream (or one waiting for a whole response leaves) its sequence is
/// freed and the next request is served. A generation past `--request-timeout` ends with 504 (whole) or an error event (streamed), and frees its sequence.
#[test]
fn admission_turns_requests_away_and_the_deadline_ends_generations() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let p0 = prompts[0].as_str();
    let server = Server::start_with(&run, &["--max-batch", "1", "--max-queue", "0"]);
    let endless = json!({"prompt": p0, "max_tokens": 100000, "stream": true}).to_string();
    {
        let mut stream = TcpStream::connect(&server.address).unwrap();
        write!(stream, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{endless}", endless.len()).unwrap();
        let mut first = [0u8; 64];
        stream.read_exact(&mut first).unwrap();
        wait_for_active(&server, 1);
        let mut busy = TcpStream::connect(&server.address).unwrap();
        let body = json!({"prompt": p0, "max_tokens": 4}).to_string();
        write!(
            busy,
            "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        busy.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 429"), "{response}");
        assert!(response.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{response}");
        assert!(response.contains("rate_limit_error") && response.contains("rate_limit_exceeded"), "{response}");
    }
    wait_for_active(&server, 0);
    server.complete(json!({"prompt": p0, "max_tokens": 4}));
    // A client waiting for a whole response that leaves is cancelled too.
    {
        let mut waiting = TcpStream::connect(&server.address).unwrap();
        let body = json!({"prompt": p0, "max_tokens": 100000}).to_string();
        write!(waiting, "POST /v1/completions HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        wait_for_active(&server, 1);
    }
    wait_for_active(&server, 0);
    server.complete(json!({"prompt": p0, "max_tokens": 4}));
    let (status, body) = server.request("POST", "/v1/completions", Some(&json!({"prompt": p0, "n": 2})));
    assert_eq!(status, 400, "more choices than the server takes: {body}");
    drop(server);

    let server = Server::start_with(&run, &["--request-timeout", "1"]);
    let (status, body) = server.request("POST", "/v1/completions", Some(&json!({"prompt": p0, "max_tokens": 100000})));
    assert_eq!(status, 504, "{body}");
    assert!(body.contains("deadline") && body.contains("server_error"), "{body}");
    let (status, body) = raw(&server.address, "POST", "/v1/completions", Some(&endless));
    assert_eq!(status, 200);
    let (chunks, done) = events(&body);
    assert!(!done, "a stream cut by the deadline does not claim [DONE]");
    assert!(chunks.last().unwrap()["error"]["message"].as_str().unwrap().contains("deadline"), "{body}");
    wait_for_active(&server, 0);
}

/// `n` choices (choice i sampled with seed + i, as a request of that seed samples it) and logprobs: log-probabilities
/// of the generated tokens and their alternatives, the greedy token the most likely, in both APIs' shapes, whole
/// and streamed.
#[test]
fn n_choices_and_logprobs() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let p0 = prompts[0].as_str();
    let server = chat_server(dir.path(), &run);
    let two = server.complete(json!({"prompt": p0, "max_tokens": 8, "temperature": 1.0, "seed": 5, "n": 2}));
    for i in 0..2 {
        assert_eq!(two["choices"][i]["index"], i);
        let alone = server.complete(json!({"prompt": p0, "max_tokens": 8, "temperature": 1.0, "seed": 5 + i}));
        assert_eq!(two["choices"][i]["text"], alone["choices"][0]["text"], "choice {i}");
    }
    assert_eq!(two["usage"]["completion_tokens"], 16);
    let streamed = json!({"prompt": p0, "max_tokens": 8, "temperature": 1.0, "seed": 5, "n": 2, "stream": true});
    let (chunks, done) = events(&server.request("POST", "/v1/completions", Some(&streamed)).1);
    assert!(done);
    for i in 0..2 {
        let text: String = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert_eq!(json!(text), two["choices"][i]["text"], "streamed choice {i}");
    }

    let greedy = server.complete(json!({"prompt": p0, "max_tokens": 6, "temperature": 0, "logprobs": 3}));
    let logprobs = &greedy["choices"][0]["logprobs"];
    let tokens: Vec<&str> = logprobs["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.concat(), greedy["choices"][0]["text"].as_str().unwrap(), "{logprobs}");
    for (i, top) in logprobs["top_logprobs"].as_array().unwrap().iter().enumerate() {
        let top = top.as_object().unwrap();
        assert_eq!(top.len(), 3, "{top:?}");
        let chosen = logprobs["token_logprobs"][i].as_f64().unwrap();
        assert!(chosen <= 0.0);
        let best = top.values().map(|v| v.as_f64().unwrap()).fold(f64::NEG_INFINITY, f64::max);
        assert_eq!(chosen, best, "greedy takes the most likely token");
        assert_eq!(top[tokens[i]].as_f64().unwrap(), chosen);
    }
    assert_eq!(logprobs["text_offset"], json!([0, 1, 2, 3, 4, 5]), "one character per token");

    let chat = json!({"messages": [{"role": "user", "content": p0}], "max_tokens": 5, "temperature": 0,
                      "logprobs": true, "top_logprobs": 2});
    let (status, body) = server.request("POST", "/v1/chat/completions", Some(&chat));
    assert_eq!(status, 200, "{body}");
    let whole: Value = serde_json::from_str(&body).unwrap();
    let content = whole["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 5);
    assert!(content.iter().all(|t| t["top_logprobs"].as_array().unwrap().len() == 2 && t["bytes"].is_array()));
    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let (chunks, _) = events(&server.request("POST", "/v1/chat/completions", Some(&streamed)).1);
    let streamed: Vec<Value> =
        chunks.iter().filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array()).flatten().cloned().collect();
    assert_eq!(streamed.len(), content.len());
    for (s, w) in streamed.iter().zip(content) {
        assert_same_logprob(s, w);
        let (s_top, w_top) = (s["top_logprobs"].as_array().unwrap(), w["top_logprobs"].as_array().unwrap());
        assert_eq!(s_top.len(), w_top.len());
        s_top.iter().zip(w_top).for_each(|(s, w)| assert_same_logprob(s, w));
    }
}

/// The same token with the same log-probability, to 1e-5: two runs of one prompt may batch differently, and the
/// CPU matmul's blocking then rounds the last float bits differently (observed: 2.4e-7).
fn assert_same_logprob(streamed: &Value, whole: &Value) {
    assert_eq!(streamed["token"], whole["token"], "streamed {streamed} whole {whole}");
    assert_eq!(streamed["bytes"], whole["bytes"]);
    let (s, w) = (streamed["logprob"].as_f64().unwrap(), whole["logprob"].as_f64().unwrap());
    assert!((s - w).abs() < 1e-5, "streamed logprob {s} against the whole response's {w}");
}

/// A chat template written with the tiny model's characters (Shakespeare's), refusing system messages.
const TEMPLATE: &str = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('No system messages, \
                        please.') }}{% endif %}{{ m.role | upper }}: {{ m.content }}\n{% endfor %}\
                        {% if add_generation_prompt %}ASSISTANT:{% endif %}";

/// A server for `run` with [`TEMPLATE`] as its chat template, and the prompt the template makes of one user turn.
fn chat_server(dir: &Path, run: &Path) -> Server {
    let template = dir.join("chat.jinja");
    std::fs::write(&template, TEMPLATE).unwrap();
    Server::start_with(run, &["--chat-template", template.to_str().unwrap()])
}

fn chat_prompt(user: &str) -> String {
    format!("USER: {user}\nASSISTANT:")
}

/// Server-sent events' data lines, without `[DONE]`, as JSON; and whether `[DONE]` ended them.
fn events(body: &str) -> (Vec<Value>, bool) {
    let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let done = data.last() == Some(&"[DONE]");
    (data.iter().filter(|d| **d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect(), done)
}

/// Chat completions render the messages through the chat template and continue them as `ember generate` continues
/// the rendered prompt, whole or streamed as deltas (the role first, the finish reason and usage last); what the
/// server cannot do is a 400 naming it, and the server goes on serving.
#[test]
fn chat_completions_render_the_template_and_refuse_what_they_cannot_do() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let user = prompts[1].as_str();
    let expected = generate_cli(&run, &chat_prompt(user), 10);
    let server = chat_server(dir.path(), &run);
    let request = json!({"model": "tiny", "messages": [{"role": "user", "content": user}], "max_tokens": 10,
                         "temperature": 0});
    let (status, body) = server.request("POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 200, "{body}");
    let whole: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(whole["object"], "chat.completion");
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"), "{whole}");
    assert_eq!(whole["choices"][0]["message"], json!({"role": "assistant", "content": expected}));
    assert_eq!(whole["choices"][0]["finish_reason"], "length");
    assert_eq!(whole["usage"]["prompt_tokens"], chat_prompt(user).chars().count());

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["max_completion_tokens"] = json!(10);
    streamed["stream_options"] = json!({"include_usage": true});
    let (status, body) = server.request("POST", "/v1/chat/completions", Some(&streamed));
    assert_eq!(status, 200, "{body}");
    let (chunks, done) = events(&body);
    assert!(done, "{body}");
    assert!(chunks.iter().all(|c| c["object"] == "chat.completion.chunk" && c["id"] == chunks[0]["id"]), "{body}");
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, expected);
    // The finish reason, then (include_usage) a chunk of no choices with the token counts.
    let [.., finish, usage] = &chunks[..] else { panic!("{body}") };
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!((&usage["choices"], &usage["usage"]["completion_tokens"]), (&json!([]), &json!(10)));

    let refused = |request: Value, status: u16, says: &str| {
        let (got, body) = server.request("POST", "/v1/chat/completions", Some(&request));
        assert_eq!(got, status, "{body}");
        assert!(body.contains(says), "{body}");
    };
    refused(json!({"messages": [{"role": "system", "content": "Be brief."}]}), 400, "No system messages, please.");
    refused(json!({"messages": [{"role": "user", "content": user}], "tools": []}), 400, "`tools` is not supported");
    refused(json!({"messages": [{"role": "wizard", "content": user}]}), 400, "role \\\"wizard\\\" is not one of");
    refused(json!({"messages": "hello"}), 400, "messages must be a list");
    let (status, _) = server.request("GET", "/v1/chat/completions", None);
    assert_eq!(status, 405);
    assert_eq!(server.request("POST", "/v1/chat/completions", Some(&request)).0, 200, "still serving");

    drop(server);
    let plain = Server::start(&run);
    let (status, body) = plain.request("POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("this model has no chat template"), "{body}");
}

/// SmolLM2-135M-Instruct chats through the template its GGUF file carries (rendered as transformers renders it:
/// crates/formats/tests/chat_templates.rs) and answers the question, with the file's weights dequantized (as
/// transformers runs them: with the Q4_1 blocks and 8-bit activations this 135M model answers with French words
/// instead of the city).
#[test]
#[ignore = "needs the SmolLM2 GGUF: scripts/prepare-data.sh smollm2 (scripts/test.sh runs it)"]
fn smollm2_chats_with_its_own_template() {
    let server = Server::start_with(&common::smollm2(), &["--weights", "f32"]);
    let request = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}],
                         "max_tokens": 24, "temperature": 0});
    let (status, body) = server.request("POST", "/v1/chat/completions", Some(&request));
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    let content = answer["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(content.contains("Paris"), "{content:?}");
    // The answer ends at the model's end-of-turn token, before max_tokens.
    assert_eq!(answer["choices"][0]["finish_reason"], "stop", "{answer}");
}

/// With `--api-key-file`, every route but /health needs the key, as a Bearer token or an X-Api-Key header; /tokenize
/// and /detokenize encode and decode as generation does.
#[test]
fn an_api_key_guards_every_route_but_health_and_tokens_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, "s3cret-key\n").unwrap();
    let server = Server::start_with(&run, &["--api-key-file", key_file.to_str().unwrap()]);
    let body = json!({"prompt": prompts[0], "max_tokens": 2}).to_string();
    let call = |headers: &str, path: &str, body: &str| raw_with(&server.address, "POST", path, headers, Some(body));
    assert_eq!(raw(&server.address, "GET", "/health", None).0, 200, "health stays public");
    for headers in
        ["", "Authorization: Bearer s3cret-kez\r\n", "X-Api-Key: s3cret\r\n", "Authorization: s3cret-key\r\n"]
    {
        let (status, text) = call(headers, "/v1/completions", &body);
        assert_eq!(status, 401, "{headers:?}: {text}");
        assert!(text.contains("authentication_error") && text.contains("invalid_api_key"), "{text}");
    }
    assert_eq!(raw(&server.address, "GET", "/v1/models", None).0, 401);
    for headers in ["Authorization: Bearer s3cret-key\r\n", "x-api-key: s3cret-key\r\n"] {
        let (status, text) = call(headers, "/v1/completions", &body);
        assert_eq!(status, 200, "{headers:?}: {text}");
    }

    let key = "X-Api-Key: s3cret-key\r\n";
    let (status, text) = call(key, "/tokenize", &json!({"prompt": prompts[0]}).to_string());
    assert_eq!(status, 200, "{text}");
    let tokens: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(tokens["count"], prompts[0].chars().count(), "one token per character: {tokens}");
    assert_eq!(tokens["max_model_len"], 32);
    let (status, text) = call(key, "/detokenize", &json!({"tokens": tokens["tokens"]}).to_string());
    assert_eq!(
        (status, serde_json::from_str::<Value>(&text).unwrap()["prompt"].as_str()),
        (200, Some(prompts[0].as_str()))
    );
    let (status, text) = call(key, "/detokenize", &json!({"tokens": [0, 100000]}).to_string());
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("tokens must be a list of ids below"), "{text}");
}

/// The value of the sample `name` (labels included) in Prometheus text.
fn sample(metrics: &str, name: &str) -> f64 {
    let line = metrics
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} in\n{metrics}"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// GET /metrics counts responses by status, tokens in and out and the latencies of every generation, in Prometheus'
/// text format.
#[test]
fn metrics_count_responses_tokens_and_latencies() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let server = Server::start(&run);
    for (i, stream) in [false, true, false].into_iter().enumerate() {
        let body = json!({"prompt": prompts[i], "max_tokens": 4, "stream": stream});
        assert_eq!(server.request("POST", "/v1/completions", Some(&body)).0, 200);
    }
    assert_eq!(server.request("POST", "/v1/completions", Some(&json!({"prompt": 5}))).0, 400);
    assert_eq!(server.request("GET", "/v1/models", None).0, 200);
    let (status, metrics) = server.request("GET", "/metrics", None);
    assert_eq!(status, 200);
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let value = line.rsplit_once(' ').map(|(_, v)| v).unwrap_or_default();
        assert!(value.parse::<f64>().is_ok(), "not a sample: {line:?}");
    }
    assert_eq!(
        sample(&metrics, "ember_responses_total{status=\"200\"}"),
        4.0 + 1.0,
        "three completions, the model list and the health check that found the server ready (a scrape counts in the \
         next one)"
    );
    assert_eq!(sample(&metrics, "ember_responses_total{status=\"400\"}"), 1.0);
    assert_eq!(sample(&metrics, "ember_generated_tokens_total"), 12.0);
    let prompt_tokens: usize = prompts[..3].iter().map(|p| p.chars().count()).sum();
    assert_eq!(sample(&metrics, "ember_prompt_tokens_total"), prompt_tokens as f64);
    assert_eq!(sample(&metrics, "ember_time_to_first_token_seconds_count"), 3.0);
    assert_eq!(sample(&metrics, "ember_time_to_first_token_seconds_bucket{le=\"+Inf\"}"), 3.0);
    assert_eq!(sample(&metrics, "ember_time_per_output_token_seconds_count"), 3.0);
    assert!(sample(&metrics, "ember_time_to_first_token_seconds_sum") > 0.0);
    assert_eq!(sample(&metrics, "ember_running_sequences"), 0.0);
    assert_eq!(sample(&metrics, "ember_kv_cache_bytes"), 0.0);
}

/// Prefix caching with the paged store: a prompt sent again starts from the cached pages of the first (all its full
/// pages but the one holding its last token), answers exactly as `ember generate`, and /metrics counts the hits.
#[test]
fn a_repeated_prompt_reuses_its_cached_pages() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let prompt = format!("{}{}{}", prompts[0], prompts[1], &prompts[2][..4]);
    assert_eq!(prompt.chars().count(), 20);
    let server = Server::start_with(&run, &["--kv-cache", "paged", "--page-size", "4"]);
    let expected = generate_cli(&run, &prompt, 8);
    for _ in 0..2 {
        let r = server.complete(json!({"prompt": prompt, "max_tokens": 8, "temperature": 0}));
        assert_eq!(r["choices"][0]["text"], expected);
    }
    let (_, metrics) = server.request("GET", "/metrics", None);
    assert_eq!(sample(&metrics, "ember_prefix_cache_queried_tokens_total"), 40.0);
    assert_eq!(sample(&metrics, "ember_prefix_cache_hit_tokens_total"), 16.0, "four pages of four tokens");
    assert_eq!(sample(&metrics, "ember_prefix_cache_hit_rate"), 0.4);
    assert_eq!(sample(&metrics, "ember_prefix_cache_pages"), 5.0, "the prompt's five full pages");
}

/// The playground at `/` in headless Chromium: a message typed and sent streams back the answer `ember generate` gives
/// the rendered chat, and the page shows the token rate (tests/browser/playground.py drives it over the DevTools
/// protocol and reports the DOM).
#[test]
#[ignore = "needs Chromium (scripts/test.sh installs Debian's chromium)"]
fn the_playground_streams_a_chat_in_a_real_browser() {
    let chromium = std::env::var("EMBER_CHROMIUM").unwrap_or_else(|_| "chromium".into());
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let server = chat_server(dir.path(), &run);
    let (status, page) = server.request("GET", "/", None);
    assert!(status == 200 && page.contains("/v1/chat/completions"), "{status}");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/browser/playground.py");
    let url = format!("http://{}/", server.address);
    let profile = dir.path().join("chromium-profile");
    let out = Command::new("python3")
        .args([script, &chromium, &url, &prompts[2], "8", profile.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let state: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(state["model"], "tiny");
    assert_eq!(state["errors"], json!([]));
    assert_eq!(state["user"], json!([prompts[2]]));
    assert_eq!(state["assistant"], json!([generate_cli(&run, &chat_prompt(&prompts[2]), 8)]));
    assert!(state["stats"].as_str().unwrap().starts_with("8 tokens, "), "{state}");
}

/// The official client: completions and chat, plain and streamed, include_usage, n = 2, the same seed giving the same
/// text, logprobs; scripts/test.sh provides a Python with `openai` in EMBER_OPENAI_PYTHON.
#[test]
#[ignore = "needs a Python with the openai package in EMBER_OPENAI_PYTHON (scripts/test.sh makes one)"]
fn the_openai_python_client_completes_and_streams() {
    let python = std::env::var_os("EMBER_OPENAI_PYTHON")
        .expect("EMBER_OPENAI_PYTHON is not set: run scripts/test.sh, which makes a venv with the openai package");
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let server = chat_server(dir.path(), &run);
    let script = r#"
import json
import sys
from openai import OpenAI
client = OpenAI(base_url=f"http://{sys.argv[1]}/v1", api_key="unused")
assert [m.id for m in client.models.list()] == ["tiny"]
r = client.completions.create(model="tiny", prompt=sys.argv[2], max_tokens=12, temperature=0)
streamed = "".join(c.choices[0].text for c in client.completions.create(model="tiny", prompt=sys.argv[2], max_tokens=12, temperature=0, stream=True))
assert streamed == r.choices[0].text, (streamed, r.choices[0].text)
assert r.usage.completion_tokens == 12 and r.choices[0].finish_reason == "length"
messages = [{"role": "user", "content": sys.argv[3]}]
c = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
assert c.choices[0].message.role == "assistant" and c.choices[0].finish_reason == "length"
chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_completion_tokens=12, temperature=0, stream=True))
assert chunks[0].choices[0].delta.role == "assistant"
streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks)
assert streamed == c.choices[0].message.content, (streamed, c.choices[0].message.content)
usage = [ch.usage for ch in client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, stream=True, stream_options={"include_usage": True}) if ch.usage]
assert usage[0].completion_tokens == 12, usage
two = client.completions.create(model="tiny", prompt=sys.argv[2], max_tokens=8, temperature=1.0, seed=11, n=2)
assert [ch.index for ch in two.choices] == [0, 1] and two.usage.completion_tokens == 16
again = client.completions.create(model="tiny", prompt=sys.argv[2], max_tokens=8, temperature=1.0, seed=11, n=2)
assert [ch.text for ch in again.choices] == [ch.text for ch in two.choices], "same seed, same text"
pair = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, n=2, seed=3, stream=True)
texts = ["", ""]
for ch in pair:
    for choice in ch.choices:
        texts[choice.index] += choice.delta.content or ""
assert all(len(t) > 0 for t in texts), texts
lp = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
content = lp.choices[0].logprobs.content
assert len(content) == 6 and all(len(t.top_logprobs) == 3 and t.logprob <= 0 for t in content), content
assert "".join(t.token for t in content) == lp.choices[0].message.content
clp = client.completions.create(model="tiny", prompt=sys.argv[2], max_tokens=4, temperature=0, logprobs=2)
assert len(clp.choices[0].logprobs.tokens) == 4 and len(clp.choices[0].logprobs.top_logprobs[0]) == 2
import urllib.request
from prometheus_client.parser import text_string_to_metric_families
scrape = urllib.request.urlopen(f"http://{sys.argv[1]}/metrics").read().decode()
families = {f.name: f for f in text_string_to_metric_families(scrape)}
assert families["ember_generated_tokens"].samples[0].value >= 48, scrape
assert families["ember_time_to_first_token_seconds"].type == "histogram", scrape
print(json.dumps([r.choices[0].text, c.choices[0].message.content]))
"#;
    let out = Command::new(python).args(["-c", script, &server.address, &prompts[0], &prompts[1]]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let texts: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(texts[0], generate_cli(&run, &prompts[0], 12));
    assert_eq!(texts[1], generate_cli(&run, &chat_prompt(&prompts[1]), 12));
}

/// A tokenizer that reaches past the model's vocabulary (one character more than the model was trained on) is an
/// error naming the id: a clean one-line error from `ember generate`, a 400 from the server, which goes on serving.
#[test]
fn a_prompt_past_the_vocabulary_is_refused_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let (run, prompts) = tiny_model(dir.path());
    let corpus = std::fs::read_to_string(dir.path().join("corpus.txt")).unwrap();
    assert!(!corpus.contains('é'));
    let wider = ember_core_model::tokenizer::train_char(&format!("{corpus}é")).unwrap();
    ember_core_model::tokenizer::save(&wider, &run.join("tokenizer.json")).unwrap();

    let out = generate_on_cpu(&run, &["--prompt", "é", "--max-new-tokens", "2"]);
    common::assert_clean_error(&out, "past the model's vocabulary");
    let server = Server::start(&run);
    let (status, body) = server.request("POST", "/v1/completions", Some(&json!({"prompt": "é", "max_tokens": 2})));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("past the model's vocabulary"), "{body}");
    server.complete(json!({"prompt": prompts[0], "max_tokens": 2}));
}
