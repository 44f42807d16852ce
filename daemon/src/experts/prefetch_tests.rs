//! The pilot's prefetch accounting through the store's own `fetch_layer`: a scripted set of
//! staged guesses, one in each state a read ahead can be in when its layer asks, and the
//! counts and bytes that must come out.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::pipe::Claim;
use super::stats::PrefetchCounts;
use super::TierConfig;
use crate::engine::Engine;
use crate::model::LoadOptions;

fn open_tiny() -> Engine {
    open_tiny_with(|_| {})
}

fn open_tiny_with(more: impl FnOnce(&mut TierConfig)) -> Engine {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/tiny-moe-bias");
    let mut tiers = TierConfig::default();
    tiers.cache = Some(1);
    tiers.pipe = 1;
    tiers.pilot = crate::experts::args::PilotMode::On;
    more(&mut tiers);
    let opts = LoadOptions {
        tiers,
        ..LoadOptions::default()
    };
    Engine::open(vec![dir], opts).expect("open tiny-moe-bias")
}

#[test]
fn each_read_ahead_is_counted_in_time_late_or_unused() {
    let engine = open_tiny();
    let store = &engine.model_for_tests().experts;
    assert!(store.pilot_enabled());
    let layer = store
        .layers
        .iter()
        .position(Option::is_some)
        .expect("a sparse layer");
    assert!(store.n_experts >= 5, "the script needs 5 experts");
    // An expert's weights to hand over as a finished read (a demand load of expert 0; the
    // cache holds one expert, so expert 0 is the only resident one of the layer).
    let weights = store.get(layer, 0).expect("load expert 0");

    // The script: 1 read and complete, 2 started and still being read, 3 read but never
    // asked for, 4 withdrawn before any worker took it (a skip, not a read).
    let (done_tx, done_rx) = crossbeam_channel::bounded(1);
    done_tx.send(Ok(weights.clone())).unwrap();
    let (late_tx, late_rx) = crossbeam_channel::bounded(1);
    let (_unused_tx, unused_rx) = crossbeam_channel::bounded(1);
    let (_queued_tx, queued_rx) = crossbeam_channel::bounded(1);
    let started = || {
        let c = Arc::new(Claim::default());
        assert!(c.start());
        c
    };
    {
        let mut st = store.layer(layer).unwrap().lock();
        st.staged.push((1, done_rx, started()));
        st.staged.push((2, late_rx, started()));
        st.staged.push((3, unused_rx, started()));
        st.staged.push((4, queued_rx, Arc::new(Claim::default())));
        st.pilot.read += 4;
    }
    // The pilot's raw totals: guesses sent, withdrawn unread, used, used in time. The
    // script's counts are their change (the start may leave totals of its own).
    let totals = || {
        let (mut sent, mut used, mut in_time) = (0, 0, 0);
        for st in store.layers.iter().flatten() {
            let st = st.lock();
            sent += st.pilot.read;
            used += st.pilot.read_used;
            in_time += st.pilot.in_time;
        }
        let skipped = store
            .core
            .stats
            .pilot_skipped
            .load(std::sync::atomic::Ordering::Relaxed);
        [sent, skipped, used, in_time]
    };
    // The scripted guesses were counted as sent above.
    let t0 = {
        let [sent, skipped, used, in_time] = totals();
        [sent - 4, skipped, used, in_time]
    };
    let mut fetch = store.fetch_layer(layer, &[1, 2]);
    // Expert 2's read finishes after the layer asked: it is delivered, and it was late.
    late_tx.send(Ok(weights.clone())).unwrap();
    let mut got: Vec<usize> = fetch.by_ref().map(|r| r.expect("delivered").0).collect();
    drop(fetch);
    got.sort_unstable();
    assert_eq!(got, vec![1, 2]);

    // Settled as the layer's experts were fetched: the withdrawn guess 4 is counted as
    // skipped by the store at once, not when a worker comes to it (none will here).
    let t1 = totals();
    let d = |i: usize| t1[i] - t0[i];
    assert_eq!(d(1), 1, "the withdrawn guess is skipped: {t0:?} -> {t1:?}");
    let c = PrefetchCounts::from_totals(d(0), d(1), d(2), d(3));
    assert_eq!((c.in_time, c.late, c.unused), (1, 1, 1), "{t0:?} -> {t1:?}");
    // The store sums the same totals.
    assert_eq!(
        store.prefetch_counts(),
        PrefetchCounts::from_totals(t1[0], t1[1], t1[2], t1[3])
    );
    assert_eq!(store.counters().prefetch, store.prefetch_counts());
    // The STAT suffix: the same counts in bytes.
    let p = store.prefetch_bytes().expect("the pilot is on");
    assert_eq!(p, store.prefetch_counts().bytes(store.expert_bytes));
    // Bytes: one expert each, over 2 tokens.
    let eb = store.expert_bytes;
    let (t, l, u) = c.mb_per_token(eb, 2);
    let half = eb as f64 / 1e6 / 2.0;
    assert_eq!((t, l, u), (half, half, half));
    // The run's [PROF] lines carry them.
    let lines = store.report_lines(&store.snapshot(), 2, 1.0);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[PROF] prefetch bytes: ") && l.contains(" loads over 2 tokens")),
        "{lines:?}"
    );
}

/// A real run: tokens decoded one by one with a one-expert cache and the pilot reading each
/// row's first guess ahead. Between forwards every guess sent is settled (skipped, or used in
/// time, late, or never), and what the pilot read is exactly the pool's loads that were not
/// demand loads, in loads and in the STAT suffix's bytes.
#[test]
fn a_pilot_run_settles_its_reads_ahead_and_they_add_up_to_its_loads() {
    let engine = open_tiny_with(|t| t.pilot_depth = Some(1));
    let model = engine.model_for_tests();
    let store = &model.experts;
    let mut kv = model.new_cache();
    for i in 0..24u32 {
        model
            .forward(&mut kv, &[(i * 37 + 5) % 400], crate::model::Logits::Last)
            .expect("a decode step");
    }
    let stats = &store.core.stats;
    let c = store.prefetch_counts();
    let sent: u64 = store
        .layers
        .iter()
        .flatten()
        .map(|l| l.lock().pilot.read)
        .sum();
    let skipped = stats.pilot_skipped.load(Ordering::Relaxed);
    assert!(c.read() > 0, "the pilot read ahead: {c:?}");
    assert!(skipped <= sent, "{skipped} skipped of {sent} sent");
    // A guess never used may still be being read: its load is counted when it ends.
    let loads = || stats.other_loads.load(Ordering::Relaxed);
    let t0 = std::time::Instant::now();
    while loads() < c.read() && t0.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(loads(), c.read(), "{c:?}");
    let p = store.prefetch_bytes().expect("the pilot is on");
    assert_eq!(p.read(), loads() * store.expert_bytes);
    assert_eq!(
        (p.in_time, p.late, p.unused),
        (
            c.in_time * store.expert_bytes,
            c.late * store.expert_bytes,
            c.unused * store.expert_bytes
        )
    );
    // Nothing changes once the forwards are done.
    assert_eq!(store.prefetch_counts(), c);
}
