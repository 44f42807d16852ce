//! `--telemetry-fd`: the telemetry lines arrive on their own descriptor, every one parses, and
//! stdout carries exactly the same protocol bytes with or without it.

use std::io::Write;
use std::process::Stdio;

use colibri_e2e::{bin, fixture, temp_dir};
use protocol::{parse_telemetry_line, Telemetry};

/// Runs `colibri serve` over `input` to EOF; with `telemetry`, fd 3 goes to that file.
fn session(input: &[u8], telemetry: Option<&std::path::Path>, state: &std::path::Path) -> Vec<u8> {
    let mut script = String::from(
        "exec \"$0\" serve --temp 0 --repin 1 --cache 2 --snap \"$1\" --state-dir \"$2\"",
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
    ] {
        assert!(kinds.contains(k), "no {k} line; got {kinds:?}");
    }
}
