//! What a conversion shows while it works: a bar with rate and ETA when stderr is a terminal
//! (indicatif), and otherwise a plain `[convert]` line every few seconds and at each shard's
//! end, which a log file or a CI job can read.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How often plain progress lines are written.
const LINE_EVERY: Duration = Duration::from_secs(5);

pub struct Progress {
    /// Source bytes still to convert this run (the bar's length).
    total: u64,
    read: AtomicU64,
    written: AtomicU64,
    start: Instant,
    bar: Option<ProgressBar>,
    last_line: Mutex<Instant>,
}

fn gb(b: u64) -> f64 {
    b as f64 / 1e9
}

impl Progress {
    pub fn new(total: u64) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template(
                    "[convert] {bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta} {msg}",
                )
                .expect("the template is valid"),
            );
            bar
        });
        let start = Instant::now();
        Progress {
            total,
            read: AtomicU64::new(0),
            written: AtomicU64::new(0),
            start,
            bar,
            last_line: Mutex::new(start),
        }
    }

    /// Counts `read` source bytes converted into `written` output bytes.
    pub fn add(&self, read: u64, written: u64) {
        let r = self.read.fetch_add(read, Ordering::Relaxed) + read;
        self.written.fetch_add(written, Ordering::Relaxed);
        match &self.bar {
            Some(bar) => bar.set_position(r),
            None => {
                let mut last = self.last_line.lock().unwrap_or_else(|p| p.into_inner());
                if last.elapsed() >= LINE_EVERY {
                    *last = Instant::now();
                    drop(last);
                    self.line("");
                }
            }
        }
    }

    /// A shard is finished: the terminal bar names it, plain output gets a line.
    pub fn shard_done(&self, name: &str, index: usize, of: usize) {
        let what = format!("{name} ({}/{of})", index + 1);
        match &self.bar {
            Some(bar) => bar.set_message(what),
            None => self.line(&format!(" | {what} done")),
        }
    }

    fn line(&self, tail: &str) {
        let r = self.read.load(Ordering::Relaxed);
        let secs = self.start.elapsed().as_secs_f64().max(1e-3);
        let rate = r as f64 / secs;
        let eta = if rate > 0.0 {
            format!("{:.0} s", (self.total.saturating_sub(r)) as f64 / rate)
        } else {
            "?".into()
        };
        crate::elog!(
            "[convert] {:.2}/{:.2} GB read, {:.2} GB written, {:.1} MB/s, ETA {eta}{tail}",
            gb(r),
            gb(self.total),
            gb(self.written.load(Ordering::Relaxed)),
            rate / 1e6
        );
    }

    /// (source bytes read, output bytes written, seconds) so far.
    pub fn totals(&self) -> (u64, u64, f64) {
        (
            self.read.load(Ordering::Relaxed),
            self.written.load(Ordering::Relaxed),
            self.start.elapsed().as_secs_f64(),
        )
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
