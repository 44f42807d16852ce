//! A running `colibri api` on a free port, and a tiny HTTP/1.1 client over `TcpStream` (one
//! request per connection, chunked bodies decoded), so the end-to-end tests need no HTTP
//! crate and no Python.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a test waits for the server to load or a request to answer.
pub const TIMEOUT: Duration = Duration::from_secs(180);

pub struct ApiServer {
    pub child: Child,
    pub addr: String,
    stderr: Arc<Mutex<String>>,
    pub state: PathBuf,
}

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {} {}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(str::to_string)
            .collect()
    }
}

impl ApiServer {
    /// Starts `colibri api <args>` on 127.0.0.1 port 0 (the demo model unless `args` gives
    /// `--snap`), its state and demo cache in a fresh temp folder, and waits until it is ready.
    pub fn start(tag: &str, args: &[&str]) -> ApiServer {
        ApiServer::start_in(&crate::temp_dir(tag), args)
    }

    /// [`ApiServer::start`] on an existing state folder (a restart keeps what it saved).
    pub fn start_in(state: &std::path::Path, args: &[&str]) -> ApiServer {
        let state = state.to_path_buf();
        let mut cmd = crate::colibri();
        cmd.arg("api")
            .args(["--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&state)
            .args(args)
            .env("XDG_CACHE_HOME", &state)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawning colibri api");
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().expect("stderr");
        let (tx, rx) = std::sync::mpsc::channel();
        let log = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                if let Some(a) = line.strip_prefix("[api] listening on http://") {
                    let _ = tx.send(Some(a.to_string()));
                }
                if line.starts_with("[api] ready") {
                    let _ = tx.send(None);
                }
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
        let mut addr = None;
        loop {
            match rx.recv_timeout(TIMEOUT) {
                Ok(Some(a)) => addr = Some(a),
                Ok(None) => break,
                Err(_) => panic!(
                    "colibri api did not become ready:\n{}",
                    stderr.lock().unwrap()
                ),
            }
        }
        ApiServer {
            child,
            addr: addr.expect("the listening line comes before ready"),
            stderr,
            state,
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(&self.addr).expect("connecting to colibri api");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s
    }

    /// Sends one request; `headers` are added to Content-Length, Connection: close and Host
    /// (the listen address, unless `headers` has one).
    pub fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> TcpStream {
        let mut s = self.connect();
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nConnection: close\r\nContent-Length: {}\r\n",
            body.len()
        );
        // The listen address as Host, unless the test gives its own.
        if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
            head.push_str(&format!("Host: {}\r\n", self.addr));
        }
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        s
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> HttpResponse {
        let mut s = self.send(method, path, headers, body);
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("reading the response");
        parse_response(&raw)
    }

    pub fn get(&self, path: &str) -> HttpResponse {
        self.request("GET", path, &[], b"")
    }

    pub fn post(&self, path: &str, body: &serde_json::Value) -> HttpResponse {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.to_string().as_bytes(),
        )
    }

    /// A metric's value from /metrics.
    pub fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("colibri_{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// Waits until `f` holds (checked every 20 ms), failing after [`TIMEOUT`].
    pub fn wait_for(&self, what: &str, mut f: impl FnMut(&ApiServer) -> bool) {
        let t0 = Instant::now();
        while !f(self) {
            assert!(
                t0.elapsed() < TIMEOUT,
                "timed out waiting for {what}:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Status, headers and the (de-chunked) body of a whole HTTP/1.1 response.
pub fn parse_response(raw: &[u8]) -> HttpResponse {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    HttpResponse {
        status,
        headers,
        body,
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + size).min(b.len())]);
        b = &b[(start + size + 2).min(b.len())..];
    }
    out
}

/// The content of an OpenAI chat stream: its deltas joined, and the finish reason.
pub fn chat_stream_content(r: &HttpResponse) -> (String, String) {
    let mut text = String::new();
    let mut finish = String::new();
    for d in r.sse_data() {
        if d == "[DONE]" {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&d).expect("a JSON chunk");
        if let Some(c) = v
            .pointer("/choices/0/delta/content")
            .and_then(|c| c.as_str())
        {
            text.push_str(c);
        }
        if let Some(f) = v
            .pointer("/choices/0/finish_reason")
            .and_then(|c| c.as_str())
        {
            finish = f.to_string();
        }
    }
    (text, finish)
}
