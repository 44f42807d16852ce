//! Seeded mutation fuzzing of the daemon's file loaders: safetensors headers, `config.json`,
//! `.coli_usage`, `.coli_kv` and `tokenizer.json`, a million cases each. Every case is checked not to panic (caught per case), not to allocate beyond
//! what its input holds (a counting allocator: no single allocation past a small multiple of
//! the input, whatever sizes the input declares), and every refusal to name what it refused.
//! Case counts and time go to stderr (`cargo test -- --nocapture`).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::Instant;

use colibri::config::ModelConfig;
use colibri::experts::usage::Usage;
use colibri::identity::ModelIdentity;
use colibri::kv_file::{KvBinding, KvFile, KvShape};
use colibri::model::KvCache;
use colibri::weights::check_safetensors_header;

#[path = "../../protocol/tests/common/fuzzing.rs"]
mod fuzzing;
use fuzzing::{Rng, LARGEST};

const INTERESTING: &[&[u8]] = &[
    b"0",
    b"-1",
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"\n",
    b" ",
    b"4294967296",
    b"18446744073709551615",
    b"99999999999999999999999",
    b"1e308",
    b"null",
    b"\xff\xff\xff\xff",
    b"\0",
];

fn mutate(rng: &mut Rng, seed: &[u8], max_len: usize) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(v.len() + 1);
        match rng.below(5) {
            0 if at < v.len() => v[at] ^= 1 << rng.below(8),
            1 if at < v.len() => v[at] = rng.next() as u8,
            2 => {
                let s = INTERESTING[rng.below(INTERESTING.len())];
                v.splice(at..at, s.iter().copied());
            }
            3 if at < v.len() => {
                let n = rng.below(16).min(v.len() - at);
                v.drain(at..at + n);
            }
            _ => v.truncate(at),
        }
    }
    v.truncate(max_len);
    v
}

/// Runs `cases` mutations of `seed` through `check` (which returns the refusal's message, or
/// `None` when the input was accepted), each under `catch_unwind` with no single allocation
/// past `factor` x the input + 64 KiB. Returns (cases, refused).
fn fuzz(
    name: &str,
    seed_rng: u64,
    cases: usize,
    seed: &[u8],
    factor: usize,
    slack: usize,
    check: impl Fn(&[u8]) -> Option<String>,
) -> (usize, usize) {
    let mut rng = Rng(seed_rng | 1);
    let t0 = Instant::now();
    let mut refused = 0;
    for i in 0..cases {
        let input = mutate(&mut rng, seed, seed.len() + 256);
        LARGEST.with(|l| l.set(0));
        let r = catch_unwind(AssertUnwindSafe(|| check(&input)));
        let largest = LARGEST.with(|l| l.get());
        let shown = String::from_utf8_lossy(&input[..input.len().min(300)]).into_owned();
        let msg = r.unwrap_or_else(|_| panic!("{name}: case {i} panicked on {shown:?}"));
        if let Some(m) = msg {
            assert!(!m.trim().is_empty(), "{name}: case {i}: an empty refusal");
            refused += 1;
        }
        let bound = factor * input.len() + slack;
        assert!(
            largest <= bound,
            "{name}: case {i} allocated {largest} bytes at once for {} input bytes: {shown:?}",
            input.len(),
        );
    }
    eprintln!(
        "fuzz {name}: {cases} cases ({refused} refused) in {:.2}s",
        t0.elapsed().as_secs_f64()
    );
    assert!(
        refused > 0 && refused < cases,
        "{name}: the mutator never (or always) broke the input"
    );
    (cases, refused)
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

/// A small valid safetensors file: two tensors and metadata.
fn safetensors_seed() -> Vec<u8> {
    let header = br#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},"__metadata__":{"format":"pt"}}"#;
    let mut f = (header.len() as u64).to_le_bytes().to_vec();
    f.extend_from_slice(header);
    f.extend((0..22).map(|i| i as u8));
    f
}

#[test]
fn safetensors_headers() {
    let seed = safetensors_seed();
    let path = Path::new("seed.safetensors");
    assert_eq!(check_safetensors_header(&seed, path).unwrap(), 2);
    fuzz("safetensors header", 11, 1_000_000, &seed, 4, 65536, |b| {
        check_safetensors_header(b, path).err().map(|e| {
            let m = e.to_string();
            assert!(m.starts_with("seed.safetensors"), "{m}");
            m
        })
    });
}

#[test]
fn config_json() {
    let seed = std::fs::read(fixture("tiny-moe-bias").join("config.json")).unwrap();
    ModelConfig::from_json(std::str::from_utf8(&seed).unwrap()).unwrap();
    fuzz("config.json", 12, 1_000_000, &seed, 8, 65536, |b| {
        let text = String::from_utf8_lossy(b);
        ModelConfig::from_json(&text).err().map(|e| e.to_string())
    });
}

#[test]
fn coli_usage() {
    let mut u = Usage::new(3, 16);
    for (l, e, c) in [(0, 1, 5), (0, 15, 123456), (1, 7, 1), (2, 0, 42), (3, 9, 9)] {
        u.add(l, e, c);
    }
    let seed = u.to_text().into_bytes();
    let path = Path::new("seed.coli_usage");
    fuzz(".coli_usage", 13, 1_000_000, &seed, 4, 65536, |b| {
        let Ok(text) = std::str::from_utf8(b) else {
            return Some("not text".into());
        };
        match Usage::parse(text, path, 3, 16, false) {
            Ok((back, warnings)) => {
                // A verified file is accepted only with the counts written. Several edits can
                // also destroy the checksum record itself: the file then reads as upstream's,
                // unverified, and says so (one bit flip or a cut never gets there: the unit
                // tests in experts/usage.rs).
                let unverified = warnings.iter().any(|w| w.contains("no checksum"));
                assert!(unverified || back == u || back.total() == 0, "{text:?}");
                None
            }
            Err(e) => {
                let m = e.to_string();
                assert!(m.starts_with("seed.coli_usage"), "{m}");
                Some(m)
            }
        }
    });
}

/// File-backed: one `KvFile` stays open on a file in memory (`/dev/shm` where it exists) and
/// each case rewrites that file's bytes in place before the load, so a case costs a few
/// microseconds and the target runs a million of them like the pure ones.
#[test]
fn coli_kv() {
    let cfg = ModelConfig::load(&fixture("tiny-dense-shared")).unwrap();
    let mut kv = KvCache::new(&cfg);
    let shape = KvShape::of(&kv, cfg.vocab_size);
    let body = vec![0x3fu8; shape.record_bytes() as usize - 4];
    let binding = KvBinding {
        shape,
        identity: ModelIdentity::default(),
    };
    for t in 0..3 {
        kv.push_record(t * 11, &body);
    }
    let shm = Path::new("/dev/shm");
    let root = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let dir = root.join(format!("colibri-fuzz-kv-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(".coli_kv");
    colibri::kv_file::write_file(&path, &kv, binding).unwrap();
    let seed = std::fs::read(&path).unwrap();
    let empty = {
        let mut e = kv.clone();
        e.clear();
        e
    };
    let writer = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    let file = std::cell::RefCell::new(KvFile::open(&path, binding).unwrap());
    fuzz(".coli_kv", 14, 1_000_000, &seed, 4, 65536, |b| {
        use std::os::unix::fs::FileExt;
        writer.set_len(0).unwrap();
        writer.write_all_at(b, 0).unwrap();
        let mut got = empty.clone();
        match file.borrow_mut().load(&mut got, 4096) {
            Ok(l) => {
                assert!(l.tokens <= 3 && got.len() == l.tokens);
                assert_eq!(got.tokens[..], kv.tokens[..l.tokens]);
                l.damage.map(|d| d.to_string())
            }
            Err(e) => {
                assert!(got.is_empty());
                let m = e.to_string();
                assert!(m.contains(".coli_kv"), "{m}");
                Some(m)
            }
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Most mutations fail early in the JSON parse (about 70 us a case), so a million cases take
/// about a minute on one core. The byte-level pre-tokenizer compiles its regex (about 0.8 MB) whatever the input,
/// hence the 2 MiB constant in the bound.
#[test]
fn tokenizer_json() {
    let seed = std::fs::read(fixture("tiny-dense-shared").join("tokenizer.json")).unwrap();
    colibri::tokenizer::Tokenizer::from_bytes(&seed).unwrap();
    // The crate panics on some inputs (caught by `Tokenizer::load`); the default hook's
    // backtrace capture would allocate megabytes and print thousands of lines, so the crate's
    // own panics are silenced for this target.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|info| {
        if !info
            .location()
            .is_some_and(|l| l.file().contains("/tokenizers-"))
        {
            eprintln!("{info}");
        }
    }));
    let r = catch_unwind(|| {
        fuzz("tokenizer.json", 15, 1_000_000, &seed, 8, 2 << 20, |b| {
            colibri::tokenizer::Tokenizer::from_bytes(b)
                .err()
                .map(|e| e.to_string())
        })
    });
    std::panic::set_hook(hook);
    assert!(
        r.is_ok(),
        "tokenizer.json fuzzing failed: see the message above"
    );
}
