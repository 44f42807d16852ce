//! Telemetry transcripts: lines written and parsed back, and malformed lines refused.

use super::*;

#[test]
fn sessions_transcript() {
    let t = Telemetry::Sessions(vec![
        SessionInfo {
            slot: 0,
            state: SessionState::Decode,
            id: 7,
            ctx_tokens: 130,
            generated: 12,
        },
        SessionInfo {
            slot: 1,
            state: SessionState::Prefill,
            id: 8,
            ctx_tokens: 2048,
            generated: 0,
        },
        SessionInfo {
            slot: 3,
            state: SessionState::Idle,
            id: 0,
            ctx_tokens: 77,
            generated: 5,
        },
    ]);
    let line = "SESSIONS 3 0 decode 7 130 12 1 prefill 8 2048 0 3 idle 0 77 5";
    assert_eq!(t.to_line(), line);
    assert_eq!(parse_telemetry_line(line.as_bytes()), Some(t));
    assert_eq!(
        parse_telemetry_line(b"SESSIONS 0\n"),
        Some(Telemetry::Sessions(vec![]))
    );
    // Fields after the n groups are ignored (additive extensions).
    assert!(matches!(
        parse_telemetry_line(b"SESSIONS 1 2 idle 0 0 0 future=1"),
        Some(Telemetry::Sessions(v)) if v.len() == 1 && v[0].slot == 2
    ));
}

#[test]
fn spec_transcript() {
    let t = Telemetry::Spec(Spec {
        slot: 2,
        tokens: 90,
        forwards: 40,
        max_draft: 3,
        drafting_forwards: 30,
        mtp: SpecSource {
            proposed: 60,
            accepted: 33,
        },
        ngram: SpecSource {
            proposed: 12,
            accepted: 3,
        },
        grammar: SpecSource::default(),
    });
    let line = "SPEC 2 90 40 2.25 3 2.40 30 mtp 60 33 55.0 ngram 12 3 25.0 grammar 0 0 0.0";
    assert_eq!(t.to_line(), line);
    assert_eq!(parse_telemetry_line(line.as_bytes()), Some(t));
    // The derived figures are recomputed from the counts, not trusted.
    let Some(Telemetry::Spec(x)) = parse_telemetry_line(
        b"SPEC 0 10 10 9.99 0 9.99 0 mtp 0 0 50.0 ngram 0 0 0.0 grammar 4 4 0.0 more=1\n",
    ) else {
        panic!("SPEC line with a trailing field did not parse");
    };
    assert_eq!(x.tokens_per_forward(), 1.0);
    assert_eq!(x.mean_draft(), 0.0);
    assert_eq!(x.grammar.acceptance_pct(), Some(100.0));
    assert_eq!(x.mtp.acceptance_pct(), None);
}

#[test]
fn malformed_spec_lines() {
    let good = "SPEC 0 3 2 1.50 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0 grammar 0 0 0.0";
    assert!(parse_telemetry_line(good.as_bytes()).is_some());
    for bad in [
        "SPEC",
        "SPEC 0 3 2 1.50 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0",
        "SPEC 0 3 2 1.50 2 1.00 1 ngram 1 1 100.0 mtp 0 0 0.0 grammar 0 0 0.0",
        "SPEC 0 3 2 x 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0 grammar 0 0 0.0",
        // More accepted than proposed.
        "SPEC 0 3 2 1.50 2 1.00 1 mtp 1 2 200.0 ngram 0 0 0.0 grammar 0 0 0.0",
        "SPEC -1 3 2 1.50 2 1.00 1 mtp 1 1 100.0 ngram 0 0 0.0 grammar 0 0 0.0",
    ] {
        assert_eq!(parse_telemetry_line(bad.as_bytes()), None, "{bad}");
    }
}

#[test]
fn live_tokens_per_forward_is_optional() {
    let old = parse_telemetry_line(b"LIVE 3 6.00 50.0 1.30 0");
    let Some(Telemetry::Live(l)) = &old else {
        panic!("{old:?}")
    };
    assert_eq!(l.tokens_per_forward, None);
    assert_eq!(old.unwrap().to_line(), "LIVE 3 6.00 50.0 1.30 0");
    let new = Telemetry::Live(Live {
        tokens: 3,
        tok_per_s: 6.0,
        hit_pct: 50.0,
        rss_gb: 1.3,
        slot: 0,
        tokens_per_forward: Some(2.5),
    });
    assert_eq!(new.to_line(), "LIVE 3 6.00 50.0 1.30 0 2.50");
    assert_eq!(
        parse_telemetry_line(b"LIVE 3 6.00 50.0 1.30 0 2.50"),
        Some(new)
    );
    assert_eq!(parse_telemetry_line(b"LIVE 3 6.00 50.0 1.30 0 x"), None);
}

#[test]
fn grammar_transcript() {
    let t = Telemetry::Grammar(GrammarEnd {
        id: 18446744073709551615,
        complete: false,
    });
    assert_eq!(t.to_line(), "GRAMMAR 18446744073709551615 incomplete");
    assert_eq!(
        parse_telemetry_line(b"GRAMMAR 18446744073709551615 incomplete\n"),
        Some(t)
    );
    assert_eq!(
        parse_telemetry_line(b"GRAMMAR 7 complete later=1"),
        Some(Telemetry::Grammar(GrammarEnd {
            id: 7,
            complete: true
        }))
    );
    for bad in [
        &b"GRAMMAR"[..],
        b"GRAMMAR 7",
        b"GRAMMAR x complete",
        b"GRAMMAR -1 complete",
        b"GRAMMAR 7 done",
    ] {
        assert_eq!(parse_telemetry_line(bad), None, "{bad:?}");
    }
}

#[test]
fn malformed_sessions_lines() {
    for bad in [
        &b"SESSIONS"[..],
        b"SESSIONS x",
        b"SESSIONS 2 0 idle 0 0 0",
        b"SESSIONS 1 0 busy 0 0 0",
        b"SESSIONS 1 0 decode 7 130",
        b"SESSIONS 1 -1 decode 7 130 1",
        b"SESSIONS 4294967295 0 idle 0 0 0",
    ] {
        assert_eq!(parse_telemetry_line(bad), None, "{bad:?}");
    }
}
