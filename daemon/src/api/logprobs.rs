//! Tokens' logprobs in OpenAI's two shapes: chat's `logprobs.content[]` entries (token, its
//! bytes, logprob, `top_logprobs`) and completions' parallel arrays (`tokens`,
//! `token_logprobs`, `top_logprobs` as objects, `text_offset`).

use serde_json::{json, Map, Value};

use super::worker::TokenLp;

/// OpenAI's figure for a token with no probability at all (JSON has no -inf).
const FLOOR: f32 = -9999.0;

fn value(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        FLOOR
    }
}

fn entry(bytes: &[u8], lp: f32) -> Value {
    json!({"token": String::from_utf8_lossy(bytes), "logprob": value(lp), "bytes": bytes})
}

/// `{"content": [...], "refusal": null}` of a chat choice or chunk.
pub fn chat(lps: &[TokenLp]) -> Value {
    let content: Vec<Value> = lps
        .iter()
        .map(|t| {
            let mut e = entry(&t.bytes, t.logprob);
            e["top_logprobs"] = t.top.iter().map(|(b, l)| entry(b, *l)).collect();
            e
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// A completion choice's `logprobs`, its text offsets counted from `offset` (the echoed
/// prompt's length, or 0). A NaN logprob is a token nothing predicts (an echoed prompt's
/// first): `null`, as OpenAI writes it.
pub fn completion(lps: &[TokenLp], offset: usize) -> Value {
    let mut at = offset;
    let mut tokens = Vec::new();
    let mut logprobs = Vec::new();
    let mut tops = Vec::new();
    let mut offsets = Vec::new();
    for t in lps {
        let text = String::from_utf8_lossy(&t.bytes).into_owned();
        offsets.push(at);
        at += text.len();
        tokens.push(text);
        if t.logprob.is_nan() {
            logprobs.push(Value::Null);
            tops.push(Value::Null);
            continue;
        }
        logprobs.push(json!(value(t.logprob)));
        let top: Map<String, Value> = t
            .top
            .iter()
            .map(|(b, l)| (String::from_utf8_lossy(b).into_owned(), json!(value(*l))))
            .collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops,
           "text_offset": offsets})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_shapes() {
        let lps = vec![TokenLp {
            bytes: b"Hi".to_vec(),
            logprob: -0.5,
            top: vec![(b"Hi".to_vec(), -0.5), (b"Ho".to_vec(), f32::NEG_INFINITY)],
        }];
        let c = chat(&lps);
        assert_eq!(c["content"][0]["token"], "Hi");
        assert_eq!(c["content"][0]["bytes"], json!([72, 105]));
        assert_eq!(
            c["content"][0]["top_logprobs"][1]["logprob"],
            json!(-9999.0)
        );
        let first = TokenLp {
            bytes: b"A".to_vec(),
            logprob: f32::NAN,
            top: vec![],
        };
        let echoed = completion(&[first, lps[0].clone()], 0);
        assert_eq!(echoed["token_logprobs"], json!([null, -0.5]));
        assert_eq!(echoed["top_logprobs"][0], Value::Null);
        assert_eq!(echoed["text_offset"], json!([0, 1]));
        let p = completion(&lps, 3);
        assert_eq!(p["tokens"], json!(["Hi"]));
        assert_eq!(p["token_logprobs"], json!([-0.5]));
        assert_eq!(p["text_offset"], json!([3]));
        assert_eq!(p["top_logprobs"][0]["Ho"], json!(-9999.0));
    }
}
