//! Telemetry lines written: each kind's fields exactly as upstream's `printf` formats them
//! (fixed decimals through `push_fixed`, lower-case hex for the expert maps), so a line we
//! write is byte-compatible with upstream's and parses back to the same value.

use std::fmt::Write as _;

use super::Telemetry;
use crate::num::push_fixed;

impl Telemetry {
    /// The line's kind word (`None` for [`Telemetry::Unknown`]).
    pub fn kind(&self) -> Option<&'static str> {
        Some(match self {
            Telemetry::HwInfo(_) => "HWINFO",
            Telemetry::Tiers(_) => "TIERS",
            Telemetry::Emap(_) => "EMAP",
            Telemetry::Hits(_) => "HITS",
            Telemetry::Prof(_) => "PROF",
            Telemetry::Progress(_) => "PROGRESS",
            Telemetry::Live(_) => "LIVE",
            Telemetry::Repin(_) => "REPIN",
            Telemetry::DiskClass(_) => "DISKCLASS",
            Telemetry::State(_) => "STATE",
            Telemetry::Sessions(_) => "SESSIONS",
            Telemetry::Spec(_) => "SPEC",
            Telemetry::KvSave(_) => "KVSAVE",
            Telemetry::Grammar(_) => "GRAMMAR",
            Telemetry::Unknown(_) => return None,
        })
    }

    /// The line without its `\n`, exactly as upstream's `printf` formats it.
    pub fn to_line(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = self.write_line(&mut s);
        s
    }

    /// Appends the line and its `\n` to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.to_line().as_bytes());
        out.push(b'\n');
    }

    fn write_line(&self, s: &mut String) -> std::fmt::Result {
        match self {
            Telemetry::HwInfo(h) => {
                write!(s, "HWINFO {} ", h.cores)?;
                push_fixed(s, h.ram_total_gb, 1);
                s.push(' ');
                push_fixed(s, h.ram_avail_gb, 1);
                write!(s, " {} ", h.ngpu)?;
                push_fixed(s, h.vram_total_gb, 1);
                write!(s, " {}|{}", h.cpu_name, h.gpu_name)?;
            }
            Telemetry::Tiers(t) => {
                write!(
                    s,
                    "TIERS {} {} {} ",
                    t.vram_experts, t.ram_experts, t.disk_experts
                )?;
                push_fixed(s, t.vram_gb, 2);
                s.push(' ');
                push_fixed(s, t.ram_gb, 2);
            }
            Telemetry::Emap(m) => {
                write!(s, "EMAP {} {} ", m.rows, m.cols)?;
                push_hex(s, &m.cells);
            }
            Telemetry::Hits(h) => {
                write!(s, "HITS {} {} ", h.rows, h.cols)?;
                push_hex(s, &h.bits);
            }
            Telemetry::Prof(p) => {
                s.push_str("PROF ");
                push_fixed(s, p.wall_s, 3);
                write!(s, " {} {}", p.prompt_tokens, p.completion_tokens)?;
                for x in [
                    p.expert_disk_s,
                    p.expert_wait_s,
                    p.expert_matmul_s,
                    p.attention_s,
                    p.lm_head_s,
                ] {
                    s.push(' ');
                    push_fixed(s, x, 3);
                }
                write!(s, " {}", p.forwards)?;
            }
            Telemetry::Progress(p) => {
                write!(s, "PROGRESS {} {} {}", p.phase.as_str(), p.done, p.total)?;
            }
            Telemetry::Live(l) => {
                write!(s, "LIVE {} ", l.tokens)?;
                push_fixed(s, l.tok_per_s, 2);
                s.push(' ');
                push_fixed(s, l.hit_pct, 1);
                s.push(' ');
                push_fixed(s, l.rss_gb, 2);
                write!(s, " {}", l.slot)?;
                if let Some(tpf) = l.tokens_per_forward {
                    s.push(' ');
                    push_fixed(s, tpf, 2);
                }
            }
            Telemetry::Repin(r) => {
                write!(
                    s,
                    "REPIN {} {} {} {} {} ",
                    r.layer, r.evicted, r.evicted_heat, r.admitted, r.admitted_heat
                )?;
                push_fixed(s, r.ms, 1);
            }
            Telemetry::DiskClass(d) => {
                s.push_str("DISKCLASS");
                for (name, f) in [("cold", &d.cold), ("warm", &d.warm)] {
                    write!(s, " {name} {} {} ", f.count, f.bytes)?;
                    push_fixed(s, f.thread_s, 3);
                    s.push(' ');
                    push_fixed(s, f.busy_s, 3);
                    write!(s, " {}", f.direct)?;
                }
                crate::drives::push_drives(s, &d.drives);
            }
            Telemetry::State(st) => write!(s, "STATE {}", st.as_str())?,
            Telemetry::Sessions(list) => {
                write!(s, "SESSIONS {}", list.len())?;
                for x in list {
                    write!(
                        s,
                        " {} {} {} {} {}",
                        x.slot,
                        x.state.as_str(),
                        x.id,
                        x.ctx_tokens,
                        x.generated
                    )?;
                }
            }
            Telemetry::Spec(x) => {
                write!(s, "SPEC {} {} {} ", x.slot, x.tokens, x.forwards)?;
                push_fixed(s, x.tokens_per_forward(), 2);
                write!(s, " {} ", x.max_draft)?;
                push_fixed(s, x.mean_draft(), 2);
                write!(s, " {}", x.drafting_forwards)?;
                for (name, src) in x.sources() {
                    write!(s, " {name} {} {} ", src.proposed, src.accepted)?;
                    push_fixed(s, src.acceptance_pct().unwrap_or(0.0), 1);
                }
            }
            Telemetry::KvSave(k) => {
                // One line whatever the reason says.
                let reason: String = k
                    .reason
                    .chars()
                    .map(|c| if c == '\n' || c == '\r' { ' ' } else { c })
                    .collect();
                write!(s, "KVSAVE {} fail {reason}", k.slot)?;
            }
            Telemetry::Grammar(g) => write!(s, "GRAMMAR {} {}", g.id, g.as_str())?,
            Telemetry::Unknown(line) => s.push_str(line),
        }
        Ok(())
    }
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    s.reserve(bytes.len() * 2);
    for &b in bytes {
        s.push(HEX[usize::from(b >> 4)] as char);
        s.push(HEX[usize::from(b & 15)] as char);
    }
}
