//! `plan --measure`'s run: the model written by `write.rs` measured by `colibri bench` in a
//! child process (its own peak RSS, optionally its own memory cgroup), three starts:
//!
//! 1. cold: the shards evicted from the page cache, a first start (READY before the model's
//!    fingerprint is cached), `--measure-tokens` decode steps from an empty expert cache;
//! 2. first token: evicted again, a second start (READY with the fingerprint cached), a
//!    1000-token prompt prefilled and one token decoded;
//! 3. warm: the decode steps replayed once untimed (`bench --warmup`), then timed;
//! 4. pilot: evicted again, the cold decode of 1. with `--pilot on` (the expert prediction
//!    that reads the next layer's guesses ahead), for its bytes prefetched in time, late and
//!    never used per token beside the cold run's tok/s without it (`--pilot off`: the other
//!    runs never let `auto` decide).
//!
//! Every child holds the experts per layer the plan holds (`--cache`, the plan's figure): its
//! own KV is sized to its few tokens, not to the plan's `--ctx` and `--kv-slots`, and would
//! otherwise leave room for more (on DeepSeek-V3 the warm run was 27% faster than the plan
//! that way). Each run's `[RAM]` line says what it held; the report shows both.
//!
//! Each child's figures come from bench's own lines (`BENCH ...`, `[bench] N prefill positions
//! in ...`, `[bench] decode: ... MB read/token`), READY from when its first post-start line
//! appears, and its peak RSS from `/proc/<pid>/status` (VmHWM), polled until it exits.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::EngineError;

/// What one bench child measured.
#[derive(Clone, Debug, Default)]
pub struct Run {
    pub ready_s: f64,
    pub prefill_positions: usize,
    pub prefill_s: f64,
    /// Expert bytes the prefill read from disk, in MB (bench's `[bench] prefill:` line).
    pub prefill_mb_read: f64,
    pub decode_steps: usize,
    pub decode_s: f64,
    pub decode_tok_s: f64,
    pub hit_pct: f64,
    pub expert_loads_per_token: f64,
    pub mb_read_per_token: f64,
    pub peak_rss: u64,
    /// With `--pilot`: MB per decode token prefetched in time, late (the layer waited on the
    /// read) and never used (BENCH's `prefetch_*_mb`).
    pub prefetch_mb: Option<(f64, f64, f64)>,
    /// Why it did not finish (exit status and its last lines), if it did not.
    pub failed: Option<String>,
    /// How it read its experts (`O_DIRECT`, `buffered`: its `[IO] expert reads:` line's mode).
    pub reads: String,
    /// Experts per sparse layer its LRU held (its `[RAM] budget ...` line's cap).
    pub experts_per_layer: Option<usize>,
    /// Of the prefill's reads, MB the device delivered (the rest came from the page cache).
    pub prefill_device_mb: Option<f64>,
    /// Of the decode's reads, MB a token the device delivered (`[bench] decode loads:`).
    pub device_mb_per_token: Option<f64>,
    /// One decode load's time on its I/O thread, ms: the whole, the read, the checks, the
    /// build of its matrices.
    pub load_ms: Option<LoadMs>,
    /// Ms a decode token the products waited for loads.
    pub wait_ms_per_token: Option<f64>,
}

/// One load's time on its I/O thread, in ms (`[bench] decode loads:`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LoadMs {
    pub each: f64,
    pub read: f64,
    pub check: f64,
    pub build: f64,
}

impl Run {
    /// Disk GB/s while decoding: the expert bytes read per token at the decode rate.
    pub fn disk_gb_s(&self) -> f64 {
        self.mb_read_per_token * self.decode_tok_s / 1e3
    }

    /// GB/s the device delivered while decoding (the page cache's part left out), where the
    /// child could count it.
    pub fn device_gb_s(&self) -> Option<f64> {
        self.device_mb_per_token
            .map(|mb| mb * self.decode_tok_s / 1e3)
    }
}

/// The three runs.
#[derive(Clone, Debug)]
pub struct Measured {
    pub cold: Run,
    pub first: Run,
    pub warm: Run,
    pub pilot: Run,
    /// `uptime`'s load averages when the runs ended (the machine is shared).
    pub load: String,
    pub cgroup_bytes: Option<u64>,
    /// Decode steps asked of the cold and warm runs.
    pub tokens: usize,
    /// The cold run's expert selections (`.coli_usage`'s format), when it wrote them: `plan`
    /// predicts again with this routing beside the uniform assumption.
    pub usage: Option<PathBuf>,
    /// Experts per sparse layer the plan holds in RAM: what every child was asked to hold.
    pub planned_per_layer: usize,
}

impl Measured {
    pub fn peak_rss(&self) -> u64 {
        [&self.cold, &self.first, &self.warm, &self.pilot]
            .iter()
            .map(|r| r.peak_rss)
            .max()
            .unwrap_or(0)
    }

    /// Time to the first token of the prompt: its prefill and one decode step.
    pub fn ttft_s(&self) -> f64 {
        self.first.prefill_s + self.first.decode_s
    }

    /// The runs that held other than the plan's experts per layer (or said nothing), by name.
    pub fn held_apart(&self) -> Vec<(&'static str, Option<usize>)> {
        [
            ("cold", &self.cold),
            ("first token", &self.first),
            ("warm", &self.warm),
            ("pilot", &self.pilot),
        ]
        .into_iter()
        .filter(|(_, r)| r.failed.is_none() && r.experts_per_layer != Some(self.planned_per_layer))
        .map(|(name, r)| (name, r.experts_per_layer))
        .collect()
    }
}

/// A memory cgroup the children run in, removed when dropped.
struct Cgroup {
    dir: PathBuf,
}

impl Cgroup {
    /// A child of this process's own memory cgroup (v1, as in a container, or v2) limited to
    /// `bytes`, swap off; the method of `scripts/bench_llamacpp.sh`.
    fn make(bytes: u64) -> Result<Cgroup, EngineError> {
        let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let name = format!("colibri-plan-{}", std::process::id());
        let refuse = |why: String| {
            EngineError::Usage(format!(
                "--cgroup-gb: {why}; run the measure under `systemd-run --scope -p MemoryMax=...` \
                 instead"
            ))
        };
        for line in membership.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, ctrl, path) = (parts.next(), parts.next(), parts.next());
            let (Some(ctrl), Some(path)) = (ctrl, path) else {
                continue;
            };
            let (base, limit, swap) = if ctrl.split(',').any(|c| c == "memory") {
                (
                    format!("/sys/fs/cgroup/memory{path}"),
                    "memory.limit_in_bytes",
                    "memory.memsw.limit_in_bytes",
                )
            } else if ctrl.is_empty() && Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
                (
                    format!("/sys/fs/cgroup{path}"),
                    "memory.max",
                    "memory.swap.max",
                )
            } else {
                continue;
            };
            let dir = Path::new(base.trim_end_matches('/')).join(&name);
            if std::fs::create_dir_all(&dir).is_err() {
                continue;
            }
            let cg = Cgroup { dir };
            std::fs::write(cg.dir.join(limit), bytes.to_string())
                .map_err(|e| refuse(format!("{}: {e}", cg.dir.join(limit).display())))?;
            let _ = std::fs::write(
                cg.dir.join(swap),
                if swap == "memory.swap.max" {
                    "0".to_string()
                } else {
                    bytes.to_string()
                },
            );
            return Ok(cg);
        }
        Err(refuse(
            "no memory cgroup could be made here (none writable in /proc/self/cgroup's)".into(),
        ))
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The VmHWM of `pid` in bytes (0 once it is gone).
fn vm_hwm(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// The number after `key` in `line` (`key` ends where the number starts).
fn number_after(line: &str, key: &str) -> Option<f64> {
    let rest = &line[line.find(key)? + key.len()..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// Bench's figures from its output lines.
pub fn parse(stdout: &[String], stderr: &[String], run: &mut Run) {
    for l in stdout.iter().filter(|l| l.starts_with("BENCH ")) {
        run.decode_tok_s = number_after(l, "decode_tok_s=").unwrap_or(0.0);
        run.hit_pct = number_after(l, "hit_pct=").unwrap_or(0.0);
        run.prefetch_mb = match (
            number_after(l, "prefetch_in_time_mb="),
            number_after(l, "prefetch_late_mb="),
            number_after(l, "prefetch_unused_mb="),
        ) {
            (Some(t), Some(late), Some(u)) => Some((t, late, u)),
            _ => None,
        };
    }
    for l in stderr {
        if let Some(at) = l.find("prefill positions in ") {
            // "[bench] P prefill positions in Xs, G decode steps in Ys | ..."
            let head = &l[..at];
            run.prefill_positions = head
                .split_whitespace()
                .last()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            run.prefill_s = number_after(l, "prefill positions in ").unwrap_or(0.0);
            run.decode_s = number_after(l, "decode steps in ").unwrap_or(0.0);
            run.decode_steps = l
                .split(", ")
                .nth(1)
                .and_then(|s| s.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
        }
        if let Some(said) = l.strip_prefix("[RAM] budget ") {
            // "... cap=N ok per layer ..." or "... cap lowered A->N per layer ..." / "raised".
            run.experts_per_layer = match said.find("->") {
                Some(at) => number_after(&said[at..], "->"),
                None => number_after(said, "cap="),
            }
            .map(|n| n as usize);
        }
        if let Some(said) = l.strip_prefix("[IO] expert reads: ") {
            run.reads = said.split(" (").next().unwrap_or(said).to_string();
        }
        if let Some(said) = l.strip_prefix("[bench] prefill: ") {
            // "[bench] prefill: N expert loads, X MB read[, D MB of them from the device]"
            run.prefill_mb_read = number_after(said, "loads, ").unwrap_or(0.0);
            run.prefill_device_mb = number_after(said, "MB read, ");
        }
        if let Some(said) = l.strip_prefix("[bench] decode loads: ") {
            // "... T ms each on an I/O thread (read R ms = G GB/s, check C, build B); the
            // products waited W ms a token[; from the device D MB a token ...]"
            run.load_ms = match (
                number_after(said, "a token, "),
                number_after(said, "(read "),
                number_after(said, "check "),
                number_after(said, "build "),
            ) {
                (Some(each), Some(read), Some(check), Some(build)) => Some(LoadMs {
                    each,
                    read,
                    check,
                    build,
                }),
                _ => None,
            };
            run.wait_ms_per_token = number_after(said, "products waited ");
            run.device_mb_per_token = number_after(said, "from the device ");
        }
        if l.contains("expert loads/token") {
            run.expert_loads_per_token = number_after(l, "decode: ").unwrap_or(0.0);
            run.mb_read_per_token = number_after(l, "loads/token, ").unwrap_or(0.0);
        }
    }
}

/// `r` with its decode reads a token counted exactly. Bench prints MB to two decimals, so a
/// small model's reads are its expert loads times the expert's stored bytes (the reads are
/// whole experts); but the pilot's reads ahead are not loads (they reach the cache only when
/// a layer asks for them), so where the printed MB say more, they count: the disk bound is
/// about every byte the disk delivered.
pub fn counted_reads(mut r: Run, expert_bytes: u64) -> Run {
    let loads = r.expert_loads_per_token * expert_bytes as f64 / 1e6;
    r.mb_read_per_token = r.mb_read_per_token.max(loads);
    r
}

/// How one child runs.
pub struct Child<'a> {
    pub dir: &'a Path,
    pub ram_gb: f64,
    pub prompt: usize,
    pub gen: usize,
    pub warmup: bool,
    /// `--pilot on` (else `off`): read the next layer's guessed experts ahead.
    pub pilot: bool,
    /// `--cache`: the experts per sparse layer the plan holds.
    pub cache: usize,
    /// `--usage-out`: where the run writes its expert selections.
    pub usage_out: Option<&'a Path>,
}

fn run_child(c: &Child, cg: Option<&Cgroup>) -> Result<Run, EngineError> {
    let exe =
        std::env::current_exe().map_err(|e| EngineError::io("finding the colibri binary", e))?;
    let mut args: Vec<String> = vec![
        "bench".into(),
        "--snap".into(),
        c.dir.display().to_string(),
        "--no-membw".into(),
        "--no-disk-probe".into(),
        "--prompt-tokens".into(),
        c.prompt.to_string(),
        "--gen-tokens".into(),
        c.gen.to_string(),
        "--ram-gb".into(),
        format!("{:.3}", c.ram_gb),
    ];
    if c.warmup {
        args.push("--warmup".into());
    }
    args.push("--pilot".into());
    args.push(if c.pilot { "on" } else { "off" }.into());
    args.push("--cache".into());
    args.push(c.cache.max(1).to_string());
    if let Some(path) = c.usage_out {
        args.push("--usage-out".into());
        args.push(path.display().to_string());
    }
    let mut cmd = match cg {
        // The shell joins the cgroup and then becomes colibri (same pid): every byte it
        // allocates is charged there.
        Some(cg) => {
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg("echo $$ > \"$0\" && exec \"$@\"")
                .arg(cg.procs())
                .arg(&exe)
                .args(&args);
            cmd
        }
        None => {
            let mut cmd = Command::new(&exe);
            cmd.args(&args);
            cmd
        }
    };
    crate::elog!(
        "[measure] colibri {}{}",
        args.join(" "),
        cg.map(|g| format!(" (in cgroup {})", g.dir.display()))
            .unwrap_or_default()
    );
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| EngineError::io(format!("starting {}", exe.display()), e))?;
    let pid = child.id();
    let ready_ns = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let out = child.stdout.take();
    let err = child.stderr.take();
    let (stdout, stderr, peak, status) = std::thread::scope(|s| {
        let o = s.spawn(move || {
            out.map(|o| {
                std::io::BufReader::new(o)
                    .lines()
                    .map_while(Result::ok)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
        });
        let ready = ready_ns.clone();
        let e = s.spawn(move || {
            let mut lines = Vec::new();
            if let Some(err) = err {
                for l in std::io::BufReader::new(err).lines().map_while(Result::ok) {
                    // Bench's first line after Engine::start returned.
                    if l.contains("[bench] synthetic ids") && ready.load(Ordering::Relaxed) == 0 {
                        ready.store(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    }
                    // Bench's own lines are the run's progress.
                    if l.starts_with("[bench]") {
                        crate::elog!("  {l}");
                    }
                    lines.push(l);
                }
            }
            lines
        });
        let flag = done.clone();
        let p = s.spawn(move || {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(vm_hwm(pid));
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        });
        let status = child.wait();
        done.store(true, Ordering::Relaxed);
        (
            o.join().unwrap_or_default(),
            e.join().unwrap_or_default(),
            p.join().unwrap_or(0),
            status,
        )
    });
    let status = status.map_err(|e| EngineError::io("waiting for the bench child", e))?;
    let mut run = Run {
        ready_s: ready_ns.load(Ordering::Relaxed) as f64 / 1e9,
        peak_rss: peak,
        ..Run::default()
    };
    parse(&stdout, &stderr, &mut run);
    if !status.success() {
        let code = status.code().map_or(
            "killed by a signal (the cgroup's OOM killer?)".to_string(),
            |c| format!("exit status {c}"),
        );
        let tail: Vec<&str> = stderr
            .iter()
            .rev()
            .take(4)
            .rev()
            .map(String::as_str)
            .collect();
        run.failed = Some(format!("{code}: {}", tail.join(" | ")));
        crate::elog!(
            "[measure] the run failed: {}",
            run.failed.as_deref().unwrap_or("")
        );
    }
    Ok(run)
}

/// The runs on the model in `dir` (routed experts of `expert_bytes` each) under a RAM budget
/// of `ram` bytes holding the plan's `per_layer` experts per sparse layer, in a memory cgroup
/// of `cgroup_bytes` if given.
pub fn measure(
    dir: &Path,
    expert_bytes: u64,
    ram: u64,
    per_layer: usize,
    gen: usize,
    prompt: usize,
    cgroup_bytes: Option<u64>,
) -> Result<Measured, EngineError> {
    let cg = cgroup_bytes.map(Cgroup::make).transpose()?;
    let ram_gb = ram as f64 / 1e9;
    let child = |prompt: usize, gen: usize, warmup: bool| Child {
        dir,
        ram_gb,
        prompt,
        gen,
        warmup,
        pilot: false,
        cache: per_layer,
        usage_out: None,
    };
    super::write::evict(dir);
    let exact = |r: Run| counted_reads(r, expert_bytes);
    // Beside the model, not as its `.coli_usage`: the later runs must start as cold as the
    // first did, with no history to pin from.
    let usage = dir.join("colibri-measure-usage");
    let _ = std::fs::remove_file(&usage);
    let cold = Child {
        usage_out: Some(&usage),
        ..child(1, gen, false)
    };
    let cold = exact(run_child(&cold, cg.as_ref())?);
    super::write::evict(dir);
    let first = exact(run_child(&child(prompt, 1, false), cg.as_ref())?);
    let warm = exact(run_child(&child(1, gen, true), cg.as_ref())?);
    super::write::evict(dir);
    let pilot = Child {
        pilot: true,
        ..child(1, gen, false)
    };
    let pilot = exact(run_child(&pilot, cg.as_ref())?);
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    Ok(Measured {
        cold,
        first,
        warm,
        pilot,
        load,
        cgroup_bytes,
        tokens: gen,
        usage: usage.exists().then_some(usage),
        planned_per_layer: per_layer,
    })
}
