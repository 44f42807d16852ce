//! The command line: flags with environment fallbacks (the flag wins), validated once into the
//! options each subcommand needs. Environment names are upstream's where upstream has one.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::error::EngineError;
use crate::model::{ActMode, AttnPath, LoadOptions};
use crate::quant::QFormat;

#[derive(Parser, Debug)]
#[command(
    name = "colibri",
    version,
    about = "Run mixture-of-experts models (GLM-5, DeepSeek-V3/V3.2, GLM-4.x, Qwen3-MoE) on one machine",
    long_about = "Run mixture-of-experts models (GLM-5, DeepSeek-V3/V3.2, GLM-4.x, Qwen3-MoE) on one machine.\n\n\
        The dense weights stay in memory; routed experts are read from disk when the router \
        picks them. Without --snap every command uses the tiny demo model built into the binary.\n\n\
        Examples:\n  colibri run --prompt 'Hello'\n  echo 'Hello' | colibri run --snap ~/models/glm-5.2\n  \
        colibri validate --snap tests/fixtures/tiny-dense-shared --ref tests/fixtures/tiny-dense-shared/ref.json --case long"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The line protocol on stdin/stdout (upstream's READY / PROMPT / MORE / RESET framing).
    // A negative number is a value to refuse by name ("--ctx -5"), not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Serve(ServeArgs),
    /// OpenAI- and Anthropic-compatible HTTP (chat completions, completions, messages, tool
    /// calls, JSON schemas) over the engine's batched sessions.
    // A negative number is a value to refuse by name ("--ctx -5"), not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Api(ApiArgs),
    /// One-shot completion for scripts: the prompt from --prompt or stdin, the answer on stdout.
    // A negative number is a value to refuse by name ("--ctx -5"), not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Run(RunArgs),
    /// Oracle check against a reference JSON (prompt_ids, full_ids, tf_pred).
    // A negative number is a value to refuse by name ("--ctx -5"), not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Validate(ValidateArgs),
    /// Replay a reference's full_ids (prefill, then one token at a time) and report speed.
    // A negative number is a value to refuse by name ("--ctx -5"), not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Bench(BenchArgs),
    /// Convert a Hugging Face checkpoint (F32, BF16 or FP8) into the streaming container.
    Convert(ConvertArgs),
    /// Perplexity and bits per byte of a text file (upstream's SCORE mode).
    // A negative number is a value to refuse by name ("--ctx -5"), not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Score(ScoreArgs),
    /// Check every tensor of a converted model against the checksums colibri convert wrote.
    Verify(VerifyArgs),
    /// Which model a directory holds (family, parameters, formats, experts, sizes, context,
    /// state folder) and whether it fits the RAM budget; reads no weights.
    Info(InfoArgs),
    /// Will a model run here, and how fast? The RAM split and predicted decode and first-token
    /// times from a config.json (before downloading) or a model on disk, and this machine's
    /// disk, memory and prefill probes.
    // A negative number is a value to refuse by name, not an unknown flag.
    #[command(allow_negative_numbers = true)]
    Plan(PlanArgs),
}

impl Command {
    /// The model options of the command (`convert` has none: it reads no model to run).
    pub fn model_args(&self) -> Option<&ModelArgs> {
        match self {
            Command::Serve(a) => Some(&a.model),
            Command::Api(a) => Some(&a.serve.model),
            Command::Run(a) => Some(&a.model),
            Command::Validate(a) => Some(&a.model),
            Command::Bench(a) => Some(&a.model),
            Command::Convert(_) => None,
            Command::Score(a) => Some(&a.model),
            Command::Verify(_) => None,
            Command::Plan(_) => None,
            Command::Info(a) => Some(&a.model),
        }
    }
}

/// How a message names an option: by its flag, or by the environment variable its value came
/// from when the command line does not give the flag (the flag wins when both are set).
pub fn option_name(flag: &str, var: &str) -> String {
    let long = format!("{flag}=");
    let on_command_line = std::env::args().any(|a| a == flag || a.starts_with(&long));
    if !on_command_line && std::env::var_os(var).is_some() {
        format!("{var} (environment, for {flag})")
    } else {
        flag.to_string()
    }
}

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Model directory, or a GGUF file (the first part of a split `-00001-of-0000N.gguf` set),
    /// read as stored; several directories joined with ':' form a shard search path (first wins
    /// per file).
    /// Default: the demo model built into the binary.
    #[arg(long, env = "SNAP")]
    pub snap: Option<String>,
    /// Routed-expert precision: 16 (f32), 8 (int8/row), 4 (int4, groups of 64 or per row with
    /// --group-size 0), 3 (int3, groups of 64), 2 (int2/row). Pre-quantized containers keep
    /// their stored format.
    #[arg(long, env = "EXPERT_BITS", default_value_t = 16)]
    pub expert_bits: u32,
    /// Precision of the other matrices (same values); embedding and lm_head keep >= 8 bits.
    #[arg(long, env = "DENSE_BITS", default_value_t = 16)]
    pub dense_bits: u32,
    /// Group size of int4 (64, or 0 for one scale per row); int3 needs 64.
    #[arg(long, env = "GROUP_SIZE", default_value_t = 64)]
    pub group_size: u32,
    /// How activations meet quantized weights: int8 (integer dot products, fast) or f32 (exact
    /// against the dequantized weights).
    #[arg(long, env = "COLI_ACT", value_enum, default_value_t = Act::Int8)]
    pub act: Act,
    /// Attention path: absorbed weights for decode and k/v reconstruction for long batches
    /// (auto), or one of them always.
    #[arg(long, env = "COLI_ATTN", value_enum, default_value_t = Attn::Auto)]
    pub attn: Attn,
    /// Worker threads for the matrix products (default: all cores).
    #[arg(long, env = "THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub threads: Option<u16>,
    /// Speculative decoding: most drafted tokens per step, from the MTP head and n-gram
    /// prompt lookup (0: off). Each step drafts what the measured acceptance and cost make
    /// pay, none where nothing does. Greedy output is identical on and off.
    #[arg(long, env = "DRAFT", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=16))]
    pub draft: u16,
    /// Load the model's MTP head when it has one (0: skip it).
    #[arg(long, env = "MTP", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub mtp: u8,
    #[command(flatten)]
    pub tiers: crate::experts::TierArgs,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Act {
    Int8,
    F32,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Attn {
    Auto,
    Reconstruct,
    Absorbed,
}

impl ModelArgs {
    pub fn load_options(&self) -> Result<LoadOptions, EngineError> {
        let fmt = |bits, what: &str| {
            QFormat::from_bits(bits, self.group_size)
                .map_err(|e| EngineError::Usage(format!("{what}: {e}")))
        };
        Ok(LoadOptions {
            expert_fmt: fmt(self.expert_bits, "--expert-bits")?,
            dense_fmt: fmt(self.dense_bits, "--dense-bits")?,
            act: match self.act {
                Act::Int8 => ActMode::Int8,
                Act::F32 => ActMode::F32,
            },
            attn_path: match self.attn {
                Attn::Auto => AttnPath::Auto,
                Attn::Reconstruct => AttnPath::Reconstruct,
                Attn::Absorbed => AttnPath::Absorbed,
            },
            index_topk: None,
            fake_quant: false,
            tiers: self.tiers.config()?,
            mtp: self.mtp != 0,
            draft: self.draft as usize,
        })
    }

    /// The model directories: `--snap` then any `--model-dirs` not in it, or the demo model
    /// written to the cache directory.
    pub fn dirs(&self) -> Result<Vec<PathBuf>, EngineError> {
        let spread = self.tiers.model_dirs()?;
        let mut dirs = self.snap_dirs(spread.is_empty())?;
        for d in spread {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        Ok(dirs)
    }

    /// `--snap`'s directories; without it the demo model's when `demo`, else none.
    fn snap_dirs(&self, demo: bool) -> Result<Vec<PathBuf>, EngineError> {
        match &self.snap {
            Some(s) => {
                let dirs = crate::engine::split_search_path(s);
                let name = option_name("--snap", "SNAP");
                if dirs.is_empty() {
                    return Err(EngineError::Usage(format!(
                        "{name} {s:?}: no directory in it"
                    )));
                }
                if crate::gguf::snap::gguf_of(&dirs).is_some() {
                    return Ok(dirs);
                }
                for d in &dirs {
                    if !d.is_dir() {
                        return Err(EngineError::Usage(format!(
                            "{name}: {} is not a directory (or one .gguf file)",
                            d.display()
                        )));
                    }
                }
                Ok(dirs)
            }
            None if demo => Ok(vec![crate::demo::materialize()?]),
            None => Ok(Vec::new()),
        }
    }

    /// `--threads`, else `THREADS`, else `OMP_NUM_THREADS` (what upstream's launchers set),
    /// else every core.
    pub fn init_threads(&self) {
        // Which pool the matmuls split on (`quant::Threading`), for comparisons; the default
        // `auto` is the one to run.
        if let Ok(v) = std::env::var("COLI_MATMUL_POOL") {
            match v.as_str() {
                "auto" => crate::quant::set_threading(crate::quant::Threading::Auto),
                "rayon" => crate::quant::set_threading(crate::quant::Threading::Rayon),
                "spin" => crate::quant::set_threading(crate::quant::Threading::Spin),
                _ => {
                    crate::elog!("[env] COLI_MATMUL_POOL={v:?} is not auto, rayon or spin: ignored")
                }
            }
        }
        let omp = || {
            let v = std::env::var("OMP_NUM_THREADS").ok()?;
            // OpenMP allows a list ("8,4" for nested levels): the first level is ours.
            let first = v.split(',').next().unwrap_or("").trim().to_string();
            match first.parse::<u16>() {
                Ok(n) if n >= 1 => Some(n),
                _ => {
                    crate::elog!("[env] OMP_NUM_THREADS={v:?} is not a thread count >= 1: ignored");
                    None
                }
            }
        };
        let (n, from) = match self.threads {
            Some(n) => (n, "THREADS / --threads"),
            None => match omp() {
                Some(n) => (n, "OMP_NUM_THREADS"),
                None => return,
            },
        };
        crate::elog!("[threads] {n} ({from})");
        // Fails only if a pool already exists, in which case it is kept.
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n as usize)
            .build_global();
    }
}

#[derive(Args, Debug)]
pub struct SamplingArgs {
    /// Sampling temperature, 0 = greedy (0..=2) [default: 0.7] [env: COLI_TEMP, then TEMP;
    /// a TEMP that is not a number, such as the directory Windows and MSYS export, is ignored]
    #[arg(long = "temp", value_parser = parse_temp)]
    pub temp: Option<f32>,
    /// Nucleus (top-p) mass kept when sampling, in (0, 1].
    #[arg(long = "top-p", env = "NUCLEUS", default_value_t = 0.9, value_parser = parse_top_p)]
    pub top_p: f32,
    /// RNG seed for reproducible sampling (default: clock and pid).
    #[arg(long, env = "SEED")]
    pub seed: Option<u64>,
    /// Sample among the k most likely tokens only (0: off; 0..=1000000).
    #[arg(long, env = "COLI_TOP_K", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub top_k: u32,
    /// Drop tokens less likely than P times the most likely one (0: off; 0..=1).
    #[arg(long, env = "COLI_MIN_P", default_value_t = 0.0, value_parser = parse_min_p)]
    pub min_p: f32,
    /// Penalise tokens among the last 64 generated: a positive logit is divided by R, a
    /// negative one multiplied (1: off; 0.1..=10).
    #[arg(long, env = "COLI_REPEAT_PENALTY", default_value_t = 1.0, value_parser = parse_repeat_penalty)]
    pub repeat_penalty: f32,
    /// End the answer right before this text, which is not printed (repeatable).
    #[arg(long = "stop", value_name = "STR", env = "COLI_STOP")]
    pub stop: Vec<String>,
    /// A system turn before the first user turn of the chat template (`<|system|>TEXT`).
    #[arg(long, env = "COLI_SYSTEM", value_name = "TEXT")]
    pub system: Option<String>,
}

impl SamplingArgs {
    /// The filters of `--top-k`, `--min-p` and `--repeat-penalty` (neutral by default).
    pub fn params(&self) -> crate::sampling::SamplingParams {
        crate::sampling::SamplingParams {
            top_k: self.top_k as usize,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            ..Default::default()
        }
    }

    /// `--temp`, else `COLI_TEMP` (what upstream's `coli --temp` sets), else `TEMP`, else 0.7.
    pub fn temperature(&self) -> Result<f32, EngineError> {
        if let Some(t) = self.temp {
            return Ok(t);
        }
        temperature_from_env(
            std::env::var("COLI_TEMP").ok().as_deref(),
            std::env::var("TEMP").ok().as_deref(),
        )
    }
}

/// The temperature from upstream's two variables: `COLI_TEMP` wins and must be valid; a `TEMP`
/// that is not a number is ignored with a warning (upstream ignores it too: it is a directory
/// on Windows and MSYS), one that is a number must be in range.
pub fn temperature_from_env(
    coli_temp: Option<&str>,
    temp: Option<&str>,
) -> Result<f32, EngineError> {
    const DEFAULT: f32 = 0.7;
    if let Some(v) = coli_temp.filter(|v| !v.trim().is_empty()) {
        return parse_temp(v.trim()).map_err(|e| EngineError::Usage(format!("COLI_TEMP: {e}")));
    }
    match temp.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(DEFAULT),
        Some(v) if v.parse::<f32>().is_err() => {
            crate::elog!("[env] TEMP={v:?} is not a number (a directory?): ignored, temperature {DEFAULT}; use --temp or COLI_TEMP");
            Ok(DEFAULT)
        }
        Some(v) => parse_temp(v).map_err(|e| EngineError::Usage(format!("TEMP: {e}"))),
    }
}

fn parse_temp(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && (0.0..=2.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is outside the allowed range 0..=2"))
    }
}

fn parse_min_p(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is outside the allowed range 0..=1"))
    }
}

fn parse_repeat_penalty(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && (0.1..=10.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{s} is outside the allowed range 0.1..=10"))
    }
}

fn parse_top_p(s: &str) -> Result<f32, String> {
    let v: f32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{s} is outside the allowed range (0, 1]"))
    }
}

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// The prompt (or --prompt); without either, all of stdin is read.
    #[arg(value_name = "PROMPT", conflicts_with = "prompt")]
    pub positional: Option<String>,
    /// The prompt; without it (or PROMPT), all of stdin is read.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Context in tokens: the prompt plus --max-tokens must fit it (16..=1048576; default
    /// and most: the model's max_position_embeddings). Checked before anything is computed.
    #[arg(long, env = "CTX", value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub ctx: Option<u32>,
    /// Also print the per-phase profile (PROF), the disk classes and the speculation figures.
    #[arg(short, long)]
    pub verbose: bool,
    /// Use the prompt as given, without the GLM chat template.
    #[arg(long)]
    pub raw: bool,
    /// Open the answer with `<think>` (thinking mode) instead of an empty think block.
    #[arg(long, env = "THINK", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub think: bool,
    /// Most tokens to generate (1..=1048576).
    #[arg(long, env = "NGEN", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_tokens: u32,
    /// Directory for state files (`.coli_usage`); default: next to the model, or a per-model
    /// directory under $XDG_STATE_HOME/colibri when the model directory is read-only.
    #[arg(long, env = "COLI_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Constrain the answer to the GBNF grammar (llama.cpp's format, start rule `root`) in
    /// FILE; the answer ends when the grammar's sentence is complete.
    #[arg(long, value_name = "FILE", conflicts_with = "json_schema")]
    pub grammar: Option<PathBuf>,
    /// Constrain the answer to JSON matching the JSON Schema in FILE (object, array, string,
    /// number, integer, boolean, null, enum, const, anyOf, required).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<PathBuf>,
}

/// A reference file of token ids (validate, bench).
#[derive(Args, Debug)]
pub struct RefArgs {
    /// Reference JSON with prompt_ids, full_ids and optionally tf_pred.
    #[arg(long = "ref", env = "REF")]
    pub reference: PathBuf,
    /// Read the arrays from this key of the reference instead of its top level.
    #[arg(long)]
    pub case: Option<String>,
    /// Override the config's index_topk (DSA keys kept per query).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub index_topk: Option<u32>,
}

impl RefArgs {
    /// The model's load options with `--index-topk` applied.
    pub fn load_options(&self, model: &ModelArgs) -> Result<LoadOptions, EngineError> {
        let mut opts = model.load_options()?;
        opts.index_topk = self.index_topk.map(|k| k as usize);
        Ok(opts)
    }
}

/// What `bench` replays: the ids of a reference file (`--ref`), or, as llama-bench's `-p N
/// -n N`, `--prompt-tokens` fixed pseudo-random ids from the vocabulary prefilled and then
/// `--gen-tokens` more decoded one a step (without a file; either alone sets the other to 1).
#[derive(Args, Debug)]
pub struct BenchInput {
    /// Reference JSON with prompt_ids and full_ids: the prompt but its last token is
    /// prefilled, the rest of full_ids decoded.
    #[arg(long = "ref", env = "REF", required_unless_present_any = ["prompt_tokens", "gen_tokens"])]
    pub reference: Option<PathBuf>,
    /// Read the arrays from this key of the reference instead of its top level.
    #[arg(long, requires = "reference")]
    pub case: Option<String>,
    /// Override the config's index_topk (DSA keys kept per query).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub index_topk: Option<u32>,
    /// Without --ref: prefill this many positions of synthetic ids (llama-bench's -p).
    #[arg(long, conflicts_with = "reference", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub prompt_tokens: Option<u32>,
    /// Without --ref: decode this many steps after the prefill, each fed a synthetic id
    /// (llama-bench's -n).
    #[arg(long, conflicts_with = "reference", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub gen_tokens: Option<u32>,
}

impl BenchInput {
    /// The model's load options with `--index-topk` applied.
    pub fn load_options(&self, model: &ModelArgs) -> Result<LoadOptions, EngineError> {
        let mut opts = model.load_options()?;
        opts.index_topk = self.index_topk.map(|k| k as usize);
        Ok(opts)
    }

    /// `(prefill positions, decode steps)` of a synthetic replay; `None` with `--ref`.
    pub fn synthetic(&self) -> Option<(usize, usize)> {
        if self.reference.is_some() {
            return None;
        }
        let p = self.prompt_tokens.unwrap_or(1) as usize;
        let g = self.gen_tokens.unwrap_or(1) as usize;
        Some((p, g))
    }
}

#[derive(Args, Debug)]
pub struct ValidateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub reference: RefArgs,
}

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Upstream's multiplexed protocol (SUBMIT / DATA / DONE, many requests stepped in one
    /// batch) instead of the legacy line protocol; upstream selects it with SERVE_BATCH=1.
    #[arg(long, env = "SERVE_BATCH", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub mux: bool,
    /// Independent conversations (KV slots): 1..=16 in the legacy protocol, 1..=512 with --mux.
    #[arg(long, env = "KV_SLOTS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=512))]
    pub kv_slots: u32,
    /// A new prompt may adopt the KV rows of a longer shared prefix held by another slot
    /// instead of prefilling them (upstream's COLI_KV_SHARE; on by default here).
    #[arg(long, env = "COLI_KV_SHARE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, default_value = "true")]
    pub kv_share: bool,
    /// Context length per slot, in tokens (16..=1048576). Default: the model's own
    /// (max_position_embeddings), lowered when every slot's full KV would take more than a
    /// quarter of the RAM budget (not below 4096); the start line says which and why.
    #[arg(long = "ctx", id = "ctx", value_name = "CTX", env = "CTX", value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub ctx_given: Option<u32>,
    /// The context in use: `--ctx`, or the default chosen at start (`engine::start`).
    #[arg(skip)]
    pub ctx: u32,
    /// Most tokens per turn of the legacy protocol (and per `\x02MORE`), 1..=1048576. `--mux`
    /// SUBMITs and `api` requests give their own max_tokens, clamped only to the context room.
    #[arg(long, env = "NGEN", default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub ngen: u32,
    /// Save each slot's conversation to `.coli_kv[.<slot>]` and resume it at start (1) or not (0).
    #[arg(long, env = "KVSAVE", default_value = "1", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set)]
    pub kv_save: bool,
    /// Directory for state files (default: next to the model, or a per-model directory under
    /// $XDG_STATE_HOME/colibri when the model directory is read-only).
    #[arg(long, env = "COLI_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Keep the KV of long shared prompt prefixes (a system prompt and tool list) on disk
    /// under the state folder, up to this many GB (0: off), so a new conversation, or the
    /// first after a restart, that starts with one skips their prefill. What is kept: when a
    /// prompt shares at least --prefix-cache-min-tokens tokens with a conversation it does
    /// not continue (its slot's previous one, or another slot's under --kv-share), those
    /// tokens, written at the end of that request. An entry is adopted only by the client
    /// (API key and `user`) that made it; the least recently used are evicted past the bound.
    /// On by default: agents resend the same prefix with every conversation, and 4 GB holds
    /// a few 10k-token prefixes of a large model (its KV is about 30-100 kB a token).
    #[arg(long, env = "COLI_PREFIX_CACHE_GB", default_value_t = 4.0, value_parser = non_negative_gb)]
    pub prefix_cache_gb: f64,
    /// The shortest shared prefix the prefix cache keeps, in tokens (16..=1048576): below it
    /// a prefill is cheaper than a file.
    #[arg(long, env = "COLI_PREFIX_CACHE_MIN_TOKENS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub prefix_cache_min_tokens: u32,
    /// Open answers with `<think>` (thinking mode) instead of an empty think block.
    #[arg(long, env = "THINK", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub think: bool,
    /// Wrap plain lines in the model family's chat template (GLM's, ChatML for Qwen) (1) or feed them raw (0).
    #[arg(long, env = "CHAT_TEMPLATE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", default_value = "true")]
    pub chat_template: bool,
    /// Also write telemetry lines (TIERS, LIVE, PROGRESS, STATE, ...) to this file descriptor.
    #[arg(long, env = "COLI_TELEMETRY_FD")]
    pub telemetry_fd: Option<i32>,
}

impl ServeArgs {
    /// The engine start-up options of the daemons (`serve`, `api`).
    pub fn daemon_start(&self) -> crate::engine::start::DaemonStart<'_> {
        crate::engine::start::DaemonStart {
            model: &self.model,
            telemetry_fd: self.telemetry_fd,
            state_dir: self.state_dir.as_deref(),
            kv_save: self.kv_save,
            kv_slots: self.kv_slots,
            ctx_given: self.ctx_given,
            prefix_cache_gb: self.prefix_cache_gb,
            prefix_cache_min_tokens: self.prefix_cache_min_tokens,
        }
    }
}

impl crate::engine::start::ModelSource for ModelArgs {
    fn dirs(&self) -> Result<Vec<PathBuf>, EngineError> {
        ModelArgs::dirs(self)
    }

    fn load_options(&self) -> Result<LoadOptions, EngineError> {
        ModelArgs::load_options(self)
    }
}

#[derive(Args, Debug)]
pub struct ApiArgs {
    /// The model, sampling and session options of `serve` (`--kv-slots` defaults to 8 here:
    /// the requests decoded together).
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Address to listen on. Anything but a loopback address needs --api-key.
    #[arg(long, env = "COLI_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
    /// Required as `Authorization: Bearer KEY` or `x-api-key: KEY` on every route but /health.
    /// Repeatable (or comma-separated in COLI_API_KEY): each key is a client of its own, and
    /// no client's cached prompt prefix is ever reused for, or visible to, another (see
    /// SECURITY.md).
    #[arg(long = "api-key", env = "COLI_API_KEY", value_delimiter = ',')]
    pub api_keys: Vec<String>,
    /// Largest request body, in bytes (413 above it).
    #[arg(long, default_value_t = 4 << 20, value_parser = clap::value_parser!(u64).range(1024..=1 << 30))]
    pub max_body_bytes: u64,
    /// Largest JSON schema a request may have enforced, in bytes: a `response_format`
    /// schema, or for a forced tool call the tools' parameter schemas together (413 above
    /// it). A schema compiles in about 0.4 s per MiB, off the async threads, to a grammar of
    /// about 5 bytes per schema byte that each queued request holds (identical schemas
    /// share one; at most about 7 MB each). The default takes a few hundred typical tools'
    /// schemas.
    #[arg(long, default_value_t = 1 << 20, value_parser = clap::value_parser!(u64).range(1024..=1 << 30))]
    pub max_schema_bytes: u64,
    /// Requests that may wait for a free session; one more is answered 429.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub queue: u32,
    /// Seconds a request may take, queueing included; then it ends as length-limited.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub request_timeout: u64,
    /// Allow browsers on this origin (`*` for any) to call the API (CORS); off by default.
    #[arg(long)]
    pub cors_origin: Option<String>,
    /// The model's id in /v1/models and in every response (default: the model folder's
    /// name).
    #[arg(long)]
    pub model_name: Option<String>,
    /// Another id for the model, listed in /v1/models (repeatable; comma-separated in
    /// COLI_MODEL_ALIAS). With --strict-model-name the ids a request may name.
    #[arg(long = "model-alias", env = "COLI_MODEL_ALIAS", value_delimiter = ',')]
    pub model_aliases: Vec<String>,
    /// Answer 404 to a request whose `model` is neither the model's id nor an alias. By
    /// default any name is served by the loaded model (tools pointed at a local base URL send
    /// `gpt-4o` or `claude-sonnet-4-5`), and the response names the real one.
    #[arg(long, env = "COLI_STRICT_MODEL_NAME")]
    pub strict_model_name: bool,
    /// Seconds a connection may take to send a request's whole head (line and headers),
    /// counted from its first byte; a new connection must also send that first byte within
    /// this time. Slow or silent connections are closed (slowloris).
    #[arg(long, env = "COLI_HEADER_TIMEOUT", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_timeout: u64,
    /// Seconds a request's body may take to arrive in full once its head has; then 408.
    #[arg(long, env = "COLI_BODY_TIMEOUT", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_timeout: u64,
    /// Seconds a kept-alive connection may wait for its next request; then it is closed.
    #[arg(long, env = "COLI_IDLE_TIMEOUT", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub idle_timeout: u64,
    /// Connections open at once; one more is answered 503 and closed. Default: 1024, or less
    /// when the process's descriptor limit (raised to its hard limit at start) needs it.
    #[arg(long, env = "COLI_MAX_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub max_connections: Option<u32>,
    /// Seconds a shutdown (SIGTERM, SIGINT) lets open requests finish before it cancels them
    /// (their conversations are saved as they stand) and exits. A second signal exits at once.
    #[arg(long, env = "COLI_SHUTDOWN_TIMEOUT", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600))]
    pub shutdown_timeout: u64,
    /// A `Host` this server answers to besides its listen address, `localhost` and the
    /// loopback addresses (repeatable; a name, `name:port`, or `*` for any). Requests naming
    /// another host get 421: a web page that rebinds its DNS name to 127.0.0.1 cannot reach
    /// the server. Listening on 0.0.0.0 or [::] accepts any host unless names are given.
    #[arg(long = "allow-host", env = "COLI_ALLOW_HOSTS", value_delimiter = ',')]
    pub allow_hosts: Vec<String>,
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// What is replayed: a reference file, or llama-bench-like synthetic token ids.
    #[command(flatten)]
    pub input: BenchInput,
    /// Skip the memory-bandwidth probe (it allocates 1 GB for a few seconds).
    #[arg(long)]
    pub no_membw: bool,
    /// Skip the disk probe (random reads of one expert each at the I/O pool's queue depth).
    #[arg(long)]
    pub no_disk_probe: bool,
    /// Time the decode's thread pool: the `pool` line gives its parallel regions per token,
    /// each thread's share of the work in them, the time the calling thread waited at their
    /// joins and the time the workers sat idle between them. Off by default: the clock reads
    /// it takes cost the decode a little.
    #[arg(long)]
    pub pool_times: bool,
    /// Run the timed replay (prefill and decode steps) once untimed before measuring: the
    /// steps are deterministic, so every expert the timed one routes to is then resident
    /// (warm figures). Without it the timed replay includes loading every expert it meets
    /// for the first time.
    #[arg(long)]
    pub warmup: bool,
    /// Time the warm replay this many times (1..=20), each after a round of the memory probe,
    /// and report each side's best: a shared machine's memory bandwidth drifts by a quarter
    /// and more from second to second, and one replay against the best of a burst of probes
    /// compares a lull with a rush. Needs --warmup (every round must see the same resident
    /// experts).
    #[arg(long, default_value_t = 1, requires = "warmup", value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
    /// Also replay the reference as N concurrent sessions stepped in one batch (1..=512;
    /// a list such as 2,4,8 runs each in the same process): `STREAMS` lines give aggregate
    /// and per-stream decode tok/s, the distinct experts per layer per step and the expert
    /// bytes per generated token, beside one stream's.
    #[arg(long, env = "BENCH_STREAMS", value_delimiter = ',', default_value = "1", value_parser = clap::value_parser!(u32).range(1..=512))]
    pub streams: Vec<u32>,
    /// Also measure decode after a long context: for each length in the list (e.g.
    /// 1024,4096,16384,32768), session 0's cache is filled with that many synthetic positions
    /// (random keys: attention's cost depends on the cache's length, not its values) and
    /// `--context-steps` tokens are decoded after it. `CONTEXT` lines give tok/s, the attention
    /// time per token and the cost relative to the first length.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub context: Vec<u32>,
    /// Decode steps timed at each `--context` length.
    #[arg(long, default_value = "8", value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub context_steps: u32,
    /// Where the usage history (`.coli_usage`) is read from, as `run` and `serve` do, so
    /// autopin pins what it would pin there; bench never writes it. Default: next to the
    /// model, or its per-model directory under $XDG_STATE_HOME/colibri.
    #[arg(long, env = "COLI_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Replace the reference's continuation with the model's own greedy continuation of its
    /// prompt, this many tokens (made in process with drafts off, untimed): the replay then
    /// judges drafts as a greedy run would.
    #[arg(long, conflicts_with = "gen_tokens", value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub gen: Option<u32>,
    /// With `--draft` > 0: after the figures, replay the reference this many times with drafts
    /// off and on in turn (the same process, the same cache), one `SPEC_AB` line per pair
    /// (decode tok/s off and on, their ratio, tokens per forward) and a `SPEC_AB_SUMMARY` line
    /// (median and geometric-mean ratio, acceptance per source over the "on" replays).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub draft_ab: Option<u32>,
    /// Write the expert selections this run counted (in `.coli_usage`'s format, any history
    /// read at the start included) to FILE when it ends: `colibri plan --usage FILE` then
    /// predicts with this run's routing instead of the uniform assumption (`plan --measure`
    /// does this with its cold run).
    #[arg(long)]
    pub usage_out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ConvertArgs {
    /// The Hugging Face checkpoint directory (config.json and *.safetensors).
    #[arg(long, env = "COLI_CONVERT_FROM")]
    pub from: PathBuf,
    /// The output directory (created; an unfinished conversion there with the same
    /// parameters is resumed, one with other parameters is refused).
    #[arg(long, env = "COLI_CONVERT_TO")]
    pub to: PathBuf,
    /// Routed experts: 8 (int8/row), 4 (int4, groups of --group-size), 3 (int3-g64), 2 (int2/row).
    #[arg(long, env = "COLI_CONVERT_EXPERT_BITS", default_value_t = 4)]
    pub expert_bits: u32,
    /// Group size of int4 (64, or 0 for one scale per row); int3 needs 64.
    #[arg(long, env = "COLI_CONVERT_GROUP_SIZE", default_value_t = 64)]
    pub group_size: u32,
    /// The other matrices (attention, dense and shared MLPs, indexer): 16 (f32), 8, 4, 3, 2.
    #[arg(long, env = "COLI_CONVERT_DENSE_BITS", default_value_t = 4)]
    pub dense_bits: u32,
    /// Embedding and lm_head: 8 (int8/row) or 16 (f32).
    #[arg(long, env = "COLI_CONVERT_IO_BITS", default_value_t = 8)]
    pub io_bits: u32,
    /// Every matrix of the MTP head (layers from num_hidden_layers on): 16, 8, 4, 3, 2.
    #[arg(long, env = "COLI_CONVERT_MTP_BITS", default_value_t = 8)]
    pub mtp_bits: u32,
    /// Largest output shard, in bytes with an optional k, M or G suffix (powers of 1000).
    #[arg(long, env = "COLI_CONVERT_SHARD_SIZE", default_value = "5G", value_parser = parse_size)]
    pub shard_size: u64,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    /// The converted model directory (several joined with ':' form a search path, as for the
    /// other commands).
    #[arg(long, env = "SNAP")]
    pub snap: String,
}

#[derive(Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A bare `config.json` (a published checkpoint's, before downloading it): its family,
    /// total and active parameters, layers and experts, from the shapes alone.
    #[arg(long, value_name = "FILE", conflicts_with = "snap")]
    pub config: Option<PathBuf>,
    /// Directory for state files, as for `run` and `serve` (only reported).
    #[arg(long, env = "COLI_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// One JSON object instead of the text table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
#[command(
    after_help = "Examples:\n  colibri plan --config DeepSeek-V3/config.json --expert-bits 3\n  \
    colibri plan --snap ~/models/glm-4.5-air --ram-gb 24 --json\n\n\
    Warm decode is what a conversation reaches once the cache holds what it can; cold is the \
    first tokens after a start. Routing is assumed uniform (the worst case for a cache) unless \
    a usage history is found beside the model or given with --usage."
)]
pub struct PlanArgs {
    /// A published config.json (nothing downloaded yet): sizes are those `colibri convert`
    /// would write at --expert-bits/--dense-bits.
    #[arg(long, value_name = "FILE", conflicts_with = "snap")]
    pub config: Option<PathBuf>,
    /// A model on disk: its stored sizes, and its usage history for the routing.
    #[arg(long, value_name = "DIR")]
    pub snap: Option<PathBuf>,
    /// Routed-expert precision the model would be converted to: 16, 8, 4 (int4-g64), 3, 2.
    #[arg(long, default_value_t = 4)]
    pub expert_bits: u32,
    /// Precision of the other matrices (embedding and lm_head keep >= 8 bits).
    #[arg(long, default_value_t = 8)]
    pub dense_bits: u32,
    /// RAM budget in GB (default: 88% of MemAvailable or of the cgroup's limit, as `run`).
    #[arg(long, value_parser = positive_gb)]
    pub ram_gb: Option<f64>,
    /// GPU memory in GB for the VRAM expert tier (0: none).
    #[arg(long, value_parser = non_negative_gb)]
    pub vram_gb: Option<f64>,
    /// Context the KV cache is sized for, per slot (capped at the model's own).
    #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub ctx: u32,
    /// Conversations kept at once (each its own KV).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub kv_slots: u16,
    /// A `.coli_usage` history whose routing replaces the uniform assumption.
    #[arg(long, value_name = "FILE")]
    pub usage: Option<PathBuf>,
    /// State folder of a --snap model (where its usage history is found).
    #[arg(long, env = "COLI_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// Where the disk probe writes its 1 GiB scratch file (default: the --snap folder, else
    /// the current folder): the drive the model would live on.
    #[arg(long, value_name = "DIR")]
    pub probe_dir: Option<PathBuf>,
    /// Skip the disk probe: the drive's read speed in GB/s.
    #[arg(long)]
    pub disk_gbs: Option<f64>,
    /// Skip the memory probe: the memory's read speed in GB/s.
    #[arg(long)]
    pub mem_gbs: Option<f64>,
    /// Skip the copy probe: the rate in GB/s at which reads the page cache holds land in the
    /// reader's buffer (the kernel's copy, on the cores that compute).
    #[arg(long)]
    pub copy_gbs: Option<f64>,
    /// Skip the dense decode probe: the dense format's matrix-vector product over memory, in
    /// GB/s of weights (a decode token's dense part computes no faster than this or memory).
    #[arg(long)]
    pub dense_gbs: Option<f64>,
    /// Skip the expert decode probe: a decode token's routed experts in their format (top-k
    /// to a region, one position), in GB/s of weights (they compute no faster than this or
    /// memory; int2 and int3 unpacking can bind below memory).
    #[arg(long)]
    pub expert_decode_gbs: Option<f64>,
    /// Skip the prefill probe: the prefill kernel's speed in billions of multiply-adds/s.
    #[arg(long)]
    pub prefill_gmacs: Option<f64>,
    /// Skip the expert probe: the prefill's expert products (a chunk's rows per expert) in
    /// billions of multiply-adds/s.
    #[arg(long)]
    pub expert_gmacs: Option<f64>,
    /// Skip the attention probe: attention's f32 query-key products (and an MLA model's
    /// rebuild of its keys and values) in billions of multiply-adds/s.
    #[arg(long)]
    pub attention_gmacs: Option<f64>,
    /// One JSON object instead of the text table.
    #[arg(long)]
    pub json: bool,
    /// Write a random-weight model with exactly the --config's shapes into DIR (new or empty;
    /// a finished one written with the same parameters is reused), run it with `colibri bench`
    /// (cold, a 1000-token prompt, warm) and print the measured figures beside the predicted.
    #[arg(long, value_name = "DIR", requires = "config")]
    pub measure: Option<PathBuf>,
    /// Router skew of the measure model (sigmoid routers): the bias of the expert ranked r
    /// (a random ranking per layer) is -S * ln(1 + r). 0: unskewed.
    #[arg(long, default_value_t = 0.08)]
    pub skew: f32,
    /// Only the first N layers of the --config (each layer's shapes kept), e.g. to fit a disk.
    #[arg(long, requires = "config", value_parser = clap::value_parser!(u32).range(1..=256))]
    pub layers: Option<u32>,
    /// Plan for a memory cgroup of N GB (the RAM budget then defaults to 88% of it, and
    /// `--direct auto` reads with O_DIRECT when the experts do not fit beside it); with
    /// --measure, run the measure's children in one.
    #[arg(long, value_parser = positive_gb)]
    pub cgroup_gb: Option<f64>,
    /// Decode steps the measure times, cold and warm.
    #[arg(long, default_value_t = 256, requires = "measure", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub measure_tokens: u32,
    /// Only write the measure model (no run).
    #[arg(long, requires = "measure")]
    pub write_only: bool,
    /// Seed of the measure model's random weights.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

fn positive_gb(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 100_000.0 => Ok(v),
        _ => Err(format!("{s} is not a size in GB in (0, 100000]")),
    }
}

fn non_negative_gb(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && (0.0..=100_000.0).contains(&v) => Ok(v),
        _ => Err(format!("{s} is not a size in GB in [0, 100000]")),
    }
}

/// `5G`, `500M`, `64k` or a plain byte count, in 1000..=10^13.
fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1_000),
        Some((i, 'm' | 'M')) => (&s[..i], 1_000_000),
        Some((i, 'g' | 'G')) => (&s[..i], 1_000_000_000),
        _ => (s, 1),
    };
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (a number with an optional k, M or G)"))?;
    match n.checked_mul(mult) {
        Some(v) if (1_000..=10_000_000_000_000).contains(&v) => Ok(v),
        _ => Err(format!("{s} is outside the allowed range 1k..=10000G")),
    }
}

#[derive(Args, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text to score (UTF-8), tokenized as it is: no chat template.
    #[arg(long)]
    pub text: PathBuf,
    /// Tokens per forward window (2..=1048576).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(2..=1_048_576))]
    pub ctx: u32,
    /// Tokens a window advances by (1..=ctx; default ctx/2): every scored token after the
    /// first window sees at least ctx - stride tokens of context.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub stride: Option<u32>,
}
