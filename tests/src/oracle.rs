//! What the family tests share: `colibri validate` against a fixture's transformers
//! reference (`ref.json`), reading its `VALIDATE tf=a/b gen=c/d` verdict, and a greedy
//! `colibri run` answer to compare two forms of one model by.

use std::path::{Path, PathBuf};

use crate::{colibri, fixture, last_line, run_ok, stderr, temp_dir};

/// `colibri validate --snap snap --ref <fixture reference>/ref.json --case case <extra>`: its
/// stdout (LOGITS and VALIDATE lines) whatever its exit status, since a result that is not
/// exact is still a result; a run that printed no verdict fails the test.
pub fn validate(snap: &Path, reference: &str, case: &str, extra: &[&str]) -> String {
    let o = colibri()
        .arg("validate")
        .arg("--snap")
        .arg(snap)
        .arg("--ref")
        .arg(fixture(reference).join("ref.json"))
        .args(["--case", case])
        .args(extra)
        .output()
        .expect("spawning colibri validate");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("VALIDATE tf="),
        "validate printed no result: {}",
        stderr(&o)
    );
    out
}

/// The `max_abs` of `validate`'s `LOGITS` line (its largest logit difference from the
/// reference); a run that printed none fails the test.
pub fn logits_max_abs(out: &str) -> f64 {
    out.lines()
        .find(|l| l.starts_with("LOGITS "))
        .and_then(|l| {
            l.split_whitespace()
                .find_map(|kv| kv.strip_prefix("max_abs="))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no LOGITS line: {out}"))
}

/// The verdict line `VALIDATE tf=a/b gen=c/d` says both teacher forcing and generation
/// matched at every position; `what` names the case in the failure message.
pub fn assert_exact(line: &str, what: &str) {
    assert!(is_exact(line), "{what}: not exact: {line}");
}

/// Whether `line` is a verdict `VALIDATE tf=a/b gen=c/d` with a == b and c == d.
pub fn is_exact(line: &str) -> bool {
    let v: Vec<&str> = line.split([' ', '=', '/']).collect();
    v.len() == 7 && v[0] == "VALIDATE" && v[2] == v[3] && v[5] == v[6]
}

/// `snap` validates token-exact against fixture `reference`'s case `case`; the verdict line.
pub fn expect_exact(snap: &Path, reference: &str, case: &str, extra: &[&str]) -> String {
    let line = last_line(validate(snap, reference, case, extra).as_bytes());
    assert_exact(&line, &format!("{} {case}", snap.display()));
    line
}

/// `colibri run --snap snap --max-tokens 6 --temp 0 <args>` in a fresh state folder, which
/// must succeed: its stdout (six greedy tokens, in the model's chat template unless `args`
/// say `--raw`).
pub fn run_greedy(snap: &Path, args: &[&str]) -> Vec<u8> {
    let o = colibri()
        .arg("run")
        .arg("--snap")
        .arg(snap)
        .args(["--max-tokens", "6", "--temp", "0", "--state-dir"])
        .arg(temp_dir("oracle-run"))
        .args(args)
        .output()
        .expect("spawning colibri run");
    assert!(o.status.success(), "run failed: {}", stderr(&o));
    o.stdout
}

/// `colibri score` of a short text on `snap` gives a finite perplexity above 1, and `colibri
/// bench` on the fixture's own reference prints its figures: both commands run the family.
pub fn scores_and_benches(snap: &Path) {
    let text = temp_dir("oracle-score").join("text.txt");
    std::fs::write(
        &text,
        "The sea is wide, the sea is deep, it sings the sailors into sleep. ".repeat(4),
    )
    .unwrap();
    let what = snap.display();
    let mut cmd = colibri();
    cmd.arg("score")
        .arg("--text")
        .arg(&text)
        .args(["--ctx", "32", "--stride", "16", "--snap"])
        .arg(snap);
    let last = last_line(&run_ok(&mut cmd).stdout);
    assert!(last.starts_with("SCORE tokens="), "{what}: {last}");
    let ppl: f64 = last
        .split("ppl=")
        .nth(1)
        .and_then(|v| v.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{what}: {last}"));
    assert!(ppl.is_finite() && ppl > 1.0, "{what}: {last}");
    let mut cmd = colibri();
    cmd.arg("bench")
        .arg("--ref")
        .arg(snap.join("ref.json"))
        .args(["--case", "short", "--no-membw", "--snap"])
        .arg(snap);
    let last = last_line(&run_ok(&mut cmd).stdout);
    assert!(last.starts_with("BENCH prefill_pos_s="), "{what}: {last}");
}

/// A copy of the model folder `src` (every file) into a fresh folder, `edit` applied to its
/// config.json: a config the test wants refused, or a knob it wants changed.
pub fn copy_with_config(src: &Path, tag: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = temp_dir(tag).join("m");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    let path = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&path, v.to_string()).unwrap();
    dir
}

/// `colibri convert --from from --to <fresh dir>/c`, which must refuse with exit 2 (bad
/// input): its stderr and the output folder, for the caller's checks on what was named and
/// that nothing was written.
pub fn convert_refused(from: &Path, tag: &str) -> (String, PathBuf) {
    let to = temp_dir(tag).join("c");
    let o = colibri()
        .arg("convert")
        .arg("--from")
        .arg(from)
        .arg("--to")
        .arg(&to)
        .output()
        .expect("spawning colibri convert");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    (stderr(&o), to)
}

/// The daemon started with `args` (which name the model `snap`) answers `prompt` with the
/// in-process greedy run's 8 tokens in both protocols: the legacy one (its STAT line after),
/// then the multiplexed one. `tag` names the temporary state folders.
pub fn serves_greedy_in_both_protocols(snap: &Path, args: &[&str], prompt: &str, tag: &str) {
    use crate::mux::{data_of, MuxDaemon};
    let (mut d, _) = crate::Daemon::start(args, &temp_dir(&format!("{tag}-legacy")));
    let (text, stat) = d.prompt(prompt, 8, None);
    assert!(stat.starts_with("STAT "), "{stat}");
    assert_eq!(text, crate::greedy_answer(snap, prompt, 8, false).1);
    assert!(d.finish().success());

    let (mut d, _) = MuxDaemon::start(args, &temp_dir(&format!("{tag}-mux")));
    d.submit(1, 0, prompt, 8);
    let r = d.until_end_of(1);
    assert_eq!(
        data_of(&r, 1),
        crate::greedy_answer(snap, prompt, 8, true).1
    );
    d.kill9();
}
