//! Writes that survive a crash or a power cut: the pieces every saved state file uses.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Replaces `path` with `bytes` so that a crash leaves the old file or the new one: a
/// temporary beside it, made durable, renamed over it, and the folder made durable so the
/// rename itself survives a power cut.
pub fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    sync_dir(path)
}

/// Makes the folder holding `path` durable (its entries: a rename, a new file).
pub fn sync_dir(path: &Path) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)?.sync_all()
}

/// Moves a state file that must not be used out of the way, keeping it: renamed to
/// `<name>.aside-<unix seconds>` (with `-2`, `-3`, ... if taken). Returns the new path.
pub fn set_aside(path: &Path) -> std::io::Result<PathBuf> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let base = format!("{}.aside-{secs}", path.display());
    let mut to = PathBuf::from(&base);
    let mut n = 2;
    while to.exists() {
        to = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &to)?;
    sync_dir(path)?;
    Ok(to)
}
