//! The sessions panel (mux mode): every slot the daemon's last SESSIONS line listed, with
//! its state, context tokens and generated count; busy sessions first, so that with hundreds
//! of slots the ones doing something are the ones that fit.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

use protocol::{SessionInfo, SessionState};

use super::common::{thousands, titled};
use crate::app::App;

/// The word and colour of a session state.
pub fn session_label(state: SessionState) -> (&'static str, Color) {
    match state {
        SessionState::Prefill => ("prefilling", Color::Magenta),
        SessionState::Decode => ("decoding", Color::Cyan),
        SessionState::Idle => ("idle", Color::DarkGray),
    }
}

/// Busy sessions first, each group in slot order.
fn ordered(list: &[SessionInfo]) -> Vec<&SessionInfo> {
    let mut v: Vec<&SessionInfo> = list.iter().collect();
    v.sort_by_key(|s| (s.state == SessionState::Idle, s.slot));
    v
}

/// Rows the panel wants (border included): one per session, at most `max_rows` of them.
pub(super) fn sessions_height(app: &App, max_rows: u16) -> u16 {
    match &app.dash.sessions {
        None => 0,
        Some(list) => (list.len().max(1) as u16).min(max_rows) + 2,
    }
}

pub(super) fn render_sessions(app: &App, area: Rect, buf: &mut Buffer) {
    let Some(list) = &app.dash.sessions else {
        return;
    };
    let busy = list
        .iter()
        .filter(|s| s.state != SessionState::Idle)
        .count();
    let block = titled(&format!("sessions ({busy} busy / {})", list.len()));
    let inner = block.inner(area);
    block.render(area, buf);
    if inner.height == 0 {
        return;
    }
    if list.is_empty() {
        Paragraph::new(Line::styled("no slots", Style::new().fg(Color::DarkGray)))
            .render(inner, buf);
        return;
    }
    let lines: Vec<Line> = ordered(list)
        .into_iter()
        .take(usize::from(inner.height))
        .map(|s| {
            let (word, colour) = session_label(s.state);
            let mark = if s.slot == app.slot && !app.attached() {
                "›"
            } else {
                " "
            };
            let mut spans = vec![
                Span::styled(format!("{mark}slot {:<3} ", s.slot), Style::new().bold()),
                Span::styled(format!("{word:<10}"), Style::new().fg(colour)),
                Span::raw(format!(
                    " ctx {:>7}  gen {:>6}",
                    thousands(s.ctx_tokens),
                    thousands(s.generated)
                )),
            ];
            if s.id != 0 {
                spans.push(Span::styled(
                    format!("  #{}", s.id),
                    Style::new().fg(Color::DarkGray),
                ));
            }
            Line::from(spans)
        })
        .collect();
    Paragraph::new(lines).render(inner, buf);
}

/// The summary line's part: `sessions decode 1 prefill 1 idle 2`.
pub(super) fn sessions_summary(app: &App) -> Option<Vec<Span<'static>>> {
    let list = app.dash.sessions.as_ref()?;
    let count = |st| list.iter().filter(|s| s.state == st).count();
    let mut spans = vec![Span::raw("sessions")];
    for st in [
        SessionState::Decode,
        SessionState::Prefill,
        SessionState::Idle,
    ] {
        let n = count(st);
        if n > 0 || (st == SessionState::Idle && list.is_empty()) {
            let word = match st {
                SessionState::Decode => "decode",
                SessionState::Prefill => "prefill",
                SessionState::Idle => "idle",
            };
            spans.push(Span::styled(
                format!(" {word} {n}"),
                Style::new().fg(session_label(st).1),
            ));
        }
    }
    Some(spans)
}
