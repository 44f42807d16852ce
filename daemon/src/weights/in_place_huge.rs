//! The dense matrices read in place (`in_place.rs`) in 2 MiB pages.
//!
//! Why: a decode step reads every dense matrix whole, and in 4 KiB pages that is a TLB miss
//! every 4 KiB (two page-table walks each in a virtual machine). The anonymous weights get
//! their huge pages from `quant::hugepages`' remap, but `MADV_COLLAPSE` refuses a file's
//! pages on kernels built without `CONFIG_READ_ONLY_THP_FOR_FS` (EINVAL; this project's VM,
//! Linux 6.18). What works there is the page cache's own large folios: a file system that
//! caches files in them (ext4 since Linux 6.16, xfs, btrfs) has the kernel map a 2 MiB folio
//! with one page-table entry at fault, where the map's address agrees with the file offset
//! modulo 2 MiB (a shard's map starts 2 MiB-aligned and covers the file from offset 0).
//!
//! Whether a cached folio is 2 MiB depends on how its pages came into the cache, and it stays
//! so while cached: a write of megabytes, or a read through a mapping advised
//! `MADV_HUGEPAGE` (the fault's readahead then allocates 2 MiB folios), gives 2 MiB ones;
//! small reads (a `pread` in pieces, readahead's first windows) give smaller ones. Measured on
//! the VM (64 MiB file, `MADV_POPULATE_READ` of its map): cold and advised 64 MiB of it in
//! 2 MiB pages; cold, not advised, 32; cached by a `pread` first, 24; written in 16 MiB
//! pieces, 64; in 1 MiB or 64 KiB pieces, 0.
//!
//! So [`ShardSet::warm_in_place`] advises the whole 2 MiB extents of the tensors read in
//! place before it maps them, and [`ShardSet::huge_in_place`] then counts what of them is
//! mapped in 2 MiB pages (`/proc/self/smaps`) and drops from the page cache and maps again the
//! ranges that are not (read back from disk, into 2 MiB folios): disk time at the start, once,
//! since the folios stay 2 MiB while cached. It stops after a range that does not come back
//! in 2 MiB pages (a file system or kernel that cannot). `COLI_HUGEPAGES=0` turns both off.

use super::in_place::{in_file_order, populate};
use super::{MappedTensor, Shard, ShardSet, WeightsError};

/// A transparent huge page on x86-64 and arm64 with 4 KiB base pages.
const HUGE: usize = 2 << 20;

/// What [`ShardSet::huge_in_place`] found and did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HugeInPlace {
    /// Bytes of the whole 2 MiB extents of the tensors read in place (what can be huge).
    pub extents: u64,
    /// Of those, mapped in 2 MiB pages now.
    pub huge: u64,
    /// Bytes dropped from the page cache and read again to get them.
    pub reread: u64,
}

/// The ranges of `sorted` (tensors in file order) that can be in 2 MiB pages: tensors of one
/// file less than 2 MiB apart joined (the bytes between, a matrix's scales, are file pages as
/// well), then each joined range cut to the whole 2 MiB extents inside it. As (shard, offset,
/// bytes), in file order.
pub(super) fn extents<'a>(sorted: &[&'a MappedTensor]) -> Vec<(&'a Shard, usize, usize)> {
    let mut joined: Vec<(usize, &'a Shard, usize, usize)> = Vec::new();
    for t in sorted {
        let end = t.start + t.len;
        match joined.last_mut() {
            Some((file, _, _, e)) if *file == t.file && t.start < *e + HUGE => *e = (*e).max(end),
            _ => joined.push((t.file, &*t.shard, t.start, end)),
        }
    }
    joined
        .into_iter()
        .filter_map(|(_, shard, start, end)| {
            let (a, b) = (start.next_multiple_of(HUGE), end / HUGE * HUGE);
            (b > a).then_some((shard, a, b - a))
        })
        .collect()
}

/// The mappings of a `/proc/PID/smaps` text: (start, end, bytes mapped in 2 MiB pages of a
/// file, its `FilePmdMapped`), in the text's order.
fn file_pmd_mapped(smaps: &str) -> Vec<(usize, usize, u64)> {
    let mut out = Vec::new();
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if first == "FilePmdMapped:" {
            let kb = words
                .next()
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0);
            if let Some(last) = out.last_mut() {
                let (_, _, pmd): &mut (usize, usize, u64) = last;
                *pmd = kb * 1024;
            }
        } else if let Some((a, b)) = first.split_once('-') {
            // A mapping's first line: "start-end perms offset dev inode [path]".
            if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                out.push((a, b, 0));
            }
        }
    }
    out
}

/// Bytes of `start..end` mapped in 2 MiB pages: each mapping's count, capped at its overlap
/// with the range (the advice splits the map at the ranges' edges, so a mapping lies inside a
/// range or outside it unless the advice was refused).
fn pmd_in(mappings: &[(usize, usize, u64)], start: usize, end: usize) -> u64 {
    mappings
        .iter()
        .filter(|&&(a, b, _)| a < end && b > start)
        .map(|&(a, b, pmd)| pmd.min((b.min(end) - a.max(start)) as u64))
        .sum()
}

/// This process's mappings from its smaps (empty where unreadable: nothing counted).
fn own_mappings() -> Vec<(usize, usize, u64)> {
    std::fs::read_to_string("/proc/self/smaps")
        .map(|s| file_pmd_mapped(&s))
        .unwrap_or_default()
}

/// Drops `at..at + len` of `shard` from this process's map and then from the page cache
/// (clean pages nobody else maps; the rest stay), so that the next read of the map brings
/// them back from disk in the folios its advice asks for. Best effort.
fn drop_cached(shard: &Shard, at: usize, len: usize) {
    let _ = shard.map.release_range(at, len);
    // Advisory only: a refusal changes nothing but the page cache.
    let _ = nix::fcntl::posix_fadvise(
        std::os::fd::AsRawFd::as_raw_fd(&shard.file),
        at as i64,
        len as i64,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    );
}

impl ShardSet {
    /// Counts what of the live tensors read in place ([`super::Warm::Whole`]) is mapped in
    /// 2 MiB pages and, unless `COLI_HUGEPAGES=0`, reads the ranges that are not again so
    /// that they are (see the module's comment). Run after [`ShardSet::warm_in_place`]. A read
    /// error is an error naming the file, as the warm-up's.
    pub fn huge_in_place(&self) -> Result<HugeInPlace, WeightsError> {
        let live = self.live_whole();
        let ranges = extents(&in_file_order(&live));
        let addr = |shard: &Shard, at: usize| shard.map.bytes().as_ptr() as usize + at;
        let mut done = HugeInPlace {
            extents: ranges.iter().map(|&(_, _, n)| n as u64).sum(),
            ..HugeInPlace::default()
        };
        if ranges.is_empty() {
            return Ok(done);
        }
        let mappings = own_mappings();
        let mut lacking = Vec::new();
        for &(shard, at, len) in &ranges {
            let a = addr(shard, at);
            let pmd = pmd_in(&mappings, a, a + len);
            done.huge += pmd;
            // A map the kernel placed off 2 MiB cannot hold a 2 MiB page at any offset.
            if pmd < len as u64 && a % HUGE == 0 {
                lacking.push((shard, at, len, pmd));
            }
        }
        if lacking.is_empty() || !crate::quant::hugepages::enabled() {
            return Ok(done);
        }
        // One range first: where it does not come back in 2 MiB pages, nothing will.
        let reread = |batch: &[(&Shard, usize, usize, u64)]| -> Result<u64, WeightsError> {
            for &(shard, at, len, _) in batch {
                drop_cached(shard, at, len);
            }
            let refs: Vec<(&Shard, usize, usize)> =
                batch.iter().map(|&(s, at, len, _)| (s, at, len)).collect();
            populate(&refs)?;
            Ok(batch.iter().map(|&(_, _, len, _)| len as u64).sum())
        };
        let (trial, rest) = lacking.split_at(1);
        done.reread += reread(trial)?;
        let (shard, at, len, before) = trial[0];
        let a = addr(shard, at);
        if pmd_in(&own_mappings(), a, a + len) > before {
            done.reread += reread(rest)?;
        }
        let mappings = own_mappings();
        done.huge = ranges
            .iter()
            .map(|&(shard, at, len)| {
                let a = addr(shard, at);
                pmd_in(&mappings, a, a + len)
            })
            .sum();
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;
    use crate::quant::SharedBytes;
    use crate::weights::Warm;

    #[test]
    fn smaps_mappings_carry_their_file_pmd_bytes() {
        let text = "\
7f0000000000-7f0000400000 r--s 00000000 fd:01 123 /m/out.safetensors
Size:               4096 kB
FilePmdMapped:      2048 kB
Rss:                4096 kB
7f0000400000-7f0000600000 r--s 00400000 fd:01 123 /m/out.safetensors
Size:               2048 kB
FilePmdMapped:         0 kB
VmFlags: rd sh mr mw me ms hg
garbage line
";
        let m = file_pmd_mapped(text);
        assert_eq!(
            m,
            [
                (0x7f00_0000_0000, 0x7f00_0040_0000, 2 << 20),
                (0x7f00_0040_0000, 0x7f00_0060_0000, 0)
            ]
        );
        // Inside, across both, and a range only partly covering the first (capped).
        assert_eq!(pmd_in(&m, 0x7f00_0000_0000, 0x7f00_0040_0000), 2 << 20);
        assert_eq!(pmd_in(&m, 0x7f00_0000_0000, 0x7f00_0060_0000), 2 << 20);
        assert_eq!(pmd_in(&m, 0x7f00_0030_0000, 0x7f00_0040_0000), 1 << 20);
        assert_eq!(pmd_in(&m, 0x7f00_0060_0000, 0x7f00_0080_0000), 0);
    }

    /// Whether this machine is one where a file's pages are expected in 2 MiB pages: Linux
    /// 6.16 or later (ext4's large folios), transparent huge pages not `never`, `dir` on ext4.
    fn file_huge_pages_expected(dir: &std::path::Path) -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .is_ok_and(|s| !s.contains("[never]"));
        let ext4 = nix::sys::statfs::statfs(dir)
            .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::EXT4_SUPER_MAGIC);
        (major, minor) >= (6, 16) && thp && ext4 && crate::quant::hugepages::enabled()
    }

    /// A tensor whose pages the page cache holds in small folios (the file written 64 KiB at a
    /// time) is read again into 2 MiB pages, every byte the file's; a second pass finds it so
    /// and reads nothing. Asserted where the kernel and file system can (see above).
    #[test]
    fn a_tensor_cached_in_small_folios_is_read_again_into_huge_pages() {
        let dir = std::env::temp_dir().join(format!("colibri-huge-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let len = 9 * HUGE + 12_345;
        let data: Vec<u8> = (0..len).map(|i| (i * 29 + i / 4099) as u8).collect();
        let mut w = crate::weights::writer::SafetensorsWriter::new();
        w.add("m", crate::weights::Dtype::U8, &[len], data.clone());
        let path = dir.join("m.safetensors");
        w.write(&path).unwrap();
        // Rewritten 64 KiB at a time and synced: the cache now holds small, clean folios.
        let whole = std::fs::read(&path).unwrap();
        let mut f = std::fs::File::create(&path).unwrap();
        for piece in whole.chunks(64 << 10) {
            f.write_all(piece).unwrap();
        }
        f.sync_all().unwrap();
        drop(f);
        let set = ShardSet::open(std::slice::from_ref(&dir)).unwrap();
        let t = set.in_place("m", Warm::Whole).unwrap();
        assert_eq!(set.warm_in_place().unwrap(), len as u64);
        let first = set.huge_in_place().unwrap();
        // The tensor's whole extents: 9 or 8 of them, by where the header ends.
        assert!(first.extents >= 8 * HUGE as u64, "{first:?}");
        assert!(first.huge <= first.extents, "{first:?}");
        assert!(t.bytes() == data.as_slice());
        if file_huge_pages_expected(&dir) {
            assert!(first.reread > 0, "{first:?}");
            assert_eq!(first.huge, first.extents, "{first:?}");
            let again = set.huge_in_place().unwrap();
            assert_eq!(again, HugeInPlace { reread: 0, ..first });
        } else {
            eprintln!("no 2 MiB file pages expected here: {first:?}");
        }
        drop(t);
        assert_eq!(set.huge_in_place().unwrap(), HugeInPlace::default());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
