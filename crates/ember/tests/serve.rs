//! `ember serve` driven over HTTP on a loopback port: health and models, completions (plain and streamed, n choices,
//! logprobs) equal to `ember generate` on the same prompt, OpenAI-style 4xx errors, 16 concurrent requests,
//! admission (429) and the request deadline (504), a client leaving mid-stream, SIGINT/SIGTERM draining, the API
//! key, metrics and prefix caching. Chat is tested in `serve_chat.rs`, the HTTP layer alone in
//! `crates/serve/tests/http.rs`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

use common::generate_on_cpu;
use common::server::{Server, chat_server, events, generate_cli, raw, raw_with, tiny_model, wait_for_active};
use serde_json::{Value, json};

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

/// A tokenizer that reaches past the model's vocabulary (one character more than the model was trained on) does not
/// belong to the model: `ember generate` and `ember serve` refuse it when they load it, naming the token, and exit.
#[test]
fn a_tokenizer_past_the_vocabulary_is_refused_when_the_model_loads() {
    let dir = tempfile::tempdir().unwrap();
    let (run, _) = tiny_model(dir.path());
    let corpus = std::fs::read_to_string(dir.path().join("corpus.txt")).unwrap();
    assert!(!corpus.contains('é'));
    let wider = ember_core_model::tokenizer::train_char(&format!("{corpus}é")).unwrap();
    ember_core_model::tokenizer::save(&wider, &run.join("tokenizer.json")).unwrap();

    let out = generate_on_cpu(&run, &["--prompt", "é", "--max-new-tokens", "2"]);
    common::assert_clean_error(&out, "token \"é\" has id");
    let out = common::ember(&["serve", "--device", "cpu", "--model", run.to_str().unwrap(), "--port", "0"]);
    common::assert_clean_error(&out, "past the model's vocabulary");
}
