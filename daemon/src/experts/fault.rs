//! Test aid: injected failures of positional expert reads, set by `COLI_FAULT_READ`.
//!
//! `COLI_FAULT_READ=<n>:eio` fails the n-th positional expert read (1-based, counted over the
//! whole process, every shard) with EIO; `<n>:short` makes it come back short (half the bytes,
//! then end of file). `<n>:eio:<k>` / `<n>:short:<k>` fail k reads in a row from the n-th.
//! Only the `pread` paths count (buffered and O_DIRECT); `--io mmap` copies from the map and is
//! never failed. This exists so the tests can show what a failing disk does to a running
//! daemon; it is not a user setting.

use std::sync::atomic::{AtomicU64, Ordering};

pub const ENV: &str = "COLI_FAULT_READ";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    Eio,
    Short,
}

#[derive(Debug)]
pub struct ReadFault {
    first: u64,
    count: u64,
    kind: FaultKind,
    reads: AtomicU64,
}

impl ReadFault {
    /// The fault `COLI_FAULT_READ` asks for; a malformed value is refused with what is allowed.
    pub fn from_env() -> Result<Option<ReadFault>, String> {
        match std::env::var(ENV) {
            Ok(v) if !v.is_empty() => ReadFault::parse(&v).map(Some),
            _ => Ok(None),
        }
    }

    pub fn parse(v: &str) -> Result<ReadFault, String> {
        let bad = || format!("{ENV}={v:?}: expected <n>:eio|short[:<k>] with n, k >= 1");
        let mut it = v.split(':');
        let first: u64 = it.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
        let kind = match it.next() {
            Some("eio") => FaultKind::Eio,
            Some("short") => FaultKind::Short,
            _ => return Err(bad()),
        };
        let count: u64 = match it.next() {
            None => 1,
            Some(s) => s.parse().map_err(|_| bad())?,
        };
        if first == 0 || count == 0 || it.next().is_some() {
            return Err(bad());
        }
        Ok(ReadFault {
            first,
            count,
            kind,
            reads: AtomicU64::new(0),
        })
    }

    /// Counts one positional read; the fault to inject into it, if any.
    pub fn next_read(&self) -> Option<FaultKind> {
        let n = self.reads.fetch_add(1, Ordering::Relaxed) + 1;
        (n >= self.first && n - self.first < self.count).then_some(self.kind)
    }
}

/// The error an injected EIO returns.
pub fn eio() -> std::io::Error {
    std::io::Error::from_raw_os_error(nix::libc::EIO)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reads_and_fires_on_the_named_ones() {
        let f = ReadFault::parse("3:short:2").unwrap();
        let got: Vec<_> = (0..6).map(|_| f.next_read()).collect();
        let s = Some(FaultKind::Short);
        assert_eq!(got, [None, None, s, s, None, None]);
        let f = ReadFault::parse("1:eio").unwrap();
        assert_eq!(f.next_read(), Some(FaultKind::Eio));
        assert_eq!(f.next_read(), None);
        for bad in ["", "0:eio", "2", "2:bad", "2:eio:0", "x:eio", "2:eio:1:1"] {
            let e = ReadFault::parse(bad).unwrap_err();
            assert!(
                e.contains("COLI_FAULT_READ") && e.contains("<n>:eio|short"),
                "{e}"
            );
        }
        assert!(eio().to_string().contains("os error 5"));
    }
}
