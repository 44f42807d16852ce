//! `.coli_usage`: the persistent expert-selection history (upstream `c/route_trace.h` format).
//!
//! ```text
//! -3 <crc32c> <bytes>              ours: checksum of the <bytes> bytes after this first line
//! -1 <n_layers> <n_experts>        dimensions (negative layer: old readers skip it)
//! -2 1 <engine_id>                 format version, FNV-1a-32 of "glm_moe_dsa"
//! -4 <hi> <lo>                     ours: the weights' fingerprint (two u32 halves) the
//!                                  counts were made on (`crate::identity`)
//! <layer> <expert> <count>         one line per non-zero count, rows 0..=n_layers (n_layers = MTP)
//! ```
//!
//! Upstream skips negative-layer records it does not know, so the `-3` record keeps the file
//! readable there; a file without it (upstream's) is read unverified. An all-zero history is a
//! zero-byte file. Writes go to `<path>.tmp`, then rename, so a kill
//! leaves the old file or the new one, never half of one.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// FNV-1a, 32 bits (offset basis 2166136261, prime 16777619).
pub fn fnv1a32(s: &str) -> u32 {
    let mut h: u32 = 2_166_136_261;
    for b in s.bytes() {
        h ^= b as u32;
        h = h.wrapping_mul(16_777_619);
    }
    h
}

/// The engine id upstream writes in the `-2` header record.
pub fn engine_id() -> u32 {
    fnv1a32("glm_moe_dsa")
}

pub const FORMAT_VERSION: i64 = 1;
/// The layer field of the checksum trailer record.
const CHECKSUM_RECORD: &str = "-3 ";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum UsageError {
    #[error("{}: {reason}", path.display())]
    Io { path: PathBuf, reason: String },
    #[error("{}: line {line}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{}: written for {found_layers} layers x {found_experts} experts, this model has {layers} x {experts}", path.display())]
    Dimensions {
        path: PathBuf,
        found_layers: i64,
        found_experts: i64,
        layers: usize,
        experts: usize,
    },
    #[error("{}: format version {version}, this engine reads version 1", path.display())]
    Version { path: PathBuf, version: i64 },
    #[error("{}: written by another engine (id {found}, ours {ours})", path.display())]
    Foreign {
        path: PathBuf,
        found: u32,
        ours: u32,
    },
}

/// Selection counts per (row, expert); rows are model layers `0..=n_layers`.
#[derive(Clone, Debug, PartialEq)]
pub struct Usage {
    pub n_layers: usize,
    pub n_experts: usize,
    counts: Vec<u64>,
    /// The weights' content fingerprint these counts were made on (`-4` record); `None` in a
    /// file from upstream or an older colibri, which cannot say.
    pub weights: Option<u64>,
}

impl Usage {
    pub fn new(n_layers: usize, n_experts: usize) -> Usage {
        Usage {
            n_layers,
            n_experts,
            counts: vec![0; (n_layers + 1) * n_experts],
            weights: None,
        }
    }

    pub fn get(&self, layer: usize, e: usize) -> u64 {
        self.counts
            .get(layer * self.n_experts + e)
            .copied()
            .unwrap_or(0)
    }

    pub fn add(&mut self, layer: usize, e: usize, n: u64) {
        if layer <= self.n_layers && e < self.n_experts {
            let c = &mut self.counts[layer * self.n_experts + e];
            *c = c.saturating_add(n);
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |a, &c| a.saturating_add(c))
    }

    /// Multiplies every count by `d` (`COLI_USAGE_DECAY`, 0 < d < 1), rounded to nearest, so
    /// old habits fade: a cumulative history otherwise stops moving once it is large (a turn
    /// of tens of thousands of selections shifts a history of millions by well under 1%).
    /// Counts that round to 0 leave the file.
    pub fn decay(&mut self, d: f64) {
        for c in &mut self.counts {
            *c = (*c as f64 * d).round() as u64;
        }
    }

    /// `(layer, expert, count)` for every non-zero count, in (layer, expert) order.
    pub fn records(&self) -> impl Iterator<Item = (usize, usize, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(i, &c)| (i / self.n_experts, i % self.n_experts, c))
    }

    /// The file text (empty for an all-zero history).
    pub fn to_text(&self) -> String {
        if self.total() == 0 {
            return String::new();
        }
        let mut s = String::new();
        let _ = writeln!(s, "-1 {} {}", self.n_layers, self.n_experts);
        let _ = writeln!(s, "-2 {} {}", FORMAT_VERSION, engine_id());
        if let Some(w) = self.weights {
            let _ = writeln!(s, "-4 {} {}", w >> 32, w & 0xffff_ffff);
        }
        for (l, e, c) in self.records() {
            let _ = writeln!(s, "{l} {e} {c}");
        }
        let crc = crc32c::crc32c(s.as_bytes());
        format!("{CHECKSUM_RECORD}{crc} {}\n{s}", s.len())
    }

    /// Checks and strips the leading `-3` checksum record. `Ok(false)`: the file has none
    /// (upstream's). The record comes first so that a file cut anywhere is refused (the
    /// length it names no longer matches), never read as an unverified upstream file.
    fn verify_checksum<'t>(text: &'t str, path: &Path) -> Result<(&'t str, bool), UsageError> {
        let Some(first) = text.strip_prefix(CHECKSUM_RECORD) else {
            return Ok((text, false));
        };
        let corrupt = |reason: String| UsageError::Corrupt {
            path: path.to_path_buf(),
            line: 1,
            reason,
        };
        let end = first.find('\n').map_or(first.len(), |i| i + 1);
        let body = &first[end..];
        let f: Vec<u64> = first[..end]
            .trim_end()
            .split(' ')
            .map(|w| w.parse::<u64>())
            .collect::<Result<_, _>>()
            .map_err(|_| corrupt("checksum record: expected -3 <crc32c> <bytes>".into()))?;
        match f[..] {
            [_, len] if len != body.len() as u64 => Err(corrupt(format!(
                "checksum record covers {len} bytes, the file has {} after it (cut short or grown)",
                body.len()
            ))),
            [crc, _] if crc == crc32c::crc32c(body.as_bytes()) as u64 => Ok((body, true)),
            [_, _] => Err(corrupt("checksum mismatch (damaged file)".into())),
            _ => Err(corrupt(
                "checksum record: expected -3 <crc32c> <bytes>".into(),
            )),
        }
    }

    /// Parses a usage file for a model of `n_layers` x `n_experts`. `trusted` (a path the user
    /// typed) turns a foreign engine id into a warning; headerless legacy files are accepted.
    /// Returns the table and the warnings to print.
    pub fn parse(
        text: &str,
        path: &Path,
        n_layers: usize,
        n_experts: usize,
        trusted: bool,
    ) -> Result<(Usage, Vec<String>), UsageError> {
        let mut u = Usage::new(n_layers, n_experts);
        let mut warnings = Vec::new();
        let (text, checked) = Usage::verify_checksum(text, path)?;
        if !checked && !text.trim().is_empty() {
            warnings.push(format!(
                "{}: no checksum (upstream's format): read unverified",
                path.display()
            ));
        }
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let corrupt = |reason: &str| UsageError::Corrupt {
                path: path.to_path_buf(),
                line: line_no,
                reason: reason.to_string(),
            };
            if line.trim().is_empty() {
                continue;
            }
            let f: Vec<i64> = line
                .split_whitespace()
                .map(|w| w.parse::<i64>())
                .collect::<Result<_, _>>()
                .map_err(|_| corrupt("expected three integers"))?;
            if f.len() != 3 {
                return Err(corrupt("expected three integers"));
            }
            match f[0] {
                -1 => {
                    if f[1] != n_layers as i64 || f[2] != n_experts as i64 {
                        return Err(UsageError::Dimensions {
                            path: path.to_path_buf(),
                            found_layers: f[1],
                            found_experts: f[2],
                            layers: n_layers,
                            experts: n_experts,
                        });
                    }
                }
                -2 => {
                    if f[1] > FORMAT_VERSION || f[1] < 1 {
                        return Err(UsageError::Version {
                            path: path.to_path_buf(),
                            version: f[1],
                        });
                    }
                    let found = u32::try_from(f[2]).map_err(|_| corrupt("bad engine id"))?;
                    if found != engine_id() {
                        let err = UsageError::Foreign {
                            path: path.to_path_buf(),
                            found,
                            ours: engine_id(),
                        };
                        if !trusted {
                            return Err(err);
                        }
                        warnings.push(format!("{err}: used anyway (named by --pin)"));
                    }
                }
                -4 => {
                    let half =
                        |v: i64| u32::try_from(v).map_err(|_| corrupt("bad weights fingerprint"));
                    u.weights = Some((half(f[1])? as u64) << 32 | half(f[2])? as u64);
                }
                l if l < 0 => {} // a header record of a later version: skipped
                l => {
                    let (layer, e, c) = (l as usize, f[1], f[2]);
                    if layer > n_layers || e < 0 || e as usize >= n_experts || c < 0 {
                        return Err(corrupt(&format!(
                            "record {l} {e} {c} is outside {n_layers} layers x {n_experts} experts"
                        )));
                    }
                    u.add(layer, e as usize, c as u64);
                }
            }
        }
        Ok((u, warnings))
    }

    /// Reads `path`; a missing file is an empty history.
    pub fn load(
        path: &Path,
        n_layers: usize,
        n_experts: usize,
        trusted: bool,
    ) -> Result<(Usage, Vec<String>), UsageError> {
        match std::fs::read(path) {
            Ok(bytes) => {
                let text = String::from_utf8(bytes).map_err(|_| UsageError::Corrupt {
                    path: path.to_path_buf(),
                    line: 0,
                    reason: "not text".into(),
                })?;
                Usage::parse(&text, path, n_layers, n_experts, trusted)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok((Usage::new(n_layers, n_experts), Vec::new()))
            }
            Err(e) => Err(UsageError::Io {
                path: path.to_path_buf(),
                reason: e.to_string(),
            }),
        }
    }

    /// Writes the file atomically and durably: `<path>.tmp`, fsync, rename, fsync of the folder.
    pub fn save(&self, path: &Path) -> Result<(), UsageError> {
        let io = |e: std::io::Error| UsageError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        crate::durable::replace_file(path, self.to_text().as_bytes()).map_err(io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("colibri-usage-{}-{name}", std::process::id()));
        let _ = std::fs::create_dir_all(&d);
        d.join(".coli_usage")
    }

    #[test]
    fn engine_id_is_fnv1a_of_the_architecture() {
        assert_eq!(fnv1a32(""), 2_166_136_261);
        assert_eq!(fnv1a32("a"), 0xe40c292c); // published FNV-1a test vector
        assert_eq!(engine_id(), fnv1a32("glm_moe_dsa"));
    }

    #[test]
    fn round_trip_and_exact_text() {
        let mut u = Usage::new(4, 8);
        u.add(1, 3, 7);
        u.add(3, 0, 1);
        u.add(1, 3, 2);
        let text = u.to_text();
        let body = format!("-1 4 8\n-2 1 {}\n1 3 9\n3 0 1\n", engine_id());
        assert_eq!(
            text,
            format!(
                "-3 {} {}\n{body}",
                crc32c::crc32c(body.as_bytes()),
                body.len()
            )
        );
        let p = tmp("rt");
        u.save(&p).unwrap();
        let (back, warn) = Usage::load(&p, 4, 8, false).unwrap();
        assert_eq!(back, u);
        assert!(warn.is_empty());
        assert!(!p.with_file_name(".coli_usage.tmp").exists());
    }

    #[test]
    fn decay_scales_every_count_and_rounds() {
        let mut u = Usage::new(2, 4);
        u.add(0, 0, 1000);
        u.add(1, 3, 3);
        u.add(2, 1, 1);
        u.decay(0.5);
        assert_eq!((u.get(0, 0), u.get(1, 3), u.get(2, 1)), (500, 2, 1)); // 1.5 -> 2, 0.5 -> 1
        u.decay(0.4);
        assert_eq!((u.get(0, 0), u.get(1, 3), u.get(2, 1)), (200, 1, 0));
        // A decayed-to-zero record is gone from the file (after its checksum record).
        let body = format!("-1 2 4\n-2 1 {}\n0 0 200\n1 3 1\n", engine_id());
        let crc = crc32c::crc32c(body.as_bytes());
        assert_eq!(u.to_text(), format!("-3 {crc} {}\n{body}", body.len()));
        // Rounded to nearest, a count of 1 survives a factor of 0.5 (0.5 rounds up) and
        // fades under anything smaller.
        u.decay(0.5);
        assert_eq!(u.get(1, 3), 1);
        for _ in 0..20 {
            u.decay(0.45);
        }
        assert_eq!(u.total(), 0);
        assert_eq!(u.to_text(), "");
    }

    #[test]
    fn all_zero_history_is_a_zero_byte_file() {
        let p = tmp("zero");
        Usage::new(2, 4).save(&p).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        let (u, _) = Usage::load(&p, 2, 4, false).unwrap();
        assert_eq!(u.total(), 0);
    }

    #[test]
    fn foreign_and_corrupt_files_are_refused() {
        let p = Path::new("u");
        let foreign = "-1 4 8\n-2 1 12345\n1 1 1\n";
        assert!(matches!(
            Usage::parse(foreign, p, 4, 8, false),
            Err(UsageError::Foreign { found: 12345, .. })
        ));
        // Named by the user: accepted with a warning.
        let (u, w) = Usage::parse(foreign, p, 4, 8, true).unwrap();
        assert_eq!(u.get(1, 1), 1);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("no checksum"), "{w:?}");
        assert!(matches!(
            Usage::parse("-1 5 8\n", p, 4, 8, true),
            Err(UsageError::Dimensions { .. })
        ));
        assert!(matches!(
            Usage::parse("-2 2 0\n", p, 4, 8, true),
            Err(UsageError::Version { version: 2, .. })
        ));
        for bad in [
            "1 2\n",
            "1 x 3\n",
            "9 0 1\n",
            "1 8 1\n",
            "1 1 -4\n",
            "\u{0}\u{1}",
        ] {
            assert!(
                matches!(
                    Usage::parse(bad, p, 4, 8, false),
                    Err(UsageError::Corrupt { .. })
                ),
                "{bad:?}"
            );
        }
        // Headerless legacy files are read as-is.
        let (u, _) = Usage::parse("2 5 10\n", p, 4, 8, false).unwrap();
        assert_eq!(u.get(2, 5), 10);
    }

    /// Every single-bit flip of a checksummed history is either refused or (only when it hit
    /// the checksum record, leaving the counts intact) read back as the same table; every cut
    /// is refused: a damaged history never pins different experts.
    #[test]
    fn every_bit_flip_and_cut_is_refused_or_harmless() {
        let mut u = Usage::new(3, 16);
        for (l, e, c) in [(0, 1, 5), (0, 15, 123456), (1, 7, 1), (2, 0, 42), (3, 9, 9)] {
            u.add(l, e, c);
        }
        let text = u.to_text().into_bytes();
        let record = text.iter().position(|&b| b == b'\n').unwrap() + 1;
        let (mut refused, mut harmless) = (0, 0);
        for pos in 0..text.len() {
            for bit in 0..8 {
                let mut t = text.clone();
                t[pos] ^= 1 << bit;
                let Ok(s) = String::from_utf8(t) else {
                    refused += 1; // Usage::load refuses non-UTF-8 as "not text"
                    continue;
                };
                match Usage::parse(&s, Path::new("u"), 3, 16, false) {
                    Err(e) => {
                        assert!(e.to_string().starts_with("u: "), "{e}");
                        refused += 1
                    }
                    Ok((back, _)) => {
                        assert!(pos < record, "flip at {pos} bit {bit} accepted: {s:?}");
                        assert_eq!(back, u, "flip at {pos} bit {bit}");
                        harmless += 1
                    }
                }
            }
        }
        assert_eq!(refused + harmless, text.len() * 8);
        assert!(refused >= (text.len() - record) * 8);
        for cut in 1..text.len() {
            let s = std::str::from_utf8(&text[..cut]).unwrap();
            assert!(
                Usage::parse(s, Path::new("u"), 3, 16, false).is_err(),
                "cut at {cut}"
            );
        }
    }
}
