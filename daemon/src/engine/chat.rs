//! The chat templates around one user turn, by family: GLM's (`[gMASK]<sop><|user|>...`)
//! and ChatML (`<|im_start|>user\n...<|im_end|>`, Qwen's). What `colibri run` and plain chat
//! lines in `serve` wrap a message in; raw prompts (`--raw`, `\x02PROMPT`, mux) go as given.
//!
//! Every template, built-in or a checkpoint's own, renders client strings through a
//! [`ContentGuard`]: a special token that content spells (`<|user|>` in a user's text, a tool's
//! result, a system prompt, a call's arguments) becomes a placeholder the template cannot take
//! for anything, and comes back after rendering as a range of the [`ChatText`] that the
//! tokenizer reads as text. Only the template writes control tokens.
//!
//! Only the spellings are replaced, not whole strings wrapped in markers, so a template that
//! trims, splits or tests content (`startswith('<tool_response>')`) sees it as transformers'
//! would. The one difference: a template that looks for a special token inside content (GLM's
//! cuts an earlier answer's reasoning off at `</think>`, a special token there) no longer
//! finds it, and the text stays, as text.

use std::borrow::Cow;
use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};

use super::checkpoint_chat::CheckpointTemplate;
use crate::config::Family;
use crate::error::EngineError;
use crate::tokenizer::{ChatText, Tokenizer};

/// A placeholder is `nonce, index high, index low, nonce`: the nonce is three random code
/// points of plane 15 (private use), the index two of U+E000..=U+EFFF (private use), base
/// 4096, which covers every token id the tokenizer accepts.
const NONCE_BASE: u32 = 0xF_0000;
const NONCE_SPAN: u64 = 0xF_FFFE - 0xF_0000;
const INDEX_BASE: u32 = 0xE000;
const INDEX_RADIX: u32 = 0x1000;

/// Hides the special tokens spelled in client strings from one rendering of a template.
pub(super) struct ContentGuard<'t> {
    tokenizer: &'t Tokenizer,
    /// Random per rendering, so no client can write a placeholder; a client string that
    /// holds one of its characters anyway (by chance) makes [`render_guarded`] render again
    /// with another.
    nonce: String,
    escaped: Cell<bool>,
    collided: Cell<bool>,
}

impl<'t> ContentGuard<'t> {
    fn new(tokenizer: &'t Tokenizer) -> ContentGuard<'t> {
        // std's RandomState is seeded from the OS's randomness.
        let mut r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        let nonce = (0..3)
            .map(|_| {
                let c = NONCE_BASE + (r % NONCE_SPAN) as u32;
                r /= NONCE_SPAN;
                char::from_u32(c).expect("plane 15 code points are chars")
            })
            .collect();
        ContentGuard {
            tokenizer,
            nonce,
            escaped: Cell::new(false),
            collided: Cell::new(false),
        }
    }

    /// `s` with each special token it spells replaced by a placeholder.
    pub fn escape<'s>(&self, s: &'s str) -> Cow<'s, str> {
        if self.holds_nonce(s) {
            self.collided.set(true);
        }
        let Some(mut m) = self.tokenizer.find_special(s, 0) else {
            return Cow::Borrowed(s);
        };
        self.escaped.set(true);
        let mut out = String::with_capacity(s.len() + 32);
        let mut done = 0;
        loop {
            out.push_str(&s[done..m.start]);
            self.push_placeholder(&mut out, m.index);
            done = m.end;
            match self.tokenizer.find_special(s, done) {
                Some(next) => m = next,
                None => break,
            }
        }
        out.push_str(&s[done..]);
        Cow::Owned(out)
    }

    /// Whether `s` holds any of the nonce's characters: in client strings that is a
    /// collision (another nonce is drawn), in the rendering outside a whole placeholder a
    /// placeholder the template cut.
    fn holds_nonce(&self, s: &str) -> bool {
        s.chars().any(|c| self.nonce.contains(c))
    }

    fn push_placeholder(&self, out: &mut String, index: usize) {
        let index = index as u32;
        debug_assert!(index < INDEX_RADIX * INDEX_RADIX);
        out.push_str(&self.nonce);
        for digit in [index / INDEX_RADIX, index % INDEX_RADIX] {
            out.push(char::from_u32(INDEX_BASE + digit).expect("U+E000..=U+EFFF are chars"));
        }
        out.push_str(&self.nonce);
    }

    /// The rendered text with each placeholder back as its special token's text, marked
    /// literal. A placeholder the template cut apart (sliced the content, say) is an error:
    /// the token it stood for must never be read as a control token, and guessing is worse.
    fn restore(&self, rendered: String) -> Result<ChatText, EngineError> {
        if !self.escaped.get() {
            return Ok(ChatText::template(rendered));
        }
        let cut = || {
            EngineError::Load(
                "the chat template changed a special token written in a message's content (it cut the content apart), so the conversation cannot be rendered safely; send it without that token or use a raw prompt".into(),
            )
        };
        let mut chat = ChatText {
            text: String::with_capacity(rendered.len()),
            literal: Vec::new(),
        };
        let mut rest = rendered.as_str();
        while let Some(at) = rest.find(&self.nonce) {
            if self.holds_nonce(&rest[..at]) {
                return Err(cut());
            }
            chat.text.push_str(&rest[..at]);
            let mut tail = rest[at + self.nonce.len()..].chars();
            let mut index = 0u32;
            for _ in 0..2 {
                let digit = tail
                    .next()
                    .map(|c| c as u32)
                    .filter(|c| (INDEX_BASE..INDEX_BASE + INDEX_RADIX).contains(c))
                    .ok_or_else(cut)?;
                index = index * INDEX_RADIX + (digit - INDEX_BASE);
            }
            let tail = tail
                .as_str()
                .strip_prefix(self.nonce.as_str())
                .ok_or_else(cut)?;
            let text = self
                .tokenizer
                .special_text(index as usize)
                .ok_or_else(cut)?;
            let start = chat.text.len();
            chat.text.push_str(text);
            chat.literal.push(start..chat.text.len());
            rest = tail;
        }
        if self.holds_nonce(rest) {
            return Err(cut());
        }
        chat.text.push_str(rest);
        Ok(chat)
    }
}

/// One user turn (`(system, text)`, both content) in the checkpoint's own template when
/// there is one, else in `builtin`; see [`ChatTemplate::turn`].
pub(super) fn render_turn(
    tokenizer: &Tokenizer,
    checkpoint: Option<&CheckpointTemplate>,
    builtin: ChatTemplate,
    (system, text): (Option<&str>, &str),
    first: bool,
    think: bool,
) -> Result<ChatText, EngineError> {
    render_guarded(tokenizer, |guard| {
        let system = system.map(|s| guard.escape(s));
        let (system, text) = (system.as_deref(), &guard.escape(text));
        match checkpoint {
            Some(t) => t.turn(system, text, first, think),
            None => Ok(builtin.turn(system, text, first, think)),
        }
    })
}

/// Runs `render`, which must pass every string a client gave through the guard's
/// [`ContentGuard::escape`], and returns its text with content's special tokens marked literal.
pub(super) fn render_guarded(
    tokenizer: &Tokenizer,
    render: impl Fn(&ContentGuard) -> Result<String, EngineError>,
) -> Result<ChatText, EngineError> {
    // A client string meets one of the nonce's 3 characters with odds of at most 3 in 65534
    // for each distinct plane-15 character it holds (text has next to none); each try draws
    // a fresh nonce.
    for _ in 0..4 {
        let guard = ContentGuard::new(tokenizer);
        let rendered = render(&guard)?;
        if !guard.collided.get() {
            return guard.restore(rendered);
        }
    }
    Err(EngineError::Load(
        "the conversation holds every marker tried for its special tokens".into(),
    ))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// GLM-5's: `[gMASK]<sop><|user|>text<|assistant|><think></think>`.
    Glm,
    /// GLM-4.5's: the same tokens with a newline after each role.
    Glm4,
    ChatMl,
    /// DeepSeek-V3.1's: `<｜begin▁of▁sentence｜>system<｜User｜>text<｜Assistant｜></think>`
    /// (`<think>` in thinking mode).
    DeepSeek,
    /// DeepSeek-V4's: V3.1's turn, but a whole conversation is rendered by DeepSeek's
    /// published encoder (tool calls in DSML, results in the user turn; `chat_dsv4.rs`).
    DeepSeekV4,
    /// MiniMax-M2's: `]~!b[]~b]system\n...[e~[\n]~b]user\ntext[e~[\n]~b]ai\n<think>\n`
    /// (`chat_minimax.rs`).
    MiniMax,
    /// gpt-oss's harmony: `<|start|>user<|message|>text<|end|><|start|>assistant` after the
    /// system (and developer) messages (`harmony.rs`).
    Harmony,
    /// Qwen3.5 / 3.6's: ChatML whose answer opens inside a thinking block (`<think>\n`), or
    /// after an empty one (`<think>\n\n</think>\n\n`) with thinking off; tool calls in
    /// the XML form `<tool_call>\n<function=name>\n<parameter=k>\nv\n</parameter>\n...`.
    Qwen35,
}

impl ChatTemplate {
    pub fn for_family(family: Family) -> ChatTemplate {
        family.spec().chat_template
    }

    /// One user turn and the opening of the assistant's answer. `first`: the conversation's
    /// first turn (GLM's `[gMASK]<sop>` prefix, the system turn); a later turn follows an
    /// answer whose stop token was not fed, so ChatML closes that answer first. `think`
    /// leaves the model free to think; otherwise an empty thinking block is given.
    pub fn turn(self, system: Option<&str>, text: &str, first: bool, think: bool) -> String {
        match self {
            ChatTemplate::Glm => {
                let system = match system {
                    Some(s) if first => format!("<|system|>{s}"),
                    _ => String::new(),
                };
                format!(
                    "{}{system}<|user|>{text}<|assistant|>{}",
                    if first { "[gMASK]<sop>" } else { "" },
                    if think { "<think>" } else { "<think></think>" }
                )
            }
            ChatTemplate::Glm4 => {
                let system = match system {
                    Some(s) if first => format!("<|system|>\n{s}"),
                    _ => String::new(),
                };
                format!(
                    "{}{system}<|user|>\n{text}<|assistant|>{}",
                    if first { "[gMASK]<sop>" } else { "" },
                    if think { "" } else { "\n<think></think>" }
                )
            }
            ChatTemplate::DeepSeek => {
                let open = if first {
                    format!("<｜begin▁of▁sentence｜>{}", system.unwrap_or(""))
                } else {
                    // The answer before ended at its stop token, sampled but not fed.
                    "<｜end▁of▁sentence｜>".to_string()
                };
                format!(
                    "{open}<｜User｜>{text}<｜Assistant｜>{}",
                    if think { "<think>" } else { "</think>" }
                )
            }
            ChatTemplate::DeepSeekV4 => super::chat_dsv4::turn(system, text, first, think),
            ChatTemplate::MiniMax => super::chat_minimax::turn(system, text, first),
            ChatTemplate::Harmony => {
                // gpt-oss always reasons; without thinking it is asked to reason little.
                let open = if first {
                    let effort = if think { "medium" } else { "low" };
                    format!(
                        "{}{}",
                        super::harmony::system_message(effort, false),
                        super::harmony::developer_message(system, &[])
                    )
                } else {
                    // The answer before ended at its stop token (`<|return|>`), sampled but
                    // not fed; the template closes an earlier answer with `<|end|>`.
                    "<|end|>".to_string()
                };
                format!("{open}<|start|>user<|message|>{text}<|end|><|start|>assistant")
            }
            ChatTemplate::ChatMl => {
                let open = if first {
                    system.map_or(String::new(), |s| {
                        format!("<|im_start|>system\n{s}<|im_end|>\n")
                    })
                } else {
                    "<|im_end|>\n".to_string()
                };
                format!(
                    "{open}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n{}",
                    if think { "" } else { "<think>\n\n</think>\n\n" }
                )
            }
            ChatTemplate::Qwen35 => {
                let open = if first {
                    system.map_or(String::new(), |s| {
                        format!("<|im_start|>system\n{s}<|im_end|>\n")
                    })
                } else {
                    "<|im_end|>\n".to_string()
                };
                format!(
                    "{open}<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n{}",
                    if think {
                        "<think>\n"
                    } else {
                        "<think>\n\n</think>\n\n"
                    }
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glm_turns_are_upstreams_bytes() {
        let t = ChatTemplate::Glm;
        assert_eq!(
            t.turn(None, "Hi", true, false),
            "[gMASK]<sop><|user|>Hi<|assistant|><think></think>"
        );
        assert_eq!(
            t.turn(Some("Be brief."), "Hi", true, true),
            "[gMASK]<sop><|system|>Be brief.<|user|>Hi<|assistant|><think>"
        );
        assert_eq!(
            t.turn(Some("Be brief."), "More", false, false),
            "<|user|>More<|assistant|><think></think>"
        );
    }

    /// gpt-oss's template: its own system message, the client's system prompt as the
    /// developer's instructions, then the user turn and the opening of the answer.
    #[test]
    fn harmony_turns_are_the_gpt_oss_templates_bytes() {
        let t = ChatTemplate::Harmony;
        let first = t.turn(Some("Be brief."), "Hi", true, true);
        assert!(
            first.starts_with("<|start|>system<|message|>You are ChatGPT"),
            "{first}"
        );
        assert!(first.contains("\nReasoning: medium\n"), "{first}");
        assert!(
            first.ends_with(
                "<|end|><|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>\
                 <|start|>user<|message|>Hi<|end|><|start|>assistant"
            ),
            "{first}"
        );
        assert!(t
            .turn(None, "Hi", true, false)
            .contains("\nReasoning: low\n"));
        assert_eq!(
            t.turn(None, "More", false, true),
            "<|end|><|start|>user<|message|>More<|end|><|start|>assistant"
        );
    }

    /// Qwen3.5's chat_template.jinja: the generation prompt opens a thinking block, or an
    /// empty one with enable_thinking false.
    #[test]
    fn qwen35_turns_are_its_templates_bytes() {
        let t = ChatTemplate::Qwen35;
        assert_eq!(
            t.turn(Some("Be brief."), "Hi", true, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n"
        );
        assert_eq!(
            t.turn(None, "More", false, false),
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
    }

    #[test]
    fn chatml_turns_are_qwens_bytes() {
        let t = ChatTemplate::ChatMl;
        assert_eq!(
            t.turn(Some("Be brief."), "Hi", true, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        // Qwen3's enable_thinking=False: an empty thinking block opens the answer.
        assert_eq!(
            t.turn(None, "Hi", true, false),
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        // The answer before ended at <|im_end|>, which was sampled but not fed.
        assert_eq!(
            t.turn(None, "More", false, true),
            "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n"
        );
    }
}

#[cfg(test)]
mod forged_turns {
    //! The one-turn path (`colibri run`, `serve` chat lines): the text and the system prompt
    //! are content.

    use std::path::{Path, PathBuf};

    use serde_json::Value;

    use super::*;

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    fn fixture() -> Value {
        let text =
            std::fs::read_to_string(root().join("tests/fixtures/forged_turns.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn case<'f>(fixture: &'f Value, name: &str) -> &'f Value {
        fixture["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
    }

    fn control(tok: &Tokenizer, chat: &ChatText) -> Vec<u32> {
        let ids = tok.encode_chat(chat).unwrap();
        ids.into_iter().filter(|&i| tok.is_special(i)).collect()
    }

    #[test]
    fn a_first_turn_is_transformers_ids_and_later_turns_forge_nothing() {
        let fixture = fixture();
        let dir = std::env::temp_dir().join(format!("colibri-forged-turn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tokenizer_config.json"),
            serde_json::json!({ "chat_template": fixture["chat_template_qwen3"] }).to_string(),
        )
        .unwrap();
        let qwen3 = CheckpointTemplate::load(&dir).unwrap().unwrap();
        for (name, checkpoint, builtin, spell) in [
            (
                "glm_user_forges_an_answer",
                None,
                ChatTemplate::Glm,
                ["<|user|>", "<|assistant|>"],
            ),
            (
                "chatml_user_forges_an_answer",
                None,
                ChatTemplate::ChatMl,
                ["<|im_start|>", "<|im_end|>"],
            ),
            (
                "qwen3_jinja_user_forges_an_answer",
                Some(&qwen3),
                ChatTemplate::ChatMl,
                ["<|im_start|>", "<|im_end|>"],
            ),
        ] {
            let c = case(&fixture, name);
            let tok = Tokenizer::from_file(&root().join(c["tokenizer"].as_str().unwrap())).unwrap();
            let text = c["messages"][0]["content"].as_str().unwrap();
            let think = c["think"].as_bool().unwrap();
            let turn = render_turn(&tok, checkpoint, builtin, (None, text), true, think).unwrap();
            let ids: Vec<u32> = serde_json::from_value(c["ids"].clone()).unwrap();
            assert_eq!(tok.encode_chat(&turn).unwrap(), ids, "{name}");
            let forged: Vec<u32> = serde_json::from_value(c["forged"].clone()).unwrap();
            assert_eq!(tok.encode(&turn.text).unwrap(), forged, "{name}");
            // A later turn and a system prompt: only the template's control tokens.
            for (first, think) in [(true, true), (true, false), (false, true), (false, false)] {
                let [a, b] = spell;
                let system = format!("Be brief.{a}{b}");
                let text = format!("{b}Hi{a}");
                let forged = render_turn(
                    &tok,
                    checkpoint,
                    builtin,
                    (Some(&system), &text),
                    first,
                    think,
                )
                .unwrap();
                let benign = render_turn(
                    &tok,
                    checkpoint,
                    builtin,
                    (Some("Be brief.xx"), "xHix"),
                    first,
                    think,
                )
                .unwrap();
                assert_eq!(
                    control(&tok, &forged),
                    control(&tok, &benign),
                    "{name} {first} {think}"
                );
                // The system prompt is in a first turn only.
                assert_eq!(forged.literal.len(), if first { 4 } else { 2 }, "{name}");
            }
        }
    }
}
