//! Telemetry lines read: forward-compatible (an unknown kind is [`Telemetry::Unknown`],
//! trailing extra fields of a known kind are ignored) and total over any bytes: a malformed
//! line of a known kind is `None`, never a panic.

use super::{
    DiskClass, DiskClassFigures, Emap, EngineState, GrammarEnd, Hits, HwInfo, KvSave, Live, Prof,
    Progress, ProgressPhase, Repin, SessionInfo, SessionState, Spec, SpecSource, Telemetry, Tiers,
};
use crate::num::{parse_f64, parse_u32, parse_u64};

fn parse_hex(h: &[u8]) -> Option<Vec<u8>> {
    fn nib(c: u8) -> Option<u8> {
        match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            b'A'..=b'F' => Some(c - b'A' + 10),
            _ => None,
        }
    }
    if !h.len().is_multiple_of(2) {
        return None;
    }
    h.chunks_exact(2)
        .map(|p| Some(nib(p[0])? << 4 | nib(p[1])?))
        .collect()
}

/// Space-separated fields of a line (runs of spaces count as one separator).
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn new(line: &'a [u8]) -> Self {
        Fields(line)
    }
    fn word(&mut self) -> Option<&'a [u8]> {
        let start = self.0.iter().position(|&b| b != b' ')?;
        let rest = &self.0[start..];
        let len = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        self.0 = &rest[len..];
        Some(&rest[..len])
    }
    fn u32(&mut self) -> Option<u32> {
        parse_u32(self.word()?)
    }
    fn u64(&mut self) -> Option<u64> {
        parse_u64(self.word()?)
    }
    fn f64(&mut self) -> Option<f64> {
        parse_f64(self.word()?)
    }
    fn expect(&mut self, w: &[u8]) -> Option<()> {
        (self.word()? == w).then_some(())
    }
}

/// Strips one trailing `\n` and then one `\r`.
fn strip_eol(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Parses one telemetry line (with or without its `\n`). `None` for an empty line or a
/// malformed line of a known kind; [`Telemetry::Unknown`] for any other kind. Extra fields
/// after the documented ones are ignored (upstream adds optional fields at the end, e.g. to
/// `PROF`). Never panics.
pub fn parse_telemetry_line(line: &[u8]) -> Option<Telemetry> {
    let line = strip_eol(line);
    let kind_end = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
    let kind = &line[..kind_end];
    let mut f = Fields::new(&line[kind_end..]);
    let t = match kind {
        b"" => return None,
        b"HWINFO" => return parse_hwinfo(line).map(Telemetry::HwInfo),
        b"TIERS" => Telemetry::Tiers(Tiers {
            vram_experts: f.u32()?,
            ram_experts: f.u32()?,
            disk_experts: f.u32()?,
            vram_gb: f.f64()?,
            ram_gb: f.f64()?,
        }),
        b"EMAP" => {
            let (rows, cols) = (f.u32()?, f.u32()?);
            let cells = parse_hex(f.word().unwrap_or(b""))?;
            let n = u64::from(rows) * u64::from(cols);
            (cells.len() as u64 == n).then_some(())?;
            Telemetry::Emap(Emap { rows, cols, cells })
        }
        b"HITS" => {
            let (rows, cols) = (f.u32()?, f.u32()?);
            let bits = parse_hex(f.word().unwrap_or(b""))?;
            let n = u64::from(rows) * u64::from(cols);
            (bits.len() as u64 == n.div_ceil(8)).then_some(())?;
            Telemetry::Hits(Hits { rows, cols, bits })
        }
        b"PROF" => Telemetry::Prof(Prof {
            wall_s: f.f64()?,
            prompt_tokens: f.u32()?,
            completion_tokens: f.u32()?,
            expert_disk_s: f.f64()?,
            expert_wait_s: f.f64()?,
            expert_matmul_s: f.f64()?,
            attention_s: f.f64()?,
            lm_head_s: f.f64()?,
            forwards: f.u64()?,
        }),
        b"PROGRESS" => Telemetry::Progress(Progress {
            phase: ProgressPhase::parse(f.word()?)?,
            done: f.u64()?,
            total: f.u64()?,
        }),
        b"LIVE" => Telemetry::Live(Live {
            tokens: f.u32()?,
            tok_per_s: f.f64()?,
            hit_pct: f.f64()?,
            rss_gb: f.f64()?,
            slot: f.u32()?,
            // Older daemons end the line at the slot.
            tokens_per_forward: match f.word() {
                None => None,
                Some(w) => Some(parse_f64(w)?),
            },
        }),
        b"REPIN" => Telemetry::Repin(Repin {
            layer: f.u32()?,
            evicted: f.u32()?,
            evicted_heat: f.u32()?,
            admitted: f.u32()?,
            admitted_heat: f.u32()?,
            ms: f.f64()?,
        }),
        b"DISKCLASS" => {
            let mut class = |name: &[u8]| {
                f.expect(name)?;
                Some(DiskClassFigures {
                    count: f.u64()?,
                    bytes: f.u64()?,
                    thread_s: f.f64()?,
                    busy_s: f.f64()?,
                    direct: f.u64()?,
                })
            };
            let cold = class(b"cold")?;
            let warm = class(b"warm")?;
            let drives = crate::drives::parse_drives(|| f.word())?;
            Telemetry::DiskClass(DiskClass { cold, warm, drives })
        }
        b"STATE" => Telemetry::State(EngineState::parse(f.word()?)?),
        b"SESSIONS" => {
            let n = f.u32()?;
            // Grown as groups parse: a bogus count cannot allocate more than the line holds.
            let mut list = Vec::new();
            for _ in 0..n {
                list.push(SessionInfo {
                    slot: f.u32()?,
                    state: SessionState::parse(f.word()?)?,
                    id: f.u64()?,
                    ctx_tokens: f.u64()?,
                    generated: f.u64()?,
                });
            }
            Telemetry::Sessions(list)
        }
        b"KVSAVE" => {
            let slot = f.u32()?;
            f.expect(b"fail")?;
            let reason = String::from_utf8_lossy(f.0).trim_start().to_string();
            Telemetry::KvSave(KvSave { slot, reason })
        }
        b"GRAMMAR" => {
            let id = f.u64()?;
            let complete = match f.word()? {
                b"complete" => true,
                b"incomplete" => false,
                _ => return None,
            };
            Telemetry::Grammar(GrammarEnd { id, complete })
        }
        b"SPEC" => {
            let (slot, tokens, forwards) = (f.u32()?, f.u64()?, f.u64()?);
            f.f64()?; // tokens per forward, derived
            let max_draft = f.u32()?;
            f.f64()?; // mean draft length, derived
            let drafting_forwards = f.u64()?;
            let mut source = |name: &[u8]| {
                f.expect(name)?;
                let src = SpecSource {
                    proposed: f.u64()?,
                    accepted: f.u64()?,
                };
                f.f64()?; // acceptance, derived
                (src.accepted <= src.proposed).then_some(src)
            };
            let mtp = source(b"mtp")?;
            let ngram = source(b"ngram")?;
            let grammar = source(b"grammar")?;
            Telemetry::Spec(Spec {
                slot,
                tokens,
                forwards,
                max_draft,
                drafting_forwards,
                mtp,
                ngram,
                grammar,
            })
        }
        _ => Telemetry::Unknown(String::from_utf8_lossy(line).into_owned()),
    };
    Some(t)
}

/// `HWINFO` fields 1-5 are single-space separated numbers; the rest of the line (which may
/// contain spaces) is `cpu_name|gpu_name`, split at the first `|`.
fn parse_hwinfo(line: &[u8]) -> Option<HwInfo> {
    let mut parts = line.splitn(7, |&b| b == b' ');
    parts.next()?; // "HWINFO"
    let cores = parse_u32(parts.next()?)?;
    let ram_total_gb = parse_f64(parts.next()?)?;
    let ram_avail_gb = parse_f64(parts.next()?)?;
    let ngpu = parse_u32(parts.next()?)?;
    let vram_total_gb = parse_f64(parts.next()?)?;
    let names = parts.next()?;
    let bar = names.iter().position(|&b| b == b'|')?;
    Some(HwInfo {
        cores,
        ram_total_gb,
        ram_avail_gb,
        ngpu,
        vram_total_gb,
        cpu_name: String::from_utf8_lossy(&names[..bar]).into_owned(),
        gpu_name: String::from_utf8_lossy(&names[bar + 1..]).into_owned(),
    })
}
