//! `colibri info`: which model a directory holds and whether it fits this machine, from its
//! config and shard headers only (no weights are loaded, so it answers at once even for a
//! model far bigger than RAM). `serve` and `run` print the same facts on one `[MODEL]` line.
//! The facts themselves are the engine's (`engine::facts`).

use std::path::Path;
use std::process::ExitCode;

use crate::cli::InfoArgs;
use crate::config::{MlpKind, ModelConfig};
use crate::engine::facts::{bytes, count, count_params, mtp_layers, mtp_line, ModelFacts};
use crate::error::EngineError;

/// The adapter `--gpu` opens (name, backend, driver, largest buffer), or why none.
fn gpu_line(choice: crate::gpu::GpuChoice) -> String {
    if choice == crate::gpu::GpuChoice::Off {
        return "[GPU] off (--gpu off)".into();
    }
    match crate::gpu::shared(choice) {
        Ok(g) => format!("[GPU] {}: largest buffer {}", g.name, bytes(g.max_buffer)),
        Err(e) => format!("[GPU] {e}"),
    }
}

/// `info --config FILE`: what a published `config.json` describes, without weights.
fn config_only(path: &Path, json: bool) -> Result<ExitCode, EngineError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
    let cfg = ModelConfig::from_json(&text)
        .map_err(|e| EngineError::Usage(format!("--config {}: {e}", path.display())))?;
    let counts = count_params(&cfg, mtp_layers(&text));
    let sparse = cfg
        .mlp_layer_types
        .iter()
        .filter(|k| **k == MlpKind::Sparse)
        .count();
    if json {
        println!(
            "{}",
            serde_json::json!({
                "config": path.display().to_string(),
                "family": cfg.family.model_type(),
                "params": counts.total,
                "active": counts.active,
                "embedding": counts.embedding,
                "mtp": counts.mtp,
                "layers": cfg.num_hidden_layers,
                "sparse_layers": sparse,
                "experts_per_layer": cfg.n_routed_experts,
                "experts_per_token": cfg.num_experts_per_tok,
                "context": cfg.max_position_embeddings,
            })
        );
    } else {
        print!(
            "config       {}\nfamily       {}\nparameters   {} ({} active per token)\n{}layers       {} ({} with routed experts)\nexperts      {} per layer, {} per token\ncontext      {} tokens\n",
            path.display(),
            cfg.family.model_type(),
            count(counts.total),
            count(counts.active),
            mtp_line(counts.mtp),
            cfg.num_hidden_layers,
            sparse,
            cfg.n_routed_experts,
            cfg.num_experts_per_tok,
            cfg.max_position_embeddings,
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub fn run(args: InfoArgs) -> Result<ExitCode, EngineError> {
    if let Some(path) = &args.config {
        return config_only(path, args.json);
    }
    let dirs = args.model.dirs()?;
    let opts = args.model.load_options()?;
    let state_dir = crate::engine::state::resolve(&dirs[0], args.state_dir.as_deref())?;
    let facts = ModelFacts::gather(&dirs, &opts, Some(&state_dir))?;
    let gpu = gpu_line(opts.tiers.gpu);
    crate::elog!("{gpu}");
    if args.json {
        let mut v = facts.json();
        v["gpu"] = serde_json::Value::String(gpu.trim_start_matches("[GPU] ").to_string());
        println!("{v}");
    } else {
        print!("{}", facts.text());
    }
    // The reserve the budget line counts, said once so a "no" can be acted on.
    if facts.min_need > facts.budget && opts.tiers.ram_reserve.is_none() {
        crate::elog!(
            "[RAM] the fixed reserve is {:.2} GB (--ram-reserve-gb)",
            opts.tiers.reserve(facts.budget) as f64 / 1e9
        );
    }
    Ok(ExitCode::SUCCESS)
}
