//! What is drawn over the panes: the box explaining why colibri stopped, and the help.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Borders, Clear, Paragraph, Widget, Wrap};

use crate::app::App;

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

pub(super) fn render_dead(app: &App, area: Rect, buf: &mut Buffer) {
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
    (":set temp T", "temperature 0..=2 of the next turns"),
    (":set top_p P", "nucleus (0, 1] of the next turns"),
    (":set max N", "answer budget (--ngen caps it unless --mux)"),
    (":q", "quit"),
    ("r", "restart colibri after it stopped"),
];

pub(super) fn render_help(area: Rect, buf: &mut Buffer) {
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
