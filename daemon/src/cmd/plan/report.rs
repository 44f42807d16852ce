//! `plan`'s two outputs: the text table and the `--json` object (CONTRACT §9 names its keys).

use super::{Budget, Move, Prediction, Probes, Routing, Subject, Window, TTFT_PROMPT};

pub(super) fn gb(n: u64) -> String {
    format!("{:.2} GB", n as f64 / 1e9)
}

pub(super) fn text(
    s: &Subject,
    probes: &Probes,
    budget: &Budget,
    routing: &Routing,
    reads: &str,
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
            "disk {:.2} GB/s ({}); memory {:.1} GB/s ({}); page-cache copies {:.1} GB/s ({}); \
             dense decode {:.1} GB/s ({}); expert decode {:.1} GB/s ({}); \
             prefill {:.1} GMAC/s ({}); experts {:.1} GMAC/s ({}); attention {:.1} GMAC/s ({})",
            probes.disk_gbs,
            probes.disk_how,
            probes.mem_gbs,
            probes.mem_how,
            probes.copy_gbs,
            probes.copy_how,
            probes.dense_gbs,
            probes.dense_how,
            probes.expert_decode_gbs,
            probes.expert_decode_how,
            probes.prefill_gmacs,
            probes.prefill_how,
            probes.expert_gmacs,
            probes.expert_how,
            probes.attention_gmacs,
            probes.attention_how
        ),
    );
    line("routing", routing.describe());
    line("reads", reads.to_string());
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
        line("page cache", page_cache_line(budget, probes, p));
        line(
            "first token",
            format!(
                "{:.1} s for a {TTFT_PROMPT}-token prompt in chunks of {}, cold ({} binds): \
                 experts {:.1} s, other matrices {:.1} s, attention {:.1} s{}, reads {:.1} s \
                 ({} of experts){}",
                p.ttft_s,
                p.prefill_chunk,
                p.prefill_limit,
                p.ttft.expert_s,
                p.ttft.dense_s,
                p.ttft.attention_s,
                rebuild_share(&p.ttft),
                p.ttft.read_s,
                gb(p.ttft.read_bytes as u64),
                if p.ttft.copy_s > 0.0 {
                    format!(", copies {:.1} s on the cores", p.ttft.copy_s)
                } else {
                    String::new()
                }
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

/// The `page cache` line: what it holds of the experts beside ours and its share of the
/// loads, warm and in the first token.
fn page_cache_line(budget: &Budget, probes: &Probes, p: &Prediction) -> String {
    if budget.page_cache == 0 {
        return "none counted: every load our cache misses is read from disk".into();
    }
    format!(
        "room {} holds {} more experts a layer: {:.1}% of our cache's misses warm ({:.1} MB a \
         token copied at {:.1} GB/s, the copy probe), {:.1}% of the first token's loads \
         ({} of {}); each expert's first read from disk",
        gb(budget.page_cache),
        p.page_cache_experts,
        p.page_cache_share * 100.0,
        p.page_cache_bytes_per_token as f64 / 1e6,
        probes.copy_gbs,
        if p.ttft.read_bytes > 0.0 {
            100.0 * p.ttft.page_cache_bytes / p.ttft.read_bytes
        } else {
            0.0
        },
        gb(p.ttft.page_cache_bytes as u64),
        gb(p.ttft.read_bytes as u64)
    )
}

/// A cold window's figures in the JSON.
pub(super) fn window_json(tokens: usize, w: &Window) -> serde_json::Value {
    serde_json::json!({
        "tokens": tokens,
        "decode_tok_s": w.tok_s,
        "disk_bytes_per_token": w.disk_bytes as u64,
        "page_cache_bytes_per_token": w.page_cache_bytes as u64,
    })
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
            "copy_gb_s": probes.copy_gbs,
            "copy": probes.copy_how,
            "dense_decode_gb_s": probes.dense_gbs,
            "dense_decode": probes.dense_how,
            "expert_decode_gb_s": probes.expert_decode_gbs,
            "expert_decode": probes.expert_decode_how,
            "prefill_gmac_s": probes.prefill_gmacs,
            "prefill": probes.prefill_how,
            "expert_gmac_s": probes.expert_gmacs,
            "expert": probes.expert_how,
            "attention_gmac_s": probes.attention_gmacs,
            "attention": probes.attention_how,
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
            "page_cache": {
                "room_bytes": budget.page_cache,
                "experts_per_layer": p.page_cache_experts,
                "share_of_misses_warm": p.page_cache_share,
                "bytes_per_token_warm": p.page_cache_bytes_per_token,
                "copy_gb_s": probes.copy_gbs,
                "ttft_bytes": p.ttft.page_cache_bytes,
            },
            "bytes_per_token": p.bytes_per_token,
            "disk_bytes_per_token": p.cold_disk_bytes_per_token,
            "ttft_s": p.ttft_s,
            "ttft_terms": {
                "expert_s": p.ttft.expert_s,
                "dense_s": p.ttft.dense_s,
                "attention_s": p.ttft.attention_s,
                "attention_pair_macs": p.ttft.attention_pair_macs,
                "attention_rebuild_macs": p.ttft.attention_rebuild_macs,
                "read_s": p.ttft.read_s,
                "copy_s": p.ttft.copy_s,
                "read_bytes": p.ttft.read_bytes,
                "page_cache_bytes": p.ttft.page_cache_bytes,
                "experts_and_reads_s": p.ttft.moe_s,
            },
            "ttft_prompt_tokens": TTFT_PROMPT,
            "prefill_chunk": p.prefill_chunk,
            "limit": p.limit,
            "prefill_limit": p.prefill_limit,
        },
        "would_move": moves.iter().map(|m| serde_json::json!({
            "what": m.what,
            "warm_decode_tok_s": m.decode_tok_s,
        })).collect::<Vec<_>>(),
    })
}

/// What `--measure` ran on: the model written (or reused).
pub(super) fn model_text(m: &super::MeasureModel) -> String {
    let how = match &m.written {
        Some(w) => format!(
            "written in {:.1} s ({:.2} GB/s)",
            w.secs,
            w.bytes as f64 / 1e9 / w.secs.max(1e-9)
        ),
        None => "reused (written by an earlier --measure)".into(),
    };
    format!(
        "{:<13}{} ({}, {} layers, router skew {}), {how}\n",
        "measure",
        m.dir.display(),
        gb(m.bytes),
        m.layers,
        m.skew.map_or(
            "none: a softmax router has no bias to skew".into(),
            |s| format!("{s}")
        ),
    )
}

pub(super) fn model_json(m: &super::MeasureModel) -> serde_json::Value {
    serde_json::json!({
        "dir": m.dir.display().to_string(),
        "bytes": m.bytes,
        "layers": m.layers,
        // The f32 as written (0.08, not 0.07999999821186066).
        "skew": m.skew.map(|s| s.to_string().parse::<f64>().unwrap_or(s as f64)),
        "reused": m.written.is_none(),
        "write_s": m.written.map(|w| w.secs),
    })
}

/// The disk bound of decode: the probe's GB/s over the expert bytes read per token.
fn disk_bound(probes: &Probes, mb_per_token: f64) -> Option<f64> {
    (mb_per_token > 0.0).then(|| probes.disk_gbs * 1e3 / mb_per_token)
}

/// A run's decode against the disk bound of the bytes the device delivered to it (none where
/// it read nothing from the device or the kernel did not count).
fn of_device_bound(probes: &Probes, r: &super::measure::Run) -> Option<f64> {
    let bound = disk_bound(probes, r.device_mb_per_token?)?;
    Some(r.decode_tok_s / bound)
}

/// Predicted beside measured, one figure a line; with `routed` (the same prediction with the
/// cold run's own routing, when it wrote its selections) a column for it.
pub(super) fn measured_text(
    probes: &Probes,
    budget: &Budget,
    (p, window): (&Prediction, Window),
    routed: Option<&(Prediction, Window)>,
    m: &super::measure::Measured,
) -> String {
    let mut t = format!(
        "\n{:<34}{:>14}{:>14}{:>14}   (load {}{}{})\n",
        "figure",
        "predicted",
        "its routing",
        "measured",
        m.load,
        m.cgroup_bytes
            .map(|b| format!(", memory cgroup {}", gb(b)))
            .unwrap_or_default(),
        if m.cold.reads.is_empty() {
            String::new()
        } else {
            format!(", reads {}", m.cold.reads)
        }
    );
    // A figure predicted both ways: `f` of the prediction and its cold window.
    let both = |f: &dyn Fn(&Prediction, &Window) -> String| {
        (
            f(p, &window),
            routed.map_or("-".to_string(), |(q, w)| f(q, w)),
        )
    };
    let mut row = |k: &str, (pred, routed): (String, String), meas: String| {
        t.push_str(&format!("{k:<34}{pred:>14}{routed:>14}{meas:>14}\n"));
    };
    let none = || ("-".to_string(), "-".to_string());
    let fails = |r: &super::measure::Run, v: String| match &r.failed {
        Some(_) => "failed".to_string(),
        None => v,
    };
    row(
        "READY, first start (s)",
        none(),
        fails(&m.cold, format!("{:.1}", m.cold.ready_s)),
    );
    row(
        "READY, fingerprint cached (s)",
        none(),
        fails(&m.first, format!("{:.1}", m.first.ready_s)),
    );
    row(
        &format!("first token, {TTFT_PROMPT}-token prompt (s)"),
        both(&|q, _| format!("{:.1}", q.ttft_s)),
        fails(&m.first, format!("{:.1}", m.ttft_s())),
    );
    row(
        "expert GB read by that prefill",
        both(&|q, _| format!("{:.1}", q.ttft.read_bytes / 1e9)),
        fails(&m.first, format!("{:.1}", m.first.prefill_mb_read / 1e3)),
    );
    row(
        "decode, first token cold (tok/s)",
        both(&|q, _| format!("{:.2}", q.decode_tok_s)),
        "-".into(),
    );
    row(
        &format!("decode cold, {} tokens (tok/s)", m.tokens),
        both(&|_, w| format!("{:.2}", w.tok_s)),
        fails(&m.cold, format!("{:.2}", m.cold.decode_tok_s)),
    );
    row(
        "decode warm (tok/s)",
        both(&|q, _| format!("{:.2}", q.warm_decode_tok_s)),
        fails(&m.warm, format!("{:.2}", m.warm.decode_tok_s)),
    );
    // The engine counts every load, from disk or the page cache alike.
    row(
        &format!("expert MB read per token, {} cold", m.tokens),
        both(&|_, w| format!("{:.1}", w.loaded_bytes() / 1e6)),
        fails(&m.cold, format!("{:.1}", m.cold.mb_read_per_token)),
    );
    row(
        "expert MB read per token, warm",
        both(&|q, _| {
            let loaded = q.disk_bytes_per_token + q.page_cache_bytes_per_token;
            format!("{:.1}", loaded as f64 / 1e6)
        }),
        fails(&m.warm, format!("{:.1}", m.warm.mb_read_per_token)),
    );
    // What the device delivered, counted by the kernel for each child (the rest of its reads
    // the page cache served).
    let device = |r: &super::measure::Run| {
        fails(
            r,
            r.device_mb_per_token
                .map_or("-".into(), |d| format!("{d:.1}")),
        )
    };
    if budget.page_cache > 0 {
        row(
            &format!("of those from disk, {} cold", m.tokens),
            both(&|_, w| format!("{:.1}", w.disk_bytes / 1e6)),
            device(&m.cold),
        );
        row(
            "of those from disk, warm",
            both(&|q, _| format!("{:.1}", q.disk_bytes_per_token as f64 / 1e6)),
            device(&m.warm),
        );
    }
    row(
        "hit rate, warm (%)",
        both(&|q, _| format!("{:.1}", q.hit_rate * 100.0)),
        fails(&m.warm, format!("{:.1}", m.warm.hit_pct)),
    );
    row(
        "disk GB/s while decoding cold",
        (format!("{:.2} probe", probes.disk_gbs), "-".into()),
        fails(&m.cold, format!("{:.2}", m.cold.disk_gb_s())),
    );
    if let Some(d) = m.cold.device_gb_s().filter(|_| m.cold.failed.is_none()) {
        row("  of which the device delivered", none(), format!("{d:.2}"));
    }
    // Where a warm token's load time went: on an I/O thread per load, and how long the
    // products waited for them.
    if let (Some(l), None) = (m.warm.load_ms, &m.warm.failed) {
        row(
            "a load on its thread, warm (ms)",
            none(),
            format!("{:.2}", l.each),
        );
        row("  its read (ms)", none(), format!("{:.2}", l.read));
        row("  its checks (ms)", none(), format!("{:.2}", l.check));
        row(
            "  its matrices built (ms)",
            none(),
            format!("{:.2}", l.build),
        );
    }
    if let (Some(w), None) = (m.warm.wait_ms_per_token, &m.warm.failed) {
        row(
            "products waited, warm (ms/token)",
            none(),
            format!("{w:.1}"),
        );
    }
    // The pilot's row counts every byte it read (guesses in time, late and unused beside the
    // demand loads): with reads in flight ahead of their layer it may pass the probe's rate.
    for (name, r) in [
        ("cold", &m.cold),
        ("warm", &m.warm),
        ("cold with --pilot", &m.pilot),
    ] {
        if let (Some(bound), None) = (disk_bound(probes, r.mb_read_per_token), &r.failed) {
            row(
                &format!("decode {name} / disk bound"),
                (format!("{bound:.2} tok/s"), "-".into()),
                format!("{:.2}", r.decode_tok_s / bound),
            );
        }
    }
    // The same bound over the bytes the device delivered (the kernel's count): what the disk
    // alone allows once the page cache's share is taken out.
    for (name, r) in [
        ("cold", &m.cold),
        ("warm", &m.warm),
        ("cold with --pilot", &m.pilot),
    ] {
        let device = r.device_mb_per_token.and_then(|mb| disk_bound(probes, mb));
        if let (Some(bound), None) = (device, &r.failed) {
            row(
                &format!("decode {name} / device bound"),
                (format!("{bound:.2} tok/s"), "-".into()),
                format!("{:.2}", r.decode_tok_s / bound),
            );
        }
    }
    row(
        &format!("decode cold with --pilot, {} (tok/s)", m.tokens),
        none(),
        fails(&m.pilot, format!("{:.2}", m.pilot.decode_tok_s)),
    );
    if let (Some((t_mb, late, unused)), None) = (m.pilot.prefetch_mb, &m.pilot.failed) {
        row("prefetched MB/token: in time", none(), format!("{t_mb:.1}"));
        row("prefetched MB/token: late", none(), format!("{late:.1}"));
        row(
            "prefetched MB/token: never used",
            none(),
            format!("{unused:.1}"),
        );
        row(
            "expert MB read per token, pilot",
            none(),
            format!("{:.1}", m.pilot.mb_read_per_token),
        );
        // The figure: how much of what was read left the stall path, not only the
        // hit rate (every byte read, the pilot's and the demand loads', counts).
        if m.pilot.mb_read_per_token > 0.0 {
            row(
                "of those, read ahead in time (%)",
                none(),
                format!("{:.1}", 100.0 * t_mb / m.pilot.mb_read_per_token),
            );
        }
    }
    row(
        "experts held per layer",
        (m.planned_per_layer.to_string(), "-".into()),
        fails(
            &m.cold,
            m.cold
                .experts_per_layer
                .map_or("?".into(), |n| n.to_string()),
        ),
    );
    row(
        "peak RSS (GB) vs the budget",
        (format!("{:.2}", budget.ram as f64 / 1e9), "-".into()),
        format!("{:.2}", m.peak_rss() as f64 / 1e9),
    );
    for (name, r) in [
        ("cold", &m.cold),
        ("first token", &m.first),
        ("warm", &m.warm),
        ("pilot", &m.pilot),
    ] {
        if let Some(why) = &r.failed {
            t.push_str(&format!("the {name} run failed: {why}\n"));
        }
    }
    for (name, held) in m.held_apart() {
        t.push_str(&format!(
            "the {name} run held {} experts per layer, not the plan's {}\n",
            held.map_or("an unknown number of".into(), |n| n.to_string()),
            m.planned_per_layer
        ));
    }
    t
}

/// CONTRACT §9's keys: `measured.decode_tok_s` (cold), `measured.warm.decode_tok_s`,
/// `measured.bytes_per_token` (expert bytes read per token, cold), `measured.disk_gb_s`,
/// `measured.ready_s`.
pub(super) fn measured_json(
    probes: &Probes,
    budget: &Budget,
    m: &super::measure::Measured,
) -> serde_json::Value {
    let run = |r: &super::measure::Run| {
        serde_json::json!({
            "ready_s": r.ready_s,
            "prefill_positions": r.prefill_positions,
            "prefill_s": r.prefill_s,
            "prefill_bytes_read": (r.prefill_mb_read * 1e6) as u64,
            "decode_steps": r.decode_steps,
            "decode_s": r.decode_s,
            "decode_tok_s": r.decode_tok_s,
            "hit_pct": r.hit_pct,
            "expert_loads_per_token": r.expert_loads_per_token,
            "bytes_per_token": (r.mb_read_per_token * 1e6) as u64,
            "peak_rss_bytes": r.peak_rss,
            "prefetch_mb_per_token": r.prefetch_mb.map(|(t, l, u)| serde_json::json!({
                "in_time": t,
                "late": l,
                "unused": u,
            })),
            "failed": r.failed,
            "reads": r.reads,
            "experts_per_layer": r.experts_per_layer,
            "prefill_device_bytes": r.prefill_device_mb.map(|mb| (mb * 1e6) as u64),
            "device_bytes_per_token": r.device_mb_per_token.map(|mb| (mb * 1e6) as u64),
            "load_ms": r.load_ms.map(|l| serde_json::json!({
                "each": l.each,
                "read": l.read,
                "check": l.check,
                "build": l.build,
            })),
            "wait_ms_per_token": r.wait_ms_per_token,
        })
    };
    serde_json::json!({
        "ready_s": m.cold.ready_s,
        "reads": m.cold.reads,
        "warm_ready_s": m.first.ready_s,
        "ttft_s": m.ttft_s(),
        "decode_tok_s": m.cold.decode_tok_s,
        "bytes_per_token": (m.cold.mb_read_per_token * 1e6) as u64,
        "hit_rate": m.cold.hit_pct / 100.0,
        "disk_gb_s": m.cold.disk_gb_s(),
        "device_gb_s": m.cold.device_gb_s(),
        "disk_probe_gb_s": probes.disk_gbs,
        "of_disk_bound": disk_bound(probes, m.cold.mb_read_per_token)
            .map(|b| m.cold.decode_tok_s / b),
        "of_device_bound": of_device_bound(probes, &m.cold),
        "warm": {
            "decode_tok_s": m.warm.decode_tok_s,
            "bytes_per_token": (m.warm.mb_read_per_token * 1e6) as u64,
            "hit_rate": m.warm.hit_pct / 100.0,
            "disk_gb_s": m.warm.disk_gb_s(),
            "device_gb_s": m.warm.device_gb_s(),
            "of_disk_bound": disk_bound(probes, m.warm.mb_read_per_token)
                .map(|b| m.warm.decode_tok_s / b),
            "of_device_bound": of_device_bound(probes, &m.warm),
        },
        "peak_rss_bytes": m.peak_rss(),
        "budget_bytes": budget.ram,
        "cgroup_bytes": m.cgroup_bytes,
        "load": m.load,
        "experts_per_layer": {
            "planned": m.planned_per_layer,
            "cold": m.cold.experts_per_layer,
            "first_token": m.first.experts_per_layer,
            "warm": m.warm.experts_per_layer,
            "pilot": m.pilot.experts_per_layer,
        },
        "pilot": {
            "decode_tok_s": m.pilot.decode_tok_s,
            "bytes_per_token": (m.pilot.mb_read_per_token * 1e6) as u64,
            "disk_gb_s": m.pilot.disk_gb_s(),
            "of_disk_bound": disk_bound(probes, m.pilot.mb_read_per_token)
                .map(|b| m.pilot.decode_tok_s / b),
            "of_device_bound": of_device_bound(probes, &m.pilot),
            "prefetch_mb_per_token": m.pilot.prefetch_mb.map(|(t, l, u)| serde_json::json!({
                "in_time": t,
                "late": l,
                "unused": u,
            })),
        },
        "runs": {
            "cold": run(&m.cold),
            "first_token": run(&m.first),
            "warm": run(&m.warm),
            "pilot": run(&m.pilot),
        },
    })
}

/// What share of the attention term MLA's rebuild of the keys and values is (nothing for
/// grouped-query attention).
fn rebuild_share(t: &super::prefill::Ttft) -> String {
    let all = t.attention_pair_macs + t.attention_rebuild_macs;
    if t.attention_rebuild_macs > 0.0 && all > 0.0 {
        format!(
            " ({:.0}% of it MLA's per-chunk rebuild of the keys and values)",
            100.0 * t.attention_rebuild_macs / all
        )
    } else {
        String::new()
    }
}
