//! Just enough HTTP/1.1 for the completions server: one request per connection, bodies by Content-Length, responses
//! closed by the server (so streamed bodies need no framing).

use std::io::{self, BufReader, Write};
use std::net::TcpStream;

pub use ember_formats::http::Request;

/// Reads one request from the connection ([`ember_formats::http::read_request`]).
pub fn read_request(stream: &TcpStream) -> io::Result<Request> {
    ember_formats::http::read_request(&mut BufReader::new(stream))
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A whole text response of `content_type`.
pub fn respond_text(mut stream: &TcpStream, status: u16, content_type: &str, body: &str) -> io::Result<()> {
    write!(
        stream,
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
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
