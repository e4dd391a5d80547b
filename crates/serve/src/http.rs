//! Just enough HTTP/1.1 for the completions server: one request per connection, bodies by Content-Length, responses
//! closed by the server (so streamed bodies need no framing).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;

/// A parsed request.
pub struct Request {
    pub method: String,
    pub path: String,
    pub body: Vec<u8>,
}

const MAX_HEADER_LINES: usize = 100;
const MAX_BODY: usize = 1 << 20;

fn bad(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// Reads one request: request line, headers, and a body of Content-Length bytes (at most 1 MiB).
pub fn read_request(stream: &TcpStream) -> io::Result<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = match (parts.next(), parts.next()) {
        (Some(m), Some(p)) => (m.to_string(), p.split('?').next().unwrap_or(p).to_string()),
        _ => return Err(bad("malformed request line")),
    };
    let mut length = 0usize;
    for _ in 0..MAX_HEADER_LINES {
        line.clear();
        reader.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':')
            && name.trim().eq_ignore_ascii_case("content-length")
        {
            length = value.trim().parse().map_err(|_| bad("bad Content-Length"))?;
        }
    }
    if length > MAX_BODY {
        return Err(bad("body larger than 1 MiB"));
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    Ok(Request { method, path, body })
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A whole JSON response.
pub fn respond_json(mut stream: &TcpStream, status: u16, body: &serde_json::Value) -> io::Result<()> {
    let body = body.to_string();
    write!(
        stream,
        "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        reason(status),
        body.len()
    )?;
    stream.flush()
}

/// The head of a server-sent-events response; events follow with [`send_event`] until the connection closes.
pub fn start_events(mut stream: &TcpStream) -> io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
    )?;
    stream.flush()
}

/// One server-sent event: `data: ...` and a blank line.
pub fn send_event(mut stream: &TcpStream, data: &str) -> io::Result<()> {
    write!(stream, "data: {data}\n\n")?;
    stream.flush()
}
