//! The one place a shard file becomes a memory map.
//!
//! A map is only as sound as the file under it stays unchanged, so this module is the single
//! `unsafe` site for it, and its contract is written out below. Everything else in `weights`
//! works on the safe `&[u8]` this hands out.

#![deny(clippy::undocumented_unsafe_blocks)]

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;

use super::WeightsError;

/// A read-only, whole-file memory map of one safetensors shard.
#[derive(Debug)]
pub(crate) struct ShardMap {
    map: Mmap,
    /// The SIGBUS handler's slot covering this map (`sigbus`), released before the unmap.
    sigbus_slot: Option<usize>,
}

impl Drop for ShardMap {
    fn drop(&mut self) {
        if let Some(i) = self.sigbus_slot {
            super::sigbus::unregister(i);
        }
    }
}

impl ShardMap {
    /// Maps all `len` bytes of `file` (already opened read-only from `path`).
    ///
    /// `len` must be the file's size as just measured; a 0-byte file cannot be mapped and is
    /// refused with an error naming it.
    pub(crate) fn map(file: &File, path: &Path, len: u64) -> Result<ShardMap, WeightsError> {
        if len == 0 {
            return Err(WeightsError::Header {
                file: path.to_path_buf(),
                reason: "the file is empty (0 bytes)".into(),
            });
        }
        // SAFETY: a `Mmap` hands out `&[u8]` over the file's pages, which Rust assumes never
        // change while borrowed. The invariant is that nobody modifies or truncates the shard
        // while colibri has it mapped. Who guarantees it: the user (model files are not edited
        // while the engine runs); we open the file read-only and never write through the map.
        // Worst case if it is violated: bytes change under a live slice (wrong numbers, not
        // memory unsafety in practice), or, if the file is truncated, touching a page past the
        // new end raises SIGBUS: `sigbus` patches that page with zeros, and the engine turns
        // the fault into an error naming the file and exits 1 without saving what that
        // forward computed. That risk is why the expert store, which
        // touches most bytes and for longest, reads with `pread` (`ShardSet::read_at`) by
        // default and turns a truncation into an error instead; only `--mmap` (the user's
        // choice, documented as needing shards that stay whole) keeps experts over the map,
        // checking the file's length before each load. Suspect: some network filesystems do
        // not honour the no-modification belief as strictly as local ones.
        let map = unsafe { Mmap::map(file) }.map_err(|source| WeightsError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let sigbus_slot = super::sigbus::register(map.as_ptr() as usize, map.len(), path);
        Ok(ShardMap { map, sigbus_slot })
    }

    /// Drops this process's references to the map's pages (`MADV_DONTNEED`): RSS stops
    /// counting the file pages that loading touched, the page cache keeps them, and a later
    /// read of the map faults the same bytes back in.
    pub(crate) fn release_pages(&self) -> std::io::Result<()> {
        // SAFETY: DONTNEED is unchecked in memmap2 because on a private, written mapping it
        // throws the writes away. This map is read-only and file-backed, never written, so
        // the only effect is that the next access re-reads the file's (unchanged) bytes; no
        // `&[u8]` handed out sees different contents.
        unsafe {
            self.map
                .unchecked_advise(memmap2::UncheckedAdvice::DontNeed)
        }
    }

    /// As `release_pages`, for the pages overlapping `offset..offset + len`.
    pub(crate) fn release_range(&self, offset: usize, len: usize) -> std::io::Result<()> {
        // SAFETY: as in `release_pages`: a read-only file-backed map, never written.
        unsafe {
            self.map
                .unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, offset, len)
        }
    }

    /// Maps the pages of `offset..offset + len` into this process now, reading any the page
    /// cache lacks (`MADV_POPULATE_READ`; on kernels before 5.14, one read per page). An
    /// I/O error under the map comes back here as an error, not later as SIGBUS.
    pub(crate) fn populate(&self, offset: usize, len: usize) -> std::io::Result<()> {
        match self
            .map
            .advise_range(memmap2::Advice::PopulateRead, offset, len)
        {
            Err(e) if e.raw_os_error() == Some(nix::libc::EINVAL) => {
                // Older kernel: touch one byte a page instead (a fault each).
                let bytes = &self.map[offset..offset + len];
                let mut sum = 0u8;
                for b in bytes.iter().step_by(PAGE_STEP) {
                    sum = sum.wrapping_add(*b);
                }
                std::hint::black_box(sum);
                Ok(())
            }
            r => r,
        }
    }

    /// Asks that the pages of `offset..offset + len` come into the page cache in 2 MiB folios
    /// when a read through this map brings them (`MADV_HUGEPAGE`: the fault's readahead then
    /// allocates huge folios, which the kernel maps with one entry each): see
    /// `in_place_huge`. Changes no byte; a refusal leaves 4 KiB pages.
    pub(crate) fn advise_huge(&self, offset: usize, len: usize) -> std::io::Result<()> {
        #[cfg(target_os = "linux")]
        return self
            .map
            .advise_range(memmap2::Advice::HugePage, offset, len);
        #[cfg(not(target_os = "linux"))]
        {
            let _ = (offset, len);
            Ok(())
        }
    }

    /// The mapped bytes of the whole file.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// Stride of the touch loop on kernels without MADV_POPULATE_READ: the smallest page size
/// in use, so every page is touched whatever the real size.
const PAGE_STEP: usize = 4096;
