//! Reading an expert's runs: buffered `pread`, `O_DIRECT` into aligned buffers (buffered where
//! the filesystem refuses), or handles into the shard's memory map whose pages the read
//! faults in (`--mmap`: packed matrices then use the page cache's pages, no copy); `--drop`
//! advises the kernel to forget the pages afterwards. Read buffers come from a pool and grow to the widest
//! run ever read, so steady-state loads do not allocate them.
//!
//! The store opens its own descriptors on the shard files (the `ShardSet` keeps its own for the
//! dense weights). A shard truncated under us turns into an error naming the file and offset:
//! `pread` comes back short, and in mmap mode the file length is checked before the map is
//! touched (a page past the end would be SIGBUS).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::args::IoMode;
use super::fault::FaultKind;
use super::layout::{tensor_name, ExpertLayout, Part};
use crate::error::EngineError;
use crate::quant::SharedBytes;
use crate::weights::{MappedTensor, ShardSet, WeightsError};

/// O_DIRECT alignment of offsets, lengths and buffers (covers 512 B and 4 KiB sectors).
const ALIGN: usize = 4096;
/// Buffers kept in the pool.
const POOL_MAX: usize = 32;

/// One copy of a shard file: the model directory's, or the mirror's (`--mirror`).
struct Copy {
    path: PathBuf,
    file: File,
    direct: Option<File>,
    direct_refused: AtomicBool,
    /// Whether a failed read of this copy was reported already.
    failure_told: AtomicBool,
}

struct ShardFile {
    dir: usize,
    /// `[primary]` or `[primary, mirror]`; index = drive.
    copies: Vec<Copy>,
}

/// Reads per model directory (a model spread over several disks).
#[derive(Default)]
pub struct DirStats {
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    pub ns: AtomicU64,
}

/// Reads per drive of a mirrored model (0 = the model's directories, 1 = the mirror).
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
    /// asked less and less while the other serves.
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
    fn begin(&self) {
        self.inflight.fetch_add(1, Ordering::Relaxed);
        let mut w = self.wall.lock();
        if w.inflight == 0 {
            w.since = Some(Instant::now());
        }
        w.inflight += 1;
    }

    fn end(&self) {
        self.inflight.fetch_sub(1, Ordering::Relaxed);
        let mut w = self.wall.lock();
        w.inflight = w.inflight.saturating_sub(1);
        if w.inflight == 0 {
            if let Some(t) = w.since.take() {
                w.ns += t.elapsed().as_nanos() as u64;
            }
        }
    }

    /// Wall seconds with at least one read in flight, the current stretch included.
    pub fn busy_wall_s(&self) -> f64 {
        let w = self.wall.lock();
        let open = w.since.map_or(0, |t| t.elapsed().as_nanos() as u64);
        (w.ns + open) as f64 / 1e9
    }
}

/// Choice penalty of one failed read.
const FAILURE_PENALTY_NS: u64 = 50_000_000;

/// Reads (over all drives) after which the choice's figures halve.
const CHOICE_WINDOW: u64 = 64;

pub struct Io {
    pub mode: IoMode,
    drop_after: bool,
    shards: Arc<ShardSet>,
    files: Vec<ShardFile>,
    pub dirs: Vec<PathBuf>,
    pub dir_stats: Vec<DirStats>,
    /// The mirror directory, when one is in use.
    pub mirror: Option<PathBuf>,
    /// One per drive: `[primary]`, or `[primary, mirror]` with a mirror.
    pub drives: Vec<DriveStats>,
    pool: Mutex<Vec<Vec<u8>>>,
    /// `COLI_FAULT_READ` (a test aid): positional reads to fail.
    fault: Option<super::fault::ReadFault>,
}

/// The bytes of one load, valid until handed back with [`Io::recycle`].
pub struct Loaded {
    runs: Vec<RunBytes>,
    /// Whether every run came through the O_DIRECT descriptor.
    pub direct: bool,
    pub read_ns: u64,
}

enum RunBytes {
    Owned {
        buf: Vec<u8>,
        at: usize,
    },
    /// One handle per part into the shard's map, its pages faulted in: a packed matrix uses
    /// the handle as its storage (zero-copy); the rest let go of their pages when dropped.
    Mapped(Vec<Arc<MappedTensor>>),
    /// One buffer per part, each read straight from the file: a packed matrix keeps its
    /// buffer as its storage, so its bytes are copied once (by the kernel), not twice.
    Parts(Vec<Vec<u8>>),
}

impl Loaded {
    /// Bytes of `part` of run `run`.
    pub fn part(&self, run: usize, idx: usize, part: &Part) -> &[u8] {
        match &self.runs[run] {
            RunBytes::Owned { buf, at } => {
                let s = at + part.rel as usize;
                &buf[s..s + part.len as usize]
            }
            RunBytes::Mapped(tensors) => tensors[idx].bytes(),
            RunBytes::Parts(bufs) => &bufs[idx],
        }
    }

    /// Part `idx` of run `run` as an owned buffer when it was read into one of its own
    /// (taken: `part` then gives no bytes); `None` when it lives in a shared buffer or a map.
    pub fn take_part(&mut self, run: usize, idx: usize) -> Option<Vec<u8>> {
        match &mut self.runs[run] {
            RunBytes::Parts(bufs) => Some(std::mem::take(&mut bufs[idx])),
            _ => None,
        }
    }

    /// Part `idx` of run `run` as a handle into the shard's map, when it was read as one
    /// (`--mmap`): a matrix over it needs no copy.
    pub fn shared_part(&self, run: usize, idx: usize) -> Option<Arc<dyn SharedBytes>> {
        match &self.runs[run] {
            RunBytes::Mapped(tensors) => Some(tensors[idx].clone() as Arc<dyn SharedBytes>),
            _ => None,
        }
    }
}

/// What a read that came back short (the file ends early) returns.
fn short_read(got: usize, want: usize) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        format!("short read: {got} of {want} bytes"),
    )
}

fn read_error(path: &Path, offset: u64, len: usize, source: std::io::Error) -> EngineError {
    EngineError::Weights(WeightsError::Read {
        file: path.to_path_buf(),
        offset,
        len,
        source,
    })
}

impl Io {
    pub fn new(
        shards: Arc<ShardSet>,
        mode: IoMode,
        drop_after: bool,
        mirror: Option<&Path>,
    ) -> Result<Io, EngineError> {
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut files = Vec::with_capacity(shards.num_files());
        let mut refused_dirs: Vec<PathBuf> = Vec::new();
        let mut mirrored = 0usize;
        let open_copy = |path: PathBuf, refused: &mut Vec<PathBuf>| -> std::io::Result<Copy> {
            let file = File::open(&path)?;
            let direct = if mode == IoMode::Direct {
                match std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
                    .open(&path)
                {
                    Ok(f) => Some(f),
                    Err(e) => {
                        let parent = path.parent().unwrap_or(Path::new(".")).to_path_buf();
                        if !refused.contains(&parent) {
                            crate::elog!(
                                "[IO] O_DIRECT refused for {} ({e}): buffered reads there",
                                parent.display()
                            );
                            refused.push(parent);
                        }
                        None
                    }
                }
            } else {
                None
            };
            Ok(Copy {
                path,
                file,
                direct,
                direct_refused: AtomicBool::new(false),
                failure_told: AtomicBool::new(false),
            })
        };
        for i in 0..shards.num_files() {
            let path = shards.file_path(i).to_path_buf();
            let parent = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            let dir = match dirs.iter().position(|d| *d == parent) {
                Some(d) => d,
                None => {
                    dirs.push(parent);
                    dirs.len() - 1
                }
            };
            let primary = open_copy(path.clone(), &mut refused_dirs)
                .map_err(|e| EngineError::io(format!("opening {}", path.display()), e))?;
            let mut copies = vec![primary];
            if let Some(m) = mirror {
                let name = path.file_name().unwrap_or_default();
                let mpath = m.join(name);
                let size = |p: &Path| std::fs::metadata(p).map(|md| md.len()).ok();
                if size(&mpath).is_some() && size(&mpath) == size(&path) {
                    match open_copy(mpath.clone(), &mut refused_dirs) {
                        Ok(c) => {
                            copies.push(c);
                            mirrored += 1;
                        }
                        Err(e) => crate::elog!(
                            "[MIRROR] {}: {e}: that shard is read from {} only",
                            mpath.display(),
                            path.display()
                        ),
                    }
                } else {
                    crate::elog!(
                        "[MIRROR] {} is missing or not the size of {}: that shard is read \
                         from the model directory only",
                        mpath.display(),
                        path.display()
                    );
                }
            }
            files.push(ShardFile { dir, copies });
        }
        if let Some(m) = mirror {
            crate::elog!(
                "[MIRROR] {}: {mirrored} of {} shards mirrored; reads spread over both copies \
                 by measured speed{}",
                m.display(),
                files.len(),
                if mode == IoMode::Mmap {
                    " (not with --mmap: mapped reads use the model directory)"
                } else {
                    ""
                }
            );
        }
        let dir_stats = dirs.iter().map(|_| DirStats::default()).collect();
        let n_drives = if mirror.is_some() { 2 } else { 1 };
        let fault = super::fault::ReadFault::from_env().map_err(EngineError::Usage)?;
        if let Some(f) = &fault {
            crate::elog!("[IO] test aid {}: {f:?}", super::fault::ENV);
        }
        Ok(Io {
            mode,
            drop_after,
            shards,
            files,
            dirs,
            dir_stats,
            mirror: mirror.map(Path::to_path_buf),
            drives: (0..n_drives).map(|_| DriveStats::default()).collect(),
            pool: Mutex::new(Vec::new()),
            fault,
        })
    }

    /// The copy to read next: the drive with the least busy time, counting the reads in flight
    /// at its average read time, so bytes spread in proportion to each drive's speed.
    fn pick(&self, f: &ShardFile) -> usize {
        if f.copies.len() < 2 {
            return 0;
        }
        let score = |d: usize| {
            let s = &self.drives[d];
            let reads = s.choice_reads.load(Ordering::Relaxed);
            let ns = s.choice_ns.load(Ordering::Relaxed) as f64;
            let avg = if reads > 0 { ns / reads as f64 } else { 0.0 };
            // Unmeasured drives are tried first.
            ns + s.penalty_ns.load(Ordering::Relaxed) as f64
                + (s.inflight.load(Ordering::Relaxed) as f64 + 1.0) * avg
        };
        if score(1) < score(0) {
            1
        } else {
            0
        }
    }

    /// Halves every drive's choice figures once they hold a window of reads. Two readers
    /// crossing the line together may halve twice: the figures only steer the choice, and a
    /// quartered window is as fair to both drives.
    fn age_choice(&self) {
        if self.drives.len() < 2 {
            return;
        }
        let held: u64 = self
            .drives
            .iter()
            .map(|d| d.choice_reads.load(Ordering::Relaxed))
            .sum();
        if held >= CHOICE_WINDOW {
            for d in &self.drives {
                let _ = d
                    .choice_ns
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v / 2));
                let _ = d
                    .choice_reads
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v / 2));
            }
        }
    }

    fn take_buf(&self) -> Vec<u8> {
        self.pool.lock().pop().unwrap_or_default()
    }

    /// Hands a load's buffers back to the pool.
    pub fn recycle(&self, loaded: Loaded) {
        let mut pool = self.pool.lock();
        for r in loaded.runs {
            match r {
                RunBytes::Owned { buf, .. } => {
                    if pool.len() < POOL_MAX {
                        pool.push(buf);
                    }
                }
                // What decoding did not keep (the scales, copied out as f32).
                RunBytes::Parts(bufs) => bufs.into_iter().for_each(super::recycle::give),
                RunBytes::Mapped(_) => {}
            }
        }
    }

    /// Reads every run of expert `e` of `layer`.
    pub fn read(
        &self,
        layout: &ExpertLayout,
        layer: usize,
        e: usize,
    ) -> Result<Loaded, EngineError> {
        self.read_with(layout, layer, e, false)
    }

    /// [`Io::read`] for the disk probe: buffered reads go into pooled buffers, one `pread` per
    /// run, so the probe measures the source (page cache or disk) and not the first touch of
    /// fresh memory a real load pays for its own storage.
    pub fn read_ceiling(
        &self,
        layout: &ExpertLayout,
        layer: usize,
        e: usize,
    ) -> Result<Loaded, EngineError> {
        self.read_with(layout, layer, e, true)
    }

    fn read_with(
        &self,
        layout: &ExpertLayout,
        layer: usize,
        e: usize,
        ceiling: bool,
    ) -> Result<Loaded, EngineError> {
        let t0 = Instant::now();
        let mut runs = Vec::with_capacity(layout.runs.len());
        let mut all_direct = true;
        for run in &layout.runs {
            let f = &self.files[run.file as usize];
            let first = if self.mode == IoMode::Mmap {
                0
            } else {
                self.pick(f)
            };
            let t = Instant::now();
            let got = match self.read_copy(f, first, run, layer, e, &mut all_direct, ceiling) {
                Ok(b) => Ok(b),
                Err(err) if f.copies.len() > 1 => {
                    let other = 1 - first;
                    let c = &f.copies[first];
                    if !c.failure_told.swap(true, Ordering::Relaxed) {
                        crate::elog!(
                            "[MIRROR] reading {} failed ({err}): retried on {}",
                            c.path.display(),
                            f.copies[other].path.display()
                        );
                    }
                    self.read_copy(f, other, run, layer, e, &mut all_direct, ceiling)
                }
                Err(err) => Err(err),
            }?;
            let ds = &self.dir_stats[f.dir];
            ds.reads.fetch_add(1, Ordering::Relaxed);
            ds.bytes.fetch_add(run.len, Ordering::Relaxed);
            ds.ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            runs.push(got);
        }
        Ok(Loaded {
            runs,
            direct: all_direct,
            read_ns: t0.elapsed().as_nanos() as u64,
        })
    }

    /// One run from copy `d` of `f`, accounted to drive `d`.
    fn read_copy(
        &self,
        f: &ShardFile,
        d: usize,
        run: &super::layout::Run,
        layer: usize,
        e: usize,
        all_direct: &mut bool,
        ceiling: bool,
    ) -> Result<RunBytes, EngineError> {
        let c = &f.copies[d];
        let drive = &self.drives[d.min(self.drives.len() - 1)];
        drive.begin();
        let t = Instant::now();
        let r = self.read_run(f, c, run, layer, e, all_direct, ceiling);
        drive.end();
        match &r {
            Ok(_) => {
                drive.reads.fetch_add(1, Ordering::Relaxed);
                drive.bytes.fetch_add(run.len, Ordering::Relaxed);
                let ns = t.elapsed().as_nanos() as u64;
                drive.ns.fetch_add(ns, Ordering::Relaxed);
                drive.choice_ns.fetch_add(ns, Ordering::Relaxed);
                drive.choice_reads.fetch_add(1, Ordering::Relaxed);
                self.age_choice();
                if self.drop_after {
                    // Advisory only: a refusal changes nothing but the page cache.
                    let _ = nix::fcntl::posix_fadvise(
                        c.file.as_raw_fd(),
                        run.start as i64,
                        run.len as i64,
                        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                    );
                }
            }
            Err(_) => {
                drive.failures.fetch_add(1, Ordering::Relaxed);
                let n = drive.failures.load(Ordering::Relaxed);
                drive
                    .penalty_ns
                    .fetch_add(FAILURE_PENALTY_NS.saturating_mul(n), Ordering::Relaxed);
            }
        }
        r
    }

    fn read_run(
        &self,
        f: &ShardFile,
        c: &Copy,
        run: &super::layout::Run,
        layer: usize,
        e: usize,
        all_direct: &mut bool,
        ceiling: bool,
    ) -> Result<RunBytes, EngineError> {
        let len = run.len as usize;
        match self.mode {
            IoMode::Mmap => {
                *all_direct = false;
                self.mapped(&f.copies[0], run, layer, e)
            }
            IoMode::Direct if c.direct.is_some() && !c.direct_refused.load(Ordering::Relaxed) => {
                match self.read_direct(c, run.start, len) {
                    Ok(r) => Ok(r),
                    Err(err) if err.raw_os_error() == Some(nix::libc::EINVAL) => {
                        if !c.direct_refused.swap(true, Ordering::Relaxed) {
                            crate::elog!(
                                "[IO] O_DIRECT read refused on {} ({err}): buffered reads",
                                c.path.display()
                            );
                        }
                        *all_direct = false;
                        self.read_buffered(c, run.start, len)
                            .map_err(|err| read_error(&c.path, run.start, len, err))
                    }
                    Err(err) => Err(read_error(&c.path, run.start, len, err)),
                }
            }
            _ => {
                *all_direct = false;
                let r = if ceiling {
                    self.read_buffered(c, run.start, len)
                } else {
                    self.read_parts(c, run)
                };
                r.map_err(|err| read_error(&c.path, run.start, len, err))
            }
        }
    }

    /// Each part of `run` into a buffer of its own, one `pread` per part (the parts of a run
    /// are adjacent, so this reads the same bytes as one `pread` of the run).
    fn read_parts(&self, f: &Copy, run: &super::layout::Run) -> std::io::Result<RunBytes> {
        let fault = self.injected();
        let mut bufs = Vec::with_capacity(run.parts.len());
        for (i, part) in run.parts.iter().enumerate() {
            let at = run.start + part.rel as u64;
            let len = part.len as usize;
            let mut buf = super::recycle::take(len);
            match (i, fault) {
                (0, Some(FaultKind::Eio)) => return Err(super::fault::eio()),
                (0, Some(FaultKind::Short)) => {
                    f.file.read_exact_at(&mut buf[..len / 2], at)?;
                    return Err(short_read(len / 2, run.len as usize));
                }
                _ => f.file.read_exact_at(&mut buf, at)?,
            }
            bufs.push(buf);
        }
        Ok(RunBytes::Parts(bufs))
    }

    fn read_buffered(&self, f: &Copy, start: u64, len: usize) -> std::io::Result<RunBytes> {
        let mut buf = self.take_buf();
        buf.resize(len, 0);
        let read = match self.injected() {
            Some(FaultKind::Eio) => Err(super::fault::eio()),
            Some(FaultKind::Short) => f
                .file
                .read_exact_at(&mut buf[..len / 2], start)
                .and_then(|()| Err(short_read(len / 2, len))),
            None => f.file.read_exact_at(&mut buf[..len], start),
        };
        match read {
            Ok(()) => Ok(RunBytes::Owned { buf, at: 0 }),
            Err(e) => {
                self.pool.lock().push(buf);
                Err(e)
            }
        }
    }

    /// `O_DIRECT` read of `start..start+len`: the aligned span around it into an aligned
    /// window of a pooled buffer; the wanted bytes start at the returned offset.
    fn read_direct(&self, f: &Copy, start: u64, len: usize) -> std::io::Result<RunBytes> {
        let file = f.direct.as_ref().expect("checked by the caller");
        let a = start & !(ALIGN as u64 - 1);
        let head = (start - a) as usize;
        let want = head + len;
        let total = want.div_ceil(ALIGN) * ALIGN;
        let mut buf = self.take_buf();
        if buf.len() < total + ALIGN {
            buf.resize(total + ALIGN, 0);
        }
        let pad = buf.as_ptr().align_offset(ALIGN);
        let fault = self.injected();
        let result = (|| {
            let dst = &mut buf[pad..pad + total];
            let want = match fault {
                Some(FaultKind::Eio) => return Err(super::fault::eio()),
                // Half the bytes, rounded down to whole sectors (O_DIRECT sizes).
                Some(FaultKind::Short) => (want / 2) & !(ALIGN - 1),
                None => want,
            };
            let mut got = 0;
            while got < want {
                match file.read_at(&mut dst[got..], a + got as u64) {
                    Ok(0) => {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::UnexpectedEof,
                            format!("file ends {} bytes short of the tensor", want - got),
                        ))
                    }
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            match fault {
                Some(_) => Err(short_read(want, head + len)),
                None => Ok(()),
            }
        })();
        match result {
            Ok(()) => Ok(RunBytes::Owned {
                buf,
                at: pad + head,
            }),
            Err(e) => {
                self.pool.lock().push(buf);
                Err(e)
            }
        }
    }

    fn mapped(
        &self,
        f: &Copy,
        run: &super::layout::Run,
        layer: usize,
        e: usize,
    ) -> Result<RunBytes, EngineError> {
        // A page past a truncated end would be SIGBUS: check the length first. The populate
        // below then reads every page, so a truncation after the check fails there; one while
        // the expert stays cached is what `--mmap`'s help warns of.
        let size = f
            .file
            .metadata()
            .map_err(|err| read_error(&f.path, run.start, run.len as usize, err))?
            .len();
        if size < run.start + run.len {
            return Err(read_error(
                &f.path,
                run.start,
                run.len as usize,
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("the file is {size} bytes now, shorter than at start (truncated?)"),
                ),
            ));
        }
        let mut tensors = Vec::with_capacity(run.parts.len());
        for p in &run.parts {
            let name = tensor_name(layer, e, p.proj as usize, p.scales);
            tensors.push(Arc::new(ShardSet::mapped_tensor(&self.shards, &name)?));
        }
        Ok(RunBytes::Mapped(tensors))
    }

    fn injected(&self) -> Option<FaultKind> {
        self.fault.as_ref().and_then(|f| f.next_read())
    }

    /// The path of shard `file` (the model directory's copy), for messages.
    pub fn shard_path(&self, file: usize) -> &Path {
        self.shards.file_path(file)
    }

    /// Whether any shard actually has an O_DIRECT descriptor in use.
    pub fn direct_active(&self) -> bool {
        self.files
            .iter()
            .flat_map(|f| &f.copies)
            .any(|c| c.direct.is_some() && !c.direct_refused.load(Ordering::Relaxed))
    }
}
