//! The top-level fields a request type knows, read from its `Deserialize` impl, so a body's
//! unknown fields can be ignored and named in the log (clients send fields of newer API
//! versions and of other servers: refusing them broke real tools) without a second list of
//! names to keep in step with the struct.

use std::collections::BTreeMap;

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The field names `T`'s derived impl passes to `deserialize_struct` (its serialized names);
/// empty for a type that is not a struct.
pub fn known<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut found: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut found));
    found
}

/// A deserializer that only records the struct's field list and then fails.
struct Probe<'a>(&'a mut &'static [&'static str]);

#[derive(Debug)]
struct Stop;

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("probed")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<M: std::fmt::Display>(_: M) -> Stop {
        Stop
    }
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        *self.0 = fields;
        Err(Stop)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The top-level keys of a JSON object body that are not among `known`, at most `limit` of
/// them (each cut to 64 bytes: they go to the log, and a client chooses them). The values are
/// skipped, not built.
pub fn unknown(body: &[u8], known: &[&str], limit: usize) -> Vec<String> {
    let Ok(obj) = serde_json::from_slice::<BTreeMap<String, de::IgnoredAny>>(body) else {
        return Vec::new();
    };
    obj.into_keys()
        .filter(|k| !known.contains(&k.as_str()))
        .take(limit)
        .map(|k| {
            let mut end = k.len().min(64);
            while !k.is_char_boundary(end) {
                end -= 1;
            }
            k[..end].to_string()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[allow(dead_code)]
    #[derive(Deserialize)]
    struct Req {
        model: Option<String>,
        #[serde(rename = "type")]
        kind: String,
    }

    #[test]
    fn the_derived_names_and_the_others() {
        let k = known::<Req>();
        assert_eq!(k, ["model", "type"]);
        let long = "é".repeat(40);
        let body = serde_json::json!({"model": "x", "type": "t", "top_k": 3, long: 1}).to_string();
        let body = body.as_bytes();
        let u = unknown(body, k, 8);
        assert_eq!(u.len(), 2);
        assert!(u.contains(&"top_k".to_string()));
        assert!(u.iter().all(|n| n.len() <= 64));
        assert_eq!(unknown(body, k, 1).len(), 1);
    }
}
