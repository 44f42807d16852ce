//! Tensors copied out of their shard into a buffer of their own: what the loader does with a
//! GGUF's blocks (`QMatrix::from_ggml` keeps a buffer). A converted container's dense
//! matrices are not copied: they are computed in place (`in_place.rs`).
//!
//! Copying a tensor out of the shard's memory map (`bytes(name).to_vec()`, as the loader did)
//! maps the file's pages into the process (a fault for every 16 pages, then tearing the
//! mapping down again) besides giving the new buffer zeroed pages of its own. Profiled on
//! GLM-4.5-Air's shapes (2.1 GB of int8 dense weights, page cache warm), that copy and its
//! faults were 88% of the time to READY, on one core. Here the buffer is filled with `pread`,
//! which copies from the page cache without mapping it, and a large tensor is read by a few
//! threads at once: a cold start keeps several reads in flight on the disk, a warm one copies
//! on every core. The bytes are the file's, exactly as the map shows them; and a shard cut
//! short under us is an error naming it, not a SIGBUS.
//!
//! Not transparent huge pages for the buffer (`MADV_HUGEPAGE`, tried): on this project's VM
//! the kernel spent 2.5-3.6 s of CPU zeroing 2.1 GB of fresh huge pages against 0.1 s for the
//! same bytes in 4 KiB pages, so the start took longer. Nor `MADV_POPULATE_WRITE` before each
//! read (tried): the same page count, no CPU time saved that the loaded machine could show.

use std::sync::Mutex;

use super::{ShardSet, WeightsError};

/// Bytes one `pread` (or one warm-up populate, `in_place.rs`) asks for: a tensor up to this
/// size is read whole, a larger one in pieces of this size, shared out to [`READERS`] threads.
pub(super) const CHUNK: usize = 16 << 20;
/// Threads reading one large tensor (or warming the tensors read in place): enough reads in
/// flight for a disk's queue when the page cache is cold (the disk probe's depth), and every
/// core of a small machine when it is warm.
pub(super) const READERS: usize = 4;

impl ShardSet {
    /// Tensor `name`'s stored bytes, read into a new buffer (see the module's comment): the
    /// same bytes as [`ShardSet::bytes`], without touching the map.
    pub fn read_owned(&self, name: &str) -> Result<Vec<u8>, WeightsError> {
        let info = self.info(name)?;
        let (file, offset) = (info.file, info.offset);
        let mut buf = vec![0u8; info.len as usize];
        if buf.len() <= CHUNK {
            self.read_at(file, offset, &mut buf)?;
            return Ok(buf);
        }
        let pieces = Mutex::new(buf.chunks_mut(CHUNK).enumerate());
        let first_error = Mutex::new(None);
        std::thread::scope(|s| {
            for _ in 0..READERS {
                s.spawn(|| loop {
                    // Taken under the lock, read outside it.
                    let next = pieces.lock().map(|mut p| p.next()).ok().flatten();
                    let Some((i, piece)) = next else { return };
                    let at = offset + (i * CHUNK) as u64;
                    if let Err(e) = self.read_at(file, at, piece) {
                        if let Ok(mut first) = first_error.lock() {
                            first.get_or_insert(e);
                        }
                        return;
                    }
                });
            }
        });
        match first_error.into_inner() {
            Ok(Some(e)) => Err(e),
            Ok(None) => Ok(buf),
            Err(poisoned) => Err(poisoned
                .into_inner()
                .expect("a reader panicked holding no error")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::writer::SafetensorsWriter;
    use crate::weights::Dtype;

    /// A tensor larger than a chunk (read by several threads, with a short last piece) and a
    /// small one come back exactly as the map holds them; a missing name is an error.
    #[test]
    fn read_owned_is_the_mapped_bytes() {
        let dir = std::env::temp_dir().join(format!("colibri-read-owned-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big: Vec<u8> = (0..CHUNK * 2 + 12_345)
            .map(|i| (i * 7 + i / 4093) as u8)
            .collect();
        let small: Vec<u8> = (0..1000).map(|i| (i * 13) as u8).collect();
        let mut w = SafetensorsWriter::new();
        w.add("big", Dtype::U8, &[big.len()], big.clone());
        w.add("small", Dtype::U8, &[small.len()], small.clone());
        w.write(&dir.join("m.safetensors")).unwrap();
        let set = ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        for (name, want) in [("big", &big), ("small", &small)] {
            let owned = set.read_owned(name).unwrap();
            assert!(owned == *want, "{name}");
            assert!(owned == set.bytes(name).unwrap(), "{name}");
        }
        assert!(matches!(
            set.read_owned("absent"),
            Err(WeightsError::Missing { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
