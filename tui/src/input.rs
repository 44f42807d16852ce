//! The multi-line input box: a text buffer with a cursor, and the history of sent messages.

/// Text being typed, with a cursor (a byte offset on a char boundary).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Input {
    text: String,
    cursor: usize,
}

impl Input {
    /// The whole text (lines separated by `\n`).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether nothing has been typed.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
    }

    /// Replaces the text and puts the cursor at its end.
    pub fn set(&mut self, text: &str) {
        self.text = text.to_string();
        self.cursor = self.text.len();
    }

    /// Empties the box and returns what it held.
    pub fn take(&mut self) -> String {
        self.cursor = 0;
        std::mem::take(&mut self.text)
    }

    /// Inserts one character at the cursor.
    pub fn insert_char(&mut self, c: char) {
        self.text.insert(self.cursor, c);
        self.cursor += c.len_utf8();
    }

    /// Inserts a string (a paste) at the cursor; `\r\n` and `\r` become `\n`.
    pub fn insert_str(&mut self, s: &str) {
        let s = s.replace("\r\n", "\n").replace('\r', "\n");
        self.text.insert_str(self.cursor, &s);
        self.cursor += s.len();
    }

    /// Deletes the character before the cursor.
    pub fn backspace(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
            self.text.remove(self.cursor);
        }
    }

    /// Deletes the character under the cursor.
    pub fn delete(&mut self) {
        if self.cursor < self.text.len() {
            self.text.remove(self.cursor);
        }
    }

    /// Deletes from the start of the cursor's line to the cursor.
    pub fn kill_to_line_start(&mut self) {
        let start = self.line_start();
        self.text.replace_range(start..self.cursor, "");
        self.cursor = start;
    }

    /// Deletes the word before the cursor (and the spaces after it).
    pub fn kill_word(&mut self) {
        let before = &self.text[..self.cursor];
        let trimmed = before.trim_end_matches([' ', '\t']);
        let start = trimmed
            .rfind(|c: char| c.is_whitespace())
            .map(|i| i + 1)
            .unwrap_or(0);
        self.text.replace_range(start..self.cursor, "");
        self.cursor = start;
    }

    /// Moves the cursor one character left.
    pub fn left(&mut self) {
        if let Some(c) = self.text[..self.cursor].chars().next_back() {
            self.cursor -= c.len_utf8();
        }
    }

    /// Moves the cursor one character right.
    pub fn right(&mut self) {
        if let Some(c) = self.text[self.cursor..].chars().next() {
            self.cursor += c.len_utf8();
        }
    }

    fn line_start(&self) -> usize {
        self.text[..self.cursor].rfind('\n').map_or(0, |i| i + 1)
    }

    fn line_end(&self) -> usize {
        self.text[self.cursor..]
            .find('\n')
            .map_or(self.text.len(), |i| self.cursor + i)
    }

    /// Moves the cursor to the start of its line.
    pub fn home(&mut self) {
        self.cursor = self.line_start();
    }

    /// Moves the cursor to the end of its line.
    pub fn end(&mut self) {
        self.cursor = self.line_end();
    }

    /// Moves the cursor one line up, keeping its column; `false` when it is on the first line.
    pub fn up(&mut self) -> bool {
        let start = self.line_start();
        if start == 0 {
            return false;
        }
        let col = self.text[start..self.cursor].chars().count();
        let prev_start = self.text[..start - 1].rfind('\n').map_or(0, |i| i + 1);
        self.cursor = advance(&self.text, prev_start, start - 1, col);
        true
    }

    /// Moves the cursor one line down, keeping its column; `false` when it is on the last line.
    pub fn down(&mut self) -> bool {
        let end = self.line_end();
        if end == self.text.len() {
            return false;
        }
        let col = self.text[self.line_start()..self.cursor].chars().count();
        let next_start = end + 1;
        let next_end = self.text[next_start..]
            .find('\n')
            .map_or(self.text.len(), |i| next_start + i);
        self.cursor = advance(&self.text, next_start, next_end, col);
        true
    }

    /// The lines of the text (at least one).
    pub fn lines(&self) -> Vec<&str> {
        self.text.split('\n').collect()
    }

    /// The cursor as (line, text of that line before the cursor).
    pub fn cursor_line(&self) -> (usize, &str) {
        let before = &self.text[..self.cursor];
        let row = before.matches('\n').count();
        (row, &before[self.line_start()..])
    }
}

/// The byte offset `col` characters after `from`, but not past `limit`.
fn advance(text: &str, from: usize, limit: usize, col: usize) -> usize {
    text[from..limit]
        .char_indices()
        .nth(col)
        .map_or(limit, |(i, _)| from + i)
}

/// Sent messages, browsed with Up/Down; the text being typed is kept as a draft.
#[derive(Clone, Debug, Default)]
pub struct History {
    entries: Vec<String>,
    /// Index into `entries` while browsing.
    pos: Option<usize>,
    draft: String,
}

impl History {
    /// Records a sent message (not twice in a row).
    pub fn push(&mut self, entry: &str) {
        if !entry.trim().is_empty() && self.entries.last().map(String::as_str) != Some(entry) {
            self.entries.push(entry.to_string());
        }
        self.pos = None;
    }

    /// The previous (older) entry, saving `current` as the draft when browsing starts.
    pub fn prev(&mut self, current: &str) -> Option<&str> {
        let pos = match self.pos {
            None if self.entries.is_empty() => return None,
            None => {
                self.draft = current.to_string();
                self.entries.len() - 1
            }
            Some(0) => return None,
            Some(p) => p - 1,
        };
        self.pos = Some(pos);
        Some(&self.entries[pos])
    }

    /// The next (newer) entry, or the draft after the newest.
    pub fn newer(&mut self) -> Option<&str> {
        let pos = self.pos?;
        if pos + 1 < self.entries.len() {
            self.pos = Some(pos + 1);
            Some(&self.entries[pos + 1])
        } else {
            self.pos = None;
            Some(&self.draft)
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing was sent yet.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn editing_and_cursor_moves() {
        let mut i = Input::default();
        for c in "héllo".chars() {
            i.insert_char(c);
        }
        i.insert_str("\r\nwörld");
        assert_eq!(i.text(), "héllo\nwörld");
        assert_eq!(i.cursor_line(), (1, "wörld"));
        i.left();
        i.left();
        assert!(i.up());
        assert_eq!(i.cursor_line(), (0, "hél"));
        assert!(!i.up());
        assert!(i.down());
        assert_eq!(i.cursor_line(), (1, "wör"));
        assert!(!i.down());
        i.backspace();
        assert_eq!(i.text(), "héllo\nwöld");
        i.home();
        i.backspace();
        assert_eq!(i.text(), "héllowöld");
        i.end();
        i.kill_word();
        assert_eq!(i.text(), "");
    }

    #[test]
    fn history_keeps_the_draft() {
        let mut h = History::default();
        h.push("one");
        h.push("two");
        h.push("two");
        assert_eq!(h.len(), 2);
        assert_eq!(h.prev("draft"), Some("two"));
        assert_eq!(h.prev("ignored"), Some("one"));
        assert_eq!(h.prev("ignored"), None);
        assert_eq!(h.newer(), Some("two"));
        assert_eq!(h.newer(), Some("draft"));
        assert_eq!(h.newer(), None);
    }
}
