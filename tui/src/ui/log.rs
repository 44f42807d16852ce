//! The stderr log pane, coloured by severity so errors stand out in the daemon's chatter.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Widget};

use super::common::focus_style;
use crate::app::{App, Focus};

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
