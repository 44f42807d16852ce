//! `--telemetry-fd`: the telemetry lines arrive on their own descriptor, every one parses, and
//! stdout carries exactly the same protocol bytes with or without it.

use std::io::Write;
use std::process::Stdio;

use colibri_e2e::{bin, fixture, temp_dir};
use protocol::{parse_telemetry_line, Telemetry};

/// Runs `colibri serve` over `input` to EOF; with `telemetry`, fd 3 goes to that file. The
/// pilot is off: a guess read in time counts as a hit, so with `--pilot auto`'s reads ahead (on
/// here, 2 of the experts cached) STAT's hit % would follow the I/O's timing between runs.
fn session(input: &[u8], telemetry: Option<&std::path::Path>, state: &std::path::Path) -> Vec<u8> {
    let mut script = String::from(
        "exec \"$0\" serve --temp 0 --repin 1 --cache 2 --pilot off --snap \"$1\" --state-dir \"$2\"",
    );
    if telemetry.is_some() {
        script.push_str(" --telemetry-fd 3 3>\"$3\"");
    }
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(bin("colibri"))
        .arg(fixture("tiny-moe-bias"))
        .arg(state)
        .arg(
            telemetry
                .map(|p| p.as_os_str().to_owned())
                .unwrap_or_default(),
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// STAT's tok/s and RSS fields vary from run to run; everything else must not.
fn normalise(stdout: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for line in stdout.split_inclusive(|&b| b == b'\n') {
        if line.starts_with(b"STAT ") {
            let f: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
            for (i, field) in f.iter().enumerate() {
                if i > 0 {
                    out.push(b' ');
                }
                out.extend_from_slice(if i == 2 || i == 4 { b"_" } else { field });
            }
        } else {
            out.extend_from_slice(line);
        }
    }
    out
}

#[test]
fn telemetry_goes_to_its_fd_and_never_changes_stdout() {
    let input = b"Hello there\nTell me about the sea.\n\x02MORE\n";
    let a = temp_dir("tele-a");
    let b = temp_dir("tele-b");
    let file = a.join("telemetry.log");
    let with = session(input, Some(&file), &a);
    let without = session(input, None, &b);
    assert_eq!(normalise(&with), normalise(&without));

    let text = std::fs::read(&file).unwrap();
    let mut kinds = std::collections::BTreeSet::new();
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let t = parse_telemetry_line(line)
            .unwrap_or_else(|| panic!("unparsable: {:?}", String::from_utf8_lossy(line)));
        assert!(!matches!(t, Telemetry::Unknown(_)), "unknown kind: {t:?}");
        kinds.insert(t.kind().unwrap_or("?").to_string());
    }
    for k in [
        "STATE",
        "PROGRESS",
        "LIVE",
        "TIERS",
        "EMAP",
        "HITS",
        "PROF",
        "DISKCLASS",
        "SPEC",
    ] {
        assert!(kinds.contains(k), "no {k} line; got {kinds:?}");
    }
}

/// `colibri serve` on the bundled demo model with `--draft <draft>` over `input`: stdout and
/// the telemetry lines.
fn demo_session(input: &[u8], draft: &str, state: &std::path::Path) -> (Vec<u8>, Vec<Telemetry>) {
    let file = state.join("telemetry.log");
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" serve --temp 0 --draft \"$1\" --state-dir \"$2\" --telemetry-fd 3 3>\"$3\"")
        .arg(bin("colibri"))
        .arg(draft)
        .arg(state)
        .arg(&file)
        .env_remove("DRAFT")
        .env_remove("MTP")
        .env_remove("NGEN")
        .env_remove("SNAP")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = std::fs::read(&file).unwrap();
    let lines = text
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| parse_telemetry_line(l).expect("telemetry lines parse"))
        .collect();
    (out.stdout, lines)
}

/// Completion tokens of each turn's STAT line.
fn completions(stdout: &[u8]) -> Vec<u64> {
    stdout
        .split(|&b| b == b'\n')
        .filter_map(|l| l.strip_prefix(b"STAT "))
        .map(|l| {
            String::from_utf8_lossy(l)
                .split(' ')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .filter(|&n: &u64| n > 0)
        .collect()
}

#[test]
fn spec_line_reports_each_turns_drafts_on_the_demo_model() {
    let input = b"The sea, the sea, the sea and the sea.\nAgain: the sea, the sea.\n";
    let on_dir = temp_dir("tele-spec-on");
    let off_dir = temp_dir("tele-spec-off");
    let (on_out, on) = demo_session(input, "2", &on_dir);
    let (off_out, off) = demo_session(input, "0", &off_dir);
    // Lossless: greedy text is the same with drafts on and off (STAT's hit % is not: a
    // verify forward reads its experts once for all its rows).
    let text = |out: &[u8]| -> String {
        String::from_utf8_lossy(out)
            .split_inclusive('\n')
            .filter(|l| !l.starts_with("STAT "))
            .collect()
    };
    assert_eq!(text(&on_out), text(&off_out));
    let turns = completions(&on_out);
    assert_eq!(turns.len(), 2, "{}", String::from_utf8_lossy(&on_out));

    let specs = |lines: &[Telemetry]| -> Vec<protocol::Spec> {
        lines
            .iter()
            .filter_map(|t| match t {
                Telemetry::Spec(s) => Some(s.clone()),
                _ => None,
            })
            .collect()
    };
    let (on_specs, off_specs) = (specs(&on), specs(&off));
    assert_eq!(on_specs.len(), 2, "one SPEC line per turn: {on:?}");
    assert_eq!(off_specs.len(), 2, "one SPEC line per turn: {off:?}");

    let mut accepted_in_all = 0;
    for (s, &completion) in on_specs.iter().zip(&turns) {
        assert_eq!((s.slot, s.max_draft), (0, 2), "{s:?}");
        // Every sampled token is counted once: the turn's STAT agrees.
        assert_eq!(s.tokens, completion, "{s:?}");
        // No grammar, no forced spans; a source never accepts more than it proposed.
        assert_eq!(s.grammar, protocol::SpecSource::default());
        for (name, src) in s.sources() {
            assert!(src.accepted <= src.proposed, "{name}: {s:?}");
        }
        let proposed = s.mtp.proposed + s.ngram.proposed;
        let accepted = s.mtp.accepted + s.ngram.accepted;
        // Each forward gives one token of its own plus its accepted drafts; only the turn's
        // last forward may stop short of its own token (the length limit or a stop token).
        assert!(
            s.forwards + accepted - 1 <= s.tokens && s.tokens <= s.forwards + accepted,
            "{s:?}"
        );
        assert!(s.drafting_forwards <= s.forwards, "{s:?}");
        assert!(proposed >= s.drafting_forwards, "{s:?}");
        assert!(proposed <= 2 * s.drafting_forwards, "{s:?}");
        let mean = s.mean_draft();
        assert!(
            s.drafting_forwards == 0 || (1.0..=2.0).contains(&mean),
            "{s:?}"
        );
        accepted_in_all += accepted;
    }
    // The repetitive answer is what prompt lookup predicts: drafts were taken, so a forward
    // gave more than one token.
    assert!(accepted_in_all > 0, "{on_specs:?}");
    let tokens: u64 = on_specs.iter().map(|s| s.tokens).sum();
    let forwards: u64 = on_specs.iter().map(|s| s.forwards).sum();
    assert!(forwards < tokens, "{on_specs:?}");

    // Drafts off: one token per forward, nothing proposed.
    for (s, &completion) in off_specs.iter().zip(&turns) {
        assert_eq!(s.max_draft, 0);
        assert_eq!(s.tokens, completion);
        assert_eq!(s.forwards, s.tokens, "{s:?}");
        assert_eq!(s.drafting_forwards, 0);
        assert_eq!(s.tokens_per_forward(), 1.0);
        for (_, src) in s.sources() {
            assert_eq!(src, protocol::SpecSource::default());
        }
    }

    // LIVE carries the turn's tokens/forward so far: at least one token per forward.
    let live: Vec<f64> = on
        .iter()
        .filter_map(|t| match t {
            Telemetry::Live(l) => l.tokens_per_forward,
            _ => None,
        })
        .collect();
    assert!(!live.is_empty(), "{on:?}");
    assert!(live.iter().all(|&x| x >= 1.0), "{live:?}");
}

/// Mux mode: each request's SPEC line (telemetry fd only) covers that request's session alone,
/// while another session decodes in the same batched forwards.
#[test]
fn mux_spec_lines_are_per_request_and_never_on_stdout() {
    let dir = temp_dir("tele-spec-mux");
    let file = dir.join("telemetry.log");
    let input = b"SUBMIT 1 0 5 20 0 1\nhello\nSUBMIT 2 1 9 30 0 1\nthe sea, \n";
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("exec \"$0\" serve --mux --kv-slots 2 --draft 2 --state-dir \"$1\" --telemetry-fd 3 3>\"$2\"")
        .arg(bin("colibri"))
        .arg(&dir)
        .arg(&file)
        .env_remove("DRAFT")
        .env_remove("MTP")
        .env_remove("SNAP")
        .env_remove("KV_SLOTS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.lines().any(|l| l.starts_with("SPEC ")), "{stdout}");
    // DONE <id> STAT <completion> ...: completion tokens by slot (request 1 is on slot 0).
    let mut done = std::collections::BTreeMap::new();
    for l in stdout.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        if f.first() == Some(&"DONE") {
            let slot: u32 = if f[1] == "1" { 0 } else { 1 };
            done.insert(slot, f[3].parse::<u64>().unwrap());
        }
    }
    assert_eq!(done.len(), 2, "{stdout}");
    let text = std::fs::read(&file).unwrap();
    let specs: Vec<protocol::Spec> = text
        .split(|&b| b == b'\n')
        .filter_map(|l| match parse_telemetry_line(l) {
            Some(Telemetry::Spec(s)) => Some(s),
            _ => None,
        })
        .collect();
    assert_eq!(specs.len(), 2, "one SPEC per request");
    for s in &specs {
        assert_eq!(Some(&s.tokens), done.get(&s.slot), "{s:?} vs {done:?}");
        assert_eq!(s.max_draft, 2);
        let accepted = s.mtp.accepted + s.ngram.accepted;
        assert!(
            s.forwards + accepted - 1 <= s.tokens && s.tokens <= s.forwards + accepted,
            "{s:?}"
        );
    }
    let slots: std::collections::BTreeSet<u32> = specs.iter().map(|s| s.slot).collect();
    assert_eq!(slots.len(), 2, "{specs:?}");
}

/// The dashboard moves during a turn: with every LIVE line (the first one at the first token,
/// then every 250 ms) the telemetry fd carries TIERS and EMAP, before the turn's end block
/// (PROF); the start-up block has HWINFO, TIERS and EMAP before the first `STATE idle`. And
/// stdout is the same bytes with the channel as without it.
#[test]
fn tiers_and_the_map_arrive_during_a_turn_on_the_fd_only() {
    let input = b"Hello there\nTell me about the sea.\n";
    let a = temp_dir("tele-live-a");
    let b = temp_dir("tele-live-b");
    let file = a.join("telemetry.log");
    let with = session(input, Some(&file), &a);
    let without = session(input, None, &b);
    assert_eq!(normalise(&with), normalise(&without));
    // stdout has no more than upstream's start-up TIERS and the turns: no EMAP, no HWINFO.
    let text = String::from_utf8_lossy(&with);
    assert!(
        !text.contains("EMAP ") && !text.contains("HWINFO "),
        "{text}"
    );

    let raw = std::fs::read(&file).unwrap();
    let lines: Vec<Telemetry> = raw
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            parse_telemetry_line(l)
                .unwrap_or_else(|| panic!("unparsable: {:?}", String::from_utf8_lossy(l)))
        })
        .collect();
    let kinds: Vec<String> = lines
        .iter()
        .map(|t| t.kind().unwrap_or("?").to_string())
        .collect();
    let ready = lines
        .iter()
        .position(|t| *t == Telemetry::State(protocol::EngineState::Idle))
        .expect("STATE idle at start-up");
    for k in ["HWINFO", "TIERS", "EMAP"] {
        assert!(
            kinds[..ready].contains(&k.to_string()),
            "{k} not at start-up: {kinds:?}"
        );
    }
    // Each turn: LIVE, TIERS, EMAP in this order, before its PROF.
    let mut turns = 0;
    let mut rest = &kinds[..];
    while let Some(prof) = rest.iter().position(|k| k == "PROF") {
        let turn = &rest[..prof];
        let live = turn
            .iter()
            .position(|k| k == "LIVE")
            .unwrap_or_else(|| panic!("no LIVE before PROF: {turn:?}"));
        assert_eq!(
            &turn[live..live + 3],
            ["LIVE", "TIERS", "EMAP"],
            "during the turn: {turn:?}"
        );
        turns += 1;
        rest = &rest[prof + 1..];
    }
    assert_eq!(turns, 2, "{kinds:?}");
}
