//! The expert-tier panels: the VRAM / RAM / disk split and the expert map, both in the tier
//! colours of upstream's web dashboard.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

use super::common::{thousands, titled};
use crate::app::App;

/// Tier colours (upstream's web dashboard): disk, RAM, VRAM.
pub const TIER_RGB: [(u8, u8, u8); 3] =
    [(0x3a, 0x47, 0x50), (0x5a, 0x9b, 0xd8), (0x4e, 0xd6, 0xa5)];

pub(super) fn tier_colour(tier: usize) -> Color {
    let (r, g, b) = TIER_RGB[tier.min(2)];
    Color::Rgb(r, g, b)
}

pub(super) fn render_tiers(app: &App, area: Rect, buf: &mut Buffer) {
    let block = titled("tiers");
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(t) = &app.dash.tiers else {
        Paragraph::new(Line::styled(
            "waiting for TIERS…",
            Style::new().fg(Color::DarkGray),
        ))
        .render(inner, buf);
        return;
    };
    let counts = [
        u64::from(t.vram_experts),
        u64::from(t.ram_experts),
        u64::from(t.disk_experts),
    ];
    let total: u64 = counts.iter().sum();
    let w = usize::from(inner.width);
    // Bar: VRAM | RAM | disk, proportional, at least one cell for a non-empty tier.
    let mut widths = [0usize; 3];
    if total > 0 && w > 0 {
        for (i, c) in counts.iter().enumerate() {
            widths[i] = ((*c as f64 / total as f64) * w as f64).round() as usize;
            if *c > 0 && widths[i] == 0 {
                widths[i] = 1;
            }
        }
        while widths.iter().sum::<usize>() > w {
            let i = (0..3).max_by_key(|&i| widths[i]).unwrap_or(2);
            widths[i] -= 1;
        }
        let sum: usize = widths.iter().sum();
        if sum < w {
            let i = (0..3).max_by_key(|&i| counts[i]).unwrap_or(2);
            widths[i] += w - sum;
        }
    }
    let bar: Vec<Span> = [(2usize, widths[0]), (1, widths[1]), (0, widths[2])]
        .into_iter()
        .map(|(tier, n)| Span::styled("█".repeat(n), Style::new().fg(tier_colour(tier))))
        .collect();
    let legend = Line::from(vec![
        Span::styled("■ ", Style::new().fg(tier_colour(2))),
        Span::raw(format!("VRAM {}  ", thousands(counts[0]))),
        Span::styled("■ ", Style::new().fg(tier_colour(1))),
        Span::raw(format!("RAM {}  ", thousands(counts[1]))),
        Span::styled("■ ", Style::new().fg(tier_colour(0))),
        Span::raw(format!("disk {}", thousands(counts[2]))),
    ]);
    let gbs = Line::styled(
        format!(
            "VRAM {:.2} GB · RAM {:.2} GB · {} experts",
            t.vram_gb,
            t.ram_gb,
            thousands(total)
        ),
        Style::new().fg(Color::Gray),
    );
    Paragraph::new(vec![Line::from(bar), legend, gbs]).render(inner, buf);
}

/// The colour of one expert cell: tier hue, brightness by heat, white where it pulses.
pub fn cell_colour(tier: u8, heat: u8, pulse: f32) -> Color {
    let (r, g, b) = TIER_RGB[usize::from(tier.min(2))];
    let lum = 0.35 + 0.65 * (f32::from(heat) / 24.0).min(1.0);
    let p = pulse.clamp(0.0, 1.0);
    let mix = |c: u8| {
        let v = f32::from(c) * lum;
        (v + (255.0 - v) * p).round().clamp(0.0, 255.0) as u8
    };
    Color::Rgb(mix(r), mix(g), mix(b))
}

/// How many experts one pixel covers, or (as a negative zoom) how many pixels one expert
/// spans: `n` items onto `space` pixels.
fn scale(n: usize, space: usize) -> (usize, usize) {
    if n == 0 || space == 0 {
        (1, 1)
    } else if n > space {
        (n.div_ceil(space), 1)
    } else {
        (1, (space / n).min(4))
    }
}

/// Columns of the row labels (MoE layer numbers) left of the map: the widest number and a
/// space.
fn gutter(rows: usize) -> u16 {
    (rows.saturating_sub(1).max(1).ilog10() + 2) as u16
}

/// Pixel rows per map row: even (a map row is whole terminal rows, so its label sits on
/// it), at most 4; 1 when several map rows share a pixel.
fn even_zoom(z: usize) -> usize {
    if z >= 2 {
        z & !1
    } else {
        z
    }
}

/// Rows the expert map would like at `width` inner columns (borders and the expert-number
/// row included): about square pixels, two per terminal row.
pub(super) fn emap_height(app: &App, width: u16) -> u16 {
    match &app.dash.emap {
        Some(e) if e.rows > 0 && e.cols > 0 => {
            let map_w = width.saturating_sub(gutter(e.rows as usize)).max(1);
            let (_, xz) = scale(e.cols as usize, usize::from(map_w));
            let yz = even_zoom((xz + 1).min(4));
            let px = e.rows as usize * yz;
            (px.div_ceil(2) + 3).min(200) as u16
        }
        _ => 6,
    }
}

/// The expert numbers above the map: one every `step` experts, spaced so they never touch.
fn column_labels(cols: usize, xs: usize, xz: usize, width: u16) -> Vec<(u16, String)> {
    let digits = cols.saturating_sub(1).max(1).ilog10() as usize + 1;
    let x_of = |e: usize| (e / xs) * xz;
    let step = [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096]
        .into_iter()
        .find(|&st| x_of(st) > digits)
        .unwrap_or(cols.max(1));
    (0..cols)
        .step_by(step)
        .map(|e| (x_of(e), e.to_string()))
        .filter(|(x, t)| x + t.len() <= usize::from(width))
        .map(|(x, t)| (x as u16, t))
        .collect()
}

pub(super) fn render_emap(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let title = match &d.emap {
        Some(e) => format!("experts: {} MoE layers ↓ × {} experts →", e.rows, e.cols),
        None => "experts".to_string(),
    };
    let block = titled(&title).title_bottom(Line::from(vec![
        Span::styled(" ■", Style::new().fg(tier_colour(0))),
        Span::raw("disk "),
        Span::styled("■", Style::new().fg(tier_colour(1))),
        Span::raw("RAM "),
        Span::styled("■", Style::new().fg(tier_colour(2))),
        Span::raw("VRAM "),
        Span::styled("■", Style::new().fg(Color::White)),
        Span::raw("hit "),
    ]));
    let inner = block.inner(area);
    block.render(area, buf);
    let Some(e) = &d.emap else {
        Paragraph::new(Line::styled(
            "waiting for EMAP…",
            Style::new().fg(Color::DarkGray),
        ))
        .render(inner, buf);
        return;
    };
    let (rows, cols) = (e.rows as usize, e.cols as usize);
    if rows == 0 || cols == 0 || inner.width == 0 || inner.height == 0 {
        return;
    }
    // Labels (layer numbers on the left, expert numbers on top) when there is room for them
    // and a map beside them.
    let gw = gutter(rows);
    let labelled = inner.width >= gw + 8 && inner.height >= 3;
    let map = if labelled {
        Rect::new(
            inner.x + gw,
            inner.y + 1,
            inner.width - gw,
            inner.height - 1,
        )
    } else {
        inner
    };
    let label_style = Style::new().fg(Color::DarkGray);
    // Each terminal cell shows two pixels (▀: fg top, bg bottom).
    let (xs, xz) = scale(cols, usize::from(map.width));
    let (ys, yz) = scale(rows, usize::from(map.height) * 2);
    let yz = even_zoom(yz);
    if labelled {
        for (x, text) in column_labels(cols, xs, xz, map.width) {
            buf.set_string(map.x + x, inner.y, text, label_style);
        }
    }
    let px_w = (cols.div_ceil(xs) * xz).min(usize::from(map.width));
    let px_h = (rows.div_ceil(ys) * yz).min(usize::from(map.height) * 2);
    let pixel = |px: usize, py: usize| -> Option<Color> {
        if px >= px_w || py >= px_h {
            return None;
        }
        let (c0, r0) = ((px / xz) * xs, (py / yz) * ys);
        let (mut tier, mut heat, mut pulse) = (0u8, 0u8, 0f32);
        for r in r0..(r0 + ys).min(rows) {
            for c in c0..(c0 + xs).min(cols) {
                let i = r * cols + c;
                let byte = e.cells.get(i).copied().unwrap_or(0);
                tier = tier.max(byte >> 6);
                heat = heat.max(byte & 0x3f);
                pulse = pulse.max(d.pulse.get(i).copied().unwrap_or(0.0));
            }
        }
        Some(cell_colour(tier, heat, pulse))
    };
    let mut last_label = None;
    for cy in 0..map.height {
        let py = usize::from(cy) * 2;
        if labelled && py < px_h {
            // The map row starting on this terminal row (its top pixel), once per row.
            let row = (py / yz) * ys;
            if last_label != Some(row) && (yz < 2 || py % yz == 0) {
                last_label = Some(row);
                buf.set_string(inner.x, map.y + cy, row.to_string(), label_style);
            }
        }
        for cx in 0..map.width {
            let top = pixel(usize::from(cx), py);
            let bottom = pixel(usize::from(cx), py + 1);
            let cell = &mut buf[(map.x + cx, map.y + cy)];
            match (top, bottom) {
                (Some(t), Some(b)) => {
                    cell.set_char('▀').set_fg(t).set_bg(b);
                }
                (Some(t), None) => {
                    cell.set_char('▀').set_fg(t);
                }
                _ => {}
            }
        }
    }
}
