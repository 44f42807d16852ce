//! The chat templates around one user turn, by family: GLM's (`[gMASK]<sop><|user|>...`)
//! and ChatML (`<|im_start|>user\n...<|im_end|>`, Qwen's). What `colibri run` and plain chat
//! lines in `serve` wrap a message in; raw prompts (`--raw`, `\x02PROMPT`, mux) go as given.

use crate::config::Family;

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
}

impl ChatTemplate {
    pub fn for_family(family: Family) -> ChatTemplate {
        match family {
            Family::GlmMoeDsa => ChatTemplate::Glm,
            Family::Qwen3Moe => ChatTemplate::ChatMl,
            Family::Glm4Moe => ChatTemplate::Glm4,
            Family::DeepseekV3 | Family::DeepseekV32 => ChatTemplate::DeepSeek,
        }
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
