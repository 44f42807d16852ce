//! `kernels attn`'s prefill rows: grouped-query attention's quadratic part at prefill shapes
//! and at one row (a decode step), the shared core (`model::attn_core`, what `gqa.rs` and the
//! plan's probe run) beside the loop it replaced (one query head and row at a time, one key a
//! call), on the same inputs in the same run, a chunk's rows across the threads as the model
//! runs them (a decode row on the calling thread), the outputs compared bit for bit. Reported
//! in multiply-adds (scores and values) per second.

use std::time::Instant;

use colibri::model::attn_core::{Attend, AttnShape, Visible};
use colibri::model::ops::{axpy, dot, softmax};
use colibri::quant::par_chunks_mut;

/// The loop `gqa.rs` ran before the shared core: each row (across the threads), each head,
/// its scores key by key, the softmax, then `axpy` of every value in key order.
fn one_query_at_a_time(a: &Attend, out: &mut [f32]) {
    let AttnShape {
        heads,
        kv_heads,
        head_dim: hd,
        scale,
    } = a.shape;
    let (qw, kw, group) = (heads * hd, kv_heads * hd, heads / kv_heads);
    let rows = out.len() / qw;
    par_chunks_mut(out, qw, rows, |s, o| {
        let mut scores = Vec::new();
        let keys = a.visible.keys(s);
        for h in 0..heads {
            let kvh = h / group;
            let qh = &a.q[s * qw + h * hd..][..hd];
            scores.clear();
            scores.extend(
                keys.clone()
                    .map(|t| dot(qh, &a.k[t * kw + kvh * hd..][..hd]) * scale),
            );
            softmax(&mut scores);
            let oh = &mut o[h * hd..][..hd];
            oh.fill(0.0);
            for (p, t) in scores.iter().zip(keys.clone()) {
                axpy(oh, *p, &a.v[t * kw + kvh * hd..][..hd]);
            }
        }
    });
}

fn best_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::MAX, f64::min)
}

/// The table: the last `rows` positions of a `ctx`-position prompt (causal), at Qwen3-30B's
/// heads (32 on 4 of 128), the GGUF bench model's (qwen3_moe 12x64: 16 on 4 of 128) and a
/// small model's (16 on 2 of 64).
pub fn prefill_table() {
    println!(
        "attention's quadratic part, prefill (the last rows of a prompt of ctx positions), {} threads:",
        rayon::current_num_threads()
    );
    println!(
        "  {:>9} {:>4} {:>5} {:>5}  {:>12} {:>12} {:>6} {:>12} {:>6}",
        "heads", "rows", "ctx", "", "loop GMAC/s", "core GMAC/s", "ratio", "by-row GMAC/s", "cols"
    );
    let mut x = colibri::rng::XorShift64(0xa77e_5eed);
    let mut values = |n: usize| (0..n).map(|_| x.unit_f32() - 0.5).collect::<Vec<f32>>();
    for (heads, kv_heads, hd) in [(32, 4, 128), (16, 4, 128), (16, 2, 64)] {
        // One row is a decode step: it runs on the calling thread (`Attend::run`).
        for rows in [1, 64, 512] {
            for ctx in [512, 1000, 4096] {
                let (qw, kw) = (heads * hd, kv_heads * hd);
                let q = values(rows * qw);
                let k = values(ctx * kw);
                let v = values(ctx * kw);
                let a = Attend {
                    shape: AttnShape {
                        heads,
                        kv_heads,
                        head_dim: hd,
                        scale: (hd as f32).powf(-0.5),
                    },
                    q: &q,
                    k: &k,
                    v: &v,
                    visible: Visible {
                        pos0: ctx.saturating_sub(rows),
                        window: None,
                    },
                    sinks: None,
                };
                let rows = rows.min(ctx);
                let keys: usize = (0..rows).map(|s| a.visible.keys(s).len()).sum();
                let macs = (keys * heads * 2 * hd) as f64;
                let reps = ((20e9 / macs) as usize).clamp(2, 200);
                let mut want = vec![0f32; rows * qw];
                let mut got = vec![0f32; rows * qw];
                let old = best_secs(reps, || one_query_at_a_time(&a, &mut want));
                let mut probs = Vec::new();
                let new = best_secs(reps, || match rows {
                    1 => a.run(&mut got, &mut probs),
                    _ => a.run_par(&mut got),
                });
                let same = want
                    .iter()
                    .zip(&got)
                    .all(|(w, g)| w.to_bits() == g.to_bits());
                assert!(same, "the core's outputs differ from the loop's");
                // The same tiles with every key scored from the cache's rows (what the core
                // runs below 16 rows or without the column kernel), timed beside it.
                let by_row = match rows {
                    1 => new,
                    _ => {
                        let t = best_secs(reps, || a.run_par_by_row(&mut got));
                        let same = want
                            .iter()
                            .zip(&got)
                            .all(|(w, g)| w.to_bits() == g.to_bits());
                        assert!(same, "the by-row core's outputs differ from the loop's");
                        t
                    }
                };
                println!(
                    "  {:>9} {rows:>4} {ctx:>5} {:>5}  {:>12.2} {:>12.2} {:>5.2}x {:>12.2} {:>5.2}x",
                    format!("{heads}/{kv_heads}x{hd}"),
                    "",
                    macs / old / 1e9,
                    macs / new / 1e9,
                    old / new,
                    macs / by_row / 1e9,
                    by_row / new
                );
            }
        }
    }
}
