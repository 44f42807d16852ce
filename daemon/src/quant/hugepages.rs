//! Weights in 2 MiB pages: the resident anonymous memory of the process (the dense matrices
//! and the experts in RAM, once loaded) handed to the kernel to remap in transparent huge
//! pages (`MADV_COLLAPSE`, Linux 6.1+).
//!
//! Why: a decode step streams hundreds of megabytes of weights held in 4 KiB pages, one TLB
//! miss every 4 KiB, and in a virtual machine each miss walks two page tables. The medium
//! model's MoE layer at decode (`cargo bench --bench kernels -- moe pages`) ran 1.3-2x as fast
//! with its weights in 2 MiB pages as in 4 KiB ones, same bytes, same order, same process.
//! The allocations that hold the weights are ordinary heap buffers (the system sets
//! transparent huge pages to `madvise`, so none are huge by default), and they are many and
//! small (a 786 KB expert matrix), so instead of allocating them differently this remaps
//! what is already resident, 2 MiB at a time, where a whole aligned 2 MiB lies in one mapping.
//!
//! Only contents-preserving advice is given, only for extents whose every page is resident
//! (so the process's resident size does not grow), and every refusal (an older kernel, huge
//! pages off, memory too fragmented) leaves the pages as they were: a hint, never an error.

/// What [`collapse_resident`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Collapsed {
    /// Whole resident 2 MiB extents asked for.
    pub asked: usize,
    /// Of those, extents now in one huge page.
    pub huge: usize,
}

impl Collapsed {
    /// Bytes in extents now in huge pages.
    pub fn huge_bytes(&self) -> usize {
        self.huge * HUGE
    }
}

/// [`collapse_resident`], unless `COLI_HUGEPAGES=0` turns it off (a same-binary A/B, or a
/// host where the copy it costs is not wanted): `None` when off.
pub fn remap_weights() -> Option<Collapsed> {
    enabled().then(collapse_resident)
}

/// Whether weights are remapped in huge pages (`COLI_HUGEPAGES=0` turns it off).
pub fn enabled() -> bool {
    !std::env::var("COLI_HUGEPAGES").is_ok_and(|v| v.trim() == "0")
}

/// Asks that the whole 2 MiB extents of `len` bytes at `ptr` get huge pages when first
/// touched (`MADV_HUGEPAGE`), unless [`enabled`] says no: for a buffer written after this
/// call that must be measured in the page size the weights are held in, such as the memory
/// probe's (a limit read in 4 KiB pages would sit below what the decode step can reach in
/// 2 MiB ones). A refusal leaves 4 KiB pages; a no-op off Linux.
pub fn advise_huge(ptr: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    if enabled() {
        let start = (ptr as usize).next_multiple_of(HUGE);
        let end = (ptr as usize + len) / HUGE * HUGE;
        if end > start {
            // SAFETY: `start..end` lies inside the caller's allocation of `len` bytes at `ptr`
            // and is 2 MiB (so page) aligned; MADV_HUGEPAGE changes no byte, only the page
            // size of the range's later faults.
            unsafe { nix::libc::madvise(start as *mut _, end - start, nix::libc::MADV_HUGEPAGE) };
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (ptr, len);
}

/// Runs [`remap_weights`] now and then every `period` (`None`: once) on one background
/// thread of the process (started by the first call; a later call only wakes it for a pass
/// now): memory is the process's, not an engine's, and experts loaded after the first pass
/// (the LRU filling as requests route) get their huge pages at the next. A pass over memory already remapped
/// costs a `mincore` and an `madvise` a 2 MiB extent (milliseconds a GB). `log` receives
/// each pass that remapped something new. A thread that cannot start leaves 4 KiB pages:
/// slower, not wrong.
pub fn remap_in_background(
    period: Option<std::time::Duration>,
    log: fn(Collapsed, std::time::Duration),
) {
    use std::sync::OnceLock;
    static WORKER: OnceLock<Option<std::thread::Thread>> = OnceLock::new();
    let mut started = false;
    let worker = WORKER.get_or_init(|| {
        started = true;
        std::thread::Builder::new()
            .name("colibri-hugepages".into())
            .spawn(move || {
                let mut last = 0;
                loop {
                    let t = std::time::Instant::now();
                    if let Some(done) = remap_weights() {
                        if done.huge != last {
                            log(done, t.elapsed());
                        }
                        last = done.huge;
                    }
                    match period {
                        Some(period) => std::thread::park_timeout(period),
                        None => std::thread::park(),
                    }
                }
            })
            .ok()
            .map(|h| h.thread().clone())
    });
    if let Some(w) = worker.as_ref().filter(|_| !started) {
        w.unpark();
    }
}

/// A transparent huge page on x86-64 and arm64 with 4 KiB base pages.
const HUGE: usize = 2 << 20;

/// An anonymous private read-write mapping of `/proc/self/maps`: `(start, end)`, or `None` for
/// any other line (files, stacks, guard pages, the vDSO).
fn anonymous_rw(line: &str) -> Option<(usize, usize)> {
    let mut f = line.split_whitespace();
    let range = f.next()?;
    let perms = f.next()?;
    let _offset = f.next()?;
    let _dev = f.next()?;
    let inode = f.next()?;
    let path = f.next();
    if !perms.starts_with("rw") || !perms.ends_with('p') || inode != "0" {
        return None;
    }
    if !matches!(path, None | Some("[heap]")) {
        return None;
    }
    let (a, b) = range.split_once('-')?;
    let (a, b) = (
        usize::from_str_radix(a, 16).ok()?,
        usize::from_str_radix(b, 16).ok()?,
    );
    (a < b).then_some((a, b))
}

/// The whole 2 MiB-aligned extents inside `start..end`, as their first addresses.
fn aligned_extents(start: usize, end: usize) -> impl Iterator<Item = usize> {
    let first = start.next_multiple_of(HUGE);
    let last = end & !(HUGE - 1);
    (first..last.max(first)).step_by(HUGE)
}

/// Remaps every whole 2 MiB extent of the process's anonymous memory whose pages are all
/// resident into one huge page each (see the module docs). Safe to call at any time and from
/// any thread: it changes no byte, and memory another thread frees or maps meanwhile only
/// makes a call for that extent fail. Costs a copy of the memory it remaps (about 0.1 s a
/// GB); a no-op off Linux.
pub fn collapse_resident() -> Collapsed {
    #[cfg(target_os = "linux")]
    {
        let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
            return Collapsed::default();
        };
        let mut done = Collapsed::default();
        let mut resident = [0u8; HUGE / 4096];
        for (start, end) in maps.lines().filter_map(anonymous_rw) {
            for at in aligned_extents(start, end) {
                if !all_resident(at, &mut resident) {
                    continue;
                }
                done.asked += 1;
                if collapse(at) {
                    done.huge += 1;
                }
            }
        }
        done
    }
    #[cfg(not(target_os = "linux"))]
    Collapsed::default()
}

/// Whether every 4 KiB page of the extent at `at` is resident (`mincore`).
#[cfg(target_os = "linux")]
fn all_resident(at: usize, vec: &mut [u8; HUGE / 4096]) -> bool {
    // SAFETY: `mincore` only reads the page tables of `at..at + HUGE` (a page-aligned range)
    // and writes one byte a page into `vec`, which has exactly one byte for each of its 4 KiB
    // pages. A range no longer mapped makes it fail (ENOMEM), counted as not resident.
    let rc = unsafe { nix::libc::mincore(at as *mut _, HUGE, vec.as_mut_ptr()) };
    rc == 0 && vec.iter().all(|&b| b & 1 == 1)
}

/// `MADV_COLLAPSE` of the extent at `at`: whether it is now one huge page.
#[cfg(target_os = "linux")]
fn collapse(at: usize) -> bool {
    // Linux's value on every architecture (include/uapi/asm-generic/mman-common.h); the libc
    // crate defines it for glibc targets only.
    const MADV_COLLAPSE: nix::libc::c_int = 25;
    // SAFETY: MADV_COLLAPSE copies the extent's pages into a huge page and maps that in their
    // place with the same contents and protections, atomically for any other thread reading
    // or writing them (the kernel holds the pages locked while it copies), so no byte any
    // reference in this process sees changes. An extent unmapped meanwhile fails (ENOMEM); an
    // extent mapped anew by another owner in between only gets the same contents-preserving
    // remap.
    unsafe { nix::libc::madvise(at as *mut _, HUGE, MADV_COLLAPSE) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_keep_anonymous_read_write_private_memory_only() {
        let heap = "55d0c0a00000-55d0c0e00000 rw-p 00000000 00:00 0    [heap]";
        let anon = "7f00000000-7f00400000 rw-p 00000000 00:00 0 ";
        assert_eq!(anonymous_rw(heap), Some((0x55d0c0a00000, 0x55d0c0e00000)));
        assert_eq!(anonymous_rw(anon), Some((0x7f00000000, 0x7f00400000)));
        for other in [
            "7f00000000-7f00400000 r--p 00000000 08:01 1234 /usr/lib/libc.so.6",
            "7f00000000-7f00400000 rw-p 00001000 08:01 1234 /usr/lib/libc.so.6",
            "7f00000000-7f00400000 rw-s 00000000 00:01 77 /dev/shm/x",
            "7f00000000-7f00400000 ---p 00000000 00:00 0 ",
            "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]",
            "garbage",
            "",
        ] {
            assert_eq!(anonymous_rw(other), None, "{other}");
        }
    }

    #[test]
    fn extents_are_the_whole_aligned_ones_inside() {
        let m = HUGE;
        let got: Vec<usize> = aligned_extents(m + 4096, 4 * m + 4096).collect();
        assert_eq!(got, [2 * m, 3 * m]);
        assert_eq!(aligned_extents(m, 3 * m).collect::<Vec<_>>(), [m, 2 * m]);
        assert_eq!(aligned_extents(m + 1, 2 * m + 5).count(), 0);
        assert_eq!(aligned_extents(m + 4096, m + 8192).count(), 0);
    }

    /// A resident buffer keeps every byte through the remap, and on a kernel that does it
    /// (Linux 6.1+ with huge pages not `never`) at least one of its whole extents becomes a
    /// huge page. Where the kernel refuses, nothing was asked that changed anything.
    #[test]
    fn collapse_keeps_every_byte() {
        let len = 8 * HUGE;
        let buf: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let done = collapse_resident();
        assert!(done.huge <= done.asked);
        assert!(buf
            .iter()
            .enumerate()
            .all(|(i, &b)| b == (i * 31 % 251) as u8));
        #[cfg(target_os = "linux")]
        {
            let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
            let on = thp.is_ok_and(|s| !s.contains("[never]"));
            let start = buf.as_ptr() as usize;
            let whole = aligned_extents(start, start + len).count();
            // The buffer's own extents were resident (just written), so they were asked for.
            assert!(
                whole >= 3 && done.asked >= whole,
                "{done:?}, {whole} extents"
            );
            if on && done.huge == 0 {
                eprintln!("MADV_COLLAPSE refused every extent (older kernel?): {done:?}");
            }
        }
    }
}
