//! `GET /v1/colibri/telemetry` of `colibri api` and `coli --attach`, end to end on the demo
//! model: the stream carries the engine's records while a request runs, wants the key when
//! the server has keys, never carries a prompt's or an answer's text, cannot be stalled into
//! stalling a request, and ends on shutdown; `coli --attach URL --check` reads it and chats.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use colibri_e2e::bin;
use colibri_e2e::http::{chat_stream_content, parse_response, ApiServer, HttpResponse};
use serde_json::json;

const KEY: &str = "attach-test-key";
const PATH: &str = "/v1/colibri/telemetry";

/// Opens the telemetry stream (with these extra headers) and collects what arrives on a
/// thread: the raw bytes so far, shared.
fn subscribe(s: &ApiServer, headers: &str) -> (TcpStream, Arc<Mutex<Vec<u8>>>) {
    let mut c = s.connect();
    write!(
        c,
        "GET {PATH} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n{headers}\r\n",
        s.addr
    )
    .unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (mut r, buf) = (c.try_clone().unwrap(), seen.clone());
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            buf.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    (c, seen)
}

/// The raw bytes so far, as text.
fn text(seen: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&seen.lock().unwrap()).into_owned()
}

/// The stream's body so far, chunked coding removed (empty before the head is whole).
fn body(seen: &Arc<Mutex<Vec<u8>>>) -> String {
    let raw = seen.lock().unwrap().clone();
    if !raw.windows(4).any(|w| w == b"\r\n\r\n") {
        return String::new();
    }
    parse_response(&raw).text()
}

/// Waits until the collected stream's body contains `what`.
fn wait_for(seen: &Arc<Mutex<Vec<u8>>>, what: &str, s: &ApiServer) {
    let t0 = Instant::now();
    while !body(seen).contains(what) {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "no {what:?} in the telemetry stream:\n{}\n--- server:\n{}",
            text(seen),
            s.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn chat(s: &ApiServer, content: &str, max_tokens: u32) -> HttpResponse {
    let body = json!({
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0,
    })
    .to_string();
    s.request(
        "POST",
        "/v1/chat/completions",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", &format!("Bearer {KEY}")),
        ],
        body.as_bytes(),
    )
}

/// The `data:` lines of the collected stream's `event: telemetry` frames.
fn records(raw: &str) -> Vec<String> {
    raw.split("\n\n")
        .filter_map(|f| f.strip_prefix("event: telemetry\ndata: "))
        .map(str::to_string)
        .collect()
}

/// A subscriber with the key sees the snapshot at once, then a request's records while it
/// runs (its state, its prefill) and its end (HITS, PROF, its STAT with its token counts);
/// none of it is the request's text, its prompt's marker or its answer.
#[test]
fn the_stream_carries_a_requests_records_and_never_its_text() {
    let s = ApiServer::start("attach-stream", &["--api-key", KEY]);
    let (_c, seen) = subscribe(&s, &format!("Authorization: Bearer {KEY}\r\n"));
    wait_for(&seen, "data: STATE idle", &s);
    let raw = text(&seen);
    assert!(raw.starts_with("HTTP/1.1 200"), "{raw}");
    assert!(raw
        .to_ascii_lowercase()
        .contains("content-type: text/event-stream"));
    let head = body(&seen);
    for kind in ["HWINFO", "TIERS", "EMAP", "DISKCLASS"] {
        assert!(
            records(&head).iter().any(|r| r.starts_with(kind)),
            "the snapshot has {kind}: {head}"
        );
    }

    let marker = "zqxMARKERvw7319";
    let r = chat(
        &s,
        &format!("Repeat after me: {marker} {marker} {marker}"),
        40,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let (answer, _) = chat_stream_content(&r);
    let usage = r
        .sse_data()
        .iter()
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| u.is_object()).cloned())
        .expect("a usage chunk");
    let (p, c) = (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["completion_tokens"].as_u64().unwrap(),
    );
    let stat = format!("event: stat\ndata: STAT {c} ");
    wait_for(&seen, &stat, &s);
    wait_for(&seen, "data: STATE idle", &s);
    let all = body(&seen);
    let after = &all[head.len()..];
    let recs = records(after);
    let pos = |prefix: &str| recs.iter().position(|r| r.starts_with(prefix));
    let generating = pos("STATE generating").expect("STATE generating while it ran");
    assert!(
        pos("PROGRESS prefill").is_some_and(|i| i < generating),
        "{recs:?}"
    );
    assert!(pos("HITS").is_some_and(|i| i > generating), "{recs:?}");
    assert!(
        recs.iter()
            .any(|r| r.starts_with("PROF ") && r.split(' ').nth(3) == Some(&c.to_string())),
        "PROF counts the answer's {c} tokens: {recs:?}"
    );
    let stat_line = after
        .split("\n\n")
        .find_map(|f| f.strip_prefix("event: stat\ndata: "))
        .unwrap();
    assert!(
        stat_line.ends_with(&format!(" {p} 0")) || stat_line.ends_with(&format!(" {p} 1")),
        "{stat_line}"
    );

    // No text of the request: not the prompt's marker, not the answer (when it is long
    // enough to be told from the records' words and numbers).
    assert!(!all.contains(marker), "the prompt's marker leaked:\n{all}");
    assert!(!all.contains("Repeat after me"), "the prompt leaked");
    let answer = answer.trim();
    if answer.chars().count() >= 12 {
        assert!(
            !all.contains(answer),
            "the answer {answer:?} leaked:\n{all}"
        );
    }
    // Every frame is a known record, a STAT, or a comment.
    for f in after.split("\n\n").filter(|f| !f.is_empty()) {
        let ok = f.starts_with(':')
            || f.starts_with("event: stat\ndata: STAT ")
            || f.strip_prefix("event: telemetry\ndata: ").is_some_and(|l| {
                matches!(
                    protocol::parse_telemetry_line(l.as_bytes()),
                    Some(t) if !matches!(t, protocol::Telemetry::Unknown(_))
                )
            });
        assert!(ok, "an unexpected frame {f:?}");
    }
}

/// With `--api-key`, the stream wants the key as the other routes do (Bearer or x-api-key).
#[test]
fn the_stream_wants_the_key() {
    let s = ApiServer::start("attach-key", &["--api-key", KEY]);
    let get = |h: &[(&str, &str)]| {
        let mut c = s.send("GET", PATH, h, b"");
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut raw = Vec::new();
        // The stream does not end: read what the first second brings.
        let t0 = Instant::now();
        let mut buf = [0u8; 4096];
        while t0.elapsed() < Duration::from_secs(1) {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => raw.extend_from_slice(&buf[..n]),
            }
            if raw.windows(4).any(|w| w == b"\r\n\r\n") && !raw.starts_with(b"HTTP/1.1 200") {
                break;
            }
        }
        raw
    };
    for h in [vec![], vec![("Authorization", "Bearer wrong")]] {
        let raw = get(&h);
        let r = parse_response(&raw);
        assert_eq!(r.status, 401, "{}", r.text());
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    }
    let raw = get(&[("x-api-key", KEY)]);
    let head = String::from_utf8_lossy(&raw);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("data: HWINFO"), "{head}");
}

/// Subscribers that never read cannot hold up the engine: requests answer while their
/// streams are stuck, and when one reads again it is told how many frames it skipped and the
/// frames around that are whole. Their sockets ask for a small receive buffer and a small
/// segment size, so that the kernel holds a few hundred kB for them rather than the MBs of a
/// loopback connection; requests go on (about 1 kB of frames each on the demo) until one
/// stalled subscriber, read after each batch, shows that its ring overflowed. That one is the
/// subscriber checked: how much the kernel holds for a connection differs from one
/// connection to the next (the sender's buffer grows on its own), so another stalled
/// subscriber may still have every frame in its socket when this one has lagged.
#[test]
fn stalled_subscribers_do_not_stall_requests() {
    let mut s = ApiServer::start("attach-stall", &["--api-key", KEY]);
    let addr: std::net::SocketAddr = s.addr.parse().unwrap();
    let mut stalled: Vec<TcpStream> = (0..4)
        .map(|_| {
            let sock = socket2::Socket::new(
                socket2::Domain::for_address(addr),
                socket2::Type::STREAM,
                None,
            )
            .unwrap();
            sock.set_recv_buffer_size(4096).unwrap();
            sock.set_tcp_mss(536).unwrap();
            sock.connect(&addr.into()).unwrap();
            let mut c: TcpStream = sock.into();
            write!(
                c,
                "GET {PATH} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {KEY}\r\n\r\n",
                s.addr
            )
            .unwrap();
            c
        })
        .collect();
    let t0 = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut n = 0;
    let mut seen = Vec::new();
    while n < 3000 {
        for _ in 0..50 {
            let t = Instant::now();
            let r = chat(&s, &format!("Count to {n}"), 6);
            assert_eq!(r.status, 200, "{}", r.text());
            slowest = slowest.max(t.elapsed());
            n += 1;
        }
        // Probed at 200 requests, then every 500: each probe reads the subscriber's socket
        // empty, so between probes the ring has to outlast what the kernel buffers for it,
        // which grows with the sender's buffer (a suite run once held 3000 frames, 2.7 MB,
        // against probes every 50 requests).
        if (n == 200 || (n > 200 && n % 500 == 0))
            && drain_into(&mut stalled[1], Duration::from_millis(300), &mut seen)
                .contains("event: lagged")
        {
            break;
        }
    }
    let total = n;
    eprintln!(
        "{total} requests with 4 stalled subscribers: {:.1} s, the slowest {:.0} ms",
        t0.elapsed().as_secs_f64(),
        slowest.as_secs_f64() * 1e3
    );
    assert!(
        slowest < Duration::from_secs(30),
        "a request took {slowest:?} with stalled subscribers"
    );
    // Now the one that lagged reads the rest of what it was sent.
    let body = drain_into(&mut stalled[1], Duration::from_secs(2), &mut seen);
    let stats = body.matches("event: stat\ndata: STAT ").count();
    let skipped: u64 = body
        .split("event: lagged\ndata: ")
        .skip(1)
        .filter_map(|f| f.split('\n').next()?.parse::<u64>().ok())
        .sum();
    eprintln!(
        "the stalled stream: {} bytes, {stats} of {total} STAT frames, {skipped} frames skipped",
        body.len()
    );
    assert!(
        skipped > 0,
        "the ring never overflowed: {stats} STAT frames"
    );
    assert!(stats < total, "a skip, yet every STAT frame came");
    for f in body
        .split("\n\n")
        .filter(|f| !f.is_empty() && !f.starts_with(':'))
    {
        assert!(
            f.starts_with("event: telemetry\ndata: ")
                || f.starts_with("event: stat\ndata: STAT ")
                || f.starts_with("event: lagged\ndata: "),
            "a broken frame {f:?}"
        );
    }
    let last = body.rfind("event: stat\ndata: STAT ");
    let lag = body.find("event: lagged\ndata: ");
    assert!(
        last > lag,
        "frames go on after the skip: the last requests' STATs came"
    );
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "the server is still up"
    );
}

/// Reads what `c` is sent until it is quiet for `quiet`, adds it to `raw` (what was read
/// from `c` before), and returns the body of all of it, de-chunked.
fn drain_into(c: &mut TcpStream, quiet: Duration, raw: &mut Vec<u8>) -> String {
    c.set_read_timeout(Some(quiet)).unwrap();
    let mut buf = [0u8; 65536];
    while let Ok(n) = c.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    if raw.windows(4).any(|w| w == b"\r\n\r\n") {
        parse_response(raw).text()
    } else {
        String::from_utf8_lossy(raw).into_owned()
    }
}

/// A shutdown ends the stream at once (it does not hold the server for --shutdown-timeout).
#[test]
fn the_stream_ends_on_shutdown() {
    let mut s = ApiServer::start("attach-shutdown", &["--shutdown-timeout", "30"]);
    let (_c, seen) = subscribe(&s, "");
    wait_for(&seen, "data: STATE idle", &s);
    let t0 = Instant::now();
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the server did not exit with a subscriber open:\n{}",
            s.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Chunked coding's last chunk: the stream ended rather than broke.
    let t1 = Instant::now();
    while !text(&seen).ends_with("0\r\n\r\n") && t1.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(text(&seen).ends_with("0\r\n\r\n"), "{:?}", text(&seen));
}

/// `coli --attach URL --check`: the model, a telemetry record, a short answer and the
/// server's STAT of it; a wrong key and an unreachable URL are exit 2 naming the URL.
#[test]
fn coli_attach_check() {
    let s = ApiServer::start("attach-coli", &["--api-key", KEY]);
    let url = format!("http://{}", s.addr);
    let out = std::process::Command::new(bin("coli"))
        .args(["--attach", &url, "--check"])
        .env("COLIBRI_API_KEY", KEY)
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.first(), Some(&"model: colibri-demo"), "{stdout}");
    assert!(
        lines.iter().any(|l| l.starts_with("telemetry: HWINFO ")),
        "{stdout}"
    );
    assert!(lines.iter().any(|l| l.starts_with("answer: ")), "{stdout}");
    let usage = lines
        .iter()
        .find_map(|l| l.strip_prefix("usage: prompt "))
        .expect("a usage line");
    let (p, c) = usage.split_once(" completion ").unwrap();
    let stat = lines
        .iter()
        .find_map(|l| l.strip_prefix("stat: STAT "))
        .expect("the server's STAT");
    assert!(
        stat.starts_with(&format!("{c} ")) && stat.contains(&format!(" {p} ")),
        "{stat}"
    );

    let refused = std::process::Command::new(bin("coli"))
        .args(["--attach", &url, "--check", "--api-key", "nope"])
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains(&url) && err.contains("HTTP 401"), "{err}");

    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_url = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    let unreachable = std::process::Command::new(bin("coli"))
        .args(["--attach", &gone_url, "--check"])
        .output()
        .unwrap();
    assert_eq!(unreachable.status.code(), Some(2));
    let err = String::from_utf8_lossy(&unreachable.stderr);
    assert!(err.contains(&format!("cannot reach {gone_url}")), "{err}");
}
