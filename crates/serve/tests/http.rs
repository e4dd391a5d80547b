//! The HTTP layer over loopback, with the server `ember serve` runs but no model behind it: 503 while loading, keep-alive,
//! 404/405/413/431 answers, a slowloris cut off at the header timeout while 200 idle sockets and a normal client are
//! served, CORS only when asked for, and a graceful shutdown that closes idle connections. Generation over HTTP is
//! tested with a real model in `crates/ember/tests/serve.rs`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use ember_formats::tokenizer;
use ember_serve::http::{self, Limits};
use ember_serve::metrics::Metrics;
use ember_serve::scheduler::Job;
use ember_serve::server::{self, App, Options, Served};
use serde_json::Value;

struct Server {
    address: String,
    app: Arc<App>,
    _jobs: Receiver<Job>,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
    listening: Option<JoinHandle<std::io::Result<()>>>,
}

impl Server {
    fn start(options: Options, limits: Limits) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (jobs, received) = mpsc::channel();
        let app = App::new("tiny".into(), jobs, Arc::new(Metrics::default()), options);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = server::router(app.clone()).unwrap();
        let listening = http::spawn(listener, router, limits, async {
            let _ = stopped.await;
        })
        .unwrap();
        Self { address, app, _jobs: received, stop: Mutex::new(Some(stop)), listening: Some(listening) }
    }

    fn loaded(options: Options, limits: Limits) -> Self {
        let server = Self::start(options, limits);
        let tokenizer = tokenizer::train_char("abcdefgh ").unwrap();
        server.app.ready(Served { chat: None, tokenizer, context: 32 });
        server
    }

    fn connect(&self) -> TcpStream {
        let stream = TcpStream::connect(&self.address).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        stream
    }

    /// Stops the server as a signal would, and waits for it to return.
    fn shut_down(&mut self) {
        if let Some(stop) = self.stop.lock().unwrap().take() {
            let _ = stop.send(());
        }
        if let Some(listening) = self.listening.take() {
            listening.join().unwrap().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A response: status, headers (lower-case names) and body.
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

/// Reads one response with a Content-Length body (every whole response the server sends has one).
fn read_response(reader: &mut BufReader<TcpStream>) -> Response {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line.split_whitespace().nth(1).unwrap_or_else(|| panic!("{status_line:?}")).parse().unwrap();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers.iter().find(|(n, _)| n == "content-length").map_or(0, |(_, v)| v.parse().unwrap());
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    Response { status, headers, body: String::from_utf8(body).unwrap() }
}

/// `request` (whole, head and body) on a new connection.
fn exchange(server: &Server, request: &str) -> Response {
    let mut stream = server.connect();
    stream.write_all(request.as_bytes()).unwrap();
    read_response(&mut BufReader::new(stream))
}

fn get(server: &Server, path: &str) -> Response {
    exchange(server, &format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
}

fn post(server: &Server, path: &str, body: &str) -> Response {
    exchange(
        server,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
}

/// Whether the server has closed `stream`: a read ends (EOF or reset) rather than timing out.
fn closed(stream: &mut TcpStream) -> bool {
    let mut byte = [0u8; 1];
    loop {
        match stream.read(&mut byte) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

#[test]
fn health_is_503_while_the_model_loads_and_the_api_says_when_to_retry() {
    let server = Server::start(Options::new(1), Limits::default());
    let health = get(&server, "/health");
    assert_eq!((health.status, health.json()["status"].as_str()), (503, Some("loading")));
    assert_eq!(health.header("retry-after"), Some("1"));
    let completion = post(&server, "/v1/completions", r#"{"prompt": "a"}"#);
    assert_eq!(completion.status, 503, "{}", completion.body);
    assert!(completion.json()["error"]["message"].as_str().unwrap().contains("loading"));
    assert_eq!(get(&server, "/v1/models").status, 503);
    assert_eq!(get(&server, "/").status, 200, "the page is there at once");

    server.app.ready(Served { chat: None, tokenizer: tokenizer::train_char("ab").unwrap(), context: 8 });
    let health = get(&server, "/health");
    assert_eq!((health.status, health.json()["status"].as_str()), (200, Some("ok")));
    assert_eq!(get(&server, "/v1/models").json()["data"][0]["max_model_len"], 8);
}

#[test]
fn one_keep_alive_connection_serves_several_requests() {
    let server = Server::loaded(Options::new(1), Limits::default());
    let stream = server.connect();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    for prompt in ["abc", "bad cafe"] {
        let body = format!(r#"{{"prompt": "{prompt}"}}"#);
        write!(writer, "POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
        let response = read_response(&mut reader);
        assert_eq!(response.status, 200, "{}", response.body);
        assert_eq!(response.json()["count"], prompt.len());
    }
    write!(writer, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    assert_eq!(read_response(&mut reader).status, 200);
}

#[test]
fn unknown_routes_wrong_methods_and_oversized_requests_get_their_status() {
    let server = Server::loaded(Options::new(1), Limits::default());
    let missing = get(&server, "/v2/nothing");
    assert_eq!((missing.status, missing.json()["error"]["type"].as_str()), (404, Some("not_found_error")));
    let wrong = get(&server, "/v1/completions");
    assert_eq!(wrong.status, 405);
    assert!(wrong.json()["error"]["message"].as_str().unwrap().contains("GET is not allowed"), "{}", wrong.body);
    let malformed = post(&server, "/v1/completions", "{not json");
    assert_eq!((malformed.status, malformed.json()["error"]["type"].as_str()), (400, Some("invalid_request_error")));

    // 2 MiB against a 1 MiB limit: 413 with an OpenAI-style body (the rest of the upload may be refused).
    let mut stream = server.connect();
    let big = "x".repeat(2 << 20);
    write!(stream, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n", big.len()).unwrap();
    let writer = {
        let mut stream = stream.try_clone().unwrap();
        thread::spawn(move || {
            let _ = stream.write_all(big.as_bytes());
        })
    };
    let response = read_response(&mut BufReader::new(stream));
    assert_eq!(response.status, 413, "{}", response.body);
    assert!(response.json()["error"]["message"].as_str().unwrap().contains("larger than 1048576 bytes"));
    let _ = writer.join();

    let many: String = (0..150).map(|i| format!("X-Header-{i}: {i}\r\n")).collect();
    assert_eq!(exchange(&server, &format!("GET /health HTTP/1.1\r\nHost: x\r\n{many}\r\n")).status, 431);
    let long = format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Long: {}\r\n\r\n", "y".repeat(32 * 1024));
    assert_eq!(exchange(&server, &long).status, 431);
    assert_eq!(get(&server, "/health").status, 200, "still serving");
}

#[test]
fn a_slowloris_is_cut_off_at_the_header_timeout_while_idle_sockets_and_a_client_are_served() {
    let limits = Limits { header_timeout: Duration::from_secs(2), ..Limits::default() };
    let server = Server::loaded(Options::new(1), limits);
    // One header byte a second, for as long as the server listens.
    let mut slow = server.connect();
    let trickle = {
        let mut slow = slow.try_clone().unwrap();
        thread::spawn(move || {
            let head = format!("GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: {}", "z".repeat(600));
            for byte in head.bytes() {
                if slow.write_all(&[byte]).is_err() {
                    return true;
                }
                thread::sleep(Duration::from_secs(1));
            }
            false
        })
    };
    let idle: Vec<TcpStream> = (0..200).map(|_| server.connect()).collect();
    let response = post(&server, "/tokenize", r#"{"prompt": "abc"}"#);
    assert_eq!(response.status, 200, "served beside 200 idle sockets and a slowloris");
    assert!(closed(&mut slow), "the slowloris connection is closed");
    assert!(trickle.join().unwrap(), "its writes fail once the server has closed it");
    let mut silent = idle.into_iter().next().unwrap();
    assert!(closed(&mut silent), "a connection that sends nothing is closed at the header timeout too");
}

#[test]
fn cors_is_off_unless_an_origin_is_given() {
    let preflight = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\n\
                     Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization, content-type\r\n\
                     Connection: close\r\n\r\n";
    let plain = Server::loaded(Options::new(1), Limits::default());
    let refused = exchange(&plain, preflight);
    assert_eq!(refused.header("access-control-allow-origin"), None);

    let options = Options { cors_origins: vec!["http://app.example".into()], ..Options::new(1) };
    let open = Server::loaded(options, Limits::default());
    let allowed = exchange(&open, preflight);
    assert_eq!(allowed.status, 200);
    assert_eq!(allowed.header("access-control-allow-origin"), Some("http://app.example"));
    assert!(allowed.header("access-control-allow-headers").unwrap().contains("authorization"));
    let other = preflight.replace("http://app.example", "http://elsewhere.example");
    assert_eq!(exchange(&open, &other).header("access-control-allow-origin"), None);
    let response =
        exchange(&open, "GET /health HTTP/1.1\r\nHost: x\r\nOrigin: http://app.example\r\nConnection: close\r\n\r\n");
    assert_eq!(response.header("access-control-allow-origin"), Some("http://app.example"));
}

#[test]
fn shutting_down_closes_idle_connections_and_returns() {
    let mut server =
        Server::loaded(Options::new(1), Limits { header_timeout: Duration::from_secs(60), ..Limits::default() });
    let mut idle = server.connect();
    let mut kept = server.connect();
    write!(kept, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut reader = BufReader::new(kept.try_clone().unwrap());
    assert_eq!(read_response(&mut reader).status, 200);
    server.shut_down();
    assert!(closed(&mut idle), "a connection that never sent a request");
    assert!(closed(&mut kept), "a keep-alive connection between requests");
    assert!(TcpStream::connect(&server.address).is_err(), "the listener is closed");
}
