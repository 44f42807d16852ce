//! The recurrent states of a `.coli_kv` conversation (Qwen3.5-MoE's Gated DeltaNet layers),
//! saved beside its records: `<file>.coli_kv.state` (format in protocol/README.md).
//!
//! ```text
//! "COLIST1\0" | u32 positions | u32 crc32c(the tokens, u32 LE) | u32 layers | u32 values
//!            | per DeltaNet layer, in layer order: conv state f32, then recurrent state f32
//!            | per DeepSeek-V4 layer, in layer order: its state's run (`model::dsv4_state`)
//!            | u32 crc32c(every byte before)                                  (all LE)
//! ```
//!
//! A DeepSeek-V4 layer's state (window keys, compressor windows and entries) is saved the same
//! way: its records hold only the tokens.
//!
//! A DeltaNet layer keeps nothing per position: its conv and recurrent state summarise every
//! position so far, so the records alone cannot rebuild it. The snapshot is the state after
//! `positions` tokens, whose sequence it names by checksum; it is replaced whole at each save
//! (a temporary renamed over it), after the records and their count are durable. It is used
//! only when it names exactly the conversation the records load to (same length, same
//! tokens, intact): a kill between the two writes, a damaged record that cuts the load
//! short, or a damaged snapshot all leave a conversation without its state, which is then
//! not resumed at all (the slot starts empty and the next prompt is computed from scratch).

use std::fs::OpenOptions;
use std::io::{BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::model::kv::LayerKv;
use crate::model::KvCache;

const MAGIC: &[u8; 8] = b"COLIST1\0";
/// The magic and four u32 words before the values.
const HEAD: usize = 24;

/// Where the snapshot of the records file `path` lives.
pub fn state_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".state");
    PathBuf::from(p)
}

fn tokens_crc(tokens: &[u32]) -> u32 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    crc32c::crc32c(&bytes)
}

/// The snapshot of `kv`'s recurrent states, as written to disk.
pub fn encode(kv: &KvCache) -> Vec<u8> {
    let mut out = Vec::new();
    write_to(kv, &mut out).expect("writing to a Vec cannot fail");
    out
}

/// Values encoded per write: small enough for the stack, large enough that the writes and
/// the checksum run over whole blocks.
const BLOCK: usize = 4096;

/// Streams the snapshot of `kv` into `w`, its checksum computed on the way. A save streams
/// it to the file: building it whole first (66 MB for Qwen3.5-35B-A3B) cost as much as
/// writing it, most of it the first touch of that much fresh memory.
fn write_to(kv: &KvCache, w: &mut impl Write) -> std::io::Result<()> {
    let states: Vec<_> = kv.layers.iter().filter_map(LayerKv::linear).collect();
    // DeepSeek-V4's layers after the DeltaNet ones (a model has one kind or the other), each
    // as its self-describing run of values (`model::dsv4_state`).
    let (v4_layers, v4) = dsv4_values(kv);
    let values: usize = states
        .iter()
        .map(|s| s.conv.len() + s.state.len())
        .sum::<usize>()
        + v4.len();
    let mut head = [0u8; HEAD];
    head[..8].copy_from_slice(MAGIC);
    for (i, v) in [
        kv.len() as u32,
        tokens_crc(&kv.tokens),
        (states.len() + v4_layers) as u32,
        values as u32,
    ]
    .into_iter()
    .enumerate()
    {
        head[8 + 4 * i..12 + 4 * i].copy_from_slice(&v.to_le_bytes());
    }
    w.write_all(&head)?;
    let mut crc = crc32c::crc32c(&head);
    let mut buf = [0u8; 4 * BLOCK];
    for s in states {
        for part in [&s.conv[..], &s.state[..]] {
            for chunk in part.chunks(BLOCK) {
                let bytes = &mut buf[..4 * chunk.len()];
                for (b, x) in bytes.chunks_exact_mut(4).zip(chunk) {
                    b.copy_from_slice(&x.to_le_bytes());
                }
                crc = crc32c::crc32c_append(crc, bytes);
                w.write_all(bytes)?;
            }
        }
    }
    for chunk in v4.chunks(BLOCK) {
        let bytes = &mut buf[..4 * chunk.len()];
        for (b, x) in bytes.chunks_exact_mut(4).zip(chunk) {
            b.copy_from_slice(&x.to_le_bytes());
        }
        crc = crc32c::crc32c_append(crc, bytes);
        w.write_all(bytes)?;
    }
    w.write_all(&crc.to_le_bytes())
}

/// DeepSeek-V4's layer states in layer order, flat (`model::dsv4_state`), and their count.
fn dsv4_values(kv: &KvCache) -> (usize, Vec<f32>) {
    let mut out = Vec::new();
    let mut n = 0;
    for l in &kv.layers {
        if let LayerKv::Dsv4(s) = l {
            crate::model::dsv4_state::encode(s, &mut out);
            n += 1;
        }
    }
    (n, out)
}

/// Why a snapshot was not applied.
#[derive(Debug, PartialEq, Eq)]
pub enum StateMismatch {
    Missing,
    Damaged,
    /// It is the state of another conversation (or of another length of this one).
    OtherConversation,
    /// Its layer count or sizes are not this model's.
    OtherShape,
}

impl std::fmt::Display for StateMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StateMismatch::Missing => "no recurrent-state snapshot beside the records",
            StateMismatch::Damaged => "the recurrent-state snapshot failed its checksum",
            StateMismatch::OtherConversation => {
                "the recurrent-state snapshot is of another conversation than the records"
            }
            StateMismatch::OtherShape => "the recurrent-state snapshot has another model's shape",
        })
    }
}

/// Sets `kv`'s recurrent states (its records loaded, its DeltaNet layers still empty) from
/// `bytes`, which must be the snapshot of exactly this conversation.
pub fn apply(kv: &mut KvCache, bytes: &[u8]) -> Result<(), StateMismatch> {
    if bytes.len() < HEAD + 4 || &bytes[..8] != MAGIC {
        return Err(StateMismatch::Damaged);
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(StateMismatch::Damaged);
    }
    let word = |i: usize| u32::from_le_bytes(body[8 + 4 * i..12 + 4 * i].try_into().expect("4"));
    if word(0) as usize != kv.len() || word(1) != tokens_crc(&kv.tokens) {
        return Err(StateMismatch::OtherConversation);
    }
    let n = kv.len();
    let v4_layers = kv
        .layers
        .iter()
        .filter(|l| matches!(l, LayerKv::Dsv4(_)))
        .count();
    let layers = kv.layers.iter().filter_map(LayerKv::linear).count() + v4_layers;
    let values: usize = kv
        .layers
        .iter()
        .filter_map(LayerKv::linear)
        .map(|s| s.conv.len() + s.state.len())
        .sum();
    // A V4 layer's run has no size known ahead (it describes itself): the values past the
    // DeltaNet ones are read below, and must be exactly its layers'.
    let stored = word(3) as usize;
    let sized = match v4_layers {
        0 => stored == values,
        _ => stored >= values,
    };
    if word(2) as usize != layers || !sized || body.len() != HEAD + 4 * stored {
        return Err(StateMismatch::OtherShape);
    }
    if v4_layers > 0 {
        let vals: Vec<f32> = body[HEAD + 4 * values..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let mut at = 0;
        let mut states = Vec::with_capacity(v4_layers);
        for _ in 0..v4_layers {
            let (s, used) = crate::model::dsv4_state::decode(&vals[at..])
                .filter(|(s, _)| s.pos == n)
                .ok_or(StateMismatch::OtherShape)?;
            states.push(s);
            at += used;
        }
        if at != vals.len() {
            return Err(StateMismatch::OtherShape);
        }
        let mut states = states.into_iter();
        for l in &mut kv.layers {
            if let LayerKv::Dsv4(d) = l {
                if let Some(s) = states.next() {
                    **d = s;
                }
            }
        }
    }
    let mut vals = body[HEAD..]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    for l in &mut kv.layers {
        if let LayerKv::Linear(s) = l {
            for x in s.conv.iter_mut().chain(s.state.iter_mut()) {
                *x = vals.next().ok_or(StateMismatch::OtherShape)?;
            }
            s.pos = n;
        }
    }
    Ok(())
}

/// Replaces the snapshot beside `path` with `kv`'s states (nothing for a cache without any),
/// as `durable::replace_file` does: written whole under a temporary name, made durable,
/// renamed over the old one, the folder made durable; a kill at any instant leaves the old
/// snapshot or the new one.
pub fn save(path: &Path, kv: &KvCache) -> std::io::Result<()> {
    if !kv.has_recurrent_state() {
        return Ok(());
    }
    let path = state_path(path);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    let mut w = BufWriter::with_capacity(1 << 20, file);
    write_to(kv, &mut w)?;
    let file = w.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, &path)?;
    crate::durable::sync_dir(&path)
}

/// Reads the snapshot beside `path` into `kv` (see [`apply`]).
pub fn load(path: &Path, kv: &mut KvCache) -> Result<(), StateMismatch> {
    let bytes = match std::fs::read(state_path(path)) {
        Ok(b) => b,
        Err(_) => return Err(StateMismatch::Missing),
    };
    apply(kv, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn cache() -> KvCache {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../tests/fixtures/tiny-qwen35-moe"
        );
        let cfg = ModelConfig::load(std::path::Path::new(dir)).unwrap();
        let mut kv = KvCache::new(&cfg);
        // Two positions of made-up state: the snapshot carries values, not meaning.
        for (i, l) in kv.layers.iter_mut().enumerate() {
            if let LayerKv::Linear(s) = l {
                s.conv
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, x)| *x = (i + j) as f32);
                s.state
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, x)| *x = -(j as f32) / 7.0);
                s.pos = 2;
            }
        }
        kv
    }

    /// `kv` with `tokens` as its history, rows of the attention layers included.
    fn with_tokens(mut kv: KvCache, tokens: &[u32]) -> KvCache {
        let row = vec![
            0u8;
            4 * 2 * kv.kv_dim * kv.layers.iter().filter(|l| l.linear().is_none()).count()
        ];
        for &t in tokens {
            kv.push_record(t, &row);
        }
        kv
    }

    #[test]
    fn a_snapshot_applies_only_to_its_own_conversation() {
        let saved = with_tokens(cache(), &[5, 6]);
        let bytes = encode(&saved);
        let empty = |tokens: &[u32]| {
            let dir = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/fixtures/tiny-qwen35-moe"
            );
            let cfg = ModelConfig::load(std::path::Path::new(dir)).unwrap();
            with_tokens(KvCache::new(&cfg), tokens)
        };
        let mut kv = empty(&[5, 6]);
        apply(&mut kv, &bytes).unwrap();
        for (a, b) in kv.layers.iter().zip(&saved.layers) {
            if let (Some(a), Some(b)) = (a.linear(), b.linear()) {
                assert_eq!((&a.conv, &a.state, a.pos), (&b.conv, &b.state, 2));
            }
        }
        assert_eq!(
            apply(&mut empty(&[5, 7]), &bytes),
            Err(StateMismatch::OtherConversation)
        );
        assert_eq!(
            apply(&mut empty(&[5]), &bytes),
            Err(StateMismatch::OtherConversation)
        );
        let mut bad = bytes.clone();
        bad[30] ^= 1;
        assert_eq!(
            apply(&mut empty(&[5, 6]), &bad),
            Err(StateMismatch::Damaged)
        );
        assert_eq!(
            apply(&mut empty(&[5, 6]), &bytes[..bytes.len() - 8]),
            Err(StateMismatch::Damaged)
        );
    }
    /// A save streams, block by block, the bytes of the whole-snapshot layout: checked at
    /// Qwen3.5-35B-A3B's shapes (66 MB, many blocks a layer) against that layout written
    /// value by value, and loaded back onto a cache of the same conversation.
    #[test]
    fn a_streamed_save_is_the_snapshot_layout() {
        let dir = std::env::temp_dir().join(format!("colibri-kv-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../tests/fixtures/configs/qwen3.6-35b-a3b.json"
            ),
            dir.join("config.json"),
        )
        .unwrap();
        let cfg = ModelConfig::load(&dir).unwrap();
        let mut kv = KvCache::new(&cfg);
        for (i, l) in kv.layers.iter_mut().enumerate() {
            if let LayerKv::Linear(s) = l {
                let f = |j: usize| ((i * 31 + j) % 1013) as f32 / 7.0 - 70.0;
                s.conv.iter_mut().enumerate().for_each(|(j, x)| *x = f(j));
                s.state.iter_mut().enumerate().for_each(|(j, x)| *x = -f(j));
            }
        }
        let mut want = MAGIC.to_vec();
        let states: Vec<_> = kv.layers.iter().filter_map(LayerKv::linear).collect();
        let values: usize = states.iter().map(|s| s.conv.len() + s.state.len()).sum();
        for v in [0, tokens_crc(&[]), states.len() as u32, values as u32] {
            want.extend_from_slice(&v.to_le_bytes());
        }
        for s in &states {
            for x in s.conv.iter().chain(&s.state) {
                want.extend_from_slice(&x.to_le_bytes());
            }
        }
        let crc = crc32c::crc32c(&want);
        want.extend_from_slice(&crc.to_le_bytes());
        let path = dir.join("s.coli_kv");
        save(&path, &kv).unwrap();
        let got = std::fs::read(state_path(&path)).unwrap();
        assert!(got == want, "the saved snapshot differs from the layout");
        assert_eq!(encode(&kv), want);
        let mut back = KvCache::new(&cfg);
        apply(&mut back, &got).unwrap();
        for (a, b) in back.layers.iter().zip(&kv.layers) {
            if let (Some(a), Some(b)) = (a.linear(), b.linear()) {
                assert!(a.conv == b.conv && a.state == b.state);
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
