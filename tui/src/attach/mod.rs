//! `coli --attach URL`: the TUI on a running `colibri api` instead of a daemon of its own.
//!
//! [`Attached`] is the [`Control`] of that mode. It feeds the same event channel a daemon's
//! threads do, so the app and the screen are the local mode's: a connect thread waits for the
//! server's `/health`, says READY, and reads `GET /v1/colibri/telemetry` into
//! `Event::Telemetry` (the dashboard); each chat turn is a thread streaming `POST
//! /v1/chat/completions` back as the legacy protocol's text, END and STAT. Ctrl-C closes the
//! answer's connection (the server stops the request when its client goes).

pub mod http;
pub mod sse;

use std::collections::VecDeque;
use std::io::{BufReader, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use protocol::{Reply, Stat, Telemetry};
use serde_json::json;

use crate::app::ChatRequest;
use crate::event::{Event, ExitInfo};
use crate::io::Control;
use http::{Closer, Endpoint, HttpError};
use sse::{read_events, ChatChunk, Frame};

/// The telemetry route of `colibri api`.
pub const TELEMETRY_PATH: &str = "/v1/colibri/telemetry";

/// Connecting and short requests (`/health`, `/v1/models`).
const SHORT: Duration = Duration::from_secs(10);
/// A read on a stream: the server sends a keep-alive every 10 s, so a silence this long is a
/// dead connection. An answer's first token may come after a long prefill: an hour.
const TELEMETRY_SILENCE: Duration = Duration::from_secs(45);
const ANSWER_SILENCE: Duration = Duration::from_secs(3600);
/// Server STATs kept to find this client's own among other clients'.
const RECENT_STATS: usize = 32;

/// The model the server serves (`/v1/models`' first id): the answer to "is it there and does
/// it take the key", asked before the terminal is taken.
pub fn preflight(ep: &Endpoint) -> Result<String, HttpError> {
    let r = ep.request("GET", "/v1/models", None, SHORT)?;
    let mut body = Vec::new();
    std::io::Read::read_to_end(&mut std::io::Read::take(r.body, 1 << 20), &mut body)
        .map_err(|e| HttpError::Io(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| {
        HttpError::Io(format!(
            "/v1/models is not JSON ({e}): is this colibri api?"
        ))
    })?;
    Ok(v.pointer("/data/0/id")
        .and_then(|m| m.as_str())
        .unwrap_or("colibri")
        .to_string())
}

/// Waits until `/health` says `ok` (503 while the model loads), calling `loading` once when
/// it is not yet. Any other answer or a lost connection is the error.
pub fn wait_ready(
    ep: &Endpoint,
    mut loading: impl FnMut(),
    stop: &AtomicBool,
) -> Result<(), HttpError> {
    let mut said = false;
    loop {
        match ep.request("GET", "/health", None, SHORT) {
            Ok(_) => return Ok(()),
            Err(HttpError::Status {
                status: 503,
                message,
            }) if message.contains("loading") => {
                if !std::mem::replace(&mut said, true) {
                    loading();
                }
            }
            Err(e) => return Err(e),
        }
        if stop.load(Ordering::Relaxed) {
            return Err(HttpError::Io("stopped".into()));
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// The JSON body of a chat turn.
pub fn chat_body(model: &str, req: &ChatRequest) -> serde_json::Value {
    let messages: Vec<_> = req
        .messages
        .iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    json!({
        "model": model,
        "messages": messages,
        "stream": true,
        "stream_options": {"include_usage": true},
        "max_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
    })
}

/// What an answer's stream added up to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Answer {
    pub text: String,
    /// Text chunks received (the token count when the server sent no usage).
    pub chunks: u32,
    pub usage: Option<(u32, u32)>,
    pub finish: Option<String>,
    pub error: Option<String>,
    /// The first text's arrival.
    pub first: Option<Instant>,
}

/// Reads a chat completion's SSE stream, calling `text` for each piece of content.
pub fn read_answer(
    r: impl std::io::BufRead,
    mut text: impl FnMut(&str),
) -> (Answer, Option<String>) {
    let mut a = Answer::default();
    let err = read_events(r, |ev| {
        let Some(c) = ChatChunk::parse(&ev.data) else {
            return true;
        };
        if !c.text.is_empty() {
            a.first.get_or_insert_with(Instant::now);
            a.chunks += 1;
            a.text.push_str(&c.text);
            text(&c.text);
        }
        if c.finish.is_some() {
            a.finish = c.finish;
        }
        if c.usage.is_some() {
            a.usage = c.usage;
        }
        if c.error.is_some() {
            a.error = c.error;
        }
        !c.done
    });
    (a, err)
}

/// The server's STAT of this answer: the newest of its STAT frames with the answer's token
/// counts (hit rate, RSS and decode speed as the engine measured them). Counts are all a
/// STAT frame has to go by, as it names no client.
pub fn server_stat(a: &Answer, recent: &[Stat]) -> Option<Stat> {
    let (p, c) = a.usage?;
    let limited = a.finish.as_deref() == Some("length");
    recent
        .iter()
        .rev()
        .find(|s| s.completion_tokens == c && s.prompt.is_some_and(|(sp, _)| sp == p))
        .map(|s| Stat {
            prompt: Some((p, limited)),
            ..s.clone()
        })
}

/// The STAT of an answer the server's telemetry did not describe (one stopped by Ctrl-C has
/// no usage to match): what the client measured, with the hit rate and RSS of the server's
/// last LIVE line (`live`), else 0.
pub fn client_stat(a: &Answer, ended: Instant, live: Option<(f64, f64)>) -> Stat {
    let completion = a.usage.map_or(a.chunks, |u| u.1);
    let limited = a.finish.as_deref() == Some("length");
    let tok_per_s = match a.first {
        Some(t) if completion > 1 => {
            let s = ended.saturating_duration_since(t).as_secs_f64();
            if s > 0.0 {
                (completion - 1) as f64 / s
            } else {
                0.0
            }
        }
        _ => 0.0,
    };
    Stat {
        route: None,
        prefetch: None,
        completion_tokens: completion,
        tok_per_s,
        hit_pct: live.map_or(0.0, |l| l.0),
        rss_gb: live.map_or(0.0, |l| l.1),
        // A stopped answer has no usage: the 4-field form, which never reads as a refusal.
        prompt: a.usage.map(|(p, _)| (p, limited)),
    }
}

/// What the threads of one attachment share.
struct Shared {
    ep: Endpoint,
    events: Sender<Event>,
    model: Mutex<String>,
    /// The answer in flight's socket (Ctrl-C closes it).
    answer: Mutex<Option<Closer>>,
    interrupted: AtomicBool,
    /// The telemetry stream's socket.
    telemetry: Mutex<Option<Closer>>,
    /// Bumped by each (re)connect and by quitting: an older thread's end is not news.
    generation: AtomicU64,
    recent: Mutex<VecDeque<Stat>>,
    /// The hit rate and RSS of the last LIVE line.
    live: Mutex<Option<(f64, f64)>>,
}

/// The [`Control`] of `--attach`.
pub struct Attached {
    shared: Arc<Shared>,
}

impl Attached {
    /// Starts the connect thread (READY once the server is ready, then the dashboard).
    pub fn start(ep: Endpoint, model: String, events: Sender<Event>) -> Attached {
        let a = Attached {
            shared: Arc::new(Shared {
                ep,
                events,
                model: Mutex::new(model),
                answer: Mutex::new(None),
                interrupted: AtomicBool::new(false),
                telemetry: Mutex::new(None),
                generation: AtomicU64::new(0),
                recent: Mutex::new(VecDeque::new()),
                live: Mutex::new(None),
            }),
        };
        a.connect();
        a
    }

    /// (Re)connects: a new generation first, so the old stream's end (closed here) is not
    /// taken for the server's.
    fn connect(&self) {
        let sh = self.shared.clone();
        let gen = sh.generation.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(c) = lock(&sh.telemetry).take() {
            c.close();
        }
        let spawned = thread::Builder::new()
            .name("attach-telemetry".into())
            .spawn(move || connect_and_watch(&sh, gen));
        if let Err(e) = spawned {
            let _ = self.shared.events.send(Event::SpawnFailed(e.to_string()));
        }
    }

    /// Ends every stream (quitting).
    pub fn close(&self) {
        let sh = &self.shared;
        sh.generation.fetch_add(1, Ordering::SeqCst);
        if let Some(c) = lock(&sh.telemetry).take() {
            c.close();
        }
        if let Some(c) = lock(&sh.answer).take() {
            c.close();
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The connect thread: `/health` until ready, READY, then the telemetry stream until it ends.
fn connect_and_watch(sh: &Shared, gen: u64) {
    let ev = &sh.events;
    let url = sh.ep.url.clone();
    let current = || sh.generation.load(Ordering::SeqCst) == gen;
    let stop = AtomicBool::new(false);
    let ready = wait_ready(
        &sh.ep,
        || {
            let _ = ev.send(Event::Stderr(format!(
                "[attach] {url}: the model is still loading"
            )));
        },
        &stop,
    )
    .and_then(|()| preflight(&sh.ep));
    let model = match ready {
        Ok(m) => m,
        Err(e) => {
            if current() {
                let _ = ev.send(Event::Stderr(format!("colibri: {}", e.describe(&url))));
                let _ = ev.send(Event::DaemonExited(ExitInfo {
                    code: None,
                    signal: None,
                }));
            }
            return;
        }
    };
    let _ = ev.send(Event::Stderr(format!("[MODEL] {model} at {url}")));
    *lock(&sh.model) = model;
    let _ = ev.send(Event::Reply(Reply::Ready));
    let _ = ev.send(Event::Reply(Reply::Stat(Stat::zero(0.0))));
    let resp = match sh
        .ep
        .request("GET", TELEMETRY_PATH, None, TELEMETRY_SILENCE)
    {
        Ok(r) => r,
        Err(e) => {
            // An older server without the stream still chats: the dashboard then shows the
            // answers' own figures only.
            let _ = ev.send(Event::Stderr(format!(
                "[attach] no telemetry stream ({}): the dashboard follows this client's answers only",
                e.describe(&url)
            )));
            return;
        }
    };
    *lock(&sh.telemetry) = Some(resp.closer);
    if !current() {
        // Quit or reconnected while this one was connecting.
        if let Some(c) = lock(&sh.telemetry).take() {
            c.close();
        }
        return;
    }
    let why = read_events(BufReader::new(resp.body), |e| {
        match Frame::of(&e) {
            Frame::Telemetry(t) => {
                if let Telemetry::Live(l) = &t {
                    *lock(&sh.live) = Some((l.hit_pct, l.rss_gb));
                }
                return ev.send(Event::Telemetry(t)).is_ok();
            }
            Frame::Stat(s) => {
                let mut r = lock(&sh.recent);
                if r.len() == RECENT_STATS {
                    r.pop_front();
                }
                r.push_back(s);
            }
            Frame::Lagged(n) => {
                let _ = ev.send(Event::Stderr(format!(
                    "[attach] the server skipped {n} telemetry frames: this client read too slowly"
                )));
            }
            Frame::Other(_) => {}
        }
        true
    });
    if current() {
        let _ = ev.send(Event::Stderr(format!(
            "colibri: the telemetry stream of {url} ended{}: the server stopped? r reconnects",
            why.map(|w| format!(" ({w})")).unwrap_or_default()
        )));
        let _ = ev.send(Event::DaemonExited(ExitInfo {
            code: None,
            signal: None,
        }));
    }
}

/// One chat turn's thread: text as it streams, then END and STAT.
fn chat_turn(sh: &Shared, req: ChatRequest) {
    let ev = &sh.events;
    let model = lock(&sh.model).clone();
    let body = chat_body(&model, &req).to_string();
    let end = |stat: Stat| {
        let _ = ev.send(Event::Reply(Reply::End {
            leading_newline: false,
        }));
        let _ = ev.send(Event::Reply(Reply::Stat(stat)));
    };
    let resp = match sh.ep.request(
        "POST",
        "/v1/chat/completions",
        Some(body.as_bytes()),
        ANSWER_SILENCE,
    ) {
        Ok(r) => r,
        Err(e) => {
            let _ = ev.send(Event::Stderr(format!(
                "colibri: {}",
                e.describe(&sh.ep.url)
            )));
            // The rejected turn's STAT: the footer says the server refused it.
            return end(Stat::zero6(0.0));
        }
    };
    *lock(&sh.answer) = Some(resp.closer);
    if sh.interrupted.load(Ordering::SeqCst) {
        if let Some(c) = lock(&sh.answer).take() {
            c.close();
        }
    }
    let (answer, _) = read_answer(BufReader::new(resp.body), |t| {
        let _ = ev.send(Event::Reply(Reply::Text(t.as_bytes().to_vec())));
    });
    let ended = Instant::now();
    lock(&sh.answer).take();
    sh.interrupted.store(false, Ordering::SeqCst);
    if let Some(e) = &answer.error {
        let _ = ev.send(Event::Stderr(format!("colibri: {}: {e}", sh.ep.url)));
    }
    // The server's STAT for this request follows its last chunk closely; wait for it briefly.
    let deadline = Instant::now() + Duration::from_millis(300);
    let stat = loop {
        let recent: Vec<Stat> = lock(&sh.recent).iter().cloned().collect();
        if let Some(s) = server_stat(&answer, &recent) {
            break s;
        }
        if answer.usage.is_none() || Instant::now() >= deadline {
            break client_stat(&answer, ended, *lock(&sh.live));
        }
        thread::sleep(Duration::from_millis(20));
    };
    end(stat);
}

impl Control for Attached {
    fn send(&mut self, _bytes: Vec<u8>) {
        // The app sends chat turns when attached; protocol requests have no server to go to.
        let _ = self.shared.events.send(Event::Stderr(
            "[attach] a daemon protocol request while attached: dropped".into(),
        ));
    }

    fn chat(&mut self, req: ChatRequest) {
        let sh = self.shared.clone();
        sh.interrupted.store(false, Ordering::SeqCst);
        let spawned = thread::Builder::new()
            .name("attach-chat".into())
            .spawn(move || chat_turn(&sh, req));
        if let Err(e) = spawned {
            let ev = &self.shared.events;
            let _ = ev.send(Event::Stderr(format!(
                "colibri: cannot start a thread: {e}"
            )));
            let _ = ev.send(Event::Reply(Reply::End {
                leading_newline: false,
            }));
            let _ = ev.send(Event::Reply(Reply::Stat(Stat::zero6(0.0))));
        }
    }

    fn interrupt(&mut self) {
        self.shared.interrupted.store(true, Ordering::SeqCst);
        if let Some(c) = lock(&self.shared.answer).take() {
            c.close();
        }
    }

    fn restart(&mut self) -> bool {
        self.connect();
        true
    }
}

/// `coli --attach URL --check`: connects, prints the first telemetry record and a short
/// answer to `prompt`, and the server's STAT of that answer, without a terminal (scripts,
/// tests, a quick look at a remote server). Errors name the URL and the HTTP status.
pub fn check(
    ep: &Endpoint,
    prompt: &str,
    max_tokens: u32,
    out: &mut impl Write,
) -> Result<(), String> {
    let model = preflight(ep).map_err(|e| e.describe(&ep.url))?;
    wait_ready(ep, || {}, &AtomicBool::new(false)).map_err(|e| e.describe(&ep.url))?;
    let w = |out: &mut dyn Write, s: String| writeln!(out, "{s}").map_err(|e| e.to_string());
    w(out, format!("model: {model}"))?;
    let tel = ep
        .request("GET", TELEMETRY_PATH, None, TELEMETRY_SILENCE)
        .map_err(|e| e.describe(&ep.url))?;
    // The frames are read on a thread of their own from here on, so the answer's STAT is
    // seen however the two streams interleave.
    let (tx, rx) = crossbeam_channel::unbounded::<Frame>();
    let closer = tel.closer;
    let body = tel.body;
    thread::spawn(move || {
        read_events(BufReader::new(body), |e| tx.send(Frame::of(&e)).is_ok());
    });
    let first = loop {
        match rx.recv_timeout(TELEMETRY_SILENCE) {
            Ok(Frame::Telemetry(t)) => break t,
            Ok(_) => {}
            Err(_) => {
                closer.close();
                return Err(format!(
                    "{}: no telemetry record within {}s",
                    ep.url,
                    TELEMETRY_SILENCE.as_secs()
                ));
            }
        }
    };
    w(out, format!("telemetry: {}", first.to_line()))?;
    let req = ChatRequest {
        messages: vec![("user", prompt.to_string())],
        max_tokens,
        temperature: 0.0,
        top_p: 1.0,
    };
    let body = chat_body(&model, &req).to_string();
    let resp = ep
        .request(
            "POST",
            "/v1/chat/completions",
            Some(body.as_bytes()),
            ANSWER_SILENCE,
        )
        .map_err(|e| e.describe(&ep.url))?;
    let (answer, err) = read_answer(BufReader::new(resp.body), |_| {});
    if let Some(e) = answer.error.clone().or(err) {
        closer.close();
        return Err(format!("{}: the answer failed: {e}", ep.url));
    }
    w(out, format!("answer: {}", answer.text.replace('\n', "\\n")))?;
    if let Some((p, c)) = answer.usage {
        w(out, format!("usage: prompt {p} completion {c}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match rx.recv_timeout(left) {
                Ok(Frame::Stat(s)) => {
                    if server_stat(&answer, std::slice::from_ref(&s)).is_some() {
                        w(out, format!("stat: {}", s.to_line()))?;
                        break;
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    }
    closer.close();
    Ok(())
}

#[cfg(test)]
mod tests;
