//! Keys and pastes: focus, scrolling, the help and dashboard toggles, and editing the input
//! box. Page sizes come from [`crate::ui::layout()`], so a page is what the screen shows.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;

use super::{Action, App, Focus, Phase};

impl App {
    /// A key press.
    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Action> {
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let alt = key.modifiers.contains(KeyModifiers::ALT);
        let shift = key.modifiers.contains(KeyModifiers::SHIFT);

        if ctrl && matches!(key.code, KeyCode::Char('c')) {
            return self.on_ctrl_c();
        }
        if self.show_help {
            // Any key closes the help.
            self.show_help = false;
            return Vec::new();
        }
        if self.phase == Phase::Dead && self.input.is_empty() {
            match key.code {
                KeyCode::Char('r') if !ctrl && !alt => return vec![Action::Restart],
                KeyCode::Char('q') if !ctrl && !alt => return vec![Action::Quit],
                _ => {}
            }
        }
        match key.code {
            KeyCode::Tab => {
                self.focus = self.focus.next();
                return Vec::new();
            }
            KeyCode::BackTab => {
                self.focus = self.focus.prev();
                return Vec::new();
            }
            KeyCode::F(1) => {
                self.show_help = true;
                return Vec::new();
            }
            KeyCode::F(2) => {
                self.show_dashboard = !self.show_dashboard;
                return Vec::new();
            }
            KeyCode::PageUp => {
                self.scroll_up(self.page());
                return Vec::new();
            }
            KeyCode::PageDown => {
                self.scroll_down(self.page());
                return Vec::new();
            }
            KeyCode::Esc => {
                self.focus = Focus::Input;
                return Vec::new();
            }
            KeyCode::Char('d') if ctrl && self.input.is_empty() => return vec![Action::Quit],
            _ => {}
        }
        match self.focus {
            Focus::Input => self.on_input_key(key, ctrl, alt, shift),
            Focus::Conversation | Focus::Log => {
                match key.code {
                    KeyCode::Up | KeyCode::Char('k') => self.scroll_up(1),
                    KeyCode::Down | KeyCode::Char('j') => self.scroll_down(1),
                    KeyCode::Home | KeyCode::Char('g') => self.scroll_up(usize::MAX / 2),
                    KeyCode::End | KeyCode::Char('G') => self.scroll_down(usize::MAX / 2),
                    KeyCode::Char(_) if !ctrl && !alt => {
                        // Typing goes to the input box.
                        self.focus = Focus::Input;
                        return self.on_input_key(key, ctrl, alt, shift);
                    }
                    KeyCode::Enter => self.focus = Focus::Input,
                    _ => {}
                }
                Vec::new()
            }
        }
    }

    fn on_ctrl_c(&mut self) -> Vec<Action> {
        if self.config.mux {
            return self.mux_ctrl_c();
        }
        if self.phase.busy() && !self.interrupted {
            self.interrupted = true;
            self.flash(super::STOPPING);
            vec![Action::Interrupt]
        } else {
            vec![Action::Quit]
        }
    }

    fn on_input_key(&mut self, key: KeyEvent, ctrl: bool, alt: bool, shift: bool) -> Vec<Action> {
        match key.code {
            KeyCode::Enter if alt || shift => self.input.insert_char('\n'),
            KeyCode::Char('j') if ctrl => self.input.insert_char('\n'),
            KeyCode::Enter => return self.submit(),
            KeyCode::Char('?') if self.input.is_empty() && !ctrl && !alt => {
                self.show_help = true;
            }
            KeyCode::Char('u') if ctrl => self.input.kill_to_line_start(),
            KeyCode::Char('w') if ctrl => self.input.kill_word(),
            KeyCode::Char('a') if ctrl => self.input.home(),
            KeyCode::Char('e') if ctrl => self.input.end(),
            KeyCode::Char(c) if !ctrl => self.input.insert_char(c),
            KeyCode::Backspace => self.input.backspace(),
            KeyCode::Delete => self.input.delete(),
            KeyCode::Left => self.input.left(),
            KeyCode::Right => self.input.right(),
            KeyCode::Home => self.input.home(),
            KeyCode::End => self.input.end(),
            KeyCode::Up => self.history_older(),
            KeyCode::Down => self.history_newer(),
            _ => {}
        }
        Vec::new()
    }

    /// Up: to the line above in the input, or (on its first line) the older history entry.
    fn history_older(&mut self) {
        if self.input.up() {
            return;
        }
        let current = self.input.text().to_string();
        if let Some(prev) = self.history.prev(&current) {
            let prev = prev.to_string();
            self.input.set(&prev);
        }
    }

    /// Down: to the line below, or (on the last line) the newer history entry.
    fn history_newer(&mut self) {
        if self.input.down() {
            return;
        }
        if let Some(next) = self.history.newer() {
            let next = next.to_string();
            self.input.set(&next);
        }
    }

    /// A bracketed paste: goes into the input box as typed, newlines included.
    pub fn on_paste(&mut self, text: &str) {
        self.focus = Focus::Input;
        self.input.insert_str(text);
    }

    fn page(&self) -> usize {
        let l = crate::ui::layout(Rect::new(0, 0, self.size.0, self.size.1), self);
        let h = match self.focus {
            Focus::Log => l.log.map_or(1, |r| r.height),
            _ => crate::ui::conversation_inner(l.conversation).height,
        };
        usize::from(h.saturating_sub(2)).max(1)
    }

    fn scroll_up(&mut self, n: usize) {
        if self.focus == Focus::Log {
            // Rows of wrapped log text beyond what the pane shows: Home stops at the top.
            let l = crate::ui::layout(Rect::new(0, 0, self.size.0, self.size.1), self);
            let max = l.log.map_or(0, |r| {
                let inner = crate::ui::log_inner(r);
                crate::ui::log_row_count(self, inner.width)
                    .saturating_sub(usize::from(inner.height))
            });
            self.log_scroll = self.log_scroll.saturating_add(n).min(max);
        } else {
            let l = crate::ui::layout(Rect::new(0, 0, self.size.0, self.size.1), self);
            let inner = crate::ui::conversation_inner(l.conversation);
            let total = crate::ui::conversation_line_count(self, inner.width);
            let max = total.saturating_sub(usize::from(inner.height));
            self.conv_scroll = self.conv_scroll.saturating_add(n).min(max);
        }
    }

    fn scroll_down(&mut self, n: usize) {
        if self.focus == Focus::Log {
            self.log_scroll = self.log_scroll.saturating_sub(n);
        } else {
            self.conv_scroll = self.conv_scroll.saturating_sub(n);
        }
    }
}
