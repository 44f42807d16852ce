//! `colibri verify --snap DIR`: every tensor of a converted container against the checksums
//! `colibri convert` wrote (`colibri-checksums.json`, see `weights/checksums.rs`).
//!
//! Exit 0 when every tensor matches; 1 when one does not (each bad tensor gets a stderr line,
//! the last one names the first: tensor, shard, expected and found hash), also for a tensor
//! with no checksum or a checksum with no tensor; 2 when the folder has no checksums at all,
//! with what to do about it. The last stdout line is the summary,
//! `VERIFY tensors=<n> bad=<k> bytes=<b> secs=<s>`.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::cli::VerifyArgs;
use crate::convert::manifest::{Manifest, FILE as RECORD};
use crate::error::EngineError;
use crate::weights::checksums::{self, hex, Checksums, Hasher};
use crate::weights::{ShardSet, TensorInfo};

/// Largest positional read.
const READ: usize = 8 << 20;
/// How often a plain progress line is written when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(5);

fn dirs(snap: &str) -> Result<Vec<PathBuf>, EngineError> {
    let dirs = crate::engine::split_search_path(snap);
    if dirs.is_empty() {
        return Err(EngineError::Usage(format!(
            "--snap {snap:?}: no directory in it"
        )));
    }
    for d in &dirs {
        if !d.is_dir() {
            return Err(EngineError::Usage(format!(
                "--snap: {} is not a directory",
                d.display()
            )));
        }
    }
    Ok(dirs)
}

/// Why there is nothing to check, and what gives the checksums.
fn no_checksums(dirs: &[PathBuf]) -> EngineError {
    let shown: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    let shown = shown.join(":");
    let unfinished = dirs
        .iter()
        .find_map(|d| Manifest::load(d).ok().flatten().filter(|m| !m.complete));
    let why = match unfinished {
        Some(_) => format!(
            "its conversion is not finished ({RECORD} says so): run the same colibri convert \
             command again to finish it; the checksums are written last"
        ),
        None => format!(
            "it was not made by colibri convert, or by an older colibri convert that wrote \
             none; to get them, run `colibri convert --from SOURCE --to {shown}` again with \
             the options it was made with (it rewrites the shards and writes the checksums), \
             or convert the source into a new folder"
        ),
    };
    EngineError::Usage(format!(
        "--snap {shown}: no {} to check against: {why}",
        checksums::FILE
    ))
}

/// One tensor that does not match.
struct Bad {
    tensor: String,
    shard: String,
    why: String,
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// xxh3 of tensor `t`'s bytes, read in pieces; `done` counts them.
fn hash_tensor(
    set: &ShardSet,
    t: &TensorInfo,
    buf: &mut [u8],
    done: &mut dyn FnMut(u64),
) -> Result<u64, EngineError> {
    let mut h = Hasher::default();
    let mut at = 0u64;
    while at < t.len {
        let n = (t.len - at).min(buf.len() as u64) as usize;
        set.read_at(t.file, t.offset + at, &mut buf[..n])?;
        h.update(&buf[..n]);
        at += n as u64;
        done(n as u64);
    }
    Ok(h.finish())
}

pub fn run(a: VerifyArgs) -> Result<ExitCode, EngineError> {
    let dirs = dirs(&a.snap)?;
    let sums = Checksums::load(&dirs)?.ok_or_else(|| no_checksums(&dirs))?;
    let set = ShardSet::open(&dirs)?;
    // Shard by shard, front to back: sequential reads.
    let mut order: Vec<&TensorInfo> = set.names().filter_map(|n| set.get(n)).collect();
    order.sort_by_key(|t| (t.file, t.offset));
    let total: u64 = order.iter().map(|t| t.len).sum();
    let files: Vec<String> = sums.files.iter().map(|f| f.display().to_string()).collect();
    crate::elog!(
        "[VERIFY] {} tensors, {:.3} GB in {} shard(s) against {} checksums ({})",
        order.len(),
        total as f64 / 1e9,
        set.num_files(),
        sums.len(),
        files.join(", ")
    );

    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
        bar.set_style(
            ProgressStyle::with_template(
                "[verify] {bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} ETA {eta}",
            )
            .expect("the template is valid"),
        );
        bar
    });
    let say = |line: String| match &bar {
        Some(b) => b.println(line),
        None => crate::elog!("{line}"),
    };
    let t0 = Instant::now();
    let mut last_line = t0;
    let mut read = 0u64;
    let mut progress = |n: u64| {
        read += n;
        match &bar {
            Some(b) => b.set_position(read),
            None if last_line.elapsed() >= LINE_EVERY => {
                last_line = Instant::now();
                crate::elog!(
                    "[verify] {:.2}/{:.2} GB, {:.0} MB/s",
                    read as f64 / 1e9,
                    total as f64 / 1e9,
                    read as f64 / 1e6 / t0.elapsed().as_secs_f64().max(1e-3)
                );
            }
            None => {}
        }
    };

    let mut buf = vec![0u8; READ];
    let mut bad: Vec<Bad> = Vec::new();
    for t in &order {
        let shard = file_name(set.file_path(t.file));
        let found = hash_tensor(&set, t, &mut buf, &mut progress)?;
        let why = match sums.get(&t.name) {
            None => Some("no checksum recorded for it".to_string()),
            Some(e) if e.shard != shard => {
                Some(format!("recorded in {}, found in {shard}", e.shard))
            }
            Some(e) if e.xxh3 != found => Some(format!(
                "xxh3 expected {}, found {}",
                hex(e.xxh3),
                hex(found)
            )),
            Some(_) => None,
        };
        if let Some(why) = why {
            say(format!(
                "[VERIFY] BAD tensor \"{}\" in {}: {why}",
                t.name,
                set.file_path(t.file).display()
            ));
            bad.push(Bad {
                tensor: t.name.clone(),
                shard: set.file_path(t.file).display().to_string(),
                why,
            });
        }
    }
    for (name, e) in &sums.tensors {
        if !set.contains(name) {
            let why = "recorded but in no shard".to_string();
            say(format!(
                "[VERIFY] BAD tensor \"{name}\" ({}): {why}",
                e.shard
            ));
            bad.push(Bad {
                tensor: name.clone(),
                shard: e.shard.clone(),
                why,
            });
        }
    }
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "VERIFY tensors={} bad={} bytes={total} secs={secs:.2}",
        order.len(),
        bad.len()
    );
    match bad.first() {
        None => {
            crate::elog!(
                "[VERIFY] every tensor matches ({:.3} GB in {secs:.1} s, {:.0} MB/s)",
                total as f64 / 1e9,
                total as f64 / 1e6 / secs.max(1e-9)
            );
            Ok(ExitCode::SUCCESS)
        }
        Some(first) => {
            crate::elog!(
                "colibri verify: {} of {} tensors bad; the first: tensor \"{}\" in {}: {}",
                bad.len(),
                order.len(),
                first.tensor,
                first.shard,
                first.why
            );
            Ok(ExitCode::from(1))
        }
    }
}
