//! The input box, and where the terminal cursor goes in it: both scroll the text the same
//! way, so the cursor stays on the character it edits.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Widget};

use super::common::focus_style;
use crate::app::{App, Focus};

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

pub(super) fn input_cursor(app: &App, area: Rect) -> Option<(u16, u16)> {
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

pub(super) fn render_input(app: &App, area: Rect, buf: &mut Buffer) {
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
