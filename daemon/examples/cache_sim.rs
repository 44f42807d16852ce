//! Hit rate of every `--cache-policy` against Belady's optimum on route traces.
//!
//! ```text
//! colibri run ... --route-trace demo.trace
//! cargo run --release -p colibri --example cache_sim -- demo.trace [more.trace ...] [--caps 4,8,16]
//! ```
//!
//! Several traces are replayed back to back, as one session after another. One line per
//! (capacity, policy): hit rate and its ratio to Belady's at the same capacity; `+shares` is the
//! policy with per-layer capacities set from the first half's measured reuse (same total),
//! also given against Belady with those same per-layer capacities (`belady+shares`).

use colibri::experts::policy::CachePolicy;
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
        println!("cap {cap:>3}: belady {:.4}", opt.rate());
        let shares = sim::shares(&trace, cap, 0.5);
        // Belady with the same per-layer slots: the bound a shares policy is held to.
        let mut opt_shared = sim::Tally::default();
        for (l, b) in &trace.layers {
            opt_shared.add(sim::belady_layer(b, trace.n_experts, shares[l]));
        }
        println!("cap {cap:>3}: belady+shares {:.4}", opt_shared.rate());
        for p in CachePolicy::ALL {
            for (tag, s) in [("", None), ("+shares", Some(&shares))] {
                let t = sim::replay(&trace, cap, p, s);
                println!(
                    "cap {cap:>3}: {:<12} {:.4}  {:.3} of belady  {:.3} of belady+shares",
                    format!("{}{tag}", p.name()),
                    t.rate(),
                    t.rate() / opt.rate().max(1e-12),
                    t.rate() / opt_shared.rate().max(1e-12)
                );
            }
        }
    }
}
