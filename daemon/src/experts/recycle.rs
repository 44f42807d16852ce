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
        None => vec![0u8; len],
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
