//! MiniMax-M2's tool calls, as its chat template teaches them (`engine/chat_minimax.rs`):
//!
//! ```text
//! <minimax:tool_call>
//! <invoke name="get_weather">
//! <parameter name="city">Paris</parameter>
//! <parameter name="days">2</parameter>
//! </invoke>
//! </minimax:tool_call>
//! ```
//!
//! A block holds one or more `<invoke>`s; an answer may hold several blocks. A parameter's
//! value that reads as JSON other than a string (a number, an object) is that value, else it
//! is text (the template writes strings bare and the rest with `tojson`). Keys stay in the
//! order written; a key written again takes the later value in its first place.

use serde_json::{Map, Value};

use super::tools_invoke::{parse_blocks, InvokeTags};
use crate::engine::conversation::ToolCall;

pub(super) const OPEN: &str = "<minimax:tool_call>";
const CLOSE: &str = "</minimax:tool_call>";
const INVOKE: &str = "<invoke name=\"";
const INVOKE_END: &str = "</invoke>";
const PARAM: &str = "<parameter name=\"";
const PARAM_END: &str = "</parameter>";

/// The calls of `rest`, which starts at the first `<minimax:tool_call>`; text around the
/// blocks and invokes is passed over (see [`parse_blocks`]).
pub(super) fn parse(rest: &str) -> Option<Vec<ToolCall>> {
    let tags = InvokeTags {
        open: OPEN,
        close: CLOSE,
        invoke: INVOKE,
        invoke_end: INVOKE_END,
    };
    parse_blocks(rest, &tags, false, parameters)
}

/// The `<parameter name="k">v</parameter>` pairs of one invoke.
fn parameters(mut inner: &str) -> Option<Map<String, Value>> {
    let mut args = Map::new();
    while let Some(p) = inner.find(PARAM) {
        let head = &inner[p + PARAM.len()..];
        let key_end = head.find("\">")?;
        let key = head[..key_end].to_string();
        let after = &head[key_end + 2..];
        let v_end = after.find(PARAM_END)?;
        let raw = &after[..v_end];
        let value = match serde_json::from_str::<Value>(raw.trim()) {
            Ok(v) if !v.is_string() => v,
            _ => Value::String(raw.to_string()),
        };
        args.insert(key, value);
        inner = &after[v_end + PARAM_END.len()..];
    }
    inner.trim().is_empty().then_some(args)
}

#[cfg(test)]
mod tests {
    use super::super::tools::{parse_calls, Hold, ToolMode};

    /// A streamed `auto` answer: the text before the block goes out as it comes (a split
    /// marker held until it is told apart), the block is held and comes back as the call.
    #[test]
    fn a_streamed_call_is_held_out_of_the_content() {
        let mut h = Hold::new(ToolMode::Auto);
        let mut sent = String::new();
        for piece in [
            "Checking <",
            "mini",
            "max:tool_call>\n<invoke name=\"f\">\n<parameter name=\"q\">",
            "x</parameter>\n</invoke>\n</minimax:tool_call>",
        ] {
            sent.push_str(&h.push(piece));
        }
        assert_eq!(sent, "Checking ");
        let (rest, calls) = h.finish();
        assert_eq!(rest, "");
        assert_eq!(
            (calls[0].name.as_str(), calls[0].arguments.as_str()),
            ("f", r#"{"q":"x"}"#)
        );
    }

    #[test]
    fn minimax_calls_parse_with_their_values_typed() {
        let text = "Let me check.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n<parameter name=\"days\">2</parameter>\n<parameter name=\"opts\">{\"unit\": \"C\"}</parameter>\n</invoke>\n<invoke name=\"now\">\n</invoke>\n</minimax:tool_call>";
        let (content, calls) = parse_calls(text);
        assert_eq!(content, "Let me check.");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(
            calls[0].arguments,
            r#"{"city":"Paris","days":2,"opts":{"unit":"C"}}"#
        );
        assert_eq!(
            (calls[1].name.as_str(), calls[1].arguments.as_str()),
            ("now", "{}")
        );
        // Cut at the stop token: the last block without its close still parses.
        let (_, calls) = parse_calls(
            "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"q\">a b</parameter>\n</invoke>\n",
        );
        assert_eq!(calls[0].arguments, r#"{"q":"a b"}"#);
    }

    #[test]
    fn a_malformed_block_leaves_the_answer_as_text() {
        for text in [
            "<minimax:tool_call>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"f\">\n<parameter name=\"q\">open\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\n<invoke name=\"\">\n</invoke>\n</minimax:tool_call>",
            "<minimax:tool_call>\nstray text\n</minimax:tool_call>",
        ] {
            let (content, calls) = parse_calls(text);
            assert!(calls.is_empty(), "{text}");
            assert_eq!(content, text);
        }
    }
}
