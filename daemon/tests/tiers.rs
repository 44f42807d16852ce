//! The expert tiers never change an output byte (TASTE 9's `TierTester`): the same references
//! through every cache capacity, read path, pipe, pilot, pins and re-pin give bit-identical
//! logits and tokens. Plus: a shard truncated after start is a clear error that leaves the KV
//! cache and the tiers as they were; the usage history round-trips through the store; the
//! RAM clamp refuses a budget that cannot hold one expert per layer.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use colibri::cmd::validate::{check, Reference};
use colibri::engine::Engine;
use colibri::experts::policy::CachePolicy;
use colibri::experts::sim::{self, Trace};
use colibri::experts::{usage_path, IoMode, PilotMode, PinGb, PinSource, TierConfig};
use colibri::model::{KvCache, LoadOptions, Logits};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let d = std::env::temp_dir().join(format!(
            "colibri-tiers-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

fn open(dir: &Path, tiers: TierConfig) -> Engine {
    let opts = LoadOptions {
        tiers,
        ..LoadOptions::default()
    };
    Engine::open(vec![dir.to_path_buf()], opts).expect("open fixture")
}

/// Teacher-forced logits (as bits) and the greedy continuation.
fn outcome(engine: &mut Engine, model: &str, case: &str) -> (Vec<u32>, Vec<u32>) {
    let dir = fixture(model);
    let r = Reference::load(&dir.join("ref.json"), Some(case)).unwrap();
    let o = check(engine, &r).unwrap();
    assert_eq!(o.tf_matched, o.tf_total, "{model}/{case}: teacher forcing");
    assert_eq!(o.gen_matched, o.gen_total, "{model}/{case}: generation");
    (
        o.tf_logits.iter().map(|v| v.to_bits()).collect(),
        o.generated,
    )
}

fn cfg(f: impl FnOnce(&mut TierConfig)) -> TierConfig {
    let mut c = TierConfig::default();
    f(&mut c);
    c
}

const CASES: [(&str, &str); 2] = [("tiny-moe-bias", "long"), ("tiny-dense-shared", "long")];

#[test]
fn every_tier_setting_gives_identical_logits() {
    let settings: Vec<(&str, TierConfig)> = vec![
        ("cache 1", cfg(|c| c.cache = Some(1))),
        ("cache 2", cfg(|c| c.cache = Some(2))),
        (
            "cache 1 direct",
            cfg(|c| {
                c.cache = Some(1);
                c.io = IoMode::Direct
            }),
        ),
        (
            "cache 1 mmap",
            cfg(|c| {
                c.cache = Some(1);
                c.io = IoMode::Mmap
            }),
        ),
        (
            "cache 1 pipe 3",
            cfg(|c| {
                c.cache = Some(1);
                c.pipe = 3
            }),
        ),
        (
            "cache 2 pilot direct drop",
            cfg(|c| {
                c.cache = Some(2);
                c.pipe = 2;
                c.pilot = PilotMode::On;
                c.io = IoMode::Direct;
                c.drop_after = true;
            }),
        ),
        (
            "cache 2 lru",
            cfg(|c| {
                c.cache = Some(2);
                c.cache_policy = CachePolicy::Lru
            }),
        ),
        (
            "cache 1 slru pipe 2",
            cfg(|c| {
                c.cache = Some(1);
                c.cache_policy = CachePolicy::Slru;
                c.pipe = 2
            }),
        ),
        (
            "cache 3 lru pilot",
            cfg(|c| {
                c.cache = Some(3);
                c.cache_policy = CachePolicy::Lru;
                c.pipe = 2;
                c.pilot = PilotMode::On
            }),
        ),
        (
            "cache 1 flat",
            cfg(|c| {
                c.cache = Some(1);
                c.cache_shares = false;
            }),
        ),
        (
            // Re-split before nearly every forward: caps move all the time.
            "cache 2 shares every 2 pipe 2",
            cfg(|c| {
                c.cache = Some(2);
                c.share_every = 2;
                c.pipe = 2;
            }),
        ),
        (
            "cache 1 pipe mmap pilot",
            cfg(|c| {
                c.cache = Some(1);
                c.pipe = 4;
                c.pilot = PilotMode::On;
                c.pilot_inflight = 3;
                c.io = IoMode::Mmap;
            }),
        ),
        (
            // A fixed depth reads guesses from the first step (the auto pilot reads none
            // during its warm-up), one at a time.
            "cache 1 pipe 3 pilot depth 8 inflight 1",
            cfg(|c| {
                c.cache = Some(1);
                c.pipe = 3;
                c.pilot = PilotMode::On;
                c.pilot_depth = Some(8);
                c.pilot_inflight = 1;
            }),
        ),
    ];
    for (model, case) in CASES {
        let dir = fixture(model);
        let base = outcome(&mut open(&dir, TierConfig::default()), model, case);
        for (name, c) in &settings {
            let mut engine = open(&dir, c.clone());
            // Run twice: the second pass meets a warm, partly evicted cache.
            for pass in 0..2 {
                let got = outcome(&mut engine, model, case);
                assert!(
                    got == base,
                    "{model}/{case}: {name} (pass {pass}) changed the output"
                );
            }
            let n = engine.model_for_tests().experts.counters();
            if c.cache == Some(1) {
                assert!(
                    n.store.misses > 0 && n.store.bytes_read > 0,
                    "{name}: nothing was read"
                );
            }
        }
    }
}

/// The pilot's depth moves with each rank's measured precision while a session runs (ranks
/// read, dropped, a layer off and back); none of it reaches the output.
#[test]
fn pilot_depth_changes_leave_the_output_alone() {
    for (model, case) in CASES {
        let dir = fixture(model);
        let base = outcome(&mut open(&dir, TierConfig::default()), model, case);
        for (policy, depth) in [
            (CachePolicy::Lfu, None),
            (CachePolicy::Lru, None),
            (CachePolicy::Lfu, Some(1)),
            (CachePolicy::Slru, Some(2)),
        ] {
            let mut engine = open(
                &dir,
                cfg(|c| {
                    c.cache = Some(1);
                    c.cache_policy = policy;
                    c.pipe = 2;
                    c.pilot = PilotMode::On;
                    c.pilot_depth = depth;
                }),
            );
            // Enough passes for every rank to be measured and the depth to settle.
            for pass in 0..6 {
                assert!(
                    outcome(&mut engine, model, case) == base,
                    "{model}/{case} {policy:?} depth {depth:?}: pass {pass} changed the output"
                );
            }
            let report = engine.model_for_tests().experts.pilot_report();
            if model == "tiny-moe-bias" {
                let r = report.expect("pilot report");
                assert!(r.contains("precision/recall %@depth:"), "{r}");
                eprintln!("{model} {policy:?} depth {depth:?}: {r}");
            }
        }
    }
}

/// The simulator that chose `--cache-policy`'s and `--cache-shares`' defaults replays the store
/// exactly: on the store's own route trace it counts the same hits, for every policy, with and
/// without the I/O pool, with a flat cap and with shares re-split every 3 requests per layer.
#[test]
fn the_policy_simulator_counts_the_stores_hits() {
    for (model, case) in CASES {
        let dir = fixture(model);
        for policy in CachePolicy::ALL {
            for (pipe, shares) in [(0, false), (3, false), (0, true), (3, true)] {
                let tmp = TempDir::new("sim");
                let trace_path = tmp.0.join("route.trace");
                let mut engine = open(
                    &dir,
                    cfg(|c| {
                        c.cache = Some(2);
                        c.cache_policy = policy;
                        c.pipe = pipe;
                        c.cache_shares = shares;
                        c.share_every = 3;
                        c.autopin = false;
                        c.route_trace = Some(trace_path.clone());
                    }),
                );
                outcome(&mut engine, model, case);
                outcome(&mut engine, model, case);
                let n = engine.model_for_tests().experts.counters();
                let n_experts = engine.model_for_tests().experts.n_experts();
                let range = engine.model_for_tests().experts.share_range();
                drop(engine); // flushes the trace
                let mut trace =
                    Trace::parse(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
                trace.n_experts = n_experts;
                let t = match shares {
                    true => sim::replay_shared(&trace, 2, policy, 3),
                    false => sim::replay(&trace, 2, policy, None),
                };
                if shares && policy == CachePolicy::Lru {
                    // The splits did move slots (here 1 to 3 per layer), and so the hits.
                    let (lo, hi) = range.expect("shares on");
                    assert!(lo < hi, "{model}: the split stayed flat");
                    assert_ne!(t, sim::replay(&trace, 2, policy, None), "{model}");
                }
                assert_eq!(
                    (t.hits, t.requests),
                    (n.hits(), n.hits() + n.store.misses),
                    "{model}: {policy:?} pipe {pipe} shares {shares}"
                );
                assert!(n.store.misses > 0, "{model}: nothing was evicted");
            }
        }
    }
}

#[test]
fn pins_and_live_repin_give_identical_logits() {
    for (model, case) in CASES {
        let dir = fixture(model);
        let base = outcome(&mut open(&dir, TierConfig::default()), model, case);
        // Learn the usage, then pin the two *coldest* experts of every sparse layer so the
        // re-pin pass has something to fix.
        let mut probe = open(&dir, cfg(|c| c.cache = Some(1)));
        outcome(&mut probe, model, case);
        let emap = probe.model_for_tests().experts.emap();
        let sparse: Vec<usize> = (0..probe.model_for_tests().cfg.num_hidden_layers)
            .filter(|&l| {
                probe.model_for_tests().cfg.mlp_layer_types[l] == colibri::config::MlpKind::Sparse
            })
            .collect();
        let mut cold = Vec::new();
        for (row, &layer) in sparse.iter().enumerate() {
            let mut by_heat: Vec<(u8, usize)> = (0..emap.cols)
                .map(|e| (emap.heat(row as u32, e).unwrap(), e as usize))
                .collect();
            by_heat.sort();
            cold.extend(by_heat[..2].iter().map(|&(_, e)| (layer, e)));
        }
        let mut engine = open(
            &dir,
            cfg(|c| {
                c.cache = Some(1);
                c.repin = 1;
            }),
        );
        engine.model_for_tests().experts.pin(&cold).unwrap();
        assert!(engine
            .model_for_tests()
            .experts
            .is_pinned(cold[0].0, cold[0].1));
        // The engine runs the re-pin safe point after every step, whoever drives it: cold pins
        // are swapped for hot experts during the run itself, and the logits do not move.
        assert!(
            outcome(&mut engine, model, case) == base,
            "{model}: pinned run differs"
        );
        let swapped = cold
            .iter()
            .filter(|&&(l, e)| !engine.model_for_tests().experts.is_pinned(l, e))
            .count();
        assert!(swapped > 0, "{model}: no live re-pin swap of cold pins");
        let swaps = engine.model_for_tests().experts.safe_point(100).swaps;
        assert!(swaps.len() <= 4);
        for s in &swaps {
            assert!(s.admitted_heat > s.evicted_heat);
            assert!(engine
                .model_for_tests()
                .experts
                .is_pinned(s.layer as usize, s.admitted as usize));
            assert!(!engine
                .model_for_tests()
                .experts
                .is_pinned(s.layer as usize, s.evicted as usize));
        }
        let c = engine.model_for_tests().experts.counters();
        assert!(
            outcome(&mut engine, model, case) == base,
            "{model}: re-pinned run differs"
        );
        assert!(engine.model_for_tests().experts.counters().store.hits_pin > c.store.hits_pin);
        // Heat halves after a pass: an immediate second pass finds less to do.
        let again = engine.model_for_tests().experts.safe_point(1).swaps;
        assert!(again.len() <= swaps.len());
    }
}

fn kv_equal(a: &KvCache, b: &KvCache) -> bool {
    a.len() == b.len()
        && a.tokens == b.tokens
        && a.layers.len() == b.layers.len()
        && a.layers
            .iter()
            .zip(&b.layers)
            .all(|(x, y)| x.parts() == y.parts())
}

fn truncate_shards(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|x| x == "safetensors") {
            let len = std::fs::metadata(&p).unwrap().len();
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(len / 2).unwrap();
        }
    }
}

/// A mirror on another device (a tmpfs beside the disk) gives the same bytes, is read beside
/// the primary, and a copy failing (its shards cut short under the running engine) is
/// retried on the other without an output byte changing.
#[test]
fn a_mirror_returns_the_same_bytes_and_survives_one_copy_failing() {
    let (model, case) = ("tiny-moe-bias", "long");
    let base = outcome(
        &mut open(&fixture(model), TierConfig::default()),
        model,
        case,
    );
    for (mode, pipe) in [(IoMode::Buffered, 0), (IoMode::Direct, 2)] {
        let primary = TempDir::new("mirror-primary");
        let shm = Path::new("/dev/shm");
        let mirror = if shm.is_dir() {
            let d = shm.join(format!(
                "colibri-mirror-{}-{}",
                std::process::id(),
                primary.0.file_name().unwrap().to_string_lossy()
            ));
            std::fs::create_dir_all(&d).unwrap();
            TempDir(d)
        } else {
            TempDir::new("mirror-copy")
        };
        copy_dir(&fixture(model), &primary.0);
        copy_dir(&fixture(model), &mirror.0);
        let mut engine = open(
            &primary.0,
            cfg(|c| {
                c.cache = Some(1);
                c.io = mode;
                c.pipe = pipe;
                c.autopin = false;
                c.mirror = Some(mirror.0.clone());
            }),
        );
        assert!(
            outcome(&mut engine, model, case) == base,
            "{mode:?}: mirrored run differs"
        );
        let d = engine.model_for_tests().experts.drives();
        assert_eq!(d.len(), 2);
        assert!(
            d[0].reads > 0 && d[1].reads > 0,
            "{mode:?}: both copies read: {d:?}"
        );
        assert_eq!((d[0].failed, d[1].failed), (0, 0));
        assert!(d.iter().all(|d| d.busy_s > 0.0 && d.bytes > 0), "{d:?}");
        // The mirror fails: everything comes from the primary.
        truncate_shards(&mirror.0);
        assert!(
            outcome(&mut engine, model, case) == base,
            "{mode:?}: mirror failing"
        );
        let d = engine.model_for_tests().experts.drives();
        assert!(
            d[1].failed > 0,
            "{mode:?}: the mirror was never tried: {d:?}"
        );
        // Mirror mended, the primary fails: served by the mirror.
        copy_dir(&fixture(model), &mirror.0);
        truncate_shards(&primary.0);
        let before = engine.model_for_tests().experts.drives();
        assert!(
            outcome(&mut engine, model, case) == base,
            "{mode:?}: primary failing"
        );
        let d = engine.model_for_tests().experts.drives();
        assert!(
            d[0].failed > before[0].failed,
            "{mode:?}: the primary was never tried: {d:?}"
        );
        assert!(
            d[1].reads > before[1].reads,
            "{mode:?}: the mirror served nothing: {d:?}"
        );
    }
}

#[test]
fn truncated_shard_is_a_clear_error_and_leaves_state_intact() {
    for (mode, pipe) in [
        (IoMode::Buffered, 0),
        (IoMode::Direct, 2),
        (IoMode::Mmap, 0),
    ] {
        let tmp = TempDir::new("trunc");
        copy_dir(&fixture("tiny-moe-bias"), &tmp.0);
        let engine = open(
            &tmp.0,
            cfg(|c| {
                c.cache = Some(1);
                c.io = mode;
                c.pipe = pipe;
            }),
        );
        let model = &engine.model_for_tests();
        let r = Reference::load(&tmp.0.join("ref.json"), Some("long")).unwrap();
        let ids = &r.full_ids;
        let mut kv = model.new_cache();
        model.forward(&mut kv, &ids[..4], Logits::Last).unwrap();
        let want = model
            .forward(&mut kv.clone(), &ids[4..], Logits::All)
            .unwrap();
        let before = kv.clone();
        let resident = model.experts.resident();
        // Cut the shard holding layer 1's experts just before expert 0's gate.
        let shards = colibri::weights::ShardSet::open(std::slice::from_ref(&tmp.0)).unwrap();
        let info = shards
            .get("model.layers.1.mlp.experts.0.gate_proj.weight")
            .unwrap()
            .clone();
        let path = shards.file_path(info.file).to_path_buf();
        let original = std::fs::read(&path).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(info.offset)
            .unwrap();
        let err = model
            .forward(&mut kv, &ids[4..], Logits::All)
            .expect_err("a truncated shard must fail the forward");
        let msg = err.to_string();
        let name = path.file_name().unwrap().to_string_lossy();
        assert!(
            msg.contains(&*name),
            "{mode:?}: error does not name the file: {msg}"
        );
        assert!(kv_equal(&kv, &before), "{mode:?}: the KV cache changed");
        assert!(model.experts.resident().0 <= resident.0.max(3), "{mode:?}");
        // Restored, the same forward gives the same logits: nothing half-read was kept.
        std::fs::write(&path, &original).unwrap();
        let got = model.forward(&mut kv, &ids[4..], Logits::All).unwrap();
        assert!(
            got.iter()
                .map(|v| v.to_bits())
                .eq(want.iter().map(|v| v.to_bits())),
            "{mode:?}: logits after the restored shard differ"
        );
    }
}

#[test]
fn usage_history_round_trips_through_the_store_and_drives_auto_pins() {
    let tmp = TempDir::new("usage");
    let dir = fixture("tiny-moe-bias");
    let upath = usage_path(&tmp.0);
    let mut engine = open(&dir, cfg(|c| c.cache = Some(2)));
    let mut st =
        colibri::engine::tier_start(&engine.model_for_tests(), 1, 256, Some(upath.clone()));
    st.dense_bytes = 0;
    engine.model_for_tests().experts.start(st).unwrap();
    // Nothing routed yet: an all-zero history is a zero-byte file.
    engine.model_for_tests().experts.save_usage();
    assert_eq!(std::fs::metadata(&upath).unwrap().len(), 0);
    outcome(&mut engine, "tiny-moe-bias", "short");
    engine.model_for_tests().experts.turn_end(1);
    let text = std::fs::read_to_string(&upath).unwrap();
    let id = colibri::experts::usage::engine_id();
    // The checksum record first (protocol/README.md), then upstream's header records.
    let (record, rest) = text.split_once('\n').unwrap();
    assert!(record.starts_with("-3 "), "{text}");
    assert!(rest.starts_with(&format!("-1 3 8\n-2 1 {id}\n")), "{text}");
    assert!(!tmp.0.join(".coli_usage.tmp").exists());
    // A new session pins from it with --pin auto.
    let mut pinned = open(
        &dir,
        cfg(|c| {
            c.pin = Some(PinSource::Auto);
            c.pin_gb = PinGb::Gb(1.0);
        }),
    );
    pinned
        .model_for_tests()
        .experts
        .start(colibri::engine::tier_start(
            &pinned.model_for_tests(),
            1,
            256,
            Some(upath.clone()),
        ))
        .unwrap();
    let ((np, _), _) = pinned.model_for_tests().experts.resident_split();
    assert!(np > 0, "nothing pinned from the history");
    outcome(&mut pinned, "tiny-moe-bias", "short");
    assert!(pinned.model_for_tests().experts.counters().store.hits_pin > 0);
}

#[test]
fn foreign_and_corrupt_histories_are_refused_and_left_alone() {
    let dir = fixture("tiny-moe-bias");
    for text in ["-1 3 8\n-2 1 42\n0 1 5\n", "garbage here\n"] {
        let tmp = TempDir::new("foreign");
        let upath = usage_path(&tmp.0);
        std::fs::write(&upath, text).unwrap();
        let mut engine = open(&dir, TierConfig::default());
        engine
            .model_for_tests()
            .experts
            .start(colibri::engine::tier_start(
                &engine.model_for_tests(),
                1,
                256,
                Some(upath.clone()),
            ))
            .expect("a refused history is not fatal");
        outcome(&mut engine, "tiny-moe-bias", "short");
        engine.model_for_tests().experts.turn_end(1);
        assert_eq!(std::fs::read_to_string(&upath).unwrap(), text);
    }
    // Named explicitly with --pin, a corrupt file is a usage error (exit 2).
    let tmp = TempDir::new("pinfile");
    let p = tmp.0.join("pins");
    std::fs::write(&p, "1 2\n").unwrap();
    let engine = open(&dir, cfg(|c| c.pin = Some(PinSource::File(p.clone()))));
    let err = engine
        .model_for_tests()
        .experts
        .start(colibri::engine::tier_start(
            &engine.model_for_tests(),
            1,
            256,
            None,
        ))
        .unwrap_err();
    assert_eq!(err.exit_code(), 2, "{err}");
}

#[test]
fn a_budget_without_room_for_one_expert_per_layer_is_refused() {
    let engine = open(
        &fixture("tiny-moe-bias"),
        cfg(|c| {
            c.ram_gb = Some(1.0);
            // Below upstream's fixed reserve alone, asked for explicitly (by default a
            // 1 GB budget keeps a quarter of itself, and the tiny model fits).
            c.ram_reserve = Some(colibri::experts::ram::DEFAULT_RESERVE);
        }),
    );
    let err = engine
        .model_for_tests()
        .experts
        .start(colibri::engine::tier_start(
            &engine.model_for_tests(),
            1,
            256,
            None,
        ))
        .unwrap_err();
    assert_eq!(err.exit_code(), 2);
    let msg = err.to_string();
    assert!(
        msg.contains("--ram-gb 1.00") && msg.contains("projected peak"),
        "{msg}"
    );
}

/// `--model-dirs`: the model over two directories, as two full copies or as a split of its
/// shards (config and tokenizer in the first), gives the same bytes as one directory; copies
/// are both read, and a split reads each shard where it is.
#[test]
fn model_dirs_over_copies_or_a_split_give_the_same_bytes() {
    let (model, case) = ("tiny-moe-bias", "long");
    let base = outcome(
        &mut open(&fixture(model), TierConfig::default()),
        model,
        case,
    );
    let shard = |i: usize| format!("model-0000{i}-of-00004.safetensors");
    for split in [false, true] {
        let (a, b) = (TempDir::new("dirs-a"), TempDir::new("dirs-b"));
        copy_dir(&fixture(model), &a.0);
        for i in 1..=4 {
            // Split: layer 0's experts (shard 1) and the rest of the dense weights (4) stay
            // in a; layers 1 and 2's experts move to b. Copies: every shard in both.
            if split && (i == 2 || i == 3) {
                std::fs::rename(a.0.join(shard(i)), b.0.join(shard(i))).unwrap();
            } else if !split {
                std::fs::copy(a.0.join(shard(i)), b.0.join(shard(i))).unwrap();
            }
        }
        let tiers = cfg(|c| {
            c.cache = Some(1);
            c.pipe = 2;
            c.autopin = false;
            c.model_dirs = vec![a.0.clone(), b.0.clone()];
        });
        let opts = LoadOptions {
            tiers,
            ..LoadOptions::default()
        };
        let mut engine = Engine::open(vec![a.0.clone(), b.0.clone()], opts).expect("open");
        assert!(
            outcome(&mut engine, model, case) == base,
            "split {split}: the bytes differ from one directory's"
        );
        let d = engine.model_for_tests().experts.drives();
        assert_eq!(d.len(), 2, "split {split}: {d:?}");
        assert!(
            d[0].reads > 0 && d[1].reads > 0,
            "split {split}: both drives read: {d:?}"
        );
        assert_eq!((d[0].failed, d[1].failed), (0, 0));
        if split {
            // Two of the three sparse layers' experts live in b.
            assert!(d[1].bytes > d[0].bytes, "{d:?}");
        }
    }
}
