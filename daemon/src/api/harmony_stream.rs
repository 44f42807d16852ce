//! gpt-oss's harmony answer split into its channels while it is generated: the `final`
//! channel's text goes out as content and the `analysis` channel's as reasoning as soon as
//! no marker can begin in it, the calls (`commentary to=functions.F`) are held for the parse
//! at the end ([`crate::engine::harmony::parse`], the one the whole answer goes through).
//! The pieces are cut the way that parse cuts the whole: a message is a header up to
//! `<|message|>` and a body up to `<|end|>`, `<|call|>`, `<|return|>` or the next
//! `<|start|>`; analysis messages are joined by a newline; every other channel is content.

/// What ends a message's body.
const ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", "<|start|>"];
const MESSAGE: &str = "<|message|>";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Content,
    Reasoning,
    Call,
}

/// Where the stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// In a header that began at this byte of the text.
    Header(usize),
    /// In the body of a message of this kind.
    Body(Kind),
}

/// The channels of one harmony answer, fed as it comes.
#[derive(Debug)]
pub struct HarmonyStream {
    /// Everything fed so far (the whole answer, for the parse of the calls at the end).
    text: String,
    /// How far [`HarmonyStream::push`] has read.
    pos: usize,
    state: State,
    join: Join,
}

/// How analysis messages join: as `parse` joins them, with a newline before each once the
/// reasoning is not empty.
#[derive(Debug, Default)]
struct Join {
    /// Whether the current message has not yet given any reasoning.
    fresh: bool,
    /// Whether any reasoning went out.
    reasoned: bool,
}

impl Default for HarmonyStream {
    fn default() -> Self {
        HarmonyStream {
            text: String::new(),
            pos: 0,
            state: State::Header(0),
            join: Join::default(),
        }
    }
}

/// The piece of an answer one [`HarmonyStream::push`] released.
#[derive(Debug, Default, PartialEq)]
pub struct Piece {
    pub content: String,
    pub reasoning: String,
}

impl HarmonyStream {
    /// More answer text: the content and reasoning that may go out now.
    pub fn push(&mut self, text: &str) -> Piece {
        self.text.push_str(text);
        self.advance(false)
    }

    /// The answer ended: what is left of its content and reasoning.
    pub fn finish(&mut self) -> Piece {
        self.advance(true)
    }

    /// The whole answer fed so far.
    pub fn text(&self) -> &str {
        &self.text
    }

    fn advance(&mut self, end: bool) -> Piece {
        let mut out = Piece::default();
        loop {
            let rest = &self.text[self.pos..];
            match self.state {
                State::Header(start) => {
                    let Some(at) = rest.find(MESSAGE) else { break };
                    let kind = kind_of(&self.text[start..self.pos + at]);
                    self.pos += at + MESSAGE.len();
                    self.state = State::Body(kind);
                    self.join.fresh = true;
                }
                State::Body(kind) => {
                    let ended = ENDS
                        .iter()
                        .filter_map(|m| rest.find(m).map(|at| (at, m.len())))
                        .min();
                    let take = match ended {
                        Some((at, _)) => at,
                        None if end => rest.len(),
                        // Keep back a tail that may be the start of a marker.
                        None => rest.len() - marker_tail(rest),
                    };
                    let piece = &rest[..take];
                    self.join.emit(kind, piece, &mut out);
                    self.pos += take;
                    match ended {
                        Some((_, len)) => {
                            self.pos += len;
                            self.state = State::Header(self.pos);
                        }
                        None => break,
                    }
                }
            }
        }
        out
    }
}

impl Join {
    fn emit(&mut self, kind: Kind, piece: &str, out: &mut Piece) {
        match kind {
            Kind::Content => out.content.push_str(piece),
            Kind::Reasoning => {
                // parse() joins analysis messages with a newline, empty ones included.
                if self.fresh && self.reasoned {
                    out.reasoning.push('\n');
                }
                self.reasoned |= !piece.is_empty();
                self.fresh = false;
                out.reasoning.push_str(piece);
            }
            Kind::Call => {}
        }
    }
}

/// The kind of a message from its header, as [`crate::engine::harmony::parse`] reads it.
fn kind_of(header: &str) -> Kind {
    let channel = header
        .split("<|channel|>")
        .nth(1)
        .map(|c| c.split([' ', '<']).next().unwrap_or(""))
        .unwrap_or("");
    let to = header
        .split("to=")
        .nth(1)
        .map(|t| t.split([' ', '<']).next().unwrap_or(""));
    match (channel, to) {
        (_, Some(t)) if t.starts_with("functions.") => Kind::Call,
        ("analysis", _) => Kind::Reasoning,
        _ => Kind::Content,
    }
}

/// Bytes at the end of `s` that are a proper prefix of a marker that ends a body.
fn marker_tail(s: &str) -> usize {
    ENDS.iter()
        .flat_map(|m| (1..m.len()).filter(move |&n| s.ends_with(&m[..n])))
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::harmony::parse;

    const ANSWERS: [&str; 4] = [
        "<|channel|>analysis<|message|>User wants weather.<|end|>\
         <|start|>assistant<|channel|>commentary to=functions.get_weather \
         <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant\
         <|channel|>analysis<|message|><|end|><|start|>assistant\
         <|channel|>analysis<|message|>More<|end|><|start|>assistant\
         <|channel|>final<|message|>It is <sunny> <|today.<|return|>",
        "<|channel|>final<|message|>cut short <|en",
        "<|channel|>commentary<|message|>Preamble.<|end|><|start|>assistant\
         <|channel|>final<|message|>Done",
    ];

    /// Fed in every split (one byte at a time as well as whole), the pieces concatenate to
    /// what the parse of the whole answer gives, and no marker's bytes go out.
    #[test]
    fn the_pieces_are_the_whole_answers_channels() {
        for answer in ANSWERS {
            let want = parse(answer);
            for step in [1, 2, 3, 7, answer.len()] {
                let mut h = HarmonyStream::default();
                let (mut content, mut reasoning) = (String::new(), String::new());
                let bytes = answer.as_bytes();
                for chunk in bytes.chunks(step) {
                    // Whole UTF-8 pieces only (the fixtures are ASCII).
                    let p = h.push(std::str::from_utf8(chunk).unwrap());
                    assert!(!p.content.contains("<|") || want.content.contains("<|"));
                    content += &p.content;
                    reasoning += &p.reasoning;
                }
                let p = h.finish();
                content += &p.content;
                reasoning += &p.reasoning;
                assert_eq!(content, want.content, "{answer:?} step {step}");
                assert_eq!(reasoning, want.reasoning, "{answer:?} step {step}");
                assert_eq!(h.text(), answer);
            }
        }
    }

    /// The final channel goes out while it is generated, not at the end.
    #[test]
    fn content_streams_before_the_answer_ends() {
        let mut h = HarmonyStream::default();
        let p = h.push("<|channel|>analysis<|message|>Hm");
        assert_eq!((p.content.as_str(), p.reasoning.as_str()), ("", "Hm"));
        let p = h.push("m.<|end|><|start|>assistant<|channel|>final<|message|>It is");
        assert_eq!((p.content.as_str(), p.reasoning.as_str()), ("It is", "m."));
        let p = h.push(" sunny<|");
        assert_eq!(p.content, " sunny");
        let p = h.push("return|>");
        assert_eq!(p, Piece::default());
        assert_eq!(h.finish(), Piece::default());
    }
}
