//! The demo model that ships inside the binary, so `colibri run` and `coli` work on a machine
//! with no model files. It is a small `glm_moe_dsa` model trained for about an hour on two CPU
//! cores on the King James Bible (scripts/demo/): a toy that writes KJV-flavoured English, not a
//! chat model, but with every part of the architecture trained and active (dense first layer,
//! 16-expert MoE layers, MLA, the DSA indexer, an MTP head stored as GLM-5 stores it).

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

/// The demo model's tokenizer.json (the tokenizer of `plan --measure`'s random models).
pub fn tokenizer_json() -> &'static [u8] {
    FILES[1].1
}

/// FNV-1a over each file's length and words: all of a small file (config, tokenizer), one
/// 8-byte word every 4 KiB of a large one. A retrained model of the same shape has the same
/// lengths but different words, so it gets a fresh cache directory instead of reusing the old
/// weights, at a cost of microseconds instead of hashing 20 MB at every start.
fn stamp(files: &[(&str, &[u8])]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |v: u64| h = (h ^ v).wrapping_mul(0x100_0000_01b3);
    for (_, bytes) in files {
        mix(bytes.len() as u64);
        let step = if bytes.len() <= 1 << 20 { 8 } else { 4096 };
        for chunk in bytes.chunks(step) {
            let mut word = [0u8; 8];
            let n = chunk.len().min(8);
            word[..n].copy_from_slice(&chunk[..n]);
            mix(u64::from_le_bytes(word));
        }
    }
    h
}

/// Writes the demo model into a per-user cache directory (once) and returns that directory, so
/// the demo goes through exactly the loader real models use.
pub fn materialize() -> Result<PathBuf, EngineError> {
    let stamp = stamp(&FILES);
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

#[cfg(test)]
mod tests {
    use super::stamp;

    #[test]
    fn the_stamp_sees_content_not_only_length() {
        let a = vec![0u8; 10_000];
        let mut b = a.clone();
        b[4097] = 1;
        assert_ne!(stamp(&[("m", &a)]), stamp(&[("m", &b)]));
        let big = vec![0u8; 2 << 20];
        let mut big2 = big.clone();
        big2[8192] = 1;
        assert_ne!(stamp(&[("m", &big)]), stamp(&[("m", &big2)]));
        assert_eq!(stamp(&[("m", &a)]), stamp(&[("m", &a.clone())]));
        assert_ne!(stamp(&[("m", &a)]), stamp(&[("m", &a[..9_999])]));
    }
}
