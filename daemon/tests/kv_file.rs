//! `.coli_kv` damage: one flipped bit at every byte position (cycling the bit) of a small
//! saved conversation, and a cut at every byte position, each load keeping exactly the records
//! before the damage, bit for bit; COLIKV1 files still read and rewritten as COLIKV2; a file
//! bound to another model or other formats never loads.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use colibri::config::ModelConfig;
use colibri::identity::ModelIdentity;
use colibri::kv_file::{
    write_file_v1, KvBinding, KvDamage, KvFile, KvFormat, KvLoadError, KvLoaded, KvShape, MAGIC,
};
use colibri::model::KvCache;

/// COLIKV2's header: upstream's 40 bytes, then the 36-byte binding.
const HEADER: usize = 76;
const HEADER_V1: usize = 40;
const IDENTITY: ModelIdentity = ModelIdentity {
    family: 1,
    index: 2,
    content: 3,
    formats: 4,
};
const RECORDS: usize = 5;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn temp(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("colibri-kvfile-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A conversation of `RECORDS` positions with distinct, reproducible keys.
fn conversation() -> (KvCache, KvBinding) {
    let cfg = ModelConfig::load(&fixture("tiny-dense-shared")).unwrap();
    let mut kv = KvCache::new(&cfg);
    let shape = KvShape::of(&kv, cfg.vocab_size);
    let body = shape.record_bytes() as usize - 4;
    let mut state = colibri::rng::XorShift64(0x9e37_79b9_7f4a_7c15);
    for pos in 0..RECORDS {
        let bytes: Vec<u8> = (0..body / 4)
            .flat_map(|_| {
                // Finite values, so a bitwise comparison means what it says.
                ((state.next_u64() >> 40) as f32 / 1e6 - 8.0).to_le_bytes()
            })
            .collect();
        kv.push_record((pos * 37 + 3) as u32 % cfg.vocab_size as u32, &bytes);
    }
    (
        kv,
        KvBinding {
            shape,
            identity: IDENTITY,
        },
    )
}

fn empty_like(kv: &KvCache) -> KvCache {
    let mut e = kv.clone();
    e.clear();
    e
}

/// `got` holds exactly the first `n` positions of `full`, bit for bit.
fn assert_prefix(got: &KvCache, full: &KvCache, n: usize, what: &str) {
    let mut want = full.clone();
    want.truncate(n);
    assert_eq!(got.len(), n, "{what}");
    assert_eq!(got.tokens, want.tokens, "{what}");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (g, w) in got.layers.iter().zip(&want.layers) {
        for (g, w) in g.parts().into_iter().zip(w.parts()) {
            assert_eq!(bits(g), bits(w), "{what}");
        }
    }
}

fn load(path: &Path, shape: KvBinding, like: &KvCache) -> (KvCache, Result<KvLoaded, KvLoadError>) {
    let mut kv = empty_like(like);
    let mut f = KvFile::open(path, shape).unwrap();
    let r = f.load(&mut kv, 4096);
    (kv, r)
}

fn saved(dir: &Path, kv: &KvCache, shape: KvBinding) -> Vec<u8> {
    let path = dir.join(".coli_kv");
    let mut f = KvFile::open(&path, shape).unwrap();
    f.save(kv).unwrap();
    std::fs::read(&path).unwrap()
}

#[test]
fn every_flipped_bit_keeps_exactly_the_records_before_it() {
    let (full, shape) = conversation();
    let dir = temp("flip");
    let good = saved(&dir, &full, shape);
    let stride = shape.shape.record_bytes() as usize + 4;
    assert_eq!(good.len(), HEADER + RECORDS * stride);
    assert_eq!(&good[..8], MAGIC);
    let path = dir.join("damaged");
    std::fs::write(&path, &good).unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let (mut tried, mut detected) = (0usize, 0usize);
    for pos in 0..good.len() {
        // One bit per byte, cycling through the bit positions.
        {
            let bit = pos % 8;
            file.write_all_at(&[good[pos] ^ (1 << bit)], pos as u64)
                .unwrap();
            let (kv, r) = load(&path, shape, &full);
            file.write_all_at(&good[pos..pos + 1], pos as u64).unwrap();
            tried += 1;
            let what = format!("bit {bit} of byte {pos}");
            if (HEADER_V1..HEADER).contains(&pos) {
                // The binding: the file no longer says what made it, so it never loads.
                let e = r.expect_err(&what);
                assert!(matches!(e, KvLoadError::Unbound(_)), "{what}: {e}");
                assert!(e.sets_aside(), "{what}");
                assert_prefix(&kv, &full, 0, &what);
            } else if pos < HEADER {
                let e = r.expect_err(&what);
                let msg = e.to_string();
                assert!(
                    matches!(e, KvLoadError::NotKv(_) | KvLoadError::HeaderChecksum(_)),
                    "{what}: {msg}"
                );
                assert!(msg.contains(path.to_str().unwrap()), "{msg}");
                assert_prefix(&kv, &full, 0, &what);
            } else {
                let index = (pos - HEADER) / stride;
                let got = r.unwrap_or_else(|e| panic!("{what}: {e}"));
                assert_eq!(
                    got,
                    KvLoaded {
                        tokens: index,
                        claimed: RECORDS,
                        format: KvFormat::V2,
                        damage: Some(KvDamage::Checksum { index }),
                    },
                    "{what}"
                );
                assert_eq!(
                    got.damage.unwrap().to_string(),
                    format!("record {index} failed its checksum")
                );
                assert_prefix(&kv, &full, index, &what);
            }
            detected += 1;
        }
    }
    assert_eq!(tried, good.len());
    assert_eq!(detected, tried);
    eprintln!("bit flips tried {tried}, detected {detected}");
}

#[test]
fn a_cut_at_every_byte_position_loads_to_a_prefix() {
    let (full, shape) = conversation();
    let dir = temp("cut");
    let good = saved(&dir, &full, shape);
    let stride = shape.shape.record_bytes() as usize + 4;
    let path = dir.join("cut");
    for len in 0..=good.len() {
        std::fs::write(&path, &good[..len]).unwrap();
        let (kv, r) = load(&path, shape, &full);
        let what = format!("cut at {len}");
        match r {
            Ok(got) => {
                let n = len.saturating_sub(HEADER) / stride;
                assert!(len == 0 || len >= HEADER, "{what}");
                assert_eq!(got.tokens, n, "{what}");
                let torn = len >= HEADER && n < RECORDS;
                assert_eq!(
                    got.damage,
                    torn.then_some(KvDamage::Truncated { index: n }),
                    "{what}"
                );
                assert_prefix(&kv, &full, n, &what);
            }
            Err(e) => {
                assert!((1..HEADER).contains(&len), "{what}: {e}");
                if len >= HEADER_V1 {
                    assert!(matches!(e, KvLoadError::Unbound(_)), "{what}: {e}");
                } else {
                    assert!(
                        matches!(e, KvLoadError::ShortHeader { .. } | KvLoadError::NotKv(_)),
                        "{what}: {e}"
                    );
                }
                assert_prefix(&kv, &full, 0, &what);
            }
        }
    }
}

#[test]
fn a_damaged_file_is_repaired_by_the_next_save() {
    let (full, shape) = conversation();
    let dir = temp("repair");
    let mut bytes = saved(&dir, &full, shape);
    let stride = shape.shape.record_bytes() as usize + 4;
    bytes[HEADER + 2 * stride + 10] ^= 0x10;
    let path = dir.join(".coli_kv");
    std::fs::write(&path, &bytes).unwrap();
    let mut kv = empty_like(&full);
    let mut f = KvFile::open(&path, shape).unwrap();
    assert_eq!(f.load(&mut kv, 4096).unwrap().tokens, 2);
    assert_eq!(f.durable_records(), 2);
    f.save(&full).unwrap();
    let (back, r) = load(&path, shape, &full);
    assert_eq!(r.unwrap().damage, None);
    assert_prefix(&back, &full, RECORDS, "after the repairing save");
}

#[test]
fn colikv1_files_are_read_and_rewritten_as_colikv2() {
    let (full, shape) = conversation();
    let dir = temp("v1");
    let path = dir.join(".coli_kv");
    write_file_v1(&path, &full, shape.shape).unwrap();
    assert_eq!(
        std::fs::metadata(&path).unwrap().len() as usize,
        HEADER_V1 + RECORDS * shape.shape.record_bytes() as usize
    );
    let mut kv = empty_like(&full);
    let mut f = KvFile::open(&path, shape).unwrap();
    let got = f.load(&mut kv, 4096).unwrap();
    assert_eq!(
        (got.tokens, got.format, got.damage),
        (RECORDS, KvFormat::V1, None)
    );
    assert_prefix(&kv, &full, RECORDS, "COLIKV1");
    // One more position, then save: the whole file becomes COLIKV2.
    let mut longer = full.clone();
    let mut extra = Vec::new();
    full.write_record(0, &mut extra);
    longer.push_record(7, &extra[4..]);
    f.save(&longer).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[..8], MAGIC);
    let (back, r) = load(&path, shape, &full);
    let got = r.unwrap();
    assert_eq!((got.tokens, got.format), (RECORDS + 1, KvFormat::V2));
    assert_prefix(&back, &longer, RECORDS + 1, "rewritten");
}

#[test]
fn a_file_bound_to_other_weights_or_formats_never_loads() {
    let (full, binding) = conversation();
    let dir = temp("bound");
    let good = saved(&dir, &full, binding);
    let path = dir.join("bound");
    std::fs::write(&path, &good).unwrap();
    assert_eq!(
        colibri::kv_file::saved_identity(&path).unwrap(),
        Some(IDENTITY)
    );
    let others = [
        (
            ModelIdentity {
                family: 9,
                ..IDENTITY
            },
            "another model family",
        ),
        (
            ModelIdentity {
                index: 9,
                ..IDENTITY
            },
            "its tensors differ",
        ),
        (
            ModelIdentity {
                content: 9,
                ..IDENTITY
            },
            "other weights",
        ),
        (
            ModelIdentity {
                formats: 9,
                ..IDENTITY
            },
            "other compute formats",
        ),
    ];
    for (identity, why) in others {
        let other = KvBinding {
            identity,
            ..binding
        };
        let (kv, r) = load(&path, other, &full);
        let e = r.expect_err(why);
        assert!(matches!(e, KvLoadError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains(why), "{e}");
        assert!(e.sets_aside());
        assert_prefix(&kv, &full, 0, why);
        // Setting it aside keeps the bytes and leaves an empty file at the path.
        let mut f = KvFile::open(&path, other).unwrap();
        let to = f.set_aside().unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), good, "{why}");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        std::fs::rename(&to, &path).unwrap();
    }
}

#[test]
fn a_save_after_the_file_or_its_folder_was_deleted_writes_everything_anew() {
    let (full, binding) = conversation();
    let dir = temp("relink");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let path = state.join(".coli_kv");
    let mut f = KvFile::open(&path, binding).unwrap();
    let mut first = full.clone();
    first.truncate(3);
    f.save(&first).unwrap();
    // The file goes: the next save must not vanish into the unlinked inode.
    std::fs::remove_file(&path).unwrap();
    f.save(&full).unwrap();
    let (back, r) = load(&path, binding, &full);
    assert_eq!(r.unwrap().tokens, RECORDS);
    assert_prefix(&back, &full, RECORDS, "after the file was deleted");
    // The whole folder goes, and comes back empty before the save.
    std::fs::remove_dir_all(&state).unwrap();
    f.save(&full).unwrap();
    let (back, r) = load(&path, binding, &full);
    assert_eq!(r.unwrap().tokens, RECORDS);
    assert_prefix(&back, &full, RECORDS, "after the folder was deleted");
    // Replaced by another file: that one is overwritten with the conversation.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"something else").unwrap();
    f.save(&full).unwrap();
    let (back, r) = load(&path, binding, &full);
    assert_eq!(r.unwrap().tokens, RECORDS);
    assert_prefix(&back, &full, RECORDS, "after the file was replaced");
}
