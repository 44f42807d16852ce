//! A small blocking HTTP/1.1 client over `TcpStream`: one request per connection
//! (`Connection: close`), bodies read as they arrive (chunked, by length, or to the close),
//! which is all `coli --attach` needs of `colibri api` and keeps the TUI free of an async
//! runtime and an HTTP crate. Plain `http://` only: `colibri api` speaks no TLS (a remote
//! server is reached through an SSH tunnel or a TLS proxy's local end).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Where a `colibri api` listens, and the key it wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL as given (for messages).
    pub url: String,
    /// Host name or address, without brackets.
    pub host: String,
    pub port: u16,
    /// The path prefix (`""`, or e.g. `/colibri` behind a proxy), without a trailing `/`.
    pub prefix: String,
    /// Sent as `Authorization: Bearer KEY`.
    pub key: Option<String>,
}

/// Why a request got no usable response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpError {
    /// No connection (refused, unknown host, timed out).
    Connect(String),
    /// The connection broke or the response was not HTTP.
    Io(String),
    /// A status other than 2xx, with the error message of its body when it has one.
    Status { status: u16, message: String },
}

impl HttpError {
    /// The sentence `coli` prints, naming the URL.
    pub fn describe(&self, url: &str) -> String {
        match self {
            HttpError::Connect(e) => format!("cannot reach {url}: {e}"),
            HttpError::Io(e) => format!("{url}: {e}"),
            HttpError::Status { status: 401, message } => format!(
                "{url} refused the API key (HTTP 401{}); give it with --api-key KEY or COLIBRI_API_KEY",
                tail(message)
            ),
            HttpError::Status { status, message } => format!("{url}: HTTP {status}{}", tail(message)),
        }
    }
}

fn tail(message: &str) -> String {
    if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    }
}

impl Endpoint {
    /// `http://HOST[:PORT][/PREFIX]` (port 80 by default); `HOST:PORT` alone is taken as
    /// `http://HOST:PORT`.
    pub fn parse(url: &str, key: Option<String>) -> Result<Endpoint, String> {
        let given = url.trim();
        let rest = if let Some(r) = given.strip_prefix("http://") {
            r
        } else if given.starts_with("https://") {
            return Err(format!(
                "--attach {given}: https is not supported (colibri api speaks plain HTTP); use http://, through an SSH tunnel or a TLS proxy's local end"
            ));
        } else if given.contains("://") {
            return Err(format!("--attach {given}: only http:// URLs are supported"));
        } else {
            given
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let bad = || format!("--attach {given}: not a URL of the form http://HOST:PORT");
        let (host, port) = if let Some(r) = authority.strip_prefix('[') {
            let (h, p) = r.split_once(']').ok_or_else(bad)?;
            (h, p.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || authority.contains('@') {
            return Err(bad());
        }
        let port = match port {
            None => 80,
            Some(p) => p.parse::<u16>().map_err(|_| {
                format!("--attach {given}: the port {p:?} is not a number in 1..=65535")
            })?,
        };
        if port == 0 {
            return Err(format!("--attach {given}: the port must be in 1..=65535"));
        }
        let path = path.split(['?', '#']).next().unwrap_or("");
        Ok(Endpoint {
            url: given.to_string(),
            host: host.to_string(),
            port,
            prefix: path.trim_end_matches('/').to_string(),
            key: key.filter(|k| !k.is_empty()),
        })
    }

    /// `Host:` header value.
    fn host_header(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Sends one request and reads the response head. A 2xx gives the body to read; any
    /// other status is an error carrying the body's message. `timeout` bounds the connect
    /// and each read.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&[u8]>,
        timeout: Duration,
    ) -> Result<Response, HttpError> {
        let addrs: Vec<_> = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| HttpError::Connect(e.to_string()))?
            .collect();
        let mut last = HttpError::Connect("the host has no address".into());
        let mut stream = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = HttpError::Connect(e.to_string()),
            }
        }
        let mut s = stream.ok_or(last)?;
        let io = |e: std::io::Error| HttpError::Io(e.to_string());
        s.set_read_timeout(Some(timeout)).map_err(io)?;
        s.set_write_timeout(Some(timeout)).map_err(io)?;
        let mut head = format!(
            "{method} {}{path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nUser-Agent: coli/{}\r\n",
            self.prefix,
            self.host_header(),
            env!("CARGO_PKG_VERSION")
        );
        if let Some(k) = &self.key {
            head.push_str(&format!("Authorization: Bearer {k}\r\n"));
        }
        if let Some(b) = body {
            head.push_str(&format!(
                "Content-Type: application/json\r\nContent-Length: {}\r\n",
                b.len()
            ));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).map_err(io)?;
        if let Some(b) = body {
            s.write_all(b).map_err(io)?;
        }
        let control = s.try_clone().map_err(io)?;
        let resp = Response::read(BufReader::new(s), control)?;
        if (200..300).contains(&resp.status) {
            Ok(resp)
        } else {
            let status = resp.status;
            let mut text = Vec::new();
            // At most 64 KiB of an error body: its message is near the start.
            let _ = resp.body.take(64 * 1024).read_to_end(&mut text);
            Err(HttpError::Status {
                status,
                message: error_message(&text),
            })
        }
    }
}

/// The `error.message` of a JSON error body (OpenAI's and Anthropic's shape), else the body's
/// first line.
pub fn error_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        if let Some(m) = v
            .pointer("/error/message")
            .or_else(|| v.get("message"))
            .and_then(|m| m.as_str())
        {
            return m.to_string();
        }
    }
    String::from_utf8_lossy(body)
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(200)
        .collect()
}

/// A response: its status, headers, and the body as it arrives.
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Body<BufReader<TcpStream>>,
    /// A handle on the socket that ends the exchange from another thread ([`Closer::close`]).
    pub closer: Closer,
}

/// Closes a response's connection from another thread: a blocked read returns at once.
pub struct Closer(TcpStream);

impl Closer {
    pub fn close(&self) {
        let _ = self.0.shutdown(Shutdown::Both);
    }
}

impl Response {
    fn read(mut r: BufReader<TcpStream>, control: TcpStream) -> Result<Response, HttpError> {
        let (status, headers) = read_head(&mut r)?;
        Ok(Response {
            status,
            body: Body::new(r, &headers),
            headers,
            closer: Closer(control),
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// The status line and the headers (a head over 64 KiB is refused).
pub fn read_head(r: &mut impl BufRead) -> Result<(u16, Vec<(String, String)>), HttpError> {
    let mut total = 0;
    let mut line = String::new();
    let mut next = |line: &mut String| -> Result<(), HttpError> {
        line.clear();
        let n = r
            .read_line(line)
            .map_err(|e| HttpError::Io(format!("reading the response: {e}")))?;
        total += n;
        if n == 0 {
            return Err(HttpError::Io(
                "the server closed the connection without a response".into(),
            ));
        }
        if total > 64 * 1024 {
            return Err(HttpError::Io(
                "the response head is larger than 64 KiB".into(),
            ));
        }
        Ok(())
    };
    next(&mut line)?;
    let status = line
        .strip_prefix("HTTP/1.")
        .and_then(|l| l.get(2..5))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| HttpError::Io(format!("not an HTTP response: {:?}", line.trim_end())))?;
    let mut headers = Vec::new();
    loop {
        next(&mut line)?;
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok((status, headers))
}

/// How a body's end is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    /// Chunked: bytes left in the current chunk; `None` before a chunk's size line.
    Chunked { left: Option<u64>, done: bool },
    /// `Content-Length`: bytes left.
    Length(u64),
    /// To the connection's close.
    Close,
}

/// A response body as a reader: chunked transfer coding removed.
pub struct Body<R> {
    r: R,
    framing: Framing,
}

impl<R: BufRead> Body<R> {
    pub fn new(r: R, headers: &[(String, String)]) -> Body<R> {
        let chunked = header(headers, "transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
        let framing = if chunked {
            Framing::Chunked {
                left: None,
                done: false,
            }
        } else if let Some(n) = header(headers, "content-length").and_then(|v| v.parse().ok()) {
            Framing::Length(n)
        } else {
            Framing::Close
        };
        Body { r, framing }
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the connection closed inside a chunked body",
            ));
        }
        Ok(l)
    }
}

impl<R: BufRead> Read for Body<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.framing {
                Framing::Close => return self.r.read(buf),
                Framing::Length(0) => return Ok(0),
                Framing::Length(left) => {
                    let want = buf.len().min(left.min(usize::MAX as u64) as usize);
                    let n = self.r.read(&mut buf[..want])?;
                    self.framing = Framing::Length(left - n as u64);
                    return Ok(n);
                }
                Framing::Chunked { done: true, .. } => return Ok(0),
                Framing::Chunked {
                    left: None,
                    done: false,
                } => {
                    let l = self.line()?;
                    let size = l.trim().split(';').next().unwrap_or("").trim();
                    let size = u64::from_str_radix(size, 16).map_err(|_| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("a bad chunk size line: {:?}", l.trim_end()),
                        )
                    })?;
                    if size == 0 {
                        // Trailers, up to the empty line.
                        while !self.line()?.trim().is_empty() {}
                        self.framing = Framing::Chunked {
                            left: None,
                            done: true,
                        };
                    } else {
                        self.framing = Framing::Chunked {
                            left: Some(size),
                            done: false,
                        };
                    }
                }
                Framing::Chunked {
                    left: Some(left), ..
                } => {
                    let want = buf.len().min(left.min(usize::MAX as u64) as usize);
                    let n = self.r.read(&mut buf[..want])?;
                    if n == 0 {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            "the connection closed inside a chunk",
                        ));
                    }
                    let left = left - n as u64;
                    if left == 0 {
                        // The chunk's CRLF.
                        self.line()?;
                        self.framing = Framing::Chunked {
                            left: None,
                            done: false,
                        };
                    } else {
                        self.framing = Framing::Chunked {
                            left: Some(left),
                            done: false,
                        };
                    }
                    return Ok(n);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let e = Endpoint::parse("http://127.0.0.1:8080", Some("k".into())).unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("127.0.0.1", 8080, "")
        );
        assert_eq!(e.key.as_deref(), Some("k"));
        let e = Endpoint::parse("localhost:9000/", None).unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("localhost", 9000, "")
        );
        let e = Endpoint::parse("http://[::1]:7/api/", Some(String::new())).unwrap();
        assert_eq!(
            (e.host.as_str(), e.port, e.prefix.as_str()),
            ("::1", 7, "/api")
        );
        assert_eq!(e.key, None, "an empty key is no key");
        assert_eq!(e.host_header(), "[::1]:7");
        assert_eq!(Endpoint::parse("http://h", None).unwrap().port, 80);
        let err = Endpoint::parse("https://h:1", None).unwrap_err();
        assert!(err.contains("https is not supported"), "{err}");
        let err = Endpoint::parse("http://h:99999", None).unwrap_err();
        assert!(err.contains("\"99999\""), "{err}");
        assert!(Endpoint::parse("http://:80", None).is_err());
        assert!(Endpoint::parse("ftp://h", None).is_err());
    }

    fn body(raw: &[u8]) -> Vec<u8> {
        let mut r = std::io::Cursor::new(raw.to_vec());
        let (status, headers) = read_head(&mut r).unwrap();
        assert_eq!(status, 200);
        let mut out = Vec::new();
        Body::new(r, &headers).read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn chunked_length_and_close_bodies() {
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n7;x=1\r\n, world\r\n0\r\nT: v\r\n\r\nIGNORED";
        assert_eq!(body(chunked), b"hello, world");
        let length = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\nabcdef";
        assert_eq!(body(length), b"abc");
        let close = b"HTTP/1.0 200 OK\r\n\r\nto the end";
        assert_eq!(body(close), b"to the end");
        let mut r = std::io::Cursor::new(b"SSH-2.0-OpenSSH\r\n".to_vec());
        assert!(matches!(read_head(&mut r), Err(HttpError::Io(_))));
        let mut cut = std::io::Cursor::new(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nshort".to_vec(),
        );
        let (_, h) = read_head(&mut cut).unwrap();
        assert!(Body::new(cut, &h).read_to_end(&mut Vec::new()).is_err());
    }

    #[test]
    fn errors_name_the_url_and_the_status() {
        let e = HttpError::Status {
            status: 401,
            message: error_message(br#"{"error":{"message":"missing or wrong API key"}}"#),
        };
        let s = e.describe("http://h:1");
        assert!(
            s.contains("http://h:1")
                && s.contains("HTTP 401")
                && s.contains("missing or wrong API key"),
            "{s}"
        );
        let e = HttpError::Status {
            status: 503,
            message: error_message(b"busy\nmore"),
        };
        assert_eq!(e.describe("http://h:1"), "http://h:1: HTTP 503: busy");
    }
}
