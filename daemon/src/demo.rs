//! The demo model that ships inside the binary, so `colibri run` and `coli` work on a machine
//! with no model files. It is a tiny random `glm_moe_dsa` model (scripts/make_fixtures.py):
//! its answers are noise, but every part of the engine runs on it.

use std::fs;
use std::path::PathBuf;

use crate::error::EngineError;

const FILES: [(&str, &[u8]); 3] = [
    ("config.json", include_bytes!("../demo/config.json")),
    ("tokenizer.json", include_bytes!("../demo/tokenizer.json")),
    (
        "model.safetensors",
        include_bytes!("../demo/model.safetensors"),
    ),
];

/// Writes the demo model into a per-user cache directory (once) and returns that directory, so
/// the demo goes through exactly the loader real models use.
pub fn materialize() -> Result<PathBuf, EngineError> {
    let stamp = FILES
        .iter()
        .map(|(_, b)| b.len() as u64)
        .fold(0xcbf2_9ce4_8422_2325u64, |h, n| {
            (h ^ n).wrapping_mul(0x100_0000_01b3)
        });
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join("colibri").join(format!("demo-{stamp:016x}"));
    fs::create_dir_all(&dir)
        .map_err(|e| EngineError::io(format!("creating {}", dir.display()), e))?;
    for (name, bytes) in FILES {
        let path = dir.join(name);
        if fs::metadata(&path)
            .map(|m| m.len() == bytes.len() as u64)
            .unwrap_or(false)
        {
            continue;
        }
        // Written under a temporary name and renamed, so a concurrent start never sees half a file.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        fs::write(&tmp, bytes)
            .map_err(|e| EngineError::io(format!("writing {}", tmp.display()), e))?;
        fs::rename(&tmp, &path)
            .map_err(|e| EngineError::io(format!("renaming {}", tmp.display()), e))?;
    }
    Ok(dir)
}
