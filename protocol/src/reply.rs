//! Replies: what the daemon writes to stdout, and their exact bytes.

use std::io::{self, Write};

use crate::num::{parse_f64, parse_u32, push_fixed};
use crate::telemetry::Telemetry;

/// `\x01\x01READY\x01\x01\n`: the daemon is ready; nothing precedes it on stdout.
pub const READY: &[u8] = b"\x01\x01READY\x01\x01\n";
/// `\x01\x01END\x01\x01\n`: end of a turn's streamed text.
pub const END: &[u8] = b"\x01\x01END\x01\x01\n";

/// One unit of the daemon's stdout.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    /// The READY sentinel.
    Ready,
    /// Streamed answer bytes: raw, possibly invalid UTF-8, never empty when decoded.
    Text(Vec<u8>),
    /// The END sentinel. `leading_newline`: a `\n` came right before it, which upstream
    /// writes for plain-line chat turns and `\x02MORE` but not for `\x02PROMPT` turns. The
    /// decoder cannot tell that `\n` from a text that ends in `\n`; a client that sent a
    /// `\x02PROMPT` should append it back to the text.
    End {
        /// Whether `\n` precedes the sentinel.
        leading_newline: bool,
    },
    /// A STAT line.
    Stat(Stat),
    /// A telemetry line between turns (upstream kinds only, see the README).
    Telemetry(Telemetry),
}

/// `STAT %d %.2f %.1f %.2f` (4 fields) or `STAT %d %.2f %.1f %.2f %d %d` (6 fields).
#[derive(Clone, Debug, PartialEq)]
pub struct Stat {
    /// Tokens generated in the turn.
    pub completion_tokens: u32,
    /// Tokens per second (prefill included, as upstream's legacy protocol).
    pub tok_per_s: f64,
    /// Expert hit rate, percent.
    pub hit_pct: f64,
    /// Resident set, GB.
    pub rss_gb: f64,
    /// The two extra fields of the 6-field form: `(prompt_tokens, length_limited)`.
    pub prompt: Option<(u32, bool)>,
    /// Upstream's ` swap_pct=... route_kl=...` suffix: present only while cache-aware routing
    /// (`--cache-route`) is on, saying the turn's outputs came from approximate routing.
    pub route: Option<crate::route::RouteAgree>,
    /// Our ` prefetch_in_time=... prefetch_late=... prefetch_unused=...` suffix: present only
    /// while the pilot reads experts ahead (`--pilot`), bytes since the daemon started.
    pub prefetch: Option<crate::prefetch::PrefetchBytes>,
}

impl Stat {
    /// `STAT 0 0.00 0.0 <rss>`: after READY, and the answer to an empty line, `\x02RESET`,
    /// `\x02MORE` with no history.
    pub fn zero(rss_gb: f64) -> Stat {
        Stat {
            completion_tokens: 0,
            tok_per_s: 0.0,
            hit_pct: 0.0,
            rss_gb,
            prompt: None,
            route: None,
            prefetch: None,
        }
    }

    /// `STAT 0 0.00 0.0 <rss> 0 0`: the answer to a rejected command.
    pub fn zero6(rss_gb: f64) -> Stat {
        Stat {
            prompt: Some((0, false)),
            ..Stat::zero(rss_gb)
        }
    }

    /// The line without its `\n`.
    pub fn to_line(&self) -> String {
        let mut s = format!("STAT {} ", self.completion_tokens);
        push_fixed(&mut s, self.tok_per_s, 2);
        s.push(' ');
        push_fixed(&mut s, self.hit_pct, 1);
        s.push(' ');
        push_fixed(&mut s, self.rss_gb, 2);
        if let Some((prompt_tokens, limited)) = self.prompt {
            s.push_str(&format!(" {prompt_tokens} {}", u8::from(limited)));
        }
        if let Some(r) = &self.route {
            r.push_suffix(&mut s);
        }
        if let Some(p) = &self.prefetch {
            p.push_suffix(&mut s);
        }
        s
    }
}

/// Parses a STAT line (with or without `\n`). Fields 5 and 6 make it the 6-field form when
/// both are present and valid (`length_limited` is `0` or `1`); anything after them, or
/// after field 4 otherwise, is ignored but for upstream's ` swap_pct=...` suffix (`route`) and
/// ours, ` prefetch_in_time=...` (`prefetch`).
pub fn parse_stat_line(line: &[u8]) -> Option<Stat> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let rest = line.strip_prefix(b"STAT ")?;
    let mut f = rest.split(|&b| b == b' ').filter(|w| !w.is_empty());
    let completion_tokens = parse_u32(f.next()?)?;
    let tok_per_s = parse_f64(f.next()?)?;
    let hit_pct = parse_f64(f.next()?)?;
    let rss_gb = parse_f64(f.next()?)?;
    let rest: Vec<&[u8]> = f.collect();
    let plain: Vec<&[u8]> = rest
        .iter()
        .copied()
        .take_while(|w| !w.contains(&b'='))
        .collect();
    let prompt = match (
        plain.first().and_then(|w| parse_u32(w)),
        plain.get(1).copied(),
    ) {
        (Some(p), Some(b"0")) => Some((p, false)),
        (Some(p), Some(b"1")) => Some((p, true)),
        _ => None,
    };
    Some(Stat {
        completion_tokens,
        tok_per_s,
        hit_pct,
        rss_gb,
        prompt,
        route: crate::route::RouteAgree::parse(rest.iter().copied()),
        prefetch: crate::prefetch::PrefetchBytes::parse(rest.iter().copied()),
    })
}

impl Reply {
    /// Appends the exact wire bytes of this reply to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Reply::Ready => out.extend_from_slice(READY),
            Reply::Text(bytes) => out.extend_from_slice(bytes),
            Reply::End { leading_newline } => {
                if *leading_newline {
                    out.push(b'\n');
                }
                out.extend_from_slice(END);
            }
            Reply::Stat(stat) => {
                out.extend_from_slice(stat.to_line().as_bytes());
                out.push(b'\n');
            }
            Reply::Telemetry(t) => t.encode(out),
        }
    }

    /// Writes the exact wire bytes with one `write_all` (the caller flushes, as upstream
    /// does after every line).
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        match self {
            Reply::Text(bytes) => w.write_all(bytes),
            _ => {
                let mut buf = Vec::new();
                self.encode(&mut buf);
                w.write_all(&buf)
            }
        }
    }
}
