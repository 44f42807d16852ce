//! Qwen3.5-MoE's recurrent states go back exactly: the verify trail (a cut of rejected drafts
//! restores the state after the kept rows), the marks (a cut to a marked position, or an
//! adoption of another session's prefix ending at one, restores the state there), and with
//! them speculative drafts give the greedy output of a run without drafts, batched and alone.

use std::path::PathBuf;

use colibri::cmd::validate::Reference;
use colibri::engine::{Engine, Event, StepReport, Tenant, TurnSpec};
use colibri::model::{KvCache, LoadOptions, Logits};
use colibri::sampling::Sampler;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-qwen35-moe")
}

fn long_ids() -> Vec<u32> {
    Reference::load(&fixture().join("ref.json"), Some("long"))
        .unwrap()
        .full_ids
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Same positions, tokens, attention rows and recurrent states, bit for bit.
fn assert_same_cache(a: &KvCache, b: &KvCache, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: length");
    assert_eq!(a.tokens, b.tokens, "{what}: tokens");
    let mut linear = 0;
    for (l, (x, y)) in a.layers.iter().zip(&b.layers).enumerate() {
        for (p, (x, y)) in x.parts().into_iter().zip(y.parts()).enumerate() {
            assert_eq!(bits(x), bits(y), "{what}: layer {l} part {p}");
        }
        if let (Some(x), Some(y)) = (x.linear(), y.linear()) {
            assert_eq!(x.pos, y.pos, "{what}: layer {l} state position");
            assert_eq!(bits(&x.conv), bits(&y.conv), "{what}: layer {l} conv state");
            assert_eq!(bits(&x.state), bits(&y.state), "{what}: layer {l} state");
            linear += 1;
        }
    }
    assert!(linear > 0, "the fixture has DeltaNet layers");
}

#[test]
fn cutting_rejected_drafts_restores_the_state_of_the_kept_rows() {
    let engine = Engine::open(vec![fixture()], LoadOptions::default()).unwrap();
    let model = engine.model_for_tests();
    let v = model.cfg.vocab_size;
    let ids = long_ids();
    let (prefix, fed) = ids.split_at(ids.len() - 6);
    let mut before = model.new_cache();
    model.forward(&mut before, prefix, Logits::Last).unwrap();
    for kept in [0, 1, 2, 4] {
        // A verify forward of [next, d1 .. d4] keeping `kept` rows, against the kept
        // tokens fed one per forward as a step without drafts does.
        let mut verified = before.clone();
        verified.arm_trail(5);
        let vl = model
            .forward(&mut verified, &fed[..5], Logits::All)
            .unwrap();
        verified.truncate(prefix.len() + kept);
        assert_eq!(
            verified.restores(),
            (1, 0),
            "kept {kept}: went back by the trail"
        );
        let mut plain = before.clone();
        for (i, t) in fed[..kept].iter().enumerate() {
            let l = model
                .forward(&mut plain, std::slice::from_ref(t), Logits::Last)
                .unwrap();
            assert_eq!(
                bits(&vl[i * v..(i + 1) * v]),
                bits(&l),
                "kept {kept}: row {i} logits"
            );
        }
        assert_same_cache(&verified, &plain, &format!("kept {kept}"));
        // And the cache goes on as the plain one does.
        let a = model
            .forward(&mut verified, &fed[5..], Logits::Last)
            .unwrap();
        let b = model.forward(&mut plain, &fed[5..], Logits::Last).unwrap();
        assert_eq!(bits(&a), bits(&b), "kept {kept}: the next forward");
    }
    // No trail armed, no mark: a cut forgets the whole cache (the caller feeds it again).
    let mut unarmed = before.clone();
    model.forward(&mut unarmed, &fed[..3], Logits::All).unwrap();
    unarmed.truncate(prefix.len() + 1);
    assert_eq!(unarmed.len(), 0);
    assert_eq!(unarmed.restores(), (0, 0));
}

#[test]
fn a_cut_goes_back_to_the_latest_mark_at_or_before_it() {
    let engine = Engine::open(vec![fixture()], LoadOptions::default()).unwrap();
    let model = engine.model_for_tests();
    let ids = long_ids();
    let mut kv = model.new_cache();
    // Marks inside a forward (in its second chunk), and where the cache stands.
    model.forward(&mut kv, &ids[..8], Logits::None).unwrap();
    kv.mark_at(13);
    model.forward(&mut kv, &ids[8..20], Logits::None).unwrap();
    kv.mark_at(20);
    model.forward(&mut kv, &ids[20..40], Logits::Last).unwrap();
    assert_eq!(kv.mark_positions().collect::<Vec<_>>(), vec![13, 20]);
    let fresh = |n: usize| {
        let mut f = model.new_cache();
        model.forward(&mut f, &ids[..n], Logits::Last).unwrap();
        f
    };
    kv.truncate(25);
    assert_eq!(kv.len(), 20, "back to the mark at 20");
    assert_same_cache(&kv, &fresh(20), "mark 20");
    kv.truncate(17);
    assert_eq!(kv.len(), 13, "back to the mark at 13");
    assert_eq!(kv.mark_positions().collect::<Vec<_>>(), vec![13]);
    assert_same_cache(&kv, &fresh(13), "mark 13");
    assert_eq!(kv.restores(), (0, 2));
    // Going on from the mark computes what a full prefill computes.
    let a = model.forward(&mut kv, &ids[13..40], Logits::Last).unwrap();
    let mut f = model.new_cache();
    let b = model.forward(&mut f, &ids[..40], Logits::Last).unwrap();
    assert_eq!(bits(&a), bits(&b));
    kv.truncate(5);
    assert_eq!(kv.len(), 0, "before every mark: forgotten whole");
}

fn with_draft(draft: usize) -> LoadOptions {
    LoadOptions {
        draft,
        ..LoadOptions::default()
    }
}

/// Runs `turns` (prompt, replayed tokens) on sessions 0.. together, greedy, to `max_new`
/// tokens each (the replayed ones first, as `bench` replays a reference), drafting `draft`
/// tokens whenever the n-gram lookup has a proposal: the tokens of each, and the engine.
fn run_batch(
    draft: usize,
    turns: &[(Vec<u32>, Vec<u32>)],
    max_new: usize,
) -> (Vec<Vec<u32>>, Engine) {
    let mut engine = Engine::open(vec![fixture()], with_draft(draft)).unwrap();
    // Always draft: the cut, not the policy, is under test.
    engine.spec_for_tests_mut().adaptive = false;
    engine
        .start_sessions(turns.len(), 512, None, false, None)
        .unwrap();
    for (i, (prompt, forced)) in turns.iter().enumerate() {
        engine
            .begin(
                i,
                TurnSpec {
                    use_stops: false,
                    forced: forced.clone(),
                    ..TurnSpec::new(prompt.clone(), max_new, Sampler::greedy())
                },
            )
            .unwrap();
    }
    let mut out = vec![Vec::new(); turns.len()];
    let mut report = StepReport::default();
    while engine.any_active() {
        engine.step(&mut report).unwrap();
        for e in &report.events {
            if let Event::Token { slot, id } = e {
                out[*slot].push(*id);
            }
        }
    }
    (out, engine)
}

#[test]
fn greedy_output_is_identical_with_drafts_on_and_off() {
    let p = Reference::load(&fixture().join("ref.json"), Some("short"))
        .unwrap()
        .prompt_ids;
    let long = long_ids();
    // Replayed stretches of the prompt make the n-gram lookup draft, and the drafts be
    // accepted; a replayed token off the prompt makes one be rejected. Greedy decoding
    // follows each replay, from the state the drafts' cuts left.
    let mut off_prompt = p[5..25].to_vec();
    off_prompt[8] = p[0];
    let mut rep = p.clone();
    rep.extend_from_slice(&p);
    let mut stitched = long[10..20].to_vec();
    stitched.extend_from_slice(&long[40..50]);
    let turns = vec![
        (p.clone(), off_prompt),
        (p[..p.len() / 2].to_vec(), Vec::new()),
        (rep, p[3..20].to_vec()),
        (long.clone(), stitched),
    ];
    let max_new = 40;
    let (off, e_off) = run_batch(0, &turns, max_new);
    assert_eq!(e_off.spec().tokens_per_forward(), 1.0);
    for draft in [1, 3] {
        let (on, e) = run_batch(draft, &turns, max_new);
        assert_eq!(on, off, "--draft {draft}, batched");
        for slot in 0..turns.len() {
            assert_same_cache(
                &e.session(slot).kv_for_tests(),
                &e_off.session(slot).kv_for_tests(),
                &format!("--draft {draft}, session {slot}"),
            );
        }
        let proposed: u64 = e.spec().proposed.iter().sum();
        let accepted: u64 = e.spec().accepted.iter().sum();
        eprintln!(
            "--draft {draft}: {:.2} tokens/forward, {}",
            e.spec().tokens_per_forward(),
            e.spec().acceptance_line()
        );
        assert!(accepted > 0, "--draft {draft}: some drafts were accepted");
        assert!(
            accepted < proposed,
            "--draft {draft}: some drafts were rejected"
        );
        let trail: u64 = (0..turns.len())
            .map(|s| e.session(s).kv_for_tests().restores().0)
            .sum();
        assert!(
            trail > 0,
            "--draft {draft}: rejected drafts were cut by the trail"
        );
        for i in [0, 3] {
            let (alone, _) = run_batch(draft, &turns[i..i + 1], max_new);
            assert_eq!(alone[0], off[i], "--draft {draft}, prompt {i} alone");
        }
    }
}

/// Begins `prompt` on `slot` through the prompt plan (what the daemon does), runs it to the
/// end: the tokens, and the plan's kept length.
fn turn(engine: &mut Engine, slot: usize, prompt: &[u32], share: bool) -> (Vec<u32>, usize) {
    let plan = engine.prepare_prompt(slot, prompt, share, Tenant::LOCAL);
    engine
        .begin(
            slot,
            TurnSpec {
                use_stops: false,
                ..TurnSpec::new(prompt[plan.keep..].to_vec(), 12, Sampler::greedy())
            },
        )
        .unwrap();
    let mut out = Vec::new();
    let mut report = StepReport::default();
    while engine.any_active() {
        engine.step(&mut report).unwrap();
        for e in &report.events {
            if let Event::Token { id, .. } = e {
                out.push(*id);
            }
        }
    }
    (out, plan.keep)
}

#[test]
fn a_prompt_ending_at_a_mark_starts_from_its_state() {
    let ids = long_ids();
    let (p, q) = (&ids[..50], &ids[..60]);
    let fresh = |prompt: &[u32]| {
        let mut e = Engine::open(vec![fixture()], LoadOptions::default()).unwrap();
        e.start_sessions(1, 512, None, false, None).unwrap();
        turn(&mut e, 0, prompt, false).0
    };
    let mut e = Engine::open(vec![fixture()], LoadOptions::default()).unwrap();
    e.start_sessions(2, 512, None, false, None).unwrap();
    let (first, keep) = turn(&mut e, 0, p, false);
    assert_eq!(keep, 0);
    assert_eq!(first, fresh(p));
    // The same prompt again (a regeneration) shares all but its last token: the state
    // before it was marked, so nothing before it is computed again.
    let (again, keep) = turn(&mut e, 0, p, false);
    assert_eq!(keep, p.len() - 1);
    assert_eq!(again, first);
    assert_eq!(e.session(0).kv_for_tests().restores().1, 1);
    // Another session adopts session 0's prefix up to its mark (`--kv-share`).
    let (adopted, keep) = turn(&mut e, 1, q, true);
    assert_eq!(keep, p.len() - 1, "adopted up to the mark");
    assert_eq!(adopted, fresh(q));
    // A prompt sharing less than any mark is computed again whole.
    let mut r = ids[..30].to_vec();
    r.push(ids[0]);
    let (other, keep) = turn(&mut e, 0, &r, false);
    assert_eq!(keep, 0);
    assert_eq!(other, fresh(&r));
}

/// A template that renders the previous answer otherwise than it was generated makes the
/// next prompt part a few tokens before the last prompt's end: the cache learns how far and
/// keeps its next states that far back.
#[test]
fn marks_go_back_as_far_as_the_next_prompt_parted() {
    let ids = long_ids();
    let fresh = |prompt: &[u32]| {
        let mut e = Engine::open(vec![fixture()], LoadOptions::default()).unwrap();
        e.start_sessions(1, 512, None, false, None).unwrap();
        turn(&mut e, 0, prompt, false).0
    };
    let mut e = Engine::open(vec![fixture()], LoadOptions::default()).unwrap();
    e.start_sessions(1, 512, None, false, None).unwrap();
    let p = &ids[..50];
    turn(&mut e, 0, p, false);
    // Parts 3 tokens before p's end (its mark is 1 before): computed again, and learned.
    let mut q = ids[..47].to_vec();
    q.extend_from_slice(&ids[60..70]);
    let (got, keep) = turn(&mut e, 0, &q, false);
    assert_eq!(keep, 0);
    assert_eq!(got, fresh(&q));
    assert_eq!(
        e.session(0)
            .kv_for_tests()
            .mark_positions()
            .collect::<Vec<_>>(),
        vec![q.len() - 3]
    );
    // The next prompt parting 3 before q's end starts from the mark.
    let mut r = q[..q.len() - 3].to_vec();
    r.extend_from_slice(&ids[..5]);
    let (got, keep) = turn(&mut e, 0, &r, false);
    assert_eq!(keep, q.len() - 3);
    assert_eq!(got, fresh(&r));
    assert_eq!(e.session(0).kv_for_tests().restores().1, 1);
}

/// The RAM clamp counts what a Qwen3.5-MoE session can hold: attention rows per position (a
/// DeltaNet layer keeps none) and the recurrent states with every copy kept for cuts.
#[test]
fn the_kv_pool_counts_the_recurrent_states_and_their_saved_copies() {
    let engine = Engine::open(vec![fixture()], with_draft(3)).unwrap();
    let kv = engine.model_for_tests().new_cache();
    let attention = kv.layers.iter().filter(|l| l.linear().is_none()).count();
    let state: usize = (kv.layers.iter())
        .filter_map(|l| l.linear())
        .map(|s| (s.conv.len() + s.state.len()) * 4)
        .sum();
    assert!(attention > 0 && attention < kv.layers.len() && state > 0);
    assert_eq!(kv.bytes_per_position(), attention * 2 * kv.kv_dim * 4);
    // The live state, the pending mark, two marks, and a trail row for the pending token and
    // each of the three drafts.
    let per_session = 100 * kv.bytes_per_position() + state * (1 + 1 + 2 + 4);
    assert_eq!(engine.kv_pool_bytes(2, 100), 2 * per_session as u64);
    let no_drafts = Engine::open(vec![fixture()], with_draft(0)).unwrap();
    assert_eq!(
        no_drafts.kv_pool_bytes(1, 100),
        (100 * kv.bytes_per_position() + state * 4) as u64
    );
}
