//! `colibri api` attacked as a hostile client or web page would (issue "The API under
//! attack"), each attack end to end against the real binary on the demo model: a log pipe
//! that breaks, idle and slow sockets, a declared body never sent, connections past the
//! limit, a shutdown with a stalled client and a second signal, the prefix cache probed for
//! another client's prompt, a rebound DNS name and a cross-site `text/plain` POST, and the
//! smaller protocol details (405 bodies, the Bearer scheme, `param`, empty stop strings).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use colibri_e2e::colibri;
use colibri_e2e::http::{parse_response, ApiServer};
use serde_json::{json, Value};

const CT: (&str, &str) = ("Content-Type", "application/json");

/// Reads from `s` until the peer closes it (or the read timeout); true when it closed.
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn signal(child: &std::process::Child, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig}");
}

/// Waits up to `limit` for the child to exit; its status and how long it took.
fn wait_exit(
    child: &mut std::process::Child,
    limit: Duration,
) -> Option<(std::process::ExitStatus, Duration)> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(st) = child.try_wait().unwrap() {
            return Some((st, t0.elapsed()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

/// A connection that declared a 100-byte body and sent one byte of it.
fn stalled_post(s: &ApiServer) -> TcpStream {
    let mut c = s.connect();
    write!(
        c,
        "POST /v1/completions HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{",
        s.addr
    )
    .unwrap();
    c
}

type StderrLines = std::io::Lines<BufReader<std::process::ChildStderr>>;

/// `colibri api` on a free port with its demo cache in `cache` and its state in `state`, read
/// up to its ready line: the child, its address, and the rest of its stderr, which the test
/// holds, drains or closes.
fn spawn_api(
    cache: &std::path::Path,
    state: &std::path::Path,
) -> (std::process::Child, String, StderrLines) {
    let mut child = colibri()
        .args(["api", "--listen", "127.0.0.1:0", "--state-dir"])
        .arg(state)
        .env("XDG_CACHE_HOME", cache)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(a) = line.strip_prefix("[api] listening on http://") {
            addr = Some(a.to_string());
        }
        if line.starts_with("[api] ready") {
            break;
        }
    }
    (child, addr.expect("the listening line"), lines)
}

#[test]
fn a_broken_stderr_does_not_stop_the_server() {
    let state = colibri_e2e::temp_dir("api-epipe");
    let (mut child, addr, lines) = spawn_api(&state, &state);
    // The log's reader goes away (`tee` died): every later log line meets EPIPE.
    drop(lines);
    let post = |body: &Value| {
        let mut s = TcpStream::connect(&addr).unwrap();
        let body = body.to_string();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).unwrap();
        parse_response(&raw)
    };
    for _ in 0..3 {
        let r = post(&json!({"prompt": "In the beginning", "max_tokens": 4}));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the server exited on a log line to a closed pipe"
    );
    let mut s = TcpStream::connect(&addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let text = parse_response(&raw).text();
    let dropped: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("colibri_log_lines_dropped_total "))
        .and_then(|v| v.parse().ok())
        .expect("the dropped-lines metric");
    assert!(
        dropped >= 3.0,
        "each request's log line is counted: {dropped}"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// The daemon alike: `colibri serve` whose stderr reader is gone from the start still
/// answers on stdout, turn after turn.
#[test]
fn the_daemon_with_a_broken_stderr_still_answers() {
    let state = colibri_e2e::temp_dir("serve-epipe");
    let mut child = colibri()
        .args(["serve", "--ngen", "4", "--temp", "0", "--state-dir"])
        .arg(&state)
        .env("XDG_CACHE_HOME", &state)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stderr.take());
    let mut stdin = child.stdin.take().unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    for _ in 0..3 {
        let mut line = Vec::new();
        assert!(
            out.read_until(b'\n', &mut line).unwrap() > 0,
            "no startup frame"
        );
    }
    for _ in 0..3 {
        let text = "In the beginning";
        write!(stdin, "\x02PROMPT {} 4 0 1\n{text}\n", text.len()).unwrap();
        stdin.flush().unwrap();
        let mut got = Vec::new();
        while !got.ends_with(b"\x01\x01END\x01\x01\n") {
            let mut line = Vec::new();
            assert!(
                out.read_until(b'\n', &mut line).unwrap() > 0,
                "the daemon stopped answering after a log line to a closed pipe"
            );
            got.extend(line);
        }
        let mut stat = Vec::new();
        out.read_until(b'\n', &mut stat).unwrap();
        assert!(
            stat.starts_with(b"STAT "),
            "{:?}",
            String::from_utf8_lossy(&stat)
        );
    }
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// A save that fails (here the state folder is replaced by a file under the server, so the
/// conversation's file can be made neither there nor anew) is told to the client, with the
/// whole answer, and counted; the server goes on.
#[test]
fn a_failed_save_is_told_to_the_client_and_counted() {
    let cache = colibri_e2e::temp_dir("api-savefail-cache");
    let state = colibri_e2e::temp_dir("api-savefail-state");
    let (mut child, addr, lines) = spawn_api(&cache, &state);
    std::thread::spawn(move || lines.for_each(drop));
    std::fs::remove_dir_all(&state).unwrap();
    std::fs::write(&state, b"not a folder").unwrap();
    let post = |body: &Value| {
        let mut c = TcpStream::connect(&addr).unwrap();
        let body = body.to_string();
        write!(
            c,
            "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut raw = Vec::new();
        c.read_to_end(&mut raw).unwrap();
        parse_response(&raw)
    };
    let r = post(&pin_chat("In the beginning", None));
    assert_eq!(r.status, 200, "{}", r.text());
    let warning = r.header("x-colibri-warning").expect("a warning header");
    assert!(warning.contains("could not be saved"), "{warning}");
    let mut streamed = pin_chat("And God said", None);
    streamed["stream"] = json!(true);
    let r = post(&streamed);
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    assert!(
        text.contains(
            "\n: warning: the answer is complete but the conversation could not be saved"
        ),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let mut c = TcpStream::connect(&addr).unwrap();
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    c.read_to_end(&mut raw).unwrap();
    let metrics = parse_response(&raw).text();
    let failed: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("colibri_session_save_failures_total "))
        .and_then(|v| v.parse().ok())
        .expect("the save-failures metric");
    assert!(failed >= 2.0, "{failed}");
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_file(&state);
}

#[test]
fn idle_slow_and_silent_connections_are_closed_while_health_answers() {
    let s = ApiServer::start(
        "api-timeouts",
        &[
            "--header-timeout",
            "1",
            "--idle-timeout",
            "2",
            "--body-timeout",
            "1",
            "--max-connections",
            "64",
        ],
    );
    // 300 sockets that never send a byte: more than the limit, and /health still answers
    // (the idle ones make room).
    let mut idle: Vec<TcpStream> = (0..300).map(|_| s.connect()).collect();
    let t0 = Instant::now();
    let r = s.get("/health");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(t0.elapsed() < Duration::from_secs(5));
    // A silent connection is closed by the header timeout.
    assert!(closed_within(
        idle.last_mut().unwrap(),
        Duration::from_secs(10)
    ));
    drop(idle);
    // Slowloris: a head trickled a byte at a time is cut off at --header-timeout.
    let mut slow = s.connect();
    let t0 = Instant::now();
    let head = format!(
        "GET /health HTTP/1.1\r\nHost: {}\r\nX-Slow: {}",
        s.addr,
        "a".repeat(200)
    );
    let mut cut = false;
    for b in head.bytes() {
        if slow.write_all(&[b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        if t0.elapsed() > Duration::from_secs(8) {
            break;
        }
    }
    assert!(
        cut || closed_within(&mut slow, Duration::from_secs(5)),
        "a trickled head was not cut off"
    );
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    // A declared body that never comes: 408 at --body-timeout.
    let mut stalled = stalled_post(&s);
    let mut raw = Vec::new();
    let _ = stalled.read_to_end(&mut raw);
    let r = parse_response(&raw);
    assert_eq!(r.status, 408, "{}", r.text());
    assert!(r.text().contains("--body-timeout"), "{}", r.text());
    // A kept-alive connection is closed after --idle-timeout without a next request.
    let mut kept = s.connect();
    write!(kept, "GET /health HTTP/1.1\r\nHost: {}\r\n\r\n", s.addr).unwrap();
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(closed_within(&mut kept, Duration::from_secs(10)));
    assert!(s.metric("connections_timed_out_total") >= 3.0);
}

#[test]
fn connections_past_the_limit_with_requests_in_flight_get_503() {
    let s = ApiServer::start(
        "api-maxconn",
        &["--max-connections", "2", "--body-timeout", "60"],
    );
    // Two connections each mid-request (a body still to come).
    let busy: Vec<TcpStream> = (0..2).map(|_| stalled_post(&s)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let r = s.get("/health");
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("--max-connections"), "{}", r.text());
    drop(busy);
    s.wait_for("the busy connections to close", |s| {
        let mut c = s.connect();
        let _ = write!(
            c,
            "GET /health HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            s.addr
        );
        let mut raw = Vec::new();
        let _ = c.read_to_end(&mut raw);
        raw.starts_with(b"HTTP/1.1 200")
    });
    assert!(s.metric("connections_refused_total") >= 1.0);
}

#[test]
fn shutdown_closes_a_stalled_client_and_a_second_signal_exits_at_once() {
    // One signal: open requests get --shutdown-timeout, then the server exits anyway.
    let mut s = ApiServer::start(
        "api-shutdown",
        &["--shutdown-timeout", "1", "--body-timeout", "600"],
    );
    let _stalled = stalled_post(&s);
    std::thread::sleep(Duration::from_millis(300));
    signal(&s.child, "TERM");
    let (status, took) =
        wait_exit(&mut s.child, Duration::from_secs(30)).expect("the server did not exit");
    assert!(status.success(), "{status:?}");
    assert!(took < Duration::from_secs(10), "shutdown took {took:?}");
    // Two signals: the second exits at once, whatever the grace.
    let mut s = ApiServer::start(
        "api-shutdown2",
        &["--shutdown-timeout", "600", "--body-timeout", "600"],
    );
    let _stalled = stalled_post(&s);
    std::thread::sleep(Duration::from_millis(300));
    signal(&s.child, "TERM");
    s.wait_for("the shutdown to start", |s| {
        s.stderr().contains("shutting down")
    });
    assert!(
        s.child.try_wait().unwrap().is_none(),
        "it waits for the stalled request"
    );
    signal(&s.child, "INT");
    let (status, took) =
        wait_exit(&mut s.child, Duration::from_secs(30)).expect("the second signal did not exit");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(status.code(), Some(130), "{status:?}");
}

fn pin_chat(text: &str, user: Option<&str>) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2,
                          "temperature": 0});
    if let Some(u) = user {
        body["user"] = json!(u);
    }
    body
}

fn cached(r: &colibri_e2e::http::HttpResponse) -> u64 {
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

/// The words a prober tries; the victim's password is one of them.
const WORDS: [&str; 10] = [
    "apple",
    "river",
    "swordfish",
    "candle",
    "mountain",
    "silver",
    "garden",
    "thunder",
    "lantern",
    "harvest",
];
const SECRET: &str = "The password is swordfish";

/// The attack: a client that may not read another's conversation probes the prefix cache
/// one guess at a time. Before the fix the right guess came back with more cached tokens.
fn probe_words(s: &ApiServer, key: Option<&str>, user: Option<&str>) -> Vec<u64> {
    WORDS
        .iter()
        .map(|w| {
            let body = pin_chat(&format!("The password is {w}"), user).to_string();
            let auth = key.map(|k| format!("Bearer {k}"));
            let mut headers = vec![CT];
            if let Some(a) = &auth {
                headers.push(("Authorization", a.as_str()));
            }
            cached(&s.request("POST", "/v1/chat/completions", &headers, body.as_bytes()))
        })
        .collect()
}

/// What a prober learns: the first probe reuses nothing, and every later one reuses the same
/// amount (its own earlier probe's prefix), whatever the guess.
fn assert_nothing_learnt(who: &str, probes: &[u64]) {
    assert_eq!(
        probes[0], 0,
        "{who}'s first probe reused another's prefix: {probes:?}"
    );
    assert!(
        probes[1..].iter().all(|&c| c == probes[1]),
        "{who}'s cached tokens depend on the guess ({WORDS:?}): {probes:?}"
    );
}

#[test]
fn prefix_reuse_never_crosses_clients_and_survives_a_restart() {
    // Enough slots that no probe evicts alice's conversation (each new conversation takes an
    // empty slot while there is one).
    let slots = ["--kv-slots", "40"];
    let mut s = ApiServer::start("api-tenants", &slots);
    let alice = |s: &ApiServer| s.post("/v1/chat/completions", &pin_chat(SECRET, Some("alice")));
    assert_eq!(cached(&alice(&s)), 0);
    // Alice's own repeat reuses her prefix.
    assert!(cached(&alice(&s)) > 0, "a client's own prefix is reused");
    // Another user probing, and anonymous requests (a client of their own).
    assert_nothing_learnt("mallory", &probe_words(&s, None, Some("mallory")));
    assert_nothing_learnt("anonymous", &probe_words(&s, None, None));
    // After a restart each slot is still its owner's.
    let state = s.state.clone();
    let _ = s.child.kill();
    let _ = s.child.wait();
    let s = ApiServer::start_in(&state, &slots);
    assert_nothing_learnt("eve", &probe_words(&s, None, Some("eve")));
    assert!(
        cached(&alice(&s)) > 0,
        "alice's prefix survives the restart"
    );
    // The control: within one client the probe does tell the right guess (the channel the
    // rule closes between clients is real, and this probe would see it).
    let own = probe_words(&s, None, Some("alice"));
    let right = WORDS.iter().position(|w| *w == "swordfish").unwrap();
    assert!(
        own.iter()
            .enumerate()
            .all(|(i, &c)| i == right || c < own[right]),
        "alice's own probe does not single out her password: {own:?}"
    );
}

#[test]
fn each_api_key_is_a_client_of_its_own() {
    let s = ApiServer::start(
        "api-keys",
        &[
            "--api-key",
            "key-of-alice",
            "--api-key",
            "key-of-bob",
            "--kv-slots",
            "3",
        ],
    );
    let secret = pin_chat(SECRET, None).to_string();
    let as_alice = || {
        cached(&s.request(
            "POST",
            "/v1/chat/completions",
            &[CT, ("Authorization", "Bearer key-of-alice")],
            secret.as_bytes(),
        ))
    };
    as_alice();
    assert!(as_alice() > 0);
    assert_nothing_learnt("bob", &probe_words(&s, Some("key-of-bob"), None));
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &[CT, ("Authorization", "bearer key-of-bob")],
        pin_chat("Hi", None).to_string().as_bytes(),
    );
    assert_eq!(
        r.status,
        200,
        "the Bearer scheme is case-insensitive: {}",
        r.text()
    );
}

#[test]
fn browsers_cannot_reach_the_default_server() {
    let s = ApiServer::start("api-browser", &["--allow-host", "colibri.lan"]);
    let body = pin_chat("Hi", None).to_string();
    // A page whose name was rebound to 127.0.0.1 sends its own name as Host.
    for host in [
        "evil.example",
        "evil.example:8080",
        "127.0.0.1.evil.example",
    ] {
        let r = s.request("GET", "/v1/models", &[("Host", host)], b"");
        assert_eq!(r.status, 421, "{host}: {}", r.text());
        assert!(r.text().contains("--allow-host"), "{}", r.text());
    }
    for host in [
        "localhost:1234",
        "127.0.0.1",
        "[::1]:80",
        "colibri.lan",
        "COLIBRI.LAN:9",
    ] {
        let r = s.request("GET", "/v1/models", &[("Host", host)], b"");
        assert_eq!(r.status, 200, "{host}: {}", r.text());
    }
    // The simple requests a page may send cross-site without a preflight.
    for ct in [
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ] {
        let r = s.request(
            "POST",
            "/v1/chat/completions",
            &[("Content-Type", ct)],
            body.as_bytes(),
        );
        assert_eq!(r.status, 415, "{ct}: {}", r.text());
    }
    let r = s.request("POST", "/v1/completions", &[], b"{\"prompt\":\"x\"}");
    assert_eq!(r.status, 415, "{}", r.text());
    let r = s.request(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json; charset=utf-8")],
        body.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn the_smaller_protocol_details() {
    let s = ApiServer::start("api-details", &[]);
    // 405 has a body in the API's shape.
    let r = s.request("GET", "/v1/chat/completions", &[], b"");
    assert_eq!(r.status, 405);
    assert!(r.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("GET"));
    let r = s.request("DELETE", "/v1/messages", &[], b"");
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["type"], "error");
    // `param` names a field or is null, never a value or "".
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "many"}),
    );
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["error"]["param"], Value::Null, "{}", r.text());
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Hi"}], "tool_choice": "sometimes",
                "tools": [{"type": "function", "function": {"name": "f"}}]}),
    );
    assert_eq!(r.json()["error"]["param"], "tool_choice", "{}", r.text());
    // Empty stop strings are refused by completions as by chat.
    let r = s.post("/v1/completions", &json!({"prompt": "In", "stop": [""]}));
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "stop");
}
