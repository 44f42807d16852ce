//! Where a model's state files (`.coli_kv*`, `.coli_usage`) live: next to the model as
//! upstream does, in `--state-dir` when given, and in a per-model directory under the user's
//! state directory when the model directory is not writable.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::error::EngineError;

/// The lock file that makes a state folder one daemon's at a time.
pub const LOCK_FILE: &str = ".coli_lock";

/// An exclusive advisory lock (`flock`) on a state folder's `.coli_lock`, held for the life of
/// the process. The kernel drops it when the process dies however it dies, so a stale lock
/// from a killed daemon never blocks; the pid written into the file only names the holder.
#[derive(Debug)]
pub struct StateLock {
    _lock: Flock<File>,
    dir: PathBuf,
}

/// Why a state folder could not be locked.
#[derive(Debug)]
pub enum LockError {
    /// Another live process holds it.
    Held { dir: PathBuf, pid: Option<u32> },
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockError::Held { dir, pid } => write!(
                f,
                "the state folder {} is in use by another colibri ({}): two daemons on one folder would mix their conversations. Stop that one, give this one its own folder with --state-dir DIR, or run without saving state with --kv-save 0",
                dir.display(),
                pid.map_or("pid unknown".to_string(), |p| format!("pid {p}"))
            ),
            LockError::Io { path, source } => {
                write!(f, "cannot lock {}: {source}", path.display())
            }
        }
    }
}

impl StateLock {
    /// Takes `dir`'s lock without waiting.
    pub fn acquire(dir: &Path) -> Result<StateLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(io)?;
        let mut lock = match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut file, errno)) if errno == nix::errno::Errno::EWOULDBLOCK => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    pid: text.trim().parse().ok(),
                });
            }
            Err((_, errno)) => return Err(io(std::io::Error::from(errno))),
        };
        // Ours now: name the holder for whoever is refused next.
        lock.set_len(0).map_err(io)?;
        lock.write_all(format!("{}\n", std::process::id()).as_bytes())
            .map_err(io)?;
        Ok(StateLock {
            _lock: lock,
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

pub fn is_writable(dir: &Path) -> bool {
    let probe = dir.join(format!(".colibri-probe-{}", std::process::id()));
    match std::fs::File::create(&probe) {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            true
        }
        Err(_) => false,
    }
}

fn user_state_base() -> PathBuf {
    std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir)
        .join("colibri")
}

/// Resolves the state directory for a model whose first directory is `model_dir`.
pub fn resolve(model_dir: &Path, explicit: Option<&Path>) -> Result<PathBuf, EngineError> {
    if let Some(dir) = explicit {
        std::fs::create_dir_all(dir)
            .map_err(|e| EngineError::io(format!("--state-dir {}", dir.display()), e))?;
        return Ok(dir.to_path_buf());
    }
    // A GGUF model is a file: its state goes to the user state folder, named after it.
    if !model_dir.is_file() && is_writable(model_dir) {
        return Ok(model_dir.to_path_buf());
    }
    let canon = model_dir
        .canonicalize()
        .unwrap_or_else(|_| model_dir.to_path_buf());
    let name = canon
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into());
    // FNV-1a of the full path keeps two models with the same directory name apart.
    let hash = canon
        .to_string_lossy()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
        });
    let dir = user_state_base().join(format!("{name}-{hash:016x}"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| EngineError::io(format!("creating {}", dir.display()), e))?;
    crate::elog!(
        "[KV] {} is not writable: state files go to {}",
        model_dir.display(),
        dir.display()
    );
    Ok(dir)
}

/// Takes `dir`'s lock for a command that writes state there. `required` (a daemon that saves
/// conversations): a folder held by another process is refused (exit 2) naming the holder and
/// the ways out. Otherwise, and when the lock cannot be taken at all, `None`: the caller goes
/// on without writing any state (stderr says so).
pub fn lock_state(dir: &Path, required: bool) -> Result<Option<StateLock>, EngineError> {
    match StateLock::acquire(dir) {
        Ok(lock) => Ok(Some(lock)),
        Err(e @ LockError::Held { .. }) if required => Err(EngineError::Usage(e.to_string())),
        Err(e @ LockError::Held { .. }) => {
            crate::elog!("[KV] {e}; this run reads the saved state but writes none of it");
            Ok(None)
        }
        Err(e) => {
            crate::elog!("[KV] {e}: no state is written by this run");
            Ok(None)
        }
    }
}

/// `.coli_kv` for slot 0, `.coli_kv.<i>` for the others (upstream's names).
pub fn kv_file_name(slot: usize) -> String {
    if slot == 0 {
        ".coli_kv".to_string()
    } else {
        format!(".coli_kv.{slot}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unwritable_model_dir_falls_back_to_a_per_model_user_dir() {
        // A directory that cannot be written (it does not exist) as the model directory.
        let base = std::env::temp_dir().join(format!("colibri-state-{}", std::process::id()));
        std::env::set_var("XDG_STATE_HOME", &base);
        let model = Path::new("/nonexistent/colibri/models/glm-test");
        let dir = resolve(model, None).unwrap();
        assert!(dir.starts_with(base.join("colibri")), "{}", dir.display());
        assert!(dir
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("glm-test-"));
        assert!(dir.is_dir());
        // Stable: the same model maps to the same directory.
        assert_eq!(resolve(model, None).unwrap(), dir);
        // --state-dir wins.
        let explicit = base.join("explicit");
        assert_eq!(resolve(model, Some(&explicit)).unwrap(), explicit);
        // A writable model directory keeps its state beside it.
        assert_eq!(resolve(&base, None).unwrap(), base);
        let _ = std::fs::remove_dir_all(&base);
    }
}
