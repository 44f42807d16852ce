//! Where a model's state files (`.coli_kv*`, `.coli_usage`) live: next to the model as
//! upstream does, in `--state-dir` when given, and in a per-model directory under the user's
//! state directory when the model directory is not writable.

use std::path::{Path, PathBuf};

use crate::error::EngineError;

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
    if is_writable(model_dir) {
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
    eprintln!(
        "[KV] {} is not writable: state files go to {}",
        model_dir.display(),
        dir.display()
    );
    Ok(dir)
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
