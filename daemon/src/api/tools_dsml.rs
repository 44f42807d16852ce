//! DeepSeek-V4's tool calls, in the DSML its encoder teaches and renders
//! (`engine/chat_dsv4.rs`; the tags' bars are fullwidth, `｜`):
//!
//! ```text
//! Let me look.
//!
//! <｜DSML｜tool_calls>
//! <｜DSML｜invoke name="get_weather">
//! <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
//! <｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>
//! </｜DSML｜invoke>
//! </｜DSML｜tool_calls>
//! ```
//!
//! A block holds one or more invokes. `string="true"`: the value is the text as written;
//! `string="false"`: the value is JSON (the encoder's `decode_dsml_to_arguments` pastes it
//! into the arguments as is). A `string="false"` value that is not JSON is kept as text, so
//! the client still gets arguments that parse; a parameter without the attribute is typed by
//! reading (JSON other than a string is that value, else text). Keys stay in the order
//! written; a key written again takes the later value in its first place.

use serde_json::{Map, Value};

use super::tools_invoke::{parse_blocks, InvokeTags};
use crate::engine::conversation::ToolCall;

pub(super) const OPEN: &str = "<｜DSML｜tool_calls>";
/// The block as the encoder writes it, after a blank line: the stream holds the newlines
/// before it until it is told apart.
pub(super) const OPEN_AFTER_BLANK: &str = "\n\n<｜DSML｜tool_calls>";
const CLOSE: &str = "</｜DSML｜tool_calls>";
const INVOKE: &str = "<｜DSML｜invoke name=\"";
const INVOKE_END: &str = "</｜DSML｜invoke>";
const PARAM: &str = "<｜DSML｜parameter name=\"";
const PARAM_END: &str = "</｜DSML｜parameter>";

/// The calls of `rest`, which starts at (the blank line before) the first block: only blanks
/// between blocks and invokes (see [`parse_blocks`]).
pub(super) fn parse(rest: &str) -> Option<Vec<ToolCall>> {
    let tags = InvokeTags {
        open: OPEN,
        close: CLOSE,
        invoke: INVOKE,
        invoke_end: INVOKE_END,
    };
    parse_blocks(rest, &tags, true, parameters)
}

/// The `<｜DSML｜parameter name="k" string="..">v</｜DSML｜parameter>` of one invoke.
fn parameters(mut inner: &str) -> Option<Map<String, Value>> {
    let mut args = Map::new();
    while let Some(p) = inner.find(PARAM) {
        if !inner[..p].trim().is_empty() {
            return None;
        }
        let head = &inner[p + PARAM.len()..];
        let tag_end = head.find('>')?;
        let (key, string) = attributes(&head[..tag_end])?;
        let after = &head[tag_end + 1..];
        let v_end = after.find(PARAM_END)?;
        let raw = &after[..v_end];
        let json = || serde_json::from_str::<Value>(raw.trim()).ok();
        let value = match string {
            Some(true) => Value::String(raw.to_string()),
            Some(false) => json().unwrap_or_else(|| Value::String(raw.to_string())),
            None => json()
                .filter(|v| !v.is_string())
                .unwrap_or_else(|| Value::String(raw.to_string())),
        };
        args.insert(key.to_string(), value);
        inner = &after[v_end + PARAM_END.len()..];
    }
    inner.trim().is_empty().then_some(args)
}

/// A parameter tag's name and its `string` flag (`None` when the tag has none), from the text
/// after `name="` up to the tag's `>`: `k" string="true"` or `k"`. Another flag value, or
/// anything else in the tag, is no parameter.
fn attributes(tag: &str) -> Option<(&str, Option<bool>)> {
    let (key, rest) = tag.split_once('"')?;
    let string = match rest.trim() {
        "" => None,
        "string=\"true\"" => Some(true),
        "string=\"false\"" => Some(false),
        _ => return None,
    };
    Some((key, string))
}

#[cfg(test)]
#[path = "tools_dsml_tests.rs"]
mod tests;
