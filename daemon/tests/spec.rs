//! Speculative decoding: the MTP head against its Python reference, the verify forward's
//! rollback (bitwise), greedy identity drafts on/off (every fixture, 4 batched sessions), the
//! sampled distribution drafts on/off, and the acceptance switch-off.

mod common;

use std::path::{Path, PathBuf};

use colibri::cmd::validate::Reference;
use colibri::engine::spec::DraftSource;
use colibri::engine::{Engine, Event, StepReport, TurnSpec};
use colibri::model::{KvCache, LoadOptions, Logits, MtpStep, SeqStep};
use colibri::sampling::{Rng, Sampler};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures")
        .join(name)
}

fn demo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("demo")
}

fn with_draft(draft: usize) -> LoadOptions {
    LoadOptions {
        draft,
        ..LoadOptions::default()
    }
}

fn read_f32(path: &std::path::Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn mtp_logits_match_the_python_reference() {
    let fix = fixture("demo-trained");
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fix.join("mtp_ref.json")).unwrap()).unwrap();
    let case = &meta["short"];
    let ids: Vec<u32> = case["full_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let want = read_f32(&fix.join(case["logits_file"].as_str().unwrap()));
    let engine = Engine::open(vec![demo()], with_draft(1)).unwrap();
    let model = &engine.model_for_tests();
    let mtp = model.mtp.as_ref().expect("the demo model has an MTP head");
    let (h, vocab) = (model.cfg.hidden_size, model.cfg.vocab_size);
    let mut kv = model.new_cache();
    let (mut logits, mut hidden) = (Vec::new(), Vec::new());
    let mut seqs = [SeqStep {
        kv: &mut kv,
        tokens: &ids,
        logits: Logits::All,
    }];
    model
        .forward_batch_hidden(&mut seqs, &mut logits, &mut hidden)
        .unwrap();
    let s = ids.len() - 1;
    let mut mkv = mtp.new_cache(&model.cfg);
    let (mut ml, mut last) = (Vec::new(), Vec::new());
    let mut steps = [MtpStep {
        kv: &mut mkv,
        next_tokens: &ids[1..],
        hidden: &hidden[..s * h],
        logits: Logits::All,
    }];
    mtp.forward(model, &mut steps, &mut ml, &mut last).unwrap();
    assert_eq!(ml.len(), want.len());
    assert_eq!(mkv.len(), s);
    let top1: Vec<u64> = case["top1"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let mut worst = 0f32;
    for r in 0..s {
        let (a, b) = (
            &ml[r * vocab..(r + 1) * vocab],
            &want[r * vocab..(r + 1) * vocab],
        );
        let d = a
            .iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        worst = worst.max(d);
        let argmax = a
            .iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .unwrap()
            .0;
        assert_eq!(argmax as u64, top1[r], "row {r}: the head's top-1");
    }
    // f32 on both sides; the reference's smallest top-1 gap is 0.03.
    assert!(worst < 2e-3, "max |engine - reference| = {worst}");
}

fn assert_same_cache(a: &KvCache, b: &KvCache) {
    assert_eq!(a.len(), b.len());
    assert_eq!(a.tokens, b.tokens);
    for (l, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        // MLA's latent, rope and indexer keys, or grouped-query keys and values.
        for (p, (x, y)) in x.parts().into_iter().zip(y.parts()).enumerate() {
            assert_eq!(bits(x), bits(y), "layer {l} part {p}");
        }
    }
}

#[test]
fn rollback_leaves_the_cache_a_forward_without_the_drafts_writes() {
    for dir in [
        fixture("tiny-moe-bias"),
        fixture("tiny-dense-shared"),
        demo(),
    ] {
        let long = Reference::load(&fixture("tiny-moe-bias").join("ref.json"), Some("long"))
            .unwrap()
            .full_ids;
        let engine = Engine::open(vec![dir.clone()], LoadOptions::default()).unwrap();
        let model = &engine.model_for_tests();
        // Past index_topk (the demo's 64, the fixtures' smaller) so the indexer is sparse.
        let ids: Vec<u32> = long
            .iter()
            .cycle()
            .take(90)
            .map(|&t| t % model.cfg.vocab_size as u32)
            .collect();
        let (prefix, fed) = ids.split_at(80);
        let mut verified = model.new_cache();
        model.forward(&mut verified, prefix, Logits::Last).unwrap();
        let mut plain = verified.clone();
        // Verify forward of [next, d1, d2, d3, d4] keeping two positions.
        let vl = model
            .forward(&mut verified, &fed[..5], Logits::All)
            .unwrap();
        verified.truncate(prefix.len() + 2);
        // The same two tokens decoded one per forward, as without drafts.
        let l0 = model.forward(&mut plain, &fed[..1], Logits::Last).unwrap();
        let l1 = model.forward(&mut plain, &fed[1..2], Logits::Last).unwrap();
        assert_same_cache(&verified, &plain);
        let v = model.cfg.vocab_size;
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&vl[..v]), bits(&l0), "{}: row 0 logits", dir.display());
        assert_eq!(
            bits(&vl[v..2 * v]),
            bits(&l1),
            "{}: row 1 logits",
            dir.display()
        );
    }
}

/// Runs `prompts` on sessions 0.. together to the end, with `sampler(i)` for session i;
/// the tokens of each, and the engine.
fn run_batch(
    dir: &Path,
    draft: usize,
    prompts: &[Vec<u32>],
    max_new: usize,
    sampler: impl Fn(usize) -> Sampler,
) -> (Vec<Vec<u32>>, Engine) {
    run_batch_with(
        &[dir.to_path_buf()],
        draft,
        prompts,
        max_new,
        sampler,
        |_| {},
    )
}

/// [`run_batch`] over the weights of every folder of `dirs`, with `setup` run on the engine
/// first.
fn run_batch_with(
    dirs: &[PathBuf],
    draft: usize,
    prompts: &[Vec<u32>],
    max_new: usize,
    sampler: impl Fn(usize) -> Sampler,
    setup: impl FnOnce(&mut Engine),
) -> (Vec<Vec<u32>>, Engine) {
    let mut engine = Engine::open(dirs.to_vec(), with_draft(draft)).unwrap();
    setup(&mut engine);
    engine
        .start_sessions(prompts.len(), 512, None, false, None)
        .unwrap();
    let turns = (prompts.iter().enumerate())
        .map(|(i, p)| (p.clone(), max_new, sampler(i)))
        .collect();
    let out = common::run_to_end(&mut engine, turns);
    (out, engine)
}

fn prompts_for(dir: &Path) -> Vec<Vec<u32>> {
    let r = Reference::load(&dir.join("ref.json"), Some("short"))
        .or_else(|_| Reference::load(&fixture("demo-trained").join("ref.json"), Some("short")))
        .unwrap();
    let p = r.prompt_ids;
    // Different lengths, one with a repeat for the n-gram lookup to find.
    let mut rep = p.clone();
    rep.extend_from_slice(&p);
    vec![
        p.clone(),
        p[..p.len() / 2].to_vec(),
        rep,
        p.iter().rev().copied().collect(),
    ]
}

#[test]
fn greedy_output_is_identical_with_drafts_on_and_off() {
    for (dir, max_new) in [
        (fixture("tiny-moe-bias"), 40),
        (fixture("tiny-dense-shared"), 40),
        (fixture("hf-fp8-moe"), 24),
        (demo(), 60),
    ] {
        let prompts = if dir.join("ref.json").exists() {
            prompts_for(&dir)
        } else {
            prompts_for(&fixture("tiny-moe-bias"))
        };
        let (off, e_off) = run_batch(&dir, 0, &prompts, max_new, |_| Sampler::greedy());
        assert_eq!(e_off.spec().tokens_per_forward(), 1.0);
        for draft in [1, 3] {
            let (on, e) = run_batch(&dir, draft, &prompts, max_new, |_| Sampler::greedy());
            assert_eq!(on, off, "{} --draft {draft}", dir.display());
            // One session alone too (the unbatched step).
            let (alone, _) = run_batch(&dir, draft, &prompts[2..3], max_new, |_| Sampler::greedy());
            assert_eq!(alone[0], off[2], "{} alone --draft {draft}", dir.display());
            eprintln!(
                "{} --draft {draft}: {:.2} tokens/forward, {}",
                dir.display(),
                e.spec().tokens_per_forward(),
                e.spec().acceptance_line()
            );
            let drafted: u64 = e.spec().proposed.iter().sum();
            assert!(drafted > 0, "{}: some drafts were verified", dir.display());
        }
    }
}

#[test]
fn the_demo_models_mtp_drafts_are_accepted() {
    let prompts = prompts_for(&demo());
    // MTP alone and always drafting: the head's quality, not the policy, is under test.
    let (_, e) = run_batch_with(
        &[demo()],
        2,
        &prompts[..1],
        60,
        |_| Sampler::greedy(),
        |e| {
            e.spec_for_tests_mut().adaptive = false;
            e.spec_for_tests_mut().enabled = [true, false];
        },
    );
    let mtp = e
        .spec()
        .acceptance_pct(DraftSource::Mtp)
        .expect("MTP drafted");
    assert!(mtp > 20.0, "MTP acceptance {mtp:.1}%");
    assert!(e.spec().tokens_per_forward() > 1.2);
}

/// A folder holding one extra shard: `fixture`'s last decoder layer copied as its MTP layer
/// (`model.layers.{L}`, the same attention and experts), norms of ones, and an `eh_proj` that
/// passes the hidden half through. The published DeepSeek-V3/V3.2 and GLM-4.5 checkpoints ship
/// such a layer, which transformers drops, so there is no oracle for it; a draft is only a
/// proposal the model verifies, so any weights exercise the plumbing.
fn with_mtp_layer(fixture: &Path) -> PathBuf {
    use colibri::weights::{writer::SafetensorsWriter, ShardSet};
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture.join("config.json")).unwrap())
            .unwrap();
    let layers = cfg["num_hidden_layers"].as_u64().unwrap() as usize;
    let h = cfg["hidden_size"].as_u64().unwrap() as usize;
    let shards = ShardSet::open(&[fixture.to_path_buf()]).unwrap();
    let (from, to) = (
        format!("model.layers.{}.", layers - 1),
        format!("model.layers.{layers}."),
    );
    assert!(
        shards.contains(&format!("{from}mlp.gate.weight")),
        "{}: the last layer is a mixture of experts",
        fixture.display()
    );
    let mut w = SafetensorsWriter::new();
    let names: Vec<String> = shards
        .names()
        .filter(|n| n.starts_with(&from))
        .map(str::to_owned)
        .collect();
    for name in names {
        let info = shards.get(&name).unwrap();
        let (dtype, shape) = (info.dtype, info.shape.clone());
        let bytes = shards.bytes(&name).unwrap().to_vec();
        w.add(&name.replacen(&from, &to, 1), dtype, &shape, bytes);
    }
    let ones = vec![1.0f32; h];
    for norm in ["enorm", "hnorm", "shared_head.norm"] {
        w.add_f32(&format!("{to}{norm}.weight"), &[h], &ones);
    }
    let mut eh = vec![0.0f32; h * 2 * h];
    for i in 0..h {
        eh[i * 2 * h + h + i] = 1.0;
    }
    w.add_f32(&format!("{to}eh_proj.weight"), &[h, 2 * h], &eh);
    let name = fixture.file_name().unwrap().to_string_lossy();
    let dir = std::env::temp_dir().join(format!("coli-mtp-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    w.write(&dir.join("model-mtp.safetensors")).unwrap();
    dir
}

/// DeepSeek-V3 (MLA without an indexer), V3.2 (with its own indexer) and GLM-4.5 (grouped-query
/// attention) draft from their MTP layers, batched and alone, and the greedy output is the
/// one without drafts.
#[test]
fn the_families_mtp_layers_draft_without_changing_the_output() {
    for name in [
        "tiny-deepseek-v3",
        "tiny-deepseek-v32",
        "tiny-glm4-moe-groups",
    ] {
        let dirs = [fixture(name), with_mtp_layer(&fixture(name))];
        let prompts = prompts_for(&fixture(name));
        let (off, _) = run_batch_with(&dirs, 0, &prompts, 24, |_| Sampler::greedy(), |_| {});
        for draft in [1, 3] {
            let mtp_only = |e: &mut Engine| {
                assert!(
                    e.model_for_tests().mtp.is_some(),
                    "{name}: the MTP layer loads"
                );
                e.spec_for_tests_mut().adaptive = false;
                e.spec_for_tests_mut().enabled = [true, false];
            };
            let (on, e) =
                run_batch_with(&dirs, draft, &prompts, 24, |_| Sampler::greedy(), mtp_only);
            assert_eq!(on, off, "{name} --draft {draft}");
            let (alone, _) = run_batch_with(
                &dirs,
                draft,
                &prompts[2..3],
                24,
                |_| Sampler::greedy(),
                mtp_only,
            );
            assert_eq!(alone[0], off[2], "{name} alone --draft {draft}");
            let drafted = e.spec().proposed[DraftSource::Mtp as usize];
            assert!(drafted > 0, "{name}: the MTP layer drafted");
            eprintln!("{name} --draft {draft}: {}", e.spec().acceptance_line());
        }
        let _ = std::fs::remove_dir_all(&dirs[1]);
    }
}

/// The first two sampled tokens of a continuation, under temperature, drafts on vs off: both
/// must follow the target's exact two-token distribution, computed here from the model's
/// logits with the sampler's own rule (so the comparison is against the truth, not merely
/// against each other). Pearson's chi-square over the cells with an expected count of at
/// least 5 (the rest pooled), at a 1e-4 level: the seeds are fixed, so a pass is reproducible,
/// and a verify that kept drafts too often (or too rarely) shifts thousands of counts.
#[test]
fn sampled_distribution_is_the_targets_with_drafts_on() {
    let dir = demo();
    let prompt = prompts_for(&dir)[0].clone();
    let (temp, top_p) = (1.0f32, 0.9f32);
    let engine = Engine::open(vec![dir.clone()], LoadOptions::default()).unwrap();
    let model = &engine.model_for_tests();
    let probs = |logits: &[f32]| -> Vec<(u32, f64)> {
        // The sampler's nucleus: descending, ties to the lower id, smallest prefix >= top_p.
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut p: Vec<(f32, u32)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (((l - max) / temp).exp(), i as u32))
            .collect();
        let sum: f32 = p.iter().map(|x| x.0).sum();
        p.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut kept = 0f32;
        let mut cut = p.len();
        for (i, x) in p.iter().enumerate() {
            kept += x.0;
            if kept >= top_p * sum {
                cut = i + 1;
                break;
            }
        }
        p[..cut]
            .iter()
            .map(|&(v, id)| (id, (v / kept) as f64))
            .collect()
    };
    let mut kv = model.new_cache();
    let first = model.forward(&mut kv, &prompt, Logits::Last).unwrap();
    let mut exact: Vec<((u32, u32), f64)> = Vec::new();
    for (t1, p1) in probs(&first) {
        let mut k = kv.clone();
        let second = model.forward(&mut k, &[t1], Logits::Last).unwrap();
        for (t2, p2) in probs(&second) {
            exact.push(((t1, t2), p1 * p2));
        }
    }
    let n = 1500;
    for draft in [0, 2] {
        let mut counts = std::collections::HashMap::<(u32, u32), u64>::new();
        let mut engine = Engine::open(vec![dir.clone()], with_draft(draft)).unwrap();
        // Every step drafts: the verify is what is under test, not the policy.
        engine.spec_for_tests_mut().adaptive = false;
        engine.start_sessions(4, 256, None, false, None).unwrap();
        let mut seed = 1u64;
        let mut done = 0;
        while done < n {
            for slot in 0..4 {
                seed += 1;
                let s = Sampler::new(temp, top_p, Rng::new(seed * 7919));
                engine
                    .begin(
                        slot,
                        TurnSpec {
                            use_stops: false,
                            ..TurnSpec::new(prompt.clone(), 3, s)
                        },
                    )
                    .unwrap();
            }
            let mut got = vec![Vec::new(); 4];
            let mut report = StepReport::default();
            while engine.any_active() {
                engine.step(&mut report).unwrap();
                for e in &report.events {
                    if let Event::Token { slot, id } = e {
                        got[*slot].push(*id);
                    }
                }
            }
            for (slot, g) in got.iter().enumerate() {
                *counts.entry((g[0], g[1])).or_default() += 1;
                engine.reset(slot);
            }
            done += 4;
        }
        if draft > 0 {
            // The second token of every sample was checked against a draft (the third is the
            // last, never drafted for).
            let proposed: u64 = engine.spec().proposed.iter().sum();
            assert!(proposed >= n as u64, "{proposed} drafts verified");
            eprintln!("--draft {draft}: {}", engine.spec().acceptance_line());
        }
        let total = done as f64;
        let (mut chi2, mut cells) = (0.0, 0usize);
        let (mut pool_e, mut pool_o) = (0.0, 0.0);
        let mut seen = 0u64;
        for (cell, p) in &exact {
            let e = p * total;
            let o = *counts.get(cell).unwrap_or(&0) as f64;
            seen += o as u64;
            if e >= 5.0 {
                chi2 += (o - e).powi(2) / e;
                cells += 1;
            } else {
                pool_e += e;
                pool_o += o;
            }
        }
        assert_eq!(
            seen, done as u64,
            "every sample inside the target's support"
        );
        if pool_e > 0.0 {
            chi2 += (pool_o - pool_e).powi(2) / pool_e.max(1e-9);
            cells += 1;
        }
        let df = (cells - 1) as f64;
        // Wilson-Hilferty: the chi-square quantile at 1 - 1e-4 (z = 3.719).
        let z = 3.719;
        let limit = df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3);
        eprintln!("--draft {draft}: chi2 {chi2:.1} over {df} df (limit {limit:.1})");
        assert!(chi2 < limit, "--draft {draft}: chi2 {chi2:.1} > {limit:.1}");
    }
}

/// The random MTP head of hf-fp8-moe (layer 0's weights copied) is never right: the engine
/// turns it off (and stops feeding it for the rest of the conversation), tries it again in a
/// conversation that starts after its pause, and turns it off again; every conversation's
/// output stays the same greedy text.
#[test]
fn a_losing_source_is_switched_off_and_retried() {
    let dir = fixture("hf-fp8-moe");
    let prompt = prompts_for(&fixture("tiny-moe-bias"))[0].clone();
    let turn = colibri::engine::spec::RETRY_STEPS as usize;
    let conversations = 4;
    let (off, _) = run_batch(&dir, 0, std::slice::from_ref(&prompt), turn, |_| {
        Sampler::greedy()
    });
    let mut e = Engine::open(vec![dir.clone()], with_draft(2)).unwrap();
    // MTP alone, so the n-gram lookup's better record does not keep it from being tried.
    e.spec_for_tests_mut().enabled = [true, false];
    e.start_sessions(1, 512, None, false, None).unwrap();
    let mut report = StepReport::default();
    let mut off_in_second = false;
    for c in 0..conversations {
        e.reset(0);
        e.begin(
            0,
            TurnSpec {
                use_stops: false,
                ..TurnSpec::new(prompt.clone(), turn, Sampler::greedy())
            },
        )
        .unwrap();
        let proposed = e.session(0).spec.stats[0].proposed;
        let mut out = Vec::new();
        while e.any_active() {
            e.step(&mut report).unwrap();
            for ev in &report.events {
                if let Event::Token { id, .. } = ev {
                    out.push(*id);
                }
            }
        }
        assert_eq!(out, off[0], "conversation {c}");
        if c == 1 {
            off_in_second = e.session(0).spec.stats[0].proposed == proposed;
        }
    }
    let st = &e.session(0).spec.stats[0];
    // Switched off in the first conversation, unfed through the second (inside its pause),
    // retried in a later one and switched off again.
    assert!(off_in_second, "the head drafted during its pause");
    assert!(
        st.switched_off >= 2,
        "switched off {} times",
        st.switched_off
    );
    assert!(st.retries >= 1, "retried {} times", st.retries);
    assert!(
        (st.proposed as usize) < conversations * turn / 8,
        "{} MTP drafts over {} tokens",
        st.proposed,
        conversations * turn
    );
}
