//! `ember serve`'s chat completions: the template rendered (the model's own, or one given), what a template cannot
//! do refused, SmolLM2 chatting with its own template, the playground in a real browser, and the official `openai`
//! Python client.

mod common;

use std::process::Command;

use common::server::{Server, chat_prompt, chat_server, events, generate_cli, tiny_model};
use serde_json::{Value, json};

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
    refused(
        json!({"messages": [{"role": "user", "content": user}], "functions": []}),
        400,
        "`functions` is not supported",
    );
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
