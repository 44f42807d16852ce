//! Hit rate of every `--cache-policy` against Belady's optimum on route traces.
//!
//! ```text
//! colibri run ... --route-trace demo.trace
//! cargo run --release -p colibri --example cache_sim -- demo.trace [more.trace ...] [--caps 4,8,16]
//! ```
//!
//! Several traces are replayed back to back, as one session after another. One line per
//! (capacity, policy): hit rate and its ratio to Belady's at the same capacity.
//! `+shares` is the policy with runtime per-layer shares (`--cache-shares`, re-split from the
//! measured reuse as the store does it); `+hindsight` splits once from the first half's reuse
//! (same total), given also against Belady with those per-layer capacities (`belady+shares`).
//! The `shuffled` figures are the ceiling for foresight-free policies: Belady on the same
//! requests in random order, and the `cap` most used experts kept from the start. Where
//! Belady barely drops when shuffled, its lead over every online policy is foresight, not
//! structure a policy could learn.

use colibri::experts::policy::CachePolicy;
use colibri::experts::shares::RESPLIT_EVERY;
use colibri::experts::sim::{self, Trace};

fn main() {
    let mut paths = Vec::new();
    let mut caps = vec![4usize, 6, 8, 12, 16];
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--caps" {
            let v = args.next().unwrap_or_default();
            caps = match v.split(',').map(|c| c.trim().parse()).collect() {
                Ok(c) => c,
                Err(_) => {
                    eprintln!("--caps {v:?}: expected numbers separated by commas");
                    std::process::exit(2);
                }
            };
        } else {
            paths.push(a);
        }
    }
    if paths.is_empty() {
        eprintln!("usage: cache_sim TRACE [TRACE ...] [--caps 4,8,16]");
        std::process::exit(2);
    }
    let mut text = String::new();
    for (i, p) in paths.iter().enumerate() {
        match std::fs::read_to_string(p) {
            // Later traces' calls are renumbered after the earlier ones so batches stay apart.
            Ok(t) => {
                for line in t.lines() {
                    if let Some((call, rest)) = line.split_once(' ') {
                        let call: u64 = call.parse().unwrap_or(0);
                        text.push_str(&format!("{} {rest}\n", call + (i as u64) * 1_000_000_000));
                    }
                }
            }
            Err(e) => {
                eprintln!("{p}: {e}");
                std::process::exit(2);
            }
        }
    }
    let trace = match Trace::parse(&text) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    println!(
        "trace: {} layers x {} experts, {} requests",
        trace.layers.len(),
        trace.n_experts,
        trace.requests()
    );
    for &cap in &caps {
        let opt = sim::belady(&trace, cap);
        let shuffled = sim::belady_shuffled(&trace, cap);
        let fixed = sim::static_best(&trace, cap);
        println!(
            "cap {cap:>3}: belady {:.4} | same requests shuffled: belady {:.4}, top-{cap} kept {:.4} ({:.3} of belady)",
            opt.rate(),
            shuffled.rate(),
            fixed.rate(),
            fixed.rate() / opt.rate().max(1e-12),
        );
        let shares = sim::shares(&trace, cap, 0.5);
        // Belady with the same per-layer slots: the bound a shares policy is held to.
        let mut opt_shared = sim::Tally::default();
        for (l, b) in &trace.layers {
            opt_shared.add(sim::belady_layer(b, trace.n_experts, shares[l]));
        }
        println!("cap {cap:>3}: belady+shares {:.4}", opt_shared.rate());
        for p in CachePolicy::ALL {
            let runs = [
                ("", sim::replay(&trace, cap, p, None)),
                ("+shares", sim::replay_shared(&trace, cap, p, RESPLIT_EVERY)),
                ("+hindsight", sim::replay(&trace, cap, p, Some(&shares))),
            ];
            for (tag, t) in runs {
                println!(
                    "cap {cap:>3}: {:<15} {:.4}  {:.3} of belady  {:.3} of belady+shares",
                    format!("{}{tag}", p.name()),
                    t.rate(),
                    t.rate() / opt.rate().max(1e-12),
                    t.rate() / opt_shared.rate().max(1e-12)
                );
            }
        }
    }
}
