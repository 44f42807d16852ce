//! The serve loop's token sink: each token's raw bytes to stdout as they come, with an
//! incomplete UTF-8 tail held back until the next token completes it (or the turn ends).

use std::io::Write;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use protocol::{Live, Progress, ProgressPhase, Telemetry};

use crate::error::EngineError;
use crate::experts::ExpertCounters;
use crate::generate::TokenSink;
use crate::model::Model;
use crate::telemetry::{rss_gb, TelemetryOut};
use crate::tokenizer::Tokenizer;

/// How many bytes at the end of `b` form the start of a UTF-8 sequence that is not complete
/// yet (0 when `b` ends on a boundary or with bytes that can never become valid).
pub fn incomplete_utf8_tail(b: &[u8]) -> usize {
    for back in 1..=b.len().min(3) {
        let byte = b[b.len() - back];
        if byte & 0xC0 == 0x80 {
            continue; // continuation byte: look further back for the lead
        }
        let need = match byte {
            0xC2..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF4 => 4,
            _ => return 0,
        };
        return if need > back { back } else { 0 };
    }
    0
}

pub struct StreamSink<'a, W: Write> {
    pub out: &'a mut W,
    pub tokenizer: &'a Tokenizer,
    pub model: &'a Model,
    pub telemetry: &'a mut TelemetryOut,
    pub slot: u32,
    held: Vec<u8>,
    pub tokens: Vec<u32>,
    started: Instant,
    last_live: Instant,
    base: ExpertCounters,
    /// Set when stdout is gone: the turn ends and the daemon exits after it.
    pub broken: bool,
}

impl<'a, W: Write> StreamSink<'a, W> {
    pub fn new(
        out: &'a mut W,
        tokenizer: &'a Tokenizer,
        model: &'a Model,
        telemetry: &'a mut TelemetryOut,
        slot: u32,
    ) -> Self {
        let now = Instant::now();
        StreamSink {
            out,
            tokenizer,
            model,
            telemetry,
            slot,
            held: Vec::new(),
            tokens: Vec::new(),
            started: now,
            // The first token sends a LIVE line at once; then one every 250 ms.
            last_live: now.checked_sub(Duration::from_secs(1)).unwrap_or(now),
            base: model.experts.counters(),
            broken: false,
        }
    }

    fn write(&mut self, bytes: &[u8]) {
        if self
            .out
            .write_all(bytes)
            .and_then(|_| self.out.flush())
            .is_err()
        {
            self.broken = true;
        }
    }

    /// Writes what is still held back (end of turn).
    pub fn finish(&mut self) {
        let held = std::mem::take(&mut self.held);
        if !held.is_empty() {
            self.write(&held);
        }
    }

    fn live(&mut self) {
        let c = self.model.experts.counters();
        let secs = self.started.elapsed().as_secs_f64();
        self.telemetry.send(&Telemetry::Live(Live {
            tokens: self.tokens.len() as u32,
            tok_per_s: crate::telemetry::per_second(self.tokens.len() as f64, secs),
            hit_pct: c.hit_pct_since(&self.base),
            rss_gb: rss_gb(),
            slot: self.slot,
        }));
    }
}

impl<W: Write> TokenSink for StreamSink<'_, W> {
    fn prefill_progress(&mut self, done: usize, total: usize) {
        if total > crate::generate::PREFILL_CHUNK {
            eprintln!("[prefill] {done}/{total} tokens");
        }
        self.telemetry.send(&Telemetry::Progress(Progress {
            phase: ProgressPhase::Prefill,
            done: done as u64,
            total: total as u64,
        }));
    }

    fn token(&mut self, id: u32) -> Result<bool, EngineError> {
        self.tokens.push(id);
        if self.tokens.len() == 1 {
            self.telemetry
                .send(&Telemetry::State(protocol::EngineState::Generating));
        }
        self.held.extend_from_slice(self.tokenizer.token_bytes(id));
        let keep = incomplete_utf8_tail(&self.held);
        let ready = self.held.len() - keep;
        if ready > 0 {
            let bytes: Vec<u8> = self.held.drain(..ready).collect();
            self.write(&bytes);
        }
        // Between two decode steps: a safe point for live re-pin and the RSS guard (which
        // reports itself on stderr).
        let safe = self.model.experts.safe_point(1);
        for swap in safe.swaps {
            self.telemetry.send(&Telemetry::Repin(swap));
        }
        if self.telemetry.enabled() && self.last_live.elapsed() >= Duration::from_millis(250) {
            self.last_live = Instant::now();
            self.live();
        }
        Ok(!self.broken && !super::signal::INTERRUPTED.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::incomplete_utf8_tail;

    #[test]
    fn holds_back_only_incomplete_sequences() {
        assert_eq!(incomplete_utf8_tail(b"abc"), 0);
        assert_eq!(incomplete_utf8_tail("é".as_bytes()), 0);
        assert_eq!(incomplete_utf8_tail(&"é".as_bytes()[..1]), 1);
        assert_eq!(incomplete_utf8_tail(&"你".as_bytes()[..2]), 2);
        assert_eq!(incomplete_utf8_tail(&"😀".as_bytes()[..3]), 3);
        assert_eq!(incomplete_utf8_tail("😀".as_bytes()), 0);
        // Bytes that can never start a sequence are not held.
        assert_eq!(incomplete_utf8_tail(b"a\xff"), 0);
        assert_eq!(incomplete_utf8_tail(b"\x80\x80\x80"), 0);
    }
}
