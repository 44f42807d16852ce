//! The attach client against captured streams and a scripted server on a local socket.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use protocol::{EngineState, Reply, Stat, Telemetry};

use super::http::Endpoint;
use super::sse::{read_events, Frame};
use super::*;
use crate::app::{Action, App, Config, Phase, Role};
use crate::event::Event;

/// A telemetry stream as `colibri api` writes it (its snapshot, a request's frames, a lag,
/// keep-alives), in chunked transfer coding as hyper sends it.
fn captured_telemetry() -> String {
    let emap = "40".repeat(3 * 16); // 3 rows x 16 experts, all in RAM, heat 0
    let hits = "030000000000"; // experts 0 and 1 of row 0
    [
        ": colibri telemetry\n\n".to_string(),
        "event: telemetry\ndata: HWINFO 2 16.0 8.0 0 0.0 Some CPU|\n\n".into(),
        "event: telemetry\ndata: TIERS 0 12 36 0.00 0.01\n\n".into(),
        format!("event: telemetry\ndata: EMAP 3 16 {emap}\n\n"),
        "event: telemetry\ndata: STATE idle\n\n".into(),
        "event: telemetry\ndata: SESSIONS 1 0 decode 1 30 4\n\n".into(),
        "event: telemetry\ndata: STATE generating\n\n".into(),
        "event: telemetry\ndata: LIVE 4 20.00 75.0 0.30 1 1.00\n\n".into(),
        format!("event: telemetry\ndata: HITS 3 16 {hits}\n\n"),
        "event: telemetry\ndata: PROF 0.500 9 5 0.010 0.020 0.030 0.040 0.050 14\n\n".into(),
        "event: stat\ndata: STAT 5 10.00 75.0 0.30 9 0\n\n".into(),
        "event: lagged\ndata: 3\n\n".into(),
        ": keep-alive\n\n".into(),
        "event: telemetry\ndata: STATE idle\n\n".into(),
    ]
    .concat()
}

fn chunked(body: &str) -> String {
    let mut out = String::new();
    for piece in body.as_bytes().chunks(37) {
        out.push_str(&format!("{:x}\r\n", piece.len()));
        out.push_str(std::str::from_utf8(piece).unwrap_or(""));
        out.push_str("\r\n");
    }
    out.push_str("0\r\n\r\n");
    out
}

fn attached_app() -> App {
    let mut app = App::new(
        Config {
            attach: Some("http://127.0.0.1:1".into()),
            ..Config::default()
        },
        (100, 30),
    );
    app.update(Event::Reply(Reply::Ready));
    app.update(Event::Reply(Reply::Stat(Stat::zero(0.0))));
    app
}

fn type_line(app: &mut App, text: &str) -> Vec<Action> {
    app.input.set(text);
    app.update(Event::Key(KeyEvent::new(
        KeyCode::Enter,
        KeyModifiers::NONE,
    )))
}

/// The captured stream, de-chunked and parsed, moves the dashboard: tiers, map, hit pulses,
/// sessions, the profile, the sparklines; the server's state does not make this client busy.
#[test]
fn a_captured_telemetry_stream_feeds_the_dashboard() {
    let raw = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}",
        chunked(&captured_telemetry())
    );
    let mut r = std::io::Cursor::new(raw.into_bytes());
    let (status, headers) = http::read_head(&mut r).unwrap();
    assert_eq!(status, 200);
    let mut frames = Vec::new();
    let err = read_events(BufReader::new(http::Body::new(r, &headers)), |e| {
        frames.push(Frame::of(&e));
        true
    });
    assert_eq!(err, None);
    assert_eq!(frames.len(), 12, "{frames:?}");
    assert!(frames.contains(&Frame::Lagged(3)));
    assert!(frames
        .iter()
        .any(|f| matches!(f, Frame::Stat(s) if s.completion_tokens == 5)));

    let mut app = attached_app();
    for f in frames {
        if let Frame::Telemetry(t) = f {
            app.update(Event::Telemetry(t));
        }
        assert_eq!(
            app.phase,
            Phase::Idle,
            "another client's request keeps this one idle"
        );
    }
    let d = &app.dash;
    assert_eq!(
        d.tiers.as_ref().map(|t| (t.ram_experts, t.disk_experts)),
        Some((12, 36))
    );
    assert_eq!(d.emap.as_ref().map(|e| (e.rows, e.cols)), Some((3, 16)));
    assert_eq!(
        d.pulse.iter().filter(|&&p| p > 0.0).count(),
        2,
        "two experts hit"
    );
    assert_eq!(d.sessions.as_ref().map(Vec::len), Some(1));
    assert_eq!(d.prof.as_ref().map(|p| p.completion_tokens), Some(5));
    assert_eq!(d.hit_hist.back(), Some(&75.0));
    assert_eq!(app.figures.hit_pct, 75.0);
    assert_eq!(
        app.figures.tokens, 0,
        "the status bar's tokens are this client's own"
    );
}

/// Turns go out as chat requests carrying the history; `:reset` starts it over; `:slot` and
/// `:more` say they do not apply; `:set` values travel with the next request.
#[test]
fn attached_turns_carry_the_history() {
    let mut app = attached_app();
    let a = type_line(&mut app, "hello");
    let Some(Action::Chat(req)) = a.first() else {
        panic!("{a:?}")
    };
    assert_eq!(req.messages, [("user", "hello".to_string())]);
    assert_eq!(app.phase, Phase::Prefill);
    app.update(Event::Reply(Reply::Text(b"Hi there".to_vec())));
    app.update(Event::Reply(Reply::End {
        leading_newline: false,
    }));
    app.update(Event::Reply(Reply::Stat(Stat {
        prompt: Some((5, false)),
        ..Stat::zero(0.3)
    })));
    assert_eq!(app.phase, Phase::Idle);
    let footer = app
        .turns
        .last()
        .and_then(|t| t.footer.clone())
        .unwrap_or_default();
    assert!(footer.contains("end of text"), "{footer}");

    assert!(type_line(&mut app, ":set temp 0.2").is_empty());
    let a = type_line(&mut app, "and more?");
    let Some(Action::Chat(req)) = a.first() else {
        panic!("{a:?}")
    };
    assert_eq!(
        req.messages,
        [
            ("user", "hello".to_string()),
            ("assistant", "Hi there".to_string()),
            ("user", "and more?".to_string())
        ]
    );
    assert_eq!(req.temperature, 0.2);
    // A refused turn: no text, the zero STAT.
    app.update(Event::Reply(Reply::End {
        leading_newline: false,
    }));
    app.update(Event::Reply(Reply::Stat(Stat::zero6(0.0))));
    assert_eq!(app.phase, Phase::Idle);

    assert!(type_line(&mut app, ":slot 2").is_empty());
    assert!(app
        .flash
        .as_ref()
        .is_some_and(|f| f.0.contains(":slot does not apply")));
    assert!(type_line(&mut app, ":more").is_empty());
    assert!(app
        .flash
        .as_ref()
        .is_some_and(|f| f.0.contains(":more does not apply")));
    assert!(type_line(&mut app, ":reset").is_empty());
    let a = type_line(&mut app, "fresh");
    let Some(Action::Chat(req)) = a.first() else {
        panic!("{a:?}")
    };
    assert_eq!(req.messages, [("user", "fresh".to_string())]);
    assert!(app.turns.iter().any(|t| t.role == Role::Notice));
    // Ctrl-C stops the answer as locally.
    let a = app.update(Event::Key(KeyEvent::new(
        KeyCode::Char('c'),
        KeyModifiers::CONTROL,
    )));
    assert_eq!(a, vec![Action::Interrupt]);
}

#[test]
fn answers_and_their_stat() {
    let stream = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"length\"}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n\
data: [DONE]\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"after done\"}}]}\n\n";
    let mut pieces = Vec::new();
    let (a, err) = read_answer(std::io::Cursor::new(stream), |t| pieces.push(t.to_string()));
    assert_eq!(err, None);
    assert_eq!(pieces, ["Hel", "lo"]);
    assert_eq!(
        (a.text.as_str(), a.chunks, a.usage),
        ("Hello", 2, Some((9, 2)))
    );
    assert_eq!(a.finish.as_deref(), Some("length"));

    let other = Stat {
        completion_tokens: 2,
        prompt: Some((30, false)),
        ..Stat::zero(1.0)
    };
    let mine = Stat {
        route: None,
        prefetch: None,
        completion_tokens: 2,
        tok_per_s: 12.5,
        hit_pct: 80.0,
        rss_gb: 0.4,
        prompt: Some((9, false)),
    };
    assert_eq!(server_stat(&a, std::slice::from_ref(&other)), None);
    let s = server_stat(&a, &[mine.clone(), other]).unwrap();
    assert_eq!(
        (s.hit_pct, s.tok_per_s, s.prompt),
        (80.0, 12.5, Some((9, true)))
    );
    let c = client_stat(&a, Instant::now(), None);
    assert_eq!((c.completion_tokens, c.prompt), (2, Some((9, true))));
    assert_eq!((c.hit_pct, c.rss_gb), (0.0, 0.0));
    let stopped = Answer {
        chunks: 3,
        ..Answer::default()
    };
    let c = client_stat(&stopped, Instant::now(), Some((61.5, 0.25)));
    assert_eq!((c.completion_tokens, c.prompt), (3, None));
    assert_eq!(
        (c.hit_pct, c.rss_gb),
        (61.5, 0.25),
        "the last LIVE line's figures"
    );
    assert_ne!(c, Stat::zero6(0.0), "a stopped answer is not a refusal");
}

/// A scripted `colibri api`: answers each connection by its request line.
fn fake_server(key: Option<&'static str>) -> (String, std::thread::JoinHandle<Vec<String>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let h = std::thread::spawn(move || {
        let mut bodies = Vec::new();
        l.set_nonblocking(false).unwrap();
        for conn in l.incoming().take(4) {
            let Ok(mut s) = conn else { break };
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut first = String::new();
            r.read_line(&mut first).unwrap();
            let mut len = 0usize;
            let mut auth = None;
            loop {
                let mut h = String::new();
                r.read_line(&mut h).unwrap();
                let h = h.trim_end().to_string();
                if h.is_empty() {
                    break;
                }
                let (k, v) = h.split_once(':').unwrap();
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse().unwrap();
                }
                if k.eq_ignore_ascii_case("authorization") {
                    auth = Some(v.trim().to_string());
                }
            }
            let mut body = vec![0; len];
            r.read_exact(&mut body).unwrap();
            bodies.push(String::from_utf8_lossy(&body).into_owned());
            let path = first.split(' ').nth(1).unwrap_or("").to_string();
            if key.is_some_and(|k| auth != Some(format!("Bearer {k}"))) && path != "/health" {
                let b = r#"{"error":{"message":"missing or wrong API key"}}"#;
                let _ = write!(
                    s,
                    "HTTP/1.1 401 Unauthorized\r\ncontent-length: {}\r\n\r\n{b}",
                    b.len()
                );
                continue;
            }
            let sse = |s: &mut TcpStream, body: &str| {
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}",
                    chunked(body)
                );
            };
            match path.as_str() {
                "/health" => {
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\ncontent-length: 15\r\n\r\n{{\"status\":\"ok\"}}"
                    );
                }
                "/v1/models" => {
                    let b = r#"{"object":"list","data":[{"id":"colibri-demo"}]}"#;
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{b}",
                        b.len()
                    );
                }
                "/v1/colibri/telemetry" => sse(&mut s, &captured_telemetry()),
                "/v1/chat/completions" => sse(
                    &mut s,
                    "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n\
data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\" you\"}}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":5}}\n\ndata: [DONE]\n\n",
                ),
                _ => {
                    let _ = write!(s, "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
                }
            }
        }
        bodies
    });
    (addr, h)
}

/// `--check` against the scripted server: the model, the first record, the answer, and the
/// server's STAT of it (counts 9 and 5, as the captured stream's STAT has).
#[test]
fn check_against_a_scripted_server() {
    let (addr, h) = fake_server(Some("sekrit"));
    let ep = Endpoint::parse(&format!("http://{addr}"), Some("sekrit".into())).unwrap();
    let mut out = Vec::new();
    // The scripted STAT says 5 completion tokens and 9 prompt tokens; so does the usage.
    check(&ep, "Say hi", 8, &mut out).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert_eq!(
        out,
        "model: colibri-demo\ntelemetry: HWINFO 2 16.0 8.0 0 0.0 Some CPU|\nanswer: Hi you\nusage: prompt 9 completion 5\nstat: STAT 5 10.00 75.0 0.30 9 0\n"
    );
    let bodies = h.join().unwrap();
    let chat: serde_json::Value = serde_json::from_str(bodies.last().unwrap()).unwrap();
    assert_eq!(chat["messages"][0]["content"], "Say hi");
    assert_eq!(chat["stream"], true);
    assert_eq!(chat["max_tokens"], 8);
}

/// A wrong key is refused before anything else, naming the URL and the status.
#[test]
fn a_refused_key_names_the_url_and_401() {
    let (addr, _h) = fake_server(Some("sekrit"));
    let ep = Endpoint::parse(&format!("http://{addr}"), Some("wrong".into())).unwrap();
    let err = check(&ep, "x", 1, &mut Vec::new()).unwrap_err();
    assert!(
        err.contains(&addr) && err.contains("HTTP 401") && err.contains("missing or wrong API key"),
        "{err}"
    );
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = closed.local_addr().unwrap();
    drop(closed);
    let ep = Endpoint::parse(&format!("http://{gone}"), None).unwrap();
    let err = check(&ep, "x", 1, &mut Vec::new()).unwrap_err();
    assert!(
        err.starts_with(&format!("cannot reach http://{gone}")),
        "{err}"
    );
}

/// The whole control against the scripted server: READY, the dashboard's records, and a chat
/// turn's text, END and the server's STAT.
#[test]
fn attached_control_feeds_the_event_channel() {
    let (addr, _h) = fake_server(None);
    let ep = Endpoint::parse(&format!("http://{addr}"), None).unwrap();
    let (tx, rx) = crossbeam_channel::unbounded();
    let mut ctl = Attached::start(ep, "colibri-demo".into(), tx);
    let t0 = Instant::now();
    let mut seen = Vec::new();
    let next = || rx.recv_timeout(Duration::from_secs(20)).expect("an event");
    while !seen
        .iter()
        .any(|e| matches!(e, Event::Telemetry(Telemetry::State(EngineState::Idle))))
    {
        seen.push(next());
        assert!(t0.elapsed() < Duration::from_secs(20));
    }
    assert!(seen.contains(&Event::Reply(Reply::Ready)));
    assert!(seen
        .iter()
        .any(|e| matches!(e, Event::Stderr(l) if l.starts_with("[MODEL] colibri-demo"))));
    // Let the stream's STAT frame arrive before the answer ends.
    std::thread::sleep(Duration::from_millis(200));
    ctl.chat(ChatRequest {
        messages: vec![("user", "hi".into())],
        max_tokens: 8,
        temperature: 0.0,
        top_p: 1.0,
    });
    let mut text = Vec::new();
    let stat = loop {
        match next() {
            Event::Reply(Reply::Text(t)) => text.extend(t),
            Event::Reply(Reply::Stat(s)) => break s,
            _ => {}
        }
    };
    assert_eq!(text, b"Hi you");
    assert_eq!(
        stat.hit_pct, 75.0,
        "the server's STAT of this answer: {stat:?}"
    );
    ctl.close();
}
