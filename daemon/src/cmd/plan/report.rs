//! `plan`'s two outputs: the text table and the `--json` object (CONTRACT §9 names its keys).

use super::{Budget, Move, Prediction, Probes, Routing, Subject, TTFT_PROMPT};

pub(super) fn gb(n: u64) -> String {
    format!("{:.2} GB", n as f64 / 1e9)
}

pub(super) fn text(
    s: &Subject,
    probes: &Probes,
    budget: &Budget,
    routing: &Routing,
    p: &Prediction,
    moves: &[Move],
) -> String {
    let sp = &p.split;
    let mut t = String::new();
    let mut line = |k: &str, v: String| t.push_str(&format!("{k:<13}{v}\n"));
    line("model", format!("{} ({})", s.name, s.shape.family));
    line(
        "parameters",
        format!(
            "{:.1}B ({:.1}B active per token)",
            s.shape.params as f64 / 1e9,
            s.shape.active as f64 / 1e9
        ),
    );
    line(
        "formats",
        format!("experts {}, dense {}", s.formats.0, s.formats.1),
    );
    line(
        "disk",
        format!(
            "{} ({} experts/layer x {} layers, {:.1} MB each)",
            gb(s.sizes.disk),
            s.shape.experts,
            s.shape.sparse_layers,
            s.sizes.expert_disk as f64 / 1e6
        ),
    );
    line(
        "ram budget",
        format!(
            "{}: dense {}, KV {} ({} per 1k tokens x {} slot(s), ctx {}), reserve {}, working set {}, experts {} ({} of {} per layer{})",
            gb(sp.budget),
            gb(sp.dense),
            gb(sp.kv + sp.kvb),
            gb(sp.kv_per_1k),
            budget.kv_slots,
            budget.ctx,
            gb(sp.reserve),
            gb(sp.working_set),
            gb(sp.expert_ram_bytes),
            sp.experts_in_ram,
            s.shape.experts,
            if sp.experts_in_vram > 0 {
                format!(", {} more in VRAM", sp.experts_in_vram)
            } else {
                String::new()
            }
        ),
    );
    line(
        "probes",
        format!(
            "disk {:.2} GB/s ({}); memory {:.1} GB/s ({}); prefill {:.1} GMAC/s ({})",
            probes.disk_gbs,
            probes.disk_how,
            probes.mem_gbs,
            probes.mem_how,
            probes.prefill_gmacs,
            probes.prefill_how
        ),
    );
    line("routing", routing.describe());
    if !p.fits {
        line(
            "fits",
            format!(
                "no: the dense part, KV and reserve leave no room for one expert per layer in {}",
                gb(sp.budget)
            ),
        );
    } else {
        line(
            "decode",
            format!(
                "{:.2} tok/s cold, {:.2} tok/s warm (hit rate {:.1}%, {:.1} MB read from disk per token warm, {:.1} MB cold)",
                p.decode_tok_s,
                p.warm_decode_tok_s,
                p.hit_rate * 100.0,
                p.disk_bytes_per_token as f64 / 1e6,
                p.cold_disk_bytes_per_token as f64 / 1e6
            ),
        );
        line(
            "first token",
            format!(
                "{:.1} s for a {TTFT_PROMPT}-token prompt, cold ({} binds)",
                p.ttft_s, p.prefill_limit
            ),
        );
    }
    line("limit", p.limit.to_string());
    for m in moves {
        line(
            "would move",
            format!("{}: {:.2} tok/s warm", m.what, m.decode_tok_s),
        );
    }
    t
}

pub(super) fn json(
    s: &Subject,
    probes: &Probes,
    budget: &Budget,
    routing: &Routing,
    p: &Prediction,
    moves: &[Move],
) -> serde_json::Value {
    let sp = &p.split;
    serde_json::json!({
        "model": s.name,
        "family": s.shape.family,
        "params": s.shape.params,
        "active": s.shape.active,
        "expert_format": s.formats.0,
        "dense_format": s.formats.1,
        "disk_bytes": s.sizes.disk,
        "expert_bytes": s.sizes.expert_disk,
        "experts_per_layer": s.shape.experts,
        "sparse_layers": s.shape.sparse_layers,
        "ctx": budget.ctx,
        "kv_slots": budget.kv_slots,
        "ram": {
            "budget_bytes": sp.budget,
            "dense_bytes": sp.dense,
            "kv_bytes": sp.kv + sp.kvb,
            "kv_bytes_per_1k_tokens_per_slot": sp.kv_per_1k,
            "reserve_bytes": sp.reserve,
            "working_set_bytes": sp.working_set,
            "expert_bytes": sp.expert_ram_bytes,
            "experts_in_ram_per_layer": sp.experts_in_ram,
            "experts_in_vram_per_layer": sp.experts_in_vram,
        },
        "probes": {
            "disk_gb_s": probes.disk_gbs,
            "disk": probes.disk_how,
            "memory_gb_s": probes.mem_gbs,
            "memory": probes.mem_how,
            "prefill_gmac_s": probes.prefill_gmacs,
            "prefill": probes.prefill_how,
        },
        "routing": routing.describe(),
        "fits": p.fits,
        "predicted": {
            "decode_tok_s": p.decode_tok_s,
            "warm": {
                "decode_tok_s": p.warm_decode_tok_s,
                "hit_rate": p.hit_rate,
                "disk_bytes_per_token": p.disk_bytes_per_token,
            },
            "bytes_per_token": p.bytes_per_token,
            "disk_bytes_per_token": p.cold_disk_bytes_per_token,
            "ttft_s": p.ttft_s,
            "ttft_prompt_tokens": TTFT_PROMPT,
            "limit": p.limit,
            "prefill_limit": p.prefill_limit,
        },
        "would_move": moves.iter().map(|m| serde_json::json!({
            "what": m.what,
            "warm_decode_tok_s": m.decode_tok_s,
        })).collect::<Vec<_>>(),
    })
}
