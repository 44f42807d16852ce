//! `GET /v1/colibri/telemetry`: the engine's telemetry as server-sent events, so `coli
//! --attach URL` (or any client holding a key) can watch a server's expert tiers.
//!
//! The records are the `--telemetry-fd` lines of `colibri serve` (protocol/README.md), one per
//! `event: telemetry` frame, and a STAT line per finished request (`event: stat`). Only cache
//! state and counters go out: never a prompt's or an answer's text, never a stop string, a
//! file name or an error message, as a subscriber may be another tenant than the clients it
//! watches.
//!
//! The engine thread publishes through a [`Tap`] into a [`Hub`]: a bounded broadcast ring
//! (publishing never waits for a subscriber; one that falls behind skips the frames it missed
//! and is told how many with an `event: lagged` frame) and the latest frame of each state
//! kind (HWINFO, TIERS, EMAP, DISKCLASS, STATE, SESSIONS), which a new subscriber gets first so
//! its dashboard is whole at once. Each stream ends when the server shuts down.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use parking_lot::Mutex;
use protocol::{
    EngineState, Live, Progress, ProgressPhase, SessionInfo, SessionState, Stat, Telemetry,
};
use tokio::sync::{broadcast, watch};

use super::AppState;
use crate::engine::report::{self, Baseline};
use crate::engine::{Engine, Phase};
use crate::experts::ExpertCounters;
use crate::telemetry::{per_second, rss_gb};

/// The route.
pub const PATH: &str = "/v1/colibri/telemetry";

/// Frames the ring holds: a subscriber this far behind skips ahead.
const RING: usize = 128;

/// A comment frame this often keeps proxies from closing a quiet stream and lets a client
/// with a read timeout tell a live server from a dead one.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// LIVE, TIERS, EMAP and SESSIONS at most this often during an answer, as `serve` writes them.
const LIVE_EVERY: Duration = Duration::from_millis(250);

/// Where the engine thread's frames meet the subscribers.
pub struct Hub {
    tx: broadcast::Sender<Arc<str>>,
    /// The latest frame of each state kind, by kind word.
    latest: Mutex<Vec<(&'static str, Arc<str>)>>,
    closed: watch::Sender<bool>,
}

impl Default for Hub {
    fn default() -> Hub {
        Hub {
            tx: broadcast::channel(RING).0,
            latest: Mutex::new(Vec::new()),
            closed: watch::channel(false).0,
        }
    }
}

impl Hub {
    /// Whether anyone listens (frames built only for a live view are skipped otherwise).
    pub fn listening(&self) -> bool {
        self.tx.receiver_count() > 0
    }

    /// Publishes one telemetry record. Never blocks: a full ring overwrites its oldest frame.
    pub fn publish(&self, t: &Telemetry) {
        let Some(kind) = t.kind() else {
            return;
        };
        let keep = matches!(
            t,
            Telemetry::HwInfo(_)
                | Telemetry::Tiers(_)
                | Telemetry::Emap(_)
                | Telemetry::DiskClass(_)
                | Telemetry::State(_)
                | Telemetry::Sessions(_)
        );
        self.send(kind, frame("telemetry", &t.to_line()), keep);
    }

    /// Publishes a finished request's STAT line.
    pub fn publish_stat(&self, s: &Stat) {
        self.send("STAT", frame("stat", &s.to_line()), false);
    }

    fn send(&self, kind: &'static str, f: String, keep: bool) {
        let f: Arc<str> = f.into();
        // Under the lock, so a subscriber's snapshot and its ring start at the same frame.
        let mut latest = self.latest.lock();
        if keep {
            match latest.iter_mut().find(|(k, _)| *k == kind) {
                Some(slot) => slot.1 = f.clone(),
                None => latest.push((kind, f.clone())),
            }
        }
        // An error only says that nobody listens.
        let _ = self.tx.send(f);
    }

    /// Ends every stream (the server is shutting down).
    pub fn close(&self) {
        let _ = self.closed.send(true);
    }

    fn subscribe(&self) -> (Vec<Arc<str>>, broadcast::Receiver<Arc<str>>) {
        let latest = self.latest.lock();
        let snapshot = latest.iter().map(|(_, f)| f.clone()).collect();
        (snapshot, self.tx.subscribe())
    }
}

/// `event: NAME\ndata: LINE\n\n`. Telemetry lines are single lines by construction.
fn frame(event: &str, line: &str) -> String {
    format!("event: {event}\ndata: {line}\n\n")
}

/// The handler: the snapshot, then frames as they come, until shutdown.
pub(super) async fn stream(State(st): State<Arc<AppState>>) -> Response {
    use futures_util::StreamExt;
    let hub = st.telemetry.clone();
    let (snapshot, rx) = hub.subscribe();
    let closed = hub.closed.subscribe();
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + KEEP_ALIVE, KEEP_ALIVE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A first frame at once: the client knows the stream is open before anything happens.
    let mut queue: std::collections::VecDeque<String> =
        std::iter::once(": colibri telemetry\n\n".to_string())
            .chain(snapshot.iter().map(|f| f.to_string()))
            .collect();
    let frames = futures_util::stream::unfold(
        (rx, closed, tick),
        move |(mut rx, mut closed, mut tick)| {
            let next = queue.pop_front();
            async move {
                if *closed.borrow() {
                    return None;
                }
                if let Some(f) = next {
                    return Some((f, (rx, closed, tick)));
                }
                let f = tokio::select! {
                    r = rx.recv() => match r {
                        Ok(f) => f.to_string(),
                        Err(broadcast::error::RecvError::Lagged(n)) => frame("lagged", &n.to_string()),
                        Err(broadcast::error::RecvError::Closed) => return None,
                    },
                    // Shutdown (or the hub gone).
                    _ = closed.changed() => return None,
                    _ = tick.tick() => ": keep-alive\n\n".to_string(),
                };
                Some((f, (rx, closed, tick)))
            }
        },
    );
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(frames.map(|f| Ok::<_, std::convert::Infallible>(Bytes::from(f)))),
    )
        .into_response()
}

/// A request the tap follows, from its admission to its end.
struct Followed {
    /// A number of its own (SESSIONS' id); not the client's.
    id: u64,
    base: Baseline,
    at: Instant,
    prompt_tokens: u32,
    emitted: u32,
    /// The first token's time and the counters then (tok/s and hit rate of the decode).
    decode: Option<(Instant, ExpertCounters)>,
}

/// The engine thread's side: turns what the worker sees into records on the hub.
pub struct Tap {
    hub: Arc<Hub>,
    by_slot: Vec<Option<Followed>>,
    /// Tokens of each slot's last request (SESSIONS of an idle slot).
    last_generated: Vec<u64>,
    next_id: u64,
    state: EngineState,
    last_live: Instant,
}

impl Tap {
    pub fn new(hub: Arc<Hub>, slots: usize) -> Tap {
        Tap {
            hub,
            by_slot: (0..slots).map(|_| None).collect(),
            last_generated: vec![0; slots],
            next_id: 1,
            state: EngineState::Idle,
            last_live: Instant::now(),
        }
    }

    /// The model is loaded: the snapshot a first subscriber sees.
    pub fn ready(&mut self, engine: &Engine) {
        self.hub
            .publish(&Telemetry::HwInfo(crate::telemetry::hwinfo()));
        self.hub.publish(&Telemetry::Tiers(report::tiers(engine)));
        self.hub.publish(&Telemetry::Emap(engine.tiers().emap()));
        self.hub
            .publish(&Telemetry::DiskClass(engine.tiers().disk_class()));
        self.hub.publish(&Telemetry::State(EngineState::Idle));
        self.sessions(engine);
    }

    /// A request was admitted on `slot`.
    pub fn started(&mut self, engine: &Engine, slot: usize, prompt_tokens: usize) {
        let id = self.next_id;
        self.next_id += 1;
        if let Some(s) = self.by_slot.get_mut(slot) {
            *s = Some(Followed {
                id,
                base: Baseline::now(engine, slot),
                at: Instant::now(),
                prompt_tokens: prompt_tokens.min(u32::MAX as usize) as u32,
                emitted: 0,
                decode: None,
            });
        }
    }

    /// A prompt chunk of `slot` was prefilled.
    pub fn prefill(&mut self, done: usize, total: usize) {
        if self.hub.listening() {
            self.hub.publish(&Telemetry::Progress(Progress {
                phase: ProgressPhase::Prefill,
                done: done as u64,
                total: total as u64,
            }));
        }
    }

    /// A token of `slot`'s answer went out.
    pub fn token(&mut self, engine: &Engine, slot: usize) {
        if let Some(Some(f)) = self.by_slot.get_mut(slot) {
            f.emitted += 1;
            f.decode
                .get_or_insert_with(|| (Instant::now(), engine.tiers().counters()));
        }
    }

    /// After each step: STATE on a change; LIVE, TIERS, EMAP, SESSIONS every 250 ms while
    /// someone listens.
    pub fn stepped(&mut self, engine: &Engine) {
        self.set_state(engine);
        if !self.hub.listening() || self.last_live.elapsed() < LIVE_EVERY {
            return;
        }
        self.last_live = Instant::now();
        let now = engine.tiers().counters();
        for (slot, f) in self.by_slot.iter().enumerate() {
            let Some(f) = f else { continue };
            let Some((t, c)) = &f.decode else { continue };
            self.hub.publish(&Telemetry::Live(Live {
                tokens: f.emitted,
                tok_per_s: per_second(f.emitted as f64, t.elapsed().as_secs_f64()),
                hit_pct: now.hit_pct_since(c),
                rss_gb: rss_gb(),
                slot: slot as u32,
                tokens_per_forward: Some(report::spec_since(engine, &f.base).tokens_per_forward()),
            }));
        }
        self.hub.publish(&Telemetry::Tiers(report::tiers(engine)));
        self.hub.publish(&Telemetry::Emap(engine.tiers().emap()));
        self.sessions(engine);
    }

    /// `slot`'s request ended (after its conversation was saved): the turn block (HWINFO,
    /// TIERS, EMAP, HITS, PROF, DISKCLASS, SPEC), its STAT, SESSIONS and STATE.
    /// `limited`: it ended on its token budget.
    pub fn finished(&mut self, engine: &Engine, slot: usize, limited: bool) {
        let Some(f) = self.by_slot.get_mut(slot).and_then(Option::take) else {
            return;
        };
        self.last_generated[slot] = f.emitted as u64;
        self.hub
            .publish(&Telemetry::HwInfo(crate::telemetry::hwinfo()));
        let wall = f.at.elapsed().as_secs_f64();
        for t in report::turn_block(engine, &f.base, wall, f.prompt_tokens, f.emitted) {
            self.hub.publish(&t);
        }
        let now = engine.tiers().counters();
        let (decode_s, hit_pct, route) = match &f.decode {
            Some((t, c)) => (
                t.elapsed().as_secs_f64(),
                now.hit_pct_since(c),
                now.route_since(c),
            ),
            None => (0.0, 0.0, now.route_since(&now)),
        };
        self.hub.publish_stat(&Stat {
            route,
            prefetch: engine.tiers().prefetch_bytes(),
            completion_tokens: f.emitted,
            tok_per_s: per_second(f.emitted as f64, decode_s),
            hit_pct,
            rss_gb: rss_gb(),
            prompt: Some((f.prompt_tokens, limited)),
        });
        self.sessions(engine);
        self.set_state(engine);
    }

    fn set_state(&mut self, engine: &Engine) {
        let mut state = EngineState::Idle;
        for s in engine.sessions() {
            match s.phase() {
                Phase::Decode => {
                    state = EngineState::Generating;
                    break;
                }
                Phase::Prefill => state = EngineState::Prefill,
                Phase::Idle => {}
            }
        }
        if state != self.state {
            self.state = state;
            self.hub.publish(&Telemetry::State(state));
        }
    }

    /// SESSIONS: every slot with a request or a conversation (the busy ones first, at most 64,
    /// as `serve --mux` lists them). Counts only: whose conversation it is is not said.
    fn sessions(&mut self, engine: &Engine) {
        const MAX_LISTED: usize = 64;
        let mut list: Vec<SessionInfo> = engine
            .sessions()
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                let f = self.by_slot.get(slot).and_then(Option::as_ref);
                if f.is_none() && s.held() == 0 {
                    return None;
                }
                Some(SessionInfo {
                    slot: slot as u32,
                    state: match s.phase() {
                        Phase::Idle => SessionState::Idle,
                        Phase::Prefill => SessionState::Prefill,
                        Phase::Decode => SessionState::Decode,
                    },
                    id: f.map_or(0, |f| f.id),
                    ctx_tokens: s.held() as u64,
                    generated: f.map_or(self.last_generated.get(slot).copied().unwrap_or(0), |f| {
                        f.emitted as u64
                    }),
                })
            })
            .collect();
        list.sort_by_key(|i| (i.id == 0, i.slot));
        list.truncate(MAX_LISTED);
        self.hub.publish(&Telemetry::Sessions(list));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiers(ram: u32) -> Telemetry {
        Telemetry::Tiers(protocol::Tiers {
            vram_experts: 0,
            ram_experts: ram,
            disk_experts: 48 - ram,
            vram_gb: 0.0,
            ram_gb: 0.01,
        })
    }

    /// A new subscriber gets the latest frame of each state kind, then what comes after.
    #[test]
    fn a_subscriber_starts_from_the_latest_state() {
        let hub = Hub::default();
        hub.publish(&tiers(4));
        hub.publish(&tiers(8));
        hub.publish(&Telemetry::State(EngineState::Idle));
        hub.publish_stat(&Stat::zero(0.5));
        let (snapshot, mut rx) = hub.subscribe();
        let snapshot: Vec<&str> = snapshot.iter().map(|f| &**f).collect();
        assert_eq!(
            snapshot,
            [
                "event: telemetry\ndata: TIERS 0 8 40 0.00 0.01\n\n",
                "event: telemetry\ndata: STATE idle\n\n"
            ]
        );
        hub.publish(&tiers(12));
        assert_eq!(
            &*rx.try_recv().unwrap(),
            "event: telemetry\ndata: TIERS 0 12 36 0.00 0.01\n\n"
        );
    }

    /// Publishing never waits for a subscriber that does not read: past the ring it skips
    /// ahead and learns how many frames it missed.
    #[test]
    fn a_stalled_subscriber_skips_frames() {
        let hub = Hub::default();
        let (_, mut rx) = hub.subscribe();
        let t0 = Instant::now();
        for i in 0..(RING as u32 * 4) {
            hub.publish(&tiers(i % 48));
        }
        assert!(t0.elapsed() < Duration::from_secs(5));
        match rx.try_recv() {
            Err(broadcast::error::TryRecvError::Lagged(n)) => assert_eq!(n, RING as u64 * 3),
            other => panic!("expected a lag, got {other:?}"),
        }
        assert!(rx.try_recv().is_ok(), "it reads on after the lag");
    }
}
