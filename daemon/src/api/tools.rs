//! Tool calls over HTTP: the grammar that forces a call (`tool_choice` required or named), the
//! parse of the calls a model wrote in its family's own syntax (`auto`), and the hold that
//! keeps a call's text out of a streamed answer.
//!
//! A forced call is constrained to `{"name": <one of the tools>, "arguments": <its parameters
//! schema>}`, so it always parses and matches the declared schema. An `auto` call is whatever
//! the model wrote: GLM's `<tool_call>name<arg_key>k</arg_key><arg_value>v</arg_value>
//! </tool_call>`, Qwen's Hermes-style `<tool_call>{"name":..,"arguments":..}</tool_call>`, or
//! DeepSeek's `<｜tool▁call▁begin｜>name<｜tool▁sep｜>{..}<｜tool▁call▁end｜>`, or MiniMax-M2's
//! `<minimax:tool_call><invoke name=..><parameter name=..>v</parameter></invoke>`
//! (`tools_minimax.rs`), or DeepSeek-V4's DSML `<｜DSML｜tool_calls><｜DSML｜invoke name=..>
//! <｜DSML｜parameter name=.. string=..>v</｜DSML｜parameter>...` (`tools_dsml.rs`); all are
//! recognised whatever the family, as a fine-tune may use another's.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::engine::conversation::{ToolCall, ToolSpec};

/// How a request lets the model use its tools.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolMode {
    /// No tools, or `none`: plain text.
    Off,
    /// The model may write calls in its own syntax.
    Auto,
    /// One call of any tool, constrained by a grammar.
    Required,
    /// One call of this tool, constrained by a grammar.
    Named(String),
}

impl ToolMode {
    pub fn forced(&self) -> bool {
        matches!(self, ToolMode::Required | ToolMode::Named(_))
    }
}

/// The JSON Schema text a forced call must match (compiled by the grammar engine): the name
/// first, then the arguments in the tool's own property order, nothing else beside them.
/// A tool's local `$ref`s point into its own parameters (Pydantic's `#/$defs/...`), which sit
/// at `prefix` inside this wrapper: they are rewritten to point there.
pub fn forced_schema(tools: &[ToolSpec], mode: &ToolMode) -> String {
    let chosen: Vec<&ToolSpec> = tools
        .iter()
        .filter(|t| match mode {
            ToolMode::Named(n) => &t.name == n,
            _ => true,
        })
        .collect();
    let one = |t: &ToolSpec, prefix: &str| {
        let params = if t.schema_text.trim().is_empty() || t.parameters.is_null() {
            r#"{"type":"object"}"#.to_string()
        } else if t.schema_text.contains("\"$ref\"") {
            let mut p = t.parameters.clone();
            rebase_refs(&mut p, prefix);
            p.to_string()
        } else {
            t.schema_text.clone()
        };
        format!(
            r#"{{"type":"object","properties":{{"name":{{"const":{}}},"arguments":{params}}},"required":["name","arguments"],"additionalProperties":false}}"#,
            Value::String(t.name.clone())
        )
    };
    match chosen.len() {
        1 => one(chosen[0], "#/properties/arguments"),
        _ => {
            let alts: Vec<String> = chosen
                .iter()
                .enumerate()
                .map(|(i, t)| one(t, &format!("#/anyOf/{i}/properties/arguments")))
                .collect();
            format!(r#"{{"anyOf":[{}]}}"#, alts.join(","))
        }
    }
}

/// Every local `$ref` (`#...`) in `v` moved under `prefix`. Recursion is bounded by the
/// parser's nesting limit (128).
fn rebase_refs(v: &mut Value, prefix: &str) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                match x {
                    Value::String(r) if k == "$ref" && r.starts_with('#') => {
                        *r = format!("{prefix}{}", &r[1..]);
                    }
                    _ => rebase_refs(x, prefix),
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| rebase_refs(x, prefix)),
        _ => {}
    }
}

/// A call id in OpenAI's style (`call_...`), unique within the process.
pub fn call_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{prefix}{:016x}{n:04x}",
        t ^ (n.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    )
}

/// A call written as one JSON object: a forced call, or Hermes' `<tool_call>` body. The
/// arguments stay the text the model wrote (blanks between tokens aside), not a `Value`
/// printed again: what the client gets is what the model said, in its order.
#[derive(Deserialize)]
struct JsonCall<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// JSON text without the blanks between its tokens (strings kept byte for byte, members in
/// the order written).
fn compact(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            in_string = c == '"';
            out.push(c);
        }
    }
    out
}

/// Whether JSON text reads as a value in a strict parser: serde_json refuses a number past
/// f64 (`1e999`) and a lone surrogate escape, which a raw value's syntax check lets through.
fn parses(json: &str) -> bool {
    serde_json::from_str::<Value>(json).is_ok()
}

/// The forced call's JSON text as a call (`None` when it was cut short and does not parse).
/// Its grammar admits only JSON a client's parser keeps, so a call that completed always
/// comes back as a call, its arguments as written.
pub fn parse_forced(text: &str) -> Option<ToolCall> {
    let call: JsonCall = serde_json::from_str(text.trim()).ok()?;
    Some(ToolCall {
        id: call_id("call_"),
        name: call.name,
        arguments: call
            .arguments
            .map_or_else(|| "{}".into(), |a| compact(a.get())),
    })
}

const GLM_OPEN: &str = "<tool_call>";
const GLM_CLOSE: &str = "</tool_call>";
const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";

/// Where tool calls begin in a text, whichever syntax opens them.
const MARKERS: [&str; 6] = [
    GLM_OPEN,
    DS_CALLS_BEGIN,
    DS_CALL_BEGIN,
    super::tools_minimax::OPEN,
    super::tools_dsml::OPEN,
    super::tools_dsml::OPEN_AFTER_BLANK,
];

/// Splits an answer into its text before the first call and the calls (in order). A call
/// that does not parse leaves the whole answer as text.
pub fn parse_calls(text: &str) -> (String, Vec<ToolCall>) {
    let Some(start) = MARKERS.iter().filter_map(|m| text.find(m)).min() else {
        return (text.to_string(), Vec::new());
    };
    let rest = &text[start..];
    let calls = if rest.starts_with(GLM_OPEN) {
        parse_tagged(rest)
    } else if rest.starts_with(super::tools_minimax::OPEN) {
        super::tools_minimax::parse(rest)
    } else if rest.trim_start().starts_with(super::tools_dsml::OPEN) {
        super::tools_dsml::parse(rest)
    } else {
        parse_deepseek(rest)
    };
    match calls {
        Some(c) if !c.is_empty() => (text[..start].trim_end().to_string(), c),
        _ => (text.to_string(), Vec::new()),
    }
}

/// `<tool_call>...</tool_call>` blocks: Hermes JSON inside, or GLM's name and arg pairs. The
/// last block may lack its close (the answer ended at the stop token).
fn parse_tagged(mut rest: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    while let Some(at) = rest.find(GLM_OPEN) {
        let body_start = at + GLM_OPEN.len();
        let (body, next) = match rest[body_start..].find(GLM_CLOSE) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + GLM_CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        calls.push(parse_tagged_body(body.trim())?);
        rest = next;
    }
    Some(calls)
}

fn parse_tagged_body(body: &str) -> Option<ToolCall> {
    if let Some(xml) = body.strip_prefix("<function=") {
        return parse_qwen_xml(xml);
    }
    if body.starts_with('{') {
        let call: JsonCall = serde_json::from_str(body).ok()?;
        let arguments = match call.arguments {
            None => "{}".into(),
            // Some models write the arguments as a string of JSON.
            Some(a) if a.get().starts_with('"') => serde_json::from_str::<String>(a.get()).ok()?,
            // Free text, unlike a forced call: refused (the answer stays text) where a
            // client's parser would fail on it.
            Some(a) if parses(a.get()) => compact(a.get()),
            Some(_) => return None,
        };
        return Some(ToolCall {
            id: call_id("call_"),
            name: call.name,
            arguments,
        });
    }
    // GLM: the name up to the first newline or <arg_key>, then key/value pairs.
    let name_end = body.find(['\n', '<']).unwrap_or(body.len());
    let name = body[..name_end].trim();
    if name.is_empty() {
        return None;
    }
    // (key, value as JSON text) in the order written; a key written again takes the later
    // value in its first place.
    let mut args = TextArgs::default();
    let mut rest = &body[name_end..];
    while let Some(k0) = rest.find("<arg_key>") {
        let k1 = rest[k0..].find("</arg_key>")? + k0;
        let key = rest[k0 + "<arg_key>".len()..k1].trim().to_string();
        let after = &rest[k1 + "</arg_key>".len()..];
        let v0 = after.find("<arg_value>")?;
        let v1 = after.find("</arg_value>")?;
        args.set(key, &after[v0 + "<arg_value>".len()..v1]);
        rest = &after[v1 + "</arg_value>".len()..];
    }
    Some(args.call(name))
}

/// Arguments written as key and text pairs (GLM's `<arg_key>`, Qwen's `<parameter=k>`): a
/// value that reads as JSON other than a string (a number, an object) is that value, else
/// text; a key given twice keeps its first place and takes the last value.
#[derive(Default)]
struct TextArgs {
    args: Vec<(String, String)>,
    index: HashMap<String, usize>,
}

impl TextArgs {
    fn set(&mut self, key: String, raw: &str) {
        let value = match serde_json::from_str::<Value>(raw) {
            Ok(v) if !v.is_string() => compact(raw),
            _ => Value::String(raw.to_string()).to_string(),
        };
        match self.index.get(&key) {
            Some(&i) => self.args[i].1 = value,
            None => {
                self.index.insert(key.clone(), self.args.len());
                self.args.push((key, value));
            }
        }
    }

    /// The call, its arguments a JSON object in the order the keys first came.
    fn call(self, name: &str) -> ToolCall {
        let mut arguments = String::from("{");
        for (i, (k, v)) in self.args.iter().enumerate() {
            if i > 0 {
                arguments.push(',');
            }
            arguments.push_str(&Value::String(k.clone()).to_string());
            arguments.push(':');
            arguments.push_str(v);
        }
        arguments.push('}');
        ToolCall {
            id: call_id("call_"),
            name: name.to_string(),
            arguments,
        }
    }
}

/// Qwen3-Coder / Qwen3.5's `<function=name>\n<parameter=k>\nv\n</parameter>\n</function>`
/// (after `<function=`): a value is the text between its tags less one newline each side;
/// one that reads as JSON other than a string (a number, an object) is that value, else text.
/// A missing `</function>` is allowed (the answer ended at the stop token), a parameter
/// without its close is not.
fn parse_qwen_xml(body: &str) -> Option<ToolCall> {
    let name_end = body.find('>')?;
    let name = body[..name_end].trim();
    if name.is_empty() {
        return None;
    }
    let mut args = TextArgs::default();
    let mut rest = &body[name_end + 1..];
    while let Some(p0) = rest.find("<parameter=") {
        let after = &rest[p0 + "<parameter=".len()..];
        let k_end = after.find('>')?;
        let key = after[..k_end].trim().to_string();
        let after = &after[k_end + 1..];
        let v_end = after.find("</parameter>")?;
        let raw = &after[..v_end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        args.set(key, raw.strip_suffix('\n').unwrap_or(raw));
        rest = &after[v_end + "</parameter>".len()..];
    }
    Some(args.call(name))
}

/// DeepSeek's `<｜tool▁call▁begin｜>name<｜tool▁sep｜>args<｜tool▁call▁end｜>` (V3.1), also
/// with V3's `function<｜tool▁sep｜>name\n```json\nargs\n```` body.
fn parse_deepseek(mut rest: &str) -> Option<Vec<ToolCall>> {
    let mut calls = Vec::new();
    while let Some(at) = rest.find(DS_CALL_BEGIN) {
        let body_start = at + DS_CALL_BEGIN.len();
        let (body, next) = match rest[body_start..].find(DS_CALL_END) {
            Some(end) => (
                &rest[body_start..body_start + end],
                &rest[body_start + end + DS_CALL_END.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        let (head, args) = body.split_once(DS_SEP)?;
        let (name, args) = if head.trim() == "function" {
            // V3: `function<sep>name\n```json\n{..}\n````.
            let (name, code) = args.split_once('\n')?;
            let code = code
                .trim()
                .trim_start_matches("```json")
                .trim_end_matches("```");
            (name.trim(), code.trim())
        } else {
            (head.trim(), args.trim())
        };
        if !parses(args) {
            return None;
        }
        calls.push(ToolCall {
            id: call_id("call_"),
            name: name.to_string(),
            arguments: compact(args),
        });
        rest = next;
    }
    Some(calls)
}

/// Keeps a streamed answer's tool-call text out of its content: text goes out as it comes
/// until a call's marker may begin; from a marker on everything is held for the parse at the
/// end (a forced call holds everything from the start).
pub struct Hold {
    mode: ToolMode,
    /// Text not yet released: a possible marker's start, or (once held) the calls.
    pending: String,
    holding: bool,
    /// The content released so far.
    released: String,
    /// gpt-oss's harmony answer, once its first channel shows: its channels split as they
    /// come (the final one released as content, the analysis one as reasoning).
    harmony: Option<super::harmony_stream::HarmonyStream>,
    /// Reasoning released and not yet taken ([`Hold::take_reasoning`]).
    reasoning: String,
}

/// How an answer ended, as [`Hold::finish_all`] tells it.
pub struct Finished {
    /// The content still to send.
    pub rest: String,
    pub calls: Vec<ToolCall>,
    /// The reasoning still to send.
    pub reasoning: String,
}

impl Hold {
    pub fn new(mode: ToolMode) -> Hold {
        let holding = mode.forced();
        Hold {
            mode,
            pending: String::new(),
            holding,
            released: String::new(),
            harmony: None,
            reasoning: String::new(),
        }
    }

    /// Reasoning released since the last call (gpt-oss's analysis channel; empty for every
    /// other family, whose thinking stays in the content as its template writes it).
    pub fn take_reasoning(&mut self) -> String {
        std::mem::take(&mut self.reasoning)
    }

    /// More answer text; returns the content that may go out now.
    pub fn push(&mut self, text: &str) -> String {
        self.pending.push_str(text);
        // gpt-oss answers in harmony's channels: only the final channel goes out as content,
        // as it comes, the analysis one as reasoning, and the calls are parsed at the end,
        // whatever the tool mode.
        if self.harmony.is_none() && crate::engine::harmony::is_harmony(&self.pending) {
            self.harmony = Some(Default::default());
        }
        if let Some(h) = &mut self.harmony {
            let piece = h.push(&std::mem::take(&mut self.pending));
            self.reasoning.push_str(&piece.reasoning);
            self.released.push_str(&piece.content);
            return piece.content;
        }
        if self.holding {
            return String::new();
        }
        if self.mode == ToolMode::Off {
            let out = std::mem::take(&mut self.pending);
            self.released.push_str(&out);
            return out;
        }
        if self.holding {
            return String::new();
        }
        if let Some(at) = MARKERS.iter().filter_map(|m| self.pending.find(m)).min() {
            self.holding = true;
            let out: String = self.pending.drain(..at).collect();
            self.released.push_str(&out);
            return out;
        }
        // Hold the longest tail that is a proper prefix of a marker.
        let keep = MARKERS
            .iter()
            .flat_map(|m| {
                (1..m.len())
                    .filter(|&n| m.is_char_boundary(n))
                    .filter(|&n| self.pending.ends_with(&m[..n]))
            })
            .max()
            .unwrap_or(0);
        let cut = self.pending.len() - keep;
        let out: String = self.pending.drain(..cut).collect();
        self.released.push_str(&out);
        out
    }

    /// The answer ended: the content still to send and the calls.
    pub fn finish(self) -> (String, Vec<ToolCall>) {
        let f = self.finish_all();
        (f.rest, f.calls)
    }

    /// [`Hold::finish`], with the reasoning still to send.
    pub fn finish_all(mut self) -> Finished {
        if let Some(mut h) = self.harmony.take() {
            let piece = h.finish();
            let calls = if self.mode == ToolMode::Off {
                Vec::new()
            } else {
                crate::engine::harmony::parse(h.text()).calls
            };
            self.reasoning.push_str(&piece.reasoning);
            return Finished {
                rest: piece.content,
                calls,
                reasoning: self.reasoning,
            };
        }
        let (rest, calls) = self.finish_plain();
        Finished {
            rest,
            calls,
            reasoning: String::new(),
        }
    }

    fn finish_plain(mut self) -> (String, Vec<ToolCall>) {
        let held = std::mem::take(&mut self.pending);
        match &self.mode {
            ToolMode::Off => (held, Vec::new()),
            ToolMode::Required | ToolMode::Named(_) => match parse_forced(&held) {
                Some(call) => (String::new(), vec![call]),
                None => (held, Vec::new()),
            },
            ToolMode::Auto => {
                let (text, calls) = parse_calls(&held);
                if calls.is_empty() {
                    (held, calls)
                } else {
                    (text, calls)
                }
            }
        }
    }

    /// Content sent so far (for a non-streamed answer, all of it after `finish`).
    pub fn released(&self) -> &str {
        &self.released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss answers in harmony's channels: the content is the final channel's, sent as
    /// it comes, the reasoning the analysis channel's, the calls the commentary ones
    /// addressed to functions, held for the end.
    #[test]
    fn a_harmony_answer_is_its_final_channel_and_its_calls() {
        let mut h = Hold::new(ToolMode::Auto);
        assert_eq!(h.push("<|channel|>analysis<|message|>Think.<|end|>"), "");
        assert_eq!(h.take_reasoning(), "Think.");
        let call = "<|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\": \"Paris\"}";
        assert_eq!(h.push(call), "");
        let f = h.finish_all();
        assert_eq!((f.rest.as_str(), f.reasoning.as_str()), ("", ""));
        assert_eq!(f.calls.len(), 1);
        assert_eq!(f.calls[0].name, "get_weather");
        assert_eq!(f.calls[0].arguments, r#"{"city":"Paris"}"#);
        let mut h = Hold::new(ToolMode::Off);
        let answer = "<|channel|>analysis<|message|>x<|end|><|start|>assistant\
                      <|channel|>final<|message|>Hi";
        assert_eq!(h.push(answer), "Hi");
        assert_eq!(h.push("!<|ret"), "!");
        assert_eq!(h.released(), "Hi!");
        assert_eq!(h.finish(), ("<|ret".to_string(), Vec::new()));
        // A call marker of another family inside the final channel is content.
        let mut h = Hold::new(ToolMode::Auto);
        let text = "<|channel|>final<|message|>see <tool_call>x";
        assert_eq!(h.push(text), "see <tool_call>x");
    }

    #[test]
    fn each_familys_syntax_parses() {
        let glm = "Let me check.<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
        let (text, calls) = parse_calls(glm);
        assert_eq!(text, "Let me check.");
        assert_eq!(calls[0].name, "get_weather");
        assert_eq!(calls[0].arguments, r#"{"city":"Paris","days":2}"#);
        let qwen = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let (text, calls) = parse_calls(qwen);
        assert_eq!(text, "");
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["f", "g"]
        );
        assert_eq!(calls[0].arguments, r#"{"x":1}"#);
        let ds = "ok<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": \"b\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let (text, calls) = parse_calls(ds);
        assert_eq!((text.as_str(), calls[0].name.as_str()), ("ok", "f"));
        assert_eq!(calls[0].arguments, r#"{"a":"b"}"#);
        let xml = "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n2\n</parameter>\n<parameter=note>\nline one\nline two\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=g>\n</function>\n</tool_call>";
        let (text, calls) = parse_calls(xml);
        assert_eq!(text, "Checking.");
        assert_eq!(
            calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(),
            ["get_weather", "g"]
        );
        assert_eq!(
            calls[0].arguments,
            r#"{"city":"New York","days":2,"note":"line one\nline two"}"#
        );
        assert_eq!(calls[1].arguments, "{}");
        // A parameter without its close stays text.
        let cut = "<tool_call>\n<function=f>\n<parameter=a>\n1";
        assert_eq!(parse_calls(cut), (cut.to_string(), Vec::new()));
        // Broken calls stay text.
        let bad = "x<tool_call>{\"name\": ";
        assert_eq!(parse_calls(bad), (bad.to_string(), Vec::new()));
    }

    #[test]
    fn arguments_keep_the_order_written() {
        // Sorted would be {"a":..,"z":..}: what serde_json's map gives after a parse.
        let forced =
            r#"{"name": "f", "arguments": {"z": 1, "a": {"y": "two words", "b": [1, 2.5e-3]}}}"#;
        let call = parse_forced(forced).expect("a complete call");
        assert_eq!(call.name, "f");
        assert_eq!(
            call.arguments,
            r#"{"z":1,"a":{"y":"two words","b":[1,2.5e-3]}}"#
        );
        let hermes = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"zeta\": 1, \"alpha\": \"x\"}}\n</tool_call>";
        assert_eq!(
            parse_calls(hermes).1[0].arguments,
            r#"{"zeta":1,"alpha":"x"}"#
        );
        let ds = "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"zeta\": [1, {\"b\": 2, \"a\": 3}]}<｜tool▁call▁end｜>";
        assert_eq!(
            parse_calls(ds).1[0].arguments,
            r#"{"zeta":[1,{"b":2,"a":3}]}"#
        );
        // GLM's pairs in the order written; a key written twice keeps its first place.
        let glm = "<tool_call>f\n<arg_key>zeta</arg_key><arg_value>{\"q\": 1}</arg_value><arg_key>alpha</arg_key><arg_value>a \"b\"</arg_value><arg_key>zeta</arg_key><arg_value>2</arg_value></tool_call>";
        assert_eq!(
            parse_calls(glm).1[0].arguments,
            r#"{"zeta":2,"alpha":"a \"b\""}"#
        );
    }

    #[test]
    fn a_forced_call_that_completed_is_always_a_call() {
        // Through the hold, as the routes see it: no `content`, one call.
        let mut h = Hold::new(ToolMode::Required);
        assert_eq!(
            h.push(r#"{"name":"f","arguments":{"n":999999999999999,"#),
            ""
        );
        assert_eq!(h.push(r#""x":-0.5e-99}}"#), "");
        let (rest, calls) = h.finish();
        assert_eq!(rest, "");
        assert_eq!(calls[0].arguments, r#"{"n":999999999999999,"x":-0.5e-99}"#);
        // Cut short, it is text (#48 decides what becomes of it).
        let mut h = Hold::new(ToolMode::Required);
        h.push(r#"{"name":"f","argu"#);
        assert!(h.finish().1.is_empty());
    }

    #[test]
    fn an_auto_call_a_strict_parser_refuses_stays_text() {
        // Free text (no grammar): a number past f64 or a lone surrogate would break the
        // client's parse of `arguments`, so the answer stays text as any broken call does.
        for args in [r#"{"x": 2102E+406}"#, r#"{"x": "\ud800"}"#] {
            let text = format!("<tool_call>{{\"name\": \"f\", \"arguments\": {args}}}</tool_call>");
            assert_eq!(parse_calls(&text), (text.clone(), Vec::new()), "{args}");
            let ds = format!("<｜tool▁call▁begin｜>f<｜tool▁sep｜>{args}<｜tool▁call▁end｜>");
            assert!(parse_calls(&ds).1.is_empty(), "{args}");
        }
    }

    #[test]
    fn the_hold_releases_text_until_a_marker() {
        let mut h = Hold::new(ToolMode::Auto);
        let mut out = h.push("Hello <tool");
        assert_eq!(out, "Hello ");
        out += &h.push("ing> x <tool_c");
        assert_eq!(out, "Hello <tooling> x ");
        assert_eq!(
            h.push("all>f\n<arg_key>a</arg_key><arg_value>1</arg_value>"),
            ""
        );
        let (rest, calls) = h.finish();
        assert_eq!(rest, "");
        assert_eq!(calls[0].arguments, r#"{"a":1}"#);
    }

    #[test]
    fn the_forced_schema_names_the_tool() {
        let text = r#"{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}"#;
        let tools = vec![ToolSpec {
            name: "f".into(),
            description: String::new(),
            parameters: serde_json::from_str(text).unwrap(),
            schema_text: text.into(),
        }];
        let s = forced_schema(&tools, &ToolMode::Named("f".into()));
        let v: Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["properties"]["name"]["const"], "f");
        assert!(s.find("\"name\"") < s.find("\"arguments\""));
        crate::grammar::Grammar::from_json_schema(&s).unwrap();
    }

    #[test]
    fn a_tools_refs_point_into_its_own_parameters() {
        let text = r##"{"$defs":{"P":{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"],"additionalProperties":false}},"type":"object","properties":{"p":{"$ref":"#/$defs/P"}},"required":["p"],"additionalProperties":false}"##;
        let tool = |name: &str| ToolSpec {
            name: name.into(),
            description: String::new(),
            parameters: serde_json::from_str(text).unwrap(),
            schema_text: text.into(),
        };
        let tools = vec![tool("f"), tool("g")];
        for mode in [ToolMode::Named("f".into()), ToolMode::Required] {
            let s = forced_schema(&tools, &mode);
            let g = std::sync::Arc::new(crate::grammar::Grammar::from_json_schema(&s).unwrap());
            let ok = |t: &str| {
                let mut st = crate::grammar::GrammarState::new(g.clone());
                st.advance_bytes(t.as_bytes()) && st.accepting()
            };
            assert!(ok(r#"{"name":"f","arguments":{"p":{"n":2}}}"#), "{mode:?}");
            assert!(!ok(r#"{"name":"f","arguments":{"p":{"n":0}}}"#), "{mode:?}");
            assert!(
                !ok(r#"{"name":"f","arguments":{"p":{"n":2}},"x":1}"#),
                "{mode:?}"
            );
        }
    }
}
