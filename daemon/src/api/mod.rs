//! `colibri api`: OpenAI- and Anthropic-compatible HTTP over the engine's sessions.
//!
//! Two halves joined by channels. The engine thread (`worker`, the command's own thread, a
//! rayon worker as every other subcommand's) owns the [`Engine`] and steps all active
//! requests in one batch, as mux does. The HTTP side (axum on a small tokio runtime of its
//! own) parses and checks requests, turns them into [`worker::Job`]s on a bounded channel (the
//! queue: full is 429), and turns each job's channel of text back into JSON or SSE
//! (`openai`, `anthropic`). Admission itself (size limits, tokenizing, context, prefix
//! reuse) is the engine's, as for `serve`.
//!
//! Safe by default: loopback only unless `--api-key` is given, a body limit, a per-request
//! timeout, no CORS unless `--cors-origin` asks for it. A request's `max_tokens` is clamped
//! only to its context room, as upstream's mux clamps a SUBMIT's (`--ngen` is the legacy
//! protocol's budget, not a hidden cap here).

mod anthropic;
mod completions;
mod conn;
mod errors;
mod fields;
mod harmony_stream;
mod logprobs;
mod metrics;
mod openai;
mod params;
mod responses;
mod sse;
mod telemetry;
mod tools;
mod tools_dsml;
mod tools_invoke;
mod tools_minimax;
mod worker;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use crossbeam_channel::{Sender, TrySendError};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::cli::ApiArgs;
use crate::error::EngineError;
use errors::{overloaded, ApiError, Flavor};
use metrics::Metrics;
use worker::{Job, JobPrompt, Out};

/// What every handler reads.
pub(crate) struct AppState {
    jobs: Sender<Job>,
    metrics: Arc<Metrics>,
    /// Set once the model is loaded; until then requests get 503.
    ready: Arc<AtomicBool>,
    /// The engine thread stopped (a forward failed): 503 from then on.
    failed: Arc<AtomicBool>,
    /// The telemetry stream's frames (`GET /v1/colibri/telemetry`).
    telemetry: Arc<telemetry::Hub>,
    cfg: Config,
}

pub(crate) struct Config {
    /// `--api-key`s; empty: no key is asked for.
    api_keys: Vec<String>,
    model_id: String,
    /// `--model-alias`: more ids listed in /v1/models.
    aliases: Vec<String>,
    /// `--strict-model-name`: a request must name the id or an alias.
    strict_model: bool,
    created: u64,
    max_body: usize,
    /// `--max-schema-bytes`: the largest schema compiled into a grammar.
    max_schema: usize,
    timeout: Duration,
    /// `--temp` / `--top-p`: the defaults of a request that gives none.
    temperature: f32,
    top_p: f32,
    /// `--top-k`, `--min-p`, `--repeat-penalty`: the filters of a request that gives none.
    params: crate::sampling::SamplingParams,
    slots: usize,
    cors: Option<HeaderValue>,
    /// `--body-timeout`: a request body must arrive within this once its head has.
    body_timeout: Duration,
    /// The `Host` names requests may give (`--allow-host`, the listen address, loopback).
    hosts: HostRule,
}

/// The request fields both APIs share, checked, for [`AppState::submit`].
#[derive(Clone)]
pub(crate) struct Sampling {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// Filters and penalties: the server's, with the request's own ([`params::Knobs`]).
    pub params: crate::sampling::SamplingParams,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub grammar: Option<Arc<crate::grammar::Grammar>>,
    /// Whose request it is ([`KeyId::tenant`]).
    pub tenant: crate::engine::Tenant,
    /// The template's thinking switch (`reasoning_effort`, `thinking`); `None`: `--think`.
    pub think: Option<bool>,
    /// Report each token's logprob with this many alternatives (`None`: none).
    pub logprobs: Option<usize>,
    /// Read the prompt's tokens out too, with `logprobs` alternatives (completions' `echo`
    /// with `logprobs`).
    pub echo: bool,
}

impl AppState {
    /// Queues a job; the receiver yields its `Out`s. 503 while loading or after a failure,
    /// 429 when the queue is full.
    fn submit(
        &self,
        prompt: JobPrompt,
        s: Sampling,
        flavor: Flavor,
    ) -> Result<UnboundedReceiver<Out>, ApiError> {
        if self.failed.load(Ordering::Relaxed) {
            return Err(overloaded("the engine failed; restart the server").flavor(flavor));
        }
        if !self.ready.load(Ordering::Relaxed) {
            return Err(overloaded("the model is still loading").flavor(flavor));
        }
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let now = Instant::now();
        let job = Job {
            prompt,
            max_tokens: s.max_tokens,
            temperature: s.temperature,
            top_p: s.top_p,
            params: s.params,
            think: s.think,
            logprobs: s.logprobs,
            echo: s.echo,
            seed: s.seed,
            stop: s.stop,
            grammar: s.grammar,
            tenant: s.tenant,
            out: tx,
            arrived: now,
            deadline: now + self.cfg.timeout,
        };
        match self.jobs.try_send(job) {
            Ok(()) => Ok(rx),
            Err(TrySendError::Full(_)) => {
                self.metrics.add(&self.metrics.refused, 1);
                Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "the request queue is full; retry later",
                )
                .flavor(flavor))
            }
            Err(TrySendError::Disconnected(_)) => {
                Err(overloaded("the engine is not running").flavor(flavor))
            }
        }
    }

    /// `n` jobs of one request (`n` > 1: each its own sampling, seeded `seed + i` when the
    /// request gives a seed); they run side by side where sessions are free, else one after
    /// another. A refusal of any drops the others (their receivers go, so they stop).
    fn submit_n(
        &self,
        n: usize,
        prompt: impl Fn() -> JobPrompt,
        s: Sampling,
        flavor: Flavor,
    ) -> Result<Vec<UnboundedReceiver<Out>>, ApiError> {
        (0..n)
            .map(|i| {
                let mut one = s.clone();
                one.seed = s.seed.map(|seed| seed.wrapping_add(i as u64));
                self.submit(prompt(), one, flavor)
            })
            .collect()
    }

    /// Whether `id` is the model's id or one of its aliases.
    fn names(&self, id: &str) -> bool {
        id == self.cfg.model_id || self.cfg.aliases.iter().any(|a| a == id)
    }

    /// Checks a request's `model` (absent: this one). Any name is served by the loaded model
    /// unless `--strict-model-name`.
    fn check_model(&self, model: Option<&str>, flavor: Flavor) -> Result<(), ApiError> {
        match model {
            Some(m) if self.cfg.strict_model && !self.names(m) => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!(
                    "the model `{m}` does not exist; this server serves `{}`",
                    self.cfg.model_id
                ),
            )
            .with_code("model_not_found")
            .flavor(flavor)),
            _ => Ok(()),
        }
    }

    /// The answer budget: the client's, or without one all the room the context leaves
    /// (OpenAI's default). The engine clamps it to the room; nothing else caps it.
    fn max_tokens(&self, asked: Option<u64>, flavor: Flavor) -> Result<usize, ApiError> {
        match asked {
            Some(0) => {
                Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1").flavor(flavor))
            }
            Some(n) => Ok(n.min(usize::MAX as u64) as usize),
            None => Ok(usize::MAX),
        }
    }
}

/// Waits for the engine's answer to a queued job: the prompt's token counts once it started,
/// or its refusal as an HTTP error.
async fn started(
    rx: &mut UnboundedReceiver<Out>,
    flavor: Flavor,
) -> Result<(usize, usize), ApiError> {
    match rx.recv().await {
        Some(Out::Started {
            prompt_tokens,
            cached,
        }) => Ok((prompt_tokens, cached)),
        Some(Out::Refused(r)) => Err(ApiError::refused(&r).flavor(flavor)),
        Some(Out::BadPrompt(why)) => Err(ApiError::invalid("messages", why).flavor(flavor)),
        Some(Out::Expired) => Err(overloaded(
            "the request waited longer than --request-timeout for a free session",
        )
        .flavor(flavor)),
        _ => Err(overloaded("the engine stopped").flavor(flavor)),
    }
}

/// Reads a JSON body under the size limit: 413 over it, 400 when it is not a JSON object.
async fn read_json(
    st: &AppState,
    headers: &HeaderMap,
    body: Body,
    flavor: Flavor,
) -> Result<axum::body::Bytes, ApiError> {
    let too_big = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the request body is larger than {} bytes (--max-body-bytes)",
                st.cfg.max_body
            ),
        )
        .flavor(flavor)
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > st.cfg.max_body) {
        return Err(too_big());
    }
    let bytes = match tokio::time::timeout(
        st.cfg.body_timeout,
        axum::body::to_bytes(body, st.cfg.max_body),
    )
    .await
    {
        Ok(Ok(b)) => b,
        Ok(Err(_)) => return Err(too_big()),
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} s (--body-timeout)",
                    st.cfg.body_timeout.as_secs()
                ),
            )
            .flavor(flavor))
        }
    };
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_json(format!("the body is not valid JSON: {e}")).flavor(flavor)
    })?;
    if !v.is_object() {
        return Err(ApiError::bad_json("the body must be a JSON object").flavor(flavor));
    }
    Ok(bytes)
}

/// The typed request out of a body known to be a JSON object: a wrong type is a 422; an
/// unknown top-level field is ignored and named in the log (clients send fields of other
/// servers and newer API versions). Parsed from the bytes (not a `Value`) so schemas keep
/// their key order.
fn typed<T: serde::de::DeserializeOwned>(bytes: &[u8], flavor: Flavor) -> Result<T, ApiError> {
    let req = serde_json::from_slice(bytes).map_err(|e| {
        let msg = e.to_string();
        ApiError {
            param: error_field(&msg),
            ..ApiError::invalid("", format!("invalid request: {msg}"))
        }
        .flavor(flavor)
    })?;
    let unknown = fields::unknown(bytes, fields::known::<T>(), 16);
    if !unknown.is_empty() {
        let what = std::any::type_name::<T>().rsplit("::").next().unwrap_or("");
        crate::elog!("[api] {what}: ignored unknown fields {unknown:?}");
    }
    Ok(req)
}

/// The field serde names in an unknown- or missing-field message (in backquotes); other
/// messages quote a value there, which is not a `param`.
fn error_field(msg: &str) -> Option<String> {
    ["unknown field `", "missing field `"].iter().find_map(|p| {
        let rest = &msg[msg.find(p)? + p.len()..];
        Some(rest[..rest.find('`')?].to_string())
    })
}

pub fn run(mut args: ApiArgs) -> Result<ExitCode, EngineError> {
    let addr = resolve_listen(&args.listen)?;
    if !addr.ip().is_loopback() && args.api_keys.is_empty() {
        return Err(EngineError::Usage(format!(
            "--listen {}: a non-loopback address serves the network, so it needs --api-key KEY (or COLI_API_KEY)",
            args.listen
        )));
    }
    if args.api_keys.iter().any(String::is_empty) {
        return Err(EngineError::Usage("--api-key must not be empty".into()));
    }
    let given = |flag: &str, var: &str| {
        std::env::args().any(|a| a == flag || a.starts_with(&format!("{flag}=")))
            || std::env::var_os(var).is_some()
    };
    if !given("--kv-slots", "KV_SLOTS") {
        args.serve.kv_slots = 8;
    }
    let serve = &mut args.serve;
    let temperature = serve.sampling.temperature()?;
    serve.sampling.temp = Some(temperature);
    let dirs = serve.model.dirs()?;
    let model_id = args.model_name.clone().unwrap_or_else(|| {
        if serve.model.snap.is_none() && serve.model.tiers.model_dirs.is_none() {
            return "colibri-demo".into();
        }
        dirs[0]
            .canonicalize()
            .unwrap_or_else(|_| dirs[0].clone())
            .file_name()
            .map_or("colibri".into(), |n| n.to_string_lossy().into_owned())
    });
    let cors =
        match &args.cors_origin {
            Some(o) => Some(HeaderValue::from_str(o).map_err(|_| {
                EngineError::Usage(format!("--cors-origin {o:?}: not a header value"))
            })?),
            None => None,
        };
    // Bound before the model loads, so a taken port fails at once and clients see 503
    // (loading) rather than a refused connection.
    let listener = std::net::TcpListener::bind(addr)
        .map_err(|e| EngineError::Usage(format!("--listen {addr}: cannot bind: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| EngineError::io("configuring the listener", e))?;
    let (jobs_tx, jobs_rx) = crossbeam_channel::bounded(args.queue as usize);
    let metrics = Arc::new(Metrics::default());
    let ready = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicBool::new(false));
    let hub = Arc::new(telemetry::Hub::default());
    let state = Arc::new(AppState {
        jobs: jobs_tx,
        metrics: metrics.clone(),
        ready: ready.clone(),
        failed: failed.clone(),
        telemetry: hub.clone(),
        cfg: Config {
            api_keys: args.api_keys.clone(),
            model_id,
            aliases: args.model_aliases.clone(),
            strict_model: args.strict_model_name,
            created: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            max_body: args.max_body_bytes as usize,
            max_schema: args.max_schema_bytes as usize,
            timeout: Duration::from_secs(args.request_timeout),
            temperature,
            top_p: serve.sampling.top_p,
            params: serve.sampling.params(),
            slots: serve.kv_slots as usize,
            cors,
            body_timeout: Duration::from_secs(args.body_timeout),
            hosts: HostRule::new(addr, &args.allow_hosts),
        },
    });
    // The address as bound (port 0 takes a free one: tests and scripts read it here).
    let bound = listener.local_addr().unwrap_or(addr);
    let limits = conn::Limits {
        header: Duration::from_secs(args.header_timeout),
        idle: Duration::from_secs(args.idle_timeout),
        max_connections: args
            .max_connections
            .map_or_else(conn::default_max_connections, |n| n as usize),
        grace: Duration::from_secs(args.shutdown_timeout),
    };
    let http = spawn_http(listener, state, limits)?;
    crate::elog!("[api] listening on http://{bound}");
    let crate::engine::start::Daemon {
        engine,
        lock,
        telemetry: _telemetry,
        ctx,
    } = crate::engine::start::start_daemon(serve.daemon_start())?;
    serve.ctx = ctx;
    let ctx_line = format!("ctx {}", engine.ctx());
    let settings = worker::Settings {
        think: serve.think,
        share: serve.kv_share,
        stop: serve.sampling.stop.clone(),
        seed: serve.sampling.seed,
    };
    ready.store(true, Ordering::Relaxed);
    crate::elog!("[api] ready: {} sessions, {ctx_line}", serve.kv_slots);
    worker::Worker::new(engine, settings, metrics, hub).run(jobs_rx, &failed);
    drop(lock);
    // The engine thread ends when the HTTP side has shut down (its senders are gone) or the
    // engine failed; either way the server is done. The runtime goes last: its signal task
    // is what makes a second signal exit at once while the sessions are saved.
    let rt = http.join();
    drop(rt);
    Ok(if failed.load(Ordering::Relaxed) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn resolve_listen(listen: &str) -> Result<SocketAddr, EngineError> {
    listen
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| EngineError::Usage(format!("--listen {listen:?}: not a HOST:PORT address")))
}

/// The HTTP side on a thread of its own. It returns after SIGINT/SIGTERM once the
/// connections are closed (the shutdown of [`conn::serve`]), dropping the job sender so the
/// engine thread ends too; it hands back its runtime, whose signal task still turns a second
/// signal into an immediate exit while the engine saves (or is still loading).
fn spawn_http(
    listener: std::net::TcpListener,
    state: Arc<AppState>,
    limits: conn::Limits,
) -> Result<std::thread::JoinHandle<tokio::runtime::Runtime>, EngineError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| EngineError::io("starting the HTTP runtime", e))?;
    std::thread::Builder::new()
        .name("http-main".into())
        .spawn(move || {
            rt.block_on(async move {
                let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
                tokio::spawn(signals(stop_tx));
                // Telemetry streams never end on their own: the shutdown ends them, so they
                // do not hold it for --shutdown-timeout.
                let (hub, mut stop) = (state.telemetry.clone(), stop_rx.clone());
                tokio::spawn(async move {
                    while stop.changed().await.is_ok() {
                        if *stop.borrow() {
                            hub.close();
                            break;
                        }
                    }
                });
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        crate::elog!("[api] the listener failed: {e}");
                        return;
                    }
                };
                let metrics = state.metrics.clone();
                conn::serve(listener, router(state), limits, metrics, stop_rx).await;
            });
            rt
        })
        .map_err(|e| EngineError::io("spawning the HTTP thread", e))
}

/// The first SIGINT/SIGTERM starts the shutdown; a second one exits at once (the conversations
/// are saved after every request and their files are crash-safe).
async fn signals(stop: tokio::sync::watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        crate::elog!("[api] cannot listen for SIGTERM/SIGINT; stop the server with SIGKILL");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    crate::elog!("[api] shutting down: finishing open requests (a second signal exits now)");
    let _ = stop.send(true);
    let code = tokio::select! {
        _ = term.recv() => 143,
        _ = int.recv() => 130,
    };
    crate::elog!("[api] second signal: exiting now");
    std::process::exit(code);
}

fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(completions::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .route("/v1/responses", post(responses::create))
        .route(telemetry::PATH, get(telemetry::stream))
        .fallback(not_found)
        .method_not_allowed_fallback(not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn(json_only))
        .layer(middleware::from_fn_with_state(state.clone(), cors))
        .layer(middleware::from_fn_with_state(state.clone(), host_check))
        .with_state(state)
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    let (status, word) = if st.failed.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "failed")
    } else if st.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading")
    };
    (status, axum::Json(json!({"status": word}))).into_response()
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    let text = st.metrics.render(
        st.jobs.len(),
        st.cfg.slots,
        st.ready.load(Ordering::Relaxed),
    );
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

async fn not_found(req: Request) -> ApiError {
    let path = req.uri().path().to_string();
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route {} {path}", req.method()),
    )
    .flavor(Flavor::of_path(&path))
}

/// Which API key a request presented (a hash of it; 0 when the server asks for none): the
/// first part of its [`Tenant`](crate::engine::Tenant).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct KeyId(u64);

async fn not_allowed(req: Request) -> ApiError {
    let path = req.uri().path().to_string();
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not a method of {path}", req.method()),
    )
    .flavor(Flavor::of_path(&path))
}

/// `--api-key`: every route but /health wants one of the keys, as a Bearer token or
/// `x-api-key`. The key found goes on the request as its [`KeyId`].
async fn auth(State(st): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    if st.cfg.api_keys.is_empty() {
        req.extensions_mut().insert(KeyId::default());
        return next.run(req).await;
    }
    if req.uri().path() == "/health" || req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    let h = req.headers();
    let bearer = h
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    let x_key = h.get("x-api-key").and_then(|v| v.to_str().ok());
    // Compared in constant time with every key, so neither a key nor which key matched can be
    // learnt byte by byte from timings.
    let mut found = None;
    for given in [bearer, x_key].into_iter().flatten() {
        for key in &st.cfg.api_keys {
            if constant_time_eq(given.as_bytes(), key.as_bytes()) {
                found = Some(key);
            }
        }
    }
    if let Some(key) = found {
        let id = crate::engine::Tenant::of(&[b"api-key", key.as_bytes()]).0;
        req.extensions_mut().insert(KeyId(id));
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "missing or wrong API key (Authorization: Bearer KEY, or x-api-key: KEY)",
    )
    .with_code("invalid_api_key")
    .flavor(Flavor::of_path(req.uri().path()))
    .into_response()
}

impl KeyId {
    /// The tenant of a request with this key and the client's `user` (and conversation
    /// key): the local tenant for a key-less server's anonymous requests, so `serve`'s and
    /// the API's conversations of one person share their prefixes.
    pub(crate) fn tenant(self, user: Option<&str>) -> crate::engine::Tenant {
        match (self.0, user) {
            (0, None) => crate::engine::Tenant::LOCAL,
            (k, u) => crate::engine::Tenant::of(&[
                &k.to_le_bytes(),
                u.map_or(&b"\xff"[..], str::as_bytes),
            ]),
        }
    }
}

/// The token of an `Authorization: Bearer TOKEN` value; the scheme is case-insensitive (RFC
/// 9110 §11.1), as some clients send `bearer`.
fn bearer_token(v: &str) -> Option<&str> {
    let (scheme, token) = v.trim().split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim_start())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// `--cors-origin`: the browser's preflight answered, and the origin allowed on responses.
/// Without it no CORS header is ever sent (browsers then refuse cross-origin calls).
async fn cors(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let Some(origin) = st.cfg.cors.clone() else {
        return next.run(req).await;
    };
    let mut r = if req.method() == Method::OPTIONS {
        StatusCode::NO_CONTENT.into_response()
    } else {
        next.run(req).await
    };
    let h = r.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("authorization, content-type, x-api-key, anthropic-version"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, OPTIONS"),
    );
    r
}

/// Which `Host` headers the server answers. A browser always sends the name it resolved, so
/// a page whose DNS name is rebound to 127.0.0.1 names its own host and is refused; clients
/// on this machine name the listen address, `localhost` or a loopback address.
pub(crate) struct HostRule {
    /// `None`: any host (`--allow-host '*'`, or a wildcard listen address without names).
    names: Option<Vec<(String, Option<u16>)>>,
}

impl HostRule {
    fn new(listen: SocketAddr, allowed: &[String]) -> HostRule {
        if allowed.iter().any(|a| a == "*") || (listen.ip().is_unspecified() && allowed.is_empty())
        {
            return HostRule { names: None };
        }
        let mut names: Vec<(String, Option<u16>)> = ["localhost", "127.0.0.1", "::1"]
            .iter()
            .map(|n| (n.to_string(), None))
            .collect();
        names.push((listen.ip().to_string(), None));
        names.extend(allowed.iter().map(|a| split_host(a)));
        HostRule { names: Some(names) }
    }

    /// Whether a request's `Host` value is one this server answers to.
    fn allows(&self, host: &str) -> bool {
        let Some(names) = &self.names else {
            return true;
        };
        let (name, port) = split_host(host);
        names
            .iter()
            .any(|(n, p)| *n == name && (p.is_none() || *p == port))
    }
}

/// `name[:port]` or `[v6][:port]`, the name lower-cased and without brackets.
fn split_host(h: &str) -> (String, Option<u16>) {
    let h = h.trim();
    let (name, port) = if let Some(rest) = h.strip_prefix('[') {
        match rest.split_once(']') {
            Some((n, p)) => (n, p.strip_prefix(':')),
            None => (rest, None),
        }
    } else if h.matches(':').count() == 1 {
        let (n, p) = h.split_once(':').unwrap_or((h, ""));
        (n, Some(p))
    } else {
        (h, None)
    };
    (
        name.trim_end_matches('.').to_ascii_lowercase(),
        port.and_then(|p| p.parse().ok()),
    )
}

/// Refuses a request whose `Host` this server does not answer to (421, before the key check,
/// so a rebound page learns nothing else either).
async fn host_check(State(st): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    let host = req
        .headers()
        .get(header::HOST)
        .map(|h| h.to_str().unwrap_or("\u{fffd}"));
    match host {
        Some(h) if !st.cfg.hosts.allows(h) => ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            format!(
                "this server does not answer to the host {h:?}; start it with --allow-host NAME to add one"
            ),
        )
        .flavor(Flavor::of_path(req.uri().path()))
        .into_response(),
        _ => next.run(req).await,
    }
}

/// A POST must say its body is JSON. Browsers send `text/plain` and form types across sites
/// without asking first (no CORS preflight); `application/json` they only send after a
/// preflight this server does not grant unless `--cors-origin` says so.
async fn json_only(req: Request, next: Next) -> Response {
    if req.method() != Method::POST {
        return next.run(req).await;
    }
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case("application/json") {
        return next.run(req).await;
    }
    let shown = if ct.is_empty() {
        "none".to_string()
    } else {
        format!("{ct:?}")
    };
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        format!("a POST body must be sent as Content-Type: application/json (got {shown})"),
    )
    .flavor(Flavor::of_path(req.uri().path()))
    .into_response()
}
