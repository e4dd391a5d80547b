//! `ember serve` as a child process on a loopback port, raw HTTP requests to it, and the tiny model it serves.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};

use serde_json::Value;

use super::{generate_on_cpu, small_corpus, tiny_config, train_ok};

pub struct Server {
    pub child: Child,
    pub address: String,
    _stdout: BufReader<ChildStdout>,
}

impl Server {
    pub fn start(model: &Path) -> Self {
        Self::start_with(model, &[])
    }

    pub fn start_with(model: &Path, extra: &[&str]) -> Self {
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

    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        raw(&self.address, method, path, body.map(Value::to_string).as_deref())
    }

    pub fn complete(&self, body: Value) -> Value {
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

pub fn raw(address: &str, method: &str, path: &str, body: Option<&str>) -> (u16, String) {
    raw_with(address, method, path, "", body)
}

/// [`raw`] with extra header lines (each ending in `\r\n`).
pub fn raw_with(address: &str, method: &str, path: &str, headers: &str, body: Option<&str>) -> (u16, String) {
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
pub fn tiny_model(dir: &Path) -> (PathBuf, Vec<String>) {
    let corpus = small_corpus(dir, 20_000);
    let run = dir.join("run");
    let config = tiny_config(dir, &corpus, &run, "");
    train_ok(&["--device", "cpu", "--config", config.to_str().unwrap(), "--set", "train.max_steps=20"]);
    let text = std::fs::read_to_string(&corpus).unwrap();
    let prompts = (0..17).map(|i| text.chars().skip(i * 997).take(if i == 16 { 100 } else { 8 }).collect()).collect();
    (run, prompts)
}

pub fn generate_cli(run: &Path, prompt: &str, tokens: usize) -> String {
    let n = tokens.to_string();
    let out = generate_on_cpu(run, &["--prompt", prompt, "--temperature", "0", "--max-new-tokens", &n]);
    let text = String::from_utf8(out.stdout).unwrap();
    text.strip_prefix(prompt).unwrap().trim_end_matches('\n').to_string()
}

pub fn wait_for_active(server: &Server, want: u64) {
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

/// A chat template written with the tiny model's characters (Shakespeare's), refusing system messages.
pub const TEMPLATE: &str = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('No system messages, \
                        please.') }}{% endif %}{{ m.role | upper }}: {{ m.content }}\n{% endfor %}\
                        {% if add_generation_prompt %}ASSISTANT:{% endif %}";

/// A server for `run` with [`TEMPLATE`] as its chat template, and the prompt the template makes of one user turn.
pub fn chat_server(dir: &Path, run: &Path) -> Server {
    let template = dir.join("chat.jinja");
    std::fs::write(&template, TEMPLATE).unwrap();
    Server::start_with(run, &["--chat-template", template.to_str().unwrap()])
}

pub fn chat_prompt(user: &str) -> String {
    format!("USER: {user}\nASSISTANT:")
}

/// Server-sent events' data lines, without `[DONE]`, as JSON; and whether `[DONE]` ended them.
pub fn events(body: &str) -> (Vec<Value>, bool) {
    let data: Vec<&str> = body.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    let done = data.last() == Some(&"[DONE]");
    (data.iter().filter(|d| **d != "[DONE]").map(|d| serde_json::from_str(d).unwrap()).collect(), done)
}
