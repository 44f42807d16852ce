//! `coli`: the terminal client of colibri.
//!
//! * [`app`]: the state and its transitions (no I/O, no clock);
//! * [`ui`]: pure rendering and the layout;
//! * [`io`]: the daemon child and the threads feeding one [`event::Event`] channel;
//! * [`attach`]: `--attach URL`, the same channel fed by a running `colibri api` over HTTP;
//! * [`run`]: the main loop, generic over the ratatui backend and the daemon control.

pub mod app;
pub mod attach;
pub mod event;
pub mod input;
pub mod io;
pub mod ui;

use crossbeam_channel::Receiver;
use ratatui::backend::Backend;
use ratatui::Terminal;

use app::{Action, App};
use event::Event;
use io::Control;

/// Why the main loop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// The user quit.
    Quit,
    /// Every event source is gone.
    Disconnected,
}

/// Applies one event and performs its actions; `Some` when the loop must end.
pub fn step(app: &mut App, ctl: &mut impl Control, event: Event) -> Option<Exit> {
    for action in app.update(event) {
        match action {
            Action::SendRequest(bytes) => ctl.send(bytes),
            Action::Chat(req) => ctl.chat(req),
            Action::Interrupt => ctl.interrupt(),
            Action::Quit => return Some(Exit::Quit),
            Action::Restart => {
                app.on_restarted();
                ctl.restart();
            }
        }
    }
    None
}

/// The main loop: `recv -> app.update -> terminal.draw`, draining whatever else is queued
/// before each draw so a fast token stream does not lag behind.
pub fn run<B: Backend>(
    terminal: &mut Terminal<B>,
    events: &Receiver<Event>,
    app: &mut App,
    ctl: &mut impl Control,
) -> std::io::Result<Exit> {
    terminal.draw(|f| ui::draw(f, app))?;
    loop {
        let Ok(first) = events.recv() else {
            return Ok(Exit::Disconnected);
        };
        if let Some(exit) = step(app, ctl, first) {
            return Ok(exit);
        }
        for ev in events.try_iter().take(10_000) {
            if let Some(exit) = step(app, ctl, ev) {
                return Ok(exit);
            }
        }
        terminal.draw(|f| ui::draw(f, app))?;
    }
}
