//! A daemon started on a damaged `.coli_kv`: for a flipped bit in the header and in every
//! record of a real saved conversation, it starts, keeps exactly the records before the damaged
//! one, says so on stderr, and answers byte for byte as a fresh daemon started on a file that
//! holds just that prefix.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use colibri::config::ModelConfig;
use colibri::kv_file::{saved_identity, write_file, KvBinding, KvFile, KvShape};
use colibri::model::KvCache;
use colibri_e2e::{fixture, temp_dir, Daemon};

const MODEL: &str = "tiny-dense-shared";
/// COLIKV2: upstream's 40-byte header, then the 36-byte model binding.
const HEADER: u64 = 76;

fn start(state: &Path) -> (Daemon, Vec<u8>) {
    Daemon::greedy(&fixture(MODEL), state, &["--ngen", "24"])
}

/// The answer to `prompt` of a daemon started on `state`, and its stderr.
fn answer(state: &Path, prompt: &str) -> (Vec<u8>, String) {
    let (mut d, _) = start(state);
    let (text, stat) = d.prompt(prompt, 8, None);
    assert!(stat.starts_with("STAT "), "{stat:?}");
    let err = d.stderr();
    // Closed without saving over the file under test: kill instead of EOF.
    d.kill9();
    (text, err)
}

fn with_file(tag: &str, bytes: &[u8]) -> PathBuf {
    let dir = temp_dir(tag);
    std::fs::write(dir.join(".coli_kv"), bytes).unwrap();
    dir
}

#[test]
fn a_flipped_bit_in_any_record_resumes_the_prefix_before_it() {
    let p1 = "[gMASK]<sop><|user|>Tell me about the sea.<|assistant|><think></think>";
    let saved = temp_dir("kvdmg-src");
    let (mut d, _) = start(&saved);
    let (ans1, _) = d.prompt(p1, 6, None);
    assert!(d.finish().success());
    let good = std::fs::read(saved.join(".coli_kv")).unwrap();
    let p2 = format!(
        "{p1}{}<|user|>And the sky?<|assistant|><think></think>",
        String::from_utf8_lossy(&ans1)
    );

    let cfg = ModelConfig::load(&fixture(MODEL)).unwrap();
    let mut full = KvCache::new(&cfg);
    let shape = KvShape::of(&full, cfg.vocab_size);
    let identity = saved_identity(&saved.join(".coli_kv")).unwrap().unwrap();
    let binding = KvBinding { shape, identity };
    let mut f = KvFile::open(&saved.join(".coli_kv"), binding).unwrap();
    let n = f.load(&mut full, 512).unwrap().tokens;
    let stride = shape.record_bytes() + 4;
    assert_eq!(good.len() as u64, HEADER + n as u64 * stride);
    assert!(n > 10, "{n} records");

    // Damage in the header: nothing is kept, and the daemon says why.
    let mut bytes = good.clone();
    bytes[20] ^= 0x04;
    let (text, err) = answer(&with_file("kvdmg-h", &bytes), &p2);
    assert!(
        err.contains("header checksum mismatch (damaged file): kept 0 tokens"),
        "{err}"
    );
    let (fresh, _) = answer(&temp_dir("kvdmg-empty"), &p2);
    assert_eq!(text, fresh);

    for k in 0..n {
        let mut bytes = good.clone();
        // A different byte and bit of each record.
        let pos = HEADER + k as u64 * stride + (k as u64 * 97) % stride;
        bytes[pos as usize] ^= 1 << (k % 8);
        let (text, err) = answer(&with_file("kvdmg", &bytes), &p2);
        assert!(
            err.contains(&format!(
                "record {k} failed its checksum (damaged file): kept {k} of {n} tokens"
            )),
            "record {k}: {err}"
        );
        let prefix = temp_dir("kvdmg-ref");
        let mut kv = full.clone();
        kv.truncate(k);
        write_file(&prefix.join(".coli_kv"), &kv, binding).unwrap();
        let (want, ref_err) = answer(&prefix, &p2);
        assert!(!ref_err.contains("damaged"), "{ref_err}");
        assert_eq!(
            text,
            want,
            "record {k}: {:?} vs {:?}",
            String::from_utf8_lossy(&text),
            String::from_utf8_lossy(&want)
        );
        let _ = std::fs::remove_dir_all(&prefix);
    }
}

#[test]
fn a_damaged_file_is_rewritten_whole_at_the_next_turn_end() {
    let p = "[gMASK]<sop><|user|>Hi<|assistant|><think></think>";
    let state = temp_dir("kvdmg-rewrite");
    let (mut d, _) = start(&state);
    d.prompt(p, 6, None);
    assert!(d.finish().success());
    let path = state.join(".coli_kv");
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0xff], HEADER + 5).unwrap();
    let (mut d, _) = start(&state);
    d.prompt(p, 6, None);
    assert!(d.stderr().contains("record 0 failed its checksum"));
    assert!(d.finish().success());
    let (d, _) = start(&state);
    let err = d.stderr();
    assert!(err.contains("resumed conversation from disk"), "{err}");
    assert!(!err.contains("damaged"), "{err}");
    assert!(d.finish().success());
}
