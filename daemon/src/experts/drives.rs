//! The drives expert reads go to, and which copy of a shard each read takes.
//!
//! A drive is a directory: with `--model-dirs A,B,...` (upstream's `COLI_MODEL_DIRS`) each
//! listed directory is one, and a shard file present in several of them (same name, same
//! size) is a set of copies; without it the model's directories count as one drive and a
//! `--mirror` as a second. Every read goes to the copy whose drive has the least busy time,
//! counting the reads in flight at that drive's average read time, so bytes spread in
//! proportion to each drive's measured speed; a failed read is retried on the other copies,
//! and each failure makes its drive look busier to later choices.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

/// Reads of one drive.
#[derive(Default)]
pub struct DriveStats {
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    /// Thread-nanoseconds inside reads (busy time summed over concurrent reads).
    pub ns: AtomicU64,
    pub failures: AtomicU64,
    inflight: AtomicU64,
    /// Wall time with at least one read in flight.
    wall: Mutex<WallBusy>,
    /// Added to the busy time when choosing a drive, per failed read, so a failing copy is
    /// asked less and less while the others serve.
    penalty_ns: AtomicU64,
    /// The busy time and reads the choice weighs: `ns` and `reads`, halved on every drive
    /// each [`CHOICE_WINDOW`] reads, so one slow read (a preempted thread, a cold page) stops
    /// steering reads away from its drive after a few windows instead of for the whole run.
    choice_ns: AtomicU64,
    choice_reads: AtomicU64,
}

#[derive(Default)]
struct WallBusy {
    inflight: u32,
    since: Option<Instant>,
    ns: u64,
}

impl DriveStats {
    pub(super) fn begin(&self) {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let mut w = self.wall.lock();
        if w.inflight == 0 {
            w.since = Some(Instant::now());
        }
        w.inflight += 1;
    }

    pub(super) fn end(&self) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        let mut w = self.wall.lock();
        w.inflight = w.inflight.saturating_sub(1);
        if w.inflight == 0 {
            if let Some(t) = w.since.take() {
                w.ns += t.elapsed().as_nanos() as u64;
            }
        }
    }

    /// A read of `bytes` done in `ns`.
    pub(super) fn done(&self, bytes: u64, ns: u64) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        self.ns.fetch_add(ns, Ordering::Relaxed);
        self.choice_ns.fetch_add(ns, Ordering::Relaxed);
        self.choice_reads.fetch_add(1, Ordering::Relaxed);
    }

    /// A failed read: counted, and the drive weighs more in later choices.
    pub(super) fn failed(&self) {
        let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
        self.penalty_ns
            .fetch_add(FAILURE_PENALTY_NS.saturating_mul(n), Ordering::Relaxed);
    }

    /// Wall seconds with at least one read in flight, the current stretch included.
    pub fn busy_wall_s(&self) -> f64 {
        let w = self.wall.lock();
        let open = w.since.map_or(0, |t| t.elapsed().as_nanos() as u64);
        (w.ns + open) as f64 / 1e9
    }

    /// What a read sent here now is expected to cost: the busy time so far plus the reads in
    /// flight and this one at the drive's average. Unmeasured drives score 0, so each is tried.
    fn score(&self) -> f64 {
        let reads = self.choice_reads.load(Ordering::Relaxed);
        let ns = self.choice_ns.load(Ordering::Relaxed) as f64;
        let avg = if reads > 0 { ns / reads as f64 } else { 0.0 };
        ns + self.penalty_ns.load(Ordering::Relaxed) as f64
            + (self.inflight.load(Ordering::Relaxed) as f64 + 1.0) * avg
    }
}

/// Choice penalty of one failed read.
const FAILURE_PENALTY_NS: u64 = 50_000_000;

/// Reads (over all drives) after which the choice's figures halve.
const CHOICE_WINDOW: u64 = 64;

/// The drives of a model and their counters.
pub struct Drives {
    /// Per drive: its directory (`None`: the model's directories taken together) and whether
    /// it is the `--mirror` (whose missing shards are worth a line).
    dirs: Vec<(Option<PathBuf>, bool)>,
    /// The directories as the filesystem resolves them, to match a shard's parent.
    canon: Vec<Option<PathBuf>>,
    pub stats: Vec<DriveStats>,
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf())
}

impl Drives {
    /// `model_dirs` (`--model-dirs`: one drive each) and the `mirror`; with neither, one drive.
    pub fn new(model_dirs: &[PathBuf], mirror: Option<&Path>) -> Drives {
        let mut dirs: Vec<(Option<PathBuf>, bool)> = if model_dirs.is_empty() {
            vec![(None, false)]
        } else {
            model_dirs
                .iter()
                .map(|d| (Some(d.clone()), false))
                .collect()
        };
        if let Some(m) = mirror {
            dirs.push((Some(m.to_path_buf()), true));
        }
        let mut d = Drives {
            canon: Vec::new(),
            stats: Vec::new(),
            dirs: Vec::new(),
        };
        for (dir, mirror) in dirs {
            d.push(dir, mirror);
        }
        d
    }

    fn push(&mut self, dir: Option<PathBuf>, mirror: bool) -> usize {
        self.canon.push(dir.as_deref().map(canonical));
        self.dirs.push((dir, mirror));
        self.stats.push(DriveStats::default());
        self.dirs.len() - 1
    }

    /// Whether drives are directories of their own (`--model-dirs`).
    fn per_dir(&self) -> bool {
        self.dirs[0].0.is_some()
    }

    /// The drive of the copy the model's search path found at `path`: its directory's, a new
    /// drive when that directory was not listed (a `--snap` directory beside `--model-dirs`).
    pub fn drive_of(&mut self, path: &Path) -> usize {
        if !self.per_dir() {
            return 0;
        }
        let parent = canonical(path.parent().unwrap_or(Path::new(".")));
        match self
            .canon
            .iter()
            .position(|c| c.as_deref() == Some(parent.as_path()))
        {
            Some(d) => d,
            None => self.push(Some(parent), false),
        }
    }

    /// The other drives' copies of the shard at `path` (read from drive `primary`): `(drive,
    /// path)` of each same-named file of the same size. A file of another size is not a copy
    /// (a line says so); a mirror without the file says so too, a model directory without it
    /// holds other shards (a split model) and says nothing.
    pub fn copies_of(&self, path: &Path, primary: usize) -> Vec<(usize, PathBuf)> {
        let name = path.file_name().unwrap_or_default();
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).ok();
        let want = size(path);
        let mut out = Vec::new();
        for (d, (dir, mirror)) in self.dirs.iter().enumerate() {
            let Some(dir) = dir else { continue };
            if d == primary {
                continue;
            }
            let p = dir.join(name);
            match size(&p) {
                Some(s) if Some(s) == want => out.push((d, p)),
                Some(_) => crate::elog!(
                    "[DRIVES] {} is not the size of {}: not a copy, that shard is not read there",
                    p.display(),
                    path.display()
                ),
                None if *mirror => crate::elog!(
                    "[MIRROR] {} is missing or not the size of {}: that shard is read \
                     from the model directory only",
                    p.display(),
                    path.display()
                ),
                None => {}
            }
        }
        out
    }

    /// Which of the copies on `drives` (in copy order) to read next: the least busy drive's,
    /// the first copy on a tie.
    pub fn pick(&self, drives: impl Iterator<Item = usize>) -> usize {
        let mut best = (0, f64::INFINITY);
        for (i, d) in drives.enumerate() {
            let s = self.stats[d].score();
            if s < best.1 {
                best = (i, s);
            }
        }
        best.0
    }

    /// Halves every drive's choice figures once they hold a window of reads. Two readers
    /// crossing the line together may halve twice: the figures only steer the choice, and a
    /// quartered window is as fair to every drive.
    pub fn age(&self) {
        if self.stats.len() < 2 {
            return;
        }
        let held: u64 = self
            .stats
            .iter()
            .map(|d| d.choice_reads.load(Ordering::Relaxed))
            .sum();
        if held >= CHOICE_WINDOW {
            for d in &self.stats {
                let _ = d
                    .choice_ns
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v / 2));
                let _ = d
                    .choice_reads
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v / 2));
            }
        }
    }

    pub fn len(&self) -> usize {
        self.stats.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stats.is_empty()
    }

    /// How the `[PROF] drive` lines name drive `d`.
    pub fn label(&self, d: usize) -> String {
        match &self.dirs[d] {
            (None, _) => "model directory".into(),
            (Some(p), true) => format!("mirror {}", p.display()),
            (Some(p), false) => format!("dir {}", p.display()),
        }
    }

    /// Whether a `--mirror` is one of the drives.
    pub fn has_mirror(&self) -> bool {
        self.dirs.iter().any(|(_, m)| *m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_busy_drive_is_picked_and_a_failure_weighs() {
        let d = Drives::new(&[PathBuf::from("/a"), PathBuf::from("/b")], None);
        // Unmeasured: the first copy.
        assert_eq!(d.pick([0, 1].into_iter()), 0);
        d.stats[0].done(100, 2_000_000);
        assert_eq!(d.pick([0, 1].into_iter()), 1, "b is unmeasured");
        d.stats[1].done(100, 1_000_000);
        assert_eq!(d.pick([0, 1].into_iter()), 1, "b is faster");
        assert_eq!(
            d.pick([1, 0].into_iter()),
            0,
            "an index into the copies given"
        );
        d.stats[1].failed();
        assert_eq!(d.pick([0, 1].into_iter()), 0, "b failed");
        assert_eq!(d.stats[1].failures.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn drives_are_the_listed_directories_then_any_other_parent() {
        let tmp = std::env::temp_dir().join(format!("colibri-drives-{}", std::process::id()));
        let (a, b, c) = (tmp.join("a"), tmp.join("b"), tmp.join("c"));
        for d in [&a, &b, &c] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(a.join("s.safetensors"), [0u8; 8]).unwrap();
        std::fs::write(b.join("s.safetensors"), [0u8; 8]).unwrap();
        std::fs::write(c.join("s.safetensors"), [0u8; 9]).unwrap();
        let mut d = Drives::new(&[a.clone(), b.clone(), c.clone()], None);
        assert_eq!(d.drive_of(&a.join("s.safetensors")), 0);
        // Same name and size in b: a copy; c's is another size: not one.
        assert_eq!(
            d.copies_of(&a.join("s.safetensors"), 0),
            vec![(1, b.join("s.safetensors"))]
        );
        assert_eq!(d.label(1), format!("dir {}", b.display()));
        let other = tmp.join("other");
        std::fs::create_dir_all(&other).unwrap();
        assert_eq!(d.drive_of(&other.join("x.safetensors")), 3);
        assert_eq!(d.len(), 4);
        // Without --model-dirs: one drive for the model, the mirror second.
        let mut legacy = Drives::new(&[], Some(&b));
        assert_eq!(legacy.drive_of(&a.join("s.safetensors")), 0);
        assert_eq!(legacy.label(0), "model directory");
        assert!(legacy.label(1).starts_with("mirror "));
        assert_eq!(
            legacy.copies_of(&a.join("s.safetensors"), 0),
            vec![(1, b.join("s.safetensors"))]
        );
        let _ = std::fs::remove_dir_all(&tmp);
    }
}
