//! The status bar: the phase and the figures of the current or last turn, always visible
//! whatever else fits.

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style, Stylize};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Widget};

use super::common::{progress_label, spinner};
use crate::app::{App, Phase};

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
    // Upstream's `swap %.0f%%` under CACHE_ROUTE: the routing, and so the output, is approximate.
    if let Some(s) = f.swap_pct {
        spans.push(Span::styled(
            format!(" swap {s:.0}%"),
            Style::new().fg(Color::Yellow),
        ));
    }
    spans.push(sep());
    spans.push(Span::raw(format!("RSS {:.2} GB", f.rss_gb)));
    spans.push(sep());
    match f.prompt_tokens {
        Some(p) => spans.push(Span::raw(format!("prompt {p} · tok {}", f.tokens))),
        None => spans.push(Span::raw(format!("tok {}", f.tokens))),
    }
    spans.push(sep());
    // Attached, the server gives each request a session: there is no slot to name.
    spans.push(Span::raw(if app.attached() {
        "attached".to_string()
    } else {
        format!("slot {}", app.slot)
    }));
    if let Some((msg, _)) = &app.flash {
        spans.push(sep());
        spans.push(Span::styled(msg.clone(), Style::new().fg(Color::Yellow)));
    }
    // Too wide for the terminal (80 columns while generating): tighter separators before
    // anything is cut.
    let width: usize = spans.iter().map(|s| s.width()).sum();
    if width > usize::from(app.size.0) {
        for s in spans.iter_mut().filter(|s| s.content == " │ ") {
            s.content = "│".into();
        }
    }
    spans
}

pub(super) fn render_status(app: &App, area: Rect, buf: &mut Buffer) {
    if area.height == 0 {
        return;
    }
    Paragraph::new(Line::from(status_spans(app)))
        .style(Style::new().bg(Color::Rgb(0x20, 0x24, 0x28)))
        .render(area, buf);
}
