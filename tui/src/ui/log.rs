//! The stderr log pane, coloured by severity so errors stand out in the daemon's chatter.
//! Long lines wrap (a path or an error's reason is at the end of the line); the scroll
//! position counts wrapped rows from the bottom.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Widget, Wrap};

use super::common::focus_style;
use crate::app::{App, Focus};

/// Where the log's text goes inside its pane (below the title line).
pub fn log_inner(area: Rect) -> Rect {
    Block::new().borders(Borders::TOP).inner(area)
}

/// Rows one log line takes at `width` columns.
fn rows(line: &str, width: u16) -> usize {
    Paragraph::new(Line::raw(line))
        .wrap(Wrap { trim: false })
        .line_count(width)
        .max(1)
}

/// Wrapped rows of the whole log at `width` columns (the key handlers' scroll limit).
pub fn log_row_count(app: &App, width: u16) -> usize {
    app.log.iter().map(|l| rows(l, width)).sum()
}

pub(super) fn render_log(app: &App, area: Rect, buf: &mut Buffer) {
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
    let inner = log_inner(area);
    block.render(area, buf);
    if inner.height == 0 || inner.width == 0 {
        return;
    }
    // Only the lines that reach into the window are laid out.
    let h = usize::from(inner.height);
    let want = h + app.log_scroll;
    let mut have = 0usize;
    let mut first = app.log.len();
    while first > 0 && have < want {
        first -= 1;
        have += rows(&app.log[first], inner.width);
    }
    let lines: Vec<Line> = app
        .log
        .range(first..)
        .map(|l| Line::styled(l.as_str(), log_style(l)))
        .collect();
    let scroll = app.log_scroll.min(have.saturating_sub(h));
    let top = have.saturating_sub(h + scroll);
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .scroll((top.min(usize::from(u16::MAX)) as u16, 0))
        .render(inner, buf);
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
