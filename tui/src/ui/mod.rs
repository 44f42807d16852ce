//! Pure rendering of [`App`]: `impl Widget for &App` and [`draw`], which never mutate, and
//! [`layout()`], the one function that decides where everything goes (used by the key
//! handlers too, for page sizes).
//!
//! Screen, top to bottom: the conversation (and the stderr log when it has room or focus),
//! the input box, the status bar. The dashboard sits beside the chat at >= 120 columns,
//! below it when there are >= 36 rows, and collapses to a one-line summary otherwise.
//!
//! One module per pane: `layout` places them; `chat`, `log`, `input_box`, `status`,
//! `dashboard` (with `tiers` for the expert panels and `sessions` for mux mode's) and
//! `overlays` draw them; `common` holds
//! the glyphs, styles and number formats more than one of them uses.

mod chat;
mod common;
mod dashboard;
mod input_box;
mod layout;
mod log;
mod overlays;
mod sessions;
mod status;
mod tiers;

use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::widgets::Widget;
use ratatui::Frame;

use self::chat::render_conversation;
use self::dashboard::{render_dashboard_below, render_dashboard_side, render_summary};
use self::input_box::{input_cursor, render_input};
use self::log::render_log;
use self::overlays::{render_dead, render_help};
use self::status::render_status;

use crate::app::{App, Focus, Phase};

pub use chat::{conversation_inner, conversation_line_count, display_text, think_runs, turn_lines};
pub use common::thousands;
pub use dashboard::mini_spark;
pub use layout::{layout, AppLayout, DashArea, BELOW_MIN_HEIGHT, SIDE_MIN_WIDTH};
pub use log::{log_inner, log_row_count};
pub use overlays::HELP;
pub use sessions::session_label;
pub use status::status_spans;
pub use tiers::{cell_colour, TIER_RGB};

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
