//! A checkpoint's own chat template: `chat_template.jinja` beside the model, or the
//! `chat_template` of its `tokenizer_config.json`, rendered with minijinja (and its Python
//! string methods, which Hugging Face templates call) the way transformers'
//! `apply_chat_template` renders it: `messages`, `add_generation_prompt`, `enable_thinking`,
//! `bos_token`, `eos_token`.
//!
//! The engine feeds one turn at a time after the conversation already in the cache, so a
//! later turn is the text the template puts after an earlier answer: the conversation
//! `[user, assistant, user]` is rendered with placeholders for the first two messages, and
//! what follows the assistant's placeholder is this turn (it closes the answer whose stop
//! token was not fed, then opens the next).

use std::path::Path;

use minijinja::{context, Environment, Value};
use serde_json::Value as Json;

use crate::error::EngineError;

/// Marks an earlier message in a later turn's rendering: no template writes it itself.
const EARLIER_USER: &str = "\u{1}colibri-earlier-user\u{1}";
const EARLIER_ANSWER: &str = "\u{1}colibri-earlier-answer\u{1}";

pub struct CheckpointTemplate {
    env: Environment<'static>,
    /// Where the template came from, for error messages.
    origin: String,
    bos: String,
    eos: String,
}

impl CheckpointTemplate {
    /// The template of the model in `dir`, if it has one. A template that does not compile is
    /// an error naming the file.
    pub fn load(dir: &Path) -> Result<Option<CheckpointTemplate>, EngineError> {
        let config_path = dir.join("tokenizer_config.json");
        let config: Json = match std::fs::read_to_string(&config_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                EngineError::Load(format!("{}: not valid JSON: {e}", config_path.display()))
            })?,
            Err(_) => Json::Null,
        };
        let jinja_path = dir.join("chat_template.jinja");
        let (source, origin) = match std::fs::read_to_string(&jinja_path) {
            Ok(s) => (s, jinja_path.display().to_string()),
            Err(_) => match named_template(&config["chat_template"]) {
                Some(s) => (s, format!("{} (chat_template)", config_path.display())),
                None => return Ok(None),
            },
        };
        let token = |key: &str| match &config[key] {
            Json::String(s) => s.clone(),
            Json::Object(o) => o
                .get("content")
                .and_then(Json::as_str)
                .unwrap_or("")
                .to_string(),
            _ => String::new(),
        };
        Self::from_source(source, origin, token("bos_token"), token("eos_token")).map(Some)
    }

    /// A template from its source (a GGUF's `tokenizer.chat_template`), with the texts of the
    /// model's bos and eos tokens; one that does not compile is an error naming `origin`.
    pub fn from_source(
        source: String,
        origin: String,
        bos: String,
        eos: String,
    ) -> Result<CheckpointTemplate, EngineError> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        // As transformers compiles a chat template: blocks trimmed of their newline and of the
        // blanks before them (templates such as MiniMax-M2's rely on it), and its `tojson`.
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.add_filter("tojson", tojson);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        // transformers' other addition: today's date in the template's own words.
        env.add_function("strftime_now", |format: String| {
            super::strftime::Civil::now().format(&format)
        });
        env.add_function("raise_exception", |msg: String| -> Result<Value, _> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        });
        env.add_template_owned("chat", source).map_err(|e| {
            EngineError::Load(format!("{origin}: the chat template does not compile: {e}"))
        })?;
        Ok(CheckpointTemplate {
            env,
            origin,
            bos,
            eos,
        })
    }

    /// The file the template was read from (`chat_template.jinja`, or tokenizer_config.json
    /// with ` (chat_template)` after it).
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// One user turn and the opening of the answer, as [`super::chat::ChatTemplate::turn`].
    pub fn turn(
        &self,
        system: Option<&str>,
        text: &str,
        first: bool,
        think: bool,
    ) -> Result<String, EngineError> {
        let msg = |role: &str, content: &str| context! { role => role, content => content };
        if first {
            let mut messages = Vec::new();
            if let Some(s) = system {
                messages.push(msg("system", s));
            }
            messages.push(msg("user", text));
            return self.render(messages, think);
        }
        let whole = self.render(
            vec![
                msg("user", EARLIER_USER),
                msg("assistant", EARLIER_ANSWER),
                msg("user", text),
            ],
            think,
        )?;
        match whole.find(EARLIER_ANSWER) {
            Some(at) => Ok(whole[at + EARLIER_ANSWER.len()..].to_string()),
            None => Err(EngineError::Load(format!(
                "{}: the chat template drops an earlier answer from the conversation, so a later turn cannot be cut out of it; use --raw prompts",
                self.origin
            ))),
        }
    }

    /// A whole conversation (messages as transformers takes them, tools in OpenAI's form),
    /// ending with the opening of the answer.
    pub fn conversation(
        &self,
        messages: &[Json],
        tools: &[super::conversation::ToolSpec],
        think: bool,
    ) -> Result<String, EngineError> {
        let tools: Vec<Json> = tools.iter().map(|t| t.to_openai()).collect();
        let tools = if tools.is_empty() {
            Value::from(())
        } else {
            Value::from_serialize(&tools)
        };
        self.render_with(Value::from_serialize(messages), Some(tools), think)
    }

    fn render(&self, messages: Vec<Value>, think: bool) -> Result<String, EngineError> {
        self.render_with(Value::from(messages), None, think)
    }

    /// The template over `messages`, ending with the opening of the answer; `tools` is left
    /// undefined when `None` (templates test `tools is defined`).
    fn render_with(
        &self,
        messages: Value,
        tools: Option<Value>,
        think: bool,
    ) -> Result<String, EngineError> {
        let t = self
            .env
            .get_template("chat")
            .map_err(|e| EngineError::Load(format!("{}: {e}", self.origin)))?;
        let base = context! {
            messages => messages,
            add_generation_prompt => true,
            enable_thinking => think,
            bos_token => self.bos,
            eos_token => self.eos,
        };
        let ctx = match tools {
            Some(tools) => context! { tools => tools, ..base },
            None => base,
        };
        t.render(ctx).map_err(|e| {
            EngineError::Load(format!("{}: rendering the chat template: {e}", self.origin))
        })
    }
}

/// transformers' `tojson` (`json.dumps` with its keywords; `pyjson.rs`).
fn tojson(v: &Value, kwargs: minijinja::value::Kwargs) -> Result<Value, minijinja::Error> {
    let bad = |what: &str| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, what.to_string())
    };
    let json: Json = serde_json::to_value(v).map_err(|_| bad("tojson: the value is not JSON"))?;
    let mut d = super::pyjson::Dumps {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent: kwargs.get::<Option<usize>>("indent")?,
        separators: None,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    if let Some(seps) = kwargs.get::<Option<Vec<String>>>("separators")? {
        match <[String; 2]>::try_from(seps) {
            Ok([item, key]) => d.separators = Some((item, key)),
            Err(_) => return Err(bad("tojson: separators must be two strings")),
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(d.dumps(&json)))
}

/// `chat_template` as a string, or transformers' list of `{name, template}` (the "default").
fn named_template(v: &Json) -> Option<String> {
    match v {
        Json::String(s) => Some(s.clone()),
        Json::Array(list) => list
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Qwen3's published template, trimmed to what a plain conversation reaches (the tool and
    /// reasoning branches cut), with its Python string methods and namespace intact.
    const QWEN3: &str = r#"{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages %}
    {%- set content = message.content | string %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' + content }}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"#;

    fn with_config(tag: &str, config: Json) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("colibri-chat-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config.to_string()).unwrap();
        dir
    }

    #[test]
    fn qwens_own_template_renders_as_the_built_in_chatml() {
        let dir = with_config(
            "qwen",
            serde_json::json!({"chat_template": QWEN3, "eos_token": "<|im_end|>"}),
        );
        let t = CheckpointTemplate::load(&dir).unwrap().unwrap();
        let builtin = super::super::chat::ChatTemplate::ChatMl;
        for (system, first, think) in [
            (None, true, true),
            (Some("Be brief."), true, true),
            (None, true, false),
            (None, false, true),
            (None, false, false),
        ] {
            assert_eq!(
                t.turn(system, "Hi", first, think).unwrap(),
                builtin.turn(system, "Hi", first, think),
                "{system:?} first {first} think {think}"
            );
        }
    }

    #[test]
    fn the_jinja_file_wins_and_bad_templates_name_their_file() {
        let dir = with_config("file", serde_json::json!({"chat_template": "unused"}));
        std::fs::write(
            dir.join("chat_template.jinja"),
            "{{ bos_token }}[{{ messages[-1].content }}]",
        )
        .unwrap();
        let t = CheckpointTemplate::load(&dir).unwrap().unwrap();
        assert_eq!(t.turn(None, "Hi", true, true).unwrap(), "[Hi]");
        std::fs::write(dir.join("chat_template.jinja"), "{% if %}").unwrap();
        let e = CheckpointTemplate::load(&dir).err().unwrap().to_string();
        assert!(
            e.contains("chat_template.jinja: the chat template does not compile"),
            "{e}"
        );
        let dir = with_config(
            "raise",
            serde_json::json!({"chat_template": "{{ raise_exception('only user turns') }}"}),
        );
        let t = CheckpointTemplate::load(&dir).unwrap().unwrap();
        let e = t.turn(None, "Hi", true, true).unwrap_err().to_string();
        assert!(
            e.contains("only user turns") && e.contains("tokenizer_config.json"),
            "{e}"
        );
        let none = with_config("none", serde_json::json!({}));
        assert!(CheckpointTemplate::load(&none).unwrap().is_none());
    }
}
