//! The sampling and reasoning fields clients send beside temperature and top_p, checked and
//! turned into the engine's [`SamplingParams`] and the template's thinking switch. A field
//! the request leaves out keeps the server's own setting (`--top-k`, `--min-p`,
//! `--repeat-penalty`, `--think`).

use serde_json::Value;

use super::errors::{ApiError, Flavor};
use crate::sampling::SamplingParams;

/// Most choices a request may ask for (`n`): each takes a session of its own.
pub const MAX_N: u64 = 8;
/// Most alternatives a token's logprobs list (OpenAI's limits: 20 for chat, 5 for
/// completions).
pub const MAX_TOP_LOGPROBS: u64 = 20;
pub const MAX_COMPLETION_LOGPROBS: u64 = 5;

/// The filters and penalties of a request, as given.
#[derive(Default)]
pub struct Knobs {
    pub top_k: Option<u64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
}

impl Knobs {
    /// The server's `defaults` with the request's own values, each checked: top_k any
    /// count (0: off), min_p in 0..=1, repetition_penalty in (0, 10], the OpenAI penalties in
    /// -2..=2.
    pub fn params(
        &self,
        defaults: SamplingParams,
        flavor: Flavor,
    ) -> Result<SamplingParams, ApiError> {
        let mut p = defaults;
        if let Some(k) = self.top_k {
            p.top_k = k.min(usize::MAX as u64) as usize;
        }
        let check = |name: &str, v: Option<f64>, ok: &dyn Fn(f64) -> bool, range: &str| match v {
            Some(x) if !(x.is_finite() && ok(x)) => {
                Err(ApiError::invalid(name, format!("{name} must be in {range}")).flavor(flavor))
            }
            _ => Ok(v.map(|x| x as f32)),
        };
        if let Some(m) = check("min_p", self.min_p, &|x| (0.0..=1.0).contains(&x), "0..=1")? {
            p.min_p = m;
        }
        let rp = check(
            "repetition_penalty",
            self.repetition_penalty,
            &|x| x > 0.0 && x <= 10.0,
            "(0, 10]",
        )?;
        if let Some(r) = rp {
            p.repeat_penalty = r;
        }
        let openai = |x: f64| (-2.0..=2.0).contains(&x);
        if let Some(f) = check(
            "frequency_penalty",
            self.frequency_penalty,
            &openai,
            "-2..=2",
        )? {
            p.frequency_penalty = f;
        }
        if let Some(f) = check("presence_penalty", self.presence_penalty, &openai, "-2..=2")? {
            p.presence_penalty = f;
        }
        Ok(p)
    }
}

/// `n` (absent: 1): 1..=[`MAX_N`], else a 400 naming it.
pub fn choices(n: Option<u64>, flavor: Flavor) -> Result<usize, ApiError> {
    match n.unwrap_or(1) {
        n @ 1..=MAX_N => Ok(n as usize),
        n => Err(ApiError::out_of_range(
            "n",
            format!("n must be in 1..={MAX_N} (each choice takes a session); got {n}"),
        )
        .flavor(flavor)),
    }
}

/// OpenAI's `reasoning_effort` as the template's thinking switch: `none` and `minimal` turn
/// thinking off, `low`, `medium`, `high` and `max` on. `max` is DeepSeek's level above
/// `high` (V4's encoder adds its preamble, `Conversation::max_effort`); DeepSeek's API reads
/// `low` and `medium` as `high`. A family whose template has no switch ignores it.
pub fn effort_think(effort: Option<&str>, flavor: Flavor) -> Result<Option<bool>, ApiError> {
    match effort {
        None => Ok(None),
        Some("none" | "minimal") => Ok(Some(false)),
        Some("low" | "medium" | "high" | "max") => Ok(Some(true)),
        Some(other) => Err(ApiError::invalid(
            "reasoning_effort",
            format!(
                "reasoning_effort must be none, minimal, low, medium, high or max, not {other:?}"
            ),
        )
        .flavor(flavor)),
    }
}

/// Anthropic's `thinking` (`{"type": "enabled", "budget_tokens": N}` or `{"type":
/// "disabled"}`) as the template's thinking switch.
pub fn anthropic_think(thinking: Option<&Value>, flavor: Flavor) -> Result<Option<bool>, ApiError> {
    let Some(t) = thinking else {
        return Ok(None);
    };
    match t.get("type").and_then(Value::as_str) {
        Some("enabled") => Ok(Some(true)),
        Some("disabled") => Ok(Some(false)),
        _ => Err(ApiError::invalid(
            "thinking",
            "thinking must be {\"type\": \"enabled\", \"budget_tokens\": N} or {\"type\": \"disabled\"}",
        )
        .flavor(flavor)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_override_the_defaults_and_are_checked() {
        let d = SamplingParams {
            top_k: 40,
            ..Default::default()
        };
        let k = Knobs {
            min_p: Some(0.1),
            frequency_penalty: Some(-0.5),
            ..Default::default()
        };
        let p = k.params(d, Flavor::OpenAi).unwrap();
        assert_eq!((p.top_k, p.min_p, p.frequency_penalty), (40, 0.1, -0.5));
        assert_eq!(p.repeat_penalty, 1.0);
        for bad in [
            Knobs {
                min_p: Some(1.5),
                ..Default::default()
            },
            Knobs {
                repetition_penalty: Some(0.0),
                ..Default::default()
            },
            Knobs {
                presence_penalty: Some(2.5),
                ..Default::default()
            },
            Knobs {
                frequency_penalty: Some(f64::NAN),
                ..Default::default()
            },
        ] {
            assert!(bad.params(d, Flavor::OpenAi).is_err());
        }
        assert_eq!(choices(None, Flavor::OpenAi).unwrap(), 1);
        assert_eq!(choices(Some(8), Flavor::OpenAi).unwrap(), 8);
        let e = choices(Some(9), Flavor::OpenAi).unwrap_err();
        assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some("n")));
        assert!(choices(Some(0), Flavor::OpenAi).is_err());
        assert_eq!(
            effort_think(Some("high"), Flavor::OpenAi).unwrap(),
            Some(true)
        );
        assert_eq!(
            effort_think(Some("minimal"), Flavor::OpenAi).unwrap(),
            Some(false)
        );
        // DeepSeek's level above high: thinking on (V4 adds its preamble).
        assert_eq!(
            effort_think(Some("max"), Flavor::OpenAi).unwrap(),
            Some(true)
        );
        let e = effort_think(Some("xhigh"), Flavor::OpenAi).unwrap_err();
        assert_eq!(
            (e.status.as_u16(), e.param.as_deref()),
            (422, Some("reasoning_effort"))
        );
        assert!(
            e.message.contains("\"xhigh\"") && e.message.contains("high or max"),
            "{}",
            e.message
        );
        let off = serde_json::json!({"type": "disabled"});
        assert_eq!(
            anthropic_think(Some(&off), Flavor::Anthropic).unwrap(),
            Some(false)
        );
    }
}
