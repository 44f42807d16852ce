//! The conversation pane: turning turns (answers streamed as raw bytes, thinking blocks,
//! notices) into lines, and showing the window of them the scroll position asks for.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph, Widget, Wrap};

use protocol::ProgressPhase;

use super::common::{focus_style, spinner};
use crate::app::{App, Focus, Phase, Role, Stage, Turn};

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

/// Mux mode interleaves the turns of several slots: each user line and answer starts with
/// its slot, `[N] `.
fn slot_tag(turn: &Turn, app: &App) -> Option<Span<'static>> {
    app.config.mux.then(|| {
        Span::styled(
            format!("[{}] ", turn.slot),
            Style::new().fg(Color::DarkGray),
        )
    })
}

/// The (unwrapped) lines of one turn.
pub fn turn_lines(turn: &Turn, app: &App) -> Vec<Line<'static>> {
    let mut lines: Vec<Line<'static>> = Vec::new();
    match turn.role {
        Role::User => {
            let text = String::from_utf8_lossy(&turn.bytes);
            for (i, l) in text.split('\n').enumerate() {
                let prefix = if i == 0 { "› " } else { "  " };
                let mut spans = vec![Span::styled(prefix, Style::new().fg(Color::Cyan).bold())];
                if i == 0 {
                    spans.extend(slot_tag(turn, app));
                }
                spans.push(Span::styled(
                    crate::app::sanitize(l),
                    Style::new().fg(Color::Cyan),
                ));
                lines.push(Line::from(spans));
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
            let mut cur: Vec<Span<'static>> = slot_tag(turn, app).into_iter().collect();
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
                        format!("{} {}", spinner(app.ticks), waiting_label(turn, app)),
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

fn waiting_label(turn: &Turn, app: &App) -> String {
    if app.config.mux {
        let stage = turn
            .request
            .and_then(|id| app.mux.inflight.get(&id))
            .map(|r| r.stage);
        return match stage {
            Some(Stage::Queued) => "waiting for colibri…".into(),
            Some(Stage::Prefill { prompt_tokens }) => format!("prefill {prompt_tokens} tokens"),
            _ => "thinking…".into(),
        };
    }
    match &app.dash.progress {
        Some(p) if p.phase == ProgressPhase::Prefill && p.total > 0 => {
            format!("prefill {}/{} tokens", p.done, p.total)
        }
        _ => "thinking…".into(),
    }
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

pub(super) fn render_conversation(app: &App, area: Rect, buf: &mut Buffer) {
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
        let mut block = Block::new()
            .borders(Borders::TOP)
            .title(title.clone())
            .border_style(focus_style(focused));
        // The header: the model the daemon named on stderr (`[MODEL] ...`), right-aligned,
        // cut to the room the title leaves.
        if let Some(model) = &app.daemon.model {
            let room = usize::from(area.width).saturating_sub(title.chars().count() + 4);
            if room >= 8 {
                let mut text: String = model.chars().take(room.saturating_sub(2)).collect();
                if text.chars().count() < model.chars().count() {
                    text.pop();
                    text.push('…');
                }
                block = block.title_top(
                    Line::styled(format!(" {text} "), Style::new().fg(Color::Gray)).right_aligned(),
                );
            }
        }
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
                    "? help · :reset · :more · :slot N · :set · F2 dashboard · Ctrl-C stop/quit",
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
