//! Cache-policy simulator: replays a routing trace (`--route-trace`) through one cache per
//! layer under each [`Policy`], beside Belady's optimum (offline MIN with bypass) at the same
//! capacity. This is how `--cache-policy`'s default was chosen (`examples/cache_sim.rs` prints
//! the table); the unit tests pin both the replay of the engine's own LRU and the optimum.
//!
//! A trace line is one routed row: `<call> <row> <layer> <id>:<gate> ...`. The engine fetches
//! each expert once per (forward call, layer), in ascending order, so a layer's requests are,
//! call after call, the sorted union of what its rows picked ([`Batch`]).

use std::collections::BTreeMap;

use super::lru::Lru;
use super::policy::CachePolicy;
use super::shares;

/// One layer's fetch in one forward call.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Distinct experts, ascending.
    pub experts: Vec<usize>,
    /// Rows of the forward (1 in decode, the prompt length in a prefill chunk).
    pub rows: usize,
    /// The forward call it belongs to (orders the layers' batches in time).
    pub call: u64,
}

/// Every sparse layer's batches, in call order.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub n_experts: usize,
    pub layers: BTreeMap<usize, Vec<Batch>>,
}

impl Trace {
    /// Parses route-trace text. Errors name the line.
    pub fn parse(text: &str) -> Result<Trace, String> {
        let mut t = Trace::default();
        // (call, layer) -> index of its batch in the layer, for rows of the same call.
        let mut open: BTreeMap<(u64, usize), usize> = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let bad = |why: &str| format!("route trace line {}: {why}: {line:?}", i + 1);
            let mut w = line.split_whitespace();
            let (Some(call), Some(_row), Some(layer)) = (w.next(), w.next(), w.next()) else {
                if line.trim().is_empty() {
                    continue;
                }
                return Err(bad("expected `<call> <row> <layer> <id>:<gate> ...`"));
            };
            let call: u64 = call.parse().map_err(|_| bad("call is not a number"))?;
            let layer: usize = layer.parse().map_err(|_| bad("layer is not a number"))?;
            let batches = t.layers.entry(layer).or_default();
            let idx = *open.entry((call, layer)).or_insert_with(|| {
                batches.push(Batch {
                    experts: Vec::new(),
                    rows: 0,
                    call,
                });
                batches.len() - 1
            });
            let b = &mut batches[idx];
            b.rows += 1;
            for tok in w {
                let id = tok.split(':').next().unwrap_or("");
                let e: usize = id.parse().map_err(|_| bad("expert id is not a number"))?;
                t.n_experts = t.n_experts.max(e + 1);
                if let Err(pos) = b.experts.binary_search(&e) {
                    b.experts.insert(pos, e);
                }
            }
        }
        Ok(t)
    }

    pub fn requests(&self) -> usize {
        self.layers
            .values()
            .flatten()
            .map(|b| b.experts.len())
            .sum()
    }
}

/// Hits and requests of one replay.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    pub hits: u64,
    pub requests: u64,
}

impl Tally {
    pub fn rate(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }

    pub fn add(&mut self, o: Tally) {
        self.hits += o.hits;
        self.requests += o.requests;
    }
}

/// One layer's cache replayed the way the store runs it, through the store's own [`Lru`]: a
/// batch's hits and misses are settled against the cache as it was when the batch began (keys
/// taken in request order), then the misses are inserted and the lowest keys evicted down to
/// the cap (possibly the newcomer itself: a refused admission).
pub fn replay_layer(batches: &[Batch], n_experts: usize, cap: usize, policy: CachePolicy) -> Tally {
    let mut lru = Lru::with_policy(n_experts, cap, policy);
    let mut t = Tally::default();
    let mut misses = Vec::new();
    for b in batches {
        serve(&mut lru, b, &mut t, &mut misses);
    }
    t
}

fn serve(lru: &mut Lru<()>, b: &Batch, t: &mut Tally, misses: &mut Vec<(usize, u64)>) {
    misses.clear();
    lru.begin_batch(b.rows);
    for &e in &b.experts {
        t.requests += 1;
        if lru.get(e).is_some() {
            t.hits += 1;
        } else {
            misses.push((e, lru.request(e)));
        }
    }
    for &(e, stamp) in misses.iter() {
        lru.insert(e, (), stamp);
    }
}

/// Every layer under `policy` with runtime shares, as the store runs `--cache-shares`: the
/// batches in call order (layers ascending within a call), and before a call, once
/// [`shares::RESPLIT_EVERY`] requests per layer have been served since the last split, the
/// `cap x layers` slots split again from the layers' measured reuse.
pub fn replay_shared(trace: &Trace, cap: usize, policy: CachePolicy, every: u64) -> Tally {
    let layers: Vec<&Vec<Batch>> = trace.layers.values().collect();
    let mut caches: Vec<Lru<()>> = layers
        .iter()
        .map(|_| {
            let mut l = Lru::with_policy(trace.n_experts, cap, policy);
            l.measure_reuse();
            l
        })
        .collect();
    let mut order: Vec<(u64, usize, usize)> = layers
        .iter()
        .enumerate()
        .flat_map(|(l, bs)| bs.iter().enumerate().map(move |(i, b)| (b.call, l, i)))
        .collect();
    order.sort_unstable();
    let total = cap * layers.len();
    let mut since = 0u64;
    let mut call = None;
    let mut t = Tally::default();
    let mut misses = Vec::new();
    for (c, l, i) in order {
        if call != Some(c) {
            call = Some(c);
            if since >= every * layers.len() as u64 {
                since = 0;
                resplit(&mut caches, total, trace.n_experts);
            }
        }
        let before = t.requests;
        serve(&mut caches[l], &layers[l][i], &mut t, &mut misses);
        since += t.requests - before;
    }
    t
}

/// New caps from the caches' reuse histograms, which are then halved.
fn resplit(caches: &mut [Lru<()>], total: usize, n_experts: usize) {
    let hists: Vec<&[u64]> = caches
        .iter()
        .map(|c| c.reuse().map_or(&[][..], |m| m.hist()))
        .collect();
    let caps = shares::split(&hists, total, n_experts);
    for (c, cap) in caches.iter_mut().zip(caps) {
        c.set_cap(cap);
        if let Some(m) = c.reuse_mut() {
            m.age();
        }
    }
}

/// The best a policy that cannot see the future does on a trace without temporal structure:
/// the `cap` experts used most over the whole trace, kept from the start (per layer). Belady
/// on the same requests in shuffled order ([`belady_shuffled`]) shows how much of the optimum
/// is foresight alone.
pub fn static_best(trace: &Trace, cap: usize) -> Tally {
    let mut t = Tally::default();
    for b in trace.layers.values() {
        let mut count = vec![0u64; trace.n_experts];
        for e in b.iter().flat_map(|b| b.experts.iter()) {
            count[*e] += 1;
        }
        let requests: u64 = count.iter().sum();
        count.sort_unstable_by(|a, b| b.cmp(a));
        t.add(Tally {
            hits: count.iter().take(cap).sum(),
            requests,
        });
    }
    t
}

/// Belady's optimum with each layer's batches in a fixed pseudo-random order: the same
/// requests with any order in time removed.
pub fn belady_shuffled(trace: &Trace, cap: usize) -> Tally {
    let mut t = Tally::default();
    // A fixed shuffle, the same on every run.
    let mut x = crate::rng::XorShift64(0x9e37_79b9_7f4a_7c15);
    for b in trace.layers.values() {
        let mut b = b.clone();
        for i in (1..b.len()).rev() {
            b.swap(i, (x.next_u64() % (i as u64 + 1)) as usize);
        }
        t.add(belady_layer(&b, trace.n_experts, cap));
    }
    t
}

/// Belady's MIN with bypass over one layer's requests taken one by one: on a miss with the
/// cache full, the expert used farthest in the future (the newcomer included) is the one not
/// kept. No online policy with `cap` slots per layer can hit more on this trace.
pub fn belady_layer(batches: &[Batch], n_experts: usize, cap: usize) -> Tally {
    let seq: Vec<usize> = batches
        .iter()
        .flat_map(|b| b.experts.iter().copied())
        .collect();
    let mut next = vec![usize::MAX; seq.len()];
    let mut last = vec![usize::MAX; n_experts];
    for (i, &e) in seq.iter().enumerate().rev() {
        next[i] = last[e];
        last[e] = i;
    }
    // Next use of each cached expert (usize::MAX: never again).
    let mut cached: Vec<Option<usize>> = vec![None; n_experts];
    let mut len = 0;
    let mut t = Tally::default();
    for (i, &e) in seq.iter().enumerate() {
        t.requests += 1;
        if cached[e].is_some() {
            t.hits += 1;
            cached[e] = Some(next[i]);
            continue;
        }
        if len < cap {
            cached[e] = Some(next[i]);
            len += 1;
            continue;
        }
        let (victim, far) = cached
            .iter()
            .enumerate()
            .filter_map(|(x, n)| n.map(|n| (x, n)))
            .max_by_key(|&(x, n)| (n, x))
            .expect("cache full");
        if next[i] < far {
            cached[victim] = None;
            cached[e] = Some(next[i]);
        }
    }
    t
}

/// Slots per layer out of `cap x layers` in all, split once ([`shares::split`]) from the LRU
/// stack distances of each layer's first `measure` share of batches: a shares policy that
/// knew its trace in advance, the bound for [`replay_shared`].
pub fn shares(trace: &Trace, cap: usize, measure: f64) -> BTreeMap<usize, usize> {
    let hists: Vec<Vec<u64>> = trace
        .layers
        .values()
        .map(|b| {
            let upto = ((b.len() as f64 * measure).ceil() as usize).min(b.len());
            let mut m = shares::ReuseMeter::new(trace.n_experts, CachePolicy::Lru);
            for e in b[..upto].iter().flat_map(|b| b.experts.iter()) {
                m.record(*e);
            }
            m.hist().to_vec()
        })
        .collect();
    let caps = shares::split(&hists, cap * trace.layers.len(), trace.n_experts);
    trace.layers.keys().copied().zip(caps).collect()
}

/// Every layer under `policy`, each with `cap` slots or with its [`shares`].
pub fn replay(
    trace: &Trace,
    cap: usize,
    policy: CachePolicy,
    per_layer: Option<&BTreeMap<usize, usize>>,
) -> Tally {
    let mut t = Tally::default();
    for (l, b) in &trace.layers {
        let c = per_layer.and_then(|s| s.get(l).copied()).unwrap_or(cap);
        t.add(replay_layer(b, trace.n_experts, c, policy));
    }
    t
}

pub fn belady(trace: &Trace, cap: usize) -> Tally {
    let mut t = Tally::default();
    for b in trace.layers.values() {
        t.add(belady_layer(b, trace.n_experts, cap));
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batches(seq: &[&[usize]]) -> Vec<Batch> {
        seq.iter()
            .enumerate()
            .map(|(i, s)| Batch {
                experts: s.to_vec(),
                rows: 1,
                call: i as u64,
            })
            .collect()
    }

    #[test]
    fn parses_a_route_trace_into_per_layer_batches() {
        let text = "0 0 1 3:0.5 1:0.2\n0 1 1 1:0.4 7:0.1\n0 0 2 0:1.0\n1 0 1 7:0.9 2:0.1\n";
        let t = Trace::parse(text).unwrap();
        assert_eq!(t.n_experts, 8);
        assert_eq!(
            t.layers[&1],
            vec![
                Batch {
                    experts: vec![1, 3, 7],
                    rows: 2,
                    call: 0
                },
                Batch {
                    experts: vec![2, 7],
                    rows: 1,
                    call: 1
                }
            ]
        );
        assert_eq!(t.layers[&2].len(), 1);
        assert_eq!(t.requests(), 6);
        let err = Trace::parse("0 0 x 1:0.1\n").unwrap_err();
        assert!(err.contains("line 1") && err.contains("layer"), "{err}");
    }

    #[test]
    fn lru_replay_matches_the_store_semantics() {
        // cap 2: [0 1] both miss; [1 2]: 1 hits, 2 misses and evicts 0 (oldest stamp);
        // [0]: miss, evicts 1 (stamped before 2); [2]: hit.
        let b = batches(&[&[0, 1], &[1, 2], &[0], &[2]]);
        let t = replay_layer(&b, 4, 2, CachePolicy::Lru);
        assert_eq!(
            t,
            Tally {
                hits: 2,
                requests: 6
            }
        );
    }

    #[test]
    fn belady_is_the_textbook_optimum() {
        // The classic 3-frame example (Silberschatz): 7 0 1 2 0 3 0 4 2 3 0 3 2 1 2 0 1 7 0 1
        // has 9 page faults under OPT without bypass; bypass can only do as well or better.
        let seq = [7, 0, 1, 2, 0, 3, 0, 4, 2, 3, 0, 3, 2, 1, 2, 0, 1, 7, 0, 1];
        let b: Vec<Batch> = seq
            .iter()
            .enumerate()
            .map(|(i, &e)| Batch {
                experts: vec![e],
                rows: 1,
                call: i as u64,
            })
            .collect();
        let t = belady_layer(&b, 8, 3);
        assert_eq!(t.requests, 20);
        assert!(20 - t.hits <= 9, "{} misses", 20 - t.hits);
        // Never worse than any online policy on the same trace.
        for p in CachePolicy::ALL {
            assert!(replay_layer(&b, 8, 3, p).hits <= t.hits, "{p:?}");
        }
        // A cache as big as the working set misses only first uses.
        assert_eq!(belady_layer(&b, 8, 8).hits, 20 - 6);
    }

    #[test]
    fn frequency_aware_policy_survives_a_scan() {
        // Experts 0 and 1 are used all the time; a long prefill sweeps 2..8 once.
        let mut seq: Vec<Vec<usize>> = Vec::new();
        for _ in 0..20 {
            seq.push(vec![0, 1]);
        }
        let mut b: Vec<Batch> = seq
            .iter()
            .enumerate()
            .map(|(i, s)| Batch {
                experts: s.clone(),
                rows: 1,
                call: i as u64,
            })
            .collect();
        b.push(Batch {
            experts: (2..8).collect(),
            rows: 32,
            call: 20,
        });
        for i in 0..20 {
            b.push(Batch {
                experts: vec![0, 1],
                rows: 1,
                call: 21 + i,
            });
        }
        let lru = replay_layer(&b, 8, 2, CachePolicy::Lru);
        let lfu = replay_layer(&b, 8, 2, CachePolicy::Lfu);
        // LRU loses 0 and 1 to the scan and misses them once more; LFU keeps them.
        assert_eq!(lfu.hits, lru.hits + 2);
        assert_eq!(lfu.hits, belady_layer(&b, 8, 2).hits);
    }

    #[test]
    fn shares_follow_measured_reuse() {
        // Layer 1 cycles over 4 experts (needs 4 slots to hit), layer 2 reuses one expert.
        let mut t = Trace {
            n_experts: 8,
            ..Trace::default()
        };
        let cycle: [&[usize]; 4] = [&[0], &[1], &[2], &[3]];
        t.layers.insert(1, batches(&cycle.repeat(10)));
        let one: [&[usize]; 1] = [&[5]];
        t.layers.insert(2, batches(&one.repeat(40)));
        let s = shares(&t, 3, 1.0);
        assert_eq!(s[&1] + s[&2], 6);
        // Layer 1 gets the 4 its cycle needs; the slot left over goes to the other.
        assert_eq!((s[&1], s[&2]), (4, 2));
        let flat = replay(&t, 3, CachePolicy::Lru, None);
        let shared = replay(&t, 3, CachePolicy::Lru, Some(&s));
        assert!(shared.hits > flat.hits, "{shared:?} vs {flat:?}");
        // Measured at runtime, splitting every 4 requests per layer: the cycle is found after
        // its first turns and hits from then on.
        for p in CachePolicy::ALL {
            let online = replay_shared(&t, 3, p, 4);
            assert_eq!(online.requests, flat.requests);
            assert!(
                online.hits > flat.hits + 20,
                "{p:?}: {online:?} vs {flat:?}"
            );
            // Never re-split, it is the flat cache call for call.
            assert_eq!(
                replay_shared(&t, 3, p, u64::MAX / 4),
                replay(&t, 3, p, None)
            );
        }
    }

    #[test]
    fn the_online_bounds_sit_under_belady() {
        let mut t = Trace {
            n_experts: 8,
            ..Trace::default()
        };
        let seq: [&[usize]; 6] = [&[0, 1], &[2, 3], &[0, 4], &[5, 1], &[0, 6], &[7, 2]];
        t.layers.insert(1, batches(&seq.repeat(5)));
        for cap in 1..8 {
            let opt = belady(&t, cap);
            // Expert 0 is in half the batches: kept alone it hits 15 of 60 requests.
            assert!(
                static_best(&t, cap).hits <= opt.hits + cap as u64,
                "cap {cap}"
            );
            assert_eq!(belady_shuffled(&t, cap).requests, opt.requests);
        }
        assert_eq!(
            static_best(&t, 1),
            Tally {
                hits: 15,
                requests: 60
            }
        );
    }
}
