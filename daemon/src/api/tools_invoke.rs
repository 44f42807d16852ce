//! The block walk both XML-like tool-call syntaxes share (MiniMax-M2's `<minimax:tool_call>`,
//! DeepSeek-V4's DSML): blocks that hold one or more `<invoke name="f">..</invoke>`, each
//! invoke's body read by the syntax's own parameter reader.

use serde_json::{Map, Value};

use super::tools::call_id;
use crate::engine::conversation::ToolCall;

/// One syntax's tags: the block's open and close, and an invoke's opening up to its name
/// (`<invoke name="`) and its close.
pub(super) struct InvokeTags {
    pub open: &'static str,
    pub close: &'static str,
    pub invoke: &'static str,
    pub invoke_end: &'static str,
}

/// The calls of `rest`, which starts at (the blanks before) the first block, each invoke's
/// arguments read from its body by `parameters`. `None` when one does not parse (the answer
/// then stays text); the last block may lack its close (the answer ended at the stop token).
/// `strict`: only blanks before and between the blocks, before each invoke and after the
/// last block (DSML); otherwise text there is passed over (MiniMax).
pub(super) fn parse_blocks(
    mut rest: &str,
    tags: &InvokeTags,
    strict: bool,
    parameters: impl Fn(&str) -> Option<Map<String, Value>>,
) -> Option<Vec<ToolCall>> {
    let blank = |s: &str| !strict || s.trim().is_empty();
    let mut calls = Vec::new();
    while let Some(at) = rest.find(tags.open) {
        if !blank(&rest[..at]) {
            return None;
        }
        let body_start = at + tags.open.len();
        let (body, next) = match rest[body_start..].find(tags.close) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + tags.close.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        let before = calls.len();
        let mut b = body;
        while let Some(i) = b.find(tags.invoke) {
            if !blank(&b[..i]) {
                return None;
            }
            let head = &b[i + tags.invoke.len()..];
            let name_end = head.find("\">")?;
            let name = head[..name_end].trim();
            if name.is_empty() {
                return None;
            }
            let inner = &head[name_end + 2..];
            let (inner, after) = match inner.find(tags.invoke_end) {
                Some(e) => (&inner[..e], &inner[e + tags.invoke_end.len()..]),
                None => (inner, ""),
            };
            calls.push(ToolCall {
                id: call_id("call_"),
                name: name.to_string(),
                arguments: Value::Object(parameters(inner)?).to_string(),
            });
            b = after;
        }
        // A block without a single invoke is not a call.
        if calls.len() == before || !b.trim().is_empty() {
            return None;
        }
        rest = next;
    }
    blank(rest).then_some(calls)
}
