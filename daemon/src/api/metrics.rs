//! `/metrics`: counters the HTTP side and the engine thread update as requests go, and the
//! engine's gauges (expert hit rate, tier bytes) as the engine thread last saw them, written
//! as Prometheus text.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

#[derive(Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub refused: AtomicU64,
    pub cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Requests decoding or prefilling now.
    pub active: AtomicU64,
    /// Time to first token: sum in microseconds and count.
    pub ttft_us: AtomicU64,
    pub ttft_n: AtomicU64,
    /// Decode time summed over requests (microseconds), for aggregate tok/s.
    pub decode_us: AtomicU64,
    /// Sessions whose state could not be saved (disk full, I/O error) after a request.
    pub save_failed: AtomicU64,
    /// Connections open now, and those closed at once because the limit was reached.
    pub connections: AtomicU64,
    pub connections_refused: AtomicU64,
    /// Connections closed for sending no header, body or request within its timeout.
    pub connections_timed_out: AtomicU64,
    pub gauges: Mutex<Gauges>,
}

/// What only the engine thread can read, refreshed after each request.
#[derive(Clone, Debug, Default)]
pub struct Gauges {
    pub expert_hits: u64,
    pub expert_misses: u64,
    pub ram_experts: u64,
    pub disk_experts: u64,
    pub ram_tier_bytes: u64,
    pub bytes_read: u64,
    pub last_tok_per_s: f64,
}

impl Metrics {
    pub fn add(&self, c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The Prometheus exposition text; `queue` is the number of requests waiting for a slot.
    pub fn render(&self, queue: usize, slots: usize, ready: bool) -> String {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let g = self.gauges.lock().clone();
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(out, "# HELP colibri_{name} {help}");
            let _ = writeln!(out, "# TYPE colibri_{name} {kind}");
            let _ = writeln!(out, "colibri_{name} {value}");
        };
        metric(
            "ready",
            "gauge",
            "1 once the model is loaded.",
            u64::from(ready).to_string(),
        );
        metric(
            "requests_total",
            "counter",
            "Requests admitted.",
            get(&self.requests).to_string(),
        );
        metric(
            "requests_refused_total",
            "counter",
            "Requests refused (invalid, too long, queue full).",
            get(&self.refused).to_string(),
        );
        metric(
            "requests_cancelled_total",
            "counter",
            "Requests stopped because their client went away or timed out.",
            get(&self.cancelled).to_string(),
        );
        metric(
            "prompt_tokens_total",
            "counter",
            "Prompt tokens of admitted requests.",
            get(&self.prompt_tokens).to_string(),
        );
        metric(
            "cached_prompt_tokens_total",
            "counter",
            "Prompt tokens reused from a KV cache instead of prefilled.",
            get(&self.cached_tokens).to_string(),
        );
        metric(
            "completion_tokens_total",
            "counter",
            "Tokens generated.",
            get(&self.completion_tokens).to_string(),
        );
        metric(
            "active_sessions",
            "gauge",
            "Requests being prefilled or decoded.",
            get(&self.active).to_string(),
        );
        metric(
            "sessions",
            "gauge",
            "KV slots (requests decoded together).",
            slots.to_string(),
        );
        metric(
            "queue_depth",
            "gauge",
            "Requests waiting for a free slot.",
            queue.to_string(),
        );
        let n = get(&self.ttft_n);
        metric(
            "time_to_first_token_seconds_sum",
            "counter",
            "Seconds from arrival to the first token, summed.",
            format!("{:.6}", get(&self.ttft_us) as f64 / 1e6),
        );
        metric(
            "time_to_first_token_seconds_count",
            "counter",
            "Requests with a first token.",
            n.to_string(),
        );
        let decode_s = get(&self.decode_us) as f64 / 1e6;
        metric(
            "decode_seconds_total",
            "counter",
            "Seconds requests spent decoding, summed over requests.",
            format!("{decode_s:.6}"),
        );
        metric(
            "last_request_tokens_per_second",
            "gauge",
            "Decode tok/s of the last finished request.",
            format!("{:.3}", g.last_tok_per_s),
        );
        let lookups = g.expert_hits + g.expert_misses;
        let rate = if lookups > 0 {
            g.expert_hits as f64 / lookups as f64
        } else {
            0.0
        };
        metric(
            "expert_hit_rate",
            "gauge",
            "Expert lookups served from RAM, since start.",
            format!("{rate:.4}"),
        );
        metric(
            "expert_bytes_read_total",
            "counter",
            "Expert bytes read from disk.",
            g.bytes_read.to_string(),
        );
        metric(
            "tier_ram_experts",
            "gauge",
            "Experts resident in RAM.",
            g.ram_experts.to_string(),
        );
        metric(
            "tier_disk_experts",
            "gauge",
            "Experts only on disk.",
            g.disk_experts.to_string(),
        );
        metric(
            "tier_ram_bytes",
            "gauge",
            "Bytes of the RAM expert tier.",
            g.ram_tier_bytes.to_string(),
        );
        metric(
            "session_save_failures_total",
            "counter",
            "Sessions whose state could not be saved after a request (disk full, I/O error).",
            get(&self.save_failed).to_string(),
        );
        metric(
            "connections_open",
            "gauge",
            "HTTP connections open now.",
            get(&self.connections).to_string(),
        );
        metric(
            "connections_refused_total",
            "counter",
            "Connections answered 503 and closed because --max-connections were open.",
            get(&self.connections_refused).to_string(),
        );
        metric(
            "connections_timed_out_total",
            "counter",
            "Connections closed by --header-timeout, --body-timeout or --idle-timeout.",
            get(&self.connections_timed_out).to_string(),
        );
        metric(
            "log_lines_dropped_total",
            "counter",
            "Log lines that could not be written to stderr (a closed log pipe).",
            crate::log::dropped().to_string(),
        );
        metric(
            "rss_bytes",
            "gauge",
            "Resident set size of the server.",
            format!("{:.0}", crate::telemetry::rss_gb() * 1e9),
        );
        out
    }
}
