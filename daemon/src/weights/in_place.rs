//! Dense matrices computed where the shard's memory map holds them, with no copy of their own.
//!
//! A converted container stores its dense matrices in the format the kernels compute (int8 or
//! int4 rows, their f32 scales apart), so a matrix needs no buffer of its own: it reads the
//! page cache's pages through the shard's map ([`ShardSet::in_place`]). The copy the loader
//! made before (`owned.rs`, `pread` into a fresh buffer) was most of the time to READY at
//! real shapes: every 4 KiB of it a new page the kernel had to fault in, zero and charge
//! before the copy filled it.
//!
//! Only a tensor whose bytes start on a 64-byte boundary of its file ([`IN_PLACE_ALIGN`]; the
//! map starts on a page) is read in place: decode-shaped int8 products over rows 8 bytes off
//! such a boundary measured 4-11% slower in place than over the copy's buffer (GLM-4.5-Air's
//! and DeepSeek-V3's dense matrices, alternated in one process), at parity when aligned. A
//! container's offsets follow its tensors' sizes, so about half of them are copied as before.
//!
//! What keeps the map as dependable as the copy was:
//! - Warm-up. [`ShardSet::warm_in_place`] maps every page of the matrices a forward reads
//!   whole once the load is done (`MADV_POPULATE_READ`, a few ranges at once so that a cold
//!   start keeps the disk's queue full), so the first token takes no faults and READY means
//!   what it did. The embedding, of which a token reads one row, is left to fault in by rows
//!   ([`Warm::ByRows`]).
//! - A file cut short under the daemon. Reading a mapped page past a file's new end is
//!   SIGBUS, which `sigbus` turns into a fatal error (that forward read zeros).
//!   [`ShardSet::check_in_place`], run before every forward, compares each file's length with
//!   the end of its farthest tensor read in place, so the request fails naming the file
//!   instead, and once the file is restored the pages read the restored bytes. Only a cut
//!   between the check and the read is left to `sigbus`, as for `--mmap`'s experts.
//! - RSS. The mapped pages count in RSS as the copies did, and `QMatrix::resident_bytes`
//!   counts them in the dense part that the RAM budget holds. Under memory pressure the
//!   kernel may drop some (clean file pages, where a copy would have stayed); a later forward
//!   reads them back: slower, the same bytes.
//! - Experts streamed through the page cache. When the routed experts are read buffered (or
//!   mapped) and do not all fit the budget, every token's reads fill new page-cache pages and
//!   the kernel takes back the oldest, the dense pages among them: DeepSeek-V3's shapes (8
//!   layers, 19 GB, a 10 GB budget, 14 GB of experts read buffered) decoded warm at 2.23
//!   tok/s with its dense part in place against 3.02 with it copied, its lm_head's time twice
//!   as long. The engine then calls [`ShardSet::copy_dense`] before the dense part loads
//!   (`IoChoice::keeps_dense_pages` decides), and every matrix is copied as before.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::owned::{CHUNK, READERS};
use super::{MappedTensor, Shard, ShardSet, WeightsError};

/// The file offset a tensor's bytes must be a multiple of to be read in place (see the
/// module's comment).
pub const IN_PLACE_ALIGN: u64 = 64;

/// When the pages of a tensor read in place are mapped into the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Warm {
    /// All of them, by [`ShardSet::warm_in_place`]: a matrix every forward reads whole.
    Whole,
    /// As its rows are read (the embedding: one row a token).
    ByRows,
}

/// A tensor handed out by [`ShardSet::in_place`], while it lives.
#[derive(Debug)]
pub(super) struct Kept {
    tensor: Weak<MappedTensor>,
    warm: Warm,
}

impl ShardSet {
    /// From now on the loader copies every matrix instead of reading it in place: the page
    /// cache will not keep the dense pages (see the module's comment). Matrices handed out
    /// before keep their maps.
    pub fn copy_dense(&self) {
        self.copy_dense.store(true, Ordering::Relaxed);
    }

    /// Whether a matrix stored as computed may be read in place ([`ShardSet::in_place`]):
    /// true until [`ShardSet::copy_dense`].
    pub fn in_place_allowed(&self) -> bool {
        !self.copy_dense.load(Ordering::Relaxed)
    }

    /// Tensor `name` in place in its shard's map, for a matrix computed on it directly (see
    /// the module's comment). No page is touched here: [`ShardSet::warm_in_place`] maps them
    /// once the load is done ([`Warm::Whole`]), or the products do as they read
    /// ([`Warm::ByRows`]).
    pub fn in_place(&self, name: &str, warm: Warm) -> Result<Arc<MappedTensor>, WeightsError> {
        debug_assert!(
            self.in_place_allowed(),
            "{name} asked in place after copy_dense"
        );
        let t = Arc::new(self.unpopulated(name)?);
        let end = (t.start + t.len) as u64;
        t.shard.in_place_end.fetch_max(end, Ordering::Relaxed);
        self.in_place
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Kept {
                tensor: Arc::downgrade(&t),
                warm,
            });
        Ok(t)
    }

    /// Maps every page of the live [`Warm::Whole`] tensors read in place now, several ranges
    /// at once, and returns their bytes (a range two tensors share counted once). Run once
    /// the load is done and the pages it touched are released (`release_mapped_pages` lets
    /// go of these too). A read error (a disk failing under a cold start) is an error naming
    /// the file, here rather than SIGBUS in a forward. Unless `COLI_HUGEPAGES=0`, their whole
    /// 2 MiB extents are advised huge first, so that what this reads from disk comes in 2 MiB
    /// pages (`in_place_huge`).
    pub fn warm_in_place(&self) -> Result<u64, WeightsError> {
        // Held through the pass, so nothing is unmapped under it.
        let live = self.live_whole();
        // In file order, so that a cold start reads each shard front to back.
        let sorted = in_file_order(&live);
        if crate::quant::hugepages::enabled() {
            for (shard, at, len) in super::in_place_huge::extents(&sorted) {
                // A hint: a refusal leaves 4 KiB pages.
                let _ = shard.map.advise_huge(at, len);
            }
        }
        let ranges: Vec<(&Shard, usize, usize)> =
            sorted.iter().map(|t| (&*t.shard, t.start, t.len)).collect();
        populate(&ranges)?;
        Ok(ranges.iter().map(|&(_, _, n)| n as u64).sum())
    }

    /// The live [`Warm::Whole`] tensors read in place (the dropped ones forgotten).
    pub(super) fn live_whole(&self) -> Vec<Arc<MappedTensor>> {
        let mut kept = self.in_place.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|k| k.tensor.strong_count() > 0);
        kept.iter()
            .filter(|k| k.warm == Warm::Whole)
            .filter_map(|k| k.tensor.upgrade())
            .collect()
    }

    /// Whether every shard is still as long as the tensors read in place from it need (see
    /// the module's comment): an error naming the first file that is now shorter. One
    /// `fstat` per shard that has such a tensor; allocates only for the error.
    pub fn check_in_place(&self) -> Result<(), WeightsError> {
        for s in &self.shards {
            let need = s.in_place_end.load(Ordering::Relaxed);
            if need == 0 {
                continue;
            }
            let size = s
                .file
                .metadata()
                .map_err(|source| WeightsError::Io {
                    path: s.path.clone(),
                    source,
                })?
                .len();
            if size < need {
                let why = format!(
                    "the file is {size} bytes now, shorter than the dense weights read in \
                     place from it need ({need}): cut short under the daemon? Restore it"
                );
                return Err(WeightsError::Read {
                    file: s.path.clone(),
                    offset: size,
                    len: (need - size) as usize,
                    source: std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why),
                });
            }
        }
        Ok(())
    }
}

/// `live` in file order, a range two tensors share once (a tied embedding and lm_head are the
/// same bytes, mapped once).
pub(super) fn in_file_order(live: &[Arc<MappedTensor>]) -> Vec<&MappedTensor> {
    let mut sorted: Vec<&MappedTensor> = live.iter().map(|t| &**t).collect();
    sorted.sort_by_key(|t| (t.file, t.start, t.len));
    sorted.dedup_by_key(|t| (t.file, t.start, t.len));
    sorted
}

/// Maps every page of `ranges` (shard, offset, bytes) into the process, in pieces of
/// [`CHUNK`] shared out to [`READERS`] threads (a cold start keeps the disk's queue full). The
/// first read error is returned naming its file; the other threads stop at their next piece.
pub(super) fn populate(ranges: &[(&Shard, usize, usize)]) -> Result<(), WeightsError> {
    let mut pieces: Vec<(&Shard, usize, usize)> = Vec::new();
    for &(shard, start, len) in ranges {
        let mut at = 0;
        while at < len {
            let n = CHUNK.min(len - at);
            pieces.push((shard, start + at, n));
            at += n;
        }
    }
    let next = AtomicUsize::new(0);
    let first_error = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..READERS.min(pieces.len()) {
            s.spawn(|| loop {
                let Some(&(shard, at, len)) = pieces.get(next.fetch_add(1, Ordering::Relaxed))
                else {
                    return;
                };
                if let Err(source) = shard.map.populate(at, len) {
                    let e = WeightsError::Read {
                        file: shard.path.clone(),
                        offset: at as u64,
                        len,
                        source,
                    };
                    first_error
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .get_or_insert(e);
                    next.store(pieces.len(), Ordering::Relaxed);
                    return;
                }
            });
        }
    });
    match first_error
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner)
    {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::FileExt;
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::quant::SharedBytes;
    use crate::weights::writer::SafetensorsWriter;
    use crate::weights::Dtype;

    fn model_dir(tag: &str, tensors: &[(&str, &[u8])]) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("colibri-in-place-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut w = SafetensorsWriter::new();
        for (name, bytes) in tensors {
            w.add(name, Dtype::U8, &[bytes.len()], bytes.to_vec());
        }
        w.write(&dir.join("m.safetensors")).unwrap();
        dir
    }

    fn pattern(n: usize, k: usize) -> Vec<u8> {
        (0..n).map(|i| (i * k + i / 4093) as u8).collect()
    }

    /// The bytes read in place are the file's, as `pread` copies them; the warm-up maps the
    /// live `Whole` tensors (a range two of them share once) and skips `ByRows` ones and the
    /// dropped.
    #[test]
    fn in_place_bytes_are_the_files_and_warm_up_counts_the_live_whole_ones() {
        let big = pattern(CHUNK * 2 + 12_345, 7);
        let small = pattern(1000, 13);
        let embed = pattern(50_000, 3);
        let dir = model_dir(
            "bytes",
            &[("big", &big), ("small", &small), ("embed", &embed)],
        );
        let set = ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        let a = set.in_place("big", Warm::Whole).unwrap();
        let a2 = set.in_place("big", Warm::Whole).unwrap();
        let b = set.in_place("small", Warm::Whole).unwrap();
        let e = set.in_place("embed", Warm::ByRows).unwrap();
        for (t, name, want) in [
            (&a, "big", &big),
            (&b, "small", &small),
            (&e, "embed", &embed),
        ] {
            assert!(t.bytes() == want.as_slice(), "{name}");
            assert!(
                t.bytes() == set.read_owned(name).unwrap().as_slice(),
                "{name}"
            );
        }
        assert_eq!(
            set.warm_in_place().unwrap(),
            (big.len() + small.len()) as u64
        );
        drop(b);
        assert_eq!(set.warm_in_place().unwrap(), big.len() as u64);
        drop((a, a2));
        assert_eq!(set.warm_in_place().unwrap(), 0);
        assert!(e.bytes() == embed.as_slice());
        assert!(matches!(
            set.in_place("absent", Warm::Whole),
            Err(WeightsError::Missing { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn shard_of(dir: &Path) -> PathBuf {
        dir.join("m.safetensors")
    }

    /// A file cut short under a tensor read in place is refused by the check, naming it, with
    /// nothing read from the cut pages; restored, the check passes and the tensor reads the
    /// restored bytes. A set with nothing in place checks nothing.
    #[test]
    fn a_file_cut_short_fails_the_check_and_passes_it_once_restored() {
        let head = pattern(70_000, 5);
        let tail = pattern(30_000, 11);
        let dir = model_dir("cut", &[("a_head", &head), ("b_tail", &tail)]);
        let path = shard_of(&dir);
        let whole = std::fs::read(&path).unwrap();
        let set = ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        set.check_in_place().unwrap();
        // Both in place: the farthest ends the file, whichever order the writer chose.
        let h = set.in_place("a_head", Warm::Whole).unwrap();
        let t = set.in_place("b_tail", Warm::ByRows).unwrap();
        set.warm_in_place().unwrap();
        set.check_in_place().unwrap();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(whole.len() as u64 / 2).unwrap();
        let err = set.check_in_place().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, WeightsError::Read { .. }), "{text}");
        assert!(text.contains("m.safetensors: reading "), "{text}");
        assert!(text.contains("shorter than"), "{text}");
        f.write_all_at(&whole, 0).unwrap();
        set.check_in_place().unwrap();
        assert!(h.bytes() == head.as_slice());
        assert!(t.bytes() == tail.as_slice());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
