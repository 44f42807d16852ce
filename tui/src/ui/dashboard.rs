//! The dashboard: its arrangement beside or below the chat, its one-line summary when there
//! is no room, and the smaller panels (machine, progress, rates, disk reads, re-pins; the
//! mux sessions in `sessions`).

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Gauge, Paragraph, Sparkline, Widget};

use protocol::{DiskClassFigures, DriveFigures, ProgressPhase};

use super::common::{gb, progress_label, thousands, titled};
use super::sessions::{render_sessions, sessions_height, sessions_summary};
use super::tiers::{emap_height, render_emap, render_tiers, tier_colour};
use crate::app::{App, DriveRate};

pub(super) fn render_summary(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let dim = Style::new().fg(Color::DarkGray);
    // (priority, spans): what does not fit the width goes, least important first (the
    // highest number; the later one of equals), so the line is never cut mid-word.
    let mut segs: Vec<(u8, Vec<Span>)> = Vec::new();
    if let Some(s) = sessions_summary(app) {
        segs.push((0, s));
    }
    if let Some(p) = &d.progress {
        segs.push((
            0,
            vec![Span::styled(
                format!("{} {}", p.phase.as_str(), progress_label(p.done, p.total)),
                Style::new().fg(Color::Yellow),
            )],
        ));
    }
    segs.push((
        0,
        match &d.tiers {
            Some(t) => vec![
                Span::styled("■", Style::new().fg(tier_colour(2))),
                Span::raw(format!("VRAM {} ", thousands(t.vram_experts.into()))),
                Span::styled("■", Style::new().fg(tier_colour(1))),
                Span::raw(format!("RAM {} ", thousands(t.ram_experts.into()))),
                Span::styled("■", Style::new().fg(tier_colour(0))),
                Span::raw(format!("disk {}", thousands(t.disk_experts.into()))),
            ],
            None => vec![Span::styled("tiers …", dim)],
        },
    ));
    segs.push((
        1,
        vec![
            Span::raw("hit "),
            Span::styled(
                mini_spark(&d.hit_hist, 8, Some(100.0)),
                Style::new().fg(Color::Green),
            ),
        ],
    ));
    segs.push((
        1,
        vec![
            Span::raw("tok/s "),
            Span::styled(
                mini_spark(&d.tps_hist, 8, None),
                Style::new().fg(Color::Cyan),
            ),
        ],
    ));
    if let Some(tpf) = d.tokens_per_forward {
        segs.push((2, vec![Span::raw(format!("{tpf:.2} tok/fwd"))]));
    }
    if let Some(dc) = &d.disk {
        segs.push((
            3,
            vec![Span::raw(format!(
                "cold {:.1} GB warm {:.1} GB",
                gb(dc.cold.bytes),
                gb(dc.warm.bytes)
            ))],
        ));
    }
    if d.repin_total > 0 {
        segs.push((4, vec![Span::raw(format!("repin {}", d.repin_total))]));
    }
    segs.push((5, vec![Span::styled("F2", dim)]));
    const SEP: &str = " │ ";
    let width = |segs: &[(u8, Vec<Span>)]| -> usize {
        let text: usize = segs.iter().flat_map(|(_, s)| s).map(|s| s.width()).sum();
        text + SEP.chars().count() * segs.len().saturating_sub(1)
    };
    while segs.len() > 1 && width(&segs) > usize::from(area.width) {
        let drop = (0..segs.len())
            .rev()
            .max_by_key(|&i| segs[i].0)
            .unwrap_or(segs.len() - 1);
        segs.remove(drop);
    }
    let mut spans: Vec<Span> = Vec::new();
    for (i, (_, seg)) in segs.into_iter().enumerate() {
        if i > 0 {
            spans.push(Span::styled(SEP, dim));
        }
        spans.extend(seg);
    }
    Paragraph::new(Line::from(spans)).render(area, buf);
}

/// A sparkline in text: the last `n` samples as ▁..█.
pub fn mini_spark(hist: &std::collections::VecDeque<f64>, n: usize, max: Option<f64>) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let start = hist.len().saturating_sub(n);
    let vals: Vec<f64> = hist.range(start..).copied().collect();
    if vals.is_empty() {
        return "·".repeat(n.min(3));
    }
    let top = max
        .unwrap_or_else(|| vals.iter().cloned().fold(0.0, f64::max))
        .max(1e-9);
    vals.iter()
        .map(|v| BARS[((v / top).clamp(0.0, 1.0) * 7.0).round() as usize])
        .collect()
}

pub(super) fn render_dashboard_side(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let hw_h = u16::from(d.hwinfo.is_some());
    let prog_h = u16::from(d.progress.is_some());
    let repin_h = (d.repins.len() as u16).clamp(1, 6) + 2;
    let map_h = emap_height(app, area.width.saturating_sub(2));
    let sess_h = sessions_height(app, 8);
    let [hw, prog, sessions, tiers, map, rates, disk, repin] = Layout::vertical([
        Constraint::Length(hw_h),
        Constraint::Length(prog_h),
        Constraint::Length(sess_h),
        Constraint::Length(5),
        Constraint::Max(map_h),
        Constraint::Length(7),
        Constraint::Length(disk_height(app)),
        Constraint::Min(repin_h),
    ])
    .areas(area);
    render_hwinfo(app, hw, buf);
    render_progress(app, prog, buf);
    render_sessions(app, sessions, buf);
    render_tiers(app, tiers, buf);
    render_emap(app, map, buf);
    render_rates(app, rates, buf);
    render_disk(app, disk, buf);
    render_repins(app, repin, buf);
}

pub(super) fn render_dashboard_below(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let [tiers, map] = Layout::vertical([Constraint::Length(5), Constraint::Min(3)]).areas(left);
    render_tiers(app, tiers, buf);
    render_emap(app, map, buf);
    let hw_h = u16::from(d.hwinfo.is_some());
    let prog_h = u16::from(d.progress.is_some());
    let sess_h = sessions_height(app, 4);
    let [hw, prog, sessions, rates, disk, repin] = Layout::vertical([
        Constraint::Length(hw_h),
        Constraint::Length(prog_h),
        Constraint::Length(sess_h),
        Constraint::Length(7),
        Constraint::Length(disk_height(app)),
        Constraint::Min(3),
    ])
    .areas(right);
    render_hwinfo(app, hw, buf);
    render_progress(app, prog, buf);
    render_sessions(app, sessions, buf);
    render_rates(app, rates, buf);
    render_disk(app, disk, buf);
    render_repins(app, repin, buf);
}

fn render_hwinfo(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(h) = &app.dash.hwinfo else { return };
    let mut s = format!(
        " {} cores · RAM {:.1} GB ({:.1} free)",
        h.cores, h.ram_total_gb, h.ram_avail_gb
    );
    if h.ngpu > 0 {
        s.push_str(&format!(" · {}× GPU {:.1} GB", h.ngpu, h.vram_total_gb));
    }
    if !h.cpu_name.is_empty() {
        s.push_str(" · ");
        s.push_str(&crate::app::sanitize(h.cpu_name.trim()));
    }
    Paragraph::new(Line::styled(s, Style::new().fg(Color::DarkGray))).render(area, buf);
}

fn render_progress(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(p) = &app.dash.progress else { return };
    if area.height == 0 {
        return;
    }
    let ratio = if p.total > 0 {
        (p.done.min(p.total) as f64 / p.total as f64).clamp(0.0, 1.0)
    } else {
        0.0
    };
    let unit = if p.phase == ProgressPhase::Prefill {
        " tokens"
    } else {
        ""
    };
    let label = if p.total > 0 {
        format!(
            "{} {}/{}{unit} ({})",
            p.phase.as_str(),
            p.done,
            p.total,
            progress_label(p.done, p.total)
        )
    } else {
        format!("{} {}{unit}", p.phase.as_str(), p.done)
    };
    Gauge::default()
        .gauge_style(
            Style::new()
                .fg(Color::Magenta)
                .bg(Color::Rgb(0x30, 0x30, 0x38)),
        )
        .ratio(ratio)
        .label(label)
        .render(area, buf);
}

fn render_rates(app: &App, area: Rect, buf: &mut Buffer) {
    let block = titled("rates");
    let inner = block.inner(area);
    block.render(area, buf);
    if inner.height == 0 || inner.width < 14 {
        return;
    }
    let [top, bottom, spec] = Layout::vertical([
        Constraint::Min(1),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(inner);
    let d = &app.dash;
    Paragraph::new(spec_line(d)).render(spec, buf);
    let hit_now = d.hit_hist.back().copied().unwrap_or(app.figures.hit_pct);
    let tps_now = d.tps_hist.back().copied().unwrap_or(app.figures.tok_per_s);
    spark_row(
        top,
        buf,
        &format!("hit {hit_now:5.1}%"),
        &d.hit_hist,
        10.0,
        Some(1000),
        Color::Green,
    );
    spark_row(
        bottom,
        buf,
        &format!("{tps_now:6.2} t/s"),
        &d.tps_hist,
        100.0,
        None,
        Color::Cyan,
    );
}

/// Speculative decoding in one line: tokens per forward, the draft length in use against
/// `--draft`, acceptance per source (`—` for a source that drafted nothing).
pub fn spec_line(d: &crate::app::Dashboard) -> Line<'static> {
    let dim = Style::new().fg(Color::DarkGray);
    let Some(tpf) = d.tokens_per_forward else {
        return Line::styled("drafts: no SPEC figures yet", dim);
    };
    let mut spans = vec![Span::raw(format!("{tpf:.2} tok/fwd"))];
    match &d.spec {
        Some(x) if x.max_draft == 0 => spans.push(Span::styled(" · drafts off", dim)),
        Some(x) => {
            spans.push(Span::raw(format!(
                " · draft {:.1}/{}",
                x.mean_draft(),
                x.max_draft
            )));
            for (name, src) in x.sources() {
                spans.push(Span::styled(format!(" · {name} "), dim));
                spans.push(Span::raw(match src.acceptance_pct() {
                    Some(p) => format!("{p:.0}%"),
                    None => "—".to_string(),
                }));
            }
        }
        None => {}
    }
    Line::from(spans)
}

fn spark_row(
    area: Rect,
    buf: &mut Buffer,
    label: &str,
    hist: &std::collections::VecDeque<f64>,
    mult: f64,
    max: Option<u64>,
    colour: Color,
) {
    let [l, r] = Layout::horizontal([Constraint::Length(12), Constraint::Min(1)]).areas(area);
    Paragraph::new(Line::raw(label.to_string())).render(l, buf);
    let n = usize::from(r.width);
    let start = hist.len().saturating_sub(n);
    let data: Vec<u64> = hist
        .range(start..)
        .map(|v| (v * mult).round() as u64)
        .collect();
    let mut s = Sparkline::default()
        .data(&data)
        .style(Style::new().fg(colour));
    if let Some(m) = max {
        s = s.max(m);
    }
    s.render(r, buf);
}

fn disk_line(name: &str, f: &DiskClassFigures, busy: Option<f64>) -> Line<'static> {
    let wall = if f.busy_s > 0.0 {
        gb(f.bytes) / f.busy_s
    } else {
        0.0
    };
    let busy = busy.map_or("  —".to_string(), |b| format!("{:3.0}%", b * 100.0));
    Line::from(vec![
        Span::styled(format!("{name} "), Style::new().bold()),
        Span::raw(format!(
            "{:>7} × {:6.2} GB {:5.2} GB/s busy {busy}",
            thousands(f.count),
            gb(f.bytes),
            wall
        )),
    ])
}

/// Rows of the disk panel: borders, cold and warm, and one per drive the daemon reports.
fn disk_height(app: &App) -> u16 {
    4 + app
        .dash
        .disk
        .as_ref()
        .map_or(0, |d| d.drives.len().min(4) as u16)
}

/// One drive: cumulative bytes, the rate and busy share over the last interval (else the
/// cumulative rate over its busy time), and failed reads.
fn drive_line(i: usize, d: &DriveFigures, rate: Option<DriveRate>) -> Line<'static> {
    let name = if i == 0 {
        "disk ".to_string()
    } else {
        format!("mir{i} ")
    };
    let (gbs, busy) = match rate {
        Some(r) => (r.gbs, format!("{:3.0}%", r.busy * 100.0)),
        None => (d.rate_gbs(), format!("{:>3.0}s", d.busy_s)),
    };
    let mut spans = vec![
        Span::styled(name, Style::new().bold()),
        Span::raw(format!(
            "{:>7} × {:6.2} GB {gbs:5.2} GB/s busy {busy}",
            thousands(d.reads),
            gb(d.bytes),
        )),
    ];
    if d.failed > 0 {
        spans.push(Span::styled(
            format!(" {} failed", d.failed),
            Style::new().fg(Color::Red),
        ));
    }
    Line::from(spans)
}

fn render_disk(app: &App, area: Rect, buf: &mut Buffer) {
    let block = titled("disk reads (cold / warm)");
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(dc) = &app.dash.disk else {
        Paragraph::new(Line::styled(
            "no DISKCLASS figures yet",
            Style::new().fg(Color::DarkGray),
        ))
        .render(inner, buf);
        return;
    };
    let rates = app.dash.disk_rates;
    let mut lines = vec![
        disk_line("cold", &dc.cold, rates.map(|r| r.cold_busy)),
        disk_line("warm", &dc.warm, rates.map(|r| r.warm_busy)),
    ];
    for (i, d) in dc.drives.iter().enumerate().take(4) {
        lines.push(drive_line(i, d, app.dash.drive_rates.get(i).copied()));
    }
    Paragraph::new(lines).render(inner, buf);
}

fn render_repins(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let block = titled(&format!("re-pin swaps ({})", d.repin_total));
    let inner = block.inner(area);
    block.render(area, buf);
    if d.repins.is_empty() {
        Paragraph::new(Line::styled("none yet", Style::new().fg(Color::DarkGray)))
            .render(inner, buf);
        return;
    }
    let lines: Vec<Line> = d
        .repins
        .iter()
        .rev()
        .take(usize::from(inner.height))
        .map(|r| {
            Line::from(vec![
                Span::styled(format!("L{:<3} ", r.layer), Style::new().fg(Color::Gray)),
                Span::styled(
                    format!("e{} (h{})", r.evicted, r.evicted_heat),
                    Style::new().fg(Color::Red),
                ),
                Span::raw(" → "),
                Span::styled(
                    format!("e{} (h{})", r.admitted, r.admitted_heat),
                    Style::new().fg(Color::Green),
                ),
                Span::styled(
                    format!("  {:.1} ms", r.ms),
                    Style::new().fg(Color::DarkGray),
                ),
            ])
        })
        .collect();
    Paragraph::new(lines).render(inner, buf);
}
