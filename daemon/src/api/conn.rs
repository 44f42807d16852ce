//! The HTTP connections: accepted here, each served by hyper on a task of its own, under the
//! limits a server on a shared machine needs and axum's `serve` does not give.
//!
//! - At most `max_connections` open at once, so sockets cannot use up the descriptor limit
//!   (the server could then accept nothing). At the limit a new connection replaces the one
//!   idle longest; only when every one has a request in flight is it answered 503 and closed.
//! - A new connection must send its first byte within `header` and every request's head must
//!   arrive within `header` of its first byte (slowloris); a kept-alive connection may wait
//!   `idle` for its next request. The body's own timeout is the handler's (`read_json`).
//! - A shutdown stops accepting, closes idle connections at once, lets requests in flight run
//!   for `grace`, then drops every connection (the engine thread sees each stream's receiver
//!   go, stops that request and saves its conversation) and returns. A second signal exits
//!   the process at once; the saved state is crash-safe.
//!
//! A connection's state is shared by its socket wrapper ([`Watched`], which stamps reads),
//! its service (which counts requests in flight until their bodies end) and the watchdog in
//! [`serve_one`], which is the only one to close it.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tower::ServiceExt;

use super::metrics::Metrics;

/// The connection limits (`--header-timeout`, `--idle-timeout`, `--max-connections`,
/// `--shutdown-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub header: Duration,
    pub idle: Duration,
    pub max_connections: usize,
    pub grace: Duration,
}

/// The default connection limit: 1024, or what the descriptor limit leaves after a reserve
/// for the model's files, the KV files and the engine's own use. The soft limit is raised to
/// the hard one first (the usual 1024 soft limit is a default, not a choice).
pub fn default_max_connections() -> usize {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    const RESERVE: u64 = 256;
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 1024;
    };
    let want = hard.min(1 << 16);
    let soft = if want > soft && setrlimit(Resource::RLIMIT_NOFILE, want, hard).is_ok() {
        want
    } else {
        soft
    };
    (soft.saturating_sub(RESERVE) / 2).clamp(16, 1024) as usize
}

/// Milliseconds since the server started: the clock the connection stamps use.
#[derive(Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn ms(&self) -> u64 {
        self.0.elapsed().as_millis() as u64
    }
}

/// What the socket, the service and the watchdog of one connection share.
struct ConnState {
    clock: Clock,
    /// Requests whose response body has not ended (or been dropped).
    in_flight: AtomicUsize,
    /// Requests started on this connection.
    served: AtomicU64,
    /// When the connection last became idle (opened, or a response ended).
    idle_since: AtomicU64,
    /// The first byte read since it became idle (0: none yet; stamps are offset by one).
    first_byte: AtomicU64,
}

impl ConnState {
    fn new(clock: Clock) -> ConnState {
        ConnState {
            clock,
            in_flight: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            idle_since: AtomicU64::new(clock.ms()),
            first_byte: AtomicU64::new(0),
        }
    }

    fn begin(&self) {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    fn end(&self) {
        if self.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.first_byte.store(0, Ordering::SeqCst);
            self.idle_since.store(self.clock.ms(), Ordering::SeqCst);
        }
    }

    /// No request in flight and no part of the next one received.
    fn is_idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0 && self.first_byte.load(Ordering::SeqCst) == 0
    }

    /// Whether the watchdog should close the connection now.
    fn overdue(&self, limits: &Limits) -> bool {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return false;
        }
        let now = self.clock.ms();
        let header = limits.header.as_millis() as u64;
        match self.first_byte.load(Ordering::SeqCst) {
            // Part of a head arrived and the rest did not in time.
            b if b > 0 => now.saturating_sub(b - 1) > header,
            // Nothing since it opened (header timeout) or since its last response (idle).
            _ => {
                let quiet = now.saturating_sub(self.idle_since.load(Ordering::SeqCst));
                let limit = if self.served.load(Ordering::Relaxed) == 0 {
                    header
                } else {
                    limits.idle.as_millis() as u64
                };
                quiet > limit
            }
        }
    }
}

/// The socket, stamping the first byte read while the connection is idle.
struct Watched {
    io: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        let s = &self.state;
        if buf.filled().len() > before && s.in_flight.load(Ordering::SeqCst) == 0 {
            let _ = s.first_byte.compare_exchange(
                0,
                s.clock.ms() + 1,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        r
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// A response body that tells its connection when it has ended (or was dropped unfinished).
struct Tracked {
    inner: Body,
    state: Option<Arc<ConnState>>,
}

impl Tracked {
    fn done(&mut self) {
        if let Some(s) = self.state.take() {
            s.end();
        }
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.done();
    }
}

impl http_body::Body for Tracked {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let r = Pin::new(&mut self.inner).poll_frame(cx);
        if matches!(r, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.done();
        }
        r
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The open connections. At the limit a new connection takes the place of the one that has
/// been idle longest (no request in flight, no part of a head received), as a kept-alive
/// connection is only a convenience; only when every connection is busy does it get 503.
/// So idle sockets, however many, cannot keep a client with a request out.
struct Registry {
    open: parking_lot::Mutex<std::collections::HashMap<u64, Arc<Handle>>>,
    next: AtomicU64,
    metrics: Arc<Metrics>,
}

struct Handle {
    state: Arc<ConnState>,
    /// Told when the connection is evicted to make room.
    evict: tokio::sync::Notify,
}

impl Registry {
    fn len(&self) -> usize {
        self.open.lock().len()
    }

    /// Registers a new connection, evicting the longest-idle one at `max`; `None` when every
    /// open connection is busy.
    fn admit(
        self: &Arc<Self>,
        state: Arc<ConnState>,
        max: usize,
    ) -> Option<(Registered, Arc<Handle>)> {
        let mut open = self.open.lock();
        if open.len() >= max {
            // Idle since the same millisecond is common under a burst of connects: the
            // older connection (lower id) goes first, so the choice does not depend on the
            // map's order and the newest connection is the last to go.
            let victim = open
                .iter()
                .filter(|(_, h)| h.state.is_idle())
                .min_by_key(|(id, h)| (h.state.idle_since.load(Ordering::SeqCst), **id))
                .map(|(id, _)| *id)?;
            if let Some(h) = open.remove(&victim) {
                h.evict.notify_one();
                self.metrics.connections.fetch_sub(1, Ordering::Relaxed);
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let handle = Arc::new(Handle {
            state,
            evict: tokio::sync::Notify::new(),
        });
        open.insert(id, handle.clone());
        self.metrics.add(&self.metrics.connections, 1);
        Some((
            Registered {
                registry: self.clone(),
                id,
            },
            handle,
        ))
    }
}

/// A connection's place in the [`Registry`], given up when its task ends.
struct Registered {
    registry: Arc<Registry>,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        if self.registry.open.lock().remove(&self.id).is_some() {
            self.registry
                .metrics
                .connections
                .fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// The 503 a connection gets when every open connection is busy, before it is closed.
fn full_response() -> Vec<u8> {
    let body = r#"{"error":{"message":"too many connections with requests in flight (--max-connections); retry later","type":"service_unavailable","param":null,"code":null}}"#;
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Accepts and serves connections until `stop` says to shut down, then drains them as the
/// module doc says. Returns when every connection is closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let clock = Clock(Instant::now());
    let registry = Arc::new(Registry {
        open: Default::default(),
        next: AtomicU64::new(0),
        metrics: metrics.clone(),
    });
    let full = Arc::new(full_response());
    // Told to every connection at shutdown: `false` closes idle ones, `true` drops them all.
    let (drain_tx, drain_rx) = watch::channel(None::<bool>);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let (socket, _) = tokio::select! {
            _ = stop.changed() => break,
            r = listener.accept() => match r {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors, or the peer reset before accept: wait a little
                    // rather than spin, and go on.
                    crate::elog!("[api] accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            // Reap finished tasks so the set does not grow with the connections served.
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let state = Arc::new(ConnState::new(clock));
        let Some((place, handle)) = registry.admit(state.clone(), limits.max_connections) else {
            metrics.add(&metrics.connections_refused, 1);
            let full = full.clone();
            tasks.spawn(async move {
                let mut socket = socket;
                let _ = tokio::time::timeout(Duration::from_secs(1), socket.write_all(&full)).await;
                let _ = socket.shutdown().await;
            });
            continue;
        };
        tasks.spawn(serve_one(
            socket,
            app.clone(),
            limits,
            state,
            handle,
            metrics.clone(),
            drain_rx.clone(),
            place,
        ));
    }
    drop(listener);
    let _ = drain_tx.send(Some(false));
    let n = registry.len();
    if n > 0 {
        crate::elog!(
            "[api] shutting down: {n} connection(s) open; requests in flight get {} s",
            limits.grace.as_secs()
        );
    }
    let drained = tokio::time::timeout(limits.grace, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        let left = registry.len();
        crate::elog!("[api] shutting down: closing {left} connection(s) still open");
        let _ = drain_tx.send(Some(true));
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
    }
}

/// One connection: hyper over the watched socket, the watchdog beside it.
#[allow(clippy::too_many_arguments)]
async fn serve_one(
    socket: TcpStream,
    app: Router,
    limits: Limits,
    state: Arc<ConnState>,
    handle: Arc<Handle>,
    metrics: Arc<Metrics>,
    mut drain: watch::Receiver<Option<bool>>,
    _place: Registered,
) {
    let _ = socket.set_nodelay(true);
    let io = TokioIo::new(Watched {
        io: socket,
        state: state.clone(),
    });
    let svc_state = state.clone();
    let svc = hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
        let state = svc_state.clone();
        state.begin();
        let app = app.clone();
        async move {
            let resp = app.oneshot(req.map(Body::new)).await;
            // The router's error type is Infallible: every request gets a response.
            let resp = match resp {
                Ok(r) => r,
                Err(never) => match never {},
            };
            Ok::<_, std::convert::Infallible>(resp.map(|b| Tracked {
                inner: b,
                state: Some(state),
            }))
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(io, svc);
    tokio::pin!(conn);
    let mut draining = false;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = conn.as_mut() => return,
            _ = handle.evict.notified() => return,
            _ = tick.tick() => {
                if state.overdue(&limits) {
                    metrics.add(&metrics.connections_timed_out, 1);
                    return;
                }
            }
            r = drain.changed(), if !draining => {
                if r.is_err() || *drain.borrow() == Some(true) {
                    return;
                }
                // Idle connections close now; one mid-request closes after its response.
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_idle_connections_gives_up_the_oldest_first() {
        let registry = Arc::new(Registry {
            open: Default::default(),
            next: AtomicU64::new(0),
            metrics: Arc::new(Metrics::default()),
        });
        // Every connection idle since the same millisecond, as under a burst of connects.
        let clock = Clock(Instant::now());
        let mut places = Vec::new();
        for _ in 0..200 {
            let state = Arc::new(ConnState::new(clock));
            state.idle_since.store(7, Ordering::SeqCst);
            places.push(registry.admit(state, 4).expect("an idle one makes room"));
        }
        let mut open: Vec<u64> = registry.open.lock().keys().copied().collect();
        open.sort_unstable();
        assert_eq!(open, vec![196, 197, 198, 199]);
        // A busy connection is never the one evicted.
        places[197].1.state.begin();
        let state = Arc::new(ConnState::new(clock));
        state.idle_since.store(7, Ordering::SeqCst);
        places.push(registry.admit(state, 4).unwrap());
        let mut open: Vec<u64> = registry.open.lock().keys().copied().collect();
        open.sort_unstable();
        assert_eq!(open, vec![197, 198, 199, 200]);
    }
}
