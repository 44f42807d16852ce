//! Where each pane goes: a pure function of the screen size and the app's toggles, shared by
//! the renderer and the key handlers (page sizes, scroll limits) so both agree.

use ratatui::layout::{Constraint, Layout, Rect};

use crate::app::{App, Focus};

/// From this width on, the dashboard goes beside the chat.
pub const SIDE_MIN_WIDTH: u16 = 120;
/// Below [`SIDE_MIN_WIDTH`], from this height on, the dashboard goes below the chat.
pub const BELOW_MIN_HEIGHT: u16 = 36;

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
