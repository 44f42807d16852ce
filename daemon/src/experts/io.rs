//! Reading an expert's runs: buffered `pread`, `O_DIRECT` into aligned buffers (buffered where
//! the filesystem refuses), or handles into the shard's memory map whose pages the read
//! faults in (`--mmap`: packed matrices then use the page cache's pages, no copy); `--drop`
//! advises the kernel to forget the pages afterwards. Read buffers come from a pool, so
//! steady-state loads do not allocate them; an `O_DIRECT` read's buffer becomes the storage of
//! the packed matrices kept from it (no copy) and returns to the pool with the expert.
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
use super::drives::Drives;
use super::fault::FaultKind;
use super::layout::{tensor_name, ExpertLayout, Part};
use crate::error::EngineError;
use crate::quant::SharedBytes;
use crate::weights::{MappedTensor, ShardSet, WeightsError};

/// O_DIRECT alignment of offsets, lengths and buffers (covers 512 B and 4 KiB sectors).
const ALIGN: usize = 4096;
/// Buffers kept in the pool.
const POOL_MAX: usize = 32;

/// One copy of a shard file: the one the model's search path found, or another drive's
/// (`--model-dirs`, `--mirror`; see [`Drives`]).
struct Copy {
    path: PathBuf,
    /// Its drive, an index into [`Io::drives`].
    drive: usize,
    file: File,
    direct: Option<File>,
    direct_refused: AtomicBool,
    /// Whether a failed read of this copy was reported already.
    failure_told: AtomicBool,
}

struct ShardFile {
    dir: usize,
    /// The search path's copy first, then the other drives' (each on a drive of its own).
    copies: Vec<Copy>,
}

/// Reads per model directory (a model spread over several disks).
#[derive(Default)]
pub struct DirStats {
    pub reads: AtomicU64,
    pub bytes: AtomicU64,
    pub ns: AtomicU64,
}

pub struct Io {
    pub mode: IoMode,
    drop_after: bool,
    shards: Arc<ShardSet>,
    files: Vec<ShardFile>,
    pub dirs: Vec<PathBuf>,
    pub dir_stats: Vec<DirStats>,
    /// The drives reads are spread over, with their counters: the model's directories as one
    /// (then a `--mirror`), or each `--model-dirs` directory.
    pub drives: Drives,
    pool: ReadPool,
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
    /// An `O_DIRECT` read of the whole run (its aligned span) into one buffer, the run's bytes
    /// from `at`: a packed matrix keeps a handle into it as its storage ([`DirectPart`]), so
    /// the bytes the device wrote are the ones the products read. Copying each matrix out
    /// instead cost a fresh allocation and a pass over it per load, on I/O threads that
    /// share two cores with the products: 5-6 ms of a 7.57 MB expert's load.
    Direct {
        run: Arc<DirectRun>,
        at: usize,
    },
}

/// A buffer an `O_DIRECT` read filled, shared by the matrices kept from it; back to the
/// read pool when the last of them goes (the expert's eviction), so steady-state loads do not
/// allocate (fresh pages cost their faults and zeroing).
struct DirectRun {
    buf: Vec<u8>,
    pool: ReadPool,
}

impl Drop for DirectRun {
    fn drop(&mut self) {
        keep(&mut self.pool.lock(), std::mem::take(&mut self.buf));
    }
}

/// The read buffers waiting for the next loads (at most [`POOL_MAX`]), shared with the
/// direct runs that give theirs back when dropped.
type ReadPool = Arc<Mutex<Vec<Vec<u8>>>>;

/// Keeps `buf` in the pool `kept` while it has room.
fn keep(kept: &mut Vec<Vec<u8>>, buf: Vec<u8>) {
    if kept.len() < POOL_MAX {
        kept.push(buf);
    }
}

/// Where part `part` of a run whose bytes start at `at` of its buffer lies.
fn span(at: usize, part: &Part) -> std::ops::Range<usize> {
    let s = at + part.rel as usize;
    s..s + part.len as usize
}

/// One part of a [`DirectRun`]: a packed matrix's bytes, zero-copy.
struct DirectPart {
    run: Arc<DirectRun>,
    span: std::ops::Range<usize>,
}

impl SharedBytes for DirectPart {
    fn bytes(&self) -> &[u8] {
        &self.run.buf[self.span.clone()]
    }
}

impl Loaded {
    /// Bytes of `part` of run `run`.
    pub fn part(&self, run: usize, idx: usize, part: &Part) -> &[u8] {
        match &self.runs[run] {
            RunBytes::Owned { buf, at } => &buf[span(*at, part)],
            RunBytes::Mapped(tensors) => tensors[idx].bytes(),
            RunBytes::Parts(bufs) => &bufs[idx],
            RunBytes::Direct { run: r, at } => &r.buf[span(*at, part)],
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

    /// Part `idx` (its place `part`) of run `run` as a handle into the shard's map (`--mmap`)
    /// or into the `O_DIRECT` read's buffer: a matrix over it needs no copy.
    pub fn shared_part(&self, run: usize, idx: usize, part: &Part) -> Option<Arc<dyn SharedBytes>> {
        match &self.runs[run] {
            RunBytes::Mapped(tensors) => Some(tensors[idx].clone() as Arc<dyn SharedBytes>),
            RunBytes::Direct { run: r, at } => Some(Arc::new(DirectPart {
                run: r.clone(),
                span: span(*at, part),
            })),
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
        model_dirs: &[PathBuf],
        mirror: Option<&Path>,
    ) -> Result<Io, EngineError> {
        let mut drives = Drives::new(model_dirs, mirror);
        let mut dirs: Vec<PathBuf> = Vec::new();
        let mut files = Vec::with_capacity(shards.num_files());
        let mut refused_dirs: Vec<PathBuf> = Vec::new();
        let mut mirrored = 0usize;
        let open_copy =
            |path: PathBuf, drive: usize, refused: &mut Vec<PathBuf>| -> std::io::Result<Copy> {
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
                    drive,
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
            let home = drives.drive_of(&path);
            let primary = open_copy(path.clone(), home, &mut refused_dirs)
                .map_err(|e| EngineError::io(format!("opening {}", path.display()), e))?;
            let mut copies = vec![primary];
            for (drive, cpath) in drives.copies_of(&path, home) {
                match open_copy(cpath.clone(), drive, &mut refused_dirs) {
                    Ok(c) => copies.push(c),
                    Err(e) => crate::elog!(
                        "[DRIVES] {}: {e}: that shard is not read there",
                        cpath.display()
                    ),
                }
            }
            if copies.len() > 1 {
                mirrored += 1;
            }
            files.push(ShardFile { dir, copies });
        }
        if drives.len() > 1 {
            crate::elog!(
                "[DRIVES] {} drives ({}): {mirrored} of {} shards have copies on several; \
                 reads spread over the copies by measured speed{}",
                drives.len(),
                (0..drives.len())
                    .map(|d| drives.label(d))
                    .collect::<Vec<_>>()
                    .join(", "),
                files.len(),
                if mode == IoMode::Mmap {
                    " (not with --mmap: mapped reads use the search path's copy)"
                } else {
                    ""
                }
            );
        }
        let dir_stats = dirs.iter().map(|_| DirStats::default()).collect();
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
            drives,
            pool: Arc::new(Mutex::new(Vec::new())),
            fault,
        })
    }

    /// The copy of `f` to read next: the one on the least busy drive ([`Drives::pick`]).
    fn pick(&self, f: &ShardFile) -> usize {
        if f.copies.len() < 2 {
            return 0;
        }
        self.drives.pick(f.copies.iter().map(|c| c.drive))
    }

    fn take_buf(&self) -> Vec<u8> {
        self.pool.lock().pop().unwrap_or_default()
    }

    /// Hands a load's buffers back to the pool.
    pub fn recycle(&self, loaded: Loaded) {
        give_back(&self.pool, loaded.runs);
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
            let mut got = self.read_copy(f, first, run, layer, e, &mut all_direct, ceiling);
            // A failed read is retried on the other copies in turn, until one serves.
            for other in (0..f.copies.len()).filter(|&c| c != first) {
                let Err(err) = &got else { break };
                let c = &f.copies[first];
                if !c.failure_told.swap(true, Ordering::Relaxed) {
                    crate::elog!(
                        "[DRIVES] reading {} failed ({err}): retried on {}",
                        c.path.display(),
                        f.copies[other].path.display()
                    );
                }
                got = self.read_copy(f, other, run, layer, e, &mut all_direct, ceiling);
            }
            let got = got?;
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
        let drive = &self.drives.stats[c.drive];
        drive.begin();
        let t = Instant::now();
        let r = self.read_run(f, c, run, layer, e, all_direct, ceiling);
        drive.end();
        match &r {
            Ok(_) => {
                drive.done(run.len, t.elapsed().as_nanos() as u64);
                self.drives.age();
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
            Err(_) => drive.failed(),
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
        // The buffer becomes the expert's storage: one much wider than this run (a pool
        // shared by layers of other shapes) would hold RAM the budget does not count.
        if buf.capacity() > 2 * (total + ALIGN) {
            buf = Vec::new();
        }
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
            Ok(()) => Ok(RunBytes::Direct {
                run: Arc::new(DirectRun {
                    buf,
                    pool: self.pool.clone(),
                }),
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

/// A load's buffers back: read buffers to `pool`, parts' buffers to [`super::recycle`]. A
/// direct run no matrix kept returns to `pool` as its handle drops, which takes the pool's
/// lock: those are dropped after it is released.
fn give_back(pool: &Mutex<Vec<Vec<u8>>>, runs: Vec<RunBytes>) {
    let mut direct = Vec::new();
    let mut kept = pool.lock();
    for r in runs {
        match r {
            RunBytes::Owned { buf, .. } => keep(&mut kept, buf),
            // What decoding did not keep (the scales, copied out as f32).
            RunBytes::Parts(bufs) => bufs.into_iter().for_each(super::recycle::give),
            RunBytes::Mapped(_) => {}
            RunBytes::Direct { run, .. } => direct.push(run),
        }
    }
    drop(kept);
    drop(direct);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct_run(pool: &ReadPool, bytes: &[u8]) -> Arc<DirectRun> {
        Arc::new(DirectRun {
            buf: bytes.to_vec(),
            pool: pool.clone(),
        })
    }

    /// A matrix kept from a direct read holds the read's buffer: its bytes are the run's, and
    /// the buffer goes back to the pool only when the last part of it is dropped.
    #[test]
    fn a_direct_run_returns_to_the_pool_when_its_last_part_goes() {
        let pool = Arc::new(Mutex::new(Vec::new()));
        let run = direct_run(&pool, b"..headGATEDOWN");
        let part = |span| DirectPart {
            run: run.clone(),
            span,
        };
        let (gate, down) = (part(6..10), part(10..14));
        assert_eq!((gate.bytes(), down.bytes()), (&b"GATE"[..], &b"DOWN"[..]));
        give_back(&pool, vec![RunBytes::Direct { run, at: 2 }]);
        assert!(pool.lock().is_empty(), "the matrices still hold it");
        drop(gate);
        assert!(pool.lock().is_empty());
        drop(down);
        assert_eq!(pool.lock().as_slice(), &[b"..headGATEDOWN".to_vec()]);
    }

    /// A direct run nothing kept (a probe read, a failed decode) goes straight back, in the
    /// same call that takes the pool's lock for the other runs: no deadlock.
    #[test]
    fn a_direct_run_nothing_kept_goes_back_at_once() {
        let pool = Arc::new(Mutex::new(Vec::new()));
        let runs = vec![
            RunBytes::Owned {
                buf: vec![1; 8],
                at: 0,
            },
            RunBytes::Direct {
                run: direct_run(&pool, &[2; 8]),
                at: 0,
            },
        ];
        give_back(&pool, runs);
        assert_eq!(pool.lock().len(), 2);
    }
}
