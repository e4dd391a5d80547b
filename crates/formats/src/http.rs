//! HTTP/1.1 requests as the completions server reads them: request line, headers, and a body of Content-Length
//! bytes, each part bounded.

use std::io::{self, BufRead, Read};

/// A parsed request.
pub struct Request {
    pub method: String,
    pub path: String,
    /// Header names and values as sent, values trimmed.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header called `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Header lines read at most; the rest of a longer header is left unread (the request fails on it as a body).
pub const MAX_HEADER_LINES: usize = 100;
/// The longest request or header line, in bytes.
pub const MAX_LINE: u64 = 8 << 10;
/// The largest body accepted.
pub const MAX_BODY: usize = 1 << 20;

fn bad(message: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message.to_string())
}

/// One line of at most [`MAX_LINE`] bytes, without its line ending.
fn line(reader: &mut impl BufRead, into: &mut String) -> io::Result<()> {
    into.clear();
    let n = reader.by_ref().take(MAX_LINE).read_line(into)?;
    if n as u64 == MAX_LINE && !into.ends_with('\n') {
        return Err(bad("request line or header longer than 8 KiB"));
    }
    Ok(())
}

/// Reads one request: request line, headers, and a body of Content-Length bytes (at most 1 MiB).
pub fn read_request(reader: &mut impl BufRead) -> io::Result<Request> {
    let mut text = String::new();
    line(reader, &mut text)?;
    let mut parts = text.split_whitespace();
    let (method, path) = match (parts.next(), parts.next()) {
        (Some(m), Some(p)) => (m.to_string(), p.split('?').next().unwrap_or(p).to_string()),
        _ => return Err(bad("malformed request line")),
    };
    let mut length = 0usize;
    let mut headers = Vec::new();
    for _ in 0..MAX_HEADER_LINES {
        line(reader, &mut text)?;
        let header = text.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let (name, value) = (name.trim(), value.trim());
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().map_err(|_| bad("bad Content-Length"))?;
            }
            headers.push((name.to_string(), value.to_string()));
        }
    }
    if length > MAX_BODY {
        return Err(bad("body larger than 1 MiB"));
    }
    let mut body = vec![0u8; length];
    reader.read_exact(&mut body)?;
    Ok(Request { method, path, headers, body })
}
