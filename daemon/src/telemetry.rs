//! Process figures (RSS, memory) and the `--telemetry-fd` channel.
//!
//! Telemetry never goes to stdout: the protocol stream stays byte-identical with or without
//! it. Lines are written whole; a reader that went away turns the channel off, never the daemon.

use std::fs::File;
use std::io::Write;

use protocol::Telemetry;

/// Current resident set in GB (1e9 bytes): `RssAnon` from /proc/self/status, so mapped weight
/// files the kernel can drop at will do not count, else `VmRSS`.
pub fn rss_gb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status.lines().find(|l| l.starts_with(key)).and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<f64>().ok())
        })
    };
    field("RssAnon:")
        .or_else(|| field("VmRSS:"))
        .map(|kb| kb * 1024.0 / 1e9)
        .unwrap_or(0.0)
}

/// `n / secs`, 0 for an empty interval.
pub fn per_second(n: f64, secs: f64) -> f64 {
    if secs > 0.0 {
        n / secs
    } else {
        0.0
    }
}

/// `MemTotal` and `MemAvailable` from /proc/meminfo, in bytes.
pub fn meminfo() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |key: &str| {
        text.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    };
    (field("MemTotal:"), field("MemAvailable:"))
}

/// The tightest memory limit of this process's cgroup and its ancestors, in bytes; `None`
/// when there is none (or no cgroup file system to read). cgroup v2 (`memory.max`) and v1
/// (`memory.limit_in_bytes` of the `memory` controller) alike: a container or a
/// `systemd-run -p MemoryMax=` scope limits the process while /proc/meminfo shows the host.
pub fn cgroup_memory_limit() -> Option<u64> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_limit_of(&membership, |p| std::fs::read_to_string(p).ok())
}

/// [`cgroup_memory_limit`] over the text of /proc/self/cgroup, reading files with `read`.
fn cgroup_limit_of(
    membership: &str,
    read: impl Fn(&std::path::Path) -> Option<String>,
) -> Option<u64> {
    // Hierarchies this process is in: (mount, file, path inside).
    let mut places = Vec::new();
    for line in membership.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.is_empty() {
            places.push(("/sys/fs/cgroup", "memory.max", path));
            places.push(("/sys/fs/cgroup/unified", "memory.max", path));
        } else if controllers.split(',').any(|c| c == "memory") {
            places.push(("/sys/fs/cgroup/memory", "memory.limit_in_bytes", path));
        }
    }
    let mut tightest: Option<u64> = None;
    for (mount, file, path) in places {
        // The cgroup itself, then each ancestor up to the hierarchy's root: a parent's limit
        // binds its children too.
        let mut dir = std::path::PathBuf::from(mount).join(path.trim_start_matches('/'));
        loop {
            // "max" (v2) or a page-rounded i64::MAX (v1) is no limit.
            let limit = read(&dir.join(file))
                .and_then(|t| t.trim().parse::<u64>().ok())
                .filter(|&v| v < 1 << 60);
            if let Some(l) = limit {
                tightest = Some(tightest.map_or(l, |t| t.min(l)));
            }
            if dir.as_os_str().len() <= mount.len() || !dir.pop() {
                break;
            }
        }
    }
    tightest
}

pub fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':').map(|(_, v)| v.trim().to_string()))
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// The optional telemetry sink of `--telemetry-fd`.
#[derive(Default)]
pub struct TelemetryOut {
    file: Option<File>,
}

impl TelemetryOut {
    /// Takes ownership of file descriptor `fd`, which the launcher opened for us.
    pub fn from_fd(fd: i32) -> Result<TelemetryOut, String> {
        use std::os::fd::FromRawFd;
        if fd < 3 {
            return Err(format!(
                "--telemetry-fd {fd}: must be 3 or more (0-2 are stdin, stdout, stderr)"
            ));
        }
        if nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_err() {
            return Err(format!("--telemetry-fd {fd}: not an open file descriptor"));
        }
        // SAFETY: `fd` is open (checked just above) and was handed to this process for telemetry
        // only, so nothing else owns or closes it; the File becomes its single owner. Worst case,
        // if the launcher also uses it, our lines interleave with its writes.
        let file = unsafe { File::from_raw_fd(fd) };
        Ok(TelemetryOut { file: Some(file) })
    }

    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    pub fn send(&mut self, t: &Telemetry) {
        if let Some(f) = &mut self.file {
            let mut line = Vec::with_capacity(64);
            t.encode(&mut line);
            if f.write_all(&line).is_err() {
                // The reader is gone: stop writing rather than fail the daemon.
                self.file = None;
            }
        }
    }
}

/// Upstream's HWINFO figures for this machine. With the model's weights on a GPU (`--vram-gb`):
/// one device, named as upstream names its CUDA devices (`<name> x<count>`); wgpu does not
/// tell a device's total memory, so the VRAM figure is the `--vram-gb` the engine was given.
/// Without one, upstream's CPU build: `0 0.0` and an empty name.
pub fn hwinfo() -> protocol::HwInfo {
    let (total, avail) = meminfo();
    // Read once: the mux protocol sends HWINFO with every finished request.
    static CPU_NAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let cpu_name = CPU_NAME
        .get_or_init(|| {
            std::fs::read_to_string("/proc/cpuinfo")
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find(|l| l.starts_with("model name"))
                        .and_then(|l| l.split_once(':'))
                        .map(|(_, v)| v.trim().replace(['|', '\n'], " "))
                })
                .unwrap_or_default()
        })
        .clone();
    let gpu = crate::gpu::in_use();
    protocol::HwInfo {
        cores: std::thread::available_parallelism().map_or(1, |n| n.get() as u32),
        ram_total_gb: total as f64 / 1e9,
        ram_avail_gb: avail as f64 / 1e9,
        ngpu: gpu.as_ref().map_or(0, |_| 1),
        vram_total_gb: gpu.as_ref().map_or(0.0, |g| g.1),
        cpu_name,
        gpu_name: gpu.map_or(String::new(), |(name, _)| {
            format!("{} x1", name.replace(['|', '\n'], " "))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::cgroup_limit_of;
    use std::path::Path;

    fn files(have: &'static [(&'static str, &'static str)]) -> impl Fn(&Path) -> Option<String> {
        move |p: &Path| {
            have.iter()
                .find(|(k, _)| Path::new(k) == p)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_tightest_limit_of_the_cgroup_and_its_ancestors() {
        // cgroup v1, as in a container: a child limited below its parent.
        let v1 = "4:memory:/box/bench\n1:cpu:/\n0::/\n";
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/box/bench/memory.limit_in_bytes",
                "1040000000\n",
            ),
            (
                "/sys/fs/cgroup/memory/box/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        assert_eq!(cgroup_limit_of(v1, read), Some(1_040_000_000));
        // cgroup v2: the parent's limit binds the child that has none.
        let v2 = "0::/user.slice/run-1.scope\n";
        let read = files(&[
            ("/sys/fs/cgroup/user.slice/run-1.scope/memory.max", "max\n"),
            ("/sys/fs/cgroup/user.slice/memory.max", "2000000000\n"),
        ]);
        assert_eq!(cgroup_limit_of(v2, read), Some(2_000_000_000));
        // No limit anywhere, or nothing readable.
        assert_eq!(cgroup_limit_of(v2, files(&[])), None);
        assert_eq!(cgroup_limit_of("", files(&[])), None);
    }
}
