//! Glyphs, styles and number formats shared by several panes, kept in one place so the
//! panes cannot drift apart in how they show the same thing.

use ratatui::style::{Color, Style};
use ratatui::text::Span;
use ratatui::widgets::{Block, Borders};

pub(super) fn spinner(ticks: u64) -> char {
    const FRAMES: [char; 8] = ['⣾', '⣽', '⣻', '⢿', '⡿', '⣟', '⣯', '⣷'];
    FRAMES[(ticks % 8) as usize]
}

pub(super) fn focus_style(focused: bool) -> Style {
    if focused {
        Style::new().fg(Color::Cyan)
    } else {
        Style::new().fg(Color::DarkGray)
    }
}

pub(super) fn progress_label(done: u64, total: u64) -> String {
    match (u128::from(done.min(total)) * 100).checked_div(u128::from(total)) {
        Some(pct) => format!("{pct}%"),
        None => format!("{done}"),
    }
}

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

pub(super) fn gb(bytes: u64) -> f64 {
    bytes as f64 / 1e9
}

pub(super) fn titled(title: &str) -> Block<'static> {
    Block::new()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(Color::DarkGray))
        .title(Span::styled(
            format!(" {title} "),
            Style::new().fg(Color::Gray),
        ))
}
