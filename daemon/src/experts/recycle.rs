//! Buffers of dropped experts, handed to the next loads: a load that reads into memory the
//! process already touched skips the page faults (and the kernel's zeroing) of fresh pages,
//! which cost about as much as reading the expert from the page cache.
//!
//! Bounded: at most [`MAX_BUFFERS`] buffers wait here (eight experts' gate, up and down), so
//! the pool stays inside the working set the RAM budget reserves for experts in flight.

use parking_lot::Mutex;

/// Buffers kept at most.
pub const MAX_BUFFERS: usize = 24;

static POOL: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// A buffer of `len` bytes for a read to fill, reusing a kept one whose capacity fits (at
/// most twice `len`, so a small request never holds a large buffer). A reused buffer still
/// holds an earlier expert's bytes, not zeros: zeroing it would cost a pass over memory the
/// read overwrites anyway, so the caller must overwrite every byte (or drop the buffer).
pub fn take(len: usize) -> Vec<u8> {
    let found = {
        let mut pool = POOL.lock();
        pool.iter()
            .position(|b| b.capacity() >= len && b.capacity() <= len.saturating_mul(2))
            .map(|i| pool.swap_remove(i))
    };
    match found {
        Some(mut b) => {
            // Only the part past the old length needs writing before it may be read.
            if b.len() >= len {
                b.truncate(len);
            } else {
                b.resize(len, 0);
            }
            b
        }
        None => {
            // Large zeroed allocations are fresh pages, not yet mapped.
            let mut b = vec![0u8; len];
            prefault(&mut b);
            b
        }
    }
}

/// Maps every page of `buf` in one call instead of one page fault per 4 KiB as the read first
/// writes it. On fresh memory those faults cost about as much as the read itself: 400 fresh
/// 2.37 MB buffers filled from the page cache took 0.54-0.63 s with faults, 0.35-0.38 s after
/// `MADV_POPULATE_WRITE` (Linux 5.14+; older kernels refuse it and fault as before).
fn prefault(buf: &mut [u8]) {
    const PAGE: usize = 4096;
    let start = buf.as_mut_ptr() as usize;
    let first = start.next_multiple_of(PAGE);
    let end = (start + buf.len()) & !(PAGE - 1);
    if end <= first {
        return;
    }
    // SAFETY: [first, end) lies inside `buf`, which is borrowed mutably here, so no other
    // reference sees it change; MADV_POPULATE_WRITE only maps its pages (zero-filled where
    // absent, contents kept where present) and changes no byte. A refusal is ignored.
    unsafe {
        nix::libc::madvise(
            first as *mut nix::libc::c_void,
            end - first,
            nix::libc::MADV_POPULATE_WRITE,
        );
    }
}

/// Keeps `buf` for a later [`take`] while there is room; drops it otherwise.
pub fn give(buf: Vec<u8>) {
    if buf.capacity() == 0 {
        return;
    }
    let mut pool = POOL.lock();
    if pool.len() < MAX_BUFFERS {
        pool.push(buf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_buffer_is_zeroed_and_whole() {
        // Prefaulting maps the pages; it must not leave anything but zeros in them.
        let b = take(3 * 1024 * 1024 + 123);
        assert_eq!(b.len(), 3 * 1024 * 1024 + 123);
        assert!(b.iter().all(|&x| x == 0));
    }

    #[test]
    fn a_given_buffer_comes_back_for_a_fitting_length_only() {
        // An odd size no expert of the test models has, as other tests share the pool.
        const N: usize = 1_234_567;
        let mut b = vec![7u8; N];
        b.truncate(N - 1000);
        let ptr = b.as_ptr();
        give(b);
        // Too large a buffer for a small request stays in the pool.
        let small = take(N / 3);
        assert_ne!(small.as_ptr(), ptr);
        let again = take(N - 10);
        assert_eq!(again.len(), N - 10);
        assert_eq!(again.as_ptr(), ptr, "the kept buffer was reused");
    }
}
