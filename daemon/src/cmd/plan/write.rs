//! `plan --measure`'s writer: a random-weight model with exactly a published config's shapes,
//! in the container `colibri convert` writes (each quantized matrix a 1-D U8 blob beside its
//! F32 `.qs` scales; routed experts at `--expert-bits`, the other matrices at `--dense-bits`,
//! embedding and lm_head at >= 8 bits, routers, norms and biases in f32; a routed expert's
//! gate, up and down adjacent and never split over two shards), so the engine loads it as it
//! would load a converted checkpoint of that model.
//!
//! Routing skew: the families with a sigmoid router (GLM-4.5, DeepSeek-V3) select by score +
//! `e_score_correction_bias`; the bias of the expert ranked r (a random ranking per layer) is
//! `-skew * ln(1 + r)`, as `examples/make_synthetic.rs` writes it. A softmax router (Qwen3-MoE)
//! has no bias to carry a skew: its routing is as random as its weights.
//!
//! Safe to stop: the marker [`UNFINISHED_MARKER`] is written first and removed last, after every
//! file is synced; the loader refuses a folder holding it (naming what to do), and `--measure`
//! reuses a folder only when its record (`colibri-measure.json`) matches and the marker is gone.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::{Attn, MlpKind, ModelConfig, RouterKind, UNFINISHED_MARKER};
use crate::error::EngineError;
use crate::quant::QFormat;
use crate::weights::writer::{header_bytes, HeaderEntry};
use crate::weights::Dtype;

/// The record of a finished measure model: what it was written from.
pub const RECORD: &str = "colibri-measure.json";
/// The families whose tensors the writer knows.
pub const FAMILIES: [&str; 3] = ["qwen3_moe", "glm4_moe", "deepseek_v3"];
/// Shards of about this size (an expert is never split).
const SHARD_BYTES: u64 = 2_000_000_000;
/// Free space left over after the write, beyond the model's bytes.
pub const HEADROOM: u64 = 1_000_000_000;
/// Bump when the written bytes for the same parameters change.
const LAYOUT: u64 = 2;

/// How a tensor's values are made.
#[derive(Clone, Debug, PartialEq)]
pub enum Fill {
    /// A `[rows, cols]` matrix pre-quantized: random codes, scales of ~1/sqrt(cols).
    Quant(QFormat),
    /// f32, every value the same (norm weights, biases).
    Const(f32),
    /// f32 uniform in [-a, a).
    Uniform(f32),
    /// f32 as given (the router's correction bias).
    Values(Vec<f32>),
}

/// One tensor to write.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    /// The logical shape: `[rows, cols]` for a matrix.
    pub shape: Vec<usize>,
    pub fill: Fill,
}

impl Spec {
    pub fn params(&self) -> u64 {
        self.shape.iter().map(|&d| d as u64).product()
    }

    /// `(name, dtype, stored shape, bytes)` of the file entries (two for a quantized matrix).
    fn entries(&self) -> Vec<(String, Dtype, Vec<usize>, u64)> {
        match self.fill {
            Fill::Quant(fmt) => {
                let (rows, cols) = (self.shape[0], self.shape[1]);
                let (data, scales) = (fmt.data_len(rows, cols), fmt.scales_len(rows, cols));
                vec![
                    (self.name.clone(), Dtype::U8, vec![data], data as u64),
                    (
                        format!("{}.qs", self.name),
                        Dtype::F32,
                        vec![scales],
                        4 * scales as u64,
                    ),
                ]
            }
            _ => vec![(
                self.name.clone(),
                Dtype::F32,
                self.shape.clone(),
                4 * self.params(),
            )],
        }
    }

    fn bytes(&self) -> u64 {
        self.entries().iter().map(|e| e.3).sum()
    }
}

/// The formats of the three classes of matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Formats {
    pub expert: QFormat,
    pub dense: QFormat,
    /// Embedding and lm_head: the dense format, but never below 8 bits (the engine's rule).
    pub io: QFormat,
}

impl Formats {
    pub fn new(expert: QFormat, dense: QFormat) -> Formats {
        let io = if dense.bits() < 8 {
            QFormat::I8Row
        } else {
            dense
        };
        Formats { expert, dense, io }
    }
}

/// The config.json a measure model is written with: the published one with `layers` layers
/// (the per-layer lists cut to match), no MTP head (not written: the engine would not use it
/// for a plain decode) and no quantization_config (the weights are ours, not FP8).
pub fn measured_config(text: &str, layers: Option<usize>) -> Result<Value, EngineError> {
    let mut v: Value = serde_json::from_str(text)
        .map_err(|e| EngineError::Usage(format!("config.json: not valid JSON: {e}")))?;
    let Some(obj) = v.as_object_mut() else {
        return Err(EngineError::Usage(
            "config.json: not a JSON object".to_string(),
        ));
    };
    obj.remove("quantization_config");
    if obj.contains_key("num_nextn_predict_layers") {
        obj.insert("num_nextn_predict_layers".into(), json!(0));
    }
    if let Some(n) = layers {
        let published = obj
            .get("num_hidden_layers")
            .and_then(Value::as_u64)
            .unwrap_or(0) as usize;
        if n == 0 || n > published {
            return Err(EngineError::Usage(format!(
                "--layers {n}: allowed 1..={published} (the config's num_hidden_layers)"
            )));
        }
        obj.insert("num_hidden_layers".into(), json!(n));
        for key in ["mlp_layer_types", "layer_types", "indexer_types"] {
            if let Some(Value::Array(a)) = obj.get_mut(key) {
                a.truncate(n);
            }
        }
        if let Some(Value::Array(a)) = obj.get_mut("mlp_only_layers") {
            a.retain(|l| l.as_u64().is_some_and(|l| (l as usize) < n));
        }
    }
    Ok(v)
}

/// Refuses a config the writer cannot make, naming its `model_type`.
pub fn check_family(cfg: &ModelConfig) -> Result<(), EngineError> {
    let family = cfg.family.model_type();
    let known = FAMILIES.contains(&family)
        && match &cfg.attn {
            Attn::Gqa(g) => !g.qk_norm_whole && cfg.oss.is_none(),
            Attn::Mla(m) => m.indexer.is_none(),
            _ => false,
        };
    if known {
        Ok(())
    } else {
        Err(EngineError::Usage(format!(
            "--measure: config.json \"model_type\" = {family:?} is not one the measure writer \
             makes; allowed: {}",
            FAMILIES.join(", ")
        )))
    }
}

/// The bias of each expert for `skew`: a random ranking, `-skew * ln(1 + rank)`.
pub fn skew_bias(n_experts: usize, skew: f32, rng: &mut crate::rng::XorShift64) -> Vec<f32> {
    let mut order: Vec<usize> = (0..n_experts).collect();
    for i in (1..n_experts).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let mut bias = vec![0f32; n_experts];
    for (rank, &e) in order.iter().enumerate() {
        bias[e] = -skew * (1.0 + rank as f32).ln();
    }
    bias
}

/// Every tensor of `cfg`, in file order, grouped in units a shard never splits (a routed
/// expert's three matrices are one unit).
pub fn tensors(
    cfg: &ModelConfig,
    f: &Formats,
    skew: f32,
    seed: u64,
) -> Result<Vec<Vec<Spec>>, EngineError> {
    check_family(cfg)?;
    let mut rng = crate::rng::XorShift64(seed.max(1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let h = cfg.hidden_size;
    let heads = cfg.num_attention_heads;
    let mat = |name: String, rows: usize, cols: usize, fmt: QFormat| Spec {
        name,
        shape: vec![rows, cols],
        fill: if fmt == QFormat::F32 {
            Fill::Uniform(1.0 / (cols as f32).sqrt())
        } else {
            Fill::Quant(fmt)
        },
    };
    let vec1 = |name: String, n: usize, fill: Fill| Spec {
        name,
        shape: vec![n],
        fill,
    };
    let mut units = vec![vec![mat(
        "model.embed_tokens.weight".into(),
        cfg.vocab_size,
        h,
        f.io,
    )]];
    for l in 0..cfg.num_hidden_layers {
        let p = format!("model.layers.{l}");
        let a = format!("{p}.self_attn");
        let mut u = vec![
            vec1(format!("{p}.input_layernorm.weight"), h, Fill::Const(1.0)),
            vec1(
                format!("{p}.post_attention_layernorm.weight"),
                h,
                Fill::Const(1.0),
            ),
        ];
        match &cfg.attn {
            Attn::Gqa(g) => {
                let (q, k) = (heads * g.head_dim, g.kv_heads * g.head_dim);
                u.push(mat(format!("{a}.q_proj.weight"), q, h, f.dense));
                u.push(mat(format!("{a}.k_proj.weight"), k, h, f.dense));
                u.push(mat(format!("{a}.v_proj.weight"), k, h, f.dense));
                u.push(mat(format!("{a}.o_proj.weight"), h, q, f.dense));
                if cfg.attention_bias {
                    for (proj, n) in [("q_proj", q), ("k_proj", k), ("v_proj", k)] {
                        u.push(vec1(format!("{a}.{proj}.bias"), n, Fill::Const(0.0)));
                    }
                    if cfg.family.spec().o_proj_bias {
                        u.push(vec1(format!("{a}.o_proj.bias"), h, Fill::Const(0.0)));
                    }
                }
                if g.qk_norm {
                    for norm in ["q_norm", "k_norm"] {
                        u.push(vec1(
                            format!("{a}.{norm}.weight"),
                            g.head_dim,
                            Fill::Const(1.0),
                        ));
                    }
                }
            }
            Attn::Mla(m) => {
                let (qk, kvl, rope) = (m.qk_head_dim(), m.kv_lora_rank, m.qk_rope_head_dim);
                match m.q_lora_rank {
                    Some(ql) => {
                        u.push(mat(format!("{a}.q_a_proj.weight"), ql, h, f.dense));
                        u.push(vec1(
                            format!("{a}.q_a_layernorm.weight"),
                            ql,
                            Fill::Const(1.0),
                        ));
                        u.push(mat(format!("{a}.q_b_proj.weight"), heads * qk, ql, f.dense));
                        if cfg.attention_bias {
                            u.push(vec1(format!("{a}.q_a_proj.bias"), ql, Fill::Const(0.0)));
                        }
                    }
                    None => u.push(mat(format!("{a}.q_proj.weight"), heads * qk, h, f.dense)),
                }
                u.push(mat(
                    format!("{a}.kv_a_proj_with_mqa.weight"),
                    kvl + rope,
                    h,
                    f.dense,
                ));
                u.push(vec1(
                    format!("{a}.kv_a_layernorm.weight"),
                    kvl,
                    Fill::Const(1.0),
                ));
                u.push(mat(
                    format!("{a}.kv_b_proj.weight"),
                    heads * (m.qk_nope_head_dim + m.v_head_dim),
                    kvl,
                    f.dense,
                ));
                u.push(mat(
                    format!("{a}.o_proj.weight"),
                    h,
                    heads * m.v_head_dim,
                    f.dense,
                ));
                if cfg.attention_bias {
                    u.push(vec1(
                        format!("{a}.kv_a_proj_with_mqa.bias"),
                        kvl + rope,
                        Fill::Const(0.0),
                    ));
                    u.push(vec1(format!("{a}.o_proj.bias"), h, Fill::Const(0.0)));
                }
            }
            _ => unreachable!("check_family admits GQA and MLA only"),
        }
        let mlp = |u: &mut Vec<Spec>, prefix: String, inter: usize| {
            u.push(mat(format!("{prefix}.gate_proj.weight"), inter, h, f.dense));
            u.push(mat(format!("{prefix}.up_proj.weight"), inter, h, f.dense));
            u.push(mat(format!("{prefix}.down_proj.weight"), h, inter, f.dense));
        };
        if cfg.mlp_layer_types.get(l) != Some(&MlpKind::Sparse) {
            mlp(&mut u, format!("{p}.mlp"), cfg.intermediate_size);
            units.push(u);
            continue;
        }
        let n_exp = cfg.n_routed_experts;
        u.push(mat(format!("{p}.mlp.gate.weight"), n_exp, h, QFormat::F32));
        // The router's logits: ~0.5 standard deviation over a normalised hidden state.
        u.last_mut().expect("just pushed").fill = Fill::Uniform(0.02);
        if cfg.router == RouterKind::SigmoidBias {
            u.push(vec1(
                format!("{p}.mlp.gate.e_score_correction_bias"),
                n_exp,
                Fill::Values(skew_bias(n_exp, skew, &mut rng)),
            ));
        }
        if cfg.n_shared_experts > 0 {
            mlp(
                &mut u,
                format!("{p}.mlp.shared_experts"),
                cfg.moe_intermediate_size * cfg.n_shared_experts,
            );
        }
        units.push(u);
        let inter = cfg.moe_intermediate_size;
        for e in 0..n_exp {
            let x = format!("{p}.mlp.experts.{e}");
            units.push(vec![
                mat(format!("{x}.gate_proj.weight"), inter, h, f.expert),
                mat(format!("{x}.up_proj.weight"), inter, h, f.expert),
                mat(format!("{x}.down_proj.weight"), h, inter, f.expert),
            ]);
        }
    }
    let mut last = vec![vec1("model.norm.weight".into(), h, Fill::Const(1.0))];
    if !cfg.tie_word_embeddings {
        last.push(mat("lm_head.weight".into(), cfg.vocab_size, h, f.io));
    }
    units.push(last);
    Ok(units)
}

/// One output file: its units in order.
pub struct ShardPlan {
    pub name: String,
    pub specs: Vec<Spec>,
    pub bytes: u64,
    header: Vec<u8>,
}

/// Cuts `units` into shards of about `shard_bytes` and makes their headers.
pub fn shards(units: Vec<Vec<Spec>>, shard_bytes: u64) -> Result<Vec<ShardPlan>, EngineError> {
    let mut groups: Vec<Vec<Spec>> = vec![Vec::new()];
    let mut size = 0u64;
    for unit in units {
        let b: u64 = unit.iter().map(Spec::bytes).sum();
        if size > 0 && size + b > shard_bytes {
            groups.push(Vec::new());
            size = 0;
        }
        size += b;
        groups.last_mut().expect("never empty").extend(unit);
    }
    let n = groups.len();
    groups
        .into_iter()
        .enumerate()
        .map(|(i, specs)| {
            let all: Vec<_> = specs.iter().flat_map(Spec::entries).collect();
            let entries: Vec<HeaderEntry> = all
                .iter()
                .map(|(name, dtype, shape, len)| HeaderEntry {
                    name,
                    dtype: *dtype,
                    shape,
                    len: *len,
                })
                .collect();
            let header = header_bytes(&entries)
                .map_err(|e| EngineError::Usage(format!("a shard header: {e}")))?;
            let bytes = header.len() as u64 + all.iter().map(|e| e.3).sum::<u64>();
            Ok(ShardPlan {
                name: format!("out-{:05}-of-{n:05}.safetensors", i + 1),
                specs,
                bytes,
                header,
            })
        })
        .collect()
}

/// What `--measure DIR` finds there.
#[derive(Debug, PartialEq)]
pub enum Found {
    /// Absent or empty: write.
    Empty,
    /// A finished model written with the same parameters: reuse it.
    Same,
}

/// Checks DIR before anything is written: empty (or absent), or a finished model of exactly
/// these parameters; anything else is refused.
pub fn inspect(dir: &Path, params: &Value) -> Result<Found, EngineError> {
    let read = match std::fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Empty),
        Err(e) => {
            return Err(EngineError::Usage(format!(
                "--measure {}: {e}",
                dir.display()
            )))
        }
    };
    if read.count() == 0 {
        return Ok(Found::Empty);
    }
    let d = dir.display();
    if dir.join(UNFINISHED_MARKER).exists() {
        return Err(EngineError::Usage(format!(
            "--measure {d}: holds a model an interrupted --measure left half-written; delete the \
             folder (rm -r {d}) and run again"
        )));
    }
    match std::fs::read_to_string(dir.join(RECORD)) {
        Ok(text) => {
            let had: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if had == *params {
                Ok(Found::Same)
            } else {
                Err(EngineError::Usage(format!(
                    "--measure {d}: holds a measure model written with other parameters ({}); \
                     give an empty or new folder, or delete this one",
                    dir.join(RECORD).display()
                )))
            }
        }
        Err(_) => Err(EngineError::Usage(format!(
            "--measure {d}: the folder is not empty; give an empty or new folder (the measure \
             writes a model of its own there)"
        ))),
    }
}

/// Free bytes of the file system that will hold `dir` (its nearest existing ancestor).
pub fn free_bytes(dir: &Path) -> Result<u64, EngineError> {
    let mut at = dir.to_path_buf();
    while !at.exists() {
        if !at.pop() || at.as_os_str().is_empty() {
            at = std::path::PathBuf::from(".");
            break;
        }
    }
    let stat = nix::sys::statvfs::statvfs(&at)
        .map_err(|e| EngineError::Usage(format!("--measure {}: {e}", dir.display())))?;
    Ok(stat.blocks_available() as u64 * stat.fragment_size() as u64)
}

/// Refuses a write that would not fit, stating the bytes needed and available.
pub fn check_room(dir: &Path, bytes: u64) -> Result<(), EngineError> {
    let free = free_bytes(dir)?;
    if bytes + HEADROOM > free {
        return Err(EngineError::Usage(format!(
            "--measure {}: the model needs {bytes} bytes ({:.2} GB) and {:.2} GB of headroom; the \
             disk has {free} bytes ({:.2} GB) free. Nothing was written: free space, use fewer \
             --layers or fewer --expert-bits, or another folder",
            dir.display(),
            bytes as f64 / 1e9,
            HEADROOM as f64 / 1e9,
            free as f64 / 1e9
        )));
    }
    Ok(())
}

/// What a write took.
#[derive(Clone, Copy, Debug)]
pub struct Written {
    pub bytes: u64,
    pub secs: f64,
}

/// Random bytes, fast: xorshift, eight at a time.
fn fill_random(buf: &mut [u8], rng: &mut crate::rng::XorShift64) {
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&rng.next_u64().to_le_bytes());
    }
    let rest = chunks.into_remainder();
    let v = rng.next_u64().to_le_bytes();
    rest.copy_from_slice(&v[..rest.len()]);
}

/// The spread of the codes of `fmt` read as signed integers (uniform): the scale that makes
/// a weight ~1/sqrt(fan_in) divides by it.
fn code_std(fmt: QFormat) -> f32 {
    (((1u64 << fmt.bits().min(16)) as f32).powi(2) / 12.0).sqrt()
}

/// One group's (or row's) scale: `sc` within +-25%, its sign drawn at random.
///
/// Random bytes read as codes `u - 2^(b-1)` are uniform on `[-2^(b-1), 2^(b-1) - 1]`: their
/// mean is -1/2, not 0 (-0.45 of their spread at int2, -0.22 at int3, -0.11 at int4). With
/// positive scales every row of a matrix then carries the same negative offset, so each
/// product adds one common direction (all outputs moved by the offset times the sum of the
/// inputs) that grows layer after layer until it outweighs the token's own embedding: every
/// position's hidden state becomes nearly the same and the router picks the same experts for
/// every token (GLM-4.5-Air's shapes at int3: 33.6 expert loads per token of 296 picks). A
/// random sign per scale makes each group's offset point either way, so the offsets no
/// longer add up across rows: the weights are zero-mean, as a trained model's are.
fn random_scale(sc: f32, rng: &mut crate::rng::XorShift64) -> f32 {
    let s = sc * (0.75 + 0.5 * rng.unit_f32());
    if rng.next_u64() & 1 == 1 {
        -s
    } else {
        s
    }
}

/// The spread of a matrix's weights. Most are ~1/sqrt(fan_in), so a layer keeps the scale of
/// its input; the embedding's rows are ~1 and the projections back into the residual stream
/// (`o_proj`, `down_proj`) are smaller by 1/sqrt(2 layers) (GPT-2's initialisation). Without
/// this the layers' outputs swamp the token's own row, every position's hidden state is nearly
/// the same, and the router sends every token to the same few experts: a measure that never
/// reads the disk.
fn weight_std(name: &str, cols: usize, layers: usize) -> f32 {
    if name.contains("embed_tokens") {
        1.0
    } else if name.ends_with("o_proj.weight") || name.ends_with("down_proj.weight") {
        1.0 / ((cols as f32).sqrt() * (2.0 * layers.max(1) as f32).sqrt())
    } else {
        1.0 / (cols as f32).sqrt()
    }
}

/// Writes the model into `dir` (created): the marker, config.json, the demo tokenizer, the
/// shards, the record, then the marker removed. Progress on stderr.
pub fn write(
    dir: &Path,
    config: &Value,
    tokenizer: &[u8],
    plan: &[ShardPlan],
    params: &Value,
    seed: u64,
) -> Result<Written, EngineError> {
    let io = |what: &str, p: &Path, e: std::io::Error| {
        let hint = if e.raw_os_error() == Some(nix::libc::ENOSPC) {
            " (disk full: delete the folder, free space and run again)"
        } else {
            ""
        };
        EngineError::io(format!("{what} {}{hint}", p.display()), e)
    };
    std::fs::create_dir_all(dir).map_err(|e| io("creating", dir, e))?;
    let marker = dir.join(UNFINISHED_MARKER);
    std::fs::write(
        &marker,
        "an interrupted `colibri plan --measure` is writing or left this folder: delete it\n",
    )
    .map_err(|e| io("writing", &marker, e))?;
    let put = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(|e| io("writing", &p, e))
    };
    put(
        "config.json",
        serde_json::to_string_pretty(config)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    put("tokenizer.json", tokenizer)?;
    let total: u64 = plan.iter().map(|s| s.bytes).sum();
    let layers = config
        .get("num_hidden_layers")
        .and_then(Value::as_u64)
        .unwrap_or(1) as usize;
    let t0 = Instant::now();
    let mut done = 0u64;
    let mut last_note = Instant::now();
    let mut rng = crate::rng::XorShift64(seed.max(1).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1);
    let mut buf = vec![0u8; 4 << 20];
    for shard in plan {
        let path = dir.join(&shard.name);
        let file = std::fs::File::create(&path).map_err(|e| io("creating", &path, e))?;
        let mut w = std::io::BufWriter::with_capacity(8 << 20, file);
        let mut emit = |w: &mut std::io::BufWriter<std::fs::File>, bytes: &[u8]| {
            w.write_all(bytes).map_err(|e| io("writing", &path, e))?;
            done += bytes.len() as u64;
            if last_note.elapsed() >= Duration::from_secs(2) {
                last_note = Instant::now();
                let secs = t0.elapsed().as_secs_f64();
                let gbs = done as f64 / 1e9 / secs.max(1e-9);
                crate::elog!(
                    "[measure] wrote {:.2} / {:.2} GB ({gbs:.2} GB/s, {:.0} s left)",
                    done as f64 / 1e9,
                    total as f64 / 1e9,
                    (total - done) as f64 / 1e9 / gbs.max(1e-9)
                );
            }
            Ok::<(), EngineError>(())
        };
        emit(&mut w, &shard.header)?;
        for spec in &shard.specs {
            match &spec.fill {
                Fill::Quant(fmt) => {
                    let (rows, cols) = (spec.shape[0], spec.shape[1]);
                    let mut left = fmt.data_len(rows, cols);
                    while left > 0 {
                        let n = left.min(buf.len());
                        fill_random(&mut buf[..n], &mut rng);
                        emit(&mut w, &buf[..n])?;
                        left -= n;
                    }
                    let sc = weight_std(&spec.name, cols, layers) / code_std(*fmt);
                    let scales: Vec<u8> = (0..fmt.scales_len(rows, cols))
                        .flat_map(|_| random_scale(sc, &mut rng).to_le_bytes())
                        .collect();
                    emit(&mut w, &scales)?;
                }
                Fill::Const(c) => {
                    let v: Vec<u8> = (0..spec.params()).flat_map(|_| c.to_le_bytes()).collect();
                    emit(&mut w, &v)?;
                }
                Fill::Uniform(a) => {
                    let v: Vec<u8> = (0..spec.params())
                        .flat_map(|_| ((rng.unit_f32() * 2.0 - 1.0) * a).to_le_bytes())
                        .collect();
                    emit(&mut w, &v)?;
                }
                Fill::Values(vals) => {
                    let v: Vec<u8> = vals.iter().flat_map(|x| x.to_le_bytes()).collect();
                    emit(&mut w, &v)?;
                }
            }
        }
        let file = w
            .into_inner()
            .map_err(|e| io("writing", &path, e.into_error()))?;
        file.sync_all().map_err(|e| io("syncing", &path, e))?;
        // The page cache would otherwise hold the last gigabytes written: the measure's cold
        // figures must read them from the disk.
        let _ = nix::fcntl::posix_fadvise(
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
            0,
            nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
        );
    }
    put(
        RECORD,
        serde_json::to_string_pretty(params)
            .unwrap_or_default()
            .as_bytes(),
    )?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    std::fs::remove_file(&marker).map_err(|e| io("removing", &marker, e))?;
    let secs = t0.elapsed().as_secs_f64();
    crate::elog!(
        "[measure] wrote {:.2} GB in {secs:.1} s ({:.2} GB/s) to {}",
        done as f64 / 1e9,
        done as f64 / 1e9 / secs.max(1e-9),
        dir.display()
    );
    Ok(Written { bytes: done, secs })
}

/// The tokenizer the model is written with: the `tokenizer.json` beside the config when there
/// is one (a model's own folder), else the demo model's (4096 ids), which needs a vocabulary at
/// least that large (embedding rows past it are ids the tokenizer never produces).
pub fn tokenizer_for(config: Option<&Path>, vocab: usize) -> Result<Vec<u8>, EngineError> {
    if let Some(beside) = config
        .and_then(Path::parent)
        .map(|d| d.join("tokenizer.json"))
    {
        if beside.is_file() {
            return std::fs::read(&beside)
                .map_err(|e| EngineError::io(format!("reading {}", beside.display()), e));
        }
    }
    let demo = crate::demo::tokenizer_json();
    let ids = crate::tokenizer::Tokenizer::from_bytes(demo)
        .map(|t| t.vocab_size())
        .map_err(|e| EngineError::Usage(format!("the demo tokenizer: {e}")))?;
    if vocab < ids {
        return Err(EngineError::Usage(format!(
            "--measure: config.json \"vocab_size\" = {vocab} is below the {ids} ids of the demo \
             tokenizer the model would be written with; put the model's tokenizer.json beside \
             the config"
        )));
    }
    Ok(demo.to_vec())
}

/// The record of a measure model: everything that changes a written byte.
pub fn params(config: &Value, f: &Formats, skew: f32, seed: u64) -> Value {
    json!({
        "layout": LAYOUT,
        "config": config,
        "expert_format": f.expert.name(),
        "dense_format": f.dense.name(),
        "io_format": f.io.name(),
        "skew": skew,
        "seed": seed,
    })
}

/// Drops the page cache of every shard in `dir` (clean pages; no privilege needed), so the
/// next start reads from the disk.
pub fn evict(dir: &Path) {
    let Ok(read) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in read.flatten() {
        let p = entry.path();
        if p.extension().is_some_and(|e| e == "safetensors") {
            if let Ok(f) = std::fs::File::open(&p) {
                let _ = nix::fcntl::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                    0,
                    nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
                );
            }
        }
    }
}

/// The shards' total bytes.
pub fn total_bytes(plan: &[ShardPlan]) -> u64 {
    plan.iter().map(|s| s.bytes).sum()
}

/// The default shard size.
pub fn shard_bytes() -> u64 {
    SHARD_BYTES
}
