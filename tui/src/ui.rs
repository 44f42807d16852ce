//! Pure rendering of [`App`]: `impl Widget for &App` and [`draw`], which never mutate, and
//! [`layout`], the one function that decides where everything goes (used by the key
//! handlers too, for page sizes).
//!
//! Screen, top to bottom: the conversation (and the stderr log when it has room or focus),
//! the input box, the status bar. The dashboard sits beside the chat at >= 120 columns,
//! below it when there are >= 36 rows, and collapses to a one-line summary otherwise.

use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Borders, Clear, Gauge, Paragraph, Sparkline, Widget, Wrap};
use ratatui::Frame;

use protocol::{DiskClassFigures, ProgressPhase};

use crate::app::{App, Focus, Phase, Role, Turn};

/// From this width on, the dashboard goes beside the chat.
pub const SIDE_MIN_WIDTH: u16 = 120;
/// Below [`SIDE_MIN_WIDTH`], from this height on, the dashboard goes below the chat.
pub const BELOW_MIN_HEIGHT: u16 = 36;

/// Tier colours (upstream's web dashboard): disk, RAM, VRAM.
pub const TIER_RGB: [(u8, u8, u8); 3] =
    [(0x3a, 0x47, 0x50), (0x5a, 0x9b, 0xd8), (0x4e, 0xd6, 0xa5)];

/// Where the dashboard goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DashArea {
    /// Off (F2).
    Hidden,
    /// One line above the input.
    Summary(Rect),
    /// A column right of the chat.
    Side(Rect),
    /// A band below the conversation.
    Below(Rect),
}

/// Where each pane goes on a screen of a given size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AppLayout {
    /// The conversation.
    pub conversation: Rect,
    /// The stderr log, when shown.
    pub log: Option<Rect>,
    /// The input box.
    pub input: Rect,
    /// The status bar.
    pub status: Rect,
    /// The dashboard.
    pub dashboard: DashArea,
}

/// The layout for `area`: a pure function of the size and the app's toggles.
pub fn layout(area: Rect, app: &App) -> AppLayout {
    let status = Rect::new(
        area.x,
        area.bottom().saturating_sub(1),
        area.width,
        area.height.min(1),
    );
    let body = Rect::new(area.x, area.y, area.width, area.height.saturating_sub(1));
    let input_h = (app.input.lines().len().clamp(1, 6) as u16 + 1).min(body.height);

    let side = app.show_dashboard && area.width >= SIDE_MIN_WIDTH && body.height >= 12;
    let (chat_col, mut dashboard) = if side {
        let dash_w = (area.width * 2 / 5).clamp(48, 96);
        let [left, right] =
            Layout::horizontal([Constraint::Min(0), Constraint::Length(dash_w)]).areas(body);
        (left, DashArea::Side(right))
    } else {
        (body, DashArea::Hidden)
    };
    let input = Rect::new(
        chat_col.x,
        chat_col.bottom().saturating_sub(input_h),
        chat_col.width,
        input_h,
    );
    let mut upper = Rect::new(
        chat_col.x,
        chat_col.y,
        chat_col.width,
        chat_col.height.saturating_sub(input_h),
    );
    if app.show_dashboard && !side {
        if area.height >= BELOW_MIN_HEIGHT {
            let dash_h = (upper.height * 2 / 5).clamp(14, 24).min(upper.height);
            dashboard = DashArea::Below(Rect::new(
                upper.x,
                upper.bottom() - dash_h,
                upper.width,
                dash_h,
            ));
            upper.height -= dash_h;
        } else if upper.height >= 2 {
            dashboard = DashArea::Summary(Rect::new(upper.x, upper.bottom() - 1, upper.width, 1));
            upper.height -= 1;
        }
    }
    let log_h = if app.focus == Focus::Log {
        upper.height / 2
    } else if upper.height >= 30 {
        7
    } else {
        0
    };
    let log = (log_h >= 2).then(|| Rect::new(upper.x, upper.bottom() - log_h, upper.width, log_h));
    let conversation = Rect::new(
        upper.x,
        upper.y,
        upper.width,
        upper.height - if log.is_some() { log_h } else { 0 },
    );
    AppLayout {
        conversation,
        log,
        input,
        status,
        dashboard,
    }
}

/// Renders the app and places the terminal cursor in the input box.
pub fn draw(frame: &mut Frame, app: &App) {
    let area = frame.area();
    frame.render_widget(app, area);
    if app.focus == Focus::Input && !app.show_help {
        let l = layout(area, app);
        if let Some((x, y)) = input_cursor(app, l.input) {
            frame.set_cursor_position((x, y));
        }
    }
}

impl Widget for &App {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.width == 0 || area.height == 0 {
            return;
        }
        let l = layout(area, self);
        render_conversation(self, l.conversation, buf);
        if let Some(r) = l.log {
            render_log(self, r, buf);
        }
        render_input(self, l.input, buf);
        match l.dashboard {
            DashArea::Hidden => {}
            DashArea::Summary(r) => render_summary(self, r, buf),
            DashArea::Side(r) => render_dashboard_side(self, r, buf),
            DashArea::Below(r) => render_dashboard_below(self, r, buf),
        }
        render_status(self, l.status, buf);
        if self.phase == Phase::Dead {
            render_dead(self, l.conversation, buf);
        }
        if self.show_help {
            render_help(area, buf);
        }
    }
}

// ----- conversation -----------------------------------------------------------------------

/// The text of an answer for display: invalid UTF-8 as U+FFFD, except an incomplete sequence
/// at the end of a streaming answer (the rest of the character is on its way).
pub fn display_text(bytes: &[u8], streaming: bool) -> String {
    let bytes = if streaming {
        match std::str::from_utf8(bytes) {
            Ok(_) => bytes,
            Err(e) if e.error_len().is_none() => &bytes[..e.valid_up_to()],
            Err(_) => {
                // Invalid in the middle; still hold back an incomplete tail.
                let tail_start = bytes.len().saturating_sub(3);
                let cut = (tail_start..bytes.len())
                    .find(|&i| {
                        bytes[i] >= 0xc0
                            && matches!(std::str::from_utf8(&bytes[i..]), Err(e) if e.error_len().is_none())
                    })
                    .unwrap_or(bytes.len());
                &bytes[..cut]
            }
        }
    } else {
        bytes
    };
    String::from_utf8_lossy(bytes).into_owned()
}

/// Splits an answer into (is_thinking, text) runs. `<think>` opens a block and `</think>`
/// closes it (tags included in the block); a `</think>` before any `<think>` means the
/// answer started inside one (the prompt ended with `<think>`, THINK=1).
pub fn think_runs(text: &str) -> Vec<(bool, &str)> {
    const OPEN: &str = "<think>";
    const CLOSE: &str = "</think>";
    let mut runs = Vec::new();
    let mut in_think = match (text.find(OPEN), text.find(CLOSE)) {
        (None, Some(_)) => true,
        (Some(o), Some(c)) => c < o,
        _ => false,
    };
    let mut rest = text;
    while !rest.is_empty() {
        if in_think {
            match rest.find(CLOSE) {
                Some(i) => {
                    runs.push((true, &rest[..i + CLOSE.len()]));
                    rest = &rest[i + CLOSE.len()..];
                    in_think = false;
                }
                None => {
                    runs.push((true, rest));
                    rest = "";
                }
            }
        } else {
            match rest.find(OPEN) {
                Some(i) => {
                    if i > 0 {
                        runs.push((false, &rest[..i]));
                    }
                    rest = &rest[i..];
                    in_think = true;
                    // The block starts with the tag itself.
                    match rest[OPEN.len()..].find(CLOSE) {
                        Some(j) => {
                            let end = OPEN.len() + j + CLOSE.len();
                            runs.push((true, &rest[..end]));
                            rest = &rest[end..];
                            in_think = false;
                        }
                        None => {
                            runs.push((true, rest));
                            rest = "";
                        }
                    }
                }
                None => {
                    runs.push((false, rest));
                    rest = "";
                }
            }
        }
    }
    runs
}

fn think_style() -> Style {
    Style::new()
        .fg(Color::DarkGray)
        .add_modifier(Modifier::ITALIC)
}

/// The (unwrapped) lines of one turn.
pub fn turn_lines(turn: &Turn, app: &App) -> Vec<Line<'static>> {
    let mut lines: Vec<Line<'static>> = Vec::new();
    match turn.role {
        Role::User => {
            let text = String::from_utf8_lossy(&turn.bytes);
            for (i, l) in text.split('\n').enumerate() {
                let prefix = if i == 0 { "› " } else { "  " };
                lines.push(Line::from(vec![
                    Span::styled(prefix, Style::new().fg(Color::Cyan).bold()),
                    Span::styled(crate::app::sanitize(l), Style::new().fg(Color::Cyan)),
                ]));
            }
        }
        Role::Notice => {
            let text = String::from_utf8_lossy(&turn.bytes);
            for l in text.split('\n') {
                lines.push(Line::styled(
                    format!("• {}", crate::app::sanitize(l)),
                    Style::new().fg(Color::Yellow),
                ));
            }
        }
        Role::Assistant => {
            let text = display_text(&turn.bytes, turn.streaming);
            let mut cur: Vec<Span<'static>> = Vec::new();
            for (think, run) in think_runs(&text) {
                let style = if think { think_style() } else { Style::new() };
                for (i, piece) in run.split('\n').enumerate() {
                    if i > 0 {
                        lines.push(Line::from(std::mem::take(&mut cur)));
                    }
                    if !piece.is_empty() {
                        cur.push(Span::styled(crate::app::sanitize(piece), style));
                    }
                }
            }
            if turn.streaming {
                if text.is_empty() {
                    cur.push(Span::styled(
                        format!("{} {}", spinner(app.ticks), waiting_label(app)),
                        Style::new().fg(Color::DarkGray),
                    ));
                } else {
                    cur.push(Span::styled("▌", Style::new().fg(Color::Green)));
                }
            }
            lines.push(Line::from(cur));
            if let Some(f) = &turn.footer {
                lines.push(Line::styled(f.clone(), Style::new().fg(Color::DarkGray)));
            }
        }
    }
    lines
}

fn waiting_label(app: &App) -> String {
    match &app.dash.progress {
        Some(p) if p.phase == ProgressPhase::Prefill && p.total > 0 => {
            format!("prefill {}/{} tokens", p.done, p.total)
        }
        _ => "thinking…".into(),
    }
}

fn spinner(ticks: u64) -> char {
    const FRAMES: [char; 8] = ['⣾', '⣽', '⣻', '⢿', '⡿', '⣟', '⣯', '⣷'];
    FRAMES[(ticks % 8) as usize]
}

fn turn_paragraph(turn: &Turn, app: &App) -> Paragraph<'static> {
    Paragraph::new(turn_lines(turn, app)).wrap(Wrap { trim: false })
}

/// Wrapped lines of the whole conversation at `width` columns (one blank line between
/// turns). The scroll limit of the key handlers uses it.
pub fn conversation_line_count(app: &App, width: u16) -> usize {
    let n = app.turns.len();
    app.turns
        .iter()
        .map(|t| turn_paragraph(t, app).line_count(width))
        .sum::<usize>()
        + n.saturating_sub(1)
}

/// Whether the conversation pane is tall enough for its title line.
fn has_title(area: Rect) -> bool {
    area.height >= 8
}

/// Where the conversation's text goes inside its pane.
pub fn conversation_inner(area: Rect) -> Rect {
    if has_title(area) {
        Rect::new(area.x, area.y + 1, area.width, area.height - 1)
    } else {
        area
    }
}

fn render_conversation(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 || area.width == 0 {
        return;
    }
    let focused = app.focus == Focus::Conversation;
    let inner = if has_title(area) {
        let title = if app.conv_scroll > 0 {
            format!(" conversation ↑{} ", app.conv_scroll)
        } else {
            " conversation ".to_string()
        };
        let block = Block::new()
            .borders(Borders::TOP)
            .title(title)
            .border_style(focus_style(focused));
        block.render(area, buf);
        conversation_inner(area)
    } else {
        area
    };
    if inner.height == 0 {
        return;
    }
    if app.turns.is_empty() {
        let msg = match app.phase {
            Phase::Loading => vec![
                Line::from(format!("{} waking colibri…", spinner(app.ticks))),
                Line::from(Span::styled(
                    app.config.daemon_desc.clone(),
                    Style::new().fg(Color::DarkGray),
                )),
            ],
            _ => vec![
                Line::from("colibri is ready: type a message and press Enter."),
                Line::from(Span::styled(
                    "? help · :reset · :more · :slot N · F2 dashboard · Ctrl-C stop/quit",
                    Style::new().fg(Color::DarkGray),
                )),
            ],
        };
        Paragraph::new(msg)
            .wrap(Wrap { trim: false })
            .render(inner, buf);
        return;
    }
    // Only the turns that reach into the window are laid out.
    let want = usize::from(inner.height) + app.conv_scroll;
    let mut have = 0usize;
    let mut first = app.turns.len();
    while first > 0 && have < want {
        first -= 1;
        have += turn_paragraph(&app.turns[first], app).line_count(inner.width);
        if first + 1 < app.turns.len() {
            have += 1;
        }
    }
    let mut lines: Vec<Line> = Vec::new();
    for (i, t) in app.turns[first..].iter().enumerate() {
        if i > 0 {
            lines.push(Line::default());
        }
        lines.extend(turn_lines(t, app));
    }
    let scroll = app
        .conv_scroll
        .min(have.saturating_sub(usize::from(inner.height)));
    let top = have.saturating_sub(usize::from(inner.height) + scroll);
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .scroll((top.min(usize::from(u16::MAX)) as u16, 0))
        .render(inner, buf);
}

fn focus_style(focused: bool) -> Style {
    if focused {
        Style::new().fg(Color::Cyan)
    } else {
        Style::new().fg(Color::DarkGray)
    }
}

fn render_log(app: &App, area: Rect, buf: &mut Buffer) {
    let focused = app.focus == Focus::Log;
    let title = if app.log_scroll > 0 {
        format!(" log (stderr) ↑{} ", app.log_scroll)
    } else {
        " log (stderr) ".to_string()
    };
    let block = Block::new()
        .borders(Borders::TOP)
        .title(title)
        .border_style(focus_style(focused));
    let inner = block.inner(area);
    block.render(area, buf);
    let h = usize::from(inner.height);
    let end = app.log.len().saturating_sub(app.log_scroll);
    let start = end.saturating_sub(h);
    let lines: Vec<Line> = app
        .log
        .range(start..end)
        .map(|l| Line::styled(l.as_str(), log_style(l)))
        .collect();
    Paragraph::new(lines).render(inner, buf);
}

fn log_style(line: &str) -> Style {
    let lower = line.to_ascii_lowercase();
    if lower.contains("error") || lower.contains("panic") || lower.contains("fatal") {
        Style::new().fg(Color::Red)
    } else if lower.contains("warn") {
        Style::new().fg(Color::Yellow)
    } else {
        Style::new().fg(Color::Gray)
    }
}

/// The input box's text area (inside its border).
fn input_inner(area: Rect) -> Rect {
    Rect::new(
        area.x,
        area.y.saturating_add(1).min(area.bottom()),
        area.width,
        area.height.saturating_sub(1),
    )
}

fn input_offsets(app: &App, inner: Rect) -> (usize, usize, u16, u16) {
    let (row, before) = app.input.cursor_line();
    let col = Line::from(before).width();
    let row_off = row.saturating_sub(usize::from(inner.height.max(1)) - 1);
    let col_off = col.saturating_sub(usize::from(inner.width.max(1)) - 1);
    (
        row_off,
        col_off,
        (row - row_off) as u16,
        (col - col_off) as u16,
    )
}

fn input_cursor(app: &App, area: Rect) -> Option<(u16, u16)> {
    let inner = input_inner(area);
    if inner.width == 0 || inner.height == 0 {
        return None;
    }
    let (_, _, r, c) = input_offsets(app, inner);
    Some((
        inner.x + c.min(inner.width - 1),
        inner.y + r.min(inner.height - 1),
    ))
}

fn render_input(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    let focused = app.focus == Focus::Input;
    let hint = if area.width >= 60 {
        " message · Enter send · Alt-Enter newline · ? help "
    } else {
        " message "
    };
    let title = if app.slot != 0 {
        format!("{hint}· slot {} ", app.slot)
    } else {
        hint.to_string()
    };
    Block::new()
        .borders(Borders::TOP)
        .title(title)
        .border_style(focus_style(focused))
        .render(area, buf);
    let inner = input_inner(area);
    if inner.height == 0 {
        return;
    }
    let (row_off, col_off, _, _) = input_offsets(app, inner);
    let lines: Vec<Line> = app
        .input
        .lines()
        .into_iter()
        .map(|l| Line::from(crate::app::sanitize(l)))
        .collect();
    Paragraph::new(lines)
        .scroll((row_off as u16, col_off as u16))
        .render(inner, buf);
}

// ----- status bar -------------------------------------------------------------------------

/// The status bar's text (also used by tests).
pub fn status_spans(app: &App) -> Vec<Span<'static>> {
    let (glyph, colour) = match app.phase {
        Phase::Loading => (spinner(app.ticks), Color::Yellow),
        Phase::Idle => ('●', Color::Green),
        Phase::Prefill => (spinner(app.ticks), Color::Magenta),
        Phase::Generating => (spinner(app.ticks), Color::Cyan),
        Phase::Dead => ('✖', Color::Red),
    };
    let mut phase = app.phase.label().to_string();
    if let Some(p) = &app.dash.progress {
        if matches!(app.phase, Phase::Loading | Phase::Prefill) {
            phase = format!("{} {}", p.phase.as_str(), progress_label(p.done, p.total));
        }
    }
    let f = &app.figures;
    let mut spans = vec![Span::styled(
        format!(" {glyph} {phase} "),
        Style::new().fg(Color::Black).bg(colour).bold(),
    )];
    let sep = || Span::styled(" │ ", Style::new().fg(Color::DarkGray));
    spans.push(Span::raw(format!(" {:.2} tok/s", f.tok_per_s)));
    spans.push(sep());
    spans.push(Span::raw(format!("hit {:.1}%", f.hit_pct)));
    spans.push(sep());
    spans.push(Span::raw(format!("RSS {:.2} GB", f.rss_gb)));
    spans.push(sep());
    match f.prompt_tokens {
        Some(p) => spans.push(Span::raw(format!("prompt {p} · tok {}", f.tokens))),
        None => spans.push(Span::raw(format!("tok {}", f.tokens))),
    }
    spans.push(sep());
    spans.push(Span::raw(format!("slot {}", app.slot)));
    if let Some((msg, _)) = &app.flash {
        spans.push(sep());
        spans.push(Span::styled(msg.clone(), Style::new().fg(Color::Yellow)));
    }
    spans
}

fn progress_label(done: u64, total: u64) -> String {
    match (u128::from(done.min(total)) * 100).checked_div(u128::from(total)) {
        Some(pct) => format!("{pct}%"),
        None => format!("{done}"),
    }
}

fn render_status(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    Paragraph::new(Line::from(status_spans(app)))
        .style(Style::new().bg(Color::Rgb(0x20, 0x24, 0x28)))
        .render(area, buf);
}

// ----- dashboard --------------------------------------------------------------------------

/// `19456` -> `19,456`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn tier_colour(tier: usize) -> Color {
    let (r, g, b) = TIER_RGB[tier.min(2)];
    Color::Rgb(r, g, b)
}

fn titled(title: &str) -> Block<'static> {
    Block::new()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(Color::DarkGray))
        .title(Span::styled(
            format!(" {title} "),
            Style::new().fg(Color::Gray),
        ))
}

fn render_summary(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let dim = Style::new().fg(Color::DarkGray);
    let mut spans: Vec<Span> = Vec::new();
    if let Some(p) = &d.progress {
        spans.push(Span::styled(
            format!("{} {} ", p.phase.as_str(), progress_label(p.done, p.total)),
            Style::new().fg(Color::Yellow),
        ));
        spans.push(Span::styled("│ ", dim));
    }
    match &d.tiers {
        Some(t) => {
            spans.push(Span::styled("■", Style::new().fg(tier_colour(2))));
            spans.push(Span::raw(format!(
                "VRAM {} ",
                thousands(t.vram_experts.into())
            )));
            spans.push(Span::styled("■", Style::new().fg(tier_colour(1))));
            spans.push(Span::raw(format!(
                "RAM {} ",
                thousands(t.ram_experts.into())
            )));
            spans.push(Span::styled("■", Style::new().fg(tier_colour(0))));
            spans.push(Span::raw(format!(
                "disk {} ",
                thousands(t.disk_experts.into())
            )));
        }
        None => spans.push(Span::styled("tiers … ", dim)),
    }
    spans.push(Span::styled("│ ", dim));
    spans.push(Span::raw("hit "));
    spans.push(Span::styled(
        mini_spark(&d.hit_hist, 8, Some(100.0)),
        Style::new().fg(Color::Green),
    ));
    spans.push(Span::styled(" │ ", dim));
    spans.push(Span::raw("tok/s "));
    spans.push(Span::styled(
        mini_spark(&d.tps_hist, 8, None),
        Style::new().fg(Color::Cyan),
    ));
    if let Some(dc) = &d.disk {
        spans.push(Span::styled(" │ ", dim));
        spans.push(Span::raw(format!(
            "cold {:.1} GB warm {:.1} GB",
            gb(dc.cold.bytes),
            gb(dc.warm.bytes)
        )));
    }
    if d.repin_total > 0 {
        spans.push(Span::styled(" │ ", dim));
        spans.push(Span::raw(format!("repin {}", d.repin_total)));
    }
    spans.push(Span::styled(" │ F2", dim));
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

fn gb(bytes: u64) -> f64 {
    bytes as f64 / 1e9
}

fn render_dashboard_side(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let hw_h = u16::from(d.hwinfo.is_some());
    let prog_h = u16::from(d.progress.is_some());
    let repin_h = (d.repins.len() as u16).clamp(1, 6) + 2;
    let map_h = emap_height(app, area.width.saturating_sub(2));
    let [hw, prog, tiers, map, rates, disk, repin] = Layout::vertical([
        Constraint::Length(hw_h),
        Constraint::Length(prog_h),
        Constraint::Length(5),
        Constraint::Max(map_h),
        Constraint::Length(6),
        Constraint::Length(4),
        Constraint::Min(repin_h),
    ])
    .areas(area);
    render_hwinfo(app, hw, buf);
    render_progress(app, prog, buf);
    render_tiers(app, tiers, buf);
    render_emap(app, map, buf);
    render_rates(app, rates, buf);
    render_disk(app, disk, buf);
    render_repins(app, repin, buf);
}

fn render_dashboard_below(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let [left, right] =
        Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let [tiers, map] = Layout::vertical([Constraint::Length(5), Constraint::Min(3)]).areas(left);
    render_tiers(app, tiers, buf);
    render_emap(app, map, buf);
    let hw_h = u16::from(d.hwinfo.is_some());
    let prog_h = u16::from(d.progress.is_some());
    let [hw, prog, rates, disk, repin] = Layout::vertical([
        Constraint::Length(hw_h),
        Constraint::Length(prog_h),
        Constraint::Length(6),
        Constraint::Length(4),
        Constraint::Min(3),
    ])
    .areas(right);
    render_hwinfo(app, hw, buf);
    render_progress(app, prog, buf);
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

fn render_tiers(app: &App, area: Rect, buf: &mut Buffer) {
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

/// Rows the expert map would like at `width` inner columns (borders included): square
/// pixels, two per terminal row.
fn emap_height(app: &App, width: u16) -> u16 {
    match &app.dash.emap {
        Some(e) if e.rows > 0 && e.cols > 0 => {
            let (_, xz) = scale(e.cols as usize, usize::from(width.max(1)));
            let px = e.rows as usize * xz;
            (px.div_ceil(2) + 2).min(200) as u16
        }
        _ => 6,
    }
}

fn render_emap(app: &App, area: Rect, buf: &mut Buffer) {
    let d = &app.dash;
    let title = match &d.emap {
        Some(e) => format!("experts {}×{}", e.rows, e.cols),
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
    // Each terminal cell shows two pixels (▀: fg top, bg bottom).
    let (xs, xz) = scale(cols, usize::from(inner.width));
    let (ys, yz) = scale(rows, usize::from(inner.height) * 2);
    let px_w = (cols.div_ceil(xs) * xz).min(usize::from(inner.width));
    let px_h = (rows.div_ceil(ys) * yz).min(usize::from(inner.height) * 2);
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
    for cy in 0..inner.height {
        for cx in 0..inner.width {
            let top = pixel(usize::from(cx), usize::from(cy) * 2);
            let bottom = pixel(usize::from(cx), usize::from(cy) * 2 + 1);
            let cell = &mut buf[(inner.x + cx, inner.y + cy)];
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

fn render_rates(app: &App, area: Rect, buf: &mut Buffer) {
    let block = titled("rates");
    let inner = block.inner(area);
    block.render(area, buf);
    if inner.height == 0 || inner.width < 14 {
        return;
    }
    let [top, bottom] =
        Layout::vertical([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).areas(inner);
    let d = &app.dash;
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
    Paragraph::new(vec![
        disk_line("cold", &dc.cold, rates.map(|r| r.cold_busy)),
        disk_line("warm", &dc.warm, rates.map(|r| r.warm_busy)),
    ])
    .render(inner, buf);
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

// ----- overlays ---------------------------------------------------------------------------

fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

fn render_dead(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height < 3 || area.width < 10 {
        return;
    }
    let mut lines = Vec::new();
    match (&app.exit, &app.spawn_error) {
        (Some(info), _) => {
            lines.push(Line::styled(
                format!("colibri {}", info.describe()),
                Style::new().fg(Color::Red).bold(),
            ));
            if let Some(hint) = info.oom_hint() {
                lines.push(Line::styled(hint, Style::new().fg(Color::Yellow)));
            }
        }
        (None, Some(err)) => lines.push(Line::styled(
            format!("could not start colibri: {err}"),
            Style::new().fg(Color::Red).bold(),
        )),
        (None, None) => lines.push(Line::from("colibri is not running")),
    }
    let tail: Vec<&str> = app.last_log_lines(6).collect();
    if !tail.is_empty() {
        lines.push(Line::styled(
            "last stderr lines:",
            Style::new().fg(Color::Gray),
        ));
        for l in tail {
            lines.push(Line::styled(
                format!("  {l}"),
                Style::new().fg(Color::DarkGray),
            ));
        }
    }
    lines.push(Line::from(vec![
        Span::styled("r", Style::new().bold()),
        Span::raw(" restart · "),
        Span::styled("q", Style::new().bold()),
        Span::raw(" or Ctrl-C quit"),
    ]));
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = centered(area, area.width.min(90), h);
    let r = Rect::new(r.x, area.bottom() - r.height, r.width, r.height);
    Clear.render(r, buf);
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .block(
            Block::new()
                .borders(Borders::ALL)
                .border_style(Style::new().fg(Color::Red))
                .title(" colibri stopped "),
        )
        .render(r, buf);
}

/// The help overlay's lines.
pub const HELP: &[(&str, &str)] = &[
    ("Enter", "send the message"),
    ("Alt/Shift-Enter", "new line (also Ctrl-J)"),
    ("Up / Down", "history (input), scroll (conversation, log)"),
    ("PgUp / PgDn", "scroll the conversation (or the log)"),
    ("Tab / Shift-Tab", "focus: input → conversation → log"),
    ("Esc", "back to the input"),
    ("F2", "dashboard on / off"),
    ("? or F1", "this help (? with an empty input)"),
    ("Ctrl-C", "stop the answer; again, or idle: quit"),
    ("Ctrl-D", "quit (empty input)"),
    (":reset", "forget this slot's conversation"),
    (":more", "continue the last answer"),
    (":slot N", "talk on KV slot N (N > 0 needs --kv-slots)"),
    (":q", "quit"),
    ("r", "restart colibri after it stopped"),
];

fn render_help(area: Rect, buf: &mut Buffer) {
    let mut lines: Vec<Line> = HELP
        .iter()
        .map(|(k, v)| {
            Line::from(vec![
                Span::styled(format!("{k:>16}  "), Style::new().fg(Color::Cyan).bold()),
                Span::raw(*v),
            ])
        })
        .collect();
    lines.push(Line::styled(
        "any key closes this help",
        Style::new().fg(Color::DarkGray),
    ));
    let r = centered(area, 66, lines.len() as u16 + 2);
    Clear.render(r, buf);
    Paragraph::new(Text::from(lines))
        .block(
            Block::new()
                .borders(Borders::ALL)
                .border_style(Style::new().fg(Color::Cyan))
                .title(" coli keys "),
        )
        .render(r, buf);
}
