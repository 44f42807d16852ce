//! The JSON-Schema-Test-Suite (draft 4, the covered keywords' files; see
//! `scripts/json_schema_suite.py`) against the compiled grammar: every valid instance is a
//! sentence, every invalid one is not. An instance is written as serde_json's compact text
//! (the grammar also allows one blank or newline between tokens, which compact text never
//! needs). Cases listed under `excluded` in the fixture, with their reason, are skipped and
//! counted.

use std::sync::Arc;

use super::{json_schema, Grammar, GrammarState};

const SUITE: &str = include_str!("testdata/json_schema_suite.json");

#[test]
fn json_schema_test_suite_covered_keywords() {
    let suite: serde_json::Value = serde_json::from_str(SUITE).expect("the fixture is JSON");
    let excluded = suite["excluded"].as_array().expect("an exclusion list");
    let is_excluded = |file: &str, group: &str, test: &str| {
        excluded.iter().any(|e| {
            e["file"] == file && e["group"] == group && (e["test"].is_null() || e["test"] == test)
        })
    };
    let (mut valid, mut valid_ok, mut invalid, mut invalid_ok, mut skipped) = (0, 0, 0, 0, 0);
    let mut failures = Vec::new();
    let files = suite["files"].as_object().expect("files");
    for (file, groups) in files {
        for g in groups.as_array().expect("groups") {
            let group = g["description"].as_str().expect("a description");
            let schema = serde_json::to_string(&g["schema"]).expect("serializes");
            let compiled = json_schema::compile(&schema, false)
                .map_err(|e| e.to_string())
                .and_then(|c| {
                    Grammar::from_gbnf(&c.gbnf)
                        .map(Arc::new)
                        .map_err(|e| e.to_string())
                });
            for t in g["tests"].as_array().expect("tests") {
                let test = t["description"].as_str().expect("a description");
                if is_excluded(file, group, test) {
                    skipped += 1;
                    continue;
                }
                let should = t["valid"].as_bool().expect("valid");
                let text = serde_json::to_string(&t["data"]).expect("serializes");
                let got = match &compiled {
                    Ok(gr) => {
                        let mut st = GrammarState::new(gr.clone());
                        st.advance_bytes(text.as_bytes()) && st.accepting()
                    }
                    Err(e) => {
                        failures.push(format!("{file} / {group}: schema refused: {e}"));
                        !should
                    }
                };
                if should {
                    valid += 1;
                    valid_ok += usize::from(got);
                } else {
                    invalid += 1;
                    invalid_ok += usize::from(!got);
                }
                if got != should {
                    failures.push(format!(
                        "{file} / {group} / {test}: {text} should be {}",
                        if should { "accepted" } else { "rejected" }
                    ));
                }
            }
        }
    }
    println!(
        "JSON-Schema-Test-Suite draft4, {} keyword files: valid accepted {valid_ok}/{valid}, invalid rejected {invalid_ok}/{invalid}, excluded {skipped}",
        files.len()
    );
    failures.dedup();
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
