//! The saved conversation across a kill, checked the same way for every family that keeps a
//! state snapshot beside `.coli_kv` (Qwen3.5-MoE's recurrent state, DeepSeek-V4's windows
//! and compressors): the second turn after a kill is the one a daemon that never stopped
//! answers, and a damaged snapshot resumes nothing yet still answers the same.

use std::path::{Path, PathBuf};

use crate::{greedy_answer, temp_dir, Daemon};

/// The state folder's `.coli_kv` files: `.coli_kv` and `.coli_kv.<slot>` (not the `.state`
/// beside them).
pub fn kv_files(state: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![state.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n == ".coli_kv"
                    || n.strip_prefix(".coli_kv.")
                        .is_some_and(|i| i.parse::<usize>().is_ok())
            }) {
                out.push(p);
            }
        }
    }
    out
}

/// Two turns of the legacy daemon started with `args`: `p1`, then `p1`, its answer and
/// `more`. Killed after the first and resumed from `.coli_kv` plus its snapshot, the daemon
/// answers the second as one that never stopped; with the snapshot damaged it says the
/// checksum failed, resumes nothing and answers the same (computed again). `tag` names the
/// temporary folders.
pub fn assert_resumes_after_a_kill(args: &[&str], p1: &str, more: &str, tag: &str) {
    let (mut d, _) = Daemon::start(args, &temp_dir(&format!("{tag}-kv-ref")));
    let (a1, _) = d.prompt(p1, 6, None);
    let p2 = format!("{p1}{}{more}", String::from_utf8_lossy(&a1));
    let (want, _) = d.prompt(&p2, 6, None);
    assert!(d.finish().success());

    for damage in [false, true] {
        let state = temp_dir(&format!("{tag}-kv-{damage}"));
        let (mut d, _) = Daemon::start(args, &state);
        let (b1, _) = d.prompt(p1, 6, None);
        assert_eq!(a1, b1);
        d.kill9();
        let files = kv_files(&state);
        assert_eq!(files.len(), 1, "{files:?}");
        let snapshot = colibri::kv_state::state_path(&files[0]);
        let mut bytes = std::fs::read(&snapshot).expect("the state snapshot");
        if damage {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 1;
            std::fs::write(&snapshot, &bytes).unwrap();
        }
        let (mut d, _) = Daemon::start(args, &state);
        let err = d.stderr();
        if damage {
            assert!(
                err.contains("failed its checksum") && !err.contains("resumed conversation"),
                "{err}"
            );
        } else {
            assert!(err.contains("resumed conversation from disk"), "{err}");
        }
        let (got, _) = d.prompt(&p2, 6, None);
        assert_eq!(got, want, "damaged snapshot: {damage}");
        assert!(d.finish().success());
    }
}

/// A prompt `other` that shares only part of the cached conversation `p1` (the state cannot
/// be cut back to it): the daemon computes it again and answers as a fresh greedy run of
/// `snap` does; `p1` asked again answers as before.
pub fn assert_partial_prefix_is_recomputed(
    snap: &Path,
    args: &[&str],
    p1: &str,
    other: &str,
    tag: &str,
) {
    let (mut d, _) = Daemon::start(args, &temp_dir(&format!("{tag}-prefix")));
    let (first, _) = d.prompt(p1, 6, None);
    let (got, _) = d.prompt(other, 6, None);
    assert_eq!(got, greedy_answer(snap, other, 6, false).1);
    let (again, _) = d.prompt(p1, 6, None);
    assert_eq!(again, first);
    assert!(d.finish().success());
}
