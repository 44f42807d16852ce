//! *ours*: the STAT suffix while the pilot reads experts ahead (`--pilot`):
//! ` prefetch_in_time=%llu prefetch_late=%llu prefetch_unused=%llu`, bytes since the daemon
//! started (a client diffs two STATs for a turn's share).
//!
//! Added the way upstream added its own optional suffix (`route.rs`): `key=value` fields after
//! the documented ones, which upstream's parsers and ours skip when they do not know them, and
//! present only while the pilot is on, so a daemon without it writes upstream's bytes.

use crate::num::parse_u64;

/// What the expert bytes the pilot read ahead became, cumulative. Every byte it read is in
/// exactly one of the three, so their sum is the bytes the pilot read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefetchBytes {
    /// Read ahead and complete when the layer asked: served from RAM, the read hidden.
    pub in_time: u64,
    /// Read ahead and still being read when the layer asked: the layer waited on the rest.
    pub late: u64,
    /// Read ahead and never asked for: read for nothing.
    pub unused: u64,
}

impl PrefetchBytes {
    /// Bytes the pilot read (the three kinds).
    pub fn read(&self) -> u64 {
        self.in_time + self.late + self.unused
    }

    /// Appends the suffix, leading space included.
    pub fn push_suffix(&self, s: &mut String) {
        s.push_str(&format!(
            " prefetch_in_time={} prefetch_late={} prefetch_unused={}",
            self.in_time, self.late, self.unused
        ));
    }

    /// The suffix from the `key=value` fields of a STAT line; `None` unless all three are
    /// there and whole numbers.
    pub fn parse<'a>(fields: impl Iterator<Item = &'a [u8]>) -> Option<PrefetchBytes> {
        let mut p = PrefetchBytes::default();
        let mut seen = 0u8;
        for f in fields {
            let Some(eq) = f.iter().position(|&b| b == b'=') else {
                continue;
            };
            let (k, v) = (&f[..eq], &f[eq + 1..]);
            let (slot, bit) = match k {
                b"prefetch_in_time" => (&mut p.in_time, 1),
                b"prefetch_late" => (&mut p.late, 2),
                b"prefetch_unused" => (&mut p.unused, 4),
                _ => continue,
            };
            *slot = parse_u64(v)?;
            seen |= bit;
        }
        (seen == 7).then_some(p)
    }
}

#[cfg(test)]
mod tests {
    use crate::{parse_stat_line, PrefetchBytes, RouteAgree, Stat};

    fn stat(prefetch: Option<PrefetchBytes>, route: Option<RouteAgree>) -> Stat {
        Stat {
            completion_tokens: 4,
            tok_per_s: 2.5,
            hit_pct: 75.0,
            rss_gb: 1.31,
            prompt: Some((9, false)),
            route,
            prefetch,
        }
    }

    #[test]
    fn the_suffix_follows_the_fields_and_parses_back() {
        let p = PrefetchBytes {
            in_time: 30_000_000,
            late: 7_500_000,
            unused: 0,
        };
        let s = stat(Some(p), None);
        let line = s.to_line();
        assert_eq!(
            line,
            "STAT 4 2.50 75.0 1.31 9 0 prefetch_in_time=30000000 prefetch_late=7500000 \
             prefetch_unused=0"
        );
        assert_eq!(parse_stat_line(line.as_bytes()), Some(s));
        assert_eq!(p.read(), 37_500_000);
        // Beside upstream's routing suffix, each parses on its own.
        let route = RouteAgree {
            swap_pct: 12.5,
            swaps: 3,
            slots: 24,
            agree_pct: 87.5,
            kl: 0.0421,
        };
        let both = stat(Some(p), Some(route));
        assert_eq!(parse_stat_line(both.to_line().as_bytes()), Some(both));
        // Without the pilot the line is upstream's.
        assert_eq!(stat(None, None).to_line(), "STAT 4 2.50 75.0 1.31 9 0");
    }

    #[test]
    fn an_incomplete_or_malformed_suffix_is_none() {
        for line in [
            "STAT 4 2.50 75.0 1.31 9 0 prefetch_in_time=1 prefetch_late=2",
            "STAT 4 2.50 75.0 1.31 9 0 prefetch_in_time=1 prefetch_late=2 prefetch_unused=-3",
            "STAT 4 2.50 75.0 1.31 9 0 prefetch_in_time=1 prefetch_late=2 prefetch_unused=x",
        ] {
            let s = parse_stat_line(line.as_bytes()).unwrap();
            assert_eq!(s.prefetch, None, "{line}");
            assert_eq!(s.prompt, Some((9, false)), "{line}");
        }
    }
}
