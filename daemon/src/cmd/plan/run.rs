//! The `plan` command itself: from the arguments to the report. It reads what the user asked
//! about (a published config or a model on disk), writes `--measure`'s model first so that the
//! disk probe runs on the drive it lives on, probes this machine, predicts (`super::predict`),
//! runs the measure when asked, and prints the two side by side; the model of a token it
//! predicts with is in `super` and its parts (`decode`, `prefill`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::probe::{
    probe_attention, probe_copy, probe_dense_decode, probe_disk, probe_expert_decode,
    probe_experts, probe_prefill,
};
use super::report::{gb, json, text};
use super::*;
/// What the user asked about: shapes, sizes and where its files would live.
pub(super) struct Subject {
    pub(super) name: String,
    pub(super) cfg: ModelConfig,
    pub(super) shape: Shape,
    pub(super) sizes: Sizes,
    pub(super) formats: (String, String),
    pub(super) usage: Option<PathBuf>,
    pub(super) probe_dir: PathBuf,
    /// The config.json as `--measure` writes it (`--config` only).
    pub(super) config_json: Option<serde_json::Value>,
}

fn subject(args: &PlanArgs) -> Result<Subject, EngineError> {
    let expert_fmt = QFormat::from_bits(args.expert_bits, 64)
        .map_err(|e| EngineError::Usage(format!("--expert-bits {}: {e}", args.expert_bits)))?;
    let dense_fmt = QFormat::from_bits(args.dense_bits, 64)
        .map_err(|e| EngineError::Usage(format!("--dense-bits {}: {e}", args.dense_bits)))?;
    match (&args.config, &args.snap) {
        (Some(path), None) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
            // The shapes predicted are the ones `--measure` writes: fewer layers with
            // --layers, no MTP head.
            let config_json = write::measured_config(&text, args.layers.map(|n| n as usize))
                .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
            let cfg = ModelConfig::from_json(&config_json.to_string())
                .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
            let shape = Shape::from_config(&cfg);
            let sizes = Sizes::converted(&shape, expert_fmt, dense_fmt);
            Ok(Subject {
                name: path.display().to_string(),
                cfg,
                shape,
                sizes,
                formats: (expert_fmt.name().into(), dense_fmt.name().into()),
                usage: None,
                probe_dir: args
                    .probe_dir
                    .clone()
                    .or_else(|| args.measure.clone())
                    .unwrap_or_else(|| PathBuf::from(".")),
                config_json: Some(config_json),
            })
        }
        (None, Some(dir)) => {
            let cfg = ModelConfig::load(dir)?;
            let shape = Shape::from_config(&cfg);
            let mut sizes = Sizes::converted(&shape, expert_fmt, dense_fmt);
            // A model on disk: its stored expert and file sizes replace the computed ones
            // (a pre-quantized container keeps its format; a checkpoint quantizes at load).
            let shards = crate::weights::ShardSet::open(std::slice::from_ref(dir))?;
            sizes.disk = crate::engine::facts::shard_bytes(&shards);
            if let Some(e) = crate::engine::facts::stored_expert(&shards, &cfg) {
                sizes.expert_disk = e.bytes;
                if e.prequantized {
                    sizes.expert_ram = e.bytes;
                }
            }
            let state = crate::engine::state::resolve(dir, args.state_dir.as_deref())?;
            let usage = state.join(".coli_usage");
            Ok(Subject {
                name: dir.display().to_string(),
                cfg,
                shape,
                sizes,
                formats: (expert_fmt.name().into(), dense_fmt.name().into()),
                usage: usage.exists().then_some(usage),
                probe_dir: args.probe_dir.clone().unwrap_or_else(|| dir.clone()),
                config_json: None,
            })
        }
        _ => Err(EngineError::Usage(
            "plan needs --config FILE (a published config.json) or --snap DIR (a model on disk)"
                .into(),
        )),
    }
}

fn routing(s: &Subject, explicit: Option<&Path>) -> Result<Routing, EngineError> {
    let Some(path) = explicit.map(Path::to_path_buf).or_else(|| s.usage.clone()) else {
        return Ok(Routing::Uniform);
    };
    let (usage, _) = Usage::load(
        &path,
        s.cfg.num_hidden_layers,
        s.cfg.n_routed_experts,
        false,
    )
    .map_err(|e| EngineError::Usage(format!("--usage: {e}")))?;
    if usage.total() == 0 {
        return Ok(Routing::Uniform);
    }
    let per_layer = (0..s.cfg.num_hidden_layers)
        .filter(|&l| s.cfg.mlp_layer_types.get(l) == Some(&MlpKind::Sparse))
        .map(|l| {
            let mut counts: Vec<u64> = (0..usage.n_experts).map(|e| usage.get(l, e)).collect();
            counts.sort_unstable_by(|a, b| b.cmp(a));
            counts
        })
        .collect();
    Ok(Routing::History { path, per_layer })
}

pub fn run(args: PlanArgs) -> Result<ExitCode, EngineError> {
    let s = subject(&args)?;
    let assumed = routing(&s, args.usage.as_deref())?;
    // The model first: the disk probe then runs on the drive it was written to.
    let model = match &args.measure {
        Some(dir) => Some(measure_model(&args, &s, dir)?),
        None => None,
    };
    let cgroup_bytes = args.cgroup_gb.map(|g| (g * 1e9) as u64);
    let ram = match args.ram_gb {
        Some(g) => (g * 1e9) as u64,
        None => {
            auto_budget(
                crate::telemetry::meminfo().1,
                cgroup_bytes.or_else(crate::telemetry::cgroup_memory_limit),
            )
            .0
        }
    };
    let io = reads_assumed(&s, ram, cgroup_bytes);
    let budget = Budget {
        ram,
        vram: (args.vram_gb.unwrap_or(0.0) * 1e9) as u64,
        ctx: (args.ctx as usize).min(s.shape.max_positions.max(1)),
        kv_slots: args.kv_slots as usize,
        page_cache: page_cache_room(&io),
        // Mapped loads use the page cache's pages in place, O_DIRECT ones land in our buffer.
        copied: io.mode == IoMode::Buffered,
    };
    let probes = {
        let (disk_gbs, disk_how) = match args.disk_gbs {
            Some(g) => (g, "given (--disk-gbs)".to_string()),
            None => {
                crate::elog!("[PLAN] probing the disk in {} ...", s.probe_dir.display());
                probe_disk(&s.probe_dir, s.sizes.expert_disk)?
            }
        };
        let (mem_gbs, mem_how) = match args.mem_gbs {
            Some(g) => (g, "given (--mem-gbs)".to_string()),
            None => (
                crate::membw::read_bandwidth_gbs(1024, 3),
                format!("1 GiB read, {} threads", rayon::current_num_threads()),
            ),
        };
        let (copy_gbs, copy_how) = match args.copy_gbs {
            Some(g) => (g, "given (--copy-gbs)".to_string()),
            None => probe_copy(&s.probe_dir, s.sizes.expert_disk)?,
        };
        let (dense_gbs, dense_how) = match args.dense_gbs {
            Some(g) => (g, "given (--dense-gbs)".to_string()),
            None => {
                let fmt = QFormat::from_bits(args.dense_bits, 64).unwrap_or(QFormat::I8Row);
                probe_dense_decode(fmt, s.shape.hidden, probe::DENSE_DECODE_BYTES)
            }
        };
        let (expert_decode_gbs, expert_decode_how) = match args.expert_decode_gbs {
            Some(g) => (g, "given (--expert-decode-gbs)".to_string()),
            None => {
                let fmt = QFormat::from_bits(args.expert_bits, 64).unwrap_or(QFormat::I4G64);
                let sh = &s.shape;
                probe_expert_decode(
                    fmt,
                    (sh.hidden, sh.moe_intermediate, sh.top_k),
                    probe::DENSE_DECODE_BYTES,
                )
            }
        };
        let (prefill_gmacs, prefill_how) = match args.prefill_gmacs {
            Some(g) => (g, "given (--prefill-gmacs)".to_string()),
            None => {
                let fmt = QFormat::from_bits(args.dense_bits, 64).unwrap_or(QFormat::I8Row);
                probe_prefill(fmt)
            }
        };
        let (expert_gmacs, expert_how) = match args.expert_gmacs {
            Some(g) => (g, "given (--expert-gmacs)".to_string()),
            None => {
                let fmt = QFormat::from_bits(args.expert_bits, 64).unwrap_or(QFormat::I4G64);
                let sh = &s.shape;
                // At the decode chunk's rows, whatever chunk a budget gets: an expert's rows
                // grow with a longer chunk, so the rate is a floor there.
                let chunk = TTFT_PROMPT.min(crate::engine::PREFILL_CHUNK);
                let rows = prefill::rows_per_expert(sh.experts, sh.top_k, chunk);
                probe_experts(fmt, sh.hidden, sh.moe_intermediate, rows)
            }
        };
        let (attention_gmacs, attention_how) = match args.attention_gmacs {
            Some(g) => (g, "given (--attention-gmacs)".to_string()),
            // An MLA model's kv_b_proj is in the dense format.
            None => {
                let dense = QFormat::from_bits(args.dense_bits, 64).unwrap_or(QFormat::I8Row);
                probe_attention(TTFT_PROMPT, s.shape.mla.map(|m| (m, dense)))
            }
        };
        Probes {
            disk_gbs,
            disk_how,
            mem_gbs,
            mem_how,
            copy_gbs,
            copy_how,
            dense_gbs,
            dense_how,
            expert_decode_gbs,
            expert_decode_how,
            prefill_gmacs,
            prefill_how,
            expert_gmacs,
            expert_how,
            attention_gmacs,
            attention_how,
        }
    };
    for (name, v) in [
        ("--disk-gbs", probes.disk_gbs),
        ("--mem-gbs", probes.mem_gbs),
        ("--copy-gbs", probes.copy_gbs),
        ("--dense-gbs", probes.dense_gbs),
        ("--expert-decode-gbs", probes.expert_decode_gbs),
        ("--prefill-gmacs", probes.prefill_gmacs),
        ("--expert-gmacs", probes.expert_gmacs),
        ("--attention-gmacs", probes.attention_gmacs),
    ] {
        if !(v.is_finite() && v > 0.0) {
            return Err(EngineError::Usage(format!(
                "{name} {v}: a speed must be a positive number"
            )));
        }
    }
    let p = predict(&s.shape, &s.sizes, &probes, &budget, &assumed);
    let moves = moves(&s, &probes, &budget, &assumed, &p, &args);
    let measured = match (&args.measure, &model) {
        (Some(dir), Some(m)) if !args.write_only => Some((
            m,
            measure::measure(
                dir,
                s.sizes.expert_disk,
                budget.ram,
                p.split.experts_in_ram,
                args.measure_tokens as usize,
                TTFT_PROMPT,
                cgroup_bytes,
            )?,
        )),
        _ => None,
    };
    // The same prediction with the cold run's own routing in place of the assumption: how far
    // the speed model is off once the hit rate is the one the run saw.
    let routed = match &measured {
        Some((_, m)) => match &m.usage {
            Some(path) => {
                let r = routing(&s, Some(path))?;
                let q = predict(&s.shape, &s.sizes, &probes, &budget, &r);
                let window = cold_window(&s.shape, &s.sizes, &probes, &q, budget.copied, m.tokens);
                Some((q, window))
            }
            None => None,
        },
        None => None,
    };
    if args.json {
        let mut v = json(&s, &probes, &budget, &assumed, &p, &moves);
        v["reads"] = serde_json::json!({
            "mode": io.mode.label(),
            "why": io.to_string(),
        });
        if let Some(m) = &model {
            v["measure"] = report::model_json(m);
        }
        if let Some((_, m)) = &measured {
            v["measured"] = report::measured_json(&probes, &budget, m);
            let w = cold_window(&s.shape, &s.sizes, &probes, &p, budget.copied, m.tokens);
            v["predicted"]["cold_window"] = report::window_json(m.tokens, &w);
            if let (Some((q, w)), Some(path)) = (&routed, &m.usage) {
                v["predicted_run_routing"] = serde_json::json!({
                    "usage": path.display().to_string(),
                    "hit_rate": q.hit_rate,
                    "decode_tok_s": q.decode_tok_s,
                    "page_cache_share": q.page_cache_share,
                    "warm": {
                        "decode_tok_s": q.warm_decode_tok_s,
                        "disk_bytes_per_token": q.disk_bytes_per_token,
                        "page_cache_bytes_per_token": q.page_cache_bytes_per_token,
                    },
                    "ttft_s": q.ttft_s,
                    "ttft_read_bytes": q.ttft.read_bytes,
                    "ttft_page_cache_bytes": q.ttft.page_cache_bytes,
                    "cold_window": report::window_json(m.tokens, w),
                });
            }
        }
        println!("{v}");
    } else {
        let reads = reads_line(&io);
        print!(
            "{}",
            text(&s, &probes, &budget, &assumed, &reads, &p, &moves)
        );
        if let Some(m) = &model {
            print!("{}", report::model_text(m));
        }
        if let Some((_, m)) = &measured {
            let window = cold_window(&s.shape, &s.sizes, &probes, &p, budget.copied, m.tokens);
            print!(
                "{}",
                report::measured_text(&probes, &budget, (&p, window), routed.as_ref(), m)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The read mode `--direct auto` (the default) would pick for `s`'s experts under a `ram`
/// budget on this machine (in a cgroup of `cgroup_bytes`, else this process's own limit).
fn reads_assumed(s: &Subject, ram: u64, cgroup_bytes: Option<u64>) -> IoChoice {
    let count = s.shape.sparse_layers as u64 * s.shape.experts as u64;
    let facts = IoFacts {
        expert_bytes: count * s.sizes.expert_disk,
        budget: ram,
        whole_model: s.sizes.dense + count * s.sizes.expert_ram,
        cgroup_limit: cgroup_bytes.or_else(crate::telemetry::cgroup_memory_limit),
        mem_total: crate::telemetry::meminfo().0,
        // As `run` and `serve` without --model-dirs, --mirror or --drop.
        mappable: true,
    };
    choose_io(IoMode::Auto, facts)
}

/// The plan's `reads` line: the mode and why, and what it means for the figures (the disk
/// probe reads with O_DIRECT either way).
pub(super) fn reads_line(io: &IoChoice) -> String {
    match (io.mode, page_cache_room(io)) {
        (IoMode::Direct, _) => format!("{io}: reads at the disk probe's rate"),
        (_, 0) => format!("{io}: reads at the disk probe's rate (the page cache's room unknown)"),
        _ => format!(
            "{io}: first reads at the disk probe's rate, later ones from the page cache while \
             it holds them (the `page cache` line)"
        ),
    }
}

/// The model `--measure` runs: written now, or found finished from an earlier run.
pub struct MeasureModel {
    pub dir: PathBuf,
    pub bytes: u64,
    /// The write's time; `None` when an earlier run's model was reused.
    pub written: Option<write::Written>,
    pub skew: Option<f32>,
    pub layers: usize,
}

fn measure_model(args: &PlanArgs, s: &Subject, dir: &Path) -> Result<MeasureModel, EngineError> {
    let config = s.config_json.as_ref().ok_or_else(|| {
        EngineError::Usage("--measure needs --config FILE (a published config.json)".into())
    })?;
    write::check_family(&s.cfg)?;
    if !(args.skew.is_finite() && (0.0..=10.0).contains(&args.skew)) {
        return Err(EngineError::Usage(format!(
            "--skew {}: allowed 0..=10 (the bias of the expert ranked r is -skew * ln(1 + r))",
            args.skew
        )));
    }
    let fmt = |bits: u32, flag: &str| {
        QFormat::from_bits(bits, 64).map_err(|e| EngineError::Usage(format!("{flag} {bits}: {e}")))
    };
    let expert = fmt(args.expert_bits, "--expert-bits")?;
    if expert == QFormat::F32 {
        return Err(EngineError::Usage(
            "--expert-bits 16: the measure writes routed experts quantized; allowed: 8, 4, 3, 2"
                .into(),
        ));
    }
    let f = write::Formats::new(expert, fmt(args.dense_bits, "--dense-bits")?);
    let tokenizer = write::tokenizer_for(args.config.as_deref(), s.cfg.vocab_size)?;
    let units = write::tensors(&s.cfg, &f, args.skew, args.seed)?;
    let shards = write::shards(units, write::shard_bytes())?;
    let bytes = write::total_bytes(&shards);
    let params = write::params(config, &f, args.skew, args.seed);
    let skew = (s.cfg.router == crate::config::RouterKind::SigmoidBias).then_some(args.skew);
    let model = |written| MeasureModel {
        dir: dir.to_path_buf(),
        bytes,
        written,
        skew,
        layers: s.cfg.num_hidden_layers,
    };
    match write::inspect(dir, &params)? {
        write::Found::Same => {
            crate::elog!(
                "[measure] {} holds this model already ({:.2} GB): reused",
                dir.display(),
                bytes as f64 / 1e9
            );
            Ok(model(None))
        }
        write::Found::Empty => {
            write::check_room(dir, bytes)?;
            crate::elog!(
                "[measure] writing {:.2} GB ({} layers, experts {}, dense {}) to {}",
                bytes as f64 / 1e9,
                s.cfg.num_hidden_layers,
                f.expert.name(),
                f.dense.name(),
                dir.display()
            );
            let w = write::write(dir, config, &tokenizer, &shards, &params, args.seed)?;
            Ok(model(Some(w)))
        }
    }
}

/// One thing that would change the figure, and the figure with it.
#[derive(Clone, Debug)]
pub(super) struct Move {
    pub(super) what: String,
    pub(super) decode_tok_s: f64,
}

fn moves(
    s: &Subject,
    probes: &Probes,
    budget: &Budget,
    routing: &Routing,
    p: &Prediction,
    args: &PlanArgs,
) -> Vec<Move> {
    let mut out = Vec::new();
    let all = ram_for_all(&s.shape, &s.sizes, budget);
    if all > budget.ram {
        let b = Budget {
            ram: all,
            ..*budget
        };
        let q = predict(&s.shape, &s.sizes, probes, &b, routing);
        out.push(Move {
            what: format!("{} of RAM (every expert in memory)", gb(all)),
            decode_tok_s: q.warm_decode_tok_s,
        });
    }
    if p.disk_bytes_per_token > 0 {
        let faster = Probes {
            disk_gbs: probes.disk_gbs * 2.0,
            ..probes.clone()
        };
        let q = predict(&s.shape, &s.sizes, &faster, budget, routing);
        out.push(Move {
            what: "a second drive (--model-dirs, reads spread over both)".into(),
            decode_tok_s: q.warm_decode_tok_s,
        });
    }
    let fewer = match args.expert_bits {
        16 => Some(8),
        8 => Some(4),
        4 => Some(3),
        3 => Some(2),
        _ => None,
    };
    if let (Some(bits), None) = (fewer, &args.snap) {
        if let (Ok(ef), Ok(df)) = (
            QFormat::from_bits(bits, 64),
            QFormat::from_bits(args.dense_bits, 64),
        ) {
            let sizes = Sizes::converted(&s.shape, ef, df);
            let q = predict(&s.shape, &sizes, probes, budget, routing);
            out.push(Move {
                what: format!("--expert-bits {bits} ({} on disk)", gb(sizes.disk)),
                decode_tok_s: q.warm_decode_tok_s,
            });
        }
    }
    out
}
