//! The per-drive figures that may end a `DISKCLASS` line (*ours*, added after the line's first
//! form): ` drives <n>` then `n` groups `<reads> <bytes> <thread_s> <busy_s> <failed>`, drive 0
//! being the model's directories and drive 1 a `--mirror` copy. Parsers of the first form
//! stop after the warm class and so ignore this tail; this one reads a line without it as no
//! drives, and skips words after the last group (room for later fields).

use std::fmt::Write;

use crate::num::{parse_f64, parse_u64, push_fixed};

/// One drive's expert reads, cumulative since start.
#[derive(Clone, Debug, PartialEq)]
pub struct DriveFigures {
    /// Reads served (demand, prefetch and pinning alike).
    pub reads: u64,
    /// Bytes they returned.
    pub bytes: u64,
    /// Thread-seconds inside those reads (concurrent reads add up), `%.3f`.
    pub thread_s: f64,
    /// Wall seconds with at least one read in flight on the drive, `%.3f`.
    pub busy_s: f64,
    /// Reads that failed there (each retried on the other copy).
    pub failed: u64,
}

impl DriveFigures {
    /// The drive's delivered rate, GB/s over its busy wall time (0 before any).
    pub fn rate_gbs(&self) -> f64 {
        if self.busy_s > 0.0 {
            self.bytes as f64 / 1e9 / self.busy_s
        } else {
            0.0
        }
    }

    /// Reads in flight on average while the drive was busy (thread-seconds / busy seconds).
    pub fn queue_depth(&self) -> f64 {
        if self.busy_s > 0.0 {
            self.thread_s / self.busy_s
        } else {
            0.0
        }
    }
}

/// Appends ` drives <n> ...` (nothing for no drives, so such a line is the first form).
pub(crate) fn push_drives(s: &mut String, drives: &[DriveFigures]) {
    if drives.is_empty() {
        return;
    }
    // Writing to a String cannot fail.
    let _ = write!(s, " drives {}", drives.len());
    for d in drives {
        let _ = write!(s, " {} {} ", d.reads, d.bytes);
        push_fixed(s, d.thread_s, 3);
        s.push(' ');
        push_fixed(s, d.busy_s, 3);
        let _ = write!(s, " {}", d.failed);
    }
}

/// Reads the tail after the warm class: `None` (a malformed line) when `drives` is there but
/// its groups are not; no words, or a first word other than `drives`, is no drives.
pub(crate) fn parse_drives<'a>(
    mut word: impl FnMut() -> Option<&'a [u8]>,
) -> Option<Vec<DriveFigures>> {
    match word() {
        Some(b"drives") => {}
        _ => return Some(Vec::new()),
    }
    let n = parse_u64(word()?)?;
    // Grown as groups parse: a bogus count cannot allocate more than the line holds.
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(DriveFigures {
            reads: parse_u64(word()?)?,
            bytes: parse_u64(word()?)?,
            thread_s: parse_f64(word()?)?,
            busy_s: parse_f64(word()?)?,
            failed: parse_u64(word()?)?,
        });
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{parse_telemetry_line, DiskClass, DiskClassFigures, Telemetry};

    const OLD: &str = "DISKCLASS cold 120 2400000000 3.000 2.000 0 warm 30 600000000 0.500 0.400 0";

    fn class(count: u64) -> DiskClassFigures {
        DiskClassFigures {
            count,
            bytes: count * 1_000_000,
            thread_s: 1.5,
            busy_s: 0.75,
            direct: count / 2,
        }
    }

    #[test]
    fn drives_round_trip_and_extend_the_first_form() {
        let t = Telemetry::DiskClass(DiskClass {
            cold: class(10),
            warm: class(4),
            drives: vec![
                DriveFigures {
                    reads: 9,
                    bytes: 900_000_000,
                    thread_s: 1.25,
                    busy_s: 0.5,
                    failed: 0,
                },
                DriveFigures {
                    reads: 5,
                    bytes: 500_000_000,
                    thread_s: 0.25,
                    busy_s: 0.125,
                    failed: 2,
                },
            ],
        });
        let line = t.to_line();
        let first = "DISKCLASS cold 10 10000000 1.500 0.750 5 warm 4 4000000 1.500 0.750 2";
        assert_eq!(
            line,
            format!("{first} drives 2 9 900000000 1.250 0.500 0 5 500000000 0.250 0.125 2")
        );
        assert_eq!(parse_telemetry_line(line.as_bytes()), Some(t.clone()));
        // What a reader of the first form sees is the first form's figures, unchanged.
        let Some(Telemetry::DiskClass(d)) = parse_telemetry_line(line.as_bytes()) else {
            panic!("{line}")
        };
        assert_eq!((d.cold, d.warm), (class(10), class(4)));
        // Later words after the groups are skipped.
        let more = format!("{line} queue 3");
        assert_eq!(parse_telemetry_line(more.as_bytes()), Some(t));
        let Some(Telemetry::DiskClass(d)) = parse_telemetry_line(line.as_bytes()) else {
            unreachable!()
        };
        assert_eq!(d.drives[0].rate_gbs(), 1.8);
        assert_eq!(d.drives[0].queue_depth(), 2.5);
        assert_eq!(d.drives[1].rate_gbs(), 4.0);
    }

    #[test]
    fn a_line_of_the_first_form_has_no_drives_and_encodes_as_before() {
        let Some(t @ Telemetry::DiskClass(_)) = parse_telemetry_line(OLD.as_bytes()) else {
            panic!()
        };
        let Telemetry::DiskClass(d) = &t else {
            unreachable!()
        };
        assert!(d.drives.is_empty());
        assert_eq!(t.to_line(), OLD);
        let idle = DriveFigures {
            reads: 0,
            bytes: 0,
            thread_s: 0.0,
            busy_s: 0.0,
            failed: 0,
        };
        assert_eq!((idle.rate_gbs(), idle.queue_depth()), (0.0, 0.0));
    }

    #[test]
    fn a_malformed_drives_tail_is_a_malformed_line() {
        for tail in [
            " drives",
            " drives x",
            " drives 1 9 900 1.000 0.500",
            " drives 2 9 900 1.000 0.500 0",
            " drives 1 9 900 x 0.500 0",
            " drives 1 -9 900 1.000 0.500 0",
            " drives 18446744073709551615 1 2 0.100 0.100 0",
        ] {
            let line = format!("{OLD}{tail}");
            assert_eq!(parse_telemetry_line(line.as_bytes()), None, "{line}");
        }
    }
}
