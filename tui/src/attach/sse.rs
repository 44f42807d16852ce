//! Server-sent events off a byte stream, and what `coli` makes of the two streams it reads
//! from `colibri api`: the telemetry stream's frames ([`Frame`]) and a chat completion's
//! chunks ([`ChatChunk`]).

use std::io::BufRead;

use protocol::{parse_stat_line, parse_telemetry_line, Stat, Telemetry};

/// One event: its `event:` name (`None`: the default, `message`) and its `data:` lines
/// joined with `\n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// A single SSE line longer than this ends the stream (a server that is not one).
const MAX_LINE: usize = 4 << 20;

/// Calls `f` for each event of `r` until its end, a read error, or `f` returning false.
/// Comments (`:` lines) and fields other than `event` and `data` are skipped. Returns the read
/// error that ended it, if one did.
pub fn read_events(mut r: impl BufRead, mut f: impl FnMut(SseEvent) -> bool) -> Option<String> {
    let mut event: Option<String> = None;
    let mut data: Option<String> = None;
    let mut line = Vec::new();
    loop {
        line.clear();
        match std::io::Read::take(r.by_ref(), MAX_LINE as u64).read_until(b'\n', &mut line) {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Some(e.to_string()),
        }
        if line.len() >= MAX_LINE && line.last() != Some(&b'\n') {
            return Some(format!("an event line longer than {MAX_LINE} bytes"));
        }
        let l = String::from_utf8_lossy(&line);
        let l = l.trim_end_matches(['\n', '\r']);
        if l.is_empty() {
            if let Some(d) = data.take() {
                if !f(SseEvent {
                    event: event.take(),
                    data: d,
                }) {
                    return None;
                }
            }
            event = None;
            continue;
        }
        if l.starts_with(':') {
            continue;
        }
        let (field, value) = match l.split_once(':') {
            Some((k, v)) => (k, v.strip_prefix(' ').unwrap_or(v)),
            None => (l, ""),
        };
        match field {
            "event" => event = Some(value.to_string()),
            "data" => match &mut data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => data = Some(value.to_string()),
            },
            _ => {}
        }
    }
}

/// A frame of `GET /v1/colibri/telemetry`.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// A telemetry record (the `--telemetry-fd` line it carries).
    Telemetry(Telemetry),
    /// A finished request's STAT (any client's).
    Stat(Stat),
    /// This client read too slowly: the server skipped this many frames.
    Lagged(u64),
    /// Something this version does not know, or a line that does not parse (the text).
    Other(String),
}

impl Frame {
    pub fn of(ev: &SseEvent) -> Frame {
        let data = ev.data.as_bytes();
        match ev.event.as_deref() {
            Some("telemetry") => match parse_telemetry_line(data) {
                Some(Telemetry::Unknown(_)) | None => Frame::Other(ev.data.clone()),
                Some(t) => Frame::Telemetry(t),
            },
            Some("stat") => {
                parse_stat_line(data).map_or(Frame::Other(ev.data.clone()), Frame::Stat)
            }
            Some("lagged") => ev
                .data
                .trim()
                .parse()
                .map_or(Frame::Other(ev.data.clone()), Frame::Lagged),
            _ => Frame::Other(ev.data.clone()),
        }
    }
}

/// What one chunk of a streamed chat completion says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatChunk {
    /// Answer text.
    pub text: String,
    /// `finish_reason`, on the last content chunk.
    pub finish: Option<String>,
    /// `usage`: (prompt tokens, completion tokens), on the usage chunk.
    pub usage: Option<(u32, u32)>,
    /// An `error` object's message (the server failed mid-stream).
    pub error: Option<String>,
    /// `data: [DONE]`.
    pub done: bool,
}

impl ChatChunk {
    /// The chunk of one `data:` payload; `None` when it is not JSON.
    pub fn parse(data: &str) -> Option<ChatChunk> {
        if data.trim() == "[DONE]" {
            return Some(ChatChunk {
                done: true,
                ..ChatChunk::default()
            });
        }
        let v: serde_json::Value = serde_json::from_str(data).ok()?;
        let mut c = ChatChunk::default();
        if let Some(e) = v.get("error") {
            c.error = Some(
                e.get("message")
                    .and_then(|m| m.as_str())
                    .map_or_else(|| e.to_string(), str::to_string),
            );
        }
        if let Some(choice) = v.pointer("/choices/0") {
            if let Some(t) = choice.pointer("/delta/content").and_then(|t| t.as_str()) {
                c.text = t.to_string();
            }
            c.finish = choice
                .get("finish_reason")
                .and_then(|f| f.as_str())
                .map(str::to_string);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |k: &str| {
                u.get(k)
                    .and_then(|x| x.as_u64())
                    .unwrap_or(0)
                    .min(u32::MAX as u64) as u32
            };
            c.usage = Some((n("prompt_tokens"), n("completion_tokens")));
        }
        Some(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(raw: &str) -> Vec<SseEvent> {
        let mut v = Vec::new();
        assert_eq!(
            read_events(std::io::Cursor::new(raw.as_bytes()), |e| {
                v.push(e);
                true
            }),
            None
        );
        v
    }

    #[test]
    fn events_fields_and_comments() {
        let got = events(": colibri telemetry\n\nevent: telemetry\ndata: STATE idle\n\n: keep-alive\n\ndata: a\r\ndata:b\r\n\r\nevent: x\nid: 3\n\nretry: 1\ndata: tail without end\n");
        assert_eq!(
            got,
            [
                SseEvent {
                    event: Some("telemetry".into()),
                    data: "STATE idle".into()
                },
                SseEvent {
                    event: None,
                    data: "a\nb".into()
                },
            ],
            "an event without data is dropped, and so is one the stream cut"
        );
    }

    #[test]
    fn telemetry_frames() {
        let ev = |e: &str, d: &str| SseEvent {
            event: Some(e.into()),
            data: d.into(),
        };
        assert_eq!(
            Frame::of(&ev("telemetry", "STATE generating")),
            Frame::Telemetry(Telemetry::State(protocol::EngineState::Generating))
        );
        assert_eq!(
            Frame::of(&ev("stat", "STAT 12 30.00 85.0 0.12 20 0")),
            Frame::Stat(Stat {
                route: None,
                prefetch: None,
                completion_tokens: 12,
                tok_per_s: 30.0,
                hit_pct: 85.0,
                rss_gb: 0.12,
                prompt: Some((20, false))
            })
        );
        assert_eq!(Frame::of(&ev("lagged", "7")), Frame::Lagged(7));
        assert_eq!(
            Frame::of(&ev("telemetry", "NEWKIND 1 2")),
            Frame::Other("NEWKIND 1 2".into())
        );
        assert_eq!(
            Frame::of(&ev("telemetry", "TIERS x")),
            Frame::Other("TIERS x".into())
        );
    }

    #[test]
    fn chat_chunks() {
        let c = ChatChunk::parse(
            r#"{"choices":[{"index":0,"delta":{"content":"Hel"},"finish_reason":null}]}"#,
        )
        .unwrap();
        assert_eq!((c.text.as_str(), c.finish.as_deref()), ("Hel", None));
        let c =
            ChatChunk::parse(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#)
                .unwrap();
        assert_eq!(c.finish.as_deref(), Some("length"));
        let c = ChatChunk::parse(
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#,
        )
        .unwrap();
        assert_eq!(c.usage, Some((9, 4)));
        let c = ChatChunk::parse(r#"{"error":{"message":"the engine failed"}}"#).unwrap();
        assert_eq!(c.error.as_deref(), Some("the engine failed"));
        assert!(ChatChunk::parse("[DONE]").unwrap().done);
        assert_eq!(ChatChunk::parse("not json"), None);
    }
}
