//! Counters of the expert tiers: hits (pinned / LRU), loads, bytes, time, and the DISK-CLASS
//! recency split of demand loads; plus the builders of the telemetry lines made from them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use protocol::{DiskClass, DiskClassFigures, Prof};

/// A demand load's recency class (DISK-CLASS).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Cold = 0,
    Warm = 1,
}

/// Cold when never touched before or last touched more than `window` selections ago (ties
/// warm). `pre` is the expert's last tick before this call's own selection.
pub fn classify(pre: Option<u64>, clock: u64, window: u64) -> Class {
    match pre {
        None => Class::Cold,
        Some(t) if clock.saturating_sub(t) > window => Class::Cold,
        Some(_) => Class::Warm,
    }
}

#[derive(Default, Clone, Copy)]
struct ClassAcc {
    count: u64,
    bytes: u64,
    thread_ns: u64,
    busy_ns: u64,
    direct: u64,
}

#[derive(Default)]
struct Busy {
    inflight: [usize; 2],
    since: [Option<Instant>; 2],
    any_inflight: usize,
    any_since: Option<Instant>,
    any_busy_ns: u64,
}

#[derive(Default)]
struct DiskClassState {
    acc: [ClassAcc; 2],
    busy: Busy,
}

#[derive(Default)]
pub struct Stats {
    pub hits_pin: AtomicU64,
    pub hits_lru: AtomicU64,
    pub misses: AtomicU64,
    /// Demand loads from disk (misses that were read, not prefetches).
    pub loads: AtomicU64,
    /// Pilot prefetch, re-pin and pin loads.
    pub other_loads: AtomicU64,
    pub bytes_read: AtomicU64,
    /// Thread-nanoseconds inside loads (read + decode), every load.
    pub load_ns: AtomicU64,
    /// Of `load_ns`: the read (buffers made ready and filled), the finiteness and checksum
    /// checks, and building the matrices from the bytes. What a load costs the cores when its
    /// bytes come from the page cache, where `read_ns` is a copy, not a wait.
    pub read_ns: AtomicU64,
    pub check_ns: AtomicU64,
    pub build_ns: AtomicU64,
    /// Nanoseconds the compute thread waited for experts.
    pub wait_ns: AtomicU64,
    /// Nanoseconds the compute thread spent between receiving experts (their products).
    pub matmul_ns: AtomicU64,
    pub forwards: AtomicU64,
    /// Loads served entirely through O_DIRECT.
    pub direct_loads: AtomicU64,
    /// Pilot guesses withdrawn before any worker started them (never read). Counted by the
    /// store when it withdraws one, not by the worker that later finds it withdrawn: counted
    /// there, a window's skips (bench's decode steps, a turn) took in guesses sent before it
    /// whose worker came to them late, so they could exceed the window's guesses sent, and
    /// a snapshot taken in between counted a withdrawn guess as read and unused.
    pub pilot_skipped: AtomicU64,
    diskclass: Mutex<DiskClassState>,
}

/// A snapshot of the counters, for deltas over a turn.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub hits_pin: u64,
    pub hits_lru: u64,
    pub misses: u64,
    pub loads: u64,
    pub bytes_read: u64,
    /// Every load, demand or not (pilot prefetches, pins).
    pub all_loads: u64,
    pub load_s: f64,
    pub read_s: f64,
    pub check_s: f64,
    pub build_s: f64,
    pub wait_s: f64,
    pub matmul_s: f64,
    pub forwards: u64,
}

impl Snapshot {
    pub fn since(&self, before: &Snapshot) -> Snapshot {
        Snapshot {
            hits_pin: self.hits_pin - before.hits_pin,
            hits_lru: self.hits_lru - before.hits_lru,
            misses: self.misses - before.misses,
            loads: self.loads - before.loads,
            bytes_read: self.bytes_read - before.bytes_read,
            all_loads: self.all_loads - before.all_loads,
            load_s: self.load_s - before.load_s,
            read_s: self.read_s - before.read_s,
            check_s: self.check_s - before.check_s,
            build_s: self.build_s - before.build_s,
            wait_s: self.wait_s - before.wait_s,
            matmul_s: self.matmul_s - before.matmul_s,
            forwards: self.forwards - before.forwards,
        }
    }

    pub fn requests(&self) -> u64 {
        self.hits_pin + self.hits_lru + self.misses
    }

    /// `(hit, pin, lru)` percentages.
    pub fn hit_pcts(&self) -> (f64, f64, f64) {
        let n = self.requests();
        if n == 0 {
            return (0.0, 0.0, 0.0);
        }
        let pct = |x: u64| 100.0 * x as f64 / n as f64;
        (
            pct(self.hits_pin + self.hits_lru),
            pct(self.hits_pin),
            pct(self.hits_lru),
        )
    }

    /// PROF with the serve loop's wall time and token counts (attention and lm_head are not
    /// measured by the store: 0).
    pub fn prof(&self, wall_s: f64, prompt_tokens: u32, completion_tokens: u32) -> Prof {
        Prof {
            wall_s,
            prompt_tokens,
            completion_tokens,
            expert_disk_s: self.load_s,
            expert_wait_s: self.wait_s,
            expert_matmul_s: self.matmul_s,
            attention_s: 0.0,
            lm_head_s: 0.0,
            forwards: self.forwards,
        }
    }
}

fn ns_s(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64 / 1e9
}

impl Stats {
    pub fn snapshot(&self) -> Snapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            hits_pin: g(&self.hits_pin),
            hits_lru: g(&self.hits_lru),
            misses: g(&self.misses),
            loads: g(&self.loads),
            bytes_read: g(&self.bytes_read),
            all_loads: g(&self.loads) + g(&self.other_loads),
            load_s: ns_s(&self.load_ns),
            read_s: ns_s(&self.read_ns),
            check_s: ns_s(&self.check_ns),
            build_s: ns_s(&self.build_ns),
            wait_s: ns_s(&self.wait_ns),
            matmul_s: ns_s(&self.matmul_ns),
            forwards: g(&self.forwards),
        }
    }

    /// A demand load of `class` starts (busy-wall accounting).
    pub fn dc_begin(&self, class: Class) {
        let mut s = self.diskclass.lock();
        let now = Instant::now();
        let c = class as usize;
        if s.busy.inflight[c] == 0 {
            s.busy.since[c] = Some(now);
        }
        s.busy.inflight[c] += 1;
        if s.busy.any_inflight == 0 {
            s.busy.any_since = Some(now);
        }
        s.busy.any_inflight += 1;
    }

    /// The load started by [`Stats::dc_begin`] finished (successfully or not).
    pub fn dc_end(&self, class: Class, bytes: u64, thread_ns: u64, direct: bool) {
        let mut s = self.diskclass.lock();
        let c = class as usize;
        let acc = &mut s.acc[c];
        acc.count += 1;
        acc.bytes += bytes;
        acc.thread_ns += thread_ns;
        acc.direct += direct as u64;
        s.busy.inflight[c] -= 1;
        if s.busy.inflight[c] == 0 {
            if let Some(t) = s.busy.since[c].take() {
                s.acc[c].busy_ns += t.elapsed().as_nanos() as u64;
            }
        }
        s.busy.any_inflight -= 1;
        if s.busy.any_inflight == 0 {
            if let Some(t) = s.busy.any_since.take() {
                s.busy.any_busy_ns += t.elapsed().as_nanos() as u64;
            }
        }
    }

    pub fn disk_class(&self) -> DiskClass {
        let s = self.diskclass.lock();
        let f = |a: &ClassAcc| DiskClassFigures {
            count: a.count,
            bytes: a.bytes,
            thread_s: a.thread_ns as f64 / 1e9,
            busy_s: a.busy_ns as f64 / 1e9,
            direct: a.direct,
        };
        DiskClass {
            cold: f(&s.acc[0]),
            warm: f(&s.acc[1]),
            drives: Vec::new(),
        }
    }

    /// Wall seconds with any demand load in flight.
    pub fn disk_busy_s(&self) -> f64 {
        self.diskclass.lock().busy.any_busy_ns as f64 / 1e9
    }
}

/// Upstream's DISK-CLASS report line.
pub fn disk_class_line(d: &DiskClass, busy_s: f64, window_s: f64) -> String {
    let one = |name: &str, f: &DiskClassFigures| {
        let gb = f.bytes as f64 / 1e9;
        format!(
            "{name} {} x {:.2} GB @ {:.2} GB/s-thread, wall {:.1}s @ {:.2} GB/s-wall, avg-conc {:.1} (direct {}/{})",
            f.count,
            gb,
            if f.thread_s > 0.0 { gb / f.thread_s } else { 0.0 },
            f.busy_s,
            if f.busy_s > 0.0 { gb / f.busy_s } else { 0.0 },
            if f.busy_s > 0.0 { f.thread_s / f.busy_s } else { 0.0 },
            f.direct,
            f.count
        )
    };
    format!(
        "[PROF] DISK-CLASS (recency split): {} | {} | disk-busy {:.1}s ({:.0}% of window)",
        one("cold", &d.cold),
        one("warm", &d.warm),
        busy_s,
        if window_s > 0.0 {
            100.0 * busy_s / window_s
        } else {
            0.0
        }
    )
}

/// What the pilot's reads ahead became, in expert loads (issue 50: "bytes actually prefetched
/// in time, not only the hit rate"). A guess stays staged until its layer asks and enters the
/// cache only then, so every used guess is used before any eviction could touch it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchCounts {
    /// Read ahead and complete when its layer asked: served from RAM, its read hidden.
    pub in_time: u64,
    /// Read ahead and still being read when its layer asked: the layer waited on it (part of
    /// the read hidden, the rest felt).
    pub late: u64,
    /// Read ahead (a worker took it) and never asked for: read for nothing.
    pub unused: u64,
}

impl PrefetchCounts {
    /// From the pilot's totals: guesses `sent` to the I/O pool, those `skipped` (withdrawn
    /// before a worker started them: never read), those `used` (asked for while read or being
    /// read) and, of these, the ones complete by then (`in_time`). Between forwards every
    /// guess sent is settled (its layer asked for its experts), so the counts a turn's end
    /// reads only grow.
    pub fn from_totals(sent: u64, skipped: u64, used: u64, in_time: u64) -> PrefetchCounts {
        PrefetchCounts {
            in_time,
            late: used.saturating_sub(in_time),
            unused: sent.saturating_sub(skipped).saturating_sub(used),
        }
    }

    pub fn since(&self, before: &PrefetchCounts) -> PrefetchCounts {
        PrefetchCounts {
            in_time: self.in_time.saturating_sub(before.in_time),
            late: self.late.saturating_sub(before.late),
            unused: self.unused.saturating_sub(before.unused),
        }
    }

    /// Loads the pilot read (each kind).
    pub fn read(&self) -> u64 {
        self.in_time + self.late + self.unused
    }

    /// The same in bytes, for experts of `expert_bytes` (the STAT suffix).
    pub fn bytes(&self, expert_bytes: u64) -> protocol::PrefetchBytes {
        protocol::PrefetchBytes {
            in_time: self.in_time * expert_bytes,
            late: self.late * expert_bytes,
            unused: self.unused * expert_bytes,
        }
    }

    /// `(in time, late, unused)` in MB per token for experts of `expert_bytes`.
    pub fn mb_per_token(&self, expert_bytes: u64, tokens: usize) -> (f64, f64, f64) {
        let mb = |n: u64| n as f64 * expert_bytes as f64 / 1e6 / tokens.max(1) as f64;
        (mb(self.in_time), mb(self.late), mb(self.unused))
    }

    /// The `[PROF] prefetch bytes:` line over `tokens` tokens.
    pub fn line(&self, expert_bytes: u64, tokens: usize) -> String {
        let (t, l, u) = self.mb_per_token(expert_bytes, tokens);
        format!(
            "[PROF] prefetch bytes: {t:.2} MB/token in time, {l:.2} MB/token late (the layer \
             waited on the read), {u:.2} MB/token never used | {} + {} + {} loads over {} tokens",
            self.in_time,
            self.late,
            self.unused,
            tokens.max(1)
        )
    }
}

/// EMAP heat: the bit length of a usage count, capped at 63.
pub fn heat_bits(count: u64) -> u8 {
    ((64 - count.leading_zeros()) as u8).min(63)
}

/// Bytes this process has had read from storage so far: `read_bytes` of `/proc/self/io`,
/// every thread's reads that reached a device (buffered misses, O_DIRECT, faults on mapped
/// files), none that the page cache served. `None` where the file is absent or unreadable.
pub fn device_read_bytes() -> Option<u64> {
    let io = std::fs::read_to_string("/proc/self/io").ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("read_bytes:"))
        .and_then(|v| v.trim().parse().ok())
}

/// What the loads of a window cost and where their bytes came from, per token:
/// `decode loads: L a token, T ms each on an I/O thread (read R ms = G GB/s, check C, build
/// B); the products waited W ms a token; from the device D MB a token (the page cache served
/// P MB)`. A load served by the page cache is a copy on a core, so its read time is CPU the
/// products did not get; from the device it is mostly a wait. The device part is left out
/// when the kernel does not count it.
pub fn load_line(what: &str, store: &Snapshot, device_bytes: Option<u64>, tokens: usize) -> String {
    let tokens = tokens.max(1) as f64;
    let loads = store.all_loads.max(1) as f64;
    let ms = |s: f64| s * 1e3 / loads;
    let mut line = format!(
        "{what} loads: {:.2} a token, {:.2} ms each on an I/O thread (read {:.2} ms = {:.2} GB/s, \
         check {:.2}, build {:.2}); the products waited {:.2} ms a token",
        store.all_loads as f64 / tokens,
        ms(store.load_s),
        ms(store.read_s),
        store.bytes_read as f64 / 1e9 / store.read_s.max(1e-12),
        ms(store.check_s),
        ms(store.build_s),
        store.wait_s * 1e3 / tokens,
    );
    if let Some(dev) = device_bytes {
        let cached = store.bytes_read.saturating_sub(dev);
        line.push_str(&format!(
            "; from the device {:.2} MB a token (the page cache served {:.2} MB)",
            dev as f64 / 1e6 / tokens,
            cached as f64 / 1e6 / tokens
        ));
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_by_recency_window() {
        assert_eq!(classify(None, 10, 5), Class::Cold);
        assert_eq!(classify(Some(5), 10, 5), Class::Warm); // tie is warm
        assert_eq!(classify(Some(4), 10, 5), Class::Cold);
        assert_eq!(classify(Some(9), 10, 5), Class::Warm);
    }

    #[test]
    fn heat_is_bit_length() {
        assert_eq!(heat_bits(0), 0);
        assert_eq!(heat_bits(1), 1);
        assert_eq!(heat_bits(2), 2);
        assert_eq!(heat_bits(255), 8);
        assert_eq!(heat_bits(256), 9);
        assert_eq!(heat_bits(u64::MAX), 63);
    }

    #[test]
    fn prefetch_counts_split_what_the_pilot_read() {
        // 10 guesses sent: 2 withdrawn before a worker started them (never read), 5 asked
        // for, 3 of these complete by then.
        let c = PrefetchCounts::from_totals(10, 2, 5, 3);
        assert_eq!((c.in_time, c.late, c.unused), (3, 2, 3));
        assert_eq!(c.read(), 8);
        let (t, l, u) = c.mb_per_token(2_000_000, 4);
        assert_eq!((t, l, u), (1.5, 1.0, 1.5));
        let d = c.since(&PrefetchCounts::from_totals(4, 1, 2, 2));
        assert_eq!((d.in_time, d.late, d.unused), (1, 2, 2));
        let line = c.line(2_000_000, 4);
        assert!(
            line.starts_with("[PROF] prefetch bytes: 1.50 MB/token in time, 1.00 MB/token late"),
            "{line}"
        );
    }

    #[test]
    fn disk_class_accumulates_per_class() {
        let s = Stats::default();
        s.dc_begin(Class::Cold);
        s.dc_begin(Class::Warm);
        s.dc_end(Class::Cold, 100, 5, true);
        s.dc_end(Class::Warm, 50, 7, false);
        let d = s.disk_class();
        assert_eq!((d.cold.count, d.cold.bytes, d.cold.direct), (1, 100, 1));
        assert_eq!((d.warm.count, d.warm.bytes, d.warm.direct), (1, 50, 0));
        let line = disk_class_line(&d, 0.0, 0.0);
        assert!(
            line.starts_with("[PROF] DISK-CLASS (recency split): cold 1 x "),
            "{line}"
        );
    }

    #[test]
    fn load_line_says_each_load_and_where_its_bytes_came_from() {
        // 8 loads over 4 tokens: 80 MB read in 0.04 s of 0.05 s on their threads, the
        // products waiting 0.02 s; 20 MB of the 80 from the device.
        let s = Snapshot {
            all_loads: 8,
            bytes_read: 80_000_000,
            load_s: 0.05,
            read_s: 0.04,
            check_s: 0.002,
            build_s: 0.008,
            wait_s: 0.02,
            ..Snapshot::default()
        };
        let line = load_line("decode", &s, Some(20_000_000), 4);
        assert_eq!(
            line,
            "decode loads: 2.00 a token, 6.25 ms each on an I/O thread (read 5.00 ms = 2.00 \
             GB/s, check 0.25, build 1.00); the products waited 5.00 ms a token; from the \
             device 5.00 MB a token (the page cache served 15.00 MB)"
        );
        // Where the kernel does not count device reads, the line says nothing of them.
        assert!(!load_line("decode", &s, None, 4).contains("device"));
    }

    #[test]
    fn device_reads_are_counted_on_linux() {
        // /proc/self/io exists on every Linux this runs on; elsewhere the figure is absent.
        if cfg!(target_os = "linux") {
            let a = device_read_bytes().expect("/proc/self/io's read_bytes");
            assert!(device_read_bytes().unwrap() >= a);
        }
    }
}
