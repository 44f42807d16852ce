//! `--stop` in `colibri serve`, both protocols, against the greedy answer computed in process:
//! a stop string from the middle of the answer cuts it exactly before its first occurrence
//! (across token boundaries), the turn ends through END/STAT or DONE as a normal end does,
//! and the conversation keeps the tokens sent whole and nothing of the stop string; a stop
//! string that never appears leaves the answer byte for byte as without `--stop`.

use std::path::PathBuf;

use colibri::engine::chat::ChatTemplate;
use colibri::engine::Engine;
use colibri::model::LoadOptions;
use colibri_e2e::mux::{data_of, MuxDaemon};
use colibri_e2e::{fixture, greedy_answer, temp_dir, Daemon};
use protocol::mux::MuxReply;

fn snap() -> PathBuf {
    fixture("tiny-dense-shared")
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// What a stop string does to a greedy answer, worked out from its tokens.
struct Cut {
    /// The stop string: 3 bytes from the middle of the answer.
    stop: String,
    /// The answer's bytes before its first occurrence: what is sent.
    sent: Vec<u8>,
    /// Tokens whose bytes all lie before the cut: what the conversation keeps.
    kept_tokens: usize,
    /// Tokens generated up to the one that completes the stop string.
    generated: usize,
}

fn cut_of(ids: &[u32], answer: &[u8]) -> Cut {
    let engine = Engine::open(vec![snap()], LoadOptions::default()).unwrap();
    let mut ends = Vec::new();
    let mut end = 0;
    for &id in ids {
        end += engine.tokenizer().token_bytes(id).len();
        ends.push(end);
    }
    assert_eq!(end, answer.len());
    // From the middle on: the last byte of a token of two or more bytes and the next two,
    // where the answer first has them. So the stop string begins inside a token (whose
    // first bytes are sent but not kept) and ends in the next one (the tokens the KV would
    // hold without the cut differ from those kept). Valid UTF-8 (it is an argument) without
    // a line end.
    let (stop, at) = (ids.len() / 2..ids.len())
        .filter(|&j| ends[j] - if j == 0 { 0 } else { ends[j - 1] } >= 2)
        .map(|j| ends[j] - 1)
        .filter(|&at| at + 3 <= answer.len())
        .filter_map(|at| {
            let s = std::str::from_utf8(&answer[at..at + 3]).ok()?;
            let first = find(answer, s.as_bytes()) == Some(at);
            (first && !s.contains(['\n', '\r', '\0'])).then(|| (s.to_string(), at))
        })
        .next()
        .unwrap_or_else(|| panic!("no stop string across a token boundary in {answer:?}"));
    let cut = Cut {
        sent: answer[..at].to_vec(),
        kept_tokens: ends.iter().filter(|&&e| e <= at).count(),
        generated: ends.iter().position(|&e| e >= at + stop.len()).unwrap() + 1,
        stop,
    };
    // What makes the test able to tell: a token straddles the cut, and the stop string
    // ends in a later token.
    assert!(!ends.contains(&at), "{ends:?} {at}");
    assert!(cut.kept_tokens + 2 <= cut.generated, "{ends:?} {at}");
    cut
}

fn stat_fields(stat: &str) -> Vec<String> {
    stat.trim_end()
        .split(' ')
        .skip(1)
        .map(String::from)
        .collect()
}

/// Legacy `\x02PROMPT`: the cut answer, END and a normal STAT (not length-limited); then
/// `\x02MORE` continues from the kept tokens, so greedy it regenerates the bytes of the
/// token the stop string began in, up to the stop string again.
#[test]
fn legacy_stop_cuts_the_answer_exactly_and_keeps_only_what_was_sent() {
    let snap = snap();
    let prompt = ChatTemplate::Glm.turn(None, "Hello there", true, false);
    let (ids, full) = greedy_answer(&snap, &prompt, 24, false);
    assert!(full.len() > 8, "{full:?}");
    let cut = cut_of(&ids, &full);
    let start = |extra: &[&str]| {
        let state = temp_dir("stop-legacy");
        Daemon::greedy(&snap, &state, &[&["--ngen", "24"], extra].concat()).0
    };

    let stop_arg = format!("--stop={}", cut.stop);
    let mut d = start(&[&stop_arg, "--stop=never said by it"]);
    let (text, stat) = d.prompt(&prompt, 24, None);
    assert_eq!(text, cut.sent, "stop {:?}", cut.stop);
    let f = stat_fields(&stat);
    assert_eq!(f.len(), 6, "{stat:?}");
    assert_eq!(f[0], cut.generated.to_string(), "{stat:?}");
    assert_eq!(f[5], "0", "a stop string is not the length limit: {stat:?}");

    // The conversation holds the prompt and the kept tokens; MORE re-runs the last of them
    // and continues greedy: the answer's bytes from the kept tokens' end, cut again.
    let kept_bytes: usize = {
        let engine = Engine::open(vec![snap.clone()], LoadOptions::default()).unwrap();
        ids[..cut.kept_tokens]
            .iter()
            .map(|&id| engine.tokenizer().token_bytes(id).len())
            .sum()
    };
    d.send(b"\x02MORE\n");
    let (more, _, stat) = d.read_turn();
    assert_eq!(
        more,
        [&full[kept_bytes..cut.sent.len()], b"\n"].concat(),
        "stop {:?}",
        cut.stop
    );
    assert_eq!(stat_fields(&stat).len(), 4, "{stat:?}");
    assert!(d.finish().success());

    // A stop string that never comes: byte for byte the answer without --stop.
    let mut d = start(&["--stop=never said by it"]);
    let (text, stat) = d.prompt(&prompt, 24, None);
    assert_eq!(text, full);
    assert_eq!(stat_fields(&stat)[0], ids.len().to_string());
    assert!(d.finish().success());
}

/// Mux: DATA up to the stop string, DONE (not length-limited), and the idle slot's SESSIONS
/// line counts the prompt and the kept tokens only; a stop string that never comes leaves
/// the DATA bytes as without `--stop`.
#[test]
fn mux_stop_cuts_the_answer_exactly_and_keeps_only_what_was_sent() {
    let snap = snap();
    let prompt = "[gMASK]<sop><|user|>Tell me about birds and the sea and the sky.<|assistant|><think></think>";
    let (ids, full) = greedy_answer(&snap, prompt, 40, true);
    assert!(full.len() > 8, "{full:?}");
    let cut = cut_of(&ids, &full);
    let prompt_tokens = {
        let engine = Engine::open(vec![snap.clone()], LoadOptions::default()).unwrap();
        engine.tokenizer().encode(prompt).unwrap().len()
    };
    let start = |stops: &[String]| {
        let state = temp_dir("stop-mux");
        let tel = state.join("telemetry.log");
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg("exec \"$0\" serve --mux --snap \"$1\" --telemetry-fd 3 3>\"$2\" \"$3\" \"$4\"")
            .arg(colibri_e2e::bin("colibri"))
            .arg(&snap)
            .arg(&tel)
            .args(stops);
        (MuxDaemon::start_with(&mut cmd, &state).0, tel)
    };
    let never = "--stop=never said by it".to_string();

    let (mut d, tel) = start(&[format!("--stop={}", cut.stop), never.clone()]);
    d.submit(1, 0, prompt, 40);
    let r = d.until_end_of(1);
    assert_eq!(data_of(&r, 1), cut.sent, "stop {:?}", cut.stop);
    let stat = r
        .iter()
        .find_map(|x| match x {
            MuxReply::Done { id: 1, stat } => Some(stat.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no DONE 1 in {r:?}"));
    assert_eq!(stat.completion_tokens as usize, cut.generated);
    assert_eq!(stat.prompt, Some((prompt_tokens as u32, false)));
    let (status, _) = d.finish();
    assert!(status.success());
    let log = std::fs::read_to_string(&tel).unwrap();
    let last = log
        .lines()
        .rev()
        .find(|l| l.starts_with("SESSIONS "))
        .unwrap();
    // `SESSIONS 1 <slot> idle <id 0> <ctx_tokens> <generated>`: no pending token, nothing
    // of the stop string.
    assert_eq!(
        last,
        format!(
            "SESSIONS 1 0 idle 0 {} {}",
            prompt_tokens + cut.kept_tokens,
            cut.generated
        ),
        "{log}"
    );

    let (mut d, _) = start(&[never.clone(), never]);
    d.submit(2, 0, prompt, 40);
    let r = d.until_end_of(2);
    assert_eq!(data_of(&r, 2), full);
    assert!(d.finish().0.success());
}
